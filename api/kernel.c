/*
 * kernel.c — tk_get_kernel and launching: the device a kernel is for, its package built for that
 * device's arch (api/build.c), the modules loaded on the device (a cached binary the driver rejects is
 * recompiled once), and the two launches of tk.h: raw (tk_function_launch) and declarative
 * (tk_function_call: arguments bound by name, checked against the manifest's parameters and limits,
 * the grid and block from the launch rules).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/build.h"
#include "ops/ops.h"

#define KERNEL_MAGIC 0x746b6b6eu   /* "tkkn" */
#define FUNCTION_MAGIC 0x746b666eu /* "tkfn" */
#define MAX_PARAMS 64

/* ---- kernel declarations (manifest/) ---------------------------------------------------------- */

typedef tk_manifest_kernel kdecl;
typedef tk_manifest_param kparam;
typedef tk_api_pkgsrc pkgsrc;
typedef tk_api_cunit cunit;
typedef tk_api_plan plan;

/* ---- kernels and functions -------------------------------------------------------------------- */

struct tk_function {
    uint32_t magic;
    tk_kernel *k;
    kdecl d;
    tk_jit_module *mod;
    void *fn;
    char key[TK_SHA256_HEX]; /* the cache key of the unit it was compiled in (self-test records) */
};

struct tk_kernel {
    uint32_t magic;
    int device;
    int sm_count; /* the device's multiprocessors: launch rules' sm_count */
    char *pkgname;
    char *manifest; /* the package's manifest text (a local package's as a publish would write it) */
    tk_jit_module **mods;
    size_t nmods;
    struct tk_function *fns;
    size_t nfns;
};

void tk_kernel_free(tk_kernel *k)
{
    if (!k || k->magic != KERNEL_MAGIC)
        return;
    for (size_t i = 0; i < k->nfns; i++) {
        tk_manifest__kernel_clear(&k->fns[i].d);
        k->fns[i].magic = 0;
    }
    free(k->fns);
    for (size_t i = 0; i < k->nmods; i++)
        tk_jit__module_release(k->mods[i]);
    free(k->mods);
    free(k->pkgname);
    free(k->manifest);
    k->magic = 0;
    free(k);
}

static int load_unit(tk_jit_module **m, cunit *c, int device, tk_jit_sandbox *sb, int *stale)
{
    const void *img = c->bin->cubin ? (const void *)c->bin->cubin : (const void *)c->bin->ptx;
    char first[1024];
    int st2 = 0, rc = tk_jit__module_load_in(m, device, sb, img, stale);
    /* a CUBIN this driver rejects may still run from its PTX (not for sm_XYa PTX) */
    if (rc == TK_OK || !c->bin->cubin || !c->bin->ptx || c->u.arch_specific)
        return rc;
    snprintf(first, sizeof first, "%s", tk_last_error());
    if (tk_jit__module_load_in(m, device, sb, c->bin->ptx, &st2) == TK_OK) {
        *stale = 0;
        return TK_OK;
    }
    return tk__err(rc, "%s", first);
}

/* The device a kernel is for: a GPU must exist; *info and *cc (x10) describe the one asked for. */
static int kernel_device(tk_device_info *info, int *cc, const char *ref, int device)
{
    int rc, ndev = 0;
    if ((rc = tk_jit__device_count(&ndev)) != TK_OK)
        return rc;
    if (ndev == 0)
        return tk__err(TK_ERR_NO_DEVICE,
                       "no CUDA device: the driver loaded but found no GPU\n"
                       "HINT: check 'nvidia-smi' and CUDA_VISIBLE_DEVICES; without a GPU, compile ahead "
                       "of time with 'tk build %s --arch sm_90'",
                       ref);
    if ((rc = tk_jit__device_info(info, device)) != TK_OK)
        return rc;
    *cc = info->cc_major * 10 + info->cc_minor;
    return TK_OK;
}

/* Loads each unit's module on the device and makes a tk_function of each of its kernels (their
 * declarations move from s into k). A cached binary the driver rejects is dropped and recompiled
 * once. */
