/*
 * loss.c — the loss ops (the ops of kernels-community/cross-entropy): signatures, shape checks and CPU
 * references.
 *
 *   cross_entropy               logits [N, V], target [N] i64 -> loss, and (optionally) the gradient
 *                               w.r.t. the logits (into 'grad', which may be 'logits' itself) and lse
 *   fused_linear_cross_entropy  hidden [N, H] x weight [V, H]^T (+ bias) -> cross_entropy, chunked over
 *                               tokens so the [N, V] logits are never held whole; grad_hidden (written),
 *                               grad_weight and grad_bias (f32, ACCUMULATED into, as PyTorch's .grad:
 *                               the GPU kernel adds them with atomics) optional
 *   max_margin_loss             hinge ranking: mean over pairs of max(0, margin - pos[i] + neg[i, k])
 *   infonce                     cross-entropy over S = normalize(a) normalize(b)^T / temperature with
 *                               the diagonal as targets (CLIP's symmetric form optional)
 *
 * Shared conventions. reduction: 0 = none (loss [N], or neg's shape for max_margin_loss), 1 = mean
 * (default), 2 = sum (loss [] or [1]). The loss is f32 whatever the input dtype. Gradients are those of
 * the reduced loss (of sum(loss) for reduction none).
 *
 * Cross-entropy numerics (PyTorch's definition, label smoothing eps over V classes):
 *     loss_i = (1 - eps) * (lse_i - x_t) + eps/V * sum_j (lse_i - x_j)
 *     dloss/dx_j = scale * (softmax_j - eps/V - (1 - eps) [j == t])
 * computed from one online pass per row that keeps m (running max), d = sum exp(x - m), and
 * s = sum (m - x) (every term >= 0), so loss = log d + (1 - eps)(m - x_t) + eps s / V has no
 * cancellation even for huge logits. The reference keeps this state in double, computes the gradient in
 * double and rounds once to T. Rows whose target is ignore_index have loss 0 and a zero gradient and
 * are not read unless 'lse' is asked for. mean divides by the number of non-ignored rows; when every
 * row is ignored the loss is 0 and the gradient 0 (PyTorch returns NaN there). Special values: a -inf
 * logit has probability 0 (with eps > 0 it makes the loss +inf, as PyTorch); a -inf target logit gives
 * loss +inf; a row that is all -inf, or holds NaN or +inf, gives NaN loss, lse and gradient. A target
 * outside [0, V) that is not ignore_index is an error here ("'target'[i] is ...").
 *
 * Reductions over rows are summed in row order in double, so results do not depend on the threads.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"

enum { RED_NONE = 0, RED_MEAN = 1, RED_SUM = 2 };

static const char *red_name(int64_t r) { return r == RED_NONE ? "none" : r == RED_MEAN ? "mean" : "sum"; }

/* ---- shared shape checks ---------------------------------------------------------------------- */

static int check_reduction(const tk_op_call *c, int ir)
{
    int64_t r = c->i[ir];
    if (r < RED_NONE || r > RED_SUM)
        return tk__err(TK_ERR_INVALID, "%s: 'reduction' is %lld, want 0 (none), 1 (mean) or 2 (sum)", c->op->name,
                       (long long)r);
    return TK_OK;
}

/* 'loss' (param il) must have shape `none_shape` (of `none_ndim` dims) for reduction none, else [] or
 * [1]. `none_what` says where the shape comes from. */
static int check_loss(const tk_op_call *c, int il, int ir, int32_t none_ndim, const int64_t *none_shape,
                      const char *none_what)
{
    const tk_tensor *l = c->t[il];
    if (c->i[ir] == RED_NONE) {
        int ok = l->ndim == none_ndim;
        for (int32_t k = 0; ok && k < none_ndim; k++)
            ok = l->shape[k] == none_shape[k];
        if (!ok)
            return tk__err(TK_ERR_INVALID, "%s: 'loss' has shape %s, want %s (%s, reduction none)", c->op->name,
                           tk_ops__shape_fmt(l->ndim, l->shape), tk_ops__shape_fmt(none_ndim, none_shape), none_what);
    } else if (!(l->ndim == 0 || (l->ndim == 1 && l->shape[0] == 1))) {
        return tk__err(TK_ERR_INVALID, "%s: 'loss' has shape %s, want [] or [1] (reduction %s)", c->op->name,
                       tk_ops__shape_fmt(l->ndim, l->shape), red_name(c->i[ir]));
    }
    return TK_OK;
}

/* An optional tensor (param i) that must have the shape of the tensor at param like, when given. */
static int check_like(const tk_op_call *c, int i, int like)
{
    const tk_tensor *t = c->t[i], *l = c->t[like];
    if (t && !tk_ops__same_shape(t, l))
        return tk__err(TK_ERR_INVALID, "%s: '%s' has shape %s, want %s (the shape of '%s')", c->op->name,
                       c->op->params[i].name, tk_ops__shape_fmt(t->ndim, t->shape),
                       tk_ops__shape_fmt(l->ndim, l->shape), c->op->params[like].name);
    return TK_OK;
}

/* An optional tensor (param i) that must be [n] when given; `what` names n. */
static int check_vec(const tk_op_call *c, int i, int64_t n, const char *what)
{
    const tk_tensor *t = c->t[i];
    if (t && (t->ndim != 1 || t->shape[0] != n))
        return tk__err(TK_ERR_INVALID, "%s: '%s' has shape %s, want [%lld] (%s)", c->op->name, c->op->params[i].name,
                       tk_ops__shape_fmt(t->ndim, t->shape), (long long)n, what);
    return TK_OK;
}

/* The byte range [lo, hi) a tensor's elements span (lo == hi when it is empty). */
static void byte_span(const tk_tensor *t, uintptr_t *lo, uintptr_t *hi)
{
    uintptr_t base = (uintptr_t)tk_ops__base(t);
    int64_t mn = 0, mx = 0, s = 1;
    for (int32_t k = t->ndim - 1; k >= 0; k--) {
        int64_t st = t->strides ? t->strides[k] : s;
        if (t->shape[k] == 0) {
            *lo = *hi = base;
            return;
        }
        if (st < 0)
            mn += st * (t->shape[k] - 1);
        else
            mx += st * (t->shape[k] - 1);
        s *= t->shape[k];
    }
    int64_t es = (int64_t)tk_ops__dtype_size(t->dtype);
    *lo = base + (uintptr_t)(mn * es);
    *hi = base + (uintptr_t)((mx + 1) * es);
}

/* 1 when a and b are the same view: same first element, shape, dtype and (effective) strides. */
static int same_view(const tk_tensor *a, const tk_tensor *b)
{
    if (tk_ops__base(a) != tk_ops__base(b) || !tk_ops__same_shape(a, b) ||
        tk_ops__dtype_bit(a->dtype) != tk_ops__dtype_bit(b->dtype))
        return 0;
    int64_t sa = 1, sb = 1;
    for (int32_t k = a->ndim - 1; k >= 0; k--) {
        int64_t x = a->strides ? a->strides[k] : sa, y = b->strides ? b->strides[k] : sb;
        if (a->shape[k] != 1 && x != y)
            return 0;
        sa *= a->shape[k];
        sb *= b->shape[k];
    }
    return 1;
}

