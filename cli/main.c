/*
 * main.c — the tk command: global options, then one subcommand (cli/cmd_<name>.c).
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

int tk_cmd_get(tk_cli *cli, int argc, char **argv);
int tk_cmd_list(tk_cli *cli, int argc, char **argv);
int tk_cmd_info(tk_cli *cli, int argc, char **argv);
int tk_cmd_verify(tk_cli *cli, int argc, char **argv);
int tk_cmd_remove(tk_cli *cli, int argc, char **argv);
int tk_cmd_lock(tk_cli *cli, int argc, char **argv);
int tk_cmd_keygen(tk_cli *cli, int argc, char **argv);
int tk_cmd_publish(tk_cli *cli, int argc, char **argv);
int tk_cmd_yank(tk_cli *cli, int argc, char **argv);
int tk_cmd_trust(tk_cli *cli, int argc, char **argv);
int tk_cmd_build(tk_cli *cli, int argc, char **argv);
int tk_cmd_cache(tk_cli *cli, int argc, char **argv);
int tk_cmd_doctor(tk_cli *cli, int argc, char **argv);
int tk_cmd_run(tk_cli *cli, int argc, char **argv);
int tk_cmd_ops(tk_cli *cli, int argc, char **argv);
int tk_cmd_run_op(tk_cli *cli, int argc, char **argv);
int tk_cmd_serve(tk_cli *cli, int argc, char **argv);
int tk_cmd_tokenize(tk_cli *cli, int argc, char **argv);
int tk_cmd_detokenize(tk_cli *cli, int argc, char **argv);
int tk_cmd_model(tk_cli *cli, int argc, char **argv);
int tk_cmd_embed(tk_cli *cli, int argc, char **argv);
/* authoring (h14) */
int tk_cmd_check(tk_cli *cli, int argc, char **argv);
int tk_cmd_init(tk_cli *cli, int argc, char **argv);
int tk_cmd_generate(tk_cli *cli, int argc, char **argv);
/* versions (issue 14, item 7) */
int tk_cmd_versions(tk_cli *cli, int argc, char **argv);
int tk_cmd_update(tk_cli *cli, int argc, char **argv);
/* chat templates (hchat) */
int tk_cmd_chat(tk_cli *cli, int argc, char **argv);
/* the model server (issue 26) */
int tk_cmd_serve_model(tk_cli *cli, int argc, char **argv);
/* self-tests (issue 24) */
int tk_cmd_selftest(tk_cli *cli, int argc, char **argv);
/* training (issue 25) */
int tk_cmd_train(tk_cli *cli, int argc, char **argv);

/* The groups of tk --help, in order (by task). */
enum { G_PKG, G_PUBLISH, G_KERNELS, G_MODELS, G_MACHINE, NGROUPS };
static const char *const group_names[NGROUPS] = {
    "Install and use packages", "Publish and run a registry", "Kernels and ops", "Models", "This machine",
};

/* One row a command: its name, its function, a summary (at most 66 columns, so tk --help fits 80)
 * and its group in tk --help. */
