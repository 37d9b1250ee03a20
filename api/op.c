/*
 * op.c — the ops half of tk.h: tk_op_run (validate, then run the CPU reference for host tensors or the
 * best installed kernel for CUDA tensors) and tk_ops_json.
 *
 * Implementations are the kernels of installed packages whose manifest entry names the op. They are
 * read from the manifests once per context (and again when a call finds no implementation, so a
 * package installed meanwhile is seen), filtered by the call's dtypes and the device's compute
 * capability, and ranked by priority (then name, then the higher major). The config key "ops" overrides
 * the choice per op: {"ops": {"silu_and_mul": "org/name"}} ("org/name@2", or "org/name:kernel" for one
 * kernel). Loaded tk_kernel handles are kept in the context (ctx->ops) until tk_ctx_free.
 *
 * Ops that packages declare (kernel.json "ops", manifest/opdecl.c) are read with the kernels: tk_op_run
 * checks a call against the declaration as against a built-in signature. A package directory added
 * with tk_ops_add_package joins them, marked local: its declarations replace its installed version's,
 * and its kernels are tried first, without autotune.
 *
 * Autotune: when more than one implementation fits a call on a GPU, each is timed (CUDA events; a
 * warm-up, then the best of three launches) on the call's own tensors, with every output tensor saved
 * before and restored before each run and at the end, so in-place ops see their original inputs and the
 * caller's data is as if only the final run happened. The winner is stored in cache.db per device
 * name, arch, op, dtypes and shape bucket (each dimension rounded up to a power of two, integer scalars
 * exact) and used directly next time. TK_AUTOTUNE=0 or config "autotune": false ranks by priority only;
 * a config "ops" override and a package directory's kernel always win. Candidate order without a measurement is priority, then name.
 *
 * Launching goes through the public API (tk_get_kernel, tk_function_call), so the dispatch sees
 * exactly what users of tk.h see; only autotune's timing and saving use jit/ directly.
 */
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "api/builtin.h"
#include "cache/kcache.h"
#include "manifest/manifest.h"
#include "jit/jit.h"
#include "ops/cpu.h"
#include "ops/ops.h"
#include "ops/selftest.h"

#define TK_OPS_IMPL_CPU_FALLBACK "cpu-reference (fallback)"

/* A kernel parameter as the manifest declares it: what the caller must bind. */
typedef struct {
    char *name;
    int tensor;       /* 1: "type": "tensor" */
    unsigned dtype;   /* tensors: TK_OPS_* bit of "dtype" */
    int derived;      /* 1: has a "value" expression (tk_function_call computes it) */
    int optional;     /* tensors: "optional": true (a null pointer when the call leaves it out) */
} kparam;

typedef struct {
    char *pkg;        /* "org/name" */
    int major;
    char *version;
    char *commit;
    char *kernel;     /* manifest kernel name */
    char *op;
    char *impl;       /* "org/name:kernel", what *impl points at */
    unsigned dtypes;  /* constraints.dtypes as TK_OPS_* bits; 0: unconstrained */
    int min_cc, max_cc;  /* 0: no bound */
    int64_t priority;
    kparam *params;
    size_t nparams;
    const tk_api_builtin *builtin; /* non-NULL: tk's own implementation (api/builtin.h), not a kernel */
    char *local;      /* a package directory (tk_ops_add_package): never installed; NULL otherwise */
    /* its recorded self-test (api/selftest.c), looked up on first need for one device */
    int st_dev;       /* the device st_* describe; -1: not looked up */
    int st_status;    /* TK_ST_* */
    char st_key[TK_SHA256_HEX]; /* the binary it was looked up for ("": not known) */
    char *st_detail;  /* the record's summary, or NULL */
    int st_warned;    /* the "not using it" warning was logged in this context */
} cand;

/* An op a package declares (kernel.json "ops"), as the registry holds it. */
typedef struct {
    tk_op_desc *op;   /* manifest/opdecl.c; op->package is the declaring "org/name" */
    int major;
    char *local;      /* the declaring package's directory when it is local */
} declared;

/* A package directory added with tk_ops_add_package. */
typedef struct {
    char *dir;
    char *name;
    char *version;
    char *manifest;
} localpkg;

typedef struct {
    char *commit;
    int device;
    tk_kernel *k;
} loaded;

typedef struct {
    cand *c;
    size_t n;
    int scanned;
    loaded *l;
    size_t nl;
    char **names; /* every impl string handed out: they live as long as the context */
    size_t nnames;
    struct {
        char key[TK_SHA256_HEX];
        const char *impl; /* interned */
    } *tuned;             /* autotune choices met in this context: cache.db is read once per key */
    size_t ntuned;
    declared *decl;       /* read with the candidates */
    size_t ndecl;
    char **conflicts;     /* "op\0message": ops two packages declare differently */
    size_t nconflicts;
    localpkg *local;      /* kept until the context is freed */
    size_t nlocal;
    struct {
        char *ref;        /* "org/name@commit" or a package directory */
        int cc;
        json_t *keys;     /* {kernel: binary key} (api/kernel.c plans it) */
    } *keymaps;           /* self-test routing: each package's binary keys, planned once */
    size_t nkeymaps;
} ops_state;

static void cand_clear(cand *c)
{
    free(c->pkg);
    free(c->version);
    free(c->commit);
    free(c->kernel);
    free(c->op);
    free(c->impl);
    free(c->local);
    free(c->st_detail);
    for (size_t i = 0; i < c->nparams; i++)
        free(c->params[i].name);
    free(c->params);
    memset(c, 0, sizeof *c);
}

static void cands_free(ops_state *s)
{
    for (size_t i = 0; i < s->n; i++)
        cand_clear(&s->c[i]);
    free(s->c);
    s->c = NULL;
    s->n = 0;
    for (size_t i = 0; i < s->ndecl; i++) {
        tk_manifest__op_declared_free(s->decl[i].op);
        free(s->decl[i].local);
    }
    free(s->decl);
    s->decl = NULL;
    s->ndecl = 0;
    for (size_t i = 0; i < s->nconflicts; i++)
        free(s->conflicts[i]);
    free(s->conflicts);
    s->conflicts = NULL;
    s->nconflicts = 0;
    s->scanned = 0;
}

static void state_free(void *p)
{
    ops_state *s = p;
    if (!s)
        return;
    cands_free(s);
    for (size_t i = 0; i < s->nl; i++) {
        tk_kernel_free(s->l[i].k);
        free(s->l[i].commit);
    }
    free(s->l);
    for (size_t i = 0; i < s->nnames; i++)
        free(s->names[i]);
    free(s->names);
    free(s->tuned);
    for (size_t i = 0; i < s->nlocal; i++) {
        free(s->local[i].dir);
        free(s->local[i].name);
        free(s->local[i].version);
        free(s->local[i].manifest);
    }
    free(s->local);
    for (size_t i = 0; i < s->nkeymaps; i++) {
        free(s->keymaps[i].ref);
        json_decref(s->keymaps[i].keys);
    }
    free(s->keymaps);
    free(s);
}

/* A copy of impl that stays valid until the context is freed (candidates are re-read at times). */
static const char *intern(ops_state *s, const char *impl)
{
    for (size_t i = 0; i < s->nnames; i++)
        if (strcmp(s->names[i], impl) == 0)
            return s->names[i];
    char **nn = realloc(s->names, (s->nnames + 1) * sizeof *s->names);
    if (!nn)
        return NULL;
    s->names = nn;
    if (!(s->names[s->nnames] = tk__strdup(impl)))
        return NULL;
    return s->names[s->nnames++];
}

static int get_state(ops_state **out, tk_ctx *ctx)
{
    if (!ctx->ops) {
        ops_state *s = calloc(1, sizeof *s);
        if (!s)
            return tk__err(TK_ERR_NOMEM, "out of memory");
        ctx->ops = s;
        ctx->ops_free = state_free;
    }
    *out = ctx->ops;
    return TK_OK;
}

/* ---- reading implementations from the installed manifests ------------------------------------- */

static int cmp_cand(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (!x->local != !y->local) /* the package directory being tried comes first */
        return x->local ? -1 : 1;
    if (x->priority != y->priority)
        return x->priority > y->priority ? -1 : 1;
    int r = strcmp(x->pkg, y->pkg);
    if (r)
        return r;
    if (x->major != y->major)
        return x->major > y->major ? -1 : 1;
    return strcmp(x->kernel, y->kernel);
}

/* Where a manifest comes from: an installed package, or a package directory (local). */
typedef struct {
    const char *name, *version, *commit, *local;
    int major;
} origin;

