/*
 * hub.h — the package path: references, the registry protocol (client and static-tree writer) and
 * the get pipeline (resolve → download → verify → unpack → install).
 *
 * The lower pieces have their own headers: http.h (libcurl), archive.h (libarchive), sign.h
 * (Ed25519); the package format is manifest/manifest.h, the layer below. A manifest's kernels are
 * checked there before anything is installed; checks that need the installed packages run through
 * the `validate` hook.
 */
#ifndef TK_HUB_HUB_H
#define TK_HUB_HUB_H

#include "cache/state.h"
#include "hub/http.h"
#include "tk.h"

/* A parsed package reference (hub/ref.c): org/name[@major | @v<major> | @MAJOR.MINOR.PATCH |
 * @<range> | @<40-hex commit> | @<7 to 39 hex: a commit prefix>], at most one of major, exact, range,
 * commit and prefix set. */
typedef struct {
    char name[132];   /* org/name */
    char org[65];
    char pkg[65];
    int major;        /* 0: not given */
    char commit[41];  /* "" unless an exact commit was given */
    char exact[40];   /* "" unless an exact version was given */
    char range[128];  /* "" unless a range (">=1.2,<2") was given */
    char prefix[41];  /* "" unless a commit prefix (7 to 39 hex, as git takes them) was given */
} tk_hub_ref;

int tk_hub__ref_parse(tk_hub_ref *out, const char *ref);
/* Of n commits (40 hex each, versions[i] the version of commits[i]), the one that ref's prefix names:
 * its index; -1 with TK_ERR_NOT_FOUND set (none); -2 with TK_ERR_INVALID set (several, listed with
 * their versions). `where` names what was searched ("in the registry", "installed"). */
long tk_hub__ref_pick_prefix(const tk_hub_ref *ref, const char *const *commits, const char *const *versions, size_t n,
                             const char *where);
/* 1 when the reference names a version (exact or range) that only a version listing resolves. */
int tk_hub__ref_is_spec(const tk_hub_ref *ref);
/* 1 when version satisfies the reference's major, exact version or range (no constraint: 1). */
int tk_hub__ref_matches(const tk_hub_ref *ref, const char *version);

typedef struct {
    tk_state *state;
    tk_hub_http *http;          /* NULL when offline */
    const char *endpoint;       /* base URL without trailing slash */
    /* Registries to look the package up in, in order: it resolves in the first whose refs document
     * for it exists (a registry that fails otherwise stops the search). NULL/0: endpoint only. */
    const char *const *search;
    size_t nsearch;
    int offline;
    const char *builtin_org;    /* org trusted through the build's key, or NULL */
    const char *builtin_pubkey;
    int trust_unknown;
    int force;
    const char *expect_manifest; /* hex sha256, or NULL */
    const char *expect_signer;   /* key id the manifest's signature must have (lock files), or NULL */
    tk_log_fn log;
    void *log_user;
    /* Called with the verified manifest, its kernels valid, before anything is downloaded or
     * installed, for the checks that need the installed packages (api: an op declared differently by
     * another package); a non-OK return refuses the package with that status (tk_last_error set). */
    int (*validate)(void *user, const char *manifest, size_t len);
    void *validate_user;
} tk_hub_env;

/* Resolves and installs ref (see tk_pkg_get in tk.h). *fresh (may be NULL) is 1 when this call
 * installed it. */
int tk_hub__get(tk_state_pkg **out, int *fresh, const tk_hub_env *env, const char *ref);
/* Installs refs[0..n), each with its env (its registry, its pins), all or nothing: every package is
 * resolved, downloaded and verified into staging first, then all are recorded in one transaction. A
 * failure leaves the installed state as it was. outs[i] and fresh[i] as tk_hub__get's. */
int tk_hub__get_all(tk_state_pkg **outs, int *fresh, const tk_hub_env *envs, const char *const *refs, size_t n);

/* The two steps of an install (hub/get.c). tk_hub__stage resolves ref and, unless that commit is
 * installed already, downloads and verifies everything into a staging dir under the store's tmp; it
 * writes nothing a reader of the store sees. tk_hub__commit moves the staged files into the store
 * and records every package in one transaction. The caller holds the store's shared lock from the
 * first stage until the commit (GC clears tmp/). */
typedef struct tk_hub_staged tk_hub_staged;
int tk_hub__stage(tk_hub_staged **out, const tk_hub_env *env, const char *ref);
int tk_hub__commit(tk_state_pkg **outs, int *fresh, tk_hub_staged *const *v, size_t n, const tk_hub_env *env);
void tk_hub__staged_free(tk_hub_staged *s);
/* The registry ref's package resolves in: env->endpoint, or with env->search the first that has it
 * (malloc'd). TK_ERR_NOT_FOUND when none has it; a registry that fails otherwise stops the search. */
