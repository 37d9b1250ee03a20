/*
 * state.c — state.db (SQLite) and the content-addressed store. See state.h for the layout and the
 * crash-safety argument.
 *
 * Concurrency: WAL mode lets readers run beside one writer; writers take BEGIN IMMEDIATE and wait up
 * to the busy timeout. No transaction is held across a download or a compile: callers do their slow
 * work first and then write their rows in one short transaction.
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

#include "cache/state.h"
#include "common/common.h"

#define BUSY_TIMEOUT_MS 30000

struct tk_state {
    sqlite3 *db;
    char *dir;
    char *store;     /* dir/store */
    char *objects;   /* dir/store/objects */
    char *tmp;       /* dir/store/tmp */
    int lock_fd;
};

static const char *schema_v1 =
    "CREATE TABLE IF NOT EXISTS registries(url TEXT PRIMARY KEY, first_used INTEGER NOT NULL,"
    "  last_used INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS packages(name TEXT NOT NULL, major INTEGER NOT NULL,"
    "  version TEXT NOT NULL, commit_id TEXT NOT NULL, manifest_sha256 TEXT NOT NULL,"
    "  manifest BLOB NOT NULL, signer TEXT NOT NULL, registry TEXT NOT NULL,"
    "  installed_at INTEGER NOT NULL, PRIMARY KEY(name, major));"
    "CREATE TABLE IF NOT EXISTS files(name TEXT NOT NULL, major INTEGER NOT NULL, path TEXT NOT NULL,"
    "  sha256 TEXT NOT NULL, size INTEGER NOT NULL, PRIMARY KEY(name, major, path));"
    "CREATE INDEX IF NOT EXISTS files_sha ON files(sha256);"
    "CREATE TABLE IF NOT EXISTS trust(org TEXT NOT NULL, keyid TEXT NOT NULL, pubkey TEXT NOT NULL,"
    "  comment TEXT, added INTEGER NOT NULL, PRIMARY KEY(org, keyid));"
    "CREATE TABLE IF NOT EXISTS seen(name TEXT NOT NULL, major INTEGER NOT NULL,"
    "  version TEXT NOT NULL, commit_id TEXT NOT NULL, seen_at INTEGER NOT NULL,"
    "  PRIMARY KEY(name, major));";

int tk_state__dberr(tk_state *st, const char *what)
{
    const char *msg = st && st->db ? sqlite3_errmsg(st->db) : "no database";
    int code = st && st->db ? sqlite3_errcode(st->db) : 0;
    int primary = code & 0xff;
    if (primary == SQLITE_FULL)
        return tk__err(TK_ERR_NOSPACE,
                       "%s: %s (state.db in %s)\nHINT: free some disk space (or point TK_HOME "
                       "elsewhere) and retry",
                       what, msg, st->dir);
    if (primary == SQLITE_IOERR || primary == SQLITE_CANTOPEN || primary == SQLITE_READONLY || primary == SQLITE_PERM)
        return tk__err(code == SQLITE_IOERR_NOMEM ? TK_ERR_NOMEM : TK_ERR_IO,
                       "%s: %s (state.db in %s)\nHINT: check that this directory is writable by you and its "
                       "disk is not full or read-only (or point TK_HOME elsewhere)",
                       what, msg, st->dir);
    if (primary == SQLITE_BUSY || primary == SQLITE_LOCKED)
        return tk__err(TK_ERR_CACHE,
                       "%s: the state database stayed locked for %d s (%s)\n"
                       "HINT: another tk process is holding it; retry when it has finished",
                       what, BUSY_TIMEOUT_MS / 1000, msg);
    return tk__err(TK_ERR_CACHE, "%s: %s (state.db in %s)", what, msg, st ? st->dir : "?");
}

static int exec(tk_state *st, const char *sql, const char *what)
{
    char *err = NULL;
    if (sqlite3_exec(st->db, sql, NULL, NULL, &err) != SQLITE_OK) {
        sqlite3_free(err);
        return tk_state__dberr(st, what);
    }
    return TK_OK;
}

