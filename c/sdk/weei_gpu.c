/* What every model's GPU backend writes the same way (docs/gpu.md): the
 * pieces of a weei-device-program-v1 program, the readback regions of
 * gpuNext / gpuEnd, and the per-step scalars of the optimizer kernels. */
#include "weei_sdk.h"

uint32_t weei_gpu_groups(uint64_t invocations) { return (uint32_t)((invocations + 63) / 64); }

void weei_gpu_buffer(const char *id, uint64_t bytes, const char *init) {
    jw_obj_begin();
    jw_key("id"); jw_str(id);
    jw_key("bytes"); jw_uint(bytes);
    jw_key("init"); jw_str(init);
    jw_obj_end();
}

void weei_gpu_pipeline(const char *id, const char *module, const char *entry, const char *const *names,
                       const uint32_t *values) {
    jw_obj_begin();
    jw_key("id"); jw_str(id);
    jw_key("module"); jw_str(module);
    jw_key("entryPoint"); jw_str(entry);
    jw_key("constants");
    jw_obj_begin();
    for (int k = 0; names[k]; k++) { jw_key(names[k]); jw_uint(values[k]); }
    jw_obj_end();
    jw_obj_end();
}

void weei_gpu_dispatch(const char *pipeline_id, const char *const *buffers, int count, uint32_t workgroups) {
    jw_obj_begin();
    jw_key("op"); jw_str("dispatch");
    jw_key("pipeline"); jw_str(pipeline_id);
    jw_key("bindings");
    jw_arr_begin();
    for (int k = 0; k < count; k++) {
        if (!buffers[k]) continue;
        jw_obj_begin();
        jw_key("binding"); jw_uint((uint64_t)k);
        jw_key("buffer"); jw_str(buffers[k]);
        jw_obj_end();
    }
    jw_arr_end();
    jw_key("workgroups");
    jw_arr_begin(); jw_uint(workgroups); jw_uint(1); jw_uint(1); jw_arr_end();
    jw_obj_end();
}

void weei_gpu_readback(const char *id, uint64_t bytes) {
    jw_arr_begin();
    jw_obj_begin();
    jw_key("buffer"); jw_str(id);
    jw_key("offset"); jw_uint(0);
    jw_key("bytes"); jw_uint(bytes);
    jw_obj_end();
    jw_arr_end();
}

int weei_gpu_read_regions(const wj_doc *in, weei_region *r, int cap) {
    int arr = wj_get(in, 0, "readback");
    if (arr < 0 || in->toks[arr].type != WJ_ARRAY) return weei_fail("a readback array is required");
    int count = (int)in->toks[arr].count;
    if (count > cap) return weei_fail("readback has more regions than the program reads");
    for (int k = 0; k < count; k++) {
        const char *error;
        if (wj_region(in, wj_at(in, arr, (uint32_t)k), &r[k], &error) != 0) return weei_fail(error);
    }
    return count;
}

void weei_gpu_adam_init(weei_gpu_adam *a, float lr) {
    a->lr = lr;
    a->t = 0;
    a->b1t = a->b2t = 1.0;
}

void weei_gpu_adam_step(weei_gpu_adam *a, uint32_t count, float grad_scale, uint32_t step[WEEI_GPU_STEP_WORDS]) {
    const float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
    a->t++;
    if (a->t <= 100000) { a->b1t *= beta1; a->b2t *= beta2; }
    float size = (float)((double)a->lr * __builtin_sqrt(1.0 - a->b2t) / (1.0 - a->b1t));
    step[0] = count;
    step[1] = weei_f32_bits(grad_scale);
    step[2] = weei_f32_bits(size);
    step[3] = weei_f32_bits(beta1);
    step[4] = weei_f32_bits(beta2);
    step[5] = weei_f32_bits(1.0f - beta1);
    step[6] = weei_f32_bits(1.0f - beta2);
    step[7] = weei_f32_bits(eps);
}
