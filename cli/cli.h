/*
 * cli.h — shared pieces of the tk command: global options, output helpers and exit codes.
 *
 * Each subcommand lives in cli/cmd_<name>.c as `int tk_cmd_<name>(tk_cli *cli, int argc, char **argv)`
 * (argv[0] is the subcommand's name) and returns a process exit code. cli/ includes only tk.h.
 */
#ifndef TK_CLI_H
#define TK_CLI_H

#include <stdio.h>

#include "tk.h"

/* Exit codes, distinct per failure class so scripts can branch on them. */
enum {
    TK_EXIT_OK = 0,
    TK_EXIT_FAIL = 1,      /* anything not listed below */
    TK_EXIT_USAGE = 2,     /* bad command line */
    TK_EXIT_NOT_FOUND = 3, /* package, version or file not found */
    TK_EXIT_NETWORK = 4,   /* network error, or offline and it was needed */
    TK_EXIT_SIGNATURE = 5, /* input refused: a package's signature, trust, digest, manifest, archive, commit,
                              rollback; a damaged model file (TK_ERR_CORRUPT) */
    TK_EXIT_IO = 6,        /* local file system or state database error, disk full, a planted link */
    TK_EXIT_DEVICE = 7,    /* no GPU, no NVRTC, compile or launch error */
    TK_EXIT_UNSUPPORTED = 8, /* valid, but not implemented here: a model architecture or config value, an op
                                without a CPU reference, a template construct (TK_ERR_UNSUPPORTED) */
    TK_EXIT_AUTH = 9,      /* the registry refused the credentials (HTTP 401/403) */
    TK_EXIT_SELFTEST = 10, /* a kernel failed its self-test on this GPU (tk selftest, tk get --selftest) */
};

typedef struct {
    int json;      /* --json */
    int quiet;     /* --quiet: no progress, no info messages */
    int verbose;   /* --verbose: debug messages */
    int offline;   /* --offline */
    int tty;       /* stderr is a terminal: progress bars */
    tk_ctx *ctx;   /* created on first use by tk_cli_ctx() */
    int threads;   /* --threads of the model commands: the context's CPU threads (0: the default) */
    int ctx_exit;  /* the exit code for tk_cli_ctx's failure (main returns it), 0 if none */
} tk_cli;

/* The context, created on first call with the global options. NULL after printing an error. */
tk_ctx *tk_cli_ctx(tk_cli *cli);
/* --threads N of the model commands: 1 to 256 into cli->threads (tk_cli_ctx applies it); 0, or
 * tk_cli_usage's exit code for a bad value. */
int tk_cli_parse_threads(tk_cli *cli, const char *usage, const char *v);
/* Prints "tk: <message>" (and the hint lines) for a failed status; returns the exit code for it. */
int tk_cli_fail(tk_cli *cli, int status, const char *what);
/* Writes s as a JSON string (quotes included; NULL as ""), UTF-8 passed through. */
void tk_cli_json_str(FILE *f, const char *s);
/* Writes v as a JSON number with 9 significant digits (f32's round trip), or null when v is NaN or
 * +-inf, which JSON cannot write (printf's "nan" and "inf" would make the whole document unreadable). */
void tk_cli_json_num(FILE *f, double v);
/* Prints a usage error with the subcommand's usage line; returns TK_EXIT_USAGE. */
int tk_cli_usage(const char *usage, const char *fmt, ...);
int tk_cli_exit_code(int status);
/* --json: set by main.c; tk_cli_fail and tk_cli_usage then print {"error": {"status", "exit_code",
 * "message", "hint"}} on stdout (nothing on stderr). docs/json.md lists the shapes. */
extern int tk_cli_json_mode;
#define TK_CLI_STATUS_USAGE (-1000) /* status token "usage" for tk_cli_json_error */
/* Prints the JSON error object for status (a TK_ERR_* or TK_CLI_STATUS_USAGE) and message
 * ("text\nHINT: hint"), prefixed by what (may be NULL). */
void tk_cli_json_error(int status, const char *what, const char *msg);
/* Only the inner object {"status", "exit_code", "message", "hint"} (no newline), for a command whose
 * --json output carries its error beside other fields (tk check). */
