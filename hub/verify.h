/*
 * verify.h — the one commit check and trust policy of the package path (hub/verify.c): is this
 * signature over these bytes, is its signer trusted for the org, does this commit hold what it
 * names, is this yank statement the publisher's. get, versions (and through them update, lock and
 * `tk list --outdated`) check every commit with these calls and nothing else, so a hostile
 * registry meets one set of rules and one set of messages.
 */
#ifndef TK_HUB_VERIFY_H
#define TK_HUB_VERIFY_H

#include <stddef.h>

#include "hub/hub.h"
#include "manifest/manifest.h"
#include "hub/sign.h"

#define TK_HUB_SIG_MAX 16384        /* bytes of a manifest.json.sig or a yank statement's .sig */
#define TK_HUB_INFO_MAX (1u << 20)  /* bytes of a commit's info document */
#define TK_HUB_YANK_MAX 65536       /* bytes of a yank statement */

/* GETs url into *body (malloc'd) with at most max bytes. A body over max is the registry's fault,
 * not the transport's: TK_ERR_MANIFEST naming the url and the cap. TK_ERR_NOT_FOUND unchanged. */
int tk_hub__get_doc(const tk_hub_env *env, const char *url, size_t max, char **body, size_t *len);

/* Checks that the signer keyid (public key pubkey) is trusted for ref's org: the build's key, or a
 * key in the trust store. An unknown signer is trusted only on first contact, when the caller allows
 * it (may_add: --trust on a manifest, never for a yank statement) and the org has no trusted key at
 * all; an org that has one never gains another from a download, whatever the flags (rotation goes
 * through 'tk trust add'). *add (NULL when may_add is 0) is set to 1 when the signer is to be
 * trusted on first use: the caller records it in the install's transaction, so a package refused
 * later leaves no key behind. TK_ERR_UNTRUSTED (with the fingerprint and a hint) or
 * TK_ERR_SIGNATURE (the store holds another key under that id). */
int tk_hub__signer_check(const tk_hub_env *env, const tk_hub_ref *ref, const char *keyid, const char *pubkey,
                         int may_add, int *add);
/* tk_hub__signer_check without first-use trust. */
int tk_hub__signer_trusted(const tk_hub_env *env, const tk_hub_ref *ref, const char *keyid, const char *pubkey);
/* 1 when the org has a trusted key (the build's, or one in the trust store). */
int tk_hub__org_pinned(const tk_hub_env *env, const char *org);

/* Parses the signature file sigtext of ref's manifest at commit and verifies it over the manifest's
 * exact bytes; keyid and pubkey receive the signer. TK_ERR_SIGNATURE with a hint. */
int tk_hub__manifest_signed(char keyid[TK_KEYID_LEN], char pubkey[TK_PUBKEY_LEN], const tk_hub_ref *ref,
                            const char *commit, const char *mtext, size_t mlen, const char *sigtext, size_t siglen);

/* Checks that commit holds what it names: the manifest m (its bytes' sha256 msha, its signature file
 * sigtext) is ref's package, and the id recomputed from the parent that the commit's info document
 * gives (api/kernels/{org}/{name}/revision/{commit}, "tk"."parent") and the digests of the manifest,
 * the signature and the archive the signed manifest names (the archive is checked against that
 * digest when it arrives) is commit. A registry that serves another version's files under this
 * commit cannot make the ids agree without a sha256 preimage. parent (may be NULL) receives the
 * parent (TK_HUB_NO_PARENT: none). TK_ERR_MANIFEST (no or a bad info document, another package) or
 * TK_ERR_DIGEST (the ids differ). */
int tk_hub__commit_verify(char parent[41], const tk_hub_env *env, const tk_hub_ref *ref, const char *commit,
                          const char *msha, const char *sigtext, size_t siglen, const tk_manifest *m);

/* The publisher's statement withdrawing ref@version (kernels/{org}/{name}/yanked/{version}.json and
 * .sig), into *y: its signature verifies with `signer` (a key id, the version's own signer; NULL:
 * none) or a key trusted for the org, and it names ref@version. TK_ERR_NOT_FOUND (message set) when
 * the registry has no statement; any other error means a bad statement, which a caller ignores (a
 * registry can hide a yank, never make one). *url (may be NULL) receives the statement's URL
 * (malloc'd, also on failure). */
int tk_hub__yank_verified(tk_hub_yank *y, char **url, const tk_hub_env *env, const tk_hub_ref *ref, const char *version,
                          const char *signer);

#endif
