"""``weei train``: any package trained in a federated job in one process, checkpoints written out.

A built-in package and an MLP built with onnx.helper and imported with
``weei model import`` both train and leave their .weei-checkpoint files in
--out; a folder that is no package and a settings file that is not JSON
are refused by name.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from weei.cli import main
from weei.core.formats.checkpoint import read_checkpoint

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "app" / "static" / "models" / "digits-mlp"


def _rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line.split() and line.split()[0].isdigit()]


def test_builtin_package_trains_and_writes_a_checkpoint_per_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", str(DIGITS), "--peers", "2", "--seed", "3", "--out", str(tmp_path / "out")]) == 0
    text = capsys.readouterr().out
    rows = _rows(text)
    files = sorted((tmp_path / "out").glob("*.weei-checkpoint"))
    # 15 chunks, 2 peers, 1 epoch: 8 rounds, plus checkpoint 0.
    assert len(rows) == len(files) == 9, text
    assert read_checkpoint(files[-1].read_bytes()).metadata.to_json()["round"] == 8
    assert "OK: the validation improved" in text


def test_imported_onnx_mlp_trains_with_settings_and_its_checkpoints_export(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from test_onnx_import import _digits, mlp

    (tmp_path / "mlp.onnx").write_bytes(mlp(32))
    package = tmp_path / "mlp"
    assert main(["model", "import", str(tmp_path / "mlp.onnx"), "--loss", "cross-entropy", "--optimizer", "adam",
                 "--lr", "0.01", "--data-format", "digits", "--data", str(DIGITS / "data"), "--id", "mlp",
                 "--out", str(package)]) == 0
    (tmp_path / "settings.json").write_text('{"epochs": 2, "batchSize": 16}')
    capsys.readouterr()
    assert main(["train", str(package), "--peers", "3", "--settings", str(tmp_path / "settings.json"),
                 "--out", str(tmp_path / "out")]) == 0
    text = capsys.readouterr().out
    rows = _rows(text)
    files = sorted((tmp_path / "out").glob("mlp-round-*.weei-checkpoint"))
    assert len(rows) == len(files) >= 11, text  # 15 chunks over 3 peers: 5 rounds an epoch, 2 epochs
    accuracy = [float(r[-2]) for r in rows[1:]]
    assert accuracy[-1] > accuracy[0] and accuracy[-1] >= 0.8, text

    assert main(["model", "export", str(files[-1]), "--package", str(package), "--onnx", str(tmp_path / "t.onnx")]) == 0
    records = _digits(DIGITS / "data" / "validation.bin")
    x = (records[:, :64] / 16.0).astype(np.float32)
    predicted = ort.InferenceSession(str(tmp_path / "t.onnx")).run(None, {"x": x})[0].argmax(1)
    assert abs(float((predicted == records[:, 64]).mean()) - accuracy[-1]) < 1e-3


def test_a_folder_without_a_manifest_is_refused_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", str(tmp_path), "--out", str(tmp_path / "out")]) == 1
    assert "FAILED [no-manifest]" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text", ["{\"epochs\": 1", "[1, 2]", "{\"epochs\": NaN}"])
def test_a_bad_settings_file_is_refused_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str) -> None:
    (tmp_path / "s.json").write_text(text)
    assert main(["train", str(DIGITS), "--settings", str(tmp_path / "s.json"), "--out", str(tmp_path / "out")]) == 1
    assert "FAILED [bad-settings-file]" in capsys.readouterr().err


def test_settings_the_controller_refuses_and_missing_files_are_refused_by_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "s.json").write_text('{"epochs": -1}')
    assert main(["train", str(DIGITS), "--settings", str(tmp_path / "s.json"), "--out", str(tmp_path / "out")]) == 1
    assert "FAILED [invalid-setting]" in capsys.readouterr().err
    (tmp_path / "data").mkdir()
    assert main(["train", str(DIGITS), "--data", str(tmp_path / "data"), "--out", str(tmp_path / "out")]) == 1
    assert "FAILED [missing-data-file]" in capsys.readouterr().err