/* One candidate from kernel d of a manifest. */
/* A zeroed slot for one more candidate (s->n is not advanced), or NULL when out of memory. */
static cand *cand_slot(ops_state *s)
{
    cand *nc = realloc(s->c, (s->n + 1) * sizeof *s->c);
    if (!nc)
        return NULL;
    s->c = nc;
    memset(&s->c[s->n], 0, sizeof *s->c);
    return &s->c[s->n];
}

static int add_kernel(ops_state *s, const tk_manifest_kernel *d, const origin *o)
{
    cand *c = cand_slot(s);
    if (!c)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    c->pkg = tk__strdup(o->name);
    c->major = o->major;
    c->version = tk__strdup(o->version);
    c->commit = o->local ? tk__fmt("local:%s", o->local) : tk__strdup(o->commit);
    c->kernel = tk__strdup(d->name);
    c->op = tk__strdup(d->op);
    c->impl = tk__fmt("%s%s:%s", o->name, o->local ? "@local" : "", d->name);
    c->params = calloc(d->nparams + 1, sizeof *c->params);
    c->local = o->local ? tk__strdup(o->local) : NULL;
    c->st_dev = -1;
    if (!c->pkg || !c->version || !c->commit || !c->kernel || !c->op || !c->impl || !c->params ||
        (o->local && !c->local)) {
        cand_clear(c);
        return tk__err(TK_ERR_NOMEM, "out of memory");
    }
    s->n++;
    for (size_t j = 0; j < d->nparams; j++) {
        const tk_manifest_param *p = &d->params[j];
        kparam *kp = &c->params[c->nparams];
        if (!(kp->name = tk__strdup(p->name)))
            return tk__err(TK_ERR_NOMEM, "out of memory");
        c->nparams++;
        kp->tensor = p->type == TK_MANIFEST_P_TENSOR;
        kp->derived = p->value != NULL;
        kp->optional = p->optional;
        if (kp->tensor)
            kp->dtype = tk_ops__dtype_bit(p->dtype);
    }
    for (size_t j = 0; j < d->ndtypes; j++)
        c->dtypes |= tk_ops__dtype_bit(d->dtypes[j]);
    c->min_cc = d->min_cc;
    c->max_cc = d->max_cc;
    c->priority = d->priority;
    return TK_OK;
}

/* Adds the kernels of one parsed manifest (only the one named `only`, when not NULL). */
static int add_kernels(ops_state *s, const tk_manifest_kernels *mk, const origin *o, const char *only)
{
    int rc = TK_OK;
    for (size_t i = 0; i < mk->nk && rc == TK_OK; i++)
        if (!only || !strcmp(mk->k[i].name, only))
            rc = add_kernel(s, &mk->k[i], o);
    return rc;
}

static int add_conflict(ops_state *s, const tk_op_desc *a, const tk_op_desc *b)
{
    tk_buf sa = TK_BUF_INIT, sb = TK_BUF_INIT;
    tk_ops__signature(&sa, a);
    tk_ops__signature(&sb, b);
    char *msg = tk__fmt("%s%cop '%s' is declared differently by %s and %s:\n    %s: %s\n    %s: %s\nHINT: keep one "
                        "of them ('tk remove %s'), or ask the authors to agree on one signature",
                        a->name, '\0', a->name, a->package, b->package, a->package, sa.data ? sa.data : "?", b->package,
                        sb.data ? sb.data : "?", b->package);
    tk__buf_free(&sa);
    tk__buf_free(&sb);
    char **nc = msg ? realloc(s->conflicts, (s->nconflicts + 1) * sizeof *s->conflicts) : NULL;
    if (!nc) {
        free(msg);
        return tk__err(TK_ERR_NOMEM, "out of memory");
    }
    s->conflicts = nc;
    s->conflicts[s->nconflicts++] = msg;
    return TK_OK;
}

/* Adds one declaration. The same package's newest major (or its directory, when it is local) wins;
 * another package may declare the op again only with the same signature. Takes op. */
static int add_decl(ops_state *s, tk_op_desc *op, const origin *o)
{
    for (size_t i = 0; i < s->ndecl; i++) {
        declared *d = &s->decl[i];
        if (strcmp(d->op->name, op->name) != 0)
            continue;
        int replace = 0, rc = TK_OK;
        if (!strcmp(d->op->package, op->package))
            replace = o->local ? 1 : !d->local && o->major > d->major;
        else if (!tk_manifest__op_same(d->op, op))
            rc = add_conflict(s, d->op, op);
        if (replace) {
            char *local = o->local ? tk__strdup(o->local) : NULL;
            if (o->local && !local)
                rc = tk__err(TK_ERR_NOMEM, "out of memory");
            else {
                tk_manifest__op_declared_free(d->op);
                free(d->local);
                *d = (declared){op, o->major, local};
                return TK_OK;
            }
        }
        tk_manifest__op_declared_free(op);
        return rc;
    }
    declared *nd = realloc(s->decl, (s->ndecl + 1) * sizeof *s->decl);
    char *local = o->local ? tk__strdup(o->local) : NULL;
    if (!nd || (o->local && !local)) {
        if (nd)
            s->decl = nd;
        free(local);
        tk_manifest__op_declared_free(op);
        return tk__err(TK_ERR_NOMEM, "out of memory");
    }
    s->decl = nd;
    s->decl[s->ndecl++] = (declared){op, o->major, local};
    return TK_OK;
}

/* The op declarations and kernels of one installed manifest, parsed leniently: an entry this tk
 * cannot read is skipped (install validated the manifest, so only a newer tk's fields do that). */
static int add_manifest(ops_state *s, const char *text, const origin *o)
{
    json_t *m = json_loads(text ? text : "", 0, NULL);
    tk_manifest_kernels mk;
    int rc = m ? tk_manifest__kernels_parse(&mk, m, TK_MANIFEST_LENIENT, NULL, NULL) : TK_OK;
    json_decref(m);
    if (!m || rc != TK_OK)
        return rc == TK_ERR_NOMEM ? rc : TK_OK; /* not a manifest this tk can read: no candidates */
    for (size_t i = 0; i < mk.nops && rc == TK_OK; i++) {
        rc = add_decl(s, mk.ops[i], o); /* takes the declaration, also on failure */
        mk.ops[i] = NULL;
    }
    if (rc == TK_OK)
        rc = add_kernels(s, &mk, o, NULL);
    tk_manifest__kernels_free(&mk);
    return rc;
}

/* Adds tk's built-in implementations (api/builtin.h) as candidates like any kernel. */
static int add_builtins(ops_state *s)
{
    for (size_t i = 0; i < tk_api__builtin_count(); i++) {
        const tk_api_builtin *b = tk_api__builtin_at(i);
        cand *c = cand_slot(s);
        if (!c)
            return tk__err(TK_ERR_NOMEM, "out of memory");
        c->pkg = tk__strdup(TK_API_BUILTIN_PKG);
        c->version = tk__strdup(b->version);
        c->commit = tk__strdup("");
        c->kernel = tk__strdup(b->kernel);
        c->op = tk__strdup(b->op);
        c->impl = tk__fmt("%s:%s", TK_API_BUILTIN_PKG, b->kernel);
        if (!c->pkg || !c->version || !c->commit || !c->kernel || !c->op || !c->impl) {
            cand_clear(c);
            return tk__err(TK_ERR_NOMEM, "out of memory");
        }
        c->dtypes = b->dtypes;
        c->min_cc = b->min_cc;
        c->priority = b->priority;
        c->builtin = b;
        c->st_dev = -1;
        s->n++;
    }
    return TK_OK;
}

static int scan(ops_state *s, tk_ctx *ctx)
{
    tk_pkg_list *list = NULL;
    cands_free(s);
    int rc = tk_pkg_list_installed(&list, ctx);
    if (rc != TK_OK)
        return rc;
    for (size_t i = 0; rc == TK_OK && i < tk_pkg_list_count(list); i++) {
        const tk_pkg *p = tk_pkg_list_at(list, i);
        origin o = {tk_pkg_name(p), tk_pkg_version(p), tk_pkg_commit(p), NULL, tk_pkg_major(p)};
        rc = add_manifest(s, tk_pkg_manifest(p), &o);
    }
    tk_pkg_list_free(list);
    for (size_t i = 0; rc == TK_OK && i < s->nlocal; i++) {
        const localpkg *lp = &s->local[i];
        int major = 0;
        tk_manifest__version_parse(lp->version, &major);
        origin o = {lp->name, lp->version, "", lp->dir, major};
        rc = add_manifest(s, lp->manifest, &o);
    }
    if (rc == TK_OK)
        rc = add_builtins(s);
    if (rc != TK_OK) {
        cands_free(s);
        return rc;
    }
    if (s->n)
        qsort(s->c, s->n, sizeof *s->c, cmp_cand);
    s->scanned = 1;
    return TK_OK;
}

