/*
 * tk.h — the public C API of tk, a kernel hub and JIT kernel package manager.
 *
 * Typical use:
 *
 *     tk_ctx *ctx = NULL;
 *     if (tk_ctx_new(&ctx, NULL) != TK_OK) { fprintf(stderr, "%s\n", tk_last_error()); ... }
 *     tk_pkg *pkg = NULL;
 *     int rc = tk_pkg_get(&pkg, ctx, "kernels-community/activation", NULL);
 *     if (rc != TK_OK) { fprintf(stderr, "tk: %s (%s)\n", tk_last_error(), tk_status_str(rc)); ... }
 *     printf("%s %s at %s\n", tk_pkg_name(pkg), tk_pkg_version(pkg), tk_pkg_commit(pkg));
 *     tk_pkg_free(pkg);
 *     tk_ctx_free(ctx);
 *
 * Conventions (see docs/ and shared/STYLE.md):
 * - Every function that can fail returns an int status: TK_OK (0) or a negative TK_ERR_* code.
 *   After a failure, tk_last_error() holds a message for the calling thread, often with a "HINT:" line.
 * - Out-parameters come first. *out is set to NULL on entry and assigned only on success; the caller
 *   owns it and frees it with the matching _free function, which accepts NULL.
 * - A const char * *returned* by a function is borrowed: it lives as long as the object it came from.
 *   Strings passed back through char ** out-parameters are owned by the caller: free them with tk_free().
 * - Options are versioned structs: declare them with the matching _INIT macro, then set fields. NULL
 *   options mean the defaults.
 * - Threads: a tk_ctx may be used from one thread at a time; use one context per thread, or lock around
 *   a shared one. Different contexts (also in different processes) may share one TK_HOME safely.
 *   tk_last_error(), tk_status_str() and tk_version_*() may be called from any thread.
 *
 * The header compiles alone as C99 and as C++.
 */
#ifndef TK_H
#define TK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(TK_BUILDING_LIBRARY) && defined(__GNUC__)
#define TK_API __attribute__((visibility("default")))
#else
#define TK_API
#endif

/* ---------------------------------------------------------------------------------------------- */
/* Versions                                                                                        */

#define TK_VERSION_MAJOR 0
#define TK_VERSION_MINOR 1
#define TK_VERSION_PATCH 0
#define TK_VERSION_STRING "0.1.0"
/* TK_VERSION_NUMBER is MAJOR*10000 + MINOR*100 + PATCH. */
#define TK_VERSION_NUMBER (TK_VERSION_MAJOR * 10000 + TK_VERSION_MINOR * 100 + TK_VERSION_PATCH)

/* The version of the library actually linked (compare with TK_VERSION_NUMBER). */
TK_API int tk_version_number(void);
TK_API const char *tk_version_string(void);

/* ---------------------------------------------------------------------------------------------- */
/* Status codes. Append-only: a code is never renumbered or removed.                               */

enum {
    TK_OK = 0,
    TK_ERR_INVALID = -1,      /* invalid argument, bad reference or usage */
    TK_ERR_NOT_FOUND = -2,    /* package, version, file or key not found */
    TK_ERR_NETWORK = -3,      /* connection failed, timed out, or the server misbehaved */
    TK_ERR_SIGNATURE = -4,    /* signature missing, malformed or not valid for the manifest */
    TK_ERR_UNTRUSTED = -5,    /* signature valid, but the signer is not trusted for the org */
    TK_ERR_DIGEST = -6,       /* a sha256 or size does not match what the manifest says */
    TK_ERR_MANIFEST = -7,     /* the manifest is malformed or inconsistent */
    TK_ERR_ARCHIVE = -8,      /* the source archive is malformed or breaks the unpack rules */
    TK_ERR_IO = -9,           /* a file system operation failed */
    TK_ERR_NOSPACE = -10,     /* the disk (or a quota) is full */
    TK_ERR_CACHE = -11,       /* the SQLite state or cache failed */
    TK_ERR_ROLLBACK = -12,    /* the registry offered an older version than one already seen */
    TK_ERR_NOMEM = -13,       /* out of memory */
    TK_ERR_OFFLINE = -14,     /* offline mode, and the request needs the network */
    TK_ERR_NO_DEVICE = -15,   /* no CUDA driver or GPU */
    TK_ERR_NO_NVRTC = -16,    /* NVRTC could not be loaded */
    TK_ERR_COMPILE = -17,     /* NVRTC rejected a kernel's source */
    TK_ERR_LAUNCH = -18,      /* loading or launching a kernel failed */
    TK_ERR_UNSUPPORTED = -19, /* valid request that this build, device or package cannot serve */
    TK_ERR_INTERNAL = -20     /* a bug in tk: please report it */
};

/* A static, English name for a status code ("not found"). Never NULL. */
TK_API const char *tk_status_str(int status);

/* The message of the last failed call on this thread. Never NULL ("" when there is none). The text is
 * valid until the next tk call on the same thread. Reporting an error never allocates. */
TK_API const char *tk_last_error(void);

/* Frees memory that tk handed to the caller through a char ** out-parameter. Accepts NULL. */
TK_API void tk_free(void *p);

/* ---------------------------------------------------------------------------------------------- */
/* Context                                                                                         */

typedef struct tk_ctx tk_ctx;

/* Log levels passed to tk_log_fn. */
enum { TK_LOG_DEBUG = 0, TK_LOG_INFO = 1, TK_LOG_WARN = 2 };

/* Receives the library's messages (the library never prints). Called on the thread that made the
 * call. `msg` is valid only during the call. */
typedef void (*tk_log_fn)(void *user, int level, const char *msg);

/* Receives progress of long work. `what` names the work ("download manifest.json"); `total` is -1
 * when unknown. Called on the calling thread; keep it fast. */
typedef void (*tk_progress_fn)(void *user, const char *what, int64_t done, int64_t total);

#define TK_CTX_OPTS_VERSION 1
typedef struct {
    unsigned version;          /* TK_CTX_OPTS_VERSION */
    const char *home;          /* state root; NULL: $TK_HOME, else the XDG directories */
    const char *endpoint;      /* registry URL; NULL: $TK_ENDPOINT, then the config, then the default */
    const char *token;         /* bearer token; NULL: $TK_TOKEN */
    int offline;               /* 1: never use the network; 0: online; -1: $TK_OFFLINE decides */
    tk_log_fn log;             /* NULL: messages are dropped */
    void *log_user;
    tk_progress_fn progress;   /* NULL: no progress reports */
    void *progress_user;
} tk_ctx_opts;
#define TK_CTX_OPTS_INIT {TK_CTX_OPTS_VERSION, NULL, NULL, NULL, -1, NULL, NULL, NULL, NULL}

/* Creates a context: opens (and creates or migrates) the state under the home directory. opts may be
 * NULL. Errors: TK_ERR_IO, TK_ERR_CACHE, TK_ERR_INVALID. */
TK_API int tk_ctx_new(tk_ctx **out, const tk_ctx_opts *opts);
TK_API void tk_ctx_free(tk_ctx *ctx);

/* Borrowed paths and settings the context resolved. */
TK_API const char *tk_ctx_endpoint(const tk_ctx *ctx); /* the registry URL in use */
TK_API const char *tk_ctx_home(const tk_ctx *ctx);     /* the data directory (state.db, store/) */
TK_API int tk_ctx_offline(const tk_ctx *ctx);
TK_API const char *tk_ctx_cache_dir(const tk_ctx *ctx); /* compiled-binary cache (cache.db) */
TK_API const char *tk_ctx_config_dir(const tk_ctx *ctx); /* config.json and keys/ */
/* The registries in lookup order as JSON (tk_free): [{"url", "packages": [patterns] | null, "source":
 * "TK_ENDPOINT" | "config" | "default"}]. A package resolves in the registry named for it, else the
 * one whose "packages" patterns match it, else the one it was installed from, else the first of
 * those without patterns that has it. $TK_ENDPOINT makes one registry serve everything. */
TK_API int tk_ctx_registries_json(char **out, const tk_ctx *ctx);

/* ---------------------------------------------------------------------------------------------- */
/* Packages                                                                                        */

/* A reference names a package and optionally a version:
 *     org/name            the highest major version the registry has
 *     org/name@2          major 2 (branch v2); "@v2" is accepted too
 *     org/name@<40 hex>   exactly that commit
 */

typedef struct tk_pkg tk_pkg;

