/* byte-transformer: a decoder-only byte-level transformer trained on
 * synthetic reasoning text (c/models/byte-transformer/README.md).
 *
 * Weights: float32-le, the layout in transformer.h (586,944 values at the
 * default sizes). Data format weei-bytes-v1: "WBT1", u32-le count n, n
 * records of T+1 = 65 bytes. Training: local Adam from fresh moments each
 * call, minibatches of settings.batchSize records in an order shuffled by
 * the seed, settings.localEpochs passes. Metrics: mean next-byte
 * cross-entropy (nats) and accuracy over every position trained on.
 */
#include "transformer.h"

#define EVAL_BATCH 16

static const char FORMAT[] = "weei-bytes-v1";

float *g_loaded; /* weights of the last loadModel */
int g_has_weights;
float *g_out;    /* output region of train / createInitialWeights / gpuEnd */

/* Both live in the heap, where every region handed to the host must be. */
int tfm_buffers(void) {
    if (!g_loaded) g_loaded = weei_malloc(TFM_WEIGHT_BYTES);
    if (!g_out) g_out = weei_malloc(TFM_WEIGHT_BYTES);
    return g_loaded && g_out ? 0 : weei_fail("out of memory");
}

int model_get_info(const wj_doc *in) {
    (void)in;
    weei_msg label = { {0}, 0 };
    weei_msg_str(&label, "Weei byte windows (");
    weei_msg_int(&label, TFM_RECORD);
    weei_msg_str(&label, "-byte records)");
    jw_obj_begin();
    jw_key("id"); jw_str("byte-transformer");
    jw_key("version"); jw_str("1.0.0");
    jw_key("name"); jw_str("Byte-level transformer (synthetic reasoning text)");
    jw_key("abiVersion"); jw_int(1);
    jw_key("weightFormat"); jw_str("float32-le");
    jw_key("maxWorkers"); jw_int(1);
    jw_key("maxChunkBytes"); jw_int(TFM_HEADER + (int64_t)TFM_RECORD * TFM_MAX_EXAMPLES);
    jw_key("maxExamplesPerChunk"); jw_int(TFM_MAX_EXAMPLES);
    jw_key("dataFormats");
    jw_arr_begin();
    jw_obj_begin();
    jw_key("id"); jw_str(FORMAT);
    jw_key("label"); jw_str(label.buf);
    jw_key("acceptedMimeTypes"); jw_raw("[\"application/octet-stream\"]");
    jw_obj_end();
    jw_arr_end();
    jw_key("metrics");
    jw_raw("[{\"id\":\"loss\",\"label\":\"Loss (nats/byte)\",\"direction\":\"minimize\"},"
           "{\"id\":\"accuracy\",\"label\":\"Next-byte accuracy\",\"direction\":\"maximize\"}]");
    jw_obj_end();
    return 0;
}

int model_create_initial_weights(const wj_doc *in, uint64_t seed) {
    (void)in;
    if (tfm_buffers() != 0) return -1;
    tfm_init(g_out, seed);
    jw_obj_begin();
    jw_key("weights"); jw_region(g_out, TFM_WEIGHT_BYTES);
    jw_obj_end();
    return 0;
}

int model_load(const wj_doc *in, const weei_region *w) {
    (void)in;
    if (w->bytes != TFM_WEIGHT_BYTES) {
        weei_msg m = { {0}, 0 };
        weei_msg_str(&m, "weights must be ");
        weei_msg_int(&m, TFM_WEIGHT_BYTES);
        weei_msg_str(&m, " bytes (");
        weei_msg_int(&m, TFM_N_PARAMS);
        weei_msg_str(&m, " float32), got ");
        weei_msg_int(&m, w->bytes);
        return weei_fail(m.buf);
    }
    if (tfm_buffers() != 0) return -1;
    for (uint32_t i = 0; i < TFM_N_PARAMS; i++) {
        float v;
        weei_memcopy(&v, w->data + (size_t)i * 4, 4);
        if (!weei_isfinite_f32(v)) return weei_fail("weights contain a value that is not finite");
    }
    weei_memcopy(g_loaded, w->data, TFM_WEIGHT_BYTES);
    g_has_weights = 1;
    jw_raw("{\"ok\":true}");
    return 0;
}

int model_load_auxiliary(const wj_doc *in, int slots) {
    if (in->toks[slots].count != 0) return weei_fail("byte-transformer declares no auxiliary weights");
    jw_raw("{\"ok\":true}");
    return 0;
}

