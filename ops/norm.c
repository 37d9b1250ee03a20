/*
 * norm.c — the normalisation ops (the ops of kernels-community/rmsnorm): signatures, shape checks and
 * CPU references.
 *
 *   rms_norm              out = x * rsqrt(mean(x^2) + eps) * weight                       x = input
 *   fused_add_rms_norm    residual = input + residual (rounded to T, written back), then
 *                         input = rms_norm(residual) * weight                      (vLLM's semantics)
 *   layer_norm            out = (x - mean(x)) * rsqrt(var(x) + eps) * weight + bias  (bias optional)
 *   fused_add_layer_norm  residual = input + residual (rounded, written back), input = layer_norm(residual)
 *
 * and their backward passes. With xh the normalised row (rms: x * rstd, rstd = rsqrt(mean(x^2) + eps);
 * layer: (x - mean) * rstd, rstd = rsqrt(var + eps), var the biased variance), gw = grad_out * weight,
 * means over the row's d columns and sums over all rows:
 *
 *   rms_norm_backward     grad_input  = rstd * (gw - xh * mean(gw * xh))
 *                         grad_weight = sum(grad_out * xh)
 *   layer_norm_backward   grad_input  = rstd * (gw - mean(gw) - xh * mean(gw * xh))
 *                         grad_weight = sum(grad_out * xh),  grad_bias = sum(grad_out)  (optional)
 *   fused_add_*_backward  `residual` is the forward's updated residual (the sum the norm saw);
 *                         grad_input = grad_residual + the norm's grad_input above: the gradient of
 *                         both the forward's `input` and its `residual` (they entered as one sum).
 *
 * And rms_norm in two halves, for a row split across ranks (OLMo2's q/k norms under tensor
 * parallelism): each rank's rms_norm_sumsq of its columns, summed over the ranks (an all-reduce), then
 * each rank's rms_norm_by_sumsq of its columns with their part of the weight:
 *
 *   rms_norm_sumsq        out[r] = sum(x[r, :]^2), f32: a row's part of rms_norm's sum of squares
 *   rms_norm_by_sumsq     out = x * rsqrt(sumsq / width + eps) * weight: rms_norm of d columns of a
 *                         row of width columns (0: d), the whole row's sum of squares given
 *
 * Numerics: elements are loaded as fp32. Forward: the row's sums (x^2 for rms; x, then (x - mean)^2 for
 * layer norm: two passes, no cancellation) are accumulated in double (rms_norm_sumsq rounds its sum to
 * fp32), rstd = 1/sqrt(. + eps) is computed in double (rms_norm_by_sumsq: from the given fp32 sum) and
 * rounded to fp32 (the mean too), and ((x - mean) * rstd) * weight (+ bias) is
 * computed in fp32 and rounded once to the output dtype. The fused forwards add in fp32, round the sum
 * to T, store it, and normalise the rounded sum. Backward: everything is computed in double and
 * rounded once; grad_weight / grad_bias are summed per fixed chunk of rows (min(rows, 64) chunks, in
 * parallel), then the chunks are added in chunk order: the result does not depend on the thread count.
 * The RMS forwards also take an f32 weight with f16/bf16 x (T|f32 in the signature): transformers'
 * Gemma norms multiply by (1 + w) in f32 before their one rounding, and 1 + w rounded to 16 bits would
 * lose w's low bits. Strided tensors are read and written through their strides. rms_norm and layer_norm may run in
 * place (out == input); the fused forwards need input and residual not to overlap; the fused backwards
 * may accumulate in place (grad_input == grad_residual).
 */
#include <math.h>
#include <stdlib.h>

#include "ops/ops.h"

/* What each table entry is; parameter indices are -1 where the op has none. */
typedef struct {
    int layer; /* layer norm (mean and bias), else rms norm */
    int fused; /* the fused-add form */
    int bwd;   /* a backward pass */
    /* forward */
    int out;   /* the written result: out, or (fused) input */
    int x;     /* the normalised tensor: input, or (fused) residual; backward: input or residual */
    int w, b, eps;
    /* backward */
    int gi, gw, gb, go, gr;
    int ss; /* rms_norm_by_sumsq: the sums of squares (the width follows), else -1 */
} norm_info;

/* ---- shape checks ----------------------------------------------------------------------------- */

