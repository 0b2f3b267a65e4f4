/* Cart-pole dynamics: gymnasium/envs/classic_control/cartpole.py (v1),
 * written in the same operation order so results agree to rounding. */
#include "cartpole_env.h"

static const double GRAVITY = 9.8;
static const double MASSCART = 1.0;
static const double MASSPOLE = 0.1;
static const double LENGTH = 0.5; /* half the pole's length */
static const double FORCE_MAG = 10.0;
static const double TAU = 0.02;
static const double X_THRESHOLD = 2.4;
#define PI 3.14159265358979323846

void cp_reset(cp_state *s, weei_rng *r) {
    s->x = weei_rng_double(r) * 0.1 - 0.05;
    s->x_dot = weei_rng_double(r) * 0.1 - 0.05;
    s->theta = weei_rng_double(r) * 0.1 - 0.05;
    s->theta_dot = weei_rng_double(r) * 0.1 - 0.05;
}

int cp_step(cp_state *s, int action) {
    const double total_mass = MASSPOLE + MASSCART;
    const double polemass_length = MASSPOLE * LENGTH;
    const double theta_threshold = 12 * 2 * PI / 360;
    double force = action == 1 ? FORCE_MAG : -FORCE_MAG;
    double sintheta, costheta;
    weei_sincos(s->theta, &sintheta, &costheta);
    double temp = (force + polemass_length * (s->theta_dot * s->theta_dot) * sintheta) / total_mass;
    double thetaacc = (GRAVITY * sintheta - costheta * temp)
                      / (LENGTH * (4.0 / 3.0 - MASSPOLE * (costheta * costheta) / total_mass));
    double xacc = temp - polemass_length * thetaacc * costheta / total_mass;
    s->x = s->x + TAU * s->x_dot;
    s->x_dot = s->x_dot + TAU * xacc;
    s->theta = s->theta + TAU * s->theta_dot;
    s->theta_dot = s->theta_dot + TAU * thetaacc;
    return s->x < -X_THRESHOLD || s->x > X_THRESHOLD || s->theta < -theta_threshold || s->theta > theta_threshold;
}

void cp_observe(const cp_state *s, float obs[4]) {
    obs[0] = (float)s->x;
    obs[1] = (float)s->x_dot;
    obs[2] = (float)s->theta;
    obs[3] = (float)s->theta_dot;
}
