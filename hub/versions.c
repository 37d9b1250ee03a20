/*
 * versions.c — every version of a package in a registry (`tk versions`, exact versions and ranges
 * in `tk get`, `tk list --outdated`), each commit checked as get checks it (hub/verify.c).
 *
 * Sources, all through the HTTP layer and size-capped:
 *   api/kernels/{org}/{name}/refs               branch heads (v1, v2, ...)
 *   api/kernels/{org}/{name}/revision/{commit}  each commit's info document: "tk"."parent"
 *   api/kernels/{org}/{name}/versions           every commit with its version and publish date,
 *                                               written by tree.c (optional: older trees lack it)
 *   kernels/{org}/{name}/resolve/{commit}/manifest.json and .sig
 *   kernels/{org}/{name}/yanked/{version}.json and .sig
 * The versions document is a hint: it can add commits to check (a yanked head is on no branch's
 * chain) but every commit it names is checked like those reached from the heads.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/common.h"
#include "hub/hub.h"
#include "manifest/manifest.h"
#include "hub/sign.h"
#include "hub/tree.h"
#include "hub/verify.h"

#define say(env, level, ...) tk__logf((env)->log, (env)->log_user, (level), __VA_ARGS__)
#define MAX_COMMITS 4096

typedef struct {
    char (*todo)[41];
    size_t ntodo, cap;
} queue;

static int push(queue *q, const char *c)
{
    for (size_t i = 0; i < q->ntodo; i++)
        if (!strcmp(q->todo[i], c))
            return TK_OK;
    if (q->ntodo >= MAX_COMMITS)
        return tk__err(TK_ERR_MANIFEST,
                       "the registry names more than %d commits for one package; tk stops "
                       "there\nHINT: the registry is damaged or hostile",
                       MAX_COMMITS);
    if (q->ntodo == q->cap) {
        size_t nc = q->cap ? 2 * q->cap : 32;
        void *p = realloc(q->todo, nc * sizeof *q->todo);
        if (!p)
            return tk__err(TK_ERR_NOMEM, "out of memory");
        q->todo = p;
        q->cap = nc;
    }
    memcpy(q->todo[q->ntodo++], c, 41);
    return TK_OK;
}

/* The publisher's yank statement for v, if the registry has one whose signature verifies with the
 * version's signer or a key trusted for the org. A missing statement is no yank; a bad one is
 * reported and ignored (a registry can hide a yank, never make one). */
static void check_yank(const tk_hub_env *env, const tk_hub_ref *ref, tk_hub_version *v)
{
    tk_hub_yank y;
    char *url = NULL;
    int rc = tk_hub__yank_verified(&y, &url, env, ref, v->version, v->signer);
    if (rc == TK_OK) {
        v->yanked = 1;
        snprintf(v->yank_reason, sizeof v->yank_reason, "%s", y.reason);
    } else if (rc != TK_ERR_NOT_FOUND) {
        say(env, TK_LOG_WARN, "%s %s: ignoring the yank statement at %s: %s", ref->name, v->version,
            url ? url : "(out of memory)", tk_last_error());
    }
    free(url);
}

/* Checks one commit as every install checks it (hub/verify.c) and fills v; *parent receives its
 * parent (TK_HUB_NO_PARENT: none). A signer that is not trusted is accepted (v->trusted 0) only
 * while the org has no trusted key at all. */
