/*
 * test_gpu_norm.c — kernels-community/rmsnorm on a GPU against the CPU references: every norm op
 * (forward and backward), f32/f16/bf16, ragged and large shapes, through tk_op_run on CUDA tensors (so
 * the dispatch, the JIT compile, the launch rules and the workspace all run). Skips without a CUDA
 * device.
 *
 * Shapes cover each kernel path: d of 1 and non-multiples of 8 (scalar loads), small d (several rows
 * per block in the backward), d up to 8192 (rows in registers) and above (re-read rows), and row
 * counts above the backward's block count (several rows per block, several groups in the grad_weight
 * combine). Tolerances are relative norms per dtype (tests/gpu_util.h) plus a worst-element bound
 * scaled by the largest reference value. The backward ops are run twice: grad_weight and grad_bias
 * must be bit-identical (the cross-block sums have a fixed order).
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

/* A tensor parameter of an op: [d] (vec) or [rows, d]; out: the op writes it (compared). */
typedef struct {
    const char *name;
    int vec, out;
} slot;

typedef struct {
    const char *op;
    int bwd;
    int n;
    slot s[7];
} op_t;

static const op_t ops[] = {
    {"rms_norm", 0, 3, {{"out", 0, 1}, {"input", 0, 0}, {"weight", 1, 0}}},
    {"fused_add_rms_norm", 0, 3, {{"input", 0, 1}, {"residual", 0, 1}, {"weight", 1, 0}}},
    {"layer_norm", 0, 4, {{"out", 0, 1}, {"input", 0, 0}, {"weight", 1, 0}, {"bias", 1, 0}}},
    {"fused_add_layer_norm", 0, 4, {{"input", 0, 1}, {"residual", 0, 1}, {"weight", 1, 0}, {"bias", 1, 0}}},
    {"rms_norm_backward", 1, 5,
     {{"grad_input", 0, 1}, {"grad_weight", 1, 1}, {"grad_out", 0, 0}, {"input", 0, 0}, {"weight", 1, 0}}},
    {"fused_add_rms_norm_backward", 1, 6,
     {{"grad_input", 0, 1}, {"grad_weight", 1, 1}, {"grad_out", 0, 0}, {"grad_residual", 0, 0},
      {"residual", 0, 0}, {"weight", 1, 0}}},
    {"layer_norm_backward", 1, 6,
     {{"grad_input", 0, 1}, {"grad_weight", 1, 1}, {"grad_bias", 1, 1}, {"grad_out", 0, 0}, {"input", 0, 0},
      {"weight", 1, 0}}},
    {"fused_add_layer_norm_backward", 1, 7,
     {{"grad_input", 0, 1}, {"grad_weight", 1, 1}, {"grad_bias", 1, 1}, {"grad_out", 0, 0},
      {"grad_residual", 0, 0}, {"residual", 0, 0}, {"weight", 1, 0}}},
};

static gpu_ctx g;

static double max_abs(const tk_tensor *t)
{
    double m = 0;
    for (int64_t i = 0, n = numel(t); i < n; i++)
        if (fabs(get(t, i)) > m && isfinite(get(t, i)))
            m = fabs(get(t, i));
    return m;
}

/* One op, dtype and shape. bias: pass bias / grad_bias (else left out); inplace: grad_input is
 * grad_residual (the fused backwards). */
static void run_case(const op_t *o, tk_dtype dt, int64_t rows, int64_t d, int bias, int inplace)
{
    int64_t rs[2] = {rows, d};
    host_t cpu[7], gpu[7];
    dev_tensor dev[7];
    tk_arg ca[8], ga[8];
    size_t na = 0;
    int use[7];
    memset(dev, 0, sizeof dev);
    for (int i = 0; i < o->n; i++) {
        const slot *s = &o->s[i];
        use[i] = bias || (strcmp(s->name, "bias") && strcmp(s->name, "grad_bias"));
        host_new(&cpu[i], dt, s->vec ? 1 : 2, s->vec ? &d : rs, 0);
        host_new(&gpu[i], dt, s->vec ? 1 : 2, s->vec ? &d : rs, 0);
        for (int64_t k = 0; k < numel(&cpu[i].t); k++) {
            double v = !strcmp(s->name, "weight") ? uniform(0.25, 2.0) * (next_u64() & 1 ? 1 : -1)
                       : strstr(s->name, "grad") || !strcmp(s->name, "bias") ? uniform(-1, 1)
                                                                              : uniform(-3, 3);
            set(&cpu[i].t, k, v);
        }
    }
    int gr = -1;
    for (int i = 0; i < o->n; i++)
        if (!strcmp(o->s[i].name, "grad_residual"))
            gr = i;
    for (int i = 0; i < o->n; i++) {
        if (!use[i])
            continue;
        CHECK_RC(dev_upload(&dev[i], &cpu[i].t), TK_OK);
        int src = inplace && gr >= 0 && !strcmp(o->s[i].name, "grad_input") ? gr : i;
        ca[na] = (tk_arg){TK_ARG_TENSOR, o->s[i].name, &cpu[src].t, 0, 0};
        ga[na] = (tk_arg){TK_ARG_TENSOR, o->s[i].name, &dev[src].t, 0, 0};
        na++;
    }
    ca[na] = ga[na] = (tk_arg){TK_ARG_F64, "eps", NULL, 0, 1e-5};
    na++;

    const char *impl = NULL;
    CHECK_RC(gpu_op_run(g.ctx, o->op, ga, na, NULL, &impl), TK_OK);
    CHECK(impl && strcmp(impl, "cpu-reference") != 0);
    CHECK_RC(gpu_op_run(g.ctx, o->op, ca, na, NULL, NULL), TK_OK); /* the CPU reference, in place on cpu[] */
    char what[160];
    for (int i = 0; i < o->n; i++) {
        int src = inplace && gr >= 0 && !strcmp(o->s[i].name, "grad_input") ? gr : i;
        if (!use[i] || !o->s[i].out)
            continue;
        CHECK_RC(dev_download(&dev[src], &gpu[src].t), TK_OK);
        cmp_t c = compare_tensors(&gpu[src].t, &cpu[src].t);
        double rel = tol_rel(dt);
        int ok = cmp_ok(&c, rel, 8 * rel * max_abs(&cpu[src].t) + 1e-30);
        snprintf(what, sizeof what, "%s %s [%lld, %lld]%s%s '%s' (%s)", o->op, tk_dtype_name(dt), (long long)rows,
                 (long long)d, bias ? " bias" : "", inplace ? " in-place" : "", o->s[i].name, impl ? impl : "?");
        if (!ok)
            cmp_print(what, &c);
        CHECK(ok);
    }
    /* Determinism: the backward's sums over rows again, bit for bit. */
    if (o->bwd && !inplace) {
        CHECK_RC(gpu_op_run(g.ctx, o->op, ga, na, NULL, NULL), TK_OK);
        for (int i = 0; i < o->n; i++) {
            if (!use[i] || !o->s[i].out || !o->s[i].vec)
                continue;
            host_t again;
            host_new(&again, dt, 1, &d, 0);
            CHECK_RC(dev_download(&dev[i], &again.t), TK_OK);
            CHECK(memcmp(again.buf, gpu[i].buf, (size_t)d * (dt.bits / 8)) == 0);
            free(again.buf);
        }
    }
    for (int i = 0; i < o->n; i++) {
        dev_free(&dev[i]);
        free(cpu[i].buf);
        free(gpu[i].buf);
    }
}