/* The tensor at param ia must have the shape of the one at param ib. */
static int check_same(const tk_op_call *c, int ia, int ib)
{
    const tk_tensor *a = c->t[ia], *b = c->t[ib];
    if (!tk_ops__same_shape(a, b))
        return tk__err(TK_ERR_INVALID, "%s: '%s' has shape %s, want %s (the shape of '%s')", c->op->name,
                       c->op->params[ia].name, tk_ops__shape_fmt(a->ndim, a->shape),
                       tk_ops__shape_fmt(b->ndim, b->shape), c->op->params[ib].name);
    return TK_OK;
}

/* The vector at param iw (weight, bias, their gradients), when given, must be [d] for d = the last
 * dimension of the tensor at param ix. */
static int check_vec(const tk_op_call *c, int iw, int ix)
{
    const tk_tensor *w = c->t[iw], *x = c->t[ix];
    int64_t d = x->shape[x->ndim - 1];
    if (w && w->shape[0] != d)
        return tk__err(TK_ERR_INVALID, "%s: '%s' has shape %s, want [%lld] (the last dimension of '%s' %s)",
                       c->op->name, c->op->params[iw].name, tk_ops__shape_fmt(w->ndim, w->shape), (long long)d,
                       c->op->params[ix].name, tk_ops__shape_fmt(x->ndim, x->shape));
    return TK_OK;
}

static int check_eps(const tk_op_call *c, int ie)
{
    double eps = c->f[ie];
    if (!(eps >= 0) || !isfinite((float)eps))
        return tk__err(TK_ERR_INVALID, "%s: 'eps' is %g, want a finite value >= 0 (as f32)", c->op->name, eps);
    return TK_OK;
}

/* Both written, so they must not be one tensor. */
static int check_distinct(const tk_op_call *c, int ia, int ib)
{
    const tk_tensor *a = c->t[ia], *b = c->t[ib];
    if (a && b && a->data == b->data && a->byte_offset == b->byte_offset && tk_ops__numel(a) > 0)
        return tk__err(TK_ERR_INVALID, "%s: '%s' and '%s' are the same tensor; both are written", c->op->name,
                       c->op->params[ia].name, c->op->params[ib].name);
    return TK_OK;
}

/* The per-row tensor at param ir must have the shape of the tensor at param ix without its last dimension. */
static int check_rows(const tk_op_call *c, int ir, int ix)
{
    const tk_tensor *r = c->t[ir], *x = c->t[ix];
    int same = r->ndim == x->ndim - 1;
    for (int32_t k = 0; same && k < r->ndim; k++)
        same = r->shape[k] == x->shape[k];
    if (!same)
        return tk__err(
            TK_ERR_INVALID, "%s: '%s' has shape %s, want %s (the shape of '%s' %s without its last dimension)",
            c->op->name, c->op->params[ir].name, tk_ops__shape_fmt(r->ndim, r->shape),
            tk_ops__shape_fmt(x->ndim - 1, x->shape), c->op->params[ix].name, tk_ops__shape_fmt(x->ndim, x->shape));
    return TK_OK;
}

/* rms_norm_by_sumsq: one sum a row, and a width that holds the row's part (0: the part is the row) */
static int check_by_sumsq(const tk_op_call *c, const norm_info *n)
{
    const tk_tensor *x = c->t[n->x];
    int64_t width = c->i[n->ss + 1], d = x->shape[x->ndim - 1];
    int rc = check_rows(c, n->ss, n->x);
    if (rc == TK_OK && width != 0 && width < d)
        return tk__err(TK_ERR_INVALID,
                       "%s: 'width' is %lld, want 0 or at least %lld ('input' holds %lld columns of the row)",
                       c->op->name, (long long)width, (long long)d, (long long)d);
    return rc;
}

static int check_sumsq(const tk_op_call *c) { return check_rows(c, 0, 1); }

static int check_norm(const tk_op_call *c)
{
    const norm_info *n = c->op->data;
    int rc;
    if (!n->bwd && n->ss >= 0 && (rc = check_by_sumsq(c, n)) != TK_OK)
        return rc;
    if (!n->bwd) {
        /* rms_norm / layer_norm: out like input; fused: residual like input */
        if (n->fused)
            rc = check_same(c, n->x, n->out);
        else
            rc = check_same(c, n->out, n->x);
        if (rc == TK_OK && n->fused)
            rc = check_distinct(c, n->out, n->x);
        /* the weight's message names 'input' in every form */
        if (rc == TK_OK)
            rc = check_vec(c, n->w, n->fused ? n->out : n->x);
        if (rc == TK_OK && n->b >= 0)
            rc = check_vec(c, n->b, n->fused ? n->out : n->x);
        return rc == TK_OK ? check_eps(c, n->eps) : rc;
    }
    rc = check_same(c, n->go, n->x);
    if (rc == TK_OK && n->gr >= 0)
        rc = check_same(c, n->gr, n->x);
    if (rc == TK_OK)
        rc = check_same(c, n->gi, n->x);
    if (rc == TK_OK)
        rc = check_vec(c, n->w, n->x);
    if (rc == TK_OK)
        rc = check_vec(c, n->gw, n->x);
    if (rc == TK_OK && n->gb >= 0)
        rc = check_vec(c, n->gb, n->x);
    if (rc == TK_OK && n->gb >= 0)
        rc = check_distinct(c, n->gw, n->gb);
    return rc == TK_OK ? check_eps(c, n->eps) : rc;
}

