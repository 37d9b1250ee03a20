/*
 * cmd_selftest.c — tk selftest: prove packages' kernels on this GPU against the CPU references, record
 * the results with the binaries, and show or forget what is recorded (docs/selftest.md).
 *
 * The library bounds each launch (a deadline; then the kernel is recorded as timed out, its context
 * abandoned and CUDA marked lost in this process, as after a fault); the command then ends with _exit,
 * past the driver's teardown, which could wait for the launch for ever. A watchdog remains for what
 * the library cannot bound: when the self-test reports no progress for its limit, the command says
 * which kernel hung and exits; the kernel's "running" record stays, so routing avoids it from then on.
 */
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"

static const char *USAGE =
    "tk selftest [PKG|DIR...] [--op OP] [--kernel NAME] [--device cuda:N] [--timeout S] [--json]\n"
    "       tk selftest --plan [PKG|DIR...] [--arch sm_XY] [--op OP] [--kernel NAME] [--json]\n"
    "       tk selftest --results [PKG...] [--device cuda:N] [--json]\n"
    "       tk selftest --records [ORG/NAME] [--json]\n"
    "       tk selftest --forget [PKG|DIR...]";

static const char *HELP =
    "NAME\n"
    "    tk selftest - prove kernels on this GPU against tk's CPU references, and record the result\n"
    "\n"
    "SYNOPSIS\n"
    "    tk selftest [PKG|DIR...] [--op OP] [--kernel NAME] [--device cuda:N] [--timeout S] [--json]\n"
    "    tk selftest --plan [PKG|DIR...] [--arch sm_XY] [--op OP] [--kernel NAME] [--json]\n"
    "    tk selftest --results [PKG...] [--device cuda:N] [--json]\n"
    "    tk selftest --records [ORG/NAME] [--json]\n"
    "    tk selftest --forget [PKG|DIR...]\n"
    "\n"
    "DESCRIPTION\n"
    "    Runs every kernel of each package (every installed package when none is named) that fits\n"
    "    the GPU on small cases of its op: edge shapes (one row, a length that is no multiple of a\n"
    "    block, the largest head size the kernel declares), each option it takes, every dtype it\n"
    "    declares. Each output is compared with the op's CPU reference with the per-dtype\n"
    "    tolerances of tk's GPU tests; outputs start as NaN, so an element a kernel never writes\n"
    "    fails. A kernel ends as passed, FAILED (the worst element, expected and got), CRASHED (a\n"
    "    device fault), TIMED_OUT (a launch past --timeout), untested (no CPU reference or no case\n"
    "    fits) or skipped (not for this GPU's arch). It costs about a second per package after the\n"
    "    kernels are compiled (a compile, on first use, comes first).\n"
    "\n"
    "    A fault ends CUDA for the whole process (NVIDIA's rule for sticky errors), and a launch\n"
    "    that never ends runs until the process exits: after either, the result is recorded, the\n"
    "    kernels after it are reported untested (\"cuda_lost\" in the report) and the command exits.\n"
    "    Run it again to test those: a kernel recorded as crashed or timed out on this GPU is not\n"
    "    run again (--forget, then a new run, tests it again).\n"
    "\n"
    "    Results are recorded in cache.db with the compiled binary's key, the GPU's UUID, the\n"
    "    driver version and tk's version: a new build, GPU, driver or tk counts as never tested.\n"
    "    tk_op_run (tk run-op, the models, the Python package) never uses a kernel whose recorded\n"
    "    self-test failed on this GPU; it takes the next kernel that fits, with a warning.\n"
    "    config.json \"selftest\": \"off\" ignores the records, \"record\" (the default) avoids failed\n"
    "    kernels, \"required\" uses only kernels that passed here (the first use runs the test);\n"
    "    \"cpu_fallback\": true runs the CPU reference when no kernel is left.\n"
    "\n"
    "    A package directory (./DIR) is tested as it is (unsigned, not installed; recorded as\n"
    "    ORG/NAME@local), and 'tk run-op --package DIR' then routes around its failed kernels.\n"
    "\n"
    "OPTIONS\n"
    "    --op OP          only the kernels of this op\n"
    "    --kernel NAME    only this kernel (its name in kernel.json)\n"
    "    --device cuda:N  the GPU (default cuda:0)\n"
    "    --timeout S      the limit of one launch in seconds (default 5)\n"
    "    --plan           no GPU needed: list the cases each kernel that fits --arch would run and\n"
    "                     run their CPU references (timed); nothing is recorded\n"
    "    --arch sm_XY     with --plan: the arch to plan for (default: the GPU's, else sm_90)\n"
    "    --results        show what is recorded for the installed packages on this GPU (passed,\n"
    "                     failed, never tested), running nothing\n"
    "    --records        every recorded result for any GPU (no GPU needed)\n"
    "    --forget         delete the recorded results (of the packages named, else all)\n"
    "    --json           the report as JSON (docs/json.md)\n"
    "\n"
    "EXIT STATUS\n"
    "    0 every kernel tested passed (or untested); 2 usage; 3 package not found; 7 no GPU, a\n"
    "    compile or a driver error; 10 a kernel failed, crashed or timed out.\n"
    "\n"
    "EXAMPLES\n"
    "    tk selftest kernels-community/activation\n"
    "    tk selftest                         # every installed package\n"
    "    tk selftest ./my-kernel --op rms_norm --json\n"
    "    tk selftest --results\n";

