/*
 * test_gpu_sampling.c — kernels-community/sampling on a GPU against the CPU references, through
 * tk_op_run on CUDA tensors. Skips without a CUDA device.
 *
 * Both ops are exact: argmax is a comparison, and sample is defined with integer weights computed by
 * the same fp32 operations on both sides (ops/sampling.c), so every token must equal the CPU's:
 *   argmax: f32/f16/bf16, rows of 1 to 2M (both tiers), planted ties, NaN, -0, all -inf rows;
 *   sample: vocabularies of 1 to 262144, greedy, temperature, top-k, top-p and both, per-row
 *           temperatures / top_ks / top_ps / seeds, NaN / +inf / all -inf rows, rows of 9 tied levels
 *           (top-p's partial tie at its boundary), several seeds; and the draws of the issue's
 *           TopPLogitsWarper tie example.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_util.h"
#include "harness.h"
#include "op_test.h"
#include "tensor_util.h"

/* [rows, v] (ndim 2) or [rows] (ndim 1). */
static void host_rows(host_t *h, tk_dtype dt, int ndim, int64_t rows, int64_t v)
{
    int64_t shape[2] = {rows, v};
    host_new(h, dt, ndim, shape, 0);
}

static gpu_ctx g;

/* Random logits with a few boosted tokens (a peaked distribution, as real logits), some planted ties
 * and, when special, rows with NaN, +inf and nothing above -inf. */
static void fill_logits(host_t *x, int64_t rows, int64_t v, int special)
{
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < v; i++)
            set(&x->t, r * v + i, uniform(-6, 6) + (next_u64() % 97 == 0 ? 6 : 0));
        int64_t a = (int64_t)(next_u64() % (uint64_t)v), b = (int64_t)(next_u64() % (uint64_t)v);
        set(&x->t, r * v + a, 14);
        set(&x->t, r * v + b, 14); /* a tie for the max */
    }
    if (!special || rows < 4)
        return;
    set(&x->t, 0 * v + v / 2, NAN);
    set(&x->t, 1 * v + v / 3, INFINITY);
    set(&x->t, 1 * v + v - 1, INFINITY);
    for (int64_t i = 0; i < v; i++)
        set(&x->t, 2 * v + i, i % 2 ? -INFINITY : NAN);
    set(&x->t, 3 * v + v - 1, -0.0);
}

/* Runs op with args on the CPU (out = cpu) and with every tensor uploaded (out = gpu). */
static int run_both(const char *op, tk_arg *args, size_t n, host_t *cpu, host_t *gpu, const char **impl)
{
    dev_tensor dev[12];
    const tk_tensor *host[12];
    int rc = gpu_op_run(g.ctx, op, args, n, NULL, NULL);
    if (rc != TK_OK) {
        fprintf(stderr, "%s on the CPU: %s\n", op, tk_last_error());
        return rc;
    }
    for (size_t i = 0; i < n; i++) {
        host[i] = args[i].t;
        memset(&dev[i], 0, sizeof dev[i]);
        if (args[i].kind != TK_ARG_TENSOR)
            continue;
        const tk_tensor *src = args[i].t == &cpu->t ? &gpu->t : args[i].t;
        if ((rc = dev_upload(&dev[i], src)) != TK_OK)
            goto done;
        args[i].t = &dev[i].t;
    }
    rc = gpu_op_run(g.ctx, op, args, n, NULL, impl);
    if (rc != TK_OK)
        fprintf(stderr, "%s on the GPU: %s\n", op, tk_last_error());
    for (size_t i = 0; rc == TK_OK && i < n; i++)
        if (host[i] == &cpu->t)
            rc = dev_download(&dev[i], &gpu->t);
done:
    for (size_t i = 0; i < n; i++) {
        args[i].t = host[i];
        dev_free(&dev[i]);
    }
    return rc;
}

static int64_t mismatches(const host_t *a, const host_t *b, int64_t rows, const char *what)
{
    int64_t bad = 0;
    for (int64_t r = 0; r < rows; r++)
        if (((int64_t *)a->buf)[r] != ((int64_t *)b->buf)[r]) {
            if (!bad)
                fprintf(stderr, "%s: row %lld: gpu %lld, cpu %lld (seed %llu)\n", what, (long long)r,
                        (long long)((int64_t *)b->buf)[r], (long long)((int64_t *)a->buf)[r], (unsigned long long)seed);
            bad++;
        }
    return bad;
}

