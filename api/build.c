/*
 * build.c — compiling packages: a package's sources (installed, or a local directory), the compile
 * plan for an arch (kernels that share a source file, options and arch-specific flag are one NVRTC
 * unit with one name expression each, keyed by content), building it (cache hits first, misses
 * compiled in parallel and checked against the manifest's parameter lists), ahead-of-time builds
 * (tk_build), tk check's compile of a local package, and the cache keys the dispatcher asks for.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/build.h"
#include "ops/ops.h"

#define MAX_PARAMS 64
#define MAX_FILE (64u << 20)

/* ---- kernel declarations: the manifest's, parsed once (manifest/validate.c) ---------------------- */

typedef tk_manifest_kernel kdecl;
typedef tk_manifest_param kparam;
typedef tk_api_pkgsrc pkgsrc;
typedef tk_api_cunit cunit;
typedef tk_api_plan plan;

/* ---- a package's sources and its compile plan ------------------------------------------------- */

void tk_api__pkgsrc_free(pkgsrc *s)
{
    for (size_t i = 0; i < s->nfiles; i++) {
        free((char *)s->files[i].path);
        free((char *)s->files[i].data);
    }
    free(s->files);
    tk_manifest__kernels_free(&s->mk);
    free(s->pkgname);
    memset(s, 0, sizeof *s);
}

/* Parses the manifest's compile options and kernels into s (whose files are loaded). */
static int pkgsrc_parse(pkgsrc *s, const char *name, const char *manifest)
{
    json_error_t jerr;
    json_t *m = json_loads(manifest, 0, &jerr);
    int rc;
    if (!m)
        return tk__err(TK_ERR_MANIFEST, "manifest of %s: %s (line %d)", name, jerr.text, jerr.line);
    rc = tk_manifest__kernels_parse(&s->mk, m, 0, NULL, NULL);
    json_decref(m);
    if (rc != TK_OK)
        return tk__err_wrap(rc, "%s", name);
    s->copts = s->mk.copts;
    s->ncopts = s->mk.ncopts;
    s->k = s->mk.k;
    s->nk = s->mk.nk;
    if (!s->nk)
        return tk__err(TK_ERR_MANIFEST, "%s declares no kernels", name);
    for (size_t i = 0; i < s->nk; i++) {
        int found = 0;
        for (size_t f = 0; f < s->nfiles; f++)
            found |= strcmp(s->files[f].path, s->k[i].source) == 0;
        if (!found)
            return tk__err(TK_ERR_MANIFEST, "kernel '%s': source '%s' is not a file of the package", s->k[i].name,
                           s->k[i].source);
    }
    return TK_OK;
}

