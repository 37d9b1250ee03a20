/*
 * upload.c — `tk publish --registry URL`: builds and signs a version exactly as `tk publish --to`
 * does (into a private temporary tree), then sends its three files to a `tk serve` registry as one
 * plain tar: PUT {url}/api/upload/{org}/{name} with the bearer token. The server re-checks everything
 * and answers with the commit it wrote (its own, since the commit id chains to its branch history).
 *
 * The server's refusals come back as the statuses a local check would give (X-Error-Code:
 * UntrustedSigner -> TK_ERR_UNTRUSTED, VersionConflict -> TK_ERR_ROLLBACK, ...), with its message.
 */
#include <archive.h>
#include <archive_entry.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "common/common.h"
#include "hub/http.h"
#include "hub/hub.h"

#define UPLOAD_REPLY_MAX (64u << 10)

/* Appends the regular file dir/name to the tar being written. */
static int tar_add(struct archive *a, const char *dir, const char *name)
{
    char *path = tk__fmt("%s/%s", dir, name), *data = NULL;
    size_t len = 0;
    int rc = path ? tk__read_file(&data, &len, path, (size_t)1 << 31) : tk__err(TK_ERR_NOMEM, "out of memory");
    free(path);
    if (rc != TK_OK)
        return rc;
    struct archive_entry *e = archive_entry_new();
    if (!e) {
        free(data);
        return tk__err(TK_ERR_NOMEM, "out of memory");
    }
    archive_entry_set_pathname(e, name);
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0644);
    archive_entry_set_size(e, (la_int64_t)len);
    if (archive_write_header(a, e) != ARCHIVE_OK || archive_write_data(a, data, len) != (la_ssize_t)len)
        rc = tk__err(TK_ERR_IO, "cannot add %s to the upload: %s", name, archive_error_string(a));
    archive_entry_free(e);
    free(data);
    return rc;
}

/* The version's directory in the temporary tree, and its org/name from the path. */
static int find_version(char **vdir, char org[65], char name[65], const char *tree, const char *commit)
{
    char *pat = tk__fmt("%s/kernels/*/*/resolve/%s", tree, commit);
    glob_t g;
    memset(&g, 0, sizeof g);
    int rc = TK_OK;
    if (!pat)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    if (glob(pat, GLOB_NOSORT, NULL, &g) != 0 || g.gl_pathc != 1) {
        rc = tk__err(TK_ERR_INTERNAL, "the version %s was not found in the staging tree %s", commit, tree);
    } else {
        const char *p = g.gl_pathv[0] + strlen(tree) + strlen("/kernels/");
        if (sscanf(p, "%64[^/]/%64[^/]/", org, name) != 2)
            rc = tk__err(TK_ERR_INTERNAL, "unexpected staging path %s", g.gl_pathv[0]);
        else if (!(*vdir = tk__strdup(g.gl_pathv[0])))
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
    }
    globfree(&g);
    free(pat);
    return rc;
}

/* The status a refusal maps to, from the server's X-Error-Code. */
static int refusal_status(const tk_hub_http_meta *m, int rc)
{
    static const struct {
        const char *code;
        int status;
    } map[] = {
        {"UntrustedSigner", TK_ERR_UNTRUSTED}, {"SignatureInvalid", TK_ERR_SIGNATURE},
        {"ManifestInvalid", TK_ERR_MANIFEST},  {"DigestMismatch", TK_ERR_DIGEST},
        {"ArchiveInvalid", TK_ERR_ARCHIVE},    {"VersionConflict", TK_ERR_ROLLBACK},
        {"NoSpace", TK_ERR_NOSPACE},           {"PayloadTooLarge", TK_ERR_INVALID},
        {"BadRequest", TK_ERR_INVALID},        {"EntryNotFound", TK_ERR_NOT_FOUND},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(m->error_code, map[i].code) == 0)
            return map[i].status;
    if (m->status == 401 || m->status == 403) /* no token, a bad one, or one for another org */
        return TK_ERR_AUTH;
    return rc;
}

