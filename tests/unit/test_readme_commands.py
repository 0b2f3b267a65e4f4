"""The commands README and docs show run as written after `make` (issue 24, item 7): `make` installs the
`weei` command into .venv (pyproject's [project.scripts]), not onto PATH, so every command line says
`.venv/bin/weei`."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _command_lines(text: str) -> list[str]:
    """Lines of code blocks (indented or fenced) that run a command."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced or line.startswith("    "):
            lines.append(line.strip())
    return lines


def test_one_form_of_the_weei_command_throughout() -> None:
    assert re.search(r'^\[project\.scripts\]\nweei = "weei\.cli:main"$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert ".venv" in (ROOT / "Makefile").read_text()
    bare = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for line in _command_lines(doc.read_text(encoding="utf-8")):
            if re.match(r"(\$ )?weei [a-z]", line):
                bare.append(f"{doc.relative_to(ROOT)}: {line}")
    assert not bare, "\n".join(bare)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert ".venv/bin/weei model new ~/mymodel --features" in readme and ". .venv/bin/activate" in readme
