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
/* A digest (16 hex digits) of the sources this library was built from. The ranks of a tensor- or
 * data-parallel job compare it when their communicator starts (tk_comm_new): every rank must run the
 * same tk. */
TK_API const char *tk_build_id(void);

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
    TK_ERR_INTERNAL = -20,    /* a bug in tk: please report it */
    TK_ERR_CORRUPT = -21,     /* a file is damaged: truncated, or not in its format (a checkpoint's safetensors) */
    TK_ERR_AUTH = -22,        /* the registry refused the credentials (HTTP 401/403): no token, a bad
                                 or revoked one, or one for another org */
    TK_ERR_SELFTEST = -23     /* a kernel failed its self-test on this GPU (tk_selftest, docs/selftest.md) */
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
/* The keys of config.json that tk does not know (a misspelt "endpont", or a newer tk's setting), which
 * the context ignored and logged as warnings when it was created, as a JSON array (tk_free): [{"file",
 * "key", "line", "column", "message", "suggestion": the known key it is closest to, or null, "hint"}];
 * "[]" when there are none. */
TK_API int tk_ctx_config_warnings_json(char **out, const tk_ctx *ctx);
/* The registries in lookup order as JSON (tk_free): [{"url", "packages": [patterns] | null, "source":
 * "TK_ENDPOINT" | "config" | "default"}]. A package resolves in the registry named for it, else the
 * one whose "packages" patterns match it, else the one it was installed from, else the first of
 * those without patterns that has it. $TK_ENDPOINT makes one registry serve everything. */
TK_API int tk_ctx_registries_json(char **out, const tk_ctx *ctx);
/* Hands msg to the context's log callback (tk_ctx_opts.log; nothing without one) at level TK_LOG_*, as
 * tk's own warnings reach it: a host program, or tk's model pipelines (a checkpoint whose special token
 * ids lie outside its vocabulary), report through the same channel. Same thread rules as the callback. */
TK_API void tk_ctx_log(const tk_ctx *ctx, int level, const char *msg);

/* ---------------------------------------------------------------------------------------------- */
/* Packages                                                                                        */

/* A reference names a package and optionally a version:
 *     org/name            the highest major version the registry has
 *     org/name@2          major 2 (branch v2); "@v2" is accepted too
 *     org/name@<40 hex>   exactly that commit
 *     org/name@<7-39 hex> the one commit that starts so (the 12 hex tk list prints); a prefix that
 *                         several commits share fails with TK_ERR_INVALID naming them
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
/* tk_version_list_latest, but only when it is newer than `than` (an installed version): what an
 * update may move to, never a downgrade. NULL when there is none, or `than` is not a version. */
TK_API const char *tk_version_list_newer(const tk_version_list *l, int major, const char *than);
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

#define TK_PUBLISH_OPTS_VERSION 2
typedef struct {
    unsigned version;         /* TK_PUBLISH_OPTS_VERSION */
    const char *key_path;     /* private key (PEM); required */
    const char *compression;  /* "gz" (default) or "zst" */
    /* version 2 (a version 1 struct compiles, for config.json's archs or sm_80 and sm_90): */
    int no_compile;           /* 1: skip the NVRTC compile before signing */
    const char *const *archs; /* "sm_80", "sm_90a" ... to compile for; NULL: config.json's "archs",
                                 else sm_80 and sm_90. A kernel whose constraints rule out all of them
                                 is compiled for its own min_cc. */
    size_t narchs;
} tk_publish_opts;
#define TK_PUBLISH_OPTS_INIT {TK_PUBLISH_OPTS_VERSION, NULL, NULL, 0, NULL, 0}

/* Publishes the package in `pkgdir` (its kernel.json and sources) into the static registry tree
 * `to_dir`: writes the manifest, its signature and the source archive under a new commit, moves branch
 * v<major> to it and keeps the history. Republishing identical content is a no-op that returns the
 * same commit. It first runs tk_check's checks and compiles every kernel with NVRTC (see the opts),
 * and refuses the package, writing nothing, when one fails; when NVRTC cannot be loaded it logs a
 * warning that the package was not compiled and goes on. *commit (may be NULL) receives the commit
 * id. Errors: TK_ERR_MANIFEST for a bad kernel.json, TK_ERR_COMPILE (a kernel does not compile: the
 * message holds NVRTC's file:line), TK_ERR_INVALID (a bad arch), TK_ERR_ROLLBACK if the version is
 * not newer than the branch head, TK_ERR_IO. */
TK_API int tk_publish(char **commit, tk_ctx *ctx, const char *pkgdir, const char *to_dir, const tk_publish_opts *opts);

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

/* Publishes pkgdir to a `tk serve` registry over HTTP: checks, compiles, builds and signs the version
 * as tk_publish does (the compile runs here, before anything is sent), then uploads it (PUT {registry}/api/upload/{org}/{name}) with the bearer token (NULL: the
 * context's, from TK_TOKEN). The server re-checks the signature (its trust store must hold the key for
 * the org), the manifest, the digests and the archive rules, and writes the version atomically.
 * *commit (may be NULL) receives the commit the server wrote; *created (may be NULL) is 0 when it had
 * that content already. Errors: TK_ERR_INVALID (no token, not an http(s) URL, bad token or too large),
 * TK_ERR_COMPILE, TK_ERR_UNTRUSTED, TK_ERR_SIGNATURE, TK_ERR_MANIFEST, TK_ERR_DIGEST, TK_ERR_ARCHIVE, TK_ERR_ROLLBACK
 * (the registry has this major at a newer or equal version with other content), TK_ERR_NOSPACE,
 * TK_ERR_NETWORK, TK_ERR_IO. */
/* Yanks (withdraws) a published version: `ref` is "org/name@MAJOR.MINOR.PATCH". Signs a yank statement
 * with the publisher's key (opts->key_path) and records it in the static tree `to_dir`, or sends it to
 * the `tk serve` registry at `registry` with the token (NULL: the context's); exactly one of to_dir and
 * registry. The version's files stay, so lock files that pin its commit still install it; if it heads
 * its branch, the branch moves back to the newest version of that major that is not yanked (or, when
 * there is none, the branch is removed and the major resolves to nothing), and clients that already
 * saw the yanked version accept the move because the statement is signed by a key they trust. A
 * yanked version is never published again. It logs one line (TK_LOG_INFO) saying what happened.
 * moved_to (may be NULL; 41 bytes) receives the commit the branch moved to, or "" when it did not move
 * or was removed. Errors: TK_ERR_INVALID (bad ref), TK_ERR_NOT_FOUND (no such version),
 * TK_ERR_UNTRUSTED (the server does not trust the key), TK_ERR_AUTH (the registry refused the token),
 * TK_ERR_NETWORK, TK_ERR_IO. */
TK_API int tk_yank(tk_ctx *ctx, const char *ref, const char *reason, const char *to_dir, const char *registry,
                   const char *token, const tk_publish_opts *opts, char *moved_to);

TK_API int tk_publish_upload(char **commit, int *created, tk_ctx *ctx, const char *pkgdir, const char *registry,
                             const char *token, const tk_publish_opts *opts);

/* ---------------------------------------------------------------------------------------------- */
/* Tensors (DLPack-compatible)                                                                     */

/* tk_tensor has DLTensor's exact layout (dlpack.h v1.x), so a DLTensor * from PyTorch, JAX or CuPy
 * can be passed as a tk_tensor * without copying. The memory is the caller's. */
enum { TK_DEV_CPU = 1, TK_DEV_CUDA = 2 };                      /* DLDeviceType values */
enum {
    TK_DL_INT = 0,
    TK_DL_UINT = 1,
    TK_DL_FLOAT = 2,
    TK_DL_BFLOAT = 4,
    TK_DL_FLOAT8_E4M3FN = 10,
    TK_DL_FLOAT8_E5M2 = 12
};        /* DLDataTypeCode values */

typedef struct {
    uint8_t code;   /* TK_DL_* */
    uint8_t bits;   /* 8, 16, 32, 64 */
    uint16_t lanes; /* 1 */
} tk_dtype;

typedef struct {
    void *data;                    /* base pointer (host or device) */
    struct {
        int32_t device_type;
        int32_t device_id;
    } device;
    int32_t ndim;
    tk_dtype dtype;
    int64_t *shape;                /* ndim sizes */
    int64_t *strides;              /* ndim strides in elements, or NULL for contiguous row-major */
    uint64_t byte_offset;          /* added to data */
} tk_tensor;

/* Names used in manifests and messages: "f32", "f16", "bf16", "f64", "i8", "u8", "i32", "i64",
 * "fp8_e4m3", "fp8_e5m2". tk_dtype_name returns "?" for anything else. tk_dtype_parse also takes the
 * other spellings people type, in any case: float32/fp32/float, float16/fp16/half, bfloat16,
 * float64/fp64/double, int8, uint8, int32, int64, float8_e4m3fn/e4m3, float8_e5m2/e5m2 (manifests take
 * only the names above). Errors: TK_ERR_INVALID, the message listing the names. */
TK_API const char *tk_dtype_name(tk_dtype dt);
TK_API int tk_dtype_parse(tk_dtype *out, const char *name);

/* Converts n elements of the host array src (dtype src_dtype) into dst (dtype dst_dtype), both one of
 * f32, f64, f16, bf16, fp8_e4m3, fp8_e5m2, with the bits tk's CPU references and checkpoint loader
 * use: widening is exact; narrowing rounds to nearest even (as __float2half_rn and
 * __float2bfloat16_rn), overflows to inf in f16 and bf16 and saturates to the largest finite value in
 * fp8 (__NV_SATFINITE); NaN stays NaN. Narrowing from f64 goes through f32. dst and src do not
 * overlap unless they are the same array of the same dtype size. Errors: TK_ERR_INVALID (another
 * dtype, or a NULL array with n > 0). Any thread. */