/* ---- CPU references: forward ------------------------------------------------------------------ */

#define BLK 1024 /* columns per step: the scratch rows live on the stack */

typedef struct {
    int layer, fused;
    float eps;
    const tk_tensor *out; /* plain: out; fused: input (read as the addend, written last) */
    const tk_tensor *in;  /* plain: input; fused: residual (the sum is written there first) */
    const tk_tensor *w, *b; /* b: layer norm's bias, NULL when left out */
    const tk_tensor *ss;    /* rms_norm_by_sumsq: each row's sum of squares (f32), else NULL */
    int64_t d, width;       /* the row's columns here, and the mean's divisor (d, or the whole row's) */
} fwd_job;

static void fwd_range(void *arg, int64_t lo, int64_t hi)
{
    const fwd_job *j = arg;
    float x[BLK], y[BLK], w[BLK];
    void *ob = tk_ops__base(j->out), *ib = tk_ops__base(j->in);
    const void *wb = tk_ops__base(j->w), *bb = j->b ? tk_ops__base(j->b) : NULL;
    int64_t ocs = tk_ops__col_stride(j->out), ics = tk_ops__col_stride(j->in), wcs = tk_ops__col_stride(j->w);
    int64_t bcs = j->b ? tk_ops__col_stride(j->b) : 0;
    for (int64_t r = lo; r < hi; r++) {
        int64_t io = tk_ops__row_offset(j->in, r), oo = tk_ops__row_offset(j->out, r);
        double s = 0; /* rms: sum of squares; layer: sum */
        if (j->ss) {
            float f;
            tk_ops__load_f32(&f, tk_ops__base(j->ss), tk_ops__flat_offset(j->ss, r), 1, 1, j->ss->dtype);
            s = (double)f;
        }
        for (int64_t c0 = 0; !j->ss && c0 < j->d; c0 += BLK) {
            int64_t n = j->d - c0 < BLK ? j->d - c0 : BLK;
            if (j->fused) {
                /* residual = input + residual, rounded to T; the input row is j->out's */
                tk_ops__load_f32(x, ib, io + c0 * ics, ics, n, j->in->dtype);
                tk_ops__load_f32(y, ob, oo + c0 * ocs, ocs, n, j->out->dtype);
                for (int64_t i = 0; i < n; i++)
                    x[i] = y[i] + x[i];
                tk_ops__store_f32(ib, io + c0 * ics, ics, x, n, j->in->dtype);
            }
            tk_ops__load_f32(x, ib, io + c0 * ics, ics, n, j->in->dtype);
            if (j->layer)
                for (int64_t i = 0; i < n; i++)
                    s += (double)x[i];
            else
                for (int64_t i = 0; i < n; i++)
                    s += (double)x[i] * (double)x[i];
        }
        float mean = 0, rstd;
        if (j->layer) {
            double m = s / (double)j->d, v = 0;
            for (int64_t c0 = 0; c0 < j->d; c0 += BLK) {
                int64_t n = j->d - c0 < BLK ? j->d - c0 : BLK;
                tk_ops__load_f32(x, ib, io + c0 * ics, ics, n, j->in->dtype);
                for (int64_t i = 0; i < n; i++)
                    v += ((double)x[i] - m) * ((double)x[i] - m);
            }
            mean = (float)m;
            rstd = (float)(1.0 / sqrt(v / (double)j->d + (double)j->eps));
        } else {
            rstd = (float)(1.0 / sqrt(s / (double)j->width + (double)j->eps));
        }
        for (int64_t c0 = 0; c0 < j->d; c0 += BLK) {
            int64_t n = j->d - c0 < BLK ? j->d - c0 : BLK;
            tk_ops__load_f32(x, ib, io + c0 * ics, ics, n, j->in->dtype);
            tk_ops__load_f32(w, wb, c0 * wcs, wcs, n, j->w->dtype);
            if (j->layer) {
                for (int64_t i = 0; i < n; i++)
                    x[i] = ((x[i] - mean) * rstd) * w[i];
                if (bb) {
                    tk_ops__load_f32(y, bb, c0 * bcs, bcs, n, j->b->dtype);
                    for (int64_t i = 0; i < n; i++)
                        x[i] = x[i] + y[i];
                }
            } else {
                for (int64_t i = 0; i < n; i++)
                    x[i] = (x[i] * rstd) * w[i];
            }
            tk_ops__store_f32(ob, oo + c0 * ocs, ocs, x, n, j->out->dtype);
        }
    }
}

