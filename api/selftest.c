/*
 * selftest.c — tk_selftest: prove a package's kernels on this GPU before trusting them, and record
 * the result with the binary (docs/selftest.md).
 *
 * For each kernel of the package that fits the device, every case the op's table has for it
 * (ops/cases.c: small shapes, edges first, each option the kernel takes) runs through the same
 * binding tk_op_run uses (api/op.c's opkernel), on the GPU and on the CPU reference, and the outputs
 * are compared with the per-dtype tolerances the GPU tests use. Outputs start as NaN bytes on both
 * sides, so a skipped write fails. The first wrong case ends a kernel's test: its worst element is the
 * report.
 *
 * The GPU side runs in a sandbox (jit/sandbox.c): a CUDA context of its own. It cannot contain a fault:
 * a sticky error ends CUDA for the whole process, so after a fault (or a launch past its deadline,
 * whose context is abandoned: destroying it would wait for the launch) the verdict is recorded, the
 * package's later kernels are reported untested and the report says "cuda_lost". A kernel recorded as
 * crashed or timed out for this binary is not run again. Before a kernel is tested a "running"
 * record with the process id is written: a kernel
 * that takes the whole process down leaves that record behind, and the next lookup reads it as
 * interrupted (routing then avoids the kernel until it is tested again).
 *
 * Records live in cache.db (cache/kcache.h), keyed by the compiled unit's key, the GPU's UUID, the
 * driver (kernel module and CUDA version) and tk's version: a rebuilt binary, another GPU, a new
 * driver or a new tk looks the kernel up as never tested.
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "api/api.h"
#include "cache/kcache.h"
#include "jit/jit.h"
#include "ops/ops.h"
#include "ops/selftest.h"

#define DEFAULT_TIMEOUT_S 5.0
#define MAX_CASES 32                    /* per kernel */
#define MEMO_MAX_BYTES ((size_t)256 << 20) /* CPU results kept for the kernels of one run */

/* ---- the config ------------------------------------------------------------------------------ */

int tk_api__selftest_mode(const tk_ctx *ctx)
{
    const char *v = getenv("TK_SELFTEST");
    if (!v || !*v)
        v = json_string_value(json_object_get(ctx->config, "selftest"));
    if (v && !strcmp(v, "off"))
        return TK_SELFTEST_OFF;
    if (v && !strcmp(v, "required"))
        return TK_SELFTEST_REQUIRED;
    return TK_SELFTEST_RECORD;
}

int tk_api__cpu_fallback(const tk_ctx *ctx) { return json_is_true(json_object_get(ctx->config, "cpu_fallback")); }

/* ---- records ------------------------------------------------------------------------------------- */

typedef struct {
    int ordinal;
    char name[128];
    char uuid[80];
    char driver[96];
    int cc;
} devid;

static int dev_ident(devid *d, int ordinal)
{
    tk_device_info info;
    int rc;
    memset(d, 0, sizeof *d);
    d->ordinal = ordinal;
    if ((rc = tk_device_info_get(&info, ordinal)) != TK_OK ||
        (rc = tk_jit__device_ident(d->uuid, sizeof d->uuid, d->driver, sizeof d->driver, ordinal)) != TK_OK)
        return rc;
    snprintf(d->name, sizeof d->name, "%s", info.name);
    d->cc = info.cc_major * 10 + info.cc_minor;
    return TK_OK;
}

