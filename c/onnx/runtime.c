/* The ONNX graph runtime: one Weei WASM ABI 1 module that trains any graph of
 * the operators below over float32 (docs/onnx.md).
 *
 * The graph, the training settings, the ModelInfo and the initial weights are
 * not compiled in: `weei model import` (weei.onnx) appends them to this
 * module as an active data segment (the "blob") placed past the compiled
 * memory, and writes where it lies into g_slot, found by its magic in the
 * data section. The SDK's heap starts above the blob (built with
 * -DWEEI_HEAP_FLOOR=onnx_heap_floor), so nothing overwrites it.
 *
 * Blob (little-endian, u32 words unless said): "WOG1"; info length and the
 * ModelInfo JSON padded to 4 bytes; CFG_WORDS config words; FCFG_WORDS float
 * settings; n_tensors tensor records of TENSOR_WORDS; n_nodes node records
 * of NODE_WORDS; n_consts float32 constants; n_weights float32 initial
 * weights. Shapes are resolved by the importer: a negative dim -k means k
 * times the batch size.
 */
#include "../sdk/weei_sdk.h"

#define MAX_DIMS 6
#define TENSOR_WORDS (2 + MAX_DIMS + 1)
#define NODE_WORDS 26
#define CFG_WORDS 16
#define FCFG_WORDS 8
#define MAX_TENSORS 65536
#define MAX_NODES 65536
#define EVAL_BATCH 256u
#define ABSENT 0xFFFFFFFFu

enum { T_INPUT = 0, T_PARAM = 1, T_STATE = 2, T_CONST = 3, T_ACT = 4 };
enum {
    OP_MATMUL = 1, OP_GEMM, OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_RELU, OP_TANH, OP_SIGMOID, OP_SOFTMAX,
    OP_LOGSOFTMAX, OP_COPY, OP_CONV, OP_MAXPOOL, OP_AVGPOOL, OP_GAP, OP_BATCHNORM, OP_DROPOUT, OP_LEAKYRELU,
    OP_LAYERNORM, OP_GELU, OP_TRANSPOSE, OP_CONCAT, OP_GATHER,
    OP_COUNT
};
enum { LOSS_CE = 0, LOSS_MSE = 1, LOSS_NEXT = 2 };
enum { OPT_SGD = 0, OPT_ADAM = 1, OPT_ADAMW = 2 };
enum { FMT_RECORDS = 0, FMT_DIGITS = 1, FMT_TOKENS = 2 };
/* config words */
enum { C_INPUT, C_OUTPUT, C_LOSS_T, C_LOSS, C_OPT, C_FORMAT, C_FEATURES, C_BATCH, C_NPARAMS, C_NWEIGHTS,
       C_NTENSORS, C_NNODES, C_NCONSTS, C_MAXEX, C_CLASSES };
enum { F_LR, F_B1, F_B2, F_EPS, F_WD };

/* Patched by the importer: the blob's offset and length in linear memory. */
static volatile struct { char magic[16]; uint32_t off, bytes; } g_slot = { "WEEI-ONNX-SLOT-1", 0, 0 };

uint32_t onnx_heap_floor(void) { return g_slot.off + g_slot.bytes; }

typedef struct {
    uint32_t kind, ndim, off;
    uint32_t uses;  /* node inputs reading it, +1 for the loss tensor (whose gradient loss_of seeds) */
    int32_t dims[MAX_DIMS];
    uint32_t d[MAX_DIMS];  /* resolved for the current batch */
    uint64_t size;
    float *val, *grad;
} tensor;

typedef struct {
    uint32_t op, n_in, in[5], n_out, out[2];
    int32_t ia[12];
    float fa[4];
    float *aux;     /* maxpool argmax / dropout mask / batchnorm mean+invstd */
} node;

static const uint8_t *g_blob;
static const char *g_info;
static uint32_t g_info_len, g_cfg[CFG_WORDS];
static float g_fcfg[FCFG_WORDS];
static tensor *g_t;
static node *g_n;
static const float *g_consts, *g_init;
static int g_ready;             /* 1 parsed, -1 refused */
static const char *g_refusal;
static float *g_loaded, *g_out, *g_grad;
static int g_has_weights;
static uint32_t g_planned;      /* batch the buffers hold */
static weei_rng g_drop_rng;

static uint32_t rd32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

static int refuse(const char *why) { g_ready = -1; g_refusal = why; return -1; }

/* Parses the blob once; every index and size is checked. */
static int graph_ready(void) {
    if (g_ready) return g_ready > 0 ? 0 : weei_fail(g_refusal);
    if (g_slot.bytes == 0) { refuse("this module holds no graph: it is the bare ONNX runtime (weei model import adds one)"); return weei_fail(g_refusal); }
    const uint8_t *p = weei_addr(g_slot.off), *end = p + g_slot.bytes;
    if ((uint64_t)g_slot.off + g_slot.bytes > weei_memory_bytes() || g_slot.bytes < 8 || p[0] != 'W' || p[1] != 'O' || p[2] != 'G' || p[3] != '1') {
        refuse("graph blob: bad magic or outside memory"); return weei_fail(g_refusal);
    }
    g_blob = p;
    p += 4;
    g_info_len = rd32(p); p += 4;
    if (g_info_len > (uint32_t)(end - p)) { refuse("graph blob: truncated info"); return weei_fail(g_refusal); }
    g_info = (const char *)p;
    p += (g_info_len + 3u) & ~3u;
    if ((uint64_t)(end - p) < 4u * (CFG_WORDS + FCFG_WORDS)) { refuse("graph blob: truncated config"); return weei_fail(g_refusal); }
    for (int i = 0; i < CFG_WORDS; i++, p += 4) g_cfg[i] = rd32(p);
    for (int i = 0; i < FCFG_WORDS; i++, p += 4) g_fcfg[i] = weei_f32_from_bits(rd32(p));
    uint32_t nt = g_cfg[C_NTENSORS], nn = g_cfg[C_NNODES];
    if (nt == 0 || nt > MAX_TENSORS || nn == 0 || nn > MAX_NODES) { refuse("graph blob: tensor or node count out of range"); return weei_fail(g_refusal); }
    uint64_t need = 4ull * ((uint64_t)nt * TENSOR_WORDS + (uint64_t)nn * NODE_WORDS + g_cfg[C_NCONSTS] + g_cfg[C_NWEIGHTS]);
    if (need != (uint64_t)(end - p)) { refuse("graph blob: sizes do not add up"); return weei_fail(g_refusal); }
    if (g_cfg[C_NPARAMS] > g_cfg[C_NWEIGHTS] || g_cfg[C_NWEIGHTS] == 0) { refuse("graph blob: bad weight count"); return weei_fail(g_refusal); }
    g_t = weei_calloc((size_t)nt * sizeof(tensor));
    g_n = weei_calloc((size_t)nn * sizeof(node));
    if (!g_t || !g_n) { refuse("out of memory"); return weei_fail(g_refusal); }
    for (uint32_t i = 0; i < nt; i++, p += 4 * TENSOR_WORDS) {
        tensor *t = &g_t[i];
        t->kind = rd32(p); t->ndim = rd32(p + 4);
        if (t->kind > T_ACT || t->ndim > MAX_DIMS) { refuse("graph blob: bad tensor"); return weei_fail(g_refusal); }
        uint64_t n = 1;
        for (uint32_t k = 0; k < MAX_DIMS; k++) {
            t->dims[k] = (int32_t)rd32(p + 8 + 4 * k);
            if (k < t->ndim) {
                int64_t d = t->dims[k] < 0 ? -(int64_t)t->dims[k] : t->dims[k];
                n *= (uint64_t)d;
                if (d == 0 || n > (1u << 28)) { refuse("graph blob: a tensor is empty or over 2^28 values per example"); return weei_fail(g_refusal); }
            }
        }
        t->off = rd32(p + 8 + 4 * MAX_DIMS);
        uint64_t lim = t->kind == T_CONST ? g_cfg[C_NCONSTS] : (t->kind == T_PARAM || t->kind == T_STATE) ? g_cfg[C_NWEIGHTS] : 0;
        if ((t->kind == T_CONST || t->kind == T_PARAM || t->kind == T_STATE) && (uint64_t)t->off + n > lim) {
            refuse("graph blob: a tensor lies outside the weights or constants"); return weei_fail(g_refusal);
        }
        if (t->kind != T_INPUT && t->kind != T_ACT) for (uint32_t k = 0; k < t->ndim; k++)
            if (t->dims[k] < 0) { refuse("graph blob: a weight has a batch dimension"); return weei_fail(g_refusal); }
    }
    for (uint32_t i = 0; i < nn; i++, p += 4 * NODE_WORDS) {
        node *n = &g_n[i];
        n->op = rd32(p); n->n_in = rd32(p + 4);
        for (int k = 0; k < 5; k++) n->in[k] = rd32(p + 8 + 4 * k);
        n->n_out = rd32(p + 28);
        n->out[0] = rd32(p + 32); n->out[1] = rd32(p + 36);
        for (int k = 0; k < 12; k++) n->ia[k] = (int32_t)rd32(p + 40 + 4 * k);
        for (int k = 0; k < 4; k++) n->fa[k] = weei_f32_from_bits(rd32(p + 88 + 4 * k));
        if (n->op == 0 || n->op >= OP_COUNT || n->n_in == 0 || n->n_in > 5 || n->n_out != 1) { refuse("graph blob: bad node"); return weei_fail(g_refusal); }
        for (uint32_t k = 0; k < n->n_in; k++) if (n->in[k] != ABSENT && n->in[k] >= nt) { refuse("graph blob: a node input is out of range"); return weei_fail(g_refusal); }
        if (n->out[0] >= nt || g_t[n->out[0]].kind != T_ACT) { refuse("graph blob: a node output is not an activation"); return weei_fail(g_refusal); }
        if (n->in[0] == ABSENT) { refuse("graph blob: a node lacks its first input"); return weei_fail(g_refusal); }
        uint32_t r = g_t[n->out[0]].ndim;
        int bad = (n->op == OP_LAYERNORM && (n->ia[1] < 1 || n->n_in < 2 || n->in[1] == ABSENT)) ||
                  (n->op == OP_CONCAT && (n->ia[0] < 0 || (uint32_t)n->ia[0] >= r)) ||
                  (n->op == OP_GATHER && (n->n_in != 2 || n->in[1] == ABSENT || g_t[n->in[0]].ndim == 0));
        if (n->op == OP_TRANSPOSE) for (uint32_t k = 0; k < r; k++) bad |= n->ia[k] < 0 || (uint32_t)n->ia[k] >= r;
        if (bad) { refuse("graph blob: bad operator attributes"); return weei_fail(g_refusal); }
    }
    g_consts = (const float *)p;
    p += 4ull * g_cfg[C_NCONSTS];
    g_init = (const float *)p;
    if (g_cfg[C_INPUT] >= nt || g_t[g_cfg[C_INPUT]].kind != T_INPUT || g_cfg[C_OUTPUT] >= nt || g_cfg[C_LOSS_T] >= nt ||
        g_cfg[C_FEATURES] == 0 || g_cfg[C_BATCH] == 0 || g_cfg[C_MAXEX] == 0) {
        refuse("graph blob: bad config"); return weei_fail(g_refusal);
    }
    for (uint32_t i = 0; i < nt; i++) {
        tensor *t = &g_t[i];
        if (t->kind == T_CONST) t->val = (float *)(g_consts + t->off);
    }
    for (uint32_t i = 0; i < nn; i++) for (uint32_t k = 0; k < g_n[i].n_in; k++) if (g_n[i].in[k] != ABSENT) g_t[g_n[i].in[k]].uses++;
    g_t[g_cfg[C_LOSS_T]].uses++;
    g_ready = 1;
    return 0;
}

