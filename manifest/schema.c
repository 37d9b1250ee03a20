/*
 * schema.c — the keys a kernel.json (or a manifest) may hold, checked everywhere in the document, so a
 * misspelt key ("lanuch", "constraint", "licence") is an error with its line and column and a "did you
 * mean" instead of a field that silently vanishes. docs/kernel.schema.json says the same in JSON
 * Schema for editors; tests/cli/check.sh keeps the two in agreement.
 *
 * jansson keeps no source positions, so a small scanner walks the text again along the JSON path of
 * the offending key to find where it is.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "manifest/manifest.h"

static const char *const K_TOP[] = {"name",    "version", "license",        "description", "compile",
                                    "kernels", "ops",     "device_toolkit", NULL};
static const char *const K_TOP_MANIFEST[] = {"format_version", "files", "archive", NULL};
static const char *const K_COMPILE[] = {"options", NULL};
static const char *const K_KERNEL[] = {"name",        "op",      "source",   "symbol", "params", "launch",
                                       "constraints", "options", "priority", "dtypes", NULL};
static const char *const K_PARAM[] = {"name", "type", "dtype", "value", "optional", NULL};
static const char *const K_LAUNCH[] = {"grid", "block", "smem", NULL};
static const char *const K_CONS[] = {"dtypes", "min_cc", "max_cc", "arch_specific", "max", "min", "align", NULL};
/* ops a package declares: the shape `tk ops --json` prints (manifest/opdecl.c) */
static const char *const K_OP[] = {"name", "summary", "params", NULL};
static const char *const K_OP_PARAM[] = {"name",  "kind",     "role",    "dtypes", "dtype_like",
                                         "shape", "optional", "default", "doc",    NULL};
static const char *const K_FILE[] = {"path", "sha256", "size", NULL};
static const char *const K_ARCHIVE[] = {"path", "sha256", "size", "compression", NULL};

/* ---- source positions --------------------------------------------------------------------------- */

typedef struct {
    const char *key; /* NULL: an array index */
    size_t index;
} pelem;

typedef struct {
    const char *s;
    size_t n, i;
} scan;

static void ws(scan *c)
{
    while (c->i < c->n && (c->s[c->i] == ' ' || c->s[c->i] == '\t' || c->s[c->i] == '\n' || c->s[c->i] == '\r'))
        c->i++;
}

/* Skips a string at c->i (which is '"'); the raw contents are [*b, *e). */
static int skip_str(scan *c, size_t *b, size_t *e)
{
    if (c->i >= c->n || c->s[c->i] != '"')
        return -1;
    c->i++;
    if (b)
        *b = c->i;
    while (c->i < c->n && c->s[c->i] != '"') {
        if (c->s[c->i] == '\\')
            c->i++;
        c->i++;
    }
    if (c->i >= c->n)
        return -1;
    if (e)
        *e = c->i;
    c->i++;
    return 0;
}

static int skip_value(scan *c, int depth)
{
    ws(c);
    if (c->i >= c->n || depth > 64)
        return -1;
    char ch = c->s[c->i];
    if (ch == '"')
        return skip_str(c, NULL, NULL);
    if (ch == '{' || ch == '[') {
        char close = ch == '{' ? '}' : ']';
        c->i++;
        ws(c);
        if (c->i < c->n && c->s[c->i] == close) {
            c->i++;
            return 0;
        }
        for (;;) {
            if (ch == '{') {
                ws(c);
                if (skip_str(c, NULL, NULL) != 0)
                    return -1;
                ws(c);
                if (c->i >= c->n || c->s[c->i] != ':')
                    return -1;
                c->i++;
            }
            if (skip_value(c, depth + 1) != 0)
                return -1;
            ws(c);
            if (c->i < c->n && c->s[c->i] == ',') {
                c->i++;
                continue;
            }
            if (c->i < c->n && c->s[c->i] == close) {
                c->i++;
                return 0;
            }
            return -1;
        }
    }
    while (c->i < c->n && !strchr(",}] \t\r\n", c->s[c->i]))
        c->i++;
    return 0;
}