/* Checks a weei-bytes-v1 file; returns the example count or fails. Every
 * byte value is a valid token, so only the framing can be wrong. */
static int64_t check_chunk(const char *format, const weei_region *d) {
    if (!format || !weei_streq(format, FORMAT)) return weei_fail("unknown data format (byte-transformer reads weei-bytes-v1)");
    if (d->bytes < TFM_HEADER) return weei_fail("weei-bytes-v1: file shorter than its 8-byte header");
    const uint8_t *p = d->data;
    if (p[0] != 'W' || p[1] != 'B' || p[2] != 'T' || p[3] != '1') return weei_fail("weei-bytes-v1: bad magic (expected WBT1)");
    uint32_t n = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
    if (n > TFM_MAX_EXAMPLES) return weei_fail("weei-bytes-v1: more than 4096 examples");
    if ((uint64_t)d->bytes != TFM_HEADER + (uint64_t)n * TFM_RECORD) {
        weei_msg m = { {0}, 0 };
        weei_msg_str(&m, "weei-bytes-v1: file is ");
        weei_msg_int(&m, d->bytes);
        weei_msg_str(&m, " bytes, but a header announcing ");
        weei_msg_int(&m, n);
        weei_msg_str(&m, " examples needs ");
        weei_msg_int(&m, TFM_HEADER + (int64_t)n * TFM_RECORD);
        return weei_fail(m.buf);
    }
    return n;
}

int model_describe_chunk(const wj_doc *in, const char *format, const weei_region *data) {
    (void)in;
    int64_t n = check_chunk(format, data);
    if (n < 0) return -1;
    jw_obj_begin();
    jw_key("exampleCount"); jw_int(n);
    jw_obj_end();
    return 0;
}

/* Reads {"data": region, "format": "..."}; the example count or weei_fail. */
int64_t tfm_read_data(const wj_doc *in, weei_region *d, const char *op) {
    char format[64];
    const char *error;
    if (wj_get(in, 0, "experience") >= 0) {
        weei_msg m = { {0}, 0 };
        weei_msg_str(&m, "byte-transformer is a dataset model: ");
        weei_msg_str(&m, op);
        weei_msg_str(&m, " needs data, not experience");
        return weei_fail(m.buf);
    }
    int f = wj_get(in, 0, "format");
    if (f < 0) return weei_fail("a format is required with data");
    if (wj_string(in, f, format, sizeof format) < 0) return weei_fail("format must be a string");
    if (wj_region(in, wj_get(in, 0, "data"), d, &error) != 0) return weei_fail(error);
    int64_t n = check_chunk(format, d);
    if (n == 0) return weei_fail("weei-bytes-v1: the file has no examples");
    return n;
}

int tfm_read_step_limit(const wj_doc *in, uint32_t *limit) {
    uint64_t v;
    int t = wj_get(in, 0, "stepLimit");
    *limit = 0xFFFFFFFFu;
    if (t < 0) return 0;
    if (wj_uint(in, t, &v) != 0 || v < 1 || v > 0xFFFFFFFFu) return weei_fail("stepLimit must be a positive integer");
    *limit = (uint32_t)v;
    return 0;
}

