/*
 * publish.c — writes a package version into a static registry tree in the Hub's URL layout
 * (docs/package-format.md, "Registry layout"), so any static HTTP server, object store or CDN can
 * serve it.
 *
 * Order of writes, so a reader (or a crash) never sees a half-published version:
 *   1. a staging dir resolve/.tmp-publish-* gets the three files, then is renamed to resolve/<commit>/;
 *   2. api/.../revision/<commit> is written;
 *   3. the branch symlink resolve/v<N> is swapped atomically (rename), then revision/v<N>, refs,
 *      index.json and the registry's index.json are rewritten atomically.
 * A publish killed before step 3 leaves an unreferenced commit directory and nothing else changed.
 * Publishers to one tree are serialised with an flock on <tree>/.tk-publish.lock.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "cache/state.h"
#include "common/common.h"
#include "hub/archive.h"
#include "hub/hub.h"
#include "hub/manifest.h"
#include "hub/sign.h"
#include "hub/tree.h"

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

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

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
            rc = tk__err(TK_ERR_INVALID, "'%s' is not a regular file; packages hold only regular files "
                         "(no symlinks or devices)", full);
        } else if (tk_hub__path_check(r) != 0) {
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

int tk_hub__pkgdir_files(char ***paths, size_t *n, const char *pkgdir)
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

int tk_hub__publish(char **commit_out, const char *pkgdir, const char *to_dir, const char *key_path,
                    const char *compression, tk_log_fn log, void *log_user)
{
    if (commit_out)
        *commit_out = NULL;
    int rc = TK_OK, lock_fd = -1;
    filelist files = {0};
    json_t *spec = NULL, *manifest = NULL, *jfiles = NULL;
    tk_hub_key *key = NULL;
    char *spec_text = NULL, *spec_path = NULL, *stage = NULL, *archive_path = NULL, *mtext = NULL,
         *sig = NULL, *api_dir = NULL, *resolve_dir = NULL, *head = NULL, *head_version = NULL,
         *final_dir = NULL, *lock_path = NULL, *head_manifest = NULL;
    char org[65], pkg[65], commit[41] = "";
    size_t spec_len = 0;
    const char *ext = NULL;

    if (!compression)
        compression = "gz";
    if (strcmp(compression, "gz") != 0 && strcmp(compression, "zst") != 0)
        return tk__err(TK_ERR_INVALID, "compression '%s' is not gz or zst", compression);
    ext = strcmp(compression, "gz") == 0 ? "source.tar.gz" : "source.tar.zst";
    if (!key_path)
        return tk__err(TK_ERR_INVALID, "publishing needs a private key\nHINT: pass --key FILE ('tk keygen' makes one)");
    if ((rc = tk_hub__key_load(&key, key_path)) != TK_OK)
        goto done;

    /* 1. The author's kernel.json. */
    if (!(spec_path = tk__path_join(pkgdir, "kernel.json"))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((rc = tk__read_file(&spec_text, &spec_len, spec_path, TK_MANIFEST_MAX)) != TK_OK) {
        if (rc == TK_ERR_NOT_FOUND)
            rc = tk__err(TK_ERR_NOT_FOUND, "'%s' has no kernel.json\nHINT: a package directory holds kernel.json "
                         "and its sources; see docs/package-format.md", pkgdir);
        goto done;
    }
    json_error_t jerr;
    spec = json_loadb(spec_text, spec_len, JSON_REJECT_DUPLICATES, &jerr);
    if (!json_is_object(spec)) {
        rc = tk__err(TK_ERR_MANIFEST, "%s: line %d, column %d: %s", spec_path, jerr.line, jerr.column,
                     spec ? "not a JSON object" : jerr.text);
        goto done;
    }
    /* a kernel with "dtypes" is published as its variants: clients never see a template */
    if ((rc = tk_hub__expand_variants(spec, NULL, NULL)) != TK_OK) {
        rc = tk__err_wrap(rc, "%s", spec_path);
        goto done;
    }
    const char *name = json_string_value(json_object_get(spec, "name"));
    const char *version = json_string_value(json_object_get(spec, "version"));
    const char *license = json_string_value(json_object_get(spec, "license"));
    int major = 0;
    if (!name || tk_hub__name_check(name, org, pkg) != TK_OK) {
        rc = tk__err(TK_ERR_MANIFEST, "%s: 'name' must be org/name (got %s)", spec_path, name ? name : "nothing");
        goto done;
    }
    if (!version || tk_hub__version_parse(version, &major) != 0) {
        rc = tk__err(TK_ERR_MANIFEST, "%s: 'version' must be MAJOR.MINOR.PATCH with MAJOR >= 1 (got %s)",
                     spec_path, version ? version : "nothing");
        goto done;
    }
    if (!license) {
        rc = tk__err(TK_ERR_MANIFEST, "%s: 'license' is missing (an SPDX id such as Apache-2.0)", spec_path);
        goto done;
    }

    /* 2. Files, sorted, with digests. */
    if ((rc = walk(&files, pkgdir, "")) != TK_OK)
        goto done;
    if (files.n == 0) {
        rc = tk__err(TK_ERR_INVALID, "'%s' has no source files besides kernel.json", pkgdir);
        goto done;
    }
    qsort(files.paths, files.n, sizeof *files.paths, cmp_str);
    jfiles = json_array();
    for (size_t i = 0; i < files.n && rc == TK_OK; i++) {
        char sha[TK_SHA256_HEX];
        int64_t size = 0;
        char *full = tk__path_join(pkgdir, files.paths[i]);
        if (!full)
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
        else if ((rc = tk__sha256_file(sha, &size, full)) == TK_OK)
            json_array_append_new(jfiles, json_pack("{s:s, s:s, s:I}", "path", files.paths[i], "sha256", sha,
                                                    "size", (json_int_t)size));
        free(full);
    }
    if (rc != TK_OK)
        goto done;

    /* 3. The archive, built in a staging directory inside the tree (same file system). */
    if ((rc = tk__mkdirs(to_dir, 0755)) != TK_OK)
        goto done;
    if (!(lock_path = tk__path_join(to_dir, ".tk-publish.lock"))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((lock_fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644)) < 0 || flock(lock_fd, LOCK_EX) != 0) {
        rc = tk__err_sys("cannot lock the registry tree", lock_path);
        goto done;
    }
    api_dir = tk__fmt("%s/api/kernels/%s/%s", to_dir, org, pkg);
    resolve_dir = tk__fmt("%s/kernels/%s/%s/resolve", to_dir, org, pkg);
    if (!api_dir || !resolve_dir || !(stage = tk__tmp_path(resolve_dir, "publish"))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((rc = tk__mkdirs(stage, 0755)) != TK_OK)
        goto done;
    if (!(archive_path = tk__path_join(stage, ext))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((rc = tk_hub__archive_create(archive_path, pkgdir, (const char *const *)files.paths, files.n,
                                     compression)) != TK_OK)
        goto done;
    char archive_sha[TK_SHA256_HEX];
    int64_t archive_size = 0;
    if ((rc = tk__sha256_file(archive_sha, &archive_size, archive_path)) != TK_OK)
        goto done;

    /* 4. The manifest: header fields first, then the author's other fields, then files and archive. */
    manifest = json_pack("{s:i, s:s, s:s, s:s, s:s}", "format_version", TK_MANIFEST_FORMAT, "name", name,
                         "version", version, "license", license, "description",
                         json_string_value(json_object_get(spec, "description")) ?
                             json_string_value(json_object_get(spec, "description")) : "");
    const char *key_name;
    json_t *value;
    json_object_foreach(spec, key_name, value) {
        if (json_object_get(manifest, key_name) || !strcmp(key_name, "files") || !strcmp(key_name, "archive") ||
            !strcmp(key_name, "format_version"))
            continue;
        json_object_set(manifest, key_name, value);
    }
    json_object_set_new(manifest, "files", jfiles);
    jfiles = NULL;
    json_object_set_new(manifest, "archive", json_pack("{s:s, s:s, s:I, s:s}", "path", ext, "sha256", archive_sha,
                                                       "size", (json_int_t)archive_size, "compression", compression));
    char *dumped = json_dumps(manifest, JSON_INDENT(2));
    if (!dumped || !(mtext = tk__fmt("%s\n", dumped))) {
        free(dumped);
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    free(dumped);
    {
        /* Parse our own output: what we publish must be what clients accept. */
        tk_hub_manifest *check = NULL;
        if ((rc = tk_hub__manifest_parse(&check, mtext, strlen(mtext))) != TK_OK)
            goto done;
        tk_hub__manifest_free(check);
    }

    /* 5. Rollback rules against the branch head. */
    char branch[24];
    snprintf(branch, sizeof branch, "v%d", major);
    head = tk_hub__tree_branch_head(resolve_dir, branch);
    if (head) {
        char *hp = tk__fmt("%s/%s/manifest.json", resolve_dir, head);
        size_t hn = 0;
        if (hp && tk__read_file(&head_manifest, &hn, hp, TK_MANIFEST_MAX) == TK_OK &&
            strcmp(head_manifest, mtext) == 0) {
            free(hp);
            snprintf(commit, sizeof commit, "%s", head);
            /* identical content: nothing new, but a tree from an older tk gets its commits' parents */
            if ((rc = tk_hub__tree_backfill_parents(api_dir, resolve_dir)) != TK_OK)
                goto done;
            if (log) {
                char msg[256];
                snprintf(msg, sizeof msg, "%s %s is already published as %s (nothing to do)", name, version, head);
                log(log_user, TK_LOG_INFO, msg);
            }
            goto publish_done;
        }
        free(hp);
        head_version = tk_hub__tree_commit_version(resolve_dir, head);
        if (head_version && tk_state__version_cmp(version, head_version) <= 0) {
            rc = tk__err(TK_ERR_ROLLBACK, "%s %s is not newer than %s, the head of branch %s\n"
                         "HINT: raise 'version' in kernel.json (for example to the next patch version)",
                         name, version, head_version, branch);
            goto done;
        }
    }
    if (tk_hub__tree_is_yanked(resolve_dir, version)) {
        rc = tk__err(TK_ERR_ROLLBACK, "%s %s was yanked; a yanked version is never published again\n"
                     "HINT: raise 'version' in kernel.json", name, version);
        goto done;
    }

    /* 6. Sign, compute the commit, write the version's files. */
    if ((rc = tk_hub__sign(&sig, key, mtext, strlen(mtext))) != TK_OK)
        goto done;
    char msha[TK_SHA256_HEX], ssha[TK_SHA256_HEX];
    tk__sha256_hex(msha, mtext, strlen(mtext));
    tk__sha256_hex(ssha, sig, strlen(sig));
    const char *names[3] = {"manifest.json", "manifest.json.sig", ext};
    const char *shas[3] = {msha, ssha, archive_sha};
    if ((rc = tk_hub__tree_commit_id(commit, head, names, shas)) != TK_OK)
        goto done;
    char *mp = tk__path_join(stage, "manifest.json"), *sp = tk__path_join(stage, "manifest.json.sig");
    if (!mp || !sp)
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
    if (rc == TK_OK)
        rc = tk__write_atomic(mp, mtext, strlen(mtext), 0644);
    if (rc == TK_OK)
        rc = tk__write_atomic(sp, sig, strlen(sig), 0644);
    free(mp);
    free(sp);
    if (rc != TK_OK)
        goto done;
    if (!(final_dir = tk__path_join(resolve_dir, commit))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (tk__path_exists(final_dir)) {
        tk__rmtree(stage);
    } else if (rename(stage, final_dir) != 0) {
        rc = tk__err_sys("cannot move the new version into place", final_dir);
        goto done;
    }
    if ((rc = tk__fsync_dir(resolve_dir)) != TK_OK)
        goto done;

    /* 7. Revision document for the commit, then move the branch and rewrite the refs. */
    char *revdir = tk__path_join(api_dir, "revision");
    char *revpath = revdir ? tk__path_join(revdir, commit) : NULL;
    json_t *doc = tk_hub__tree_info_doc(name, commit, ext, version, major, head);
    if (!revdir || !revpath || !doc)
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
    if (rc == TK_OK)
        rc = tk__mkdirs(revdir, 0755);
    if (rc == TK_OK)
        rc = tk_hub__tree_write_json(revpath, doc);
    json_decref(doc);
    free(revdir);
    free(revpath);
    if (rc != TK_OK)
        goto done;
    if ((rc = tk_hub__tree_set_symlink(resolve_dir, branch, commit)) != TK_OK)
        goto done;
    if ((rc = tk_hub__tree_update_refs(to_dir, api_dir, resolve_dir, name, major, commit, ext)) != TK_OK)
        goto done;
    if (log) {
        char msg[256];
        snprintf(msg, sizeof msg, "published %s %s as %s (branch %s)", name, version, commit, branch);
        log(log_user, TK_LOG_INFO, msg);
    }
publish_done:
    if (commit_out && !(*commit_out = tk__strdup(commit)))
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
done:
    if (stage && tk__path_exists(stage))
        tk__rmtree(stage);
    if (lock_fd >= 0)
        close(lock_fd);
    filelist_free(&files);
    json_decref(spec);
    json_decref(manifest);
    json_decref(jfiles);
    tk_hub__key_free(key);
    free(spec_text);
    free(spec_path);
    free(stage);
    free(archive_path);
    free(mtext);
    free(sig);
    free(api_dir);
    free(resolve_dir);
    free(head);
    free(head_version);
    free(head_manifest);
    free(final_dir);
    free(lock_path);
    return rc;
}
