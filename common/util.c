/*
 * util.c — strings, growable buffers, SHA-256 (OpenSSL EVP) and careful file operations.
 *
 * File writes that must survive a crash go through tk__write_atomic: temp file in the same directory,
 * fsync, rename over the target, fsync of the directory. A reader sees the old file or the new one.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/rand.h>

#include "common.h"

/* ---- strings ---------------------------------------------------------------------------------- */

char *tk__strdup(const char *s)
{
    if (!s)
        return NULL;
    size_t n = strlen(s);
    char *p = malloc(n + 1);
    if (p)
        memcpy(p, s, n + 1);
    return p;
}

char *tk__strndup(const char *s, size_t n)
{
    if (!s)
        return NULL;
    char *p = malloc(n + 1);
    if (!p)
        return NULL;
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

char *tk__fmt(const char *fmt, ...)
{
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *p = NULL;
    if (n >= 0 && (p = malloc((size_t)n + 1)) != NULL)
        vsnprintf(p, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    return p;
}

int tk__streq(const char *a, const char *b)
{
    if (!a || !b)
        return a == b;
    return strcmp(a, b) == 0;
}

int tk__has_prefix(const char *s, const char *prefix) { return s && prefix && strncmp(s, prefix, strlen(prefix)) == 0; }

int tk__has_suffix(const char *s, const char *suffix)
{
    if (!s || !suffix)
        return 0;
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && memcmp(s + a - b, suffix, b) == 0;
}

size_t tk__edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 200 || lb > 200)
        return (size_t)-1;
    size_t row[201];
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

int tk__parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    if (!s || !*s)
        return -1;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || !end || *end || v < lo || v > hi)
        return -1;
    *out = (int64_t)v;
    return 0;
}

/* ---- buffers ---------------------------------------------------------------------------------- */

int tk__buf_append(tk_buf *b, const void *p, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d)
            return tk__err(TK_ERR_NOMEM, "out of memory growing a buffer to %zu bytes", cap);
        b->data = d;
        b->cap = cap;
    }
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return TK_OK;
}

int tk__buf_puts(tk_buf *b, const char *s) { return tk__buf_append(b, s, strlen(s)); }

int tk__buf_printf(tk_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char tmp[512];
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    int rc;
    if (n < 0) {
        rc = tk__err(TK_ERR_INTERNAL, "bad format string");
    } else if ((size_t)n < sizeof tmp) {
        rc = tk__buf_append(b, tmp, (size_t)n);
    } else {
        char *big = malloc((size_t)n + 1);
        if (!big) {
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
        } else {
            vsnprintf(big, (size_t)n + 1, fmt, ap2);
            rc = tk__buf_append(b, big, (size_t)n);
            free(big);
        }
    }
    va_end(ap2);
    return rc;
}

