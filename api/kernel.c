/*
 * kernel.c — the "Devices and JIT" and tensor parts of tk.h: dtype names, device queries,
 * tk_get_kernel (install, compile or fetch from the cache, load), declarative and raw launches,
 * ahead-of-time builds and the compiled-binary cache commands.
 *
 * Sources come only through the public package API (tk_pkg_get / tk_pkg_info, the manifest text and
 * the store paths of the files). Kernels that share a source file, options and arch-specific flag are
 * compiled as one NVRTC unit with one name expression each, so a package of 20 variants in one .cu is
 * one compile. Every unit is looked up in the cache by its content key first; NVRTC is loaded only for
 * the misses, and misses compile in parallel. A module the driver rejects as stale is a miss.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "ops/ops.h"
#include "cache/kcache.h"
#include "jit/jit.h"

#define KERNEL_MAGIC 0x746b6b6eu   /* "tkkn" */
#define FUNCTION_MAGIC 0x746b666eu /* "tkfn" */
#define JITSTATE_MAGIC 0x746b6a73u /* "tkjs" */
#define MAX_PARAMS 64
#define MAX_FILE (64u << 20)
#define DEFAULT_CACHE_MAX ((int64_t)2 << 30)

/* ---- dtypes ----------------------------------------------------------------------------------- */

/* The dtype names are the op registry's (ops/dtype.c), so manifests, ops and the API agree. */
const char *tk_dtype_name(tk_dtype dt) { return tk_ops__dtype_str(dt); }

int tk_dtype_parse(tk_dtype *out, const char *name)
{
    if (!out)
        return tk__err(TK_ERR_INVALID, "tk_dtype_parse: out is NULL");
    memset(out, 0, sizeof *out);
    return tk_ops__dtype_parse_any(out, name);
}

/* ---- devices ---------------------------------------------------------------------------------- */

int tk_device_count(int *n) { return tk_jit__device_count(n); }
int tk_device_info_get(tk_device_info *out, int ordinal) { return tk_jit__device_info(out, ordinal); }

int tk_device_alloc(void **dptr, int device, size_t bytes)
{
    uint64_t p = 0;
    if (!dptr)
        return tk__err(TK_ERR_INVALID, "tk_device_alloc: dptr is NULL");
    *dptr = NULL;
    int rc = tk_jit__mem_alloc(&p, device, bytes);
    if (rc == TK_OK)
        *dptr = (void *)(uintptr_t)p;
    return rc;
}

int tk_device_free(void *dptr, int device)
{
    return dptr ? tk_jit__mem_free((uint64_t)(uintptr_t)dptr, device) : TK_OK;
}

int tk_device_copy(void *dst, const void *src, size_t bytes, tk_copy_kind kind, int device)
{
    if (kind != TK_COPY_H2D && kind != TK_COPY_D2H && kind != TK_COPY_D2D)
        return tk__err(TK_ERR_INVALID, "tk_device_copy: kind %d is not TK_COPY_H2D, _D2H or _D2D", (int)kind);
    if (!bytes)
        return TK_OK;
    if (!dst || !src)
        return tk__err(TK_ERR_INVALID, "tk_device_copy: %s is NULL", dst ? "src" : "dst");
    return tk_jit__mem_copy(dst, src, bytes, (int)kind, device);
}

int tk_device_memset(void *dptr, int value, size_t bytes, int device)
{
    if (!bytes)
        return TK_OK;
    if (!dptr)
        return tk__err(TK_ERR_INVALID, "tk_device_memset: dptr is NULL");
    return tk_jit__mem_set((uint64_t)(uintptr_t)dptr, value, bytes, device);
}

int tk_device_sync(int device) { return tk_jit__sync(device); }

/* ---- per-context state: the cache handle ------------------------------------------------------ */

typedef struct {
    uint32_t magic;
    tk_kcache *kc;
} jit_state;

static void jit_state_free(void *p)
{
    jit_state *s = p;
    if (!s || s->magic != JITSTATE_MAGIC)
        return;
    tk_kcache__close(s->kc);
    s->magic = 0;
    free(s);
}

/* The configured cap: $TK_CACHE_MAX, then config "cache_max" (string or number), else 2 GiB. */
static int cache_cap(const tk_ctx *ctx, int64_t *cap)
{
    const char *env = getenv("TK_CACHE_MAX");
    json_t *v = ctx->config ? json_object_get(ctx->config, "cache_max") : NULL;
    *cap = DEFAULT_CACHE_MAX;
    if (env && *env) {
        if (tk_kcache__parse_size(env, cap) != 0)
            return tk__err(TK_ERR_INVALID, "TK_CACHE_MAX='%s' is not a size\nHINT: use bytes or a K/M/G "
                                           "suffix, e.g. TK_CACHE_MAX=4G", env);
        return TK_OK;
    }
    if (json_is_integer(v) && json_integer_value(v) >= 0) {
        *cap = json_integer_value(v);
    } else if (json_is_string(v)) {
        if (tk_kcache__parse_size(json_string_value(v), cap) != 0)
            return tk__err(TK_ERR_INVALID, "config cache_max '%s' is not a size (e.g. \"4G\")",
                           json_string_value(v));
    } else if (v) {
        return tk__err(TK_ERR_INVALID, "config cache_max must be a size such as \"4G\"");
    }
    return TK_OK;
}

static int get_cache(tk_kcache **out, tk_ctx *ctx)
{
    jit_state *s;
    int64_t cap;
    int rc;
    *out = NULL;
    if ((rc = tk_api__check_ctx(ctx)) != TK_OK)
        return rc;
    if (ctx->jit && ctx->jit_free == jit_state_free) {
        s = ctx->jit;
        *out = s->kc;
        return TK_OK;
    }
    if (ctx->jit)
        return tk__err(TK_ERR_INTERNAL, "context jit state is not tk's");
    if ((rc = cache_cap(ctx, &cap)) != TK_OK)
        return rc;
    if (!(s = calloc(1, sizeof *s)))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    s->magic = JITSTATE_MAGIC;
    if ((rc = tk_kcache__open(&s->kc, tk_ctx_cache_dir(ctx), cap)) != TK_OK) {
        free(s);
        return rc;
    }
    ctx->jit = s;
    ctx->jit_free = jit_state_free;
    *out = s->kc;
    return TK_OK;
}

int tk_api__kcache(struct tk_kcache **out, tk_ctx *ctx) { return get_cache(out, ctx); }

/* ---- kernel declarations: the manifest's, parsed once (manifest/validate.c) ---------------------- */

typedef tk_manifest_kernel kdecl;
typedef tk_manifest_param kparam;

/* ---- a package's sources and its compile plan ------------------------------------------------- */

