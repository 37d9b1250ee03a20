/*
 * backward_act.c — the backward passes of the activation and softmax ops (ops/activation.c,
 * ops/softmax.c): signatures, shape checks and CPU references.
 *
 *   plain  grad_input = grad_out * f'(x)          gelu, gelu_tanh, gelu_new, gelu_fast, gelu_quick,
 *                                                 silu, tanh  (each <name>_backward)
 *   gated  input (..., 2d) = [a, b], out = act(a) * b (mul_and_silu: a * silu(b)):
 *          grad_input[..., :d] = grad_out * b * act'(a),  grad_input[..., d:] = grad_out * act(a)
 *                                                 silu_and_mul, mul_and_silu, gelu_and_mul,
 *                                                 gelu_tanh_and_mul  (each <name>_backward)
 *   softmax_backward      y = the forward's out:  grad_input = y * (grad_out - sum(grad_out * y))
 *   log_softmax_backward  y = the forward's out:  grad_input = grad_out - exp(y) * sum(grad_out)
 *
 * The derivatives, with s = sigmoid:
 *   silu        s(x) (1 + x (1 - s(x)))
 *   gelu        Phi(x) + x phi(x)          (erf form: PyTorch's gelu backward)
 *   gelu_tanh   t = tanh(c (x + k x^3)), c = sqrt(2/pi), k = 0.044715:
 *               0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 k x^2)   (PyTorch's approximate='tanh')
 *   gelu_new / gelu_fast   the same with c = 0.79788456 (the constant of their forwards)
 *   gelu_quick  s(1.702 x) (1 + 1.702 x (1 - s(1.702 x)))
 *   tanh        1 - tanh(x)^2
 *
 * Numerics: elements are loaded as fp32, the derivative and the product are computed in double and
 * rounded once to grad_input's dtype; the softmax sums are accumulated in double in column order.
 * grad_input may be grad_out itself (each block is read whole before it is written). Strided tensors
 * are read and written through their strides.
 */
#include <math.h>

#include "ops/ops.h"

#define BLK 1024 /* columns per work item: scratch rows on the stack */

#define SQRT_2_PI 0.79788456080286535588 /* sqrt(2/pi) */
#define KAPPA 0.044715
#define GELU_NEW_C ((double)0.79788456f) /* the forwards' float constant */
#define QUICK 1.702

static double sigm(double x) { return 1.0 / (1.0 + exp(-x)); }

