/*
 * op_overhead.c — the fixed cost of one tk_op_run on host tensors: resolving the op, binding and
 * checking the arguments and picking the CPU implementation, measured on ops too small to cost
 * anything else (silu_and_mul of one element pair, rms_norm of one 8-wide row), and the same calls on
 * a decode step's shapes (SmolLM-135M: hidden 576) for comparison. bench/RESULTS.md has the figures.
 * With --device cuda, the same calls on GPU tensors: the host's cost of a launch through the op registry
 * (dispatch, self-test routing, autotune's lookup, the launch itself; TK_AUTOTUNE=0 and TK_SELFTEST=off
 * leave parts out), the loop timed without waiting for the GPU, then once more with a sync at its end.
 * Needs the activation and rmsnorm packages installed (tk get) for the GPU's kernels.
 *
 *     build/bench/op_overhead [calls=200000] [--device cuda]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tk.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static tk_tensor host(float *data, int ndim, int64_t *shape)
{
    tk_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.device.device_type = TK_DEV_CPU;
    t.ndim = ndim;
    t.dtype = (tk_dtype){TK_DL_FLOAT, 32, 1};
    t.shape = shape;
    return t;
}

static double per_call(tk_ctx *ctx, const char *op, tk_arg *a, size_t n, long calls, const char **impl)
{
    for (int i = 0; i < 1000; i++)
        tk_op_run(ctx, op, a, n, NULL, impl);
    double t0 = now();
    for (long i = 0; i < calls; i++)
        if (tk_op_run(ctx, op, a, n, NULL, impl) != TK_OK) {
            fprintf(stderr, "%s: %s\n", op, tk_last_error());
            exit(1);
        }
    return (now() - t0) / (double)calls * 1e9;
}

/* t's bytes copied to a new buffer on cuda:0, t pointing at it. */
static int to_gpu(tk_tensor *t, size_t n)
{
    void *d = NULL;
    if (tk_device_alloc(&d, 0, n * sizeof(float)) != TK_OK ||
        tk_device_copy(d, t->data, n * sizeof(float), TK_COPY_H2D, 0) != TK_OK)
        return 0;
    t->data = d;
    t->device.device_type = TK_DEV_CUDA;
    t->device.device_id = 0;
    return 1;
}

/* The GPU's per-call host cost: launches only, then the same with the GPU waited for at the end. */
static int gpu_calls(tk_ctx *ctx, long calls)
{
    int n = 0;
    if (tk_device_count(&n) != TK_OK || n < 1) {
        printf("cuda: no GPU here, skipped\n");
        return 0;
    }
    static float in[2 * 1536], out[1536], w[576], res[576];
    for (int i = 0; i < 2 * 1536; i++)
        in[i] = (float)(i % 7) * 0.1f;
    for (int i = 0; i < 576; i++)
        w[i] = 1, res[i] = 0.5f;
    int64_t s_in[2] = {1, 3072}, s_out[2] = {1, 1536}, s_r[2] = {1, 576}, s_w[1] = {576};
    tk_tensor ti = host(in, 2, s_in), to = host(out, 2, s_out), tr = host(res, 2, s_r), tw = host(w, 1, s_w),
              tx = host(in, 2, s_r);
    if (!to_gpu(&ti, 3072) || !to_gpu(&to, 1536) || !to_gpu(&tr, 576) || !to_gpu(&tw, 576) || !to_gpu(&tx, 576)) {
        fprintf(stderr, "cuda: %s\n", tk_last_error());
        return 1;
    }
    tk_arg act[] = {{TK_ARG_TENSOR, "out", &to, 0, 0}, {TK_ARG_TENSOR, "input", &ti, 0, 0}};
    tk_arg nrm[] = {{TK_ARG_TENSOR, "input", &tx, 0, 0},
                    {TK_ARG_TENSOR, "residual", &tr, 0, 0},
                    {TK_ARG_TENSOR, "weight", &tw, 0, 0},
                    {TK_ARG_F64, "eps", NULL, 0, 1e-5}};
    const char *impl = NULL;
    const char *ops[2] = {"silu_and_mul [1, 3072]", "fused_add_rms_norm [1, 576]"};
    for (int o = 0; o < 2; o++) {
        tk_arg *a = o ? nrm : act;
        const char *op = o ? "fused_add_rms_norm" : "silu_and_mul";
        double issue = per_call(ctx, op, a, o ? 4 : 2, calls, &impl);
        double t0 = now();
        for (long i = 0; i < calls; i++)
            if (tk_op_run(ctx, op, a, o ? 4 : 2, NULL, &impl) != TK_OK)
                break;
        int rc = tk_device_sync(0);
        double synced = (now() - t0) / (double)calls * 1e9;
        printf("cuda %-28s %-30s %8.0f ns a call issued, %8.0f ns with the GPU waited for%s\n", ops[o],
               impl ? impl : "?", issue, synced, rc == TK_OK ? "" : " (sync failed)");
    }
    return 0;
}

