/* Dense layers, activations, softmax cross-entropy and optimizers.
 *
 * The inner loops use 4-lane float vectors (clang vector extensions): one
 * v128 op in wasm32 with -msimd128, SSE natively. Every sum is accumulated in
 * a fixed order (lanes combined as (l0 + l1) + (l2 + l3)), and the scalar
 * tails use the same order as the lanes, so with -ffp-contract=off the wasm
 * and native builds compute bit-identical results.
 */
#include "weei_sdk.h"

typedef float v4 __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));
typedef uint32_t u2 __attribute__((vector_size(8)));

#define WEEI_INLINE static inline __attribute__((always_inline))

WEEI_INLINE v4 ld4(const float *p) { v4 v; __builtin_memcpy(&v, p, 16); return v; }
WEEI_INLINE void st4(float *p, v4 v) { __builtin_memcpy(p, &v, 16); }
WEEI_INLINE v4 splat4(float x) { v4 v = { x, x, x, x }; return v; }
/* splat4(*p); in wasm one v128.load32_splat (a single broadcast from memory
 * in wasmtime) rather than a scalar load and a splat. */
#if defined(__wasm_simd128__)
#include <wasm_simd128.h>
WEEI_INLINE v4 ldsplat(const float *p) { return (v4)wasm_v128_load32_splat(p); }
#else
WEEI_INLINE v4 ldsplat(const float *p) { return splat4(*p); }
#endif
WEEI_INLINE float hsum4(v4 v) { return (v[0] + v[1]) + (v[2] + v[3]); }

/* The first r lanes of p (r = 1..4, a constant after inlining); the other
 * lanes are zero and never stored. Nothing past p[r-1] is read. */
WEEI_INLINE v4 ldn(const float *p, const uint32_t r) {
    if (r >= 4) return ld4(p);
    v4 v = splat4(0.0f);
    if (r >= 2) {
        u2 t;
        __builtin_memcpy(&t, p, 8);
        v4i u = { (int32_t)t[0], (int32_t)t[1], 0, 0 };
        v = (v4)u;
        if (r == 3) v[2] = p[2];
    } else {
        v[0] = p[0];
    }
    return v;
}

WEEI_INLINE void stn(float *p, v4 v, const uint32_t r) {
    if (r >= 4) { st4(p, v); return; }
    if (r >= 2) {
        u2 t = { (uint32_t)((v4i)v)[0], (uint32_t)((v4i)v)[1] };
        __builtin_memcpy(p, &t, 8);
        if (r == 3) p[2] = v[2];
    } else {
        p[0] = v[0];
    }
}

/* Lanes of vector k of a block of NV vectors whose last one holds R lanes. */
#define WEEI_LANES(k, NV, R) ((k) + 1 == (NV) ? (R) : 4u)

/*
 * Every output element is computed with the same operations in the same
 * order whatever the blocking: y[b][o] = bias[o], then y += x[b][i] * W[i][o]
 * for i = 0..in-1. Blocks cover ROWS batch rows and NV vectors of outputs
 * (the last with R lanes), so each loaded W vector serves ROWS rows and the
 * NV*ROWS accumulators hide the add latency.
 */
WEEI_INLINE void fwd_block(const float *x, uint32_t b, const uint32_t ROWS, uint32_t in, uint32_t out,
                           uint32_t o, const uint32_t NV, const uint32_t R, const float *W,
                           const float *bias, float *y) {
    v4 a[2][4];
    for (uint32_t k = 0; k < NV; k++) {
        v4 bv = ldn(bias + o + 4 * k, WEEI_LANES(k, NV, R));
        for (uint32_t r = 0; r < ROWS; r++) a[r][k] = bv;
    }
    const float *x0 = x + (size_t)b * in;
    for (uint32_t i = 0; i < in; i++) {
        const float *w = W + (size_t)i * out + o;
        v4 wv[4];
        for (uint32_t k = 0; k < NV; k++) wv[k] = ldn(w + 4 * k, WEEI_LANES(k, NV, R));
        for (uint32_t r = 0; r < ROWS; r++) {
            v4 xi = ldsplat(x0 + (size_t)r * in + i);
            for (uint32_t k = 0; k < NV; k++) a[r][k] += xi * wv[k];
        }
    }
    for (uint32_t r = 0; r < ROWS; r++)
        for (uint32_t k = 0; k < NV; k++)
            stn(y + (size_t)(b + r) * out + o + 4 * k, a[r][k], WEEI_LANES(k, NV, R));
}

