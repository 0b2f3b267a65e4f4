"""Reason codes are data: every raised code is an enum member, and every code a caller sees is documented.

Three checks. (1) The source of ``app/py/weei`` is parsed (nothing is run):
every call of a ``WeeiError`` class (and every ``Where``, which raises one)
passes its reason as an expression without a string literal, and a
``SomethingReason.MEMBER`` it names exists.
(2) Each error class refuses a plain string at construction, so a reason
computed at run time (read back from a Worker, a peer, a table) cannot slip
a raw code past (1). (3) docs/api.md, "Error reasons", tables the members of
every enum whose errors the API throws, and nothing else, with what to do;
the GPU fallback and ONNX reasons are in docs/gpu.md and docs/onnx.md.
"""

from __future__ import annotations

import ast
import inspect
import re
from enum import Enum
from pathlib import Path

import pytest

import weei
from weei.api.ports import StorageError, StorageReason, TaskCancelled
from weei.core.errors import (AggregationError, AggregationReason, CheckpointError, CheckpointReason, ManifestError,
                              ManifestReason, ModelError, ModelInfoReason, ModelReason, SettingsError, SettingsReason,
                              UsageError, UsageReason, WeeiError, WeeiReason)
from weei.core.observe.diagnostics.records import DiagnosticsError, DiagnosticsReason
from weei.core.privacy.secagg import SecAggError, SecAggReason
from weei.core.states import IllegalTransition
from weei.core.wire.framing.frames import FrameError, FrameReason
from weei.core.wire.messages import MessageError, MessageReason
from weei.core.wire.signaling_session import ClientReason, Reason
from weei.gpu.errors import GpuError, GpuReason
from weei.onnx.errors import OnnxError, OnnxReason
from weei.flower.errors import FlowerReason
from weei.server.signaling_rules import SignalingError

ROOT = Path(weei.__file__).parent
DOCS = ROOT.parents[2] / "docs"

#: The enums whose errors reach a caller of the API (a rejected call's ``reason``), documented in docs/api.md.
API_FAMILIES: tuple[type[Enum], ...] = (UsageReason, SettingsReason, ManifestReason, ModelInfoReason, CheckpointReason,
                                        ModelReason, StorageReason, WeeiReason)


def _weei_error_classes(trees: dict[Path, ast.Module]) -> set[str]:
    """Names of the classes that derive from WeeiError, found by their bases' names across the package."""
    bases: dict[str, set[str]] = {}
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases.setdefault(node.name, set()).update(
                    b.id if isinstance(b, ast.Name) else b.attr for b in node.bases if isinstance(b, (ast.Name, ast.Attribute)))
    found = {"WeeiError"}
    while True:
        more = {name for name, of in bases.items() if of & found} - found
        if not more:
            return found
        found |= more


def _reason_position(name: str) -> int | None:
    """Where a class's constructor takes ``reason`` (positional index after self), or None when it takes none."""
    cls = next((c for c in _all_error_classes() if c.__name__ == name), None)
    if cls is None:  # a class only the browser defines (it imports js): its constructor is WeeiError's
        return 0
    params = list(inspect.signature(cls.__init__).parameters)[1:]
    return params.index("reason") if "reason" in params else None


def _all_error_classes() -> list[type[WeeiError]]:
    out, todo = [], [WeeiError]
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo.extend(cls.__subclasses__())
    return out


def _reason_args(call: ast.Call, position: int) -> list[ast.expr]:
    args = call.args[position:position + 1] if not any(isinstance(a, ast.Starred) for a in call.args) else []
    return args + [k.value for k in call.keywords if k.arg == "reason"]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _raise_sites() -> list[tuple[str, int, str, ast.expr]]:
    trees = {p: ast.parse(p.read_text(), str(p)) for p in sorted(ROOT.rglob("*.py"))}
    classes = _weei_error_classes(trees)
    sites = []
    for path, tree in trees.items():
        # An error class that fixes its own reason passes it up: ``super().__init__(reason, message)``.
        for cls in ast.walk(tree):
            if isinstance(cls, ast.ClassDef) and cls.name in classes:
                sites.extend((_module_name(path), call.lineno, cls.name, call.args[0]) for call in ast.walk(cls)
                             if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                             and call.func.attr == "__init__" and isinstance(call.func.value, ast.Call)
                             and getattr(call.func.value.func, "id", None) == "super" and call.args)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if name == "Where":  # Where(error class, reason, path): the toolkit raises error(reason, ...)
                sites.extend((_module_name(path), node.lineno, name, arg) for arg in node.args[1:2])
                continue
            if name not in classes:
                continue
            position = _reason_position(name)
            if position is None:
                continue
            for arg in _reason_args(node, position):
                sites.append((_module_name(path), node.lineno, name, arg))
    return sites


SITES = _raise_sites()


def test_the_walk_finds_the_raise_sites() -> None:
    # A walk that found nothing would pass everything below.
    assert len(SITES) > 400
    assert {name for _, _, name, _ in SITES} >= {"UsageError", "ManifestError", "CheckpointError", "OnnxError", "GpuError"}


