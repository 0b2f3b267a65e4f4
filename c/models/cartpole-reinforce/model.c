/* cartpole-reinforce: the spec's reference experience model.
 *
 * Softmax policy 4 -> 16 tanh -> 2; weights (float32-le, 114 values):
 * W1[4][16], b1[16], W2[16][2], b2[2]. REINFORCE: an assignment of
 * unitCount episodes is played in groups of 16 (the last group may be
 * smaller); after each group one Adam step on the policy-gradient loss
 * -mean_t(G^_t log pi(a_t | s_t)), where G^ are the discounted returns
 * (gamma 0.99) normalised over the group's steps. Adam moments start fresh
 * each train call. settings.batchSize and settings.localEpochs are not used
 * (the group size is part of the algorithm); settings.learningRate is.
 *
 * An optional stepLimit stops after that many updates (the GPU admission
 * gate's first update); the result then counts the episodes played.
 * The GPU backend (gpu.c) plays the same episodes and leaves the updates to
 * the device: the hybrid mode of docs/gpu.md.
 *
 * Episode k of an assignment (global unit index unitStart + k) draws its
 * start state and action samples from its own xoshiro256** stream seeded by
 * (seed, unitStart + k): the same seed and weights give the same episodes.
 */
#include "reinforce.h"

float *g_loaded;  /* weights of the last loadModel */
int g_has_weights;
float *g_out;     /* output region of train / createInitialWeights */

/* Both buffers live in the heap, where every region handed to the host must
 * be (the native benchmark build addresses only its heap arena). */
int rf_buffers(void) {
    if (!g_loaded) g_loaded = weei_malloc(WEIGHT_BYTES);
    if (!g_out) g_out = weei_malloc(WEIGHT_BYTES);
    return g_loaded && g_out ? 0 : weei_fail("out of memory");
}

int model_get_info(const wj_doc *in) {
    (void)in;
    jw_raw("{\"id\":\"cartpole-reinforce\",\"version\":\"1.0.0\",\"name\":\"CartPole policy (REINFORCE)\","
           "\"abiVersion\":1,\"weightFormat\":\"float32-le\",\"maxWorkers\":4,\"dataFormats\":[],"
           "\"metrics\":[{\"id\":\"episodeReturn\",\"label\":\"Episode return\",\"direction\":\"maximize\"}],"
           "\"capabilities\":{\"evaluation\":true},"
           "\"workSource\":{\"kind\":\"experience\",\"inputs\":\"none\","
           "\"unit\":{\"id\":\"episode\",\"label\":\"Episodes\"},"
           "\"unitsPerAssignment\":{\"default\":32,\"minimum\":1,\"maximum\":4096},"
           "\"evaluationUnits\":32},"
           "\"auxiliaryWeights\":[]}");
    return 0;
}

int model_create_initial_weights(const wj_doc *in, uint64_t seed) {
    (void)in;
    if (rf_buffers() != 0) return -1;
    weei_rng r;
    weei_rng_seed(&r, seed);
    weei_init_dense(&r, g_out, g_out + N_W1, OBS, HID);
    weei_init_dense(&r, g_out + N_W1 + N_B1, g_out + N_W1 + N_B1 + N_W2, HID, ACT);
    jw_obj_begin();
    jw_key("weights"); jw_region(g_out, WEIGHT_BYTES);
    jw_obj_end();
    return 0;
}

int model_load(const wj_doc *in, const weei_region *w) {
    (void)in;
    if (w->bytes != WEIGHT_BYTES) {
        weei_msg m = { {0}, 0 };
        weei_msg_str(&m, "weights must be 456 bytes (114 float32), got ");
        weei_msg_int(&m, w->bytes);
        return weei_fail(m.buf);
    }
    if (rf_buffers() != 0) return -1;
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
    if (in->toks[slots].count != 0) return weei_fail("cartpole-reinforce declares no auxiliary weights");
    jw_raw("{\"ok\":true}");
    return 0;
}

int model_describe_chunk(const wj_doc *in, const char *format, const weei_region *data) {
    (void)in; (void)format; (void)data;
    return weei_fail("cartpole-reinforce is an experience model: it reads no dataset files");
}

static void episode_rng(weei_rng *r, uint64_t seed, uint64_t unit) {
    uint64_t mix = unit;
    weei_rng_seed(r, seed ^ weei_splitmix64(&mix));
}

/* Action probabilities for one observation (forward pass, batch 1). */
static void policy(const float *p, const float obs[OBS], float probs[ACT]) {
    float h[HID], logits[ACT];
    weei_dense_forward(obs, 1, OBS, HID, p, p + N_W1, h);
    weei_tanh(h, HID);
    weei_dense_forward(h, 1, HID, ACT, p + N_W1 + N_B1, p + N_W1 + N_B1 + N_W2, logits);
    weei_softmax(logits, ACT, probs);
}

