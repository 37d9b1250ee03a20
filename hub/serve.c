/*
 * serve.c — tk serve: a registry server on libmicrohttpd over the static tree `tk publish --to`
 * writes (docs/package-format.md, "Registry layout"). See hub/serve.h for the wire protocol.
 *
 * Reads are the tree's files, served with the Hugging Face Hub's semantics (ETag = the file's sha256,
 * X-Repo-Commit, Range, If-None-Match, X-Error-Code). Every path is checked component by component
 * (no "..", no dot-files, no NUL or backslash) and opened beneath the root: openat2(RESOLVE_BENEATH)
 * where the kernel has it, else realpath and a prefix check, so neither a crafted URL nor a symlink in
 * the tree reaches outside it. Dot-names are never served: that hides the server's own state
 * (.tk-serve/), the publish lock and staging dirs. A read of a tree tk wrote takes a fast path (one
 * readlinkat for the branch, one openat2 for the file, the body sent with its headers); anything else,
 * errors included, the slow path with its exact error codes (see "the read fast path" below, and
 * bench/RESULTS.md for what each part cost).
 *
 * Uploads: PUT /api/upload/{org}/{name} with a bearer token bound to {org}. The body (a plain tar of the
 * version's three files) streams to a temp file under .tk-serve/tmp, then the server checks what a
 * client would: signature by a key trusted for the org on this server, manifest, name against the URL,
 * archive size and sha256, and the safe-unpack rules with every file's digest; and what tk publish
 * would: the manifest's keys and kernels (manifest/schema.c, manifest/validate.c). Only then does it
 * take the tree's publish lock and write the version with the rules of hub/publish.c (hub/tree.h:
 * stage, rename, move the branch, rewrite refs), so a refused upload writes nothing in the tree and a server killed mid-upload leaves no
 * partial version.
 *
 * Threads: libmicrohttpd's internal thread pool (poll(), not epoll). The handler never blocks on a slow
 * client; it blocks only on the file system and the publish flock. Nothing global is mutable: the
 * server's state is in tk_server.
 *
 * This file is the request path (routing, reads, uploads, yanks, the access log) and the server's
 * life; the admin state (tokens, trusted keys) is hub/serve_admin.c, the HTML page hub/serve_page.c,
 * and what they share hub/serve_int.h.
 */
#define _GNU_SOURCE /* strcasestr */
#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#ifdef SYS_openat2
#include <linux/openat2.h>
#endif

#include <jansson.h>
#include <microhttpd.h>

#include "cache/state.h"
#include "common/common.h"
#include "hub/archive.h"
#include "hub/hub.h"
#include "manifest/manifest.h"
#include "hub/serve.h"
#include "hub/serve_int.h"
#include "hub/tree.h"
#include "hub/sign.h"

/* ---- receiving an upload ------------------------------------------------------------------------ */

/* Unpacks the upload (a plain tar) into stage: exactly manifest.json, manifest.json.sig and one
 * source.tar.{gz,zst}, regular files within their size caps. *archive_name is borrowed static text. */
int tk_hub__serve_upload_untar(const char **archive_name, const char *tar_path, const char *stage, int64_t max)
{
    static const char *const allowed[] = {"manifest.json", "manifest.json.sig", "source.tar.gz", "source.tar.zst"};
    const int64_t caps[] = {TK_MANIFEST_MAX, SIG_MAX, max, max};
    int seen[4] = {0};
    int rc = TK_OK;
    *archive_name = NULL;
    struct archive *a = archive_read_new();
    if (!a)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    archive_read_support_format_tar(a);
    if (archive_read_open_filename(a, tar_path, 1 << 16) != ARCHIVE_OK) {
        rc = tk__err(TK_ERR_INVALID, "the upload is not a tar: %s", archive_error_string(a));
        goto done;
    }
    struct archive_entry *e;
    int r, nentries = 0;
    while ((r = archive_read_next_header(a, &e)) == ARCHIVE_OK) {
        const char *p = archive_entry_pathname(e);
        int k = -1;
        for (int i = 0; i < 4; i++)
            if (p && (!strcmp(p, allowed[i]) || (!strncmp(p, "./", 2) && !strcmp(p + 2, allowed[i]))))
                k = i;
        if (++nentries > 4 || k < 0 || seen[k]) {
            rc = tk__err(TK_ERR_INVALID,
                         "the upload holds '%s'; it must hold exactly manifest.json, "
                         "manifest.json.sig and the source archive, once each",
                         p ? p : "?");
            goto done;
        }
        if (archive_entry_filetype(e) != AE_IFREG || !archive_entry_size_is_set(e) || archive_entry_size(e) > caps[k]) {
            rc = tk__err(TK_ERR_INVALID, "'%s' in the upload is not a regular file within %lld bytes", allowed[k],
                         (long long)caps[k]);
            goto done;
        }
        seen[k] = 1;
        char *out = tk__path_join(stage, allowed[k]);
        int fd = out ? open(out, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644) : -1;
        if (fd < 0) {
            rc = out ? tk__err_sys("cannot create", out) : tk__err(TK_ERR_NOMEM, "out of memory");
            free(out);
            goto done;
        }
        const void *buf;
        size_t len;
        la_int64_t off;
        int64_t total = 0;
        while (rc == TK_OK && (r = archive_read_data_block(a, &buf, &len, &off)) == ARCHIVE_OK) {
            total += (int64_t)len;
            if (total > caps[k])
                rc = tk__err(TK_ERR_INVALID, "'%s' in the upload is larger than its header says", allowed[k]);
            else if (pwrite(fd, buf, len, off) != (ssize_t)len)
                rc = tk__err_sys("cannot write", out);
        }
        if (rc == TK_OK && r != ARCHIVE_EOF)
            rc = tk__err(TK_ERR_INVALID, "the upload is a damaged tar: %s", archive_error_string(a));
        if (rc == TK_OK && fsync(fd) != 0)
            rc = tk__err_sys("cannot sync", out);
        close(fd);
        free(out);
        if (rc != TK_OK)
            goto done;
    }
    if (r != ARCHIVE_EOF) {
        rc = tk__err(TK_ERR_INVALID, "the upload is a damaged tar: %s", archive_error_string(a));
        goto done;
    }
    if (!seen[0] || !seen[1] || seen[2] + seen[3] != 1) {
        rc = tk__err(TK_ERR_INVALID, "the upload must hold manifest.json, manifest.json.sig and one source "
                                     "archive (source.tar.gz or source.tar.zst)");
        goto done;
    }
    *archive_name = seen[2] ? allowed[2] : allowed[3];
done:
    archive_read_free(a);
    return rc;
}

/* The trusted public key of org with this key id, from .tk-serve/trust.json. */
static int trusted_key(char pubkey[TK_PUBKEY_LEN], const char *root, const char *org, const char *keyid)
{
    json_t *doc = NULL, *k;
    size_t i;
    int rc = tk_hub__serve_state_load(&doc, root, "trust.json", "keys");
    if (rc != TK_OK)
        return rc;
    rc = TK_ERR_NOT_FOUND;
    json_array_foreach(json_object_get(doc, "keys"), i, k) {
        const char *p = json_string_value(json_object_get(k, "pubkey"));
        if (rc != TK_OK && p && strlen(p) < TK_PUBKEY_LEN &&
            tk__streq(json_string_value(json_object_get(k, "org")), org) &&
            tk__streq(json_string_value(json_object_get(k, "keyid")), keyid)) {
            snprintf(pubkey, TK_PUBKEY_LEN, "%s", p);
            rc = TK_OK;
        }
    }
    json_decref(doc);
    return rc;
}

/* One upload on its way into the tree. Nothing is written under the tree's package folders until every
 * check has passed and the publish lock is held: the files are unpacked in .tk-serve/tmp. */
typedef struct {
    tk_server *s;
    const char *org, *pkg;
    char *tmpdir, *stage, *check;     /* .tk-serve/tmp, the unpacked upload, the archive unpacked */
    char *resolve_dir, *api_dir;      /* the package's folders in the tree */
    const char *archive_name;         /* source.tar.gz or source.tar.zst (static) */
    char *mtext, *stext;              /* manifest.json and its .sig */
    size_t mlen, slen;
    char asha[TK_SHA256_HEX];         /* the archive's sha256 */
    tk_manifest *m;
    int lock_fd;
} upload;

static void upload_free(upload *u)
{
    if (u->stage && tk__path_exists(u->stage))
        tk__rmtree(u->stage);
    if (u->check)
        tk__rmtree(u->check);
    if (u->lock_fd >= 0)
        close(u->lock_fd);
    tk_manifest__free(u->m);
    free(u->tmpdir);
    free(u->stage);
    free(u->check);
    free(u->resolve_dir);
    free(u->api_dir);
    free(u->mtext);
    free(u->stext);
}

