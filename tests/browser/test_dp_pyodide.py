"""DP's noise, clip and accountant give the same bits in the page's Pyodide as in CPython.

The noise generator avoids the platform's libm (its own logarithm, dp_noise.ln) so that a job's
noise is reproducible wherever the coordinator runs; this is the check that it is.
"""

from __future__ import annotations

import json
from typing import Any

from site_helpers import run_in_pyodide

CHECKS = r'''
def check():
    import hashlib, struct
    from weei.core.privacy.dp_accountant import epsilon_after, noise_multiplier_for
    from weei.core.privacy.dp_noise import clip_to_norm, gaussians, noise_key
    z = gaussians(noise_key(bytes(range(32)), "job-dp", 3), 20000)
    start = struct.pack("<256f", *[i / 256 for i in range(256)])
    update = struct.pack("<256f", *[(i % 7) - 3.0 for i in range(256)])
    return {
        "noise": hashlib.sha256(struct.pack(f"<{len(z)}d", *z)).hexdigest(),
        "clip": hashlib.sha256(clip_to_norm(start, update, 0.75)).hexdigest(),
        "eps": [epsilon_after(s, t, d).hex() for s in (0.7, 1.1, 5.0) for t in (1, 30, 500) for d in (1e-5, 1e-7)],
        "sigma": noise_multiplier_for(4.0, 30, 1e-5).hex(),
    }
'''


def test_dp_is_bit_identical_in_pyodide(weei_server: Any, page: Any) -> None:
    scope: dict[str, Any] = {}
    exec(CHECKS, scope)
    expected = json.loads(json.dumps(scope["check"]()))
    pg, log = page
    pg.goto(weei_server.url)
    got = run_in_pyodide(pg, CHECKS, "import json\njson.dumps(check())")
    assert json.loads(got) == expected
    assert not log.errors, log.errors