void tk_cli_json_error_body(int status, const char *msg);
/* A failure the command found itself (not a library call's): "tk: MESSAGE" on stderr (MESSAGE may
 * end in "\nHINT: ..."), or under --json the error object for status on stdout. Returns exit_code,
 * or the exit code for status when exit_code is 0. */
int tk_cli_errorf(tk_cli *cli, int status, int exit_code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Prints an informational line to stderr unless --quiet. */
void tk_cli_info(tk_cli *cli, const char *fmt, ...);
/* Prints "tk: warning: MESSAGE" and a newline to stderr (even under --quiet). */
void tk_cli_warn(tk_cli *cli, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* --device: "cpu" gives *cuda_id -1, "cuda" 0, "cuda:N" N (0..1023). Returns 0, or -1 for anything
 * else (the caller prints its usage error). */
int tk_cli_parse_device(const char *s, int *cuda_id);
/* Called first by the context's progress callback when set (tk selftest's watchdog, cmd_selftest.c). */
extern void (*tk_cli_progress_hook)(void *user, const char *what, int64_t done, int64_t total);
/* Formats a byte count as "12.3 MiB". */
void tk_cli_human(char *out, size_t cap, double bytes);
/* True when argv[i] is -h or --help. */
int tk_cli_is_help(const char *arg);
/* The candidate closest to what was typed, when it is close enough to suggest (an edit distance of at
 * most a third of the typed text's length, at least 1; ignoring leading dashes), else NULL. cands
 * ends with NULL. */
const char *tk_cli_closest(const char *typed, const char *const *cands);
/* Prints "tk: unknown option 'OPT'", with "did you mean" the closest option when one is close (the
 * options are the --words of the command's usage text, and the global ones), and the usage line;
 * returns TK_EXIT_USAGE. */
int tk_cli_unknown_option(const char *usage, const char *opt);
/* The public key a command line gives: the key itself ("ed25519:<64 hex>") or the file holding it (what
 * 'tk keygen' wrote as KEY.pub), into out. Returns 0, or prints a usage error (the private key given
 * by mistake, a file with no key) and returns TK_EXIT_USAGE. */
int tk_cli_pubkey_arg(char *out, size_t cap, const char *arg, const char *usage);

/* Generation flags shared by tk generate and tk chat (cli/cmd_generate.c): tk_cli_gen_flag says
 * whether `flag` is one (0: no, 1: takes no value, 2: takes a value); tk_cli_gen_apply sets it on o
 * (0, or a usage error's exit code printed with `usage`). */
int tk_cli_gen_flag(const char *flag);
int tk_cli_gen_apply(tk_gen_opts *o, const char *usage, const char *flag, const char *val);
/* tk generate --diffusion (cmd_generate_diffusion.c): the command, and whether a flag is one of its own */
int tk_cmd_generate_diffusion(tk_cli *cli, int argc, char **argv);
int tk_cli_diffusion_flag(const char *flag);

/* --tp N of the model commands (cli/tp.c). parse: N in 1..4096 into *n (0, or a usage error's exit
 * code). join: the communicator of the ranks mpirun started (one process alone without it); a world
 * size other than n is an error (printed by rank 0; every rank returns its exit code); ranks other
 * than 0 then print nothing on stdout and no progress (--quiet). Returns 0 with *comm set, or an exit
 * code. report: every rank's weight bytes, mapped bytes and resident set, gathered (a collective: all
 * ranks call it) as {"world_size", "plan", "unsplit_weight_bytes", "ranks": [{"rank", "weight_bytes",
 * "mapped_bytes", "hugepage_bytes", "rss_bytes", "head_bytes_sent"}]}; print: that as one line on
 * stderr. */
struct json_t;
int tk_cli_tp_parse(const char *usage, const char *v, int *n);
int tk_cli_tp_join(tk_cli *cli, tk_comm **comm, int n, const char *device, int *device_id);
/* join for another flag (tk train's --dp): the same, its messages naming `flag` */
int tk_cli_comm_join(tk_cli *cli, tk_comm **comm, int n, const char *flag);
int tk_cli_tp_report(struct json_t **out, tk_comm *c, const tk_model *m);
void tk_cli_tp_print(tk_cli *cli, const struct json_t *report);

#endif
