/*
 * validate.c — a manifest's kernels, declared ops and compile options parsed once, validating as it
 * parses, into tk_manifest_kernels: what publish and install check (so a malformed launch rule is an
 * install-time error, "kernel 'x', launch.grid[0]: ...", never a launch-time surprise) and what the
 * JIT, the op registry and tk_pkg read. Runs after the signature check, before anything is downloaded.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jit/jit.h"
#include "manifest/expr.h"
#include "manifest/manifest.h"
#include "ops/ops.h"

#define MAX_PARAMS 64

static int param_type(const char *t)
{
    if (!t)
        return -1;
    if (!strcmp(t, "tensor"))
        return TK_MANIFEST_P_TENSOR;
    if (!strcmp(t, "i32"))
        return TK_MANIFEST_P_I32;
    if (!strcmp(t, "i64"))
        return TK_MANIFEST_P_I64;
    if (!strcmp(t, "workspace"))
        return TK_MANIFEST_P_WORKSPACE;
    if (!strcmp(t, "f32"))
        return TK_MANIFEST_P_F32;
    if (!strcmp(t, "f64"))
        return TK_MANIFEST_P_F64;
    return -1;
}

/* Parses src into *out (kept: the caller's kernel owns it), or only checks it (out NULL). */
static int parse_expr(tk_manifest_expr **out, const char *src, const tk_manifest_var *vars, size_t n, const char *what)
{
    tk_manifest_expr *e = NULL;
    int rc = tk_manifest__expr_parse(&e, src, vars, n, what);
    if (rc == TK_OK && out)
        *out = e;
    else
        tk_manifest__expr_free(e);
    return rc;
}

static char *dup_str(json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return tk__strdup(s ? s : "");
}

/* The value types docs/kernel.schema.json states and the code below would otherwise read loosely
 * (a string priority, a min_cc of "80", a dtype of "float32" in constraints). */
static int check_types(json_t *k, const char *name)
{
    json_t *cons = json_object_get(k, "constraints"), *v, *x;
    json_t *prio = json_object_get(k, "priority");
    size_t i;
    if (prio && !json_is_integer(prio))
        return tk__err(TK_ERR_MANIFEST, "kernel '%s': 'priority' must be an integer (higher ranks first)", name);
    json_array_foreach(json_object_get(k, "params"), i, x) {
        const char *pt = json_string_value(json_object_get(x, "type"));
        if (pt && strcmp(pt, "tensor") != 0 && json_object_get(x, "dtype"))
            return tk__err(TK_ERR_MANIFEST,
                           "kernel '%s': params[%zu] is a %s: only a tensor has a 'dtype' (a "
                           "scalar's C type is its 'type')",
                           name, i, pt);
    }
    if (!json_is_object(cons))
        return TK_OK;
    static const char *const ccs[] = {"min_cc", "max_cc"};
    for (int c = 0; c < 2; c++)
        if ((v = json_object_get(cons, ccs[c])) && (!json_is_integer(v) || json_integer_value(v) < 10))
            return tk__err(TK_ERR_MANIFEST,
                           "kernel '%s': constraints.%s must be an integer compute capability "
                           "times 10 (80 for sm_80)",
                           name, ccs[c]);
    if ((v = json_object_get(cons, "arch_specific")) && !json_is_boolean(v))
        return tk__err(TK_ERR_MANIFEST, "kernel '%s': constraints.arch_specific must be true or false", name);
    if ((v = json_object_get(cons, "dtypes")) && !json_is_array(v))
        return tk__err(TK_ERR_MANIFEST, "kernel '%s': constraints.dtypes must be a list of dtypes", name);
    json_array_foreach(v, i, x) {
        tk_dtype dt;
        if (!json_is_string(x) || tk_ops__dtype_parse(&dt, json_string_value(x)) != TK_OK)
            return tk__err(TK_ERR_MANIFEST,
                           "kernel '%s': constraints.dtypes[%zu] is not a dtype; want one of f32 "
                           "f16 bf16 f64 i8 u8 i32 i64 fp8_e4m3 fp8_e5m2",
                           name, i);
    }
    static const char *const bounds[] = {"max", "min"};
    for (int b = 0; b < 2; b++)
        if ((v = json_object_get(cons, bounds[b])) && !json_is_object(v))
            return tk__err(TK_ERR_MANIFEST, "kernel '%s': constraints.%s must be an object of expression: bound", name,
                           bounds[b]);
    return TK_OK;
}

