/*
 * activation.c — the activation ops (the ops of kernels-community/activation): signatures, shape
 * checks and CPU references.
 *
 *   gated  input (..., 2d) -> out (..., d):  silu_and_mul, mul_and_silu, gelu_and_mul,
 *          gelu_tanh_and_mul, fatrelu_and_mul(threshold)
 *   plain  input (...) -> out (...):         gelu, gelu_tanh, silu, gelu_new, gelu_fast, gelu_quick
 *
 * Numerics: each element is converted to fp32, computed in fp32 with expf / erff / tanhf in exactly
 * the order of kernels-src/activation/activation.cuh, and rounded once to the output dtype. fp
 * contraction is off in this file so the compiler cannot fuse a multiply and an add the kernel keeps
 * apart. Strided tensors are read and written through their strides.
 */
#include <math.h>

#include "ops/ops.h"

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

/* The constants of activation.cuh, as the same decimal literals. */
#define SQRT1_2 0.70710678118654752440f   /* 1/sqrt(2) */
#define SQRT_2_PI 0.79788456080286535588f /* sqrt(2/pi) */
#define KAPPA 0.044715f
#define GELU_NEW_C 0.79788456f
#define QUICK 1.702f

static float silu(float x, float p)
{
    (void)p;
    return x / (1.0f + expf(-x));
}

static float gelu(float x, float p)
{
    (void)p;
    return (x * 0.5f) * (1.0f + erff(x * SQRT1_2));
}

static float gelu_tanh(float x, float p)
{
    (void)p;
    float x3 = (x * x) * x;
    float inner = SQRT_2_PI * (x + KAPPA * x3);
    return (0.5f * x) * (1.0f + tanhf(inner));
}

static float gelu_new(float x, float p)
{
    (void)p;
    float x3 = (x * x) * x;
    float t = tanhf(GELU_NEW_C * (x + KAPPA * x3));
    return (0.5f * x) * (1.0f + t);
}

static float gelu_fast(float x, float p)
{
    (void)p;
    float inner = 1.0f + (KAPPA * x) * x;
    float t = tanhf((x * GELU_NEW_C) * inner);
    return (0.5f * x) * (1.0f + t);
}

static float gelu_quick(float x, float p)
{
    (void)p;
    return x / (1.0f + expf(-QUICK * x));
}

static float fatrelu(float x, float threshold) { return x > threshold ? x : 0.0f; }

typedef struct {
    float (*f)(float x, float param);
    int gated;     /* input (..., 2d) -> out (..., d) */
    int act_first; /* gated: act(x[:d]) * x[d:]; else x[:d] * act(x[d:]) */
    int param;     /* index of a scalar parameter passed to f, or -1 */
} act_info;

/* ---- shape checks ----------------------------------------------------------------------------- */

static int check_gated(const tk_op_call *c)
{
    const tk_tensor *out = c->t[0], *in = c->t[1];
    int64_t last = in->shape[in->ndim - 1];
    if (last % 2)
        return tk__err(TK_ERR_INVALID, "%s: 'input' has shape %s: its last dimension must be even (2*d)", c->op->name,
                       tk_ops__shape_fmt(in->ndim, in->shape));
    int64_t want[TK_OPS_MAX_RANK];
    for (int32_t k = 0; k < in->ndim; k++)
        want[k] = in->shape[k];
    want[in->ndim - 1] = last / 2;
    int same = out->ndim == in->ndim;
    for (int32_t k = 0; same && k < in->ndim; k++)
        same = out->shape[k] == want[k];
    if (!same)
        return tk__err(TK_ERR_INVALID, "%s: 'out' has shape %s, want %s (input %s halves its last dimension)",
                       c->op->name, tk_ops__shape_fmt(out->ndim, out->shape), tk_ops__shape_fmt(in->ndim, want),
                       tk_ops__shape_fmt(in->ndim, in->shape));
    return TK_OK;
}

/* ---- CPU references --------------------------------------------------------------------------- */

