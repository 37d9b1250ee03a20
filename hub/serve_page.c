/*
 * serve_page.c — the HTML page of `tk serve`: the packages of the tree with their versions, signers,
 * ops and kernels, a search (?q=), and one package's page with its README (?p=; Markdown through cmark with
 * CMARK_OPT_SAFE; every other string escaped). Read-only over the tree.
 */
#define _GNU_SOURCE /* strcasestr */
#include <ctype.h>
#include <archive.h>
#include <archive_entry.h>
#include <cmark.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <microhttpd.h>

#include "common/common.h"
#include "hub/hub.h"
#include "manifest/manifest.h"
#include "hub/serve.h"
#include "hub/serve_int.h"
#include "hub/tree.h"
#include "hub/sign.h"

/* ---- the HTML page ------------------------------------------------------------------------------- */

static void html_esc(tk_buf *b, const char *s)
{
    for (; s && *s; s++) {
        switch (*s) {
        case '<': tk__buf_puts(b, "&lt;"); break;
        case '>': tk__buf_puts(b, "&gt;"); break;
        case '&': tk__buf_puts(b, "&amp;"); break;
        case '"': tk__buf_puts(b, "&quot;"); break;
        case '\'': tk__buf_puts(b, "&#39;"); break;
        default: tk__buf_append(b, s, 1);
        }
    }
}

/* The README of a source archive (first 64 KiB), or NULL; *markdown: its name ends in .md or
 * .markdown. */
static char *archive_readme(const char *path, int *markdown)
{
    struct archive *a = archive_read_new();
    char *out = NULL;
    *markdown = 0;
    if (!a)
        return NULL;
    archive_read_support_filter_gzip(a);
    archive_read_support_filter_zstd(a);
    archive_read_support_format_tar(a);
    struct archive_entry *e;
    if (archive_read_open_filename(a, path, 1 << 16) == ARCHIVE_OK) {
        for (int i = 0; i < 10000 && archive_read_next_header(a, &e) == ARCHIVE_OK; i++) {
            const char *p = archive_entry_pathname(e);
            if (!p || strncasecmp(p, "README", 6) != 0 || strchr(p, '/') || archive_entry_filetype(e) != AE_IFREG)
                continue;
            char *buf = malloc(README_MAX + 1);
            la_ssize_t n = buf ? archive_read_data(a, buf, README_MAX) : -1;
            if (n >= 0) {
                buf[n] = '\0';
                out = buf;
                const char *dot = strrchr(p, '.');
                *markdown = dot && (!strcasecmp(dot, ".md") || !strcasecmp(dot, ".markdown"));
            } else {
                free(buf);
            }
            break;
        }
    }
    archive_read_free(a);
    return out;
}

/* A README into the page: Markdown rendered by cmark with CMARK_OPT_SAFE (raw HTML dropped, javascript:,
 * vbscript:, file: and data: links emptied), anything else as escaped preformatted text. The page's
 * Content-Security-Policy (no scripts, no outside content) stands behind both. */
static void page_readme(tk_buf *b, const char *readme, int markdown, int detail)
{
    if (!readme)
        return;
    tk__buf_puts(b, detail ? "<h3>README</h3>" : "<details><summary>README</summary>");
    char *html = markdown ? cmark_markdown_to_html(readme, strlen(readme), CMARK_OPT_SAFE) : NULL;
    if (html) {
        tk__buf_puts(b, "<div class=readme>");
        tk__buf_puts(b, html);
        tk__buf_puts(b, "</div>");
    } else {
        tk__buf_puts(b, "<pre>");
        html_esc(b, readme);
        tk__buf_puts(b, "</pre>");
    }
    free(html);
    tk__buf_puts(b, detail ? "" : "</details>");
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Branch names v<N> of a package, highest major first. */
static size_t list_branches(char majors[][24], size_t max, const char *resolve_dir)
{
    int nums[64];
    size_t n = 0;
    DIR *d = opendir(resolve_dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        int64_t v;
        if (e->d_name[0] == 'v' && tk__parse_i64(e->d_name + 1, 1, 1000000, &v) == 0 && n < max && n < 64)
            nums[n++] = (int)v;
    }
    if (d)
        closedir(d);
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0 && nums[j - 1] < nums[j]; j--) {
            int t = nums[j];
            nums[j] = nums[j - 1];
            nums[j - 1] = t;
        }
    for (size_t i = 0; i < n; i++)
        snprintf(majors[i], 24, "v%d", nums[i]);
    return n;
}