/* Unpacks the upload's three files into a fresh stage folder under .tk-serve/tmp and reads the
 * manifest and its signature. */
static int upload_unpack(upload *u, const char *tar_path)
{
    int rc;
    u->resolve_dir = tk__fmt("%s/kernels/%s/%s/resolve", u->s->root, u->org, u->pkg);
    u->api_dir = tk__fmt("%s/api/kernels/%s/%s", u->s->root, u->org, u->pkg);
    u->tmpdir = tk__fmt("%s/" STATE_DIR "/tmp", u->s->root);
    u->stage = u->tmpdir ? tk__tmp_path(u->tmpdir, "upload") : NULL;
    u->check = u->tmpdir ? tk__tmp_path(u->tmpdir, "check") : NULL;
    if (!u->resolve_dir || !u->api_dir || !u->stage || !u->check)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    if ((rc = tk__mkdirs(u->stage, 0755)) != TK_OK || (rc = tk__mkdirs(u->check, 0700)) != TK_OK ||
        (rc = tk_hub__serve_upload_untar(&u->archive_name, tar_path, u->stage, u->s->max_upload)) != TK_OK)
        return rc;
    char *mpath = tk__path_join(u->stage, "manifest.json"), *spath = tk__path_join(u->stage, "manifest.json.sig");
    rc = !mpath || !spath ? tk__err(TK_ERR_NOMEM, "out of memory")
                          : tk__read_file(&u->mtext, &u->mlen, mpath, TK_MANIFEST_MAX);
    if (rc == TK_OK)
        rc = tk__read_file(&u->stext, &u->slen, spath, SIG_MAX);
    free(mpath);
    free(spath);
    return rc;
}

/* The signature: valid, by a key this server trusts for the org. */
static int upload_check_signature(upload *u)
{
    char keyid[TK_KEYID_LEN], sig_pub[TK_PUBKEY_LEN], trusted[TK_PUBKEY_LEN];
    uint8_t sig[64];
    int rc = tk_hub__sig_parse(keyid, sig_pub, sig, u->stext, u->slen);
    if (rc != TK_OK)
        return rc;
    if ((rc = trusted_key(trusted, u->s->root, u->org, keyid)) == TK_ERR_NOT_FOUND ||
        (rc == TK_OK && strcmp(trusted, sig_pub)))
        return tk__err(TK_ERR_UNTRUSTED,
                       "the signer %s is not trusted to publish for org '%s' on this server\n"
                       "HINT: on the server, run 'tk serve trust add %s %s --root DIR'",
                       keyid, u->org, u->org, sig_pub);
    return rc != TK_OK ? rc : tk_hub__verify(trusted, sig, u->mtext, u->mlen);
}

/* The manifest: well formed, for this package and archive, and passing the checks tk publish runs
 * before it signs and tk get runs before it installs: every key known (manifest/schema.c), every kernel's
 * fields, params and launch expressions, every source one of the package's files (manifest/validate.c).
 * A client older than those checks, or a hand-made upload, gets the publish-time error here. */
static int upload_check_manifest(upload *u, char version[32])
{
    int rc = tk_manifest__parse(&u->m, u->mtext, u->mlen);
    if (rc != TK_OK)
        return rc;
    snprintf(version, 32, "%s", u->m->version);
    if (strcmp(u->m->org, u->org) || strcmp(u->m->pkg, u->pkg))
        return tk__err(TK_ERR_MANIFEST, "the manifest is for %s, but the upload went to %s/%s", u->m->name, u->org,
                       u->pkg);
    if (strcmp(u->m->archive.path, u->archive_name))
        return tk__err(TK_ERR_MANIFEST, "the manifest names the archive '%s', but the upload holds '%s'",
                       u->m->archive.path, u->archive_name);
    if ((rc = tk_manifest__schema_check(u->mtext, u->mlen, "manifest.json", 1)) != TK_OK ||
        (rc = tk_manifest__validate_json(u->m->root, NULL, NULL)) != TK_OK)
        return tk__err_wrap(rc, "%s %s: not published", u->m->name, u->m->version);
    return TK_OK;
}

/* The archive: the size and sha256 the manifest states, and it unpacks safely to exactly the
 * manifest's files with their digests. */
static int upload_check_archive(upload *u)
{
    char *apath = tk__path_join(u->stage, u->archive_name);
    int64_t asize = 0;
    int rc = apath ? tk__sha256_file(u->asha, &asize, apath) : tk__err(TK_ERR_NOMEM, "out of memory");
    if (rc == TK_OK && (asize != u->m->archive.size || strcmp(u->asha, u->m->archive.sha256)))
        rc = tk__err(TK_ERR_DIGEST,
                     "%s does not match the manifest (size %lld, sha256 %s; the manifest says "
                     "size %lld, sha256 %s)",
                     u->archive_name, (long long)asize, u->asha, (long long)u->m->archive.size, u->m->archive.sha256);
    if (rc == TK_OK)
        rc = tk_hub__archive_extract(apath, u->check, u->m->files, u->m->nfiles, NULL);
    free(apath);
    return rc;
}

/* Takes the tree's publish lock (.tk-publish.lock, as tk publish does) for the rest of the upload. */
static int upload_lock(upload *u)
{
    char *lock_path = tk__path_join(u->s->root, ".tk-publish.lock");
    int rc = TK_OK;
    if (!lock_path)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    if ((u->lock_fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644)) < 0 || flock(u->lock_fd, LOCK_EX) != 0)
        rc = tk__err_sys("cannot lock the registry tree", lock_path);
    free(lock_path);
    return rc;
}

/* Under the lock: where the version goes on its branch. 1 when the branch's head is this very manifest
 * (commit set: nothing to write), 0 when it is new and newer than the head (*head: the parent commit,
 * or NULL for a new branch), or an error: not newer, or a yanked version. */
static int upload_place(upload *u, char commit[41], char **head)
{
    char branch[24], *head_text = NULL, *head_version = NULL;
    size_t hn = 0;
    int rc = 0;
    snprintf(branch, sizeof branch, "v%d", u->m->major);
    if ((*head = tk_hub__tree_branch_head(u->resolve_dir, branch)) != NULL) {
        char *hp = tk__fmt("%s/%s/manifest.json", u->resolve_dir, *head);
        if (hp && tk__read_file(&head_text, &hn, hp, TK_MANIFEST_MAX) == TK_OK && hn == u->mlen &&
            memcmp(head_text, u->mtext, u->mlen) == 0) {
            snprintf(commit, 41, "%s", *head);
            rc = 1;
        } else if ((head_version = tk_hub__tree_commit_version(u->resolve_dir, *head)) != NULL &&
                   tk_state__version_cmp(u->m->version, head_version) <= 0) {
            rc = tk__err(TK_ERR_ROLLBACK,
                         "%s %s is not newer than %s, the head of branch %s\n"
                         "HINT: raise 'version' in kernel.json (for example to the next patch version)",
                         u->m->name, u->m->version, head_version, branch);
        }
        free(hp);
    }
    if (rc == 0 && tk_hub__tree_is_yanked(u->resolve_dir, u->m->version))
        rc = tk__err(TK_ERR_ROLLBACK,
                     "%s %s was yanked; a yanked version is never published again\n"
                     "HINT: raise 'version' in kernel.json",
                     u->m->name, u->m->version);
    free(head_text);
    free(head_version);
    return rc;
}

/* Under the lock: the version's folder moves into place by rename under its commit id, then its
 * revision document, the branch link and the refs, with the rules of hub/publish.c (hub/tree.h). */
