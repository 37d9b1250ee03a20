/*
 * archive.c — deterministic source archives and their safe extraction, on libarchive.
 *
 * Creation streams each listed file into a pax-restricted tar with every varying field pinned (mtime,
 * owner, names, mode), through gzip without its timestamp or zstd, into a temp file that is fsynced and
 * renamed over the target: the same files always give the same bytes, and a reader sees the old archive
 * or the new one.
 *
 * Extraction trusts nothing in the archive. libarchive only parses (tar, gzip, zstd; never its disk
 * writer); tk decides what is written. Every entry passes an allowlist before a byte is written, sizes
 * are checked against the limits from the header and again as data streams, and every file is created
 * by walking from a descriptor of dest_dir with O_NOFOLLOW, so no path in the archive can reach outside
 * it. Any failure removes everything written, leaving dest_dir empty.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <archive.h>
#include <archive_entry.h>

#include "common/common.h"
#include "hub/archive.h"

#define MAX_PATH_LEN 1024
#define MAX_DEPTH 64
/* Unpacked bytes always allowed, whatever the ratio: a tiny archive of a compressible file is no bomb. */
#define RATIO_FLOOR ((int64_t)1 << 20)
#define CHUNK (1 << 16)

#define HINT_HOSTILE                                                                                                   \
    "\nHINT: the source archive is corrupt or breaks tk's unpack rules; report it to the package's publisher"

/* ---- shared rules ----------------------------------------------------------------------------- */

/* Checks a relative archive path; NULL when valid, else why not. `dir` allows one trailing '/'. */
static const char *path_problem(const char *p, int dir)
{
    size_t n = strlen(p);
    if (dir && n > 1 && p[n - 1] == '/')
        n--;
    if (n == 0)
        return "the path is empty";
    if (n > MAX_PATH_LEN)
        return "the path is longer than 1024 bytes";
    if (p[0] == '/')
        return "the path is absolute";
    int depth = 1;
    size_t start = 0;
    for (size_t i = 0; i <= n; i++) {
        unsigned char c = i < n ? (unsigned char)p[i] : '/';
        if (c == '\\')
            return "the path has a backslash";
        if (c < 0x20 || c == 0x7f)
            return "the path has a control character";
        if (c != '/')
            continue;
        size_t len = i - start;
        if (len == 0)
            return "the path has an empty component";
        if (len == 1 && p[start] == '.')
            return "the path has a '.' component";
        if (len == 2 && p[start] == '.' && p[start + 1] == '.')
            return "the path has a '..' component";
        if (len > 255)
            return "a path component is longer than 255 bytes";
        if (i < n && ++depth > MAX_DEPTH)
            return "the path is nested more than 64 levels deep";
        start = i + 1;
    }
    return NULL;
}

/* Maps libarchive's errno to a tk status: disk full and out of memory keep their meaning. */
static int arc_status(struct archive *a, int fallback)
{
    int e = archive_errno(a);
    if (e == ENOSPC || e == EDQUOT || e == EFBIG)
        return TK_ERR_NOSPACE;
    if (e == ENOMEM)
        return TK_ERR_NOMEM;
    return fallback;
}

static const char *arc_msg(struct archive *a)
{
    const char *s = archive_error_string(a);
    return s ? s : "unknown libarchive error";
}

static int arc_err(struct archive *a, int fallback, const char *what, const char *path)
{
    int code = arc_status(a, fallback);
    if (code == TK_ERR_NOSPACE)
        return tk__err(code, "%s '%s': %s\nHINT: free some disk space (or point TK_HOME elsewhere) and retry", what,
                       path, arc_msg(a));
    return tk__err(code, "%s '%s': %s%s", what, path, arc_msg(a), code == TK_ERR_ARCHIVE ? HINT_HOSTILE : "");
}

static int cmp_str_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* ---- creation --------------------------------------------------------------------------------- */

