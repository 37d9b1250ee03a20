/*
 * cmd_serve.c — tk serve: run the registry server over a tree, and manage its upload tokens and
 * trusted publisher keys.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "cli/cli.h"

static const char *USAGE =
    "tk serve --root DIR [--listen HOST:PORT] [options]\n"
    "       tk serve token add ORG --root DIR | token list --root DIR | token revoke ID --root DIR\n"
    "       tk serve trust add ORG PUBKEY --root DIR | trust list --root DIR |\n"
    "       tk serve trust remove ORG KEYID --root DIR";

static void help(void)
{
    printf(
        "usage: %s\n"
        "\n"
        "Serves the registry tree DIR (the layout 'tk publish --to DIR' writes) over HTTP with the\n"
        "Hugging Face Hub's kernel API, so 'tk get' (TK_ENDPOINT=http://HOST:PORT) and the Hub's own client\n"
        "can read it, accepts signed uploads from publishers holding a token, and shows the packages as a\n"
        "web page at '/'. It runs until SIGINT or SIGTERM and logs one line per request to stderr.\n"
        "\n"
        "Endpoints:\n"
        "  GET  /api/kernels/ORG/NAME                 package info (sha, siblings), like the Hub\n"
        "  GET  /api/kernels/ORG/NAME/revision/REV    the same at a branch (v1, main) or a 40-hex commit\n"
        "  GET  /api/kernels/ORG/NAME/refs            branches and their commits\n"
        "  GET  /api/kernels/ORG/NAME/tree/REV        the files of a revision with size and sha256 (oid)\n"
        "  GET  /kernels/ORG/NAME/resolve/REV/FILE    a file; ETag (sha256), X-Repo-Commit, Range and\n"
        "                                             If-None-Match are supported; HEAD too\n"
        "  PUT  /api/upload/ORG/NAME                  publish a version: 'Authorization: Bearer TOKEN' and\n"
        "                                             a plain tar of manifest.json, manifest.json.sig and\n"
        "                                             the source archive (what 'tk publish --to' wrote)\n"
        "  GET  /                                     HTML list of packages, versions, ops, signers\n"
        "Errors are 404 with X-Error-Code RepoNotFound, RevisionNotFound or EntryNotFound; uploads answer\n"
        "401 (no or bad token), 403 (token of another org, or a signer not trusted here), 413 (too big),\n"
        "422 (bad signature, manifest, digest or archive), 409 (version not newer than its branch).\n"
        "\n"
        "An upload is checked as a client would check it (signature by a key trusted for the org on this\n"
        "server, manifest, archive digest, safe-unpack rules) before it enters the tree, atomically.\n"
        "\n"
        "options:\n"
        "  --root DIR           the registry tree (created if missing); state in DIR/.tk-serve/\n"
        "  --listen HOST:PORT   address to bind (default 127.0.0.1:8080; [::1]:8080 for IPv6; port 0\n"
        "                       picks a free one). Put a TLS proxy in front for anything but localhost.\n"
        "  --threads N          worker threads (default 4)\n"
        "  --max-connections N  open connections in all (default 256)\n"
        "  --max-per-ip N       open connections from one address (default 32)\n"
        "  --timeout S          close a connection idle or stalled for S seconds (default 30)\n"
        "  --max-upload BYTES   largest upload accepted (default 536870912)\n"
        "\n"
        "subcommands (ORG may also be given as --org ORG):\n"
        "  token add ORG --root DIR\n"
        "      prints a new upload token for ORG once; the server keeps only its sha256. Publishers send\n"
        "      it as 'Authorization: Bearer TOKEN' (or TK_TOKEN). A token writes only to its org.\n"
        "  token list --root DIR\n"
        "      the tokens: ID (16 hex digits of the token's sha256), org and creation time.\n"
        "  token revoke ID --root DIR\n"
        "      refuses that token from now on (the ID as listed, or the token itself).\n"
        "  trust add ORG PUBKEY --root DIR\n"
        "      lets the key PUBKEY (ed25519:<64 hex>, or the KEY.pub file 'tk keygen' wrote) sign\n"
        "      uploads for ORG; the same syntax as 'tk trust add ORG PUBKEY' on a client.\n"
        "  trust list --root DIR\n"
        "      the keys trusted for uploads, per org.\n"
        "  trust remove ORG KEYID --root DIR\n"
        "      stops trusting the key (its key id SHA256:..., or its public key) for ORG.\n"
        "  With --json each prints JSON (docs/json.md).\n"
        "\n"
        "example:\n"
        "  tk serve trust add myorg \"$(cat key.pub)\" --root /srv/reg\n"
        "  TOKEN=$(tk serve token add myorg --root /srv/reg)\n"
        "  tk serve --root /srv/reg --listen 127.0.0.1:8080 &\n"
        "  tk publish ./mypkg --to /tmp/out --key key\n"
        "  (cd /tmp/out/kernels/myorg/mypkg/resolve/v1 && tar cf - manifest.json manifest.json.sig source.tar.gz) |\n"
        "    curl -fsS -T - -H \"Authorization: Bearer $TOKEN\" http://127.0.0.1:8080/api/upload/myorg/mypkg\n",
        USAGE);
}

static int uint_arg(unsigned *out, const char *opt, const char *v)
{
    char *end = NULL;
    unsigned long n = strtoul(v, &end, 10);
    if (!*v || *end || n == 0 || n > 1000000) {
        tk_cli_usage(USAGE, "%s needs a positive number (got '%s')", opt, v);
        return -1;
    }
    *out = (unsigned)n;
    return 0;
}

static void log_line(void *user, int level, const char *msg)
{
    tk_cli *cli = user;
    if (cli->quiet && level < TK_LOG_WARN)
        return;
    /* The timestamp changes once a second: each thread formats it then. No printf on this path, a line
     * a request (see access_log in hub/serve.c). */
    static __thread time_t last = -1;
    static __thread char ts[24];
    time_t now = time(NULL);
    if (now != last) {
        struct tm tm;
        gmtime_r(&now, &tm);
        strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ ", &tm);
        last = now;
    }
    char line[1200];
    size_t n = 0;
    const char *parts[] = {ts, level >= TK_LOG_WARN ? "warning: " : "", msg};
    for (size_t i = 0; i < 3; i++) {
        size_t k = strlen(parts[i]);
        if (k > sizeof line - 1 - n)
            k = sizeof line - 1 - n;
        memcpy(line + n, parts[i], k);
        n += k;
    }
    line[n++] = '\n';
    /* One fwrite per line: stdio locks the stream, so lines from the server's threads never mix. */
    fwrite(line, 1, n, stderr);
}

