/* @NAME@: an experience model made with `weei model new --kind experience`
 * (docs/models.md, docs/experience.md).
 *
 * The environment lives here, in the module: an episode is STEPS rounds of
 * "pick the largest": the agent sees OBS numbers drawn uniformly from [0, 1)
 * and picks one of them (ACT == OBS actions); the reward is 1 when it picked
 * the largest. The return of an episode is its number of right picks
 * (0..STEPS). Replace env_reset / env_observe / env_step with your own task.
 *
 * Policy OBS -> HIDDEN tanh -> ACT softmax; weights (float32-le, N_PARAMS
 * values): W1[OBS][HIDDEN], b1[HIDDEN], W2[HIDDEN][ACT], b2[ACT].
 * REINFORCE: episodes are played in groups of GROUP; after each group one
 * Adam step on -mean_t(A_t log pi(a_t | s_t)), A_t the step's return-to-go
 * normalised over the group. Adam starts fresh each train call.
 *
 * Episode k of an assignment (unit unitStart + k) draws from its own
 * xoshiro256** stream seeded by (seed, unitStart + k): the same seed and
 * weights give the same episodes on every participant.
 */
#include "sdk/weei_sdk.h"

#define OBS 4
#define ACT OBS
#define HIDDEN 16
#define STEPS 8
#define GROUP 8
#define MAX_UNITS 4096

#define N_W1 (OBS * HIDDEN)
#define N_B1 HIDDEN
#define N_W2 (HIDDEN * ACT)
#define N_B2 ACT
#define N_PARAMS (N_W1 + N_B1 + N_W2 + N_B2)
#define WEIGHT_BYTES (N_PARAMS * 4)
#define MAX_GROUP_STEPS (GROUP * STEPS)
#define DEFAULT_LR 0.03f

static float *g_loaded;  /* weights of the last loadModel */
static int g_has_weights;
static float *g_out;     /* output region of train / createInitialWeights */

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
    jw_key("dataFormats"); jw_raw("[]");
    jw_key("metrics"); jw_raw("[{\"id\":\"episodeReturn\",\"label\":\"Episode return\",\"direction\":\"maximize\"}]");
    jw_key("capabilities"); jw_raw("{\"evaluation\":true}");
    jw_key("workSource");
    jw_raw("{\"kind\":\"experience\",\"inputs\":\"none\",\"unit\":{\"id\":\"episode\",\"label\":\"Episodes\"},"
           "\"unitsPerAssignment\":{\"default\":32,\"minimum\":1,\"maximum\":4096},\"evaluationUnits\":64}");
    jw_key("auxiliaryWeights"); jw_raw("[]");
    jw_obj_end();
    return 0;
}