/* Name (unique), op, symbol, value types, and a source that is one of the package's files. */
static int check_head(tk_manifest_kernel *d, json_t *k, size_t idx, json_t *files, json_t *seen_names)
{
    const char *name = json_string_value(json_object_get(k, "name"));
    if (!json_is_object(k) || !name || !*name)
        return tk__err(TK_ERR_MANIFEST, "kernels[%zu]: needs a 'name' string", idx);
    if (json_object_get(seen_names, name))
        return tk__err(TK_ERR_MANIFEST, "kernel '%s' is declared twice", name);
    json_object_set_new(seen_names, name, json_true());
    if (!json_is_string(json_object_get(k, "op")))
        return tk__err(TK_ERR_MANIFEST, "kernel '%s': needs an 'op' string", name);
    if (!json_is_string(json_object_get(k, "symbol")))
        return tk__err(TK_ERR_MANIFEST, "kernel '%s': needs a 'symbol' (entry point or name expression)", name);
    int trc = check_types(k, name);
    if (trc != TK_OK)
        return trc;
    const char *source = json_string_value(json_object_get(k, "source"));
    int found = 0;
    size_t i;
    json_t *f;
    json_array_foreach(files, i, f) {
        if (source && tk__streq(json_string_value(json_object_get(f, "path")), source))
            found = 1;
    }
    if (!found)
        return tk__err(TK_ERR_MANIFEST, "kernel '%s': source '%s' is not one of the package's files", name,
                       source ? source : "(missing)");
    d->name = dup_str(k, "name");
    d->op = dup_str(k, "op");
    d->source = dup_str(k, "source");
    d->symbol = dup_str(k, "symbol");
    if (!d->name || !d->op || !d->source || !d->symbol)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    d->priority = json_integer_value(json_object_get(k, "priority"));
    return TK_OK;
}

/* One param's name, type, optional flag, workspace rule and tensor dtype into params[i] (what
 * expressions may name) and kp. */
static int check_param(tk_manifest_var *params, tk_manifest_param *kp, size_t i, json_t *p, const char *name)
{
    const char *pn = json_string_value(json_object_get(p, "name"));
    const char *pt = json_string_value(json_object_get(p, "type"));
    if (!pn || param_type(pt) < 0)
        return tk__err(TK_ERR_MANIFEST,
                       "kernel '%s': params[%zu] needs a 'name' and a 'type' of tensor, i32, "
                       "i64, f32, f64 or workspace",
                       name, i);
    for (size_t j = 0; j < i; j++)
        if (!strcmp(params[j].name, pn))
            return tk__err(TK_ERR_MANIFEST, "kernel '%s': param '%s' is declared twice", name, pn);
    params[i].name = pn;
    params[i].type = param_type(pt);
    params[i].usable = params[i].type != TK_MANIFEST_P_WORKSPACE; /* a pointer: no expression may use it */
    json_t *opt = json_object_get(p, "optional");
    if (opt && (!json_is_boolean(opt) || (json_is_true(opt) && params[i].type != TK_MANIFEST_P_TENSOR)))
        return tk__err(TK_ERR_MANIFEST,
                       "kernel '%s': param '%s': 'optional' must be true or false, and only "
                       "tensors can be optional",
                       name, pn);
    if (params[i].type == TK_MANIFEST_P_WORKSPACE) {
        for (size_t j = 0; j < i; j++)
            if (params[j].type == TK_MANIFEST_P_WORKSPACE)
                return tk__err(TK_ERR_MANIFEST, "kernel '%s': more than one workspace param ('%s', '%s')", name,
                               params[j].name, pn);
        if (!json_is_string(json_object_get(p, "value")))
            return tk__err(TK_ERR_MANIFEST,
                           "kernel '%s': workspace '%s' needs a 'value': an expression for its "
                           "size in bytes",
                           name, pn);
    }
    if (params[i].type == TK_MANIFEST_P_TENSOR) {
        tk_dtype dt;
        const char *ds = json_string_value(json_object_get(p, "dtype"));
        if (!ds || tk_ops__dtype_parse(&dt, ds) != TK_OK)
            return tk__err(TK_ERR_MANIFEST,
                           "kernel '%s': tensor param '%s' has dtype '%s'; want one of f32 f16 "
                           "bf16 f64 i8 u8 i32 i64 fp8_e4m3 fp8_e5m2",
                           name, pn, ds ? ds : "(missing)");
        kp->dtype = dt;
    }
    kp->type = params[i].type;
    kp->optional = json_is_true(opt);
    if (!(kp->name = tk__strdup(pn)))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    params[i].name = kp->name; /* the JSON's strings may go before the kernel does */
    return TK_OK;
}

