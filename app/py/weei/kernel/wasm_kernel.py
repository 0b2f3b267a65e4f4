"""WasmKernel: the aggregation kernel as WebAssembly, over the runtime's Engine.

The browser aggregates with ``aggregate.wasm`` (compiled from
``c/kernel/aggregate.c`` with wasm32 SIMD) because no numpy exists there.
This class drives it through :class:`weei.runtime.engine.Instance` only
(i32 calls plus bulk ``read``/``write``), so the same code runs over
wasmtime in CPython (the default here) and over the browser's WebAssembly
in Pyodide. It needs neither numpy nor ctypes itself.

Every call copies its inputs into the module's memory (a bump region, reset
per call) and its outputs back out; :meth:`WasmKernel.stage_average` and
:meth:`WasmKernel.run_average` split copying from computing so the copy-in
cost can be measured on its own.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from weei.core.aggregation.aggregate import Segment
from weei.core.floats import BytesLike
from weei.core.links.relay import sequential_sha256
from weei.core.privacy.x25519 import KEY_BYTES, check_sizes
from weei.runtime.engine import Instance

__all__ = ["kernel_wasm_path", "load_kernel_wasm", "WasmKernel", "StagedAverage", "KERNEL_MEMORY_LIMIT"]

#: 65,536 pages of 64 KiB: all a wasm32 memory can address.
KERNEL_MEMORY_LIMIT = 1 << 32


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[4]


def kernel_wasm_path() -> Path:
    """Path of the committed ``app/static/kernel/aggregate.wasm``.

    build.py is the one place that compiles it (its flags matter for bit
    identity); ``build.py check`` and the build test keep it in step with the
    C source. Raises FileNotFoundError when it is missing.
    """
    path = _repo_root() / "app" / "static" / "kernel" / "aggregate.wasm"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run `python build.py wasm`")
    return path


def load_kernel_wasm() -> bytes:
    """The bytes of an up-to-date ``aggregate.wasm`` (see :func:`kernel_wasm_path`)."""
    return kernel_wasm_path().read_bytes()


def _i32(value: int) -> int:
    # The Engine protocol passes signed i32; pointers above 2 GiB wrap.
    return value - (1 << 32) if value >= (1 << 31) else value


def _nbytes(buf: BytesLike) -> int:
    # memoryview(...).nbytes is right for any buffer (len() of a numpy array
    # counts elements, not bytes).
    return buf.nbytes if isinstance(buf, memoryview) else memoryview(buf).nbytes


@dataclass(frozen=True)
class StagedAverage:
    """Inputs of a weighted average already placed in the module's memory."""

    n_updates: int
    n_elems: int
    ptrs_ptr: int
    counts_ptr: int
    out_ptr: int


