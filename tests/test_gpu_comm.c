/*
 * test_gpu_comm.c — the NCCL backend of tk_comm on GPUs (scripts/gpu-check.sh runs it; it skips
 * without a GPU, and without NCCL unless TK_TEST_NCCL=1).
 *
 *   - one rank on cuda:0 (bootstrapped through an id file): every collective on device memory, f32
 *     and bf16, in place and not; on host memory (staged through the GPU) and mixed, the time of a one-rank all-reduce at 64 MiB (printed; one rank moves no data, so no bandwidth);
 *   - the self backend (one rank, no NCCL) gathering GPU tensors: a device copy;
 *   - a rank that never comes: creation fails with TK_ERR_NETWORK within the timeout (NCCL's
 *     non-blocking init polled and aborted), which needs only one GPU;
 *   - with 2 or more GPUs, one process a GPU (this binary again, "--rank R N FILE"): sums and gathers
 *     across them.
 */
#define _GNU_SOURCE
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpu_util.h"

extern char **environ;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* 1 when NCCL loads; SKIP-worthy otherwise (a failure with TK_TEST_NCCL=1). */
static int have_nccl(void)
{
    char *js = NULL;
    int found = tk_comm_backends_json(&js) == TK_OK && strstr(js, "\"nccl\":{\"found\":true");
    if (!found && getenv("TK_TEST_NCCL") && !strcmp(getenv("TK_TEST_NCCL"), "1")) {
        fprintf(stderr, "TK_TEST_NCCL=1 but NCCL was not found: %s\n", js ? js : tk_last_error());
        th_cur_failed++;
    }
    if (js)
        printf("backends: %s\n", js);
    tk_free(js);
    return found;
}

static char *id_path(const char *tag)
{
    static char p[256];
    snprintf(p, sizeof p, "/tmp/tk-nccl-id-%s-%d", tag, (int)getpid());
    unlink(p);
    return p;
}

static tk_tensor cuda_tensor(void *d, tk_dtype dt, int64_t *shape, int dev)
{
    tk_tensor t = {d, {TK_DEV_CUDA, dev}, 1, dt, shape, NULL, 0};
    return t;
}

