/*
 * ctx.c — tk_ctx: where state lives (TK_HOME or the XDG directories), which registry to use
 * (argument, then $TK_ENDPOINT, then config.json, then the build's default) and the open state.
 *
 * The build's default is the registry it published (file://<build>/registry). Where that directory
 * does not exist (a relocated copy, an unpacked tarball) or the build named none (`make gpu-bundle`
 * builds with DEFAULT_ENDPOINT empty), the default follows the binary instead: <dir of libtk.so or the program>/registry, then ../registry
 * (the test binaries sit in tests/ beside it), then ../share/tkhub/registry (make install's layout; an
 * installed build's own default is file://PREFIX/share/tkhub/registry, scripts/install.mk).
 */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api/api.h"
#include "cache/state.h"
#include "hub/http.h"
#include "manifest/manifest.h"
#include "tk_default.h"

int tk_api__check_ctx(const tk_ctx *ctx)
{
    if (!ctx || ctx->magic != TK_CTX_MAGIC)
        return tk__err(TK_ERR_INVALID, "invalid tk_ctx (NULL, freed or not a context)");
    return TK_OK;
}

void tk_api__log(const tk_ctx *ctx, int level, const char *fmt, ...)
{
    if (!ctx || !ctx->log)
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ctx->log(ctx->log_user, level, msg);
}

int tk_ctx_config_warnings_json(char **out, const tk_ctx *ctx)
{
    if (!out)
        return tk__err(TK_ERR_INVALID, "tk_ctx_config_warnings_json: out is NULL");
    *out = NULL;
    int rc = tk_api__check_ctx(ctx);
    if (rc != TK_OK)
        return rc;
    *out = ctx->config_warnings ? json_dumps(ctx->config_warnings, JSON_INDENT(2)) : tk__strdup("[]");
    return *out ? TK_OK : tk__err(TK_ERR_NOMEM, "out of memory");
}

const char *tk_api__config_str(const tk_ctx *ctx, const char *key)
{
    return json_string_value(json_object_get(ctx->config, key));
}

static char *xdg(const char *var, const char *fallback)
{
    const char *v = getenv(var);
    if (v && v[0] == '/')
        return tk__fmt("%s/tk", v);
    const char *home = getenv("HOME");
    if (!home || !*home)
        return NULL;
    return tk__fmt("%s/%s/tk", home, fallback);
}

static int env_true(const char *name)
{
    const char *v = getenv(name);
    return v && (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcasecmp(v, "on"));
}

