/* Native driver for bench/bench_training.py: the same model C as the wasm
 * build, compiled with clang -O3 -march=native and linked with this main.
 * It runs the same operations with the same JSON inputs as the Python side
 * does through weei.runtime, and prints the time and
 * an FNV-1a 64 fingerprint of the final weights, so both sides can be checked
 * to have done identical work.
 *
 *   bench dataset FORMAT SEED EPOCHS BATCH FILE...   train FILE by FILE, EPOCHS passes
 *   bench experience SEED ASSIGNMENTS UNITS          ASSIGNMENTS trains of UNITS episodes
 *
 * Each train starts from the previous train's weights (loadModel first).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../sdk/weei_sdk.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef uint32_t (*op_fn)(uint32_t, uint32_t);

static wj_doc g_result_doc;

/* Calls op with the input text; parses the result into g_result_doc. */
static const char *call(op_fn op, const char *json) {
    uint32_t n = (uint32_t)strlen(json);
    uint32_t in = weei_alloc_export(n);
    memcpy(weei_addr(in), json, n);
    uint32_t out = op(in, n);
    weei_free_export(in);
    const char *text = (const char *)weei_addr(out);
    uint32_t len = weei_result_length();
    const char *error;
    /* copy: the result buffer is reused by the next call */
    char *copy = malloc(len + 1);
    memcpy(copy, text, len);
    copy[len] = 0;
    if (wj_parse(&g_result_doc, copy, len, &error) != 0 || wj_get(&g_result_doc, 0, "error") >= 0) {
        fprintf(stderr, "operation failed: %.*s\n", (int)len, text);
        exit(1);
    }
    return copy;
}

static uint32_t g_weights, g_weight_bytes;

/* Keeps a copy of the result's weights region in module memory. */
static void take_weights(void) {
    weei_region r;
    const char *error;
    if (wj_region(&g_result_doc, wj_get(&g_result_doc, 0, "weights"), &r, &error) != 0) {
        fprintf(stderr, "no weights: %s\n", error);
        exit(1);
    }
    if (!g_weights) g_weights = weei_alloc_export(r.bytes);
    g_weight_bytes = r.bytes;
    memcpy(weei_addr(g_weights), r.data, r.bytes);
}

static void load_weights(void) {
    char json[128];
    snprintf(json, sizeof json, "{\"weights\":{\"ptr\":%u,\"bytes\":%u}}", g_weights, g_weight_bytes);
    free((void *)call(weei_op_load_model, json));
}

static uint64_t fnv1a(const uint8_t *p, uint32_t n) {
    uint64_t h = 1469598103934665603ull;
    for (uint32_t i = 0; i < n; i++) { h ^= p[i]; h *= 1099511628211ull; }
    return h;
}

static uint8_t *read_file(const char *path, uint32_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(1); }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)n);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) { perror(path); exit(1); }
    fclose(f);
    *size = (uint32_t)n;
    return buf;
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: see bench_main.c\n"); return 2; }
    const char *first = call(weei_op_create_initial_weights, "{\"seed\":\"1\"}");
    take_weights();
    free((void *)first);
    char json[512];
    uint64_t units = 0, calls = 0;
    double elapsed = 0.0;
    if (strcmp(argv[1], "dataset") == 0 && argc >= 7) {
        const char *format = argv[2];
        uint64_t seed = strtoull(argv[3], 0, 10);
        int epochs = atoi(argv[4]), batch = atoi(argv[5]);
        int nfiles = argc - 6;
        uint32_t *regions = malloc(sizeof(uint32_t) * (size_t)nfiles), *sizes = malloc(sizeof(uint32_t) * (size_t)nfiles);
        for (int k = 0; k < nfiles; k++) {
            uint8_t *data = read_file(argv[6 + k], &sizes[k]);
            regions[k] = weei_alloc_export(sizes[k]);
            memcpy(weei_addr(regions[k]), data, sizes[k]);
            free(data);
        }
        double t0 = now();
        for (int e = 0; e < epochs; e++) {
            for (int k = 0; k < nfiles; k++) {
                load_weights();
                snprintf(json, sizeof json,
                         "{\"data\":{\"ptr\":%u,\"bytes\":%u},\"format\":\"%s\",\"seed\":\"%" PRIu64 "\","
                         "\"settings\":{\"localEpochs\":1,\"batchSize\":%d}}",
                         regions[k], sizes[k], format, seed + (uint64_t)(e * nfiles + k), batch);
                const char *text = call(weei_op_train, json);
                uint64_t n;
                wj_uint(&g_result_doc, wj_get(&g_result_doc, 0, "uniqueExamples"), &n);
                units += n;
                calls++;
                take_weights();
                free((void *)text);
            }
        }
        elapsed = now() - t0;
    } else if (strcmp(argv[1], "experience") == 0 && argc == 5) {
        uint64_t seed = strtoull(argv[2], 0, 10);
        int assignments = atoi(argv[3]), count = atoi(argv[4]);
        double t0 = now();
        for (int a = 0; a < assignments; a++) {
            load_weights();
            snprintf(json, sizeof json,
                     "{\"experience\":{\"unitStart\":%d,\"unitCount\":%d,\"seed\":\"%" PRIu64 "\"},"
                     "\"settings\":{\"localEpochs\":1,\"batchSize\":16}}",
                     a * count, count, seed + (uint64_t)a);
            const char *text = call(weei_op_train, json);
            uint64_t n;
            wj_uint(&g_result_doc, wj_get(&g_result_doc, 0, "completedUnits"), &n);
            units += n;
            calls++;
            take_weights();
            free((void *)text);
        }
        elapsed = now() - t0;
    } else {
        fprintf(stderr, "usage: see bench_main.c\n");
        return 2;
    }
    printf("{\"units\":%" PRIu64 ",\"calls\":%" PRIu64 ",\"seconds\":%.6f,\"weightsFnv1a\":\"%016" PRIx64 "\"}\n",
           units, calls, elapsed, fnv1a(weei_addr(g_weights), g_weight_bytes));
    return 0;
}
