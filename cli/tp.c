/*
 * tp.c — --tp N of the model commands (tk model logits, tk generate), and tk train's --dp N: join the
 * ranks mpirun started, check their number against N, let rank 0 alone print, and report what each
 * rank holds (its weight bytes, gathered from every rank). docs/parallel.md.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cli.h"

int tk_cli_tp_parse(const char *usage, const char *v, int *n)
{
    char *end = NULL;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || end == v || *end || x < 1 || x > 4096)
        return tk_cli_usage(usage, "--tp wants the number of ranks, 1 to 4096 (got '%s')", v ? v : "");
    *n = (int)x;
    return 0;
}

int tk_cli_tp_join(tk_cli *cli, tk_comm **comm, int n) { return tk_cli_comm_join(cli, comm, n, "--tp"); }

int tk_cli_comm_join(tk_cli *cli, tk_comm **comm, int n, const char *flag)
{
    *comm = NULL;
    tk_comm *c = NULL;
    int rc = tk_comm_new(&c, NULL);
    if (rc != TK_OK)
        return tk_cli_fail(cli, rc, flag);
    int world = tk_comm_size(c), rank = tk_comm_rank(c);
    if (world != n) {
        int ec = TK_EXIT_USAGE;
        if (rank == 0)
            ec = tk_cli_errorf(cli, TK_ERR_INVALID, TK_EXIT_USAGE,
                               "%s %d, but %d process%s started (the world size must equal %s)\n"
                               "HINT: %s%s%s",
                               flag, n, world, world == 1 ? " was" : "es were", flag,
                               world == 1 ? "start one process a rank with mpirun, e.g. mpirun -np N tk ... "
                                          : "give mpirun -np the same number as ",
                               flag, world == 1 ? " N" : "");
        tk_comm_free(c);
        return ec;
    }
    if (rank != 0 && !freopen("/dev/null", "w", stdout)) { /* rank 0 alone prints results */
        tk_comm_free(c);
        return tk_cli_errorf(cli, TK_ERR_IO, TK_EXIT_IO, "rank %d: cannot silence stdout", rank);
    }
    if (rank != 0)
        cli->quiet = 1;
    *comm = c;
    return 0;
}

/* VmRSS of this process in bytes (0 when /proc does not say). */
static int64_t rss_bytes(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6) && sscanf(line + 6, "%lld", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return (int64_t)kb * 1024;
}

static int64_t jint(const json_t *o, const char *key, int64_t def)
{
    const json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : def;
}

int tk_cli_tp_report(json_t **out, tk_comm *c, const tk_model *m)
{
    *out = NULL;
    char *info = NULL;
    int rc = tk_model_info_json(&info, m);
    if (rc != TK_OK)
        return rc;
    json_t *in = json_loads(info, 0, NULL), *tp = json_object_get(in, "tensor_parallel");
    tk_free(info);
    int world = tk_comm_size(c);
    enum { NF = 5 }; /* the per-rank figures gathered */
    int64_t mine[NF] = {jint(in, "weight_bytes", 0), jint(in, "mapped_bytes", 0), rss_bytes(),
                        jint(tp, "head_bytes_sent", 0), jint(in, "hugepage_bytes", 0)};
    int64_t *all = calloc((size_t)world * NF, sizeof *all);
    json_t *o = json_object(), *ranks = json_array();
    if (!in || !all || !o || !ranks) {
        rc = TK_ERR_NOMEM;
        goto done;
    }
    int64_t s1[1] = {NF}, sa[1] = {NF * (int64_t)world};
    tk_tensor tin = {mine, {TK_DEV_CPU, 0}, 1, {TK_DL_INT, 64, 1}, s1, NULL, 0};
    tk_tensor tout = {all, {TK_DEV_CPU, 0}, 1, {TK_DL_INT, 64, 1}, sa, NULL, 0};
    if ((rc = tk_comm_all_gather(c, &tout, &tin, NULL)) != TK_OK)
        goto done;
    for (int r = 0; r < world; r++) {
        const int64_t *a = all + NF * r;
        json_array_append_new(ranks,
                              json_pack("{s:i, s:I, s:I, s:I, s:I, s:I}", "rank", r, "weight_bytes", (json_int_t)a[0],
                                        "mapped_bytes", (json_int_t)a[1], "hugepage_bytes", (json_int_t)a[4],
                                        "rss_bytes", (json_int_t)a[2], "head_bytes_sent", (json_int_t)a[3]));
    }
    json_object_set_new(o, "world_size", json_integer(world));
    json_object_set(o, "plan", tp ? json_object_get(tp, "plan") : json_null());
    json_object_set_new(o, "unsplit_weight_bytes", json_integer(jint(tp, "unsplit_weight_bytes", mine[0])));
    json_object_set(o, "ranks", ranks);
    *out = o;
    o = NULL;
done:
    json_decref(in);
    json_decref(o);
    json_decref(ranks);
    free(all);
    return rc;
}

void tk_cli_tp_print(tk_cli *cli, const json_t *report)
{
    if (!report || cli->quiet)
        return;
    int64_t unsplit = jint(report, "unsplit_weight_bytes", 0);
    char u[32], b[32];
    const json_t *ranks = json_object_get(report, "ranks"), *r;
    size_t i;
    tk_cli_human(u, sizeof u, (double)unsplit);
    fprintf(stderr, "tensor parallel: %zu ranks, weights per rank:", json_array_size(ranks));
    json_array_foreach(ranks, i, r) {
        int64_t w = jint(r, "weight_bytes", 0);
        tk_cli_human(b, sizeof b, (double)w);
        fprintf(stderr, "%s %s (%.1f%%)", i ? "," : "", b, unsplit > 0 ? 100.0 * (double)w / (double)unsplit : 0.0);
    }
    fprintf(stderr, " of %s unsplit\n", u);
}