/* Appends src_dir/name as entry `name`: its bytes must stay what fstat said while they are read. */
static int add_file(struct archive *a, struct archive_entry *e, const char *src_dir, const char *name, char *buf)
{
    int rc = TK_OK;
    char *full = tk__path_join(src_dir, name);
    if (!full)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    int fd = open(full, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0) {
        rc = errno == ELOOP ? tk__err(TK_ERR_INVALID, "cannot archive '%s': it is a symlink", full)
                            : tk__err_sys("cannot open", full);
        goto done;
    }
    if (fstat(fd, &st) != 0) {
        rc = tk__err_sys("cannot stat", full);
        goto done;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = tk__err(TK_ERR_INVALID, "cannot archive '%s': not a regular file", full);
        goto done;
    }
    archive_entry_clear(e);
    archive_entry_copy_pathname(e, name);
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0644);
    archive_entry_set_size(e, (int64_t)st.st_size);
    archive_entry_set_mtime(e, 0, 0);
    archive_entry_set_uid(e, 0);
    archive_entry_set_gid(e, 0);
    if (archive_write_header(a, e) != ARCHIVE_OK) {
        rc = arc_err(a, TK_ERR_IO, "cannot write the archive entry for", full);
        goto done;
    }
    int64_t left = (int64_t)st.st_size;
    for (;;) {
        ssize_t r = read(fd, buf, CHUNK);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            rc = tk__err_sys("cannot read", full);
            goto done;
        }
        if (r == 0)
            break;
        if (r > left) {
            rc = tk__err(TK_ERR_IO, "'%s' grew while it was being archived; retry", full);
            goto done;
        }
        if (archive_write_data(a, buf, (size_t)r) != r) {
            rc = arc_err(a, TK_ERR_IO, "cannot write the archive data of", full);
            goto done;
        }
        left -= r;
    }
    if (left != 0)
        rc = tk__err(TK_ERR_IO, "'%s' shrank while it was being archived; retry", full);
done:
    if (fd >= 0)
        close(fd);
    free(full);
    return rc;
}

int tk_hub__archive_create(const char *out_path, const char *src_dir, const char *const *files, size_t nfiles,
                           const char *compression)
{
    int rc = TK_OK, fd = -1;
    struct archive *a = NULL;
    struct archive_entry *e = NULL;
    char *dir = NULL, *tmp = NULL, *buf = NULL;
    const char **sorted = NULL;

    if (!out_path || !src_dir || (nfiles && !files))
        return tk__err(TK_ERR_INVALID, "archive_create: out_path, src_dir and files are required");
    if (!compression)
        compression = "gz";
    int zst = strcmp(compression, "zst") == 0;
    if (!zst && strcmp(compression, "gz") != 0)
        return tk__err(TK_ERR_INVALID, "unknown archive compression '%s'\nHINT: use \"gz\" or \"zst\"", compression);
    /* Refuse here what extraction would refuse, so tk never publishes an archive it cannot unpack. */
    for (size_t i = 0; i < nfiles; i++) {
        const char *why = files[i] ? path_problem(files[i], 0) : "the path is NULL";
        if (why)
            return tk__err(TK_ERR_INVALID, "cannot archive '%s': %s", files[i] ? files[i] : "", why);
    }
    if (nfiles) {
        if (!(sorted = malloc(nfiles * sizeof *sorted)))
            return tk__err(TK_ERR_NOMEM, "out of memory");
        memcpy(sorted, files, nfiles * sizeof *sorted);
        qsort(sorted, nfiles, sizeof *sorted, cmp_str_ptr);
        for (size_t i = 1; i < nfiles; i++)
            if (strcmp(sorted[i - 1], sorted[i]) == 0) {
                rc = tk__err(TK_ERR_INVALID, "cannot archive '%s' twice", sorted[i]);
                goto done;
            }
    }

    if (!(dir = tk__dirname(out_path)) || !(tmp = tk__tmp_path(dir, "archive")) || !(buf = malloc(CHUNK)) ||
        !(a = archive_write_new()) || !(e = archive_entry_new())) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    /* hdrcharset=BINARY stores names as raw bytes: no locale conversion, so no locale in the output. */
    if (archive_write_set_format_pax_restricted(a) != ARCHIVE_OK ||
        archive_write_set_format_option(a, "pax", "hdrcharset", "BINARY") != ARCHIVE_OK) {
        rc = arc_err(a, TK_ERR_INTERNAL, "cannot set up the tar writer for", out_path);
        goto done;
    }
    if (zst) {
        if (archive_write_add_filter_zstd(a) != ARCHIVE_OK) {
            rc = tk__err(TK_ERR_UNSUPPORTED, "this libarchive cannot write zstd: %s", arc_msg(a));
            goto done;
        }
    } else if (archive_write_add_filter_gzip(a) != ARCHIVE_OK ||
               archive_write_set_filter_option(a, "gzip", "timestamp", NULL) != ARCHIVE_OK) {
        /* A NULL value is libarchive's "!timestamp": the gzip header's MTIME stays 0. */
        rc = tk__err(TK_ERR_UNSUPPORTED, "this libarchive cannot write gzip without a timestamp: %s", arc_msg(a));
        goto done;
    }

    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = tk__err_sys("cannot create", tmp);
        goto done;
    }
    if (archive_write_open_fd(a, fd) != ARCHIVE_OK) {
        rc = arc_err(a, TK_ERR_IO, "cannot start the archive", tmp);
        goto done;
    }
    for (size_t i = 0; i < nfiles; i++)
        if ((rc = add_file(a, e, src_dir, files[i], buf)) != TK_OK)
            goto done;
    if (archive_write_close(a) != ARCHIVE_OK) {
        rc = arc_err(a, TK_ERR_IO, "cannot finish the archive", tmp);
        goto done;
    }
    if (fsync(fd) != 0) {
        rc = tk__err_sys("cannot fsync", tmp);
        goto done;
    }
    int c = close(fd);
    fd = -1;
    if (c != 0) {
        rc = tk__err_sys("cannot close", tmp);
        goto done;
    }
    if (rename(tmp, out_path) != 0) {
        rc = tk__err_sys("cannot rename into place", out_path);
        goto done;
    }
    rc = tk__fsync_dir(dir);
