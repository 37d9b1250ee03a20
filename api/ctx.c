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

/* The known settings must have their type: a wrong one ("archs": "sm_90") is an error naming the key,
 * never silently ignored. Unknown keys are left alone (a newer tk's settings). */
static int check_config(const json_t *cfg, const char *path)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)cfg, key, v) {
        const char *want = NULL, *example = NULL;
        if (!strcmp(key, "registries") && !json_is_array(v)) {
            want = "an array of registries (URLs, or {\"url\", \"packages\"})",
            example = "\"registries\": [{\"url\": \"https://private.example.com\", \"packages\": [\"acme/*\"]}, "
                      "\"https://registry.example.com\"]";
        } else if (!strcmp(key, "endpoint") && !json_is_string(v)) {
            want = "a string (a registry URL)", example = "\"endpoint\": \"https://registry.example.com\"";
        } else if (!strcmp(key, "archs")) {
            int ok = json_is_array(v);
            size_t i;
            json_t *x;
            json_array_foreach(v, i, x) ok &= json_is_string(x);
            if (!ok)
                want = "an array of arch strings", example = "\"archs\": [\"sm_80\", \"sm_90\"]";
        } else if (!strcmp(key, "ops")) {
            int ok = json_is_object(v);
            const char *k2;
            json_t *x;
            if (ok)
                json_object_foreach(v, k2, x) ok &= json_is_string(x);
            if (!ok)
                want = "an object of op name to package", example = "\"ops\": {\"silu_and_mul\": \"org/name\"}";
        } else if (!strcmp(key, "autotune") && !json_is_boolean(v)) {
            want = "true or false", example = "\"autotune\": false";
        } else if (!strcmp(key, "cache_max") && !json_is_string(v) && !(json_is_integer(v) && json_integer_value(v) >= 0)) {
            want = "a size (bytes, or a string with K/M/G)", example = "\"cache_max\": \"4G\"";
        } else if (!strcmp(key, "selftest") &&
                   !(json_is_string(v) && (!strcmp(json_string_value(v), "off") || !strcmp(json_string_value(v), "record") ||
                                           !strcmp(json_string_value(v), "required")))) {
            /* docs/selftest.md */
            want = "\"off\", \"record\" or \"required\"", example = "\"selftest\": \"required\"";
        } else if (!strcmp(key, "cpu_fallback") && !json_is_boolean(v)) {
            want = "true or false", example = "\"cpu_fallback\": true";
        }
        if (want)
            return tk__err(TK_ERR_INVALID, "%s: \"%s\" must be %s\nHINT: for example %s", path, key, want, example);
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
    if (rc == TK_ERR_NOT_FOUND) {
        ctx->config = json_object();
        rc = ctx->config ? TK_OK : tk__err(TK_ERR_NOMEM, "out of memory");
    } else if (rc == TK_OK) {
        json_error_t jerr;
        ctx->config = json_loadb(text, n, 0, &jerr);
        if (!json_is_object(ctx->config))
            rc = tk__err(TK_ERR_INVALID, "%s: line %d, column %d: %s\nHINT: the config is a JSON object such as "
                         "{\"endpoint\": \"https://...\", \"archs\": [\"sm_90\"]}", path, jerr.line, jerr.column,
                         ctx->config ? "not a JSON object" : jerr.text);
        else
            rc = check_config(ctx->config, path);
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
        rc = tk__err(TK_ERR_INVALID, "registry endpoint '%s' is not an http, https or file URL\n"
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

void tk_free(void *p) { free(p); }