TK_API int tk_convert(void *dst, tk_dtype dst_dtype, const void *src, tk_dtype src_dtype, size_t n);

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
TK_API int tk_function_launch(const tk_function *fn, const unsigned grid[3], const unsigned block[3], size_t smem,
                              void *stream, void **args);

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
TK_API int tk_build(tk_ctx *ctx, const char *ref, const tk_build_opts *opts, size_t *compiled, size_t *cached);

/* The compiled-binary cache. */
TK_API int tk_cache_stats_json(char **out, tk_ctx *ctx);
TK_API int tk_cache_list_json(char **out, tk_ctx *ctx);
/* Evicts least-recently-used entries until the cache is at most max_bytes (-1: $TK_CACHE_MAX or the
 * configured cap). *freed (may be NULL) receives the bytes freed. */
TK_API int tk_cache_gc(tk_ctx *ctx, int64_t max_bytes, int64_t *freed);
TK_API int tk_cache_clear(tk_ctx *ctx);

/* ---------------------------------------------------------------------------------------------- */
/* Self-tests: proving kernels on this GPU (api/selftest.c, docs/selftest.md)                      */

/* A self-test runs every kernel of a package that fits the GPU on small cases of its op (edge shapes:
 * one row, a length that is no multiple of a block, the largest head size the kernel declares; each
 * option it takes; every dtype it declares) and compares each output with the op's CPU reference, with
 * the per-dtype tolerances of tk's GPU tests. Outputs start as NaN bytes, so an element a kernel never
 * writes fails. Each kernel ends as "passed", "failed" (a wrong element: the worst is reported, with
 * the value expected and the value got; or a launch the driver refused), "crashed" (a device fault),
 * "timed_out" (a launch past the limit), "untested" (its op has no CPU reference, or no case fits it)
 * or "skipped" (not for this GPU's arch).
 *
 * The kernels run in a CUDA context of their own, never the primary one: a fault is recovered by
 * destroying that context and making a new one, and the run goes on; the caller's tensors and kernels
 * are not touched. The results are recorded in cache.db, keyed by the compiled binary's key, the GPU's
 * UUID, the driver version and tk's version, so a new build, driver or tk is tested afresh.
 *
 * tk_op_run consults the records (config.json "selftest": "off", "record" (default) or "required";
 * $TK_SELFTEST overrides): it never dispatches to a kernel whose recorded self-test failed, crashed or
 * timed out on this GPU, using the next kernel that fits, else the CPU reference when "cpu_fallback":
 * true, else failing with TK_ERR_SELFTEST naming the failed self-test. With "required" a kernel runs
 * only after it passed here (the first use runs its self-test), and autotune times only such kernels. */
#define TK_SELFTEST_OPTS_VERSION 1
typedef struct {
    unsigned version;          /* TK_SELFTEST_OPTS_VERSION */
    int device;                /* CUDA device ordinal; default 0 */
    const char *op;            /* only the kernels of this op (NULL: all) */
    const char *kernel;        /* only this kernel, by its manifest name (NULL: all) */
    double launch_timeout_s;   /* the limit of one launch; 0: 5 s */
    tk_get_opts get;           /* how the package is fetched when it is not installed */
    int plan_only;             /* 1: no GPU: for each kernel that fits `arch`, the cases it would run, with
                                  their CPU references run and timed; nothing recorded */
    const char *arch;          /* plan_only: the arch to plan for ("sm_90") */
} tk_selftest_opts;
#define TK_SELFTEST_OPTS_INIT {TK_SELFTEST_OPTS_VERSION, 0, NULL, NULL, 0, TK_GET_OPTS_INIT, 0, NULL}

/* Self-tests the kernels of `ref` (an installed package, installed first as tk_get_kernel does, or a
 * package directory) on the device and records each result. *report receives the run as JSON (tk_free):
 * {"package", "version", "commit" (null for a directory), "local", "device": {"ordinal", "name", "uuid",
 * "arch", "driver"}, "tk_version", "launch_timeout_s", "kernels": [{"kernel", "op", "status",
 * "binary_key", "cases", "seconds", "detail": {"summary", ...}}], "counts": {"passed", "failed",
 * "crashed", "timed_out", "untested", "skipped"}, "ok", "cuda_lost", "load_seconds", "seconds"}.
 * A kernel that faults or hangs ends CUDA in the calling process (a sticky error is the process's, and a
 * launch that never ends runs until exit): it is recorded, "cuda_lost" says why (else null), the later
 * kernels are "untested", and every later self-test in the process fails with TK_ERR_LAUNCH; run
 * untrusted packages through `tk selftest` (a process of its own). A kernel whose record for this binary
 * on this GPU is crashed or timed_out is not run again (detail "not_run": true).
 * Returns TK_OK when no kernel failed, crashed or timed out; TK_ERR_SELFTEST when one did (*report is
 * set then too); else, with *report NULL, the errors of tk_get_kernel (TK_ERR_NO_DEVICE without a GPU,
 * TK_ERR_NOT_FOUND, TK_ERR_COMPILE, ...), TK_ERR_CACHE. Uses the context's thread; reports progress
 * through the context's progress callback ("selftest <kernel>").
 * With opts->plan_only (no GPU needed) the report is the plan instead: {"package", "version", "local",
 * "arch", "plan": true, "kernels": [{"kernel", "op", "status": "planned" | "untested" | "skipped",
 * "cases", "seconds", "detail": {"summary", "case_labels"}}], "counts": {"planned", "untested",
 * "skipped"}, "cpu_seconds" (in the CPU references), "seconds"}, and the return TK_OK. */
TK_API int tk_selftest(char **report, tk_ctx *ctx, const char *ref, const tk_selftest_opts *opts);

/* The standing of installed packages on device `device` (ref NULL: every installed package): for each
 * kernel that fits the GPU, the record of its current binary on this GPU, driver and tk, else
 * "never_tested": {"device": {...}, "tk_version", "packages": [{"package", "version", "commit", "passed",
 * "failed", "untested", "never_tested", "kernels": [{"kernel", "status", "binary_key", "summary"?}]}]}
 * ("failed" counts failed, crashed, timed out and interrupted ones). Needs the GPU (TK_ERR_NO_DEVICE);
 * no kernel runs. *out is the caller's (tk_free). */
TK_API int tk_selftest_results_json(char **out, tk_ctx *ctx, const char *ref, int device);

/* Every recorded result, for any GPU, as a JSON array (no GPU needed): [{"package" ("org/name"),
 * "commit" (null: a directory), "kernel", "op", "status", "binary_key", "gpu_uuid", "gpu_name", "driver",
 * "tk_version", "tested" (unix seconds), "seconds", "detail"}]; package "org/name" (NULL: all) narrows it.
 * A record left "running" by a process that has ended reads "interrupted". *out is the caller's. */
TK_API int tk_selftest_records_json(char **out, tk_ctx *ctx, const char *package);

/* Forgets the recorded results of ref (an installed package or a directory; NULL: every record), so its
 * kernels count as never tested. *removed (may be NULL) receives how many were removed. */
TK_API int tk_selftest_forget(tk_ctx *ctx, const char *ref, int64_t *removed);

/* ---------------------------------------------------------------------------------------------- */
/* Ops                                                                                             */

/* Runs an op (see `tk ops`: tk's own, or one an installed package declares) on tensors: validates
 * shapes and dtypes, picks the best implementation for the tensors' device and runs it: for CUDA
 * tensors a kernel from an installed package; for host tensors the fastest CPU implementation that
 * this CPU can run and that fits the call ("cpu-avx2", "cpu-portable": docs/cpu.md), else the op's CPU
 * reference (TK_CPU_IMPL=reference forces the references); an op a package declares has no CPU
 * implementation. *impl (may be NULL) receives a borrowed description of what ran ("cpu-avx2",
 * "cpu-reference" or "org/name:kernel"), valid until tk_ctx_free(ctx). Host ops use up to
 * tk_ctx_set_threads threads. Kernels whose recorded self-test failed on this GPU are left out (see
 * "Self-tests" above; a warning names each once); when every kernel that fits is, the CPU reference
 * runs on host copies if config "cpu_fallback" is true (*impl "cpu-reference (fallback)"), else the
 * call fails with TK_ERR_SELFTEST. Errors: TK_ERR_NOT_FOUND (unknown op), TK_ERR_INVALID (the message
 * names the argument and the shape it got), TK_ERR_UNSUPPORTED, TK_ERR_SELFTEST. */
TK_API int tk_op_run(tk_ctx *ctx, const char *op, const tk_arg *args, size_t nargs, void *stream, const char **impl);
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
/* Noise schedules (denoising diffusion)                                                          */

/* The tables and timesteps of DDPM and DDIM sampling, as diffusers' DDPMScheduler and DDIMScheduler
 * compute them, in float64. The per-element math is ops (`tk ops`, docs/diffusion.md): q_sample,
 * ddpm_posterior, ddpm_step, ddim_step and randn, which take alphas_cumprod as an f64 tensor [n] and
 * the timesteps as i64 tensors [b]. Both calls are pure functions of their arguments: any thread, no
 * context.
 *
 *     tk_noise_schedule_opts so = TK_NOISE_SCHEDULE_OPTS_INIT;  // linear, 1000 steps, 1e-4 to 0.02
 *     so.beta_schedule = "squaredcos_cap_v2";
 *     double ab[1000];
 *     tk_noise_schedule(NULL, ab, &so);                           // alphas_cumprod
 *     tk_diffusion_timesteps_opts to = TK_DIFFUSION_TIMESTEPS_OPTS_INIT;
 *     to.scheduler = "ddim";
 *     to.timestep_spacing = "trailing";
 *     int64_t ts[50], prev[50];
 *     tk_diffusion_timesteps(ts, prev, 50, &to);
 *     for (int i = 0; i < 50; i++) { model(x, ts[i]) -> eps; tk_op_run(ctx, "ddim_step", ...); }
 */
