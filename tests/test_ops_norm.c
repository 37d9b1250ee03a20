/*
 * test_ops_norm.c — the norm ops (ops/norm.c): each CPU reference against an independent float64
 * computation on fresh random inputs (ragged d including 1 and non-multiples of 8, one row, strided
 * views, large and tiny magnitudes, f32/f16/bf16), and the validation messages. The backward passes
 * are also checked against central finite differences of the float64 forward (tiny cases), which
 * checks the float64 backward formulas themselves.
 *
 * Uses only ops/ and common/. Inputs are random with a seed printed on any failure; set TK_TEST_SEED
 * to replay one.
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

#define TK_TP_TEST_PARTS 3 /* at most this many parts of a split row (check_split) */

/* ---- host tensors ----------------------------------------------------------------------------- */

/* |got-ref| <= atol + rtol*|ref|, per dtype; atol is relative to the output's scale (see compare). */
static void tolerances(tk_dtype dt, double *atol, double *rtol)
{
    if (dt.bits == 32) {
        *atol = 1e-6;
        *rtol = 2e-6;
    } else if (dt.code == TK_DL_BFLOAT) {
        *atol = 1e-3;
        *rtol = 8e-3;
    } else {
        *atol = 1e-4;
        *rtol = 1e-3;
    }
}

/* Compares every element of got (rows of d columns) with ref (op_test.h); a reference beyond the
 * dtype's range wants the inf it rounds to, and a NaN reference never passes. `unit` scales atol (the
 * output's typical magnitude); the dtype's subnormal spacing is added to it. Returns 1 when all match. */
static int compare(const char *op, const char *which, const tk_tensor *got, const double *ref, double unit,
                   const char *what)
{
    double atol, rtol;
    tolerances(got->dtype, &atol, &rtol);
    /* plus the spacing of the dtype's subnormals: a result that small is rounded to that grid */
    atol = atol * unit + (got->dtype.bits == 32 ? 0x1p-149 : got->dtype.code == TK_DL_BFLOAT ? 0x1p-133 : 0x1p-24);
    op_cmp c = op_cmp_begin(atol, rtol, "%s %s '%s' %s %s", op, tk_ops__dtype_str(got->dtype), which, what,
                            tk_ops__shape_fmt(got->ndim, got->shape));
    c.cols = got->shape[got->ndim - 1];
    c.nan_fails = 1;
    for (int64_t i = 0, n = numel(got); i < n; i++)
        op_cmp_at(&c, i, get(got, i), op_stored_inf(ref[i], got->dtype));
    return op_cmp_end(&c);
}

/* ---- the float64 references (independent of ops/norm.c) -------------------------------------- */

/* ref[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w, all in double. x is n doubles. */
static void ref_rms(double *ref, const double *x, const double *w, int64_t n, int64_t d, double eps)
{
    for (int64_t r = 0; r < n / d; r++) {
        const double *xr = x + r * d;
        double ss = 0;
        for (int64_t c = 0; c < d; c++)
            ss += xr[c] * xr[c];
        double inv = 1.0 / sqrt(ss / (double)d + eps);
        for (int64_t c = 0; c < d; c++)
            ref[r * d + c] = xr[c] * inv * w[c];
    }
}

/* ref[r, :] = (x[r, :] - mu) / sqrt(var + eps) * w + b (b may be NULL), mu the row mean and var the
 * biased variance (two passes), all in double. */
static void ref_ln(double *ref, const double *x, const double *w, const double *b, int64_t n, int64_t d, double eps)
{
    for (int64_t r = 0; r < n / d; r++) {
        const double *xr = x + r * d;
        double mu = 0, var = 0;
        for (int64_t c = 0; c < d; c++)
            mu += xr[c];
        mu /= (double)d;
        for (int64_t c = 0; c < d; c++)
            var += (xr[c] - mu) * (xr[c] - mu);
        var /= (double)d;
        double inv = 1.0 / sqrt(var + eps);
        for (int64_t c = 0; c < d; c++)
            ref[r * d + c] = (xr[c] - mu) * inv * w[c] + (b ? b[c] : 0.0);
    }
}

/* The backward passes in double, by the textbook formulas (rows of d; gb may be NULL):
 *   rms:   y = x r w, r = (mean(x^2) + eps)^(-1/2):  dx_i = r w_i g_i - x_i r^3 / d * sum_j w_j g_j x_j,
 *          dw_j = sum over rows of g_j x_j r
 *   layer: xh = (x - mu) rstd:  dx_i = rstd / d * (d w_i g_i - sum_j w_j g_j - xh_i * sum_j w_j g_j xh_j),
 *          dw_j = sum over rows of g_j xh_j,  db_j = sum over rows of g_j */
static void ref_bwd(int layer, double *gi, double *gw, double *gb, const double *x, const double *g, const double *w,
                    int64_t n, int64_t d, double eps)
{
    for (int64_t c = 0; c < d; c++) {
        gw[c] = 0;
        if (gb)
            gb[c] = 0;
    }
    for (int64_t r = 0; r < n / d; r++) {
        const double *xr = x + r * d, *gr = g + r * d;
        double *o = gi + r * d;
        if (!layer) {
            double ss = 0, dot = 0;
            for (int64_t c = 0; c < d; c++) {
                ss += xr[c] * xr[c];
                dot += w[c] * gr[c] * xr[c];
            }
            double rr = 1.0 / sqrt(ss / (double)d + eps);
            for (int64_t c = 0; c < d; c++) {
                o[c] = rr * w[c] * gr[c] - xr[c] * rr * rr * rr / (double)d * dot;
                gw[c] += gr[c] * xr[c] * rr;
            }
            continue;
        }
        double mu = 0, var = 0, s1 = 0, s2 = 0;
        for (int64_t c = 0; c < d; c++)
            mu += xr[c];
        mu /= (double)d;
        for (int64_t c = 0; c < d; c++)
            var += (xr[c] - mu) * (xr[c] - mu);
        double rstd = 1.0 / sqrt(var / (double)d + eps);
        for (int64_t c = 0; c < d; c++) {
            s1 += w[c] * gr[c];
            s2 += w[c] * gr[c] * (xr[c] - mu) * rstd;
        }
        for (int64_t c = 0; c < d; c++) {
            double xh = (xr[c] - mu) * rstd;
            o[c] = rstd / (double)d * ((double)d * w[c] * gr[c] - s1 - xh * s2);
            gw[c] += gr[c] * xh;
            if (gb)
                gb[c] += gr[c];
        }
    }
}

static double *dalloc(int64_t n) { return malloc(sizeof(double) * (size_t)(n > 0 ? n : 1)); }

/* The root mean square of n values (the scale of an output, for atol); 1 when they are all zero. */
static double rms_of(const double *v, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += v[i] * v[i];
    return s > 0 && n > 0 ? sqrt(s / (double)n) : 1.0;
}

static void rand_weight(host_t *w, int64_t d)
{
    for (int64_t c = 0; c < d; c++)
        set(&w->t, c, uniform(0.25, 2.0) * (next_u64() & 1 ? 1 : -1));
}

/* One forward case: rows x d (as ndim dims), one dtype, values of magnitude `scale`, the weights of
 * magnitude 1. layer: layer_norm / fused_add_layer_norm (with a bias when `bias`), else rms_norm /
 * fused_add_rms_norm; `fused` picks the fused form, `inplace` runs the plain form with out == input. */
