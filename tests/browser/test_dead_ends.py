"""The widget's dead ends of a newcomer's second hour (issue 24, "Dead ends"), driven as a user would.

After a first job the next one must be one click away; the folder `weei model new` and `weei model
build` made is chosen whole (folder picker or drop), its data/ routed to dataset and validation.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect
from test_widget import API, HOST, fill, open_widget, state

from weei.cli import main


def _stop_confirmed(pg: Any) -> None:
    stop = pg.get_by_role("button", name="Stop", exact=True)
    expect(stop).to_be_enabled()
    stop.click()
    # The first click only asks: the job goes on.
    confirm = pg.get_by_role("button", name="Confirm stop")
    expect(confirm).to_be_visible()
    assert state(pg)["job"]["status"] in ("running", "paused")
    confirm.click()
    pg.wait_for_function(f"() => {API}.getState().job?.status === 'completed'", timeout=120_000)


def test_create_job_is_visible_after_a_stopped_job(weei_server: Any, page: Any) -> None:
    pg, log = page
    pg.set_viewport_size({"width": 1280, "height": 900})
    open_widget(pg, weei_server.url)
    pg.get_by_role("button", name="Digits MLP demo").click()
    pg.get_by_text("Digits MLP demo:").wait_for()
    fill(pg, "Epochs", "20")
    pg.get_by_role("button", name="Create job").click()
    pg.wait_for_function(f"() => {API}.getState().job?.status === 'ready'", timeout=60_000)
    pg.get_by_role("button", name="Start", exact=True).click()
    pg.wait_for_function(f"() => {API}.getState().job?.status === 'running'", timeout=60_000)
    _stop_confirmed(pg)

    # The next demo: its primary action is on screen, not inside the folded settings.
    pg.get_by_role("button", name="CartPole demo").click()
    pg.get_by_text("CartPole demo:").wait_for()
    create = pg.get_by_role("button", name="Create job")
    expect(create).to_be_visible()
    expect(create).to_be_enabled()
    create.click()
    pg.wait_for_function(f"() => {API}.getState().job?.status === 'ready' && {API}.getState().job.info.id === "
                         "'cartpole-reinforce'", timeout=60_000)
    # A disabled button looks disabled: faded and without the pointer cursor.
    look = pg.evaluate(f"""() => {{
      const b = [...document.querySelector('{HOST}').shadowRoot.querySelectorAll('button')]
        .find((x) => x.textContent === 'Pause');
      const s = getComputedStyle(b);
      return {{ disabled: b.disabled, opacity: Number(s.opacity), cursor: s.cursor }};
    }}""")
    assert look["disabled"] and look["opacity"] < 0.6 and look["cursor"] == "not-allowed", look
    assert not log.errors, log.errors


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model folder exactly as `weei model new` and `weei model build` leave it (sample data in data/)."""
    if shutil.which("clang") is None:
        pytest.skip("clang is not installed (make setup)")
    folder = tmp_path_factory.mktemp("second-hour") / "mymodel"
    assert main(["model", "new", str(folder), "--features", "5", "--classes", "3"]) == 0
    assert main(["model", "build", str(folder)]) == 0
    return folder


def _train_briefly(pg: Any) -> dict[str, Any]:
    fill(pg, "Epochs", "1")
    pg.get_by_role("button", name="Create job").click()
    pg.wait_for_function(f"() => {API}.getState().job?.status === 'ready'", timeout=60_000)
    return state(pg)["job"]


def test_the_model_folder_is_chosen_whole(weei_server: Any, page: Any, model_folder: Path) -> None:
    pg, log = page
    pg.set_viewport_size({"width": 1280, "height": 900})
    open_widget(pg, weei_server.url)
    pg.get_by_label("Model folder").set_input_files(str(model_folder))
    summary = pg.get_by_text("folder mymodel:")
    summary.wait_for()
    text = summary.inner_text()
    assert "model.wasm" in text and "manifest.json" in text and "6 dataset files" in text, text
    # validation.bin routed to validation; the sources, sdk/, sample.csv and dataset-manifest.json are not used
    assert "validation validation.bin" in text and "not used: model.c, sample.csv, weei-model.toml and 7 more" in text
    job = _train_briefly(pg)
    assert job["info"]["id"] == "mymodel" and len(job["queue"]) == 6
    assert pg.get_by_label("Validate", exact=True).is_checked()
    assert not log.errors, log.errors


def test_the_files_of_data_are_accepted_as_the_readme_says(weei_server: Any, page: Any, model_folder: Path) -> None:
    """'Select the files of data/' (README, weei model build's last line) was refused: dataset-manifest.json and
    validation.bin were 'not named in the manifest'."""
    pg, log = page
    pg.set_viewport_size({"width": 1280, "height": 900})
    open_widget(pg, weei_server.url)
    pg.get_by_label("Model module (.wasm)").set_input_files(str(model_folder / "model.wasm"))
    pg.get_by_label("Manifest (.json)").set_input_files(str(model_folder / "manifest.json"))
    data = sorted(str(p) for p in (model_folder / "data").iterdir())
    assert any(p.endswith("dataset-manifest.json") for p in data) and any(p.endswith("validation.bin") for p in data)
    pg.get_by_label("Dataset files (and auxiliary weights)").set_input_files(data)
    job = _train_briefly(pg)
    assert job["info"]["id"] == "mymodel" and len(job["queue"]) == 6 and not job.get("validationUnavailable")
    assert not log.errors, log.errors


def test_a_dropped_folder_is_chosen_as_the_picker_would(weei_server: Any, page: Any, model_folder: Path) -> None:
    pg, log = page
    pg.set_viewport_size({"width": 1280, "height": 900})
    open_widget(pg, weei_server.url)
    files = [model_folder / "model.wasm", model_folder / "manifest.json", model_folder / "model.c",
             *sorted((model_folder / "data").iterdir())]
    payload = [{"name": p.name, "bytes": list(p.read_bytes())} for p in files]
    # A drop of the package's files (a synthetic drop carries files, not directory entries).
    pg.evaluate(f"""(payload) => {{
      const dt = new DataTransfer();
      for (const f of payload) dt.items.add(new File([new Uint8Array(f.bytes)], f.name));
      const win = document.querySelector('{HOST}').shadowRoot.querySelector('.win');
      win.dispatchEvent(new DragEvent('dragover', {{ dataTransfer: dt, bubbles: true, cancelable: true }}));
      win.dispatchEvent(new DragEvent('drop', {{ dataTransfer: dt, bubbles: true, cancelable: true }}));
    }}""", payload)
    summary = pg.get_by_text("dropped files:")
    summary.wait_for()
    assert "6 dataset files" in summary.inner_text() and "model.c" in summary.inner_text()
    job = _train_briefly(pg)
    assert job["info"]["id"] == "mymodel" and len(job["queue"]) == 6
    assert not log.errors, log.errors
