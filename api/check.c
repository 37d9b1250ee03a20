/*
 * check.c — a package directory before it is published: the checks `tk publish` runs first (so no
 * mistake reaches a registry and burns a version), `tk check` / `tk publish --check` (those plus an
 * NVRTC compile of every kernel, writing nothing), and the local packages that `tk build ./dir`,
 * `tk run ./dir` and tk_get_kernel(ctx, "./dir") compile without a signature.
 *
 * The checks are the install-time ones (api/validate.c) run on the manifest a publish would write,
 * plus the key check (hub/schema.c) that install leaves out for forward compatibility. Failures are
 * located in kernel.json by line and column.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "hub/hub.h"
#include "hub/manifest.h"

int tk_api__is_local_ref(const char *ref)
{
    return ref && (!strcmp(ref, ".") || !strcmp(ref, "..") || tk__has_prefix(ref, "./") ||
                   tk__has_prefix(ref, "../") || ref[0] == '/');
}

void tk_api__local_free(tk_api_localpkg *lp)
{
    if (!lp)
        return;
    for (size_t i = 0; i < lp->nfiles; i++)
        free(lp->paths[i]);
    free(lp->paths);
    free(lp->dir);
    free(lp->spec_path);
    free(lp->name);
    free(lp->version);
    free(lp->manifest);
    memset(lp, 0, sizeof *lp);
}

/* Prefixes the current error with where `key` (top-level), or arr[idx] when arr is set, is. */
static int located(int rc, const char *text, size_t n, const char *file, const char *key, const char *arr,
                   size_t idx)
{
    char where[512];
    const char *keys[2] = {arr ? arr : key, NULL};
    size_t idxs[2] = {0, idx};
    if (tk_hub__json_where(where, sizeof where, text, n, file, keys, idxs, arr ? 2 : 1) != 0)
        return tk__err_wrap(rc, "%s", file);
    char *bar = strchr(where, '|');
    if (bar)
        *bar = '\0';
    return tk__err_wrap(rc, "%s", where);
}

/* dir/kernel.json: its text, its keys checked, parsed, with variants expanded (*origin maps each
 * expanded kernel to its entry in the text). */
static int read_spec(tk_api_localpkg *out, const char *dir, char **text, size_t *len, json_t **spec,
                     size_t **origin, size_t *nexp)
{
    json_error_t jerr;
    int rc;
    if (!tk__is_dir(dir))
        return tk__err(TK_ERR_NOT_FOUND, "'%s' is not a directory\nHINT: a package directory holds kernel.json "
                       "and its sources ('tk init NAME' makes one)", dir);
    if (!(out->dir = tk__strdup(dir)) || !(out->spec_path = tk__path_join(dir, "kernel.json")))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    if ((rc = tk__read_file(text, len, out->spec_path, TK_MANIFEST_MAX)) != TK_OK) {
        if (rc == TK_ERR_NOT_FOUND)
            rc = tk__err(TK_ERR_NOT_FOUND, "'%s' has no kernel.json\nHINT: a package directory holds kernel.json "
                         "and its sources; 'tk init NAME' makes one (docs/authoring.md)", dir);
        return rc;
    }
    if ((rc = tk_hub__schema_check(*text, *len, out->spec_path, 0)) != TK_OK)
        return rc;
    if (!(*spec = json_loadb(*text, *len, JSON_REJECT_DUPLICATES, &jerr)))
        return tk__err(TK_ERR_MANIFEST, "%s:%d:%d: %s", out->spec_path, jerr.line, jerr.column, jerr.text);
    if ((rc = tk_hub__expand_variants(*spec, origin, nexp)) != TK_OK)
        return tk__err_wrap(rc, "%s", out->spec_path);
    return TK_OK;
}

