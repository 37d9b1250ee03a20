/*
 * yank.c — withdrawing a published version without breaking anyone's lock (`tk yank`).
 *
 * A yank is a statement signed by the publisher, like a manifest:
 *
 *     yank.json      {"format_version": 1, "type": "yank", "name": "org/name", "version": "1.0.2",
 *                     "reason": "...", "time": "2026-11-22T10:00:00Z"}
 *     yank.json.sig  the signature file over those exact bytes
 *
 * stored in the tree as kernels/{org}/{name}/yanked/{version}.json and .json.sig (plain files that
 * nginx or a CDN serve like the rest). The version's commit stays in the tree, so a lock that pins it
 * still installs. If the version heads its branch, the branch moves back to the newest version of the
 * same major that is not yanked, so new resolutions no longer pick it; refs and the revision documents
 * are rewritten as after a publish. When it is the major's only version that is not yanked (a broken
 * first release), the branch is removed: the major resolves to nothing, and clients say why from the
 * statement (hub/get.c); the next publish of that major makes the branch again. A version that was
 * yanked can never be published again.
 *
 * A client that has already seen the yanked version would refuse the older head as a rollback; it
 * fetches the statement for the version it saw, checks its signature against the keys it trusts for
 * the org, and then accepts the move back (hub/get.c). So a registry cannot roll clients back on its
 * own: only the publisher's key can.
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "cache/state.h"
#include "common/common.h"
#include "hub/hub.h"
#include "manifest/manifest.h"
#include "hub/sign.h"
#include "hub/tree.h"

/* A version string safe as a file name: what tk_manifest__version_parse accepts, and only [0-9A-Za-z.+-]. */
static int version_ok(const char *v, int *major)
{
    if (!v || !*v || strlen(v) > 64 || v[0] == '.' || tk_manifest__version_parse(v, major) != TK_OK)
        return 0;
    for (const char *p = v; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '.' ||
              *p == '+' || *p == '-'))
            return 0;
    return 1;
}

int tk_hub__yank_parse(tk_hub_yank *y, const char *stmt, size_t len)
{
    memset(y, 0, sizeof *y);
    json_error_t je;
    json_t *j = json_loadb(stmt, len, JSON_REJECT_DUPLICATES, &je);
    int rc = TK_OK;
    const char *name = json_string_value(json_object_get(j, "name"));
    const char *version = json_string_value(json_object_get(j, "version"));
    const char *reason = json_string_value(json_object_get(j, "reason"));
    if (!json_is_object(j))
        rc = tk__err(TK_ERR_MANIFEST, "the yank statement is not a JSON object: %s", je.text);
    else if (json_integer_value(json_object_get(j, "format_version")) != 1 ||
             !tk__streq(json_string_value(json_object_get(j, "type")), "yank"))
        rc = tk__err(TK_ERR_MANIFEST, "the yank statement needs \"format_version\": 1 and \"type\": \"yank\"");
    else if (!name || tk_hub__ref_parse(&y->ref, name) != TK_OK || y->ref.major || y->ref.commit[0] ||
             y->ref.prefix[0] || tk_hub__ref_is_spec(&y->ref))
        rc = tk__err(TK_ERR_MANIFEST, "the yank statement names no package (\"name\": \"org/name\")");
    else if (!version_ok(version, &y->major))
        rc = tk__err(TK_ERR_MANIFEST, "the yank statement's version '%s' is not MAJOR.MINOR.PATCH",
                     version ? version : "(missing)");
    if (rc == TK_OK) {
        snprintf(y->version, sizeof y->version, "%s", version);
        snprintf(y->reason, sizeof y->reason, "%s", reason ? reason : "");
    }
    json_decref(j);
    return rc;
}

int tk_hub__yank_make(char **stmt, char **sig, const char *name, const char *version, const char *reason,
                      const char *key_path)
{
    *stmt = *sig = NULL;
    char ts[32];
    time_t now = time(NULL);
    struct tm tm;
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
    json_t *j = json_pack("{s:i, s:s, s:s, s:s, s:s, s:s}", "format_version", 1, "type", "yank", "name", name,
                          "version", version, "reason", reason ? reason : "", "time", ts);
    char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(j);
    if (!text)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    tk_hub_yank y;
    int rc = tk_hub__yank_parse(&y, text, strlen(text));
    tk_hub_key *key = NULL;
    if (rc == TK_OK && (rc = tk_hub__key_load(&key, key_path)) == TK_OK)
        rc = tk_hub__sign(sig, key, text, strlen(text));
    tk_hub__key_free(key);
    if (rc != TK_OK) {
        free(text);
        return rc;
    }
    *stmt = text;
    return TK_OK;
}

int tk_hub__tree_is_yanked(const char *resolve_dir, const char *version)
{
    char *p = tk__fmt("%s/../yanked/%s.json", resolve_dir, version);
    struct stat st;
    int yes = p && stat(p, &st) == 0;
    free(p);
    return yes;
}

/* One pass over the commits (40-hex directories under resolve/), reading each one's version once:
 * *commit receives the commit of `version` (TK_ERR_NOT_FOUND when the tree has none), and *prev the
 * newest other version of `major` that is not yanked ("" when there is none): where its branch goes
 * if `version` is withdrawn. */
