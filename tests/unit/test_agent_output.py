"""What `weei agent` prints (issue 24, item 16): no XDG_RUNTIME_DIR noise from the GPU probe on a headless
machine. The per-assignment lines are checked in test_agent.py's WebRTC job."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_gpu_probe_is_quiet_without_xdg_runtime_dir(tmp_path: Path) -> None:
    pytest.importorskip("wgpu")
    script = ("import sys; from pathlib import Path; from weei.agent.main import _wgpu\n"
              "gpu = _wgpu(Path(sys.argv[1]))\n"
              "adapter = gpu.request_adapter_sync(power_preference='high-performance') if gpu else None\n"
              "print('adapter', bool(adapter))\n")
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    env["PYTHONPATH"] = str(ROOT / "app" / "py")
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "XDG_RUNTIME_DIR" not in proc.stderr, proc.stderr
    runtime = tmp_path / "runtime"
    assert runtime.is_dir() and (runtime.stat().st_mode & 0o777) == 0o700
