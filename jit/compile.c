/*
 * compile.c — NVRTC compiles of one translation unit for one target, the content key that names
 * the result in the cache, the blob format the cache stores, and a small pool that compiles
 * independent units in parallel.
 *
 * A unit's headers are passed to NVRTC in memory under their package-relative paths, and the source
 * is named by its relative path, so NVRTC's log reads "activation.cu(12): error: ...". tk's device
 * toolkit, <tk/device.cuh> (jit/toolkit.c), is one more in-memory header of every compile, and its
 * bytes are in every key. The CUDA toolkit's include directory is passed with -I for cuda_fp16.h and
 * friends. The key never covers that path or any modification time: only the bytes, names, options,
 * target and the NVRTC version.
 *
 * TK_NVRTC_LINEINFO=1 adds -lineinfo to every compile (and to the key, so such binaries never mix
 * with the others in the cache): compute-sanitizer and profilers then name source lines.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "jit/cuda_api.h"
#include "jit/jit.h"

#define KEY_SCHEMA "tk-kcache-key-1"
#define BLOB_MAGIC "TKJB"
#define BLOB_VERSION 1u

void tk_jit__binary_free(tk_jit_binary *b)
{
    if (!b)
        return;
    free(b->cubin);
    free(b->ptx);
    for (size_t i = 0; i < b->nlowered; i++)
        free(b->lowered[i]);
    free(b->lowered);
    free(b->log);
    free(b);
}

/* ---- options ---------------------------------------------------------------------------------- */

/* Options a package may pass. Anything that writes files (-time, -pch...), adds include paths or
 * overrides the target is refused: the target is tk's choice and headers come in memory. */
static const char *const allowed_prefix[] = {
    "-std=",
    "--std=",
    "-D",
    "--define-macro=",
    "-U",
    "--undefine-macro=",
    "-ftz=",
    "--ftz=",
    "-prec-div=",
    "--prec-div=",
    "-prec-sqrt=",
    "--prec-sqrt=",
    "-fmad=",
    "--fmad=",
    "-maxrregcount=",
    "--maxrregcount=",
    "-Werror=",
    "--Werror=",
    "-diag-suppress=",
    "--diag-suppress=",
    "-diag-error=",
    "--diag-error=",
    "-diag-warn=",
    "--diag-warn=",
    "-dopt=",
    "--dopt=",
    "-builtin-move-forward=",
    "--builtin-move-forward=",
    "-builtin-initializer-list=",
    "--builtin-initializer-list=",
    "-Ofast-compile=",
    "--Ofast-compile=",
    "-Xptxas=",
    "--ptxas-options=",
    "-minimal",
    "--minimal",
};
static const char *const allowed_exact[] = {
    "-use_fast_math",
    "--use_fast_math",
    "-lineinfo",
    "--generate-line-info",
    "-G",
    "--device-debug",
    "-default-device",
    "--device-as-default-execution-space",
    "-restrict",
    "--restrict",
    "-w",
    "--disable-warnings",
    "-extra-device-vectorization",
    "--extra-device-vectorization",
    "-ewp",
    "--extensible-whole-program",
    "-device-int128",
    "--device-int128",
    "-std=c++17",
    "-std=c++20",
    "-std=c++14",
    "-std=c++11",
};

int tk_jit__option_check(const char *opt)
{
    if (!opt || !*opt)
        return tk__err(TK_ERR_MANIFEST, "empty compile option");
    for (size_t i = 0; i < sizeof allowed_exact / sizeof *allowed_exact; i++)
        if (strcmp(opt, allowed_exact[i]) == 0)
            return TK_OK;
    for (size_t i = 0; i < sizeof allowed_prefix / sizeof *allowed_prefix; i++) {
        size_t n = strlen(allowed_prefix[i]);
        if (strncmp(opt, allowed_prefix[i], n) == 0 && opt[n] != '\0')
            return TK_OK;
    }
    return tk__err(TK_ERR_MANIFEST,
                   "compile option '%s' is not allowed in a package\n"
                   "HINT: packages may pass -std=, -D, -U, -use_fast_math, -ftz=, -prec-div=, "
                   "-prec-sqrt=, -fmad=, -maxrregcount=, -lineinfo, diagnostics options and the like; "
                   "tk chooses the target and passes headers itself",
                   opt);
}

