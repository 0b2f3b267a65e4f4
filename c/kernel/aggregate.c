/*
 * Weei aggregation kernel: the numeric hot loops of a round's aggregation.
 *
 * One source, two builds (both with -ffp-contract=off, so no FMA is ever
 * formed and every product and sum is rounded on its own, exactly as the
 * reference in weei/core/aggregation/aggregate.py and the numpy oracle compute it):
 *
 *   wasm32:  clang --target=wasm32 -O3 -msimd128 -mbulk-memory -nostdlib
 *            -ffp-contract=off -fno-math-errno -Wl,--no-entry -o aggregate.wasm
 *   native:  clang -O3 -march=native -ffp-contract=off -fno-math-errno
 *            -shared -fPIC -o aggregate.so
 *
 * The exact precision of every operation is documented in the module
 * docstring of weei/core/aggregation/aggregate.py; the comments here only point at it.
 * Only IEEE-754 basic operations are used (float->double is exact,
 * double->float rounds to nearest-even, sqrt is correctly rounded), so the
 * bits are the same on every platform.
 *
 * No libc: the wasm build exports its memory and a bump region allocator
 * (weei_alloc / weei_reset) so the host can place buffers.
 */

#include <stddef.h>
#include <stdint.h>

#if defined(__wasm__)
#define WEEI_EXPORT(name) __attribute__((export_name(#name), visibility("default")))
#else
#define WEEI_EXPORT(name) __attribute__((visibility("default")))
#endif

/* Elements per tile of the weighted average: 2048 float64 accumulators are
 * 16 KiB, which stays in L1 while every update streams through it once. */
#define WEEI_TILE 2048

/* ---------------------------------------------------------------- region */

#if defined(__wasm__)
extern unsigned char __heap_base;
static uintptr_t weei_top = 0;
static uint32_t weei_colour = 0;
/* Block colouring (see weei_alloc): blocks of at least WEEI_COLOUR_MIN bytes
 * start at (k mod 16) * WEEI_COLOUR_STEP modulo WEEI_COLOUR_WINDOW. */
#define WEEI_COLOUR_MIN (1u << 20)
#define WEEI_COLOUR_WINDOW ((uint64_t)1u << 20)
#define WEEI_COLOUR_STEP ((uint64_t)64u << 10)

/* Returns a 64-byte aligned block of `size` bytes, or 0 when memory cannot
 * grow. Blocks live until weei_reset(); there is no per-block free because
 * a round's buffers are all released together. */
WEEI_EXPORT(weei_alloc) uint32_t weei_alloc(uint32_t size) {
    if (weei_top == 0) weei_top = (uintptr_t)&__heap_base;
    uint64_t start = ((uint64_t)weei_top + 63u) & ~(uint64_t)63u;
    if (size >= WEEI_COLOUR_MIN) {
        /* Colouring: the k-th large block since weei_reset starts at
         * (k mod 16) * 64 KiB modulo 1 MiB. The host places the updates of
         * a round back to back, so updates whose size is a multiple of a
         * large power of two (e.g. 64 MiB) would all start at the same
         * offset modulo that power, and streaming them side by side then
         * conflicts in the caches and DRAM banks: in wasmtime, 16 updates of
         * 16M float32 merged at ~0.6x memcpy uncoloured and ~1.1x coloured,
         * with the same bits. Costs < 1 MiB per block of >= 1 MiB. */
        uint64_t colour = (uint64_t)(weei_colour++ & 15u) * WEEI_COLOUR_STEP;
        start += (colour - start) & (WEEI_COLOUR_WINDOW - 1u);
    }
    uint64_t end = start + (uint64_t)size;
    if (end > 0xFFFFFFFFull) return 0;
    uint64_t have = (uint64_t)__builtin_wasm_memory_size(0) * 65536ull;
    if (end > have) {
        uint64_t pages = (end - have + 65535ull) / 65536ull;
        if (__builtin_wasm_memory_grow(0, (size_t)pages) == (size_t)-1) return 0;
    }
    weei_top = (uintptr_t)end;
    return (uint32_t)start;
}

/* Releases every block handed out by weei_alloc (memory does not shrink). */
WEEI_EXPORT(weei_reset) void weei_reset(void) {
    weei_top = (uintptr_t)&__heap_base;
    weei_colour = 0;
}
#endif

/* ------------------------------------------------------ weighted average */

/*
 * One pass of up to four updates over a tile (m is a literal after
 * inlining, so each variant is its own straight loop):
 *   first: a = c0*x0[j]            else: a = acc[j] + c0*x0[j]
 *   then   a = a + c1*x1[j], a + c2*x2[j], a + c3*x3[j]   (k < m, in order)
 *   last:  o[j] = (float)(a / total)  else: acc[j] = a
 */
static inline __attribute__((always_inline)) void
avg_pass_scalar(double *restrict acc, const float *const *xs, const double *c, const int m,
                const int first, const int last, double total, float *restrict o, uint32_t j0,
                uint32_t len) {
    for (uint32_t j = j0; j < len; j++) {
        double a = first ? c[0] * (double)xs[0][j] : acc[j] + c[0] * (double)xs[0][j];
        if (m > 1) a = a + c[1] * (double)xs[1][j];
        if (m > 2) a = a + c[2] * (double)xs[2][j];
        if (m > 3) a = a + c[3] * (double)xs[3][j];
        if (last)
            o[j] = (float)(a / total);
        else
            acc[j] = a;
    }
}