static int kernel_load(tk_kernel *k, tk_ctx *ctx, plan *p, pkgsrc *s, tk_kcache *kc, tk_jit_sandbox *sb)
{
    int rc;
    for (size_t i = 0; i < p->n; i++) {
        cunit *c = &p->u[i];
        tk_jit_module *m = NULL;
        int stale = 0;
        rc = load_unit(&m, c, k->device, sb, &stale);
        if (rc != TK_OK && stale && c->cached) {
            tk_api__log(ctx, TK_LOG_WARN, "cached binary for %s rejected by the driver; recompiling", c->label);
            tk_kcache__remove(kc, c->key);
            tk_jit__binary_free(c->bin);
            c->bin = NULL;
            c->cached = 0;
            if ((rc = tk_api__plan_build(p, ctx, s, 0, NULL, NULL)) != TK_OK)
                return rc;
            rc = load_unit(&m, c, k->device, sb, &stale);
        }
        if (rc != TK_OK)
            return tk__err_wrap(rc, "%s (%s)", c->label, c->target);
        k->mods[k->nmods++] = m;
        for (size_t j = 0; j < c->nk; j++) {
            struct tk_function *f = &k->fns[k->nfns];
            void *fn = NULL;
            if ((rc = tk_jit__module_function(&fn, m, c->bin->lowered[c->kname[j]])) != TK_OK)
                return rc;
            f->magic = FUNCTION_MAGIC;
            f->k = k;
            f->d = s->k[c->kidx[j]];
            memset(&s->k[c->kidx[j]], 0, sizeof s->k[0]); /* moved into the function */
            f->mod = m;
            f->fn = fn;
            memcpy(f->key, c->key, sizeof f->key);
            k->nfns++;
        }
    }
    return TK_OK;
}

int tk_get_kernel(tk_kernel **out, tk_ctx *ctx, const char *ref, const tk_kernel_opts *opts)
{
    return tk_api__get_kernel_in(out, ctx, ref, opts, NULL);
}

int tk_api__get_kernel_in(tk_kernel **out, tk_ctx *ctx, const char *ref, const tk_kernel_opts *opts,
                          struct tk_jit_sandbox *sb)
{
    tk_kernel_opts def = TK_KERNEL_OPTS_INIT;
    tk_device_info info;
    tk_kernel *k = NULL;
    tk_kcache *kc = NULL;
    char *manifest = NULL;
    pkgsrc s;
    plan p;
    int rc, cc = 0;

    memset(&s, 0, sizeof s);
    memset(&p, 0, sizeof p);
    if (out)
        *out = NULL;
    if (!out || !ref)
        return tk__err(TK_ERR_INVALID, "tk_get_kernel: out and ref are required");
    if ((rc = tk_api__check_ctx(ctx)) != TK_OK)
        return rc;
    if (!opts)
        opts = &def;
    if (opts->version < 1 || opts->version > TK_KERNEL_OPTS_VERSION)
        return tk__err(TK_ERR_INVALID, "tk_get_kernel: unknown opts version %u", opts->version);
    if ((rc = kernel_device(&info, &cc, ref, opts->device)) != TK_OK)
        return rc;
    if ((rc = tk_api__kernel_host(&s, &manifest, &p, &kc, ctx, ref, opts, &info, cc)) != TK_OK)
        goto fail;
    if (!(k = calloc(1, sizeof *k)) || !(k->mods = calloc(p.n, sizeof *k->mods)) ||
        !(k->fns = calloc(s.nk, sizeof *k->fns)) || !(k->pkgname = tk__strdup(s.pkgname))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto fail;
    }
    k->magic = KERNEL_MAGIC;
    k->device = opts->device;
    k->manifest = manifest;
    manifest = NULL;
    {
        tk_device_info di;
        k->sm_count = tk_device_info_get(&di, opts->device) == TK_OK ? di.sm_count : 0;
    }
    if ((rc = kernel_load(k, ctx, &p, &s, kc, sb)) != TK_OK)
        goto fail;
    *out = k;
    k = NULL;
    rc = TK_OK;
fail:
    tk_kernel_free(k);
    tk_api__plan_free(&p);
    tk_api__pkgsrc_free(&s);
    free(manifest);
    return rc;
}

const char *tk_kernel_manifest(const tk_kernel *k) { return k && k->magic == KERNEL_MAGIC ? k->manifest : NULL; }

size_t tk_kernel_function_count(const tk_kernel *k) { return k && k->magic == KERNEL_MAGIC ? k->nfns : 0; }

const tk_function *tk_kernel_function_at(const tk_kernel *k, size_t i)
{
    if (!k || k->magic != KERNEL_MAGIC || i >= k->nfns)
        return NULL;
    return &k->fns[i];
}