/* name, version, license, description and a non-empty kernels list; out->name and out->version. */
static int check_top(tk_api_localpkg *out, json_t *spec, const char *text, size_t len)
{
    const char *name = json_string_value(json_object_get(spec, "name"));
    const char *version = json_string_value(json_object_get(spec, "version"));
    const char *license = json_string_value(json_object_get(spec, "license"));
    json_t *desc = json_object_get(spec, "description");
    int rc;
    if (!name || tk_hub__name_check(name, NULL, NULL) != TK_OK) {
        rc = tk__err(TK_ERR_MANIFEST, "'name' must be org/name, e.g. my-org/relu (got %s)", name ? name : "nothing");
        return located(rc, text, len, out->spec_path, name ? "name" : NULL, name ? NULL : "kernels", 0);
    }
    if (!version || tk_hub__version_parse(version, NULL) != 0) {
        rc = tk__err(TK_ERR_MANIFEST, "'version' must be MAJOR.MINOR.PATCH with MAJOR >= 1 (got %s)",
                     version ? version : "nothing");
        return version ? located(rc, text, len, out->spec_path, "version", NULL, 0)
                       : tk__err_wrap(rc, "%s", out->spec_path);
    }
    if (!license || !*license)
        return tk__err(TK_ERR_MANIFEST, "%s: 'license' is missing (an SPDX id such as Apache-2.0)", out->spec_path);
    if (desc && !json_is_string(desc))
        return located(tk__err(TK_ERR_MANIFEST, "'description' must be a string"), text, len, out->spec_path,
                       "description", NULL, 0);
    json_t *ks = json_object_get(spec, "kernels");
    if (!json_is_array(ks) || json_array_size(ks) == 0)
        return tk__err(TK_ERR_MANIFEST, "%s: 'kernels' must be a non-empty array: a package declares at least "
                       "one kernel (docs/package-format.md)", out->spec_path);
    if (!(out->name = tk__strdup(name)) || !(out->version = tk__strdup(version)))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    return TK_OK;
}

/* The "files" a publish would write: every file of the directory with its sha256 and size. */
static int list_files(tk_api_localpkg *out, json_t **files)
{
    int rc = tk_hub__pkgdir_files(&out->paths, &out->nfiles, out->dir);
    if (rc != TK_OK)
        return rc;
    if (!(*files = json_array()))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < out->nfiles; i++) {
        char sha[TK_SHA256_HEX];
        int64_t size = 0;
        char *full = tk__path_join(out->dir, out->paths[i]);
        rc = full ? tk__sha256_file(sha, &size, full) : tk__err(TK_ERR_NOMEM, "out of memory");
        free(full);
        if (rc != TK_OK)
            return rc;
        json_array_append_new(*files, json_pack("{s:s, s:s, s:I}", "path", out->paths[i], "sha256", sha, "size",
                                                (json_int_t)size));
    }
    return TK_OK;
}

int tk_api__local_load(tk_api_localpkg *out, const char *dir)
{
    char *text = NULL, *dumped = NULL;
    size_t len = 0, bad = (size_t)-1, *origin = NULL, nexp = 0;
    const char *bad_in = NULL;
    json_t *spec = NULL, *files = NULL;
    int rc;

    memset(out, 0, sizeof *out);
    if (!dir || !*dir)
        return tk__err(TK_ERR_INVALID, "no package directory given");
    if ((rc = read_spec(out, dir, &text, &len, &spec, &origin, &nexp)) != TK_OK ||
        (rc = check_top(out, spec, text, len)) != TK_OK || (rc = list_files(out, &files)) != TK_OK)
        goto fail;
    json_object_set_new(spec, "format_version", json_integer(1));
    json_object_set(spec, "files", files);
    if ((rc = tk_api__validate_json(spec, &bad_in, &bad)) != TK_OK) {
        if (bad_in && !strcmp(bad_in, "kernels"))
            rc = located(rc, text, len, out->spec_path, NULL, "kernels", origin && bad < nexp ? origin[bad] : bad);
        else if (bad_in)
            rc = located(rc, text, len, out->spec_path, NULL, bad_in, bad);
        else
            rc = tk__err_wrap(rc, "%s", out->spec_path);
        goto fail;
    }
    if (!(dumped = json_dumps(spec, JSON_INDENT(2))) || !(out->manifest = tk__strdup(dumped))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto fail;
    }
    free(dumped);
    free(text);
    free(origin);
    json_decref(spec);
    json_decref(files);
    return TK_OK;
fail:
    free(origin);
    free(dumped);
    free(text);
    json_decref(spec);
    json_decref(files);
    tk_api__local_free(out);
    return rc;
}

int tk_check(char **report, tk_ctx *ctx, const char *pkgdir, const tk_check_opts *opts)
{
    tk_check_opts def = TK_CHECK_OPTS_INIT;
    tk_api_localpkg lp;
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
    if ((rc = tk_api__local_load(&lp, pkgdir)) != TK_OK)
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
    tk_api__local_free(&lp);
    return rc;
}
