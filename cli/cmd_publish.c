/*
 * cmd_publish.c — tk publish: sign a package directory into a static registry tree (--to), or upload it
 * to a `tk serve` registry (--registry).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

static const char *USAGE =
    "tk publish <pkgdir> (--to <registry-dir> | --registry <url> [--token T]) --key <key-file> "
    "[--zstd] [--arch A,B | --no-compile]\n       tk publish <pkgdir> --check [--arch sm_80,sm_90]";

int tk_cmd_check(tk_cli *cli, int argc, char **argv);

/* tk publish --help, after the usage line. */
static const char HELP[] =
    "Reads <pkgdir>/kernel.json and the sources beside it, writes the signed manifest, its\n"
    "signature and a deterministic source archive into <registry-dir> under a new commit, and\n"
    "moves branch v<major> to it. Older commits stay (history). The tree has the Hub's URL\n"
    "layout, so nginx, object storage or a CDN can serve it as plain files (docs/registry.md).\n"
    "It also holds what the Hub's own client reads (huggingface_hub: snapshot_download,\n"
    "list_repo_tree...): the file listings of every commit and branch, and the .etag links\n"
    "from which nginx sends X-Repo-Commit and ETag (docs/nginx-registry.conf).\n"
    "Publishing identical content again changes nothing (but writes what a tree from an older\n"
    "tk lacks: parents, listings, links); a changed package needs a higher\n"
    "version.\n\n"
    "With --registry URL the same signed version is uploaded to a 'tk serve' registry instead\n"
    "(PUT URL/api/upload/ORG/NAME with a bearer token). The server checks the signature\n"
    "against its own trust store, the digests and the archive rules, and writes the version\n"
    "atomically; it prints the commit the server wrote.\n\n"
    "Before it signs anything, it runs every check 'tk get' runs at install (each key of\n"
    "kernel.json, with line, column and \"did you mean\"; each kernel's source, params, dtypes\n"
    "and launch expressions) and compiles every kernel with NVRTC, for --arch, else\n"
    "config.json's \"archs\", else sm_80 and sm_90 (a kernel whose constraints rule those out\n"
    "is compiled for its own min_cc). It refuses the package, writing and uploading nothing,\n"
    "when a check or a compile fails, and prints NVRTC's file:line. Without NVRTC on the\n"
    "machine it publishes with a warning that nothing was compiled. --check runs the checks\n"
    "and the compile instead of publishing (the same as 'tk check <pkgdir>').\n\n"
    "options:\n"
    "  --to DIR        the registry tree (created if missing)\n"
    "  --registry URL  a 'tk serve' registry (http:// or https://)\n"
    "  --token T       the upload token for the package's org (default: TK_TOKEN); the\n"
    "                  registry's operator makes one with 'tk serve token add --org ORG'\n"
    "  --key FILE      the publisher's private key from 'tk keygen' (or TK_PUBLISH_KEY)\n"
    "  --zstd          compress the archive with zstd instead of gzip\n"
    "  --arch ARCHS    compile for these (comma-separated: sm_80,sm_90a) before signing\n"
    "  --no-compile    do not compile before signing (the manifest checks still run)\n"
    "  --check         check and compile only (--arch ARCHS, default sm_80,sm_90); see tk check\n"
    "  --json          print {\"commit\": ..., \"created\": ...}\n\n"
    "examples:\n"
    "  tk publish ./my-kernels --to /srv/registry --key ~/.config/tk/publisher.pem\n"
    "  TK_TOKEN=tks_... tk publish ./my-kernels --registry https://kernels.example.com --key k.pem\n\n"
    "exit status: 0 ok, 2 bad arguments, 4 network, 5 a bad kernel.json, or the signature,\n"
    "trust, digest or version refused, 6 file system, 7 a kernel does not compile, 8 the\n"
    "registry refused the token (401/403), 1 other.\n";

/* tk publish DIR --check [--arch A] is tk check DIR [--arch A]: publish's own options (where it would
 * go, the key) are dropped, as nothing is published. argv[at] is --check. */
