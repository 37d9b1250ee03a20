/*
 * cmd_get.c — tk get: resolve, download, verify and install packages (or exactly what tk.lock pins).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"

static const char *USAGE =
    "tk get [--trust] [--force] [--arch LIST] [--no-build] [--selftest] [--json] <org/name[@version]>...\n"
    "       tk get [--project FILE] [--locked [LOCKFILE]] [options]   (a project's packages)";

static void help(void)
{
    printf("NAME\n"
           "    tk get - download, verify and install kernel packages\n"
           "\n"
           "SYNOPSIS\n"
           "    %s\n"
           "\n"
           "DESCRIPTION\n"
           "    Downloads each package from its registry, checks its Ed25519 signature against the trust\n"
           "    store, checks the archive's sha256, unpacks it under strict rules (regular files only, no\n"
           "    '..', bounded size) and verifies every file against the signed manifest. Nothing is\n"
           "    installed unless all checks pass. A package already installed at the resolved commit is\n"
           "    not downloaded again.\n"
           "\n"
           "    With no package named, tk get installs the packages of the project file (tk.json in this\n"
           "    directory or one above it, or --project FILE; docs/project.md). Several packages - a\n"
           "    project's, a lock file's - install all or nothing: every one is resolved, downloaded and\n"
           "    verified into staging first, then all are recorded in one step, so a refused package leaves\n"
           "    the store exactly as it was.\n"
           "\n"
           "    Registries: a package comes from the registry named for it (the project file), else the\n"
           "    one config.json's \"registries\" scopes it to, else the one it was installed from, else the\n"
           "    first configured registry that has it. TK_ENDPOINT makes one registry serve everything.\n"
           "    'tk doctor' lists them.\n"
           "\n"
           "REFERENCES\n"
           "    org/name             the highest major version (you are told which)\n"
           "    org/name@2           major version 2 (branch v2); @v2 also works\n"
           "    org/name@1.2.0       exactly 1.2.0 (a yanked version installs, with a warning)\n"
           "    org/name@'>=1.2,<2'  the newest version not yanked in the range (>=, >, <=, <, =;\n"
           "                         comma = and); see 'tk versions --help'\n"
           "    org/name@<commit>    exactly that 40-hex commit\n"
           "\n"
           "OPTIONS\n"
           "    --trust            first contact: accept and remember the signer of an org that has no\n"
           "                       trusted key yet (prints its fingerprint). An org with a key never gains\n"
           "                       another this way: rotate keys with 'tk trust add'\n"
           "    --force            download and install again even if installed\n"
           "    --arch LIST        after installing, compile for these archs (sm_80,sm_90); default: the\n"
           "                       GPUs found, else \"archs\" in config.json, else nothing\n"
           "    --no-build         install only; compile nothing\n"
           "    --selftest         then prove every kernel on each GPU of this machine against tk's CPU\n"
           "                       references and record the result (as 'tk selftest'); kernels that fail\n"
           "                       are never used by tk_op_run. Exit 10 when one fails (the install stands),\n"
           "                       7 when there is no GPU to test on\n"
           "    --project FILE     the project file to use instead of looking for tk.json\n"
           "    --locked [FILE]    install exactly the commits, manifest digests, registries and signers\n"
           "                       the lock file pins (default: the project's tk.lock, which must match the\n"
           "                       project file; without a project, ./tk.lock)\n"
           "    --json             print the installed packages as a JSON array (docs/json.md)\n"
           "    --offline          resolve from installed packages only\n"
           "\n"
           "EXAMPLES\n"
           "    tk get kernels-community/activation\n"
           "    tk get kernels-community/activation@1 --json\n"
           "    tk get                      # the project's packages (tk.json)\n"
           "    tk get --locked             # exactly what tk.lock pins, all or nothing\n"
           "    TK_ENDPOINT=https://registry.example.com tk get acme/fused-norm --trust\n"
           "\n"
           "EXIT STATUS\n"
           "    0 ok, 2 usage or a bad project/lock file, 3 not found, 4 network, 5 refused (signature,\n"
           "    trust, digest, rollback), 6 local I/O, 7 --selftest without a GPU, 8 a kernel failed its\n"
           "    self-test.\n",
           USAGE);
}

/* --json: the packages' objects collect here and are printed only when every get succeeded, so
 * stdout holds either the array or the error object (docs/json.md). */
static FILE *json_out;