static int upload_write(upload *u, char commit[41], const char *head)
{
    char msha[TK_SHA256_HEX], ssha[TK_SHA256_HEX], branch[24];
    tk__sha256_hex(msha, u->mtext, u->mlen);
    tk__sha256_hex(ssha, u->stext, u->slen);
    const char *names[3] = {"manifest.json", "manifest.json.sig", u->archive_name};
    const char *shas[3] = {msha, ssha, u->asha};
    snprintf(branch, sizeof branch, "v%d", u->m->major);
    int rc = tk_hub__tree_commit_id(commit, head, names, shas);
    char *final_dir = rc == TK_OK ? tk__path_join(u->resolve_dir, commit) : NULL;
    char *revdir = tk__path_join(u->api_dir, "revision");
    char *revpath = revdir && rc == TK_OK ? tk__path_join(revdir, commit) : NULL;
    json_t *doc = NULL;
    if (rc == TK_OK && (!final_dir || !revpath))
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
    /* the .etag links nginx reads X-Repo-Commit and ETag from go in before the folder is visible */
    if (rc == TK_OK && (rc = tk__mkdirs(u->resolve_dir, 0755)) == TK_OK && !tk__path_exists(final_dir) &&
        ((rc = tk_hub__tree_etag_links(u->stage)) != TK_OK || rename(u->stage, final_dir) != 0))
        rc = rc != TK_OK ? rc : tk__err_sys("cannot move the new version into place", final_dir);
    if (rc == TK_OK && (rc = tk__fsync_dir(u->resolve_dir)) == TK_OK &&
        !(doc = tk_hub__tree_info_doc(u->m->name, commit, u->archive_name, u->m->version, u->m->major, head)))
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
    if (rc == TK_OK && (rc = tk__mkdirs(revdir, 0755)) == TK_OK &&
        (rc = tk_hub__tree_write_json(revpath, doc)) == TK_OK &&
        (rc = tk_hub__tree_commit_hub_docs(u->api_dir, u->resolve_dir, commit)) == TK_OK && /* listing first */
        (rc = tk_hub__tree_set_symlink(u->resolve_dir, branch, commit)) == TK_OK)
        rc = tk_hub__tree_update_refs(u->s->root, u->api_dir, u->resolve_dir, u->m->name, u->m->major, commit,
                                      u->archive_name);
    json_decref(doc);
    free(final_dir);
    free(revdir);
    free(revpath);
    return rc;
}

/* Under the lock, the same manifest again: nothing new, but a tree from an older tk gets its commits'
 * parents and the files huggingface_hub reads, as tk publish does. */
static int upload_refresh(upload *u)
{
    int rc = tk_hub__tree_backfill_parents(u->api_dir, u->resolve_dir);
    return rc == TK_OK ? tk_hub__tree_write_hub_docs(u->api_dir, u->resolve_dir) : rc;
}

/* Verifies the upload in tar_path for org/pkg and writes it into the tree. *created: 0 when the
 * same manifest already heads its branch. */
static int receive_version(char commit[41], int *created, char version[32], tk_server *s, const char *org,
                           const char *pkg, const char *tar_path)
{
    upload u = {.s = s, .org = org, .pkg = pkg, .lock_fd = -1};
    char *head = NULL;
    int placed = 0, rc;
    *created = 0;
    commit[0] = version[0] = '\0';
    if ((rc = upload_unpack(&u, tar_path)) == TK_OK && (rc = upload_check_signature(&u)) == TK_OK &&
        (rc = upload_check_manifest(&u, version)) == TK_OK && (rc = upload_check_archive(&u)) == TK_OK &&
        (rc = upload_lock(&u)) == TK_OK && (placed = upload_place(&u, commit, &head)) >= 0)
        rc = placed == 1 ? upload_refresh(&u) : upload_write(&u, commit, head);
    if (placed < 0)
        rc = placed;
    if (rc == TK_OK)
        *created = placed == 0;
    else
        commit[0] = '\0';
    free(head);
    upload_free(&u);
    return rc;
}

/* ---- responses ----------------------------------------------------------------------------------- */

enum MHD_Result tk_hub__serve_queue(struct MHD_Connection *c, req *r, unsigned status, struct MHD_Response *resp)
{
    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, "Server", "tk/" TK_VERSION_STRING);
    r->status = status;
    enum MHD_Result ok = MHD_queue_response(c, status, resp);
    MHD_destroy_response(resp);
    return ok;
}

static struct MHD_Response *mem_response(const char *body, size_t n, const char *type)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(n, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (resp && type)
        MHD_add_response_header(resp, "Content-Type", type);
    return resp;
}

/* An error the Hub's way: status, X-Error-Code, and {"error": msg}. */
static enum MHD_Result reply_error(struct MHD_Connection *c, req *r, unsigned status, const char *code, const char *fmt,
                                   ...) TK_PRINTF(5, 6);
static enum MHD_Result reply_error(struct MHD_Connection *c, req *r, unsigned status, const char *code, const char *fmt,
                                   ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    json_t *j = json_pack("{s:s}", "error", msg);
    char *body = j ? json_dumps(j, 0) : NULL;
    json_decref(j);
    struct MHD_Response *resp = body ? mem_response(body, strlen(body), "application/json") : NULL;
    free(body);
    if (resp && code)
        MHD_add_response_header(resp, "X-Error-Code", code);
    if (resp && status == MHD_HTTP_UNAUTHORIZED)
        MHD_add_response_header(resp, "WWW-Authenticate", "Bearer realm=\"tk\"");
    return tk_hub__serve_queue(c, r, status, resp);
}

static void blob_unref(void *p)
{
    blob *b = p;
    if (b && __atomic_sub_fetch(&b->refs, 1, __ATOMIC_ACQ_REL) == 0)
        free(b);
}

