/*
 * cmd_run.c — tk run: call one kernel of a package on random inputs, time it and print checksums.
 *
 * The parameters come from the package's manifest (tk_pkg_manifest), so any published kernel runs
 * without tk knowing its op. Device memory comes from tk_device_alloc; launches go through
 * tk_function_call and the manifest's launch rule.
 */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"

static const char *USAGE =
    "tk run (ORG/NAME[@VERSION] | ./DIR) FUNCTION --shape [PARAM=]DIMS ... [--arg NAME=VALUE] [--fill NAME=iota|N]\n"
    "       [--iters N]";

static const char *HELP =
    "NAME\n"
    "    tk run - run one kernel of a package on random inputs, with timing and checksums\n"
    "\n"
    "SYNOPSIS\n"
    "    tk run ORG/NAME[@VERSION] FUNCTION --shape [PARAM=]DIMS ... [--arg NAME=VALUE ...]\n"
    "           [--fill NAME=iota|N ...] [--iters N] [--warmup N] [--seed S] [--device N]\n"
    "\n"
    "DESCRIPTION\n"
    "    Installs the package if needed, compiles it for the GPU (or takes it from the cache),\n"
    "    fills every tensor parameter of FUNCTION with random values, launches it through its\n"
    "    manifest launch rule, and prints the mean time per call and a checksum of every tensor\n"
    "    after the run (sum and sum of absolute values, computed in double precision).\n"
    "\n"
    "    Tensor shapes are given with --shape, once per tensor parameter: in parameter order\n"
    "    ('--shape 16x4096 --shape 16x8192') or by name ('--shape input=16x8192'). Scalar\n"
    "    parameters without a derived value in the manifest take --arg NAME=VALUE. FUNCTION is\n"
    "    the kernel's manifest name ('tk info ORG/NAME' lists them). A path (./DIR, /DIR)\n"
    "    runs an unpublished package directory as it is: checked, compiled, never installed.\n"
    "\n"
    "    Floating-point and 8-bit tensors get random values. Integer tensors (i32, i64) are index\n"
    "    tensors in practice (block tables, sequence lengths, cu_seqlens, ids, positions, slot\n"
    "    mappings, targets): they are filled with 0, which is in range for any non-empty\n"
    "    dimension, unless --fill NAME=iota (0, 1, 2, ...) or --fill NAME=N (a constant) says\n"
    "    otherwise. An optional tensor parameter without a --shape is left out (a null pointer).\n"
    "\n"
    "    Without a GPU it explains why it cannot run and exits 7; 'tk build' still compiles\n"
    "    ahead of time.\n"
    "\n"
    "OPTIONS\n"
    "    --shape [PARAM=]DIMS   dimensions separated by x or commas, e.g. 8x1024\n"
    "    --arg NAME=VALUE       a scalar parameter (integer or floating point)\n"
    "    --fill NAME=iota|N     an integer tensor's contents: 0, 1, 2, ... or the constant N (default 0)\n"
    "    --iters N              timed calls (default 20)\n"
    "    --warmup N             untimed calls first (default 3)\n"
    "    --seed S               random seed (default 1)\n"
    "    --device N             CUDA device ordinal (default 0)\n"
    "    --json                 {\"function\", \"ms\", \"checksums\": {param: {sum, abs_sum}}}\n"
    "\n"
    "EXAMPLES\n"
    "    tk run kernels-community/activation silu_and_mul_f32 --shape 16x4096 --shape 16x8192\n"
    "    tk run kernels-community/activation silu_and_mul_bf16 --shape out=8x128 --shape input=8x256\n";

/* ---- host values in every dtype --------------------------------------------------------------- */

static uint16_t f2h(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, mant = x & 0x7fffff;
    int exp = (int)((x >> 23) & 0xff) - 127 + 15;
    if (exp >= 31)
        return (uint16_t)(sign | 0x7c00);
    if (exp <= 0) {
        if (exp < -10)
            return (uint16_t)sign;
        mant |= 0x800000;
        return (uint16_t)(sign | ((mant >> (14 - exp)) + ((mant >> (13 - exp)) & 1)));
    }
    uint32_t h = sign | (uint32_t)exp << 10 | mant >> 13;
    return (uint16_t)(h + ((mant >> 12) & 1)); /* round half up */
}

