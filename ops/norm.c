/*
 * norm.c — the normalisation ops (the ops of kernels-community/rmsnorm): signatures, shape checks and
 * CPU references.
 *
 *   rms_norm            out[..., :] = x * rsqrt(mean(x^2) + eps) * weight          x = input
 *   fused_add_rms_norm  residual = input + residual  (rounded to T, written back), then
 *                       input = residual * rsqrt(mean(residual^2) + eps) * weight  (vLLM's semantics)
 *
 * Numerics: elements are loaded as fp32; the sum of squares of a row is accumulated in double, the
 * scale 1/sqrt(mean + eps) is computed in double and rounded to fp32, and x * scale * weight is computed
 * in fp32 and rounded once to the output dtype. fused_add_rms_norm adds in fp32, rounds the sum to T,
 * stores it, and normalises the rounded sum (so `input` ends as rms_norm(residual)). Strided tensors
 * are read and written through their strides. rms_norm may run in place (out == input);
 * fused_add_rms_norm needs input and residual not to overlap.
 */
#include <math.h>

#include "ops/ops.h"

/* ---- shape checks ----------------------------------------------------------------------------- */

static int same_shape(const tk_tensor *a, const tk_tensor *b)
{
    if (a->ndim != b->ndim)
        return 0;
    for (int32_t k = 0; k < a->ndim; k++)
        if (a->shape[k] != b->shape[k])
            return 0;
    return 1;
}

