/*
 * cmd_verify.c — tk verify: re-hash installed files.
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const char *USAGE = "tk verify [org/name[@version]]";

int tk_cmd_verify(tk_cli *cli, int argc, char **argv)
{
    const char *ref = NULL;
    for (int i = 1; i < argc; i++) {
        if (tk_cli_is_help(argv[i])) {
            printf("usage: %s\n\nRe-hashes every installed file (of one package, or of all) and compares it\n"
                   "with the sha256 in the signed manifest. Exit status 5 when anything is missing or altered.\n",
                   USAGE);
            return TK_EXIT_OK;
        } else if (argv[i][0] == '-') {
            return tk_cli_usage(USAGE, "unknown option '%s'", argv[i]);
        } else if (!ref) {
            ref = argv[i];
        } else {
            return tk_cli_usage(USAGE, "one package at a time (or none for all)");
        }
    }
    tk_ctx *ctx = tk_cli_ctx(cli);
    if (!ctx)
        return TK_EXIT_FAIL;
    if (cli->json) {
        /* the report names every bad file; a failed verification prints it and exits non-zero */
        char *j = NULL;
        int rc = tk_pkg_verify_json(&j, ctx, ref);
        if (!j)
            return tk_cli_fail(cli, rc, NULL);
        printf("%s\n", j);
        tk_free(j);
        return tk_cli_exit_code(rc);
    }
    size_t bad = 0;
    int rc = tk_pkg_verify(ctx, ref, &bad);
    if (rc != TK_OK)
        return tk_cli_fail(cli, rc, NULL);
    if (!cli->json)
        printf("ok: %s verified\n", ref ? ref : "every installed package");
    return TK_EXIT_OK;
}
