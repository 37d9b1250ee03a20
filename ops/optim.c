/*
 * optim.c — the optimiser ops training runs (models/train.c): signatures, shape checks and CPU
 * references.
 *
 *   adamw        one parameter tensor's AdamW step, exactly as torch.optim.AdamW's single-tensor path
 *                (foreach=False, the default for CPU tensors) computes it in fp32, with g = grad *
 *                grad_scale (the clip coefficient and the 1/tokens of the mean loss, folded in):
 *                    param      = param * (1 - lr * weight_decay)
 *                    exp_avg    = exp_avg + (1 - beta1) * (g - exp_avg)           (lerp, weight < 0.5)
 *                    exp_avg_sq = exp_avg_sq * beta2 + ((1 - beta2) * g) * g
 *                    denom      = sqrt(exp_avg_sq) / sqrt(1 - beta2^step) + eps
 *                    param      = param + (-lr / (1 - beta1^step)) * exp_avg / denom
 *                The scalars (1 - lr wd, the bias corrections, the step size) are computed in double
 *                and rounded to fp32 once, as PyTorch's Python scalars are when they meet an fp32
 *                tensor; every tensor operation is one fp32 operation, rounded, in that order (fp
 *                contraction is off in this file). param_copy (optional) receives the updated param
 *                rounded to its dtype: the bf16 compute copy of f32 master weights.
 *   sum_squares  out = sum of x^2 over every element, in double: the squared L2 norm clip_grad_norm_
 *                needs (finite exactly when every element is; a double cannot overflow on fp32 data)
 *
 * The CPU references split elements over threads; each element is computed alone, and sum_squares
 * adds fixed chunks in chunk order, so results do not depend on the thread count.
 */
#include <math.h>
#include <stdlib.h>

#include "ops/ops.h"

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#define CHUNK 4096

/* ---- adamw(param, grad, exp_avg, exp_avg_sq, param_copy, lr, beta1, beta2, eps, weight_decay, step,
 *            grad_scale) ---------------------------------------------------------------------------- */

enum { AW_P, AW_G, AW_M, AW_V, AW_COPY, AW_LR, AW_B1, AW_B2, AW_EPS, AW_WD, AW_STEP, AW_GS };

static int check_adamw(const tk_op_call *c)
{
    const char *op = c->op->name;
    const tk_tensor *p = c->t[AW_P];
    for (int i = AW_G; i <= AW_COPY; i++) {
        const tk_tensor *t = c->t[i];
        if (t && !tk_ops__same_shape(t, p))
            return tk__err(TK_ERR_INVALID, "%s: '%s' has shape %s, want %s (the shape of 'param')", op,
                           c->op->params[i].name, tk_ops__shape_fmt(t->ndim, t->shape),
                           tk_ops__shape_fmt(p->ndim, p->shape));
        if (t && !tk_ops__contiguous(t))
            return tk__err(TK_ERR_INVALID, "%s: '%s' is not contiguous; the optimiser state is dense", op,
                           c->op->params[i].name);
    }
    if (!tk_ops__contiguous(p))
        return tk__err(TK_ERR_INVALID, "%s: 'param' is not contiguous; the optimiser state is dense", op);
    double lr = c->f[AW_LR], b1 = c->f[AW_B1], b2 = c->f[AW_B2], eps = c->f[AW_EPS], wd = c->f[AW_WD];
    if (!(lr >= 0) || !isfinite(lr))
        return tk__err(TK_ERR_INVALID, "%s: 'lr' is %g, want a finite value >= 0", op, lr);
    if (!(b1 >= 0 && b1 < 1) || !(b2 >= 0 && b2 < 1))
        return tk__err(TK_ERR_INVALID, "%s: betas are (%g, %g), want each in [0, 1) (torch.optim.AdamW's rule)", op, b1,
                       b2);
    if (!(eps >= 0) || !isfinite(eps))
        return tk__err(TK_ERR_INVALID, "%s: 'eps' is %g, want a finite value >= 0", op, eps);
    if (!(wd >= 0) || !isfinite(wd))
        return tk__err(TK_ERR_INVALID, "%s: 'weight_decay' is %g, want a finite value >= 0", op, wd);
    if (c->i[AW_STEP] < 1)
        return tk__err(TK_ERR_INVALID,
                       "%s: 'step' is %lld, want >= 1 (the count of steps taken, this one included: "
                       "the bias corrections divide by 1 - beta^step)",
                       op, (long long)c->i[AW_STEP]);
    if (!isfinite(c->f[AW_GS]))
        return tk__err(TK_ERR_INVALID, "%s: 'grad_scale' is %g, want a finite value", op, c->f[AW_GS]);
    return TK_OK;
}

