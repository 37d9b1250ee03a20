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
#include "manifest/manifest.h"
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
    const char *ap = json_string_value(json_object_get(a, "path")),
               *ah = json_string_value(json_object_get(a, "sha256"));
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

/* The commit directories in resolve_dir (40-hex names, real directories), malloc'd names. */
static int list_commits(char ***out, size_t *count, const char *resolve_dir)
{
    char **commits = NULL;
    size_t n = 0, cap = 0;
    int rc = TK_OK;
    *out = NULL;
    *count = 0;
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
    *out = commits;
    *count = n;
    return rc;
}

static void free_list(char **names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

int tk_hub__tree_backfill_parents(const char *api_dir, const char *resolve_dir)
{
    char **commits = NULL;
    size_t n = 0;
    int rc = list_commits(&commits, &n, resolve_dir);
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
        const char *nm = json_string_value(json_object_get(m, "name")),
                   *v = json_string_value(json_object_get(m, "version"));
        int major = 0;
        char *path = tk__fmt("%s/revision/%s", api_dir, commits[i]), *rdir = tk__fmt("%s/revision", api_dir);
        json_t *doc = nm && v && tk_manifest__version_parse(v, &major) == 0
                          ? tk_hub__tree_info_doc(nm, commits[i], archive, v, major, found)
                          : NULL;
        if (!path || !rdir)
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
        else if (doc && (rc = tk__mkdirs(rdir, 0755)) == TK_OK)
            rc = tk_hub__tree_write_json(path, doc);
        json_decref(doc);
        json_decref(m);
        free(path);
        free(rdir);
    }
    free_list(commits, n);
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
        if (!v || tk_manifest__version_parse(v, &major) != 0) {
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
        json_array_append_new(list, json_pack("{s:s, s:s, s:i, s:s}", "version", v, "commit", e->d_name, "major", major,
                                              "published", when));
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

/* Moves main to the head of the highest major and writes api_dir/refs: every branch v<N> and main
 * with its head. *best_commit (malloc'd) and *best: that head and its major. With no branch left
 * (every major's versions yanked) main is removed, refs lists no branch, and *best_commit is NULL. */
static int write_refs(char **best_commit, int *best, const char *api_dir, const char *resolve_dir)
{
    int rc = TK_OK;
    json_t *branches = json_array(), *refs = NULL;
    char *refs_path = NULL;
    *best_commit = NULL;
    *best = 0;
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
            json_array_append_new(
                branches, json_pack("{s:s, s:s, s:s}", "name", e->d_name, "ref", refname, "targetCommit", head));
        free(refname);
        if (head && major > *best) {
            *best = (int)major;
            free(*best_commit);
            *best_commit = head;
        } else {
            free(head);
        }
    }
    closedir(d);
    if (!*best_commit) {
        char *main_link = tk__path_join(resolve_dir, "main");
        rc = !main_link                                  ? tk__err(TK_ERR_NOMEM, "out of memory")
             : unlink(main_link) != 0 && errno != ENOENT ? tk__err_sys("cannot remove", main_link)
                                                         : tk__fsync_dir(resolve_dir);
        free(main_link);
    } else if ((rc = tk_hub__tree_set_symlink(resolve_dir, "main", *best_commit)) == TK_OK) {
        json_array_append_new(branches, json_pack("{s:s, s:s, s:s}", "name", "main", "ref", "refs/heads/main",
                                                  "targetCommit", *best_commit));
    }
    if (rc != TK_OK)
        goto done;
    refs = json_pack("{s:O, s:[], s:[]}", "branches", branches, "tags", "converts");
    if (!(refs_path = tk__path_join(api_dir, "refs")))
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
    else
        rc = tk_hub__tree_write_json(refs_path, refs);
done:
    json_decref(branches);
    json_decref(refs);
    free(refs_path);
    return rc;
}

/* The info document of commit (its version, parent and archive from the tree) at api_dir/<rel>. */
static int write_info_doc(const char *api_dir, const char *resolve_dir, const char *rel, const char *name,
                          const char *commit, int major, const char *fallback_archive)
{
    char *version = tk_hub__tree_commit_version(resolve_dir, commit);
    char *parent = tk_hub__tree_commit_parent(api_dir, commit);
    json_t *m = tk_hub__tree_commit_manifest(resolve_dir, commit);
    const char *archive = json_string_value(json_object_get(json_object_get(m, "archive"), "path"));
    json_t *doc = tk_hub__tree_info_doc(name, commit, archive ? archive : fallback_archive, version ? version : "",
                                        major, parent);
    char *path = tk__path_join(api_dir, rel);
    int rc = doc && path ? tk_hub__tree_write_json(path, doc) : tk__err(TK_ERR_NOMEM, "out of memory");
    json_decref(doc);
    json_decref(m);
    free(path);
    free(version);
    free(parent);
    return rc;
}

/* The registry's index.json: name's entry says main is best_commit, of major best (null and 0 when
 * every version is yanked: the name stays listed, for "did you mean"). */
static int write_registry_index(const char *tree, const char *name, const char *best_commit, int best)
{
    char *rpath = tk__path_join(tree, "index.json"), *text = NULL;
    size_t n = 0;
    json_t *reg = NULL;
    if (!rpath)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    if (tk__read_file(&text, &n, rpath, JSON_DOC_MAX) == TK_OK)
        reg = json_loadb(text, n, 0, NULL);
    if (!json_is_object(reg)) {
        json_decref(reg);
        reg = json_pack("{s:i, s:{}}", "format_version", 1, "packages");
    }
    if (!json_is_object(json_object_get(reg, "packages")))
        json_object_set_new(reg, "packages", json_object());
    json_object_set_new(json_object_get(reg, "packages"), name,
                        json_pack("{s:s?, s:i}", "main", best_commit, "latest_major", best));
    int rc = tk_hub__tree_write_json(rpath, reg);
    json_decref(reg);
    free(rpath);
    free(text);
    return rc;
}

/* Removes api_dir/<rel> (a document of a branch that no longer exists); gone already is fine. */
static int remove_doc(const char *api_dir, const char *rel)
{
    char *path = tk__path_join(api_dir, rel);
    int rc = !path                                  ? tk__err(TK_ERR_NOMEM, "out of memory")
             : unlink(path) != 0 && errno != ENOENT ? tk__err_sys("cannot remove", path)
                                                    : TK_OK;
    free(path);
    return rc;
}

int tk_hub__tree_update_refs(const char *tree, const char *api_dir, const char *resolve_dir, const char *name,
                             int new_major, const char *new_commit, const char *archive_name)
{
    char *best_commit = NULL, vrel[32];
    int best = 0, rc = tk_hub__tree_backfill_parents(api_dir, resolve_dir);
    snprintf(vrel, sizeof vrel, "revision/v%d", new_major);
    if (rc == TK_OK)
        rc = write_refs(&best_commit, &best, api_dir, resolve_dir);
    if (rc == TK_OK)
        rc = write_versions_doc(api_dir, resolve_dir);
    if (rc == TK_OK)
        rc = new_commit ? write_info_doc(api_dir, resolve_dir, vrel, name, new_commit, new_major, archive_name)
                        : remove_doc(api_dir, vrel);
    if (rc == TK_OK && !best_commit) { /* no branch left: nothing for main or the repo to name */
        if ((rc = remove_doc(api_dir, "revision/main")) == TK_OK)
            rc = remove_doc(api_dir, "index.json");
    } else if (rc == TK_OK) {
        rc = write_info_doc(api_dir, resolve_dir, "revision/main", name, best_commit, best, archive_name);
        if (rc == TK_OK)
            rc = write_info_doc(api_dir, resolve_dir, "index.json", name, best_commit, best, archive_name);
    }
    if (rc == TK_OK)
        rc = write_registry_index(tree, name, best_commit, best);
    if (rc == TK_OK) /* last: what tk's clients read is current even when this fails */
        rc = tk_hub__tree_write_hub_docs(api_dir, resolve_dir);
    free(best_commit);
    return rc;
}

/* ---- what huggingface_hub reads besides the files (docs/registry.md, "huggingface_hub") ------------ */

static int cmp_listing(const void *a, const void *b)
{
    return strcmp(json_string_value(json_object_get(*(json_t *const *)a, "path")),
                  json_string_value(json_object_get(*(json_t *const *)b, "path")));
}

int tk_hub__tree_listing(json_t **out, const char *commit_dir)
{
    json_t *entries[64];
    size_t n = 0;
    int rc = TK_OK;
    *out = NULL;
    DIR *d = opendir(commit_dir);
    if (!d)
        return tk__err_sys("cannot read", commit_dir);
    struct dirent *e;
    while (rc == TK_OK && (e = readdir(d)) != NULL) {
        struct stat st;
        char sha[TK_SHA256_HEX];
        int64_t size = 0;
        char *p = e->d_name[0] != '.' ? tk__path_join(commit_dir, e->d_name) : NULL;
        if (p && lstat(p, &st) == 0 && S_ISREG(st.st_mode)) {
            if (n == sizeof entries / sizeof *entries)
                rc = tk__err(TK_ERR_INVALID, "'%s' holds more than %zu files", commit_dir, n);
            else if ((rc = tk__sha256_file_nofollow(sha, &size, p)) == TK_OK &&
                     !(entries[n++] = json_pack("{s:s, s:s, s:I, s:s}", "type", "file", "path", e->d_name, "size",
                                                (json_int_t)size, "oid", sha)))
                rc = tk__err(TK_ERR_NOMEM, "out of memory");
        }
        free(p);
    }
    closedir(d);
    json_t *list = rc == TK_OK ? json_array() : NULL;
    if (rc == TK_OK && !list)
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
    if (rc == TK_OK)
        qsort(entries, n, sizeof *entries, cmp_listing);
    for (size_t i = 0; i < n; i++)
        if (rc == TK_OK)
            json_array_append_new(list, entries[i]);
        else
            json_decref(entries[i]);
    *out = list;
    return rc;
}

/* Fills dir (empty) with the links of tree.h's tk_hub__tree_etag_links for the files in list. */
static int fill_etag_dir(const char *dir, json_t *list)
{
    size_t i;
    json_t *f;
    int rc = TK_OK;
    json_array_foreach(list, i, f) {
        const char *path = json_string_value(json_object_get(f, "path"));
        const char *sha = json_string_value(json_object_get(f, "oid"));
        char *shadir = tk__path_join(dir, sha), *inner = tk__fmt("%s/%s/%s", dir, sha, path);
        char *target = tk__fmt("../../%s", path), *outer = tk__path_join(dir, path);
        if (!shadir || !inner || !target || !outer)
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
        else if (mkdir(shadir, 0755) != 0 && errno != EEXIST)
            rc = tk__err_sys("cannot create", shadir);
        else if (symlink(target, inner) != 0 || symlink(sha, outer) != 0)
            rc = tk__err_sys("cannot create a link", outer);
        free(shadir);
        free(inner);
        free(target);
        free(outer);
        if (rc != TK_OK)
            break;
    }
    return rc;
}

int tk_hub__tree_etag_links(const char *commit_dir)
{
    char *links = tk__path_join(commit_dir, ".etag"), *tmp = tk__tmp_path(commit_dir, "etag");
    json_t *list = NULL;
    int rc = links && tmp ? TK_OK : tk__err(TK_ERR_NOMEM, "out of memory");
    if (rc != TK_OK || tk__path_exists(links)) /* .etag appears whole, by a rename; a commit never changes */
        goto done;
    if ((rc = tk_hub__tree_listing(&list, commit_dir)) != TK_OK)
        goto done;
    if (mkdir(tmp, 0755) != 0)
        rc = tk__err_sys("cannot create", tmp);
    else if ((rc = fill_etag_dir(tmp, list)) == TK_OK && rename(tmp, links) != 0)
        rc = tk__err_sys("cannot move into place", links);
    if (rc == TK_OK)
        rc = tk__fsync_dir(commit_dir);
    else
        tk__rmtree(tmp);
done:
    json_decref(list);
    free(links);
    free(tmp);
    return rc;
}

/* api_dir/tree/<rev> from list, unless keep_existing and it is there already. */
static int write_listing(const char *api_dir, const char *rev, json_t *list, int keep_existing)
{
    char *dir = tk__path_join(api_dir, "tree"), *path = dir ? tk__path_join(dir, rev) : NULL;
    int rc = TK_OK;
    if (!path)
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
    else if (!(keep_existing && tk__path_exists(path)) && (rc = tk__mkdirs(dir, 0755)) == TK_OK)
        rc = tk_hub__tree_write_json(path, list);
    if (rc != TK_OK && path) {
        char why[512];
        snprintf(why, sizeof why, "%s", tk_last_error());
        rc = tk__err(rc,
                     "cannot write %s, the listing huggingface_hub reads: %s\nHINT: %s holds only the "
                     "listings tk writes; move away what is in the way and publish again",
                     path, why, dir);
    }
    free(dir);
    free(path);
    return rc;
}

int tk_hub__tree_commit_hub_docs(const char *api_dir, const char *resolve_dir, const char *commit)
{
    char *cdir = tk__path_join(resolve_dir, commit), *tpath = tk__fmt("%s/tree/%s", api_dir, commit);
    json_t *list = NULL;
    int rc = cdir && tpath ? TK_OK : tk__err(TK_ERR_NOMEM, "out of memory");
    if (rc == TK_OK)
        rc = tk_hub__tree_etag_links(cdir);
    if (rc == TK_OK && !tk__path_exists(tpath))
        rc = tk_hub__tree_listing(&list, cdir);
    if (list)
        rc = write_listing(api_dir, commit, list, 1);
    json_decref(list);
    free(cdir);
    free(tpath);
    return rc;
}

int tk_hub__tree_write_hub_docs(const char *api_dir, const char *resolve_dir)
{
    char **commits = NULL;
    size_t n = 0;
    int rc = list_commits(&commits, &n, resolve_dir);
    for (size_t i = 0; rc == TK_OK && i < n; i++)
        rc = tk_hub__tree_commit_hub_docs(api_dir, resolve_dir, commits[i]);
    free_list(commits, n);
    DIR *d = rc == TK_OK ? opendir(resolve_dir) : NULL;
    struct dirent *e;
    while (d && rc == TK_OK && (e = readdir(d)) != NULL) {
        int64_t major;
        if (strcmp(e->d_name, "main") != 0 &&
            (e->d_name[0] != 'v' || tk__parse_i64(e->d_name + 1, 1, 1000000, &major) != 0))
            continue;
        /* a branch's listing is its head's, written above (no file is hashed again) */
        char *head = tk_hub__tree_branch_head(resolve_dir, e->d_name), *text = NULL;
        char *tpath = head && tk__is_hex(head, 40) ? tk__fmt("%s/tree/%s", api_dir, head) : NULL;
        size_t len = 0;
        json_t *list =
            tpath && tk__read_file(&text, &len, tpath, JSON_DOC_MAX) == TK_OK ? json_loadb(text, len, 0, NULL) : NULL;
        if (list)
            rc = write_listing(api_dir, e->d_name, list, 0);
        json_decref(list);
        free(head);
        free(tpath);
        free(text);
    }
    if (d)
        closedir(d);
    /* the listing of a branch that no longer exists (its only version yanked) goes too */
    char *tdir = rc == TK_OK ? tk__path_join(api_dir, "tree") : NULL;
    d = tdir ? opendir(tdir) : NULL;
    while (d && rc == TK_OK && (e = readdir(d)) != NULL) {
        int64_t major;
        if (strcmp(e->d_name, "main") != 0 &&
            (e->d_name[0] != 'v' || tk__parse_i64(e->d_name + 1, 1, 1000000, &major) != 0))
            continue;
        char *head = tk_hub__tree_branch_head(resolve_dir, e->d_name),
             *stale = head ? NULL : tk__path_join(tdir, e->d_name);
        if (!head && (!stale || (unlink(stale) != 0 && errno != ENOENT)))
            rc = stale ? tk__err_sys("cannot remove", stale) : tk__err(TK_ERR_NOMEM, "out of memory");
        free(head);
        free(stale);
    }
    if (d)
        closedir(d);
    free(tdir);
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