int main(int argc, char **argv)
{
    long calls = argc > 1 && argv[1][0] != '-' ? strtol(argv[1], NULL, 10) : 200000;
    int cuda = 0;
    for (int i = 1; i < argc; i++)
        cuda |= !strcmp(argv[i], "--device") && i + 1 < argc && !strcmp(argv[i + 1], "cuda");
    tk_ctx *ctx = NULL;
    if (tk_ctx_new(&ctx, NULL) != TK_OK) {
        fprintf(stderr, "tk_ctx_new: %s\n", tk_last_error());
        return 1;
    }
    static float in[2 * 1536], out[1536], w[1536], res[1536];
    for (int i = 0; i < 2 * 1536; i++)
        in[i] = (float)(i % 7) * 0.1f;
    for (int i = 0; i < 1536; i++)
        w[i] = 1, res[i] = 0.5f;
    const char *impl = NULL;
    int64_t s_in[2] = {1, 2}, s_out[2] = {1, 1}, s_r[2] = {1, 8}, s_w[1] = {8};
    tk_tensor ti = host(in, 2, s_in), to = host(out, 2, s_out), tr = host(res, 2, s_r), tw = host(w, 1, s_w),
              tx = host(in, 2, s_r);
    tk_arg act[] = {{TK_ARG_TENSOR, "out", &to, 0, 0}, {TK_ARG_TENSOR, "input", &ti, 0, 0}};
    tk_arg nrm[] = {{TK_ARG_TENSOR, "input", &tx, 0, 0},
                    {TK_ARG_TENSOR, "residual", &tr, 0, 0},
                    {TK_ARG_TENSOR, "weight", &tw, 0, 0},
                    {TK_ARG_F64, "eps", NULL, 0, 1e-5}};
    printf("threads %d\n", tk_ctx_threads(ctx));
    double a = per_call(ctx, "silu_and_mul", act, 2, calls, &impl);
    printf("silu_and_mul [1, 2]            %-14s %8.0f ns per tk_op_run\n", impl, a);
    double b = per_call(ctx, "fused_add_rms_norm", nrm, 4, calls, &impl);
    printf("fused_add_rms_norm [1, 8]      %-14s %8.0f ns per tk_op_run\n", impl, b);
    /* a decode step's shapes */
    int64_t s_in2[2] = {1, 3072}, s_out2[2] = {1, 1536}, s_r2[2] = {1, 576}, s_w2[1] = {576};
    static float big[3072];
    tk_tensor ti2 = host(big, 2, s_in2), to2 = host(out, 2, s_out2), tr2 = host(res, 2, s_r2), tw2 = host(w, 1, s_w2),
              tx2 = host(in, 2, s_r2);
    tk_arg act2[] = {{TK_ARG_TENSOR, "out", &to2, 0, 0}, {TK_ARG_TENSOR, "input", &ti2, 0, 0}};
    tk_arg nrm2[] = {{TK_ARG_TENSOR, "input", &tx2, 0, 0},
                     {TK_ARG_TENSOR, "residual", &tr2, 0, 0},
                     {TK_ARG_TENSOR, "weight", &tw2, 0, 0},
                     {TK_ARG_F64, "eps", NULL, 0, 1e-5}};
    double c = per_call(ctx, "silu_and_mul", act2, 2, calls / 4, &impl);
    printf("silu_and_mul [1, 3072]         %-14s %8.0f ns per tk_op_run\n", impl, c);
    double d = per_call(ctx, "fused_add_rms_norm", nrm2, 4, calls / 4, &impl);
    printf("fused_add_rms_norm [1, 576]    %-14s %8.0f ns per tk_op_run\n", impl, d);
    printf("a SmolLM-135M decode step runs 363 ops: about %.0f us of fixed cost at %.0f ns each\n",
           363 * (a + b) / 2 / 1000, (a + b) / 2);
    int rc = cuda ? gpu_calls(ctx, calls / 10) : 0;
    tk_ctx_free(ctx);
    return rc;
}