/* Reads size bytes of fd from its start. */
static int read_exact(int fd, char *buf, int64_t size)
{
    int64_t got = 0;
    while (got < size) {
        ssize_t n = pread(fd, buf + got, (size_t)(size - got), got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return tk__err_sys("cannot read", "a file of the tree");
        if (n == 0) /* files in the tree are replaced by rename, never cut short */
            return tk__err(TK_ERR_IO, "a file of the tree was cut short while it was read");
        got += n;
    }
    return TK_OK;
}

/* The sha256 of a streamed file. */
static int sha_of_fd(char out[TK_SHA256_HEX], int fd)
{
    tk_sha256 *h = NULL;
    int rc = tk__sha256_new(&h);
    char buf[1 << 16];
    off_t off = 0;
    while (rc == TK_OK) {
        ssize_t n = pread(fd, buf, sizeof buf, off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            rc = tk__err_sys("cannot read", "file");
        if (n <= 0)
            break;
        off += n;
        rc = tk__sha256_update(h, buf, (size_t)n);
    }
    if (rc == TK_OK)
        rc = tk__sha256_final_hex(h, out);
    tk__sha256_free(h);
    return rc;
}

/* The sha256 of a regular file, cached by (dev, inode, size, mtime): files in the tree are replaced
 * by rename, never rewritten in place. A file of at most SMALL_BODY bytes is cached with its bytes,
 * and *body (when body is not NULL) receives a reference to them (blob_unref), so that a read of a
 * small file costs no read at all. */
static int file_sha(tk_server *s, char out[TK_SHA256_HEX], int fd, const struct stat *st, blob **body)
{
    etag_slot *slot = &s->etags[(st->st_ino ^ st->st_dev) % ETAG_SLOTS];
    if (body)
        *body = NULL;
    pthread_mutex_lock(&s->mu);
    int hit = slot->ino == st->st_ino && slot->dev == st->st_dev && slot->size == st->st_size &&
              slot->mtime.tv_sec == st->st_mtim.tv_sec && slot->mtime.tv_nsec == st->st_mtim.tv_nsec;
    if (hit) {
        memcpy(out, slot->sha, TK_SHA256_HEX);
        if (body && (*body = slot->body) != NULL)
            __atomic_add_fetch(&slot->body->refs, 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&s->mu);
    if (hit)
        return TK_OK;
    blob *b = NULL;
    int rc;
    if (st->st_size <= SMALL_BODY) {
        if (!(b = malloc(sizeof *b + (size_t)st->st_size + 1)))
            return tk__err(TK_ERR_NOMEM, "out of memory");
        b->refs = 1; /* the cache's */
        if ((rc = read_exact(fd, b->data, st->st_size)) == TK_OK)
            rc = tk__sha256_hex(out, b->data, (size_t)st->st_size);
    } else {
        rc = sha_of_fd(out, fd);
    }
    if (rc != TK_OK) {
        free(b);
        return rc;
    }
    if (b && body) {
        b->refs++;
        *body = b;
    }
    pthread_mutex_lock(&s->mu);
    blob *old = slot->body;
    slot->dev = st->st_dev;
    slot->ino = st->st_ino;
    slot->size = st->st_size;
    slot->mtime = st->st_mtim;
    memcpy(slot->sha, out, TK_SHA256_HEX);
    slot->body = b;
    pthread_mutex_unlock(&s->mu);
    blob_unref(old);
    return TK_OK;
}

/* rel must already be checked component by component; this resolves it and refuses anything that
 * lands outside the root. Returns the malloc'd real path, or NULL (errno: ENOENT, EACCES for outside). */
static char *inside_root(tk_server *s, const char *rel)
{
    char *path = tk__fmt("%s/%s", s->root, rel);
    char *real = path ? realpath(path, NULL) : NULL;
    free(path);
    size_t n = strlen(s->root);
    if (real && !(strncmp(real, s->root, n) == 0 && (real[n] == '/' || real[n] == '\0'))) {
        free(real);
        errno = EACCES;
        return NULL;
    }
    return real;
}

/* Does If-None-Match list this etag (quoted)? */
int tk_hub__serve_etag_matches(const char *inm, const char *etag)
{
    size_t n = strlen(etag);
    for (const char *p = inm; *p;) {
        while (*p == ' ' || *p == ',' || *p == '\t')
            p++;
        if (*p == '*')
            return 1;
        if (!strncmp(p, "W/", 2))
            p += 2;
        if (!strncmp(p, etag, n) && (p[n] == '\0' || p[n] == ',' || p[n] == ' '))
            return 1;
        while (*p && *p != ',')
            p++;
    }
    return 0;
}

/* Parses a single "bytes=a-b" / "bytes=a-" / "bytes=-n" range. 1: a range; 0: ignore the header
 * (absent, malformed or several ranges: serve the whole file); -1: unsatisfiable. */
int tk_hub__serve_parse_range(const char *h, int64_t size, int64_t *from, int64_t *to)
{
    if (!h || strncmp(h, "bytes=", 6) != 0 || strchr(h, ','))
        return 0;
    const char *p = h + 6, *dash = strchr(p, '-');
    if (!dash)
        return 0;
    char a[32] = "", b[32] = "";
    size_t na = (size_t)(dash - p), nb = strlen(dash + 1);
    if (na >= sizeof a || nb >= sizeof b)
        return 0;
    memcpy(a, p, na);
    memcpy(b, dash + 1, nb + 1);
    int64_t x = -1, y = -1;
    if ((na && tk__parse_i64(a, 0, INT64_MAX, &x) != 0) || (nb && tk__parse_i64(b, 0, INT64_MAX, &y) != 0) ||
        (!na && !nb))
        return 0;
    if (!na) { /* suffix: the last y bytes */
        if (y == 0 || size == 0)
            return -1;
        *from = y >= size ? 0 : size - y;
        *to = size - 1;
        return 1;
    }
    if (nb && y < x)
        return 0;
    if (x >= size)
        return -1;
    *from = x;
    *to = (!nb || y >= size) ? size - 1 : y;
    return 1;
}

/* Opens root/rel read-only, never outside the root. One openat2(RESOLVE_BENEATH) from the root's
 * descriptor where the kernel has it (no_symlinks: RESOLVE_NO_SYMLINKS too, for the fast paths below);
 * else, and when the kernel will not resolve it beneath the root (an absolute symlink that lands inside,
 * a rename racing the walk), realpath and the prefix check of inside_root. -1 with errno otherwise. */
static int open_in_root(tk_server *s, const char *rel, int no_symlinks)
{
#ifdef SYS_openat2
    if (s->root_fd >= 0) {
        struct open_how how;
        memset(&how, 0, sizeof how);
        how.flags = O_RDONLY | O_CLOEXEC; /* a last symlink too stays beneath the root */
        how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS | (no_symlinks ? RESOLVE_NO_SYMLINKS : 0);
        int fd = (int)syscall(SYS_openat2, s->root_fd, rel, &how, sizeof how);
        if (fd >= 0 || no_symlinks || (errno != EXDEV && errno != EAGAIN && errno != ENOSYS && errno != EPERM))
            return fd;
    }
#endif
    if (no_symlinks) {
        errno = ENOSYS;
        return -1;
    }
    char *real = inside_root(s, rel);
    int fd = real ? open(real, O_RDONLY | O_NOFOLLOW | O_CLOEXEC) : -1;
    free(real);
    return fd;
}

/* The body of a response: len bytes from off of the file, which is fd (taken over) and, for a small
 * file, body (its bytes from the etag cache; the reference is taken over too). A small body goes from
 * memory, so that libmicrohttpd sends it and its headers in one writev, one TCP segment on loopback; a
 * big one by sendfile after the headers. (Two sends a response, each pushing a segment, cost half of
 * nginx's throughput on small files: nginx corks its headers onto the sendfile.) */
static struct MHD_Response *body_response(int fd, blob *body, int64_t off, int64_t len)
{
    if (!body) /* MHD owns fd from here, also when it fails. */
        return MHD_create_response_from_fd_at_offset64((uint64_t)len, fd, (uint64_t)off);
    close(fd);
    struct MHD_Response *resp =
        MHD_create_response_from_buffer_with_free_callback_cls((size_t)len, body->data + off, blob_unref, body);
    if (!resp)
        blob_unref(body);
    return resp;
}

/* Answers a GET or HEAD with the open regular file fd (which it takes over): ETag (the sha256, cached),
 * If-None-Match, Range, the body by sendfile. */
static enum MHD_Result serve_fd(tk_server *s, struct MHD_Connection *c, req *r, int fd, const struct stat *st,
                                const char *type, const char *commit, int immutable)
{
    char sha[TK_SHA256_HEX], etag[TK_SHA256_HEX + 2];
    blob *body = NULL;
    if (file_sha(s, sha, fd, st, &body) != TK_OK) {
        close(fd);
        return reply_error(c, r, MHD_HTTP_INTERNAL_SERVER_ERROR, "InternalError", "%s", tk_last_error());
    }
    etag[0] = '"';
    memcpy(etag + 1, sha, TK_SHA256_HEX - 1);
    memcpy(etag + TK_SHA256_HEX, "\"", 2);
    const char *inm = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "If-None-Match");
    int64_t size = st->st_size, from = 0, to = size - 1;
    int ranged =
        inm && tk_hub__serve_etag_matches(inm, etag)
            ? 0
            : tk_hub__serve_parse_range(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Range"), size, &from, &to);
    struct MHD_Response *resp;
    unsigned status;
    char cr[96];
    if (inm && tk_hub__serve_etag_matches(inm, etag)) {
        close(fd);
        blob_unref(body);
        resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        status = MHD_HTTP_NOT_MODIFIED;
    } else if (ranged < 0) {
        close(fd);
        blob_unref(body);
        snprintf(cr, sizeof cr, "bytes */%lld", (long long)size);
        resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        if (resp)
            MHD_add_response_header(resp, "Content-Range", cr);
        status = MHD_HTTP_RANGE_NOT_SATISFIABLE;
    } else {
        resp = body_response(fd, body, from, to - from + 1);
        status = ranged ? MHD_HTTP_PARTIAL_CONTENT : MHD_HTTP_OK;
        if (resp && ranged) {
            snprintf(cr, sizeof cr, "bytes %lld-%lld/%lld", (long long)from, (long long)to, (long long)size);
            MHD_add_response_header(resp, "Content-Range", cr);
        }
        if (resp)
            MHD_add_response_header(resp, "Content-Type", type);
        r->bytes = resp ? (uint64_t)(to - from + 1) : 0;
    }
    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, "ETag", etag);
    MHD_add_response_header(resp, "Accept-Ranges", "bytes");
    MHD_add_response_header(resp, "Cache-Control", immutable ? "public, max-age=31536000, immutable" : "no-cache");
    if (commit)
        MHD_add_response_header(resp, "X-Repo-Commit", commit);
    return tk_hub__serve_queue(c, r, status, resp);
}

/* Serves root/rel. missing_code names the X-Error-Code for a missing file. */
static enum MHD_Result serve_file(tk_server *s, struct MHD_Connection *c, req *r, const char *rel,
                                  const char *missing_code, const char *type, const char *commit, int immutable)
{
    int fd = open_in_root(s, rel, 0);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        if (fd >= 0)
            close(fd);
        return reply_error(c, r, MHD_HTTP_NOT_FOUND, missing_code, "%s not found", rel);
    }
    return serve_fd(s, c, r, fd, &st, type, commit, immutable);
}

/* ---- the read fast path --------------------------------------------------------------------------
 * A tree tk writes has exactly one symlink on a read's way, the branch (resolve/v1 -> <commit>). The
 * fast path reads that link with one readlinkat and opens the file with one openat2 that refuses every
 * symlink; a file served this way passed every check of the slow path (the repository, the revision
 * and the file exist, inside the root). When anything is off (a missing file, a symlink elsewhere, no
 * openat2) it answers nothing and the caller takes the slow path, which gives the exact error. */

/* Joins the NULL-terminated parts with '/' into out; 0 when it does not fit. (No printf: see
 * access_log.) */
static int join_rel(char *out, size_t cap, ...)
{
    va_list ap;
    size_t n = 0;
    const char *part;
    int ok = 1;
    va_start(ap, cap);
    while (ok && (part = va_arg(ap, const char *)) != NULL) {
        size_t k = strlen(part);
        if (n + (n > 0) + k >= cap) {
            ok = 0;
            break;
        }
        if (n)
            out[n++] = '/';
        memcpy(out + n, part, k);
        n += k;
    }
    va_end(ap);
    out[ok ? n : 0] = '\0';
    return ok;
}

/* rev of org/pkg as a commit: a branch link's 40-hex target, or rev itself when it is 40 hex and not a
 * link. 0 when the fast path cannot tell. */
static int fast_commit(tk_server *s, char commit[41], const char *org, const char *pkg, const char *rev)
{
    char rel[400], buf[64];
    if (s->root_fd < 0 || !join_rel(rel, sizeof rel, "kernels", org, pkg, "resolve", rev, (char *)NULL))
        return 0;
    ssize_t n = readlinkat(s->root_fd, rel, buf, sizeof buf - 1);
    if (n == 40) {
        buf[40] = '\0';
        if (!tk__is_hex(buf, 40))
            return 0;
        memcpy(commit, buf, 41);
        return 1;
    }
    if (n < 0 && errno == EINVAL && tk__is_hex(rev, 40)) {
        memcpy(commit, rev, 40);
        commit[40] = '\0';
        return 1;
    }
    return 0;
}

/* Serves rel when the fast path can open it; 0 (nothing queued) when not. */
static int fast_file(tk_server *s, struct MHD_Connection *c, req *r, const char *rel, const char *type,
                     const char *commit, int immutable, enum MHD_Result *ret)
{
    int fd = open_in_root(s, rel, 1);
    struct stat st;
    if (fd < 0)
        return 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return 0;
    }
    *ret = serve_fd(s, c, r, fd, &st, type, commit, immutable);
    return 1;
}