/* 1 when process pid still runs (on this machine). */
static int pid_alive(int64_t pid)
{
    if (pid <= 0)
        return 0;
    if (pid == (int64_t)getpid())
        return 1;
    return kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

/* The TK_ST_* of a stored record. */
static int record_status(const tk_kcache_selftest *r)
{
    if (!strcmp(r->status, "running"))
        return pid_alive(r->pid) ? TK_ST_NONE : TK_ST_INTERRUPTED;
    int st = tk_ops__st_parse(r->status);
    return st < 0 ? TK_ST_NONE : st;
}

/* The record's one-line summary (detail's "summary"), malloc'd, or NULL. */
static char *record_summary(const tk_kcache_selftest *r)
{
    json_t *d = json_loads(r->detail ? r->detail : "", 0, NULL);
    const char *s = json_string_value(json_object_get(d, "summary"));
    char *out = s ? tk__strdup(s) : NULL;
    json_decref(d);
    if (!out && !strcmp(r->status, "running") && record_status(r) == TK_ST_INTERRUPTED)
        out = tk__fmt("the process that tested it (pid %lld) ended before the test did", (long long)r->pid);
    return out;
}

typedef struct {
    int found;
    int status;
    char *summary;
} lookup_one;

static int take_one(void *user, const tk_kcache_selftest *r)
{
    lookup_one *l = user;
    l->found = 1;
    l->status = record_status(r);
    l->summary = record_summary(r);
    return 1;
}

int tk_api__selftest_status(int *status, char **detail, tk_ctx *ctx, const char *key, const char *kernel, int device)
{
    tk_kcache *kc = NULL;
    devid d;
    lookup_one l = {0, TK_ST_NONE, NULL};
    int rc;
    *status = TK_ST_NONE;
    if (detail)
        *detail = NULL;
    if ((rc = dev_ident(&d, device)) != TK_OK || (rc = tk_api__kcache(&kc, ctx)) != TK_OK)
        return rc;
    tk_kcache_selftest f = {0};
    f.binary_key = key;
    f.kernel = kernel;
    f.gpu_uuid = d.uuid;
    f.driver = d.driver;
    f.tk_version = TK_VERSION_STRING;
    if ((rc = tk_kcache__selftest_query(kc, &f, take_one, &l)) != TK_OK)
        return rc;
    *status = l.status;
    if (detail)
        *detail = l.summary;
    else
        free(l.summary);
    return TK_OK;
}

/* ---- one run ------------------------------------------------------------------------------------- */

/* A CPU result kept for the other kernels of the run that meet the same case. */
typedef struct memo {
    struct memo *next;
    char *key;
    size_t n;        /* tensors */
    void **data;     /* each case tensor's bytes after the reference ran (inputs included) */
    size_t bytes;
} memo;

typedef struct {
    tk_ctx *ctx;
    tk_kcache *kc;
    tk_jit_sandbox *sb;
    devid dev;
    double timeout_s;
    memo *memos;
    size_t memo_bytes;
    int plan;          /* no device: list the cases that fit and run their CPU references only */
    double cpu_ms;     /* time in the CPU references */
} run;

static void memo_free_all(run *r)
{
    for (memo *m = r->memos, *n; m; m = n) {
        n = m->next;
        for (size_t i = 0; i < m->n; i++)
            free(m->data[i]);
        free(m->data);
        free(m->key);
        free(m);
    }
    r->memos = NULL;
    r->memo_bytes = 0;
}

/* The key of a case's CPU result: the op, the index and what shaped the case. */
static char *memo_key(const tk_op_desc *op, size_t index, const tk_ops_case_spec *spec)
{
    tk_buf b = TK_BUF_INIT;
    tk__buf_printf(&b, "%s#%zu#%s", op->name, index, tk_ops__dtype_str(spec->dtype));
    for (size_t i = 0; i < spec->nparams; i++)
        tk__buf_printf(&b, "|%s:%s", spec->params[i].name,
                       spec->params[i].has_dtype ? tk_ops__dtype_str(spec->params[i].dtype) : "*");
    for (size_t i = 0; i < spec->npins; i++)
        tk__buf_printf(&b, "|%s[%d]=%lld..%lld", spec->pins[i].param, spec->pins[i].dim, (long long)spec->pins[i].lo,
                       (long long)spec->pins[i].hi);
    return tk__buf_steal(&b);
}

/* The kernel's spec from its manifest entry: its caller-given params with their dtypes, and the
 * dimensions and scalars its constraints bound ("q.shape[3]", "thresholding": min/max). Strings borrow
 * from k. */
typedef struct {
    tk_ops_case_param p[64];
    tk_ops_case_pin pins[32];
    char pin_names[32][64];
    tk_ops_case_spec spec;
} kspec;

static void pin_add(kspec *ks, const char *expr, int64_t v, int is_min)
{
    char name[64];
    int dim, n = 0, scalar = 0;
    if (sscanf(expr, "%63[A-Za-z0-9_].shape[%d]%n", name, &dim, &n) != 2 || expr[n] != '\0') {
        /* a bare name: a bound on that scalar parameter ("thresholding": min 1) */
        if (sscanf(expr, "%63[A-Za-z0-9_]%n", name, &n) != 1 || expr[n] != '\0')
            return;
        dim = TK_OPS_CASE_PIN_SCALAR;
        scalar = 1;
    }
    for (size_t i = 0; i < ks->spec.npins; i++)
        if (!strcmp(ks->pins[i].param, name) && ks->pins[i].dim == dim) {
            if (is_min)
                ks->pins[i].lo = v;
            else
                ks->pins[i].hi = v;
            return;
        }
    if (ks->spec.npins >= 32)
        return;
    size_t i = ks->spec.npins++;
    snprintf(ks->pin_names[i], sizeof ks->pin_names[i], "%s", name);
    ks->pins[i].param = ks->pin_names[i];
    ks->pins[i].dim = dim;
    ks->pins[i].lo = is_min ? v : scalar ? INT64_MIN : 0;
    ks->pins[i].hi = !is_min ? v : scalar ? INT64_MAX : -1;
}

static void kspec_make(kspec *ks, const tk_manifest_kernel *d, tk_dtype primary)
{
    memset(ks, 0, sizeof *ks);
    for (size_t i = 0; i < d->nparams && ks->spec.nparams < 64; i++) {
        const tk_manifest_param *p = &d->params[i];
        if (p->value)
            continue;
        tk_ops_case_param *cp = &ks->p[ks->spec.nparams++];
        cp->name = p->name;
        cp->has_dtype = p->type == TK_MANIFEST_P_TENSOR;
        cp->dtype = p->dtype;
    }
    for (int lo = 1; lo >= 0; lo--) /* constraints.min, then .max */
        for (size_t i = 0; i < d->nbounds; i++)
            if (d->bounds[i].is_min == lo)
                pin_add(ks, tk_manifest__expr_src(d->bounds[i].expr), d->bounds[i].bound, lo);
    ks->spec.dtype = primary;
    ks->spec.params = ks->p;
    ks->spec.pins = ks->pins;
}

/* What one kernel's test found. */
typedef struct {
    int status;     /* TK_ST_* */
    int cases;      /* cases run on the GPU (planned, without one) */
    json_t *detail; /* {"summary", ...} */
    double seconds;
    json_t *labels; /* plan: the cases that fit */
} verdict;

static void verdict_set(verdict *v, int status, json_t *detail, const char *fmt, ...) TK_PRINTF(4, 5);
static void verdict_set(verdict *v, int status, json_t *detail, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    v->status = status;
    json_decref(v->detail);
    v->detail = detail ? detail : json_object();
    json_object_set_new(v->detail, "summary", json_string(msg));
}

/* "[2, 5]": flat index i of a tensor as its multi-index. */
static void multi_index(char *out, size_t n, const tk_tensor *t, int64_t i)
{
    int64_t idx[TK_OPS_MAX_RANK];
    for (int d = t->ndim - 1; d >= 0; d--) {
        idx[d] = t->shape[d] ? i % t->shape[d] : 0;
        i = t->shape[d] ? i / t->shape[d] : 0;
    }
    size_t len = (size_t)snprintf(out, n, "[");
    for (int d = 0; d < t->ndim && len < n; d++)
        len += (size_t)snprintf(out + len, n - len, d ? ", %lld" : "%lld", (long long)idx[d]);
    if (len < n)
        snprintf(out + len, n - len, "]");
}

/* Device copies of a case's tensors (in the sandbox): one allocation for the case, each tensor at a
 * 256-byte boundary with 256 bytes of pad after it (one cuMemAlloc and one cuMemFree a case). */
typedef struct {
    uint64_t base;
    uint64_t ptr[TK_OPS_CASE_MAX];
    tk_tensor t[TK_OPS_CASE_MAX];
    size_t n;
} devcase;

static void devcase_free(run *r, devcase *dc, int ctx_ok)
{
    if (ctx_ok && dc->base) /* after a reset the memory went with the context */
        tk_jit__sandbox_mfree(r->sb, dc->base);
    memset(dc, 0, sizeof *dc);
}

/* Uploads the case: inputs and in-place tensors with their values, outputs as 0xff bytes. */
static int devcase_make(run *r, devcase *dc, const tk_ops_case *c)
{
    size_t off[TK_OPS_CASE_MAX], total = 0;
    int rc;
    memset(dc, 0, sizeof *dc);
    for (size_t i = 0; i < c->nt; i++) {
        off[i] = total;
        total += (tk_ops__case_bytes(&c->t[i]) + 255) / 256 * 256 + 256;
    }
    if ((rc = tk_jit__sandbox_alloc(&dc->base, r->sb, total)) != TK_OK)
        return rc;
    for (size_t i = 0; rc == TK_OK && i < c->nt; i++) {
        const tk_ops_case_tensor *t = &c->t[i];
        size_t bytes = tk_ops__case_bytes(t);
        dc->ptr[i] = dc->base + off[i];
        dc->n++;
        rc = t->role == TK_CASE_OUT
                 ? tk_jit__sandbox_memset(r->sb, dc->ptr[i], 0xff, bytes)
                 : tk_jit__sandbox_copy(r->sb, (void *)(uintptr_t)dc->ptr[i], t->t.data, bytes, TK_JIT_COPY_H2D);
        dc->t[i] = t->t;
        dc->t[i].data = (void *)(uintptr_t)dc->ptr[i];
        dc->t[i].byte_offset = 0;
        dc->t[i].device.device_type = TK_DEV_CUDA;
        dc->t[i].device.device_id = r->dev.ordinal;
    }
    return rc;
}

/* The CPU result of case c (index, spec): from the memo, or computed in place (the case's outputs are
 * the reference's afterwards) and kept. *out[i] (borrowed) are the tensors' bytes after the run. */
static int reference(run *r, const tk_ops_case *c, size_t index, const tk_ops_case_spec *spec, void ***out)
{
    char *key = memo_key(c->op, index, spec);
    if (!key)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    for (memo *m = r->memos; m; m = m->next)
        if (!strcmp(m->key, key) && m->n == c->nt) {
            free(key);
            *out = m->data;
            return TK_OK;
        }
    /* run on a copy: the case itself must stay as it was for the GPU */
    tk_ops_case cp = *c;
    tk_arg args[2 * TK_OPS_CASE_MAX];
    int rc = TK_OK;
    memset(cp.t, 0, sizeof cp.t);
    for (size_t i = 0; i < c->nt; i++) {
        cp.t[i] = c->t[i];
        cp.t[i].t.shape = cp.t[i].shape;
        if (!(cp.t[i].t.data = tk_ops__case_copy(c, i)))
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
    }
    tk_op_call call;
    size_t na = tk_ops__case_args(&cp, args);
    if (rc == TK_OK && (rc = tk_ops__prepare_op(&call, c->op, args, na)) == TK_OK)
        rc = tk_ops__run_cpu(&call);
    memo *m = rc == TK_OK ? calloc(1, sizeof *m) : NULL;
    if (rc == TK_OK && (!m || !(m->data = calloc(c->nt, sizeof *m->data))))
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
    if (rc == TK_OK) {
        m->key = key;
        key = NULL;
        m->n = c->nt;
        for (size_t i = 0; i < c->nt; i++) {
            m->data[i] = cp.t[i].t.data;
            cp.t[i].t.data = NULL;
            m->bytes += tk_ops__case_bytes(&c->t[i]);
        }
        /* bounded: the oldest results go first */
        m->next = r->memos;
        r->memos = m;
        r->memo_bytes += m->bytes;
        *out = m->data;
        m = NULL;
    }
    for (size_t i = 0; i < c->nt; i++)
        free(cp.t[i].t.data);
    if (m) {
        free(m->data);
        free(m);
    }
    free(key);
    return rc;
}

static void memo_trim(run *r)
{
    while (r->memo_bytes > MEMO_MAX_BYTES && r->memos && r->memos->next) {
        memo **pp = &r->memos;
        while ((*pp)->next)
            pp = &(*pp)->next;
        memo *last = *pp;
        *pp = NULL;
        r->memo_bytes -= last->bytes;
        for (size_t i = 0; i < last->n; i++)
            free(last->data[i]);
        free(last->data);
        free(last->key);
        free(last);
    }
}

/* Whether the run asked for kernel d (opts' op and kernel filters). */
static int wanted(const tk_manifest_kernel *d, const tk_selftest_opts *opts)
{
    return (!opts->op || !strcmp(d->op, opts->op)) && (!opts->kernel || !strcmp(d->name, opts->kernel));
}

/* Without a device: case c fits, and its CPU reference must run. 1 when that failed (the verdict
 * says so), else 0 with the case counted. */
static int plan_case(run *r, verdict *v, const tk_ops_case *c, size_t idx, const tk_ops_case_spec *spec)
{
    void **ref_out = NULL;
    double c0 = tk__now_ms();
    int rc = reference(r, c, idx, spec, &ref_out);
    r->cpu_ms += tk__now_ms() - c0;
    if (rc != TK_OK) {
        verdict_set(v, TK_ST_UNTESTED, NULL, "case '%s': the CPU reference failed: %s", c->label, tk_last_error());
        return 1;
    }
    v->cases++;
    json_array_append_new(v->labels, json_string(c->label));
    return 0;
}

/* The failed verdict of an output that differs from the reference, with its worst element. */
static void mismatch_verdict(verdict *v, const tk_ops_case *c, const tk_ops_case_tensor *ct, const tk_ops_cmp *cmp)
{
    char where[96];
    multi_index(where, sizeof where, &ct->t, cmp->worst);
    json_t *det =
        json_pack("{s:s, s:s, s:s, s:f, s:f, s:f, s:I, s:I}", "case", c->label, "output", ct->name, "index", where,
                  "got", isfinite(cmp->got) ? cmp->got : 0.0, "want", isfinite(cmp->want) ? cmp->want : 0.0, "tol",
                  cmp->tol, "bad", (json_int_t)cmp->bad, "of", (json_int_t)cmp->n);
    if (det && !isfinite(cmp->got))
        json_object_set_new(det, "got", json_string(isnan(cmp->got) ? "nan" : cmp->got > 0 ? "inf" : "-inf"));
    if (det && !isfinite(cmp->want))
        json_object_set_new(det, "want", json_string(isnan(cmp->want) ? "nan" : cmp->want > 0 ? "inf" : "-inf"));
    verdict_set(v, TK_ST_FAILED, det, "case '%s': %s%s got %.9g want %.9g (tol %.3g); %lld of %lld elements off%s",
                c->label, ct->name, where, cmp->got, cmp->want, cmp->tol, (long long)cmp->bad, (long long)cmp->n,
                isnan(cmp->got) && !isnan(cmp->want) ? " (NaN: an element the kernel never wrote)" : "");
}

/* Compares every output and in-place tensor of case c on the device with the reference. *done when
 * the verdict is set (a mismatch; a fault the copy reports, then also *reset). */
static int compare_outputs(run *r, verdict *v, const tk_ops_case *c, const devcase *dc, void **ref_out, int *done,
                           int *reset)
{
    int rc = TK_OK;
    for (size_t t = 0; rc == TK_OK && !*done && t < c->nt; t++) {
        const tk_ops_case_tensor *ct = &c->t[t];
        if (ct->role == TK_CASE_IN)
            continue;
        size_t bytes = tk_ops__case_bytes(ct);
        void *got = malloc(bytes ? bytes : 1);
        if (!got)
            return tk__err(TK_ERR_NOMEM, "out of memory");
        rc = tk_jit__sandbox_copy(r->sb, got, (void *)(uintptr_t)dc->ptr[t], bytes, TK_JIT_COPY_D2H);
        if (rc == TK_OK) {
            tk_ops_case_tensor reft = *ct;
            reft.t.data = ref_out[t];
            reft.t.shape = reft.shape;
            tk_ops_cmp cmp;
            tk_ops__case_compare(&cmp, c, &reft, got);
            if (!cmp.ok) {
                mismatch_verdict(v, c, ct, &cmp);
                *done = 1;
            }
        } else { /* the copy reports a fault the wait missed */
            json_t *det = json_pack("{s:s, s:s}", "case", c->label, "error", tk_last_error());
            verdict_set(v, TK_ST_CRASHED, det, "case '%s': %s", c->label, tk_last_error());
            *done = 1;
            *reset = 1;
        }
        free(got);
    }
    return rc;
}

/* Launches function kname on case c (its arguments moved to the device) and waits for it. *done when
 * the verdict is set: the launch refused, a fault or a timeout (then also *reset); *skip when the
 * kernel's constraints refuse the case at call time (TK_ERR_UNSUPPORTED from the launch). */
static int launch_case(run *r, verdict *v, const tk_api_opkernel *ok, tk_kernel *k, const char *kname,
                       const tk_op_desc *op, const tk_ops_case *c, devcase *dc, tk_arg *args, size_t na, int *done,
                       int *reset, int *skip)
{
    const tk_function *fn = NULL;
    tk_op_call dcall;
    int fault = 0, timed_out = 0, rc;
    for (size_t i = 0; i < na; i++) /* the case's arguments with the device tensors */
        if (args[i].kind == TK_ARG_TENSOR)
            for (size_t t = 0; t < c->nt; t++)
                if (args[i].t == &c->t[t].t)
                    args[i].t = &dc->t[t];
    if ((rc = tk_ops__prepare_op(&dcall, op, args, na)) != TK_OK)
        return rc;
    rc = tk_kernel_function(&fn, k, kname);
    if (rc == TK_OK)
        rc = tk_api__opkernel_launch(ok, fn, &dcall, tk_jit__sandbox_stream(r->sb));
    if (rc == TK_ERR_UNSUPPORTED) {
        *skip = 1;
        return rc;
    }
    if (rc != TK_OK) {
        json_t *det = json_pack("{s:s, s:s}", "case", c->label, "error", tk_last_error());
        verdict_set(v, TK_ST_FAILED, det, "case '%s': the launch was refused: %s", c->label, tk_last_error());
        *done = 1;
        return rc;
    }
    rc = tk_jit__sandbox_wait(r->sb, r->timeout_s, &fault, &timed_out);
    v->cases++;
    if (rc != TK_OK && (fault || timed_out)) {
        char err[512];
        snprintf(err, sizeof err, "%s", tk_last_error());
        json_t *det = json_pack("{s:s, s:s}", "case", c->label, "error", err);
        verdict_set(v, timed_out ? TK_ST_TIMED_OUT : TK_ST_CRASHED, det, "case '%s': %s", c->label, err);
        *done = 1;
        *reset = 1; /* the context is lost, with the case's memory */
    }
    return rc;
}

enum { CASE_NEXT, CASE_SKIPPED, CASE_DONE };

/* Runs case c on the device against its CPU reference. CASE_DONE when the verdict is set (the
 * kernel failed or crashed, or tk could not run the case), CASE_SKIPPED when the kernel's constraints
 * refuse it at call time, else CASE_NEXT. */
static int device_case(run *r, verdict *v, const tk_api_opkernel *ok, tk_kernel *k, const char *kname,
                       const tk_op_desc *op, const tk_ops_case *c, size_t idx, const tk_ops_case_spec *spec,
                       tk_arg *args, size_t na)
{
    devcase dc;
    void **ref_out = NULL;
    int reset = 0, done = 0, skip = 0;
    int rc = devcase_make(r, &dc, c);
    if (rc == TK_OK)
        rc = reference(r, c, idx, spec, &ref_out);
    if (rc == TK_OK)
        rc = launch_case(r, v, ok, k, kname, op, c, &dc, args, na, &done, &reset, &skip);
    if (skip) {
        tk_api__log(r->ctx, TK_LOG_DEBUG, "selftest %s: case '%s' is outside its constraints: %s", kname, c->label,
                    tk_last_error());
        tk__err_clear();
        devcase_free(r, &dc, 1);
        return CASE_SKIPPED;
    }
    if (rc == TK_OK && !done)
        rc = compare_outputs(r, v, c, &dc, ref_out, &done, &reset);
    if (rc != TK_OK && !done) { /* tk's own trouble (memory, the reference): not the kernel's fault */
        verdict_set(v, TK_ST_UNTESTED, NULL, "case '%s' could not run: %s", c->label, tk_last_error());
        done = 1;
    }
    devcase_free(r, &dc, !reset);
    return done ? CASE_DONE : CASE_NEXT;
}

/* The verdict when no case failed: the cases passed (or would run), or none fits. */
static void final_verdict(const run *r, verdict *v, const tk_op_desc *op)
{
    if (v->cases && r->plan)
        verdict_set(v, TK_ST_PASSED, json_pack("{s:i, s:O}", "cases", v->cases, "case_labels", v->labels),
                    "%d case%s would run", v->cases, v->cases == 1 ? "" : "s");
    else if (v->cases)
        verdict_set(v, TK_ST_PASSED, json_pack("{s:i}", "cases", v->cases), "%d case%s passed", v->cases,
                    v->cases == 1 ? "" : "s");
    else
        verdict_set(v, TK_ST_UNTESTED, NULL, "no case of op %s fits it (its dtypes, options and constraints)",
                    op->name);
}

/* Runs the cases of op for kernel kd with primary dtype dt until one sets the verdict (then 1). *k is
 * the loaded package, read only with a device (no plan). */
static int test_dtype(run *r, verdict *v, const tk_api_opkernel *ok, tk_kernel **k, const tk_op_desc *op,
                      const tk_manifest_kernel *kd, tk_dtype dt)
{
    const char *kname = kd->name;
    kspec ks;
    kspec_make(&ks, kd, dt);
    for (size_t idx = 0; v->cases < MAX_CASES; idx++) {
        tk_ops_case c;
        int rc = tk_ops__case_make(&c, op, idx, &ks.spec);
        if (rc == TK_ERR_NOT_FOUND)
            break;
        if (rc == TK_ERR_UNSUPPORTED)
            continue;
        if (rc != TK_OK) {
            verdict_set(v, TK_ST_UNTESTED, NULL, "making case %zu: %s", idx, tk_last_error());
            return 1;
        }
        tk_arg args[2 * TK_OPS_CASE_MAX];
        tk_op_call hc;
        size_t na = tk_ops__case_args(&c, args);
        const char *why = NULL;
        if (tk_ops__prepare_op(&hc, op, args, na) != TK_OK || (why = tk_api__opkernel_unfit(ok, &hc, r->dev.cc))) {
            tk_api__log(r->ctx, TK_LOG_DEBUG, "selftest %s: case '%s' does not fit: %s", kname, c.label,
                        why ? why : tk_last_error());
            tk__err_clear();
            tk_ops__case_free(&c);
            continue;
        }
        int out = r->plan ? (plan_case(r, v, &c, idx, &ks.spec) ? CASE_DONE : CASE_NEXT)
                          : device_case(r, v, ok, *k, kname, op, &c, idx, &ks.spec, args, na);
        tk_ops__case_free(&c);
        if (out == CASE_SKIPPED)
            continue;
        memo_trim(r);
        if (out == CASE_DONE)
            return 1;
    }
    return 0;
}

/* Tests one function. After a fault or a launch past the limit CUDA is lost in this process
 * (tk_jit__cuda_lost): the verdict says so and the caller records it before anything else. */
static void test_kernel(run *r, verdict *v, tk_kernel **k, const char *ref, const tk_selftest_opts *o,
                        const tk_manifest_kernel *kd, json_t *manifest, const char *pkg)
{
    const char *opname = kd->op;
    const tk_op_desc *op = tk_ops__find(opname);
    tk_api_opkernel *ok = NULL;
    double t0 = tk__now_ms();
    memset(v, 0, sizeof *v);
    v->labels = r->plan ? json_array() : NULL;
    if (!op) {
        verdict_set(v, TK_ST_UNTESTED, NULL,
                    "op %s is declared by its package: tk has no CPU reference to check it against",
                    opname ? opname : "?");
        return;
    }
    if (!tk_ops__case_has(op)) {
        verdict_set(v, TK_ST_UNTESTED, NULL, "op %s has no self-test cases", op->name);
        return;
    }
    if (tk_api__opkernel_new(&ok, manifest, pkg, kd->name) != TK_OK) {
        verdict_set(v, TK_ST_FAILED, NULL, "dispatch cannot read the kernel: %s", tk_last_error());
        return;
    }
    /* every primary dtype the kernel declares (its params usually fix them all) */
    tk_dtype prim[8];
    size_t nprim = 0;
    for (size_t j = 0; j < kd->ndtypes && nprim < 8; j++)
        prim[nprim++] = kd->dtypes[j];
    if (!nprim)
        prim[nprim++] = (tk_dtype){TK_DL_FLOAT, 32, 1};
    int done = 0;
    for (size_t pi = 0; pi < nprim && !done; pi++)
        done = test_dtype(r, v, ok, k, op, kd, prim[pi]);
    if (!done)
        final_verdict(r, v, op);
    if (v->detail && !json_object_get(v->detail, "cases"))
        json_object_set_new(v->detail, "cases", json_integer(v->cases));
    v->seconds = (tk__now_ms() - t0) / 1000.0;
    json_decref(v->labels);
    v->labels = NULL;
    tk_api__opkernel_free(ok);
}

/* ---- the plan: what a self-test would run, without a GPU ------------------------------------------ */

typedef struct {
    json_t *names; /* kernels that fit the arch, in plan order */
} plan_names;

static void plan_each(void *user, const char *kernel, const char *key)
{
    (void)key;
    json_array_append_new(((plan_names *)user)->names, json_string(kernel));
}

/* tk_selftest with opts->plan_only: for each kernel of ref that fits arch, the cases that fit it, with
 * their CPU references run (and timed); nothing on a GPU, nothing recorded. */
static int plan_run(char **report, tk_ctx *ctx, const char *ref, const tk_selftest_opts *opts)
{
    run r;
    int cc = 0, rc;
    char name[256] = "", pkg[256] = "", *manifest = NULL;
    json_t *m = NULL, *out = NULL, *kernels = json_array();
    tk_manifest_kernels mk = {0};
    plan_names pn = {json_array()};
    double t0 = tk__now_ms();
    memset(&r, 0, sizeof r);
    r.ctx = ctx;
    r.plan = 1;
    if (tk_api__parse_arch(&cc, opts->arch) != 0) {
        rc = tk__err(TK_ERR_INVALID, "tk_selftest: plan_only needs an arch such as \"sm_90\", got '%s'",
                     opts->arch ? opts->arch : "(null)");
        goto fail;
    }
    r.dev.cc = cc;
    if (tk_api__is_local_ref(ref)) {
        tk_manifest_local lp;
        if ((rc = tk_manifest__local_load(&lp, ref)) != TK_OK)
            goto fail;
        snprintf(name, sizeof name, "%s", lp.name);
        snprintf(pkg, sizeof pkg, "%s@local", lp.name);
        manifest = tk__strdup(lp.manifest);
        tk_manifest__local_free(&lp);
    } else {
        tk_pkg *p = NULL;
        if ((rc = tk_pkg_info(&p, ctx, ref)) == TK_ERR_NOT_FOUND && !tk_ctx_offline(ctx))
            rc = tk_pkg_get(&p, ctx, ref, &opts->get);
        if (rc != TK_OK)
            goto fail;
        snprintf(name, sizeof name, "%s", tk_pkg_name(p));
        snprintf(pkg, sizeof pkg, "%s@%s", tk_pkg_name(p), tk_pkg_commit(p));
        manifest = tk__strdup(tk_pkg_manifest(p));
        tk_pkg_free(p);
    }
    if (!manifest || !(m = json_loads(manifest, 0, NULL))) {
        rc = manifest ? tk__err(TK_ERR_MANIFEST, "%s: the manifest is not JSON", pkg)
                      : tk__err(TK_ERR_NOMEM, "out of memory");
        goto fail;
    }
    {
        char pref[300];
        snprintf(pref, sizeof pref, "%s", tk_api__is_local_ref(ref) ? ref : pkg);
        if ((rc = tk_api__kernel_keys(ctx, pref, cc, plan_each, &pn)) != TK_OK)
            goto fail;
    }
    int counts[8] = {0};
    if ((rc = tk_manifest__kernels_parse(&mk, m, TK_MANIFEST_LENIENT, NULL, NULL)) != TK_OK)
        goto fail;
    for (size_t i = 0; i < mk.nk; i++) {
        const char *kname = mk.k[i].name, *kop = mk.k[i].op;
        int fits = 0;
        size_t j;
        json_t *x;
        if (!wanted(&mk.k[i], opts))
            continue;
        json_array_foreach(pn.names, j, x)
            fits |= !strcmp(json_string_value(x), kname);
        if (!fits) {
            json_array_append_new(kernels, json_pack("{s:s, s:s, s:s, s:{s:s}}", "kernel", kname, "op", kop ? kop : "",
                                                     "status", "skipped", "detail", "summary",
                                                     "it does not run on this arch (its constraints)"));
            counts[7]++;
            continue;
        }
        verdict v;
        test_kernel(&r, &v, NULL, ref, opts, &mk.k[i], m, name);
        const char *st = v.status == TK_ST_PASSED ? "planned" : tk_ops__st_name(v.status);
        json_array_append_new(kernels, json_pack("{s:s, s:s, s:s, s:i, s:f, s:o}", "kernel", kname, "op",
                                                 kop ? kop : "", "status", st, "cases", v.cases, "seconds", v.seconds,
                                                 "detail", v.detail ? v.detail : json_object()));
        counts[v.status == TK_ST_PASSED ? 0 : v.status]++;
    }
    out = json_pack("{s:s, s:s, s:b, s:s, s:b, s:o, s:{s:i, s:i, s:i}, s:f, s:f}", "package", name, "version",
                    json_string_value(json_object_get(m, "version")) ? json_string_value(json_object_get(m, "version"))
                                                                     : "",
                    "local", tk_api__is_local_ref(ref), "arch", opts->arch, "plan", 1, "kernels", kernels, "counts",
                    "planned", counts[0], "untested", counts[TK_ST_UNTESTED], "skipped", counts[7], "cpu_seconds",
                    r.cpu_ms / 1000.0, "seconds", (tk__now_ms() - t0) / 1000.0);
    kernels = NULL;
    if (!out || !(*report = json_dumps(out, JSON_INDENT(2))))
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
fail:
    memo_free_all(&r);
    json_decref(pn.names);
    json_decref(kernels);
    json_decref(out);
    tk_manifest__kernels_free(&mk);
    json_decref(m);
    free(manifest);
    return rc;
}

static int put_record(run *r, const char *key, const char *kernel, const char *pkg, const char *op, const char *status,
                      const json_t *detail, double seconds)
{
    char *dt = detail ? json_dumps(detail, JSON_COMPACT) : NULL;
    tk_kcache_selftest rec = {0};
    rec.binary_key = key;
    rec.kernel = kernel;
    rec.gpu_uuid = r->dev.uuid;
    rec.driver = r->dev.driver;
    rec.tk_version = TK_VERSION_STRING;
    rec.package = pkg;
    rec.op = op ? op : "";
    rec.status = status;
    rec.detail = dt;
    rec.gpu_name = r->dev.name;
    rec.pid = (int64_t)getpid();
    rec.seconds = seconds;
    int rc = tk_kcache__selftest_put(r->kc, &rec);
    free(dt);
    return rc;
}

static json_t *device_json(const devid *d)
{
    char arch[16];
    snprintf(arch, sizeof arch, "sm_%d", d->cc);
    return json_pack("{s:i, s:s, s:s, s:s, s:s}", "ordinal", d->ordinal, "name", d->name, "uuid", d->uuid, "arch", arch,
                     "driver", d->driver);
}

/* The device the run tests on (opts->device), the compiled-binary cache, the sandbox context and
 * the package loaded into it. */
static int open_device(run *r, tk_kernel **k, const char *ref, const tk_selftest_opts *opts)
{
    int rc;
    int ndev = 0;
    if ((rc = tk_device_count(&ndev)) != TK_OK) { /* the driver's reason, with the self-test's hint */
        char why[512];
        snprintf(why, sizeof why, "%s", tk_last_error());
        why[strcspn(why, "\n")] = '\0';
        rc = tk__err(rc,
                     "a self-test needs the GPU it proves kernels for: %s\nHINT: run it on the machine with the "
                     "GPU ('tk doctor' shows what this one has); without one, tk still installs and builds ahead "
                     "of time ('tk build ORG/NAME --arch sm_90')",
                     why);
        return rc;
    }
    if (ndev == 0) {
        rc = tk__err(TK_ERR_NO_DEVICE, "no CUDA device: a self-test runs the kernels on the GPU it proves them for\n"
                                       "HINT: run 'tk selftest' on the machine with the GPU; 'tk doctor' shows what "
                                       "this one has");
        return rc;
    }
    if ((rc = dev_ident(&r->dev, opts->device)) != TK_OK || (rc = tk_api__kcache(&r->kc, r->ctx)) != TK_OK ||
        (rc = tk_jit__sandbox_new(&r->sb, opts->device)) != TK_OK)
        return rc;
    {
        tk_kernel_opts ko = TK_KERNEL_OPTS_INIT;
        ko.device = opts->device;
        ko.get = opts->get;
        if ((rc = tk_api__get_kernel_in(k, r->ctx, ref, &ko, r->sb)) != TK_OK)
            return rc;
    }
    return TK_OK;
}

/* Tests kernel kd of the loaded package *k (or says why it cannot), records the result, and appends
 * its row to kernels. A failure to record is returned; the kernel's own failures are its row. */
static int run_one(run *r, tk_kernel **k, const tk_manifest_kernel *kd, const char *ref, const tk_selftest_opts *opts,
                   json_t *m, const char *pkg, const char *name, json_t *kernels, int counts[8], int *nbad)
{
    const char *kname = kd->name, *kop = kd->op;
    const tk_function *fn = NULL;
    json_t *row;
    int rc;
    if (!*k || tk_kernel_function(&fn, *k, kname) != TK_OK) {
        tk__err_clear();
        row = json_pack("{s:s, s:s, s:s, s:n, s:{s:s}}", "kernel", kname, "op", kop ? kop : "", "status",
                        *k ? "skipped" : "untested", "binary_key", "detail", "summary",
                        *k ? "it does not run on this GPU's arch (its constraints)"
                           : "the package could not be loaded again after a fault");
        json_array_append_new(kernels, row);
        counts[*k ? 7 : TK_ST_UNTESTED]++;
        return TK_OK;
    }
    char key[TK_SHA256_HEX];
    snprintf(key, sizeof key, "%s", tk_api__function_key(fn));
    if (tk_jit__cuda_lost()) { /* an earlier kernel's fault or hang: nothing more runs in this process */
        row = json_pack("{s:s, s:s, s:s, s:s, s:{s:s+}}", "kernel", kname, "op", kop ? kop : "", "status", "untested",
                        "binary_key", key, "detail", "summary", "not tested: CUDA is unusable in this process after ",
                        tk_jit__cuda_lost());
        json_array_append_new(kernels, row);
        counts[TK_ST_UNTESTED]++;
        return TK_OK;
    }
    /* a kernel that crashed or hung here before is not run again: it would end CUDA in this process
     * (its record stands until the binary, the GPU, the driver or tk changes, or --forget) */
    int prev = TK_ST_NONE;
    char *prev_sum = NULL;
    if (tk_api__selftest_status(&prev, &prev_sum, r->ctx, key, kname, r->dev.ordinal) == TK_OK &&
        (prev == TK_ST_CRASHED || prev == TK_ST_TIMED_OUT)) {
        const char *was = prev_sum ? prev_sum : tk_ops__st_name(prev);
        row = json_pack("{s:s, s:s, s:s, s:s, s:i, s:f, s:{s:s, s:s+, s:b}}", "kernel", kname, "op", kop ? kop : "",
                        "status", tk_ops__st_name(prev), "binary_key", key, "cases", 0, "seconds", 0.0, "detail",
                        "recorded", prev_sum ? prev_sum : "", "summary", was,
                        " (recorded earlier on this GPU; not run again, it would end CUDA in this process: 'tk "
                        "selftest --forget' and a new run test it again)",
                        "not_run", 1);
        free(prev_sum);
        json_array_append_new(kernels, row);
        counts[prev]++;
        (*nbad)++;
        return TK_OK;
    }
    free(prev_sum);
    tk__err_clear();
    /* evidence first: a kernel that takes the process down leaves "running" behind */
    if ((rc = put_record(r, key, kname, pkg, kop, "running", NULL, 0)) != TK_OK)
        return rc;
    verdict v;
    test_kernel(r, &v, k, ref, opts, kd, m, name);
    if ((rc = put_record(r, key, kname, pkg, kop, tk_ops__st_name(v.status), v.detail, v.seconds)) != TK_OK) {
        json_decref(v.detail);
        return rc;
    }
    tk_api__log(r->ctx, tk_ops__st_bad(v.status) ? TK_LOG_WARN : TK_LOG_DEBUG, "selftest %s:%s on %s: %s: %s", name,
                kname, r->dev.name, tk_ops__st_name(v.status), json_string_value(json_object_get(v.detail, "summary")));
    row = json_pack("{s:s, s:s, s:s, s:s, s:i, s:f, s:o}", "kernel", kname, "op", kop ? kop : "", "status",
                    tk_ops__st_name(v.status), "binary_key", key, "cases", v.cases, "seconds", v.seconds, "detail",
                    v.detail ? v.detail : json_object());
    json_array_append_new(kernels, row);
    counts[v.status]++;
    *nbad += tk_ops__st_bad(v.status);
    return TK_OK;
}

TK_API int tk_selftest(char **report, tk_ctx *ctx, const char *ref, const tk_selftest_opts *opts)
{
    tk_selftest_opts def = TK_SELFTEST_OPTS_INIT;
    run r;
    tk_kernel *k = NULL;
    json_t *m = NULL, *out = NULL, *kernels = NULL;
    tk_manifest_kernels mk = {0};
    int rc, nbad = 0, counts[8] = {0};
    double t0 = tk__now_ms(), tload = 0;
    memset(&r, 0, sizeof r);
    if (report)
        *report = NULL;
    if (!report || !ref)
        return tk__err(TK_ERR_INVALID, "tk_selftest: report and ref are required");
    if ((rc = tk_api__check_ctx(ctx)) != TK_OK)
        return rc;
    if (!opts)
        opts = &def;
    if (opts->version < 1 || opts->version > TK_SELFTEST_OPTS_VERSION)
        return tk__err(TK_ERR_INVALID, "tk_selftest: unknown opts version %u", opts->version);
    if (opts->launch_timeout_s < 0 || isnan(opts->launch_timeout_s))
        return tk__err(TK_ERR_INVALID, "tk_selftest: launch_timeout_s must be >= 0 (0: %.0f s)", DEFAULT_TIMEOUT_S);
    if (opts->op && !tk_ops__find(opts->op))
        return tk__err(TK_ERR_NOT_FOUND,
                       "tk_selftest: unknown op '%s'\nHINT: 'tk ops' lists them; a declared op has no "
                       "CPU reference to test against",
                       opts->op);
    if (opts->plan_only)
        return plan_run(report, ctx, ref, opts);
    r.ctx = ctx;
    r.timeout_s = opts->launch_timeout_s > 0 ? opts->launch_timeout_s : DEFAULT_TIMEOUT_S;
    if ((rc = open_device(&r, &k, ref, opts)) != TK_OK)
        goto fail;
    tload = tk__now_ms() - t0;
    /* the package as loaded: its manifest, name and commit */
    char pkg[256], *at;
    snprintf(pkg, sizeof pkg, "%s", tk_api__kernel_pkgname(k));
    if (!(m = json_loads(tk_kernel_manifest(k), 0, NULL))) {
        rc = tk__err(TK_ERR_MANIFEST, "%s: the manifest is not JSON", pkg);
        goto fail;
    }
    char name[256];
    snprintf(name, sizeof name, "%s", pkg);
    if ((at = strrchr(name, '@')))
        *at = '\0';
    out = json_object();
    kernels = json_array();
    json_object_set_new(out, "package", json_string(name));
    json_object_set_new(out, "version", json_string(json_string_value(json_object_get(m, "version"))));
    json_object_set_new(out, "commit", at && strcmp(at + 1, "local") ? json_string(at + 1) : json_null());
    json_object_set_new(out, "local", json_boolean(at && !strcmp(at + 1, "local")));
    json_object_set_new(out, "device", device_json(&r.dev));
    json_object_set_new(out, "tk_version", json_string(TK_VERSION_STRING));
    json_object_set_new(out, "launch_timeout_s", json_real(r.timeout_s));
    /* every kernel of the manifest, in order: the ones loaded for this GPU are tested */
    size_t tested = 0, total = 0;
    if ((rc = tk_manifest__kernels_parse(&mk, m, TK_MANIFEST_LENIENT, NULL, NULL)) != TK_OK)
        goto fail;
    for (size_t i = 0; i < mk.nk; i++)
        total += wanted(&mk.k[i], opts);
    for (size_t i = 0; i < mk.nk; i++) {
        if (!wanted(&mk.k[i], opts))
            continue;
        if (ctx->progress) {
            char what[256];
            snprintf(what, sizeof what, "selftest %s", mk.k[i].name);
            ctx->progress(ctx->progress_user, what, (int64_t)tested, (int64_t)total);
        }
        tested++;
        if ((rc = run_one(&r, &k, &mk.k[i], ref, opts, m, pkg, name, kernels, counts, &nbad)) != TK_OK)
            goto fail;
        /* recorded: now the context goes (a faulted one is destroyed, a hung one abandoned) */
        if (tk_jit__cuda_lost()) {
            tk_jit__sandbox_reset(r.sb);
            tk__err_clear();
        }
    }
    if (ctx->progress)
        ctx->progress(ctx->progress_user, "selftest", (int64_t)total, (int64_t)total);
    json_object_set_new(out, "kernels", kernels);
    kernels = NULL;
    json_object_set_new(out, "counts",
                        json_pack("{s:i, s:i, s:i, s:i, s:i, s:i}", "passed", counts[TK_ST_PASSED], "failed",
                                  counts[TK_ST_FAILED], "crashed", counts[TK_ST_CRASHED], "timed_out",
                                  counts[TK_ST_TIMED_OUT], "untested", counts[TK_ST_UNTESTED], "skipped", counts[7]));
    json_object_set_new(out, "ok", json_boolean(nbad == 0));
    json_object_set_new(out, "cuda_lost", tk_jit__cuda_lost() ? json_string(tk_jit__cuda_lost()) : json_null());
    json_object_set_new(out, "load_seconds", json_real(tload / 1000.0));
    json_object_set_new(out, "seconds", json_real((tk__now_ms() - t0) / 1000.0));
    if (!(*report = json_dumps(out, JSON_INDENT(2)))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto fail;
    }
    rc = nbad ? tk__err(TK_ERR_SELFTEST,
                        "%s: %d kernel%s failed the self-test on %s (cuda:%d)\nHINT: tk_op_run no "
                        "longer uses %s (docs/selftest.md); the report names the worst element",
                        name, nbad, nbad == 1 ? "" : "s", r.dev.name, r.dev.ordinal, nbad == 1 ? "it" : "them")
              : TK_OK;
fail:
    tk_kernel_free(k);
    tk_jit__sandbox_free(r.sb);
    memo_free_all(&r);
    tk_manifest__kernels_free(&mk);
    json_decref(m);
    json_decref(out);
    json_decref(kernels);
    /* the next tk_op_run of this context looks the records up again */
    if (ctx && ctx->ops && r.kc)
        tk_api__ops_forget_selftests(ctx);
    return rc;
}

int tk_api__selftest_kernel(int *status, tk_ctx *ctx, const char *ref, const char *kernel, int device)
{
    tk_selftest_opts o = TK_SELFTEST_OPTS_INIT;
    char *report = NULL;
    *status = TK_ST_NONE;
    o.device = device;
    o.kernel = kernel;
    int rc = tk_selftest(&report, ctx, ref, &o);
    json_t *j = report ? json_loads(report, 0, NULL) : NULL;
    const char *st = json_string_value(json_object_get(json_array_get(json_object_get(j, "kernels"), 0), "status"));
    if (st && tk_ops__st_parse(st) >= 0)
        *status = tk_ops__st_parse(st);
    json_decref(j);
    tk_free(report);
    return rc == TK_ERR_SELFTEST ? TK_OK : rc;
}

/* ---- recorded results --------------------------------------------------------------------------- */

static int collect(void *user, const tk_kcache_selftest *r)
{
    json_t *arr = user, *detail = json_loads(r->detail ? r->detail : "", 0, NULL);
    const char *at = strrchr(r->package, '@');
    int st = record_status(r);
    json_t *o =
        json_pack("{s:s%, s:o, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:I, s:f, s:o}", "package", r->package,
                  at ? (size_t)(at - r->package) : strlen(r->package), "commit",
                  at && strcmp(at + 1, "local") ? json_string(at + 1) : json_null(), "kernel", r->kernel, "op", r->op,
                  "status", !strcmp(r->status, "running") && st == TK_ST_NONE ? "running" : tk_ops__st_name(st),
                  "binary_key", r->binary_key, "gpu_uuid", r->gpu_uuid, "gpu_name", r->gpu_name, "driver", r->driver,
                  "tk_version", r->tk_version, "tested", (json_int_t)r->tested, "seconds", r->seconds, "detail",
                  detail ? detail : json_object());
    if (o)
        json_array_append_new(arr, o);
    return 0;
}

TK_API int tk_selftest_records_json(char **out, tk_ctx *ctx, const char *package)
{
    tk_kcache *kc = NULL;
    json_t *arr = NULL;
    int rc;
    if (out)
        *out = NULL;
    if (!out)
        return tk__err(TK_ERR_INVALID, "tk_selftest_records_json: out is NULL");
    if ((rc = tk_api__check_ctx(ctx)) != TK_OK || (rc = tk_api__kcache(&kc, ctx)) != TK_OK)
        return rc;
    if (!(arr = json_array()))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    if ((rc = tk_kcache__selftest_query(kc, NULL, collect, arr)) != TK_OK) {
        json_decref(arr);
        return rc;
    }
    if (package) { /* "org/name": its records, any commit */
        size_t n = strlen(package);
        for (size_t i = json_array_size(arr); i-- > 0;) {
            const char *p = json_string_value(json_object_get(json_array_get(arr, i), "package"));
            if (!p || strncmp(p, package, n) != 0 || (p[n] != '\0' && p[n] != '@'))
                json_array_remove(arr, i);
        }
    }
    *out = json_dumps(arr, JSON_INDENT(2));
    json_decref(arr);
    return *out ? TK_OK : tk__err(TK_ERR_NOMEM, "out of memory");
}

typedef struct {
    tk_ctx *ctx;
    tk_kcache *kc;
    const devid *dev;
    json_t *kernels;
    const char *pkg;
    int counts[8];
} pkg_walk;

static void one_kernel(void *user, const char *kernel, const char *key)
{
    pkg_walk *w = user;
    tk_kcache_selftest f = {0};
    lookup_one l = {0, TK_ST_NONE, NULL};
    f.binary_key = key;
    f.kernel = kernel;
    f.gpu_uuid = w->dev->uuid;
    f.driver = w->dev->driver;
    f.tk_version = TK_VERSION_STRING;
    if (tk_kcache__selftest_query(w->kc, &f, take_one, &l) != TK_OK)
        tk__err_clear();
    w->counts[l.status]++;
    json_t *o = json_pack("{s:s, s:s, s:s}", "kernel", kernel, "status", tk_ops__st_name(l.status), "binary_key", key);
    if (o && l.summary)
        json_object_set_new(o, "summary", json_string(l.summary));
    free(l.summary);
    if (o)
        json_array_append_new(w->kernels, o);
}

/* One installed package's standing on the device: each kernel that fits, with its current binary's
 * record or never_tested. */
static json_t *pkg_standing(tk_ctx *ctx, tk_kcache *kc, const devid *dev, const tk_pkg *p)
{
    char ref[256];
    pkg_walk w;
    memset(&w, 0, sizeof w);
    w.ctx = ctx;
    w.kc = kc;
    w.dev = dev;
    w.kernels = json_array();
    snprintf(ref, sizeof ref, "%s@%s", tk_pkg_name(p), tk_pkg_commit(p));
    json_t *o = json_pack("{s:s, s:s, s:s}", "package", tk_pkg_name(p), "version", tk_pkg_version(p), "commit",
                          tk_pkg_commit(p));
    if (tk_api__kernel_keys(ctx, ref, dev->cc, one_kernel, &w) != TK_OK) {
        json_object_set_new(o, "error", json_string(tk_last_error()));
        tk__err_clear();
    }
    json_object_set_new(o, "passed", json_integer(w.counts[TK_ST_PASSED]));
    json_object_set_new(o, "failed",
                        json_integer(w.counts[TK_ST_FAILED] + w.counts[TK_ST_CRASHED] + w.counts[TK_ST_TIMED_OUT] +
                                     w.counts[TK_ST_INTERRUPTED]));
    json_object_set_new(o, "untested", json_integer(w.counts[TK_ST_UNTESTED]));
    json_object_set_new(o, "never_tested", json_integer(w.counts[TK_ST_NONE]));
    json_object_set_new(o, "kernels", w.kernels);
    return o;
}

TK_API int tk_selftest_results_json(char **out, tk_ctx *ctx, const char *ref, int device)
{
    tk_kcache *kc = NULL;
    tk_pkg_list *list = NULL;
    tk_pkg *one = NULL;
    devid dev;
    int rc;
    if (out)
        *out = NULL;
    if (!out)
        return tk__err(TK_ERR_INVALID, "tk_selftest_results_json: out is NULL");
    if ((rc = tk_api__check_ctx(ctx)) != TK_OK || (rc = dev_ident(&dev, device)) != TK_OK ||
        (rc = tk_api__kcache(&kc, ctx)) != TK_OK)
        return rc;
    if (ref ? (rc = tk_pkg_info(&one, ctx, ref)) != TK_OK : (rc = tk_pkg_list_installed(&list, ctx)) != TK_OK)
        return rc;
    json_t *o = json_object(), *pkgs = json_array();
    json_object_set_new(o, "device", device_json(&dev));
    json_object_set_new(o, "tk_version", json_string(TK_VERSION_STRING));
    if (one)
        json_array_append_new(pkgs, pkg_standing(ctx, kc, &dev, one));
    for (size_t i = 0; list && i < tk_pkg_list_count(list); i++)
        json_array_append_new(pkgs, pkg_standing(ctx, kc, &dev, tk_pkg_list_at(list, i)));
    json_object_set_new(o, "packages", pkgs);
    tk_pkg_free(one);
    tk_pkg_list_free(list);
    *out = json_dumps(o, JSON_INDENT(2));
    json_decref(o);
    return *out ? TK_OK : tk__err(TK_ERR_NOMEM, "out of memory");
}

TK_API int tk_selftest_forget(tk_ctx *ctx, const char *ref, int64_t *removed)
{
    tk_kcache *kc = NULL;
    tk_pkg *p = NULL;
    char pkg[256];
    int rc;
    if (removed)
        *removed = 0;
    if ((rc = tk_api__check_ctx(ctx)) != TK_OK || (rc = tk_api__kcache(&kc, ctx)) != TK_OK)
        return rc;
    if (!ref)
        return tk_kcache__selftest_forget(kc, NULL, removed);
    if (tk_api__is_local_ref(ref)) {
        tk_manifest_local lp;
        if ((rc = tk_manifest__local_load(&lp, ref)) != TK_OK)
            return rc;
        snprintf(pkg, sizeof pkg, "%s@local", lp.name);
        tk_manifest__local_free(&lp);
    } else {
        if ((rc = tk_pkg_info(&p, ctx, ref)) != TK_OK)
            return rc;
        snprintf(pkg, sizeof pkg, "%s@%s", tk_pkg_name(p), tk_pkg_commit(p));
        tk_pkg_free(p);
    }
    rc = tk_kcache__selftest_forget(kc, pkg, removed);
    if (rc == TK_OK && ctx->ops)
        tk_api__ops_forget_selftests(ctx);
    return rc;
}