static const struct {
    const char *name;
    int (*fn)(tk_cli *, int, char **);
    const char *summary;
    int group;
} commands[] = {
    {"get", tk_cmd_get, "download, verify and install packages (or a project's)", G_PKG},
    {"list", tk_cmd_list, "installed packages; --outdated: what has a newer version", G_PKG},
    {"info", tk_cmd_info, "one package: version, commit, files, kernels (or the registry's)", G_PKG},
    {"versions", tk_cmd_versions, "every version of a package in the registry, yanked ones marked", G_PKG},
    {"update", tk_cmd_update, "move installed packages to the newest version of their major", G_PKG},
    {"verify", tk_cmd_verify, "re-hash installed files against their manifests", G_PKG},
    {"remove", tk_cmd_remove, "uninstall a package", G_PKG},
    {"lock", tk_cmd_lock, "pin a project's packages in tk.lock (commit, digest, signer)", G_PKG},
    {"trust", tk_cmd_trust, "trusted publisher keys: add, list, remove", G_PKG},
    {"init", tk_cmd_init, "write a new kernel package skeleton that passes tk check", G_PUBLISH},
    {"check", tk_cmd_check, "check a package directory and compile it; nothing written", G_PUBLISH},
    {"keygen", tk_cmd_keygen, "make an Ed25519 publisher key pair", G_PUBLISH},
    {"publish", tk_cmd_publish, "compile, sign and add a package to a registry (tree or server)", G_PUBLISH},
    {"yank", tk_cmd_yank, "withdraw a published version (signed; locks keep working)", G_PUBLISH},
    {"serve", tk_cmd_serve, "serve a registry tree over HTTP, with uploads and a web page", G_PUBLISH},
    {"build", tk_cmd_build, "compile a package's kernels into the cache ahead of time", G_KERNELS},
    {"run", tk_cmd_run, "launch a package's kernel on random inputs: time, checksum", G_KERNELS},
    {"ops", tk_cmd_ops, "the standard ops, their signatures and implementations", G_KERNELS},
    {"run-op", tk_cmd_run_op, "run an op on random inputs through the op registry", G_KERNELS},
    {"cache", tk_cmd_cache, "the compiled-kernel cache: ls, stats, gc, clear", G_KERNELS},
    {"model", tk_cmd_model, "a Hugging Face checkpoint: info, logits", G_MODELS},
    {"generate", tk_cmd_generate, "generate text (greedy, sampling, beams)", G_MODELS},
    {"chat", tk_cmd_chat, "chat through the tokenizer's chat template (turns on stdin)", G_MODELS},
    {"train", tk_cmd_train, "fine-tune a checkpoint on text files (AdamW); HF checkpoints out", G_MODELS},
    {"serve-model", tk_cmd_serve_model, "serve a checkpoint over OpenAI's API (continuous batching)", G_MODELS},
    {"embed", tk_cmd_embed, "sentence embeddings with an encoder checkpoint", G_MODELS},
    {"tokenize", tk_cmd_tokenize, "encode text to token ids with a tokenizer.json", G_MODELS},
    {"detokenize", tk_cmd_detokenize, "decode token ids to text with a tokenizer.json", G_MODELS},
    {"selftest", tk_cmd_selftest, "prove a package's kernels on this GPU against the CPU references", G_KERNELS},
    {"doctor", tk_cmd_doctor, "GPUs, driver, NVRTC, cache, registries, config: what is missing", G_MACHINE},
};

/* tk --help: the commands by task, the global options, the environment and the exit codes, each line
 * at most 80 columns. The exit codes are documented here, in docs/tk.1 and in docs/json.md. */
static void usage(FILE *f)
{
    fprintf(f,
            "tk %s - a kernel hub and JIT kernel package manager\n"
            "\n"
            "usage: tk [--json] [--quiet] [--verbose] [--offline] <command> [args]\n"
            "       tk help <command>   (the same as tk <command> --help)\n",
            tk_version_string());
    for (int g = 0; g < NGROUPS; g++) {
        fprintf(f, "\n%s:\n", group_names[g]);
        for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
            if (commands[i].group == g)
                fprintf(f, "  %-12s%s\n", commands[i].name, commands[i].summary);
    }
    fprintf(f, "\n"
               "Global options (accepted anywhere on the line):\n"
               "  --json         machine-readable output on stdout (docs/json.md)\n"
               "  -q, --quiet    no progress or informational messages\n"
               "  -v, --verbose  debug messages (each HTTP request, each compile)\n"
               "  --offline      never touch the network; use what is installed\n"
               "  -h, --help     this help; 'tk help CMD' or 'tk CMD --help' for a command\n"
               "  --version      print the version\n"
               "\n"
               "Environment:\n"
               "  TK_HOME      where tk keeps its state (default: the XDG directories:\n"
               "               $XDG_DATA_HOME/tk, $XDG_CACHE_HOME/tk, $XDG_CONFIG_HOME/tk)\n"
               "  TK_ENDPOINT  one registry URL (http, https or file) for everything, over\n"
               "               config.json's \"registries\" and \"endpoint\" (tk doctor lists\n"
               "               the registries in use)\n"
               "  TK_TOKEN     bearer token, sent to the registry's host only\n"
               "  TK_OFFLINE   1 to work offline\n"
               "\n"
               "EXIT STATUS\n"
               "  0  ok\n"
               "  1  other failure\n"
               "  2  usage: a bad command line or argument\n"
               "  3  not found: package, version, file or op\n"
               "  4  network: connection, timeout, a server error\n"
               "  5  input refused: a package's signature, trust, digest, manifest, archive,\n"
               "     commit or rollback; a damaged model file (truncated safetensors)\n"
               "  6  local I/O: disk full, unusable TK_HOME, a planted link\n"
               "  7  GPU, NVRTC or compile error\n"
               "  8  unsupported: a model architecture or config value, an op or template\n"
               "     construct tk does not implement\n"
               "  9  auth: the registry refused the credentials (HTTP 401/403)\n"
               "  10 a kernel failed its self-test on this GPU (tk selftest, get --selftest)\n");
}

