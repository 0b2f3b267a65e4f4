/* byte-transformer: forward and backward pass (pre-norm decoder blocks).
 *
 *   x0 = E[token] + P[position]
 *   per layer: x = x + Wo . attention(LN1(x)) ; x = x + W2 . relu(W1 . LN2(x))
 *   logits = LNf(x) . E^T + bout, cross-entropy against the next byte.
 *
 * Dense layers are the SDK's (4-lane vectors, SIMD128 in wasm); attention
 * and layer norm are plain loops (a few percent of the work at T = 64).
 * Every sum runs in a fixed order, so training is deterministic.
 */
#include "transformer.h"

#define D TFM_D
#define T TFM_T
#define F TFM_F
#define H TFM_H
#define HD TFM_HD
#define V TFM_V
#define LN_EPS 1e-5f

#if TFM_HD % 4 != 0 || TFM_D % 4 != 0
#error "the head width and the width must be multiples of 4 (4-lane vectors)"
#endif

/* 4-lane vectors (SIMD128 in wasm) for the dot products of attention and
 * the sums of layer norm; lanes combined as (l0 + l1) + (l2 + l3). */
typedef float v4 __attribute__((vector_size(16)));
static inline v4 ld4(const float *p) { v4 v; __builtin_memcpy(&v, p, 16); return v; }
static inline void st4(float *p, v4 v) { __builtin_memcpy(p, &v, 16); }
static inline float hsum4(v4 v) { return (v[0] + v[1]) + (v[2] + v[3]); }

static inline float dot(const float *a, const float *b, uint32_t n) {
    v4 acc = { 0.0f, 0.0f, 0.0f, 0.0f };
    for (uint32_t c = 0; c < n; c += 4) acc += ld4(a + c) * ld4(b + c);
    return hsum4(acc);
}

static inline float sum(const float *a, uint32_t n) {
    v4 acc = { 0.0f, 0.0f, 0.0f, 0.0f };
    for (uint32_t c = 0; c < n; c += 4) acc += ld4(a + c);
    return hsum4(acc);
}

/* y += a * x */
static inline void axpy(float *y, float a, const float *x, uint32_t n) {
    v4 av = { a, a, a, a };
    for (uint32_t c = 0; c < n; c += 4) st4(y + c, ld4(y + c) + av * ld4(x + c));
}

static float *fl(uint32_t n) { return weei_malloc((size_t)n * sizeof(float)); }

void tfm_work_free(tfm_work *w) {
    weei_mfree(w->tokens); weei_mfree(w->targets);
    for (int l = 0; l <= TFM_L; l++) weei_mfree(w->x[l]);
    for (int l = 0; l < TFM_L; l++) {
        weei_mfree(w->xhat1[l]); weei_mfree(w->rstd1[l]); weei_mfree(w->y1[l]); weei_mfree(w->qkv[l]);
        weei_mfree(w->prob[l]); weei_mfree(w->att[l]); weei_mfree(w->xm[l]); weei_mfree(w->xhat2[l]);
        weei_mfree(w->rstd2[l]); weei_mfree(w->y2[l]); weei_mfree(w->h[l]);
    }
    weei_mfree(w->xhatf); weei_mfree(w->rstdf); weei_mfree(w->yf); weei_mfree(w->logits); weei_mfree(w->et);
    weei_mfree(w->dx); weei_mfree(w->dy); weei_mfree(w->dqkv); weei_mfree(w->datt); weei_mfree(w->dh);
    weei_mfree(w->dlogits); weei_mfree(w->det); weei_mfree(w->wt); weei_mfree(w->zeros);
    weei_memzero(w, sizeof *w);
}

int tfm_work_alloc(tfm_work *w, uint32_t batch) {
    weei_memzero(w, sizeof *w);
    uint32_t n = batch * T;
    w->batch = batch;
    w->tokens = weei_malloc(n);
    w->targets = weei_malloc(n);
    int ok = w->tokens && w->targets;
    for (int l = 0; l <= TFM_L; l++) ok = ok && (w->x[l] = fl(n * D));
    for (int l = 0; l < TFM_L && ok; l++) {
        ok = (w->xhat1[l] = fl(n * D)) && (w->rstd1[l] = fl(n)) && (w->y1[l] = fl(n * D))
            && (w->qkv[l] = fl(n * 3 * D)) && (w->prob[l] = fl(batch * H * T * T)) && (w->att[l] = fl(n * D))
            && (w->xm[l] = fl(n * D)) && (w->xhat2[l] = fl(n * D)) && (w->rstd2[l] = fl(n))
            && (w->y2[l] = fl(n * D)) && (w->h[l] = fl(n * F));
    }
    ok = ok && (w->xhatf = fl(n * D)) && (w->rstdf = fl(n)) && (w->yf = fl(n * D)) && (w->logits = fl(n * V))
        && (w->et = fl(D * V)) && (w->dx = fl(n * D)) && (w->dy = fl(n * D)) && (w->dqkv = fl(n * 3 * D))
        && (w->datt = fl(n * D)) && (w->dh = fl(n * F)) && (w->dlogits = fl(n * V)) && (w->det = fl(D * V))
        && (w->wt = fl(TFM_WT_MAX)) && (w->zeros = weei_calloc(TFM_ZEROS * sizeof(float)));
    if (!ok) { tfm_work_free(w); return -1; }
    return 0;
}