int tk_kernel_function(const tk_function **out, const tk_kernel *k, const char *name)
{
    tk_buf names = TK_BUF_INIT;
    if (out)
        *out = NULL;
    if (!out || !k || k->magic != KERNEL_MAGIC || !name)
        return tk__err(TK_ERR_INVALID, "tk_kernel_function: bad kernel or name");
    for (size_t i = 0; i < k->nfns; i++)
        if (strcmp(k->fns[i].d.name, name) == 0) {
            *out = &k->fns[i];
            return TK_OK;
        }
    for (size_t i = 0; i < k->nfns && names.len < 400; i++)
        tk__buf_printf(&names, "%s%s", i ? ", " : "", k->fns[i].d.name);
    tk__err(TK_ERR_NOT_FOUND, "%s has no function '%s' for this device (functions: %s)", k->pkgname, name,
            names.data ? names.data : "none");
    tk__buf_free(&names);
    return TK_ERR_NOT_FOUND;
}

static int check_fn(const tk_function *fn)
{
    if (!fn || fn->magic != FUNCTION_MAGIC || !fn->k || fn->k->magic != KERNEL_MAGIC)
        return tk__err(TK_ERR_INVALID, "not a live tk_function (was its tk_kernel freed?)");
    return TK_OK;
}

const char *tk_function_name(const tk_function *fn) { return check_fn(fn) == TK_OK ? fn->d.name : NULL; }
const char *tk_api__function_key(const tk_function *fn) { return check_fn(fn) == TK_OK ? fn->key : NULL; }
const char *tk_api__kernel_pkgname(const tk_kernel *k) { return k && k->magic == KERNEL_MAGIC ? k->pkgname : NULL; }

const char *tk_function_op(const tk_function *fn) { return check_fn(fn) == TK_OK ? fn->d.op : NULL; }

int tk_function_launch(const tk_function *fn, const unsigned grid[3], const unsigned block[3], size_t smem,
                       void *stream, void **args)
{
    int rc;
    if ((rc = check_fn(fn)) != TK_OK)
        return rc;
    if (!grid || !block || (!args && fn->d.nparams))
        return tk__err(TK_ERR_INVALID, "tk_function_launch(%s): grid, block and args are required", fn->d.name);
    if ((rc = tk_jit__launch(fn->mod, fn->fn, grid, block, smem, stream, args, 0, NULL)) != TK_OK)
        return tk__err_wrap(rc, "%s", fn->d.name);
    return TK_OK;
}

/* ---- the declarative call --------------------------------------------------------------------- */

typedef union {
    uint64_t ptr;
    int32_t i32;
    int64_t i64;
    float f32;
    double f64;
} argslot;

static int eval_dim(int64_t *v, const tk_manifest_expr *e, const tk_manifest_value *vals, size_t n, int sm_count)
{
    if (!e) {
        *v = 1;
        return TK_OK;
    }
    return tk_manifest__expr_eval_dev(v, e, vals, n, sm_count);
}

/* One call's state: which argument each parameter is bound to, what the launch rule knows of it,
 * and the kernel argument slots. */
typedef struct {
    int bound[MAX_PARAMS]; /* index into args, -1 when not given */
    tk_manifest_value vals[MAX_PARAMS];
    argslot slots[MAX_PARAMS];
    int ws_slot; /* the workspace parameter, -1 if none */
    size_t ws_bytes;
} call_state;

/* Binds args to parameters: named arguments first, then the unnamed ones fill the remaining caller
 * (not derived) parameters in order. */
static int bind_args(call_state *cs, const kdecl *d, const tk_arg *args, size_t nargs)
{
    size_t next = 0;
    for (size_t i = 0; i < d->nparams; i++)
        cs->bound[i] = -1;
    for (size_t a = 0; a < nargs; a++) {
        size_t i;
        if (!args[a].name)
            continue;
        for (i = 0; i < d->nparams; i++)
            if (strcmp(d->params[i].name, args[a].name) == 0)
                break;
        if (i == d->nparams) {
            tk_buf names = TK_BUF_INIT;
            for (size_t j = 0; j < d->nparams; j++)
                tk__buf_printf(&names, "%s%s", j ? ", " : "", d->params[j].name);
            tk__err(TK_ERR_INVALID, "%s has no parameter '%s' (parameters: %s)", d->name, args[a].name,
                    names.data ? names.data : "none");
            tk__buf_free(&names);
            return TK_ERR_INVALID;
        }
        if (d->params[i].value)
            return tk__err(TK_ERR_INVALID, "%s: '%s' is derived by the launch rule (%s); do not pass it", d->name,
                           args[a].name, tk_manifest__expr_src(d->params[i].value));
        if (cs->bound[i] >= 0)
            return tk__err(TK_ERR_INVALID, "%s: '%s' is given twice", d->name, args[a].name);
        cs->bound[i] = (int)a;
    }
    for (size_t a = 0; a < nargs; a++) {
        if (args[a].name)
            continue;
        while (next < d->nparams && (cs->bound[next] >= 0 || d->params[next].value))
            next++;
        if (next == d->nparams)
            return tk__err(TK_ERR_INVALID, "%s: too many arguments (%zu given)", d->name, nargs);
        cs->bound[next++] = (int)a;
    }
    return TK_OK;
}