static int cpu_fwd(const tk_op_call *c)
{
    const norm_info *ni = c->op->data;
    fwd_job j = {ni->layer,
                 ni->fused,
                 (float)c->f[ni->eps],
                 c->t[ni->out],
                 c->t[ni->x],
                 c->t[ni->w],
                 ni->b >= 0 ? c->t[ni->b] : NULL,
                 ni->ss >= 0 ? c->t[ni->ss] : NULL,
                 0,
                 0};
    j.d = j.in->shape[j.in->ndim - 1];
    j.width = ni->ss >= 0 && c->i[ni->ss + 1] > 0 ? c->i[ni->ss + 1] : j.d;
    int64_t numel = tk_ops__numel(j.in);
    if (numel == 0)
        return TK_OK;
    tk_ops__parallel(numel / j.d, j.d * ((j.fused ? 24 : 16) + (j.layer ? 8 : 0)), fwd_range, &j);
    return TK_OK;
}

/* rms_norm_sumsq: each row's sum of squares in double, rounded to fp32 */
typedef struct {
    const tk_tensor *out, *in;
    int64_t d;
} sumsq_job;

static void sumsq_range(void *arg, int64_t lo, int64_t hi)
{
    const sumsq_job *j = arg;
    float x[BLK];
    const void *ib = tk_ops__base(j->in);
    int64_t ics = tk_ops__col_stride(j->in);
    for (int64_t r = lo; r < hi; r++) {
        int64_t io = tk_ops__row_offset(j->in, r);
        double s = 0;
        for (int64_t c0 = 0; c0 < j->d; c0 += BLK) {
            int64_t n = j->d - c0 < BLK ? j->d - c0 : BLK;
            tk_ops__load_f32(x, ib, io + c0 * ics, ics, n, j->in->dtype);
            for (int64_t i = 0; i < n; i++)
                s += (double)x[i] * (double)x[i];
        }
        float f = (float)s;
        tk_ops__store_f32(tk_ops__base(j->out), tk_ops__flat_offset(j->out, r), 1, &f, 1, j->out->dtype);
    }
}

static int cpu_sumsq(const tk_op_call *c)
{
    sumsq_job j = {c->t[0], c->t[1], c->t[1]->shape[c->t[1]->ndim - 1]};
    int64_t rows = tk_ops__numel(j.out);
    if (rows > 0)
        tk_ops__parallel(rows, j.d * 8 + 1, sumsq_range, &j);
    return TK_OK;
}

/* ---- CPU references: backward ----------------------------------------------------------------- */

#define BWD_CHUNKS 64 /* grad_weight partial sums: at most this many fixed row chunks */

typedef struct {
    int layer;
    double eps;
    const tk_tensor *gi, *go, *gr, *x, *w; /* gr: the fused forms' grad_residual, else NULL */
    int64_t d, rows, nchunk;
    double *pw, *pb; /* nchunk x d partial sums of grad_weight and grad_bias (pb NULL: not wanted) */
} bwd_job;

