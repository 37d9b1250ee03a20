/*
 * kcache.c — the compiled-binary cache in SQLite (see kcache.h).
 *
 * Stored blob = "TKKC" magic, u32 format version, payload; the sha256 column covers the whole
 * stored blob. last_used is in microseconds and kept strictly increasing across the database (a hit
 * takes max(now, newest + 1)), so LRU order is exact even for hits in the same microsecond.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <sqlite3.h>

#include "cache/kcache.h"

#define KC_MAGIC 0x746b6b63u /* "tkkc" */
#define TOUCH_US 60000000LL /* a hit of the most recent entry within this is not written */
#define KC_SCHEMA 3          /* PRAGMA user_version; 2 added the tune table, 3 the selftest table */
#define KC_BLOB_MAGIC "TKKC"
#define KC_BLOB_VERSION 1u
#define KC_HDR 8
#define KC_BUSY_MS 10000

struct tk_kcache {
    uint32_t magic;
    sqlite3 *db;
    char *path;
    int64_t max_bytes;
};

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int dberr(const tk_kcache *c, const char *what)
{
    int code = c && c->db ? sqlite3_errcode(c->db) : SQLITE_ERROR;
    int st = code == SQLITE_FULL ? TK_ERR_NOSPACE : TK_ERR_CACHE;
    const char *hint = code == SQLITE_BUSY
                           ? "\nHINT: another tk process holds the cache; retry, or check for a stuck one"
                       : code == SQLITE_CORRUPT || code == SQLITE_NOTADB
                           ? "\nHINT: the cache is damaged; remove it and tk will rebuild it: 'tk cache clear' "
                             "or delete the file"
                       : code == SQLITE_FULL ? "\nHINT: free disk space, or lower TK_CACHE_MAX"
                                             : "";
    return tk__err(st, "compiled-binary cache %s: %s: %s%s", c && c->path ? c->path : "", what,
                   c && c->db ? sqlite3_errmsg(c->db) : "cannot open", hint);
}

static int exec(tk_kcache *c, const char *sql)
{
    if (sqlite3_exec(c->db, sql, NULL, NULL, NULL) != SQLITE_OK)
        return dberr(c, sql);
    return TK_OK;
}

static void rollback(tk_kcache *c)
{
    if (!sqlite3_get_autocommit(c->db))
        sqlite3_exec(c->db, "ROLLBACK", NULL, NULL, NULL);
}

/* Measured op choices: key = device, arch, op and shape bucket (api/op.c); impl = "org/name:kernel". */
#define TUNE_TABLE                                                                                                     \
    "CREATE TABLE tune(key TEXT PRIMARY KEY, impl TEXT NOT NULL, us REAL NOT NULL, detail TEXT,"                       \
    " measured INTEGER NOT NULL)"

/* Self-test results: one row per kernel of a compiled binary on one GPU, driver and tk version. A row
 * with status "running" is written before a kernel's test starts (pid: the tester), so a test that
 * takes its process down leaves evidence behind. */
#define SELFTEST_TABLE                                                                                                 \
    "CREATE TABLE IF NOT EXISTS selftest(binary_key TEXT NOT NULL, kernel TEXT NOT NULL, gpu_uuid TEXT NOT NULL,"      \
    " driver TEXT NOT NULL, tk_version TEXT NOT NULL, package TEXT NOT NULL, op TEXT NOT NULL,"                        \
    " status TEXT NOT NULL, detail TEXT NOT NULL DEFAULT '', gpu_name TEXT NOT NULL DEFAULT '',"                       \
    " pid INTEGER NOT NULL DEFAULT 0, tested INTEGER NOT NULL, seconds REAL NOT NULL DEFAULT 0,"                       \
    " PRIMARY KEY(binary_key, kernel, gpu_uuid, driver, tk_version))"
#define SELFTEST_INDEX "CREATE INDEX IF NOT EXISTS selftest_pkg ON selftest(package, gpu_uuid)"