/* Finds the offset of the last element of path: a key's opening quote, or an array element. */
static int find_pos(const char *s, size_t n, const pelem *path, size_t depth, size_t *off)
{
    scan c = {s, n, 0};
    for (size_t d = 0; d < depth; d++) {
        ws(&c);
        if (c.i >= c.n)
            return -1;
        if (path[d].key) {
            if (c.s[c.i] != '{')
                return -1;
            c.i++;
            for (;;) {
                size_t b, e, at;
                ws(&c);
                at = c.i;
                if (skip_str(&c, &b, &e) != 0)
                    return -1;
                ws(&c);
                if (c.i >= c.n || c.s[c.i] != ':')
                    return -1;
                c.i++;
                if (e - b == strlen(path[d].key) && memcmp(s + b, path[d].key, e - b) == 0) {
                    if (d + 1 == depth) {
                        *off = at;
                        return 0;
                    }
                    break;
                }
                if (skip_value(&c, 0) != 0)
                    return -1;
                ws(&c);
                if (c.i >= c.n || c.s[c.i] != ',')
                    return -1;
                c.i++;
            }
        } else {
            if (c.s[c.i] != '[')
                return -1;
            c.i++;
            for (size_t k = 0; k < path[d].index; k++) {
                if (skip_value(&c, 0) != 0)
                    return -1;
                ws(&c);
                if (c.i >= c.n || c.s[c.i] != ',')
                    return -1;
                c.i++;
            }
            ws(&c);
            if (d + 1 == depth) {
                *off = c.i;
                return 0;
            }
        }
    }
    return -1;
}

int tk_manifest__json_where(char *out, size_t cap, const char *text, size_t n, const char *file,
                            const char *const *keys, const size_t *idx, size_t depth)
{
    pelem path[16];
    size_t off = 0;
    if (depth > 16)
        depth = 16;
    for (size_t d = 0; d < depth; d++) {
        path[d].key = keys[d];
        path[d].index = idx[d];
    }
    out[0] = '\0';
    if (find_pos(text, n, path, depth, &off) != 0)
        return -1;
    size_t line = 1, ls = 0;
    for (size_t i = 0; i < off; i++)
        if (text[i] == '\n') {
            line++;
            ls = i + 1;
        }
    /* a window of the line around the spot, so a long (minified) line still shows it */
    size_t col = off - ls, ws = col > 80 ? off - 60 : ls, le = ws, k = 0;
    while (le < n && text[le] != '\n' && le - ws < 120)
        le++;
    const char *dots = ws > ls ? "..." : "";
    char caret[200];
    for (size_t i = 0; i < strlen(dots); i++)
        caret[k++] = ' ';
    for (size_t i = ws; i < off && k < 160; i++)
        caret[k++] = text[i] == '\t' ? '\t' : ' ';
    caret[k++] = '^';
    caret[k] = '\0';
    snprintf(out, cap, "%s:%zu:%zu|%s%.*s|%s", file ? file : "kernel.json", line, col + 1, dots, (int)(le - ws),
             text + ws, caret);
    return 0;
}

/* ---- the key check ---------------------------------------------------------------------------------- */

typedef struct {
    const char *text;
    size_t n;
    const char *file;
    const char *keys[16];
    size_t idx[16];
    size_t depth;
    const char *kernel;      /* the kernel (or op) being walked, for messages */
    const char *kernel_what;
} walker;

static const char *closest(const char *key, const char *const *known, const char *const *extra)
{
    const char *best = NULL;
    size_t bd = (size_t)-1, len = strlen(key);
    for (int pass = 0; pass < 2; pass++)
        for (const char *const *k = pass ? extra : known; k && *k; k++) {
            size_t d = tk__edit_distance(key, *k);
            /* a swap of two neighbours ("lanuch") counts as one edit */
            if (d == 2 && strlen(*k) == len) {
                size_t diff = 0, first = 0;
                for (size_t i = 0; i < len; i++)
                    if (key[i] != (*k)[i] && diff++ == 0)
                        first = i;
                if (diff == 2 && first + 1 < len && key[first] == (*k)[first + 1] && key[first + 1] == (*k)[first])
                    d = 1;
            }
            if (d < bd) {
                bd = d;
                best = *k;
            }
        }
    return bd <= (len <= 4 ? 1u : 2u) ? best : NULL;
}

static void push(walker *w, const char *key, size_t idx)
{
    if (w->depth < 16) {
        w->keys[w->depth] = key;
        w->idx[w->depth] = idx;
    }
    w->depth++;
}

