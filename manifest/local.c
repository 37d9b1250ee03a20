/*
 * local.c — a package directory read as `tk publish` reads it: its files (regular files below it,
 * sorted, with their digests) and its kernel.json with every check a publish runs and install repeats,
 * located in kernel.json by line and column. `tk check`, `tk publish`, and the local packages that
 * `tk build ./dir`, `tk run ./dir` and tk_get_kernel(ctx, "./dir") compile without a signature read
 * package directories through here.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/common.h"
#include "manifest/manifest.h"

#define MAX_PKG_FILES 10000

typedef struct {
    char **paths;
    size_t n, cap;
} filelist;

static void filelist_free(filelist *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->paths[i]);
    free(l->paths);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Collects the package's files: regular files below dir, relative, no dotfiles, not kernel.json. */
static int walk(filelist *l, const char *root, const char *rel)
{
    char *dir = rel[0] ? tk__path_join(root, rel) : tk__strdup(root);
    if (!dir)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    DIR *d = opendir(dir);
    int rc = TK_OK;
    if (!d) {
        rc = tk__err_sys("cannot read the package directory", dir);
        free(dir);
        return rc;
    }
    struct dirent *e;
    while (rc == TK_OK && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (!rel[0] && strcmp(e->d_name, "kernel.json") == 0)
            continue;
        char *r = rel[0] ? tk__fmt("%s/%s", rel, e->d_name) : tk__strdup(e->d_name);
        char *full = r ? tk__path_join(root, r) : NULL;
        struct stat st;
        if (!r || !full) {
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
        } else if (lstat(full, &st) != 0) {
            rc = tk__err_sys("cannot stat", full);
        } else if (S_ISDIR(st.st_mode)) {
            rc = walk(l, root, r);
        } else if (!S_ISREG(st.st_mode)) {
            rc = tk__err(TK_ERR_INVALID,
                         "'%s' is not a regular file; packages hold only regular files "
                         "(no symlinks or devices)",
                         full);
        } else if (tk_manifest__path_check(r) != 0) {
            rc = tk__err(TK_ERR_INVALID, "'%s' is not a usable file name in a package", r);
        } else if (l->n >= MAX_PKG_FILES) {
            rc = tk__err(TK_ERR_INVALID, "more than %d files in the package", MAX_PKG_FILES);
        } else {
            if (l->n == l->cap) {
                l->cap = l->cap ? 2 * l->cap : 16;
                char **np = realloc(l->paths, l->cap * sizeof *np);
                if (!np) {
                    rc = tk__err(TK_ERR_NOMEM, "out of memory");
                    free(r);
                    free(full);
                    break;
                }
                l->paths = np;
            }
            l->paths[l->n++] = r;
            r = NULL;
        }
        free(r);
        free(full);
    }
    closedir(d);
    free(dir);
    return rc;
}

int tk_manifest__dir_files(char ***paths, size_t *n, const char *pkgdir)
{
    filelist l = {0};
    int rc = walk(&l, pkgdir, "");
    *paths = NULL;
    *n = 0;
    if (rc != TK_OK) {
        filelist_free(&l);
        return rc;
    }
    if (l.n)
        qsort(l.paths, l.n, sizeof *l.paths, cmp_str);
    *paths = l.paths;
    *n = l.n;
    return TK_OK;
}

int tk_manifest__files_json(json_t **out, const char *dir, const char *const *paths, size_t n)
{
    int rc = TK_OK;
    if (!(*out = json_array()))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n && rc == TK_OK; i++) {
        char sha[TK_SHA256_HEX];
        int64_t size = 0;
        char *full = tk__path_join(dir, paths[i]);
        if (!full)
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
        else if ((rc = tk__sha256_file(sha, &size, full)) == TK_OK &&
                 json_array_append_new(*out, json_pack("{s:s, s:s, s:I}", "path", paths[i], "sha256", sha, "size",
                                                       (json_int_t)size)) != 0)
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
        free(full);
    }
    return rc;
}