/* ---- choosing one ----------------------------------------------------------------------------- */

/* The override for op from the config: "org/name", "org/name@2" or "org/name:kernel". Parsed into
 * pkg (65+65 bytes), major (0: any) and kernel (NULL: any). */
typedef struct {
    char pkg[160];
    int major;
    char kernel[128];
    const char *text;
} override;

static int get_override(override *o, const tk_ctx *ctx, const char *op)
{
    memset(o, 0, sizeof *o);
    json_t *ops = json_object_get(ctx->config, "ops");
    const char *v = json_string_value(json_object_get(ops, op));
    if (!v)
        return 0;
    o->text = v;
    size_t n = strcspn(v, "@:");
    snprintf(o->pkg, sizeof o->pkg, "%.*s", (int)n, v);
    const char *p = v + n;
    if (*p == '@') {
        p++;
        if (*p == 'v')
            p++;
        o->major = (int)strtol(p, NULL, 10);
        p += strcspn(p, ":");
    }
    if (*p == ':')
        snprintf(o->kernel, sizeof o->kernel, "%s", p + 1);
    return 1;
}

/* Why cand c cannot serve call k (NULL: it can). */
static const char *unfit(const cand *c, const tk_op_call *k, int cc, const override *ov)
{
    if (strcmp(c->op, k->op->name) != 0)
        return "another op";
    if (ov) {
        if (strcmp(c->pkg, ov->pkg) != 0 || (ov->major && c->major != ov->major) ||
            (ov->kernel[0] && strcmp(c->kernel, ov->kernel) != 0))
            return "not the configured package";
    }
    if (c->dtypes && !(c->dtypes & tk_ops__dtype_bit(k->dtype)))
        return "dtype";
    if ((c->min_cc && cc < c->min_cc) || (c->max_cc && cc > c->max_cc))
        return "compute capability";
    if (c->builtin) /* takes every parameter of its op */
        return NULL;
    for (size_t i = 0; i < c->nparams; i++) {
        const kparam *p = &c->params[i];
        if (p->derived)
            continue;
        int idx = tk_ops__param_index(k->op, p->name);
        if (idx < 0)
            return "a parameter the op does not have";
        const tk_op_param *op = &k->op->params[idx];
        if (p->tensor != (op->kind == TK_ARG_TENSOR))
            return "a parameter of another kind";
        if (p->tensor && !k->t[idx] && !p->optional)
            return "needs an argument the call leaves out";
        if (p->tensor && k->t[idx] && p->dtype != tk_ops__dtype_bit(k->t[idx]->dtype))
            return "dtype";
    }
    /* An argument the call gives that the kernel does not take would be silently dropped: an output
     * left unwritten, or an option ignored. A scalar left at its default is fine. */
    for (size_t i = 0; i < k->op->nparams; i++) {
        const tk_op_param *op = &k->op->params[i];
        int given = op->kind == TK_ARG_TENSOR ? k->t[i] != NULL
                    : op->kind == TK_ARG_I64  ? k->given[i] && k->i[i] != (int64_t)op->def
                                              : k->given[i] && k->f[i] != op->def;
        if (!given)
            continue;
        size_t j = 0;
        while (j < c->nparams && strcmp(c->params[j].name, op->name) != 0)
            j++;
        if (j == c->nparams)
            return "does not take an argument the call gives";
    }
    return NULL;
}

static int kernel_for(tk_kernel **out, ops_state *s, tk_ctx *ctx, const cand *c, int device)
{
    for (size_t i = 0; i < s->nl; i++)
        if (s->l[i].device == device && strcmp(s->l[i].commit, c->commit) == 0) {
            *out = s->l[i].k;
            return TK_OK;
        }
    loaded *nl = realloc(s->l, (s->nl + 1) * sizeof *s->l);
    if (!nl)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    s->l = nl;
    char *ref = c->local ? tk__strdup(c->local) : tk__fmt("%s@%s", c->pkg, c->commit);
    char *commit = tk__strdup(c->commit);
    if (!ref || !commit) {
        free(ref);
        free(commit);
        return tk__err(TK_ERR_NOMEM, "out of memory");
    }
    tk_kernel_opts ko = TK_KERNEL_OPTS_INIT;
    ko.device = device;
    tk_kernel *k = NULL;
    int rc = tk_get_kernel(&k, ctx, ref, &ko);
    free(ref);
    if (rc != TK_OK) {
        free(commit);
        return rc;
    }
    s->l[s->nl++] = (loaded){commit, device, k};
    *out = k;
    return TK_OK;
}

/* Binds the call's arguments to the kernel's caller-given params by name and launches. */
static int launch(const cand *c, const tk_function *fn, const tk_op_call *k, void *stream)
{
    if (c->builtin)
        return c->builtin->run(k, stream);
    tk_arg args[TK_OPS_MAX_PARAMS];
    size_t n = 0;
    for (size_t i = 0; i < c->nparams && n < TK_OPS_MAX_PARAMS; i++) {
        const kparam *p = &c->params[i];
        if (p->derived)
            continue;
        int idx = tk_ops__param_index(k->op, p->name);
        const tk_op_param *op = &k->op->params[idx];
        tk_arg a;
        memset(&a, 0, sizeof a);
        a.name = op->name;
        a.kind = op->kind;
        a.t = k->t[idx];
        a.i = k->i[idx];
        a.f = k->f[idx];
        args[n++] = a;
    }
    return tk_function_call(fn, args, n, stream);
}

/* ---- autotune --------------------------------------------------------------------------------- */

static int autotune_on(const tk_ctx *ctx)
{
    const char *e = getenv("TK_AUTOTUNE");
    if (e && *e)
        return strcmp(e, "0") != 0 && strcmp(e, "off") != 0;
    json_t *v = json_object_get(ctx->config, "autotune");
    return !json_is_false(v);
}

/* Rounds up to a power of two (0 stays 0): the shape bucket of one dimension. */
static int64_t bucket(int64_t v)
{
    int64_t b = 1;
    if (v <= 0)
        return 0;
    while (b < v && b < ((int64_t)1 << 62))
        b <<= 1;
    return b;
}

/* The tune key's text: device, arch, op, then each given argument (tensors as dtype and bucketed
 * shape, integer scalars exactly; float scalars do not change which kernel is fastest). */
int tk_api__tune_text(tk_buf *b, const char *device_name, int cc, const void *call)
{
    const tk_op_call *k = call;
    tk__buf_printf(b, "tune-1|%s|sm_%d|%s", device_name, cc, k->op->name);
    for (size_t i = 0; i < k->op->nparams; i++) {
        const tk_op_param *p = &k->op->params[i];
        if (p->kind == TK_ARG_TENSOR) {
            const tk_tensor *t = k->t[i];
            if (!t) {
                tk__buf_printf(b, "|%s:-", p->name);
                continue;
            }
            tk__buf_printf(b, "|%s:%s[", p->name, tk_ops__dtype_str(t->dtype));
            for (int32_t d = 0; d < t->ndim; d++)
                tk__buf_printf(b, "%s%lld", d ? "," : "", (long long)bucket(t->shape[d]));
            tk__buf_puts(b, "]");
        } else if (p->kind == TK_ARG_I64) {
            tk__buf_printf(b, "|%s=%lld", p->name, (long long)k->i[i]);
        }
    }
    return b->data ? TK_OK : tk__err(TK_ERR_NOMEM, "out of memory");
}

static int launch(const cand *c, const tk_function *fn, const tk_op_call *k, void *stream);
static int kernel_for(tk_kernel **out, ops_state *s, tk_ctx *ctx, const cand *c, int device);

typedef struct {
    uint64_t save;  /* device copy of an output tensor's bytes */
    uint64_t data;  /* the tensor's first byte */
    size_t bytes;
} saved_out;

/* Times candidates order[0..n) on the call and sorts order by time (failures last). The outputs are
 * restored to what they held before. *detail receives "impl=us;..." for the cache. */