static int migrate(tk_kcache *c)
{
    sqlite3_stmt *st = NULL;
    int ver = 0, rc;

    if ((rc = exec(c, "BEGIN IMMEDIATE")) != TK_OK)
        return rc;
    if (sqlite3_prepare_v2(c->db, "PRAGMA user_version", -1, &st, NULL) != SQLITE_OK ||
        sqlite3_step(st) != SQLITE_ROW) {
        rc = dberr(c, "reading the schema version");
        goto fail;
    }
    ver = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    st = NULL;
    if (ver > KC_SCHEMA) {
        rc = tk__err(TK_ERR_CACHE,
                     "compiled-binary cache %s has schema %d, newer than this tk knows (%d)\n"
                     "HINT: use the newer tk, or give this one its own cache (TK_HOME), or delete the file",
                     c->path, ver, KC_SCHEMA);
        goto fail;
    }
    if (ver == KC_SCHEMA) {
        rc = exec(c, "COMMIT");
        goto fail;
    }
    /* schema 1 -> 2 -> 3: the autotune table, then the self-test table are new; the compiled
     * binaries and tuned choices stay */
    if (ver == 1 || ver == 2) {
        if ((ver == 1 && (rc = exec(c, TUNE_TABLE)) != TK_OK) || (rc = exec(c, SELFTEST_TABLE)) != TK_OK ||
            (rc = exec(c, SELFTEST_INDEX)) != TK_OK || (rc = exec(c, "PRAGMA user_version = 3")) != TK_OK ||
            (rc = exec(c, "COMMIT")) != TK_OK)
            goto fail;
        return TK_OK;
    }
    /* new: it is a cache, so anything else is simply replaced */
    if ((rc = exec(c, "DROP TABLE IF EXISTS entries")) != TK_OK ||
        (rc = exec(c, "DROP TABLE IF EXISTS tune")) != TK_OK ||
        (rc = exec(c, "DROP TABLE IF EXISTS selftest")) != TK_OK ||
        (rc = exec(c, "CREATE TABLE entries("
                      " key TEXT PRIMARY KEY,"
                      " package TEXT, unit TEXT, target TEXT, nvrtc TEXT,"
                      " size INTEGER NOT NULL,"
                      " sha256 TEXT NOT NULL,"
                      " blob BLOB NOT NULL,"
                      " created INTEGER NOT NULL,"
                      " last_used INTEGER NOT NULL,"
                      " hits INTEGER NOT NULL DEFAULT 0)")) != TK_OK ||
        (rc = exec(c, "CREATE INDEX entries_lru ON entries(last_used)")) != TK_OK ||
        (rc = exec(c, TUNE_TABLE)) != TK_OK || (rc = exec(c, SELFTEST_TABLE)) != TK_OK ||
        (rc = exec(c, SELFTEST_INDEX)) != TK_OK || (rc = exec(c, "PRAGMA user_version = 3")) != TK_OK ||
        (rc = exec(c, "COMMIT")) != TK_OK)
        goto fail;
    return TK_OK;
fail:
    sqlite3_finalize(st);
    rollback(c);
    return rc;
}

