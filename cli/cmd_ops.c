/*
 * cmd_ops.c — tk ops: the standard ops, their signatures and the installed kernels implementing them;
 * tk run-op: runs one op on random host tensors through tk_op_run (the CPU reference) and prints what
 * ran, how long it took and a checksum of the result.
 *
 * Both read tk_ops_json(), the only description of ops the public API offers, with jansson (cli/
 * sees tk.h and nothing else of tk's). run-op derives every tensor's shape from --shape
 * and the shape patterns of the signature ("[..., 2*d]"), so it needs no per-op code.
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/ioctl.h>
#include <time.h>

#include <jansson.h>

#include "cli/cli.h"
#include "cli/shape.h"

/* Reports a failure of tk ops or run-op: a JSON error object under --json, else "tk: ..." on stderr. status is
 * a TK_ERR_* or TK_CLI_STATUS_USAGE (bad arguments or shapes: exit 2). Returns the exit code. */
static int run_fail(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int run_fail(int status, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (tk_cli_json_mode)
        tk_cli_json_error(status, NULL, msg);
    else
        fprintf(stderr, "tk: %s\n", msg);
    return status == TK_CLI_STATUS_USAGE ? TK_EXIT_USAGE : tk_cli_exit_code(status);
}

/* tk_ops_json, parsed. NULL after printing the error. */
static json_t *load_ops(tk_cli *cli, int *exit_code)
{
    tk_ctx *ctx = tk_cli_ctx(cli);
    *exit_code = cli->ctx_exit ? cli->ctx_exit : TK_EXIT_FAIL;
    if (!ctx)
        return NULL;
    char *text = NULL;
    int rc = tk_ops_json(&text, ctx);
    if (rc != TK_OK) {
        *exit_code = tk_cli_fail(cli, rc, "cannot list ops");
        return NULL;
    }
    json_t *v = json_loads(text, 0, NULL);
    tk_free(text);
    if (!json_is_array(v)) {
        json_decref(v);
        run_fail(TK_ERR_INTERNAL, "internal error: tk_ops_json returned text this tk cannot read");
        return NULL;
    }
    return v;
}

static const json_t *find_op(const json_t *ops, const char *name)
{
    for (size_t i = 0; i < json_array_size(ops); i++)
        if (json_string_value(json_object_get(json_array_get(ops, i), "name")) &&
            !strcmp(json_string_value(json_object_get(json_array_get(ops, i), "name")), name))
            return json_array_get(ops, i);
    return NULL;
}

/* ---- tk ops ----------------------------------------------------------------------------------- */

/* The width to wrap `tk ops` to: $COLUMNS, else the terminal's, else 80 (at least 40). */
static int term_width(void)
{
    const char *c = getenv("COLUMNS");
    int w = c ? atoi(c) : 0;
    struct winsize ws;
    if (w <= 0 && isatty(STDOUT_FILENO) && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0)
        w = ws.ws_col;
    if (w <= 0)
        w = 80;
    return w < 40 ? 40 : w;
}

/* Prints text indented by `indent`, broken after ", " or at spaces so no line passes width; the
 * continuation lines get 4 more spaces. A single word longer than the line is printed whole. */
static void print_wrapped(const char *text, int indent, int width)
{
    int col = printf("%*s", indent, ""), line_start = 1;
    for (const char *p = text; *p;) {
        while (*p == ' ')
            p++;
        size_t n = strcspn(p, " ");
        if (!n)
            break;
        if (!line_start && col + 1 + (int)n > width) {
            col = printf("\n%*s", indent + 4, "") - 1;
            line_start = 1;
        }
        if (!line_start)
            col += printf(" ");
        fwrite(p, 1, n, stdout);
        col += (int)n;
        line_start = 0;
        p += n;
    }
    printf("\n");
}

static const char *OPS_USAGE = "tk ops [--json] [--package DIR] [OP]";

static void print_op_detail(const json_t *op)
{
    const json_t *impls = json_object_get(op, "implementations");
    printf("%s\n", json_string_value(json_object_get(op, "signature"))
                       ? json_string_value(json_object_get(op, "signature"))
                       : json_string_value(json_object_get(op, "name")));
    if (json_string_value(json_object_get(op, "summary")))
        printf("  %s\n", json_string_value(json_object_get(op, "summary")));
    const json_t *ps = json_object_get(op, "params");
    for (size_t i = 0; ps && i < json_array_size(ps); i++) {
        const json_t *p = json_array_get(ps, i);
        printf("    %-10s %s\n", json_string_value(json_object_get(p, "name")),
               json_string_value(json_object_get(p, "doc")) ? json_string_value(json_object_get(p, "doc")) : "");
    }
    const json_t *cpu = json_object_get(op, "cpu_reference"), *local = json_object_get(op, "local");
    if (json_string_value(json_object_get(op, "declared_by")))
        printf("  declared by %s%s; no CPU reference\n", json_string_value(json_object_get(op, "declared_by")),
               json_is_true(local) ? " (a local package directory)" : "");
    const json_t *cims = json_object_get(op, "cpu_implementations");
    if (cims && json_array_size(cims)) { /* tried in this order for host tensors; the reference when none fits */
        printf("  cpu implementations (host tensors, the first usable one that fits runs):\n");
        for (size_t i = 0; i < json_array_size(cims); i++) {
            const json_t *m = json_array_get(cims, i), *needs = json_object_get(m, "needs"),
                         *u = json_object_get(m, "usable");
            char nd[128] = "";
            for (size_t k = 0; needs && k < json_array_size(needs); k++)
                snprintf(nd + strlen(nd), sizeof nd - strlen(nd), "%s%s", k ? "," : "",
                         json_string_value(json_array_get(needs, k)));
            printf("    %-14s %-16s %s%s\n", json_string_value(json_object_get(m, "impl")), nd[0] ? nd : "any CPU",
                   json_is_true(u) ? "" : "(not usable here) ",
                   json_string_value(json_object_get(m, "doc")) ? json_string_value(json_object_get(m, "doc")) : "");
        }
    }
    printf("  implementations:%s\n", json_is_true(cpu) ? " cpu-reference (host tensors)" : "");
    const json_t *pkg = json_object_get(op, "package");
    if ((!impls || json_array_size(impls) == 0) && pkg && json_string_value(pkg))
        printf("    (no installed package; try 'tk get %s')\n", json_string_value(pkg));
    else if (!impls || json_array_size(impls) == 0)
        printf("    (no installed package implements it)\n");
    for (size_t i = 0; impls && i < json_array_size(impls); i++) {
        const json_t *m = json_array_get(impls, i);
        const json_t *dts = json_object_get(m, "dtypes"), *cc = json_object_get(m, "min_cc"),
                     *pr = json_object_get(m, "priority");
        printf("    %-48s v%s", json_string_value(json_object_get(m, "impl")),
               json_string_value(json_object_get(m, "version")));
        for (size_t d = 0; dts && d < json_array_size(dts); d++)
            printf("%s%s", d ? "," : "  ", json_string_value(json_array_get(dts, d)));
        if (json_is_number(cc))
            printf("  sm_%d+", (int)json_number_value(cc));
        printf("  priority %d\n", (int)json_number_value(pr));
    }
}

/* The list: one block per op, wrapped to the terminal (COLUMNS, else the tty's width, else 80). */
static void print_op_list(const json_t *ops)
{
    /* one block per op, wrapped to the terminal (COLUMNS, else the tty's width, else 80):
     *   silu_and_mul
     *       (out: T[..., d], input: T[..., 2*d]) -> out; T in {f32, f16, bf16}
     *       implementations: cpu-reference, kernels-community/activation (3 kernels)          */
    int width = term_width();
    for (size_t i = 0; i < json_array_size(ops); i++) {
        const json_t *op = json_array_get(ops, i), *impls = json_object_get(op, "implementations"),
                     *cpu = json_object_get(op, "cpu_reference");
        const char *sig = json_string_value(json_object_get(op, "signature"));
        const char *name = json_string_value(json_object_get(op, "name"));
        const char *args = sig && name && !strncmp(sig, name, strlen(name)) ? sig + strlen(name) : sig;
        char impl[2048] = "implementations: ";
        size_t shown = 0;
        const json_t *cims = json_object_get(op, "cpu_implementations");
        for (size_t k = 0; cims && k < json_array_size(cims); k++) { /* the usable fast CPU ones, fastest first */
            const json_t *u = json_object_get(json_array_get(cims, k), "usable");
            if (!json_is_true(u))
                continue;
            char one[96];
            snprintf(one, sizeof one, "%s%s", shown ? ", " : "",
                     json_string_value(json_object_get(json_array_get(cims, k), "impl")));
            strncat(impl, one, sizeof impl - strlen(impl) - 1);
            shown++;
        }
        if (json_is_true(cpu)) {
            strncat(impl, shown ? ", cpu-reference" : "cpu-reference", sizeof impl - strlen(impl) - 1);
            shown++;
        }
        for (size_t k = 0; impls && k < json_array_size(impls); k++) {
            /* one entry per package: "org/name (3 kernels)" */
            const char *pkg = json_string_value(json_object_get(json_array_get(impls, k), "package"));
            int dup = 0;
            for (size_t j = 0; j < k; j++)
                dup |= !strcmp(json_string_value(json_object_get(json_array_get(impls, j), "package")), pkg);
            if (dup)
                continue;
            size_t nk = 0;
            for (size_t j = 0; j < json_array_size(impls); j++)
                nk += !strcmp(json_string_value(json_object_get(json_array_get(impls, j), "package")), pkg);
            char one[300];
            snprintf(one, sizeof one, "%s%s (%zu kernel%s)", shown ? ", " : "", pkg, nk, nk == 1 ? "" : "s");
            strncat(impl, one, sizeof impl - strlen(impl) - 1);
            shown++;
        }
        if (!shown)
            strncat(impl, "none installed", sizeof impl - strlen(impl) - 1);
        const char *by = json_string_value(json_object_get(op, "declared_by"));
        const json_t *local = json_object_get(op, "local");
        printf("%s%s%s%s%s\n", i ? "\n" : "", name ? name : "?", by ? "  (declared by " : "", by ? by : "",
               by ? (json_is_true(local) ? ", local)" : ")") : "");
        print_wrapped(args ? args : "(defined by a package)", 4, width);
        print_wrapped(impl, 4, width);
    }
}

int tk_cmd_ops(tk_cli *cli, int argc, char **argv)
{
    const char *only = NULL, *package = NULL;
    for (int i = 1; i < argc; i++) {
        if (tk_cli_is_help(argv[i])) {
            printf("usage: %s\n"
                   "\n"
                   "Lists the ops tk knows: each standard op's signature, whether it has a CPU reference,\n"
                   "and the kernels of installed packages that implement it. Ops that installed packages\n"
                   "declare (kernel.json \"ops\") follow, marked \"declared by ORG/NAME\", with their\n"
                   "signatures and no CPU reference; then the op names of other package kernels (no\n"
                   "signature: call those kernels with 'tk run').\n"
                   "\n"
                   "  OP             show one op in detail: parameters and every implementation\n"
                   "  --package DIR  add a package directory's op declarations and kernels (checked as\n"
                   "                 'tk check' does, never installed; its kernels are marked @local)\n"
                   "  --json         print the list as JSON (name, signature, params, implementations,\n"
                   "                 declared_by and local for declared ops); errors as a JSON object\n"
                   "\n"
                   "tk_op_run() picks, for CUDA tensors, the installed implementation with the highest\n"
                   "priority that fits the dtype and the GPU; config.json can pin one per op:\n"
                   "  {\"ops\": {\"silu_and_mul\": \"org/name\"}}   (or \"org/name@2\", \"org/name:kernel\")\n"
                   "Host tensors run the fastest CPU implementation this CPU can run that fits the call\n"
                   "(cpu-avx2, cpu-portable), else the op's CPU reference; TK_CPU_IMPL=reference forces\n"
                   "the references (docs/cpu.md).\n"
                   "\n"
                   "examples:\n"
                   "  tk ops\n"
                   "  tk ops silu_and_mul\n"
                   "  tk ops --package ./my-op my_op\n"
                   "  tk run-op silu_and_mul --shape 4,4096 --dtype bf16\n",
                   OPS_USAGE);
            return TK_EXIT_OK;
        }
        if (!strcmp(argv[i], "--package")) {
            if (i + 1 >= argc)
                return tk_cli_usage(OPS_USAGE, "--package needs a directory");
            package = argv[++i];
            continue;
        }
        if (argv[i][0] == '-')
            return tk_cli_unknown_option(OPS_USAGE, argv[i]);
        if (only)
            return tk_cli_usage(OPS_USAGE, "unexpected argument '%s'", argv[i]);
        only = argv[i];
    }
    int code, rc;
    if (package && tk_cli_ctx(cli) && (rc = tk_ops_add_package(tk_cli_ctx(cli), package)) != TK_OK)
        return tk_cli_fail(cli, rc, "--package");
    json_t *ops = load_ops(cli, &code);
    if (!ops)
        return code;
    code = TK_EXIT_OK;
    const json_t *one = only ? find_op(ops, only) : NULL;
    if (only && !one) {
        const char *names[512];
        size_t nn = 0;
        for (size_t i = 0; i < json_array_size(ops) && nn < 511; i++)
            if (json_string_value(json_object_get(json_array_get(ops, i), "name")))
                names[nn++] = json_string_value(json_object_get(json_array_get(ops, i), "name"));
        names[nn] = NULL;
        const char *dym = tk_cli_closest(only, names);
        code = run_fail(TK_ERR_NOT_FOUND, "unknown op '%s'\nHINT: %s%s%s'tk ops' lists every op", only,
                        dym ? "did you mean '" : "", dym ? dym : "", dym ? "'? " : "");
    } else if (cli->json) {
        json_dumpf(one ? one : ops, stdout, JSON_INDENT(2));
        printf("\n");
    } else if (one) {
        print_op_detail(one);
    } else {
        print_op_list(ops);
    }
    json_decref(ops);
    return code;
}

/* ---- tk run-op -------------------------------------------------------------------------------- */

static const char *RUN_USAGE = "tk run-op OP --shape [NAME=]D0,D1,... [--dtype [NAME=]DT] [--seed N] [--repeat N] "
                               "[--arg NAME=VALUE]... [--package DIR] [--device cpu|cuda[:N]] [--check]";

#define MAX_T 16
#define MAX_D TK_CLI_MAX_D

typedef tk_cli_dim_pat dim_pat; /* cli/shape.h */
typedef tk_cli_binding binding;

typedef struct {
    char name[64];
    int ndim;
    int64_t shape[MAX_D];
    void *data;
    size_t bytes;
    tk_tensor t;
    int out;
    void *dptr;  /* --device cuda: the device copy t points at */
    void *ref;   /* --check: the CPU reference's result (outputs), or the initial contents */
    int checked; /* --check, outputs: 1 when compared */
    size_t nbad, at; /* elements outside the tolerance; where the largest difference is */
    double worst, tol;
} host_tensor;

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double elem(const host_tensor *h, size_t i)
{
    const tk_dtype d = h->t.dtype;
    if (d.code == TK_DL_INT)
        return d.bits == 64   ? (double)((const int64_t *)h->data)[i]
               : d.bits == 32 ? (double)((const int32_t *)h->data)[i]
                              : (double)((const int8_t *)h->data)[i];
    if (d.code == TK_DL_UINT)
        return ((const uint8_t *)h->data)[i];
    /* f16, bf16, fp8 (and f32, f64) widen exactly to f64 */
    double v = 0;
    tk_dtype f64 = {TK_DL_FLOAT, 64, 1};
    tk_convert(&v, f64, (const char *)h->data + i * (d.bits / 8u), d, 1);
    return v;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void errf(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void errf(char *err, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
}

/* Adds the bindings of one tensor's pattern; a symbol bound twice must agree. 0, or -1 / -2 with why
 * (may be NULL) written into err. */
static int bind_more(const char *opname, const char *pname, const char *pattern, const int64_t *shape, int nd,
                     binding *b, int *nb, int64_t *lead, int *nlead, char *err, size_t errn)
{
    dim_pat pat[MAX_D];
    binding nbind[MAX_D];
    int np = 0, n = 0, nl = 0;
    int64_t l[MAX_D];
    if (tk_cli_pattern_parse(pattern, pat, &np) != 0) {
        errf(err, errn, "%s: cannot read the shape pattern of '%s'", opname, pname);
        return -1;
    }
    int brc = tk_cli_pattern_bind(pat, np, shape, nd, nbind, &n, l, &nl);
    if (brc == -1) {
        errf(err, errn, "%s: '%s' %s does not have %d dimensions", opname, pname, pattern, nd);
        return -1;
    } else if (brc) {
        errf(err, errn, "%s: that dimension of '%s' %s must be a multiple of %lld", opname, pname, pattern,
             (long long)pat[-2 - brc].k);
        return -2;
    }
    for (int i = 0; i < n; i++) {
        int k = 0;
        while (k < *nb && strcmp(b[k].sym, nbind[i].sym) != 0)
            k++;
        if (k < *nb && b[k].v != nbind[i].v) {
            errf(err, errn, "%s: '%s' makes %s = %lld, but another shape made it %lld", opname, pname, nbind[i].sym,
                 (long long)nbind[i].v, (long long)b[k].v);
            return -2;
        }
        if (k == *nb && *nb < MAX_D)
            b[(*nb)++] = nbind[i];
    }
    if (nl && !*nlead) {
        memcpy(lead, l, (size_t)nl * sizeof *l);
        *nlead = nl;
    }
    return 0;
}

/* The dtype a tensor parameter gets: the requested one if it takes it, else its first allowed one; a
 * parameter whose dtype follows another's ("dtype_like") gets that one's. */
static int pick_dtype(tk_dtype *out, const json_t *p, const json_t *params, tk_dtype want, const char *want_name)
{
    const json_t *like = json_object_get(p, "dtype_like");
    for (int depth = 0; like && json_string_value(like) && depth < 8; depth++) {
        const json_t *q = NULL;
        for (size_t i = 0; i < json_array_size(params) && !q; i++)
            if (!strcmp(json_string_value(json_object_get(json_array_get(params, i), "name")), json_string_value(like)))
                q = json_array_get(params, i);
        if (!q)
            return -1;
        p = q;
        like = json_object_get(p, "dtype_like");
    }
    const json_t *dts = json_object_get(p, "dtypes");
    for (size_t i = 0; dts && i < json_array_size(dts); i++)
        if (!strcmp(json_string_value(json_array_get(dts, i)), want_name)) {
            *out = want;
            return 0;
        }
    return dts && json_array_size(dts)
               ? (tk_dtype_parse(out, json_string_value(json_array_get(dts, 0))) == TK_OK ? 0 : -1)
               : -1;
}

static void shape_text(char *buf, size_t n, const int64_t *shape, int nd)
{
    size_t len = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < nd && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (len < n)
        snprintf(buf + len, n - len, "]");
}

/* Everything the command line says. */
typedef struct {
    const char *opname, *shape_s, *dtype_s, *package;
    int device;   /* -1: host tensors (cpu); else the CUDA ordinal */
    int check;    /* --check: compare the device's outputs with the CPU reference */
    const char *named_shapes[MAX_T], *named_dtypes[MAX_T], *scalar_args[MAX_T];
    int nnamed, nndt, nscalar;
    uint64_t seed;
    long long repeat;
    tk_dtype dt;
    int64_t shape[MAX_D]; /* --shape D0,D1,... */
    int nd;
    struct {
        char name[64];
        int64_t shape[MAX_D];
        int nd;
    } named[MAX_T]; /* --shape NAME=... */
} run_opts;

/* The call being built: host tensors and the arguments that point at them. */
typedef struct {
    host_tensor ht[MAX_T];
    tk_arg args[MAX_T];
    size_t nargs, nt;
    binding b[MAX_D]; /* the signature's symbols, bound from the given shapes */
    int nb, nlead;
    int64_t lead[MAX_D];
} run_call;

static int run_help(void)
{
    printf("usage: %s\n"
           "\n"
           "Runs an op on random host tensors through tk_op_run() and prints the implementation\n"
           "that ran (the CPU reference, for host tensors), the time and a checksum of every\n"
           "tensor: the sum of its elements and an FNV-1a hash of its bytes, so two runs, two\n"
           "machines or two builds can be compared.\n"
           "\n"
           "  OP                 the op ('tk ops' lists them): tk's own, or one a package declares\n"
           "  --shape D0,D1,...  the shape of the op's first input tensor; the other shapes follow\n"
           "                     from the signature (silu_and_mul: input [4, 4096] -> out [4, 2048])\n"
           "  --shape NAME=D0,.. the shape of tensor NAME (repeatable); it binds that tensor's\n"
           "                     symbols too, so ops with several independent sizes can run\n"
           "                     (attention: --shape q=1,128,8,64 --shape k=1,256,2,64). An\n"
           "                     optional tensor is passed only when it is given a shape. When\n"
           "                     every tensor is given one, none is derived and the op checks\n"
           "                     them (linear --arg transposed=1 with weight=K,N)\n"
           "  --dtype DT         f32 (default), f16 or bf16, for the tensors that take it; the\n"
           "                     others get their first allowed dtype (i64 targets, i8 weights)\n"
           "  --dtype NAME=DT    tensor NAME's dtype (casted_linear: --dtype weight=fp8_e4m3)\n"
           "  --seed N           seed of the random inputs, uniform in [-3, 3] (default 0)\n"
           "  --repeat N         run N times and report the fastest and the mean (default 1)\n"
           "  --arg NAME=VALUE   a scalar parameter (fatrelu_and_mul: --arg threshold=0.5);\n"
           "                     scalars left out take their defaults. For an input tensor it\n"
           "                     is the value every element gets (q_sample: --arg\n"
           "                     alphas_cumprod=0.5); by default element i of an integer one\n"
           "                     holds i (distinct ids, positions, slots and blocks), float\n"
           "                     tensors are uniform in [-3, 3], 8-bit ones random codes.\n"
           "  --package DIR      add a package directory's op declarations and kernels, checked as\n"
           "                     'tk check' does and never installed (its kernels are marked @local):\n"
           "                     an op the package declares runs its shape and dtype checks here\n"
           "  --device DEV       cpu (default: host tensors, the CPU reference), cuda or cuda:N: the\n"
           "                     tensors are copied to that GPU and tk_op_run runs the best kernel\n"
           "                     (a --package directory's first); the time includes a sync\n"
           "  --check            with --device cuda: also run the CPU reference on the same inputs and\n"
           "                     compare every output after the first run (|diff| <= atol + rtol*|ref|,\n"
           "                     1e-4 f32, 2e-3 f16, 1.6e-2 bf16); exit 1 when one differs. Ops a\n"
           "                     package declares have no CPU reference: --check says it is unavailable\n"
           "  --json             print the result as a JSON object; errors as a JSON error object\n"
           "\n"
           "examples:\n"
           "  tk run-op silu_and_mul --shape 4,4096 --dtype bf16\n"
           "  tk run-op gelu --shape 128,768 --seed 7 --repeat 10\n"
           "  tk run-op fatrelu_and_mul --shape 8,1024 --arg threshold=0.25 --json\n"
           "  tk run-op cross_entropy --shape 16,32000 --shape loss=1 --dtype bf16 --arg target=7\n"
           "  tk run-op attention --shape q=1,128,8,64 --shape k=1,256,2,64 --arg causal=1\n"
           "  tk run-op scale_add --package ./scale-add --shape 4,4096\n"
           "  tk run-op scale_add --package ./scale-add --shape 4,4096 --device cuda\n"
           "  tk run-op silu_and_mul --package ./activation --shape 4,4096 --device cuda --check\n"
           "\n"
           "An op a package declares has no CPU reference: on the host, once its shapes check out,\n"
           "run-op says so and exits 8 (unsupported); its kernels run with --device cuda.\n"
           "\n"
           "exit status: 0 ok, 1 --check found a difference, 2 bad arguments or shapes, 3 unknown op\n"
           "or package directory, 5 a bad package directory or two packages declaring the op\n"
           "differently, 7 no GPU or a kernel failed, 8 nothing can run on the host.\n",
           RUN_USAGE);
    return TK_EXIT_OK;
}

/* The values of --dtype and --shape, parsed. 0 or a usage error's exit code. */
static int run_parse_values(run_opts *o)
{
    if (!o->opname)
        return tk_cli_usage(RUN_USAGE, "which op? ('tk ops' lists them)");
    if (!o->shape_s && !o->nnamed)
        return tk_cli_usage(RUN_USAGE, "--shape is required (e.g. --shape 4,4096, or --shape NAME=4,4096)");
    if (o->check && o->device < 0)
        return tk_cli_usage(RUN_USAGE, "--check compares a GPU run with the CPU reference: add --device cuda");
    /* f32, f16, bf16 in any spelling tk_dtype_parse takes (float16, half, bfloat16, ...); the
     * canonical name from here on, as the manifests' dtypes lists have it */
    if (tk_dtype_parse(&o->dt, o->dtype_s) != TK_OK || o->dt.bits < 16 || o->dt.bits > 32 ||
        (o->dt.code != TK_DL_FLOAT && o->dt.code != TK_DL_BFLOAT))
        return tk_cli_usage(RUN_USAGE,
                            "--dtype wants f32, f16 or bf16 (or float32, float16, fp16, half, bfloat16), "
                            "got '%s'",
                            o->dtype_s);
    o->dtype_s = tk_dtype_name(o->dt);
    if (o->shape_s && tk_cli_dims_parse(o->shape_s, o->shape, &o->nd) != 0)
        return tk_cli_usage(RUN_USAGE, "--shape wants sizes separated by commas (4,4096), got '%s'", o->shape_s);
    for (int i = 0; i < o->nnamed; i++) {
        size_t len = strcspn(o->named_shapes[i], "=");
        snprintf(o->named[i].name, sizeof o->named[i].name, "%.*s", (int)len, o->named_shapes[i]);
        if (tk_cli_dims_parse(o->named_shapes[i] + len + 1, o->named[i].shape, &o->named[i].nd) != 0)
            return tk_cli_usage(RUN_USAGE, "--shape %s: want NAME=sizes separated by commas", o->named_shapes[i]);
    }
    return 0;
}

/* 1. The command line into *o. 0, or the exit code of a usage error (-1: --help was printed). */
static int run_parse(run_opts *o, int argc, char **argv)
{
    memset(o, 0, sizeof *o);
    o->device = -1;
    o->dtype_s = "f32";
    o->repeat = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (tk_cli_is_help(a))
            return run_help(), -1;
        if (!strcmp(a, "--check")) {
            o->check = 1;
            continue;
        }
        if (strcmp(a, "--shape") && strcmp(a, "--dtype") && strcmp(a, "--seed") && strcmp(a, "--repeat") &&
            strcmp(a, "--arg") && strcmp(a, "--package") && strcmp(a, "--device")) {
            if (a[0] == '-')
                return tk_cli_unknown_option(RUN_USAGE, a);
            if (o->opname)
                return tk_cli_usage(RUN_USAGE, "unexpected argument '%s'", a);
            o->opname = a;
            continue;
        }
        if (!val)
            return tk_cli_usage(RUN_USAGE, "%s needs a value", a);
        i++;
        if (!strcmp(a, "--package")) {
            o->package = val;
        } else if (!strcmp(a, "--device")) {
            if (tk_cli_parse_device(val, &o->device))
                return tk_cli_usage(RUN_USAGE, "--device wants cpu, cuda or cuda:N, got '%s'", val);
        } else if (!strcmp(a, "--shape") && strchr(val, '=')) {
            if (o->nnamed >= MAX_T)
                return tk_cli_usage(RUN_USAGE, "too many --shape NAME=... options");
            o->named_shapes[o->nnamed++] = val;
        } else if (!strcmp(a, "--shape")) {
            o->shape_s = val;
        } else if (!strcmp(a, "--dtype") && strchr(val, '=')) {
            if (o->nndt >= MAX_T)
                return tk_cli_usage(RUN_USAGE, "too many --dtype NAME=... options");
            o->named_dtypes[o->nndt++] = val;
        } else if (!strcmp(a, "--dtype")) {
            o->dtype_s = val;
        } else if (!strcmp(a, "--arg")) {
            if (o->nscalar >= MAX_T || !strchr(val, '='))
                return tk_cli_usage(RUN_USAGE, "--arg wants NAME=VALUE, got '%s'", val);
            o->scalar_args[o->nscalar++] = val;
        } else {
            char *end;
            unsigned long long v = strtoull(val, &end, 10);
            if (*end || end == val || val[0] == '-' || (!strcmp(a, "--repeat") && (v < 1 || v > 1000000)))
                return tk_cli_usage(RUN_USAGE, "%s wants a %s, got '%s'", a,
                                    !strcmp(a, "--seed") ? "non-negative integer" : "count from 1 to 1000000", val);
            if (!strcmp(a, "--seed"))
                o->seed = v;
            else
                o->repeat = (long long)v;
        }
    }
    return run_parse_values(o);
}

/* 2. The op's description from tk_ops_json (with --package's declarations and kernels added first).
 * *op NULL and the exit code in *code after printing the error. */
static json_t *run_resolve(tk_cli *cli, const run_opts *o, const json_t **op, int *code)
{
    *op = NULL;
    tk_ctx *ctx = tk_cli_ctx(cli);
    int rc;
    if (!ctx) {
        *code = cli->ctx_exit ? cli->ctx_exit : TK_EXIT_FAIL;
        return NULL;
    }
    if (o->package && (rc = tk_ops_add_package(ctx, o->package)) != TK_OK) {
        *code = tk_cli_fail(cli, rc, "--package");
        return NULL;
    }
    json_t *ops = load_ops(cli, code);
    if (!ops)
        return NULL;
    *op = find_op(ops, o->opname);
    if (!*op) { /* the library's message has the "did you mean" hint */
        *code = tk_cli_fail(cli, tk_op_run(ctx, o->opname, NULL, 0, NULL, NULL), NULL);
    } else if (!json_object_get(*op, "params")) {
        *code = run_fail(TK_ERR_UNSUPPORTED,
                         "%s is the op of a package's kernels, but no package declares its "
                         "signature: there is nothing to build inputs from\nHINT: call its kernel with 'tk run', or "
                         "declare the op in the package's kernel.json \"ops\" (docs/package-format.md)",
                         o->opname);
        *op = NULL;
    }
    return ops;
}

static const json_t *param_named(const json_t *params, const char *name, int tensor)
{
    for (size_t j = 0; j < json_array_size(params); j++) {
        const json_t *p = json_array_get(params, j);
        if (!strcmp(json_string_value(json_object_get(p, "name")), name) &&
            (!tensor || !strcmp(json_string_value(json_object_get(p, "kind")), "tensor")))
            return p;
    }
    return NULL;
}

/* 3. Binds the symbols of the named tensors' patterns, then of the first input's pattern to the plain
 * --shape. 0, or the exit code after printing why. */
static int run_bind(run_call *rc, const run_opts *o, const json_t *params)
{
    char err[512];
    const char *opname = o->opname;
    /* When every tensor the call needs has its shape given, nothing is derived: the op's own check
     * judges the shapes (a pattern holds only one layout: linear's weight is [N, K], or [K, N] with
     * transposed=1). */
    int all_named = !o->shape_s;
    for (size_t j = 0; all_named && j < json_array_size(params); j++) {
        const json_t *p = json_array_get(params, j), *opt = json_object_get(p, "optional");
        int given = 0;
        for (int i = 0; i < o->nnamed; i++)
            given |= !strcmp(o->named[i].name, json_string_value(json_object_get(p, "name")));
        all_named =
            given || strcmp(json_string_value(json_object_get(p, "kind")), "tensor") != 0 || (json_is_true(opt));
    }
    for (int i = 0; i < o->nnamed && !all_named; i++) {
        const json_t *p = param_named(params, o->named[i].name, 1);
        if (!p)
            return run_fail(TK_CLI_STATUS_USAGE, "%s has no tensor '%s' (see 'tk ops %s')", opname, o->named[i].name,
                            opname);
        const char *shape = json_string_value(json_object_get(p, "shape"));
        int tmp_np;
        dim_pat tmp[MAX_D];
        if (tk_cli_pattern_parse(shape, tmp, &tmp_np) != 0 || strchr(shape ? shape : "", '|'))
            continue; /* alternatives ("[N] | [1]") or sums ("[R+P]"): the shape is used as given, binds nothing */
        if (bind_more(opname, o->named[i].name, shape, o->named[i].shape, o->named[i].nd, rc->b, &rc->nb, rc->lead,
                      &rc->nlead, err, sizeof err) != 0)
            return run_fail(TK_CLI_STATUS_USAGE, "%s", err);
    }
    if (!o->shape_s)
        return 0;
    /* the plain --shape is the first input tensor's; in-place ops have their data tensors as outputs,
     * so when the first input has another rank, the first tensor (of any role) of that rank */
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < json_array_size(params); i++) {
            const json_t *p = json_array_get(params, i);
            int nb2 = rc->nb, nl2 = rc->nlead;
            if (strcmp(json_string_value(json_object_get(p, "kind")), "tensor") != 0 ||
                (pass == 0 && strcmp(json_string_value(json_object_get(p, "role")), "in") != 0))
                continue;
            int brc = bind_more(opname, json_string_value(json_object_get(p, "name")),
                                json_string_value(json_object_get(p, "shape")), o->shape, o->nd, rc->b, &nb2, rc->lead,
                                &nl2, err, sizeof err);
            if (brc == -2) /* the right rank, but the sizes do not fit: say why */
                return run_fail(TK_CLI_STATUS_USAGE, "%s", err);
            if (brc == 0) {
                rc->nb = nb2;
                rc->nlead = nl2;
                return 0;
            }
            if (pass == 0)
                break; /* pass 0 tries the first input only */
        }
    return run_fail(TK_CLI_STATUS_USAGE,
                    "%s: no tensor of the signature has the shape --shape %s (see 'tk ops %s'); "
                    "use --shape NAME=...",
                    opname, o->shape_s, opname);
}

/* The value of --arg NAME=V for name, or NULL. */
static const char *scalar_arg(const run_opts *o, const char *name)
{
    const char *v = NULL;
    for (int s = 0; s < o->nscalar; s++) {
        size_t len = strcspn(o->scalar_args[s], "=");
        if (len == strlen(name) && !strncmp(o->scalar_args[s], name, len))
            v = o->scalar_args[s] + len + 1;
    }
    return v;
}

/* Random contents: floats uniform in [-3, 3] (or fval for an input when it is not NaN), integer inputs
 * ival or 0, 1, 2, ... (outputs 0), 8-bit integers random codes, fp8 random finite codes of magnitude
 * <= 2. One draw per element either way, so the other tensors' contents do not depend on it. */
static void fill(host_tensor *h, size_t n, tk_dtype tdt, int64_t ival, double fval, uint64_t *rng)
{
    for (size_t k = 0; k < n; k++) {
        uint64_t r = splitmix(rng);
        /* outputs get random contents too: in-place ops (rotary, fused_add_*) read them */
        int given = !h->out && !isnan(fval);
        float v = given ? (float)fval : (float)((double)(r >> 11) * 0x1.0p-53 * 6.0 - 3.0);
        if (tdt.code == TK_DL_INT || tdt.code == TK_DL_UINT) {
            int64_t iv = h->out ? 0 : ival >= 0 ? ival : (int64_t)k;
            if (tdt.bits == 64)
                ((int64_t *)h->data)[k] = iv;
            else if (tdt.bits == 32)
                ((int32_t *)h->data)[k] = (int32_t)iv;
            else /* 8-bit integers are quantised weights: random codes */
                ((uint8_t *)h->data)[k] = h->out ? 0 : (uint8_t)(tdt.code == TK_DL_INT ? (r % 255) - 127 : r % 256);
        } else if (tdt.bits == 8) {
            ((uint8_t *)h->data)[k] = (uint8_t)((r & 0x80) | (r % 0x40));
        } else if (tdt.bits == 64) {
            ((double *)h->data)[k] = given ? fval : v;
        } else if (tdt.bits == 32) {
            ((float *)h->data)[k] = v;
        } else {
            tk_convert((uint16_t *)h->data + k, tdt, &v, (tk_dtype){TK_DL_FLOAT, 32, 1}, 1);
        }
    }
}

/* One tensor parameter p: its shape (given, or derived from the bindings), its dtype and random
 * contents, appended to the call. 0, 1 when it is optional and left out, or the exit code. */
static int make_tensor(run_call *rc, const run_opts *o, const json_t *p, const json_t *params, uint64_t *rng)
{
    const char *opname = o->opname, *pname = json_string_value(json_object_get(p, "name"));
    host_tensor *h = &rc->ht[rc->nt];
    dim_pat pat[MAX_D];
    int np, given = -1;
    for (int g = 0; g < o->nnamed; g++)
        if (!strcmp(o->named[g].name, pname))
            given = g;
    const json_t *opt = json_object_get(p, "optional");
    if (given < 0 && json_is_true(opt))
        return 1; /* optional and not asked for */
    snprintf(h->name, sizeof h->name, "%s", pname);
    h->out = !strcmp(json_string_value(json_object_get(p, "role")), "out");
    if (given >= 0) {
        h->ndim = o->named[given].nd;
        memcpy(h->shape, o->named[given].shape, (size_t)h->ndim * sizeof *h->shape);
    } else if (tk_cli_pattern_parse(json_string_value(json_object_get(p, "shape")), pat, &np) != 0 ||
               tk_cli_pattern_make(pat, np, rc->b, rc->nb, rc->lead, rc->nlead, h->shape, &h->ndim) != 0) {
        return run_fail(TK_CLI_STATUS_USAGE, "%s: cannot derive the shape of '%s' %s; give it with --shape %s=...",
                        opname, pname, json_string_value(json_object_get(p, "shape")), pname);
    }
    tk_dtype tdt;
    const char *ndt = NULL;
    for (int g = 0; g < o->nndt; g++)
        if (strlen(pname) == strcspn(o->named_dtypes[g], "=") && !strncmp(o->named_dtypes[g], pname, strlen(pname)))
            ndt = o->named_dtypes[g] + strlen(pname) + 1;
    if (ndt && tk_dtype_parse(&tdt, ndt) != TK_OK)
        return run_fail(TK_CLI_STATUS_USAGE, "--dtype %s=%s: %s", pname, ndt, tk_last_error());
    if (!ndt && pick_dtype(&tdt, p, params, o->dt, o->dtype_s) != 0)
        return run_fail(TK_CLI_STATUS_USAGE, "%s: '%s' takes no dtype tk run-op can make", opname, pname);
    size_t n = 1;
    if (tk_cli_dims_count(&n, h->shape, h->ndim, (size_t)1 << 48) != 0) {
        char sbuf[256];
        shape_text(sbuf, sizeof sbuf, h->shape, h->ndim);
        return run_fail(TK_CLI_STATUS_USAGE,
                        "%s: '%s' %s has more than 2^48 elements\nHINT: give smaller sizes with "
                        "--shape",
                        opname, pname, sbuf);
    }
    h->bytes = n * tdt.bits / 8;
    if (!(h->data = malloc(h->bytes ? h->bytes : 1)))
        return run_fail(TK_ERR_NOMEM, "out of memory for '%s' (%zu bytes)", pname, h->bytes);
    /* inputs: --arg NAME=V fills V (a schedule table, a target id), else random floats or 0, 1, 2, ... */
    const char *iv = scalar_arg(o, pname);
    char *end = NULL;
    double fv = iv ? strtod(iv, &end) : NAN;
    if (iv && (end == iv || *end))
        return run_fail(TK_CLI_STATUS_USAGE, "--arg %s wants a number for tensor '%s', got '%s'", pname, pname, iv);
    fill(h, n, tdt, iv ? strtoll(iv, NULL, 10) : -1, fv, rng);
    h->t.data = h->data;
    h->t.device.device_type = TK_DEV_CPU;
    h->t.ndim = h->ndim;
    h->t.dtype = tdt;
    h->t.shape = h->shape;
    rc->args[rc->nargs++] = (tk_arg){TK_ARG_TENSOR, h->name, &h->t, 0, 0};
    rc->nt++;
    return 0;
}

/* 4. Every tensor and scalar argument of the call. 0, or the exit code after printing why. */
static int run_make_args(run_call *rc, const run_opts *o, const json_t *params)
{
    uint64_t rng = o->seed;
    for (size_t i = 0; i < json_array_size(params); i++) {
        const json_t *p = json_array_get(params, i);
        const char *pname = json_string_value(json_object_get(p, "name")),
                   *kind = json_string_value(json_object_get(p, "kind"));
        if (!strcmp(kind, "tensor")) {
            int r = make_tensor(rc, o, p, params, &rng);
            if (r > 1 || r < 0)
                return r;
            continue;
        }
        const char *v = scalar_arg(o, pname);
        if (!v)
            continue;
        char *end;
        tk_arg *a = &rc->args[rc->nargs];
        *a = (tk_arg){!strcmp(kind, "i64") ? TK_ARG_I64 : TK_ARG_F64, pname, NULL, 0, 0};
        if (a->kind == TK_ARG_I64)
            a->i = strtoll(v, &end, 10);
        else
            a->f = strtod(v, &end);
        if (end == v || *end)
            return run_fail(TK_CLI_STATUS_USAGE, "--arg %s wants %s, got '%s'", pname,
                            a->kind == TK_ARG_I64 ? "an integer" : "a number", v);
        rc->nargs++;
    }
    for (int s = 0; s < o->nscalar; s++) {
        size_t len = strcspn(o->scalar_args[s], "="), known = 0;
        for (size_t i = 0; i < json_array_size(params); i++) {
            const char *pname = json_string_value(json_object_get(json_array_get(params, i), "name"));
            known |= strlen(pname) == len && !strncmp(pname, o->scalar_args[s], len);
        }
        if (!known)
            return run_fail(TK_CLI_STATUS_USAGE, "%s has no parameter '%.*s' (see 'tk ops %s')", o->opname, (int)len,
                            o->scalar_args[s], o->opname);
    }
    return 0;
}

/* --device cuda: a device copy of every tensor, which the call's arguments then point at. */
static int run_has_device(tk_cli *cli, int device)
{
    int n = 0, st = tk_device_count(&n);
    if (st != TK_OK)
        return tk_cli_fail(cli, st, "--device");
    if (device >= n)
        return run_fail(TK_ERR_NO_DEVICE, "no CUDA device %d (this machine has %d)", device, n);
    return 0;
}

static int run_to_device(tk_cli *cli, run_call *rc, int device)
{
    int st;
    for (size_t i = 0; i < rc->nt; i++) {
        host_tensor *h = &rc->ht[i];
        if (h->bytes && ((st = tk_device_alloc(&h->dptr, device, h->bytes)) != TK_OK ||
                         (st = tk_device_copy(h->dptr, h->data, h->bytes, TK_COPY_H2D, device)) != TK_OK))
            return tk_cli_fail(cli, st, h->name);
        h->t.data = h->dptr;
        h->t.device.device_type = TK_DEV_CUDA;
        h->t.device.device_id = device;
    }
    return 0;
}

/* The device's results back into the host buffers (for checksums and --check). */
static int run_from_device(tk_cli *cli, run_call *rc, int device)
{
    int st = tk_device_sync(device);
    for (size_t i = 0; st == TK_OK && i < rc->nt; i++)
        if (rc->ht[i].dptr)
            st = tk_device_copy(rc->ht[i].data, rc->ht[i].dptr, rc->ht[i].bytes, TK_COPY_D2H, device);
    return st == TK_OK ? 0 : tk_cli_fail(cli, st, "--device");
}

/* --check, before the device run: the CPU reference on the host tensors, its results kept in ->ref
 * and the inputs restored. *avail 0 (with a note) when the op has no CPU reference. */
static int run_reference(tk_cli *cli, const run_opts *o, run_call *rc, int *avail)
{
    const char *impl = NULL;
    *avail = 0;
    for (size_t i = 0; i < rc->nt; i++) {
        host_tensor *h = &rc->ht[i];
        if (!(h->ref = malloc(h->bytes ? h->bytes : 1)))
            return run_fail(TK_ERR_NOMEM, "out of memory");
        memcpy(h->ref, h->data, h->bytes);
    }
    int st = tk_op_run(tk_cli_ctx(cli), o->opname, rc->args, rc->nargs, NULL, &impl);
    if (st == TK_ERR_UNSUPPORTED) {
        fprintf(stderr, "tk: --check unavailable: %s\n", tk_last_error());
        return 0;
    }
    if (st != TK_OK)
        return tk_cli_fail(cli, st, "the CPU reference");
    for (size_t i = 0; i < rc->nt; i++) { /* swap: ->ref gets the reference, ->data the inputs again */
        void *t = rc->ht[i].ref;
        rc->ht[i].ref = rc->ht[i].data;
        rc->ht[i].data = t;
    }
    *avail = 1;
    return 0;
}

/* --check, after the first device run: each output against the reference, |got-ref| <= atol +
 * rtol*|ref| with the op tests' tolerances per dtype. 1 when one is outside. */
static int run_compare(run_call *rc)
{
    int bad = 0;
    for (size_t i = 0; i < rc->nt; i++) {
        host_tensor *h = &rc->ht[i];
        if (!h->out)
            continue;
        host_tensor r = *h;
        r.data = h->ref;
        double tol = h->t.dtype.bits == 16  ? (h->t.dtype.code == TK_DL_BFLOAT ? 1.6e-2 : 2e-3)
                     : h->t.dtype.bits == 8 ? 1.25e-1
                                            : 1e-4,
               worst = 0;
        size_t n = h->bytes / (h->t.dtype.bits / 8), at = 0, nbad = 0;
        for (size_t k = 0; k < n; k++) {
            double g = elem(h, k), f = elem(&r, k), d = fabs(g - f);
            if (!(d <= tol + tol * fabs(f)) && !(isnan(g) && isnan(f)))
                nbad++;
            if (d > worst || (isnan(d) && !isnan(worst))) {
                worst = d;
                at = k;
            }
        }
        bad |= nbad > 0;
        h->checked = 1;
        h->nbad = nbad;
        h->at = at;
        h->worst = worst;
        h->tol = tol;
    }
    return bad;
}

/* 5. Runs the op --repeat times through tk_op_run (on the device with --device, compared with the
 * CPU reference after the first run with --check). 0, or the exit code after printing why. */
static int run_exec(tk_cli *cli, const run_opts *o, const json_t *op, run_call *rc, const char **impl, double *best,
                    double *total, int *checked)
{
    int code, avail = 0;
    *best = 1e300;
    *total = 0;
    *checked = -1;
    if (o->device >= 0 && (code = run_has_device(cli, o->device)) != 0)
        return code;
    if (o->check && (code = run_reference(cli, o, rc, &avail)) != 0)
        return code;
    if (o->device >= 0 && (code = run_to_device(cli, rc, o->device)) != 0)
        return code;
    for (long long r = 0; r < o->repeat; r++) {
        double t0 = now_ms();
        int st = tk_op_run(tk_cli_ctx(cli), o->opname, rc->args, rc->nargs, NULL, impl);
        if (st == TK_OK && o->device >= 0)
            st = tk_device_sync(o->device);
        double dt_ms = now_ms() - t0;
        if (st == TK_ERR_UNSUPPORTED && o->device < 0 && json_object_get(op, "declared_by"))
            /* the shapes were checked: say what cannot run here */
            return run_fail(st,
                            "no CPU reference for op %s (declared by %s): the shapes check out, but nothing "
                            "ran on the host\nHINT: run its kernels on a GPU with --device cuda (tk_op_run in C, "
                            "tk.ops on CUDA tensors in Python)",
                            o->opname, json_string_value(json_object_get(op, "declared_by")));
        if (st != TK_OK)
            return tk_cli_fail(cli, st, NULL);
        if (r == 0 && avail) {
            if ((code = run_from_device(cli, rc, o->device)) != 0)
                return code;
            *checked = run_compare(rc);
        }
        *total += dt_ms;
        if (dt_ms < *best)
            *best = dt_ms;
    }
    return o->device >= 0 ? run_from_device(cli, rc, o->device) : 0;
}

/* 6. What ran, the time, and each tensor's sum and FNV-1a hash. */
static void run_report(tk_cli *cli, const run_opts *o, const run_call *rc, const char *impl, double best, double total,
                       int checked)
{
    char buf[256];
    if (cli->json) {
        printf("{\"op\": ");
        tk_cli_json_str(stdout, o->opname);
        printf(", \"impl\": ");
        tk_cli_json_str(stdout, impl ? impl : "");
        printf(", \"dtype\": \"%s\", \"seed\": %llu, \"repeat\": %lld, \"ms_best\": %.6f, \"ms_mean\": %.6f, ",
               o->dtype_s, (unsigned long long)o->seed, o->repeat, best, total / (double)o->repeat);
        if (o->device >= 0)
            printf("\"device\": \"cuda:%d\", ", o->device);
        if (o->check)
            printf("\"check\": \"%s\", ", checked < 0 ? "unavailable" : checked ? "failed" : "ok");
        printf("\"tensors\": [");
    } else {
        printf("%s %s: %s, %.3f ms%s", o->opname, o->dtype_s, impl ? impl : "?", best, o->repeat > 1 ? " (best)" : "");
        if (o->repeat > 1)
            printf(", %.3f ms mean of %lld", total / (double)o->repeat, o->repeat);
        printf(", seed %llu\n", (unsigned long long)o->seed);
    }
    for (size_t i = 0; i < rc->nt; i++) {
        const host_tensor *h = &rc->ht[i];
        size_t n = h->bytes / (h->t.dtype.bits / 8);
        double sum = 0;
        uint64_t fnv = 0xcbf29ce484222325ull;
        for (size_t k = 0; k < n; k++)
            sum += elem(h, k);
        for (size_t k = 0; k < h->bytes; k++)
            fnv = (fnv ^ ((const uint8_t *)h->data)[k]) * 0x100000001b3ull;
        shape_text(buf, sizeof buf, h->shape, h->ndim);
        if (cli->json) {
            printf("%s{\"name\": \"%s\", \"role\": \"%s\", \"shape\": %s, \"sum\": %.17g, \"fnv1a64\": "
                   "\"%016llx\"",
                   i ? ", " : "", h->name, h->out ? "out" : "in", buf, isfinite(sum) ? sum : 0.0,
                   (unsigned long long)fnv);
            if (h->checked)
                printf(", \"max_abs_diff\": %.6g, \"mismatches\": %zu", isfinite(h->worst) ? h->worst : -1.0, h->nbad);
            printf("}");
        } else {
            printf("  %-3s %-10s %-20s sum %-22.10g fnv1a64 %016llx\n", h->out ? "out" : "in", h->name, buf, sum,
                   (unsigned long long)fnv);
        }
    }
    for (size_t i = 0; !cli->json && i < rc->nt; i++) {
        const host_tensor *h = &rc->ht[i];
        if (h->checked)
            printf("  check %-10s vs cpu-reference: max |diff| %.3g at element %zu, %zu outside atol = rtol = %g: "
                   "%s\n",
                   h->name, h->worst, h->at, h->nbad, h->tol, h->nbad ? "FAILED" : "ok");
    }
    if (cli->json)
        printf("]}\n");
}

int tk_cmd_run_op(tk_cli *cli, int argc, char **argv)
{
    run_opts o;
    int code = run_parse(&o, argc, argv);
    if (code)
        return code < 0 ? TK_EXIT_OK : code;
    const json_t *op = NULL;
    json_t *ops = run_resolve(cli, &o, &op, &code);
    if (!op) {
        json_decref(ops);
        return code;
    }
    run_call *rc = calloc(1, sizeof *rc);
    const char *impl = NULL;
    double best = 0, total = 0;
    int checked = -1;
    const json_t *params = json_object_get(op, "params");
    if (!rc)
        code = run_fail(TK_ERR_NOMEM, "out of memory");
    else if (!(code = run_bind(rc, &o, params)) && !(code = run_make_args(rc, &o, params)) &&
             !(code = run_exec(cli, &o, op, rc, &impl, &best, &total, &checked))) {
        run_report(cli, &o, rc, impl, best, total, checked);
        if (checked > 0) /* the outputs differ from the CPU reference */
            code = TK_EXIT_FAIL;
    }
    for (size_t i = 0; rc && i < MAX_T; i++) {
        free(rc->ht[i].data);
        free(rc->ht[i].ref);
        if (rc->ht[i].dptr)
            tk_device_free(rc->ht[i].dptr, o.device);
    }
    free(rc);
    json_decref(ops);
    return code;
}
