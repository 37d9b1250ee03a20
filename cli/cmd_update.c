/*
 * cmd_update.c — tk update: move installed packages to the newest version of their major.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

static const char *USAGE = "tk update [--json] [--trust] [ORG/NAME ...]";

int tk_cmd_update(tk_cli *cli, int argc, char **argv)
{
    int trust = 0, nnames = 0;
    for (int i = 1; i < argc; i++) {
        if (tk_cli_is_help(argv[i])) {
            printf("usage: %s\n\n"
                   "Moves each installed package (or the ones named) to the newest version of the major it\n"
                   "has installed: 'tk get ORG/NAME@MAJOR' for each, with every check of tk get (signature,\n"
                   "trusted key, commit id, rollback protection). Each installed major asks the registry it\n"
                   "was installed from, and is only ever moved forward: when that registry's newest\n"
                   "version is older than the installed one (a stale mirror, or a yanked version installed\n"
                   "by name), the package is kept. A new major is never installed by update:\n"
                   "'tk list --outdated' shows it, and 'tk get ORG/NAME@MAJOR' installs it beside the old one.\n\n"
                   "options:\n"
                   "  --trust  trust an org's signer on first use, as tk get --trust\n"
                   "  --json   print [{\"name\", \"major\", \"from\", \"to\", \"updated\"}]\n\n"
                   "examples:\n"
                   "  tk update\n"
                   "  tk update acme/attn\n\n"
                   "exit status: 0 ok (also when all are up to date), 3 a named package is not installed,\n"
                   "4 network, 5 a new version was refused (signature, trust, rollback), 1 other; tk goes on\n"
                   "with the other packages and exits with the first failure's code.\n",
                   USAGE);
            return TK_EXIT_OK;
        } else if (!strcmp(argv[i], "--trust")) {
            trust = 1;
        } else if (argv[i][0] == '-') {
            return tk_cli_unknown_option(USAGE, argv[i]);
        } else if (strchr(argv[i], '@')) {
            return tk_cli_usage(USAGE,
                                "'%s': update takes names; it moves each installed major to its newest "
                                "version (to pick a version, use tk get ORG/NAME@VERSION)",
                                argv[i]);
        } else {
            nnames++;
        }
    }
    tk_ctx *ctx = tk_cli_ctx(cli);
    if (!ctx)
        return TK_EXIT_FAIL;
    tk_pkg_list *l = NULL;
    int rc = tk_pkg_list_installed(&l, ctx);
    if (rc != TK_OK)
        return tk_cli_fail(cli, rc, NULL);
    int exit_code = TK_EXIT_OK, first = 1;
    for (int i = 1; i < argc; i++) { /* every name must be installed */
        if (argv[i][0] == '-')
            continue;
        int found = 0;
        for (size_t k = 0; k < tk_pkg_list_count(l); k++)
            found |= !strcmp(tk_pkg_name(tk_pkg_list_at(l, k)), argv[i]);
        if (!found) {
            exit_code =
                tk_cli_errorf(cli, TK_ERR_NOT_FOUND, 0, "%s is not installed\nHINT: run 'tk get %s'", argv[i], argv[i]);
            if (cli->json)
                break; /* one error object */
        }
    }
    if (exit_code != TK_EXIT_OK) {
        tk_pkg_list_free(l);
        return exit_code;
    }
    tk_get_opts o = TK_GET_OPTS_INIT;
    o.trust_unknown = trust;
    if (cli->json)
        printf("[");
    for (size_t k = 0; k < tk_pkg_list_count(l); k++) {
        const tk_pkg *p = tk_pkg_list_at(l, k);
        int wanted = nnames == 0;
        for (int i = 1; i < argc; i++)
            wanted |= argv[i][0] != '-' && !strcmp(argv[i], tk_pkg_name(p));
        if (!wanted)
            continue;
        char ref[200];
        snprintf(ref, sizeof ref, "%s@%d", tk_pkg_name(p), tk_pkg_major(p));
        /* ask the registry this major came from (each major remembers its own) whether it has a newer
         * version; never move to an older one (a stale mirror, or a yanked version installed by name) */
        tk_version_list *vl = NULL;
        rc = tk_pkg_versions(&vl, ctx, ref);
        const char *newer = rc == TK_OK ? tk_version_list_newer(vl, tk_pkg_major(p), tk_pkg_version(p)) : NULL;
        const char *latest = rc == TK_OK ? tk_version_list_latest(vl, tk_pkg_major(p)) : NULL;
        tk_pkg *np = NULL;
        if (rc == TK_OK && newer)
            rc = tk_pkg_get(&np, ctx, ref, &o);
        if (rc != TK_OK) {
            int code = tk_cli_fail(cli, rc, ref);
            if (exit_code == TK_EXIT_OK)
                exit_code = code;
            tk_version_list_free(vl);
            continue;
        }
        const char *to = np ? tk_pkg_version(np) : tk_pkg_version(p);
        int moved = np && strcmp(tk_pkg_commit(np), tk_pkg_commit(p)) != 0;
        if (cli->json)
            printf("%s{\"name\": \"%s\", \"major\": %d, \"from\": \"%s\", \"to\": \"%s\", \"updated\": %s}",
                   first ? "" : ",\n", tk_pkg_name(p), tk_pkg_major(p), tk_pkg_version(p), to,
                   moved ? "true" : "false");
        else if (moved)
            printf("%s: %s -> %s\n", tk_pkg_name(p), tk_pkg_version(p), to);
        else if (!cli->quiet && latest && strcmp(latest, tk_pkg_version(p)) != 0)
            printf("%s: %s is kept: the newest of v%d in its registry that is not yanked is %s, which is older\n",
                   tk_pkg_name(p), tk_pkg_version(p), tk_pkg_major(p), latest);
        else if (!cli->quiet)
            printf("%s: %s is the newest of v%d\n", tk_pkg_name(p), tk_pkg_version(p), tk_pkg_major(p));
        first = 0;
        tk_pkg_free(np);
        tk_version_list_free(vl);
    }
    if (cli->json)
        printf("]\n");
    tk_pkg_list_free(l);
    return exit_code;
}
