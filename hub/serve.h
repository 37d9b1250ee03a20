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

#include "tk.h"

#endif