/* A URL path component the tree may hold: no dot-names (.., ., .tk-serve), nothing odd. */
int tk_hub__serve_component_ok(const char *p, size_t n)
{
    if (n == 0 || n > 255 || p[0] == '.')
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)p[i];
        if (ch < 0x20 || ch == 0x7f || ch == '\\' || ch == ':')
            return 0;
    }
    return 1;
}

/* Splits a decoded path into at most max components; 0 when a component is refused. */
int tk_hub__serve_split_path(char **parts, int max, int *n, char *path)
{
    *n = 0;
    char *p = path;
    if (*p != '/')
        return 0;
    p++;
    if (*p == '\0')
        return 1;
    for (;;) {
        char *slash = strchr(p, '/');
        size_t len = slash ? (size_t)(slash - p) : strlen(p);
        if (*n >= max || !tk_hub__serve_component_ok(p, len))
            return 0;
        parts[(*n)++] = p;
        if (!slash)
            return 1;
        *slash = '\0';
        p = slash + 1;
    }
}

/* Resolves rev (a branch name or a 40-hex commit) of org/pkg. 1: found; 0: repo missing; -1: rev
 * missing. */
static int resolve_rev(tk_server *s, char commit[41], const char *org, const char *pkg, const char *rev)
{
    char *dir = tk__fmt("%s/kernels/%s/%s/resolve", s->root, org, pkg);
    int found = 0;
    if (dir && tk__is_dir(dir)) {
        found = -1;
        char *p = tk__path_join(dir, rev);
        struct stat st;
        if (p && tk__is_hex(rev, 40) && lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) {
            snprintf(commit, 41, "%s", rev);
            found = 1;
        } else if (p) {
            char *head = tk_hub__tree_branch_head(dir, rev);
            if (head && tk__is_hex(head, 40)) {
                snprintf(commit, 41, "%s", head);
                char *hp = tk__path_join(dir, head);
                found = hp && lstat(hp, &st) == 0 && S_ISDIR(st.st_mode) ? 1 : -1;
                free(hp);
            }
            free(head);
        }
        free(p);
    }
    free(dir);
    return found;
}

static int repo_exists(tk_server *s, const char *org, const char *pkg)
{
    char *a = tk__fmt("%s/api/kernels/%s/%s", s->root, org, pkg);
    char *k = tk__fmt("%s/kernels/%s/%s/resolve", s->root, org, pkg);
    int ok = (a && tk__is_dir(a)) || (k && tk__is_dir(k));
    free(a);
    free(k);
    return ok;
}

int tk_hub__serve_name_ok(char org[65], char pkg[65], const char *o, const char *p)
{
    char name[160];
    if (strlen(o) > 64 || strlen(p) > 64)
        return 0;
    snprintf(name, sizeof name, "%s/%s", o, p);
    return tk_manifest__name_check(name, org, pkg) == TK_OK;
}

/* /api/kernels/{org}/{name}/tree/{rev}: the files of a revision. */
static enum MHD_Result serve_tree(tk_server *s, struct MHD_Connection *c, req *r, const char *org, const char *pkg,
                                  const char *commit)
{
    char *dir = tk__fmt("%s/kernels/%s/%s/resolve/%s", s->root, org, pkg, commit);
    DIR *d = dir ? opendir(dir) : NULL;
    json_t *list = json_array();
    struct dirent *e;
    int bad = !d || !list;
    while (!bad && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char *p = tk__path_join(dir, e->d_name);
        int fd = p ? open(p, O_RDONLY | O_NOFOLLOW | O_CLOEXEC) : -1;
        struct stat st;
        char sha[TK_SHA256_HEX];
        if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && file_sha(s, sha, fd, &st, NULL) == TK_OK)
            json_array_append_new(list, json_pack("{s:s, s:s, s:I, s:s}", "type", "file", "path", e->d_name, "size",
                                                  (json_int_t)st.st_size, "oid", sha));
        if (fd >= 0)
            close(fd);
        free(p);
    }
    if (d)
        closedir(d);
    free(dir);
    if (bad) {
        json_decref(list);
        return reply_error(c, r, MHD_HTTP_NOT_FOUND, "RevisionNotFound", "revision %s not found", commit);
    }
    /* readdir order is arbitrary: sort by path for a stable answer. */
    size_t n = json_array_size(list);
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0; j--) {
            json_t *a = json_array_get(list, j - 1), *b = json_array_get(list, j);
            if (strcmp(json_string_value(json_object_get(a, "path")), json_string_value(json_object_get(b, "path"))) <=
                0)
                break;
            json_incref(a);
            json_array_set(list, j - 1, b);
            json_array_set_new(list, j, a);
        }
    char *body = json_dumps(list, JSON_INDENT(2));
    json_decref(list);
    struct MHD_Response *resp = body ? mem_response(body, strlen(body), "application/json") : NULL;
    r->bytes = body ? strlen(body) : 0;
    free(body);
    if (resp)
        MHD_add_response_header(resp, "X-Repo-Commit", commit);
    return tk_hub__serve_queue(c, r, MHD_HTTP_OK, resp);
}

/* ---- routing ------------------------------------------------------------------------------------- */

/* kernels/{org}/{pkg}/resolve/{commit}/{p[5]}/...; 0 when it does not fit. */
static int resolved_rel(char *rel, size_t cap, const char *org, const char *pkg, const char *commit, char **p, int n)
{
    if (!join_rel(rel, cap, "kernels", org, pkg, "resolve", commit, (char *)NULL))
        return 0;
    size_t off = strlen(rel);
    for (int i = 5; i < n; i++) {
        size_t k = strlen(p[i]);
        if (off + 1 + k >= cap)
            return 0;
        rel[off++] = '/';
        memcpy(rel + off, p[i], k + 1);
        off += k;
    }
    return 1;
}

/* The fast path of /api/kernels/{org}/{pkg}[/versions|/refs|/revision/{rev}]. */
static int fast_api(tk_server *s, struct MHD_Connection *c, req *r, const char *org, const char *pkg, char **p, int n,
                    enum MHD_Result *ret)
{
    char rel[400], commit[41];
    const char *doc = n == 4                                                           ? "index.json"
                      : n == 5 && (!strcmp(p[4], "versions") || !strcmp(p[4], "refs")) ? p[4]
                                                                                       : NULL;
    if (doc)
        return join_rel(rel, sizeof rel, "api/kernels", org, pkg, doc, (char *)NULL) &&
               fast_file(s, c, r, rel, "application/json", NULL, 0, ret);
    struct stat st; /* the commit's folder exists, as the slow path's resolve_rev requires */
    if (n != 6 || strcmp(p[4], "revision") || !fast_commit(s, commit, org, pkg, p[5]) ||
        !join_rel(rel, sizeof rel, "kernels", org, pkg, "resolve", commit, (char *)NULL) ||
        fstatat(s->root_fd, rel, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode) ||
        !join_rel(rel, sizeof rel, "api/kernels", org, pkg, "revision", p[5], (char *)NULL))
        return 0;
    return fast_file(s, c, r, rel, "application/json", commit, tk__is_hex(p[5], 40), ret);
}

