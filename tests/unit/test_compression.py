"""Compressed updates (issue 25): the quantization on every kernel, the artifact's parser, error feedback,
the coordinator's checks, and a federated job that trains with int8 updates in-process."""

from __future__ import annotations

import asyncio
import io
import struct
import tracemalloc
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sim import Sim, dataset_spec, sha, to_floats

from weei.api.compression import FEEDBACK_KEY, UpdateCompressor
from weei.api.job_store import JobStore
from weei.core import limits
from weei.core.aggregation.compression import (ErrorFeedback, compress_update, decompress_update, layout,
                                               usable_feedback)
from weei.core.errors import SettingsError
from weei.core.formats.checkpoint import read_checkpoint
from weei.core.formats.modelinfo import ModelAggregation
from weei.core.formats.qdelta import HEADER_BYTES, QDeltaError, parse_qdelta, qdelta_size, serialize_qdelta
from weei.core.formats.settings import CompressionSettings, TrainingSettings
from weei.core.job.participant import TrainOutcome
from weei.core.wire.messages import ArtifactRef, Assign, ChunkRef, Update
from weei.host.memory_storage import MemoryStorage
from weei.kernel.native import NativeKernel
from weei.kernel.numpy_kernel import NumpyKernel
from weei.kernel.wasm_kernel import WasmKernel

KERNELS = {"numpy": NumpyKernel(), "native": NativeKernel(), "wasm": WasmKernel()}
INT8, INT4 = CompressionSettings("int8", 8), CompressionSettings("int4", 8)


def f32(values: Any) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()


def quantize_reference(s: list[float], x: list[float], e: list[float], block: int, q: int) -> tuple[list[float], list[int], list[float]]:
    """The quantization written out per element in Python floats (float64), rounding to float32 with struct."""
    def r32(v: float) -> float:
        return struct.unpack("<f", struct.pack("<f", v))[0]

    t = [(xi - si) + ei for si, xi, ei in zip(s, x, e, strict=True)]
    scales, codes, resid = [], [], []
    for lo in range(0, len(t), block):
        part = t[lo:lo + block]
        sc = r32(max(abs(v) for v in part) / q)
        scales.append(sc)
        for v in part:
            c = 0 if sc == 0 else max(-q, min(q, round(v / sc)))  # round(): half to even, as rint
            codes.append(c)
            resid.append(r32(v - sc * c))
    return scales, codes, resid


# ----------------------------------------------------------------- kernels


CASES = [(1000, 64, 8), (1001, 64, 4), (7, 8, 4), (70_001, 256, 4), (3, 1000, 8), (4096, 8, 8)]