/* Output param io must not overlap input param ii, unless it is exactly the same view and `inplace_ok`. */
static int check_overlap(const tk_op_call *c, int io, int ii, int inplace_ok)
{
    const tk_tensor *o = c->t[io], *in = c->t[ii];
    if (!o || !in)
        return TK_OK;
    if (inplace_ok && same_view(o, in))
        return TK_OK;
    uintptr_t a0, a1, b0, b1;
    byte_span(o, &a0, &a1);
    byte_span(in, &b0, &b1);
    if (a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1)
        return tk__err(TK_ERR_INVALID, "%s: '%s' overlaps '%s'%s", c->op->name, c->op->params[io].name,
                       c->op->params[ii].name,
                       inplace_ok ? "; it may be exactly the same tensor (in place) or apart, not partly overlapping"
                                  : "; they must not share memory");
    return TK_OK;
}

static int check_label_smoothing(const tk_op_call *c, int ie)
{
    double e = c->f[ie];
    if (!(e >= 0.0 && e <= 1.0))
        return tk__err(TK_ERR_INVALID, "%s: 'label_smoothing' is %g, want a value in [0, 1]", c->op->name, e);
    return TK_OK;
}

/* Checks target values on the host: each in [0, V) or ignore_index. Counts the non-ignored ones. */
static int scan_targets(const tk_op_call *c, int it, int64_t v, int64_t ignore, int64_t *n_valid)
{
    const tk_tensor *t = c->t[it];
    const int64_t *tb = tk_ops__base(t);
    int64_t n = t->shape[0], cs = tk_ops__col_stride(t), cnt = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t y = tb[i * cs];
        if (y == ignore)
            continue;
        if (y < 0 || y >= v)
            return tk__err(TK_ERR_INVALID, "%s: 'target'[%lld] is %lld, want 0 to %lld or ignore_index (%lld)",
                           c->op->name, (long long)i, (long long)y, (long long)(v - 1), (long long)ignore);
        cnt++;
    }
    *n_valid = cnt;
    return TK_OK;
}

/* ---- the cross-entropy row (shared by cross_entropy and fused_linear_cross_entropy) ------------- */

#define BLK 1024 /* elements per step: the scratch rows live on the stack */

/* Online state of a row: max m, d = sum exp(x - m), s = sum (m - x), n elements. */
typedef struct {
    double m, d, s;
    int64_t n;
} lse_state;

/* The larger of a and b, NaN when either is NaN (so a NaN logit reaches d and the loss). */
static double max_nan(double a, double b)
{
    if (a != a)
        return a;
    if (b != b)
        return b;
    return b > a ? b : a;
}

/* Folds the state of one block of values into st. A -inf value has probability 0 and adds +inf to s
 * (it is infinitely far below the max); a NaN makes m, and with it d, s and the loss, NaN. */
static void lse_fold(lse_state *st, const float *x, int64_t n)
{
    double bm = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        bm = max_nan(bm, x[i]);
    double bd = 0, bs = 0;
    if (bm > -INFINITY || bm != bm) {
        for (int64_t i = 0; i < n; i++) {
            bd += exp((double)x[i] - bm);
            bs += bm - (double)x[i];
        }
    }
    double m = max_nan(st->m, bm);
    if (m == -INFINITY) { /* all -inf so far: d and s stay 0 */
        st->n += n;
        return;
    }
    /* exp(-inf - m) = 0 drops a part that was all -inf; n * (m - (-inf)) = +inf adds its s. The
     * counts guard 0 * inf. */
    st->d = st->d * exp(st->m - m) + bd * exp(bm - m);
    st->s = st->s + bs + (st->n ? (double)st->n * (m - st->m) : 0.0) + (double)n * (m - bm);
    st->m = m;
    st->n += n;
}

/* A row of logits (V values of dtype dt at element offset `off`, `cs` apart, from base) and where its
 * gradient goes (gbase NULL: no gradient). */
typedef struct {
    const void *base;
    int64_t off, cs;
    tk_dtype dt;
    void *gbase;
    int64_t goff, gcs;
    tk_dtype gdt;
} ce_row;

/* One row: the loss (0 when ignored), the lse (always computed when lse != NULL or the row is not
 * ignored) and the gradient times gscale. target < 0 means ignored. */
static void ce_one_row(const ce_row *r, int64_t v, int64_t target, double eps, double gscale, double *loss, double *lse)
{
    float x[BLK];
    *loss = 0.0;
    if (target < 0 && !lse) {
        if (r->gbase) {
            memset(x, 0, sizeof x);
            for (int64_t c0 = 0; c0 < v; c0 += BLK)
                tk_ops__store_f32(r->gbase, r->goff + c0 * r->gcs, r->gcs, x, v - c0 < BLK ? v - c0 : BLK, r->gdt);
        }
        return;
    }
    lse_state st = {-INFINITY, 0.0, 0.0, 0};
    double xt = NAN;
    for (int64_t c0 = 0; c0 < v; c0 += BLK) {
        int64_t n = v - c0 < BLK ? v - c0 : BLK;
        tk_ops__load_f32(x, r->base, r->off + c0 * r->cs, r->cs, n, r->dt);
        if (target >= c0 && target < c0 + n)
            xt = x[target - c0];
        lse_fold(&st, x, n);
    }
    double logd = log(st.d);
    if (lse)
        *lse = st.m + logd;
    if (target >= 0 && st.m == -INFINITY) {
        *loss = NAN; /* no class has any probability */
    } else if (target >= 0) {
        double l = logd;
        if (eps < 1) /* (the guards keep 0 * inf out: a term with weight 0 is absent) */
            l += (1.0 - eps) * (st.m - xt);
        if (eps > 0)
            l += eps * st.s / (double)v;
        *loss = l;
    }
    if (!r->gbase)
        return;
    double inv_d = 1.0 / st.d, smooth = eps / (double)v;
    for (int64_t c0 = 0; c0 < v; c0 += BLK) {
        int64_t n = v - c0 < BLK ? v - c0 : BLK;
        if (target < 0) {
            memset(x, 0, sizeof x);
        } else {
            tk_ops__load_f32(x, r->base, r->off + c0 * r->cs, r->cs, n, r->dt);
            for (int64_t i = 0; i < n; i++) {
                double p = exp((double)x[i] - st.m) * inv_d;
                double g = p - smooth - (c0 + i == target ? 1.0 - eps : 0.0);
                x[i] = (float)(gscale * g);
            }
        }
        tk_ops__store_f32(r->gbase, r->goff + c0 * r->gcs, r->gcs, x, n, r->gdt);
    }
}

/* ---- cross_entropy ------------------------------------------------------------------------------ */

enum { CE_LOGITS, CE_TARGET, CE_LOSS, CE_GRAD, CE_LSE, CE_IGNORE, CE_SMOOTH, CE_RED };

