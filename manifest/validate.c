/*
 * validate.c — checks a manifest's kernel declarations when a package is installed, so a malformed
 * launch rule is an install-time error ("kernel 'x', launch.grid[0]: ...") and never a launch-time
 * surprise. Runs after the signature check, before anything is downloaded.
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

static int check_expr(const char *src, const tk_manifest_var *params, size_t n, const char *what)
{
    tk_manifest_expr *e = NULL;
    int rc = tk_manifest__expr_parse(&e, src, params, n, what);
    tk_manifest__expr_free(e);
    return rc;
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
            return tk__err(TK_ERR_MANIFEST, "kernel '%s': params[%zu] is a %s: only a tensor has a 'dtype' (a "
                           "scalar's C type is its 'type')", name, i, pt);
    }
    if (!json_is_object(cons))
        return TK_OK;
    static const char *const ccs[] = {"min_cc", "max_cc"};
    for (int c = 0; c < 2; c++)
        if ((v = json_object_get(cons, ccs[c])) && (!json_is_integer(v) || json_integer_value(v) < 10))
            return tk__err(TK_ERR_MANIFEST, "kernel '%s': constraints.%s must be an integer compute capability "
                           "times 10 (80 for sm_80)", name, ccs[c]);
    if ((v = json_object_get(cons, "arch_specific")) && !json_is_boolean(v))
        return tk__err(TK_ERR_MANIFEST, "kernel '%s': constraints.arch_specific must be true or false", name);
    if ((v = json_object_get(cons, "dtypes")) && !json_is_array(v))
        return tk__err(TK_ERR_MANIFEST, "kernel '%s': constraints.dtypes must be a list of dtypes", name);
    json_array_foreach(v, i, x) {
        tk_dtype dt;
        if (!json_is_string(x) || tk_ops__dtype_parse(&dt, json_string_value(x)) != TK_OK)
            return tk__err(TK_ERR_MANIFEST, "kernel '%s': constraints.dtypes[%zu] is not a dtype; want one of f32 "
                           "f16 bf16 f64 i8 u8 i32 i64 fp8_e4m3 fp8_e5m2", name, i);
    }
    static const char *const bounds[] = {"max", "min"};
    for (int b = 0; b < 2; b++)
        if ((v = json_object_get(cons, bounds[b])) && !json_is_object(v))
            return tk__err(TK_ERR_MANIFEST, "kernel '%s': constraints.%s must be an object of expression: bound",
                           name, bounds[b]);
    return TK_OK;
}

/* Name (unique), op, symbol, value types, and a source that is one of the package's files. */
static int check_head(json_t *k, size_t idx, json_t *files, json_t *seen_names)
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
    return TK_OK;
}

/* One param's name, type, optional flag, workspace rule and tensor dtype into params[i]. */
static int check_param(tk_manifest_var *params, size_t i, json_t *p, const char *name)
{
    const char *pn = json_string_value(json_object_get(p, "name"));
    const char *pt = json_string_value(json_object_get(p, "type"));
    if (!pn || param_type(pt) < 0)
        return tk__err(TK_ERR_MANIFEST, "kernel '%s': params[%zu] needs a 'name' and a 'type' of tensor, i32, "
                       "i64, f32, f64 or workspace", name, i);
    for (size_t j = 0; j < i; j++)
        if (!strcmp(params[j].name, pn))
            return tk__err(TK_ERR_MANIFEST, "kernel '%s': param '%s' is declared twice", name, pn);
    params[i].name = pn;
    params[i].type = param_type(pt);
    params[i].usable = params[i].type != TK_MANIFEST_P_WORKSPACE; /* a pointer: no expression may use it */
    json_t *opt = json_object_get(p, "optional");
    if (opt && (!json_is_boolean(opt) || (json_is_true(opt) && params[i].type != TK_MANIFEST_P_TENSOR)))
        return tk__err(TK_ERR_MANIFEST, "kernel '%s': param '%s': 'optional' must be true or false, and only "
                       "tensors can be optional", name, pn);
    if (params[i].type == TK_MANIFEST_P_WORKSPACE) {
        for (size_t j = 0; j < i; j++)
            if (params[j].type == TK_MANIFEST_P_WORKSPACE)
                return tk__err(TK_ERR_MANIFEST, "kernel '%s': more than one workspace param ('%s', '%s')", name,
                               params[j].name, pn);
        if (!json_is_string(json_object_get(p, "value")))
            return tk__err(TK_ERR_MANIFEST, "kernel '%s': workspace '%s' needs a 'value': an expression for its "
                           "size in bytes", name, pn);
    }
    if (params[i].type == TK_MANIFEST_P_TENSOR) {
        tk_dtype dt;
        const char *ds = json_string_value(json_object_get(p, "dtype"));
        if (!ds || tk_ops__dtype_parse(&dt, ds) != TK_OK)
            return tk__err(TK_ERR_MANIFEST, "kernel '%s': tensor param '%s' has dtype '%s'; want one of f32 f16 "
                           "bf16 f64 i8 u8 i32 i64 fp8_e4m3 fp8_e5m2", name, pn, ds ? ds : "(missing)");
    }
    return TK_OK;
}