static int measure(ops_state *s, tk_ctx *ctx, const tk_op_call *k, void *stream, size_t *order, size_t n, double *us,
                   tk_buf *detail)
{
    saved_out sv[TK_OPS_MAX_PARAMS];
    size_t nsv = 0;
    tk_jit_timer *tm = NULL;
    int rc = tk_jit__timer_new(&tm, k->device_id);
    for (size_t i = 0; rc == TK_OK && i < k->op->nparams; i++) {
        const tk_tensor *t = k->t[i];
        if (!t || k->op->params[i].role != TK_OPS_OUT || tk_ops__numel(t) == 0)
            continue;
        saved_out *o = &sv[nsv];
        o->bytes = (size_t)tk_ops__numel(t) * tk_ops__dtype_size(t->dtype);
        o->data = (uint64_t)(uintptr_t)tk_ops__base(t);
        if ((rc = tk_jit__mem_alloc(&o->save, k->device_id, o->bytes)) != TK_OK)
            break;
        nsv++;
        rc = tk_jit__mem_copy_async(o->save, o->data, o->bytes, k->device_id, stream);
    }
    for (size_t j = 0; rc == TK_OK && j < n; j++) {
        const cand *c = &s->c[order[j]];
        tk_kernel *kern = NULL;
        const tk_function *fn = NULL;
        double best = 1e300;
        if (c->builtin || (kernel_for(&kern, s, ctx, c, k->device_id) == TK_OK &&
                           tk_kernel_function(&fn, kern, c->kernel) == TK_OK)) {
            for (int rep = 0; rep < 4; rep++) {
                float ms = 0;
                int lr = TK_OK;
                for (size_t v = 0; lr == TK_OK && v < nsv; v++)
                    lr = tk_jit__mem_copy_async(sv[v].data, sv[v].save, sv[v].bytes, k->device_id, stream);
                if (lr == TK_OK)
                    lr = tk_jit__timer_start(tm, stream);
                if (lr == TK_OK)
                    lr = launch(c, fn, k, stream);
                if (lr == TK_OK)
                    lr = tk_jit__timer_stop(tm, stream, &ms);
                if (lr != TK_OK) {
                    if (lr != TK_ERR_UNSUPPORTED && lr != TK_ERR_INVALID)
                        rc = lr; /* a device fault: stop tuning */
                    best = 1e300;
                    break;
                }
                if (rep > 0 && ms * 1000.0 < best) /* rep 0 warms up */
                    best = ms * 1000.0;
            }
        }
        us[j] = best;
        tk__buf_printf(detail, "%s%s=%.2f", j ? ";" : "", c->impl, best < 1e300 ? best : -1.0);
    }
    for (size_t v = 0; v < nsv; v++) {
        if (rc == TK_OK)
            rc = tk_jit__mem_copy_async(sv[v].data, sv[v].save, sv[v].bytes, k->device_id, stream);
    }
    if (nsv && tk_jit__sync(k->device_id) != TK_OK && rc == TK_OK)
        rc = TK_ERR_LAUNCH;
    for (size_t v = 0; v < nsv; v++)
        tk_jit__mem_free(sv[v].save, k->device_id);
    tk_jit__timer_free(tm);
    /* insertion sort by time: n is small */
    for (size_t a = 1; a < n; a++)
        for (size_t b = a; b > 0 && us[b] < us[b - 1]; b--) {
            double t = us[b];
            us[b] = us[b - 1];
            us[b - 1] = t;
            size_t o = order[b];
            order[b] = order[b - 1];
            order[b - 1] = o;
        }
    return rc;
}

/* Puts the fastest fitting candidate first in order[], from cache.db or by measuring. Best effort:
 * any failure leaves the priority order and logs why. */
static void autotune(ops_state *s, tk_ctx *ctx, const tk_op_call *k, void *stream, const tk_device_info *dev, int cc,
                     size_t *order, size_t n)
{
    tk_buf text = TK_BUF_INIT, detail = TK_BUF_INIT;
    struct tk_kcache *kc = NULL;
    char key[TK_SHA256_HEX], *stored = NULL;
    const char *best = NULL;
    double us[64];
    if (n < 2 || n > 64 || !autotune_on(ctx) || tk_api__tune_text(&text, dev->name, cc, k) != TK_OK)
        goto done;
    tk__sha256_hex(key, text.data, text.len);
    for (size_t i = 0; i < s->ntuned && !best; i++) /* met before in this context */
        if (strcmp(s->tuned[i].key, key) == 0)
            best = s->tuned[i].impl;
    if (!best && tk_api__kcache(&kc, ctx) == TK_OK) {
        if (tk_kcache__tune_get(kc, key, &stored) == TK_OK) {
            best = intern(s, stored);
            tk_api__log(ctx, TK_LOG_DEBUG, "%s: tuned choice %s (cache.db)", k->op->name, stored);
        } else if (measure(s, ctx, k, stream, order, n, us, &detail) != TK_OK) {
            tk_api__log(ctx, TK_LOG_WARN, "%s: autotune failed (%s); using priority order", k->op->name,
                        tk_last_error());
        } else if (us[0] < 1e300) {
            best = intern(s, s->c[order[0]].impl);
            tk_kcache__tune_put(kc, key, s->c[order[0]].impl, us[0], detail.data);
            tk_api__log(ctx, TK_LOG_INFO, "%s: autotuned for %s: %s (%.1f us; %s)", k->op->name, text.data,
                        s->c[order[0]].impl, us[0], detail.data ? detail.data : "");
        }
        void *nt = best ? realloc(s->tuned, (s->ntuned + 1) * sizeof *s->tuned) : NULL;
        if (nt) {
            s->tuned = nt;
            memcpy(s->tuned[s->ntuned].key, key, sizeof key);
            s->tuned[s->ntuned++].impl = best;
        }
    }
    for (size_t j = 0; best && j < n; j++) /* the choice first; the rest keep their order */
        if (strcmp(s->c[order[j]].impl, best) == 0) {
            size_t o = order[j];
            memmove(order + 1, order, j * sizeof *order);
            order[0] = o;
            break;
        }
done:
    free(stored);
    tk__buf_free(&text);
    tk__buf_free(&detail);
}

/* ---- self-test routing ------------------------------------------------------------------------ */

/* The package reference of a candidate: its directory, or "org/name@commit". */
static char *cand_ref(const cand *c) { return c->local ? tk__strdup(c->local) : tk__fmt("%s@%s", c->pkg, c->commit); }

static void keymap_each(void *user, const char *kernel, const char *key)
{
    json_object_set_new((json_t *)user, kernel, json_string(key));
}

/* The binary key candidate c compiles in for cc, planned once per package (no compile). "" when the
 * package cannot be read (dispatch will say why when it loads it). */
static const char *cand_key(ops_state *s, tk_ctx *ctx, const cand *c, int cc)
{
    char *ref = cand_ref(c);
    const char *key = "";
    size_t i;
    if (!ref)
        return key;
    for (i = 0; i < s->nkeymaps; i++)
        if (s->keymaps[i].cc == cc && !strcmp(s->keymaps[i].ref, ref))
            break;
    if (i == s->nkeymaps) {
        void *nk = realloc(s->keymaps, (s->nkeymaps + 1) * sizeof *s->keymaps);
        json_t *keys = json_object();
        if (!nk || !keys) {
            json_decref(keys);
            free(ref);
            if (nk)
                s->keymaps = nk;
            return key;
        }
        s->keymaps = nk;
        if (tk_api__kernel_keys(ctx, ref, cc, keymap_each, keys) != TK_OK)
            tk__err_clear();
        s->keymaps[i].ref = ref;
        s->keymaps[i].cc = cc;
        s->keymaps[i].keys = keys;
        s->nkeymaps++;
        ref = NULL;
    }
    free(ref);
    const char *k = json_string_value(json_object_get(s->keymaps[i].keys, c->kernel));
    return k ? k : key;
}

/* Looks c's record up for binary `key` on device dev (TK_ST_NONE when there is none). */
static void cand_lookup(tk_ctx *ctx, cand *c, const char *key, int dev)
{
    free(c->st_detail);
    c->st_detail = NULL;
    c->st_dev = dev;
    c->st_status = TK_ST_NONE;
    snprintf(c->st_key, sizeof c->st_key, "%s", key);
    if (c->builtin) { /* tk's own (cuBLASLt): tested by tk's suite, like the CPU reference */
        c->st_status = TK_ST_PASSED;
        return;
    }
    if (!key[0] || tk_api__selftest_status(&c->st_status, &c->st_detail, ctx, key, c->kernel, dev) != TK_OK) {
        c->st_status = TK_ST_NONE;
        tk__err_clear();
    }
}

/* c's recorded status on the call's device, looked up on first need. */
static int cand_status(ops_state *s, tk_ctx *ctx, cand *c, int dev, int cc)
{
    if (c->st_dev != dev)
        cand_lookup(ctx, c, c->builtin ? "" : cand_key(s, ctx, c, cc), dev);
    return c->st_status;
}

