"""NumpyKernel: the oracle of the aggregation arithmetic, and a usable CPython path.

Follows the exact operation order of :mod:`weei.core.aggregation.aggregate` (module
docstring). Every float32 array is widened to float64 *before* any
arithmetic: under NumPy's promotion rules (NEP 50) ``float32_array * 0.9``
is computed in float32, which would silently change the bits.

Work is done in blocks of :data:`BLOCK` elements so temporaries stay in the
cache (a whole-array ``x.astype(float64)`` of 16M floats is a 128 MiB
temporary per update and runs at a fraction of memory speed).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from weei.core.aggregation.aggregate import Segment
from weei.core.floats import BytesLike
from weei.core.privacy.x25519 import x25519 as _x25519
from weei.kernel.digests import sha256_many as _sha256_many

__all__ = ["BLOCK", "LANES", "NumpyKernel", "as_f32"]

#: Elements per block: 64K float64 = 512 KiB per temporary, L2-sized.
BLOCK = 65536

#: Lanes of a delta's squared norm (c/kernel/aggregate.c, WEEI_LANES).
LANES = 8

F32 = np.dtype("<f4")
F64 = np.float64


def as_f32(buf: BytesLike | npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """A float32-le view of ``buf`` without copying (read-only for bytes)."""
    if isinstance(buf, np.ndarray):
        return buf.view(F32).reshape(-1)
    return np.frombuffer(buf, dtype=F32)


def _blocks(lo: int, hi: int, block: int) -> range:
    return range(lo, hi, block)


class NumpyKernel:
    """The aggregation kernel in blocked numpy (see the module docstring)."""

    def __init__(self, block: int = BLOCK) -> None:
        """Takes the block size in elements (a positive int)."""
        if block <= 0:
            raise ValueError("block must be positive")
        self.block = block

    # ---------------------------------------------------------------- FedAvg

    def average_into(
        self,
        out: npt.NDArray[np.float32],
        updates: Sequence[npt.NDArray[np.float32]],
        counts: Sequence[int],
    ) -> None:
        """Writes the weighted average of float32 arrays (canonical order) to
        ``out``; each update is read once, block by block."""
        n = out.shape[0]
        total = float(sum(counts))
        cs = [float(c) for c in counts]
        acc = np.empty(self.block, F64)
        tmp = np.empty(self.block, F64)
        with np.errstate(all="ignore"):  # non-finite results are the core's to report
            self._average_blocks(out, updates, cs, total, acc, tmp)

    def _average_blocks(
        self,
        out: npt.NDArray[np.float32],
        updates: Sequence[npt.NDArray[np.float32]],
        cs: Sequence[float],
        total: float,
        acc: npt.NDArray[np.float64],
        tmp: npt.NDArray[np.float64],
    ) -> None:
        n = out.shape[0]
        for lo in _blocks(0, n, self.block):
            hi = min(n, lo + self.block)
            a = acc[: hi - lo]
            t = tmp[: hi - lo]
            a[...] = updates[0][lo:hi]  # exact widening
            np.multiply(a, cs[0], out=a)  # acc = c_0 * x_0
            for x, c in zip(updates[1:], cs[1:]):
                t[...] = x[lo:hi]
                np.multiply(t, c, out=t)
                np.add(a, t, out=a)  # acc = acc + c_k * x_k, in order
            np.divide(a, total, out=a)
            out[lo:hi] = a  # round to nearest float32

    def weighted_average(self, updates: Sequence[BytesLike], counts: Sequence[int]) -> bytes:
        """See ``AggregationKernel.weighted_average``."""
        xs = [as_f32(u) for u in updates]
        out = np.empty(xs[0].shape[0], F32)
        self.average_into(out, xs, counts)
        return out.tobytes()

    # ------------------------------------------------------ server optimizers

    def fedavgm_arrays(
        self,
        start: npt.NDArray[np.float32],
        avg: npt.NDArray[np.float32],
        v: npt.NDArray[np.float32],
        out: npt.NDArray[np.float32],
        segments: Sequence[Segment],
        lr: float,
        mu: float,
        nesterov: bool = False,
    ) -> None:
        """In place over ``segments``: ``v`` updated, ``out`` gets the step."""
        lr, mu = float(lr), float(mu)
        with np.errstate(all="ignore"):
            self._fedavgm_blocks(start, avg, v, out, segments, lr, mu, nesterov)

    def _fedavgm_blocks(
        self,
        start: npt.NDArray[np.float32],
        avg: npt.NDArray[np.float32],
        v: npt.NDArray[np.float32],
        out: npt.NDArray[np.float32],
        segments: Sequence[Segment],
        lr: float,
        mu: float,
        nesterov: bool,
    ) -> None:
        for seg_lo, seg_hi in segments:
            for lo in _blocks(seg_lo, seg_hi, self.block):
                hi = min(seg_hi, lo + self.block)
                s = start[lo:hi].astype(F64)
                d = avg[lo:hi].astype(F64)
                np.subtract(d, s, out=d)
                t = v[lo:hi].astype(F64)
                np.multiply(t, mu, out=t)
                np.add(t, d, out=t)
                v[lo:hi] = t  # store v as float32 ...
                t[...] = v[lo:hi]  # ... and step with the stored value
                if nesterov:  # lr * (d + mu*v)
                    np.multiply(t, mu, out=t)
                    np.add(d, t, out=t)
                np.multiply(t, lr, out=t)
                np.add(s, t, out=s)
                out[lo:hi] = s

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
        out = as_f32(average).copy()
        v = as_f32(velocity).copy()
        self.fedavgm_arrays(as_f32(start), as_f32(average), v, out, segments, lr, momentum, nesterov)
        return out.tobytes(), v.tobytes()

    def fedadam_arrays(
        self,
        start: npt.NDArray[np.float32],
        avg: npt.NDArray[np.float32],
        m: npt.NDArray[np.float32],
        v: npt.NDArray[np.float32],
        out: npt.NDArray[np.float32],
        segments: Sequence[Segment],
        lr: float,
        beta1: float,
        beta2: float,
        epsilon: float,
    ) -> None:
        """In place over ``segments``: ``m``, ``v`` updated, ``out`` gets the step."""
        lr, b1, b2, eps = float(lr), float(beta1), float(beta2), float(epsilon)
        b1c, b2c = 1.0 - b1, 1.0 - b2  # in float64, as the C host does
        with np.errstate(all="ignore"):
            self._fedadam_blocks(start, avg, m, v, out, segments, lr, b1, b1c, b2, b2c, eps)

    def _fedadam_blocks(
        self,
        start: npt.NDArray[np.float32],
        avg: npt.NDArray[np.float32],
        m: npt.NDArray[np.float32],
        v: npt.NDArray[np.float32],
        out: npt.NDArray[np.float32],
        segments: Sequence[Segment],
        lr: float,
        b1: float,
        b1c: float,
        b2: float,
        b2c: float,
        eps: float,
    ) -> None:
        for seg_lo, seg_hi in segments:
            for lo in _blocks(seg_lo, seg_hi, self.block):
                hi = min(seg_hi, lo + self.block)
                s = start[lo:hi].astype(F64)
                d = avg[lo:hi].astype(F64)
                np.subtract(d, s, out=d)
                # m = f32(b1*m + b1c*d)
                t = m[lo:hi].astype(F64)
                np.multiply(t, b1, out=t)
                u = np.multiply(d, b1c)
                np.add(t, u, out=t)
                m[lo:hi] = t
                # v = f32(b2*v + b2c*(d*d))
                np.multiply(d, d, out=d)
                np.multiply(d, b2c, out=d)
                t2 = v[lo:hi].astype(F64)
                np.multiply(t2, b2, out=t2)
                np.add(t2, d, out=t2)
                v[lo:hi] = t2
                # out = f32(s + (lr*m) / (sqrt(v) + eps)), m and v as stored
                t[...] = m[lo:hi]
                np.multiply(t, lr, out=t)
                t2[...] = v[lo:hi]
                np.sqrt(t2, out=t2)
                np.add(t2, eps, out=t2)
                np.divide(t, t2, out=t)
                t[t2 == 0.0] = 0.0  # epsilon 0 on an unmoved weight (0/0): a zero step, as in C
                np.add(s, t, out=s)
                out[lo:hi] = s

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
        out = as_f32(average).copy()
        mv = as_f32(moments).copy()
        n = out.shape[0]
        self.fedadam_arrays(
            as_f32(start), as_f32(average), mv[:n], mv[n:], out, segments, lr, beta1, beta2, epsilon
        )
        return out.tobytes(), mv.tobytes()

    # ---------------------------------------------------- robust aggregation

    def delta_sq_norms(self, start: BytesLike, updates: Sequence[BytesLike]) -> list[float]:
        """See ``AggregationKernel.delta_sq_norms`` (eight lanes, each a
        sequential sum: ``np.cumsum`` is strictly left to right)."""
        s = as_f32(start)
        n = s.shape[0]
        block = max(LANES, self.block // LANES * LANES)
        out: list[float] = []
        for update in updates:
            x = as_f32(update)
            lanes = np.zeros(LANES, F64)
            for lo in _blocks(0, n, block):
                hi = min(n, lo + block)
                d = x[lo:hi].astype(F64)
                np.subtract(d, s[lo:hi], out=d)
                np.multiply(d, d, out=d)
                whole = (hi - lo) // LANES * LANES
                if whole:
                    rows = d[:whole].reshape(-1, LANES)
                    rows[0] += lanes  # lane + first square, then the rest in order
                    lanes = np.cumsum(rows, axis=0)[-1]
                tail = d[whole:]
                lanes[: tail.shape[0]] += tail
            total = float(lanes[0])
            for lane in lanes[1:]:
                total = total + float(lane)
            out.append(total)
        return out

    def scale_delta(self, start: BytesLike, update: BytesLike, factor: float) -> bytes:
        """See ``AggregationKernel.scale_delta``."""
        s32, x32 = as_f32(start), as_f32(update)
        out = np.empty(s32.shape[0], F32)
        f = float(factor)
        for lo in _blocks(0, s32.shape[0], self.block):
            hi = min(s32.shape[0], lo + self.block)
            s = s32[lo:hi].astype(F64)
            d = x32[lo:hi].astype(F64)
            np.subtract(d, s, out=d)
            np.multiply(d, f, out=d)
            np.add(s, d, out=s)
            out[lo:hi] = s
        return out.tobytes()

    def trimmed_mean(self, updates: Sequence[BytesLike], trim: int) -> bytes:
        """See ``AggregationKernel.trimmed_mean``: sorted by a total-order
        integer key (-0 before +0), as the C insertion sort does."""
        xs = [as_f32(u) for u in updates]
        k, n = len(xs), xs[0].shape[0]
        kept = float(k - 2 * trim)
        out = np.empty(n, F32)
        block = max(1, self.block // k)
        keys = np.empty((k, block), np.int32)
        for lo in _blocks(0, n, block):
            hi = min(n, lo + block)
            rows = keys[:, : hi - lo]
            for r, x in enumerate(xs):
                b = x[lo:hi].view(np.int32)
                np.bitwise_xor(b, (b >> 31) & 0x7FFFFFFF, out=rows[r])
            rows.sort(axis=0)
            vals = (rows ^ ((rows >> 31) & 0x7FFFFFFF)).view(F32)
            acc = vals[trim].astype(F64)
            for r in range(trim + 1, k - trim):
                np.add(acc, vals[r], out=acc)
            np.divide(acc, kept, out=acc)
            out[lo:hi] = acc
        return out.tobytes()

    # ---------------------------------------------------- compressed updates

    def quantize(self, start: BytesLike, trained: BytesLike, residual: BytesLike, block: int,
                 bits: int) -> tuple[bytes, bytes, bytes]:
        """See ``AggregationKernel.quantize`` (c/kernel/aggregate.c, weei_quantize, for the bits)."""
        q = 127.0 if bits == 8 else 7.0
        s = as_f32(start).astype(F64)
        t = as_f32(trained).astype(F64)
        np.subtract(t, s, out=t)
        np.add(t, as_f32(residual), out=t)
        n = t.shape[0]
        n_blocks = -(-n // block)
        padded = np.zeros(n_blocks * block, F64)
        np.abs(t, out=padded[:n])
        scales = (padded.reshape(n_blocks, block).max(axis=1) / q).astype(F32)
        per = np.repeat(scales.astype(F64), block)[:n]
        with np.errstate(all="ignore"):
            r = np.where(per != 0.0, np.clip(np.rint(t / per), -q, q), 0.0)
        np.multiply(per, r, out=per)  # exact: a float32 times a code of at most 8 bits
        np.subtract(t, per, out=t)
        codes = r.astype(np.int8)
        return scales.tobytes(), _pack(codes, bits), t.astype(F32).tobytes()

    def dequantize(self, start: BytesLike, scales: BytesLike, codes: BytesLike, block: int, bits: int) -> bytes:
        """See ``AggregationKernel.dequantize``."""
        s = as_f32(start).astype(F64)
        n = s.shape[0]
        per = np.repeat(as_f32(scales).astype(F64), block)[:n]
        np.multiply(per, _unpack(codes, bits, n), out=per)
        np.add(s, per, out=s)
        with np.errstate(all="ignore"):  # an overflow to infinity is the core's to refuse
            return s.astype(F32).tobytes()

    # ----------------------------------------------------------- finiteness

    def first_non_finite(self, data: BytesLike) -> int:
        """See ``AggregationKernel.first_non_finite``."""
        x = as_f32(data)
        for lo in _blocks(0, x.shape[0], self.block):
            bad = np.flatnonzero(~np.isfinite(x[lo : lo + self.block]))
            if bad.size:
                return lo + int(bad[0])
        return -1

    def sha256_many(self, buffers: Sequence[BytesLike]) -> list[str]:
        """See ``weei.core.job.round_rules.Kernel.sha256_many``: on every core (weei.kernel.digests)."""
        return _sha256_many(buffers)

    def x25519(self, k: bytes, u: bytes) -> bytes:
        """See ``weei.core.job.round_rules.Kernel.x25519``: the pure-Python ladder, the oracle."""
        return _x25519(k, u)


def _pack(codes: npt.NDArray[np.int8], bits: int) -> bytes:
    """int8 codes as bytes, or two signed nibbles a byte (even index low, an odd tail padded with 0)."""
    if bits == 8:
        return codes.tobytes()
    nib = (codes.astype(np.uint8) & 15)
    if nib.shape[0] % 2:
        nib = np.append(nib, np.uint8(0))
    return (nib[0::2] | (nib[1::2] << 4)).astype(np.uint8).tobytes()


def _unpack(codes: BytesLike, bits: int, n: int) -> npt.NDArray[np.float64]:
    raw = np.frombuffer(codes, np.uint8)
    if bits == 8:
        return raw.view(np.int8)[:n].astype(F64)
    nib = np.empty(raw.shape[0] * 2, np.int16)
    nib[0::2], nib[1::2] = raw & 15, raw >> 4
    return ((nib[:n] ^ 8) - 8).astype(F64)