/* One row: grad_input, and the row's terms added to the chunk's partial sums pw, pb. */
static void bwd_row(const bwd_job *j, int64_t r, double *pw, double *pb)
{
    float x[BLK], g[BLK], w[BLK], e[BLK];
    const void *xb = tk_ops__base(j->x), *gob = tk_ops__base(j->go), *wb = tk_ops__base(j->w);
    const void *grb = j->gr ? tk_ops__base(j->gr) : NULL;
    void *gib = tk_ops__base(j->gi);
    int64_t xcs = tk_ops__col_stride(j->x), gocs = tk_ops__col_stride(j->go), wcs = tk_ops__col_stride(j->w);
    int64_t gics = tk_ops__col_stride(j->gi), grcs = j->gr ? tk_ops__col_stride(j->gr) : 0;
    int64_t xo = tk_ops__row_offset(j->x, r), goo = tk_ops__row_offset(j->go, r);
    int64_t gio = tk_ops__row_offset(j->gi, r), gro = j->gr ? tk_ops__row_offset(j->gr, r) : 0;
    const double d = (double)j->d;

    double mean = 0;
    if (j->layer) {
        double s = 0;
        for (int64_t c0 = 0; c0 < j->d; c0 += BLK) {
            int64_t n = j->d - c0 < BLK ? j->d - c0 : BLK;
            tk_ops__load_f32(x, xb, xo + c0 * xcs, xcs, n, j->x->dtype);
            for (int64_t i = 0; i < n; i++)
                s += x[i];
        }
        mean = s / d;
    }
    /* sum (x - mean)^2, sum gw, sum gw * (x - mean) */
    double s2 = 0, s3 = 0, s4 = 0;
    for (int64_t c0 = 0; c0 < j->d; c0 += BLK) {
        int64_t n = j->d - c0 < BLK ? j->d - c0 : BLK;
        tk_ops__load_f32(x, xb, xo + c0 * xcs, xcs, n, j->x->dtype);
        tk_ops__load_f32(g, gob, goo + c0 * gocs, gocs, n, j->go->dtype);
        tk_ops__load_f32(w, wb, c0 * wcs, wcs, n, j->w->dtype);
        for (int64_t i = 0; i < n; i++) {
            double xm = (double)x[i] - mean, gw = (double)g[i] * (double)w[i];
            s2 += xm * xm;
            s3 += gw;
            s4 += gw * xm;
        }
    }
    const double rstd = 1.0 / sqrt(s2 / d + j->eps);
    const double c1 = j->layer ? s3 / d : 0.0; /* mean(gw) */
    const double c2 = s4 * rstd / d;           /* mean(gw * xh) */
    for (int64_t c0 = 0; c0 < j->d; c0 += BLK) {
        int64_t n = j->d - c0 < BLK ? j->d - c0 : BLK;
        tk_ops__load_f32(x, xb, xo + c0 * xcs, xcs, n, j->x->dtype);
        tk_ops__load_f32(g, gob, goo + c0 * gocs, gocs, n, j->go->dtype);
        tk_ops__load_f32(w, wb, c0 * wcs, wcs, n, j->w->dtype);
        if (grb)
            tk_ops__load_f32(e, grb, gro + c0 * grcs, grcs, n, j->gr->dtype);
        for (int64_t i = 0; i < n; i++) {
            double xh = ((double)x[i] - mean) * rstd, gw = (double)g[i] * (double)w[i];
            double dx = rstd * (gw - c1 - xh * c2);
            if (grb)
                dx += (double)e[i];
            pw[c0 + i] += (double)g[i] * xh;
            if (pb)
                pb[c0 + i] += (double)g[i];
            x[i] = (float)dx;
        }
        tk_ops__store_f32(gib, gio + c0 * gics, gics, x, n, j->gi->dtype);
    }
}

static void bwd_range(void *arg, int64_t lo, int64_t hi)
{
    const bwd_job *j = arg;
    for (int64_t k = lo; k < hi; k++) {
        double *pw = j->pw + k * j->d, *pb = j->pb ? j->pb + k * j->d : NULL;
        int64_t r0 = j->rows / j->nchunk * k + (k < j->rows % j->nchunk ? k : j->rows % j->nchunk);
        int64_t r1 = r0 + j->rows / j->nchunk + (k < j->rows % j->nchunk ? 1 : 0);
        for (int64_t r = r0; r < r1; r++)
            bwd_row(j, r, pw, pb);
    }
}

/* dst[c] = sum over the chunks k, in order, of p[k * d + c] (zero without chunks), rounded to dst's
 * dtype. */
static void store_sums(const tk_tensor *dst, const double *p, int64_t nchunk, int64_t d)
{
    float v[BLK];
    void *db = tk_ops__base(dst);
    int64_t cs = tk_ops__col_stride(dst);
    for (int64_t c0 = 0; c0 < d; c0 += BLK) {
        int64_t n = d - c0 < BLK ? d - c0 : BLK;
        for (int64_t i = 0; i < n; i++) {
            double s = 0;
            for (int64_t k = 0; k < nchunk; k++)
                s += p[k * d + c0 + i];
            v[i] = (float)s;
        }
        tk_ops__store_f32(db, c0 * cs, cs, v, n, dst->dtype);
    }
}

