/* byte-transformer's GPU backend (docs/gpu.md): gpuBegin emits a
 * weei-device-program-v1 program over wgsl/ (transformer.wgsl for the
 * embedding, layer norms, attention, dense layers through a transposed or
 * bias-free weight, their weight and bias gradients and the embedding
 * gradient; softmax_xent.wgsl, reduce.wgsl and optimizer.wgsl's adam for
 * the rest), the same operations in the same order as net.c's tfm_loss and
 * model_train. gpuNext packs each minibatch (the same shuffled order, the
 * same Adam step sizes) and folds the step's per-position losses into the
 * metrics in train's float64 order; gpuEnd answers like train.
 *
 * A minibatch of up to MICRO_BATCH records (8, the default) runs whole on
 * the device. A larger one is summed from micro-batches as model_train
 * does: the program runs the forward and backward pass once per
 * micro-batch slot (tokens, targets and the slot's scalars copied in from
 * the whole minibatch's uploads) into a micro-batch gradient, and
 * micro_sum adds it, times its share, to the minibatch's; then Adam. The
 * device's buffers stay those of one micro-batch. Up to MAX_MICRO slots
 * fit the 4096-step limit; gpuBegin refuses a larger batchSize by name. */
#include "transformer.h"

#define D TFM_D
#define T TFM_T
#define F TFM_F
#define H TFM_H
#define V TFM_V
#define L TFM_L
/* + step[8]: the current layer's base offset; step[9], step[10]: a micro-batch's share and mode (micro_sum) */
#define STEP_WORDS (WEEI_GPU_STEP_WORDS + 3)
#define MAX_MICRO 40 /* micro-batch slots: each is about 96 steps of the 4096 a program may have */
#define SLOT_WORDS 4 /* a slot's scalars: rows, gradient scale (float bits), share (float bits), mode */
/* Invocations of transformer.wgsl's tiled kernels: dense and dense_relu_backward compute blocks of
 * 4 rows x 4 columns of `outputs` (rows x columns), weight_bias_grad blocks of 4 x 4 of dW then 4 of db. */
#define DENSE_BLOCKS(outputs) ((uint64_t)(outputs) / 16)
#define WB_BLOCKS(in, out) ((uint64_t)(in) * (out) / 16 + (out) / 4)

static struct {
    int active;
    uint32_t n, batch, micro, slots, epochs, epoch, start, step_limit, steps, pending;
    uint8_t *records; /* the chunk's records, copied: input regions die with gpuBegin */
    uint32_t *order, *tokens, *targets;
    uint32_t slot[MAX_MICRO * SLOT_WORDS];
    uint32_t step[WEEI_GPU_STEP_WORDS];
    uint32_t bases[L + 1]; /* each layer's offset in the weight vector, then 0 */
    weei_rng rng;
    weei_gpu_adam adam;
    double loss_sum;
    uint32_t correct;
    uint64_t processed, total;
} G;

static void end_session(void) {
    weei_mfree(G.records); weei_mfree(G.order); weei_mfree(G.tokens); weei_mfree(G.targets);
    weei_memzero(&G, sizeof G);
}

static const char *const NAMES_LN[] = { "D", "NROWS", "G_OFF", 0 };
static const char *const NAMES_DENSE[] = { "K", "C", "W_OFF", "B_OFF", "HAS_BIAS", "TRANS", "ACT", 0 };
static const char *const NAMES_WB[] = { "IN", "OUT", "W_OFF", "B_OFF", "HAS_BIAS", 0 };
static const char *const NAMES_ATTN[] = { "D", "T", "H", "HD", "SCALE_BITS", 0 };

static void dense_pipeline(const char *id, const char *entry, uint32_t k, uint32_t c, uint32_t w_off, uint32_t b_off,
                           uint32_t has_bias, uint32_t trans, uint32_t act) {
    const uint32_t v[] = { k, c, w_off, b_off, has_bias, trans, act };
    weei_gpu_pipeline(id, "transformer.wgsl", entry, NAMES_DENSE, v);
}

static void ln_pipeline(const char *id, const char *entry, uint32_t rows, uint32_t g_off) {
    const uint32_t v[] = { D, rows, g_off };
    weei_gpu_pipeline(id, "transformer.wgsl", entry, NAMES_LN, v);
}