typedef struct {
    char *pkgname;         /* "org/name@commit" */
    tk_jit_file *files;    /* every file of the package, data NUL-terminated */
    size_t nfiles;
    tk_manifest_kernels mk; /* compile.options and the kernels, parsed */
    char **copts;           /* mk's */
    size_t ncopts;
    kdecl *k;
    size_t nk;
} pkgsrc;

static void pkgsrc_free(pkgsrc *s)
{
    for (size_t i = 0; i < s->nfiles; i++) {
        free((char *)s->files[i].path);
        free((char *)s->files[i].data);
    }
    free(s->files);
    tk_manifest__kernels_free(&s->mk);
    free(s->pkgname);
    memset(s, 0, sizeof *s);
}

/* Parses the manifest's compile options and kernels into s (whose files are loaded). */
static int pkgsrc_parse(pkgsrc *s, const char *name, const char *manifest)
{
    json_error_t jerr;
    json_t *m = json_loads(manifest, 0, &jerr);
    int rc;
    if (!m)
        return tk__err(TK_ERR_MANIFEST, "manifest of %s: %s (line %d)", name, jerr.text, jerr.line);
    rc = tk_manifest__kernels_parse(&s->mk, m, 0, NULL, NULL);
    json_decref(m);
    if (rc != TK_OK)
        return tk__err_wrap(rc, "%s", name);
    s->copts = s->mk.copts;
    s->ncopts = s->mk.ncopts;
    s->k = s->mk.k;
    s->nk = s->mk.nk;
    if (!s->nk)
        return tk__err(TK_ERR_MANIFEST, "%s declares no kernels", name);
    for (size_t i = 0; i < s->nk; i++) {
        int found = 0;
        for (size_t f = 0; f < s->nfiles; f++)
            found |= strcmp(s->files[f].path, s->k[i].source) == 0;
        if (!found)
            return tk__err(TK_ERR_MANIFEST, "kernel '%s': source '%s' is not a file of the package", s->k[i].name,
                           s->k[i].source);
    }
    return TK_OK;
}

