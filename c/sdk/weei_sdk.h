/* Weei model SDK: what a model needs to implement Weei WASM ABI 1
 * (docs/abi.md) in C without libc.
 *
 *   memory   - alloc/free over linear memory, memset/memcpy (wasm only)
 *   JSON     - a small reader for the operation inputs, a writer for results
 *   ops      - the exported operations; a model implements the model_* hooks
 *   progress - weei.onProgress reports
 *   rng      - splitmix64 seeding, xoshiro256** stream
 *   nn       - dense layers, activations, softmax cross-entropy, SGD, Adam
 *              (weei_nn.c, written with 4-lane vectors: SIMD128 in wasm)
 *
 * Addresses: module memory is addressed by 32-bit offsets (wasm pointers).
 * In a native build (WEEI_NATIVE, for the benchmark) the heap is a static
 * arena and offsets are relative to it, so the same JSON inputs work.
 */
#ifndef WEEI_SDK_H
#define WEEI_SDK_H

#include <stddef.h>
#include <stdint.h>

#include "weei_math.h"

#if defined(__wasm__)
#define WEEI_EXPORT(name) __attribute__((export_name(name), visibility("default")))
#else
#define WEEI_EXPORT(name)
#endif

/* ---- memory ---------------------------------------------------------- */

void *weei_addr(uint32_t off);            /* offset -> pointer */
uint32_t weei_off(const void *p);         /* pointer -> offset */
uint64_t weei_memory_bytes(void);         /* current size of addressable memory */
void *weei_malloc(size_t bytes);          /* 8-byte aligned, NULL on failure */
void *weei_calloc(size_t bytes);          /* zeroed */
void weei_mfree(void *p);                 /* NULL is ignored */
void *weei_realloc(void *p, size_t bytes);
void weei_memzero(void *dst, size_t n);
void weei_memcopy(void *dst, const void *src, size_t n);
int weei_streq(const char *a, const char *b);   /* 1 when equal */

/* ABI exports alloc/free (also callable natively by the bench driver). */
uint32_t weei_alloc_export(uint32_t bytes);
void weei_free_export(uint32_t off);

/* ---- JSON reader ------------------------------------------------------- */

typedef enum { WJ_NULL = 0, WJ_FALSE, WJ_TRUE, WJ_NUMBER, WJ_STRING, WJ_ARRAY, WJ_OBJECT } wj_type;

typedef struct {
    uint8_t type;
    uint32_t start, end;   /* text span; for strings, the content between quotes */
    uint32_t next;         /* index of the token after this one's subtree */
    uint32_t count;        /* array elements / object members */
} wj_tok;

typedef struct {
    const char *text;
    uint32_t length;
    wj_tok *toks;
    uint32_t ntoks, cap;
} wj_doc;

/* Parses text (not NUL-terminated); 0 on success, else sets *error. */
int wj_parse(wj_doc *doc, const char *text, uint32_t length, const char **error);
/* Token index of member `key` of object token `obj`, or -1. */
int wj_get(const wj_doc *doc, int obj, const char *key);
/* Index of element i of array token arr, or -1. */
int wj_at(const wj_doc *doc, int arr, uint32_t i);
/* Each returns 0 on success, -1 when the token is absent (-1) or of another kind. */
int wj_number(const wj_doc *doc, int tok, double *out);
int wj_uint(const wj_doc *doc, int tok, uint64_t *out);        /* non-negative integer number */
int wj_u64_string(const wj_doc *doc, int tok, uint64_t *out);  /* decimal string (or integer number) */
/* Decodes a string token into buf (NUL-terminated, truncated to cap-1); returns length or -1. */
int wj_string(const wj_doc *doc, int tok, char *buf, uint32_t cap);
int wj_string_eq(const wj_doc *doc, int tok, const char *s);

/* A region {ptr, bytes} checked to lie inside module memory. */
typedef struct { uint8_t *data; uint32_t bytes; } weei_region;
int wj_region(const wj_doc *doc, int tok, weei_region *out, const char **error);

/* ---- result writer ------------------------------------------------------- */

/* The result of the current operation, in a module-owned buffer. The writer
 * inserts commas itself: write a key, then its value. */