static int migrate(tk_state *st)
{
    sqlite3_stmt *s = NULL;
    int version = 0, rc;
    if (sqlite3_prepare_v2(st->db, "PRAGMA user_version", -1, &s, NULL) != SQLITE_OK)
        return tk_state__dberr(st, "cannot read the schema version");
    if (sqlite3_step(s) == SQLITE_ROW)
        version = sqlite3_column_int(s, 0);
    sqlite3_finalize(s);
    if (version == TK_STATE_SCHEMA)
        return TK_OK;
    if (version > TK_STATE_SCHEMA)
        return tk__err(TK_ERR_CACHE,
                       "state.db in %s has schema version %d, newer than this tk understands (%d)\n"
                       "HINT: upgrade tk, or use another TK_HOME",
                       st->dir, version, TK_STATE_SCHEMA);
    if ((rc = tk_state__begin(st)) != TK_OK)
        return rc;
    /* Re-read inside the write lock: another process may have migrated meanwhile. */
    if ((rc = exec(st, schema_v1, "cannot create the state schema")) != TK_OK)
        goto fail;
    char pragma[64];
    snprintf(pragma, sizeof pragma, "PRAGMA user_version=%d", TK_STATE_SCHEMA);
    if ((rc = exec(st, pragma, "cannot set the schema version")) != TK_OK)
        goto fail;
    return tk_state__commit(st);
fail:
    tk_state__rollback(st);
    return rc;
}

int tk_state__open(tk_state **out, const char *data_dir)
{
    *out = NULL;
    int rc = TK_OK;
    char *dbpath = NULL;
    tk_state *st = calloc(1, sizeof *st);
    if (!st)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    st->lock_fd = -1;
    st->dir = tk__strdup(data_dir);
    st->store = tk__path_join(data_dir, "store");
    st->objects = st->store ? tk__path_join(st->store, "objects") : NULL;
    st->tmp = st->store ? tk__path_join(st->store, "tmp") : NULL;
    dbpath = tk__path_join(data_dir, "state.db");
    if (!st->dir || !st->store || !st->objects || !st->tmp || !dbpath) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto fail;
    }
    /* No directory tk writes into below the data dir may be a link (the data dir itself may). */
    if ((rc = tk__mkdirs(st->objects, 0755)) != TK_OK || (rc = tk__mkdirs(st->tmp, 0755)) != TK_OK ||
        (rc = tk__check_real_dir(st->store)) != TK_OK || (rc = tk__check_real_dir(st->objects)) != TK_OK ||
        (rc = tk__check_real_dir(st->tmp)) != TK_OK)
        goto fail;
    /* NOFOLLOW: SQLite refuses a state.db that is a link, and then opens no -wal or -shm through one
     * either; the checks before name a planted link instead of SQLite's "unable to open". */
    if ((rc = tk__check_not_link(dbpath, "-wal")) != TK_OK || (rc = tk__check_not_link(dbpath, "-shm")) != TK_OK ||
        (rc = tk__check_not_link(dbpath, "-journal")) != TK_OK || (rc = tk__check_not_link(dbpath, "")) != TK_OK)
        goto fail;
    if (sqlite3_open_v2(dbpath, &st->db,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX | SQLITE_OPEN_NOFOLLOW,
                        NULL) != SQLITE_OK) {
        rc = tk_state__dberr(st, "cannot open state.db");
        goto fail;
    }
    sqlite3_busy_timeout(st->db, BUSY_TIMEOUT_MS);
    if ((rc = exec(st, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;",
                   "cannot configure state.db")) != TK_OK)
        goto fail;
    if ((rc = migrate(st)) != TK_OK)
        goto fail;
    free(dbpath);
    *out = st;
    return TK_OK;
fail:
    free(dbpath);
    tk_state__close(st);
    return rc;
}

void tk_state__close(tk_state *st)
{
    if (!st)
        return;
    if (st->db)
        sqlite3_close(st->db);
    if (st->lock_fd >= 0)
        close(st->lock_fd);
    free(st->dir);
    free(st->store);
    free(st->objects);
    free(st->tmp);
    free(st);
}