static void wb_pipeline(const char *id, uint32_t in, uint32_t out, uint32_t w_off, uint32_t b_off, uint32_t has_bias) {
    const uint32_t v[] = { in, out, w_off, b_off, has_bias };
    weei_gpu_pipeline(id, "transformer.wgsl", "weight_bias_grad", NAMES_WB, v);
}

static void pipelines(uint32_t rows, uint32_t slots) {
    float scale = 1.0f / __builtin_sqrtf((float)TFM_HD); /* net.c's attention scale, to the bit */
    const uint32_t attn[] = { D, T, H, TFM_HD, weei_f32_bits(scale) };
    static const char *const embed_names[] = { "D", "T", "P_OFF", 0 };
    const uint32_t embed[] = { D, T, TFM_OFF_POS };
    static const char *const dt_names[] = { "D", 0 };
    const uint32_t dt[] = { D };
    static const char *const eg_names[] = { "D", "T", "V", 0 };
    const uint32_t eg[] = { D, T, V };
    static const char *const classes[] = { "CLASSES", 0 };
    const uint32_t cls[] = { V };
    static const char *const colsum[] = { "COLS", "OUT_OFF", 0 };
    const uint32_t bout[] = { V, TFM_OFF_BOUT };
    static const char *const n_params[] = { "N", 0 };
    const uint32_t np[] = { TFM_N_PARAMS };

    jw_key("pipelines");
    jw_arr_begin();
    weei_gpu_pipeline("embed", "transformer.wgsl", "embed", embed_names, embed);
    weei_gpu_pipeline("add", "transformer.wgsl", "add", dt_names, dt);
    ln_pipeline("ln1", "ln_forward", rows, LY_LN1G);
    ln_pipeline("ln2", "ln_forward", rows, LY_LN2G);
    ln_pipeline("lnf", "ln_forward", rows, TFM_OFF_LNF);
    dense_pipeline("qkv", "dense", D, 3 * D, LY_WQKV, LY_BQKV, 1, 0, 0);
    weei_gpu_pipeline("attn", "transformer.wgsl", "attn_forward", NAMES_ATTN, attn);
    dense_pipeline("wo", "dense", D, D, LY_WO, LY_BO, 1, 0, 0);
    dense_pipeline("w1", "dense", D, F, LY_W1, LY_B1, 1, 0, 1);
    dense_pipeline("w2", "dense", F, D, LY_W2, LY_B2, 1, 0, 0);
    dense_pipeline("logits", "dense", D, V, 0, TFM_OFF_BOUT, 1, 1, 0);
    weei_gpu_pipeline("xent", "softmax_xent.wgsl", "forward_backward", classes, cls);
    wb_pipeline("det", D, V, 0, 0, 0); /* into the det buffer; step[8] is 0 there */
    weei_gpu_pipeline("bout", "reduce.wgsl", "column_sum", colsum, bout);
    dense_pipeline("dyf", "dense", V, D, 0, 0, 0, 0, 0);
    ln_pipeline("lnf_back", "ln_backward", rows, TFM_OFF_LNF);
    ln_pipeline("lnf_grad", "ln_param_grad", rows, TFM_OFF_LNF);
    wb_pipeline("w2_grad", F, D, LY_W2, LY_B2, 1);
    dense_pipeline("w2_dx", "dense_relu_backward", D, F, LY_W2, 0, 0, 1, 0);
    wb_pipeline("w1_grad", D, F, LY_W1, LY_B1, 1);
    dense_pipeline("w1_dx", "dense", F, D, LY_W1, 0, 0, 1, 0);
    ln_pipeline("ln2_back", "ln_backward", rows, LY_LN2G);
    ln_pipeline("ln2_grad", "ln_param_grad", rows, LY_LN2G);
    wb_pipeline("wo_grad", D, D, LY_WO, LY_BO, 1);
    dense_pipeline("wo_dx", "dense", D, D, LY_WO, 0, 0, 1, 0);
    weei_gpu_pipeline("score_grad", "transformer.wgsl", "attn_score_grad", NAMES_ATTN, attn);
    weei_gpu_pipeline("qk_grad", "transformer.wgsl", "attn_qk_grad", NAMES_ATTN, attn);
    weei_gpu_pipeline("v_grad", "transformer.wgsl", "attn_v_grad", NAMES_ATTN, attn);
    wb_pipeline("qkv_grad", D, 3 * D, LY_WQKV, LY_BQKV, 1);
    dense_pipeline("qkv_dx", "dense", 3 * D, D, LY_WQKV, 0, 0, 1, 0);
    ln_pipeline("ln1_back", "ln_backward", rows, LY_LN1G);
    ln_pipeline("ln1_grad", "ln_param_grad", rows, LY_LN1G);
    weei_gpu_pipeline("embed_grad", "transformer.wgsl", "embed_grad", eg_names, eg);
    weei_gpu_pipeline("adam", "optimizer.wgsl", "adam", n_params, np);
    if (slots) {
        static const char *const sum_names[] = { "N_PARAMS", 0 };
        weei_gpu_pipeline("micro_sum", "transformer.wgsl", "micro_sum", sum_names, np);
    }
    jw_arr_end();
}

