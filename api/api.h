/*
 * api.h — the context behind the public API, shared by the api/ files that implement tk.h.
 *
 * api/ sits on top of every other module: it may use hub, cache, jit and ops, and nothing below it
 * includes this header. Each file in api/ implements one part of tk.h (ctx.c: contexts, pkg.c: packages
 * and trust, kernel.c: JIT and kernels, op.c: ops).
 */
#ifndef TK_API_API_H
#define TK_API_API_H

#include <jansson.h>

#include "common/common.h"
#include "hub/hub.h"
#include "manifest/manifest.h"

#define TK_CTX_MAGIC 0x746b6374u /* "tkct" */

struct tk_state;
struct tk_hub_http;

/* A registry the context uses (api/registry.c). */
typedef struct {
    char *url;           /* no trailing slash */
    char **patterns;     /* org/name patterns it is limited to (fnmatch); none: it serves any package */
    size_t npatterns;
    const char *source;  /* "TK_ENDPOINT", "config" or "default" (static) */
} tk_api_registry;
#define TK_API_MAX_REGISTRIES 32

struct tk_ctx {
    uint32_t magic;
    char *data_dir;      /* state.db, store/ ($TK_HOME or $XDG_DATA_HOME/tk) */
    char *cache_dir;     /* cache.db, tmp/ ($TK_HOME/cache or $XDG_CACHE_HOME/tk) */
    char *config_dir;    /* config.json, keys/ ($TK_HOME or $XDG_CONFIG_HOME/tk) */
    char *endpoint;      /* the first registry's base URL, no trailing slash */
    tk_api_registry *regs; /* the registries in lookup order (at least one) */
    size_t nregs;
    int endpoint_override; /* TK_ENDPOINT or tk_ctx_opts.endpoint: regs[0] serves everything */
    char *token;         /* bearer token or NULL */
    int offline;
    json_t *config;      /* config.json (an object; empty when there is none) */
    json_t *config_warnings; /* its unknown keys: [{"file", "key", "line", "column", "suggestion", ...}] */
    tk_log_fn log;
    void *log_user;
    tk_progress_fn progress;
    void *progress_user;
    struct tk_state *state;     /* cache/state.h: state.db and the file store */
    struct tk_hub_http *http;   /* created on first network use */
    /* Lazily created per-module state, freed by tk_ctx_free through the paired function. */
    void *jit;
    void (*jit_free)(void *);
    void *ops;
    void (*ops_free)(void *);
    int cpu_threads;     /* tk_ctx_set_threads: 0 is the default */
};

/* Checks that ctx is a live context; sets an error and returns TK_ERR_INVALID otherwise. */
int tk_api__check_ctx(const tk_ctx *ctx);
/* Sends a message to the context's log callback (if any). */
void tk_api__log(const tk_ctx *ctx, int level, const char *fmt, ...) TK_PRINTF(3, 4);
/* The install hook (tk_hub_env.validate; user is the tk_ctx): the checks of a verified manifest, its
 * kernels already valid (manifest/validate.c), that need the installed packages: an op it declares
 * that an installed package of another name declares with another signature is TK_ERR_MANIFEST
 * naming both. (api/op.c) */
int tk_api__check_installed(void *user, const char *manifest, size_t len);
/* ---- packages that live in a directory (api/check.c; read by manifest/local.c) -------------------- */

/* 1 when ref names a directory rather than a package: it starts with "./", "../" or "/", or is ".". */
int tk_api__is_local_ref(const char *ref);
/* "sm_90", "sm_90a", "compute_80" or "90" -> 90 in *cc. Returns 0, or -1 for anything else. */
int tk_api__parse_arch(int *cc, const char *s);
/* Compiles every kernel of a local package for each cc (at most 64), writing nothing; each failing
 * unit adds a paragraph to report. cover = 1: a kernel whose constraints rule out every cc is also
 * compiled for its own min_cc (so each kernel compiles at least once). *nunits / *nfailed count the
 * compiles. TK_ERR_COMPILE when one failed; NVRTC missing is TK_ERR_NO_NVRTC. (api/kernel.c) */
int tk_api__compile_local(tk_ctx *ctx, const tk_manifest_local *lp, const int *ccs, size_t nccs, int cover, int jobs,
                          tk_buf *report, size_t *nunits, size_t *nfailed);

/* ---- ops that packages declare (api/op.c) --------------------------------------------------------- */

/* Refuses manifest m (about to be installed) when it declares an op that an installed package of
 * another name declares with another signature: TK_ERR_MANIFEST naming both. (api/op.c) */
int tk_api__ops_check_declared(tk_ctx *ctx, json_t *m);

/* ---- registries (api/registry.c) ---- */
/* Fills ctx->regs and ctx->endpoint from override (TK_ENDPOINT; NULL/"": none), else the config's
 * "registries" or "endpoint", else default_endpoint() (a malloc'd URL). TK_ERR_INVALID names the bad
 * config entry. */
int tk_api__registries_load(tk_ctx *ctx, const char *override, char *(*default_endpoint)(void));
void tk_api__registries_free(tk_ctx *ctx);
/* TK_OK when url is an http, https or file URL; else TK_ERR_INVALID naming `where`. */
int tk_api__registry_url_check(const char *url, const char *where);
/* The registries package `name` is looked up in, in order. */
typedef struct {
    const char *v[TK_API_MAX_REGISTRIES];
    size_t n;
    char *owned;        /* the one copy v[0] may point to */
    const char *why;    /* "TK_ENDPOINT", "named", "scoped", "installed" or "search" */
} tk_api_registries;
/* named: the registry named for the package (a project file, tk_get_opts.registry), or NULL. A
 * file:// candidate that is not a directory is TK_ERR_NETWORK (a dead registry, never skipped).
 * Release with tk_api__registries_release (also after a failure). */
