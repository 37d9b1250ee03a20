/*
 * cmd_check.c — tk check DIR (and tk publish DIR --check): every check a publish runs, plus an NVRTC
 * compile of every kernel for each arch, reporting each failure; nothing is signed or written.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

static const char *USAGE = "tk check <pkgdir> [--arch sm_80,sm_90] [--no-compile] [--jobs N] [--json]";

static const char *HELP =
    "NAME\n"
    "    tk check - check a package directory before publishing it\n"
    "\n"
    "SYNOPSIS\n"
    "    tk check PKGDIR [--arch ARCHS] [--no-compile] [--jobs N] [--json]\n"
    "    tk publish PKGDIR --check [--arch ARCHS]       (the same)\n"
    "\n"
    "DESCRIPTION\n"
    "    Runs every check 'tk publish' runs before it signs, which are the checks 'tk get' runs\n"
    "    at install: each key of kernel.json is one the format knows (a misspelt key is an error\n"
    "    with its line and column and a \"did you mean\"); name, version and license; each\n"
    "    kernel's source is a file of the directory; params, dtypes, launch-rule and constraint\n"
    "    expressions name only the kernel's params. Then it compiles every kernel with NVRTC for\n"
    "    each arch and reports every failing compile with the NVRTC log's file:line (a symbol\n"
    "    that the source does not declare is one line). It writes nothing: no signature, no\n"
    "    registry, no cache entry. No GPU is needed.\n"
    "\n"
    "OPTIONS\n"
    "    --arch ARCHS    comma-separated targets (sm_80, sm_90, sm_90a, ...). Default: sm_80,sm_90\n"
    "    --no-compile    the manifest checks only (what 'tk publish' runs)\n"
    "    --jobs N, -j N  at most N compiles at once (default: by cores and memory)\n"
    "    --json          print {\"ok\", \"dir\", \"compiled\", \"report\", \"error\"} on stdout, whether\n"
    "                    the check passes or not (docs/json.md)\n"
    "\n"
    "EXIT STATUS\n"
    "    0 the package is fine; 2 usage; 3 no such directory or kernel.json; 5 a manifest error;\n"
    "    7 a compile error or no NVRTC.\n"
    "\n"
    "EXAMPLES\n"
    "    tk check ./relu\n"
    "    tk check ./relu --arch sm_90a --jobs 2\n";

/* Shared with tk publish --check: argv holds only check's own options besides the directory. */
int tk_cmd_check(tk_cli *cli, int argc, char **argv)
{
    const char *dir = NULL, *archs[64];
    char *archbuf = NULL;
    size_t narchs = 0;
    tk_check_opts o = TK_CHECK_OPTS_INIT;
    o.compile = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (tk_cli_is_help(a)) {
            fputs(HELP, stdout);
            free(archbuf);
            return TK_EXIT_OK;
        } else if (!strcmp(a, "--arch") || !strncmp(a, "--arch=", 7)) {
            const char *v = a[6] == '=' ? a + 7 : (++i < argc ? argv[i] : NULL);
            if (!v || !*v || archbuf) {
                free(archbuf);
                return tk_cli_usage(USAGE, "--arch needs one value such as sm_80,sm_90");
            }
            if (!(archbuf = strdup(v)))
                return TK_EXIT_FAIL;
            char *save = NULL;
            for (char *t = strtok_r(archbuf, ",", &save); t && narchs < 64; t = strtok_r(NULL, ",", &save))
                if (*t)
                    archs[narchs++] = t;
        } else if (!strcmp(a, "--no-compile")) {
            o.compile = 0;
        } else if (!strcmp(a, "--jobs") || !strcmp(a, "-j")) {
            char *end = NULL;
            long j = ++i < argc ? strtol(argv[i], &end, 10) : 0;
            if (!end || *end || j < 1 || j > 256) {
                free(archbuf);
                return tk_cli_usage(USAGE, "--jobs wants a number from 1 to 256");
            }
            o.jobs = (int)j;
        } else if (a[0] == '-' && a[1]) {
            free(archbuf);
            return tk_cli_unknown_option(USAGE, a);
        } else if (!dir) {
            dir = a;
        } else {
            free(archbuf);
            return tk_cli_usage(USAGE, "one package directory at a time");
        }
    }
    if (!dir) {
        free(archbuf);
        return tk_cli_usage(USAGE, "which directory? e.g. tk check ./relu");
    }
    o.archs = narchs ? archs : NULL;
    o.narchs = narchs;
    tk_ctx *ctx = tk_cli_ctx(cli);
    if (!ctx) {
        free(archbuf);
        return TK_EXIT_FAIL;
    }
    char *report = NULL;
    int rc = tk_check(&report, ctx, dir, &o), code = TK_EXIT_OK;
    if (cli->json) {
        printf("{\"ok\": %s, \"dir\": ", rc == TK_OK ? "true" : "false");
        tk_cli_json_str(stdout, dir);
        printf(", \"compiled\": %s, \"report\": ", o.compile ? "true" : "false");
        if (report)
            tk_cli_json_str(stdout, report);
        else
            fputs("null", stdout);
        fputs(", \"error\": ", stdout);
        if (rc == TK_OK)
            fputs("null", stdout);
        else
            tk_cli_json_error_body(rc, tk_last_error());
        printf("}\n");
        code = rc == TK_OK ? TK_EXIT_OK : tk_cli_exit_code(rc);
    } else if (rc != TK_OK) {
        if (report)
            fputs(report, stderr);
        code = tk_cli_fail(cli, rc, NULL);
    } else if (!cli->quiet) {
        printf("%s: ok (%s)\n", dir, o.compile ? "manifest checked, every kernel compiled" : "manifest checked");
    }
    tk_free(report);
    free(archbuf);
    return code;
}