void tfm_gather(tfm_work *w, const uint8_t *records, const uint32_t *idx, uint32_t count) {
    for (uint32_t b = 0; b < count; b++) {
        const uint8_t *rec = records + (size_t)(idx ? idx[b] : b) * TFM_RECORD;
        for (uint32_t t = 0; t < T; t++) {
            w->tokens[b * T + t] = rec[t];
            w->targets[b * T + t] = rec[t + 1];
        }
    }
}

/* y = g * xhat + b over rows of D; keeps xhat and 1/std for the backward pass. */
static void ln_forward(const float *x, uint32_t n, const float *g, const float *bias, float *xhat, float *rstd, float *y) {
    for (uint32_t r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * D;
        float mean = sum(xr, D) * (1.0f / (float)D);
        float *xh = xhat + (size_t)r * D, *yr = y + (size_t)r * D;
        for (uint32_t i = 0; i < D; i++) xh[i] = xr[i] - mean;
        float rs = 1.0f / __builtin_sqrtf(dot(xh, xh, D) * (1.0f / (float)D) + LN_EPS);
        rstd[r] = rs;
        for (uint32_t i = 0; i < D; i++) { xh[i] = xh[i] * rs; yr[i] = g[i] * xh[i] + bias[i]; }
    }
}

/* dg += dy * xhat, db += dy, dx += d(LN)/dx . dy (accumulates into dx). */
static void ln_backward(const float *dy, uint32_t n, const float *g, const float *xhat, const float *rstd,
                        float *dg, float *db, float *dx) {
    for (uint32_t r = 0; r < n; r++) {
        const float *d = dy + (size_t)r * D, *xh = xhat + (size_t)r * D;
        float *o = dx + (size_t)r * D;
        float dxh[D];
        for (uint32_t i = 0; i < D; i++) {
            dxh[i] = d[i] * g[i];
            dg[i] += d[i] * xh[i];
            db[i] += d[i];
        }
        float s1 = sum(dxh, D) * (1.0f / (float)D);
        float s2 = dot(dxh, xh, D) * (1.0f / (float)D);
        for (uint32_t i = 0; i < D; i++) o[i] += rstd[r] * (dxh[i] - s1 - xh[i] * s2);
    }
}

/* Causal self-attention of every head: att[i] = sum_{j<=i} softmax_j(q_i.k_j / sqrt(HD)) v_j. */
static void attn_forward(const float *qkv, uint32_t batch, float *prob, float *att) {
    const float scale = 1.0f / __builtin_sqrtf((float)HD);
    for (uint32_t b = 0; b < batch; b++) {
        for (uint32_t hh = 0; hh < H; hh++) {
            float *P = prob + ((size_t)b * H + hh) * T * T;
            for (uint32_t i = 0; i < T; i++) {
                const float *q = qkv + ((size_t)b * T + i) * 3 * D + hh * HD;
                float *pr = P + (size_t)i * T;
                float m = -3.0e38f;
                for (uint32_t j = 0; j <= i; j++) {
                    const float *k = qkv + ((size_t)b * T + j) * 3 * D + D + hh * HD;
                    float s = dot(q, k, HD) * scale;
                    pr[j] = s;
                    if (s > m) m = s;
                }
                float sum = 0.0f;
                for (uint32_t j = 0; j <= i; j++) { pr[j] = weei_expf(pr[j] - m); sum += pr[j]; }
                float inv = 1.0f / sum;
                for (uint32_t j = 0; j <= i; j++) pr[j] *= inv;
                for (uint32_t j = i + 1; j < T; j++) pr[j] = 0.0f;
                float *o = att + ((size_t)b * T + i) * D + hh * HD;
                for (uint32_t c = 0; c < HD; c++) o[c] = 0.0f;
                for (uint32_t j = 0; j <= i; j++) {
                    const float *v = qkv + ((size_t)b * T + j) * 3 * D + 2 * D + hh * HD;
                    axpy(o, pr[j], v, HD);
                }
            }
        }
    }
}