#if defined(__wasm_simd128__)
#include <wasm_simd128.h>

/* clang 14 does not vectorise the float32 store of the last pass for wasm,
 * and splits the loads badly; written out, four elements per step are two
 * f64x2 accumulators. Same operations, same order as the scalar loop. */
static inline __attribute__((always_inline)) void
avg_pass(double *restrict acc, const float *const *xs, const double *c, const int m,
         const int first, const int last, double total, float *restrict o, uint32_t len) {
    const v128_t c0 = wasm_f64x2_splat(c[0]);
    const v128_t c1 = wasm_f64x2_splat(m > 1 ? c[1] : 0.0);
    const v128_t c2 = wasm_f64x2_splat(m > 2 ? c[2] : 0.0);
    const v128_t c3 = wasm_f64x2_splat(m > 3 ? c[3] : 0.0);
    const v128_t tv = wasm_f64x2_splat(total);
    const float *x0 = xs[0], *x1 = xs[m > 1 ? 1 : 0], *x2 = xs[m > 2 ? 2 : 0], *x3 = xs[m > 3 ? 3 : 0];
    uint32_t j = 0;
    /* One 128-bit load per four floats; the high pair is moved down with an
     * i64x2 shuffle (one pshufd in wasmtime). Measured faster in wasmtime
     * than two load64_zero, whose address arithmetic Cranelift does not fold. */
#define WEEI_LO(p) wasm_f64x2_promote_low_f32x4(wasm_v128_load(p))
#define WEEI_HI(p) wasm_f64x2_promote_low_f32x4(wasm_i64x2_shuffle(wasm_v128_load(p), wasm_v128_load(p), 1, 1))
    for (; j + 4 <= len; j += 4) {
        v128_t a0, a1;
        if (first) {
            a0 = wasm_f64x2_mul(c0, WEEI_LO(x0 + j));
            a1 = wasm_f64x2_mul(c0, WEEI_HI(x0 + j));
        } else {
            a0 = wasm_f64x2_add(wasm_v128_load(acc + j), wasm_f64x2_mul(c0, WEEI_LO(x0 + j)));
            a1 = wasm_f64x2_add(wasm_v128_load(acc + j + 2), wasm_f64x2_mul(c0, WEEI_HI(x0 + j)));
        }
        if (m > 1) {
            a0 = wasm_f64x2_add(a0, wasm_f64x2_mul(c1, WEEI_LO(x1 + j)));
            a1 = wasm_f64x2_add(a1, wasm_f64x2_mul(c1, WEEI_HI(x1 + j)));
        }
        if (m > 2) {
            a0 = wasm_f64x2_add(a0, wasm_f64x2_mul(c2, WEEI_LO(x2 + j)));
            a1 = wasm_f64x2_add(a1, wasm_f64x2_mul(c2, WEEI_HI(x2 + j)));
        }
        if (m > 3) {
            a0 = wasm_f64x2_add(a0, wasm_f64x2_mul(c3, WEEI_LO(x3 + j)));
            a1 = wasm_f64x2_add(a1, wasm_f64x2_mul(c3, WEEI_HI(x3 + j)));
        }
        if (last) {
            v128_t f0 = wasm_f32x4_demote_f64x2_zero(wasm_f64x2_div(a0, tv));
            v128_t f1 = wasm_f32x4_demote_f64x2_zero(wasm_f64x2_div(a1, tv));
            wasm_v128_store(o + j, wasm_i32x4_shuffle(f0, f1, 0, 1, 4, 5));
        } else {
            wasm_v128_store(acc + j, a0);
            wasm_v128_store(acc + j + 2, a1);
        }
    }
#undef WEEI_LO
#undef WEEI_HI
    avg_pass_scalar(acc, xs, c, m, first, last, total, o, j, len);
}
#else
static inline __attribute__((always_inline)) void
avg_pass(double *restrict acc, const float *const *xs, const double *c, const int m,
         const int first, const int last, double total, float *restrict o, uint32_t len) {
    avg_pass_scalar(acc, xs, c, m, first, last, total, o, 0, len);
}
#endif

/* Dispatch on the run-time (m, first, last) to a specialised pass. */
static void avg_pass_any(double *acc, const float *const *xs, const double *c, uint32_t m,
                         int first, int last, double total, float *o, uint32_t len) {
#define WEEI_CASE(M)                                                                 \
    case M:                                                                          \
        if (first && last) avg_pass(acc, xs, c, M, 1, 1, total, o, len);             \
        else if (first) avg_pass(acc, xs, c, M, 1, 0, total, o, len);                \
        else if (last) avg_pass(acc, xs, c, M, 0, 1, total, o, len);                 \
        else avg_pass(acc, xs, c, M, 0, 0, total, o, len);                           \
        break;
    switch (m) {
        WEEI_CASE(1)
        WEEI_CASE(2)
        WEEI_CASE(3)
        WEEI_CASE(4)
    }
#undef WEEI_CASE
}