static double silu_f(double x) { return x * sigm(x); }
static double silu_d(double x)
{
    double s = sigm(x);
    return s * (1.0 + x * (1.0 - s));
}
static double gelu_f(double x) { return 0.5 * x * (1.0 + erf(x * M_SQRT1_2)); }
static double gelu_d(double x)
{
    return 0.5 * (1.0 + erf(x * M_SQRT1_2)) + x * exp(-0.5 * x * x) * (0.5 * M_2_SQRTPI * M_SQRT1_2);
}
static double tanh_form_f(double x, double c) { return 0.5 * x * (1.0 + tanh(c * (x + KAPPA * x * x * x))); }
static double tanh_form_d(double x, double c)
{
    double t = tanh(c * (x + KAPPA * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * KAPPA * x * x);
}
static double gelu_tanh_f(double x) { return tanh_form_f(x, SQRT_2_PI); }
static double gelu_tanh_d(double x) { return tanh_form_d(x, SQRT_2_PI); }
static double gelu_new_d(double x) { return tanh_form_d(x, GELU_NEW_C); }
static double gelu_quick_d(double x)
{
    double s = sigm(QUICK * x);
    return s * (1.0 + QUICK * x * (1.0 - s));
}
static double tanh_d(double x)
{
    double t = tanh(x);
    return 1.0 - t * t;
}

typedef struct {
    double (*f)(double);  /* gated: the activation */
    double (*d)(double);  /* its derivative */
    int gated, act_first; /* gated: act(a) * b, or a * act(b) (act_first = 0) */
} bact_info;

enum { G_IN, G_OUT, G_X }; /* grad_input, grad_out, input */

/* ---- shape checks ----------------------------------------------------------------------------- */

static int check_plain(const tk_op_call *c)
{
    for (int i = 1; i <= 2; i++)
        if (!tk_ops__same_shape(c->t[i], c->t[G_IN]))
            return tk__err(TK_ERR_INVALID, "%s: '%s' has shape %s, want %s (the shape of 'grad_input')", c->op->name,
                           c->op->params[i].name, tk_ops__shape_fmt(c->t[i]->ndim, c->t[i]->shape),
                           tk_ops__shape_fmt(c->t[G_IN]->ndim, c->t[G_IN]->shape));
    return TK_OK;
}

static int check_gated(const tk_op_call *c)
{
    const tk_tensor *gi = c->t[G_IN], *go = c->t[G_OUT], *x = c->t[G_X];
    if (!tk_ops__same_shape(gi, x))
        return tk__err(TK_ERR_INVALID, "%s: 'grad_input' has shape %s, want %s (the shape of 'input')", c->op->name,
                       tk_ops__shape_fmt(gi->ndim, gi->shape), tk_ops__shape_fmt(x->ndim, x->shape));
    int64_t last = x->shape[x->ndim - 1];
    if (last % 2)
        return tk__err(TK_ERR_INVALID, "%s: 'input' has shape %s: its last dimension must be even (2*d)", c->op->name,
                       tk_ops__shape_fmt(x->ndim, x->shape));
    int64_t want[TK_OPS_MAX_RANK];
    for (int32_t k = 0; k < x->ndim; k++)
        want[k] = x->shape[k];
    want[x->ndim - 1] = last / 2;
    int same = go->ndim == x->ndim;
    for (int32_t k = 0; same && k < x->ndim; k++)
        same = go->shape[k] == want[k];
    if (!same)
        return tk__err(TK_ERR_INVALID,
                       "%s: 'grad_out' has shape %s, want %s (the forward's out: input %s halves its "
                       "last dimension)",
                       c->op->name, tk_ops__shape_fmt(go->ndim, go->shape), tk_ops__shape_fmt(x->ndim, want),
                       tk_ops__shape_fmt(x->ndim, x->shape));
    if (tk_ops__base(gi) == tk_ops__base(go) && tk_ops__numel(go) > 0)
        return tk__err(TK_ERR_INVALID,
                       "%s: 'grad_input' and 'grad_out' start at the same address: a gated backward "
                       "cannot run in place (grad_input is twice as wide)",
                       c->op->name);
    return TK_OK;
}

/* ---- CPU references --------------------------------------------------------------------------- */

typedef struct {
    const bact_info *a;
    const tk_tensor *gi, *go, *x;
    int64_t d;    /* columns of grad_out */
    int64_t nblk; /* column blocks per row */
} bact_job;

static void bact_range(void *arg, int64_t lo, int64_t hi)
{
    const bact_job *j = arg;
    const bact_info *a = j->a;
    float g[BLK], x[BLK], y[BLK];
    int64_t gics = tk_ops__col_stride(j->gi), gocs = tk_ops__col_stride(j->go), xcs = tk_ops__col_stride(j->x);
    for (int64_t it = lo; it < hi; it++) {
        int64_t r = it / j->nblk, c0 = (it % j->nblk) * BLK, n = j->d - c0 < BLK ? j->d - c0 : BLK;
        int64_t go = tk_ops__row_offset(j->go, r), gio = tk_ops__row_offset(j->gi, r), xo = tk_ops__row_offset(j->x, r);
        tk_ops__load_f32(g, tk_ops__base(j->go), go + c0 * gocs, gocs, n, j->go->dtype);
        tk_ops__load_f32(x, tk_ops__base(j->x), xo + c0 * xcs, xcs, n, j->x->dtype);
        if (!a->gated) {
            for (int64_t i = 0; i < n; i++)
                x[i] = (float)((double)g[i] * a->d(x[i]));
            tk_ops__store_f32(tk_ops__base(j->gi), gio + c0 * gics, gics, x, n, j->gi->dtype);
            continue;
        }
        tk_ops__load_f32(y, tk_ops__base(j->x), xo + (j->d + c0) * xcs, xcs, n, j->x->dtype);
        for (int64_t i = 0; i < n; i++) {
            double av = x[i], bv = y[i], gv = g[i];
            if (a->act_first) { /* out = act(a) * b */
                x[i] = (float)(gv * bv * a->d(av));
                y[i] = (float)(gv * a->f(av));
            } else { /* out = a * act(b) */
                x[i] = (float)(gv * a->f(bv));
                y[i] = (float)(gv * av * a->d(bv));
            }
        }
        tk_ops__store_f32(tk_ops__base(j->gi), gio + c0 * gics, gics, x, n, j->gi->dtype);
        tk_ops__store_f32(tk_ops__base(j->gi), gio + (j->d + c0) * gics, gics, y, n, j->gi->dtype);
    }
}

static int cpu_bact(const tk_op_call *c)
{
    const bact_info *a = c->op->data;
    bact_job j = {a, c->t[G_IN], c->t[G_OUT], c->t[G_X], 0, 0};
    int64_t numel = tk_ops__numel(j.go);
    if (numel == 0)
        return TK_OK;
    j.d = j.go->ndim ? j.go->shape[j.go->ndim - 1] : 1;
    j.nblk = (j.d + BLK - 1) / BLK;
    tk_ops__parallel(numel / j.d * j.nblk, (j.d < BLK ? j.d : BLK) * 40, bact_range, &j);
    return TK_OK;
}

/* softmax_backward / log_softmax_backward: two passes over each row (the sum, then the write). */
typedef struct {
    int log;
    const tk_tensor *gi, *go, *y;
    int64_t d;
} smb_job;

static void smb_range(void *arg, int64_t lo, int64_t hi)
{
    const smb_job *j = arg;
    float g[BLK], y[BLK];
    int64_t gics = tk_ops__col_stride(j->gi), gocs = tk_ops__col_stride(j->go), ycs = tk_ops__col_stride(j->y);
    for (int64_t r = lo; r < hi; r++) {
        int64_t go = tk_ops__row_offset(j->go, r), gio = tk_ops__row_offset(j->gi, r), yo = tk_ops__row_offset(j->y, r);
        double s = 0;
        for (int64_t c0 = 0; c0 < j->d; c0 += BLK) {
            int64_t n = j->d - c0 < BLK ? j->d - c0 : BLK;
            tk_ops__load_f32(g, tk_ops__base(j->go), go + c0 * gocs, gocs, n, j->go->dtype);
            if (j->log) {
                for (int64_t i = 0; i < n; i++)
                    s += g[i];
            } else {
                tk_ops__load_f32(y, tk_ops__base(j->y), yo + c0 * ycs, ycs, n, j->y->dtype);
                for (int64_t i = 0; i < n; i++)
                    s += (double)g[i] * y[i];
            }
        }
        for (int64_t c0 = 0; c0 < j->d; c0 += BLK) {
            int64_t n = j->d - c0 < BLK ? j->d - c0 : BLK;
            tk_ops__load_f32(g, tk_ops__base(j->go), go + c0 * gocs, gocs, n, j->go->dtype);
            tk_ops__load_f32(y, tk_ops__base(j->y), yo + c0 * ycs, ycs, n, j->y->dtype);
            for (int64_t i = 0; i < n; i++)
                g[i] =
                    j->log ? (float)((double)g[i] - exp((double)y[i]) * s) : (float)((double)y[i] * ((double)g[i] - s));
            tk_ops__store_f32(tk_ops__base(j->gi), gio + c0 * gics, gics, g, n, j->gi->dtype);
        }
    }
}

static int check_softmax_bwd(const tk_op_call *c)
{
    if (c->t[G_IN]->ndim < 1)
        return tk__err(TK_ERR_INVALID,
                       "%s: 'grad_input' has rank 0, want at least 1 (softmax is over the last "
                       "dimension)",
                       c->op->name);
    return check_plain(c);
}

static int cpu_softmax_bwd(const tk_op_call *c)
{
    smb_job j = {c->op->data != NULL, c->t[G_IN], c->t[G_OUT], c->t[G_X], 0};
    int64_t numel = tk_ops__numel(j.go);
    if (numel == 0)
        return TK_OK;
    j.d = j.go->shape[j.go->ndim - 1];
    tk_ops__parallel(numel / j.d, j.d * 12, smb_range, &j);
    return TK_OK;
}

/* ---- the table -------------------------------------------------------------------------------- */

#define GI(shp)                                                                                                        \
    {.name = "grad_input",                                                                                             \
     .kind = TK_ARG_TENSOR,                                                                                            \
     .role = TK_OPS_OUT,                                                                                               \
     .dtypes = TK_OPS_FLOATS,                                                                                          \
     .dtype_like = 1,                                                                                                  \
     .min_rank = 0,                                                                                                    \
     .max_rank = -1,                                                                                                   \
     .shape = shp,                                                                                                     \
     .doc = "the gradient of the forward's input"}
#define GO(shp, dc)                                                                                                    \
    {.name = "grad_out",                                                                                               \
     .kind = TK_ARG_TENSOR,                                                                                            \
     .role = TK_OPS_IN,                                                                                                \
     .dtypes = TK_OPS_FLOATS,                                                                                          \
     .dtype_like = -1,                                                                                                 \
     .min_rank = 0,                                                                                                    \
     .max_rank = -1,                                                                                                   \
     .shape = shp,                                                                                                     \
     .doc = dc}
#define XIN(nm, shp, dc)                                                                                               \
    {.name = nm,                                                                                                       \
     .kind = TK_ARG_TENSOR,                                                                                            \
     .role = TK_OPS_IN,                                                                                                \
     .dtypes = TK_OPS_FLOATS,                                                                                          \
     .dtype_like = 1,                                                                                                  \
     .min_rank = 0,                                                                                                    \
     .max_rank = -1,                                                                                                   \
     .shape = shp,                                                                                                     \
     .doc = dc}

static const tk_op_param plain_params[] = {
    GI("[...]"),
    GO("[...]", "the gradient of the forward's out (grad_input may be this tensor itself)"),
    XIN("input", "[...]", "the forward's input x"),
};
static const tk_op_param gated_params[] = {
    GI("[..., 2*d]"),
    GO("[..., d]", "the gradient of the forward's out"),
    XIN("input", "[..., 2*d]", "the forward's input: the two halves x[..., :d] and x[..., d:]"),
};
static const tk_op_param softmax_params[] = {
    GI("[..., d]"),
    GO("[..., d]", "the gradient of the forward's out (grad_input may be this tensor itself)"),
    XIN("out", "[..., d]", "the forward's out y"),
};

static const bact_info b_gelu = {gelu_f, gelu_d, 0, 0}, b_gelu_tanh = {gelu_tanh_f, gelu_tanh_d, 0, 0},
                       b_gelu_new = {NULL, gelu_new_d, 0, 0}, b_gelu_quick = {NULL, gelu_quick_d, 0, 0},
                       b_silu = {silu_f, silu_d, 0, 0}, b_tanh = {NULL, tanh_d, 0, 0},
                       b_silu_and_mul = {silu_f, silu_d, 1, 1}, b_mul_and_silu = {silu_f, silu_d, 1, 0},
                       b_gelu_and_mul = {gelu_f, gelu_d, 1, 1}, b_gelu_tanh_and_mul = {gelu_tanh_f, gelu_tanh_d, 1, 1};
static const int log_flag = 1;

#define PKG "kernels-community/training"
#define PLAIN(nm, summ, info) {nm, "activation", summ, plain_params, 3, check_plain, cpu_bact, &info, PKG}
#define GATED(nm, summ, info) {nm, "activation", summ, gated_params, 3, check_gated, cpu_bact, &info, PKG}

const tk_op_desc tk_ops__backward_act[] = {
    GATED("silu_and_mul_backward", "[a, b] = input: grad_input = [grad_out * b * silu'(a), grad_out * silu(a)]",
          b_silu_and_mul),
    GATED("mul_and_silu_backward", "[a, b] = input: grad_input = [grad_out * silu(b), grad_out * a * silu'(b)]",
          b_mul_and_silu),
    GATED("gelu_and_mul_backward", "[a, b] = input: grad_input = [grad_out * b * gelu'(a), grad_out * gelu(a)]",
          b_gelu_and_mul),
    GATED("gelu_tanh_and_mul_backward",
          "[a, b] = input: grad_input = [grad_out * b * gelu_tanh'(a), grad_out * gelu_tanh(a)]", b_gelu_tanh_and_mul),
    PLAIN("gelu_backward", "grad_input = grad_out * (Phi(x) + x phi(x))  (erf gelu)", b_gelu),
    PLAIN("gelu_tanh_backward", "grad_input = grad_out * gelu_tanh'(x)  (PyTorch's approximate='tanh')", b_gelu_tanh),
    PLAIN("gelu_new_backward", "grad_input = grad_out * gelu_new'(x)  (GPT-2)", b_gelu_new),
    PLAIN("gelu_fast_backward", "grad_input = grad_out * gelu_fast'(x)", b_gelu_new),
    PLAIN("gelu_quick_backward", "grad_input = grad_out * gelu_quick'(x)", b_gelu_quick),
    PLAIN("silu_backward", "grad_input = grad_out * s(x) (1 + x (1 - s(x))), s = sigmoid", b_silu),
    {"tanh_backward", "layers", "grad_input = grad_out * (1 - tanh(x)^2)", plain_params, 3, check_plain, cpu_bact,
     &b_tanh, "kernels-community/layers"},
    {"softmax_backward", "softmax", "y = the forward's out: grad_input = y * (grad_out - sum(grad_out * y, -1))",
     softmax_params, 3, check_softmax_bwd, cpu_softmax_bwd, NULL, PKG},
    {"log_softmax_backward", "softmax", "y = the forward's out: grad_input = grad_out - exp(y) * sum(grad_out, -1)",
     softmax_params, 3, check_softmax_bwd, cpu_softmax_bwd, &log_flag, PKG},
};
const size_t tk_ops__backward_act_count = sizeof tk_ops__backward_act / sizeof tk_ops__backward_act[0];