/* The command named `name`, or -1. */
static long find_command(const char *name)
{
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (!strcmp(name, commands[i].name))
            return (long)i;
    return -1;
}

/* An unknown command: the error, with the closest command when one is close. */
static int unknown_command(tk_cli *cli, const char *name)
{
    const char *names[64];
    size_t n = 0;
    for (size_t i = 0; i < sizeof commands / sizeof *commands && n < 63; i++)
        names[n++] = commands[i].name;
    names[n] = NULL;
    const char *best = tk_cli_closest(name, names);
    if (cli->json) {
        char msg[512];
        snprintf(msg, sizeof msg, "unknown command '%s'\nHINT: %s%s%srun 'tk --help' for the list of commands", name,
                 best ? "did you mean 'tk " : "", best ? best : "", best ? "'? " : "");
        tk_cli_json_error(TK_CLI_STATUS_USAGE, NULL, msg);
        return TK_EXIT_USAGE;
    }
    fprintf(stderr, "tk: unknown command '%s'\n", name);
    if (best)
        fprintf(stderr, "HINT: did you mean 'tk %s'?\n", best);
    fprintf(stderr, "run 'tk --help' for the list of commands\n");
    return TK_EXIT_USAGE;
}

int main(int argc, char **argv)
{
    tk_cli cli;
    memset(&cli, 0, sizeof cli);
    cli.tty = isatty(STDERR_FILENO);
    /* Global flags may stand anywhere before "--"; strip them so subcommands see only their own. */
    int n = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--")) {
            while (i < argc)
                argv[n++] = argv[i++];
            break;
        }
        if (!strcmp(argv[i], "--json"))
            cli.json = 1;
        else if (!strcmp(argv[i], "--quiet") || !strcmp(argv[i], "-q"))
            cli.quiet = 1;
        else if (!strcmp(argv[i], "--verbose") || !strcmp(argv[i], "-v"))
            cli.verbose = 1;
        else if (!strcmp(argv[i], "--offline"))
            cli.offline = 1;
        else
            argv[n++] = argv[i];
    }
    argc = n;
    argv[argc] = NULL;
    tk_cli_json_mode = cli.json;
    if (argc < 2) {
        usage(stderr);
        return TK_EXIT_USAGE;
    }
    if (!strcmp(argv[1], "help") && argc > 2) { /* tk help CMD: tk CMD --help */
        long c = find_command(argv[2]);
        if (c < 0)
            return unknown_command(&cli, argv[2]);
        char *args[3] = {argv[2], "--help", NULL};
        return commands[c].fn(&cli, 2, args);
    }
    if (tk_cli_is_help(argv[1]) || !strcmp(argv[1], "help")) {
        usage(stdout);
        return TK_EXIT_OK;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("tk %s (build %s)\n", tk_version_string(), tk_build_id());
        return TK_EXIT_OK;
    }
    long c = find_command(argv[1]);
    if (c < 0)
        return unknown_command(&cli, argv[1]);
    int rc = commands[c].fn(&cli, argc - 1, argv + 1);
    if (rc == TK_EXIT_FAIL && cli.ctx_exit) /* commands return 1 when the context failed */
        rc = cli.ctx_exit;
    tk_ctx_free(cli.ctx);
    return rc;
}