static int pkgsrc_load(pkgsrc *s, const tk_pkg *pkg)
{
    size_t i;
    int rc;

    memset(s, 0, sizeof *s);
    s->pkgname = tk__fmt("%s@%s", tk_pkg_name(pkg), tk_pkg_commit(pkg));
    s->nfiles = tk_pkg_file_count(pkg);
    if (!s->pkgname || (s->nfiles && !(s->files = calloc(s->nfiles, sizeof *s->files)))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (i = 0; i < s->nfiles; i++) {
        char *data = NULL;
        size_t len = 0;
        if ((rc = tk__read_file_nofollow(&data, &len, tk_pkg_file_store_path(pkg, i), MAX_FILE)) != TK_OK) {
            rc = tk__err_wrap(rc, "reading %s of %s", tk_pkg_file_path(pkg, i), tk_pkg_name(pkg));
            goto fail;
        }
        s->files[i].data = data;
        s->files[i].len = len;
        if (!(s->files[i].path = tk__strdup(tk_pkg_file_path(pkg, i)))) {
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
            goto fail;
        }
    }
    if ((rc = pkgsrc_parse(s, tk_pkg_name(pkg), tk_pkg_manifest(pkg))) != TK_OK)
        goto fail;
    return TK_OK;
fail:
    tk_api__pkgsrc_free(s);
    return rc;
}

/* A package directory that was never published (manifest/local.c checked it): its files are read from
 * the directory, and it is named "org/name@local" wherever it shows (logs, the cache's labels). */
static int pkgsrc_load_dir(pkgsrc *s, const tk_manifest_local *lp)
{
    int rc;
    memset(s, 0, sizeof *s);
    s->pkgname = tk__fmt("%s@local", lp->name);
    s->nfiles = lp->nfiles;
    if (!s->pkgname || (s->nfiles && !(s->files = calloc(s->nfiles, sizeof *s->files)))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < s->nfiles; i++) {
        char *full = tk__path_join(lp->dir, lp->paths[i]), *data = NULL;
        size_t len = 0;
        rc = full ? tk__read_file(&data, &len, full, MAX_FILE) : tk__err(TK_ERR_NOMEM, "out of memory");
        free(full);
        if (rc != TK_OK)
            goto fail;
        s->files[i].data = data;
        s->files[i].len = len;
        if (!(s->files[i].path = tk__strdup(lp->paths[i]))) {
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
            goto fail;
        }
    }
    if ((rc = pkgsrc_parse(s, lp->name, lp->manifest)) != TK_OK)
        goto fail;
    return TK_OK;
fail:
    tk_api__pkgsrc_free(s);
    return rc;
}

/* The sources of `ref`: a package directory (never signed or installed, named org/name@local) or
 * an installed package, fetched first when `get` is given. *manifest (may be NULL) receives a copy
 * of the manifest text. */
static int pkgsrc_for_ref(pkgsrc *s, char **manifest, tk_ctx *ctx, const char *ref, const tk_get_opts *get)
{
    int rc;
    memset(s, 0, sizeof *s);
    if (manifest)
        *manifest = NULL;
    if (tk_api__is_local_ref(ref)) {
        tk_manifest_local lp;
        if ((rc = tk_manifest__local_load(&lp, ref)) != TK_OK)
            return rc;
        tk_api__log(ctx, TK_LOG_WARN, "%s %s from %s is local: not signed, not installed", lp.name, lp.version, ref);
        rc = pkgsrc_load_dir(s, &lp);
        if (rc == TK_OK && manifest && !(*manifest = tk__strdup(lp.manifest)))
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
        tk_manifest__local_free(&lp);
    } else {
        tk_pkg *pkg = NULL;
        rc = get ? tk_pkg_get(&pkg, ctx, ref, get) : tk_pkg_info(&pkg, ctx, ref);
        if (rc == TK_OK)
            rc = pkgsrc_load(s, pkg);
        if (rc == TK_OK && manifest && !(*manifest = tk__strdup(tk_pkg_manifest(pkg))))
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
        tk_pkg_free(pkg);
    }
    if (rc != TK_OK) {
        tk_api__pkgsrc_free(s);
        if (manifest) {
            free(*manifest);
            *manifest = NULL;
        }
    }
    return rc;
}

void tk_api__plan_free(plan *p)
{
    for (size_t i = 0; i < p->n; i++) {
        free(p->u[i].hdrs);
        free(p->u[i].names);
        free(p->u[i].opts);
        free(p->u[i].kidx);
        free(p->u[i].kname);
        free(p->u[i].label);
        tk_jit__binary_free(p->u[i].bin);
    }
    free(p->u);
    memset(p, 0, sizeof *p);
}

static int same_opts(const kdecl *a, const kdecl *b)
{
    if (a->noptions != b->noptions)
        return 0;
    for (size_t i = 0; i < a->noptions; i++)
        if (strcmp(a->options[i], b->options[i]) != 0)
            return 0;
    return 1;
}

static int kernel_fits(const kdecl *d, int cc) { return cc >= d->min_cc && (!d->max_cc || cc <= d->max_cc); }

/* Groups the kernels that fit `cc` into units and computes their keys. */
static int plan_make(plan *p, const pkgsrc *s, int cc, int ptx_only, const char *nvrtc_id)
{
    int rc = TK_ERR_NOMEM;
    memset(p, 0, sizeof *p);
    if (!(p->u = calloc(s->nk, sizeof *p->u)))
        goto fail;
    for (size_t i = 0; i < s->nk; i++) {
        const kdecl *d = &s->k[i];
        cunit *c = NULL;
        size_t j;
        if (!kernel_fits(d, cc))
            continue;
        for (j = 0; j < p->n; j++) {
            const kdecl *f = &s->k[p->u[j].kidx[0]];
            if (strcmp(f->source, d->source) == 0 && f->arch_specific == d->arch_specific && same_opts(f, d)) {
                c = &p->u[j];
                break;
            }
        }
        if (!c) {
            c = &p->u[p->n++];
            if (!(c->kidx = calloc(s->nk, sizeof *c->kidx)) || !(c->kname = calloc(s->nk, sizeof *c->kname)) ||
                !(c->names = calloc(s->nk, sizeof *c->names)))
                goto fail;
        }
        c->kidx[c->nk] = i;
        for (j = 0; j < c->u.nnames; j++)
            if (strcmp(c->names[j], d->symbol) == 0)
                break;
        if (j == c->u.nnames)
            c->names[c->u.nnames++] = d->symbol;
        c->kname[c->nk++] = j;
    }
    for (size_t j = 0; j < p->n; j++) {
        cunit *c = &p->u[j];
        const kdecl *d = &s->k[c->kidx[0]];
        tk_buf label = TK_BUF_INIT;
        size_t nh = 0;
        if (!(c->hdrs = calloc(s->nfiles + 1, sizeof *c->hdrs)) ||
            !(c->opts = calloc(s->ncopts + d->noptions + 1, sizeof *c->opts)))
            goto fail;
        for (size_t f = 0; f < s->nfiles; f++) {
            if (strcmp(s->files[f].path, d->source) == 0) {
                c->u.src = s->files[f].data;
                c->u.src_len = s->files[f].len;
            } else {
                c->hdrs[nh++] = s->files[f];
            }
        }
        for (size_t o = 0; o < s->ncopts; o++)
            c->opts[c->u.noptions++] = s->copts[o];
        for (size_t o = 0; o < d->noptions; o++)
            c->opts[c->u.noptions++] = d->options[o];
        c->u.src_path = d->source;
        c->u.headers = c->hdrs;
        c->u.nheaders = nh;
        c->u.names = c->names;
        c->u.options = c->opts;
        c->u.cc = cc;
        c->u.arch_specific = d->arch_specific && !ptx_only;
        c->u.ptx_only = ptx_only;
        tk_jit__target(c->target, &c->u);
        if (tk__buf_printf(&label, "%s:", d->source) != TK_OK)
            goto fail;
        for (size_t k = 0; k < c->nk && k < 3; k++)
            if (tk__buf_printf(&label, "%s%s", k ? ", " : " ", s->k[c->kidx[k]].name) != TK_OK) {
                tk__buf_free(&label);
                goto fail;
            }
        if (c->nk > 3 && tk__buf_printf(&label, " ... (%zu kernels)", c->nk) != TK_OK) {
            tk__buf_free(&label);
            goto fail;
        }
        c->label = tk__buf_steal(&label);
        if ((rc = tk_jit__key(c->key, &c->u, nvrtc_id)) != TK_OK)
            goto fail2;
        rc = TK_ERR_NOMEM;
    }
    return TK_OK;
fail:
    rc = tk__err(TK_ERR_NOMEM, "out of memory planning compiles");
fail2:
    tk_api__plan_free(p);
    return rc;
}

/* Compile progress: a "[3/7] decode.cu sm_90 12.4 s" log line per unit as it finishes, and the
 * context's progress callback (a terminal status line in the CLI) as units start and finish. */
typedef struct {
    const tk_ctx *ctx;
    const tk_jit_unit *units;
    size_t n;
    double t0;
} progress;

static void unit_name(char *out, size_t cap, const tk_jit_unit *u)
{
    char target[32];
    size_t n = strlen(u->src_path);
    tk_jit__target(target, u);
    /* at most 60 columns of path: keep its end, which names the file */
    if (n > 60)
        snprintf(out, cap, "...%s %s", u->src_path + n - 57, target);
    else
        snprintf(out, cap, "%s %s", u->src_path, target);
}

static void on_unit(void *user, size_t i, int started, int status, size_t ndone, size_t nrunning, double secs)
{
    progress *pr = user;
    char name[96], what[128];
    unit_name(name, sizeof name, &pr->units[i]);
    if (!started)
        tk_api__log(pr->ctx, status == TK_OK ? TK_LOG_INFO : TK_LOG_WARN, "[%zu/%zu] %s %.1f s%s", ndone, pr->n, name,
                    secs, status == TK_OK ? "" : " FAILED");
    if (pr->ctx->progress) {
        snprintf(what, sizeof what, "compile %zu running, %.0f s: %s", nrunning, (tk__now_ms() - pr->t0) / 1000.0,
                 name);
        pr->ctx->progress(pr->ctx->progress_user, what, (int64_t)ndone, (int64_t)pr->n);
    }
}

/* The manifest's parameter list of every kernel of a compiled unit against the kernel's own, read from
 * the PTX: cuLaunchKernel reads one argument pointer per kernel parameter, so a manifest that lists
 * fewer reads past tk's argument array (a crash in the driver) and one that lists more, or another
 * size, hands the kernel garbage. TK_ERR_MANIFEST naming the first mismatch; TK_OK when the unit has
 * no PTX to read (the launch cannot be checked then). */
static int check_signatures(const cunit *c, const pkgsrc *s)
{
    if (!c->bin || !c->bin->ptx || !c->nk)
        return TK_OK;
    /* one pass over the PTX's entries (it can be megabytes; this runs on every cache hit too) */
    for (const char *e = strstr(c->bin->ptx, ".entry"); e; e = strstr(e + 6, ".entry")) {
        const char *nm = e + 6, *ne;
        while (*nm == ' ' || *nm == '\t')
            nm++;
        for (ne = nm; *ne && *ne != '(' && *ne != ' ' && *ne != '\t' && *ne != '\n'; ne++)
            ;
        for (size_t j = 0; j < c->nk; j++) {
            const char *low = c->bin->lowered[c->kname[j]];
            if (strlen(low) != (size_t)(ne - nm) || memcmp(low, nm, (size_t)(ne - nm)) != 0)
                continue;
            const kdecl *d = &s->k[c->kidx[j]];
            size_t got[MAX_PARAMS], n = 0;
            /* parse from this entry on: the name matches, so the first ".entry NAME(" found is this one */
            if (tk_jit__ptx_params(e, low, got, MAX_PARAMS, &n) != TK_OK)
                return tk__err(TK_ERR_COMPILE, "%s (%s): kernel '%s': cannot read the parameters of '%s' in the PTX",
                               d->source, c->target, d->name, d->symbol);
            if (n != d->nparams)
                return tk__err(TK_ERR_MANIFEST,
                               "%s (%s): kernel '%s': the manifest lists %zu parameters, '%s' takes %zu\n"
                               "HINT: 'params' must list every parameter of the __global__ function, in its order "
                               "(an optional tensor the kernel takes is still listed, with \"optional\": true)",
                               d->source, c->target, d->name, d->nparams, d->symbol, n);
            for (size_t i = 0; i < n; i++) {
                const kparam *p = &d->params[i];
                size_t want = p->type == TK_MANIFEST_P_I32 || p->type == TK_MANIFEST_P_F32 ? 4 : 8;
                if (got[i] != want)
                    return tk__err(TK_ERR_MANIFEST,
                                   "%s (%s): kernel '%s': parameter %zu '%s' is %zu bytes in the manifest (%s), %zu "
                                   "in '%s'\nHINT: tensor and workspace: a pointer; i64/f64: 8 bytes; i32/f32: 4 bytes",
                                   d->source, c->target, d->name, i + 1, p->name, want,
                                   p->type == TK_MANIFEST_P_TENSOR      ? "tensor"
                                   : p->type == TK_MANIFEST_P_WORKSPACE ? "workspace"
                                   : p->type == TK_MANIFEST_P_I32       ? "i32"
                                   : p->type == TK_MANIFEST_P_I64       ? "i64"
                                   : p->type == TK_MANIFEST_P_F32       ? "f32"
                                                                        : "f64",
                                   got[i], d->symbol);
            }
        }
    }
    return TK_OK;
}

int tk_api__plan_build(plan *p, tk_ctx *ctx, const pkgsrc *s, int jobs, size_t *ncompiled, size_t *ncached)
{
    tk_kcache *kc = NULL;
    tk_jit_unit *units = NULL;
    tk_jit_binary **outs = NULL;
    int *st = NULL, rc;
    size_t *which = NULL, nmiss = 0;
    char **emsg = NULL;
    char ver[32] = "";
    int vmaj = 0, vmin = 0;

    if ((rc = tk_api__kcache(&kc, ctx)) != TK_OK)
        return rc;
    for (size_t i = 0; i < p->n; i++) {
        uint8_t *data = NULL;
        size_t len = 0;
        cunit *c = &p->u[i];
        if (c->bin)
            continue;
        if (tk_kcache__get(kc, c->key, &data, &len) == TK_OK) {
            if (tk_jit__binary_unpack(&c->bin, data, len) != TK_OK || c->bin->nlowered != c->u.nnames) {
                tk_jit__binary_free(c->bin);
                c->bin = NULL;
                tk_kcache__remove(kc, c->key);
            }
            free(data);
        }
        if (c->bin && (rc = check_signatures(c, s)) != TK_OK)
            return rc;
        if (c->bin) {
            c->cached = 1;
            if (ncached)
                (*ncached)++;
            tk_api__log(ctx, TK_LOG_DEBUG, "cache hit %.12s %s (%s)", c->key, c->label, c->target);
        }
    }
    for (size_t i = 0; i < p->n; i++)
        nmiss += !p->u[i].bin;
    if (!nmiss)
        return TK_OK;
    units = calloc(nmiss, sizeof *units);
    outs = calloc(nmiss, sizeof *outs);
    st = calloc(nmiss, sizeof *st);
    which = calloc(nmiss, sizeof *which);
    emsg = calloc(nmiss, sizeof *emsg);
    if (!units || !outs || !st || !which || !emsg) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    nmiss = 0;
    for (size_t i = 0; i < p->n; i++)
        if (!p->u[i].bin) {
            tk_api__log(ctx, TK_LOG_DEBUG, "compiling %s for %s", p->u[i].label, p->u[i].target);
            which[nmiss] = i;
            units[nmiss++] = p->u[i].u;
        }
    /* Worker threads fail with their own thread-local message: collect them to report here. */
    {
        progress pr = {ctx, units, nmiss, tk__now_ms()};
        size_t nfail = 0;
        rc = tk_jit__compile_many_cb(outs, st, emsg, units, nmiss, jobs, on_unit, &pr);
        for (size_t m = 0; m < nmiss; m++)
            nfail += st[m] != TK_OK;
        if (nfail)
            tk_api__log(ctx, TK_LOG_INFO, "%s: %zu compiled, %zu failed in %.1f s", s->pkgname, nmiss - nfail, nfail,
                        (tk__now_ms() - pr.t0) / 1000.0);
        else
            tk_api__log(ctx, TK_LOG_INFO, "%s: %zu compiled in %.1f s", s->pkgname, nmiss,
                        (tk__now_ms() - pr.t0) / 1000.0);
    }
    if (tk_jit__nvrtc_version(&vmaj, &vmin, NULL) == TK_OK)
        snprintf(ver, sizeof ver, "%d.%d", vmaj, vmin);
    for (size_t m = 0; m < nmiss; m++) {
        cunit *c = &p->u[which[m]];
        uint8_t *blob = NULL;
        size_t len = 0;
        if (st[m] != TK_OK)
            continue;
        c->bin = outs[m];
        outs[m] = NULL;
        if ((st[m] = check_signatures(c, s)) != TK_OK) {
            if (rc == TK_OK)
                rc = st[m];
            tk_jit__binary_free(c->bin);
            c->bin = NULL;
            continue;
        }
        if (ncompiled)
            (*ncompiled)++;
        if (tk_jit__binary_pack(&blob, &len, c->bin) == TK_OK) {
            tk_kcache_meta meta = {s->pkgname, c->label, c->target, ver};
            int prc = tk_kcache__put(kc, c->key, &meta, blob, len, NULL);
            if (prc != TK_OK)
                tk_api__log(ctx, TK_LOG_WARN, "could not cache %s: %s", c->label, tk_last_error());
            free(blob);
        }
    }
    if (rc != TK_OK) {
        /* compile_many set the first failure's message; name the package */
        rc = tk__err_wrap(rc, "%s", s->pkgname);
    }
done:
    for (size_t m = 0; outs && m < nmiss; m++)
        tk_jit__binary_free(outs[m]);
    for (size_t m = 0; emsg && m < nmiss; m++)
        free(emsg[m]);
    free(emsg);
    free(units);
    free(outs);
    free(st);
    free(which);
    return rc;
}

/* NVRTC reports a name expression that names nothing as an error in its generated "__nv_name_map"
 * code, several lines long; a kernel author needs one line: which symbol of which kernel. */
static void symbol_message(tk_buf *b, const cunit *c, const pkgsrc *s, const char *msg)
{
    if (msg && strstr(msg, "__nv_name_map")) {
        int any = 0;
        for (size_t j = 0; j < c->nk; j++) {
            const kdecl *d = &s->k[c->kidx[j]];
            const char *sym = d->symbol, *lt = strchr(sym, '<');
            size_t n = lt ? (size_t)(lt - sym) : strlen(sym);
            char quoted[300];
            const char *base = sym;
            for (const char *q = sym; q < sym + n; q++)
                if (*q == ':')
                    base = q + 1;
            snprintf(quoted, sizeof quoted, "\"%.*s\"", (int)(sym + n - base), base);
            if (strstr(msg, quoted) || strstr(msg, sym)) {
                tk__buf_printf(b, "%s (%s): kernel '%s': symbol '%s' is not declared in %s\n", d->source, c->target,
                               d->name, sym, d->source);
                any = 1;
            }
        }
        if (any) {
            tk__buf_puts(b, "    HINT: 'symbol' names a __global__ function of the source: extern \"C\" or "
                            "ns::kern<float>\n");
            return;
        }
    }
    tk__buf_printf(b, "%s (%s):\n", c->label, c->target);
    for (const char *p = msg ? msg : "(no message)"; *p;) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        /* NVRTC writes "file.cu(12): error"; editors and terminals jump to "file.cu:12:" */
        const char *paren = memchr(p, '(', n);
        size_t digits = 0;
        while (paren && paren + 1 + digits < p + n && paren[1 + digits] >= '0' && paren[1 + digits] <= '9')
            digits++;
        if (paren && digits && paren + digits + 3 <= p + n && paren[1 + digits] == ')' && paren[2 + digits] == ':')
            tk__buf_printf(b, "    %.*s:%.*s:%.*s\n", (int)(paren - p), p, (int)digits, paren + 1,
                           (int)(n - (size_t)(paren + digits + 3 - p)), paren + digits + 3);
        else if (n)
            tk__buf_printf(b, "    %.*s\n", (int)n, p);
        p += n + (nl ? 1 : 0);
    }
}

