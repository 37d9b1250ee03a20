/*
 * jit_build.c — cold NVRTC compile vs cache hit for a package, in one process, through the public
 * API (tk_build). Usage: build/bench/jit_build [org/name] [arch] [warm-runs]
 * Uses a throwaway TK_HOME; the package comes from the build's default registry.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tk.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    const char *ref = argc > 1 ? argv[1] : "kernels-community/activation";
    const char *arch = argc > 2 ? argv[2] : "sm_90";
    int runs = argc > 3 ? atoi(argv[3]) : 50;
    char home[] = "/tmp/tk-bench-jit.XXXXXX";
    if (!mkdtemp(home))
        return 1;
    tk_ctx_opts o = TK_CTX_OPTS_INIT;
    o.home = home;
    tk_ctx *ctx = NULL;
    tk_pkg *pkg = NULL;
    if (tk_ctx_new(&ctx, &o) != TK_OK || tk_pkg_get(&pkg, ctx, ref, NULL) != TK_OK) {
        fprintf(stderr, "bench: %s\n", tk_last_error());
        return 1;
    }
    tk_build_opts bo = TK_BUILD_OPTS_INIT;
    const char *archs[1] = {arch};
    bo.archs = archs;
    bo.narchs = 1;
    size_t compiled = 0, cached = 0;
    double t0 = now_ms();
    if (tk_build(ctx, ref, &bo, &compiled, &cached) != TK_OK) {
        fprintf(stderr, "bench: %s\n", tk_last_error());
        return 1;
    }
    double cold = now_ms() - t0;
    double *warm = calloc((size_t)runs, sizeof *warm);
    for (int i = 0; i < runs; i++) {
        t0 = now_ms();
        if (tk_build(ctx, ref, &bo, &compiled, &cached) != TK_OK || compiled != 0) {
            fprintf(stderr, "bench: warm build compiled or failed: %s\n", tk_last_error());
            return 1;
        }
        warm[i] = now_ms() - t0;
    }
    qsort(warm, (size_t)runs, sizeof *warm, cmp);
    double med = warm[runs / 2];
    printf("%s %s: cold compile %.1f ms (one NVRTC unit); cache hit median %.3f ms over %d runs; ratio %.0fx\n", ref,
           arch, cold, med, runs, cold / med);
    free(warm);
    tk_pkg_free(pkg);
    tk_ctx_free(ctx);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", home);
    return system(cmd) == 0 ? 0 : 1;
}