/* tk serve token add|list|revoke, tk serve trust add|list|remove: the server's state under --root.
 * Positional arguments follow 'tk trust' (ORG PUBKEY); --org ORG is accepted too. */
static int print_json_list(tk_cli *cli, const char *j, int is_token)
{
    if (cli->json) {
        printf("%s\n", j);
        return TK_EXIT_OK;
    }
    json_t *a = json_loads(j, 0, NULL), *e;
    size_t i;
    if (!json_array_size(a))
        tk_cli_info(cli, is_token ? "no upload tokens\n" : "no trusted keys\n");
    else if (is_token)
        printf("%-16s  %-24s  %s\n", "ID", "ORG", "CREATED");
    else
        printf("%-24s  %-39s  %s\n", "ORG", "KEYID", "PUBKEY");
    json_array_foreach(a, i, e) {
        if (is_token) {
            char when[64] = "";
            time_t t = (time_t)json_integer_value(json_object_get(e, "created"));
            strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", gmtime(&t));
            printf("%-16s  %-24s  %s\n", json_string_value(json_object_get(e, "id")),
                   json_string_value(json_object_get(e, "org")), when);
        } else {
            printf("%-24s  %-39s  %s\n", json_string_value(json_object_get(e, "org")),
                   json_string_value(json_object_get(e, "keyid")), json_string_value(json_object_get(e, "pubkey")));
        }
    }
    json_decref(a);
    return TK_EXIT_OK;
}

