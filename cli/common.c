/*
 * common.c — what every tk subcommand shares: the context with the global options, messages,
 * the progress bar and the mapping from statuses to exit codes.
 */
#define _GNU_SOURCE /* memmem */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
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

int tk_cli_parse_device(const char *s, int *cuda_id)
{
    if (!strcmp(s, "cpu") || !strcmp(s, "cuda")) {
        *cuda_id = s[0] == 'c' && s[1] == 'p' ? -1 : 0;
        return 0;
    }
    if (strncmp(s, "cuda:", 5) || !isdigit((unsigned char)s[5]))
        return -1;
    char *end;
    errno = 0;
    long n = strtol(s + 5, &end, 10);
    if (errno || *end || n > 1023)
        return -1;
    *cuda_id = (int)n;
    return 0;
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

void (*tk_cli_progress_hook)(void *user, const char *what, int64_t done, int64_t total);

/* A one-line progress bar on a terminal, redrawn at most 10 times a second. */
static void on_progress(void *user, const char *what, int64_t done, int64_t total)
{
    tk_cli *cli = user;
    static double last;
    if (tk_cli_progress_hook)
        tk_cli_progress_hook(user, what, done, total);
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
    if (rc == TK_OK && cli->threads)
        rc = tk_ctx_set_threads(cli->ctx, cli->threads);
    if (rc != TK_OK) {
        cli->ctx_exit = tk_cli_fail(cli, rc, "cannot start");
        return NULL;
    }
    return cli->ctx;
}

int tk_cli_parse_threads(tk_cli *cli, const char *usage, const char *v)
{
    char *end = NULL;
    long n = v ? strtol(v, &end, 10) : 0;
    if (!v || !*v || !end || *end || n < 1 || n > 256)
        return tk_cli_usage(usage, "--threads wants a thread count from 1 to 256, got '%s'", v ? v : "");
    cli->threads = (int)n;
    if (cli->ctx)
        tk_ctx_set_threads(cli->ctx, cli->threads);
    return 0;
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
    case TK_ERR_ARCHIVE:
    case TK_ERR_CORRUPT: return TK_EXIT_SIGNATURE;
    case TK_ERR_IO:
    case TK_ERR_NOSPACE:
    case TK_ERR_CACHE: return TK_EXIT_IO;
    case TK_ERR_NO_DEVICE:
    case TK_ERR_NO_NVRTC:
    case TK_ERR_COMPILE:
    case TK_ERR_LAUNCH: return TK_EXIT_DEVICE;
    case TK_ERR_UNSUPPORTED: return TK_EXIT_UNSUPPORTED;
    case TK_ERR_AUTH: return TK_EXIT_AUTH;
    case TK_ERR_SELFTEST: return TK_EXIT_SELFTEST;
    default: return TK_EXIT_FAIL;
    }
}

int tk_cli_json_mode; /* --json was given: errors go to stdout as a JSON object (main.c sets it) */

/* A stable machine name for a status, for {"error": {"status": ...}}. */
static const char *status_token(int status)
{
    switch (status) {
    case TK_ERR_INVALID: return "invalid";
    case TK_ERR_NOT_FOUND: return "not_found";
    case TK_ERR_NETWORK: return "network";
    case TK_ERR_SIGNATURE: return "signature";
    case TK_ERR_UNTRUSTED: return "untrusted";
    case TK_ERR_DIGEST: return "digest";
    case TK_ERR_MANIFEST: return "manifest";
    case TK_ERR_ARCHIVE: return "archive";
    case TK_ERR_IO: return "io";
    case TK_ERR_NOSPACE: return "no_space";
    case TK_ERR_CACHE: return "cache";
    case TK_ERR_ROLLBACK: return "rollback";
    case TK_ERR_NOMEM: return "no_memory";
    case TK_ERR_OFFLINE: return "offline";
    case TK_ERR_NO_DEVICE: return "no_device";
    case TK_ERR_NO_NVRTC: return "no_nvrtc";
    case TK_ERR_COMPILE: return "compile";
    case TK_ERR_LAUNCH: return "launch";
    case TK_ERR_UNSUPPORTED: return "unsupported";
    case TK_ERR_INTERNAL: return "internal";
    case TK_ERR_CORRUPT: return "corrupt";
    case TK_ERR_AUTH: return "auth";
    case TK_ERR_SELFTEST: return "selftest";
    case TK_CLI_STATUS_USAGE: return "usage";
    default: return "failed";
    }
}

