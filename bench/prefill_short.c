/*
 * prefill_short.c — warm prefill time of short prompts through tk_generate, as a server sees it: loads
 * DIR, warms the model up with a two-token generation (as `tk serve-model` does before /health), then
 * for each prompt length T runs `iters` generations of one new token on a prompt of T ids (a fresh
 * prompt each time: ids shifted per run) and prints one JSON line per T with the best and the median
 * prefill_ms from the result's stats, and the median CPU time of the process over each generation
 * (cpu_ms: prefill and the first token's sampling; with TK_NUM_THREADS=1 the figure a loaded machine
 * disturbs least).
 *
 *     build/bench/prefill_short DIR [iters=7] [T ...]   (default lengths 1 4 8 16 22 32 64)
 *     PREFILL_QUANT=int8: weight-only quantisation (tk_model_quantize, as --quant int8)
 *     PREFILL_DTYPE=bf16 (or f16, auto): the model's --dtype (default f32; a bf16 checkpoint keeps its
 *     weights as bf16 with bf16 or auto)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tk.h"

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static int prefill_ms(double *ms, double *cpu, tk_model *m, const int32_t *ids, size_t n, int64_t new_tokens)
{
    tk_gen_opts o = TK_GEN_OPTS_INIT;
    o.max_new_tokens = new_tokens;
    tk_gen_result *r = NULL;
    char *js = NULL;
    const int32_t *p = ids;
    double c0 = cpu_now();
    int rc = tk_generate(&r, m, &p, &n, 1, &o);
    *cpu = cpu_now() - c0;
    if (rc == TK_OK)
        rc = tk_gen_result_stats_json(&js, r);
    if (rc == TK_OK) {
        const char *f = strstr(js, "\"prefill_ms\"");
        *ms = f ? strtod(strchr(f, ':') + 1, NULL) : -1;
    }
    tk_free(js);
    tk_gen_result_free(r);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s DIR [iters] [T ...]\n", argv[0]);
        return 2;
    }
    int iters = argc > 2 ? atoi(argv[2]) : 7;
    size_t deflens[] = {1, 4, 8, 16, 22, 32, 64}, nlens = argc > 3 ? (size_t)(argc - 3) : 7;
    size_t *lens = malloc(nlens * sizeof *lens);
    for (size_t i = 0; i < nlens; i++)
        lens[i] = argc > 3 ? strtoul(argv[3 + i], NULL, 10) : deflens[i];
    tk_ctx *ctx = NULL;
    tk_model *m = NULL;
    tk_model_opts mo = TK_MODEL_OPTS_INIT;
    mo.dtype = getenv("PREFILL_DTYPE") ? getenv("PREFILL_DTYPE") : "f32";
    if (iters <= 0 || tk_ctx_new(&ctx, NULL) != TK_OK || tk_model_load(&m, ctx, argv[1], &mo) != TK_OK) {
        fprintf(stderr, "prefill_short: %s\n", tk_last_error());
        return 1;
    }
    if (getenv("PREFILL_QUANT") && tk_model_quantize(m, getenv("PREFILL_QUANT")) != TK_OK) {
        fprintf(stderr, "prefill_short: %s\n", tk_last_error());
        return 1;
    }
    int64_t V = tk_model_vocab_size(m);
    int32_t ids[4096];
    double ms, cpu, *t = malloc((size_t)iters * sizeof *t), *tc = malloc((size_t)iters * sizeof *tc);
    for (size_t i = 0; i < 4096; i++)
        ids[i] = (int32_t)(1000 + i * 7 % (size_t)(V - 2000));
    int rc = prefill_ms(&ms, &cpu, m, ids, 2, 2); /* the warm-up */
    for (size_t l = 0; l < nlens && rc == TK_OK; l++) {
        size_t T = lens[l] < 4000 ? lens[l] : 4000;
        for (int it = 0; it < iters && rc == TK_OK; it++) {
            for (size_t i = 0; i < T; i++)
                ids[i] = (int32_t)(1000 + (i * 7 + (size_t)it * 13 + l * 101) % (size_t)(V - 2000));
            rc = prefill_ms(&t[it], &tc[it], m, ids, T, 1);
        }
        if (rc == TK_OK) {
            qsort(t, (size_t)iters, sizeof *t, cmp);
            qsort(tc, (size_t)iters, sizeof *tc, cmp);
            printf("{\"tokens\": %zu, \"iters\": %d, \"best_ms\": %.2f, \"median_ms\": %.2f, \"cpu_ms\": %.2f}\n", T,
                   iters, t[0], t[iters / 2], tc[iters / 2]);
            fflush(stdout);
        }
    }
    if (rc != TK_OK) {
        fprintf(stderr, "prefill_short: %s\n", tk_last_error());
        return 1;
    }
    free(t);
    free(tc);
    free(lens);
    tk_model_free(m);
    tk_ctx_free(ctx);
    return 0;
}