done:
    if (a)
        archive_write_free(a); /* after a failure this may flush into fd: the temp file is removed below */
    archive_entry_free(e);
    if (fd >= 0)
        close(fd);
    if (rc != TK_OK && tmp)
        unlink(tmp);
    free(sorted);
    free(buf);
    free(tmp);
    free(dir);
    return rc;
}

/* ---- extraction ------------------------------------------------------------------------------- */

typedef struct {
    const char *path;
    size_t i; /* index into the caller's expect[] */
} xref;

typedef struct {
    const char *dest;                /* for messages */
    int root;                        /* dest_dir, opened O_DIRECTORY|O_NOFOLLOW */
    const tk_manifest_file *exp; /* caller's array */
    size_t nexp;
    xref *order;                     /* exp sorted by path */
    unsigned char *seen;
} xstate;

static int cmp_ref(const void *a, const void *b) { return strcmp(((const xref *)a)->path, ((const xref *)b)->path); }

/* Index into exp of `path`, or -1. */
static ssize_t find_expected(const xstate *x, const char *path)
{
    size_t lo = 0, hi = x->nexp;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(path, x->order[mid].path);
        if (c == 0)
            return (ssize_t)x->order[mid].i;
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return -1;
}

static int sys_err_at(const char *what, const char *dest, const char *rel)
{
    int e = errno;
    char full[MAX_PATH_LEN + 4200];
    snprintf(full, sizeof full, "%s/%s", dest, rel);
    errno = e;
    return tk__err_sys(what, full);
}

/* Creates (if needed) and opens directory `name` in dirfd, never through a symlink. `rel` is the
 * directory's path in the archive, for messages. */
static int open_subdir(int *out, int dirfd, const char *name, const xstate *x, const char *rel)
{
    *out = -1;
    if (mkdirat(dirfd, name, 0755) != 0 && errno != EEXIST)
        return sys_err_at("cannot create directory", x->dest, rel);
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOTDIR || errno == ELOOP)
            return tk__err(TK_ERR_ARCHIVE,
                           "archive entry '%s' must be a directory, but a file by that "
                           "name is already in the archive" HINT_HOSTILE,
                           rel);
        return sys_err_at("cannot open directory", x->dest, rel);
    }
    *out = fd;
    return TK_OK;
}

/* Opens the directory that holds `path`'s last component, creating the levels above it. *leaf points
 * into path. *out is x->root itself for a top-level name: close it only when it differs. */
