/*
 * common.h — the internal toolbox every module uses: error reporting, growable buffers, string
 * helpers, SHA-256, and careful file-system operations (atomic writes, directory creation).
 *
 * Internal names are tk__<verb>. Nothing here prints or exits.
 */
#ifndef TK_COMMON_H
#define TK_COMMON_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "tk.h"

#if defined(__GNUC__)
#define TK_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define TK_PRINTF(a, b)
#endif

/* ---- errors ----------------------------------------------------------------------------------- */

/* Sets the thread's error message and returns `code`, so a failure reads `return tk__err(...)`. */
int tk__err(int code, const char *fmt, ...) TK_PRINTF(2, 3);
/* Prepends "prefix: " to the current message, keeping the code. Returns `code`. */
int tk__err_wrap(int code, const char *fmt, ...) TK_PRINTF(2, 3);
/* Maps an errno value to TK_ERR_NOSPACE / TK_ERR_NOT_FOUND / TK_ERR_IO. */
int tk__errno_status(int e);
/* Sets a message "what 'path': strerror(errno)" and returns the mapped status. */
int tk__err_sys(const char *what, const char *path);
void tk__err_clear(void);

/* Formats a message and hands it to a log callback (nothing when log is NULL). */
void tk__logf(tk_log_fn log, void *user, int level, const char *fmt, ...) TK_PRINTF(4, 5);

/* ---- memory and strings ----------------------------------------------------------------------- */

char *tk__strdup(const char *s);                       /* NULL on NULL or OOM */
char *tk__strndup(const char *s, size_t n);
char *tk__fmt(const char *fmt, ...) TK_PRINTF(1, 2);   /* malloc'd, NULL on OOM */
int tk__streq(const char *a, const char *b);           /* NULL-safe */
int tk__has_prefix(const char *s, const char *prefix);
int tk__has_suffix(const char *s, const char *suffix);
/* Levenshtein distance for "did you mean" hints; (size_t)-1 when either string exceeds 200 bytes. */
size_t tk__edit_distance(const char *a, const char *b);
/* A listen address "HOST:PORT" ("127.0.0.1:8080", "[::1]:0", ":8080" for every interface) resolved
 * for a passive TCP socket: *ai (freeaddrinfo it) and *port (0..65535). Errors: TK_ERR_INVALID, the
 * message quoting the address. */
struct addrinfo;
int tk__listen_addr(const char *listen, struct addrinfo **ai, int64_t *port);
/* Parses a whole decimal integer in [lo, hi]. Returns 0 on success, -1 otherwise. */
int tk__parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out);

typedef struct {
    char *data; /* NUL-terminated while len < cap */
    size_t len;
    size_t cap;
} tk_buf;
#define TK_BUF_INIT {NULL, 0, 0}
int tk__buf_append(tk_buf *b, const void *p, size_t n); /* TK_OK or TK_ERR_NOMEM */
int tk__buf_puts(tk_buf *b, const char *s);
int tk__buf_printf(tk_buf *b, const char *fmt, ...) TK_PRINTF(2, 3);
void tk__buf_free(tk_buf *b);
/* Hands the buffer's memory to the caller (never NULL on success) and resets b. */
char *tk__buf_steal(tk_buf *b);

/* ---- hashing ---------------------------------------------------------------------------------- */

#define TK_SHA256_LEN 32
#define TK_SHA256_HEX 65 /* 64 hex digits and a NUL */

void tk__hex(char *out, const uint8_t *p, size_t n); /* out holds 2n+1 bytes */
int tk__unhex(uint8_t *out, size_t n, const char *hex); /* exactly 2n hex digits; 0 or -1 */
int tk__is_hex(const char *s, size_t n);              /* exactly n lowercase hex digits */
int tk__sha256(uint8_t out[TK_SHA256_LEN], const void *p, size_t n);
int tk__sha256_hex(char out[TK_SHA256_HEX], const void *p, size_t n);
/* Hashes a file; *size (may be NULL) receives its length. */
int tk__sha256_file(char out[TK_SHA256_HEX], int64_t *size, const char *path);

/* Streaming SHA-256. */
typedef struct tk_sha256 tk_sha256;
int tk__sha256_new(tk_sha256 **out);
int tk__sha256_update(tk_sha256 *h, const void *p, size_t n);
int tk__sha256_final_hex(tk_sha256 *h, char out[TK_SHA256_HEX]); /* resets for reuse */
void tk__sha256_free(tk_sha256 *h);

/* ---- files ------------------------------------------------------------------------------------ */

/* mkdir -p with mode for every created level. */
int tk__mkdirs(const char *path, mode_t mode);
/* Writes data to path atomically: a temp file beside it, fsync, rename, fsync of the directory. */
int tk__write_atomic(const char *path, const void *data, size_t n, mode_t mode);
/* Reads a whole file (NUL-terminated) of at most `max` bytes. Errors: NOT_FOUND, IO, INVALID (too big). */
int tk__read_file(char **out, size_t *len, const char *path, size_t max);
/* fsync a directory so a rename in it is durable. */
int tk__fsync_dir(const char *dir);
/* Writes all n bytes to fd, retrying on EINTR and short writes. Status with errno mapping. */
int tk__write_all(int fd, const void *p, size_t n, const char *path_for_errors);
/* Removes a directory tree (no symlink is followed). Missing is fine. */
int tk__rmtree(const char *path);
int tk__path_exists(const char *path);
int tk__is_dir(const char *path);
/* Files under tk's home are opened without following links: a planted symlink (or, when opened
 * for writing, a hard link) where tk expects its own regular file is refused with TK_ERR_IO naming
 * it, so nothing outside the home is ever read or written through one. open_nofollow adds
 * O_NOFOLLOW | O_CLOEXEC to flags and checks the result is a regular file. */
int tk__open_nofollow(int *fd, const char *path, int flags, mode_t mode);
int tk__sha256_file_nofollow(char out[TK_SHA256_HEX], int64_t *size, const char *path);
int tk__read_file_nofollow(char **out, size_t *len, const char *path, size_t max);
/* TK_OK when path is a directory and not a symlink to one; TK_ERR_IO naming it otherwise. */
int tk__check_real_dir(const char *path);
/* TK_OK when path+suffix is missing or a regular file; TK_ERR_IO naming a link or anything else. */
int tk__check_not_link(const char *path, const char *suffix);
/* mkdir that fails (TK_ERR_IO, naming it) when path exists already: for fresh staging dirs. */
int tk__mkdir_new(const char *path, mode_t mode);
/* Copies src to dst atomically. */
int tk__copy_file(const char *src, const char *dst, mode_t mode);
/* The directory part of path ("." or "/" at the ends), malloc'd. */
char *tk__dirname(const char *path);
/* "a" + "/" + "b", malloc'd. */
char *tk__path_join(const char *a, const char *b);
/* A fresh, unique temp path inside dir: dir/.tmp-<prefix>-<pid>-<rand>. malloc'd. */
char *tk__tmp_path(const char *dir, const char *prefix);
int64_t tk__now(void);     /* unix seconds */
double tk__now_ms(void);   /* monotonic milliseconds */

#endif /* TK_COMMON_H */
