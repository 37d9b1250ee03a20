/*
 * registry.c — the list of op tables, argument binding and the checks every op shares (kinds,
 * dtypes, ranks, devices), and the tensor helpers the tables use.
 *
 * A new family of ops is a new table file and one line in `tables` below.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ops/ops.h"

static const struct {
    const tk_op_desc *ops;
    const size_t *count;
} tables[] = {
    {tk_ops__activation, &tk_ops__activation_count},
    {tk_ops__norm, &tk_ops__norm_count},
    {tk_ops__rotary, &tk_ops__rotary_count},
    {tk_ops__softmax, &tk_ops__softmax_count},
    {tk_ops__loss, &tk_ops__loss_count},
    {tk_ops__casted, &tk_ops__casted_count},
    {tk_ops__sampling, &tk_ops__sampling_count},
    {tk_ops__attention, &tk_ops__attention_count},
    {tk_ops__layers, &tk_ops__layers_count},
    {tk_ops__backward_layers, &tk_ops__backward_layers_count},
    {tk_ops__backward_act, &tk_ops__backward_act_count},
    {tk_ops__optim, &tk_ops__optim_count},
    {tk_ops__diffusion, &tk_ops__diffusion_count},
    {tk_ops__moe, &tk_ops__moe_count},
};
#define NTABLES (sizeof tables / sizeof tables[0])

size_t tk_ops__count(void)
{
    size_t n = 0;
    for (size_t i = 0; i < NTABLES; i++)
        n += *tables[i].count;
    return n;
}

const tk_op_desc *tk_ops__at(size_t i)
{
    for (size_t k = 0; k < NTABLES; k++) {
        if (i < *tables[k].count)
            return &tables[k].ops[i];
        i -= *tables[k].count;
    }
    return NULL;
}

const tk_op_desc *tk_ops__find(const char *name)
{
    if (!name)
        return NULL;
    for (size_t k = 0; k < NTABLES; k++)
        for (size_t i = 0; i < *tables[k].count; i++)
            if (strcmp(tables[k].ops[i].name, name) == 0)
                return &tables[k].ops[i];
    return NULL;
}

int tk_ops__param_index(const tk_op_desc *op, const char *name)
{
    for (size_t i = 0; name && i < op->nparams; i++)
        if (strcmp(op->params[i].name, name) == 0)
            return (int)i;
    return -1;
}

static int unknown_op(const char *name)
{
    const tk_op_desc *best = NULL;
    size_t bestd = 4;
    for (size_t i = 0, n = tk_ops__count(); i < n; i++) {
        size_t d = tk__edit_distance(name, tk_ops__at(i)->name);
        if (d < bestd) {
            bestd = d;
            best = tk_ops__at(i);
        }
    }
    if (best)
        return tk__err(TK_ERR_NOT_FOUND, "unknown op '%s'\nHINT: did you mean '%s'? 'tk ops' lists every op", name,
                       best->name);
    return tk__err(TK_ERR_NOT_FOUND, "unknown op '%s'\nHINT: 'tk ops' lists every op", name);
}

/* ---- tensor helpers --------------------------------------------------------------------------- */

int tk_ops__same_shape(const tk_tensor *a, const tk_tensor *b)
{
    if (a->ndim != b->ndim)
        return 0;
    for (int32_t k = 0; k < a->ndim; k++)
        if (a->shape[k] != b->shape[k])
            return 0;
    return 1;
}

int tk_ops__check_out_like_input(const tk_op_call *c)
{
    const tk_tensor *out = c->t[0], *in = c->t[1];
    if (!tk_ops__same_shape(out, in))
        return tk__err(TK_ERR_INVALID, "%s: 'out' has shape %s, want %s (the shape of 'input')", c->op->name,
                       tk_ops__shape_fmt(out->ndim, out->shape), tk_ops__shape_fmt(in->ndim, in->shape));
    return TK_OK;
}