static enum MHD_Result route_read(tk_server *s, struct MHD_Connection *c, req *r, char **p, int n)
{
    char org[65], pkg[65], commit[41], rel[1200];
    if (n == 0)
        return tk_hub__serve_page(s, c, r);
    if (n == 1 && !strcmp(p[0], "index.json"))
        return serve_file(s, c, r, "index.json", "EntryNotFound", "application/json", NULL, 0);
    enum MHD_Result ret;
    if (n >= 4 && !strcmp(p[0], "api") && !strcmp(p[1], "kernels")) {
        if (tk_hub__serve_name_ok(org, pkg, p[2], p[3]) && fast_api(s, c, r, org, pkg, p, n, &ret))
            return ret;
        if (!tk_hub__serve_name_ok(org, pkg, p[2], p[3]) || !repo_exists(s, org, pkg))
            return reply_error(c, r, MHD_HTTP_NOT_FOUND, "RepoNotFound", "repository %s/%s not found", p[2], p[3]);
        if (n == 4) {
            snprintf(rel, sizeof rel, "api/kernels/%s/%s/index.json", org, pkg);
            return serve_file(s, c, r, rel, "RepoNotFound", "application/json", NULL, 0);
        }
        if (n == 5 && !strcmp(p[4], "versions")) { /* every commit with its version (hub/versions.c) */
            snprintf(rel, sizeof rel, "api/kernels/%s/%s/versions", org, pkg);
            return serve_file(s, c, r, rel, "EntryNotFound", "application/json", NULL, 0);
        }
        if (n == 5 && !strcmp(p[4], "refs")) {
            snprintf(rel, sizeof rel, "api/kernels/%s/%s/refs", org, pkg);
            return serve_file(s, c, r, rel, "RepoNotFound", "application/json", NULL, 0);
        }
        if (n >= 6 && (!strcmp(p[4], "revision") || !strcmp(p[4], "tree"))) {
            if (resolve_rev(s, commit, org, pkg, p[5]) != 1)
                return reply_error(c, r, MHD_HTTP_NOT_FOUND, "RevisionNotFound", "revision %s of %s/%s not found", p[5],
                                   org, pkg);
            if (n == 6 && !strcmp(p[4], "revision")) {
                snprintf(rel, sizeof rel, "api/kernels/%s/%s/revision/%s", org, pkg, p[5]);
                return serve_file(s, c, r, rel, "RevisionNotFound", "application/json", commit, tk__is_hex(p[5], 40));
            }
            if (n == 6)
                return serve_tree(s, c, r, org, pkg, commit);
            return reply_error(c, r, MHD_HTTP_NOT_FOUND, "EntryNotFound", "revisions are flat: no folder %s", p[6]);
        }
        return reply_error(c, r, MHD_HTTP_NOT_FOUND, "EntryNotFound", "no such endpoint");
    }
    if (n == 5 && !strcmp(p[0], "kernels") && !strcmp(p[3], "yanked")) { /* signed yank statements */
        if (!tk_hub__serve_name_ok(org, pkg, p[1], p[2]) || !repo_exists(s, org, pkg))
            return reply_error(c, r, MHD_HTTP_NOT_FOUND, "RepoNotFound", "repository %s/%s not found", p[1], p[2]);
        snprintf(rel, sizeof rel, "kernels/%s/%s/yanked/%s", org, pkg, p[4]);
        return serve_file(s, c, r, rel, "EntryNotFound", "application/json", NULL, 0);
    }
    if (n >= 5 && !strcmp(p[0], "kernels") && !strcmp(p[3], "resolve")) {
        if (tk_hub__serve_name_ok(org, pkg, p[1], p[2]) && n > 5 && fast_commit(s, commit, org, pkg, p[4]) &&
            resolved_rel(rel, sizeof rel, org, pkg, commit, p, n) &&
            fast_file(s, c, r, rel, "application/octet-stream", commit, tk__is_hex(p[4], 40), &ret))
            return ret;
        if (!tk_hub__serve_name_ok(org, pkg, p[1], p[2]) || !repo_exists(s, org, pkg))
            return reply_error(c, r, MHD_HTTP_NOT_FOUND, "RepoNotFound", "repository %s/%s not found", p[1], p[2]);
        if (resolve_rev(s, commit, org, pkg, p[4]) != 1)
            return reply_error(c, r, MHD_HTTP_NOT_FOUND, "RevisionNotFound", "revision %s of %s/%s not found", p[4],
                               org, pkg);
        if (n == 5)
            return reply_error(c, r, MHD_HTTP_NOT_FOUND, "EntryNotFound", "no file named");
        if (!resolved_rel(rel, sizeof rel, org, pkg, commit, p, n))
            return reply_error(c, r, MHD_HTTP_NOT_FOUND, "EntryNotFound", "path too long");
        return serve_file(s, c, r, rel, "EntryNotFound", "application/octet-stream", commit, tk__is_hex(p[4], 40));
    }
    return reply_error(c, r, MHD_HTTP_NOT_FOUND, "EntryNotFound", "no such endpoint");
}

/* First call of an upload: auth, size; then the body streams to a temp file. */
static enum MHD_Result upload_begin(tk_server *s, struct MHD_Connection *c, req *r, char **p, int n)
{
    if (n != 4 || !tk_hub__serve_name_ok(r->org, r->pkg, p[2], p[3]))
        return reply_error(c, r, MHD_HTTP_NOT_FOUND, "RepoNotFound", "upload to /api/upload/{org}/{name}");
    r->yank = !strcmp(p[1], "yank");
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!auth || strncasecmp(auth, "Bearer ", 7) != 0 || strlen(auth + 7) == 0 || strlen(auth + 7) > 256)
        return reply_error(
            c, r, MHD_HTTP_UNAUTHORIZED, "Unauthorized",
            "uploads need 'Authorization: Bearer <token>'\nHINT: 'tk serve token add --org %s' makes one", r->org);
    char org[65];
    int rc = tk_hub__serve_token_org(org, s->root, auth + 7);
    if (rc == TK_ERR_NOT_FOUND)
        return reply_error(c, r, MHD_HTTP_UNAUTHORIZED, "Unauthorized", "the token is not valid on this server");
    if (rc != TK_OK)
        return reply_error(c, r, MHD_HTTP_INTERNAL_SERVER_ERROR, "InternalError", "%s", tk_last_error());
    if (strcmp(org, r->org) != 0)
        return reply_error(c, r, MHD_HTTP_FORBIDDEN, "Forbidden", "this token may publish to org '%s' only, not '%s'",
                           org, r->org);
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    int64_t len = 0;
    if (cl && tk__parse_i64(cl, 0, INT64_MAX, &len) == 0 && len > s->max_upload)
        return reply_error(c, r, MHD_HTTP_CONTENT_TOO_LARGE, "PayloadTooLarge",
                           "the upload is %lld bytes; this server takes at most %lld", (long long)len,
                           (long long)s->max_upload);
    char *tmpdir = tk__fmt("%s/" STATE_DIR "/tmp", s->root);
    if (!tmpdir || tk__mkdirs(tmpdir, 0700) != TK_OK || !(r->tmp = tk__tmp_path(tmpdir, "upload")) ||
        (r->fd = open(r->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600)) < 0) {
        free(tmpdir);
        return reply_error(c, r, MHD_HTTP_INTERNAL_SERVER_ERROR, "InternalError", "cannot store the upload");
    }
    free(tmpdir);
    r->upload = 1;
    return MHD_YES;
}

/* Refuses an upload or a yank with the HTTP status and X-Error-Code of its tk status (the codes the
 * client maps back in hub/upload.c). */
static enum MHD_Result reply_refusal(struct MHD_Connection *c, req *r, int rc, const char *msg)
{
    switch (rc) {
    case TK_ERR_INVALID: return reply_error(c, r, MHD_HTTP_BAD_REQUEST, "BadRequest", "%s", msg);
    case TK_ERR_UNTRUSTED: return reply_error(c, r, MHD_HTTP_FORBIDDEN, "UntrustedSigner", "%s", msg);
    case TK_ERR_SIGNATURE: return reply_error(c, r, MHD_HTTP_UNPROCESSABLE_CONTENT, "SignatureInvalid", "%s", msg);
    case TK_ERR_MANIFEST: return reply_error(c, r, MHD_HTTP_UNPROCESSABLE_CONTENT, "ManifestInvalid", "%s", msg);
    case TK_ERR_DIGEST: return reply_error(c, r, MHD_HTTP_UNPROCESSABLE_CONTENT, "DigestMismatch", "%s", msg);
    case TK_ERR_ARCHIVE: return reply_error(c, r, MHD_HTTP_UNPROCESSABLE_CONTENT, "ArchiveInvalid", "%s", msg);
    case TK_ERR_NOT_FOUND: return reply_error(c, r, MHD_HTTP_NOT_FOUND, "EntryNotFound", "%s", msg);
    case TK_ERR_ROLLBACK: return reply_error(c, r, MHD_HTTP_CONFLICT, "VersionConflict", "%s", msg);
    case TK_ERR_NOSPACE: return reply_error(c, r, MHD_HTTP_INSUFFICIENT_STORAGE, "NoSpace", "%s", msg);
    default: return reply_error(c, r, MHD_HTTP_INTERNAL_SERVER_ERROR, "InternalError", "%s", msg);
    }
}

