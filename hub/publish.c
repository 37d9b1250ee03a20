/*
 * publish.c — writes a package version into a static registry tree in the Hub's URL layout
 * (docs/package-format.md, "Registry layout"), so any static HTTP server, object store or CDN can
 * serve it.
 *
 * Order of writes, so a reader (or a crash) never sees a half-published version:
 *   1. a staging dir resolve/.tmp-publish-* gets the three files and their .etag links (tree.h), then
 *      is renamed to resolve/<commit>/;
 *   2. api/.../revision/<commit> and api/.../tree/<commit> are written;
 *   3. the branch symlink resolve/v<N> is swapped atomically (rename), then revision/v<N>, refs,
 *      tree/v<N>, tree/main, index.json and the registry's index.json are rewritten atomically.
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
#include "manifest/manifest.h"
#include "hub/sign.h"
#include "hub/tree.h"

/* One publish, step by step (tk_hub__publish): what each step reads and what it leaves for the next. */
typedef struct {
    const char *pkgdir, *to_dir, *compression, *archive_name; /* inputs; archive_name: source.tar.gz|zst */
    tk_hub_key *key;
    json_t *spec;                                            /* kernel.json, variants expanded */
    char *spec_path;
    const char *name, *version, *license;                    /* in spec */
    int major;
    char org[65], pkg[65], branch[24];
    char **paths;                                            /* the package's files, sorted */
    size_t npaths;
    json_t *jfiles;                                          /* their manifest entries */
    int lock_fd;
    char *api_dir, *resolve_dir, *stage;                     /* stage: resolve/.tmp-publish-*, then the commit */
    char archive_sha[TK_SHA256_HEX];
    int64_t archive_size;
    char *mtext, *sig, *head;                                /* manifest text, its signature, branch head */
    char commit[41];
} publish_job;

static void job_free(publish_job *j)
{
    if (j->stage && tk__path_exists(j->stage))
        tk__rmtree(j->stage);
    if (j->lock_fd >= 0)
        close(j->lock_fd);
    for (size_t i = 0; i < j->npaths; i++)
        free(j->paths[i]);
    free(j->paths);
    json_decref(j->spec);
    json_decref(j->jfiles);
    tk_hub__key_free(j->key);
    free(j->spec_path);
    free(j->api_dir);
    free(j->resolve_dir);
    free(j->stage);
    free(j->mtext);
    free(j->sig);
    free(j->head);
}

/* Parse: the author's kernel.json, its variants expanded, and the fields every manifest needs. */
static int read_spec(publish_job *j)
{
    char *text = NULL;
    size_t len = 0;
    json_error_t jerr;
    int rc;
    if (!(j->spec_path = tk__path_join(j->pkgdir, "kernel.json")))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    if ((rc = tk__read_file(&text, &len, j->spec_path, TK_MANIFEST_MAX)) != TK_OK) {
        if (rc == TK_ERR_NOT_FOUND)
            rc = tk__err(TK_ERR_NOT_FOUND,
                         "'%s' has no kernel.json\nHINT: a package directory holds kernel.json "
                         "and its sources; see docs/package-format.md",
                         j->pkgdir);
        return rc;
    }
    j->spec = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!json_is_object(j->spec))
        return tk__err(TK_ERR_MANIFEST, "%s: line %d, column %d: %s", j->spec_path, jerr.line, jerr.column,
                       j->spec ? "not a JSON object" : jerr.text);
    /* a kernel with "dtypes" is published as its variants: clients never see a template */
    if ((rc = tk_manifest__expand_variants(j->spec, NULL, NULL)) != TK_OK)
        return tk__err_wrap(rc, "%s", j->spec_path);
    j->name = json_string_value(json_object_get(j->spec, "name"));
    j->version = json_string_value(json_object_get(j->spec, "version"));
    j->license = json_string_value(json_object_get(j->spec, "license"));
    if (!j->name || tk_manifest__name_check(j->name, j->org, j->pkg) != TK_OK)
        return tk__err(TK_ERR_MANIFEST, "%s: 'name' must be org/name (got %s)", j->spec_path,
                       j->name ? j->name : "nothing");
    if (!j->version || tk_manifest__version_parse(j->version, &j->major) != 0)
        return tk__err(TK_ERR_MANIFEST, "%s: 'version' must be MAJOR.MINOR.PATCH with MAJOR >= 1 (got %s)",
                       j->spec_path, j->version ? j->version : "nothing");
    if (!j->license)
        return tk__err(TK_ERR_MANIFEST, "%s: 'license' is missing (an SPDX id such as Apache-2.0)", j->spec_path);
    snprintf(j->branch, sizeof j->branch, "v%d", j->major);
    return TK_OK;
}