void tk_manifest__local_free(tk_manifest_local *lp)
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
static int located(int rc, const char *text, size_t n, const char *file, const char *key, const char *arr, size_t idx)
{
    char where[512];
    const char *keys[2] = {arr ? arr : key, NULL};
    size_t idxs[2] = {0, idx};
    if (tk_manifest__json_where(where, sizeof where, text, n, file, keys, idxs, arr ? 2 : 1) != 0)
        return tk__err_wrap(rc, "%s", file);
    char *bar = strchr(where, '|');
    if (bar)
        *bar = '\0';
    return tk__err_wrap(rc, "%s", where);
}

/* dir/kernel.json: its text, its keys checked, parsed, with variants expanded (*origin maps each
 * expanded kernel to its entry in the text). */
static int read_spec(tk_manifest_local *out, const char *dir, char **text, size_t *len, json_t **spec, size_t **origin,
                     size_t *nexp)
{
    json_error_t jerr;
    int rc;
    if (!tk__is_dir(dir))
        return tk__err(TK_ERR_NOT_FOUND,
                       "'%s' is not a directory\nHINT: a package directory holds kernel.json "
                       "and its sources ('tk init NAME' makes one)",
                       dir);
    if (!(out->dir = tk__strdup(dir)) || !(out->spec_path = tk__path_join(dir, "kernel.json")))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    if ((rc = tk__read_file(text, len, out->spec_path, TK_MANIFEST_MAX)) != TK_OK) {
        if (rc == TK_ERR_NOT_FOUND)
            rc = tk__err(TK_ERR_NOT_FOUND,
                         "'%s' has no kernel.json\nHINT: a package directory holds kernel.json "
                         "and its sources; 'tk init NAME' makes one (docs/authoring.md)",
                         dir);
        return rc;
    }
    if ((rc = tk_manifest__schema_check(*text, *len, out->spec_path, 0)) != TK_OK)
        return rc;
    if (!(*spec = json_loadb(*text, *len, JSON_REJECT_DUPLICATES, &jerr)))
        return tk__err(TK_ERR_MANIFEST, "%s:%d:%d: %s", out->spec_path, jerr.line, jerr.column, jerr.text);
    if ((rc = tk_manifest__expand_variants(*spec, origin, nexp)) != TK_OK)
        return tk__err_wrap(rc, "%s", out->spec_path);
    return TK_OK;
}

/* name, version, license, description and a non-empty kernels list; out->name and out->version. */
static int check_top(tk_manifest_local *out, json_t *spec, const char *text, size_t len)
{
    const char *name = json_string_value(json_object_get(spec, "name"));
    const char *version = json_string_value(json_object_get(spec, "version"));
    const char *license = json_string_value(json_object_get(spec, "license"));
    json_t *desc = json_object_get(spec, "description");
    int rc;
    if (!name || tk_manifest__name_check(name, NULL, NULL) != TK_OK) {
        rc = tk__err(TK_ERR_MANIFEST, "'name' must be org/name, e.g. my-org/relu (got %s)", name ? name : "nothing");
        return located(rc, text, len, out->spec_path, name ? "name" : NULL, name ? NULL : "kernels", 0);
    }
    if (!version || tk_manifest__version_parse(version, NULL) != 0) {
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
        return tk__err(TK_ERR_MANIFEST,
                       "%s: 'kernels' must be a non-empty array: a package declares at least "
                       "one kernel (docs/package-format.md)",
                       out->spec_path);
    if (!(out->name = tk__strdup(name)) || !(out->version = tk__strdup(version)))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    return TK_OK;
}

/* The "files" a publish would write: every file of the directory with its sha256 and size. */
static int list_files(tk_manifest_local *out, json_t **files)
{
    int rc = tk_manifest__dir_files(&out->paths, &out->nfiles, out->dir);
    return rc == TK_OK ? tk_manifest__files_json(files, out->dir, (const char *const *)out->paths, out->nfiles) : rc;
}

int tk_manifest__local_load(tk_manifest_local *out, const char *dir)
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
    if ((rc = tk_manifest__validate_json(spec, &bad_in, &bad)) != TK_OK) {
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
    tk_manifest__local_free(out);
    return rc;
}
