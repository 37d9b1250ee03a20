/*
 * test_ops_loss.c — the loss ops (ops/loss.c): each CPU reference against an independent float64
 * computation on fresh random inputs, and the validation messages.
 *
 *   cross_entropy               f32/f16/bf16, ragged V (1, 7, 13, 2049, ...), one row, every reduction,
 *                               label smoothing, ignored rows and whole ignored batches, the gradient
 *                               into a separate tensor and in place, lse; +-inf, NaN, huge and tiny
 *                               logits; the gradient against float64 finite differences
 *   fused_linear_cross_entropy  against logits computed in float64, chunk sizes 1 .. N, bias, every
 *                               gradient, agreement with cross_entropy on the materialised logits
 *                               (the unfused path), finite differences
 *   max_margin_loss, infonce    against float64 definitions and finite differences
 *
 * Inputs are random with a seed printed on any failure; set TK_TEST_SEED to replay one.
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

/* ---- host tensors ----------------------------------------------------------------------------- */

static tk_arg T_(const char *name, const host_t *h) { return (tk_arg){TK_ARG_TENSOR, name, &h->t, 0, 0}; }
static tk_arg I_(const char *name, int64_t v) { return (tk_arg){TK_ARG_I64, name, NULL, v, 0}; }
static tk_arg F_(const char *name, double v) { return (tk_arg){TK_ARG_F64, name, NULL, 0, v}; }

/* The rounding error of storing into dt (relative), and an absolute floor for values near 0. */
static double dt_rtol(tk_dtype dt) { return dt.bits == 32 ? 2e-6 : dt.code == TK_DL_BFLOAT ? 8e-3 : 1e-3; }
static double dt_atol(tk_dtype dt)
{
    return dt.bits == 16 && dt.code != TK_DL_BFLOAT ? 3.0e-8 : 1e-12;
} /* f16: half a subnormal step */

/* ---- float64 cross-entropy (PyTorch's definition, written out) --------------------------------- */

/* One row: loss = -sum_j q_j log_softmax_j, q = (1 - eps) onehot(t) + eps / V; grad_j = softmax_j - q_j.
 * t < 0: ignored (loss 0, grad 0). A row with NaN or +inf, or all -inf, is NaN throughout. */
static void ref_ce_row(const double *x, int64_t v, int64_t t, double eps, double *loss, double *lse, double *grad)
{
    double m = -INFINITY;
    int bad = 0;
    for (int64_t j = 0; j < v; j++) {
        if (isnan(x[j]) || x[j] == INFINITY)
            bad = 1;
        else if (x[j] > m)
            m = x[j];
    }
    if (m == -INFINITY)
        bad = 1;
    double sum = 0;
    for (int64_t j = 0; !bad && j < v; j++)
        sum += exp(x[j] - m);
    *lse = bad ? (m == -INFINITY && v > 0 && !isnan(x[0]) && x[0] != INFINITY ? -INFINITY : NAN) : m + log(sum);
    if (t < 0) {
        *loss = 0;
        for (int64_t j = 0; grad && j < v; j++)
            grad[j] = 0;
        return;
    }
    double l = 0;
    for (int64_t j = 0; j < v; j++) {
        double q = (j == t ? 1 - eps : 0) + eps / (double)v;
        double logp = (x[j] - m) - log(sum); /* not x - lse: m + log(sum) may round away log(sum) */
        if (q != 0)
            l -= q * logp;
        if (grad)
            grad[j] = bad ? NAN : exp(logp) - q;
    }
    *loss = bad ? NAN : l;
}

/* The whole call: losses per row (rows[N]), lse[N], grads[N*V] (unscaled per row), and the reduced
 * loss; returns the gradient scale. */
static double ref_ce(const double *x, const int64_t *tg, int64_t n, int64_t v, int64_t ignore, double eps, int red,
                     double *rows, double *lse, double *grad, double *reduced)
{
    int64_t valid = 0;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t t = tg[i] == ignore ? -1 : tg[i];
        valid += t >= 0;
        ref_ce_row(x + i * v, v, t, eps, &rows[i], &lse[i], grad ? grad + i * v : NULL);
        sum += rows[i];
    }
    double scale = red == 1 ? (valid ? 1.0 / (double)valid : 0.0) : 1.0;
    *reduced = red == 1 ? sum * scale : sum;
    if (grad)
        for (int64_t i = 0; i < n * v; i++)
            grad[i] *= scale;
    return scale;
}

/* ---- cross_entropy ------------------------------------------------------------------------------ */

enum { GRAD_NONE, GRAD_SEPARATE, GRAD_INPLACE };

/* One call on logits already filled in x (N x V of dt) and targets tg. Returns 1 when it matches. */
static int ce_check(host_t *x, const int64_t *tg, int64_t ignore, double eps, int red, int gmode, int with_lse,
                    const char *what)
{
    int64_t n = x->t.shape[0], v = x->t.shape[1];
    double *xv = op_values(&x->t), *rows = malloc(sizeof(double) * (size_t)(n + 1)),
           *lse = malloc(sizeof(double) * (size_t)(n + 1));
    double *grad = malloc(sizeof(double) * (size_t)(n * v + 1)), reduced;
    ref_ce(xv, tg, n, v, ignore, eps, red, rows, lse, grad, &reduced);
    host_t t, loss, g, l;
    host_new(&t, I64, 1, &n, 0);
    memcpy(t.buf, tg, sizeof(int64_t) * (size_t)n);
    int64_t one = 1;
    host_new(&loss, F32, red == 0 ? 1 : (next_u64() & 1), red == 0 ? &n : &one, 0);
    host_new(&g, x->t.dtype, 2, x->t.shape, gmode == GRAD_SEPARATE && (next_u64() & 1) ? 3 : 0);
    host_new(&l, F32, 1, &n, 0);
    tk_arg args[8] = {T_("logits", x),
                      T_("target", &t),
                      T_("loss", &loss),
                      I_("ignore_index", ignore),
                      F_("label_smoothing", eps),
                      I_("reduction", red)};
    size_t na = 6;
    if (gmode == GRAD_SEPARATE)
        args[na++] = T_("grad", &g);
    if (gmode == GRAD_INPLACE)
        args[na++] = T_("grad", x);
    if (with_lse)
        args[na++] = T_("lse", &l);
    int rc = op_run_cpu("cross_entropy", args, na), ok = 1;
    char buf[200];
    if (rc != TK_OK) {
        fprintf(stderr, "  cross_entropy %s: rc %d: %s (seed %llu)\n", what, rc, tk_last_error(),
                (unsigned long long)seed);
        ok = 0;
    } else {
        snprintf(buf, sizeof buf, "cross_entropy %s %s loss (red %d)", tk_ops__dtype_str(x->t.dtype), what, red);
        ok &= op_close_tensor(buf, &loss.t, red == 0 ? rows : &reduced, 1e-30, 1e-5);
        if (gmode != GRAD_NONE) {
            snprintf(buf, sizeof buf, "cross_entropy %s grad%s", what, gmode == GRAD_INPLACE ? " (in place)" : "");
            ok &= op_close_tensor(buf, gmode == GRAD_INPLACE ? &x->t : &g.t, grad, dt_atol(x->t.dtype),
                                  dt_rtol(x->t.dtype));
        }
        if (with_lse) {
            snprintf(buf, sizeof buf, "cross_entropy %s lse", what);
            ok &= op_close_tensor(buf, &l.t, lse, 1e-30, 1e-6);
        }
    }
    free(xv);
    free(rows);
    free(lse);
    free(grad);
    host_free(&t);
    host_free(&loss);
    host_free(&g);
    host_free(&l);
    return ok;
}

