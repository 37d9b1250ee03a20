/*
 * test_gpu_train.c — the GPU implementations of the ops training adds, each against the CPU reference
 * on the same inputs through tk_op_run on CUDA tensors: linear_backward (cuBLASLt: grad_x with and
 * without accumulation, grad_weight and grad_bias accumulated, nn.Linear and Conv1D layouts, f32
 * gradients of bf16/f16 operands), embedding_backward (deterministic: two runs give the same bytes;
 * padding_idx; ids out of range skipped) and tanh_backward (kernels-community/layers),
 * rotary_embedding_backward (kernels-community/rotary), every activation / gated / softmax backward,
 * adamw (bit-identical to the CPU step) and sum_squares (kernels-community/training). The attention
 * backward's GPU kernels are tests/test_gpu_attention.c's.
 *
 * Tolerances per output, relative to the reference's largest magnitude (the reference computes in
 * double): f32 1e-5 (linear_backward: fp32 products of K terms, 1e-5 relative to the sum of |terms|),
 * f16 2e-3, bf16 1.6e-2 relative per element plus the same times the largest magnitude. Skips without
 * a CUDA device (TK_TEST_GPU=1 makes that a failure).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_util.h"

static gpu_ctx g;

static tk_arg T(const char *name, tk_tensor *t) { return (tk_arg){TK_ARG_TENSOR, name, t, 0, 0}; }
static tk_arg I(const char *name, int64_t v) { return (tk_arg){TK_ARG_I64, name, NULL, v, 0}; }
static tk_arg F(const char *name, double v) { return (tk_arg){TK_ARG_F64, name, NULL, 0, v}; }

static double rel_of(tk_dtype dt) { return dt.bits == 32 ? 1e-5 : dt.code == TK_DL_BFLOAT ? 1.6e-2 : 2e-3; }

/* Runs op on the host tensors (the CPU reference) and on device copies of them, then compares every
 * output tensor; `exact`: bit for bit. `pkg_prefix`: what must have run on the GPU ("" = anything but
 * the CPU reference). Host tensors are left holding the CPU results. */
static int both(const char *op, tk_arg *args, size_t n, const char *what, const char *pkg_prefix, int exact)
{
    const tk_op_desc *d = tk_ops__find(op);
    dev_tensor dev[16];
    tk_arg dargs[16];
    void *orig[16] = {0};
    int ok = d != NULL && n <= 16;
    memset(dev, 0, sizeof dev);
    for (size_t i = 0; ok && i < n; i++) {
        dargs[i] = args[i];
        if (args[i].kind != TK_ARG_TENSOR || !args[i].t)
            continue;
        size_t b = host_bytes(args[i].t);
        orig[i] = malloc(b + 1);
        memcpy(orig[i], args[i].t->data, b);
        ok &= dev_upload(&dev[i], args[i].t) == TK_OK;
        dargs[i].t = &dev[i].t;
    }
    const char *impl = NULL;
    int rc = ok ? gpu_op_run(g.ctx, op, dargs, n, NULL, &impl) : TK_ERR_INTERNAL;
    if (rc != TK_OK)
        fprintf(stderr, "%s %s on cuda: %s\n", op, what, tk_last_error());
    ok &= rc == TK_OK && impl && strcmp(impl, "cpu-reference") && strstr(impl, pkg_prefix) == impl;
    if (ok && gpu_log_on())
        fprintf(stderr, "%s %s: %s\n", op, what, impl);
    ok &= gpu_op_run(g.ctx, op, args, n, NULL, NULL) == TK_OK; /* the reference, into the host tensors */
    for (size_t i = 0; ok && i < n; i++) {
        int idx = tk_ops__param_index(d, args[i].name);
        if (args[i].kind != TK_ARG_TENSOR || !args[i].t || idx < 0 || d->params[idx].role != TK_OPS_OUT)
            continue;
        host_t got;
        host_new(&got, args[i].t->dtype, args[i].t->ndim, args[i].t->shape, 0);
        ok &= dev_download(&dev[i], &got.t) == TK_OK;
        char w[256];
        snprintf(w, sizeof w, "%s '%s' %s %s (%s)", op, args[i].name, tk_dtype_name(args[i].t->dtype), what,
                 impl ? impl : "?");
        if (exact) {
            int same = memcmp(got.buf, args[i].t->data, host_bytes(args[i].t)) == 0;
            if (!same)
                fprintf(stderr, "%s: not bit-identical to the CPU reference\n", w);
            ok &= same;
        } else {
            double big = 1e-30, rel = rel_of(args[i].t->dtype);
            for (int64_t e = 0, m = numel(args[i].t); e < m; e++)
                big = fmax(big, fabs(get(args[i].t, e)));
            op_cmp c = op_cmp_begin(rel * big, rel, "%s", w);
            c.nan_fails = c.inf_fails = 1;
            for (int64_t e = 0, m = numel(args[i].t); e < m; e++)
                op_cmp_at(&c, e, get(&got.t, e), get(args[i].t, e));
            ok &= op_cmp_end(&c);
        }
        host_free(&got);
    }
    for (size_t i = 0; i < n; i++) {
        if (dev[i].ptr)
            dev_free(&dev[i]);
        if (orig[i]) /* the inputs back as they were, for the caller's next run */
            memcpy(args[i].t->data, orig[i], host_bytes(args[i].t));
        free(orig[i]);
    }
    return ok;
}