/* From datt, writes (overwrites) dqkv. */
static void attn_backward(const float *qkv, const float *prob, const float *datt, uint32_t batch, float *dqkv) {
    const float scale = 1.0f / __builtin_sqrtf((float)HD);
    float ds[T];
    weei_memzero(dqkv, (size_t)batch * T * 3 * D * sizeof(float));
    for (uint32_t b = 0; b < batch; b++) {
        for (uint32_t hh = 0; hh < H; hh++) {
            const float *P = prob + ((size_t)b * H + hh) * T * T;
            for (uint32_t i = 0; i < T; i++) {
                const float *pr = P + (size_t)i * T;
                const float *dO = datt + ((size_t)b * T + i) * D + hh * HD;
                float pdp = 0.0f;
                for (uint32_t j = 0; j <= i; j++) {
                    const float *v = qkv + ((size_t)b * T + j) * 3 * D + 2 * D + hh * HD;
                    float *dv = dqkv + ((size_t)b * T + j) * 3 * D + 2 * D + hh * HD;
                    float dp = dot(dO, v, HD);
                    axpy(dv, pr[j], dO, HD);
                    ds[j] = dp;
                    pdp += pr[j] * dp;
                }
                const float *q = qkv + ((size_t)b * T + i) * 3 * D + hh * HD;
                float *dq = dqkv + ((size_t)b * T + i) * 3 * D + hh * HD;
                for (uint32_t j = 0; j <= i; j++) {
                    float g = pr[j] * (ds[j] - pdp) * scale;
                    const float *k = qkv + ((size_t)b * T + j) * 3 * D + D + hh * HD;
                    float *dk = dqkv + ((size_t)b * T + j) * 3 * D + D + hh * HD;
                    axpy(dq, g, k, HD);
                    axpy(dk, g, q, HD);
                }
            }
        }
    }
}

/* The SDK's dense backward for dW and db; dx = dy W^T as a forward pass of
 * dy through W transposed (the SDK computes dx for large layers with one dot
 * product per element, which took most of the training time here). */
static void dense_backward(tfm_work *w, const float *x, const float *dy, uint32_t n, uint32_t in, uint32_t out,
                           const float *W, float *dW, float *db, float *dx) {
    weei_dense_backward(x, dy, n, in, out, W, dW, db, 0);
    for (uint32_t i = 0; i < in; i++)
        for (uint32_t o = 0; o < out; o++) w->wt[(size_t)o * in + i] = W[(size_t)i * out + o];
    weei_dense_forward(dy, n, out, in, w->wt, w->zeros, dx);
}