typedef struct {
    const tk_tensor *p, *g, *m, *v, *copy;
    float decay, omb1, b2, omb2, bc2s, eps, nstep, gs;
} adamw_job;

static void adamw_range(void *arg, int64_t lo, int64_t hi)
{
    const adamw_job *j = arg;
    float p[CHUNK], g[CHUNK], m[CHUNK], v[CHUNK];
    for (int64_t c = lo; c < hi; c++) {
        int64_t o = c * CHUNK, n = tk_ops__numel(j->p) - o < CHUNK ? tk_ops__numel(j->p) - o : CHUNK;
        tk_ops__load_f32(p, tk_ops__base(j->p), o, 1, n, j->p->dtype);
        tk_ops__load_f32(g, tk_ops__base(j->g), o, 1, n, j->g->dtype);
        tk_ops__load_f32(m, tk_ops__base(j->m), o, 1, n, j->m->dtype);
        tk_ops__load_f32(v, tk_ops__base(j->v), o, 1, n, j->v->dtype);
        for (int64_t i = 0; i < n; i++) {
            float gi = g[i] * j->gs;
            float pi = p[i] * j->decay;
            float mi = m[i] + j->omb1 * (gi - m[i]);
            float vi = v[i] * j->b2;
            vi = vi + (j->omb2 * gi) * gi;
            float denom = sqrtf(vi) / j->bc2s + j->eps;
            p[i] = pi + (j->nstep * mi) / denom;
            m[i] = mi;
            v[i] = vi;
        }
        tk_ops__store_f32(tk_ops__base(j->p), o, 1, p, n, j->p->dtype);
        tk_ops__store_f32(tk_ops__base(j->m), o, 1, m, n, j->m->dtype);
        tk_ops__store_f32(tk_ops__base(j->v), o, 1, v, n, j->v->dtype);
        if (j->copy)
            tk_ops__store_f32(tk_ops__base(j->copy), o, 1, p, n, j->copy->dtype);
    }
}

static int cpu_adamw(const tk_op_call *c)
{
    double lr = c->f[AW_LR], b1 = c->f[AW_B1], b2 = c->f[AW_B2], step = (double)c->i[AW_STEP];
    double bc1 = 1.0 - pow(b1, step), bc2 = 1.0 - pow(b2, step);
    adamw_job j = {c->t[AW_P],        c->t[AW_G],          c->t[AW_M],
                   c->t[AW_V],        c->t[AW_COPY],       (float)(1.0 - lr * c->f[AW_WD]),
                   (float)(1.0 - b1), (float)b2,           (float)(1.0 - b2),
                   (float)sqrt(bc2),  (float)c->f[AW_EPS], (float)(-(lr / bc1)),
                   (float)c->f[AW_GS]};
    int64_t n = tk_ops__numel(j.p);
    tk_ops__parallel((n + CHUNK - 1) / CHUNK, CHUNK * 12, adamw_range, &j);
    return TK_OK;
}

/* ---- sum_squares(out, input) ------------------------------------------------------------------ */

static int check_sumsq(const tk_op_call *c)
{
    if (tk_ops__numel(c->t[0]) != 1)
        return tk__err(TK_ERR_INVALID, "%s: 'out' has shape %s, want [] or [1] (one value)", c->op->name,
                       tk_ops__shape_fmt(c->t[0]->ndim, c->t[0]->shape));
    return TK_OK;
}

typedef struct {
    const tk_tensor *x;
    int64_t n, d;
    double *part; /* one per chunk */
} ss_job;

static void ss_range(void *arg, int64_t lo, int64_t hi)
{
    const ss_job *j = arg;
    float x[CHUNK];
    int64_t cs = tk_ops__col_stride(j->x);
    for (int64_t c = lo; c < hi; c++) {
        double s = 0;
        int64_t i0 = c * CHUNK, n = j->n - i0 < CHUNK ? j->n - i0 : CHUNK;
        /* chunk c covers flat elements [i0, i0 + n): read them row by row through the strides */
        for (int64_t i = i0; i < i0 + n;) {
            int64_t r = i / j->d, col = i % j->d, cnt = j->d - col < i0 + n - i ? j->d - col : i0 + n - i;
            tk_ops__load_f32(x, tk_ops__base(j->x), tk_ops__row_offset(j->x, r) + col * cs, cs, cnt, j->x->dtype);
            for (int64_t k = 0; k < cnt; k++)
                s += (double)x[k] * x[k];
            i += cnt;
        }
        j->part[c] = s;
    }
}

