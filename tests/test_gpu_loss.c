/*
 * test_gpu_loss.c — kernels-community/cross-entropy on a GPU against the CPU references (ops/loss.c):
 * cross_entropy (f32/f16/bf16, V up to 256k, every reduction, label smoothing, ignored rows, the
 * gradient separate and in place, lse, special values, a batch with every row ignored),
 * fused_linear_cross_entropy (f16/bf16, H a multiple of 8 and not, bias, every gradient) and
 * max_margin_loss, all through tk_op_run on CUDA tensors (dispatch, JIT compile, launch rules,
 * workspace). Skips without a CUDA device.
 *
 * Tolerances (relative L2 norm of the difference, and the worst element against 10x that times the
 * largest reference magnitude): losses and lse 1e-4 (fp32 sums in another order, expf vs exp);
 * gradients per output dtype (tests/gpu_util.h: f32 1e-5, f16 2e-3, bf16 1e-2). The fused kernel
 * rounds each gradient tile to the input dtype before its two backward GEMMs (the reference keeps
 * fp32), so its grad_hidden / grad_weight get the input dtype's tolerance even where stored in f32.
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

static tk_arg T_(const char *name, const tk_tensor *t) { return (tk_arg){TK_ARG_TENSOR, name, t, 0, 0}; }
static tk_arg I_(const char *name, int64_t v) { return (tk_arg){TK_ARG_I64, name, NULL, v, 0}; }
static tk_arg F_(const char *name, double v) { return (tk_arg){TK_ARG_F64, name, NULL, 0, v}; }

static gpu_ctx g;

static int close_enough(const char *what, const tk_tensor *got, const tk_tensor *ref, double rel)
{
    cmp_t c = compare_tensors(got, ref);
    double amax = 0;
    for (int64_t i = 0; i < tk_ops__numel(ref); i++) {
        double r = elem_at(ref, i);
        if (isfinite(r) && fabs(r) > amax)
            amax = fabs(r);
    }
    int ok = cmp_ok(&c, rel, 10 * rel * amax + 1e-30);
    if (!ok) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s (seed %llu)", what, (unsigned long long)seed);
        cmp_print(buf, &c);
    }
    return ok;
}

/* Runs the op on the CPU (host tensors as given) and on the GPU (device copies), with the same
 * argument list: args[i].t point at host tensors; each is uploaded, and the outputs listed in `outs`
 * (indices into args) are downloaded into got[] for comparison. Returns the implementation name. */
#define MAXA 16
static const char *run_both(const char *op, tk_arg *args, size_t nargs, const int *outs, size_t nouts, host_t *got)
{
    dev_tensor dev[MAXA];
    tk_arg dargs[MAXA];
    const tk_tensor *orig[MAXA];
    memset(dev, 0, sizeof dev);
    for (size_t i = 0; i < nargs; i++) {
        dargs[i] = args[i];
        orig[i] = args[i].t;
        if (args[i].kind != TK_ARG_TENSOR)
            continue;
        /* the same host tensor twice (in place): one device tensor */
        size_t same = i;
        for (size_t j = 0; j < i; j++)
            if (args[j].kind == TK_ARG_TENSOR && orig[j] == orig[i])
                same = j;
        if (same != i) {
            dargs[i].t = dargs[same].t;
            continue;
        }
        CHECK_RC(dev_upload(&dev[i], args[i].t), TK_OK);
        dargs[i].t = &dev[i].t;
    }
    const char *impl = NULL;
    CHECK_RC(gpu_op_run(g.ctx, op, dargs, nargs, NULL, &impl), TK_OK);
    CHECK(impl && strcmp(impl, "cpu-reference") != 0);
    for (size_t k = 0; k < nouts; k++) {
        size_t i = (size_t)outs[k];
        host_new(&got[k], args[i].t->dtype, args[i].t->ndim, args[i].t->shape, 0);
        const dev_tensor *d = NULL;
        for (size_t j = 0; j <= i; j++)
            if (args[j].kind == TK_ARG_TENSOR && orig[j] == orig[i] && dev[j].ptr) {
                d = &dev[j];
                break;
            }
        CHECK(d != NULL);
        if (d)
            CHECK_RC(dev_download(d, &got[k].t), TK_OK);
    }
    for (size_t i = 0; i < nargs; i++)
        dev_free(&dev[i]);
    /* the CPU reference last: it may overwrite inputs (in place) */
    CHECK_RC(gpu_op_run(g.ctx, op, args, nargs, NULL, NULL), TK_OK);
    return impl;
}

