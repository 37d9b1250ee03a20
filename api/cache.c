/*
 * cache.c — the compiled-binary cache of a context: opened once per tk_ctx on first use (its size cap
 * from the config), and the cache commands of tk.h (tk_cache_stats_json, tk_cache_list_json,
 * tk_cache_gc, tk_cache_clear).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "cache/kcache.h"
#include "jit/jit.h"

#define JITSTATE_MAGIC 0x746b6a73u /* "tkjs" */
#define DEFAULT_CACHE_MAX ((int64_t)2 << 30)

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
            return tk__err(TK_ERR_INVALID,
                           "TK_CACHE_MAX='%s' is not a size\nHINT: use bytes or a K/M/G "
                           "suffix, e.g. TK_CACHE_MAX=4G",
                           env);
        return TK_OK;
    }
    if (json_is_integer(v) && json_integer_value(v) >= 0) {
        *cap = json_integer_value(v);
    } else if (json_is_string(v)) {
        if (tk_kcache__parse_size(json_string_value(v), cap) != 0)
            return tk__err(TK_ERR_INVALID, "config cache_max '%s' is not a size (e.g. \"4G\")", json_string_value(v));
    } else if (v) {
        return tk__err(TK_ERR_INVALID, "config cache_max must be a size such as \"4G\"");
    }
    return TK_OK;
}

int tk_api__kcache(struct tk_kcache **out, tk_ctx *ctx)
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
    if ((rc = tk_api__kcache(&kc, ctx)) != TK_OK || (rc = tk_kcache__stats(kc, &n, &bytes)) != TK_OK)
        return rc;
    /* the NVRTC new entries are compiled with (and keyed by): its version and file, or null */
    if (tk_jit__nvrtc_version(&vmaj, &vmin, &nvpath) == TK_OK) {
        snprintf(ver, sizeof ver, "%d.%d", vmaj, vmin);
        nv = json_pack("{s:s, s:s}", "version", ver, "path", nvpath ? nvpath : "");
    } else {
        nv = json_null();
        tk__err_clear();
    }
    o = json_pack("{s:s, s:I, s:I, s:I, s:o}", "path", tk_kcache__path(kc), "entries", (json_int_t)n, "bytes",
                  (json_int_t)bytes, "max_bytes", (json_int_t)tk_kcache__max_bytes(kc), "nvrtc", nv);
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
    if ((rc = tk_api__kcache(&kc, ctx)) != TK_OK)
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
    if ((rc = tk_api__kcache(&kc, ctx)) != TK_OK)
        return rc;
    if (max_bytes < 0 && (rc = cache_cap(ctx, &max_bytes)) != TK_OK)
        return rc;
    return tk_kcache__gc(kc, max_bytes, freed);
}

int tk_cache_clear(tk_ctx *ctx)
{
    tk_kcache *kc = NULL;
    int rc;
    if ((rc = tk_api__kcache(&kc, ctx)) != TK_OK)
        return rc;
    return tk_kcache__clear(kc, NULL);
}