/* Every param, then the derived scalars' value expressions: they may use tensors and caller scalars,
 * not other derived scalars. */
static int check_params(tk_manifest_var *params, tk_manifest_kernel *d, json_t *k, const char *name)
{
    char what[200];
    json_t *jp = json_object_get(k, "params"), *p;
    size_t i, *np = &d->nparams;
    if (!json_is_array(jp) || json_array_size(jp) > MAX_PARAMS)
        return tk__err(TK_ERR_MANIFEST, "kernel '%s': 'params' must be an array of at most %d", name, MAX_PARAMS);
    if (!(d->params = calloc(json_array_size(jp) + 1, sizeof *d->params)))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    json_array_foreach(jp, i, p) {
        int rc = check_param(params, &d->params[i], i, p, name);
        *np = i + 1; /* what to free */
        if (rc != TK_OK)
            return rc;
    }
    tk_manifest_var vparams[MAX_PARAMS];
    memcpy(vparams, params, *np * sizeof *params);
    json_array_foreach(jp, i, p) {
        if (json_object_get(p, "value"))
            vparams[i].usable = 0;
    }
    json_array_foreach(jp, i, p) {
        json_t *v = json_object_get(p, "value");
        if (!v)
            continue;
        if (params[i].type == TK_MANIFEST_P_TENSOR || !json_is_string(v))
            return tk__err(TK_ERR_MANIFEST,
                           "kernel '%s': param '%s': 'value' must be an expression string on a "
                           "scalar param",
                           name, params[i].name);
        snprintf(what, sizeof what, "kernel '%s', params.%s.value", name, params[i].name);
        int rc = parse_expr(&d->params[i].value, json_string_value(v), vparams, *np, what);
        if (rc != TK_OK)
            return rc;
    }
    return TK_OK;
}

static int check_launch(tk_manifest_kernel *d, json_t *k, const char *name, const tk_manifest_var *params, size_t np)
{
    char what[200];
    json_t *launch = json_object_get(k, "launch");
    size_t i;
    if (!json_is_object(launch))
        return tk__err(TK_ERR_MANIFEST, "kernel '%s': needs a 'launch' rule with grid, block and smem", name);
    static const char *const dims[] = {"grid", "block"};
    for (int dim = 0; dim < 2; dim++) {
        json_t *arr = json_object_get(launch, dims[dim]);
        if (!json_is_array(arr) || json_array_size(arr) < 1 || json_array_size(arr) > 3)
            return tk__err(TK_ERR_MANIFEST, "kernel '%s': launch.%s must be a list of 1 to 3 expressions", name,
                           dims[dim]);
        json_t *x;
        json_array_foreach(arr, i, x) {
            snprintf(what, sizeof what, "kernel '%s', launch.%s[%zu]", name, dims[dim], i);
            if (!json_is_string(x))
                return tk__err(TK_ERR_MANIFEST, "%s: not a string", what);
            int rc = parse_expr(&(dim ? d->block : d->grid)[i], json_string_value(x), params, np, what);
            if (rc != TK_OK)
                return rc;
        }
    }
    json_t *smem = json_object_get(launch, "smem");
    snprintf(what, sizeof what, "kernel '%s', launch.smem", name);
    if (smem && !json_is_string(smem))
        return tk__err(TK_ERR_MANIFEST, "%s: not a string", what);
    return parse_expr(&d->smem, smem ? json_string_value(smem) : "0", params, np, what); /* never NULL */
}