#define TK_NOISE_SCHEDULE_OPTS_VERSION 1
typedef struct {
    unsigned version;            /* TK_NOISE_SCHEDULE_OPTS_VERSION */
    const char *beta_schedule;   /* NULL or "linear" (default), "scaled_linear", "squaredcos_cap_v2" (or
                                    "cosine": Nichol & Dhariwal), "sqrt" (Diffusion-LM: alpha_bar(t) =
                                    1 - sqrt(t + 1e-4)), "sigmoid", "laplace"; diffusers' names and math */
    int64_t num_train_timesteps; /* n, 1000 */
    double beta_start;           /* 0.0001: linear, scaled_linear, sigmoid */
    double beta_end;             /* 0.02 */
    double max_beta;             /* 0.999: the cap of the alpha_bar schedules (cosine, sqrt, laplace) */
    int rescale_betas_zero_snr;  /* 1: rescale to zero terminal SNR (Lin et al. 2023), as diffusers */
    const double *trained_betas; /* non-NULL: these n betas, beta_schedule ignored */
} tk_noise_schedule_opts;
#define TK_NOISE_SCHEDULE_OPTS_INIT {TK_NOISE_SCHEDULE_OPTS_VERSION, NULL, 1000, 0.0001, 0.02, 0.999, 0, NULL}

/* Computes the schedule of opts (NULL: the defaults) into betas and alphas_cumprod (the cumulative
 * product of 1 - beta), each num_train_timesteps doubles owned by the caller; either may be NULL.
 * Writes nothing on failure. Errors: TK_ERR_INVALID (an unknown schedule, a bad size or value, a beta
 * outside [0, 1]: the message names it), TK_ERR_NOMEM. */
TK_API int tk_noise_schedule(double *betas, double *alphas_cumprod, const tk_noise_schedule_opts *opts);

#define TK_DIFFUSION_TIMESTEPS_OPTS_VERSION 1
typedef struct {
    unsigned version;             /* TK_DIFFUSION_TIMESTEPS_OPTS_VERSION */
    int64_t num_train_timesteps;  /* 1000 */
    const char *timestep_spacing; /* NULL or "leading" (default), "trailing", "linspace" (diffusers') */
    int64_t steps_offset;         /* 0: added to the leading timesteps */
    const char *scheduler;        /* NULL or "ddpm": prev is the next timestep of the list, -1 after the
                                     last (DDPMScheduler); "ddim": prev = t - num_train_timesteps / steps
                                     (DDIMScheduler.step) */
    int set_alpha_to_one;         /* 1 (default): a negative prev stays (alphas_cumprod_prev = 1); 0: it
                                     becomes 0 (alphas_cumprod[0], DDIM's set_alpha_to_one=False) */
} tk_diffusion_timesteps_opts;
#define TK_DIFFUSION_TIMESTEPS_OPTS_INIT {TK_DIFFUSION_TIMESTEPS_OPTS_VERSION, 1000, NULL, 0, NULL, 1}

/* The `steps` timesteps of a sampling run, first (noisiest) to last, into timesteps[steps], and the
 * timestep each step goes to into prev_timesteps[steps] (may be NULL): what set_timesteps and step of
 * diffusers compute. Where numpy's arange gives diffusers one timestep more than asked (trailing
 * spacing, e.g. 1000 / 61 steps: an extra -1 at the end), tk writes the `steps` asked for, the same
 * first ones. Errors: TK_ERR_INVALID (steps outside [1, num_train_timesteps], an unknown spacing or
 * scheduler, a timestep that would fall outside [0, num_train_timesteps)). */
TK_API int tk_diffusion_timesteps(int64_t *timesteps, int64_t *prev_timesteps, int64_t steps,
                                  const tk_diffusion_timesteps_opts *opts);

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

#define TK_MODEL_OPTS_VERSION 3
typedef struct {
    unsigned version;  /* TK_MODEL_OPTS_VERSION (1: the fields up to dtype) */
    int device_type;   /* TK_DEV_CPU (default: the ops' CPU references) or TK_DEV_CUDA */
    int device_id;     /* the CUDA device ordinal */
    const char *dtype; /* compute dtype: "f32", "bf16" or "f16"; "auto": the checkpoint's own (config.json's
                          torch_dtype: no conversion, weights read in place); NULL: "f32" on the CPU,
                          "bf16" on a GPU (its attention kernels take bf16 and f16, head sizes 64, 128,
                          256) */
    /* Version 2: tensor parallelism (docs/parallel.md). With a communicator (tk_comm_new, below) of N > 1
     * ranks, every rank calls tk_model_load with its own communicator and the same dir and options, and
     * the model is split by the checkpoint's tensor-parallel plan: each rank reads only its slices of the
     * weights (its attention heads and kv heads, its part of the MLP width and of the vocabulary) and
     * holds only its heads' KV cache. Every later call on the model (tk_model_forward, tk_generate, ...)
     * is collective: all ranks make it, in the same order, with the same arguments, and all get the
     * whole result (the full logits rows, the same generated tokens). The Llama family
     * (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM) and GPT2LMHeadModel (with a plan file:
     * transformers has none for it) on the CPU, for now. The load itself is
     * collective: when any rank fails, every rank fails (the others with the failing rank's status and
     * a message naming that rank). The model borrows comm: free the model before it.
     * One rank (or NULL): an ordinary model; the plan is still checked when tp_plan is given. */
    struct tk_comm *comm;
    const char *tp_plan; /* a JSON plan file (transformers' tp_plan format), or NULL: config.json's
                            "base_model_tp_plan", else transformers' default plan for the model type */
    /* Version 3. On the CPU a weight the checkpoint stores in the compute dtype is copied, at load, into
     * memory backed by 2 MiB transparent huge pages (0, the default: decode reads every weight once a
     * token, and through the file's 4 KiB pages the TLB misses cost ~10% of it), or, with 1, read where
     * the file is mapped: no copy, the pages shared with other processes through the page cache and
     * dropped rather than swapped under memory pressure. TK_MAP_WEIGHTS=1 in the environment sets 1. */
    int map_weights;
} tk_model_opts;
#define TK_MODEL_OPTS_INIT {TK_MODEL_OPTS_VERSION, TK_DEV_CPU, 0, NULL, NULL, NULL, 0}

/* Loads the checkpoint in directory `dir`: reads config.json (and generation_config.json), maps the
 * safetensors files (sharded ones through model.safetensors.index.json), validates every header, and
 * looks each weight up by its Hugging Face name. On the CPU weights whose dtype is the compute dtype are
 * copied into huge pages (or stay mapped: map_weights), others are converted once; on a GPU they are
 * uploaded once. ctx must outlive the model. Errors: TK_ERR_NOT_FOUND (no config.json or no weights),
 * TK_ERR_INVALID (a malformed file, a missing tensor, a shape or dtype that disagrees with the config:
 * the message names it),
 * TK_ERR_UNSUPPORTED (an architecture or config value tk does not implement: the message names it and
 * lists what is supported), TK_ERR_NO_DEVICE, TK_ERR_NOMEM, TK_ERR_IO. */
TK_API int tk_model_load(tk_model **out, tk_ctx *ctx, const char *dir, const tk_model_opts *opts);
TK_API void tk_model_free(tk_model *m);

/* Borrowed facts about a loaded model. */
TK_API const char *tk_model_arch(const tk_model *m);     /* config's architectures[0] */
TK_API int64_t tk_model_vocab_size(const tk_model *m);   /* columns of a logits row */
TK_API int64_t tk_model_hidden_size(const tk_model *m);  /* columns of a hidden-state row */
TK_API int tk_model_has_lm_head(const tk_model *m);      /* 0 for BertModel: no logits */
/* The model as JSON: architecture, family, sizes, parameters, dtypes, device, weight memory (a split
 * model: this rank's, and "tensor_parallel": {"rank", "world", "plan", "heads", "kv_heads",
 * "intermediate_size", "vocab_offset", "vocab_rows", "embedding_split", "lm_head_split",
 * "unsplit_weight_bytes"}). */
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
/* Training                                                                                        */

/* Fine-tuning a loaded model (Llama family, GPT-2, BertForMaskedLM) with AdamW, as PyTorch does it:
 * every layer's backward runs through tk_op_run, so it runs on the CPU references or on the GPU
 * kernels of installed packages. See docs/training.md.
 *
 *     tk_train_opts o = TK_TRAIN_OPTS_INIT;          // AdamW lr 1e-4, wd 0.01, clip 1.0
 *     tk_trainer *t = NULL;
 *     if (tk_train_new(&t, model, &o) != TK_OK) { ... tk_last_error() ... }
 *     for (step = 0; step < n; step++) {
 *         tk_train_accumulate(t, ids, targets, lens, nseq, &loss);  // once per micro-batch
 *         tk_train_step(t, &stats);                                 // clip, AdamW, zero the grads
 *     }
 *     tk_train_save(t, "out/checkpoint-100", NULL);                 // HF checkpoint + optimiser state
 *     tk_train_free(t);
 *
 * The loss is the mean cross-entropy over every non-ignored target accumulated since the last step
 * (token-weighted: accumulating k micro-batches is one batch of all their tokens), of the LM head's
 * logits: causal LMs predict targets[i] from ids[..i] (pass the ids shifted by one, the last target
 * ignore_index), BertForMaskedLM the masked positions. Dropout is not applied. Training needs f32
 * weights (tk_model_opts.dtype "f32", the default on the CPU): they are the master weights AdamW
 * updates in place. A trainer borrows the model: free the trainer first; it is used from one thread. */