static void test_nccl_one_rank(void)
{
    if (!gpu_device())
        SKIP("no GPU");
    if (!have_nccl())
        SKIP("NCCL not found (TK_NCCL names libnccl.so.2)");
    tk_comm *c = NULL;
    tk_comm_opts o = TK_COMM_OPTS_INIT;
    o.backend = TK_COMM_NCCL;
    o.nccl_id_file = id_path("one");
    o.rank = 0;
    o.size = 1;
    o.timeout_ms = 60000;
    CHECK_RC(tk_comm_new(&c, &o), TK_OK);
    if (!c)
        return;
    CHECK_STR(tk_comm_backend(c), "nccl");
    CHECK_EQ_INT(tk_comm_size(c), 1);
    CHECK_EQ_INT(tk_comm_device(c), 0);
    CHECK(access(o.nccl_id_file, F_OK) != 0); /* rank 0 removed it once everyone had joined */
    enum { N = 1000003 };
    float *h = malloc(N * sizeof *h), *back = malloc(2 * N * sizeof *back);
    void *d = NULL, *g = NULL;
    for (int i = 0; i < N; i++)
        h[i] = (float)(i % 1000) * 0.5f;
    CHECK_RC(tk_device_alloc(&d, 0, N * sizeof(float)), TK_OK);
    CHECK_RC(tk_device_alloc(&g, 0, N * sizeof(float)), TK_OK);
    CHECK_RC(tk_device_copy(d, h, N * sizeof(float), TK_COPY_H2D, 0), TK_OK);
    int64_t s[1] = {N};
    tk_dtype f32 = {TK_DL_FLOAT, 32, 1}, bf16 = {TK_DL_BFLOAT, 16, 1};
    tk_tensor t = cuda_tensor(d, f32, s, 0), tg = cuda_tensor(g, f32, s, 0);
    CHECK_RC(tk_comm_all_reduce_sum(c, &t, NULL), TK_OK);
    CHECK_RC(tk_comm_broadcast(c, &t, 0, NULL), TK_OK);
    CHECK_RC(tk_comm_all_gather(c, &tg, &t, NULL), TK_OK);
    CHECK_RC(tk_comm_all_gather(c, &t, &t, NULL), TK_OK);
    CHECK_RC(tk_comm_barrier(c), TK_OK);
    CHECK_RC(tk_device_copy(back, d, N * sizeof(float), TK_COPY_D2H, 0), TK_OK);
    CHECK_RC(tk_device_copy(back + N, g, N * sizeof(float), TK_COPY_D2H, 0), TK_OK);
    CHECK(memcmp(back, h, N * sizeof(float)) == 0);
    CHECK(memcmp(back + N, h, N * sizeof(float)) == 0);
    tk_tensor tb = cuda_tensor(d, bf16, s, 0);
    CHECK_RC(tk_comm_all_reduce_sum(c, &tb, NULL), TK_OK);
    /* host tensors are staged through device memory (one rank: the values come back unchanged), in
     * every mix for the gather; a tensor on another GPU than the communicator's is refused */
    tk_tensor host = {h, {TK_DEV_CPU, 0}, 1, f32, s, NULL, 0}, hback = {back, {TK_DEV_CPU, 0}, 1, f32, s, NULL, 0};
    CHECK_RC(tk_comm_all_reduce_sum(c, &host, NULL), TK_OK);
    CHECK_RC(tk_comm_broadcast(c, &host, 0, NULL), TK_OK);
    memset(back, 0, N * sizeof(float));
    CHECK_RC(tk_comm_all_gather(c, &hback, &host, NULL), TK_OK); /* host in, host out */
    CHECK(memcmp(back, h, N * sizeof(float)) == 0);
    memset(back, 0, N * sizeof(float));
    CHECK_RC(tk_comm_all_gather(c, &hback, &tg, NULL), TK_OK); /* device in, host out */
    CHECK(memcmp(back, h, N * sizeof(float)) == 0);
    CHECK_RC(tk_device_memset(g, 0, N * sizeof(float), 0), TK_OK);
    CHECK_RC(tk_comm_all_gather(c, &tg, &host, NULL), TK_OK); /* host in, device out */
    CHECK_RC(tk_device_copy(back, g, N * sizeof(float), TK_COPY_D2H, 0), TK_OK);
    CHECK(memcmp(back, h, N * sizeof(float)) == 0);
    tk_tensor other = cuda_tensor(d, f32, s, 7);
    CHECK_RC(tk_comm_all_reduce_sum(c, &other, NULL), TK_ERR_UNSUPPORTED);
    CHECK_CONTAINS(tk_last_error(), "this NCCL rank works on cuda:0");
    /* the time of NCCL's one-rank all-reduce at 64 MiB (informational). One rank in place moves no
     * data, so there is no bandwidth to print (the first GPU run printed 2581110 GB/s: tk skipped the
     * call for one rank and timed nothing). */
    void *big = NULL;
    int64_t nb[1] = {16 << 20};
    if (tk_device_alloc(&big, 0, (size_t)nb[0] * 4) == TK_OK) {
        tk_tensor tbig = cuda_tensor(big, f32, nb, 0);
        tk_comm_all_reduce_sum(c, &tbig, NULL);
        double t0 = now_s();
        for (int i = 0; i < 20; i++)
            CHECK_RC(tk_comm_all_reduce_sum(c, &tbig, NULL), TK_OK);
        double dt = (now_s() - t0) / 20;
        printf("nccl 1 rank: all_reduce 64 MiB f32 in place %.3f ms a call (NCCL's own call; one rank moves no "
               "data)\n",
               dt * 1e3);
        CHECK(dt > 1e-7); /* the call ran: 20 of them take more than 2 us (tk no longer skips them) */
        tk_device_free(big, 0);
    }
    tk_device_free(d, 0);
    tk_device_free(g, 0);
    free(h);
    free(back);
    tk_comm_free(c);
}

