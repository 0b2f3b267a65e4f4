/* Deterministic elementary functions for models built without libc.
 *
 * Written in plain C with fixed operation order, so with -ffp-contract=off
 * they give bit-identical results in wasm32 and in a native build (the
 * training benchmark relies on that: both sides do exactly the same work).
 * Accuracy is a few ulp, plenty for training; these are not libm.
 */
#ifndef WEEI_MATH_H
#define WEEI_MATH_H

#include <stdint.h>

static inline float weei_f32_from_bits(uint32_t u) {
    union { uint32_t u; float f; } v = { u };
    return v.f;
}

static inline uint32_t weei_f32_bits(float f) {
    union { float f; uint32_t u; } v = { f };
    return v.u;
}

static inline int weei_isfinite_f32(float f) {
    return (weei_f32_bits(f) & 0x7f800000u) != 0x7f800000u;
}

static inline int weei_isfinite_f64(double d) {
    union { double d; uint64_t u; } v = { d };
    return (v.u & 0x7ff0000000000000ull) != 0x7ff0000000000000ull;
}

static inline float weei_fabsf(float x) { return weei_f32_from_bits(weei_f32_bits(x) & 0x7fffffffu); }
static inline double weei_fabs(double x) { return x < 0 ? -x : x; }

/* e^x: x = n ln2 + r, |r| <= ln2/2, e^r by a degree-6 Taylor polynomial. */
static inline float weei_expf(float x) {
    if (x > 88.0f) x = 88.0f;
    if (x < -87.0f) x = -87.0f;
    float fn = x * 1.44269504f;
    int n = (int)(fn < 0 ? fn - 0.5f : fn + 0.5f);
    float r = x - (float)n * 0.693145752f; /* ln2 split in two parts */
    r = r - (float)n * 1.42860677e-06f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (0.166666672f + r * (0.0416666679f + r * (0.00833333377f + r * 0.00138888892f)))));
    return p * weei_f32_from_bits((uint32_t)(n + 127) << 23);
}

/* ln x for x > 0: x = m 2^e with m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh(s). */
static inline float weei_logf(float x) {
    if (!(x > 0.0f)) return -1.0e30f;
    uint32_t u = weei_f32_bits(x);
    int e = (int)((u >> 23) & 0xff) - 127;
    if (e == -127) { /* subnormal: scale up first */
        x *= 8388608.0f;
        u = weei_f32_bits(x);
        e = (int)((u >> 23) & 0xff) - 127 - 23;
    }
    float m = weei_f32_from_bits((u & 0x007fffffu) | 0x3f800000u);
    if (m > 1.41421356f) { m *= 0.5f; e += 1; }
    float f = m - 1.0f;
    float s = f / (2.0f + f);
    float s2 = s * s;
    float poly = s * (2.0f + s2 * (0.666666687f + s2 * (0.4f + s2 * (0.285714298f + s2 * 0.222222224f))));
    return poly + (float)e * 0.693147182f;
}

static inline float weei_tanhf(float x) {
    float a = weei_fabsf(x);
    float t;
    if (a < 0.01f) {
        t = a - a * a * a * (1.0f / 3.0f);
    } else if (a > 9.0f) {
        t = 1.0f;
    } else {
        t = 1.0f - 2.0f / (weei_expf(2.0f * a) + 1.0f);
    }
    return x < 0 ? -t : t;
}

/* sin and cos in double precision for |x| up to a few thousand: reduce by
 * multiples of pi/2 (Cody-Waite, three parts) and use Taylor kernels on
 * [-pi/4, pi/4], truncated below 1e-17. */
static inline double weei__sin_kernel(double r) {
    double r2 = r * r;
    return r * (1.0 + r2 * (-1.0 / 6 + r2 * (1.0 / 120 + r2 * (-1.0 / 5040 + r2 * (1.0 / 362880 + r2 * (-1.0 / 39916800 + r2 * (1.0 / 6227020800.0 + r2 * (-1.0 / 1307674368000.0))))))));
}

static inline double weei__cos_kernel(double r) {
    double r2 = r * r;
    return 1.0 + r2 * (-0.5 + r2 * (1.0 / 24 + r2 * (-1.0 / 720 + r2 * (1.0 / 40320 + r2 * (-1.0 / 3628800 + r2 * (1.0 / 479001600 + r2 * (-1.0 / 87178291200.0 + r2 * (1.0 / 20922789888000.0))))))));
}

static inline void weei_sincos(double x, double *s, double *c) {
    double fk = x * 0.63661977236758134308; /* 2/pi */
    long long k = (long long)(fk < 0 ? fk - 0.5 : fk + 0.5);
    double dk = (double)k;
    double r = x - dk * 1.57079632673412561417;
    r = r - dk * 6.07710050630396597660e-11;
    r = r - dk * 2.02226624871116645580e-21;
    double sr = weei__sin_kernel(r), cr = weei__cos_kernel(r);
    switch ((int)(k & 3)) {
    case 0: *s = sr; *c = cr; break;
    case 1: *s = cr; *c = -sr; break;
    case 2: *s = -sr; *c = -cr; break;
    default: *s = -cr; *c = sr; break;
    }
}

#endif
