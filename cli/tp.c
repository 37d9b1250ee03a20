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

/* ---- --tp N --device cuda: the backend and each rank's GPU ----
 * NCCL when it loads on every rank and every host has a GPU for each of its ranks (one GPU a rank);
 * else MPI, which stages each collective's GPU tensors through host memory and lets ranks share a GPU.
 * TK_COMM_BACKEND=nccl or mpi forces one (auto, or unset: the choice above). */

enum { PICK_AUTO, PICK_MPI, PICK_NCCL };

static int backend_env(tk_cli *cli, int *pick)
{
    const char *v = getenv("TK_COMM_BACKEND");
    *pick = PICK_AUTO;
    if (!v || !*v || !strcmp(v, "auto"))
        return 0;
    if (!strcmp(v, "mpi") || !strcmp(v, "nccl")) {
        *pick = v[0] == 'm' ? PICK_MPI : PICK_NCCL;
        return 0;
    }
    return tk_cli_errorf(cli, TK_ERR_INVALID, TK_EXIT_USAGE,
                         "TK_COMM_BACKEND='%s': want auto, mpi or nccl\nHINT: unset it to let --tp choose "
                         "(NCCL when every rank has a GPU of its own, else MPI)",
                         v);
}

/* Why NCCL cannot run this rank (into why, "" when it can); ndev: the GPUs this process sees. */
static void nccl_why(char *why, size_t cap, tk_comm *c, int ndev, int indexed)
{
    char *js = NULL;
    json_t *b = tk_comm_backends_json(&js) == TK_OK && js ? json_loads(js, 0, NULL) : NULL;
    int found = json_is_true(json_object_get(json_object_get(b, "nccl"), "found"));
    json_decref(b);
    tk_free(js);
    why[0] = '\0';
    if (!found)
        snprintf(why, cap, "NCCL (libnccl.so.2) is not found on %s (TK_NCCL names it)",
                 tk_comm_host(c, tk_comm_rank(c)));
    else if (tk_comm_local_size(c) > ndev)
        snprintf(why, cap, "host %s runs %d ranks but shows %d GPU%s (NCCL needs one GPU a rank)",
                 tk_comm_host(c, tk_comm_rank(c)), tk_comm_local_size(c), ndev, ndev == 1 ? "" : "s");
    else if (indexed && tk_comm_local_size(c) > 1)
        snprintf(why, cap, "--device cuda:N gives the %d ranks of host %s one GPU (NCCL needs one GPU a rank)",
                 tk_comm_local_size(c), tk_comm_host(c, tk_comm_rank(c)));
}

/* The ranks' facts summed over MPI (every rank gets the same): [0] ranks without a GPU, [1] ranks where
 * NCCL cannot run. */
static int tp_vote(tk_comm *c, int64_t v[2])
{
    int64_t s1[1] = {2};
    tk_tensor t = {v, {TK_DEV_CPU, 0}, 1, {TK_DL_INT, 64, 1}, s1, NULL, 0};
    return tk_comm_all_reduce_sum(c, &t, NULL);
}

/* Replaces the MPI communicator *comm with an NCCL one over the same ranks; the model goes on its GPU. */
static int join_nccl(tk_cli *cli, tk_comm **comm, int n, int indexed, int *device_id)
{
    tk_comm *nc = NULL;
    tk_comm_opts o = TK_COMM_OPTS_INIT;
    o.backend = TK_COMM_NCCL;
    o.expect_size = n;
    o.device = indexed ? *device_id : -1;
    int rc = tk_comm_new(&nc, &o);
    tk_comm_free(*comm); /* NCCL's communicator holds its own MPI one */
    *comm = NULL;
    if (rc != TK_OK)
        return tk_cli_fail(cli, rc, "--tp");
    *comm = nc;
    *device_id = tk_comm_device(nc);
    return 0;
}

/* After the MPI join of n > 1 ranks, with the model on a GPU: the backend (staying on MPI or moving to
 * NCCL) and this rank's GPU in *device_id. */