/* ---- the watchdog -------------------------------------------------------------------------------- */

static _Atomic double last_progress;  /* monotonic seconds of the last report; 0: not testing yet */
static char current[256];             /* the kernel under test (written by the main thread) */
static pthread_mutex_t cur_mu = PTHREAD_MUTEX_INITIALIZER;
static double watchdog_limit;
static int watchdog_json;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void on_progress(void *user, const char *what, int64_t done, int64_t total)
{
    (void)user;
    (void)done;
    (void)total;
    if (!strncmp(what, "selftest ", 9)) {
        pthread_mutex_lock(&cur_mu);
        snprintf(current, sizeof current, "%s", what + 9);
        pthread_mutex_unlock(&cur_mu);
        atomic_store(&last_progress, now_s());
    } else if (!strcmp(what, "selftest")) {
        atomic_store(&last_progress, 0.0); /* the package is done: compiles of the next are not timed */
    }
}

static void *watchdog(void *arg)
{
    (void)arg;
    for (;;) {
        struct timespec ts = {0, 250000000};
        nanosleep(&ts, NULL);
        double t = atomic_load(&last_progress);
        if (t > 0 && now_s() - t > watchdog_limit) {
            char k[256];
            pthread_mutex_lock(&cur_mu);
            snprintf(k, sizeof k, "%s", current);
            pthread_mutex_unlock(&cur_mu);
            char msg[1024];
            snprintf(msg, sizeof msg,
                     "the self-test of %s has not returned for %.0f s: a launch did not end and its CUDA context "
                     "could not be torn down; exiting (the GPU is freed with the process)\nHINT: the kernel is "
                     "recorded as interrupted and tk_op_run avoids it; 'tk selftest --forget' clears that",
                     k, watchdog_limit);
            if (watchdog_json) {
                tk_cli_json_error(TK_ERR_SELFTEST, NULL, msg);
            } else {
                fprintf(stderr, "\ntk: %s\n", msg);
            }
            fflush(NULL);
            _exit(TK_EXIT_SELFTEST);
        }
    }
    return NULL;
}

/* ---- printing ------------------------------------------------------------------------------------- */

static const char *upper_status(const char *s)
{
    if (!strcmp(s, "failed"))
        return "FAILED";
    if (!strcmp(s, "crashed"))
        return "CRASHED";
    if (!strcmp(s, "timed_out"))
        return "TIMED_OUT";
    if (!strcmp(s, "interrupted"))
        return "INTERRUPTED";
    return s;
}

