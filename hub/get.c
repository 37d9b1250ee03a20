/*
 * get.c — the get pipeline: resolve a reference against the registry, download the manifest, its
 * signature and the source archive, verify them, unpack safely and record the install.
 *
 * Order matters for safety:
 *   signature verified → manifest parsed → name and commit-id checks → rollback check → JIT
 *   validation hook → archive downloaded and its sha256 checked → unpacked (allowlist, per-file digests) →
 *   objects moved into the store → rows committed in one short transaction.
 * Nothing is installed until the last step, and a failure at any step leaves the old state.
 * Requests: refs (unless an exact commit is given), then at most manifest, signature, the commit's
 * info document (for its parent, to recompute the commit id) and archive.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include <jansson.h>

#include "common/common.h"
#include "hub/archive.h"
#include "hub/hub.h"
#include "hub/manifest.h"
#include "hub/sign.h"
#include "hub/tree.h"

#define say(env, level, ...) tk__logf((env)->log, (env)->log_user, (level), __VA_ARGS__)

int tk_hub__installed(tk_state_pkg **out, tk_state *st, const char *refstr)
{
    *out = NULL;
    tk_hub_ref ref;
    int rc = tk_hub__ref_parse(&ref, refstr);
    if (rc != TK_OK)
        return rc;
    if (ref.commit[0]) {
        rc = tk_state__pkg_get_commit(out, st, ref.name, ref.commit);
    } else if (tk_hub__ref_is_spec(&ref)) { /* the newest installed version the spec allows */
        tk_state_pkg **all = NULL;
        size_t n = 0, best = (size_t)-1;
        if ((rc = tk_state__pkg_list(&all, &n, st)) != TK_OK)
            return rc;
        for (size_t i = 0; i < n; i++)
            if (!strcmp(all[i]->name, ref.name) && tk_hub__ref_matches(&ref, all[i]->version) &&
                (best == (size_t)-1 || tk_state__version_cmp(all[i]->version, all[best]->version) > 0))
                best = i;
        rc = TK_ERR_NOT_FOUND;
        if (best != (size_t)-1) {
            *out = all[best];
            all[best] = NULL;
            rc = TK_OK;
        }
        for (size_t i = 0; i < n; i++)
            tk_state__pkg_free(all[i]);
        free(all);
    } else {
        rc = tk_state__pkg_get(out, st, ref.name, ref.major);
    }
    if (rc == TK_ERR_NOT_FOUND)
        rc = tk__err(TK_ERR_NOT_FOUND, "%s is not installed\nHINT: run 'tk get %s'", refstr, refstr);
    return rc;
}

/* "did you mean" from the registry's package list (if it has one) and installed names. */
static void suggest(const tk_hub_env *env, const char *name, tk_buf *hint)
{
    char *url = tk__fmt("%s/index.json", env->endpoint);
    char *body = NULL;
    size_t len = 0;
    const char *best = NULL;
    size_t bestd = (size_t)-1;
    json_t *j = NULL;
    char **names = NULL;
    size_t nn = 0;
    if (url && env->http && tk_hub__http_get_mem(env->http, url, 8u << 20, &body, &len, NULL) == TK_OK) {
        j = json_loadb(body, len, 0, NULL);
        const char *k;
        json_t *v;
        json_object_foreach(json_object_get(j, "packages"), k, v) {
            size_t d = tk__edit_distance(name, k);
            if (d < bestd) {
                bestd = d;
                best = k;
            }
        }
    }
    if (tk_state__pkg_names(&names, &nn, env->state) == TK_OK) {
        for (size_t i = 0; i < nn; i++) {
            size_t d = tk__edit_distance(name, names[i]);
            if (d < bestd) {
                bestd = d;
                best = names[i];
            }
        }
    }
    if (best && bestd > 0 && bestd <= 1 + strlen(name) / 3)
        tk__buf_printf(hint, "\nHINT: did you mean '%s'?", best);
    else
        tk__buf_printf(hint, "\nHINT: check the name; the registry is %s", env->endpoint);
    for (size_t i = 0; i < nn; i++)
        free(names[i]);
    free(names);
    json_decref(j);
    free(body);
    free(url);
}

