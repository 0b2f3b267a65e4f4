"""weei.core.formats.manifest: dataset manifests, packages, and every check before anything is shared."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from core_samples import (
    AUX_FILE,
    CHUNK_DATA,
    WASM,
    WEIGHT_BYTES,
    WGSL,
    chunks,
    dataset_info,
    experience_info,
    info_aux,
    package,
    package_aux,
    refresh_descriptors,
    sha,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from weei.core.errors import ManifestError, ManifestReason, ModelInfoReason
from weei.core.formats.manifest import (
    DatasetManifest,
    FileFacts,
    ModelPackage,
    check_dataset_files,
    check_dataset_manifest,
    check_loaded_model,
    check_plain_manifest,
    check_recorded_auxiliary,
    check_selection,
    file_facts,
    parse_dataset_manifest,
    parse_manifest_file,
    parse_package,
)
from weei.core.formats.modelinfo import ModelInfo


def reason_of(fn: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(ManifestError) as info:
        fn(*args, **kwargs)
    return info.value.reason


# --------------------------------------------------------------------------- dataset manifest


def test_spec_dataset_manifest_example() -> None:
    spec = [{"id": "chunk-001", "fileName": "training-001.bin", "bytes": 4096, "sha256": "0" * 64, "format": "my-binary", "exampleCount": 128}]
    m = parse_dataset_manifest(spec)
    assert m.entries[0].example_count == 128 and m.raw == spec
    check_plain_manifest(m, ModelInfo.from_json(dataset_info()))
    assert isinstance(parse_manifest_file(spec), DatasetManifest)


@pytest.mark.parametrize(
    ("key", "value"),
    [("id", ""), ("id", 3), ("fileName", "a/b.bin"), ("fileName", ""), ("bytes", 0), ("bytes", 1.5), ("bytes", True),
     ("sha256", "0" * 63), ("sha256", "F" * 64), ("format", ""), ("exampleCount", 0), ("exampleCount", ...)],
)
def test_dataset_entry_refusals(key: str, value: Any) -> None:
    entry = chunks()[0]
    if value is ...:
        del entry[key]
    else:
        entry[key] = value
    assert reason_of(parse_dataset_manifest, [entry]) == "invalid-dataset-manifest"


def test_dataset_manifest_duplicates_and_shape() -> None:
    a, b = chunks()
    assert reason_of(parse_dataset_manifest, [a, {**b, "id": a["id"]}]) == "duplicate-chunk-id"
    assert reason_of(parse_dataset_manifest, [a, {**b, "fileName": a["fileName"]}]) == "duplicate-file-name"
    assert reason_of(parse_dataset_manifest, {"a": 1}) == "invalid-dataset-manifest"
    # Entry by entry: the duplicate at [1] is named before a deep entry further on is walked (make fuzz found
    # an array of millions of references to one entry, walked whole before the duplicate at [1] was seen).
    deep: Any = {}
    for _ in range(100):
        deep = {"x": deep}
    assert reason_of(parse_dataset_manifest, [a, a, {**b, "extra": deep}]) == "duplicate-chunk-id"
    assert reason_of(parse_dataset_manifest, [a, {**b, "extra": deep}]) == "invalid-dataset-manifest"
    assert reason_of(parse_manifest_file, "x") == "invalid-manifest"


def test_dataset_manifest_against_model() -> None:
    info = ModelInfo.from_json(dataset_info())
    big = {**chunks()[0], "bytes": 8388609}
    assert reason_of(check_dataset_manifest, parse_dataset_manifest([big]), info) == "chunk-too-large"
    many = {**chunks()[0], "exampleCount": 10001}
    assert reason_of(check_dataset_manifest, parse_dataset_manifest([many]), info) == "too-many-examples"
    other = {**chunks()[0], "format": "csv"}
    assert reason_of(check_dataset_manifest, parse_dataset_manifest([other]), info) == "unknown-format"
    edge = {**chunks()[0], "bytes": 8388608, "exampleCount": 10000}
    check_dataset_manifest(parse_dataset_manifest([edge]), info)
    # An experience model comes as a package, never as a plain list, even [].
    exp = ModelInfo.from_json(experience_info())
    assert reason_of(check_plain_manifest, parse_dataset_manifest([]), exp) == "package-required"


def test_dataset_files() -> None:
    m = parse_dataset_manifest(chunks())
    check_dataset_files(m, dict(CHUNK_DATA))
    check_dataset_files(m, {n: file_facts(n, d) for n, d in CHUNK_DATA.items()})
    check_dataset_files(m, list(CHUNK_DATA.items()))
    name = "training-001.bin"
    assert reason_of(check_dataset_files, m, {**CHUNK_DATA, name: b"a" * 99}) == "file-size-mismatch"
    assert reason_of(check_dataset_files, m, {**CHUNK_DATA, name: b"c" * 100}) == "file-sha256-mismatch"
    assert reason_of(check_dataset_files, m, {**CHUNK_DATA, "extra.bin": b"x"}) == "unexpected-file"
    assert reason_of(check_dataset_files, m, {name: CHUNK_DATA[name]}) == "missing-file"
    assert reason_of(check_dataset_files, m, list(CHUNK_DATA.items()) + [(name, CHUNK_DATA[name])]) == "duplicate-file"
    assert reason_of(check_dataset_files, m, {name: FileFacts("other", 1, "0" * 64)}) == "file-name-mismatch"
    with pytest.raises(ManifestError, match="training-001.bin"):
        check_dataset_files(m, {**CHUNK_DATA, name: b""})


# --------------------------------------------------------------------------- package: static checks


def test_spec_package_example_parses() -> None:
    p = parse_package(package())
    assert isinstance(p, ModelPackage) and p.is_experience and p.model_id == "cartpole-reinforce"
    assert p.weight_bytes == WEIGHT_BYTES and p.dataset_manifest.entries == () and p.shader_archive is None
    assert isinstance(parse_manifest_file(package()), ModelPackage)
    # The spec's example: "[]\n" is 3 bytes.
    assert package()["execution"]["datasetManifest"]["bytes"] == 3


def mutate(path: str, value: Any, base: dict[str, Any] | None = None, refresh: bool = False) -> dict[str, Any]:
    obj = copy.deepcopy(base if base is not None else package())
    *parents, last = path.split(".")
    target: Any = obj
    for key in parents:
        target = target[int(key)] if isinstance(target, list) else target[key]
    if value is ...:
        del target[last]
    elif isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return refresh_descriptors(obj) if refresh else obj


@pytest.mark.parametrize(
    ("path", "value", "reason"),
    [
        ("schema", "weei-package", "unsupported-schema"),
        ("schemaVersion", 2, "unsupported-schema"),
        ("hostRuntime.id", "other", "unsupported-host-runtime"),
        ("hostRuntime.delivery", "download", "unsupported-host-runtime"),
        ("hostRuntime", ..., "unsupported-host-runtime"),
        ("wasm.sha256", "xyz", "invalid-package"),
        ("wasm", ..., "invalid-package"),
        ("workSource.inputs", "records", "invalid-work-source"),
        ("workSource.unitsPerAssignment.minimum", 0, "invalid-work-source"),
        ("auxiliaryWeights", [{"id": "a", "role": "r", "bytes": 8, "sha256": "0" * 64}], "invalid-auxiliary-weights"),
        ("execution.schema", "x", "unsupported-schema"),
        ("execution.weightFormat", "float16", "unsupported-weight-format"),
        ("execution.weightBytes", 457, "invalid-package"),
        ("execution.modelId", "", "invalid-package"),
        ("execution.backends", [], "no-cpu-backend"),
        ("execution.backends.0.kind", "tpu", "invalid-package"),
        ("execution.backends.0.artifacts", [], "cpu-artifact-mismatch"),
        ("execution.backends.0.artifacts.0.bytes", 1, "cpu-artifact-mismatch"),
        ("execution.backends.0.artifacts.0.sha256", "0" * 64, "cpu-artifact-mismatch"),
        ("execution.policy.preference", ["gpu-x"], "invalid-package"),
        ("execution.compatibility.bytes", 1, "inline-file-size-mismatch"),
        ("execution.compatibility.sha256", "0" * 64, "inline-file-sha256-mismatch"),
        ("execution.datasetManifest.sha256", "0" * 64, "inline-file-sha256-mismatch"),
        ("inlineJson.compatibility\\.json", ..., "inline-file-missing"),
        ("inlineJson.extra.json", {}, "inline-file-undescribed"),
    ],
)
def test_package_refusals(path: str, value: Any, reason: str) -> None:
    if path.startswith("inlineJson."):
        obj = package()
        name = path[len("inlineJson."):].replace("\\", "")
        if value is ...:
            del obj["inlineJson"][name]
        else:
            obj["inlineJson"][name] = value
    else:
        obj = mutate(path, value)
    assert reason_of(parse_package, obj) == reason


def test_inline_file_must_be_written_as_javascript_would() -> None:
    # The same value but a descriptor of compact JSON (no indent) does not match.
    import hashlib
    import json

    obj = package()
    compact = json.dumps(obj["inlineJson"]["compatibility.json"]).encode() + b"\n"
    obj["execution"]["compatibility"].update(bytes=len(compact), sha256=hashlib.sha256(compact).hexdigest())
    assert reason_of(parse_package, obj) == "inline-file-size-mismatch"


def test_compatibility_names_same_model_and_size() -> None:
    for key, value in (("identity", {"modelId": "other"}), ("weightBytes", 460), ("weightCount", 115), ("identity", ...)):
        obj = package()
        if value is ...:
            del obj["inlineJson"]["compatibility.json"][key]
        else:
            obj["inlineJson"]["compatibility.json"][key] = value
        assert reason_of(parse_package, refresh_descriptors(obj)) == "compatibility-mismatch", key


def test_inputs_none_means_empty_dataset_manifest() -> None:
    obj = package()
    obj["inlineJson"]["dataset-manifest.json"] = chunks()
    assert reason_of(parse_package, refresh_descriptors(obj)) == "dataset-not-empty"
    # A dataset package (no workSource) carries its chunks.
    p = parse_package(package(experience=False, chunks=chunks()))
    assert len(p.dataset_manifest.entries) == 2 and not p.is_experience


def test_gpu_backend_needs_shader_archive() -> None:
    p = parse_package(package(gpu=True))
    assert p.shader_archive is not None and p.gpu_usable
    obj = package(gpu=True)
    del obj["execution"]["backends"][1]["shaderArchive"]
    assert reason_of(parse_package, obj) == "gpu-backend-without-shader-archive"
    # An archive on execution serves too.
    obj["execution"]["shaderArchive"] = {"fileName": "model.wgsl", "bytes": len(WGSL), "sha256": sha(WGSL)}
    assert parse_package(obj).shader_archive is not None
    # Dataset packages may list a GPU backend and train over their chunks on it (docs/gpu.md).
    assert parse_package(package(experience=False, gpu=True)).gpu_usable
    assert not parse_package(package(experience=False)).gpu_usable


def test_package_file_names_are_unique() -> None:
    aux = package_aux()
    aux[0]["fileName"] = "model.wasm"
    assert reason_of(parse_package, package(aux=aux)) == "duplicate-file-name"


# --------------------------------------------------------------------------- package: selected files


def test_selection_ok() -> None:
    p = parse_package(package(aux=package_aux(), gpu=True))
    sel = check_selection(p, "model.wasm", WASM, {"reward.bin": AUX_FILE}, None, {"model.wgsl": WGSL})
    assert sel.gpu and sel.auxiliary_files == {"reward": "reward.bin"} and sel.chunk_files == {}
    sel = check_selection(p, "model.wasm", file_facts("model.wasm", WASM), {"reward.bin": file_facts("reward.bin", AUX_FILE)})
    assert not sel.gpu
    d = parse_package(package(experience=False, chunks=chunks()))
    sel = check_selection(d, "model.wasm", WASM, CHUNK_DATA, validation_name="validation.bin")
    assert sel.chunk_files == {"chunk-001": "training-001.bin", "chunk-002": "training-002.bin"}


def test_selection_refusals() -> None:
    p = parse_package(package(aux=package_aux(), gpu=True))
    files = {"reward.bin": AUX_FILE}
    assert reason_of(check_selection, p, "other.wasm", WASM, files) == "wasm-name-mismatch"
    assert reason_of(check_selection, p, "model.wasm", WASM + b"x", files) == "wasm-size-mismatch"
    assert reason_of(check_selection, p, "model.wasm", WASM[:-1] + b"y", files) == "wasm-sha256-mismatch"
    assert reason_of(check_selection, p, "model.wasm", WASM, {}) == "missing-file"
    assert reason_of(check_selection, p, "model.wasm", WASM, {**files, "x.bin": b"1"}) == "unexpected-file"
    assert reason_of(check_selection, p, "model.wasm", WASM, {"reward.bin": AUX_FILE[:-4]}) == "file-size-mismatch"
    assert reason_of(check_selection, p, "model.wasm", WASM, {"reward.bin": AUX_FILE[::-1]}) == "file-sha256-mismatch"
    assert reason_of(check_selection, p, "model.wasm", WASM, files, "validation.bin") == "validation-not-allowed"
    assert reason_of(check_selection, p, "model.wasm", WASM, files, None, {"other.wgsl": WGSL}) == "not-shader-archive"
    assert reason_of(check_selection, p, "model.wasm", WASM, files, None, {"model.wgsl": WGSL + b" "}) == "not-shader-archive"
    no_gpu = parse_package(package(aux=package_aux()))
    assert reason_of(check_selection, no_gpu, "model.wasm", WASM, files, None, {"model.wgsl": WGSL}) == "not-shader-archive"
    d = parse_package(package(experience=False, chunks=chunks(), gpu=True))
    assert check_selection(d, "model.wasm", WASM, CHUNK_DATA, None, {"model.wgsl": WGSL}).gpu


# --------------------------------------------------------------------------- package: after loading the module


def test_loaded_model_checks() -> None:
    p = parse_package(package(aux=package_aux()))
    info = ModelInfo.from_json(experience_info(info_aux()))
    check_loaded_model(p, info, WEIGHT_BYTES)
    assert reason_of(check_loaded_model, p, info, WEIGHT_BYTES + 4) == "weight-size-mismatch"
    other = ModelInfo.from_json({**experience_info(info_aux()), "id": "other"})
    assert reason_of(check_loaded_model, p, other, WEIGHT_BYTES) == "model-id-mismatch"
    ws = experience_info(info_aux())
    ws["workSource"]["evaluationUnits"] = 16
    assert reason_of(check_loaded_model, p, ModelInfo.from_json(ws), WEIGHT_BYTES) == "work-source-mismatch"
    assert reason_of(check_loaded_model, p, ModelInfo.from_json(experience_info()), WEIGHT_BYTES) == "auxiliary-weights-mismatch"
    # A dataset package whose module turns out to be an experience model.
    d = parse_package(package(experience=False, chunks=chunks(), model_id="cartpole-reinforce"))
    assert reason_of(check_loaded_model, d, ModelInfo.from_json(experience_info()), WEIGHT_BYTES) == "work-source-mismatch"


def test_package_snapshot_slot_size() -> None:
    aux = package_aux()
    aux[2]["bytes"] = WEIGHT_BYTES + 4
    assert reason_of(parse_package, package(aux=aux)) == "auxiliary-size-mismatch"


def test_loaded_model_snapshot_slot_size() -> None:
    aux = package_aux()
    for slot in aux[1:]:
        slot["bytes"] = WEIGHT_BYTES + 4
    obj = package(aux=aux)
    obj["execution"]["weightBytes"] = WEIGHT_BYTES + 4
    obj["inlineJson"]["compatibility.json"].update(weightBytes=WEIGHT_BYTES + 4, weightCount=WEIGHT_BYTES // 4 + 1)
    p = parse_package(refresh_descriptors(obj))
    info_slots = [{k: v for k, v in s.items() if k != "fileName"} for s in aux]
    info = ModelInfo.from_json(experience_info(info_slots))
    # The slots match the package, so the module's real weight size is what differs.
    assert reason_of(check_loaded_model, p, info, WEIGHT_BYTES) == "weight-size-mismatch"
    check_loaded_model(p, info, WEIGHT_BYTES + 4)


def test_loaded_dataset_model_checks_chunks() -> None:
    info_json = dataset_info()
    info_json["id"] = "cartpole-reinforce"
    del info_json["aggregation"]
    info = ModelInfo.from_json(info_json)
    p = parse_package(package(experience=False, chunks=chunks()))
    check_loaded_model(p, info, WEIGHT_BYTES)
    bad = chunks()
    bad[0]["format"] = "csv"
    p = parse_package(package(experience=False, chunks=bad))
    assert reason_of(check_loaded_model, p, info, WEIGHT_BYTES) == "unknown-format"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 2**40) | st.floats() | st.text(max_size=6),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=10), c, max_size=3),
    max_leaves=8,
)
package_paths = st.sampled_from(
    ["schema", "hostRuntime", "wasm", "wasm.bytes", "workSource", "auxiliaryWeights", "execution", "execution.modelId",
     "execution.weightBytes", "execution.backends", "execution.backends.0", "execution.backends.0.artifacts",
     "execution.policy", "execution.compatibility", "execution.datasetManifest", "inlineJson",
     "inlineJson.compatibility.json", "inlineJson.dataset-manifest.json"]
)


@settings(max_examples=500, deadline=None)
@given(package_paths, json_values, st.booleans())
def test_fuzz_package_only_manifest_errors(path: str, value: Any, refresh: bool) -> None:
    obj = package(aux=package_aux(), gpu=True)
    if path.startswith("inlineJson."):
        obj["inlineJson"][path[len("inlineJson."):]] = value
        if refresh:
            try:
                refresh_descriptors(obj)
            except Exception:
                return
    else:
        try:
            obj = mutate(path, value, obj)
        except (KeyError, TypeError, IndexError, ValueError):
            return
    try:
        p = parse_manifest_file(obj)
    except ManifestError as exc:
        assert is_listed(exc.reason)
        return
    try:
        check_selection(p, "model.wasm", WASM, {"reward.bin": AUX_FILE}, None, {"model.wgsl": WGSL})
    except ManifestError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(["id", "fileName", "bytes", "sha256", "format", "exampleCount"]), json_values), max_size=3) | json_values)
def test_fuzz_dataset_manifest_only_manifest_errors(obj: Any) -> None:
    try:
        parse_dataset_manifest(obj)
    except ManifestError as exc:
        assert is_listed(exc.reason)



def is_listed(reason: Any) -> bool:
    """A plain string that one of the two reason catalogs lists."""
    return type(reason) is str and reason in {r.value for r in (*ManifestReason, *ModelInfoReason)}


def test_recorded_auxiliary_files() -> None:
    p = parse_package(package(aux=package_aux()))
    check_recorded_auxiliary({"reward": sha(AUX_FILE)}, p.auxiliary_weights)
    assert reason_of(check_recorded_auxiliary, {"reward": "0" * 64}, p.auxiliary_weights) == "auxiliary-files-differ"
    assert reason_of(check_recorded_auxiliary, {}, p.auxiliary_weights) == "auxiliary-files-differ"
    assert reason_of(check_recorded_auxiliary, {"reward": sha(AUX_FILE), "x": "0" * 64}, p.auxiliary_weights) == "auxiliary-files-differ"
    check_recorded_auxiliary({}, parse_package(package()).auxiliary_weights)
