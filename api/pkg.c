/*
 * pkg.c — the package half of tk.h: get, info, list, verify, remove, lock files, keys, trust and
 * publishing. Thin wrappers that turn the hub and state modules into the public API's handles.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "api/api.h"
#include "cache/state.h"
#include "hub/hub.h"
#include "manifest/manifest.h"
#include "ops/ops.h"
#include "hub/sign.h"
#include "tk_default.h"

#define TK_PKG_MAGIC 0x746b706bu /* "tkpk" */

/* One kernel of a package as tk_pkg_kernel_* reports it (from the installed, validated manifest). */
typedef struct {
    const char *name, *op; /* borrowed from tk_pkg.manifest */
    char *dtypes;          /* "f32,f16,bf16"; "" when the kernel does not restrict them */
    int min_cc, max_cc;    /* 0: no bound */
    int arch_specific;
    char *archs;           /* "sm_75+", "sm_80-sm_89", "sm_90a" */
} tk_pkg_kernel_row;

struct tk_pkg {
    uint32_t magic;
    tk_state_pkg *p;
    char **store_paths;
    int fresh;
    char *license;
    char *description;
    json_t *manifest;       /* parsed */
    tk_manifest_kernels mk; /* its kernels, parsed leniently; owns the rows' name and op strings */
    size_t nkernels;
    tk_pkg_kernel_row *kernels;
    size_t nops;
    const char **ops;       /* distinct ops of the kernels, sorted; borrowed from mk */
};

struct tk_pkg_list {
    uint32_t magic;
    size_t n;
    tk_pkg **v;
};

static int ensure_http(tk_ctx *ctx)
{
    if (ctx->http)
        return TK_OK;
    char origin[512] = "";
    tk_hub_http_opts o;
    memset(&o, 0, sizeof o);
    if (ctx->token && tk_hub__http_origin(origin, sizeof origin, ctx->endpoint) == 0) {
        o.token = ctx->token;
        o.auth_origin = origin;
    }
    o.progress = ctx->progress;
    o.progress_user = ctx->progress_user;
    o.log = ctx->log;
    o.log_user = ctx->log_user;
    return tk_hub__http_new(&ctx->http, &o);
}