/* One episode; with obs/actions non-NULL records its steps there. Returns
 * the number of steps (= the return: reward 1 per step, at most 500). */
static uint32_t play(const float *p, weei_rng *r, int greedy, float *obs_out, uint8_t *act_out) {
    cp_state s;
    cp_reset(&s, r);
    uint32_t t = 0;
    while (t < CP_MAX_STEPS) {
        float obs[OBS], probs[ACT];
        cp_observe(&s, obs);
        policy(p, obs, probs);
        int a;
        if (greedy) a = probs[1] > probs[0] ? 1 : 0;
        else a = weei_rng_float(r) < probs[0] ? 0 : 1;
        if (obs_out) {
            weei_memcopy(obs_out + (size_t)t * OBS, obs, sizeof obs);
            act_out[t] = (uint8_t)a;
        }
        t++;
        if (cp_step(&s, a)) break;
    }
    return t;
}

void rf_ws_free(rf_workspace *w) {
    weei_mfree(w->obs); weei_mfree(w->ret); weei_mfree(w->adv); weei_mfree(w->h); weei_mfree(w->logits);
    weei_mfree(w->dlogits); weei_mfree(w->dh); weei_mfree(w->grad); weei_mfree(w->act);
}

int rf_ws_alloc(rf_workspace *w) {
    w->obs = weei_malloc((size_t)MAX_GROUP_STEPS * OBS * 4);
    w->ret = weei_malloc((size_t)MAX_GROUP_STEPS * 4);
    w->adv = weei_malloc((size_t)MAX_GROUP_STEPS * 4);
    w->h = weei_malloc((size_t)MAX_GROUP_STEPS * HID * 4);
    w->logits = weei_malloc((size_t)MAX_GROUP_STEPS * ACT * 4);
    w->dlogits = weei_malloc((size_t)MAX_GROUP_STEPS * ACT * 4);
    w->dh = weei_malloc((size_t)MAX_GROUP_STEPS * HID * 4);
    w->grad = weei_malloc(WEIGHT_BYTES);
    w->act = weei_malloc(MAX_GROUP_STEPS);
    if (!w->obs || !w->ret || !w->adv || !w->h || !w->logits || !w->dlogits || !w->dh || !w->grad || !w->act) { rf_ws_free(w); return -1; }
    return 0;
}

/* Each step's weight in the policy gradient: its normalised return over the
 * group's n steps, divided by n (the same floats for the CPU and the GPU). */
void rf_advantages(rf_workspace *w, uint32_t n) {
    double mean = 0.0, var = 0.0;
    for (uint32_t t = 0; t < n; t++) mean += w->ret[t];
    mean /= n;
    for (uint32_t t = 0; t < n; t++) { double d = w->ret[t] - mean; var += d * d; }
    float sd = (float)__builtin_sqrt(var / n);
    float inv = 1.0f / (sd + 1e-8f);
    float scale = 1.0f / (float)n;
    for (uint32_t t = 0; t < n; t++) w->adv[t] = ((float)(w->ret[t] - mean)) * inv * scale;
}

/* The REINFORCE gradient of the group's n steps into w->grad. */
static void policy_gradient(rf_workspace *w, const float *p, uint32_t n) {
    rf_advantages(w, n);
    weei_dense_forward(w->obs, n, OBS, HID, p, p + N_W1, w->h);
    weei_tanh(w->h, n * HID);
    weei_dense_forward(w->h, n, HID, ACT, p + N_W1 + N_B1, p + N_W1 + N_B1 + N_W2, w->logits);
    for (uint32_t t = 0; t < n; t++) {
        float probs[ACT];
        weei_softmax(w->logits + (size_t)t * ACT, ACT, probs);
        float adv = w->adv[t];
        for (uint32_t k = 0; k < ACT; k++)
            w->dlogits[(size_t)t * ACT + k] = (probs[k] - (k == w->act[t] ? 1.0f : 0.0f)) * adv;
    }
    weei_memzero(w->grad, WEIGHT_BYTES);
    float *gW1 = w->grad, *gb1 = gW1 + N_W1, *gW2 = gb1 + N_B1, *gb2 = gW2 + N_W2;
    weei_dense_backward(w->h, w->dlogits, n, HID, ACT, p + N_W1 + N_B1, gW2, gb2, w->dh);
    weei_tanh_backward(w->h, w->dh, n * HID);
    weei_dense_backward(w->obs, w->dh, n, OBS, HID, p, gW1, gb1, 0);
}

/* Plays the next group of episodes of the assignment (units done.. of e)
 * with the weights p, recording their steps and discounted returns in w;
 * reports progress. Returns the group's step count. */