/* Writes s[0..n) as a JSON string literal. */
static void json_str(FILE *f, const char *s, size_t n)
{
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

/* The error object with an explicit exit code (tk_cli_errorf may differ from the status's own). */
/* The inner object {"status", "exit_code", "message", "hint"}, without a newline. */
static void json_error_body(int status, int exit_code, const char *what, const char *msg)
{
    /* "message\nHINT: hint" (the library's convention): the hint goes to its own field */
    const char *h = msg ? strstr(msg, "\nHINT: ") : NULL;
    size_t mlen = msg ? (h ? (size_t)(h - msg) : strlen(msg)) : 0;
    printf("{\"status\": \"%s\", \"exit_code\": %d, \"message\": ", status_token(status), exit_code);
    if (what && *what) {
        size_t wl = strlen(what);
        char *both = malloc(wl + 2 + mlen + 1);
        if (both) {
            memcpy(both, what, wl);
            memcpy(both + wl, ": ", 2);
            memcpy(both + wl + 2, msg ? msg : "", mlen);
            json_str(stdout, both, wl + 2 + mlen);
            free(both);
        } else {
            json_str(stdout, msg ? msg : "", mlen);
        }
    } else {
        json_str(stdout, msg ? msg : "", mlen);
    }
    fputs(", \"hint\": ", stdout);
    if (h)
        json_str(stdout, h + 7, strlen(h + 7));
    else
        fputs("null", stdout);
    fputs("}", stdout);
}

static void json_error(int status, int exit_code, const char *what, const char *msg)
{
    fputs("{\"error\": ", stdout);
    json_error_body(status, exit_code, what, msg);
    fputs("}\n", stdout);
    fflush(stdout);
}

void tk_cli_json_error_body(int status, const char *msg)
{
    json_error_body(status, tk_cli_exit_code(status), NULL, msg);
}

void tk_cli_json_error(int status, const char *what, const char *msg)
{
    json_error(status, status == TK_CLI_STATUS_USAGE ? TK_EXIT_USAGE : tk_cli_exit_code(status), what, msg);
}

/* 1 when the first line of msg names `what` as a word of its own (not inside another name): then
 * "what: msg" would say it twice. */
static int names_it(const char *msg, const char *what)
{
    size_t first = strcspn(msg, "\n"), wl = strlen(what);
    for (const char *p = msg; wl && (p = memmem(p, first - (size_t)(p - msg), what, wl)) != NULL; p++) {
        char before = p == msg ? ' ' : p[-1], after = p[wl];
        if (!isalnum((unsigned char)before) && !strchr("_-./", before) &&
            (after == '\0' || after == '\n' || (!isalnum((unsigned char)after) && !strchr("_-/", after))))
            return 1;
    }
    return 0;
}

int tk_cli_fail(tk_cli *cli, int status, const char *what)
{
    if (cli && cli->tty)
        fputs("\r\033[K", stderr);
    const char *msg = tk_last_error();
    if (!msg || !*msg)
        msg = tk_status_str(status);
    /* a message that names it already says it once ("rmsnorm: 'rmsnorm' is not a package name") */
    if (what && *what && names_it(msg, what))
        what = NULL;
    if ((cli && cli->json) || tk_cli_json_mode) {
        tk_cli_json_error(status, what, msg);
        return tk_cli_exit_code(status);
    }
    if (what && *what)
        fprintf(stderr, "tk: %s: %s\n", what, msg);
    else
        fprintf(stderr, "tk: %s\n", msg);
    return tk_cli_exit_code(status);
}

int tk_cli_usage(const char *usage, const char *fmt, ...)
{
    va_list ap;
    if (tk_cli_json_mode) {
        char msg[1024];
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg - 200, fmt, ap);
        va_end(ap);
        size_t n = strlen(msg);
        /* one hint field: the usage line joins a hint the message has */
        snprintf(msg + n, sizeof msg - n, "%susage: %s", strstr(msg, "\nHINT: ") ? "\n" : "\nHINT: ", usage);
        tk_cli_json_error(TK_CLI_STATUS_USAGE, NULL, msg);
        return TK_EXIT_USAGE;
    }
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

void tk_cli_warn(tk_cli *cli, const char *fmt, ...)
{
    (void)cli; /* warnings show even under --quiet, as the library's do */
    va_list ap;
    va_start(ap, fmt);
    fputs("tk: warning: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

int tk_cli_is_help(const char *arg) { return !strcmp(arg, "-h") || !strcmp(arg, "--help"); }

void tk_cli_json_num(FILE *f, double v)
{
    if (isfinite(v))
        fprintf(f, "%.9g", v);
    else
        fputs("null", f);
}

/* Writes s as a JSON string (quotes included; NULL as ""). Bytes >= 0x80 pass through: the text is
 * UTF-8. */
void tk_cli_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c == '\r')
            fputs("\\r", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c < 0x20 || c == 0x7f)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

/* ---- failures a command finds itself (issue 15, item 4) -------------------------------------- */

int tk_cli_errorf(tk_cli *cli, int status, int exit_code, const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!exit_code)
        exit_code = status == TK_CLI_STATUS_USAGE ? TK_EXIT_USAGE : tk_cli_exit_code(status);
    if ((cli && cli->json) || tk_cli_json_mode) {
        json_error(status, exit_code, NULL, msg);
        return exit_code;
    }
    if (cli && cli->tty)
        fputs("\r\033[K", stderr);
    fprintf(stderr, "tk: %s\n", msg);
    return exit_code;
}

/* ---- did you mean (issue 23, item 14) ------------------------------------------------------------- */

/* Levenshtein distance, capped inputs (cli/ sees only tk.h: the library's copy is internal). */
static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b), row[65];
    if (la > 64 || lb > 64)
        return (size_t)-1;
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