/* ---- key -------------------------------------------------------------------------------------- */

void tk_jit__target(char out[32], const tk_jit_unit *u)
{
    if (u->ptx_only)
        snprintf(out, 32, "compute_%d", u->cc);
    else
        snprintf(out, 32, "sm_%d%s", u->cc, u->arch_specific ? "a" : "");
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static int cmp_file(const void *a, const void *b)
{
    return strcmp((*(const tk_jit_file *const *)a)->path, (*(const tk_jit_file *const *)b)->path);
}

static int put_field(tk_sha256 *h, const char *tag, const char *s, const void *data, size_t len)
{
    uint8_t lenb[8];
    for (int i = 0; i < 8; i++)
        lenb[i] = (uint8_t)((uint64_t)len >> (8 * i));
    if (tk__sha256_update(h, tag, strlen(tag) + 1) != TK_OK || tk__sha256_update(h, s, strlen(s) + 1) != TK_OK ||
        tk__sha256_update(h, lenb, 8) != TK_OK || (len && tk__sha256_update(h, data, len) != TK_OK))
        return TK_ERR_INTERNAL;
    return TK_OK;
}

/* TK_NVRTC_LINEINFO set and not 0/off/false: compile with -lineinfo. */
static int lineinfo_on(void)
{
    const char *e = getenv("TK_NVRTC_LINEINFO");
    return e && *e && strcmp(e, "0") != 0 && strcasecmp(e, "off") != 0 && strcasecmp(e, "false") != 0;
}

/* Trims blanks at both ends into a fresh string. */
static char *norm_opt(const char *o)
{
    size_t n;
    while (*o == ' ' || *o == '\t' || *o == '\n')
        o++;
    n = strlen(o);
    while (n && (o[n - 1] == ' ' || o[n - 1] == '\t' || o[n - 1] == '\n'))
        n--;
    return tk__strndup(o, n);
}

int tk_jit__key(char out[TK_SHA256_HEX], const tk_jit_unit *u, const char *nvrtc_version)
{
    tk_sha256 *h = NULL;
    const char **names = NULL;
    const tk_jit_file **hdrs = NULL;
    const tk_jit_file tk = u && u->toolkit ? *u->toolkit : tk_jit__device_toolkit();
    char target[32];
    int rc = TK_ERR_NOMEM;

    out[0] = '\0';
    if (!u || !u->src_path || !u->src || !nvrtc_version)
        return tk__err(TK_ERR_INVALID, "tk_jit__key: missing source or NVRTC version");
    if (tk__sha256_new(&h) != TK_OK)
        goto fail;
    names = calloc(u->nnames + 1, sizeof *names);
    hdrs = calloc(u->nheaders + 1, sizeof *hdrs);
    if (!names || !hdrs)
        goto fail;
    for (size_t i = 0; i < u->nnames; i++)
        names[i] = u->names[i];
    qsort(names, u->nnames, sizeof *names, cmp_str);
    for (size_t i = 0; i < u->nheaders; i++)
        hdrs[i] = &u->headers[i];
    qsort(hdrs, u->nheaders, sizeof *hdrs, cmp_file);

    rc = TK_ERR_INTERNAL;
    if (tk__sha256_update(h, KEY_SCHEMA "\n", sizeof KEY_SCHEMA) != TK_OK ||
        put_field(h, "src", u->src_path, u->src, u->src_len) != TK_OK)
        goto fail;
    for (size_t i = 0; i < u->nheaders; i++)
        if (put_field(h, "hdr", hdrs[i]->path, hdrs[i]->data, hdrs[i]->len) != TK_OK)
            goto fail;
    if (put_field(h, "toolkit", tk.path, tk.data, tk.len) != TK_OK)
        goto fail;
    for (size_t i = 0; i < u->nnames; i++)
        if (put_field(h, "name", names[i], NULL, 0) != TK_OK)
            goto fail;
    for (size_t i = 0; i < u->noptions; i++) {
        char *o = norm_opt(u->options[i]);
        int r;
        if (!o) {
            rc = TK_ERR_NOMEM;
            goto fail;
        }
        r = *o ? put_field(h, "opt", o, NULL, 0) : TK_OK;
        free(o);
        if (r != TK_OK)
            goto fail;
    }
    if (lineinfo_on() && put_field(h, "opt", "-lineinfo", NULL, 0) != TK_OK)
        goto fail;
    tk_jit__target(target, u);
    if (put_field(h, "target", target, NULL, 0) != TK_OK || put_field(h, "nvrtc", nvrtc_version, NULL, 0) != TK_OK ||
        tk__sha256_final_hex(h, out) != TK_OK)
        goto fail;
    rc = TK_OK;
fail:
    if (rc == TK_ERR_NOMEM)
        tk__err(rc, "out of memory computing a cache key");
    else if (rc != TK_OK)
        tk__err(rc, "hashing a cache key failed");
    tk__sha256_free(h);
    free(names);
    free(hdrs);
    return rc;
}

/* ---- compile ---------------------------------------------------------------------------------- */

static int nv_fail(int code, const tk_nvrtc_api *nv, nvrtcResult r, const char *what, const tk_jit_unit *u)
{
    char target[32];
    tk_jit__target(target, u);
    return tk__err(code, "NVRTC %s failed for %s (%s): %s", what, u->src_path, target,
                   nv->nvrtcGetErrorString ? nv->nvrtcGetErrorString(r) : "?");
}

static char *program_log(const tk_nvrtc_api *nv, nvrtcProgram p)
{
    size_t n = 0;
    char *log;
    if (nv->nvrtcGetProgramLogSize(p, &n) != NVRTC_SUCCESS || n <= 1)
        return NULL;
    log = malloc(n + 1);
    if (!log)
        return NULL;
    if (nv->nvrtcGetProgramLog(p, log) != NVRTC_SUCCESS) {
        free(log);
        return NULL;
    }
    log[n] = '\0';
    return log;
}

/* The unit's header, option and target checks that need no NVRTC call beyond its arch list. */
static int check_unit(const tk_jit_unit *u, const char *target)
{
    int rc, supported = 0, archs[64];
    size_t narchs = 0;
    if (tk_jit__nvrtc_archs(archs, 64, &narchs) == TK_OK && narchs) {
        for (size_t i = 0; i < narchs; i++)
            supported |= archs[i] == u->cc;
        if (!supported)
            return tk__err(TK_ERR_UNSUPPORTED,
                           "this NVRTC cannot compile for %s (it supports sm_%d to sm_%d)\n"
                           "HINT: install a newer CUDA toolkit's NVRTC for this GPU, or set TK_NVRTC",
                           target, archs[0], archs[narchs - 1]);
    }
    for (size_t i = 0; i < u->noptions; i++)
        if ((rc = tk_jit__option_check(u->options[i])) != TK_OK)
            return rc;
    for (size_t i = 0; i < u->nheaders; i++)
        if (strcmp(u->headers[i].path, TK_JIT_DEVICE_TOOLKIT_PATH) == 0)
            return tk__err(TK_ERR_MANIFEST,
                           "%s: the package's file '%s' would hide tk's device toolkit\n"
                           "HINT: rename the file; <" TK_JIT_DEVICE_TOOLKIT_PATH "> is tk's own header "
                           "(docs/device-toolkit.md)",
                           u->src_path, u->headers[i].path);
    return TK_OK;
}

/* What nvrtcCreateProgram and nvrtcCompileProgram take for a unit: a NUL-terminated source, the
 * headers in memory (the package's, then the toolkit) and the options (the package's, then tk's). */
typedef struct {
    char *src;
    const char **hsrc, **hname;
    int nheaders;
    const char **opts;
    int nopts;
    char *archopt, *incopt;
} nv_args;

static void args_free(nv_args *a)
{
    free(a->src);
    free(a->hsrc);
    free(a->hname);
    free(a->opts);
    free(a->archopt);
    free(a->incopt);
}

static int args_make(nv_args *a, const tk_jit_unit *u, const char *target)
{
    tk_jit_file tk = u->toolkit ? *u->toolkit : tk_jit__device_toolkit();
    memset(a, 0, sizeof *a);
    /* NVRTC wants a NUL-terminated source; ours may not be */
    a->src = tk__strndup(u->src, u->src_len);
    a->hsrc = calloc(u->nheaders + 1, sizeof *a->hsrc);
    a->hname = calloc(u->nheaders + 1, sizeof *a->hname);
    a->opts = calloc(u->noptions + 5, sizeof *a->opts);
    a->archopt = tk__fmt("--gpu-architecture=%s", target);
    if (!a->src || !a->hsrc || !a->hname || !a->opts || !a->archopt)
        return TK_ERR_NOMEM;
    for (size_t i = 0; i < u->nheaders; i++) {
        /* the data of the store's files is NUL-terminated by tk__read_file */
        a->hsrc[a->nheaders] = u->headers[i].data;
        a->hname[a->nheaders++] = u->headers[i].path;
    }
    a->hsrc[a->nheaders] = tk.data;
    a->hname[a->nheaders++] = tk.path;
    for (size_t i = 0; i < u->noptions; i++)
        a->opts[a->nopts++] = u->options[i];
    a->opts[a->nopts++] = a->archopt;
    a->opts[a->nopts++] = "-default-device";
    if (lineinfo_on())
        a->opts[a->nopts++] = "-lineinfo";
    if (tk_jit__cuda_include_dir()) {
        if (!(a->incopt = tk__fmt("-I%s", tk_jit__cuda_include_dir())))
            return TK_ERR_NOMEM;
        a->opts[a->nopts++] = a->incopt;
    }
    return TK_OK;
}

/* Creates the program and registers the unit's name expressions. *prog stays NULL on failure. */
static int program_create(nvrtcProgram *prog, const tk_nvrtc_api *nv, const nv_args *a, const tk_jit_unit *u)
{
    nvrtcResult r = nv->nvrtcCreateProgram(prog, a->src, u->src_path, a->nheaders, a->hsrc, a->hname);
    if (r != NVRTC_SUCCESS) {
        *prog = NULL;
        return nv_fail(TK_ERR_COMPILE, nv, r, "nvrtcCreateProgram", u);
    }
    for (size_t i = 0; i < u->nnames; i++) {
        r = nv->nvrtcAddNameExpression(*prog, u->names[i]);
        if (r != NVRTC_SUCCESS)
            return tk__err(TK_ERR_COMPILE, "NVRTC rejected the name expression '%s' of %s: %s", u->names[i],
                           u->src_path, nv->nvrtcGetErrorString(r));
    }
    return TK_OK;
}

/* Compiles; b->log receives NVRTC's log (warnings too) either way. */
static int program_compile(tk_jit_binary *b, const tk_nvrtc_api *nv, nvrtcProgram prog, const nv_args *a,
                           const tk_jit_unit *u, const char *target)
{
    nvrtcResult r = nv->nvrtcCompileProgram(prog, a->nopts, a->opts);
    b->log = program_log(nv, prog);
    if (r == NVRTC_SUCCESS)
        return TK_OK;
    if (r == NVRTC_ERROR_COMPILATION)
        return tk__err(TK_ERR_COMPILE, "compiling %s for %s failed:\n%s", u->src_path, target,
                       b->log ? b->log : "(NVRTC gave no log)");
    return tk__err(TK_ERR_COMPILE, "NVRTC could not compile %s for %s: %s%s%s", u->src_path, target,
                   nv->nvrtcGetErrorString(r), b->log ? "\n" : "", b->log ? b->log : "");
}

static int take_cubin(tk_jit_binary *b, const tk_nvrtc_api *nv, nvrtcProgram prog, const tk_jit_unit *u,
                      const char *target)
{
    size_t n = 0;
    nvrtcResult r;
    if ((r = nv->nvrtcGetCUBINSize(prog, &n)) != NVRTC_SUCCESS)
        return nv_fail(TK_ERR_COMPILE, nv, r, "nvrtcGetCUBINSize", u);
    if (n == 0)
        return tk__err(TK_ERR_COMPILE, "NVRTC produced no CUBIN for %s (%s)", u->src_path, target);
    if (!(b->cubin = malloc(n)))
        return TK_ERR_NOMEM;
    if ((r = nv->nvrtcGetCUBIN(prog, (char *)b->cubin)) != NVRTC_SUCCESS)
        return nv_fail(TK_ERR_COMPILE, nv, r, "nvrtcGetCUBIN", u);
    b->cubin_len = n;
    return TK_OK;
}

/* NVRTC keeps the PTX of an sm_XY compile too; it is the fallback for newer GPUs (and the whole
 * result of a ptx_only unit, where it must exist). */
static int take_ptx(tk_jit_binary *b, const tk_nvrtc_api *nv, nvrtcProgram prog, const tk_jit_unit *u,
                    const char *target)
{
    size_t n = 0;
    nvrtcResult r;
    if (nv->nvrtcGetPTXSize(prog, &n) != NVRTC_SUCCESS || n <= 1) {
        if (u->ptx_only)
            return tk__err(TK_ERR_COMPILE, "NVRTC produced no PTX for %s (%s)", u->src_path, target);
        return TK_OK;
    }
    if (!(b->ptx = malloc(n + 1)))
        return TK_ERR_NOMEM;
    if ((r = nv->nvrtcGetPTX(prog, b->ptx)) != NVRTC_SUCCESS)
        return nv_fail(TK_ERR_COMPILE, nv, r, "nvrtcGetPTX", u);
    b->ptx[n] = '\0';
    b->ptx_len = strlen(b->ptx);
    return TK_OK;
}

/* The mangled name of every name expression, in the unit's order. */
static int take_lowered(tk_jit_binary *b, const tk_nvrtc_api *nv, nvrtcProgram prog, const tk_jit_unit *u)
{
    if (!u->nnames)
        return TK_OK;
    if (!(b->lowered = calloc(u->nnames, sizeof *b->lowered)))
        return TK_ERR_NOMEM;
    for (size_t i = 0; i < u->nnames; i++) {
        const char *low = NULL;
        nvrtcResult r = nv->nvrtcGetLoweredName(prog, u->names[i], &low);
        if (r != NVRTC_SUCCESS || !low)
            return tk__err(TK_ERR_COMPILE,
                           "%s: the kernel '%s' was not found after compiling (%s)\n"
                           "HINT: the manifest's symbol must name a __global__ function or template "
                           "instance of the source, e.g. 'ns::kern<float>'",
                           u->src_path, u->names[i], nv->nvrtcGetErrorString(r));
        if (!(b->lowered[i] = tk__strdup(low)))
            return TK_ERR_NOMEM;
        b->nlowered = i + 1;
    }
    return TK_OK;
}

int tk_jit__compile(tk_jit_binary **out, const tk_jit_unit *u)
{
    const tk_nvrtc_api *nv;
    nvrtcProgram prog = NULL;
    tk_jit_binary *b = NULL;
    nv_args a = {0};
    char target[32];
    int rc;

    *out = NULL;
    if (!u || !u->src_path || !u->src)
        return tk__err(TK_ERR_INVALID, "tk_jit__compile: no source");
    if ((rc = tk_jit__nvrtc_load()) != TK_OK)
        return rc;
    nv = tk_jit__nvrtc();
    tk_jit__target(target, u);
    if ((rc = check_unit(u, target)) != TK_OK)
        return rc;

    rc = TK_ERR_NOMEM;
    if (!(b = calloc(1, sizeof *b)) || (rc = args_make(&a, u, target)) != TK_OK ||
        (rc = program_create(&prog, nv, &a, u)) != TK_OK ||
        (rc = program_compile(b, nv, prog, &a, u, target)) != TK_OK ||
        (!u->ptx_only && (rc = take_cubin(b, nv, prog, u, target)) != TK_OK) ||
        (rc = take_ptx(b, nv, prog, u, target)) != TK_OK || (rc = take_lowered(b, nv, prog, u)) != TK_OK)
        goto fail;
    *out = b;
    b = NULL;
fail:
    if (rc == TK_ERR_NOMEM)
        tk__err(rc, "out of memory compiling %s", u->src_path);
    if (prog)
        nv->nvrtcDestroyProgram(&prog);
    tk_jit__binary_free(b);
    args_free(&a);
    return rc;
}

/* ---- parallel compiles ------------------------------------------------------------------------ */

int tk_jit__default_jobs(void)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    long pages = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    long jobs = cores > 0 ? cores : 1;
    if (pages > 0 && psz > 0) {
        /* an NVRTC compile of a templated kernel peaks at a few hundred MiB */
        long bymem = (long)(((int64_t)pages * psz) / ((int64_t)512 << 20));
        if (bymem < jobs)
            jobs = bymem;
    }
    if (jobs < 1)
        jobs = 1;
    if (jobs > 64)
        jobs = 64;
    return (int)jobs;
}