static int pkgsrc_load(pkgsrc *s, const tk_pkg *pkg)
{
    size_t i;
    int rc;

    memset(s, 0, sizeof *s);
    s->pkgname = tk__fmt("%s@%s", tk_pkg_name(pkg), tk_pkg_commit(pkg));
    s->nfiles = tk_pkg_file_count(pkg);
    if (!s->pkgname || (s->nfiles && !(s->files = calloc(s->nfiles, sizeof *s->files)))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (i = 0; i < s->nfiles; i++) {
        char *data = NULL;
        size_t len = 0;
        if ((rc = tk__read_file_nofollow(&data, &len, tk_pkg_file_store_path(pkg, i), MAX_FILE)) != TK_OK) {
            rc = tk__err_wrap(rc, "reading %s of %s", tk_pkg_file_path(pkg, i), tk_pkg_name(pkg));
            goto fail;
        }
        s->files[i].data = data;
        s->files[i].len = len;
        if (!(s->files[i].path = tk__strdup(tk_pkg_file_path(pkg, i)))) {
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
            goto fail;
        }
    }
    if ((rc = pkgsrc_parse(s, tk_pkg_name(pkg), tk_pkg_manifest(pkg))) != TK_OK)
        goto fail;
    return TK_OK;
fail:
    pkgsrc_free(s);
    return rc;
}

/* A package directory that was never published (manifest/local.c checked it): its files are read from
 * the directory, and it is named "org/name@local" wherever it shows (logs, the cache's labels). */
static int pkgsrc_load_dir(pkgsrc *s, const tk_manifest_local *lp)
{
    int rc;
    memset(s, 0, sizeof *s);
    s->pkgname = tk__fmt("%s@local", lp->name);
    s->nfiles = lp->nfiles;
    if (!s->pkgname || (s->nfiles && !(s->files = calloc(s->nfiles, sizeof *s->files)))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < s->nfiles; i++) {
        char *full = tk__path_join(lp->dir, lp->paths[i]), *data = NULL;
        size_t len = 0;
        rc = full ? tk__read_file(&data, &len, full, MAX_FILE) : tk__err(TK_ERR_NOMEM, "out of memory");
        free(full);
        if (rc != TK_OK)
            goto fail;
        s->files[i].data = data;
        s->files[i].len = len;
        if (!(s->files[i].path = tk__strdup(lp->paths[i]))) {
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
            goto fail;
        }
    }
    if ((rc = pkgsrc_parse(s, lp->name, lp->manifest)) != TK_OK)
        goto fail;
    return TK_OK;
fail:
    pkgsrc_free(s);
    return rc;
}

/* The sources of `ref`: a package directory (never signed or installed, named org/name@local) or
 * an installed package, fetched first when `get` is given. *manifest (may be NULL) receives a copy
 * of the manifest text. */
static int pkgsrc_for_ref(pkgsrc *s, char **manifest, tk_ctx *ctx, const char *ref, const tk_get_opts *get)
{
    int rc;
    memset(s, 0, sizeof *s);
    if (manifest)
        *manifest = NULL;
    if (tk_api__is_local_ref(ref)) {
        tk_manifest_local lp;
        if ((rc = tk_manifest__local_load(&lp, ref)) != TK_OK)
            return rc;
        tk_api__log(ctx, TK_LOG_WARN, "%s %s from %s is local: not signed, not installed", lp.name, lp.version, ref);
        rc = pkgsrc_load_dir(s, &lp);
        if (rc == TK_OK && manifest && !(*manifest = tk__strdup(lp.manifest)))
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
        tk_manifest__local_free(&lp);
    } else {
        tk_pkg *pkg = NULL;
        rc = get ? tk_pkg_get(&pkg, ctx, ref, get) : tk_pkg_info(&pkg, ctx, ref);
        if (rc == TK_OK)
            rc = pkgsrc_load(s, pkg);
        if (rc == TK_OK && manifest && !(*manifest = tk__strdup(tk_pkg_manifest(pkg))))
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
        tk_pkg_free(pkg);
    }
    if (rc != TK_OK) {
        pkgsrc_free(s);
        if (manifest) {
            free(*manifest);
            *manifest = NULL;
        }
    }
    return rc;
}

/* One compile unit of a plan: the kernels sharing source, options and arch-specific flag. */
typedef struct {
    tk_jit_unit u;
    tk_jit_file *hdrs;
    const char **names; /* distinct symbols */
    const char **opts;
    size_t *kidx;       /* kernels of this unit */
    size_t *kname;      /* for each kernel: the index of its symbol in names */
    size_t nk;
    char key[TK_SHA256_HEX];
    char target[32];
    char *label;        /* "activation.cu: silu_and_mul_f32, ..." */
    tk_jit_binary *bin;
    int cached;
} cunit;

typedef struct {
    cunit *u;
    size_t n;
} plan;

static void plan_free(plan *p)
{
    for (size_t i = 0; i < p->n; i++) {
        free(p->u[i].hdrs);
        free(p->u[i].names);
        free(p->u[i].opts);
        free(p->u[i].kidx);
        free(p->u[i].kname);
        free(p->u[i].label);
        tk_jit__binary_free(p->u[i].bin);
    }
    free(p->u);
    memset(p, 0, sizeof *p);
}

static int same_opts(const kdecl *a, const kdecl *b)
{
    if (a->noptions != b->noptions)
        return 0;
    for (size_t i = 0; i < a->noptions; i++)
        if (strcmp(a->options[i], b->options[i]) != 0)
            return 0;
    return 1;
}

static int kernel_fits(const kdecl *d, int cc) { return cc >= d->min_cc && (!d->max_cc || cc <= d->max_cc); }

/* Groups the kernels that fit `cc` into units and computes their keys. */
static int plan_make(plan *p, const pkgsrc *s, int cc, int ptx_only, const char *nvrtc_id)
{
    int rc = TK_ERR_NOMEM;
    memset(p, 0, sizeof *p);
    if (!(p->u = calloc(s->nk, sizeof *p->u)))
        goto fail;
    for (size_t i = 0; i < s->nk; i++) {
        const kdecl *d = &s->k[i];
        cunit *c = NULL;
        size_t j;
        if (!kernel_fits(d, cc))
            continue;
        for (j = 0; j < p->n; j++) {
            const kdecl *f = &s->k[p->u[j].kidx[0]];
            if (strcmp(f->source, d->source) == 0 && f->arch_specific == d->arch_specific &&
                same_opts(f, d)) {
                c = &p->u[j];
                break;
            }
        }
        if (!c) {
            c = &p->u[p->n++];
            if (!(c->kidx = calloc(s->nk, sizeof *c->kidx)) || !(c->kname = calloc(s->nk, sizeof *c->kname)) ||
                !(c->names = calloc(s->nk, sizeof *c->names)))
                goto fail;
        }
        c->kidx[c->nk] = i;
        for (j = 0; j < c->u.nnames; j++)
            if (strcmp(c->names[j], d->symbol) == 0)
                break;
        if (j == c->u.nnames)
            c->names[c->u.nnames++] = d->symbol;
        c->kname[c->nk++] = j;
    }
    for (size_t j = 0; j < p->n; j++) {
        cunit *c = &p->u[j];
        const kdecl *d = &s->k[c->kidx[0]];
        tk_buf label = TK_BUF_INIT;
        size_t nh = 0;
        if (!(c->hdrs = calloc(s->nfiles + 1, sizeof *c->hdrs)) ||
            !(c->opts = calloc(s->ncopts + d->noptions + 1, sizeof *c->opts)))
            goto fail;
        for (size_t f = 0; f < s->nfiles; f++) {
            if (strcmp(s->files[f].path, d->source) == 0) {
                c->u.src = s->files[f].data;
                c->u.src_len = s->files[f].len;
            } else {
                c->hdrs[nh++] = s->files[f];
            }
        }
        for (size_t o = 0; o < s->ncopts; o++)
            c->opts[c->u.noptions++] = s->copts[o];
        for (size_t o = 0; o < d->noptions; o++)
            c->opts[c->u.noptions++] = d->options[o];
        c->u.src_path = d->source;
        c->u.headers = c->hdrs;
        c->u.nheaders = nh;
        c->u.names = c->names;
        c->u.options = c->opts;
        c->u.cc = cc;
        c->u.arch_specific = d->arch_specific && !ptx_only;
        c->u.ptx_only = ptx_only;
        tk_jit__target(c->target, &c->u);
        if (tk__buf_printf(&label, "%s:", d->source) != TK_OK)
            goto fail;
        for (size_t k = 0; k < c->nk && k < 3; k++)
            if (tk__buf_printf(&label, "%s%s", k ? ", " : " ", s->k[c->kidx[k]].name) != TK_OK) {
                tk__buf_free(&label);
                goto fail;
            }
        if (c->nk > 3 && tk__buf_printf(&label, " ... (%zu kernels)", c->nk) != TK_OK) {
            tk__buf_free(&label);
            goto fail;
        }
        c->label = tk__buf_steal(&label);
        if ((rc = tk_jit__key(c->key, &c->u, nvrtc_id)) != TK_OK)
            goto fail2;
        rc = TK_ERR_NOMEM;
    }
    return TK_OK;
fail:
    rc = tk__err(TK_ERR_NOMEM, "out of memory planning compiles");
fail2:
    plan_free(p);
    return rc;
}

/* Compile progress: a "[3/7] decode.cu sm_90 12.4 s" log line per unit as it finishes, and the
 * context's progress callback (a terminal status line in the CLI) as units start and finish. */
typedef struct {
    const tk_ctx *ctx;
    const tk_jit_unit *units;
    size_t n;
    double t0;
} progress;

static void unit_name(char *out, size_t cap, const tk_jit_unit *u)
{
    char target[32];
    size_t n = strlen(u->src_path);
    tk_jit__target(target, u);
    /* at most 60 columns of path: keep its end, which names the file */
    if (n > 60)
        snprintf(out, cap, "...%s %s", u->src_path + n - 57, target);
    else
        snprintf(out, cap, "%s %s", u->src_path, target);
}

static void on_unit(void *user, size_t i, int started, int status, size_t ndone, size_t nrunning, double secs)
{
    progress *pr = user;
    char name[96], what[128];
    unit_name(name, sizeof name, &pr->units[i]);
    if (!started)
        tk_api__log(pr->ctx, status == TK_OK ? TK_LOG_INFO : TK_LOG_WARN, "[%zu/%zu] %s %.1f s%s", ndone, pr->n,
                    name, secs, status == TK_OK ? "" : " FAILED");
    if (pr->ctx->progress) {
        snprintf(what, sizeof what, "compile %zu running, %.0f s: %s", nrunning, (tk__now_ms() - pr->t0) / 1000.0,
                 name);
        pr->ctx->progress(pr->ctx->progress_user, what, (int64_t)ndone, (int64_t)pr->n);
    }
}

/* Fills every unit's binary: from the cache, else compiled (in parallel) and stored. `force` skips
 * the lookup (a stale entry). */
/* The manifest's parameter list of every kernel of a compiled unit against the kernel's own, read from
 * the PTX: cuLaunchKernel reads one argument pointer per kernel parameter, so a manifest that lists
 * fewer reads past tk's argument array (a crash in the driver) and one that lists more, or another
 * size, hands the kernel garbage. TK_ERR_MANIFEST naming the first mismatch; TK_OK when the unit has
 * no PTX to read (the launch cannot be checked then). */
static int check_signatures(const cunit *c, const pkgsrc *s)
{
    if (!c->bin || !c->bin->ptx || !c->nk)
        return TK_OK;
    /* one pass over the PTX's entries (it can be megabytes; this runs on every cache hit too) */
    for (const char *e = strstr(c->bin->ptx, ".entry"); e; e = strstr(e + 6, ".entry")) {
        const char *nm = e + 6, *ne;
        while (*nm == ' ' || *nm == '\t')
            nm++;
        for (ne = nm; *ne && *ne != '(' && *ne != ' ' && *ne != '\t' && *ne != '\n'; ne++)
            ;
        for (size_t j = 0; j < c->nk; j++) {
            const char *low = c->bin->lowered[c->kname[j]];
            if (strlen(low) != (size_t)(ne - nm) || memcmp(low, nm, (size_t)(ne - nm)) != 0)
                continue;
            const kdecl *d = &s->k[c->kidx[j]];
            size_t got[MAX_PARAMS], n = 0;
            /* parse from this entry on: the name matches, so the first ".entry NAME(" found is this one */
            if (tk_jit__ptx_params(e, low, got, MAX_PARAMS, &n) != TK_OK)
                return tk__err(TK_ERR_COMPILE, "%s (%s): kernel '%s': cannot read the parameters of '%s' in the PTX",
                               d->source, c->target, d->name, d->symbol);
            if (n != d->nparams)
                return tk__err(TK_ERR_MANIFEST,
                               "%s (%s): kernel '%s': the manifest lists %zu parameters, '%s' takes %zu\n"
                               "HINT: 'params' must list every parameter of the __global__ function, in its order "
                               "(an optional tensor the kernel takes is still listed, with \"optional\": true)",
                               d->source, c->target, d->name, d->nparams, d->symbol, n);
            for (size_t i = 0; i < n; i++) {
                const kparam *p = &d->params[i];
                size_t want = p->type == TK_MANIFEST_P_I32 || p->type == TK_MANIFEST_P_F32 ? 4 : 8;
                if (got[i] != want)
                    return tk__err(TK_ERR_MANIFEST,
                                   "%s (%s): kernel '%s': parameter %zu '%s' is %zu bytes in the manifest (%s), %zu "
                                   "in '%s'\nHINT: tensor and workspace: a pointer; i64/f64: 8 bytes; i32/f32: 4 bytes",
                                   d->source, c->target, d->name, i + 1, p->name, want,
                                   p->type == TK_MANIFEST_P_TENSOR      ? "tensor"
                                   : p->type == TK_MANIFEST_P_WORKSPACE ? "workspace"
                                   : p->type == TK_MANIFEST_P_I32       ? "i32"
                                   : p->type == TK_MANIFEST_P_I64       ? "i64"
                                   : p->type == TK_MANIFEST_P_F32       ? "f32"
                                                                   : "f64",
                                   got[i], d->symbol);
            }
        }
    }
    return TK_OK;
}

static int plan_build(plan *p, tk_ctx *ctx, const pkgsrc *s, int jobs, size_t *ncompiled, size_t *ncached)
{
    tk_kcache *kc = NULL;
    tk_jit_unit *units = NULL;
    tk_jit_binary **outs = NULL;
    int *st = NULL, rc;
    size_t *which = NULL, nmiss = 0;
    char **emsg = NULL;
    char ver[32] = "";
    int vmaj = 0, vmin = 0;

    if ((rc = get_cache(&kc, ctx)) != TK_OK)
        return rc;
    for (size_t i = 0; i < p->n; i++) {
        uint8_t *data = NULL;
        size_t len = 0;
        cunit *c = &p->u[i];
        if (c->bin)
            continue;
        if (tk_kcache__get(kc, c->key, &data, &len) == TK_OK) {
            if (tk_jit__binary_unpack(&c->bin, data, len) != TK_OK || c->bin->nlowered != c->u.nnames) {
                tk_jit__binary_free(c->bin);
                c->bin = NULL;
                tk_kcache__remove(kc, c->key);
            }
            free(data);
        }
        if (c->bin && (rc = check_signatures(c, s)) != TK_OK)
            return rc;
        if (c->bin) {
            c->cached = 1;
            if (ncached)
                (*ncached)++;
            tk_api__log(ctx, TK_LOG_DEBUG, "cache hit %.12s %s (%s)", c->key, c->label, c->target);
        }
    }
    for (size_t i = 0; i < p->n; i++)
        nmiss += !p->u[i].bin;
    if (!nmiss)
        return TK_OK;
    units = calloc(nmiss, sizeof *units);
    outs = calloc(nmiss, sizeof *outs);
    st = calloc(nmiss, sizeof *st);
    which = calloc(nmiss, sizeof *which);
    emsg = calloc(nmiss, sizeof *emsg);
    if (!units || !outs || !st || !which || !emsg) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    nmiss = 0;
    for (size_t i = 0; i < p->n; i++)
        if (!p->u[i].bin) {
            tk_api__log(ctx, TK_LOG_DEBUG, "compiling %s for %s", p->u[i].label, p->u[i].target);
            which[nmiss] = i;
            units[nmiss++] = p->u[i].u;
        }
    /* Worker threads fail with their own thread-local message: collect them to report here. */
    {
        progress pr = {ctx, units, nmiss, tk__now_ms()};
        size_t nfail = 0;
        rc = tk_jit__compile_many_cb(outs, st, emsg, units, nmiss, jobs, on_unit, &pr);
        for (size_t m = 0; m < nmiss; m++)
            nfail += st[m] != TK_OK;
        if (nfail)
            tk_api__log(ctx, TK_LOG_INFO, "%s: %zu compiled, %zu failed in %.1f s", s->pkgname, nmiss - nfail, nfail,
                        (tk__now_ms() - pr.t0) / 1000.0);
        else
            tk_api__log(ctx, TK_LOG_INFO, "%s: %zu compiled in %.1f s", s->pkgname, nmiss,
                        (tk__now_ms() - pr.t0) / 1000.0);
    }
    if (tk_jit__nvrtc_version(&vmaj, &vmin, NULL) == TK_OK)
        snprintf(ver, sizeof ver, "%d.%d", vmaj, vmin);
    for (size_t m = 0; m < nmiss; m++) {
        cunit *c = &p->u[which[m]];
        uint8_t *blob = NULL;
        size_t len = 0;
        if (st[m] != TK_OK)
            continue;
        c->bin = outs[m];
        outs[m] = NULL;
        if ((st[m] = check_signatures(c, s)) != TK_OK) {
            if (rc == TK_OK)
                rc = st[m];
            tk_jit__binary_free(c->bin);
            c->bin = NULL;
            continue;
        }
        if (ncompiled)
            (*ncompiled)++;
        if (tk_jit__binary_pack(&blob, &len, c->bin) == TK_OK) {
            tk_kcache_meta meta = {s->pkgname, c->label, c->target, ver};
            int prc = tk_kcache__put(kc, c->key, &meta, blob, len, NULL);
            if (prc != TK_OK)
                tk_api__log(ctx, TK_LOG_WARN, "could not cache %s: %s", c->label, tk_last_error());
            free(blob);
        }
    }
    if (rc != TK_OK) {
        /* compile_many set the first failure's message; name the package */
        rc = tk__err_wrap(rc, "%s", s->pkgname);
    }
done:
    for (size_t m = 0; outs && m < nmiss; m++)
        tk_jit__binary_free(outs[m]);
    for (size_t m = 0; emsg && m < nmiss; m++)
        free(emsg[m]);
    free(emsg);
    free(units);
    free(outs);
    free(st);
    free(which);
    return rc;
}

/* NVRTC reports a name expression that names nothing as an error in its generated "__nv_name_map"
 * code, several lines long; a kernel author needs one line: which symbol of which kernel. */
static void symbol_message(tk_buf *b, const cunit *c, const pkgsrc *s, const char *msg)
{
    if (msg && strstr(msg, "__nv_name_map")) {
        int any = 0;
        for (size_t j = 0; j < c->nk; j++) {
            const kdecl *d = &s->k[c->kidx[j]];
            const char *sym = d->symbol, *lt = strchr(sym, '<');
            size_t n = lt ? (size_t)(lt - sym) : strlen(sym);
            char quoted[300];
            const char *base = sym;
            for (const char *q = sym; q < sym + n; q++)
                if (*q == ':')
                    base = q + 1;
            snprintf(quoted, sizeof quoted, "\"%.*s\"", (int)(sym + n - base), base);
            if (strstr(msg, quoted) || strstr(msg, sym)) {
                tk__buf_printf(b, "%s (%s): kernel '%s': symbol '%s' is not declared in %s\n", d->source,
                               c->target, d->name, sym, d->source);
                any = 1;
            }
        }
        if (any) {
            tk__buf_puts(b, "    HINT: 'symbol' names a __global__ function of the source: extern \"C\" or "
                            "ns::kern<float>\n");
            return;
        }
    }
    tk__buf_printf(b, "%s (%s):\n", c->label, c->target);
    for (const char *p = msg ? msg : "(no message)"; *p;) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        /* NVRTC writes "file.cu(12): error"; editors and terminals jump to "file.cu:12:" */
        const char *paren = memchr(p, '(', n);
        size_t digits = 0;
        while (paren && paren + 1 + digits < p + n && paren[1 + digits] >= '0' && paren[1 + digits] <= '9')
            digits++;
        if (paren && digits && paren + digits + 3 <= p + n && paren[1 + digits] == ')' && paren[2 + digits] == ':')
            tk__buf_printf(b, "    %.*s:%.*s:%.*s\n", (int)(paren - p), p, (int)digits, paren + 1,
                           (int)(n - (size_t)(paren + digits + 3 - p)), paren + digits + 3);
        else if (n)
            tk__buf_printf(b, "    %.*s\n", (int)n, p);
        p += n + (nl ? 1 : 0);
    }
}

