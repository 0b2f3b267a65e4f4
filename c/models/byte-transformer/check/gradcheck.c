/* Finite-difference check of byte-transformer's backward pass.
 *
 * Built natively with the model's net.c and the SDK, with the sizes given by
 * -D (tests/unit/test_byte_transformer.py uses a tiny config so every weight
 * can be checked). Weights are drawn wider than the initial ones (so gains,
 * biases and attention patterns are far from trivial); for every weight
 * (or every STRIDE-th) the analytic gradient is compared with the central
 * difference (L(w + h) - L(w - h)) / 2h. A weight whose perturbation flips
 * a ReLU on or off is skipped (the loss has a kink there, and the difference
 * quotient averages two slopes). Prints one line:
 *   checked N skipped S failures K maxabs A maxrel R params P
 */
#include <stdio.h>
#include <stdlib.h>

#include "../transformer.h"

/* 1 when every ReLU of the last forward pass is on exactly where `on` says. */
static int same_pattern(const tfm_work *w, uint32_t count, const uint8_t *on) {
    uint32_t n = count * TFM_T * TFM_F;
    for (uint32_t l = 0; l < TFM_L; l++)
        for (uint32_t k = 0; k < n; k++)
            if ((w->h[l][k] > 0.0f) != on[l * n + k]) return 0;
    return 1;
}

int main(int argc, char **argv) {
    uint32_t stride = argc > 1 ? (uint32_t)atoi(argv[1]) : 1;
    const uint32_t count = 3;
    const float h = 3e-3f;
    float *p = weei_malloc(TFM_WEIGHT_BYTES), *g = weei_malloc(TFM_WEIGHT_BYTES);
    uint8_t *records = weei_malloc(count * TFM_RECORD);
    tfm_work w;
    if (!p || !g || !records || tfm_work_alloc(&w, count) != 0) { fprintf(stderr, "out of memory\n"); return 2; }
    weei_rng r;
    weei_rng_seed(&r, 7);
    tfm_init(p, 7);
    for (uint32_t k = 0; k < TFM_N_PARAMS; k++) p[k] += (2.0f * weei_rng_float(&r) - 1.0f) * 0.3f;
    /* a few distinct bytes, so embedding rows get input gradients too */
    for (uint32_t k = 0; k < count * TFM_RECORD; k++) records[k] = (uint8_t)(65 + weei_rng_below(&r, 6));
    tfm_gather(&w, records, 0, count);
    tfm_loss(&w, p, count, g, 0);
    uint32_t nh = count * TFM_T * TFM_F;
    uint8_t *on = weei_malloc(TFM_L * nh);
    if (!on) return 2;
    for (uint32_t l = 0; l < TFM_L; l++)
        for (uint32_t k = 0; k < nh; k++) on[l * nh + k] = w.h[l][k] > 0.0f;
    uint32_t checked = 0, skipped = 0, failures = 0;
    double maxabs = 0, maxrel = 0;
    for (uint32_t k = 0; k < TFM_N_PARAMS; k += stride) {
        float keep = p[k];
        p[k] = keep + h;
        double up = tfm_loss(&w, p, count, 0, 0);
        int smooth = same_pattern(&w, count, on);
        p[k] = keep - h;
        double down = tfm_loss(&w, p, count, 0, 0);
        smooth = smooth && same_pattern(&w, count, on);
        p[k] = keep;
        if (!smooth) { skipped++; continue; }
        double num = (up - down) / (2.0 * (double)h);
        double err = num - (double)g[k];
        if (err < 0) err = -err;
        double scale = (double)g[k] < 0 ? -(double)g[k] : (double)g[k];
        double rel = err / (scale > 1e-3 ? scale : 1e-3);
        if (err > maxabs) maxabs = err;
        if (rel > maxrel) maxrel = rel;
        /* float32 forward passes: the difference quotient carries ~1e-5 of noise */
        if (err > 2e-4 + 1e-2 * scale) {
            failures++;
            if (failures <= 10) fprintf(stderr, "weight %u: analytic %.6g numeric %.6g\n", k, (double)g[k], num);
        }
        checked++;
    }
    printf("checked %u skipped %u failures %u maxabs %.3g maxrel %.3g params %u\n", checked, skipped, failures, maxabs,
           maxrel, (unsigned)TFM_N_PARAMS);
    return failures ? 1 : 0;
}