static int unknown(walker *w, const char *key, const char *const *known, const char *const *extra)
{
    char where[512], pathbuf[200] = "";
    size_t used = 0;
    for (size_t d = 0; d < w->depth && d < 16 && used < sizeof pathbuf - 40; d++) {
        int k = w->keys[d] ? snprintf(pathbuf + used, sizeof pathbuf - used, "%s%s", d ? "." : "", w->keys[d])
                           : snprintf(pathbuf + used, sizeof pathbuf - used, "[%zu]", w->idx[d]);
        used += k > 0 ? (size_t)k : 0;
    }
    push(w, key, 0);
    int found = w->depth <= 16 &&
                tk_manifest__json_where(where, sizeof where, w->text, w->n, w->file, w->keys, w->idx, w->depth) == 0;
    w->depth--;
    char *bar1 = found ? strchr(where, '|') : NULL, *bar2 = bar1 ? strchr(bar1 + 1, '|') : NULL;
    if (bar1 && bar2)
        *bar1 = *bar2 = '\0';
    const char *dym = closest(key, known, extra);
    tk_buf b = TK_BUF_INIT;
    tk__buf_printf(&b, "%s: unknown key '%s'", bar2 ? where : (w->file ? w->file : "kernel.json"), key);
    if (pathbuf[0])
        tk__buf_printf(&b, " in %s", pathbuf);
    if (w->kernel)
        tk__buf_printf(&b, " (%s '%s')", w->kernel_what, w->kernel);
    if (bar2)
        tk__buf_printf(&b, "\n    %s\n    %s", bar1 + 1, bar2 + 1);
    if (dym) {
        tk__buf_printf(&b, "\nHINT: did you mean '%s'?", dym);
    } else {
        tk__buf_puts(&b, "\nHINT: the keys here are");
        for (const char *const *k = known; *k; k++)
            tk__buf_printf(&b, " %s", *k);
        for (const char *const *k = extra; k && *k; k++)
            tk__buf_printf(&b, " %s", *k);
        tk__buf_puts(&b, " (see docs/kernel.schema.json)");
    }
    int rc = tk__err(TK_ERR_MANIFEST, "%s", b.data ? b.data : "unknown key");
    tk__buf_free(&b);
    return rc;
}

static int keys_in(walker *w, json_t *o, const char *const *known, const char *const *extra)
{
    const char *key;
    json_t *v;
    if (!json_is_object(o))
        return TK_OK; /* the type is the validator's business */
    json_object_foreach(o, key, v) {
        int ok = 0;
        for (const char *const *k = known; *k && !ok; k++)
            ok = strcmp(*k, key) == 0;
        for (const char *const *k = extra; k && *k && !ok; k++)
            ok = strcmp(*k, key) == 0;
        if (!ok)
            return unknown(w, key, known, extra);
    }
    return TK_OK;
}

/* `what` ("kernel", "op"): the entries are named things that messages mention; NULL otherwise. */
static int each(walker *w, json_t *arr, const char *key, const char *const *known, const char *what,
                int (*sub)(walker *, json_t *))
{
    size_t i;
    json_t *x;
    int rc;
    if (!json_is_array(arr))
        return TK_OK;
    push(w, key, 0);
    json_array_foreach(arr, i, x) {
        push(w, NULL, i);
        if (what) {
            w->kernel = json_string_value(json_object_get(x, "name"));
            w->kernel_what = what;
        }
        rc = keys_in(w, x, known, NULL);
        if (rc == TK_OK && sub)
            rc = sub(w, x);
        if (what)
            w->kernel = NULL;
        w->depth--;
        if (rc != TK_OK)
            return rc;
    }
    w->depth--;
    return TK_OK;
}

static int sub_object(walker *w, json_t *parent, const char *key, const char *const *known)
{
    push(w, key, 0);
    int rc = keys_in(w, json_object_get(parent, key), known, NULL);
    w->depth--;
    return rc;
}

static int kernel_sub(walker *w, json_t *k)
{
    int rc;
    if ((rc = each(w, json_object_get(k, "params"), "params", K_PARAM, NULL, NULL)) != TK_OK)
        return rc;
    if ((rc = sub_object(w, k, "launch", K_LAUNCH)) != TK_OK)
        return rc;
    return sub_object(w, k, "constraints", K_CONS);
}