static int admin(tk_cli *cli, int argc, char **argv)
{
    const char *what = argv[0], *verb = argc >= 2 ? argv[1] : "", *org = NULL, *root = NULL;
    const char *pos[2] = {NULL, NULL};
    int npos = 0;
    int is_token = !strcmp(what, "token");
    if (strcmp(verb, "add") && strcmp(verb, "list") && strcmp(verb, is_token ? "revoke" : "remove"))
        return tk_cli_usage(USAGE, "'tk serve %s' takes add, list or %s", what, is_token ? "revoke" : "remove");
    for (int i = 2; i < argc; i++) {
        if (tk_cli_is_help(argv[i])) {
            help();
            return TK_EXIT_OK;
        } else if (!strcmp(argv[i], "--org") || !strcmp(argv[i], "--root")) {
            if (i + 1 >= argc)
                return tk_cli_usage(USAGE, "%s needs a value", argv[i]);
            if (!strcmp(argv[i], "--org"))
                org = argv[++i];
            else
                root = argv[++i];
        } else if (argv[i][0] == '-') {
            return tk_cli_unknown_option(USAGE, argv[i]);
        } else if (npos < 2) {
            pos[npos++] = argv[i];
        } else {
            return tk_cli_usage(USAGE, "unexpected argument '%s'", argv[i]);
        }
    }
    if (!root)
        return tk_cli_usage(USAGE, "'tk serve %s %s' needs --root DIR (the served tree)", what, verb);
    /* ORG as the first positional argument, as in 'tk trust add ORG PUBKEY' */
    int want_org = !strcmp(verb, "add") || (!is_token && !strcmp(verb, "remove"));
    if (want_org && !org && npos > (is_token ? 0 : 1)) {
        org = pos[0];
        pos[0] = pos[1];
        npos--;
    }
    int rc;
    if (!strcmp(verb, "list")) {
        if (npos)
            return tk_cli_usage(USAGE, "unexpected argument '%s'", pos[0]);
        char *j = NULL;
        rc = is_token ? tk_serve_token_list_json(&j, root) : tk_serve_trust_list_json(&j, root);
        if (rc != TK_OK)
            return tk_cli_fail(cli, rc, root);
        int ec = print_json_list(cli, j, is_token);
        tk_free(j);
        return ec;
    }
    if (is_token && !strcmp(verb, "revoke")) {
        if (npos != 1)
            return tk_cli_usage(USAGE, "'tk serve token revoke' takes one token id ('tk serve token list' shows them)");
        if ((rc = tk_serve_token_revoke(root, pos[0])) != TK_OK)
            return tk_cli_fail(cli, rc, NULL);
        if (cli->json)
            printf("{\"revoked\": \"%s\"}\n", pos[0]);
        else
            tk_cli_info(cli, "tk: token %s revoked: uploads with it are refused from now on\n", pos[0]);
        return TK_EXIT_OK;
    }
    if (!org)
        return tk_cli_usage(USAGE, "'tk serve %s %s' needs the org", what, verb);
    if (!strcmp(verb, "remove")) {
        if (npos != 1)
            return tk_cli_usage(USAGE, "'tk serve trust remove ORG KEYID' takes the key id or public key");
        if ((rc = tk_serve_trust_remove(root, org, pos[0])) != TK_OK)
            return tk_cli_fail(cli, rc, NULL);
        if (cli->json)
            printf("{\"org\": \"%s\", \"removed\": \"%s\"}\n", org, pos[0]);
        else
            tk_cli_info(cli, "tk: uploads for org '%s' signed by %s are no longer accepted\n", org, pos[0]);
        return TK_EXIT_OK;
    }
    if (is_token) {
        if (npos)
            return tk_cli_usage(USAGE, "unexpected argument '%s'", pos[0]);
        char *token = NULL;
        rc = tk_serve_token_add(&token, root, org);
        if (rc != TK_OK)
            return tk_cli_fail(cli, rc, root);
        if (cli->json)
            printf("{\"org\": \"%s\", \"token\": \"%s\"}\n", org, token);
        else
            printf("%s\n", token);
        tk_cli_info(cli, "tk: the token above is shown once; it may publish to org '%s' only\n", org);
        tk_free(token);
        return TK_EXIT_OK;
    }
    if (npos != 1)
        return tk_cli_usage(USAGE, "'tk serve trust add ORG PUBKEY' needs the public key (ed25519:<64 hex>)");
    char *keyid = NULL, key[256];
    if ((rc = tk_cli_pubkey_arg(key, sizeof key, pos[0], USAGE)) != 0)
        return rc;
    rc = tk_serve_trust_add(&keyid, root, org, key);
    if (rc != TK_OK)
        return tk_cli_fail(cli, rc, pos[0]);
    if (cli->json)
        printf("{\"org\": \"%s\", \"keyid\": \"%s\"}\n", org, keyid);
    else
        tk_cli_info(cli, "tk: uploads for org '%s' signed by %s are now accepted\n", org, keyid);
    tk_free(keyid);
    return TK_EXIT_OK;
}