#define BLK 1024 /* columns per work item: the scratch rows live on the stack */

typedef struct {
    const act_info *act;
    float param;
    const tk_tensor *out, *in;
    int64_t d;    /* columns of out */
    int64_t nblk; /* column blocks per row */
} act_job;

static void act_range(void *arg, int64_t lo, int64_t hi)
{
    const act_job *j = arg;
    const act_info *a = j->act;
    float x[BLK], y[BLK];
    void *ob = tk_ops__base(j->out);
    const void *ib = tk_ops__base(j->in);
    int64_t ocs = tk_ops__col_stride(j->out), ics = tk_ops__col_stride(j->in);
    for (int64_t it = lo; it < hi; it++) {
        int64_t r = it / j->nblk, c0 = (it % j->nblk) * BLK;
        int64_t n = j->d - c0 < BLK ? j->d - c0 : BLK;
        int64_t io = tk_ops__row_offset(j->in, r), oo = tk_ops__row_offset(j->out, r);
        tk_ops__load_f32(x, ib, io + c0 * ics, ics, n, j->in->dtype);
        if (a->gated) {
            tk_ops__load_f32(y, ib, io + (j->d + c0) * ics, ics, n, j->in->dtype);
            if (a->act_first)
                for (int64_t i = 0; i < n; i++)
                    x[i] = a->f(x[i], j->param) * y[i];
            else
                for (int64_t i = 0; i < n; i++)
                    x[i] = x[i] * a->f(y[i], j->param);
        } else {
            for (int64_t i = 0; i < n; i++)
                x[i] = a->f(x[i], j->param);
        }
        tk_ops__store_f32(ob, oo + c0 * ocs, ocs, x, n, j->out->dtype);
    }
}

static int cpu_act(const tk_op_call *c)
{
    const act_info *a = c->op->data;
    act_job j = {a, a->param >= 0 ? (float)c->f[a->param] : 0.0f, c->t[0], c->t[1], 0, 0};
    j.d = j.out->ndim ? j.out->shape[j.out->ndim - 1] : 1;
    int64_t numel = tk_ops__numel(j.out);
    if (numel == 0)
        return TK_OK;
    j.nblk = (j.d + BLK - 1) / BLK;
    int64_t rows = numel / j.d;
    /* Work items are (row, column block) pairs, so one long row is split over threads too. */
    tk_ops__parallel(rows * j.nblk, (j.d < BLK ? j.d : BLK) * (a->gated ? 24 : 16), act_range, &j);
    return TK_OK;
}

/* ---- the table -------------------------------------------------------------------------------- */

#define OUT_GATED                                                                                                      \
    {.name = "out",                                                                                                    \
     .kind = TK_ARG_TENSOR,                                                                                            \
     .role = TK_OPS_OUT,                                                                                               \
     .dtypes = TK_OPS_FLOATS,                                                                                          \
     .dtype_like = 1,                                                                                                  \
     .min_rank = 1,                                                                                                    \
     .max_rank = -1,                                                                                                   \
     .shape = "[..., d]",                                                                                              \
     .doc = "the result"}
#define IN_GATED                                                                                                       \
    {.name = "input",                                                                                                  \
     .kind = TK_ARG_TENSOR,                                                                                            \
     .role = TK_OPS_IN,                                                                                                \
     .dtypes = TK_OPS_FLOATS,                                                                                          \
     .dtype_like = -1,                                                                                                 \
     .min_rank = 1,                                                                                                    \
     .max_rank = -1,                                                                                                   \
     .shape = "[..., 2*d]",                                                                                            \
     .doc = "the two halves x[..., :d] and x[..., d:]"}
#define OUT_PLAIN                                                                                                      \
    {.name = "out",                                                                                                    \
     .kind = TK_ARG_TENSOR,                                                                                            \
     .role = TK_OPS_OUT,                                                                                               \
     .dtypes = TK_OPS_FLOATS,                                                                                          \
     .dtype_like = 1,                                                                                                  \
     .min_rank = 0,                                                                                                    \
     .max_rank = -1,                                                                                                   \
     .shape = "[...]",                                                                                                 \
     .doc = "the result (may be 'input' itself)"}