/* Resolves dims for batch b; sizes in floats. */
static void resolve(uint32_t b) {
    for (uint32_t i = 0; i < g_cfg[C_NTENSORS]; i++) {
        tensor *t = &g_t[i];
        uint64_t n = 1;
        for (uint32_t k = 0; k < t->ndim; k++) {
            t->d[k] = t->dims[k] < 0 ? (uint32_t)(-t->dims[k]) * b : (uint32_t)t->dims[k];
            n *= t->d[k];
        }
        t->size = n;
    }
}

/* Scratch of the MatMul/Gemm nodes, sized by plan() for the largest (mm_scratch_floats): a B side
 * that must be contiguous, and Gemm's alpha-scaled gradient. Nothing is allocated per step. */
static float *g_scratch;
static uint64_t g_scratch_floats;

/* A MatMul by a trained [K, N] weight is a dense layer without a bias (what exporters write for
 * Linear(bias=False) and for a transformer's projections): it runs the SDK's dense kernels, those of
 * the hand-written models, with a zero bias. Their sums are mm_acc's, in the same order of k. */
static int mm_dense(const node *n) {
    const tensor *B = &g_t[n->in[1]];
    return B->kind == T_PARAM && B->ndim == 2;
}

static uint64_t mm_scratch_floats(const node *n) {
    if (n->op != OP_MATMUL && n->op != OP_GEMM) return 0;
    const tensor *A = &g_t[n->in[0]], *B = &g_t[n->in[1]], *Y = &g_t[n->out[0]];
    uint64_t kn = B->ndim >= 2 ? (uint64_t)B->d[B->ndim - 1] * B->d[B->ndim - 2] : B->size, y = Y->size, a = A->size;
    if (n->op == OP_MATMUL && mm_dense(n)) return Y->d[Y->ndim - 1] + (kn > Y->d[Y->ndim - 1] ? kn : Y->d[Y->ndim - 1]);   /* zeros, then db or B transposed */
    if (n->op == OP_MATMUL) return kn;   /* B transposed, one batch at a time */
    uint64_t most = kn > a ? kn : a;
    return (most > y ? most : y) + y;
}

static void free_plan(void) {
    for (uint32_t i = 0; i < g_cfg[C_NTENSORS]; i++) {
        tensor *t = &g_t[i];
        if (t->kind == T_INPUT || t->kind == T_ACT) { weei_mfree(t->val); weei_mfree(t->grad); t->val = t->grad = 0; }
    }
    for (uint32_t i = 0; i < g_cfg[C_NNODES]; i++) { weei_mfree(g_n[i].aux); g_n[i].aux = 0; }
    weei_mfree(g_grad); g_grad = 0;
    weei_mfree(g_scratch); g_scratch = 0; g_scratch_floats = 0;
    g_planned = 0;
}

/* Buffers for batches up to b; `grads` also for training. */
static int plan(uint32_t b, int grads) {
    free_plan();
    resolve(b);
    for (uint32_t i = 0; i < g_cfg[C_NTENSORS]; i++) {
        tensor *t = &g_t[i];
        if (t->kind != T_INPUT && t->kind != T_ACT) continue;
        if (t->size > (1u << 28)) return -1;
        t->val = weei_malloc(t->size * 4);
        if (!t->val) return -1;
        if (grads && t->kind == T_ACT) { t->grad = weei_malloc(t->size * 4); if (!t->grad) return -1; }
    }
    for (uint32_t i = 0; i < g_cfg[C_NNODES]; i++) {
        node *n = &g_n[i];
        uint64_t bytes = 0;
        if (n->op == OP_MAXPOOL || n->op == OP_DROPOUT) bytes = g_t[n->out[0]].size * 4;
        if (n->op == OP_BATCHNORM) bytes = 2ull * g_t[n->in[0]].d[1] * 4;
        if (n->op == OP_LAYERNORM) bytes = 2ull * (g_t[n->in[0]].size / (uint64_t)n->ia[1]) * 4;
        if (bytes) { n->aux = weei_malloc(bytes); if (!n->aux) return -1; }
        uint64_t mm = mm_scratch_floats(n);
        if (mm > g_scratch_floats) g_scratch_floats = mm;
    }
    if (g_scratch_floats) {
        if (g_scratch_floats > (1u << 28)) return -1;
        g_scratch = weei_malloc(g_scratch_floats * 4);
        if (!g_scratch) return -1;
    }
    if (grads) { g_grad = weei_malloc((size_t)g_cfg[C_NWEIGHTS] * 4); if (!g_grad) return -1; }
    g_planned = b;
    return 0;
}

/* Points parameter and state tensors at the weight vector w (and grads at g_grad). */
static void bind(float *w) {
    for (uint32_t i = 0; i < g_cfg[C_NTENSORS]; i++) {
        tensor *t = &g_t[i];
        if (t->kind == T_PARAM || t->kind == T_STATE) {
            t->val = w + t->off;
            t->grad = t->kind == T_PARAM && g_grad ? g_grad + t->off : 0;
        }
    }
}

/* ---- kernels ----------------------------------------------------------- */

/* C[M][N] += A[M][K] B[K][N]. Each element is c + a0 b0 + a1 b1 + ... in the order of k whatever
 * the blocking, so results do not depend on it. A block of ROWS rows and NV 4-lane vectors of
 * columns, the last holding R lanes (SIMD128 in wasm; constants after inlining), keeps its sums
 * in registers over the whole k loop: one load and one store of C per block instead of one per
 * k, and each loaded B vector serves ROWS rows. A partial vector reads and writes only its R
 * lanes (the others are zero), so narrow outputs (10 classes) stay vectorised. */
typedef float v4 __attribute__((vector_size(16)));
#define MM_INLINE static inline __attribute__((always_inline))
MM_INLINE v4 mm_ld(const float *p, const uint32_t R) {
    v4 v = { 0, 0, 0, 0 };
    if (R == 4) __builtin_memcpy(&v, p, 16);
    else for (uint32_t i = 0; i < R; i++) v[i] = p[i];
    return v;
}
MM_INLINE void mm_st(float *p, v4 v, const uint32_t R) {
    if (R == 4) __builtin_memcpy(p, &v, 16);
    else for (uint32_t i = 0; i < R; i++) p[i] = v[i];
}
#define MM_LANES(v, NV, R) ((v) + 1 == (NV) ? (R) : 4u)

MM_INLINE void mm_block(float *restrict C, const float *restrict A, uint32_t sar, uint32_t sak, const float *restrict B,
                        uint32_t m, const uint32_t ROWS, uint32_t K, uint32_t N, uint32_t n, const uint32_t NV, const uint32_t R) {
    v4 acc[4][4];
    for (uint32_t r = 0; r < ROWS; r++)
        for (uint32_t v = 0; v < NV; v++) acc[r][v] = mm_ld(C + (size_t)(m + r) * N + n + 4 * v, MM_LANES(v, NV, R));
    for (uint32_t k = 0; k < K; k++) {
        const float *b = B + (size_t)k * N + n;
        v4 bv[4];
        for (uint32_t v = 0; v < NV; v++) bv[v] = mm_ld(b + 4 * v, MM_LANES(v, NV, R));
        for (uint32_t r = 0; r < ROWS; r++) {
            float a = A[(size_t)(m + r) * sar + (size_t)k * sak];
            v4 av = { a, a, a, a };
            for (uint32_t v = 0; v < NV; v++) acc[r][v] += av * bv[v];
        }
    }
    for (uint32_t r = 0; r < ROWS; r++)
        for (uint32_t v = 0; v < NV; v++) mm_st(C + (size_t)(m + r) * N + n + 4 * v, acc[r][v], MM_LANES(v, NV, R));
}

MM_INLINE void mm_cols(float *restrict C, const float *restrict A, uint32_t sar, uint32_t sak, const float *restrict B,
                       uint32_t M, uint32_t K, uint32_t N, uint32_t n, const uint32_t NV, const uint32_t R) {
    uint32_t m = 0;
    if (NV > 2) for (; m + 2 <= M; m += 2) mm_block(C, A, sar, sak, B, m, 2, K, N, n, NV, R);
    else for (; m + 4 <= M; m += 4) mm_block(C, A, sar, sak, B, m, 4, K, N, n, NV, R);
    for (; m < M; m++) mm_block(C, A, sar, sak, B, m, 1, K, N, n, NV, R);
}