static int tp_gpu(tk_cli *cli, tk_comm **comm, int n, int pick, const char *device, int *device_id)
{
    tk_comm *c = *comm;
    int ndev = 0, rank = tk_comm_rank(c), indexed = device && !strncmp(device, "cuda:", 5);
    int drc = tk_device_count(&ndev);
    char why[512] = "", derr[512] = "";
    if (drc != TK_OK)
        snprintf(derr, sizeof derr, "%s", tk_last_error());
    else if (ndev == 0)
        snprintf(derr, sizeof derr, "rank %d on %s sees no GPU", rank, tk_comm_host(c, rank));
    else if (indexed && *device_id >= ndev)
        snprintf(derr, sizeof derr, "rank %d on %s shows %d GPU%s", rank, tk_comm_host(c, rank), ndev,
                 ndev == 1 ? "" : "s");
    else
        nccl_why(why, sizeof why, c, ndev, indexed);
    int64_t v[2] = {derr[0] != '\0', why[0] != '\0'};
    int rc = tp_vote(c, v);
    if (rc != TK_OK)
        return tk_cli_fail(cli, rc, "--tp");
    if (v[0]) /* every rank stops; each without its GPU says why */
        return tk_cli_errorf(cli, TK_ERR_NO_DEVICE, tk_cli_exit_code(TK_ERR_NO_DEVICE), "--tp %d --device %s: %s%s", n,
                             device, derr[0] ? derr : "another rank has no GPU for it (its error says why)",
                             strstr(derr, "\nHINT:") ? ""
                                                     : "\nHINT: every rank needs a GPU; drop --device for the CPU");
    if (pick == PICK_NCCL && v[1])
        return tk_cli_errorf(cli, TK_ERR_UNSUPPORTED, tk_cli_exit_code(TK_ERR_UNSUPPORTED),
                             "TK_COMM_BACKEND=nccl, but %s\nHINT: unset TK_COMM_BACKEND to stage through MPI instead",
                             why[0] ? why : "NCCL cannot run on another rank (its error says why)");
    if (pick == PICK_NCCL || (pick == PICK_AUTO && !v[1])) {
        if ((rc = join_nccl(cli, comm, n, indexed, device_id)) == 0 && rank == 0)
            tk_cli_info(cli, "tensor parallel on GPUs: NCCL, one GPU a rank (TK_COMM_BACKEND=mpi stages through "
                             "the host instead)\n");
        return rc;
    }
    if (!indexed)
        *device_id = tk_comm_local_rank(c) % ndev;
    if (rank == 0)
        tk_cli_info(cli, "tensor parallel on GPUs: MPI, each collective staged through host memory (%s%s%s)\n",
                    pick == PICK_MPI ? "TK_COMM_BACKEND=mpi" : "NCCL: ",
                    pick == PICK_MPI ? ""
                    : why[0]         ? why
                                     : "not usable on another rank",
                    pick == PICK_MPI ? "" : "; TK_COMM_BACKEND=nccl forces it");
    return 0;
}

int tk_cli_tp_join(tk_cli *cli, tk_comm **comm, int n, const char *device, int *device_id)
{
    int pick, cuda = device && !strncmp(device, "cuda", 4), ec;
    *comm = NULL;
    if ((ec = backend_env(cli, &pick)) != 0)
        return ec;
    if (pick == PICK_NCCL && !cuda)
        return tk_cli_errorf(cli, TK_ERR_INVALID, TK_EXIT_USAGE,
                             "TK_COMM_BACKEND=nccl, but the model runs on the CPU: NCCL moves GPU memory\n"
                             "HINT: add --device cuda, or unset TK_COMM_BACKEND");
    if ((ec = tk_cli_comm_join(cli, comm, n, "--tp")) != 0 || !cuda || tk_comm_size(*comm) == 1)
        return ec;
    if ((ec = tp_gpu(cli, comm, n, pick, device, device_id)) != 0) {
        tk_comm_free(*comm);
        *comm = NULL;
    }
    return ec;
}

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
