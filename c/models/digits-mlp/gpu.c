/* digits-mlp's GPU backend (docs/gpu.md): gpuBegin emits a
 * weei-device-program-v1 program over the wgsl/ kernels, gpuNext packs each
 * minibatch (the same order, the same Adam step sizes as model_train) and
 * reads the step's per-example losses back, gpuEnd takes the read-back
 * weights and answers like train. The WASM stays the model; WGSL only
 * computes. */
#include "digits.h"

#define STEP_WORDS 8

static struct {
    int active;
    uint32_t n, batch, epochs, epoch, start, step_limit, steps, pending;
    uint8_t *records;  /* the chunk's records, copied: input regions die with gpuBegin */
    uint32_t *order;
    float *x;
    uint32_t *labels;
    uint32_t step[STEP_WORDS];
    weei_rng rng;
    float lr;
    uint32_t t;
    double b1t, b2t;
    double loss_sum;
    uint32_t correct;
    uint64_t processed, total;
} G;

static void end_session(void) {
    weei_mfree(G.records); weei_mfree(G.order); weei_mfree(G.x); weei_mfree(G.labels);
    weei_memzero(&G, sizeof G);
}

static uint32_t f32_bits(float f) { return weei_f32_bits(f); }

static uint32_t groups(uint64_t invocations) { return (uint32_t)((invocations + 63) / 64); }

static void buffer(const char *id, uint64_t bytes, const char *init) {
    jw_obj_begin();
    jw_key("id"); jw_str(id);
    jw_key("bytes"); jw_uint(bytes);
    jw_key("init"); jw_str(init);
    jw_obj_end();
}

/* A pipeline with up to 5 integer override constants (names NULL-terminated). */
static void pipeline(const char *id, const char *module, const char *entry, const char *const *names,
                     const uint32_t *values) {
    jw_obj_begin();
    jw_key("id"); jw_str(id);
    jw_key("module"); jw_str(module);
    jw_key("entryPoint"); jw_str(entry);
    jw_key("constants");
    jw_obj_begin();
    for (int k = 0; names[k]; k++) { jw_key(names[k]); jw_uint(values[k]); }
    jw_obj_end();
    jw_obj_end();
}

/* A dispatch binding buffers[k] at binding k (NULL skips a binding number). */
static void dispatch(const char *pipeline_id, const char *const *buffers, int count, uint32_t workgroups) {
    jw_obj_begin();
    jw_key("op"); jw_str("dispatch");
    jw_key("pipeline"); jw_str(pipeline_id);
    jw_key("bindings");
    jw_arr_begin();
    for (int k = 0; k < count; k++) {
        if (!buffers[k]) continue;
        jw_obj_begin();
        jw_key("binding"); jw_uint((uint64_t)k);
        jw_key("buffer"); jw_str(buffers[k]);
        jw_obj_end();
    }
    jw_arr_end();
    jw_key("workgroups");
    jw_arr_begin(); jw_uint(workgroups); jw_uint(1); jw_uint(1); jw_arr_end();
    jw_obj_end();
}

static void readback(const char *id, uint64_t bytes) {
    jw_arr_begin();
    jw_obj_begin();
    jw_key("buffer"); jw_str(id);
    jw_key("offset"); jw_uint(0);
    jw_key("bytes"); jw_uint(bytes);
    jw_obj_end();
    jw_arr_end();
}

