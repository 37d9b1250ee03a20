/*
 * tree.h — writing versions into a static registry tree (docs/package-format.md, "Registry layout"),
 * shared by `tk publish --to` (publish.c) and `tk serve` uploads (serve.c). Callers hold the tree's
 * .tk-publish.lock while they write.
 */
#ifndef TK_HUB_TREE_H
#define TK_HUB_TREE_H

#include <jansson.h>

#define TK_HUB_NO_PARENT "0000000000000000000000000000000000000000"

/* The commit a branch link (resolve/v<N>, resolve/main) points to, or NULL (malloc'd). */
char *tk_hub__tree_branch_head(const char *resolve_dir, const char *branch);
/* Points dir/name at target by an atomic rename of a fresh symlink. */
int tk_hub__tree_set_symlink(const char *dir, const char *name, const char *target);
/* Writes j (indented, newline-terminated) to path atomically. */
int tk_hub__tree_write_json(const char *path, json_t *j);
/* The Hub-shaped info document of one revision (new reference). Its "tk" object carries the
 * version, the major and the commit's parent (TK_HUB_NO_PARENT for a first commit; parent NULL),
 * so a client can recompute the commit id from what it downloads (docs/registry.md). */
json_t *tk_hub__tree_info_doc(const char *name, const char *commit, const char *archive_name, const char *version,
                              int major, const char *parent);
/* The parent recorded in api_dir/revision/<commit>, or NULL (malloc'd). */
char *tk_hub__tree_commit_parent(const char *api_dir, const char *commit);
/* A commit's manifest in the tree as JSON, or NULL. */
json_t *tk_hub__tree_commit_manifest(const char *resolve_dir, const char *commit);
/* The version in a commit's manifest, or NULL (malloc'd). */
char *tk_hub__tree_commit_version(const char *resolve_dir, const char *commit);
/* Rewrites refs, the branch revision documents, the package's index.json and the tree's index.json,
 * then the Hub listings (tk_hub__tree_write_hub_docs), after branch v<new_major> moved to new_commit
 * (a publish, an upload or a yank), or, with new_commit NULL, after branch v<new_major> was removed
 * (a yank of its only version): its documents go, and with no branch left main, revision/main and
 * the package's index.json go too (the tree's index.json keeps the name with "main": null). */
int tk_hub__tree_update_refs(const char *tree, const char *api_dir, const char *resolve_dir, const char *name,
                             int new_major, const char *new_commit, const char *archive_name);
/* The Hub's listing of a commit directory, what GET /api/kernels/{org}/{name}/tree/{rev} answers:
 * its regular files (dot-names left out) sorted by path, each {"type": "file", "path", "size",
 * "oid": sha256}. *out is a new reference. */
int tk_hub__tree_listing(json_t **out, const char *commit_dir);
/* Writes commit_dir/.etag once (a commit never changes): for each file F with sha256 S, the links
 * .etag/F -> S and .etag/S/F -> ../../F. The real path of resolve/{rev}/.etag/F is then
 * resolve/{commit}/.etag/{sha256}, through the branch link when rev is a branch, which is how nginx
 * sends X-Repo-Commit and ETag without reading a file (docs/nginx-registry.conf). Built in a
 * temporary directory and renamed into place, so a reader sees all of it or none. */
int tk_hub__tree_etag_links(const char *commit_dir);
/* The .etag links and api_dir/tree/<commit> of one commit, each written when missing. */
int tk_hub__tree_commit_hub_docs(const char *api_dir, const char *resolve_dir, const char *commit);
/* tk_hub__tree_commit_hub_docs for every commit in resolve_dir, then api_dir/tree/<branch> for every
 * branch link (v<N>, main), rewritten, and removed for a branch that no longer has a link: what
 * huggingface_hub reads from a plain-files registry. */
int tk_hub__tree_write_hub_docs(const char *api_dir, const char *resolve_dir);
/* Writes the info document (with its parent) of every commit in resolve_dir whose document lacks
 * the parent: trees written before commit ids were checked. The parent is found by recomputing the
 * id over each candidate (another commit, or none); a commit no candidate explains is left alone. */
int tk_hub__tree_backfill_parents(const char *api_dir, const char *resolve_dir);
/* The commit id of a version: 40 hex of sha256 over the parent and the three files' names and digests
 * (parent NULL: TK_HUB_NO_PARENT). hub/get.c recomputes it from what it downloaded. */
int tk_hub__tree_commit_id(char out[41], const char *parent, const char *const names[3], const char *const shas[3]);

#endif
