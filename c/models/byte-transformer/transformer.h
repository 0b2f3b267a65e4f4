/* byte-transformer: the shapes, the weight layout and the loss/gradient
 * entry point that model.c (the ABI operations) and check/gradcheck.c (the
 * native finite-difference test) share. Every size is a macro that a test
 * build may override with -D (a tiny config checks gradients quickly). */
#ifndef TRANSFORMER_H
#define TRANSFORMER_H

#include "../../sdk/weei_sdk.h"

#define TFM_V 256 /* vocabulary: bytes */
#ifndef TFM_D
#define TFM_D 128 /* width */
#endif
#ifndef TFM_L
#define TFM_L 3 /* layers */
#endif
#ifndef TFM_H
#define TFM_H 4 /* attention heads */
#endif
#ifndef TFM_F
#define TFM_F 448 /* MLP hidden width (3.5 x TFM_D) */
#endif
#ifndef TFM_T
#define TFM_T 64 /* context: tokens per example */
#endif
#define TFM_HD (TFM_D / TFM_H)

/* Weight layout (float32, in this order):
 *   E[V][D] token embedding, also the output projection (tied)
 *   P[T][D] position embedding
 *   per layer: ln1 gain[D], ln1 bias[D], Wqkv[D][3D], bqkv[3D], Wo[D][D], bo[D],
 *              ln2 gain[D], ln2 bias[D], W1[D][F], b1[F], W2[F][D], b2[D]
 *   final layer norm gain[D], bias[D]; output bias[V]. */
#define TFM_OFF_POS (TFM_V * TFM_D)
#define TFM_OFF_LAYERS (TFM_OFF_POS + TFM_T * TFM_D)
#define LY_LN1G 0
#define LY_LN1B (LY_LN1G + TFM_D)
#define LY_WQKV (LY_LN1B + TFM_D)
#define LY_BQKV (LY_WQKV + TFM_D * 3 * TFM_D)
#define LY_WO (LY_BQKV + 3 * TFM_D)
#define LY_BO (LY_WO + TFM_D * TFM_D)
#define LY_LN2G (LY_BO + TFM_D)
#define LY_LN2B (LY_LN2G + TFM_D)
#define LY_W1 (LY_LN2B + TFM_D)
#define LY_B1 (LY_W1 + TFM_D * TFM_F)
#define LY_W2 (LY_B1 + TFM_F)
#define LY_B2 (LY_W2 + TFM_F * TFM_D)
#define LY_SIZE (LY_B2 + TFM_D)
#define TFM_OFF_LNF (TFM_OFF_LAYERS + TFM_L * LY_SIZE)
#define TFM_OFF_BOUT (TFM_OFF_LNF + 2 * TFM_D)
#define TFM_N_PARAMS (TFM_OFF_BOUT + TFM_V)
#define TFM_WEIGHT_BYTES (TFM_N_PARAMS * 4)

/* Data format weei-bytes-v1: "WBT1", u32-le count n, n records of T+1 bytes
 * (the model reads bytes 0..T-1 and predicts bytes 1..T). */
#define TFM_RECORD (TFM_T + 1)
#define TFM_HEADER 8
#define TFM_MAX_EXAMPLES 4096

/* Sizes of tfm_work's wt (the largest dense layer) and zeros (its widest input). */
#define TFM_MAX2(a, b) ((a) > (b) ? (a) : (b))
#define TFM_WT_MAX (TFM_D * TFM_MAX2(TFM_MAX2(3 * TFM_D, TFM_F), TFM_V))
#define TFM_ZEROS TFM_MAX2(TFM_F, TFM_D)

/* Activations and gradient scratch for up to `batch` sequences. */
typedef struct {
    uint32_t batch;
    uint8_t *tokens, *targets;                  /* [N] */
    float *x[TFM_L + 1];                        /* residual stream entering layer l; x[L] leaves the last */
    float *xhat1[TFM_L], *rstd1[TFM_L], *y1[TFM_L];
    float *qkv[TFM_L], *prob[TFM_L], *att[TFM_L], *xm[TFM_L];
    float *xhat2[TFM_L], *rstd2[TFM_L], *y2[TFM_L], *h[TFM_L];
    float *xhatf, *rstdf, *yf, *logits, *et;     /* et: E transposed, [D][V] */
    float *dx, *dy, *dqkv, *datt, *dh, *dlogits, *det;
    float *wt, *zeros; /* a dense layer's W transposed, a zero bias (backward) */
} tfm_work;

int tfm_work_alloc(tfm_work *w, uint32_t batch);
void tfm_work_free(tfm_work *w);
/* Copies `count` records (each TFM_RECORD bytes, picked by idx, or in order
 * when idx is NULL) into the workspace's tokens and targets. */
void tfm_gather(tfm_work *w, const uint8_t *records, const uint32_t *idx, uint32_t count);
/* Mean next-byte cross-entropy over the count*T gathered positions; when grad
 * is non-NULL, writes (overwrites) its gradient. *correct counts argmax hits. */
double tfm_loss(tfm_work *w, const float *p, uint32_t count, float *grad, uint32_t *correct);
/* Initial weights from a seed. */
void tfm_init(float *p, uint64_t seed);

/* Training defaults. Activations cost ~2.2 MB per record, so a large
 * batchSize would need gigabytes; a minibatch larger than TFM_MICRO_BATCH
 * runs as micro-batches whose gradients are summed, which keeps memory
 * fixed whatever batchSize is (on the GPU: a minibatch is at most this). */
#define DEFAULT_LR 0.002f
#define DEFAULT_BATCH 8
#define MICRO_BATCH 8

/* model.c's state and input readers, shared with gpu.c (the GPU backend). */
extern float *g_loaded; /* weights of the last loadModel */
extern int g_has_weights;
extern float *g_out;
int tfm_buffers(void);
/* Reads {"data": region, "format": "..."}; the example count or weei_fail. */
int64_t tfm_read_data(const wj_doc *in, weei_region *d, const char *op);
int tfm_read_step_limit(const wj_doc *in, uint32_t *limit);

#endif