/* Every version the tree holds (the commit directories under resolve/), newest first, "1.0.1
 * (yanked)" for a yanked one, comma-separated into b. */
static int cmp_ver_desc(const void *a, const void *b)
{
    int x[3] = {0, 0, 0}, y[3] = {0, 0, 0};
    sscanf(*(char *const *)a, "%d.%d.%d", &x[0], &x[1], &x[2]);
    sscanf(*(char *const *)b, "%d.%d.%d", &y[0], &y[1], &y[2]);
    for (int i = 0; i < 3; i++)
        if (x[i] != y[i])
            return y[i] - x[i];
    return 0;
}

static void page_versions(tk_buf *b, const char *resolve_dir)
{
    char *v[256];
    size_t n = 0;
    DIR *d = opendir(resolve_dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL && n < 256) {
        if (strlen(e->d_name) != 40 || strspn(e->d_name, "0123456789abcdef") != 40)
            continue;
        char *ver = tk_hub__tree_commit_version(resolve_dir, e->d_name);
        int dup = 0;
        for (size_t i = 0; ver && i < n; i++)
            dup |= !strcmp(v[i], ver);
        if (ver && !dup)
            v[n++] = ver;
        else
            free(ver);
    }
    if (d)
        closedir(d);
    if (!n)
        return;
    qsort(v, n, sizeof *v, cmp_ver_desc);
    tk__buf_puts(b, "<p class=m>versions: ");
    for (size_t i = 0; i < n; i++) {
        int yanked = tk_hub__tree_is_yanked(resolve_dir, v[i]) == 1;
        tk__buf_puts(b, i ? ", " : "");
        tk__buf_puts(b, yanked ? "<s>" : "");
        html_esc(b, v[i]);
        tk__buf_puts(b, yanked ? "</s> (yanked)" : "");
        free(v[i]);
    }
    tk__buf_puts(b, "</p>");
}

/* What a package's section shows below its branch table, gathered from the newest branch. */
typedef struct {
    json_t *kernels;                /* the newest version's kernels, for the detail view's table */
    char *readme;
    int markdown;
    char first_pub[TK_PUBKEY_LEN];  /* the newest branch's signer: the trust line under the table */
} pkg_view;

static void page_name(tk_buf *b, const char *org, const char *pkg)
{
    html_esc(b, org);
    tk__buf_puts(b, "/");
    html_esc(b, pkg);
}

/* The heading, a link to the package's own page. */
static void page_heading(tk_buf *b, const char *org, const char *pkg)
{
    tk__buf_puts(b, "<section><h2 id=\"");
    page_name(b, org, pkg);
    tk__buf_puts(b, "\"><a href=\"/?p=");
    page_name(b, org, pkg);
    tk__buf_puts(b, "\">");
    page_name(b, org, pkg);
    tk__buf_puts(b, "</a></h2>");
}

/* The newest version's description, get line and license, and the branch table's head; keeps its
 * kernels and README for later in the section. */