/*
 * out[i] = (float)( (((c0*x0[i]) + c1*x1[i]) + ... + c(n-1)*x(n-1)[i]) / total )
 *
 * updates[k] points at n_elems float32 of update k, already in canonical
 * (assignment id) order; counts[k] is its example count as a double (exact:
 * the host refuses counts or a total above 2^53), total = sum of counts.
 * The sum is formed left to right in that order in float64, so arrival order
 * never changes a bit.
 *
 * Each update is read once: the elements are walked tile by tile, and the
 * tile's float64 accumulators stay in L1 while the updates stream past, four
 * at a time (still added one after another, in order); the division and the
 * float32 store are fused into the last pass, so up to four updates take a
 * single pass and never touch the tile.
 */
WEEI_EXPORT(weei_average)
void weei_average(const float *const *updates, const double *counts, uint32_t n_updates,
                  uint32_t n_elems, float *out) {
    double acc[WEEI_TILE] __attribute__((aligned(64)));
    if (n_updates == 0) return; /* the host refuses this before calling */
    /* Integers <= 2^53 sum exactly in float64, in any order. */
    double total = 0.0;
    for (uint32_t k = 0; k < n_updates; k++) total += counts[k];
    for (uint32_t base = 0; base < n_elems; base += WEEI_TILE) {
        uint32_t len = n_elems - base < WEEI_TILE ? n_elems - base : WEEI_TILE;
        const float *xs[4];
        for (uint32_t k = 0; k < n_updates; k += 4) {
            uint32_t m = n_updates - k < 4 ? n_updates - k : 4;
            for (uint32_t q = 0; q < m; q++) xs[q] = updates[k + q] + base;
            avg_pass_any(acc, xs, counts + k, m, k == 0, k + m == n_updates, total, out + base, len);
        }
    }
}

/* -------------------------------------------------------------- FedAvgM */

/*
 * Every export takes only i32 arguments (pointers, sizes): float64
 * parameters come through memory, so a host that can pass only i32 (the
 * Engine protocol of weei.runtime) drives it. `segs` holds n_segs pairs of
 * element indices [lo, hi), the trainable ranges; elements outside them are
 * not touched (the host pre-fills `out` with the average).
 */

/*
 * params = {lr, mu, nesterov}. Over each segment, with d = (double)avg - (double)start:
 *   v   <- (float)( mu*(double)v + d )
 *   out <- (float)( (double)start + lr*(double)v )               (v as just stored)
 * Reddi et al. 2021 / Hsu et al. 2019 server momentum; with nesterov != 0
 * (Sutskever et al. 2013 as PyTorch's SGD writes it; DiLoCo's outer step):
 *   out <- (float)( (double)start + lr*(d + mu*(double)v) )
 */
static inline __attribute__((always_inline)) void fedavgm_range(const float *restrict start, const float *restrict avg,
                          float *restrict v, float *restrict out, uint32_t lo, uint32_t hi,
                          double lr, double mu, const int nesterov) {
    for (uint32_t i = lo; i < hi; i++) {
        double s = (double)start[i];
        double d = (double)avg[i] - s;
        float nv = (float)(mu * (double)v[i] + d);
        v[i] = nv;
        out[i] = nesterov ? (float)(s + lr * (d + mu * (double)nv)) : (float)(s + lr * (double)nv);
    }
}

WEEI_EXPORT(weei_fedavgm)
void weei_fedavgm(const float *start, const float *avg, float *v, float *out,
                  const uint32_t *segs, uint32_t n_segs, const double *params) {
    double lr = params[0], mu = params[1];
    for (uint32_t k = 0; k < n_segs; k++) {
        if (params[2] != 0.0)
            fedavgm_range(start, avg, v, out, segs[2 * k], segs[2 * k + 1], lr, mu, 1);
        else
            fedavgm_range(start, avg, v, out, segs[2 * k], segs[2 * k + 1], lr, mu, 0);
    }
}

/* -------------------------------------------------------------- FedAdam */

/*
 * params = {lr, b1, one_b1, b2, one_b2, eps}, where one_b1 = 1 - b1 and
 * one_b2 = 1 - b2 are computed by the host in float64. Over each segment,
 * Reddi et al. 2021, Algorithm 2 (FedAdam, no bias correction), with
 * d = (double)avg - (double)start:
 *   m   <- (float)( b1*(double)m + one_b1*d )
 *   v   <- (float)( b2*(double)v + one_b2*(d*d) )
 *   out <- (float)( (double)start + (lr*(double)m) / (sqrt((double)v) + eps) )
 * except that a zero denominator (epsilon 0 on a weight no update moved: 0/0)
 * takes a zero step, out <- (float)((double)start + 0.0), as every kernel does.
 */
static void fedadam_range(const float *restrict start, const float *restrict avg,
                          float *restrict m, float *restrict v, float *restrict out, uint32_t lo,
                          uint32_t hi, double lr, double b1, double one_b1, double b2,
                          double one_b2, double eps) {
    for (uint32_t i = lo; i < hi; i++) {
        double s = (double)start[i];
        double d = (double)avg[i] - s;
        float nm = (float)(b1 * (double)m[i] + one_b1 * d);
        float nv = (float)(b2 * (double)v[i] + one_b2 * (d * d));
        m[i] = nm;
        v[i] = nv;
        double den = __builtin_sqrt((double)nv) + eps;
        out[i] = (float)(s + (den != 0.0 ? (lr * (double)nm) / den : 0.0));
    }
}

