/*
 * manifest.h — the package format (docs/package-format.md): a manifest parsed and validated once,
 * kernel.json's keys, variants and diagnostics, and package directories read as a publish reads them.
 *
 * This layer sits between ops/jit and hub/api: hub (get, serve, publish) and api (kernels, ops,
 * packages) read what it parses and nothing else. A manifest is parsed only after its signature has
 * been verified. Internal names are tk_manifest__<verb>.
 */
#ifndef TK_MANIFEST_MANIFEST_H
#define TK_MANIFEST_MANIFEST_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "manifest/expr.h"
#include "tk.h" /* tk_dtype */

/* A file of a package: its path, digest and size (manifest "files", "archive"). */
typedef struct {
    const char *path;   /* relative path inside the package */
    const char *sha256; /* 64 lowercase hex */
    int64_t size;
} tk_manifest_file;

#define TK_MANIFEST_FORMAT 1
#define TK_MANIFEST_MAX (4u << 20) /* bytes */

typedef struct {
    json_t *root;              /* owns every string below */
    const char *name;          /* org/name */
    char org[65];
    char pkg[65];
    const char *version;       /* "1.2.3" */
    int major;
    const char *license;
    const char *description;
    size_t nfiles;
    tk_manifest_file *files;
    tk_manifest_file archive; /* path, sha256, size of the source archive */
    const char *compression;   /* "gz" or "zst" */
} tk_manifest;

int tk_manifest__parse(tk_manifest **out, const char *text, size_t n);
void tk_manifest__free(tk_manifest *m);

/* Checks "org/name"; fills org and pkg (65 bytes each) when non-NULL. TK_ERR_INVALID with a hint. */
int tk_manifest__name_check(const char *name, char *org, char *pkg);
/* Checks a relative path inside a package: no "..", ".", empty components, leading "/" or "\\". */
int tk_manifest__path_check(const char *path);
/* Parses "MAJOR.MINOR.PATCH"; *major may be NULL. 0 or -1. */
int tk_manifest__version_parse(const char *v, int *major);

/* Checks that every key of a kernel.json (manifest 0) or a manifest (manifest 1, which may also hold
 * format_version, files and archive) is one the format knows (manifest/schema.c; docs/kernel.schema.json).
 * TK_ERR_MANIFEST naming file:line:column, the path of the key, its kernel, the line with a caret, and
 * a "did you mean" when a known key is close. Values are not checked here. */
int tk_manifest__schema_check(const char *text, size_t n, const char *file, int manifest);
/* Variant expansion in a kernel.json: each kernel with "dtypes": [...] becomes one kernel per dtype,
 * in order, with {dtype} (f16), {T} (__half), {size} (2) and {vec} (16 / size) replaced in every
 * string and object key of the entry, and "dtypes" removed. The name must hold {dtype}. *origin
 * (may be NULL; malloc'd) maps each kernel of the result to its entry in the input, *n their count.
 * A published manifest holds the expanded kernels, so installing needs no expansion. */
int tk_manifest__expand_variants(json_t *spec, size_t **origin, size_t *n);
/* The position of the JSON path keys[i] (NULL: the array index idx[i]) in text, written into out as
 * "file:line:col|the line|caret line"; -1 when it cannot be found. */
int tk_manifest__json_where(char *out, size_t cap, const char *text, size_t n, const char *file,
                            const char *const *keys, const size_t *idx, size_t depth);

/* ---- kernels and declared ops (manifest/validate.c, manifest/opdecl.c) ---- */

/* A kernel's param (kernel.json "params"). */
typedef struct {
    char *name;
    int type;               /* TK_MANIFEST_P_* */
    tk_dtype dtype;         /* tensors */
    tk_manifest_expr *value; /* derived scalars and a workspace's size in bytes; NULL: the caller gives it */
    int optional;           /* tensors: may be left out (the kernel gets a null pointer) */
} tk_manifest_param;

/* A bound of constraints.max or .min: the expression's value must be <= (>= when is_min) bound. */
typedef struct {
    tk_manifest_expr *expr;
    int64_t bound;
    int is_min;
} tk_manifest_bound;

/* One kernel of a manifest, parsed and validated. */
typedef struct {
    char *name, *op, *source, *symbol;
    tk_manifest_param *params;
    size_t nparams;
    tk_manifest_expr *grid[3], *block[3]; /* NULL dims are 1 */
    tk_manifest_expr *smem;               /* never NULL ("0" when the rule has none) */
    int min_cc, max_cc;                   /* constraints; 0: no bound */
    int arch_specific;
    int64_t align;                        /* constraints.align: every tensor's address a multiple (0: any) */
    int64_t priority;
    tk_dtype *dtypes;                     /* constraints.dtypes in their order; none: unconstrained */
    size_t ndtypes;
    tk_manifest_bound *bounds;            /* constraints.max, then .min */
    size_t nbounds;
    char **options;                       /* NVRTC options of this kernel */
    size_t noptions;
} tk_manifest_kernel;