/* A per-layer buffer's id: name + layer digit. */
static const char *lid(char *buf, const char *name, uint32_t l) {
    uint32_t k = 0;
    while (name[k]) { buf[k] = name[k]; k++; }
    buf[k] = (char)('0' + l);
    buf[k + 1] = 0;
    return buf;
}

static void buffers_of(uint32_t B, uint32_t slots) {
    const uint64_t n = (uint64_t)B * T, act = n * D * 4, ln = (n * D + n) * 4, att = (uint64_t)B * H * T * T * 4;
    char id[16];
    jw_key("buffers");
    jw_arr_begin();
    weei_gpu_buffer("weights", TFM_WEIGHT_BYTES, "weights");
    weei_gpu_buffer("grad", TFM_WEIGHT_BYTES, "zeros");
    weei_gpu_buffer("adam_m", TFM_WEIGHT_BYTES, "zeros");
    weei_gpu_buffer("adam_v", TFM_WEIGHT_BYTES, "zeros");
    weei_gpu_buffer("tokens", n * 4, "batch");
    weei_gpu_buffer("targets", n * 4, "batch");
    weei_gpu_buffer("step", STEP_WORDS * 4, "batch");
    weei_gpu_buffer("bases", (L + 1) * 4, "batch");
    weei_gpu_buffer("stats", n * 8, "zeros");
    for (uint32_t l = 0; l <= L; l++) weei_gpu_buffer(lid(id, "x", l), act, "zeros");
    for (uint32_t l = 0; l < L; l++) {
        weei_gpu_buffer(lid(id, "xh1_", l), ln, "zeros");
        weei_gpu_buffer(lid(id, "y1_", l), act, "zeros");
        weei_gpu_buffer(lid(id, "qkv", l), 3 * act, "zeros");
        weei_gpu_buffer(lid(id, "prob", l), att, "zeros");
        weei_gpu_buffer(lid(id, "att", l), act, "zeros");
        weei_gpu_buffer(lid(id, "xm", l), act, "zeros");
        weei_gpu_buffer(lid(id, "xh2_", l), ln, "zeros");
        weei_gpu_buffer(lid(id, "y2_", l), act, "zeros");
        weei_gpu_buffer(lid(id, "h", l), n * F * 4, "zeros");
    }
    weei_gpu_buffer("xhf", ln, "zeros");
    weei_gpu_buffer("yf", act, "zeros");
    weei_gpu_buffer("logits", n * V * 4, "zeros");
    weei_gpu_buffer("dlogits", n * V * 4, "zeros");
    weei_gpu_buffer("det", (uint64_t)D * V * 4, "zeros");
    weei_gpu_buffer("dx", act, "zeros");
    weei_gpu_buffer("dy", act, "zeros");
    weei_gpu_buffer("datt", act, "zeros");
    weei_gpu_buffer("dqkv", 3 * act, "zeros");
    weei_gpu_buffer("dh", n * F * 4, "zeros");
    weei_gpu_buffer("gsc", att, "zeros");
    if (slots) {
        weei_gpu_buffer("tokens_all", slots * n * 4, "batch");
        weei_gpu_buffer("targets_all", slots * n * 4, "batch");
        weei_gpu_buffer("slots", (uint64_t)slots * SLOT_WORDS * 4, "batch");
        weei_gpu_buffer("part", TFM_WEIGHT_BYTES, "zeros");
        weei_gpu_buffer("stats_all", slots * n * 8, "zeros");
    }
    jw_arr_end();
}