static void print_report(tk_cli *cli, const char *report, int verbose)
{
    json_t *r = json_loads(report, 0, NULL), *dev = json_object_get(r, "device"), *k;
    size_t i, w = 6;
    const char *commit = json_string_value(json_object_get(r, "commit"));
    printf("%s %s%s%.12s on %s (cuda:%lld, %s, driver %s)\n", json_string_value(json_object_get(r, "package")),
           json_string_value(json_object_get(r, "version")), commit ? " commit " : " (local)", commit ? commit : "",
           json_string_value(json_object_get(dev, "name")),
           (long long)json_integer_value(json_object_get(dev, "ordinal")),
           json_string_value(json_object_get(dev, "arch")), json_string_value(json_object_get(dev, "driver")));
    json_array_foreach(json_object_get(r, "kernels"), i, k) {
        size_t n = strlen(json_string_value(json_object_get(k, "kernel")));
        w = n > w ? n : w;
    }
    json_array_foreach(json_object_get(r, "kernels"), i, k) {
        const char *st = json_string_value(json_object_get(k, "status"));
        int bad = strcmp(st, "passed") && strcmp(st, "untested") && strcmp(st, "skipped");
        if (!bad && !verbose && !strcmp(st, "skipped"))
            continue;
        const char *sum = json_string_value(json_object_get(json_object_get(k, "detail"), "summary"));
        printf("  %-11s %-*s  %s\n", upper_status(st), (int)w, json_string_value(json_object_get(k, "kernel")),
               sum ? sum : "");
    }
    json_t *c = json_object_get(r, "counts");
    printf("  %zu kernel%s: %lld passed", json_array_size(json_object_get(r, "kernels")),
           json_array_size(json_object_get(r, "kernels")) == 1 ? "" : "s",
           (long long)json_integer_value(json_object_get(c, "passed")));
    static const char *keys[] = {"failed", "crashed", "timed_out", "untested", "skipped"};
    for (size_t j = 0; j < 5; j++)
        if (json_integer_value(json_object_get(c, keys[j])))
            printf(", %lld %s", (long long)json_integer_value(json_object_get(c, keys[j])), keys[j]);
    printf(" (%.2f s, of which loading %.2f s", json_real_value(json_object_get(r, "seconds")),
           json_real_value(json_object_get(r, "load_seconds")));
    printf(")\n");
    if (json_string_value(json_object_get(r, "cuda_lost")))
        printf("  CUDA is unusable in this process after %s: the kernels after it were not tested\n"
               "  HINT: run 'tk selftest' again: a kernel recorded as crashed or timed out is not run again\n",
               json_string_value(json_object_get(r, "cuda_lost")));
    (void)cli;
    json_decref(r);
}

/* "passed 30, failed 1, never tested 2" of a package standing (tk_selftest_results_json). */
static void print_standing(const json_t *p)
{
    printf("  %-36s %s  passed %lld, failed %lld, untested %lld, never tested %lld\n",
           json_string_value(json_object_get(p, "package")), json_string_value(json_object_get(p, "version")),
           (long long)json_integer_value(json_object_get(p, "passed")),
           (long long)json_integer_value(json_object_get(p, "failed")),
           (long long)json_integer_value(json_object_get(p, "untested")),
           (long long)json_integer_value(json_object_get(p, "never_tested")));
    size_t i;
    json_t *k;
    json_array_foreach(json_object_get(p, "kernels"), i, k) {
        const char *st = json_string_value(json_object_get(k, "status"));
        if (strcmp(st, "passed") && strcmp(st, "never_tested") && strcmp(st, "untested"))
            printf("      %-11s %s: %s\n", upper_status(st), json_string_value(json_object_get(k, "kernel")),
                   json_string_value(json_object_get(k, "summary")) ? json_string_value(json_object_get(k, "summary"))
                                                                    : "");
    }
}

static int do_results(tk_cli *cli, tk_ctx *ctx, char **refs, int nrefs, int device)
{
    json_t *all = json_array();
    int code = TK_EXIT_OK;
    for (int i = 0; i < (nrefs ? nrefs : 1); i++) {
        char *js = NULL;
        int rc = tk_selftest_results_json(&js, ctx, nrefs ? refs[i] : NULL, device);
        if (rc != TK_OK) {
            json_decref(all);
            return tk_cli_fail(cli, rc, nrefs ? refs[i] : NULL);
        }
        json_t *o = json_loads(js, 0, NULL);
        tk_free(js);
        if (!cli->json) {
            json_t *d = json_object_get(o, "device");
            if (i == 0)
                printf("self-tests on %s (cuda:%d, %s, driver %s), tk %s:\n",
                       json_string_value(json_object_get(d, "name")), device,
                       json_string_value(json_object_get(d, "arch")), json_string_value(json_object_get(d, "driver")),
                       tk_version_string());
            size_t j;
            json_t *p;
            json_array_foreach(json_object_get(o, "packages"), j, p)
                print_standing(p);
        }
        json_array_append_new(all, o);
    }
    if (cli->json) {
        /* one object: the device and every package */
        json_t *out = json_object(), *pk = json_array(), *o;
        size_t i;
        json_array_foreach(all, i, o) {
            if (!i)
                json_object_set(out, "device", json_object_get(o, "device"));
            json_array_extend(pk, json_object_get(o, "packages"));
        }
        json_object_set_new(out, "tk_version", json_string(tk_version_string()));
        json_object_set_new(out, "packages", pk);
        char *s = json_dumps(out, JSON_INDENT(2));
        printf("%s\n", s ? s : "{}");
        free(s);
        json_decref(out);
    }
    json_decref(all);
    return code;
}

