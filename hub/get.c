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
#include "manifest/manifest.h"
#include "hub/sign.h"
#include "hub/tree.h"
#include "hub/verify.h"

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
    } else if (ref.prefix[0]) { /* the one installed commit that starts so */
        tk_state_pkg **all = NULL;
        size_t n = 0, k = 0;
        if ((rc = tk_state__pkg_list(&all, &n, st)) != TK_OK)
            return rc;
        const char **cs = calloc(n + 1, sizeof *cs), **vs = calloc(n + 1, sizeof *vs);
        size_t *at = calloc(n + 1, sizeof *at);
        long pick = -1;
        for (size_t i = 0; cs && vs && at && i < n; i++)
            if (!strcmp(all[i]->name, ref.name)) {
                cs[k] = all[i]->commit;
                vs[k] = all[i]->version;
                at[k++] = i;
            }
        if (!cs || !vs || !at) {
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
        } else if ((pick = tk_hub__ref_pick_prefix(&ref, cs, vs, k, "installed")) < 0) {
            rc = pick == -2 ? TK_ERR_INVALID : TK_ERR_NOT_FOUND;
        } else {
            *out = all[at[pick]];
            all[at[pick]] = NULL;
        }
        free(at);
        free(cs);
        free(vs);
        for (size_t i = 0; i < n; i++)
            tk_state__pkg_free(all[i]);
        free(all);
        if (rc == TK_ERR_INVALID)
            return rc;
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

/* No branch holds what ref asks for (its major, or any major): when that is because the publisher
 * yanked every version of it (a broken first release), the error says so, with the reason, and how
 * to install it anyway. TK_ERR_NOT_FOUND set with that message, or TK_OK when it was not a yank (the
 * caller reports the plain "not found"). */
static int yanked_major(const tk_hub_env *env, const tk_hub_ref *ref)
{
    tk_hub_version *vs = NULL;
    size_t n = 0;
    const tk_hub_version *y = NULL;
    int rc = TK_OK;
    if (tk_hub__versions(&vs, &n, env, ref) != TK_OK)
        return TK_OK;
    for (size_t i = 0; i < n; i++) { /* newest first */
        if (ref->major && vs[i].major != ref->major)
            continue;
        if (!vs[i].yanked) { /* a version the branch should hold: not a yank */
            y = NULL;
            break;
        }
        if (!y)
            y = &vs[i];
    }
    if (y) {
        char major[32] = "";
        if (ref->major)
            snprintf(major, sizeof major, " of major %d", ref->major);
        rc = tk__err(TK_ERR_NOT_FOUND,
                     "%s %s was yanked by its publisher (%s), and %s has no other version%s\n"
                     "HINT: to install it anyway, name it exactly: tk get %s@%s",
                     ref->name, y->version, y->yank_reason[0] ? y->yank_reason : "no reason given", ref->name, major,
                     ref->name, y->version);
    }
    free(vs);
    return rc;
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
        tk_hub__ref_suggest(env, ref->name, &hint);
        rc = tk__err(TK_ERR_NOT_FOUND, "package %s not found in the registry%s", ref->name, hint.data ? hint.data : "");
        tk__buf_free(&hint);
        goto done;
    }
    if (rc != TK_OK)
        goto done;
    json_error_t jerr;
    j = json_loadb(body, len, 0, &jerr);
    json_t *branches = json_object_get(j, "branches");
    if (!json_is_array(branches)) {
        rc = tk__err(TK_ERR_NETWORK,
                     "the registry's refs for %s are not valid (%s)\nHINT: is %s a tk or Hub "
                     "registry?",
                     ref->name, j ? "no 'branches' array" : jerr.text, env->endpoint);
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
        rc = yanked_major(env, ref);
        if (rc == TK_OK && ref->major)
            rc = tk__err(TK_ERR_NOT_FOUND, "%s has no version %d (branch v%d)\nHINT: available: %s", ref->name,
                         ref->major, ref->major, avail.len ? avail.data : "none");
        else if (rc == TK_OK)
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

/* TK_OK when the publisher has withdrawn ref@version with a yank statement signed by a key trusted
 * for the org (hub/yank.c); *reason receives its reason. Anything else (no statement, a bad or
 * untrusted signature, another package or version) is an error, and the caller refuses the rollback. */
static int yanked_by_publisher(const tk_hub_env *env, const tk_hub_ref *ref, const char *version, char *reason,
                               size_t reason_cap)
{
    tk_hub_yank y;
    int rc = tk_hub__yank_verified(&y, NULL, env, ref, version, NULL);
    if (rc == TK_OK)
        snprintf(reason, reason_cap, "%s", y.reason[0] ? y.reason : "no reason given");
    return rc;
}

static int fetch_small(const tk_hub_env *env, const tk_hub_ref *ref, const char *commit, const char *file, size_t max,
                       char **out, size_t *len)
{
    char *url = tk__fmt("%s/kernels/%s/%s/resolve/%s/%s", env->endpoint, ref->org, ref->pkg, commit, file);
    if (!url)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    tk_hub_http_meta meta;
    int rc = tk_hub__http_get_mem(env->http, url, max, out, len, &meta);
    int is_sig = strcmp(file, "manifest.json.sig") == 0;
    if (rc != TK_OK && meta.too_big) /* the package's own file, whatever the transport: refused */
        rc = tk__err(is_sig ? TK_ERR_SIGNATURE : TK_ERR_MANIFEST,
                     "%s at %s: %s is larger than the %zu bytes tk "
                     "accepts for it; tk refuses the package\nHINT: the registry's copy is damaged or hostile; "
                     "report it to the publisher",
                     ref->name, commit, file, max);
    else if (rc == TK_ERR_NOT_FOUND && is_sig)
        rc = tk__err(TK_ERR_SIGNATURE,
                     "%s at %s has no signature (manifest.json.sig is missing); tk refuses "
                     "unsigned packages",
                     ref->name, commit);
    else if (rc == TK_ERR_NOT_FOUND)
        rc = tk__err_wrap(rc, "%s at commit %s", ref->name, commit);
    free(url);
    return rc;
}

/* Downloads the archive into the store's tmp dir under a name derived from its digest, so a killed
 * get resumes where it stopped. An flock on "<file>.lock" keeps two processes off the same file. */
static int fetch_archive(const tk_hub_env *env, const tk_hub_ref *ref, const char *commit, const tk_manifest *m,
                         char **path_out, int *lock_out, tk_state_pkg **already)
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
    rc = tk_hub__http_get_file(env->http, url, path, m->archive.size + 65536, m->archive.size, m->archive.sha256, NULL);
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

/* ---- an install in two steps ------------------------------------------------------------------
 * tk_hub__stage does everything that can fail because of the registry (resolve, download, verify,
 * unpack into a private staging dir); tk_hub__commit moves the staged files into the store and
 * records every package in one transaction. Installing several packages stages them all first, so a
 * refusal of the last one leaves the store as it was. */

struct tk_hub_staged {
    tk_hub_ref ref;
    char *registry;       /* the registry it resolved in */
    char commit[41];
    int major;            /* the branch (or the version a spec picked) it resolved to; 0: by commit */
    char want[40];        /* the version a spec picked, "" none */
    char downgrade[40];   /* a version seen that the user's spec goes below on purpose, "" none */
    char yanked_seen[68]; /* the version seen, withdrawn by its publisher: the branch moved back */
    char keyid[TK_KEYID_LEN], pubkey[TK_PUBKEY_LEN];
    int trust_new;        /* trust the signer on first use, recorded in the install's transaction */
    tk_state_pkg *have;   /* installed already at the resolved commit: nothing to commit */
    tk_state_pkg *p;      /* the record to install; p->files are in dir */
    char *dir;            /* the staging dir (store/tmp/unpack-*) holding the verified files */
};

void tk_hub__staged_free(tk_hub_staged *s)
{
    if (!s)
        return;
    if (s->dir) {
        tk__rmtree(s->dir);
        free(s->dir);
    }
    tk_state__pkg_free(s->have);
    tk_state__pkg_free(s->p);
    free(s->registry);
    free(s);
}

/* Offline: only what is installed resolves. */
static int stage_offline(tk_hub_staged *s, const tk_hub_env *env, const char *refstr)
{
    int rc = tk_hub__installed(&s->have, env->state, refstr);
    if (rc == TK_ERR_NOT_FOUND)
        rc = tk__err(TK_ERR_OFFLINE,
                     "%s is not installed, and tk is offline\n"
                     "HINT: unset TK_OFFLINE (or drop --offline) to download it",
                     refstr);
    return rc;
}

/* The registry the package resolves in: the only candidate, or the first of env->search whose refs
 * document for it exists. A registry that fails otherwise (down, not a registry) stops the search:
 * tk never takes a package from a later registry because an earlier one could not answer. */
int tk_hub__pick_registry(char **out, const tk_hub_env *env, const tk_hub_ref *ref)
{
    *out = NULL;
    if (env->nsearch <= 1) {
        *out = tk__strdup(env->nsearch ? env->search[0] : env->endpoint);
        return *out ? TK_OK : tk__err(TK_ERR_NOMEM, "out of memory");
    }
    tk_buf looked = TK_BUF_INIT;
    int rc = TK_ERR_NOT_FOUND;
    for (size_t i = 0; i < env->nsearch && rc == TK_ERR_NOT_FOUND; i++) {
        char *url = tk__fmt("%s/api/kernels/%s/%s/refs", env->search[i], ref->org, ref->pkg), *body = NULL;
        rc = url ? tk_hub__http_get_mem(env->http, url, 1u << 20, &body, NULL, NULL)
                 : tk__err(TK_ERR_NOMEM, "out of memory");
        if (rc == TK_OK && !(*out = tk__strdup(env->search[i])))
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
        else if (rc != TK_OK && rc != TK_ERR_NOT_FOUND)
            rc = tk__err_wrap(rc, "registry %s (searched for %s)", env->search[i], ref->name);
        tk__buf_printf(&looked, "%s%s", i ? ", " : "", env->search[i]);
        free(body);
        free(url);
    }
    if (rc == TK_ERR_NOT_FOUND) {
        tk_buf hint = TK_BUF_INIT;
        tk_hub_env first = *env;
        first.endpoint = env->search[0];
        tk_hub__ref_suggest(&first, ref->name, &hint);
        rc = tk__err(TK_ERR_NOT_FOUND, "package %s is in none of the configured registries (%s)%s", ref->name,
                     looked.data ? looked.data : "", hint.data ? hint.data : "");
        tk__buf_free(&hint);
    } else if (rc == TK_OK) {
        say(env, TK_LOG_DEBUG, "%s: found in registry %s", ref->name, *out);
    }
    tk__buf_free(&looked);
    return rc;
}

/* An exact version or a range: list the versions (each commit checked) and pick. */
static int resolve_spec(const tk_hub_env *env, tk_hub_staged *s)
{
    const tk_hub_ref *ref = &s->ref;
    tk_hub_version *vs = NULL;
    size_t nv = 0;
    int rc = tk_hub__versions(&vs, &nv, env, ref);
    if (rc != TK_OK)
        return rc;
    const tk_hub_version *pick = tk_hub__versions_pick(vs, nv, ref);
    if (!pick) {
        char *avail = tk_hub__versions_str(vs, nv);
        rc = tk__err(TK_ERR_NOT_FOUND, "%s has no version %s%s\nHINT: available: %s%s", ref->name,
                     ref->exact[0] ? ref->exact : "matching ", ref->exact[0] ? "" : ref->range, avail ? avail : "?",
                     ref->range[0] ? " (a range never picks a yanked version; name one exactly to install it)" : "");
        free(avail);
        free(vs);
        return rc;
    }
    memcpy(s->commit, pick->commit, sizeof s->commit);
    s->major = pick->major;
    /* Asked for by version, an older version than one this machine saw is a downgrade the user
     * wants, not a registry rolling it back: allowed when the (checked) listing still holds the
     * version seen, so a stale registry that hides it is still refused. */
    char *sv = NULL;
    if (tk_state__seen_get(&sv, env->state, ref->name, pick->major) == TK_OK && sv &&
        tk_state__version_cmp(pick->version, sv) < 0)
        for (size_t i = 0; i < nv; i++)
            if (!strcmp(vs[i].version, sv))
                snprintf(s->downgrade, sizeof s->downgrade, "%s", sv);
    free(sv);
    snprintf(s->want, sizeof s->want, "%s", pick->version);
    if (pick->yanked)
        say(env, TK_LOG_WARN, "%s %s was yanked by its publisher (%s); installing it because you named it exactly",
            ref->name, pick->version, pick->yank_reason[0] ? pick->yank_reason : "no reason given");
    else
        say(env, TK_LOG_INFO, "%s@%s: using %s (commit %.12s)", ref->name, ref->exact[0] ? ref->exact : ref->range,
            pick->version, pick->commit);
    free(vs);
    return TK_OK;
}

/* A commit prefix (@1a2b3c4): the one commit of the package's versions (each checked, as tk versions
 * checks them) that starts so; it becomes the reference's exact commit. */
static int resolve_prefix(const tk_hub_env *env, tk_hub_ref *ref)
{
    tk_hub_version *vs = NULL;
    size_t n = 0;
    int rc = tk_hub__versions(&vs, &n, env, ref);
    const char **cs = rc == TK_OK ? calloc(n + 1, sizeof *cs) : NULL,
               **vv = rc == TK_OK ? calloc(n + 1, sizeof *vv) : NULL;
    if (rc == TK_OK && (!cs || !vv))
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
    for (size_t i = 0; rc == TK_OK && i < n; i++) {
        cs[i] = vs[i].commit;
        vv[i] = vs[i].version;
    }
    if (rc == TK_OK) {
        long pick = tk_hub__ref_pick_prefix(ref, cs, vv, n, "in the registry");
        if (pick >= 0) {
            memcpy(ref->commit, vs[pick].commit, sizeof ref->commit);
            say(env, TK_LOG_INFO, "%s@%s: commit %s (%s)", ref->name, ref->prefix, vs[pick].commit, vs[pick].version);
            ref->prefix[0] = '\0';
        } else {
            rc = pick == -2 ? TK_ERR_INVALID : TK_ERR_NOT_FOUND;
        }
    }
    free(cs);
    free(vv);
    free(vs);
    return rc;
}

/* Step 1: the commit the reference names, and the installed package when that commit is installed
 * already (s->have: nothing more to do). */
static int resolve_commit(const tk_hub_env *env, tk_hub_staged *s)
{
    int rc = TK_OK;
    if (s->ref.prefix[0] && (rc = resolve_prefix(env, &s->ref)) != TK_OK)
        return rc;
    if (s->ref.commit[0])
        memcpy(s->commit, s->ref.commit, sizeof s->commit);
    else if (tk_hub__ref_is_spec(&s->ref))
        rc = resolve_spec(env, s);
    else
        rc = resolve(env, &s->ref, s->commit, &s->major);
    if (rc != TK_OK || env->force)
        return rc;
    rc = tk_state__pkg_get_commit(&s->have, env->state, s->ref.name, s->commit);
    if (rc == TK_OK && env->expect_manifest && strcmp(s->have->manifest_sha256, env->expect_manifest) != 0) {
        tk_state__pkg_free(s->have); /* installed, but not what the lock pins: fetch and let it fail */
        s->have = NULL;
    }
    return rc == TK_ERR_NOT_FOUND ? TK_OK : rc;
}

/* Step 2: the manifest and its signature, checked (signature, trusted signer, pins) before the
 * manifest is parsed. msha receives the manifest's sha256. */
static int fetch_signed(const tk_hub_env *env, tk_hub_staged *s, char **mtext, size_t *mlen, char **sigtext,
                        size_t *siglen, char msha[TK_SHA256_HEX])
{
    const tk_hub_ref *ref = &s->ref;
    int rc;
    if ((rc = fetch_small(env, ref, s->commit, "manifest.json", TK_MANIFEST_MAX, mtext, mlen)) != TK_OK ||
        (rc = fetch_small(env, ref, s->commit, "manifest.json.sig", TK_HUB_SIG_MAX, sigtext, siglen)) != TK_OK ||
        (rc = tk_hub__manifest_signed(s->keyid, s->pubkey, ref, s->commit, *mtext, *mlen, *sigtext, *siglen)) !=
            TK_OK ||
        (rc = tk_hub__signer_check(env, ref, s->keyid, s->pubkey, 1, &s->trust_new)) != TK_OK)
        return rc;
    if (env->expect_signer && strcmp(s->keyid, env->expect_signer) != 0)
        return tk__err(TK_ERR_UNTRUSTED,
                       "%s at %s is signed by %s, but the lock file pins signer %s\nHINT: the "
                       "publisher's key changed since the lock was written; check with the publisher, then run "
                       "'tk lock' again",
                       ref->name, s->commit, s->keyid, env->expect_signer);
    tk__sha256_hex(msha, *mtext, *mlen);
    if (env->expect_manifest && strcmp(msha, env->expect_manifest) != 0)
        return tk__err(TK_ERR_DIGEST, "%s at %s: the manifest's sha256 is %s, but the lock file pins %s", ref->name,
                       s->commit, msha, env->expect_manifest);
    return TK_OK;
}

/* Step 3: the parsed manifest is the one asked for: its name, the commit id, the version a spec
 * picked, the branch's major. */
static int check_manifest(const tk_hub_env *env, const tk_hub_staged *s, const tk_manifest *m, const char *msha,
                          const char *sigtext, size_t siglen)
{
    int rc;
    if ((rc = tk_hub__commit_verify(NULL, env, &s->ref, s->commit, msha, sigtext, siglen, m)) != TK_OK)
        return rc;
    if (s->want[0] && strcmp(m->version, s->want) != 0)
        return tk__err(TK_ERR_MANIFEST, "%s: commit %s holds version %s, not %s", s->ref.name, s->commit, m->version,
                       s->want);
    if (s->major && m->major != s->major)
        return tk__err(TK_ERR_MANIFEST, "%s: branch v%d holds version %s (major %d)", s->ref.name, s->major, m->version,
                       m->major);
    return TK_OK;
}

/* Step 3, continued: a version older than the newest this machine has seen of its major is a
 * rollback, refused unless the publisher yanked the newer one or the user asked for it by version. */
static int check_rollback(const tk_hub_env *env, tk_hub_staged *s, const tk_manifest *m)
{
    char *seen = NULL, yank_reason[512] = "";
    int rc = tk_state__seen_get(&seen, env->state, m->name, m->major);
    if (rc != TK_OK || !seen || tk_state__version_cmp(m->version, seen) >= 0) {
        free(seen);
        return rc;
    }
    if (!s->ref.commit[0] && yanked_by_publisher(env, &s->ref, seen, yank_reason, sizeof yank_reason) == TK_OK) {
        /* the publisher withdrew the newer version it saw: the branch moved back on purpose */
        say(env, TK_LOG_WARN, "%s %s was yanked by its publisher (%s); installing %s", m->name, seen, yank_reason,
            m->version);
        snprintf(s->yanked_seen, sizeof s->yanked_seen, "%s", seen);
    } else if (s->downgrade[0] && !strcmp(seen, s->downgrade)) {
        say(env, TK_LOG_INFO,
            "%s: installing %s, older than %s which this machine has seen, because you asked for "
            "it by version",
            m->name, m->version, seen);
    } else {
        rc = tk__err(TK_ERR_ROLLBACK,
                     "%s: the registry offers version %s, older than %s which this machine has "
                     "already seen for major %d (rollback refused)\nHINT: the registry may be stale or "
                     "compromised; if the downgrade is intended, pin the commit in a lock file",
                     m->name, m->version, seen, m->major);
    }
    free(seen);
    return rc;
}

/* Step 4: downloads the archive (its sha256 checked), unpacks it into a private staging dir (the
 * allowlist and every file's digest checked) and drops the download. s->have is set instead when
 * another process installed the commit meanwhile. */
static int fetch_and_unpack(const tk_hub_env *env, tk_hub_staged *s, const tk_manifest *m)
{
    char *archive = NULL;
    int archive_lock = -1;
    say(env, TK_LOG_INFO, "%s %s: downloading %s (%lld bytes)", m->name, m->version, m->archive.path,
        (long long)m->archive.size);
    int rc = fetch_archive(env, &s->ref, s->commit, m, &archive, &archive_lock, &s->have);
    if (rc != TK_OK || s->have)
        goto done;
    if (!(s->dir = tk__tmp_path(tk_state__tmp_dir(env->state), "unpack"))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((rc = tk__mkdir_new(s->dir, 0700)) != TK_OK) {
        free(s->dir);
        s->dir = NULL;
        goto done;
    }
    if ((rc = tk_hub__archive_extract(archive, s->dir, m->files, m->nfiles, NULL)) != TK_OK)
        rc = tk__err_wrap(rc, "%s", m->name);
    else
        unlink(archive); /* unpacked and verified: a failed commit downloads it again */
done:
    if (archive_lock >= 0)
        close(archive_lock);
    free(archive);
    return rc;
}

/* The package record the commit writes, from the verified manifest (takes *mtext). */
static int make_record(tk_hub_staged *s, const tk_manifest *m, const char *msha, char **mtext, size_t mlen)
{
    tk_state_pkg *p = s->p = calloc(1, sizeof *p);
    if (!p || (m->nfiles && !(p->files = calloc(m->nfiles, sizeof *p->files))))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    for (; p->nfiles < m->nfiles; p->nfiles++) {
        tk_state_file *f = &p->files[p->nfiles];
        f->path = tk__strdup(m->files[p->nfiles].path);
        f->sha256 = tk__strdup(m->files[p->nfiles].sha256);
        f->size = m->files[p->nfiles].size;
        if (!f->path || !f->sha256) {
            p->nfiles++;
            return tk__err(TK_ERR_NOMEM, "out of memory");
        }
    }
    p->name = tk__strdup(m->name);
    p->major = m->major;
    p->version = tk__strdup(m->version);
    p->commit = tk__strdup(s->commit);
    p->manifest_sha256 = tk__strdup(msha);
    p->manifest = *mtext;
    p->manifest_len = mlen;
    *mtext = NULL;
    p->signer = tk__strdup(s->keyid);
    p->registry = tk__strdup(s->registry);
    p->installed_at = tk__now();
    if (!p->name || !p->version || !p->commit || !p->manifest_sha256 || !p->signer || !p->registry)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    return TK_OK;
}

int tk_hub__stage(tk_hub_staged **out, const tk_hub_env *env0, const char *refstr)
{
    *out = NULL;
    tk_hub_env env = *env0;
    tk_manifest *m = NULL;
    char *mtext = NULL, *sigtext = NULL, msha[TK_SHA256_HEX];
    size_t mlen = 0, siglen = 0;
    int rc;
    tk_hub_staged *s = calloc(1, sizeof *s);
    if (!s)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    if ((rc = tk_hub__ref_parse(&s->ref, refstr)) != TK_OK)
        goto done;
    if (env.offline || !env.http) {
        rc = stage_offline(s, &env, refstr);
        goto done;
    }
    if ((rc = tk_hub__pick_registry(&s->registry, &env, &s->ref)) != TK_OK)
        goto done;
    env.endpoint = s->registry;
    /* 1. Resolve to a commit, and stop early when that commit is installed. */
    if ((rc = resolve_commit(&env, s)) != TK_OK || s->have)
        goto done;
    /* 2. Manifest and signature; the signature is checked before the manifest is parsed. */
    if ((rc = fetch_signed(&env, s, &mtext, &mlen, &sigtext, &siglen, msha)) != TK_OK)
        goto done;
    /* 3. Parse and cross-check the manifest; rollback; its kernels (manifest/validate.c), then the checks
     * that need the installed packages (the hook). */
    if ((rc = tk_manifest__parse(&m, mtext, mlen)) != TK_OK) {
        rc = tk__err_wrap(rc, "%s at %s", s->ref.name, s->commit);
        goto done;
    }
    if ((rc = check_manifest(&env, s, m, msha, sigtext, siglen)) != TK_OK || (rc = check_rollback(&env, s, m)) != TK_OK)
        goto done;
    if ((rc = tk_manifest__validate_json(m->root, NULL, NULL)) != TK_OK ||
        (env.validate && (rc = env.validate(env.validate_user, mtext, mlen)) != TK_OK)) {
        rc = tk__err_wrap(rc, "%s %s", m->name, m->version);
        goto done;
    }
    /* 4. Archive into staging, every file verified; the record the commit will write. */
    if ((rc = fetch_and_unpack(&env, s, m)) != TK_OK || s->have)
        goto done;
    rc = make_record(s, m, msha, &mtext, mlen);
done:
    tk_manifest__free(m);
    free(mtext);
    free(sigtext);
    if (rc != TK_OK)
        tk_hub__staged_free(s);
    else
        *out = s;
    return rc;
}

/* Inside the commit's transaction: re-checks rollback (another process may have installed a newer
 * version meanwhile), trusts a first-use signer, writes the package's rows. */
static int record_one(const tk_hub_env *env, const tk_hub_staged *s)
{
    const tk_state_pkg *p = s->p;
    char *seen = NULL, *pinned = NULL;
    int rc = tk_state__seen_get(&seen, env->state, p->name, p->major);
    int yank_accepted = s->yanked_seen[0] && seen && strcmp(seen, s->yanked_seen) == 0;
    if (rc == TK_OK && seen && tk_state__version_cmp(p->version, seen) < 0 && !yank_accepted &&
        !(s->downgrade[0] && !strcmp(seen, s->downgrade)))
        rc =
            tk__err(TK_ERR_ROLLBACK, "%s: version %s is older than %s, installed meanwhile", p->name, p->version, seen);
    if (rc == TK_OK && s->trust_new) {
        /* first use, recorded with the install; another process may have pinned a key meanwhile */
        if ((rc = tk_state__trust_org_key(&pinned, env->state, s->ref.org)) == TK_OK && pinned &&
            strcmp(pinned, s->keyid) != 0)
            rc = tk__err(TK_ERR_UNTRUSTED, "%s is signed by %s, but org '%s' was pinned to key %s meanwhile", p->name,
                         s->keyid, s->ref.org, pinned);
        else if (rc == TK_OK && !pinned)
            rc = tk_state__trust_add(env->state, s->ref.org, s->keyid, s->pubkey, "added by tk get --trust");
    }
    if (rc == TK_OK && (rc = tk_state__pkg_put(env->state, p)) == TK_OK)
        rc = (yank_accepted ? tk_state__seen_set : tk_state__seen_put)(env->state, p->name, p->major, p->version,
                                                                       p->commit);
    free(seen);
    free(pinned);
    return rc;
}

/* Moves a staged package's files into the store. An object no row references yet is invisible to
 * readers, and GC (which the store lock holds off until the commit) removes it if the commit fails. */
static int put_files(const tk_hub_env *env, const tk_hub_staged *s)
{
    int rc = TK_OK;
    for (size_t i = 0; i < s->p->nfiles && rc == TK_OK; i++) {
        char *src = tk__path_join(s->dir, s->p->files[i].path);
        rc =
            src ? tk_state__object_put(env->state, src, s->p->files[i].sha256) : tk__err(TK_ERR_NOMEM, "out of memory");
        free(src);
    }
    return rc;
}

int tk_hub__commit(tk_state_pkg **outs, int *fresh, tk_hub_staged *const *v, size_t n, const tk_hub_env *env)
{
    int rc = TK_OK;
    for (size_t i = 0; i < n; i++) {
        outs[i] = NULL;
        fresh[i] = 0;
    }
    for (size_t i = 0; i < n && rc == TK_OK; i++)
        if (v[i]->p)
            rc = put_files(env, v[i]);
    if (rc != TK_OK || (rc = tk_state__begin(env->state)) != TK_OK)
        return rc;
    for (size_t i = 0; i < n && rc == TK_OK; i++)
        if (v[i]->p)
            rc = record_one(env, v[i]);
    if (rc != TK_OK || (rc = tk_state__commit(env->state)) != TK_OK) {
        tk_state__rollback(env->state);
        return rc;
    }
    for (size_t i = 0; i < n; i++) { /* hand the records out */
        tk_hub_staged *s = v[i];
        fresh[i] = s->p != NULL;
        if (s->p)
            say(env, TK_LOG_INFO, "%s %s installed (%zu files, commit %.12s)", s->p->name, s->p->version, s->p->nfiles,
                s->p->commit);
        outs[i] = s->p ? s->p : s->have;
        s->p = s->have = NULL;
    }
    return TK_OK;
}

int tk_hub__get_all(tk_state_pkg **outs, int *fresh, const tk_hub_env *envs, const char *const *refs, size_t n)
{
    tk_hub_staged **v = calloc(n ? n : 1, sizeof *v);
    int rc = v ? TK_OK : tk__err(TK_ERR_NOMEM, "out of memory"), locked = 0;
    for (size_t i = 0; i < n; i++) {
        outs[i] = NULL;
        fresh[i] = 0;
    }
    if (n == 0) { /* nothing to install (an empty project or lock) */
        free(v);
        return rc;
    }
    /* The store's shared lock keeps GC off the staging dirs and the objects until the rows commit. */
    if (rc == TK_OK && !envs[0].offline && (rc = tk_state__lock_store(envs[0].state, 0)) == TK_OK)
        locked = 1;
    for (size_t i = 0; i < n && rc == TK_OK; i++)
        rc = tk_hub__stage(&v[i], &envs[i], refs[i]);
    if (rc == TK_OK)
        rc = tk_hub__commit(outs, fresh, v, n, &envs[0]);
    for (size_t i = 0; v && i < n; i++)
        tk_hub__staged_free(v[i]);
    free(v);
    if (locked)
        tk_state__unlock_store(envs[0].state);
    return rc;
}

int tk_hub__get(tk_state_pkg **out, int *fresh, const tk_hub_env *env, const char *refstr)
{
    int f = 0;
    int rc = tk_hub__get_all(out, &f, env, &refstr, 1);
    if (fresh)
        *fresh = f;
    return rc;
}