int tk_hub__pick_registry(char **out, const tk_hub_env *env, const tk_hub_ref *ref);

/* Resolves ref against what is installed only (offline). */
int tk_hub__installed(tk_state_pkg **out, tk_state *st, const char *ref);

/* Publishes pkgdir into the static tree to_dir (see tk_publish in tk.h). */
int tk_hub__publish(char **commit, const char *pkgdir, const char *to_dir, const char *key_path,
                    const char *compression, tk_log_fn log, void *log_user);

/* Builds and signs pkgdir's version in a private staging tree, then uploads it to the `tk serve`
 * registry at the http(s) URL `registry` with the bearer token (hub/upload.c). *commit (may be NULL)
 * receives the commit the server wrote; *created (may be NULL) is 0 when it already had it. The
 * server's refusals map to TK_ERR_UNTRUSTED, _SIGNATURE, _MANIFEST, _DIGEST, _ARCHIVE, _ROLLBACK,
 * _NOSPACE or _INVALID with its message; transport failures are TK_ERR_NETWORK. */
int tk_hub__upload(char **commit, int *created, const char *pkgdir, const char *registry, const char *key_path,
                   const char *compression, const char *token, tk_log_fn log, void *log_user);

/* ---- yanks (hub/yank.c) ---------------------------------------------------------------------- */

typedef struct {
    tk_hub_ref ref;     /* the package (no major, no commit) */
    char version[68];
    int major;
    char reason[512];
} tk_hub_yank;

/* Parses and checks a yank statement's bytes (not its signature). TK_ERR_MANIFEST when malformed. */
int tk_hub__yank_parse(tk_hub_yank *y, const char *stmt, size_t len);
/* Makes the statement withdrawing name@version and signs it with the key (malloc'd texts). */
int tk_hub__yank_make(char **stmt, char **sig, const char *name, const char *version, const char *reason,
                      const char *key_path);
/* Records a signed yank in the static tree (the caller checked the signature, or is the publisher
 * holding the key) under the tree's publish lock: writes kernels/{org}/{name}/yanked/{version}.json
 * and .json.sig, and if the version heads its branch moves the branch to the newest version of that
 * major that is not yanked (its commit in moved_to, else moved_to[0] = 0), or removes the branch when
 * there is none (*removed = 1). *already is 1 when it was yanked before (nothing changes). Errors:
 * TK_ERR_NOT_FOUND (no such version), TK_ERR_MANIFEST, TK_ERR_IO. */
int tk_hub__tree_yank(char moved_to[41], int *already, int *removed, const char *tree, const char *stmt, size_t slen,
                      const char *sig, size_t siglen);
/* Sends a signed yank to a `tk serve` registry (PUT {registry}/api/yank/{org}/{name} with the token);
 * the server checks the signature against its trust store and applies tk_hub__tree_yank. */
int tk_hub__yank_send(char moved_to[41], int *already, int *removed, const char *registry, const char *token,
                      const char *stmt, const char *sig);
/* 1 when resolve_dir/../yanked/{version}.json exists. */
int tk_hub__tree_is_yanked(const char *resolve_dir, const char *version);

/* ---- versions (hub/versions.c) --------------------------------------------------------------- */

typedef struct {
    char version[40];
    char commit[41];
    int major;
    int head;              /* 1: the head of its branch v<major> */
    int yanked;            /* 1: a yank statement signed by the publisher withdraws it */
    char yank_reason[512];
    char published[32];    /* "2026-11-24T10:00:00Z" from the registry's versions document, "" unknown */
    char signer[48];       /* key id of the manifest's signature */
    int trusted;           /* 1: the signer is trusted for the org (else the org has no key yet) */
    char description[256];
} tk_hub_version;

/* Every version of ref's package in the registry, newest first: the commits reached from each branch
 * head through their parents, plus those the registry's versions document names (a yanked head is
 * off every chain). Each commit is checked as get checks it: its manifest's signature verifies, the
 * signer is the org's trusted key when the org has one, and the commit id recomputed from its parent
 * and files is the commit. Every document is size-capped. */
int tk_hub__versions(tk_hub_version **out, size_t *n, const tk_hub_env *env, const tk_hub_ref *ref);
/* The newest version in v[0..n) matching ref (yanked ones only for an exact version), or NULL. */
const tk_hub_version *tk_hub__versions_pick(const tk_hub_version *v, size_t n, const tk_hub_ref *ref);
/* "1.0.0, 1.0.2 (yanked), 2.0.0" for an error's hint (malloc'd). */
char *tk_hub__versions_str(const tk_hub_version *v, size_t n);

/* Appends to hint a "did you mean" for the unknown package name, from the registry's package list
 * (if it has one) and the installed names, or a hint to check the name (hub/ref.c). */
void tk_hub__ref_suggest(const tk_hub_env *env, const char *name, tk_buf *hint);

#endif
