/*
 * cmd_trust.c — tk trust add|list|remove: the publisher trust store.
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const char *USAGE =
    "tk trust add <org> <pubkey|KEY.pub> [--comment TEXT] | tk trust list | tk trust remove <org> <keyid|pubkey>";

int tk_cmd_trust(tk_cli *cli, int argc, char **argv)
{
    if (argc < 2 || tk_cli_is_help(argv[1])) {
        if (argc < 2)
            return tk_cli_usage(USAGE, "trust needs add, list or remove");
        printf("usage: %s\n\n"
               "Packages are installed only when signed by a key trusted for their org. The build's default\n"
               "registry key is trusted for its org without an entry.\n\n"
               "  add <org> <pubkey>       trust pubkey for org: ed25519:<64 hex>, or the KEY.pub file that\n"
               "                           'tk keygen' wrote\n"
               "  list                     show trusted keys with their fingerprints (--json too)\n"
               "  remove <org> <keyid>     stop trusting a key (give its SHA256:... id or the pubkey)\n",
               USAGE);
        return TK_EXIT_OK;
    }
    const char *sub = argv[1];
    const char *comment = NULL;
    const char *pos[4];
    int np = 0;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--comment") && i + 1 < argc)
            comment = argv[++i];
        else if (argv[i][0] == '-')
            return tk_cli_unknown_option(USAGE, argv[i]);
        else if (np < 4)
            pos[np++] = argv[i];
    }
    tk_ctx *ctx = tk_cli_ctx(cli);
    if (!ctx)
        return TK_EXIT_FAIL;
    int rc;
    if (!strcmp(sub, "add")) {
        if (np != 2)
            return tk_cli_usage(USAGE, "trust add takes an org and a public key");
        char key[256];
        if ((rc = tk_cli_pubkey_arg(key, sizeof key, pos[1], USAGE)) != 0)
            return rc;
        if ((rc = tk_trust_add(ctx, pos[0], key, comment)) != TK_OK)
            return tk_cli_fail(cli, rc, NULL);
        char *id = NULL;
        tk_key_fingerprint(&id, key);
        if (!cli->quiet)
            printf("trusted %s for org '%s'\n", id ? id : key, pos[0]);
        tk_free(id);
    } else if (!strcmp(sub, "remove") || !strcmp(sub, "rm")) {
        if (np != 2)
            return tk_cli_usage(USAGE, "trust remove takes an org and a key id");
        if ((rc = tk_trust_remove(ctx, pos[0], pos[1])) != TK_OK)
            return tk_cli_fail(cli, rc, NULL);
        if (!cli->quiet)
            printf("removed %s from org '%s'\n", pos[1], pos[0]);
    } else if (!strcmp(sub, "list") || !strcmp(sub, "ls")) {
        char *j = NULL;
        if ((rc = tk_trust_list_json(&j, ctx)) != TK_OK)
            return tk_cli_fail(cli, rc, NULL);
        if (cli->json) {
            printf("%s\n", j);
        } else {
            /* A tiny reader for our own JSON: one key per line is enough for the table. */
            printf("%-24s %-40s %s\n", "ORG", "KEY ID", "COMMENT");
            const char *s = j;
            while ((s = strstr(s, "\"org\": \"")) != NULL) {
                char org[128] = "", id[64] = "", com[256] = "";
                sscanf(s, "\"org\": \"%127[^\"]", org);
                const char *k = strstr(s, "\"keyid\": \"");
                if (k)
                    sscanf(k, "\"keyid\": \"%63[^\"]", id);
                const char *c = strstr(s, "\"comment\": \"");
                if (c)
                    sscanf(c, "\"comment\": \"%255[^\"]", com);
                printf("%-24s %-40s %s\n", org, id, com);
                s++;
            }
        }
        tk_free(j);
    } else {
        return tk_cli_usage(USAGE, "unknown trust command '%s'", sub);
    }
    return TK_EXIT_OK;
}