sqlite3 *tk_state__db(tk_state *st) { return st->db; }
const char *tk_state__store_dir(const tk_state *st) { return st->store; }
const char *tk_state__tmp_dir(const tk_state *st) { return st->tmp; }

int tk_state__begin(tk_state *st) { return exec(st, "BEGIN IMMEDIATE", "cannot start a transaction"); }
int tk_state__commit(tk_state *st) { return exec(st, "COMMIT", "cannot commit"); }
void tk_state__rollback(tk_state *st)
{
    if (!sqlite3_get_autocommit(st->db))
        sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
}

int tk_state__lock_store(tk_state *st, int exclusive)
{
    if (st->lock_fd < 0) {
        char *p = tk__path_join(st->store, ".lock");
        if (!p)
            return tk__err(TK_ERR_NOMEM, "out of memory");
        int rc = tk__open_nofollow(&st->lock_fd, p, O_RDWR | O_CREAT, 0644);
        free(p);
        if (rc != TK_OK)
            return rc;
    }
    while (flock(st->lock_fd, exclusive ? LOCK_EX : LOCK_SH) != 0) {
        if (errno != EINTR)
            return tk__err_sys("cannot lock the store", st->store);
    }
    return TK_OK;
}

void tk_state__unlock_store(tk_state *st)
{
    if (st->lock_fd >= 0)
        flock(st->lock_fd, LOCK_UN);
}

char *tk_state__object_path(const tk_state *st, const char *sha256)
{
    return tk__fmt("%s/%.2s/%s", st->objects, sha256, sha256);
}