/* Random targets in [0, v), each ignored with probability p_ignore. */
static void random_targets(int64_t *tg, int64_t n, int64_t v, double p_ignore, int64_t ignore)
{
    for (int64_t i = 0; i < n; i++)
        tg[i] = uniform(0, 1) < p_ignore ? ignore : (int64_t)(next_u64() % (uint64_t)v);
}

static const int64_t ce_shapes[][2] = {{1, 1},    {1, 7},  {3, 13},   {5, 100}, {4, 1000},
                                       {2, 2049}, {7, 33}, {3, 5000}, {16, 8},  {2, 262144}};

static void test_ce_random(void)
{
    int ok = 1;
    for (size_t s = 0; s < sizeof ce_shapes / sizeof ce_shapes[0]; s++)
        for (size_t k = 0; k < 3; k++)
            for (int red = 0; red < 3; red++) {
                int64_t n = ce_shapes[s][0], v = ce_shapes[s][1];
                host_t x;
                host_new(&x, *all_dtypes[k], 2, ce_shapes[s], (next_u64() & 1) ? 5 : 0);
                fill(&x, uniform(0.5, 8));
                int64_t *tg = malloc(sizeof(int64_t) * (size_t)n), ignore = (next_u64() & 1) ? -100 : 0;
                random_targets(tg, n, v, 0.25, ignore);
                double eps = (next_u64() & 1) ? 0.0 : uniform(0.0, 1.0);
                int gmode = (int)(next_u64() % 3);
                if (gmode == GRAD_INPLACE && x.t.strides)
                    gmode = GRAD_SEPARATE; /* in place is over the logits' own layout: fine too, but keep both */
                char what[96];
                snprintf(what, sizeof what, "[%lld, %lld]%s eps %.3g ignore %lld", (long long)n, (long long)v,
                         x.t.strides ? " strided" : "", eps, (long long)ignore);
                ok &= ce_check(&x, tg, ignore, eps, red, gmode, (int)(next_u64() & 1), what);
                free(tg);
                host_free(&x);
            }
    CHECK(ok);
}

/* Gradients in place over strided logits, and every combination of outputs on one shape. */
static void test_ce_modes(void)
{
    int64_t sh[2] = {6, 37};
    int ok = 1;
    for (size_t k = 0; k < 3; k++)
        for (int gmode = 0; gmode < 3; gmode++)
            for (int with_lse = 0; with_lse < 2; with_lse++) {
                host_t x;
                host_new(&x, *all_dtypes[k], 2, sh, gmode == GRAD_INPLACE ? 2 : 0);
                fill(&x, 3);
                int64_t tg[6];
                random_targets(tg, 6, 37, 0.3, -100);
                ok &= ce_check(&x, tg, -100, 0.1, 1, gmode, with_lse, "modes");
                host_free(&x);
            }
    CHECK(ok);
}

/* Special values: -inf entries, a -inf target logit, an all -inf row, +inf, NaN, huge and tiny. */
static void test_ce_special(void)
{
    const int64_t v = 11, n = 8;
    int64_t sh[2] = {n, v};
    int ok = 1;
    for (size_t k = 0; k < 3; k++)
        for (int e = 0; e < 3; e++) {
            tk_dtype dt = *all_dtypes[k];
            double eps = e == 0 ? 0.0 : e == 1 ? 0.2 : 1.0;
            host_t x;
            host_new(&x, dt, 2, sh, 0);
            fill(&x, 4);
            int64_t tg[8] = {3, 4, 0, 2, 5, 1, 7, 9};
            set(&x.t, 0 * v + 1, -INFINITY); /* row 0: some -inf, target finite */
            set(&x.t, 0 * v + 7, -INFINITY);
            set(&x.t, 1 * v + 4, -INFINITY); /* row 1: the target is -inf */
            for (int64_t j = 0; j < v; j++)  /* row 2: all -inf */
                set(&x.t, 2 * v + j, -INFINITY);
            set(&x.t, 3 * v + 6, INFINITY); /* row 3: +inf */
            set(&x.t, 4 * v + 0, NAN);      /* row 4: NaN */
            double big = dt.bits == 32 || dt.code == TK_DL_BFLOAT ? 1e30 : 6e4;
            for (int64_t j = 0; j < v; j++) { /* row 5: huge logits, the target the max by far */
                set(&x.t, 5 * v + j, -big * uniform(0.5, 1.0));
                set(&x.t, 6 * v + j, 1e-30 * uniform(-1, 1)); /* row 6: tiny logits (uniform) */
            }
            set(&x.t, 5 * v + 1, big);
            for (int64_t j = 0; j < v; j++) /* row 7: huge, all close to each other */
                set(&x.t, 7 * v + j, big * (1 - 0.001 * j));
            char what[64];
            snprintf(what, sizeof what, "special eps %g", eps);
            for (int red = 0; red < 3; red++) {
                ok &= ce_check(&x, tg, -100, eps, red, GRAD_SEPARATE, 1, what);
            }
            /* The rows alone too (so the reductions of the finite rows are checked). */
            int64_t tg2[8] = {3, -100, -100, -100, -100, 1, 7, 9};
            ok &= ce_check(&x, tg2, -100, eps, 1, GRAD_SEPARATE, 1, what);
            host_free(&x);
        }
    CHECK(ok);
}

/* Spot checks of the documented special-value results, without the reference. */
static void test_ce_special_values(void)
{
    int64_t sh[2] = {4, 3}, n = 4;
    host_t x, t, loss, g;
    host_new(&x, F32, 2, sh, 0);
    host_new(&t, I64, 1, &n, 0);
    host_new(&loss, F32, 1, &n, 0);
    host_new(&g, F32, 2, sh, 0);
    float *xv = x.buf;
    int64_t *tv = t.buf;
    float vals[12] = {0,         -INFINITY, 1,         /* fine */ -INFINITY, 0,        0, /* target -inf */
                      -INFINITY, -INFINITY, -INFINITY, /* all -inf */ 0,     INFINITY, 0};
    memcpy(xv, vals, sizeof vals);
    tv[0] = 2, tv[1] = 0, tv[2] = 1, tv[3] = 0;
    tk_arg a[5] = {T_("logits", &x), T_("target", &t), T_("loss", &loss), T_("grad", &g), I_("reduction", 0)};
    CHECK_RC(op_run_cpu("cross_entropy", a, 5), TK_OK);
    const float *l = loss.buf, *gv = g.buf;
    CHECK(fabs(l[0] - log1p(exp(-1.0))) < 1e-6);
    CHECK(gv[1] == 0.0f); /* -inf has probability 0 */
    CHECK(l[1] == INFINITY);
    CHECK(isnan(l[2]));
    CHECK(isnan(l[3]));
    CHECK(isnan(gv[9]));
    /* label smoothing and a -inf logit: the smoothing term is +inf (PyTorch's) */
    tk_arg b[6] = {T_("logits", &x), T_("target", &t), T_("loss", &loss), I_("reduction", 0),
                   F_("label_smoothing", 0.1)};
    CHECK_RC(op_run_cpu("cross_entropy", b, 5), TK_OK);
    CHECK(l[0] == INFINITY);
    host_free(&x);
    host_free(&t);
    host_free(&loss);
    host_free(&g);
}