WEEI_INLINE void fwd_cols(const float *x, uint32_t batch, uint32_t in, uint32_t out, uint32_t o,
                          const uint32_t NV, const uint32_t R, const float *W, const float *bias,
                          float *y) {
    uint32_t b = 0;
    for (; b + 2 <= batch; b += 2) fwd_block(x, b, 2, in, out, o, NV, R, W, bias, y);
    if (b < batch) fwd_block(x, b, 1, in, out, o, NV, R, W, bias, y);
}

/* Calls BLOCK(NV, R) for the rem = out - o (1..15) outputs left after the
 * blocks of 16: NV vectors, the last holding R lanes (both constants). */
#define WEEI_TAIL_DISPATCH(rem, BLOCK)                                                  \
    switch (rem) {                                                                      \
    case 1: BLOCK(1, 1); break;   case 2: BLOCK(1, 2); break;   case 3: BLOCK(1, 3); break;   \
    case 4: BLOCK(1, 4); break;   case 5: BLOCK(2, 1); break;   case 6: BLOCK(2, 2); break;   \
    case 7: BLOCK(2, 3); break;   case 8: BLOCK(2, 4); break;   case 9: BLOCK(3, 1); break;   \
    case 10: BLOCK(3, 2); break;  case 11: BLOCK(3, 3); break;  case 12: BLOCK(3, 4); break;  \
    case 13: BLOCK(4, 1); break;  case 14: BLOCK(4, 2); break;  case 15: BLOCK(4, 3); break;  \
    default: break;                                                                     \
    }

void weei_dense_forward(const float *x, uint32_t batch, uint32_t in, uint32_t out,
                        const float *W, const float *bias, float *y) {
    uint32_t o = 0;
    for (; o + 16 <= out; o += 16) fwd_cols(x, batch, in, out, o, 4, 4, W, bias, y);
#define WEEI_FWD(NV, R) fwd_cols(x, batch, in, out, o, NV, R, W, bias, y)
    WEEI_TAIL_DISPATCH(out - o, WEEI_FWD)
#undef WEEI_FWD
}

/* dW[i][o] += x[b][i] * dy[b][o] for b = 0..batch-1 in order, for IROWS
 * rows i and NV vectors of outputs (the last with R lanes). */
WEEI_INLINE void dw_block(const float *x, const float *dy, uint32_t batch, uint32_t in, uint32_t out,
                          uint32_t i, const uint32_t IROWS, uint32_t o, const uint32_t NV,
                          const uint32_t R, float *dW) {
    v4 a[2][4];
    for (uint32_t r = 0; r < IROWS; r++)
        for (uint32_t k = 0; k < NV; k++)
            a[r][k] = ldn(dW + (size_t)(i + r) * out + o + 4 * k, WEEI_LANES(k, NV, R));
    for (uint32_t b = 0; b < batch; b++) {
        const float *d = dy + (size_t)b * out + o;
        v4 dv[4];
        for (uint32_t k = 0; k < NV; k++) dv[k] = ldn(d + 4 * k, WEEI_LANES(k, NV, R));
        for (uint32_t r = 0; r < IROWS; r++) {
            v4 xi = ldsplat(x + (size_t)b * in + i + r);
            for (uint32_t k = 0; k < NV; k++) a[r][k] += xi * dv[k];
        }
    }
    for (uint32_t r = 0; r < IROWS; r++)
        for (uint32_t k = 0; k < NV; k++)
            stn(dW + (size_t)(i + r) * out + o + 4 * k, a[r][k], WEEI_LANES(k, NV, R));
}

WEEI_INLINE void dw_cols(const float *x, const float *dy, uint32_t batch, uint32_t in, uint32_t out,
                         uint32_t o, const uint32_t NV, const uint32_t R, float *dW) {
    uint32_t i = 0;
    for (; i + 2 <= in; i += 2) dw_block(x, dy, batch, in, out, i, 2, o, NV, R, dW);
    if (i < in) dw_block(x, dy, batch, in, out, i, 1, o, NV, R, dW);
}