/* The self backend (one rank, no NCCL) with GPU tensors: in place is nothing to do, and a gather into
 * another buffer copies on the device (the first GPU run found one-rank gathers refused). */
static void test_self_one_rank_gpu(void)
{
    if (!gpu_device())
        SKIP("no GPU");
    tk_comm *c = NULL;
    tk_comm_opts o = TK_COMM_OPTS_INIT;
    o.backend = TK_COMM_SELF;
    CHECK_RC(tk_comm_new(&c, &o), TK_OK);
    if (!c)
        return;
    enum { N = 300001 };
    float *h = malloc(N * sizeof *h), *back = calloc(N, sizeof *back);
    void *d = NULL, *g = NULL;
    for (int i = 0; i < N; i++)
        h[i] = (float)(i % 977) - 3.25f;
    CHECK_RC(tk_device_alloc(&d, 0, N * sizeof(float)), TK_OK);
    CHECK_RC(tk_device_alloc(&g, 0, N * sizeof(float)), TK_OK);
    CHECK_RC(tk_device_memset(g, 0, N * sizeof(float), 0), TK_OK);
    CHECK_RC(tk_device_copy(d, h, N * sizeof(float), TK_COPY_H2D, 0), TK_OK);
    int64_t s[1] = {N};
    tk_dtype f32 = {TK_DL_FLOAT, 32, 1};
    tk_tensor t = cuda_tensor(d, f32, s, 0), tg = cuda_tensor(g, f32, s, 0);
    CHECK_RC(tk_comm_all_gather(c, &t, &t, NULL), TK_OK);
    CHECK_RC(tk_comm_all_gather(c, &tg, &t, NULL), TK_OK);
    CHECK_RC(tk_comm_all_reduce_sum(c, &t, NULL), TK_OK);
    CHECK_RC(tk_device_copy(back, g, N * sizeof(float), TK_COPY_D2H, 0), TK_OK);
    CHECK(memcmp(back, h, N * sizeof(float)) == 0);
    CHECK_RC(tk_device_copy(back, d, N * sizeof(float), TK_COPY_D2H, 0), TK_OK);
    CHECK(memcmp(back, h, N * sizeof(float)) == 0);
    tk_device_free(d, 0);
    tk_device_free(g, 0);
    free(h);
    free(back);
    tk_comm_free(c);
}

static void test_nccl_peer_never_comes(void)
{
    if (!gpu_device())
        SKIP("no GPU");
    if (!have_nccl())
        SKIP("NCCL not found");
    tk_comm *c = NULL;
    tk_comm_opts o = TK_COMM_OPTS_INIT;
    o.backend = TK_COMM_NCCL;
    o.nccl_id_file = id_path("lonely");
    o.rank = 0;
    o.size = 2; /* rank 1 never starts */
    o.timeout_ms = 3000;
    double t0 = now_s();
    CHECK_RC(tk_comm_new(&c, &o), TK_ERR_NETWORK);
    double dt = now_s() - t0;
    CHECK(c == NULL);
    CHECK_CONTAINS(tk_last_error(), "timed out after");
    printf("a missing peer: failed after %.1f s: %s\n", dt, tk_last_error());
    CHECK(dt < 30);
    unlink(o.nccl_id_file);
    /* a stale id file is refused by rank 0 */
    FILE *f = fopen(o.nccl_id_file, "w");
    if (f)
        fclose(f);
    o.size = 1;
    CHECK_RC(tk_comm_new(&c, &o), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "exists already");
    unlink(o.nccl_id_file);
}