static int check_fwd(int layer, int fused, tk_dtype dt, int ndim, const int64_t *shape, int64_t pad, double scale,
                     double eps, int inplace, int bias)
{
    const char *op =
        layer ? (fused ? "fused_add_layer_norm" : "layer_norm") : (fused ? "fused_add_rms_norm" : "rms_norm");
    int64_t d = shape[ndim - 1];
    host_t a, b, w, bi;
    host_new(&a, dt, ndim, shape, pad);       /* plain: input; fused: input */
    host_new(&b, dt, ndim, shape, pad ? 0 : 1); /* plain: out; fused: residual */
    host_new(&w, dt, 1, &d, 0);
    host_new(&bi, dt, 1, &d, 0);
    fill(&a, scale);
    fill(&b, scale);
    rand_weight(&w, d);
    fill(&bi, 1.0);
    int64_t n = numel(&a.t);
    double *x = dalloc(n), *ref = dalloc(n), *sum = dalloc(n), *wd = dalloc(d), *bd = dalloc(d);
    for (int64_t c = 0; c < d; c++) {
        wd[c] = get(&w.t, c);
        bd[c] = get(&bi.t, c);
    }
    for (int64_t i = 0; i < n; i++) {
        x[i] = get(&a.t, i);
        sum[i] = quantize(x[i] + get(&b.t, i), dt); /* fused: the residual it must write, in T */
    }
    if (layer)
        ref_ln(ref, fused ? sum : x, wd, bias ? bd : NULL, n, d, (double)(float)eps);
    else
        ref_rms(ref, fused ? sum : x, wd, n, d, (double)(float)eps);

    const tk_tensor *out = fused ? &a.t : inplace ? &a.t : &b.t;
    tk_arg args[5] = {{TK_ARG_TENSOR, fused ? "input" : "out", fused ? &a.t : out, 0, 0},
                      {TK_ARG_TENSOR, fused ? "residual" : "input", fused ? &b.t : &a.t, 0, 0},
                      {TK_ARG_TENSOR, "weight", &w.t, 0, 0},
                      {TK_ARG_F64, "eps", NULL, 0, eps},
                      {TK_ARG_TENSOR, "bias", &bi.t, 0, 0}};
    int rc = op_run_cpu(op, args, layer && bias ? 5 : 4);
    char what[128];
    snprintf(what, sizeof what, "%s%s%sscale %g eps %g", pad ? "strided " : "", inplace ? "in-place " : "",
             layer && bias ? "bias " : "", scale, eps);
    int ok = 1;
    if (rc != TK_OK) {
        fprintf(stderr, "  %s %s %s: rc %d: %s (seed %llu)\n", op, tk_ops__dtype_str(dt), what, rc, tk_last_error(),
                (unsigned long long)seed);
        ok = 0;
    } else {
        /* The output's scale: x / rms(x) is O(1) unless eps dominates mean(x^2); a bias adds O(1). */
        double ms = scale * scale / 3.0, unit = sqrt(ms / (ms + eps));
        if (layer && bias && unit < 1)
            unit = 1;
        ok &= compare(op, fused ? "input" : "out", out, ref, unit, what);
        if (fused)
            ok &= compare(op, "residual", &b.t, sum, scale, what);
    }
    free(x);
    free(ref);
    free(sum);
    free(wd);
    free(bd);
    host_free(&a);
    host_free(&b);
    host_free(&w);
    host_free(&bi);
    return ok;
}

/* One backward case (rms_norm_backward, layer_norm_backward and the fused forms): x of magnitude
 * `scale`, grad_out and grad_residual of magnitude 1; strided views of x, grad_out, grad_residual and
 * grad_input when pad > 0. bias: pass grad_bias (layer norm); inplace: grad_input is grad_residual. */
static int check_bwd(int layer, int fused, tk_dtype dt, int ndim, const int64_t *shape, int64_t pad, double scale,
                     double eps, int bias, int inplace)
{
    const char *op = layer ? (fused ? "fused_add_layer_norm_backward" : "layer_norm_backward")
                           : (fused ? "fused_add_rms_norm_backward" : "rms_norm_backward");
    int64_t d = shape[ndim - 1];
    host_t x, go, gr, gi, w, gw, gb;
    host_new(&x, dt, ndim, shape, pad);
    host_new(&go, dt, ndim, shape, pad ? pad + 1 : 0);
    host_new(&gr, dt, ndim, shape, pad);
    host_new(&gi, dt, ndim, shape, pad ? 2 * pad : 0);
    host_new(&w, dt, 1, &d, 0);
    host_new(&gw, dt, 1, &d, 0);
    host_new(&gb, dt, 1, &d, 0);
    fill(&x, scale);
    fill(&go, 1.0);
    fill(&gr, 1.0);
    fill(&gi, 7.0); /* overwritten */
    fill(&gw, 7.0);
    fill(&gb, 7.0);
    rand_weight(&w, d);
    double *gb0 = dalloc(d); /* grad_bias left out must stay untouched */
    for (int64_t c = 0; c < d; c++)
        gb0[c] = get(&gb.t, c);
    const tk_tensor *gin = inplace ? &gr.t : &gi.t;
    int64_t n = numel(&x.t);
    double *xd = dalloc(n), *gd = dalloc(n), *rgi = dalloc(n), *wd = dalloc(d), *rgw = dalloc(d), *rgb = dalloc(d);
    for (int64_t i = 0; i < n; i++) {
        xd[i] = get(&x.t, i);
        gd[i] = get(&go.t, i);
    }
    for (int64_t c = 0; c < d; c++)
        wd[c] = get(&w.t, c);
    double feps = (double)(float)eps;
    ref_bwd(layer, rgi, rgw, rgb, xd, gd, wd, n, d, feps);
    if (fused)
        for (int64_t i = 0; i < n; i++)
            rgi[i] += get(&gr.t, i);

    tk_arg args[8] = {
        {TK_ARG_TENSOR, "grad_out", &go.t, 0, 0},    {TK_ARG_TENSOR, fused ? "residual" : "input", &x.t, 0, 0},
        {TK_ARG_TENSOR, "weight", &w.t, 0, 0},       {TK_ARG_TENSOR, "grad_input", (tk_tensor *)gin, 0, 0},
        {TK_ARG_TENSOR, "grad_weight", &gw.t, 0, 0}, {TK_ARG_F64, "eps", NULL, 0, eps}};
    size_t na = 6;
    if (fused)
        args[na++] = (tk_arg){TK_ARG_TENSOR, "grad_residual", &gr.t, 0, 0};
    if (layer && bias)
        args[na++] = (tk_arg){TK_ARG_TENSOR, "grad_bias", &gb.t, 0, 0};
    int rc = op_run_cpu(op, args, na);
    char what[128];
    snprintf(what, sizeof what, "%s%s%sscale %g eps %g", pad ? "strided " : "", inplace ? "in-place " : "",
             layer && bias ? "bias " : "", scale, eps);
    int ok = 1;
    if (rc != TK_OK) {
        fprintf(stderr, "  %s %s %s: rc %d: %s (seed %llu)\n", op, tk_ops__dtype_str(dt), what, rc, tk_last_error(),
                (unsigned long long)seed);
        ok = 0;
    } else {
        ok &= compare(op, "grad_input", gin, rgi, rms_of(rgi, n), what);
        ok &= compare(op, "grad_weight", &gw.t, rgw, rms_of(rgw, d), what);
        if (layer && bias)
            ok &= compare(op, "grad_bias", &gb.t, rgb, rms_of(rgb, d), what);
        else
            for (int64_t c = 0; c < d; c++)
                ok &= get(&gb.t, c) == gb0[c];
    }
    free(gb0);
    free(xd);
    free(gd);
    free(rgi);
    free(wd);
    free(rgw);
    free(rgb);
    host_free(&x);
    host_free(&go);
    host_free(&gr);
    host_free(&gi);
    host_free(&w);
    host_free(&gw);
    host_free(&gb);
    return ok;
}

/* Ragged shapes: d of 1 and non-multiples of 8, one row, several leading dims, a row longer than the
 * reference's 1024-column block. */
static const int64_t shapes[][3] = {
    {1, 1, 1}, {1, 1, 7}, {1, 3, 1}, {1, 5, 8}, {2, 3, 13}, {1, 4, 100}, {1, 1, 1000}, {1, 2, 2049}, {3, 7, 33},
};

/* Every shape and dtype, contiguous and strided (and in place for the plain forwards). */
static int check_op(int layer, int fused)
{
    int ok = 1;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t k = 0; k < 3; k++) {
            const int64_t *sh = shapes[s][0] == 1 ? shapes[s] + 1 : shapes[s];
            int nd = shapes[s][0] == 1 ? 2 : 3;
            tk_dtype dt = *all_dtypes[k];
            double eps = uniform(1e-6, 1e-5);
            int bias = layer && (s + k) % 2;
            ok &= check_fwd(layer, fused, dt, nd, sh, 0, uniform(0.5, 4.0), eps, 0, bias);
            ok &= check_fwd(layer, fused, dt, nd, sh, 3, uniform(0.5, 4.0), eps, 0, !bias && layer);
            if (!fused)
                ok &= check_fwd(layer, fused, dt, nd, sh, 0, uniform(0.5, 4.0), eps, 1, bias);
        }
    return ok;
}