WEEI_EXPORT(weei_fedadam)
void weei_fedadam(const float *start, const float *avg, float *m, float *v, float *out,
                  const uint32_t *segs, uint32_t n_segs, const double *params) {
    for (uint32_t k = 0; k < n_segs; k++)
        fedadam_range(start, avg, m, v, out, segs[2 * k], segs[2 * k + 1], params[0], params[1],
                      params[2], params[3], params[4], params[5]);
}

/* ------------------------------------------------------- finiteness check */

/* Index of the first NaN or infinity among x[0..n), or -1 if all are finite.
 * Blocks are tested with a branch-free OR (vectorises); only a block that
 * holds a non-finite value is scanned element by element. */
WEEI_EXPORT(weei_first_non_finite)
int32_t weei_first_non_finite(const float *x, uint32_t n) {
    const uint32_t *bits = (const uint32_t *)x;
    for (uint32_t base = 0; base < n; base += 1024) {
        uint32_t len = n - base < 1024 ? n - base : 1024;
        uint32_t any = 0;
        for (uint32_t j = 0; j < len; j++)
            any |= (uint32_t)((bits[base + j] & 0x7f800000u) == 0x7f800000u);
        if (any) {
            for (uint32_t j = 0; j < len; j++)
                if ((bits[base + j] & 0x7f800000u) == 0x7f800000u) return (int32_t)(base + j);
        }
    }
    return -1;
}

/* ---------------------------------------------------- robust aggregation */

/*
 * Squared norm of a contribution's delta (weei/core/aggregation/robust.py):
 *   d_i  = (double)x[i] - (double)start[i];   sq_i = d_i * d_i
 *   lane[j] = sq_j + sq_(j+8) + sq_(j+16) + ...   (j = 0..7, in index order)
 *   out[0]  = ((lane0 + lane1) + lane2) + ... + lane7
 * Eight lanes keep the sum vectorisable while fixing the order (the numpy
 * oracle forms the same lanes with a sequential cumulative sum). Finite
 * float32 inputs never overflow: |d| < 2^129, d*d < 2^258, n < 2^31.
 */
#define WEEI_LANES 8
WEEI_EXPORT(weei_delta_sq_norm)
void weei_delta_sq_norm(const float *start, const float *x, uint32_t n, double *out) {
    double lane[WEEI_LANES] = {0, 0, 0, 0, 0, 0, 0, 0};
    uint32_t i = 0;
    for (; i + WEEI_LANES <= n; i += WEEI_LANES)
        for (uint32_t j = 0; j < WEEI_LANES; j++) {
            double d = (double)x[i + j] - (double)start[i + j];
            lane[j] = lane[j] + d * d;
        }
    for (uint32_t j = 0; i + j < n; j++) {
        double d = (double)x[i + j] - (double)start[i + j];
        lane[j] = lane[j] + d * d;
    }
    double total = lane[0];
    for (uint32_t j = 1; j < WEEI_LANES; j++) total = total + lane[j];
    out[0] = total;
}

/* Norm clipping: out[i] = (float)( s + f*((double)x[i] - s) ), s = (double)start[i],
 * with f = params[0] in (0, 1] computed by the host. */
WEEI_EXPORT(weei_scale_delta)
void weei_scale_delta(const float *start, const float *x, uint32_t n, const double *params, float *out) {
    double f = params[0];
    for (uint32_t i = 0; i < n; i++) {
        double s = (double)start[i];
        out[i] = (float)(s + f * ((double)x[i] - s));
    }
}

/* A float's bits as an int whose order is the float order, with -0 < +0
 * (a total order, so which zero is trimmed never depends on the sort). */
static inline int32_t weei_key(float v) {
    int32_t b;
    __builtin_memcpy(&b, &v, 4);
    return b ^ (int32_t)(((uint32_t)(b >> 31)) >> 1);
}

/*
 * Coordinate-wise trimmed mean: per element i, the n_updates values
 * updates[k][i] sorted by weei_key ascending into v[0..n), then
 *   acc = (double)v[trim];  acc = acc + (double)v[k]  (k = trim+1 .. n-trim-1)
 *   out[i] = (float)( acc / (double)(n - 2*trim) )
 * The median is trim = (n-1)/2. Unweighted: counts do not enter.
 *
 * The sort is by rank, a tile of WEEI_RANK_TILE elements at a time: value k's
 * rank is the number of values below it plus the equal ones of lower index
 * (a permutation; equal keys are equal bits, so ties cannot change a sum).
 * The N^2 comparisons run branch-free across the tile and vectorise; an
 * insertion sort per element was 3-5x slower, on branch mispredictions.
 * `scratch` holds weei_trimmed_scratch(n_updates) bytes.
 */
#define WEEI_RANK_TILE 256u

