/*
 * cases.c — the self-test's cases for every standard op (ops/selftest.h): small shapes with the
 * edges kernels get wrong first (one row, a row length that is no multiple of a block or a vector, the
 * largest head size a kernel declares), each option a kernel may take (causal, windows, softcap,
 * ALiBi, varlen, GQA, label smoothing, per-row sampling parameters ...), in every dtype the kernel
 * takes, with the tolerances and the comparison.
 *
 * A case is host tensors and scalars; inputs are random from a seed fixed by the op, the case index
 * and the dtypes (so a run is reproducible and a CPU reference can be shared by the kernels of one
 * package that see the same case). Outputs start as 0xff bytes on both sides (NaN in every float
 * dtype, -1 in integers): an element a kernel never writes cannot pass. In-place and accumulated
 * tensors start from random values. Shapes stay small: the whole self-test of a package is meant to
 * cost about a second on a GPU, most of it the CPU references (attention at head size 512 is the
 * largest: 17 x 33 x 4 x 512).
 *
 * What a kernel takes decides the cases: its dtypes fix each tensor's dtype, its constraints pin
 * bounded dimensions ("q.shape[3]": 64 .. 64 for a d64 kernel), and a case that needs a parameter
 * the kernel lacks is TK_ERR_UNSUPPORTED (skipped for that kernel).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/selftest.h"

static const tk_dtype DT_F32 = {TK_DL_FLOAT, 32, 1}, DT_F64 = {TK_DL_FLOAT, 64, 1}, DT_I32 = {TK_DL_INT, 32, 1},
                      DT_I64 = {TK_DL_INT, 64, 1}, DT_I8 = {TK_DL_INT, 8, 1};

/* ---- randomness --------------------------------------------------------------------------------- */