/* step[8] = bases[k]: the layer base the next dispatches read. */
static void copy(const char *from, uint64_t from_offset, const char *to, uint64_t to_offset, uint64_t bytes) {
    jw_obj_begin();
    jw_key("op"); jw_str("copy");
    jw_key("from"); jw_str(from);
    jw_key("fromOffset"); jw_uint(from_offset);
    jw_key("to"); jw_str(to);
    jw_key("toOffset"); jw_uint(to_offset);
    jw_key("bytes"); jw_uint(bytes);
    jw_obj_end();
}

static void set_base(uint32_t k) { copy("bases", (uint64_t)k * 4, "step", WEEI_GPU_STEP_WORDS * 4, 4); }

static void clear(const char *id, uint64_t bytes) {
    jw_obj_begin();
    jw_key("op"); jw_str("clear");
    jw_key("buffer"); jw_str(id);
    jw_key("offset"); jw_uint(0);
    jw_key("bytes"); jw_uint(bytes);
    jw_obj_end();
}

/* A dispatch of up to 8 bindings given as (binding, buffer) pairs, NULL-padded by number. */
static void run(const char *pipeline, uint64_t invocations, const char *b0, const char *b1, const char *b2,
                const char *b4, const char *b5, const char *b6, const char *b7) {
    const char *const b[8] = { b0, b1, b2, "step", b4, b5, b6, b7 };
    int count = 8;
    while (count > 0 && !b[count - 1]) count--;
    weei_gpu_dispatch(pipeline, b, count, weei_gpu_groups(invocations));
}

/* tfm_loss of B sequences: the forward pass, the loss and the backward pass, the gradient into g. */
static void pass_of(uint32_t B, const char *g) {
    const uint64_t n = (uint64_t)B * T, nh = (uint64_t)B * H * T;
    char x[8], x1[8], xh1[8], y1[8], qkv[8], prob[8], att[8], xm[8], xh2[8], y2[8], h[8];
    /* forward */
    run("embed", n * D, 0, "weights", "x0", 0, "tokens", 0, 0);
    for (uint32_t l = 0; l < L; l++) {
        lid(x, "x", l); lid(x1, "x", l + 1); lid(xh1, "xh1_", l); lid(y1, "y1_", l); lid(qkv, "qkv", l);
        lid(prob, "prob", l); lid(att, "att", l); lid(xm, "xm", l); lid(xh2, "xh2_", l); lid(y2, "y2_", l);
        lid(h, "h", l);
        set_base(l);
        run("ln1", n, x, "weights", y1, 0, 0, xh1, 0);
        run("qkv", DENSE_BLOCKS(n * 3 * D), y1, "weights", qkv, 0, 0, 0, 0);
        run("attn", nh, qkv, 0, att, 0, 0, prob, 0);
        run("wo", DENSE_BLOCKS(n * D), att, "weights", xm, 0, 0, 0, 0);
        run("add", n * D, x, 0, xm, 0, 0, 0, 0);
        run("ln2", n, xm, "weights", y2, 0, 0, xh2, 0);
        run("w1", DENSE_BLOCKS(n * F), y2, "weights", h, 0, 0, 0, 0);
        run("w2", DENSE_BLOCKS(n * D), h, "weights", x1, 0, 0, 0, 0);
        run("add", n * D, xm, 0, x1, 0, 0, 0, 0);
    }
    set_base(L);
    lid(x, "x", L);
    run("lnf", n, x, "weights", "yf", 0, 0, "xhf", 0);
    run("logits", DENSE_BLOCKS(n * V), "yf", "weights", "logits", 0, 0, 0, 0);
    {
        const char *const b[] = { "logits", "targets", "dlogits", "step", "stats" };
        weei_gpu_dispatch("xent", b, 5, weei_gpu_groups(n));
    }
    /* backward */
    {
        run("det", (uint64_t)D * V / 16, "yf", 0, "det", 0, 0, 0, "dlogits");
        const char *const c[] = { "dlogits", 0, g, "step" };
        weei_gpu_dispatch("bout", c, 4, weei_gpu_groups(V));
    }
    run("dyf", DENSE_BLOCKS(n * D), "dlogits", "weights", "dy", 0, 0, 0, 0);
    clear("dx", n * D * 4);
    run("lnf_back", n, "dy", "weights", "dx", "xhf", 0, 0, 0);
    run("lnf_grad", D, "dy", 0, g, "xhf", 0, 0, 0);
    for (uint32_t l = L; l-- > 0;) {
        lid(xh1, "xh1_", l); lid(y1, "y1_", l); lid(qkv, "qkv", l); lid(prob, "prob", l); lid(att, "att", l);
        lid(xh2, "xh2_", l); lid(y2, "y2_", l); lid(h, "h", l);
        set_base(l);
        run("w2_grad", WB_BLOCKS(F, D), h, 0, g, 0, 0, 0, "dx");
        run("w2_dx", DENSE_BLOCKS(n * F), "dx", "weights", "dh", h, 0, 0, 0);
        run("w1_grad", WB_BLOCKS(D, F), y2, 0, g, 0, 0, 0, "dh");
        run("w1_dx", DENSE_BLOCKS(n * D), "dh", "weights", "dy", 0, 0, 0, 0);
        run("ln2_back", n, "dy", "weights", "dx", xh2, 0, 0, 0);
        run("ln2_grad", D, "dy", 0, g, xh2, 0, 0, 0);
        run("wo_grad", WB_BLOCKS(D, D), att, 0, g, 0, 0, 0, "dx");
        run("wo_dx", DENSE_BLOCKS(n * D), "dx", "weights", "datt", 0, 0, 0, 0);
        run("score_grad", nh, qkv, 0, "gsc", prob, 0, 0, "datt");
        run("qk_grad", nh, qkv, 0, "dqkv", "gsc", 0, 0, 0);
        run("v_grad", nh, 0, 0, "dqkv", prob, 0, 0, "datt");
        run("qkv_grad", WB_BLOCKS(D, 3 * D), y1, 0, g, 0, 0, 0, "dqkv");
        run("qkv_dx", DENSE_BLOCKS(n * D), "dqkv", "weights", "dy", 0, 0, 0, 0);
        run("ln1_back", n, "dy", "weights", "dx", xh1, 0, 0, 0);
        run("ln1_grad", D, "dy", 0, g, xh1, 0, 0, 0);
    }
    run("embed_grad", (uint64_t)(V + T) * D / 4, "dx", 0, g, "det", "tokens", 0, 0);
}