static void write_program(uint32_t B) {
    static const char *const dense[] = { "IN", "OUT", "W_OFF", "B_OFF", "ACT", 0 };
    static const char *const wgrad[] = { "IN", "OUT", "W_OFF", 0 };
    static const char *const colsum[] = { "COLS", "OUT_OFF", 0 };
    static const char *const classes[] = { "CLASSES", 0 };
    static const char *const n_params[] = { "N", 0 };
    const uint32_t l1[] = { IN, HID, 0, N_W1, 1 }, l2[] = { HID, OUT, N_W1 + N_B1, N_W1 + N_B1 + N_W2, 0 };
    const uint32_t l1g[] = { IN, HID, 0 }, l2g[] = { HID, OUT, N_W1 + N_B1 };
    const uint32_t l2x[] = { HID, OUT, N_W1 + N_B1, 0, 1 };
    const uint32_t l1b[] = { HID, N_W1 }, l2b[] = { OUT, N_W1 + N_B1 + N_W2 };
    const uint32_t cls[] = { OUT }, np[] = { N_PARAMS };

    jw_key("format"); jw_str("weei-device-program-v1");
    jw_key("buffers");
    jw_arr_begin();
    buffer("weights", WEIGHT_BYTES, "weights");
    buffer("grad", WEIGHT_BYTES, "zeros");
    buffer("adam_m", WEIGHT_BYTES, "zeros");
    buffer("adam_v", WEIGHT_BYTES, "zeros");
    buffer("x", (uint64_t)B * IN * 4, "batch");
    buffer("labels", (uint64_t)B * 4, "batch");
    buffer("step", STEP_WORDS * 4, "batch");
    buffer("h", (uint64_t)B * HID * 4, "zeros");
    buffer("logits", (uint64_t)B * OUT * 4, "zeros");
    buffer("dlogits", (uint64_t)B * OUT * 4, "zeros");
    buffer("dh", (uint64_t)B * HID * 4, "zeros");
    buffer("stats", (uint64_t)B * 8, "zeros");
    jw_arr_end();

    jw_key("pipelines");
    jw_arr_begin();
    pipeline("l1_forward", "matmul.wgsl", "forward", dense, l1);
    pipeline("l2_forward", "matmul.wgsl", "forward", dense, l2);
    pipeline("xent", "softmax_xent.wgsl", "forward_backward", classes, cls);
    pipeline("l2_wgrad", "matmul.wgsl", "weight_grad", wgrad, l2g);
    pipeline("l2_bgrad", "reduce.wgsl", "column_sum", colsum, l2b);
    pipeline("l2_xgrad", "matmul.wgsl", "input_grad", dense, l2x);
    pipeline("l1_wgrad", "matmul.wgsl", "weight_grad", wgrad, l1g);
    pipeline("l1_bgrad", "reduce.wgsl", "column_sum", colsum, l1b);
    pipeline("adam", "optimizer.wgsl", "adam", n_params, np);
    jw_arr_end();

    /* The order of model_train: forward, loss, backward (db, dW, dx per layer), Adam. */
    static const char *const s1[] = { "x", "weights", "h", "step" };
    static const char *const s2[] = { "h", "weights", "logits", "step" };
    static const char *const s3[] = { "logits", "labels", "dlogits", "step", "stats" };
    static const char *const s4[] = { "h", "dlogits", "grad", "step" };
    static const char *const s5[] = { "dlogits", 0, "grad", "step" };
    static const char *const s6[] = { "dlogits", "weights", "dh", "step", "h" };
    static const char *const s7[] = { "x", "dh", "grad", "step" };
    static const char *const s8[] = { "dh", 0, "grad", "step" };
    static const char *const s9[] = { "weights", "grad", "adam_m", "adam_v", "step" };
    jw_key("steps");
    jw_arr_begin();
    dispatch("l1_forward", s1, 4, groups((uint64_t)B * HID));
    dispatch("l2_forward", s2, 4, groups((uint64_t)B * OUT));
    dispatch("xent", s3, 5, groups(B));
    dispatch("l2_wgrad", s4, 4, groups(HID * OUT));
    dispatch("l2_bgrad", s5, 4, groups(OUT));
    dispatch("l2_xgrad", s6, 5, groups((uint64_t)B * HID));
    dispatch("l1_wgrad", s7, 4, groups(IN * HID));
    dispatch("l1_bgrad", s8, 4, groups(HID));
    dispatch("adam", s9, 5, groups(N_PARAMS));
    jw_arr_end();
    jw_key("stepReadback"); readback("stats", (uint64_t)B * 8);
    jw_key("finalReadback"); readback("weights", WEIGHT_BYTES);
}

static void shuffle_epoch(void) {
    for (uint32_t i = 0; i < G.n; i++) G.order[i] = i;
    weei_shuffle_u32(&G.rng, G.order, G.n);
}