WEEI_EXPORT(weei_trimmed_scratch)
uint32_t weei_trimmed_scratch(uint32_t n_updates) {
    return (2u * WEEI_RANK_TILE * n_updates + n_updates) * 4u;
}

WEEI_EXPORT(weei_trimmed_mean)
void weei_trimmed_mean(const float *const *updates, uint32_t n_updates, uint32_t n_elems,
                       uint32_t trim, int32_t *scratch, float *out) {
    const uint32_t n = n_updates, T = WEEI_RANK_TILE;
    if (n == 0 || 2 * trim >= n) return; /* the host refuses this */
    int32_t *keys = scratch, *rank = scratch + n * T, *sorted = scratch + 2 * n * T;
    double kept = (double)(n - 2 * trim);
    for (uint32_t base = 0; base < n_elems; base += T) {
        uint32_t len = n_elems - base < T ? n_elems - base : T;
        for (uint32_t k = 0; k < n; k++) {
            const float *x = updates[k] + base;
            int32_t *kk = keys + k * T, *rk = rank + k * T;
            for (uint32_t t = 0; t < len; t++) {
                kk[t] = weei_key(x[t]);
                rk[t] = 0;
            }
        }
        for (uint32_t k = 0; k < n; k++) {
            const int32_t *kk = keys + k * T;
            int32_t *restrict rk = rank + k * T;
            for (uint32_t j = 0; j < n; j++) {
                const int32_t *kj = keys + j * T;
                if (j < k)
                    for (uint32_t t = 0; t < len; t++) rk[t] += kj[t] <= kk[t];
                else if (j > k)
                    for (uint32_t t = 0; t < len; t++) rk[t] += kj[t] < kk[t];
            }
        }
        for (uint32_t t = 0; t < len; t++) {
            for (uint32_t k = 0; k < n; k++) sorted[rank[k * T + t]] = keys[k * T + t];
            double acc = 0.0;
            for (uint32_t k = trim; k < n - trim; k++) {
                int32_t b = sorted[k] ^ (int32_t)(((uint32_t)(sorted[k] >> 31)) >> 1);
                float v;
                __builtin_memcpy(&v, &b, 4);
                acc = k == trim ? (double)v : acc + (double)v;
            }
            out[base + t] = (float)(acc / kept);
        }
    }
}

/* ------------------------------------------------- compressed updates */

/*
 * Block quantization of a participant's delta with error feedback
 * (weei/core/aggregation/compression.py; the format is docs/wire.md,
 * "Compressed updates"). Over n contiguous elements (the trainable ones,
 * gathered by the host), q = 127 (int8) or 7 (int4):
 *   t_i    = ((double)x[i] - (double)s[i]) + (double)e[i]
 *   amax_b = max |t_i| over the block (float64)
 *   sc_b   = (float)(amax_b / q)
 *   c_i    = sc_b == 0 ? 0 : clamp(rint(t_i / (double)sc_b), -q, q)    (rint: nearest-even)
 *   e[i]   = (float)(t_i - (double)sc_b * c_i)                         (the error kept locally)
 * int8 codes are one signed byte each; int4 codes are signed nibbles, the
 * element of even index in the low nibble, a last odd nibble padded with 0.
 * The product of a float32 and a code of at most 8 bits is exact in float64.
 */
static inline void weei_put_code(uint8_t *codes, uint32_t i, int32_t c, uint32_t bits) {
    if (bits == 8)
        codes[i] = (uint8_t)(int8_t)c;
    else if (i & 1u)
        codes[i >> 1] = (uint8_t)(codes[i >> 1] | (((uint32_t)c & 15u) << 4));
    else
        codes[i >> 1] = (uint8_t)((uint32_t)c & 15u);
}

static inline int32_t weei_get_code(const uint8_t *codes, uint32_t i, uint32_t bits) {
    if (bits == 8) return (int32_t)(int8_t)codes[i];
    int32_t v = (int32_t)((codes[i >> 1] >> ((i & 1u) * 4u)) & 15u);
    return (v ^ 8) - 8;
}

WEEI_EXPORT(weei_quantize)
void weei_quantize(const float *s, const float *x, float *e, uint32_t n, uint32_t block, uint32_t bits,
                   float *scales, uint8_t *codes) {
    const double q = bits == 8 ? 127.0 : 7.0;
    for (uint32_t lo = 0, b = 0; lo < n; lo += block, b++) {
        uint32_t hi = n - lo < block ? n : lo + block;
        double amax = 0.0;
        for (uint32_t i = lo; i < hi; i++) {
            double t = ((double)x[i] - (double)s[i]) + (double)e[i];
            double a = t < 0.0 ? -t : t;
            amax = a > amax ? a : amax;
        }
        float sc = (float)(amax / q);
        double scd = (double)sc;
        scales[b] = sc;
        for (uint32_t i = lo; i < hi; i++) {
            double t = ((double)x[i] - (double)s[i]) + (double)e[i];
            double r = 0.0;
            if (sc != 0.0f) {
                r = __builtin_rint(t / scd);
                r = r > q ? q : r < -q ? -q : r;
            }
            e[i] = (float)(t - scd * r);
            weei_put_code(codes, i, (int32_t)r, bits);
        }
    }
}