int tk_state__object_put(tk_state *st, const char *src, const char *sha256)
{
    /* Relative to directory descriptors opened without following links, so neither a planted
     * objects/<ab> link nor an object that is a link can send the file (or a read) outside the store. */
    int rc = TK_OK, ofd = -1, dfd = -1, fd = -1;
    char sub[3] = {sha256[0], sha256[1], '\0'};
    char *dst = tk_state__object_path(st, sha256);
    char *dir = tk__fmt("%s/%.2s", st->objects, sha256);
    struct stat sb;
    if (!dst || !dir) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((ofd = open(st->objects, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0) {
        rc = errno == ELOOP || errno == ENOTDIR ? tk__check_real_dir(st->objects)
                                                : tk__err_sys("cannot open", st->objects);
        goto done;
    }
    if (mkdirat(ofd, sub, 0755) != 0 && errno != EEXIST) {
        rc = tk__err_sys("cannot create directory", dir);
        goto done;
    }
    if ((dfd = openat(ofd, sub, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0) {
        rc = errno == ELOOP || errno == ENOTDIR ? tk__check_real_dir(dir) : tk__err_sys("cannot open", dir);
        goto done;
    }
    if (fstatat(dfd, sha256, &sb, AT_SYMLINK_NOFOLLOW) == 0) {
        if (!S_ISREG(sb.st_mode)) {
            rc = tk__open_nofollow(&fd, dst, O_RDONLY, 0); /* the error that names what is there */
            if (rc == TK_OK)
                rc = tk__err(TK_ERR_IO, "'%s' is not a regular file", dst);
            goto done;
        }
        /* Keep the existing object only if it is intact; a damaged one is replaced below. */
        char have[TK_SHA256_HEX];
        if (tk__sha256_file_nofollow(have, NULL, dst) == TK_OK && strcmp(have, sha256) == 0) {
            unlink(src);
            goto done;
        }
    }
    if ((rc = tk__open_nofollow(&fd, src, O_RDONLY, 0)) != TK_OK)
        goto done;
    int sync_failed = fsync(fd) != 0;
    fchmod(fd, 0444);
    if (sync_failed) {
        rc = tk__err_sys("cannot fsync", src);
        goto done;
    }
    if (renameat(AT_FDCWD, src, dfd, sha256) != 0) {
        rc = tk__err_sys("cannot move into the store", dst);
        goto done;
    }
    if (fsync(dfd) != 0 && errno != EINVAL)
        rc = tk__err_sys("cannot fsync directory", dir);
done:
    if (fd >= 0)
        close(fd);
    if (dfd >= 0)
        close(dfd);
    if (ofd >= 0)
        close(ofd);
    free(dst);
    free(dir);
    return rc;
}

/* ---- packages --------------------------------------------------------------------------------- */

static char *col_text(sqlite3_stmt *s, int i)
{
    const unsigned char *t = sqlite3_column_text(s, i);
    return tk__strdup(t ? (const char *)t : "");
}

void tk_state__pkg_free(tk_state_pkg *p)
{
    if (!p)
        return;
    free(p->name);
    free(p->version);
    free(p->commit);
    free(p->manifest_sha256);
    free(p->manifest);
    free(p->signer);
    free(p->registry);
    for (size_t i = 0; i < p->nfiles; i++) {
        free(p->files[i].path);
        free(p->files[i].sha256);
    }
    free(p->files);
    free(p);
}

void tk_state__pkg_list_free(tk_state_pkg **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        tk_state__pkg_free(v[i]);
    free(v);
}

static int load_files(tk_state *st, tk_state_pkg *p)
{
    sqlite3_stmt *s = NULL;
    int rc = TK_OK;
    if (sqlite3_prepare_v2(st->db, "SELECT path, sha256, size FROM files WHERE name=? AND major=? ORDER BY path", -1,
                           &s, NULL) != SQLITE_OK)
        return tk_state__dberr(st, "cannot query files");
    sqlite3_bind_text(s, 1, p->name, -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 2, p->major);
    size_t cap = 0;
    int r;
    while ((r = sqlite3_step(s)) == SQLITE_ROW) {
        if (p->nfiles == cap) {
            cap = cap ? cap * 2 : 8;
            tk_state_file *f = realloc(p->files, cap * sizeof *f);
            if (!f) {
                rc = tk__err(TK_ERR_NOMEM, "out of memory");
                goto done;
            }
            p->files = f;
        }
        tk_state_file *f = &p->files[p->nfiles++];
        f->path = col_text(s, 0);
        f->sha256 = col_text(s, 1);
        f->size = sqlite3_column_int64(s, 2);
        if (!f->path || !f->sha256) {
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
            goto done;
        }
    }
    if (r != SQLITE_DONE)
        rc = tk_state__dberr(st, "cannot read files");
done:
    sqlite3_finalize(s);
    return rc;
}

#define PKG_COLS "name, major, version, commit_id, manifest_sha256, manifest, signer, registry, installed_at"

static int row_to_pkg(tk_state_pkg **out, tk_state *st, sqlite3_stmt *s)
{
    tk_state_pkg *p = calloc(1, sizeof *p);
    if (!p)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    p->name = col_text(s, 0);
    p->major = sqlite3_column_int(s, 1);
    p->version = col_text(s, 2);
    p->commit = col_text(s, 3);
    p->manifest_sha256 = col_text(s, 4);
    p->manifest_len = (size_t)sqlite3_column_bytes(s, 5);
    p->manifest = tk__strndup(sqlite3_column_blob(s, 5) ? sqlite3_column_blob(s, 5) : "", p->manifest_len);
    p->signer = col_text(s, 6);
    p->registry = col_text(s, 7);
    p->installed_at = sqlite3_column_int64(s, 8);
    int rc = TK_OK;
    if (!p->name || !p->version || !p->commit || !p->manifest_sha256 || !p->manifest || !p->signer || !p->registry)
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
    else
        rc = load_files(st, p);
    if (rc != TK_OK) {
        tk_state__pkg_free(p);
        return rc;
    }
    *out = p;
    return TK_OK;
}

static int query_one(tk_state_pkg **out, tk_state *st, const char *sql, const char *name, int major, const char *text2)
{
    *out = NULL;
    sqlite3_stmt *s = NULL;
    int rc;
    if (sqlite3_prepare_v2(st->db, sql, -1, &s, NULL) != SQLITE_OK)
        return tk_state__dberr(st, "cannot query packages");
    sqlite3_bind_text(s, 1, name, -1, SQLITE_STATIC);
    if (text2)
        sqlite3_bind_text(s, 2, text2, -1, SQLITE_STATIC);
    else if (major > 0)
        sqlite3_bind_int(s, 2, major);
    int r = sqlite3_step(s);
    if (r == SQLITE_ROW)
        rc = row_to_pkg(out, st, s);
    else if (r == SQLITE_DONE)
        rc = tk__err(TK_ERR_NOT_FOUND, "%s is not installed", name);
    else
        rc = tk_state__dberr(st, "cannot read packages");
    sqlite3_finalize(s);
    return rc;
}

int tk_state__pkg_get(tk_state_pkg **out, tk_state *st, const char *name, int major)
{
    if (major > 0)
        return query_one(out, st, "SELECT " PKG_COLS " FROM packages WHERE name=? AND major=?", name, major, NULL);
    return query_one(out, st, "SELECT " PKG_COLS " FROM packages WHERE name=? ORDER BY major DESC LIMIT 1", name, 0,
                     NULL);
}

int tk_state__pkg_get_commit(tk_state_pkg **out, tk_state *st, const char *name, const char *commit)
{
    return query_one(out, st, "SELECT " PKG_COLS " FROM packages WHERE name=? AND commit_id=?", name, 0, commit);
}

int tk_state__pkg_list(tk_state_pkg ***out, size_t *n, tk_state *st)
{
    *out = NULL;
    *n = 0;
    sqlite3_stmt *s = NULL;
    tk_state_pkg **v = NULL;
    size_t len = 0, cap = 0;
    int rc = TK_OK, r;
    if (sqlite3_prepare_v2(st->db, "SELECT " PKG_COLS " FROM packages ORDER BY name, major", -1, &s, NULL) != SQLITE_OK)
        return tk_state__dberr(st, "cannot list packages");
    while ((r = sqlite3_step(s)) == SQLITE_ROW) {
        if (len == cap) {
            cap = cap ? cap * 2 : 8;
            tk_state_pkg **nv = realloc(v, cap * sizeof *nv);
            if (!nv) {
                rc = tk__err(TK_ERR_NOMEM, "out of memory");
                goto fail;
            }
            v = nv;
        }
        if ((rc = row_to_pkg(&v[len], st, s)) != TK_OK)
            goto fail;
        len++;
    }
    if (r != SQLITE_DONE) {
        rc = tk_state__dberr(st, "cannot list packages");
        goto fail;
    }
    sqlite3_finalize(s);
    *out = v;
    *n = len;
    return TK_OK;
fail:
    sqlite3_finalize(s);
    tk_state__pkg_list_free(v, len);
    return rc;
}

int tk_state__pkg_names(char ***out, size_t *n, tk_state *st)
{
    *out = NULL;
    *n = 0;
    sqlite3_stmt *s = NULL;
    char **v = NULL;
    size_t len = 0, cap = 0;
    int rc = TK_OK, r;
    if (sqlite3_prepare_v2(st->db, "SELECT DISTINCT name FROM packages ORDER BY name", -1, &s, NULL) != SQLITE_OK)
        return tk_state__dberr(st, "cannot list packages");
    while ((r = sqlite3_step(s)) == SQLITE_ROW) {
        if (len == cap) {
            cap = cap ? cap * 2 : 8;
            char **nv = realloc(v, cap * sizeof *nv);
            if (!nv) {
                rc = tk__err(TK_ERR_NOMEM, "out of memory");
                break;
            }
            v = nv;
        }
        if (!(v[len] = col_text(s, 0))) {
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
            break;
        }
        len++;
    }
    sqlite3_finalize(s);
    if (rc != TK_OK) {
        for (size_t i = 0; i < len; i++)
            free(v[i]);
        free(v);
        return rc;
    }
    *out = v;
    *n = len;
    return TK_OK;
}

static int step_done(tk_state *st, sqlite3_stmt *s, const char *what)
{
    int r = sqlite3_step(s);
    sqlite3_finalize(s);
    if (r != SQLITE_DONE)
        return tk_state__dberr(st, what);
    return TK_OK;
}

int tk_state__pkg_put(tk_state *st, const tk_state_pkg *p)
{
    sqlite3_stmt *s = NULL;
    int rc;
    if (sqlite3_prepare_v2(st->db, "DELETE FROM files WHERE name=? AND major=?", -1, &s, NULL) != SQLITE_OK)
        return tk_state__dberr(st, "cannot record the package");
    sqlite3_bind_text(s, 1, p->name, -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 2, p->major);
    if ((rc = step_done(st, s, "cannot replace the package's files")) != TK_OK)
        return rc;
    if (sqlite3_prepare_v2(st->db, "INSERT OR REPLACE INTO packages(" PKG_COLS ") VALUES(?,?,?,?,?,?,?,?,?)", -1, &s,
                           NULL) != SQLITE_OK)
        return tk_state__dberr(st, "cannot record the package");
    sqlite3_bind_text(s, 1, p->name, -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 2, p->major);
    sqlite3_bind_text(s, 3, p->version, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 4, p->commit, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 5, p->manifest_sha256, -1, SQLITE_STATIC);
    sqlite3_bind_blob(s, 6, p->manifest, (int)p->manifest_len, SQLITE_STATIC);
    sqlite3_bind_text(s, 7, p->signer, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 8, p->registry, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 9, p->installed_at);
    if ((rc = step_done(st, s, "cannot record the package")) != TK_OK)
        return rc;
    for (size_t i = 0; i < p->nfiles; i++) {
        if (sqlite3_prepare_v2(st->db, "INSERT INTO files(name, major, path, sha256, size) VALUES(?,?,?,?,?)", -1, &s,
                               NULL) != SQLITE_OK)
            return tk_state__dberr(st, "cannot record a file");
        sqlite3_bind_text(s, 1, p->name, -1, SQLITE_STATIC);
        sqlite3_bind_int(s, 2, p->major);
        sqlite3_bind_text(s, 3, p->files[i].path, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 4, p->files[i].sha256, -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, 5, p->files[i].size);
        if ((rc = step_done(st, s, "cannot record a file")) != TK_OK)
            return rc;
    }
    return TK_OK;
}

int tk_state__pkg_delete(tk_state *st, const char *name, int major)
{
    sqlite3_stmt *s = NULL;
    int rc;
    const char *where = major > 0 ? " WHERE name=?1 AND major=?2" : " WHERE name=?1";
    char sql[128];
    snprintf(sql, sizeof sql, "DELETE FROM packages%s", where);
    if (sqlite3_prepare_v2(st->db, sql, -1, &s, NULL) != SQLITE_OK)
        return tk_state__dberr(st, "cannot remove the package");
    sqlite3_bind_text(s, 1, name, -1, SQLITE_STATIC);
    if (major > 0)
        sqlite3_bind_int(s, 2, major);
    if ((rc = step_done(st, s, "cannot remove the package")) != TK_OK)
        return rc;
    if (sqlite3_changes(st->db) == 0)
        return tk__err(TK_ERR_NOT_FOUND, "%s%s is not installed", name, major > 0 ? " (that major)" : "");
    snprintf(sql, sizeof sql, "DELETE FROM files%s", where);
    if (sqlite3_prepare_v2(st->db, sql, -1, &s, NULL) != SQLITE_OK)
        return tk_state__dberr(st, "cannot remove the package's files");
    sqlite3_bind_text(s, 1, name, -1, SQLITE_STATIC);
    if (major > 0)
        sqlite3_bind_int(s, 2, major);
    return step_done(st, s, "cannot remove the package's files");
}

/* ---- versions and rollback -------------------------------------------------------------------- */

static int parse_version(const char *v, long long out[3])
{
    for (int i = 0; i < 3; i++) {
        char *end = NULL;
        if (!v || *v < '0' || *v > '9')
            return -1;
        errno = 0;
        out[i] = strtoll(v, &end, 10);
        if (errno || out[i] < 0)
            return -1;
        if (i < 2 && *end != '.')
            return -1;
        if (i == 2 && *end != '\0')
            return -1;
        v = end + 1;
    }
    return 0;
}

int tk_state__version_cmp(const char *a, const char *b)
{
    long long x[3], y[3];
    if (parse_version(a, x) != 0 || parse_version(b, y) != 0)
        return -2;
    for (int i = 0; i < 3; i++)
        if (x[i] != y[i])
            return x[i] < y[i] ? -1 : 1;
    return 0;
}

int tk_state__seen_get(char **version, tk_state *st, const char *name, int major)
{
    *version = NULL;
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(st->db, "SELECT version FROM seen WHERE name=? AND major=?", -1, &s, NULL) != SQLITE_OK)
        return tk_state__dberr(st, "cannot read seen versions");
    sqlite3_bind_text(s, 1, name, -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 2, major);
    int rc = TK_OK;
    int r = sqlite3_step(s);
    if (r == SQLITE_ROW) {
        if (!(*version = col_text(s, 0)))
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
    } else if (r != SQLITE_DONE) {
        rc = tk_state__dberr(st, "cannot read seen versions");
    }
    sqlite3_finalize(s);
    return rc;
}

int tk_state__seen_put(tk_state *st, const char *name, int major, const char *version, const char *commit)
{
    char *old = NULL;
    int rc = tk_state__seen_get(&old, st, name, major);
    if (rc != TK_OK)
        return rc;
    int newer = !old || tk_state__version_cmp(version, old) > 0;
    free(old);
    if (!newer)
        return TK_OK;
    return tk_state__seen_set(st, name, major, version, commit);
}

int tk_state__seen_set(tk_state *st, const char *name, int major, const char *version, const char *commit)
{
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(st->db,
                           "INSERT OR REPLACE INTO seen(name, major, version, commit_id, seen_at) "
                           "VALUES(?,?,?,?,?)",
                           -1, &s, NULL) != SQLITE_OK)
        return tk_state__dberr(st, "cannot record the version seen");
    sqlite3_bind_text(s, 1, name, -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 2, major);
    sqlite3_bind_text(s, 3, version, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 4, commit, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 5, tk__now());
    return step_done(st, s, "cannot record the version seen");
}

/* ---- trust ------------------------------------------------------------------------------------ */

int tk_state__trust_add(tk_state *st, const char *org, const char *keyid, const char *pubkey, const char *comment)
{
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(st->db, "INSERT OR REPLACE INTO trust(org, keyid, pubkey, comment, added) VALUES(?,?,?,?,?)",
                           -1, &s, NULL) != SQLITE_OK)
        return tk_state__dberr(st, "cannot add a trusted key");
    sqlite3_bind_text(s, 1, org, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, keyid, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 3, pubkey, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 4, comment ? comment : "", -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 5, tk__now());
    return step_done(st, s, "cannot add a trusted key");
}

int tk_state__trust_remove(tk_state *st, const char *org, const char *keyid)
{
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(st->db, "DELETE FROM trust WHERE org=? AND keyid=?", -1, &s, NULL) != SQLITE_OK)
        return tk_state__dberr(st, "cannot remove a trusted key");
    sqlite3_bind_text(s, 1, org, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, keyid, -1, SQLITE_STATIC);
    int rc = step_done(st, s, "cannot remove a trusted key");
    if (rc == TK_OK && sqlite3_changes(st->db) == 0)
        rc = tk__err(TK_ERR_NOT_FOUND,
                     "key %s is not trusted for org '%s'\nHINT: 'tk trust list' shows the trust store", keyid, org);
    return rc;
}