/* Parse: the package's files, sorted, with their digests. */
static int hash_files(publish_job *j)
{
    int rc = tk_manifest__dir_files(&j->paths, &j->npaths, j->pkgdir);
    if (rc != TK_OK)
        return rc;
    if (j->npaths == 0)
        return tk__err(TK_ERR_INVALID, "'%s' has no source files besides kernel.json", j->pkgdir);
    return tk_manifest__files_json(&j->jfiles, j->pkgdir, (const char *const *)j->paths, j->npaths);
}

/* Takes the tree's publish lock and makes the staging directory inside it (same file system). */
static int lock_tree(publish_job *j)
{
    int rc = tk__mkdirs(j->to_dir, 0755);
    char *lock_path = rc == TK_OK ? tk__path_join(j->to_dir, ".tk-publish.lock") : NULL;
    if (rc != TK_OK)
        return rc;
    if (!lock_path)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    if ((j->lock_fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644)) < 0 || flock(j->lock_fd, LOCK_EX) != 0)
        rc = tk__err_sys("cannot lock the registry tree", lock_path);
    free(lock_path);
    if (rc != TK_OK)
        return rc;
    j->api_dir = tk__fmt("%s/api/kernels/%s/%s", j->to_dir, j->org, j->pkg);
    j->resolve_dir = tk__fmt("%s/kernels/%s/%s/resolve", j->to_dir, j->org, j->pkg);
    if (!j->api_dir || !j->resolve_dir || !(j->stage = tk__tmp_path(j->resolve_dir, "publish")))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    return tk__mkdirs(j->stage, 0755);
}

/* The deterministic source archive, in the staging directory, and its digest. */
static int build_archive(publish_job *j)
{
    char *path = tk__path_join(j->stage, j->archive_name);
    int rc = path ? tk_hub__archive_create(path, j->pkgdir, (const char *const *)j->paths, j->npaths, j->compression)
                  : tk__err(TK_ERR_NOMEM, "out of memory");
    if (rc == TK_OK)
        rc = tk__sha256_file(j->archive_sha, &j->archive_size, path);
    free(path);
    return rc;
}

/* Validate: the manifest text (header fields first, then the author's other fields, then files and
 * archive), parsed back as clients parse it: what we publish must be what clients accept. */
static int build_manifest(publish_job *j)
{
    const char *desc = json_string_value(json_object_get(j->spec, "description"));
    json_t *m = json_pack("{s:i, s:s, s:s, s:s, s:s}", "format_version", TK_MANIFEST_FORMAT, "name", j->name, "version",
                          j->version, "license", j->license, "description", desc ? desc : "");
    const char *key_name;
    json_t *value;
    if (!m)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    json_object_foreach(j->spec, key_name, value) {
        if (json_object_get(m, key_name) || !strcmp(key_name, "files") || !strcmp(key_name, "archive") ||
            !strcmp(key_name, "format_version"))
            continue;
        json_object_set(m, key_name, value);
    }
    json_object_set_new(m, "files", j->jfiles);
    j->jfiles = NULL;
    json_object_set_new(m, "archive",
                        json_pack("{s:s, s:s, s:I, s:s}", "path", j->archive_name, "sha256", j->archive_sha, "size",
                                  (json_int_t)j->archive_size, "compression", j->compression));
    char *dumped = json_dumps(m, JSON_INDENT(2));
    json_decref(m);
    j->mtext = dumped ? tk__fmt("%s\n", dumped) : NULL;
    free(dumped);
    if (!j->mtext)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    tk_manifest *check = NULL;
    int rc = tk_manifest__parse(&check, j->mtext, strlen(j->mtext));
    tk_manifest__free(check);
    return rc;
}

