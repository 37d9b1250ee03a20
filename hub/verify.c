/*
 * verify.c — the one commit check and trust policy (verify.h): signatures, trusted signers and
 * pinned orgs, commit ids recomputed from the parent and the digests, and the publisher's yank
 * statements. get.c and versions.c call these and keep no copy of their own: security logic in
 * two copies drifts.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cache/state.h"
#include "common/common.h"
#include "hub/tree.h"
#include "hub/verify.h"

#define say(env, level, ...) tk__logf((env)->log, (env)->log_user, (level), __VA_ARGS__)

int tk_hub__get_doc(const tk_hub_env *env, const char *url, size_t max, char **body, size_t *len)
{
    tk_hub_http_meta meta;
    int rc = tk_hub__http_get_mem(env->http, url, max, body, len, &meta);
    if (rc != TK_OK && rc != TK_ERR_NOT_FOUND && meta.too_big)
        rc = tk__err(TK_ERR_MANIFEST,
                     "%s is larger than the %zu bytes tk accepts for it\nHINT: the registry's "
                     "copy is damaged or hostile",
                     url, max);
    return rc;
}

/* The signer is not the build's key and not in the trust store: refused (the org is pinned to
 * another key, or no first-use trust is allowed), or trusted on first use. */
static int unknown_signer(const tk_hub_env *env, const tk_hub_ref *ref, const char *keyid, const char *pubkey,
                          const char *builtin_id, int may_add, int *add)
{
    char *pinned = NULL;
    int rc = tk_state__trust_org_key(&pinned, env->state, ref->org);
    if (rc != TK_OK)
        return rc;
    if (!pinned && builtin_id[0])
        pinned = tk__strdup(builtin_id);
    if (pinned) {
        rc = tk__err(TK_ERR_UNTRUSTED,
                     "%s is signed by %s, but org '%s' is pinned to key %s; tk refuses the new signer%s\n"
                     "HINT: a registry or the network may have swapped the key. If the publisher really rotated "
                     "its key, confirm the new key with them and run 'tk trust add %s %s' (see \"Rotating a "
                     "publisher key\" in docs/registry.md)",
                     ref->name, keyid, ref->org, pinned,
                     env->trust_unknown ? " (--trust only trusts the first key of an org)" : "", ref->org, pubkey);
        free(pinned);
        return rc;
    }
    if (env->trust_unknown && may_add && add) {
        say(env, TK_LOG_WARN, "trusting new signer %s for org '%s' (--trust; first key of this org)", keyid, ref->org);
        *add = 1;
        return TK_OK;
    }
    if (!may_add)
        return tk__err(TK_ERR_UNTRUSTED, "%s: the statement is signed by %s, which is not trusted for org '%s'",
                       ref->name, keyid, ref->org);
    return tk__err(TK_ERR_UNTRUSTED,
                   "%s is signed by %s, which is not trusted for org '%s'\n"
                   "HINT: if you trust this publisher, run 'tk trust add %s %s', or pass --trust once",
                   ref->name, keyid, ref->org, ref->org, pubkey);
}

int tk_hub__signer_check(const tk_hub_env *env, const tk_hub_ref *ref, const char *keyid, const char *pubkey,
                         int may_add, int *add)
{
    char bid[TK_KEYID_LEN] = "";
    if (env->builtin_org && env->builtin_pubkey && strcmp(env->builtin_org, ref->org) == 0 &&
        tk_hub__pubkey_check(env->builtin_pubkey, bid) == TK_OK && strcmp(bid, keyid) == 0)
        return TK_OK;
    char *trusted = NULL;
    int rc = tk_state__trust_get(&trusted, env->state, ref->org, keyid);
    if (rc != TK_OK)
        return rc;
    if (!trusted)
        return unknown_signer(env, ref, keyid, pubkey, bid, may_add, add);
    rc = strcmp(trusted, pubkey) == 0 ? TK_OK
                                      : tk__err(TK_ERR_SIGNATURE,
                                                "key %s in the trust store does not match the key "
                                                "in the signature",
                                                keyid);
    free(trusted);
    return rc;
}

int tk_hub__signer_trusted(const tk_hub_env *env, const tk_hub_ref *ref, const char *keyid, const char *pubkey)
{
    return tk_hub__signer_check(env, ref, keyid, pubkey, 0, NULL);
}

int tk_hub__org_pinned(const tk_hub_env *env, const char *org)
{
    char *pinned = NULL;
    if (env->builtin_org && env->builtin_pubkey && strcmp(env->builtin_org, org) == 0)
        return 1;
    int yes = tk_state__trust_org_key(&pinned, env->state, org) == TK_OK && pinned;
    free(pinned);
    return yes;
}

int tk_hub__manifest_signed(char keyid[TK_KEYID_LEN], char pubkey[TK_PUBKEY_LEN], const tk_hub_ref *ref,
                            const char *commit, const char *mtext, size_t mlen, const char *sigtext, size_t siglen)
{
    uint8_t sig[64];
    int rc;
    if ((rc = tk_hub__sig_parse(keyid, pubkey, sig, sigtext, siglen)) != TK_OK)
        return tk__err_wrap(rc, "%s", ref->name);
    if ((rc = tk_hub__verify(pubkey, sig, mtext, mlen)) != TK_OK)
        return tk__err(rc,
                       "%s at %s: the signature does not match the manifest (the manifest was altered, or "
                       "signed by another key)\nHINT: do not use this registry copy; report it to the publisher",
                       ref->name, commit);
    return TK_OK;
}

