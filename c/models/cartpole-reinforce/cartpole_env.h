/* Classic cart-pole, with the constants and Euler integration of
 * gymnasium's CartPole-v1 (state in double precision, as there). */
#ifndef CARTPOLE_ENV_H
#define CARTPOLE_ENV_H

#include "../../sdk/weei_sdk.h"

#define CP_MAX_STEPS 500

typedef struct { double x, x_dot, theta, theta_dot; } cp_state;

/* Each state variable uniform in [-0.05, 0.05). */
void cp_reset(cp_state *s, weei_rng *r);
/* Applies action 0 (push left) or 1 (push right); returns 1 when terminated
 * (pole beyond 12 degrees or cart beyond 2.4). The reward is 1 per step. */
int cp_step(cp_state *s, int action);
/* The observation as gymnasium returns it: the state rounded to float32. */
void cp_observe(const cp_state *s, float obs[4]);

#endif