/* Largest in*out whose transposed W fits the stack buffer of the dx pass. */
#define WEEI_DX_T_MAX 8192u

void weei_dense_backward(const float *x, const float *dy, uint32_t batch, uint32_t in, uint32_t out,
                         const float *W, float *dW, float *db, float *dx) {
    uint32_t o4 = out & ~3u;
    /* db += sum over the batch of dy */
    for (uint32_t b = 0; b < batch; b++) {
        const float *d = dy + (size_t)b * out;
        uint32_t o = 0;
        for (; o < o4; o += 4) st4(db + o, ld4(db + o) + ld4(d + o));
        for (; o < out; o++) db[o] += d[o];
    }
    /* dW[i][o] += sum_b x[b][i] dy[b][o] */
    {
        uint32_t o = 0;
        for (; o + 16 <= out; o += 16) dw_cols(x, dy, batch, in, out, o, 4, 4, dW);
#define WEEI_DW(NV, R) dw_cols(x, dy, batch, in, out, o, NV, R, dW)
        WEEI_TAIL_DISPATCH(out - o, WEEI_DW)
#undef WEEI_DW
    }
    if (!dx) return;
    /*
     * dx[b][i] = sum_o W[i][o] dy[b][o], in this order: lane l sums
     * o = l, l+4, ... below o4 (from +0.0), the lanes are combined as
     * (l0 + l1) + (l2 + l3), then o = o4..out-1 are added one by one.
     * Four i at a time from a transposed copy of W, same operations.
     */
    uint32_t i4 = (uint64_t)in * out <= WEEI_DX_T_MAX ? in & ~3u : 0;
    if (i4) {
        float wt[WEEI_DX_T_MAX] __attribute__((aligned(16)));
        for (uint32_t i = 0; i < in; i++)
            for (uint32_t o = 0; o < out; o++) wt[(size_t)o * in + i] = W[(size_t)i * out + o];
        for (uint32_t b = 0; b < batch; b++) {
            const float *d = dy + (size_t)b * out;
            for (uint32_t i = 0; i < i4; i += 4) {
                v4 s0 = splat4(0.0f), s1 = s0, s2 = s0, s3 = s0;
                const float *t = wt + i;
                for (uint32_t o = 0; o < o4; o += 4) {
                    s0 += ld4(t + (size_t)o * in) * ldsplat(d + o);
                    s1 += ld4(t + (size_t)(o + 1) * in) * ldsplat(d + o + 1);
                    s2 += ld4(t + (size_t)(o + 2) * in) * ldsplat(d + o + 2);
                    s3 += ld4(t + (size_t)(o + 3) * in) * ldsplat(d + o + 3);
                }
                v4 s = (s0 + s1) + (s2 + s3);
                for (uint32_t o = o4; o < out; o++) s += ld4(t + (size_t)o * in) * ldsplat(d + o);
                st4(dx + (size_t)b * in + i, s);
            }
        }
    }
    for (uint32_t b = 0; b < batch; b++) {
        const float *d = dy + (size_t)b * out;
        for (uint32_t i = i4; i < in; i++) {
            const float *w = W + (size_t)i * out;
            v4 a = splat4(0.0f);
            uint32_t o = 0;
            for (; o < o4; o += 4) a += ld4(w + o) * ld4(d + o);
            float s = hsum4(a);
            for (; o < out; o++) s += w[o] * d[o];
            dx[(size_t)b * in + i] = s;
        }
    }
}

void weei_relu(float *y, uint32_t n) {
    uint32_t i = 0;
    for (; i + 4 <= n; i += 4) {
        v4 v = ld4(y + i);
        st4(y + i, (v4)((v4i)v & (v > splat4(0.0f))));
    }
    for (; i < n; i++) y[i] = y[i] > 0.0f ? y[i] : 0.0f;
}

/* dy = y > 0 ? dy : +0.0, branch-free (a mask; the same bits as the select). */
void weei_relu_backward(const float *y, float *dy, uint32_t n) {
    uint32_t i = 0;
    for (; i + 4 <= n; i += 4) st4(dy + i, (v4)((v4i)ld4(dy + i) & (ld4(y + i) > splat4(0.0f))));
    for (; i < n; i++) dy[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

void weei_tanh(float *y, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) y[i] = weei_tanhf(y[i]);
}

void weei_tanh_backward(const float *y, float *dy, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) dy[i] = dy[i] * (1.0f - y[i] * y[i]);
}