/* Resolves ref to a commit through the refs endpoint. */
static int resolve(const tk_hub_env *env, const tk_hub_ref *ref, char commit[41], int *major)
{
    char *url = tk__fmt("%s/api/kernels/%s/%s/refs", env->endpoint, ref->org, ref->pkg);
    char *body = NULL;
    size_t len = 0;
    json_t *j = NULL;
    int rc = TK_OK;
    if (!url)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    rc = tk_hub__http_get_mem(env->http, url, 1u << 20, &body, &len, NULL);
    if (rc == TK_ERR_NOT_FOUND) {
        tk_buf hint = TK_BUF_INIT;
        suggest(env, ref->name, &hint);
        rc = tk__err(TK_ERR_NOT_FOUND, "package %s not found in the registry%s", ref->name,
                     hint.data ? hint.data : "");
        tk__buf_free(&hint);
        goto done;
    }
    if (rc != TK_OK)
        goto done;
    json_error_t jerr;
    j = json_loadb(body, len, 0, &jerr);
    json_t *branches = json_object_get(j, "branches");
    if (!json_is_array(branches)) {
        rc = tk__err(TK_ERR_NETWORK, "the registry's refs for %s are not valid (%s)\nHINT: is %s a tk or Hub "
                     "registry?", ref->name, j ? "no 'branches' array" : jerr.text, env->endpoint);
        goto done;
    }
    int best = 0;
    const char *best_commit = NULL;
    tk_buf avail = TK_BUF_INIT;
    size_t i;
    json_t *b;
    json_array_foreach(branches, i, b) {
        const char *bn = json_string_value(json_object_get(b, "name"));
        const char *tc = json_string_value(json_object_get(b, "targetCommit"));
        int64_t m;
        if (!bn || !tc || bn[0] != 'v' || tk__parse_i64(bn + 1, 1, 1000000, &m) != 0 || !tk__is_hex(tc, 40))
            continue;
        tk__buf_printf(&avail, "%s%s", avail.len ? ", " : "", bn);
        if ((ref->major && m == ref->major) || (!ref->major && m > best)) {
            best = (int)m;
            best_commit = tc;
        }
    }
    if (!best_commit) {
        if (ref->major)
            rc = tk__err(TK_ERR_NOT_FOUND, "%s has no version %d (branch v%d)\nHINT: available: %s", ref->name,
                         ref->major, ref->major, avail.len ? avail.data : "none");
        else
            rc = tk__err(TK_ERR_NOT_FOUND, "%s has no version branches (v1, v2, ...) in the registry", ref->name);
        tk__buf_free(&avail);
        goto done;
    }
    tk__buf_free(&avail);
    memcpy(commit, best_commit, 41);
    *major = best;
    if (!ref->major)
        say(env, TK_LOG_INFO, "%s: using v%d, the highest major version (pin it with %s@%d)", ref->name, best,
            ref->name, best);
done:
    json_decref(j);
    free(body);
    free(url);
    return rc;
}

/* Checks that the signer keyid (public key pubkey) is trusted for ref's org: the build's key, or a
 * key in the trust store. An unknown signer is trusted only on first contact, when the caller allows
 * it (may_add: --trust on a manifest, never for a yank statement) and the org has no trusted key at
 * all; an org that has one never gains another from a download, whatever the flags (rotation goes
 * through 'tk trust add'). *add (NULL: may_add is 0) is set to 1 when the signer is to be trusted on
 * first use: the caller records it in the install's transaction, so a package refused later leaves
 * no key behind. */