/* Checks that registry is a `tk serve` URL and that there is a token; `doing` names the action. */
static int registry_check(const char *registry, const char *token, const char *doing)
{
    if (strncmp(registry, "http://", 7) != 0 && strncmp(registry, "https://", 8) != 0)
        return tk__err(TK_ERR_INVALID,
                       "--registry wants the http(s) URL of a 'tk serve' registry, got '%s'\n"
                       "HINT: to write a static tree on this machine, use --to DIR",
                       registry);
    if (!token || !*token)
        return tk__err(TK_ERR_INVALID,
                       "%s %s needs a token\nHINT: the registry's operator makes one with 'tk serve "
                       "token add --org ORG'; pass it as TK_TOKEN or --token",
                       doing, registry);
    return TK_OK;
}

/* PUTs body to {registry}/api/{endpoint}/{org}/{name} with the bearer token, which goes to the
 * registry's own origin only. Idempotent on the server (the same upload or yank again changes
 * nothing), so it may be retried. The reply in *reply; a refusal becomes the status its X-Error-Code
 * names, with `what` in front of the server's message. */
static int registry_put(char **reply, size_t *reply_len, const char *registry, const char *token, const char *endpoint,
                        const char *org, const char *name, const char *ctype, const void *body, size_t len,
                        const char *what)
{
    char origin[512];
    size_t n = strlen(registry);
    while (n && registry[n - 1] == '/')
        n--;
    tk_hub__http_origin(origin, sizeof origin, registry); /* registry_check saw its "://" */
    char *url = tk__fmt("%.*s/api/%s/%s/%s", (int)n, registry, endpoint, org, name);
    if (!url)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    tk_hub_http *h = NULL;
    tk_hub_http_opts ho;
    tk_hub_http_meta meta;
    memset(&ho, 0, sizeof ho);
    memset(&meta, 0, sizeof meta);
    ho.token = token;
    ho.auth_origin = origin;
    int rc = tk_hub__http_new(&h, &ho);
    if (rc == TK_OK)
        rc = tk_hub__http_send(h, "PUT", url, ctype, body, len, UPLOAD_REPLY_MAX, 1, reply, reply_len, &meta);
    if (rc != TK_OK) {
        int st = refusal_status(&meta, rc);
        if (st != rc)
            rc = tk__err_wrap(st, "%s", what);
    }
    tk_hub__http_free(h);
    free(url);
    return rc;
}

