"""``weei model build DIR``: compile a model folder into a checked package.

The folder (``weei model new`` makes one) holds the model's .c files (those
``weei-model.toml`` lists are compiled, after :mod:`.sources`' checks), the
SDK in ``sdk/`` and its data in ``data/`` (``weei data chunk`` writes it):
``training-*.bin`` chunks, an optional ``validation.bin``, the file slots of
auxiliaryWeights as ``auxiliary-<id>.bin`` and an optional ``dataset-manifest.json``.
An optional ``model.wgsl.json`` (a WGSL archive) adds a GPU backend.

The build writes ``model.wasm`` and ``manifest.json`` into the folder, then
prepares a job from exactly those files with :func:`weei.prepare.prepare_job`
— the code the page runs before anything is shared — and finally trains and
evaluates once from the initial weights, so a module that fails at its
first step fails here rather than on a participant.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import WeeiError
from ..core.formats.jsonfmt import stringify
from .compile import BuildError, compile_wasm
from .package import ARCHIVE_NAME, model_manifest, probe_model
from .sources import check_source, model_sources

__all__ = ["CHECKS", "BuildReport", "build_package"]

#: The manual's list "Before anything is shared, Weei checks", in the words
#: the report prints once prepare_job accepted the package.
CHECKS = (
    "file sizes within the limits of each kind (module, chunk, auxiliary, validation, WGSL)",
    "schema and host runtime; workSource and auxiliaryWeights are valid",
    "the module is the package's wasm and the CPU backend's artifact (name, size, SHA-256)",
    "inline files match their descriptors; compatibility.json names the same model and weight size",
    "every chunk is a dataset manifest entry (name, size, SHA-256); for inputs 'none' no chunk and no validation",
    "a GPU backend, when there is one, comes with its shaderArchive, checked module by module",
    "after loading: model ID, initial weight size, workSource and auxiliaryWeights equal getModelInfo()",
    "settings fit the model (aggregation methods, units per assignment)",
    "describeChunk of every chunk gives the manifest's exampleCount; the validation file is readable",
)

# One local epoch, small batches: the settings the check run trains with.
_CHECK_SETTINGS = {"epochs": 1, "localEpochs": 1, "batchSize": 32, "coordinatorParticipates": True}


@dataclass
class BuildReport:
    """What the build wrote and found."""

    folder: Path
    info: dict[str, Any] = field(default_factory=dict)
    wasm_bytes: int = 0
    weight_bytes: int = 0
    chunks: list[dict[str, Any]] = field(default_factory=list)
    validation: bool = False
    gpu: bool = False
    train_metrics: dict[str, float] = field(default_factory=dict)
    eval_metrics: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    compiled: list[Path] = field(default_factory=list)

    def lines(self) -> list[str]:
        experience = "workSource" in self.info
        kind = "experience" if experience else "dataset"
        out = [f"model {self.info['id']} {self.info.get('version', '')}: {kind} model, "
               f"{self.weight_bytes // 4} float32 weights ({self.weight_bytes} bytes)",
               "compiled (weei-model.toml's sources and the SDK; nothing else): "
               + ", ".join(str(p) for p in self.compiled),
               f"wrote {self.folder / 'model.wasm'} ({self.wasm_bytes} bytes)",
               f"wrote {self.folder / 'manifest.json'}"]
        if not experience:
            examples = sum(c["exampleCount"] for c in self.chunks)
            out.append(f"dataset: {len(self.chunks)} chunks, {examples} examples"
                       + (", validation.bin" if self.validation else ", no validation file"))
        out.append("GPU backend: " + (ARCHIVE_NAME if self.gpu else "none (trains on the CPU)"))
        out.append("checks before sharing (weei.prepare.prepare_job, as the page runs them):")
        out += [f"  ok  {check}" for check in CHECKS]
        out.append("  ok  one train and one evaluate from the initial weights: "
                   + ", ".join(f"train {k} {v:.4g}" for k, v in self.train_metrics.items()) + "; "
                   + ", ".join(f"eval {k} {v:.4g}" for k, v in self.eval_metrics.items()))
        out += [f"note: {n}" for n in self.notes]
        return out


def build_package(folder: Path, *, random_bytes: bytes = bytes(range(16))) -> BuildReport:
    """Compile ``folder``, write its package and run the checks.

    ``random_bytes`` stands for the page's random source (job seed, initial
    weights seed); fixed by default so a build reports the same numbers.

    Raises: BuildError (a source refused by :mod:`.sources`, compiling, the
    folder's layout, a data/dataset-manifest.json
    that differs from the chunks); the checker's SettingsError,
    ManifestError or ModelError with its named reason.
    """
    from ..prepare import prepare_job
    from ..runtime import WasmtimeEngine

    folder = folder.resolve()
    if not folder.is_dir():
        raise BuildError(f"{folder} is not a directory")
    report = BuildReport(folder)
    report.compiled = model_sources(folder)
    for source in report.compiled:
        check_source(folder, source)
    with tempfile.TemporaryDirectory(prefix="weei-model-") as tmp:
        out = Path(tmp) / "model.wasm"
        compile_wasm(report.compiled, out, folder)
        wasm = out.read_bytes()
    data_dir = folder / "data"
    facts = probe_model(wasm, data_dir)
    archive_path = folder / ARCHIVE_NAME
    archive = archive_path.read_bytes() if archive_path.is_file() else None
    if archive is not None and not facts.gpu:
        raise BuildError(f"{archive_path}: the module exports no gpuBegin/gpuNext/gpuEnd, so it takes no WGSL archive")
    if facts.gpu and archive is None:
        report.notes.append(f"the module exports gpu* operations but there is no {ARCHIVE_NAME}: CPU only")
    manifest = model_manifest(wasm, facts, archive)
    listed = data_dir / "dataset-manifest.json"
    if listed.is_file() and json.loads(listed.read_text(encoding="utf-8")) != manifest["inlineJson"]["dataset-manifest.json"]:
        raise BuildError(f"{listed} differs from the chunks the model describes in {data_dir} (run weei data chunk again)")
    (folder / "model.wasm").write_bytes(wasm)
    (folder / "manifest.json").write_text(stringify(manifest, 2) + "\n", encoding="utf-8")

    files = {c["fileName"]: (data_dir / c["fileName"]).read_bytes() for c in facts.chunks}
    for slot in manifest.get("auxiliaryWeights", []):
        if "fileName" in slot:
            path = data_dir / slot["fileName"]
            if not path.is_file():
                raise BuildError(f"auxiliary slot {slot['id']!r}: {path} is missing")
            files[slot["fileName"]] = path.read_bytes()
    validation_path = data_dir / "validation.bin"
    validation = ("validation.bin", validation_path.read_bytes()) if validation_path.is_file() else None
    experience = "workSource" in facts.info
    settings = dict(_CHECK_SETTINGS)
    prepared = prepare_job(WasmtimeEngine(), job_id="weei-model-build", wasm_name="model.wasm", wasm=wasm,
                           manifest=json.loads(stringify(manifest)), files=files, settings=settings,
                           random_bytes=random_bytes, validation=validation,
                           execution_files={ARCHIVE_NAME: archive} if archive is not None else None)
    _train_once(prepared, files, experience, report)
    report.info = facts.info
    report.wasm_bytes = len(wasm)
    report.weight_bytes = facts.weight_bytes
    report.chunks = facts.chunks
    report.validation = validation is not None
    report.gpu = archive is not None
    return report


def _train_once(prepared: Any, files: dict[str, bytes], experience: bool, report: BuildReport) -> None:
    """Train once from the initial weights and evaluate the result."""
    runtime = prepared.runtime
    spec = prepared.spec
    # File slots get their files; snapshot slots (a source rule) the initial weights, as in round 1.
    slots = prepared.package.auxiliary_weights if prepared.package is not None else ()
    aux = {s.id: files[s.file_name] if s.file_name else prepared.initial_weights for s in slots}

    def load(weights: bytes) -> None:
        runtime.load_model(weights)
        runtime.load_auxiliary(aux)

    load(prepared.initial_weights)
    if experience:
        units = spec.info.work_source.minimum_units if spec.info.work_source else 1
        result = runtime.train(experience=(0, max(units, 1), 1), seed=1, settings={"localEpochs": 1})
        load(result.weights)
        evaluation = runtime.evaluate(experience=(0, spec.info.work_source.evaluation_units or 1, 2))
    else:
        chunk = spec.chunks[0]
        result = runtime.train(data=files[chunk.file_name], format=chunk.format, seed=1,
                               settings={"localEpochs": 1, "batchSize": 32})
        load(result.weights)
        data = prepared.validation if prepared.validation is not None else files[chunk.file_name]
        evaluation = runtime.evaluate(data=data, format=chunk.format)
    report.train_metrics = dict(result.metrics)
    report.eval_metrics = dict(evaluation.metrics)


def run_build(folder: Path, stream: Any, errors: Any) -> int:
    """The command: print the report; a failure prints its named reason and returns 1."""
    try:
        report = build_package(folder)
    except BuildError as exc:
        print(f"weei model build: FAILED [build-error]: {exc}", file=errors)
        return 1
    except WeeiError as exc:
        print(f"weei model build: FAILED [{exc.reason}]: {exc.message}", file=errors)
        return 1
    for line in report.lines():
        print(line, file=stream)
    from .commands import invoked_as

    files = "model.wasm and manifest.json" + ("" if "workSource" in report.info else " and the files of data/")
    print(f"OK: the package is ready to share: in the widget, choose the folder {folder} (Model folder, or drop "
          f"it on the window) or select {files}; to train here: {invoked_as()} train {folder} --out run", file=stream)
    return 0
