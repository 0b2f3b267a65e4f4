"""weei-device-program-v1 parsing: every bound of an untrusted program (weei.gpu.program)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from weei.gpu import DeviceLimits, GpuError, pack_archive, parse_archive, parse_program
from weei.gpu.program import (MAX_STEPS, MAX_WORKGROUPS_PER_DISPATCH, MAX_WORKGROUPS_PER_STEP, Clear, Copy, Dispatch,
                              check_upload)
from weei.runtime import ModelRuntime, WasmtimeEngine

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "app" / "static" / "models" / "digits-mlp"
ARCHIVE = parse_archive((DIGITS / "model.wgsl.json").read_bytes())
MiB = 1 << 20


def _program() -> dict[str, Any]:
    return {
        "format": "weei-device-program-v1",
        "buffers": [
            {"id": "w", "bytes": 16, "init": "weights"},
            {"id": "g", "bytes": 16, "init": "zeros"},
            {"id": "m", "bytes": 16, "init": "zeros"},
            {"id": "v", "bytes": 16, "init": "zeros"},
            {"id": "step", "bytes": 32, "init": "batch"},
        ],
        "pipelines": [{"id": "adam", "module": "optimizer.wgsl", "entryPoint": "adam", "constants": {"N": 4}}],
        "steps": [
            {"op": "dispatch", "pipeline": "adam", "workgroups": [1, 1, 1],
             "bindings": [{"binding": k, "buffer": b} for k, b in enumerate(["w", "g", "m", "v", "step"])]},
            {"op": "copy", "from": "w", "fromOffset": 0, "to": "g", "toOffset": 4, "bytes": 12},
            {"op": "clear", "buffer": "m", "offset": 8, "bytes": 8},
        ],
        "stepReadback": [],
        "finalReadback": [{"buffer": "w", "offset": 0, "bytes": 16}],
    }


def _parse(doc: Any, **kw: Any):
    args = {"archive": ARCHIVE, "limits": DeviceLimits(), "weight_bytes": 16, "budget_bytes": 64 * MiB,
            "estimated_working_bytes": 16 * MiB, **kw}
    return parse_program(doc, **args)


def _refused(doc: Any, **kw: Any) -> GpuError:
    with pytest.raises(GpuError) as info:
        _parse(doc, **kw)
    return info.value


def test_a_valid_program_becomes_frozen_objects() -> None:
    program = _parse(_program())
    assert [b.id for b in program.buffers] == ["w", "g", "m", "v", "step"]
    assert program.pipelines[0].constants == (("N", 4),)
    assert isinstance(program.steps[0], Dispatch) and program.steps[0].workgroups == (1, 1, 1)
    assert program.steps[1] == Copy("w", 0, "g", 4, 12)
    assert program.steps[2] == Clear("m", 8, 8)
    assert program.total_bytes == 16 * 4 + 32 + 16
    with pytest.raises(AttributeError):
        program.total_bytes = 0  # type: ignore[misc]


def _edit(path: list[Any], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(_program())
    target = doc
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return doc


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (["format"], "weei-device-program-v2"),
        (["extra"], 1),
        (["buffers"], []),
        (["buffers", 1, "id"], "w"),
        (["buffers", 1, "id"], "a b"),
        (["buffers", 1, "bytes"], 6),
        (["buffers", 1, "bytes"], 0),
        (["buffers", 1, "bytes"], True),
        (["buffers", 1, "bytes"], float("nan")),
        (["buffers", 1, "bytes"], 1 << 40),
        (["buffers", 1, "init"], "random"),
        (["buffers", 0, "bytes"], 32),
        (["pipelines", 0, "constants"], {"N": float("inf")}),
        (["pipelines", 0, "constants"], {"N": True}),
        (["pipelines", 0, "constants"], {"1N": 4}),
        (["pipelines", 0, "id"], KeyError),
        (["steps"], []),
        (["steps", 0, "op"], "launch"),
        (["steps", 0, "pipeline"], "nope"),
        (["steps", 0, "workgroups"], [1, 1]),
        (["steps", 0, "workgroups"], [0, 1, 1]),
        (["steps", 0, "workgroups"], [65536, 1, 1]),
        (["steps", 0, "bindings"], []),
        (["steps", 0, "bindings", 1, "binding"], 0),
        (["steps", 0, "bindings", 1, "buffer"], "w"),
        (["steps", 0, "bindings", 1, "buffer"], "ghost"),
        (["steps", 0, "bindings", 1, "binding"], 99),
        (["steps", 1, "to"], "w"),
        (["steps", 1, "toOffset"], 8),
        (["steps", 1, "fromOffset"], 2),
        (["steps", 1, "bytes"], 20),
        (["steps", 2, "offset"], 12),
        (["finalReadback"], []),
        (["finalReadback", 0, "bytes"], 20),
        (["finalReadback", 0, "offset"], -4),
        (["stepReadback"], [{"buffer": "w", "offset": 0, "bytes": 16}] * 17),
    ],
)
def test_refused_as_program_invalid(path: list[Any], value: Any) -> None:
    assert _refused(_edit(path, value)).reason == "program-invalid"


def test_refusals_by_name() -> None:
    assert _refused(_edit(["pipelines", 0, "module"], "conv.wgsl")).reason == "module-missing"
    assert _refused(_edit(["pipelines", 0, "entryPoint"], "rmsprop")).reason == "entry-point-missing"
    assert _refused(_program(), budget_bytes=100).reason == "program-over-budget"
    assert _refused(_program(), estimated_working_bytes=100).reason == "program-over-estimate"
    assert _refused(None).reason == "program-invalid"
    many = _edit(["steps"], [_program()["steps"][2]] * (MAX_STEPS + 1))
    assert _refused(many).reason == "program-invalid"
    # The device's limits bound bindings and workgroups.
    small = DeviceLimits(max_storage_buffers_per_shader_stage=4, max_compute_workgroups_per_dimension=8)
    assert _refused(_program(), limits=small).reason == "program-invalid"
    assert _refused(_edit(["buffers", 1, "bytes"], 64), limits=DeviceLimits(max_storage_buffer_binding_size=32)).reason == "program-invalid"


def test_endless_dispatches_are_refused_before_anything_is_submitted() -> None:
    """Issue 20 §3: a dispatch of 65535 x 65535 workgroups ran past 35 s under a 2 s limit (a
    submitted dispatch cannot be stopped). Its size is bounded where the program is parsed."""
    huge = _refused(_edit(["steps", 0, "workgroups"], [65535, 65535, 1]))
    assert huge.reason == "program-over-workgroups" and "65535 x 65535 x 1" in huge.message
    assert _refused(_edit(["steps", 0, "workgroups"], [1024, 1024, 1024])).reason == "program-over-workgroups"
    # Within one dimension, WebGPU's 65535 holds even where a native device reports more.
    wide = DeviceLimits(max_compute_workgroups_per_dimension=1 << 20)
    assert _refused(_edit(["steps", 0, "workgroups"], [65536, 1, 1]), limits=wide).reason == "program-invalid"
    # The largest dispatch passes; a step of many of them is bounded as a whole.
    top = [65535, MAX_WORKGROUPS_PER_DISPATCH // 65535, 1]
    assert _parse(_edit(["steps", 0, "workgroups"], top)).workgroups == 65535 * top[1]
    dispatch = {**_program()["steps"][0], "workgroups": top}
    fits = MAX_WORKGROUPS_PER_STEP // (65535 * top[1])
    assert _parse(_edit(["steps"], [dispatch] * fits)).workgroups <= MAX_WORKGROUPS_PER_STEP
    assert _refused(_edit(["steps"], [dispatch] * (fits + 1))).reason == "program-over-workgroups"


def test_uploads_go_only_into_batch_buffers() -> None:
    program = _parse(_program())
    assert check_upload(program, "step", 32).id == "step"
    for buffer_id, size in (("w", 16), ("ghost", 4), ("step", 36), ("step", 6)):
        with pytest.raises(GpuError) as info:
            check_upload(program, buffer_id, size)
        assert info.value.reason == "upload-invalid"


def test_limits_from_a_device_mapping() -> None:
    limits = DeviceLimits.from_mapping({"max-storage-buffers-per-shader-stage": 10, "max-buffer-size": "x"})
    assert limits.max_storage_buffers_per_shader_stage == 10
    assert limits.max_buffer_size == DeviceLimits().max_buffer_size


def test_digits_mlp_emits_a_program_that_parses() -> None:
    runtime = ModelRuntime.load((DIGITS / "model.wasm").read_bytes(), WasmtimeEngine())
    assert runtime.has_gpu_operations
    weights = runtime.create_initial_weights(3)
    runtime.load_model(weights)
    data = (DIGITS / "data" / "training-001.bin").read_bytes()
    begin, initial, unit_count = runtime.gpu_begin(data=data, format="weei-digits-v1", seed=5, settings={"batchSize": 16})
    assert initial == weights and unit_count is None
    program = _parse(begin["program"], weight_bytes=len(weights))
    assert {p.module for p in program.pipelines} == {"matmul.wgsl", "softmax_xent.wgsl", "reduce.wgsl", "optimizer.wgsl"}
    assert len(program.steps) == 9 and program.final_readback[0].buffer == "weights"
    assert program.total_bytes < 1 * MiB
    # The first gpuNext packs a batch of 16 examples into the batch buffers.
    result, uploads = runtime.gpu_next([])
    assert "done" not in result
    assert [(b, len(d)) for b, d in uploads] == [("x", 16 * 64 * 4), ("labels", 64), ("step", 32)]
    for buffer_id, data_bytes in uploads:
        check_upload(program, buffer_id, len(data_bytes))


def test_step_limit_stops_train_after_that_many_steps() -> None:
    from weei.core.errors import UsageError

    runtime = ModelRuntime.load((DIGITS / "model.wasm").read_bytes(), WasmtimeEngine())
    weights = runtime.create_initial_weights(3)
    data = (DIGITS / "data" / "training-001.bin").read_bytes()
    runtime.load_model(weights)
    one = runtime.train(data=data, format="weei-digits-v1", seed=5, settings={"batchSize": 16}, step_limit=1)
    assert one.optimizer_steps == 1 and one.unique_examples == 16
    runtime.load_model(weights)
    full = runtime.train(data=data, format="weei-digits-v1", seed=5, settings={"batchSize": 16}, step_limit=10**6)
    runtime.load_model(weights)
    plain = runtime.train(data=data, format="weei-digits-v1", seed=5, settings={"batchSize": 16})
    assert full == plain and plain.optimizer_steps > 1
    for bad in (0, True, -1, 1 << 32):
        runtime.load_model(weights)
        with pytest.raises(UsageError):
            runtime.train(data=data, format="weei-digits-v1", step_limit=bad)