/* ---- cross_entropy ------------------------------------------------------------------------------ */

static void ce_case(tk_dtype dt, int64_t n, int64_t v, int red, double eps, int inplace, int specials, double p_ignore)
{
    int64_t sh[2] = {n, v}, one = 1;
    host_t x, t, loss, grad, lse, got[3];
    host_new(&x, dt, 2, sh, 0);
    host_new(&t, I64, 1, &n, 0);
    host_new(&loss, F32, red == 0 ? 1 : 0, red == 0 ? &n : &one, 0);
    host_new(&grad, dt, 2, sh, 0);
    host_new(&lse, F32, 1, &n, 0);
    fill_range(&x, -8, 8);
    int64_t *tv = t.buf;
    for (int64_t i = 0; i < n; i++)
        tv[i] = uniform(0, 1) < p_ignore ? -100 : (int64_t)(next_u64() % (uint64_t)v);
    if (specials && n >= 4 && v >= 4) {
        set(&x.t, 0 * v + 1, -INFINITY);
        for (int64_t j = 0; j < v; j++)
            set(&x.t, 1 * v + j, -INFINITY);
        set(&x.t, 2 * v + 2, INFINITY);
        set(&x.t, 3 * v + 0, NAN);
    }
    tk_arg args[8] = {
        T_("logits", &x.t), T_("target", &t.t),         T_("loss", &loss.t), T_("grad", inplace ? &x.t : &grad.t),
        T_("lse", &lse.t),  F_("label_smoothing", eps), I_("reduction", red)};
    int outs[3] = {2, 3, 4};
    const char *impl = run_both("cross_entropy", args, 7, outs, 3, got);
    char what[160];
    snprintf(what, sizeof what, "cross_entropy %s [%lld, %lld] red %d eps %.2f%s%s (%s)", tk_dtype_name(dt),
             (long long)n, (long long)v, red, eps, inplace ? " in place" : "", specials ? " specials" : "",
             impl ? impl : "?");
    char w[200];
    snprintf(w, sizeof w, "%s loss", what);
    CHECK(close_enough(w, &got[0].t, &loss.t, 1e-4));
    snprintf(w, sizeof w, "%s grad", what);
    CHECK(close_enough(w, &got[1].t, inplace ? &x.t : &grad.t, tol_rel(dt)));
    snprintf(w, sizeof w, "%s lse", what);
    CHECK(close_enough(w, &got[2].t, &lse.t, 1e-4));
    for (int k = 0; k < 3; k++)
        free(got[k].buf);
    free(x.buf);
    free(t.buf);
    free(loss.buf);
    free(grad.buf);
    free(lse.buf);
}

static void test_cross_entropy(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    const char *pkgs[] = {"kernels-community/cross-entropy", NULL};
    CHECK_RC(gpu_ctx_new(&g, pkgs), TK_OK);
    const tk_dtype *dts[] = {&F32, &F16, &BF16};
    const int64_t shapes[][2] = {{1, 1}, {3, 7}, {5, 1000}, {33, 4099}, {16, 32000}, {4, 128256}, {2, 262144}};
    for (size_t d = 0; d < 3; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int red = 0; red < 3; red++)
                ce_case(*dts[d], shapes[s][0], shapes[s][1], red, (next_u64() & 1) ? 0.0 : uniform(0, 0.3),
                        (int)(next_u64() & 1), 0, 0.2);
    for (size_t d = 0; d < 3; d++) {
        ce_case(*dts[d], 8, 257, 0, 0.0, 0, 1, 0.0); /* -inf, all -inf, +inf, NaN rows */
        ce_case(*dts[d], 8, 257, 1, 0.1, 1, 1, 0.0);
        ce_case(*dts[d], 2100, 100, 1, 0.1, 0, 0, 0.3); /* more rows than blocks */
        ce_case(*dts[d], 6, 50, 1, 0.0, 0, 0, 1.0);     /* every row ignored: loss 0, grads 0 */
        ce_case(*dts[d], 6, 50, 2, 0.2, 1, 0, 1.0);
    }
    gpu_ctx_free(&g);
}