static int check_one(const tk_hub_env *env, const tk_hub_ref *ref, const char *commit, tk_hub_version *v,
                     char parent[41])
{
    char *murl = tk__fmt("%s/kernels/%s/%s/resolve/%s/manifest.json", env->endpoint, ref->org, ref->pkg, commit);
    char *surl = murl ? tk__fmt("%s.sig", murl) : NULL;
    char *mtext = NULL, *sigtext = NULL;
    size_t mlen = 0, glen = 0;
    tk_manifest *m = NULL;
    char keyid[TK_KEYID_LEN], pubkey[TK_PUBKEY_LEN], msha[TK_SHA256_HEX];
    int rc = surl ? TK_OK : tk__err(TK_ERR_NOMEM, "out of memory");
    memset(v, 0, sizeof *v);
    if (rc == TK_OK && ((rc = tk_hub__get_doc(env, murl, TK_MANIFEST_MAX, &mtext, &mlen)) != TK_OK ||
                        (rc = tk_hub__get_doc(env, surl, TK_HUB_SIG_MAX, &sigtext, &glen)) != TK_OK))
        rc = tk__err_wrap(rc, "%s at commit %s", ref->name, commit);
    if (rc != TK_OK || (rc = tk_hub__manifest_signed(keyid, pubkey, ref, commit, mtext, mlen, sigtext, glen)) != TK_OK)
        goto done;
    rc = tk_hub__signer_trusted(env, ref, keyid, pubkey);
    v->trusted = rc == TK_OK;
    if (rc != TK_OK && (rc != TK_ERR_UNTRUSTED || tk_hub__org_pinned(env, ref->org)))
        goto done; /* the org has a key and this is not it: refused, as get refuses it */
    if ((rc = tk_manifest__parse(&m, mtext, mlen)) != TK_OK) {
        rc = tk__err_wrap(rc, "%s at %s", ref->name, commit);
        goto done;
    }
    tk__sha256_hex(msha, mtext, mlen);
    if ((rc = tk_hub__commit_verify(parent, env, ref, commit, msha, sigtext, glen, m)) != TK_OK)
        goto done;
    snprintf(v->version, sizeof v->version, "%s", m->version);
    memcpy(v->commit, commit, 41);
    v->major = m->major;
    snprintf(v->signer, sizeof v->signer, "%s", keyid);
    snprintf(v->description, sizeof v->description, "%s", m->description ? m->description : "");
done:
    tk_manifest__free(m);
    free(murl);
    free(surl);
    free(mtext);
    free(sigtext);
    return rc;
}

static int by_version_desc(const void *a, const void *b)
{
    const tk_hub_version *x = a, *y = b;
    return tk_state__version_cmp(y->version, x->version);
}