void jw_obj_begin(void);
void jw_obj_end(void);
void jw_arr_begin(void);
void jw_arr_end(void);
void jw_key(const char *key);
void jw_str(const char *s);
void jw_int(int64_t v);
void jw_uint(uint64_t v);
void jw_num(double v);        /* shortest-ish (9 significant digits); non-finite -> null */
void jw_bool(int v);
void jw_null(void);
void jw_raw(const char *json);  /* a JSON literal written as is (object/array allowed) */
void jw_region(const void *p, uint32_t bytes);

/* Fails the current operation with {"error": msg}; returns -1 for `return weei_fail(...)`. */
int weei_fail(const char *msg);

/* A small string builder for error messages. */
typedef struct { char buf[256]; uint32_t len; } weei_msg;
void weei_msg_str(weei_msg *m, const char *s);
void weei_msg_int(weei_msg *m, int64_t v);

/* ---- operations ---------------------------------------------------------- */

/* A model implements these. Each receives the parsed input (root token 0 is an
 * object), writes its result with jw_* and returns 0, or returns weei_fail(...). */
int model_get_info(const wj_doc *in);
int model_create_initial_weights(const wj_doc *in, uint64_t seed);
int model_load(const wj_doc *in, const weei_region *weights);
int model_load_auxiliary(const wj_doc *in, int slots);
int model_describe_chunk(const wj_doc *in, const char *format, const weei_region *data);
int model_train(const wj_doc *in);
int model_evaluate(const wj_doc *in);

/* Exported operations (ABI names in quotes); natively callable by a driver.
 * Each takes the input JSON at (ptr, bytes) and returns the result offset. */
uint32_t weei_op_get_model_info(uint32_t ptr, uint32_t bytes);
uint32_t weei_op_create_initial_weights(uint32_t ptr, uint32_t bytes);
uint32_t weei_op_load_model(uint32_t ptr, uint32_t bytes);
uint32_t weei_op_load_auxiliary(uint32_t ptr, uint32_t bytes);
uint32_t weei_op_describe_chunk(uint32_t ptr, uint32_t bytes);
uint32_t weei_op_train(uint32_t ptr, uint32_t bytes);
uint32_t weei_op_evaluate(uint32_t ptr, uint32_t bytes);
uint32_t weei_result_length(void);

/* Runs one operation the way the exports above do (parse the input, call fn,
 * set the result); for models that export further operations, such as the
 * optional gpuBegin / gpuNext / gpuEnd of a GPU backend. */
typedef int (*weei_op_fn)(const wj_doc *in);
uint32_t weei_run_op(uint32_t ptr, uint32_t bytes, weei_op_fn fn);

/* Common input helpers. */
typedef struct {
    uint32_t local_epochs;   /* default 1 */
    uint32_t batch_size;     /* default given by the model */
    float learning_rate;     /* default given by the model */
    int has_learning_rate;
} weei_settings;
int weei_read_settings(const wj_doc *in, weei_settings *s, uint32_t default_batch, float default_lr);

typedef struct { uint64_t unit_start; uint32_t unit_count; uint64_t seed; } weei_experience;
/* 1 when present and valid, 0 when absent, -1 after weei_fail. */
int weei_read_experience(const wj_doc *in, weei_experience *e);
/* Optional "seed" member (decimal string); 0 when absent, -1 after weei_fail. */
int weei_read_seed(const wj_doc *in, uint64_t *seed);

/* ---- progress ------------------------------------------------------------ */

/* Calls weei.onProgress with {"processedExamples", "totalExamples", "metrics"}.
 * metric_ids/values may be NULL/0. Call it as often as convenient (e.g. after
 * every batch): within one operation it reports at most once per 1% of
 * `total` (steps of total/100 examples, at least 1) and always when
 * processed >= total; the other calls return at once. */
void weei_progress(uint64_t processed, uint64_t total, const char *const *metric_ids,
                   const double *metric_values, int metric_count);

/* ---- random numbers ------------------------------------------------------ */

typedef struct { uint64_t s[4]; } weei_rng;

static inline uint64_t weei_splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline void weei_rng_seed(weei_rng *r, uint64_t seed) {
    uint64_t sm = seed;
    for (int i = 0; i < 4; i++) r->s[i] = weei_splitmix64(&sm);
}

static inline uint64_t weei__rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/* xoshiro256** */
static inline uint64_t weei_rng_next(weei_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = weei__rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = weei__rotl(s[3], 45);
    return result;
}