static uint64_t next_u64(tk_ops_case *c)
{
    uint64_t z = (c->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double unif(tk_ops_case *c, double lo, double hi)
{
    return lo + (hi - lo) * ((double)(next_u64(c) >> 11) * 0x1.0p-53);
}

/* An integer in [lo, hi]. */
static int64_t irand(tk_ops_case *c, int64_t lo, int64_t hi)
{
    return lo + (int64_t)(next_u64(c) % (uint64_t)(hi - lo + 1));
}

/* ---- what the kernel takes ------------------------------------------------------------------------ */

static const tk_ops_case_param *kparam(const tk_ops_case_spec *s, const char *name)
{
    for (size_t i = 0; s->params && i < s->nparams; i++)
        if (!strcmp(s->params[i].name, name))
            return &s->params[i];
    return NULL;
}

static int takes(const tk_ops_case_spec *s, const char *name) { return !s->params || kparam(s, name) != NULL; }

/* The dtype the kernel gives tensor `name`, else dflt. */
static tk_dtype dt_of(const tk_ops_case_spec *s, const char *name, tk_dtype dflt)
{
    const tk_ops_case_param *p = kparam(s, name);
    return p && p->has_dtype ? p->dtype : dflt;
}

/* want, moved into the bounds the kernel's constraints put on dimension dim of tensor `name` (of
 * rank `rank`; a pin's dim may count from either end). */
static int64_t pin(const tk_ops_case_spec *s, const char *name, int dim, int rank, int64_t want)
{
    for (size_t i = 0; s->pins && i < s->npins; i++) {
        const tk_ops_case_pin *p = &s->pins[i];
        if (strcmp(p->param, name) != 0 || (p->dim != dim && p->dim != dim - rank && p->dim + rank != dim))
            continue;
        if (want < p->lo)
            want = p->lo;
        if (p->hi >= 0 && want > p->hi)
            want = p->hi;
    }
    return want;
}

/* The largest value the kernel declares for that dimension (at most cap: a bound meant as "no
 * limit" stays a small case), else dflt. */
static int64_t pin_max(const tk_ops_case_spec *s, const char *name, int dim, int rank, int64_t dflt, int64_t cap)
{
    int64_t best = -1;
    for (size_t i = 0; s->pins && i < s->npins; i++) {
        const tk_ops_case_pin *p = &s->pins[i];
        if (!strcmp(p->param, name) && (p->dim == dim || p->dim == dim - rank || p->dim + rank == dim) && p->hi >= 0)
            best = best < 0 || p->hi < best ? p->hi : best;
    }
    return best >= 0 ? (best < cap ? best : cap) : dflt;
}

/* ---- building a case ------------------------------------------------------------------------------ */

size_t tk_ops__case_bytes(const tk_ops_case_tensor *t)
{
    return (size_t)tk_ops__numel(&t->t) * tk_ops__dtype_size(t->t.dtype);
}

/* Makes *t tensor `name`: zeros, or 0xff bytes for an output. 0 when out of memory. */
static int init_t(tk_ops_case_tensor *t, const char *name, tk_dtype dt, int role, int ndim, const int64_t *shape)
{
    memset(t, 0, sizeof *t);
    t->name = name;
    t->role = role;
    t->exact = dt.code == TK_DL_INT || dt.code == TK_DL_UINT;
    if (ndim > 0)
        memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    t->t.ndim = ndim;
    t->t.shape = t->shape;
    t->t.dtype = dt;
    t->t.device.device_type = TK_DEV_CPU;
    size_t bytes = tk_ops__case_bytes(t);
    if (!(t->t.data = malloc(bytes ? bytes : 1)))
        return 0;
    memset(t->t.data, role == TK_CASE_OUT ? 0xff : 0, bytes);
    return 1;
}

/* Adds tensor `name` to the case (init_t). NULL when out of room or memory (the case is then failed
 * with TK_ERR_NOMEM by the caller's check of c->nt). */
static tk_ops_case_tensor *add_t(tk_ops_case *c, const char *name, tk_dtype dt, int role, int ndim,
                                 const int64_t *shape)
{
    if (c->nt >= TK_OPS_CASE_MAX || ndim > TK_OPS_MAX_RANK || !init_t(&c->t[c->nt], name, dt, role, ndim, shape))
        return NULL;
    return &c->t[c->nt++];
}

/* A tensor outside the case: a forward's input, which only the case's inputs are computed from (free
 * its t.data). 0 when out of memory. */
static int tmp_t(tk_ops_case_tensor *t, const char *name, tk_dtype dt, int ndim, const int64_t *shape)
{
    return ndim <= TK_OPS_MAX_RANK && init_t(t, name, dt, TK_CASE_IN, ndim, shape);
}

#define SH(...)                                                                                                        \
    (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (const int64_t[]) { __VA_ARGS__ }
#define T(c, name, dt, role, ...) add_t(c, name, dt, role, SH(__VA_ARGS__))

static void set_f(tk_ops_case_tensor *t, int64_t i, double v)
{
    float f = (float)v;
    if (t->t.dtype.code == TK_DL_INT && t->t.dtype.bits == 32)
        ((int32_t *)t->t.data)[i] = (int32_t)v;
    else if (t->t.dtype.code == TK_DL_INT && t->t.dtype.bits == 64)
        ((int64_t *)t->t.data)[i] = (int64_t)v;
    else
        tk_ops__store_f32(t->t.data, i, 1, &f, 1, t->t.dtype);
}

static double get_f(const tk_ops_case_tensor *t, int64_t i)
{
    if (t->t.dtype.code == TK_DL_INT && t->t.dtype.bits == 32)
        return ((const int32_t *)t->t.data)[i];
    if (t->t.dtype.code == TK_DL_INT && t->t.dtype.bits == 64)
        return (double)((const int64_t *)t->t.data)[i];
    if (t->t.dtype.code == TK_DL_FLOAT && t->t.dtype.bits == 64)
        return ((const double *)t->t.data)[i];
    float f;
    tk_ops__load_f32(&f, t->t.data, i, 1, 1, t->t.dtype);
    return f;
}

/* Uniform values in [lo, hi], stored in the tensor's dtype (8-bit codes saturate): one conversion for
 * the whole tensor (the cases' largest fills are KV caches). */
static void fill(tk_ops_case *c, tk_ops_case_tensor *t, double lo, double hi)
{
    int64_t n = t ? tk_ops__numel(&t->t) : 0;
    int is_int = t && (t->t.dtype.code == TK_DL_INT || t->t.dtype.code == TK_DL_UINT) && t->t.dtype.bits > 8;
    float *v = n && !is_int ? malloc((size_t)n * sizeof *v) : NULL;
    if (!v) { /* integers (or no memory for the batch): one at a time */
        for (int64_t i = 0; i < n; i++)
            set_f(t, i, unif(c, lo, hi));
        return;
    }
    for (int64_t i = 0; i < n; i++)
        v[i] = (float)unif(c, lo, hi);
    tk_ops__store_f32(t->t.data, 0, 1, v, n, t->t.dtype);
    free(v);
}

/* Random integers in [lo, hi]. */
static void fill_int(tk_ops_case *c, tk_ops_case_tensor *t, int64_t lo, int64_t hi)
{
    for (int64_t i = 0, n = t ? tk_ops__numel(&t->t) : 0; i < n; i++)
        set_f(t, i, (double)irand(c, lo, hi));
}

/* Codes of an 8-bit table (i8, fp8): random bytes over the whole range they hold, never a NaN or inf
 * code (e4m3fn: S.1111.111; e5m2: S.11111.xx) nor i8's -128 (outside symmetric quantisation). */
static void fill_codes(tk_ops_case *c, tk_ops_case_tensor *t)
{
    uint8_t *b = t ? t->t.data : NULL;
    for (int64_t i = 0, n = t ? tk_ops__numel(&t->t) : 0; i < n; i++) {
        uint8_t x;
        do
            x = (uint8_t)(next_u64(c) >> 56);
        while (t->t.dtype.code == TK_DL_FLOAT8_E4M3FN ? (x & 0x7f) == 0x7f
               : t->t.dtype.code == TK_DL_FLOAT8_E5M2 ? (x & 0x7c) == 0x7c
                                                      : x == 0x80);
        b[i] = x;
    }
}

static void sc_add(tk_ops_case *c, const char *name, int kind, int64_t i, double f)
{
    if (c->ns >= TK_OPS_CASE_MAX)
        return;
    c->s[c->ns].name = name;
    c->s[c->ns].kind = kind;
    c->s[c->ns].i = i;
    c->s[c->ns].f = f;
    c->ns++;
}

/* 1 when scalar `name` = v is inside the bounds the kernel's constraints put on it ("thresholding":
 * min 1 for the thresholding kernels, max 0 for the others). */
static int scalar_fits(const tk_ops_case_spec *s, const char *name, double v)
{
    for (size_t i = 0; s->pins && i < s->npins; i++) {
        const tk_ops_case_pin *p = &s->pins[i];
        if (p->dim == TK_OPS_CASE_PIN_SCALAR && !strcmp(p->param, name) && !(v >= (double)p->lo && v <= (double)p->hi))
            return 0;
    }
    return 1;
}

/* A scalar option: given when the kernel takes it; a value other than the op's default that the
 * kernel cannot take, or one outside its constraints, makes the case not apply (*na). */
static void opt_i(tk_ops_case *c, const tk_ops_case_spec *s, const char *name, int64_t v, int *na)
{
    int idx = tk_ops__param_index(c->op, name);
    if (takes(s, name))
        sc_add(c, name, TK_ARG_I64, v, 0);
    else if (idx < 0 || v != (int64_t)c->op->params[idx].def)
        *na = 1;
    if (!scalar_fits(s, name, (double)v))
        *na = 1;
}

static void opt_f(tk_ops_case *c, const tk_ops_case_spec *s, const char *name, double v, int *na)
{
    int idx = tk_ops__param_index(c->op, name);
    if (takes(s, name))
        sc_add(c, name, TK_ARG_F64, 0, v);
    else if (idx < 0 || v != c->op->params[idx].def)
        *na = 1;
    if (!scalar_fits(s, name, v))
        *na = 1;
}

/* An optional tensor the case wants: added when the kernel takes it, else NULL (and, when `needed`,
 * the case does not apply). */
static tk_ops_case_tensor *opt_t(tk_ops_case *c, const tk_ops_case_spec *s, int needed, int *na, const char *name,
                                 tk_dtype dt, int role, int ndim, const int64_t *shape)
{
    if (!takes(s, name)) {
        *na |= needed;
        return NULL;
    }
    return add_t(c, name, dt, role, ndim, shape);
}
#define OPT(c, s, needed, na, name, dt, role, ...) opt_t(c, s, needed, na, name, dt, role, SH(__VA_ARGS__))

static void label(tk_ops_case *c, const char *fmt, ...) TK_PRINTF(2, 3);
static void label(tk_ops_case *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->label, sizeof c->label, fmt, ap);
    va_end(ap);
}

/* The dtype of float tensor `name` in a case: the kernel's, else the spec's primary dtype when the
 * op allows it there, else the first float dtype it allows (f32 first). */
static tk_dtype fdt_op(const tk_op_desc *op, const tk_ops_case_spec *s, const char *name)
{
    const tk_ops_case_param *kp = kparam(s, name);
    if (kp && kp->has_dtype)
        return kp->dtype;
    int idx = tk_ops__param_index(op, name);
    while (idx >= 0 && op->params[idx].dtype_like >= 0)
        idx = op->params[idx].dtype_like;
    unsigned allowed = idx >= 0 ? op->params[idx].dtypes : TK_OPS_FLOATS;
    if (tk_ops__dtype_bit(s->dtype) & allowed & TK_OPS_FLOATS)
        return s->dtype;
    static const tk_dtype order[] = {{TK_DL_FLOAT, 32, 1}, {TK_DL_BFLOAT, 16, 1}, {TK_DL_FLOAT, 16, 1}};
    for (size_t i = 0; i < 3; i++)
        if (tk_ops__dtype_bit(order[i]) & allowed)
            return order[i];
    return DT_F32;
}
#define fdt(s, name) fdt_op(c->op, s, name)

static int is_8bit(tk_dtype d) { return d.bits == 8; }

/* How many cases a generator's (variants x sizes) table spans: index -> (variant v, size z). */
static int split(size_t index, size_t nvar, size_t nsize, size_t *v, size_t *z)
{
    if (index >= nvar * nsize)
        return 0;
    *v = index / nsize;
    *z = index % nsize;
    return 1;
}

#define END TK_ERR_NOT_FOUND
#define NA TK_ERR_UNSUPPORTED

/* ---- activations, pointwise layers ------------------------------------------------------------- */

static const int64_t ROWS_D[][2] = {{1, 1}, {3, 7}, {2, 1000}, {1, 4099}};
#define NROWS_D (sizeof ROWS_D / sizeof ROWS_D[0])

/* silu_and_mul & co.: out [rows, d], input [rows, 2d]; fatrelu also with a threshold. */
static int gen_gated(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    size_t v, z;
    int na = 0, fat = !strcmp(c->op->name, "fatrelu_and_mul");
    if (!split(index, fat ? 2 : 1, NROWS_D, &v, &z))
        return END;
    int64_t r = ROWS_D[z][0], d = ROWS_D[z][1];
    tk_dtype dt = fdt(s, "input");
    T(c, "out", dt, TK_CASE_OUT, r, d);
    fill(c, T(c, "input", dt, TK_CASE_IN, r, 2 * d), -6, 6);
    if (v == 1)
        opt_f(c, s, "threshold", 0.5, &na);
    label(c, "%s %s [%lld, %lld]%s", c->op->name, tk_ops__dtype_str(dt), (long long)r, (long long)(2 * d),
          v ? " threshold 0.5" : "");
    return na ? NA : TK_OK;
}

/* gelu, silu, tanh & co.: out and input of one shape. */
static int gen_pointwise(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    if (index >= NROWS_D)
        return END;
    int64_t r = ROWS_D[index][0], d = ROWS_D[index][1];
    tk_dtype dt = fdt(s, "input");
    T(c, "out", dt, TK_CASE_OUT, r, d);
    fill(c, T(c, "input", dt, TK_CASE_IN, r, d), -6, 6);
    label(c, "%s %s [%lld, %lld]", c->op->name, tk_ops__dtype_str(dt), (long long)r, (long long)d);
    return TK_OK;
}

static int gen_softcap(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    int rc = gen_pointwise(c, index, s);
    if (rc == TK_OK)
        sc_add(c, "cap", TK_ARG_F64, 0, 3.0);
    return rc;
}

/* moe: T tokens, E experts, top_k, I, H; variants: Mixtral's (renormalised), Qwen2-MoE's (no renorm,
 * rounded weights, a gated shared expert, the routing outputs), DiffusionGemma's (its own router input,
 * per-expert scales, gelu_tanh). Router weights are large enough that routing is decisive. */
static int gen_moe(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    static const int64_t sz[][5] = {{1, 4, 2, 8, 16}, {13, 8, 2, 24, 40}, {9, 6, 6, 16, 32}}; /* T, E, K, I, H */
    size_t v, z;
    int na = 0;
    if (!split(index, 3, 3, &v, &z))
        return END;
    int64_t t = sz[z][0], e = sz[z][1], k = sz[z][2], i = sz[z][3], h = sz[z][4];
    tk_dtype dt = fdt(s, "input");
    T(c, "out", dt, TK_CASE_OUT, t, h);
    fill(c, T(c, "input", dt, TK_CASE_IN, t, h), -1, 1);
    fill(c, T(c, "router_weight", dt, TK_CASE_IN, e, h), -1, 1);
    fill(c, T(c, "gate_up", dt, TK_CASE_IN, e, 2 * i, h), -0.5, 0.5);
    fill(c, T(c, "down", dt, TK_CASE_IN, e, h, i), -0.5, 0.5);
    sc_add(c, "top_k", TK_ARG_I64, k, 0);
    opt_i(c, s, "norm_topk_prob", v != 1, &na);
    if (v == 1) {
        opt_i(c, s, "round_weights", 1, &na);
        fill(c, OPT(c, s, 1, &na, "shared_gate_up", dt, TK_CASE_IN, 2 * i + 2, h), -0.5, 0.5);
        fill(c, OPT(c, s, 1, &na, "shared_down", dt, TK_CASE_IN, h, i + 1), -0.5, 0.5);
        fill(c, OPT(c, s, 1, &na, "shared_gate", dt, TK_CASE_IN, 1, h), -1, 1);
        OPT(c, s, 0, &na, "topk_ids", DT_I32, TK_CASE_OUT, t, k);
        OPT(c, s, 0, &na, "topk_weights", DT_F32, TK_CASE_OUT, t, k);
    } else if (v == 2) {
        opt_i(c, s, "activation", 1, &na);
        fill(c, OPT(c, s, 1, &na, "router_input", dt, TK_CASE_IN, t, h), -1, 1);
        fill(c, OPT(c, s, 1, &na, "expert_scale", dt, TK_CASE_IN, e), 0.5, 1.5);
    }
    c->tol_factor = 4;
    static const char *const what[] = {"", " shared expert", " router_input expert_scale gelu_tanh"};
    label(c, "moe %s T %lld E %lld top_k %lld I %lld H %lld%s", tk_ops__dtype_str(dt), (long long)t, (long long)e,
          (long long)k, (long long)i, (long long)h, what[v]);
    return na ? NA : TK_OK;
}

static int gen_add(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    if (index >= NROWS_D)
        return END;
    int64_t r = ROWS_D[index][0], d = ROWS_D[index][1];
    tk_dtype dt = fdt(s, "a");
    T(c, "out", dt, TK_CASE_OUT, r, d);
    fill(c, T(c, "a", dt, TK_CASE_IN, r, d), -4, 4);
    fill(c, T(c, "b", dt, TK_CASE_IN, r, d), -4, 4);
    label(c, "add %s [%lld, %lld]", tk_ops__dtype_str(dt), (long long)r, (long long)d);
    return TK_OK;
}

/* The activation backwards (silu_backward & co., tanh_backward): grad_input from grad_out and the
 * forward's input; the gated ones (silu_and_mul_backward & co.) take input and give grad_input
 * [rows, 2d] for grad_out [rows, d]. The inputs reach both tails of each derivative. */
static int gen_act_backward(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    int gated = strstr(c->op->name, "_and_") != NULL;
    if (index >= NROWS_D)
        return END;
    int64_t r = ROWS_D[index][0], d = ROWS_D[index][1], w = gated ? 2 * d : d;
    tk_dtype dt = fdt(s, "grad_out");
    T(c, "grad_input", dt, TK_CASE_OUT, r, w);
    fill(c, T(c, "grad_out", dt, TK_CASE_IN, r, d), -2, 2);
    fill(c, T(c, "input", dt, TK_CASE_IN, r, w), -6, 6);
    label(c, "%s %s grad_out [%lld, %lld] input [%lld, %lld]", c->op->name, tk_ops__dtype_str(dt), (long long)r,
          (long long)d, (long long)r, (long long)w);
    return TK_OK;
}

/* ---- norms ----------------------------------------------------------------------------------------- */

static const int64_t NORM_RD[][2] = {{1, 8}, {3, 7}, {4, 1000}, {2, 4096}};
#define NNORM (sizeof NORM_RD / sizeof NORM_RD[0])

/* rms_norm, layer_norm and their fused_add_ forms; with a bias where the op has one (v 1), and the
 * RMS forms with an f32 weight over 16-bit x where the kernel's weight dtype is not fixed (v 1: the
 * CPU implementations; a kernel declaring an f32 weight gets it in v 0). */
static int gen_norm(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    const char *n = c->op->name;
    int fused = !strncmp(n, "fused_add_", 10), ln = strstr(n, "layer_norm") != NULL, na = 0;
    size_t v, z;
    if (!split(index, 2, NNORM, &v, &z))
        return END;
    int64_t r = NORM_RD[z][0], d = NORM_RD[z][1];
    tk_dtype dt = fdt(s, "input"), wdt = dt_of(s, "weight", dt);
    const tk_ops_case_param *kw = kparam(s, "weight");
    if (!ln && v == 1 && (dt.bits == 32 || (kw && kw->has_dtype)))
        return NA;
    if (!ln && v == 1)
        wdt = DT_F32;
    if (!fused)
        T(c, "out", dt, TK_CASE_OUT, r, d);
    fill(c, T(c, "input", dt, fused ? TK_CASE_INOUT : TK_CASE_IN, r, d), -3, 3);
    if (fused)
        fill(c, T(c, "residual", dt, TK_CASE_INOUT, r, d), -3, 3);
    fill(c, T(c, "weight", wdt, TK_CASE_IN, d), 0.5, 1.5);
    if (ln && v == 1)
        fill(c, OPT(c, s, 1, &na, "bias", dt, TK_CASE_IN, d), -1, 1);
    c->tol_factor = 2;
    label(c, "%s %s [%lld, %lld]%s%s", n, tk_ops__dtype_str(dt), (long long)r, (long long)d, ln && v ? " bias" : "",
          wdt.bits != dt.bits ? " f32 weight" : "");
    return na ? NA : TK_OK;
}

/* The backward of the four norms: grad_input and grad_weight (and grad_bias) from random grads. */
static int gen_norm_backward(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    const char *n = c->op->name;
    int fused = !strncmp(n, "fused_add_", 10), ln = strstr(n, "layer_norm") != NULL, na = 0;
    size_t v, z;
    if (!split(index, ln ? 2 : 1, NNORM, &v, &z))
        return END;
    int64_t r = NORM_RD[z][0], d = NORM_RD[z][1];
    tk_dtype dt = fdt(s, "grad_out");
    T(c, "grad_input", dt, TK_CASE_OUT, r, d);
    T(c, "grad_weight", dt, TK_CASE_OUT, d);
    if (v == 1)
        OPT(c, s, 1, &na, "grad_bias", dt, TK_CASE_OUT, d);
    fill(c, T(c, "grad_out", dt, TK_CASE_IN, r, d), -1, 1);
    if (fused) {
        fill(c, T(c, "grad_residual", dt, TK_CASE_IN, r, d), -1, 1);
        fill(c, T(c, "residual", dt, TK_CASE_IN, r, d), -3, 3);
    } else {
        fill(c, T(c, "input", dt, TK_CASE_IN, r, d), -3, 3);
    }
    fill(c, T(c, "weight", dt, TK_CASE_IN, d), 0.5, 1.5);
    c->tol_factor = 4; /* grad_weight sums over rows */
    label(c, "%s %s [%lld, %lld]%s", n, tk_ops__dtype_str(dt), (long long)r, (long long)d, v ? " grad_bias" : "");
    return na ? NA : TK_OK;
}

/* rms_norm split over ranks: rms_norm_sumsq of the rows, and rms_norm_by_sumsq of d columns of rows of
 * 2d (the sums of squares of those rows, so the mean square is about that of x), with the width given
 * (v 0) or left out (v 1: the part is the row), and an f32 weight over 16-bit x as gen_norm (v 2). */
static int gen_norm_split(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    const char *n = c->op->name;
    int by = !strcmp(n, "rms_norm_by_sumsq"), na = 0;
    size_t v, z;
    if (!split(index, by ? 3 : 1, NNORM, &v, &z))
        return END;
    int64_t r = NORM_RD[z][0], d = NORM_RD[z][1];
    tk_dtype dt = fdt(s, "input"), wdt = dt_of(s, "weight", dt);
    const tk_ops_case_param *kw = kparam(s, "weight");
    if (v == 2 && (dt.bits == 32 || (kw && kw->has_dtype)))
        return NA;
    if (v == 2)
        wdt = DT_F32;
    if (!by) {
        tk_ops_case_tensor *o = T(c, "out", DT_F32, TK_CASE_OUT, r);
        if (o) { /* sums of d positive squares: relative to each, as rounding in f32 leaves them */
            o->rtol = 2e-6;
            o->atol = 1e-30;
        }
        fill(c, T(c, "input", dt, TK_CASE_IN, r, d), -3, 3);
        label(c, "%s %s [%lld, %lld]", n, tk_ops__dtype_str(dt), (long long)r, (long long)d);
        return TK_OK;
    }
    T(c, "out", dt, TK_CASE_OUT, r, d);
    fill(c, T(c, "input", dt, TK_CASE_IN, r, d), -3, 3);
    fill(c, T(c, "weight", wdt, TK_CASE_IN, d), 0.5, 1.5);
    fill(c, T(c, "sumsq", DT_F32, TK_CASE_IN, r), 2.0 * (double)d, 4.0 * (double)d);
    opt_i(c, s, "width", v == 1 ? 0 : 2 * d, &na);
    c->tol_factor = 2;
    label(c, "%s %s [%lld, %lld] width %lld%s", n, tk_ops__dtype_str(dt), (long long)r, (long long)d,
          (long long)(v == 1 ? d : 2 * d), wdt.bits != dt.bits ? " f32 weight" : "");
    return na ? NA : TK_OK;
}

/* ---- rotary and positions ------------------------------------------------------------------------- */

/* rotary_embedding: query [T, Hq, hs], key [T, Hkv, hs] in place; full and partial rotary, NeoX and
 * GPT-J pairing. rotary_embedding_backward: the same on grad_query and grad_key. */
static int gen_rotary(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    static const int64_t sz[][4] = {{1, 1, 1, 64}, {5, 4, 2, 128}, {3, 2, 1, 256}}; /* T, Hq, Hkv, hs */
    size_t v, z;
    int na = 0, bwd = strstr(c->op->name, "_backward") != NULL;
    const char *qn = bwd ? "grad_query" : "query", *kn = bwd ? "grad_key" : "key";
    if (!split(index, 3, 3, &v, &z))
        return END;
    int64_t t = sz[z][0], hq = sz[z][1], hkv = sz[z][2], hs = sz[z][3], maxpos = 40;
    int64_t rot = v == 2 ? hs / 2 : hs, neox = v != 1;
    tk_dtype dt = fdt(s, qn), cdt = dt_of(s, "cos_sin_cache", dt);
    fill(c, T(c, qn, dt, TK_CASE_INOUT, t, hq, hs), -2, 2);
    fill(c, T(c, kn, dt, TK_CASE_INOUT, t, hkv, hs), -2, 2);
    fill_int(c, T(c, "positions", DT_I64, TK_CASE_IN, t), 0, maxpos - 1);
    fill(c, T(c, "cos_sin_cache", cdt, TK_CASE_IN, maxpos, rot), -1, 1);
    opt_i(c, s, "is_neox", neox, &na);
    label(c, "%s %s (cache %s) T %lld Hq %lld Hkv %lld head_size %lld rot_dim %lld%s", c->op->name,
          tk_ops__dtype_str(dt), tk_ops__dtype_str(cdt), (long long)t, (long long)hq, (long long)hkv, (long long)hs,
          (long long)rot, neox ? "" : " gpt-j");
    return na ? NA : TK_OK;
}

/* rope_cos_sin_cache with each of HF's scalings. */
static int gen_rope_cache(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    static const int64_t sz[][2] = {{1, 8}, {37, 64}, {64, 128}};
    size_t v, z;
    int na = 0;
    if (!split(index, 6, 3, &v, &z))
        return END;
    int64_t rows = sz[z][0], rot = pin(s, "out", 1, 2, sz[z][1]);
    tk_dtype dt = fdt(s, "out");
    T(c, "out", dt, TK_CASE_OUT, rows, rot);
    opt_f(c, s, "base", 10000, &na);
    opt_i(c, s, "scaling", (int64_t)v, &na);
    static const char *names[] = {"none", "linear", "dynamic", "yarn", "llama3", "longrope"};
    if (v == 1)
        opt_f(c, s, "factor", 2, &na);
    if (v == 2) {
        opt_f(c, s, "factor", 2, &na);
        opt_i(c, s, "original_max_position_embeddings", 16, &na);
        opt_i(c, s, "seq_len", 48, &na);
    }
    if (v == 3) {
        opt_f(c, s, "factor", 4, &na);
        opt_i(c, s, "original_max_position_embeddings", 32, &na);
    }
    if (v == 4) {
        opt_f(c, s, "factor", 8, &na);
        opt_i(c, s, "original_max_position_embeddings", 32, &na);
    }
    if (v == 5) { /* LongRoPE: the per-pair factors (a kernel without them does not take this case) */
        opt_f(c, s, "factor", 32, &na);
        opt_i(c, s, "original_max_position_embeddings", 4096, &na);
        tk_ops_case_tensor *e = OPT(c, s, 1, &na, "ext_factors", DT_F32, TK_CASE_IN, rot / 2);
        if (e)
            fill(c, e, 1, 40);
    }
    c->tol_factor = 4; /* cos/sin of large angles: fp32 argument rounding */
    label(c, "rope_cos_sin_cache %s [%lld, %lld] %s", tk_ops__dtype_str(dt), (long long)rows, (long long)rot, names[v]);
    return na ? NA : TK_OK;
}

static int gen_alibi_slopes(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    static const int64_t hs[] = {1, 8, 12};
    int na = 0;
    if (index >= 3)
        return END;
    T(c, "out", DT_F32, TK_CASE_OUT, hs[index]);
    opt_f(c, s, "max_bias", 8, &na);
    label(c, "alibi_slopes H %lld", (long long)hs[index]);
    return na ? NA : TK_OK;
}

static int gen_alibi_bias(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    static const int64_t sz[][3] = {{1, 1, 1}, {2, 3, 5}, {3, 17, 33}};
    if (index >= 3)
        return END;
    const int64_t *z = sz[index];
    tk_dtype dt = fdt(s, "out");
    T(c, "out", dt, TK_CASE_OUT, z[0], z[1], z[2]);
    fill(c, T(c, "slopes", DT_F32, TK_CASE_IN, z[0]), 0.01, 1);
    label(c, "alibi_bias %s [%lld, %lld, %lld]", tk_ops__dtype_str(dt), (long long)z[0], (long long)z[1],
          (long long)z[2]);
    return TK_OK;
}

static int gen_sinusoidal(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    static const int64_t sz[][2] = {{1, 8}, {17, 64}, {5, 130}};
    size_t v, z;
    int na = 0;
    if (!split(index, 2, 3, &v, &z))
        return END;
    tk_dtype dt = fdt(s, "out");
    T(c, "out", dt, TK_CASE_OUT, sz[z][0], sz[z][1]);
    if (v)
        opt_i(c, s, "offset", 7, &na);
    c->tol_factor = 4;
    label(c, "sinusoidal_position_encoding %s [%lld, %lld]%s", tk_ops__dtype_str(dt), (long long)sz[z][0],
          (long long)sz[z][1], v ? " offset 7" : "");
    return na ? NA : TK_OK;
}

/* ---- softmax --------------------------------------------------------------------------------------- */

static int gen_softmax(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    static const int64_t sz[][2] = {{1, 1}, {3, 7}, {2, 1000}, {2, 5000}};
    if (index >= 4)
        return END;
    int64_t r = sz[index][0], d = pin(s, "input", 1, 2, sz[index][1]);
    tk_dtype dt = fdt(s, "input");
    T(c, "out", dt, TK_CASE_OUT, r, d);
    fill(c, T(c, "input", dt, TK_CASE_IN, r, d), -8, 8);
    label(c, "%s %s [%lld, %lld]", c->op->name, tk_ops__dtype_str(dt), (long long)r, (long long)d);
    return TK_OK;
}

/* Runs the CPU reference of op `name` on args: how a backward's case gets the forward's results (a
 * consistent out, lse) it takes as inputs. */
static int run_forward(const char *name, const tk_arg *args, size_t n)
{
    const tk_op_desc *fwd = tk_ops__find(name);
    tk_op_call fc;
    int rc = fwd ? tk_ops__prepare_op(&fc, fwd, args, n) : tk__err(TK_ERR_INTERNAL, "no op %s", name);
    return rc == TK_OK ? tk_ops__run_cpu(&fc) : rc;
}

/* softmax_backward, log_softmax_backward: out is the forward's, from random logits on the CPU. */
static int gen_softmax_backward(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    static const int64_t sz[][2] = {{1, 1}, {3, 7}, {2, 1000}, {2, 5000}};
    if (index >= 4)
        return END;
    int64_t r = sz[index][0], d = pin(s, "grad_out", 1, 2, sz[index][1]);
    tk_dtype dt = fdt(s, "grad_out");
    int lg = !strncmp(c->op->name, "log_", 4);
    T(c, "grad_input", dt, TK_CASE_OUT, r, d);
    fill(c, T(c, "grad_out", dt, TK_CASE_IN, r, d), -1, 1);
    tk_ops_case_tensor *y = T(c, "out", dt, TK_CASE_IN, r, d), x;
    if (!y || !tmp_t(&x, "input", dt, SH(r, d)))
        return TK_ERR_NOMEM;
    fill(c, &x, -8, 8);
    tk_arg a[2] = {{TK_ARG_TENSOR, "out", &y->t, 0, 0}, {TK_ARG_TENSOR, "input", &x.t, 0, 0}};
    int rc = run_forward(lg ? "log_softmax" : "softmax", a, 2);
    free(x.t.data);
    if (rc != TK_OK)
        return rc;
    label(c, "%s %s [%lld, %lld]", c->op->name, tk_ops__dtype_str(dt), (long long)r, (long long)d);
    return TK_OK;
}

/* ---- losses ---------------------------------------------------------------------------------------- */

/* The loss tensor for a reduction: [N] (none) or [] (mean, sum). */
static tk_ops_case_tensor *loss_t(tk_ops_case *c, int64_t red, int64_t n)
{
    return red == 0 ? T(c, "loss", DT_F32, TK_CASE_OUT, n) : add_t(c, "loss", DT_F32, TK_CASE_OUT, 0, NULL);
}

static const char *red_name(int64_t red) { return red == 0 ? "none" : red == 1 ? "mean" : "sum"; }

/* cross_entropy: variants (reduction, gradient, lse, label smoothing); one row ignored. */
static int gen_cross_entropy(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    static const int64_t sz[][2] = {{1, 7}, {5, 1000}, {3, 4099}};
    size_t v, z;
    int na = 0;
    if (!split(index, 3, 3, &v, &z))
        return END;
    int64_t n = sz[z][0], vocab = pin(s, "logits", 1, 2, sz[z][1]), red = v == 0 ? 1 : v == 1 ? 0 : 2;
    tk_dtype dt = fdt(s, "logits");
    fill(c, T(c, "logits", dt, TK_CASE_IN, n, vocab), -6, 6);
    tk_ops_case_tensor *tg = T(c, "target", DT_I64, TK_CASE_IN, n);
    fill_int(c, tg, 0, vocab - 1);
    if (n > 1 && tg)
        set_f(tg, 1, -100); /* ignore_index */
    loss_t(c, red, n);
    if (v != 1)
        OPT(c, s, 0, &na, "grad", dt, TK_CASE_OUT, n, vocab);
    OPT(c, s, 0, &na, "lse", DT_F32, TK_CASE_OUT, n);
    opt_i(c, s, "reduction", red, &na);
    if (v == 1)
        opt_f(c, s, "label_smoothing", 0.1, &na);
    c->tol_factor = 4;
    label(c, "cross_entropy %s [%lld, %lld] reduction %s%s", tk_ops__dtype_str(dt), (long long)n, (long long)vocab,
          red_name(red), v == 1 ? " label_smoothing 0.1" : "");
    return na ? NA : TK_OK;
}

static int gen_fused_linear_ce(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    static const int64_t sz[][3] = {{1, 16, 33}, {5, 64, 300}}; /* N, H, V */
    size_t v, z;
    int na = 0;
    if (!split(index, 3, 2, &v, &z))
        return END;
    int64_t n = sz[z][0], h = sz[z][1], vocab = sz[z][2], red = v == 1 ? 0 : 1;
    tk_dtype dt = fdt(s, "hidden");
    fill(c, T(c, "hidden", dt, TK_CASE_IN, n, h), -1, 1);
    fill(c, T(c, "weight", dt, TK_CASE_IN, vocab, h), -0.5, 0.5);
    tk_ops_case_tensor *tg = T(c, "target", DT_I64, TK_CASE_IN, n);
    fill_int(c, tg, 0, vocab - 1);
    if (n > 1 && tg)
        set_f(tg, 0, -100);
    loss_t(c, red, n);
    int bias = v == 2;
    if (bias)
        fill(c, OPT(c, s, 1, &na, "bias", dt, TK_CASE_IN, vocab), -1, 1);
    if (v != 1) {
        OPT(c, s, 0, &na, "grad_hidden", dt, TK_CASE_OUT, n, h);
        fill(c, OPT(c, s, 0, &na, "grad_weight", DT_F32, TK_CASE_INOUT, vocab, h), -0.01, 0.01); /* accumulated */
        if (bias)
            fill(c, OPT(c, s, 0, &na, "grad_bias", DT_F32, TK_CASE_INOUT, vocab), -0.01, 0.01);
    }
    OPT(c, s, 0, &na, "lse", DT_F32, TK_CASE_OUT, n);
    opt_i(c, s, "reduction", red, &na);
    if (v == 1)
        opt_f(c, s, "label_smoothing", 0.1, &na);
    c->tol_factor = 8;
    label(c, "fused_linear_cross_entropy %s N %lld H %lld V %lld reduction %s%s", tk_ops__dtype_str(dt), (long long)n,
          (long long)h, (long long)vocab, red_name(red), bias ? " bias" : "");
    return na ? NA : TK_OK;
}

static int gen_max_margin(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    static const int64_t sz[][2] = {{1, 0}, {37, 0}, {9, 5}}; /* N, K (0: neg is [N]) */
    size_t v, z;
    int na = 0;
    if (!split(index, 2, 3, &v, &z))
        return END;
    int64_t n = sz[z][0], k = sz[z][1], red = v ? 0 : 1;
    tk_dtype dt = fdt(s, "pos");
    fill(c, T(c, "pos", dt, TK_CASE_IN, n), -2, 2);
    tk_ops_case_tensor *neg = k ? T(c, "neg", dt, TK_CASE_IN, n, k) : T(c, "neg", dt, TK_CASE_IN, n);
    fill(c, neg, -2, 2);
    if (red == 0)
        k ? T(c, "loss", DT_F32, TK_CASE_OUT, n, k) : T(c, "loss", DT_F32, TK_CASE_OUT, n);
    else
        add_t(c, "loss", DT_F32, TK_CASE_OUT, 0, NULL);
    OPT(c, s, 0, &na, "grad_pos", dt, TK_CASE_OUT, n);
    if (k)
        OPT(c, s, 0, &na, "grad_neg", dt, TK_CASE_OUT, n, k);
    else
        OPT(c, s, 0, &na, "grad_neg", dt, TK_CASE_OUT, n);
    opt_i(c, s, "reduction", red, &na);
    if (v)
        opt_f(c, s, "margin", 0.5, &na);
    c->tol_factor = 4;
    label(c, "max_margin_loss %s N %lld K %lld reduction %s", tk_ops__dtype_str(dt), (long long)n, (long long)k,
          red_name(red));
    return na ? NA : TK_OK;
}

static int gen_infonce(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    static const int64_t sz[][2] = {{1, 8}, {9, 64}};
    size_t v, z;
    int na = 0;
    if (!split(index, 2, 2, &v, &z))
        return END;
    int64_t n = sz[z][0], d = sz[z][1];
    tk_dtype dt = fdt(s, "a");
    fill(c, T(c, "a", dt, TK_CASE_IN, n, d), -1, 1);
    fill(c, T(c, "b", dt, TK_CASE_IN, n, d), -1, 1);
    add_t(c, "loss", DT_F32, TK_CASE_OUT, 0, NULL);
    OPT(c, s, 0, &na, "grad_a", dt, TK_CASE_OUT, n, d);
    OPT(c, s, 0, &na, "grad_b", dt, TK_CASE_OUT, n, d);
    if (v)
        opt_i(c, s, "symmetric", 1, &na);
    c->tol_factor = 8;
    label(c, "infonce %s [%lld, %lld]%s", tk_ops__dtype_str(dt), (long long)n, (long long)d, v ? " symmetric" : "");
    return na ? NA : TK_OK;
}

/* ---- casted (8-bit tables and weights) --------------------------------------------------------------- */

static int gen_casted_embedding(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    static const int64_t sz[][3] = {{1, 5, 16}, {9, 50, 100}}; /* n, V, D */
    int na = 0;
    if (index >= 2)
        return END;
    int64_t n = sz[index][0], vocab = sz[index][1], d = sz[index][2];
    tk_dtype odt = fdt(s, "out"), idt = dt_of(s, "ids", DT_I64), wdt = dt_of(s, "weight", DT_I8);
    T(c, "out", odt, TK_CASE_OUT, n, d);
    fill_int(c, T(c, "ids", idt, TK_CASE_IN, n), 0, vocab - 1);
    fill_codes(c, T(c, "weight", wdt, TK_CASE_IN, vocab, d));
    fill(c, OPT(c, s, wdt.code == TK_DL_INT, &na, "scale", DT_F32, TK_CASE_IN, vocab), 0.001, 0.02);
    label(c, "casted_embedding %s ids %s weight %s [%lld, %lld] n %lld", tk_ops__dtype_str(odt), tk_ops__dtype_str(idt),
          tk_ops__dtype_str(wdt), (long long)vocab, (long long)d, (long long)n);
    return na ? NA : TK_OK;
}

static int gen_casted_block_sparse(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    static const int64_t sz[][5] = {{1, 3, 2, 8, 4}, {9, 5, 4, 16, 3}}; /* n, R, bs_r, bs_c, C */
    int na = 0;
    if (index >= 2)
        return END;
    const int64_t *z = sz[index];
    int64_t n = z[0], rb = z[1], bsr = z[2], bsc = z[3], cb = z[4], d = cb * bsc, rows = rb * bsr - 1;
    tk_dtype odt = fdt(s, "out"), idt = dt_of(s, "ids", DT_I64), wdt = dt_of(s, "values", DT_I8);
    /* row block r stores the column blocks whose bit is set in a random mask (some rows none) */
    int64_t nnzb = 0, mask[8];
    for (int64_t r = 0; r < rb; r++) {
        mask[r] = r == 1 ? 0 : irand(c, 1, ((int64_t)1 << cb) - 1);
        nnzb += __builtin_popcountll((unsigned long long)mask[r]);
    }
    T(c, "out", odt, TK_CASE_OUT, n, d);
    fill_int(c, T(c, "ids", idt, TK_CASE_IN, n), 0, rows - 1);
    tk_ops_case_tensor *rp = T(c, "row_ptr", DT_I32, TK_CASE_IN, rb + 1),
                       *ci = T(c, "col_idx", DT_I32, TK_CASE_IN, nnzb);
    for (int64_t r = 0, k = 0; rp && ci && r < rb; r++) {
        set_f(rp, r, (double)k);
        for (int64_t b = 0; b < cb; b++)
            if (mask[r] >> b & 1)
                set_f(ci, k++, (double)b);
        set_f(rp, r + 1, (double)k);
    }
    fill_codes(c, T(c, "values", wdt, TK_CASE_IN, nnzb, bsr, bsc));
    fill(c, OPT(c, s, wdt.code == TK_DL_INT, &na, "scale", DT_F32, TK_CASE_IN, nnzb), 0.001, 0.02);
    opt_i(c, s, "num_embeddings", rows, &na);
    label(c, "casted_embedding_block_sparse %s ids %s values %s R %lld block %lldx%lld D %lld n %lld",
          tk_ops__dtype_str(odt), tk_ops__dtype_str(idt), tk_ops__dtype_str(wdt), (long long)rb, (long long)bsr,
          (long long)bsc, (long long)d, (long long)n);
    return na ? NA : TK_OK;
}

static int gen_casted_linear(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    static const int64_t sz[][3] = {{1, 16, 32}, {7, 130, 200}, {40, 64, 96}}; /* M, N, K */
    size_t v, z;
    int na = 0;
    if (!split(index, 2, 3, &v, &z))
        return END;
    int64_t m = sz[z][0], n = sz[z][1], k = sz[z][2];
    tk_dtype dt = fdt(s, "x"), wdt = dt_of(s, "weight", DT_I8);
    T(c, "out", dt, TK_CASE_OUT, m, n);
    fill(c, T(c, "x", dt, TK_CASE_IN, m, k), -1, 1);
    fill_codes(c, T(c, "weight", wdt, TK_CASE_IN, n, k));
    fill(c, T(c, "scale", DT_F32, TK_CASE_IN, n), 0.0005, 0.005);
    if (v)
        fill(c, OPT(c, s, 1, &na, "bias", dt, TK_CASE_IN, n), -1, 1);
    c->tol_factor = 4;
    label(c, "casted_linear %s weight %s M %lld N %lld K %lld%s", tk_ops__dtype_str(dt), tk_ops__dtype_str(wdt),
          (long long)m, (long long)n, (long long)k, v ? " bias" : "");
    return na ? NA : TK_OK;
}

/* ---- sampling ---------------------------------------------------------------------------------------- */

static int gen_argmax(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    static const int64_t sz[][2] = {{1, 1}, {3, 1000}, {2, 20000}};
    if (index >= 3)
        return END;
    int64_t r = sz[index][0], v = pin(s, "input", 1, 2, sz[index][1]);
    tk_dtype dt = fdt(s, "input");
    T(c, "out", DT_I64, TK_CASE_OUT, r);
    tk_ops_case_tensor *x = T(c, "input", dt, TK_CASE_IN, r, v);
    fill(c, x, -6, 6);
    if (x && v > 2) /* a tie for the max: the first wins */
        for (int64_t i = 0; i < r; i++) {
            set_f(x, i * v + v / 3, 9);
            set_f(x, i * v + v / 2, 9);
        }
    label(c, "argmax %s [%lld, %lld]", tk_ops__dtype_str(dt), (long long)r, (long long)v);
    return TK_OK;
}

static int gen_sample(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    static const int64_t sz[][2] = {{1, 7}, {4, 1000}};
    static const char *what[] = {"greedy", "temperature 0.8", "top_k 5", "top_p 0.9", "per-row parameters"};
    size_t v, z;
    int na = 0;
    if (!split(index, 5, 2, &v, &z))
        return END;
    int64_t b = sz[z][0], vocab = sz[z][1];
    tk_dtype dt = fdt(s, "logits");
    T(c, "out", DT_I64, TK_CASE_OUT, b);
    tk_ops_case_tensor *x = T(c, "logits", dt, TK_CASE_IN, b, vocab);
    for (int64_t i = 0, n = x ? b * vocab : 0; i < n; i++)
        set_f(x, i, unif(c, -6, 6) + (irand(c, 0, 40) == 0 ? 6 : 0));
    opt_i(c, s, "seed", 1234, &na);
    opt_f(c, s, "temperature", v == 0 ? 0 : 0.8, &na);
    if (v == 2)
        opt_i(c, s, "top_k", 5, &na);
    if (v == 3)
        opt_f(c, s, "top_p", 0.9, &na);
    if (v == 4) {
        fill(c, OPT(c, s, 1, &na, "temperatures", DT_F32, TK_CASE_IN, b), 0.5, 1.5);
        fill_int(c, OPT(c, s, 1, &na, "top_ks", DT_I32, TK_CASE_IN, b), 0, 20);
        fill(c, OPT(c, s, 1, &na, "top_ps", DT_F32, TK_CASE_IN, b), 0.5, 1);
        fill_int(c, OPT(c, s, 1, &na, "seeds", DT_I64, TK_CASE_IN, b), 0, 1000000);
    }
    label(c, "sample %s [%lld, %lld] %s", tk_ops__dtype_str(dt), (long long)b, (long long)vocab, what[v]);
    return na ? NA : TK_OK;
}

/* ---- attention ---------------------------------------------------------------------------------------- */

/* attention at head size D (the kernel's, or 64), each case one shape and one option: one row; GQA
 * (Hq 4 over Hkv 2) with Sq != Sk; causal with lse; sliding window, softcap and ALiBi together; two
 * packed sequences (varlen, causal); and the largest head size the kernel declares. */
static int gen_attention(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    static const struct {
        int64_t b, sq, sk, hq, hkv;
        int opt; /* 0 plain, 1 causal + lse, 2 window/softcap/alibi, 3 varlen, 4 the largest D */
        const char *what;
    } cs[] = {{1, 1, 1, 1, 1, 0, " (one row)"},
              {2, 17, 33, 4, 2, 0, " (GQA)"},
              {1, 33, 33, 2, 2, 1, " causal, lse"},
              {2, 17, 33, 4, 2, 2, " window 8/4, softcap 30, alibi"},
              {1, 17, 33, 2, 1, 3, " varlen: 2 sequences, causal"},
              {1, 17, 33, 2, 2, 4, " (the largest head size it takes)"}};
    int na = 0;
    if (index >= sizeof cs / sizeof cs[0])
        return END;
    int64_t b = cs[index].b, sq = cs[index].sq, sk = cs[index].sk, hq = cs[index].hq, hkv = cs[index].hkv;
    int opt = cs[index].opt;
    int64_t d = opt == 4 ? pin_max(s, "q", 3, 4, 256, 1024) : pin(s, "q", 3, 4, 64);
    if (opt == 4 && d == pin(s, "q", 3, 4, 64))
        return NA; /* one head size: the other cases have it */
    tk_dtype dt = fdt(s, "q");
    T(c, "out", dt, TK_CASE_OUT, b, sq, hq, d);
    fill(c, T(c, "q", dt, TK_CASE_IN, b, sq, hq, d), -1, 1);
    fill(c, T(c, "k", dt, TK_CASE_IN, b, sk, hkv, d), -1, 1);
    fill(c, T(c, "v", dt, TK_CASE_IN, b, sk, hkv, d), -1, 1);
    if (opt == 1) {
        OPT(c, s, 1, &na, "lse", DT_F32, TK_CASE_OUT, b, hq, sq);
        opt_i(c, s, "causal", 1, &na);
    }
    if (opt == 2) {
        opt_i(c, s, "window_left", 8, &na);
        opt_i(c, s, "window_right", 4, &na);
        opt_f(c, s, "softcap", 30, &na);
        fill(c, OPT(c, s, 1, &na, "alibi_slopes", DT_F32, TK_CASE_IN, hq), 0.01, 0.5);
    }
    if (opt == 3) { /* sequences of 7 and 10 queries over 12 and 21 keys */
        tk_ops_case_tensor *cq = OPT(c, s, 1, &na, "cu_seqlens_q", DT_I32, TK_CASE_IN, 3);
        tk_ops_case_tensor *ck = OPT(c, s, 1, &na, "cu_seqlens_k", DT_I32, TK_CASE_IN, 3);
        static const int32_t q[3] = {0, 7, 17}, k[3] = {0, 12, 33};
        for (int i = 0; cq && ck && i < 3; i++) {
            set_f(cq, i, q[i]);
            set_f(ck, i, k[i]);
        }
        opt_i(c, s, "max_seqlen_q", 10, &na);
        opt_i(c, s, "causal", 1, &na);
    }
    c->tol_factor = dt.bits == 32 ? 10 : 2;
    label(c, "attention %s B %lld Sq %lld Sk %lld Hq %lld Hkv %lld D %lld%s", tk_ops__dtype_str(dt), (long long)b,
          (long long)sq, (long long)sk, (long long)hq, (long long)hkv, (long long)d, cs[index].what);
    return na ? NA : TK_OK;
}

/* attention_backward, each case one shape and one option as attention's: one row, GQA with Sq != Sk,
 * each causal; two packed sequences (varlen, causal: the varlen kernels take nothing else); sliding
 * window, softcap and ALiBi together; the largest head size the kernel declares. out and lse come
 * from the CPU forward with the same options (the backward needs a consistent pair). */
static int gen_attention_backward(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    static const struct {
        int64_t b, sq, sk, hq, hkv;
        int opt; /* 0 plain, 1 causal, 2 varlen, 3 window/softcap/alibi, 4 the largest D */
        const char *what;
    } cs[] = {{1, 1, 1, 1, 1, 0, ""},
              {1, 17, 33, 4, 2, 0, ""},
              {1, 1, 1, 1, 1, 1, " causal"},
              {1, 17, 17, 4, 2, 1, " causal"},
              {1, 17, 33, 2, 1, 2, " varlen: 2 sequences, causal"},
              {2, 17, 33, 4, 2, 3, " window 8/4, softcap 30, alibi"},
              {1, 17, 33, 2, 2, 4, " (the largest head size it takes)"}};
    int na = 0;
    if (index >= sizeof cs / sizeof cs[0])
        return END;
    int64_t b = cs[index].b, sq = cs[index].sq, sk = cs[index].sk, hq = cs[index].hq, hkv = cs[index].hkv;
    int opt = cs[index].opt;
    int64_t d = opt == 4 ? pin_max(s, "q", 3, 4, 256, 1024) : pin(s, "q", 3, 4, 64);
    if (opt == 4 && d == pin(s, "q", 3, 4, 64))
        return NA; /* one head size: the other cases have it */
    tk_dtype dt = fdt(s, "q");
    T(c, "dq", dt, TK_CASE_OUT, b, sq, hq, d);
    T(c, "dk", dt, TK_CASE_OUT, b, sk, hkv, d);
    T(c, "dv", dt, TK_CASE_OUT, b, sk, hkv, d);
    fill(c, T(c, "dout", dt, TK_CASE_IN, b, sq, hq, d), -1, 1);
    tk_ops_case_tensor *q = T(c, "q", dt, TK_CASE_IN, b, sq, hq, d), *k = T(c, "k", dt, TK_CASE_IN, b, sk, hkv, d),
                       *vv = T(c, "v", dt, TK_CASE_IN, b, sk, hkv, d);
    fill(c, q, -1, 1);
    fill(c, k, -1, 1);
    fill(c, vv, -1, 1);
    tk_ops_case_tensor *o = T(c, "out", dt, TK_CASE_IN, b, sq, hq, d),
                       *lse = T(c, "lse", DT_F32, TK_CASE_IN, b, hq, sq);
    if (opt == 1 || opt == 2)
        opt_i(c, s, "causal", 1, &na);
    if (opt == 2) { /* sequences of 7 and 10 queries over 12 and 21 keys, as attention's */
        tk_ops_case_tensor *cq = OPT(c, s, 1, &na, "cu_seqlens_q", DT_I32, TK_CASE_IN, 3);
        tk_ops_case_tensor *ck = OPT(c, s, 1, &na, "cu_seqlens_k", DT_I32, TK_CASE_IN, 3);
        static const int32_t cuq[3] = {0, 7, 17}, cuk[3] = {0, 12, 33};
        for (int i = 0; cq && ck && i < 3; i++) {
            set_f(cq, i, cuq[i]);
            set_f(ck, i, cuk[i]);
        }
        opt_i(c, s, "max_seqlen_q", 10, &na);
    }
    if (opt == 3) {
        opt_i(c, s, "window_left", 8, &na);
        opt_i(c, s, "window_right", 4, &na);
        opt_f(c, s, "softcap", 30, &na);
        fill(c, OPT(c, s, 1, &na, "alibi_slopes", DT_F32, TK_CASE_IN, hq), 0.01, 0.5);
    }
    if (na)
        return NA;
    if (!q || !k || !vv || !o || !lse)
        return TK_ERR_NOMEM;
    /* the forward on the CPU fills out and lse: the case's inputs and options but the gradients */
    tk_arg a[2 * TK_OPS_CASE_MAX];
    size_t n = 0;
    for (size_t i = 0; i < c->nt; i++) {
        const char *nm = c->t[i].name;
        if (strcmp(nm, "dq") && strcmp(nm, "dk") && strcmp(nm, "dv") && strcmp(nm, "dout"))
            a[n++] = (tk_arg){TK_ARG_TENSOR, nm, &c->t[i].t, 0, 0};
    }
    for (size_t i = 0; i < c->ns; i++)
        a[n++] = (tk_arg){c->s[i].kind, c->s[i].name, NULL, c->s[i].i, c->s[i].f};
    int rc = run_forward("attention", a, n);
    if (rc != TK_OK)
        return rc;
    c->tol_factor = dt.bits == 32 ? 10 : 4;
    label(c, "attention_backward %s B %lld Sq %lld Sk %lld Hq %lld Hkv %lld D %lld%s", tk_ops__dtype_str(dt),
          (long long)b, (long long)sq, (long long)sk, (long long)hq, (long long)hkv, (long long)d, cs[index].what);
    return TK_OK;
}

/* A block table of b sequences over nblocks physical blocks: a random permutation, so logical and
 * physical block numbers differ. */
static void block_table(tk_ops_case *c, tk_ops_case_tensor *bt, int64_t b, int64_t per, int64_t nblocks)
{
    int64_t perm[64];
    for (int64_t i = 0; i < nblocks && i < 64; i++)
        perm[i] = i;
    for (int64_t i = nblocks - 1; i > 0; i--) {
        int64_t j = irand(c, 0, i), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int64_t i = 0; bt && i < b * per; i++)
        set_f(bt, i, (double)perm[i % nblocks]);
}

static int gen_attention_decode(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    static const char *what[] = {"", " lse", " window 9, softcap 20, alibi", " 4 new queries"};
    static const int64_t lens[][2] = {{1, 1}, {5, 37}};
    static const size_t pick[][2] = {{0, 0}, {0, 1}, {1, 1}, {2, 1}, {3, 1}}; /* (variant, lengths) */
    size_t v, z;
    int na = 0;
    if (index >= sizeof pick / sizeof pick[0])
        return END;
    v = pick[index][0];
    z = pick[index][1];
    int64_t b = 2, sq = v == 3 ? 4 : 1, hq = 4, hkv = 2, d = pin(s, "q", 3, 4, 64), bs = 16, per = 3, nblocks = 6;
    tk_dtype dt = fdt(s, "q"), kdt = dt_of(s, "k_cache", dt);
    int scaled = is_8bit(kdt);
    T(c, "out", dt, TK_CASE_OUT, b, sq, hq, d);
    fill(c, T(c, "q", dt, TK_CASE_IN, b, sq, hq, d), -1, 1);
    tk_ops_case_tensor *kc = T(c, "k_cache", kdt, TK_CASE_IN, nblocks, bs, hkv, d),
                       *vc = T(c, "v_cache", kdt, TK_CASE_IN, nblocks, bs, hkv, d);
    if (scaled) {
        fill_codes(c, kc);
        fill_codes(c, vc);
    } else {
        fill(c, kc, -1, 1);
        fill(c, vc, -1, 1);
    }
    block_table(c, T(c, "block_table", DT_I32, TK_CASE_IN, b, per), b, per, nblocks);
    tk_ops_case_tensor *sl = T(c, "seq_lens", DT_I32, TK_CASE_IN, b);
    for (int64_t i = 0; sl && i < b; i++)
        set_f(sl, i, (double)(lens[z][i] < sq ? sq : lens[z][i]));
    if (v == 1)
        OPT(c, s, 1, &na, "lse", DT_F32, TK_CASE_OUT, b, hq, sq);
    double m = kdt.code == TK_DL_FLOAT8_E4M3FN ? 448 : 127;
    if (scaled) { /* required for 8-bit caches, refused for others */
        fill(c, OPT(c, s, 1, &na, "k_scale", DT_F32, TK_CASE_IN, hkv), 0.5 / m, 1.0 / m);
        fill(c, OPT(c, s, 1, &na, "v_scale", DT_F32, TK_CASE_IN, hkv), 0.5 / m, 1.0 / m);
    }
    if (v == 2) {
        opt_i(c, s, "window_left", 9, &na);
        opt_f(c, s, "softcap", 20, &na);
        fill(c, OPT(c, s, 1, &na, "alibi_slopes", DT_F32, TK_CASE_IN, hq), 0.01, 0.5);
    }
    c->tol_factor = 2;
    label(c, "attention_decode %s cache %s B %lld Sq %lld Hq %lld Hkv %lld D %lld seq_lens %lld,%lld%s",
          tk_ops__dtype_str(dt), tk_ops__dtype_str(kdt), (long long)b, (long long)sq, (long long)hq, (long long)hkv,
          (long long)d, (long long)lens[z][0], (long long)lens[z][1], what[v]);
    return na ? NA : TK_OK;
}

static int gen_paged_kv_append(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    static const int64_t sz[][3] = {{1, 1, 64}, {5, 2, 128}}; /* N, Hkv, D */
    int na = 0;
    if (index >= 2)
        return END;
    int64_t n = sz[index][0], hkv = sz[index][1], d = sz[index][2], nblocks = 6, bs = 16;
    tk_dtype dt = fdt(s, "k"), cdt = dt_of(s, "k_cache", dt);
    int scaled = is_8bit(cdt);
    tk_ops_case_tensor *kc = T(c, "k_cache", cdt, TK_CASE_INOUT, nblocks, bs, hkv, d),
                       *vc = T(c, "v_cache", cdt, TK_CASE_INOUT, nblocks, bs, hkv, d);
    if (scaled) {
        fill_codes(c, kc);
        fill_codes(c, vc);
    } else {
        fill(c, kc, -1, 1);
        fill(c, vc, -1, 1);
    }
    fill(c, T(c, "k", dt, TK_CASE_IN, n, hkv, d), -2, 2);
    fill(c, T(c, "v", dt, TK_CASE_IN, n, hkv, d), -2, 2);
    tk_ops_case_tensor *sm = T(c, "slot_mapping", DT_I64, TK_CASE_IN, n);
    for (int64_t i = 0; sm && i < n; i++) /* distinct slots, spread over blocks; the last skipped when n > 1 */
        set_f(sm, i, n > 1 && i == n - 1 ? -1.0 : (double)((i * 37 + 5) % (nblocks * bs)));
    double m = cdt.code == TK_DL_FLOAT8_E4M3FN ? 448 : 127;
    if (scaled) {
        fill(c, OPT(c, s, 1, &na, "k_scale", DT_F32, TK_CASE_IN, hkv), 2.0 / m, 4.0 / m);
        fill(c, OPT(c, s, 1, &na, "v_scale", DT_F32, TK_CASE_IN, hkv), 2.0 / m, 4.0 / m);
    }
    label(c, "paged_kv_append %s cache %s N %lld Hkv %lld D %lld", tk_ops__dtype_str(dt), tk_ops__dtype_str(cdt),
          (long long)n, (long long)hkv, (long long)d);
    return na ? NA : TK_OK;
}

static int gen_mla_decode(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    static const int64_t lens[][2] = {{1, 1}, {20, 33}};
    size_t v, z;
    int na = 0;
    if (!split(index, 2, 2, &v, &z))
        return END;
    int64_t b = 2, hq = 4, r = pin(s, "q_nope", 2, 3, 512), p = pin(s, "q_pe", 2, 3, 64), bs = 16, per = 3, nblocks = 6;
    tk_dtype dt = fdt(s, "q_nope");
    T(c, "out", dt, TK_CASE_OUT, b, hq, r);
    fill(c, T(c, "q_nope", dt, TK_CASE_IN, b, hq, r), -0.5, 0.5);
    fill(c, T(c, "q_pe", dt, TK_CASE_IN, b, hq, p), -0.5, 0.5);
    fill(c, T(c, "kv_cache", dt, TK_CASE_IN, nblocks, bs, r + p), -0.5, 0.5);
    block_table(c, T(c, "block_table", DT_I32, TK_CASE_IN, b, per), b, per, nblocks);
    tk_ops_case_tensor *sl = T(c, "seq_lens", DT_I32, TK_CASE_IN, b);
    for (int64_t i = 0; sl && i < b; i++)
        set_f(sl, i, (double)lens[z][i]);
    if (v)
        OPT(c, s, 1, &na, "lse", DT_F32, TK_CASE_OUT, b, hq);
    c->tol_factor = 2;
    label(c, "mla_decode %s B %lld Hq %lld R %lld P %lld seq_lens %lld,%lld%s", tk_ops__dtype_str(dt), (long long)b,
          (long long)hq, (long long)r, (long long)p, (long long)lens[z][0], (long long)lens[z][1], v ? " lse" : "");
    return na ? NA : TK_OK;
}

/* ---- layers ------------------------------------------------------------------------------------------- */

static int gen_linear(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    static const int64_t sz[][3] = {{1, 1, 1}, {3, 17, 40}, {8, 64, 130}}; /* M, N, K */
    size_t v, z;
    int na = 0;
    if (!split(index, 3, 3, &v, &z))
        return END;
    int64_t m = sz[z][0], n = sz[z][1], k = sz[z][2];
    tk_dtype dt = fdt(s, "x");
    T(c, "out", dt, TK_CASE_OUT, m, n);
    fill(c, T(c, "x", dt, TK_CASE_IN, m, k), -1, 1);
    fill(c, v == 2 ? T(c, "weight", dt, TK_CASE_IN, k, n) : T(c, "weight", dt, TK_CASE_IN, n, k), -1, 1);
    if (v == 1)
        fill(c, OPT(c, s, 1, &na, "bias", dt, TK_CASE_IN, n), -1, 1);
    if (v == 2)
        opt_i(c, s, "transposed", 1, &na);
    c->tol_factor = 4;
    label(c, "linear %s M %lld N %lld K %lld%s", tk_ops__dtype_str(dt), (long long)m, (long long)n, (long long)k,
          v == 1   ? " bias"
          : v == 2 ? " transposed"
                   : "");
    return na ? NA : TK_OK;
}

static int gen_embedding(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    static const int64_t sz[][3] = {{1, 1, 1}, {9, 50, 100}, {4, 7, 4096}}; /* n, V, D */
    if (index >= 3)
        return END;
    int64_t n = sz[index][0], vocab = sz[index][1], d = sz[index][2];
    tk_dtype dt = fdt(s, "weight"), idt = dt_of(s, "ids", DT_I64);
    tk_ops_case_tensor *o = T(c, "out", dt, TK_CASE_OUT, n, d);
    fill_int(c, T(c, "ids", idt, TK_CASE_IN, n), 0, vocab - 1);
    fill(c, T(c, "weight", dt, TK_CASE_IN, vocab, d), -1, 1);
    if (o)
        o->exact = 1; /* a copy */
    label(c, "embedding %s ids %s [%lld, %lld] n %lld", tk_ops__dtype_str(dt), tk_ops__dtype_str(idt), (long long)vocab,
          (long long)d, (long long)n);
    return TK_OK;
}

/* linear_backward: every gradient at once (grad_weight and grad_bias accumulate into random values);
 * Conv1D's transposed weight with f32 weight and bias gradients of the activations' dtype (mixed
 * precision); grad_x accumulated (a second branch into the same input). */
static int gen_linear_backward(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    static const int64_t sz[][3] = {{1, 1, 1}, {3, 17, 40}, {8, 64, 130}}; /* M, N, K */
    static const char *what[] = {"", " transposed, f32 grad_weight and grad_bias", " accumulate"};
    size_t v, z;
    int na = 0;
    if (!split(index, 3, 3, &v, &z))
        return END;
    int64_t m = sz[z][0], n = sz[z][1], k = sz[z][2], tr = v == 1, acc = v == 2;
    tk_dtype dt = fdt(s, "grad_out"), gdt = v == 1 ? dt_of(s, "grad_weight", DT_F32) : fdt(s, "grad_weight");
    tk_ops_case_tensor *gx = OPT(c, s, 1, &na, "grad_x", fdt(s, "grad_x"), acc ? TK_CASE_INOUT : TK_CASE_OUT, m, k);
    if (acc)
        fill(c, gx, -1, 1);
    fill(c,
         tr ? OPT(c, s, 1, &na, "grad_weight", gdt, TK_CASE_INOUT, k, n)
            : OPT(c, s, 1, &na, "grad_weight", gdt, TK_CASE_INOUT, n, k),
         -0.5, 0.5);
    fill(c, OPT(c, s, 1, &na, "grad_bias", dt_of(s, "grad_bias", gdt), TK_CASE_INOUT, n), -0.5, 0.5);
    fill(c, T(c, "grad_out", dt, TK_CASE_IN, m, n), -1, 1);
    fill(c, T(c, "x", dt, TK_CASE_IN, m, k), -1, 1);
    fill(c, tr ? T(c, "weight", dt, TK_CASE_IN, k, n) : T(c, "weight", dt, TK_CASE_IN, n, k), -1, 1);
    opt_i(c, s, "transposed", tr, &na);
    opt_i(c, s, "accumulate", acc, &na);
    c->tol_factor = 4; /* sums of K (grad_x) and M (grad_weight, grad_bias) products, as linear's */
    label(c, "linear_backward %s M %lld N %lld K %lld%s", tk_ops__dtype_str(dt), (long long)m, (long long)n,
          (long long)k, what[v]);
    return na ? NA : TK_OK;
}

/* embedding_backward: grad_weight (accumulated into random values) gets the grad_out rows of repeated
 * ids, from [n] or [a, b] ids; with padding_idx, the rows of one id add nothing. */
static int gen_embedding_backward(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    static const int64_t sz[][4] = {{1, 0, 1, 1}, {9, 0, 50, 100}, {3, 9, 11, 7}, {4, 0, 7, 4096}}; /* a, b, V, D */
    size_t v, z;
    int na = 0;
    if (!split(index, 2, 4, &v, &z))
        return END;
    int64_t a = sz[z][0], b = sz[z][1], vocab = sz[z][2], d = sz[z][3], n = b ? a * b : a;
    tk_dtype gdt = fdt(s, "grad_weight"), dt = fdt(s, "grad_out"), idt = dt_of(s, "ids", DT_I64);
    tk_ops_case_tensor *gw = T(c, "grad_weight", gdt, TK_CASE_INOUT, vocab, d);
    fill(c, gw, -1, 1);
    tk_ops_case_tensor *ids = b ? T(c, "ids", idt, TK_CASE_IN, a, b) : T(c, "ids", idt, TK_CASE_IN, a);
    fill_int(c, ids, 0, vocab - 1);
    if (ids && n > 1) /* a repeated id: two rows add into one */
        set_f(ids, n - 1, get_f(ids, 0));
    fill(c, b ? T(c, "grad_out", dt, TK_CASE_IN, a, b, d) : T(c, "grad_out", dt, TK_CASE_IN, a, d), -1, 1);
    if (v)
        opt_i(c, s, "padding_idx", ids ? (int64_t)get_f(ids, 0) : 0, &na);
    /* fp32 rows added in the order of the ids, as the reference: the same bytes (test_gpu_train.c) */
    if (gw)
        gw->exact = gdt.code == TK_DL_FLOAT && gdt.bits == 32 && dt.code == TK_DL_FLOAT && dt.bits == 32;
    label(c, "embedding_backward grad_out %s grad_weight %s ids %s [%lld, %lld] n %lld%s", tk_ops__dtype_str(dt),
          tk_ops__dtype_str(gdt), tk_ops__dtype_str(idt), (long long)vocab, (long long)d, (long long)n,
          v ? " padding_idx" : "");
    return na ? NA : TK_OK;
}

/* ---- the optimiser -------------------------------------------------------------------------------- */

/* adamw: the first step (zero moments, the defaults); a later step with a copy in the kernel's dtype
 * (bf16 compute weights of f32 masters); a no-decay step far along with a large lr. Every result must
 * be the reference's bits: test_gpu_train.c holds the kernels to the same fp32 operations in the same
 * order. */
static int gen_adamw(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    static const struct {
        double lr, b1, b2, eps, wd, gs;
        int64_t step;
        int later; /* moments not zero, param_copy given */
        const char *what;
    } vs[] = {{1e-3, 0.9, 0.999, 1e-8, 1e-2, 1.0, 1, 0, "step 1"},
              {3e-4, 0.9, 0.95, 1e-8, 0.1, 0.37, 7, 1, "step 7, grad_scale 0.37, param_copy"},
              {1e-2, 0.8, 0.99, 1e-6, 0.0, 2.0, 1000, 1, "step 1000, no decay, param_copy"}};
    static const int64_t sz[][2] = {{1, 0}, {1000, 0}, {5, 1001}};
    size_t v, z;
    int na = 0;
    if (!split(index, 3, 3, &v, &z))
        return END;
    int64_t r = sz[z][0], w = sz[z][1];
    int nd = w ? 2 : 1;
    const int64_t shape[2] = {r, w};
    tk_dtype dt = fdt(s, "param");
    tk_ops_case_tensor *ts[5];
    fill(c, ts[0] = add_t(c, "param", dt, TK_CASE_INOUT, nd, shape), -1, 1);
    fill(c, ts[1] = add_t(c, "grad", fdt(s, "grad"), TK_CASE_IN, nd, shape), -0.1, 0.1);
    ts[2] = add_t(c, "exp_avg", DT_F32, TK_CASE_INOUT, nd, shape);
    ts[3] = add_t(c, "exp_avg_sq", DT_F32, TK_CASE_INOUT, nd, shape);
    ts[4] = vs[v].later ? opt_t(c, s, 0, &na, "param_copy", dt_of(s, "param_copy", dt), TK_CASE_OUT, nd, shape) : NULL;
    if (vs[v].later) {
        fill(c, ts[2], -0.01, 0.01);
        fill(c, ts[3], 1e-6, 1e-3);
    }
    for (int i = 0; i < 5; i++)
        if (ts[i])
            ts[i]->exact = 1;
    opt_f(c, s, "lr", vs[v].lr, &na);
    opt_f(c, s, "beta1", vs[v].b1, &na);
    opt_f(c, s, "beta2", vs[v].b2, &na);
    opt_f(c, s, "eps", vs[v].eps, &na);
    opt_f(c, s, "weight_decay", vs[v].wd, &na);
    opt_i(c, s, "step", vs[v].step, &na);
    opt_f(c, s, "grad_scale", vs[v].gs, &na);
    label(c, "adamw param %s %s %s", tk_ops__dtype_str(dt), tk_ops__shape_fmt(nd, shape), vs[v].what);
    return na ? NA : TK_OK;
}

/* sum_squares into an f32 or f64 scalar, from a scalar, a vector and ragged 2-D and 3-D tensors. The
 * bound is test_gpu_train.c's: both sum in double, so |got - ref| <= 1e-12 |ref| (and an f32 result
 * one rounding more: 1e-7 |ref|). */
static int gen_sum_squares(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    static const int64_t sz[][3] = {{0, 0, 0}, {1000, 0, 0}, {3, 4099, 0}, {2, 33, 1025}};
    size_t v, z;
    if (!split(index, 2, 4, &v, &z))
        return END;
    const tk_ops_case_param *kp = kparam(s, "out");
    if (v && kp && kp->has_dtype)
        return NA; /* the kernel fixes out's dtype: case v = 0 has it */
    int nd = sz[z][2] ? 3 : sz[z][1] ? 2 : sz[z][0] ? 1 : 0;
    tk_dtype odt = dt_of(s, "out", v ? DT_F64 : DT_F32), dt = fdt(s, "input");
    tk_ops_case_tensor *o = v ? T(c, "out", odt, TK_CASE_OUT, 1) : add_t(c, "out", odt, TK_CASE_OUT, 0, NULL);
    fill(c, add_t(c, "input", dt, TK_CASE_IN, nd, sz[z]), -2, 2);
    if (o) {
        o->rtol = 1e-12 + (odt.bits == 32 ? 1e-7 : 0);
        o->atol = 1e-300;
    }
    label(c, "sum_squares %s -> %s %s", tk_ops__dtype_str(dt), tk_ops__dtype_str(odt), tk_ops__shape_fmt(nd, sz[z]));
    return TK_OK;
}

/* ---- noise schedules ---------------------------------------------------------------------------------- */

/* The tolerance of test_gpu_diffusion.c: both sides compute each element in double with the same
 * operations, so the results are the same but where a libm and CUDA's log / exp / sin / cos differ by
 * an ulp of a double: one ulp of the output's dtype, relative (f16: and its smallest subnormal). */
static void one_ulp(tk_ops_case_tensor *t)
{
    if (!t)
        return;
    tk_dtype dt = t->t.dtype;
    t->rtol = dt.bits == 32 ? 0x1.0p-23 : dt.code == TK_DL_BFLOAT ? 0x1.0p-7 : 0x1.0p-10;
    t->atol = dt.bits == 16 && dt.code != TK_DL_BFLOAT ? 6e-8 : 1e-38;
}

#define DIF_NT 500 /* timesteps of the schedule */

/* A schedule's alphas_cumprod [DIF_NT]: cumulative products of 1 - beta, beta random in [1e-4, 0.02]. */
static void dif_table(tk_ops_case *c)
{
    tk_ops_case_tensor *ab = T(c, "alphas_cumprod", DT_F64, TK_CASE_IN, DIF_NT);
    double acc = 1;
    for (int64_t i = 0; ab && i < DIF_NT; i++) {
        acc *= 1 - unif(c, 1e-4, 0.02);
        ((double *)ab->t.data)[i] = acc;
    }
}

/* timesteps [b]: row 0 at t = 0, row 1 at the last t, others random; prev_timesteps (want_prev): up
 * to 20 steps back, negative (the end of the chain) at row 2 and wherever that passes 0. */
static void dif_steps(tk_ops_case *c, int64_t b, int want_prev)
{
    tk_ops_case_tensor *ts = T(c, "timesteps", DT_I64, TK_CASE_IN, b),
                       *ps = want_prev ? T(c, "prev_timesteps", DT_I64, TK_CASE_IN, b) : NULL;
    for (int64_t i = 0; ts && i < b; i++) {
        int64_t t = i == 0 ? 0 : i == 1 ? DIF_NT - 1 : irand(c, 0, DIF_NT - 1);
        set_f(ts, i, (double)t);
        if (ps)
            set_f(ps, i, i == 2 ? -1.0 : (double)(t - 1 - irand(c, 0, 19)));
    }
}

/* Batch shapes: one element, odd, a batch row of 4092 (no multiple of a block of 256), many rows. */
static const struct {
    int nd;
    int64_t sh[4];
} DIF_SH[] = {{1, {1}}, {3, {3, 5, 7}}, {4, {2, 4, 31, 33}}, {2, {9, 1000}}};
#define NDIF (sizeof DIF_SH / sizeof DIF_SH[0])

static int gen_q_sample(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    if (index >= NDIF)
        return END;
    int nd = DIF_SH[index].nd;
    const int64_t *sh = DIF_SH[index].sh;
    tk_dtype dt = fdt(s, "x0");
    one_ulp(add_t(c, "out", dt, TK_CASE_OUT, nd, sh));
    fill(c, add_t(c, "x0", dt, TK_CASE_IN, nd, sh), -3, 3);
    fill(c, add_t(c, "noise", dt, TK_CASE_IN, nd, sh), -3, 3);
    dif_steps(c, sh[0], 0);
    dif_table(c);
    label(c, "q_sample %s %s", tk_ops__dtype_str(dt), tk_ops__shape_fmt(nd, sh));
    return TK_OK;
}

/* ddpm_posterior for each variance type (learned: a predicted variance > 0; learned_range: v in
 * [-1, 1]), with log_variance but for one case that leaves it out. */
static int gen_ddpm_posterior(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    static const char *names[] = {"fixed_small",     "fixed_small_log", "fixed_large",
                                  "fixed_large_log", "learned",         "learned_range"};
    size_t v, z;
    int na = 0;
    if (!split(index, 6, NDIF - 1, &v, &z))
        return END;
    int nd = DIF_SH[z].nd, lv = !(v == 3 && z == 1);
    const int64_t *sh = DIF_SH[z].sh;
    tk_dtype dt = fdt(s, "x0");
    one_ulp(add_t(c, "mean", dt, TK_CASE_OUT, nd, sh));
    if (lv)
        one_ulp(opt_t(c, s, 1, &na, "log_variance", dt, TK_CASE_OUT, nd, sh));
    fill(c, add_t(c, "x0", dt, TK_CASE_IN, nd, sh), -3, 3);
    fill(c, add_t(c, "sample", dt, TK_CASE_IN, nd, sh), -3, 3);
    dif_steps(c, sh[0], 1);
    dif_table(c);
    if (v >= 4)
        fill(c, opt_t(c, s, 1, &na, "predicted_variance", dt, TK_CASE_IN, nd, sh), v == 4 ? 0.01 : -1,
             v == 4 ? 0.5 : 1); /* learned: a variance > 0; learned_range: in [-1, 1] */
    opt_i(c, s, "variance_type", (int64_t)v, &na);
    label(c, "ddpm_posterior %s %s %s%s", tk_ops__dtype_str(dt), tk_ops__shape_fmt(nd, sh), names[v],
          lv ? "" : ", no log_variance");
    return na ? NA : TK_OK;
}

/* One reverse step (ddpm_step, ddim_step). */
typedef struct {
    int64_t pred, var, clip, thr, use_clipped;
    double range, ratio, maxv, eta;
    int noise, x0, ties, nan_row;
    const char *what;
} step_case;

/* Shapes of the steps (rank >= 2): one element, odd, a batch row of 4092. */
static const struct {
    int nd;
    int64_t sh[4];
} STEP_SH[] = {{2, {1, 1}}, {3, {3, 5, 7}}, {4, {2, 4, 31, 33}}};
#define NSTEP_SH (sizeof STEP_SH / sizeof STEP_SH[0])

static int gen_step(tk_ops_case *c, const step_case *k, size_t z, const tk_ops_case_spec *s)
{
    int ddim = !strcmp(c->op->name, "ddim_step"), learned = !ddim && (k->var == 4 || k->var == 5), na = 0;
    int nd = STEP_SH[z].nd;
    const int64_t *sh = STEP_SH[z].sh;
    int64_t msh[4], b = sh[0], row = 1;
    memcpy(msh, sh, sizeof msh);
    if (learned) /* the model's channels, then as many of predicted variance */
        msh[1] *= 2;
    for (int i = 1; i < nd; i++)
        row *= sh[i];
    tk_dtype dt = fdt(s, "sample");
    one_ulp(add_t(c, "prev_sample", dt, TK_CASE_OUT, nd, sh));
    if (k->x0)
        one_ulp(opt_t(c, s, 1, &na, "pred_original_sample", dt, TK_CASE_OUT, nd, sh));
    tk_ops_case_tensor *mo = add_t(c, "model_output", dt, TK_CASE_IN, nd, msh),
                       *x = add_t(c, "sample", dt, TK_CASE_IN, nd, sh);
    for (int64_t i = 0, n = mo ? b * row * (learned ? 2 : 1) : 0; i < n; i++) {
        int64_t e = i % (learned ? 2 * row : row);
        double m = k->ties ? (double)irand(c, -1, 1) : unif(c, -3, 3);
        set_f(mo, i, e < row ? m : k->var == 4 ? unif(c, 0.01, 0.5) : unif(c, -1, 1));
    }
    for (int64_t i = 0, n = x ? b * row : 0; i < n; i++)
        set_f(x, i, k->ties ? (double)irand(c, -1, 1) : unif(c, -3, 3));
    if (x && k->nan_row && b > 1) /* the threshold of batch row 1 is NaN: so is that row */
        set_f(x, row + row / 2, NAN);
    dif_steps(c, b, 1);
    dif_table(c);
    if (k->noise)
        fill(c, opt_t(c, s, 1, &na, "noise", dt, TK_CASE_IN, nd, sh), -3, 3);
    if (ddim) {
        opt_f(c, s, "eta", k->eta, &na);
        opt_i(c, s, "use_clipped_model_output", k->use_clipped, &na);
    } else {
        opt_i(c, s, "variance_type", k->var, &na);
    }
    opt_i(c, s, "prediction_type", k->pred, &na);
    opt_i(c, s, "clip_sample", k->clip, &na);
    opt_f(c, s, "clip_sample_range", k->range, &na);
    opt_i(c, s, "thresholding", k->thr, &na);
    opt_f(c, s, "dynamic_thresholding_ratio", k->ratio, &na);
    opt_f(c, s, "sample_max_value", k->maxv, &na);
    label(c, "%s %s %s %s%s%s%s", c->op->name, tk_ops__dtype_str(dt), tk_ops__shape_fmt(nd, sh), k->what,
          k->nan_row && b > 1 ? ", a NaN row" : "", k->noise ? "" : ", no noise",
          k->x0 ? "" : ", no pred_original_sample");
    return na ? NA : TK_OK;
}

/* ddpm_step: each prediction and variance type, clipping, no noise (the mean); dynamic thresholding
 * (the _threshold kernels) with ties in |x0| and a NaN in one batch row. */
static int gen_ddpm_step(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    static const step_case ks[] = {
        {0, 0, 1, 0, 0, 1.0, 0.995, 1.0, 0, 1, 1, 0, 0, "epsilon, fixed_small, clip 1"},
        {1, 1, 0, 0, 0, 1.0, 0.995, 1.0, 0, 1, 0, 0, 0, "sample, fixed_small_log"},
        {2, 2, 1, 0, 0, 1.5, 0.995, 1.0, 0, 1, 1, 0, 0, "v_prediction, fixed_large, clip 1.5"},
        {0, 4, 0, 0, 0, 1.0, 0.995, 1.0, 0, 1, 1, 0, 0, "epsilon, learned"},
        {2, 5, 1, 0, 0, 2.0, 0.995, 1.0, 0, 1, 1, 0, 0, "v_prediction, learned_range, clip 2"},
        {0, 0, 1, 0, 0, 1.0, 0.995, 1.0, 0, 0, 1, 0, 0, "epsilon, fixed_small, clip 1"},
        {0, 0, 0, 1, 0, 1.0, 0.995, 1.5, 0, 1, 1, 0, 0, "epsilon, thresholding 0.995 max 1.5"},
        {1, 5, 0, 1, 0, 1.0, 0.5, 1.0, 0, 1, 1, 1, 0, "sample, learned_range, thresholding 0.5, ties"},
        {2, 0, 0, 1, 0, 1.0, 0.9, 2.0, 0, 1, 1, 0, 1, "v_prediction, thresholding 0.9 max 2"},
    };
    size_t v, z;
    if (!split(index, sizeof ks / sizeof ks[0], NSTEP_SH, &v, &z))
        return END;
    return gen_step(c, &ks[v], z, s);
}

/* ddim_step: each prediction type, eta 0 to 1, use_clipped_model_output, no noise; thresholding with
 * ties and a NaN row. */
static int gen_ddim_step(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    static const step_case ks[] = {
        {0, 0, 1, 0, 0, 1.0, 0.995, 1.0, 0.0, 1, 1, 0, 0, "epsilon, eta 0, clip 1"},
        {1, 0, 0, 0, 0, 1.0, 0.995, 1.0, 0.5, 1, 0, 0, 0, "sample, eta 0.5"},
        {2, 0, 1, 0, 1, 1.5, 0.995, 1.0, 1.0, 1, 1, 0, 0, "v_prediction, eta 1, clip 1.5, use_clipped_model_output"},
        {0, 0, 1, 0, 0, 1.0, 0.995, 1.0, 0.7, 0, 1, 0, 0, "epsilon, eta 0.7"},
        {0, 0, 0, 1, 0, 1.0, 0.995, 1.5, 0.7, 1, 1, 0, 0, "epsilon, eta 0.7, thresholding 0.995 max 1.5"},
        {2, 0, 0, 1, 0, 1.0, 0.9, 1.0, 0.0, 1, 1, 1, 0, "v_prediction, thresholding 0.9, ties"},
        {1, 0, 0, 1, 1, 1.0, 0.5, 2.0, 0.3, 1, 1, 0, 1,
         "sample, eta 0.3, thresholding 0.5 max 2, "
         "use_clipped_model_output"},
    };
    size_t v, z;
    if (!split(index, sizeof ks / sizeof ks[0], NSTEP_SH, &v, &z))
        return END;
    return gen_step(c, &ks[v], z, s);
}

/* randn: Philox draws at seed and offset, given to both sides as the case's scalars, so the kernel and
 * the reference draw the same numbers (as sample's seed); an odd count (half a Box-Muller pair), a
 * seed with both key words set and an offset with the counter's high word. */
static int gen_randn(tk_ops_case *c, size_t index, const tk_ops_case_spec *s)
{
    static const int64_t seeds[][2] = {{0, 0}, {0x0123456789abcdefll, 5}, {42, ((int64_t)1 << 32) + 3}};
    static const struct {
        int nd;
        int64_t sh[2];
    } sz[] = {{1, {1}}, {1, {7}}, {1, {4097}}, {2, {3, 1001}}};
    size_t v, z;
    int na = 0;
    if (!split(index, 3, sizeof sz / sizeof sz[0], &v, &z))
        return END;
    tk_dtype dt = fdt(s, "out");
    one_ulp(add_t(c, "out", dt, TK_CASE_OUT, sz[z].nd, sz[z].sh));
    opt_i(c, s, "seed", seeds[v][0], &na);
    opt_i(c, s, "offset", seeds[v][1], &na);
    label(c, "randn %s %s seed %lld offset %lld", tk_ops__dtype_str(dt), tk_ops__shape_fmt(sz[z].nd, sz[z].sh),
          (long long)seeds[v][0], (long long)seeds[v][1]);
    return na ? NA : TK_OK;
}

/* ---- the table --------------------------------------------------------------------------------------- */

typedef int (*gen_fn)(tk_ops_case *c, size_t index, const tk_ops_case_spec *s);

static const struct {
    const char *op;
    gen_fn gen;
} gens[] = {
    {"silu_and_mul", gen_gated},
    {"mul_and_silu", gen_gated},
    {"gelu_and_mul", gen_gated},
    {"gelu_tanh_and_mul", gen_gated},
    {"fatrelu_and_mul", gen_gated},
    {"gelu", gen_pointwise},
    {"gelu_tanh", gen_pointwise},
    {"silu", gen_pointwise},
    {"gelu_new", gen_pointwise},
    {"gelu_fast", gen_pointwise},
    {"gelu_quick", gen_pointwise},
    {"tanh", gen_pointwise},
    {"softcap", gen_softcap},
    {"add", gen_add},
    {"moe", gen_moe},
    {"rms_norm", gen_norm},
    {"fused_add_rms_norm", gen_norm},
    {"layer_norm", gen_norm},
    {"fused_add_layer_norm", gen_norm},
    {"rms_norm_sumsq", gen_norm_split},
    {"rms_norm_by_sumsq", gen_norm_split},
    {"rms_norm_backward", gen_norm_backward},
    {"fused_add_rms_norm_backward", gen_norm_backward},
    {"layer_norm_backward", gen_norm_backward},
    {"fused_add_layer_norm_backward", gen_norm_backward},
    {"rotary_embedding", gen_rotary},
    {"rope_cos_sin_cache", gen_rope_cache},
    {"alibi_slopes", gen_alibi_slopes},
    {"alibi_bias", gen_alibi_bias},
    {"sinusoidal_position_encoding", gen_sinusoidal},
    {"softmax", gen_softmax},
    {"log_softmax", gen_softmax},
    {"cross_entropy", gen_cross_entropy},
    {"fused_linear_cross_entropy", gen_fused_linear_ce},
    {"max_margin_loss", gen_max_margin},
    {"infonce", gen_infonce},
    {"casted_embedding", gen_casted_embedding},
    {"casted_embedding_block_sparse", gen_casted_block_sparse},
    {"casted_linear", gen_casted_linear},
    {"argmax", gen_argmax},
    {"sample", gen_sample},
    {"attention", gen_attention},
    {"attention_backward", gen_attention_backward},
    {"attention_decode", gen_attention_decode},
    {"paged_kv_append", gen_paged_kv_append},
    {"mla_decode", gen_mla_decode},
    {"linear", gen_linear},
    {"embedding", gen_embedding},
    {"silu_and_mul_backward", gen_act_backward},
    {"mul_and_silu_backward", gen_act_backward},
    {"gelu_and_mul_backward", gen_act_backward},
    {"gelu_tanh_and_mul_backward", gen_act_backward},
    {"gelu_backward", gen_act_backward},
    {"gelu_tanh_backward", gen_act_backward},
    {"gelu_new_backward", gen_act_backward},
    {"gelu_fast_backward", gen_act_backward},
    {"gelu_quick_backward", gen_act_backward},
    {"silu_backward", gen_act_backward},
    {"tanh_backward", gen_act_backward},
    {"softmax_backward", gen_softmax_backward},
    {"log_softmax_backward", gen_softmax_backward},
    {"rotary_embedding_backward", gen_rotary},
    {"linear_backward", gen_linear_backward},
    {"embedding_backward", gen_embedding_backward},
    {"adamw", gen_adamw},
    {"sum_squares", gen_sum_squares},
    {"q_sample", gen_q_sample},
    {"ddpm_posterior", gen_ddpm_posterior},
    {"ddpm_step", gen_ddpm_step},
    {"ddim_step", gen_ddim_step},
    {"randn", gen_randn},
};

static gen_fn find_gen(const tk_op_desc *op)
{
    for (size_t i = 0; op && i < sizeof gens / sizeof gens[0]; i++)
        if (!strcmp(gens[i].op, op->name))
            return gens[i].gen;
    return NULL;
}

int tk_ops__case_has(const tk_op_desc *op) { return op && op->cpu && find_gen(op) != NULL; }

void tk_ops__case_free(tk_ops_case *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->nt; i++)
        free(c->t[i].t.data);
    memset(c, 0, sizeof *c);
}

/* FNV-1a over the op, the index and the dtypes: the case's seed. */
static uint64_t case_seed(const tk_op_desc *op, size_t index, const tk_ops_case_spec *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
#define MIX(b) (h = (h ^ (uint8_t)(b)) * 0x100000001b3ull)
    for (const char *p = op->name; *p; p++)
        MIX(*p);
    for (size_t i = 0; i < sizeof index; i++)
        MIX(index >> (8 * i));
    MIX(s->dtype.code);
    MIX(s->dtype.bits);
    for (size_t i = 0; s->params && i < s->nparams; i++)
        if (s->params[i].has_dtype) {
            MIX(s->params[i].dtype.code);
            MIX(s->params[i].dtype.bits);
        }
#undef MIX
    return h;
}

int tk_ops__case_make(tk_ops_case *c, const tk_op_desc *op, size_t index, const tk_ops_case_spec *spec)
{
    static const tk_ops_case_spec none = {{TK_DL_FLOAT, 32, 1}, NULL, 0, NULL, 0};
    memset(c, 0, sizeof *c);
    gen_fn gen = find_gen(op);
    if (!op || !op->cpu || !gen)
        return tk__err(TK_ERR_UNSUPPORTED, "op %s has no self-test cases%s", op ? op->name : "(null)",
                       op && !op->cpu ? " (no CPU reference)" : "");
    if (!spec)
        spec = &none;
    c->op = op;
    c->tol_factor = 1;
    c->rng = case_seed(op, index, spec);
    int rc = gen(c, index, spec);
    if (rc == TK_OK) {
        /* every tensor the generator asked for was made (else it ran out of room or memory) */
        for (size_t i = 0; i < op->nparams; i++) {
            const tk_op_param *p = &op->params[i];
            int have = 0;
            for (size_t j = 0; j < c->nt; j++)
                have |= !strcmp(c->t[j].name, p->name);
            if (p->kind == TK_ARG_TENSOR && !p->optional && !have)
                rc = tk__err(TK_ERR_NOMEM, "out of memory making a %s case", op->name);
        }
    }
    if (rc != TK_OK)
        tk_ops__case_free(c);
    return rc;
}

size_t tk_ops__case_args(const tk_ops_case *c, tk_arg *args)
{
    size_t n = 0;
    for (size_t i = 0; i < c->nt; i++) {
        memset(&args[n], 0, sizeof args[n]);
        args[n].kind = TK_ARG_TENSOR;
        args[n].name = c->t[i].name;
        args[n].t = &c->t[i].t;
        n++;
    }
    for (size_t i = 0; i < c->ns; i++) {
        memset(&args[n], 0, sizeof args[n]);
        args[n].kind = c->s[i].kind;
        args[n].name = c->s[i].name;
        args[n].i = c->s[i].i;
        args[n].f = c->s[i].f;
        n++;
    }
    return n;
}

void *tk_ops__case_copy(const tk_ops_case *c, size_t i)
{
    size_t n = tk_ops__case_bytes(&c->t[i]);
    void *p = malloc(n ? n : 1);
    if (p)
        memcpy(p, c->t[i].t.data, n);
    return p;
}

/* ---- tolerances and the comparison ------------------------------------------------------------------ */

double tk_ops__tol_rel(tk_dtype dt)
{
    if (dt.code == TK_DL_BFLOAT)
        return 1e-2;
    if (dt.code == TK_DL_FLOAT && dt.bits == 16)
        return 2e-3;
    if (dt.bits == 8)
        return 6e-2;
    return 1e-5;
}

double tk_ops__case_input_scale(const tk_ops_case *c)
{
    double m = 0;
    for (size_t j = 0; c && j < c->nt; j++) {
        const tk_ops_case_tensor *t = &c->t[j];
        tk_dtype dt = t->t.dtype;
        if (t->role == TK_CASE_OUT || t->exact || !t->t.data || dt.bits < 16 ||
            (dt.code != TK_DL_FLOAT && dt.code != TK_DL_BFLOAT))
            continue;
        for (int64_t i = 0, n = tk_ops__numel(&t->t); i < n; i++) {
            double v = fabs(get_f(t, i));
            if (isfinite(v) && v > m)
                m = v;
        }
    }
    return m;
}

void tk_ops__case_compare(tk_ops_cmp *r, const tk_ops_case *c, const tk_ops_case_tensor *ref, const void *got)
{
    tk_ops_case_tensor g = *ref;
    g.t.data = (void *)got;
    g.t.shape = g.shape;
    memset(r, 0, sizeof *r);
    r->worst = -1;
    int64_t n = tk_ops__numel(&ref->t);
    int exact = ref->exact || ref->t.dtype.code == TK_DL_INT || ref->t.dtype.code == TK_DL_UINT;
    double rel = tk_ops__tol_rel(ref->t.dtype), f = c && c->tol_factor > 0 ? c->tol_factor : 1, worst_ratio = -1;
    for (int64_t i = 0; i < n; i++) {
        double w = get_f(ref, i);
        if (isfinite(w) && fabs(w) > r->max_ref)
            r->max_ref = fabs(w);
    }
    /* i8 codes are integers a step apart; fp8 ones a relative step of 2^-3 (e4m3) or 2^-2 (e5m2) */
    double abs_floor = ref->t.dtype.code == TK_DL_INT && ref->t.dtype.bits == 8 && !ref->exact ? 1.0 : 1e-30;
    /* An absolute floor from the size of what the output is computed from: a result that cancels to
     * (near) zero, such as attention_backward's dq with one key (0 exactly: the softmax of one score
     * has no gradient), carries the f32 rounding of its terms, not a relative error of itself; with
     * only max|ref| to go by, that tolerance would be 0. */
    abs_floor = fmax(abs_floor, f * TK_OPS_ATOL * tk_ops__case_input_scale(c));
    if (ref->t.dtype.code == TK_DL_FLOAT8_E4M3FN || ref->t.dtype.code == TK_DL_FLOAT8_E5M2)
        rel = ref->t.dtype.code == TK_DL_FLOAT8_E4M3FN ? 0x1p-3 : 0x1p-2;
    if (ref->t.dtype.code == TK_DL_INT && ref->t.dtype.bits == 8 && !ref->exact)
        exact = 0; /* quantised outputs: one step either way */
    for (int64_t i = 0; i < n; i++) {
        double w = get_f(ref, i), x = get_f(&g, i), tol = 0, ratio;
        int ok;
        if (exact) {
            ok = (isnan(w) && isnan(x)) || (w == x && !signbit(w) == !signbit(x)) || (w == 0 && x == 0);
            ratio = ok ? 0 : INFINITY;
        } else if (isnan(w)) {
            ok = isnan(x);
            ratio = ok ? 0 : INFINITY;
        } else if (isinf(w)) {
            ok = x == w;
            ratio = ok ? 0 : INFINITY;
        } else {
            if (ref->rtol > 0) /* the op's own per-element bound */
                tol = ref->atol + ref->rtol * fabs(w);
            else
                tol = f * (4 * rel * fabs(w) + 16 * rel * r->max_ref) + abs_floor;
            double d = fabs(x - w);
            ok = d <= tol; /* NaN got: fails */
            ratio = isfinite(d) ? d / tol : INFINITY;
        }
        r->n++;
        r->bad += !ok;
        if (r->worst < 0 || ratio > worst_ratio) {
            r->worst = i;
            worst_ratio = ratio;
            r->got = x;
            r->want = w;
            r->tol = tol;
        }
    }
    r->ok = r->bad == 0;
}
