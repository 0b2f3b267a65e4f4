"""A model made with `weei model new` trains in the widget (headless Chromium).

The model folder is made outside the repository (tmp) with the same three
commands a newcomer runs — model new, data chunk, model build — and its
files are chosen in the widget's file inputs like a user would: module,
manifest, dataset files, validation file. The coordinator alone trains one
epoch (8 rounds of one chunk each), validated every round.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect
from test_widget import API, HOST, fill, open_widget, state

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from test_modelkit import write_blobs  # noqa: E402  (the unit test's record generator)

from weei.cli import main  # noqa: E402


@pytest.fixture(scope="module")
def blobs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("clang") is None:
        pytest.skip("clang is not installed (make setup)")
    root = tmp_path_factory.mktemp("byo")
    folder = root / "blobs"
    assert main(["model", "new", str(folder)]) == 0
    shutil.rmtree(folder / "data")  # the sample's: the newcomer's own records replace it
    write_blobs(root / "records.csv")
    assert main(["data", "chunk", str(root / "records.csv"), "--chunks", "8", "--validation", "200", "--seed", "1",
                 "--out", str(folder / "data")]) == 0
    assert main(["model", "build", str(folder)]) == 0
    return folder


def test_widget_trains_a_model_made_with_weei_model_new(weei_server: Any, page: Any, blobs: Path) -> None:
    pg, log = page
    pg.set_viewport_size({"width": 1280, "height": 1000})
    open_widget(pg, weei_server.url)
    chunks = sorted(str(p) for p in (blobs / "data").glob("training-*.bin"))
    pg.get_by_label("Model module (.wasm)").set_input_files(str(blobs / "model.wasm"))
    pg.get_by_label("Manifest (.json)").set_input_files(str(blobs / "manifest.json"))
    pg.get_by_label("Dataset files (and auxiliary weights)").set_input_files(chunks)
    pg.get_by_label("Validation file (optional)").set_input_files(str(blobs / "data" / "validation.bin"))
    fill(pg, "Epochs", "1")
    fill(pg, "Local epochs", "2")
    fill(pg, "Batch size", "16")
    pg.get_by_label("Validate", exact=True).check()
    fill(pg, "Validate every", "1")
    pg.get_by_role("button", name="Create job").click()
    pg.wait_for_function(f"() => {API}.getState().job?.status === 'ready'", timeout=60_000)
    job = state(pg)["job"]
    assert job["info"]["id"] == "blobs" and len(job["queue"]) == 8
    start = pg.get_by_role("button", name="Start", exact=True)
    expect(start).to_be_enabled()
    start.click()
    pg.wait_for_function(f"() => {API}.getState().job?.status === 'completed'", timeout=240_000)
    checkpoints = [c for c in state(pg)["job"]["checkpoints"] if "validationMetrics" in c]
    accuracy = {c["artifact"]["round"]: c["validationMetrics"]["values"]["accuracy"] for c in checkpoints}
    # 8 chunks make 7 or 8 rounds: with two local Workers a round may take two chunks.
    last = max(accuracy)
    assert last >= 7 and accuracy[last] >= 0.9 and accuracy[last] > accuracy[min(accuracy)], accuracy
    rows = f"document.querySelector('{HOST}').shadowRoot.querySelectorAll('table.checkpoints tbody tr').length"
    assert pg.evaluate(rows) >= last
    assert not log.errors, log.errors
