"""numpy, native and wasm kernels give bit-identical bytes on random data.

Lengths are chosen around the SIMD width, the C tile (2048) and the numpy
block so every tail path runs; values include subnormals, signed zeros and
large magnitudes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weei.core.aggregation.aggregate import AggregationKernel, Segment
from weei.kernel.numpy_kernel import NumpyKernel


@pytest.fixture(scope="module")
def kernels() -> list[AggregationKernel]:
    from weei.kernel.native import NativeKernel
    from weei.kernel.wasm_kernel import WasmKernel

    return [NumpyKernel(block=1000), NativeKernel(), WasmKernel()]


def digest(*bufs: bytes) -> str:
    h = hashlib.sha256()
    for b in bufs:
        h.update(b)
    return h.hexdigest()


def random_f32(rng: np.random.Generator, n: int, spiky: bool = True) -> bytes:
    x = rng.standard_normal(n).astype("<f4")
    if spiky and n:
        # Sprinkle the awkward values: subnormals, signed zeros, big numbers.
        idx = rng.integers(0, n, size=max(1, n // 16))
        pool = np.array([0.0, -0.0, 1e-42, -3e-39, 1e30, -2.5e35, 7.0e-8], "<f4")
        x[idx] = rng.choice(pool, size=idx.shape[0])
    return x.tobytes()


def canon(*bufs: bytes) -> bytes:
    """The bytes with every NaN replaced by one pattern: NaN sign and payload
    differ between x86 and wasm (the core refuses NaN results anyway)."""
    out = []
    for b in bufs:
        x = np.frombuffer(b, "<u4").copy()
        x[np.isnan(np.frombuffer(b, "<f4"))] = 0x7FC00000
        out.append(x.tobytes())
    return b"".join(out)


def random_segments(rng: np.random.Generator, n: int) -> list[Segment]:
    cuts = sorted(set(int(c) for c in rng.integers(0, n + 1, size=6)) | {0, n})
    # Keep every other gap as trainable.
    return [(a, b) for j, (a, b) in enumerate(zip(cuts, cuts[1:])) if j % 2 == 0 and b > a]


LENGTHS = [1, 2, 3, 5, 7, 9, 17, 999, 1001, 2047, 2048, 2049, 4099, 65537]


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 7, 9])
def test_weighted_average_bit_identical(kernels: list[AggregationKernel], n: int, k: int) -> None:
    rng = np.random.default_rng(n * 31 + k)
    ups = [random_f32(rng, n) for _ in range(k)]
    counts = [int(c) for c in rng.integers(1, 10**6, size=k)]
    results = {digest(kern.weighted_average(ups, counts)) for kern in kernels}
    assert len(results) == 1


@pytest.mark.parametrize("n", LENGTHS)
def test_server_steps_bit_identical(kernels: list[AggregationKernel], n: int) -> None:
    rng = np.random.default_rng(n)
    start, avg = random_f32(rng, n, spiky=False), random_f32(rng, n, spiky=False)
    v = random_f32(rng, n)
    mv = random_f32(rng, n) + np.abs(np.frombuffer(random_f32(rng, n), "<f4")).tobytes()
    segs = random_segments(rng, n)
    m_results = {digest(*kern.fedavgm(start, avg, v, segs, 0.7, 0.9)) for kern in kernels}
    a_results = {digest(*kern.fedadam(start, avg, mv, segs, 0.01, 0.9, 0.99, 1e-3)) for kern in kernels}
    assert len(m_results) == 1 and len(a_results) == 1


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 300),
    st.integers(1, 6),
    st.integers(0, 2**32 - 1),
    st.floats(0, 10),
    st.floats(0, 0.999),
    st.floats(0, 1),
)
def test_random_everything_bit_identical(
    kernels: list[AggregationKernel], n: int, k: int, seed: int, lr: float, beta: float, eps: float
) -> None:
    rng = np.random.default_rng(seed)
    ups = [random_f32(rng, n) for _ in range(k)]
    counts = [int(c) for c in rng.integers(1, 2**40, size=k)]
    start = random_f32(rng, n, spiky=False)
    avgs = [kern.weighted_average(ups, counts) for kern in kernels]
    assert len(set(avgs)) == 1
    avg = avgs[0]
    segs = random_segments(rng, n)
    v = random_f32(rng, n)
    mv = random_f32(rng, n) + np.abs(np.frombuffer(random_f32(rng, n), "<f4")).tobytes()
    assert len({canon(*kern.fedavgm(start, avg, v, segs, lr, beta)) for kern in kernels}) == 1
    assert len({canon(*kern.fedadam(start, avg, mv, segs, lr, beta, beta, eps)) for kern in kernels}) == 1


@pytest.mark.parametrize("n", [1, 5, 1023, 1024, 1025, 5000])
def test_first_non_finite(kernels: list[AggregationKernel], n: int) -> None:
    rng = np.random.default_rng(n)
    x = np.frombuffer(random_f32(rng, n), "<f4").copy()
    assert {kern.first_non_finite(x.tobytes()) for kern in kernels} == {-1}
    for bad in (np.inf, -np.inf, np.nan):
        y = x.copy()
        pos = sorted(int(p) for p in rng.integers(0, n, size=2))
        y[pos] = bad
        assert {kern.first_non_finite(y.tobytes()) for kern in kernels} == {pos[0]}


def test_segments_leave_the_rest_untouched(kernels: list[AggregationKernel]) -> None:
    rng = np.random.default_rng(0)
    n = 50
    start, avg, v = (random_f32(rng, n, spiky=False) for _ in range(3))
    for kern in kernels:
        w, nv = kern.fedavgm(start, avg, v, [(10, 20)], 1.0, 0.9)
        assert w[:40] == avg[:40] and w[80:] == avg[80:] and w[40:80] != avg[40:80]
        assert nv[:40] == v[:40] and nv[80:] == v[80:]
        assert kern.fedavgm(start, avg, v, [], 1.0, 0.9) == (avg, v)


def test_numpy_block_size_does_not_change_bits() -> None:
    rng = np.random.default_rng(5)
    n = 10007
    ups = [random_f32(rng, n) for _ in range(5)]
    counts = [3, 9, 1, 4, 4]
    assert len({NumpyKernel(block=b).weighted_average(ups, counts) for b in (1, 7, 4096, 65536)}) == 1


def test_the_wasm_kernel_in_wasmtime_has_the_whole_wasm32_address_space() -> None:
    """Not the 1 GiB store cap that sandboxes models: 16 updates of 16M weights (bench_aggregate) need more.
    Growing the memory only reserves it, so this touches no gigabytes."""
    from weei.kernel.wasm_kernel import WasmKernel

    kern = WasmKernel()
    assert kern._alloc(3 << 29) != 0  # 1.5 GiB
    with pytest.raises(MemoryError, match="cannot allocate"):
        kern._alloc(3 << 30)  # 3 GiB more: past 4 GiB


def test_wasm_kernel_reuses_its_region() -> None:
    from weei.kernel.wasm_kernel import WasmKernel

    kern = WasmKernel()
    rng = np.random.default_rng(2)
    ups = [random_f32(rng, 100000) for _ in range(3)]
    first = kern.weighted_average(ups, [1, 2, 3])
    for _ in range(5):
        assert kern.weighted_average(ups, [1, 2, 3]) == first


# --- X25519 (secure aggregation's key agreement): the C kernel against the pure-Python ladder ---------------------

P25519 = 2**255 - 19
#: u-coordinates at the edges of the C kernel's arithmetic: the low-order points (0, 1, p - 1 and the two of order
#: 8), the non-canonical encodings p, p + 1 and 2^255 - 1 (reduced mod p), the top bit set (ignored), all ones.
EDGE_US = [0, 1, P25519 - 1, P25519, P25519 + 1, P25519 - 2, 2**255 - 1, 2**256 - 1, 2**255, 2**255 + 9, 9,
           325606250916557431795983626356110631294008115727848805560023387167927233504,
           39382357235489614581723060781553021112529911719440698176882885853963445705823,
           2**254, 2**26 - 1, 2**51, (1 << 255) - 20]


def _kernel_x25519s(kernels: list[AggregationKernel]) -> list[Callable[[bytes, bytes], bytes]]:
    return [kern.x25519 for kern in kernels]  # type: ignore[attr-defined]


@pytest.mark.parametrize("u", EDGE_US)
def test_x25519_bit_identical_at_the_edges(kernels: list[AggregationKernel], u: int) -> None:
    rng = np.random.default_rng(u % 2**32)
    for k in (bytes(32), b"\xff" * 32, rng.bytes(32), rng.bytes(32)):
        outs = {f(k, u.to_bytes(32, "little")) for f in _kernel_x25519s(kernels)}
        assert len(outs) == 1


@settings(max_examples=150, deadline=None)
@given(st.binary(min_size=32, max_size=32), st.binary(min_size=32, max_size=32))
def test_x25519_random_inputs_bit_identical(kernels: list[AggregationKernel], k: bytes, u: bytes) -> None:
    outs = {f(k, u) for f in _kernel_x25519s(kernels)}
    assert len(outs) == 1


def test_x25519_leaves_staged_wasm_buffers_alone() -> None:
    # The wasm kernel's X25519 has its own buffer: a key agreement between staging an average and running it
    # changes nothing.
    from weei.kernel.wasm_kernel import WasmKernel

    kern = WasmKernel()
    rng = np.random.default_rng(9)
    ups = [random_f32(rng, 3000) for _ in range(3)]
    expected = kern.weighted_average(ups, [1, 2, 3])
    staged = kern.stage_average(ups, [1, 2, 3])
    kern.x25519(rng.bytes(32), rng.bytes(32))
    kern.run_average(staged)
    assert kern.read(staged.out_ptr, staged.n_elems * 4) == expected