static int check_ce(const tk_op_call *c)
{
    const tk_tensor *x = c->t[CE_LOGITS], *t = c->t[CE_TARGET];
    int64_t n = x->shape[0], v = x->shape[1];
    int rc;
    if (t->shape[0] != n)
        return tk__err(TK_ERR_INVALID, "%s: 'target' has shape %s, want [%lld] (the rows of 'logits' %s)", c->op->name,
                       tk_ops__shape_fmt(t->ndim, t->shape), (long long)n, tk_ops__shape_fmt(x->ndim, x->shape));
    if (v == 0 && n > 0)
        return tk__err(TK_ERR_INVALID, "%s: 'logits' has shape %s, want at least one class", c->op->name,
                       tk_ops__shape_fmt(x->ndim, x->shape));
    if ((rc = check_reduction(c, CE_RED)) != TK_OK || (rc = check_label_smoothing(c, CE_SMOOTH)) != TK_OK ||
        (rc = check_loss(c, CE_LOSS, CE_RED, 1, &n, "the rows of 'logits'")) != TK_OK ||
        (rc = check_like(c, CE_GRAD, CE_LOGITS)) != TK_OK ||
        (rc = check_vec(c, CE_LSE, n, "the rows of 'logits'")) != TK_OK ||
        (rc = check_overlap(c, CE_GRAD, CE_LOGITS, 1)) != TK_OK ||
        (rc = check_overlap(c, CE_LOSS, CE_LOGITS, 0)) != TK_OK ||
        (rc = check_overlap(c, CE_LSE, CE_LOGITS, 0)) != TK_OK)
        return rc;
    if (c->t[CE_GRAD] && (rc = check_overlap(c, CE_LOSS, CE_GRAD, 0)) != TK_OK)
        return rc;
    return TK_OK;
}

typedef struct {
    const tk_tensor *x, *t, *grad, *lse;
    int64_t v, ignore;
    double eps, gscale;
    double *loss; /* [N] per-row losses */
} ce_job;

static void ce_range(void *arg, int64_t lo, int64_t hi)
{
    const ce_job *j = arg;
    const int64_t *tb = tk_ops__base(j->t);
    int64_t tcs = tk_ops__col_stride(j->t);
    float one;
    for (int64_t i = lo; i < hi; i++) {
        ce_row r = {tk_ops__base(j->x), tk_ops__row_offset(j->x, i), tk_ops__col_stride(j->x), j->x->dtype, NULL, 0, 1,
                    j->x->dtype};
        if (j->grad) {
            r.gbase = tk_ops__base(j->grad);
            r.goff = tk_ops__row_offset(j->grad, i);
            r.gcs = tk_ops__col_stride(j->grad);
            r.gdt = j->grad->dtype;
        }
        int64_t y = tb[i * tcs];
        double lse = 0;
        ce_one_row(&r, j->v, y == j->ignore ? -1 : y, j->eps, j->gscale, &j->loss[i], j->lse ? &lse : NULL);
        if (j->lse) {
            one = (float)lse;
            tk_ops__store_f32(tk_ops__base(j->lse), i * tk_ops__col_stride(j->lse), 1, &one, 1, j->lse->dtype);
        }
    }
}

/* Writes per-row losses (reduction none) or their sum / mean (n_valid rows) into 'loss'. */
static void store_loss(const tk_tensor *out, const double *rows, int64_t n, int64_t red, int64_t n_valid)
{
    void *b = tk_ops__base(out);
    if (red == RED_NONE) {
        int64_t cs = tk_ops__col_stride(out);
        for (int64_t i = 0; i < n; i++) {
            float f = (float)rows[i];
            tk_ops__store_f32(b, i * cs, 1, &f, 1, out->dtype);
        }
        return;
    }
    double sum = 0;
    for (int64_t i = 0; i < n; i++)
        sum += rows[i];
    if (red == RED_MEAN)
        sum = n_valid ? sum / (double)n_valid : 0.0;
    float f = (float)sum;
    tk_ops__store_f32(b, 0, 1, &f, 1, out->dtype);
}

static int cpu_ce(const tk_op_call *c)
{
    const tk_tensor *x = c->t[CE_LOGITS];
    int64_t n = x->shape[0], v = x->shape[1], n_valid = 0, red = c->i[CE_RED];
    int rc = scan_targets(c, CE_TARGET, v, c->i[CE_IGNORE], &n_valid);
    if (rc != TK_OK)
        return rc;
    double *rows = calloc((size_t)(n ? n : 1), sizeof *rows);
    if (!rows)
        return tk__err(TK_ERR_NOMEM, "%s: out of memory for %lld row losses", c->op->name, (long long)n);
    ce_job j = {x,   c->t[CE_TARGET], c->t[CE_GRAD],   c->t[CE_LSE],
                v,   c->i[CE_IGNORE], c->f[CE_SMOOTH], red == RED_MEAN ? (n_valid ? 1.0 / (double)n_valid : 0.0) : 1.0,
                rows};
    tk_ops__parallel(n, v * (j.grad ? 40 : 20), ce_range, &j);
    store_loss(c->t[CE_LOSS], rows, n, red, n_valid);
    free(rows);
    return TK_OK;
}

/* ---- fused_linear_cross_entropy ----------------------------------------------------------------- */

enum {
    FL_HIDDEN,
    FL_WEIGHT,
    FL_TARGET,
    FL_LOSS,
    FL_BIAS,
    FL_GHIDDEN,
    FL_GWEIGHT,
    FL_GBIAS,
    FL_LSE,
    FL_IGNORE,
    FL_SMOOTH,
    FL_RED,
    FL_CHUNK
};

static int check_fl(const tk_op_call *c)
{
    const tk_tensor *h = c->t[FL_HIDDEN], *w = c->t[FL_WEIGHT], *t = c->t[FL_TARGET];
    int64_t n = h->shape[0], hd = h->shape[1], v = w->shape[0];
    int rc;
    if (w->shape[1] != hd)
        return tk__err(TK_ERR_INVALID, "%s: 'weight' has shape %s, want [V, %lld] (the columns of 'hidden' %s)",
                       c->op->name, tk_ops__shape_fmt(w->ndim, w->shape), (long long)hd,
                       tk_ops__shape_fmt(h->ndim, h->shape));
    if (t->shape[0] != n)
        return tk__err(TK_ERR_INVALID, "%s: 'target' has shape %s, want [%lld] (the rows of 'hidden' %s)", c->op->name,
                       tk_ops__shape_fmt(t->ndim, t->shape), (long long)n, tk_ops__shape_fmt(h->ndim, h->shape));
    if (v == 0 && n > 0)
        return tk__err(TK_ERR_INVALID, "%s: 'weight' has shape %s, want at least one class (row)", c->op->name,
                       tk_ops__shape_fmt(w->ndim, w->shape));
    if (c->t[FL_GBIAS] && !c->t[FL_BIAS])
        return tk__err(TK_ERR_INVALID, "%s: 'grad_bias' is given but 'bias' is not", c->op->name);
    if (c->i[FL_CHUNK] < 0)
        return tk__err(TK_ERR_INVALID, "%s: 'chunk_size' is %lld, want >= 0 (0: automatic)", c->op->name,
                       (long long)c->i[FL_CHUNK]);
    if ((rc = check_reduction(c, FL_RED)) != TK_OK || (rc = check_label_smoothing(c, FL_SMOOTH)) != TK_OK ||
        (rc = check_loss(c, FL_LOSS, FL_RED, 1, &n, "the rows of 'hidden'")) != TK_OK ||
        (rc = check_vec(c, FL_BIAS, v, "the rows of 'weight'")) != TK_OK ||
        (rc = check_like(c, FL_GHIDDEN, FL_HIDDEN)) != TK_OK || (rc = check_like(c, FL_GWEIGHT, FL_WEIGHT)) != TK_OK ||
        (rc = check_vec(c, FL_GBIAS, v, "the rows of 'weight'")) != TK_OK ||
        (rc = check_vec(c, FL_LSE, n, "the rows of 'hidden'")) != TK_OK)
        return rc;
    static const int outs[] = {FL_LOSS, FL_GHIDDEN, FL_GWEIGHT, FL_GBIAS, FL_LSE};
    static const int ins[] = {FL_HIDDEN, FL_WEIGHT, FL_BIAS, FL_TARGET};
    for (size_t a = 0; a < sizeof outs / sizeof outs[0]; a++) {
        for (size_t b = 0; b < sizeof ins / sizeof ins[0]; b++)
            if ((rc = check_overlap(c, outs[a], ins[b], 0)) != TK_OK)
                return rc;
        for (size_t b = 0; b < a; b++)
            if ((rc = check_overlap(c, outs[a], outs[b], 0)) != TK_OK)
                return rc;
    }
    return TK_OK;
}