static int auto_vacuum_incremental(tk_kcache *c)
{
    sqlite3_stmt *st = NULL;
    int mode = -1;
    if (sqlite3_prepare_v2(c->db, "PRAGMA auto_vacuum", -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
        mode = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return mode == 2 ? TK_OK : exec(c, "PRAGMA auto_vacuum = INCREMENTAL");
}

int tk_kcache__open(tk_kcache **out, const char *dir, int64_t max_bytes)
{
    tk_kcache *c = NULL;
    int rc;

    *out = NULL;
    if (!dir || !*dir)
        return tk__err(TK_ERR_INVALID, "compiled-binary cache: no directory");
    if ((rc = tk__mkdirs(dir, 0700)) != TK_OK)
        return rc;
    if (!(c = calloc(1, sizeof *c)) || !(c->path = tk__path_join(dir, "cache.db"))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory opening the cache");
        goto fail;
    }
    c->magic = KC_MAGIC;
    c->max_bytes = max_bytes > 0 ? max_bytes : 0;
    if ((rc = tk__check_not_link(c->path, "-wal")) != TK_OK || (rc = tk__check_not_link(c->path, "-shm")) != TK_OK ||
        (rc = tk__check_not_link(c->path, "-journal")) != TK_OK || (rc = tk__check_not_link(c->path, "")) != TK_OK)
        goto fail;
    if (sqlite3_open_v2(c->path, &c->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOFOLLOW, NULL) !=
        SQLITE_OK) {
        rc = dberr(c, "open");
        goto fail;
    }
    sqlite3_busy_timeout(c->db, KC_BUSY_MS);
    /* auto_vacuum must be chosen before the first table exists; it lets gc give space back. Setting it
     * writes the database header (a transaction, and fsyncs when the connection closes) even when it
     * is already set, so only a database that does not have it yet gets it. */
    if ((rc = auto_vacuum_incremental(c)) != TK_OK || (rc = exec(c, "PRAGMA journal_mode = WAL")) != TK_OK ||
        (rc = exec(c, "PRAGMA synchronous = NORMAL")) != TK_OK || (rc = migrate(c)) != TK_OK)
        goto fail;
    *out = c;
    return TK_OK;
fail:
    tk_kcache__close(c);
    return rc;
}

void tk_kcache__close(tk_kcache *c)
{
    if (!c)
        return;
    if (c->db)
        sqlite3_close_v2(c->db);
    free(c->path);
    c->magic = 0;
    free(c);
}

const char *tk_kcache__path(const tk_kcache *c) { return c ? c->path : ""; }
int64_t tk_kcache__max_bytes(const tk_kcache *c) { return c ? c->max_bytes : 0; }

static int check(const tk_kcache *c, const char *key)
{
    if (!c || c->magic != KC_MAGIC)
        return tk__err(TK_ERR_INVALID, "compiled-binary cache: not an open cache");
    if (key && !tk__is_hex(key, 64))
        return tk__err(TK_ERR_INVALID, "compiled-binary cache: bad key '%s'", key);
    return TK_OK;
}

int tk_kcache__remove(tk_kcache *c, const char *key)
{
    sqlite3_stmt *st = NULL;
    int rc;
    if ((rc = check(c, key)) != TK_OK)
        return rc;
    if (sqlite3_prepare_v2(c->db, "DELETE FROM entries WHERE key = ?1", -1, &st, NULL) != SQLITE_OK)
        return dberr(c, "prepare delete");
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    rc = sqlite3_step(st) == SQLITE_DONE ? TK_OK : dberr(c, "delete");
    sqlite3_finalize(st);
    return rc;
}

int tk_kcache__has(tk_kcache *c, const char *key)
{
    sqlite3_stmt *st = NULL;
    int found;
    if (check(c, key) != TK_OK ||
        sqlite3_prepare_v2(c->db, "SELECT 1 FROM entries WHERE key = ?1", -1, &st, NULL) != SQLITE_OK)
        return 0;
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    found = sqlite3_step(st) == SQLITE_ROW;
    sqlite3_finalize(st);
    return found;
}

int tk_kcache__get(tk_kcache *c, const char *key, uint8_t **data, size_t *len)
{
    sqlite3_stmt *st = NULL;
    const uint8_t *blob;
    const char *digest;
    char got[TK_SHA256_HEX];
    size_t n;
    int rc, corrupt = 0, step, fresh;

    *data = NULL;
    *len = 0;
    if ((rc = check(c, key)) != TK_OK)
        return rc;
    if (sqlite3_prepare_v2(c->db,
                           "SELECT blob, sha256, last_used, last_used >= (SELECT max(last_used) FROM entries) "
                           "FROM entries WHERE key = ?1",
                           -1, &st, NULL) != SQLITE_OK)
        return dberr(c, "prepare lookup");
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    step = sqlite3_step(st);
    if (step == SQLITE_DONE) {
        sqlite3_finalize(st);
        return tk__err(TK_ERR_NOT_FOUND, "no cached binary for key %.16s", key);
    }
    if (step != SQLITE_ROW) {
        rc = dberr(c, "lookup");
        sqlite3_finalize(st);
        return rc;
    }
    blob = sqlite3_column_blob(st, 0);
    n = (size_t)sqlite3_column_bytes(st, 0);
    digest = (const char *)sqlite3_column_text(st, 1);
    /* already the most recently used, and used within the last minute: touching it again changes no
     * order, and the write (a WAL transaction, and the checkpoint's fsyncs when the connection closes)
     * was most of a warm tk_get_kernel's cost */
    fresh = sqlite3_column_int(st, 3) && now_us() - sqlite3_column_int64(st, 2) < TOUCH_US;
    if (!blob || n < KC_HDR || memcmp(blob, KC_BLOB_MAGIC, 4) != 0 ||
        (blob[4] | blob[5] << 8 | blob[6] << 16 | (uint32_t)blob[7] << 24) != KC_BLOB_VERSION ||
        tk__sha256_hex(got, blob, n) != TK_OK || !digest || strcmp(got, digest) != 0) {
        corrupt = 1;
    } else if (!(*data = malloc(n - KC_HDR + 1))) {
        sqlite3_finalize(st);
        return tk__err(TK_ERR_NOMEM, "out of memory reading the cache");
    } else {
        memcpy(*data, blob + KC_HDR, n - KC_HDR);
        (*data)[n - KC_HDR] = 0;
        *len = n - KC_HDR;
    }
    sqlite3_finalize(st);
    st = NULL;
    if (corrupt) {
        tk_kcache__remove(c, key); /* best effort: it is a miss either way */
        return tk__err(TK_ERR_NOT_FOUND, "cached binary %.16s was corrupt and has been removed", key);
    }
    /* LRU bookkeeping; a busy database only costs the ordering of this one hit */
    if (fresh)
        return TK_OK;
    if (sqlite3_prepare_v2(c->db,
                           "UPDATE entries SET hits = hits + 1, last_used = "
                           "max(?1, (SELECT coalesce(max(last_used), 0) FROM entries) + 1) WHERE key = ?2",
                           -1, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_int64(st, 1, now_us());
        sqlite3_bind_text(st, 2, key, -1, SQLITE_STATIC);
        sqlite3_step(st);
    }
    sqlite3_finalize(st);
    return TK_OK;
}

/* Deletes least-recently-used entries (never `keep`) until the total is at most max. In a
 * transaction the caller opened. */
static int evict(tk_kcache *c, int64_t max, const char *keep, int64_t *freed)
{
    sqlite3_stmt *sum = NULL, *sel = NULL, *del = NULL;
    int64_t total = 0;
    int rc = TK_OK;

    if (sqlite3_prepare_v2(c->db, "SELECT coalesce(sum(size), 0) FROM entries", -1, &sum, NULL) != SQLITE_OK ||
        sqlite3_step(sum) != SQLITE_ROW) {
        rc = dberr(c, "sum sizes");
        goto done;
    }
    total = sqlite3_column_int64(sum, 0);
    if (total <= max)
        goto done;
    if (sqlite3_prepare_v2(c->db, "SELECT key, size FROM entries ORDER BY last_used ASC", -1, &sel, NULL) !=
            SQLITE_OK ||
        sqlite3_prepare_v2(c->db, "DELETE FROM entries WHERE key = ?1", -1, &del, NULL) != SQLITE_OK) {
        rc = dberr(c, "prepare eviction");
        goto done;
    }
    while (total > max) {
        int s = sqlite3_step(sel);
        const char *k;
        int64_t size;
        if (s == SQLITE_DONE)
            break;
        if (s != SQLITE_ROW) {
            rc = dberr(c, "eviction scan");
            goto done;
        }
        k = (const char *)sqlite3_column_text(sel, 0);
        size = sqlite3_column_int64(sel, 1);
        if (!k || (keep && strcmp(k, keep) == 0))
            continue;
        sqlite3_bind_text(del, 1, k, -1, SQLITE_TRANSIENT);
        if (sqlite3_step(del) != SQLITE_DONE) {
            rc = dberr(c, "evict");
            goto done;
        }
        sqlite3_reset(del);
        total -= size;
        if (freed)
            *freed += size;
    }
done:
    sqlite3_finalize(sum);
    sqlite3_finalize(sel);
    sqlite3_finalize(del);
    return rc;
}

int tk_kcache__put(tk_kcache *c, const char *key, const tk_kcache_meta *meta, const void *data, size_t len,
                   int *inserted)
{
    sqlite3_stmt *st = NULL;
    uint8_t *blob = NULL;
    char digest[TK_SHA256_HEX];
    int64_t now = now_us();
    int rc;

    if (inserted)
        *inserted = 0;
    if ((rc = check(c, key)) != TK_OK)
        return rc;
    if (!data && len)
        return tk__err(TK_ERR_INVALID, "compiled-binary cache: no data");
    if (len > (size_t)INT32_MAX - KC_HDR)
        return tk__err(TK_ERR_INVALID, "compiled binary of %zu bytes is too large to cache", len);
    /* build and hash the blob before taking the write lock */
    if (!(blob = malloc(len + KC_HDR)))
        return tk__err(TK_ERR_NOMEM, "out of memory writing the cache");
    memcpy(blob, KC_BLOB_MAGIC, 4);
    blob[4] = (uint8_t)KC_BLOB_VERSION;
    blob[5] = blob[6] = blob[7] = 0;
    if (len)
        memcpy(blob + KC_HDR, data, len);
    if ((rc = tk__sha256_hex(digest, blob, len + KC_HDR)) != TK_OK)
        goto fail;

    if ((rc = exec(c, "BEGIN IMMEDIATE")) != TK_OK)
        goto fail;
    if (sqlite3_prepare_v2(c->db,
                           "INSERT OR IGNORE INTO entries(key, package, unit, target, nvrtc, size, sha256,"
                           " blob, created, last_used, hits) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9,"
                           " max(?9, (SELECT coalesce(max(last_used), 0) FROM entries) + 1), 0)",
                           -1, &st, NULL) != SQLITE_OK) {
        rc = dberr(c, "prepare insert");
        goto fail;
    }
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, meta && meta->package ? meta->package : "", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, meta && meta->unit ? meta->unit : "", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, meta && meta->target ? meta->target : "", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, meta && meta->nvrtc ? meta->nvrtc : "", -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 6, (int64_t)len);
    sqlite3_bind_text(st, 7, digest, -1, SQLITE_STATIC);
    sqlite3_bind_blob(st, 8, blob, (int)(len + KC_HDR), SQLITE_STATIC);
    sqlite3_bind_int64(st, 9, now);
    if (sqlite3_step(st) != SQLITE_DONE) {
        rc = dberr(c, "insert");
        goto fail;
    }
    if (inserted)
        *inserted = sqlite3_changes(c->db) > 0;
    sqlite3_finalize(st);
    st = NULL;
    if (c->max_bytes > 0 && (rc = evict(c, c->max_bytes, key, NULL)) != TK_OK)
        goto fail;
    if ((rc = exec(c, "COMMIT")) != TK_OK)
        goto fail;
    free(blob);
    return TK_OK;
fail:
    sqlite3_finalize(st);
    rollback(c);
    free(blob);
    if (inserted)
        *inserted = 0;
    return rc;
}

int tk_kcache__gc(tk_kcache *c, int64_t max_bytes, int64_t *freed)
{
    int rc;
    int64_t f = 0;
    if (freed)
        *freed = 0;
    if ((rc = check(c, NULL)) != TK_OK)
        return rc;
    if (max_bytes < 0)
        max_bytes = 0;
    if ((rc = exec(c, "BEGIN IMMEDIATE")) != TK_OK)
        return rc;
    if ((rc = evict(c, max_bytes, NULL, &f)) != TK_OK || (rc = exec(c, "COMMIT")) != TK_OK) {
        rollback(c);
        return rc;
    }
    if (f)
        sqlite3_exec(c->db, "PRAGMA incremental_vacuum", NULL, NULL, NULL);
    if (freed)
        *freed = f;
    return TK_OK;
}

int tk_kcache__tune_get(tk_kcache *c, const char *key, char **impl)
{
    sqlite3_stmt *st = NULL;
    int rc;
    *impl = NULL;
    if ((rc = check(c, key)) != TK_OK)
        return rc;
    if (sqlite3_prepare_v2(c->db, "SELECT impl FROM tune WHERE key = ?", -1, &st, NULL) != SQLITE_OK)
        return dberr(c, "reading a tuned choice");
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    int r = sqlite3_step(st);
    if (r == SQLITE_ROW)
        rc = (*impl = tk__strdup((const char *)sqlite3_column_text(st, 0))) ? TK_OK
                                                                            : tk__err(TK_ERR_NOMEM, "out of memory");
    else
        rc = r == SQLITE_DONE ? TK_ERR_NOT_FOUND : dberr(c, "reading a tuned choice");
    sqlite3_finalize(st);
    return rc;
}

int tk_kcache__tune_put(tk_kcache *c, const char *key, const char *impl, double us, const char *detail)
{
    sqlite3_stmt *st = NULL;
    int rc;
    if ((rc = check(c, key)) != TK_OK)
        return rc;
    if (!impl)
        return tk__err(TK_ERR_INVALID, "tune_put: impl is NULL");
    if (sqlite3_prepare_v2(c->db, "INSERT OR REPLACE INTO tune(key, impl, us, detail, measured) VALUES(?,?,?,?,?)", -1,
                           &st, NULL) != SQLITE_OK)
        return dberr(c, "recording a tuned choice");
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, impl, -1, SQLITE_STATIC);
    sqlite3_bind_double(st, 3, us);
    sqlite3_bind_text(st, 4, detail ? detail : "", -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 5, tk__now());
    rc = sqlite3_step(st) == SQLITE_DONE ? TK_OK : dberr(c, "recording a tuned choice");
    sqlite3_finalize(st);
    return rc;
}

int tk_kcache__clear(tk_kcache *c, int64_t *freed)
{
    if (check(c, NULL) == TK_OK && sqlite3_exec(c->db, "DELETE FROM tune", NULL, NULL, NULL) != SQLITE_OK)
        return dberr(c, "clearing the tuned choices");
    int rc = tk_kcache__gc(c, 0, freed);
    if (rc == TK_OK)
        sqlite3_exec(c->db, "PRAGMA wal_checkpoint(TRUNCATE)", NULL, NULL, NULL);
    return rc;
}

int tk_kcache__stats(tk_kcache *c, int64_t *entries, int64_t *bytes)
{
    sqlite3_stmt *st = NULL;
    int rc;
    if (entries)
        *entries = 0;
    if (bytes)
        *bytes = 0;
    if ((rc = check(c, NULL)) != TK_OK)
        return rc;
    if (sqlite3_prepare_v2(c->db, "SELECT count(*), coalesce(sum(size), 0) FROM entries", -1, &st, NULL) != SQLITE_OK ||
        sqlite3_step(st) != SQLITE_ROW) {
        rc = dberr(c, "stats");
        sqlite3_finalize(st);
        return rc;
    }
    if (entries)
        *entries = sqlite3_column_int64(st, 0);
    if (bytes)
        *bytes = sqlite3_column_int64(st, 1);
    sqlite3_finalize(st);
    return TK_OK;
}

static const char *col_text(sqlite3_stmt *st, int i)
{
    const char *s = (const char *)sqlite3_column_text(st, i);
    return s ? s : "";
}

int tk_kcache__list(tk_kcache *c, int (*each)(void *user, const tk_kcache_entry *e), void *user)
{
    sqlite3_stmt *st = NULL;
    int rc, s;
    if ((rc = check(c, NULL)) != TK_OK)
        return rc;
    if (sqlite3_prepare_v2(c->db,
                           "SELECT key, package, unit, target, nvrtc, size, created, last_used, hits"
                           " FROM entries ORDER BY last_used DESC",
                           -1, &st, NULL) != SQLITE_OK)
        return dberr(c, "prepare list");
    while ((s = sqlite3_step(st)) == SQLITE_ROW) {
        tk_kcache_entry e;
        e.key = col_text(st, 0);
        e.package = col_text(st, 1);
        e.unit = col_text(st, 2);
        e.target = col_text(st, 3);
        e.nvrtc = col_text(st, 4);
        e.size = sqlite3_column_int64(st, 5);
        e.created = sqlite3_column_int64(st, 6) / 1000000;
        e.last_used = sqlite3_column_int64(st, 7) / 1000000;
        e.hits = sqlite3_column_int64(st, 8);
        if (each(user, &e) != 0) {
            s = SQLITE_DONE;
            break;
        }
    }
    rc = s == SQLITE_DONE ? TK_OK : dberr(c, "list");
    sqlite3_finalize(st);
    return rc;
}

int tk_kcache__parse_size(const char *s, int64_t *out)
{
    char *end;
    long long v;
    int64_t mul = 1;
    if (!s || !*s || !out)
        return -1;
    while (*s == ' ')
        s++;
    if (*s < '0' || *s > '9')
        return -1;
    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno || v < 0)
        return -1;
    switch (*end) {
    case 'k':
    case 'K':
        mul = (int64_t)1 << 10;
        end++;
        break;
    case 'm':
    case 'M':
        mul = (int64_t)1 << 20;
        end++;
        break;
    case 'g':
    case 'G':
        mul = (int64_t)1 << 30;
        end++;
        break;
    case 't':
    case 'T':
        mul = (int64_t)1 << 40;
        end++;
        break;
    default: break;
    }
    if (mul > 1 && *end == 'i')
        end++;
    if (*end == 'b' || *end == 'B')
        end++;
    if (*end != '\0')
        return -1;
    if (__builtin_mul_overflow((int64_t)v, mul, out))
        return -1;
    return 0;
}

