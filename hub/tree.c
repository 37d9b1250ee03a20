/*
 * tree.c — writing versions into a static registry tree, shared by `tk publish --to` (publish.c)
 * and `tk serve` uploads (serve.c). See tree.h and docs/package-format.md, "Registry layout".
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "cache/state.h"
#include "common/common.h"
#include "hub/manifest.h"
#include "hub/tree.h"

#define JSON_DOC_MAX (64u << 20) /* the tree's index.json */

char *tk_hub__tree_branch_head(const char *resolve_dir, const char *branch)
{
    char *link = tk__path_join(resolve_dir, branch);
    char buf[64];
    ssize_t n = link ? readlink(link, buf, sizeof buf - 1) : -1;
    free(link);
    if (n <= 0)
        return NULL;
    buf[n] = '\0';
    return tk__strdup(buf);
}

int tk_hub__tree_set_symlink(const char *dir, const char *name, const char *target)
{
    char *tmp = tk__tmp_path(dir, name);
    char *dst = tk__path_join(dir, name);
    int rc = TK_OK;
    if (!tmp || !dst) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
    } else if (symlink(target, tmp) != 0) {
        rc = tk__err_sys("cannot create a branch link", tmp);
    } else if (rename(tmp, dst) != 0) {
        rc = tk__err_sys("cannot move a branch link", dst);
        unlink(tmp);
    } else {
        rc = tk__fsync_dir(dir);
    }
    free(tmp);
    free(dst);
    return rc;
}

int tk_hub__tree_write_json(const char *path, json_t *j)
{
    char *text = j ? json_dumps(j, JSON_INDENT(2)) : NULL;
    char *withnl = text ? tk__fmt("%s\n", text) : NULL;
    int rc = withnl ? tk__write_atomic(path, withnl, strlen(withnl), 0644) : tk__err(TK_ERR_NOMEM, "out of memory");
    free(text);
    free(withnl);
    return rc;
}

json_t *tk_hub__tree_info_doc(const char *name, const char *commit, const char *archive_name, const char *version,
                              int major, const char *parent)
{
    return json_pack("{s:s, s:s, s:s, s:b, s:b, s:b, s:[s], s:[{s:s},{s:s},{s:s}], s:{s:s, s:i, s:s}}", "id", name,
                     "_id", commit, "sha", commit, "private", 0, "disabled", 0, "gated", 0, "tags", "kernel",
                     "siblings", "rfilename", "manifest.json", "rfilename", "manifest.json.sig", "rfilename",
                     archive_name, "tk", "version", version, "major", major, "parent",
                     parent ? parent : TK_HUB_NO_PARENT);
}

char *tk_hub__tree_commit_parent(const char *api_dir, const char *commit)
{
    char *path = tk__fmt("%s/revision/%s", api_dir, commit);
    char *text = NULL, *parent = NULL;
    size_t n = 0;
    if (path && tk__read_file(&text, &n, path, 1u << 20) == TK_OK) {
        json_t *j = json_loadb(text, n, 0, NULL);
        const char *p = json_string_value(json_object_get(json_object_get(j, "tk"), "parent"));
        if (p && tk__is_hex(p, 40))
            parent = tk__strdup(p);
        json_decref(j);
    }
    free(path);
    free(text);
    return parent;
}

/* A commit's manifest in the tree, parsed as plain JSON (NULL when missing). */
json_t *tk_hub__tree_commit_manifest(const char *resolve_dir, const char *commit)
{
    char *path = tk__fmt("%s/%s/manifest.json", resolve_dir, commit);
    char *text = NULL;
    size_t n = 0;
    json_t *j = NULL;
    if (path && tk__read_file(&text, &n, path, TK_MANIFEST_MAX) == TK_OK)
        j = json_loadb(text, n, 0, NULL);
    free(path);
    free(text);
    return j;
}

char *tk_hub__tree_commit_version(const char *resolve_dir, const char *commit)
{
    json_t *j = tk_hub__tree_commit_manifest(resolve_dir, commit);
    char *v = tk__strdup(json_string_value(json_object_get(j, "version")));
    json_decref(j);
    return v;
}