/* Every target ignored: loss 0 for mean (not NaN) and sum, zero gradients, lse still computed. */
static void test_ce_all_ignored(void)
{
    int64_t sh[2] = {5, 9}, n = 5;
    int ok = 1;
    for (size_t k = 0; k < 3; k++)
        for (int red = 0; red < 3; red++) {
            host_t x;
            host_new(&x, *all_dtypes[k], 2, sh, 0);
            fill(&x, 2);
            int64_t tg[5] = {-1, -1, -1, -1, -1};
            ok &= ce_check(&x, tg, -1, 0.3, red, GRAD_SEPARATE, 1, "all ignored");
            ok &= ce_check(&x, tg, -1, 0.0, red, GRAD_INPLACE, 0, "all ignored in place");
            for (int64_t i = 0; i < numel(&x.t); i++)
                ok &= get(&x.t, i) == 0.0;
            host_free(&x);
        }
    CHECK(ok);
    /* and a batch of no rows at all */
    int64_t sh0[2] = {0, 9}, n0 = 0;
    host_t x, t, loss;
    host_new(&x, F32, 2, sh0, 0);
    host_new(&t, I64, 1, &n0, 0);
    host_new(&loss, F32, 0, NULL, 0);
    ((float *)loss.buf)[0] = 7;
    tk_arg a[3] = {T_("logits", &x), T_("target", &t), T_("loss", &loss)};
    CHECK_RC(op_run_cpu("cross_entropy", a, 3), TK_OK);
    CHECK(((float *)loss.buf)[0] == 0.0f);
    (void)n;
    host_free(&x);
    host_free(&t);
    host_free(&loss);
}

/* The gradient of the mean loss against central differences of the float64 loss (f32 logits). */
static void test_ce_finite_differences(void)
{
    int64_t sh[2] = {3, 5}, n = 3, v = 5;
    host_t x, t, loss, g;
    host_new(&x, F32, 2, sh, 0);
    host_new(&t, I64, 1, &n, 0);
    host_new(&loss, F32, 0, NULL, 0);
    host_new(&g, F32, 2, sh, 0);
    fill(&x, 2);
    int64_t *tv = t.buf;
    tv[0] = 4, tv[1] = -100, tv[2] = 0;
    const double eps = 0.15;
    tk_arg a[6] = {T_("logits", &x), T_("target", &t), T_("loss", &loss), T_("grad", &g), F_("label_smoothing", eps)};
    CHECK_RC(op_run_cpu("cross_entropy", a, 5), TK_OK);
    double *xv = op_values(&x.t), rows[3], lse[3], red;
    op_cmp c = op_cmp_begin(2e-7, 0, "cross_entropy f32 [%lld, %lld] grad against central differences", (long long)n,
                            (long long)v);
    c.cols = v;
    for (int64_t i = 0; i < n * v; i++) {
        const double h = 1e-6;
        double keep = xv[i], lp, lm;
        xv[i] = keep + h;
        ref_ce(xv, tv, n, v, -100, eps, 1, rows, lse, NULL, &lp);
        xv[i] = keep - h;
        ref_ce(xv, tv, n, v, -100, eps, 1, rows, lse, NULL, &lm);
        xv[i] = keep;
        op_cmp_at(&c, i, get(&g.t, i), (lp - lm) / (2 * h));
    }
    ref_ce(xv, tv, n, v, -100, eps, 1, rows, lse, NULL, &red);
    CHECK(fabs(get(&loss.t, 0) - red) < 1e-6);
    CHECK(op_cmp_end(&c));
    free(xv);
    host_free(&x);
    host_free(&t);
    host_free(&loss);
    host_free(&g);
}