int tk_hub__upload(char **commit_out, int *created, const char *pkgdir, const char *registry, const char *key_path,
                   const char *compression, const char *token, tk_log_fn log, void *log_user)
{
    char tmpl[] = "/tmp/tk-upload.XXXXXX", org[65], name[65], *commit = NULL, *vdir = NULL, *reply = NULL, *tar = NULL;
    size_t tar_len = 0, reply_len = 0;
    const char *files[3] = {"manifest.json", "manifest.json.sig", NULL};
    struct archive *a = NULL;
    int rc;

    if (commit_out)
        *commit_out = NULL;
    if ((rc = registry_check(registry, token, "publishing to")) != TK_OK)
        return rc;
    if (!mkdtemp(tmpl))
        return tk__err_sys("cannot create a staging directory", "/tmp");
    /* the staging tree is private: its own messages ("published ... as") would mislead */
    if ((rc = tk_hub__publish(&commit, pkgdir, tmpl, key_path, compression, NULL, NULL)) != TK_OK ||
        (rc = find_version(&vdir, org, name, tmpl, commit)) != TK_OK)
        goto done;
    {
        char *pat = tk__fmt("%s/source.tar.*", vdir);
        glob_t g;
        memset(&g, 0, sizeof g);
        if (!pat || glob(pat, 0, NULL, &g) != 0 || g.gl_pathc != 1) {
            rc = tk__err(TK_ERR_INTERNAL, "no source archive in the staged version %s", vdir);
        } else {
            const char *base = strrchr(g.gl_pathv[0], '/') + 1;
            files[2] = tk__strdup(base);
        }
        globfree(&g);
        free(pat);
        if (rc != TK_OK)
            goto done;
        if (!files[2]) {
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
            goto done;
        }
    }
    /* the plain tar of the three files, in memory */
    {
        char *tar_path = tk__fmt("%s/upload.tar", tmpl);
        if (!tar_path || !(a = archive_write_new()) || archive_write_set_format_pax_restricted(a) != ARCHIVE_OK ||
            archive_write_open_filename(a, tar_path) != ARCHIVE_OK) {
            rc = tk__err(TK_ERR_IO, "cannot write the upload: %s", a ? archive_error_string(a) : "out of memory");
            free(tar_path);
            goto done;
        }
        for (int i = 0; i < 3 && rc == TK_OK; i++)
            rc = tar_add(a, vdir, files[i]);
        if (archive_write_close(a) != ARCHIVE_OK && rc == TK_OK)
            rc = tk__err(TK_ERR_IO, "cannot write the upload: %s", archive_error_string(a));
        if (rc == TK_OK)
            rc = tk__read_file(&tar, &tar_len, tar_path, (size_t)1 << 31);
        free(tar_path);
        if (rc != TK_OK)
            goto done;
    }
    tk__logf(log, log_user, TK_LOG_INFO, "uploading %s/%s (%zu bytes) to %s", org, name, tar_len, registry);
    char what[160];
    snprintf(what, sizeof what, "the registry refused %s/%s", org, name);
    if ((rc = registry_put(&reply, &reply_len, registry, token, "upload", org, name, "application/x-tar", tar, tar_len,
                           what)) != TK_OK)
        goto done;
    {
        json_t *j = json_loadb(reply, reply_len, 0, NULL);
        const char *c = json_string_value(json_object_get(j, "commit"));
        if (!c || strlen(c) != 40) {
            rc = tk__err(TK_ERR_NETWORK, "%s answered the upload without a commit: %.200s", registry,
                         reply ? reply : "");
        } else {
            if (created)
                *created = json_is_true(json_object_get(j, "created"));
            if (commit_out && !(*commit_out = tk__strdup(c)))
                rc = tk__err(TK_ERR_NOMEM, "out of memory");
        }
        json_decref(j);
    }
done:
    if (a)
        archive_write_free(a);
    free((char *)files[2]);
    free(commit);
    free(vdir);
    free(reply);
    free(tar);
    tk__rmtree(tmpl);
    return rc;
}

int tk_hub__yank_send(char moved_to[41], int *already, int *removed, const char *registry, const char *token,
                      const char *stmt, const char *sig)
{
    tk_hub_yank y;
    char *body = NULL, *reply = NULL, what[256];
    size_t reply_len = 0;
    moved_to[0] = '\0';
    *already = *removed = 0;
    int rc = tk_hub__yank_parse(&y, stmt, strlen(stmt));
    if (rc != TK_OK || (rc = registry_check(registry, token, "yanking on")) != TK_OK)
        return rc;
    json_t *j = json_pack("{s:s, s:s}", "statement", stmt, "signature", sig);
    body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!body)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    snprintf(what, sizeof what, "the registry refused the yank of %s %s", y.ref.name, y.version);
    rc = registry_put(&reply, &reply_len, registry, token, "yank", y.ref.org, y.ref.pkg, "application/json", body,
                      strlen(body), what);
    if (rc == TK_OK) {
        j = json_loadb(reply, reply_len, 0, NULL);
        *already = json_is_true(json_object_get(j, "already"));
        *removed = json_is_true(json_object_get(j, "branch_removed"));
        const char *m = json_string_value(json_object_get(j, "branch_commit"));
        if (m && strlen(m) == 40)
            memcpy(moved_to, m, 41);
        json_decref(j);
    }
    free(body);
    free(reply);
    return rc;
}
