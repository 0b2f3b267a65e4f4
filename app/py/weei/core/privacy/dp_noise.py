"""DP-FedAvg's round: clip each delta to norm C, average, add Gaussian noise σ·C/n, bit-reproducibly.

Theory of operation
-------------------
A round of ``n`` contributions (canonical order, weei.core.aggregation)
becomes::

    d_k   = x_k - start                      # each contribution's delta
    x'_k  = start + min(1, C/|d_k|)·d_k      # clipped (kernel.scale_delta)
    avg   = (1/n) Σ x'_k                     # unweighted: counts are not used
    out_i = f32(f64(avg_i) + (σ·C/n)·z_i)    # z_i ~ N(0, 1) from the noise stream

so ``out = start + (Σ clip(d_k) + N(0, σ²C²·I)) / n``: the Gaussian mechanism
on the sum (sensitivity C when one participant is added or removed), then
divided by the public n. Counts are ignored because an example-weighted
average would let one participant's weight exceed 1/n of the sum and break
the sensitivity bound (McMahan et al. 2018 use fixed weights too). Every
element is clipped and noised, the model's ``averageOnly`` ranges included:
they come from the participants' data as much as trained weights do (batch
statistics), and take the noised average like any average. FedAvgM and
FedAdam then step from the noised average (post-processing: no loss).

Noise stream (the documented generator)
---------------------------------------
``key = SHA-256("weei-dp-noise/v1" ‖ seed ‖ job id ‖ round as 8 bytes LE)``
with ``seed`` the coordinator's 32 secret bytes (or, with the noise at the
participants, one participant's, fresh for each contribution). Block ``j`` is
``SHA-256(key ‖ j as 8 bytes LE)``: four 64-bit little-endian words, each
giving a uniform ``u = ((w >> 11) + 0.5) / 2**53`` in (0, 1) (exact in
float64). Pairs of uniforms become normals by Marsaglia's polar method:
``a = 2u₁-1, b = 2u₂-1, s = a²+b²``; a pair with ``s >= 1`` is skipped,
otherwise ``f = sqrt(-2·ln(s)/s)`` gives ``a·f`` then ``b·f``. The logarithm
is :func:`ln` below (IEEE basic operations and ``math.sqrt`` only, both
correctly rounded everywhere), not the platform's ``math.log``, whose last bit
differs between libms; so CPython and Pyodide draw the same bits. Python
floats are IEEE binary64 in round-to-nearest-even on both.

Every normal is bounded: the uniforms are odd multiples of 2**-53 away
from 1/2, so ``|a|, |b| >= 2**-53`` exactly and ``s >= 2**-105``; as
``a² <= s``, ``|a·f| <= sqrt(-2·ln(s)) <= sqrt(210·ln 2) = 12.0648...``
(:data:`GAUSSIAN_BOUND`). The largest normal the arithmetic can give is
about 11.68 (``a = 9·2**-53, b = 2**-53``; the bound ignores ``a²/s < 1``),
so float rounding, a few ulps, stays well inside it. Secure aggregation
sizes its fixed-point grid with it (weei.core.job.secure_round).

What the float arithmetic does not give: the guarantee assumes real-valued
noise; float64 noise added to float32 weights has the rounding artifacts of
any floating-point Gaussian mechanism (Mironov 2012). docs/privacy.md says so.
"""

from __future__ import annotations

import hashlib
import math
import struct
from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, Union

__all__ = ["SEED_BYTES", "GAUSSIAN_BOUND", "NORM_TAIL", "DpKernel", "DpReport", "noise_key", "ln", "uniforms", "gaussians",
           "gaussian_norm_bound",
           "clip_factor", "clip_update", "clip_to_norm", "assigned_clip", "dp_average"]

SEED_BYTES = 32
_Buf = Union[bytes, bytearray, memoryview]
_LN2 = 0.6931471805599453  # the float64 nearest ln 2
_SQRT_HALF = 0.7071067811865476
#: No normal of :func:`gaussians` is longer (module docstring): sqrt(-2·ln 2**-105).
GAUSSIAN_BOUND = math.sqrt(210.0 * _LN2)
#: The tail :func:`gaussian_norm_bound` leaves out: e**-NORM_TAIL = 2**-64 (ln 2**64, rounded up).
NORM_TAIL = 44.37


class DpKernel(Protocol):
    """The kernel loops DP needs (weei.kernel implements them)."""

    def weighted_average(self, updates: Sequence[_Buf], counts: Sequence[int]) -> bytes: ...

    def delta_sq_norms(self, start: _Buf, updates: Sequence[_Buf]) -> list[float]: ...

    def scale_delta(self, start: _Buf, update: _Buf, factor: float) -> bytes: ...


@dataclass(frozen=True)
class DpReport:
    """What one DP round did: each contribution's delta norm (canonical order) and those clipped."""

    norms: tuple[float, ...]
    clipped: tuple[int, ...]  # indexes into the canonical order
    noise_std: float  # the noise's standard deviation in each averaged element: σ·C/n, or σ·C·√(k/t)/k from participants


def noise_key(seed: bytes, job_id: str, round_: int) -> bytes:
    """The round's stream key (see the module docstring); raises ValueError for a seed not of 32 bytes."""
    if len(seed) != SEED_BYTES:
        raise ValueError(f"the noise seed must be {SEED_BYTES} bytes, got {len(seed)}")
    return hashlib.sha256(b"weei-dp-noise/v1" + seed + job_id.encode() + round_.to_bytes(8, "little")).digest()