int tk_state__trust_get(char **pubkey, tk_state *st, const char *org, const char *keyid)
{
    *pubkey = NULL;
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(st->db, "SELECT pubkey FROM trust WHERE org=? AND keyid=?", -1, &s, NULL) != SQLITE_OK)
        return tk_state__dberr(st, "cannot read the trust store");
    sqlite3_bind_text(s, 1, org, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, keyid, -1, SQLITE_STATIC);
    int rc = TK_OK, r = sqlite3_step(s);
    if (r == SQLITE_ROW) {
        if (!(*pubkey = col_text(s, 0)))
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
    } else if (r != SQLITE_DONE) {
        rc = tk_state__dberr(st, "cannot read the trust store");
    }
    sqlite3_finalize(s);
    return rc;
}

/* One key id trusted for org (the oldest), or *keyid NULL when the store has none for it. */
int tk_state__trust_org_key(char **keyid, tk_state *st, const char *org)
{
    *keyid = NULL;
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(st->db, "SELECT keyid FROM trust WHERE org=? ORDER BY added, keyid LIMIT 1", -1, &s, NULL) !=
        SQLITE_OK)
        return tk_state__dberr(st, "cannot read the trust store");
    sqlite3_bind_text(s, 1, org, -1, SQLITE_STATIC);
    int rc = TK_OK, r = sqlite3_step(s);
    if (r == SQLITE_ROW) {
        if (!(*keyid = col_text(s, 0)))
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
    } else if (r != SQLITE_DONE) {
        rc = tk_state__dberr(st, "cannot read the trust store");
    }
    sqlite3_finalize(s);
    return rc;
}