@pytest.mark.parametrize("n, block, bits", CASES)
def test_quantize_and_dequantize_are_bit_identical_on_every_kernel(n: int, block: int, bits: int) -> None:
    rng = np.random.default_rng(n)
    s = rng.standard_normal(n).astype("<f4")
    x = (s + rng.standard_normal(n).astype("<f4") * np.float32(1e-3)).astype("<f4")
    e = (rng.standard_normal(n) * 1e-5).astype("<f4")
    x[: min(n, block)] = s[: min(n, block)]  # a block that did not move: scale 0, codes 0
    e[: min(n, block)] = 0
    x[-1] = s[-1] + np.float32(3.0)  # one outlier: its block's codes are mostly small
    out = {name: k.quantize(s.tobytes(), x.tobytes(), e.tobytes(), block, bits) for name, k in KERNELS.items()}
    assert out["native"] == out["numpy"] and out["wasm"] == out["numpy"]
    scales, codes, resid = out["numpy"]
    back = {name: k.dequantize(s.tobytes(), scales, codes, block, bits) for name, k in KERNELS.items()}
    assert back["native"] == back["numpy"] and back["wasm"] == back["numpy"]
    assert len(scales) == 4 * -(-n // block) and len(codes) == (n if bits == 8 else (n + 1) // 2)
    # Sent plus kept is what there was to send, to float32 rounding of the two parts.
    sent = to_floats(back["numpy"]).astype(np.float64) - s
    target = x.astype(np.float64) - s + e
    kept = to_floats(resid).astype(np.float64)
    assert np.allclose(sent + kept, target, rtol=0, atol=1e-6)
    assert np.max(np.abs(kept)) <= np.max(np.abs(target)) / (127 if bits == 8 else 7)


def test_quantize_matches_the_formula_written_out() -> None:
    rng = np.random.default_rng(5)
    n, block = 53, 8
    s, x = rng.standard_normal(n).astype("<f4"), rng.standard_normal(n).astype("<f4")
    e = (rng.standard_normal(n) * 0.01).astype("<f4")
    for bits, q in ((8, 127), (4, 7)):
        scales, codes, resid = KERNELS["numpy"].quantize(s.tobytes(), x.tobytes(), e.tobytes(), block, bits)
        ref_scales, ref_codes, ref_resid = quantize_reference(*(a.astype(float).tolist() for a in (s, x, e)), block, q)
        assert to_floats(scales).tolist() == ref_scales and to_floats(resid).tolist() == ref_resid
        if bits == 8:
            assert np.frombuffer(codes, np.int8).tolist() == ref_codes
        else:
            nibbles = [(b >> (4 * k)) & 15 for b in codes for k in (0, 1)][:n]
            assert [(v ^ 8) - 8 for v in nibbles] == ref_codes
            assert codes[-1] >> 4 == 0  # 53 codes: the last byte's high nibble is padding
        deq = to_floats(KERNELS["numpy"].dequantize(s.tobytes(), scales, codes, block, bits))
        assert deq.tolist() == [struct.unpack("<f", struct.pack("<f", float(si) + ref_scales[i // block] * c))[0]
                                for i, (si, c) in enumerate(zip(s, ref_codes, strict=True))]


def test_average_only_ranges_travel_exactly_and_the_rest_quantized() -> None:
    n = 40
    start = f32(np.arange(n) / 10)
    trained = f32(np.arange(n) / 10 + np.linspace(-0.05, 0.05, n))
    shape = layout(4 * n, [(16, 8), (100, 20)])  # elements 4-5 and 25-29 are averageOnly
    assert (shape.n_quantized, shape.n_raw, shape.raw) == (33, 7, ((4, 6), (25, 30)))
    artifact, _ = compress_update(KERNELS["numpy"], start, trained, INT4, shape, None)
    assert len(artifact) == qdelta_size(4, 8, 33, 7) == HEADER_BYTES + 4 * 5 + 17 + 28
    outs = {name: decompress_update(k, start, artifact, INT4, shape) for name, k in KERNELS.items()}
    assert outs["native"] == outs["numpy"] == outs["wasm"]
    got, want = to_floats(outs["numpy"]), to_floats(trained)
    for lo, hi in shape.raw:
        assert got[lo:hi].tobytes() == want[lo:hi].tobytes()
    assert np.max(np.abs(got - want)) < 0.01


def test_a_model_without_average_only_is_one_segment() -> None:
    shape = layout(64, [])
    assert (shape.segments, shape.raw, shape.n_quantized) == (((0, 16),), (), 16)


# ----------------------------------------------------------------- settings


def test_compression_setting_is_additive_checked_and_recorded() -> None:
    base = {"epochs": 1, "localEpochs": 1, "batchSize": 8, "coordinatorParticipates": True}
    assert TrainingSettings.from_json(base).compression is None and "compression" not in TrainingSettings.from_json(base).to_json()
    parsed = TrainingSettings.from_json({**base, "compression": {"kind": "int4"}})
    assert parsed.compression == CompressionSettings("int4", 256) and parsed.compression.bits == 4
    assert parsed.to_json()["compression"] == {"kind": "int4", "block": 256}
    for value, field, reason in (
        ({"kind": "int2"}, "compression.kind", "invalid-setting"),
        ({"block": 64}, "compression.kind", "missing-setting"),
        ({"kind": "int8", "block": 4}, "compression.block", "out-of-range"),
        ({"kind": "int8", "block": 65537}, "compression.block", "out-of-range"),
        ({"kind": "int8", "block": 64.5}, "compression.block", "invalid-setting"),
        ({"kind": "int8", "scale": "f16"}, "compression.scale", "unknown-setting"),
        ("int8", "compression", "invalid-setting"),
    ):
        with pytest.raises(SettingsError) as err:
            TrainingSettings.from_json({**base, "compression": value})
        assert (err.value.field, err.value.reason) == (field, reason), value


# ------------------------------------------------------------------ parser

N_Q, N_RAW = 21, 2


def sample(bits: int = 8, block: int = 8) -> bytes:
    rng = np.random.default_rng(1)
    nb = -(-N_Q // block)
    codes = rng.integers(-7, 8, N_Q).astype(np.int8)
    packed = codes.tobytes() if bits == 8 else NumpyKernel().quantize(
        bytes(4 * N_Q), codes.astype("<f4").tobytes(), bytes(4 * N_Q), block, 4)[1]
    return serialize_qdelta(bits, block, N_Q, f32(np.full(nb, 0.5)), packed, f32([1.0, 2.0]))


def parse(data: bytes, bits: int = 8, block: int = 8) -> Any:
    return parse_qdelta(data, bits=bits, block=block, n_quantized=N_Q, n_raw=N_RAW)


def _patch(data: bytes, offset: int, raw: bytes) -> bytes:
    return data[:offset] + raw + data[offset + len(raw):]


HOSTILE = [
    ("qdelta-truncated", lambda d: d[:HEADER_BYTES - 1]),
    ("qdelta-truncated", lambda d: d[:-1]),
    ("qdelta-truncated", lambda d: d[:HEADER_BYTES + 5]),
    ("qdelta-trailing-bytes", lambda d: d + b"\0"),
    ("qdelta-bad-magic", lambda d: b"WQD2" + d[4:]),
    ("qdelta-bad-header", lambda d: _patch(d, 5, b"\2")),  # codec 2
    ("qdelta-bad-header", lambda d: _patch(d, 6, b"\1")),
    ("qdelta-codec-mismatch", lambda d: _patch(d, 5, b"\1")),  # deflated codes in a job that does not deflate
    ("qdelta-bad-header", lambda d: _patch(d, 4, b"\x10")),
    ("qdelta-bad-header", lambda d: _patch(d, 8, struct.pack("<I", 4))),
    ("qdelta-kind-mismatch", lambda d: _patch(d, 4, b"\4")),
    ("qdelta-block-mismatch", lambda d: _patch(d, 8, struct.pack("<I", 16))),
    ("qdelta-wrong-element-count", lambda d: _patch(d, 12, struct.pack("<I", N_Q + 1))),
    ("qdelta-wrong-element-count", lambda d: _patch(d, 20, struct.pack("<I", 0))),
    ("qdelta-wrong-block-count", lambda d: _patch(d, 16, struct.pack("<I", 2))),
    ("qdelta-wrong-block-count", lambda d: _patch(d, 16, struct.pack("<I", 0xFFFFFFFF))),
    ("qdelta-non-finite-scale", lambda d: _patch(d, HEADER_BYTES + 4, f32([np.nan]))),
    ("qdelta-non-finite-scale", lambda d: _patch(d, HEADER_BYTES + 8, f32([np.inf]))),
    ("qdelta-non-finite-scale", lambda d: _patch(d, HEADER_BYTES, f32([-np.inf]))),
    ("qdelta-negative-scale", lambda d: _patch(d, HEADER_BYTES + 8, f32([-0.5]))),
    ("qdelta-negative-scale", lambda d: _patch(d, HEADER_BYTES, f32([-0.0]))),
]


def test_valid_samples_round_trip() -> None:
    for bits in (8, 4):
        q = parse(sample(bits), bits)
        assert (q.bits, q.block, q.n_quantized, len(q.scales), len(q.raw)) == (bits, 8, N_Q, 12, 8)
        assert len(sample(bits)) == qdelta_size(bits, 8, N_Q, N_RAW)


@pytest.mark.parametrize("reason, damage", HOSTILE, ids=[f"{r}-{i}" for i, (r, _) in enumerate(HOSTILE)])
def test_hostile_compressed_updates_are_refused_by_name(reason: str, damage: Any) -> None:
    with pytest.raises(QDeltaError) as err:
        parse(damage(sample()))
    assert err.value.reason == reason


def test_int4_padding_must_be_zero() -> None:
    data = sample(4)
    with pytest.raises(QDeltaError) as err:
        parse(data[:-9] + bytes([data[-9] | 0x10]) + data[-8:], 4)
    assert err.value.reason == "qdelta-nonzero-padding"


def test_an_oversized_compressed_update_is_refused_before_it_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(limits._BY_KIND, "qdelta", 100)
    with pytest.raises(QDeltaError) as err:
        parse(sample() + bytes(100))
    assert err.value.reason == "qdelta-too-large"
    assert limits.max_bytes("qdelta") == 100


def test_every_cut_of_a_sample_is_refused_by_name() -> None:
    data = sample(4)
    for cut in range(len(data)):
        with pytest.raises(QDeltaError):
            parse(data[:cut], 4)


# ----------------------------------------------------------- deflated codes

def _raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    return packer.compress(data) + packer.flush()


def low_entropy(n: int, seed: int = 3) -> tuple[bytes, bytes]:
    """A start and trained weights whose delta is heavy-tailed: mostly small against its block's largest."""
    rng = np.random.default_rng(seed)
    start = rng.standard_normal(n).astype("<f4")
    return start.tobytes(), (start + rng.standard_t(2, n).astype("<f4") * np.float32(0.001)).tobytes()


def test_deflate_setting_is_additive_checked_and_recorded() -> None:
    base = {"epochs": 1, "localEpochs": 1, "batchSize": 8, "coordinatorParticipates": True}
    parsed = TrainingSettings.from_json({**base, "compression": {"kind": "int8", "deflate": True}})
    assert parsed.compression == CompressionSettings("int8", 256, True)
    assert parsed.to_json()["compression"] == {"kind": "int8", "block": 256, "deflate": True}
    off = TrainingSettings.from_json({**base, "compression": {"kind": "int8", "deflate": False}})
    assert off.to_json()["compression"] == {"kind": "int8", "block": 256}  # the form a job had before the option
    with pytest.raises(SettingsError) as err:
        TrainingSettings.from_json({**base, "compression": {"kind": "int8", "deflate": 1}})
    assert (err.value.field, err.value.reason) == ("compression.deflate", "invalid-setting")


@pytest.mark.parametrize("bits", [8, 4])
def test_deflated_codes_are_smaller_and_dequantize_to_the_same_bits_on_every_kernel(bits: int) -> None:
    n = 5003
    start, trained = low_entropy(n)
    shape = layout(4 * n, [(400, 40)])
    plain_settings = CompressionSettings("int8" if bits == 8 else "int4", 64)
    packed_settings = replace(plain_settings, deflate=True)
    residual = f32(np.linspace(-1e-4, 1e-4, shape.n_quantized))
    plain, plain_residual = compress_update(NumpyKernel(), start, trained, plain_settings, shape, residual)
    packed, packed_residual = compress_update(NumpyKernel(), start, trained, packed_settings, shape, residual)
    assert packed[5] == 1 and plain[5] == 0 and len(packed) < 0.9 * len(plain)
    assert packed_residual == plain_residual  # lossless: the error kept is the same
    q_plain = parse_qdelta(plain, bits=bits, block=64, n_quantized=shape.n_quantized, n_raw=shape.n_raw)
    q_packed = parse_qdelta(packed, bits=bits, block=64, n_quantized=shape.n_quantized, n_raw=shape.n_raw,
                            deflate=True)
    assert q_packed.deflated and bytes(q_packed.codes) == bytes(q_plain.codes)
    for kernel in KERNELS.values():
        assert bytes(decompress_update(kernel, start, packed, packed_settings, shape)) == \
            bytes(decompress_update(kernel, start, plain, plain_settings, shape))


def test_codes_that_do_not_deflate_smaller_travel_plain_and_are_accepted() -> None:
    rng = np.random.default_rng(5)
    codes = rng.integers(-127, 128, 4096).astype(np.int8).tobytes()  # 8 bits of entropy a code
    data = serialize_qdelta(8, 256, 4096, f32(np.ones(16)), codes, b"", deflate=True)
    assert data[5] == 0 and len(data) == qdelta_size(8, 256, 4096, 0)
    q = parse_qdelta(data, bits=8, block=256, n_quantized=4096, n_raw=0, deflate=True)
    assert not q.deflated and bytes(q.codes) == codes


def deflated(section: bytes, n_q: int = N_Q, scales: int = 3) -> bytes:
    """A deflate-codec artifact of int8 codes with this code section and two raw values."""
    header = struct.pack("<4sBB2sIIII", b"WQD1", 8, 1, b"\0\0", 8, n_q, -(-n_q // 8), N_RAW)
    return header + f32(np.full(scales, 0.5)) + section + f32([1.0, 2.0])


def parse_deflated(data: bytes, n_q: int = N_Q) -> Any:
    return parse_qdelta(data, bits=8, block=8, n_quantized=n_q, n_raw=N_RAW, deflate=True)


DEFLATE_HOSTILE = [
    ("qdelta-bad-deflate", b"\xff" * 10),  # not a deflate stream
    ("qdelta-bad-deflate", _raw_deflate(bytes(N_Q))[:-2]),  # a stream that does not end
    ("qdelta-bad-deflate", _raw_deflate(bytes(N_Q)) + b"\0"),  # a byte after the stream
    ("qdelta-bad-deflate", bytes(N_Q)),  # as long as the plain codes: never worth deflating
    ("qdelta-inflated-size", _raw_deflate(bytes(N_Q - 1))),
    ("qdelta-inflated-size", _raw_deflate(bytes(N_Q + 1))),
    ("qdelta-truncated", b""),
]


@pytest.mark.parametrize("reason, section", DEFLATE_HOSTILE, ids=[f"{r}-{i}" for i, (r, _) in enumerate(DEFLATE_HOSTILE)])
def test_hostile_deflated_codes_are_refused_by_name(reason: str, section: bytes) -> None:
    assert parse_deflated(deflated(_raw_deflate(bytes(N_Q)))).deflated  # the undamaged form parses
    with pytest.raises(QDeltaError) as err:
        parse_deflated(deflated(section))
    assert err.value.reason == reason


def test_a_deflate_bomb_inflates_no_further_than_the_codes_declared() -> None:
    n_q = 100_000
    bomb = _raw_deflate(bytes(95_000_000))  # 92 KB of deflate (under the 100,000 plain bytes) inflating to 95 MB
    assert len(bomb) < n_q
    data = deflated(bomb, n_q, scales=n_q // 8)
    tracemalloc.start()
    try:
        with pytest.raises(QDeltaError) as err:
            parse_deflated(data, n_q)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert err.value.reason == "qdelta-inflated-size"
    assert peak < 4 * n_q  # the output stopped at the declared size (plus a byte), nowhere near 95 MB


def test_every_cut_of_a_deflated_sample_is_refused_by_name() -> None:
    start, trained = low_entropy(1000)
    shape = layout(4000, [])
    data = compress_update(NumpyKernel(), start, trained, CompressionSettings("int8", 64, True), shape, None)[0]
    assert data[5] == 1
    for cut in range(len(data)):
        with pytest.raises(QDeltaError):
            parse_qdelta(data[:cut], bits=8, block=64, n_quantized=1000, n_raw=0, deflate=True)


# ----------------------------------------------------------- error feedback

SETTINGS = CompressionSettings("int8", 8)


def feedback(**changes: Any) -> ErrorFeedback:
    return replace(ErrorFeedback("job-1", 3, "int8", 8, f32([0.25] * 4)), **changes)


def test_error_feedback_is_used_only_by_the_next_round_of_the_same_job() -> None:
    use = lambda fb, round_=4: usable_feedback(fb, job_id="job-1", round_=round_, settings=SETTINGS, n_quantized=4)  # noqa: E731
    assert use(feedback()) == f32([0.25] * 4)  # made in round 3, used in round 4
    assert use(feedback(), round_=3) == f32([0.25] * 4)  # a second assignment of the same round
    assert use(feedback(), round_=5) is None  # round 4 missed: dropped
    assert use(feedback(), round_=2) is None  # from the future (a restored older job): dropped
    assert use(feedback(job_id="job-2")) is None
    assert use(feedback(kind="int4")) is None and use(feedback(block=16)) is None
    assert use(feedback(residual=f32([0.25] * 3))) is None
    assert use(feedback(residual=f32([0.25, np.nan, 0, 0]))) is None
    assert use(None) is None


def test_error_feedback_carries_what_one_round_could_not_send() -> None:
    """The same true delta every round: what arrives, summed, follows the sum of true deltas to within one
    quantization step (without feedback a small component below half a step would never arrive)."""
    k, n = KERNELS["numpy"], 16
    start = f32(np.zeros(n))
    delta = np.full(n, 1e-4, np.float32)
    delta[0] = 1.0  # sets the block's scale: 1e-4 is far below half a step (1/254)
    shape = layout(4 * n, [])
    settings = CompressionSettings("int8", 16)
    residual, sent = None, np.zeros(n)
    for _ in range(100):
        artifact, residual = compress_update(k, start, f32(delta), settings, shape, residual)
        sent += to_floats(decompress_update(k, start, artifact, settings, shape))
    assert np.allclose(sent[1:], 100 * 1e-4, rtol=0, atol=1 / 254)
    assert sent[1] > 0
    artifact, _ = compress_update(k, start, f32(delta), settings, shape, None)
    assert not to_floats(decompress_update(k, start, artifact, settings, shape))[1:].any()


def _assign(round_: int) -> Assign:
    chunk = ChunkRef("c0", "syn", 4, ArtifactRef("chunk", "c" * 64, 4))
    return Assign("job-1", round_, f"r{round_}-c000", f"r{round_}-c000-a1", ArtifactRef("checkpoint", "a" * 64, 64),
                  {}, 0, chunk)


def test_the_device_keeps_its_error_with_the_participation_and_drops_it_after_a_missed_round() -> None:
    async def run() -> None:
        storage = MemoryStorage()
        kernel = KERNELS["numpy"]
        start = f32(np.zeros(16))
        trained = f32(np.linspace(-1, 1, 16) + 1e-3)
        outcome = TrainOutcome(trained, {}, 4)
        settings = CompressionSettings("int4", 8)
        first = await UpdateCompressor(JobStore(storage), kernel).compress(_assign(1), settings, ModelAggregation(),
                                                                          start, outcome)
        stored = await storage.get("settings", FEEDBACK_KEY)
        assert stored["jobId"] == "job-1" and stored["round"] == 1 and len(stored["residual"]) == 64
        # A restarted device (a new compressor on the same store) adds it to its next round's delta.
        again = UpdateCompressor(JobStore(storage), kernel)
        second = await again.compress(_assign(2), settings, ModelAggregation(), start, outcome)
        assert second.compressed != first.compressed
        expected, _ = compress_update(kernel, start, trained, settings, layout(64, []), bytes(stored["residual"]))
        assert second.compressed == expected
        assert again.last_sizes == (64, len(expected))
        # Round 3 missed: round 4 starts from zero, as the first did.
        fourth = await again.compress(_assign(4), settings, ModelAggregation(), start, outcome)
        assert fourth.compressed == first.compressed

    asyncio.run(run())


def test_a_damaged_stored_error_is_set_aside_not_used() -> None:
    async def run() -> None:
        storage = MemoryStorage()
        await storage.put("settings", FEEDBACK_KEY, {"jobId": "job-1", "round": 1, "kind": "int9", "block": 8,
                                                     "residual": b"\0" * 64})
        compressor = UpdateCompressor(JobStore(storage), KERNELS["numpy"])
        out = await compressor.compress(_assign(2), CompressionSettings("int8", 8), ModelAggregation(),
                                        f32(np.zeros(16)), TrainOutcome(f32(np.ones(16)), {}, 4))
        assert out.compressed == compress_update(KERNELS["numpy"], f32(np.zeros(16)), f32(np.ones(16)),
                                                 CompressionSettings("int8", 8), layout(64, []), None)[0]
        assert await storage.keys("quarantine")

    asyncio.run(run())


# -------------------------------------------------------------- coordinator


def compressing_sim(settings: CompressionSettings, tamper: Any = None, **extra: Any) -> Sim:
    spec, store = dataset_spec(4, settings={"epochs": 1, "localEpochs": 1, "batchSize": 4,
                                            "coordinatorParticipates": False,
                                            "compression": settings.to_json(), **extra}, weight_count=40)
    sim = Sim.create(spec, store, round_timeout_ms=5_000)
    shape = layout(spec.weight_bytes, [])

    def compress(assign: Assign, start: bytes, default: TrainOutcome) -> TrainOutcome:
        artifact, _ = compress_update(NumpyKernel(), start, default.weights, settings, shape, None)
        return replace(default, compressed=artifact)

    for peer in ("p1", "p2"):
        sim.behaviour[peer] = compress
    if tamper is not None:
        sim.tamper["p1"] = tamper
    for peer in ("p1", "p2"):
        sim.join(peer)
    sim.coordinator.start(sim.now)
    sim.pump()
    return sim


def test_the_coordinator_averages_dequantized_updates_and_keeps_float32_checkpoints() -> None:
    sim = compressing_sim(INT8)
    sim.run_to_end()
    assert sim.coordinator.status == "completed" and sim.reasons() == []
    updates = [u for u in sim.messages(Update) if u.round == 1]
    assert {u.weights.kind for u in updates} == {"qdelta"}
    start = sim.checkpoint(0).weights
    shape = layout(len(start), [])
    decoded = sorted(((u.assignment_id, u.count, decompress_update(NumpyKernel(), start, sim.stores[p][u.weights.sha256],
                                                                   INT8, shape))
                      for p in ("p1", "p2") for u in sim.messages(Update, src=p) if u.round == 1), key=lambda c: c[0])
    from weei.core.aggregation.aggregate import fedavg
    assert sim.checkpoint(1).weights == fedavg(NumpyKernel(), decoded, len(start))
    assert sim.checkpoint(1).metadata.settings.compression == INT8


def test_robust_aggregation_sees_the_dequantized_updates() -> None:
    # A compressed update blown up 1000 times (its scales) is clipped by its norm like a float32 one would be.
    def blow_up(d: bytes) -> bytes:
        nb = struct.unpack_from("<I", d, 16)[0]
        scales = to_floats(d[HEADER_BYTES:HEADER_BYTES + 4 * nb]) * np.float32(1000)
        return d[:HEADER_BYTES] + scales.astype("<f4").tobytes() + d[HEADER_BYTES + 4 * nb:]

    sim = compressing_sim(INT8, _swap(blow_up), aggregation={"method": "fedavg", "normClip": 1})
    sim.run_to_end()
    assert sim.coordinator.status == "completed" and sim.reasons() == []
    robust = [log.details for _, log in sim.logs if log.event == "aggregation.robust"]
    assert robust and robust[0]["clipped"] == ["p1"], robust


def _swap(make: Any, kind: str = "qdelta") -> Any:
    state = {"done": False}

    def hook(message: Any, blobs: dict[str, bytes]) -> Any:
        if isinstance(message, Update) and not state["done"]:
            state["done"] = True
            data = make(blobs[message.weights.sha256])
            return [(replace(message, weights=ArtifactRef(kind, sha(data), len(data))), {sha(data): data})]
        return [(message, blobs)]

    return hook


COORDINATOR_REJECTIONS = [
    ("qdelta-truncated", _swap(lambda d: d[:-3])),
    ("qdelta-non-finite-scale", _swap(lambda d: _patch(d, HEADER_BYTES, f32([np.nan])))),
    ("qdelta-wrong-block-count", _swap(lambda d: _patch(d, 16, struct.pack("<I", 99)))),
    ("qdelta-block-mismatch", _swap(lambda d: _patch(d, 8, struct.pack("<I", 16)))),
    ("qdelta-codec-mismatch", _swap(lambda d: _patch(d, 5, b"\1"))),  # the job does not deflate
    ("non-finite-weights", _swap(lambda d: _patch(d, HEADER_BYTES, f32([3e38])))),  # finite scale, infinite weights
    ("wrong-kind", _swap(lambda d: f32(np.zeros(40)), kind="update")),
]


@pytest.mark.parametrize("code, hook", COORDINATOR_REJECTIONS, ids=[c for c, _ in COORDINATOR_REJECTIONS])
def test_a_bad_compressed_update_is_rejected_by_name_and_the_job_goes_on(code: str, hook: Any) -> None:
    sim = compressing_sim(INT8, hook)
    sim.run_to_end()
    assert sim.reasons()[0] == code
    assert sim.coordinator.status == "completed"


def test_a_float32_job_refuses_a_compressed_update() -> None:
    spec, store = dataset_spec(2, settings={"epochs": 1, "localEpochs": 1, "batchSize": 4,
                                            "coordinatorParticipates": False})
    sim = Sim.create(spec, store)
    sim.tamper["p1"] = _swap(lambda d: serialize_qdelta(8, 8, 16, f32([0.1, 0.1]), bytes(16), b""))
    for peer in ("p1", "p2"):
        sim.join(peer)
    sim.coordinator.start(sim.now)
    sim.pump()
    sim.run_to_end()
    assert sim.reasons()[0] == "wrong-kind"


# ------------------------------------------------------- a federated job


def test_a_digits_job_with_int8_updates_completes_in_process(tmp_path: Path) -> None:
    """Four controllers over the in-memory transport (the demo's path), the same seed with and without
    int8: the job completes, nothing is rejected, updates travel compressed and the loss stays close.
    Deflated codes are lossless: the same seed gives the same checkpoints to the bit with them, in fewer bytes."""
    from weei.demo.run import DEMO_JOBS, run_job

    digits = next(j for j in DEMO_JOBS if j.name == "digits")
    base = dict(digits.settings, epochs=1)
    plain = run_job(digits, tmp_path / "f32", stream=io.StringIO(), settings=base, seed=7)
    compressed = run_job(digits, tmp_path / "int8", stream=io.StringIO(),
                         settings={**base, "compression": {"kind": "int8", "block": 256}}, seed=7)
    assert compressed.rejected == 0 and len(compressed.values()) == len(plain.values())
    assert abs(compressed.values()[-1] - plain.values()[-1]) <= 0.01 * plain.values()[-1]
    last = sorted((tmp_path / "int8").rglob("*.weei-checkpoint"))[-1]
    assert read_checkpoint(last.read_bytes()).metadata.settings.compression == CompressionSettings("int8", 256)
    packed = run_job(digits, tmp_path / "deflate", stream=io.StringIO(),
                     settings={**base, "compression": {"kind": "int8", "block": 256, "deflate": True}}, seed=7)
    assert packed.rejected == 0 and packed.values() == compressed.values()
    assert packed.updates_sent[1] == compressed.updates_sent[1]
    assert packed.updates_sent[0] < 0.9 * compressed.updates_sent[0]
    ends = [read_checkpoint(sorted((tmp_path / d).rglob("*.weei-checkpoint"))[-1].read_bytes())
            for d in ("int8", "deflate")]
    assert ends[0].weights == ends[1].weights
    assert ends[1].metadata.settings.compression == CompressionSettings("int8", 256, True)
