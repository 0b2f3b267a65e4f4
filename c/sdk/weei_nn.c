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

static inline v4 ld4(const float *p) { v4 v; __builtin_memcpy(&v, p, 16); return v; }
static inline void st4(float *p, v4 v) { __builtin_memcpy(p, &v, 16); }
static inline v4 splat4(float x) { v4 v = { x, x, x, x }; return v; }
static inline float hsum4(v4 v) { return (v[0] + v[1]) + (v[2] + v[3]); }

void weei_dense_forward(const float *x, uint32_t batch, uint32_t in, uint32_t out,
                        const float *W, const float *bias, float *y) {
    uint32_t o16 = out & ~15u, o4 = out & ~3u;
    for (uint32_t b = 0; b < batch; b++) {
        const float *xr = x + (size_t)b * in;
        float *yr = y + (size_t)b * out;
        uint32_t o = 0;
        for (; o < o16; o += 16) {
            v4 a0 = ld4(bias + o), a1 = ld4(bias + o + 4), a2 = ld4(bias + o + 8), a3 = ld4(bias + o + 12);
            for (uint32_t i = 0; i < in; i++) {
                v4 xi = splat4(xr[i]);
                const float *w = W + (size_t)i * out + o;
                a0 += xi * ld4(w); a1 += xi * ld4(w + 4); a2 += xi * ld4(w + 8); a3 += xi * ld4(w + 12);
            }
            st4(yr + o, a0); st4(yr + o + 4, a1); st4(yr + o + 8, a2); st4(yr + o + 12, a3);
        }
        for (; o < o4; o += 4) {
            v4 a = ld4(bias + o);
            for (uint32_t i = 0; i < in; i++) a += splat4(xr[i]) * ld4(W + (size_t)i * out + o);
            st4(yr + o, a);
        }
        for (; o < out; o++) {
            float a = bias[o];
            for (uint32_t i = 0; i < in; i++) a += xr[i] * W[(size_t)i * out + o];
            yr[o] = a;
        }
    }
}

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
    for (uint32_t i = 0; i < in; i++) {
        float *dw = dW + (size_t)i * out;
        uint32_t o = 0;
        for (; o < o4; o += 4) {
            v4 a = ld4(dw + o);
            for (uint32_t b = 0; b < batch; b++) a += splat4(x[(size_t)b * in + i]) * ld4(dy + (size_t)b * out + o);
            st4(dw + o, a);
        }
        for (; o < out; o++) {
            float a = dw[o];
            for (uint32_t b = 0; b < batch; b++) a += x[(size_t)b * in + i] * dy[(size_t)b * out + o];
            dw[o] = a;
        }
    }
    if (!dx) return;
    /* dx[b][i] = sum_o W[i][o] dy[b][o] */
    for (uint32_t b = 0; b < batch; b++) {
        const float *d = dy + (size_t)b * out;
        for (uint32_t i = 0; i < in; i++) {
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
    for (uint32_t i = 0; i < n; i++) y[i] = y[i] > 0.0f ? y[i] : 0.0f;
}

void weei_relu_backward(const float *y, float *dy, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) dy[i] = y[i] > 0.0f ? dy[i] : 0.0f;
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
    double b1t = 1.0, b2t = 1.0;
    for (uint32_t k = 0; k < a->t && k < 100000; k++) { b1t *= a->beta1; b2t *= a->beta2; }
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