static void page_summary(tk_buf *b, pkg_view *v, json_t *m, const char *org, const char *pkg, const char *resolve_dir,
                         const char *head)
{
    tk__buf_puts(b, "<p>");
    html_esc(b, json_string_value(json_object_get(m, "description")));
    tk__buf_puts(b, "</p><p class=m><code>tk get ");
    page_name(b, org, pkg);
    tk__buf_puts(b, "</code> · license ");
    html_esc(b, json_string_value(json_object_get(m, "license")));
    tk__buf_puts(b, "</p><div class=t><table><tr><th>branch</th><th>version</th><th>commit</th>"
                    "<th>ops</th><th>signed by</th></tr>");
    const char *ap = json_string_value(json_object_get(json_object_get(m, "archive"), "path"));
    char *arch = ap && tk_manifest__path_check(ap) == TK_OK ? tk__fmt("%s/%s/%s", resolve_dir, head, ap) : NULL;
    v->readme = arch ? archive_readme(arch, &v->markdown) : NULL;
    free(arch);
    v->kernels = json_incref(json_object_get(m, "kernels"));
}

/* The ops a version's kernels implement, each once. */
static void page_ops(tk_buf *b, json_t *m)
{
    json_t *seen = json_object(), *k;
    size_t ki;
    json_array_foreach(json_object_get(m, "kernels"), ki, k) {
        const char *op = json_string_value(json_object_get(k, "op"));
        if (!op || json_object_get(seen, op))
            continue;
        json_object_set_new(seen, op, json_true());
        tk__buf_puts(b, json_object_size(seen) > 1 ? ", <code>" : "<code>");
        html_esc(b, op);
        tk__buf_puts(b, "</code>");
    }
    json_decref(seen);
}

/* The signer's key id of a commit; the first one seen is kept for the trust line. */
static void page_signer(tk_buf *b, pkg_view *v, const char *resolve_dir, const char *head)
{
    char *sp = tk__fmt("%s/%s/manifest.json.sig", resolve_dir, head), *stext = NULL;
    size_t sn = 0;
    char keyid[TK_KEYID_LEN], pub[TK_PUBKEY_LEN];
    uint8_t sig[64];
    if (sp && tk__read_file(&stext, &sn, sp, SIG_MAX) == TK_OK &&
        tk_hub__sig_parse(keyid, pub, sig, stext, sn) == TK_OK) {
        tk__buf_puts(b, "<code>");
        html_esc(b, keyid);
        tk__buf_puts(b, "</code>");
        if (!v->first_pub[0] && pub[0])
            snprintf(v->first_pub, sizeof v->first_pub, "%s", pub);
    }
    free(sp);
    free(stext);
}

/* One branch's row: branch, version, commit, ops, signer. data-l labels the cells when a phone-width
 * screen stacks each row (see the CSS). */
static void page_branch_row(tk_buf *b, pkg_view *v, json_t *m, const char *branch, const char *resolve_dir,
                            const char *head)
{
    tk__buf_puts(b, "<tr><td data-l=branch>");
    html_esc(b, branch);
    tk__buf_puts(b, "</td><td data-l=version>");
    html_esc(b, json_string_value(json_object_get(m, "version")));
    tk__buf_printf(b, "</td><td data-l=commit><code title=\"%s\">%.10s</code></td><td data-l=ops>", head, head);
    page_ops(b, m);
    tk__buf_puts(b, "</td><td data-l=\"signed by\">");
    page_signer(b, v, resolve_dir, head);
    tk__buf_puts(b, "</td></tr>");
}

/* The summary and the table of branches, highest major first. 1 when a table was opened. */
static int page_branches(tk_buf *b, pkg_view *v, const char *resolve_dir, const char *org, const char *pkg)
{
    char branches[32][24];
    size_t nb = resolve_dir ? list_branches(branches, 32, resolve_dir) : 0;
    for (size_t i = 0; i < nb; i++) {
        char *head = tk_hub__tree_branch_head(resolve_dir, branches[i]);
        json_t *m = head ? tk_hub__tree_commit_manifest(resolve_dir, head) : NULL;
        if (m && i == 0)
            page_summary(b, v, m, org, pkg, resolve_dir, head);
        if (m)
            page_branch_row(b, v, m, branches[i], resolve_dir, head);
        json_decref(m);
        free(head);
    }
    if (nb)
        tk__buf_puts(b, "</table></div>");
    return nb > 0;
}

