/*
 * serve.h — tk serve: the registry server (libmicrohttpd) on top of a static registry tree.
 *
 * The public entry points (tk_server_new, tk_server_port, tk_server_free, tk_serve_token_add,
 * tk_serve_trust_add) are declared in tk.h.
 *
 * Wire protocol (docs/package-format.md "Registry layout" plus):
 *   GET/HEAD /api/kernels/{org}/{name}[/revision/{rev} | /refs | /tree/{rev}]
 *   GET/HEAD /kernels/{org}/{name}/resolve/{rev}/{file}      ETag, X-Repo-Commit, Range, If-None-Match
 *   PUT/POST /api/upload/{org}/{name}   Authorization: Bearer <token>; body: an uncompressed tar of
 *            exactly manifest.json, manifest.json.sig and the source archive the manifest names.
 *   GET      /                          an HTML page of the packages
 * Errors carry X-Error-Code (RepoNotFound, RevisionNotFound, EntryNotFound, BadRequest,
 * Unauthorized, Forbidden, UntrustedSigner, SignatureInvalid, ManifestInvalid, DigestMismatch,
 * ArchiveInvalid, VersionConflict, PayloadTooLarge, ...) and a body {"error": "..."}.
 */
#ifndef TK_HUB_SERVE_H
#define TK_HUB_SERVE_H

#include <stdint.h>

#include "tk.h"

/* The request parsing of serve.c, internal names so the fuzz targets (tests/fuzz/fuzz_serve.c) reach
 * them directly. */

/* Splits a decoded URL path ("/a/b/c") in place into at most max components; 0 when the path does not
 * start with '/', has more components, or one is refused (empty, a dot-name, a control character,
 * '\\' or ':'); 1 otherwise. */
int tk_hub__serve_split_path(char **parts, int max, int *n, char *path);
/* Parses a single "bytes=a-b" / "bytes=a-" / "bytes=-n" Range header against a file of `size` bytes.
 * 1: a range [*from, *to] inside the file; 0: ignore the header (absent, malformed or several
 * ranges); -1: unsatisfiable. */
int tk_hub__serve_parse_range(const char *h, int64_t size, int64_t *from, int64_t *to);
/* Does the If-None-Match header list this (quoted) etag, or '*'? */
int tk_hub__serve_etag_matches(const char *inm, const char *etag);
/* Unpacks an upload (a plain tar) into the empty folder stage: exactly manifest.json,
 * manifest.json.sig and one source.tar.{gz,zst}, regular files within their caps (the archive within
 * max bytes). *archive_name is borrowed static text. TK_ERR_INVALID when the upload is refused. */
int tk_hub__serve_upload_untar(const char **archive_name, const char *tar_path, const char *stage, int64_t max);

#endif
