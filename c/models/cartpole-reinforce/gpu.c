/* cartpole-reinforce's GPU backend, the hybrid mode of docs/gpu.md: the
 * episodes are played here in the WASM, on the CPU, exactly as model_train
 * plays them; each group's REINFORCE update (forward, return-weighted
 * softmax gradient, backward, Adam) runs on the device, and the updated
 * weights come back with every step (stepReadback) for the next group's
 * episodes. gpuBegin emits the program, gpuNext reads the previous update's
 * weights, plays the next group and uploads its steps, gpuEnd answers like
 * train. */
#include "reinforce.h"

static struct {
    int active, pending;
    weei_experience e;
    uint32_t step_limit, steps, done;
    double return_sum;
    rf_workspace w;
    uint32_t *act;  /* the group's actions as u32 (the kernel's labels) */
    uint32_t step[WEEI_GPU_STEP_WORDS];
    weei_gpu_adam adam;
} G;

static void end_session(void) {
    if (G.active) rf_ws_free(&G.w);
    weei_mfree(G.act);
    weei_memzero(&G, sizeof G);
}

static void write_program(uint32_t rows) {
    static const char *const dense[] = { "IN", "OUT", "W_OFF", "B_OFF", "ACT", 0 };
    static const char *const wgrad[] = { "IN", "OUT", "W_OFF", 0 };
    static const char *const colsum[] = { "COLS", "OUT_OFF", 0 };
    static const char *const classes[] = { "CLASSES", 0 };
    static const char *const n_params[] = { "N", 0 };
    /* ACT 2: tanh forward; on input_grad, the tanh derivative 1 - h^2. */
    const uint32_t l1[] = { OBS, HID, 0, N_W1, 2 }, l2[] = { HID, ACT, N_W1 + N_B1, N_W1 + N_B1 + N_W2, 0 };
    const uint32_t l1g[] = { OBS, HID, 0 }, l2g[] = { HID, ACT, N_W1 + N_B1 };
    const uint32_t l2x[] = { HID, ACT, N_W1 + N_B1, 0, 2 };
    const uint32_t l1b[] = { HID, N_W1 }, l2b[] = { ACT, N_W1 + N_B1 + N_W2 };
    const uint32_t cls[] = { ACT }, np[] = { N_PARAMS };

    jw_key("format"); jw_str("weei-device-program-v1");
    jw_key("buffers");
    jw_arr_begin();
    weei_gpu_buffer("weights", WEIGHT_BYTES, "weights");
    weei_gpu_buffer("grad", WEIGHT_BYTES, "zeros");
    weei_gpu_buffer("adam_m", WEIGHT_BYTES, "zeros");
    weei_gpu_buffer("adam_v", WEIGHT_BYTES, "zeros");
    weei_gpu_buffer("obs", (uint64_t)rows * OBS * 4, "batch");
    weei_gpu_buffer("act", (uint64_t)rows * 4, "batch");
    weei_gpu_buffer("adv", (uint64_t)rows * 4, "batch");
    weei_gpu_buffer("step", WEEI_GPU_STEP_WORDS * 4, "batch");
    weei_gpu_buffer("h", (uint64_t)rows * HID * 4, "zeros");
    weei_gpu_buffer("logits", (uint64_t)rows * ACT * 4, "zeros");
    weei_gpu_buffer("dlogits", (uint64_t)rows * ACT * 4, "zeros");
    weei_gpu_buffer("dh", (uint64_t)rows * HID * 4, "zeros");
    jw_arr_end();

    jw_key("pipelines");
    jw_arr_begin();
    weei_gpu_pipeline("l1_forward", "matmul.wgsl", "forward", dense, l1);
    weei_gpu_pipeline("l2_forward", "matmul.wgsl", "forward", dense, l2);
    weei_gpu_pipeline("pg", "softmax_xent.wgsl", "weighted_backward", classes, cls);
    weei_gpu_pipeline("l2_wgrad", "matmul.wgsl", "weight_grad", wgrad, l2g);
    weei_gpu_pipeline("l2_bgrad", "reduce.wgsl", "column_sum", colsum, l2b);
    weei_gpu_pipeline("l2_xgrad", "matmul.wgsl", "input_grad", dense, l2x);
    weei_gpu_pipeline("l1_wgrad", "matmul.wgsl", "weight_grad", wgrad, l1g);
    weei_gpu_pipeline("l1_bgrad", "reduce.wgsl", "column_sum", colsum, l1b);
    weei_gpu_pipeline("adam", "optimizer.wgsl", "adam", n_params, np);
    jw_arr_end();

    /* policy_gradient's order: forward, weighted softmax gradient, backward per layer, Adam. */
    static const char *const s1[] = { "obs", "weights", "h", "step" };
    static const char *const s2[] = { "h", "weights", "logits", "step" };
    static const char *const s3[] = { "logits", "act", "dlogits", "step", 0, "adv" };
    static const char *const s4[] = { "h", "dlogits", "grad", "step" };
    static const char *const s5[] = { "dlogits", 0, "grad", "step" };
    static const char *const s6[] = { "dlogits", "weights", "dh", "step", "h" };
    static const char *const s7[] = { "obs", "dh", "grad", "step" };
    static const char *const s8[] = { "dh", 0, "grad", "step" };
    static const char *const s9[] = { "weights", "grad", "adam_m", "adam_v", "step" };
    jw_key("steps");
    jw_arr_begin();
    weei_gpu_dispatch("l1_forward", s1, 4, weei_gpu_groups((uint64_t)rows * HID));
    weei_gpu_dispatch("l2_forward", s2, 4, weei_gpu_groups((uint64_t)rows * ACT));
    weei_gpu_dispatch("pg", s3, 6, weei_gpu_groups(rows));
    weei_gpu_dispatch("l2_wgrad", s4, 4, weei_gpu_groups(HID * ACT));
    weei_gpu_dispatch("l2_bgrad", s5, 4, weei_gpu_groups(ACT));
    weei_gpu_dispatch("l2_xgrad", s6, 5, weei_gpu_groups((uint64_t)rows * HID));
    weei_gpu_dispatch("l1_wgrad", s7, 4, weei_gpu_groups(OBS * HID));
    weei_gpu_dispatch("l1_bgrad", s8, 4, weei_gpu_groups(HID));
    weei_gpu_dispatch("adam", s9, 5, weei_gpu_groups(N_PARAMS));
    jw_arr_end();
    jw_key("stepReadback"); weei_gpu_readback("weights", WEIGHT_BYTES);
    jw_key("finalReadback"); weei_gpu_readback("weights", WEIGHT_BYTES);
}

