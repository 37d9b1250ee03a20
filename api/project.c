/*
 * project.c — project files and lock files: what a project needs (tk.json), exactly what it got
 * (tk.lock), and installing either all or nothing.
 *
 * tk.json is JSON, not TOML: Debian packages no C TOML library (only C++ ones: cpptoml, toml11,
 * toml++), and tk reads JSON already (jansson), with line and column in every error:
 *
 *     {"packages": {"kernels-community/activation": "1",
 *                   "acme/attn": {"version": ">=1.2,<2", "registry": "https://kernels.acme.dev"}}}
 *
 * A version is anything `tk get` takes after '@' ("1", "v1", "1.2.0", ">=1.2,<2", a 40-hex commit),
 * or "" / "*" for the highest major. tk.lock sits beside tk.json (docs/project.md):
 *
 *     {"format_version": 2, "project": "tk.json", "packages": [{"name", "requested",
 *      "requested_registry", "major", "version", "commit", "manifest_sha256", "registry", "signer"}]}
 *
 * Installs go through tk_hub__get_all: every package is resolved, downloaded and verified into
 * staging, then all are recorded in one transaction, so a refused package leaves the store as it was.
 */
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "api/api.h"
#include "cache/state.h"
#include "hub/hub.h"
#include "manifest/manifest.h"

#define TK_PROJECT_MAGIC 0x746b7072u /* "tkpr" */
#define PROJECT_FILE "tk.json"
#define LOCK_FILE "tk.lock"
#define PROJECT_MAX (1u << 20)

typedef struct {
    char *name;     /* org/name */
    char *version;  /* the spec as written; "" any */
    char *registry; /* NULL: the context's rules */
} project_pkg;

struct tk_project {
    uint32_t magic;
    char *path;      /* absolute */
    char *lock_path; /* tk.lock beside it */
    size_t n;
    project_pkg *v;
};

/* ---- where a key or value stands in the text: line and column for errors ---------------------
 * jansson keeps no positions after a parse, so this walks the (already valid) text to the value at
 * path[0..depth) (want_key: to its key instead). */

typedef struct {
    const char *end;
    const char *const *path;
    size_t depth;
    int want_key;
    const char *hit;
} locator;

static const char *ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

static const char *str_end(const char *p, const char *end) /* p at '"'; returns past the closing '"' */
{
    for (p++; p < end && *p != '"'; p++)
        if (*p == '\\')
            p++;
    return p < end ? p + 1 : end;
}

static const char *walk(locator *lc, const char *p, size_t level, int on_path)
{
    p = ws(p, lc->end);
    if (on_path && level == lc->depth && !lc->want_key && !lc->hit)
        lc->hit = p;
    if (p >= lc->end)
        return p;
    if (*p == '"')
        return str_end(p, lc->end);
    if (*p != '{' && *p != '[') {
        while (p < lc->end && !strchr(",]} \t\r\n", *p))
            p++;
        return p;
    }
    char close = *p == '{' ? '}' : ']';
    int obj = *p == '{';
    p = ws(p + 1, lc->end);
    while (p < lc->end && *p != close) {
        int next_on = 0;
        if (obj) {
            const char *k = p, *ke = str_end(p, lc->end);
            next_on = on_path && level < lc->depth && (size_t)(ke - k - 2) == strlen(lc->path[level]) &&
                      !memcmp(k + 1, lc->path[level], (size_t)(ke - k - 2));
            if (next_on && level + 1 == lc->depth && lc->want_key && !lc->hit)
                lc->hit = k;
            p = ws(ke, lc->end);
            p++; /* ':' */
        }
        p = ws(walk(lc, p, level + 1, next_on), lc->end);
        if (p < lc->end && *p == ',')
            p = ws(p + 1, lc->end);
    }
    return p < lc->end ? p + 1 : p;
}

/* "FILE:LINE:COL" of the value (or key) at path, or "FILE" when it cannot be found. */
static void where(char *out, size_t cap, const char *file, const char *text, size_t len, const char *const *path,
                  size_t depth, int want_key)
{
    locator lc = {text + len, path, depth, want_key, NULL};
    walk(&lc, text, 0, 1);
    if (!lc.hit) {
        snprintf(out, cap, "%s", file);
        return;
    }
    int line = 1, col = 1;
    for (const char *p = text; p < lc.hit; p++) {
        col = *p == '\n' ? 1 : col + 1;
        line += *p == '\n';
    }
    snprintf(out, cap, "%s:%d:%d", file, line, col);
}