static const tk_dtype *dts[] = {&F32, &F16, &BF16};

/* ---- linear_backward on cuBLASLt ---------------------------------------------------------------- */

static void test_linear_backward(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    const char *pkgs[] = {NULL};
    CHECK_RC(gpu_ctx_new(&g, pkgs), TK_OK);
    const int64_t mnk[][3] = {{1, 1, 1}, {7, 33, 129}, {64, 96, 77}, {256, 768, 768}, {5, 50257, 64}};
    for (size_t di = 0; di < 3; di++)
        for (size_t s = 0; s < sizeof mnk / sizeof mnk[0]; s++)
            for (int tr = 0; tr < 2; tr++)
                for (int acc = 0; acc < 2; acc++) {
                    tk_dtype dt = *dts[di];
                    int64_t m = mnk[s][0], n = mnk[s][1], k = mnk[s][2];
                    int64_t sgo[2] = {m, n}, sx[2] = {m, k}, sw[2] = {tr ? k : n, tr ? n : k};
                    host_t go, x, w, gx, gw, gb;
                    host_new(&go, dt, 2, sgo, 0);
                    host_new(&x, dt, 2, sx, 0);
                    host_new(&w, dt, 2, sw, 0);
                    host_new(&gx, dt, 2, sx, 0);
                    host_new(&gw, F32, 2, sw, 0); /* f32 gradients of any operands: mixed precision */
                    host_new(&gb, F32, 1, &n, 0);
                    fill(&go, 1.0);
                    fill(&x, 1.0);
                    fill(&w, 1.0 / sqrt((double)k));
                    fill(&gx, 1.0);
                    fill(&gw, 1.0);
                    fill(&gb, 1.0);
                    tk_arg a[] = {
                        T("grad_x", &gx.t), T("grad_weight", &gw.t), T("grad_bias", &gb.t), T("grad_out", &go.t),
                        T("x", &x.t),       T("weight", &w.t),       I("transposed", tr),   I("accumulate", acc)};
                    char what[128];
                    snprintf(what, sizeof what, "M %lld N %lld K %lld tr %d acc %d", (long long)m, (long long)n,
                             (long long)k, tr, acc);
                    CHECK(both("linear_backward", a, 8, what, "builtin:cublaslt", 0));
                    host_t *all[] = {&go, &x, &w, &gx, &gw, &gb};
                    for (size_t i = 0; i < 6; i++)
                        host_free(all[i]);
                }
    gpu_ctx_free(&g);
}

/* ---- kernels-community/layers: embedding_backward, tanh_backward ---------------------------------- */

