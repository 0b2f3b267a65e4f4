"""Repository layout rules that otherwise fail only late (in CI) or silently."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_test_module_names_are_unique_across_suites():
    # `make test` collects tests/unit and tests/browser in one pytest session
    # with rootdir-relative imports: two test_x.py files abort collection.
    names = Counter(p.name for p in (ROOT / "tests").rglob("test_*.py"))
    assert [n for n, c in names.items() if c > 1] == []