static void test_ce_validation(void)
{
    int64_t s45[2] = {4, 5}, s44[2] = {4, 4}, n4 = 4, n3 = 3, s35[2] = {3, 5}, s40[2] = {4, 0};
    host_t x, x16, t, t3, l4, l0, l3, g44, lse3, x40, g;
    host_new(&x, F32, 2, s45, 0);
    host_new(&x16, F16, 2, s45, 0);
    host_new(&t, I64, 1, &n4, 0);
    host_new(&t3, I64, 1, &n3, 0);
    host_new(&l4, F32, 1, &n4, 0);
    host_new(&l0, F32, 0, NULL, 0);
    host_new(&l3, F32, 2, s35, 0);
    host_new(&g44, F32, 2, s44, 0);
    host_new(&lse3, F32, 1, &n3, 0);
    host_new(&x40, F32, 2, s40, 0);
    host_new(&g, F16, 2, s45, 0);
    tk_op_call c;
    tk_arg a[8] = {T_("logits", &x), T_("target", &t3), T_("loss", &l0)};
    CHECK_RC(tk_ops__prepare(&c, "cross_entropy", a, 3), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "cross_entropy: 'target' has shape [3], want [4] (the rows of 'logits' [4, 5])");
    a[1] = T_("target", &t);
    a[2] = T_("loss", &l4);
    CHECK_RC(tk_ops__prepare(&c, "cross_entropy", a, 3), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "cross_entropy: 'loss' has shape [4], want [] or [1] (reduction mean)");
    a[3] = I_("reduction", 0);
    CHECK_RC(tk_ops__prepare(&c, "cross_entropy", a, 4), TK_OK);
    a[2] = T_("loss", &l0);
    CHECK_RC(tk_ops__prepare(&c, "cross_entropy", a, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(),
                   "cross_entropy: 'loss' has shape [], want [4] (the rows of 'logits', reduction none)");
    a[3] = I_("reduction", 3);
    CHECK_RC(tk_ops__prepare(&c, "cross_entropy", a, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "cross_entropy: 'reduction' is 3, want 0 (none), 1 (mean) or 2 (sum)");
    a[3] = F_("label_smoothing", 1.5);
    CHECK_RC(tk_ops__prepare(&c, "cross_entropy", a, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "cross_entropy: 'label_smoothing' is 1.5, want a value in [0, 1]");
    a[3] = T_("grad", &g44);
    CHECK_RC(tk_ops__prepare(&c, "cross_entropy", a, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "cross_entropy: 'grad' has shape [4, 4], want [4, 5] (the shape of 'logits')");
    a[3] = T_("grad", &g);
    CHECK_RC(tk_ops__prepare(&c, "cross_entropy", a, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "cross_entropy: 'grad' has dtype f16, want f32 (the dtype of 'logits')");
    a[3] = T_("lse", &lse3);
    CHECK_RC(tk_ops__prepare(&c, "cross_entropy", a, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "cross_entropy: 'lse' has shape [3], want [4] (the rows of 'logits')");
    a[2] = T_("loss", &l3);
    CHECK_RC(tk_ops__prepare(&c, "cross_entropy", a, 3), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "cross_entropy: 'loss' has rank 2 (shape [3, 5]), want 0 to 1");
    a[2] = T_("loss", &l0);
    a[0] = T_("logits", &x40);
    CHECK_RC(tk_ops__prepare(&c, "cross_entropy", a, 3), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "cross_entropy: 'logits' has shape [4, 0], want at least one class");
    /* a grad that partly overlaps the logits (shifted by one row) */
    host_t xs;
    int64_t s35b[2] = {3, 5};
    host_new(&xs, F32, 2, s35b, 0);
    xs.t.data = x.buf;
    xs.t.byte_offset = 5 * sizeof(float);
    host_t x3;
    host_new(&x3, F32, 2, s35b, 0);
    x3.t.data = x.buf;
    int64_t t3v[3] = {0, 1, 2};
    memcpy(t3.buf, t3v, sizeof t3v);
    tk_arg b[4] = {T_("logits", &x3), T_("target", &t3), T_("loss", &l0), T_("grad", &xs)};
    CHECK_RC(tk_ops__prepare(&c, "cross_entropy", b, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "cross_entropy: 'grad' overlaps 'logits'; it may be exactly the same tensor");
    b[3] = T_("grad", &x3);
    CHECK_RC(tk_ops__prepare(&c, "cross_entropy", b, 4), TK_OK);
    /* a target out of range is found when the reference runs */
    int64_t *tv = t.buf;
    tv[0] = 0, tv[1] = 5, tv[2] = -100, tv[3] = 1;
    tk_arg d[3] = {T_("logits", &x), T_("target", &t), T_("loss", &l0)};
    CHECK_RC(op_run_cpu("cross_entropy", d, 3), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "cross_entropy: 'target'[1] is 5, want 0 to 4 or ignore_index (-100)");
    tv[1] = -7;
    CHECK_RC(op_run_cpu("cross_entropy", d, 3), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "'target'[1] is -7");
    (void)x16;
    host_free(&x);
    host_free(&x16);
    host_free(&t);
    host_free(&t3);
    host_free(&l4);
    host_free(&l0);
    host_free(&l3);
    host_free(&g44);
    host_free(&lse3);
    host_free(&x40);
    host_free(&g);
    host_free(&xs);
    host_free(&x3);
}

/* ---- fused_linear_cross_entropy ------------------------------------------------------------------ */

/* float64 reference: logits = h W^T + b, CE, then grad_hidden = G W, grad_weight = G^T h, grad_bias = sum G. */
typedef struct {
    double *rows, *lse, *gh, *gw, *gb, reduced;
} fl_ref;

static void ref_fl(fl_ref *r, const double *h, const double *w, const double *b, const int64_t *tg, int64_t n,
                   int64_t hd, int64_t v, int64_t ignore, double eps, int red)
{
    double *lg = calloc((size_t)(n * v + 1), sizeof *lg), *g = calloc((size_t)(n * v + 1), sizeof *g);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < v; j++) {
            double s = b ? b[j] : 0;
            for (int64_t k = 0; k < hd; k++)
                s += h[i * hd + k] * w[j * hd + k];
            lg[i * v + j] = s;
        }
    r->rows = calloc((size_t)n + 1, sizeof(double));
    r->lse = calloc((size_t)n + 1, sizeof(double));
    ref_ce(lg, tg, n, v, ignore, eps, red, r->rows, r->lse, g, &r->reduced);
    r->gh = calloc((size_t)(n * hd + 1), sizeof(double));
    r->gw = calloc((size_t)(v * hd + 1), sizeof(double));
    r->gb = calloc((size_t)v + 1, sizeof(double));
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < v; j++) {
            double gij = g[i * v + j];
            r->gb[j] += gij;
            for (int64_t k = 0; k < hd; k++) {
                r->gh[i * hd + k] += gij * w[j * hd + k];
                r->gw[j * hd + k] += gij * h[i * hd + k];
            }
        }
    free(lg);
    free(g);
}

static void fl_ref_free(fl_ref *r)
{
    free(r->rows);
    free(r->lse);
    free(r->gh);
    free(r->gw);
    free(r->gb);
}

/* One call; compares everything it asked for with the reference. Logits ~ O(scale_logit). */
static int fl_check(tk_dtype dt, int64_t n, int64_t hd, int64_t v, int with_bias, int64_t chunk, int red, double eps,
                    int grads, const char *what)
{
    int64_t sh[2] = {n, hd}, sw[2] = {v, hd};
    host_t h, w, b, t, loss, gh, gw, gb, lse;
    host_new(&h, dt, 2, sh, (next_u64() & 1) ? 3 : 0);
    host_new(&w, dt, 2, sw, 0);
    host_new(&b, dt, 1, &v, 0);
    host_new(&t, I64, 1, &n, 0);
    int64_t one = 1;
    host_new(&loss, F32, red == 0 ? 1 : 0, red == 0 ? &n : &one, 0);
    host_new(&gh, dt, 2, sh, 0);
    host_new(&gw, F32, 2, sw, (next_u64() & 1) ? 2 : 0);
    host_new(&gb, F32, 1, &v, 0);
    host_new(&lse, F32, 1, &n, 0);
    double sc = 2.0 / sqrt((double)hd);
    fill(&h, 1.5);
    fill(&w, sc);
    fill(&b, 0.5);
    /* grad_weight and grad_bias are accumulated into: start them from values the reference adds to */
    double *gw0 = malloc(sizeof(double) * (size_t)(v * hd + 1)), *gb0 = malloc(sizeof(double) * (size_t)(v + 1));
    for (int64_t i = 0; i < numel(&gw.t); i++) {
        gw0[i] = uniform(-1, 1);
        set(&gw.t, i, gw0[i]);
        gw0[i] = get(&gw.t, i);
    }
    for (int64_t i = 0; i < v; i++) {
        gb0[i] = uniform(-1, 1);
        set(&gb.t, i, gb0[i]);
        gb0[i] = get(&gb.t, i);
    }
    int64_t *tg = t.buf;
    random_targets(tg, n, v, 0.2, -100);
    double *hv = op_values(&h.t), *wv = op_values(&w.t), *bv = op_values(&b.t);
    fl_ref r;
    ref_fl(&r, hv, wv, with_bias ? bv : NULL, tg, n, hd, v, -100, eps, red);
    for (int64_t i = 0; i < v * hd; i++)
        r.gw[i] += gw0[i];
    for (int64_t i = 0; i < v; i++)
        r.gb[i] += gb0[i];
    tk_arg a[13] = {T_("hidden", &h),     T_("weight", &w),           T_("target", &t),        T_("loss", &loss),
                    I_("reduction", red), F_("label_smoothing", eps), I_("chunk_size", chunk), T_("lse", &lse)};
    size_t na = 8;
    if (with_bias)
        a[na++] = T_("bias", &b);
    if (grads) {
        a[na++] = T_("grad_hidden", &gh);
        a[na++] = T_("grad_weight", &gw);
        if (with_bias)
            a[na++] = T_("grad_bias", &gb);
    }
    int rc = op_run_cpu("fused_linear_cross_entropy", a, na), ok = 1;
    char buf[200];
    if (rc != TK_OK) {
        fprintf(stderr, "  fused_linear_cross_entropy %s: rc %d: %s (seed %llu)\n", what, rc, tk_last_error(),
                (unsigned long long)seed);
        ok = 0;
    } else {
        /* The op sums h.w in f32 (inputs exact in f32): error ~ sqrt(H) ulp of sum |h w|. */
        double lerr = 4e-7 * (1.5 * sc * (double)hd) + 1e-6;
        snprintf(buf, sizeof buf, "fused_linear_cross_entropy %s %s loss", tk_ops__dtype_str(dt), what);
        ok &= op_close_tensor(buf, &loss.t, red == 0 ? r.rows : &r.reduced, lerr, 1e-5);
        snprintf(buf, sizeof buf, "fused_linear_cross_entropy %s %s lse", tk_ops__dtype_str(dt), what);
        ok &= op_close_tensor(buf, &lse.t, r.lse, lerr, 1e-6);
        if (grads) {
            double gs = red == 1 ? 1.0 / (double)(n ? n : 1) : 1.0; /* about the gradient's unit */
            snprintf(buf, sizeof buf, "fused_linear_cross_entropy %s %s grad_hidden", tk_ops__dtype_str(dt), what);
            ok &= op_close_tensor(buf, &gh.t, r.gh, gs * sc * 1e-4 * (dt.bits == 32 ? 1 : 30), dt_rtol(dt) * 2);
            snprintf(buf, sizeof buf, "fused_linear_cross_entropy %s %s grad_weight", tk_ops__dtype_str(dt), what);
            ok &= op_close_tensor(buf, &gw.t, r.gw, gs * 1e-5 * (double)(n ? n : 1) + 3e-7, 1e-4);
            if (with_bias) {
                snprintf(buf, sizeof buf, "fused_linear_cross_entropy %s %s grad_bias", tk_ops__dtype_str(dt), what);
                ok &= op_close_tensor(buf, &gb.t, r.gb, gs * 1e-5 * (double)(n ? n : 1) + 3e-7, 1e-4);
            }
        }
    }
    fl_ref_free(&r);
    free(gw0);
    free(gb0);
    free(hv);
    free(wv);
    free(bv);
    host_free(&h);
    host_free(&w);
    host_free(&b);
    host_free(&t);
    host_free(&loss);
    host_free(&gh);
    host_free(&gw);
    host_free(&gb);
    host_free(&lse);
    return ok;
}

static void test_fl_random(void)
{
    static const int64_t shapes[][3] = {{1, 1, 1}, {1, 8, 7}, {5, 33, 100}, {37, 16, 13}, {9, 300, 70}, {4, 7, 1030}};
    int ok = 1;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t k = 0; k < 3; k++) {
            int64_t n = shapes[s][0], hd = shapes[s][1], v = shapes[s][2];
            int64_t chunks[4] = {0, 1, 1 + (int64_t)(next_u64() % (uint64_t)n), n};
            for (int ci = 0; ci < 4; ci++) {
                int red = (int)(next_u64() % 3);
                double eps = (next_u64() & 1) ? 0.0 : uniform(0, 0.5);
                char what[96];
                snprintf(what, sizeof what, "[N %lld, H %lld, V %lld] chunk %lld red %d eps %.3g", (long long)n,
                         (long long)hd, (long long)v, (long long)chunks[ci], red, eps);
                ok &= fl_check(*all_dtypes[k], n, hd, v, (int)(next_u64() & 1), chunks[ci], red, eps, 1, what);
            }
        }
    ok &= fl_check(F32, 6, 20, 50, 1, 2, 1, 0.1, 0, "no gradients");
    CHECK(ok);
}

/* Chunked vs whole: the same op with chunk_size 1, 3 and N, and the unfused path (logits materialised,
 * then cross_entropy) agree. */
static void test_fl_fused_vs_unfused(void)
{
    const int64_t n = 11, hd = 24, v = 97;
    int64_t sh[2] = {n, hd}, sw[2] = {v, hd}, sl[2] = {n, v};
    host_t h, w, t, loss[3], gh[3], gw[3], lg, lce, gce;
    host_new(&h, F32, 2, sh, 0);
    host_new(&w, F32, 2, sw, 0);
    host_new(&t, I64, 1, &n, 0);
    fill(&h, 1);
    fill(&w, 0.5);
    random_targets(t.buf, n, v, 0.2, -100);
    int64_t chunks[3] = {1, 3, n};
    int ok = 1;
    for (int i = 0; i < 3; i++) {
        host_new(&loss[i], F32, 0, NULL, 0);
        host_new(&gh[i], F32, 2, sh, 0);
        host_new(&gw[i], F32, 2, sw, 0);
        tk_arg a[7] = {T_("hidden", &h),           T_("weight", &w),          T_("target", &t),
                       T_("loss", &loss[i]),       T_("grad_hidden", &gh[i]), T_("grad_weight", &gw[i]),
                       I_("chunk_size", chunks[i])};
        CHECK_RC(op_run_cpu("fused_linear_cross_entropy", a, 7), TK_OK);
    }
    /* Chunking changes nothing: each row's logits and each sum keep their order. */
    for (int i = 1; i < 3; i++) {
        ok &= ((float *)loss[i].buf)[0] == ((float *)loss[0].buf)[0];
        ok &= memcmp(gh[i].buf, gh[0].buf, sizeof(float) * (size_t)(n * hd)) == 0;
        ok &= memcmp(gw[i].buf, gw[0].buf, sizeof(float) * (size_t)(v * hd)) == 0;
    }
    /* The unfused path: logits in f32 (summed in double here), cross_entropy, then G W by hand. */
    host_new(&lg, F32, 2, sl, 0);
    host_new(&lce, F32, 0, NULL, 0);
    host_new(&gce, F32, 2, sl, 0);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < v; j++) {
            double s = 0;
            for (int64_t k = 0; k < hd; k++)
                s += get(&h.t, i * hd + k) * get(&w.t, j * hd + k);
            set(&lg.t, i * v + j, s);
        }
    tk_arg c[4] = {T_("logits", &lg), T_("target", &t), T_("loss", &lce), T_("grad", &gce)};
    CHECK_RC(op_run_cpu("cross_entropy", c, 4), TK_OK);
    ok &= fabs(get(&lce.t, 0) - get(&loss[0].t, 0)) <= 1e-5 * fabs(get(&lce.t, 0)) + 1e-6;
    op_cmp cg = op_cmp_begin(1e-6, 0, "fused_linear_cross_entropy grad_hidden against the unfused path");
    cg.cols = hd;
    for (int64_t i = 0; i < n; i++)
        for (int64_t k = 0; k < hd; k++) {
            double s = 0;
            for (int64_t j = 0; j < v; j++)
                s += get(&gce.t, i * v + j) * get(&w.t, j * hd + k);
            op_cmp_at(&cg, i * hd + k, get(&gh[0].t, i * hd + k), s);
        }
    ok &= op_cmp_end(&cg);
    CHECK(ok);
    host_free(&h);
    host_free(&w);
    host_free(&t);
    for (int i = 0; i < 3; i++) {
        host_free(&loss[i]);
        host_free(&gh[i]);
        host_free(&gw[i]);
    }
    host_free(&lg);
    host_free(&lce);
    host_free(&gce);
}

/* grad_hidden, grad_weight and grad_bias against central differences of the float64 loss. */
static void test_fl_finite_differences(void)
{
    const int64_t n = 3, hd = 4, v = 6;
    int64_t sh[2] = {n, hd}, sw[2] = {v, hd};
    host_t h, w, b, t, loss, gh, gw, gb;
    host_new(&h, F32, 2, sh, 0);
    host_new(&w, F32, 2, sw, 0);
    host_new(&b, F32, 1, &v, 0);
    host_new(&t, I64, 1, &n, 0);
    host_new(&loss, F32, 0, NULL, 0);
    host_new(&gh, F32, 2, sh, 0);
    host_new(&gw, F32, 2, sw, 0);
    host_new(&gb, F32, 1, &v, 0);
    fill(&h, 1);
    fill(&w, 1);
    fill(&b, 1);
    int64_t *tg = t.buf;
    tg[0] = 5, tg[1] = 0, tg[2] = -100;
    const double eps = 0.05;
    tk_arg a[10] = {T_("hidden", &h),       T_("weight", &w),     T_("target", &t),
                    T_("loss", &loss),      T_("bias", &b),       T_("grad_hidden", &gh),
                    T_("grad_weight", &gw), T_("grad_bias", &gb), F_("label_smoothing", eps),
                    I_("chunk_size", 2)};
    CHECK_RC(op_run_cpu("fused_linear_cross_entropy", a, 10), TK_OK);
    double *hv = op_values(&h.t), *wv = op_values(&w.t), *bv = op_values(&b.t);
    double *params[3] = {hv, wv, bv};
    const tk_tensor *grads[3] = {&gh.t, &gw.t, &gb.t};
    const char *names[3] = {"grad_hidden", "grad_weight", "grad_bias"};
    int64_t counts[3] = {n * hd, v * hd, v};
    int ok = 1;
    for (int p = 0; p < 3; p++) {
        op_cmp c = op_cmp_begin(1e-6, 0, "fused_linear_cross_entropy %s against central differences", names[p]);
        for (int64_t i = 0; i < counts[p]; i++) {
            const double step = 1e-6;
            double keep = params[p][i];
            fl_ref rp, rm;
            params[p][i] = keep + step;
            ref_fl(&rp, hv, wv, bv, tg, n, hd, v, -100, eps, 1);
            params[p][i] = keep - step;
            ref_fl(&rm, hv, wv, bv, tg, n, hd, v, -100, eps, 1);
            params[p][i] = keep;
            op_cmp_at(&c, i, get(grads[p], i), (rp.reduced - rm.reduced) / (2 * step));
            fl_ref_free(&rp);
            fl_ref_free(&rm);
        }
        ok &= op_cmp_end(&c);
    }
    CHECK(ok);
    free(hv);
    free(wv);
    free(bv);
    host_free(&h);
    host_free(&w);
    host_free(&b);
    host_free(&t);
    host_free(&loss);
    host_free(&gh);
    host_free(&gw);
    host_free(&gb);
}

static void test_fl_validation(void)
{
    int64_t s48[2] = {4, 8}, s98[2] = {9, 8}, s97[2] = {9, 7}, n4 = 4, n9 = 9, n8 = 8;
    host_t h, w, w7, t, l, b8, gb, gw16, hf16;
    host_new(&h, F32, 2, s48, 0);
    host_new(&w, F32, 2, s98, 0);
    host_new(&w7, F32, 2, s97, 0);
    host_new(&t, I64, 1, &n4, 0);
    host_new(&l, F32, 0, NULL, 0);
    host_new(&b8, F32, 1, &n8, 0);
    host_new(&gb, F32, 1, &n9, 0);
    host_new(&gw16, F16, 2, s98, 0);
    host_new(&hf16, F16, 2, s48, 0);
    tk_op_call c;
    tk_arg a[6] = {T_("hidden", &h), T_("weight", &w7), T_("target", &t), T_("loss", &l)};
    CHECK_RC(tk_ops__prepare(&c, "fused_linear_cross_entropy", a, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(
        tk_last_error(),
        "fused_linear_cross_entropy: 'weight' has shape [9, 7], want [V, 8] (the columns of 'hidden' [4, 8])");
    a[1] = T_("weight", &w);
    a[4] = T_("bias", &b8);
    CHECK_RC(tk_ops__prepare(&c, "fused_linear_cross_entropy", a, 5), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(),
                   "fused_linear_cross_entropy: 'bias' has shape [8], want [9] (the rows of 'weight')");
    a[4] = T_("grad_bias", &gb);
    CHECK_RC(tk_ops__prepare(&c, "fused_linear_cross_entropy", a, 5), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "fused_linear_cross_entropy: 'grad_bias' is given but 'bias' is not");
    a[4] = T_("grad_weight", &gw16);
    CHECK_RC(tk_ops__prepare(&c, "fused_linear_cross_entropy", a, 5), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "fused_linear_cross_entropy: 'grad_weight' has dtype f16, want f32");
    a[4] = T_("grad_hidden", &hf16);
    CHECK_RC(tk_ops__prepare(&c, "fused_linear_cross_entropy", a, 5), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(),
                   "fused_linear_cross_entropy: 'grad_hidden' has dtype f16, want f32 (the dtype of 'hidden')");
    a[4] = I_("chunk_size", -1);
    CHECK_RC(tk_ops__prepare(&c, "fused_linear_cross_entropy", a, 5), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "fused_linear_cross_entropy: 'chunk_size' is -1, want >= 0 (0: automatic)");
    a[4] = T_("grad_hidden", &h);
    CHECK_RC(tk_ops__prepare(&c, "fused_linear_cross_entropy", a, 5), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(),
                   "fused_linear_cross_entropy: 'grad_hidden' overlaps 'hidden'; they must not share memory");
    host_free(&h);
    host_free(&w);
    host_free(&w7);
    host_free(&t);
    host_free(&l);
    host_free(&b8);
    host_free(&gb);
    host_free(&gw16);
    host_free(&hf16);
}

/* ---- max_margin_loss ---------------------------------------------------------------------------- */

static void ref_mm(const double *p, const double *ng, int64_t n, int64_t k, double margin, int red, double *pair,
                   double *reduced, double *gp, double *gn)
{
    double sum = 0, scale = red == 1 ? (n * k > 0 ? 1.0 / (double)(n * k) : 0) : 1;
    for (int64_t i = 0; i < n; i++) {
        gp[i] = 0;
        for (int64_t q = 0; q < k; q++) {
            double x = margin - p[i] + ng[i * k + q];
            pair[i * k + q] = isnan(x) ? x : fmax(0.0, x);
            sum += pair[i * k + q];
            gn[i * k + q] = x > 0 ? scale : 0;
            gp[i] -= x > 0 ? scale : 0;
        }
    }
    *reduced = sum * scale;
}

static int mm_check(tk_dtype dt, int64_t n, int64_t k, int rank1, int red, double margin, int nan_at)
{
    int64_t sn[2] = {n, k};
    host_t p, ng, loss, gp, gn;
    host_new(&p, dt, 1, &n, 0);
    host_new(&ng, dt, rank1 ? 1 : 2, sn, (!rank1 && (next_u64() & 1)) ? 2 : 0);
    int64_t one = 1;
    if (red == 0)
        host_new(&loss, F32, rank1 ? 1 : 2, sn, 0);
    else
        host_new(&loss, F32, 1, &one, 0);
    host_new(&gp, dt, 1, &n, 0);
    host_new(&gn, dt, rank1 ? 1 : 2, sn, 0);
    fill(&p, 2);
    fill(&ng, 2);
    /* keep pairs away from the kink, where the gradient jumps */
    for (int64_t i = 0; i < n; i++)
        for (int64_t q = 0; q < k; q++) {
            double x = margin - get(&p.t, i) + get(&ng.t, i * k + q);
            if (fabs(x) < 0.05)
                set(&ng.t, i * k + q, get(&ng.t, i * k + q) + 0.1);
        }
    if (nan_at >= 0 && nan_at < n * k)
        set(&ng.t, nan_at, NAN);
    double *pv = op_values(&p.t), *nv = op_values(&ng.t), *pair = malloc(sizeof(double) * (size_t)(n * k + 1));
    double *rgp = malloc(sizeof(double) * (size_t)(n + 1)), *rgn = malloc(sizeof(double) * (size_t)(n * k + 1)),
           reduced;
    ref_mm(pv, nv, n, k, margin, red, pair, &reduced, rgp, rgn);
    tk_arg a[7] = {T_("pos", &p),       T_("neg", &ng),       T_("loss", &loss),   T_("grad_pos", &gp),
                   T_("grad_neg", &gn), F_("margin", margin), I_("reduction", red)};
    int rc = op_run_cpu("max_margin_loss", a, 7), ok = 1;
    if (rc != TK_OK) {
        fprintf(stderr, "  max_margin_loss: rc %d: %s (seed %llu)\n", rc, tk_last_error(), (unsigned long long)seed);
        ok = 0;
    } else {
        double scale = red == 1 ? 1.0 / (double)(n * k) : 1;
        ok &= op_close_tensor("max_margin_loss loss", &loss.t, red == 0 ? pair : &reduced, 1e-6, 1e-5);
        ok &= op_close_tensor("max_margin_loss grad_pos", &gp.t, rgp, 1e-9, dt_rtol(dt));
        ok &= op_close_tensor("max_margin_loss grad_neg", &gn.t, rgn, 1e-9 * scale, dt_rtol(dt));
    }
    free(pv);
    free(nv);
    free(pair);
    free(rgp);
    free(rgn);
    host_free(&p);
    host_free(&ng);
    host_free(&loss);
    host_free(&gp);
    host_free(&gn);
    return ok;
}

static void test_mm(void)
{
    static const int64_t shapes[][2] = {{1, 1}, {7, 1}, {5, 3}, {3, 1100}, {64, 9}};
    int ok = 1;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t k = 0; k < 3; k++)
            for (int red = 0; red < 3; red++) {
                int rank1 = shapes[s][1] == 1 && (next_u64() & 1);
                ok &= mm_check(*all_dtypes[k], shapes[s][0], shapes[s][1], rank1, red, uniform(0, 2), -1);
            }
    ok &= mm_check(F32, 4, 3, 0, 0, 1.0, 5); /* a NaN score: NaN loss for that pair, gradient 0 */
    ok &= mm_check(F32, 4, 3, 0, 1, 1.0, 5);
    CHECK(ok);
    /* validation */
    int64_t n3 = 3, n4 = 4, s32[2] = {3, 2};
    host_t p, ng, l, l2;
    host_new(&p, F32, 1, &n3, 0);
    host_new(&ng, F32, 1, &n4, 0);
    host_new(&l, F32, 0, NULL, 0);
    host_new(&l2, F32, 1, &n3, 0);
    tk_op_call c;
    tk_arg a[4] = {T_("pos", &p), T_("neg", &ng), T_("loss", &l)};
    CHECK_RC(tk_ops__prepare(&c, "max_margin_loss", a, 3), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "max_margin_loss: 'neg' has shape [4], want [3] or [3, K] (the rows of 'pos' [3])");
    host_free(&ng);
    host_new(&ng, F32, 2, s32, 0);
    a[1] = T_("neg", &ng);
    a[2] = T_("loss", &l2);
    a[3] = I_("reduction", 0);
    CHECK_RC(tk_ops__prepare(&c, "max_margin_loss", a, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(),
                   "max_margin_loss: 'loss' has shape [3], want [3, 2] (the shape of 'neg', reduction none)");
    a[2] = T_("loss", &l);
    a[3] = F_("margin", INFINITY);
    CHECK_RC(tk_ops__prepare(&c, "max_margin_loss", a, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "max_margin_loss: 'margin' is inf, want a finite value");
    host_free(&p);
    host_free(&ng);
    host_free(&l);
    host_free(&l2);
}

/* ---- infonce ------------------------------------------------------------------------------------ */

/* float64: loss (per anchor, and reduced). */
static void ref_nce(const double *a, const double *b, int64_t n, int64_t d, double tau, int sym, int red, double *rows,
                    double *reduced)
{
    double *an = malloc(sizeof(double) * (size_t)(n * d + 1)), *bn = malloc(sizeof(double) * (size_t)(n * d + 1));
    double *s = malloc(sizeof(double) * (size_t)(n * n + 1));
    for (int64_t i = 0; i < n; i++) {
        double na = 0, nb = 0;
        for (int64_t k = 0; k < d; k++) {
            na += a[i * d + k] * a[i * d + k];
            nb += b[i * d + k] * b[i * d + k];
        }
        na = fmax(sqrt(na), 1e-12);
        nb = fmax(sqrt(nb), 1e-12);
        for (int64_t k = 0; k < d; k++) {
            an[i * d + k] = a[i * d + k] / na;
            bn[i * d + k] = b[i * d + k] / nb;
        }
    }
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < n; j++) {
            double x = 0;
            for (int64_t k = 0; k < d; k++)
                x += an[i * d + k] * bn[j * d + k];
            s[i * n + j] = x / tau;
        }
    double sum = 0;
    for (int64_t i = 0; i < n; i++) {
        double rs = 0, cs = 0;
        for (int64_t j = 0; j < n; j++) {
            rs += exp(s[i * n + j] - s[i * n + i]);
            cs += exp(s[j * n + i] - s[i * n + i]);
        }
        rows[i] = sym ? 0.5 * (log(rs) + log(cs)) : log(rs);
        sum += rows[i];
    }
    *reduced = red == 1 ? (n ? sum / (double)n : 0) : sum;
    free(an);
    free(bn);
    free(s);
}

static int nce_check(tk_dtype dt, int64_t n, int64_t d, double tau, int sym, int red, int zero_row, int fd)
{
    int64_t sh[2] = {n, d};
    host_t a, b, loss, ga, gb;
    host_new(&a, dt, 2, sh, (next_u64() & 1) ? 3 : 0);
    host_new(&b, dt, 2, sh, 0);
    int64_t one = 1;
    host_new(&loss, F32, 1, red == 0 ? &n : &one, 0);
    host_new(&ga, dt, 2, sh, 0);
    host_new(&gb, dt, 2, sh, 0);
    fill(&a, 1);
    fill(&b, 1);
    if (zero_row)
        for (int64_t k = 0; k < d; k++)
            set(&b.t, k, 0.0);
    double *av = op_values(&a.t), *bv = op_values(&b.t), *rows = malloc(sizeof(double) * (size_t)(n + 1)), reduced;
    ref_nce(av, bv, n, d, tau, sym, red, rows, &reduced);
    tk_arg args[8] = {T_("a", &a),          T_("b", &b),         T_("loss", &loss),
                      T_("grad_a", &ga),    T_("grad_b", &gb),   F_("temperature", tau),
                      I_("symmetric", sym), I_("reduction", red)};
    int rc = op_run_cpu("infonce", args, 8), ok = 1;
    if (rc != TK_OK) {
        fprintf(stderr, "  infonce: rc %d: %s (seed %llu)\n", rc, tk_last_error(), (unsigned long long)seed);
        ok = 0;
    } else {
        char buf[120];
        snprintf(buf, sizeof buf, "infonce %s [%lld, %lld] tau %.3g sym %d red %d loss", tk_ops__dtype_str(dt),
                 (long long)n, (long long)d, tau, sym, red);
        /* the normalised rows are held in f32 by the op: S is off by ~1e-7 / tau */
        ok &= op_close_tensor(buf, &loss.t, red == 0 ? rows : &reduced, 1e-6 / tau, 1e-5);
        if (fd) {
            /* the gradients against central differences of the float64 loss */
            double *gs[2] = {av, bv};
            const tk_tensor *gt[2] = {&ga.t, &gb.t};
            double *fd = malloc(sizeof(double) * (size_t)(2 * n * d + 1)), unit = 0;
            for (int p = 0; p < 2; p++)
                for (int64_t i = 0; i < n * d; i++) {
                    double keep = gs[p][i], lp, lm, step = 1e-6;
                    gs[p][i] = keep + step;
                    ref_nce(av, bv, n, d, tau, sym, red, rows, &lp);
                    gs[p][i] = keep - step;
                    ref_nce(av, bv, n, d, tau, sym, red, rows, &lm);
                    gs[p][i] = keep;
                    fd[p * n * d + i] = (lp - lm) / (2 * step);
                    unit = fmax(unit, fabs(fd[p * n * d + i]));
                }
            /* relative to the largest gradient, in the output dtype's precision */
            double tol = unit * (dt.bits == 32 ? 1e-4 : dt_rtol(dt) * 2) + 1e-6;
            for (int p = 0; p < 2; p++) {
                op_cmp c = op_cmp_begin(tol, 0, "%s grad_%s against central differences", buf, p ? "b" : "a");
                c.cols = d;
                c.nan_fails = 1;
                c.inf_fails = 1;
                for (int64_t i = 0; i < n * d; i++)
                    op_cmp_at(&c, i, get(gt[p], i), fd[p * n * d + i]);
                ok &= op_cmp_end(&c);
            }
            free(fd);
        }
    }
    free(av);
    free(bv);
    free(rows);
    host_free(&a);
    host_free(&b);
    host_free(&loss);
    host_free(&ga);
    host_free(&gb);
    return ok;
}

static void test_nce(void)
{
    static const int64_t shapes[][2] = {{1, 1}, {2, 3}, {7, 5}, {12, 33}};
    int ok = 1;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t k = 0; k < 3; k++)
            for (int sym = 0; sym < 2; sym++) {
                int red = (int)(next_u64() % 3);
                ok &= nce_check(*all_dtypes[k], shapes[s][0], shapes[s][1], uniform(0.05, 1.0), sym, red, 0, 1);
            }
    ok &= nce_check(F32, 40, 130, 0.07, 1, 1, 0, 0); /* bigger: the loss only */
    ok &= nce_check(F32, 5, 4, 0.1, 0, 1, 1, 0);     /* a zero row in b: normalised to 0, not NaN */
    CHECK(ok);
    int64_t s34[2] = {3, 4}, s35[2] = {3, 5};
    host_t a, b, l;
    host_new(&a, F32, 2, s34, 0);
    host_new(&b, F32, 2, s35, 0);
    host_new(&l, F32, 0, NULL, 0);
    tk_op_call c;
    tk_arg args[4] = {T_("a", &a), T_("b", &b), T_("loss", &l)};
    CHECK_RC(tk_ops__prepare(&c, "infonce", args, 3), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "infonce: 'b' has shape [3, 5], want [3, 4] (the shape of 'a'");
    args[1] = T_("b", &a);
    args[3] = F_("temperature", 0);
    CHECK_RC(tk_ops__prepare(&c, "infonce", args, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "infonce: 'temperature' is 0, want a finite value > 0");
    args[3] = I_("symmetric", 2);
    CHECK_RC(tk_ops__prepare(&c, "infonce", args, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "infonce: 'symmetric' is 2, want 0 or 1");
    host_free(&a);
    host_free(&b);
    host_free(&l);
}

/* ---- registry ----------------------------------------------------------------------------------- */

static void test_registry(void)
{
    const char *names[] = {"cross_entropy", "fused_linear_cross_entropy", "max_margin_loss", "infonce"};
    for (size_t i = 0; i < 4; i++) {
        const tk_op_desc *op = tk_ops__find(names[i]);
        CHECK(op != NULL);
        if (!op)
            continue;
        CHECK_STR(op->family, "loss");
        CHECK_STR(op->package, "kernels-community/cross-entropy");
    }
    tk_buf b = TK_BUF_INIT;
    CHECK_RC(tk_ops__signature(&b, tk_ops__find("cross_entropy")), TK_OK);
    CHECK_STR(b.data, "cross_entropy(logits: T[N, V], target: i64[N], loss: f32[N] | [] | [1], grad: T[N, V]?, "
                      "lse: f32[N]?, ignore_index: i64 = -100, label_smoothing: f64 = 0, reduction: i64 = 1) -> loss, "
                      "grad, lse; T in {f32, f16, bf16}");
    tk__buf_free(&b);
}

int main(void)
{
    op_test_seed();
    RUN(test_registry);
    RUN(test_ce_random);
    RUN(test_ce_modes);
    RUN(test_ce_special);
    RUN(test_ce_special_values);
    RUN(test_ce_all_ignored);
    RUN(test_ce_finite_differences);
    RUN(test_ce_validation);
    RUN(test_fl_random);
    RUN(test_fl_fused_vs_unfused);
    RUN(test_fl_finite_differences);
    RUN(test_fl_validation);
    RUN(test_mm);
    RUN(test_nce);
    return th_done();
}