/* Validate: the rollback rules against the branch head. *same: the head holds this very manifest. */
static int check_head(publish_job *j, int *same)
{
    *same = 0;
    if ((j->head = tk_hub__tree_branch_head(j->resolve_dir, j->branch)) != NULL) {
        char *hp = tk__fmt("%s/%s/manifest.json", j->resolve_dir, j->head), *head_text = NULL, *head_version;
        size_t hn = 0;
        *same = hp && tk__read_file(&head_text, &hn, hp, TK_MANIFEST_MAX) == TK_OK && !strcmp(head_text, j->mtext);
        free(hp);
        free(head_text);
        if (*same) {
            snprintf(j->commit, sizeof j->commit, "%s", j->head);
            return TK_OK;
        }
        head_version = tk_hub__tree_commit_version(j->resolve_dir, j->head);
        int older = head_version && tk_state__version_cmp(j->version, head_version) <= 0;
        int rc = older ? tk__err(TK_ERR_ROLLBACK,
                                 "%s %s is not newer than %s, the head of branch %s\n"
                                 "HINT: raise 'version' in kernel.json (for example to the next patch version)",
                                 j->name, j->version, head_version, j->branch)
                       : TK_OK;
        free(head_version);
        if (rc != TK_OK)
            return rc;
    }
    if (tk_hub__tree_is_yanked(j->resolve_dir, j->version))
        return tk__err(TK_ERR_ROLLBACK,
                       "%s %s was yanked; a yanked version is never published again\n"
                       "HINT: raise 'version' in kernel.json",
                       j->name, j->version);
    return TK_OK;
}

/* Sign: the signature, the commit id (over the branch head as parent), and the manifest, its
 * signature and the .etag links written beside the archive in the staging directory. */
static int sign_stage(publish_job *j)
{
    int rc = tk_hub__sign(&j->sig, j->key, j->mtext, strlen(j->mtext));
    if (rc != TK_OK)
        return rc;
    char msha[TK_SHA256_HEX], ssha[TK_SHA256_HEX];
    tk__sha256_hex(msha, j->mtext, strlen(j->mtext));
    tk__sha256_hex(ssha, j->sig, strlen(j->sig));
    const char *names[3] = {"manifest.json", "manifest.json.sig", j->archive_name};
    const char *shas[3] = {msha, ssha, j->archive_sha};
    if ((rc = tk_hub__tree_commit_id(j->commit, j->head, names, shas)) != TK_OK)
        return rc;
    char *mp = tk__path_join(j->stage, "manifest.json"), *sp = tk__path_join(j->stage, "manifest.json.sig");
    if (!mp || !sp)
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
    if (rc == TK_OK)
        rc = tk__write_atomic(mp, j->mtext, strlen(j->mtext), 0644);
    if (rc == TK_OK)
        rc = tk__write_atomic(sp, j->sig, strlen(j->sig), 0644);
    if (rc == TK_OK)
        rc = tk_hub__tree_etag_links(j->stage);
    free(mp);
    free(sp);
    return rc;
}

/* Write: the staged commit moves into place, gets its info document and listing, and then the branch
 * moves to it and the refs are rewritten (the order the header comment gives). */
