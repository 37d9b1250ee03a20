/*
 * manifest.h — parsing and validating package manifests (docs/package-format.md).
 *
 * The manifest is parsed only after its signature has been verified. Parsing checks the structure
 * that the package path relies on (name, version, files, archive); the "kernels" array is validated
 * by the JIT layer through the install hook.
 */
#ifndef TK_HUB_MANIFEST_H
#define TK_HUB_MANIFEST_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "hub/archive.h"

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
    tk_hub_archive_entry *files;
    tk_hub_archive_entry archive; /* path, sha256, size of the source archive */
    const char *compression;   /* "gz" or "zst" */
} tk_hub_manifest;

int tk_hub__manifest_parse(tk_hub_manifest **out, const char *text, size_t n);
void tk_hub__manifest_free(tk_hub_manifest *m);

/* Checks "org/name"; fills org and pkg (65 bytes each) when non-NULL. TK_ERR_INVALID with a hint. */
int tk_hub__name_check(const char *name, char *org, char *pkg);
/* Checks a relative path inside a package: no "..", ".", empty components, leading "/" or "\\". */
int tk_hub__path_check(const char *path);
/* Parses "MAJOR.MINOR.PATCH"; *major may be NULL. 0 or -1. */
int tk_hub__version_parse(const char *v, int *major);

/* Checks that every key of a kernel.json (manifest 0) or a manifest (manifest 1, which may also hold
 * format_version, files and archive) is one the format knows (hub/schema.c; docs/kernel.schema.json).
 * TK_ERR_MANIFEST naming file:line:column, the path of the key, its kernel, the line with a caret, and
 * a "did you mean" when a known key is close. Values are not checked here. */
int tk_hub__schema_check(const char *text, size_t n, const char *file, int manifest);
/* Variant expansion in a kernel.json: each kernel with "dtypes": [...] becomes one kernel per dtype,
 * in order, with {dtype} (f16), {T} (__half), {size} (2) and {vec} (16 / size) replaced in every
 * string and object key of the entry, and "dtypes" removed. The name must hold {dtype}. *origin
 * (may be NULL; malloc'd) maps each kernel of the result to its entry in the input, *n their count.
 * A published manifest holds the expanded kernels, so installing needs no expansion. */
int tk_hub__expand_variants(json_t *spec, size_t **origin, size_t *n);
/* The position of the JSON path keys[i] (NULL: the array index idx[i]) in text, written into out as
 * "file:line:col|the line|caret line"; -1 when it cannot be found. */
int tk_hub__json_where(char *out, size_t cap, const char *text, size_t n, const char *file, const char *const *keys,
                       const size_t *idx, size_t depth);

#endif