#define TK_GET_OPTS_VERSION 2
typedef struct {
    unsigned version;             /* TK_GET_OPTS_VERSION */
    int trust_unknown;            /* 1: trust on first use: accept (and remember) the signer of an org
                                     that has no trusted key at all. An org with a key (in the trust
                                     store or built in) refuses any other signer with TK_ERR_UNTRUSTED
                                     whatever this says; rotation is tk_trust_add. Never applies to
                                     yank statements. */
    int force;                    /* 1: download and install again even if installed */
    const char *expect_manifest;  /* hex sha256 the manifest must have (lock files), or NULL */
    /* version 2: */
    const char *registry;         /* the registry to get it from (a project file's "registry"); NULL:
                                     the context's rules (tk_ctx_registries_json). TK_ENDPOINT still
                                     overrides it. */
    const char *expect_signer;    /* key id ("SHA256:...") the manifest's signer must have (lock
                                     files), or NULL */
} tk_get_opts;
#define TK_GET_OPTS_INIT {TK_GET_OPTS_VERSION, 0, 0, NULL, NULL, NULL}

/* Resolves `ref` against the registry, downloads the manifest, its signature and the source archive,
 * verifies them, unpacks the archive safely and records the package as installed. If the resolved
 * commit is installed already, nothing is downloaded. In offline mode it resolves only from what is
 * installed. On success *out describes the installed package.
 * Errors: TK_ERR_NOT_FOUND, TK_ERR_NETWORK, TK_ERR_SIGNATURE, TK_ERR_UNTRUSTED, TK_ERR_DIGEST,
 * TK_ERR_MANIFEST, TK_ERR_ARCHIVE, TK_ERR_ROLLBACK, TK_ERR_OFFLINE, TK_ERR_IO, TK_ERR_NOSPACE. A failed
 * get leaves the previously installed state as it was. */
TK_API int tk_pkg_get(tk_pkg **out, tk_ctx *ctx, const char *ref, const tk_get_opts *opts);

/* Looks up an installed package without touching the network. `ref` as above; with no version, the
 * highest installed major. Errors: TK_ERR_NOT_FOUND. */
TK_API int tk_pkg_info(tk_pkg **out, tk_ctx *ctx, const char *ref);

TK_API void tk_pkg_free(tk_pkg *pkg);

/* Borrowed fields of a package. */
TK_API const char *tk_pkg_name(const tk_pkg *pkg);        /* "org/name" */
TK_API int tk_pkg_major(const tk_pkg *pkg);               /* 1, 2, ... */
TK_API const char *tk_pkg_version(const tk_pkg *pkg);     /* "1.2.0" */
TK_API const char *tk_pkg_commit(const tk_pkg *pkg);      /* 40 hex */
TK_API const char *tk_pkg_manifest_sha256(const tk_pkg *pkg);
TK_API const char *tk_pkg_license(const tk_pkg *pkg);
TK_API const char *tk_pkg_description(const tk_pkg *pkg);
TK_API const char *tk_pkg_signer(const tk_pkg *pkg);      /* key id of the publisher */
TK_API const char *tk_pkg_registry(const tk_pkg *pkg);    /* the registry it was installed from */
TK_API const char *tk_pkg_manifest(const tk_pkg *pkg);    /* the manifest's exact JSON text */
TK_API int64_t tk_pkg_installed_at(const tk_pkg *pkg);    /* unix seconds */
/* 1 if this tk_pkg_get call downloaded and installed it, 0 if it was installed already. */
TK_API int tk_pkg_fresh(const tk_pkg *pkg);
TK_API size_t tk_pkg_file_count(const tk_pkg *pkg);
TK_API const char *tk_pkg_file_path(const tk_pkg *pkg, size_t i);   /* relative, "activation.cu" */
TK_API const char *tk_pkg_file_sha256(const tk_pkg *pkg, size_t i); /* hex */
TK_API int64_t tk_pkg_file_size(const tk_pkg *pkg, size_t i);
/* Absolute path of file i in the content-addressed store (read-only). */
TK_API const char *tk_pkg_file_store_path(const tk_pkg *pkg, size_t i);

/* The kernels the package declares (its manifest's "kernels", in order), readable without a GPU.
 * Strings are borrowed from pkg; an index out of range gives NULL (or -1). */
TK_API size_t tk_pkg_kernel_count(const tk_pkg *pkg);
TK_API const char *tk_pkg_kernel_name(const tk_pkg *pkg, size_t i); /* "silu_and_mul_f32" */
TK_API const char *tk_pkg_kernel_op(const tk_pkg *pkg, size_t i);   /* "silu_and_mul" */
TK_API const char *tk_pkg_kernel_dtypes(const tk_pkg *pkg, size_t i); /* "f16,bf16"; "" = any */
TK_API int tk_pkg_kernel_min_cc(const tk_pkg *pkg, size_t i);        /* 80 = sm_80; 0 = no bound */
TK_API int tk_pkg_kernel_max_cc(const tk_pkg *pkg, size_t i);        /* 0 = no bound */
TK_API int tk_pkg_kernel_arch_specific(const tk_pkg *pkg, size_t i); /* 1: compiled for sm_XYa */
/* The archs it runs on, from those constraints: "sm_90a", "sm_80-sm_89", "sm_75+" or "any". */
TK_API const char *tk_pkg_kernel_archs(const tk_pkg *pkg, size_t i);
/* The distinct ops its kernels implement, sorted. */
TK_API size_t tk_pkg_op_count(const tk_pkg *pkg);
TK_API const char *tk_pkg_op_at(const tk_pkg *pkg, size_t i);

/* The package as a JSON object, for scripts. *out is owned by the caller (tk_free). */
TK_API int tk_pkg_to_json(char **out, const tk_pkg *pkg);

/* All installed packages, sorted by name then major. */
typedef struct tk_pkg_list tk_pkg_list;
TK_API int tk_pkg_list_installed(tk_pkg_list **out, tk_ctx *ctx);
TK_API size_t tk_pkg_list_count(const tk_pkg_list *list);
TK_API const tk_pkg *tk_pkg_list_at(const tk_pkg_list *list, size_t i); /* borrowed */
TK_API void tk_pkg_list_free(tk_pkg_list *list);

/* ---- versions in the registry (hub/versions.c) ---- */
/* Every version of ref's package (org/name; a version part only narrows the list to what it matches)
 * in the registry, newest first, each commit checked as tk_pkg_get checks it: the manifest's signature
 * (the org's trusted key when it has one) and the commit id. Errors: TK_ERR_NOT_FOUND, TK_ERR_OFFLINE,
 * TK_ERR_NETWORK, TK_ERR_SIGNATURE/_UNTRUSTED/_DIGEST/_MANIFEST for a registry that serves bad data. */
typedef struct tk_version_list tk_version_list;
TK_API int tk_pkg_versions(tk_version_list **out, tk_ctx *ctx, const char *ref);
TK_API size_t tk_version_list_count(const tk_version_list *l);
TK_API const char *tk_version_list_version(const tk_version_list *l, size_t i);
TK_API const char *tk_version_list_commit(const tk_version_list *l, size_t i);
TK_API int tk_version_list_major(const tk_version_list *l, size_t i);
/* 1 when the publisher yanked it; its reason ("" none). */
TK_API int tk_version_list_yanked(const tk_version_list *l, size_t i);
TK_API const char *tk_version_list_yank_reason(const tk_version_list *l, size_t i);
/* "2026-11-24T10:00:00Z" as the registry recorded the publish (unsigned), "" when unknown. */
TK_API const char *tk_version_list_published(const tk_version_list *l, size_t i);
/* The newest version that is not yanked: of major `major` (0: of any major); NULL when none. */
TK_API const char *tk_version_list_latest(const tk_version_list *l, int major);
/* {"name": ..., "versions": [{"version", "commit", "major", "head", "yanked", "yank_reason",
 * "published", "signer", "trusted", "description"}]} (tk_free). */
TK_API int tk_version_list_to_json(char **out, const tk_version_list *l);
TK_API void tk_version_list_free(tk_version_list *l);

/* Re-hashes every installed file of `ref` (NULL: every installed package). Returns TK_OK when all
 * match; TK_ERR_DIGEST when any file is missing or altered, and tk_last_error() lists them.
 * *nbad (may be NULL) receives how many files failed. */
TK_API int tk_pkg_verify(tk_ctx *ctx, const char *ref, size_t *nbad);
/* tk_pkg_verify with the result as JSON in *out (free with tk_free), also when files are bad:
 * {"ok": bool, "checked": n, "bad_count": n, "bad_files": [{"package": "org/name", "file": "a.cu",
 *   "problem": "missing" | "altered" | "not_a_file" | "manifest_altered", "sha256": "<found or null>",
 *   "want": "<hex>"}]}.
 * Returns TK_OK, TK_ERR_DIGEST (with *out set) or, with *out NULL, the errors of tk_pkg_verify. */