static int do_records(tk_cli *cli, tk_ctx *ctx, const char *pkg)
{
    char *js = NULL;
    int rc = tk_selftest_records_json(&js, ctx, pkg);
    if (rc != TK_OK)
        return tk_cli_fail(cli, rc, NULL);
    if (cli->json) {
        printf("%s\n", js);
        tk_free(js);
        return TK_EXIT_OK;
    }
    json_t *arr = json_loads(js, 0, NULL), *r;
    tk_free(js);
    size_t i;
    if (!json_array_size(arr))
        printf("no self-test is recorded%s%s\n", pkg ? " for " : "", pkg ? pkg : "");
    json_array_foreach(arr, i, r) {
        char when[32];
        time_t t = (time_t)json_integer_value(json_object_get(r, "tested"));
        struct tm tm;
        strftime(when, sizeof when, "%Y-%m-%d %H:%M", localtime_r(&t, &tm));
        const char *commit = json_string_value(json_object_get(r, "commit"));
        const char *sum = json_string_value(json_object_get(json_object_get(r, "detail"), "summary"));
        printf("%-11s %s@%.12s:%s  %s  %s, driver %s, tk %s  binary %.12s\n%s%s%s",
               upper_status(json_string_value(json_object_get(r, "status"))),
               json_string_value(json_object_get(r, "package")), commit ? commit : "local",
               json_string_value(json_object_get(r, "kernel")), when, json_string_value(json_object_get(r, "gpu_name")),
               json_string_value(json_object_get(r, "driver")), json_string_value(json_object_get(r, "tk_version")),
               json_string_value(json_object_get(r, "binary_key")), sum ? "            " : "", sum ? sum : "",
               sum ? "\n" : "");
    }
    json_decref(arr);
    return TK_EXIT_OK;
}