static int open_parent(int *out, const char **leaf, char *path, const xstate *x)
{
    int cur = x->root, rc = TK_OK;
    char *p = path;
    for (char *slash; (slash = strchr(p, '/')) != NULL; p = slash + 1) {
        int next = -1;
        *slash = '\0';
        rc = open_subdir(&next, cur, p, x, path);
        *slash = '/';
        if (cur != x->root)
            close(cur);
        if (rc != TK_OK)
            return rc;
        cur = next;
    }
    *out = cur;
    *leaf = p;
    return TK_OK;
}

/* Removes everything inside dirfd (which stays open and in place), never following a symlink. */
static void remove_children(int dirfd)
{
    int fd = dup(dirfd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0)
            close(fd);
        return;
    }
    rewinddir(d);
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        if (unlinkat(dirfd, de->d_name, 0) == 0)
            continue;
        int sub = openat(dirfd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub >= 0) {
            remove_children(sub);
            close(sub);
            unlinkat(dirfd, de->d_name, AT_REMOVEDIR);
        }
    }
    closedir(d);
}

static int dir_is_empty(int dirfd, int *empty)
{
    int fd = dup(dirfd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        errno = e;
        return -1;
    }
    rewinddir(d);
    struct dirent *de;
    *empty = 1;
    while ((de = readdir(d)) != NULL)
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
            *empty = 0;
            break;
        }
    closedir(d);
    return 0;
}

typedef struct {
    int64_t total;     /* file bytes unpacked so far (declared, then streamed) */
    int64_t ratio_cap; /* most unpacked bytes the ratio allows */
} budget;

/* Streams the current entry's data into a new file at `path` (already validated), hashing it. */
static int extract_file(struct archive *a, const xstate *x, char *path, int64_t size, budget *bud,
                        const tk_hub_unpack_limits *lim, tk_sha256 *h, char hex[TK_SHA256_HEX])
{
    int rc, dfd = -1, fd = -1;
    const char *leaf = NULL;
    if ((rc = open_parent(&dfd, &leaf, path, x)) != TK_OK)
        return rc;
    fd = openat(dfd, leaf, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
        if (errno == EEXIST || errno == ELOOP || errno == EISDIR)
            rc = tk__err(TK_ERR_ARCHIVE, "archive entry '%s' appears twice (or clashes with a directory)" HINT_HOSTILE,
                         path);
        else
            rc = sys_err_at("cannot create", x->dest, path);
        goto done;
    }
    int64_t written = 0;
    for (;;) {
        const void *block = NULL;
        size_t len = 0;
        la_int64_t off = 0;
        int r = archive_read_data_block(a, &block, &len, &off);
        if (r == ARCHIVE_EOF)
            break;
        if (r != ARCHIVE_OK) {
            rc = arc_err(a, TK_ERR_ARCHIVE, "cannot read archive entry", path);
            goto done;
        }
        /* A block that does not continue where the last one ended is a hole: a sparse file. */
        if (off != written) {
            rc = tk__err(TK_ERR_ARCHIVE, "archive entry '%s' is a sparse file, which tk does not unpack" HINT_HOSTILE,
                         path);
            goto done;
        }
        if ((int64_t)len > size - written || (int64_t)len > lim->max_file_bytes - written) {
            rc = tk__err(TK_ERR_ARCHIVE, "archive entry '%s' holds more data than its declared %lld bytes" HINT_HOSTILE,
                         path, (long long)size);
            goto done;
        }
        /* The declared sizes were checked against these limits already; this holds them as data
         * actually arrives, whatever the headers claimed. */
        if (bud->total + (int64_t)len > bud->ratio_cap || bud->total + (int64_t)len > lim->max_bytes) {
            rc = tk__err(TK_ERR_ARCHIVE,
                         "archive unpacks to more than %lld bytes (at '%s'): a "
                         "decompression bomb?" HINT_HOSTILE,
                         (long long)(bud->ratio_cap < lim->max_bytes ? bud->ratio_cap : lim->max_bytes), path);
            goto done;
        }
        if ((rc = tk__sha256_update(h, block, len)) != TK_OK)
            goto done;
        if (len && (rc = tk__write_all(fd, block, len, path)) != TK_OK) {
            tk__err_wrap(rc, "unpacking into '%s'", x->dest);
            goto done;
        }
        written += (int64_t)len;
        bud->total += (int64_t)len;
    }
    if (written != size) {
        rc = tk__err(TK_ERR_ARCHIVE, "archive entry '%s' ended after %lld of its %lld bytes" HINT_HOSTILE, path,
                     (long long)written, (long long)size);
        goto done;
    }
    rc = tk__sha256_final_hex(h, hex);
    if (rc == TK_OK) {
        int c = close(fd);
        fd = -1;
        if (c != 0)
            rc = sys_err_at("cannot close", x->dest, path);
    }
done:
    if (fd >= 0)
        close(fd);
    if (dfd >= 0 && dfd != x->root)
        close(dfd);
    return rc;
}

