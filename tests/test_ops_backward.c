/*
 * test_ops_backward.c — the backward ops training uses (ops/backward_layers.c, ops/backward_act.c, the
 * rotary and attention backwards, ops/optim.c): each CPU reference against an independent float64
 * computation on fresh random inputs (ragged sizes, strided views, f32/f16/bf16), and the float64
 * formulas themselves against central finite differences of a float64 forward, so a wrong formula
 * cannot pass by agreeing with itself. torch.autograd is the second oracle
 * (tests/python/test_ops_backward.py).
 *
 * Inputs are random with a seed printed first; TK_TEST_SEED=N replays a run.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "op_test.h"
#include "tensor_util.h"
#include "ops/ops.h"

static const tk_dtype F64 = {TK_DL_FLOAT, 64, 1};

static void tol_of(tk_dtype dt, double *atol, double *rtol)
{
    if (dt.bits == 32) {
        *atol = 2e-6;
        *rtol = 2e-5;
    } else if (dt.code == TK_DL_BFLOAT) {
        *atol = 2e-2;
        *rtol = 1.6e-2;
    } else {
        *atol = 2e-3;
        *rtol = 2e-3;
    }
}

/* got against ref, with atol scaled by `unit` (the typical magnitude of the result). */
static int close_to(const char *what, const tk_tensor *got, const double *ref, double unit)
{
    double atol, rtol;
    tol_of(got->dtype, &atol, &rtol);
    op_cmp c = op_cmp_begin(atol * unit, rtol, "%s %s %s", what, tk_ops__dtype_str(got->dtype),
                            tk_ops__shape_fmt(got->ndim, got->shape));
    c.nan_fails = c.inf_fails = 1;
    if (got->ndim)
        c.cols = got->shape[got->ndim - 1];
    for (int64_t i = 0, n = numel(got); i < n; i++)
        op_cmp_at(&c, i, get(got, i), ref[i]);
    return op_cmp_end(&c);
}

/* ---- linear_backward ------------------------------------------------------------------------- */

static void run_linear(tk_dtype dt, int64_t m, int64_t k, int64_t n, int tr, int strided, int acc)
{
    host_t go, x, w, gx, gw, gb;
    int64_t sgo[2] = {m, n}, sx[2] = {m, k}, sw[2] = {tr ? k : n, tr ? n : k}, sb[1] = {n};
    host_new(&go, dt, 2, sgo, strided);
    host_new(&x, dt, 2, sx, strided);
    host_new(&w, dt, 2, sw, 0);
    host_new(&gx, dt, 2, sx, strided);
    host_new(&gw, F32, 2, sw, 0);
    host_new(&gb, F32, 1, sb, 0);
    double *g = op_rand(&go, -1, 1), *xv = op_rand(&x, -1, 1), *wv = op_rand(&w, -1, 1);
    double *gx0 = op_rand(&gx, -1, 1), *gw0 = op_rand(&gw, -1, 1), *gb0 = op_rand(&gb, -1, 1);
    tk_arg a[] = {{TK_ARG_TENSOR, "grad_x", &gx.t, 0, 0},    {TK_ARG_TENSOR, "grad_weight", &gw.t, 0, 0},
                  {TK_ARG_TENSOR, "grad_bias", &gb.t, 0, 0}, {TK_ARG_TENSOR, "grad_out", &go.t, 0, 0},
                  {TK_ARG_TENSOR, "x", &x.t, 0, 0},          {TK_ARG_TENSOR, "weight", &w.t, 0, 0},
                  {TK_ARG_I64, "transposed", NULL, tr, 0},   {TK_ARG_I64, "accumulate", NULL, acc, 0}};
    CHECK_RC(op_run_cpu("linear_backward", a, 8), TK_OK);
    double *rx = calloc((size_t)(m * k), sizeof(double)), *rw = calloc((size_t)(n * k), sizeof(double)),
           *rb = calloc((size_t)n, sizeof(double));
    for (int64_t r = 0; r < m; r++)
        for (int64_t c = 0; c < k; c++) {
            double s = acc ? gx0[r * k + c] : 0;
            for (int64_t j = 0; j < n; j++)
                s += g[r * n + j] * (tr ? wv[c * n + j] : wv[j * k + c]);
            rx[r * k + c] = s;
        }
    for (int64_t j = 0; j < n; j++) {
        double sb2 = gb0[j];
        for (int64_t r = 0; r < m; r++)
            sb2 += g[r * n + j];
        rb[j] = sb2;
        for (int64_t c = 0; c < k; c++) {
            int64_t idx = tr ? c * n + j : j * k + c;
            double s = gw0[idx];
            for (int64_t r = 0; r < m; r++)
                s += g[r * n + j] * xv[r * k + c];
            rw[idx] = s;
        }
    }
    char what[96];
    snprintf(what, sizeof what, "linear_backward tr=%d acc=%d strided=%d grad_x", tr, acc, strided);
    CHECK(close_to(what, &gx.t, rx, sqrt((double)n)));
    snprintf(what, sizeof what, "linear_backward tr=%d grad_weight", tr);
    /* grad_weight is f32; its inputs are the dtype's values */
    double atol_w = dt.bits == 32 ? 1 : 1;
    CHECK(close_to(what, &gw.t, rw, atol_w * sqrt((double)m)));
    CHECK(close_to("linear_backward grad_bias", &gb.t, rb, sqrt((double)m)));
    free(rx);
    free(rw);
    free(rb);
    free(g);
    free(xv);
    free(wv);
    free(gx0);
    free(gw0);
    free(gb0);
    host_free(&go);
    host_free(&x);
    host_free(&w);
    host_free(&gx);
    host_free(&gw);
    host_free(&gb);
}

