/*
 * err.c — thread-local error messages and status names.
 *
 * The message lives in a fixed per-thread buffer, so reporting an error never allocates (an error path
 * may well be an out-of-memory path).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common.h"

#define TK_ERRBUF 2048

static _Thread_local char errbuf[TK_ERRBUF];

const char *tk_last_error(void) { return errbuf; }

void tk__err_clear(void) { errbuf[0] = '\0'; }

int tk__err(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errbuf, sizeof errbuf, fmt, ap);
    va_end(ap);
    return code;
}

int tk__err_wrap(int code, const char *fmt, ...)
{
    char prefix[512];
    char old[TK_ERRBUF];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, errbuf, sizeof old);
    size_t np = strlen(prefix), no = strlen(old), cap = sizeof errbuf - 1;
    size_t n = np < cap ? np : cap;
    memcpy(errbuf, prefix, n);
    if (old[0] && n + 2 < cap) {
        memcpy(errbuf + n, ": ", 2);
        n += 2;
        size_t k = no < cap - n ? no : cap - n;
        memcpy(errbuf + n, old, k);
        n += k;
    }
    errbuf[n] = '\0';
    return code;
}

int tk__errno_status(int e)
{
    switch (e) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
        return TK_ERR_NOSPACE;
    case ENOENT:
        return TK_ERR_NOT_FOUND;
    case ENOMEM:
        return TK_ERR_NOMEM;
    default:
        return TK_ERR_IO;
    }
}

int tk__err_sys(const char *what, const char *path)
{
    int e = errno;
    int code = tk__errno_status(e);
    if (code == TK_ERR_NOSPACE)
        return tk__err(code, "%s '%s': %s\nHINT: free some disk space (or point TK_HOME elsewhere) and retry",
                       what, path ? path : "", strerror(e));
    return tk__err(code, "%s '%s': %s", what, path ? path : "", strerror(e));
}

const char *tk_status_str(int status)
{
    switch (status) {
    case TK_OK: return "ok";
    case TK_ERR_INVALID: return "invalid argument";
    case TK_ERR_NOT_FOUND: return "not found";
    case TK_ERR_NETWORK: return "network error";
    case TK_ERR_SIGNATURE: return "bad signature";
    case TK_ERR_UNTRUSTED: return "untrusted signer";
    case TK_ERR_DIGEST: return "digest mismatch";
    case TK_ERR_MANIFEST: return "malformed manifest";
    case TK_ERR_ARCHIVE: return "bad archive";
    case TK_ERR_IO: return "I/O error";
    case TK_ERR_NOSPACE: return "no space left";
    case TK_ERR_CACHE: return "state database error";
    case TK_ERR_ROLLBACK: return "rollback refused";
    case TK_ERR_NOMEM: return "out of memory";
    case TK_ERR_OFFLINE: return "offline";
    case TK_ERR_NO_DEVICE: return "no CUDA device";
    case TK_ERR_NO_NVRTC: return "NVRTC not available";
    case TK_ERR_COMPILE: return "compile error";
    case TK_ERR_LAUNCH: return "launch error";
    case TK_ERR_UNSUPPORTED: return "unsupported";
    case TK_ERR_INTERNAL: return "internal error";
    case TK_ERR_CORRUPT: return "damaged file";
    case TK_ERR_AUTH: return "not authorized";
    case TK_ERR_SELFTEST: return "self-test failed";
    default: return "unknown status";
    }
}

void tk__logf(tk_log_fn log, void *user, int level, const char *fmt, ...)
{
    if (!log)
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    log(user, level, msg);
}

int tk_version_number(void) { return TK_VERSION_NUMBER; }
const char *tk_version_string(void) { return TK_VERSION_STRING; }