static int op_sub(walker *w, json_t *op)
{
    return each(w, json_object_get(op, "params"), "params", K_OP_PARAM, NULL, NULL);
}

int tk_manifest__schema_check(const char *text, size_t n, const char *file, int manifest)
{
    json_error_t jerr;
    json_t *root = json_loadb(text, n, JSON_REJECT_DUPLICATES, &jerr);
    walker w;
    int rc;
    memset(&w, 0, sizeof w);
    w.text = text;
    w.n = n;
    w.file = file;
    if (!root)
        return tk__err(TK_ERR_MANIFEST, "%s:%d:%d: not valid JSON: %s", file ? file : "kernel.json", jerr.line,
                       jerr.column, jerr.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return tk__err(TK_ERR_MANIFEST, "%s: not a JSON object", file ? file : "kernel.json");
    }
    rc = keys_in(&w, root, K_TOP, manifest ? K_TOP_MANIFEST : NULL);
    if (rc == TK_OK)
        rc = sub_object(&w, root, "compile", K_COMPILE);
    if (rc == TK_OK)
        rc = each(&w, json_object_get(root, "kernels"), "kernels", K_KERNEL, "kernel", kernel_sub);
    if (rc == TK_OK)
        rc = each(&w, json_object_get(root, "ops"), "ops", K_OP, "op", op_sub);
    if (rc == TK_OK && manifest) {
        rc = each(&w, json_object_get(root, "files"), "files", K_FILE, NULL, NULL);
        if (rc == TK_OK)
            rc = sub_object(&w, root, "archive", K_ARCHIVE);
    }
    json_decref(root);
    return rc;
}

/* ---- variant expansion ---------------------------------------------------------------------------- */

static const struct {
    const char *dtype, *ctype;
    int size;
} VARIANTS[] = {
    {"f32", "float", 4},
    {"f16", "__half", 2},
    {"bf16", "__nv_bfloat16", 2},
    {"f64", "double", 8},
    {"i8", "signed char", 1},
    {"u8", "unsigned char", 1},
    {"i32", "int", 4},
    {"i64", "long long", 8},
    {"fp8_e4m3", "__nv_fp8_e4m3", 1},
    {"fp8_e5m2", "__nv_fp8_e5m2", 1},
};

/* Replaces {dtype} {T} {size} {vec} in s; an unknown {word} is an error. */
static int subst(tk_buf *out, const char *s, size_t v, const char *kname)
{
    char num[16];
    while (*s) {
        if (*s == '{') {
            const char *e = s + 1;
            while ((*e >= 'a' && *e <= 'z') || (*e >= 'A' && *e <= 'Z') || *e == '_')
                e++;
            if (*e == '}' && e > s + 1) {
                size_t n = (size_t)(e - s - 1);
                const char *rep = NULL;
                if (n == 5 && !memcmp(s + 1, "dtype", 5))
                    rep = VARIANTS[v].dtype;
                else if (n == 1 && s[1] == 'T')
                    rep = VARIANTS[v].ctype;
                else if (n == 4 && !memcmp(s + 1, "size", 4))
                    snprintf(num, sizeof num, "%d", VARIANTS[v].size), rep = num;
                else if (n == 3 && !memcmp(s + 1, "vec", 3))
                    snprintf(num, sizeof num, "%d", 16 / VARIANTS[v].size), rep = num;
                if (!rep)
                    return tk__err(TK_ERR_MANIFEST,
                                   "kernel '%s': '{%.*s}' is not a variant placeholder\nHINT: a "
                                   "kernel with \"dtypes\" may use {dtype} (f16), {T} (__half), {size} (bytes of "
                                   "one element) and {vec} (elements in 16 bytes)",
                                   kname, (int)n, s + 1);
                if (tk__buf_puts(out, rep) != TK_OK)
                    return tk__err(TK_ERR_NOMEM, "out of memory");
                s = e + 1;
                continue;
            }
        }
        if (tk__buf_append(out, s, 1) != TK_OK)
            return tk__err(TK_ERR_NOMEM, "out of memory");
        s++;
    }
    return TK_OK;
}