class WasmKernel:
    """``AggregationKernel`` running ``aggregate.wasm`` on an Engine instance."""

    def __init__(self, instance: Instance | None = None) -> None:
        """Takes an instance of ``aggregate.wasm`` from any Engine; without
        one, compiles the kernel and instantiates it in wasmtime. Raises
        RuntimeError (no kernel) or an EngineError."""
        if instance is None:
            from weei.runtime.wasmtime_engine import WasmtimeEngine

            # Our own module, not a visitor's: it gets the whole wasm32 address space, not the sandbox's
            # 1 GiB cap for models (16 updates of 16M weights are 1 GiB of inputs alone).
            engine = WasmtimeEngine(memory_limit_bytes=KERNEL_MEMORY_LIMIT)
            instance = engine.compile(load_kernel_wasm()).instantiate(lambda _p, _n: None)
        self._inst = instance
        self._x25519_io: int | None = None  # the module's own 96 bytes for X25519 (weei_x25519_buffer)

    # ---------------------------------------------------------------- memory

    def _reset(self) -> None:
        self._inst.call("weei_reset")

    def _alloc(self, size: int) -> int:
        ptr = self._inst.call("weei_alloc", _i32(max(size, 1)))
        ptr = (ptr or 0) & 0xFFFFFFFF
        if ptr == 0:
            raise MemoryError(f"the wasm kernel cannot allocate {size} more bytes (4 GiB address space)")
        return ptr

    def _put(self, data: BytesLike) -> int:
        ptr = self._alloc(_nbytes(data))
        self._inst.write(ptr, data)
        return ptr

    def _call(self, name: str, *args: int) -> int | None:
        return self._inst.call(name, *(_i32(a) for a in args))

    # ---------------------------------------------------------------- FedAvg

    def stage_average(self, updates: Sequence[BytesLike], counts: Sequence[int]) -> StagedAverage:
        """Release earlier buffers, copy the updates (canonical order) and
        counts into memory and reserve the output. Raises MemoryError."""
        self._reset()
        n_bytes = _nbytes(updates[0])
        ptrs = [self._put(u) for u in updates]
        ptrs_ptr = self._put(struct.pack(f"<{len(ptrs)}I", *ptrs))
        counts_ptr = self._put(struct.pack(f"<{len(counts)}d", *(float(c) for c in counts)))
        out_ptr = self._alloc(n_bytes)
        return StagedAverage(len(ptrs), n_bytes // 4, ptrs_ptr, counts_ptr, out_ptr)

    def run_average(self, staged: StagedAverage) -> None:
        """Compute the average of staged inputs into ``staged.out_ptr``."""
        self._call("weei_average", staged.ptrs_ptr, staged.counts_ptr, staged.n_updates, staged.n_elems, staged.out_ptr)

    def read(self, ptr: int, size: int) -> bytes:
        """Copy ``size`` bytes out of the module's memory."""
        return self._inst.read(ptr, size)

    def weighted_average(self, updates: Sequence[BytesLike], counts: Sequence[int]) -> bytes:
        """See ``AggregationKernel.weighted_average``."""
        staged = self.stage_average(updates, counts)
        self.run_average(staged)
        return self.read(staged.out_ptr, staged.n_elems * 4)

    # ------------------------------------------------------ server optimizers

    def _stage_step(
        self, start: BytesLike, average: BytesLike, state: BytesLike, segments: Sequence[Segment], params: Sequence[float]
    ) -> tuple[int, int, int, int, int, int]:
        self._reset()
        s = self._put(start)
        a = self._put(average)
        st = self._put(state)
        out = self._put(average)  # elements outside the segments keep the average
        flat = [i for seg in segments for i in seg]
        segs = self._put(struct.pack(f"<{len(flat)}I", *flat))
        prm = self._put(struct.pack(f"<{len(params)}d", *params))
        return s, a, st, out, segs, prm

    def fedavgm(
        self,
        start: BytesLike,
        average: BytesLike,
        velocity: BytesLike,
        segments: Sequence[Segment],
        lr: float,
        momentum: float,
        nesterov: bool = False,
    ) -> tuple[bytes, bytes]:
        """See ``AggregationKernel.fedavgm``."""
        params = (float(lr), float(momentum), 1.0 if nesterov else 0.0)
        s, a, v, out, segs, prm = self._stage_step(start, average, velocity, segments, params)
        self._call("weei_fedavgm", s, a, v, out, segs, len(segments), prm)
        n = _nbytes(start)
        return self.read(out, n), self.read(v, n)

    def fedadam(
        self,
        start: BytesLike,
        average: BytesLike,
        moments: BytesLike,
        segments: Sequence[Segment],
        lr: float,
        beta1: float,
        beta2: float,
        epsilon: float,
    ) -> tuple[bytes, bytes]:
        """See ``AggregationKernel.fedadam``."""
        b1, b2 = float(beta1), float(beta2)
        params = (float(lr), b1, 1.0 - b1, b2, 1.0 - b2, float(epsilon))
        s, a, mv, out, segs, prm = self._stage_step(start, average, moments, segments, params)
        n = _nbytes(start)
        self._call("weei_fedadam", s, a, mv, mv + n, out, segs, len(segments), prm)
        return self.read(out, n), self.read(mv, 2 * n)

    # ---------------------------------------------------- robust aggregation

    def delta_sq_norms(self, start: BytesLike, updates: Sequence[BytesLike]) -> list[float]:
        """See ``AggregationKernel.delta_sq_norms``."""
        n = _nbytes(start)
        out: list[float] = []
        for update in updates:
            self._reset()
            s, x, res = self._put(start), self._put(update), self._alloc(8)
            self._call("weei_delta_sq_norm", s, x, n // 4, res)
            out.append(struct.unpack("<d", self.read(res, 8))[0])
        return out

    def scale_delta(self, start: BytesLike, update: BytesLike, factor: float) -> bytes:
        """See ``AggregationKernel.scale_delta``."""
        self._reset()
        n = _nbytes(start)
        s, x = self._put(start), self._put(update)
        prm, out = self._put(struct.pack("<d", float(factor))), self._alloc(n)
        self._call("weei_scale_delta", s, x, n // 4, prm, out)
        return self.read(out, n)

    def trimmed_mean(self, updates: Sequence[BytesLike], trim: int) -> bytes:
        """See ``AggregationKernel.trimmed_mean``."""
        self._reset()
        n = _nbytes(updates[0])
        ptrs = [self._put(u) for u in updates]
        ptrs_ptr = self._put(struct.pack(f"<{len(ptrs)}I", *ptrs))
        size = (self._call("weei_trimmed_scratch", len(ptrs)) or 0) & 0xFFFFFFFF
        scratch, out = self._alloc(size), self._alloc(n)
        self._call("weei_trimmed_mean", ptrs_ptr, len(ptrs), n // 4, trim, scratch, out)
        return self.read(out, n)

    # ---------------------------------------------------- compressed updates

    def quantize(self, start: BytesLike, trained: BytesLike, residual: BytesLike, block: int,
                 bits: int) -> tuple[bytes, bytes, bytes]:
        """See ``AggregationKernel.quantize``."""
        self._reset()
        n = _nbytes(start) // 4
        s, x, e = self._put(start), self._put(trained), self._put(residual)
        n_scales, n_codes = -(-n // block), n if bits == 8 else (n + 1) // 2
        scales, codes = self._alloc(4 * n_scales), self._alloc(n_codes)
        self._call("weei_quantize", s, x, e, n, block, bits, scales, codes)
        return self.read(scales, 4 * n_scales), self.read(codes, n_codes), self.read(e, 4 * n)

    def dequantize(self, start: BytesLike, scales: BytesLike, codes: BytesLike, block: int, bits: int) -> bytes:
        """See ``AggregationKernel.dequantize``."""
        self._reset()
        n = _nbytes(start) // 4
        s, sc, c, out = self._put(start), self._put(scales), self._put(codes), self._alloc(4 * n)
        self._call("weei_dequantize", s, sc, c, n, block, bits, out)
        return self.read(out, 4 * n)

    # ----------------------------------------------------------- finiteness

    def first_non_finite(self, data: BytesLike) -> int:
        """See ``AggregationKernel.first_non_finite``."""
        self._reset()
        ptr = self._put(data)
        result = self._call("weei_first_non_finite", ptr, _nbytes(data) // 4)
        return int(result if result is not None else -1)

    def sha256_many(self, buffers: Sequence[BytesLike]) -> list[str]:
        """See ``weei.core.job.round_rules.Kernel.sha256_many``: one after the other (Pyodide runs one thread;
        its hashlib is the page's, ~0.19 GB/s)."""
        return sequential_sha256(buffers)

    # ----------------------------------------------------------- X25519

    def x25519(self, k: bytes, u: bytes) -> bytes:
        """See ``weei.core.job.round_rules.Kernel.x25519``. Its buffer is the module's own, outside the region
        ``weei_alloc`` hands out, so it leaves staged inputs (``stage_average``) as they are."""
        check_sizes(k, u)
        if self._x25519_io is None:
            self._x25519_io = (self._call("weei_x25519_buffer") or 0) & 0xFFFFFFFF
        io = self._x25519_io
        self._inst.write(io, bytes(k) + bytes(u))
        self._call("weei_x25519", io + 2 * KEY_BYTES, io, io + KEY_BYTES)
        return self._inst.read(io + 2 * KEY_BYTES, KEY_BYTES)
