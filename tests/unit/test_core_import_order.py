"""Every module of weei.core imports first, on its own.

A cycle between modules (messages imports room_proof for its table of
message types; room_proof needs commands, which imports messages) once
made ``import weei.core.wire.commands`` fail in a fresh interpreter, while the
test suite passed because an earlier test module had imported messages
first. Each public module here is imported in a fresh interpreter state
(a private one, such as ``_checkpoint_note``, is imported through the
module that documents it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import weei.core

_CHECK = """
import importlib, sys
failed = []
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m == "weei" or m.startswith("weei.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed.append(f"{name}: {type(exc).__name__}: {exc}")
print("\\n".join(failed))
"""


def test_each_core_module_imports_first() -> None:
    root = Path(weei.core.__file__).parent
    names = sorted(f"weei.core.{p.stem}" for p in root.glob("*.py") if not p.stem.startswith("_"))
    assert "weei.core.wire.commands" in names and "weei.core.links.relay" in names
    env = {**os.environ, "PYTHONPATH": str(root.parents[1])}
    out = subprocess.run([sys.executable, "-c", _CHECK, *names], capture_output=True, text=True, env=env,
                         timeout=300, check=True)
    assert out.stdout.strip() == ""