static void test_argmax(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    const char *pkgs[] = {"kernels-community/sampling", NULL};
    CHECK_RC(gpu_ctx_new(&g, pkgs), TK_OK);
    static const tk_dtype *dts[] = {&F32, &F16, &BF16};
    static const int64_t shapes[][2] = {{1, 1}, {3, 7}, {64, 1000}, {4, 16384}, {4, 16385}, {5, 151936}, {2, 2097152}};
    for (size_t t = 0; t < 3; t++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int64_t rows = shapes[s][0], v = shapes[s][1];
            host_t x, cpu, gpu;
            host_rows(&x, *dts[t], 2, rows, v);
            host_rows(&cpu, I64, 1, rows, 1);
            host_rows(&gpu, I64, 1, rows, 1);
            fill_logits(&x, rows, v, 1);
            tk_arg args[] = {{TK_ARG_TENSOR, "out", &cpu.t, 0, 0}, {TK_ARG_TENSOR, "input", &x.t, 0, 0}};
            const char *impl = NULL;
            CHECK_RC(run_both("argmax", args, 2, &cpu, &gpu, &impl), TK_OK);
            CHECK(impl && (strstr(impl, "_split") != NULL) == (v > 16384));
            char what[96];
            snprintf(what, sizeof what, "argmax %s [%lld, %lld] (%s)", tk_dtype_name(*dts[t]), (long long)rows,
                     (long long)v, impl ? impl : "?");
            CHECK(mismatches(&cpu, &gpu, rows, what) == 0);
            free(x.buf);
            free(cpu.buf);
            free(gpu.buf);
        }
    gpu_ctx_free(&g);
}

typedef struct {
    double t;
    int64_t k;
    double p;
    int per_row;
    int ties; /* logits from 9 levels only: top-p's boundary falls in a tie of thousands of tokens */
} config;

/* Rows of logits 0, 0.25, ..., 2 (exact in every dtype), so every value is tied many times. */
static void fill_ties(host_t *x, int64_t rows, int64_t v)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < v; i++)
            set(&x->t, r * v + i, 0.25 * (double)(next_u64() % 9));
}

static void sample_case(tk_dtype dt, int64_t rows, int64_t v, const config *c, int64_t sd)
{
    host_t x, cpu, gpu, temps, ks, ps, seeds;
    host_rows(&x, dt, 2, rows, v);
    host_rows(&cpu, I64, 1, rows, 1);
    host_rows(&gpu, I64, 1, rows, 1);
    host_rows(&temps, F32, 1, rows, 1);
    host_rows(&ks, I32, 1, rows, 1);
    host_rows(&ps, F32, 1, rows, 1);
    host_rows(&seeds, I64, 1, rows, 1);
    if (c->ties)
        fill_ties(&x, rows, v);
    else
        fill_logits(&x, rows, v, 1);
    for (int64_t r = 0; r < rows; r++) {
        set(&temps.t, r, r % 5 == 0 ? 0.0 : uniform(0.3, 2));
        ((int32_t *)ks.buf)[r] = r % 3 == 0 ? 0 : (int32_t)(1 + next_u64() % 200);
        set(&ps.t, r, r % 4 == 0 ? 1.0 : uniform(0.05, 0.99));
        ((int64_t *)seeds.buf)[r] = (int64_t)next_u64();
    }
    tk_arg args[11] = {{TK_ARG_TENSOR, "out", &cpu.t, 0, 0},       {TK_ARG_TENSOR, "logits", &x.t, 0, 0},
                       {TK_ARG_F64, "temperature", NULL, 0, c->t}, {TK_ARG_I64, "top_k", NULL, c->k, 0},
                       {TK_ARG_F64, "top_p", NULL, 0, c->p},       {TK_ARG_I64, "seed", NULL, sd, 0},
                       {TK_ARG_I64, "offset", NULL, sd % 1000, 0}};
    size_t n = 7;
    if (c->per_row) {
        args[n++] = (tk_arg){TK_ARG_TENSOR, "temperatures", &temps.t, 0, 0};
        args[n++] = (tk_arg){TK_ARG_TENSOR, "top_ks", &ks.t, 0, 0};
        args[n++] = (tk_arg){TK_ARG_TENSOR, "top_ps", &ps.t, 0, 0};
        args[n++] = (tk_arg){TK_ARG_TENSOR, "seeds", &seeds.t, 0, 0};
    }
    const char *impl = NULL;
    CHECK_RC(run_both("sample", args, n, &cpu, &gpu, &impl), TK_OK);
    char what[160];
    snprintf(what, sizeof what, "sample %s [%lld, %lld] T %g top_k %lld top_p %g%s%s seed %lld (%s)", tk_dtype_name(dt),
             (long long)rows, (long long)v, c->t, (long long)c->k, c->p, c->per_row ? " per-row" : "",
             c->ties ? " ties" : "", (long long)sd, impl ? impl : "?");
    CHECK(mismatches(&cpu, &gpu, rows, what) == 0);
    free(x.buf);
    free(cpu.buf);
    free(gpu.buf);
    free(temps.buf);
    free(ks.buf);
    free(ps.buf);
    free(seeds.buf);
}