int tk_api__compile_local(tk_ctx *ctx, const tk_manifest_local *lp, const int *ccs0, size_t nccs, int cover, int jobs,
                          tk_buf *report, size_t *nunits, size_t *nfailed)
{
    pkgsrc s;
    int ccs[128];
    plan *plans = NULL;
    const char *nvid = NULL;
    tk_jit_unit *units = NULL;
    tk_jit_binary **outs = NULL;
    cunit **cu = NULL;
    int *st = NULL, rc;
    char **emsg = NULL;
    size_t total = 0, k = 0;
    *nunits = *nfailed = 0;
    if (nccs > 64)
        nccs = 64;
    memcpy(ccs, ccs0, nccs * sizeof *ccs);
    if ((rc = pkgsrc_load_dir(&s, lp)) != TK_OK)
        return rc;
    /* cover: a kernel that none of the archs can run is compiled for the lowest arch it allows */
    for (size_t i = 0; cover && i < s.nk && nccs < sizeof ccs / sizeof *ccs; i++) {
        size_t a = 0;
        while (a < nccs && !kernel_fits(&s.k[i], ccs[a]))
            a++;
        if (a == nccs) {
            ccs[nccs++] = s.k[i].min_cc;
            tk_api__log(ctx, TK_LOG_DEBUG, "%s: kernel '%s' runs on none of the archs given; compiling it for sm_%d",
                        lp->name, s.k[i].name, s.k[i].min_cc);
        }
    }
    if ((rc = tk_jit__nvrtc_load()) != TK_OK || (rc = tk_jit__nvrtc_id(&nvid)) != TK_OK)
        goto done;
    if (!(plans = calloc(nccs + 1, sizeof *plans))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    /* every arch's units in one batch, so progress counts them all and they share the workers */
    for (size_t a = 0; a < nccs; a++) {
        if ((rc = plan_make(&plans[a], &s, ccs[a], 0, nvid)) != TK_OK)
            goto done;
        if (plans[a].n == 0)
            tk_api__log(ctx, TK_LOG_INFO, "%s: no kernel targets sm_%d", s.pkgname, ccs[a]);
        total += plans[a].n;
    }
    units = calloc(total + 1, sizeof *units);
    outs = calloc(total + 1, sizeof *outs);
    st = calloc(total + 1, sizeof *st);
    emsg = calloc(total + 1, sizeof *emsg);
    cu = calloc(total + 1, sizeof *cu);
    if (!units || !outs || !st || !emsg || !cu) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (size_t a = 0; a < nccs; a++)
        for (size_t i = 0; i < plans[a].n; i++) {
            cu[k] = &plans[a].u[i];
            units[k++] = plans[a].u[i].u;
        }
    {
        progress pr = {ctx, units, total, tk__now_ms()};
        tk_jit__compile_many_cb(outs, st, emsg, units, total, jobs, on_unit, &pr);
        for (size_t i = 0; i < total; i++) {
            (*nunits)++;
            if (st[i] == TK_OK) {
                cu[i]->bin = outs[i]; /* borrowed: plan_free must not free it */
                int src = check_signatures(cu[i], &s);
                cu[i]->bin = NULL;
                if (src == TK_OK)
                    continue;
                (*nfailed)++;
                tk__buf_printf(report, "%s\n", tk_last_error());
                continue;
            }
            if (st[i] == TK_ERR_NO_NVRTC) {
                rc = tk__err(TK_ERR_NO_NVRTC, "%s", emsg[i] ? emsg[i] : "NVRTC is missing");
                goto done;
            }
            (*nfailed)++;
            symbol_message(report, cu[i], &s, emsg[i]);
        }
        tk_api__log(ctx, TK_LOG_INFO, "%s: %zu of %zu compiles ok in %.1f s", s.pkgname, total - *nfailed, total,
                    (tk__now_ms() - pr.t0) / 1000.0);
    }
    if (*nfailed)
        rc = TK_ERR_COMPILE;
done:
    for (size_t i = 0; outs && i < total; i++)
        tk_jit__binary_free(outs[i]);
    for (size_t i = 0; emsg && i < total; i++)
        free(emsg[i]);
    for (size_t a = 0; plans && a < nccs; a++)
        plan_free(&plans[a]);
    free(plans);
    free(units);
    free(outs);
    free(st);
    free(emsg);
    free(cu);
    pkgsrc_free(&s);
    return rc;
}

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
                       "of time with 'tk build %s --arch sm_90'", ref);
    if ((rc = tk_jit__device_info(info, device)) != TK_OK)
        return rc;
    *cc = info->cc_major * 10 + info->cc_minor;
    return TK_OK;
}