typedef struct tk_trainer tk_trainer;

#define TK_TRAIN_OPTS_VERSION 2
typedef struct {
    unsigned version;       /* TK_TRAIN_OPTS_VERSION (1: the fields up to label_smoothing) */
    double lr;              /* peak learning rate; default 1e-4 */
    double beta1, beta2;    /* AdamW's betas; default 0.9, 0.999 */
    double eps;             /* default 1e-8 */
    double weight_decay;    /* decoupled, as torch.optim.AdamW; default 0.01 */
    int decay_all;          /* 0: norms, biases and embeddings get no weight decay (a second group); 1: all do */
    double max_grad_norm;   /* clip_grad_norm_ over every gradient; <= 0: no clipping; default 1.0 */
    int64_t warmup_steps;   /* linear warmup from 0 over these optimiser steps (transformers' schedule) */
    int64_t total_steps;    /* > 0: cosine decay from lr to min_lr_ratio * lr at this step; 0: constant */
    double min_lr_ratio;    /* default 0 */
    int checkpointing;      /* 1: per-layer activation checkpointing (keep layer inputs, recompute in backward) */
    int fused_loss;         /* 1: fused_linear_cross_entropy, never the [tokens, vocab] logits; 0: logits,
                               then cross_entropy (tk_train_logits can read them); -1 (default): fused on
                               a GPU, logits on the CPU (faster there, T x V x 8 bytes more memory) */
    int64_t ignore_index;   /* targets equal to it add nothing; default -100 */
    double label_smoothing; /* in [0, 1), as F.cross_entropy; default 0 */
    /* Version 2: data parallelism (docs/training.md, docs/parallel.md). With a communicator (tk_comm_new)
     * of N > 1 ranks, every rank makes a trainer over its own copy of the same model with the same
     * options, feeds its own micro-batches, and calls tk_train_step collectively (all ranks, the same
     * number of times): the step sums the token counts, the losses and every gradient over the ranks
     * (one tk_comm_all_reduce_sum per bucket of up to 4 MiB of gradients, after the backward, not
     * overlapped with it) before clipping and AdamW, so the update is the one a single process makes
     * over all the ranks' micro-batches as one batch (the loss the mean over all their targets), every
     * rank applies it, and the weights stay identical. The stats are the global ones.
     * tk_train_accumulate, tk_train_eval and tk_train_tensor_get's gradient stay this rank's own.
     * A failed all-reduce fails the step (TK_ERR_NETWORK: end the job with tk_comm_abort). Buffers are
     * host memory on the CPU; a GPU model needs the NCCL backend (per tensor, unverified on hardware).
     * The trainer borrows comm: free the trainer before it. NULL or one rank: training as version 1. */
    struct tk_comm *comm;
} tk_train_opts;
#define TK_TRAIN_OPTS_INIT                                                                                             \
    {TK_TRAIN_OPTS_VERSION, 1e-4, 0.9, 0.999, 1e-8, 0.01, 0, 1.0, 0, 0, 0.0, 0, -1, -100, 0.0, NULL}

/* What an optimiser step did (data parallel: over every rank's tokens). */
typedef struct {
    int64_t step;      /* optimiser steps taken, this one included */
    double loss;       /* the mean loss over the step's tokens */
    double lr;         /* the learning rate it used */
    double grad_norm;  /* the global L2 norm of the gradients before clipping (clip_grad_norm_'s return) */
    int64_t tokens;    /* the non-ignored targets it averaged over */
} tk_train_stats;

/* Starts training `model`: makes its weights writable f32 master copies (mapped weights are copied),
 * allocates a gradient and AdamW's two moments per weight (zeros). Errors: TK_ERR_INVALID (opts out of
 * range, named), TK_ERR_UNSUPPORTED (a family tk cannot train, BertModel without its MLM head, a
 * compute dtype other than f32, weight-only quantisation on), TK_ERR_NOMEM. */
TK_API int tk_train_new(tk_trainer **out, tk_model *model, const tk_train_opts *opts);
TK_API void tk_train_free(tk_trainer *t);
/* One micro-batch: nseq sequences concatenated in ids (sequence s has lens[s] tokens), one target per
 * token (targets[i] in [0, vocab) or ignore_index). Runs the forward and the backward and adds the
 * gradients to those accumulated since the last step. *loss (may be NULL) receives this micro-batch's
 * mean loss (0 when every target is ignored). Errors: TK_ERR_INVALID (an id or target out of range; a
 * NaN or infinite loss: the message names the first tensor that went non-finite), TK_ERR_NOMEM (the
 * activations do not fit: fewer tokens per micro-batch, or checkpointing), those of tk_op_run. */
TK_API int tk_train_accumulate(tk_trainer *t, const int32_t *ids, const int64_t *targets, const size_t *lens,
                               size_t nseq, double *loss);
/* The optimiser step over what was accumulated: global-norm clipping, AdamW with the scheduled lr, then
 * the gradients are zeroed. st (may be NULL) receives what it did. Errors: TK_ERR_INVALID (nothing
 * accumulated, every target ignored, or a non-finite gradient: the message names the tensor). */
TK_API int tk_train_step(tk_trainer *t, tk_train_stats *st);
/* The loss of a batch without training on it (held-out data): *loss_sum over *tokens targets (either
 * may be NULL). The gradients accumulated so far are kept. Errors: those of tk_train_accumulate. */
TK_API int tk_train_eval(tk_trainer *t, const int32_t *ids, const int64_t *targets, const size_t *lens, size_t nseq,
                         double *loss_sum, int64_t *tokens);
/* The logits of the last accumulate or eval (sum(lens) x vocab floats), when the loss was not fused.
 * Errors: TK_ERR_INVALID (the fused loss, or no batch yet). */
TK_API int tk_train_logits(tk_trainer *t, float *out);
/* Optimiser steps taken (after a resume: the saved count). */
TK_API int64_t tk_train_step_count(const tk_trainer *t);

/* The trained tensors by their Hugging Face names, in the checkpoint's layout (gate_proj and up_proj
 * apart, GPT-2's c_attn whole; a tied LM head under the embedding's name): index i of
 * tk_train_tensor_count(t). *numel (may be NULL) receives its element count. NULL past the end. */
TK_API size_t tk_train_tensor_count(const tk_trainer *t);
TK_API const char *tk_train_tensor_name(const tk_trainer *t, size_t i, int64_t *numel);
enum { TK_TRAIN_PARAM = 0, TK_TRAIN_GRAD = 1, TK_TRAIN_EXP_AVG = 2, TK_TRAIN_EXP_AVG_SQ = 3 };
/* Copies tensor `name`'s parameter, gradient (of the mean loss over the tokens accumulated since the
 * last step), or AdamW moment as n f32 values into out. Errors: TK_ERR_NOT_FOUND (no such tensor),
 * TK_ERR_INVALID (n is not its element count). */
TK_API int tk_train_tensor_get(tk_trainer *t, const char *name, int what, float *out, size_t n);
/* Memory and state as JSON (tk_free): {"step", "parameters", "param_bytes", "grad_bytes",
 * "optimizer_bytes", "activation_bytes" (the planned activations of the last batch shape),
 * "checkpointing", "fused_loss"}. */
TK_API int tk_train_info_json(char **out, const tk_trainer *t);

/* Writes directory `dir` (which must not exist) atomically: a Hugging Face checkpoint that
 * transformers' from_pretrained loads (model.safetensors in f32, config.json, and the model
 * directory's tokenizer and other files), plus the training state (optimizer.safetensors: exp_avg.NAME
 * and exp_avg_sq.NAME; trainer_state.json: the step, the options, and `extra_json` (may be NULL) under
 * "extra"). Everything is written to a temporary sibling, synced, and renamed into place, so a crash or
 * kill leaves either no `dir` or a whole one. Errors: TK_ERR_INVALID (dir exists, extra_json is not
 * JSON), TK_ERR_IO, TK_ERR_NOSPACE (the temporary is removed). */
TK_API int tk_train_save(tk_trainer *t, const char *dir, const char *extra_json);
/* Restores the optimiser state and step saved in `dir` by tk_train_save into t, which was made over
 * the model loaded from the same directory; *extra_json (may be NULL) receives the saved "extra"
 * (tk_free; NULL when none). On the CPU the run then continues bit for bit as if never interrupted.
 * Errors: TK_ERR_NOT_FOUND (no trainer_state.json or optimizer.safetensors), TK_ERR_INVALID (a
 * malformed file, or a tensor missing or of another shape: named). */
TK_API int tk_train_resume(tk_trainer *t, const char *dir, char **extra_json);

/* ---------------------------------------------------------------------------------------------- */
/* Registry server (tk serve)                                                                      */

/* A running registry server: it serves a static registry tree (the layout `tk publish --to` writes)
 * with the Hugging Face Hub's read API, accepts authenticated uploads of signed versions, and renders
 * a browsable HTML page at "/". Its own state (upload tokens, trusted publisher keys) lives in
 * <root>/.tk-serve/, which is never served.
 *
 * The server's functions (tk_server_*, tk_serve_*) are declared here but are NOT in libtkhub: they
 * live in libtkhub-serve (libtkhub plus the server and libmicrohttpd). Link it instead of libtkhub
 * (`pkg-config --libs tkhub-serve`, or CMake's tkhub::serve), never both; in the source tree only
 * the `tk` command links them. */
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
/* Model server (tk serve-model)                                                                   */

