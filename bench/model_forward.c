/*
 * model_forward.c — CPU forward throughput of a checkpoint through tk_model_forward: loads DIR,
 * runs one warm-up forward on `tokens` ids (0, 1, 2, ... modulo the vocabulary; a BERT gets its
 * hidden states, a causal LM its logits), then `iters` timed ones, and prints one JSON line
 * {"tokens": T, "iters": N, "ms_per_forward": ..., "tokens_per_s": ...}.
 *
 *     build/bench/model_forward DIR [tokens=128] [iters=5] [dtype=f32]
 *
 * bench/models_cpu.sh runs it beside transformers on the same checkpoint and prompt.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "tk.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s DIR [tokens] [iters] [dtype]\n", argv[0]);
        return 2;
    }
    size_t T = argc > 2 ? (size_t)strtoul(argv[2], NULL, 10) : 128;
    int iters = argc > 3 ? atoi(argv[3]) : 5;
    tk_ctx *ctx = NULL;
    tk_model *m = NULL;
    tk_model_opts o = TK_MODEL_OPTS_INIT;
    o.dtype = argc > 4 ? argv[4] : "f32";
    if (T == 0 || iters <= 0 || tk_ctx_new(&ctx, NULL) != TK_OK || tk_model_load(&m, ctx, argv[1], &o) != TK_OK) {
        fprintf(stderr, "model_forward: %s\n", tk_last_error());
        return 1;
    }
    int64_t V = tk_model_vocab_size(m), H = tk_model_hidden_size(m);
    int lm = tk_model_has_lm_head(m);
    int32_t *ids = malloc(T * sizeof *ids);
    float *out = malloc(T * (size_t)(lm ? V : H) * sizeof *out);
    for (size_t i = 0; i < T; i++)
        ids[i] = (int32_t)(i % (size_t)V);
    int rc = TK_OK;
    double best = 1e30, total = 0;
    for (int it = 0; it <= iters && rc == TK_OK; it++) {
        double t0 = now_ms();
        rc = tk_model_forward(m, ids, &T, 1, lm ? out : NULL, lm ? NULL : out);
        double dt = now_ms() - t0;
        if (it > 0) { /* the first forward plans the activations: a warm-up */
            total += dt;
            best = dt < best ? dt : best;
        }
    }
    if (rc != TK_OK) {
        fprintf(stderr, "model_forward: %s\n", tk_last_error());
        return 1;
    }
    double mean = total / iters;
    printf("{\"tokens\": %zu, \"iters\": %d, \"ms_per_forward\": %.2f, \"best_ms\": %.2f, \"tokens_per_s\": %.1f}\n", T,
           iters, mean, best, T / (mean / 1e3));
    free(ids);
    free(out);
    tk_model_free(m);
    tk_ctx_free(ctx);
    return 0;
}