TK_API int tk_pkg_verify_json(char **out, tk_ctx *ctx, const char *ref);

/* Uninstalls `ref` (with no version: every installed major). Files still used by another package stay
 * in the store. Errors: TK_ERR_NOT_FOUND. */
TK_API int tk_pkg_remove(tk_ctx *ctx, const char *ref);

/* ---- projects and lock files (api/project.c, docs/project.md) ---- */
/* A project file (tk.json) lists the packages a project needs: {"packages": {"org/name": "VERSION" |
 * {"version": "VERSION", "registry": "URL"}}}, VERSION being what tk_pkg_get takes after '@' ("" or
 * "*": the highest major). Its lock file (tk.lock) sits beside it and pins, for each package, the
 * commit, the manifest's sha256, the registry and the signer's key id (format_version 2). */
typedef struct tk_project tk_project;
/* Reads the project file at `path`, or with NULL the first tk.json in the current directory or a
 * directory above it. Errors: TK_ERR_NOT_FOUND (none), TK_ERR_INVALID naming FILE:LINE:COLUMN (not
 * JSON, an unknown key with a did-you-mean, a bad name, version or registry URL). */
TK_API int tk_project_open(tk_project **out, const char *path);
TK_API void tk_project_free(tk_project *p);
TK_API const char *tk_project_path(const tk_project *p);      /* absolute */
TK_API const char *tk_project_lock_path(const tk_project *p); /* tk.lock beside it */
TK_API size_t tk_project_package_count(const tk_project *p);
TK_API const char *tk_project_package_name(const tk_project *p, size_t i);
TK_API const char *tk_project_package_version(const tk_project *p, size_t i);  /* "" any */
TK_API const char *tk_project_package_registry(const tk_project *p, size_t i); /* NULL: the config's */

/* Installs the project's packages all or nothing: each is resolved (its registry, else the context's
 * rules), downloaded and verified into staging, then all are recorded in one transaction; any failure
 * leaves the installed state as it was. locked = 1: installs exactly what the project's lock file pins
 * instead, and fails with TK_ERR_INVALID when the lock does not match the project file. `each` (may
 * be NULL) is called for every package after the commit. Errors as tk_pkg_get. */
TK_API int tk_project_get(tk_ctx *ctx, const tk_project *p, int locked, const tk_get_opts *opts,
                          void (*each)(void *user, const tk_pkg *pkg), void *user);
/* tk_project_get (not locked), then writes the lock file pinning exactly the project's packages.
 * *text (may be NULL) receives the lock file's text (tk_free). */
TK_API int tk_project_lock(char **text, tk_ctx *ctx, const tk_project *p, const tk_get_opts *opts);

/* Writes a lock file pinning the installed commit, manifest digest, registry and signer of each ref
 * (nrefs 0: of every installed package), for use without a project file. */
TK_API int tk_lock_write(tk_ctx *ctx, const char *path, const char *const *refs, size_t nrefs);

/* Installs exactly what a lock file pins (format 1 or 2), all or nothing: each commit from its
 * registry, with its manifest digest and signer checked. Calls `each` (may be NULL) for every package
 * after the commit. Errors as tk_pkg_get. */
TK_API int tk_lock_install(tk_ctx *ctx, const char *path, const tk_get_opts *opts,
                           void (*each)(void *user, const tk_pkg *pkg), void *user);

/* ---------------------------------------------------------------------------------------------- */
/* Keys, trust and publishing                                                                      */

/* Generates an Ed25519 key pair: the private key is written to `key_path` (PEM, mode 0600; refused if
 * it exists) and the public key to key_path + ".pub". *pubkey receives the public key as text
 * ("ed25519:<64 hex>"), owned by the caller. */
TK_API int tk_keygen(char **pubkey, const char *key_path);

/* The key id (fingerprint) of a public key in text form: "SHA256:<hex of the first 16 bytes>". */
TK_API int tk_key_fingerprint(char **keyid, const char *pubkey);

/* Trust store: publisher keys allowed to sign packages of an org. The build's default registry key is
 * trusted for its org without an entry. */
TK_API int tk_trust_add(tk_ctx *ctx, const char *org, const char *pubkey, const char *comment);
TK_API int tk_trust_remove(tk_ctx *ctx, const char *org, const char *keyid);
/* The trust store as a JSON array of {org, keyid, pubkey, comment, added, builtin}. */
TK_API int tk_trust_list_json(char **out, tk_ctx *ctx);

#define TK_PUBLISH_OPTS_VERSION 1
typedef struct {
    unsigned version;        /* TK_PUBLISH_OPTS_VERSION */
    const char *key_path;    /* private key (PEM); required */
    const char *compression; /* "gz" (default) or "zst" */
} tk_publish_opts;
#define TK_PUBLISH_OPTS_INIT {TK_PUBLISH_OPTS_VERSION, NULL, NULL}

/* Publishes the package in `pkgdir` (its kernel.json and sources) into the static registry tree
 * `to_dir`: writes the manifest, its signature and the source archive under a new commit, moves branch
 * v<major> to it and keeps the history. Republishing identical content is a no-op that returns the
 * same commit. It first runs tk_check's checks (no compile) and refuses the package, writing
 * nothing, when one fails. *commit (may be NULL) receives the commit id. Errors: TK_ERR_MANIFEST for a bad
 * kernel.json, TK_ERR_ROLLBACK if the version is not newer than the branch head, TK_ERR_IO. */
TK_API int tk_publish(char **commit, tk_ctx *ctx, const char *pkgdir, const char *to_dir,
                      const tk_publish_opts *opts);

/* Checks the package in `pkgdir` as tk_publish does before it signs anything (every key of
 * kernel.json against the format, with file:line:column and "did you mean"; name, version, license;
 * each kernel's source present, params, dtypes, launch and constraint expressions), and with
 * opts->compile also compiles every kernel with NVRTC for each arch. It writes nothing: no signature,
 * no registry, no cache entry. *report (may be NULL) receives, on TK_ERR_COMPILE, every failing
 * compile's message (file:line, a missing symbol in one line); free it with tk_free.
 * Errors: TK_ERR_NOT_FOUND (no such directory or kernel.json), TK_ERR_MANIFEST, TK_ERR_COMPILE,
 * TK_ERR_NO_NVRTC, TK_ERR_INVALID (a bad arch). */
#define TK_CHECK_OPTS_VERSION 1
typedef struct {
    unsigned version;          /* TK_CHECK_OPTS_VERSION */
    int compile;               /* 1: also compile every kernel */
    const char *const *archs;  /* "sm_80", "sm_90a" ...; NULL: sm_80 and sm_90 */
    size_t narchs;
    int jobs;                  /* parallel compiles; 0: by cores and memory */
} tk_check_opts;
#define TK_CHECK_OPTS_INIT {TK_CHECK_OPTS_VERSION, 0, NULL, 0, 0}
TK_API int tk_check(char **report, tk_ctx *ctx, const char *pkgdir, const tk_check_opts *opts);

/* Publishes pkgdir to a `tk serve` registry over HTTP: builds and signs the version as tk_publish
 * does, then uploads it (PUT {registry}/api/upload/{org}/{name}) with the bearer token (NULL: the
 * context's, from TK_TOKEN). The server re-checks the signature (its trust store must hold the key for
 * the org), the manifest, the digests and the archive rules, and writes the version atomically.
 * *commit (may be NULL) receives the commit the server wrote; *created (may be NULL) is 0 when it had
 * that content already. Errors: TK_ERR_INVALID (no token, not an http(s) URL, bad token or too large),
 * TK_ERR_UNTRUSTED, TK_ERR_SIGNATURE, TK_ERR_MANIFEST, TK_ERR_DIGEST, TK_ERR_ARCHIVE, TK_ERR_ROLLBACK
 * (the registry has this major at a newer or equal version with other content), TK_ERR_NOSPACE,
 * TK_ERR_NETWORK, TK_ERR_IO. */