uint32_t rf_play_group(rf_workspace *w, const float *p, const weei_experience *e, uint32_t *done, double *return_sum) {
    static const char *const ids[1] = { "episodeReturn" };
    uint32_t group = e->unit_count - *done < EPISODES_PER_UPDATE ? e->unit_count - *done : EPISODES_PER_UPDATE;
    uint32_t n = 0;
    for (uint32_t k = 0; k < group; k++) {
        weei_rng r;
        episode_rng(&r, e->seed, e->unit_start + *done);
        uint32_t len = play(p, &r, 0, w->obs + (size_t)n * OBS, w->act + n);
        /* discounted returns, back to front */
        float g = 0.0f;
        for (uint32_t t = len; t-- > 0;) { g = 1.0f + GAMMA * g; w->ret[n + t] = g; }
        n += len;
        *return_sum += len;
        (*done)++;
        double mean = *return_sum / *done;
        weei_progress(*done, e->unit_count, ids, &mean, 1);
    }
    return n;
}

int rf_read_step_limit(const wj_doc *in, uint32_t *limit) {
    uint64_t v;
    int t = wj_get(in, 0, "stepLimit");
    *limit = 0xFFFFFFFFu;
    if (t < 0) return 0;
    if (wj_uint(in, t, &v) != 0 || v < 1 || v > 0xFFFFFFFFu) return weei_fail("stepLimit must be a positive integer");
    *limit = (uint32_t)v;
    return 0;
}

int rf_read_units(const wj_doc *in, weei_experience *e, const char *op) {
    int has = weei_read_experience(in, e);
    if (has < 0) return -1;
    if (has == 0 || wj_get(in, 0, "data") >= 0) {
        weei_msg m = { {0}, 0 };
        weei_msg_str(&m, op);
        weei_msg_str(&m, " needs experience {unitStart, unitCount, seed} and no data (cartpole-reinforce is an experience model)");
        return weei_fail(m.buf);
    }
    if (e->unit_count < 1 || e->unit_count > MAX_UNITS) return weei_fail("experience.unitCount must be 1..4096");
    return 0;
}

int model_train(const wj_doc *in) {
    if (!g_has_weights) return weei_fail("train called before loadModel");
    weei_experience e;
    if (rf_read_units(in, &e, "train") != 0) return -1;
    weei_settings s;
    if (weei_read_settings(in, &s, EPISODES_PER_UPDATE, DEFAULT_LR) != 0) return -1;

    uint32_t step_limit;
    if (rf_read_step_limit(in, &step_limit) != 0) return -1;

    rf_workspace w;
    weei_adam adam;
    if (rf_ws_alloc(&w) != 0) return weei_fail("out of memory");
    if (weei_adam_init(&adam, N_PARAMS, s.learning_rate) != 0) { rf_ws_free(&w); return weei_fail("out of memory"); }
    float *p = g_out;
    weei_memcopy(p, g_loaded, WEIGHT_BYTES);

    double return_sum = 0.0;
    uint32_t done = 0, steps = 0;
    while (done < e.unit_count && steps < step_limit) {
        uint32_t n = rf_play_group(&w, p, &e, &done, &return_sum);
        policy_gradient(&w, p, n);
        weei_adam_step(&adam, p, w.grad);
        steps++;
    }
    weei_adam_free(&adam);
    rf_ws_free(&w);
    for (uint32_t i = 0; i < N_PARAMS; i++)
        if (!weei_isfinite_f32(p[i])) return weei_fail("training diverged: a weight is not finite (lower the learning rate)");

    jw_obj_begin();
    jw_key("weights"); jw_region(p, WEIGHT_BYTES);
    jw_key("metrics");
    jw_obj_begin();
    jw_key("episodeReturn"); jw_num(return_sum / done);
    jw_obj_end();
    jw_key("completedUnits"); jw_uint(done);
    jw_key("optimizerSteps"); jw_uint(steps);
    jw_obj_end();
    return 0;
}

int model_evaluate(const wj_doc *in) {
    if (!g_has_weights) return weei_fail("evaluate called before loadModel");
    weei_experience e;
    if (rf_read_units(in, &e, "evaluate") != 0) return -1;
    double return_sum = 0.0;
    for (uint32_t k = 0; k < e.unit_count; k++) {
        weei_rng r;
        episode_rng(&r, e.seed, e.unit_start + k);
        return_sum += play(g_loaded, &r, 1, 0, 0);
    }
    jw_obj_begin();
    jw_key("metrics");
    jw_obj_begin();
    jw_key("episodeReturn"); jw_num(return_sum / e.unit_count);
    jw_obj_end();
    jw_key("examples"); jw_uint(e.unit_count);
    jw_obj_end();
    return 0;
}