static void test_sample(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    const char *pkgs[] = {"kernels-community/sampling", NULL};
    CHECK_RC(gpu_ctx_new(&g, pkgs), TK_OK);
    static const tk_dtype *dts[] = {&F32, &F16, &BF16};
    static const int64_t shapes[][2] = {{1, 1}, {7, 7}, {64, 1000}, {8, 32000}, {4, 151936}, {2, 262144}};
    static const config configs[] = {
        {1.0, 0, 1.0, 0, 0},    {0.0, 0, 1.0, 0, 0},   {0.7, 50, 1.0, 0, 0}, {1.2, 0, 0.9, 0, 0},
        {0.8, 100, 0.95, 0, 0}, {1.0, 1, 1.0, 0, 0},   {1.0, 0, 1e-6, 0, 0}, {1.0, 0, 1.0, 1, 0},
        {1.0, 0, 0.5, 0, 1},    {0.9, 300, 0.7, 0, 1}, {1.0, 0, 0.9, 1, 1},
    };
    for (size_t t = 0; t < 3; t++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (size_t c = 0; c < sizeof configs / sizeof configs[0]; c++)
                for (int k = 0; k < 2; k++)
                    sample_case(*dts[t], shapes[s][0], shapes[s][1], &configs[c], (int64_t)next_u64());
    gpu_ctx_free(&g);
}

/* The example on the GPU: TopPLogitsWarper(0.5) keeps {0, 3, 7} of these logits, of the four
 * tied at 1 only the two the mass needs (the highest ids); 2000 draws hit all three and nothing else,
 * and every token equals the CPU's. */
static void test_sample_top_p_ties(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    const char *pkgs[] = {"kernels-community/sampling", NULL};
    CHECK_RC(gpu_ctx_new(&g, pkgs), TK_OK);
    static const double row[12] = {2, 1, 1, 1, .5, 0, -1, 1, -2, .3, .2, .1};
    static const tk_dtype *dts[] = {&F32, &F16, &BF16};
    const int64_t rows = 2000;
    for (size_t t = 0; t < 3; t++) {
        host_t x, cpu, gpu;
        host_rows(&x, *dts[t], 2, rows, 12);
        host_rows(&cpu, I64, 1, rows, 1);
        host_rows(&gpu, I64, 1, rows, 1);
        for (int64_t r = 0; r < rows; r++)
            for (int i = 0; i < 12; i++)
                set(&x.t, r * 12 + i, row[i]);
        tk_arg args[7] = {{TK_ARG_TENSOR, "out", &cpu.t, 0, 0},      {TK_ARG_TENSOR, "logits", &x.t, 0, 0},
                          {TK_ARG_F64, "temperature", NULL, 0, 1.0}, {TK_ARG_I64, "top_k", NULL, 0, 0},
                          {TK_ARG_F64, "top_p", NULL, 0, 0.5},       {TK_ARG_I64, "seed", NULL, (int64_t)next_u64(), 0},
                          {TK_ARG_I64, "offset", NULL, 0, 0}};
        CHECK_RC(run_both("sample", args, 7, &cpu, &gpu, NULL), TK_OK);
        CHECK(mismatches(&cpu, &gpu, rows, "sample top-p ties example") == 0);
        int hit[12] = {0};
        for (int64_t r = 0; r < rows; r++) {
            int64_t k = ((int64_t *)gpu.buf)[r];
            CHECK(k == 0 || k == 3 || k == 7);
            if (k >= 0 && k < 12)
                hit[k] = 1;
        }
        CHECK(hit[0] && hit[3] && hit[7]);
        free(x.buf);
        free(cpu.buf);
        free(gpu.buf);
    }
    gpu_ctx_free(&g);
}

static void test_coverage(void)
{
    const char *pkgs[] = {"kernels-community/sampling", NULL};
    gpu_coverage_check(pkgs);
}

int main(int argc, char **argv)
{
    static const char *const ops[] = {"argmax", "sample", NULL};
    gpu_main(argc, argv, ops);
    op_test_seed();
    RUN(test_argmax);
    RUN(test_sample);
    RUN(test_sample_top_p_ties);
    RUN(test_coverage);
    return th_done();
}