void tk__buf_free(tk_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

char *tk__buf_steal(tk_buf *b)
{
    if (!b->data && tk__buf_append(b, "", 0) != TK_OK)
        return NULL;
    char *p = b->data;
    b->data = NULL;
    b->len = b->cap = 0;
    return p;
}

/* ---- hashing ---------------------------------------------------------------------------------- */

void tk__hex(char *out, const uint8_t *p, size_t n)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[p[i] >> 4];
        out[2 * i + 1] = digits[p[i] & 15];
    }
    out[2 * n] = '\0';
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int tk__unhex(uint8_t *out, size_t n, const char *hex)
{
    if (!hex || strlen(hex) != 2 * n)
        return -1;
    for (size_t i = 0; i < n; i++) {
        int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

int tk__is_hex(const char *s, size_t n)
{
    if (!s || strlen(s) != n)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return 1;
}

struct tk_sha256 {
    EVP_MD_CTX *md;
};

int tk__sha256_new(tk_sha256 **out)
{
    *out = NULL;
    tk_sha256 *h = calloc(1, sizeof *h);
    if (!h || !(h->md = EVP_MD_CTX_new()) || EVP_DigestInit_ex(h->md, EVP_sha256(), NULL) != 1) {
        tk__sha256_free(h);
        return tk__err(TK_ERR_NOMEM, "cannot create a SHA-256 context");
    }
    *out = h;
    return TK_OK;
}

int tk__sha256_update(tk_sha256 *h, const void *p, size_t n)
{
    if (EVP_DigestUpdate(h->md, p, n) != 1)
        return tk__err(TK_ERR_INTERNAL, "SHA-256 update failed");
    return TK_OK;
}

int tk__sha256_final_hex(tk_sha256 *h, char out[TK_SHA256_HEX])
{
    uint8_t md[EVP_MAX_MD_SIZE];
    unsigned len = 0;
    if (EVP_DigestFinal_ex(h->md, md, &len) != 1 || len != TK_SHA256_LEN)
        return tk__err(TK_ERR_INTERNAL, "SHA-256 final failed");
    tk__hex(out, md, TK_SHA256_LEN);
    EVP_DigestInit_ex(h->md, EVP_sha256(), NULL);
    return TK_OK;
}

void tk__sha256_free(tk_sha256 *h)
{
    if (!h)
        return;
    EVP_MD_CTX_free(h->md);
    free(h);
}

int tk__sha256(uint8_t out[TK_SHA256_LEN], const void *p, size_t n)
{
    unsigned len = 0;
    if (EVP_Digest(p, n, out, &len, EVP_sha256(), NULL) != 1 || len != TK_SHA256_LEN)
        return tk__err(TK_ERR_INTERNAL, "SHA-256 failed");
    return TK_OK;
}

int tk__sha256_hex(char out[TK_SHA256_HEX], const void *p, size_t n)
{
    uint8_t md[TK_SHA256_LEN];
    int rc = tk__sha256(md, p, n);
    if (rc == TK_OK)
        tk__hex(out, md, sizeof md);
    return rc;
}

static int sha256_fd(char out[TK_SHA256_HEX], int64_t *size, int fd, const char *path);

int tk__sha256_file(char out[TK_SHA256_HEX], int64_t *size, const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return tk__err_sys("cannot open", path);
    return sha256_fd(out, size, fd, path);
}

int tk__sha256_file_nofollow(char out[TK_SHA256_HEX], int64_t *size, const char *path)
{
    int fd, rc = tk__open_nofollow(&fd, path, O_RDONLY, 0);
    return rc == TK_OK ? sha256_fd(out, size, fd, path) : rc;
}

/* Hashes what fd holds from its current offset, and closes it. */
static int sha256_fd(char out[TK_SHA256_HEX], int64_t *size, int fd, const char *path)
{
    int rc = TK_OK;
    tk_sha256 *h = NULL;
    if ((rc = tk__sha256_new(&h)) != TK_OK)
        goto done;
    char buf[1 << 16];
    int64_t total = 0;
    for (;;) {
        ssize_t r = read(fd, buf, sizeof buf);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            rc = tk__err_sys("cannot read", path);
            goto done;
        }
        if (r == 0)
            break;
        total += r;
        if ((rc = tk__sha256_update(h, buf, (size_t)r)) != TK_OK)
            goto done;
    }
    if ((rc = tk__sha256_final_hex(h, out)) != TK_OK)
        goto done;
    if (size)
        *size = total;
done:
    tk__sha256_free(h);
    close(fd);
    return rc;
}

/* ---- files ------------------------------------------------------------------------------------ */

int tk__mkdirs(const char *path, mode_t mode)
{
    char *p = tk__strdup(path);
    if (!p)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    int rc = TK_OK;
    for (char *s = p + 1;; s++) {
        if (*s == '/' || *s == '\0') {
            char c = *s;
            *s = '\0';
            if (mkdir(p, mode) != 0 && errno != EEXIST) {
                rc = tk__err_sys("cannot create directory", p);
                break;
            }
            *s = c;
            if (c == '\0')
                break;
        }
    }
    if (rc == TK_OK && !tk__is_dir(path))
        rc = tk__err(TK_ERR_IO, "'%s' exists and is not a directory", path);
    free(p);
    return rc;
}

int tk__write_all(int fd, const void *p, size_t n, const char *path)
{
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return tk__err_sys("cannot write", path);
        }
        c += w;
        n -= (size_t)w;
    }
    return TK_OK;
}

int tk__fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return tk__err_sys("cannot open directory", dir);
    int rc = TK_OK;
    if (fsync(fd) != 0 && errno != EINVAL)
        rc = tk__err_sys("cannot fsync directory", dir);
    close(fd);
    return rc;
}