static void test_layers_backward(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    const char *pkgs[] = {"kernels-community/layers", NULL};
    CHECK_RC(gpu_ctx_new(&g, pkgs), TK_OK);
    const int64_t vd[][2] = {{11, 1}, {50, 7}, {1000, 768}, {5, 4097}};
    for (size_t di = 0; di < 3; di++)
        for (int it = 0; it < 2; it++)
            for (size_t s = 0; s < sizeof vd / sizeof vd[0]; s++) {
                int64_t V = vd[s][0], D = vd[s][1], is[2] = {3, 9}, ws[2] = {V, D}, os[3] = {3, 9, D};
                host_t ids, gw, go;
                host_new(&ids, it ? I64 : I32, 2, is, 0);
                host_new(&gw, F32, 2, ws, 0);
                host_new(&go, *dts[di], 3, os, 0);
                fill(&gw, 1.0);
                fill(&go, 2.0);
                for (int64_t i = 0; i < 27; i++) /* repeated ids; one out of range (skipped by the kernel) */
                    id_set(&ids, i, i == 4 ? 2 : (int64_t)(next_u64() % (uint64_t)V));
                tk_arg a[] = {T("grad_weight", &gw.t), T("grad_out", &go.t), T("ids", &ids.t),
                              I("padding_idx", s == 1 ? 2 : -1)};
                char what[96];
                snprintf(what, sizeof what, "V %lld D %lld %s", (long long)V, (long long)D, it ? "i64" : "i32");
                /* the GPU sums rows in the same order as the reference, in fp32: the same bytes */
                CHECK(both("embedding_backward", a, 4, what, "kernels-community/layers:embedding_backward_",
                           dts[di]->bits == 32));
                host_free(&ids);
                host_free(&gw);
                host_free(&go);
            }
    for (size_t di = 0; di < 3; di++) {
        int64_t sh[2] = {37, 1001};
        host_t gi, go, x;
        host_new(&gi, *dts[di], 2, sh, 0);
        host_new(&go, *dts[di], 2, sh, 0);
        host_new(&x, *dts[di], 2, sh, 0);
        fill(&go, 1.0);
        fill(&x, 3.0);
        tk_arg a[] = {T("grad_input", &gi.t), T("grad_out", &go.t), T("input", &x.t)};
        CHECK(both("tanh_backward", a, 3, "[37, 1001]", "kernels-community/layers:tanh_backward_", 0));
        host_free(&gi);
        host_free(&go);
        host_free(&x);
    }
    gpu_ctx_free(&g);
}

/* ---- kernels-community/rotary: rotary_embedding_backward ------------------------------------------ */

static void test_rotary_backward(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    const char *pkgs[] = {"kernels-community/rotary", NULL};
    CHECK_RC(gpu_ctx_new(&g, pkgs), TK_OK);
    for (size_t di = 0; di < 3; di++)
        for (int neox = 0; neox < 2; neox++)
            for (int cache32 = 0; cache32 < 2; cache32++) {
                if (cache32 && di == 0)
                    continue;
                int64_t N = 13, Hq = 8, Hkv = 2, D = 64, rot = 48, P = 40;
                int64_t sq[3] = {N, Hq, D}, sk[3] = {N, Hkv, D}, sc[2] = {P, rot};
                host_t gq, gk, pos, cache;
                host_new(&gq, *dts[di], 3, sq, 0);
                host_new(&gk, *dts[di], 3, sk, 0);
                host_new(&pos, I64, 1, &N, 0);
                host_new(&cache, cache32 ? F32 : *dts[di], 2, sc, 0);
                fill(&gq, 2.0);
                fill(&gk, 2.0);
                for (int64_t t = 0; t < N; t++)
                    id_set(&pos, t, (int64_t)(next_u64() % (uint64_t)P));
                CHECK_RC(gpu_op_run(g.ctx, "rope_cos_sin_cache", (tk_arg[]){T("out", &cache.t)}, 1, NULL, NULL), TK_OK);
                tk_arg a[] = {T("grad_query", &gq.t), T("grad_key", &gk.t), T("positions", &pos.t),
                              T("cos_sin_cache", &cache.t), I("is_neox", neox)};
                char what[64];
                snprintf(what, sizeof what, "neox %d cache %s", neox, tk_dtype_name(cache.t.dtype));
                CHECK(both("rotary_embedding_backward", a, 5, what,
                           "kernels-community/rotary:rotary_embedding_backward_", 0));
                host_free(&gq);
                host_free(&gk);
                host_free(&pos);
                host_free(&cache);
            }
    gpu_ctx_free(&g);
}