/* One minibatch: B sequences in one pass or, with slots > 0, `slots` micro-batch passes of B. */
static void steps_of(uint32_t B, uint32_t slots) {
    jw_key("steps");
    jw_arr_begin();
    if (!slots) {
        pass_of(B, "grad");
    } else {
        const uint64_t ids = (uint64_t)B * T * 4;
        clear("grad", TFM_WEIGHT_BYTES);
        for (uint32_t m = 0; m < slots; m++) {
            copy("tokens_all", m * ids, "tokens", 0, ids);
            copy("targets_all", m * ids, "targets", 0, ids);
            copy("slots", (uint64_t)m * SLOT_WORDS * 4, "step", 0, 8);
            copy("slots", (uint64_t)m * SLOT_WORDS * 4 + 8, "step", (WEEI_GPU_STEP_WORDS + 1) * 4, 8);
            pass_of(B, "part");
            copy("stats", 0, "stats_all", m * ids * 2, ids * 2);
            run("micro_sum", TFM_N_PARAMS, "part", 0, "grad", 0, 0, 0, 0);
        }
    }
    {
        const char *const b[] = { "weights", "grad", "adam_m", "adam_v", "step" };
        weei_gpu_dispatch("adam", b, 5, weei_gpu_groups(TFM_N_PARAMS));
    }
    jw_arr_end();
}

static void write_program(uint32_t B, uint32_t slots) {
    jw_key("format"); jw_str("weei-device-program-v1");
    buffers_of(B, slots);
    pipelines(B * T, slots);
    steps_of(B, slots);
    jw_key("stepReadback");
    if (slots) weei_gpu_readback("stats_all", (uint64_t)slots * B * T * 8);
    else weei_gpu_readback("stats", (uint64_t)B * T * 8);
    jw_key("finalReadback"); weei_gpu_readback("weights", TFM_WEIGHT_BYTES);
}