struct tk_op_desc;
/* What a manifest says about compiling and dispatching: its kernels, compile.options and the ops it
 * declares (each a tk_op_desc whose package is the manifest's name). */
typedef struct {
    tk_manifest_kernel *k;
    size_t nk;
    char **copts;
    size_t ncopts;
    struct tk_op_desc **ops;
    size_t nops;
} tk_manifest_kernels;

/* An installed manifest, validated when it was installed: an entry this tk cannot read (a newer tk
 * wrote it) is left out instead of failing the whole manifest. */
#define TK_MANIFEST_LENIENT 1u

/* Parses and validates parsed manifest m's device_toolkit, compile.options, "ops" and "kernels", in
 * that order, into *out (free with tk_manifest__kernels_free; cleared on failure): params, dtypes,
 * every launch, value and constraint expression against the kernel's params, options NVRTC accepts,
 * each source one of the manifest's "files", and each kernel against the signature of the op it
 * implements when tk or this manifest declares it. TK_ERR_MANIFEST naming the kernel (or op) and the
 * expression; *bad_in (may be NULL) is then "kernels" or "ops" and *bad (may be NULL) the index of
 * the failing entry (NULL and (size_t)-1 when the failure is not one entry's). */
int tk_manifest__kernels_parse(tk_manifest_kernels *out, json_t *m, unsigned flags, const char **bad_in, size_t *bad);
void tk_manifest__kernels_free(tk_manifest_kernels *ks);
/* Frees what one kernel owns and zeroes it (for a kernel moved out of a tk_manifest_kernels). */
void tk_manifest__kernel_clear(tk_manifest_kernel *d);
/* tk_manifest__kernels_parse, keeping nothing: the check publish and install run. */
int tk_manifest__validate_json(json_t *m, const char **bad_in, size_t *bad);

/* The descriptor of an entry of kernel.json "ops" declared by package pkg ("org/name"): params as
 * `tk ops --json` prints them, checked (kinds, dtypes, dtype_like, shapes, no built-in op's name).
 * TK_ERR_MANIFEST "op 'x': ...". Free with tk_manifest__op_declared_free. */
int tk_manifest__op_declare(struct tk_op_desc **out, json_t *decl, const char *pkg);
void tk_manifest__op_declared_free(struct tk_op_desc *op);
/* 1 when two declarations of an op have the same signature (names, kinds, dtypes, shapes, defaults). */
int tk_manifest__op_same(const struct tk_op_desc *a, const struct tk_op_desc *b);
/* Checks kernel k (a "kernels" entry) against the signature of the op it implements: each caller-given
 * param is the op's, of its kind, with a dtype it allows; every required tensor is taken. */
int tk_manifest__op_check_kernel(const struct tk_op_desc *op, json_t *k);

/* ---- package directories (manifest/local.c) ---- */

/* A package directory read as `tk publish` would read it, never signed or installed. */
typedef struct {
    char *dir;
    char *spec_path;   /* dir/kernel.json */
    char *name;        /* org/name */
    char *version;
    char *manifest;    /* the manifest a publish would sign (its archive entry left out) */
    char **paths;      /* the package's files, sorted */
    size_t nfiles;
} tk_manifest_local;

/* The files a publish of pkgdir would take: regular files below it, relative, sorted, no dotfiles,
 * not kernel.json (a symlink or device is an error). *paths is malloc'd, each path too. */
int tk_manifest__dir_files(char ***paths, size_t *n, const char *pkgdir);
/* The manifest's "files" for paths[0..n) below dir: [{"path", "sha256", "size"}] in that order. *out is
 * set (a new array) also on failure; the caller frees it. */
int tk_manifest__files_json(json_t **out, const char *dir, const char *const *paths, size_t n);
/* Reads dir/kernel.json and the files beside it and runs every check a publish runs and install
 * repeats: keys (file:line:column, did you mean), name, version, license, sources present, every
 * kernel's params, dtypes, launch and constraint expressions. TK_ERR_MANIFEST, TK_ERR_NOT_FOUND. */
int tk_manifest__local_load(tk_manifest_local *out, const char *dir);
void tk_manifest__local_free(tk_manifest_local *lp);

#endif