def test_every_raised_reason_is_an_enum_member_expression() -> None:
    # Neither a string literal anywhere in the expression, nor another error's ``.reason`` (a plain string)
    # passed on as it is: that one is converted through the family's enum (``UsageReason(exc.reason)``).
    literal = []
    for module, line, name, arg in SITES:
        if any(isinstance(n, ast.JoinedStr) or (isinstance(n, ast.Constant) and isinstance(n.value, str))
               for n in ast.walk(arg)) or (isinstance(arg, ast.Attribute) and arg.attr == "reason"
                                           and ast.unparse(arg.value) != "self"):  # a Where's own reason is a member
            literal.append(f"{module}:{line}: {name}({ast.unparse(arg)}, ...)")
    assert not literal, "raise these with a member of the family's reason enum:\n" + "\n".join(literal)


def test_every_named_member_exists() -> None:
    # ``FooReason.BAR`` in a raise must name a real member of a known family.
    known = {family.__name__: family for cls in _all_error_classes() for family in cls.reasons}
    missing = []
    for module, line, _name, arg in SITES:
        for node in ast.walk(arg):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id.endswith("Reason"):
                family = known.get(node.value.id)
                if family is None or not isinstance(getattr(family, node.attr, None), family):
                    missing.append(f"{module}:{line}: {node.value.id}.{node.attr}")
    assert not missing, missing


FAMILIES = [
    (WeeiError, WeeiReason.BAD_SEED), (UsageError, UsageReason.NO_JOB), (SettingsError, SettingsReason.OUT_OF_RANGE),
    (ManifestError, ManifestReason.MISSING_FILE), (ManifestError, ModelInfoReason.INVALID_MODEL_INFO),
    (CheckpointError, CheckpointReason.INVALID_METADATA), (ModelError, ModelReason.TRAP),
    (AggregationError, AggregationReason.EMPTY_AVERAGE), (StorageError, StorageReason.CORRUPT),
    (GpuError, GpuReason.GPU_TIMEOUT), (OnnxError, OnnxReason.BAD_SHAPE), (FrameError, FrameReason.STALLED),
    (MessageError, MessageReason.BAD_FIELD), (DiagnosticsError, DiagnosticsReason.BAD_DIAGNOSTICS),
    (SignalingError, Reason.ROOM_FULL), (SignalingError, ClientReason.CLOSED),
    (SecAggError, SecAggReason.BAD_SHARE),
]


def _make(cls: type[WeeiError], reason: object) -> WeeiError:
    if cls is SettingsError:
        return SettingsError("epochs", "m", reason)  # type: ignore[arg-type]
    return cls(reason, "m")  # type: ignore[arg-type]


@pytest.mark.parametrize(("cls", "member"), FAMILIES, ids=lambda v: getattr(v, "__name__", str(v)))
def test_an_error_takes_only_a_member_of_its_family(cls: type[WeeiError], member: Enum) -> None:
    error = _make(cls, member)
    # The wire, the state and the JavaScript see the plain string, exactly as before.
    assert error.reason == member.value and type(error.reason) is str and str(error).endswith(f"[{member.value}]")
    with pytest.raises(TypeError, match="takes a reason of"):
        _make(cls, member.value)
    other = UsageReason.NO_JOB if not isinstance(member, UsageReason) else WeeiReason.BAD_SEED
    with pytest.raises(TypeError, match="takes a reason of"):
        _make(cls, other)


def test_every_error_class_declares_its_family() -> None:
    # A subclass inherits its parent's family unless it declares one; each listed family is a str enum.
    for cls in _all_error_classes():
        assert cls.reasons and all(issubclass(f, str) and issubclass(f, Enum) for f in cls.reasons), cls
    assert IllegalTransition.reasons == (UsageReason,) and TaskCancelled().reason == "cancelled"
    assert GpuError.__mro__[1] is WeeiError


def _api_tables() -> dict[str, list[list[str]]]:
    text = (DOCS / "api.md").read_text()
    section = text.split("\n## Error reasons\n", 1)[1].split("\n## ", 1)[0]
    tables: dict[str, list[list[str]]] = {}
    current = None
    for line in section.splitlines():
        heading = re.match(r"### `\w+` \(`(\w+)`\)$", line)
        if heading:
            current = tables.setdefault(heading.group(1), [])
        elif current is not None and line.startswith("| `"):
            current.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return tables


def test_api_md_tables_every_code_a_caller_sees_with_what_to_do() -> None:
    tables = _api_tables()
    assert set(tables) == {family.__name__ for family in API_FAMILIES}
    for family in API_FAMILIES:
        rows = tables[family.__name__]
        documented = [row[0].strip("`") for row in rows]
        codes = [member.value for member in family]
        assert len(documented) == len(set(documented)), f"{family.__name__}: a code listed twice"
        assert set(codes) - set(documented) == set(), f"{family.__name__}: not in docs/api.md"
        assert set(documented) - set(codes) == set(), f"{family.__name__}: in docs/api.md but not in the enum"
        for row in rows:
            assert len(row) == 3 and all(row), f"{family.__name__}: {row} needs code | when | what to do"


@pytest.mark.parametrize(("family", "doc"), [(GpuReason, "gpu.md"), (OnnxReason, "onnx.md"), (FlowerReason, "flower.md"),
                                                 (SecAggReason, "privacy.md")])
def test_state_and_cli_reasons_are_in_their_docs(family: type[Enum], doc: str) -> None:
    # GPU reasons reach state.execution.fallback and the diagnostics card; ONNX reasons the CLI and the widget's form;
    # secure aggregation's the coordinator's log and a failed round's record.
    text = (DOCS / doc).read_text()
    missing = [m.value for m in family if f"`{m.value}`" not in text]
    assert not missing, f"docs/{doc} does not name {missing}"