int model_train(const wj_doc *in) {
    if (!g_has_weights) return weei_fail("train called before loadModel");
    weei_region d;
    int64_t n64 = tfm_read_data(in, &d, "train");
    if (n64 < 0) return -1;
    uint32_t n = (uint32_t)n64;
    weei_settings s;
    if (weei_read_settings(in, &s, DEFAULT_BATCH, DEFAULT_LR) != 0) return -1;
    uint64_t seed;
    if (weei_read_seed(in, &seed) != 0) return -1;
    uint32_t step_limit;
    if (tfm_read_step_limit(in, &step_limit) != 0) return -1;
    uint32_t batch = s.batch_size < n ? s.batch_size : n;
    uint32_t micro = batch < MICRO_BATCH ? batch : MICRO_BATCH;

    tfm_work w;
    weei_adam adam;
    uint32_t *order = weei_malloc((size_t)n * 4);
    float *grad = weei_malloc(TFM_WEIGHT_BYTES);
    float *part = batch > micro ? weei_malloc(TFM_WEIGHT_BYTES) : 0;
    if (!order || !grad || (batch > micro && !part) || tfm_work_alloc(&w, micro) != 0) {
        weei_mfree(order); weei_mfree(grad); weei_mfree(part);
        return weei_fail("out of memory");
    }
    if (weei_adam_init(&adam, TFM_N_PARAMS, s.learning_rate) != 0) {
        tfm_work_free(&w); weei_mfree(order); weei_mfree(grad); weei_mfree(part);
        return weei_fail("out of memory");
    }
    float *p = g_out;
    weei_memcopy(p, g_loaded, TFM_WEIGHT_BYTES);
    weei_rng r;
    weei_rng_seed(&r, seed);
    const uint8_t *records = d.data + TFM_HEADER;
    double loss_sum = 0.0;
    uint32_t correct = 0, steps = 0;
    uint64_t processed = 0, total = (uint64_t)n * s.local_epochs;
    static const char *const ids[2] = { "loss", "accuracy" };

    for (uint32_t epoch = 0; epoch < s.local_epochs && steps < step_limit; epoch++) {
        for (uint32_t i = 0; i < n; i++) order[i] = i;
        weei_shuffle_u32(&r, order, n);
        for (uint32_t start = 0; start < n && steps < step_limit; start += batch) {
            uint32_t count = n - start < batch ? n - start : batch;
            if (count <= micro) {
                tfm_gather(&w, records, order + start, count);
                loss_sum += tfm_loss(&w, p, count, grad, &correct) * count;
            } else {
                /* tfm_loss gives the mean gradient of its records: weigh each part by its share */
                weei_memzero(grad, TFM_WEIGHT_BYTES);
                for (uint32_t m = 0; m < count; m += micro) {
                    uint32_t c = count - m < micro ? count - m : micro;
                    tfm_gather(&w, records, order + start + m, c);
                    loss_sum += tfm_loss(&w, p, c, part, &correct) * c;
                    float share = (float)c / (float)count;
                    for (uint32_t i = 0; i < TFM_N_PARAMS; i++) grad[i] += share * part[i];
                }
            }
            weei_adam_step(&adam, p, grad);
            steps++;
            processed += count;
            double mv[2] = { loss_sum / (double)processed, (double)correct / ((double)processed * TFM_T) };
            weei_progress(processed, total, ids, mv, 2);
        }
    }
    weei_adam_free(&adam);
    tfm_work_free(&w);
    weei_mfree(order);
    weei_mfree(grad);
    weei_mfree(part);
    for (uint32_t i = 0; i < TFM_N_PARAMS; i++)
        if (!weei_isfinite_f32(p[i])) return weei_fail("training diverged: a weight is not finite (lower the learning rate)");

    jw_obj_begin();
    jw_key("weights"); jw_region(p, TFM_WEIGHT_BYTES);
    jw_key("metrics");
    jw_obj_begin();
    jw_key("loss"); jw_num(loss_sum / (double)processed);
    jw_key("accuracy"); jw_num((double)correct / ((double)processed * TFM_T));
    jw_obj_end();
    jw_key("uniqueExamples"); jw_uint(processed < n ? processed : n);
    jw_key("optimizerSteps"); jw_uint(steps);
    jw_obj_end();
    return 0;
}

int model_evaluate(const wj_doc *in) {
    if (!g_has_weights) return weei_fail("evaluate called before loadModel");
    weei_region d;
    int64_t n64 = tfm_read_data(in, &d, "evaluate");
    if (n64 < 0) return -1;
    uint32_t n = (uint32_t)n64;
    tfm_work w;
    if (tfm_work_alloc(&w, EVAL_BATCH) != 0) return weei_fail("out of memory");
    double loss_sum = 0.0;
    uint32_t correct = 0;
    for (uint32_t start = 0; start < n; start += EVAL_BATCH) {
        uint32_t count = n - start < EVAL_BATCH ? n - start : EVAL_BATCH;
        tfm_gather(&w, d.data + TFM_HEADER + (size_t)start * TFM_RECORD, 0, count);
        loss_sum += tfm_loss(&w, g_loaded, count, 0, &correct) * count;
    }
    tfm_work_free(&w);
    jw_obj_begin();
    jw_key("metrics");
    jw_obj_begin();
    jw_key("loss"); jw_num(loss_sum / (double)n);
    jw_key("accuracy"); jw_num((double)correct / ((double)n * TFM_T));
    jw_obj_end();
    jw_key("examples"); jw_uint(n);
    jw_obj_end();
    return 0;
}