int tk_hub__tree_update_refs(const char *tree, const char *api_dir, const char *resolve_dir, const char *name,
                       int new_major, const char *new_commit, const char *archive_name)
{
    int rc = TK_OK, best = 0;
    json_t *branches = json_array(), *refs = NULL, *vdoc = NULL, *mdoc = NULL, *reg = NULL, *bm = NULL;
    char *best_commit = NULL, *nv = NULL, *bv = NULL, *np = NULL, *bp = NULL, *vpath = NULL, *mpath = NULL, *ipath = NULL,
         *refs_path = NULL, *rpath = NULL, *text = NULL;
    DIR *d = opendir(resolve_dir);
    if (!d || !branches) {
        rc = tk__err_sys("cannot read", resolve_dir);
        goto done;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int64_t major;
        if (e->d_name[0] != 'v' || tk__parse_i64(e->d_name + 1, 1, 1000000, &major) != 0)
            continue;
        char *head = tk_hub__tree_branch_head(resolve_dir, e->d_name);
        char *refname = tk__fmt("refs/heads/%s", e->d_name);
        if (head && refname)
            json_array_append_new(branches, json_pack("{s:s, s:s, s:s}", "name", e->d_name, "ref", refname,
                                                      "targetCommit", head));
        free(refname);
        if (head && major > best) {
            best = (int)major;
            free(best_commit);
            best_commit = head;
        } else {
            free(head);
        }
    }
    closedir(d);
    if (!best_commit) {
        rc = tk__err(TK_ERR_INTERNAL, "no branch found after publishing");
        goto done;
    }
    if ((rc = tk_hub__tree_set_symlink(resolve_dir, "main", best_commit)) != TK_OK)
        goto done;
    json_array_append_new(branches, json_pack("{s:s, s:s, s:s}", "name", "main", "ref", "refs/heads/main",
                                              "targetCommit", best_commit));
    refs = json_pack("{s:O, s:[], s:[]}", "branches", branches, "tags", "converts");
    if (!(refs_path = tk__path_join(api_dir, "refs"))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((rc = tk_hub__tree_write_json(refs_path, refs)) != TK_OK)
        goto done;

    nv = tk_hub__tree_commit_version(resolve_dir, new_commit);
    bv = tk_hub__tree_commit_version(resolve_dir, best_commit);
    bm = tk_hub__tree_commit_manifest(resolve_dir, best_commit);
    const char *best_archive = json_string_value(json_object_get(json_object_get(bm, "archive"), "path"));
    np = tk_hub__tree_commit_parent(api_dir, new_commit);
    bp = tk_hub__tree_commit_parent(api_dir, best_commit);
    vdoc = tk_hub__tree_info_doc(name, new_commit, archive_name, nv ? nv : "", new_major, np);
    mdoc = tk_hub__tree_info_doc(name, best_commit, best_archive ? best_archive : archive_name, bv ? bv : "", best,
                                 bp);
    vpath = tk__fmt("%s/revision/v%d", api_dir, new_major);
    mpath = tk__fmt("%s/revision/main", api_dir);
    ipath = tk__path_join(api_dir, "index.json");
    if (!vpath || !mpath || !ipath) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((rc = tk_hub__tree_write_json(vpath, vdoc)) != TK_OK || (rc = tk_hub__tree_write_json(mpath, mdoc)) != TK_OK ||
        (rc = tk_hub__tree_write_json(ipath, mdoc)) != TK_OK)
        goto done;

    size_t n = 0;
    if (!(rpath = tk__path_join(tree, "index.json"))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (tk__read_file(&text, &n, rpath, JSON_DOC_MAX) == TK_OK)
        reg = json_loadb(text, n, 0, NULL);
    if (!json_is_object(reg)) {
        json_decref(reg);
        reg = json_pack("{s:i, s:{}}", "format_version", 1, "packages");
    }
    if (!json_is_object(json_object_get(reg, "packages")))
        json_object_set_new(reg, "packages", json_object());
    json_object_set_new(json_object_get(reg, "packages"), name,
                        json_pack("{s:s, s:i}", "main", best_commit, "latest_major", best));
    rc = tk_hub__tree_write_json(rpath, reg);
done:
    json_decref(branches);
    json_decref(refs);
    json_decref(vdoc);
    json_decref(mdoc);
    json_decref(reg);
    json_decref(bm);
    free(best_commit);
    free(nv);
    free(bv);
    free(np);
    free(bp);
    free(vpath);
    free(mpath);
    free(ipath);
    free(refs_path);
    free(rpath);
    free(text);
    return rc;
}

int tk_hub__tree_commit_id(char out[41], const char *parent, const char *const names[3], const char *const shas[3])
{
    tk_buf b = TK_BUF_INIT;
    int rc = tk__buf_printf(&b, "tk-commit-1\n%s\n", parent ? parent : TK_HUB_NO_PARENT);
    for (int i = 0; i < 3 && rc == TK_OK; i++)
        rc = tk__buf_printf(&b, "%s %s\n", names[i], shas[i]);
    uint8_t md[TK_SHA256_LEN];
    if (rc == TK_OK && (rc = tk__sha256(md, b.data, b.len)) == TK_OK)
        tk__hex(out, md, 20);
    tk__buf_free(&b);
    return rc;
}

