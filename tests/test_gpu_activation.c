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

/* The ops the test runs and which of them are gated: input [rows, 2d] -> out [rows, d] (act on one half,
 * times the other: silu_and_mul acts on the first half, mul_and_silu on the second). test_ops.c's table
 * says the same; the CPU reference refuses [rows, odd] for a gated op. */
static const struct {
    const char *op;
    int gated;
} ops[] = {
    {"silu_and_mul", 1},    {"mul_and_silu", 1}, {"gelu_and_mul", 1}, {"gelu_tanh_and_mul", 1},
    {"fatrelu_and_mul", 1}, {"gelu", 0},         {"gelu_tanh", 0},    {"silu", 0},
    {"gelu_new", 0},        {"gelu_fast", 0},    {"gelu_quick", 0},
};
#define NOPS (sizeof ops / sizeof ops[0])

/* One unit in the last place of dtype dt at magnitude m (the spacing of the dtype's numbers there). */
static double ulp_of(tk_dtype dt, double m)
{
    int mant = 10, emin = -14; /* f16 */
    if (dt.bits == 32 || dt.code == TK_DL_BFLOAT) {
        mant = dt.bits == 32 ? 23 : 7;
        emin = -126;
    }
    int e = m > 0 && isfinite(m) ? ilogb(m) : emin;
    return ldexp(1.0, (e < emin ? emin : e) - mant);
}

/* rows x d outputs of op in dtype dt (the input is [rows, 2d] for a gated op), CUDA against the CPU.
 *
 * The tolerance of an element: the rounding to the dtype (f32: 4 ulp of the result; f16/bf16: 1 ulp,
 * a last-bit fp32 difference can flip the one rounding) plus what the activation's formula amplifies
 * an fp32 ulp of libm into: near a cancellation (gelu(x) = 0.5 x (1 + erf(x / sqrt 2)) for x near -6:
 * 1 + erf is ~1e-9 and one ulp of erff moves the result by ~x * 6e-8) the result is tiny and far off in
 * its own ulps, on the GPU as on PyTorch's CUDA gelu (the same formula), so an ulp count of the result
 * alone is no criterion there. That term is 4 fp32 ulps of the inputs' scale: |x| for a plain op,
 * |x_act| * |x_mul| for a gated one. The test still prints the f32 ulp counts. */
static void run_case(const char *op, int gated, tk_dtype dt, int64_t rows, int64_t d)
{
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
    snprintf(what, sizeof what, "%s %s [%lld, %lld] (%s)", op, tk_dtype_name(dt), (long long)rows, (long long)ishape[1],
             impl ? impl : "?");
    op_cmp c = op_cmp_begin(0, 0, "%s", what);
    c.cols = d;
    c.nan_fails = c.inf_fails = 1;
    int64_t worst = 0, inexact = 0, n = numel(&ref.t);
    for (int64_t i = 0; i < n; i++) {
        double r = get(&ref.t, i), v = get(&got.t, i);
        int64_t row = i / d, col = i % d;
        double scale =
            gated ? fabs(get(&in.t, row * 2 * d + col)) * fabs(get(&in.t, row * 2 * d + d + col)) : fabs(get(&in.t, i));
        double m = fmax(fabs(r), fabs(v));
        op_cmp_tol(&c, i, v, r, (dt.bits == 32 ? 4 : 1) * ulp_of(dt, m) + 4 * ldexp(1.0, -23) * scale);
        if (dt.bits == 32) {
            float a = ((float *)ref.buf)[i], b = ((float *)got.buf)[i];
            int64_t u = (isnan(a) || isnan(b)) ? (isnan(a) && isnan(b) ? 0 : INT32_MAX) : ulps(a, b);
            inexact += u != 0;
            worst = u > worst ? u : worst;
        }
    }
    if (dt.bits == 32)
        printf("%s: %lld of %lld elements not bit-exact, worst %lld ulp\n", what, (long long)inexact, (long long)n,
               (long long)worst);
    CHECK(op_cmp_end(&c));
    dev_free(&din);
    dev_free(&dout);
    free(in.buf);
    free(ref.buf);
    free(got.buf);
}

/* [rows, d]: d is the output's last dimension (a gated op's input has 2d) */
static const int64_t shapes[][2] = {{1, 1}, {3, 7}, {5, 1000}, {64, 4096}, {2, 11008}};
static const int64_t mshapes[][2] = {{3, 7}, {64, 4096}, {2, 11008}}; /* test_misaligned_views */

/* Without a GPU: every (op, shape) the GPU tests run is a call the op accepts, by its CPU reference
 * (the first GPU run handed mul_and_silu, a gated op, [1, 1] and [3, 7]: "its last dimension must be
 * even (2*d)", and the coverage check then found its kernels never ran). */
static void test_cases_are_valid_calls(void)
{
    for (size_t o = 0; o < NOPS; o++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0] + sizeof mshapes / sizeof mshapes[0]; s++) {
            const int64_t *sh =
                s < sizeof shapes / sizeof shapes[0] ? shapes[s] : mshapes[s - sizeof shapes / sizeof shapes[0]];
            int64_t ishape[2] = {sh[0], ops[o].gated ? 2 * sh[1] : sh[1]}, oshape[2] = {sh[0], sh[1]};
            host_t in, out;
            host_new(&in, F32, 2, ishape, 0);
            host_new(&out, F32, 2, oshape, 0);
            tk_arg a[] = {{TK_ARG_TENSOR, "out", &out.t, 0, 0}, {TK_ARG_TENSOR, "input", &in.t, 0, 0}};
            int rc = op_run_cpu(ops[o].op, a, 2);
            if (rc != TK_OK)
                fprintf(stderr, "%s [%lld, %lld] -> [%lld, %lld]: %s\n", ops[o].op, (long long)ishape[0],
                        (long long)ishape[1], (long long)oshape[0], (long long)oshape[1], tk_last_error());
            CHECK_RC(rc, TK_OK);
            host_free(&in);
            host_free(&out);
        }
}

static void test_every_op_dtype_and_shape(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    const char *pkgs[] = {"kernels-community/activation", NULL};
    CHECK_RC(gpu_ctx_new(&g, pkgs), TK_OK);
    const tk_dtype *dts[] = {&F32, &F16, &BF16};
    for (size_t o = 0; o < NOPS; o++)
        for (size_t t = 0; t < 3; t++)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
                run_case(ops[o].op, ops[o].gated, *dts[t], shapes[s][0], shapes[s][1]);
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
    for (size_t o = 0; o < NOPS; o++)
        for (size_t t = 0; t < 3; t++)
            for (size_t s = 0; s < sizeof mshapes / sizeof mshapes[0]; s++) {
                gpu_misalign = dts[t]->bits / 8;
                run_case(ops[o].op, ops[o].gated, *dts[t], mshapes[s][0], mshapes[s][1]);
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
    static const char *names[NOPS + 1];
    for (size_t o = 0; o < NOPS; o++)
        names[o] = ops[o].op;
    names[NOPS] = NULL;
    gpu_main(argc, argv, names);
    op_test_seed();
    RUN(test_cases_are_valid_calls);
    RUN(test_every_op_dtype_and_shape);
    RUN(test_misaligned_views);
    RUN(test_coverage);
    return th_done();
}