/* --plan: what a run would test for arch, with the CPU references run; no GPU. */
static int do_plan(tk_cli *cli, tk_ctx *ctx, char **refs, int nrefs, const char *arch, const char *op,
                   const char *kernel)
{
    char archbuf[32] = "sm_90";
    int ndev = 0, code = TK_EXIT_OK, first = 1;
    tk_pkg_list *list = NULL;
    if (!arch) { /* the GPU's arch, else sm_90 */
        tk_device_info di;
        if (tk_device_count(&ndev) == TK_OK && ndev > 0 && tk_device_info_get(&di, 0) == TK_OK)
            snprintf(archbuf, sizeof archbuf, "sm_%d%d", di.cc_major, di.cc_minor);
        arch = archbuf;
    }
    if (!nrefs) {
        int rc = tk_pkg_list_installed(&list, ctx);
        if (rc != TK_OK)
            return tk_cli_fail(cli, rc, NULL);
        if (!tk_pkg_list_count(list)) {
            tk_pkg_list_free(list);
            return tk_cli_errorf(cli, TK_ERR_NOT_FOUND, 0,
                                 "no package is installed to plan for\nHINT: 'tk get ORG/NAME' "
                                 "first, or name a package directory: tk selftest --plan ./DIR");
        }
    }
    size_t n = nrefs ? (size_t)nrefs : tk_pkg_list_count(list);
    if (cli->json)
        printf("[");
    for (size_t i = 0; i < n; i++) {
        char ref[300], *report = NULL;
        if (nrefs)
            snprintf(ref, sizeof ref, "%s", refs[i]);
        else
            snprintf(ref, sizeof ref, "%s@%s", tk_pkg_name(tk_pkg_list_at(list, i)),
                     tk_pkg_commit(tk_pkg_list_at(list, i)));
        tk_selftest_opts o = TK_SELFTEST_OPTS_INIT;
        o.plan_only = 1;
        o.arch = arch;
        o.op = op;
        o.kernel = kernel;
        int rc = tk_selftest(&report, ctx, ref, &o);
        if (rc != TK_OK) {
            int c = tk_cli_fail(cli, rc, ref);
            code = code == TK_EXIT_OK ? c : code;
            continue;
        }
        if (cli->json) {
            printf("%s%s", first ? "" : ",\n", report);
            first = 0;
        } else {
            json_t *r = json_loads(report, 0, NULL), *k;
            size_t j, w = 6;
            json_array_foreach(json_object_get(r, "kernels"), j, k) {
                size_t l = strlen(json_string_value(json_object_get(k, "kernel")));
                w = l > w ? l : w;
            }
            printf("%s %s for %s:\n", json_string_value(json_object_get(r, "package")),
                   json_string_value(json_object_get(r, "version")), arch);
            json_array_foreach(json_object_get(r, "kernels"), j, k) {
                const char *st = json_string_value(json_object_get(k, "status"));
                if (!strcmp(st, "skipped") && !cli->verbose)
                    continue;
                printf("  %-9s %-*s  %s\n", st, (int)w, json_string_value(json_object_get(k, "kernel")),
                       json_string_value(json_object_get(json_object_get(k, "detail"), "summary")));
                json_t *labels = json_object_get(json_object_get(k, "detail"), "case_labels"), *lb;
                size_t q;
                if (cli->verbose)
                    json_array_foreach(labels, q, lb)
                        printf("              %s\n", json_string_value(lb));
            }
            json_t *c = json_object_get(r, "counts");
            printf("  %lld planned, %lld untested, %lld skipped (not for %s); CPU references %.3f s\n",
                   (long long)json_integer_value(json_object_get(c, "planned")),
                   (long long)json_integer_value(json_object_get(c, "untested")),
                   (long long)json_integer_value(json_object_get(c, "skipped")), arch,
                   json_real_value(json_object_get(r, "cpu_seconds")));
            json_decref(r);
        }
        tk_free(report);
    }
    if (cli->json)
        printf("]\n");
    tk_pkg_list_free(list);
    return code;
}

/* The command line of a self-test. */
typedef struct {
    const char *op, *kernel, *device_s, *arch;
    double timeout;
    int results, records, forget, device, plan, help, json;
    char **refs; /* the named packages (argv's), room for argc */
    int nrefs;
} sargs;

/* Parses argv into a; TK_EXIT_OK or the usage error's exit code (a->help: --help was printed). */
static int parse_args(sargs *a, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        const char *val = NULL;
        if (tk_cli_is_help(o)) {
            fputs(HELP, stdout);
            a->help = 1;
            return TK_EXIT_OK;
        }
        if (!strcmp(o, "--op") || !strcmp(o, "--kernel") || !strcmp(o, "--device") || !strcmp(o, "--timeout") ||
            !strcmp(o, "--arch")) {
            if (++i >= argc)
                return tk_cli_usage(USAGE, "%s needs a value", o);
            val = argv[i];
        }
        if (!strcmp(o, "--op")) {
            a->op = val;
        } else if (!strcmp(o, "--kernel")) {
            a->kernel = val;
        } else if (!strcmp(o, "--device")) {
            a->device_s = val;
            if (tk_cli_parse_device(val, &a->device) || a->device < 0)
                return tk_cli_usage(USAGE, "--device wants cuda or cuda:N (a self-test runs on a GPU), got '%s'", val);
        } else if (!strcmp(o, "--timeout")) {
            char *end;
            a->timeout = strtod(val, &end);
            if (*end || end == val || !(a->timeout > 0) || a->timeout > 3600)
                return tk_cli_usage(USAGE, "--timeout wants seconds from 0 to 3600, got '%s'", val);
        } else if (!strcmp(o, "--arch")) {
            a->arch = val;
        } else if (!strcmp(o, "--plan")) {
            a->plan = 1;
        } else if (!strcmp(o, "--results")) {
            a->results = 1;
        } else if (!strcmp(o, "--records")) {
            a->records = 1;
        } else if (!strcmp(o, "--forget")) {
            a->forget = 1;
        } else if (!strcmp(o, "--json")) {
            a->json = 1;
        } else if (o[0] == '-' && o[1]) {
            return tk_cli_usage(USAGE, "unknown option '%s'", o);
        } else {
            a->refs[a->nrefs++] = argv[i];
        }
    }
    if (a->results + a->records + a->forget + a->plan > 1)
        return tk_cli_usage(USAGE, "--plan, --results, --records and --forget go alone");
    if (a->arch && !a->plan)
        return tk_cli_usage(USAGE, "--arch goes with --plan (a run tests the GPU's own arch)");
    if (a->plan && (a->device_s || a->timeout > 0))
        return tk_cli_usage(USAGE, "--device and --timeout go with a run, not with --plan");
    if ((a->results || a->records || a->forget) && (a->op || a->kernel || a->timeout > 0))
        return tk_cli_usage(USAGE,
                            "--op, --kernel and --timeout go with a run, not with --results, --records or --forget");
    if (a->records && a->nrefs > 1)
        return tk_cli_usage(USAGE, "--records takes one ORG/NAME at most");
    if ((a->records || a->forget) && a->device_s)
        return tk_cli_usage(USAGE, "--device goes with a run or --results");
    return TK_EXIT_OK;
}