/* Liger-Kernel's chunk rule: about as many logits per chunk as hidden has elements,
 * chunk = next_pow2(cdiv(N, cdiv(V, H))), within [1, N]. */
static int64_t fl_auto_chunk(int64_t n, int64_t hd, int64_t v)
{
    if (n <= 0)
        return 1;
    int64_t ratio = hd > 0 ? (v + hd - 1) / hd : v;
    if (ratio < 1)
        ratio = 1;
    int64_t want = (n + ratio - 1) / ratio, p = 1;
    while (p < want)
        p *= 2;
    return p < n ? p : n;
}

#define VB 16  /* weight rows converted to f32 per step */
#define KB 256 /* hidden columns per step */

typedef struct {
    const tk_tensor *w, *bias;
    int64_t v, hd, rows;   /* rows of this chunk */
    const float *h;        /* [rows, hd] the chunk's hidden, f32 */
    float *logits;         /* [rows, v] f32: logits, then the gradient (in place) */
    float *dh;             /* [rows, hd] f32 */
    const tk_tensor *gw, *gb;
    /* CE */
    const tk_tensor *t, *lse;
    int64_t r0, ignore;
    double eps, gscale;
    double *loss; /* [rows] */
    int grad;
} fl_job;

static float dotf(const float *a, const float *b, int64_t n)
{
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        for (int q = 0; q < 8; q++)
            s[q] += a[k + q] * b[k + q];
    float t = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; k < n; k++)
        t += a[k] * b[k];
    return t;
}

static void axpyf(float *y, float a, const float *x, int64_t n)
{
    for (int64_t k = 0; k < n; k++)
        y[k] += a * x[k];
}

/* Loads weight[v0 + r, k0 .. k0 + kn) for r < nv into buf[r * KB ..] as f32. */
static void load_w(float *buf, const tk_tensor *w, int64_t v0, int64_t nv, int64_t k0, int64_t kn)
{
    int64_t cs = tk_ops__col_stride(w);
    for (int64_t r = 0; r < nv; r++)
        tk_ops__load_f32(buf + r * KB, tk_ops__base(w), tk_ops__row_offset(w, v0 + r) + k0 * cs, cs, kn, w->dtype);
}

/* logits[c, v] = hidden[c] . weight[v] (+ bias[v]) for the chunk, over blocks of VB weight rows. */
static void fl_logits_range(void *arg, int64_t lo, int64_t hi)
{
    const fl_job *j = arg;
    float wb[VB * KB], bias[VB];
    for (int64_t b = lo; b < hi; b++) {
        int64_t v0 = b * VB, nv = j->v - v0 < VB ? j->v - v0 : VB;
        if (j->bias)
            tk_ops__load_f32(bias, tk_ops__base(j->bias), v0 * tk_ops__col_stride(j->bias), tk_ops__col_stride(j->bias),
                             nv, j->bias->dtype);
        else
            memset(bias, 0, sizeof bias);
        for (int64_t c = 0; c < j->rows; c++)
            for (int64_t r = 0; r < nv; r++)
                j->logits[c * j->v + v0 + r] = bias[r];
        for (int64_t k0 = 0; k0 < j->hd; k0 += KB) {
            int64_t kn = j->hd - k0 < KB ? j->hd - k0 : KB;
            load_w(wb, j->w, v0, nv, k0, kn);
            for (int64_t c = 0; c < j->rows; c++) {
                const float *hr = j->h + c * j->hd + k0;
                float *lr = j->logits + c * j->v + v0;
                for (int64_t r = 0; r < nv; r++)
                    lr[r] += dotf(hr, wb + r * KB, kn);
            }
        }
    }
}

/* Cross-entropy of the chunk's rows, the gradient in place over the f32 logits. */
static void fl_ce_range(void *arg, int64_t lo, int64_t hi)
{
    const fl_job *j = arg;
    const int64_t *tb = tk_ops__base(j->t);
    int64_t tcs = tk_ops__col_stride(j->t);
    const tk_dtype f32 = {TK_DL_FLOAT, 32, 1};
    for (int64_t c = lo; c < hi; c++) {
        ce_row r = {j->logits, c * j->v, 1, f32, j->grad ? j->logits : NULL, c * j->v, 1, f32};
        int64_t y = tb[(j->r0 + c) * tcs];
        double lse = 0;
        ce_one_row(&r, j->v, y == j->ignore ? -1 : y, j->eps, j->gscale, &j->loss[c], j->lse ? &lse : NULL);
        if (j->lse) {
            float one = (float)lse;
            tk_ops__store_f32(tk_ops__base(j->lse), (j->r0 + c) * tk_ops__col_stride(j->lse), 1, &one, 1,
                              j->lse->dtype);
        }
    }
}

/* dh[c, k] = sum_v grad[c, v] weight[v, k]; items are (32-row block, KB-column block) pairs. */
#define CB 32
static void fl_dh_range(void *arg, int64_t lo, int64_t hi)
{
    const fl_job *j = arg;
    float wb[VB * KB];
    int64_t nkb = (j->hd + KB - 1) / KB;
    for (int64_t it = lo; it < hi; it++) {
        int64_t c0 = (it / nkb) * CB, k0 = (it % nkb) * KB;
        int64_t nc = j->rows - c0 < CB ? j->rows - c0 : CB, kn = j->hd - k0 < KB ? j->hd - k0 : KB;
        for (int64_t c = 0; c < nc; c++)
            memset(j->dh + (c0 + c) * j->hd + k0, 0, sizeof(float) * (size_t)kn);
        for (int64_t v0 = 0; v0 < j->v; v0 += VB) {
            int64_t nv = j->v - v0 < VB ? j->v - v0 : VB;
            load_w(wb, j->w, v0, nv, k0, kn);
            for (int64_t c = 0; c < nc; c++) {
                const float *g = j->logits + (c0 + c) * j->v + v0;
                float *d = j->dh + (c0 + c) * j->hd + k0;
                for (int64_t r = 0; r < nv; r++)
                    if (g[r] != 0.0f)
                        axpyf(d, g[r], wb + r * KB, kn);
            }
        }
    }
}

/* grad_weight[v, :] += sum_c grad[c, v] hidden[c, :]; grad_bias[v] += sum_c grad[c, v] (both f32). */
static void fl_dw_range(void *arg, int64_t lo, int64_t hi)
{
    const fl_job *j = arg;
    for (int64_t v = lo; v < hi; v++) {
        if (j->gw) {
            float *row = (float *)tk_ops__base(j->gw) + tk_ops__row_offset(j->gw, v);
            int64_t cs = tk_ops__col_stride(j->gw);
            for (int64_t c = 0; c < j->rows; c++) {
                float g = j->logits[c * j->v + v];
                const float *hr = j->h + c * j->hd;
                if (g == 0.0f)
                    continue;
                if (cs == 1)
                    axpyf(row, g, hr, j->hd);
                else
                    for (int64_t k = 0; k < j->hd; k++)
                        row[k * cs] += g * hr[k];
            }
        }
        if (j->gb) {
            double s = 0;
            for (int64_t c = 0; c < j->rows; c++)
                s += j->logits[c * j->v + v];
            float *b = (float *)tk_ops__base(j->gb) + v * tk_ops__col_stride(j->gb);
            *b = (float)((double)*b + s);
        }
    }
}