static int check_bwd_op(int layer, int fused)
{
    int ok = 1;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t k = 0; k < 3; k++) {
            const int64_t *sh = shapes[s][0] == 1 ? shapes[s] + 1 : shapes[s];
            int nd = shapes[s][0] == 1 ? 2 : 3;
            tk_dtype dt = *all_dtypes[k];
            double eps = uniform(1e-6, 1e-5);
            int bias = layer && (s + k) % 2;
            ok &= check_bwd(layer, fused, dt, nd, sh, 0, uniform(0.5, 4.0), eps, bias, 0);
            ok &= check_bwd(layer, fused, dt, nd, sh, 2, uniform(0.5, 4.0), eps, layer && !bias, 0);
            if (fused)
                ok &= check_bwd(layer, fused, dt, nd, sh, 0, uniform(0.5, 4.0), eps, bias, 1);
        }
    return ok;
}

/* rms_norm over rows split into `parts` column ranges (torch.chunk's), as tensor parallelism runs it:
 * each part's rms_norm_sumsq against the float64 sum of squares, the parts' sums added in f32 (as an
 * all-reduce adds them), then each part's rms_norm_by_sumsq with the whole row's width against the
 * float64 rms_norm of the whole row. Strided parts and outputs when pad > 0; in place when inplace. */
static int check_split(tk_dtype dt, int ndim, const int64_t *shape, int parts, int64_t pad, double scale, double eps,
                       int inplace)
{
    int64_t d = shape[ndim - 1], n = 1, rows, csz = (d + parts - 1) / parts;
    for (int k = 0; k < ndim; k++)
        n *= shape[k];
    rows = n / d;
    host_t full, w, total;
    host_new(&full, dt, ndim, shape, 0);
    host_new(&w, dt, 1, &d, 0);
    host_new(&total, F32, ndim - 1, shape, pad);
    fill(&full, scale);
    rand_weight(&w, d);
    double *x = dalloc(n), *wd = dalloc(d), *ref = dalloc(n), *ss = dalloc(rows);
    for (int64_t i = 0; i < n; i++)
        x[i] = get(&full.t, i);
    for (int64_t c = 0; c < d; c++)
        wd[c] = get(&w.t, c);
    ref_rms(ref, x, wd, n, d, (double)(float)eps);
    for (int64_t r = 0; r < rows; r++)
        ss[r] = 0;
    char what[96];
    snprintf(what, sizeof what, "%d parts %s%sscale %g", parts, pad ? "strided " : "", inplace ? "in-place " : "",
             scale);
    int ok = 1;
    host_t px[TK_TP_TEST_PARTS], pw[TK_TP_TEST_PARTS], po[TK_TP_TEST_PARTS], ps[TK_TP_TEST_PARTS];
    for (int p = 0; p < parts; p++) { /* the parts' sums of squares, added in f32 in part order */
        int64_t c0 = p * csz < d ? p * csz : d, len = c0 + csz <= d ? csz : d - c0, psh[8], one = len;
        memcpy(psh, shape, sizeof psh[0] * (size_t)ndim);
        psh[ndim - 1] = len;
        host_new(&px[p], dt, ndim, psh, pad);
        host_new(&po[p], dt, ndim, psh, pad ? pad + 1 : 0);
        host_new(&pw[p], dt, 1, &one, 0);
        host_new(&ps[p], F32, ndim - 1, shape, pad);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < len; c++)
                set(&px[p].t, r * len + c, x[r * d + c0 + c]);
        for (int64_t c = 0; c < len; c++)
            set(&pw[p].t, c, wd[c0 + c]);
        tk_arg a[2] = {{TK_ARG_TENSOR, "out", &ps[p].t, 0, 0}, {TK_ARG_TENSOR, "input", &px[p].t, 0, 0}};
        int rc = op_run_cpu("rms_norm_sumsq", a, 2);
        ok &= rc == TK_OK;
        for (int64_t r = 0; rc == TK_OK && r < rows; r++) {
            double want = 0;
            for (int64_t c = 0; c < len; c++)
                want += x[r * d + c0 + c] * x[r * d + c0 + c];
            if (fabs(get(&ps[p].t, r) - want) > 0x1p-24 * want) {
                fprintf(stderr, "  rms_norm_sumsq %s %s row %lld: got %.9g, want %.9g (seed %llu)\n",
                        tk_ops__dtype_str(dt), what, (long long)r, get(&ps[p].t, r), want, (unsigned long long)seed);
                ok = 0;
            }
            set(&total.t, r, (double)(float)(get(&total.t, r) + get(&ps[p].t, r)));
        }
    }
    for (int p = 0; p < parts; p++) {
        int64_t c0 = p * csz < d ? p * csz : d, len = numel(&px[p].t) / (rows ? rows : 1);
        const tk_tensor *out = inplace ? &px[p].t : &po[p].t;
        tk_arg a[6] = {{TK_ARG_TENSOR, "out", (tk_tensor *)out, 0, 0},
                       {TK_ARG_TENSOR, "input", &px[p].t, 0, 0},
                       {TK_ARG_TENSOR, "weight", &pw[p].t, 0, 0},
                       {TK_ARG_TENSOR, "sumsq", &total.t, 0, 0},
                       {TK_ARG_I64, "width", NULL, parts > 1 || pad ? d : 0, 0},
                       {TK_ARG_F64, "eps", NULL, 0, eps}};
        int rc = op_run_cpu("rms_norm_by_sumsq", a, 6);
        if (rc != TK_OK) {
            fprintf(stderr, "  rms_norm_by_sumsq %s: rc %d: %s\n", what, rc, tk_last_error());
            ok = 0;
        }
        double *pref = dalloc(rows * len);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < len; c++)
                pref[r * len + c] = ref[r * d + c0 + c];
        double ms = scale * scale / 3.0;
        if (rc == TK_OK && len > 0)
            ok &= compare("rms_norm_by_sumsq", "out", out, pref, sqrt(ms / (ms + eps)), what);
        free(pref);
        host_free(&px[p]);
        host_free(&po[p]);
        host_free(&pw[p]);
        host_free(&ps[p]);
    }
    free(x);
    free(wd);
    free(ref);
    free(ss);
    host_free(&full);
    host_free(&w);
    host_free(&total);
    return ok;
}

/* ---- finite differences of the float64 forward ------------------------------------------------ */

/* L = sum(g * norm(s)) + sum(gr * s) with s = in + res (res NULL: s = in), rows of d, in double. */
static double fd_loss(int layer, const double *in, const double *res, const double *w, const double *b, const double *g,
                      const double *gr, int64_t n, int64_t d, double eps)
{
    double *s = dalloc(n), *y = dalloc(n), L = 0;
    for (int64_t i = 0; i < n; i++)
        s[i] = in[i] + (res ? res[i] : 0.0);
    if (layer)
        ref_ln(y, s, w, b, n, d, eps);
    else
        ref_rms(y, s, w, n, d, eps);
    for (int64_t i = 0; i < n; i++)
        L += g[i] * y[i] + (gr ? gr[i] * s[i] : 0.0);
    free(s);
    free(y);
    return L;
}

/* The central difference of fd_loss in v[i]. */
static double fd_at(double *v, int64_t i, int layer, const double *in, const double *res, const double *w,
                    const double *b, const double *g, const double *gr, int64_t n, int64_t d, double eps)
{
    const double h = 1e-5, v0 = v[i];
    v[i] = v0 + h;
    double lp = fd_loss(layer, in, res, w, b, g, gr, n, d, eps);
    v[i] = v0 - h;
    double lm = fd_loss(layer, in, res, w, b, g, gr, n, d, eps);
    v[i] = v0;
    return (lp - lm) / (2 * h);
}

/* |got - fd| <= tol * (unit + |fd|); prints the first miss. */
static int fd_match(const char *op, const char *which, int64_t i, double got, double fd, double unit, double tol)
{
    if (fabs(got - fd) <= tol * (unit + fabs(fd)))
        return 1;
    fprintf(stderr, "  %s '%s'[%lld]: got %.9g, finite difference %.9g (seed %llu)\n", op, which, (long long)i, got, fd,
            (unsigned long long)seed);
    return 0;
}