/* The warning for a kernel routing leaves out, once per kernel and context. */
static void warn_skip(tk_ctx *ctx, cand *c, const char *op, const tk_device_info *dev)
{
    if (c->st_warned)
        return;
    c->st_warned = 1;
    tk_api__log(ctx, TK_LOG_WARN,
                "%s: not using %s: its self-test %s on this GPU (%s)%s%s\nHINT: re-check it with 'tk selftest %s' "
                "(after an update of the package, the driver or tk it is tested again)",
                op, c->impl,
                c->st_status == TK_ST_FAILED        ? "failed"
                : c->st_status == TK_ST_CRASHED     ? "crashed"
                : c->st_status == TK_ST_TIMED_OUT   ? "timed out"
                : c->st_status == TK_ST_INTERRUPTED ? "was interrupted (the process testing it ended)"
                : c->st_status == TK_ST_UNTESTED    ? "cannot run (no CPU reference or no case fits it)"
                                                    : "has not passed",
                dev->name, c->st_detail ? ": " : "", c->st_detail ? c->st_detail : "", c->local ? c->local : c->pkg);
}

/* The error when every kernel that fits was left out by the self-test rules. */
static int selftest_error(const ops_state *s, const tk_op_call *k, const size_t *idx, size_t n, int mode,
                          const tk_device_info *dev)
{
    tk_buf b = TK_BUF_INIT;
    const char *pkg = NULL;
    for (size_t i = 0; i < n && i < 4; i++) {
        const cand *c = &s->c[idx[i]];
        tk__buf_printf(&b, "\n    %s: %s%s%s", c->impl, tk_ops__st_name(c->st_status), c->st_detail ? " - " : "",
                       c->st_detail ? c->st_detail : "");
        if (!pkg)
            pkg = c->local ? c->local : c->pkg;
    }
    if (n > 4)
        tk__buf_printf(&b, "\n    ... and %zu more", n - 4);
    int rc =
        tk__err(TK_ERR_SELFTEST,
                "%s: no kernel for %s on cuda:%d (%s) may run: %s%s\nHINT: re-check with 'tk selftest %s'; set "
                "\"cpu_fallback\": true in config.json to run the CPU reference instead (slow), or \"selftest\": "
                "\"%s\" to use them anyway",
                k->op->name, tk_ops__dtype_str(k->dtype), k->device_id, dev->name,
                mode == TK_SELFTEST_REQUIRED ? "\"selftest\": \"required\" uses only kernels that passed on this GPU"
                                             : "each failed its self-test on this GPU",
                b.data ? b.data : "", pkg ? pkg : "ORG/NAME", mode == TK_SELFTEST_REQUIRED ? "record" : "off");
    tk__buf_free(&b);
    return rc;
}

/* The call on the CPU reference, for CUDA tensors whose kernels all failed (config "cpu_fallback"):
 * every tensor is copied to the host, the reference runs, the outputs are copied back. */
static int run_on_cpu(tk_ctx *ctx, const tk_op_call *k, const char **impl)
{
    const tk_op_desc *op = k->op;
    tk_tensor ht[TK_OPS_MAX_PARAMS];
    void *buf[TK_OPS_MAX_PARAMS] = {NULL};
    tk_arg args[TK_OPS_MAX_PARAMS];
    size_t n = 0;
    int rc = tk_device_sync(k->device_id);
    if (!op->cpu)
        rc = tk__err(TK_ERR_UNSUPPORTED, "%s has no CPU reference to fall back on", op->name);
    for (size_t i = 0; rc == TK_OK && i < op->nparams; i++) {
        const tk_op_param *p = &op->params[i];
        memset(&args[n], 0, sizeof args[n]);
        args[n].name = p->name;
        args[n].kind = p->kind;
        if (p->kind != TK_ARG_TENSOR) {
            if (!k->given[i])
                continue;
            args[n].i = k->i[i];
            args[n].f = k->f[i];
            n++;
            continue;
        }
        if (!k->t[i])
            continue;
        size_t bytes = (size_t)tk_ops__numel(k->t[i]) * tk_ops__dtype_size(k->t[i]->dtype);
        if (!(buf[i] = malloc(bytes ? bytes : 1))) {
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
            break;
        }
        rc = bytes ? tk_device_copy(buf[i], tk_ops__base(k->t[i]), bytes, TK_COPY_D2H, k->device_id) : TK_OK;
        ht[i] = *k->t[i];
        ht[i].data = buf[i];
        ht[i].byte_offset = 0;
        ht[i].strides = NULL;
        ht[i].device.device_type = TK_DEV_CPU;
        ht[i].device.device_id = 0;
        args[n].t = &ht[i];
        n++;
    }
    tk_op_call hc;
    if (rc == TK_OK && (rc = tk_ops__prepare_op(&hc, op, args, n)) == TK_OK)
        rc = tk_ops__run_cpu(&hc);
    for (size_t i = 0; rc == TK_OK && i < op->nparams; i++)
        if (buf[i] && op->params[i].role == TK_OPS_OUT) {
            size_t bytes = (size_t)tk_ops__numel(k->t[i]) * tk_ops__dtype_size(k->t[i]->dtype);
            if (bytes)
                rc = tk_device_copy(tk_ops__base(k->t[i]), buf[i], bytes, TK_COPY_H2D, k->device_id);
        }
    for (size_t i = 0; i < op->nparams; i++)
        free(buf[i]);
    if (rc == TK_OK && impl)
        *impl = TK_OPS_IMPL_CPU_FALLBACK;
    return rc;
}

/* Applies the self-test rules to the fitting candidates order[0..*n): drops those routing skips
 * (warning once each), and returns TK_ROUTE_OK (*n left, *untested set when one must be tested
 * before use), TK_ROUTE_CPU or TK_ROUTE_ERROR (the error set). */
static int route(ops_state *s, tk_ctx *ctx, const tk_op_call *k, const tk_device_info *dev, int cc, size_t *order,
                 size_t *n, int mode, int *untested)
{
    /* on the stack: this runs on every call of an op on a GPU (the statuses are looked up once) */
    int st[64], act[64];
    size_t skipped[64], nskip = 0, kept = 0, m = *n < 64 ? *n : 64;
    int cpu = tk_api__cpu_fallback(ctx) && k->op->cpu, r;
    *untested = 0;
    for (size_t f = 0; f < m; f++)
        st[f] = cand_status(s, ctx, &s->c[order[f]], k->device_id, cc);
    r = tk_ops__route(act, st, m, mode, cpu);
    for (size_t f = 0; f < m; f++) {
        cand *c = &s->c[order[f]];
        if (act[f] == TK_ROUTE_SKIP) {
            warn_skip(ctx, c, k->op->name, dev);
            skipped[nskip++] = order[f];
            continue;
        }
        *untested |= act[f] == TK_ROUTE_TEST_FIRST;
        order[kept++] = order[f];
    }
    *n = kept; /* beyond 64 fitting kernels (never seen): the rest are left out */
    if (r == TK_ROUTE_ERROR)
        selftest_error(s, k, skipped, nskip, mode, dev);
    return r;
}

/* Just before c runs (mode on): its record for the binary actually loaded, a self-test first when
 * "required" asks for one. TK_OK to run it, TK_ERR_SELFTEST to go on with the next candidate. */
static int check_loaded(ops_state *s, tk_ctx *ctx, cand *c, const tk_function *fn, const tk_op_call *k,
                        const tk_device_info *dev, int mode)
{
    const char *key = fn ? tk_api__function_key(fn) : NULL;
    (void)s;
    if (c->builtin || !key)
        return TK_OK;
    if (strcmp(key, c->st_key) != 0) /* planned and loaded binaries differ (a GPU newer than NVRTC: PTX) */
        cand_lookup(ctx, c, key, k->device_id);
    if (mode == TK_SELFTEST_REQUIRED && c->st_status == TK_ST_NONE) {
        char *ref = cand_ref(c);
        int st = TK_ST_NONE;
        tk_api__log(ctx, TK_LOG_INFO, "%s: self-testing %s on %s before its first use (\"selftest\": \"required\")",
                    k->op->name, c->impl, dev->name);
        int rc = ref ? tk_api__selftest_kernel(&st, ctx, ref, c->kernel, k->device_id) : TK_ERR_NOMEM;
        free(ref);
        if (rc != TK_OK)
            tk_api__log(ctx, TK_LOG_WARN, "%s: the self-test of %s could not run: %s", k->op->name, c->impl,
                        tk_last_error());
        cand_lookup(ctx, c, key, k->device_id);
    }
    int ok = mode == TK_SELFTEST_REQUIRED ? c->st_status == TK_ST_PASSED : !tk_ops__st_bad(c->st_status);
    if (ok)
        return TK_OK;
    warn_skip(ctx, c, k->op->name, dev);
    return tk__err(TK_ERR_SELFTEST, "its self-test on this GPU: %s%s%s", tk_ops__st_name(c->st_status),
                   c->st_detail ? " - " : "", c->st_detail ? c->st_detail : "");
}