/* An OpenAI-compatible HTTP server over one checkpoint: POST /v1/chat/completions and /v1/completions
 * (streamed as Server-Sent Events or not), GET /v1/models, /health, /metrics (Prometheus, when
 * opts.metrics), POST /tokenize and /detokenize. One scheduler thread runs the model with continuous
 * batching (tk_gen_batch): requests join the running batch at the next step, up to opts.parallel
 * sequences, the rest wait in a bounded queue (then 429). See docs/serving.md for every endpoint,
 * parameter, error and metric. Like the registry server it lives in libtkhub-serve, not libtkhub.
 *
 *     tk_model_server_opts o = TK_MODEL_SERVER_OPTS_INIT;
 *     o.model_dir = "path/to/checkpoint";
 *     tk_model_server *s = NULL;
 *     if (tk_model_server_new(&s, ctx, &o) != TK_OK) { ... }
 *     printf("http://127.0.0.1:%d\n", tk_model_server_port(s));
 *     int rc = tk_model_server_run(s);     // until tk_model_server_stop (e.g. from a signal handler)
 *     tk_model_server_free(s);
 */
typedef struct tk_model_server tk_model_server;

#define TK_MODEL_SERVER_OPTS_VERSION 2
typedef struct {
    unsigned version;          /* TK_MODEL_SERVER_OPTS_VERSION */
    const char *model_dir;     /* the checkpoint directory; required */
    const char *model_name;    /* the id clients name in "model" and /v1/models; NULL: the directory's name */
    const char *listen;        /* "HOST:PORT"; NULL: "127.0.0.1:0" (port 0: a free port, tk_model_server_port) */
    int device_type;           /* TK_DEV_CPU (default) or TK_DEV_CUDA */
    int device_id;
    const char *dtype;         /* the model's compute dtype (tk_model_opts.dtype); NULL: its default */
    const char *kv_dtype;      /* the KV cache's (tk_gen_opts.kv_dtype); NULL: the compute dtype */
    unsigned parallel;         /* sequences decoded at once (a request with n choices takes n); 0: 4 */
    unsigned max_queue;        /* requests waiting for a slot; past it 429; 0: 64 */
    int64_t ctx_size;          /* prompt + completion tokens of one sequence; 0: the model's positions */
    const char *api_key;       /* requests must send "Authorization: Bearer KEY" (/health excepted); NULL: none */
    int metrics;               /* 1: serve GET /metrics */
    unsigned threads;          /* HTTP threads; 0: 4 */
    unsigned max_connections;  /* open connections; 0: 1024 */
    unsigned timeout_s;        /* a connection idle that long, or still sending its request after it, is
                                  closed (slowloris); 0: 30 */
    int64_t max_body;          /* bytes of a request body; larger gets 413; 0: 4 MiB */
    int64_t max_step_tokens;   /* prompt tokens one step prefills (chunked prefill); 0: 512 */
    unsigned drain_s;          /* on stop, running requests get this long to finish; 0: 30 */
    int prefix_cache;          /* 1 (default): reuse the KV blocks of earlier prompts' prefixes */
    tk_log_fn log;             /* one TK_LOG_INFO line per request, TK_LOG_WARN for trouble; called from
                                  the server's threads concurrently. NULL: nothing is logged */
    void *log_user;
    /* version 2: tensor parallelism (docs/parallel.md). comm (a tk_comm of several ranks; NULL: one
       process): this process is rank 0 and serves; every other rank runs tk_model_server_follow with
       the same options and its own communicator. Used by the scheduler thread only: the caller must not
       use it until tk_model_server_free. tp_plan: the plan file (tk_model_opts.tp_plan) */
    struct tk_comm *comm;
    const char *tp_plan;
} tk_model_server_opts;
#define TK_MODEL_SERVER_OPTS_INIT                                                                                      \
    {TK_MODEL_SERVER_OPTS_VERSION,                                                                                     \
     NULL,                                                                                                             \
     NULL,                                                                                                             \
     NULL,                                                                                                             \
     TK_DEV_CPU,                                                                                                       \
     0,                                                                                                                \
     NULL,                                                                                                             \
     NULL,                                                                                                             \
     0,                                                                                                                \
     0,                                                                                                                \
     0,                                                                                                                \
     NULL,                                                                                                             \
     0,                                                                                                                \
     0,                                                                                                                \
     0,                                                                                                                \
     0,                                                                                                                \
     0,                                                                                                                \
     0,                                                                                                                \
     0,                                                                                                                \
     1,                                                                                                                \
     NULL,                                                                                                             \
     NULL,                                                                                                             \
     NULL,                                                                                                             \
     NULL}

/* Binds the listen address and starts serving at once: the model loads in the background (GET /health
 * answers 503 until it is ready, and generation requests 503 too). ctx runs the model's ops and is used
 * by the server's scheduler thread only until tk_model_server_free; it must outlive the server. The
 * calling process should block SIGPIPE (the server's threads inherit the caller's signal mask).
 * Errors: TK_ERR_INVALID (bad options or listen address), TK_ERR_NOT_FOUND (no such directory),
 * TK_ERR_IO (the address cannot be bound), TK_ERR_NOMEM. */
TK_API int tk_model_server_new(tk_model_server **out, tk_ctx *ctx, const tk_model_server_opts *opts);
/* The TCP port it listens on. */
TK_API int tk_model_server_port(const tk_model_server *s);
/* Serves until tk_model_server_stop, then drains: new connections and requests are refused, queued ones
 * answered 503, running ones get opts.drain_s seconds to finish (then they end, with finish_reason
 * "length" on a stream and 503 otherwise), and returns. Returns TK_OK, or the model's load error
 * (message in tk_last_error()) if it never loaded. Call it from one thread. */
TK_API int tk_model_server_run(tk_model_server *s);
/* Asks tk_model_server_run to drain and return. Safe from any thread and from a signal handler. */
TK_API void tk_model_server_stop(tk_model_server *s);
/* Frees a server whose run returned (or that never ran). Accepts NULL. */
TK_API void tk_model_server_free(tk_model_server *s);
/* Tensor parallelism: the part of ranks 1..N-1 of a server whose rank 0 runs tk_model_server_new with
 * opts.comm. Loads the model with opts->comm (collective, as tk_model_load), then replays, step by
 * step, what rank 0's scheduler does to its batch (the requests' prompts and options, cancellations,
 * steps) as rank 0 broadcasts it, so every rank runs the same forward. Serves no HTTP, binds nothing
 * (opts->listen is ignored). Returns TK_OK once rank 0 stopped; an error when the model did not load
 * or a collective failed or timed out (TK_ERR_NETWORK: rank 0 is gone or hung; end the job with
 * tk_comm_abort). Blocks the calling thread. */
TK_API int tk_model_server_follow(tk_ctx *ctx, const tk_model_server_opts *opts);

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
TK_API int tk_tokenizer_encode(int32_t **ids, size_t *n, const tk_tokenizer *tok, const char *text, size_t len,
                               int add_special);
/* Decodes ids to UTF-8 as tokenizers' decode(ids, skip_special_tokens=skip_special).
 * *text is owned by the caller (tk_free). Errors: TK_ERR_INVALID (an id outside the vocabulary). */
TK_API int tk_tokenizer_decode(char **text, const tk_tokenizer *tok, const int32_t *ids, size_t n, int skip_special);
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

#define TK_GEN_OPTS_VERSION 2
typedef struct {
    unsigned version;             /* TK_GEN_OPTS_VERSION */
    int64_t max_new_tokens;       /* tokens to generate at most (> 0); -1: max_length - prompt length */
    int64_t max_length;           /* prompt + new tokens, when max_new_tokens is -1; 0 (default): neither
                                     set, so 20 new tokens within the model's context (transformers 5) */
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
    /* version 2 */
    double presence_penalty;      /* OpenAI's: s[t] -= presence_penalty for every token t generated so far
                                     (the prompt excluded), after repetition_penalty; in [-2, 2]; 0: off */
    double frequency_penalty;     /* and s[t] -= frequency_penalty x (times t was generated); 0: off */
    int logprobs;                 /* 1 reports each chosen token's log-probability (tk_gen_event.logprob;
                                     tk_generate: tk_gen_result_logprobs; not with beam search) */
    int top_logprobs;             /* and the most likely 0..TK_GEN_MAX_TOP_LOGPROBS tokens' (> 0 implies
                                     logprobs; tk_generate: tk_gen_result_top_logprobs) */
} tk_gen_opts;
#define TK_GEN_OPTS_INIT                                                                                               \
    {TK_GEN_OPTS_VERSION,                                                                                              \
     -1,                                                                                                               \
     0,                                                                                                                \
     0,                                                                                                                \
     1.0,                                                                                                              \
     50,                                                                                                               \
     1.0,                                                                                                              \
     0.0,                                                                                                              \
     1.0,                                                                                                              \
     0,                                                                                                                \
     1,                                                                                                                \
     1.0,                                                                                                              \
     TK_GEN_EARLY_HEURISTIC,                                                                                           \
     {0},                                                                                                              \
     0,                                                                                                                \
     -1,                                                                                                               \
     0,                                                                                                                \
     NULL,                                                                                                             \
     0,                                                                                                                \
     NULL,                                                                                                             \
     NULL,                                                                                                             \
     1,                                                                                                                \
     NULL,                                                                                                             \
     16,                                                                                                               \
     0,                                                                                                                \
     0.0,                                                                                                              \
     0.0,                                                                                                              \
     0,                                                                                                                \
     0}

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
 * the message names it), TK_ERR_UNSUPPORTED (sampling or logprobs with beams; a stop string without a tokenizer),
 * TK_ERR_NOMEM (the KV cache would pass kv_max_bytes), and the model's and ops' errors. */
