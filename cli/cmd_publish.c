/*
 * cmd_publish.c — tk publish: sign a package directory into a static registry tree.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

static const char *USAGE = "tk publish <pkgdir> --to <registry-dir> --key <key-file> [--zstd]";

int tk_cmd_publish(tk_cli *cli, int argc, char **argv)
{
    const char *dir = NULL, *to = NULL, *key = getenv("TK_PUBLISH_KEY");
    tk_publish_opts o = TK_PUBLISH_OPTS_INIT;
    for (int i = 1; i < argc; i++) {
        if (tk_cli_is_help(argv[i])) {
            printf("usage: %s\n\n"
                   "Reads <pkgdir>/kernel.json and the sources beside it, writes the signed manifest, its\n"
                   "signature and a deterministic source archive into <registry-dir> under a new commit, and\n"
                   "moves branch v<major> to it. Older commits stay (history). The tree has the Hub's URL\n"
                   "layout, so nginx, object storage or a CDN can serve it as plain files (docs/registry.md).\n"
                   "Publishing identical content again changes nothing; a changed package needs a higher\n"
                   "version.\n\n"
                   "options:\n"
                   "  --to DIR     the registry tree (created if missing)\n"
                   "  --key FILE   the publisher's private key from 'tk keygen' (or TK_PUBLISH_KEY)\n"
                   "  --zstd       compress the archive with zstd instead of gzip\n", USAGE);
            return TK_EXIT_OK;
        } else if (!strcmp(argv[i], "--to") || !strcmp(argv[i], "--key")) {
            if (i + 1 >= argc)
                return tk_cli_usage(USAGE, "%s needs a value", argv[i]);
            if (!strcmp(argv[i], "--to"))
                to = argv[++i];
            else
                key = argv[++i];
        } else if (!strcmp(argv[i], "--zstd")) {
            o.compression = "zst";
        } else if (argv[i][0] == '-') {
            return tk_cli_usage(USAGE, "unknown option '%s'", argv[i]);
        } else if (!dir) {
            dir = argv[i];
        } else {
            return tk_cli_usage(USAGE, "one package directory at a time");
        }
    }
    if (!dir || !to)
        return tk_cli_usage(USAGE, "need a package directory and --to");
    if (!key)
        return tk_cli_usage(USAGE, "need --key (make one with 'tk keygen')");
    o.key_path = key;
    tk_ctx *ctx = tk_cli_ctx(cli);
    if (!ctx)
        return TK_EXIT_FAIL;
    char *commit = NULL;
    int rc = tk_publish(&commit, ctx, dir, to, &o);
    if (rc != TK_OK)
        return tk_cli_fail(cli, rc, dir);
    if (cli->json)
        printf("{\"commit\": \"%s\"}\n", commit);
    else
        printf("%s\n", commit);
    tk_free(commit);
    return TK_EXIT_OK;
}