/* Tiny f32 cases: every gradient the op writes against the finite difference of the float64 forward,
 * and the float64 backward formulas (ref_bwd) against it too. Values are multiples of 2^-10, so the
 * fused forms' input + residual is exact in f32 and the op sees exactly the sum the float64 forward
 * differentiates. */
static int check_fd(int layer, int fused, int64_t rows, int64_t d)
{
    const char *op = layer ? (fused ? "fused_add_layer_norm_backward" : "layer_norm_backward")
                           : (fused ? "fused_add_rms_norm_backward" : "rms_norm_backward");
    int64_t sh[2] = {rows, d}, n = rows * d;
    const double eps = (double)(float)1e-2;
    double *in = dalloc(n), *res = dalloc(n), *s = dalloc(n), *g = dalloc(n), *gr = dalloc(n), *w = dalloc(d),
           *b = dalloc(d), *rgi = dalloc(n), *rgw = dalloc(d), *rgb = dalloc(d);
    for (int64_t i = 0; i < n; i++) {
        in[i] = (double)((int64_t)(next_u64() % 4097) - 2048) / 1024.0;
        res[i] = fused ? (double)((int64_t)(next_u64() % 4097) - 2048) / 1024.0 : 0.0;
        s[i] = in[i] + res[i];
        g[i] = (double)((int64_t)(next_u64() % 2049) - 1024) / 1024.0;
        gr[i] = (double)((int64_t)(next_u64() % 2049) - 1024) / 1024.0;
    }
    for (int64_t c = 0; c < d; c++) {
        w[c] = (double)((int64_t)(next_u64() % 512) + 64) / 256.0 * (next_u64() & 1 ? 1 : -1);
        b[c] = (double)((int64_t)(next_u64() % 513) - 256) / 256.0;
    }
    host_t hx, hg, hgr, hgi, hw, hgw, hgb;
    host_new(&hx, F32, 2, sh, 0);
    host_new(&hg, F32, 2, sh, 0);
    host_new(&hgr, F32, 2, sh, 0);
    host_new(&hgi, F32, 2, sh, 0);
    host_new(&hw, F32, 1, &d, 0);
    host_new(&hgw, F32, 1, &d, 0);
    host_new(&hgb, F32, 1, &d, 0);
    for (int64_t i = 0; i < n; i++) {
        set(&hx.t, i, s[i]);
        set(&hg.t, i, g[i]);
        set(&hgr.t, i, gr[i]);
    }
    for (int64_t c = 0; c < d; c++)
        set(&hw.t, c, w[c]);
    tk_arg args[8] = {
        {TK_ARG_TENSOR, "grad_input", &hgi.t, 0, 0}, {TK_ARG_TENSOR, "grad_weight", &hgw.t, 0, 0},
        {TK_ARG_TENSOR, "grad_out", &hg.t, 0, 0},    {TK_ARG_TENSOR, fused ? "residual" : "input", &hx.t, 0, 0},
        {TK_ARG_TENSOR, "weight", &hw.t, 0, 0},      {TK_ARG_F64, "eps", NULL, 0, 1e-2}};
    size_t na = 6;
    if (fused)
        args[na++] = (tk_arg){TK_ARG_TENSOR, "grad_residual", &hgr.t, 0, 0};
    if (layer)
        args[na++] = (tk_arg){TK_ARG_TENSOR, "grad_bias", &hgb.t, 0, 0};
    int rc = op_run_cpu(op, args, na);
    int ok = rc == TK_OK;
    if (!ok)
        fprintf(stderr, "  %s: rc %d: %s\n", op, rc, tk_last_error());
    ref_bwd(layer, rgi, rgw, rgb, s, g, w, n, d, eps);
    const double *gr_or_null = fused ? gr : NULL, *b_or_null = layer ? b : NULL;
    for (int64_t i = 0; ok && i < n; i++) {
        /* the gradient of the input (fused: of the input and of the residual, the same) */
        double fd = fd_at(in, i, layer, in, fused ? res : NULL, w, b_or_null, g, gr_or_null, n, d, eps);
        ok &= fd_match(op, "grad_input", i, get(&hgi.t, i), fd, 1.0, 2e-6);
        ok &= fd_match("float64 reference", "grad_input", i, rgi[i] + (fused ? gr[i] : 0.0), fd, 1.0, 1e-8);
        if (fused)
            ok &= fd_match(op, "grad_input (as the residual's)", i, get(&hgi.t, i),
                           fd_at(res, i, layer, in, res, w, b_or_null, g, gr, n, d, eps), 1.0, 2e-6);
    }
    for (int64_t c = 0; ok && c < d; c++) {
        double fd = fd_at(w, c, layer, in, fused ? res : NULL, w, b_or_null, g, gr_or_null, n, d, eps);
        ok &= fd_match(op, "grad_weight", c, get(&hgw.t, c), fd, 1.0, 2e-6);
        ok &= fd_match("float64 reference", "grad_weight", c, rgw[c], fd, 1.0, 1e-8);
        if (layer) {
            fd = fd_at(b, c, layer, in, fused ? res : NULL, w, b, g, gr_or_null, n, d, eps);
            ok &= fd_match(op, "grad_bias", c, get(&hgb.t, c), fd, 1.0, 2e-6);
            ok &= fd_match("float64 reference", "grad_bias", c, rgb[c], fd, 1.0, 1e-8);
        }
    }
    free(in);
    free(res);
    free(s);
    free(g);
    free(gr);
    free(w);
    free(b);
    free(rgi);
    free(rgw);
    free(rgb);
    host_free(&hx);
    host_free(&hg);
    host_free(&hgr);
    host_free(&hgi);
    host_free(&hw);
    host_free(&hgw);
    host_free(&hgb);
    return ok;
}

/* ---- tests ------------------------------------------------------------------------------------ */

static void test_registry(void)
{
    const char *names[] = {"rms_norm",
                           "fused_add_rms_norm",
                           "layer_norm",
                           "fused_add_layer_norm",
                           "rms_norm_backward",
                           "fused_add_rms_norm_backward",
                           "layer_norm_backward",
                           "fused_add_layer_norm_backward",
                           "rms_norm_sumsq",
                           "rms_norm_by_sumsq"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const tk_op_desc *op = tk_ops__find(names[i]);
        CHECK(op != NULL);
        if (!op)
            continue;
        CHECK_STR(op->family, "norm");
        CHECK_STR(op->package, "kernels-community/rmsnorm");
        CHECK(op->cpu != NULL && op->check != NULL);
    }
    tk_buf b = TK_BUF_INIT;
    CHECK_RC(tk_ops__signature(&b, tk_ops__find("rms_norm")), TK_OK);
    CHECK_STR(b.data, "rms_norm(out: T[..., d], input: T[..., d], weight: T|f32[d], eps: f64 = 1e-06) -> out; "
                      "T in {f32, f16, bf16}");
    tk__buf_free(&b);
    CHECK_RC(tk_ops__signature(&b, tk_ops__find("fused_add_rms_norm")), TK_OK);
    CHECK_CONTAINS(b.data, ") -> input, residual; T in {f32, f16, bf16}");
    tk__buf_free(&b);
    CHECK_RC(tk_ops__signature(&b, tk_ops__find("layer_norm")), TK_OK);
    CHECK_STR(b.data, "layer_norm(out: T[..., d], input: T[..., d], weight: T[d], bias: T[d]?, eps: f64 = 1e-05) "
                      "-> out; T in {f32, f16, bf16}");
    tk__buf_free(&b);
    CHECK_RC(tk_ops__signature(&b, tk_ops__find("fused_add_layer_norm_backward")), TK_OK);
    CHECK_STR(b.data, "fused_add_layer_norm_backward(grad_input: T[..., d], grad_weight: T[d], grad_bias: T[d]?, "
                      "grad_out: T[..., d], grad_residual: T[..., d], residual: T[..., d], weight: T[d], "
                      "eps: f64 = 1e-05) -> grad_input, grad_weight, grad_bias; T in {f32, f16, bf16}");
    tk__buf_free(&b);
    /* bias and grad_bias may be left out, nothing else */
    const tk_op_desc *ln = tk_ops__find("layer_norm_backward");
    for (size_t i = 0; ln && i < ln->nparams; i++)
        CHECK_EQ_INT(ln->params[i].optional,
                     !strcmp(ln->params[i].name, "grad_bias") || !strcmp(ln->params[i].name, "eps"));
}