/* The compile plan for the device: its arch's units (PTX for compute_XY under TK_JIT_FORCE_PTX=1, in
 * tests), or, for a GPU newer than NVRTC whose binaries are not all cached, PTX for the newest arch
 * NVRTC knows, which the driver JITs. *kc receives the cache. */
static int kernel_plan(plan *p, tk_kcache **kc, tk_ctx *ctx, const pkgsrc *s, const tk_device_info *info, int cc,
                       int device, const char *nvid)
{
    const char *fp = getenv("TK_JIT_FORCE_PTX"); /* only for packages without sm_XYa kernels */
    int rc, any_miss = 0;
    if ((rc = plan_make(p, s, cc, fp && !strcmp(fp, "1"), nvid)) != TK_OK)
        return rc;
    if (p->n == 0)
        return tk__err(TK_ERR_UNSUPPORTED, "%s has no kernel for compute capability %d.%d (device %d: %s)",
                       s->pkgname, info->cc_major, info->cc_minor, device, info->name);
    if ((rc = get_cache(kc, ctx)) != TK_OK)
        return rc;
    for (size_t i = 0; i < p->n && !any_miss; i++) /* plan_build reads (and verifies) the hits */
        any_miss = !tk_kcache__has(*kc, p->u[i].key);
    if (any_miss) {
        int archs[64];
        size_t na = 0;
        if ((rc = tk_jit__nvrtc_archs(archs, 64, &na)) != TK_OK)
            return rc;
        if (na && cc > archs[na - 1]) {
            tk_api__log(ctx, TK_LOG_WARN, "sm_%d is newer than this NVRTC knows (up to sm_%d): using PTX for compute_%d",
                        cc, archs[na - 1], archs[na - 1]);
            plan_free(p);
            if ((rc = plan_make(p, s, archs[na - 1], 1, nvid)) != TK_OK)
                return rc;
        }
    }
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
            if ((rc = plan_build(p, ctx, s, 0, NULL, NULL)) != TK_OK)
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

/* The host part of tk_get_kernel, everything before the driver: the package's sources (installed and
 * verified), the plan for compute capability cc, and every binary built or taken from the cache. */
static int kernel_host(pkgsrc *s, char **manifest, plan *p, tk_kcache **kc, tk_ctx *ctx, const char *ref,
                       const tk_kernel_opts *opts, const tk_device_info *info, int cc)
{
    const char *nvid = NULL;
    int rc;
    if ((rc = pkgsrc_for_ref(s, manifest, ctx, ref, &opts->get)) != TK_OK || (rc = tk_jit__nvrtc_id(&nvid)) != TK_OK ||
        (rc = kernel_plan(p, kc, ctx, s, info, cc, opts->device, nvid)) != TK_OK ||
        (rc = plan_build(p, ctx, s, 0, NULL, NULL)) != TK_OK)
        return rc;
    return TK_OK;
}

int tk_api__get_kernel_host(tk_ctx *ctx, const char *ref, int cc)
{
    tk_kernel_opts opts = TK_KERNEL_OPTS_INIT;
    tk_device_info info;
    tk_kcache *kc = NULL;
    char *manifest = NULL;
    pkgsrc s;
    plan p;
    int rc;
    memset(&s, 0, sizeof s);
    memset(&p, 0, sizeof p);
    memset(&info, 0, sizeof info);
    info.cc_major = cc / 10;
    info.cc_minor = cc % 10;
    snprintf(info.name, sizeof info.name, "sm_%d (no device)", cc);
    if ((rc = tk_api__check_ctx(ctx)) != TK_OK)
        return rc;
    rc = kernel_host(&s, &manifest, &p, &kc, ctx, ref, &opts, &info, cc);
    plan_free(&p);
    pkgsrc_free(&s);
    free(manifest);
    return rc;
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
    if ((rc = kernel_host(&s, &manifest, &p, &kc, ctx, ref, opts, &info, cc)) != TK_OK)
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
    plan_free(&p);
    pkgsrc_free(&s);
    free(manifest);
    return rc;
}

const char *tk_kernel_manifest(const tk_kernel *k)
{
    return k && k->magic == KERNEL_MAGIC ? k->manifest : NULL;
}

size_t tk_kernel_function_count(const tk_kernel *k)
{
    return k && k->magic == KERNEL_MAGIC ? k->nfns : 0;
}

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

int tk_api__kernel_keys(tk_ctx *ctx, const char *ref, int cc, void (*each)(void *user, const char *kernel, const char *key),
                        void *user)
{
    pkgsrc s;
    plan p;
    const char *nvid = NULL;
    int rc;
    memset(&s, 0, sizeof s);
    memset(&p, 0, sizeof p);
    if (tk_api__is_local_ref(ref)) { /* quietly: dispatch asks this on every context */
        tk_manifest_local lp;
        if ((rc = tk_manifest__local_load(&lp, ref)) != TK_OK)
            return rc;
        rc = pkgsrc_load_dir(&s, &lp);
        tk_manifest__local_free(&lp);
    } else {
        rc = pkgsrc_for_ref(&s, NULL, ctx, ref, NULL);
    }
    if (rc == TK_OK && (rc = tk_jit__nvrtc_id(&nvid)) == TK_OK && (rc = plan_make(&p, &s, cc, 0, nvid)) == TK_OK)
        for (size_t i = 0; i < p.n; i++)
            for (size_t j = 0; j < p.u[i].nk; j++)
                each(user, s.k[p.u[i].kidx[j]].name, p.u[i].key);
    plan_free(&p);
    pkgsrc_free(&s);
    return rc;
}
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
            return tk__err(TK_ERR_INVALID, "%s: '%s' is derived by the launch rule (%s); do not pass it",
                           d->name, args[a].name, tk_manifest__expr_src(d->params[i].value));
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
                       t->device.device_type == TK_DEV_CPU ? "cpu" : "device", (int)t->device.device_id,
                       fn->k->device);
    if (t->ndim < 0 || t->ndim > 32 || (t->ndim && !t->shape))
        return tk__err(TK_ERR_INVALID, "%s: '%s' has a bad ndim %d", d->name, p->name, (int)t->ndim);
    for (int32_t j = 0; j < t->ndim; j++)
        if (t->shape[j] < 0)
            return tk__err(TK_ERR_INVALID, "%s: '%s' has a negative size in dimension %d", d->name, p->name,
                           (int)j);
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
            return tk__err(TK_ERR_INVALID, "%s: derived '%s' = %lld does not fit i32", d->name, p->name,
                           (long long)v);
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
            return tk__err(TK_ERR_UNSUPPORTED, "%s: %s = %lld is %s the kernel's limit %lld (constraints.%s)",
                           d->name, tk_manifest__expr_src(b->expr), (long long)v, b->is_min ? "below" : "above",
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
        return tk__err(TK_ERR_INVALID, "%s: launch grid (%lld, %lld, %lld) is out of range", d->name,
                       (long long)g[0], (long long)g[1], (long long)g[2]);
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

/* ---- ahead-of-time builds --------------------------------------------------------------------- */

int tk_api__parse_arch(int *cc, const char *s)
{
    int64_t v;
    char buf[16];
    size_t n;
    if (!s)
        return -1;
    if (strncmp(s, "sm_", 3) == 0)
        s += 3;
    else if (strncmp(s, "compute_", 8) == 0)
        s += 8;
    n = strlen(s);
    if (n == 0 || n >= sizeof buf)
        return -1;
    memcpy(buf, s, n + 1);
    if (buf[n - 1] == 'a' || buf[n - 1] == 'f')
        buf[n - 1] = '\0';
    if (tk__parse_i64(buf, 10, 10000, &v) != 0)
        return -1;
    *cc = (int)v;
    return 0;
}

int tk_build(tk_ctx *ctx, const char *ref, const tk_build_opts *opts, size_t *compiled, size_t *cached)
{
    tk_build_opts def = TK_BUILD_OPTS_INIT;
    pkgsrc s;
    int ccs[64];
    size_t nccs = 0, nc = 0, nh = 0;
    const char *nvid = NULL;
    int rc;

    memset(&s, 0, sizeof s);
    if (compiled)
        *compiled = 0;
    if (cached)
        *cached = 0;
    if ((rc = tk_api__check_ctx(ctx)) != TK_OK)
        return rc;
    if (!ref)
        return tk__err(TK_ERR_INVALID, "tk_build: ref is required");
    if (!opts)
        opts = &def;
    if (opts->version < 1 || opts->version > TK_BUILD_OPTS_VERSION)
        return tk__err(TK_ERR_INVALID, "tk_build: unknown opts version %u", opts->version);
    if (opts->archs && opts->narchs) {
        for (size_t i = 0; i < opts->narchs && nccs < 64; i++) {
            int cc;
            if (tk_api__parse_arch(&cc, opts->archs[i]) != 0)
                return tk__err(TK_ERR_INVALID, "bad arch '%s'\nHINT: write archs as sm_80, sm_90 or sm_90a",
                               opts->archs[i] ? opts->archs[i] : "(null)");
            ccs[nccs++] = cc;
        }
    } else {
        int ndev = 0;
        if (tk_jit__device_count(&ndev) == TK_OK)
            for (int i = 0; i < ndev && nccs < 64; i++) {
                tk_device_info info;
                if (tk_jit__device_info(&info, i) == TK_OK)
                    ccs[nccs++] = info.cc_major * 10 + info.cc_minor;
            }
        if (!nccs) {
            json_t *ja = ctx->config ? json_object_get(ctx->config, "archs") : NULL, *x;
            size_t i;
            json_array_foreach(ja, i, x) {
                int cc;
                if (nccs >= 64)
                    break;
                if (tk_api__parse_arch(&cc, json_string_value(x)) != 0)
                    return tk__err(TK_ERR_INVALID, "config archs[%zu] is not an arch like \"sm_90\"", i);
                ccs[nccs++] = cc;
            }
        }
        if (!nccs)
            return tk__err(TK_ERR_INVALID,
                           "no GPU here and no archs given\nHINT: name them, e.g. 'tk build %s --arch "
                           "sm_80,sm_90', or set \"archs\": [\"sm_80\", \"sm_90\"] in config.json",
                           ref);
    }
    /* dedupe */
    for (size_t i = 0; i < nccs; i++)
        for (size_t j = i + 1; j < nccs;)
            if (ccs[j] == ccs[i])
                ccs[j] = ccs[--nccs];
            else
                j++;
    if ((rc = pkgsrc_for_ref(&s, NULL, ctx, ref, NULL)) != TK_OK || (rc = tk_jit__nvrtc_id(&nvid)) != TK_OK)
        goto fail;
    {
        /* every arch's units in one plan: one batch of compiles, counted together ([3/7] ...) */
        plan all = {NULL, 0};
        for (size_t a = 0; a < nccs && rc == TK_OK; a++) {
            plan p;
            cunit *grown;
            if ((rc = plan_make(&p, &s, ccs[a], 0, nvid)) != TK_OK)
                break;
            if (p.n == 0)
                tk_api__log(ctx, TK_LOG_INFO, "%s: no kernel targets sm_%d", s.pkgname, ccs[a]);
            if (p.n && !(grown = realloc(all.u, (all.n + p.n) * sizeof *all.u))) {
                rc = tk__err(TK_ERR_NOMEM, "out of memory");
                plan_free(&p);
                break;
            }
            if (p.n) {
                all.u = grown;
                memcpy(all.u + all.n, p.u, p.n * sizeof *p.u);
                all.n += p.n;
            }
            free(p.u); /* its units moved into all */
        }
        if (rc == TK_OK)
            rc = plan_build(&all, ctx, &s, opts->jobs, &nc, &nh);
        plan_free(&all);
        if (rc != TK_OK)
            goto fail;
    }
    if (compiled)
        *compiled = nc;
    if (cached)
        *cached = nh;
fail:
    pkgsrc_free(&s);
    return rc;
}

/* ---- cache commands --------------------------------------------------------------------------- */

int tk_cache_stats_json(char **out, tk_ctx *ctx)
{
    tk_kcache *kc = NULL;
    int64_t n = 0, bytes = 0;
    json_t *o = NULL, *nv = NULL;
    const char *nvpath = NULL;
    char ver[32];
    int rc, vmaj = 0, vmin = 0;
    if (out)
        *out = NULL;
    if (!out)
        return tk__err(TK_ERR_INVALID, "tk_cache_stats_json: out is NULL");
    if ((rc = get_cache(&kc, ctx)) != TK_OK || (rc = tk_kcache__stats(kc, &n, &bytes)) != TK_OK)
        return rc;
    /* the NVRTC new entries are compiled with (and keyed by): its version and file, or null */
    if (tk_jit__nvrtc_version(&vmaj, &vmin, &nvpath) == TK_OK) {
        snprintf(ver, sizeof ver, "%d.%d", vmaj, vmin);
        nv = json_pack("{s:s, s:s}", "version", ver, "path", nvpath ? nvpath : "");
    } else {
        nv = json_null();
        tk__err_clear();
    }
    o = json_pack("{s:s, s:I, s:I, s:I, s:o}", "path", tk_kcache__path(kc), "entries", (json_int_t)n,
                  "bytes", (json_int_t)bytes, "max_bytes", (json_int_t)tk_kcache__max_bytes(kc), "nvrtc", nv);
    if (!o || !(*out = json_dumps(o, JSON_INDENT(2)))) {
        json_decref(o);
        return tk__err(TK_ERR_NOMEM, "out of memory");
    }
    json_decref(o);
    return TK_OK;
}

/* An entry's unit label ("activation.cu: k1, k2, k3 ... (33 kernels)", made by plan_make) as fields:
 * "source", "kernels" (the names the label keeps: at most 3) and "kernel_count". */
static int unit_fields(json_t *o, const char *unit)
{
    const char *colon = strstr(unit, ": "), *p, *more;
    json_t *names = json_array();
    size_t count = 0;
    if (!names)
        return -1;
    if (json_object_set_new(o, "kernels", names) != 0 ||
        json_object_set_new(o, "source", colon ? json_stringn(unit, (size_t)(colon - unit)) : json_string(unit)) != 0)
        return -1;
    p = colon ? colon + 2 : unit + strlen(unit);
    more = strstr(p, " ... (");
    while (*p && p != more) {
        const char *end = strstr(p, ", ");
        if (!end || (more && end > more))
            end = more ? more : p + strlen(p);
        if (json_array_append_new(names, json_stringn(p, (size_t)(end - p))) != 0)
            return -1;
        count++;
        p = *end == ',' ? end + 2 : end;
    }
    if (more)
        count = (size_t)strtoull(more + 6, NULL, 10);
    return json_object_set_new(o, "kernel_count", json_integer((json_int_t)count));
}

typedef struct {
    json_t *arr;
    json_t *selftests; /* {binary_key: [records]} */
} listing;

/* A self-test record as the cache listing shows it, under its binary. */
static int list_selftest(void *user, const tk_kcache_selftest *r)
{
    json_t *by = user, *a = json_object_get(by, r->binary_key);
    if (!a) {
        a = json_array();
        json_object_set_new(by, r->binary_key, a);
    }
    json_array_append_new(a, json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:I}", "kernel", r->kernel, "status", r->status,
                                       "gpu_name", r->gpu_name, "gpu_uuid", r->gpu_uuid, "driver", r->driver,
                                       "tk_version", r->tk_version, "tested", (json_int_t)r->tested));
    return 0;
}

