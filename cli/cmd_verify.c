/*
 * cmd_verify.c — tk verify: re-hash installed files.
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const char *USAGE = "tk verify [--json] [org/name[@version]]";

static const char *HELP =
    "NAME\n"
    "    tk verify - re-hash installed files against their signed manifests\n"
    "\n"
    "SYNOPSIS\n"
    "    tk verify [--json] [org/name[@version]]\n"
    "\n"
    "DESCRIPTION\n"
    "    Re-hashes every installed file (of one package, or of all) in the content-addressed store and\n"
    "    compares it with the sha256 in the signed manifest recorded at install; the recorded manifest\n"
    "    itself must still hash to its recorded digest. A missing, altered or replaced file (a link\n"
    "    planted in the store counts as tampering) is named, and the hint gives, for each bad package,\n"
    "    the 'tk get --force ORG/NAME@MAJOR' that reinstalls it and the registry it comes back from\n"
    "    (the one it was installed from; docs/project.md).\n"
    "\n"
    "OPTIONS\n"
    "    --json   print {\"ok\", \"checked\", \"bad_count\", \"bad_files\": [{\"package\", \"file\",\n"
    "             \"problem\", \"sha256\", \"want\"}]} (docs/json.md), also when files are bad\n"
    "\n"
    "EXIT STATUS\n"
    "    0 every file matches; 3 the package is not installed; 5 a file is missing or altered.\n";

int tk_cmd_verify(tk_cli *cli, int argc, char **argv)
{
    const char *ref = NULL;
    for (int i = 1; i < argc; i++) {
        if (tk_cli_is_help(argv[i])) {
            fputs(HELP, stdout);
            return TK_EXIT_OK;
        } else if (argv[i][0] == '-') {
            return tk_cli_unknown_option(USAGE, argv[i]);
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