/* The publisher's key as a `tk trust add` line: verify the fingerprint out of band before running it. */
static void page_trust_line(tk_buf *b, const char *org, const char *pub)
{
    if (!pub[0])
        return;
    tk__buf_puts(
        b, "<p class=m>Publisher key (check its fingerprint with the publisher, then trust it):</p><pre>tk trust add ");
    html_esc(b, org);
    tk__buf_puts(b, " ");
    html_esc(b, pub);
    tk__buf_puts(b, "</pre>");
}

/* The kernels of the newest version: name, op, dtypes, archs. */
static void page_kernels(tk_buf *b, json_t *kernels)
{
    json_t *k, *d;
    size_t i, j;
    if (!json_array_size(kernels))
        return;
    tk__buf_printf(b,
                   "<h3>kernels (%zu)</h3><div class=t><table><tr><th>kernel</th><th>op</th><th>dtypes</th>"
                   "<th>archs</th></tr>",
                   json_array_size(kernels));
    json_array_foreach(kernels, i, k) {
        json_t *cons = json_object_get(k, "constraints");
        int lo = (int)json_integer_value(json_object_get(cons, "min_cc"));
        int hi = (int)json_integer_value(json_object_get(cons, "max_cc"));
        tk__buf_puts(b, "<tr><td data-l=kernel><code>");
        html_esc(b, json_string_value(json_object_get(k, "name")));
        tk__buf_puts(b, "</code></td><td data-l=op>");
        html_esc(b, json_string_value(json_object_get(k, "op")));
        tk__buf_puts(b, "</td><td data-l=dtypes>");
        json_array_foreach(json_object_get(cons, "dtypes"), j, d) {
            tk__buf_puts(b, j ? ", " : "");
            html_esc(b, json_string_value(d));
        }
        tk__buf_puts(b, "</td><td data-l=archs>");
        if (json_is_true(json_object_get(cons, "arch_specific")) && lo)
            tk__buf_printf(b, "sm_%da", lo);
        else if (lo && hi)
            tk__buf_printf(b, "sm_%d-sm_%d", lo, hi);
        else if (lo)
            tk__buf_printf(b, "sm_%d+", lo);
        else
            tk__buf_puts(b, "any");
        tk__buf_puts(b, "</td></tr>");
    }
    tk__buf_puts(b, "</table></div>");
}

/* One package's section of the page; detail: its own page (?p=), with the kernels table and the README
 * open. */
static void page_package(tk_buf *b, tk_server *s, const char *org, const char *pkg, int detail)
{
    char *resolve_dir = tk__fmt("%s/kernels/%s/%s/resolve", s->root, org, pkg);
    pkg_view v;
    memset(&v, 0, sizeof v);
    page_heading(b, org, pkg);
    if (page_branches(b, &v, resolve_dir, org, pkg)) {
        page_versions(b, resolve_dir);
    } else if (resolve_dir) { /* no branch: every version of it was yanked */
        size_t before = b->len;
        page_versions(b, resolve_dir);
        if (b->len > before)
            tk__buf_puts(b, "<p class=m>nothing to install: the publisher yanked every version</p>");
    }
    page_trust_line(b, org, v.first_pub);
    if (detail)
        page_kernels(b, v.kernels);
    page_readme(b, v.readme, v.markdown, detail);
    tk__buf_puts(b, "</section>\n");
    json_decref(v.kernels);
    free(v.readme);
    free(resolve_dir);
}

/* A query argument, percent- and '+'-decoded (the server sees URLs undecoded: no_unescape), at most
 * cap-1 bytes; "" when absent or when it decodes to a NUL. */
