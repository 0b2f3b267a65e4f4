/* digits-mlp: scikit-learn's 8x8 digits, MLP 64 -> 64 ReLU -> 10 softmax.
 *
 * Weights (float32-le, 4810 values): W1[64][64], b1[64], W2[64][10], b2[10].
 * Data format weei-digits-v1 (docs/abi.md): "WDG1", u32-le count n, then n
 * records of 64 pixel intensities 0..16 and a label 0..9. Inputs are /16.
 * Training: local Adam from fresh moments each call, minibatches of
 * settings.batchSize in an order shuffled by the seed, settings.localEpochs
 * passes. Metrics are the means over every example trained on. The same
 * training runs on a GPU through gpu.c (docs/gpu.md).
 */
#include "digits.h"

static const char FORMAT[] = "weei-digits-v1";

float *g_loaded;  /* weights of the last loadModel */
int g_has_weights;
float *g_out;     /* output region of train / createInitialWeights / gpuEnd */

/* Both buffers live in the heap, where every region handed to the host must
 * be (the native benchmark build addresses only its heap arena). */
int digits_buffers(void) {
    if (!g_loaded) g_loaded = weei_malloc(WEIGHT_BYTES);
    if (!g_out) g_out = weei_malloc(WEIGHT_BYTES);
    return g_loaded && g_out ? 0 : weei_fail("out of memory");
}

int model_get_info(const wj_doc *in) {
    (void)in;
    jw_raw("{\"id\":\"digits-mlp\",\"version\":\"1.0.0\",\"name\":\"Handwritten digits MLP (8x8)\","
           "\"abiVersion\":1,\"weightFormat\":\"float32-le\",\"maxWorkers\":1,"
           "\"maxChunkBytes\":650008,\"maxExamplesPerChunk\":10000,"
           "\"dataFormats\":[{\"id\":\"weei-digits-v1\",\"label\":\"Weei digits (8x8, 65-byte records)\","
           "\"acceptedMimeTypes\":[\"application/octet-stream\"]}],"
           "\"metrics\":[{\"id\":\"loss\",\"label\":\"Loss\",\"direction\":\"minimize\"},"
           "{\"id\":\"accuracy\",\"label\":\"Accuracy\",\"direction\":\"maximize\"}]}");
    return 0;
}

int model_create_initial_weights(const wj_doc *in, uint64_t seed) {
    (void)in;
    if (digits_buffers() != 0) return -1;
    weei_rng r;
    weei_rng_seed(&r, seed);
    weei_init_dense(&r, g_out, g_out + N_W1, IN, HID);
    weei_init_dense(&r, g_out + N_W1 + N_B1, g_out + N_W1 + N_B1 + N_W2, HID, OUT);
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
        weei_msg_str(&m, " bytes (");
        weei_msg_int(&m, N_PARAMS);
        weei_msg_str(&m, " float32), got ");
        weei_msg_int(&m, w->bytes);
        return weei_fail(m.buf);
    }
    if (digits_buffers() != 0) return -1;
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
    if (in->toks[slots].count != 0) return weei_fail("digits-mlp declares no auxiliary weights");
    jw_raw("{\"ok\":true}");
    return 0;
}

