/*
 * cmd_versions.c — tk versions: every version of a package in the registry.
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const char *USAGE = "tk versions [--json] ORG/NAME[@MAJOR | @VERSION | @RANGE]";

int tk_cmd_versions(tk_cli *cli, int argc, char **argv)
{
    const char *ref = NULL;
    for (int i = 1; i < argc; i++) {
        if (tk_cli_is_help(argv[i])) {
            printf(
                "usage: %s\n\n"
                "Lists every version of a package in the registry, newest first: version, major, commit,\n"
                "publish date (as the registry recorded it) and its state: 'head' for the version\n"
                "'tk get ORG/NAME@MAJOR' installs, 'yanked' (with the publisher's reason) for a withdrawn\n"
                "one. A version part narrows the list to what it matches. Each version is checked as\n"
                "'tk get' checks it before it is listed: the manifest's signature (by the org's trusted\n"
                "key when the org has one) and its commit id, recomputed from its parent and files; a\n"
                "registry that fails a check is refused. Needs the network.\n\n"
                "version syntax (also for tk get):\n"
                "  @2, @v2          the newest version of major 2 that is not yanked (branch v2)\n"
                "  @1.4.2           exactly 1.4.2, even if yanked (installed with a warning)\n"
                "  @'>=1.2,<2'      the newest version that is not yanked and satisfies every comparator:\n"
                "                   >=, >, <=, <, = (or none) joined by commas; 1 and 1.2 mean 1.0.0, 1.2.0\n"
                "  @<40-hex>        exactly that commit\n\n"
                "options:\n"
                "  --json  print {\"name\": ..., \"versions\": [{\"version\", \"commit\", \"major\", \"head\",\n"
                "          \"yanked\", \"yank_reason\", \"published\", \"signer\", \"trusted\", \"description\"}]}\n\n"
                "examples:\n"
                "  tk versions kernels-community/activation\n"
                "  tk versions acme/attn@'>=1.2,<2' --json\n\n"
                "exit status: 0 ok, 2 bad arguments, 3 no such package or no version matches, 4 network,\n"
                "5 the registry served something that fails a check, 1 other.\n",
                USAGE);
            return TK_EXIT_OK;
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
    tk_version_list *l = NULL;
    int rc = tk_pkg_versions(&l, ctx, ref);
    if (rc != TK_OK)
        return tk_cli_fail(cli, rc, ref);
    size_t n = tk_version_list_count(l);
    if (cli->json) {
        char *j = NULL;
        if ((rc = tk_version_list_to_json(&j, l)) == TK_OK)
            printf("%s\n", j);
        tk_free(j);
    } else if (n) {
        printf("%-12s %-5s %-12s %-20s %s\n", "VERSION", "MAJOR", "COMMIT", "PUBLISHED", "STATE");
        for (size_t i = 0; i < n; i++) {
            const char *when = tk_version_list_published(l, i);
            char state[600] = "";
            if (tk_version_list_yanked(l, i)) {
                const char *why = tk_version_list_yank_reason(l, i);
                snprintf(state, sizeof state, "yanked%s%s%s", why[0] ? " (" : "", why, why[0] ? ")" : "");
            } else if (tk_version_list_latest(l, tk_version_list_major(l, i)) &&
                       !strcmp(tk_version_list_latest(l, tk_version_list_major(l, i)), tk_version_list_version(l, i))) {
                snprintf(state, sizeof state, "head of v%d", tk_version_list_major(l, i));
            }
            printf("%-12s v%-4d %-12.12s %-20s %s\n", tk_version_list_version(l, i), tk_version_list_major(l, i),
                   tk_version_list_commit(l, i), when[0] ? when : "-", state);
        }
    }
    if (rc == TK_OK && n == 0) {
        fprintf(stderr, "tk: %s: no version matches\n", ref);
        rc = TK_ERR_NOT_FOUND;
    }
    tk_version_list_free(l);
    return tk_cli_exit_code(rc);
}