static void query_arg(char *out, size_t cap, struct MHD_Connection *c, const char *name)
{
    const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
    size_t o = 0;
    out[0] = '\0';
    for (size_t i = 0; v && v[i] && o + 1 < cap; i++) {
        unsigned x;
        if (v[i] == '%' && isxdigit((unsigned char)v[i + 1]) && isxdigit((unsigned char)v[i + 2]) &&
            sscanf(v + i + 1, "%2x", &x) == 1) {
            if (!x) {
                out[0] = '\0';
                return;
            }
            out[o++] = (char)x;
            i += 2;
        } else {
            out[o++] = v[i] == '+' ? ' ' : v[i];
        }
    }
    out[o] = '\0';
}

/* Search: the package's name, or its newest version's description, kernel names or ops, contain q
 * (case-insensitive). */
static int pkg_matches(tk_server *s, const char *name, const char *q)
{
    if (!q[0] || strcasestr(name, q))
        return 1;
    const char *slash = strchr(name, '/');
    char *resolve_dir = tk__fmt("%s/kernels/%.*s/%s/resolve", s->root, (int)(slash - name), name, slash + 1);
    char branches[32][24];
    size_t nb = resolve_dir ? list_branches(branches, 32, resolve_dir) : 0;
    char *head = nb ? tk_hub__tree_branch_head(resolve_dir, branches[0]) : NULL;
    json_t *m = head ? tk_hub__tree_commit_manifest(resolve_dir, head) : NULL, *k;
    const char *desc = json_string_value(json_object_get(m, "description"));
    int hit = desc && strcasestr(desc, q);
    size_t i;
    json_array_foreach(json_object_get(m, "kernels"), i, k) {
        const char *kn = json_string_value(json_object_get(k, "name")),
                   *op = json_string_value(json_object_get(k, "op"));
        hit |= (kn && strcasestr(kn, q)) || (op && strcasestr(op, q));
    }
    json_decref(m);
    free(head);
    free(resolve_dir);
    return hit;
}

/* The packages of the tree (kernels/{org}/{name}), sorted, at most MAX_PAGE_PKGS. */
static size_t page_collect_names(tk_server *s, char ***out)
{
    char **names = NULL;
    size_t n = 0;
    char *kdir = tk__path_join(s->root, "kernels");
    DIR *od = kdir ? opendir(kdir) : NULL;
    struct dirent *oe;
    while (od && (oe = readdir(od)) != NULL && n < MAX_PAGE_PKGS) {
        if (!tk_hub__serve_component_ok(oe->d_name, strlen(oe->d_name)))
            continue;
        char *odir = tk__path_join(kdir, oe->d_name);
        DIR *pd = odir ? opendir(odir) : NULL;
        struct dirent *pe;
        while (pd && (pe = readdir(pd)) != NULL && n < MAX_PAGE_PKGS) {
            char org[65], pkg[65];
            if (!tk_hub__serve_component_ok(pe->d_name, strlen(pe->d_name)) ||
                !tk_hub__serve_name_ok(org, pkg, oe->d_name, pe->d_name))
                continue;
            char **nn = realloc(names, (n + 1) * sizeof *names);
            if (!nn)
                break;
            names = nn;
            if ((names[n] = tk__fmt("%s/%s", org, pkg)) != NULL)
                n++;
        }
        if (pd)
            closedir(pd);
        free(odir);
    }
    if (od)
        closedir(od);
    free(kdir);
    if (n)
        qsort(names, n, sizeof *names, cmp_str);
    *out = names;
    return n;
}