static int cpu_fl(const tk_op_call *c)
{
    const tk_tensor *h = c->t[FL_HIDDEN], *w = c->t[FL_WEIGHT];
    int64_t n = h->shape[0], hd = h->shape[1], v = w->shape[0], n_valid = 0, red = c->i[FL_RED];
    int rc = scan_targets(c, FL_TARGET, v, c->i[FL_IGNORE], &n_valid);
    if (rc != TK_OK)
        return rc;
    int64_t chunk = c->i[FL_CHUNK] ? c->i[FL_CHUNK] : fl_auto_chunk(n, hd, v);
    if (chunk > n)
        chunk = n;
    if (n == 0) {
        store_loss(c->t[FL_LOSS], NULL, 0, red, 0);
        return TK_OK;
    }
    /* The only scratch: one chunk of f32 logits, the chunk's hidden in f32, its hidden gradient and
     * its row losses (tk_ops__fl_scratch_bytes below, which the memory benchmark reports). */
    int want_gh = c->t[FL_GHIDDEN] != NULL;
    int grad = want_gh || c->t[FL_GWEIGHT] || c->t[FL_GBIAS];
    size_t nl = (size_t)chunk * (size_t)v, nh = (size_t)chunk * (size_t)hd;
    float *logits = malloc(sizeof(float) * (nl ? nl : 1)), *hb = malloc(sizeof(float) * (nh ? nh : 1));
    float *dh = want_gh ? malloc(sizeof(float) * (nh ? nh : 1)) : NULL;
    double *rows = malloc(sizeof(double) * (size_t)chunk);
    double *all = red == RED_NONE ? malloc(sizeof(double) * (size_t)n) : NULL;
    if (!logits || !hb || (want_gh && !dh) || !rows || (red == RED_NONE && !all)) {
        rc = tk__err(TK_ERR_NOMEM, "%s: out of memory for a chunk of %lld rows x %lld logits", c->op->name,
                     (long long)chunk, (long long)v);
        goto done;
    }
    fl_job j = {w,
                c->t[FL_BIAS],
                v,
                hd,
                0,
                hb,
                logits,
                dh,
                c->t[FL_GWEIGHT],
                c->t[FL_GBIAS],
                c->t[FL_TARGET],
                c->t[FL_LSE],
                0,
                c->i[FL_IGNORE],
                c->f[FL_SMOOTH],
                red == RED_MEAN ? (n_valid ? 1.0 / (double)n_valid : 0.0) : 1.0,
                rows,
                grad};
    double total = 0;
    int64_t hcs = tk_ops__col_stride(h);
    for (int64_t r0 = 0; r0 < n; r0 += chunk) {
        int64_t rows_n = n - r0 < chunk ? n - r0 : chunk;
        j.rows = rows_n;
        j.r0 = r0;
        for (int64_t r = 0; r < rows_n; r++)
            tk_ops__load_f32(hb + r * hd, tk_ops__base(h), tk_ops__row_offset(h, r0 + r), hcs, hd, h->dtype);
        tk_ops__parallel((v + VB - 1) / VB, VB * rows_n * (hd + 1) * 2, fl_logits_range, &j);
        tk_ops__parallel(rows_n, v * (grad ? 40 : 20), fl_ce_range, &j);
        if (want_gh) {
            int64_t nkb = (hd + KB - 1) / KB, ncb = (rows_n + CB - 1) / CB;
            tk_ops__parallel(nkb * ncb, (int64_t)CB * KB * v * 2, fl_dh_range, &j);
            const tk_tensor *gh = c->t[FL_GHIDDEN];
            int64_t gcs = tk_ops__col_stride(gh);
            for (int64_t r = 0; r < rows_n; r++)
                tk_ops__store_f32(tk_ops__base(gh), tk_ops__row_offset(gh, r0 + r), gcs, dh + r * hd, hd, gh->dtype);
        }
        if (c->t[FL_GWEIGHT] || c->t[FL_GBIAS])
            tk_ops__parallel(v, rows_n * (hd + 1) * 2, fl_dw_range, &j);
        for (int64_t r = 0; r < rows_n; r++) {
            if (all)
                all[r0 + r] = rows[r];
            total += rows[r];
        }
    }
    if (all) {
        store_loss(c->t[FL_LOSS], all, n, red, n_valid);
    } else {
        double one = red == RED_MEAN ? (n_valid ? total / (double)n_valid : 0.0) : total;
        float f = (float)one;
        tk_ops__store_f32(tk_ops__base(c->t[FL_LOSS]), 0, 1, &f, 1, c->t[FL_LOSS]->dtype);
    }
done:
    free(logits);
    free(hb);
    free(dh);
    free(rows);
    free(all);
    return rc;
}

/* ---- max_margin_loss ---------------------------------------------------------------------------- */

enum { MM_POS, MM_NEG, MM_LOSS, MM_GPOS, MM_GNEG, MM_MARGIN, MM_RED };

static int check_mm(const tk_op_call *c)
{
    const tk_tensor *p = c->t[MM_POS], *ng = c->t[MM_NEG];
    int rc;
    if (ng->shape[0] != p->shape[0])
        return tk__err(TK_ERR_INVALID, "%s: 'neg' has shape %s, want [%lld] or [%lld, K] (the rows of 'pos' %s)",
                       c->op->name, tk_ops__shape_fmt(ng->ndim, ng->shape), (long long)p->shape[0],
                       (long long)p->shape[0], tk_ops__shape_fmt(p->ndim, p->shape));
    if (!isfinite(c->f[MM_MARGIN]))
        return tk__err(TK_ERR_INVALID, "%s: 'margin' is %g, want a finite value", c->op->name, c->f[MM_MARGIN]);
    if ((rc = check_reduction(c, MM_RED)) != TK_OK ||
        (rc = check_loss(c, MM_LOSS, MM_RED, ng->ndim, ng->shape, "the shape of 'neg'")) != TK_OK ||
        (rc = check_like(c, MM_GPOS, MM_POS)) != TK_OK || (rc = check_like(c, MM_GNEG, MM_NEG)) != TK_OK)
        return rc;
    static const int outs[] = {MM_LOSS, MM_GPOS, MM_GNEG};
    for (size_t a = 0; a < 3; a++) {
        if ((rc = check_overlap(c, outs[a], MM_POS, 0)) != TK_OK ||
            (rc = check_overlap(c, outs[a], MM_NEG, 0)) != TK_OK)
            return rc;
        for (size_t b = 0; b < a; b++)
            if ((rc = check_overlap(c, outs[a], outs[b], 0)) != TK_OK)
                return rc;
    }
    return TK_OK;
}

typedef struct {
    const tk_tensor *pos, *neg, *gpos, *gneg;
    int64_t k;
    double margin, scale;
    double *loss; /* [N, K] pair losses */
} mm_job;

