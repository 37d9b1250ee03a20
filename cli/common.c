/*
 * common.c — what every tk subcommand shares: the context with the global options, messages,
 * the progress bar and the mapping from statuses to exit codes.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"

static void on_log(void *user, int level, const char *msg)
{
    tk_cli *cli = user;
    if (level == TK_LOG_DEBUG && !cli->verbose)
        return;
    if (level == TK_LOG_INFO && cli->quiet)
        return;
    if (cli->tty)
        fputs("\r\033[K", stderr);
    fprintf(stderr, "%s%s\n", level == TK_LOG_WARN ? "tk: warning: " : "tk: ", msg);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void tk_cli_human(char *out, size_t cap, double bytes)
{
    const char *unit[] = {"B", "KiB", "MiB", "GiB"};
    int u = 0;
    while (bytes >= 1024 && u < 3) {
        bytes /= 1024;
        u++;
    }
    snprintf(out, cap, u ? "%.1f %s" : "%.0f %s", bytes, unit[u]);
}

/* A one-line progress bar on a terminal, redrawn at most 10 times a second. */
static void on_progress(void *user, const char *what, int64_t done, int64_t total)
{
    tk_cli *cli = user;
    static double last;
    if (!cli->tty || cli->quiet)
        return;
    double t = now_s();
    int finished = total > 0 && done >= total;
    if (!finished && t - last < 0.1)
        return;
    last = t;
    if (!strncmp(what, "compile ", 8)) {
        /* compiles: units, not bytes; one line of at most 100 columns, cleared at the end */
        fprintf(stderr, "\r\033[K  [%lld/%lld] %.80s", (long long)done, (long long)total, what + 8);
        if (finished)
            fputs("\r\033[K", stderr);
        fflush(stderr);
        return;
    }
    char d[32], tot[32];
    tk_cli_human(d, sizeof d, (double)done);
    if (total > 0) {
        tk_cli_human(tot, sizeof tot, (double)total);
        int width = 30, fill = (int)((double)width * (double)done / (double)total);
        char bar[64];
        for (int i = 0; i < width; i++)
            bar[i] = i < fill ? '#' : '.';
        bar[width] = '\0';
        fprintf(stderr, "\r\033[K  %-28.28s [%s] %3d%% %s / %s", what, bar, (int)(100.0 * (double)done / (double)total),
                d, tot);
    } else {
        fprintf(stderr, "\r\033[K  %-28.28s %s", what, d);
    }
    if (finished)
        fputs("\r\033[K", stderr);
    fflush(stderr);
}

tk_ctx *tk_cli_ctx(tk_cli *cli)
{
    if (cli->ctx)
        return cli->ctx;
    tk_ctx_opts o = TK_CTX_OPTS_INIT;
    o.offline = cli->offline ? 1 : -1;
    o.log = on_log;
    o.log_user = cli;
    o.progress = on_progress;
    o.progress_user = cli;
    int rc = tk_ctx_new(&cli->ctx, &o);
    if (rc != TK_OK) {
        cli->ctx_exit = tk_cli_fail(cli, rc, "cannot start");
        return NULL;
    }
    return cli->ctx;
}

int tk_cli_exit_code(int status)
{
    switch (status) {
    case TK_OK: return TK_EXIT_OK;
    case TK_ERR_INVALID: return TK_EXIT_USAGE;
    case TK_ERR_NOT_FOUND: return TK_EXIT_NOT_FOUND;
    case TK_ERR_NETWORK:
    case TK_ERR_OFFLINE: return TK_EXIT_NETWORK;
    case TK_ERR_SIGNATURE:
    case TK_ERR_UNTRUSTED:
    case TK_ERR_DIGEST:
    case TK_ERR_ROLLBACK:
    case TK_ERR_MANIFEST:
    case TK_ERR_ARCHIVE: return TK_EXIT_SIGNATURE;
    case TK_ERR_IO:
    case TK_ERR_NOSPACE:
    case TK_ERR_CACHE: return TK_EXIT_IO;
    case TK_ERR_NO_DEVICE:
    case TK_ERR_NO_NVRTC:
    case TK_ERR_COMPILE:
    case TK_ERR_LAUNCH: return TK_EXIT_DEVICE;
    default: return TK_EXIT_FAIL;
    }
}

int tk_cli_fail(tk_cli *cli, int status, const char *what)
{
    if (cli && cli->tty)
        fputs("\r\033[K", stderr);
    const char *msg = tk_last_error();
    if (what && *what)
        fprintf(stderr, "tk: %s: %s\n", what, msg && *msg ? msg : tk_status_str(status));
    else
        fprintf(stderr, "tk: %s\n", msg && *msg ? msg : tk_status_str(status));
    return tk_cli_exit_code(status);
}

int tk_cli_usage(const char *usage, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("tk: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nusage: %s\n(see --help)\n", usage);
    return TK_EXIT_USAGE;
}

void tk_cli_info(tk_cli *cli, const char *fmt, ...)
{
    if (cli->quiet)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}

int tk_cli_is_help(const char *arg) { return !strcmp(arg, "-h") || !strcmp(arg, "--help"); }
