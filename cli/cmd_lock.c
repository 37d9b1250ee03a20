/*
 * cmd_lock.c — tk lock: pin a project's packages (tk.json) in its tk.lock, or, without a project,
 * installed packages in a lock file.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

static const char *USAGE = "tk lock [--project FILE] [--json]\n"
                           "       tk lock --all | org/name[@major]... [-o FILE] [--json]";

static const char *HELP =
    "NAME\n"
    "    tk lock - pin exactly what a project installs\n"
    "\n"
    "SYNOPSIS\n"
    "    tk lock [--project FILE] [--json]\n"
    "    tk lock --all | org/name[@major]... [-o FILE] [--json]\n"
    "\n"
    "DESCRIPTION\n"
    "    In a project (tk.json in this directory or one above it, or --project FILE; docs/project.md),\n"
    "    tk lock resolves each package the project lists - its version range, from its registry -,\n"
    "    installs them all or nothing (as 'tk get' does: signatures, trust, digests, rollback), and\n"
    "    writes tk.lock beside tk.json with exactly those packages: for each, the commit, the manifest's\n"
    "    sha256, the registry it came from, the signer's key id and what the project asked for.\n"
    "    'tk get --locked' then installs exactly that on any machine, or nothing.\n"
    "\n"
    "    Without a project file, or with --all, it pins every installed package; with names, those\n"
    "    installed packages. These write -o FILE (default ./tk.lock).\n"
    "\n"
    "OPTIONS\n"
    "    --project FILE  the project file to use instead of looking for tk.json\n"
    "    --all           pin every installed package, even in a project\n"
    "    -o, --output FILE  where --all or named packages are written (default tk.lock)\n"
    "    --trust         trust an org's signer on first use while resolving (as tk get --trust)\n"
    "    --json          print the lock file written (docs/project.md has its fields)\n"
    "\n"
    "EXAMPLES\n"
    "    tk lock                       # in a project: resolve tk.json, write tk.lock\n"
    "    tk get --locked               # elsewhere: install exactly that\n"
    "    tk lock --all -o machine.lock # every installed package\n"
    "\n"
    "EXIT STATUS\n"
    "    0 written; 2 usage, a bad project file; 3 a package or version not found; 4 network; 5 a\n"
    "    package refused (nothing is installed then, and no lock is written).\n";

static int print_file(const char *path)
{
    FILE *f = fopen(path, "r");
    char buf[8192];
    size_t n;
    if (!f)
        return -1;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        fwrite(buf, 1, n, stdout);
    fclose(f);
    return 0;
}

int tk_cmd_lock(tk_cli *cli, int argc, char **argv)
{
    const char *out = NULL, *project = NULL;
    const char *refs[256];
    size_t n = 0;
    int all = 0;
    tk_get_opts o = TK_GET_OPTS_INIT;
    for (int i = 1; i < argc; i++) {
        if (tk_cli_is_help(argv[i])) {
            fputs(HELP, stdout);
            return TK_EXIT_OK;
        } else if (!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) {
            if (++i >= argc)
                return tk_cli_usage(USAGE, "-o needs a file name");
            out = argv[i];
        } else if (!strcmp(argv[i], "--project")) {
            if (++i >= argc)
                return tk_cli_usage(USAGE, "--project needs a file (a tk.json)");
            project = argv[i];
        } else if (!strcmp(argv[i], "--all")) {
            all = 1;
        } else if (!strcmp(argv[i], "--trust")) {
            o.trust_unknown = 1;
        } else if (argv[i][0] == '-') {
            return tk_cli_unknown_option(USAGE, argv[i]);
        } else if (n < sizeof refs / sizeof *refs) {
            refs[n++] = argv[i];
        } else {
            return tk_cli_usage(USAGE, "too many packages on one line");
        }
    }
    if ((all || n) && project)
        return tk_cli_usage(USAGE, "--project locks the project's packages; --all and names lock installed ones");
    if (all && n)
        return tk_cli_usage(USAGE, "--all pins every installed package; give no names with it");
    tk_ctx *ctx = tk_cli_ctx(cli);
    if (!ctx)
        return TK_EXIT_FAIL;
    tk_project *p = NULL;
    int rc = all || n ? TK_ERR_NOT_FOUND : tk_project_open(&p, project);
    if (rc == TK_ERR_NOT_FOUND && !project) { /* no project: installed packages, as before projects */
        if (!out)
            out = "tk.lock";
        if (!all && !n && !cli->quiet && !cli->json)
            fprintf(stderr, "tk: no tk.json here or above: pinning every installed package\n");
        if ((rc = tk_lock_write(ctx, out, refs, n)) == TK_OK && cli->json && print_file(out) != 0)
            perror(out);
    } else if (rc == TK_OK && out) {
        int code = tk_cli_usage(USAGE,
                                "a project's lock is the tk.lock beside its tk.json (%s); -o is for --all or "
                                "named packages",
                                tk_project_lock_path(p));
        tk_project_free(p);
        return code;
    } else if (rc == TK_OK) {
        char *text = NULL;
        out = tk_project_lock_path(p);
        if ((rc = tk_project_lock(&text, ctx, p, &o)) == TK_OK && cli->json)
            fputs(text, stdout);
        tk_free(text);
    }
    if (rc != TK_OK) {
        tk_project_free(p);
        return tk_cli_fail(cli, rc, NULL);
    }
    if (!cli->quiet && !cli->json)
        printf("wrote %s\n", out);
    tk_project_free(p);
    return TK_EXIT_OK;
}