/* Every param, then the derived scalars' value expressions: they may use tensors and caller scalars,
 * not other derived scalars. */
static int check_params(tk_manifest_var *params, size_t *np, json_t *k, const char *name)
{
    char what[200];
    json_t *jp = json_object_get(k, "params"), *p;
    size_t i;
    if (!json_is_array(jp) || json_array_size(jp) > MAX_PARAMS)
        return tk__err(TK_ERR_MANIFEST, "kernel '%s': 'params' must be an array of at most %d", name, MAX_PARAMS);
    *np = json_array_size(jp);
    json_array_foreach(jp, i, p) {
        int rc = check_param(params, i, p, name);
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
            return tk__err(TK_ERR_MANIFEST, "kernel '%s': param '%s': 'value' must be an expression string on a "
                           "scalar param", name, params[i].name);
        snprintf(what, sizeof what, "kernel '%s', params.%s.value", name, params[i].name);
        int rc = check_expr(json_string_value(v), vparams, *np, what);
        if (rc != TK_OK)
            return rc;
    }
    return TK_OK;
}

static int check_launch(json_t *k, const char *name, const tk_manifest_var *params, size_t np)
{
    char what[200];
    json_t *launch = json_object_get(k, "launch");
    size_t i;
    if (!json_is_object(launch))
        return tk__err(TK_ERR_MANIFEST, "kernel '%s': needs a 'launch' rule with grid, block and smem", name);
    static const char *const dims[] = {"grid", "block"};
    for (int d = 0; d < 2; d++) {
        json_t *arr = json_object_get(launch, dims[d]);
        if (!json_is_array(arr) || json_array_size(arr) < 1 || json_array_size(arr) > 3)
            return tk__err(TK_ERR_MANIFEST, "kernel '%s': launch.%s must be a list of 1 to 3 expressions", name,
                           dims[d]);
        json_t *x;
        json_array_foreach(arr, i, x) {
            snprintf(what, sizeof what, "kernel '%s', launch.%s[%zu]", name, dims[d], i);
            if (!json_is_string(x))
                return tk__err(TK_ERR_MANIFEST, "%s: not a string", what);
            int rc = check_expr(json_string_value(x), params, np, what);
            if (rc != TK_OK)
                return rc;
        }
    }
    json_t *smem = json_object_get(launch, "smem");
    if (smem) {
        snprintf(what, sizeof what, "kernel '%s', launch.smem", name);
        if (!json_is_string(smem))
            return tk__err(TK_ERR_MANIFEST, "%s: not a string", what);
        return check_expr(json_string_value(smem), params, np, what);
    }
    return TK_OK;
}

/* constraints (align, min/max bound expressions) and options. */
static int check_limits(json_t *k, const char *name, const tk_manifest_var *params, size_t np)
{
    char what[200];
    json_t *cons = json_object_get(k, "constraints");
    if (cons && !json_is_object(cons))
        return tk__err(TK_ERR_MANIFEST, "kernel '%s': 'constraints' must be an object", name);
    json_t *al = json_object_get(cons, "align");
    if (al && (!json_is_integer(al) || json_integer_value(al) < 1 || json_integer_value(al) > 4096 ||
               (json_integer_value(al) & (json_integer_value(al) - 1))))
        return tk__err(TK_ERR_MANIFEST, "kernel '%s': constraints.align must be a power of two from 1 to 4096 "
                       "(bytes every tensor's address is a multiple of)", name);
    const char *key;
    json_t *bound;
    for (int lo = 0; lo < 2; lo++) {
        json_object_foreach(json_object_get(cons, lo ? "min" : "max"), key, bound) {
            snprintf(what, sizeof what, "kernel '%s', constraints.%s", name, lo ? "min" : "max");
            if (!json_is_integer(bound))
                return tk__err(TK_ERR_MANIFEST, "%s: the bound of '%s' is not an integer", what, key);
            int rc = check_expr(key, params, np, what);
            if (rc != TK_OK)
                return rc;
        }
    }
    json_t *opts = json_object_get(k, "options"), *o;
    size_t i;
    if (opts && !json_is_array(opts))
        return tk__err(TK_ERR_MANIFEST, "kernel '%s': 'options' must be an array of strings", name);
    json_array_foreach(opts, i, o) {
        if (!json_is_string(o) || tk_jit__option_check(json_string_value(o)) != TK_OK)
            return tk__err_wrap(TK_ERR_MANIFEST, "kernel '%s': options[%zu]", name, i);
    }
    return TK_OK;
}