static int extract_dir(const xstate *x, char *path)
{
    size_t n = strlen(path);
    if (n > 1 && path[n - 1] == '/')
        path[n - 1] = '\0';
    int dfd = -1, sub = -1;
    const char *leaf = NULL;
    int rc = open_parent(&dfd, &leaf, path, x);
    if (rc == TK_OK)
        rc = open_subdir(&sub, dfd, leaf, x, path);
    if (sub >= 0)
        close(sub);
    if (dfd >= 0 && dfd != x->root)
        close(dfd);
    return rc;
}

/* A hostile name is shown, not replayed: control bytes become '?', and long names are cut. */
static const char *shown(char out[256], const char *raw)
{
    size_t n = 0;
    for (; raw[n] && n < 200; n++)
        out[n] = ((unsigned char)raw[n] < 0x20 || raw[n] == 0x7f) ? '?' : raw[n];
    if (raw[n])
        memcpy(out + n, "...", 4);
    else
        out[n] = '\0';
    return out;
}

static const char *type_name(const struct archive_entry *e)
{
    switch (archive_entry_filetype((struct archive_entry *)e)) {
    case AE_IFLNK: return "a symlink";
    case AE_IFCHR: return "a character device";
    case AE_IFBLK: return "a block device";
    case AE_IFIFO: return "a FIFO";
    case AE_IFSOCK: return "a socket";
    default: return "of an unknown type";
    }
}