static int gpu_begin(const wj_doc *in) {
    if (!g_has_weights) return weei_fail("gpuBegin called before loadModel");
    if (wj_get(in, 0, "experience") >= 0) return weei_fail("digits-mlp is a dataset model: gpuBegin needs data, not experience");
    weei_region d;
    int64_t n64 = digits_read_data(in, &d);
    if (n64 < 0) return -1;
    if (n64 == 0) return weei_fail("weei-digits-v1: the chunk has no examples");
    weei_settings s;
    if (weei_read_settings(in, &s, DEFAULT_BATCH, DEFAULT_LR) != 0) return -1;
    uint64_t seed;
    if (weei_read_seed(in, &seed) != 0) return -1;
    uint32_t step_limit;
    if (digits_read_step_limit(in, &step_limit) != 0) return -1;
    end_session();
    G.n = (uint32_t)n64;
    G.batch = s.batch_size < G.n ? s.batch_size : G.n;
    G.epochs = s.local_epochs;
    G.step_limit = step_limit;
    G.lr = s.learning_rate;
    G.b1t = G.b2t = 1.0;
    G.total = (uint64_t)G.n * s.local_epochs;
    G.records = weei_malloc((size_t)G.n * RECORD);
    G.order = weei_malloc((size_t)G.n * 4);
    G.x = weei_malloc((size_t)G.batch * IN * 4);
    G.labels = weei_malloc((size_t)G.batch * 4);
    if (!G.records || !G.order || !G.x || !G.labels) { end_session(); return weei_fail("out of memory"); }
    weei_memcopy(G.records, d.data + HEADER, (size_t)G.n * RECORD);
    weei_rng_seed(&G.rng, seed);
    shuffle_epoch();
    G.active = 1;
    jw_obj_begin();
    jw_key("program");
    jw_obj_begin();
    write_program(G.batch);
    jw_obj_end();
    jw_key("weights"); jw_region(g_loaded, WEIGHT_BYTES);
    jw_key("totalExamples"); jw_uint(G.total);
    jw_obj_end();
    return 0;
}

/* Folds the finished step's stats (loss, hit per example) into the metrics,
 * in model_train's float64 order. */
static int take_stats(const weei_region *r) {
    uint32_t count = G.pending;
    if (r->bytes < (uint64_t)count * 8) return weei_fail("gpuNext: the stats readback is too short");
    double total = 0.0;
    uint32_t hits = 0;
    for (uint32_t b = 0; b < count; b++) {
        float loss, hit;
        weei_memcopy(&loss, r->data + (size_t)b * 8, 4);
        weei_memcopy(&hit, r->data + (size_t)b * 8 + 4, 4);
        total += (double)loss;
        if (hit != 0.0f) hits++;
    }
    G.loss_sum += total / count * count;
    G.correct += hits;
    G.steps++;
    G.processed += count;
    G.pending = 0;
    static const char *const ids[2] = { "loss", "accuracy" };
    double mv[2] = { G.loss_sum / (double)G.processed, (double)G.correct / (double)G.processed };
    weei_progress(G.processed, G.total, ids, mv, 2);
    return 0;
}

/* Packs the next minibatch and its step scalars (weei_adam_step's step size). */
static void pack_batch(void) {
    uint32_t count = G.n - G.start < G.batch ? G.n - G.start : G.batch;
    for (uint32_t b = 0; b < count; b++) {
        const uint8_t *rec = G.records + (size_t)G.order[G.start + b] * RECORD;
        for (int k = 0; k < IN; k++) G.x[b * IN + k] = digits_pixel(rec[k]);
        G.labels[b] = rec[IN];
    }
    const float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
    G.t++;
    if (G.t <= 100000) { G.b1t *= beta1; G.b2t *= beta2; }
    float step = (float)((double)G.lr * __builtin_sqrt(1.0 - G.b2t) / (1.0 - G.b1t));
    G.step[0] = count;
    G.step[1] = f32_bits(1.0f / (float)count);
    G.step[2] = f32_bits(step);
    G.step[3] = f32_bits(beta1);
    G.step[4] = f32_bits(beta2);
    G.step[5] = f32_bits(1.0f - beta1);
    G.step[6] = f32_bits(1.0f - beta2);
    G.step[7] = f32_bits(eps);
    G.start += count;
    G.pending = count;
    jw_obj_begin();
    jw_key("batch");
    jw_arr_begin();
    jw_obj_begin(); jw_key("buffer"); jw_str("x"); jw_key("data"); jw_region(G.x, count * IN * 4); jw_obj_end();
    jw_obj_begin(); jw_key("buffer"); jw_str("labels"); jw_key("data"); jw_region(G.labels, count * 4); jw_obj_end();
    jw_obj_begin(); jw_key("buffer"); jw_str("step"); jw_key("data"); jw_region(G.step, STEP_WORDS * 4); jw_obj_end();
    jw_arr_end();
    jw_obj_end();
}