static int gpu_begin(const wj_doc *in) {
    if (!g_has_weights) return weei_fail("gpuBegin called before loadModel");
    weei_experience e;
    if (rf_read_units(in, &e, "gpuBegin") != 0) return -1;
    weei_settings s;
    if (weei_read_settings(in, &s, EPISODES_PER_UPDATE, DEFAULT_LR) != 0) return -1;
    uint32_t step_limit;
    if (rf_read_step_limit(in, &step_limit) != 0) return -1;
    if (rf_buffers() != 0) return -1;
    end_session();
    if (rf_ws_alloc(&G.w) != 0) return weei_fail("out of memory");
    G.act = weei_malloc((size_t)MAX_GROUP_STEPS * 4);
    G.active = 1;
    if (!G.act) { end_session(); return weei_fail("out of memory"); }
    G.e = e;
    G.step_limit = step_limit;
    weei_gpu_adam_init(&G.adam, s.learning_rate);
    weei_memcopy(g_out, g_loaded, WEIGHT_BYTES);  /* the weights the episodes play with */
    uint32_t group = e.unit_count < EPISODES_PER_UPDATE ? e.unit_count : EPISODES_PER_UPDATE;
    jw_obj_begin();
    jw_key("program");
    jw_obj_begin();
    write_program(group * CP_MAX_STEPS);
    jw_obj_end();
    jw_key("weights"); jw_region(g_loaded, WEIGHT_BYTES);
    jw_key("totalExamples"); jw_uint(e.unit_count);
    jw_obj_end();
    return 0;
}

/* Plays the next group with the current weights and uploads its n steps:
 * observations, actions, each step's weight and the Adam scalars. */
