/*
 * cmd_list.c — tk list: installed packages, one line each (or JSON).
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const char *USAGE = "tk list [--json]";

int tk_cmd_list(tk_cli *cli, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (tk_cli_is_help(argv[i])) {
            printf("usage: %s\n\nLists installed packages: name, version, major, commit and file count.\n"
                   "With --json, prints an array of the same objects 'tk info --json' prints.\n", USAGE);
            return TK_EXIT_OK;
        }
        return tk_cli_usage(USAGE, "unexpected argument '%s'", argv[i]);
    }
    tk_ctx *ctx = tk_cli_ctx(cli);
    if (!ctx)
        return TK_EXIT_FAIL;
    tk_pkg_list *l = NULL;
    int rc = tk_pkg_list_installed(&l, ctx);
    if (rc != TK_OK)
        return tk_cli_fail(cli, rc, NULL);
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
