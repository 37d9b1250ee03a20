/*
 * opdecl.c — ops that packages declare: an entry of kernel.json "ops" turned into a tk_op_desc, so a
 * new op is validated, listed, shape-checked and dispatched like a built-in one (it has no CPU
 * reference). The declaration has the shape `tk ops --json` prints for a built-in op's params
 * (name, kind, role, dtypes or dtype_like, shape, optional, default, doc), so one description serves
 * both; the rank bounds follow from the shape.
 *
 * Also the check of a kernel against the signature of the op it implements (manifest/validate.c runs it at
 * publish and install time), and the comparison that finds two packages declaring one op differently.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "manifest/manifest.h"
#include "ops/ops.h"

typedef struct {
    tk_op_desc d; /* first: the tk_op_desc * handed out is a decl * */
    tk_op_param p[TK_OPS_MAX_PARAMS];
    json_t *src;  /* a deep copy of the declaration: owns every string above but pkg */
    char *pkg;
} decl;

static int ident(const char *s)
{
    if (!s || !((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == '_'))
        return 0;
    size_t n = 0;
    for (; *s; s++, n++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_'))
            return 0;
    return n <= 63;
}

static unsigned dtype_bits(json_t *arr, const char *op, const char *pn, int *bad)
{
    unsigned bits = 0;
    size_t i;
    json_t *x;
    *bad = !json_is_array(arr) || json_array_size(arr) == 0;
    json_array_foreach(arr, i, x) {
        tk_dtype dt;
        if (!json_is_string(x) || tk_ops__dtype_parse(&dt, json_string_value(x)) != TK_OK) {
            *bad = 1;
            break;
        }
        bits |= tk_ops__dtype_bit(dt);
    }
    if (*bad)
        tk__err(TK_ERR_MANIFEST,
                "op '%s': param '%s': 'dtypes' must be a non-empty list of f32 f16 bf16 f64 i8 u8 "
                "i32 i64 fp8_e4m3 fp8_e5m2",
                op, pn);
    return bits;
}

/* One tensor param: role, dtypes or dtype_like (resolved later), shape and its ranks, optional. */
static int tensor_param(tk_op_param *p, json_t *j, const char *op)
{
    const char *role = json_string_value(json_object_get(j, "role"));
    json_t *dts = json_object_get(j, "dtypes"), *like = json_object_get(j, "dtype_like"), *opt;
    const char *why;
    if (role && strcmp(role, "in") && strcmp(role, "out"))
        return tk__err(TK_ERR_MANIFEST,
                       "op '%s': param '%s': 'role' is \"in\" (read) or \"out\" (written), not "
                       "\"%s\"",
                       op, p->name, role);
    p->role = role && !strcmp(role, "out") ? TK_OPS_OUT : TK_OPS_IN;
    if (!dts == !like || (like && !json_is_string(like)))
        return tk__err(TK_ERR_MANIFEST,
                       "op '%s': tensor '%s' needs 'dtypes' (a list) or 'dtype_like' (the name of "
                       "another tensor whose dtype it has), one of the two",
                       op, p->name);
    int bad = 0;
    if (dts && (p->dtypes = dtype_bits(dts, op, p->name, &bad), bad))
        return TK_ERR_MANIFEST;
    if (json_object_get(j, "default"))
        return tk__err(TK_ERR_MANIFEST,
                       "op '%s': tensor '%s' cannot have a 'default' (an optional tensor is left "
                       "out: \"optional\": true)",
                       op, p->name);
    json_t *shape = json_object_get(j, "shape");
    if (shape && !json_is_string(shape))
        return tk__err(TK_ERR_MANIFEST, "op '%s': tensor '%s': 'shape' must be a string such as \"[..., n]\"", op,
                       p->name);
    p->shape = shape ? json_string_value(shape) : "[...]";
    if (tk_ops__pattern_check(p->shape, &p->min_rank, &p->max_rank, &why) != 0)
        return tk__err(TK_ERR_MANIFEST,
                       "op '%s': tensor '%s' has shape %s: %s\nHINT: a shape is a list of dims, "
                       "each \"...\" (the leading dims, at most one), an integer, a symbol or INT*symbol: "
                       "\"[..., 2*d]\"",
                       op, p->name, p->shape, why);
    if ((opt = json_object_get(j, "optional")) && !json_is_boolean(opt))
        return tk__err(TK_ERR_MANIFEST, "op '%s': param '%s': 'optional' must be true or false", op, p->name);
    p->optional = json_is_true(opt);
    return TK_OK;
}

static int scalar_param(tk_op_param *p, json_t *j, const char *op)
{
    static const char *const tensor_only[] = {"role", "dtypes", "dtype_like", "shape"};
    for (size_t k = 0; k < 4; k++)
        if (json_object_get(j, tensor_only[k]))
            return tk__err(TK_ERR_MANIFEST, "op '%s': param '%s' is a scalar (%s): '%s' is for tensors", op, p->name,
                           p->kind == TK_ARG_I64 ? "i64" : "f64", tensor_only[k]);
    json_t *def = json_object_get(j, "default"), *opt = json_object_get(j, "optional");
    if (def && (!json_is_number(def) || (p->kind == TK_ARG_I64 && !json_is_integer(def))))
        return tk__err(TK_ERR_MANIFEST, "op '%s': param '%s': 'default' must be %s", op, p->name,
                       p->kind == TK_ARG_I64 ? "an integer" : "a number");
    if (opt && !json_is_boolean(opt))
        return tk__err(TK_ERR_MANIFEST, "op '%s': param '%s': 'optional' must be true or false", op, p->name);
    p->optional = def != NULL || json_is_true(opt);
    p->def = def ? json_number_value(def) : 0.0;
    return TK_OK;
}

static int one_param(tk_op_param *p, json_t *j, size_t i, const char *op)
{
    const char *name = json_string_value(json_object_get(j, "name"));
    const char *kind = json_string_value(json_object_get(j, "kind"));
    json_t *doc = json_object_get(j, "doc");
    if (!json_is_object(j) || !ident(name))
        return tk__err(TK_ERR_MANIFEST,
                       "op '%s': params[%zu] needs a 'name': letters, digits and '_', not starting "
                       "with a digit (it is a keyword argument in Python)",
                       op, i);
    p->name = name;
    p->dtype_like = -1;
    p->max_rank = -1;
    if (!kind || (strcmp(kind, "tensor") && strcmp(kind, "i64") && strcmp(kind, "f64")))
        return tk__err(TK_ERR_MANIFEST, "op '%s': param '%s' needs a 'kind': \"tensor\", \"i64\" or \"f64\"%s%s%s", op,
                       name, kind ? " (not \"" : "", kind ? kind : "", kind ? "\")" : "");
    if (doc && !json_is_string(doc))
        return tk__err(TK_ERR_MANIFEST, "op '%s': param '%s': 'doc' must be a string", op, name);
    p->doc = json_string_value(doc);
    p->kind = !strcmp(kind, "tensor") ? TK_ARG_TENSOR : !strcmp(kind, "i64") ? TK_ARG_I64 : TK_ARG_F64;
    return p->kind == TK_ARG_TENSOR ? tensor_param(p, j, op) : scalar_param(p, j, op);
}

/* dtype_like names a tensor of the op that has its own 'dtypes'; the param takes those dtypes. */
static int resolve_like(decl *d, json_t *params)
{
    size_t i;
    json_t *j;
    int ntensors = 0;
    json_array_foreach(params, i, j) {
        tk_op_param *p = &d->p[i];
        ntensors += p->kind == TK_ARG_TENSOR;
        for (size_t k = 0; k < i; k++)
            if (!strcmp(d->p[k].name, p->name))
                return tk__err(TK_ERR_MANIFEST, "op '%s': param '%s' is declared twice", d->d.name, p->name);
        const char *like = json_string_value(json_object_get(j, "dtype_like"));
        if (p->kind != TK_ARG_TENSOR || !like)
            continue;
        int idx = tk_ops__param_index(&d->d, like);
        if (idx < 0 || idx == (int)i || d->p[idx].kind != TK_ARG_TENSOR || d->p[idx].dtype_like >= 0 ||
            json_object_get(json_array_get(params, (size_t)idx), "dtype_like"))
            return tk__err(TK_ERR_MANIFEST,
                           "op '%s': tensor '%s' has dtype_like '%s': want another tensor of the op "
                           "that has its own 'dtypes'",
                           d->d.name, p->name, like);
        p->dtype_like = idx;
        p->dtypes = d->p[idx].dtypes;
    }
    if (!ntensors)
        return tk__err(TK_ERR_MANIFEST,
                       "op '%s': needs at least one tensor param (the call's device and dtype come "
                       "from its tensors)",
                       d->d.name);
    return TK_OK;
}

void tk_manifest__op_declared_free(struct tk_op_desc *op)
{
    decl *d = (decl *)op;
    if (!d)
        return;
    json_decref(d->src);
    free(d->pkg);
    free(d);
}

int tk_manifest__op_declare(struct tk_op_desc **out, json_t *j, const char *pkg)
{
    *out = NULL;
    const char *name = json_string_value(json_object_get(j, "name"));
    if (!json_is_object(j) || !ident(name))
        return tk__err(TK_ERR_MANIFEST,
                       "an op needs a 'name': letters, digits and '_', not starting with a digit, "
                       "at most 63 (got %s)",
                       name ? name : "none");
    if (tk_ops__find(name))
        return tk__err(TK_ERR_MANIFEST,
                       "op '%s' is one of tk's own ops: a package may implement it but not "
                       "redeclare its signature\nHINT: remove it from \"ops\"; 'tk ops %s' shows the signature its "
                       "kernels must follow",
                       name, name);
    json_t *params = json_object_get(j, "params"), *summary = json_object_get(j, "summary");
    if (!json_is_array(params) || json_array_size(params) < 1 || json_array_size(params) > TK_OPS_MAX_DECL_PARAMS)
        return tk__err(TK_ERR_MANIFEST, "op '%s': 'params' must be a list of 1 to %d params, outputs first", name,
                       TK_OPS_MAX_DECL_PARAMS);
    if (summary && !json_is_string(summary))
        return tk__err(TK_ERR_MANIFEST, "op '%s': 'summary' must be a string (one line: what it computes)", name);
    decl *d = calloc(1, sizeof *d);
    if (!d || !(d->src = json_deep_copy(j)) || !(d->pkg = tk__strdup(pkg ? pkg : "a package"))) {
        tk_manifest__op_declared_free((struct tk_op_desc *)d);
        return tk__err(TK_ERR_NOMEM, "out of memory");
    }
    params = json_object_get(d->src, "params");
    d->d.name = json_string_value(json_object_get(d->src, "name"));
    d->d.family = TK_OPS_FAMILY_DECLARED;
    d->d.summary = summary ? json_string_value(json_object_get(d->src, "summary")) : "";
    d->d.params = d->p;
    d->d.nparams = json_array_size(params);
    d->d.check = tk_ops__check_patterns;
    d->d.package = d->pkg;
    int rc = TK_OK;
    size_t i;
    json_t *p;
    json_array_foreach(params, i, p) {
        if ((rc = one_param(&d->p[i], p, i, name)) != TK_OK)
            break;
    }
    if (rc == TK_OK)
        rc = resolve_like(d, params);
    if (rc != TK_OK) {
        tk_manifest__op_declared_free((struct tk_op_desc *)d);
        return rc;
    }
    *out = &d->d;
    return TK_OK;
}

int tk_manifest__op_same(const struct tk_op_desc *a, const struct tk_op_desc *b)
{
    tk_buf x = TK_BUF_INIT, y = TK_BUF_INIT;
    int same = tk_ops__signature(&x, a) == TK_OK && tk_ops__signature(&y, b) == TK_OK && x.data && y.data &&
               !strcmp(x.data, y.data);
    tk__buf_free(&x);
    tk__buf_free(&y);
    return same;
}

/* The kernel's scalar types that carry an op's i64 or f64. */
static int scalar_fits(const char *ktype, int kind)
{
    if (kind == TK_ARG_I64)
        return !strcmp(ktype, "i64") || !strcmp(ktype, "i32");
    return !strcmp(ktype, "f64") || !strcmp(ktype, "f32");
}

int tk_manifest__op_check_kernel(const struct tk_op_desc *op, json_t *k)
{
    const char *kname = json_string_value(json_object_get(k, "name"));
    json_t *kp = json_object_get(k, "params"), *p;
    size_t i;
    json_array_foreach(kp, i, p) {
        const char *pn = json_string_value(json_object_get(p, "name"));
        const char *pt = json_string_value(json_object_get(p, "type"));
        if (!pn || !pt || json_object_get(p, "value"))
            continue; /* derived scalars and workspaces are the kernel's own */
        int idx = tk_ops__param_index(op, pn);
        if (idx < 0) {
            tk_buf names = TK_BUF_INIT;
            for (size_t j = 0; j < op->nparams; j++)
                tk__buf_printf(&names, "%s%s", j ? ", " : "", op->params[j].name);
            int rc = tk__err(TK_ERR_MANIFEST,
                             "kernel '%s': param '%s' is not a parameter of op '%s' (%s)\nHINT: a "
                             "kernel's params are the op's, by name, plus scalars with a 'value' expression",
                             kname, pn, op->name, names.data ? names.data : "");
            tk__buf_free(&names);
            return rc;
        }
        const tk_op_param *q = &op->params[idx];
        int tensor = !strcmp(pt, "tensor");
        if (tensor != (q->kind == TK_ARG_TENSOR) || (!tensor && !scalar_fits(pt, q->kind)))
            return tk__err(TK_ERR_MANIFEST, "kernel '%s': param '%s' is a %s, but op '%s' has it as a %s", kname, pn,
                           pt, op->name,
                           q->kind == TK_ARG_TENSOR ? "tensor"
                           : q->kind == TK_ARG_I64  ? "i64"
                                                    : "f64");
        tk_dtype dt;
        const char *ds = json_string_value(json_object_get(p, "dtype"));
        if (tensor && ds && tk_ops__dtype_parse(&dt, ds) == TK_OK && !(tk_ops__dtype_bit(dt) & q->dtypes)) {
            tk_buf sig = TK_BUF_INIT;
            tk_ops__signature(&sig, op);
            int rc = tk__err(TK_ERR_MANIFEST,
                             "kernel '%s': tensor '%s' has dtype %s, which op '%s' does not allow "
                             "there\nHINT: the signature is %s",
                             kname, pn, ds, op->name, sig.data ? sig.data : "");
            tk__buf_free(&sig);
            return rc;
        }
    }
    /* A required tensor the kernel does not take would be left unread, or an output unwritten. */
    for (size_t j = 0; j < op->nparams; j++) {
        const tk_op_param *q = &op->params[j];
        int taken = 0;
        json_array_foreach(kp, i, p) {
            taken |= tk__streq(json_string_value(json_object_get(p, "name")), q->name);
        }
        if (q->kind == TK_ARG_TENSOR && !q->optional && !taken)
            return tk__err(TK_ERR_MANIFEST, "kernel '%s' does not take '%s', a tensor op '%s' requires", kname, q->name,
                           op->name);
    }
    return TK_OK;
}