/* Checks a weei-digits-v1 file; returns the example count or fails. */
static int64_t check_chunk(const char *format, const weei_region *d) {
    if (!format || !weei_streq(format, FORMAT)) return weei_fail("unknown data format (digits-mlp reads weei-digits-v1)");
    if (d->bytes < HEADER) return weei_fail("weei-digits-v1: file shorter than its 8-byte header");
    const uint8_t *p = d->data;
    if (p[0] != 'W' || p[1] != 'D' || p[2] != 'G' || p[3] != '1') return weei_fail("weei-digits-v1: bad magic (expected WDG1)");
    uint32_t n = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
    if (n > MAX_EXAMPLES) return weei_fail("weei-digits-v1: more than 10000 examples");
    if ((uint64_t)d->bytes != HEADER + (uint64_t)n * RECORD) {
        weei_msg m = { {0}, 0 };
        weei_msg_str(&m, "weei-digits-v1: file is ");
        weei_msg_int(&m, d->bytes);
        weei_msg_str(&m, " bytes, but a header announcing ");
        weei_msg_int(&m, n);
        weei_msg_str(&m, " examples needs ");
        weei_msg_int(&m, HEADER + (int64_t)n * RECORD);
        return weei_fail(m.buf);
    }
    for (uint32_t e = 0; e < n; e++) {
        const uint8_t *rec = p + HEADER + (size_t)e * RECORD;
        for (int k = 0; k < IN; k++) if (rec[k] > 16) return weei_fail("weei-digits-v1: pixel intensity above 16");
        if (rec[IN] > 9) return weei_fail("weei-digits-v1: label above 9");
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

/* Reads {"data": region, "format": "..."} into *d; returns the example count or fails. */
int64_t digits_read_data(const wj_doc *in, weei_region *d) {
    char format[64];
    const char *error;
    int f = wj_get(in, 0, "format");
    if (f < 0) return weei_fail("a format is required with data");
    if (wj_string(in, f, format, sizeof format) < 0) return weei_fail("format must be a string");
    if (wj_region(in, wj_get(in, 0, "data"), d, &error) != 0) return weei_fail(error);
    return check_chunk(format, d);
}

typedef struct {
    float *x, *h, *logits, *dlogits, *dh, *grad;
    uint8_t *labels;
} workspace;

static void ws_free(workspace *w) {
    weei_mfree(w->x); weei_mfree(w->h); weei_mfree(w->logits); weei_mfree(w->dlogits);
    weei_mfree(w->dh); weei_mfree(w->grad); weei_mfree(w->labels);
}

static int ws_alloc(workspace *w, uint32_t batch) {
    w->x = weei_malloc((size_t)batch * IN * 4);
    w->h = weei_malloc((size_t)batch * HID * 4);
    w->logits = weei_malloc((size_t)batch * OUT * 4);
    w->dlogits = weei_malloc((size_t)batch * OUT * 4);
    w->dh = weei_malloc((size_t)batch * HID * 4);
    w->grad = weei_malloc(WEIGHT_BYTES);
    w->labels = weei_malloc(batch);
    if (!w->x || !w->h || !w->logits || !w->dlogits || !w->dh || !w->grad || !w->labels) { ws_free(w); return -1; }
    return 0;
}

static void gather(workspace *w, const uint8_t *records, const uint32_t *idx, uint32_t count) {
    for (uint32_t b = 0; b < count; b++) {
        const uint8_t *rec = records + (size_t)idx[b] * RECORD;
        for (int k = 0; k < IN; k++) w->x[b * IN + k] = digits_pixel(rec[k]);
        w->labels[b] = rec[IN];
    }
}

/* Forward pass of `count` gathered examples; returns the summed loss. */
static double forward(workspace *w, const float *p, uint32_t count, float *dlogits, float grad_scale, uint32_t *correct) {
    weei_dense_forward(w->x, count, IN, HID, p, p + N_W1, w->h);
    weei_relu(w->h, count * HID);
    weei_dense_forward(w->h, count, HID, OUT, p + N_W1 + N_B1, p + N_W1 + N_B1 + N_W2, w->logits);
    return weei_softmax_xent(w->logits, w->labels, count, OUT, dlogits, grad_scale, correct) * count;
}

int model_train(const wj_doc *in) {
    if (!g_has_weights) return weei_fail("train called before loadModel");
    if (wj_get(in, 0, "experience") >= 0) return weei_fail("digits-mlp is a dataset model: train needs data, not experience");
    weei_region d;
    int64_t n64 = digits_read_data(in, &d);
    if (n64 < 0) return -1;
    uint32_t n = (uint32_t)n64;
    if (n == 0) return weei_fail("weei-digits-v1: the chunk has no examples");
    weei_settings s;
    if (weei_read_settings(in, &s, DEFAULT_BATCH, DEFAULT_LR) != 0) return -1;
    uint64_t seed;
    if (weei_read_seed(in, &seed) != 0) return -1;
    uint32_t step_limit;
    if (digits_read_step_limit(in, &step_limit) != 0) return -1;
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

    for (uint32_t epoch = 0; epoch < s.local_epochs && steps < step_limit; epoch++) {
        for (uint32_t i = 0; i < n; i++) order[i] = i;
        weei_shuffle_u32(&r, order, n);
        for (uint32_t start = 0; start < n && steps < step_limit; start += batch) {
            uint32_t count = n - start < batch ? n - start : batch;
            gather(&w, records, order + start, count);
            loss_sum += forward(&w, p, count, w.dlogits, 1.0f / (float)count, &correct);
            weei_memzero(w.grad, WEIGHT_BYTES);
            float *gW1 = w.grad, *gb1 = gW1 + N_W1, *gW2 = gb1 + N_B1, *gb2 = gW2 + N_W2;
            weei_dense_backward(w.h, w.dlogits, count, HID, OUT, p + N_W1 + N_B1, gW2, gb2, w.dh);
            weei_relu_backward(w.h, w.dh, count * HID);
            weei_dense_backward(w.x, w.dh, count, IN, HID, p, gW1, gb1, 0);
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
    jw_key("uniqueExamples"); jw_uint(processed < n ? processed : n);
    jw_key("optimizerSteps"); jw_uint(steps);
    jw_obj_end();
    return 0;
}

int digits_read_step_limit(const wj_doc *in, uint32_t *limit) {
    uint64_t v;
    int t = wj_get(in, 0, "stepLimit");
    *limit = 0xFFFFFFFFu;
    if (t < 0) return 0;
    if (wj_uint(in, t, &v) != 0 || v < 1 || v > 0xFFFFFFFFu) return weei_fail("stepLimit must be a positive integer");
    *limit = (uint32_t)v;
    return 0;
}

int model_evaluate(const wj_doc *in) {
    if (!g_has_weights) return weei_fail("evaluate called before loadModel");
    if (wj_get(in, 0, "experience") >= 0) return weei_fail("digits-mlp is a dataset model: evaluate needs data, not experience");
    weei_region d;
    int64_t n64 = digits_read_data(in, &d);
    if (n64 < 0) return -1;
    uint32_t n = (uint32_t)n64;
    if (n == 0) return weei_fail("weei-digits-v1: the file has no examples");
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