/* The coordinator's side: out[i] = (float)((double)s[i] + (double)sc_b * c_i). */
WEEI_EXPORT(weei_dequantize)
void weei_dequantize(const float *s, const float *scales, const uint8_t *codes, uint32_t n, uint32_t block,
                     uint32_t bits, float *out) {
    for (uint32_t lo = 0, b = 0; lo < n; lo += block, b++) {
        uint32_t hi = n - lo < block ? n : lo + block;
        double scd = (double)scales[b];
        if (bits == 8) {
            for (uint32_t i = lo; i < hi; i++)
                out[i] = (float)((double)s[i] + scd * (double)(int8_t)codes[i]);
        } else {
            /* Unpacked to bytes a tile at a time, then the int8 loop: both loops vectorise, where
             * one loop with per-nibble index arithmetic did not (int4 took twice int8's time). */
            int8_t tmp[256];
            for (uint32_t t0 = lo; t0 < hi; t0 += 256) {
                uint32_t len = hi - t0 < 256 ? hi - t0 : 256;
                if ((t0 & 1u) == 0) {
                    const uint8_t *bytes = codes + (t0 >> 1);
                    for (uint32_t p = 0; p < len / 2; p++) {
                        tmp[2 * p] = (int8_t)((int32_t)((bytes[p] & 15u) ^ 8u) - 8);
                        tmp[2 * p + 1] = (int8_t)((int32_t)((bytes[p] >> 4) ^ 8u) - 8);
                    }
                    if (len & 1u) tmp[len - 1] = (int8_t)weei_get_code(codes, t0 + len - 1, 4);
                } else {
                    for (uint32_t p = 0; p < len; p++) tmp[p] = (int8_t)weei_get_code(codes, t0 + p, 4);
                }
                for (uint32_t p = 0; p < len; p++)
                    out[t0 + p] = (float)((double)s[t0 + p] + scd * (double)tmp[p]);
            }
        }
    }
}

/* ---------------------------------------------------------------- X25519 */

/*
 * X25519 (RFC 7748, section 5): the key agreement of secure aggregation
 * (weei/core/privacy/secagg.py), whose pure-Python ladder
 * (weei/core/privacy/x25519.py) is the oracle these bytes are tested
 * against. A field element mod p = 2^255 - 19 is ten signed limbs of 26 and
 * 25 bits alternately (radix 2^25.5, as in curve25519-donna and ref10),
 * each held in an int64: a product of two limbs and the sum of a row fit
 * in 64 bits, so no 128-bit integer is needed (wasm32 with -nostdlib has
 * no __int128 helpers). Constant time: the ladder swaps with masks, every
 * loop runs a fixed number of times, nothing branches or indexes on a
 * secret.
 *
 * Bounds: fe_carry leaves every limb in [0, 2^26) (h1 a little above 2^25);
 * a sum or difference of two carried elements is under 2^27 per limb, so a
 * product term is under 2^54, a row of ten under 2^58, and a row plus 19
 * times a wrapped row under 2^63.
 */

typedef int64_t weei_fe[10];

/* Every loop over limbs is unrolled into straight-line code: the bounds are constants, and the vectorizer's
 * gathers over ten limbs are slower than scalar multiplies. */
#define WEEI_UNROLL _Pragma("clang loop unroll(full) vectorize(disable)")

static const int weei_fe_width[10] = {26, 25, 26, 25, 26, 25, 26, 25, 26, 25};

/* One floor carry from limb i (w bits) to limb i + 1. */
#define WEEI_FE_CARRY(h, i, w)                     \
    do {                                           \
        int64_t c_ = (h)[i] >> (w);                \
        (h)[(i) + 1] += c_;                        \
        (h)[i] -= c_ * ((int64_t)1 << (w));        \
    } while (0)

/* Floor carries up the limbs, the top one wrapping to h0 times 19 (2^255 = 19 mod p), then h0 once more. */
static inline void weei_fe_carry(weei_fe h) {
    WEEI_FE_CARRY(h, 0, 26);
    WEEI_FE_CARRY(h, 1, 25);
    WEEI_FE_CARRY(h, 2, 26);
    WEEI_FE_CARRY(h, 3, 25);
    WEEI_FE_CARRY(h, 4, 26);
    WEEI_FE_CARRY(h, 5, 25);
    WEEI_FE_CARRY(h, 6, 26);
    WEEI_FE_CARRY(h, 7, 25);
    WEEI_FE_CARRY(h, 8, 26);
    int64_t c = h[9] >> 25;
    h[9] -= c * ((int64_t)1 << 25);
    h[0] += 19 * c;
    WEEI_FE_CARRY(h, 0, 26);
}

/* h = f g. Limbs i and j weigh 2^ceil(25.5 i) and 2^ceil(25.5 j): their product weighs twice
 * 2^ceil(25.5 (i + j)) when both are odd; rows i + j >= 10 wrap to i + j - 10 times 19. Each row is a sum of
 * products first and then one multiplication by 19 (the loops have constant bounds: clang unrolls them). */
