/*
 * cmd_lock.c — tk lock: write a lock file pinning installed packages.
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const char *USAGE = "tk lock [-o FILE] [org/name[@major]...]";

int tk_cmd_lock(tk_cli *cli, int argc, char **argv)
{
    const char *out = "tk.lock";
    const char *refs[256];
    size_t n = 0;
    for (int i = 1; i < argc; i++) {
        if (tk_cli_is_help(argv[i])) {
            printf("usage: %s\n\nWrites a lock file (default tk.lock) pinning the commit and manifest sha256 of\n"
                   "the given installed packages (default: all). 'tk get --locked' installs exactly those,\n"
                   "and refuses a manifest whose digest differs.\n", USAGE);
            return TK_EXIT_OK;
        } else if (!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) {
            if (++i >= argc)
                return tk_cli_usage(USAGE, "-o needs a file name");
            out = argv[i];
        } else if (argv[i][0] == '-') {
            return tk_cli_usage(USAGE, "unknown option '%s'", argv[i]);
        } else if (n < sizeof refs / sizeof *refs) {
            refs[n++] = argv[i];
        }
    }
    tk_ctx *ctx = tk_cli_ctx(cli);
    if (!ctx)
        return TK_EXIT_FAIL;
    int rc = tk_lock_write(ctx, out, refs, n);
    if (rc != TK_OK)
        return tk_cli_fail(cli, rc, NULL);
    if (!cli->quiet)
        printf("wrote %s\n", out);
    return TK_EXIT_OK;
}