/* constraints.min_cc, max_cc, arch_specific and dtypes (their types were checked by check_types). */
static int take_constraints(tk_manifest_kernel *d, json_t *cons)
{
    json_t *dts = json_object_get(cons, "dtypes"), *x;
    size_t i;
    d->min_cc = (int)json_integer_value(json_object_get(cons, "min_cc"));
    d->max_cc = (int)json_integer_value(json_object_get(cons, "max_cc"));
    d->arch_specific = json_is_true(json_object_get(cons, "arch_specific"));
    if (json_array_size(dts) && !(d->dtypes = calloc(json_array_size(dts), sizeof *d->dtypes)))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    json_array_foreach(dts, i, x) {
        if (tk_ops__dtype_parse(&d->dtypes[d->ndtypes], json_string_value(x)) == TK_OK)
            d->ndtypes++;
    }
    return TK_OK;
}

/* constraints (align, min/max bound expressions) and options. */
static int check_limits(tk_manifest_kernel *d, json_t *k, const char *name, const tk_manifest_var *params, size_t np)
{
    char what[200];
    json_t *cons = json_object_get(k, "constraints");
    if (cons && !json_is_object(cons))
        return tk__err(TK_ERR_MANIFEST, "kernel '%s': 'constraints' must be an object", name);
    json_t *al = json_object_get(cons, "align");
    if (al && (!json_is_integer(al) || json_integer_value(al) < 1 || json_integer_value(al) > 4096 ||
               (json_integer_value(al) & (json_integer_value(al) - 1))))
        return tk__err(TK_ERR_MANIFEST,
                       "kernel '%s': constraints.align must be a power of two from 1 to 4096 "
                       "(bytes every tensor's address is a multiple of)",
                       name);
    d->align = al ? json_integer_value(al) : 0;
    size_t nb = json_object_size(json_object_get(cons, "max")) + json_object_size(json_object_get(cons, "min"));
    if (nb && !(d->bounds = calloc(nb, sizeof *d->bounds)))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    const char *key;
    json_t *bound;
    for (int lo = 0; lo < 2; lo++) {
        json_object_foreach(json_object_get(cons, lo ? "min" : "max"), key, bound) {
            snprintf(what, sizeof what, "kernel '%s', constraints.%s", name, lo ? "min" : "max");
            if (!json_is_integer(bound))
                return tk__err(TK_ERR_MANIFEST, "%s: the bound of '%s' is not an integer", what, key);
            tk_manifest_bound *b = &d->bounds[d->nbounds];
            int rc = parse_expr(&b->expr, key, params, np, what);
            if (rc != TK_OK)
                return rc;
            b->bound = json_integer_value(bound);
            b->is_min = lo;
            d->nbounds++;
        }
    }
    json_t *opts = json_object_get(k, "options"), *o;
    size_t i;
    if (opts && !json_is_array(opts))
        return tk__err(TK_ERR_MANIFEST, "kernel '%s': 'options' must be an array of strings", name);
    if (json_array_size(opts) && !(d->options = calloc(json_array_size(opts), sizeof *d->options)))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    json_array_foreach(opts, i, o) {
        if (!json_is_string(o) || tk_jit__option_check(json_string_value(o)) != TK_OK)
            return tk__err_wrap(TK_ERR_MANIFEST, "kernel '%s': options[%zu]", name, i);
        if (!(d->options[d->noptions] = tk__strdup(json_string_value(o))))
            return tk__err(TK_ERR_NOMEM, "out of memory");
        d->noptions++;
    }
    return take_constraints(d, cons);
}

/* One kernel into d: its head, params, launch rule and limits, then its params against the signature
 * of the op it implements when that op is known here (tk's own, or declared in this manifest). */