static inline void weei_fe_mul(weei_fe h, const weei_fe f, const weei_fe g) {
    int64_t f2[10], r[10];
    WEEI_UNROLL for (int i = 0; i < 10; i++) f2[i] = f[i] * (1 + (i & 1));
    WEEI_UNROLL for (int k = 0; k < 10; k++) {
        int64_t lo = 0, hi = 0;
        WEEI_UNROLL for (int i = 0; i <= k; i++) lo += ((k & 1) ? f[i] : f2[i]) * g[k - i];
        WEEI_UNROLL for (int i = k + 1; i < 10; i++) hi += ((k & 1) ? f[i] : f2[i]) * g[k + 10 - i];
        r[k] = lo + 19 * hi;
    }
    WEEI_UNROLL for (int k = 0; k < 10; k++) h[k] = r[k];
    weei_fe_carry(h);
}

/* h = f f: the products f_i f_j and f_j f_i once, doubled. */
static inline void weei_fe_sq(weei_fe h, const weei_fe f) {
    int64_t f2[10], r[10];
    WEEI_UNROLL for (int i = 0; i < 10; i++) f2[i] = 2 * f[i];
    WEEI_UNROLL for (int k = 0; k < 10; k++) {
        int64_t lo = 0, hi = 0;
        /* i < j, i + j = k: f_i f_j twice (four times when both are odd) */
        WEEI_UNROLL for (int i = 0; 2 * i < k; i++) lo += ((i & 1) && !(k & 1) ? 2 * f2[i] : f2[i]) * f[k - i];
        if (!(k & 1)) lo += ((k / 2) & 1 ? f2[k / 2] : f[k / 2]) * f[k / 2];
        /* i < j, i + j = k + 10 */
        WEEI_UNROLL for (int i = k + 1; 2 * i < k + 10; i++) hi += ((i & 1) && !(k & 1) ? 2 * f2[i] : f2[i]) * f[k + 10 - i];
        if (!(k & 1)) hi += (((k + 10) / 2) & 1 ? f2[(k + 10) / 2] : f[(k + 10) / 2]) * f[(k + 10) / 2];
        r[k] = lo + 19 * hi;
    }
    WEEI_UNROLL for (int k = 0; k < 10; k++) h[k] = r[k];
    weei_fe_carry(h);
}

static void weei_fe_add(weei_fe h, const weei_fe f, const weei_fe g) {
    WEEI_UNROLL for (int i = 0; i < 10; i++) h[i] = f[i] + g[i];
}

static void weei_fe_sub(weei_fe h, const weei_fe f, const weei_fe g) {
    WEEI_UNROLL for (int i = 0; i < 10; i++) h[i] = f[i] - g[i];
}

/* (a24 = 121665, RFC 7748's (486662 - 2) / 4) times a carried element: under 2^44 per limb before the carry. */
static void weei_fe_mul_a24(weei_fe h, const weei_fe f) {
    WEEI_UNROLL for (int i = 0; i < 10; i++) h[i] = f[i] * 121665;
    weei_fe_carry(h);
}

/* Swaps f and g when swap is 1, leaves them when it is 0, without a branch. */
static void weei_fe_cswap(weei_fe f, weei_fe g, int64_t swap) {
    int64_t mask = -swap;
    WEEI_UNROLL for (int i = 0; i < 10; i++) {
        int64_t x = mask & (f[i] ^ g[i]);
        f[i] ^= x;
        g[i] ^= x;
    }
}

/* The 255 low bits of 32 little-endian bytes (RFC 7748 masks the top bit of a u-coordinate); a value of p or
 * more is taken as is: the arithmetic is mod p. */
static void weei_fe_frombytes(weei_fe h, const uint8_t s[32]) {
    uint64_t acc = 0;
    int bits = 0, at = 0;
    for (int i = 0; i < 10; i++) {
        int w = weei_fe_width[i];
        while (bits < w) {
            uint64_t byte = at == 31 ? (uint64_t)(s[31] & 127u) : (uint64_t)s[at];
            acc |= byte << bits;
            at++;
            bits += 8;
        }
        h[i] = (int64_t)(acc & (((uint64_t)1 << w) - 1));
        acc >>= w;
        bits -= w;
    }
}

/* The canonical 32 bytes of a carried element h (0 <= h < 2^255 + 2^42 < 2p): q = floor((h + 19) / 2^255) is
 * 1 when h >= p and 0 otherwise (the carry chain with 19 carried in at the bottom computes it exactly), then
 * h - p q = h + 19 q - 2^255 q, the bit 255 dropped. */
static void weei_fe_tobytes(uint8_t s[32], const weei_fe f) {
    weei_fe h;
    for (int i = 0; i < 10; i++) h[i] = f[i];
    int64_t q = 19;
    for (int i = 0; i < 10; i++) q = (h[i] + q) >> weei_fe_width[i];
    h[0] += 19 * q;
    for (int i = 0; i < 9; i++) {
        int64_t c = h[i] >> weei_fe_width[i];
        h[i + 1] += c;
        h[i] -= c * ((int64_t)1 << weei_fe_width[i]);
    }
    h[9] &= ((int64_t)1 << 25) - 1;
    uint64_t acc = 0;
    int bits = 0, at = 0;
    for (int i = 0; i < 10; i++) {
        acc |= (uint64_t)h[i] << bits;
        bits += weei_fe_width[i];
        while (bits >= 8) {
            s[at++] = (uint8_t)acc;
            acc >>= 8;
            bits -= 8;
        }
    }
    s[31] = (uint8_t)acc; /* the last 7 bits; bit 255 is 0 */
}