static void test_every_op_dtype_and_shape(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    const char *pkgs[] = {"kernels-community/rmsnorm", NULL};
    CHECK_RC(gpu_ctx_new(&g, pkgs), TK_OK);
    const tk_dtype *dts[] = {&F32, &F16, &BF16};
    const int64_t shapes[][2] = {{1, 1},    {3, 7},     {5, 1000},  {600, 128}, {64, 4096},
                                 {7, 5120}, {33, 8192}, {4, 8200},  {2, 11008}, {3000, 64}};
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
        for (size_t t = 0; t < 3; t++)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
                int has_bias = strstr(ops[o].op, "layer") != NULL;
                run_case(&ops[o], *dts[t], shapes[s][0], shapes[s][1], has_bias && s % 2, 0);
                if (has_bias && s % 3 == 0)
                    run_case(&ops[o], *dts[t], shapes[s][0], shapes[s][1], !(s % 2), 0);
                if (ops[o].bwd && strstr(ops[o].op, "fused") && s % 2 == 0)
                    run_case(&ops[o], *dts[t], shapes[s][0], shapes[s][1], has_bias, 1);
            }
    gpu_ctx_free(&g);
}

/* Many rows: more than the backward's blocks (each runs several rows, the combine several groups). */
static void test_backward_many_rows(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    const char *pkgs[] = {"kernels-community/rmsnorm", NULL};
    CHECK_RC(gpu_ctx_new(&g, pkgs), TK_OK);
    for (size_t o = 4; o < sizeof ops / sizeof ops[0]; o++) {
        run_case(&ops[o], BF16, 16384, 4096, 1, 0);
        run_case(&ops[o], F32, 20000, 256, 1, 0);
        run_case(&ops[o], F16, 5000, 1536, 0, 0);
    }
    gpu_ctx_free(&g);
}

/* Every tensor one element past a 16-byte boundary: the scalar paths (forward and backward). */
static void test_misaligned_views(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    const char *pkgs[] = {"kernels-community/rmsnorm", NULL};
    CHECK_RC(gpu_ctx_new(&g, pkgs), TK_OK);
    const tk_dtype *dts[] = {&F32, &F16, &BF16};
    const int64_t shapes[][2] = {{3, 7}, {64, 4096}, {4, 8200}};
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
        for (size_t t = 0; t < 3; t++)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
                gpu_misalign = dts[t]->bits / 8;
                run_case(&ops[o], *dts[t], shapes[s][0], shapes[s][1], strstr(ops[o].op, "layer") != NULL, 0);
                gpu_misalign = 0;
            }
    gpu_ctx_free(&g);
}

static void test_coverage(void)
{
    const char *pkgs[] = {"kernels-community/rmsnorm", NULL};
    gpu_coverage_check(pkgs);
}

int main(int argc, char **argv)
{
    static const char *const ops[] = {"rms_norm", "fused_add_rms_norm", "layer_norm", "fused_add_layer_norm", "rms_norm_backward", "fused_add_rms_norm_backward", "layer_norm_backward", "fused_add_layer_norm_backward", NULL};
    gpu_main(argc, argv, ops);
    op_test_seed();
    RUN(test_every_op_dtype_and_shape);
    RUN(test_backward_many_rows);
    RUN(test_misaligned_views);
    RUN(test_coverage);
    return th_done();
}