const char *tk_cli_closest(const char *typed, const char *const *cands)
{
    const char *t = typed + strspn(typed, "-"), *best = NULL;
    size_t bestd = (size_t)-1, limit = strlen(t) / 3 ? strlen(t) / 3 : 1;
    for (size_t i = 0; cands && cands[i]; i++) {
        size_t d = edit_distance(t, cands[i] + strspn(cands[i], "-"));
        if (d < bestd) {
            bestd = d;
            best = cands[i];
        }
    }
    return best && bestd > 0 && bestd <= limit ? best : NULL;
}

int tk_cli_unknown_option(const char *usage, const char *opt)
{
    static const char *const global[] = {"--json", "--quiet", "--verbose", "--offline", "--help", "--version"};
    char words[64][40];
    const char *cands[64 + 8];
    size_t n = 0;
    for (const char *p = usage; (p = strstr(p, "--")) != NULL && n < 64; p += 2) {
        size_t len = 2 + strspn(p + 2, "abcdefghijklmnopqrstuvwxyz0123456789-");
        if (len > 2 && len < sizeof words[0]) {
            memcpy(words[n], p, len);
            words[n][len] = '\0';
            cands[n] = words[n];
            n++;
        }
        p += len - 2;
    }
    for (size_t i = 0; i < sizeof global / sizeof *global; i++)
        cands[n++] = global[i];
    cands[n] = NULL;
    const char *dym = tk_cli_closest(opt, cands);
    if (dym)
        return tk_cli_usage(usage, "unknown option '%s'\nHINT: did you mean '%s'?", opt, dym);
    return tk_cli_usage(usage, "unknown option '%s'", opt);
}

int tk_cli_pubkey_arg(char *out, size_t cap, const char *arg, const char *usage)
{
    FILE *f = strncmp(arg, "ed25519:", 8) != 0 ? fopen(arg, "r") : NULL;
    if (!f) { /* the key itself (the library checks it) */
        snprintf(out, cap, "%s", arg);
        return 0;
    }
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    if (strstr(buf, "PRIVATE KEY"))
        return tk_cli_usage(usage,
                            "%s is a private key: trust is given to the public half\nHINT: use %s.pub, the "
                            "file 'tk keygen' wrote beside it (never share the private key)",
                            arg, arg);
    char *s = buf + strspn(buf, " \t\r\n");
    s[strcspn(s, " \t\r\n")] = '\0';
    if (strncmp(s, "ed25519:", 8) != 0)
        return tk_cli_usage(usage,
                            "%s holds no public key (want ed25519:<64 hex>, the KEY.pub file 'tk keygen' "
                            "writes)",
                            arg);
    snprintf(out, cap, "%s", s);
    return 0;
}