/* Kernels take contiguous row-major tensors: TK_ERR_UNSUPPORTED naming the first that is not. */
static int check_contiguous(const tk_op_call *k)
{
    const tk_op_desc *op = k->op;
    for (size_t i = 0; i < op->nparams; i++) {
        const tk_tensor *t = k->t[i];
        if (op->params[i].kind == TK_ARG_TENSOR && t && !tk_ops__contiguous(t)) {
            tk_buf st = TK_BUF_INIT;
            tk_ops__shape_str(&st, t->ndim, t->strides);
            int rc =
                tk__err(TK_ERR_UNSUPPORTED,
                        "%s: '%s' (shape %s, strides %s) is not contiguous; kernels take contiguous "
                        "row-major tensors\nHINT: pass a contiguous copy (x.contiguous() in PyTorch)",
                        op->name, op->params[i].name, tk_ops__shape_fmt(t->ndim, t->shape), st.data ? st.data : "?");
            tk__buf_free(&st);
            return rc;
        }
    }
    return TK_OK;
}

/* The candidates that fit call k on arch cc (and the override), in priority order: *order (malloc'd,
 * NULL when there are no candidates) and *nfit. */
static int fitting(size_t **order, size_t *nfit, const ops_state *s, tk_ctx *ctx, const tk_op_call *k, int cc,
                   const override *ov)
{
    *nfit = 0;
    *order = s->n ? malloc(s->n * sizeof **order) : NULL;
    if (s->n && !*order)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < s->n; i++) {
        const char *why = unfit(&s->c[i], k, cc, ov);
        if (!why)
            (*order)[(*nfit)++] = i;
        else if (strcmp(why, "another op") != 0)
            tk_api__log(ctx, TK_LOG_DEBUG, "%s: skipping %s (%s)", k->op->name, s->c[i].impl, why);
    }
    return TK_OK;
}

/* The error when no installed kernel implements call k (or the configured override's). */
static int no_kernel_error(const tk_op_call *k, const override *ov, int cc)
{
    const tk_op_desc *op = k->op;
    if (ov)
        return tk__err(TK_ERR_UNSUPPORTED,
                       "%s: the configured implementation '%s' (config \"ops\") is not installed or has no kernel "
                       "for %s on sm_%d\nHINT: run 'tk get %s', or remove the override from config.json",
                       op->name, ov->text, tk_ops__dtype_str(k->dtype), cc, ov->pkg);
    return tk__err(TK_ERR_UNSUPPORTED,
                   "%s: no installed package implements it for %s on cuda:%d (sm_%d)\nHINT: run 'tk get %s'; "
                   "'tk ops' lists the implementations",
                   op->name, tk_ops__dtype_str(k->dtype), k->device_id, cc,
                   op->package ? op->package : "<a package that provides it>");
}

static int run_cuda(ops_state *s, tk_ctx *ctx, const tk_op_call *k, void *stream, const char **impl)
{
    const tk_op_desc *op = k->op;
    int rc = check_contiguous(k);
    if (rc != TK_OK)
        return rc;
    tk_device_info dev;
    rc = tk_device_info_get(&dev, k->device_id);
    if (rc != TK_OK)
        return rc;
    int cc = dev.cc_major * 10 + dev.cc_minor;
    int mode = tk_api__selftest_mode(ctx);

    override ovr;
    const override *ov = get_override(&ovr, ctx, op->name) ? &ovr : NULL;

    for (int pass = 0; pass < 2; pass++) {
        if (!s->scanned || pass == 1) {
            if ((rc = scan(s, ctx)) != TK_OK)
                return rc;
        }
        int tried = 0, untested = 0;
        size_t nsel = 0, sel_skipped[8];
        char last_err[512] = "", last_impl[256] = "";
        int last_rc = TK_OK;
        /* the candidates that fit, in priority order, then (autotune) fastest first */
        size_t *order = NULL, nfit = 0;
        if ((rc = fitting(&order, &nfit, s, ctx, k, cc, ov)) != TK_OK)
            return rc;
        /* kernels whose recorded self-test failed on this GPU are left out (docs/selftest.md) */
        if (mode != TK_SELFTEST_OFF && nfit) {
            int r = route(s, ctx, k, &dev, cc, order, &nfit, mode, &untested);
            if (r != TK_ROUTE_OK) {
                free(order);
                if (r == TK_ROUTE_ERROR)
                    return TK_ERR_SELFTEST;
                tk_api__log(ctx, TK_LOG_WARN,
                            "%s: every kernel that fits failed its self-test on this GPU; running the "
                            "CPU reference (config \"cpu_fallback\")",
                            op->name);
                return run_on_cpu(ctx, k, impl);
            }
        }
        /* a package directory's kernel (sorted first) is what the caller came to run: no autotune; and
         * autotune times only kernels routing allows without a test first */
        if (!ov && !(nfit && s->c[order[0]].local) && !untested)
            autotune(s, ctx, k, stream, &dev, cc, order, nfit);
        for (size_t f = 0; f < nfit; f++) {
            cand *c = &s->c[order[f]];
            tried++;
            tk_kernel *kern = NULL;
            const tk_function *fn = NULL;
            rc = c->builtin ? TK_OK : kernel_for(&kern, s, ctx, c, k->device_id);
            if (rc == TK_OK && !c->builtin)
                rc = tk_kernel_function(&fn, kern, c->kernel);
            if (rc == TK_OK && mode != TK_SELFTEST_OFF && (rc = check_loaded(s, ctx, c, fn, k, &dev, mode)) != TK_OK) {
                if (nsel < sizeof sel_skipped / sizeof sel_skipped[0])
                    sel_skipped[nsel] = order[f];
                nsel++;
                tried--;
                continue;
            }
            if (rc == TK_OK)
                rc = launch(c, fn, k, stream);
            if (rc == TK_OK) {
                tk_api__log(ctx, TK_LOG_DEBUG, "%s: ran %s", op->name, c->impl);
                if (impl)
                    *impl = intern(s, c->impl); /* NULL only when out of memory */
                free(order);
                return TK_OK;
            }
            /* Try the next one; a device-wide failure will fail them all the same way. */
            last_rc = rc;
            snprintf(last_err, sizeof last_err, "%s", tk_last_error());
            snprintf(last_impl, sizeof last_impl, "%s", c->impl);
            /* a shape outside a kernel's constraints.min/max is expected: the next candidate serves it */
            tk_api__log(ctx, rc == TK_ERR_UNSUPPORTED ? TK_LOG_DEBUG : TK_LOG_WARN, "%s: %s %s: %s", op->name, c->impl,
                        rc == TK_ERR_UNSUPPORTED ? "does not fit" : "failed", last_err);
            if (rc == TK_ERR_NO_DEVICE || rc == TK_ERR_NOMEM)
                break;
        }
        free(order);
        if (!tried && nsel) { /* every fitting kernel was left out once loaded: a record, or a failed first test */
            if (tk_api__cpu_fallback(ctx) && op->cpu) {
                tk_api__log(ctx, TK_LOG_WARN,
                            "%s: no kernel that fits passed its self-test on this GPU; running the "
                            "CPU reference (config \"cpu_fallback\")",
                            op->name);
                return run_on_cpu(ctx, k, impl);
            }
            return selftest_error(s, k, sel_skipped, nsel < 8 ? nsel : 8, mode, &dev);
        }
        if (tried)
            return tk__err(last_rc, "%s: %d implementation%s found for %s on cuda:%d, none could run; %s: %s", op->name,
                           tried, tried == 1 ? "" : "s", tk_ops__dtype_str(k->dtype), k->device_id, last_impl,
                           last_err);
    }
    return no_kernel_error(k, ov, cc);
}

void tk_api__ops_forget_selftests(tk_ctx *ctx)
{
    ops_state *s = ctx ? ctx->ops : NULL;
    for (size_t i = 0; s && ctx->ops_free == state_free && i < s->n; i++) {
        s->c[i].st_dev = -1;
        s->c[i].st_warned = 0;
    }
}

/* ---- one kernel as dispatch reads it, for the self-test ----------------------------------------- */

