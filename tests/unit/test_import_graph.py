"""The import graph of ``app/py/weei``: no cycle between modules, no import up the layers.

Every module is parsed (``ast``, nothing is imported), every ``import`` and
``from ... import`` naming a ``weei`` module becomes an edge, and two rules
are checked:

* **No cycle** among the imports that run when a module loads (module level,
  including inside ``try``/``if`` at module level, but not under ``if
  TYPE_CHECKING``). Those are the ones that make ``import x`` depend on
  which module some earlier code happened to import first: a cycle once made
  ``import weei.core.commands`` fail in a fresh interpreter while the suite
  passed. An import inside a function runs when it is called, after every
  module has loaded; those exist to defer what a platform may lack
  (wasmtime, aiortc, the GPU) and cannot break loading. They are not
  exempt from the order, though: the layer rule below counts them.
* **Layers** (docs/architecture.md, "Layers"): a module may import from its
  own layer's package or from a layer below, never from one above, and two
  packages on the same layer are independent (neither imports the other).
  Every import counts here, at module level, in a function or for type
  checking only: a type from a layer above is a dependency on it all the same.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterable
from pathlib import Path

import pytest

import weei

ROOT = Path(weei.__file__).parent

#: Bottom first. One row is one layer; the packages of a row are peers and do not import each other.
#: A module belongs to the longest prefix listed; ``weei.core`` itself holds the foundations
#: (errors, limits, floats, verified blobs, the input checks, the state tables).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("weei", "weei.core"),
    ("weei.core.aggregation.methods",),  # the table of methods: the settings and model-info parsers read it
    ("weei.core.privacy",),  # DP settings, noise and accountant: the settings parser and aggregation read it
    ("weei.core.formats", "weei.core.observe"),
    ("weei.core.aggregation",),
    ("weei.core.wire",),
    ("weei.core.links",),
    ("weei.core.job",),
    ("weei.runtime",),
    ("weei.kernel",),
    ("weei.gpu",),
    ("weei.onnx",),
    ("weei.prepare",),
    ("weei.api", "weei.modelkit"),
    ("weei.adapters",),
    ("weei.host", "weei.server"),
    ("weei.browser", "weei.agent", "weei.demo"),
    ("weei.flower",),  # drives weei.demo's jobs and seeds
    ("weei.cli",),
)


def _modules(root: Path) -> dict[str, Path]:
    """Module name -> file, for every .py under ``root`` (a package's name for its __init__)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(modules: dict[str, Path]) -> dict[str, dict[str, bool]]:
    """module -> {imported weei module: whether it is imported when the module loads}."""

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, dict[str, bool]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: dict[str, bool] = {}

        def add(target: str | None, at_load: bool) -> None:
            if target is not None and target != name:
                edges[target] = edges.get(target, False) or at_load

        def visit(node: ast.AST, at_load: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.Import):
                    for alias in child.names:
                        add(resolve(alias.name), at_load)
                elif isinstance(child, ast.ImportFrom):
                    if child.level:
                        base = package.split(".")[: len(package.split(".")) - child.level + 1]
                        source = ".".join(base + ([child.module] if child.module else []))
                    else:
                        source = child.module or ""
                    if source == "weei" or source.startswith("weei."):
                        for alias in child.names:  # ``from pkg import module`` names the module
                            add(resolve(f"{source}.{alias.name}"), at_load)
                inner = at_load and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                if isinstance(child, ast.If) and _is_type_checking(child):
                    visit(child.test, inner)
                    for part in child.body:
                        visit(ast.Module(body=[part], type_ignores=[]), False)
                    for part in child.orelse:
                        visit(ast.Module(body=[part], type_ignores=[]), inner)
                else:
                    visit(child, inner)

        visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), True)
        graph[name] = edges
    return graph


def layer_of(module: str) -> tuple[int, str]:
    """(layer index, the package of ``LAYERS`` the module belongs to)."""
    best: tuple[int, str] | None = None
    for index, row in enumerate(LAYERS):
        for package in row:
            if (module == package or module.startswith(package + ".")) and (best is None or len(package) > len(best[1])):
                best = (index, package)
    if best is None:
        raise AssertionError(f"{module} is on no layer: add its package to LAYERS (and to docs/architecture.md)")
    return best