static int cpu_bwd(const tk_op_call *c)
{
    const norm_info *ni = c->op->data;
    bwd_job j = {ni->layer,
                 (double)(float)c->f[ni->eps],
                 c->t[ni->gi],
                 c->t[ni->go],
                 ni->gr >= 0 ? c->t[ni->gr] : NULL,
                 c->t[ni->x],
                 c->t[ni->w],
                 0,
                 0,
                 0,
                 NULL,
                 NULL};
    const tk_tensor *gw = c->t[ni->gw], *gb = ni->gb >= 0 ? c->t[ni->gb] : NULL;
    j.d = j.x->shape[j.x->ndim - 1];
    if (j.d == 0)
        return TK_OK;
    j.rows = tk_ops__numel(j.x) / j.d;
    j.nchunk = j.rows < BWD_CHUNKS ? j.rows : BWD_CHUNKS;
    if (j.nchunk > 0) {
        size_t n = (size_t)j.nchunk * (size_t)j.d;
        j.pw = calloc(n, sizeof *j.pw);
        j.pb = gb ? calloc(n, sizeof *j.pb) : NULL;
        if (!j.pw || (gb && !j.pb)) {
            free(j.pw);
            free(j.pb);
            return tk__err(TK_ERR_NOMEM, "%s: out of memory for %lld x %lld partial sums", c->op->name,
                           (long long)j.nchunk, (long long)j.d);
        }
        tk_ops__parallel(j.nchunk, (j.rows / j.nchunk) * j.d * (j.gr ? 48 : 40), bwd_range, &j);
    }
    /* no rows: the sums over rows are zero */
    store_sums(gw, j.pw, j.nchunk, j.d);
    if (gb)
        store_sums(gb, j.pb, j.nchunk, j.d);
    free(j.pw);
    free(j.pb);
    return TK_OK;
}

/* ---- the table -------------------------------------------------------------------------------- */

#define TENSOR(nm, rl, like, shp, dc)                                                                                  \
    {.name = nm,                                                                                                       \
     .kind = TK_ARG_TENSOR,                                                                                            \
     .role = rl,                                                                                                       \
     .dtypes = TK_OPS_FLOATS,                                                                                          \
     .dtype_like = like,                                                                                               \
     .min_rank = 1,                                                                                                    \
     .max_rank = -1,                                                                                                   \
     .shape = shp,                                                                                                     \
     .doc = dc}
#define VECTOR(nm, rl, like, opt, f32, dc)                                                                             \
    {.name = nm,                                                                                                       \
     .kind = TK_ARG_TENSOR,                                                                                            \
     .role = rl,                                                                                                       \
     .dtypes = TK_OPS_FLOATS,                                                                                          \
     .dtype_like = like,                                                                                               \
     .or_f32 = f32,                                                                                                    \
     .min_rank = 1,                                                                                                    \
     .max_rank = 1,                                                                                                    \
     .shape = "[d]",                                                                                                   \
     .optional = opt,                                                                                                  \
     .doc = dc}
#define WEIGHT(like) VECTOR("weight", TK_OPS_IN, like, 0, 0, "the per-column gain")
/* the RMS forwards: an f32 weight with 16-bit x, as Gemma's norms multiply by (1 + w) in f32 */
#define RMS_WEIGHT(like) VECTOR("weight", TK_OPS_IN, like, 0, 1, "the per-column gain (f32, or the dtype of x)")
#define BIAS(like) VECTOR("bias", TK_OPS_IN, like, 1, 0, "the per-column shift (optional)")
#define EPS(dflt, what)                                                                                                \
    {.name = "eps",                                                                                                    \
     .kind = TK_ARG_F64,                                                                                               \
     .optional = 1,                                                                                                    \
     .def = dflt,                                                                                                      \
     .dtype_like = -1,                                                                                                 \
     .doc = "added to " what " before the rsqrt (rounded to f32)"}
#define RMS_EPS EPS(1e-6, "mean(x^2)")
#define LN_EPS EPS(1e-5, "var(x)")

static const tk_op_param rms_params[] = {
    TENSOR("out", TK_OPS_OUT, 1, "[..., d]", "the result (may be 'input' itself)"),
    TENSOR("input", TK_OPS_IN, -1, "[..., d]", "x, normalised over its last dimension"),
    RMS_WEIGHT(1),
    RMS_EPS,
};
static const tk_op_param fused_rms_params[] = {
    TENSOR("input", TK_OPS_OUT, -1, "[..., d]", "x; on return rms_norm(x + residual) * weight"),
    TENSOR("residual", TK_OPS_OUT, 0, "[..., d]", "the residual stream; on return x + residual"),
    RMS_WEIGHT(0),
    RMS_EPS,
};
#define SUMSQ(nm, rl, dc)                                                                                              \
    {.name = nm,                                                                                                       \
     .kind = TK_ARG_TENSOR,                                                                                            \
     .role = rl,                                                                                                       \
     .dtypes = TK_OPS_F32,                                                                                             \
     .dtype_like = -1,                                                                                                 \
     .min_rank = 0,                                                                                                    \
     .max_rank = -1,                                                                                                   \
     .shape = "[...]",                                                                                                 \
     .doc = dc}
