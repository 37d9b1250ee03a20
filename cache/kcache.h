/*
 * kcache.h — the compiled-binary cache: <cache_dir>/cache.db, an SQLite database of blobs keyed by
 * the content key jit computes (sha256 hex). Separate from the package state, so deleting it only
 * costs recompiles.
 *
 * WAL mode with a busy timeout, BEGIN IMMEDIATE for writes, and no transaction is ever held across a
 * compile: callers look up, compile outside, then put. Two processes putting the same key both
 * succeed and one row remains. Every blob is stored with a magic/version header and its own sha256;
 * a blob that fails either check on read is deleted and reported as a miss. Entries carry last_used
 * (updated on each hit) and are evicted oldest first when the cache is over its size cap.
 */
#ifndef TK_KCACHE_H
#define TK_KCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

typedef struct tk_kcache tk_kcache;

/* Descriptive columns stored with an entry (shown by 'tk cache ls'); any may be NULL. */
typedef struct {
    const char *package; /* "org/name@commit" */
    const char *unit;    /* what was compiled: "activation.cu: silu_and_mul_f32, gelu_f32" */
    const char *target;  /* "sm_90", "sm_90a", "compute_120" */
    const char *nvrtc;   /* "13.0" */
} tk_kcache_meta;

/* Opens (creating dir and the database, migrating its schema) <dir>/cache.db. max_bytes is the size
 * cap applied after each put (0: no cap). Errors: TK_ERR_CACHE, TK_ERR_IO. */
int tk_kcache__open(tk_kcache **out, const char *dir, int64_t max_bytes);
void tk_kcache__close(tk_kcache *c);
const char *tk_kcache__path(const tk_kcache *c);
int64_t tk_kcache__max_bytes(const tk_kcache *c);

/* Looks key up. On a hit *data (malloc'd, the caller frees) and *len receive the payload and
 * last_used and hits are updated, except when the entry is already the most recently used one and
 * was used less than a minute ago (the order would not change; that write cost a warm tk_get_kernel
 * several fsyncs), so hits counts loads at most once a minute while an entry stays the newest. TK_ERR_NOT_FOUND on a miss, also when the stored blob was corrupt (it is
 * deleted then). */
int tk_kcache__get(tk_kcache *c, const char *key, uint8_t **data, size_t *len);
/* Stores a payload under key (INSERT OR IGNORE: an existing entry wins), then evicts down to the cap.
 * *inserted (may be NULL) is 1 if this call added the row. */
int tk_kcache__put(tk_kcache *c, const char *key, const tk_kcache_meta *meta, const void *data, size_t len,
                   int *inserted);
/* Deletes one entry (missing is fine): a load rejected it. */
int tk_kcache__remove(tk_kcache *c, const char *key);
/* 1 when an entry for key is stored, 0 when not (or on an error): a look-up that reads no blob and
 * writes nothing (tk_kcache__get verifies the blob and counts the hit). */
int tk_kcache__has(tk_kcache *c, const char *key);

/* Evicts least-recently-used entries until the payloads total at most max_bytes. */
int tk_kcache__gc(tk_kcache *c, int64_t max_bytes, int64_t *freed);
/* Removes every compiled binary and every tuned choice. */
int tk_kcache__clear(tk_kcache *c, int64_t *freed);
/* Autotune results: the implementation measured fastest for a key (api/op.c builds it from the
 * device, the arch, the op and the shape bucket). get: TK_ERR_NOT_FOUND when none; *impl malloc'd.
 * put replaces the previous choice; detail records every candidate's time for `tk cache`. */
int tk_kcache__tune_get(tk_kcache *c, const char *key, char **impl);
int tk_kcache__tune_put(tk_kcache *c, const char *key, const char *impl, double us, const char *detail);
/* Entry count and total payload bytes. */
int tk_kcache__stats(tk_kcache *c, int64_t *entries, int64_t *bytes);
/* One entry as the listing shows it (borrowed during the callback). */
typedef struct {
    const char *key;
    const char *package, *unit, *target, *nvrtc; /* "" when not recorded */
    int64_t size;      /* payload bytes */
    int64_t created;   /* unix seconds */
    int64_t last_used; /* unix seconds */
    int64_t hits;
} tk_kcache_entry;

/* Calls each() for every entry, most recently used first; a nonzero return stops the walk. */
int tk_kcache__list(tk_kcache *c, int (*each)(void *user, const tk_kcache_entry *e), void *user);

/* ---- self-test results (api/selftest.c) ---------------------------------------------------------- */

/* One kernel's self-test. The key is (binary_key, kernel, gpu_uuid, driver, tk_version): a new build of
 * the binary, another GPU, a new driver or a new tk is a new key, so an old result is never taken for
 * the current one. Strings are borrowed. */
typedef struct {
    const char *binary_key; /* the compiled unit's cache key (64 hex) */
    const char *kernel;     /* the manifest's kernel name */
    const char *gpu_uuid;   /* "GPU-xxxxxxxx-..." */
    const char *driver;     /* "570.86.15/12080": the kernel module and the CUDA driver API version */
    const char *tk_version;
    const char *package;    /* "org/name@commit" or "org/name@local" */
    const char *op;
    const char *status;     /* "passed", "failed", "crashed", "timed_out", "untested", "running" */
    const char *detail;     /* JSON text: the worst element, the error, the cases run */
    const char *gpu_name;
    int64_t pid;            /* the process testing it, for "running" */
    int64_t tested;         /* unix seconds; 0: now */
    double seconds;
} tk_kcache_selftest;

/* Records r (INSERT OR REPLACE on the key). Errors: TK_ERR_INVALID (a key field missing), TK_ERR_CACHE. */
int tk_kcache__selftest_put(tk_kcache *c, const tk_kcache_selftest *r);
/* Calls each() for every record whose key fields and package equal filter's non-NULL ones (filter NULL:
 * every record), ordered by package, kernel, newest first; a nonzero return stops the walk. */
int tk_kcache__selftest_query(tk_kcache *c, const tk_kcache_selftest *filter,
                              int (*each)(void *user, const tk_kcache_selftest *r), void *user);
/* Deletes the records of package ("org/name@commit"; NULL: all). *removed (may be NULL): how many. */
int tk_kcache__selftest_forget(tk_kcache *c, const char *package, int64_t *removed);

/* Parses a size: digits with an optional K, M, G or T suffix (powers of 1024, 'B'/'iB' tolerated).
 * Returns 0 and *out, or -1. */
int tk_kcache__parse_size(const char *s, int64_t *out);

#endif