static void mm_range(void *arg, int64_t lo, int64_t hi)
{
    const mm_job *j = arg;
    float nrow[BLK], grow[BLK], p;
    int64_t ncs = tk_ops__col_stride(j->neg), pcs = tk_ops__col_stride(j->pos);
    for (int64_t i = lo; i < hi; i++) {
        tk_ops__load_f32(&p, tk_ops__base(j->pos), i * pcs, 1, 1, j->pos->dtype);
        int64_t noff = j->neg->ndim == 2 ? tk_ops__row_offset(j->neg, i) : i * ncs;
        int64_t active = 0;
        for (int64_t c0 = 0; c0 < j->k; c0 += BLK) {
            int64_t n = j->k - c0 < BLK ? j->k - c0 : BLK;
            tk_ops__load_f32(nrow, tk_ops__base(j->neg), noff + c0 * ncs, ncs, n, j->neg->dtype);
            for (int64_t q = 0; q < n; q++) {
                double h = j->margin - (double)p + (double)nrow[q];
                j->loss[i * j->k + c0 + q] = h > 0 ? h : (h <= 0 ? 0.0 : h); /* NaN stays NaN */
                grow[q] = h > 0 ? (float)j->scale : 0.0f;
                active += h > 0;
            }
            if (j->gneg) {
                int64_t gcs = tk_ops__col_stride(j->gneg);
                int64_t goff = j->gneg->ndim == 2 ? tk_ops__row_offset(j->gneg, i) : i * gcs;
                tk_ops__store_f32(tk_ops__base(j->gneg), goff + c0 * gcs, gcs, grow, n, j->gneg->dtype);
            }
        }
        if (j->gpos) {
            float g = (float)(-(double)active * j->scale);
            tk_ops__store_f32(tk_ops__base(j->gpos), i * tk_ops__col_stride(j->gpos), 1, &g, 1, j->gpos->dtype);
        }
    }
}

static int cpu_mm(const tk_op_call *c)
{
    const tk_tensor *ng = c->t[MM_NEG];
    int64_t n = ng->shape[0], k = ng->ndim == 2 ? ng->shape[1] : 1, red = c->i[MM_RED];
    double *loss = malloc(sizeof(double) * (size_t)(n * k > 0 ? n * k : 1));
    if (!loss)
        return tk__err(TK_ERR_NOMEM, "%s: out of memory for %lld pair losses", c->op->name, (long long)(n * k));
    mm_job j = {c->t[MM_POS],
                ng,
                c->t[MM_GPOS],
                c->t[MM_GNEG],
                k,
                c->f[MM_MARGIN],
                red == RED_MEAN ? (n * k > 0 ? 1.0 / (double)(n * k) : 0.0) : 1.0,
                loss};
    tk_ops__parallel(n, k * 8, mm_range, &j);
    const tk_tensor *out = c->t[MM_LOSS];
    if (red == RED_NONE) {
        for (int64_t i = 0; i < n; i++) {
            float f[BLK];
            int64_t cs = tk_ops__col_stride(out), off = out->ndim == 2 ? tk_ops__row_offset(out, i) : i * cs;
            for (int64_t c0 = 0; c0 < k; c0 += BLK) {
                int64_t m = k - c0 < BLK ? k - c0 : BLK;
                for (int64_t q = 0; q < m; q++)
                    f[q] = (float)loss[i * k + c0 + q];
                tk_ops__store_f32(tk_ops__base(out), off + c0 * cs, cs, f, m, out->dtype);
            }
        }
    } else {
        store_loss(out, loss, n * k, red == RED_MEAN ? RED_MEAN : RED_SUM, n * k);
    }
    free(loss);
    return TK_OK;
}

/* ---- infonce ------------------------------------------------------------------------------------ */

enum { NCE_A, NCE_B, NCE_LOSS, NCE_GA, NCE_GB, NCE_TEMP, NCE_SYM, NCE_RED };

#define NORM_EPS 1e-12 /* F.normalize's eps: x / max(||x||, eps) */

static int check_nce(const tk_op_call *c)
{
    const tk_tensor *a = c->t[NCE_A], *b = c->t[NCE_B];
    int64_t n = a->shape[0];
    int rc;
    if (!tk_ops__same_shape(a, b))
        return tk__err(TK_ERR_INVALID,
                       "%s: 'b' has shape %s, want %s (the shape of 'a': row i of b is the positive of row i of a)",
                       c->op->name, tk_ops__shape_fmt(b->ndim, b->shape), tk_ops__shape_fmt(a->ndim, a->shape));
    double tau = c->f[NCE_TEMP];
    if (!(tau > 0) || !isfinite(tau))
        return tk__err(TK_ERR_INVALID, "%s: 'temperature' is %g, want a finite value > 0", c->op->name, tau);
    if (c->i[NCE_SYM] != 0 && c->i[NCE_SYM] != 1)
        return tk__err(TK_ERR_INVALID, "%s: 'symmetric' is %lld, want 0 or 1", c->op->name, (long long)c->i[NCE_SYM]);
    if ((rc = check_reduction(c, NCE_RED)) != TK_OK ||
        (rc = check_loss(c, NCE_LOSS, NCE_RED, 1, &n, "the rows of 'a'")) != TK_OK ||
        (rc = check_like(c, NCE_GA, NCE_A)) != TK_OK || (rc = check_like(c, NCE_GB, NCE_B)) != TK_OK)
        return rc;
    static const int outs[] = {NCE_LOSS, NCE_GA, NCE_GB};
    for (size_t x = 0; x < 3; x++) {
        if ((rc = check_overlap(c, outs[x], NCE_A, 0)) != TK_OK || (rc = check_overlap(c, outs[x], NCE_B, 0)) != TK_OK)
            return rc;
        for (size_t y = 0; y < x; y++)
            if ((rc = check_overlap(c, outs[x], outs[y], 0)) != TK_OK)
                return rc;
    }
    return TK_OK;
}

typedef struct {
    const tk_tensor *a, *b, *ga, *gb;
    int64_t n, d;
    double tau;
    float *an, *bn; /* [n, d] normalised rows */
    double *na, *nb; /* [n] max(||row||, eps) */
    double *s;       /* [n, n] similarities / tau, then dL/dS */
    double *rl, *cl; /* [n] row and column lse */
    double wrow, wsym; /* dS = wrow (P - I) + wsym (Q - I) */
    float *tmp;      /* [n, d] dL/d(normalised row) */
    double *acc;     /* [n, d] accumulators */
} nce_job;

static void nce_norm_rows(const tk_tensor *x, int64_t lo, int64_t hi, int64_t d, float *out, double *nrm)
{
    int64_t cs = tk_ops__col_stride(x);
    for (int64_t i = lo; i < hi; i++) {
        float *r = out + i * d;
        tk_ops__load_f32(r, tk_ops__base(x), tk_ops__row_offset(x, i), cs, d, x->dtype);
        double ss = 0;
        for (int64_t k = 0; k < d; k++)
            ss += (double)r[k] * r[k];
        double nv = sqrt(ss);
        nrm[i] = nv > NORM_EPS ? nv : NORM_EPS;
        for (int64_t k = 0; k < d; k++)
            r[k] = (float)(r[k] / nrm[i]);
    }
}

static void nce_norm_range(void *arg, int64_t lo, int64_t hi)
{
    const nce_job *j = arg;
    nce_norm_rows(j->a, lo, hi, j->d, j->an, j->na);
    nce_norm_rows(j->b, lo, hi, j->d, j->bn, j->nb);
}

static void nce_sim_range(void *arg, int64_t lo, int64_t hi)
{
    const nce_job *j = arg;
    for (int64_t i = lo; i < hi; i++) {
        const float *ai = j->an + i * j->d;
        for (int64_t q = 0; q < j->n; q++) {
            const float *bq = j->bn + q * j->d;
            double s = 0;
            for (int64_t k = 0; k < j->d; k++)
                s += (double)ai[k] * bq[k];
            j->s[i * j->n + q] = s / j->tau;
        }
    }
}