def find_cycles(graph: dict[str, Iterable[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module, and every module importing
    itself (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def connect(node: str) -> None:
        # Iterative: a long import chain must not hit the recursion limit.
        work = [(node, iter(graph.get(node, ())))]
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        while work:
            current, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph.get(child, ()))))
                elif child in on_stack:
                    low[current] = min(low[current], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[current])
            if low[current] == index[current]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == current:
                        break
                if len(component) > 1 or current in graph.get(current, ()):
                    cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return cycles


#: The top package ``weei`` (its version) and the core's foundations are one layer.
_FOUNDATION_PAIRS = {("weei", "weei.core"), ("weei.core", "weei")}


def violations(graph: dict[str, dict[str, bool]]) -> list[str]:
    """Every import that points up the layers or sideways to a peer package on the same layer."""
    out = []
    for module, edges in sorted(graph.items()):
        mine, my_package = layer_of(module)
        for target in sorted(edges):
            theirs, their_package = layer_of(target)
            if theirs > mine or (theirs == mine and their_package != my_package
                                 and (my_package, their_package) not in _FOUNDATION_PAIRS):
                out.append(f"{module} ({my_package}) imports {target} ({their_package})")
    return out


def _at_load(graph: dict[str, dict[str, bool]]) -> dict[str, list[str]]:
    return {m: [t for t, load in edges.items() if load] for m, edges in graph.items()}


def test_no_import_cycle() -> None:
    cycles = find_cycles(_at_load(imports(_modules(ROOT))))
    assert cycles == [], "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_no_import_points_up_the_layers() -> None:
    found = violations(imports(_modules(ROOT)))
    assert found == [], "imports against docs/architecture.md's layers:\n" + "\n".join(found)


def test_every_package_is_on_a_layer() -> None:
    for module in _modules(ROOT):
        layer_of(module)


def test_the_layers_are_the_ones_the_architecture_draws() -> None:
    doc = (ROOT.parents[2] / "docs" / "architecture.md").read_text(encoding="utf-8")
    for row in LAYERS:
        for package in row:
            path = package.removeprefix("weei.").replace(".", "/")
            if package != "weei":
                assert f" {package} " in doc or f"`{package}`" in doc or f"`{path}/`" in doc, \
                    f"{package} is not in docs/architecture.md"


def _package(tmp_path: Path, files: dict[str, str]) -> dict[str, Path]:
    for rel, text in files.items():
        path = tmp_path / "weei" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return _modules(tmp_path / "weei")


def test_a_cycle_is_found(tmp_path: Path) -> None:
    modules = _package(tmp_path, {
        "__init__.py": "", "core/__init__.py": "",
        "core/a.py": "from .b import B\n",
        "core/b.py": "from . import c\nB = 1\n",
        "core/c.py": "import weei.core.a\n",
        "core/d.py": "def later():\n    from .a import B\n",
        "core/e.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .d import later\n",
    })
    graph = imports(modules)
    assert find_cycles(_at_load(graph)) == [["weei.core.a", "weei.core.b", "weei.core.c"]]
    # d -> a only in a function, e -> d only for type checking: counted as edges, not as load-time ones.
    assert graph["weei.core.d"] == {"weei.core.a": False} and graph["weei.core.e"] == {"weei.core.d": False}


@pytest.mark.parametrize(("source", "found"), [
    ("from ..job.coordinator import Coordinator\n", True),  # up, at module level
    ("def f():\n    from ..links import relay\n", True),  # up, in a function
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from weei.api import x\n", True),  # up, for types
    ("from ..observe.debuglog import DebugLog\n", True),  # sideways, to a peer on its layer
    ("from ..errors import WeeiError\nfrom .settings import S\n", False),  # down, and within its package
])
def test_an_import_up_the_layers_is_found(tmp_path: Path, source: str, found: bool) -> None:
    modules = _package(tmp_path, {
        "__init__.py": "", "api/__init__.py": "x = 1\n", "core/__init__.py": "", "core/errors.py": "",
        "core/formats/__init__.py": "", "core/formats/settings.py": "", "core/formats/checkpoint.py": source,
        "core/observe/__init__.py": "", "core/observe/debuglog.py": "",
        "core/links/__init__.py": "", "core/links/relay.py": "",
        "core/job/__init__.py": "", "core/job/coordinator.py": "",
    })
    assert bool(violations(imports(modules))) is found