double tfm_loss(tfm_work *w, const float *p, uint32_t count, float *grad, uint32_t *correct) {
    const uint32_t n = count * T;
    const float *E = p, *Pos = p + TFM_OFF_POS;
    for (uint32_t r = 0; r < n; r++) {
        const float *e = E + (size_t)w->tokens[r] * D, *ps = Pos + (size_t)(r % T) * D;
        float *x = w->x[0] + (size_t)r * D;
        for (uint32_t i = 0; i < D; i++) x[i] = e[i] + ps[i];
    }
    for (uint32_t l = 0; l < TFM_L; l++) {
        const float *ly = p + TFM_OFF_LAYERS + (size_t)l * LY_SIZE;
        ln_forward(w->x[l], n, ly + LY_LN1G, ly + LY_LN1B, w->xhat1[l], w->rstd1[l], w->y1[l]);
        weei_dense_forward(w->y1[l], n, D, 3 * D, ly + LY_WQKV, ly + LY_BQKV, w->qkv[l]);
        attn_forward(w->qkv[l], count, w->prob[l], w->att[l]);
        weei_dense_forward(w->att[l], n, D, D, ly + LY_WO, ly + LY_BO, w->xm[l]);
        for (uint32_t k = 0; k < n * D; k++) w->xm[l][k] += w->x[l][k];
        ln_forward(w->xm[l], n, ly + LY_LN2G, ly + LY_LN2B, w->xhat2[l], w->rstd2[l], w->y2[l]);
        weei_dense_forward(w->y2[l], n, D, F, ly + LY_W1, ly + LY_B1, w->h[l]);
        weei_relu(w->h[l], n * F);
        weei_dense_forward(w->h[l], n, F, D, ly + LY_W2, ly + LY_B2, w->x[l + 1]);
        for (uint32_t k = 0; k < n * D; k++) w->x[l + 1][k] += w->xm[l][k];
    }
    const float *lnf = p + TFM_OFF_LNF, *bout = p + TFM_OFF_BOUT;
    ln_forward(w->x[TFM_L], n, lnf, lnf + D, w->xhatf, w->rstdf, w->yf);
    for (uint32_t v = 0; v < V; v++)
        for (uint32_t i = 0; i < D; i++) w->et[(size_t)i * V + v] = E[(size_t)v * D + i];
    weei_dense_forward(w->yf, n, D, V, w->et, bout, w->logits);
    double loss = weei_softmax_xent(w->logits, w->targets, n, V, grad ? w->dlogits : 0, 1.0f / (float)n, correct);
    if (!grad) return loss;

    weei_memzero(grad, TFM_WEIGHT_BYTES);
    float *gE = grad, *gPos = grad + TFM_OFF_POS, *glnf = grad + TFM_OFF_LNF, *gbout = grad + TFM_OFF_BOUT;
    weei_memzero(w->det, (size_t)D * V * sizeof(float));
    weei_dense_backward(w->yf, w->dlogits, n, D, V, w->et, w->det, gbout, 0);
    weei_dense_forward(w->dlogits, n, V, D, E, w->zeros, w->dy); /* E is et transposed */
    for (uint32_t v = 0; v < V; v++)
        for (uint32_t i = 0; i < D; i++) gE[(size_t)v * D + i] += w->det[(size_t)i * V + v];
    weei_memzero(w->dx, (size_t)n * D * sizeof(float));
    ln_backward(w->dy, n, lnf, w->xhatf, w->rstdf, glnf, glnf + D, w->dx);
    for (uint32_t l = TFM_L; l-- > 0;) {
        const float *ly = p + TFM_OFF_LAYERS + (size_t)l * LY_SIZE;
        float *gl = grad + TFM_OFF_LAYERS + (size_t)l * LY_SIZE;
        /* dx is d(x[l+1]); the MLP branch, then LN2 adds into dx, making it d(xm). */
        dense_backward(w, w->h[l], w->dx, n, F, D, ly + LY_W2, gl + LY_W2, gl + LY_B2, w->dh);
        weei_relu_backward(w->h[l], w->dh, n * F);
        dense_backward(w, w->y2[l], w->dh, n, D, F, ly + LY_W1, gl + LY_W1, gl + LY_B1, w->dy);
        ln_backward(w->dy, n, ly + LY_LN2G, w->xhat2[l], w->rstd2[l], gl + LY_LN2G, gl + LY_LN2B, w->dx);
        /* the attention branch; LN1 adds into dx, making it d(x[l]). */
        dense_backward(w, w->att[l], w->dx, n, D, D, ly + LY_WO, gl + LY_WO, gl + LY_BO, w->datt);
        attn_backward(w->qkv[l], w->prob[l], w->datt, count, w->dqkv);
        dense_backward(w, w->y1[l], w->dqkv, n, D, 3 * D, ly + LY_WQKV, gl + LY_WQKV, gl + LY_BQKV, w->dy);
        ln_backward(w->dy, n, ly + LY_LN1G, w->xhat1[l], w->rstd1[l], gl + LY_LN1G, gl + LY_LN1B, w->dx);
    }
    for (uint32_t r = 0; r < n; r++) {
        const float *d = w->dx + (size_t)r * D;
        float *ge = gE + (size_t)w->tokens[r] * D, *gp = gPos + (size_t)(r % T) * D;
        for (uint32_t i = 0; i < D; i++) { ge[i] += d[i]; gp[i] += d[i]; }
    }
    return loss;
}

/* Uniform(-a, a) with standard deviation s: a = s * sqrt(3). */
static void uniform(weei_rng *r, float *w, uint32_t n, float s) {
    float a = s * 1.7320508f;
    for (uint32_t k = 0; k < n; k++) w[k] = (2.0f * weei_rng_float(r) - 1.0f) * a;
}

static void fill(float *w, uint32_t n, float v) {
    for (uint32_t k = 0; k < n; k++) w[k] = v;
}

/* GPT-2's scheme: weights with standard deviation 0.02, the two projections
 * into the residual stream scaled by 1/sqrt(2L), biases 0, gains 1. */
void tfm_init(float *p, uint64_t seed) {
    weei_rng r;
    weei_rng_seed(&r, seed);
    weei_memzero(p, TFM_WEIGHT_BYTES);
    const float s = 0.02f, sres = 0.02f / __builtin_sqrtf(2.0f * TFM_L);
    uniform(&r, p, V * D, s);
    uniform(&r, p + TFM_OFF_POS, T * D, s);
    for (uint32_t l = 0; l < TFM_L; l++) {
        float *ly = p + TFM_OFF_LAYERS + (size_t)l * LY_SIZE;
        fill(ly + LY_LN1G, D, 1.0f);
        uniform(&r, ly + LY_WQKV, D * 3 * D, s);
        uniform(&r, ly + LY_WO, D * D, sres);
        fill(ly + LY_LN2G, D, 1.0f);
        uniform(&r, ly + LY_W1, D * F, s);
        uniform(&r, ly + LY_W2, F * D, sres);
    }
    fill(p + TFM_OFF_LNF, D, 1.0f);
}