/* Row (transpose 0) or column (1) log-sum-exp of s, for rows/columns lo..hi. */
static double lse_line(const double *s, int64_t n, int64_t i, int transpose)
{
    double m = -INFINITY, sum = 0;
    for (int64_t q = 0; q < n; q++) {
        double x = transpose ? s[q * n + i] : s[i * n + q];
        if (x > m)
            m = x;
    }
    if (m == -INFINITY)
        return m;
    for (int64_t q = 0; q < n; q++)
        sum += exp((transpose ? s[q * n + i] : s[i * n + q]) - m);
    return m + log(sum);
}

static void nce_lse_range(void *arg, int64_t lo, int64_t hi)
{
    const nce_job *j = arg;
    for (int64_t i = lo; i < hi; i++) {
        j->rl[i] = lse_line(j->s, j->n, i, 0);
        j->cl[i] = lse_line(j->s, j->n, i, 1);
    }
}

/* s becomes dL/dS, row by row (each element needs only its own row and column lse). */
static void nce_ds_range(void *arg, int64_t lo, int64_t hi)
{
    const nce_job *j = arg;
    for (int64_t i = lo; i < hi; i++)
        for (int64_t q = 0; q < j->n; q++) {
            double x = j->s[i * j->n + q], eye = i == q ? 1.0 : 0.0;
            double g = j->wrow * (exp(x - j->rl[i]) - eye);
            if (j->wsym != 0)
                g += j->wsym * (exp(x - j->cl[q]) - eye);
            j->s[i * j->n + q] = g;
        }
}

/* Back through x / max(||x||, eps): dx = (dxn - xn (xn . dxn)) / ||x|| when ||x|| > eps, else dxn / eps. */
static void nce_store_grad(const tk_tensor *g, int64_t i, float *dxn, const float *xn, double nrm, int64_t d)
{
    if (nrm > NORM_EPS) {
        double dot = 0;
        for (int64_t k = 0; k < d; k++)
            dot += (double)xn[k] * dxn[k];
        for (int64_t k = 0; k < d; k++)
            dxn[k] = (float)((dxn[k] - xn[k] * dot) / nrm);
    } else {
        for (int64_t k = 0; k < d; k++)
            dxn[k] = (float)(dxn[k] / NORM_EPS);
    }
    tk_ops__store_f32(tk_ops__base(g), tk_ops__row_offset(g, i), tk_ops__col_stride(g), dxn, d, g->dtype);
}

/* grad_a[i] = back(sum_q dS[i, q] bn[q] / tau);  grad_b[i] = back(sum_q dS[q, i] an[q] / tau). */
static void nce_grad_range(void *arg, int64_t lo, int64_t hi)
{
    const nce_job *j = arg;
    int64_t n = j->n, d = j->d;
    for (int64_t i = lo; i < hi; i++) {
        float *t = j->tmp + i * d;
        double *acc = j->acc + i * d;
        memset(acc, 0, sizeof(double) * (size_t)d);
        if (j->ga) {
            for (int64_t q = 0; q < n; q++) {
                double g = j->s[i * n + q] / j->tau;
                const float *bq = j->bn + q * d;
                for (int64_t k = 0; k < d; k++)
                    acc[k] += g * bq[k];
            }
            for (int64_t k = 0; k < d; k++)
                t[k] = (float)acc[k];
            nce_store_grad(j->ga, i, t, j->an + i * d, j->na[i], d);
            memset(acc, 0, sizeof(double) * (size_t)d);
        }
        if (j->gb) {
            for (int64_t q = 0; q < n; q++) {
                double g = j->s[q * n + i] / j->tau;
                const float *aq = j->an + q * d;
                for (int64_t k = 0; k < d; k++)
                    acc[k] += g * aq[k];
            }
            for (int64_t k = 0; k < d; k++)
                t[k] = (float)acc[k];
            nce_store_grad(j->gb, i, t, j->bn + i * d, j->nb[i], d);
        }
    }
}

static int cpu_nce(const tk_op_call *c)
{
    const tk_tensor *a = c->t[NCE_A];
    int64_t n = a->shape[0], d = a->shape[1], red = c->i[NCE_RED];
    int sym = (int)c->i[NCE_SYM], rc = TK_OK;
    size_t nd = (size_t)(n * d > 0 ? n * d : 1), nn = (size_t)(n > 0 ? n * n : 1), n1 = (size_t)(n ? n : 1);
    nce_job j = {a,
                 c->t[NCE_B],
                 c->t[NCE_GA],
                 c->t[NCE_GB],
                 n,
                 d,
                 c->f[NCE_TEMP],
                 malloc(sizeof(float) * nd),
                 malloc(sizeof(float) * nd),
                 malloc(sizeof(double) * n1),
                 malloc(sizeof(double) * n1),
                 malloc(sizeof(double) * nn),
                 malloc(sizeof(double) * n1),
                 malloc(sizeof(double) * n1),
                 0,
                 0,
                 malloc(sizeof(float) * nd),
                 malloc(sizeof(double) * nd)};
    double *rows = malloc(sizeof(double) * n1);
    if (!j.an || !j.bn || !j.na || !j.nb || !j.s || !j.rl || !j.cl || !j.tmp || !j.acc || !rows) {
        rc = tk__err(TK_ERR_NOMEM, "%s: out of memory for the %lld x %lld similarity matrix", c->op->name, (long long)n,
                     (long long)n);
        goto done;
    }
    tk_ops__parallel(n, d * 4, nce_norm_range, &j);
    tk_ops__parallel(n, n * d * 2, nce_sim_range, &j);
    tk_ops__parallel(n, n * 40, nce_lse_range, &j);
    for (int64_t i = 0; i < n; i++) {
        double sii = j.s[i * n + i], l = j.rl[i] - sii;
        if (sym)
            l = 0.5 * (l + (j.cl[i] - sii));
        rows[i] = l;
    }
    store_loss(c->t[NCE_LOSS], rows, n, red, n);
    if (j.ga || j.gb) {
        double w = red == RED_MEAN ? (n ? 1.0 / (double)n : 0.0) : 1.0;
        j.wrow = sym ? 0.5 * w : w;
        j.wsym = sym ? 0.5 * w : 0.0;
        tk_ops__parallel(n, n * 40, nce_ds_range, &j);
        tk_ops__parallel(n, n * d * 4, nce_grad_range, &j);
    }
done:
    free(j.an);
    free(j.bn);
    free(j.na);
    free(j.nb);
    free(j.s);
    free(j.rl);
    free(j.cl);
    free(j.tmp);
    free(j.acc);
    free(rows);
    return rc;
}

/* ---- the table ---------------------------------------------------------------------------------- */

#define TENSOR(nm, rl, dts, like, lo, hi, shp, opt, dc)                                                                \
    {.name = nm,                                                                                                       \
     .kind = TK_ARG_TENSOR,                                                                                            \
     .role = rl,                                                                                                       \
     .dtypes = dts,                                                                                                    \
     .dtype_like = like,                                                                                               \
     .min_rank = lo,                                                                                                   \
     .max_rank = hi,                                                                                                   \
     .shape = shp,                                                                                                     \
     .optional = opt,                                                                                                  \
     .doc = dc}