/* A copy of x with every string (values and object keys) substituted for variant v. */
static int instantiate(json_t **out, json_t *x, size_t v, const char *kname)
{
    int rc = TK_OK;
    *out = NULL;
    if (json_is_string(x)) {
        tk_buf b = TK_BUF_INIT;
        if ((rc = subst(&b, json_string_value(x), v, kname)) == TK_OK)
            *out = json_string(b.data ? b.data : "");
        tk__buf_free(&b);
    } else if (json_is_array(x)) {
        size_t i;
        json_t *e, *c;
        *out = json_array();
        json_array_foreach(x, i, e) {
            if ((rc = instantiate(&c, e, v, kname)) != TK_OK)
                break;
            json_array_append_new(*out, c);
        }
    } else if (json_is_object(x)) {
        const char *key;
        json_t *e, *c;
        *out = json_object();
        json_object_foreach(x, key, e) {
            tk_buf b = TK_BUF_INIT;
            if ((rc = subst(&b, key, v, kname)) != TK_OK || (rc = instantiate(&c, e, v, kname)) != TK_OK) {
                tk__buf_free(&b);
                break;
            }
            json_object_set_new(*out, b.data ? b.data : "", c);
            tk__buf_free(&b);
        }
    } else {
        *out = json_deep_copy(x);
    }
    if (rc != TK_OK || !*out) {
        json_decref(*out);
        *out = NULL;
        return rc != TK_OK ? rc : tk__err(TK_ERR_NOMEM, "out of memory");
    }
    return TK_OK;
}

int tk_manifest__expand_variants(json_t *spec, size_t **origin, size_t *n)
{
    json_t *ks = json_object_get(spec, "kernels"), *out = NULL, *k;
    size_t i, total = 0, *org = NULL;
    int rc = TK_OK;
    if (origin)
        *origin = NULL;
    if (n)
        *n = 0;
    if (!json_is_array(ks))
        return TK_OK;
    if (!(out = json_array()) || !(org = calloc(json_array_size(ks) * 10 + 1, sizeof *org))) {
        json_decref(out);
        free(org);
        return tk__err(TK_ERR_NOMEM, "out of memory");
    }
    json_array_foreach(ks, i, k) {
        json_t *dts = json_object_get(k, "dtypes"), *d;
        const char *kname = json_string_value(json_object_get(k, "name"));
        size_t j;
        if (!dts) {
            json_array_append(out, k);
            org[total++] = i;
            continue;
        }
        if (!kname)
            kname = "(unnamed)";
        if (!json_is_array(dts) || json_array_size(dts) == 0 || json_array_size(dts) > 10) {
            rc = tk__err(TK_ERR_MANIFEST, "kernels[%zu] ('%s'): \"dtypes\" must be a list of 1 to 10 dtypes", i, kname);
            goto done;
        }
        if (!strstr(kname, "{dtype}")) {
            rc = tk__err(TK_ERR_MANIFEST,
                         "kernel '%s': a kernel with \"dtypes\" needs '{dtype}' in its name, so each "
                         "variant has its own (e.g. \"%s_{dtype}\")",
                         kname, kname);
            goto done;
        }
        json_array_foreach(dts, j, d) {
            size_t v;
            const char *ds = json_string_value(d);
            for (v = 0; v < sizeof VARIANTS / sizeof VARIANTS[0]; v++)
                if (ds && !strcmp(ds, VARIANTS[v].dtype))
                    break;
            if (v == sizeof VARIANTS / sizeof VARIANTS[0]) {
                rc = tk__err(TK_ERR_MANIFEST,
                             "kernel '%s': dtypes[%zu] ('%s') is not a dtype; want one of f32 f16 bf16 "
                             "f64 i8 u8 i32 i64 fp8_e4m3 fp8_e5m2",
                             kname, j, ds ? ds : "not a string");
                goto done;
            }
            json_t *c = NULL;
            if ((rc = instantiate(&c, k, v, kname)) != TK_OK)
                goto done;
            json_object_del(c, "dtypes");
            json_array_append_new(out, c);
            org[total++] = i;
        }
    }
    json_object_set(spec, "kernels", out);
    if (origin) {
        *origin = org;
        org = NULL;
    }
    if (n)
        *n = total;
done:
    json_decref(out);
    free(org);
    return rc;
}
