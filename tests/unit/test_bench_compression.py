"""bench/bench_compression.py --quick: the P8 harness on one epoch of digits-mlp and a 1M-weight round.

Not a timing test: it checks that the runs completed without a rejected update, that the compressed runs
sent fewer bytes than float32 in the order int4 < int8 < float32, that deflating the codes lost nothing (the
same final loss) and sent fewer bytes, and that every goal line is printed with its verdict (whatever the
verdict is on this machine).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_run_prints_every_goal_line() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "app" / "py"))
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_compression.py"), "--quick"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {m.group(1): m for m in re.finditer(
        r"^\s+1\s+(float32|int8|int4|int8\+deflate|int4\+deflate)\s+(\S+)\s+\S+\s+(\d+)\s+\d+\s+\S+\s+(\d+)",
        done.stdout, re.M)}
    assert set(rows) == {"float32", "int8", "int4", "int8+deflate", "int4+deflate"}
    per_update = {kind: int(m.group(3)) for kind, m in rows.items()}
    assert per_update["int4"] < per_update["int8"] < per_update["float32"] / 3
    for kind in ("int8", "int4"):
        assert per_update[f"{kind}+deflate"] < per_update[kind]
        assert rows[f"{kind}+deflate"].group(2) == rows[kind].group(2)  # lossless: the same final loss
    assert all(m.group(4) == "0" for m in rows.values())  # no update rejected
    goals = [line for line in done.stdout.splitlines() if line.startswith("P8 ")]
    assert len(goals) == 8 and all(line.endswith(("MET", "not met")) for line in goals)