/* The parent the commit's info document gives. */
static int info_parent(char parent[41], const tk_hub_env *env, const tk_hub_ref *ref, const char *commit)
{
    char *url = tk__fmt("%s/api/kernels/%s/%s/revision/%s", env->endpoint, ref->org, ref->pkg, commit);
    char *body = NULL;
    size_t len = 0;
    json_t *j = NULL;
    int rc = url ? tk_hub__get_doc(env, url, TK_HUB_INFO_MAX, &body, &len) : tk__err(TK_ERR_NOMEM, "out of memory");
    if (rc == TK_ERR_NOT_FOUND)
        rc = tk__err(TK_ERR_MANIFEST,
                     "%s: the registry has no info document for commit %s (%s), so tk cannot "
                     "check that the commit holds what it names\nHINT: the registry was not written by 'tk publish' "
                     "or 'tk serve', or by an older tk; its publisher runs 'tk publish' again to record it",
                     ref->name, commit, url);
    if (rc != TK_OK)
        goto done;
    j = json_loadb(body, len, 0, NULL);
    const char *sha = json_string_value(json_object_get(j, "sha"));
    const char *p = json_string_value(json_object_get(json_object_get(j, "tk"), "parent"));
    if (!sha || strcmp(sha, commit) != 0 || !p || !tk__is_hex(p, 40)) {
        rc = tk__err(TK_ERR_MANIFEST,
                     "%s: the info document of commit %s (%s) %s\nHINT: the registry was "
                     "written by an older tk (its publisher runs 'tk publish' again, which records the "
                     "parents), or it is damaged",
                     ref->name, commit, url,
                     !j                            ? "is not valid JSON"
                     : !sha || strcmp(sha, commit) ? "names another commit"
                                                   : "does not give the commit's parent (tk.parent)");
        goto done;
    }
    memcpy(parent, p, 41);
done:
    json_decref(j);
    free(body);
    free(url);
    return rc;
}

int tk_hub__commit_verify(char parent[41], const tk_hub_env *env, const tk_hub_ref *ref, const char *commit,
                          const char *msha, const char *sigtext, size_t siglen, const tk_manifest *m)
{
    char p[41], ssha[TK_SHA256_HEX], got[41];
    int rc;
    if (strcmp(m->name, ref->name) != 0)
        return tk__err(TK_ERR_MANIFEST, "the registry served the manifest of %s when %s was asked for", m->name,
                       ref->name);
    if ((rc = info_parent(p, env, ref, commit)) != TK_OK)
        return rc;
    tk__sha256_hex(ssha, sigtext, siglen);
    const char *names[3] = {"manifest.json", "manifest.json.sig", m->archive.path};
    const char *shas[3] = {msha, ssha, m->archive.sha256};
    if ((rc = tk_hub__tree_commit_id(got, p, names, shas)) != TK_OK)
        return rc;
    if (strcmp(got, commit) != 0)
        return tk__err(TK_ERR_DIGEST,
                       "%s: commit %s does not hold what it names: the files the registry served "
                       "there (%s %s) make commit %s\nHINT: the registry or a mirror put another version's files "
                       "under this commit; do not use it, and report it to the registry's operator",
                       ref->name, commit, m->name, m->version, got);
    if (parent)
        memcpy(parent, p, 41);
    return TK_OK;
}

int tk_hub__yank_verified(tk_hub_yank *y, char **url_out, const tk_hub_env *env, const tk_hub_ref *ref,
                          const char *version, const char *signer)
{
    char *url = tk__fmt("%s/kernels/%s/%s/yanked/%s.json", env->endpoint, ref->org, ref->pkg, version);
    char *surl = url ? tk__fmt("%s.sig", url) : NULL, *stmt = NULL, *sigtext = NULL;
    size_t slen = 0, glen = 0;
    char keyid[TK_KEYID_LEN], pubkey[TK_PUBKEY_LEN];
    uint8_t sig[64];
    int rc = surl ? tk_hub__get_doc(env, url, TK_HUB_YANK_MAX, &stmt, &slen) : tk__err(TK_ERR_NOMEM, "out of memory");
    if (rc != TK_OK)
        goto done;
    if ((rc = tk_hub__get_doc(env, surl, TK_HUB_SIG_MAX, &sigtext, &glen)) == TK_ERR_NOT_FOUND)
        rc = tk__err(TK_ERR_SIGNATURE, "it has no signature (%s is missing)", surl);
    if (rc == TK_OK && (rc = tk_hub__sig_parse(keyid, pubkey, sig, sigtext, glen)) == TK_OK &&
        (rc = tk_hub__verify(pubkey, sig, stmt, slen)) == TK_OK && (!signer || strcmp(keyid, signer) != 0) &&
        (rc = tk_hub__signer_trusted(env, ref, keyid, pubkey)) != TK_OK)
        goto done;
    if (rc == TK_OK && (rc = tk_hub__yank_parse(y, stmt, slen)) == TK_OK &&
        (strcmp(y->ref.name, ref->name) != 0 || strcmp(y->version, version) != 0))
        rc = tk__err(TK_ERR_SIGNATURE, "it is for %s %s", y->ref.name, y->version);
done:
    if (url_out)
        *url_out = url;
    else
        free(url);
    free(surl);
    free(stmt);
    free(sigtext);
    return rc;
}
