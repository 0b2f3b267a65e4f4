/* digits-mlp: what model.c (the CPU operations) and gpu.c (the GPU backend's
 * gpuBegin / gpuNext / gpuEnd) share. */
#ifndef DIGITS_H
#define DIGITS_H

#include "../../sdk/weei_sdk.h"

#define IN 64
#define HID 64
#define OUT 10
#define N_W1 (IN * HID)
#define N_B1 HID
#define N_W2 (HID * OUT)
#define N_B2 OUT
#define N_PARAMS (N_W1 + N_B1 + N_W2 + N_B2)
#define WEIGHT_BYTES (N_PARAMS * 4)
#define RECORD 65
#define HEADER 8
#define MAX_EXAMPLES 10000
#define MAX_CHUNK_BYTES (HEADER + RECORD * MAX_EXAMPLES)
#define DEFAULT_LR 0.01f
#define DEFAULT_BATCH 32

extern float *g_loaded;  /* weights of the last loadModel */
extern int g_has_weights;
extern float *g_out;     /* output region of train / createInitialWeights / gpuEnd */

/* Allocates g_loaded and g_out once; 0 or weei_fail. */
int digits_buffers(void);
/* Reads {"data": region, "format": "..."}; the example count or weei_fail. */
int64_t digits_read_data(const wj_doc *in, weei_region *d);
/* Optional "stepLimit" (the admission gate's one-step run): stop after that
 * many optimizer steps; UINT32_MAX when absent. 0 or weei_fail. */
int digits_read_step_limit(const wj_doc *in, uint32_t *limit);

/* A pixel intensity 0..16 as the network's input. */
static inline float digits_pixel(uint8_t v) { return (float)v * (1.0f / 16.0f); }

#endif