static void print_pkg(tk_cli *cli, const tk_pkg *p, int *first, json_t *selftests)
{
    if (cli->json) {
        char *j = NULL;
        if (tk_pkg_to_json(&j, p) == TK_OK && selftests) { /* its self-test reports beside it */
            json_t *o = json_loads(j, 0, NULL);
            tk_free(j);
            j = NULL;
            if (o && json_object_set(o, "selftest", selftests) == 0)
                j = json_dumps(o, JSON_INDENT(2));
            json_decref(o);
        }
        if (j)
            fprintf(json_out ? json_out : stdout, "%s%s", *first ? "" : ",\n", j);
        free(j);
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

struct each_cb {
    tk_cli *cli;
    int first;
    int no_build;
    const char *arch_list;
    int rc; /* the first build failure */
    int selftest; /* --selftest */
    int st_failed; /* packages with a kernel that failed it */
    int st_rc;     /* the first self-test that could not run (no GPU, ...) */
};

/* {"error": {"status", "exit_code", "message", "hint"}} for a self-test that could not run. */
static json_t *error_json(int status, const char *msg)
{
    const char *h = strstr(msg, "\nHINT: ");
    json_t *e = json_pack("{s:s, s:i, s:s%, s:o}", "status", status == TK_ERR_NO_DEVICE ? "no_device" : "failed",
                          "exit_code", tk_cli_exit_code(status), "message", msg, h ? (size_t)(h - msg) : strlen(msg),
                          "hint", h ? json_string(h + 7) : json_null());
    return json_pack("{s:o}", "error", e);
}

/* --selftest: the package's kernels proved on each GPU (tk_selftest); the reports as a JSON array. */
static json_t *selftest_pkg(struct each_cb *cb, const tk_pkg *p)
{
    int ndev = 0, rc = tk_device_count(&ndev);
    json_t *reports = json_array();
    char ref[256];
    snprintf(ref, sizeof ref, "%s@%s", tk_pkg_name(p), tk_pkg_commit(p));
    if (rc == TK_OK && ndev == 0)
        rc = TK_ERR_NO_DEVICE;
    if (rc != TK_OK) {
        json_array_append_new(reports, error_json(TK_ERR_NO_DEVICE, "no GPU to self-test on\nHINT: run 'tk selftest "
                                                                    "ORG/NAME' on the machine with the GPU"));
        if (cb->st_rc == TK_OK) {
            cb->st_rc = TK_ERR_NO_DEVICE;
            if (!cb->cli->json)
                fprintf(stderr,
                        "tk: --selftest: no GPU to test on (%s is installed)\nHINT: run 'tk selftest %s' on the "
                        "machine with the GPU; 'tk doctor' shows this one\n",
                        tk_pkg_name(p), tk_pkg_name(p));
        }
        return reports;
    }
    for (int d = 0; d < ndev; d++) {
        tk_selftest_opts o = TK_SELFTEST_OPTS_INIT;
        char *report = NULL;
        o.device = d;
        rc = tk_selftest(&report, cb->cli->ctx, ref, &o);
        if (report) {
            json_t *r = json_loads(report, 0, NULL);
            if (!cb->cli->json && r) {
                json_t *c = json_object_get(r, "counts"), *k;
                size_t i;
                printf(
                    "  selftest on %s (cuda:%d): %lld passed, %lld failed, %lld crashed, %lld timed out, %lld untested "
                    "(%.2f s)\n",
                    json_string_value(json_object_get(json_object_get(r, "device"), "name")), d,
                    (long long)json_integer_value(json_object_get(c, "passed")),
                    (long long)json_integer_value(json_object_get(c, "failed")),
                    (long long)json_integer_value(json_object_get(c, "crashed")),
                    (long long)json_integer_value(json_object_get(c, "timed_out")),
                    (long long)json_integer_value(json_object_get(c, "untested")),
                    json_real_value(json_object_get(r, "seconds")));
                json_array_foreach(json_object_get(r, "kernels"), i, k) {
                    const char *st = json_string_value(json_object_get(k, "status"));
                    if (strcmp(st, "passed") && strcmp(st, "untested") && strcmp(st, "skipped"))
                        printf("    %s %s: %s\n", st, json_string_value(json_object_get(k, "kernel")),
                               json_string_value(json_object_get(json_object_get(k, "detail"), "summary")));
                }
            }
            if (r)
                json_array_append_new(reports, r);
            tk_free(report);
        } else {
            json_array_append_new(reports, error_json(rc, tk_last_error()));
            if (!cb->cli->json)
                fprintf(stderr, "tk: --selftest %s on cuda:%d: %s\n", tk_pkg_name(p), d, tk_last_error());
            if (cb->st_rc == TK_OK)
                cb->st_rc = rc;
        }
        if (rc == TK_ERR_SELFTEST) {
            cb->st_failed++;
            break;
        }
    }
    return reports;
}

static void each_pkg(void *user, const tk_pkg *p)
{
    struct each_cb *cb = user;
    if (cb->cli->json) { /* the object carries the reports: build and test first */
        if (!cb->no_build && cb->rc == TK_OK)
            cb->rc = build_after_get(cb->cli, p, cb->arch_list);
        json_t *st = cb->selftest && cb->rc == TK_OK ? selftest_pkg(cb, p) : NULL;
        print_pkg(cb->cli, p, &cb->first, st);
        json_decref(st);
        return;
    }
    print_pkg(cb->cli, p, &cb->first, NULL);
    if (!cb->no_build && cb->rc == TK_OK)
        cb->rc = build_after_get(cb->cli, p, cb->arch_list);
    if (cb->selftest && cb->rc == TK_OK)
        json_decref(selftest_pkg(cb, p));
}

/* The packages of a project (tk.json), all or nothing. */
static int get_project(tk_cli *cli, tk_ctx *ctx, tk_project *p, int locked, const tk_get_opts *o, struct each_cb *cb)
{
    if (!cli->quiet && !cli->json)
        fprintf(stderr, "tk: %s: %zu package%s%s\n", tk_project_path(p), tk_project_package_count(p),
                tk_project_package_count(p) == 1 ? "" : "s", locked ? ", as its tk.lock pins them" : "");
    return tk_project_get(ctx, p, locked, o, each_pkg, cb);
}

int tk_cmd_get(tk_cli *cli, int argc, char **argv)
{
    tk_get_opts o = TK_GET_OPTS_INIT;
    const char *refs[256];
    size_t nrefs = 0;
    const char *lockfile = NULL, *arch_list = NULL, *project = NULL;
    int no_build = 0, locked = 0, selftest = 0;
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
        } else if (!strcmp(argv[i], "--selftest")) {
            selftest = 1;
        } else if (!strcmp(argv[i], "--arch")) {
            if (++i >= argc)
                return tk_cli_usage(USAGE, "--arch needs a list such as sm_80,sm_90");
            arch_list = argv[i];
        } else if (!strcmp(argv[i], "--project")) {
            if (++i >= argc)
                return tk_cli_usage(USAGE, "--project needs a file (a tk.json)");
            project = argv[i];
        } else if (!strcmp(argv[i], "--locked")) {
            locked = 1;
            if ((i + 1 < argc && argv[i + 1][0] != '-' && !strchr(argv[i + 1], '/')) ||
                (i + 1 < argc && strstr(argv[i + 1], ".lock")))
                lockfile = argv[++i];
        } else if (argv[i][0] == '-') {
            return tk_cli_unknown_option(USAGE, argv[i]);
        } else if (nrefs < sizeof refs / sizeof *refs) {
            refs[nrefs++] = argv[i];
        } else {
            return tk_cli_usage(USAGE, "too many packages on one line");
        }
    }
    if (locked && nrefs)
        return tk_cli_usage(USAGE, "--locked installs what the lock file pins; give no package names with it");
    if (project && nrefs)
        return tk_cli_usage(USAGE, "--project installs the project's packages; give no package names with it");
    tk_ctx *ctx = tk_cli_ctx(cli);
    if (!ctx)
        return TK_EXIT_FAIL;
    char *jbuf = NULL;
    size_t jlen = 0;
    if (cli->json && !(json_out = open_memstream(&jbuf, &jlen))) {
        perror("tk: open_memstream");
        return TK_EXIT_FAIL;
    }
    struct each_cb cb = {cli, 1, no_build, arch_list, TK_OK, selftest, 0, TK_OK};
    int rc = TK_OK;
    tk_project *prj = NULL;
    if (!nrefs && !lockfile && (rc = tk_project_open(&prj, project)) == TK_ERR_NOT_FOUND && !project) {
        rc = TK_OK;
        if (!locked) { /* nothing named, no project */
            if (json_out)
                fclose(json_out);
            free(jbuf);
            return tk_cli_usage(USAGE, "which package? for example: tk get kernels-community/activation (or "
                                       "write a tk.json listing the project's packages: docs/project.md)");
        }
        lockfile = "tk.lock"; /* no project: ./tk.lock, as before projects */
    }
    if (rc != TK_OK) {
        /* the project file could not be read */
    } else if (lockfile) {
        rc = tk_lock_install(ctx, lockfile, &o, each_pkg, &cb);
    } else if (prj) {
        rc = get_project(cli, ctx, prj, locked, &o, &cb);
    } else {
        for (size_t i = 0; i < nrefs && rc == TK_OK && cb.rc == TK_OK; i++) {
            tk_pkg *p = NULL;
            if ((rc = tk_pkg_get(&p, ctx, refs[i], &o)) == TK_OK)
                each_pkg(&cb, p);
            tk_pkg_free(p);
        }
    }
    tk_project_free(prj);
    if (rc == TK_OK)
        rc = cb.rc;
    if (cli->json) {
        fclose(json_out);
        json_out = NULL;
        if (rc == TK_OK)
            printf("[%s%s]\n", jbuf ? jbuf : "", cb.first ? "" : "\n");
        free(jbuf);
    }
    if (rc != TK_OK)
        return tk_cli_fail(cli, rc, NULL);
    if (cb.st_failed) {
        if (!cli->json)
            fprintf(stderr,
                    "tk: installed, but %d package%s ha%s kernels that failed their self-test on this GPU: "
                    "tk_op_run will not use those kernels\nHINT: 'tk selftest --results' shows the standing\n",
                    cb.st_failed, cb.st_failed == 1 ? "" : "s", cb.st_failed == 1 ? "s" : "ve");
        return TK_EXIT_SELFTEST;
    }
    if (cb.st_rc != TK_OK)
        return tk_cli_exit_code(cb.st_rc);
    return TK_EXIT_OK;
}