static int as_check(tk_cli *cli, int argc, char **argv, int at)
{
    char *args[64];
    int n = 0;
    for (int j = 0; j < argc && n < 63; j++) {
        if (j == at || !strcmp(argv[j], "--zstd"))
            continue;
        if (!strcmp(argv[j], "--to") || !strcmp(argv[j], "--key") || !strcmp(argv[j], "--registry") ||
            !strcmp(argv[j], "--token")) {
            j++;
            continue;
        }
        args[n++] = argv[j];
    }
    args[n] = NULL;
    return tk_cmd_check(cli, n, args);
}

int tk_cmd_publish(tk_cli *cli, int argc, char **argv)
{
    const char *dir = NULL, *to = NULL, *registry = NULL, *token = NULL, *key = getenv("TK_PUBLISH_KEY");
    const char *archs[64];
    char archbuf[1024]; /* --arch's value, split in place */
    size_t narchs = 0;
    tk_publish_opts o = TK_PUBLISH_OPTS_INIT;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--check"))
            return as_check(cli, argc, argv, i);
    for (int i = 1; i < argc; i++) {
        if (tk_cli_is_help(argv[i])) {
            printf("usage: %s\n\n%s", USAGE, HELP);
            return TK_EXIT_OK;
        } else if (!strcmp(argv[i], "--to") || !strcmp(argv[i], "--key") || !strcmp(argv[i], "--registry") ||
                   !strcmp(argv[i], "--token")) {
            if (i + 1 >= argc)
                return tk_cli_usage(USAGE, "%s needs a value", argv[i]);
            if (!strcmp(argv[i], "--to"))
                to = argv[++i];
            else if (!strcmp(argv[i], "--registry"))
                registry = argv[++i];
            else if (!strcmp(argv[i], "--token"))
                token = argv[++i];
            else
                key = argv[++i];
        } else if (!strcmp(argv[i], "--zstd")) {
            o.compression = "zst";
        } else if (!strcmp(argv[i], "--no-compile")) {
            o.no_compile = 1;
        } else if (!strcmp(argv[i], "--arch") || !strncmp(argv[i], "--arch=", 7)) {
            const char *v = argv[i][6] == '=' ? argv[i] + 7 : (++i < argc ? argv[i] : NULL);
            if (!v || !*v || narchs || strlen(v) >= sizeof archbuf)
                return tk_cli_usage(USAGE, "--arch needs one value such as sm_80,sm_90");
            snprintf(archbuf, sizeof archbuf, "%s", v);
            char *save = NULL;
            for (char *t = strtok_r(archbuf, ",", &save); t && narchs < 64; t = strtok_r(NULL, ",", &save))
                archs[narchs++] = t;
        } else if (argv[i][0] == '-') {
            return tk_cli_unknown_option(USAGE, argv[i]);
        } else if (!dir) {
            dir = argv[i];
        } else {
            return tk_cli_usage(USAGE, "one package directory at a time");
        }
    }
    if (!dir || (!to && !registry))
        return tk_cli_usage(USAGE, "need a package directory and --to DIR or --registry URL");
    if (to && registry)
        return tk_cli_usage(USAGE, "--to and --registry are exclusive: publish to one place at a time");
    if (!key)
        return tk_cli_usage(USAGE, "need --key (make one with 'tk keygen')");
    if (o.no_compile && narchs)
        return tk_cli_usage(USAGE, "--arch names what to compile for; it makes no sense with --no-compile");
    o.key_path = key;
    o.archs = narchs ? archs : NULL;
    o.narchs = narchs;
    tk_ctx *ctx = tk_cli_ctx(cli);
    if (!ctx)
        return TK_EXIT_FAIL;
    char *commit = NULL;
    int created = 1;
    int rc = registry ? tk_publish_upload(&commit, &created, ctx, dir, registry, token, &o)
                      : tk_publish(&commit, ctx, dir, to, &o);
    if (rc != TK_OK)
        return tk_cli_fail(cli, rc, dir);
    if (cli->json)
        printf("{\"commit\": \"%s\", \"created\": %s}\n", commit, created ? "true" : "false");
    else if (registry && !cli->quiet)
        printf("%s %s (%s)\n", created ? "published" : "already published", commit, registry);
    else
        printf("%s\n", commit);
    tk_free(commit);
    return TK_EXIT_OK;
}