int tk_api__compile_local(tk_ctx *ctx, const tk_manifest_local *lp, const int *ccs0, size_t nccs, int cover, int jobs,
                          tk_buf *report, size_t *nunits, size_t *nfailed)
{
    pkgsrc s;
    int ccs[128];
    plan *plans = NULL;
    const char *nvid = NULL;
    tk_jit_unit *units = NULL;
    tk_jit_binary **outs = NULL;
    cunit **cu = NULL;
    int *st = NULL, rc;
    char **emsg = NULL;
    size_t total = 0, k = 0;
    *nunits = *nfailed = 0;
    if (nccs > 64)
        nccs = 64;
    memcpy(ccs, ccs0, nccs * sizeof *ccs);
    if ((rc = pkgsrc_load_dir(&s, lp)) != TK_OK)
        return rc;
    /* cover: a kernel that none of the archs can run is compiled for the lowest arch it allows */
    for (size_t i = 0; cover && i < s.nk && nccs < sizeof ccs / sizeof *ccs; i++) {
        size_t a = 0;
        while (a < nccs && !kernel_fits(&s.k[i], ccs[a]))
            a++;
        if (a == nccs) {
            ccs[nccs++] = s.k[i].min_cc;
            tk_api__log(ctx, TK_LOG_DEBUG, "%s: kernel '%s' runs on none of the archs given; compiling it for sm_%d",
                        lp->name, s.k[i].name, s.k[i].min_cc);
        }
    }
    if ((rc = tk_jit__nvrtc_load()) != TK_OK || (rc = tk_jit__nvrtc_id(&nvid)) != TK_OK)
        goto done;
    if (!(plans = calloc(nccs + 1, sizeof *plans))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    /* every arch's units in one batch, so progress counts them all and they share the workers */
    for (size_t a = 0; a < nccs; a++) {
        if ((rc = plan_make(&plans[a], &s, ccs[a], 0, nvid)) != TK_OK)
            goto done;
        if (plans[a].n == 0)
            tk_api__log(ctx, TK_LOG_INFO, "%s: no kernel targets sm_%d", s.pkgname, ccs[a]);
        total += plans[a].n;
    }
    units = calloc(total + 1, sizeof *units);
    outs = calloc(total + 1, sizeof *outs);
    st = calloc(total + 1, sizeof *st);
    emsg = calloc(total + 1, sizeof *emsg);
    cu = calloc(total + 1, sizeof *cu);
    if (!units || !outs || !st || !emsg || !cu) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (size_t a = 0; a < nccs; a++)
        for (size_t i = 0; i < plans[a].n; i++) {
            cu[k] = &plans[a].u[i];
            units[k++] = plans[a].u[i].u;
        }
    {
        progress pr = {ctx, units, total, tk__now_ms()};
        tk_jit__compile_many_cb(outs, st, emsg, units, total, jobs, on_unit, &pr);
        for (size_t i = 0; i < total; i++) {
            (*nunits)++;
            if (st[i] == TK_OK) {
                cu[i]->bin = outs[i]; /* borrowed: tk_api__plan_free must not free it */
                int src = check_signatures(cu[i], &s);
                cu[i]->bin = NULL;
                if (src == TK_OK)
                    continue;
                (*nfailed)++;
                tk__buf_printf(report, "%s\n", tk_last_error());
                continue;
            }
            if (st[i] == TK_ERR_NO_NVRTC) {
                rc = tk__err(TK_ERR_NO_NVRTC, "%s", emsg[i] ? emsg[i] : "NVRTC is missing");
                goto done;
            }
            (*nfailed)++;
            symbol_message(report, cu[i], &s, emsg[i]);
        }
        tk_api__log(ctx, TK_LOG_INFO, "%s: %zu of %zu compiles ok in %.1f s", s.pkgname, total - *nfailed, total,
                    (tk__now_ms() - pr.t0) / 1000.0);
    }
    if (*nfailed)
        rc = TK_ERR_COMPILE;
done:
    for (size_t i = 0; outs && i < total; i++)
        tk_jit__binary_free(outs[i]);
    for (size_t i = 0; emsg && i < total; i++)
        free(emsg[i]);
    for (size_t a = 0; plans && a < nccs; a++)
        tk_api__plan_free(&plans[a]);
    free(plans);
    free(units);
    free(outs);
    free(st);
    free(emsg);
    free(cu);
    tk_api__pkgsrc_free(&s);
    return rc;
}

/* The compile plan for the device: its arch's units (PTX for compute_XY under TK_JIT_FORCE_PTX=1, in
 * tests), or, for a GPU newer than NVRTC whose binaries are not all cached, PTX for the newest arch
 * NVRTC knows, which the driver JITs. *kc receives the cache. */
static int kernel_plan(plan *p, tk_kcache **kc, tk_ctx *ctx, const pkgsrc *s, const tk_device_info *info, int cc,
                       int device, const char *nvid)
{
    const char *fp = getenv("TK_JIT_FORCE_PTX"); /* only for packages without sm_XYa kernels */
    int rc, any_miss = 0;
    if ((rc = plan_make(p, s, cc, fp && !strcmp(fp, "1"), nvid)) != TK_OK)
        return rc;
    if (p->n == 0)
        return tk__err(TK_ERR_UNSUPPORTED, "%s has no kernel for compute capability %d.%d (device %d: %s)", s->pkgname,
                       info->cc_major, info->cc_minor, device, info->name);
    if ((rc = tk_api__kcache(kc, ctx)) != TK_OK)
        return rc;
    for (size_t i = 0; i < p->n && !any_miss; i++) /* tk_api__plan_build reads (and verifies) the hits */
        any_miss = !tk_kcache__has(*kc, p->u[i].key);
    if (any_miss) {
        int archs[64];
        size_t na = 0;
        if ((rc = tk_jit__nvrtc_archs(archs, 64, &na)) != TK_OK)
            return rc;
        if (na && cc > archs[na - 1]) {
            tk_api__log(ctx, TK_LOG_WARN,
                        "sm_%d is newer than this NVRTC knows (up to sm_%d): using PTX for compute_%d", cc,
                        archs[na - 1], archs[na - 1]);
            tk_api__plan_free(p);
            if ((rc = plan_make(p, s, archs[na - 1], 1, nvid)) != TK_OK)
                return rc;
        }
    }
    return TK_OK;
}

/* The host part of tk_get_kernel, everything before the driver: the package's sources (installed and
 * verified), the plan for compute capability cc, and every binary built or taken from the cache. */
int tk_api__kernel_host(pkgsrc *s, char **manifest, plan *p, tk_kcache **kc, tk_ctx *ctx, const char *ref,
                        const tk_kernel_opts *opts, const tk_device_info *info, int cc)
{
    const char *nvid = NULL;
    int rc;
    if ((rc = pkgsrc_for_ref(s, manifest, ctx, ref, &opts->get)) != TK_OK || (rc = tk_jit__nvrtc_id(&nvid)) != TK_OK ||
        (rc = kernel_plan(p, kc, ctx, s, info, cc, opts->device, nvid)) != TK_OK ||
        (rc = tk_api__plan_build(p, ctx, s, 0, NULL, NULL)) != TK_OK)
        return rc;
    return TK_OK;
}

int tk_api__get_kernel_host(tk_ctx *ctx, const char *ref, int cc)
{
    tk_kernel_opts opts = TK_KERNEL_OPTS_INIT;
    tk_device_info info;
    tk_kcache *kc = NULL;
    char *manifest = NULL;
    pkgsrc s;
    plan p;
    int rc;
    memset(&s, 0, sizeof s);
    memset(&p, 0, sizeof p);
    memset(&info, 0, sizeof info);
    info.cc_major = cc / 10;
    info.cc_minor = cc % 10;
    snprintf(info.name, sizeof info.name, "sm_%d (no device)", cc);
    if ((rc = tk_api__check_ctx(ctx)) != TK_OK)
        return rc;
    rc = tk_api__kernel_host(&s, &manifest, &p, &kc, ctx, ref, &opts, &info, cc);
    tk_api__plan_free(&p);
    tk_api__pkgsrc_free(&s);
    free(manifest);
    return rc;
}

int tk_api__kernel_keys(tk_ctx *ctx, const char *ref, int cc,
                        void (*each)(void *user, const char *kernel, const char *key), void *user)
{
    pkgsrc s;
    plan p;
    const char *nvid = NULL;
    int rc;
    memset(&s, 0, sizeof s);
    memset(&p, 0, sizeof p);
    if (tk_api__is_local_ref(ref)) { /* quietly: dispatch asks this on every context */
        tk_manifest_local lp;
        if ((rc = tk_manifest__local_load(&lp, ref)) != TK_OK)
            return rc;
        rc = pkgsrc_load_dir(&s, &lp);
        tk_manifest__local_free(&lp);
    } else {
        rc = pkgsrc_for_ref(&s, NULL, ctx, ref, NULL);
    }
    if (rc == TK_OK && (rc = tk_jit__nvrtc_id(&nvid)) == TK_OK && (rc = plan_make(&p, &s, cc, 0, nvid)) == TK_OK)
        for (size_t i = 0; i < p.n; i++)
            for (size_t j = 0; j < p.u[i].nk; j++)
                each(user, s.k[p.u[i].kidx[j]].name, p.u[i].key);
    tk_api__plan_free(&p);
    tk_api__pkgsrc_free(&s);
    return rc;
}
/* ---- ahead-of-time builds --------------------------------------------------------------------- */

int tk_api__parse_arch(int *cc, const char *s)
{
    int64_t v;
    char buf[16];
    size_t n;
    if (!s)
        return -1;
    if (strncmp(s, "sm_", 3) == 0)
        s += 3;
    else if (strncmp(s, "compute_", 8) == 0)
        s += 8;
    n = strlen(s);
    if (n == 0 || n >= sizeof buf)
        return -1;
    memcpy(buf, s, n + 1);
    if (buf[n - 1] == 'a' || buf[n - 1] == 'f')
        buf[n - 1] = '\0';
    if (tk__parse_i64(buf, 10, 10000, &v) != 0)
        return -1;
    *cc = (int)v;
    return 0;
}

int tk_build(tk_ctx *ctx, const char *ref, const tk_build_opts *opts, size_t *compiled, size_t *cached)
{
    tk_build_opts def = TK_BUILD_OPTS_INIT;
    pkgsrc s;
    int ccs[64];
    size_t nccs = 0, nc = 0, nh = 0;
    const char *nvid = NULL;
    int rc;

    memset(&s, 0, sizeof s);
    if (compiled)
        *compiled = 0;
    if (cached)
        *cached = 0;
    if ((rc = tk_api__check_ctx(ctx)) != TK_OK)
        return rc;
    if (!ref)
        return tk__err(TK_ERR_INVALID, "tk_build: ref is required");
    if (!opts)
        opts = &def;
    if (opts->version < 1 || opts->version > TK_BUILD_OPTS_VERSION)
        return tk__err(TK_ERR_INVALID, "tk_build: unknown opts version %u", opts->version);
    if (opts->archs && opts->narchs) {
        for (size_t i = 0; i < opts->narchs && nccs < 64; i++) {
            int cc;
            if (tk_api__parse_arch(&cc, opts->archs[i]) != 0)
                return tk__err(TK_ERR_INVALID, "bad arch '%s'\nHINT: write archs as sm_80, sm_90 or sm_90a",
                               opts->archs[i] ? opts->archs[i] : "(null)");
            ccs[nccs++] = cc;
        }
    } else {
        int ndev = 0;
        if (tk_jit__device_count(&ndev) == TK_OK)
            for (int i = 0; i < ndev && nccs < 64; i++) {
                tk_device_info info;
                if (tk_jit__device_info(&info, i) == TK_OK)
                    ccs[nccs++] = info.cc_major * 10 + info.cc_minor;
            }
        if (!nccs) {
            json_t *ja = ctx->config ? json_object_get(ctx->config, "archs") : NULL, *x;
            size_t i;
            json_array_foreach(ja, i, x) {
                int cc;
                if (nccs >= 64)
                    break;
                if (tk_api__parse_arch(&cc, json_string_value(x)) != 0)
                    return tk__err(TK_ERR_INVALID, "config archs[%zu] is not an arch like \"sm_90\"", i);
                ccs[nccs++] = cc;
            }
        }
        if (!nccs)
            return tk__err(TK_ERR_INVALID,
                           "no GPU here and no archs given\nHINT: name them, e.g. 'tk build %s --arch "
                           "sm_80,sm_90', or set \"archs\": [\"sm_80\", \"sm_90\"] in config.json",
                           ref);
    }
    /* dedupe */
    for (size_t i = 0; i < nccs; i++)
        for (size_t j = i + 1; j < nccs;)
            if (ccs[j] == ccs[i])
                ccs[j] = ccs[--nccs];
            else
                j++;
    if ((rc = pkgsrc_for_ref(&s, NULL, ctx, ref, NULL)) != TK_OK || (rc = tk_jit__nvrtc_id(&nvid)) != TK_OK)
        goto fail;
    {
        /* every arch's units in one plan: one batch of compiles, counted together ([3/7] ...) */
        plan all = {NULL, 0};
        for (size_t a = 0; a < nccs && rc == TK_OK; a++) {
            plan p;
            cunit *grown;
            if ((rc = plan_make(&p, &s, ccs[a], 0, nvid)) != TK_OK)
                break;
            if (p.n == 0)
                tk_api__log(ctx, TK_LOG_INFO, "%s: no kernel targets sm_%d", s.pkgname, ccs[a]);
            if (p.n && !(grown = realloc(all.u, (all.n + p.n) * sizeof *all.u))) {
                rc = tk__err(TK_ERR_NOMEM, "out of memory");
                tk_api__plan_free(&p);
                break;
            }
            if (p.n) {
                all.u = grown;
                memcpy(all.u + all.n, p.u, p.n * sizeof *p.u);
                all.n += p.n;
            }
            free(p.u); /* its units moved into all */
        }
        if (rc == TK_OK)
            rc = tk_api__plan_build(&all, ctx, &s, opts->jobs, &nc, &nh);
        tk_api__plan_free(&all);
        if (rc != TK_OK)
            goto fail;
    }
    if (compiled)
        *compiled = nc;
    if (cached)
        *cached = nh;
fail:
    tk_api__pkgsrc_free(&s);
    return rc;
}
