/*
 * ref.c — package references and version specs, the one parser that get (hub/get.c), yank
 * (hub/yank.c) and the version listing (hub/versions.c) share, and the "did you mean" hint for a
 * name no registry has.
 *
 *     org/name                 the highest major's branch head
 *     org/name@2, @v2          the head of branch v2 (the newest version of major 2 not yanked)
 *     org/name@1.0.0           exactly that version (a yanked one installs with a warning)
 *     org/name@>=1.2,<2        the newest version that is not yanked and satisfies every comparator
 *                              (>=, >, <=, <, = or none; MAJOR, MAJOR.MINOR or MAJOR.MINOR.PATCH,
 *                              missing parts are 0)
 *     org/name@<40-hex>        exactly that commit
 *     org/name@<7 to 39 hex>   the one commit that starts so (the 12 hex tk list prints), as git
 *                              takes an abbreviated commit; several: an error listing them
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cache/state.h"
#include "common/common.h"
#include "hub/hub.h"
#include "manifest/manifest.h"

/* One comparator of a range: its operator in op (">=", ">", "<=", "<", "=") and its version padded to
 * MAJOR.MINOR.PATCH in v. p points after it (at ',' or the end). 0 or -1. */
static int comparator(const char **p, char op[3], char v[40])
{
    const char *s = *p;
    size_t o = 0;
    while (o < 2 && (s[o] == '>' || s[o] == '<' || s[o] == '='))
        o++;
    if (o == 2 && s[1] != '=')
        return -1;
    memcpy(op, s, o);
    op[o] = '\0';
    if (!o)
        strcpy(op, "=");
    s += o;
    while (*s == ' ')
        s++;
    size_t n = strcspn(s, ",");
    while (n && s[n - 1] == ' ')
        n--;
    if (n == 0 || n >= 32)
        return -1;
    char raw[32];
    memcpy(raw, s, n);
    raw[n] = '\0';
    int dots = 0;
    for (size_t i = 0; i < n; i++)
        dots += raw[i] == '.';
    snprintf(v, 40, "%s%s", raw, dots == 0 ? ".0.0" : dots == 1 ? ".0" : "");
    if (tk_manifest__version_parse(v, NULL) != 0)
        return -1;
    s += strcspn(s, ",");
    *p = s;
    return 0;
}

static int range_check(const char *range)
{
    const char *p = range;
    char op[3], v[40];
    for (;;) {
        while (*p == ' ')
            p++;
        if (comparator(&p, op, v) != 0)
            return -1;
        if (!*p)
            return 0;
        p++; /* ',' */
    }
}

int tk_hub__ref_parse(tk_hub_ref *out, const char *ref)
{
    memset(out, 0, sizeof *out);
    if (!ref || !*ref)
        return tk__err(TK_ERR_INVALID, "empty package reference\nHINT: use org/name, org/name@2, org/name@1.2.0, "
                                       "org/name@'>=1.2,<2' or org/name@<commit>");
    const char *at = strchr(ref, '@');
    size_t n = at ? (size_t)(at - ref) : strlen(ref);
    if (n >= sizeof out->name)
        return tk__err(TK_ERR_INVALID, "package name too long: '%s'", ref);
    memcpy(out->name, ref, n);
    out->name[n] = '\0';
    int rc = tk_manifest__name_check(out->name, out->org, out->pkg);
    if (rc != TK_OK)
        return rc;
    if (!at)
        return TK_OK;
    const char *v = at + 1;
    int64_t major;
    if (tk__is_hex(v, 40)) {
        memcpy(out->commit, v, 41);
    } else if (tk__parse_i64(v[0] == 'v' ? v + 1 : v, 1, 1000000, &major) == 0) {
        out->major = (int)major;
    } else if (strlen(v) < sizeof out->exact && tk_manifest__version_parse(v, NULL) == 0) {
        snprintf(out->exact, sizeof out->exact, "%s", v);
    } else if (strlen(v) >= 7 && strlen(v) < 40 && strspn(v, "0123456789abcdef") == strlen(v)) {
        snprintf(out->prefix, sizeof out->prefix, "%s", v);
    } else if (strlen(v) >= 4 && strlen(v) < 40 && strspn(v, "0123456789abcdefABCDEF") == strlen(v)) {
        return tk__err(TK_ERR_INVALID,
                       "'%s' is too short for a commit of %s: give at least 7 of its hex digits "
                       "(lower case), or all 40\nHINT: 'tk versions %s' lists the commits",
                       v, out->name, out->name);
    } else if (strlen(v) < sizeof out->range && strpbrk(v, "<>=") && range_check(v) == 0) {
        snprintf(out->range, sizeof out->range, "%s", v);
    } else if (v[0] == '0' && (v[1] == '\0' || v[1] == '.')) {
        return tk__err(TK_ERR_INVALID,
                       "'%s' is not a version of %s: versions start at 1.0.0 (a major is a "
                       "registry branch, v1, v2, ...; there is no v0)\nHINT: use @1, @1.0.0 or a range like "
                       "@'>=1.2,<2'",
                       v, out->name);
    } else {
        return tk__err(TK_ERR_INVALID,
                       "'%s' is not a version of %s\nHINT: use @<major> (like @1 or @v1), an exact "
                       "version (@1.2.0), a range (@'>=1.2,<2': >=, >, <=, <, = joined by commas) or "
                       "@<40-hex commit>",
                       v, out->name);
    }
    return TK_OK;
}