#define IN_PLAIN                                                                                                       \
    {.name = "input",                                                                                                  \
     .kind = TK_ARG_TENSOR,                                                                                            \
     .role = TK_OPS_IN,                                                                                                \
     .dtypes = TK_OPS_FLOATS,                                                                                          \
     .dtype_like = -1,                                                                                                 \
     .min_rank = 0,                                                                                                    \
     .max_rank = -1,                                                                                                   \
     .shape = "[...]",                                                                                                 \
     .doc = "x"}

static const tk_op_param gated_params[] = {OUT_GATED, IN_GATED};
static const tk_op_param fatrelu_params[] = {
    OUT_GATED,
    IN_GATED,
    TK_OPS_SCALAR("threshold", TK_ARG_F64, 0.0, "x[..., :d] values not above it become 0 (rounded to f32)"),
};
static const tk_op_param plain_params[] = {OUT_PLAIN, IN_PLAIN};

static const act_info a_silu_and_mul = {silu, 1, 1, -1};
static const act_info a_mul_and_silu = {silu, 1, 0, -1};
static const act_info a_gelu_and_mul = {gelu, 1, 1, -1};
static const act_info a_gelu_tanh_and_mul = {gelu_tanh, 1, 1, -1};
static const act_info a_fatrelu_and_mul = {fatrelu, 1, 1, 2};
static const act_info a_gelu = {gelu, 0, 0, -1};
static const act_info a_gelu_tanh = {gelu_tanh, 0, 0, -1};
static const act_info a_silu = {silu, 0, 0, -1};
static const act_info a_gelu_new = {gelu_new, 0, 0, -1};
static const act_info a_gelu_fast = {gelu_fast, 0, 0, -1};
static const act_info a_gelu_quick = {gelu_quick, 0, 0, -1};

#define PKG "kernels-community/activation"
#define GATED(nm, summ, params, info)                                                                                  \
    {nm, "activation", summ, params, sizeof params / sizeof params[0], check_gated, cpu_act, &info, PKG}
#define PLAIN(nm, summ, info)                                                                                          \
    {nm, "activation", summ, plain_params, 2, tk_ops__check_out_like_input, cpu_act, &info, PKG}

const tk_op_desc tk_ops__activation[] = {
    GATED("silu_and_mul", "out = silu(x[..., :d]) * x[..., d:]  (SwiGLU)", gated_params, a_silu_and_mul),
    GATED("mul_and_silu", "out = x[..., :d] * silu(x[..., d:])", gated_params, a_mul_and_silu),
    GATED("gelu_and_mul", "out = gelu(x[..., :d]) * x[..., d:]  (GeGLU, erf gelu)", gated_params, a_gelu_and_mul),
    GATED("gelu_tanh_and_mul", "out = gelu_tanh(x[..., :d]) * x[..., d:]", gated_params, a_gelu_tanh_and_mul),
    GATED("fatrelu_and_mul", "out = (x > threshold ? x : 0)[..., :d] * x[..., d:]", fatrelu_params, a_fatrelu_and_mul),
    PLAIN("gelu", "out = 0.5 x (1 + erf(x / sqrt 2))", a_gelu),
    PLAIN("gelu_tanh", "out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))", a_gelu_tanh),
    PLAIN("silu", "out = x / (1 + exp(-x))", a_silu),
    PLAIN("gelu_new", "out = 0.5 x (1 + tanh(0.79788456 (x + 0.044715 x^3)))  (GPT-2)", a_gelu_new),
    PLAIN("gelu_fast", "out = 0.5 x (1 + tanh(0.79788456 x (1 + 0.044715 x^2)))", a_gelu_fast),
    PLAIN("gelu_quick", "out = x / (1 + exp(-1.702 x))", a_gelu_quick),
};
const size_t tk_ops__activation_count = sizeof tk_ops__activation / sizeof tk_ops__activation[0];
