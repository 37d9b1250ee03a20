/*
 * cmd_keygen.c — tk keygen: make a publisher key pair.
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const char *USAGE = "tk keygen <key-file>";

int tk_cmd_keygen(tk_cli *cli, int argc, char **argv)
{
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (tk_cli_is_help(argv[i])) {
            printf("usage: %s\n\nMakes an Ed25519 key pair: the private key in <key-file> (PEM, mode 0600; an\n"
                   "existing file is never overwritten) and the public key in <key-file>.pub. Prints the public\n"
                   "key and its fingerprint: give the public key to your users for 'tk trust add'.\n",
                   USAGE);
            return TK_EXIT_OK;
        } else if (argv[i][0] == '-') {
            return tk_cli_unknown_option(USAGE, argv[i]);
        } else if (!path) {
            path = argv[i];
        } else {
            return tk_cli_usage(USAGE, "one key file");
        }
    }
    if (!path)
        return tk_cli_usage(USAGE,
                            "where should the private key go? for example: tk keygen ~/.config/tk/publisher.key");
    char *pub = NULL, *id = NULL;
    int rc = tk_keygen(&pub, path);
    if (rc == TK_OK)
        rc = tk_key_fingerprint(&id, pub);
    if (rc != TK_OK) {
        tk_free(pub);
        return tk_cli_fail(cli, rc, NULL);
    }
    if (cli->json)
        printf("{\"private_key\": \"%s\", \"pubkey\": \"%s\", \"keyid\": \"%s\"}\n", path, pub, id);
    else
        printf("private key  %s (keep it secret)\npublic key   %s\nfingerprint  %s\n\n"
               "users trust it with:  tk trust add <org> %s\n",
               path, pub, id, pub);
    tk_free(pub);
    tk_free(id);
    return TK_EXIT_OK;
}
