/*
 * cmd_get.c — tk get: resolve, download, verify and install packages (or exactly what tk.lock pins).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"

static const char *USAGE = "tk get [--trust] [--force] [--arch LIST] [--no-build] [--json] <org/name[@version]>...\n"
                           "       tk get --locked [FILE]";

static void help(void)
{
    printf("usage: %s\n"
           "\n"
           "Downloads each package from the registry, checks its Ed25519 signature against the trust store,\n"
           "checks the archive's sha256, unpacks it under strict rules (regular files only, no '..', bounded\n"
           "size) and verifies every file against the signed manifest. Nothing is installed unless all\n"
           "checks pass. A package already installed at the resolved commit is not downloaded again.\n"
           "\n"
           "references:\n"
           "  org/name           the highest major version (you are told which)\n"
           "  org/name@2         major version 2 (branch v2); @v2 also works\n"
           "  org/name@1.2.0     exactly 1.2.0 (a yanked version installs, with a warning)\n"
           "  org/name@'>=1.2,<2'  the newest version not yanked in the range (>=, >, <=, <, =;\n"
           "                     comma = and); see 'tk versions --help'\n"
           "  org/name@<commit>  exactly that 40-hex commit\n"
           "\n"
           "options:\n"
           "  --trust         first contact: accept and remember the signer of an org that has no\n"
           "                  trusted key yet (prints its fingerprint). An org with a key never gains\n"
           "                  another this way: rotate keys with 'tk trust add'\n"
           "  --force         download and install again even if installed\n"
           "  --arch LIST     after installing, compile for these archs (sm_80,sm_90); default: the\n"
           "                  GPUs found, else \"archs\" in config.json, else nothing\n"
           "  --no-build      install only; compile nothing\n"
           "  --locked [FILE] install exactly the commits and manifest digests FILE pins (default tk.lock)\n"
           "  --json          print the installed packages as JSON\n"
           "  --offline       resolve from installed packages only\n"
           "\n"
           "examples:\n"
           "  tk get kernels-community/activation\n"
           "  tk get kernels-community/activation@1 --json\n"
           "  TK_ENDPOINT=https://registry.example.com tk get acme/fused-norm --trust\n",
           USAGE);
}

/* --json: the packages' objects collect here and are printed only when every get succeeded, so
 * stdout holds either the array or the error object (docs/json.md). */
static FILE *json_out;

static void print_pkg(tk_cli *cli, const tk_pkg *p, int *first)
{
    if (cli->json) {
        char *j = NULL;
        if (tk_pkg_to_json(&j, p) == TK_OK)
            fprintf(json_out ? json_out : stdout, "%s%s", *first ? "" : ",\n", j);
        tk_free(j);
        *first = 0;
        return;
    }
    size_t nk = 0;
    const char *m = tk_pkg_manifest(p);
    for (const char *s = m; (s = strstr(s, "\"symbol\"")) != NULL; s++)
        nk++;
    printf("%s %s %s (v%d, commit %.12s)\n", tk_pkg_fresh(p) ? "installed" : "up to date:", tk_pkg_name(p),
           tk_pkg_version(p), tk_pkg_major(p), tk_pkg_commit(p));
    printf("  license %s, %zu files, %zu kernels, signed by %s\n", tk_pkg_license(p), tk_pkg_file_count(p), nk,
           tk_pkg_signer(p));
    for (size_t i = 0; i < tk_pkg_file_count(p); i++)
        printf("  %-28s %8lld bytes  sha256 %.16s…\n", tk_pkg_file_path(p, i), (long long)tk_pkg_file_size(p, i),
               tk_pkg_file_sha256(p, i));
}

/* Compiles an installed package right after the get: for the given archs, else the GPUs found,
 * else the config's archs. No GPU and no archs is not an error: the install stands. */