static const char *closest(const char *key, const char *const *known)
{
    const char *best = NULL;
    size_t bestd = (size_t)-1;
    for (size_t i = 0; known[i]; i++) {
        size_t d = tk__edit_distance(key, known[i]);
        if (d < bestd) {
            bestd = d;
            best = known[i];
        }
    }
    return bestd <= 1 + strlen(key) / 3 ? best : NULL;
}

/* An unknown key: the error names its place and the key it was probably meant to be. */
static int unknown_key(const char *file, const char *text, size_t len, const char *const *path, size_t depth,
                       const char *const *known, const char *what)
{
    char at[PATH_MAX + 64];
    where(at, sizeof at, file, text, len, path, depth, 1);
    const char *best = closest(path[depth - 1], known);
    tk_buf all = TK_BUF_INIT;
    for (size_t i = 0; known[i]; i++)
        tk__buf_printf(&all, "%s\"%s\"", i ? ", " : "", known[i]);
    int rc = best ? tk__err(TK_ERR_INVALID, "%s: unknown key \"%s\" in %s\nHINT: did you mean \"%s\"?", at,
                            path[depth - 1], what, best)
                  : tk__err(TK_ERR_INVALID, "%s: unknown key \"%s\" in %s\nHINT: the keys are %s", at, path[depth - 1],
                            what, all.data ? all.data : "");
    tk__buf_free(&all);
    return rc;
}

/* ---- tk.json ----------------------------------------------------------------------------------- */

/* The project's entry for one package: a version string, or {"version", "registry"}. */
static int parse_pkg(project_pkg *pp, const char *name, json_t *v, const char *file, const char *text, size_t len)
{
    static const char *const known[] = {"version", "registry", NULL};
    const char *path[3] = {"packages", name, NULL};
    char at[PATH_MAX + 64];
    const char *spec = json_string_value(v), *reg = NULL;
    int rc = tk_manifest__name_check(name, NULL, NULL);
    if (rc != TK_OK || strchr(name, '@')) {
        where(at, sizeof at, file, text, len, path, 2, 1);
        return rc != TK_OK ? tk__err_wrap(TK_ERR_INVALID, "%s", at)
                           : tk__err(TK_ERR_INVALID,
                                     "%s: '%s': a package name has no '@' (the version is the "
                                     "value)\nHINT: \"org/name\": \"VERSION\"",
                                     at, name);
    }
    if (json_is_object(v)) {
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) {
            path[2] = k;
            if (strcmp(k, "version") && strcmp(k, "registry"))
                return unknown_key(file, text, len, path, 3, known, name);
            if (!json_is_string(x)) {
                where(at, sizeof at, file, text, len, path, 3, 0);
                return tk__err(TK_ERR_INVALID,
                               "%s: \"%s\" of %s must be a string\nHINT: for example {\"version\": "
                               "\">=1.2,<2\", \"registry\": \"https://registry.example.com\"}",
                               at, k, name);
            }
        }
        spec = json_string_value(json_object_get(v, "version"));
        reg = json_string_value(json_object_get(v, "registry"));
        if (!spec)
            spec = "";
    } else if (!spec) {
        where(at, sizeof at, file, text, len, path, 2, 0);
        return tk__err(TK_ERR_INVALID,
                       "%s: %s must be a version string or an object {\"version\", \"registry\"}\n"
                       "HINT: for example \"%s\": \"1\" or \"%s\": {\"version\": \">=1.2,<2\"}",
                       at, name, name, name);
    }
    char ref[400];
    tk_hub_ref r;
    int any = !*spec || !strcmp(spec, "*");
    snprintf(ref, sizeof ref, "%s%s%s", name, any ? "" : "@", any ? "" : spec);
    if ((rc = tk_hub__ref_parse(&r, ref)) != TK_OK) {
        path[2] = "version";
        where(at, sizeof at, file, text, len, path, json_is_object(v) ? 3 : 2, 0);
        return tk__err_wrap(TK_ERR_INVALID, "%s", at);
    }
    if (reg) {
        path[2] = "registry";
        where(at, sizeof at, file, text, len, path, 3, 0);
        if ((rc = tk_api__registry_url_check(reg, at)) != TK_OK)
            return rc;
    }
    pp->name = tk__strdup(name);
    pp->version = tk__strdup(any ? "" : spec);
    pp->registry = reg ? tk__strdup(reg) : NULL;
    if (!pp->name || !pp->version || (reg && !pp->registry))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    return TK_OK;
}

