/*
 * train_step.c — tk's side of bench/train_cpu.sh: one model's training step through the public API
 * (tk_train_accumulate + tk_train_step: forward, fused LM head + loss, backward, clip_grad_norm_,
 * AdamW) on BATCH random sequences of SEQ tokens, f32 on the CPU. One warm-up step, then STEPS timed.
 * Prints one JSON line: step time, tokens/s, the planned activation bytes, peak RSS.
 *
 *     train_step DIR SEQ BATCH STEPS [checkpointing 0|1] [fused_loss -1|0|1]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "tk.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: train_step DIR SEQ BATCH STEPS [checkpointing]\n");
        return 2;
    }
    const char *dir = argv[1];
    size_t seq = (size_t)atol(argv[2]), batch = (size_t)atol(argv[3]);
    int steps = atoi(argv[4]), ckpt = argc > 5 && atoi(argv[5]), fused = argc > 6 ? atoi(argv[6]) : -1;
    tk_ctx *ctx = NULL;
    tk_model *m = NULL;
    tk_trainer *t = NULL;
    tk_ctx_opts co = TK_CTX_OPTS_INIT;
    co.offline = 1;
    tk_model_opts mo = TK_MODEL_OPTS_INIT;
    tk_train_opts o = TK_TRAIN_OPTS_INIT;
    o.checkpointing = ckpt;
    o.fused_loss = fused;
    if (tk_ctx_new(&ctx, &co) || tk_model_load(&m, ctx, dir, &mo) || tk_train_new(&t, m, &o)) {
        fprintf(stderr, "train_step: %s\n", tk_last_error());
        return 1;
    }
    size_t T = seq * batch;
    int64_t V = tk_model_vocab_size(m);
    int32_t *ids = malloc(T * sizeof *ids);
    int64_t *tg = malloc(T * sizeof *tg);
    size_t *lens = malloc(batch * sizeof *lens);
    uint64_t r = 1;
    double t0 = 0;
    for (int s = -1; s < steps; s++) {
        if (s == 0)
            t0 = now();
        for (size_t i = 0; i < T; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            ids[i] = (int32_t)((r >> 33) % (uint64_t)V);
        }
        for (size_t b = 0; b < batch; b++) {
            lens[b] = seq;
            for (size_t i = 0; i < seq; i++)
                tg[b * seq + i] = i + 1 < seq ? ids[b * seq + i + 1] : -100;
        }
        tk_train_stats st;
        if (tk_train_accumulate(t, ids, tg, lens, batch, NULL) || tk_train_step(t, &st)) {
            fprintf(stderr, "train_step: %s\n", tk_last_error());
            return 1;
        }
    }
    double dt = (now() - t0) / steps;
    char *info = NULL;
    tk_train_info_json(&info, t);
    const char *a = info ? strstr(info, "\"activation_bytes\":") : NULL;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf(
        "{\"impl\": \"tk\", \"fused_loss\": %d, \"checkpointing\": %s, \"step_s\": %.4f, \"tokens_per_s\": %.1f, \"activation_bytes\": %lld, "
        "\"peak_rss_bytes\": %lld}\n",
        fused, ckpt ? "true" : "false", dt, (double)T / dt, a ? atoll(a + 19) : -1LL, (long long)ru.ru_maxrss * 1024);
    tk_free(info);
    free(ids);
    free(tg);
    free(lens);
    tk_train_free(t);
    tk_model_free(m);
    tk_ctx_free(ctx);
    return 0;
}
