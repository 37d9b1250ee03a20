/*
 * cmd_cache.c — tk cache ls|stats|gc|clear: the compiled-binary cache.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"

static const char *USAGE = "tk cache ls|stats|gc [--max SIZE]|clear";

static const char *HELP =
    "NAME\n"
    "    tk cache - inspect and trim the compiled-binary cache\n"
    "\n"
    "SYNOPSIS\n"
    "    tk cache ls [--json]\n"
    "    tk cache stats [--json]\n"
    "    tk cache gc [--max SIZE] [--json]\n"
    "    tk cache clear\n"
    "\n"
    "DESCRIPTION\n"
    "    tk keeps every compiled kernel binary in cache.db under the cache directory, keyed by\n"
    "    the sha256 of its sources, headers, name expressions, options, target architecture and\n"
    "    NVRTC version. Removing entries is always safe: they are recompiled when next needed.\n"
    "\n"
    "    ls      every entry, most recently used first: key, target, size, last use, package,\n"
    "            the kernels it holds, and their recorded self-tests per GPU, driver and tk\n"
    "            version ('tk selftest'; they are kept by gc and clear: a binary compiled again\n"
    "            has the same key).\n"
    "    stats   entry count, total size, size cap and the database path.\n"
    "    gc      evicts least-recently-used entries until the cache fits the cap.\n"
    "    clear   removes every entry.\n"
    "\n"
    "OPTIONS\n"
    "    --max SIZE   the cap for gc, in bytes or with a K, M or G suffix (default: TK_CACHE_MAX,\n"
    "                 else \"cache_max\" in config.json, else 2G).\n"
    "    --json       machine-readable output.\n"
    "\n"
    "EXAMPLES\n"
    "    tk cache stats\n"
    "    tk cache gc --max 500M\n";

static int parse_size(const char *s, int64_t *out)
{
    char *end = NULL;
    long long v = strtoll(s, &end, 10);
    int64_t mul = 1;
    if (!s[0] || s[0] == '-' || end == s || v < 0)
        return -1;
    switch (*end) {
    case 'k':
    case 'K':
        mul = 1LL << 10;
        end++;
        break;
    case 'm':
    case 'M':
        mul = 1LL << 20;
        end++;
        break;
    case 'g':
    case 'G':
        mul = 1LL << 30;
        end++;
        break;
    case 't':
    case 'T':
        mul = 1LL << 40;
        end++;
        break;
    default: break;
    }
    if (mul > 1 && *end == 'i')
        end++;
    if (*end == 'b' || *end == 'B')
        end++;
    if (*end || __builtin_mul_overflow((int64_t)v, mul, out))
        return -1;
    return 0;
}

/* "selftest: 3 passed, 1 failed on NVIDIA H100 (driver ...)" per GPU, driver and tk, and each kernel
 * that did not pass. */
static void print_selftests(json_t *recs)
{
    size_t i, j;
    json_t *r, *seen = json_array();
    json_array_foreach(recs, i, r) {
        char key[512];
        snprintf(key, sizeof key, "%s|%s|%s", json_string_value(json_object_get(r, "gpu_uuid")),
                 json_string_value(json_object_get(r, "driver")), json_string_value(json_object_get(r, "tk_version")));
        int done = 0;
        json_t *s;
        json_array_foreach(seen, j, s)
            done |= !strcmp(json_string_value(s), key);
        if (done)
            continue;
        json_array_append_new(seen, json_string(key));
        long long pass = 0, other = 0;
        json_t *q;
        json_array_foreach(recs, j, q) {
            char k2[512];
            snprintf(k2, sizeof k2, "%s|%s|%s", json_string_value(json_object_get(q, "gpu_uuid")),
                     json_string_value(json_object_get(q, "driver")),
                     json_string_value(json_object_get(q, "tk_version")));
            if (strcmp(k2, key))
                continue;
            if (!strcmp(json_string_value(json_object_get(q, "status")), "passed"))
                pass++;
            else
                other++;
        }
        printf("              selftest on %s (driver %s, tk %s): %lld passed%s",
               json_string_value(json_object_get(r, "gpu_name")), json_string_value(json_object_get(r, "driver")),
               json_string_value(json_object_get(r, "tk_version")), pass, other ? "; not passed:" : "");
        json_array_foreach(recs, j, q) {
            char k2[512];
            snprintf(k2, sizeof k2, "%s|%s|%s", json_string_value(json_object_get(q, "gpu_uuid")),
                     json_string_value(json_object_get(q, "driver")),
                     json_string_value(json_object_get(q, "tk_version")));
            if (!strcmp(k2, key) && strcmp(json_string_value(json_object_get(q, "status")), "passed"))
                printf(" %s (%s)", json_string_value(json_object_get(q, "kernel")),
                       json_string_value(json_object_get(q, "status")));
        }
        printf("\n");
    }
    json_decref(seen);
}