/* One rank of the multi-GPU test: sums its rank+1, gathers ranks. */
static int rank_main(int rank, int size, const char *file)
{
    tk_comm *c = NULL;
    tk_comm_opts o = TK_COMM_OPTS_INIT;
    o.backend = TK_COMM_NCCL;
    o.nccl_id_file = file;
    o.rank = rank;
    o.size = size;
    o.timeout_ms = 60000;
    if (tk_comm_new(&c, &o) != TK_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, tk_last_error());
        return 1;
    }
    int dev = tk_comm_device(c), bad = 0;
    enum { N = 4099 };
    float *h = malloc((size_t)N * size * sizeof *h);
    void *d = NULL, *g = NULL;
    int64_t s[1] = {N}, sg[1] = {(int64_t)N * size};
    for (int i = 0; i < N; i++)
        h[i] = (float)(rank + 1);
    tk_device_alloc(&d, dev, N * sizeof(float));
    tk_device_alloc(&g, dev, (size_t)N * size * sizeof(float));
    tk_device_copy(d, h, N * sizeof(float), TK_COPY_H2D, dev);
    tk_tensor t = {d, {TK_DEV_CUDA, dev}, 1, {TK_DL_FLOAT, 32, 1}, s, NULL, 0};
    tk_tensor tg = {g, {TK_DEV_CUDA, dev}, 1, {TK_DL_FLOAT, 32, 1}, sg, NULL, 0};
    if (tk_comm_all_gather(c, &tg, &t, NULL) != TK_OK || tk_comm_all_reduce_sum(c, &t, NULL) != TK_OK ||
        tk_comm_barrier(c) != TK_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, tk_last_error());
        return 1;
    }
    tk_device_copy(h, g, (size_t)N * size * sizeof(float), TK_COPY_D2H, dev);
    for (int r = 0; r < size; r++)
        bad += h[(size_t)r * N] != (float)(r + 1) || h[(size_t)r * N + N - 1] != (float)(r + 1);
    tk_device_copy(h, d, N * sizeof(float), TK_COPY_D2H, dev);
    bad += h[0] != (float)(size * (size + 1) / 2) || h[N - 1] != (float)(size * (size + 1) / 2);
    tk_comm_free(c);
    free(h);
    if (bad)
        fprintf(stderr, "rank %d: wrong sums or gathers\n", rank);
    return bad ? 1 : 0;
}

static void test_nccl_multi_gpu(void)
{
    int n = 0;
    if (!gpu_device())
        SKIP("no GPU");
    if (!have_nccl())
        SKIP("NCCL not found");
    tk_device_count(&n);
    if (n < 2)
        SKIP("one GPU: NCCL needs a GPU a rank");
    char *file = id_path("multi");
    pid_t pids[16];
    int np = n < 8 ? n : 8;
    for (int r = 1; r < np; r++) {
        char rs[16], ns[16];
        snprintf(rs, sizeof rs, "%d", r);
        snprintf(ns, sizeof ns, "%d", np);
        char *argv[] = {"test_gpu_comm", "--rank", rs, ns, file, NULL};
        CHECK_EQ_INT(posix_spawn(&pids[r], "/proc/self/exe", NULL, NULL, argv, environ), 0);
    }
    CHECK_EQ_INT(rank_main(0, np, file), 0);
    for (int r = 1; r < np; r++) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    printf("nccl across %d GPUs: ok\n", np);
}

int main(int argc, char **argv)
{
    static const char *const no_ops[] = {NULL}; /* the communicator: no op kernels */
    gpu_main(argc, argv, no_ops);
    if (argc == 5 && !strcmp(argv[1], "--rank"))
        return rank_main((int)strtol(argv[2], NULL, 10), (int)strtol(argv[3], NULL, 10), argv[4]);
    RUN(test_nccl_one_rank);
    RUN(test_self_one_rank_gpu);
    RUN(test_nccl_peer_never_comes);
    RUN(test_nccl_multi_gpu);
    return th_done();
}