static int build_after_get(tk_cli *cli, const tk_pkg *p, const char *arch_list)
{
    char ref[256], archbuf[256];
    const char *archs[16];
    size_t narchs = 0;
    snprintf(ref, sizeof ref, "%s@%s", tk_pkg_name(p), tk_pkg_commit(p));
    if (arch_list) {
        snprintf(archbuf, sizeof archbuf, "%s", arch_list);
        for (char *s = archbuf, *tok; (tok = strsep(&s, ",")) != NULL && narchs < 16;)
            if (*tok)
                archs[narchs++] = tok;
    }
    tk_build_opts bo = TK_BUILD_OPTS_INIT;
    bo.archs = narchs ? archs : NULL;
    bo.narchs = narchs;
    size_t compiled = 0, cached = 0;
    int rc = tk_build(cli->ctx, ref, &bo, &compiled, &cached);
    /* The "no GPU" hint is shown once per machine state: a marker in the cache directory records
     * that it was; a build that succeeds (a GPU or archs appeared) removes it, so the hint comes back
     * if the machine loses them again. -v shows it every time. */
    char marker[4096];
    snprintf(marker, sizeof marker, "%s/no-gpu-hint-shown", tk_ctx_cache_dir(cli->ctx));
    if (rc == TK_ERR_INVALID && !arch_list) {
        if (cli->verbose || access(marker, F_OK) != 0) {
            tk_cli_info(cli, "tk: no GPU found and no archs configured, so nothing was compiled\n"
                             "HINT: 'tk get --arch sm_90 ...', or set \"archs\" in config.json to compile ahead of "
                             "time (this hint is shown once; 'tk doctor' shows the state)\n");
            FILE *f = fopen(marker, "w");
            if (f)
                fclose(f);
        }
        return TK_OK;
    }
    if (rc == TK_OK)
        unlink(marker);
    if (rc == TK_ERR_NO_NVRTC) {
        fprintf(stderr, "tk: warning: installed, but not compiled: %s\n", tk_last_error());
        return TK_OK;
    }
    if (rc != TK_OK)
        return rc;
    if (!cli->json)
        printf("  compiled %zu kernel binar%s, %zu from the cache\n", compiled, compiled == 1 ? "y" : "ies", cached);
    return TK_OK;
}

struct lock_cb {
    tk_cli *cli;
    int first;
};

static void each_locked(void *user, const tk_pkg *p)
{
    struct lock_cb *cb = user;
    print_pkg(cb->cli, p, &cb->first);
}

int tk_cmd_get(tk_cli *cli, int argc, char **argv)
{
    tk_get_opts o = TK_GET_OPTS_INIT;
    const char *refs[256];
    size_t nrefs = 0;
    const char *locked = NULL, *arch_list = NULL;
    int no_build = 0;
    for (int i = 1; i < argc; i++) {
        if (tk_cli_is_help(argv[i])) {
            help();
            return TK_EXIT_OK;
        } else if (!strcmp(argv[i], "--trust")) {
            o.trust_unknown = 1;
        } else if (!strcmp(argv[i], "--force")) {
            o.force = 1;
        } else if (!strcmp(argv[i], "--no-build")) {
            no_build = 1;
        } else if (!strcmp(argv[i], "--arch")) {
            if (++i >= argc)
                return tk_cli_usage(USAGE, "--arch needs a list such as sm_80,sm_90");
            arch_list = argv[i];
        } else if (!strcmp(argv[i], "--locked")) {
            locked = (i + 1 < argc && argv[i + 1][0] != '-' && !strchr(argv[i + 1], '/')) ||
                             (i + 1 < argc && strstr(argv[i + 1], ".lock"))
                         ? argv[++i]
                         : "tk.lock";
        } else if (argv[i][0] == '-') {
            return tk_cli_usage(USAGE, "unknown option '%s'", argv[i]);
        } else if (nrefs < sizeof refs / sizeof *refs) {
            refs[nrefs++] = argv[i];
        } else {
            return tk_cli_usage(USAGE, "too many packages on one line");
        }
    }
    if (!locked && nrefs == 0)
        return tk_cli_usage(USAGE, "which package? for example: tk get kernels-community/activation");
    if (locked && nrefs)
        return tk_cli_usage(USAGE, "--locked installs what the lock file pins; give no package names with it");
    tk_ctx *ctx = tk_cli_ctx(cli);
    if (!ctx)
        return TK_EXIT_FAIL;
    int first = 1;
    char *jbuf = NULL;
    size_t jlen = 0;
    if (cli->json && !(json_out = open_memstream(&jbuf, &jlen))) {
        perror("tk: open_memstream");
        return TK_EXIT_FAIL;
    }
    int rc = TK_OK;
    if (locked) {
        struct lock_cb cb = {cli, 1};
        rc = tk_lock_install(ctx, locked, &o, each_locked, &cb);
        first = cb.first;
    } else {
        for (size_t i = 0; i < nrefs && rc == TK_OK; i++) {
            tk_pkg *p = NULL;
            if ((rc = tk_pkg_get(&p, ctx, refs[i], &o)) == TK_OK) {
                print_pkg(cli, p, &first);
                if (!no_build)
                    rc = build_after_get(cli, p, arch_list);
            }
            tk_pkg_free(p);
        }
    }
    if (cli->json) {
        fclose(json_out);
        json_out = NULL;
        if (rc == TK_OK)
            printf("[%s%s]\n", jbuf ? jbuf : "", first ? "" : "\n");
        free(jbuf);
    }
    if (rc != TK_OK)
        return tk_cli_fail(cli, rc, NULL);
    return TK_EXIT_OK;
}
