/*
 * build.h — api/'s compile pipeline, shared by kernel.c (tk_get_kernel) and build.c (tk_build, tk check's
 * compile, the dispatcher's cache keys): a package's sources, its compile plan (kernels grouped into
 * NVRTC units with their cache keys) and building the plan (cache hits, else parallel compiles).
 * Internal to api/.
 */
#ifndef TK_API_BUILD_H
#define TK_API_BUILD_H

#include "api/api.h"
#include "cache/kcache.h"
#include "jit/jit.h"

/* A package's sources: every file in memory and its manifest's kernels, parsed. */
typedef struct {
    char *pkgname;         /* "org/name@commit" */
    tk_jit_file *files;    /* every file of the package, data NUL-terminated */
    size_t nfiles;
    tk_manifest_kernels mk; /* compile.options and the kernels, parsed */
    char **copts;           /* mk's */
    size_t ncopts;
    tk_manifest_kernel *k;
    size_t nk;
} tk_api_pkgsrc;

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
} tk_api_cunit;

typedef struct {
    tk_api_cunit *u;
    size_t n;
} tk_api_plan; /* the units of one package for one arch */

void tk_api__pkgsrc_free(tk_api_pkgsrc *s);
void tk_api__plan_free(tk_api_plan *p);

/* Fills every unit's binary: from the cache (verified), else compiled, `jobs` at a time (0: the
 * default), and stored; counts in *ncompiled / *ncached when not NULL. */
int tk_api__plan_build(tk_api_plan *p, tk_ctx *ctx, const tk_api_pkgsrc *s, int jobs, size_t *ncompiled,
                       size_t *ncached);

/* The host part of tk_get_kernel, everything before the driver: the package's sources (installed and
 * verified), the plan for compute capability cc, and every binary built or taken from the cache. */
int tk_api__kernel_host(tk_api_pkgsrc *s, char **manifest, tk_api_plan *p, struct tk_kcache **kc, tk_ctx *ctx,
                        const char *ref, const tk_kernel_opts *opts, const tk_device_info *info, int cc);

#endif