static int do_ls(tk_cli *cli, tk_ctx *ctx)
{
    char *js = NULL;
    int rc = tk_cache_list_json(&js, ctx);
    json_t *arr;
    size_t i;
    json_t *e;
    if (rc != TK_OK)
        return tk_cli_fail(cli, rc, NULL);
    if (cli->json) {
        printf("%s\n", js);
        tk_free(js);
        return TK_EXIT_OK;
    }
    arr = json_loads(js, 0, NULL);
    tk_free(js);
    if (!json_array_size(arr)) {
        printf("the compiled-binary cache is empty\n");
        json_decref(arr);
        return TK_EXIT_OK;
    }
    printf("%-12s  %-12s  %10s  %-16s  %s\n", "KEY", "TARGET", "SIZE", "LAST USED", "PACKAGE / KERNELS");
    json_array_foreach(arr, i, e) {
        char size[32], when[32];
        time_t t = (time_t)json_integer_value(json_object_get(e, "last_used"));
        struct tm tm;
        tk_cli_human(size, sizeof size, (double)json_integer_value(json_object_get(e, "size")));
        strftime(when, sizeof when, "%Y-%m-%d %H:%M", localtime_r(&t, &tm));
        const char *commit = json_string_value(json_object_get(e, "commit"));
        json_t *ks = json_object_get(e, "kernels"), *k;
        size_t j;
        printf("%-12.12s  %-12s  %10s  %-16s  %s@%s\n              %s:", json_string_value(json_object_get(e, "key")),
               json_string_value(json_object_get(e, "target")), size, when,
               json_string_value(json_object_get(e, "package")), commit ? commit : "local",
               json_string_value(json_object_get(e, "source")));
        json_array_foreach(ks, j, k)
            printf("%s%s", j ? ", " : " ", json_string_value(k));
        if ((size_t)json_integer_value(json_object_get(e, "kernel_count")) > json_array_size(ks))
            printf(" ... (%lld kernels)", (long long)json_integer_value(json_object_get(e, "kernel_count")));
        printf("\n");
        print_selftests(json_object_get(e, "selftest"));
    }
    json_decref(arr);
    return TK_EXIT_OK;
}

static int do_stats(tk_cli *cli, tk_ctx *ctx)
{
    char *js = NULL, size[32], cap[32];
    json_t *o;
    int rc = tk_cache_stats_json(&js, ctx);
    if (rc != TK_OK)
        return tk_cli_fail(cli, rc, NULL);
    if (cli->json) {
        printf("%s\n", js);
        tk_free(js);
        return TK_EXIT_OK;
    }
    o = json_loads(js, 0, NULL);
    tk_free(js);
    tk_cli_human(size, sizeof size, (double)json_integer_value(json_object_get(o, "bytes")));
    tk_cli_human(cap, sizeof cap, (double)json_integer_value(json_object_get(o, "max_bytes")));
    printf("path:     %s\nentries:  %lld\nsize:     %s\ncap:      %s\n", json_string_value(json_object_get(o, "path")),
           (long long)json_integer_value(json_object_get(o, "entries")), size, cap);
    json_t *nv = json_object_get(o, "nvrtc");
    if (json_is_object(nv))
        printf("nvrtc:    %s at %s\n", json_string_value(json_object_get(nv, "version")),
               json_string_value(json_object_get(nv, "path")));
    else
        printf("nvrtc:    not found (cached binaries still load; nothing new compiles)\n");
    json_decref(o);
    return TK_EXIT_OK;
}

int tk_cmd_cache(tk_cli *cli, int argc, char **argv)
{
    const char *sub = NULL;
    int64_t max = -1, freed = 0;
    int rc;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (tk_cli_is_help(a)) {
            fputs(HELP, stdout);
            return TK_EXIT_OK;
        } else if (!strcmp(a, "--max") || !strncmp(a, "--max=", 6)) {
            const char *v = a[5] == '=' ? a + 6 : (++i < argc ? argv[i] : NULL);
            if (!v || parse_size(v, &max) != 0)
                return tk_cli_usage(USAGE, "--max wants a size such as 500M or 2G");
        } else if (!strcmp(a, "--json")) {
            cli->json = 1;
        } else if (a[0] == '-') {
            return tk_cli_unknown_option(USAGE, a);
        } else if (!sub) {
            sub = a;
        } else {
            return tk_cli_usage(USAGE, "unexpected '%s'", a);
        }
    }
    if (!sub)
        return tk_cli_usage(USAGE, "which action? ls, stats, gc or clear");
    if (strcmp(sub, "ls") && strcmp(sub, "list") && strcmp(sub, "stats") && strcmp(sub, "gc") && strcmp(sub, "clear"))
        return tk_cli_usage(USAGE, "unknown action '%s'", sub);
    if (max >= 0 && strcmp(sub, "gc"))
        return tk_cli_usage(USAGE, "--max goes with gc");
    tk_ctx *ctx = tk_cli_ctx(cli);
    if (!ctx)
        return TK_EXIT_FAIL;
    if (!strcmp(sub, "ls") || !strcmp(sub, "list"))
        return do_ls(cli, ctx);
    if (!strcmp(sub, "stats"))
        return do_stats(cli, ctx);
    if (!strcmp(sub, "gc")) {
        char h[32];
        if ((rc = tk_cache_gc(ctx, max, &freed)) != TK_OK)
            return tk_cli_fail(cli, rc, NULL);
        tk_cli_human(h, sizeof h, (double)freed);
        if (cli->json)
            printf("{\"freed\": %lld}\n", (long long)freed);
        else
            printf("freed %s\n", h);
        return TK_EXIT_OK;
    }
    if ((rc = tk_cache_clear(ctx)) != TK_OK)
        return tk_cli_fail(cli, rc, NULL);
    if (cli->json)
        printf("{\"cleared\": true}\n");
    else
        printf("cleared the compiled-binary cache\n");
    return TK_EXIT_OK;
}