/* Reads {"readback": [region, ...]} into r (at most `cap`); the count or weei_fail. */
static int read_regions(const wj_doc *in, weei_region *r, int cap) {
    int arr = wj_get(in, 0, "readback");
    if (arr < 0 || in->toks[arr].type != WJ_ARRAY) return weei_fail("a readback array is required");
    int count = (int)in->toks[arr].count;
    if (count > cap) return weei_fail("readback has more regions than the program reads");
    for (int k = 0; k < count; k++) {
        const char *error;
        if (wj_region(in, wj_at(in, arr, (uint32_t)k), &r[k], &error) != 0) return weei_fail(error);
    }
    return count;
}

static int gpu_next(const wj_doc *in) {
    if (!G.active) return weei_fail("gpuNext called without gpuBegin");
    weei_region r[1];
    int count = read_regions(in, r, 1);
    if (count < 0) return -1;
    if (G.pending) {
        if (count != 1) return weei_fail("gpuNext: expected the step's stats readback");
        if (take_stats(&r[0]) != 0) return -1;
    } else if (count != 0) {
        return weei_fail("gpuNext: no step ran, nothing to read back");
    }
    if (G.start >= G.n && G.epoch + 1 < G.epochs) {
        G.epoch++;
        G.start = 0;
        shuffle_epoch();
    }
    if (G.steps >= G.step_limit || G.start >= G.n) {
        jw_raw("{\"done\":true}");
        return 0;
    }
    pack_batch();
    return 0;
}

static int gpu_end(const wj_doc *in) {
    if (!G.active) return weei_fail("gpuEnd called without gpuBegin");
    if (G.pending || (G.steps < G.step_limit && (G.start < G.n || G.epoch + 1 < G.epochs)))
        return weei_fail("gpuEnd called before gpuNext answered done");
    weei_region r[1];
    int count = read_regions(in, r, 1);
    if (count < 0) return -1;
    if (count != 1 || r[0].bytes != WEIGHT_BYTES) return weei_fail("gpuEnd: expected the weights readback");
    if (digits_buffers() != 0) return -1;
    weei_memcopy(g_out, r[0].data, WEIGHT_BYTES);
    for (uint32_t i = 0; i < N_PARAMS; i++)
        if (!weei_isfinite_f32(g_out[i])) { end_session(); return weei_fail("training diverged: a weight is not finite (lower the learning rate)"); }
    jw_obj_begin();
    jw_key("weights"); jw_region(g_out, WEIGHT_BYTES);
    jw_key("metrics");
    jw_obj_begin();
    jw_key("loss"); jw_num(G.loss_sum / (double)G.processed);
    jw_key("accuracy"); jw_num((double)G.correct / (double)G.processed);
    jw_obj_end();
    jw_key("uniqueExamples"); jw_uint(G.processed < G.n ? G.processed : G.n);
    jw_key("optimizerSteps"); jw_uint(G.steps);
    jw_obj_end();
    end_session();
    return 0;
}

WEEI_EXPORT("gpuBegin") uint32_t digits_op_gpu_begin(uint32_t p, uint32_t n) { return weei_run_op(p, n, gpu_begin); }
WEEI_EXPORT("gpuNext") uint32_t digits_op_gpu_next(uint32_t p, uint32_t n) { return weei_run_op(p, n, gpu_next); }
WEEI_EXPORT("gpuEnd") uint32_t digits_op_gpu_end(uint32_t p, uint32_t n) { return weei_run_op(p, n, gpu_end); }