static int do_forget(tk_cli *cli, tk_ctx *ctx, char **refs, int nrefs)
{
    int64_t total = 0;
    for (int i = 0; i < (nrefs ? nrefs : 1); i++) {
        int64_t n = 0;
        int rc = tk_selftest_forget(ctx, nrefs ? refs[i] : NULL, &n);
        if (rc != TK_OK)
            return tk_cli_fail(cli, rc, nrefs ? refs[i] : NULL);
        total += n;
    }
    if (cli->json)
        printf("{\"forgotten\": %lld}\n", (long long)total);
    else
        printf("forgot %lld self-test record%s\n", (long long)total, total == 1 ? "" : "s");
    return TK_EXIT_OK;
}

/* The GPU a run or --results needs, said before anything else; TK_EXIT_OK when it is there. */
static int need_gpu(tk_cli *cli, int device)
{
    int ndev = 0, rc;
    if ((rc = tk_device_count(&ndev)) != TK_OK || ndev == 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", rc == TK_OK ? "the CUDA driver loaded but reports no GPU" : tk_last_error());
        why[strcspn(why, "\n")] = '\0';
        return tk_cli_errorf(
            cli, TK_ERR_NO_DEVICE, 0,
            "a self-test needs the GPU it proves kernels for: %s\nHINT: run it on the machine with the "
            "GPU (check 'nvidia-smi' and CUDA_VISIBLE_DEVICES; 'tk doctor' shows this one); without a "
            "GPU, 'tk build ORG/NAME --arch sm_90' still compiles ahead of time",
            why);
    }
    if (device >= ndev)
        return tk_cli_errorf(cli, TK_ERR_NO_DEVICE, 0,
                             "no CUDA device %d (this machine has %d)\nHINT: --device cuda:0 .. "
                             "cuda:%d",
                             device, ndev, ndev - 1);
    return TK_EXIT_OK;
}

/* Every installed package as "org/name@commit" into a->refs (*names owns the strings). */
static int add_installed(tk_cli *cli, tk_ctx *ctx, sargs *a, char ***names)
{
    tk_pkg_list *list = NULL;
    int rc = tk_pkg_list_installed(&list, ctx);
    if (rc != TK_OK)
        return tk_cli_fail(cli, rc, NULL);
    size_t n = tk_pkg_list_count(list);
    if (!n) {
        tk_pkg_list_free(list);
        return tk_cli_errorf(cli, TK_ERR_NOT_FOUND, 0,
                             "no package is installed to self-test\nHINT: 'tk get ORG/NAME' "
                             "first, or name a package directory: tk selftest ./DIR");
    }
    *names = calloc(n, sizeof **names);
    for (size_t i = 0; *names && i < n; i++) {
        const tk_pkg *p = tk_pkg_list_at(list, i);
        size_t len = strlen(tk_pkg_name(p)) + 48;
        if (((*names)[i] = malloc(len)))
            snprintf((*names)[i], len, "%s@%s", tk_pkg_name(p), tk_pkg_commit(p));
        a->refs[a->nrefs++] = (*names)[i];
    }
    tk_pkg_list_free(list);
    return TK_EXIT_OK;
}