int tk_api__registries_for(tk_api_registries *out, tk_ctx *ctx, const tk_hub_ref *ref, const char *named);
void tk_api__registries_release(tk_api_registries *r);

/* ---- gets (api/pkg.c), for api/project.c ---- */
/* Checks ctx and opts and opens the HTTP client (unless offline). */
int tk_api__get_prepare(tk_ctx *ctx, const tk_get_opts *opts);
/* The hub's environment for a get with opts (may be NULL) from the registries regs (NULL: offline,
 * or the context's first registry). */
void tk_api__hub_env(tk_hub_env *env, tk_ctx *ctx, const tk_get_opts *opts, const tk_api_registries *regs);
/* Wraps an installed record (taken, also on failure) into a tk_pkg. */
int tk_api__wrap_pkg(tk_pkg **out, tk_ctx *ctx, tk_state_pkg *p, int fresh);

/* The config's string value for key, or NULL. */
const char *tk_api__config_str(const tk_ctx *ctx, const char *key);
/* The context's compiled-binary cache (cache.db), opened on first use; it also holds autotune
 * results (api/kernel.c). */
struct tk_kcache;
int tk_api__kcache(struct tk_kcache **out, tk_ctx *ctx);
/* The text autotune keys its cache.db entry on (its sha256 is the key): device name, arch, op, each
 * tensor argument's dtype and shape with every dimension rounded up to a power of two, and each
 * integer scalar exactly (api/op.c). */
int tk_api__tune_text(tk_buf *b, const char *device_name, int cc, const void *call /* const tk_op_call * */);

/* ---- self-tests (api/kernel.c, api/selftest.c, api/op.c) ---------------------------------------- */

struct tk_jit_sandbox;
/* tk_get_kernel, loading the modules into a self-test sandbox's context (sb NULL: the primary one). */
int tk_api__get_kernel_in(tk_kernel **out, tk_ctx *ctx, const char *ref, const tk_kernel_opts *opts,
                          struct tk_jit_sandbox *sb);
/* The cache key (64 hex) of the compiled unit fn came from: what self-test results are recorded by. */
const char *tk_api__function_key(const tk_function *fn);
/* "org/name@commit" or "org/name@local" of a loaded kernel (borrowed). */
const char *tk_api__kernel_pkgname(const tk_kernel *k);
/* Calls each(user, kernel, key) for every kernel of ref's package (installed, or a package directory)
 * that fits compute capability cc, with the key of the unit it compiles in, as tk_get_kernel would
 * plan it (no compile, NVRTC not loaded). Errors: those of tk_pkg_info and of reading the sources. */
/* tk_get_kernel's work before the driver, for compute capability cc, with no device: the installed
 * package read and verified, the plan, every binary from the cache (or compiled and cached). What a
 * warm tk_get_kernel costs on the host (bench/get_kernel_warm.c). */
int tk_api__get_kernel_host(tk_ctx *ctx, const char *ref, int cc);
int tk_api__kernel_keys(tk_ctx *ctx, const char *ref, int cc,
                        void (*each)(void *user, const char *kernel, const char *key), void *user);

/* One kernel of a manifest as dispatch reads it (api/op.c), so a self-test binds and checks a call
 * exactly as tk_op_run would. */
typedef struct tk_api_opkernel tk_api_opkernel;
/* Reads kernel `kernel` of parsed manifest m of package pkg ("org/name"). TK_ERR_NOT_FOUND when m has
 * no such kernel. */
int tk_api__opkernel_new(tk_api_opkernel **out, json_t *m, const char *pkg, const char *kernel);
void tk_api__opkernel_free(tk_api_opkernel *ok);
/* Why it cannot serve a prepared call (const tk_op_call *) on compute capability cc, or NULL. */
const char *tk_api__opkernel_unfit(const tk_api_opkernel *ok, const void *call, int cc);
/* Binds the call's arguments to fn's params by name and launches on stream, as dispatch does. */
int tk_api__opkernel_launch(const tk_api_opkernel *ok, const tk_function *fn, const void *call, void *stream);

/* The context's self-test mode (config "selftest", $TK_SELFTEST overrides): TK_SELFTEST_OFF,
 * _RECORD (the default) or _REQUIRED (ops/selftest.h); and whether the CPU reference may stand in
 * for kernels that failed (config "cpu_fallback": true). */
int tk_api__selftest_mode(const tk_ctx *ctx);
int tk_api__cpu_fallback(const tk_ctx *ctx);
/* The recorded status (TK_ST_*) of kernel `kernel`, compiled as binary `key`, on device `device`; *detail
 * (may be NULL) receives the record's one-line summary (malloc'd) when there is one. A record left
 * "running" by a process that has ended reads TK_ST_INTERRUPTED. */
int tk_api__selftest_status(int *status, char **detail, tk_ctx *ctx, const char *key, const char *kernel, int device);
/* Self-tests one kernel (tk_op_run in "required" mode, on first use): records the result and sets
 * *status. ref is "org/name@commit" or a package directory. */
int tk_api__selftest_kernel(int *status, tk_ctx *ctx, const char *ref, const char *kernel, int device);
/* Drops the statuses dispatch looked up in this context (after new records), so the next call reads
 * them again (api/op.c). */
void tk_api__ops_forget_selftests(tk_ctx *ctx);

#endif