/* One kernel: its head, params, launch rule and limits, then its params against the signature of the
 * op it implements when that op is known here (tk's own, or declared in this manifest). */
static int check_kernel(json_t *k, size_t idx, json_t *files, json_t *seen_names, struct tk_op_desc *const *ops,
                        size_t nops)
{
    tk_manifest_var params[MAX_PARAMS];
    size_t np = 0;
    int rc = check_head(k, idx, files, seen_names);
    const char *name = json_string_value(json_object_get(k, "name"));
    if (rc == TK_OK)
        rc = check_params(params, &np, k, name);
    if (rc == TK_OK)
        rc = check_launch(k, name, params, np);
    if (rc == TK_OK)
        rc = check_limits(k, name, params, np);
    if (rc != TK_OK)
        return rc;
    const char *opname = json_string_value(json_object_get(k, "op"));
    const tk_op_desc *op = NULL;
    for (size_t i = 0; i < nops && !op; i++)
        if (!strcmp(ops[i]->name, opname))
            op = ops[i];
    if (!op)
        op = tk_ops__find(opname);
    return op ? tk_manifest__op_check_kernel(op, k) : TK_OK;
}

/* The manifest's "ops" into *ops (*nops of them; tk_manifest__op_declared_free each). */
static int declare_ops(json_t *m, tk_op_desc ***ops, size_t *nops, size_t *bad)
{
    json_t *decls = json_object_get(m, "ops"), *d;
    size_t i;
    *ops = NULL;
    *nops = 0;
    if (!decls)
        return TK_OK;
    if (!json_is_array(decls))
        return tk__err(TK_ERR_MANIFEST, "'ops' must be a list of op declarations (docs/package-format.md)");
    if (!(*ops = calloc(json_array_size(decls) + 1, sizeof **ops)))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    json_array_foreach(decls, i, d) {
        int rc = tk_manifest__op_declare(&(*ops)[i], d, json_string_value(json_object_get(m, "name")));
        for (size_t j = 0; rc == TK_OK && j < i; j++)
            if (!strcmp((*ops)[j]->name, (*ops)[i]->name))
                rc = tk__err(TK_ERR_MANIFEST, "op '%s' is declared twice", (*ops)[i]->name);
        if (rc != TK_OK) {
            *bad = i;
            return rc;
        }
        (*nops)++;
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
        return tk__err(TK_ERR_MANIFEST, "the package needs device toolkit %lld; this tk has <tk/device.cuh> "
                       "version %d\nHINT: upgrade tk, or use a version of the package made for this one",
                       (long long)json_integer_value(v), TK_JIT_DEVICE_TOOLKIT_VERSION);
    return TK_OK;
}

int tk_manifest__validate_json(json_t *m, const char **bad_in, size_t *bad)
{
    json_t *kernels = json_object_get(m, "kernels");
    json_t *names = json_object();
    tk_op_desc **ops = NULL;
    size_t nops = 0;
    int rc = TK_OK;
    *bad = (size_t)-1;
    *bad_in = NULL;
    if (!json_is_object(m) || !names) {
        rc = tk__err(TK_ERR_MANIFEST, "manifest is not a JSON object");
        goto done;
    }
    json_t *copts = json_object_get(json_object_get(m, "compile"), "options");
    size_t i;
    json_t *k;
    if ((rc = check_device_toolkit(json_object_get(m, "device_toolkit"))) != TK_OK)
        goto done;
    json_array_foreach(copts, i, k) {
        if (!json_is_string(k) || tk_jit__option_check(json_string_value(k)) != TK_OK) {
            rc = tk__err_wrap(TK_ERR_MANIFEST, "compile.options[%zu]", i);
            goto done;
        }
    }
    if ((rc = declare_ops(m, &ops, &nops, bad)) != TK_OK) {
        *bad_in = *bad != (size_t)-1 ? "ops" : NULL;
        goto done;
    }
    json_array_foreach(kernels, i, k) {
        if ((rc = check_kernel(k, i, json_object_get(m, "files"), names, ops, nops)) != TK_OK) {
            *bad = i;
            *bad_in = "kernels";
            goto done;
        }
    }
done:
    for (size_t j = 0; j < nops; j++)
        tk_manifest__op_declared_free(ops[j]);
    free(ops);
    json_decref(names);
    return rc;
}

int tk_manifest__validate_text(const char *manifest, size_t len)
{
    size_t bad;
    const char *bad_in;
    json_t *m = json_loadb(manifest, len, 0, NULL);
    if (!m)
        return tk__err(TK_ERR_MANIFEST, "manifest is not valid JSON");
    int rc = tk_manifest__validate_json(m, &bad_in, &bad);
    json_decref(m);
    return rc;
}