static const tk_op_param sumsq_params[] = {
    SUMSQ("out", TK_OPS_OUT, "each row's sum of squares (f32)"),
    TENSOR("input", TK_OPS_IN, -1, "[..., d]", "x, rows of its last dimension"),
};
static const tk_op_param by_sumsq_params[] = {
    TENSOR("out", TK_OPS_OUT, 1, "[..., d]", "the result (may be 'input' itself)"),
    TENSOR("input", TK_OPS_IN, -1, "[..., d]", "x: d columns of each row"),
    RMS_WEIGHT(1),
    SUMSQ("sumsq", TK_OPS_IN, "each whole row's sum of squares (f32; e.g. rms_norm_sumsq's, summed over ranks)"),
    TK_OPS_SCALAR("width", TK_ARG_I64, 0, "the whole row's columns, the mean's divisor (0: d)"),
    RMS_EPS,
};
static const tk_op_param ln_params[] = {
    TENSOR("out", TK_OPS_OUT, 1, "[..., d]", "the result (may be 'input' itself)"),
    TENSOR("input", TK_OPS_IN, -1, "[..., d]", "x, normalised over its last dimension"),
    WEIGHT(1),
    BIAS(1),
    LN_EPS,
};
static const tk_op_param fused_ln_params[] = {
    TENSOR("input", TK_OPS_OUT, -1, "[..., d]", "x; on return layer_norm(x + residual) * weight + bias"),
    TENSOR("residual", TK_OPS_OUT, 0, "[..., d]", "the residual stream; on return x + residual"),
    WEIGHT(0),
    BIAS(0),
    LN_EPS,
};

#define GRAD_INPUT(like, dc) TENSOR("grad_input", TK_OPS_OUT, like, "[..., d]", dc)
#define GRAD_WEIGHT(like) VECTOR("grad_weight", TK_OPS_OUT, like, 0, 0, "sum over rows of grad_out * xh")
#define GRAD_BIAS(like) VECTOR("grad_bias", TK_OPS_OUT, like, 1, 0, "sum over rows of grad_out (optional)")
#define GRAD_OUT(like) TENSOR("grad_out", TK_OPS_IN, like, "[..., d]", "the gradient of the forward's result")
#define GRAD_RESIDUAL(like)                                                                                            \
    TENSOR("grad_residual", TK_OPS_IN, like, "[..., d]", "the gradient of the forward's updated residual")
#define SAVED_INPUT TENSOR("input", TK_OPS_IN, -1, "[..., d]", "the forward's input x")
#define SAVED_RESIDUAL                                                                                                 \
    TENSOR("residual", TK_OPS_IN, -1, "[..., d]", "the forward's updated residual (input + residual)")

static const tk_op_param rms_bwd_params[] = {
    GRAD_INPUT(3, "the gradient of input"), GRAD_WEIGHT(3), GRAD_OUT(3), SAVED_INPUT, WEIGHT(3), RMS_EPS,
};
static const tk_op_param fused_rms_bwd_params[] = {
    GRAD_INPUT(4, "the gradient of the forward's input and residual (may be 'grad_residual' itself)"),
    GRAD_WEIGHT(4),
    GRAD_OUT(4),
    GRAD_RESIDUAL(4),
    SAVED_RESIDUAL,
    WEIGHT(4),
    RMS_EPS,
};
static const tk_op_param ln_bwd_params[] = {
    GRAD_INPUT(4, "the gradient of input"), GRAD_WEIGHT(4), GRAD_BIAS(4), GRAD_OUT(4), SAVED_INPUT, WEIGHT(4), LN_EPS,
};
static const tk_op_param fused_ln_bwd_params[] = {
    GRAD_INPUT(5, "the gradient of the forward's input and residual (may be 'grad_residual' itself)"),
    GRAD_WEIGHT(5),
    GRAD_BIAS(5),
    GRAD_OUT(5),
    GRAD_RESIDUAL(5),
    SAVED_RESIDUAL,
    WEIGHT(5),
    LN_EPS,
};