/* C[M][N] += A' B with A'[m][k] = A[m sar + k sak]: A (sar K, sak 1) or a transposed operand read in
 * place (sar 1, sak its row length), so no step copies an A side; B is contiguous [K][N]. */
static void mm_acc_s(float *restrict C, const float *restrict A, uint32_t sar, uint32_t sak, const float *restrict B,
                     uint32_t M, uint32_t K, uint32_t N) {
    uint32_t n = 0;
    for (; n + 16 <= N; n += 16) mm_cols(C, A, sar, sak, B, M, K, N, n, 4, 4);
#define MM_TAIL(NV, R) mm_cols(C, A, sar, sak, B, M, K, N, n, NV, R)
    switch (N - n) {   /* the last 1..15 columns: NV vectors, the last with R lanes */
    case 1: MM_TAIL(1, 1); break;   case 2: MM_TAIL(1, 2); break;   case 3: MM_TAIL(1, 3); break;
    case 4: MM_TAIL(1, 4); break;   case 5: MM_TAIL(2, 1); break;   case 6: MM_TAIL(2, 2); break;
    case 7: MM_TAIL(2, 3); break;   case 8: MM_TAIL(2, 4); break;   case 9: MM_TAIL(3, 1); break;
    case 10: MM_TAIL(3, 2); break;  case 11: MM_TAIL(3, 3); break;  case 12: MM_TAIL(3, 4); break;
    case 13: MM_TAIL(4, 1); break;  case 14: MM_TAIL(4, 2); break;  case 15: MM_TAIL(4, 3); break;
    default: break;
    }
#undef MM_TAIL
}

static void mm_acc(float *restrict C, const float *restrict A, const float *restrict B, uint32_t M, uint32_t K, uint32_t N) {
    mm_acc_s(C, A, K, 1, B, M, K, N);
}

static void transpose2(float *restrict out, const float *restrict in, uint32_t R, uint32_t Cc) {
    for (uint32_t r = 0; r < R; r++) for (uint32_t c = 0; c < Cc; c++) out[(size_t)c * R + r] = in[(size_t)r * Cc + c];
}

/* MatMul: A [.., M, K] x B [K, N] (A's leading dims fold into M) or batched with equal leading dims.
 * Backward: dB += A^T dY reads A in place; dA += dY B^T from B transposed into the scratch (only
 * [K, N]). Gradients accumulate straight into A and B's gradients. */
static void matmul(node *n, int backward) {
    tensor *A = &g_t[n->in[0]], *B = &g_t[n->in[1]], *Y = &g_t[n->out[0]];
    uint32_t K = A->d[A->ndim - 1], N = B->d[B->ndim - 1];
    uint64_t batches = 1, M;
    if (B->ndim == 2) M = A->size / K;
    else { M = A->d[A->ndim - 2]; batches = A->size / (M * K); }
    uint64_t sa = M * K, sb = B->ndim == 2 ? 0 : (uint64_t)K * N, sy = M * N;
    if (mm_dense(n)) {
        float *zeros = g_scratch, *db = g_scratch + N;
        if (!backward) {
            weei_memzero(zeros, (size_t)N * 4);
            weei_dense_forward(A->val, (uint32_t)M, K, N, B->val, zeros, Y->val);
            return;
        }
        if (!B->grad) return;   /* evaluation plans no gradients */
        weei_memzero(db, (size_t)N * 4);
        weei_dense_backward(A->val, Y->grad, (uint32_t)M, K, N, B->val, B->grad, db, 0);
        /* dA += dY B^T: the SDK's dx is a dot product per value (a transposed copy of W only up to 8192
         * values); B transposed into the scratch and the blocked kernel accumulate instead */
        if (A->grad) { transpose2(g_scratch + N, B->val, K, N); mm_acc(A->grad, Y->grad, g_scratch + N, (uint32_t)M, N, K); }
        return;
    }
    if (!backward) {
        weei_memzero(Y->val, Y->size * 4);
        for (uint64_t i = 0; i < batches; i++) mm_acc(Y->val + i * sy, A->val + i * sa, B->val + i * sb, (uint32_t)M, K, N);
        return;
    }
    for (uint64_t i = 0; i < batches; i++) {
        if (A->grad) { transpose2(g_scratch, B->val + i * sb, K, N); mm_acc(A->grad + i * sa, Y->grad + i * sy, g_scratch, (uint32_t)M, N, K); }
        if (B->grad) mm_acc_s(B->grad + i * sb, A->val + i * sa, 1, K, Y->grad + i * sy, K, (uint32_t)M, N);
    }
}

/* Gemm: Y = alpha op(A) op(B) + beta C, A and B 2-D, C broadcast to [M, N]. op(A) is always read in
 * place (mm_acc_s's strides); only a transposed B side that must be contiguous goes through the
 * scratch. Gradients accumulate straight into A, B and C's gradients. */
static void gemm(node *n, int backward) {
    tensor *A = &g_t[n->in[0]], *B = &g_t[n->in[1]], *Y = &g_t[n->out[0]];
    tensor *Cb = n->n_in > 2 && n->in[2] != ABSENT ? &g_t[n->in[2]] : 0;
    int ta = n->ia[0], tb = n->ia[1];
    float alpha = n->fa[0], beta = n->fa[1];
    uint32_t M = Y->d[0], N = Y->d[1], K = ta ? A->d[0] : A->d[1];
    uint64_t MN = (uint64_t)M * N;
    float *t = g_scratch, *a = A->val, *b = B->val;
    /* C's strides over [M, N]: a dim of 1 (or absent) broadcasts */
    uint32_t cm = 0, cn = 0;
    if (Cb) {
        if (Cb->ndim == 2) { cm = Cb->d[0] == 1 ? 0 : Cb->d[1]; cn = Cb->d[1] == 1 ? 0 : 1; }
        else if (Cb->ndim == 1) { cn = Cb->d[0] == 1 ? 0 : 1; }
    }
    /* A dense layer (x W + b, the shape every exporter writes for Linear): the SDK's kernels, those of
     * the hand-written models. Their dx is stored, not added, so A's gradient must have no other reader. */
    int dense = !ta && !tb && alpha == 1.0f && beta == 1.0f && Cb && cm == 0 && cn == 1 && Cb->size == N;
    if (dense && !backward) { weei_dense_forward(a, M, K, N, b, Cb->val, Y->val); return; }
    if (dense && B->grad && Cb->grad && (!A->grad || A->uses == 1)) {
        weei_dense_backward(a, Y->grad, M, K, N, b, B->grad, Cb->grad, A->grad);
        return;
    }
    if (!backward) {
        /* alpha 1: the sums start from beta C, as weei_dense_forward starts from the bias (one pass
         * over Y fewer); otherwise from 0, scaled, then beta C added */
        int fold = alpha == 1.0f && Cb;
        if (fold) for (uint32_t m = 0; m < M; m++) for (uint32_t j = 0; j < N; j++) Y->val[(size_t)m * N + j] = beta * Cb->val[m * cm + j * cn];
        else weei_memzero(Y->val, (size_t)Y->size * 4);
        if (tb) { transpose2(t, b, N, K); b = t; }
        mm_acc_s(Y->val, a, ta ? 1 : K, ta ? M : 1, b, M, K, N);
        if (alpha != 1.0f) for (uint64_t i = 0; i < MN; i++) Y->val[i] *= alpha;
        if (Cb && !fold) for (uint32_t m = 0; m < M; m++) for (uint32_t j = 0; j < N; j++) Y->val[(size_t)m * N + j] += beta * Cb->val[m * cm + j * cn];
        return;
    }
    /* alpha 1 (the usual) reads Y's gradient as it is: no copy, and no multiply of tiny values */
    float *g = Y->grad;
    if (alpha != 1.0f) { g = g_scratch + (g_scratch_floats - MN); for (uint64_t i = 0; i < MN; i++) g[i] = alpha * Y->grad[i]; }
    if (A->grad) {
        if (!ta) {   /* dA [M,K] += g op(B)^T; op(B)^T is B itself when tb */
            const float *bt = b;
            if (!tb) { transpose2(t, b, K, N); bt = t; }
            mm_acc(A->grad, g, bt, M, N, K);
        } else {     /* dA [K,M] += op(B) g^T */
            transpose2(t, g, M, N);
            mm_acc_s(A->grad, b, tb ? 1 : N, tb ? K : 1, t, K, N, M);
        }
    }
    if (B->grad) {
        if (!tb) mm_acc_s(B->grad, a, ta ? M : 1, ta ? 1 : K, g, K, M, N);   /* dB [K,N] += op(A)^T g */
        else {       /* dB [N,K] += g^T op(A) */
            const float *oa = a;
            if (ta) { transpose2(t, a, K, M); oa = t; }
            mm_acc_s(B->grad, g, 1, N, oa, N, M, K);
        }
    }
    if (Cb && Cb->grad) {
        if (cm == 0 && cn == 1 && beta == 1.0f) {
            for (uint32_t m = 0; m < M; m++) { const float *yg = Y->grad + (size_t)m * N; for (uint32_t j = 0; j < N; j++) Cb->grad[j] += yg[j]; }
        } else for (uint32_t m = 0; m < M; m++) for (uint32_t j = 0; j < N; j++) Cb->grad[m * cm + j * cn] += beta * Y->grad[(size_t)m * N + j];
    }
}

/* Elementwise binary op with numpy broadcasting. */
static void strides_for(const tensor *x, const tensor *y, uint32_t *s) {
    uint32_t R = y->ndim, run = 1;
    for (int d = (int)R - 1; d >= 0; d--) {
        int xd = d - (int)(R - x->ndim);
        if (xd < 0) { s[d] = 0; continue; }
        s[d] = x->d[xd] == 1 && y->d[d] != 1 ? 0 : run;
        run *= x->d[xd];
    }
}