TK_API int tk_generate(tk_gen_result **out, tk_model *model, const int32_t *const *prompts, const size_t *lens,
                       size_t np, const tk_gen_opts *opts);
TK_API void tk_gen_result_free(tk_gen_result *r);
TK_API size_t tk_gen_result_count(const tk_gen_result *r);
/* The new token ids of sequence i (eos included when it ended on one); borrowed. */
TK_API const int32_t *tk_gen_result_ids(const tk_gen_result *r, size_t i, size_t *n);
/* Their decoded text (special tokens skipped), or NULL when the model has no tokenizer; borrowed. */
TK_API const char *tk_gen_result_text(const tk_gen_result *r, size_t i);
/* Why sequence i ended: "length", "eos", "stop_string" or "callback". */
TK_API const char *tk_gen_result_end(const tk_gen_result *r, size_t i);
/* With opts.logprobs or opts.top_logprobs (greedy decoding and sampling): the log-probability of each
 * new token of sequence i under the model, one per tk_gen_result_ids entry (*n of them), as
 * tk_gen_event.logprob defines it (log_softmax of the raw logits, before penalties and temperature;
 * NaN and -inf as torch.log_softmax gives them, docs/parallel.md "Non-finite logits"); borrowed. NULL
 * (and *n 0) when they were not asked for or i is out of range. */
TK_API const float *tk_gen_result_logprobs(const tk_gen_result *r, size_t i, size_t *n);
/* With opts.top_logprobs > 0: the most likely tokens at new token j of sequence i, most likely first
 * (ties: the lower id), as tk_gen_event.top_ids and top_logprobs: returns how many (up to
 * opts.top_logprobs; fewer when fewer are not NaN) and points *ids and *logprobs (either may be NULL) at
 * them, borrowed. 0 with NULLs when they were not asked for or i or j is out of range. */
TK_API size_t tk_gen_result_top_logprobs(const tk_gen_result *r, size_t i, size_t j, const int32_t **ids,
                                         const float **logprobs);
/* Measurements of the call, as JSON: {"prefill_ms", "decode_ms", "prefill_tokens", "decode_tokens",
 * "steps", "decode_tokens_per_s", "kv_cache", "kv_bytes", "kv_peak_bytes", "kv_blocks", "kv_block_size",
 * "kv_dtype"}. decode_* time the tokens after each sequence's first (which the prefill gives);
 * kv_bytes is what the cache allocated, kv_peak_bytes what its sequences held at most. *json is the
 * caller's (tk_free). */
TK_API int tk_gen_result_stats_json(char **json, const tk_gen_result *r);

/* Step-wise generation for servers (continuous batching): sequences join and leave a running batch
 * between steps; each step runs the model once over every active sequence: the next prompt chunk of
 * each new one (chunked prefill, so a long prompt does not stall the others) and one token of each
 * decoding one. tk_generate runs greedy decoding and sampling through it, so both give the same tokens.
 * Each sequence has its own options (sampling, penalties, eos ids, stop strings, max_new_tokens) and its
 * own sampler stream (Philox at its seed, counter = its token index), so what it generates does not
 * depend on the other sequences or on its slot; greedy results equal the prompt run alone up to the f32
 * rounding of the batched matrix products (docs/serving.md, "Determinism"). Full KV blocks of prompts
 * can be kept in a prefix cache and shared by later prompts that start with the same tokens.
 *
 *     tk_gen_batch *b = NULL;
 *     tk_gen_batch_new(&b, model, NULL);
 *     int64_t id;
 *     tk_gen_batch_add(&id, b, ids, n, 1, &o);       // o: tk_gen_opts as for tk_generate
 *     while (tk_gen_batch_active(b)) {
 *         const tk_gen_event *ev; size_t nev;
 *         if (tk_gen_batch_step(b, &ev, &nev) != TK_OK) break;
 *         for (size_t i = 0; i < nev; i++) fwrite(ev[i].text, 1, ev[i].len, stdout);
 *     }
 *     tk_gen_batch_free(b);
 *
 * A tk_gen_batch is used from one thread at a time, and its model must not run anything else meanwhile. */
typedef struct tk_gen_batch tk_gen_batch;

#define TK_GEN_MAX_TOP_LOGPROBS 20

#define TK_GEN_BATCH_OPTS_VERSION 1
typedef struct {
    unsigned version;         /* TK_GEN_BATCH_OPTS_VERSION */
    const char *kv_dtype;     /* NULL: the model's dtype; or "i8", "fp8_e4m3" (as tk_gen_opts.kv_dtype) */
    int64_t kv_block_size;    /* tokens per KV block: a power of two, 8 to 256; default 16 */
    int64_t kv_max_bytes;     /* the KV pool's bound (grown by doubling up to it); 0: none. Past it a
                                 step fails with TK_ERR_NOMEM, after evicting the prefix cache */
    int64_t max_step_tokens;  /* prompt tokens one step prefills, over all new sequences; longer prompts
                                 are prefilled in chunks over several steps; 0: each prompt in one step */
    int prefix_cache;         /* 1: keep the full KV blocks of prompts (and of ended sequences) for later
                                 prompts that start with the same tokens; evicted oldest first */
    int use_cache;            /* 1 (default): paged KV cache; 0: recompute every step (the reference) */
    int64_t kv_max_tokens;    /* bounds the pool to this many tokens' blocks too (rounded up); 0: none */
} tk_gen_batch_opts;
#define TK_GEN_BATCH_OPTS_INIT {TK_GEN_BATCH_OPTS_VERSION, NULL, 16, 0, 0, 0, 1, 0}

/* What one step did for one sequence: the token it chose and the text that token completes. */
typedef struct {
    int64_t seq;              /* the sequence's id (tk_gen_batch_add) */
    int32_t token;            /* the chosen token */
    float logprob;            /* with opts.logprobs: its log-probability under the model (log_softmax of
                                 the raw logits, before penalties and temperature); else 0 */
    int ntop;                 /* with opts.top_logprobs: the most likely tokens, most likely first */
    int32_t top_ids[TK_GEN_MAX_TOP_LOGPROBS];
    float top_logprobs[TK_GEN_MAX_TOP_LOGPROBS];
    const char *text;         /* the new text (len bytes, not NUL-terminated, never ending inside a UTF-8
                                 character; the pieces of a sequence concatenate to its decoded text);
                                 borrowed until the next tk_gen_batch_* call */
    size_t len;
    const char *end;          /* NULL while the sequence goes on; else why it ended and left the batch:
                                 "length", "eos" or "stop_string" (the text contains opts' stop string
                                 number stop_index) */
    int stop_index;
    int64_t prompt_tokens;    /* the sequence's prompt length */
    int64_t cached_tokens;    /* prompt tokens whose KV came from the prefix cache */
} tk_gen_event;

/* Counters of a batch (tk_gen_batch_stats). KV blocks: total is the pool's bound (its allocated size
 * when unbounded), used those held by sequences, cached those held only by the prefix cache (reclaimed
 * when needed), free = total - used. */
typedef struct {
    int64_t active, prefilling;
    int64_t kv_block_size, kv_blocks_total, kv_blocks_used, kv_blocks_cached, kv_blocks_free;
    int64_t prompt_tokens, cached_tokens, generated_tokens, steps;
} tk_gen_batch_stats;

/* A new empty batch over a loaded causal LM (opts NULL: the defaults). The model must outlive it.
 * Errors: TK_ERR_INVALID (no LM head, a bad option), TK_ERR_NOMEM. */
TK_API int tk_gen_batch_new(tk_gen_batch **out, tk_model *model, const tk_gen_batch_opts *opts);
TK_API void tk_gen_batch_free(tk_gen_batch *b);
/* Adds n >= 1 sequences that continue one prompt (len token ids, copied): *first receives the id of the
 * first, and the others are first + 1 ... first + n - 1. They share the prompt's prefill and KV blocks;
 * sequence i samples with seed o->seed + i. o as for tk_generate (num_beams 1; stream, use_cache and the
 * kv_* fields are ignored; stop strings are copied); it joins at the next step. Errors: those of
 * tk_generate's checks (TK_ERR_INVALID naming the option, the prompt's length against the context),
 * TK_ERR_UNSUPPORTED (num_beams > 1), TK_ERR_NOMEM. */
TK_API int tk_gen_batch_add(int64_t *first, tk_gen_batch *b, const int32_t *prompt, size_t len, size_t n,
                            const tk_gen_opts *o);
/* Runs one step. *events (borrowed until the next call) receives one event per token chosen; a
 * sequence that ended is gone from the batch (its KV blocks freed). A failure of one sequence (every
 * token removed by its processors, NaN logits) ends that sequence with end "error" and tk_last_error()
 * naming it, and the step still returns TK_OK; a model or KV failure fails the step, which leaves every
 * sequence as it was (TK_ERR_NOMEM when the pool is at its bound). */
TK_API int tk_gen_batch_step(tk_gen_batch *b, const tk_gen_event **events, size_t *nevents);
/* Removes a sequence now (a cancelled request) and frees its KV blocks. Errors: TK_ERR_NOT_FOUND. */
TK_API int tk_gen_batch_cancel(tk_gen_batch *b, int64_t seq);
/* Sequences in the batch (added and not ended). */
TK_API size_t tk_gen_batch_active(const tk_gen_batch *b);
TK_API int tk_gen_batch_stats_get(tk_gen_batch_stats *out, const tk_gen_batch *b);