/* Yanks (withdraws) a published version: `ref` is "org/name@MAJOR.MINOR.PATCH". Signs a yank statement
 * with the publisher's key (opts->key_path) and records it in the static tree `to_dir`, or sends it to
 * the `tk serve` registry at `registry` with the token (NULL: the context's); exactly one of to_dir and
 * registry. The version's files stay, so lock files that pin its commit still install it; if it heads
 * its branch, the branch moves back to the newest version of that major that is not yanked, and
 * clients that already saw the yanked version accept the move because the statement is signed by a
 * key they trust. A yanked version is never published again. moved_to (may be NULL; 41 bytes)
 * receives the commit the branch moved to, or "" when it did not move. Errors: TK_ERR_INVALID (bad
 * ref; or it is the last version of its major that is not yanked), TK_ERR_NOT_FOUND (no such version),
 * TK_ERR_UNTRUSTED (the server does not trust the key), TK_ERR_NETWORK, TK_ERR_IO. */
TK_API int tk_yank(tk_ctx *ctx, const char *ref, const char *reason, const char *to_dir, const char *registry,
                   const char *token, const tk_publish_opts *opts, char *moved_to);

TK_API int tk_publish_upload(char **commit, int *created, tk_ctx *ctx, const char *pkgdir, const char *registry,
                             const char *token, const tk_publish_opts *opts);


/* ---------------------------------------------------------------------------------------------- */
/* Tensors (DLPack-compatible)                                                                     */

/* tk_tensor has DLTensor's exact layout (dlpack.h v1.x), so a DLTensor * from PyTorch, JAX or CuPy
 * can be passed as a tk_tensor * without copying. The memory is the caller's. */
enum { TK_DEV_CPU = 1, TK_DEV_CUDA = 2 };                      /* DLDeviceType values */
enum { TK_DL_INT = 0, TK_DL_UINT = 1, TK_DL_FLOAT = 2, TK_DL_BFLOAT = 4,
       TK_DL_FLOAT8_E4M3FN = 10, TK_DL_FLOAT8_E5M2 = 12 };        /* DLDataTypeCode values */

typedef struct {
    uint8_t code;   /* TK_DL_* */
    uint8_t bits;   /* 8, 16, 32, 64 */
    uint16_t lanes; /* 1 */
} tk_dtype;

typedef struct {
    void *data;                    /* base pointer (host or device) */
    struct { int32_t device_type; int32_t device_id; } device;
    int32_t ndim;
    tk_dtype dtype;
    int64_t *shape;                /* ndim sizes */
    int64_t *strides;              /* ndim strides in elements, or NULL for contiguous row-major */
    uint64_t byte_offset;          /* added to data */
} tk_tensor;

/* Names used in manifests and messages: "f32", "f16", "bf16", "f64", "i8", "u8", "i32", "i64",
 * "fp8_e4m3", "fp8_e5m2". tk_dtype_name returns "?" for anything else. */
TK_API const char *tk_dtype_name(tk_dtype dt);
TK_API int tk_dtype_parse(tk_dtype *out, const char *name);

/* An argument of a declarative call or an op: a tensor or a scalar. */
enum { TK_ARG_TENSOR = 0, TK_ARG_I64 = 1, TK_ARG_F64 = 2 };
typedef struct {
    int kind;              /* TK_ARG_* */
    const char *name;      /* parameter name, or NULL to bind by position */
    const tk_tensor *t;    /* TK_ARG_TENSOR */
    int64_t i;             /* TK_ARG_I64 */
    double f;              /* TK_ARG_F64 */
} tk_arg;

/* ---------------------------------------------------------------------------------------------- */
/* Devices and JIT                                                                                 */

typedef struct {
    int ordinal;
    char name[128];
    int cc_major, cc_minor;   /* compute capability */
    int sm_count;
    int64_t total_mem;        /* bytes */
    int driver_version;       /* e.g. 13000 */
} tk_device_info;

/* Number of CUDA devices. Returns TK_OK and *n = 0 when the driver loads but has no device;
 * TK_ERR_NO_DEVICE (with a hint) when libcuda cannot be loaded or initialised. */
TK_API int tk_device_count(int *n);
TK_API int tk_device_info_get(tk_device_info *out, int ordinal);

/* Device memory, for tests, examples and hosts without an allocator of their own (an engine with
 * its own CUDA runtime or caching allocator passes its pointers to tk instead). Each call runs in the
 * device's primary context, which tk retains on first use, and leaves the calling thread's current
 * context as it was. Copies and memsets are synchronous with respect to the host. Errors:
 * TK_ERR_NO_DEVICE (no driver or no such device), TK_ERR_NOMEM (device out of memory), TK_ERR_LAUNCH
 * (any other driver error, including the fault of a kernel launched earlier). */
typedef enum { TK_COPY_H2D = 1, TK_COPY_D2H = 2, TK_COPY_D2D = 3 } tk_copy_kind;
TK_API int tk_device_alloc(void **dptr, int device, size_t bytes);
TK_API int tk_device_free(void *dptr, int device);
TK_API int tk_device_copy(void *dst, const void *src, size_t bytes, tk_copy_kind kind, int device);
TK_API int tk_device_memset(void *dptr, int value, size_t bytes, int device);
/* Waits for all work on the device (every stream of its primary context) and reports a kernel fault. */
TK_API int tk_device_sync(int device);

/* A package compiled and loaded for one device. It holds its modules loaded until it is freed. */
typedef struct tk_kernel tk_kernel;
/* One entry point of a tk_kernel; borrowed from it. */
typedef struct tk_function tk_function;

#define TK_KERNEL_OPTS_VERSION 1
typedef struct {
    unsigned version;      /* TK_KERNEL_OPTS_VERSION */
    int device;            /* CUDA device ordinal; default 0 */
    tk_get_opts get;       /* how the package is fetched if it is not installed */
} tk_kernel_opts;
#define TK_KERNEL_OPTS_INIT {TK_KERNEL_OPTS_VERSION, 0, TK_GET_OPTS_INIT}

/* `ref` may also be a package directory ("./relu", "../x", "/abs/dir", "."): its kernel.json and
 * sources are checked as tk_check does and compiled as they are, without a signature and without
 * being installed (a warning says so; the cache names it org/name@local). */
/* Resolves and installs `ref` if needed (as tk_pkg_get), compiles every kernel for the device's
 * architecture with NVRTC unless the compiled binary is in the cache, and loads them with the CUDA
 * Driver API. A warm call does no compile and does not load NVRTC.
 * Errors: those of tk_pkg_get, TK_ERR_NO_DEVICE, TK_ERR_NO_NVRTC, TK_ERR_COMPILE (tk_last_error() holds
 * the NVRTC log with the package's file:line), TK_ERR_LAUNCH (the module failed to load). */
TK_API int tk_get_kernel(tk_kernel **out, tk_ctx *ctx, const char *ref, const tk_kernel_opts *opts);
TK_API void tk_kernel_free(tk_kernel *k);

/* The manifest text of the package k was built from (borrowed, valid until tk_kernel_free). For a
 * package directory it is the manifest a publish would sign, less its archive entry. */
TK_API const char *tk_kernel_manifest(const tk_kernel *k);
TK_API size_t tk_kernel_function_count(const tk_kernel *k);
TK_API const tk_function *tk_kernel_function_at(const tk_kernel *k, size_t i);
/* Looks a function up by its manifest name ("silu_and_mul_f32"). Errors: TK_ERR_NOT_FOUND. */
TK_API int tk_kernel_function(const tk_function **out, const tk_kernel *k, const char *name);
TK_API const char *tk_function_name(const tk_function *fn);
TK_API const char *tk_function_op(const tk_function *fn);

/* Raw launch: args is an array of pointers to each kernel argument, as cuLaunchKernel takes them.
 * stream is a CUstream or NULL (the default stream). Safe to call from several threads. */
TK_API int tk_function_launch(const tk_function *fn, const unsigned grid[3], const unsigned block[3],
                              size_t smem, void *stream, void **args);

/* Declarative call: binds args to the manifest's params (by name, else by position), checks dtypes,
 * derives scalar params and the grid/block/smem from the launch rule, and launches. Tensors must be
 * on the function's device. Safe to call from several threads. */
TK_API int tk_function_call(const tk_function *fn, const tk_arg *args, size_t nargs, void *stream);

#define TK_BUILD_OPTS_VERSION 1
typedef struct {
    unsigned version;          /* TK_BUILD_OPTS_VERSION */
    const char *const *archs;  /* e.g. {"sm_80", "sm_90"}; NULL: the detected GPUs, else the config */
    size_t narchs;
    int jobs;                  /* parallel compiles; 0: by cores and memory */
} tk_build_opts;
#define TK_BUILD_OPTS_INIT {TK_BUILD_OPTS_VERSION, NULL, 0, 0}