enum MHD_Result tk_hub__serve_page(tk_server *s, struct MHD_Connection *c, req *r)
{
    tk_buf b = TK_BUF_INIT;
    char **names = NULL;
    size_t n = page_collect_names(s, &names);
    tk__buf_puts(
        &b,
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        "<meta name=viewport content=\"width=device-width, initial-scale=1\">"
        "<title>tk registry</title><style>"
        "body{font:16px/1.5 system-ui,sans-serif;max-width:60rem;margin:0 auto;padding:1rem;color:#222}"
        "h1{font-size:1.5rem}h2{font-size:1.2rem;margin:0 0 .3rem;word-break:break-all}"
        "section{border:1px solid #ddd;border-radius:8px;padding:1rem;margin:1rem 0}"
        ".t{overflow-x:auto}table{border-collapse:collapse;width:100%;font-size:.9rem}"
        "th,td{text-align:left;padding:.3rem .5rem;border-bottom:1px solid #eee;vertical-align:top}"
        "code{font-size:.85rem;overflow-wrap:anywhere}.m{color:#555;font-size:.9rem}"
        "@media (max-width:40rem){.t table,.t tbody,.t tr,.t td{display:block}"
        ".t tr:first-child{display:none}.t tr{padding:.4rem 0;border-bottom:1px solid #eee}"
        ".t td{border:0;padding:.1rem 0}.t td::before{content:attr(data-l) \": \";font-weight:600}}"
        "pre{white-space:pre-wrap;overflow-wrap:anywhere;background:#f6f6f6;padding:.7rem;border-radius:6px;font-size:.85rem}"
        ".readme{overflow-wrap:anywhere}.readme h1,.readme h2,.readme h3{font-size:1.05rem}"
        ".readme img{max-width:100%}.readme table{width:auto}"
        "</style></head><body><h1>tk registry</h1>");
    /* The URL clients use: the Host the browser asked for (checked: host[:port] characters only), with
     * https when a proxy in front says so; else the text says "this page's address". */
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
    const char *proto = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Forwarded-Proto");
    int host_ok = host && *host && strlen(host) < 256 &&
                  strspn(host, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-:[]") == strlen(host);
    tk__buf_printf(&b, "<p class=m>%zu package%s. Point tk here:</p>\n<pre>", n, n == 1 ? "" : "s");
    if (host_ok)
        tk__buf_printf(&b, "export TK_ENDPOINT=%s://%s", proto && !strcmp(proto, "https") ? "https" : "http", host);
    else
        tk__buf_puts(&b, "export TK_ENDPOINT=&lt;this page's address&gt;");
    tk__buf_puts(&b, "</pre>\n");
    char q[200], only[140];
    query_arg(q, sizeof q, c, "q");
    query_arg(only, sizeof only, c, "p");
    tk__buf_puts(&b, "<form action=/ method=get role=search><input type=search name=q placeholder=\"search packages, "
                     "kernels, ops\" aria-label=search style=\"width:100%;box-sizing:border-box;font:inherit;"
                     "padding:.4rem\" value=\"");
    html_esc(&b, q);
    tk__buf_puts(&b, "\"></form>\n");
    size_t shown = 0;
    for (size_t i = 0; i < n; i++) {
        int show = only[0] ? !strcmp(names[i], only) : pkg_matches(s, names[i], q);
        char *slash = strchr(names[i], '/');
        *slash = '\0';
        if (show) {
            page_package(&b, s, names[i], slash + 1, only[0] != '\0');
            shown++;
        }
        free(names[i]);
    }
    if (!shown && (q[0] || only[0])) {
        tk__buf_puts(&b, "<p>No package matches <code>");
        html_esc(&b, q[0] ? q : only);
        tk__buf_puts(&b, "</code>. <a href=\"/\">All packages</a></p>");
    }
    free(names);
    tk__buf_puts(&b, "</body></html>\n");
    if (!b.data) {
        tk__buf_free(&b);
        return MHD_NO;
    }
    size_t len = b.len;
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, tk__buf_steal(&b), MHD_RESPMEM_MUST_FREE);
    if (resp) {
        MHD_add_response_header(resp, "Content-Type", "text/html; charset=utf-8");
        MHD_add_response_header(resp, "Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'");
        MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    }
    r->bytes = len;
    return tk_hub__serve_queue(c, r, MHD_HTTP_OK, resp);
}
