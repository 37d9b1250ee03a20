/*
 * state.h — tk's persistent state: the SQLite database state.db (installed packages and their files,
 * trust store, newest versions seen, registries) and the content-addressed file store beside it.
 *
 * Layout under the data directory:
 *     state.db                  SQLite, WAL mode, schema version in PRAGMA user_version
 *     store/objects/ab/<sha256> immutable, read-only files named by their sha256
 *     store/tmp/                staging area (same file system, so renames are atomic)
 *     store/.lock               flock: installs hold it shared, object GC holds it exclusive
 *
 * Crash safety: objects are written to tmp/ and renamed into place; a package is installed when
 * its rows commit. A process killed at any point leaves either the old rows or the new ones, and at
 * worst an unreferenced object or a stale tmp file, which tk_state__gc removes.
 */
#ifndef TK_CACHE_STATE_H
#define TK_CACHE_STATE_H

#include <stddef.h>
#include <stdint.h>

#include <sqlite3.h>

typedef struct tk_state tk_state;

#define TK_STATE_SCHEMA 1

typedef struct {
    char *path;
    char *sha256;
    int64_t size;
} tk_state_file;

typedef struct {
    char *name;            /* org/name */
    int major;
    char *version;
    char *commit;
    char *manifest_sha256;
    char *manifest;        /* exact bytes, NUL-terminated */
    size_t manifest_len;
    char *signer;          /* key id */
    char *registry;        /* endpoint it came from */
    int64_t installed_at;
    size_t nfiles;
    tk_state_file *files;
} tk_state_pkg;

int tk_state__open(tk_state **out, const char *data_dir);
void tk_state__close(tk_state *st);
sqlite3 *tk_state__db(tk_state *st);
const char *tk_state__store_dir(const tk_state *st);
const char *tk_state__tmp_dir(const tk_state *st);

/* Transactions: BEGIN IMMEDIATE (waits on the busy timeout), COMMIT, ROLLBACK. */
int tk_state__begin(tk_state *st);
int tk_state__commit(tk_state *st);
void tk_state__rollback(tk_state *st);

/* Shared lock on the store for the span of an install; exclusive for GC. Released by unlock. */
int tk_state__lock_store(tk_state *st, int exclusive);
void tk_state__unlock_store(tk_state *st);

/* The path an object has in the store (malloc'd). */
char *tk_state__object_path(const tk_state *st, const char *sha256);
/* Moves src (a file in the store's tmp dir whose content hashes to sha256) into the store. If the
 * object exists already, src is removed. The object is made read-only. */
int tk_state__object_put(tk_state *st, const char *src, const char *sha256);

/* Packages. pkg_get with major 0 returns the highest installed major. TK_ERR_NOT_FOUND if none. */
int tk_state__pkg_get(tk_state_pkg **out, tk_state *st, const char *name, int major);
/* The installed package whose commit is `commit`, if any. */
int tk_state__pkg_get_commit(tk_state_pkg **out, tk_state *st, const char *name, const char *commit);
int tk_state__pkg_list(tk_state_pkg ***out, size_t *n, tk_state *st);
/* Inside a transaction: replaces the (name, major) row and its files. */
int tk_state__pkg_put(tk_state *st, const tk_state_pkg *p);
/* Inside a transaction: deletes (name, major); major 0 deletes every major. NOT_FOUND if none. */
int tk_state__pkg_delete(tk_state *st, const char *name, int major);
void tk_state__pkg_free(tk_state_pkg *p);
void tk_state__pkg_list_free(tk_state_pkg **v, size_t n);
/* Names of installed packages (distinct), for "did you mean" hints. */
int tk_state__pkg_names(char ***out, size_t *n, tk_state *st);

/* Newest version seen per (name, major), for rollback protection. *version NULL when none. */
int tk_state__seen_get(char **version, tk_state *st, const char *name, int major);
/* Inside a transaction: records version if it is newer than the recorded one. */
int tk_state__seen_put(tk_state *st, const char *name, int major, const char *version, const char *commit);
/* Inside a transaction: records version even if it is older (only after a verified yank of the
 * version seen; hub/get.c). */
int tk_state__seen_set(tk_state *st, const char *name, int major, const char *version, const char *commit);

/* Trust store. */
int tk_state__trust_add(tk_state *st, const char *org, const char *keyid, const char *pubkey, const char *comment);
int tk_state__trust_remove(tk_state *st, const char *org, const char *keyid);
/* *pubkey NULL when (org, keyid) is not trusted. */
int tk_state__trust_get(char **pubkey, tk_state *st, const char *org, const char *keyid);
/* A key id trusted for org in the store (malloc'd), or *keyid NULL when it has none. */
int tk_state__trust_org_key(char **keyid, tk_state *st, const char *org);

/* Removes objects no installed package references and stale tmp files. *freed may be NULL. */
int tk_state__gc(tk_state *st, int64_t *freed);

/* Maps a SQLite error to TK_ERR_CACHE with the message. */
int tk_state__dberr(tk_state *st, const char *what);

/* Compares "a.b.c" versions: <0, 0, >0. Returns -2 on a malformed version. */
int tk_state__version_cmp(const char *a, const char *b);

#endif