static void shuffle_epoch(void) {
    for (uint32_t i = 0; i < G.n; i++) G.order[i] = i;
    weei_shuffle_u32(&G.rng, G.order, G.n);
}

static int gpu_begin(const wj_doc *in) {
    if (!g_has_weights) return weei_fail("gpuBegin called before loadModel");
    weei_region d;
    int64_t n64 = tfm_read_data(in, &d, "gpuBegin");
    if (n64 < 0) return -1;
    weei_settings s;
    if (weei_read_settings(in, &s, DEFAULT_BATCH, DEFAULT_LR) != 0) return -1;
    uint64_t seed;
    if (weei_read_seed(in, &seed) != 0) return -1;
    uint32_t step_limit;
    if (tfm_read_step_limit(in, &step_limit) != 0) return -1;
    end_session();
    G.n = (uint32_t)n64;
    G.batch = s.batch_size < G.n ? s.batch_size : G.n;
    if (G.batch > MICRO_BATCH * MAX_MICRO) {
        end_session();
        return weei_fail("gpuBegin: the GPU program trains minibatches of at most 320 records (a larger batchSize "
                         "trains on the CPU)");
    }
    G.micro = G.batch < MICRO_BATCH ? G.batch : MICRO_BATCH;
    G.slots = G.batch > MICRO_BATCH ? (G.batch + MICRO_BATCH - 1) / MICRO_BATCH : 0;
    G.epochs = s.local_epochs;
    G.step_limit = step_limit;
    weei_gpu_adam_init(&G.adam, s.learning_rate);
    G.total = (uint64_t)G.n * s.local_epochs;
    G.records = weei_malloc((size_t)G.n * TFM_RECORD);
    G.order = weei_malloc((size_t)G.n * 4);
    G.tokens = weei_malloc((size_t)G.batch * T * 4);
    G.targets = weei_malloc((size_t)G.batch * T * 4);
    if (!G.records || !G.order || !G.tokens || !G.targets) { end_session(); return weei_fail("out of memory"); }
    weei_memcopy(G.records, d.data + TFM_HEADER, (size_t)G.n * TFM_RECORD);
    for (uint32_t l = 0; l < L; l++) G.bases[l] = TFM_OFF_LAYERS + l * LY_SIZE;
    G.bases[L] = 0;
    weei_rng_seed(&G.rng, seed);
    shuffle_epoch();
    G.active = 1;
    jw_obj_begin();
    jw_key("program");
    jw_obj_begin();
    write_program(G.micro, G.slots);
    jw_obj_end();
    jw_key("weights"); jw_region(g_loaded, TFM_WEIGHT_BYTES);
    jw_key("totalExamples"); jw_uint(G.total);
    jw_obj_end();
    return 0;
}

/* Folds the finished step's stats (loss, hit per position) into the metrics
 * in model_train's float64 order: weei_softmax_xent's mean times the count. */
static int take_stats(const weei_region *r) {
    uint32_t count = G.pending;
    /* model_train: a minibatch of up to a micro-batch in one tfm_loss, a larger one micro-batch by
     * micro-batch, each slot's stats at its own place in stats_all */
    uint32_t parts = count <= G.micro ? 1 : (count + G.micro - 1) / G.micro;
    for (uint32_t m = 0; m < parts; m++) {
        uint32_t c = parts == 1 ? count : (count - m * G.micro < G.micro ? count - m * G.micro : G.micro);
        uint32_t rows = c * T;
        const uint8_t *stats = r->data + (size_t)m * G.micro * T * 8;
        if (r->bytes < ((uint64_t)m * G.micro * T + rows) * 8) return weei_fail("gpuNext: the stats readback is too short");
        double total = 0.0;
        uint32_t hits = 0;
        for (uint32_t k = 0; k < rows; k++) {
            float loss, hit;
            weei_memcopy(&loss, stats + (size_t)k * 8, 4);
            weei_memcopy(&hit, stats + (size_t)k * 8 + 4, 4);
            total += (double)loss;
            if (hit != 0.0f) hits++;
        }
        G.loss_sum += total / rows * c;
        G.correct += hits;
    }
    G.steps++;
    G.processed += count;
    G.pending = 0;
    static const char *const ids[2] = { "loss", "accuracy" };
    double mv[2] = { G.loss_sum / (double)G.processed, (double)G.correct / ((double)G.processed * T) };
    weei_progress(G.processed, G.total, ids, mv, 2);
    return 0;
}