def ln(x: float) -> float:
    """Natural log of a positive finite float with basic operations only (absolute error below 1e-15
    on (0, 1]): ``x = m·2**e`` with m in [√½, √2), ``ln m = 2·atanh(z)``, ``z = (m-1)/(m+1)``,
    |z| <= 0.1716, summed to z**41 (the next term is below 1e-33)."""
    m, e = math.frexp(x)  # exact: m in [0.5, 1)
    if m < _SQRT_HALF:
        m, e = m * 2.0, e - 1
    z = (m - 1.0) / (m + 1.0)
    z2 = z * z
    term, total = z, 0.0
    for k in range(0, 21):
        total += term / (2 * k + 1)
        term *= z2
    return 2.0 * total + e * _LN2


def uniforms(key: bytes) -> Iterator[float]:
    """The stream's uniforms in (0, 1), endless."""
    block = 0
    while True:
        digest = hashlib.sha256(key + block.to_bytes(8, "little")).digest()
        for (word,) in struct.iter_unpack("<Q", digest):
            yield ((word >> 11) + 0.5) / 9007199254740992.0
        block += 1


def gaussians(key: bytes, count: int) -> list[float]:
    """``count`` standard normals from the stream of ``key`` (polar method, module docstring)."""
    out: list[float] = []
    stream = uniforms(key)
    while len(out) < count:
        a = 2.0 * next(stream) - 1.0
        b = 2.0 * next(stream) - 1.0
        s = a * a + b * b
        if s >= 1.0 or s == 0.0:
            continue
        f = math.sqrt(-2.0 * ln(s) / s)
        out.append(a * f)
        out.append(b * f)
    del out[count:]
    return out


def gaussian_norm_bound(count: int, std: float) -> float:
    """A bound on the L2 norm of ``count`` independent N(0, std²) values that fails with probability at
    most 2**-64: Laurent & Massart (2000), Lemma 1, P(χ²_d >= d + 2·sqrt(d·x) + 2x) <= e**-x, at
    x = :data:`NORM_TAIL`."""
    x = NORM_TAIL
    return std * math.sqrt(count + 2.0 * math.sqrt(count * x) + 2.0 * x)


def clip_factor(norm: float, clip: float) -> float:
    """``min(1, C/|d|)``: 1 when the delta is within the clip."""
    return 1.0 if norm <= clip else clip / norm


def clip_update(kernel: DpKernel, start: _Buf, update: _Buf, clip: float) -> bytes:
    """``update`` with its delta from ``start`` clipped to norm ``clip`` (what a participant sends under DP)."""
    norm = math.sqrt(kernel.delta_sq_norms(start, [update])[0])
    factor = clip_factor(norm, clip)
    return bytes(update) if factor == 1.0 else kernel.scale_delta(start, update, factor)


def clip_to_norm(start: _Buf, update: _Buf, clip: float) -> bytes:
    """What a participant sends under DP (no kernel needed): ``update`` with its delta from ``start``
    clipped to norm ``clip``, ``f32(f64(s) + f·(f64(x) - f64(s)))`` as ``scale_delta``; the norm is
    ``math.fsum`` of the squares (correctly rounded, the same on every platform). The coordinator
    clips again with its kernel: a participant's clip is a courtesy it does not rely on.

    Raises ValueError when the buffers differ in length or are not whole float32 values.
    """
    s, x = array("f", bytes(start)), array("f", bytes(update))
    if len(s) != len(x) or len(bytes(start)) % 4:
        raise ValueError("start and update must be float32 buffers of the same length")
    norm = math.sqrt(math.fsum((b - a) * (b - a) for a, b in zip(s, x)))
    factor = clip_factor(norm, clip)
    if factor == 1.0:
        return bytes(update)
    return array("f", [a + factor * (b - a) for a, b in zip(s, x)]).tobytes()


def assigned_clip(settings: Mapping[str, Any]) -> float | None:
    """The DP clip an assignment's settings carry (``dpClip``, weei.core.job.round_rules), or None;
    a value that is not a finite number above 0 counts as none (the coordinator clips anyway)."""
    clip = settings.get("dpClip")
    if isinstance(clip, bool) or not isinstance(clip, (int, float)) or not math.isfinite(clip) or clip <= 0:
        return None
    return float(clip)


def dp_average(kernel: DpKernel, start: _Buf, updates: Sequence[_Buf], clip: float, noise_multiplier: float,
               key: bytes) -> tuple[bytes, DpReport]:
    """The noised average of ``updates`` (canonical order, already validated, at least one).

    Returns float32-le bytes and the report. The noise is ``noise_multiplier·clip/n`` per element
    from the stream of ``key``; nothing is drawn when the multiplier is 0.
    """
    norms = tuple(math.sqrt(v) for v in kernel.delta_sq_norms(start, updates))
    clipped_ix = tuple(i for i, n in enumerate(norms) if clip_factor(n, clip) != 1.0)
    clipped = [kernel.scale_delta(start, u, clip_factor(n, clip)) if i in clipped_ix else u
               for i, (u, n) in enumerate(zip(updates, norms, strict=True))]
    average = kernel.weighted_average(clipped, [1] * len(clipped))
    std = noise_multiplier * clip / len(updates)
    if noise_multiplier == 0:
        return average, DpReport(norms, clipped_ix, 0.0)
    values = array("f", average)
    if array("f").itemsize != 4:  # pragma: no cover - every platform Weei runs on has 4-byte floats
        raise RuntimeError("array('f') is not float32 here")
    noise = gaussians(key, len(values))
    # array('f') stores a C float: the double rounds to nearest float32, as f32() in aggregate.py.
    noised = array("f", [v + std * z for v, z in zip(values, noise, strict=True)])
    return noised.tobytes(), DpReport(norms, clipped_ix, std)