/* ---------------------------------------------------------------------------------------------- */
/* Masked diffusion generation (LLaDA, Dream; docs/diffusion.md)                                   */

/* A masked diffusion LM predicts every masked position at once with bidirectional attention;
 * generation starts from gen_length mask tokens after the prompt and unmasks some of them each step.
 * tk_diffusion_generate runs LLaDA's published sampler (ML-GSAI/LLaDA generate.py: semi-autoregressive
 * blocks, Gumbel-max sampling in float64, low_confidence or random remasking, classifier-free
 * guidance) or Dream's (HKUNLP/Dream generation_utils.py: its timestep schedule, logits shifted by
 * one position, the origin / maskgit_plus / topk_margin / entropy algorithms), on LLaDAModelLM and
 * DreamModel checkpoints, or on any Llama-family checkpoint with bidirectional = 1.
 *
 *     tk_diff_opts o = TK_DIFF_OPTS_INIT;          // the checkpoint's sampler, 128 tokens, 128 steps
 *     o.gen_length = 64; o.block_length = 32; o.steps = 64;
 *     tk_diff_result *r = NULL;
 *     if (tk_diffusion_generate(&r, model, ids, n, &o) == TK_OK) puts(tk_diff_result_text(r));
 *     tk_diff_result_free(r);
 */
enum { TK_DIFF_AUTO = 0, TK_DIFF_LLADA = 1, TK_DIFF_DREAM = 2, TK_DIFF_BLOCK = 3 };

/* What one step did, for tk_diff_opts.on_step: the canvas (prompt + gen_length ids, mask_id where
 * still masked) after the step, and the canvas positions it unmasked. block_done: the step finished
 * block `block` (its ids are final). All pointers are borrowed for the call. */
typedef struct {
    int64_t step, steps;      /* this step (0-based) of how many in all */
    int64_t block, blocks;    /* the block it works on, of how many */
    const int32_t *canvas;
    size_t len, prompt_len;
    int32_t mask_id;          /* the id of a masked position */
    const int64_t *unmasked;  /* canvas positions */
    size_t n_unmasked;
    int block_done;
} tk_diff_step;
/* Return 0 to go on, nonzero to stop (the result then ends "callback"). */
typedef int (*tk_diff_step_fn)(void *user, const tk_diff_step *s);
/* Fills u[0..n) with uniform draws in [0, 1) (tk_diff_opts.rand): the sampler asks for them in the
 * order its reference consumes torch.rand (docs/diffusion.md), so a test can feed both the same. */
typedef int (*tk_diff_rand_fn)(void *user, double *u, size_t n);

/* TK_DIFF_BLOCK (DiffusionGemmaForBlockDiffusion, chosen by TK_DIFF_AUTO for it): block diffusion as
 * transformers' DiffusionGemmaGenerationMixin.generate runs it (docs/diffusion.md): ceil(gen_length /
 * canvas_length) blocks, each started from uniform random tokens and refined for up to `steps` steps
 * (0: generation_config.json's max_denoising_steps, else 48) under a linear temperature schedule from
 * t_max to t_min, accepting the lowest-entropy tokens within entropy_bound and renoising the rest,
 * stopping a block early when its argmax canvas is stable for stability_threshold steps and its mean
 * entropy is below confidence_threshold; after a block holding an eos token it stops (the tokens after
 * the first eos become pad_token_id). Draws (o->rand or the seed) per block: canvas_length for the
 * starting canvas; per step canvas_length for the sampled tokens (inverse CDF), then canvas_length for
 * the renoised ones. temperature, top_p, top_k, alg_temp, remasking, cfg_scale, alg and block_length
 * must be left at their defaults (TK_ERR_INVALID names them); eps and mask_token_id do not apply. The
 * fields below are read from version 2; < 0 means the checkpoint's generation_config.json value, else
 * transformers' default (shown). */
#define TK_DIFF_OPTS_VERSION 2
typedef struct {
    unsigned version;          /* TK_DIFF_OPTS_VERSION */
    int sampler;               /* TK_DIFF_AUTO (the checkpoint's; LLaDA's for a bidirectional Llama),
                                  TK_DIFF_LLADA, TK_DIFF_DREAM */
    int64_t gen_length;        /* masked positions after the prompt (> 0); default 128 */
    int64_t block_length;      /* LLaDA: tokens per semi-autoregressive block, dividing gen_length;
                                  0: gen_length (one block). Dream: 0 or gen_length */
    int64_t steps;             /* denoising steps in all: LLaDA splits them evenly over the blocks (a
                                  multiple of the block count); at most gen_length; 0: gen_length */
    double temperature;        /* 0: argmax (LLaDA's Gumbel noise off, Dream's greedy); > 0: sampling */
    int remasking;             /* LLaDA: 0 low_confidence (the chosen token's probability), 1 random */
    double cfg_scale;          /* LLaDA: classifier-free guidance (0: off); the unconditional pass has
                                  the prompt masked */
    const char *alg;           /* Dream: "origin" (default), "maskgit_plus", "topk_margin", "entropy" */
    double alg_temp;           /* Dream: 0 takes the most confident; > 0 samples positions from
                                  softmax(confidence / alg_temp) */
    double top_p;              /* Dream: nucleus filter in (0, 1]; 1: off */
    int64_t top_k;             /* Dream: keep the k most likely (0: off) */
    double eps;                /* Dream: the schedule's last time, default 1e-3 */
    int64_t mask_token_id;     /* -1: config.json's mask_token_id */
    int bidirectional;         /* 1: run a causal checkpoint's attention bidirectionally */
    uint64_t seed;             /* tk's generator (splitmix64) when rand is NULL */
    tk_diff_rand_fn rand;      /* NULL: tk's generator */
    void *rand_user;
    tk_diff_step_fn on_step;   /* NULL: none */
    void *step_user;
    double t_min, t_max;       /* block: the last and the first step's temperature (0.4, 0.8) */
    double entropy_bound;      /* block: the acceptance bound (0.1; > 0) */
    double confidence_threshold; /* block: the mean entropy that ends a block early (0.005; > 0) */
    int64_t stability_threshold; /* block: steps the argmax canvas must repeat to end early (1; 0: any) */
} tk_diff_opts;
#define TK_DIFF_OPTS_INIT                                                                                              \
    {TK_DIFF_OPTS_VERSION,                                                                                             \
     TK_DIFF_AUTO,                                                                                                     \
     128,                                                                                                              \
     0,                                                                                                                \
     0,                                                                                                                \
     0.0,                                                                                                              \
     0,                                                                                                                \
     0.0,                                                                                                              \
     NULL,                                                                                                             \
     0.0,                                                                                                              \
     1.0,                                                                                                              \
     0,                                                                                                                \
     1e-3,                                                                                                             \
     -1,                                                                                                               \
     0,                                                                                                                \
     0,                                                                                                                \
     NULL,                                                                                                             \
     NULL,                                                                                                             \
     NULL,                                                                                                             \
     NULL,                                                                                                             \
     -1.0,                                                                                                             \
     -1.0,                                                                                                             \
     -1.0,                                                                                                             \
     -1.0,                                                                                                             \
     -1}

typedef struct tk_diff_result tk_diff_result;

/* The sampler a checkpoint was trained for: TK_DIFF_LLADA, TK_DIFF_DREAM, TK_DIFF_BLOCK
 * (DiffusionGemma), or 0 (an autoregressive model: tk_generate). */
TK_API int tk_model_diffusion(const tk_model *m);

/* Generates gen_length tokens after prompt (len ids) by masked diffusion (or block diffusion on a
 * DiffusionGemma checkpoint), on the model's device. The model's attention is bidirectional for the
 * call (o->bidirectional for a causal checkpoint). Deterministic: the same options, seed (or draws)
 * and device give the same ids. It is a tk_diff_batch of one sequence (below), so the batch's
 * sequences sample as it does. Errors:
 * TK_ERR_INVALID naming both values: no mask token id, gen_length not a multiple of block_length,
 * steps fewer than the blocks or not a multiple of them, steps above gen_length, a prompt plus
 * gen_length longer than the context, an unknown remasking or alg; TK_ERR_UNSUPPORTED (a model without
 * an LM head, sliding-window layers); those of tk_model_forward and of o->rand (its status). */
TK_API int tk_diffusion_generate(tk_diff_result **out, tk_model *m, const int32_t *prompt, size_t len,
                                 const tk_diff_opts *o);
TK_API void tk_diff_result_free(tk_diff_result *r);
/* The gen_length new ids (borrowed; any left masked when a callback stopped it are mask_id). */
TK_API const int32_t *tk_diff_result_ids(const tk_diff_result *r, size_t *n);
/* Their text (special tokens skipped), or NULL without a tokenizer; borrowed. */
TK_API const char *tk_diff_result_text(const tk_diff_result *r);
/* {"sampler", "gen_length", "block_length", "blocks", "steps", "mask_token_id", "forward_passes",
 * "ms", "tokens_per_s", "end", "per_step": [{"step", "block", "unmasked": [positions]}, ...]}: *json is the
 * caller's (tk_free). */
TK_API int tk_diff_result_json(char **json, const tk_diff_result *r);