static int cpu_sumsq(const tk_op_call *c)
{
    const tk_tensor *x = c->t[1];
    ss_job j = {x, tk_ops__numel(x), x->ndim ? x->shape[x->ndim - 1] : 1, NULL};
    int64_t nc = (j.n + CHUNK - 1) / CHUNK;
    double s = 0;
    if (nc > 0) {
        if (!(j.part = malloc(sizeof(double) * (size_t)nc)))
            return tk__err(TK_ERR_NOMEM, "%s: out of memory", c->op->name);
        tk_ops__parallel(nc, CHUNK * 2, ss_range, &j);
        for (int64_t k = 0; k < nc; k++)
            s += j.part[k];
        free(j.part);
    }
    const tk_tensor *out = c->t[0];
    if (out->dtype.code == TK_DL_FLOAT && out->dtype.bits == 64) {
        *(double *)tk_ops__base(out) = s;
    } else {
        float f = (float)s;
        tk_ops__store_f32(tk_ops__base(out), 0, 1, &f, 1, out->dtype);
    }
    return TK_OK;
}

/* ---- the table -------------------------------------------------------------------------------- */

#define STATE(nm, rl, bits, like, opt, dc)                                                                             \
    {.name = nm,                                                                                                       \
     .kind = TK_ARG_TENSOR,                                                                                            \
     .role = rl,                                                                                                       \
     .dtypes = bits,                                                                                                   \
     .dtype_like = like,                                                                                               \
     .min_rank = 0,                                                                                                    \
     .max_rank = -1,                                                                                                   \
     .shape = "[...]",                                                                                                 \
     .optional = opt,                                                                                                  \
     .doc = dc}
#define F(nm, dv, dc) {.name = nm, .kind = TK_ARG_F64, .optional = 1, .def = dv, .dtype_like = -1, .doc = dc}

static const tk_op_param adamw_params[] = {
    STATE("param", TK_OPS_OUT, TK_OPS_FLOATS, -1, 0, "the parameter, updated in place (f32 master weights)"),
    STATE("grad", TK_OPS_IN, TK_OPS_FLOATS, -1, 0, "its gradient (times grad_scale)"),
    STATE("exp_avg", TK_OPS_OUT, TK_OPS_F32, -1, 0, "the first moment, updated (f32; zeros before step 1)"),
    STATE("exp_avg_sq", TK_OPS_OUT, TK_OPS_F32, -1, 0, "the second moment, updated (f32; zeros before step 1)"),
    STATE("param_copy", TK_OPS_OUT, TK_OPS_FLOATS, -1, 1, "receives the new param rounded to its dtype (optional)"),
    F("lr", 1e-3, "the learning rate of this step"),
    F("beta1", 0.9, "the first moment's decay"),
    F("beta2", 0.999, "the second moment's decay"),
    F("eps", 1e-8, "added to the bias-corrected sqrt(exp_avg_sq)"),
    F("weight_decay", 1e-2, "decoupled: param *= 1 - lr * weight_decay (0 for the no-decay group)"),
    TK_OPS_SCALAR("step", TK_ARG_I64, 1, "steps taken, this one included (>= 1): the bias corrections' exponent"),
    F("grad_scale", 1.0, "the gradient is multiplied by this first (clipping, 1/tokens)"),
};

static const tk_op_param sumsq_params[] = {
    TK_OPS_TENSOR("out", TK_OPS_OUT, TK_OPS_F32 | TK_OPS_F64, -1, 0, 1, "[] | [1]",
                  "sum of input^2 (accumulated in double)"),
    TK_OPS_TENSOR("input", TK_OPS_IN, TK_OPS_FLOATS, -1, 0, -1, "[...]", "x"),
};

#define PKG "kernels-community/training"

const tk_op_desc tk_ops__optim[] = {
    {"adamw", "optim", "one tensor's torch.optim.AdamW step (decoupled weight decay, bias correction) in fp32",
     adamw_params, sizeof adamw_params / sizeof adamw_params[0], check_adamw, cpu_adamw, NULL, PKG},
    {"sum_squares", "optim", "out = sum(input^2) in double: a squared L2 norm (clip_grad_norm_)", sumsq_params, 2,
     check_sumsq, cpu_sumsq, NULL, PKG},
};
const size_t tk_ops__optim_count = sizeof tk_ops__optim / sizeof tk_ops__optim[0];