/* One entry: checks it against the rules and the manifest, then writes it. */
static int extract_entry(struct archive *a, struct archive_entry *e, const xstate *x, budget *bud,
                         const tk_hub_unpack_limits *lim, tk_sha256 *h)
{
    const char *raw = archive_entry_pathname(e);
    if (!raw)
        raw = archive_entry_pathname_utf8(e);
    if (!raw)
        return tk__err(TK_ERR_ARCHIVE, "archive has an entry without a readable path" HINT_HOSTILE);
    char sh[256];
    if (archive_entry_hardlink(e))
        return tk__err(TK_ERR_ARCHIVE, "archive entry '%s' is a hard link, which tk does not unpack" HINT_HOSTILE,
                       shown(sh, raw));
    if (archive_entry_symlink(e))
        return tk__err(TK_ERR_ARCHIVE, "archive entry '%s' is a symlink, which tk does not unpack" HINT_HOSTILE,
                       shown(sh, raw));
    unsigned type = archive_entry_filetype(e);
    if (type != AE_IFREG && type != AE_IFDIR)
        return tk__err(TK_ERR_ARCHIVE,
                       "archive entry '%s' is %s; only regular files and directories "
                       "are unpacked" HINT_HOSTILE,
                       shown(sh, raw), type_name(e));
    const char *why = path_problem(raw, type == AE_IFDIR);
    if (why)
        return tk__err(TK_ERR_ARCHIVE, "archive entry '%s' is refused: %s" HINT_HOSTILE, shown(sh, raw), why);
    if (archive_entry_sparse_count(e) > 0)
        return tk__err(TK_ERR_ARCHIVE, "archive entry '%s' is a sparse file, which tk does not unpack" HINT_HOSTILE,
                       raw);

    char path[MAX_PATH_LEN + 2];
    snprintf(path, sizeof path, "%s", raw);
    int64_t size = archive_entry_size_is_set(e) ? archive_entry_size(e) : -1;
    if (type == AE_IFDIR) {
        if (size > 0) /* libarchive would skip (decompress) that much: refuse instead */
            return tk__err(TK_ERR_ARCHIVE, "archive directory entry '%s' claims %lld bytes of data" HINT_HOSTILE, path,
                           (long long)size);
        return extract_dir(x, path);
    }

    ssize_t i = find_expected(x, path);
    if (i < 0)
        return tk__err(TK_ERR_ARCHIVE, "unexpected file '%s' in archive: the manifest does not list it" HINT_HOSTILE,
                       path);
    if (x->seen[i])
        return tk__err(TK_ERR_ARCHIVE, "archive entry '%s' appears twice" HINT_HOSTILE, path);
    x->seen[i] = 1;
    if (size < 0)
        return tk__err(TK_ERR_ARCHIVE, "archive entry '%s' has no size" HINT_HOSTILE, path);
    if (size > lim->max_file_bytes)
        return tk__err(TK_ERR_ARCHIVE, "archive entry '%s' is %lld bytes, over the limit of %lld per file" HINT_HOSTILE,
                       path, (long long)size, (long long)lim->max_file_bytes);
    if (size > lim->max_bytes - bud->total)
        return tk__err(TK_ERR_ARCHIVE, "archive unpacks to more than the limit of %lld bytes (at '%s')" HINT_HOSTILE,
                       (long long)lim->max_bytes, path);
    if (size > bud->ratio_cap - bud->total)
        return tk__err(TK_ERR_ARCHIVE,
                       "archive unpacks to more than %lld times its compressed size (at "
                       "'%s'): a decompression bomb?" HINT_HOSTILE,
                       (long long)lim->max_ratio, path);
    const tk_manifest_file *want = &x->exp[i];
    if (size != want->size)
        return tk__err(TK_ERR_DIGEST, "file '%s' is %lld bytes in the archive, but the manifest says %lld", path,
                       (long long)size, (long long)want->size);

    char hex[TK_SHA256_HEX];
    int rc = extract_file(a, x, path, size, bud, lim, h, hex);
    if (rc != TK_OK)
        return rc;
    if (strcmp(hex, want->sha256) != 0)
        return tk__err(TK_ERR_DIGEST, "file '%s' has sha256 %s in the archive, but the manifest says %s", path, hex,
                       want->sha256);
    return TK_OK;
}

/* After a digest mismatch: reads the rest of the stream (writing nothing, under the same limits) so
 * that a corrupt archive, whose damage only its checksums or a later block reveal, is reported as
 * TK_ERR_ARCHIVE rather than as a mismatch of the file it happened to garble. */
static int drain(struct archive *a, const char *archive_path, const budget *bud, const tk_hub_unpack_limits *lim,
                 int64_t nentries)
{
    for (;;) {
        if (archive_read_data_skip(a) != ARCHIVE_OK)
            return arc_err(a, TK_ERR_ARCHIVE, "cannot read archive", archive_path);
        struct archive_entry *e = NULL;
        int r = archive_read_next_header(a, &e);
        if (r == ARCHIVE_EOF)
            break;
        if (r != ARCHIVE_OK)
            return arc_err(a, TK_ERR_ARCHIVE, "cannot read archive", archive_path);
        int64_t size = archive_entry_size_is_set(e) ? archive_entry_size(e) : 0;
        if (++nentries > lim->max_entries || size > lim->max_file_bytes ||
            archive_filter_bytes(a, 0) > bud->ratio_cap - size)
            return tk__err(TK_ERR_ARCHIVE, "archive '%s' breaks the unpack limits" HINT_HOSTILE, archive_path);
    }
    return TK_OK;
}

static int check_limits(const tk_hub_unpack_limits *l)
{
    if (l->max_entries <= 0 || l->max_bytes <= 0 || l->max_file_bytes <= 0 || l->max_ratio <= 0)
        return tk__err(TK_ERR_INVALID,
                       "unpack limits must be positive (entries %lld, bytes %lld, file "
                       "bytes %lld, ratio %lld)",
                       (long long)l->max_entries, (long long)l->max_bytes, (long long)l->max_file_bytes,
                       (long long)l->max_ratio);
    return TK_OK;
}