/* Several diffusion sequences in lockstep (what tk serve-model batches; tk_diffusion_generate is one
 * sequence of such a batch). Each step runs ONE forward over every sequence's canvas (and the
 * unconditional canvas of each with cfg_scale > 0), then advances each by its own sampler, options
 * and draws: a sequence produces the ids it produces alone through tk_diffusion_generate, up to the
 * rounding that a forward over more rows may change (docs/serving.md, "Determinism"). Sequences join
 * (tk_diff_batch_add) and leave (at their last step, by their on_step callback, or tk_diff_batch_cancel)
 * between steps; each may have its own prompt, gen_length, block_length, steps, sampler and seed. On a
 * block diffusion checkpoint (DiffusionGemma) the forward's linear layers and experts run over every
 * canvas at once while each sequence attends to its own cache of encoded keys and values; a sequence
 * at a block's start encodes its prompt or finished block in that same forward, and each keeps its
 * own block, temperature schedule, early stop, draws and options (t_min ... stability_threshold). One
 * thread at a time per batch (and per model: the batch runs the model).
 *
 *     tk_diff_batch *b = NULL;
 *     tk_diff_batch_new(&b, model);
 *     tk_diff_batch_add(&s1, b, ids1, n1, &o1);  tk_diff_batch_add(&s2, b, ids2, n2, &o2);
 *     while (tk_diff_batch_active(b)) {
 *         const tk_diff_event *ev; size_t nev;
 *         if (tk_diff_batch_step(b, &ev, &nev) != TK_OK) break;
 *         for (size_t i = 0; i < nev; i++) puts(tk_diff_result_text(ev[i].result));   // ev[i].seq ended
 *     }
 *     tk_diff_batch_free(b);
 */
typedef struct tk_diff_batch tk_diff_batch;
/* A sequence that ended in a step. */
typedef struct {
    int64_t seq;
    int status;                   /* TK_OK, or why this sequence failed (its o->rand's status, TK_ERR_NOMEM) */
    const char *error;            /* the failure's message ("" when status is TK_OK) */
    const tk_diff_result *result; /* end "length" or "callback"; NULL when it failed. Borrowed until the
                                     next tk_diff_batch_step or tk_diff_batch_free */
} tk_diff_event;
typedef struct {
    int64_t active;         /* sequences in the batch */
    int64_t steps;          /* steps run: one forward each */
    int64_t step_sequences; /* summed over the steps: the sequences each step advanced */
} tk_diff_batch_stats;

/* A new empty batch over a diffusion model (LLaDA, Dream, a Llama-family checkpoint that its sequences
 * run bidirectionally, or DiffusionGemma's block diffusion). The model must outlive it. Errors:
 * TK_ERR_UNSUPPORTED (no LM head), TK_ERR_NOMEM. */
TK_API int tk_diff_batch_new(tk_diff_batch **out, tk_model *m);
TK_API void tk_diff_batch_free(tk_diff_batch *b);
/* Adds a sequence: prompt (len ids, copied) and gen_length positions to generate, sampled as
 * tk_diffusion_generate does with o (copied; o->rand_user and o->step_user must live until the sequence
 * leaves, and o->on_step is called from tk_diff_batch_step). It joins at the next step; *seq receives
 * its id. Block diffusion allocates the sequence's logits and its encoder cache here (every layer's
 * keys and values for the prompt and every block). Errors: tk_diffusion_generate's checks of o and the
 * prompt (TK_ERR_INVALID), TK_ERR_NOMEM. */
TK_API int tk_diff_batch_add(int64_t *seq, tk_diff_batch *b, const int32_t *prompt, size_t len, const tk_diff_opts *o);
/* Runs one step of every sequence. *events (borrowed until the next call) receives one event per
 * sequence that ended, which is gone from the batch. A failure of one sequence (its draws, memory for
 * its record) ends it with that status and tk_last_error() naming it, and the step returns TK_OK; a
 * model failure fails the step and leaves every sequence as it was (a block's starting canvas, once
 * drawn, is kept for the next try). */
TK_API int tk_diff_batch_step(tk_diff_batch *b, const tk_diff_event **events, size_t *nevents);
/* Removes a sequence now (a cancelled request). Errors: TK_ERR_NOT_FOUND. */
TK_API int tk_diff_batch_cancel(tk_diff_batch *b, int64_t seq);
/* Sequences in the batch (added and not ended). */
TK_API size_t tk_diff_batch_active(const tk_diff_batch *b);
TK_API int tk_diff_batch_stats_get(tk_diff_batch_stats *out, const tk_diff_batch *b);

/* ---------------------------------------------------------------------------------------------- */
/* Chat templates                                                                                  */

/* One turn of a conversation: role ("system", "user", "assistant", ...) and UTF-8 content. */
typedef struct {
    const char *role, *content;
} tk_chat_message;

#define TK_CHAT_OPTS_VERSION 1
typedef struct {
    unsigned version;           /* TK_CHAT_OPTS_VERSION */
    int add_generation_prompt;  /* 1 (default): end with the assistant's header, as for a reply */
    const char *template_name;  /* NULL: the checkpoint's "default" template; else one of its named ones
                                   (tk_chat_templates_json lists them: "tool_use", "rag", ...) */
} tk_chat_opts;
#define TK_CHAT_OPTS_INIT {TK_CHAT_OPTS_VERSION, 1, NULL}

/* Renders n messages with a chat template of the checkpoint directory `dir`, as transformers'
 * apply_chat_template(messages, tokenize=False, add_generation_prompt=..., chat_template=NAME) does.
 * The templates are read in transformers' order of precedence: chat_template.jinja (the default) and
 * additional_chat_templates/NAME.jinja, which replace tokenizer_config.json's; else
 * tokenizer_config.json's chat_template (a string, or a list of {name, template}); else a processor's
 * chat_template.json. `dir` may also name a tokenizer_config.json file. The template sees messages,
 * add_generation_prompt and the special tokens (tokenizer_config.json's "*_token" values, else
 * special_tokens_map.json's: bos_token, eos_token, ...). tk interprets a Jinja2 subset
 * (docs/generation.md, "Chat"), with bounds on output size, steps and nesting. The text is not
 * tokenized: encode it without special tokens (the template adds them). opts NULL: the defaults.
 * *out is the caller's (tk_free). Errors: TK_ERR_NOT_FOUND (no template, or none of that name: the
 * message lists the names), TK_ERR_UNSUPPORTED (a construct outside the subset: the message names it
 * and its line), TK_ERR_INVALID (several templates and no default and no name given, a malformed file
 * or template, a limit passed, or the template's own raise_exception, whose message is quoted),
 * TK_ERR_NOMEM, TK_ERR_IO. Thread-safe: it reads the files on every call. */
TK_API int tk_chat_render_opts(char **out, const char *dir, const tk_chat_message *msgs, size_t n,
                               const tk_chat_opts *opts);
/* tk_chat_render_opts with the default template and add_generation_prompt as given. */
TK_API int tk_chat_render(char **out, const char *dir, const tk_chat_message *msgs, size_t n,
                          int add_generation_prompt);
/* The checkpoint's chat templates as JSON: {"templates": ["default", "rag", ...], "source": "the file
 * or files they come from"}, names in the order above (additional templates sorted by name). *out is
 * the caller's (tk_free). Errors: those of tk_chat_render_opts reading the files. */
TK_API int tk_chat_templates_json(char **out, const char *dir);

/* ---------------------------------------------------------------------------------------------- */
/* Communicators: several processes or GPUs (comm/, docs/parallel.md)                              */
/*
 * A tk_comm is a group of ranks 0..size-1 that run collectives together: all-reduce (sum), all-gather,
 * broadcast and barrier. tk writes no transport of its own; the backends are
 *   - MPI (linked when the build found Open MPI or MPICH with pkg-config): processes started by mpirun
 *     (or srun, hydra), or by a host program that already called MPI_Init. Host buffers (GPU
 *     tensors are staged through host memory).
 *   - NCCL (libnccl.so.2, loaded with dlopen on first use): one rank per GPU, device buffers (host
 *     tensors are staged through device memory); the unique id goes from rank 0 to the others over
 *     MPI, or through a file (nccl_id_file).
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
    int device;               /* NCCL: this rank's CUDA ordinal; -1: local rank % visible GPUs.
                                 MPI stages a GPU tensor on the tensor's own GPU, whatever this says */
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
 * or row-major), in host memory or on a GPU with any backend. MPI moves host memory: a GPU tensor is
 * staged, copied to a host buffer, summed there and copied back; NCCL moves device memory: a host
 * tensor is staged through a buffer on the communicator's GPU. A staged call adds a copy each way and
 * waits for the stream (docs/parallel.md). dtypes: f32, f64, f16, bf16, i32, i64 (f16 and bf16 are
 * summed in f32 and rounded once with MPI; NCCL sums them in its own way). stream: the CUDA stream of
 * the call (NULL: the legacy default stream, which tk's ops use): NCCL's collective and the staging
 * copies run on it, after the work already queued there; ignored for host tensors on MPI and self.
 * Errors: TK_ERR_INVALID (NULL or not contiguous, a dtype outside the list), TK_ERR_UNSUPPORTED (a GPU
 * tensor on NCCL that is not on the communicator's GPU; memory other than host and CUDA),
 * TK_ERR_NO_DEVICE or TK_ERR_LAUNCH (a staging copy: no driver, a kernel's earlier fault),
 * TK_ERR_NETWORK (timeout, a peer's failure, a broken communicator), TK_ERR_NOMEM. */
TK_API int tk_comm_all_reduce_sum(tk_comm *c, tk_tensor *t, void *stream);
/* Concatenates every rank's `in` along the outermost axis in rank order into `out`, on every rank:
 * out holds size x numel(in) elements of in's dtype (any dtype: the bytes are moved). In place when
 * in's data is rank's part of out. in and out may each be in host or device memory (with MPI two GPU
 * tensors must be on one GPU), staged as tk_comm_all_reduce_sum says. Errors as tk_comm_all_reduce_sum. */
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
