/*
 * get_kernel_warm.c — what a warm tk_get_kernel costs before the driver: a new context on a home where
 * the package is installed and its binary cached (the first GPU run measured 220-530 ms a warm call on
 * an H200, target ~2 ms + the module load). No GPU needed: it runs tk_get_kernel's host part
 * (tk_api__get_kernel_host: the installed package read and verified, the plan, the binaries from
 * cache.db) for sm_90, and with a GPU also tk_get_kernel itself.
 *
 *     build/bench/get_kernel_warm [org/name] [runs]
 *
 * Prints the median, min and max of: tk_ctx_new, the host part, tk_ctx_free; and of tk_get_kernel +
 * tk_kernel_free with a device. Uses a throwaway TK_HOME; the package comes from the build's registry.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/api.h"
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

static void report(const char *what, double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp);
    printf("%-34s median %8.3f ms  min %8.3f  max %8.3f  (%d runs)\n", what, v[n / 2], v[0], v[n - 1], n);
}

int main(int argc, char **argv)
{
    const char *ref = argc > 1 ? argv[1] : "kernels-community/activation";
    int runs = argc > 2 ? atoi(argv[2]) : 30, ndev = 0;
    char home[] = "/tmp/tk-bench-warm.XXXXXX", cmd[128];
    if (runs < 1 || !mkdtemp(home))
        return 2;
    tk_ctx_opts o = TK_CTX_OPTS_INIT;
    o.home = home;
    tk_ctx *ctx = NULL;
    tk_pkg *pkg = NULL;
    /* install and compile once (the cold path) */
    double t0 = now_ms();
    if (tk_ctx_new(&ctx, &o) != TK_OK || tk_pkg_get(&pkg, ctx, ref, NULL) != TK_OK ||
        tk_api__get_kernel_host(ctx, ref, 90) != TK_OK) {
        fprintf(stderr, "get_kernel_warm: %s\n", tk_last_error());
        return 1;
    }
    printf("# %s, sm_90: install + compile (cold) %.1f ms\n", ref, now_ms() - t0);
    tk_pkg_free(pkg);
    tk_ctx_free(ctx);
    double *cn = calloc((size_t)runs, sizeof *cn), *host = calloc((size_t)runs, sizeof *host),
           *cf = calloc((size_t)runs, sizeof *cf), *dev = calloc((size_t)runs, sizeof *dev);
    int have_dev = tk_device_count(&ndev) == TK_OK && ndev > 0;
    for (int i = 0; i < runs; i++) {
        tk_ctx_opts w = TK_CTX_OPTS_INIT;
        w.home = home;
        w.offline = 1;
        t0 = now_ms();
        if (tk_ctx_new(&ctx, &w) != TK_OK)
            goto fail;
        double t1 = now_ms();
        if (tk_api__get_kernel_host(ctx, ref, 90) != TK_OK)
            goto fail;
        double t2 = now_ms();
        if (have_dev) {
            tk_kernel *k = NULL;
            if (tk_get_kernel(&k, ctx, ref, NULL) != TK_OK)
                goto fail;
            tk_kernel_free(k);
        }
        double t3 = now_ms();
        tk_ctx_free(ctx);
        cn[i] = t1 - t0;
        host[i] = t2 - t1;
        dev[i] = t3 - t2;
        cf[i] = now_ms() - t3;
    }
    report("tk_ctx_new (offline)", cn, runs);
    report("tk_get_kernel host part (sm_90)", host, runs);
    report("tk_ctx_free", cf, runs);
    if (have_dev)
        report("tk_get_kernel + tk_kernel_free", dev, runs);
    else
        printf("(no GPU: tk_get_kernel itself not timed)\n");
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", home);
    return system(cmd) == 0 ? 0 : 1;
fail:
    fprintf(stderr, "get_kernel_warm: %s\n", tk_last_error());
    return 1;
}
