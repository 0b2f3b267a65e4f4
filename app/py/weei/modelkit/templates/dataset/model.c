/* @NAME@: a dataset model made with `weei model new` (docs/models.md).
 *
 * A classifier FEATURES -> HIDDEN ReLU -> CLASSES softmax (`weei model new
 * --features N --classes K` sets the first and last). Edit the numbers below
 * to fit your data, or replace the network: what Weei needs
 * is the seven model_* operations and a weight array of float32 values.
 *
 * Weights (float32-le, N_PARAMS values): W1[FEATURES][HIDDEN], b1[HIDDEN],
 * W2[HIDDEN][CLASSES], b2[CLASSES] (the SDK's dense layout: W then bias).
 *
 * Data format weei-records-v1 (what `weei data chunk` writes): "WRC1",
 * u32-le record count n, u32-le feature count (must be FEATURES), then n
 * records of FEATURES float32-le values and a u32-le label < CLASSES.
 *
 * Training: Adam from fresh moments each call, minibatches of
 * settings.batchSize in an order shuffled by the seed, settings.localEpochs
 * passes. Metrics are the means over every example trained on.
 */
#include "sdk/weei_sdk.h"

#define FEATURES @FEATURES@
#define HIDDEN 32
#define CLASSES @CLASSES@

#define N_W1 (FEATURES * HIDDEN)
#define N_B1 HIDDEN
#define N_W2 (HIDDEN * CLASSES)
#define N_B2 CLASSES
#define N_PARAMS (N_W1 + N_B1 + N_W2 + N_B2)
#define WEIGHT_BYTES (N_PARAMS * 4)
#define HEADER 12
#define RECORD (FEATURES * 4 + 4)
#define MAX_EXAMPLES 100000
#define DEFAULT_BATCH 32
#define DEFAULT_LR 0.01f

static const char FORMAT[] = "weei-records-v1";

static float *g_loaded;  /* weights of the last loadModel */
static int g_has_weights;
static float *g_out;     /* output region of train / createInitialWeights */

/* Regions handed back to the host live in the heap. */
static int buffers(void) {
    if (!g_loaded) g_loaded = weei_malloc(WEIGHT_BYTES);
    if (!g_out) g_out = weei_malloc(WEIGHT_BYTES);
    return g_loaded && g_out ? 0 : weei_fail("out of memory");
}

int model_get_info(const wj_doc *in) {
    (void)in;
    jw_obj_begin();
    jw_key("id"); jw_str("@NAME@");
    jw_key("version"); jw_str("1.0.0");
    jw_key("name"); jw_str("@NAME@");
    jw_key("abiVersion"); jw_int(1);
    jw_key("weightFormat"); jw_str("float32-le");
    jw_key("maxWorkers"); jw_int(1);
    jw_key("maxChunkBytes"); jw_int(HEADER + (int64_t)RECORD * MAX_EXAMPLES);
    jw_key("maxExamplesPerChunk"); jw_int(MAX_EXAMPLES);
    jw_key("dataFormats");
    jw_raw("[{\"id\":\"weei-records-v1\",\"label\":\"Weei records (float32 features, u32 label)\","
           "\"acceptedMimeTypes\":[\"application/octet-stream\"]}]");
    jw_key("metrics");
    jw_raw("[{\"id\":\"loss\",\"label\":\"Loss\",\"direction\":\"minimize\"},"
           "{\"id\":\"accuracy\",\"label\":\"Accuracy\",\"direction\":\"maximize\"}]");
    jw_obj_end();
    return 0;
}

int model_create_initial_weights(const wj_doc *in, uint64_t seed) {
    (void)in;
    if (buffers() != 0) return -1;
    weei_rng r;
    weei_rng_seed(&r, seed);
    weei_init_dense(&r, g_out, g_out + N_W1, FEATURES, HIDDEN);
    weei_init_dense(&r, g_out + N_W1 + N_B1, g_out + N_W1 + N_B1 + N_W2, HIDDEN, CLASSES);
    jw_obj_begin();
    jw_key("weights"); jw_region(g_out, WEIGHT_BYTES);
    jw_obj_end();
    return 0;
}

int model_load(const wj_doc *in, const weei_region *w) {
    (void)in;
    if (w->bytes != WEIGHT_BYTES) {
        weei_msg m = { {0}, 0 };
        weei_msg_str(&m, "weights must be ");
        weei_msg_int(&m, WEIGHT_BYTES);
        weei_msg_str(&m, " bytes, got ");
        weei_msg_int(&m, w->bytes);
        return weei_fail(m.buf);
    }
    if (buffers() != 0) return -1;
    for (uint32_t i = 0; i < N_PARAMS; i++) {
        float v;
        weei_memcopy(&v, w->data + (size_t)i * 4, 4);
        if (!weei_isfinite_f32(v)) return weei_fail("weights contain a value that is not finite");
    }
    weei_memcopy(g_loaded, w->data, WEIGHT_BYTES);
    g_has_weights = 1;
    jw_raw("{\"ok\":true}");
    return 0;
}