/* A tensor argument: dtype, device, shape and alignment checked; its pointer and shape recorded. */
static int take_tensor(const tk_function *fn, const kparam *p, const tk_arg *a, tk_manifest_value *val, argslot *slot)
{
    const kdecl *d = &fn->d;
    const tk_tensor *t = a->t;
    if (a->kind != TK_ARG_TENSOR || !t)
        return tk__err(TK_ERR_INVALID, "%s: '%s' must be a tensor", d->name, p->name);
    if (t->dtype.code != p->dtype.code || t->dtype.bits != p->dtype.bits || t->dtype.lanes != 1)
        return tk__err(TK_ERR_INVALID, "%s: '%s' must be %s, got %s", d->name, p->name, tk_dtype_name(p->dtype),
                       tk_dtype_name(t->dtype));
    if (t->device.device_type != TK_DEV_CUDA || t->device.device_id != fn->k->device)
        return tk__err(TK_ERR_INVALID, "%s: '%s' is on %s:%d; this function runs on cuda:%d", d->name, p->name,
                       t->device.device_type == TK_DEV_CPU ? "cpu" : "device", (int)t->device.device_id, fn->k->device);
    if (t->ndim < 0 || t->ndim > 32 || (t->ndim && !t->shape))
        return tk__err(TK_ERR_INVALID, "%s: '%s' has a bad ndim %d", d->name, p->name, (int)t->ndim);
    for (int32_t j = 0; j < t->ndim; j++)
        if (t->shape[j] < 0)
            return tk__err(TK_ERR_INVALID, "%s: '%s' has a negative size in dimension %d", d->name, p->name, (int)j);
    val->known = 1;
    val->ndim = t->ndim;
    val->shape = t->shape;
    val->strides = t->strides;
    slot->ptr = (uint64_t)(uintptr_t)t->data + t->byte_offset;
    /* Every kernel loads a tensor's elements as their type: an address that is not a multiple of the
     * element size faults (CUDA_ERROR_MISALIGNED_ADDRESS, which ends the CUDA context), whatever the
     * kernel declares. */
    uint64_t esize = t->dtype.bits % 8 == 0 ? (uint64_t)(t->dtype.bits / 8) : 1;
    if (esize > 1 && slot->ptr % esize)
        return tk__err(TK_ERR_UNSUPPORTED,
                       "%s: '%s' starts at 0x%llx, not a multiple of its element size (%llu bytes of %s): no "
                       "kernel can load it\n"
                       "HINT: a view's byte_offset must be a whole number of elements; pass a contiguous copy",
                       d->name, p->name, (unsigned long long)slot->ptr, (unsigned long long)esize,
                       tk_dtype_name(t->dtype));
    if (d->align > 1 && slot->ptr % (uint64_t)d->align)
        return tk__err(TK_ERR_UNSUPPORTED,
                       "%s: '%s' starts at 0x%llx, not a multiple of %lld bytes (constraints.align)\n"
                       "HINT: pass an aligned tensor (a fresh allocation, or a contiguous copy of the view)",
                       d->name, p->name, (unsigned long long)slot->ptr, (long long)d->align);
    return TK_OK;
}