/* z^(p - 2) = 1/z (0 for 0), by ref10's chain: 254 squarings and 11 multiplications. */
static void weei_fe_invert(weei_fe out, const weei_fe z) {
    weei_fe t0, t1, t2, t3;
    weei_fe_sq(t0, z);                                   /* 2 */
    weei_fe_sq(t1, t0);
    weei_fe_sq(t1, t1);                                  /* 8 */
    weei_fe_mul(t1, z, t1);                              /* 9 */
    weei_fe_mul(t0, t0, t1);                             /* 11 */
    weei_fe_sq(t2, t0);                                  /* 22 */
    weei_fe_mul(t1, t1, t2);                             /* 2^5 - 1 */
    weei_fe_sq(t2, t1);
    for (int i = 1; i < 5; i++) weei_fe_sq(t2, t2);
    weei_fe_mul(t1, t2, t1);                             /* 2^10 - 1 */
    weei_fe_sq(t2, t1);
    for (int i = 1; i < 10; i++) weei_fe_sq(t2, t2);
    weei_fe_mul(t2, t2, t1);                             /* 2^20 - 1 */
    weei_fe_sq(t3, t2);
    for (int i = 1; i < 20; i++) weei_fe_sq(t3, t3);
    weei_fe_mul(t2, t3, t2);                             /* 2^40 - 1 */
    for (int i = 0; i < 10; i++) weei_fe_sq(t2, t2);
    weei_fe_mul(t1, t2, t1);                             /* 2^50 - 1 */
    weei_fe_sq(t2, t1);
    for (int i = 1; i < 50; i++) weei_fe_sq(t2, t2);
    weei_fe_mul(t2, t2, t1);                             /* 2^100 - 1 */
    weei_fe_sq(t3, t2);
    for (int i = 1; i < 100; i++) weei_fe_sq(t3, t3);
    weei_fe_mul(t2, t3, t2);                             /* 2^200 - 1 */
    for (int i = 0; i < 50; i++) weei_fe_sq(t2, t2);
    weei_fe_mul(t1, t2, t1);                             /* 2^250 - 1 */
    for (int i = 0; i < 5; i++) weei_fe_sq(t1, t1);      /* 2^255 - 32 */
    weei_fe_mul(out, t1, t0);                            /* 2^255 - 21 = p - 2 */
}

#if defined(__wasm__)
/* Where a wasm host puts the scalar (0..31) and the u-coordinate (32..63) and finds the result (64..95): a
 * fixed place, apart from weei_alloc's region, so a key agreement never disturbs buffers a host has staged. */
static uint8_t weei_x25519_io[96];

WEEI_EXPORT(weei_x25519_buffer) uint32_t weei_x25519_buffer(void) { return (uint32_t)(uintptr_t)weei_x25519_io; }
#endif

/* out = X25519(k, u): k clamped (RFC 7748 decodeScalar25519), the Montgomery ladder of section 5 with a24 =
 * 121665. out may alias k or u. */
WEEI_EXPORT(weei_x25519)
void weei_x25519(uint8_t *out, const uint8_t *k, const uint8_t *u) {
    uint8_t e[32];
    for (int i = 0; i < 32; i++) e[i] = k[i];
    e[0] &= 248;
    e[31] &= 127;
    e[31] |= 64;
    weei_fe x1, x2 = {1}, z2 = {0}, x3, z3 = {1};
    weei_fe a, aa, b, bb, ee, c, d, da, cb, t;
    weei_fe_frombytes(x1, u);
    for (int i = 0; i < 10; i++) x3[i] = x1[i];
    int64_t swap = 0;
    for (int pos = 254; pos >= 0; pos--) {
        int64_t bit = (e[pos >> 3] >> (pos & 7)) & 1;
        swap ^= bit;
        weei_fe_cswap(x2, x3, swap);
        weei_fe_cswap(z2, z3, swap);
        swap = bit;
        weei_fe_add(a, x2, z2);
        weei_fe_sq(aa, a);
        weei_fe_sub(b, x2, z2);
        weei_fe_sq(bb, b);
        weei_fe_sub(ee, aa, bb);
        weei_fe_add(c, x3, z3);
        weei_fe_sub(d, x3, z3);
        weei_fe_mul(da, d, a);
        weei_fe_mul(cb, c, b);
        weei_fe_add(t, da, cb);
        weei_fe_sq(x3, t);
        weei_fe_sub(t, da, cb);
        weei_fe_sq(t, t);
        weei_fe_mul(z3, x1, t);
        weei_fe_mul(x2, aa, bb);
        weei_fe_mul_a24(t, ee);
        weei_fe_add(t, aa, t);
        weei_fe_mul(z2, ee, t);
    }
    weei_fe_cswap(x2, x3, swap);
    weei_fe_cswap(z2, z3, swap);
    weei_fe_invert(z2, z2);
    weei_fe_mul(x2, x2, z2);
    weei_fe_tobytes(out, x2);
}
