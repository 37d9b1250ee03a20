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
    if (!strcmp(n, "f32")) ((float *)buf)[i] = (float)v;
    else if (!strcmp(n, "f64")) ((double *)buf)[i] = v;
    else if (!strcmp(n, "f16")) ((uint16_t *)buf)[i] = f2h((float)v);
    else if (!strcmp(n, "bf16")) ((uint16_t *)buf)[i] = f2bf((float)v);
    else if (!strcmp(n, "i8")) ((int8_t *)buf)[i] = (int8_t)(v * 100);
    else if (!strcmp(n, "u8")) ((uint8_t *)buf)[i] = (uint8_t)((v + 1) * 100);
    else if (!strcmp(n, "i32")) ((int32_t *)buf)[i] = (int32_t)(v * 1000);
    else if (!strcmp(n, "i64")) ((int64_t *)buf)[i] = (int64_t)(v * 1000);
    else ((uint8_t *)buf)[i] = (uint8_t)(rng_state & 0x77); /* fp8: a finite byte */
}

static double get(const void *buf, size_t i, tk_dtype dt)
{
    const char *n = tk_dtype_name(dt);
    if (!strcmp(n, "f32")) return ((const float *)buf)[i];
    if (!strcmp(n, "f64")) return ((const double *)buf)[i];
    if (!strcmp(n, "f16")) return h2f(((const uint16_t *)buf)[i]);
    if (!strcmp(n, "bf16")) return bf2f(((const uint16_t *)buf)[i]);
    if (!strcmp(n, "i8")) return ((const int8_t *)buf)[i];
    if (!strcmp(n, "u8")) return ((const uint8_t *)buf)[i];
    if (!strcmp(n, "i32")) return ((const int32_t *)buf)[i];
    if (!strcmp(n, "i64")) return (double)((const int64_t *)buf)[i];
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

int tk_cmd_run(tk_cli *cli, int argc, char **argv)
{
    const char *ref = NULL, *fname = NULL, *shapes[MAXP], *sargs[MAXP], *fills[MAXP];
    size_t nshapes = 0, nsargs = 0, nfills = 0, np = 0;
    long iters = 20, warmup = 3, device = 0, seed = 1;
    rparam ps[MAXP];
    tk_arg args[MAXP];
    size_t nargs = 0;
    tk_kernel *k = NULL;
    tk_pkg *pkg = NULL;
    const tk_function *fn = NULL;
    json_t *man = NULL, *kern = NULL;
    int code = TK_EXIT_FAIL, rc, ndev = 0;

    memset(ps, 0, sizeof ps);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        long *num = NULL;
        if (tk_cli_is_help(a)) {
            fputs(HELP, stdout);
            return TK_EXIT_OK;
        } else if (!strcmp(a, "--shape") || !strcmp(a, "-s")) {
            if (++i >= argc || nshapes == MAXP)
                return tk_cli_usage(USAGE, "--shape needs [PARAM=]DIMS");
            shapes[nshapes++] = argv[i];
        } else if (!strcmp(a, "--arg")) {
            if (++i >= argc || !strchr(argv[i], '=') || nsargs == MAXP)
                return tk_cli_usage(USAGE, "--arg needs NAME=VALUE");
            sargs[nsargs++] = argv[i];
        } else if (!strcmp(a, "--fill")) {
            if (++i >= argc || !strchr(argv[i], '=') || nfills == MAXP)
                return tk_cli_usage(USAGE, "--fill needs NAME=iota or NAME=INTEGER");
            if (!fill_ok(strchr(argv[i], '=') + 1))
                return tk_cli_usage(USAGE, "--fill %s: want iota or an integer", argv[i]);
            fills[nfills++] = argv[i];
        } else if (!strcmp(a, "--iters")) {
            num = &iters;
        } else if (!strcmp(a, "--warmup")) {
            num = &warmup;
        } else if (!strcmp(a, "--seed")) {
            num = &seed;
        } else if (!strcmp(a, "--device")) {
            num = &device;
        } else if (!strcmp(a, "--json")) {
            cli->json = 1;
        } else if (a[0] == '-') {
            return tk_cli_usage(USAGE, "unknown option '%s'", a);
        } else if (!ref) {
            ref = a;
        } else if (!fname) {
            fname = a;
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
    if (!ref || !fname)
        return tk_cli_usage(USAGE, "which package and function? e.g. tk run kernels-community/activation "
                                   "silu_and_mul_f32 --shape 8x128 --shape 8x256");
    if (iters < 1)
        iters = 1;
    rng_state = (uint64_t)seed * 0x9E3779B97F4A7C15ull + 1;

    /* no GPU: say why, before touching the network */
    rc = tk_device_count(&ndev);
    if (rc != TK_OK || ndev == 0) {
        if (rc != TK_OK)
            fprintf(stderr, "tk: cannot run %s on a GPU: %s\n", fname, tk_last_error());
        else
            fprintf(stderr, "tk: cannot run %s: the CUDA driver reports no GPU\n"
                            "HINT: check 'nvidia-smi' and CUDA_VISIBLE_DEVICES\n", fname);
        fprintf(stderr, "tk: 'tk build %s --arch sm_90' still compiles it ahead of time\n", ref);
        return TK_EXIT_DEVICE;
    }
    if (device >= ndev) {
        fprintf(stderr, "tk: no CUDA device %ld (this machine has %d)\n", device, ndev);
        return TK_EXIT_DEVICE;
    }
    tk_ctx *ctx = tk_cli_ctx(cli);
    if (!ctx)
        return TK_EXIT_FAIL;
    tk_kernel_opts ko = TK_KERNEL_OPTS_INIT;
    ko.device = (int)device;
    if ((rc = tk_get_kernel(&k, ctx, ref, &ko)) != TK_OK)
        return tk_cli_fail(cli, rc, NULL);
    if ((rc = tk_kernel_function(&fn, k, fname)) != TK_OK) {
        code = tk_cli_fail(cli, rc, NULL);
        goto done;
    }
    /* the params, from the manifest the kernel was built from (a package directory's too) */
    man = json_loads(tk_kernel_manifest(k), 0, NULL);
    {
        size_t i;
        json_t *x;
        json_array_foreach(json_object_get(man, "kernels"), i, x) if (!strcmp(
            json_string_value(json_object_get(x, "name")) ? json_string_value(json_object_get(x, "name")) : "",
            fname)) kern = x;
    }
    if (!kern) {
        fprintf(stderr, "tk: %s's manifest has no kernel '%s'\n", ref, fname);
        goto done;
    }
    {
        size_t i;
        json_t *x;
        json_array_foreach(json_object_get(kern, "params"), i, x) {
            if (np == MAXP)
                break;
            rparam *p = &ps[np++];
            const char *type = json_string_value(json_object_get(x, "type"));
            p->name = json_string_value(json_object_get(x, "name"));
            p->is_tensor = type && !strcmp(type, "tensor");
            p->derived = json_object_get(x, "value") != NULL;
            p->optional = json_is_true(json_object_get(x, "optional"));
            p->ndim = -1;
            if (p->is_tensor && tk_dtype_parse(&p->dt, json_string_value(json_object_get(x, "dtype"))) != TK_OK) {
                code = tk_cli_fail(cli, TK_ERR_MANIFEST, fname);
                goto done;
            }
        }
    }
    /* bind shapes: by name, then in order */
    {
        size_t next = 0;
        for (size_t s = 0; s < nshapes; s++) {
            const char *eq = strchr(shapes[s], '='), *dims = eq ? eq + 1 : shapes[s];
            rparam *p = NULL;
            if (eq) {
                for (size_t i = 0; i < np; i++)
                    if (ps[i].is_tensor && strlen(ps[i].name) == (size_t)(eq - shapes[s]) &&
                        !strncmp(ps[i].name, shapes[s], (size_t)(eq - shapes[s])))
                        p = &ps[i];
                if (!p) {
                    code = tk_cli_usage(USAGE, "%s has no tensor parameter '%.*s'", fname, (int)(eq - shapes[s]),
                                        shapes[s]);
                    goto done;
                }
            } else {
                while (next < np && (!ps[next].is_tensor || ps[next].ndim >= 0))
                    next++;
                if (next == np) {
                    code = tk_cli_usage(USAGE, "more --shape than tensor parameters");
                    goto done;
                }
                p = &ps[next];
            }
            if (parse_dims(p->shape, &p->ndim, dims) != 0) {
                code = tk_cli_usage(USAGE, "bad shape '%s' (want e.g. 8x1024)", dims);
                goto done;
            }
        }
        for (size_t s = 0; s < nsargs; s++) {
            const char *eq = strchr(sargs[s], '=');
            size_t i;
            for (i = 0; i < np; i++)
                if (!ps[i].is_tensor && strlen(ps[i].name) == (size_t)(eq - sargs[s]) &&
                    !strncmp(ps[i].name, sargs[s], (size_t)(eq - sargs[s])))
                    break;
            if (i == np) {
                code = tk_cli_usage(USAGE, "%s has no scalar parameter '%.*s'", fname, (int)(eq - sargs[s]), sargs[s]);
                goto done;
            }
            ps[i].argval = eq + 1;
        }
        for (size_t s = 0; s < nfills; s++) {
            const char *eq = strchr(fills[s], '=');
            size_t i;
            for (i = 0; i < np; i++)
                if (ps[i].is_tensor && strlen(ps[i].name) == (size_t)(eq - fills[s]) &&
                    !strncmp(ps[i].name, fills[s], (size_t)(eq - fills[s])))
                    break;
            if (i == np || ps[i].dt.code != TK_DL_INT || ps[i].dt.bits < 32) {
                code = tk_cli_usage(USAGE, "--fill %.*s: %s has no i32/i64 tensor parameter of that name",
                                    (int)(eq - fills[s]), fills[s], fname);
                goto done;
            }
            ps[i].fill = eq + 1;
        }
    }
    /* device memory and random contents */
    for (size_t i = 0; i < np; i++) {
        rparam *p = &ps[i];
        if (p->derived)
            continue;
        if (!p->is_tensor) {
            char *end = NULL;
            if (!p->argval) {
                code = tk_cli_usage(USAGE, "%s needs --arg %s=VALUE", fname, p->name);
                goto done;
            }
            args[nargs].name = p->name;
            if (strpbrk(p->argval, ".eE")) {
                args[nargs].kind = TK_ARG_F64;
                args[nargs].f = strtod(p->argval, &end);
            } else {
                args[nargs].kind = TK_ARG_I64;
                args[nargs].i = strtoll(p->argval, &end, 10);
            }
            if (!end || *end) {
                code = tk_cli_usage(USAGE, "--arg %s: '%s' is not a number", p->name, p->argval);
                goto done;
            }
            args[nargs].t = NULL;
            nargs++;
            continue;
        }
        if (p->ndim < 0 && p->optional)
            continue; /* left out: the kernel gets a null pointer */
        if (p->ndim < 0) {
            code = tk_cli_usage(USAGE, "%s needs a --shape for tensor '%s'", fname, p->name);
            goto done;
        }
        size_t n = 1;
        for (int j = 0; j < p->ndim; j++)
            n *= (size_t)p->shape[j];
        p->bytes = n * (p->dt.bits / 8);
        p->host = malloc(p->bytes ? p->bytes : 1);
        if (!p->host)
            goto done;
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
        if (p->bytes && ((rc = tk_device_alloc(&p->dptr, (int)device, p->bytes)) != TK_OK ||
                         (rc = tk_device_copy(p->dptr, p->host, p->bytes, TK_COPY_H2D, (int)device)) != TK_OK)) {
            fprintf(stderr, "tk: %zu bytes on the GPU for '%s': %s\n", p->bytes, p->name, tk_last_error());
            code = TK_EXIT_DEVICE;
            goto done;
        }
        p->t.data = p->dptr;
        p->t.device.device_type = TK_DEV_CUDA;
        p->t.device.device_id = (int32_t)device;
        p->t.ndim = p->ndim;
        p->t.dtype = p->dt;
        p->t.shape = p->shape;
        args[nargs].kind = TK_ARG_TENSOR;
        args[nargs].name = p->name;
        args[nargs].t = &p->t;
        nargs++;
    }
    for (long w = 0; w < warmup; w++)
        if ((rc = tk_function_call(fn, args, nargs, NULL)) != TK_OK) {
            code = tk_cli_fail(cli, rc, NULL);
            goto done;
        }
    if ((rc = tk_device_sync((int)device)) != TK_OK) {
        code = tk_cli_fail(cli, rc, NULL);
        goto done;
    }
    double t0 = now_ms();
    for (long it = 0; it < iters; it++)
        if ((rc = tk_function_call(fn, args, nargs, NULL)) != TK_OK) {
            code = tk_cli_fail(cli, rc, NULL);
            goto done;
        }
    if ((rc = tk_device_sync((int)device)) != TK_OK) {
        fprintf(stderr, "tk: the kernel failed on the GPU: %s\n", tk_last_error());
        code = TK_EXIT_DEVICE;
        goto done;
    }
    double ms = (now_ms() - t0) / (double)iters;
    if (cli->json)
        printf("{\"function\": \"%s\", \"ms\": %.6f, \"iters\": %ld, \"checksums\": {", fname, ms, iters);
    else
        printf("%s: %.4f ms per call (%ld calls)\n", fname, ms, iters);
    {
        int first = 1;
        for (size_t i = 0; i < np; i++) {
            rparam *p = &ps[i];
            double sum = 0, asum = 0;
            size_t n;
            if (!p->is_tensor || p->derived)
                continue;
            n = p->bytes / (p->dt.bits / 8);
            if (p->bytes && tk_device_copy(p->host, p->dptr, p->bytes, TK_COPY_D2H, (int)device) != TK_OK) {
                fprintf(stderr, "tk: reading '%s' back: %s\n", p->name, tk_last_error());
                code = TK_EXIT_DEVICE;
                goto done;
            }
            for (size_t e = 0; e < n; e++) {
                double v = get(p->host, e, p->dt);
                sum += v;
                asum += fabs(v);
            }
            if (cli->json)
                printf("%s\"%s\": {\"sum\": %.9g, \"abs_sum\": %.9g}", first ? "" : ", ", p->name, sum, asum);
            else
                printf("  checksum %-12s %s sum %.9g  abs_sum %.9g\n", p->name, tk_dtype_name(p->dt), sum, asum);
            first = 0;
        }
    }
    if (cli->json)
        printf("}}\n");
    code = TK_EXIT_OK;
done:
    for (size_t i = 0; i < np; i++) {
        tk_device_free(ps[i].dptr, (int)device);
        free(ps[i].host);
    }
    json_decref(man);
    tk_pkg_free(pkg);
    tk_kernel_free(k);
    return code;
}