/* A yank: the body is {"statement": "<yank.json text>", "signature": "<its .sig text>"}. The statement
 * must be signed by a key this server trusts for the org, and name the package of the URL. */
static enum MHD_Result yank_finish(tk_server *s, struct MHD_Connection *c, req *r)
{
    char *body = NULL, moved[41] = "", keyid[TK_KEYID_LEN], pub[TK_PUBKEY_LEN], trusted[TK_PUBKEY_LEN];
    size_t len = 0;
    uint8_t sig[64];
    int already = 0, removed = 0, rc = tk__read_file(&body, &len, r->tmp, 1 << 20);
    json_t *j = rc == TK_OK ? json_loadb(body, len, 0, NULL) : NULL;
    const char *stmt = json_string_value(json_object_get(j, "statement"));
    const char *stext = json_string_value(json_object_get(j, "signature"));
    tk_hub_yank y;
    if (rc == TK_OK && (!stmt || !stext))
        rc = tk__err(TK_ERR_INVALID, "a yank is {\"statement\": ..., \"signature\": ...} (what 'tk yank' sends)");
    if (rc == TK_OK && (rc = tk_hub__sig_parse(keyid, pub, sig, stext, strlen(stext))) == TK_OK) {
        if ((rc = trusted_key(trusted, s->root, r->org, keyid)) == TK_ERR_NOT_FOUND ||
            (rc == TK_OK && strcmp(trusted, pub)))
            rc = tk__err(TK_ERR_UNTRUSTED, "the signer %s is not trusted for org '%s' on this server", keyid, r->org);
        else if (rc == TK_OK && (rc = tk_hub__verify(trusted, sig, stmt, strlen(stmt))) == TK_OK &&
                 (rc = tk_hub__yank_parse(&y, stmt, strlen(stmt))) == TK_OK &&
                 (strcmp(y.ref.org, r->org) || strcmp(y.ref.pkg, r->pkg)))
            rc = tk__err(TK_ERR_MANIFEST, "the statement yanks %s, but was sent to %s/%s", y.ref.name, r->org, r->pkg);
    }
    if (rc == TK_OK)
        rc = tk_hub__tree_yank(moved, &already, &removed, s->root, stmt, strlen(stmt), stext, strlen(stext));
    json_t *reply = NULL;
    if (rc == TK_OK) {
        say(s, TK_LOG_INFO, "yanked %s %s%s%s", y.ref.name, y.version,
            moved[0]  ? "; branch moved back to "
            : removed ? "; its branch removed (no other version of its major)"
                      : "",
            moved);
        reply = json_pack("{s:s, s:s, s:b, s:s?, s:b}", "name", y.ref.name, "version", y.version, "already", already,
                          "branch_commit", moved[0] ? moved : NULL, "branch_removed", removed);
    }
    json_decref(j);
    free(body);
    if (rc != TK_OK) {
        const char *msg = tk_last_error();
        say(s, TK_LOG_WARN, "yank in %s/%s refused: %s", r->org, r->pkg, msg);
        return reply_refusal(c, r, rc, msg);
    }
    char *text = reply ? json_dumps(reply, 0) : NULL;
    json_decref(reply);
    struct MHD_Response *resp = text ? mem_response(text, strlen(text), "application/json") : NULL;
    free(text);
    return tk_hub__serve_queue(c, r, MHD_HTTP_OK, resp);
}

static enum MHD_Result upload_finish(tk_server *s, struct MHD_Connection *c, req *r)
{
    close(r->fd);
    r->fd = -1;
    if (r->overflow)
        return reply_error(c, r, MHD_HTTP_CONTENT_TOO_LARGE, "PayloadTooLarge", "the upload exceeds %lld bytes",
                           (long long)s->max_upload);
    if (r->yank)
        return yank_finish(s, c, r);
    char commit[41], version[32];
    int created = 0;
    int rc = receive_version(commit, &created, version, s, r->org, r->pkg, r->tmp);
    if (rc != TK_OK) {
        const char *msg = tk_last_error();
        say(s, TK_LOG_WARN, "upload to %s/%s refused: %s", r->org, r->pkg, msg);
        return reply_refusal(c, r, rc, msg);
    }
    say(s, TK_LOG_INFO, "%s %s/%s %s as %s", created ? "published" : "already had", r->org, r->pkg, version, commit);
    char name[140];
    snprintf(name, sizeof name, "%s/%s", r->org, r->pkg);
    json_t *j =
        json_pack("{s:s, s:s, s:s, s:b}", "commit", commit, "name", name, "version", version, "created", created);
    char *body = j ? json_dumps(j, 0) : NULL;
    json_decref(j);
    struct MHD_Response *resp = body ? mem_response(body, strlen(body), "application/json") : NULL;
    free(body);
    if (resp)
        MHD_add_response_header(resp, "X-Repo-Commit", commit);
    return tk_hub__serve_queue(c, r, created ? MHD_HTTP_CREATED : MHD_HTTP_OK, resp);
}

/* Answers a GET/HEAD/other request whose headers (and any body) have been read. */
static enum MHD_Result dispatch(tk_server *s, struct MHD_Connection *c, req *r, int first)
{
    /* The URL arrives undecoded (see no_unescape): refuse an encoded NUL, then decode. */
    for (const char *q = r->url; *q; q++)
        if (q[0] == '%' && q[1] == '0' && q[2] == '0')
            return reply_error(c, r, MHD_HTTP_BAD_REQUEST, "BadRequest", "the path holds a NUL");
    char *path = tk__strdup(r->url);
    if (!path)
        return MHD_NO;
    path[MHD_http_unescape(path)] = '\0';
    char *parts[32];
    int n = 0;
    enum MHD_Result ret;
    const char *m = r->method;
    int is_get = !strcmp(m, MHD_HTTP_METHOD_GET) || !strcmp(m, MHD_HTTP_METHOD_HEAD);
    int is_put = !strcmp(m, MHD_HTTP_METHOD_PUT) || !strcmp(m, MHD_HTTP_METHOD_POST);
    int ok = tk_hub__serve_split_path(parts, 32, &n, path);
    int upload = ok && n >= 2 && !strcmp(parts[0], "api") && (!strcmp(parts[1], "upload") || !strcmp(parts[1], "yank"));
    if (first && !(upload && is_put)) {
        ret = MHD_YES; /* answer once the request is complete, so the connection can be kept alive */
    } else if (!ok) {
        ret = reply_error(c, r, MHD_HTTP_NOT_FOUND, "EntryNotFound", "no such path");
    } else if (upload) {
        ret = is_put ? upload_begin(s, c, r, parts, n)
                     : reply_error(c, r, MHD_HTTP_METHOD_NOT_ALLOWED, "MethodNotAllowed", "use PUT to upload");
    } else if (is_get) {
        ret = route_read(s, c, r, parts, n);
    } else {
        ret = reply_error(c, r, MHD_HTTP_METHOD_NOT_ALLOWED, "MethodNotAllowed", "%s is not supported here", m);
    }
    free(path);
    return ret;
}

/* Appends text (at most cap-1 bytes in all) to line at *n. */
static void line_put(char *line, size_t cap, size_t *n, const char *text)
{
    size_t k = strlen(text);
    if (k > cap - 1 - *n)
        k = cap - 1 - *n;
    memcpy(line + *n, text, k);
    *n += k;
    line[*n] = '\0';
}

static void line_u64(char *line, size_t cap, size_t *n, uint64_t v)
{
    char d[24];
    size_t i = sizeof d;
    d[--i] = '\0';
    do
        d[--i] = (char)('0' + v % 10);
    while ((v /= 10) && i);
    line_put(line, cap, n, d + i);
}

/* One access-log line a request: CLIENT "METHOD URL" STATUS BYTES 1.2ms[ (how)]. Built without printf:
 * a process that links libquadmath (OpenBLAS does) sends every printf down glibc's slow positional path,
 * which cost a tenth of the server's time under load. */
