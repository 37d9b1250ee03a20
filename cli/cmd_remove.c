/*
 * cmd_remove.c — tk remove: uninstall packages.
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const char *USAGE = "tk remove <org/name[@major]>...";

int tk_cmd_remove(tk_cli *cli, int argc, char **argv)
{
    int n = 0;
    for (int i = 1; i < argc; i++) {
        if (tk_cli_is_help(argv[i])) {
            printf("usage: %s\n\nUninstalls packages (every installed major, or the one given). Files that no\n"
                   "other installed package uses are deleted from the store.\n",
                   USAGE);
            return TK_EXIT_OK;
        }
        if (argv[i][0] == '-')
            return tk_cli_unknown_option(USAGE, argv[i]);
        n++;
    }
    if (!n)
        return tk_cli_usage(USAGE, "which package?");
    tk_ctx *ctx = tk_cli_ctx(cli);
    if (!ctx)
        return TK_EXIT_FAIL;
    for (int i = 1; i < argc; i++) {
        int rc = tk_pkg_remove(ctx, argv[i]);
        if (rc != TK_OK)
            return tk_cli_fail(cli, rc, argv[i]);
        /* the library's one line says it: "removed ORG/NAME (N bytes freed)" */
    }
    return TK_EXIT_OK;
}
