/*
 * cmd_yank.c — tk yank: withdraw a published version with a statement signed by the publisher's key.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

static const char *USAGE =
    "tk yank ORG/NAME@VERSION (--to <registry-dir> | --registry <url> [--token T]) --key <key-file> "
    "[--reason TEXT]";

int tk_cmd_yank(tk_cli *cli, int argc, char **argv)
{
    const char *ref = NULL, *to = NULL, *registry = NULL, *token = NULL, *reason = NULL,
               *key = getenv("TK_PUBLISH_KEY");
    for (int i = 1; i < argc; i++) {
        if (tk_cli_is_help(argv[i])) {
            printf("usage: %s\n\n"
                   "Withdraws a published version without breaking anyone who pinned it. tk signs a yank\n"
                   "statement with the publisher's key and records it in the registry (a static tree with\n"
                   "--to, or a 'tk serve' registry with --registry). The version's files stay, so lock files\n"
                   "that pin its commit still install it. If it heads its branch (v<major>), the branch\n"
                   "moves back to the newest version of that major that is not yanked, so 'tk get' no\n"
                   "longer picks it; when there is none (a broken first release) the branch is removed,\n"
                   "'tk get ORG/NAME@MAJOR' says the version was yanked and why, and an exact pin\n"
                   "(@1.0.0) still installs it with a warning. Machines that already saw the yanked\n"
                   "version accept the older head\n"
                   "because the statement is signed by a key they trust for the org; without it they would\n"
                   "refuse it as a rollback. A yanked version can never be published again.\n\n"
                   "options:\n"
                   "  --to DIR        the registry tree\n"
                   "  --registry URL  a 'tk serve' registry (http:// or https://)\n"
                   "  --token T       the upload token for the package's org (default: TK_TOKEN)\n"
                   "  --key FILE      the publisher's private key (or TK_PUBLISH_KEY)\n"
                   "  --reason TEXT   why; shown to users whose machines move back\n"
                   "  --json          print {\"ref\": ..., \"branch_commit\": ...} (null: the branch did\n"
                   "                  not move, or was removed)\n\n"
                   "examples:\n"
                   "  tk yank acme/attn@1.4.2 --to /srv/registry --key acme.pem --reason \"wrong results on sm_90\"\n"
                   "  TK_TOKEN=... tk yank acme/attn@1.4.2 --registry https://kernels.example.com --key acme.pem\n\n"
                   "It prints one line: what was yanked and where its branch went.\n\n"
                   "exit status: 0 ok (also when already yanked), 2 bad arguments, 3 no such version,\n"
                   "4 network, 5 the registry does not trust the key, 8 the registry refused the token\n"
                   "(401/403), 1 other.\n",
                   USAGE);
            return TK_EXIT_OK;
        } else if (!strcmp(argv[i], "--to") || !strcmp(argv[i], "--key") || !strcmp(argv[i], "--registry") ||
                   !strcmp(argv[i], "--token") || !strcmp(argv[i], "--reason")) {
            if (i + 1 >= argc)
                return tk_cli_usage(USAGE, "%s needs a value", argv[i]);
            const char *v = argv[++i];
            if (!strcmp(argv[i - 1], "--to"))
                to = v;
            else if (!strcmp(argv[i - 1], "--registry"))
                registry = v;
            else if (!strcmp(argv[i - 1], "--token"))
                token = v;
            else if (!strcmp(argv[i - 1], "--reason"))
                reason = v;
            else
                key = v;
        } else if (argv[i][0] == '-') {
            return tk_cli_unknown_option(USAGE, argv[i]);
        } else if (!ref) {
            ref = argv[i];
        } else {
            return tk_cli_usage(USAGE, "one version at a time");
        }
    }
    if (!ref || !strchr(ref, '@'))
        return tk_cli_usage(USAGE, "name the version: ORG/NAME@MAJOR.MINOR.PATCH");
    if (!to == !registry)
        return tk_cli_usage(USAGE, "give exactly one of --to DIR and --registry URL");
    if (!key)
        return tk_cli_usage(USAGE, "need --key: the yank is signed by the publisher's key");
    tk_ctx *ctx = tk_cli_ctx(cli);
    if (!ctx)
        return TK_EXIT_FAIL;
    tk_publish_opts o = TK_PUBLISH_OPTS_INIT;
    o.key_path = key;
    char moved[41] = "";
    int rc = tk_yank(ctx, ref, reason, to, registry, token, &o, moved);
    if (rc != TK_OK)
        return tk_cli_fail(cli, rc, ref);
    if (cli->json)
        printf("{\"ref\": \"%s\", \"branch_commit\": %s%s%s}\n", ref, moved[0] ? "\"" : "", moved[0] ? moved : "null",
               moved[0] ? "\"" : "");
    /* the text is the library's one line ("yanked ...; branch moved back to ..."), on stderr */
    return TK_EXIT_OK;
}