static int check_signer(const tk_hub_env *env, const tk_hub_ref *ref, const char *keyid, const char *pubkey,
                        int may_add, int *add)
{
    char bid[TK_KEYID_LEN] = "";
    if (env->builtin_org && env->builtin_pubkey && strcmp(env->builtin_org, ref->org) == 0 &&
        tk_hub__pubkey_check(env->builtin_pubkey, bid) == TK_OK && strcmp(bid, keyid) == 0)
        return TK_OK;
    char *trusted = NULL, *pinned = NULL;
    int rc = tk_state__trust_get(&trusted, env->state, ref->org, keyid);
    if (rc != TK_OK)
        return rc;
    if (trusted) {
        rc = strcmp(trusted, pubkey) == 0 ? TK_OK
                                          : tk__err(TK_ERR_SIGNATURE, "key %s in the trust store does not match "
                                                    "the key in the signature", keyid);
        free(trusted);
        return rc;
    }
    if ((rc = tk_state__trust_org_key(&pinned, env->state, ref->org)) != TK_OK)
        return rc;
    if (!pinned && bid[0])
        pinned = tk__strdup(bid);
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
        say(env, TK_LOG_WARN, "trusting new signer %s for org '%s' (--trust; first key of this org)", keyid,
            ref->org);
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

int tk_hub__signer_trusted(const tk_hub_env *env, const tk_hub_ref *ref, const char *keyid, const char *pubkey)
{
    return check_signer(env, ref, keyid, pubkey, 0, NULL);
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

void tk_hub__suggest(const tk_hub_env *env, const char *name, tk_buf *hint) { suggest(env, name, hint); }

/* TK_OK when the publisher has withdrawn ref@version with a yank statement signed by a key trusted
 * for the org (hub/yank.c); *reason receives its reason. Anything else (no statement, a bad or
 * untrusted signature, another package or version) is an error, and the caller refuses the rollback. */
static int yanked_by_publisher(const tk_hub_env *env, const tk_hub_ref *ref, const char *version, char *reason,
                               size_t reason_cap)
{
    char *url = tk__fmt("%s/kernels/%s/%s/yanked/%s.json", env->endpoint, ref->org, ref->pkg, version);
    char *surl = url ? tk__fmt("%s.sig", url) : NULL, *stmt = NULL, *sigtext = NULL;
    size_t slen = 0, glen = 0;
    char keyid[TK_KEYID_LEN], pubkey[TK_PUBKEY_LEN];
    uint8_t sig[64];
    tk_hub_yank y;
    int rc = surl ? TK_OK : tk__err(TK_ERR_NOMEM, "out of memory");
    if (rc == TK_OK && (rc = tk_hub__http_get_mem(env->http, url, 65536, &stmt, &slen, NULL)) == TK_OK &&
        (rc = tk_hub__http_get_mem(env->http, surl, 16384, &sigtext, &glen, NULL)) == TK_OK &&
        (rc = tk_hub__sig_parse(keyid, pubkey, sig, sigtext, glen)) == TK_OK &&
        (rc = tk_hub__verify(pubkey, sig, stmt, slen)) == TK_OK && (rc = check_signer(env, ref, keyid, pubkey, 0, NULL)) == TK_OK &&
        (rc = tk_hub__yank_parse(&y, stmt, slen)) == TK_OK) {
        if (strcmp(y.ref.name, ref->name) != 0 || strcmp(y.version, version) != 0)
            rc = tk__err(TK_ERR_SIGNATURE, "the yank statement at %s is for %s %s", url, y.ref.name, y.version);
        else
            snprintf(reason, reason_cap, "%s", y.reason[0] ? y.reason : "no reason given");
    }
    free(url);
    free(surl);
    free(stmt);
    free(sigtext);
    return rc;
}

static int fetch_small(const tk_hub_env *env, const tk_hub_ref *ref, const char *commit, const char *file,
                       size_t max, char **out, size_t *len)
{
    char *url = tk__fmt("%s/kernels/%s/%s/resolve/%s/%s", env->endpoint, ref->org, ref->pkg, commit, file);
    if (!url)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    tk_hub_http_meta meta;
    int rc = tk_hub__http_get_mem(env->http, url, max, out, len, &meta);
    int is_sig = strcmp(file, "manifest.json.sig") == 0;
    if (rc != TK_OK && meta.too_big) /* the package's own file, whatever the transport: refused */
        rc = tk__err(is_sig ? TK_ERR_SIGNATURE : TK_ERR_MANIFEST, "%s at %s: %s is larger than the %zu bytes tk "
                     "accepts for it; tk refuses the package\nHINT: the registry's copy is damaged or hostile; "
                     "report it to the publisher", ref->name, commit, file, max);
    else if (rc == TK_ERR_NOT_FOUND && is_sig)
        rc = tk__err(TK_ERR_SIGNATURE, "%s at %s has no signature (manifest.json.sig is missing); tk refuses "
                     "unsigned packages", ref->name, commit);
    else if (rc == TK_ERR_NOT_FOUND)
        rc = tk__err_wrap(rc, "%s at commit %s", ref->name, commit);
    free(url);
    return rc;
}

/* Checks that commit names what was downloaded: recomputes the id from the parent the registry
 * gives in the commit's info document (api/kernels/{org}/{name}/revision/{commit}, "tk"."parent")
 * and the digests of the manifest, the signature and the archive the signed manifest names (the
 * archive is checked against that digest when it arrives). A registry that serves another
 * version's files under this commit cannot make the ids agree without a sha256 preimage. */
static int check_commit(const tk_hub_env *env, const tk_hub_ref *ref, const char *commit, const char *msha,
                        const char *sigtext, size_t siglen, const tk_hub_manifest *m)
{
    char *url = tk__fmt("%s/api/kernels/%s/%s/revision/%s", env->endpoint, ref->org, ref->pkg, commit);
    char *body = NULL;
    size_t len = 0;
    json_t *j = NULL;
    int rc = url ? tk_hub__http_get_mem(env->http, url, 1u << 20, &body, &len, NULL)
                 : tk__err(TK_ERR_NOMEM, "out of memory");
    if (rc == TK_ERR_NOT_FOUND)
        rc = tk__err(TK_ERR_MANIFEST, "%s: the registry has no info document for commit %s (%s), so tk cannot "
                     "check that the commit holds what it names\nHINT: the registry was not written by 'tk publish' "
                     "or 'tk serve', or by an older tk; its publisher runs 'tk publish' again to record it", ref->name, commit, url);
    if (rc != TK_OK)
        goto done;
    j = json_loadb(body, len, 0, NULL);
    const char *sha = json_string_value(json_object_get(j, "sha"));
    const char *parent = json_string_value(json_object_get(json_object_get(j, "tk"), "parent"));
    if (!sha || strcmp(sha, commit) != 0 || !parent || !tk__is_hex(parent, 40)) {
        rc = tk__err(TK_ERR_MANIFEST, "%s: the info document of commit %s (%s) %s\nHINT: the registry was "
                     "written by an older tk (its publisher runs 'tk publish' again, which records the "
                     "parents), or it is damaged", ref->name, commit, url,
                     !j ? "is not valid JSON" : !sha || strcmp(sha, commit) ? "names another commit"
                                                              : "does not give the commit's parent (tk.parent)");
        goto done;
    }
    char ssha[TK_SHA256_HEX], got[41];
    tk__sha256_hex(ssha, sigtext, siglen);
    const char *names[3] = {"manifest.json", "manifest.json.sig", m->archive.path};
    const char *shas[3] = {msha, ssha, m->archive.sha256};
    if ((rc = tk_hub__tree_commit_id(got, parent, names, shas)) != TK_OK)
        goto done;
    if (strcmp(got, commit) != 0)
        rc = tk__err(TK_ERR_DIGEST, "%s: commit %s does not hold what it names: the files the registry served "
                     "there (%s %s) make commit %s\nHINT: the registry or a mirror put another version's files "
                     "under this commit; do not use it, and report it to the registry's operator",
                     ref->name, commit, m->name, m->version, got);
done:
    json_decref(j);
    free(body);
    free(url);
    return rc;
}

/* Downloads the archive into the store's tmp dir under a name derived from its digest, so a killed
 * get resumes where it stopped. An flock on "<file>.lock" keeps two processes off the same file. */
static int fetch_archive(const tk_hub_env *env, const tk_hub_ref *ref, const char *commit,
                         const tk_hub_manifest *m, char **path_out, int *lock_out, tk_state_pkg **already)
{
    *path_out = NULL;
    *lock_out = -1;
    *already = NULL;
    int rc = TK_OK, lfd = -1;
    char *path = tk__fmt("%s/%s-%s", tk_state__tmp_dir(env->state), m->archive.sha256, m->archive.path);
    char *lock = path ? tk__fmt("%s.lock", path) : NULL;
    char *url = tk__fmt("%s/kernels/%s/%s/resolve/%s/%s", env->endpoint, ref->org, ref->pkg, commit, m->archive.path);
    if (!path || !lock || !url) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((rc = tk__open_nofollow(&lfd, lock, O_RDWR | O_CREAT, 0644)) != TK_OK)
        goto done;
    if (flock(lfd, LOCK_EX) != 0) {
        rc = tk__err_sys("cannot lock", lock);
        goto done;
    }
    /* Another process may have installed this commit while we waited for the lock. */
    if (!env->force && tk_state__pkg_get_commit(already, env->state, ref->name, commit) == TK_OK)
        goto done;
    if (tk__path_exists(path)) {
        char sha[TK_SHA256_HEX];
        int64_t size = 0;
        int hrc = tk__sha256_file_nofollow(sha, &size, path);
        if (hrc == TK_OK && strcmp(sha, m->archive.sha256) == 0)
            goto ok;
        if (hrc != TK_OK && hrc != TK_ERR_NOT_FOUND) { /* a link, or not a file: refused, named */
            rc = hrc;
            goto done;
        }
        unlink(path);
    }
    /* A little slack over the signed size, so an oversized body is reported as the digest mismatch
     * it is rather than as a transfer error. */
    rc = tk_hub__http_get_file(env->http, url, path, m->archive.size + 65536, m->archive.size, m->archive.sha256,
                               NULL);
    if (rc == TK_ERR_DIGEST)
        rc = tk__err_wrap(rc, "%s: the source archive does not match the signed manifest", ref->name);
    if (rc != TK_OK)
        goto done;
ok:
    *path_out = path;
    path = NULL;
    *lock_out = lfd; /* held until the install commits; the lock file itself is never unlinked */
    lfd = -1;
done:
    if (lfd >= 0)
        close(lfd);
    free(path);
    free(lock);
    free(url);
    return rc;
}

/* Unpacks into a staging dir, moves every file into the store and builds the package record. */
static int unpack_and_store(const tk_hub_env *env, const tk_hub_manifest *m, const char *archive,
                            tk_state_pkg *p)
{
    int rc = TK_OK;
    char *stage = tk__tmp_path(tk_state__tmp_dir(env->state), "unpack");
    if (!stage)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    if ((rc = tk__mkdir_new(stage, 0700)) != TK_OK)
        goto done;
    if ((rc = tk_hub__archive_extract(archive, stage, m->files, m->nfiles, NULL)) != TK_OK) {
        rc = tk__err_wrap(rc, "%s", m->name);
        goto done;
    }
    if (!(p->files = calloc(m->nfiles, sizeof *p->files))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < m->nfiles; i++) {
        char *src = tk__path_join(stage, m->files[i].path);
        tk_state_file *f = &p->files[p->nfiles];
        f->path = tk__strdup(m->files[i].path);
        f->sha256 = tk__strdup(m->files[i].sha256);
        f->size = m->files[i].size;
        if (f->path || f->sha256)
            p->nfiles++;
        if (!src || !f->path || !f->sha256)
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
        else
            rc = tk_state__object_put(env->state, src, m->files[i].sha256);
        free(src);
        if (rc != TK_OK)
            goto done;
    }
done:
    tk__rmtree(stage);
    free(stage);
    return rc;
}

int tk_hub__get(tk_state_pkg **out, int *fresh, const tk_hub_env *env, const char *refstr)
{
    *out = NULL;
    if (fresh)
        *fresh = 0;
    tk_hub_ref ref;
    tk_hub_manifest *m = NULL;
    tk_state_pkg *p = NULL, *have = NULL;
    char *mtext = NULL, *sigtext = NULL, *archive = NULL, *seen = NULL;
    size_t mlen = 0, siglen = 0;
    char commit[41] = "", yanked_seen[68] = "";
    int major = 0, locked = 0, in_tx = 0, archive_lock = -1, trust_new = 0;
    int rc = tk_hub__ref_parse(&ref, refstr);
    if (rc != TK_OK)
        return rc;

    if (env->offline || !env->http) {
        rc = tk_hub__installed(out, env->state, refstr);
        if (rc == TK_ERR_NOT_FOUND)
            rc = tk__err(TK_ERR_OFFLINE, "%s is not installed, and tk is offline\n"
                         "HINT: unset TK_OFFLINE (or drop --offline) to download it", refstr);
        return rc;
    }

    /* 1. Resolve to a commit, and stop early when that commit is installed. */
    char want[40] = "", downgrade[40] = "";
    if (ref.commit[0]) {
        memcpy(commit, ref.commit, sizeof commit);
    } else if (tk_hub__ref_is_spec(&ref)) {
        /* an exact version or a range: list the versions (each commit checked) and pick */
        tk_hub_version *vs = NULL;
        size_t nv = 0;
        if ((rc = tk_hub__versions(&vs, &nv, env, &ref)) != TK_OK)
            goto done;
        const tk_hub_version *pick = tk_hub__versions_pick(vs, nv, &ref);
        if (!pick) {
            char *avail = tk_hub__versions_str(vs, nv);
            rc = tk__err(TK_ERR_NOT_FOUND, "%s has no version %s%s\nHINT: available: %s%s", ref.name,
                         ref.exact[0] ? ref.exact : "matching ", ref.exact[0] ? "" : ref.range,
                         avail ? avail : "?", ref.range[0] ? " (a range never picks a yanked version; name "
                         "one exactly to install it)" : "");
            free(avail);
        } else {
            memcpy(commit, pick->commit, sizeof commit);
            major = pick->major;
            /* Asked for by version, an older version than one this machine saw is a downgrade the
             * user wants, not a registry rolling it back: allowed when the (checked) listing still
             * holds the version seen, so a stale registry that hides it is still refused. */
            char *sv = NULL;
            if (tk_state__seen_get(&sv, env->state, ref.name, pick->major) == TK_OK && sv &&
                tk_state__version_cmp(pick->version, sv) < 0)
                for (size_t i = 0; i < nv; i++)
                    if (!strcmp(vs[i].version, sv))
                        snprintf(downgrade, sizeof downgrade, "%s", sv);
            free(sv);
            snprintf(want, sizeof want, "%s", pick->version);
            if (pick->yanked)
                say(env, TK_LOG_WARN, "%s %s was yanked by its publisher (%s); installing it because you named "
                    "it exactly", ref.name, pick->version, pick->yank_reason[0] ? pick->yank_reason : "no reason given");
            else
                say(env, TK_LOG_INFO, "%s@%s: using %s (commit %.12s)", ref.name, ref.exact[0] ? ref.exact : ref.range,
                    pick->version, pick->commit);
        }
        free(vs);
        if (rc != TK_OK)
            goto done;
    } else if ((rc = resolve(env, &ref, commit, &major)) != TK_OK) {
        goto done;
    }
    if (!env->force) {
        int hrc = tk_state__pkg_get_commit(&have, env->state, ref.name, commit);
        if (hrc == TK_OK && (!env->expect_manifest || strcmp(have->manifest_sha256, env->expect_manifest) == 0)) {
            *out = have;
            have = NULL;
            goto done;
        }
        if (hrc != TK_OK && hrc != TK_ERR_NOT_FOUND) {
            rc = hrc;
            goto done;
        }
    }

    /* 2. Manifest and signature; the signature is checked before the manifest is parsed. */
    if ((rc = fetch_small(env, &ref, commit, "manifest.json", TK_MANIFEST_MAX, &mtext, &mlen)) != TK_OK)
        goto done;
    if ((rc = fetch_small(env, &ref, commit, "manifest.json.sig", 16384, &sigtext, &siglen)) != TK_OK)
        goto done;
    char keyid[TK_KEYID_LEN], pubkey[TK_PUBKEY_LEN];
    uint8_t sig[64];
    if ((rc = tk_hub__sig_parse(keyid, pubkey, sig, sigtext, siglen)) != TK_OK) {
        rc = tk__err_wrap(rc, "%s", ref.name);
        goto done;
    }
    if ((rc = tk_hub__verify(pubkey, sig, mtext, mlen)) != TK_OK) {
        rc = tk__err(rc, "%s at %s: the signature does not match the manifest (the manifest was altered, or "
                     "signed by another key)\nHINT: do not use this registry copy; report it to the publisher",
                     ref.name, commit);
        goto done;
    }
    if ((rc = check_signer(env, &ref, keyid, pubkey, 1, &trust_new)) != TK_OK)
        goto done;
    char msha[TK_SHA256_HEX];
    tk__sha256_hex(msha, mtext, mlen);
    if (env->expect_manifest && strcmp(msha, env->expect_manifest) != 0) {
        rc = tk__err(TK_ERR_DIGEST, "%s at %s: the manifest's sha256 is %s, but the lock file pins %s",
                     ref.name, commit, msha, env->expect_manifest);
        goto done;
    }

    /* 3. Parse and cross-check the manifest. */
    if ((rc = tk_hub__manifest_parse(&m, mtext, mlen)) != TK_OK) {
        rc = tk__err_wrap(rc, "%s at %s", ref.name, commit);
        goto done;
    }
    if (strcmp(m->name, ref.name) != 0) {
        rc = tk__err(TK_ERR_MANIFEST, "the registry served the manifest of %s when %s was asked for", m->name,
                     ref.name);
        goto done;
    }
    if ((rc = check_commit(env, &ref, commit, msha, sigtext, siglen, m)) != TK_OK)
        goto done;
    if (want[0] && strcmp(m->version, want) != 0) {
        rc = tk__err(TK_ERR_MANIFEST, "%s: commit %s holds version %s, not %s", ref.name, commit, m->version, want);
        goto done;
    }
    if (major && m->major != major) {
        rc = tk__err(TK_ERR_MANIFEST, "%s: branch v%d holds version %s (major %d)", ref.name, major, m->version,
                     m->major);
        goto done;
    }
    if ((rc = tk_state__seen_get(&seen, env->state, m->name, m->major)) != TK_OK)
        goto done;
    char yank_reason[512] = "";
    if (seen && tk_state__version_cmp(m->version, seen) < 0 && !ref.commit[0] &&
        yanked_by_publisher(env, &ref, seen, yank_reason, sizeof yank_reason) == TK_OK) {
        /* the publisher withdrew the newer version it saw: the branch moved back on purpose */
        say(env, TK_LOG_WARN, "%s %s was yanked by its publisher (%s); installing %s", m->name, seen, yank_reason,
            m->version);
        snprintf(yanked_seen, sizeof yanked_seen, "%s", seen);
    } else if (seen && downgrade[0] && !strcmp(seen, downgrade)) {
        say(env, TK_LOG_INFO, "%s: installing %s, older than %s which this machine has seen, because you asked for "
            "it by version", m->name, m->version, seen);
    } else if (seen && tk_state__version_cmp(m->version, seen) < 0) {
        rc = tk__err(TK_ERR_ROLLBACK, "%s: the registry offers version %s, older than %s which this machine has "
                     "already seen for major %d (rollback refused)\nHINT: the registry may be stale or "
                     "compromised; if the downgrade is intended, pin the commit in a lock file",
                     m->name, m->version, seen, m->major);
        goto done;
    }
    if (env->validate && (rc = env->validate(env->validate_user, mtext, mlen)) != TK_OK) {
        rc = tk__err_wrap(rc, "%s %s", m->name, m->version);
        goto done;
    }

    /* 4. Archive, unpack, store, commit. */
    if ((rc = tk_state__lock_store(env->state, 0)) != TK_OK)
        goto done;
    locked = 1;
    say(env, TK_LOG_INFO, "%s %s: downloading %s (%lld bytes)", m->name, m->version, m->archive.path,
        (long long)m->archive.size);
    if ((rc = fetch_archive(env, &ref, commit, m, &archive, &archive_lock, &have)) != TK_OK)
        goto done;
    if (have) {
        *out = have;
        have = NULL;
        goto done;
    }
    if (!(p = calloc(1, sizeof *p))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((rc = unpack_and_store(env, m, archive, p)) != TK_OK)
        goto done;
    p->name = tk__strdup(m->name);
    p->major = m->major;
    p->version = tk__strdup(m->version);
    p->commit = tk__strdup(commit);
    p->manifest_sha256 = tk__strdup(msha);
    p->manifest = mtext;
    p->manifest_len = mlen;
    mtext = NULL;
    p->signer = tk__strdup(keyid);
    p->registry = tk__strdup(env->endpoint);
    p->installed_at = tk__now();
    if (!p->name || !p->version || !p->commit || !p->manifest_sha256 || !p->signer || !p->registry) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((rc = tk_state__begin(env->state)) != TK_OK)
        goto done;
    in_tx = 1;
    /* Re-check rollback inside the write lock: another process may have installed a newer one. */
    free(seen);
    seen = NULL;
    if ((rc = tk_state__seen_get(&seen, env->state, m->name, m->major)) != TK_OK)
        goto done;
    int yank_accepted = yanked_seen[0] && seen && strcmp(seen, yanked_seen) == 0;
    if (seen && tk_state__version_cmp(m->version, seen) < 0 && !yank_accepted &&
        !(downgrade[0] && !strcmp(seen, downgrade))) {
        rc = tk__err(TK_ERR_ROLLBACK, "%s: version %s is older than %s, installed meanwhile", m->name,
                     m->version, seen);
        goto done;
    }
    if (trust_new) {
        /* first use, recorded with the install; another process may have pinned a key meanwhile */
        char *pinned = NULL;
        if ((rc = tk_state__trust_org_key(&pinned, env->state, ref.org)) != TK_OK)
            goto done;
        if (pinned && strcmp(pinned, keyid) != 0)
            rc = tk__err(TK_ERR_UNTRUSTED, "%s is signed by %s, but org '%s' was pinned to key %s meanwhile",
                         ref.name, keyid, ref.org, pinned);
        else if (!pinned)
            rc = tk_state__trust_add(env->state, ref.org, keyid, pubkey, "added by tk get --trust");
        free(pinned);
        if (rc != TK_OK)
            goto done;
    }
    if ((rc = tk_state__pkg_put(env->state, p)) != TK_OK ||
        (rc = (yank_accepted ? tk_state__seen_set : tk_state__seen_put)(env->state, m->name, m->major, m->version,
                                                                        commit)) != TK_OK)
        goto done;
    if ((rc = tk_state__commit(env->state)) != TK_OK)
        goto done;
    in_tx = 0;
    unlink(archive);
    say(env, TK_LOG_INFO, "%s %s installed (%zu files, commit %.12s)", p->name, p->version, p->nfiles, commit);
    if (fresh)
        *fresh = 1;
    *out = p;
    p = NULL;
done:
    if (in_tx)
        tk_state__rollback(env->state);
    if (archive_lock >= 0)
        close(archive_lock);
    if (locked)
        tk_state__unlock_store(env->state);
    tk_hub__manifest_free(m);
    tk_state__pkg_free(p);
    tk_state__pkg_free(have);
    free(mtext);
    free(sigtext);
    free(archive);
    free(seen);
    return rc;
}