/* A scalar argument: an integer (i32 range-checked) or a floating-point number. */
static int take_scalar(const kdecl *d, const kparam *p, const tk_arg *a, tk_manifest_value *val, argslot *slot)
{
    if (p->type == TK_MANIFEST_P_I32 || p->type == TK_MANIFEST_P_I64) {
        if (a->kind != TK_ARG_I64)
            return tk__err(TK_ERR_INVALID, "%s: '%s' must be an integer (TK_ARG_I64)", d->name, p->name);
        if (p->type == TK_MANIFEST_P_I32 && (a->i < INT32_MIN || a->i > INT32_MAX))
            return tk__err(TK_ERR_INVALID, "%s: '%s' = %lld does not fit i32", d->name, p->name, (long long)a->i);
        val->known = 1;
        val->i = a->i;
        if (p->type == TK_MANIFEST_P_I32)
            slot->i32 = (int32_t)a->i;
        else
            slot->i64 = a->i;
        return TK_OK;
    }
    double v;
    if (a->kind == TK_ARG_F64)
        v = a->f;
    else if (a->kind == TK_ARG_I64)
        v = (double)a->i;
    else
        return tk__err(TK_ERR_INVALID, "%s: '%s' must be a number", d->name, p->name);
    if (p->type == TK_MANIFEST_P_F32)
        slot->f32 = (float)v;
    else
        slot->f64 = v;
    return TK_OK;
}

/* Every caller parameter's argument, checked and converted (an optional one left out is null). */
static int take_args(call_state *cs, const tk_function *fn, const tk_arg *args)
{
    const kdecl *d = &fn->d;
    int rc;
    for (size_t i = 0; i < d->nparams; i++) {
        const kparam *p = &d->params[i];
        int b = cs->bound[i];
        if (p->value)
            continue;
        if (p->optional && (b < 0 || (args[b].kind == TK_ARG_TENSOR && !args[b].t))) {
            cs->slots[i].ptr = 0; /* left out: a null pointer, and unknown to the launch rule */
            continue;
        }
        if (b < 0)
            return tk__err(TK_ERR_INVALID, "%s: missing argument '%s'", d->name, p->name);
        rc = p->type == TK_MANIFEST_P_TENSOR ? take_tensor(fn, p, &args[b], &cs->vals[i], &cs->slots[i])
                                             : take_scalar(d, p, &args[b], &cs->vals[i], &cs->slots[i]);
        if (rc != TK_OK)
            return rc;
    }
    return TK_OK;
}

/* Derived scalars (they may use tensors and caller scalars only) and the workspace size; then the
 * derived integers are known to the launch rule too. */
static int derive_params(call_state *cs, const tk_function *fn)
{
    const kdecl *d = &fn->d;
    int rc;
    for (size_t i = 0; i < d->nparams; i++) {
        const kparam *p = &d->params[i];
        int64_t v;
        if (!p->value)
            continue;
        if ((rc = tk_manifest__expr_eval_dev(&v, p->value, cs->vals, d->nparams, fn->k->sm_count)) != TK_OK)
            return rc;
        if (p->type == TK_MANIFEST_P_WORKSPACE) {
            if (v < 0 || (uint64_t)v > (uint64_t)1 << 40)
                return tk__err(TK_ERR_INVALID, "%s: workspace '%s' = %lld bytes is out of range", d->name, p->name,
                               (long long)v);
            if (cs->ws_slot >= 0)
                return tk__err(TK_ERR_INVALID, "%s: more than one workspace parameter", d->name);
            cs->ws_slot = (int)i;
            cs->ws_bytes = (size_t)v;
            continue;
        }
        if (p->type == TK_MANIFEST_P_I32 && (v < INT32_MIN || v > INT32_MAX))
            return tk__err(TK_ERR_INVALID, "%s: derived '%s' = %lld does not fit i32", d->name, p->name, (long long)v);
        switch (p->type) {
        case TK_MANIFEST_P_I32: cs->slots[i].i32 = (int32_t)v; break;
        case TK_MANIFEST_P_I64: cs->slots[i].i64 = v; break;
        case TK_MANIFEST_P_F32: cs->slots[i].f32 = (float)v; break;
        default: cs->slots[i].f64 = (double)v; break;
        }
    }
    for (size_t i = 0; i < d->nparams; i++)
        if (d->params[i].value && (d->params[i].type == TK_MANIFEST_P_I32 || d->params[i].type == TK_MANIFEST_P_I64)) {
            cs->vals[i].known = 1;
            cs->vals[i].i = d->params[i].type == TK_MANIFEST_P_I32 ? cs->slots[i].i32 : cs->slots[i].i64;
        }
    return TK_OK;
}

