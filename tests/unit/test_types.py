"""mypy over ``weei.core`` finds nothing: the wheel ships ``py.typed``, so its annotations must be true.

The settings (which files, how strict) and the pinned mypy are in
pyproject.toml (``[tool.mypy]``, the dev extra). A missing mypy fails this
test rather than skipping it: ``make setup`` installs the dev extra, and a
skipped check would let wrong types ship unnoticed.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_core_type_checks_clean(tmp_path: Path) -> None:
    assert importlib.util.find_spec("mypy") is not None, \
        "mypy is not installed: pip install -e '.[dev]' (pyproject.toml pins its version)"
    # A fresh cache each run: a stale one from another checkout or mypy version cannot hide an error.
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, f"mypy found type errors in weei.core:\n{result.stdout}{result.stderr}"
    assert "no issues found" in result.stdout