/* The manifest's list: each path acceptable, a 64-hex sha256, a size >= 0. */
static int check_expect(const tk_manifest_file *expect, size_t nexpect)
{
    for (size_t i = 0; i < nexpect; i++) {
        const char *why = expect[i].path ? path_problem(expect[i].path, 0) : "the path is NULL";
        if (why)
            return tk__err(TK_ERR_INVALID, "expected file '%s' is refused: %s", expect[i].path ? expect[i].path : "",
                           why);
        if (!tk__is_hex(expect[i].sha256, 64) || expect[i].size < 0)
            return tk__err(TK_ERR_INVALID, "expected file '%s' needs a 64-hex sha256 and a size >= 0", expect[i].path);
    }
    return TK_OK;
}

/* x->order: the expected paths sorted (for lookups by name), none twice; x->seen: none seen yet. */
static int index_expect(xstate *x)
{
    if (!x->nexp)
        return TK_OK;
    if (!(x->order = malloc(x->nexp * sizeof *x->order)) || !(x->seen = calloc(x->nexp, 1)))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < x->nexp; i++)
        x->order[i] = (xref){x->exp[i].path, i};
    qsort(x->order, x->nexp, sizeof *x->order, cmp_ref);
    for (size_t i = 1; i < x->nexp; i++)
        if (strcmp(x->order[i - 1].path, x->order[i].path) == 0)
            return tk__err(TK_ERR_INVALID, "expected file '%s' is listed twice", x->order[i].path);
    return TK_OK;
}

