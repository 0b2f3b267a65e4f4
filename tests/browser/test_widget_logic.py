"""The window's pure helpers of issue 24 (items 10, 11, 12, 15), imported from the served site into a page:
events between two states, the header's status, the GPU line, the smoothed ETA, the peer cards' facts and
the quota warning."""

from __future__ import annotations

import math
from typing import Any


def test_pure_helpers(weei_server: Any, page: Any) -> None:
    pg, log = page
    pg.goto(weei_server.url)
    out = pg.evaluate("""async () => {
      const base = new URL('widget/', location.href).href;
      const { eventsBetween } = await import(base + 'events.js');
      const { statusText, gpuNote, gpuSpeedNote, EtaSmoother, elapsedText } = await import(base + 'status.js');
      const { peerFacts, fmtRate } = await import(base + 'peercards.js');
      const { fmtPct } = await import(base + 'tryit.js');
      const { quotaWarning } = await import(base + 'storage.js');
      const { metricRange } = await import(base + 'charts.js');
      const names = { a: { label: 'Ana' }, b: { label: 'Chrome on Linux #2' } };
      const job = (participants, status = 'running') => ({ id: 'j', status, role: 'coordinator', participants, checkpoints: [] });
      const before = { myPeerId: 'me', peers: ['a', 'b'], peerNames: names,
        job: job({ a: { state: 'modelLoaded', paused: false }, b: { state: 'invited' } }) };
      const after = { myPeerId: 'me', peers: ['a'], peerNames: names,
        job: job({ a: { state: 'modelLoaded', paused: true }, b: { state: 'declined', declined: 'model not in its allow-list' } }) };
      const eta = new EtaSmoother();
      const etas = [eta.update(60000, 0), eta.update(20000, 1000), eta.update(20000, 3000), eta.update(null, 4000)];
      const diag = (rate, age, stage = 'training') => ({ stage, stale: age > 0, ageMs: age,
        performance: { averageExamplesPerSecond: rate }, timings: { trainingMs: 1200, uploadMs: 30 } });
      return {
        events: eventsBetween(before, after).map((e) => e.text),
        none: eventsBetween(after, after).length,
        status: [statusText(before, { ...before.job, status: 'ready' }),
          statusText({ myPeerId: 'me' }, { role: 'participant', status: 'running', checkpoints: [{ artifact: { round: 0 } }],
            participants: { me: { state: 'modelLoaded' } } }),
          statusText({ myPeerId: 'me' }, { role: 'participant', status: 'running', checkpoints: [{ artifact: { round: 1 } }],
            participants: { me: { state: 'modelLoaded' } } })],
        gpu: [gpuNote({ gpu: { initializationError: "software-adapter: auto does not use the software adapter 'SwiftShader Device'" },
          execution: { fallbackReason: 'software-adapter: auto does not use the software adapter' } }),
          gpuNote({ gpu: { initializationError: 'device-lost: gone' } }), gpuNote({})],
        etas,
        speed: [gpuSpeedNote({ actual: 'gpu', examplesPerSecond: { cpu: 115, gpu: 41 } }),
          gpuSpeedNote({ actual: 'gpu', examplesPerSecond: { cpu: 113005, gpu: 3788 } }),
          gpuSpeedNote({ actual: 'gpu', examplesPerSecond: { cpu: 40, gpu: 115 } }), // faster: nothing to warn of
          gpuSpeedNote({ actual: 'gpu', examplesPerSecond: { gpu: 41 } }), // no CPU figure here
          gpuSpeedNote({ actual: 'cpu', examplesPerSecond: { cpu: 115, gpu: 41 } })],
        elapsed: elapsedText({ status: 'completed', checkpoints: [{ createdAt: 0 }, { createdAt: 62000 }] }),
        facts: peerFacts({ diagnostics: { p1: diag(50, 0), p2: diag(10, 150000), p3: diag(null, 0, 'waiting') } }, false)
          .map((f) => [f.peer, f.slowest, f.silentMs, f.roundMs]),
        formats: [fmtRate(14300.4), fmtRate(100000), fmtRate(42.71), fmtPct(0.974), fmtPct(0.00002)],
        quota: [quotaWarning(50, 100), quotaWarning(85, 100), quotaWarning(1, 0)],
        ranges: [metricRange({ id: 'accuracy', label: 'Accuracy' }, [0.9, 1]), metricRange({ id: 'loss' }, [2.3, 0.1]),
          metricRange({ id: 'return', label: 'Mean return' }, [-3, 12]), metricRange({ id: 'accuracy' }, [0.5, 2])],
      };
    }""")
    assert out["events"] == ["Chrome on Linux #2 left the room", "Ana paused its contribution",
                             "Chrome on Linux #2 declined the invitation: model not in its allow-list"]
    assert out["none"] == 0
    assert out["speed"] == ["GPU 2.8× slower than the CPU here (41 vs 115 examples/s)",
                            "GPU 30× slower than the CPU here (3788 vs 113005 examples/s)", None, None, None]
    assert out["status"] == ["coordinator · waiting for Start", "participant · accepted, waiting for Start",
                             "participant · running"]
    assert out["gpu"][0] == {"text": "SwiftShader, a software renderer: auto trains on the CPU; choose gpu to force it",
                             "error": False}
    assert out["gpu"][1] == {"text": "device-lost: gone", "error": True} and out["gpu"][2] is None
    # The first estimate as it is, the next a fifth of the way, then counting down with the clock.
    assert out["etas"] == [60000, 0.8 * 59000 + 0.2 * 20000, 0.8 * 59000 + 0.2 * 20000 - 2000, None]
    assert out["elapsed"] == "elapsed 1 min 2 s"
    assert out["formats"] == ["14,300", "100,000", "42.7", "97.4 %", "<0.1 %"]
    assert out["facts"] == [["p1", False, None, 1230], ["p2", True, 150000, 1230], ["p3", False, None, 1230]]
    assert out["quota"][0] is None and out["quota"][1].startswith("Storage is 85 % full") and out["quota"][2] is None
    # Axes stay inside a metric's range: a share in [0, 1], a loss from 0; a return may be negative.
    assert out["ranges"] == [[0, 1], [0, math.inf], [-math.inf, math.inf], [0, math.inf]]
    assert not log.errors, log.errors