/* ---- fused_linear_cross_entropy ------------------------------------------------------------------ */

static void fl_case(tk_dtype dt, int64_t n, int64_t hd, int64_t v, int red, int with_bias)
{
    int64_t sh[2] = {n, hd}, sw[2] = {v, hd}, one = 1;
    host_t h, w, b, t, loss, gh, gw, gb, lse, got[5];
    host_new(&h, dt, 2, sh, 0);
    host_new(&w, dt, 2, sw, 0);
    host_new(&b, dt, 1, &v, 0);
    host_new(&t, I64, 1, &n, 0);
    host_new(&loss, F32, red == 0 ? 1 : 0, red == 0 ? &n : &one, 0);
    host_new(&gh, dt, 2, sh, 0);
    host_new(&gw, F32, 2, sw, 0);
    host_new(&gb, F32, 1, &v, 0);
    host_new(&lse, F32, 1, &n, 0);
    double sc = 2.0 / sqrt((double)hd);
    fill_range(&h, -1.5, 1.5);
    fill_range(&w, -sc, sc);
    fill_range(&b, -0.5, 0.5);
    int64_t *tv = t.buf;
    for (int64_t i = 0; i < n; i++)
        tv[i] = uniform(0, 1) < 0.2 ? -100 : (int64_t)(next_u64() % (uint64_t)v);
    tk_arg args[12] = {T_("hidden", &h.t),  T_("weight", &w.t),          T_("target", &t.t),
                       T_("loss", &loss.t), T_("grad_hidden", &gh.t),    T_("grad_weight", &gw.t),
                       T_("lse", &lse.t),   F_("label_smoothing", 0.05), I_("reduction", red)};
    size_t na = 9;
    int outs[5] = {3, 4, 5, 6, 0};
    size_t no = 4;
    if (with_bias) {
        args[na++] = T_("bias", &b.t);
        args[na++] = T_("grad_bias", &gb.t);
        outs[no++] = (int)na - 1;
    }
    const char *impl = run_both("fused_linear_cross_entropy", args, na, outs, no, got);
    char what[160], wb[200];
    snprintf(what, sizeof what, "fused_linear_cross_entropy %s [N %lld, H %lld, V %lld] red %d%s (%s)",
             tk_dtype_name(dt), (long long)n, (long long)hd, (long long)v, red, with_bias ? " bias" : "",
             impl ? impl : "?");
    const char *names[5] = {"loss", "grad_hidden", "grad_weight", "lse", "grad_bias"};
    const tk_tensor *refs[5] = {&loss.t, &gh.t, &gw.t, &lse.t, &gb.t};
    double tols[5] = {1e-4, tol_rel(dt), tol_rel(dt), 1e-4, tol_rel(dt)};
    for (size_t k = 0; k < no; k++) {
        snprintf(wb, sizeof wb, "%s %s", what, names[k]);
        CHECK(close_enough(wb, &got[k].t, refs[k], tols[k]));
        free(got[k].buf);
    }
    free(h.buf);
    free(w.buf);
    free(b.buf);
    free(t.buf);
    free(loss.buf);
    free(gh.buf);
    free(gw.buf);
    free(gb.buf);
    free(lse.buf);
}