/* ---- self-test results ------------------------------------------------------------------------ */

static int st_check(const tk_kcache_selftest *r)
{
    if (!r || !r->binary_key || !tk__is_hex(r->binary_key, 64) || !r->kernel || !*r->kernel || !r->gpu_uuid ||
        !*r->gpu_uuid || !r->driver || !*r->driver || !r->tk_version || !*r->tk_version || !r->package || !r->op ||
        !r->status || !*r->status)
        return tk__err(TK_ERR_INVALID, "self-test record: binary_key (64 hex), kernel, gpu_uuid, driver, "
                                       "tk_version, package, op and status are required");
    return TK_OK;
}

int tk_kcache__selftest_put(tk_kcache *c, const tk_kcache_selftest *r)
{
    sqlite3_stmt *st = NULL;
    int rc;
    if ((rc = check(c, NULL)) != TK_OK || (rc = st_check(r)) != TK_OK)
        return rc;
    if ((rc = exec(c, "BEGIN IMMEDIATE")) != TK_OK)
        return rc;
    if (sqlite3_prepare_v2(c->db,
                           "INSERT OR REPLACE INTO selftest(binary_key, kernel, gpu_uuid, driver, tk_version, package,"
                           " op, status, detail, gpu_name, pid, tested, seconds)"
                           " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
                           -1, &st, NULL) != SQLITE_OK) {
        rc = dberr(c, "recording a self-test");
        goto fail;
    }
    sqlite3_bind_text(st, 1, r->binary_key, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, r->kernel, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, r->gpu_uuid, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, r->driver, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, r->tk_version, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 6, r->package, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 7, r->op, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 8, r->status, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 9, r->detail ? r->detail : "", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 10, r->gpu_name ? r->gpu_name : "", -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 11, r->pid);
    sqlite3_bind_int64(st, 12, r->tested ? r->tested : tk__now());
    sqlite3_bind_double(st, 13, r->seconds);
    if (sqlite3_step(st) != SQLITE_DONE) {
        rc = dberr(c, "recording a self-test");
        goto fail;
    }
    sqlite3_finalize(st);
    st = NULL;
    if ((rc = exec(c, "COMMIT")) != TK_OK)
        goto fail;
    return TK_OK;
fail:
    sqlite3_finalize(st);
    rollback(c);
    return rc;
}