/* ---- kernels-community/training ------------------------------------------------------------------ */

static void test_activation_backward(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    const char *pkgs[] = {"kernels-community/training", NULL};
    CHECK_RC(gpu_ctx_new(&g, pkgs), TK_OK);
    static const char *plain[] = {"gelu_backward",      "gelu_tanh_backward",  "gelu_new_backward",
                                  "gelu_fast_backward", "gelu_quick_backward", "silu_backward"};
    static const char *gated[] = {"silu_and_mul_backward", "mul_and_silu_backward", "gelu_and_mul_backward",
                                  "gelu_tanh_and_mul_backward"};
    static const char *soft[] = {"softmax_backward", "log_softmax_backward"};
    for (size_t di = 0; di < 3; di++) {
        int64_t sh[2] = {9, 1001}, sg[2] = {9, 2002};
        for (size_t o = 0; o < sizeof plain / sizeof plain[0]; o++) {
            host_t gi, go, x;
            host_new(&gi, *dts[di], 2, sh, 0);
            host_new(&go, *dts[di], 2, sh, 0);
            host_new(&x, *dts[di], 2, sh, 0);
            fill(&go, 1.0);
            fill(&x, 5.0);
            tk_arg a[] = {T("grad_input", &gi.t), T("grad_out", &go.t), T("input", &x.t)};
            CHECK(both(plain[o], a, 3, "[9, 1001]", "kernels-community/training:", 0));
            host_free(&gi);
            host_free(&go);
            host_free(&x);
        }
        for (size_t o = 0; o < sizeof gated / sizeof gated[0]; o++) {
            host_t gi, go, x;
            host_new(&gi, *dts[di], 2, sg, 0);
            host_new(&go, *dts[di], 2, sh, 0);
            host_new(&x, *dts[di], 2, sg, 0);
            fill(&go, 1.0);
            fill(&x, 4.0);
            tk_arg a[] = {T("grad_input", &gi.t), T("grad_out", &go.t), T("input", &x.t)};
            CHECK(both(gated[o], a, 3, "[9, 2002]", "kernels-community/training:", 0));
            host_free(&gi);
            host_free(&go);
            host_free(&x);
        }
        for (size_t o = 0; o < 2; o++) {
            int64_t rows = 7, d = 3000, s2[2] = {rows, d};
            host_t gi, go, y;
            host_new(&gi, *dts[di], 2, s2, 0);
            host_new(&go, *dts[di], 2, s2, 0);
            host_new(&y, *dts[di], 2, s2, 0);
            fill(&go, 1.0);
            fill(&y, 3.0);
            CHECK_RC(gpu_op_run(g.ctx, o ? "log_softmax" : "softmax", (tk_arg[]){T("out", &y.t), T("input", &y.t)}, 2,
                                NULL, NULL),
                     TK_OK);
            tk_arg a[] = {T("grad_input", &gi.t), T("grad_out", &go.t), T("out", &y.t)};
            CHECK(both(soft[o], a, 3, "[7, 3000]", "kernels-community/training:", 0));
            host_free(&gi);
            host_free(&go);
            host_free(&y);
        }
    }
    gpu_ctx_free(&g);
}