static void test_fused_linear_cross_entropy(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    const char *pkgs[] = {"kernels-community/cross-entropy", NULL};
    CHECK_RC(gpu_ctx_new(&g, pkgs), TK_OK);
    const tk_dtype *dts[] = {&F16, &BF16};
    /* H % 8 != 0 (element loads), N and V not multiples of the tiles, one row */
    const int64_t shapes[][3] = {{1, 8, 7},      {37, 64, 1000}, {130, 256, 5000},
                                 {257, 72, 333}, {5, 30, 100},   {64, 512, 32000}};
    for (size_t d = 0; d < 2; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            fl_case(*dts[d], shapes[s][0], shapes[s][1], shapes[s][2], (int)(next_u64() % 3), (int)(next_u64() & 1));
    gpu_ctx_free(&g);
}

/* ---- max_margin_loss ---------------------------------------------------------------------------- */

static void mm_case(tk_dtype dt, int64_t n, int64_t k, int red)
{
    int64_t sn[2] = {n, k}, one = 1;
    host_t p, ng, loss, gp, gn, got[3];
    host_new(&p, dt, 1, &n, 0);
    host_new(&ng, dt, 2, sn, 0);
    if (red == 0)
        host_new(&loss, F32, 2, sn, 0);
    else
        host_new(&loss, F32, 1, &one, 0);
    host_new(&gp, dt, 1, &n, 0);
    host_new(&gn, dt, 2, sn, 0);
    fill_range(&p, -2, 2);
    for (int64_t i = 0; i < n * k; i++) {
        set(&ng.t, i, uniform(-2, 2));
        double x = 1.0 - get(&p.t, i / k) + get(&ng.t, i); /* keep pairs off the kink */
        if (fabs(x) < 0.05)
            set(&ng.t, i, get(&ng.t, i) + 0.1);
    }
    tk_arg args[6] = {T_("pos", &p.t),       T_("neg", &ng.t),      T_("loss", &loss.t),
                      T_("grad_pos", &gp.t), T_("grad_neg", &gn.t), I_("reduction", red)};
    int outs[3] = {2, 3, 4};
    const char *impl = run_both("max_margin_loss", args, 6, outs, 3, got);
    char w[200];
    const char *names[3] = {"loss", "grad_pos", "grad_neg"};
    const tk_tensor *refs[3] = {&loss.t, &gp.t, &gn.t};
    for (int q = 0; q < 3; q++) {
        snprintf(w, sizeof w, "max_margin_loss %s [%lld, %lld] red %d %s (%s)", tk_dtype_name(dt), (long long)n,
                 (long long)k, red, names[q], impl ? impl : "?");
        CHECK(close_enough(w, &got[q].t, refs[q], q == 0 ? 1e-5 : tol_rel(dt)));
        free(got[q].buf);
    }
    free(p.buf);
    free(ng.buf);
    free(loss.buf);
    free(gp.buf);
    free(gn.buf);
}

static void test_max_margin_loss(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    const char *pkgs[] = {"kernels-community/cross-entropy", NULL};
    CHECK_RC(gpu_ctx_new(&g, pkgs), TK_OK);
    const tk_dtype *dts[] = {&F32, &F16, &BF16};
    const int64_t shapes[][2] = {{1, 1}, {7, 1}, {100, 5}, {3, 1100}, {20000, 3}};
    for (size_t d = 0; d < 3; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int red = 0; red < 3; red++)
                mm_case(*dts[d], shapes[s][0], shapes[s][1], red);
    gpu_ctx_free(&g);
}

static void test_coverage(void)
{
    const char *pkgs[] = {"kernels-community/cross-entropy", NULL};
    gpu_coverage_check(pkgs);
}

int main(int argc, char **argv)
{
    static const char *const ops[] = {"cross_entropy", "fused_linear_cross_entropy", "max_margin_loss", NULL};
    gpu_main(argc, argv, ops);
    op_test_seed();
    RUN(test_cross_entropy);
    RUN(test_fused_linear_cross_entropy);
    RUN(test_max_margin_loss);
    RUN(test_coverage);
    return th_done();
}
