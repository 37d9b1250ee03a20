/*
 * registry.c — which registries a context uses, and which of them a package is looked up in.
 *
 * Sources, first that applies: the context's endpoint argument or $TK_ENDPOINT (one registry for
 * everything, overriding all below), "registries" in config.json (an ordered list), "endpoint" in
 * config.json, the build's default. A "registries" entry is a URL, or {"url": URL, "packages":
 * [PATTERN, ...]}: a registry with patterns (fnmatch(3) over org/name: "acme/" then "*") is the only
 * place the packages it matches come from, and serves nothing else; the others are searched in
 * order. Scoping a private org to its registry is what keeps a public registry from ever supplying
 * a package of that name (dependency confusion).
 *
 * For one package (tk_api__registries_for): the registry named for it (a project file's "registry",
 * tk_get_opts.registry), else the scoped registry that matches it, else the registry it was
 * installed from (state.db remembers it for each installed major: the major the reference names, or
 * the highest installed), else every unscoped registry in order.
 */
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "api/api.h"
#include "cache/state.h"
#include "manifest/manifest.h"

int tk_api__registry_url_check(const char *url, const char *where)
{
    if (url && (tk__has_prefix(url, "http://") || tk__has_prefix(url, "https://") || tk__has_prefix(url, "file://")) &&
        !strpbrk(url, " \t\r\n"))
        return TK_OK;
    return tk__err(TK_ERR_INVALID,
                   "%s: registry '%s' is not an http, https or file URL\nHINT: for example "
                   "https://registry.example.com or file:///srv/registry",
                   where, url ? url : "(null)");
}

/* A copy of url without trailing slashes, or NULL (out of memory). */
static char *url_dup(const char *url)
{
    char *u = tk__strdup(url);
    size_t n = u ? strlen(u) : 0;
    while (n > 0 && u[n - 1] == '/')
        u[--n] = '\0';
    return u;
}

static int add(tk_ctx *ctx, const char *url, const json_t *patterns, const char *source)
{
    tk_api_registry *r = realloc(ctx->regs, (ctx->nregs + 1) * sizeof *r);
    if (!r)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    ctx->regs = r;
    r = &ctx->regs[ctx->nregs];
    memset(r, 0, sizeof *r);
    r->source = source;
    if (!(r->url = url_dup(url)))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    ctx->nregs++;
    size_t n = json_array_size(patterns), i;
    json_t *p;
    if (n && !(r->patterns = calloc(n, sizeof *r->patterns)))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    json_array_foreach(patterns, i, p) {
        if (!(r->patterns[r->npatterns] = tk__strdup(json_string_value(p))))
            return tk__err(TK_ERR_NOMEM, "out of memory");
        r->npatterns++;
    }
    return TK_OK;
}

/* One "registries" entry: a URL string or {"url", "packages"}; checked, then added. */
static int add_entry(tk_ctx *ctx, const json_t *e, size_t i, const char *cfg)
{
    char where[4200];
    snprintf(where, sizeof where, "%s: \"registries\"[%zu]", cfg, i);
    const char *url = json_string_value(e);
    const json_t *pats = NULL;
    if (json_is_object(e)) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)e, k, v)
            if (strcmp(k, "url") && strcmp(k, "packages"))
                return tk__err(TK_ERR_INVALID,
                               "%s: unknown key \"%s\"\nHINT: an entry is a URL or {\"url\": URL, "
                               "\"packages\": [\"org/*\", \"org/name\"]}",
                               where, k);
        url = json_string_value(json_object_get(e, "url"));
        pats = json_object_get(e, "packages");
        size_t j;
        json_t *p;
        int ok = !pats || (json_is_array(pats) && json_array_size(pats) > 0);
        json_array_foreach(pats, j, p)
            ok &= json_is_string(p) && strchr(json_string_value(p), '/') != NULL;
        if (!ok)
            return tk__err(TK_ERR_INVALID,
                           "%s: \"packages\" must be a non-empty array of org/name patterns\n"
                           "HINT: for example \"packages\": [\"acme/*\", \"other/one-package\"]",
                           where);
    } else if (!url) {
        return tk__err(TK_ERR_INVALID,
                       "%s must be a URL string or an object {\"url\", \"packages\"}\nHINT: for "
                       "example \"registries\": [{\"url\": \"https://private.example.com\", \"packages\": "
                       "[\"acme/*\"]}, \"https://registry.example.com\"]",
                       where);
    }
    int rc = tk_api__registry_url_check(url, where);
    return rc != TK_OK ? rc : add(ctx, url, pats, "config");
}

