"""NativeKernel: ``c/kernel/aggregate.c`` compiled natively, called through ctypes.

The fast CPython path. The shared library is built on demand with clang
(the same source as the WebAssembly kernel, and ``-ffp-contract=off`` so no
FMA changes a bit) into ``build/kernel/``, named by a hash of the source and
flags so a stale build is never loaded. Buffers are passed as pointers into
the callers' memory (numpy views over bytes): nothing is copied on the way in.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from weei.core.aggregation.aggregate import Segment
from weei.core.floats import BytesLike
from weei.core.privacy.x25519 import KEY_BYTES, check_sizes
from weei.kernel import kernel_source
from weei.kernel.digests import sha256_many as _sha256_many
from weei.kernel.numpy_kernel import F32, as_f32

__all__ = ["NATIVE_FLAGS", "build_native", "NativeKernel"]

#: -march=native is fine: the library is built on, and for, this machine.
NATIVE_FLAGS: tuple[str, ...] = (
    "-O3",
    "-march=native",
    "-ffp-contract=off",
    "-fno-math-errno",
    "-shared",
    "-fPIC",
)

_c_p = ctypes.c_void_p
_u32 = ctypes.c_uint32
_f64 = ctypes.c_double


def _build_dir() -> Path:
    env = os.environ.get("WEEI_BUILD_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[4] / "build"


def build_native(source: Path | None = None, out_dir: Path | None = None, cc: str = "clang") -> Path:
    """Compile the kernel to a shared library unless an identical build exists.

    Returns the library path. Raises RuntimeError if clang is missing or fails.
    """
    src = source or kernel_source("aggregate")
    text = src.read_bytes()
    digest = hashlib.sha256(text + " ".join(NATIVE_FLAGS).encode()).hexdigest()[:16]
    out_dir = out_dir or _build_dir() / "kernel"
    lib = out_dir / f"{src.stem}-native-{digest}.so"
    if lib.is_file():
        return lib
    if shutil.which(cc) is None:
        raise RuntimeError(f"{cc} not found: cannot build the native aggregation kernel")
    out_dir.mkdir(parents=True, exist_ok=True)
    # Build to a temporary name and rename, so concurrent builds never load a
    # half-written library.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        proc = subprocess.run([cc, *NATIVE_FLAGS, "-o", tmp, str(src)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"building {src} failed:\n{proc.stderr}")
        os.replace(tmp, lib)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return lib


def _ptr(a: npt.NDArray[np.float32]) -> int:
    return int(a.ctypes.data)


def _segments(segments: Sequence[Segment]) -> tuple[ctypes.Array[ctypes.c_uint32], int]:
    flat = [i for seg in segments for i in seg]
    return (ctypes.c_uint32 * max(1, len(flat)))(*flat), len(segments)


class NativeKernel:
    """The C kernel through ctypes (see the module docstring)."""

    def __init__(self, library: Path | None = None) -> None:
        """Loads ``library`` or builds the kernel first. Raises RuntimeError
        or OSError if it cannot be built or loaded."""
        lib = ctypes.CDLL(str(library or build_native()))
        lib.weei_average.argtypes = [_c_p, _c_p, _u32, _u32, _c_p]
        lib.weei_average.restype = None
        lib.weei_fedavgm.argtypes = [_c_p, _c_p, _c_p, _c_p, _c_p, _u32, _c_p]
        lib.weei_fedavgm.restype = None
        lib.weei_fedadam.argtypes = [_c_p, _c_p, _c_p, _c_p, _c_p, _c_p, _u32, _c_p]
        lib.weei_fedadam.restype = None
        lib.weei_first_non_finite.argtypes = [_c_p, _u32]
        lib.weei_first_non_finite.restype = ctypes.c_int32
        lib.weei_delta_sq_norm.argtypes = [_c_p, _c_p, _u32, _c_p]
        lib.weei_delta_sq_norm.restype = None
        lib.weei_scale_delta.argtypes = [_c_p, _c_p, _u32, _c_p, _c_p]
        lib.weei_scale_delta.restype = None
        lib.weei_trimmed_mean.argtypes = [_c_p, _u32, _u32, _u32, _c_p, _c_p]
        lib.weei_trimmed_mean.restype = None
        lib.weei_trimmed_scratch.argtypes = [_u32]
        lib.weei_trimmed_scratch.restype = _u32
        lib.weei_quantize.argtypes = [_c_p, _c_p, _c_p, _u32, _u32, _u32, _c_p, _c_p]
        lib.weei_quantize.restype = None
        lib.weei_dequantize.argtypes = [_c_p, _c_p, _c_p, _u32, _u32, _u32, _c_p]
        lib.weei_dequantize.restype = None
        lib.weei_x25519.argtypes = [_c_p, ctypes.c_char_p, ctypes.c_char_p]
        lib.weei_x25519.restype = None
        self._lib = lib

    @staticmethod
    def _check_size(n: int) -> None:
        if n >= 2**31:
            raise ValueError("the kernel handles at most 2**31 - 1 elements per buffer")

    def average_into(
        self,
        out: npt.NDArray[np.float32],
        updates: Sequence[npt.NDArray[np.float32]],
        counts: Sequence[int],
    ) -> None:
        """Writes the weighted average of contiguous float32 arrays (canonical
        order, same length as ``out``) to ``out``, without copies."""
        n = out.shape[0]
        self._check_size(n)
        k = len(updates)
        ptrs = (ctypes.c_void_p * k)(*(_ptr(x) for x in updates))
        cs = (ctypes.c_double * k)(*(float(c) for c in counts))
        self._lib.weei_average(ptrs, cs, k, n, _ptr(out))

    def weighted_average(self, updates: Sequence[BytesLike], counts: Sequence[int]) -> bytes:
        """See ``AggregationKernel.weighted_average``."""
        xs = [np.ascontiguousarray(as_f32(u)) for u in updates]
        out = np.empty(xs[0].shape[0], F32)
        self.average_into(out, xs, counts)
        return out.tobytes()

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
        s, a = np.ascontiguousarray(as_f32(start)), np.ascontiguousarray(as_f32(average))
        self._check_size(s.shape[0])
        out, v = a.copy(), as_f32(velocity).copy()
        segs, n_segs = _segments(segments)
        params = (ctypes.c_double * 3)(float(lr), float(momentum), 1.0 if nesterov else 0.0)
        self._lib.weei_fedavgm(_ptr(s), _ptr(a), _ptr(v), _ptr(out), segs, n_segs, params)
        return out.tobytes(), v.tobytes()

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
        s, a = np.ascontiguousarray(as_f32(start)), np.ascontiguousarray(as_f32(average))
        n = s.shape[0]
        self._check_size(n)
        out, mv = a.copy(), as_f32(moments).copy()
        m, v = mv[:n], mv[n:]
        b1, b2 = float(beta1), float(beta2)
        segs, n_segs = _segments(segments)
        params = (ctypes.c_double * 6)(float(lr), b1, 1.0 - b1, b2, 1.0 - b2, float(epsilon))
        self._lib.weei_fedadam(_ptr(s), _ptr(a), _ptr(m), _ptr(v), _ptr(out), segs, n_segs, params)
        return out.tobytes(), mv.tobytes()

    def delta_sq_norms(self, start: BytesLike, updates: Sequence[BytesLike]) -> list[float]:
        """See ``AggregationKernel.delta_sq_norms``."""
        s = np.ascontiguousarray(as_f32(start))
        self._check_size(s.shape[0])
        result = (ctypes.c_double * 1)()
        out: list[float] = []
        for update in updates:
            x = np.ascontiguousarray(as_f32(update))
            self._lib.weei_delta_sq_norm(_ptr(s), _ptr(x), s.shape[0], result)
            out.append(float(result[0]))
        return out

    def scale_delta(self, start: BytesLike, update: BytesLike, factor: float) -> bytes:
        """See ``AggregationKernel.scale_delta``."""
        s, x = np.ascontiguousarray(as_f32(start)), np.ascontiguousarray(as_f32(update))
        self._check_size(s.shape[0])
        out = np.empty(s.shape[0], F32)
        self._lib.weei_scale_delta(_ptr(s), _ptr(x), s.shape[0], (ctypes.c_double * 1)(float(factor)), _ptr(out))
        return out.tobytes()

    def trimmed_mean(self, updates: Sequence[BytesLike], trim: int) -> bytes:
        """See ``AggregationKernel.trimmed_mean``."""
        xs = [np.ascontiguousarray(as_f32(u)) for u in updates]
        n, k = xs[0].shape[0], len(xs)
        self._check_size(n)
        out = np.empty(n, F32)
        ptrs = (ctypes.c_void_p * k)(*(_ptr(x) for x in xs))
        scratch = ctypes.create_string_buffer(int(self._lib.weei_trimmed_scratch(k)))
        self._lib.weei_trimmed_mean(ptrs, k, n, trim, scratch, _ptr(out))
        return out.tobytes()

    def quantize(self, start: BytesLike, trained: BytesLike, residual: BytesLike, block: int,
                 bits: int) -> tuple[bytes, bytes, bytes]:
        """See ``AggregationKernel.quantize``."""
        s, x = np.ascontiguousarray(as_f32(start)), np.ascontiguousarray(as_f32(trained))
        n = s.shape[0]
        self._check_size(n)
        e = as_f32(residual).copy()
        scales = np.empty(-(-n // block), F32)
        codes = np.empty(n if bits == 8 else (n + 1) // 2, np.uint8)
        self._lib.weei_quantize(_ptr(s), _ptr(x), _ptr(e), n, block, bits, _ptr(scales), int(codes.ctypes.data))
        return scales.tobytes(), codes.tobytes(), e.tobytes()

    def dequantize(self, start: BytesLike, scales: BytesLike, codes: BytesLike, block: int, bits: int) -> memoryview:
        """See ``AggregationKernel.dequantize``: a view of the array C wrote, not a copy (a fresh 16 MB copy cost
        more than the dequantization: its pages fault in one by one; numpy's large arrays ask for huge pages)."""
        s = np.ascontiguousarray(as_f32(start))
        n = s.shape[0]
        self._check_size(n)
        sc = np.ascontiguousarray(as_f32(scales))
        c = np.ascontiguousarray(np.frombuffer(codes, np.uint8))
        out = np.empty(n, F32)
        self._lib.weei_dequantize(_ptr(s), _ptr(sc), int(c.ctypes.data), n, block, bits, _ptr(out))
        return memoryview(out).cast("B")

    def first_non_finite(self, data: BytesLike) -> int:
        """See ``AggregationKernel.first_non_finite``."""
        x = np.ascontiguousarray(as_f32(data))
        self._check_size(x.shape[0])
        return int(self._lib.weei_first_non_finite(_ptr(x), x.shape[0]))

    def sha256_many(self, buffers: Sequence[BytesLike]) -> list[str]:
        """See ``weei.core.job.round_rules.Kernel.sha256_many``: on every core (weei.kernel.digests)."""
        return _sha256_many(buffers)

    def x25519(self, k: bytes, u: bytes) -> bytes:
        """See ``weei.core.job.round_rules.Kernel.x25519``."""
        check_sizes(k, u)
        out = ctypes.create_string_buffer(KEY_BYTES)
        self._lib.weei_x25519(out, bytes(k), bytes(u))
        return out.raw