struct tk_api_opkernel {
    ops_state st; /* holds exactly one candidate */
};

int tk_api__opkernel_new(tk_api_opkernel **out, json_t *m, const char *pkg, const char *kernel)
{
    *out = NULL;
    tk_api_opkernel *ok = calloc(1, sizeof *ok);
    if (!ok)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    origin o = {pkg, "", "", NULL, 0};
    tk_manifest_kernels mk;
    int rc = tk_manifest__kernels_parse(&mk, m, TK_MANIFEST_LENIENT, NULL, NULL);
    if (rc == TK_OK)
        rc = add_kernels(&ok->st, &mk, &o, kernel);
    tk_manifest__kernels_free(&mk);
    if (rc == TK_OK && ok->st.n != 1)
        rc = tk__err(TK_ERR_NOT_FOUND, "%s has no kernel '%s' that this tk can read", pkg, kernel);
    if (rc != TK_OK) {
        tk_api__opkernel_free(ok);
        return rc;
    }
    *out = ok;
    return TK_OK;
}

void tk_api__opkernel_free(tk_api_opkernel *ok)
{
    if (!ok)
        return;
    cands_free(&ok->st);
    free(ok);
}

const char *tk_api__opkernel_unfit(const tk_api_opkernel *ok, const void *call, int cc)
{
    return unfit(&ok->st.c[0], call, cc, NULL);
}

int tk_api__opkernel_launch(const tk_api_opkernel *ok, const tk_function *fn, const void *call, void *stream)
{
    return launch(&ok->st.c[0], fn, call, stream);
}

/* ---- declared ops ------------------------------------------------------------------------------ */

/* The declaration of op `name` among the scanned packages: *out NULL when none declares it. An op two
 * packages declare differently is an error naming both. */
static int find_declared(const tk_op_desc **out, const ops_state *s, const char *name)
{
    *out = NULL;
    for (size_t i = 0; i < s->nconflicts; i++)
        if (!strcmp(s->conflicts[i], name))
            return tk__err(TK_ERR_MANIFEST, "%s", s->conflicts[i] + strlen(name) + 1);
    for (size_t i = 0; i < s->ndecl; i++)
        if (!strcmp(s->decl[i].op->name, name)) {
            *out = s->decl[i].op;
            return TK_OK;
        }
    return TK_OK;
}

/* tk's own op, else one a package declares (scanning again once, for a package installed since). */
static int resolve_op(const tk_op_desc **out, tk_ctx *ctx, const char *name)
{
    ops_state *s = NULL;
    int rc;
    if ((*out = tk_ops__find(name)) || !name)
        return TK_OK;
    if ((rc = get_state(&s, ctx)) != TK_OK)
        return rc;
    for (int pass = 0; pass < 2 && !*out; pass++) {
        if ((!s->scanned || pass == 1) && (rc = scan(s, ctx)) != TK_OK)
            return rc;
        if ((rc = find_declared(out, s, name)) != TK_OK)
            return rc;
    }
    return TK_OK;
}

int tk_api__ops_check_declared(tk_ctx *ctx, json_t *m)
{
    const char *pkg = json_string_value(json_object_get(m, "name"));
    json_t *decls = json_object_get(m, "ops"), *j;
    ops_state *s = NULL;
    size_t i;
    int rc = TK_OK;
    if (!json_array_size(decls) || !pkg)
        return TK_OK;
    if ((rc = get_state(&s, ctx)) != TK_OK || (rc = scan(s, ctx)) != TK_OK)
        return rc;
    json_array_foreach(decls, i, j) {
        tk_op_desc *op = NULL;
        const tk_op_desc *have = NULL;
        if ((rc = tk_manifest__op_declare(&op, j, pkg)) != TK_OK)
            return rc;
        for (size_t d = 0; d < s->ndecl && !have; d++)
            if (!strcmp(s->decl[d].op->name, op->name) && strcmp(s->decl[d].op->package, pkg) != 0)
                have = s->decl[d].op;
        if (have && !tk_manifest__op_same(have, op)) {
            tk_buf sa = TK_BUF_INIT, sb = TK_BUF_INIT;
            tk_ops__signature(&sa, have);
            tk_ops__signature(&sb, op);
            rc = tk__err(TK_ERR_MANIFEST,
                         "op '%s' is declared differently by the installed %s and by %s:\n    %s: "
                         "%s\n    %s: %s\nHINT: an op has one signature on a machine: remove %s first ('tk remove "
                         "%s') or ask the authors to agree on one",
                         op->name, have->package, pkg, have->package, sa.data ? sa.data : "?", pkg,
                         sb.data ? sb.data : "?", have->package, have->package);
            tk__buf_free(&sa);
            tk__buf_free(&sb);
        }
        tk_manifest__op_declared_free(op);
        if (rc != TK_OK)
            return rc;
    }
    return TK_OK;
}

int tk_api__check_installed(void *user, const char *manifest, size_t len)
{
    json_t *m = json_loadb(manifest, len, 0, NULL);
    if (!m)
        return tk__err(TK_ERR_MANIFEST, "manifest is not valid JSON");
    int rc = tk_api__ops_check_declared(user, m); /* an op declared here must not contradict an installed one */
    json_decref(m);
    return rc;
}

TK_API int tk_ops_add_package(tk_ctx *ctx, const char *pkgdir)
{
    ops_state *s = NULL;
    tk_manifest_local lp;
    int rc = tk_api__check_ctx(ctx);
    if (rc != TK_OK)
        return rc;
    if ((rc = get_state(&s, ctx)) != TK_OK || (rc = tk_manifest__local_load(&lp, pkgdir)) != TK_OK)
        return rc;
    /* kept absolute: tk_get_kernel takes it as a directory (a bare "dir" would be a package name) */
    char *abs = realpath(lp.dir, NULL);
    if (abs) {
        free(lp.dir);
        lp.dir = abs;
    }
    localpkg *nl = realloc(s->local, (s->nlocal + 1) * sizeof *s->local);
    if (!nl) {
        tk_manifest__local_free(&lp);
        return tk__err(TK_ERR_NOMEM, "out of memory");
    }
    s->local = nl;
    s->local[s->nlocal++] = (localpkg){lp.dir, lp.name, lp.version, lp.manifest};
    lp.dir = lp.name = lp.version = lp.manifest = NULL;
    tk_manifest__local_free(&lp);
    tk_api__log(ctx, TK_LOG_WARN, "%s %s from %s is local: not signed, not installed", s->local[s->nlocal - 1].name,
                s->local[s->nlocal - 1].version, pkgdir);
    s->scanned = 0; /* read again, with it */
    return TK_OK;
}

/* ---- the public functions --------------------------------------------------------------------- */

TK_API int tk_ctx_set_threads(tk_ctx *ctx, int n)
{
    int rc = tk_api__check_ctx(ctx);
    if (rc != TK_OK)
        return rc;
    if (n < 0 || n > 256)
        return tk__err(TK_ERR_INVALID, "threads %d: want 1 to 256, or 0 for the default (%d here)", n,
                       tk_ops__default_threads());
    ctx->cpu_threads = n;
    return TK_OK;
}

TK_API int tk_ctx_threads(const tk_ctx *ctx)
{
    if (tk_api__check_ctx(ctx) != TK_OK)
        return tk_ops__default_threads();
    return ctx->cpu_threads > 0 ? ctx->cpu_threads : tk_ops__default_threads();
}

static json_t *cpu_features_json(unsigned bits)
{
    json_t *a = json_array();
    for (unsigned b = 1; b; b <<= 1)
        if ((bits & b) && tk_ops__cpu_feature_str(b))
            json_array_append_new(a, json_string(tk_ops__cpu_feature_str(b)));
    return a;
}

TK_API int tk_cpu_info_json(char **out, const tk_ctx *ctx)
{
    if (!out)
        return tk__err(TK_ERR_INVALID, "tk_cpu_info_json: out is NULL");
    *out = NULL;
    int rc = tk_api__check_ctx(ctx);
    if (rc != TK_OK)
        return rc;
    static const char *modes[] = {"auto", "portable", "reference"};
    json_t *o = json_pack("{s:o, s:i, s:i, s:s}", "features", cpu_features_json(tk_ops__cpu_features()), "threads",
                          tk_ctx_threads(ctx), "default_threads", tk_ops__default_threads(), "impl_mode",
                          modes[tk_ops__cpu_mode()]);
    char *text = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(o);
    if (!text)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    *out = text;
    return TK_OK;
}