/* Compiles every kernel of the installed package `ref` (or of a package directory, as for
 * tk_get_kernel) for each arch into the cache (ahead of time,
 * no GPU needed). *compiled / *cached (may be NULL) receive how many binaries were compiled now and
 * how many were already cached. Errors: TK_ERR_NOT_FOUND, TK_ERR_NO_NVRTC, TK_ERR_COMPILE. */
TK_API int tk_build(tk_ctx *ctx, const char *ref, const tk_build_opts *opts, size_t *compiled,
                    size_t *cached);

/* The compiled-binary cache. */
TK_API int tk_cache_stats_json(char **out, tk_ctx *ctx);
TK_API int tk_cache_list_json(char **out, tk_ctx *ctx);
/* Evicts least-recently-used entries until the cache is at most max_bytes (-1: $TK_CACHE_MAX or the
 * configured cap). *freed (may be NULL) receives the bytes freed. */
TK_API int tk_cache_gc(tk_ctx *ctx, int64_t max_bytes, int64_t *freed);
TK_API int tk_cache_clear(tk_ctx *ctx);

/* ---------------------------------------------------------------------------------------------- */
/* Ops                                                                                             */

/* Runs an op (see `tk ops`: tk's own, or one an installed package declares) on tensors: validates
 * shapes and dtypes, picks the best implementation for the tensors' device and runs it: for CUDA
 * tensors a kernel from an installed package; for host tensors the fastest CPU implementation that
 * this CPU can run and that fits the call ("cpu-avx2", "cpu-portable": docs/cpu.md), else the op's CPU
 * reference (TK_CPU_IMPL=reference forces the references); an op a package declares has no CPU
 * implementation. *impl (may be NULL) receives a borrowed description of what ran ("cpu-avx2",
 * "cpu-reference" or "org/name:kernel"), valid until tk_ctx_free(ctx). Host ops use up to
 * tk_ctx_set_threads threads. Errors: TK_ERR_NOT_FOUND (unknown op), TK_ERR_INVALID (the message names
 * the argument and the shape it got), TK_ERR_UNSUPPORTED. */
TK_API int tk_op_run(tk_ctx *ctx, const char *op, const tk_arg *args, size_t nargs, void *stream,
                     const char **impl);
/* Every op with its signature and implementations, as JSON: tk's own ("standard": true), those that
 * packages declare in kernel.json "ops" ("declared_by": "org/name", no CPU reference), and the op names
 * of other package kernels (no signature). TK_ERR_MANIFEST when two packages declare one op with two
 * signatures (the message names both). */
TK_API int tk_ops_json(char **out, tk_ctx *ctx);
/* Adds a package directory's op declarations and kernels to ctx's ops until tk_ctx_free, as tk_check
 * reads it (checked, not compiled, never signed or installed): tk_op_run then tries its kernels first
 * ("org/name@local:kernel", compiled from the directory on first use) and tk_ops_json lists them with
 * "local": true. Its declarations replace the installed same package's. Errors: those of tk_check
 * without a compile (TK_ERR_NOT_FOUND, TK_ERR_MANIFEST). */
TK_API int tk_ops_add_package(tk_ctx *ctx, const char *pkgdir);
/* The threads the CPU ops of this context's calls may use, the calling thread included: n >= 1, or 0
 * for the default ($TK_NUM_THREADS, else the CPUs this process may run on). The threads come from one
 * pool that every context of the process shares; a call made while another thread's call holds the
 * pool runs on its own thread alone. Takes effect from the next tk_op_run. Errors: TK_ERR_INVALID (n
 * negative or above 256). */
TK_API int tk_ctx_set_threads(tk_ctx *ctx, int n);
/* The threads host ops of this context use now (>= 1). */
TK_API int tk_ctx_threads(const tk_ctx *ctx);
/* The CPU as the host ops see it, as JSON (tk_free): {"features": ["avx2", "fma", "f16c", ...] (detected
 * at run time), "threads": this context's, "default_threads", "impl_mode": "auto" | "portable" |
 * "reference" ($TK_CPU_IMPL)}. */
TK_API int tk_cpu_info_json(char **out, const tk_ctx *ctx);

/* ---------------------------------------------------------------------------------------------- */
/* Models                                                                                          */

/* A Hugging Face checkpoint directory loaded as it is (config.json, *.safetensors, tokenizer.json):
 * Llama (LlamaForCausalLM, with MistralForCausalLM and Qwen2ForCausalLM), GPT2LMHeadModel and
 * BertModel. Every layer runs through tk_op_run, so the model runs on the CPU reference or on the GPU
 * kernels of installed packages, chosen by the device at load. See docs/models.md.
 *
 *     tk_model *m = NULL;
 *     tk_model_opts o = TK_MODEL_OPTS_INIT;                 // CPU, f32
 *     if (tk_model_load(&m, ctx, "path/to/checkpoint", &o) != TK_OK) { ... tk_last_error() ... }
 *     int32_t ids[] = {1, 15043, 3186};
 *     size_t len = 3;
 *     float *logits = malloc(sizeof(float) * 3 * tk_model_vocab_size(m));
 *     tk_model_forward(m, ids, &len, 1, logits, NULL);     // one row of logits per position
 *     tk_model_free(m);
 *
 * A tk_model is used from one thread at a time (it holds the activations of its last forward). */
typedef struct tk_model tk_model;

#define TK_MODEL_OPTS_VERSION 1
typedef struct {
    unsigned version;  /* TK_MODEL_OPTS_VERSION */
    int device_type;   /* TK_DEV_CPU (default: the ops' CPU references) or TK_DEV_CUDA */
    int device_id;     /* the CUDA device ordinal */
    const char *dtype; /* compute dtype: "f32", "bf16" or "f16"; "auto": the checkpoint's own (config.json's
                          torch_dtype: no conversion, weights read in place); NULL: "f32" on the CPU,
                          "bf16" on a GPU (its attention kernels take bf16 and f16, head sizes 64, 128,
                          256) */
} tk_model_opts;
#define TK_MODEL_OPTS_INIT {TK_MODEL_OPTS_VERSION, TK_DEV_CPU, 0, NULL}

/* Loads the checkpoint in directory `dir`: reads config.json (and generation_config.json), maps the
 * safetensors files (sharded ones through model.safetensors.index.json), validates every header, and
 * looks each weight up by its Hugging Face name. Weights stay mapped on the CPU when their dtype is the
 * compute dtype, are converted once otherwise, and are uploaded once to a GPU. ctx must outlive the
 * model. Errors: TK_ERR_NOT_FOUND (no config.json or no weights), TK_ERR_INVALID (a malformed file, a
 * missing tensor, a shape or dtype that disagrees with the config: the message names it),
 * TK_ERR_UNSUPPORTED (an architecture or config value tk does not implement: the message names it and
 * lists what is supported), TK_ERR_NO_DEVICE, TK_ERR_NOMEM, TK_ERR_IO. */
TK_API int tk_model_load(tk_model **out, tk_ctx *ctx, const char *dir, const tk_model_opts *opts);
TK_API void tk_model_free(tk_model *m);

/* Borrowed facts about a loaded model. */
TK_API const char *tk_model_arch(const tk_model *m);     /* config's architectures[0] */
TK_API int64_t tk_model_vocab_size(const tk_model *m);   /* columns of a logits row */
TK_API int64_t tk_model_hidden_size(const tk_model *m);  /* columns of a hidden-state row */
TK_API int tk_model_has_lm_head(const tk_model *m);      /* 0 for BertModel: no logits */
/* The model as JSON: architecture, family, sizes, parameters, dtypes, device, weight memory. */
TK_API int tk_model_info_json(char **out, const tk_model *m);

/* Runs the model on a batch of nseq sequences whose token ids are concatenated in `ids` (sequence s has
 * lens[s] tokens, each >= 1). Sequences are independent: positions restart at 0 and attention never
 * crosses them. Writes, for every token in order, one row of vocabulary logits into `logits`
 * (sum(lens) x vocab_size floats; NULL: not computed) and the last hidden state (after the final norm
 * for Llama and GPT-2, the encoder output for BERT) into `hidden` (sum(lens) x hidden_size; NULL: not
 * copied). Outputs are f32 whatever the compute dtype. Activations are planned once per batch shape
 * and kept. Errors: TK_ERR_INVALID (an id outside the vocabulary, a sequence longer than the learned
 * positions of GPT-2 or BERT, logits asked of a model without an LM head), TK_ERR_NOMEM, and those of tk_op_run. */
TK_API int tk_model_forward(tk_model *m, const int32_t *ids, const size_t *lens, size_t nseq, float *logits,
                            float *hidden);