void weei_softmax(const float *logits, uint32_t n, float *p) {
    float m = logits[0];
    for (uint32_t i = 1; i < n; i++) if (logits[i] > m) m = logits[i];
    float s = 0.0f;
    for (uint32_t i = 0; i < n; i++) { p[i] = weei_expf(logits[i] - m); s += p[i]; }
    float inv = 1.0f / s;
    for (uint32_t i = 0; i < n; i++) p[i] *= inv;
}

uint32_t weei_argmax(const float *v, uint32_t n) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++) if (v[i] > v[best]) best = i;
    return best;
}

double weei_softmax_xent(const float *logits, const uint8_t *labels, uint32_t batch, uint32_t classes,
                         float *dlogits, float grad_scale, uint32_t *correct) {
    double total = 0.0;
    uint32_t hits = 0;
    float p[256];
    for (uint32_t b = 0; b < batch; b++) {
        const float *l = logits + (size_t)b * classes;
        uint32_t y = labels[b];
        float m = l[0];
        for (uint32_t k = 1; k < classes; k++) if (l[k] > m) m = l[k];
        float s = 0.0f;
        for (uint32_t k = 0; k < classes; k++) { p[k] = weei_expf(l[k] - m); s += p[k]; }
        total += (double)(weei_logf(s) + m - l[y]);
        if (weei_argmax(l, classes) == y) hits++;
        if (dlogits) {
            float inv = 1.0f / s;
            float *d = dlogits + (size_t)b * classes;
            for (uint32_t k = 0; k < classes; k++) d[k] = (p[k] * inv - (k == y ? 1.0f : 0.0f)) * grad_scale;
        }
    }
    if (correct) *correct += hits;
    return batch ? total / batch : 0.0;
}

void weei_sgd_step(float *w, const float *g, uint32_t n, float lr) {
    for (uint32_t i = 0; i < n; i++) w[i] -= lr * g[i];
}

int weei_adam_init(weei_adam *a, uint32_t n, float lr) {
    a->lr = lr;
    a->beta1 = 0.9f;
    a->beta2 = 0.999f;
    a->eps = 1e-8f;
    a->t = 0;
    a->b1t = 1.0;
    a->b2t = 1.0;
    a->n = n;
    a->m = weei_calloc((size_t)n * sizeof(float));
    a->v = weei_calloc((size_t)n * sizeof(float));
    if (!a->m || !a->v) { weei_adam_free(a); return -1; }
    return 0;
}

void weei_adam_free(weei_adam *a) {
    weei_mfree(a->m);
    weei_mfree(a->v);
    a->m = a->v = 0;
}

/* Kingma & Ba (2015), Algorithm 1 with the bias corrections folded into the
 * step size: w -= lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps). */
void weei_adam_step(weei_adam *a, float *w, const float *g) {
    a->t++;
    /* One multiplication per step, in the same order a product from scratch would take
     * (so the bits are those of beta^t); past 100000 steps the correction is 1 to the bit. */
    if (a->t <= 100000) { a->b1t *= a->beta1; a->b2t *= a->beta2; }
    double b1t = a->b1t, b2t = a->b2t;
    float step = (float)((double)a->lr * __builtin_sqrt(1.0 - b2t) / (1.0 - b1t));
    float b1 = a->beta1, b2 = a->beta2, c1 = 1.0f - a->beta1, c2 = 1.0f - a->beta2, eps = a->eps;
    float *m = a->m, *v = a->v;
    for (uint32_t i = 0; i < a->n; i++) {
        float gi = g[i];
        float mi = b1 * m[i] + c1 * gi;
        float vi = b2 * v[i] + c2 * (gi * gi);
        m[i] = mi;
        v[i] = vi;
        w[i] -= step * mi / (__builtin_sqrtf(vi) + eps);
    }
}

void weei_init_dense(weei_rng *r, float *W, float *bias, uint32_t in, uint32_t out) {
    float limit = __builtin_sqrtf(6.0f / (float)(in + out));
    for (uint32_t k = 0; k < in * out; k++) W[k] = (2.0f * weei_rng_float(r) - 1.0f) * limit;
    for (uint32_t o = 0; o < out; o++) bias[o] = 0.0f;
}