static void upload(const char *id, const void *data, uint64_t bytes) {
    jw_obj_begin(); jw_key("buffer"); jw_str(id); jw_key("data"); jw_region(data, bytes); jw_obj_end();
}

/* Packs the next minibatch (tfm_gather's tokens and targets) and its step scalars. */
static void pack_batch(void) {
    uint32_t count = G.n - G.start < G.batch ? G.n - G.start : G.batch;
    for (uint32_t b = 0; b < count; b++) {
        const uint8_t *rec = G.records + (size_t)G.order[G.start + b] * TFM_RECORD;
        for (uint32_t t = 0; t < T; t++) {
            G.tokens[b * T + t] = rec[t];
            G.targets[b * T + t] = rec[t + 1];
        }
    }
    uint32_t rows = count * T;
    weei_gpu_adam_step(&G.adam, rows, 1.0f / (float)rows, G.step);
    G.start += count;
    G.pending = count;
    if (G.slots) {
        /* model_train's split: one tfm_loss (mode 1) when the minibatch fits a micro-batch, else
         * micro-batches of G.micro weighed by their share c / count (mode 2); the rest unused (0). */
        uint32_t parts = count <= G.micro ? 1 : (count + G.micro - 1) / G.micro;
        weei_memzero(G.slot, sizeof G.slot);
        for (uint32_t m = 0; m < parts; m++) {
            uint32_t c = parts == 1 ? count : (count - m * G.micro < G.micro ? count - m * G.micro : G.micro);
            uint32_t *w = G.slot + m * SLOT_WORDS;
            w[0] = c * T;
            w[1] = weei_f32_bits(1.0f / (float)(c * T));
            w[2] = weei_f32_bits((float)c / (float)count);
            w[3] = parts == 1 ? 1 : 2;
        }
    }
    jw_obj_begin();
    jw_key("batch");
    jw_arr_begin();
    upload(G.slots ? "tokens_all" : "tokens", G.tokens, (uint64_t)rows * 4);
    upload(G.slots ? "targets_all" : "targets", G.targets, (uint64_t)rows * 4);
    if (G.slots) upload("slots", G.slot, (uint64_t)G.slots * SLOT_WORDS * 4);
    upload("step", G.step, WEEI_GPU_STEP_WORDS * 4);
    upload("bases", G.bases, (L + 1) * 4);
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
    if (count != 1 || r[0].bytes != TFM_WEIGHT_BYTES) return weei_fail("gpuEnd: expected the weights readback");
    if (tfm_buffers() != 0) return -1;
    weei_memcopy(g_out, r[0].data, TFM_WEIGHT_BYTES);
    for (uint32_t i = 0; i < TFM_N_PARAMS; i++)
        if (!weei_isfinite_f32(g_out[i])) { end_session(); return weei_fail("training diverged: a weight is not finite (lower the learning rate)"); }
    jw_obj_begin();
    jw_key("weights"); jw_region(g_out, TFM_WEIGHT_BYTES);
    jw_key("metrics");
    jw_obj_begin();
    jw_key("loss"); jw_num(G.loss_sum / (double)G.processed);
    jw_key("accuracy"); jw_num((double)G.correct / ((double)G.processed * T));
    jw_obj_end();
    jw_key("uniqueExamples"); jw_uint(G.processed < G.n ? G.processed : G.n);
    jw_key("optimizerSteps"); jw_uint(G.steps);
    jw_obj_end();
    end_session();
    return 0;
}

WEEI_EXPORT("gpuBegin") uint32_t tfm_op_gpu_begin(uint32_t p, uint32_t n) { return weei_run_op(p, n, gpu_begin); }
WEEI_EXPORT("gpuNext") uint32_t tfm_op_gpu_next(uint32_t p, uint32_t n) { return weei_run_op(p, n, gpu_next); }
WEEI_EXPORT("gpuEnd") uint32_t tfm_op_gpu_end(uint32_t p, uint32_t n) { return weei_run_op(p, n, gpu_end); }