static int cmp_cstr(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* The archs a kernel runs on, from its constraints: "sm_90a" (arch-specific code runs on exactly
 * that arch), "sm_80-sm_89", "sm_75+", "any". */
static char *archs_str(int min_cc, int max_cc, int arch_specific)
{
    if (arch_specific && min_cc && (min_cc == max_cc || !max_cc))
        return tk__fmt("sm_%da", min_cc);
    if (arch_specific)
        return tk__fmt("sm_%da-sm_%da", min_cc, max_cc);
    if (min_cc && max_cc)
        return min_cc == max_cc ? tk__fmt("sm_%d", min_cc) : tk__fmt("sm_%d-sm_%d", min_cc, max_cc);
    if (min_cc)
        return tk__fmt("sm_%d+", min_cc);
    if (max_cc)
        return tk__fmt("up to sm_%d", max_cc);
    return tk__strdup("any");
}

/* Fills k->kernels and k->ops from k->manifest (validated when installed; a kernel this tk cannot read
 * is left out). -1: out of memory. */
static int load_kernels(tk_pkg *k)
{
    int rc = tk_manifest__kernels_parse(&k->mk, k->manifest, TK_MANIFEST_LENIENT, NULL, NULL);
    if (rc != TK_OK)
        return rc == TK_ERR_NOMEM ? -1 : 0;
    size_t n = k->mk.nk;
    if (!n)
        return 0;
    if (!(k->kernels = calloc(n, sizeof *k->kernels)) || !(k->ops = calloc(n, sizeof *k->ops)))
        return -1;
    for (size_t i = 0; i < n; i++) {
        const tk_manifest_kernel *d = &k->mk.k[i];
        tk_pkg_kernel_row *r = &k->kernels[k->nkernels++];
        r->name = d->name;
        r->op = d->op;
        r->min_cc = d->min_cc;
        r->max_cc = d->max_cc;
        r->arch_specific = d->arch_specific;
        tk_buf b = TK_BUF_INIT;
        int bad = 0;
        for (size_t j = 0; j < d->ndtypes; j++)
            bad |= tk__buf_printf(&b, "%s%s", j ? "," : "", tk_ops__dtype_str(d->dtypes[j])) != TK_OK;
        r->dtypes = bad ? NULL : b.len ? tk__buf_steal(&b) : tk__strdup("");
        tk__buf_free(&b);
        r->archs = archs_str(r->min_cc, r->max_cc, r->arch_specific);
        if (!r->dtypes || !r->archs)
            return -1;
        size_t o;
        for (o = 0; o < k->nops && strcmp(k->ops[o], r->op); o++)
            ;
        if (o == k->nops)
            k->ops[k->nops++] = r->op;
    }
    qsort(k->ops, k->nops, sizeof *k->ops, cmp_cstr);
    return 0;
}

static int wrap(tk_pkg **out, tk_ctx *ctx, tk_state_pkg *p, int fresh)
{
    tk_pkg *k = calloc(1, sizeof *k);
    if (!k) {
        tk_state__pkg_free(p);
        return tk__err(TK_ERR_NOMEM, "out of memory");
    }
    k->magic = TK_PKG_MAGIC;
    k->p = p;
    k->fresh = fresh;
    if (p->nfiles && !(k->store_paths = calloc(p->nfiles, sizeof *k->store_paths)))
        goto oom;
    for (size_t i = 0; i < p->nfiles; i++)
        if (!(k->store_paths[i] = tk_state__object_path(ctx->state, p->files[i].sha256)))
            goto oom;
    json_t *j = k->manifest = json_loadb(p->manifest, p->manifest_len, 0, NULL);
    k->license = tk__strdup(
        json_string_value(json_object_get(j, "license")) ? json_string_value(json_object_get(j, "license")) : "");
    k->description = tk__strdup(json_string_value(json_object_get(j, "description"))
                                    ? json_string_value(json_object_get(j, "description"))
                                    : "");
    if (!k->license || !k->description || load_kernels(k) != 0)
        goto oom;
    *out = k;
    return TK_OK;
oom:
    tk_pkg_free(k);
    return tk__err(TK_ERR_NOMEM, "out of memory");
}

void tk_api__hub_env(tk_hub_env *env, tk_ctx *ctx, const tk_get_opts *opts, const tk_api_registries *regs)
{
    memset(env, 0, sizeof *env);
    env->state = ctx->state;
    env->http = ctx->offline ? NULL : ctx->http;
    env->endpoint = regs && regs->n ? regs->v[0] : ctx->endpoint;
    env->search = regs ? regs->v : NULL;
    env->nsearch = regs ? regs->n : 0;
    env->offline = ctx->offline;
    env->builtin_org = TK_DEFAULT_ORG;
    env->builtin_pubkey = TK_DEFAULT_PUBKEY;
    env->trust_unknown = opts ? opts->trust_unknown : 0;
    env->force = opts ? opts->force : 0;
    env->expect_manifest = opts ? opts->expect_manifest : NULL;
    env->expect_signer = opts && opts->version >= 2 ? opts->expect_signer : NULL;
    env->log = ctx->log;
    env->log_user = ctx->log_user;
    env->validate = tk_api__check_installed;
    env->validate_user = ctx;
}

int tk_api__get_prepare(tk_ctx *ctx, const tk_get_opts *opts)
{
    int rc = tk_api__check_ctx(ctx);
    if (rc != TK_OK)
        return rc;
    if (opts && (opts->version < 1 || opts->version > TK_GET_OPTS_VERSION))
        return tk__err(TK_ERR_INVALID, "tk_get_opts version %u is not supported", opts->version);
    if (opts && opts->version >= 2 && opts->registry &&
        (rc = tk_api__registry_url_check(opts->registry, "tk_get_opts.registry")) != TK_OK)
        return rc;
    return ctx->offline ? TK_OK : ensure_http(ctx);
}

int tk_api__wrap_pkg(tk_pkg **out, tk_ctx *ctx, tk_state_pkg *p, int fresh) { return wrap(out, ctx, p, fresh); }

int tk_pkg_get(tk_pkg **out, tk_ctx *ctx, const char *ref, const tk_get_opts *opts)
{
    if (!out)
        return tk__err(TK_ERR_INVALID, "tk_pkg_get: out is NULL");
    *out = NULL;
    tk_hub_ref r;
    int rc = tk_api__get_prepare(ctx, opts);
    if (rc != TK_OK || (rc = tk_hub__ref_parse(&r, ref)) != TK_OK)
        return rc;
    tk_api_registries regs;
    const char *named = opts && opts->version >= 2 ? opts->registry : NULL;
    if (!ctx->offline && (rc = tk_api__registries_for(&regs, ctx, &r, named)) != TK_OK) {
        tk_api__registries_release(&regs);
        return rc;
    }
    tk_hub_env env;
    tk_api__hub_env(&env, ctx, opts, ctx->offline ? NULL : &regs);
    tk_state_pkg *p = NULL;
    int fresh = 0;
    rc = tk_hub__get(&p, &fresh, &env, ref);
    if (!ctx->offline)
        tk_api__registries_release(&regs);
    return rc != TK_OK ? rc : wrap(out, ctx, p, fresh);
}

int tk_pkg_info(tk_pkg **out, tk_ctx *ctx, const char *ref)
{
    if (!out)
        return tk__err(TK_ERR_INVALID, "tk_pkg_info: out is NULL");
    *out = NULL;
    int rc = tk_api__check_ctx(ctx);
    if (rc != TK_OK)
        return rc;
    tk_state_pkg *p = NULL;
    if ((rc = tk_hub__installed(&p, ctx->state, ref)) != TK_OK)
        return rc;
    return wrap(out, ctx, p, 0);
}

void tk_pkg_free(tk_pkg *k)
{
    if (!k || k->magic != TK_PKG_MAGIC)
        return;
    if (k->store_paths)
        for (size_t i = 0; i < k->p->nfiles; i++)
            free(k->store_paths[i]);
    free(k->store_paths);
    tk_state__pkg_free(k->p);
    free(k->license);
    free(k->description);
    for (size_t i = 0; i < k->nkernels; i++) {
        free(k->kernels[i].dtypes);
        free(k->kernels[i].archs);
    }
    free(k->kernels);
    free(k->ops);
    tk_manifest__kernels_free(&k->mk);
    json_decref(k->manifest);
    k->magic = 0;
    free(k);
}

#define PKG_OK(k) ((k) && (k)->magic == TK_PKG_MAGIC)
const char *tk_pkg_name(const tk_pkg *k) { return PKG_OK(k) ? k->p->name : NULL; }
int tk_pkg_major(const tk_pkg *k) { return PKG_OK(k) ? k->p->major : 0; }
const char *tk_pkg_version(const tk_pkg *k) { return PKG_OK(k) ? k->p->version : NULL; }
const char *tk_pkg_commit(const tk_pkg *k) { return PKG_OK(k) ? k->p->commit : NULL; }
const char *tk_pkg_manifest_sha256(const tk_pkg *k) { return PKG_OK(k) ? k->p->manifest_sha256 : NULL; }
const char *tk_pkg_license(const tk_pkg *k) { return PKG_OK(k) ? k->license : NULL; }
const char *tk_pkg_description(const tk_pkg *k) { return PKG_OK(k) ? k->description : NULL; }
const char *tk_pkg_signer(const tk_pkg *k) { return PKG_OK(k) ? k->p->signer : NULL; }
const char *tk_pkg_registry(const tk_pkg *k) { return PKG_OK(k) ? k->p->registry : NULL; }
const char *tk_pkg_manifest(const tk_pkg *k) { return PKG_OK(k) ? k->p->manifest : NULL; }
int64_t tk_pkg_installed_at(const tk_pkg *k) { return PKG_OK(k) ? k->p->installed_at : 0; }
int tk_pkg_fresh(const tk_pkg *k) { return PKG_OK(k) ? k->fresh : 0; }
size_t tk_pkg_file_count(const tk_pkg *k) { return PKG_OK(k) ? k->p->nfiles : 0; }
const char *tk_pkg_file_path(const tk_pkg *k, size_t i)
{
    return PKG_OK(k) && i < k->p->nfiles ? k->p->files[i].path : NULL;
}
const char *tk_pkg_file_sha256(const tk_pkg *k, size_t i)
{
    return PKG_OK(k) && i < k->p->nfiles ? k->p->files[i].sha256 : NULL;
}
int64_t tk_pkg_file_size(const tk_pkg *k, size_t i) { return PKG_OK(k) && i < k->p->nfiles ? k->p->files[i].size : -1; }
const char *tk_pkg_file_store_path(const tk_pkg *k, size_t i)
{
    return PKG_OK(k) && i < k->p->nfiles ? k->store_paths[i] : NULL;
}

size_t tk_pkg_kernel_count(const tk_pkg *k) { return PKG_OK(k) ? k->nkernels : 0; }
static const tk_pkg_kernel_row *krow(const tk_pkg *k, size_t i)
{
    return PKG_OK(k) && i < k->nkernels ? &k->kernels[i] : NULL;
}
const char *tk_pkg_kernel_name(const tk_pkg *k, size_t i) { return krow(k, i) ? krow(k, i)->name : NULL; }
const char *tk_pkg_kernel_op(const tk_pkg *k, size_t i) { return krow(k, i) ? krow(k, i)->op : NULL; }
const char *tk_pkg_kernel_dtypes(const tk_pkg *k, size_t i) { return krow(k, i) ? krow(k, i)->dtypes : NULL; }
int tk_pkg_kernel_min_cc(const tk_pkg *k, size_t i) { return krow(k, i) ? krow(k, i)->min_cc : -1; }
int tk_pkg_kernel_max_cc(const tk_pkg *k, size_t i) { return krow(k, i) ? krow(k, i)->max_cc : -1; }
int tk_pkg_kernel_arch_specific(const tk_pkg *k, size_t i) { return krow(k, i) ? krow(k, i)->arch_specific : -1; }
const char *tk_pkg_kernel_archs(const tk_pkg *k, size_t i) { return krow(k, i) ? krow(k, i)->archs : NULL; }
size_t tk_pkg_op_count(const tk_pkg *k) { return PKG_OK(k) ? k->nops : 0; }
const char *tk_pkg_op_at(const tk_pkg *k, size_t i) { return PKG_OK(k) && i < k->nops ? k->ops[i] : NULL; }

static json_t *pkg_json(const tk_pkg *k)
{
    json_t *files = json_array();
    for (size_t i = 0; i < k->p->nfiles; i++)
        json_array_append_new(files, json_pack("{s:s, s:s, s:I}", "path", k->p->files[i].path, "sha256",
                                               k->p->files[i].sha256, "size", (json_int_t)k->p->files[i].size));
    json_t *kernels = json_array(), *ops = json_array();
    for (size_t i = 0; i < k->nkernels; i++) {
        const tk_pkg_kernel_row *r = &k->kernels[i];
        const tk_manifest_kernel *d = &k->mk.k[i];
        json_t *dt = json_array();
        for (size_t j = 0; j < d->ndtypes; j++)
            json_array_append_new(dt, json_string(tk_ops__dtype_str(d->dtypes[j])));
        json_array_append_new(kernels,
                              json_pack("{s:s, s:s, s:o, s:o, s:o, s:b, s:s}", "name", r->name, "op", r->op, "dtypes",
                                        dt, "min_cc", r->min_cc ? json_integer(r->min_cc) : json_null(), "max_cc",
                                        r->max_cc ? json_integer(r->max_cc) : json_null(), "arch_specific",
                                        r->arch_specific, "archs", r->archs));
    }
    for (size_t i = 0; i < k->nops; i++)
        json_array_append_new(ops, json_string(k->ops[i]));
    return json_pack("{s:s, s:i, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:I, s:o, s:o, s:o}", "name", k->p->name, "major",
                     k->p->major, "version", k->p->version, "commit", k->p->commit, "manifest_sha256",
                     k->p->manifest_sha256, "license", k->license, "description", k->description, "signer",
                     k->p->signer, "registry", k->p->registry, "installed_at", (json_int_t)k->p->installed_at, "files",
                     files, "kernels", kernels, "ops", ops);
}

int tk_pkg_to_json(char **out, const tk_pkg *k)
{
    if (!out)
        return tk__err(TK_ERR_INVALID, "tk_pkg_to_json: out is NULL");
    *out = NULL;
    if (!PKG_OK(k))
        return tk__err(TK_ERR_INVALID, "invalid tk_pkg");
    json_t *j = pkg_json(k);
    char *s = j ? json_dumps(j, JSON_INDENT(2)) : NULL;
    json_decref(j);
    if (!s)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    *out = s;
    return TK_OK;
}

int tk_pkg_list_installed(tk_pkg_list **out, tk_ctx *ctx)
{
    if (!out)
        return tk__err(TK_ERR_INVALID, "tk_pkg_list_installed: out is NULL");
    *out = NULL;
    int rc = tk_api__check_ctx(ctx);
    if (rc != TK_OK)
        return rc;
    tk_state_pkg **v = NULL;
    size_t n = 0;
    if ((rc = tk_state__pkg_list(&v, &n, ctx->state)) != TK_OK)
        return rc;
    tk_pkg_list *l = calloc(1, sizeof *l);
    if (!l || (n && !(l->v = calloc(n, sizeof *l->v)))) {
        free(l);
        tk_state__pkg_list_free(v, n);
        return tk__err(TK_ERR_NOMEM, "out of memory");
    }
    l->magic = TK_PKG_MAGIC;
    for (size_t i = 0; i < n; i++) {
        tk_state_pkg *p = v[i];
        v[i] = NULL;
        if ((rc = wrap(&l->v[l->n], ctx, p, 0)) != TK_OK)
            break;
        l->n++;
    }
    tk_state__pkg_list_free(v, n);
    if (rc != TK_OK) {
        tk_pkg_list_free(l);
        return rc;
    }
    *out = l;
    return TK_OK;
}

size_t tk_pkg_list_count(const tk_pkg_list *l) { return l && l->magic == TK_PKG_MAGIC ? l->n : 0; }
const tk_pkg *tk_pkg_list_at(const tk_pkg_list *l, size_t i)
{
    return l && l->magic == TK_PKG_MAGIC && i < l->n ? l->v[i] : NULL;
}
void tk_pkg_list_free(tk_pkg_list *l)
{
    if (!l || l->magic != TK_PKG_MAGIC)
        return;
    for (size_t i = 0; i < l->n; i++)
        tk_pkg_free(l->v[i]);
    free(l->v);
    l->magic = 0;
    free(l);
}

/* Re-hashes the installed files; appends one object per bad file to `list` (may be NULL):
 * {"package", "file", "problem": "missing" | "altered" | "manifest_altered", "sha256", "want"}. */
static int verify_impl(tk_ctx *ctx, const char *ref, size_t *nbad, size_t *nchecked, json_t *list)
{
    if (nbad)
        *nbad = 0;
    int rc = tk_api__check_ctx(ctx);
    if (rc != TK_OK)
        return rc;
    tk_state_pkg **v = NULL, *one = NULL;
    size_t n = 0, bad = 0, checked = 0;
    if (ref) {
        if ((rc = tk_hub__installed(&one, ctx->state, ref)) != TK_OK)
            return rc;
        v = &one;
        n = 1;
    } else if ((rc = tk_state__pkg_list(&v, &n, ctx->state)) != TK_OK) {
        return rc;
    }
    tk_buf msg = TK_BUF_INIT, fix = TK_BUF_INIT;
    for (size_t i = 0; i < n; i++) {
        size_t bad_before = bad;
        /* The manifest itself must still hash to what was recorded. */
        char msha[TK_SHA256_HEX];
        tk__sha256_hex(msha, v[i]->manifest, v[i]->manifest_len);
        checked++;
        if (strcmp(msha, v[i]->manifest_sha256) != 0) {
            bad++;
            tk__buf_printf(&msg, "\n  %s: recorded manifest altered", v[i]->name);
            if (list)
                json_array_append_new(list, json_pack("{s:s, s:s, s:s, s:s, s:s}", "package", v[i]->name, "file",
                                                      "manifest.json", "problem", "manifest_altered", "sha256", msha,
                                                      "want", v[i]->manifest_sha256));
        }
        for (size_t f = 0; f < v[i]->nfiles; f++) {
            char *path = tk_state__object_path(ctx->state, v[i]->files[f].sha256);
            char sha[TK_SHA256_HEX];
            int64_t size = 0;
            struct stat lsb;
            int hrc = path ? tk__sha256_file_nofollow(sha, &size, path) : TK_ERR_NOMEM;
            checked++;
            if (path && lstat(path, &lsb) == 0 && !S_ISREG(lsb.st_mode)) {
                bad++; /* a link to an identical copy elsewhere is tampering too: the store holds files */
                tk__buf_printf(&msg, "\n  %s: %s is %s in the store (%s), not a file: tampering", v[i]->name,
                               v[i]->files[f].path, S_ISLNK(lsb.st_mode) ? "a symbolic link" : "something else", path);
                if (list)
                    json_array_append_new(list, json_pack("{s:s, s:s, s:s, s:n, s:s}", "package", v[i]->name, "file",
                                                          v[i]->files[f].path, "problem", "not_a_file", "sha256",
                                                          "want", v[i]->files[f].sha256));
            } else if (hrc != TK_OK) {
                bad++;
                tk__buf_printf(&msg, "\n  %s: %s is missing from the store", v[i]->name, v[i]->files[f].path);
                if (list)
                    json_array_append_new(list, json_pack("{s:s, s:s, s:s, s:n, s:s}", "package", v[i]->name, "file",
                                                          v[i]->files[f].path, "problem", "missing", "sha256", "want",
                                                          v[i]->files[f].sha256));
            } else if (strcmp(sha, v[i]->files[f].sha256) != 0 || size != v[i]->files[f].size) {
                bad++;
                tk__buf_printf(&msg, "\n  %s: %s has sha256 %s, want %s", v[i]->name, v[i]->files[f].path, sha,
                               v[i]->files[f].sha256);
                if (list)
                    json_array_append_new(list, json_pack("{s:s, s:s, s:s, s:s, s:s}", "package", v[i]->name, "file",
                                                          v[i]->files[f].path, "problem", "altered", "sha256", sha,
                                                          "want", v[i]->files[f].sha256));
            }
            free(path);
        }
        /* the fix names the registry it came from, which tk get uses again for it */
        if (bad > bad_before)
            tk__buf_printf(&fix, "%s'tk get --force %s@%d' (from %s)", fix.len ? "; " : "", v[i]->name, v[i]->major,
                           v[i]->registry[0] ? v[i]->registry : "the configured registries");
    }
    if (bad)
        rc = tk__err(TK_ERR_DIGEST, "%zu installed file%s failed verification:%s\nHINT: reinstall with %s", bad,
                     bad == 1 ? "" : "s", msg.data ? msg.data : "", fix.data ? fix.data : "'tk get --force'");
    tk__buf_free(&msg);
    tk__buf_free(&fix);
    if (ref)
        tk_state__pkg_free(one);
    else
        tk_state__pkg_list_free(v, n);
    if (nbad)
        *nbad = bad;
    if (nchecked)
        *nchecked = checked;
    return rc;
}

int tk_pkg_verify(tk_ctx *ctx, const char *ref, size_t *nbad) { return verify_impl(ctx, ref, nbad, NULL, NULL); }

int tk_pkg_verify_json(char **out, tk_ctx *ctx, const char *ref)
{
    if (!out)
        return tk__err(TK_ERR_INVALID, "tk_pkg_verify_json: out is NULL");
    *out = NULL;
    json_t *list = json_array();
    if (!list)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    size_t bad = 0, checked = 0;
    int rc = verify_impl(ctx, ref, &bad, &checked, list);
    if (rc != TK_OK && rc != TK_ERR_DIGEST) {
        json_decref(list);
        return rc;
    }
    char *saved = rc == TK_OK ? NULL : tk__strdup(tk_last_error());
    json_t *j = json_pack("{s:b, s:I, s:I, s:o}", "ok", rc == TK_OK, "checked", (json_int_t)checked, "bad_count",
                          (json_int_t)bad, "bad_files", list);
    char *text = j ? json_dumps(j, JSON_INDENT(2)) : NULL;
    json_decref(j);
    if (!text) {
        free(saved);
        return tk__err(TK_ERR_NOMEM, "out of memory");
    }
    *out = text;
    if (saved) /* the verification's own message stays tk_last_error() */
        rc = tk__err(TK_ERR_DIGEST, "%s", saved);
    free(saved);
    return rc;
}

int tk_pkg_remove(tk_ctx *ctx, const char *refstr)
{
    int rc = tk_api__check_ctx(ctx);
    if (rc != TK_OK)
        return rc;
    tk_hub_ref ref;
    if ((rc = tk_hub__ref_parse(&ref, refstr)) != TK_OK)
        return rc;
    if (ref.commit[0] || ref.prefix[0] || tk_hub__ref_is_spec(&ref))
        return tk__err(TK_ERR_INVALID, "remove takes org/name or org/name@<major>, not a commit or a version\n"
                                       "HINT: a major holds one installed version; remove it with org/name@<major>");
    if ((rc = tk_state__begin(ctx->state)) != TK_OK)
        return rc;
    if ((rc = tk_state__pkg_delete(ctx->state, ref.name, ref.major)) != TK_OK) {
        tk_state__rollback(ctx->state);
        return rc;
    }
    if ((rc = tk_state__commit(ctx->state)) != TK_OK)
        return rc;
    int64_t freed = 0;
    rc = tk_state__gc(ctx->state, &freed);
    tk_api__log(ctx, TK_LOG_INFO, "removed %s (%lld bytes freed)", refstr, (long long)freed);
    return rc;
}

/* ---- keys, trust, publish --------------------------------------------------------------------- */

int tk_keygen(char **pubkey, const char *key_path)
{
    if (!pubkey || !key_path)
        return tk__err(TK_ERR_INVALID, "tk_keygen: pubkey and key_path are required");
    /* missing parent directories are created (0700: they hold a private key) */
    const char *slash = strrchr(key_path, '/');
    if (slash && slash != key_path) {
        char *dir = tk__strndup(key_path, (size_t)(slash - key_path));
        if (!dir)
            return tk__err(TK_ERR_NOMEM, "out of memory");
        int rc = tk__mkdirs(dir, 0700);
        if (rc != TK_OK) {
            rc = tk__err_wrap(TK_ERR_IO, "cannot create %s for the key", dir);
            free(dir);
            return rc;
        }
        free(dir);
    }
    return tk_hub__key_generate(pubkey, key_path);
}

int tk_key_fingerprint(char **keyid, const char *pubkey)
{
    if (!keyid)
        return tk__err(TK_ERR_INVALID, "tk_key_fingerprint: keyid is NULL");
    *keyid = NULL;
    char id[TK_KEYID_LEN];
    int rc = tk_hub__pubkey_check(pubkey, id);
    if (rc == TK_OK && !(*keyid = tk__strdup(id)))
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
    return rc;
}

int tk_trust_add(tk_ctx *ctx, const char *org, const char *pubkey, const char *comment)
{
    int rc = tk_api__check_ctx(ctx);
    if (rc != TK_OK)
        return rc;
    char id[TK_KEYID_LEN], check[140];
    snprintf(check, sizeof check, "%s/x", org ? org : "");
    if (!org || tk_manifest__name_check(check, NULL, NULL) != TK_OK)
        return tk__err(TK_ERR_INVALID, "'%s' is not an org name", org ? org : "(null)");
    if ((rc = tk_hub__pubkey_check(pubkey, id)) != TK_OK)
        return rc;
    return tk_state__trust_add(ctx->state, org, id, pubkey, comment);
}

int tk_trust_remove(tk_ctx *ctx, const char *org, const char *keyid)
{
    int rc = tk_api__check_ctx(ctx);
    if (rc != TK_OK)
        return rc;
    char id[TK_KEYID_LEN];
    /* Accept the public key itself as well as its id. */
    if (keyid && tk__has_prefix(keyid, "ed25519:") && tk_hub__pubkey_check(keyid, id) == TK_OK)
        keyid = id;
    return tk_state__trust_remove(ctx->state, org, keyid);
}

int tk_trust_list_json(char **out, tk_ctx *ctx)
{
    if (!out)
        return tk__err(TK_ERR_INVALID, "tk_trust_list_json: out is NULL");
    *out = NULL;
    int rc = tk_api__check_ctx(ctx);
    if (rc != TK_OK)
        return rc;
    json_t *arr = json_array();
    char bid[TK_KEYID_LEN];
    if (tk_hub__pubkey_check(TK_DEFAULT_PUBKEY, bid) == TK_OK)
        json_array_append_new(arr,
                              json_pack("{s:s, s:s, s:s, s:s, s:I, s:b}", "org", TK_DEFAULT_ORG, "keyid", bid, "pubkey",
                                        TK_DEFAULT_PUBKEY, "comment", "the default registry's key (built in)", "added",
                                        (json_int_t)0, "builtin", 1));
    sqlite3_stmt *s = NULL;
    sqlite3 *db = tk_state__db(ctx->state);
    if (sqlite3_prepare_v2(db, "SELECT org, keyid, pubkey, comment, added FROM trust ORDER BY org, added", -1, &s,
                           NULL) != SQLITE_OK) {
        json_decref(arr);
        return tk_state__dberr(ctx->state, "cannot read the trust store");
    }
    while (sqlite3_step(s) == SQLITE_ROW)
        json_array_append_new(arr,
                              json_pack("{s:s, s:s, s:s, s:s, s:I, s:b}", "org", sqlite3_column_text(s, 0), "keyid",
                                        sqlite3_column_text(s, 1), "pubkey", sqlite3_column_text(s, 2), "comment",
                                        sqlite3_column_text(s, 3) ? (const char *)sqlite3_column_text(s, 3) : "",
                                        "added", (json_int_t)sqlite3_column_int64(s, 4), "builtin", 0));
    sqlite3_finalize(s);
    *out = json_dumps(arr, JSON_INDENT(2));
    json_decref(arr);
    return *out ? TK_OK : tk__err(TK_ERR_NOMEM, "out of memory");
}

/* The archs a publish compiles for, into ccs (*n of them): opts' (version 2), else config.json's
 * "archs", else sm_80 and sm_90. TK_ERR_INVALID for a bad arch. */
static int publish_archs(int ccs[64], size_t *n, const tk_ctx *ctx, const tk_publish_opts *opts)
{
    size_t i;
    json_t *x, *cfg = ctx->config ? json_object_get(ctx->config, "archs") : NULL;
    *n = 0;
    if (opts->version >= 2 && opts->archs && opts->narchs) {
        for (i = 0; i < opts->narchs && *n < 64; i++)
            if (tk_api__parse_arch(&ccs[(*n)++], opts->archs[i]) != 0)
                return tk__err(TK_ERR_INVALID, "bad arch '%s'\nHINT: write archs as sm_80, sm_90 or sm_90a",
                               opts->archs[i] ? opts->archs[i] : "(null)");
        return TK_OK;
    }
    json_array_foreach(cfg, i, x) {
        if (*n < 64 && tk_api__parse_arch(&ccs[(*n)++], json_string_value(x)) != 0)
            return tk__err(TK_ERR_INVALID, "config archs[%zu] is not an arch like \"sm_90\"", i);
    }
    if (!*n) {
        ccs[(*n)++] = 80;
        ccs[(*n)++] = 90;
    }
    return TK_OK;
}

/* Every check install would run, before anything is signed or written (manifest/local.c), and an NVRTC
 * compile of every kernel (issue 23): a package that could never install or never compile never
 * reaches a registry, and no version number is burnt on it. Without NVRTC the compile is skipped
 * with a warning; opts->no_compile skips it on purpose. */
static int precheck(tk_ctx *ctx, const char *pkgdir, const tk_publish_opts *opts)
{
    tk_manifest_local lp;
    tk_buf rep = TK_BUF_INIT;
    size_t nunits = 0, nfailed = 0;
    int ccs[64];
    size_t nccs = 0;
    int rc = tk_manifest__local_load(&lp, pkgdir);
    if (rc != TK_OK)
        return tk__err_wrap(rc, "not published");
    if (opts->version >= 2 && opts->no_compile) {
        tk_api__log(ctx, TK_LOG_INFO, "%s %s: not compiled (compiling before publishing was turned off)", lp.name,
                    lp.version);
    } else if ((rc = publish_archs(ccs, &nccs, ctx, opts)) == TK_OK) {
        rc = tk_api__compile_local(ctx, &lp, ccs, nccs, 1, 0, &rep, &nunits, &nfailed);
        if (rc == TK_ERR_NO_NVRTC) {
            char why[512];
            snprintf(why, sizeof why, "%s", tk_last_error());
            why[strcspn(why, "\n")] = '\0';
            tk_api__log(ctx, TK_LOG_WARN,
                        "%s %s: not compiled before publishing: %s\nHINT: with NVRTC on this "
                        "machine, publish refuses kernels that do not compile; pass --no-compile to skip the "
                        "compile on purpose",
                        lp.name, lp.version, why);
            rc = TK_OK;
        } else if (rc == TK_ERR_COMPILE) {
            /* the report is every failing compile, file:line first; the message keeps its start */
            rc = tk__err(TK_ERR_COMPILE,
                         "%s %s: not published: %zu of %zu compiles failed\n%.1200s%s"
                         "HINT: fix the kernels ('tk check %s' lists every failure), or publish without "
                         "compiling (--no-compile)",
                         lp.name, lp.version, nfailed, nunits, rep.data ? rep.data : "",
                         rep.len > 1200 ? "\n...\n" : "", pkgdir);
        } else if (rc != TK_OK) {
            rc = tk__err_wrap(rc, "%s %s: not published", lp.name, lp.version);
        }
    }
    tk__buf_free(&rep);
    tk_manifest__local_free(&lp);
    return rc;
}

int tk_publish(char **commit, tk_ctx *ctx, const char *pkgdir, const char *to_dir, const tk_publish_opts *opts)
{
    if (commit)
        *commit = NULL;
    int rc = tk_api__check_ctx(ctx);
    if (rc != TK_OK)
        return rc;
    if (!pkgdir || !to_dir || !opts)
        return tk__err(TK_ERR_INVALID, "tk_publish: pkgdir, to_dir and opts (with key_path) are required");
    if (opts->version < 1 || opts->version > TK_PUBLISH_OPTS_VERSION)
        return tk__err(TK_ERR_INVALID, "tk_publish_opts version %u is not supported", opts->version);
    if ((rc = precheck(ctx, pkgdir, opts)) != TK_OK)
        return rc;
    return tk_hub__publish(commit, pkgdir, to_dir, opts->key_path, opts->compression, ctx->log, ctx->log_user);
}

int tk_publish_upload(char **commit, int *created, tk_ctx *ctx, const char *pkgdir, const char *registry,
                      const char *token, const tk_publish_opts *opts)
{
    if (commit)
        *commit = NULL;
    int rc = tk_api__check_ctx(ctx);
    if (rc != TK_OK)
        return rc;
    if (!pkgdir || !registry || !opts)
        return tk__err(TK_ERR_INVALID, "tk_publish_upload: pkgdir, registry and opts (with key_path) are required");
    if (opts->version < 1 || opts->version > TK_PUBLISH_OPTS_VERSION)
        return tk__err(TK_ERR_INVALID, "tk_publish_opts version %u is not supported", opts->version);
    if (ctx->offline)
        return tk__err(TK_ERR_OFFLINE, "cannot publish to %s in offline mode", registry);
    if ((rc = precheck(ctx, pkgdir, opts)) != TK_OK)
        return rc;
    return tk_hub__upload(commit, created, pkgdir, registry, opts->key_path, opts->compression,
                          token ? token : ctx->token, ctx->log, ctx->log_user);
}

int tk_yank(tk_ctx *ctx, const char *ref, const char *reason, const char *to_dir, const char *registry,
            const char *token, const tk_publish_opts *opts, char *moved_to)
{
    char moved[41] = "", name[140];
    int already = 0, removed = 0, rc = tk_api__check_ctx(ctx);
    if (moved_to)
        moved_to[0] = '\0';
    if (rc != TK_OK)
        return rc;
    if (!ref || !opts || !opts->key_path || (!to_dir == !registry))
        return tk__err(TK_ERR_INVALID, "tk_yank: ref, opts with key_path, and one of to_dir or registry are required");
    const char *at = strchr(ref, '@');
    if (!at || at == ref || (size_t)(at - ref) >= sizeof name || !at[1])
        return tk__err(TK_ERR_INVALID, "'%s' names no version: yank ORG/NAME@MAJOR.MINOR.PATCH", ref);
    snprintf(name, sizeof name, "%.*s", (int)(at - ref), ref);
    char *stmt = NULL, *sig = NULL;
    if ((rc = tk_hub__yank_make(&stmt, &sig, name, at + 1, reason, opts->key_path)) != TK_OK)
        return rc;
    if (registry)
        rc = tk_hub__yank_send(moved, &already, &removed, registry, token ? token : ctx->token, stmt, sig);
    else
        rc = tk_hub__tree_yank(moved, &already, &removed, to_dir, stmt, strlen(stmt), sig, strlen(sig));
    free(stmt);
    free(sig);
    if (rc == TK_OK) {
        /* the one line tk yank prints */
        int major = 0;
        tk_manifest__version_parse(at + 1, &major); /* checked by tk_hub__yank_make */
        if (already)
            tk_api__log(ctx, TK_LOG_INFO, "%s was yanked already (nothing changed)", ref);
        else if (removed)
            tk_api__log(ctx, TK_LOG_INFO,
                        "yanked %s; branch v%d removed: it has no other version, so %s@%d "
                        "resolves to nothing until the next %d.x release",
                        ref, major, name, major, major);
        else
            tk_api__log(ctx, TK_LOG_INFO, "yanked %s%s%.12s", ref, moved[0] ? "; branch moved back to commit " : "",
                        moved);
        if (moved_to)
            memcpy(moved_to, moved, 41);
    }
    return rc;
}

/* ---- versions in the registry ---------------------------------------------------------------- */

struct tk_version_list {
    char name[132];
    tk_hub_version *v;
    size_t n;
};

int tk_pkg_versions(tk_version_list **out, tk_ctx *ctx, const char *refstr)
{
    if (!out)
        return tk__err(TK_ERR_INVALID, "tk_pkg_versions: out is NULL");
    *out = NULL;
    int rc = tk_api__check_ctx(ctx);
    if (rc != TK_OK)
        return rc;
    tk_hub_ref ref;
    if ((rc = tk_hub__ref_parse(&ref, refstr)) != TK_OK)
        return rc;
    if (!ctx->offline && (rc = ensure_http(ctx)) != TK_OK)
        return rc;
    tk_api_registries regs;
    char *where = NULL;
    tk_hub_env env;
    if (ctx->offline) { /* tk_hub__versions refuses with TK_ERR_OFFLINE */
        tk_api__hub_env(&env, ctx, NULL, NULL);
    } else if ((rc = tk_api__registries_for(&regs, ctx, &ref, NULL)) == TK_OK) {
        tk_api__hub_env(&env, ctx, NULL, &regs);
        if ((rc = tk_hub__pick_registry(&where, &env, &ref)) == TK_OK)
            env.endpoint = where;
    }
    tk_version_list *l = rc == TK_OK ? calloc(1, sizeof *l) : NULL;
    if (rc == TK_OK && !l)
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
    if (l)
        snprintf(l->name, sizeof l->name, "%s", ref.name);
    if (rc == TK_OK && (rc = tk_hub__versions(&l->v, &l->n, &env, &ref)) != TK_OK) {
        free(l);
        l = NULL;
    }
    free(where);
    if (!ctx->offline)
        tk_api__registries_release(&regs);
    if (rc != TK_OK)
        return rc;
    size_t k = 0; /* keep what the version part allows (an exact version keeps a yanked one; a commit or
                   * a commit prefix keeps the versions at such commits) */
    for (size_t i = 0; i < l->n; i++)
        if (ref.commit[0] || ref.prefix[0] ? tk__has_prefix(l->v[i].commit, ref.commit[0] ? ref.commit : ref.prefix)
                                           : tk_hub__ref_matches(&ref, l->v[i].version))
            l->v[k++] = l->v[i];
    l->n = k;
    *out = l;
    return TK_OK;
}

size_t tk_version_list_count(const tk_version_list *l) { return l ? l->n : 0; }
#define VAT(l, i) ((l) && (i) < (l)->n)
const char *tk_version_list_version(const tk_version_list *l, size_t i) { return VAT(l, i) ? l->v[i].version : NULL; }
const char *tk_version_list_commit(const tk_version_list *l, size_t i) { return VAT(l, i) ? l->v[i].commit : NULL; }
int tk_version_list_major(const tk_version_list *l, size_t i) { return VAT(l, i) ? l->v[i].major : 0; }
int tk_version_list_yanked(const tk_version_list *l, size_t i) { return VAT(l, i) ? l->v[i].yanked : 0; }
const char *tk_version_list_yank_reason(const tk_version_list *l, size_t i)
{
    return VAT(l, i) ? l->v[i].yank_reason : NULL;
}
const char *tk_version_list_published(const tk_version_list *l, size_t i)
{
    return VAT(l, i) ? l->v[i].published : NULL;
}

const char *tk_version_list_latest(const tk_version_list *l, int major)
{
    for (size_t i = 0; l && i < l->n; i++) /* newest first */
        if (!l->v[i].yanked && (!major || l->v[i].major == major))
            return l->v[i].version;
    return NULL;
}

const char *tk_version_list_newer(const tk_version_list *l, int major, const char *than)
{
    const char *latest = tk_version_list_latest(l, major);
    return latest && than && tk_state__version_cmp(latest, than) == 1 ? latest : NULL;
}

int tk_version_list_to_json(char **out, const tk_version_list *l)
{
    *out = NULL;
    json_t *arr = json_array();
    for (size_t i = 0; arr && l && i < l->n; i++) {
        const tk_hub_version *v = &l->v[i];
        json_array_append_new(arr, json_pack("{s:s, s:s, s:i, s:b, s:b, s:s, s:s?, s:s, s:b, s:s}", "version",
                                             v->version, "commit", v->commit, "major", v->major, "head", v->head,
                                             "yanked", v->yanked, "yank_reason", v->yank_reason, "published",
                                             v->published[0] ? v->published : NULL, "signer", v->signer, "trusted",
                                             v->trusted, "description", v->description));
    }
    json_t *j = arr ? json_pack("{s:s, s:o}", "name", l ? l->name : "", "versions", arr) : NULL;
    char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(j);
    if (!text)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    *out = text;
    return TK_OK;
}

void tk_version_list_free(tk_version_list *l)
{
    if (!l)
        return;
    free(l->v);
    free(l);
}