/* BertModel's pooler output of the last forward: tanh(dense(hidden state of each sequence's first
 * token)), nseq x hidden_size floats. Errors: TK_ERR_INVALID (no forward yet, or not a BertModel). */
TK_API int tk_model_pooler_output(float *out, tk_model *m);

/* ---------------------------------------------------------------------------------------------- */
/* Registry server (tk serve)                                                                      */

/* A running registry server: it serves a static registry tree (the layout `tk publish --to` writes)
 * with the Hugging Face Hub's read API, accepts authenticated uploads of signed versions, and renders
 * a browsable HTML page at "/". Its own state (upload tokens, trusted publisher keys) lives in
 * <root>/.tk-serve/, which is never served. */
typedef struct tk_server tk_server;

#define TK_SERVE_OPTS_VERSION 1
typedef struct {
    unsigned version;          /* TK_SERVE_OPTS_VERSION */
    const char *root;          /* the registry tree (created if missing); required */
    const char *listen;        /* "HOST:PORT" (IPv4 address or "[IPv6]"); NULL: "127.0.0.1:8080".
                                  Port 0 picks a free port (see tk_server_port). */
    unsigned threads;          /* worker threads; 0: 4 */
    unsigned max_connections;  /* open connections in all; 0: 256 */
    unsigned max_per_ip;       /* open connections from one address; 0: 32 */
    unsigned timeout_s;        /* an idle or too-slow connection is closed after this; 0: 30 */
    int64_t max_upload;        /* bytes of one upload request; 0: 512 MiB; larger gets 413 */
    tk_log_fn log;             /* one TK_LOG_INFO line per request, TK_LOG_WARN for server trouble.
                                  Called from the server's threads, concurrently: keep it
                                  thread-safe. NULL: nothing is logged. */
    void *log_user;
} tk_serve_opts;
#define TK_SERVE_OPTS_INIT {TK_SERVE_OPTS_VERSION, NULL, NULL, 0, 0, 0, 0, 0, NULL, NULL}

/* Starts serving opts->root on opts->listen in background threads and returns at once; requests are
 * served until tk_server_free. The calling process should block SIGPIPE (the server's threads inherit
 * the signal mask of the caller). Errors: TK_ERR_INVALID (bad options or listen address), TK_ERR_IO
 * (the root cannot be created, or the address cannot be bound: in use, or not permitted). */
TK_API int tk_server_new(tk_server **out, const tk_serve_opts *opts);
/* The TCP port the server listens on (useful with port 0). */
TK_API int tk_server_port(const tk_server *srv);
/* Stops accepting, finishes or closes the open connections and frees the server. Accepts NULL. */
TK_API void tk_server_free(tk_server *srv);

/* Creates an upload token for `org` on the server whose tree is `root`: 32 random bytes (OpenSSL
 * RAND_bytes) in hex. Only its sha256 is stored (<root>/.tk-serve/tokens.json); *token receives the
 * token itself, which cannot be recovered later (tk_free). Errors: TK_ERR_INVALID (bad org), TK_ERR_IO. */
TK_API int tk_serve_token_add(char **token, const char *root, const char *org);

/* Trusts `pubkey` ("ed25519:<64 hex>") to publish packages of `org` through the server whose tree is
 * `root` (<root>/.tk-serve/trust.json). Adding a key twice is a no-op. *keyid (may be NULL) receives
 * its fingerprint (tk_free). Errors: TK_ERR_INVALID (bad org or key), TK_ERR_IO. */
TK_API int tk_serve_trust_add(char **keyid, const char *root, const char *org, const char *pubkey);
/* The server's upload tokens as a JSON array of {"id": "<16 hex>", "org", "created"} (the tokens
 * themselves are not stored; id is the start of their sha256). */
TK_API int tk_serve_token_list_json(char **out, const char *root);
/* Revokes the token named by its id (8 to 64 hex digits of its sha256, as listed) or by the token
 * itself. Errors: TK_ERR_NOT_FOUND, TK_ERR_INVALID (not an id, or an id prefix naming several). */
TK_API int tk_serve_token_revoke(const char *root, const char *id_or_token);
/* The keys trusted for uploads: a JSON array of {"org", "keyid", "pubkey", "added"}. */
TK_API int tk_serve_trust_list_json(char **out, const char *root);
/* Stops trusting a key (its key id, with or without "SHA256:", or its public key) for org.
 * Errors: TK_ERR_NOT_FOUND. */
TK_API int tk_serve_trust_remove(const char *root, const char *org, const char *key);

/* ---------------------------------------------------------------------------------------------- */
/* Tokenizers                                                                                      */
/*
 * A Hugging Face tokenizer.json, as the `tokenizers` library reads it: normalizers, pre-tokenizers,
 * BPE (byte-level, or SentencePiece-style with byte fallback), WordPiece or WordLevel, added and
 * special tokens, post-processors and decoders. Token ids are those of `tokenizers`; truncation and
 * padding in the file are ignored (the caller decides). A loaded tokenizer is immutable: any number
 * of threads may encode and decode with it at once. See docs/tokenizers.md.
 */
typedef struct tk_tokenizer tk_tokenizer;
/* Loads tokenizer.json from a file path or a model directory. Errors: TK_ERR_NOT_FOUND,
 * TK_ERR_INVALID (malformed: the message names the field), TK_ERR_UNSUPPORTED (a component tk does
 * not implement: the message names it and lists the supported ones), TK_ERR_NOMEM. */
TK_API int tk_tokenizer_load(tk_tokenizer **out, const char *path_or_dir);
TK_API void tk_tokenizer_free(tk_tokenizer *tok);
/* Encodes UTF-8 text (len bytes; invalid UTF-8 is TK_ERR_INVALID). add_special: 1 applies the
 * post-processor (BERT's [CLS] ... [SEP], Llama's <s>) as tokenizers' encode(add_special_tokens=True).
 * *ids is owned by the caller (tk_free). */
TK_API int tk_tokenizer_encode(int32_t **ids, size_t *n, const tk_tokenizer *tok,
                               const char *text, size_t len, int add_special);
/* Decodes ids to UTF-8 as tokenizers' decode(ids, skip_special_tokens=skip_special).
 * *text is owned by the caller (tk_free). Errors: TK_ERR_INVALID (an id outside the vocabulary). */
TK_API int tk_tokenizer_decode(char **text, const tk_tokenizer *tok, const int32_t *ids, size_t n,
                               int skip_special);
/* The number of ids: one more than the highest id of the model's vocabulary and the added tokens. */
TK_API size_t tk_tokenizer_vocab_size(const tk_tokenizer *tok);
/* The id of a token string (added/special tokens included); TK_ERR_NOT_FOUND when absent. */
TK_API int tk_tokenizer_token_id(int32_t *id, const tk_tokenizer *tok, const char *token);
/* Borrowed token text of an id, or NULL when out of range. */
TK_API const char *tk_tokenizer_token(const tk_tokenizer *tok, int32_t id);

/* The model directory's tokenizer (tokenizer.json), loaded on first use and owned by the model.
 * Errors: those of tk_tokenizer_load. */
TK_API int tk_model_tokenizer(const tk_tokenizer **out, tk_model *m);

/* Sentence embeddings of n UTF-8 texts, as sentence-transformers computes them for the directory's
 * modules.json: each text is encoded with special tokens ([CLS] ... [SEP]), truncated to
 * sentence_bert_config.json's max_seq_length, run through the model in one packed batch, pooled
 * (1_Pooling/config.json: mean (the default), cls or max over the text's tokens) and L2-normalised when
 * a Normalize module is listed. Writes n x hidden_size floats to out. Errors: TK_ERR_UNSUPPORTED (not
 * an encoder model, or a pooling mode tk lacks), those of the tokenizer and of tk_model_forward. */
TK_API int tk_model_embed(float *out, tk_model *m, const char *const *texts, size_t n);

/* ---------------------------------------------------------------------------------------------- */
/* Generation                                                                                      */

/* Text generation over a loaded causal LM (Llama family, GPT-2) with transformers' GenerationConfig
 * semantics: greedy, sampling and beam search, the same logits processors in the same order, eos
 * lists and stop strings; a paged KV cache; a per-token stream callback; several prompts in one batch.
 *
 *     tk_gen_opts o = TK_GEN_OPTS_INIT;
 *     tk_gen_opts_from_model(&o, model);         // generation_config.json's defaults
 *     o.max_new_tokens = 32;
 *     tk_gen_result *r = NULL;
 *     if (tk_generate(&r, model, &ids, &n, 1, &o) == TK_OK) puts(tk_gen_result_text(r, 0));
 *     tk_gen_result_free(r);
 */