static void test_rms_norm(void) { CHECK(check_op(0, 0)); }

/* The split norm's signatures and messages: sums of the wrong shape or dtype, a width below the part. */
static void test_validation_split(void)
{
    tk_buf b = TK_BUF_INIT;
    CHECK_RC(tk_ops__signature(&b, tk_ops__find("rms_norm_sumsq")), TK_OK);
    CHECK_STR(b.data, "rms_norm_sumsq(out: f32[...], input: f32|f16|bf16[..., d]) -> out");
    tk__buf_free(&b);
    CHECK_RC(tk_ops__signature(&b, tk_ops__find("rms_norm_by_sumsq")), TK_OK);
    CHECK_STR(b.data, "rms_norm_by_sumsq(out: T[..., d], input: T[..., d], weight: T|f32[d], sumsq: f32[...], "
                      "width: i64 = 0, eps: f64 = 1e-06) -> out; T in {f32, f16, bf16}");
    tk__buf_free(&b);
    int64_t s48[2] = {4, 8}, s4 = 4, s41[2] = {4, 1}, s8 = 8;
    host_t x, y, w, ss, ss2, ssh;
    host_new(&x, BF16, 2, s48, 0);
    host_new(&y, BF16, 2, s48, 0);
    host_new(&w, BF16, 1, &s8, 0);
    host_new(&ss, F32, 1, &s4, 0);
    host_new(&ss2, F32, 2, s41, 0);
    host_new(&ssh, BF16, 1, &s4, 0);
    tk_op_call c;
    tk_arg a[2] = {{TK_ARG_TENSOR, "out", &ss2.t, 0, 0}, {TK_ARG_TENSOR, "input", &x.t, 0, 0}};
    CHECK_RC(tk_ops__prepare(&c, "rms_norm_sumsq", a, 2), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "rms_norm_sumsq: 'out' has shape [4, 1], want [4] (the shape of 'input' [4, 8] "
                                    "without its last dimension)");
    a[0].t = &ssh.t;
    CHECK_RC(tk_ops__prepare(&c, "rms_norm_sumsq", a, 2), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "rms_norm_sumsq: 'out' has dtype bf16");
    a[0].t = &ss.t;
    CHECK_RC(tk_ops__prepare(&c, "rms_norm_sumsq", a, 2), TK_OK);
    tk_arg n[5] = {{TK_ARG_TENSOR, "out", &y.t, 0, 0},
                   {TK_ARG_TENSOR, "input", &x.t, 0, 0},
                   {TK_ARG_TENSOR, "weight", &w.t, 0, 0},
                   {TK_ARG_TENSOR, "sumsq", &ss2.t, 0, 0},
                   {TK_ARG_I64, "width", NULL, 16, 0}};
    CHECK_RC(tk_ops__prepare(&c, "rms_norm_by_sumsq", n, 5), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "rms_norm_by_sumsq: 'sumsq' has shape [4, 1], want [4]");
    n[3].t = &ss.t;
    n[4].i = 7;
    CHECK_RC(tk_ops__prepare(&c, "rms_norm_by_sumsq", n, 5), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "rms_norm_by_sumsq: 'width' is 7, want 0 or at least 8 ('input' holds 8 columns "
                                    "of the row)");
    n[4].i = 8;
    CHECK_RC(tk_ops__prepare(&c, "rms_norm_by_sumsq", n, 5), TK_OK);
    CHECK_RC(tk_ops__prepare(&c, "rms_norm_by_sumsq", n, 3), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "rms_norm_by_sumsq: missing argument 'sumsq'");
    host_free(&x);
    host_free(&y);
    host_free(&w);
    host_free(&ss);
    host_free(&ss2);
    host_free(&ssh);
}

/* rms_norm_sumsq and rms_norm_by_sumsq: a row whole (width left out), and split in 2 and 3 parts as
 * tensor parallelism splits OLMo2's q/k norms (the last part shorter, or empty), every shape and dtype,
 * strided and in place, large and tiny magnitudes. */
static void test_rms_norm_split(void)
{
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t k = 0; k < 3; k++) {
            const int64_t *sh = shapes[s][0] == 1 ? shapes[s] + 1 : shapes[s];
            int nd = shapes[s][0] == 1 ? 2 : 3;
            tk_dtype dt = *all_dtypes[k];
            double eps = uniform(1e-6, 1e-5);
            for (int parts = 1; parts <= 3; parts++) {
                CHECK(check_split(dt, nd, sh, parts, 0, uniform(0.5, 4.0), eps, 0));
                CHECK(check_split(dt, nd, sh, parts, 2, uniform(0.5, 4.0), eps, 0));
                CHECK(check_split(dt, nd, sh, parts, 0, uniform(0.5, 4.0), eps, 1));
            }
        }
    const int64_t sh[2] = {3, 37};
    /* large, and eps dominating (the f32 sums hold squares of |x| from about 1e-19 to 1e19) */
    CHECK(check_split(F32, 2, sh, 2, 0, 1e17, 1e-6, 0));
    CHECK(check_split(F32, 2, sh, 3, 0, 1e-12, 1e-6, 0));
    CHECK(check_split(BF16, 2, sh, 2, 0, 1e17, 1e-6, 0));
    CHECK(check_split(BF16, 2, sh, 2, 0, 1e-12, 1e-6, 0));
    CHECK(check_split(F16, 2, sh, 3, 0, 2e4, 1e-6, 0)); /* x^2 overflows f16, not the f32 sum */
}
static void test_fused_add_rms_norm(void) { CHECK(check_op(0, 1)); }
static void test_layer_norm(void) { CHECK(check_op(1, 0)); }
static void test_fused_add_layer_norm(void) { CHECK(check_op(1, 1)); }
static void test_rms_norm_backward(void) { CHECK(check_bwd_op(0, 0)); }
static void test_fused_add_rms_norm_backward(void) { CHECK(check_bwd_op(0, 1)); }
static void test_layer_norm_backward(void) { CHECK(check_bwd_op(1, 0)); }
static void test_fused_add_layer_norm_backward(void) { CHECK(check_bwd_op(1, 1)); }

/* Every backward op against finite differences of the float64 forward: d of 1 (layer norm's gradient
 * is then zero, rms norm's is not) and 5, one and two rows. */
static void test_backward_finite_differences(void)
{
    for (int layer = 0; layer < 2; layer++)
        for (int fused = 0; fused < 2; fused++) {
            CHECK(check_fd(layer, fused, 2, 5));
            CHECK(check_fd(layer, fused, 1, 1));
            CHECK(check_fd(layer, fused, 3, 1));
        }
}

/* Magnitudes near each dtype's ends: the sums must not overflow or underflow on the way. */
static void test_magnitudes(void)
{
    const int64_t sh[2] = {3, 37};
    for (int layer = 0; layer < 2; layer++)
        for (int fused = 0; fused < 2; fused++) {
            CHECK(check_fwd(layer, fused, F32, 2, sh, 0, 1e30, 1e-6, 0, layer));  /* x^2 overflows f32 */
            CHECK(check_fwd(layer, fused, F32, 2, sh, 0, 1e-20, 1e-6, 0, 0));    /* eps dominates */
            CHECK(check_fwd(layer, fused, F32, 2, sh, 0, 1e-20, 0.0, 0, 0));     /* x^2 underflows f32 */
            CHECK(check_fwd(layer, fused, F16, 2, sh, 0, 2e4, 1e-6, 0, layer));   /* x^2 overflows f16 */
            CHECK(check_fwd(layer, fused, F16, 2, sh, 0, 1e-3, 1e-6, 0, 0));
            CHECK(check_fwd(layer, fused, BF16, 2, sh, 0, 1e30, 1e-6, 0, layer));
            CHECK(check_fwd(layer, fused, BF16, 2, sh, 0, 1e-20, 1e-6, 0, 0));
            /* backward: rstd of 1e-30 and 1e20, gradients near the ends of f32 */
            CHECK(check_bwd(layer, fused, F32, 2, sh, 0, 1e30, 1e-6, layer, 0));
            CHECK(check_bwd(layer, fused, F32, 2, sh, 0, 1e-20, 0.0, layer, 0));
            CHECK(check_bwd(layer, fused, F32, 2, sh, 0, 1e-20, 1e-6, 0, 0));
            CHECK(check_bwd(layer, fused, F16, 2, sh, 0, 100.0, 1e-6, layer, 0));
            CHECK(check_bwd(layer, fused, F16, 2, sh, 0, 1e-3, 1e-6, 0, 0));
            CHECK(check_bwd(layer, fused, BF16, 2, sh, 0, 1e30, 1e-6, layer, 0));
            CHECK(check_bwd(layer, fused, BF16, 2, sh, 0, 1e-20, 1e-6, 0, 0));
        }
}

