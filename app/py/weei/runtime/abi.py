"""``ModelRuntime``: the one host of Weei WASM ABI 1 (see docs/abi.md).

Theory of operation
-------------------
``ModelRuntime.load`` checks the module's imports and exports before it
instantiates anything, so a module that imports more than
``weei.onProgress`` never runs. Every operation then follows one path,
``_operation``:

1. each input region (chunk, weights, auxiliary slot) is ``alloc``-ed and
   written in one bulk copy; the input JSON (compact, UTF-8) likewise;
2. the export is called; ``weei.onProgress`` reports arriving meanwhile are
   parsed into :class:`TrainProgress` and handed to ``on_progress``: the first at
   once, then at most one per 20 ms, and the newest one left when the export
   returns (``progress_reports.py``: parsing every batch's report cost a
   third of a training call); a malformed report is recorded in
   ``progress_rejections`` and skipped: progress is informational and must
   never fail training;
3. the result JSON and any output region are copied out at once (they are
   only valid until the next call into the module);
4. every region the host allocated is freed, on success and on failure.

Failures of the module are ``ModelError`` with a reason code, the message
starting with the operation's name. A trap (or an exception escaping the
``on_progress`` callback, which unwinds the module mid-operation) leaves the
instance in an unknown state, so the runtime then refuses further calls
('instance-broken'): load the module again. An engine's interruption
(:class:`~weei.runtime.engine.Interrupted`) is a ``ModelError`` whose reason
is the interruption's (``cancelled``), and breaks the instance the same way.
Misuse by our caller (train without a fresh ``load_model``, a seed outside
u64, ...) is ``UsageError``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from weei.core.errors import ModelError, UsageError, ModelReason, UsageReason
from weei.core.limits import MAX_FILE_BYTES
from weei.runtime.sandbox import check_module_memory

from .engine import CompileError, DeadlineExceeded, Engine, EngineError, Instance, InstantiateError, Interrupted
from .progress_reports import ProgressReports
from .results import EvalResult, TrainProgress, TrainResult, field_count, field_metrics, parse_result_json

__all__ = ["ABI_VERSION", "OPERATIONS", "REQUIRED_EXPORTS", "ProgressCallback", "ModelRuntime"]


ABI_VERSION = 1

OPERATIONS: tuple[str, ...] = ("getModelInfo", "createInitialWeights", "loadModel", "loadAuxiliary",
                               "describeChunk", "train", "evaluate")
"""The operations every ABI-1 module exports (``gpu*`` are optional)."""

REQUIRED_EXPORTS: tuple[str, ...] = ("memory", "alloc", "free", "resultLength", *OPERATIONS)

_OPTIONAL_OPERATIONS = ("gpuBegin", "gpuNext", "gpuEnd")
_I32 = "i32"
_OP_SIGNATURE = ((_I32, _I32), (_I32,))
_SIGNATURES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "alloc": ((_I32,), (_I32,)),
    "free": ((_I32,), ()),
    "resultLength": ((), (_I32,)),
    **{op: _OP_SIGNATURE for op in OPERATIONS + _OPTIONAL_OPERATIONS},
}
_PROGRESS_IMPORT = ("weei", "onProgress")
_U64_LIMIT = 1 << 64
_U32_LIMIT = 1 << 32
_MAX_JSON_BYTES = 1 << 20  # a result or progress JSON: metrics and counts, never weights
_MAX_REGION_BYTES = MAX_FILE_BYTES  # a region the module hands back (weights): the checkpoint limit

ProgressCallback = Callable[[TrainProgress], None]
Buffer = bytes | bytearray | memoryview


def _u32(value: int | None, what: str) -> int:
    # Engines hand back i32 results as signed ints (JS does too); pointers
    # and lengths are unsigned.
    if not isinstance(value, int):
        raise ModelError(ModelReason.INVALID_RESULT, f"{what} returned {value!r}, expected an i32")
    return value & 0xFFFFFFFF


def _i32(value: int) -> int:
    return value - _U32_LIMIT if value >= 1 << 31 else value


def _as_bytes_view(name: str, data: Any) -> memoryview:
    try:
        view = memoryview(data).cast("B")
    except TypeError as exc:
        raise UsageError(UsageReason.INVALID_ARGUMENT, f"{name} must be contiguous bytes ({exc})") from None
    if view.nbytes >= _U32_LIMIT:
        raise UsageError(UsageReason.INVALID_ARGUMENT, f"{name} is {view.nbytes} bytes, over wasm32's 4 GiB")
    return view


def _check_seed(name: str, seed: Any) -> str:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < _U64_LIMIT:
        raise UsageError(UsageReason.INVALID_ARGUMENT, f"{name} must be an unsigned 64-bit int, got {seed!r}")
    return str(seed)  # u64 travels as a decimal string: JSON numbers are doubles


class ModelRuntime:
    """A loaded ABI-1 model module. Create with :meth:`load`.

    Not thread-safe and not re-entrant (an ``on_progress`` callback may not
    call back into the runtime).
    """

    def __init__(self, instance: Instance, on_progress: ProgressCallback | None) -> None:
        """Internal: use :meth:`load`."""
        self._instance = instance
        self.on_progress: ProgressCallback | None = on_progress
        """Called with each valid :class:`TrainProgress` report; may be replaced between calls."""
        self.progress = ProgressReports()
        """Which progress reports are parsed (``interval_s``: 0 parses every one) and why some were skipped."""
        self._active_op: str | None = None
        self._broken: str | None = None
        self._info: dict[str, Any] | None = None
        self._weight_bytes: int | None = None
        self._loaded = False  # a loadModel since the last train
        self._gpu_exports = False  # the module exports gpuBegin, gpuNext and gpuEnd
        self._aux_loaded = False  # a loadAuxiliary since the last loadModel

    # -- loading -------------------------------------------------------------

    @classmethod
    def load(
        cls, wasm_bytes: bytes, engine: Engine, on_progress: ProgressCallback | None = None,
        *, memory_limit_bytes: int | None = None,
    ) -> ModelRuntime:
        """Compile, check and instantiate a model module.

        ``memory_limit_bytes`` (default: the engine's, if any) bounds the declared minimum memory.
        Raises ``ModelError``: 'invalid-module' (does not compile),
        'forbidden-import', 'missing-export', 'bad-export' (wrong kind or
        signature), 'memory-over-limit' (before instantiation),
        'instantiate-failed'.
        """
        try:
            module = engine.compile(bytes(wasm_bytes))
        except CompileError as exc:
            raise ModelError(ModelReason.INVALID_MODULE, f"load: not a valid WebAssembly module: {exc}") from None
        for imp in module.imports:
            if (imp.module, imp.name) != _PROGRESS_IMPORT or imp.kind != "func":
                raise ModelError(
                    ModelReason.FORBIDDEN_IMPORT,
                    f"load: the module imports {imp.kind} {imp.module}.{imp.name}; "
                    "only the function weei.onProgress is allowed",
                )
            if imp.signature is not None and imp.signature != ((_I32, _I32), ()):
                raise ModelError(
                    ModelReason.FORBIDDEN_IMPORT,
                    f"load: weei.onProgress is imported as {imp.signature}, expected (i32, i32) -> ()",
                )
        exports = {exp.name: exp for exp in module.exports}
        missing = [name for name in REQUIRED_EXPORTS if name not in exports]
        if missing:
            raise ModelError(ModelReason.MISSING_EXPORT, f"load: the module does not export {', '.join(missing)}")
        if exports["memory"].kind != "memory":
            raise ModelError(ModelReason.BAD_EXPORT, f"load: 'memory' is a {exports['memory'].kind}, not a memory")
        for name, expected in _SIGNATURES.items():
            exp = exports.get(name)
            if exp is None:
                continue
            if exp.kind != "func":
                raise ModelError(ModelReason.BAD_EXPORT, f"load: {name!r} is a {exp.kind}, not a function")
            if exp.signature is not None and exp.signature != expected:
                raise ModelError(
                    ModelReason.BAD_EXPORT, f"load: {name!r} has signature {exp.signature}, expected {expected}"
                )
        limit = memory_limit_bytes if memory_limit_bytes is not None else getattr(engine, "memory_limit_bytes", None)
        if limit is not None:
            check_module_memory(wasm_bytes, limit)
        # The import must exist before the runtime does; it forwards to the
        # runtime once built (a report from a start function is dropped).
        owner: list[ModelRuntime] = []

        def hook(ptr: int, size: int) -> None:
            if owner:
                owner[0]._on_progress_import(ptr, size)

        try:
            instance = module.instantiate(hook)
        except InstantiateError as exc:
            raise ModelError(ModelReason.INSTANTIATE_FAILED, f"load: instantiation failed: {exc}") from None
        owner.append(cls(instance, on_progress))
        owner[0]._gpu_exports = all(op in exports for op in _OPTIONAL_OPERATIONS)
        return owner[0]

    # -- state ---------------------------------------------------------------

    @property
    def weight_bytes(self) -> int | None:
        """The weight size from the last createInitialWeights or loadModel."""
        return self._weight_bytes

    @property
    def progress_rejections(self) -> tuple[str, ...]:
        """Why recent progress reports were skipped (newest last, at most 32)."""
        return tuple(self.progress.rejections)

    @property
    def has_gpu_operations(self) -> bool:
        """The module exports gpuBegin, gpuNext and gpuEnd (docs/gpu.md)."""
        return self._gpu_exports

    def memory_size(self) -> int:
        """The instance's linear memory in bytes; it only grows, so after calls it is their peak."""
        return self._instance.memory_size()

    @property
    def broken(self) -> str | None:
        """Why the instance is unusable (after a trap), else ``None``."""
        return self._broken

    # -- operations ------------------------------------------------------------

    def model_info(self) -> dict[str, Any]:
        """The module's ModelInfo as raw JSON (a fresh copy; fetched once).

        Raises ``ModelError`` ('unsupported-abi' when abiVersion is not 1).
        """
        if self._info is None:
            info, _ = self._operation("getModelInfo", {})
            version = info.get("abiVersion")
            # `type(...) is int`: JSON true would otherwise compare equal to 1.
            if type(version) is not int or version != ABI_VERSION:
                raise ModelError(
                    ModelReason.UNSUPPORTED_ABI,
                    f"getModelInfo: abiVersion is {version!r}, this host speaks {ABI_VERSION}",
                )
            self._info = info
        return copy.deepcopy(self._info)

    def create_initial_weights(self, seed: int) -> bytes:
        """Initial weights for ``seed`` (u64); also fixes the weight size.

        Raises ``ModelError``, ``UsageError`` ('invalid-argument').
        """
        seed_text = _check_seed("seed", seed)
        _, weights = self._operation("createInitialWeights", {"seed": seed_text}, output="weights")
        assert weights is not None
        if len(weights) == 0 or len(weights) % 4:
            raise ModelError(
                ModelReason.INVALID_RESULT,
                f"createInitialWeights: {len(weights)} bytes is not a non-empty float32 array",
            )
        self._weight_bytes = len(weights)
        return weights

    def load_model(self, weights: Buffer) -> None:
        """Load ``weights`` as the starting point of the next train/evaluate.

        Raises ``ModelError`` (the module refused them), ``UsageError``.
        """
        view = _as_bytes_view("weights", weights)
        self._loaded = False
        self._aux_loaded = False
        result, _ = self._operation("loadModel", lambda r: {"weights": r[0]}, inputs=[view])
        self._check_ok("loadModel", result)
        self._weight_bytes = view.nbytes
        self._loaded = True

    def load_auxiliary(self, slots: Mapping[str, Buffer]) -> None:
        """Load auxiliary weights by slot id (after every :meth:`load_model`).

        Raises ``ModelError``, ``UsageError``.
        """
        ids = list(slots)
        if not all(isinstance(slot_id, str) for slot_id in ids):
            raise UsageError(UsageReason.INVALID_ARGUMENT, "auxiliary slot ids must be strings")
        views = [_as_bytes_view(f"slot {slot_id!r}", slots[slot_id]) for slot_id in ids]

        def payload(regions: list[dict[str, int]]) -> dict[str, Any]:
            return {"slots": [{"id": i, "weights": r} for i, r in zip(ids, regions, strict=True)]}

        self._aux_loaded = False
        result, _ = self._operation("loadAuxiliary", payload, inputs=views)
        self._check_ok("loadAuxiliary", result)
        self._aux_loaded = True

    def describe_chunk(self, format: str, data: Buffer) -> int:
        """The number of examples in a dataset file of ``format``.

        Raises ``ModelError`` (for example the bytes are not that format).
        """
        if not isinstance(format, str):
            raise UsageError(UsageReason.INVALID_ARGUMENT, f"format must be a string, got {format!r}")
        view = _as_bytes_view("data", data)
        result, _ = self._operation(
            "describeChunk", lambda r: {"format": format, "data": r[0]}, inputs=[view]
        )
        count = field_count("describeChunk", result, "exampleCount")
        assert count is not None
        return count

    def train(
        self,
        *,
        data: Buffer | None = None,
        format: str | None = None,
        experience: tuple[int, int, int] | None = None,
        seed: int = 0,
        settings: Mapping[str, Any] | None = None,
        step_limit: int | None = None,
    ) -> TrainResult:
        """Train from the last loaded weights on a chunk (``data`` + ``format``,
        shuffled by ``seed``) or on ``experience`` = (unit_start, unit_count, seed).
        ``step_limit`` stops after that many optimizer steps (the GPU admission
        gate's first step, docs/gpu.md).

        Needs a :meth:`load_model` before every call (and :meth:`load_auxiliary`
        when the model declares auxiliary weights). Raises ``ModelError``
        (including 'weight-size-mismatch' and 'non-finite-metric'),
        ``UsageError``.
        """
        payload, inputs, unit_count = self._train_input("train", data, format, experience, seed, settings, step_limit)
        result, weights = self._operation(
            "train", lambda r: self._with_data(payload, r), inputs=inputs, output="weights"
        )
        return self._train_result("train", result, weights, unit_count)

    # -- GPU backends (docs/gpu.md) ------------------------------------------------

    def gpu_begin(
        self,
        *,
        data: Buffer | None = None,
        format: str | None = None,
        experience: tuple[int, int, int] | None = None,
        seed: int = 0,
        settings: Mapping[str, Any] | None = None,
        step_limit: int | None = None,
    ) -> tuple[dict[str, Any], bytes, int | None]:
        """gpuBegin with train's input: (result JSON, its ``weights`` region,
        the experience unitCount or None for :meth:`gpu_end`)."""
        if not self._gpu_exports:
            raise UsageError(UsageReason.NO_GPU_OPERATIONS, "gpuBegin: the module does not export gpuBegin/gpuNext/gpuEnd")
        payload, inputs, unit_count = self._train_input("gpuBegin", data, format, experience, seed, settings, step_limit)
        result, weights = self._operation("gpuBegin", lambda r: self._with_data(payload, r), inputs=inputs, output="weights")
        assert weights is not None
        return result, weights, unit_count

    def gpu_next(self, readback: Sequence[Buffer]) -> tuple[dict[str, Any], list[tuple[str, bytes]]]:
        """gpuNext with the previous step's read-back regions: returns the
        result JSON and its ``batch`` uploads as (buffer id, bytes) copies."""
        views = [_as_bytes_view("readback", r) for r in readback]
        result, _ = self._operation("gpuNext", lambda r: {"readback": r}, inputs=views)
        batch = result.get("batch", [])
        if not isinstance(batch, list) or not all(isinstance(i, dict) and isinstance(i.get("buffer"), str) for i in batch):
            raise ModelError(ModelReason.INVALID_RESULT, "gpuNext: 'batch' must list {buffer, data} entries")
        # The regions stay valid until the next call into the module: copy them now.
        return result, [(i["buffer"], self._read_region("gpuNext", "data", i.get("data"))) for i in batch]

    def gpu_end(self, readback: Sequence[Buffer], unit_count: int | None) -> TrainResult:
        """gpuEnd with the final read-back regions; the result of a train."""
        views = [_as_bytes_view("readback", r) for r in readback]
        result, weights = self._operation("gpuEnd", lambda r: {"readback": r}, inputs=views, output="weights")
        return self._train_result("gpuEnd", result, weights, unit_count)

    def evaluate(
        self,
        *,
        data: Buffer | None = None,
        format: str | None = None,
        experience: tuple[int, int, int] | None = None,
    ) -> EvalResult:
        """Evaluate the loaded weights on a chunk or on experience units.

        Raises ``ModelError``, ``UsageError``.
        """
        self._require_loaded("evaluate")
        payload, inputs, _ = self._work_input("evaluate", data, format, experience)
        result, _ = self._operation(
            "evaluate", lambda r: self._with_data(payload, r), inputs=inputs
        )
        metrics = field_metrics("evaluate", result)
        examples = field_count("evaluate", result, "examples")
        assert examples is not None
        return EvalResult(metrics, examples)

    # -- helpers -------------------------------------------------------------------

    def _train_input(
        self,
        op: str,
        data: Buffer | None,
        format: str | None,
        experience: tuple[int, int, int] | None,
        seed: int,
        settings: Mapping[str, Any] | None,
        step_limit: int | None,
    ) -> tuple[dict[str, Any], list[memoryview], int | None]:
        self._require_loaded(op)
        payload, inputs, unit_count = self._work_input(op, data, format, experience)
        if experience is None:
            payload["seed"] = _check_seed("seed", seed)
        if settings is not None and not isinstance(settings, Mapping):
            raise UsageError(UsageReason.INVALID_ARGUMENT, f"{op}: settings must be a mapping, got {settings!r}")
        payload["settings"] = dict(settings) if settings is not None else {}
        if step_limit is not None:
            if isinstance(step_limit, bool) or not isinstance(step_limit, int) or not 1 <= step_limit < _U32_LIMIT:
                raise UsageError(UsageReason.INVALID_ARGUMENT, f"{op}: step_limit must be a positive int")
            payload["stepLimit"] = step_limit
        # Training leaves the module's weights changed: the next call needs a loadModel.
        self._loaded = False
        return payload, inputs, unit_count

    def _train_result(
        self, op: str, result: dict[str, Any], weights: bytes | None, unit_count: int | None
    ) -> TrainResult:
        assert weights is not None
        if len(weights) != self._weight_bytes:
            raise ModelError(
                ModelReason.WEIGHT_SIZE_MISMATCH,
                f"{op}: returned {len(weights)} bytes of weights, the model has {self._weight_bytes}",
            )
        metrics = field_metrics(op, result)
        unique = completed = None
        if unit_count is None:
            unique = field_count(op, result, "uniqueExamples")
        else:
            completed = field_count(op, result, "completedUnits")
            assert completed is not None
            if completed > unit_count:
                raise ModelError(
                    ModelReason.INVALID_RESULT, f"{op}: completedUnits {completed} exceeds unitCount {unit_count}"
                )
        steps = field_count(op, result, "optimizerSteps", required=False)
        return TrainResult(weights, metrics, unique, completed, steps)

    def _require_loaded(self, op: str) -> None:
        if not self._loaded:
            raise UsageError(UsageReason.MODEL_NOT_LOADED, f"{op}: call load_model first (each train needs a fresh one)")
        # The cached info, not model_info()'s deep copy of it: this runs before every train and evaluate.
        if not self._aux_loaded and (self._info or self.model_info()).get("auxiliaryWeights"):
            raise UsageError(
                UsageReason.AUXILIARY_NOT_LOADED,
                f"{op}: the model declares auxiliary weights; call load_auxiliary after load_model",
            )

    @staticmethod
    def _work_input(
        op: str, data: Buffer | None, format: str | None, experience: tuple[int, int, int] | None
    ) -> tuple[dict[str, Any], list[memoryview], int | None]:
        if (data is None) == (experience is None):
            raise UsageError(UsageReason.INVALID_ARGUMENT, f"{op}: pass exactly one of data or experience")
        if experience is None:
            if not isinstance(format, str):
                raise UsageError(UsageReason.INVALID_ARGUMENT, f"{op}: data needs a format string")
            return {"format": format}, [_as_bytes_view("data", data)], None
        if format is not None:
            raise UsageError(UsageReason.INVALID_ARGUMENT, f"{op}: format applies to data only")
        try:
            unit_start, unit_count, seed = experience
        except (TypeError, ValueError):
            raise UsageError(UsageReason.INVALID_ARGUMENT, f"{op}: experience is (unit_start, unit_count, seed)") from None
        for name, value in (("unit_start", unit_start), ("unit_count", unit_count)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UsageError(UsageReason.INVALID_ARGUMENT, f"{op}: {name} must be a non-negative int")
        exp = {"unitStart": unit_start, "unitCount": unit_count, "seed": _check_seed("seed", seed)}
        return {"experience": exp}, [], unit_count

    @staticmethod
    def _with_data(payload: dict[str, Any], regions: list[dict[str, int]]) -> dict[str, Any]:
        # "data" first so the input reads like the examples in docs/abi.md.
        return {"data": regions[0], **payload} if regions else payload

    @staticmethod
    def _check_ok(op: str, result: Mapping[str, Any]) -> None:
        if result.get("ok") is not True:
            raise ModelError(ModelReason.INVALID_RESULT, f"{op}: expected {{\"ok\": true}}, got {json.dumps(result)[:200]}")

    def _operation(
        self,
        op: str,
        payload: Mapping[str, Any] | Callable[[list[dict[str, int]]], Mapping[str, Any]],
        *,
        inputs: list[memoryview] | None = None,
        output: str | None = None,
    ) -> tuple[dict[str, Any], bytes | None]:
        """Run one operation (steps 1-4 above); return the parsed result and,
        when ``output`` names a region field, a copy of that region."""
        if self._broken is not None:
            raise ModelError(ModelReason.INSTANCE_BROKEN, f"{op}: the instance is unusable ({self._broken}); load it again")
        if self._active_op is not None:
            raise UsageError(UsageReason.REENTRANT_CALL, f"{op}: called while {self._active_op} runs")
        allocated: list[int] = []
        failed = False
        self._active_op = op
        self.progress.start()
        try:
            regions = [self._put(op, view, allocated) for view in inputs or []]
            body = payload(regions) if callable(payload) else payload
            try:
                text = json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise UsageError(UsageReason.INVALID_ARGUMENT, f"{op}: input is not JSON-serialisable: {exc}") from None
            request = self._put(op, memoryview(text.encode("utf-8")), allocated)
            ptr = _u32(self._call(op, op, request["ptr"], request["bytes"]), op)
            last = self.progress.flush()  # the newest report not parsed yet: normally the final one
            if last is not None and self.on_progress is not None:
                self.on_progress(last)  # the module has returned: raising here leaves it usable
            length = _u32(self._call(op, "resultLength"), f"{op}: resultLength")
            result = parse_result_json(op, self._read(op, "result", ptr, length))
            out: bytes | None = None
            if output is not None:
                out = self._read_region(op, output, result.get(output))
            return result, out
        except BaseException:
            # (_call and the progress import mark the instance broken when
            # the module itself was unwound.)
            failed = True
            raise
        finally:
            self._active_op = None
            self._free_all(op, allocated, failed)

    def _free_all(self, op: str, allocated: list[int], failed: bool) -> None:
        # After a trap the allocator's state is unknown: do not call into it.
        if self._broken is not None:
            return
        for region_ptr in allocated:
            try:
                self._call(op, "free", _i32(region_ptr))
            except ModelError:
                if failed:
                    return  # keep the original failure; the instance is marked broken
                raise

    def _call(self, op: str, export: str, *args: int) -> int | None:
        try:
            return self._instance.call(export, *args)
        except (DeadlineExceeded, Interrupted) as exc:
            # Stopped from outside or by its deadline: as unusable as after a trap, named by the reason.
            self._broken = f"{export} stopped ({exc.reason})"
            raise ModelError(ModelReason(exc.reason), f"{op}: {exc}") from None
        except EngineError as exc:
            self._broken = f"{export} trapped"
            raise ModelError(ModelReason.TRAP, f"{op}: the module trapped in {export}: {exc}") from None

    def _put(self, op: str, view: memoryview, allocated: list[int]) -> dict[str, int]:
        size = view.nbytes
        # alloc(0) may legitimately return 0; ask for one byte so an empty
        # region still has a real address.
        ptr = _u32(self._call(op, "alloc", _i32(max(size, 1))), f"{op}: alloc")
        if ptr == 0:
            raise ModelError(ModelReason.ALLOC_FAILED, f"{op}: alloc({size}) returned 0 (module out of memory)")
        allocated.append(ptr)
        memory = self._instance.memory_size()
        if ptr + size > memory:
            raise ModelError(ModelReason.REGION_OUT_OF_BOUNDS, f"{op}: alloc({size}) returned {ptr}, outside memory of {memory} bytes")
        self._instance.write(ptr, view)
        return {"ptr": ptr, "bytes": size}

    def _read(self, op: str, what: str, ptr: int, size: int) -> bytes:
        limit = _MAX_JSON_BYTES if what in ("result", "progress") else _MAX_REGION_BYTES
        if size > limit:  # refused before a byte is copied into the host
            raise ModelError(ModelReason.RESULT_TOO_LARGE, f"{op}: {what} of {size} bytes is over the {limit:,}-byte limit")
        memory = self._instance.memory_size()
        if ptr + size > memory or (ptr == 0 and size > 0):
            raise ModelError(ModelReason.REGION_OUT_OF_BOUNDS, f"{op}: {what} at {ptr}+{size} is outside memory of {memory} bytes")
        return self._instance.read(ptr, size)

    def _read_region(self, op: str, key: str, region: Any) -> bytes:
        if not isinstance(region, dict):
            raise ModelError(ModelReason.INVALID_RESULT, f"{op}: {key!r} is not a region {{ptr, bytes}}")
        ptr = field_count(op, region, "ptr")
        size = field_count(op, region, "bytes")
        assert ptr is not None and size is not None
        return self._read(op, repr(key), ptr, size)

    def _on_progress_import(self, ptr: int, size: int) -> None:
        # weei.onProgress, called from inside an export call; parsed only when due (progress_reports.py).
        op = self._active_op or "(no operation)"
        try:
            if self._active_op is None:
                raise ModelError(ModelReason.PROGRESS_INVALID, "reported outside an operation")
            raw = self._read(op, "progress", _u32(ptr, "onProgress"), _u32(size, "onProgress"))
        except ModelError as exc:
            self.progress.reject(op, exc)
            return
        progress = self.progress.report(op, raw)
        callback = self.on_progress
        if progress is not None and callback is not None:
            try:
                callback(progress)
            except BaseException as exc:
                # The exception unwinds the module mid-operation (this is how a
                # host aborts training); its state is unknown afterwards.
                self._broken = f"{op} aborted by on_progress ({type(exc).__name__})"
                raise