#define TK_GEN_MAX_EOS 16

/* Receives each new token of sequence `seq` (the prompt's index) as it is chosen, with the text it
 * completes: `text` (len bytes, not NUL-terminated, possibly empty) never ends inside a multi-byte
 * UTF-8 character, and the pieces of one sequence concatenate to its decoded text. Beam search calls
 * it once the winning beam is known. Return 0 to go on, nonzero to stop that sequence. */
typedef int (*tk_gen_stream_fn)(void *user, size_t seq, int32_t token, const char *text, size_t len);

enum { TK_GEN_EARLY_HEURISTIC = 0, TK_GEN_EARLY_TRUE = 1, TK_GEN_EARLY_NEVER = 2 };

#define TK_GEN_OPTS_VERSION 1
typedef struct {
    unsigned version;             /* TK_GEN_OPTS_VERSION */
    int64_t max_new_tokens;       /* tokens to generate at most (> 0); -1: max_length - prompt length */
    int64_t max_length;           /* prompt + new tokens, when max_new_tokens is -1; default 20 */
    int do_sample;                /* 0: greedy (num_beams 1) or beam search; 1: sampling */
    double temperature;           /* sampling: > 0; default 1 */
    int64_t top_k;                /* sampling: keep the k most likely (0: off); default 50 */
    double top_p;                 /* sampling: nucleus mass in (0, 1]; default 1 (off) */
    double min_p;                 /* sampling: in [0, 1]; 0: off */
    double repetition_penalty;    /* > 0; 1: off */
    int64_t no_repeat_ngram_size; /* 0: off */
    int64_t num_beams;            /* 1: no beam search */
    double length_penalty;        /* beam scores are divided by length^length_penalty; default 1 */
    int early_stopping;           /* TK_GEN_EARLY_*: transformers' False, True, "never" */
    int32_t eos_token_id[TK_GEN_MAX_EOS]; /* generation ends after any of these */
    size_t n_eos;
    int64_t pad_token_id;         /* -1: none (informational; sequences are never padded) */
    uint64_t seed;                /* sampling: the Philox seed of the registry's sample op */
    const char *const *stop_strings; /* generation ends once the text contains one (needs a tokenizer) */
    size_t n_stop;
    tk_gen_stream_fn stream;      /* NULL: no streaming */
    void *stream_user;
    int use_cache;                /* 1: paged KV cache (default); 0: recompute the whole sequence each step */
    const char *kv_dtype;         /* NULL: the model's dtype; "bf16", "f16", "f32", "i8", "fp8_e4m3" */
    int64_t kv_block_size;        /* tokens per KV block; default 16 */
    int64_t kv_max_bytes;         /* the KV cache may grow to this many bytes; 0: no bound */
} tk_gen_opts;
#define TK_GEN_OPTS_INIT                                                                            \
    {TK_GEN_OPTS_VERSION, -1, 20, 0, 1.0, 50, 1.0, 0.0, 1.0, 0, 1, 1.0, TK_GEN_EARLY_HEURISTIC, {0}, 0, -1, 0, \
     NULL, 0, NULL, NULL, 1, NULL, 16, 0}

/* Weight-only quantisation for inference: from the next forward on, every linear layer's weight
 * (attention, MLP and LM head projections; not embeddings or norms) runs as `casted_linear` over an
 * "i8" or "fp8_e4m3" copy with one f32 scale per output row (max |row| / 127 or / 448), made the first
 * time the layer runs; activations stay in the compute dtype. "none" (or NULL) turns it off (the copies
 * are freed). tk_model_quant_json reports what the copies save. Errors: TK_ERR_INVALID (another
 * dtype). */
TK_API int tk_model_quantize(tk_model *m, const char *dtype);
/* {"quant": "i8", "weights": N, "float_bytes": B, "quant_bytes": Q}: what the quantised copies made so
 * far replace (bytes in the compute dtype) and take (values and scales). *json is the caller's. */
TK_API int tk_model_quant_json(char **json, const tk_model *m);

typedef struct tk_gen_result tk_gen_result;

/* Sets o's fields from the model's generation_config.json (and config.json's eos/pad ids), over
 * transformers' defaults, as GenerationConfig.from_pretrained does; fields the file does not name keep
 * their values. Errors: TK_ERR_INVALID (a malformed file or field, named). */
TK_API int tk_gen_opts_from_model(tk_gen_opts *o, tk_model *model);

/* Generates for np prompts (prompts[i]: lens[i] token ids) in one batch; each sequence finishes on its
 * own. On success *out holds np sequences. opts NULL: transformers' defaults. Errors: TK_ERR_INVALID
 * (an empty prompt, a prompt that does not fit the context, max_new_tokens 0, an option out of range:
 * the message names it), TK_ERR_UNSUPPORTED (sampling with beams; a stop string without a tokenizer),
 * TK_ERR_NOMEM (the KV cache would pass kv_max_bytes), and the model's and ops' errors. */
TK_API int tk_generate(tk_gen_result **out, tk_model *model, const int32_t *const *prompts,
                       const size_t *lens, size_t np, const tk_gen_opts *opts);
TK_API void tk_gen_result_free(tk_gen_result *r);
TK_API size_t tk_gen_result_count(const tk_gen_result *r);
/* The new token ids of sequence i (eos included when it ended on one); borrowed. */
TK_API const int32_t *tk_gen_result_ids(const tk_gen_result *r, size_t i, size_t *n);
/* Their decoded text (special tokens skipped), or NULL when the model has no tokenizer; borrowed. */
TK_API const char *tk_gen_result_text(const tk_gen_result *r, size_t i);
/* Why sequence i ended: "length", "eos", "stop_string" or "callback". */
TK_API const char *tk_gen_result_end(const tk_gen_result *r, size_t i);
/* Measurements of the call, as JSON: {"prefill_ms", "decode_ms", "prefill_tokens", "decode_tokens",
 * "steps", "decode_tokens_per_s", "kv_cache", "kv_bytes", "kv_peak_bytes", "kv_blocks", "kv_block_size",
 * "kv_dtype"}. decode_* time the tokens after each sequence's first (which the prefill gives);
 * kv_bytes is what the cache allocated, kv_peak_bytes what its sequences held at most. *json is the
 * caller's (tk_free). */
TK_API int tk_gen_result_stats_json(char **json, const tk_gen_result *r);

/* ---------------------------------------------------------------------------------------------- */
/* Chat templates                                                                                  */

/* One turn of a conversation: role ("system", "user", "assistant", ...) and UTF-8 content. */
typedef struct {
    const char *role, *content;
} tk_chat_message;

/* Renders n messages with the chat template of `dir`'s tokenizer_config.json (chat_template: a string,
 * or a list of {name, template} whose "default" is used; a path to the file itself works too), as
 * transformers' apply_chat_template(messages, tokenize=False, add_generation_prompt=...) does: the
 * template sees messages, add_generation_prompt and the file's special tokens (bos_token, eos_token,
 * ...). tk interprets a Jinja2 subset (docs/generation.md, "Chat"), with bounds on output size, steps
 * and nesting. The text is not tokenized: encode it without special tokens (the template adds them).
 * *out is the caller's (tk_free). Errors: TK_ERR_NOT_FOUND (no tokenizer_config.json, or no
 * chat_template in it), TK_ERR_UNSUPPORTED (a construct outside the subset: the message names it and
 * its line), TK_ERR_INVALID (a malformed file or template, a limit passed, or the template's own
 * raise_exception, whose message is quoted), TK_ERR_NOMEM, TK_ERR_IO. */
TK_API int tk_chat_render(char **out, const char *dir, const tk_chat_message *msgs, size_t n,
                          int add_generation_prompt);