/* Many rows (more than the reference's 64 grad_weight chunks, and enough to run on several threads):
 * the sums over rows. */
static void test_backward_many_rows(void)
{
    const int64_t sh[2] = {1000, 67}, sh2[2] = {70, 1030};
    for (size_t k = 0; k < 3; k++) {
        CHECK(check_bwd(1, 0, *all_dtypes[k], 2, sh, 0, 1.0, 1e-5, 1, 0));
        CHECK(check_bwd(0, 1, *all_dtypes[k], 2, sh, 0, 1.0, 1e-6, 0, 0));
        CHECK(check_bwd(1, 1, *all_dtypes[k], 2, sh2, 1, 1.0, 1e-5, 1, 0));
        CHECK(check_bwd(0, 0, *all_dtypes[k], 2, sh2, 0, 1.0, 1e-6, 0, 0));
    }
}

/* No rows: the sums over rows are zero, written (grad_weight, grad_bias); grad_input is empty. */
static void test_backward_no_rows(void)
{
    int64_t sh[2] = {0, 6}, d = 6;
    host_t x, g, gi, w, gw, gb;
    host_new(&x, BF16, 2, sh, 0);
    host_new(&g, BF16, 2, sh, 0);
    host_new(&gi, BF16, 2, sh, 0);
    host_new(&w, BF16, 1, &d, 0);
    host_new(&gw, BF16, 1, &d, 0);
    host_new(&gb, BF16, 1, &d, 0);
    fill(&gw, 3.0);
    fill(&gb, 3.0);
    tk_arg args[6] = {{TK_ARG_TENSOR, "grad_input", &gi.t, 0, 0}, {TK_ARG_TENSOR, "grad_weight", &gw.t, 0, 0},
                      {TK_ARG_TENSOR, "grad_bias", &gb.t, 0, 0},  {TK_ARG_TENSOR, "grad_out", &g.t, 0, 0},
                      {TK_ARG_TENSOR, "input", &x.t, 0, 0},       {TK_ARG_TENSOR, "weight", &w.t, 0, 0}};
    tk_op_call c;
    CHECK_RC(tk_ops__prepare(&c, "layer_norm_backward", args, 6), TK_OK);
    CHECK_RC(tk_ops__run_cpu(&c), TK_OK);
    for (int64_t i = 0; i < d; i++) {
        CHECK(get(&gw.t, i) == 0.0);
        CHECK(get(&gb.t, i) == 0.0);
    }
    host_free(&x);
    host_free(&g);
    host_free(&gi);
    host_free(&w);
    host_free(&gw);
    host_free(&gb);
}

/* layer_norm: eps defaults to 1e-5; a constant row gives exactly the bias (or zero without one). */
static void test_layer_norm_defaults(void)
{
    int64_t sh[2] = {2, 5}, d = 5;
    host_t x, y, w, b;
    host_new(&x, F32, 2, sh, 0);
    host_new(&y, F32, 2, sh, 0);
    host_new(&w, F32, 1, &d, 0);
    host_new(&b, F32, 1, &d, 0);
    for (int64_t i = 0; i < 10; i++)
        set(&x.t, i, 3.5);
    for (int64_t c = 0; c < d; c++) {
        set(&w.t, c, 2.0);
        set(&b.t, c, 0.25 * (double)c);
    }
    tk_arg args[4] = {{TK_ARG_TENSOR, "out", &y.t, 0, 0},
                      {TK_ARG_TENSOR, "input", &x.t, 0, 0},
                      {TK_ARG_TENSOR, "weight", &w.t, 0, 0},
                      {TK_ARG_TENSOR, "bias", &b.t, 0, 0}};
    tk_op_call c;
    CHECK_RC(tk_ops__prepare(&c, "layer_norm", args, 4), TK_OK);
    CHECK(c.f[4] == 1e-5);
    CHECK(c.t[3] == &b.t);
    CHECK_RC(tk_ops__run_cpu(&c), TK_OK);
    for (int64_t i = 0; i < 10; i++)
        CHECK(get(&y.t, i) == 0.25 * (double)(i % 5));
    CHECK_RC(tk_ops__prepare(&c, "layer_norm", args, 3), TK_OK);
    CHECK(c.t[3] == NULL);
    CHECK_RC(tk_ops__run_cpu(&c), TK_OK);
    for (int64_t i = 0; i < 10; i++)
        CHECK(get(&y.t, i) == 0.0);
    host_free(&x);
    host_free(&y);
    host_free(&w);
    host_free(&b);
}

/* An all-zero row with eps > 0 gives zeros; eps left out takes the default 1e-6. */
static void test_zero_row(void)
{
    int64_t sh[2] = {2, 5}, d = 5;
    host_t x, y, w;
    host_new(&x, F32, 2, sh, 0);
    host_new(&y, F32, 2, sh, 0);
    host_new(&w, F32, 1, &d, 0);
    for (int64_t c = 0; c < d; c++)
        set(&w.t, c, 1.0);
    tk_arg args[4] = {{TK_ARG_TENSOR, "out", &y.t, 0, 0},
                      {TK_ARG_TENSOR, "input", &x.t, 0, 0},
                      {TK_ARG_TENSOR, "weight", &w.t, 0, 0},
                      {TK_ARG_F64, "eps", NULL, 0, 1e-5}};
    tk_op_call c;
    CHECK_RC(tk_ops__prepare(&c, "rms_norm", args, 4), TK_OK);
    CHECK_RC(tk_ops__run_cpu(&c), TK_OK);
    for (int64_t i = 0; i < 10; i++)
        CHECK(get(&y.t, i) == 0.0);
    /* eps left out takes the default */
    CHECK_RC(tk_ops__prepare(&c, "rms_norm", args, 3), TK_OK);
    CHECK(c.f[3] == 1e-6);
    host_free(&x);
    host_free(&y);
    host_free(&w);
}

/* Empty tensors are accepted and touch nothing. */
static void test_empty(void)
{
    int64_t sh[2] = {0, 16}, d = 16;
    host_t x, y, w;
    host_new(&x, BF16, 2, sh, 0);
    host_new(&y, BF16, 2, sh, 0);
    host_new(&w, BF16, 1, &d, 0);
    tk_arg args[3] = {{TK_ARG_TENSOR, "input", &x.t, 0, 0},
                      {TK_ARG_TENSOR, "residual", &y.t, 0, 0},
                      {TK_ARG_TENSOR, "weight", &w.t, 0, 0}};
    tk_op_call c;
    CHECK_RC(tk_ops__prepare(&c, "fused_add_rms_norm", args, 3), TK_OK);
    CHECK_RC(tk_ops__run_cpu(&c), TK_OK);
    host_free(&x);
    host_free(&y);
    host_free(&w);
}

