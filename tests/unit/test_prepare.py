"""Job preparation refuses bad input with the named error, before anything is shared."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from weei.core.errors import ManifestError, ModelError, SettingsError, WeeiError
from weei.demo.run import models_dir
from weei.prepare import prepare_job
from weei.runtime.wasmtime_engine import WasmtimeEngine

SETTINGS = {"epochs": 1, "localEpochs": 1, "batchSize": 16, "coordinatorParticipates": True}


def _package(model: str) -> tuple[bytes, dict[str, Any], dict[str, bytes], Path]:
    root = models_dir() / model
    manifest = json.loads((root / "manifest.json").read_text())
    files = {e["fileName"]: (root / "data" / e["fileName"]).read_bytes()
             for e in manifest["inlineJson"]["dataset-manifest.json"]}
    return (root / "model.wasm").read_bytes(), manifest, files, root


def _prepare(wasm: bytes, manifest: Any, files: dict[str, bytes], settings: Any = SETTINGS,
             validation: tuple[str, bytes] | None = None, wasm_name: str = "model.wasm") -> Any:
    return prepare_job(WasmtimeEngine(), job_id="job", wasm_name=wasm_name, wasm=wasm, manifest=manifest,
                       files=files, settings=settings, random_bytes=bytes(range(16)), validation=validation)


def test_digits_package_prepares_with_confirmed_example_counts() -> None:
    wasm, manifest, files, root = _package("digits-mlp")
    job = _prepare(wasm, manifest, files, validation=("validation.bin", (root / "data" / "validation.bin").read_bytes()))
    assert len(job.spec.chunks) == 15
    assert sum(c.example_count for c in job.spec.chunks) == 1500
    assert len(job.initial_weights) == job.spec.weight_bytes == manifest["execution"]["weightBytes"]
    assert job.job_seed is None and job.spec.has_validation


def test_plain_chunk_list_is_accepted_for_a_dataset_model() -> None:
    wasm, manifest, files, _ = _package("digits-mlp")
    job = _prepare(wasm, manifest["inlineJson"]["dataset-manifest.json"], files)
    assert len(job.spec.chunks) == 15


def test_cartpole_package_draws_a_job_seed() -> None:
    wasm, manifest, files, _ = _package("cartpole-reinforce")
    job = _prepare(wasm, manifest, files, settings={**SETTINGS, "experience": {"unitsPerAssignment": 8}})
    assert job.spec.is_experience and job.job_seed == int.from_bytes(bytes(range(8)), "little")


@pytest.mark.parametrize("mutate, reason", [
    (lambda w, m, f: f.__setitem__("training-001.bin", f["training-001.bin"][:-65]), "file-size-mismatch"),
    (lambda w, m, f: f.__setitem__("training-001.bin", bytes(reversed(f["training-001.bin"]))), "file-sha256-mismatch"),
    (lambda w, m, f: f.pop("training-002.bin"), "missing-file"),
    (lambda w, m, f: f.__setitem__("stray.bin", b"x"), "unexpected-file"),
])
def test_selected_files_must_match_the_manifest(mutate: Any, reason: str) -> None:
    wasm, manifest, files, _ = _package("digits-mlp")
    mutate(wasm, manifest, files)
    with pytest.raises(ManifestError) as err:
        _prepare(wasm, manifest, files)
    assert err.value.reason == reason


def test_a_different_module_than_the_package_names_is_refused() -> None:
    wasm, manifest, files, _ = _package("digits-mlp")
    other, _, _, _ = _package("cartpole-reinforce")
    with pytest.raises(ManifestError) as err:
        _prepare(other, manifest, files)
    assert err.value.reason in ("wasm-size-mismatch", "wasm-sha256-mismatch")
    # One demo's module with another's manifest: the error names the model the manifest is for.
    assert "this manifest is for model 'digits-mlp'" in err.value.message, err.value.message
    assert "is model 'cartpole-reinforce'" in err.value.message


def test_a_rebuilt_module_of_the_same_model_keeps_the_mismatch_message() -> None:
    wasm, manifest, files, _ = _package("digits-mlp")
    with pytest.raises(ManifestError) as err:
        _prepare(wasm + b"\0", manifest, files)  # a trailing byte: the same model, not the package's file
    assert err.value.reason == "wasm-size-mismatch" and "this manifest is for" not in err.value.message


def test_malformed_manifest_is_refused() -> None:
    wasm, manifest, files, _ = _package("digits-mlp")
    for bad in ("not a manifest", 42, {"schema": "something-else"}):
        with pytest.raises(ManifestError):
            _prepare(wasm, bad, files)


def test_an_inline_file_that_does_not_match_its_descriptor_is_refused() -> None:
    wasm, manifest, files, _ = _package("digits-mlp")
    manifest = copy.deepcopy(manifest)
    manifest["inlineJson"]["compatibility.json"]["weightCount"] += 1
    with pytest.raises(ManifestError):
        _prepare(wasm, manifest, files)


def test_a_chunk_the_model_cannot_read_is_refused_naming_it() -> None:
    wasm, manifest, files, _ = _package("digits-mlp")
    entries = manifest["inlineJson"]["dataset-manifest.json"]
    garbage = b"JUNK" + bytes(61)
    import hashlib
    entries[0] = dict(entries[0], bytes=len(garbage), sha256=hashlib.sha256(garbage).hexdigest())
    files[entries[0]["fileName"]] = garbage
    with pytest.raises(WeeiError) as err:
        _prepare(wasm, entries, files)
    assert isinstance(err.value, (ModelError, ManifestError))


def test_example_count_must_agree_with_the_model() -> None:
    wasm, manifest, files, _ = _package("digits-mlp")
    entries = [dict(e) for e in manifest["inlineJson"]["dataset-manifest.json"]]
    entries[3]["exampleCount"] += 1
    with pytest.raises(ManifestError) as err:
        _prepare(wasm, entries, files)
    assert err.value.reason == "example-count-mismatch" and "training-004.bin" in str(err.value)


def test_experience_package_refuses_a_validation_file_and_a_plain_list() -> None:
    wasm, manifest, files, _ = _package("cartpole-reinforce")
    with pytest.raises(ManifestError):
        _prepare(wasm, manifest, files, validation=("v.bin", b"x"))
    with pytest.raises(ManifestError):
        _prepare(wasm, [], files)


def test_settings_are_checked_against_the_model() -> None:
    wasm, manifest, files, _ = _package("cartpole-reinforce")
    with pytest.raises(SettingsError) as err:
        _prepare(wasm, manifest, files, settings={**SETTINGS, "experience": {"unitsPerAssignment": 5000}})
    assert err.value.field == "experience.unitsPerAssignment"
    with pytest.raises(SettingsError) as err:
        _prepare(wasm, manifest, files, settings={**SETTINGS, "epochs": 3, "rounds": 4})
    assert err.value.field in ("epochs", "rounds")


def test_oversized_module_is_refused_before_it_is_compiled() -> None:
    _, manifest, files, _ = _package("digits-mlp")
    with pytest.raises(ManifestError) as err:
        _prepare(bytes(256 * 1000 * 1000 + 1), manifest, files)
    assert err.value.reason == "file-too-large"


def test_an_oversized_shader_archive_is_refused_by_its_size_before_it_is_read() -> None:
    wasm, manifest, files, _ = _package("digits-mlp")
    with pytest.raises(ManifestError) as err:
        prepare_job(WasmtimeEngine(), job_id="job", wasm_name="model.wasm", wasm=wasm, manifest=manifest,
                    files=files, settings=SETTINGS, random_bytes=bytes(range(16)),
                    execution_files={"model.wgsl.json": bytes((4 << 20) + 1)})
    assert err.value.reason == "file-too-large" and "4 MiB" in err.value.message