int tk_hub__versions(tk_hub_version **out, size_t *n, const tk_hub_env *env, const tk_hub_ref *ref)
{
    *out = NULL;
    *n = 0;
    if (!env->http)
        return tk__err(TK_ERR_OFFLINE,
                       "listing the versions of %s needs the registry, and tk is offline\n"
                       "HINT: unset TK_OFFLINE (or drop --offline)",
                       ref->name);
    char *rurl = tk__fmt("%s/api/kernels/%s/%s/refs", env->endpoint, ref->org, ref->pkg);
    char *vurl = tk__fmt("%s/api/kernels/%s/%s/versions", env->endpoint, ref->org, ref->pkg);
    char *body = NULL, *vbody = NULL;
    size_t len = 0, vlen = 0;
    json_t *refs = NULL, *vdoc = NULL;
    queue q = {0};
    tk_hub_version *v = NULL;
    size_t nv = 0;
    char heads[64][41];
    size_t nheads = 0;
    int rc = rurl && vurl ? tk_hub__get_doc(env, rurl, 1u << 20, &body, &len) : tk__err(TK_ERR_NOMEM, "out of memory");
    if (rc == TK_ERR_NOT_FOUND) {
        tk_buf hint = TK_BUF_INIT;
        tk_hub__ref_suggest(env, ref->name, &hint);
        rc = tk__err(TK_ERR_NOT_FOUND, "package %s not found in the registry%s", ref->name, hint.data ? hint.data : "");
        tk__buf_free(&hint);
    }
    if (rc != TK_OK)
        goto done;
    refs = json_loadb(body, len, 0, NULL);
    json_t *branches = json_object_get(refs, "branches"), *b;
    size_t i;
    if (!json_is_array(branches)) {
        rc = tk__err(TK_ERR_NETWORK,
                     "the registry's refs for %s are not valid (no 'branches' array)\nHINT: is "
                     "%s a tk or Hub registry?",
                     ref->name, env->endpoint);
        goto done;
    }
    json_array_foreach(branches, i, b) {
        const char *bn = json_string_value(json_object_get(b, "name"));
        const char *tc = json_string_value(json_object_get(b, "targetCommit"));
        int64_t m;
        if (!bn || !tc || bn[0] != 'v' || tk__parse_i64(bn + 1, 1, 1000000, &m) != 0 || !tk__is_hex(tc, 40))
            continue;
        if ((rc = push(&q, tc)) != TK_OK)
            goto done;
        if (nheads < 64)
            memcpy(heads[nheads++], tc, 41);
    }
    /* the versions document: optional, and only a list of commits to check */
    if ((rc = tk_hub__get_doc(env, vurl, 4u << 20, &vbody, &vlen)) == TK_OK) {
        vdoc = json_loadb(vbody, vlen, 0, NULL);
        json_array_foreach(json_object_get(vdoc, "versions"), i, b) {
            const char *c = json_string_value(json_object_get(b, "commit"));
            if (c && tk__is_hex(c, 40) && (rc = push(&q, c)) != TK_OK)
                goto done;
        }
    } else if (rc != TK_ERR_NOT_FOUND) {
        goto done;
    }
    rc = TK_OK;
    if (!(v = calloc(MAX_COMMITS, sizeof *v))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (size_t k = 0; k < q.ntodo; k++) {
        char parent[41];
        if ((rc = check_one(env, ref, q.todo[k], &v[nv], parent)) != TK_OK)
            goto done;
        for (size_t h = 0; h < nheads; h++)
            v[nv].head |= !strcmp(heads[h], v[nv].commit);
        for (size_t e = 0; e < nv; e++)
            if (!strcmp(v[e].version, v[nv].version)) {
                rc = tk__err(TK_ERR_MANIFEST,
                             "%s: version %s is published twice (commits %s and %s)\nHINT: the "
                             "registry is damaged or hostile",
                             ref->name, v[nv].version, v[e].commit, v[nv].commit);
                goto done;
            }
        json_array_foreach(json_object_get(vdoc, "versions"), i, b) {
            const char *c = json_string_value(json_object_get(b, "commit"));
            const char *t = json_string_value(json_object_get(b, "published"));
            if (c && t && !strcmp(c, v[nv].commit))
                snprintf(v[nv].published, sizeof v[nv].published, "%s", t);
        }
        check_yank(env, ref, &v[nv]);
        nv++;
        if (strcmp(parent, TK_HUB_NO_PARENT) != 0 && (rc = push(&q, parent)) != TK_OK)
            goto done;
    }
    qsort(v, nv, sizeof *v, by_version_desc);
    *out = v;
    *n = nv;
    v = NULL;
done:
    free(v);
    free(q.todo);
    json_decref(refs);
    json_decref(vdoc);
    free(body);
    free(vbody);
    free(rurl);
    free(vurl);
    return rc;
}

const tk_hub_version *tk_hub__versions_pick(const tk_hub_version *v, size_t n, const tk_hub_ref *ref)
{
    for (size_t i = 0; i < n; i++) /* newest first */
        if ((!v[i].yanked || ref->exact[0]) && tk_hub__ref_matches(ref, v[i].version))
            return &v[i];
    return NULL;
}

char *tk_hub__versions_str(const tk_hub_version *v, size_t n)
{
    tk_buf b = TK_BUF_INIT;
    for (size_t i = n; i-- > 0;) /* oldest first reads best in a hint */
        tk__buf_printf(&b, "%s%s%s", b.len ? ", " : "", v[i].version, v[i].yanked ? " (yanked)" : "");
    if (!b.data)
        return tk__strdup("none");
    return b.data;
}
