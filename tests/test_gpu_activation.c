/*
 * test_gpu_activation.c — kernels-community/activation on a GPU against the CPU references: every op,
 * f32/f16/bf16, ragged and large shapes, through tk_op_run on CUDA tensors (so the dispatch, the
 * JIT compile, the module load and the launch rules all run). Skips without a CUDA device.
 *
 * Tolerances: f16/bf16 outputs may differ from the CPU by the rounding of the last store when the
 * fp32 values differ in their last bits (CUDA's expf/erff/tanhf are not glibc's), so the check is
 * per dtype (tests/gpu_util.h). For f32 the gated ops are compared in ulps: the Hub kernel's tests
 * require bit-exact fp32 against PyTorch on the same GPU; against a CPU reference the libm
 * differences allow a few ulps, and the test prints how many elements were not bit-exact.
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

/* ulps between two finite floats of the same sign region. */
static int64_t ulps(float a, float b)
{
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    if (ia < 0)
        ia = INT32_MIN - ia;
    if (ib < 0)
        ib = INT32_MIN - ib;
    return llabs((long long)ia - (long long)ib);
}

static gpu_ctx g;

static void run_case(const char *op, tk_dtype dt, int64_t rows, int64_t d)
{
    int gated = strstr(op, "_and_mul") != NULL;
    int64_t ishape[2] = {rows, gated ? 2 * d : d}, oshape[2] = {rows, d};
    host_t in, ref, got;
    dev_tensor din, dout;
    host_new(&in, dt, 2, ishape, 0);
    host_new(&ref, dt, 2, oshape, 0);
    host_new(&got, dt, 2, oshape, 0);
    for (int64_t i = 0; i < numel(&in.t); i++)
        set(&in.t, i, uniform(-6, 6));
    tk_arg cargs[] = {{TK_ARG_TENSOR, "out", &ref.t, 0, 0}, {TK_ARG_TENSOR, "input", &in.t, 0, 0}};
    CHECK_RC(gpu_op_run(g.ctx, op, cargs, 2, NULL, NULL), TK_OK);
    CHECK_RC(dev_upload(&din, &in.t), TK_OK);
    CHECK_RC(dev_upload(&dout, &got.t), TK_OK);
    const char *impl = NULL;
    tk_arg gargs[] = {{TK_ARG_TENSOR, "out", &dout.t, 0, 0}, {TK_ARG_TENSOR, "input", &din.t, 0, 0}};
    CHECK_RC(gpu_op_run(g.ctx, op, gargs, 2, NULL, &impl), TK_OK);
    CHECK(impl && strcmp(impl, "cpu-reference") != 0);
    CHECK_RC(dev_download(&dout, &got.t), TK_OK);
    char what[128];
    snprintf(what, sizeof what, "%s %s [%lld, %lld] (%s)", op, tk_dtype_name(dt), (long long)rows,
             (long long)ishape[1], impl ? impl : "?");
    if (dt.bits == 32) {
        int64_t worst = 0, inexact = 0, n = numel(&ref.t);
        for (int64_t i = 0; i < n; i++) {
            float a = ((float *)ref.buf)[i], b = ((float *)got.buf)[i];
            int64_t u = (isnan(a) || isnan(b)) ? (isnan(a) && isnan(b) ? 0 : INT32_MAX) : ulps(a, b);
            inexact += u != 0;
            worst = u > worst ? u : worst;
        }
        printf("%s: %lld of %lld elements not bit-exact, worst %lld ulp\n", what, (long long)inexact, (long long)n,
               (long long)worst);
        CHECK(worst <= 4);
    } else {
        cmp_t c = compare_tensors(&got.t, &ref.t);
        int ok = cmp_ok(&c, tol_rel(dt), dt.code == TK_DL_BFLOAT ? 0.07 : 0.01);
        if (!ok)
            cmp_print(what, &c);
        CHECK(ok);
    }
    dev_free(&din);
    dev_free(&dout);
    free(in.buf);
    free(ref.buf);
    free(got.buf);
}

static const char *const ops[] = {"silu_and_mul", "mul_and_silu", "gelu_and_mul", "gelu_tanh_and_mul",
                                  "fatrelu_and_mul", "gelu", "gelu_tanh", "silu", "gelu_new", "gelu_fast",
                                  "gelu_quick"};

static void test_every_op_dtype_and_shape(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    const char *pkgs[] = {"kernels-community/activation", NULL};
    CHECK_RC(gpu_ctx_new(&g, pkgs), TK_OK);
    const tk_dtype *dts[] = {&F32, &F16, &BF16};
    const int64_t shapes[][2] = {{1, 1}, {3, 7}, {5, 1000}, {64, 4096}, {2, 11008}};
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
        for (size_t t = 0; t < 3; t++)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
                run_case(ops[o], *dts[t], shapes[s][0], shapes[s][1]);
    gpu_ctx_free(&g);
}

/* Every tensor one element past a 16-byte boundary: the vector path cannot run, the scalar one must. */
static void test_misaligned_views(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    const char *pkgs[] = {"kernels-community/activation", NULL};
    CHECK_RC(gpu_ctx_new(&g, pkgs), TK_OK);
    const tk_dtype *dts[] = {&F32, &F16, &BF16};
    const int64_t shapes[][2] = {{3, 7}, {64, 4096}, {2, 11008}};
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
        for (size_t t = 0; t < 3; t++)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
                gpu_misalign = dts[t]->bits / 8;
                run_case(ops[o], *dts[t], shapes[s][0], shapes[s][1]);
                gpu_misalign = 0;
            }
    gpu_ctx_free(&g);
}

static void test_coverage(void)
{
    const char *pkgs[] = {"kernels-community/activation", NULL};
    gpu_coverage_check(pkgs);
}

int main(int argc, char **argv)
{
    static const char *const ops[] = {"silu_and_mul", "mul_and_silu", "gelu_and_mul", "gelu_tanh_and_mul", "fatrelu_and_mul", "gelu", "gelu_tanh", "silu", "gelu_new", "gelu_fast", "gelu_quick", NULL};
    gpu_main(argc, argv, ops);
    op_test_seed();
    RUN(test_every_op_dtype_and_shape);
    RUN(test_misaligned_views);
    RUN(test_coverage);
    return th_done();
}
