/*
 * cmd_info.c — tk info: one installed package in detail (or JSON).
 */
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"

static const char *USAGE = "tk info [--json] [--manifest] <org/name[@version]>";

/* The kernels table (name, op, dtypes, archs) and the ops, columns sized to their contents. */
static void print_kernels(const tk_pkg *p)
{
    size_t n = tk_pkg_kernel_count(p);
    int wn = 6, wo = 2, wd = 6;
    for (size_t i = 0; i < n; i++) {
        int a = (int)strlen(tk_pkg_kernel_name(p, i)), b = (int)strlen(tk_pkg_kernel_op(p, i));
        int c = (int)strlen(tk_pkg_kernel_dtypes(p, i));
        wn = a > wn ? a : wn;
        wo = b > wo ? b : wo;
        wd = c > wd ? c : wd;
    }
    printf("  kernels (%zu):\n", n);
    if (n)
        printf("    %-*s  %-*s  %-*s  %s\n", wn, "KERNEL", wo, "OP", wd, "DTYPES", "ARCHS");
    for (size_t i = 0; i < n; i++) {
        const char *dt = tk_pkg_kernel_dtypes(p, i);
        printf("    %-*s  %-*s  %-*s  %s\n", wn, tk_pkg_kernel_name(p, i), wo, tk_pkg_kernel_op(p, i), wd,
               dt[0] ? dt : "any", tk_pkg_kernel_archs(p, i));
    }
    printf("  ops (%zu):", tk_pkg_op_count(p));
    for (size_t i = 0; i < tk_pkg_op_count(p); i++)
        printf("%s%s", i ? ", " : " ", tk_pkg_op_at(p, i));
    printf("\n");
}

/* The package's self-tests (docs/selftest.md): {"gpus": [its standing on each GPU of this machine: each
 * kernel's record for its current binary, or never_tested], "records": [every result recorded for it,
 * on any GPU]}. */
static json_t *selftest_info(tk_ctx *ctx, const tk_pkg *p)
{
    int ndev = 0;
    char ref[256], *js = NULL;
    json_t *o = json_object(), *gpus = json_array();
    snprintf(ref, sizeof ref, "%s@%s", tk_pkg_name(p), tk_pkg_commit(p));
    if (tk_device_count(&ndev) != TK_OK)
        ndev = 0;
    for (int d = 0; d < ndev; d++) {
        if (tk_selftest_results_json(&js, ctx, ref, d) == TK_OK) {
            json_t *r = json_loads(js, 0, NULL), *pk = json_array_get(json_object_get(r, "packages"), 0);
            json_object_set(pk, "device", json_object_get(r, "device"));
            json_array_append(gpus, pk);
            json_decref(r);
        }
        tk_free(js);
        js = NULL;
    }
    json_object_set_new(o, "gpus", gpus);
    json_object_set_new(o, "records",
                        tk_selftest_records_json(&js, ctx, tk_pkg_name(p)) == TK_OK ? json_loads(js, 0, NULL)
                                                                                    : json_array());
    tk_free(js);
    return o;
}

static void print_selftest_info(json_t *st)
{
    size_t i, j;
    json_t *x, *k, *gpus = json_object_get(st, "gpus"), *recs = json_object_get(st, "records");
    if (!json_array_size(gpus)) {
        printf("  self-tests: no GPU here%s\n", json_array_size(recs) ? "; recorded on other GPUs:"
                                                                      : " and none recorded "
                                                                        "('tk selftest' runs them on the GPU)");
        json_array_foreach(recs, i, x)
            printf("    %-11s %s on %s (driver %s, tk %s)\n", json_string_value(json_object_get(x, "status")),
                   json_string_value(json_object_get(x, "kernel")), json_string_value(json_object_get(x, "gpu_name")),
                   json_string_value(json_object_get(x, "driver")),
                   json_string_value(json_object_get(x, "tk_version")));
        return;
    }
    json_array_foreach(gpus, i, x) {
        json_t *d = json_object_get(x, "device");
        printf(
            "  self-tests on %s (cuda:%lld, driver %s): %lld passed, %lld failed, %lld untested, %lld never tested\n",
            json_string_value(json_object_get(d, "name")), (long long)json_integer_value(json_object_get(d, "ordinal")),
            json_string_value(json_object_get(d, "driver")),
            (long long)json_integer_value(json_object_get(x, "passed")),
            (long long)json_integer_value(json_object_get(x, "failed")),
            (long long)json_integer_value(json_object_get(x, "untested")),
            (long long)json_integer_value(json_object_get(x, "never_tested")));
        json_array_foreach(json_object_get(x, "kernels"), j, k) {
            const char *s = json_string_value(json_object_get(k, "status"));
            if (strcmp(s, "passed") && strcmp(s, "never_tested"))
                printf("    %-11s %s%s%s\n", s, json_string_value(json_object_get(k, "kernel")),
                       json_object_get(k, "summary") ? ": " : "",
                       json_object_get(k, "summary") ? json_string_value(json_object_get(k, "summary")) : "");
        }
        if (json_integer_value(json_object_get(x, "never_tested")))
            printf("    HINT: 'tk selftest %s' proves them on this GPU\n",
                   json_string_value(json_object_get(x, "package")));
    }
}

/* A package that is not installed: what the registry has (tk_pkg_versions checks each commit), or the
 * registry's error (not found, with a "did you mean" when a name is close; a network failure). -1
 * when the registry is not asked (offline) or has no version of that kind: the caller reports the
 * local error. */
