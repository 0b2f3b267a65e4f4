"""Learning quality: federated against central, and CartPole's rounds to 475.

* digits-mlp federated (4 peers, 3 dataset epochs, the demo's settings and
  also one local epoch) against the same model trained centrally for 3 epochs
  on all chunks joined into one file, both validated on the held-out file.
  Target: federated within 1 point of central and >= 0.95 accuracy.
* cartpole-reinforce federated (4 peers x 32 episodes per round) for 60
  rounds. Target: mean evaluation return >= 475 within 60 rounds.
"""

from __future__ import annotations

import io
import json
import struct
import sys
import tempfile
from pathlib import Path

from weei.demo.run import DEMO_JOBS, models_dir, run_job
from weei.runtime import ModelRuntime
from weei.runtime.wasmtime_engine import WasmtimeEngine


def central_digits(epochs: int, batch_size: int) -> dict[str, float]:
    """Validation metrics (loss, accuracy) of digits-mlp trained centrally on all chunks joined."""
    package = models_dir() / "digits-mlp"
    manifest = json.loads((package / "manifest.json").read_text())
    records = b""
    count = 0
    for entry in manifest["inlineJson"]["dataset-manifest.json"]:
        data = (package / "data" / entry["fileName"]).read_bytes()
        n = struct.unpack_from("<I", data, 4)[0]
        records += data[8:]
        count += n
    joined = b"WDG1" + struct.pack("<I", count) + records
    runtime = ModelRuntime.load((package / "model.wasm").read_bytes(), WasmtimeEngine())
    weights = runtime.create_initial_weights(1)
    runtime.load_model(weights)
    result = runtime.train(data=joined, format="weei-digits-v1", seed=7,
                           settings={"localEpochs": epochs, "batchSize": batch_size})
    runtime.load_model(result.weights)
    valid = runtime.evaluate(data=(package / "data" / "validation.bin").read_bytes(), format="weei-digits-v1")
    return dict(valid.metrics)


def main() -> int:
    digits = next(j for j in DEMO_JOBS if j.name == "digits")
    cartpole = next(j for j in DEMO_JOBS if j.name == "cartpole")
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        central = central_digits(3, digits.settings["batchSize"])["accuracy"]
        print(f"digits central, 3 epochs on all chunks: validation accuracy {central:.4f}")
        for local_epochs in (1, digits.settings["localEpochs"]):
            settings = dict(digits.settings, localEpochs=local_epochs)
            report = run_job(digits, Path(tmp), stream=io.StringIO(), settings=settings)
            accs = [r["validation"]["accuracy"] for r in report.rounds if r["round"] > 0]
            final = accs[-1]
            met = final >= 0.95 and final >= central - 0.01
            ok &= met or local_epochs == 1
            print(f"digits federated, 4 peers, 3 epochs, localEpochs {local_epochs}: accuracy per round "
                  + " ".join(f"{a:.3f}" for a in accs))
            print(f"  final {final:.4f} vs central {central:.4f}: {final - central:+.4f} "
                  f"-> {'met' if met else 'NOT met'} (>= 0.95 and within 1 point)")
        settings = dict(cartpole.settings, epochs=60)
        report = run_job(cartpole, Path(tmp), stream=io.StringIO(), settings=settings)
        returns = [r["validation"]["episodeReturn"] for r in report.rounds if r["round"] > 0]
        reached = next((i + 1 for i, v in enumerate(returns) if v >= 475), None)
        print("cartpole evaluation return per round: " + " ".join(f"{v:.0f}" for v in returns))
        print(f"  first round with mean evaluation return >= 475: {reached} "
              f"-> {'met' if reached is not None else 'NOT met'} (within 60 rounds)")
        ok &= reached is not None
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
