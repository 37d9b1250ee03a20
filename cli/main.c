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
int tk_cmd_train(tk_cli *cli, int argc, char **argv);

static const struct {
    const char *name;
    int (*fn)(tk_cli *, int, char **);
    const char *summary;
} commands[] = {
    {"get", tk_cmd_get, "download, verify and install a kernel package"},
    {"list", tk_cmd_list, "list installed packages"},
    {"info", tk_cmd_info, "show an installed package: version, commit, files, kernels"},
    {"verify", tk_cmd_verify, "re-hash installed files against their manifests"},
    {"remove", tk_cmd_remove, "uninstall a package"},
    {"lock", tk_cmd_lock, "pin a project's packages (tk.json) in tk.lock: commit, digest, registry, signer"},
    {"keygen", tk_cmd_keygen, "make an Ed25519 publisher key pair"},
    {"publish", tk_cmd_publish, "sign a package directory and add it to a registry tree"},
    {"yank", tk_cmd_yank, "withdraw a published version (signed; locks keep working)"},
    {"trust", tk_cmd_trust, "manage trusted publisher keys (add, list, remove)"},
    {"build", tk_cmd_build, "compile a package's kernels with NVRTC into the cache (ahead of time)"},
    {"cache", tk_cmd_cache, "the compiled-kernel cache: ls, stats, gc, clear"},
    {"doctor", tk_cmd_doctor, "check GPUs, driver, NVRTC, cache and registry; say what is missing"},
    {"run", tk_cmd_run, "launch a package's kernel on random inputs; print time and checksum"},
    {"ops", tk_cmd_ops, "list standard ops, their signatures and implementations"},
    {"run-op", tk_cmd_run_op, "run an op on random inputs through the op registry"},
    {"serve", tk_cmd_serve, "serve a registry tree over HTTP, with uploads and a web page"},
    {"tokenize", tk_cmd_tokenize, "encode text to token ids with a model's tokenizer.json"},
    {"detokenize", tk_cmd_detokenize, "decode token ids to text with a model's tokenizer.json"},
    {"model", tk_cmd_model, "a Hugging Face checkpoint: info, logits (Llama, Mistral, Qwen2, GPT-2, BERT)"},
    {"embed", tk_cmd_embed, "sentence embeddings of texts with an encoder checkpoint (all-MiniLM-L6-v2)"},
    {"init", tk_cmd_init, "write a new kernel package skeleton that passes tk check"},
    {"versions", tk_cmd_versions, "every version of a package in the registry (yanked ones marked)"},
    {"update", tk_cmd_update, "move installed packages to the newest version of their major"},
    {"check", tk_cmd_check, "check a package directory: manifest and an NVRTC compile, nothing written"},
    {"generate", tk_cmd_generate, "generate text with a Llama or GPT-2 checkpoint (greedy, sampling, beams)"},
    {"train", tk_cmd_train, "fine-tune a checkpoint on text files (AdamW, as PyTorch); HF checkpoints out"},
    {"chat", tk_cmd_chat, "chat with a checkpoint through its tokenizer's chat template (stdin turns)"},
};

static void usage(FILE *f)
{
    fprintf(f,
            "tk %s — a kernel hub and JIT kernel package manager\n"
            "\n"
            "usage: tk [--json] [--quiet] [--verbose] [--offline] <command> [args]\n"
            "\n"
            "commands:\n",
            tk_version_string());
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f,
            "\n"
            "global options (accepted anywhere on the line):\n"
            "  --json       machine-readable output on stdout (list, info, get, trust list, ...)\n"
            "  -q, --quiet  no progress or informational messages\n"
            "  -v, --verbose  debug messages\n"
            "  --offline    never touch the network; resolve from installed packages (also TK_OFFLINE=1)\n"
            "  -h, --help   help; 'tk <command> --help' for a command\n"
            "  --version    print the version\n"
            "\n"
            "environment:\n"
            "  TK_HOME      where tk keeps its state (default: $XDG_DATA_HOME/tk, $XDG_CACHE_HOME/tk,\n"
            "               $XDG_CONFIG_HOME/tk)\n"
            "  TK_ENDPOINT  registry URL (http, https or file); one registry for everything, overriding\n"
            "               config.json's \"registries\" and \"endpoint\" ('tk doctor' lists them)\n"
            "  TK_TOKEN     bearer token sent to the registry's host only\n"
            "  TK_OFFLINE   1 to work offline\n"
            "\n"
            "exit status: 0 ok, 1 other failure, 2 usage, 3 not found, 4 network (connection, timeout, a\n"
            "server error), 5 package refused (signature, trust, digest, manifest, archive, commit or\n"
            "rollback), 6 local I/O (disk full, read-only or unusable TK_HOME, a planted link), 7 GPU, NVRTC\n"
            "or compile error.\n");
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
    if (tk_cli_is_help(argv[1]) || !strcmp(argv[1], "help")) {
        usage(stdout);
        return TK_EXIT_OK;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("tk %s\n", tk_version_string());
        return TK_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++) {
        if (!strcmp(argv[1], commands[i].name)) {
            int rc = commands[i].fn(&cli, argc - 1, argv + 1);
            if (rc == TK_EXIT_FAIL && cli.ctx_exit) /* commands return 1 when the context failed */
                rc = cli.ctx_exit;
            tk_ctx_free(cli.ctx);
            return rc;
        }
    }
    const char *best = NULL;
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (!strncmp(argv[1], commands[i].name, 2))
            best = commands[i].name;
    if (cli.json) {
        char msg[512];
        snprintf(msg, sizeof msg, "unknown command '%s'\nHINT: %s%s%srun 'tk --help' for the list of commands",
                 argv[1], best ? "did you mean 'tk " : "", best ? best : "", best ? "'? " : "");
        tk_cli_json_error(TK_CLI_STATUS_USAGE, NULL, msg);
        return TK_EXIT_USAGE;
    }
    fprintf(stderr, "tk: unknown command '%s'\n", argv[1]);
    if (best)
        fprintf(stderr, "HINT: did you mean 'tk %s'?\n", best);
    fprintf(stderr, "run 'tk --help' for the list of commands\n");
    return TK_EXIT_USAGE;
}