static void test_validation(void)
{
    int64_t s48[2] = {4, 8}, s47[2] = {4, 7}, s8 = 8, s7 = 7, s18[2] = {1, 8};
    host_t x, y, y2, w, w7, w2, xf16;
    host_new(&x, F32, 2, s48, 0);
    host_new(&y, F32, 2, s48, 0);
    host_new(&y2, F32, 2, s47, 0);
    host_new(&w, F32, 1, &s8, 0);
    host_new(&w7, F32, 1, &s7, 0);
    host_new(&w2, F32, 2, s18, 0);
    host_new(&xf16, F16, 2, s48, 0);
    tk_op_call c;

    tk_arg a1[4] = {{TK_ARG_TENSOR, "out", &y2.t, 0, 0},
                    {TK_ARG_TENSOR, "input", &x.t, 0, 0},
                    {TK_ARG_TENSOR, "weight", &w.t, 0, 0},
                    {TK_ARG_F64, "eps", NULL, 0, 1e-6}};
    CHECK_RC(tk_ops__prepare(&c, "rms_norm", a1, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "rms_norm: 'out' has shape [4, 7], want [4, 8] (the shape of 'input')");

    a1[0].t = &y.t;
    a1[2].t = &w7.t;
    CHECK_RC(tk_ops__prepare(&c, "rms_norm", a1, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(),
                   "rms_norm: 'weight' has shape [7], want [8] (the last dimension of 'input' [4, 8])");

    a1[2].t = &w2.t;
    CHECK_RC(tk_ops__prepare(&c, "rms_norm", a1, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "rms_norm: 'weight' has rank 2 (shape [1, 8]), want 1");

    a1[2].t = &w.t;
    a1[1].t = &xf16.t;
    CHECK_RC(tk_ops__prepare(&c, "rms_norm", a1, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "rms_norm: 'out' has dtype f32, want f16 (the dtype of 'input')");

    a1[1].t = &x.t;
    a1[3].f = -1.0;
    CHECK_RC(tk_ops__prepare(&c, "rms_norm", a1, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "rms_norm: 'eps' is -1, want a finite value >= 0");
    a1[3].f = NAN;
    CHECK_RC(tk_ops__prepare(&c, "rms_norm", a1, 4), TK_ERR_INVALID);
    a1[3].f = 1e300; /* inf as f32 */
    CHECK_RC(tk_ops__prepare(&c, "rms_norm", a1, 4), TK_ERR_INVALID);
    a1[3].f = 1e-6;
    CHECK_RC(tk_ops__prepare(&c, "rms_norm", a1, 4), TK_OK);

    tk_arg a2[4] = {{TK_ARG_TENSOR, "input", &x.t, 0, 0},
                    {TK_ARG_TENSOR, "residual", &y2.t, 0, 0},
                    {TK_ARG_TENSOR, "weight", &w.t, 0, 0},
                    {TK_ARG_F64, "eps", NULL, 0, 1e-6}};
    CHECK_RC(tk_ops__prepare(&c, "fused_add_rms_norm", a2, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(),
                   "fused_add_rms_norm: 'residual' has shape [4, 7], want [4, 8] (the shape of 'input')");
    a2[1].t = &x.t;
    CHECK_RC(tk_ops__prepare(&c, "fused_add_rms_norm", a2, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "fused_add_rms_norm: 'input' and 'residual' are the same tensor");
    a2[1].t = &y.t;
    a2[2].t = &w7.t;
    CHECK_RC(tk_ops__prepare(&c, "fused_add_rms_norm", a2, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "fused_add_rms_norm: 'weight' has shape [7], want [8] (the last dimension "
                                    "of 'input' [4, 8])");
    a2[2].t = &w.t;
    a2[1].t = &xf16.t;
    CHECK_RC(tk_ops__prepare(&c, "fused_add_rms_norm", a2, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "'residual' has dtype f16, want f32 (the dtype of 'input')");
    a2[1].t = &y.t;
    CHECK_RC(tk_ops__prepare(&c, "fused_add_rms_norm", a2, 2), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "fused_add_rms_norm: missing argument 'weight'");

    /* rank 0 input: there is no last dimension to normalise */
    host_t s;
    host_new(&s, F32, 1, &s8, 0);
    s.t.ndim = 0;
    a1[0].t = &s.t;
    a1[1].t = &s.t;
    CHECK_RC(tk_ops__prepare(&c, "rms_norm", a1, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "rms_norm: 'out' has rank 0 (shape []), want at least 1");
    host_free(&s);

    host_free(&x);
    host_free(&y);
    host_free(&y2);
    host_free(&w);
    host_free(&w7);
    host_free(&w2);
    host_free(&xf16);
}

/* The new ops' messages name the argument and the shape it got. */
static void test_validation_ln_and_backward(void)
{
    int64_t s48[2] = {4, 8}, s47[2] = {4, 7}, s8 = 8, s7 = 7;
    host_t x, y, y2, w, w7, gw, gb, xf16;
    host_new(&x, F32, 2, s48, 0);
    host_new(&y, F32, 2, s48, 0);
    host_new(&y2, F32, 2, s47, 0);
    host_new(&w, F32, 1, &s8, 0);
    host_new(&w7, F32, 1, &s7, 0);
    host_new(&gw, F32, 1, &s8, 0);
    host_new(&gb, F32, 1, &s8, 0);
    host_new(&xf16, F16, 1, &s8, 0);
    tk_op_call c;

    tk_arg a1[5] = {{TK_ARG_TENSOR, "out", &y.t, 0, 0},
                    {TK_ARG_TENSOR, "input", &x.t, 0, 0},
                    {TK_ARG_TENSOR, "weight", &w.t, 0, 0},
                    {TK_ARG_TENSOR, "bias", &w7.t, 0, 0},
                    {TK_ARG_F64, "eps", NULL, 0, 1e-5}};
    CHECK_RC(tk_ops__prepare(&c, "layer_norm", a1, 5), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(),
                   "layer_norm: 'bias' has shape [7], want [8] (the last dimension of 'input' [4, 8])");
    a1[3].t = &xf16.t;
    CHECK_RC(tk_ops__prepare(&c, "layer_norm", a1, 5), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "layer_norm: 'bias' has dtype f16, want f32 (the dtype of 'input')");
    a1[3].t = &w.t;
    a1[4].f = -1e-5;
    CHECK_RC(tk_ops__prepare(&c, "layer_norm", a1, 5), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "layer_norm: 'eps' is -1e-05, want a finite value >= 0");

    tk_arg a2[4] = {{TK_ARG_TENSOR, "input", &x.t, 0, 0},
                    {TK_ARG_TENSOR, "residual", &x.t, 0, 0},
                    {TK_ARG_TENSOR, "weight", &w.t, 0, 0},
                    {TK_ARG_TENSOR, "bias", &w.t, 0, 0}};
    CHECK_RC(tk_ops__prepare(&c, "fused_add_layer_norm", a2, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "fused_add_layer_norm: 'input' and 'residual' are the same tensor");
    a2[1].t = &y2.t;
    CHECK_RC(tk_ops__prepare(&c, "fused_add_layer_norm", a2, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(),
                   "fused_add_layer_norm: 'residual' has shape [4, 7], want [4, 8] (the shape of 'input')");

    tk_arg a3[7] = {{TK_ARG_TENSOR, "grad_input", &y.t, 0, 0}, {TK_ARG_TENSOR, "grad_weight", &gw.t, 0, 0},
                    {TK_ARG_TENSOR, "grad_bias", &gb.t, 0, 0}, {TK_ARG_TENSOR, "grad_out", &y2.t, 0, 0},
                    {TK_ARG_TENSOR, "input", &x.t, 0, 0},      {TK_ARG_TENSOR, "weight", &w.t, 0, 0},
                    {TK_ARG_F64, "eps", NULL, 0, 1e-5}};
    CHECK_RC(tk_ops__prepare(&c, "layer_norm_backward", a3, 7), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(),
                   "layer_norm_backward: 'grad_out' has shape [4, 7], want [4, 8] (the shape of 'input')");
    a3[3].t = &y.t;
    a3[0].t = &y2.t;
    CHECK_RC(tk_ops__prepare(&c, "layer_norm_backward", a3, 7), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(),
                   "layer_norm_backward: 'grad_input' has shape [4, 7], want [4, 8] (the shape of 'input')");
    a3[0].t = &y.t;
    a3[1].t = &w7.t;
    CHECK_RC(tk_ops__prepare(&c, "layer_norm_backward", a3, 7), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "layer_norm_backward: 'grad_weight' has shape [7], want [8] (the last "
                                    "dimension of 'input' [4, 8])");
    a3[1].t = &gw.t;
    a3[2].t = &w7.t;
    CHECK_RC(tk_ops__prepare(&c, "layer_norm_backward", a3, 7), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "layer_norm_backward: 'grad_bias' has shape [7], want [8]");
    a3[2].t = &gw.t;
    CHECK_RC(tk_ops__prepare(&c, "layer_norm_backward", a3, 7), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(),
                   "layer_norm_backward: 'grad_weight' and 'grad_bias' are the same tensor; both are written");
    a3[2].t = &gb.t;
    CHECK_RC(tk_ops__prepare(&c, "layer_norm_backward", a3, 7), TK_OK);
    /* rms norm has no bias */
    CHECK_RC(tk_ops__prepare(&c, "rms_norm_backward", a3, 7), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "rms_norm_backward: no parameter named 'grad_bias'");
    tk_arg a4[6] = {{TK_ARG_TENSOR, "grad_input", &y.t, 0, 0},     {TK_ARG_TENSOR, "grad_out", &y.t, 0, 0},
                    {TK_ARG_TENSOR, "grad_residual", &y2.t, 0, 0}, {TK_ARG_TENSOR, "residual", &x.t, 0, 0},
                    {TK_ARG_TENSOR, "weight", &w.t, 0, 0},         {TK_ARG_TENSOR, "grad_weight", &gw.t, 0, 0}};
    CHECK_RC(tk_ops__prepare(&c, "fused_add_rms_norm_backward", a4, 5), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "fused_add_rms_norm_backward: missing argument 'grad_weight'");
    CHECK_RC(tk_ops__prepare(&c, "fused_add_rms_norm_backward", a4, 6), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "fused_add_rms_norm_backward: 'grad_residual' has shape [4, 7], want [4, 8] "
                                    "(the shape of 'residual')");
    /* accumulating in place into grad_residual is allowed */
    a4[2].t = &y.t;
    CHECK_RC(tk_ops__prepare(&c, "fused_add_rms_norm_backward", a4, 6), TK_OK);

    host_free(&x);
    host_free(&y);
    host_free(&y2);
    host_free(&w);
    host_free(&w7);
    host_free(&gw);
    host_free(&gb);
    host_free(&xf16);
}

static tk_arg targ(const char *name, tk_tensor *t) { return (tk_arg){TK_ARG_TENSOR, name, t, 0, 0}; }
static tk_arg farg(const char *name, double v) { return (tk_arg){TK_ARG_F64, name, NULL, 0, v}; }

/* prepare and run the CPU reference */
static int run_op(const char *op, tk_arg *a, size_t n)
{
    tk_op_call c;
    int rc = tk_ops__prepare(&c, op, a, n);
    return rc != TK_OK ? rc : tk_ops__run_cpu(&c);
}

/* The RMS forwards with an f32 weight over 16-bit x (Gemma's 1 + w): (x * rstd) * w in f32, rounded
 * once, so a weight such as 1 + 2^-10, which bf16 cannot hold, still scales; the fused form the same
 * on the rounded sum; the other norms and the backward keep the one dtype. */
static void test_f32_weight(void)
{
    int64_t s2[2] = {3, 64}, d = 64;
    const tk_dtype *dts[2] = {&BF16, &F16};
    for (int k = 0; k < 2; k++) {
        tk_dtype dt = *dts[k];
        host_t x, out, w, res, in2;
        host_new(&x, dt, 2, s2, 0);
        host_new(&out, dt, 2, s2, 0);
        host_new(&res, dt, 2, s2, 0);
        host_new(&in2, dt, 2, s2, 0);
        host_new(&w, F32, 1, &d, 0);
        fill(&x, 3);
        fill(&res, 3);
        for (int64_t j = 0; j < d; j++)
            set(&w.t, j, 1.0 + (double)(j - 32) * 0x1p-12); /* 1 + w, w below bf16's step at 1 */
        tk_arg a[4] = {targ("out", &out.t), targ("input", &x.t), targ("weight", &w.t), farg("eps", 1e-6)};
        CHECK_RC(run_op("rms_norm", a, 4), TK_OK);
        int differs = 0;
        for (int64_t r = 0; r < 3; r++) {
            double ss = 0;
            for (int64_t j = 0; j < d; j++)
                ss += get(&x.t, r * d + j) * get(&x.t, r * d + j);
            float rstd = (float)(1.0 / sqrt(ss / (double)d + 1e-6));
            for (int64_t j = 0; j < d; j++) {
                float xs = (float)get(&x.t, r * d + j) * rstd;
                double want = quantize(xs * (float)get(&w.t, j), dt);
                CHECK(get(&out.t, r * d + j) == want);
                differs |= want != quantize(xs * (float)quantize(get(&w.t, j), dt), dt);
            }
        }
        CHECK(differs); /* the case tells an f32 weight from one rounded to 16 bits */
        /* fused: residual = x + residual (rounded), input = rms_norm(residual) * w */
        memcpy(in2.buf, x.buf, (size_t)(3 * d * 2));
        tk_arg f[4] = {targ("input", &in2.t), targ("residual", &res.t), targ("weight", &w.t), farg("eps", 1e-6)};
        CHECK_RC(run_op("fused_add_rms_norm", f, 4), TK_OK);
        tk_arg g[4] = {targ("out", &out.t), targ("input", &res.t), targ("weight", &w.t), farg("eps", 1e-6)};
        CHECK_RC(run_op("rms_norm", g, 4), TK_OK);
        CHECK(memcmp(out.buf, in2.buf, (size_t)(3 * d * 2)) == 0);
        host_free(&x);
        host_free(&out);
        host_free(&w);
        host_free(&res);
        host_free(&in2);
    }
    /* refused: another 16-bit weight, an f32 weight for layer norm or a backward */
    int64_t s48[2] = {4, 8}, s8 = 8;
    host_t xb, yb, wh, wf, gi, gw;
    host_new(&xb, BF16, 2, s48, 0);
    host_new(&yb, BF16, 2, s48, 0);
    host_new(&gi, BF16, 2, s48, 0);
    host_new(&gw, BF16, 1, &s8, 0);
    host_new(&wh, F16, 1, &s8, 0);
    host_new(&wf, F32, 1, &s8, 0);
    tk_op_call c;
    tk_arg a[4] = {targ("out", &yb.t), targ("input", &xb.t), targ("weight", &wh.t), farg("eps", 1e-6)};
    CHECK_RC(tk_ops__prepare(&c, "rms_norm", a, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "rms_norm: 'weight' has dtype f16, want f32 or bf16 (the dtype of 'input')");
    a[2].t = &wf.t;
    CHECK_RC(tk_ops__prepare(&c, "layer_norm", a, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "layer_norm: 'weight' has dtype f32, want bf16 (the dtype of 'input')");
    tk_arg b[6] = {targ("grad_input", &gi.t), targ("grad_weight", &gw.t), targ("grad_out", &yb.t),
                   targ("input", &xb.t),      targ("weight", &wf.t),      farg("eps", 1e-6)};
    CHECK_RC(tk_ops__prepare(&c, "rms_norm_backward", b, 6), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "rms_norm_backward: 'weight' has dtype f32, want bf16");
    host_t xf;
    host_new(&xf, F32, 2, s48, 0);
    tk_arg e[4] = {targ("out", &xf.t), targ("input", &xf.t), targ("weight", &wh.t), farg("eps", 1e-6)};
    CHECK_RC(tk_ops__prepare(&c, "rms_norm", e, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "rms_norm: 'weight' has dtype f16, want f32 (the dtype of 'input')");
    host_free(&xf);
    host_free(&xb);
    host_free(&yb);
    host_free(&gi);
    host_free(&gw);
    host_free(&wh);
    host_free(&wf);
}

int main(void)
{
    op_test_seed();
    RUN(test_registry);
    RUN(test_rms_norm);
    RUN(test_rms_norm_split);
    RUN(test_validation_split);
    RUN(test_fused_add_rms_norm);
    RUN(test_layer_norm);
    RUN(test_fused_add_layer_norm);
    RUN(test_rms_norm_backward);
    RUN(test_fused_add_rms_norm_backward);
    RUN(test_layer_norm_backward);
    RUN(test_fused_add_layer_norm_backward);
    RUN(test_backward_finite_differences);
    RUN(test_magnitudes);
    RUN(test_backward_many_rows);
    RUN(test_backward_no_rows);
    RUN(test_layer_norm_defaults);
    RUN(test_zero_row);
    RUN(test_empty);
    RUN(test_validation);
    RUN(test_validation_ln_and_backward);
    RUN(test_f32_weight);
    return th_done();
}
