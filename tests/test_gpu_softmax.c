/*
 * test_gpu_softmax.c — kernels-community/softmax on a GPU against the CPU references: softmax and
 * log_softmax, f32/f16/bf16, row lengths on both sides of every tier boundary (warp <= 1024 < block
 * <= 16384 < split) up to 4M elements (a split grid far larger than the GPU holds at once), rows with
 * -inf / +inf / NaN, and in place, through tk_op_run on CUDA tensors. Skips without a CUDA device.
 *
 * Tolerances: the kernels compute in fp32 with expf and a parallel sum, the CPU in double, so f32
 * results agree to ~1e-6 relative (softmax) or ~1e-6 absolute (log_softmax); f16/bf16 results may
 * differ by one unit in the last place where the two sides round differently. Special values must
 * match exactly (NaN for NaN, the same inf).
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

static void host_rows(host_t *h, tk_dtype dt, int64_t rows, int64_t d)
{
    int64_t shape[2] = {rows, d};
    host_new(h, dt, 2, shape, 0);
}

static gpu_ctx g;

static void tolerances(int is_log, tk_dtype dt, double *atol, double *rtol)
{
    /* log_softmax's atol: an output near 0 (a dominant element, -log(s) with s = 1 + tiny) is 0 when
     * the fp32 sum rounds s to 1 */
    if (dt.bits == 32) {
        *rtol = 2e-5;
        *atol = is_log ? 1e-5 : 1e-37;
    } else if (dt.code == TK_DL_BFLOAT) {
        *rtol = 0x1p-7;
        *atol = is_log ? 1e-5 : 1e-38;
    } else {
        *rtol = 0x1p-9;
        *atol = is_log ? 1e-5 : 0x1p-23;
    }
}

/* The kernel tier tk_op_run should pick for a row length (the manifest's constraints). */
static const char *tier(int64_t d) { return d <= 1024 ? "_warp" : d <= 16384 ? "_block" : "_split"; }

static void run_case(const char *op, tk_dtype dt, int64_t rows, int64_t d, int inplace)
{
    int is_log = strcmp(op, "log_softmax") == 0;
    host_t in, ref, got;
    dev_tensor din, dout;
    host_rows(&in, dt, rows, d);
    host_rows(&ref, dt, rows, d);
    host_rows(&got, dt, rows, d);
    double shift = uniform(-20, 20);
    for (int64_t i = 0; i < rows * d; i++)
        set(&in.t, i, shift + uniform(-8, 8));
    /* special rows: some -inf (far apart, in different chunks of a split row), all -inf, +inf, NaN */
    set(&in.t, d - 1, -INFINITY);
    set(&in.t, d / 2, -INFINITY);
    if (rows >= 4) {
        for (int64_t c = 0; c < d; c++)
            set(&in.t, d + c, -INFINITY);
        set(&in.t, 2 * d + (d * 3) / 4, INFINITY);
        set(&in.t, 3 * d + d / 3, NAN);
    }
    tk_arg cargs[] = {{TK_ARG_TENSOR, "out", &ref.t, 0, 0}, {TK_ARG_TENSOR, "input", &in.t, 0, 0}};
    CHECK_RC(gpu_op_run(g.ctx, op, cargs, 2, NULL, NULL), TK_OK);
    CHECK_RC(dev_upload(&din, &in.t), TK_OK);
    CHECK_RC(dev_upload(&dout, &got.t), TK_OK);
    const char *impl = NULL;
    tk_arg gargs[] = {{TK_ARG_TENSOR, "out", inplace ? &din.t : &dout.t, 0, 0}, {TK_ARG_TENSOR, "input", &din.t, 0, 0}};
    CHECK_RC(gpu_op_run(g.ctx, op, gargs, 2, NULL, &impl), TK_OK);
    CHECK(impl && strstr(impl, tier(d)) != NULL);
    CHECK_RC(dev_download(inplace ? &din : &dout, &got.t), TK_OK);

    double atol, rtol;
    tolerances(is_log, dt, &atol, &rtol);
    /* NaN must be NaN, an inf the same inf, else |got - cpu| <= atol + rtol*|cpu| (op_test.h) */
    op_cmp c = op_cmp_begin(atol, rtol, "%s %s [%lld, %lld]%s (%s), cuda against cpu", op, tk_dtype_name(dt),
                            (long long)rows, (long long)d, inplace ? " in place" : "", impl ? impl : "?");
    c.cols = d;
    for (int64_t i = 0; i < rows * d; i++)
        op_cmp_at(&c, i, get(&got.t, i), get(&ref.t, i));
    CHECK(op_cmp_end(&c));
    dev_free(&din);
    dev_free(&dout);
    free(in.buf);
    free(ref.buf);
    free(got.buf);
}

static void test_every_op_dtype_and_tier(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    const char *pkgs[] = {"kernels-community/softmax", NULL};
    CHECK_RC(gpu_ctx_new(&g, pkgs), TK_OK);
    static const char *const ops[] = {"softmax", "log_softmax"};
    static const tk_dtype *dts[] = {&F32, &F16, &BF16};
    static const int64_t shapes[][2] = {{1, 1},     {3, 7},     {1000, 33}, {7, 1000},   {5, 1024},   {5, 1025},
                                        {64, 4096}, {3, 16384}, {4, 16385}, {3, 300000}, {40, 70000}, {1, 4194304}};
    for (size_t o = 0; o < 2; o++)
        for (size_t t = 0; t < 3; t++)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
                run_case(ops[o], *dts[t], shapes[s][0], shapes[s][1], 0);
                if (s % 3 == 1)
                    run_case(ops[o], *dts[t], shapes[s][0], shapes[s][1], 1);
            }
    gpu_ctx_free(&g);
}

/* Every tensor one element past a 16-byte boundary, in each tier (warp, block, split), and in place. */
static void test_misaligned_views(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    const char *pkgs[] = {"kernels-community/softmax", NULL};
    CHECK_RC(gpu_ctx_new(&g, pkgs), TK_OK);
    static const char *const ops[] = {"softmax", "log_softmax"};
    static const tk_dtype *dts[] = {&F32, &F16, &BF16};
    static const int64_t shapes[][2] = {{7, 1000}, {64, 4096}, {3, 300000}};
    for (size_t o = 0; o < 2; o++)
        for (size_t t = 0; t < 3; t++)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
                gpu_misalign = dts[t]->bits / 8;
                run_case(ops[o], *dts[t], shapes[s][0], shapes[s][1], (int)(s & 1));
                gpu_misalign = 0;
            }
    gpu_ctx_free(&g);
}

static void test_coverage(void)
{
    const char *pkgs[] = {"kernels-community/softmax", NULL};
    gpu_coverage_check(pkgs);
}

int main(int argc, char **argv)
{
    static const char *const ops[] = {"softmax", "log_softmax", NULL};
    gpu_main(argc, argv, ops);
    op_test_seed();
    RUN(test_every_op_dtype_and_tier);
    RUN(test_misaligned_views);
    RUN(test_coverage);
    return th_done();
}