int64_t tk_ops__numel(const tk_tensor *t)
{
    int64_t n = 1;
    for (int32_t i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

int tk_ops__contiguous(const tk_tensor *t)
{
    if (!t->strides)
        return 1;
    int64_t want = 1;
    for (int32_t i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != want)
            return 0;
        want *= t->shape[i];
    }
    return 1;
}

int tk_ops__shape_str(tk_buf *b, int32_t ndim, const int64_t *shape)
{
    int rc = tk__buf_puts(b, "[");
    for (int32_t i = 0; rc == TK_OK && i < ndim; i++)
        rc = tk__buf_printf(b, i ? ", %lld" : "%lld", (long long)shape[i]);
    return rc == TK_OK ? tk__buf_puts(b, "]") : rc;
}

const char *tk_ops__shape_fmt(int32_t ndim, const int64_t *shape)
{
    static _Thread_local char ring[4][192];
    static _Thread_local unsigned next;
    char *s = ring[next++ % 4];
    size_t len = 0, cap = sizeof ring[0];
    len += (size_t)snprintf(s, cap, "[");
    for (int32_t i = 0; i < ndim && len < cap; i++)
        len += (size_t)snprintf(s + len, cap - len, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (len < cap)
        snprintf(s + len, cap - len, "]");
    return s;
}

int64_t tk_ops__row_offset(const tk_tensor *t, int64_t r)
{
    if (t->ndim == 0)
        return 0;
    if (!t->strides)
        return r * t->shape[t->ndim - 1];
    int64_t off = 0;
    for (int32_t k = t->ndim - 2; k >= 0; k--) {
        off += (r % t->shape[k]) * t->strides[k];
        r /= t->shape[k];
    }
    return off;
}

int64_t tk_ops__flat_offset(const tk_tensor *t, int64_t i)
{
    if (!t->strides)
        return i;
    int64_t off = 0;
    for (int32_t k = t->ndim - 1; k >= 0; k--) {
        off += (i % t->shape[k]) * t->strides[k];
        i /= t->shape[k];
    }
    return off;
}

int64_t tk_ops__col_stride(const tk_tensor *t) { return (t->ndim == 0 || !t->strides) ? 1 : t->strides[t->ndim - 1]; }

/* ---- binding and the generic checks ----------------------------------------------------------- */

static const char *dev_str(char *buf, size_t n, int type, int id)
{
    if (type == TK_DEV_CPU)
        snprintf(buf, n, "cpu");
    else if (type == TK_DEV_CUDA)
        snprintf(buf, n, "cuda:%d", id);
    else
        snprintf(buf, n, "device type %d", type);
    return buf;
}

/* The names of the dtype bits joined: ("f32", "f16", "bf16") with ", " and " or " gives
 * "f32, f16 or bf16". */
static void dtypes_join(char *buf, size_t n, unsigned bits, const char *sep, const char *last)
{
    size_t len = 0, count = 0, total = 0;
    buf[0] = '\0';
    for (unsigned b = 1; b; b <<= 1)
        total += (bits & b) && tk_ops__dtype_bit_str(b);
    for (unsigned b = 1; b && len < n; b <<= 1) {
        const char *s = (bits & b) ? tk_ops__dtype_bit_str(b) : NULL;
        if (!s)
            continue;
        count++;
        len += (size_t)snprintf(buf + len, n - len, "%s%s", count == 1 ? "" : count == total ? last : sep, s);
    }
}

static int check_tensor(const tk_op_call *c, size_t i)
{
    const tk_op_desc *op = c->op;
    const tk_op_param *p = &op->params[i];
    const tk_tensor *t = c->t[i];
    char want[128];

    if (t->ndim < 0 || t->ndim > TK_OPS_MAX_RANK)
        return tk__err(TK_ERR_INVALID, "%s: '%s' has rank %d, tk supports 0 to %d dimensions", op->name, p->name,
                       (int)t->ndim, TK_OPS_MAX_RANK);
    if (t->ndim > 0 && !t->shape)
        return tk__err(TK_ERR_INVALID, "%s: '%s' has rank %d but no shape", op->name, p->name, (int)t->ndim);
    int64_t numel = 1;
    for (int32_t k = 0; k < t->ndim; k++) {
        if (t->shape[k] < 0)
            return tk__err(TK_ERR_INVALID, "%s: '%s' has shape %s: dimension %d is negative", op->name, p->name,
                           tk_ops__shape_fmt(t->ndim, t->shape), (int)k);
        if (t->shape[k] && numel > INT64_MAX / t->shape[k])
            return tk__err(TK_ERR_INVALID, "%s: '%s' has shape %s: too many elements", op->name, p->name,
                           tk_ops__shape_fmt(t->ndim, t->shape));
        numel *= t->shape[k];
    }
    if (numel > 0 && !t->data)
        return tk__err(TK_ERR_INVALID, "%s: '%s' has shape %s but a NULL data pointer", op->name, p->name,
                       tk_ops__shape_fmt(t->ndim, t->shape));

    unsigned bit = tk_ops__dtype_bit(t->dtype);
    if (!(bit & p->dtypes)) {
        dtypes_join(want, sizeof want, p->dtypes, ", ", " or ");
        if (bit)
            return tk__err(TK_ERR_INVALID, "%s: '%s' has dtype %s, want %s", op->name, p->name,
                           tk_ops__dtype_str(t->dtype), want);
        return tk__err(TK_ERR_INVALID, "%s: '%s' has an unknown dtype (code %u, %u bits, %u lanes), want %s", op->name,
                       p->name, t->dtype.code, t->dtype.bits, t->dtype.lanes, want);
    }
    int maxr = p->max_rank < 0 ? TK_OPS_MAX_RANK : p->max_rank;
    if (t->ndim < p->min_rank || t->ndim > maxr) {
        if (p->min_rank == maxr)
            snprintf(want, sizeof want, "%d", maxr);
        else if (p->max_rank < 0)
            snprintf(want, sizeof want, "at least %d", p->min_rank);
        else
            snprintf(want, sizeof want, "%d to %d", p->min_rank, maxr);
        return tk__err(TK_ERR_INVALID, "%s: '%s' has rank %d (shape %s), want %s", op->name, p->name, (int)t->ndim,
                       tk_ops__shape_fmt(t->ndim, t->shape), want);
    }
    return TK_OK;
}

static int bind(tk_op_call *c, const tk_arg *args, size_t nargs)
{
    const tk_op_desc *op = c->op;
    if (nargs && !args)
        return tk__err(TK_ERR_INVALID, "%s: %zu arguments but a NULL args array", op->name, nargs);
    for (size_t k = 0; k < nargs; k++) {
        const tk_arg *a = &args[k];
        int idx;
        if (a->name) {
            idx = tk_ops__param_index(op, a->name);
            if (idx < 0) {
                tk_buf names = TK_BUF_INIT;
                for (size_t i = 0; i < op->nparams; i++)
                    tk__buf_printf(&names, "%s%s", i ? ", " : "", op->params[i].name);
                int rc = tk__err(TK_ERR_INVALID, "%s: no parameter named '%s' (parameters: %s)", op->name, a->name,
                                 names.data ? names.data : "");
                tk__buf_free(&names);
                return rc;
            }
        } else {
            if (k >= op->nparams)
                return tk__err(TK_ERR_INVALID, "%s: takes %zu arguments, got %zu", op->name, op->nparams, nargs);
            idx = (int)k;
        }
        const tk_op_param *p = &op->params[idx];
        if (c->given[idx])
            return tk__err(TK_ERR_INVALID, "%s: argument '%s' given twice", op->name, p->name);
        c->given[idx] = 1;
        if (p->kind == TK_ARG_TENSOR) {
            if (a->kind != TK_ARG_TENSOR)
                return tk__err(TK_ERR_INVALID, "%s: '%s' must be a tensor, got a scalar", op->name, p->name);
            if (!a->t)
                return tk__err(TK_ERR_INVALID, "%s: '%s' is a NULL tensor", op->name, p->name);
            c->t[idx] = a->t;
        } else if (a->kind == TK_ARG_TENSOR) {
            return tk__err(TK_ERR_INVALID, "%s: '%s' must be a scalar, got a tensor", op->name, p->name);
        } else if (p->kind == TK_ARG_F64) {
            c->f[idx] = a->kind == TK_ARG_I64 ? (double)a->i : a->f;
        } else if (a->kind == TK_ARG_I64) {
            c->i[idx] = a->i;
        } else {
            if (!(a->f == floor(a->f)) || fabs(a->f) > 9.0e18)
                return tk__err(TK_ERR_INVALID, "%s: '%s' must be an integer, got %g", op->name, p->name, a->f);
            c->i[idx] = (int64_t)a->f;
        }
    }
    for (size_t i = 0; i < op->nparams; i++) {
        const tk_op_param *p = &op->params[i];
        if (c->given[i])
            continue;
        if (!p->optional) {
            tk_buf sig = TK_BUF_INIT;
            tk_ops__signature(&sig, op);
            int rc = tk__err(TK_ERR_INVALID, "%s: missing argument '%s'\nHINT: the signature is %s", op->name, p->name,
                             sig.data ? sig.data : op->name);
            tk__buf_free(&sig);
            return rc;
        }
        if (p->kind == TK_ARG_F64)
            c->f[i] = p->def;
        else if (p->kind == TK_ARG_I64)
            c->i[i] = (int64_t)p->def;
    }
    return TK_OK;
}

int tk_ops__prepare(tk_op_call *c, const char *name, const tk_arg *args, size_t nargs)
{
    memset(c, 0, sizeof *c);
    if (!name)
        return tk__err(TK_ERR_INVALID, "op name is NULL");
    const tk_op_desc *op = tk_ops__find(name);
    if (!op)
        return unknown_op(name);
    return tk_ops__prepare_op(c, op, args, nargs);
}

int tk_ops__prepare_op(tk_op_call *c, const tk_op_desc *op, const tk_arg *args, size_t nargs)
{
    memset(c, 0, sizeof *c);
    c->op = op;
    int rc = bind(c, args, nargs);
    if (rc != TK_OK)
        return rc;

    /* Each tensor alone, then dtype agreement, then one device for all. */
    int first = -1;
    for (size_t i = 0; i < op->nparams; i++) {
        if (op->params[i].kind != TK_ARG_TENSOR || !c->t[i])
            continue;
        if ((rc = check_tensor(c, i)) != TK_OK)
            return rc;
        if (first < 0)
            first = (int)i;
    }
    for (size_t i = 0; i < op->nparams; i++) {
        const tk_op_param *p = &op->params[i];
        if (p->kind != TK_ARG_TENSOR || !c->t[i] || p->dtype_like < 0 || !c->t[p->dtype_like])
            continue;
        tk_dtype a = c->t[i]->dtype, b = c->t[p->dtype_like]->dtype;
        if (tk_ops__dtype_bit(a) != tk_ops__dtype_bit(b) && !(p->or_f32 && tk_ops__dtype_bit(a) == TK_OPS_F32))
            return tk__err(TK_ERR_INVALID, "%s: '%s' has dtype %s, want %s%s (the dtype of '%s')", op->name, p->name,
                           tk_ops__dtype_str(a), p->or_f32 && tk_ops__dtype_bit(b) != TK_OPS_F32 ? "f32 or " : "",
                           tk_ops__dtype_str(b), op->params[p->dtype_like].name);
    }
    if (first < 0)
        return tk__err(TK_ERR_INTERNAL, "%s: op has no tensor argument", op->name);
    /* The primary tensor decides the dtype implementations are filtered on. */
    int primary = first;
    for (size_t i = 0; i < op->nparams; i++)
        if (op->params[i].kind == TK_ARG_TENSOR && c->t[i] && op->params[i].dtype_like < 0) {
            primary = (int)i;
            break;
        }
    c->dtype = c->t[primary]->dtype;
    c->device_type = c->t[first]->device.device_type;
    c->device_id = c->t[first]->device.device_id;
    for (size_t i = 0; i < op->nparams; i++) {
        const tk_tensor *t = c->t[i];
        if (op->params[i].kind != TK_ARG_TENSOR || !t)
            continue;
        char d1[32], d2[32];
        if (t->device.device_type != TK_DEV_CPU && t->device.device_type != TK_DEV_CUDA)
            return tk__err(TK_ERR_UNSUPPORTED, "%s: '%s' is on %s; tk runs ops on cpu and cuda tensors", op->name,
                           op->params[i].name, dev_str(d1, sizeof d1, t->device.device_type, t->device.device_id));
        if (t->device.device_type != c->device_type ||
            (c->device_type == TK_DEV_CUDA && t->device.device_id != c->device_id))
            return tk__err(TK_ERR_INVALID, "%s: '%s' is on %s but '%s' is on %s", op->name, op->params[i].name,
                           dev_str(d1, sizeof d1, t->device.device_type, t->device.device_id), op->params[first].name,
                           dev_str(d2, sizeof d2, c->device_type, c->device_id));
    }
    return op->check ? op->check(c) : TK_OK;
}

int tk_ops__run_cpu(const tk_op_call *c)
{
    if (!c || !c->op)
        return tk__err(TK_ERR_INVALID, "op call is not prepared");
    if (c->device_type != TK_DEV_CPU)
        return tk__err(TK_ERR_UNSUPPORTED, "%s: the CPU reference needs host tensors, these are on cuda:%d",
                       c->op->name, c->device_id);
    if (!c->op->cpu && tk_ops__is_declared(c->op))
        return tk__err(TK_ERR_UNSUPPORTED,
                       "no CPU reference for op %s (declared by %s)\nHINT: tk has CPU "
                       "references for its own ops only; run it on CUDA tensors",
                       c->op->name, c->op->package);
    if (!c->op->cpu)
        return tk__err(TK_ERR_UNSUPPORTED, "%s: no CPU reference", c->op->name);
    return c->op->cpu(c);
}

int tk_ops__signature(tk_buf *b, const tk_op_desc *op)
{
    /* A tensor whose dtype others follow gets a type variable (T, U, ...), listed at the end. */
    char var[TK_OPS_MAX_PARAMS] = {0};
    char next = 'T';
    for (size_t i = 0; i < op->nparams; i++) {
        int like = op->params[i].dtype_like;
        if (op->params[i].kind == TK_ARG_TENSOR && like >= 0 && (size_t)like < op->nparams && !var[like])
            var[like] = next++;
    }
    char dts[128];
    int rc = tk__buf_printf(b, "%s(", op->name);
    for (size_t i = 0; rc == TK_OK && i < op->nparams; i++) {
        const tk_op_param *p = &op->params[i];
        rc = tk__buf_printf(b, "%s%s: ", i ? ", " : "", p->name);
        if (rc != TK_OK)
            break;
        if (p->kind == TK_ARG_TENSOR) {
            if (p->dtype_like >= 0) {
                rc = tk__buf_printf(b, p->or_f32 ? "%c|f32" : "%c", var[p->dtype_like]);
            } else if (var[i]) {
                rc = tk__buf_printf(b, "%c", var[i]);
            } else {
                dtypes_join(dts, sizeof dts, p->dtypes, "|", "|");
                rc = tk__buf_puts(b, dts);
            }
            if (rc == TK_OK)
                rc = tk__buf_puts(b, p->shape ? p->shape : "[...]");
            if (rc == TK_OK && p->optional)
                rc = tk__buf_puts(b, "?"); /* may be left out */
        } else {
            rc = tk__buf_puts(b, p->kind == TK_ARG_F64 ? "f64" : "i64");
            if (rc == TK_OK && p->optional)
                rc = tk__buf_printf(b, " = %g", p->def);
        }
    }
    if (rc == TK_OK)
        rc = tk__buf_puts(b, ")");
    int nout = 0;
    for (size_t i = 0; rc == TK_OK && i < op->nparams; i++)
        if (op->params[i].kind == TK_ARG_TENSOR && op->params[i].role == TK_OPS_OUT)
            rc = tk__buf_printf(b, "%s%s", nout++ ? ", " : " -> ", op->params[i].name);
    for (size_t i = 0; rc == TK_OK && i < op->nparams; i++) {
        if (!var[i])
            continue;
        dtypes_join(dts, sizeof dts, op->params[i].dtypes, ", ", ", ");
        rc = tk__buf_printf(b, "; %c in {%s}", var[i], dts);
    }
    return rc;
}