/* The self-test of each of a->refs on the GPU, its report printed; the exit code. */
static int do_run(tk_cli *cli, tk_ctx *ctx, const sargs *a)
{
    /* the watchdog: the limit of every case of one kernel, and a margin for the context teardown */
    tk_cli_progress_hook = on_progress;
    watchdog_json = cli->json;
    watchdog_limit = 2.0 * (a->timeout > 0 ? a->timeout : 5.0) + 60.0;
    pthread_t wd;
    if (pthread_create(&wd, NULL, watchdog, NULL) == 0)
        pthread_detach(wd);

    tk_selftest_opts o = TK_SELFTEST_OPTS_INIT;
    o.device = a->device;
    o.op = a->op;
    o.kernel = a->kernel;
    o.launch_timeout_s = a->timeout;
    int failed = 0, first = 1, lost = 0, code = TK_EXIT_OK, rc;
    if (cli->json)
        printf("[");
    for (int i = 0; i < a->nrefs; i++) {
        char *report = NULL;
        if (!a->refs[i])
            continue;
        rc = tk_selftest(&report, ctx, a->refs[i], &o);
        atomic_store(&last_progress, 0.0);
        if (!report) {
            /* no report: the package could not be loaded (not found, compile error, no device) */
            if (cli->json) {
                printf("%s{\"ref\": ", first ? "" : ",\n");
                tk_cli_json_str(stdout, a->refs[i]);
                printf(", \"error\": ");
                tk_cli_json_error_body(rc, tk_last_error());
                printf("}");
                first = 0;
                code = code == TK_EXIT_OK ? tk_cli_exit_code(rc) : code;
            } else {
                int c = tk_cli_fail(cli, rc, a->refs[i]);
                code = code == TK_EXIT_OK ? c : code;
            }
            continue;
        }
        failed += rc == TK_ERR_SELFTEST;
        json_t *rj = json_loads(report, 0, NULL);
        lost |= json_string_value(json_object_get(rj, "cuda_lost")) != NULL;
        json_decref(rj);
        if (cli->json) {
            printf("%s%s", first ? "" : ",\n", report);
            first = 0;
        } else {
            print_report(cli, report, cli->verbose);
        }
        tk_free(report);
    }
    if (cli->json)
        printf("]\n");
    else if (failed)
        fprintf(stderr,
                "tk: %d package%s with kernels that failed on this GPU: tk_op_run will not use those kernels\n"
                "HINT: 'tk selftest --results' shows the standing; after an update, run 'tk selftest' again\n",
                failed, failed == 1 ? "" : "s");
    tk_cli_progress_hook = NULL;
    if (failed && code == TK_EXIT_OK)
        code = TK_EXIT_SELFTEST;
    if (lost) {
        /* a fault or a launch that never ends: the driver's teardown at exit may wait for that launch
         * for ever; the records are written and the report printed, and the GPU is freed with the
         * process */
        fflush(NULL);
        _exit(code);
    }
    return code;
}

int tk_cmd_selftest(tk_cli *cli, int argc, char **argv)
{
    sargs a = {0};
    char **names = NULL;
    if (!(a.refs = calloc((size_t)argc + 1, sizeof *a.refs)))
        return TK_EXIT_FAIL;
    int code = parse_args(&a, argc, argv);
    if (a.json)
        cli->json = 1;
    tk_ctx *ctx = code == TK_EXIT_OK && !a.help ? tk_cli_ctx(cli) : NULL;
    if (code != TK_EXIT_OK || a.help)
        goto done;
    if (!ctx)
        code = TK_EXIT_FAIL;
    else if (a.records)
        code = do_records(cli, ctx, a.nrefs ? a.refs[0] : NULL);
    else if (a.forget)
        code = do_forget(cli, ctx, a.refs, a.nrefs);
    else if (a.plan)
        code = do_plan(cli, ctx, a.refs, a.nrefs, a.arch, a.op, a.kernel);
    else if ((code = need_gpu(cli, a.device)) == TK_EXIT_OK && a.results)
        code = do_results(cli, ctx, a.refs, a.nrefs, a.device);
    else if (code == TK_EXIT_OK && (a.nrefs || (code = add_installed(cli, ctx, &a, &names)) == TK_EXIT_OK))
        code = do_run(cli, ctx, &a); /* no package named: every installed one */
done:
    for (int i = 0; names && i < a.nrefs; i++)
        free(names[i]);
    free(names);
    free(a.refs);
    return code;
}