/* ---------------------------------------------------------------------------------------------- */
/* Communicators: several processes or GPUs (comm/, docs/parallel.md)                              */
/*
 * A tk_comm is a group of ranks 0..size-1 that run collectives together: all-reduce (sum), all-gather,
 * broadcast and barrier. tk writes no transport of its own; the backends are
 *   - MPI (linked when the build found Open MPI or MPICH with pkg-config): processes started by mpirun
 *     (or srun, hydra), or by a host program that already called MPI_Init. Host buffers.
 *   - NCCL (libnccl.so.2, loaded with dlopen on first use): one rank per GPU, device buffers; the
 *     unique id goes from rank 0 to the others over MPI, or through a file (nccl_id_file).
 *   - self: one process alone (size 1), what tk does when neither is asked for or present.
 *
 *     tk_comm *c = NULL;
 *     tk_comm_opts o = TK_COMM_OPTS_INIT;          // MPI under mpirun, else one process alone
 *     if (tk_comm_new(&c, &o) != TK_OK) { fprintf(stderr, "%s\n", tk_last_error()); ... }
 *     int64_t shape[1] = {n};
 *     tk_tensor t = {buf, {TK_DEV_CPU, 0}, 1, {TK_DL_FLOAT, 32, 1}, shape, NULL, 0};
 *     if (tk_comm_all_reduce_sum(c, &t, NULL) != TK_OK) { ...; tk_comm_abort(c, 1); }
 *     tk_comm_free(c);
 *
 * Every collective must be called by every rank of the communicator, in the same order, with the same
 * sizes and dtype; a rank that differs is a deadlock that the timeout ends. Collectives block the
 * calling thread until they are complete on this rank (NCCL: enqueued on `stream`, then waited for),
 * polling the backend with a deadline: when the other ranks do not take part within the timeout (a
 * rank died, hung, or is far behind) the call fails with TK_ERR_NETWORK naming the collective, the
 * rank and the time waited, and the communicator is broken: every later call fails at once with the
 * same error. A rank that ends abnormally under mpirun makes mpirun end the others at once; the
 * timeout covers the cases no launcher sees (a rank that hangs, a launcher configured not to). After
 * such an error, end the job with tk_comm_abort, or exit: the peers then fail within their timeout.
 * A failed collective may still write its output buffer later: keep its buffers alive until exit.
 *
 * Threads: a communicator is used by one thread at a time. Calls on different communicators may run
 * concurrently only when MPI provides MPI_THREAD_MULTIPLE (tk asks for MPI_THREAD_SERIALIZED when it
 * initialises MPI itself; a host that initialised MPI with MPI_THREAD_SINGLE or _FUNNELED must call
 * from the thread that called MPI_Init). tk_comm_backends_json may be called from any thread.
 */
typedef struct tk_comm tk_comm;

enum { TK_COMM_AUTO = 0, TK_COMM_SELF = 1, TK_COMM_MPI = 2, TK_COMM_NCCL = 3 };

#define TK_COMM_OPTS_VERSION 1
typedef struct {
    unsigned version;         /* TK_COMM_OPTS_VERSION */
    int backend;              /* TK_COMM_*. AUTO: MPI when MPI is initialised already or an MPI
                                 launcher started the process (its environment says so), else SELF.
                                 NCCL is used only when asked for. */
    int64_t timeout_ms;       /* each call's deadline, creation included; 0: $TK_COMM_TIMEOUT
                                 (seconds, may be fractional), else 300 s */
    int expect_size;          /* > 0: a world of another size is TK_ERR_INVALID (e.g. --tp N) */
    const void *mpi_comm;     /* MPI and NCCL-over-MPI: a pointer to the host's MPI_Comm, duplicated
                                 (the host keeps its own); NULL: MPI_COMM_WORLD */
    int device;               /* NCCL: this rank's CUDA ordinal; -1: local rank % visible GPUs */
    const char *nccl_id_file; /* NCCL without MPI: rank 0 writes the unique id there (it must not
                                 exist yet: use a fresh path per job), the others wait for it; NULL:
                                 over MPI */
    int rank, size;           /* NCCL with nccl_id_file: this rank and the world size; -1: from
                                 $TK_RANK and $TK_WORLD_SIZE, else torchrun's $RANK and $WORLD_SIZE */
} tk_comm_opts;
#define TK_COMM_OPTS_INIT {TK_COMM_OPTS_VERSION, TK_COMM_AUTO, 0, 0, NULL, -1, NULL, -1, -1}

/* Creates a communicator over all the ranks of the job (a collective: every rank calls it). With MPI it
 * calls MPI_Init_thread when nobody has (and MPI_Finalize when the last communicator it made is freed;
 * MPI cannot be initialised twice in a process, so keep one communicator for the process's life), or
 * uses the host's MPI as it is. The ranks exchange their host names to know their local rank. NCCL's
 * communicator is made non-blocking, so its creation honours the timeout too.
 * Errors: TK_ERR_INVALID (bad options; expect_size differs from the world size; a missing rank or size
 * for nccl_id_file), TK_ERR_UNSUPPORTED (MPI asked of a build without MPI, or MPI finalised already),
 * TK_ERR_NOT_FOUND (NCCL asked for and libnccl.so.2 not found: $TK_NCCL names it), TK_ERR_NO_DEVICE
 * (NCCL without a GPU), TK_ERR_NETWORK (a peer did not join within the timeout; MPI or NCCL failed),
 * TK_ERR_IO (the id file), TK_ERR_NOMEM. */
TK_API int tk_comm_new(tk_comm **out, const tk_comm_opts *opts);
/* Frees the communicator (not a collective). Accepts NULL. A broken communicator is let go without
 * touching the backend (no MPI_Finalize, ncclCommAbort for NCCL), since its peers may be gone. */
TK_API void tk_comm_free(tk_comm *c);

TK_API int tk_comm_rank(const tk_comm *c);         /* 0 .. size-1 */
TK_API int tk_comm_size(const tk_comm *c);         /* the world size: ranks in the communicator */
TK_API int tk_comm_local_rank(const tk_comm *c);   /* rank among the ranks on this host */
TK_API int tk_comm_local_size(const tk_comm *c);   /* ranks on this host */
TK_API const char *tk_comm_backend(const tk_comm *c); /* "self", "mpi" or "nccl"; borrowed */
TK_API int tk_comm_device(const tk_comm *c);       /* NCCL: the rank's CUDA ordinal; -1 otherwise */
/* The host name of rank r (borrowed), NULL when r is out of range. */
TK_API const char *tk_comm_host(const tk_comm *c, int r);

/* Sums t over all ranks, in place: every rank ends with the same values. t is contiguous (strides NULL
 * or row-major), on the host for MPI and self, on the communicator's GPU for NCCL. dtypes: f32, f64,
 * f16, bf16, i32, i64 (f16 and bf16 are summed in f32 and rounded once with MPI; NCCL sums them in
 * its own way). stream: NCCL's CUDA stream (NULL: the default stream); ignored otherwise.
 * Errors: TK_ERR_INVALID (NULL or not contiguous, a dtype outside the list), TK_ERR_UNSUPPORTED
 * (a device the backend cannot reach: MPI with a GPU tensor), TK_ERR_NETWORK (timeout, a peer's
 * failure, a broken communicator), TK_ERR_NOMEM. */
TK_API int tk_comm_all_reduce_sum(tk_comm *c, tk_tensor *t, void *stream);
/* Concatenates every rank's `in` along the outermost axis in rank order into `out`, on every rank:
 * out holds size x numel(in) elements of in's dtype (any dtype: the bytes are moved). In place when
 * in's data is rank's part of out. Errors as tk_comm_all_reduce_sum. */
TK_API int tk_comm_all_gather(tk_comm *c, tk_tensor *out, const tk_tensor *in, void *stream);
/* Copies root's t to every other rank's t (any dtype). Errors as tk_comm_all_reduce_sum, and
 * TK_ERR_INVALID for a root outside 0..size-1. */
TK_API int tk_comm_broadcast(tk_comm *c, tk_tensor *t, int root, void *stream);
/* Returns once every rank has called it (or fails with TK_ERR_NETWORK at the timeout). */
TK_API int tk_comm_barrier(tk_comm *c);
/* Ends the whole job after a failure: with MPI, MPI_Abort(code), which does not return (the launcher
 * kills every rank); with NCCL, ncclCommAbort (and MPI_Abort when MPI bootstrapped it); with self it
 * only breaks the communicator. Returns (for self and NCCL over a file) so the caller can exit. */
TK_API void tk_comm_abort(tk_comm *c, int code);

/* What this build and process can use, without initialising anything, as JSON (tk_free):
 * {"mpi": {"built": bool, "library": "Open MPI v4.1.4, ..." | null, "launcher": "Open MPI" | "MPICH" |
 *  "PMIx" | "Slurm" | null, "initialized": bool, "world_size": n | null, "rank": r | null,
 *  "local_rank": r | null},
 *  "nccl": {"found": bool, "path": "..." | null, "version": "2.28.9" | null, "error": "..." | null}}.
 * world_size and rank come from the launcher's environment. Loads libnccl.so.2 to read its version. */
TK_API int tk_comm_backends_json(char **out);

#ifdef __cplusplus
}
#endif
#endif /* TK_H */