static float h2f(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, x;
    float f;
    if (exp == 0) {
        f = ldexpf((float)mant, -24);
        return sign ? -f : f;
    }
    if (exp == 31)
        x = sign | 0x7f800000 | mant << 13;
    else
        x = sign | (exp + 112) << 23 | mant << 13;
    memcpy(&f, &x, 4);
    return f;
}

static uint16_t f2bf(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

static float bf2f(uint16_t b)
{
    uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static uint64_t rng_state = 1;
static double urand(void) /* [-1, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 4503599627370496.0 - 1.0;
}

static void put(void *buf, size_t i, tk_dtype dt, double v)
{
    const char *n = tk_dtype_name(dt);
    if (!strcmp(n, "f32"))
        ((float *)buf)[i] = (float)v;
    else if (!strcmp(n, "f64"))
        ((double *)buf)[i] = v;
    else if (!strcmp(n, "f16"))
        ((uint16_t *)buf)[i] = f2h((float)v);
    else if (!strcmp(n, "bf16"))
        ((uint16_t *)buf)[i] = f2bf((float)v);
    else if (!strcmp(n, "i8"))
        ((int8_t *)buf)[i] = (int8_t)(v * 100);
    else if (!strcmp(n, "u8"))
        ((uint8_t *)buf)[i] = (uint8_t)((v + 1) * 100);
    else if (!strcmp(n, "i32"))
        ((int32_t *)buf)[i] = (int32_t)(v * 1000);
    else if (!strcmp(n, "i64"))
        ((int64_t *)buf)[i] = (int64_t)(v * 1000);
    else
        ((uint8_t *)buf)[i] = (uint8_t)(rng_state & 0x77); /* fp8: a finite byte */
}

static double get(const void *buf, size_t i, tk_dtype dt)
{
    const char *n = tk_dtype_name(dt);
    if (!strcmp(n, "f32"))
        return ((const float *)buf)[i];
    if (!strcmp(n, "f64"))
        return ((const double *)buf)[i];
    if (!strcmp(n, "f16"))
        return h2f(((const uint16_t *)buf)[i]);
    if (!strcmp(n, "bf16"))
        return bf2f(((const uint16_t *)buf)[i]);
    if (!strcmp(n, "i8"))
        return ((const int8_t *)buf)[i];
    if (!strcmp(n, "u8"))
        return ((const uint8_t *)buf)[i];
    if (!strcmp(n, "i32"))
        return ((const int32_t *)buf)[i];
    if (!strcmp(n, "i64"))
        return (double)((const int64_t *)buf)[i];
    return ((const uint8_t *)buf)[i];
}

/* ---- the command ------------------------------------------------------------------------------ */

#define MAXP 64

typedef struct {
    const char *name;
    int is_tensor, derived, optional;
    const char *fill; /* --fill: "iota" or an integer; NULL: 0 for integer tensors */
    tk_dtype dt;
    int64_t shape[8];
    int ndim; /* -1: no shape given */
    tk_tensor t;
    void *dptr;
    size_t bytes;
    void *host;
    const char *argval;
} rparam;

/* --fill's value: "iota" or an integer. */
static int fill_ok(const char *v)
{
    char *end = NULL;
    if (!strcmp(v, "iota"))
        return 1;
    strtoll(v, &end, 10);
    return *v && end && !*end;
}

static int parse_dims(int64_t *shape, int *ndim, const char *s)
{
    *ndim = 0;
    while (*s) {
        char *end;
        long long v = strtoll(s, &end, 10);
        if (end == s || v < 0 || *ndim == 8)
            return -1;
        shape[(*ndim)++] = v;
        s = end;
        if (*s == 'x' || *s == 'X' || *s == ',')
            s++;
        else if (*s)
            return -1;
    }
    return *ndim ? 0 : -1;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* The command line. */
typedef struct {
    const char *ref, *fname, *shapes[MAXP], *sargs[MAXP], *fills[MAXP];
    size_t nshapes, nsargs, nfills;
    long iters, warmup, device, seed;
} run_opts;

/* What a run holds: the kernel, its parameters (from the manifest) and the call's arguments. */
typedef struct {
    tk_kernel *k;
    const tk_function *fn;
    json_t *man;
    rparam ps[MAXP];
    size_t np;
    tk_arg args[MAXP];
    size_t nargs;
    double sum[MAXP], abs_sum[MAXP]; /* per parameter, after the run */
} run_state;

#define RUN_GO (-1) /* a step's "go on": anything else is the command's exit code */

/* parse options: fills o; RUN_GO, or an exit code (help printed, or a usage error). */
static int parse_options(run_opts *o, tk_cli *cli, int argc, char **argv)
{
    o->iters = 20;
    o->warmup = 3;
    o->seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        long *num = NULL;
        if (tk_cli_is_help(a)) {
            fputs(HELP, stdout);
            return TK_EXIT_OK;
        } else if (!strcmp(a, "--shape") || !strcmp(a, "-s")) {
            if (++i >= argc || o->nshapes == MAXP)
                return tk_cli_usage(USAGE, "--shape needs [PARAM=]DIMS");
            o->shapes[o->nshapes++] = argv[i];
        } else if (!strcmp(a, "--arg")) {
            if (++i >= argc || !strchr(argv[i], '=') || o->nsargs == MAXP)
                return tk_cli_usage(USAGE, "--arg needs NAME=VALUE");
            o->sargs[o->nsargs++] = argv[i];
        } else if (!strcmp(a, "--fill")) {
            if (++i >= argc || !strchr(argv[i], '=') || o->nfills == MAXP)
                return tk_cli_usage(USAGE, "--fill needs NAME=iota or NAME=INTEGER");
            if (!fill_ok(strchr(argv[i], '=') + 1))
                return tk_cli_usage(USAGE, "--fill %s: want iota or an integer", argv[i]);
            o->fills[o->nfills++] = argv[i];
        } else if (!strcmp(a, "--iters")) {
            num = &o->iters;
        } else if (!strcmp(a, "--warmup")) {
            num = &o->warmup;
        } else if (!strcmp(a, "--seed")) {
            num = &o->seed;
        } else if (!strcmp(a, "--device")) {
            num = &o->device;
        } else if (!strcmp(a, "--json")) {
            cli->json = 1;
        } else if (a[0] == '-') {
            return tk_cli_unknown_option(USAGE, a);
        } else if (!o->ref) {
            o->ref = a;
        } else if (!o->fname) {
            o->fname = a;
        } else {
            return tk_cli_usage(USAGE, "unexpected '%s'", a);
        }
        if (num) {
            char *end = NULL;
            if (++i >= argc)
                return tk_cli_usage(USAGE, "%s needs a number", a);
            *num = strtol(argv[i], &end, 10);
            if (!end || *end || *num < 0 || *num > 1000000)
                return tk_cli_usage(USAGE, "%s wants a number, not '%s'", a, argv[i]);
        }
    }
    if (!o->ref || !o->fname)
        return tk_cli_usage(USAGE, "which package and function? e.g. tk run kernels-community/activation "
                                   "silu_and_mul_f32 --shape 8x128 --shape 8x256");
    if (o->iters < 1)
        o->iters = 1;
    return RUN_GO;
}

/* validate the machine: a GPU, and the --device asked for; said before touching the network. */
static int check_device(tk_cli *cli, const run_opts *o)
{
    int ndev = 0, rc = tk_device_count(&ndev);
    if (rc != TK_OK) {
        const char *why = tk_last_error();
        if (strstr(why, "\nHINT: ")) /* the driver's hint already names tk build */
            return tk_cli_errorf(cli, rc, TK_EXIT_DEVICE, "cannot run %s on a GPU: %s", o->fname, why);
        return tk_cli_errorf(cli, rc, TK_EXIT_DEVICE,
                             "cannot run %s on a GPU: %s\nHINT: 'tk build %s --arch sm_90' still compiles it ahead of "
                             "time",
                             o->fname, why, o->ref);
    }
    if (ndev == 0)
        return tk_cli_errorf(cli, TK_ERR_NO_DEVICE, TK_EXIT_DEVICE,
                             "cannot run %s: the CUDA driver reports no GPU\nHINT: check 'nvidia-smi' and "
                             "CUDA_VISIBLE_DEVICES; 'tk build %s --arch sm_90' still compiles it ahead of time",
                             o->fname, o->ref);
    if (o->device >= ndev)
        return tk_cli_errorf(cli, TK_ERR_NO_DEVICE, TK_EXIT_DEVICE, "no CUDA device %ld (this machine has %d)",
                             o->device, ndev);
    return RUN_GO;
}

/* resolve: the kernel, the function and its parameters, from the manifest the kernel was built from
 * (a package directory's too). */
static int resolve_kernel(run_state *st, tk_cli *cli, const run_opts *o)
{
    tk_ctx *ctx = tk_cli_ctx(cli);
    json_t *kern = NULL, *x;
    size_t i;
    int rc;
    if (!ctx)
        return TK_EXIT_FAIL;
    tk_kernel_opts ko = TK_KERNEL_OPTS_INIT;
    ko.device = (int)o->device;
    if ((rc = tk_get_kernel(&st->k, ctx, o->ref, &ko)) != TK_OK ||
        (rc = tk_kernel_function(&st->fn, st->k, o->fname)) != TK_OK)
        return tk_cli_fail(cli, rc, NULL);
    st->man = json_loads(tk_kernel_manifest(st->k), 0, NULL);
    json_array_foreach(json_object_get(st->man, "kernels"), i, x) {
        const char *name = json_string_value(json_object_get(x, "name"));
        if (!strcmp(name ? name : "", o->fname))
            kern = x;
    }
    if (!kern)
        return tk_cli_errorf(cli, TK_ERR_MANIFEST, TK_EXIT_FAIL, "%s's manifest has no kernel '%s'", o->ref, o->fname);
    json_array_foreach(json_object_get(kern, "params"), i, x) {
        if (st->np == MAXP)
            break;
        rparam *p = &st->ps[st->np++];
        const char *type = json_string_value(json_object_get(x, "type"));
        p->name = json_string_value(json_object_get(x, "name"));
        p->is_tensor = type && !strcmp(type, "tensor");
        p->derived = json_object_get(x, "value") != NULL;
        p->optional = json_is_true(json_object_get(x, "optional"));
        p->ndim = -1;
        if (p->is_tensor && tk_dtype_parse(&p->dt, json_string_value(json_object_get(x, "dtype"))) != TK_OK)
            return tk_cli_fail(cli, TK_ERR_MANIFEST, o->fname);
    }
    return RUN_GO;
}

/* The parameter "NAME=..." names (a tensor one when tensor is set); NULL if none. */
static rparam *param_named(run_state *st, const char *spec, int tensor)
{
    size_t len = (size_t)(strchr(spec, '=') - spec);
    for (size_t i = 0; i < st->np; i++)
        if (st->ps[i].is_tensor == tensor && strlen(st->ps[i].name) == len && !strncmp(st->ps[i].name, spec, len))
            return &st->ps[i];
    return NULL;
}

/* validate: bind --shape (by name, then in order), --arg and --fill to the parameters. */
static int bind_options(run_state *st, const run_opts *o)
{
    size_t next = 0;
    for (size_t s = 0; s < o->nshapes; s++) {
        const char *eq = strchr(o->shapes[s], '='), *dims = eq ? eq + 1 : o->shapes[s];
        rparam *p = NULL;
        if (eq) {
            if (!(p = param_named(st, o->shapes[s], 1)))
                return tk_cli_usage(USAGE, "%s has no tensor parameter '%.*s'", o->fname, (int)(eq - o->shapes[s]),
                                    o->shapes[s]);
        } else {
            while (next < st->np && (!st->ps[next].is_tensor || st->ps[next].ndim >= 0))
                next++;
            if (next == st->np)
                return tk_cli_usage(USAGE, "more --shape than tensor parameters");
            p = &st->ps[next];
        }
        if (parse_dims(p->shape, &p->ndim, dims) != 0)
            return tk_cli_usage(USAGE, "bad shape '%s' (want e.g. 8x1024)", dims);
    }
    for (size_t s = 0; s < o->nsargs; s++) {
        const char *eq = strchr(o->sargs[s], '=');
        rparam *p = param_named(st, o->sargs[s], 0);
        if (!p)
            return tk_cli_usage(USAGE, "%s has no scalar parameter '%.*s'", o->fname, (int)(eq - o->sargs[s]),
                                o->sargs[s]);
        p->argval = eq + 1;
    }
    for (size_t s = 0; s < o->nfills; s++) {
        const char *eq = strchr(o->fills[s], '=');
        rparam *p = param_named(st, o->fills[s], 1);
        if (!p || p->dt.code != TK_DL_INT || p->dt.bits < 32)
            return tk_cli_usage(USAGE, "--fill %.*s: %s has no i32/i64 tensor parameter of that name",
                                (int)(eq - o->fills[s]), o->fills[s], o->fname);
        p->fill = eq + 1;
    }
    return RUN_GO;
}

/* A scalar parameter's --arg as the call's next argument. */
static int add_scalar(run_state *st, const run_opts *o, rparam *p)
{
    tk_arg *a = &st->args[st->nargs];
    char *end = NULL;
    if (!p->argval)
        return tk_cli_usage(USAGE, "%s needs --arg %s=VALUE", o->fname, p->name);
    a->name = p->name;
    if (strpbrk(p->argval, ".eE")) {
        a->kind = TK_ARG_F64;
        a->f = strtod(p->argval, &end);
    } else {
        a->kind = TK_ARG_I64;
        a->i = strtoll(p->argval, &end, 10);
    }
    if (!end || *end)
        return tk_cli_usage(USAGE, "--arg %s: '%s' is not a number", p->name, p->argval);
    a->t = NULL;
    st->nargs++;
    return RUN_GO;
}

/* A tensor parameter: host contents (random; an index tensor 0, iota or --fill's constant), copied to
 * device memory, as the call's next argument. */
static int add_tensor(run_state *st, tk_cli *cli, const run_opts *o, rparam *p)
{
    size_t n = 1;
    int rc;
    for (int j = 0; j < p->ndim; j++)
        n *= (size_t)p->shape[j];
    p->bytes = n * (p->dt.bits / 8);
    p->host = malloc(p->bytes ? p->bytes : 1);
    if (!p->host)
        return tk_cli_errorf(cli, TK_ERR_NOMEM, 0, "out of memory for '%s' (%zu bytes)", p->name, p->bytes);
    int index = p->dt.code == TK_DL_INT && p->dt.bits >= 32; /* an index tensor: in range */
    long long cst = p->fill && strcmp(p->fill, "iota") != 0 ? strtoll(p->fill, NULL, 10) : 0;
    for (size_t e = 0; e < n; e++) {
        double v = !index ? urand() : p->fill && !strcmp(p->fill, "iota") ? (double)e : (double)cst;
        if (index && p->dt.bits == 32)
            ((int32_t *)p->host)[e] = (int32_t)v;
        else if (index)
            ((int64_t *)p->host)[e] = (int64_t)v;
        else
            put(p->host, e, p->dt, v);
    }
    if (p->bytes && ((rc = tk_device_alloc(&p->dptr, (int)o->device, p->bytes)) != TK_OK ||
                     (rc = tk_device_copy(p->dptr, p->host, p->bytes, TK_COPY_H2D, (int)o->device)) != TK_OK))
        return tk_cli_errorf(cli, rc, TK_EXIT_DEVICE, "%zu bytes on the GPU for '%s': %s", p->bytes, p->name,
                             tk_last_error());
    p->t.data = p->dptr;
    p->t.device.device_type = TK_DEV_CUDA;
    p->t.device.device_id = (int32_t)o->device;
    p->t.ndim = p->ndim;
    p->t.dtype = p->dt;
    p->t.shape = p->shape;
    st->args[st->nargs].kind = TK_ARG_TENSOR;
    st->args[st->nargs].name = p->name;
    st->args[st->nargs].t = &p->t;
    st->nargs++;
    return RUN_GO;
}

/* the call's arguments, in parameter order (derived ones come from the launch rule) */
static int prepare_args(run_state *st, tk_cli *cli, const run_opts *o)
{
    for (size_t i = 0; i < st->np; i++) {
        rparam *p = &st->ps[i];
        int r = RUN_GO;
        if (p->derived)
            continue;
        if (!p->is_tensor)
            r = add_scalar(st, o, p);
        else if (p->ndim < 0 && p->optional)
            continue; /* left out: the kernel gets a null pointer */
        else if (p->ndim < 0)
            r = tk_cli_usage(USAGE, "%s needs a --shape for tensor '%s'", o->fname, p->name);
        else
            r = add_tensor(st, cli, o, p);
        if (r != RUN_GO)
            return r;
    }
    return RUN_GO;
}

/* run: warmup calls, then the timed ones; *ms receives the mean time per call. */
static int time_calls(run_state *st, tk_cli *cli, const run_opts *o, double *ms)
{
    int rc;
    for (long w = 0; w < o->warmup; w++)
        if ((rc = tk_function_call(st->fn, st->args, st->nargs, NULL)) != TK_OK)
            return tk_cli_fail(cli, rc, NULL);
    if ((rc = tk_device_sync((int)o->device)) != TK_OK)
        return tk_cli_fail(cli, rc, NULL);
    double t0 = now_ms();
    for (long it = 0; it < o->iters; it++)
        if ((rc = tk_function_call(st->fn, st->args, st->nargs, NULL)) != TK_OK)
            return tk_cli_fail(cli, rc, NULL);
    if ((rc = tk_device_sync((int)o->device)) != TK_OK)
        return tk_cli_errorf(cli, rc, TK_EXIT_DEVICE, "the kernel failed on the GPU: %s", tk_last_error());
    *ms = (now_ms() - t0) / (double)o->iters;
    return RUN_GO;
}

/* Every tensor read back and summed in double precision (before anything is printed). */
static int checksums(run_state *st, tk_cli *cli, const run_opts *o)
{
    for (size_t i = 0; i < st->np; i++) {
        rparam *p = &st->ps[i];
        if (!p->is_tensor || p->derived)
            continue;
        size_t n = p->bytes / (p->dt.bits / 8);
        int rc;
        if (p->bytes && (rc = tk_device_copy(p->host, p->dptr, p->bytes, TK_COPY_D2H, (int)o->device)) != TK_OK)
            return tk_cli_errorf(cli, rc, TK_EXIT_DEVICE, "reading '%s' back: %s", p->name, tk_last_error());
        for (size_t e = 0; e < n; e++) {
            double v = get(p->host, e, p->dt);
            st->sum[i] += v;
            st->abs_sum[i] += fabs(v);
        }
    }
    return RUN_GO;
}

/* report: the time and every tensor's checksums, as text or one JSON object. */
static void report(const run_state *st, const tk_cli *cli, const run_opts *o, double ms)
{
    int first = 1;
    if (cli->json) {
        printf("{\"function\": ");
        tk_cli_json_str(stdout, o->fname);
        printf(", \"ms\": %.6f, \"iters\": %ld, \"checksums\": {", ms, o->iters);
    } else {
        printf("%s: %.4f ms per call (%ld calls)\n", o->fname, ms, o->iters);
    }
    for (size_t i = 0; i < st->np; i++) {
        const rparam *p = &st->ps[i];
        if (!p->is_tensor || p->derived)
            continue;
        if (cli->json) {
            printf("%s", first ? "" : ", ");
            tk_cli_json_str(stdout, p->name);
            printf(": {\"sum\": ");
            tk_cli_json_num(stdout, st->sum[i]);
            printf(", \"abs_sum\": ");
            tk_cli_json_num(stdout, st->abs_sum[i]);
            printf("}");
        } else {
            printf("  checksum %-12s %s sum %.9g  abs_sum %.9g\n", p->name, tk_dtype_name(p->dt), st->sum[i],
                   st->abs_sum[i]);
        }
        first = 0;
    }
    if (cli->json)
        printf("}}\n");
}

static void run_state_free(run_state *st, const run_opts *o)
{
    for (size_t i = 0; i < st->np; i++) {
        tk_device_free(st->ps[i].dptr, (int)o->device);
        free(st->ps[i].host);
    }
    json_decref(st->man);
    tk_kernel_free(st->k);
}

int tk_cmd_run(tk_cli *cli, int argc, char **argv)
{
    run_opts o;
    run_state *st = NULL;
    double ms = 0;
    int code;

    memset(&o, 0, sizeof o);
    if ((code = parse_options(&o, cli, argc, argv)) != RUN_GO)
        return code;
    rng_state = (uint64_t)o.seed * 0x9E3779B97F4A7C15ull + 1;
    if ((code = check_device(cli, &o)) != RUN_GO)
        return code;
    if (!(st = calloc(1, sizeof *st)))
        return tk_cli_errorf(cli, TK_ERR_NOMEM, 0, "out of memory");
    if ((code = resolve_kernel(st, cli, &o)) == RUN_GO && (code = bind_options(st, &o)) == RUN_GO &&
        (code = prepare_args(st, cli, &o)) == RUN_GO && (code = time_calls(st, cli, &o, &ms)) == RUN_GO &&
        (code = checksums(st, cli, &o)) == RUN_GO) {
        report(st, cli, &o, ms);
        code = TK_EXIT_OK;
    }
    run_state_free(st, &o);
    free(st);
    return code;
}