/* x->root: the unpack directory, opened without following a link, and empty. */
static int open_dest(xstate *x, const char *dest_dir)
{
    int empty = 0;
    x->root = open(dest_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (x->root < 0)
        return tk__err_sys("cannot open the unpack directory", dest_dir);
    if (dir_is_empty(x->root, &empty) != 0)
        return tk__err_sys("cannot list the unpack directory", dest_dir);
    if (!empty)
        return tk__err(TK_ERR_INVALID, "the unpack directory '%s' is not empty", dest_dir);
    return TK_OK;
}

/* Opens the archive (a regular file, not a link) for reading as exactly one gzip or zstd stream over
 * a tar, with no external program; *bud's ratio cap follows its compressed size. */
static int open_archive(struct archive **out, int *afd, budget *bud, const char *archive_path,
                        const tk_hub_unpack_limits *lim)
{
    struct stat st;
    struct archive *a;
    *afd = open(archive_path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (*afd < 0)
        return tk__err_sys("cannot open archive", archive_path);
    if (fstat(*afd, &st) != 0 || !S_ISREG(st.st_mode))
        return tk__err(TK_ERR_IO, "archive '%s' is not a regular file", archive_path);
    *bud = (budget){0, INT64_MAX};
    if (st.st_size <= INT64_MAX / lim->max_ratio)
        bud->ratio_cap = (int64_t)st.st_size * lim->max_ratio;
    if (bud->ratio_cap < RATIO_FLOOR)
        bud->ratio_cap = RATIO_FLOOR;
    if (!(*out = a = archive_read_new()))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    /* ARCHIVE_WARN here means libarchive would run an external program: refuse that. */
    if (archive_read_support_filter_gzip(a) != ARCHIVE_OK || archive_read_support_filter_zstd(a) != ARCHIVE_OK ||
        archive_read_support_format_tar(a) != ARCHIVE_OK)
        return tk__err(TK_ERR_UNSUPPORTED, "this libarchive cannot read tar.gz and tar.zst by itself: %s", arc_msg(a));
    if (archive_read_open_fd(a, *afd, CHUNK) != ARCHIVE_OK)
        return arc_err(a, TK_ERR_ARCHIVE, "cannot read archive", archive_path);
    /* Exactly one decompressor over the tar (filter 0 is the outermost; the last is "none"). */
    int nf = archive_filter_count(a), code0 = archive_filter_code(a, 0);
    if (nf != 2 || (code0 != ARCHIVE_FILTER_GZIP && code0 != ARCHIVE_FILTER_ZSTD))
        return tk__err(TK_ERR_ARCHIVE, "archive '%s' is not a gzip- or zstd-compressed tar (filters: %s)" HINT_HOSTILE,
                       archive_path, nf > 1 ? archive_filter_name(a, 0) : "none");
    return TK_OK;
}

/* Every entry, within the limits; *wrote is set once an entry was read (something may be on disk).
 * A digest mismatch is reported only when the rest of the archive is sound (else it is an archive
 * error). */
static int extract_entries(struct archive *a, xstate *x, budget *bud, const tk_hub_unpack_limits *lim, tk_sha256 *h,
                           const char *archive_path, int *wrote)
{
    int64_t nentries = 0;
    int rc;
    for (;;) {
        struct archive_entry *e = NULL;
        int r = archive_read_next_header(a, &e);
        if (r == ARCHIVE_EOF)
            return TK_OK;
        if (r != ARCHIVE_OK) /* WARN included: e.g. a name libarchive had to mangle */
            return arc_err(a, TK_ERR_ARCHIVE, "cannot read archive", archive_path);
        *wrote = 1;
        if (++nentries > lim->max_entries)
            return tk__err(TK_ERR_ARCHIVE, "archive '%s' has more than %lld entries" HINT_HOSTILE, archive_path,
                           (long long)lim->max_entries);
        /* Headers, padding and skipped data decompress too: hold the whole stream to the ratio. */
        if (archive_filter_bytes(a, 0) > bud->ratio_cap)
            return tk__err(TK_ERR_ARCHIVE,
                           "archive '%s' unpacks to more than %lld times its compressed "
                           "size: a decompression bomb?" HINT_HOSTILE,
                           archive_path, (long long)lim->max_ratio);
        if ((rc = extract_entry(a, e, x, bud, lim, h)) != TK_OK) {
            if (rc == TK_ERR_DIGEST) {
                char mismatch[2048];
                snprintf(mismatch, sizeof mismatch, "%s", tk_last_error());
                if (drain(a, archive_path, bud, lim, nentries) == TK_OK)
                    tk__err(rc, "%s", mismatch);
                else
                    rc = TK_ERR_ARCHIVE;
            }
            return rc;
        }
    }
}

int tk_hub__archive_extract(const char *archive_path, const char *dest_dir, const tk_manifest_file *expect,
                            size_t nexpect, const tk_hub_unpack_limits *limits)
{
    static const tk_hub_unpack_limits defaults = TK_HUB_UNPACK_LIMITS_DEFAULT;
    const tk_hub_unpack_limits *lim = limits ? limits : &defaults;
    int rc = TK_OK, afd = -1, wrote = 0;
    xstate x = {dest_dir, -1, expect, nexpect, NULL, NULL};
    struct archive *a = NULL;
    tk_sha256 *h = NULL;
    budget bud;

    if (!archive_path || !dest_dir || (nexpect && !expect))
        return tk__err(TK_ERR_INVALID, "archive_extract: archive_path, dest_dir and expect are required");
    if ((rc = check_limits(lim)) != TK_OK || (rc = check_expect(expect, nexpect)) != TK_OK)
        return rc;
    if ((rc = index_expect(&x)) != TK_OK || (rc = open_dest(&x, dest_dir)) != TK_OK ||
        (rc = open_archive(&a, &afd, &bud, archive_path, lim)) != TK_OK || (rc = tk__sha256_new(&h)) != TK_OK ||
        (rc = extract_entries(a, &x, &bud, lim, h, archive_path, &wrote)) != TK_OK)
        goto done;
    for (size_t i = 0; i < nexpect; i++)
        if (!x.seen[x.order[i].i]) {
            rc = tk__err(TK_ERR_DIGEST, "file '%s' is listed in the manifest but missing from the archive",
                         x.order[i].path);
            goto done;
        }
done:
    if (a)
        archive_read_free(a);
    if (afd >= 0)
        close(afd);
    tk__sha256_free(h);
    if (rc != TK_OK && wrote && x.root >= 0)
        remove_children(x.root); /* keeps the thread's message: nothing in it reports */
    if (x.root >= 0)
        close(x.root);
    free(x.order);
    free(x.seen);
    return rc;
}