static void pack_group(void) {
    uint32_t n = rf_play_group(&G.w, g_out, &G.e, &G.done, &G.return_sum);
    rf_advantages(&G.w, n);
    for (uint32_t t = 0; t < n; t++) G.act[t] = G.w.act[t];
    weei_gpu_adam_step(&G.adam, n, 1.0f, G.step);
    G.pending = 1;
    jw_obj_begin();
    jw_key("batch");
    jw_arr_begin();
    jw_obj_begin(); jw_key("buffer"); jw_str("obs"); jw_key("data"); jw_region(G.w.obs, (uint64_t)n * OBS * 4); jw_obj_end();
    jw_obj_begin(); jw_key("buffer"); jw_str("act"); jw_key("data"); jw_region(G.act, (uint64_t)n * 4); jw_obj_end();
    jw_obj_begin(); jw_key("buffer"); jw_str("adv"); jw_key("data"); jw_region(G.w.adv, (uint64_t)n * 4); jw_obj_end();
    jw_obj_begin(); jw_key("buffer"); jw_str("step"); jw_key("data"); jw_region(G.step, WEEI_GPU_STEP_WORDS * 4); jw_obj_end();
    jw_arr_end();
    jw_obj_end();
}

static int finished(void) { return G.steps >= G.step_limit || G.done >= G.e.unit_count; }

static int gpu_next(const wj_doc *in) {
    if (!G.active) return weei_fail("gpuNext called without gpuBegin");
    weei_region r[1];
    int count = weei_gpu_read_regions(in, r, 1);
    if (count < 0) return -1;
    if (G.pending) {
        if (count != 1 || r[0].bytes != WEIGHT_BYTES) return weei_fail("gpuNext: expected the update's weights readback");
        weei_memcopy(g_out, r[0].data, WEIGHT_BYTES);
        for (uint32_t i = 0; i < N_PARAMS; i++)
            if (!weei_isfinite_f32(g_out[i])) { end_session(); return weei_fail("training diverged: a weight is not finite (lower the learning rate)"); }
        G.steps++;
        G.pending = 0;
    } else if (count != 0) {
        return weei_fail("gpuNext: no step ran, nothing to read back");
    }
    if (finished()) {
        jw_raw("{\"done\":true}");
        return 0;
    }
    pack_group();
    return 0;
}

static int gpu_end(const wj_doc *in) {
    if (!G.active) return weei_fail("gpuEnd called without gpuBegin");
    if (G.pending || !finished()) return weei_fail("gpuEnd called before gpuNext answered done");
    weei_region r[1];
    int count = weei_gpu_read_regions(in, r, 1);
    if (count < 0) return -1;
    if (count != 1 || r[0].bytes != WEIGHT_BYTES) return weei_fail("gpuEnd: expected the weights readback");
    weei_memcopy(g_out, r[0].data, WEIGHT_BYTES);
    for (uint32_t i = 0; i < N_PARAMS; i++)
        if (!weei_isfinite_f32(g_out[i])) { end_session(); return weei_fail("training diverged: a weight is not finite (lower the learning rate)"); }
    jw_obj_begin();
    jw_key("weights"); jw_region(g_out, WEIGHT_BYTES);
    jw_key("metrics");
    jw_obj_begin();
    jw_key("episodeReturn"); jw_num(G.return_sum / G.done);
    jw_obj_end();
    jw_key("completedUnits"); jw_uint(G.done);
    jw_key("optimizerSteps"); jw_uint(G.steps);
    jw_obj_end();
    end_session();
    return 0;
}

WEEI_EXPORT("gpuBegin") uint32_t cartpole_op_gpu_begin(uint32_t p, uint32_t n) { return weei_run_op(p, n, gpu_begin); }
WEEI_EXPORT("gpuNext") uint32_t cartpole_op_gpu_next(uint32_t p, uint32_t n) { return weei_run_op(p, n, gpu_next); }
WEEI_EXPORT("gpuEnd") uint32_t cartpole_op_gpu_end(uint32_t p, uint32_t n) { return weei_run_op(p, n, gpu_end); }