static int remote_info(tk_cli *cli, tk_ctx *ctx, const char *ref)
{
    tk_version_list *l = NULL;
    int rc = tk_pkg_versions(&l, ctx, ref);
    if (rc != TK_OK && rc != TK_ERR_OFFLINE && rc != TK_ERR_INVALID) {
        char what[300];
        snprintf(what, sizeof what, "%s is not installed, and the registry", ref);
        return tk_cli_fail(cli, rc, rc == TK_ERR_NOT_FOUND ? NULL : what);
    }
    if (rc == TK_OK && tk_version_list_count(l) == 0) { /* the package exists, not that version */
        char name[200];
        snprintf(name, sizeof name, "%.*s", (int)strcspn(ref, "@"), ref);
        tk_version_list_free(l);
        return tk_cli_errorf(cli, TK_ERR_NOT_FOUND, 0,
                             "%s is not installed, and the registry has no such version "
                             "of %s\nHINT: 'tk versions %s' lists them",
                             ref, name, name);
    }
    if (rc != TK_OK) {
        tk_version_list_free(l);
        return -1;
    }
    if (cli->json) {
        char *j = NULL;
        if (tk_version_list_to_json(&j, l) == TK_OK) /* {"name", "installed": false, "versions": [...]} */
            printf("{\"installed\": false, %s\n", strchr(j, '{') + 1);
        tk_free(j);
    } else {
        const char *newest = tk_version_list_latest(l, 0);
        printf("%s (not installed; from the registry)\n", ref);
        printf("  newest     %s\n", newest ? newest : "- (every version is yanked)");
        printf("  versions  ");
        for (size_t i = tk_version_list_count(l); i-- > 0;)
            printf(" %s%s", tk_version_list_version(l, i), tk_version_list_yanked(l, i) ? " (yanked)" : "");
        printf("\n  install    tk get %s\n", ref);
    }
    tk_version_list_free(l);
    return TK_EXIT_OK;
}

int tk_cmd_info(tk_cli *cli, int argc, char **argv)
{
    const char *ref = NULL;
    int manifest = 0;
    for (int i = 1; i < argc; i++) {
        if (tk_cli_is_help(argv[i])) {
            printf("usage: %s\n\nShows an installed package: version, commit, manifest digest, signer, registry,\n"
                   "files with their sha256, the kernels it declares (name, op, dtypes, the archs they run on)\n"
                   "and the ops they implement, without the network or a GPU. A package that is not installed\n"
                   "is looked up in the registry: its versions (as tk versions lists them), or \"not found\"\n"
                   "with the closest name when one is close (\"did you mean\"). Its self-tests\n"
                   "(tk selftest): on each GPU here, every kernel's result for its current binary, else never tested;\n"
                   "without a GPU, the results recorded on others (JSON: \"selftest\").\n\n"
                   "  --json      print it as a JSON object\n"
                   "  --manifest  print the signed manifest exactly as installed\n",
                   USAGE);
            return TK_EXIT_OK;
        } else if (!strcmp(argv[i], "--manifest")) {
            manifest = 1;
        } else if (argv[i][0] == '-') {
            return tk_cli_unknown_option(USAGE, argv[i]);
        } else if (!ref) {
            ref = argv[i];
        } else {
            return tk_cli_usage(USAGE, "one package at a time");
        }
    }
    if (!ref)
        return tk_cli_usage(USAGE, "which package?");
    tk_ctx *ctx = tk_cli_ctx(cli);
    if (!ctx)
        return TK_EXIT_FAIL;
    tk_pkg *p = NULL;
    int rc = tk_pkg_info(&p, ctx, ref);
    if (rc == TK_ERR_NOT_FOUND && !manifest) {
        int code = remote_info(cli, ctx, ref);
        if (code >= 0)
            return code;
        rc = tk_pkg_info(&p, ctx, ref); /* offline or not in the registry: the local error again */
    }
    if (rc != TK_OK)
        return tk_cli_fail(cli, rc, NULL);
    if (manifest) {
        fputs(tk_pkg_manifest(p), stdout);
    } else if (cli->json) {
        char *j = NULL;
        if ((rc = tk_pkg_to_json(&j, p)) == TK_OK) { /* with its self-tests */
            json_t *o = json_loads(j, 0, NULL);
            json_object_set_new(o, "selftest", selftest_info(ctx, p));
            char *s = json_dumps(o, JSON_INDENT(2));
            printf("%s\n", s ? s : j);
            free(s);
            json_decref(o);
        }
        tk_free(j);
    } else {
        char when[64];
        time_t t = (time_t)tk_pkg_installed_at(p);
        strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", gmtime(&t));
        printf("%s %s\n", tk_pkg_name(p), tk_pkg_version(p));
        printf("  %s\n", tk_pkg_description(p));
        printf("  major      v%d\n  commit     %s\n  manifest   sha256 %s\n  signer     %s\n  license    %s\n"
               "  installed  %s\n",
               tk_pkg_major(p), tk_pkg_commit(p), tk_pkg_manifest_sha256(p), tk_pkg_signer(p), tk_pkg_license(p), when);
        printf("  files:\n");
        for (size_t i = 0; i < tk_pkg_file_count(p); i++)
            printf("    %-30s %8lld  %s\n", tk_pkg_file_path(p, i), (long long)tk_pkg_file_size(p, i),
                   tk_pkg_file_sha256(p, i));
        print_kernels(p);
        json_t *st = selftest_info(ctx, p);
        print_selftest_info(st);
        json_decref(st);
    }
    tk_pkg_free(p);
    return rc == TK_OK ? TK_EXIT_OK : tk_cli_fail(cli, rc, NULL);
}