/* Uniform in [0, 1). */
static inline double weei_rng_double(weei_rng *r) { return (double)(weei_rng_next(r) >> 11) * (1.0 / 9007199254740992.0); }
static inline float weei_rng_float(weei_rng *r) { return (float)(weei_rng_next(r) >> 40) * (1.0f / 16777216.0f); }
/* Uniform integer in [0, n), n > 0 (Lemire's multiply-shift with rejection). */
uint32_t weei_rng_below(weei_rng *r, uint32_t n);
void weei_shuffle_u32(weei_rng *r, uint32_t *a, uint32_t n);

/* ---- neural network pieces (weei_nn.c) -------------------------------------
 * Tensors are row-major float arrays, batch first. A dense layer with `in`
 * inputs and `out` outputs stores W as [in][out] followed by the bias [out].
 */

void weei_dense_forward(const float *x, uint32_t batch, uint32_t in, uint32_t out,
                        const float *W, const float *bias, float *y);
/* dW += x^T dy, db += column sums of dy, dx = dy W^T (dx may be NULL). */
void weei_dense_backward(const float *x, const float *dy, uint32_t batch, uint32_t in, uint32_t out,
                         const float *W, float *dW, float *db, float *dx);
void weei_relu(float *y, uint32_t n);
void weei_relu_backward(const float *y, float *dy, uint32_t n);     /* dy *= (y > 0) */
void weei_tanh(float *y, uint32_t n);
void weei_tanh_backward(const float *y, float *dy, uint32_t n);     /* dy *= 1 - y^2 */
void weei_softmax(const float *logits, uint32_t n, float *p);
/* Mean cross-entropy of softmax(logits) against labels over the batch.
 * Writes dlogits = (p - onehot) * grad_scale when dlogits is non-NULL and
 * counts argmax hits in *correct when non-NULL. */
double weei_softmax_xent(const float *logits, const uint8_t *labels, uint32_t batch, uint32_t classes,
                         float *dlogits, float grad_scale, uint32_t *correct);
uint32_t weei_argmax(const float *v, uint32_t n);

void weei_sgd_step(float *w, const float *g, uint32_t n, float lr);

typedef struct {
    float lr, beta1, beta2, eps;
    uint32_t t, n;
    double b1t, b2t; /* beta1^t and beta2^t, kept as the steps go (bias correction) */
    float *m, *v;
} weei_adam;
/* Allocates the moment buffers; 0 on success. */
int weei_adam_init(weei_adam *a, uint32_t n, float lr);
void weei_adam_free(weei_adam *a);
void weei_adam_step(weei_adam *a, float *w, const float *g);

/* Initialisation: uniform(-limit, limit) with limit = sqrt(6 / (in + out)) (Glorot). */
void weei_init_dense(weei_rng *r, float *W, float *bias, uint32_t in, uint32_t out);

/* ---- GPU backends (docs/gpu.md) -------------------------------------------- */

/* Pieces of a weei-device-program-v1 program, written with jw_*: a buffer,
 * a pipeline with integer override constants (names NULL-terminated), a
 * dispatch binding buffers[k] at binding k (NULL skips a number) over
 * `workgroups` x 1 x 1 groups, a one-range readback list. */
uint32_t weei_gpu_groups(uint64_t invocations); /* workgroups of 64 covering `invocations` */
void weei_gpu_buffer(const char *id, uint64_t bytes, const char *init);
void weei_gpu_pipeline(const char *id, const char *module, const char *entry, const char *const *names,
                       const uint32_t *values);
void weei_gpu_dispatch(const char *pipeline_id, const char *const *buffers, int count, uint32_t workgroups);
void weei_gpu_readback(const char *id, uint64_t bytes);
/* Reads {"readback": [region, ...]} into r (at most cap): the count or weei_fail. */
int weei_gpu_read_regions(const wj_doc *in, weei_region *r, int cap);

/* The step buffer of wgsl/optimizer.wgsl's adam: weei_adam_step's scalars
 * (betas 0.9 / 0.999, eps 1e-8, its float64 bias corrections), computed
 * in the WASM step by step: [count, grad_scale, size, b1, b2, 1-b1, 1-b2, eps]. */
#define WEEI_GPU_STEP_WORDS 8
typedef struct { float lr; uint32_t t; double b1t, b2t; } weei_gpu_adam;
void weei_gpu_adam_init(weei_gpu_adam *a, float lr);
void weei_gpu_adam_step(weei_gpu_adam *a, uint32_t count, float grad_scale, uint32_t step[WEEI_GPU_STEP_WORDS]);

#endif
