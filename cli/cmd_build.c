/*
 * cmd_build.c — tk build: compile a package's kernels ahead of time into the binary cache.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"

static const char *USAGE = "tk build (ORG/NAME[@VERSION] | ./DIR) [--arch sm_80,sm_90] [--jobs N]";

static const char *HELP =
    "NAME\n"
    "    tk build - compile a kernel package ahead of time into the binary cache\n"
    "\n"
    "SYNOPSIS\n"
    "    tk build ORG/NAME[@VERSION] [--arch ARCHS] [--jobs N]\n"
    "    tk build ./DIR [--arch ARCHS] [--jobs N]\n"
    "\n"
    "DESCRIPTION\n"
    "    Installs the package if it is not installed yet (as 'tk get'), then compiles every\n"
    "    kernel it declares with NVRTC for each target architecture and stores the CUBIN (and\n"
    "    its PTX) in the compiled-binary cache, so that a later 'tk run' or tk_get_kernel() on a\n"
    "    GPU of that architecture starts warm: no compile and no NVRTC load.\n"
    "\n"
    "    No GPU is needed. Kernels whose constraints exclude an architecture (min_cc, max_cc)\n"
    "    are skipped for it. Kernels that share a source file are compiled as one unit, and\n"
    "    independent units compile in parallel. Binaries already in the cache are not rebuilt.\n"
    "\n"
    "    A path (./DIR, ../DIR, /DIR or .) names a package directory that was never published:\n"
    "    its kernel.json is checked as 'tk check' does and its kernels are compiled as they are,\n"
    "    with no signature and nothing installed (the cache labels it ORG/NAME@local).\n"
    "\n"
    "OPTIONS\n"
    "    --arch ARCHS\n"
    "        Comma-separated target architectures, e.g. sm_80,sm_90 (also sm_90a, or 90).\n"
    "        Default: the GPUs of this machine; without one, \"archs\" in config.json.\n"
    "    --jobs N, -j N\n"
    "        At most N compiles at once. Default: by CPU cores and free memory.\n"
    "    --json\n"
    "        Print {\"package\", \"archs\", \"compiled\", \"cached\", \"seconds\"}.\n"
    "\n"
    "ENVIRONMENT\n"
    "    TK_NVRTC      path of libnvrtc.so to use (else CUDA_HOME, then the loader's search)\n"
    "    TK_CACHE_MAX  size cap of the binary cache (e.g. 4G); least recently used go first\n"
    "\n"
    "EXIT STATUS\n"
    "    0 built; 2 usage; 3 package not found; 4 network; 5 signature; 7 no NVRTC or a\n"
    "    compile error (the NVRTC log names file:line).\n"
    "\n"
    "EXAMPLES\n"
    "    tk build kernels-community/activation --arch sm_80,sm_90\n"
    "    tk build kernels-community/activation@1 --arch sm_90a --jobs 4\n"
    "    tk build ./my-kernel --arch sm_90\n";

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int tk_cmd_build(tk_cli *cli, int argc, char **argv)
{
    const char *ref = NULL, *archarg = NULL;
    char *archbuf = NULL;
    const char *archs[64];
    size_t narchs = 0, compiled = 0, cached = 0;
    long jobs = 0;
    int rc, code = TK_EXIT_OK;
    double t0;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (tk_cli_is_help(a)) {
            fputs(HELP, stdout);
            return TK_EXIT_OK;
        } else if (!strcmp(a, "--arch") || !strcmp(a, "-a")) {
            if (++i >= argc)
                return tk_cli_usage(USAGE, "--arch needs a value, e.g. sm_80,sm_90");
            archarg = argv[i];
        } else if (!strncmp(a, "--arch=", 7)) {
            archarg = a + 7;
        } else if (!strcmp(a, "--jobs") || !strcmp(a, "-j") || !strncmp(a, "--jobs=", 7)) {
            const char *v = a[6] == '=' ? a + 7 : (++i < argc ? argv[i] : NULL);
            char *end = NULL;
            if (!v)
                return tk_cli_usage(USAGE, "--jobs needs a number");
            jobs = strtol(v, &end, 10);
            if (!end || *end || jobs < 1 || jobs > 256)
                return tk_cli_usage(USAGE, "--jobs wants a number from 1 to 256, not '%s'", v);
        } else if (a[0] == '-') {
            return tk_cli_unknown_option(USAGE, a);
        } else if (!ref) {
            ref = a;
        } else {
            return tk_cli_usage(USAGE, "one package at a time");
        }
    }
    if (!ref)
        return tk_cli_usage(USAGE, "which package? e.g. tk build kernels-community/activation");
    if (archarg) {
        char *save = NULL, *tok;
        if (!(archbuf = strdup(archarg)))
            return tk_cli_errorf(cli, TK_ERR_NOMEM, TK_EXIT_FAIL, "out of memory");
        for (tok = strtok_r(archbuf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            while (*tok == ' ')
                tok++;
            if (!*tok)
                continue;
            if (narchs == 64) {
                free(archbuf);
                return tk_cli_usage(USAGE, "at most 64 archs");
            }
            archs[narchs++] = tok;
        }
        if (!narchs) {
            free(archbuf);
            return tk_cli_usage(USAGE, "--arch is empty");
        }
    }

    tk_ctx *ctx = tk_cli_ctx(cli);
    if (!ctx) {
        free(archbuf);
        return TK_EXIT_FAIL;
    }
    t0 = now_s();
    if (ref[0] != '.' && ref[0] != '/') { /* a directory is compiled as it is, never installed */
        tk_pkg *pkg = NULL;
        rc = tk_pkg_info(&pkg, ctx, ref);
        if (rc == TK_ERR_NOT_FOUND) {
            tk_get_opts go = TK_GET_OPTS_INIT;
            if (!cli->json) /* --json: stdout's object only, nothing on stderr */
                tk_cli_info(cli, "installing %s", ref);
            rc = tk_pkg_get(&pkg, ctx, ref, &go);
        }
        if (rc != TK_OK) {
            free(archbuf);
            return tk_cli_fail(cli, rc, NULL);
        }
        tk_pkg_free(pkg);
    }
    tk_build_opts o = TK_BUILD_OPTS_INIT;
    o.archs = narchs ? archs : NULL;
    o.narchs = narchs;
    o.jobs = (int)jobs;
    rc = tk_build(ctx, ref, &o, &compiled, &cached);
    if (rc != TK_OK) {
        code = tk_cli_fail(cli, rc, NULL);
        goto done;
    }
    if (cli->json) {
        printf("{\"package\": ");
        tk_cli_json_str(stdout, ref);
        printf(", \"archs\": [");
        for (size_t i = 0; i < narchs; i++) {
            printf("%s", i ? ", " : "");
            tk_cli_json_str(stdout, archs[i]);
        }
        printf("], \"compiled\": %zu, \"cached\": %zu, \"seconds\": %.3f}\n", compiled, cached, now_s() - t0);
    } else {
        printf("built %s", ref);
        if (narchs) {
            printf(" for ");
            for (size_t i = 0; i < narchs; i++)
                printf("%s%s", i ? ", " : "", archs[i]);
        }
        printf(": %zu compiled, %zu already cached (%.2fs)\n", compiled, cached, now_s() - t0);
    }
done:
    free(archbuf);
    return code;
}
