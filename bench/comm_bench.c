/*
 * comm_bench.c — all-reduce bandwidth of tk_comm, as nccl-tests reports it.
 *
 *     mpirun -np 2 build/bench/comm_bench [--dtype f32|bf16] [--iters N] [--max-bytes B]
 *     build/bench/comm_bench --nccl [--id-file F --rank R --size N]   (NCCL; one process a GPU)
 *
 * For each message size from 4 bytes up to --max-bytes (x4 steps; default 64 MiB), rank 0 prints
 * the mean time of one all-reduce (after warm-up, between barriers) and two bandwidths: algbw =
 * bytes / time, busbw = algbw * 2(n-1)/n (the bytes each rank's link carries in a ring all-reduce, so
 * comparable across rank counts). Results go in bench/RESULTS.md with the machine's load.
 *
 * One rank alone moves no data: with NCCL the call still runs (and is timed: its launch and stream
 * overhead) but the bandwidth columns say "-" instead of bytes / time; without NCCL (the self
 * backend) an all-reduce of one rank is nothing at all, so there is nothing to time and the bench says so.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tk.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int usage(void)
{
    fprintf(stderr, "usage: comm_bench [--dtype f32|bf16] [--iters N] [--max-bytes B] [--nccl [--id-file F "
                    "--rank R --size N]]\n");
    return 2;
}

int main(int argc, char **argv)
{
    tk_comm_opts o = TK_COMM_OPTS_INIT;
    tk_comm *c = NULL;
    tk_dtype dt = {TK_DL_FLOAT, 32, 1};
    long iters = 0, maxb = 64L << 20;
    int nccl = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--dtype") && v) {
            if (tk_dtype_parse(&dt, v) != TK_OK || dt.bits < 16)
                return usage();
            i++;
        } else if (!strcmp(a, "--iters") && v) {
            iters = strtol(v, NULL, 10), i++;
        } else if (!strcmp(a, "--max-bytes") && v) {
            maxb = strtol(v, NULL, 10), i++;
        } else if (!strcmp(a, "--nccl")) {
            nccl = 1;
        } else if (!strcmp(a, "--id-file") && v) {
            o.nccl_id_file = v, i++;
        } else if (!strcmp(a, "--rank") && v) {
            o.rank = (int)strtol(v, NULL, 10), i++;
        } else if (!strcmp(a, "--size") && v) {
            o.size = (int)strtol(v, NULL, 10), i++;
        } else {
            return usage();
        }
    }
    if (nccl) {
        o.backend = TK_COMM_NCCL;
        if (!o.nccl_id_file && o.size <= 1) { /* one rank alone: a private id file */
            static char p[128];
            snprintf(p, sizeof p, "/tmp/tk-comm-bench-%d", (int)getpid());
            o.nccl_id_file = p;
            o.rank = 0;
            o.size = 1;
        }
    }
    if (tk_comm_new(&c, &o) != TK_OK) {
        fprintf(stderr, "comm_bench: %s\n", tk_last_error());
        return 1;
    }
    int me = tk_comm_rank(c), n = tk_comm_size(c), dev = tk_comm_device(c);
    size_t es = dt.bits / 8;
    void *buf = NULL;
    if (dev >= 0) {
        if (tk_device_alloc(&buf, dev, (size_t)maxb) != TK_OK || tk_device_memset(buf, 0, (size_t)maxb, dev) != TK_OK) {
            fprintf(stderr, "comm_bench: %s\n", tk_last_error());
            return 1;
        }
    } else {
        buf = calloc(1, (size_t)maxb);
    }
    if (n == 1 && strcmp(tk_comm_backend(c), "nccl") != 0) {
        printf("# tk_comm all_reduce_sum, backend %s, 1 rank: an all-reduce of one rank moves no data and calls "
               "nothing; no figures (run it under mpirun -np N, or with --nccl on a GPU)\n",
               tk_comm_backend(c));
        tk_comm_free(c);
        free(buf);
        return 0;
    }
    if (me == 0) {
        char host[64] = "";
        gethostname(host, sizeof host - 1);
        printf("# tk_comm all_reduce_sum, backend %s, %d rank%s, %s, on %s%s\n", tk_comm_backend(c), n,
               n == 1 ? "" : "s", tk_dtype_name(dt), host, dev >= 0 ? " (GPU buffers)" : " (host buffers)");
        printf("| bytes | time (us) | algbw (GB/s) | busbw (GB/s) |\n|---:|---:|---:|---:|\n");
    }
    for (long bytes = 4; bytes <= maxb; bytes *= 4) {
        int64_t shape[1] = {bytes / (long)es};
        tk_tensor t = {buf, {dev >= 0 ? TK_DEV_CUDA : TK_DEV_CPU, dev >= 0 ? dev : 0}, 1, dt, shape, NULL, 0};
        long it = iters > 0 ? iters : bytes <= (1 << 16) ? 200 : bytes <= (4 << 20) ? 40 : 10;
        if (shape[0] == 0)
            continue;
        for (int w = 0; w < 3; w++)
            if (tk_comm_all_reduce_sum(c, &t, NULL) != TK_OK)
                goto fail;
        if (tk_comm_barrier(c) != TK_OK)
            goto fail;
        double t0 = now_s();
        for (long k = 0; k < it; k++)
            if (tk_comm_all_reduce_sum(c, &t, NULL) != TK_OK)
                goto fail;
        if (tk_comm_barrier(c) != TK_OK)
            goto fail;
        double dt_s = (now_s() - t0) / (double)it, alg = (double)bytes / dt_s / 1e9;
        if (me == 0 && n == 1) /* the real call, but no byte crossed a link: no bandwidth */
            printf("| %ld | %.1f | - | - |\n", bytes, dt_s * 1e6);
        else if (me == 0)
            printf("| %ld | %.1f | %.3f | %.3f |\n", bytes, dt_s * 1e6, alg, alg * 2.0 * (n - 1) / n);
        fflush(stdout);
    }
    if (dev >= 0)
        tk_device_free(buf, dev);
    else
        free(buf);
    tk_comm_free(c);
    return 0;
fail:
    fprintf(stderr, "comm_bench: rank %d: %s\n", me, tk_last_error());
    tk_comm_abort(c, 1);
    return 1;
}
