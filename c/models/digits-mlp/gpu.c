/* digits-mlp's GPU backend (docs/gpu.md): gpuBegin emits a
 * weei-device-program-v1 program over the wgsl/ kernels, gpuNext packs each
 * minibatch (the same order, the same Adam step sizes as model_train) and
 * reads the step's per-example losses back, gpuEnd takes the read-back
 * weights and answers like train. The WASM stays the model; WGSL only
 * computes. */
#include "digits.h"

static struct {
    int active;
    uint32_t n, batch, epochs, epoch, start, step_limit, steps, pending;
    uint8_t *records;  /* the chunk's records, copied: input regions die with gpuBegin */
    uint32_t *order;
    float *x;
    uint32_t *labels;
    uint32_t step[WEEI_GPU_STEP_WORDS];
    weei_rng rng;
    weei_gpu_adam adam;
    double loss_sum;
    uint32_t correct;
    uint64_t processed, total;
} G;

static void end_session(void) {
    weei_mfree(G.records); weei_mfree(G.order); weei_mfree(G.x); weei_mfree(G.labels);
    weei_memzero(&G, sizeof G);
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
    weei_gpu_buffer("weights", WEIGHT_BYTES, "weights");
    weei_gpu_buffer("grad", WEIGHT_BYTES, "zeros");
    weei_gpu_buffer("adam_m", WEIGHT_BYTES, "zeros");
    weei_gpu_buffer("adam_v", WEIGHT_BYTES, "zeros");
    weei_gpu_buffer("x", (uint64_t)B * IN * 4, "batch");
    weei_gpu_buffer("labels", (uint64_t)B * 4, "batch");
    weei_gpu_buffer("step", WEEI_GPU_STEP_WORDS * 4, "batch");
    weei_gpu_buffer("h", (uint64_t)B * HID * 4, "zeros");
    weei_gpu_buffer("logits", (uint64_t)B * OUT * 4, "zeros");
    weei_gpu_buffer("dlogits", (uint64_t)B * OUT * 4, "zeros");
    weei_gpu_buffer("dh", (uint64_t)B * HID * 4, "zeros");
    weei_gpu_buffer("stats", (uint64_t)B * 8, "zeros");
    jw_arr_end();

    jw_key("pipelines");
    jw_arr_begin();
    weei_gpu_pipeline("l1_forward", "matmul.wgsl", "forward", dense, l1);
    weei_gpu_pipeline("l2_forward", "matmul.wgsl", "forward", dense, l2);
    weei_gpu_pipeline("xent", "softmax_xent.wgsl", "forward_backward", classes, cls);
    weei_gpu_pipeline("l2_wgrad", "matmul.wgsl", "weight_grad", wgrad, l2g);
    weei_gpu_pipeline("l2_bgrad", "reduce.wgsl", "column_sum", colsum, l2b);
    weei_gpu_pipeline("l2_xgrad", "matmul.wgsl", "input_grad", dense, l2x);
    weei_gpu_pipeline("l1_wgrad", "matmul.wgsl", "weight_grad", wgrad, l1g);
    weei_gpu_pipeline("l1_bgrad", "reduce.wgsl", "column_sum", colsum, l1b);
    weei_gpu_pipeline("adam", "optimizer.wgsl", "adam", n_params, np);
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
    weei_gpu_dispatch("l1_forward", s1, 4, weei_gpu_groups((uint64_t)B * HID));
    weei_gpu_dispatch("l2_forward", s2, 4, weei_gpu_groups((uint64_t)B * OUT));
    weei_gpu_dispatch("xent", s3, 5, weei_gpu_groups(B));
    weei_gpu_dispatch("l2_wgrad", s4, 4, weei_gpu_groups(HID * OUT));
    weei_gpu_dispatch("l2_bgrad", s5, 4, weei_gpu_groups(OUT));
    weei_gpu_dispatch("l2_xgrad", s6, 5, weei_gpu_groups((uint64_t)B * HID));
    weei_gpu_dispatch("l1_wgrad", s7, 4, weei_gpu_groups(IN * HID));
    weei_gpu_dispatch("l1_bgrad", s8, 4, weei_gpu_groups(HID));
    weei_gpu_dispatch("adam", s9, 5, weei_gpu_groups(N_PARAMS));
    jw_arr_end();
    jw_key("stepReadback"); weei_gpu_readback("stats", (uint64_t)B * 8);
    jw_key("finalReadback"); weei_gpu_readback("weights", WEIGHT_BYTES);
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
    weei_gpu_adam_init(&G.adam, s.learning_rate);
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
    weei_gpu_adam_step(&G.adam, count, 1.0f / (float)count, G.step);
    G.start += count;
    G.pending = count;
    jw_obj_begin();
    jw_key("batch");
    jw_arr_begin();
    jw_obj_begin(); jw_key("buffer"); jw_str("x"); jw_key("data"); jw_region(G.x, count * IN * 4); jw_obj_end();
    jw_obj_begin(); jw_key("buffer"); jw_str("labels"); jw_key("data"); jw_region(G.labels, count * 4); jw_obj_end();
    jw_obj_begin(); jw_key("buffer"); jw_str("step"); jw_key("data"); jw_region(G.step, WEEI_GPU_STEP_WORDS * 4); jw_obj_end();
    jw_arr_end();
    jw_obj_end();
}

static int gpu_next(const wj_doc *in) {
    if (!G.active) return weei_fail("gpuNext called without gpuBegin");
    weei_region r[1];
    int count = weei_gpu_read_regions(in, r, 1);
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
    int count = weei_gpu_read_regions(in, r, 1);
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