int model_load_auxiliary(const wj_doc *in, int slots) {
    if (in->toks[slots].count != 0) return weei_fail("@NAME@ declares no auxiliary weights");
    jw_raw("{\"ok\":true}");
    return 0;
}

static uint32_t read_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Checks a weei-records-v1 file; returns the example count or fails. */
static int64_t check_chunk(const char *format, const weei_region *d) {
    if (!format || !weei_streq(format, FORMAT)) return weei_fail("unknown data format (@NAME@ reads weei-records-v1)");
    if (d->bytes < HEADER) return weei_fail("weei-records-v1: file shorter than its 12-byte header");
    const uint8_t *p = d->data;
    if (p[0] != 'W' || p[1] != 'R' || p[2] != 'C' || p[3] != '1') return weei_fail("weei-records-v1: bad magic (expected WRC1)");
    uint32_t n = read_u32(p + 4);
    if (read_u32(p + 8) != FEATURES) {
        weei_msg m = { {0}, 0 };
        weei_msg_str(&m, "weei-records-v1: the file has ");
        weei_msg_int(&m, read_u32(p + 8));
        weei_msg_str(&m, " features per record, the model reads ");
        weei_msg_int(&m, FEATURES);
        return weei_fail(m.buf);
    }
    if (n > MAX_EXAMPLES) return weei_fail("weei-records-v1: more records than maxExamplesPerChunk");
    if ((uint64_t)d->bytes != HEADER + (uint64_t)n * RECORD) return weei_fail("weei-records-v1: the file size does not match its record count");
    for (uint32_t e = 0; e < n; e++) {
        const uint8_t *rec = p + HEADER + (size_t)e * RECORD;
        for (int k = 0; k < FEATURES; k++) {
            float v;
            weei_memcopy(&v, rec + 4 * k, 4);
            if (!weei_isfinite_f32(v)) return weei_fail("weei-records-v1: a feature is not finite");
        }
        if (read_u32(rec + 4 * FEATURES) >= CLASSES) return weei_fail("weei-records-v1: a label is not below CLASSES");
    }
    return n;
}

int model_describe_chunk(const wj_doc *in, const char *format, const weei_region *data) {
    (void)in;
    int64_t n = check_chunk(format, data);
    if (n < 0) return -1;
    jw_obj_begin();
    jw_key("exampleCount"); jw_int(n);
    jw_obj_end();
    return 0;
}

/* Reads {"data": region, "format": "..."}; returns the example count or fails. */
static int64_t read_data(const wj_doc *in, weei_region *d) {
    char format[64];
    const char *error;
    int f = wj_get(in, 0, "format");
    if (f < 0) return weei_fail("a format is required with data");
    if (wj_string(in, f, format, sizeof format) < 0) return weei_fail("format must be a string");
    if (wj_region(in, wj_get(in, 0, "data"), d, &error) != 0) return weei_fail(error);
    return check_chunk(format, d);
}

typedef struct { float *x, *h, *logits, *dlogits, *dh, *grad; uint8_t *labels; } workspace;

static void ws_free(workspace *w) {
    weei_mfree(w->x); weei_mfree(w->h); weei_mfree(w->logits); weei_mfree(w->dlogits);
    weei_mfree(w->dh); weei_mfree(w->grad); weei_mfree(w->labels);
}

static int ws_alloc(workspace *w, uint32_t batch) {
    w->x = weei_malloc((size_t)batch * FEATURES * 4);
    w->h = weei_malloc((size_t)batch * HIDDEN * 4);
    w->logits = weei_malloc((size_t)batch * CLASSES * 4);
    w->dlogits = weei_malloc((size_t)batch * CLASSES * 4);
    w->dh = weei_malloc((size_t)batch * HIDDEN * 4);
    w->grad = weei_malloc(WEIGHT_BYTES);
    w->labels = weei_malloc(batch);
    if (!w->x || !w->h || !w->logits || !w->dlogits || !w->dh || !w->grad || !w->labels) { ws_free(w); return -1; }
    return 0;
}

static void gather(workspace *w, const uint8_t *records, const uint32_t *idx, uint32_t count) {
    for (uint32_t b = 0; b < count; b++) {
        const uint8_t *rec = records + (size_t)idx[b] * RECORD;
        weei_memcopy(w->x + (size_t)b * FEATURES, rec, FEATURES * 4);
        w->labels[b] = (uint8_t)read_u32(rec + 4 * FEATURES);
    }
}

/* Forward pass of `count` gathered examples; returns the summed loss. */
static double forward(workspace *w, const float *p, uint32_t count, float *dlogits, float grad_scale, uint32_t *correct) {
    weei_dense_forward(w->x, count, FEATURES, HIDDEN, p, p + N_W1, w->h);
    weei_relu(w->h, count * HIDDEN);
    weei_dense_forward(w->h, count, HIDDEN, CLASSES, p + N_W1 + N_B1, p + N_W1 + N_B1 + N_W2, w->logits);
    return weei_softmax_xent(w->logits, w->labels, count, CLASSES, dlogits, grad_scale, correct) * count;
}