/* x's dims, leading 1s aside, are y's last dims: x repeats every x->size elements of y. */
static int suffix_of(const tensor *x, const tensor *y) {
    uint32_t r = x->ndim;
    while (r > 0 && x->d[x->ndim - r] == 1) r--;
    if (r > y->ndim) return 0;
    for (uint32_t k = 0; k < r; k++) if (x->d[x->ndim - r + k] != y->d[y->ndim - r + k]) return 0;
    return 1;
}

static void binary(node *n, int backward) {
    tensor *A = &g_t[n->in[0]], *B = &g_t[n->in[1]], *Y = &g_t[n->out[0]];
    uint32_t op = n->op, R = Y->ndim;
    if (A->size == Y->size && B->size == Y->size) {   /* same shape: a flat loop (vectorised) */
        float *y = Y->val;
        const float *a = A->val, *b = B->val;
        uint64_t m = Y->size;
        if (!backward) {
            if (op == OP_ADD) for (uint64_t i = 0; i < m; i++) y[i] = a[i] + b[i];
            else if (op == OP_SUB) for (uint64_t i = 0; i < m; i++) y[i] = a[i] - b[i];
            else if (op == OP_MUL) for (uint64_t i = 0; i < m; i++) y[i] = a[i] * b[i];
            else for (uint64_t i = 0; i < m; i++) y[i] = a[i] / b[i];
            return;
        }
        const float *g = Y->grad;
        for (uint64_t i = 0; i < m; i++) {
            float da = op == OP_MUL ? b[i] : op == OP_DIV ? 1.0f / b[i] : 1.0f;
            float db = op == OP_ADD ? 1.0f : op == OP_SUB ? -1.0f : op == OP_MUL ? a[i] : -a[i] / (b[i] * b[i]);
            if (A->grad) A->grad[i] += g[i] * da;
            if (B->grad) B->grad[i] += g[i] * db;
        }
        return;
    }
    if (A->size == Y->size && suffix_of(B, Y)) {
        /* B repeats along the leading dims (a bias, a mask, a scalar): flat inner loops over each
         * repetition, the same operations in the same order as the general walk below */
        uint64_t bs = B->size, reps = Y->size / bs;
        const float *b = B->val;
        for (uint64_t o = 0; o < reps; o++) {
            const float *a = A->val + o * bs;
            if (!backward) {
                float *y = Y->val + o * bs;
                if (op == OP_ADD) for (uint64_t j = 0; j < bs; j++) y[j] = a[j] + b[j];
                else if (op == OP_SUB) for (uint64_t j = 0; j < bs; j++) y[j] = a[j] - b[j];
                else if (op == OP_MUL) for (uint64_t j = 0; j < bs; j++) y[j] = a[j] * b[j];
                else for (uint64_t j = 0; j < bs; j++) y[j] = a[j] / b[j];
                continue;
            }
            const float *g = Y->grad + o * bs;
            if (A->grad) {
                float *ga = A->grad + o * bs;
                if (op == OP_ADD) for (uint64_t j = 0; j < bs; j++) ga[j] += g[j];
                else if (op == OP_SUB) for (uint64_t j = 0; j < bs; j++) ga[j] += g[j];
                else if (op == OP_MUL) for (uint64_t j = 0; j < bs; j++) ga[j] += g[j] * b[j];
                else for (uint64_t j = 0; j < bs; j++) ga[j] += g[j] * (1.0f / b[j]);
            }
            if (B->grad) {
                float *gb = B->grad;
                if (op == OP_ADD) for (uint64_t j = 0; j < bs; j++) gb[j] += g[j];
                else if (op == OP_SUB) for (uint64_t j = 0; j < bs; j++) gb[j] += g[j] * -1.0f;
                else if (op == OP_MUL) for (uint64_t j = 0; j < bs; j++) gb[j] += g[j] * a[j];
                else for (uint64_t j = 0; j < bs; j++) gb[j] += g[j] * (-a[j] / (b[j] * b[j]));
            }
        }
        return;
    }
    uint32_t sa[MAX_DIMS], sb[MAX_DIMS], idx[MAX_DIMS] = {0};
    strides_for(A, Y, sa);
    strides_for(B, Y, sb);
    uint64_t ia = 0, ib = 0;
    for (uint64_t i = 0; i < Y->size; i++) {
        float a = A->val[ia], b = B->val[ib];
        if (!backward) {
            Y->val[i] = op == OP_ADD ? a + b : op == OP_SUB ? a - b : op == OP_MUL ? a * b : a / b;
        } else {
            float g = Y->grad[i];
            if (A->grad) A->grad[ia] += g * (op == OP_MUL ? b : op == OP_DIV ? 1.0f / b : 1.0f);
            if (B->grad) B->grad[ib] += g * (op == OP_ADD ? 1.0f : op == OP_SUB ? -1.0f : op == OP_MUL ? a : -a / (b * b));
        }
        for (int d = (int)R - 1; d >= 0; d--) {
            ia += sa[d]; ib += sb[d];
            if (++idx[d] < Y->d[d]) break;
            idx[d] = 0;
            ia -= (uint64_t)sa[d] * Y->d[d]; ib -= (uint64_t)sb[d] * Y->d[d];
        }
    }
}

static float sigmoidf(float x) { return 1.0f / (1.0f + weei_expf(-x)); }

/* g masked by x > 0 with a bitwise and (no branch: half the signs are unpredictable), stored when x has
 * no other reader (no add, and tiny gradients are slow to add), else added. */
static void relu_backward(const float *x, const float *g, float *gx, uint64_t m, int sole) {
    typedef int32_t v4i __attribute__((vector_size(16)));
    const v4 zero = { 0, 0, 0, 0 };
    uint64_t i = 0;
    for (; i + 4 <= m; i += 4) {
        v4 xv, gv, gxv;
        __builtin_memcpy(&xv, x + i, 16);
        __builtin_memcpy(&gv, g + i, 16);
        v4 d = (v4)((v4i)gv & (xv > zero));
        if (!sole) { __builtin_memcpy(&gxv, gx + i, 16); d = gxv + d; }
        __builtin_memcpy(gx + i, &d, 16);
    }
    for (; i < m; i++) { float d = x[i] > 0.0f ? g[i] : 0.0f; gx[i] = sole ? d : gx[i] + d; }
}

static void unary(node *n, int backward) {
    tensor *X = &g_t[n->in[0]], *Y = &g_t[n->out[0]];
    uint64_t m = Y->size;
    float *x = X->val, *y = Y->val, alpha = n->fa[0];
    if (!backward) {
        switch (n->op) {
        case OP_RELU: for (uint64_t i = 0; i < m; i++) y[i] = x[i] > 0.0f ? x[i] : 0.0f; break;
        case OP_LEAKYRELU: for (uint64_t i = 0; i < m; i++) y[i] = x[i] >= 0.0f ? x[i] : alpha * x[i]; break;
        case OP_TANH: for (uint64_t i = 0; i < m; i++) y[i] = weei_tanhf(x[i]); break;
        case OP_SIGMOID: for (uint64_t i = 0; i < m; i++) y[i] = sigmoidf(x[i]); break;
        default: weei_memcopy(y, x, m * 4); break;   /* OP_COPY */
        }
        return;
    }
    if (!X->grad) return;
    float *g = Y->grad, *gx = X->grad;
    switch (n->op) {
    case OP_RELU: relu_backward(x, g, gx, m, X->uses == 1); break;
    case OP_LEAKYRELU: for (uint64_t i = 0; i < m; i++) gx[i] += x[i] >= 0.0f ? g[i] : alpha * g[i]; break;
    case OP_TANH: for (uint64_t i = 0; i < m; i++) gx[i] += g[i] * (1.0f - y[i] * y[i]); break;
    case OP_SIGMOID: for (uint64_t i = 0; i < m; i++) gx[i] += g[i] * y[i] * (1.0f - y[i]); break;
    default: for (uint64_t i = 0; i < m; i++) gx[i] += g[i]; break;
    }
}

/* Softmax / LogSoftmax over dims [ia[0], ia[1]) flattened (opset 13 names one axis, older ones a suffix). */
/* e^x that underflows to 0 as float's does: weei_expf clamps at -87 and gives 1.6e-38 there, so a
 * masked score (-1e9, -inf: the causal mask exporters write) would become that tiny probability
 * instead of onnxruntime's 0, and every product with it subnormal (a slow path on x86: the attention's
 * MatMuls ran 3x slower). Below -87.3 e^x is subnormal or 0; 0 is within 1.2e-38 of it. */
static float exp_or_zero(float x) { return x < -87.3f ? 0.0f : weei_expf(x); }

static void softmax(node *n, int backward) {
    tensor *X = &g_t[n->in[0]], *Y = &g_t[n->out[0]];
    uint64_t outer = 1, len = 1, inner = 1;
    for (uint32_t k = 0; k < X->ndim; k++) {
        if ((int32_t)k < n->ia[0]) outer *= X->d[k]; else if ((int32_t)k < n->ia[1]) len *= X->d[k]; else inner *= X->d[k];
    }
    int lg = n->op == OP_LOGSOFTMAX;
    for (uint64_t o = 0; o < outer; o++) for (uint64_t i = 0; i < inner; i++) {
        uint64_t base = o * len * inner + i;
        float *x = X->val + base, *y = Y->val + base;
        if (!backward) {
            float mx = x[0];
            for (uint64_t j = 1; j < len; j++) if (x[j * inner] > mx) mx = x[j * inner];
            double s = 0.0;
            for (uint64_t j = 0; j < len; j++) s += exp_or_zero(x[j * inner] - mx);
            float ls = weei_logf((float)s);
            for (uint64_t j = 0; j < len; j++) y[j * inner] = lg ? x[j * inner] - mx - ls : exp_or_zero(x[j * inner] - mx - ls);
        } else if (X->grad) {
            float *g = Y->grad + base, *gx = X->grad + base;
            double dot = 0.0;
            for (uint64_t j = 0; j < len; j++) dot += lg ? g[j * inner] : g[j * inner] * y[j * inner];
            for (uint64_t j = 0; j < len; j++) {
                uint64_t q = j * inner;
                gx[q] += lg ? g[q] - exp_or_zero(y[q]) * (float)dot : y[q] * (g[q] - (float)dot);
            }
        }
    }
}