static int is_dir(const char *path)
{
    struct stat st;
    return path && stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The default registry: the build's own if it exists, else a registry/ beside the code that runs
 * (libtk.so, or the program libtk.a is linked into), else beside its parent. Returns a new string. */
static char *default_endpoint(void)
{
    const char *built = TK_DEFAULT_ENDPOINT;
    if (built[0] && (!tk__has_prefix(built, "file://") || is_dir(built + 7)))
        return tk__strdup(built);
    char self[PATH_MAX] = "";
    Dl_info info;
    if (dladdr((void *)&default_endpoint, &info) && info.dli_fname && strchr(info.dli_fname, '/')) {
        if (!realpath(info.dli_fname, self))
            self[0] = '\0';
    }
    if (!self[0]) { /* the main program, found through PATH: dladdr names it without a directory */
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        self[n > 0 ? n : 0] = '\0';
    }
    char *slash = strrchr(self, '/');
    if (slash && !built[0]) /* where it was looked for first, so an error names that */
        built = NULL;
    if (slash) {
        *slash = '\0';
        /* ../share/tkhub/registry: an installed tk or libtkhub (make install) in a moved prefix */
        const char *rel[] = {"registry", "../registry", "../share/tkhub/registry"};
        for (size_t i = 0; i < 3; i++) {
            char *dir = tk__fmt("%s/%s", self, rel[i]);
            char *real = dir ? realpath(dir, NULL) : NULL;
            free(dir);
            if (real && is_dir(real)) {
                char *url = tk__fmt("file://%s", real);
                free(real);
                return url;
            }
            free(real);
        }
    }
    /* nothing found: keep a URL that names what was looked for, so the error says where */
    if (!built && slash)
        return tk__fmt("file://%s/registry", self);
    return tk__strdup(built && built[0] ? built : "file:///tk-registry-not-found");
}

/* ---- config.json: tk's own settings ---------------------------------------------------------- */

static int is_string(const json_t *v) { return json_is_string(v); }
static int is_array(const json_t *v) { return json_is_array(v); }
static int is_bool(const json_t *v) { return json_is_boolean(v); }
static int is_size(const json_t *v) { return json_is_string(v) || (json_is_integer(v) && json_integer_value(v) >= 0); }
static int is_string_array(const json_t *v)
{
    size_t i;
    json_t *x;
    int ok = json_is_array(v);
    json_array_foreach(v, i, x)
        ok &= json_is_string(x);
    return ok;
}
static int is_selftest_mode(const json_t *v) /* docs/selftest.md */
{
    const char *m = json_string_value(v);
    return m && (!strcmp(m, "off") || !strcmp(m, "record") || !strcmp(m, "required"));
}
static int is_string_object(const json_t *v)
{
    const char *k;
    json_t *x;
    int ok = json_is_object(v);
    if (ok)
        json_object_foreach((json_t *)v, k, x)
            ok &= json_is_string(x);
    return ok;
}

/* Every key tk reads from config.json, one row each: its name, the check of its value's type, what
 * the value must be and an example. Adding a setting is adding a row here; a key that is not in the
 * table is reported with its file:line:column and the closest known key, and ignored. */
static const struct {
    const char *key;
    int (*ok)(const json_t *v);
    const char *want, *example;
} config_keys[] = {
    {"registries", is_array, "an array of registries (URLs, or {\"url\", \"packages\"})",
     "\"registries\": [{\"url\": \"https://private.example.com\", \"packages\": [\"acme/*\"]}, "
     "\"https://registry.example.com\"]"},
    {"endpoint", is_string, "a string (a registry URL)", "\"endpoint\": \"https://registry.example.com\""},
    {"archs", is_string_array, "an array of arch strings", "\"archs\": [\"sm_80\", \"sm_90\"]"},
    {"ops", is_string_object, "an object of op name to package", "\"ops\": {\"silu_and_mul\": \"org/name\"}"},
    {"autotune", is_bool, "true or false", "\"autotune\": false"},
    {"cache_max", is_size, "a size (bytes, or a string with K/M/G)", "\"cache_max\": \"4G\""},
    {"selftest", is_selftest_mode, "\"off\", \"record\" or \"required\"", "\"selftest\": \"required\""},
    {"cpu_fallback", is_bool, "true or false", "\"cpu_fallback\": true"},
};
#define NCONFIG_KEYS (sizeof config_keys / sizeof *config_keys)

/* An unknown key of config.json: a warning (logged now, and kept for tk doctor) with its place and
 * the closest known key when one is close: a misspelt "endpont" would otherwise be ignored in
 * silence. Unknown keys stay an error-free warning, so a config written for a newer tk still works. */
static int warn_unknown(tk_ctx *ctx, const char *key, const char *path, const char *text, size_t len)
{
    char where[PATH_MAX + 512] = "";
    const char *keys[1] = {key};
    size_t idx[1] = {0}, bestd = (size_t)-1, limit = strlen(key) / 3 ? strlen(key) / 3 : 1;
    const char *best = NULL;
    int line = 0, col = 0;
    for (size_t i = 0; i < NCONFIG_KEYS; i++) {
        size_t d = tk__edit_distance(key, config_keys[i].key);
        if (d < bestd) {
            bestd = d;
            best = config_keys[i].key;
        }
    }
    if (bestd > limit)
        best = NULL;
    if (tk_manifest__json_where(where, sizeof where, text, len, path, keys, idx, 1) == 0) {
        where[strcspn(where, "|")] = '\0'; /* "file:line:col" */
        char copy[sizeof where], *c2, *c1;
        int64_t l = 0, c = 0;
        memcpy(copy, where, sizeof copy);
        if ((c2 = strrchr(copy, ':')) != NULL) {
            *c2 = '\0';
            if ((c1 = strrchr(copy, ':')) != NULL && tk__parse_i64(c1 + 1, 1, INT32_MAX, &l) == 0 &&
                tk__parse_i64(c2 + 1, 1, INT32_MAX, &c) == 0) {
                line = (int)l;
                col = (int)c;
            }
        }
    } else {
        snprintf(where, sizeof where, "%s", path);
    }
    tk_buf hint = TK_BUF_INIT;
    if (best) {
        tk__buf_printf(&hint, "did you mean \"%s\"?", best);
    } else {
        tk__buf_puts(&hint, "tk's settings are");
        for (size_t i = 0; i < NCONFIG_KEYS; i++)
            tk__buf_printf(&hint, "%s \"%s\"", i ? "," : "", config_keys[i].key);
        tk__buf_puts(&hint, " (a newer tk may know this one)");
    }
    json_t *w = json_pack("{s:s, s:s, s:i, s:i, s:s, s:s?, s:s}", "file", path, "key", key, "line", line, "column", col,
                          "message", "unknown key, ignored", "suggestion", best, "hint", hint.data ? hint.data : "");
    int rc = w && json_array_append_new(ctx->config_warnings, w) == 0 ? TK_OK : tk__err(TK_ERR_NOMEM, "out of memory");
    tk_api__log(ctx, TK_LOG_WARN, "%s: unknown key \"%s\" in tk's config (ignored)\nHINT: %s", where, key,
                hint.data ? hint.data : "");
    tk__buf_free(&hint);
    return rc;
}

/* The known settings must have their type: a wrong one ("archs": "sm_90") is an error naming the key,
 * never silently ignored. An unknown key is a warning (warn_unknown). */
static int check_config(tk_ctx *ctx, const char *path, const char *text, size_t len)
{
    const char *key;
    json_t *v;
    int rc = TK_OK;
    json_object_foreach(ctx->config, key, v) {
        size_t i = 0;
        while (i < NCONFIG_KEYS && strcmp(key, config_keys[i].key) != 0)
            i++;
        if (i == NCONFIG_KEYS)
            rc = warn_unknown(ctx, key, path, text, len);
        else if (!config_keys[i].ok(v))
            return tk__err(TK_ERR_INVALID, "%s: \"%s\" must be %s\nHINT: for example %s", path, key,
                           config_keys[i].want, config_keys[i].example);
        if (rc != TK_OK)
            return rc;
    }
    return TK_OK;
}

static int load_config(tk_ctx *ctx)
{
    char *path = tk__path_join(ctx->config_dir, "config.json");
    char *text = NULL;
    size_t n = 0;
    if (!path)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    int rc = tk__read_file(&text, &n, path, 1u << 20);
    if (!(ctx->config_warnings = json_array())) {
        free(text);
        free(path);
        return tk__err(TK_ERR_NOMEM, "out of memory");
    }
    if (rc == TK_ERR_NOT_FOUND) {
        ctx->config = json_object();
        rc = ctx->config ? TK_OK : tk__err(TK_ERR_NOMEM, "out of memory");
    } else if (rc == TK_OK) {
        json_error_t jerr;
        ctx->config = json_loadb(text, n, 0, &jerr);
        if (!json_is_object(ctx->config))
            rc = tk__err(TK_ERR_INVALID,
                         "%s: line %d, column %d: %s\nHINT: the config is a JSON object such as "
                         "{\"endpoint\": \"https://...\", \"archs\": [\"sm_90\"]}",
                         path, jerr.line, jerr.column, ctx->config ? "not a JSON object" : jerr.text);
        else
            rc = check_config(ctx, path, text, n);
    }
    free(text);
    free(path);
    return rc;
}

int tk_ctx_new(tk_ctx **out, const tk_ctx_opts *opts)
{
    if (!out)
        return tk__err(TK_ERR_INVALID, "tk_ctx_new: out is NULL");
    *out = NULL;
    tk_ctx_opts defaults = TK_CTX_OPTS_INIT;
    if (!opts)
        opts = &defaults;
    if (opts->version < 1 || opts->version > TK_CTX_OPTS_VERSION)
        return tk__err(TK_ERR_INVALID, "tk_ctx_opts version %u is not supported (this libtk knows up to %d)",
                       opts->version, TK_CTX_OPTS_VERSION);
    int rc = TK_OK;
    tk_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    ctx->magic = TK_CTX_MAGIC;
    ctx->log = opts->log;
    ctx->log_user = opts->log_user;
    ctx->progress = opts->progress;
    ctx->progress_user = opts->progress_user;

    const char *home = opts->home ? opts->home : getenv("TK_HOME");
    if (home && *home) {
        ctx->data_dir = tk__strdup(home);
        ctx->cache_dir = tk__path_join(home, "cache");
        ctx->config_dir = tk__strdup(home);
    } else {
        ctx->data_dir = xdg("XDG_DATA_HOME", ".local/share");
        ctx->cache_dir = xdg("XDG_CACHE_HOME", ".cache");
        ctx->config_dir = xdg("XDG_CONFIG_HOME", ".config");
        if (!ctx->data_dir || !ctx->cache_dir || !ctx->config_dir) {
            rc = tk__err(TK_ERR_INVALID, "cannot find a home for tk's state: HOME is not set\n"
                                         "HINT: set TK_HOME to a directory tk may use");
            goto fail;
        }
    }
    if (!ctx->data_dir || !ctx->cache_dir || !ctx->config_dir) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((rc = tk__mkdirs(ctx->data_dir, 0755)) != TK_OK || (rc = tk__mkdirs(ctx->cache_dir, 0755)) != TK_OK)
        goto fail;
    if (home && *home && (rc = tk__check_real_dir(ctx->cache_dir)) != TK_OK) /* TK_HOME/cache: never a link */
        goto fail;
    if ((rc = load_config(ctx)) != TK_OK)
        goto fail;
    {
        const char *st = getenv("TK_SELFTEST"); /* docs/selftest.md */
        if (st && *st && strcmp(st, "off") && strcmp(st, "record") && strcmp(st, "required")) {
            rc = tk__err(TK_ERR_INVALID, "TK_SELFTEST='%s' is not a self-test mode\nHINT: use off, record or required",
                         st);
            goto fail;
        }
    }

    const char *ep = opts->endpoint;
    if (!ep || !*ep)
        ep = getenv("TK_ENDPOINT");
    if ((rc = tk_api__registries_load(ctx, ep, default_endpoint)) != TK_OK)
        goto fail;
    if (ep && *ep && tk_api__registry_url_check(ctx->endpoint, "registry endpoint") != TK_OK) {
        rc = tk__err(TK_ERR_INVALID,
                     "registry endpoint '%s' is not an http, https or file URL\n"
                     "HINT: set TK_ENDPOINT to something like https://registry.example.com or file:///srv/registry",
                     ctx->endpoint);
        goto fail;
    }
    const char *token = opts->token ? opts->token : getenv("TK_TOKEN");
    if (token && *token && !(ctx->token = tk__strdup(token))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto fail;
    }
    ctx->offline = opts->offline >= 0 ? opts->offline : env_true("TK_OFFLINE");
    if ((rc = tk_state__open(&ctx->state, ctx->data_dir)) != TK_OK)
        goto fail;
    *out = ctx;
    return TK_OK;
fail:
    tk_ctx_free(ctx);
    return rc;
}

void tk_ctx_free(tk_ctx *ctx)
{
    if (!ctx || ctx->magic != TK_CTX_MAGIC)
        return;
    if (ctx->ops_free)
        ctx->ops_free(ctx->ops);
    if (ctx->jit_free)
        ctx->jit_free(ctx->jit);
    tk_hub__http_free(ctx->http);
    tk_state__close(ctx->state);
    json_decref(ctx->config);
    json_decref(ctx->config_warnings);
    free(ctx->data_dir);
    free(ctx->cache_dir);
    free(ctx->config_dir);
    free(ctx->endpoint);
    tk_api__registries_free(ctx);
    free(ctx->token);
    ctx->magic = 0;
    free(ctx);
}

const char *tk_ctx_endpoint(const tk_ctx *ctx) { return tk_api__check_ctx(ctx) == TK_OK ? ctx->endpoint : NULL; }
const char *tk_ctx_home(const tk_ctx *ctx) { return tk_api__check_ctx(ctx) == TK_OK ? ctx->data_dir : NULL; }
const char *tk_ctx_cache_dir(const tk_ctx *ctx) { return tk_api__check_ctx(ctx) == TK_OK ? ctx->cache_dir : NULL; }
const char *tk_ctx_config_dir(const tk_ctx *ctx) { return tk_api__check_ctx(ctx) == TK_OK ? ctx->config_dir : NULL; }
int tk_ctx_offline(const tk_ctx *ctx) { return tk_api__check_ctx(ctx) == TK_OK ? ctx->offline : 0; }

void tk_ctx_log(const tk_ctx *ctx, int level, const char *msg)
{
    if (ctx && ctx->magic == TK_CTX_MAGIC && msg) /* no error to set: the call cannot fail */
        tk_api__log(ctx, level, "%s", msg);
}

void tk_free(void *p) { free(p); }