int model_create_initial_weights(const wj_doc *in, uint64_t seed) {
    (void)in;
    if (buffers() != 0) return -1;
    weei_rng r;
    weei_rng_seed(&r, seed);
    weei_init_dense(&r, g_out, g_out + N_W1, OBS, HIDDEN);
    weei_init_dense(&r, g_out + N_W1 + N_B1, g_out + N_W1 + N_B1 + N_W2, HIDDEN, ACT);
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

int model_describe_chunk(const wj_doc *in, const char *format, const weei_region *data) {
    (void)in; (void)format; (void)data;
    return weei_fail("@NAME@ is an experience model: it reads no dataset files");
}

/* ---- the environment ---------------------------------------------------- */

typedef struct { float obs[OBS]; uint32_t t; } env_state;

static void env_observe(env_state *s, weei_rng *r) {
    for (int k = 0; k < OBS; k++) s->obs[k] = weei_rng_float(r);
}

static void env_reset(env_state *s, weei_rng *r) { s->t = 0; env_observe(s, r); }

/* Applies action a; returns the reward and whether the episode ended. */
static float env_step(env_state *s, weei_rng *r, uint32_t a, int *done) {
    float reward = weei_argmax(s->obs, OBS) == a ? 1.0f : 0.0f;
    s->t++;
    *done = s->t >= STEPS;
    if (!*done) env_observe(s, r);
    return reward;
}

/* ---- the agent ------------------------------------------------------------ */

static void episode_rng(weei_rng *r, uint64_t seed, uint64_t unit) {
    uint64_t mix = unit;
    weei_rng_seed(r, seed ^ weei_splitmix64(&mix));
}

static void policy(const float *p, const float obs[OBS], float probs[ACT]) {
    float h[HIDDEN], logits[ACT];
    weei_dense_forward(obs, 1, OBS, HIDDEN, p, p + N_W1, h);
    weei_tanh(h, HIDDEN);
    weei_dense_forward(h, 1, HIDDEN, ACT, p + N_W1 + N_B1, p + N_W1 + N_B1 + N_W2, logits);
    weei_softmax(logits, ACT, probs);
}

static uint32_t sample(const float probs[ACT], weei_rng *r) {
    float u = weei_rng_float(r), c = 0.0f;
    for (uint32_t a = 0; a < ACT; a++) { c += probs[a]; if (u < c) return a; }
    return ACT - 1;
}

/* Plays one episode; with obs_out non-NULL records observations, actions and
 * rewards-to-go there. Returns the episode return and its step count in *len. */
static float play(const float *p, weei_rng *r, int greedy, float *obs_out, uint8_t *act_out, float *ret_out, uint32_t *len) {
    env_state s;
    float rewards[STEPS], total = 0.0f;
    int done = 0;
    uint32_t t = 0;
    env_reset(&s, r);
    while (!done && t < STEPS) {
        float probs[ACT];
        policy(p, s.obs, probs);
        uint32_t a = greedy ? weei_argmax(probs, ACT) : sample(probs, r);
        if (obs_out) { weei_memcopy(obs_out + (size_t)t * OBS, s.obs, sizeof s.obs); act_out[t] = (uint8_t)a; }
        rewards[t] = env_step(&s, r, a, &done);
        total += rewards[t];
        t++;
    }
    if (ret_out) { float g = 0.0f; for (uint32_t k = t; k-- > 0;) { g += rewards[k]; ret_out[k] = g; } }
    *len = t;
    return total;
}

static int read_units(const wj_doc *in, weei_experience *e) {
    int has = weei_read_experience(in, e);
    if (has < 0) return -1;
    if (has == 0 || wj_get(in, 0, "data") >= 0) return weei_fail("@NAME@ is an experience model: it needs experience {unitStart, unitCount, seed} and no data");
    if (e->unit_count < 1 || e->unit_count > MAX_UNITS) return weei_fail("experience.unitCount must be 1..4096");
    return 0;
}

typedef struct { float obs[MAX_GROUP_STEPS * OBS], ret[MAX_GROUP_STEPS], h[MAX_GROUP_STEPS * HIDDEN],
                 logits[MAX_GROUP_STEPS * ACT], dlogits[MAX_GROUP_STEPS * ACT], dh[MAX_GROUP_STEPS * HIDDEN];
                 uint8_t act[MAX_GROUP_STEPS]; } group_ws;

/* The REINFORCE gradient of the group's n steps into grad. */
static void policy_gradient(group_ws *w, const float *p, uint32_t n, float *grad) {
    double mean = 0.0, var = 0.0;
    for (uint32_t t = 0; t < n; t++) mean += w->ret[t];
    mean /= n;
    for (uint32_t t = 0; t < n; t++) { double d = w->ret[t] - mean; var += d * d; }
    float inv = 1.0f / ((float)__builtin_sqrt(var / n) + 1e-8f);
    weei_dense_forward(w->obs, n, OBS, HIDDEN, p, p + N_W1, w->h);
    weei_tanh(w->h, n * HIDDEN);
    weei_dense_forward(w->h, n, HIDDEN, ACT, p + N_W1 + N_B1, p + N_W1 + N_B1 + N_W2, w->logits);
    for (uint32_t t = 0; t < n; t++) {
        float probs[ACT];
        float adv = (float)(w->ret[t] - mean) * inv / (float)n;
        weei_softmax(w->logits + (size_t)t * ACT, ACT, probs);
        for (uint32_t k = 0; k < ACT; k++)
            w->dlogits[(size_t)t * ACT + k] = (probs[k] - (k == w->act[t] ? 1.0f : 0.0f)) * adv;
    }
    weei_memzero(grad, WEIGHT_BYTES);
    float *gW1 = grad, *gb1 = gW1 + N_W1, *gW2 = gb1 + N_B1, *gb2 = gW2 + N_W2;
    weei_dense_backward(w->h, w->dlogits, n, HIDDEN, ACT, p + N_W1 + N_B1, gW2, gb2, w->dh);
    weei_tanh_backward(w->h, w->dh, n * HIDDEN);
    weei_dense_backward(w->obs, w->dh, n, OBS, HIDDEN, p, gW1, gb1, 0);
}

int model_train(const wj_doc *in) {
    if (!g_has_weights) return weei_fail("train called before loadModel");
    weei_experience e;
    if (read_units(in, &e) != 0) return -1;
    weei_settings s;
    if (weei_read_settings(in, &s, GROUP, DEFAULT_LR) != 0) return -1;
    group_ws *w = weei_malloc(sizeof(group_ws));
    float *grad = weei_malloc(WEIGHT_BYTES);
    weei_adam adam;
    if (!w || !grad || weei_adam_init(&adam, N_PARAMS, s.learning_rate) != 0) {
        weei_mfree(w); weei_mfree(grad);
        return weei_fail("out of memory");
    }
    float *p = g_out;
    weei_memcopy(p, g_loaded, WEIGHT_BYTES);
    static const char *const ids[1] = { "episodeReturn" };
    double return_sum = 0.0;
    uint32_t done = 0, steps = 0;
    while (done < e.unit_count) {
        uint32_t group = e.unit_count - done < GROUP ? e.unit_count - done : GROUP, n = 0;
        for (uint32_t k = 0; k < group; k++, done++) {
            weei_rng r;
            uint32_t len;
            episode_rng(&r, e.seed, e.unit_start + done);
            return_sum += play(p, &r, 0, w->obs + (size_t)n * OBS, w->act + n, w->ret + n, &len);
            n += len;
            double mean = return_sum / (done + 1);
            weei_progress(done + 1, e.unit_count, ids, &mean, 1);
        }
        policy_gradient(w, p, n, grad);
        weei_adam_step(&adam, p, grad);
        steps++;
    }
    weei_adam_free(&adam);
    weei_mfree(w);
    weei_mfree(grad);
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
    if (read_units(in, &e) != 0) return -1;
    double return_sum = 0.0;
    for (uint32_t k = 0; k < e.unit_count; k++) {
        weei_rng r;
        uint32_t len;
        episode_rng(&r, e.seed, e.unit_start + k);
        return_sum += play(g_loaded, &r, 1, 0, 0, 0, &len);
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