int tk_cmd_serve(tk_cli *cli, int argc, char **argv)
{
    tk_serve_opts o = TK_SERVE_OPTS_INIT;
    if (argc >= 2 && (!strcmp(argv[1], "token") || !strcmp(argv[1], "trust")))
        return admin(cli, argc - 1, argv + 1);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (tk_cli_is_help(a)) {
            help();
            return TK_EXIT_OK;
        }
        if (a[0] != '-')
            return tk_cli_usage(USAGE, "unexpected argument '%s'", a);
        if (i + 1 >= argc)
            return tk_cli_usage(USAGE, "%s needs a value", a);
        const char *v = argv[++i];
        unsigned n = 0;
        if (!strcmp(a, "--root")) {
            o.root = v;
        } else if (!strcmp(a, "--listen")) {
            o.listen = v;
        } else if (!strcmp(a, "--max-upload")) {
            char *end = NULL;
            long long m = strtoll(v, &end, 10);
            if (!*v || *end || m <= 0)
                return tk_cli_usage(USAGE, "--max-upload needs a positive number of bytes (got '%s')", v);
            o.max_upload = m;
        } else if (!strcmp(a, "--threads") || !strcmp(a, "--max-connections") || !strcmp(a, "--max-per-ip") ||
                   !strcmp(a, "--timeout")) {
            if (uint_arg(&n, a, v) != 0)
                return TK_EXIT_USAGE;
            if (!strcmp(a, "--threads"))
                o.threads = n;
            else if (!strcmp(a, "--max-connections"))
                o.max_connections = n;
            else if (!strcmp(a, "--max-per-ip"))
                o.max_per_ip = n;
            else
                o.timeout_s = n;
        } else {
            return tk_cli_unknown_option(USAGE, a);
        }
    }
    if (!o.root)
        return tk_cli_usage(USAGE, "need --root DIR (the registry tree to serve)");
    o.log = log_line;
    o.log_user = cli;

    /* The server's threads inherit this mask: SIGINT/SIGTERM reach only sigwait below, and a client
     * that hangs up never kills the process with SIGPIPE. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    tk_server *srv = NULL;
    int rc = tk_server_new(&srv, &o);
    if (rc != TK_OK)
        return tk_cli_fail(cli, rc, o.listen ? o.listen : "127.0.0.1:8080");
    /* The URL clients use, on stdout (one line, flushed) so a script can read it, with the port the
     * system chose for port 0; a wildcard host (":0", "0.0.0.0", "[::]") is reached through loopback. */
    const char *listen = o.listen ? o.listen : "127.0.0.1:8080";
    const char *colon = strrchr(listen, ':');
    char host[300];
    snprintf(host, sizeof host, "%.*s", (int)(colon - listen), listen);
    if (!host[0] || !strcmp(host, "0.0.0.0") || !strcmp(host, "*"))
        snprintf(host, sizeof host, "127.0.0.1");
    else if (!strcmp(host, "[::]"))
        snprintf(host, sizeof host, "[::1]");
    char url[400];
    snprintf(url, sizeof url, "http://%s:%d", host, tk_server_port(srv));
    if (cli->json)
        printf("{\"url\": \"%s\"}\n", url);
    else
        printf("%s\n", url);
    fflush(stdout);
    fprintf(stderr, "tk serve: serving %s on %s (stop with Ctrl-C)\n", o.root, url);
    sigdelset(&set, SIGPIPE);
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "tk serve: %s, stopping\n", sig == SIGINT ? "interrupted" : "terminated");
    tk_server_free(srv);
    return TK_EXIT_OK;
}
