/*
 * cmd_list.c — tk list: installed packages, one line each (or JSON).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

static const char *USAGE = "tk list [--json] [--outdated]";

/* tk list --outdated: each installed package whose major has a newer version in the registry it was
 * installed from, or whose package has a newer major (not yanked either way). Each installed major
 * asks its own registry (v1 and v2 may come from different ones), and a version older than the
 * installed one (a stale mirror, or a yanked version installed by name) is never offered. */
static int list_outdated(tk_cli *cli, tk_ctx *ctx, tk_pkg_list *l)
{
    size_t n = tk_pkg_list_count(l), shown = 0;
    int exit_code = TK_EXIT_OK;
    if (cli->json)
        printf("[");
    for (size_t i = 0; i < n; i++) {
        const tk_pkg *p = tk_pkg_list_at(l, i);
        int top = 0; /* the highest major of this package installed */
        for (size_t k = 0; k < n; k++)
            if (!strcmp(tk_pkg_name(tk_pkg_list_at(l, k)), tk_pkg_name(p)) && tk_pkg_major(tk_pkg_list_at(l, k)) > top)
                top = tk_pkg_major(tk_pkg_list_at(l, k));
        /* the highest major asks about every major (a newer one too); a lower one about its own */
        char ref[200];
        snprintf(ref, sizeof ref, tk_pkg_major(p) == top ? "%s" : "%s@%d", tk_pkg_name(p), tk_pkg_major(p));
        tk_version_list *vl = NULL;
        int rc = tk_pkg_versions(&vl, ctx, ref);
        if (rc != TK_OK) {
            int code = tk_cli_fail(cli, rc, tk_pkg_name(p));
            if (exit_code == TK_EXIT_OK)
                exit_code = code;
            continue;
        }
        const char *latest = tk_version_list_newer(vl, tk_pkg_major(p), tk_pkg_version(p));
        const char *newest = tk_pkg_major(p) == top ? tk_version_list_latest(vl, 0) : NULL;
        int newer_major = newest && strtol(newest, NULL, 10) > top;
        if (latest || newer_major) {
            if (cli->json) {
                printf("%s{\"name\": ", shown ? ",\n" : "");
                tk_cli_json_str(stdout, tk_pkg_name(p));
                printf(", \"major\": %d, \"installed\": ", tk_pkg_major(p));
                tk_cli_json_str(stdout, tk_pkg_version(p));
                printf(", \"latest\": ");
                tk_cli_json_str(stdout, latest ? latest : tk_pkg_version(p));
                printf(", \"newest\": ");
                tk_cli_json_str(stdout, newer_major ? newest : latest ? latest : tk_pkg_version(p));
                printf("}");
            } else {
                if (!shown)
                    printf("%-40s %-10s %-10s %s\n", "PACKAGE", "INSTALLED", "LATEST", "NEWEST MAJOR");
                printf("%-40s %-10s %-10s %s\n", tk_pkg_name(p), tk_pkg_version(p), latest ? latest : "-",
                       newer_major ? newest : "-");
            }
            shown++;
        }
        tk_version_list_free(vl);
    }
    if (cli->json)
        printf("]\n");
    else if (!shown && exit_code == TK_EXIT_OK)
        tk_cli_info(cli, "every installed package is the newest of its major, and no newer major exists\n");
    if (!cli->json && shown)
        tk_cli_info(cli, "LATEST is what 'tk update' installs; a newer major needs 'tk get ORG/NAME@MAJOR'\n");
    return exit_code;
}

int tk_cmd_list(tk_cli *cli, int argc, char **argv)
{
    int outdated = 0;
    for (int i = 1; i < argc; i++) {
        if (tk_cli_is_help(argv[i])) {
            printf("usage: %s\n\nLists installed packages: name, version, major, commit and file count.\n"
                   "With --json, prints an array of the same objects 'tk info --json' prints.\n\n"
                   "  --outdated  ask the registries: only the packages with a newer version in their major\n"
                   "              (LATEST: what 'tk update' installs) or a newer major (NEWEST MAJOR); with\n"
                   "              --json, [{\"name\", \"major\", \"installed\", \"latest\", \"newest\"}].\n"
                   "              Each installed major asks the registry it was installed from; yanked\n"
                   "              versions, and versions older than the installed one, never count.\n"
                   "              Needs the network.\n",
                   USAGE);
            return TK_EXIT_OK;
        }
        if (!strcmp(argv[i], "--outdated")) {
            outdated = 1;
            continue;
        }
        if (argv[i][0] == '-')
            return tk_cli_unknown_option(USAGE, argv[i]);
        return tk_cli_usage(USAGE, "unexpected argument '%s'", argv[i]);
    }
    tk_ctx *ctx = tk_cli_ctx(cli);
    if (!ctx)
        return TK_EXIT_FAIL;
    tk_pkg_list *l = NULL;
    int rc = tk_pkg_list_installed(&l, ctx);
    if (rc != TK_OK)
        return tk_cli_fail(cli, rc, NULL);
    if (outdated) {
        int code = list_outdated(cli, ctx, l);
        tk_pkg_list_free(l);
        return code;
    }
    size_t n = tk_pkg_list_count(l);
    if (cli->json) {
        printf("[");
        for (size_t i = 0; i < n; i++) {
            char *j = NULL;
            if (tk_pkg_to_json(&j, tk_pkg_list_at(l, i)) == TK_OK)
                printf("%s%s", i ? ",\n" : "", j);
            tk_free(j);
        }
        printf("]\n");
    } else if (n == 0) {
        tk_cli_info(cli, "no packages installed (try: tk get kernels-community/activation)\n");
    } else {
        printf("%-40s %-10s %-5s %-12s %s\n", "PACKAGE", "VERSION", "MAJOR", "COMMIT", "FILES");
        for (size_t i = 0; i < n; i++) {
            const tk_pkg *p = tk_pkg_list_at(l, i);
            printf("%-40s %-10s v%-4d %-12.12s %zu\n", tk_pkg_name(p), tk_pkg_version(p), tk_pkg_major(p),
                   tk_pkg_commit(p), tk_pkg_file_count(p));
        }
    }
    tk_pkg_list_free(l);
    return TK_EXIT_OK;
}