static void test_optimizer(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    const char *pkgs[] = {"kernels-community/training", NULL};
    CHECK_RC(gpu_ctx_new(&g, pkgs), TK_OK);
    /* AdamW: the same fp32 sequence as the CPU reference, bit for bit, with each copy dtype */
    for (int copy = 0; copy < 4; copy++) {
        int64_t n = 100003;
        host_t p, gr, m, v, c;
        host_new(&p, F32, 1, &n, 0);
        host_new(&gr, F32, 1, &n, 0);
        host_new(&m, F32, 1, &n, 0);
        host_new(&v, F32, 1, &n, 0);
        host_new(&c, copy ? *dts[copy - 1] : F32, 1, &n, 0);
        fill(&p, 1.0);
        fill(&gr, 0.1);
        fill(&m, 0.01); /* a later step: moments already non-zero */
        for (int64_t i = 0; i < n; i++)
            set(&v.t, i, uniform(1e-6, 1e-3));
        tk_arg a[] = {T("param", &p.t),      T("grad", &gr.t),       T("exp_avg", &m.t), T("exp_avg_sq", &v.t),
                      T("param_copy", &c.t), F("lr", 3e-4),          F("beta1", 0.9),    F("beta2", 0.95),
                      F("eps", 1e-8),        F("weight_decay", 0.1), I("step", 7),       F("grad_scale", 0.37)};
        CHECK(both("adamw", a, copy ? 12 : 11, copy ? "with a copy" : "", "kernels-community/training:adamw_f32", 1));
        host_free(&p);
        host_free(&gr);
        host_free(&m);
        host_free(&v);
        host_free(&c);
    }
    /* sum_squares: one block, fixed order in double; f64 and f32 outputs, every input dtype */
    for (size_t di = 0; di < 3; di++)
        for (int o64 = 0; o64 < 2; o64++) {
            int64_t n = 1234567, one = 1;
            host_t x, out;
            host_new(&x, *dts[di], 1, &n, 0);
            host_new(&out, o64 ? (tk_dtype){TK_DL_FLOAT, 64, 1} : F32, 1, &one, 0);
            fill(&x, 2.0);
            dev_tensor dx, dout;
            CHECK_RC(dev_upload(&dx, &x.t), TK_OK);
            CHECK_RC(dev_upload(&dout, &out.t), TK_OK);
            const char *impl = NULL;
            CHECK_RC(gpu_op_run(g.ctx, "sum_squares", (tk_arg[]){T("out", &dout.t), T("input", &dx.t)}, 2, NULL, &impl),
                     TK_OK);
            CHECK(impl && strstr(impl, "kernels-community/training:sum_squares_") == impl);
            host_t got;
            host_new(&got, out.t.dtype, 1, &one, 0);
            CHECK_RC(dev_download(&dout, &got.t), TK_OK);
            CHECK_RC(gpu_op_run(g.ctx, "sum_squares", (tk_arg[]){T("out", &out.t), T("input", &x.t)}, 2, NULL, NULL),
                     TK_OK);
            double a = o64 ? *(double *)got.buf : *(float *)got.buf, r = o64 ? *(double *)out.buf : *(float *)out.buf;
            if (!(fabs(a - r) <= 1e-12 * r + (o64 ? 0 : 1e-7 * r)))
                fprintf(stderr, "sum_squares %s -> %s: cuda %.17g, cpu %.17g\n", tk_dtype_name(x.t.dtype),
                        o64 ? "f64" : "f32", a, r);
            CHECK(fabs(a - r) <= 1e-12 * r + (o64 ? 0 : 1e-7 * r));
            dev_free(&dx);
            dev_free(&dout);
            host_free(&x);
            host_free(&out);
            host_free(&got);
        }
    gpu_ctx_free(&g);
}

static void test_coverage(void)
{
    const char *pkgs[] = {"kernels-community/layers", "kernels-community/rotary", "kernels-community/training", NULL};
    gpu_coverage_check(pkgs);
}

int main(int argc, char **argv)
{
    static const char *const ops[] = {"linear_backward",
                                      "embedding_backward",
                                      "tanh_backward",
                                      "rotary_embedding_backward",
                                      "gelu_backward",
                                      "gelu_tanh_backward",
                                      "gelu_new_backward",
                                      "gelu_fast_backward",
                                      "gelu_quick_backward",
                                      "silu_backward",
                                      "silu_and_mul_backward",
                                      "mul_and_silu_backward",
                                      "gelu_and_mul_backward",
                                      "gelu_tanh_and_mul_backward",
                                      "softmax_backward",
                                      "log_softmax_backward",
                                      "adamw",
                                      "sum_squares",
                                      NULL};
    gpu_main(argc, argv, ops);
    op_test_seed();
    RUN(test_linear_backward);
    RUN(test_layers_backward);
    RUN(test_rotary_backward);
    RUN(test_activation_backward);
    RUN(test_optimizer);
    RUN(test_coverage);
    return th_done();
}
