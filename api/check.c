/*
 * check.c — a package directory before it is published: the checks `tk publish` runs first (so no
 * mistake reaches a registry and burns a version), `tk check` / `tk publish --check` (those plus an
 * NVRTC compile of every kernel, writing nothing), and the local packages that `tk build ./dir`,
 * `tk run ./dir` and tk_get_kernel(ctx, "./dir") compile without a signature.
 *
 * The package directory is read and checked by manifest/local.c: the install-time checks
 * (manifest/validate.c) run on the manifest a publish would write, plus the key check
 * (manifest/schema.c) that install leaves out for forward compatibility, located in kernel.json by line
 * and column.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "hub/hub.h"
#include "manifest/manifest.h"

int tk_api__is_local_ref(const char *ref)
{
    return ref && (!strcmp(ref, ".") || !strcmp(ref, "..") || tk__has_prefix(ref, "./") || tk__has_prefix(ref, "../") ||
                   ref[0] == '/');
}

int tk_check(char **report, tk_ctx *ctx, const char *pkgdir, const tk_check_opts *opts)
{
    tk_check_opts def = TK_CHECK_OPTS_INIT;
    tk_manifest_local lp;
    tk_buf rep = TK_BUF_INIT;
    int ccs[64], rc;
    size_t nccs = 0, nunits = 0, nfailed = 0;

    if (report)
        *report = NULL;
    if ((rc = tk_api__check_ctx(ctx)) != TK_OK)
        return rc;
    if (!pkgdir)
        return tk__err(TK_ERR_INVALID, "tk_check: pkgdir is required");
    if (!opts)
        opts = &def;
    if (opts->version < 1 || opts->version > TK_CHECK_OPTS_VERSION)
        return tk__err(TK_ERR_INVALID, "tk_check: unknown opts version %u", opts->version);
    for (size_t i = 0; opts->archs && i < opts->narchs && nccs < 64; i++) {
        int cc;
        if (tk_api__parse_arch(&cc, opts->archs[i]) != 0)
            return tk__err(TK_ERR_INVALID, "bad arch '%s'\nHINT: write archs as sm_80, sm_90 or sm_90a",
                           opts->archs[i] ? opts->archs[i] : "(null)");
        ccs[nccs++] = cc;
    }
    if (!nccs) {
        ccs[nccs++] = 80;
        ccs[nccs++] = 90;
    }
    if ((rc = tk_manifest__local_load(&lp, pkgdir)) != TK_OK)
        return rc;
    tk_api__log(ctx, TK_LOG_DEBUG, "%s %s: %zu files, manifest valid", lp.name, lp.version, lp.nfiles);
    if (opts->compile) {
        rc = tk_api__compile_local(ctx, &lp, ccs, nccs, 0, opts->jobs, &rep, &nunits, &nfailed);
        if (rc == TK_ERR_COMPILE) {
            if (report)
                *report = tk__buf_steal(&rep);
            rc = tk__err(TK_ERR_COMPILE, "%s: %zu of %zu compiles failed", lp.name, nfailed, nunits);
        }
    }
    tk__buf_free(&rep);
    tk_manifest__local_free(&lp);
    return rc;
}