char *tk__tmp_path(const char *dir, const char *prefix)
{
    uint32_t r = 0;
    if (RAND_bytes((unsigned char *)&r, sizeof r) != 1)
        r = (uint32_t)clock();
    return tk__fmt("%s/.tmp-%s-%ld-%08x", dir, prefix, (long)getpid(), r);
}

char *tk__dirname(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        return tk__strdup(".");
    if (slash == path)
        return tk__strdup("/");
    return tk__strndup(path, (size_t)(slash - path));
}

int tk__write_atomic(const char *path, const void *data, size_t n, mode_t mode)
{
    int rc = TK_OK, fd = -1;
    char *dir = tk__dirname(path);
    char *tmp = dir ? tk__tmp_path(dir, "w") : NULL;
    if (!dir || !tmp) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0) {
        rc = tk__err_sys("cannot create", tmp);
        goto done;
    }
    if ((rc = tk__write_all(fd, data, n, tmp)) != TK_OK)
        goto done;
    if (fsync(fd) != 0) {
        rc = tk__err_sys("cannot fsync", tmp);
        goto done;
    }
    if (close(fd) != 0) {
        fd = -1;
        rc = tk__err_sys("cannot close", tmp);
        goto done;
    }
    fd = -1;
    if (rename(tmp, path) != 0) {
        rc = tk__err_sys("cannot rename into place", path);
        goto done;
    }
    rc = tk__fsync_dir(dir);
done:
    if (fd >= 0)
        close(fd);
    if (rc != TK_OK && tmp)
        unlink(tmp);
    free(tmp);
    free(dir);
    return rc;
}

static int read_fd(char **out, size_t *len, int fd, const char *path, size_t max);

int tk__read_file(char **out, size_t *len, const char *path, size_t max)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return tk__err_sys("cannot open", path);
    return read_fd(out, len, fd, path, max);
}

int tk__read_file_nofollow(char **out, size_t *len, const char *path, size_t max)
{
    *out = NULL;
    int fd, rc = tk__open_nofollow(&fd, path, O_RDONLY, 0);
    return rc == TK_OK ? read_fd(out, len, fd, path, max) : rc;
}

/* Reads all of fd (NUL-terminated), and closes it. */
static int read_fd(char **out, size_t *len, int fd, const char *path, size_t max)
{
    int rc = TK_OK;
    tk_buf b = TK_BUF_INIT;
    char chunk[1 << 16];
    for (;;) {
        ssize_t r = read(fd, chunk, sizeof chunk);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            rc = tk__err_sys("cannot read", path);
            goto done;
        }
        if (r == 0)
            break;
        if (b.len + (size_t)r > max) {
            rc = tk__err(TK_ERR_INVALID, "'%s' is larger than the %zu bytes allowed", path, max);
            goto done;
        }
        if ((rc = tk__buf_append(&b, chunk, (size_t)r)) != TK_OK)
            goto done;
    }
    if (len)
        *len = b.len;
    *out = tk__buf_steal(&b);
    if (!*out)
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
done:
    close(fd);
    tk__buf_free(&b);
    return rc;
}

/* ---- files under tk's home: never through a link ----------------------------------------------- */

static int planted(const char *path, const char *what)
{
    return tk__err(TK_ERR_IO,
                   "'%s' is %s; tk never follows links in its home, so it refuses it (someone "
                   "who can write there may have planted it to redirect tk's writes)\nHINT: look at it "
                   "('ls -l %s'), remove it, and check who can write to that directory",
                   path, what, path);
}

int tk__open_nofollow(int *fd_out, const char *path, int flags, mode_t mode)
{
    *fd_out = -1;
    int fd = open(path, flags | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, mode);
    if (fd < 0) {
        if (errno == ELOOP)
            return planted(path, "a symbolic link");
        return tk__err_sys((flags & O_CREAT) ? "cannot create" : "cannot open", path);
    }
    struct stat st;
    int rc = TK_OK;
    if (fstat(fd, &st) != 0)
        rc = tk__err_sys("cannot stat", path);
    else if (!S_ISREG(st.st_mode))
        rc = planted(path, "not a regular file");
    else if ((flags & O_ACCMODE) != O_RDONLY && st.st_nlink > 1)
        rc = planted(path, "a file with more than one hard link");
    else if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0)
        rc = tk__err_sys("cannot open", path);
    if (rc != TK_OK) {
        close(fd);
        return rc;
    }
    *fd_out = fd;
    return TK_OK;
}