int model_train(const wj_doc *in) {
    if (!g_has_weights) return weei_fail("train called before loadModel");
    weei_region d;
    int64_t n64 = read_data(in, &d);
    if (n64 < 0) return -1;
    uint32_t n = (uint32_t)n64;
    if (n == 0) return weei_fail("weei-records-v1: the chunk has no records");
    weei_settings s;
    if (weei_read_settings(in, &s, DEFAULT_BATCH, DEFAULT_LR) != 0) return -1;
    uint64_t seed;
    if (weei_read_seed(in, &seed) != 0) return -1;
    uint32_t batch = s.batch_size < n ? s.batch_size : n;

    workspace w;
    weei_adam adam;
    uint32_t *order = weei_malloc((size_t)n * 4);
    if (ws_alloc(&w, batch) != 0 || !order) { weei_mfree(order); return weei_fail("out of memory"); }
    if (weei_adam_init(&adam, N_PARAMS, s.learning_rate) != 0) { ws_free(&w); weei_mfree(order); return weei_fail("out of memory"); }

    float *p = g_out;
    weei_memcopy(p, g_loaded, WEIGHT_BYTES);
    weei_rng r;
    weei_rng_seed(&r, seed);
    const uint8_t *records = d.data + HEADER;
    double loss_sum = 0.0;
    uint32_t correct = 0, steps = 0;
    uint64_t processed = 0, total = (uint64_t)n * s.local_epochs;
    static const char *const ids[2] = { "loss", "accuracy" };

    for (uint32_t epoch = 0; epoch < s.local_epochs; epoch++) {
        for (uint32_t i = 0; i < n; i++) order[i] = i;
        weei_shuffle_u32(&r, order, n);
        for (uint32_t start = 0; start < n; start += batch) {
            uint32_t count = n - start < batch ? n - start : batch;
            gather(&w, records, order + start, count);
            loss_sum += forward(&w, p, count, w.dlogits, 1.0f / (float)count, &correct);
            weei_memzero(w.grad, WEIGHT_BYTES);
            float *gW1 = w.grad, *gb1 = gW1 + N_W1, *gW2 = gb1 + N_B1, *gb2 = gW2 + N_W2;
            weei_dense_backward(w.h, w.dlogits, count, HIDDEN, CLASSES, p + N_W1 + N_B1, gW2, gb2, w.dh);
            weei_relu_backward(w.h, w.dh, count * HIDDEN);
            weei_dense_backward(w.x, w.dh, count, FEATURES, HIDDEN, p, gW1, gb1, 0);
            weei_adam_step(&adam, p, w.grad);
            steps++;
            processed += count;
            double mv[2] = { loss_sum / (double)processed, (double)correct / (double)processed };
            weei_progress(processed, total, ids, mv, 2);
        }
    }
    weei_adam_free(&adam);
    ws_free(&w);
    weei_mfree(order);
    for (uint32_t i = 0; i < N_PARAMS; i++)
        if (!weei_isfinite_f32(p[i])) return weei_fail("training diverged: a weight is not finite (lower the learning rate)");

    jw_obj_begin();
    jw_key("weights"); jw_region(p, WEIGHT_BYTES);
    jw_key("metrics");
    jw_obj_begin();
    jw_key("loss"); jw_num(loss_sum / (double)processed);
    jw_key("accuracy"); jw_num((double)correct / (double)processed);
    jw_obj_end();
    jw_key("uniqueExamples"); jw_uint(n);
    jw_key("optimizerSteps"); jw_uint(steps);
    jw_obj_end();
    return 0;
}

int model_evaluate(const wj_doc *in) {
    if (!g_has_weights) return weei_fail("evaluate called before loadModel");
    weei_region d;
    int64_t n64 = read_data(in, &d);
    if (n64 < 0) return -1;
    uint32_t n = (uint32_t)n64;
    if (n == 0) return weei_fail("weei-records-v1: the file has no records");
    const uint32_t batch = 256;
    workspace w;
    uint32_t idx[256];
    if (ws_alloc(&w, batch) != 0) return weei_fail("out of memory");
    double loss_sum = 0.0;
    uint32_t correct = 0;
    for (uint32_t start = 0; start < n; start += batch) {
        uint32_t count = n - start < batch ? n - start : batch;
        for (uint32_t b = 0; b < count; b++) idx[b] = start + b;
        gather(&w, d.data + HEADER, idx, count);
        loss_sum += forward(&w, g_loaded, count, 0, 0.0f, &correct);
    }
    ws_free(&w);
    jw_obj_begin();
    jw_key("metrics");
    jw_obj_begin();
    jw_key("loss"); jw_num(loss_sum / (double)n);
    jw_key("accuracy"); jw_num((double)correct / (double)n);
    jw_obj_end();
    jw_key("examples"); jw_uint(n);
    jw_obj_end();
    return 0;
}