/* weight (param iw) must be [d] for d = the last dimension of the tensor at param ix. */
static int check_weight(const tk_op_call *c, int iw, int ix)
{
    const tk_tensor *w = c->t[iw], *x = c->t[ix];
    int64_t d = x->shape[x->ndim - 1];
    if (w->shape[0] != d)
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

/* rms_norm(out, input, weight, eps) */
static int check_rms(const tk_op_call *c)
{
    const tk_tensor *out = c->t[0], *in = c->t[1];
    if (!same_shape(out, in))
        return tk__err(TK_ERR_INVALID, "%s: 'out' has shape %s, want %s (the shape of 'input')", c->op->name,
                       tk_ops__shape_fmt(out->ndim, out->shape), tk_ops__shape_fmt(in->ndim, in->shape));
    int rc = check_weight(c, 2, 1);
    return rc == TK_OK ? check_eps(c, 3) : rc;
}

/* fused_add_rms_norm(input, residual, weight, eps) */
static int check_fused_rms(const tk_op_call *c)
{
    const tk_tensor *in = c->t[0], *res = c->t[1];
    if (!same_shape(res, in))
        return tk__err(TK_ERR_INVALID, "%s: 'residual' has shape %s, want %s (the shape of 'input')",
                       c->op->name, tk_ops__shape_fmt(res->ndim, res->shape),
                       tk_ops__shape_fmt(in->ndim, in->shape));
    if (in->data == res->data && in->byte_offset == res->byte_offset && tk_ops__numel(in) > 0)
        return tk__err(TK_ERR_INVALID, "%s: 'input' and 'residual' are the same tensor; both are written",
                       c->op->name);
    int rc = check_weight(c, 2, 0);
    return rc == TK_OK ? check_eps(c, 3) : rc;
}

/* ---- CPU references --------------------------------------------------------------------------- */

#define BLK 1024 /* columns per step: the scratch rows live on the stack */

typedef struct {
    int fused;
    float eps;
    const tk_tensor *out; /* rms_norm: out; fused: input (written last) */
    const tk_tensor *in;  /* rms_norm: input; fused: residual (the sum is written there first) */
    const tk_tensor *add; /* fused: input (read first); NULL for rms_norm */
    const tk_tensor *w;
    int64_t d;
} rms_job;

static void rms_range(void *arg, int64_t lo, int64_t hi)
{
    const rms_job *j = arg;
    float x[BLK], y[BLK], w[BLK];
    void *ob = tk_ops__base(j->out), *ib = tk_ops__base(j->in);
    const void *wb = tk_ops__base(j->w);
    int64_t ocs = tk_ops__col_stride(j->out), ics = tk_ops__col_stride(j->in), wcs = tk_ops__col_stride(j->w);
    for (int64_t r = lo; r < hi; r++) {
        int64_t io = tk_ops__row_offset(j->in, r), oo = tk_ops__row_offset(j->out, r);
        double ss = 0;
        for (int64_t c0 = 0; c0 < j->d; c0 += BLK) {
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
            for (int64_t i = 0; i < n; i++)
                ss += (double)x[i] * (double)x[i];
        }
        float scale = (float)(1.0 / sqrt(ss / (double)j->d + (double)j->eps));
        for (int64_t c0 = 0; c0 < j->d; c0 += BLK) {
            int64_t n = j->d - c0 < BLK ? j->d - c0 : BLK;
            tk_ops__load_f32(x, ib, io + c0 * ics, ics, n, j->in->dtype);
            tk_ops__load_f32(w, wb, c0 * wcs, wcs, n, j->w->dtype);
            for (int64_t i = 0; i < n; i++)
                x[i] = (x[i] * scale) * w[i];
            tk_ops__store_f32(ob, oo + c0 * ocs, ocs, x, n, j->out->dtype);
        }
    }
}

static int cpu_rms(const tk_op_call *c)
{
    const int *fused = c->op->data;
    rms_job j = {*fused, (float)c->f[3], c->t[0], c->t[1], NULL, c->t[2], 0};
    if (j.fused) {
        j.out = c->t[0]; /* input: read as the addend, then overwritten with the result */
        j.in = c->t[1];  /* residual: overwritten with the sum */
    }
    j.d = j.in->shape[j.in->ndim - 1];
    int64_t numel = tk_ops__numel(j.in);
    if (numel == 0)
        return TK_OK;
    tk_ops__parallel(numel / j.d, j.d * (j.fused ? 24 : 16), rms_range, &j);
    return TK_OK;
}

/* ---- the table -------------------------------------------------------------------------------- */

#define WEIGHT(like)                                                                                   \
    {.name = "weight", .kind = TK_ARG_TENSOR, .role = TK_OPS_IN, .dtypes = TK_OPS_FLOATS, .dtype_like = like, \
     .min_rank = 1, .max_rank = 1, .shape = "[d]", .doc = "the per-column gain"}
#define EPS                                                                                            \
    {.name = "eps", .kind = TK_ARG_F64, .optional = 1, .def = 1e-6, .dtype_like = -1,                  \
     .doc = "added to mean(x^2) before the rsqrt (rounded to f32)"}

static const tk_op_param rms_params[] = {
    {.name = "out", .kind = TK_ARG_TENSOR, .role = TK_OPS_OUT, .dtypes = TK_OPS_FLOATS, .dtype_like = 1,
     .min_rank = 1, .max_rank = -1, .shape = "[..., d]", .doc = "the result (may be 'input' itself)"},
    {.name = "input", .kind = TK_ARG_TENSOR, .role = TK_OPS_IN, .dtypes = TK_OPS_FLOATS, .dtype_like = -1,
     .min_rank = 1, .max_rank = -1, .shape = "[..., d]", .doc = "x, normalised over its last dimension"},
    WEIGHT(1),
    EPS,
};
static const tk_op_param fused_rms_params[] = {
    {.name = "input", .kind = TK_ARG_TENSOR, .role = TK_OPS_OUT, .dtypes = TK_OPS_FLOATS, .dtype_like = -1,
     .min_rank = 1, .max_rank = -1, .shape = "[..., d]",
     .doc = "x; on return rms_norm(x + residual) * weight"},
    {.name = "residual", .kind = TK_ARG_TENSOR, .role = TK_OPS_OUT, .dtypes = TK_OPS_FLOATS, .dtype_like = 0,
     .min_rank = 1, .max_rank = -1, .shape = "[..., d]", .doc = "the residual stream; on return x + residual"},
    WEIGHT(0),
    EPS,
};

static const int plain = 0, fused = 1;

#define PKG "kernels-community/rmsnorm"

const tk_op_desc tk_ops__norm[] = {
    {"rms_norm", "norm", "out = x * rsqrt(mean(x^2, -1) + eps) * weight", rms_params,
     sizeof rms_params / sizeof rms_params[0], check_rms, cpu_rms, &plain, PKG},
    {"fused_add_rms_norm", "norm",
     "residual = input + residual; input = rms_norm(residual) * weight  (in place, vLLM's)", fused_rms_params,
     sizeof fused_rms_params / sizeof fused_rms_params[0], check_fused_rms, cpu_rms, &fused, PKG},
};
const size_t tk_ops__norm_count = sizeof tk_ops__norm / sizeof tk_ops__norm[0];