/* Conv (2-D, NCHW, groups 1, no dilation): ia = kh kw sh sw pt pl. */
static void conv(node *n, int backward) {
    tensor *X = &g_t[n->in[0]], *W = &g_t[n->in[1]], *Y = &g_t[n->out[0]];
    tensor *Bt = n->n_in > 2 && n->in[2] != ABSENT ? &g_t[n->in[2]] : 0;
    uint32_t N = X->d[0], C = X->d[1], H = X->d[2], Wd = X->d[3], M = Y->d[1], OH = Y->d[2], OW = Y->d[3];
    int kh = n->ia[0], kw = n->ia[1], sh = n->ia[2], sw = n->ia[3], pt = n->ia[4], pl = n->ia[5];
    if (!backward) {
        for (uint32_t b = 0; b < N; b++) for (uint32_t m = 0; m < M; m++) {
            float *y = Y->val + ((size_t)b * M + m) * OH * OW;
            float bias = Bt ? Bt->val[m] : 0.0f;
            for (uint32_t i = 0; i < OH * OW; i++) y[i] = bias;
        }
    }
    for (uint32_t b = 0; b < N; b++) for (uint32_t m = 0; m < M; m++) {
        size_t yo = ((size_t)b * M + m) * OH * OW;
        if (backward && Bt && Bt->grad) for (uint32_t i = 0; i < OH * OW; i++) Bt->grad[m] += Y->grad[yo + i];
        for (uint32_t c = 0; c < C; c++) {
            size_t xo = ((size_t)b * C + c) * H * Wd;
            for (int i = 0; i < kh; i++) for (int j = 0; j < kw; j++) {
                size_t wi = (((size_t)m * C + c) * kh + i) * kw + j;
                float w = W->val[wi], gw = 0.0f;
                for (uint32_t oh = 0; oh < OH; oh++) {
                    int ih = (int)oh * sh + i - pt;
                    if (ih < 0 || ih >= (int)H) continue;
                    for (uint32_t ow = 0; ow < OW; ow++) {
                        int iw = (int)ow * sw + j - pl;
                        if (iw < 0 || iw >= (int)Wd) continue;
                        size_t xi = xo + (size_t)ih * Wd + iw, yi = yo + (size_t)oh * OW + ow;
                        if (!backward) Y->val[yi] += w * X->val[xi];
                        else {
                            float g = Y->grad[yi];
                            gw += g * X->val[xi];
                            if (X->grad) X->grad[xi] += g * w;
                        }
                    }
                }
                if (backward && W->grad) W->grad[wi] += gw;
            }
        }
    }
}

/* MaxPool / AveragePool: ia = kh kw sh sw pt pl count_include_pad; GlobalAveragePool. */
static void pool(node *n, int backward) {
    tensor *X = &g_t[n->in[0]], *Y = &g_t[n->out[0]];
    uint32_t NC = X->d[0] * X->d[1], H = X->d[2], Wd = X->d[3], OH = Y->ndim > 2 ? Y->d[2] : 1, OW = Y->ndim > 3 ? Y->d[3] : 1;
    int gap = n->op == OP_GAP;
    int kh = gap ? (int)H : n->ia[0], kw = gap ? (int)Wd : n->ia[1], sh = gap ? 1 : n->ia[2], sw = gap ? 1 : n->ia[3];
    int pt = gap ? 0 : n->ia[4], pl = gap ? 0 : n->ia[5], incl = gap ? 0 : n->ia[6];
    int ismax = n->op == OP_MAXPOOL;
    for (uint32_t p = 0; p < NC; p++) for (uint32_t oh = 0; oh < OH; oh++) for (uint32_t ow = 0; ow < OW; ow++) {
        size_t yi = ((size_t)p * OH + oh) * OW + ow;
        int h0 = (int)oh * sh - pt, w0 = (int)ow * sw - pl;
        int ha = h0 < 0 ? 0 : h0, wa = w0 < 0 ? 0 : w0;
        int hb = h0 + kh > (int)H ? (int)H : h0 + kh, wb = w0 + kw > (int)Wd ? (int)Wd : w0 + kw;
        size_t xo = (size_t)p * H * Wd;
        if (ismax) {
            if (!backward) {
                float best = -3.4e38f; uint32_t arg = (uint32_t)(xo + (size_t)ha * Wd + wa);
                for (int h = ha; h < hb; h++) for (int w = wa; w < wb; w++) {
                    float v = X->val[xo + (size_t)h * Wd + w];
                    if (v > best) { best = v; arg = (uint32_t)(xo + (size_t)h * Wd + w); }
                }
                Y->val[yi] = best;
                ((uint32_t *)n->aux)[yi] = arg;
            } else if (X->grad) X->grad[((uint32_t *)n->aux)[yi]] += Y->grad[yi];
            continue;
        }
        /* count_include_pad counts the padded window, clipped at the padded extent */
        int cnt = incl ? ((h0 + kh > (int)H + n->ia[8] ? (int)H + n->ia[8] : h0 + kh) - h0) *
                         ((w0 + kw > (int)Wd + n->ia[9] ? (int)Wd + n->ia[9] : w0 + kw) - w0)
                       : (hb - ha) * (wb - wa);
        if (cnt <= 0) cnt = 1;
        if (!backward) {
            float s = 0.0f;
            for (int h = ha; h < hb; h++) for (int w = wa; w < wb; w++) s += X->val[xo + (size_t)h * Wd + w];
            Y->val[yi] = s / (float)cnt;
        } else if (X->grad) {
            float g = Y->grad[yi] / (float)cnt;
            for (int h = ha; h < hb; h++) for (int w = wa; w < wb; w++) X->grad[xo + (size_t)h * Wd + w] += g;
        }
    }
}

/* BatchNormalization over dim 1: fa = epsilon, momentum. Training uses the batch's
 * statistics and moves the running ones (state tensors) as ONNX's training mode does. */
static void batchnorm(node *n, int backward, int training) {
    tensor *X = &g_t[n->in[0]], *S = &g_t[n->in[1]], *Bt = &g_t[n->in[2]], *RM = &g_t[n->in[3]], *RV = &g_t[n->in[4]], *Y = &g_t[n->out[0]];
    uint32_t N = X->d[0], C = X->d[1];
    uint64_t inner = X->size / ((uint64_t)N * C), cnt = (uint64_t)N * inner;
    float eps = n->fa[0], mom = n->fa[1];
    float *mean = n->aux, *inv = n->aux + C;
    for (uint32_t c = 0; c < C; c++) {
        if (!backward) {
            float mu, istd;
            if (training) {
                double s = 0.0, q = 0.0;
                for (uint32_t b = 0; b < N; b++) for (uint64_t i = 0; i < inner; i++) s += X->val[((uint64_t)b * C + c) * inner + i];
                mu = (float)(s / (double)cnt);
                for (uint32_t b = 0; b < N; b++) for (uint64_t i = 0; i < inner; i++) { double d = X->val[((uint64_t)b * C + c) * inner + i] - mu; q += d * d; }
                float var = (float)(q / (double)cnt);
                istd = 1.0f / __builtin_sqrtf(var + eps);
                RM->val[c] = RM->val[c] * mom + mu * (1.0f - mom);
                RV->val[c] = RV->val[c] * mom + var * (1.0f - mom);
            } else {
                mu = RM->val[c];
                istd = 1.0f / __builtin_sqrtf(RV->val[c] + eps);
            }
            mean[c] = mu; inv[c] = istd;
            float sc = S->val[c] * istd, sh = Bt->val[c] - mu * sc;
            for (uint32_t b = 0; b < N; b++) for (uint64_t i = 0; i < inner; i++) {
                uint64_t k = ((uint64_t)b * C + c) * inner + i;
                Y->val[k] = X->val[k] * sc + sh;
            }
            continue;
        }
        double sg = 0.0, sgx = 0.0;
        for (uint32_t b = 0; b < N; b++) for (uint64_t i = 0; i < inner; i++) {
            uint64_t k = ((uint64_t)b * C + c) * inner + i;
            float xh = (X->val[k] - mean[c]) * inv[c];
            sg += Y->grad[k]; sgx += Y->grad[k] * xh;
        }
        if (Bt->grad) Bt->grad[c] += (float)sg;
        if (S->grad) S->grad[c] += (float)sgx;
        if (X->grad) {
            float k1 = S->val[c] * inv[c], mg = (float)(sg / (double)cnt), mgx = (float)(sgx / (double)cnt);
            for (uint32_t b = 0; b < N; b++) for (uint64_t i = 0; i < inner; i++) {
                uint64_t k = ((uint64_t)b * C + c) * inner + i;
                float xh = (X->val[k] - mean[c]) * inv[c];
                X->grad[k] += training ? k1 * (Y->grad[k] - mg - xh * mgx) : k1 * Y->grad[k];
            }
        }
    }
}

static void dropout(node *n, int backward, int training) {
    tensor *X = &g_t[n->in[0]], *Y = &g_t[n->out[0]];
    float ratio = n->fa[0], keep = 1.0f - ratio;
    if (!training || ratio <= 0.0f) {
        if (!backward) weei_memcopy(Y->val, X->val, Y->size * 4);
        else if (X->grad) for (uint64_t i = 0; i < Y->size; i++) X->grad[i] += Y->grad[i];
        return;
    }
    if (!backward) {
        for (uint64_t i = 0; i < Y->size; i++) {
            n->aux[i] = weei_rng_float(&g_drop_rng) < keep ? 1.0f / keep : 0.0f;
            Y->val[i] = X->val[i] * n->aux[i];
        }
    } else if (X->grad) for (uint64_t i = 0; i < Y->size; i++) X->grad[i] += Y->grad[i] * n->aux[i];
}