int tk_hub__ref_is_spec(const tk_hub_ref *ref) { return ref->exact[0] || ref->range[0]; }

long tk_hub__ref_pick_prefix(const tk_hub_ref *ref, const char *const *commits, const char *const *versions, size_t n,
                             const char *where)
{
    long pick = -1;
    size_t hits = 0, plen = strlen(ref->prefix);
    tk_buf list = TK_BUF_INIT;
    for (size_t i = 0; i < n; i++) {
        if (strncmp(commits[i], ref->prefix, plen) != 0 || (pick >= 0 && !strcmp(commits[pick], commits[i])))
            continue;
        pick = (long)i;
        hits++;
        tk__buf_printf(&list, "%s%.12s (%s)", list.len ? ", " : "", commits[i], versions[i]);
    }
    if (hits == 0)
        tk__err(TK_ERR_NOT_FOUND,
                "%s has no commit starting with %s %s\nHINT: 'tk versions %s' lists its "
                "versions and commits",
                ref->name, ref->prefix, where, ref->name);
    else if (hits > 1)
        tk__err(TK_ERR_INVALID,
                "%s@%s is ambiguous: %zu commits %s start with it: %s\nHINT: give more of the "
                "commit's hex digits",
                ref->name, ref->prefix, hits, where, list.data ? list.data : "");
    tk__buf_free(&list);
    return hits == 1 ? pick : hits ? -2 : -1;
}

int tk_hub__ref_matches(const tk_hub_ref *ref, const char *version)
{
    if (ref->commit[0] || ref->prefix[0])
        return 0;
    if (ref->exact[0])
        return tk_state__version_cmp(version, ref->exact) == 0;
    int major = 0;
    if (tk_manifest__version_parse(version, &major) != 0)
        return 0;
    if (ref->major)
        return major == ref->major;
    if (!ref->range[0])
        return 1;
    const char *p = ref->range;
    char op[3], v[40];
    for (;;) {
        while (*p == ' ')
            p++;
        if (comparator(&p, op, v) != 0)
            return 0;
        int c = tk_state__version_cmp(version, v);
        if (c == -2)
            return 0;
        int ok = !strcmp(op, ">=")   ? c >= 0
                 : !strcmp(op, ">")  ? c > 0
                 : !strcmp(op, "<=") ? c <= 0
                 : !strcmp(op, "<")  ? c < 0
                                     : c == 0;
        if (!ok)
            return 0;
        if (!*p)
            return 1;
        p++;
    }
}

/* How far candidate package name c is from the typed name t, org and name apart: the sum of the two
 * edit distances, or (size_t)-1 when it is too far to suggest: more than a third of the typed
 * name's length (at least 1), so "nope" suggests nothing but "activaton" suggests "activation". */
static size_t name_distance(const char *t, const char *c)
{
    const char *ts = strchr(t, '/'), *cs = strchr(c, '/');
    if (!ts || !cs || ts - t >= 65 || cs - c >= 65)
        return (size_t)-1;
    char to[65], co[65];
    snprintf(to, sizeof to, "%.*s", (int)(ts - t), t);
    snprintf(co, sizeof co, "%.*s", (int)(cs - c), c);
    size_t dorg = tk__edit_distance(to, co), dname = tk__edit_distance(ts + 1, cs + 1);
    size_t limit = strlen(ts + 1) / 3;
    if (limit < 1)
        limit = 1;
    return dorg == (size_t)-1 || dname == (size_t)-1 || dorg + dname > limit ? (size_t)-1 : dorg + dname;
}

/* "did you mean" from the registry's package list (if it has one) and installed names, only when one
 * is close (name_distance). */
void tk_hub__ref_suggest(const tk_hub_env *env, const char *name, tk_buf *hint)
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
            size_t d = name_distance(name, k);
            if (d < bestd) {
                bestd = d;
                best = k;
            }
        }
    }
    if (tk_state__pkg_names(&names, &nn, env->state) == TK_OK) {
        for (size_t i = 0; i < nn; i++) {
            size_t d = name_distance(name, names[i]);
            if (d < bestd) {
                bestd = d;
                best = names[i];
            }
        }
    }
    if (best && bestd > 0 && bestd != (size_t)-1)
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