static void test_linear_backward(void)
{
    for (size_t d = 0; d < 3; d++)
        for (int tr = 0; tr <= 1; tr++) {
            run_linear(*all_dtypes[d], 7, 33, 19, tr, 0, 0);
            run_linear(*all_dtypes[d], 5, 16, 9, tr, 3, 1);
        }
    run_linear(F32, 1, 65, 130, 0, 0, 1);
    run_linear(F32, 0, 4, 5, 1, 0, 0); /* no rows: grad_weight and grad_bias keep their values */
}

/* Only some outputs; bad shapes are named. */
static void test_linear_backward_validation(void)
{
    host_t go, x, w, gw;
    int64_t sgo[2] = {3, 4}, sx[2] = {3, 5}, sw[2] = {4, 5}, bad[2] = {5, 4};
    host_new(&go, F32, 2, sgo, 0);
    host_new(&x, F32, 2, sx, 0);
    host_new(&w, F32, 2, sw, 0);
    host_new(&gw, F32, 2, bad, 0);
    tk_arg a[] = {{TK_ARG_TENSOR, "grad_weight", &gw.t, 0, 0},
                  {TK_ARG_TENSOR, "grad_out", &go.t, 0, 0},
                  {TK_ARG_TENSOR, "x", &x.t, 0, 0},
                  {TK_ARG_TENSOR, "weight", &w.t, 0, 0}};
    CHECK_RC(op_run_cpu("linear_backward", a, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "'grad_weight' has shape [5, 4], want [4, 5]");
    CHECK_RC(op_run_cpu("linear_backward", a + 1, 3), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "nothing to compute");
    host_free(&go);
    host_free(&x);
    host_free(&w);
    host_free(&gw);
}

/* ---- embedding_backward ----------------------------------------------------------------------- */

static void test_embedding_backward(void)
{
    for (size_t d = 0; d < 3; d++) {
        tk_dtype dt = *all_dtypes[d];
        int64_t n = 37, V = 11, D = 300, pad = d == 1 ? 3 : -1;
        host_t gw, go, ids;
        int64_t sgw[2] = {V, D}, sgo[2] = {n, D}, sid[1] = {n};
        host_new(&gw, F32, 2, sgw, 0);
        host_new(&go, dt, 2, sgo, d == 2 ? 5 : 0);
        host_new(&ids, d ? I64 : I32, 1, sid, 0);
        double *g = op_rand(&go, -1, 1), *w0 = op_rand(&gw, -1, 1);
        for (int64_t i = 0; i < n; i++)
            id_set(&ids, i, (int64_t)(next_u64() % (uint64_t)V));
        tk_arg a[] = {{TK_ARG_TENSOR, "grad_weight", &gw.t, 0, 0},
                      {TK_ARG_TENSOR, "grad_out", &go.t, 0, 0},
                      {TK_ARG_TENSOR, "ids", &ids.t, 0, 0},
                      {TK_ARG_I64, "padding_idx", NULL, pad, 0}};
        CHECK_RC(op_run_cpu("embedding_backward", a, 4), TK_OK);
        for (int64_t i = 0; i < n; i++)
            if (id_get(&ids, i) != pad)
                for (int64_t c = 0; c < D; c++)
                    w0[id_get(&ids, i) * D + c] += g[i * D + c];
        CHECK(close_to("embedding_backward", &gw.t, w0, 4));
        /* deterministic: a second run from the same start gives the same bytes */
        if (d == 0) {
            host_t gw2;
            host_new(&gw2, F32, 2, sgw, 0);
            tk_arg b[] = {{TK_ARG_TENSOR, "grad_weight", &gw2.t, 0, 0},
                          {TK_ARG_TENSOR, "grad_out", &go.t, 0, 0},
                          {TK_ARG_TENSOR, "ids", &ids.t, 0, 0}};
            host_t gw3;
            host_new(&gw3, F32, 2, sgw, 0);
            tk_arg c3[] = {{TK_ARG_TENSOR, "grad_weight", &gw3.t, 0, 0},
                           {TK_ARG_TENSOR, "grad_out", &go.t, 0, 0},
                           {TK_ARG_TENSOR, "ids", &ids.t, 0, 0}};
            CHECK_RC(op_run_cpu("embedding_backward", b, 3), TK_OK);
            CHECK_RC(op_run_cpu("embedding_backward", c3, 3), TK_OK);
            CHECK(memcmp(gw2.buf, gw3.buf, (size_t)(V * D) * 4) == 0);
            host_free(&gw2);
            host_free(&gw3);
        }
        /* an id out of range writes nothing */
        id_set(&ids, 5, V);
        float before = ((float *)gw.buf)[0];
        CHECK_RC(op_run_cpu("embedding_backward", a, 4), TK_ERR_INVALID);
        CHECK_CONTAINS(tk_last_error(), "out of range");
        CHECK(((float *)gw.buf)[0] == before);
        free(g);
        free(w0);
        host_free(&gw);
        host_free(&go);
        host_free(&ids);
    }
}

/* ---- activations ------------------------------------------------------------------------------ */

static double f_silu(double x) { return x / (1 + exp(-x)); }
static double f_gelu(double x) { return 0.5 * x * (1 + erf(x / sqrt(2.0))); }
static double f_gelu_tanh(double x) { return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }
static double f_gelu_new(double x) { return 0.5 * x * (1 + tanh((double)0.79788456f * (x + 0.044715 * x * x * x))); }
static double f_gelu_quick(double x) { return x / (1 + exp(-1.702 * x)); }
static double f_tanh(double x) { return tanh(x); }

/* The derivative by central differences (h = 1e-5 in double: error ~1e-10). */
static double fd(double (*f)(double), double x) { return (f(x + 1e-5) - f(x - 1e-5)) / 2e-5; }

static void test_activation_backward(void)
{
    static const struct {
        const char *op;
        double (*f)(double);
    } plain[] = {
        {"silu_backward", f_silu},         {"gelu_backward", f_gelu},          {"gelu_tanh_backward", f_gelu_tanh},
        {"gelu_new_backward", f_gelu_new}, {"gelu_fast_backward", f_gelu_new}, {"gelu_quick_backward", f_gelu_quick},
        {"tanh_backward", f_tanh}};
    for (size_t d = 0; d < 3; d++) {
        tk_dtype dt = *all_dtypes[d];
        for (size_t o = 0; o < sizeof plain / sizeof plain[0]; o++) {
            host_t gi, go, x;
            int64_t s[2] = {5, 1027};
            host_new(&gi, dt, 2, s, 0);
            host_new(&go, dt, 2, s, d == 1 ? 2 : 0);
            host_new(&x, dt, 2, s, 0);
            double *g = op_rand(&go, -2, 2), *xv = op_rand(&x, -6, 6);
            tk_arg a[] = {{TK_ARG_TENSOR, "grad_input", &gi.t, 0, 0},
                          {TK_ARG_TENSOR, "grad_out", &go.t, 0, 0},
                          {TK_ARG_TENSOR, "input", &x.t, 0, 0}};
            CHECK_RC(op_run_cpu(plain[o].op, a, 3), TK_OK);
            double *ref = malloc(sizeof(double) * 5 * 1027);
            for (int64_t i = 0; i < 5 * 1027; i++)
                ref[i] = g[i] * fd(plain[o].f, xv[i]);
            CHECK(close_to(plain[o].op, &gi.t, ref, 1));
            /* in place: grad_input is grad_out itself */
            if (d == 0) {
                tk_arg b[] = {{TK_ARG_TENSOR, "grad_input", &go.t, 0, 0},
                              {TK_ARG_TENSOR, "grad_out", &go.t, 0, 0},
                              {TK_ARG_TENSOR, "input", &x.t, 0, 0}};
                CHECK_RC(op_run_cpu(plain[o].op, b, 3), TK_OK);
                CHECK(memcmp(go.buf, gi.buf, 5 * 1027 * 4) == 0);
            }
            free(ref);
            free(g);
            free(xv);
            host_free(&gi);
            host_free(&go);
            host_free(&x);
        }
    }
}

static void test_gated_backward(void)
{
    static const struct {
        const char *op;
        double (*f)(double);
        int act_first;
    } gated[] = {{"silu_and_mul_backward", f_silu, 1},
                 {"mul_and_silu_backward", f_silu, 0},
                 {"gelu_and_mul_backward", f_gelu, 1},
                 {"gelu_tanh_and_mul_backward", f_gelu_tanh, 1}};
    for (size_t d = 0; d < 3; d++)
        for (size_t o = 0; o < sizeof gated / sizeof gated[0]; o++) {
            tk_dtype dt = *all_dtypes[d];
            int64_t rows = 6, dd = 1100;
            host_t gi, go, x;
            int64_t s2[2] = {rows, 2 * dd}, s1[2] = {rows, dd};
            host_new(&gi, dt, 2, s2, d == 2 ? 3 : 0);
            host_new(&go, dt, 2, s1, 0);
            host_new(&x, dt, 2, s2, 0);
            double *g = op_rand(&go, -2, 2), *xv = op_rand(&x, -5, 5);
            tk_arg a[] = {{TK_ARG_TENSOR, "grad_input", &gi.t, 0, 0},
                          {TK_ARG_TENSOR, "grad_out", &go.t, 0, 0},
                          {TK_ARG_TENSOR, "input", &x.t, 0, 0}};
            CHECK_RC(op_run_cpu(gated[o].op, a, 3), TK_OK);
            double *ref = malloc(sizeof(double) * (size_t)(rows * 2 * dd));
            for (int64_t r = 0; r < rows; r++)
                for (int64_t c = 0; c < dd; c++) {
                    double av = xv[r * 2 * dd + c], bv = xv[r * 2 * dd + dd + c], gv = g[r * dd + c];
                    /* out = act(a) b or a act(b): the partial derivatives by finite differences */
                    if (gated[o].act_first) {
                        ref[r * 2 * dd + c] = gv * bv * fd(gated[o].f, av);
                        ref[r * 2 * dd + dd + c] = gv * gated[o].f(av);
                    } else {
                        ref[r * 2 * dd + c] = gv * gated[o].f(bv);
                        ref[r * 2 * dd + dd + c] = gv * av * fd(gated[o].f, bv);
                    }
                }
            CHECK(close_to(gated[o].op, &gi.t, ref, 2));
            free(ref);
            free(g);
            free(xv);
            host_free(&gi);
            host_free(&go);
            host_free(&x);
        }
}

/* ---- softmax_backward / log_softmax_backward -------------------------------------------------- */

static void test_softmax_backward(void)
{
    for (size_t d = 0; d < 3; d++)
        for (int lg = 0; lg <= 1; lg++) {
            tk_dtype dt = *all_dtypes[d];
            int64_t rows = 4, n = 1500;
            host_t gi, go, y;
            int64_t s[2] = {rows, n};
            host_new(&gi, dt, 2, s, 0);
            host_new(&go, dt, 2, s, lg ? 1 : 0);
            host_new(&y, dt, 2, s, 0);
            double *g = op_rand(&go, -1, 1);
            /* y: the forward of random logits, in double, stored in the dtype */
            double *z = malloc(sizeof(double) * (size_t)(rows * n));
            for (int64_t r = 0; r < rows; r++) {
                double m = -INFINITY, sum = 0;
                for (int64_t c = 0; c < n; c++)
                    m = fmax(m, z[r * n + c] = uniform(-4, 4));
                for (int64_t c = 0; c < n; c++)
                    sum += exp(z[r * n + c] - m);
                for (int64_t c = 0; c < n; c++)
                    set(&y.t, r * n + c, lg ? z[r * n + c] - m - log(sum) : exp(z[r * n + c] - m) / sum);
            }
            double *yv = op_values(&y.t);
            tk_arg a[] = {{TK_ARG_TENSOR, "grad_input", &gi.t, 0, 0},
                          {TK_ARG_TENSOR, "grad_out", &go.t, 0, 0},
                          {TK_ARG_TENSOR, "out", &y.t, 0, 0}};
            const char *op = lg ? "log_softmax_backward" : "softmax_backward";
            CHECK_RC(op_run_cpu(op, a, 3), TK_OK);
            double *ref = malloc(sizeof(double) * (size_t)(rows * n));
            for (int64_t r = 0; r < rows; r++) {
                double sdot = 0, sg = 0;
                for (int64_t c = 0; c < n; c++) {
                    sdot += g[r * n + c] * yv[r * n + c];
                    sg += g[r * n + c];
                }
                for (int64_t c = 0; c < n; c++)
                    ref[r * n + c] =
                        lg ? g[r * n + c] - exp(yv[r * n + c]) * sg : yv[r * n + c] * (g[r * n + c] - sdot);
            }
            CHECK(close_to(op, &gi.t, ref, lg ? 1 : 1e-3));
            free(ref);
            free(z);
            free(yv);
            free(g);
            host_free(&gi);
            host_free(&go);
            host_free(&y);
        }
}

/* ---- rotary_embedding_backward: the rotation's transpose -------------------------------------- */

/* <R q, g> == <q, R^T g> for the forward R (rotary_embedding) and its backward R^T, in double. */
static void test_rotary_backward(void)
{
    for (int neox = 0; neox <= 1; neox++) {
        int64_t T = 9, Hq = 4, Hkv = 2, D = 32, rot = 24, P = 16;
        host_t q, k, gq, gk, pos, cache;
        int64_t sq[3] = {T, Hq, D}, sk[3] = {T, Hkv, D}, sp[1] = {T}, sc[2] = {P, rot};
        host_new(&q, F32, 3, sq, 0);
        host_new(&k, F32, 3, sk, 0);
        host_new(&gq, F32, 3, sq, 0);
        host_new(&gk, F32, 3, sk, 0);
        host_new(&pos, I64, 1, sp, 0);
        host_new(&cache, F32, 2, sc, 0);
        double *q0 = op_rand(&q, -1, 1), *k0 = op_rand(&k, -1, 1), *g0 = op_rand(&gq, -1, 1), *h0 = op_rand(&gk, -1, 1);
        for (int64_t t = 0; t < T; t++)
            id_set(&pos, t, (int64_t)(next_u64() % (uint64_t)P));
        tk_arg cc[] = {{TK_ARG_TENSOR, "out", &cache.t, 0, 0}};
        CHECK_RC(op_run_cpu("rope_cos_sin_cache", cc, 1), TK_OK);
        tk_arg f[] = {{TK_ARG_TENSOR, "query", &q.t, 0, 0},
                      {TK_ARG_TENSOR, "key", &k.t, 0, 0},
                      {TK_ARG_TENSOR, "positions", &pos.t, 0, 0},
                      {TK_ARG_TENSOR, "cos_sin_cache", &cache.t, 0, 0},
                      {TK_ARG_I64, "is_neox", NULL, neox, 0}};
        tk_arg b[] = {{TK_ARG_TENSOR, "grad_query", &gq.t, 0, 0},
                      {TK_ARG_TENSOR, "grad_key", &gk.t, 0, 0},
                      {TK_ARG_TENSOR, "positions", &pos.t, 0, 0},
                      {TK_ARG_TENSOR, "cos_sin_cache", &cache.t, 0, 0},
                      {TK_ARG_I64, "is_neox", NULL, neox, 0}};
        CHECK_RC(op_run_cpu("rotary_embedding", f, 5), TK_OK);
        CHECK_RC(op_run_cpu("rotary_embedding_backward", b, 5), TK_OK);
        double l = 0, r = 0;
        for (int64_t i = 0; i < T * Hq * D; i++) {
            l += get(&q.t, i) * g0[i];
            r += q0[i] * get(&gq.t, i);
        }
        for (int64_t i = 0; i < T * Hkv * D; i++) {
            l += get(&k.t, i) * h0[i];
            r += k0[i] * get(&gk.t, i);
        }
        if (fabs(l - r) > 1e-4 * (1 + fabs(l)))
            fprintf(stderr, "rotary neox=%d: <Rq, g> = %.9g, <q, R^T g> = %.9g\n", neox, l, r);
        CHECK(fabs(l - r) <= 1e-4 * (1 + fabs(l)));
        /* and R^T R = I: the backward undoes the forward */
        CHECK_RC(op_run_cpu("rotary_embedding_backward",
                            (tk_arg[]){{TK_ARG_TENSOR, "grad_query", &q.t, 0, 0},
                                       {TK_ARG_TENSOR, "grad_key", &k.t, 0, 0},
                                       {TK_ARG_TENSOR, "positions", &pos.t, 0, 0},
                                       {TK_ARG_TENSOR, "cos_sin_cache", &cache.t, 0, 0},
                                       {TK_ARG_I64, "is_neox", NULL, neox, 0}},
                            5),
                 TK_OK);
        CHECK(close_to("rotary R^T R q", &q.t, q0, 1));
        CHECK(close_to("rotary R^T R k", &k.t, k0, 1));
        free(q0);
        free(k0);
        free(g0);
        free(h0);
        host_free(&q);
        host_free(&k);
        host_free(&gq);
        host_free(&gk);
        host_free(&pos);
        host_free(&cache);
    }
}

/* ---- attention_backward: varlen against per-sequence calls, and finite differences ------------- */

/* The attention of one sequence in double (causal with window wl, GQA), and L = sum(out * w). */
static double attn_loss(const double *q, const double *k, const double *v, const double *w, int64_t nq, int64_t nk,
                        int64_t hq, int64_t hkv, int64_t d, int causal, int64_t wl)
{
    double L = 0, scale = 1 / sqrt((double)d);
    for (int64_t h = 0; h < hq; h++)
        for (int64_t i = 0; i < nq; i++) {
            int64_t p = i + nk - nq, hk = h / (hq / hkv);
            double s[64], m = -INFINITY, z = 0;
            for (int64_t j = 0; j < nk; j++) {
                int vis = (!causal || j <= p) && (wl < 0 || j >= p - wl);
                double dot = 0;
                for (int64_t x = 0; x < d; x++)
                    dot += q[(i * hq + h) * d + x] * k[(j * hkv + hk) * d + x];
                s[j] = vis ? dot * scale : -INFINITY;
                m = fmax(m, s[j]);
            }
            for (int64_t j = 0; j < nk; j++)
                z += s[j] == -INFINITY ? 0 : exp(s[j] - m);
            for (int64_t x = 0; x < d; x++) {
                double o = 0;
                for (int64_t j = 0; j < nk; j++)
                    if (s[j] != -INFINITY)
                        o += exp(s[j] - m) / z * v[(j * hkv + hk) * d + x];
                L += o * w[(i * hq + h) * d + x];
            }
        }
    return L;
}

static void test_attention_backward_varlen(void)
{
    /* three sequences packed (lengths 5, 1, 7), GQA 4:2, causal, window 3 on the second run */
    int64_t lens[3] = {5, 1, 7}, T = 13, Hq = 4, Hkv = 2, D = 8;
    for (int wl = -1; wl <= 3; wl += 4) {
        host_t q, k, v, out, lse, dout, dq, dk, dv, cu;
        int64_t s4q[4] = {1, T, Hq, D}, s4k[4] = {1, T, Hkv, D}, sl[3] = {1, Hq, T}, sc[1] = {4};
        host_new(&q, F32, 4, s4q, 0);
        host_new(&k, F32, 4, s4k, 0);
        host_new(&v, F32, 4, s4k, 0);
        host_new(&out, F32, 4, s4q, 0);
        host_new(&lse, F32, 3, sl, 0);
        host_new(&dout, F32, 4, s4q, 0);
        host_new(&dq, F32, 4, s4q, 0);
        host_new(&dk, F32, 4, s4k, 0);
        host_new(&dv, F32, 4, s4k, 0);
        host_new(&cu, I32, 1, sc, 0);
        double *qv = op_rand(&q, -1, 1), *kv = op_rand(&k, -1, 1), *vv = op_rand(&v, -1, 1), *w = op_rand(&dout, -1, 1);
        int64_t starts[4] = {0, 5, 6, 13};
        for (int i = 0; i < 4; i++)
            id_set(&cu, i, starts[i]);
        tk_arg fa[] = {{TK_ARG_TENSOR, "out", &out.t, 0, 0},
                       {TK_ARG_TENSOR, "q", &q.t, 0, 0},
                       {TK_ARG_TENSOR, "k", &k.t, 0, 0},
                       {TK_ARG_TENSOR, "v", &v.t, 0, 0},
                       {TK_ARG_TENSOR, "lse", &lse.t, 0, 0},
                       {TK_ARG_TENSOR, "cu_seqlens_q", &cu.t, 0, 0},
                       {TK_ARG_TENSOR, "cu_seqlens_k", &cu.t, 0, 0},
                       {TK_ARG_I64, "max_seqlen_q", NULL, 7, 0},
                       {TK_ARG_I64, "causal", NULL, 1, 0},
                       {TK_ARG_I64, "window_left", NULL, wl, 0}};
        CHECK_RC(op_run_cpu("attention", fa, 10), TK_OK);
        tk_arg ba[] = {{TK_ARG_TENSOR, "dq", &dq.t, 0, 0},
                       {TK_ARG_TENSOR, "dk", &dk.t, 0, 0},
                       {TK_ARG_TENSOR, "dv", &dv.t, 0, 0},
                       {TK_ARG_TENSOR, "dout", &dout.t, 0, 0},
                       {TK_ARG_TENSOR, "q", &q.t, 0, 0},
                       {TK_ARG_TENSOR, "k", &k.t, 0, 0},
                       {TK_ARG_TENSOR, "v", &v.t, 0, 0},
                       {TK_ARG_TENSOR, "out", &out.t, 0, 0},
                       {TK_ARG_TENSOR, "lse", &lse.t, 0, 0},
                       {TK_ARG_TENSOR, "cu_seqlens_q", &cu.t, 0, 0},
                       {TK_ARG_TENSOR, "cu_seqlens_k", &cu.t, 0, 0},
                       {TK_ARG_I64, "max_seqlen_q", NULL, 7, 0},
                       {TK_ARG_I64, "causal", NULL, 1, 0},
                       {TK_ARG_I64, "window_left", NULL, wl, 0}};
        CHECK_RC(op_run_cpu("attention_backward", ba, 14), TK_OK);
        /* finite differences of L = sum(out * dout) per sequence, in double */
        double *rq = calloc((size_t)(T * Hq * D), sizeof(double)), *rk = calloc((size_t)(T * Hkv * D), sizeof(double)),
               *rv = calloc((size_t)(T * Hkv * D), sizeof(double));
        for (int s = 0; s < 3; s++) {
            int64_t n = lens[s], o = starts[s];
            double *qs = qv + o * Hq * D, *ks = kv + o * Hkv * D, *vs = vv + o * Hkv * D, *ws = w + o * Hq * D;
            double *tgt[3] = {qs, ks, vs}, *res[3] = {rq + o * Hq * D, rk + o * Hkv * D, rv + o * Hkv * D};
            int64_t cnt[3] = {n * Hq * D, n * Hkv * D, n * Hkv * D};
            for (int a = 0; a < 3; a++)
                for (int64_t e = 0; e < cnt[a]; e++) {
                    double keep = tgt[a][e];
                    tgt[a][e] = keep + 1e-6;
                    double lp = attn_loss(qs, ks, vs, ws, n, n, Hq, Hkv, D, 1, wl);
                    tgt[a][e] = keep - 1e-6;
                    double lm = attn_loss(qs, ks, vs, ws, n, n, Hq, Hkv, D, 1, wl);
                    tgt[a][e] = keep;
                    res[a][e] = (lp - lm) / 2e-6;
                }
        }
        CHECK(close_to("attention_backward varlen dq", &dq.t, rq, 1e2));
        CHECK(close_to("attention_backward varlen dk", &dk.t, rk, 1e2));
        CHECK(close_to("attention_backward varlen dv", &dv.t, rv, 1e2));
        free(rq);
        free(rk);
        free(rv);
        free(qv);
        free(kv);
        free(vv);
        free(w);
        host_t *all[] = {&q, &k, &v, &out, &lse, &dout, &dq, &dk, &dv, &cu};
        for (size_t i = 0; i < 10; i++)
            host_free(all[i]);
    }
}

/* ---- adamw and sum_squares -------------------------------------------------------------------- */

/* torch.optim.AdamW's single-tensor step in fp32, written out operation by operation. */
static void ref_adamw(float *p, const float *g, float *m, float *v, int64_t n, double lr, double b1, double b2,
                      double eps, double wd, int64_t step, double gs)
{
    double bc1 = 1 - pow(b1, (double)step), bc2 = 1 - pow(b2, (double)step);
    float decay = (float)(1 - lr * wd), w1 = (float)(1 - b1), fb2 = (float)b2, w2 = (float)(1 - b2),
          bc2s = (float)sqrt(bc2), feps = (float)eps, ss = (float)(-(lr / bc1)), fgs = (float)gs;
    for (int64_t i = 0; i < n; i++) {
        volatile float gi = g[i] * fgs;
        volatile float pi = p[i] * decay;
        volatile float d = gi - m[i];
        volatile float t = w1 * d;
        m[i] = m[i] + t;
        volatile float vv = v[i] * fb2;
        volatile float a = w2 * gi;
        volatile float a2 = a * gi;
        v[i] = vv + a2;
        volatile float sq = sqrtf(v[i]);
        volatile float q = sq / bc2s;
        volatile float den = q + feps;
        volatile float num = ss * m[i];
        volatile float upd = num / den;
        p[i] = pi + upd;
    }
}

static void test_adamw_exact(void)
{
    int64_t n = 10007;
    host_t p, g, m, v, copy;
    int64_t s[1] = {n};
    host_new(&p, F32, 1, s, 0);
    host_new(&g, F32, 1, s, 0);
    host_new(&m, F32, 1, s, 0);
    host_new(&v, F32, 1, s, 0);
    host_new(&copy, BF16, 1, s, 0);
    fill_range(&p, -1, 1);
    float *rp = malloc(sizeof(float) * (size_t)n), *rm = calloc((size_t)n, sizeof(float)),
          *rv = calloc((size_t)n, sizeof(float));
    memcpy(rp, p.buf, (size_t)n * 4);
    for (int64_t step = 1; step <= 5; step++) {
        fill_range(&g, -0.1, 0.1);
        double lr = 1e-3 * (double)step, gs = step == 3 ? 0.25 : 1.0;
        tk_arg a[] = {{TK_ARG_TENSOR, "param", &p.t, 0, 0},         {TK_ARG_TENSOR, "grad", &g.t, 0, 0},
                      {TK_ARG_TENSOR, "exp_avg", &m.t, 0, 0},       {TK_ARG_TENSOR, "exp_avg_sq", &v.t, 0, 0},
                      {TK_ARG_TENSOR, "param_copy", &copy.t, 0, 0}, {TK_ARG_F64, "lr", NULL, 0, lr},
                      {TK_ARG_F64, "weight_decay", NULL, 0, 0.1},   {TK_ARG_I64, "step", NULL, step, 0},
                      {TK_ARG_F64, "grad_scale", NULL, 0, gs}};
        CHECK_RC(op_run_cpu("adamw", a, 9), TK_OK);
        ref_adamw(rp, g.buf, rm, rv, n, lr, 0.9, 0.999, 1e-8, 0.1, step, gs);
    }
    /* bit for bit: the same fp32 operations in the same order */
    CHECK(memcmp(rp, p.buf, (size_t)n * 4) == 0);
    CHECK(memcmp(rm, m.buf, (size_t)n * 4) == 0);
    CHECK(memcmp(rv, v.buf, (size_t)n * 4) == 0);
    double *pv = op_values(&p.t);
    CHECK(close_to("adamw param_copy", &copy.t, pv, 1));
    free(pv);
    /* step 0 and betas out of range are refused */
    tk_arg bad[] = {{TK_ARG_TENSOR, "param", &p.t, 0, 0},
                    {TK_ARG_TENSOR, "grad", &g.t, 0, 0},
                    {TK_ARG_TENSOR, "exp_avg", &m.t, 0, 0},
                    {TK_ARG_TENSOR, "exp_avg_sq", &v.t, 0, 0},
                    {TK_ARG_I64, "step", NULL, 0, 0}};
    CHECK_RC(op_run_cpu("adamw", bad, 5), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "'step' is 0");
    free(rp);
    free(rm);
    free(rv);
    host_free(&p);
    host_free(&g);
    host_free(&m);
    host_free(&v);
    host_free(&copy);
}

static void test_sum_squares(void)
{
    host_t x, out;
    int64_t s[2] = {33, 1000}, one[1] = {1};
    host_new(&x, BF16, 2, s, 7);
    host_new(&out, F64, 1, one, 0);
    double *xv = op_rand(&x, -3, 3), ref = 0;
    for (int64_t i = 0; i < 33000; i++)
        ref += xv[i] * xv[i];
    tk_arg a[] = {{TK_ARG_TENSOR, "out", &out.t, 0, 0}, {TK_ARG_TENSOR, "input", &x.t, 0, 0}};
    CHECK_RC(op_run_cpu("sum_squares", a, 2), TK_OK);
    double got = *(double *)out.buf;
    CHECK(fabs(got - ref) <= 1e-12 * ref);
    /* a NaN anywhere makes it NaN: the non-finite check training relies on */
    set(&x.t, 12345, NAN);
    CHECK_RC(op_run_cpu("sum_squares", a, 2), TK_OK);
    CHECK(isnan(*(double *)out.buf));
    free(xv);
    host_free(&x);
    host_free(&out);
}

int main(void)
{
    op_test_seed();
    RUN(test_linear_backward);
    RUN(test_linear_backward_validation);
    RUN(test_embedding_backward);
    RUN(test_activation_backward);
    RUN(test_gated_backward);
    RUN(test_softmax_backward);
    RUN(test_rotary_backward);
    RUN(test_attention_backward_varlen);
    RUN(test_adamw_exact);
    RUN(test_sum_squares);
    return th_done();
}