int tk_api__registries_load(tk_ctx *ctx, const char *override, char *(*default_endpoint)(void))
{
    char *cfg = tk__path_join(ctx->config_dir, "config.json");
    const json_t *list = json_object_get(ctx->config, "registries");
    const char *single = tk_api__config_str(ctx, "endpoint");
    int rc = cfg ? TK_OK : tk__err(TK_ERR_NOMEM, "out of memory");
    if (rc != TK_OK)
        return rc;
    if (override && *override) {
        ctx->endpoint_override = 1;
        rc = add(ctx, override, NULL, "TK_ENDPOINT");
    } else if (list && single) {
        rc = tk__err(TK_ERR_INVALID,
                     "%s sets both \"endpoint\" and \"registries\"\nHINT: keep one: move the "
                     "endpoint into the list (\"registries\": [\"%s\", ...])",
                     cfg, single);
    } else if (list) {
        if (!json_is_array(list) || json_array_size(list) == 0)
            rc = tk__err(TK_ERR_INVALID,
                         "%s: \"registries\" must be a non-empty array\nHINT: for example "
                         "\"registries\": [\"https://registry.example.com\"]",
                         cfg);
        size_t i;
        json_t *e;
        if (rc == TK_OK && json_array_size(list) > TK_API_MAX_REGISTRIES)
            rc = tk__err(TK_ERR_INVALID, "%s: \"registries\" lists %zu registries; tk takes at most %d", cfg,
                         json_array_size(list), TK_API_MAX_REGISTRIES);
        json_array_foreach(list, i, e)
            if (rc == TK_OK)
                rc = add_entry(ctx, e, i, cfg);
    } else if (single) {
        char where[4200];
        snprintf(where, sizeof where, "%s: \"endpoint\"", cfg);
        if ((rc = tk_api__registry_url_check(single, where)) == TK_OK)
            rc = add(ctx, single, NULL, "config");
    } else {
        char *d = default_endpoint();
        rc = d ? add(ctx, d, NULL, "default") : tk__err(TK_ERR_NOMEM, "out of memory");
        free(d);
    }
    free(cfg);
    if (rc == TK_OK && !(ctx->endpoint = tk__strdup(ctx->regs[0].url)))
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
    return rc;
}

void tk_api__registries_free(tk_ctx *ctx)
{
    for (size_t i = 0; i < ctx->nregs; i++) {
        for (size_t j = 0; j < ctx->regs[i].npatterns; j++)
            free(ctx->regs[i].patterns[j]);
        free(ctx->regs[i].patterns);
        free(ctx->regs[i].url);
    }
    free(ctx->regs);
    ctx->regs = NULL;
    ctx->nregs = 0;
}

static int scoped_match(const tk_api_registry *r, const char *name)
{
    for (size_t j = 0; j < r->npatterns; j++)
        if (fnmatch(r->patterns[j], name, 0) == 0)
            return 1;
    return 0;
}

/* A file:// registry that is not a directory is a dead registry, not one without the package. */
static int check_alive(const char *url)
{
    struct stat st;
    if (!tk__has_prefix(url, "file://") || (stat(url + 7, &st) == 0 && S_ISDIR(st.st_mode)))
        return TK_OK;
    return tk__err(TK_ERR_NETWORK,
                   "the registry %s cannot be read: %s is not a directory\nHINT: check "
                   "TK_ENDPOINT, or \"registries\"/\"endpoint\" in config.json ('tk doctor' lists the registries); "
                   "--offline works from installed packages",
                   url, url + 7);
}