/* erf to ~1e-7 (Numerical Recipes' erfc, Chebyshev fit): weei_math.h has no erf. */
static float erff_(float x) {
    float z = x < 0.0f ? -x : x, t = 1.0f / (1.0f + 0.5f * z);
    float r = t * weei_expf(-z * z - 1.26551223f + t * (1.00002368f + t * (0.37409196f + t * (0.09678418f +
              t * (-0.18628806f + t * (0.27886807f + t * (-1.13520398f + t * (1.48851587f +
              t * (-0.82215223f + t * 0.17087277f)))))))));
    return x >= 0.0f ? 1.0f - r : r - 1.0f;
}

/* Gelu: ia[0] 0 exact (erf), 1 the tanh approximation (ONNX's `approximate`). */
static void gelu(node *n, int backward) {
    tensor *X = &g_t[n->in[0]], *Y = &g_t[n->out[0]];
    const float c = 0.7978845608f, k = 0.044715f, r2 = 0.7071067812f, rp = 0.3989422804f;
    for (uint64_t i = 0; i < Y->size; i++) {
        float x = X->val[i];
        if (n->ia[0]) {
            float t = weei_tanhf(c * (x + k * x * x * x));
            if (!backward) Y->val[i] = 0.5f * x * (1.0f + t);
            else if (X->grad) X->grad[i] += Y->grad[i] * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * c * (1.0f + 3.0f * k * x * x));
        } else {
            float e = erff_(x * r2);
            if (!backward) Y->val[i] = 0.5f * x * (1.0f + e);
            else if (X->grad) X->grad[i] += Y->grad[i] * (0.5f * (1.0f + e) + x * rp * weei_expf(-0.5f * x * x));
        }
    }
}

/* LayerNormalization over the last ia[1] values of each row (dims from `axis` on): fa = epsilon;
 * scale and bias (optional) have the normalized shape. aux keeps each row's mean and 1/std. */
static void layernorm(node *n, int backward) {
    tensor *X = &g_t[n->in[0]], *S = &g_t[n->in[1]], *Y = &g_t[n->out[0]];
    tensor *Bt = n->n_in > 2 && n->in[2] != ABSENT ? &g_t[n->in[2]] : 0;
    uint64_t L = (uint64_t)n->ia[1], rows = X->size / L;
    float *mean = n->aux, *inv = n->aux + rows;
    for (uint64_t r = 0; r < rows; r++) {
        const float *x = X->val + r * L;
        if (!backward) {
            double s = 0.0, q = 0.0;
            for (uint64_t j = 0; j < L; j++) s += x[j];
            float mu = (float)(s / (double)L);
            for (uint64_t j = 0; j < L; j++) { double d = x[j] - mu; q += d * d; }
            float istd = 1.0f / __builtin_sqrtf((float)(q / (double)L) + n->fa[0]);
            mean[r] = mu; inv[r] = istd;
            float *y = Y->val + r * L;
            for (uint64_t j = 0; j < L; j++) y[j] = (x[j] - mu) * istd * S->val[j] + (Bt ? Bt->val[j] : 0.0f);
            continue;
        }
        const float *g = Y->grad + r * L;
        double sd = 0.0, sdx = 0.0;
        for (uint64_t j = 0; j < L; j++) {
            float xh = (x[j] - mean[r]) * inv[r], dxh = g[j] * S->val[j];
            sd += dxh; sdx += dxh * xh;
            if (S->grad) S->grad[j] += g[j] * xh;
            if (Bt && Bt->grad) Bt->grad[j] += g[j];
        }
        if (X->grad) {
            float md = (float)(sd / (double)L), mdx = (float)(sdx / (double)L), *gx = X->grad + r * L;
            for (uint64_t j = 0; j < L; j++) {
                float xh = (x[j] - mean[r]) * inv[r];
                gx[j] += inv[r] * (g[j] * S->val[j] - md - xh * mdx);
            }
        }
    }
}

/* Transpose: output dim k is input dim ia[k]. */
static void transpose(node *n, int backward) {
    tensor *X = &g_t[n->in[0]], *Y = &g_t[n->out[0]];
    uint32_t R = Y->ndim, idx[MAX_DIMS] = {0};
    uint64_t sin[MAX_DIMS], step[MAX_DIMS], run = 1, off = 0;
    for (int d = (int)R - 1; d >= 0; d--) { sin[d] = run; run *= X->d[d]; }
    for (uint32_t k = 0; k < R; k++) step[k] = sin[n->ia[k]];
    if (backward && !X->grad) return;
    for (uint64_t i = 0; i < Y->size; i++) {
        if (!backward) Y->val[i] = X->val[off]; else X->grad[off] += Y->grad[i];
        for (int d = (int)R - 1; d >= 0; d--) {
            off += step[d];
            if (++idx[d] < Y->d[d]) break;
            idx[d] = 0;
            off -= step[d] * Y->d[d];
        }
    }
}

/* Concat along ia[0]. */
static void concat(node *n, int backward) {
    tensor *Y = &g_t[n->out[0]];
    uint32_t axis = (uint32_t)n->ia[0];
    uint64_t outer = 1, inner = 1;
    for (uint32_t k = 0; k < axis; k++) outer *= Y->d[k];
    for (uint32_t k = axis + 1; k < Y->ndim; k++) inner *= Y->d[k];
    uint64_t row = (uint64_t)Y->d[axis] * inner, at = 0;
    for (uint32_t i = 0; i < n->n_in; i++) {
        tensor *X = &g_t[n->in[i]];
        uint64_t w = (uint64_t)X->d[axis] * inner;
        for (uint64_t o = 0; o < outer; o++) {
            if (!backward) weei_memcopy(Y->val + o * row + at, X->val + o * w, w * 4);
            else if (X->grad) for (uint64_t j = 0; j < w; j++) X->grad[o * w + j] += Y->grad[o * row + at + j];
        }
        at += w;
    }
}

/* Gather along axis 0 (embeddings): rows of the table by the indices' values (float-held integers;
 * negative ones count from the end, ONNX's rule; one out of range gives a zero row and no gradient). */
static void gather_rows(node *n, int backward) {
    tensor *D = &g_t[n->in[0]], *I = &g_t[n->in[1]], *Y = &g_t[n->out[0]];
    uint32_t V = D->d[0];
    uint64_t row = D->size / V;
    for (uint64_t i = 0; i < I->size; i++) {
        float f = I->val[i];
        int64_t k = f >= -2147483648.0f && f < 2147483648.0f ? (int64_t)f : -1 - (int64_t)V;
        if (k < 0) k += V;
        int ok = k >= 0 && k < (int64_t)V;
        float *y = Y->val + i * row;
        if (!backward) { if (ok) weei_memcopy(y, D->val + (uint64_t)k * row, row * 4); else weei_memzero(y, row * 4); }
        else if (ok && D->grad) { float *gd = D->grad + (uint64_t)k * row, *g = Y->grad + i * row; for (uint64_t j = 0; j < row; j++) gd[j] += g[j]; }
    }
}

static int run_node(node *n, int backward, int training) {
    switch (n->op) {
    case OP_MATMUL: matmul(n, backward); return 0;
    case OP_GEMM: gemm(n, backward); return 0;
    case OP_ADD: case OP_SUB: case OP_MUL: case OP_DIV: binary(n, backward); return 0;
    case OP_SOFTMAX: case OP_LOGSOFTMAX: softmax(n, backward); return 0;
    case OP_CONV: conv(n, backward); return 0;
    case OP_MAXPOOL: case OP_AVGPOOL: case OP_GAP: pool(n, backward); return 0;
    case OP_BATCHNORM: batchnorm(n, backward, training); return 0;
    case OP_DROPOUT: dropout(n, backward, training); return 0;
    case OP_GELU: gelu(n, backward); return 0;
    case OP_LAYERNORM: layernorm(n, backward); return 0;
    case OP_TRANSPOSE: transpose(n, backward); return 0;
    case OP_CONCAT: concat(n, backward); return 0;
    case OP_GATHER: gather_rows(n, backward); return 0;
    default: unary(n, backward); return 0;
    }
}

static int forward(uint32_t b, int training) {
    resolve(b);
    for (uint32_t i = 0; i < g_cfg[C_NNODES]; i++) if (run_node(&g_n[i], 0, training) != 0) return -1;
    return 0;
}

static void zero_grads(void) {
    for (uint32_t i = 0; i < g_cfg[C_NTENSORS]; i++) { tensor *t = &g_t[i]; if (t->kind == T_ACT) weei_memzero(t->grad, t->size * 4); }
    weei_memzero(g_grad, (size_t)g_cfg[C_NWEIGHTS] * 4);
}

static int backward_pass(int training) {
    for (uint32_t i = g_cfg[C_NNODES]; i-- > 0;) if (run_node(&g_n[i], 1, training) != 0) return -1;
    return 0;
}

/* ---- data ---------------------------------------------------------------- */

static const char *format_id(void) {
    return g_cfg[C_FORMAT] == FMT_DIGITS ? "weei-digits-v1" : g_cfg[C_FORMAT] == FMT_TOKENS ? "weei-bytes-v1" : "weei-records-v1";
}

/* Loss terms per example: a next-token example predicts each of its positions. */
static uint32_t per_example(void) { return g_cfg[C_LOSS] == LOSS_NEXT ? g_cfg[C_FEATURES] : 1u; }

typedef struct { const uint8_t *records; uint32_t n, stride; } dataset;