/* The manifest's constraints.max / .min on expressions of the arguments. */
static int check_limits(const call_state *cs, const tk_function *fn)
{
    const kdecl *d = &fn->d;
    int rc;
    for (size_t m = 0; m < d->nbounds; m++) {
        const tk_manifest_bound *b = &d->bounds[m];
        int64_t v;
        if ((rc = tk_manifest__expr_eval_dev(&v, b->expr, cs->vals, d->nparams, fn->k->sm_count)) != TK_OK)
            return rc;
        if (b->is_min ? v < b->bound : v > b->bound)
            return tk__err(TK_ERR_UNSUPPORTED, "%s: %s = %lld is %s the kernel's limit %lld (constraints.%s)", d->name,
                           tk_manifest__expr_src(b->expr), (long long)v, b->is_min ? "below" : "above",
                           (long long)b->bound, b->is_min ? "min" : "max");
    }
    return TK_OK;
}

/* The launch rule: grid, block and dynamic shared memory, range-checked. *empty is set when the grid
 * has no block (empty tensors: nothing to launch). */
static int launch_geometry(unsigned grid[3], unsigned block[3], size_t *smem_out, int *empty, const call_state *cs,
                           const tk_function *fn)
{
    const kdecl *d = &fn->d;
    int64_t g[3], b[3], smem;
    int rc;
    for (int j = 0; j < 3; j++) {
        if ((rc = eval_dim(&g[j], d->grid[j], cs->vals, d->nparams, fn->k->sm_count)) != TK_OK ||
            (rc = eval_dim(&b[j], d->block[j], cs->vals, d->nparams, fn->k->sm_count)) != TK_OK)
            return rc;
    }
    if ((rc = tk_manifest__expr_eval_dev(&smem, d->smem, cs->vals, d->nparams, fn->k->sm_count)) != TK_OK)
        return rc;
    *empty = g[0] == 0 || g[1] == 0 || g[2] == 0;
    if (*empty)
        return TK_OK;
    if (g[0] < 0 || g[0] > INT32_MAX || g[1] < 0 || g[1] > 65535 || g[2] < 0 || g[2] > 65535)
        return tk__err(TK_ERR_INVALID, "%s: launch grid (%lld, %lld, %lld) is out of range", d->name, (long long)g[0],
                       (long long)g[1], (long long)g[2]);
    if (b[0] < 1 || b[1] < 1 || b[2] < 1 || b[0] > 1024 || b[1] > 1024 || b[2] > 64 || b[0] * b[1] * b[2] > 1024)
        return tk__err(TK_ERR_INVALID, "%s: launch block (%lld, %lld, %lld) is out of range (1 to 1024 threads)",
                       d->name, (long long)b[0], (long long)b[1], (long long)b[2]);
    if (smem < 0 || smem > INT32_MAX)
        return tk__err(TK_ERR_INVALID, "%s: launch smem %lld is out of range", d->name, (long long)smem);
    for (int j = 0; j < 3; j++) {
        grid[j] = (unsigned)g[j];
        block[j] = (unsigned)b[j];
    }
    *smem_out = (size_t)smem;
    return TK_OK;
}

int tk_function_call(const tk_function *fn, const tk_arg *args, size_t nargs, void *stream)
{
    call_state cs;
    void *argv[MAX_PARAMS];
    unsigned grid[3], block[3];
    size_t smem = 0;
    int rc, empty = 0;

    if ((rc = check_fn(fn)) != TK_OK)
        return rc;
    if (nargs && !args)
        return tk__err(TK_ERR_INVALID, "%s: args is NULL", fn->d.name);
    memset(&cs, 0, sizeof cs);
    cs.ws_slot = -1;
    if ((rc = bind_args(&cs, &fn->d, args, nargs)) != TK_OK || (rc = take_args(&cs, fn, args)) != TK_OK ||
        (rc = derive_params(&cs, fn)) != TK_OK || (rc = check_limits(&cs, fn)) != TK_OK ||
        (rc = launch_geometry(grid, block, &smem, &empty, &cs, fn)) != TK_OK)
        return rc;
    if (empty)
        return TK_OK; /* empty tensors: nothing to do */
    for (size_t i = 0; i < fn->d.nparams; i++)
        argv[i] = &cs.slots[i];
    if ((rc = tk_jit__launch(fn->mod, fn->fn, grid, block, smem, stream, argv, cs.ws_bytes,
                             cs.ws_slot >= 0 ? &cs.slots[cs.ws_slot].ptr : NULL)) != TK_OK)
        return tk__err_wrap(rc, "%s", fn->d.name);
    return TK_OK;
}