static int list_one(void *user, const tk_kcache_entry *e)
{
    listing *l = user;
    const char *at = strrchr(e->package, '@');
    int local = at && !strcmp(at + 1, "local");
    /* "org/name@commit" as "package" and "commit" (null for a package directory: org/name@local) */
    json_t *o = json_pack("{s:s, s:s%, s:o, s:s, s:s, s:I, s:I, s:I, s:I}", "key", e->key, "package", e->package,
                          at ? (size_t)(at - e->package) : strlen(e->package), "commit",
                          at && !local ? json_string(at + 1) : json_null(), "target", e->target, "nvrtc", e->nvrtc,
                          "size", (json_int_t)e->size, "created", (json_int_t)e->created, "last_used",
                          (json_int_t)e->last_used, "hits", (json_int_t)e->hits);
    if (!o || unit_fields(o, e->unit) != 0)
        return 1;
    /* the kernels of this binary proved (or not) on some GPU: docs/selftest.md */
    json_t *st = json_object_get(l->selftests, e->key);
    json_object_set_new(o, "selftest", st ? json_incref(st) : json_array());
    if (json_array_append_new(l->arr, o) != 0)
        return 1;
    return 0;
}

int tk_cache_list_json(char **out, tk_ctx *ctx)
{
    tk_kcache *kc = NULL;
    listing l = {NULL, NULL};
    int rc;
    if (out)
        *out = NULL;
    if (!out)
        return tk__err(TK_ERR_INVALID, "tk_cache_list_json: out is NULL");
    if ((rc = get_cache(&kc, ctx)) != TK_OK)
        return rc;
    if (!(l.arr = json_array()) || !(l.selftests = json_object())) {
        json_decref(l.arr);
        json_decref(l.selftests);
        return tk__err(TK_ERR_NOMEM, "out of memory");
    }
    if ((rc = tk_kcache__selftest_query(kc, NULL, list_selftest, l.selftests)) != TK_OK ||
        (rc = tk_kcache__list(kc, list_one, &l)) != TK_OK) {
        json_decref(l.arr);
        json_decref(l.selftests);
        return rc;
    }
    json_decref(l.selftests);
    if (!(*out = json_dumps(l.arr, JSON_INDENT(2)))) {
        json_decref(l.arr);
        return tk__err(TK_ERR_NOMEM, "out of memory");
    }
    json_decref(l.arr);
    return TK_OK;
}

int tk_cache_gc(tk_ctx *ctx, int64_t max_bytes, int64_t *freed)
{
    tk_kcache *kc = NULL;
    int rc;
    if (freed)
        *freed = 0;
    if ((rc = get_cache(&kc, ctx)) != TK_OK)
        return rc;
    if (max_bytes < 0 && (rc = cache_cap(ctx, &max_bytes)) != TK_OK)
        return rc;
    return tk_kcache__gc(kc, max_bytes, freed);
}

int tk_cache_clear(tk_ctx *ctx)
{
    tk_kcache *kc = NULL;
    int rc;
    if ((rc = get_cache(&kc, ctx)) != TK_OK)
        return rc;
    return tk_kcache__clear(kc, NULL);
}