/* Checks a chunk of the model's format; the example count or -1 after weei_fail. */
static int64_t read_chunk(const char *format, const weei_region *d, dataset *ds) {
    if (!format || !weei_streq(format, format_id())) return weei_fail(g_cfg[C_FORMAT] == FMT_DIGITS ? "unknown data format (this model reads weei-digits-v1)" : g_cfg[C_FORMAT] == FMT_TOKENS ? "unknown data format (this model reads weei-bytes-v1)" : "unknown data format (this model reads weei-records-v1)");
    const uint8_t *p = d->data;
    uint32_t F = g_cfg[C_FEATURES];
    uint64_t header, stride;
    if (g_cfg[C_FORMAT] == FMT_TOKENS) {   /* a record is context + 1 bytes: inputs 0..T-1, targets 1..T */
        if (d->bytes < 8 || p[0] != 'W' || p[1] != 'B' || p[2] != 'T' || p[3] != '1') return weei_fail("weei-bytes-v1: bad magic or header");
        header = 8; stride = (uint64_t)F + 1;
    } else if (g_cfg[C_FORMAT] == FMT_DIGITS) {
        if (d->bytes < 8 || p[0] != 'W' || p[1] != 'D' || p[2] != 'G' || p[3] != '1') return weei_fail("weei-digits-v1: bad magic or header");
        header = 8; stride = 65;
    } else {
        if (d->bytes < 12 || p[0] != 'W' || p[1] != 'R' || p[2] != 'C' || p[3] != '1') return weei_fail("weei-records-v1: bad magic or header");
        if (rd32(p + 8) != F) return weei_fail("weei-records-v1: the feature count is not the model input's size");
        header = 12; stride = 4ull * F + 4;
    }
    uint32_t n = rd32(p + 4);
    if (n > g_cfg[C_MAXEX]) return weei_fail("the chunk has more examples than maxExamplesPerChunk");
    if ((uint64_t)d->bytes != header + (uint64_t)n * stride) return weei_fail("the file's length does not match its header's example count");
    for (uint32_t e = 0; e < n; e++) {
        const uint8_t *r = p + header + (uint64_t)e * stride;
        if (g_cfg[C_FORMAT] == FMT_TOKENS) {
            for (uint64_t k = 0; k < stride; k++) if (r[k] >= g_cfg[C_CLASSES]) return weei_fail("weei-bytes-v1: a byte is not below the vocabulary size");
            continue;
        }
        uint32_t label = g_cfg[C_FORMAT] == FMT_DIGITS ? r[64] : rd32(r + 4ull * F);
        if (g_cfg[C_LOSS] == LOSS_CE && label >= g_cfg[C_CLASSES]) return weei_fail("a label is not below the number of classes");
        if (g_cfg[C_FORMAT] == FMT_DIGITS) { for (int k = 0; k < 64; k++) if (r[k] > 16) return weei_fail("weei-digits-v1: pixel intensity above 16"); }
        else for (uint32_t k = 0; k < F; k++) if (!weei_isfinite_f32(weei_f32_from_bits(rd32(r + 4ull * k)))) return weei_fail("weei-records-v1: a feature is not finite");
    }
    ds->records = p + header; ds->n = n; ds->stride = (uint32_t)stride;
    return n;
}

static int64_t read_data(const wj_doc *in, weei_region *d, dataset *ds) {
    char format[64];
    const char *error;
    int f = wj_get(in, 0, "format");
    if (f < 0) return weei_fail("a format is required with data");
    if (wj_string(in, f, format, sizeof format) < 0) return weei_fail("format must be a string");
    if (wj_region(in, wj_get(in, 0, "data"), d, &error) != 0) return weei_fail(error);
    return read_chunk(format, d, ds);
}

static uint32_t *g_labels;

static void gather(const dataset *ds, const uint32_t *idx, uint32_t count) {
    float *x = g_t[g_cfg[C_INPUT]].val;
    uint32_t F = g_cfg[C_FEATURES];
    for (uint32_t b = 0; b < count; b++) {
        const uint8_t *r = ds->records + (uint64_t)idx[b] * ds->stride;
        if (g_cfg[C_FORMAT] == FMT_TOKENS) {
            for (uint32_t k = 0; k < F; k++) { x[(size_t)b * F + k] = (float)r[k]; g_labels[(size_t)b * F + k] = r[k + 1]; }
        } else if (g_cfg[C_FORMAT] == FMT_DIGITS) {
            for (uint32_t k = 0; k < 64; k++) x[(size_t)b * 64 + k] = (float)r[k] * (1.0f / 16.0f);
            g_labels[b] = r[64];
        } else {
            weei_memcopy(x + (size_t)b * F, r, (size_t)F * 4);
            g_labels[b] = rd32(r + 4ull * F);
        }
    }
}

/* Loss summed over the terms of `count` examples (one per example, or one per position for
 * next-token); writes the gradient of the mean when training. */
static double loss_of(uint32_t count, int grad, uint32_t *correct) {
    tensor *L = &g_t[g_cfg[C_LOSS_T]];
    count *= per_example();
    uint32_t C = (uint32_t)(L->size / count);
    double total = 0.0;
    for (uint32_t b = 0; b < count; b++) {
        const float *z = L->val + (size_t)b * C;
        float *g = grad ? L->grad + (size_t)b * C : 0;
        if (g_cfg[C_LOSS] == LOSS_MSE) {
            for (uint32_t k = 0; k < C; k++) {
                float d = z[k] - (float)g_labels[b];
                total += (double)d * d / C;
                if (g) g[k] = 2.0f * d / ((float)C * (float)count);
            }
            continue;
        }
        float mx = z[0];
        uint32_t arg = 0;
        for (uint32_t k = 1; k < C; k++) if (z[k] > mx) { mx = z[k]; arg = k; }
        /* one exp per logit: the gradient keeps them and scales by 1/sum (as weei_softmax_xent) */
        float s = 0.0f;
        if (g) for (uint32_t k = 0; k < C; k++) { g[k] = weei_expf(z[k] - mx); s += g[k]; }
        else for (uint32_t k = 0; k < C; k++) s += weei_expf(z[k] - mx);
        float ls = weei_logf(s);
        total += (double)(ls + mx - z[g_labels[b]]);
        if (correct && arg == g_labels[b]) (*correct)++;
        if (g) {
            float inv = 1.0f / s, scale = 1.0f / (float)count;
            for (uint32_t k = 0; k < C; k++) g[k] = (g[k] * inv - (k == g_labels[b] ? 1.0f : 0.0f)) * scale;
        }
    }
    return total;
}

/* ---- operations ----------------------------------------------------------- */

static int buffers(void) {
    size_t bytes = (size_t)g_cfg[C_NWEIGHTS] * 4;
    if (!g_loaded) g_loaded = weei_malloc(bytes);
    if (!g_out) g_out = weei_malloc(bytes);
    return g_loaded && g_out ? 0 : weei_fail("out of memory");
}

int model_get_info(const wj_doc *in) {
    (void)in;
    if (graph_ready() != 0) return -1;
    char *copy = weei_malloc(g_info_len + 1);
    if (!copy) return weei_fail("out of memory");
    weei_memcopy(copy, g_info, g_info_len);
    copy[g_info_len] = 0;
    jw_raw(copy);
    weei_mfree(copy);
    return 0;
}

/* The ONNX initializers are the initial weights, whatever the seed: pretrained weights carry over. */
int model_create_initial_weights(const wj_doc *in, uint64_t seed) {
    (void)in; (void)seed;
    if (graph_ready() != 0 || buffers() != 0) return -1;
    weei_memcopy(g_out, g_init, (size_t)g_cfg[C_NWEIGHTS] * 4);
    jw_obj_begin();
    jw_key("weights"); jw_region(g_out, g_cfg[C_NWEIGHTS] * 4);
    jw_obj_end();
    return 0;
}

int model_load(const wj_doc *in, const weei_region *w) {
    (void)in;
    if (graph_ready() != 0) return -1;
    if (w->bytes != g_cfg[C_NWEIGHTS] * 4) return weei_fail("weights do not have this graph's size");
    if (buffers() != 0) return -1;
    for (uint32_t i = 0; i < g_cfg[C_NWEIGHTS]; i++) {
        float v;
        weei_memcopy(&v, w->data + (size_t)i * 4, 4);
        if (!weei_isfinite_f32(v)) return weei_fail("weights contain a value that is not finite");
    }
    weei_memcopy(g_loaded, w->data, w->bytes);
    g_has_weights = 1;
    jw_raw("{\"ok\":true}");
    return 0;
}

int model_load_auxiliary(const wj_doc *in, int slots) {
    if (in->toks[slots].count != 0) return weei_fail("an imported ONNX model declares no auxiliary weights");
    jw_raw("{\"ok\":true}");
    return 0;
}

int model_describe_chunk(const wj_doc *in, const char *format, const weei_region *data) {
    (void)in;
    dataset ds;
    if (graph_ready() != 0) return -1;
    int64_t n = read_chunk(format, data, &ds);
    if (n < 0) return -1;
    jw_obj_begin(); jw_key("exampleCount"); jw_int(n); jw_obj_end();
    return 0;
}

static int read_step_limit(const wj_doc *in, uint32_t *limit) {
    uint64_t v;
    int t = wj_get(in, 0, "stepLimit");
    *limit = 0xFFFFFFFFu;
    if (t < 0) return 0;
    if (wj_uint(in, t, &v) != 0 || v < 1 || v > 0xFFFFFFFFu) return weei_fail("stepLimit must be a positive integer");
    *limit = (uint32_t)v;
    return 0;
}

static int prepare_batches(uint32_t batch, int grads) {
    weei_mfree(g_labels);
    g_labels = weei_malloc((size_t)batch * per_example() * 4);
    if (!g_labels || plan(batch, grads) != 0) { free_plan(); return weei_fail("out of memory for this batch size"); }
    return 0;
}

