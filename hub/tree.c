/*
 * tree.c — writing versions into a static registry tree, shared by `tk publish --to` (publish.c)
 * and `tk serve` uploads (serve.c). See tree.h and docs/package-format.md, "Registry layout".
 */
#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
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

/* The digests a commit id is made of (tree.h), from the commit's files in the tree. 0 on success. */
static int commit_parts(const char *resolve_dir, const char *commit, char *archive, size_t cap,
                        char msha[TK_SHA256_HEX], char ssha[TK_SHA256_HEX], char asha[TK_SHA256_HEX])
{
    char *mp = tk__fmt("%s/%s/manifest.json", resolve_dir, commit);
    char *sp = tk__fmt("%s/%s/manifest.json.sig", resolve_dir, commit);
    json_t *m = tk_hub__tree_commit_manifest(resolve_dir, commit);
    json_t *a = json_object_get(m, "archive");
    const char *ap = json_string_value(json_object_get(a, "path")), *ah = json_string_value(json_object_get(a, "sha256"));
    int ok = mp && sp && ap && ah && strlen(ah) == 64 && tk__sha256_file(msha, NULL, mp) == TK_OK &&
             tk__sha256_file(ssha, NULL, sp) == TK_OK;
    if (ok) {
        snprintf(archive, cap, "%s", ap);
        snprintf(asha, TK_SHA256_HEX, "%s", ah);
    }
    json_decref(m);
    free(mp);
    free(sp);
    return ok ? 0 : -1;
}

int tk_hub__tree_backfill_parents(const char *api_dir, const char *resolve_dir)
{
    int rc = TK_OK;
    char **commits = NULL;
    size_t n = 0, cap = 0;
    DIR *d = opendir(resolve_dir);
    if (!d)
        return TK_OK; /* nothing published yet */
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        struct stat st;
        char *p = tk__is_hex(e->d_name, 40) ? tk__path_join(resolve_dir, e->d_name) : NULL;
        int dir = p && lstat(p, &st) == 0 && S_ISDIR(st.st_mode);
        free(p);
        if (!dir)
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            char **nc = realloc(commits, cap * sizeof *nc);
            if (!nc) {
                rc = tk__err(TK_ERR_NOMEM, "out of memory");
                break;
            }
            commits = nc;
        }
        if (!(commits[n] = tk__strdup(e->d_name))) {
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
            break;
        }
        n++;
    }
    closedir(d);
    for (size_t i = 0; rc == TK_OK && i < n; i++) {
        char *parent = tk_hub__tree_commit_parent(api_dir, commits[i]);
        char archive[256], msha[TK_SHA256_HEX], ssha[TK_SHA256_HEX], asha[TK_SHA256_HEX], id[41];
        if (parent || commit_parts(resolve_dir, commits[i], archive, sizeof archive, msha, ssha, asha) != 0) {
            free(parent);
            continue;
        }
        const char *names[3] = {"manifest.json", "manifest.json.sig", archive};
        const char *shas[3] = {msha, ssha, asha};
        const char *found = NULL;
        for (size_t j = 0; j <= n && !found; j++) { /* the parent is another commit, or none */
            const char *cand = j < n ? commits[j] : NULL;
            if (cand && j == i)
                continue;
            if (tk_hub__tree_commit_id(id, cand, names, shas) == TK_OK && strcmp(id, commits[i]) == 0)
                found = cand ? cand : TK_HUB_NO_PARENT;
        }
        if (!found)
            continue; /* not made by tk's formula: left as it is, and clients refuse it */
        json_t *m = tk_hub__tree_commit_manifest(resolve_dir, commits[i]);
        const char *nm = json_string_value(json_object_get(m, "name")), *v = json_string_value(json_object_get(m, "version"));
        int major = 0;
        char *path = tk__fmt("%s/revision/%s", api_dir, commits[i]), *rdir = tk__fmt("%s/revision", api_dir);
        json_t *doc = nm && v && tk_hub__version_parse(v, &major) == 0
                          ? tk_hub__tree_info_doc(nm, commits[i], archive, v, major, found) : NULL;
        if (!path || !rdir)
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
        else if (doc && (rc = tk__mkdirs(rdir, 0755)) == TK_OK)
            rc = tk_hub__tree_write_json(path, doc);
        json_decref(doc);
        json_decref(m);
        free(path);
        free(rdir);
    }
    for (size_t i = 0; i < n; i++)
        free(commits[i]);
    free(commits);
    return rc;
}

/* api_dir/versions: every commit in resolve_dir with its version, major and publish date (kept from
 * the previous document; a commit new to it gets its directory's modification time). Clients check
 * each commit it names (hub/versions.c); it exists so a yanked head, which no branch chain reaches,
 * is still listed. */
static int write_versions_doc(const char *api_dir, const char *resolve_dir)
{
    char *path = tk__path_join(api_dir, "versions"), *text = NULL;
    size_t n = 0;
    json_t *old = NULL, *list = json_array(), *doc = NULL;
    int rc = TK_OK;
    DIR *d = opendir(resolve_dir);
    if (!path || !list || !d) {
        rc = d ? tk__err(TK_ERR_NOMEM, "out of memory") : tk__err_sys("cannot read", resolve_dir);
        goto done;
    }
    if (tk__read_file(&text, &n, path, JSON_DOC_MAX) == TK_OK)
        old = json_loadb(text, n, 0, NULL);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        struct stat st;
        char *p = tk__is_hex(e->d_name, 40) ? tk__path_join(resolve_dir, e->d_name) : NULL;
        int dir = p && lstat(p, &st) == 0 && S_ISDIR(st.st_mode);
        free(p);
        char *v = dir ? tk_hub__tree_commit_version(resolve_dir, e->d_name) : NULL;
        int major = 0;
        if (!v || tk_hub__version_parse(v, &major) != 0) {
            free(v);
            continue;
        }
        char when[32] = "";
        size_t i;
        json_t *o;
        json_array_foreach(json_object_get(old, "versions"), i, o) {
            const char *c = json_string_value(json_object_get(o, "commit"));
            const char *t = json_string_value(json_object_get(o, "published"));
            if (c && t && !strcmp(c, e->d_name))
                snprintf(when, sizeof when, "%s", t);
        }
        if (!when[0]) {
            struct tm tm;
            strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&st.st_mtime, &tm));
        }
        json_array_append_new(list, json_pack("{s:s, s:s, s:i, s:s}", "version", v, "commit", e->d_name, "major",
                                              major, "published", when));
        free(v);
    }
    doc = json_pack("{s:i, s:O}", "format_version", 1, "versions", list);
    rc = doc ? tk_hub__tree_write_json(path, doc) : tk__err(TK_ERR_NOMEM, "out of memory");
done:
    if (d)
        closedir(d);
    json_decref(old);
    json_decref(list);
    json_decref(doc);
    free(path);
    free(text);
    return rc;
}

int tk_hub__tree_update_refs(const char *tree, const char *api_dir, const char *resolve_dir, const char *name,
                       int new_major, const char *new_commit, const char *archive_name)
{
    int brc = tk_hub__tree_backfill_parents(api_dir, resolve_dir);
    if (brc != TK_OK)
        return brc;
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
    if ((rc = tk_hub__tree_write_json(refs_path, refs)) != TK_OK ||
        (rc = write_versions_doc(api_dir, resolve_dir)) != TK_OK)
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