#define RED                                                                                                            \
    {.name = "reduction",                                                                                              \
     .kind = TK_ARG_I64,                                                                                               \
     .optional = 1,                                                                                                    \
     .def = 1,                                                                                                         \
     .dtype_like = -1,                                                                                                 \
     .doc = "0 none (per-row loss), 1 mean (default), 2 sum"}
#define IGNORE                                                                                                         \
    {.name = "ignore_index",                                                                                           \
     .kind = TK_ARG_I64,                                                                                               \
     .optional = 1,                                                                                                    \
     .def = -100,                                                                                                      \
     .dtype_like = -1,                                                                                                 \
     .doc = "rows with this target have loss 0 and a zero gradient"}
#define SMOOTH                                                                                                         \
    {.name = "label_smoothing",                                                                                        \
     .kind = TK_ARG_F64,                                                                                               \
     .optional = 1,                                                                                                    \
     .def = 0,                                                                                                         \
     .dtype_like = -1,                                                                                                 \
     .doc = "eps in [0, 1]: the target is (1 - eps) one-hot + eps / V (PyTorch's)"}

static const tk_op_param ce_params[] = {
    TENSOR("logits", TK_OPS_IN, TK_OPS_FLOATS, -1, 2, 2, "[N, V]", 0, "the unnormalised scores"),
    TENSOR("target", TK_OPS_IN, TK_OPS_I64, -1, 1, 1, "[N]", 0, "the class of each row, or ignore_index"),
    TENSOR("loss", TK_OPS_OUT, TK_OPS_F32, -1, 0, 1, "[N] | [] | [1]", 0,
           "per-row loss (reduction none), else their mean over non-ignored rows or sum"),
    TENSOR("grad", TK_OPS_OUT, TK_OPS_FLOATS, 0, 2, 2, "[N, V]", 1,
           "dloss/dlogits; may be 'logits' itself (in place); left out: no gradient"),
    TENSOR("lse", TK_OPS_OUT, TK_OPS_F32, -1, 1, 1, "[N]", 1, "logsumexp of each row (ignored rows too)"),
    IGNORE,
    SMOOTH,
    RED,
};

static const tk_op_param fl_params[] = {
    TENSOR("hidden", TK_OPS_IN, TK_OPS_FLOATS, -1, 2, 2, "[N, H]", 0, "the final hidden states"),
    TENSOR("weight", TK_OPS_IN, TK_OPS_FLOATS, 0, 2, 2, "[V, H]", 0, "the output projection (lm_head)"),
    TENSOR("target", TK_OPS_IN, TK_OPS_I64, -1, 1, 1, "[N]", 0, "the class of each row, or ignore_index"),
    TENSOR("loss", TK_OPS_OUT, TK_OPS_F32, -1, 0, 1, "[N] | [] | [1]", 0,
           "per-row loss (reduction none), else their mean over non-ignored rows or sum"),
    TENSOR("bias", TK_OPS_IN, TK_OPS_FLOATS, 0, 1, 1, "[V]", 1, "added to the logits"),
    TENSOR("grad_hidden", TK_OPS_OUT, TK_OPS_FLOATS, 0, 2, 2, "[N, H]", 1, "dloss/dhidden"),
    TENSOR("grad_weight", TK_OPS_OUT, TK_OPS_F32, -1, 2, 2, "[V, H]", 1,
           "+= dloss/dweight (f32, accumulated: zero it first)"),
    TENSOR("grad_bias", TK_OPS_OUT, TK_OPS_F32, -1, 1, 1, "[V]", 1, "+= dloss/dbias (f32, accumulated; needs 'bias')"),
    TENSOR("lse", TK_OPS_OUT, TK_OPS_F32, -1, 1, 1, "[N]", 1, "logsumexp of each row's logits"),
    IGNORE,
    SMOOTH,
    RED,
    TK_OPS_SCALAR("chunk_size", TK_ARG_I64, 0,
                  "rows of logits the CPU reference holds at once (0: Liger's rule); kernels ignore it"),
};

static const tk_op_param mm_params[] = {
    TENSOR("pos", TK_OPS_IN, TK_OPS_FLOATS, -1, 1, 1, "[N]", 0, "the positive pair's score of each anchor"),
    TENSOR("neg", TK_OPS_IN, TK_OPS_FLOATS, 0, 1, 2, "[N] | [N, K]", 0, "K negative scores of each anchor"),
    TENSOR("loss", TK_OPS_OUT, TK_OPS_F32, -1, 0, 2, "[N(, K)] | [] | [1]", 0,
           "per-pair max(0, margin - pos + neg) (reduction none), else their mean over pairs or sum"),
    TENSOR("grad_pos", TK_OPS_OUT, TK_OPS_FLOATS, 0, 1, 1, "[N]", 1, "dloss/dpos"),
    TENSOR("grad_neg", TK_OPS_OUT, TK_OPS_FLOATS, 0, 1, 2, "[N] | [N, K]", 1, "dloss/dneg"),
    TK_OPS_SCALAR("margin", TK_ARG_F64, 1.0, "the margin by which pos must beat each neg"),
    RED,
};

static const tk_op_param nce_params[] = {
    TENSOR("a", TK_OPS_IN, TK_OPS_FLOATS, -1, 2, 2, "[N, D]", 0, "anchor embeddings (normalised inside)"),
    TENSOR("b", TK_OPS_IN, TK_OPS_FLOATS, 0, 2, 2, "[N, D]", 0, "positive embeddings: row i pairs with a's row i"),
    TENSOR("loss", TK_OPS_OUT, TK_OPS_F32, -1, 0, 1, "[N] | [] | [1]", 0,
           "per-anchor loss (reduction none), else their mean or sum"),
    TENSOR("grad_a", TK_OPS_OUT, TK_OPS_FLOATS, 0, 2, 2, "[N, D]", 1, "dloss/da"),
    TENSOR("grad_b", TK_OPS_OUT, TK_OPS_FLOATS, 0, 2, 2, "[N, D]", 1, "dloss/db"),
    TK_OPS_SCALAR("temperature", TK_ARG_F64, 0.07, "S = normalize(a) normalize(b)^T / temperature"),
    TK_OPS_SCALAR("symmetric", TK_ARG_I64, 0,
                  "1: CLIP's loss, the mean of the a->b (rows) and b->a (columns) cross-entropies"),
    RED,
};

#define PKG "kernels-community/cross-entropy"
#define NP(p) p, sizeof p / sizeof p[0]

const tk_op_desc tk_ops__loss[] = {
    {"cross_entropy", "loss",
     "loss = CE(logits, target) with ignore_index and label smoothing; grad = dloss/dlogits in the same pass",
     NP(ce_params), check_ce, cpu_ce, NULL, PKG},
    {"fused_linear_cross_entropy", "loss",
     "cross_entropy(hidden @ weight^T + bias, target) without materialising the [N, V] logits; + gradients",
     NP(fl_params), check_fl, cpu_fl, NULL, PKG},
    {"max_margin_loss", "loss", "loss = reduce(max(0, margin - pos[i] + neg[i, k])) over anchor/negative pairs",
     NP(mm_params), check_mm, cpu_mm, NULL, PKG},
    {"infonce", "loss", "loss = CE(normalize(a) normalize(b)^T / temperature, diagonal targets); symmetric: CLIP's",
     NP(nce_params), check_nce, cpu_nce, NULL, PKG},
};
const size_t tk_ops__loss_count = sizeof tk_ops__loss / sizeof tk_ops__loss[0];