typedef struct {
    pthread_mutex_t mu;
    size_t next, n, ndone;
    const tk_jit_unit *units;
    tk_jit_binary **outs;
    int *status;
    char **errmsg;
    tk_jit_done_fn done;
    void *user;
} pool;

static void *worker(void *arg)
{
    pool *p = arg;
    for (;;) {
        size_t i;
        pthread_mutex_lock(&p->mu);
        i = p->next++;
        if (p->done && i < p->n)
            p->done(p->user, i, 1, TK_OK, p->ndone, p->next < p->n ? p->next - p->ndone : p->n - p->ndone, 0);
        pthread_mutex_unlock(&p->mu);
        if (i >= p->n)
            break;
        double t0 = tk__now_ms();
        p->status[i] = tk_jit__compile(&p->outs[i], &p->units[i]);
        if (p->status[i] != TK_OK && p->errmsg)
            p->errmsg[i] = tk__strdup(tk_last_error());
        if (p->done) {
            pthread_mutex_lock(&p->mu);
            p->ndone++;
            p->done(p->user, i, 0, p->status[i], p->ndone, (p->next < p->n ? p->next : p->n) - p->ndone,
                    (tk__now_ms() - t0) / 1000.0);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

int tk_jit__compile_many(tk_jit_binary **outs, int *status, char **errmsg, const tk_jit_unit *units, size_t n, int jobs)
{
    return tk_jit__compile_many_cb(outs, status, errmsg, units, n, jobs, NULL, NULL);
}

int tk_jit__compile_many_cb(tk_jit_binary **outs, int *status, char **errmsg, const tk_jit_unit *units, size_t n,
                            int jobs, tk_jit_done_fn done, void *user)
{
    pool p;
    pthread_t th[64];
    size_t nth = 0, want;
    int rc;

    for (size_t i = 0; i < n; i++) {
        outs[i] = NULL;
        status[i] = TK_ERR_INTERNAL;
        if (errmsg)
            errmsg[i] = NULL;
    }
    if (n == 0)
        return TK_OK;
    /* load once on this thread, so a missing NVRTC is one clear error */
    if ((rc = tk_jit__nvrtc_load()) != TK_OK) {
        for (size_t i = 0; i < n; i++) {
            status[i] = rc;
            if (errmsg)
                errmsg[i] = tk__strdup(tk_last_error());
        }
        return rc;
    }
    if (jobs <= 0)
        jobs = tk_jit__default_jobs();
    want = (size_t)jobs < n ? (size_t)jobs : n;
    if (want > 64)
        want = 64;
    memset(&p, 0, sizeof p);
    pthread_mutex_init(&p.mu, NULL);
    p.n = n;
    p.units = units;
    p.outs = outs;
    p.status = status;
    p.errmsg = errmsg;
    p.done = done;
    p.user = user;
    if (want > 1)
        for (; nth < want; nth++)
            if (pthread_create(&th[nth], NULL, worker, &p) != 0)
                break;
    worker(&p); /* the calling thread works too (and alone when threads cannot start) */
    for (size_t i = 0; i < nth; i++)
        pthread_join(th[i], NULL);
    pthread_mutex_destroy(&p.mu);
    for (size_t i = 0; i < n; i++)
        if (status[i] != TK_OK) {
            if (errmsg && errmsg[i])
                return tk__err(status[i], "%s", errmsg[i]);
            return tk__err(status[i], "compiling %s failed", units[i].src_path);
        }
    return TK_OK;
}

/* ---- blobs ------------------------------------------------------------------------------------ */

static int put_u32(tk_buf *b, uint32_t v)
{
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    return tk__buf_append(b, x, 4);
}

static int put_bytes(tk_buf *b, const void *p, size_t n)
{
    uint64_t v = n;
    uint8_t x[8];
    for (int i = 0; i < 8; i++)
        x[i] = (uint8_t)(v >> (8 * i));
    if (tk__buf_append(b, x, 8) != TK_OK)
        return TK_ERR_NOMEM;
    return n ? tk__buf_append(b, p, n) : TK_OK;
}

int tk_jit__binary_pack(uint8_t **out, size_t *len, const tk_jit_binary *bin)
{
    tk_buf b = TK_BUF_INIT;
    *out = NULL;
    *len = 0;
    if (tk__buf_append(&b, BLOB_MAGIC, 4) != TK_OK || put_u32(&b, BLOB_VERSION) != TK_OK ||
        put_bytes(&b, bin->cubin, bin->cubin_len) != TK_OK || put_bytes(&b, bin->ptx, bin->ptx_len) != TK_OK ||
        put_u32(&b, (uint32_t)bin->nlowered) != TK_OK)
        goto fail;
    for (size_t i = 0; i < bin->nlowered; i++)
        if (put_bytes(&b, bin->lowered[i], strlen(bin->lowered[i])) != TK_OK)
            goto fail;
    *len = b.len;
    *out = (uint8_t *)tk__buf_steal(&b);
    return TK_OK;
fail:
    tk__buf_free(&b);
    return tk__err(TK_ERR_NOMEM, "out of memory packing a compiled binary");
}

typedef struct {
    const uint8_t *p;
    size_t left;
} rd;

static int get_u64(rd *r, uint64_t *v)
{
    if (r->left < 8)
        return -1;
    *v = 0;
    for (int i = 0; i < 8; i++)
        *v |= (uint64_t)r->p[i] << (8 * i);
    r->p += 8;
    r->left -= 8;
    return 0;
}

static int get_u32(rd *r, uint32_t *v)
{
    if (r->left < 4)
        return -1;
    *v = (uint32_t)r->p[0] | (uint32_t)r->p[1] << 8 | (uint32_t)r->p[2] << 16 | (uint32_t)r->p[3] << 24;
    r->p += 4;
    r->left -= 4;
    return 0;
}

/* A length-prefixed field, copied with a trailing NUL (NULL for an empty field unless keep_empty). */
static int get_field(rd *r, uint8_t **out, size_t *len, int keep_empty)
{
    uint64_t n;
    *out = NULL;
    *len = 0;
    if (get_u64(r, &n) != 0 || n > r->left)
        return -1;
    if (n || keep_empty) {
        if (!(*out = malloc((size_t)n + 1)))
            return -2;
        memcpy(*out, r->p, (size_t)n);
        (*out)[n] = 0;
    }
    *len = (size_t)n;
    r->p += n;
    r->left -= (size_t)n;
    return 0;
}

int tk_jit__binary_unpack(tk_jit_binary **out, const uint8_t *p, size_t len)
{
    tk_jit_binary *b = NULL;
    rd r = {p, len};
    uint32_t ver, nl;
    int e = -1;

    *out = NULL;
    if (len < 8 || memcmp(p, BLOB_MAGIC, 4) != 0)
        goto fail;
    r.p += 4;
    r.left -= 4;
    if (get_u32(&r, &ver) != 0 || ver != BLOB_VERSION)
        goto fail;
    if (!(b = calloc(1, sizeof *b))) {
        e = -2;
        goto fail;
    }
    if ((e = get_field(&r, &b->cubin, &b->cubin_len, 0)) != 0 ||
        (e = get_field(&r, (uint8_t **)&b->ptx, &b->ptx_len, 0)) != 0)
        goto fail;
    e = -1;
    if (get_u32(&r, &nl) != 0 || nl > r.left / 8)
        goto fail;
    if (nl && !(b->lowered = calloc(nl, sizeof *b->lowered))) {
        e = -2;
        goto fail;
    }
    for (uint32_t i = 0; i < nl; i++) {
        size_t l;
        if ((e = get_field(&r, (uint8_t **)&b->lowered[i], &l, 1)) != 0)
            goto fail;
        b->nlowered = i + 1;
    }
    if (r.left != 0 || (!b->cubin && !b->ptx)) {
        e = -1;
        goto fail;
    }
    *out = b;
    return TK_OK;
fail:
    tk_jit__binary_free(b);
    if (e == -2)
        return tk__err(TK_ERR_NOMEM, "out of memory reading a compiled binary");
    return tk__err(TK_ERR_CACHE, "malformed compiled binary in the cache");
}