static int scan_versions(char commit[41], char prev[41], const char *resolve_dir, const char *version, int major)
{
    DIR *d = opendir(resolve_dir);
    if (!d)
        return TK_ERR_NOT_FOUND;
    struct dirent *e;
    char *best = NULL;
    commit[0] = prev[0] = '\0';
    while ((e = readdir(d)) != NULL) {
        int vmajor = 0;
        if (strlen(e->d_name) != 40 || strspn(e->d_name, "0123456789abcdef") != 40)
            continue;
        char *v = tk_hub__tree_commit_version(resolve_dir, e->d_name);
        if (v && strcmp(v, version) == 0) {
            memcpy(commit, e->d_name, 41);
        } else if (v && tk_manifest__version_parse(v, &vmajor) == 0 && vmajor == major &&
                   !tk_hub__tree_is_yanked(resolve_dir, v) && (!best || tk_state__version_cmp(v, best) > 0)) {
            free(best);
            best = v;
            v = NULL;
            memcpy(prev, e->d_name, 41);
        }
        free(v);
    }
    closedir(d);
    free(best);
    return commit[0] ? TK_OK : TK_ERR_NOT_FOUND;
}

int tk_hub__tree_yank(char moved_to[41], int *already, int *removed, const char *tree, const char *stmt, size_t slen,
                      const char *sig, size_t siglen)
{
    tk_hub_yank y;
    int rc = tk_hub__yank_parse(&y, stmt, slen), lock_fd = -1;
    char *resolve_dir = NULL, *api_dir = NULL, *ydir = NULL, *spath = NULL, *gpath = NULL, *lock_path = NULL,
         *head = NULL;
    char commit[41], prev[41], branch[24];
    moved_to[0] = '\0';
    *already = *removed = 0;
    if (rc != TK_OK)
        return rc;
    resolve_dir = tk__fmt("%s/kernels/%s/%s/resolve", tree, y.ref.org, y.ref.pkg);
    api_dir = tk__fmt("%s/api/kernels/%s/%s", tree, y.ref.org, y.ref.pkg);
    ydir = tk__fmt("%s/kernels/%s/%s/yanked", tree, y.ref.org, y.ref.pkg);
    spath = tk__fmt("%s/%s.json", ydir, y.version);
    gpath = tk__fmt("%s/%s.json.sig", ydir, y.version);
    lock_path = tk__path_join(tree, ".tk-publish.lock");
    if (!resolve_dir || !api_dir || !ydir || !spath || !gpath || !lock_path) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((lock_fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644)) < 0 || flock(lock_fd, LOCK_EX) != 0) {
        rc = tk__err_sys("cannot lock the registry tree", lock_path);
        goto done;
    }
    if ((rc = scan_versions(commit, prev, resolve_dir, y.version, y.major)) != TK_OK) {
        rc = tk__err(TK_ERR_NOT_FOUND, "%s has no version %s in this registry", y.ref.name, y.version);
        goto done;
    }
    snprintf(branch, sizeof branch, "v%d", y.major);
    head = tk_hub__tree_branch_head(resolve_dir, branch);
    if (tk_hub__tree_is_yanked(resolve_dir, y.version)) {
        *already = 1;
        goto done;
    }
    /* When it heads its branch, the branch moves back to prev, or goes when there is none. */
    int heads = head && strcmp(head, commit) == 0;
    if (!heads)
        prev[0] = '\0'; /* the branch stays */
    if ((rc = tk__mkdirs(ydir, 0755)) != TK_OK || (rc = tk__write_atomic(gpath, sig, siglen, 0644)) != TK_OK ||
        (rc = tk__write_atomic(spath, stmt, slen, 0644)) != TK_OK) /* the statement last: it is what marks the yank */
        goto done;
    if (heads && !prev[0]) {
        char *link = tk__path_join(resolve_dir, branch);
        if (!link)
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
        else if (unlink(link) != 0)
            rc = tk__err_sys("cannot remove the branch link", link);
        else if ((rc = tk__fsync_dir(resolve_dir)) == TK_OK)
            rc = tk_hub__tree_update_refs(tree, api_dir, resolve_dir, y.ref.name, y.major, NULL, "source.tar.gz");
        free(link);
        *removed = rc == TK_OK;
    } else if (prev[0]) {
        json_t *pm = tk_hub__tree_commit_manifest(resolve_dir, prev);
        const char *archive = json_string_value(json_object_get(json_object_get(pm, "archive"), "path"));
        char *archive_copy = tk__strdup(archive ? archive : "source.tar.gz");
        json_decref(pm);
        if (!archive_copy) {
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
            goto done;
        }
        if ((rc = tk_hub__tree_set_symlink(resolve_dir, branch, prev)) == TK_OK)
            rc = tk_hub__tree_update_refs(tree, api_dir, resolve_dir, y.ref.name, y.major, prev, archive_copy);
        free(archive_copy);
        if (rc == TK_OK)
            memcpy(moved_to, prev, 41);
    }
done:
    if (lock_fd >= 0)
        close(lock_fd);
    free(resolve_dir);
    free(api_dir);
    free(ydir);
    free(spath);
    free(gpath);
    free(lock_path);
    free(head);
    return rc;
}