static int check_kernel(tk_manifest_kernel *d, json_t *k, size_t idx, json_t *files, json_t *seen_names,
                        struct tk_op_desc *const *ops, size_t nops)
{
    tk_manifest_var params[MAX_PARAMS];
    int rc = check_head(d, k, idx, files, seen_names);
    const char *name = json_string_value(json_object_get(k, "name"));
    if (rc == TK_OK)
        rc = check_params(params, d, k, name);
    if (rc == TK_OK)
        rc = check_launch(d, k, name, params, d->nparams);
    if (rc == TK_OK)
        rc = check_limits(d, k, name, params, d->nparams);
    if (rc != TK_OK)
        return rc;
    const tk_op_desc *op = NULL;
    for (size_t i = 0; i < nops && !op; i++)
        if (!strcmp(ops[i]->name, d->op))
            op = ops[i];
    if (!op)
        op = tk_ops__find(d->op);
    return op ? tk_manifest__op_check_kernel(op, k) : TK_OK;
}

void tk_manifest__kernel_clear(tk_manifest_kernel *d)
{
    free(d->name);
    free(d->op);
    free(d->source);
    free(d->symbol);
    for (size_t i = 0; i < d->nparams; i++) {
        free(d->params[i].name);
        tk_manifest__expr_free(d->params[i].value);
    }
    free(d->params);
    for (int i = 0; i < 3; i++) {
        tk_manifest__expr_free(d->grid[i]);
        tk_manifest__expr_free(d->block[i]);
    }
    tk_manifest__expr_free(d->smem);
    for (size_t i = 0; i < d->nbounds; i++)
        tk_manifest__expr_free(d->bounds[i].expr);
    free(d->bounds);
    free(d->dtypes);
    for (size_t i = 0; i < d->noptions; i++)
        free(d->options[i]);
    free(d->options);
    memset(d, 0, sizeof *d);
}

/* The manifest's "ops" into out->ops. Lenient: a declaration this tk cannot read is left out. */
static int declare_ops(tk_manifest_kernels *out, json_t *m, int lenient, size_t *bad)
{
    json_t *decls = json_object_get(m, "ops"), *d;
    size_t i;
    if (!decls)
        return TK_OK;
    if (!json_is_array(decls))
        return lenient ? TK_OK
                       : tk__err(TK_ERR_MANIFEST, "'ops' must be a list of op declarations (docs/package-format.md)");
    if (!(out->ops = calloc(json_array_size(decls) + 1, sizeof *out->ops)))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    json_array_foreach(decls, i, d) {
        tk_op_desc *op = NULL;
        int rc = tk_manifest__op_declare(&op, d, json_string_value(json_object_get(m, "name")));
        for (size_t j = 0; rc == TK_OK && j < out->nops; j++)
            if (!strcmp(out->ops[j]->name, op->name))
                rc = tk__err(TK_ERR_MANIFEST, "op '%s' is declared twice", op->name);
        if (rc == TK_OK) {
            out->ops[out->nops++] = op;
            continue;
        }
        tk_manifest__op_declared_free(op);
        if (rc == TK_ERR_NOMEM || !lenient) {
            *bad = i;
            return rc;
        }
    }
    return TK_OK;
}

/* "device_toolkit" (optional): the <tk/device.cuh> version the sources need, at most this tk's. */
static int check_device_toolkit(json_t *v)
{
    if (!v)
        return TK_OK;
    if (!json_is_integer(v) || json_integer_value(v) < 1)
        return tk__err(TK_ERR_MANIFEST, "'device_toolkit' must be a positive integer: the version of "
                                        "<tk/device.cuh> the sources need (docs/device-toolkit.md)");
    if (json_integer_value(v) > TK_JIT_DEVICE_TOOLKIT_VERSION)
        return tk__err(TK_ERR_MANIFEST,
                       "the package needs device toolkit %lld; this tk has <tk/device.cuh> "
                       "version %d\nHINT: upgrade tk, or use a version of the package made for this one",
                       (long long)json_integer_value(v), TK_JIT_DEVICE_TOOLKIT_VERSION);
    return TK_OK;
}