TK_API int tk_op_run(tk_ctx *ctx, const char *op, const tk_arg *args, size_t nargs, void *stream, const char **impl)
{
    if (impl)
        *impl = NULL;
    int rc = tk_api__check_ctx(ctx);
    if (rc != TK_OK)
        return rc;
    tk_op_call call;
    const tk_op_desc *desc = NULL;
    if ((rc = resolve_op(&desc, ctx, op)) != TK_OK)
        return rc;
    rc = desc ? tk_ops__prepare_op(&call, desc, args, nargs) : tk_ops__prepare(&call, op, args, nargs);
    if (rc != TK_OK)
        return rc;
    if (call.device_type == TK_DEV_CPU) { /* ops/cpu_dispatch.c: the fastest CPU implementation that fits */
        int prev = tk_ops__set_threads(ctx->cpu_threads);
        rc = tk_ops__run_cpu_best(&call, impl);
        tk_ops__set_threads(prev);
        return rc;
    }
    /* Nothing to compute when every output is empty: no launch (a grid of zero blocks is a launch
     * error). One empty output among others (dk with no keys beside dq) still launches. */
    int outs = 0, empty = 0;
    for (size_t i = 0; i < call.op->nparams; i++)
        if (call.t[i] && call.op->params[i].role == TK_OPS_OUT) {
            outs++;
            empty += tk_ops__numel(call.t[i]) == 0;
        }
    if (outs && empty == outs) {
        if (impl)
            *impl = "empty";
        return TK_OK;
    }
    ops_state *s = NULL;
    if ((rc = get_state(&s, ctx)) != TK_OK)
        return rc;
    return run_cuda(s, ctx, &call, stream, impl);
}

static json_t *param_json(const tk_op_desc *op, const tk_op_param *p)
{
    json_t *j = json_object();
    json_object_set_new(j, "name", json_string(p->name));
    if (p->kind == TK_ARG_TENSOR) {
        json_object_set_new(j, "kind", json_string("tensor"));
        json_object_set_new(j, "role", json_string(p->role == TK_OPS_OUT ? "out" : "in"));
        if (p->dtype_like >= 0) {
            json_object_set_new(j, "dtype_like", json_string(op->params[p->dtype_like].name));
            if (p->or_f32)
                json_object_set_new(j, "or_f32", json_true());
        } else {
            json_t *d = json_array();
            for (unsigned b = 1; b; b <<= 1)
                if ((p->dtypes & b) && tk_ops__dtype_bit_str(b))
                    json_array_append_new(d, json_string(tk_ops__dtype_bit_str(b)));
            json_object_set_new(j, "dtypes", d);
        }
        json_object_set_new(j, "min_rank", json_integer(p->min_rank));
        json_object_set_new(j, "max_rank", p->max_rank < 0 ? json_null() : json_integer(p->max_rank));
        if (p->shape)
            json_object_set_new(j, "shape", json_string(p->shape));
    } else {
        json_object_set_new(j, "kind", json_string(p->kind == TK_ARG_F64 ? "f64" : "i64"));
        if (p->optional)
            json_object_set_new(j, "default", json_real(p->def));
    }
    json_object_set_new(j, "optional", json_boolean(p->optional));
    if (p->doc)
        json_object_set_new(j, "doc", json_string(p->doc));
    return j;
}

static json_t *impl_json(const cand *c)
{
    json_t *j = json_object();
    json_object_set_new(j, "package", json_string(c->pkg));
    json_object_set_new(j, "major", json_integer(c->major));
    json_object_set_new(j, "version", json_string(c->version));
    json_object_set_new(j, "kernel", json_string(c->kernel));
    json_object_set_new(j, "impl", json_string(c->impl));
    json_t *d = json_array();
    for (unsigned b = 1; b; b <<= 1)
        if ((c->dtypes & b) && tk_ops__dtype_bit_str(b))
            json_array_append_new(d, json_string(tk_ops__dtype_bit_str(b)));
    json_object_set_new(j, "dtypes", d);
    json_object_set_new(j, "min_cc", c->min_cc ? json_integer(c->min_cc) : json_null());
    json_object_set_new(j, "max_cc", c->max_cc ? json_integer(c->max_cc) : json_null());
    json_object_set_new(j, "priority", json_integer(c->priority));
    json_object_set_new(j, "local", json_boolean(c->local != NULL));
    return j;
}

/* One op as tk_ops_json lists it: tk's own (d NULL), or one a package declares. */
static json_t *op_json(const ops_state *s, const tk_op_desc *op, const declared *d)
{
    json_t *j = json_object(), *ps = json_array(), *impls = json_array();
    tk_buf sig = TK_BUF_INIT;
    tk_ops__signature(&sig, op);
    json_object_set_new(j, "name", json_string(op->name));
    json_object_set_new(j, "standard", json_boolean(!d));
    json_object_set_new(j, "family", json_string(op->family));
    json_object_set_new(j, "summary", json_string(op->summary));
    json_object_set_new(j, "signature", json_string(sig.data ? sig.data : op->name));
    tk__buf_free(&sig);
    for (size_t p = 0; p < op->nparams; p++)
        json_array_append_new(ps, param_json(op, &op->params[p]));
    json_object_set_new(j, "params", ps);
    json_object_set_new(j, "cpu_reference", json_boolean(op->cpu != NULL));
    json_t *cimpls = json_array(); /* ops/cpu_*.c, in the order they are tried */
    for (size_t c = 0, nc = tk_ops__cpu_impl_count(); c < nc; c++) {
        const tk_cpu_impl *im = tk_ops__cpu_impl_at(c);
        if (strcmp(im->op, op->name) != 0)
            continue;
        json_array_append_new(cimpls,
                              json_pack("{s:s, s:o, s:b, s:s}", "impl", im->impl, "needs", cpu_features_json(im->needs),
                                        "usable", tk_ops__cpu_impl_usable(im), "doc", im->doc));
    }
    json_object_set_new(j, "cpu_implementations", cimpls);
    if (op->package) /* where tk ships kernels for it, or the package that declares it */
        json_object_set_new(j, "package", json_string(op->package));
    if (d) {
        json_object_set_new(j, "declared_by", json_string(op->package));
        json_object_set_new(j, "local", json_boolean(d->local != NULL));
    }
    for (size_t c = 0; c < s->n; c++)
        if (strcmp(s->c[c].op, op->name) == 0)
            json_array_append_new(impls, impl_json(&s->c[c]));
    json_object_set_new(j, "implementations", impls);
    return j;
}

TK_API int tk_ops_json(char **out, tk_ctx *ctx)
{
    if (!out)
        return tk__err(TK_ERR_INVALID, "tk_ops_json: out is NULL");
    *out = NULL;
    int rc = tk_api__check_ctx(ctx);
    if (rc != TK_OK)
        return rc;
    ops_state *s = NULL;
    if ((rc = get_state(&s, ctx)) != TK_OK || (rc = scan(s, ctx)) != TK_OK)
        return rc;

    if (s->nconflicts) /* an op with two signatures: say so rather than list one of them */
        return tk__err(TK_ERR_MANIFEST, "%s", s->conflicts[0] + strlen(s->conflicts[0]) + 1);
    json_t *arr = json_array();
    json_t *seen = json_object();
    for (size_t i = 0, n = tk_ops__count(); arr && i < n; i++) {
        json_array_append_new(arr, op_json(s, tk_ops__at(i), NULL));
        json_object_set_new(seen, tk_ops__at(i)->name, json_true());
    }
    for (size_t i = 0; arr && i < s->ndecl; i++) {
        json_array_append_new(arr, op_json(s, s->decl[i].op, &s->decl[i]));
        json_object_set_new(seen, s->decl[i].op->name, json_true());
    }
    /* Ops that packages define and tk does not know: callable through tk_function_call / `tk run`. */
    for (size_t c = 0; arr && seen && c < s->n; c++) {
        const char *name = s->c[c].op;
        json_t *j = json_object_get(seen, name) ? NULL : json_object();
        if (j) {
            json_object_set_new(j, "name", json_string(name));
            json_object_set_new(j, "standard", json_false());
            json_object_set_new(j, "cpu_reference", json_false());
            json_t *impls = json_array();
            for (size_t d = c; d < s->n; d++)
                if (strcmp(s->c[d].op, name) == 0)
                    json_array_append_new(impls, impl_json(&s->c[d]));
            json_object_set_new(j, "implementations", impls);
            json_array_append_new(arr, j);
            json_object_set_new(seen, name, json_true());
        }
    }
    json_decref(seen);
    char *text = arr ? json_dumps(arr, JSON_INDENT(2)) : NULL;
    json_decref(arr);
    if (!text)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    *out = text;
    return TK_OK;
}