/*                                         layer fused bwd out  x  w   b  eps  gi  gw  gb  go  gr  ss */
static const norm_info rms_info = {0, 0, 0, 0, 1, 2, -1, 3, -1, -1, -1, -1, -1, -1};
static const norm_info fused_rms_info = {0, 1, 0, 0, 1, 2, -1, 3, -1, -1, -1, -1, -1, -1};
static const norm_info ln_info = {1, 0, 0, 0, 1, 2, 3, 4, -1, -1, -1, -1, -1, -1};
static const norm_info fused_ln_info = {1, 1, 0, 0, 1, 2, 3, 4, -1, -1, -1, -1, -1, -1};
static const norm_info rms_bwd_info = {0, 0, 1, -1, 3, 4, -1, 5, 0, 1, -1, 2, -1, -1};
static const norm_info fused_rms_bwd_info = {0, 1, 1, -1, 4, 5, -1, 6, 0, 1, -1, 2, 3, -1};
static const norm_info ln_bwd_info = {1, 0, 1, -1, 4, 5, -1, 6, 0, 1, 2, 3, -1, -1};
static const norm_info fused_ln_bwd_info = {1, 1, 1, -1, 5, 6, -1, 7, 0, 1, 2, 3, 4, -1};
static const norm_info by_sumsq_info = {0, 0, 0, 0, 1, 2, -1, 5, -1, -1, -1, -1, -1, 3};

#define PKG "kernels-community/rmsnorm"
#define N(p) (sizeof p / sizeof p[0])

const tk_op_desc tk_ops__norm[] = {
    {"rms_norm", "norm", "out = x * rsqrt(mean(x^2, -1) + eps) * weight", rms_params, N(rms_params), check_norm,
     cpu_fwd, &rms_info, PKG},
    {"fused_add_rms_norm", "norm",
     "residual = input + residual; input = rms_norm(residual) * weight  (in place, vLLM's)", fused_rms_params,
     N(fused_rms_params), check_norm, cpu_fwd, &fused_rms_info, PKG},
    {"layer_norm", "norm",
     "out = (x - mean(x, -1)) * rsqrt(var(x, -1) + eps) * weight + bias  (biased var; bias optional)", ln_params,
     N(ln_params), check_norm, cpu_fwd, &ln_info, PKG},
    {"fused_add_layer_norm", "norm",
     "residual = input + residual; input = layer_norm(residual) * weight + bias  (in place; bias optional)",
     fused_ln_params, N(fused_ln_params), check_norm, cpu_fwd, &fused_ln_info, PKG},
    {"rms_norm_sumsq", "norm", "out = sum(x^2, -1): a row's part of rms_norm's sum of squares (f32)", sumsq_params,
     N(sumsq_params), check_sumsq, cpu_sumsq, NULL, PKG},
    {"rms_norm_by_sumsq", "norm",
     "out = x * rsqrt(sumsq / width + eps) * weight: rms_norm of a row's d columns, the whole row's sum of squares "
     "given",
     by_sumsq_params, N(by_sumsq_params), check_norm, cpu_fwd, &by_sumsq_info, PKG},
    {"rms_norm_backward", "norm",
     "xh = x * rstd, gw = grad_out * weight: grad_input = rstd * (gw - xh * mean(gw * xh, -1)); "
     "grad_weight = sum over rows of grad_out * xh",
     rms_bwd_params, N(rms_bwd_params), check_norm, cpu_bwd, &rms_bwd_info, PKG},
    {"fused_add_rms_norm_backward", "norm",
     "residual = the forward's updated residual; grad_input = grad_residual + rms_norm_backward's grad_input "
     "(the gradient of both the forward's input and residual); grad_weight as rms_norm_backward",
     fused_rms_bwd_params, N(fused_rms_bwd_params), check_norm, cpu_bwd, &fused_rms_bwd_info, PKG},
    {"layer_norm_backward", "norm",
     "xh = (x - mean) * rstd, gw = grad_out * weight: grad_input = rstd * (gw - mean(gw, -1) - xh * mean(gw * "
     "xh, -1)); grad_weight = sum over rows of grad_out * xh; grad_bias = sum over rows of grad_out (optional)",
     ln_bwd_params, N(ln_bwd_params), check_norm, cpu_bwd, &ln_bwd_info, PKG},
    {"fused_add_layer_norm_backward", "norm",
     "residual = the forward's updated residual; grad_input = grad_residual + layer_norm_backward's grad_input "
     "(the gradient of both the forward's input and residual); grad_weight, grad_bias as layer_norm_backward",
     fused_ln_bwd_params, N(fused_ln_bwd_params), check_norm, cpu_bwd, &fused_ln_bwd_info, PKG},
};
const size_t tk_ops__norm_count = sizeof tk_ops__norm / sizeof tk_ops__norm[0];