/* ---- garbage collection ----------------------------------------------------------------------- */

static int referenced(tk_state *st, const char *sha, int *yes)
{
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(st->db, "SELECT 1 FROM files WHERE sha256=? LIMIT 1", -1, &s, NULL) != SQLITE_OK)
        return tk_state__dberr(st, "cannot query files");
    sqlite3_bind_text(s, 1, sha, -1, SQLITE_STATIC);
    int r = sqlite3_step(s);
    sqlite3_finalize(s);
    if (r != SQLITE_ROW && r != SQLITE_DONE)
        return tk_state__dberr(st, "cannot query files");
    *yes = r == SQLITE_ROW;
    return TK_OK;
}

int tk_state__gc(tk_state *st, int64_t *freed)
{
    int64_t total = 0;
    int rc = tk_state__lock_store(st, 1);
    if (rc != TK_OK)
        return rc;
    DIR *top = opendir(st->objects);
    if (!top) {
        rc = tk__err_sys("cannot open", st->objects);
        goto done;
    }
    struct dirent *e;
    while (rc == TK_OK && (e = readdir(top)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        /* never through a link: a planted objects/<ab> link to a directory elsewhere is removed,
         * and nothing in that directory is touched */
        int sfd = openat(dirfd(top), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        struct stat lsb;
        if (sfd < 0 && fstatat(dirfd(top), e->d_name, &lsb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(lsb.st_mode))
            unlinkat(dirfd(top), e->d_name, 0);
        DIR *d = sfd >= 0 ? fdopendir(sfd) : NULL;
        if (sfd >= 0 && !d)
            close(sfd);
        struct dirent *f;
        while (d && rc == TK_OK && (f = readdir(d)) != NULL) {
            if (f->d_name[0] == '.')
                continue;
            int yes = 1;
            if ((rc = referenced(st, f->d_name, &yes)) != TK_OK || yes)
                continue;
            struct stat sb;
            if (fstatat(dirfd(d), f->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && unlinkat(dirfd(d), f->d_name, 0) == 0)
                total += S_ISREG(sb.st_mode) ? sb.st_size : 0;
        }
        if (d)
            closedir(d);
    }
    closedir(top);
    /* Stale staging files: anything left in tmp/ by a killed process. Holding the exclusive lock
     * means no install is running now. */
    DIR *t = opendir(st->tmp);
    while (t && rc == TK_OK && (e = readdir(t)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char *p = tk__path_join(st->tmp, e->d_name);
        if (p)
            tk__rmtree(p);
        free(p);
    }
    if (t)
        closedir(t);
done:
    tk_state__unlock_store(st);
    if (freed)
        *freed = total;
    return rc;
}