/* compile.options, each one NVRTC accepts. Lenient: the valid ones. */
static int take_compile_options(tk_manifest_kernels *out, json_t *m, int lenient)
{
    json_t *copts = json_object_get(json_object_get(m, "compile"), "options"), *x;
    size_t i;
    if (json_array_size(copts) && !(out->copts = calloc(json_array_size(copts), sizeof *out->copts)))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    json_array_foreach(copts, i, x) {
        if (!json_is_string(x) || tk_jit__option_check(json_string_value(x)) != TK_OK) {
            if (lenient)
                continue;
            return tk__err_wrap(TK_ERR_MANIFEST, "compile.options[%zu]", i);
        }
        if (!(out->copts[out->ncopts] = tk__strdup(json_string_value(x))))
            return tk__err(TK_ERR_NOMEM, "out of memory");
        out->ncopts++;
    }
    return TK_OK;
}

/* Every kernel, in order, into out->k. Lenient: a kernel this tk cannot read is left out. */
static int take_kernels(tk_manifest_kernels *out, json_t *m, int lenient, size_t *bad)
{
    json_t *kernels = json_object_get(m, "kernels"), *k;
    json_t *names = json_object();
    size_t i;
    int rc = TK_OK;
    if (!names || (json_array_size(kernels) && !(out->k = calloc(json_array_size(kernels), sizeof *out->k)))) {
        json_decref(names);
        return tk__err(TK_ERR_NOMEM, "out of memory");
    }
    json_array_foreach(kernels, i, k) {
        tk_manifest_kernel *d = &out->k[out->nk];
        rc = check_kernel(d, k, i, json_object_get(m, "files"), names, out->ops, out->nops);
        if (rc == TK_OK) {
            out->nk++;
            continue;
        }
        tk_manifest__kernel_clear(d);
        if (rc == TK_ERR_NOMEM || !lenient) {
            *bad = i;
            break;
        }
        rc = TK_OK;
    }
    json_decref(names);
    return rc;
}

int tk_manifest__kernels_parse(tk_manifest_kernels *out, json_t *m, unsigned flags, const char **bad_in, size_t *bad)
{
    int lenient = (flags & TK_MANIFEST_LENIENT) != 0, rc;
    size_t bad_ = (size_t)-1;
    const char *bad_in_ = NULL;
    memset(out, 0, sizeof *out);
    if (!json_is_object(m)) {
        rc = tk__err(TK_ERR_MANIFEST, "manifest is not a JSON object");
        goto done;
    }
    if ((rc = check_device_toolkit(json_object_get(m, "device_toolkit"))) != TK_OK && !lenient)
        goto done;
    if ((rc = take_compile_options(out, m, lenient)) != TK_OK)
        goto done;
    if ((rc = declare_ops(out, m, lenient, &bad_)) != TK_OK) {
        bad_in_ = bad_ != (size_t)-1 ? "ops" : NULL;
        goto done;
    }
    if ((rc = take_kernels(out, m, lenient, &bad_)) != TK_OK)
        bad_in_ = bad_ != (size_t)-1 ? "kernels" : NULL;
done:
    if (bad_in)
        *bad_in = bad_in_;
    if (bad)
        *bad = bad_;
    if (rc != TK_OK)
        tk_manifest__kernels_free(out);
    return rc;
}

void tk_manifest__kernels_free(tk_manifest_kernels *ks)
{
    if (!ks)
        return;
    for (size_t i = 0; i < ks->nk; i++)
        tk_manifest__kernel_clear(&ks->k[i]);
    free(ks->k);
    for (size_t i = 0; i < ks->ncopts; i++)
        free(ks->copts[i]);
    free(ks->copts);
    for (size_t i = 0; i < ks->nops; i++)
        tk_manifest__op_declared_free(ks->ops[i]);
    free(ks->ops);
    memset(ks, 0, sizeof *ks);
}

int tk_manifest__validate_json(json_t *m, const char **bad_in, size_t *bad)
{
    tk_manifest_kernels ks;
    int rc = tk_manifest__kernels_parse(&ks, m, 0, bad_in, bad);
    tk_manifest__kernels_free(&ks);
    return rc;
}