int tk__check_real_dir(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return tk__err_sys("cannot stat", path);
    if (S_ISLNK(st.st_mode))
        return planted(path, "a symbolic link where tk keeps a directory");
    if (!S_ISDIR(st.st_mode))
        return tk__err(TK_ERR_IO, "'%s' exists and is not a directory", path);
    return TK_OK;
}

int tk__check_not_link(const char *path, const char *suffix)
{
    char *p = tk__fmt("%s%s", path, suffix);
    struct stat st;
    int rc = p ? TK_OK : tk__err(TK_ERR_NOMEM, "out of memory");
    if (p && lstat(p, &st) == 0 && !S_ISREG(st.st_mode))
        rc = planted(p, S_ISLNK(st.st_mode) ? "a symbolic link" : "not a regular file");
    free(p);
    return rc;
}

int tk__mkdir_new(const char *path, mode_t mode)
{
    if (mkdir(path, mode) != 0)
        return errno == EEXIST ? planted(path, "already there (tk makes this directory fresh)")
                               : tk__err_sys("cannot create directory", path);
    return TK_OK;
}

int tk__rmtree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? TK_OK : tk__err_sys("cannot stat", path);
    if (!S_ISDIR(st.st_mode)) {
        if (unlink(path) != 0 && errno != ENOENT)
            return tk__err_sys("cannot remove", path);
        return TK_OK;
    }
    DIR *d = opendir(path);
    if (!d)
        return tk__err_sys("cannot open directory", path);
    int rc = TK_OK;
    struct dirent *e;
    while (rc == TK_OK && (e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char *child = tk__path_join(path, e->d_name);
        if (!child) {
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
            break;
        }
        rc = tk__rmtree(child);
        free(child);
    }
    closedir(d);
    if (rc == TK_OK && rmdir(path) != 0 && errno != ENOENT)
        rc = tk__err_sys("cannot remove directory", path);
    return rc;
}

int tk__path_exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

int tk__is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int tk__copy_file(const char *src, const char *dst, mode_t mode)
{
    char *data = NULL;
    size_t n = 0;
    int rc = tk__read_file(&data, &n, src, (size_t)1 << 32);
    if (rc == TK_OK)
        rc = tk__write_atomic(dst, data, n, mode);
    free(data);
    return rc;
}

char *tk__path_join(const char *a, const char *b)
{
    size_t la = strlen(a);
    if (la && a[la - 1] == '/')
        return tk__fmt("%s%s", a, b);
    return tk__fmt("%s/%s", a, b);
}

int64_t tk__now(void) { return (int64_t)time(NULL); }

double tk__now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int tk__listen_addr(const char *listen, struct addrinfo **ai, int64_t *port)
{
    char host[128];
    const char *colon = strrchr(listen, ':');
    *ai = NULL;
    if (!colon || (size_t)(colon - listen) >= sizeof host)
        return tk__err(TK_ERR_INVALID, "listen address '%s' is not HOST:PORT (e.g. 127.0.0.1:8080 or [::1]:8080)",
                       listen);
    memcpy(host, listen, (size_t)(colon - listen));
    host[colon - listen] = '\0';
    if (host[0] == '[' && host[strlen(host) - 1] == ']') {
        memmove(host, host + 1, strlen(host));
        host[strlen(host) - 1] = '\0';
    }
    if (tk__parse_i64(colon + 1, 0, 65535, port) != 0)
        return tk__err(TK_ERR_INVALID, "listen address '%s': the port must be 0..65535", listen);
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int g = getaddrinfo(host[0] ? host : NULL, colon + 1, &hints, ai);
    if (g != 0 || !*ai) {
        if (*ai)
            freeaddrinfo(*ai);
        *ai = NULL;
        return tk__err(TK_ERR_INVALID, "listen address '%s': %s", listen, gai_strerror(g));
    }
    return TK_OK;
}