static int write_version(publish_job *j)
{
    char *final_dir = tk__path_join(j->resolve_dir, j->commit);
    char *revdir = tk__path_join(j->api_dir, "revision");
    char *revpath = revdir ? tk__path_join(revdir, j->commit) : NULL;
    json_t *doc = tk_hub__tree_info_doc(j->name, j->commit, j->archive_name, j->version, j->major, j->head);
    int rc = final_dir && revpath && doc ? TK_OK : tk__err(TK_ERR_NOMEM, "out of memory");
    if (rc == TK_OK && tk__path_exists(final_dir))
        tk__rmtree(j->stage);
    else if (rc == TK_OK && rename(j->stage, final_dir) != 0)
        rc = tk__err_sys("cannot move the new version into place", final_dir);
    if (rc == TK_OK)
        rc = tk__fsync_dir(j->resolve_dir);
    if (rc == TK_OK && (rc = tk__mkdirs(revdir, 0755)) == TK_OK)
        rc = tk_hub__tree_write_json(revpath, doc);
    if (rc == TK_OK)
        rc = tk_hub__tree_commit_hub_docs(j->api_dir, j->resolve_dir, j->commit);
    if (rc == TK_OK)
        rc = tk_hub__tree_set_symlink(j->resolve_dir, j->branch, j->commit);
    if (rc == TK_OK)
        rc = tk_hub__tree_update_refs(j->to_dir, j->api_dir, j->resolve_dir, j->name, j->major, j->commit,
                                      j->archive_name);
    json_decref(doc);
    free(final_dir);
    free(revdir);
    free(revpath);
    return rc;
}

/* Identical content: nothing new, but a tree from an older tk gets its commits' parents and the
 * files huggingface_hub reads. */
static int refresh_tree(publish_job *j)
{
    int rc = tk_hub__tree_backfill_parents(j->api_dir, j->resolve_dir);
    return rc == TK_OK ? tk_hub__tree_write_hub_docs(j->api_dir, j->resolve_dir) : rc;
}

int tk_hub__publish(char **commit_out, const char *pkgdir, const char *to_dir, const char *key_path,
                    const char *compression, tk_log_fn log, void *log_user)
{
    publish_job j = {
        .pkgdir = pkgdir, .to_dir = to_dir, .compression = compression ? compression : "gz", .lock_fd = -1};
    int rc, same = 0;
    if (commit_out)
        *commit_out = NULL;
    if (strcmp(j.compression, "gz") != 0 && strcmp(j.compression, "zst") != 0)
        return tk__err(TK_ERR_INVALID, "compression '%s' is not gz or zst", j.compression);
    j.archive_name = strcmp(j.compression, "gz") == 0 ? "source.tar.gz" : "source.tar.zst";
    if (!key_path)
        return tk__err(TK_ERR_INVALID, "publishing needs a private key\nHINT: pass --key FILE ('tk keygen' makes one)");
    /* parse, validate, sign, write */
    if ((rc = tk_hub__key_load(&j.key, key_path)) == TK_OK && (rc = read_spec(&j)) == TK_OK &&
        (rc = hash_files(&j)) == TK_OK && (rc = lock_tree(&j)) == TK_OK && (rc = build_archive(&j)) == TK_OK &&
        (rc = build_manifest(&j)) == TK_OK)
        rc = check_head(&j, &same);
    if (rc == TK_OK && same)
        rc = refresh_tree(&j);
    else if (rc == TK_OK && (rc = sign_stage(&j)) == TK_OK)
        rc = write_version(&j);
    /* report */
    if (rc == TK_OK && same)
        tk__logf(log, log_user, TK_LOG_INFO, "%s %s is already published as %s (nothing to do)", j.name, j.version,
                 j.commit);
    else if (rc == TK_OK)
        tk__logf(log, log_user, TK_LOG_INFO, "published %s %s as %s (branch %s)", j.name, j.version, j.commit,
                 j.branch);
    if (rc == TK_OK && commit_out && !(*commit_out = tk__strdup(j.commit)))
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
    job_free(&j);
    return rc;
}