static int parse_project(tk_project *p, const char *text, size_t len)
{
    static const char *const known[] = {"format_version", "packages", NULL};
    char at[PATH_MAX + 64];
    json_error_t jerr;
    json_t *doc = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    int rc = TK_OK;
    if (!json_is_object(doc)) {
        rc = tk__err(TK_ERR_INVALID,
                     "%s:%d:%d: %s\nHINT: a project file is a JSON object such as {\"packages\": "
                     "{\"kernels-community/activation\": \"1\"}} (docs/project.md)",
                     p->path, doc ? 1 : jerr.line, doc ? 1 : jerr.column, doc ? "not a JSON object" : jerr.text);
        goto done;
    }
    const char *k;
    json_t *v;
    json_object_foreach(doc, k, v) {
        const char *path[1] = {k};
        if (strcmp(k, "format_version") && strcmp(k, "packages")) {
            rc = unknown_key(p->path, text, len, path, 1, known, "the project file");
            goto done;
        }
    }
    json_t *fv = json_object_get(doc, "format_version"), *pkgs = json_object_get(doc, "packages");
    const char *fpath[1] = {"format_version"}, *ppath[1] = {"packages"};
    if (fv && (!json_is_integer(fv) || json_integer_value(fv) != 1)) {
        where(at, sizeof at, p->path, text, len, fpath, 1, 0);
        rc = tk__err(TK_ERR_INVALID, "%s: format_version must be 1 (this tk reads version 1 project files)", at);
        goto done;
    }
    if (!json_is_object(pkgs)) {
        where(at, sizeof at, p->path, text, len, ppath, 1, 0);
        rc = tk__err(TK_ERR_INVALID, "%s: %s\nHINT: \"packages\": {\"org/name\": \"VERSION\", ...}", at,
                     pkgs ? "\"packages\" must be an object" : "the project file lists no \"packages\"");
        goto done;
    }
    if (!(p->v = calloc(json_object_size(pkgs) + 1, sizeof *p->v))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    json_object_foreach(pkgs, k, v) {
        if ((rc = parse_pkg(&p->v[p->n], k, v, p->path, text, len)) != TK_OK)
            goto done;
        p->n++;
    }
done:
    json_decref(doc);
    return rc;
}

/* The first tk.json in the current directory or one above it (malloc'd), or NULL. */
static char *find_project(void)
{
    char dir[PATH_MAX];
    if (!getcwd(dir, sizeof dir))
        return NULL;
    for (;;) {
        char *f = tk__fmt("%s/%s", strcmp(dir, "/") ? dir : "", PROJECT_FILE);
        if (!f || tk__path_exists(f))
            return f;
        free(f);
        char *slash = strrchr(dir, '/');
        if (!slash || slash == dir)
            return NULL;
        *slash = '\0';
    }
}

int tk_project_open(tk_project **out, const char *path)
{
    if (!out)
        return tk__err(TK_ERR_INVALID, "tk_project_open: out is NULL");
    *out = NULL;
    char *found = path ? NULL : find_project(), *text = NULL, *dir = NULL;
    size_t len = 0;
    int rc = TK_OK;
    tk_project *p = calloc(1, sizeof *p);
    if (!p)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    p->magic = TK_PROJECT_MAGIC;
    if (!path && !found) {
        rc = tk__err(TK_ERR_NOT_FOUND,
                     "no %s in this directory or any above it\nHINT: write one (docs/project.md), "
                     "or name it with --project FILE",
                     PROJECT_FILE);
        goto done;
    }
    if (!(p->path = realpath(path ? path : found, NULL))) {
        rc = tk__err(TK_ERR_NOT_FOUND, "no project file at '%s'\nHINT: --project names a tk.json (docs/project.md)",
                     path ? path : found);
        goto done;
    }
    if (!(dir = tk__dirname(p->path)) || !(p->lock_path = tk__fmt("%s/%s", dir, LOCK_FILE))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((rc = tk__read_file(&text, &len, p->path, PROJECT_MAX)) == TK_OK)
        rc = parse_project(p, text, len);
done:
    free(found);
    free(text);
    free(dir);
    if (rc != TK_OK)
        tk_project_free(p);
    else
        *out = p;
    return rc;
}

void tk_project_free(tk_project *p)
{
    if (!p || p->magic != TK_PROJECT_MAGIC)
        return;
    for (size_t i = 0; i < p->n; i++) {
        free(p->v[i].name);
        free(p->v[i].version);
        free(p->v[i].registry);
    }
    free(p->v);
    free(p->path);
    free(p->lock_path);
    p->magic = 0;
    free(p);
}

#define PRJ_OK(p) ((p) && (p)->magic == TK_PROJECT_MAGIC)
const char *tk_project_path(const tk_project *p) { return PRJ_OK(p) ? p->path : NULL; }
const char *tk_project_lock_path(const tk_project *p) { return PRJ_OK(p) ? p->lock_path : NULL; }
size_t tk_project_package_count(const tk_project *p) { return PRJ_OK(p) ? p->n : 0; }
const char *tk_project_package_name(const tk_project *p, size_t i)
{
    return PRJ_OK(p) && i < p->n ? p->v[i].name : NULL;
}
const char *tk_project_package_version(const tk_project *p, size_t i)
{
    return PRJ_OK(p) && i < p->n ? p->v[i].version : NULL;
}
const char *tk_project_package_registry(const tk_project *p, size_t i)
{
    return PRJ_OK(p) && i < p->n ? p->v[i].registry : NULL;
}

/* ---- installing a set, all or nothing ---------------------------------------------------------- */

/* One package of a set: its reference and what pins it. */
typedef struct {
    char ref[400];
    const char *registry;         /* named registry, or NULL */
    const char *expect_manifest;  /* lock pins, or NULL */
    const char *expect_signer;
} want_pkg;

/* Installs every want (tk_hub__get_all), then wraps them into outs[0..n) (tk_pkg_free each). */
static int install_set(tk_pkg **outs, tk_ctx *ctx, const want_pkg *w, size_t n, const tk_get_opts *opts)
{
    tk_api_registries *regs = calloc(n ? n : 1, sizeof *regs);
    tk_hub_env *envs = calloc(n ? n : 1, sizeof *envs);
    tk_state_pkg **recs = calloc(n ? n : 1, sizeof *recs);
    int *fresh = calloc(n ? n : 1, sizeof *fresh), rc = tk_api__get_prepare(ctx, opts);
    const char **refs = calloc(n ? n : 1, sizeof *refs);
    size_t nregs = 0;
    if (rc == TK_OK && (!regs || !envs || !recs || !fresh || !refs))
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n && rc == TK_OK; i++) {
        tk_hub_ref r;
        tk_get_opts o = TK_GET_OPTS_INIT;
        if (opts)
            memcpy(&o, opts, opts->version >= 2 ? sizeof o : offsetof(tk_get_opts, registry));
        o.version = TK_GET_OPTS_VERSION;
        o.expect_manifest = w[i].expect_manifest;
        o.expect_signer = w[i].expect_signer;
        refs[i] = w[i].ref;
        if ((rc = tk_hub__ref_parse(&r, w[i].ref)) != TK_OK)
            break;
        if (!ctx->offline && (rc = tk_api__registries_for(&regs[nregs++], ctx, &r, w[i].registry)) != TK_OK)
            break;
        tk_api__hub_env(&envs[i], ctx, &o, ctx->offline ? NULL : &regs[i]);
    }
    if (rc == TK_OK)
        rc = tk_hub__get_all(recs, fresh, envs, refs, n);
    for (size_t i = 0; i < n; i++) {
        outs[i] = NULL;
        if (rc == TK_OK)
            rc = tk_api__wrap_pkg(&outs[i], ctx, recs[i], fresh[i]);
        else
            tk_state__pkg_free(recs ? recs[i] : NULL);
    }
    for (size_t i = 0; i < nregs; i++)
        tk_api__registries_release(&regs[i]);
    if (rc != TK_OK)
        for (size_t i = 0; i < n; i++) {
            tk_pkg_free(outs[i]);
            outs[i] = NULL;
        }
    free(regs);
    free(envs);
    free(recs);
    free(fresh);
    free(refs);
    return rc;
}

/* ---- lock files ---------------------------------------------------------------------------------- */

static json_t *lock_entry(const tk_pkg *k, const project_pkg *req)
{
    json_t *e = json_pack("{s:s, s:i, s:s, s:s, s:s, s:s, s:s}", "name", tk_pkg_name(k), "major", tk_pkg_major(k),
                          "version", tk_pkg_version(k), "commit", tk_pkg_commit(k), "manifest_sha256",
                          tk_pkg_manifest_sha256(k), "registry", tk_pkg_registry(k), "signer", tk_pkg_signer(k));
    if (e && req) {
        json_object_set_new(e, "requested", json_string(req->version));
        json_object_set_new(e, "requested_registry", req->registry ? json_string(req->registry) : json_null());
    }
    return e;
}

/* Writes the lock for pkgs (reqs[i]: the project's entry of pkgs[i], or NULL) atomically. */
static int write_lock(char **text_out, const char *path, const char *project, tk_pkg *const *pkgs,
                      const project_pkg *reqs, size_t n)
{
    json_t *arr = json_array(), *doc = json_object();
    for (size_t i = 0; arr && i < n; i++)
        json_array_append_new(arr, lock_entry(pkgs[i], reqs ? &reqs[i] : NULL));
    json_object_set_new(doc, "format_version", json_integer(2));
    if (project)
        json_object_set_new(doc, "project", json_string(project));
    json_object_set_new(doc, "packages", arr);
    char *text = json_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    char *withnl = text ? tk__fmt("%s\n", text) : NULL;
    json_decref(doc);
    free(text);
    int rc = withnl ? tk__write_atomic(path, withnl, strlen(withnl), 0644) : tk__err(TK_ERR_NOMEM, "out of memory");
    if (rc == TK_OK && text_out)
        *text_out = withnl;
    else
        free(withnl);
    return rc;
}

int tk_lock_write(tk_ctx *ctx, const char *path, const char *const *refs, size_t nrefs)
{
    int rc = tk_api__check_ctx(ctx);
    if (rc != TK_OK)
        return rc;
    tk_pkg_list *all = NULL;
    tk_pkg **v = calloc(nrefs ? nrefs : 1, sizeof *v);
    size_t n = 0;
    if (!v)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    if (nrefs == 0) { /* no project, no names: every installed package */
        if ((rc = tk_pkg_list_installed(&all, ctx)) == TK_OK && tk_pkg_list_count(all) == 0)
            rc = tk__err(TK_ERR_NOT_FOUND, "nothing is installed, so there is nothing to lock\nHINT: 'tk get "
                                           "<package>' first, or write a project file (docs/project.md)");
        tk_pkg **vv = rc == TK_OK ? realloc(v, tk_pkg_list_count(all) * sizeof *v) : NULL;
        if (vv)
            for (v = vv; n < tk_pkg_list_count(all); n++)
                v[n] = (tk_pkg *)tk_pkg_list_at(all, n);
        else if (rc == TK_OK)
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < nrefs && rc == TK_OK; i++)
        if ((rc = tk_pkg_info(&v[i], ctx, refs[i])) == TK_OK)
            n++;
    if (rc == TK_OK)
        rc = write_lock(NULL, path, NULL, v, NULL, n);
    if (!all)
        for (size_t i = 0; i < n; i++)
            tk_pkg_free(v[i]);
    tk_pkg_list_free(all);
    free(v);
    return rc;
}

/* Reads a lock file (format 1 or 2) into wants (*w malloc'd; strings borrowed from *doc). */
static int read_lock(json_t **doc, want_pkg **w, size_t *n, const char *path)
{
    char *text = NULL;
    size_t len = 0;
    json_error_t jerr;
    *doc = NULL;
    *w = NULL;
    *n = 0;
    int rc = tk__read_file(&text, &len, path, 4u << 20);
    if (rc == TK_ERR_NOT_FOUND)
        return tk__err(TK_ERR_NOT_FOUND, "no lock file at '%s'\nHINT: 'tk lock' writes one", path);
    if (rc != TK_OK)
        return rc;
    *doc = json_loadb(text, len, 0, &jerr);
    free(text);
    json_t *pkgs = json_object_get(*doc, "packages"), *e;
    json_int_t fv = json_integer_value(json_object_get(*doc, "format_version"));
    if (!*doc)
        return tk__err(TK_ERR_INVALID, "%s:%d:%d: %s", path, jerr.line, jerr.column, jerr.text);
    if (!json_is_array(pkgs) || (fv != 1 && fv != 2))
        return tk__err(TK_ERR_INVALID, "%s is not a tk lock file (format_version 1 or 2 with a 'packages' array)",
                       path);
    if (!(*w = calloc(json_array_size(pkgs) + 1, sizeof **w)))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    const char *top_registry = json_string_value(json_object_get(*doc, "registry")); /* format 1 */
    size_t i;
    json_array_foreach(pkgs, i, e) {
        const char *name = json_string_value(json_object_get(e, "name"));
        const char *commit = json_string_value(json_object_get(e, "commit"));
        const char *msha = json_string_value(json_object_get(e, "manifest_sha256"));
        const char *reg = json_string_value(json_object_get(e, "registry"));
        const char *signer = json_string_value(json_object_get(e, "signer"));
        if (!name || !commit || !tk__is_hex(commit, 40) || !msha || !tk__is_hex(msha, 64) ||
            (fv == 2 && (!reg || !signer)))
            return tk__err(TK_ERR_INVALID, "%s: entry %zu needs name, a 40-hex commit and a manifest_sha256%s", path, i,
                           fv == 2 ? ", registry and signer" : "");
        want_pkg *x = &(*w)[(*n)++];
        snprintf(x->ref, sizeof x->ref, "%s@%s", name, commit);
        x->registry = reg ? reg : top_registry;
        x->expect_manifest = msha;
        x->expect_signer = signer;
        char where_[64];
        snprintf(where_, sizeof where_, "entry %zu", i);
        if (x->registry && (rc = tk_api__registry_url_check(x->registry, where_)) != TK_OK)
            return tk__err_wrap(rc, "%s", path);
    }
    return TK_OK;
}

static int install_wants(tk_ctx *ctx, const want_pkg *w, size_t n, const tk_get_opts *opts,
                         void (*each)(void *user, const tk_pkg *pkg), void *user, tk_pkg ***got)
{
    tk_pkg **outs = calloc(n ? n : 1, sizeof *outs);
    int rc = outs ? install_set(outs, ctx, w, n, opts) : tk__err(TK_ERR_NOMEM, "out of memory");
    for (size_t i = 0; rc == TK_OK && each && i < n; i++)
        each(user, outs[i]);
    if (got && rc == TK_OK) {
        *got = outs;
        return rc;
    }
    for (size_t i = 0; outs && i < n; i++)
        tk_pkg_free(outs[i]);
    free(outs);
    return rc;
}

int tk_lock_install(tk_ctx *ctx, const char *path, const tk_get_opts *opts, void (*each)(void *user, const tk_pkg *pkg),
                    void *user)
{
    int rc = tk_api__check_ctx(ctx);
    if (rc != TK_OK)
        return rc;
    json_t *doc = NULL;
    want_pkg *w = NULL;
    size_t n = 0;
    if ((rc = read_lock(&doc, &w, &n, path)) == TK_OK)
        rc = install_wants(ctx, w, n, opts, each, user, NULL);
    free(w);
    json_decref(doc);
    return rc;
}

/* ---- a project's packages -------------------------------------------------------------------- */

/* The lock must record exactly the project's packages, as the project asks for them now. */
static int lock_matches(const tk_project *p, const json_t *doc)
{
    json_t *pkgs = json_object_get(doc, "packages");
    tk_buf diff = TK_BUF_INIT;
    for (size_t i = 0; i < p->n; i++) {
        json_t *e = NULL;
        size_t j;
        json_array_foreach(pkgs, j, e)
            if (!strcmp(json_string_value(json_object_get(e, "name")) ? json_string_value(json_object_get(e, "name"))
                                                                      : "",
                        p->v[i].name))
                break;
        const char *req = json_string_value(json_object_get(e, "requested"));
        const char *rreg = json_string_value(json_object_get(e, "requested_registry"));
        if (j == json_array_size(pkgs))
            tk__buf_printf(&diff, "\n  %s is not in the lock", p->v[i].name);
        else if (!req || strcmp(req, p->v[i].version))
            tk__buf_printf(&diff, "\n  %s: the lock was made for version \"%s\", the project asks for \"%s\"",
                           p->v[i].name, req ? req : "(none)", p->v[i].version);
        else if ((rreg || p->v[i].registry) && (!rreg || !p->v[i].registry || strcmp(rreg, p->v[i].registry)))
            tk__buf_printf(&diff, "\n  %s: the lock was made for registry %s, the project names %s", p->v[i].name,
                           rreg ? rreg : "(the configured ones)", p->v[i].registry ? p->v[i].registry : "none");
    }
    if (!diff.len && json_array_size(pkgs) != p->n)
        tk__buf_printf(&diff, "\n  the lock pins %zu packages, the project lists %zu", json_array_size(pkgs), p->n);
    int rc = diff.len ? tk__err(TK_ERR_INVALID,
                                "%s is out of date with %s:%s\nHINT: run 'tk lock' to pin what the "
                                "project asks for now",
                                p->lock_path, p->path, diff.data)
                      : TK_OK;
    tk__buf_free(&diff);
    return rc;
}

/* The project's packages as wants (malloc'd; strings borrowed from p). */
static want_pkg *project_wants(const tk_project *p)
{
    want_pkg *w = calloc(p->n + 1, sizeof *w);
    for (size_t i = 0; w && i < p->n; i++) {
        snprintf(w[i].ref, sizeof w[i].ref, "%s%s%s", p->v[i].name, p->v[i].version[0] ? "@" : "", p->v[i].version);
        w[i].registry = p->v[i].registry;
    }
    return w;
}

int tk_project_get(tk_ctx *ctx, const tk_project *p, int locked, const tk_get_opts *opts,
                   void (*each)(void *user, const tk_pkg *pkg), void *user)
{
    int rc = tk_api__check_ctx(ctx);
    if (rc != TK_OK)
        return rc;
    if (!PRJ_OK(p))
        return tk__err(TK_ERR_INVALID, "tk_project_get: invalid tk_project");
    json_t *doc = NULL;
    want_pkg *w = NULL;
    size_t n = 0;
    if (locked) {
        if ((rc = read_lock(&doc, &w, &n, p->lock_path)) == TK_OK)
            rc = lock_matches(p, doc);
    } else if (!(w = project_wants(p))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
    } else {
        n = p->n;
    }
    if (rc == TK_OK)
        rc = install_wants(ctx, w, n, opts, each, user, NULL);
    free(w);
    json_decref(doc);
    return rc;
}

int tk_project_lock(char **text, tk_ctx *ctx, const tk_project *p, const tk_get_opts *opts)
{
    if (text)
        *text = NULL;
    int rc = tk_api__check_ctx(ctx);
    if (rc != TK_OK)
        return rc;
    if (!PRJ_OK(p))
        return tk__err(TK_ERR_INVALID, "tk_project_lock: invalid tk_project");
    want_pkg *w = project_wants(p);
    tk_pkg **got = NULL;
    if (!w)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    if ((rc = install_wants(ctx, w, p->n, opts, NULL, NULL, &got)) == TK_OK) {
        const char *base = strrchr(p->path, '/');
        rc = write_lock(text, p->lock_path, base ? base + 1 : p->path, got, p->v, p->n);
        for (size_t i = 0; i < p->n; i++)
            tk_pkg_free(got[i]);
        free(got);
    }
    free(w);
    return rc;
}