int tk_kcache__selftest_query(tk_kcache *c, const tk_kcache_selftest *filter,
                              int (*each)(void *user, const tk_kcache_selftest *r), void *user)
{
    static const char *const cols[] = {"binary_key", "kernel", "gpu_uuid", "driver", "tk_version", "package"};
    const char *vals[6] = {NULL};
    sqlite3_stmt *st = NULL;
    tk_buf sql = TK_BUF_INIT;
    int rc, s, nb = 0;
    if ((rc = check(c, NULL)) != TK_OK)
        return rc;
    if (filter) {
        vals[0] = filter->binary_key;
        vals[1] = filter->kernel;
        vals[2] = filter->gpu_uuid;
        vals[3] = filter->driver;
        vals[4] = filter->tk_version;
        vals[5] = filter->package;
    }
    tk__buf_puts(&sql, "SELECT binary_key, kernel, gpu_uuid, driver, tk_version, package, op, status, detail,"
                       " gpu_name, pid, tested, seconds FROM selftest");
    for (int i = 0; i < 6; i++)
        if (vals[i]) {
            tk__buf_printf(&sql, "%s%s = ?%d", nb ? " AND " : " WHERE ", cols[i], nb + 1);
            nb++;
        }
    tk__buf_puts(&sql, " ORDER BY package, kernel, tested DESC");
    if (!sql.data) {
        tk__buf_free(&sql);
        return tk__err(TK_ERR_NOMEM, "out of memory");
    }
    if (sqlite3_prepare_v2(c->db, sql.data, -1, &st, NULL) != SQLITE_OK) {
        tk__buf_free(&sql);
        return dberr(c, "reading self-tests");
    }
    tk__buf_free(&sql);
    for (int i = 0, k = 1; i < 6; i++)
        if (vals[i])
            sqlite3_bind_text(st, k++, vals[i], -1, SQLITE_STATIC);
    while ((s = sqlite3_step(st)) == SQLITE_ROW) {
        tk_kcache_selftest r;
        r.binary_key = col_text(st, 0);
        r.kernel = col_text(st, 1);
        r.gpu_uuid = col_text(st, 2);
        r.driver = col_text(st, 3);
        r.tk_version = col_text(st, 4);
        r.package = col_text(st, 5);
        r.op = col_text(st, 6);
        r.status = col_text(st, 7);
        r.detail = col_text(st, 8);
        r.gpu_name = col_text(st, 9);
        r.pid = sqlite3_column_int64(st, 10);
        r.tested = sqlite3_column_int64(st, 11);
        r.seconds = sqlite3_column_double(st, 12);
        if (each(user, &r) != 0) {
            s = SQLITE_DONE;
            break;
        }
    }
    rc = s == SQLITE_DONE ? TK_OK : dberr(c, "reading self-tests");
    sqlite3_finalize(st);
    return rc;
}

int tk_kcache__selftest_forget(tk_kcache *c, const char *package, int64_t *removed)
{
    sqlite3_stmt *st = NULL;
    int rc;
    if (removed)
        *removed = 0;
    if ((rc = check(c, NULL)) != TK_OK)
        return rc;
    if (sqlite3_prepare_v2(c->db, package ? "DELETE FROM selftest WHERE package = ?1" : "DELETE FROM selftest", -1, &st,
                           NULL) != SQLITE_OK)
        return dberr(c, "forgetting self-tests");
    if (package)
        sqlite3_bind_text(st, 1, package, -1, SQLITE_STATIC);
    rc = sqlite3_step(st) == SQLITE_DONE ? TK_OK : dberr(c, "forgetting self-tests");
    if (rc == TK_OK && removed)
        *removed = sqlite3_changes(c->db);
    sqlite3_finalize(st);
    return rc;
}