int model_train(const wj_doc *in) {
    if (graph_ready() != 0) return -1;
    if (!g_has_weights) return weei_fail("train called before loadModel");
    if (wj_get(in, 0, "experience") >= 0) return weei_fail("an imported ONNX model is a dataset model: train needs data");
    weei_region d;
    dataset ds;
    int64_t n64 = read_data(in, &d, &ds);
    if (n64 < 0) return -1;
    uint32_t n = (uint32_t)n64;
    if (n == 0) return weei_fail("the chunk has no examples");
    weei_settings s;
    if (weei_read_settings(in, &s, g_cfg[C_BATCH], g_fcfg[F_LR]) != 0) return -1;
    uint64_t seed;
    if (weei_read_seed(in, &seed) != 0) return -1;
    uint32_t step_limit;
    if (read_step_limit(in, &step_limit) != 0) return -1;
    uint32_t batch = s.batch_size < n ? s.batch_size : n;
    if (prepare_batches(batch, 1) != 0) return -1;
    uint32_t *order = weei_malloc((size_t)n * 4), P = g_cfg[C_NPARAMS];
    weei_adam adam;
    int opt = (int)g_cfg[C_OPT];
    if (!order || (opt != OPT_SGD && P && weei_adam_init(&adam, P, s.learning_rate) != 0)) { weei_mfree(order); free_plan(); return weei_fail("out of memory"); }
    if (opt != OPT_SGD && P) { adam.beta1 = g_fcfg[F_B1]; adam.beta2 = g_fcfg[F_B2]; adam.eps = g_fcfg[F_EPS]; }
    float *p = g_out;
    weei_memcopy(p, g_loaded, (size_t)g_cfg[C_NWEIGHTS] * 4);
    bind(p);
    weei_rng r;
    weei_rng_seed(&r, seed);
    weei_rng_seed(&g_drop_rng, seed ^ 0x6f6e6e7864726f70ull);
    double loss_sum = 0.0;
    uint32_t correct = 0, steps = 0;
    uint64_t processed = 0, total = (uint64_t)n * s.local_epochs;
    static const char *const ids[2] = { "loss", "accuracy" };
    int ce = g_cfg[C_LOSS] != LOSS_MSE, rc = 0;
    for (uint32_t epoch = 0; epoch < s.local_epochs && steps < step_limit && rc == 0; epoch++) {
        for (uint32_t i = 0; i < n; i++) order[i] = i;
        weei_shuffle_u32(&r, order, n);
        for (uint32_t start = 0; start < n && steps < step_limit; start += batch) {
            uint32_t count = n - start < batch ? n - start : batch;
            gather(&ds, order + start, count);
            if (forward(count, 1) != 0) { rc = -1; break; }
            zero_grads();
            loss_sum += loss_of(count, 1, &correct);
            if (backward_pass(1) != 0) { rc = -1; break; }
            if (P) {
                if (opt == OPT_ADAMW) { float k = 1.0f - s.learning_rate * g_fcfg[F_WD]; for (uint32_t i = 0; i < P; i++) p[i] *= k; }
                if (opt == OPT_SGD) weei_sgd_step(p, g_grad, P, s.learning_rate);
                else weei_adam_step(&adam, p, g_grad);
            }
            steps++;
            processed += count;
            double terms = (double)processed * per_example(), mv[2] = { loss_sum / terms, (double)correct / terms };
            weei_progress(processed, total, ids, mv, ce ? 2 : 1);
        }
    }
    if (opt != OPT_SGD && P) weei_adam_free(&adam);
    weei_mfree(order);
    free_plan();
    if (rc != 0) return weei_fail("out of memory");
    for (uint32_t i = 0; i < g_cfg[C_NWEIGHTS]; i++)
        if (!weei_isfinite_f32(p[i])) return weei_fail("training diverged: a weight is not finite (lower the learning rate)");
    jw_obj_begin();
    jw_key("weights"); jw_region(p, g_cfg[C_NWEIGHTS] * 4);
    jw_key("metrics");
    jw_obj_begin();
    double terms = (double)processed * per_example();
    jw_key("loss"); jw_num(loss_sum / terms);
    if (ce) { jw_key("accuracy"); jw_num((double)correct / terms); }
    jw_obj_end();
    jw_key("uniqueExamples"); jw_uint(processed < n ? processed : n);
    jw_key("optimizerSteps"); jw_uint(steps);
    jw_obj_end();
    return 0;
}

int model_evaluate(const wj_doc *in) {
    if (graph_ready() != 0) return -1;
    if (!g_has_weights) return weei_fail("evaluate called before loadModel");
    if (wj_get(in, 0, "experience") >= 0) return weei_fail("an imported ONNX model is a dataset model: evaluate needs data");
    weei_region d;
    dataset ds;
    int64_t n64 = read_data(in, &d, &ds);
    if (n64 < 0) return -1;
    uint32_t n = (uint32_t)n64;
    if (n == 0) return weei_fail("the file has no examples");
    uint32_t batch = n < EVAL_BATCH ? n : EVAL_BATCH, idx[EVAL_BATCH];
    if (prepare_batches(batch, 0) != 0) return -1;
    bind(g_loaded);
    double loss_sum = 0.0;
    uint32_t correct = 0;
    for (uint32_t start = 0; start < n; start += batch) {
        uint32_t count = n - start < batch ? n - start : batch;
        for (uint32_t b = 0; b < count; b++) idx[b] = start + b;
        gather(&ds, idx, count);
        if (forward(count, 0) != 0) { free_plan(); return weei_fail("out of memory"); }
        loss_sum += loss_of(count, 0, &correct);
    }
    free_plan();
    jw_obj_begin();
    jw_key("metrics");
    jw_obj_begin();
    double terms = (double)n * per_example();
    jw_key("loss"); jw_num(loss_sum / terms);
    if (g_cfg[C_LOSS] != LOSS_MSE) { jw_key("accuracy"); jw_num((double)correct / terms); }
    jw_obj_end();
    jw_key("examples"); jw_uint(n);
    jw_obj_end();
    return 0;
}

static float *g_result;   /* output region of onnxForward / onnxGradient */

static int keep_result(const float *src, uint64_t bytes) {
    weei_mfree(g_result);
    g_result = weei_malloc(bytes ? bytes : 4);
    if (!g_result) return -1;
    weei_memcopy(g_result, src, bytes);
    return 0;
}

/* onnxForward {"input": region of float32 [batch x features], "batch": b, "training": 0|1, "seed": ".."}
 * -> {"output": region of the graph output}: with the loaded weights (the test oracle's entry;
 * "training" runs batch statistics and dropout, as train's forward does). */
static int op_forward(const wj_doc *in) {
    if (graph_ready() != 0) return -1;
    if (!g_has_weights) return weei_fail("onnxForward called before loadModel");
    weei_region x;
    const char *error;
    uint64_t b, tr = 0, seed = 0;
    if (wj_region(in, wj_get(in, 0, "input"), &x, &error) != 0) return weei_fail(error);
    if (wj_uint(in, wj_get(in, 0, "batch"), &b) != 0 || b == 0 || b > g_cfg[C_MAXEX]) return weei_fail("batch must be a positive integer up to maxExamplesPerChunk");
    int t = wj_get(in, 0, "training");
    if (t >= 0 && wj_uint(in, t, &tr) != 0) return weei_fail("training must be 0 or 1");
    if (weei_read_seed(in, &seed) != 0) return -1;
    if ((uint64_t)x.bytes != b * g_cfg[C_FEATURES] * 4) return weei_fail("input must hold batch x features float32");
    if (prepare_batches((uint32_t)b, 0) != 0) return -1;
    weei_memcopy(g_out, g_loaded, (size_t)g_cfg[C_NWEIGHTS] * 4);   /* training mode moves running statistics */
    bind(g_out);
    weei_rng_seed(&g_drop_rng, seed ^ 0x6f6e6e7864726f70ull);
    weei_memcopy(g_t[g_cfg[C_INPUT]].val, x.data, x.bytes);
    if (forward((uint32_t)b, tr != 0) != 0) { free_plan(); return weei_fail("out of memory"); }
    tensor *Y = &g_t[g_cfg[C_OUTPUT]];
    uint64_t bytes = Y->size * 4;
    if (keep_result(Y->val, bytes) != 0) { free_plan(); return weei_fail("out of memory"); }
    free_plan();
    jw_obj_begin(); jw_key("output"); jw_region(g_result, (uint32_t)bytes); jw_obj_end();
    return 0;
}

/* onnxGradient {"data": region, "format": ".."} -> {"gradient": region over every weight
 * (zero for non-trained values), "loss": mean}: the whole chunk as one batch, training mode,
 * dropout seeded by "seed" (the test oracle's entry for finite differences). */
static int op_gradient(const wj_doc *in) {
    if (graph_ready() != 0) return -1;
    if (!g_has_weights) return weei_fail("onnxGradient called before loadModel");
    weei_region d;
    dataset ds;
    uint64_t seed = 0;
    int64_t n64 = read_data(in, &d, &ds);
    if (n64 <= 0) return n64 < 0 ? -1 : weei_fail("no examples");
    if (weei_read_seed(in, &seed) != 0) return -1;
    uint32_t n = (uint32_t)n64, *idx = weei_malloc((size_t)n * 4);
    if (!idx || prepare_batches(n, 1) != 0) { weei_mfree(idx); return weei_fail("out of memory"); }
    for (uint32_t i = 0; i < n; i++) idx[i] = i;
    weei_memcopy(g_out, g_loaded, (size_t)g_cfg[C_NWEIGHTS] * 4);
    bind(g_out);
    weei_rng_seed(&g_drop_rng, seed ^ 0x6f6e6e7864726f70ull);
    gather(&ds, idx, n);
    weei_mfree(idx);
    int rc = forward(n, 1);
    zero_grads();
    double loss = loss_of(n, 1, 0) / ((double)n * per_example());
    if (rc == 0) rc = backward_pass(1);
    if (rc != 0 || keep_result(g_grad, (uint64_t)g_cfg[C_NWEIGHTS] * 4) != 0) { free_plan(); return weei_fail("out of memory"); }
    free_plan();
    jw_obj_begin(); jw_key("gradient"); jw_region(g_result, g_cfg[C_NWEIGHTS] * 4); jw_key("loss"); jw_num(loss); jw_obj_end();
    return 0;
}

WEEI_EXPORT("onnxForward") uint32_t onnx_forward_export(uint32_t ptr, uint32_t bytes) { return weei_run_op(ptr, bytes, op_forward); }
WEEI_EXPORT("onnxGradient") uint32_t onnx_gradient_export(uint32_t ptr, uint32_t bytes) { return weei_run_op(ptr, bytes, op_gradient); }

/* The GPU backend (gpuBegin / gpuNext / gpuEnd): docs/gpu.md, "Imported ONNX graphs". */
#include "gpu.inc"