static void access_log(tk_server *s, const req *r, const char *how)
{
    if (!s->log)
        return;
    char line[1100];
    size_t n = 0;
    uint64_t tenths = (uint64_t)((tk__now_ms() - r->t0) * 10 + 0.5);
    line[0] = '\0';
    line_put(line, sizeof line, &n, r->client);
    line_put(line, sizeof line, &n, " \"");
    line_put(line, sizeof line, &n, r->method);
    line_put(line, sizeof line, &n, " ");
    line_put(line, sizeof line, &n, r->url ? r->url : "-");
    line_put(line, sizeof line, &n, "\" ");
    line_u64(line, sizeof line, &n, r->status);
    line_put(line, sizeof line, &n, " ");
    line_u64(line, sizeof line, &n, r->bytes);
    line_put(line, sizeof line, &n, " ");
    line_u64(line, sizeof line, &n, tenths / 10);
    line_put(line, sizeof line, &n, (const char[]){'.', (char)('0' + tenths % 10), 'm', 's', '\0'});
    line_put(line, sizeof line, &n, how);
    s->log(s->log_user, TK_LOG_INFO, line);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    tk_server *s = cls;
    req *r = *con_cls;
    if (r && r->upload) {
        if (*upload_data_size) {
            size_t n = *upload_data_size;
            *upload_data_size = 0;
            if (r->overflow)
                return MHD_NO; /* a chunked body past the cap: drop the connection */
            r->got += (int64_t)n;
            if (r->got > s->max_upload) {
                r->overflow = 1;
                r->status = MHD_HTTP_CONTENT_TOO_LARGE;
                return MHD_NO;
            }
            if (tk__write_all(r->fd, upload_data, n, r->tmp) != TK_OK)
                return MHD_NO;
            return MHD_YES;
        }
        return upload_finish(s, c, r);
    }
    if (r) {
        if (*upload_data_size) { /* a body nobody asked for: discard it */
            *upload_data_size = 0;
            return MHD_YES;
        }
        return r->status ? MHD_NO : dispatch(s, c, r, 0);
    }
    if (!(r = calloc(1, sizeof *r)))
        return MHD_NO;
    *con_cls = r;
    r->fd = -1;
    r->t0 = tk__now_ms();
    size_t mlen = 0;
    line_put(r->method, sizeof r->method, &mlen, method);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    const struct sockaddr *sa = ci ? ci->client_addr : NULL;
    if (!sa || !inet_ntop(sa->sa_family,
                          sa->sa_family == AF_INET6 ? (const void *)&((const struct sockaddr_in6 *)sa)->sin6_addr
                                                    : (const void *)&((const struct sockaddr_in *)sa)->sin_addr,
                          r->client, sizeof r->client))
        memcpy(r->client, "-", 2);
    if (!(r->url = tk__strdup(url)))
        return MHD_NO;
    return dispatch(s, c, r, 1);
}

static size_t no_unescape(void *cls, struct MHD_Connection *c, char *uri) { return strlen(uri); }

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    tk_server *s = cls;
    req *r = *con_cls;
    if (!r)
        return;
    *con_cls = NULL;
    if (r->fd >= 0)
        close(r->fd);
    if (r->tmp)
        unlink(r->tmp);
    const char *how = toe == MHD_REQUEST_TERMINATED_COMPLETED_OK      ? ""
                      : toe == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED ? " (timed out)"
                      : toe == MHD_REQUEST_TERMINATED_CLIENT_ABORT    ? " (client went away)"
                                                                      : " (closed)";
    access_log(s, r, how);
    free(r->tmp);
    free(r->url);
    free(r);
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    tk_server *s = cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n')
        msg[--n] = '\0';
    if (s->log)
        s->log(s->log_user, TK_LOG_WARN, msg);
}

/* The connection limit, over all threads. libmicrohttpd splits MHD_OPTION_CONNECTION_LIMIT evenly over
 * its thread pool, and its threads take new connections unevenly: with 200 clients and a limit of 256,
 * a thread over its 128 closed connections while the other had room (wrk counted thousands of read
 * errors). So each thread may take all of them, and this callback refuses a connection past the total;
 * a burst of accepts can pass it by at most the number of threads. */
static enum MHD_Result on_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
    tk_server *s = cls;
    if (__atomic_load_n(&s->conns, __ATOMIC_RELAXED) < s->max_conns)
        return MHD_YES;
    int64_t now = tk__now(), last = __atomic_load_n(&s->refused_at, __ATOMIC_RELAXED);
    if (now != last && __atomic_compare_exchange_n(&s->refused_at, &last, now, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        say(s, TK_LOG_WARN, "%u connections open, the most allowed (--max-connections): refusing new ones",
            s->max_conns);
    return MHD_NO;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    tk_server *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED)
        __atomic_add_fetch(&s->conns, 1, __ATOMIC_RELAXED);
    else
        __atomic_sub_fetch(&s->conns, 1, __ATOMIC_RELAXED);
}

/* ---- lifecycle ----------------------------------------------------------------------------------- */

int tk_server_new(tk_server **out, const tk_serve_opts *opts)
{
    if (out)
        *out = NULL;
    if (!out || !opts || !opts->root || opts->version < 1)
        return tk__err(TK_ERR_INVALID, "tk_server_new: out and opts with a root are required");
    const char *listen = opts->listen ? opts->listen : "127.0.0.1:8080";
    int64_t port;
    struct addrinfo *ai = NULL;
    int rc0 = tk__listen_addr(listen, &ai, &port);
    if (rc0 != TK_OK)
        return rc0;

    int rc = TK_OK;
    tk_server *s = calloc(1, sizeof *s);
    if (!s) {
        freeaddrinfo(ai);
        return tk__err(TK_ERR_NOMEM, "out of memory");
    }
    s->magic = SERVER_MAGIC;
    s->root_fd = -1;
    pthread_mutex_init(&s->mu, NULL);
    s->max_upload = opts->max_upload > 0 ? opts->max_upload : (int64_t)512 << 20;
    s->log = opts->log;
    s->log_user = opts->log_user;
    char *tmpdir = NULL;
    if ((rc = tk__mkdirs(opts->root, 0755)) != TK_OK)
        goto fail;
    if (!(s->root = realpath(opts->root, NULL))) {
        rc = tk__err_sys("cannot resolve the registry root", opts->root);
        goto fail;
    }
    s->root_fd = open(s->root, O_PATH | O_DIRECTORY | O_CLOEXEC); /* -1: every read takes the slow path */
    /* Uploads a killed server left behind are garbage: they were never part of the tree. */
    if (!(tmpdir = tk__fmt("%s/" STATE_DIR "/tmp", s->root))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto fail;
    }
    tk__rmtree(tmpdir);
    /* poll(), not epoll: libmicrohttpd's epoll loop stalls a thread's first 128 ready connections
     * for up to the connection timeout (serve/model_server.c says more) */
    unsigned flags = MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_ERROR_LOG;
    unsigned threads = opts->threads ? opts->threads : 4;
    s->max_conns = opts->max_connections ? opts->max_connections : 256;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    s->d = MHD_start_daemon(flags, (uint16_t)port, on_accept, s, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log,
                            s, MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_THREAD_POOL_SIZE, threads,
                            MHD_OPTION_CONNECTION_LIMIT, s->max_conns > 65536 ? s->max_conns : s->max_conns * threads,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, s, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                            (unsigned)(opts->max_per_ip ? opts->max_per_ip : 32), MHD_OPTION_CONNECTION_TIMEOUT,
                            (unsigned)(opts->timeout_s ? opts->timeout_s : 30),
                            /* The request line and headers must fit here (16 KiB takes 15,000 bytes of headers; nginx's
         * default is 8 KiB a line); more gets 431. libmicrohttpd zeroes the whole pool after every
         * request, so a bigger one costs on each: 64 KiB took 8 % of the server's time under load. */
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(16 << 10), MHD_OPTION_NOTIFY_COMPLETED,
                            on_completed, s, MHD_OPTION_UNESCAPE_CALLBACK, no_unescape, s, MHD_OPTION_END);
    if (!s->d) {
        rc = tk__err(TK_ERR_IO,
                     "cannot listen on %s (address in use, or not permitted)\n"
                     "HINT: pick another port with --listen HOST:PORT",
                     listen);
        goto fail;
    }
    freeaddrinfo(ai);
    free(tmpdir);
    *out = s;
    return TK_OK;
fail:
    freeaddrinfo(ai);
    free(tmpdir);
    tk_server_free(s);
    return rc;
}

int tk_server_port(const tk_server *s)
{
    if (!s || s->magic != SERVER_MAGIC || !s->d)
        return 0;
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    return info ? info->port : 0;
}

void tk_server_free(tk_server *s)
{
    if (!s || s->magic != SERVER_MAGIC)
        return;
    if (s->d)
        MHD_stop_daemon(s->d);
    for (size_t i = 0; i < ETAG_SLOTS; i++)
        blob_unref(s->etags[i].body);
    pthread_mutex_destroy(&s->mu);
    if (s->root_fd >= 0)
        close(s->root_fd);
    free(s->root);
    s->magic = 0;
    free(s);
}