/* The installed package ref's registry comes from: the installed commit it names, else the installed
 * major it names (its exact version's major), else the highest installed major. Each installed major
 * remembers its own registry, so with v1 from one registry and v2 from another each is asked where
 * it came from. NULL when none is installed. */
static tk_state_pkg *installed_for(tk_ctx *ctx, const tk_hub_ref *ref)
{
    tk_state_pkg *have = NULL;
    int major = ref->major;
    if (ref->exact[0])
        tk_manifest__version_parse(ref->exact, &major);
    if (ref->commit[0] && tk_state__pkg_get_commit(&have, ctx->state, ref->name, ref->commit) == TK_OK)
        return have;
    if (major && tk_state__pkg_get(&have, ctx->state, ref->name, major) == TK_OK)
        return have;
    if (tk_state__pkg_get(&have, ctx->state, ref->name, 0) == TK_OK)
        return have;
    return NULL;
}

int tk_api__registries_for(tk_api_registries *out, tk_ctx *ctx, const tk_hub_ref *ref, const char *named)
{
    memset(out, 0, sizeof *out);
    const char *name = ref->name;
    tk_state_pkg *have = NULL;
    int rc = TK_OK;
    if (ctx->endpoint_override || named) {
        out->v[out->n++] = out->owned = url_dup(ctx->endpoint_override ? ctx->regs[0].url : named);
        out->why = ctx->endpoint_override ? "TK_ENDPOINT" : "named";
    } else {
        for (size_t i = 0; i < ctx->nregs && !out->n; i++)
            if (scoped_match(&ctx->regs[i], name)) {
                out->v[out->n++] = ctx->regs[i].url;
                out->why = "scoped";
            }
        if (!out->n && (have = installed_for(ctx, ref)) != NULL && have->registry[0]) {
            out->v[out->n++] = out->owned = url_dup(have->registry);
            out->why = "installed";
        }
        for (size_t i = 0; i < ctx->nregs && !out->why && out->n < TK_API_MAX_REGISTRIES; i++)
            if (!ctx->regs[i].npatterns)
                out->v[out->n++] = ctx->regs[i].url;
        if (!out->why)
            out->why = "search";
    }
    tk_state__pkg_free(have);
    if (out->n && !out->v[0])
        return tk__err(TK_ERR_NOMEM, "out of memory");
    if (!out->n)
        return tk__err(TK_ERR_NOT_FOUND,
                       "no configured registry serves %s: each one is limited to other packages "
                       "(\"packages\" in config.json's \"registries\")\nHINT: add a registry without \"packages\", "
                       "or name one for it in the project file",
                       name);
    for (size_t i = 0; i < out->n && rc == TK_OK; i++)
        rc = check_alive(out->v[i]);
    if (rc != TK_OK && !strcmp(out->why, "installed"))
        rc = tk__err_wrap(rc, "%s was installed from %s, and tk gets it from there again", name, out->v[0]);
    return rc;
}

void tk_api__registries_release(tk_api_registries *r)
{
    free(r->owned);
    r->owned = NULL;
}

int tk_ctx_registries_json(char **out, const tk_ctx *ctx)
{
    if (!out)
        return tk__err(TK_ERR_INVALID, "tk_ctx_registries_json: out is NULL");
    *out = NULL;
    int rc = tk_api__check_ctx(ctx);
    if (rc != TK_OK)
        return rc;
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < ctx->nregs; i++) {
        json_t *pats = ctx->regs[i].npatterns ? json_array() : json_null();
        for (size_t j = 0; j < ctx->regs[i].npatterns; j++)
            json_array_append_new(pats, json_string(ctx->regs[i].patterns[j]));
        json_array_append_new(arr, json_pack("{s:s, s:o, s:s}", "url", ctx->regs[i].url, "packages", pats, "source",
                                             ctx->regs[i].source));
    }
    *out = arr ? json_dumps(arr, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(arr);
    return *out ? TK_OK : tk__err(TK_ERR_NOMEM, "out of memory");
}
