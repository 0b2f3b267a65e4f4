/* cartpole-reinforce: what model.c (the CPU operations) and gpu.c (the
 * hybrid GPU backend's gpuBegin / gpuNext / gpuEnd) share. */
#ifndef REINFORCE_H
#define REINFORCE_H

#include "../../sdk/weei_sdk.h"
#include "cartpole_env.h"

#define OBS 4
#define HID 16
#define ACT 2
#define N_W1 (OBS * HID)
#define N_B1 HID
#define N_W2 (HID * ACT)
#define N_B2 ACT
#define N_PARAMS (N_W1 + N_B1 + N_W2 + N_B2)
#define WEIGHT_BYTES (N_PARAMS * 4)
#define EPISODES_PER_UPDATE 16
#define MAX_UNITS 4096
#define GAMMA 0.99f
#define DEFAULT_LR 0.01f
#define MAX_GROUP_STEPS (EPISODES_PER_UPDATE * CP_MAX_STEPS)

extern float *g_loaded;  /* weights of the last loadModel */
extern int g_has_weights;
extern float *g_out;     /* output region of train / createInitialWeights / gpuEnd */

/* One group's steps: observations, actions, discounted returns, their
 * policy-gradient weights, and the CPU update's activations. */
typedef struct {
    float *obs, *ret, *adv, *h, *logits, *dlogits, *dh, *grad;
    uint8_t *act;
} rf_workspace;

/* Allocates g_loaded and g_out once; 0 or weei_fail. */
int rf_buffers(void);
int rf_ws_alloc(rf_workspace *w);  /* 0 or -1 (out of memory) */
void rf_ws_free(rf_workspace *w);
/* Reads {experience} (and no data) for `op`; 0 or weei_fail. */
int rf_read_units(const wj_doc *in, weei_experience *e, const char *op);
/* Optional "stepLimit" (the admission gate's one-update run): stop after
 * that many updates; UINT32_MAX when absent. 0 or weei_fail. */
int rf_read_step_limit(const wj_doc *in, uint32_t *limit);
/* Plays the next group (at most EPISODES_PER_UPDATE episodes from unit
 * *done of e) with the weights p into w, reporting progress; advances
 * *done and *return_sum and returns the group's step count. */
uint32_t rf_play_group(rf_workspace *w, const float *p, const weei_experience *e, uint32_t *done, double *return_sum);
/* w->adv[t] for the group's n steps: the normalised return over n. */
void rf_advantages(rf_workspace *w, uint32_t n);

#endif
