/*
 * test_comm.c — the communicator (comm/, tk_comm_* in tk.h).
 *
 * Run alone (make test), it checks one process: the self backend's collectives, option and tensor
 * errors, what tk_comm_backends_json reports, and loading NCCL with dlopen (its creation fails
 * cleanly without a GPU). Under mpirun, tests/cli/comm.sh runs it as a worker:
 *
 *     test_comm --worker collectives N     every collective on odd sizes and every dtype, N ranks;
 *                                          GPU tensors staged through host memory (without a GPU:
 *                                          the driver's error, the communicator still usable)
 *     test_comm --worker die RANK HOW      RANK dies ("kill": SIGKILL, "exit": exit 3) or hangs
 *                                          ("hang") in the 4th all-reduce; the others must fail
 *                                          within TK_COMM_TIMEOUT with a clear error, then abort
 *     test_comm --worker expect N          tk_comm_new with expect_size N (must fail unless N fits)
 *     test_comm --worker host              the host calls MPI_Init itself, gives tk a split
 *                                          communicator, and finalises MPI after tk is done
 *
 * Each worker prints "N passed, N failed" and exits non-zero on a failure.
 */
#define _GNU_SOURCE
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "tk.h"

#ifdef TK_HAVE_MPI
#include <mpi.h>
#endif

static const struct {
    const char *name;
    tk_dtype dt;
} DTYPES[] = {
    {"f32", {TK_DL_FLOAT, 32, 1}}, {"f64", {TK_DL_FLOAT, 64, 1}}, {"bf16", {TK_DL_BFLOAT, 16, 1}},
    {"f16", {TK_DL_FLOAT, 16, 1}}, {"i32", {TK_DL_INT, 32, 1}},   {"i64", {TK_DL_INT, 64, 1}},
};
#define NDT (sizeof DTYPES / sizeof DTYPES[0])

/* ---- f16 / bf16 by the book (independent of comm/'s conversions) ---- */

static float bf16_f(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float f16_f(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? ldexpf((float)m, -24) : ldexpf((float)(m | 1024), e - 25);
    return h & 0x8000 ? -v : v;
}

/* The encoding of x, which the tests keep exactly representable (small multiples of 1/2), so the
 * sum needs no rounding and every backend must give these bits; checked by decoding it back. */
static uint16_t enc_half(double x, int bf16)
{
    uint16_t h = 0;
    if (bf16) {
        float f = (float)x;
        uint32_t u;
        memcpy(&u, &f, 4);
        h = (uint16_t)(u >> 16);
    } else if (x != 0) {
        int e;
        double m = frexp(fabs(x), &e); /* |x| = m 2^e, m in [0.5, 1) */
        h = (uint16_t)((x < 0 ? 0x8000 : 0) | (e - 1 + 15) << 10 | ((int)(m * 2048) - 1024));
    }
    if ((double)(bf16 ? bf16_f(h) : f16_f(h)) != x) {
        fprintf(stderr, "enc_half(%g) is not exact\n", x);
        abort();
    }
    return h;
}

/* The nearest f16/bf16 to x, ties to even, by a search over the codes (slow: small tests only). */
static uint16_t round_half(double x, int bf16)
{
    uint16_t best = 0;
    double bd = INFINITY;
    for (uint32_t c = 0; c < (bf16 ? 0x7f80u : 0x7c00u); c++) {
        double d = fabs((double)(bf16 ? bf16_f((uint16_t)c) : f16_f((uint16_t)c)) - fabs(x));
        if (d < bd || (d == bd && !(c & 1))) {
            bd = d;
            best = (uint16_t)c;
        }
    }
    return x < 0 ? (uint16_t)(best | 0x8000u) : best;
}

/* The value rank r puts at index i (small, exactly representable in every dtype). */
static double val(int r, size_t i) { return (double)((int)((i * 7 + (size_t)r * 3) % 61) - 30) / 2.0; }

static void put(void *p, tk_dtype dt, size_t i, double v)
{
    if (dt.code == TK_DL_FLOAT && dt.bits == 32)
        ((float *)p)[i] = (float)v;
    else if (dt.code == TK_DL_FLOAT && dt.bits == 64)
        ((double *)p)[i] = v;
    else if (dt.code == TK_DL_INT && dt.bits == 32)
        ((int32_t *)p)[i] = (int32_t)(v * 2);
    else if (dt.code == TK_DL_INT && dt.bits == 64)
        ((int64_t *)p)[i] = (int64_t)(v * 2) * 1000000007LL; /* beyond 32 bits */
    else
        ((uint16_t *)p)[i] = enc_half(v, dt.code == TK_DL_BFLOAT);
}

static tk_tensor tens(void *data, tk_dtype dt, int64_t *shape, int ndim)
{
    tk_tensor t = {data, {TK_DEV_CPU, 0}, ndim, dt, shape, NULL, 0};
    return t;
}

/* ---- one process alone ---- */

static void test_self(void)
{
    tk_comm *c = NULL;
    tk_comm_opts o = TK_COMM_OPTS_INIT;
    o.backend = TK_COMM_SELF;
    CHECK_RC(tk_comm_new(&c, &o), TK_OK);
    if (!c)
        return;
    CHECK_STR(tk_comm_backend(c), "self");
    CHECK_EQ_INT(tk_comm_rank(c), 0);
    CHECK_EQ_INT(tk_comm_size(c), 1);
    CHECK_EQ_INT(tk_comm_local_size(c), 1);
    CHECK_EQ_INT(tk_comm_device(c), -1);
    CHECK(tk_comm_host(c, 0) && tk_comm_host(c, 0)[0]);
    CHECK(tk_comm_host(c, 1) == NULL);
    float x[5] = {1, 2, 3, 4, 5}, g[5] = {0};
    int64_t s5[1] = {5};
    tk_tensor t = tens(x, DTYPES[0].dt, s5, 1), go = tens(g, DTYPES[0].dt, s5, 1);
    CHECK_RC(tk_comm_all_reduce_sum(c, &t, NULL), TK_OK);
    CHECK(x[4] == 5);
    CHECK_RC(tk_comm_all_gather(c, &go, &t, NULL), TK_OK);
    CHECK(memcmp(g, x, sizeof x) == 0);
    CHECK_RC(tk_comm_all_gather(c, &t, &t, NULL), TK_OK); /* in place */
    CHECK_RC(tk_comm_broadcast(c, &t, 0, NULL), TK_OK);
    CHECK_RC(tk_comm_broadcast(c, &t, 1, NULL), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "root 1 is not a rank");
    CHECK_RC(tk_comm_barrier(c), TK_OK);
    tk_comm_abort(c, 2); /* self: breaks it and returns */
    CHECK_RC(tk_comm_barrier(c), TK_ERR_NETWORK);
    CHECK_CONTAINS(tk_last_error(), "aborted");
    tk_comm_free(c);
    tk_comm_free(NULL);
}

static void test_auto_is_self_without_launcher(void)
{
    tk_comm *c = NULL;
    if (getenv("OMPI_COMM_WORLD_RANK") || getenv("PMI_RANK") || getenv("PMIX_RANK"))
        SKIP("started by an MPI launcher");
    CHECK_RC(tk_comm_new(&c, NULL), TK_OK);
    CHECK_STR(tk_comm_backend(c), "self");
    tk_comm_free(c);
}

static void test_errors(void)
{
    tk_comm *c = NULL;
    tk_comm_opts o = TK_COMM_OPTS_INIT;
    CHECK_RC(tk_comm_new(NULL, NULL), TK_ERR_INVALID);
    o.version = 99;
    CHECK_RC(tk_comm_new(&c, &o), TK_ERR_INVALID);
    CHECK(c == NULL);
    o = (tk_comm_opts)TK_COMM_OPTS_INIT;
    o.backend = 7;
    CHECK_RC(tk_comm_new(&c, &o), TK_ERR_INVALID);
    o = (tk_comm_opts)TK_COMM_OPTS_INIT;
    o.backend = TK_COMM_SELF;
    o.expect_size = 2;
    CHECK_RC(tk_comm_new(&c, &o), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "the job has 1 rank but 2 were asked for");
    CHECK_CONTAINS(tk_last_error(), "HINT: ");
    CHECK(c == NULL);
    setenv("TK_COMM_TIMEOUT", "soon", 1);
    o.expect_size = 0;
    CHECK_RC(tk_comm_new(&c, &o), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "TK_COMM_TIMEOUT='soon'");
    unsetenv("TK_COMM_TIMEOUT");

    CHECK_RC(tk_comm_new(&c, &o), TK_OK);
    uint8_t b[8];
    float f[6];
    int64_t s8[1] = {8}, s23[2] = {2, 3}, st[2] = {1, 2}, s4[1] = {4};
    tk_tensor u8 = tens(b, (tk_dtype){TK_DL_UINT, 8, 1}, s8, 1);
    CHECK_RC(tk_comm_all_reduce_sum(c, &u8, NULL), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "cannot sum dtype u8");
    CHECK_RC(tk_comm_broadcast(c, &u8, 0, NULL), TK_OK); /* bytes move whatever they are */
    tk_tensor strided = tens(f, DTYPES[0].dt, s23, 2);
    strided.strides = st; /* a transposed view */
    CHECK_RC(tk_comm_all_reduce_sum(c, &strided, NULL), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "not contiguous");
    tk_tensor gpu = tens(f, DTYPES[0].dt, s4, 1), host = tens(f + 2, DTYPES[0].dt, s4, 1);
    gpu.device.device_type = TK_DEV_CUDA;
    CHECK_RC(tk_comm_all_gather(c, &gpu, &gpu, NULL), TK_OK); /* in place needs no copy */
    CHECK_RC(tk_comm_all_gather(c, &host, &gpu, NULL), TK_ERR_INVALID); /* overlapping, not in place */
    /* one rank, GPU tensors, not in place: the bytes are copied on the device (test_gpu_comm checks
     * them); it was refused ("one rank alone copies host memory only") and a one-rank job could not
     * gather into a fresh buffer. Here, without a GPU, it is the driver that is missing. */
    {
        float src[4] = {1, 2, 3, 4}, dst[4] = {0};
        tk_tensor gi = tens(src, DTYPES[0].dt, s4, 1), go = tens(dst, DTYPES[0].dt, s4, 1);
        gi.device.device_type = go.device.device_type = TK_DEV_CUDA;
        int ndev = 0;
        if (tk_device_count(&ndev) != TK_OK || ndev == 0) {
            CHECK_RC(tk_comm_all_gather(c, &go, &gi, NULL), TK_ERR_NO_DEVICE);
            CHECK(strstr(tk_last_error(), "host memory only") == NULL);
        }
    }
    tk_tensor wrong = tens(f, (tk_dtype){TK_DL_FLOAT, 16, 1}, s4, 1);
    CHECK_RC(tk_comm_all_gather(c, &wrong, &host, NULL), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "in is f32 but out is f16");
    CHECK_RC(tk_comm_all_reduce_sum(c, NULL, NULL), TK_ERR_INVALID);
    tk_comm_free(c);
    /* a freed or foreign handle is refused, not followed */
    char junk[256] = {0};
    CHECK_RC(tk_comm_barrier((tk_comm *)junk), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "not a communicator");
}

static void test_backends_json(void)
{
    char *js = NULL;
    CHECK_RC(tk_comm_backends_json(&js), TK_OK);
    if (!js)
        return;
#ifdef TK_HAVE_MPI
    CHECK_CONTAINS(js, "\"built\":true");
    CHECK_CONTAINS(js, "\"library\":\"");
#else
    CHECK_CONTAINS(js, "\"built\":false");
#endif
    CHECK_CONTAINS(js, "\"nccl\":{\"found\":");
    CHECK_CONTAINS(js, "\"initialized\":false");
    printf("backends: %s\n", js);
    tk_free(js);
}

static void test_mpi_unavailable(void)
{
#ifdef TK_HAVE_MPI
    SKIP("this build has MPI (tests/cli/comm.sh runs it under mpirun)");
#else
    tk_comm *c = NULL;
    tk_comm_opts o = TK_COMM_OPTS_INIT;
    o.backend = TK_COMM_MPI;
    CHECK_RC(tk_comm_new(&c, &o), TK_ERR_UNSUPPORTED);
    CHECK_CONTAINS(tk_last_error(), "built without MPI");
    CHECK(c == NULL);
#endif
}

/* NCCL: loaded with dlopen; without a GPU its creation must fail with a clear status, not crash. */
static void test_nccl(void)
{
    char *js = NULL;
    tk_comm *c = NULL;
    tk_comm_opts o = TK_COMM_OPTS_INIT;
    CHECK_RC(tk_comm_backends_json(&js), TK_OK);
    int found = js && strstr(js, "\"nccl\":{\"found\":true");
    tk_free(js);
    o.backend = TK_COMM_NCCL;
    o.nccl_id_file = "/nonexistent-dir/id";
    o.rank = 0;
    o.size = 1;
    int rc = tk_comm_new(&c, &o);
    if (!found) {
        CHECK_EQ_INT(rc, TK_ERR_NOT_FOUND);
        CHECK_CONTAINS(tk_last_error(), "libnccl.so.2");
        SKIP("NCCL not found (TK_NCCL names it)");
    }
    /* found: without a GPU, no device; with one, the id file's directory does not exist */
    CHECK(rc == TK_ERR_NO_DEVICE || rc == TK_ERR_IO || rc == TK_ERR_NOT_FOUND);
    CHECK(c == NULL);
    printf("nccl without a GPU: %s (%s)\n", tk_status_str(rc), tk_last_error());
}

/* ---- workers under mpirun ---- */

static tk_comm *worker_comm(int expect)
{
    tk_comm *c = NULL;
    tk_comm_opts o = TK_COMM_OPTS_INIT;
    o.expect_size = expect;
    if (tk_comm_new(&c, &o) != TK_OK) {
        fprintf(stderr, "tk_comm_new: %s\n", tk_last_error());
        return NULL;
    }
    return c;
}

static tk_comm *wc;
static int wsize;

static void test_w_identity(void)
{
    CHECK_STR(tk_comm_backend(wc), "mpi");
    CHECK_EQ_INT(tk_comm_size(wc), wsize);
    CHECK(tk_comm_rank(wc) >= 0 && tk_comm_rank(wc) < wsize);
    /* one host here: every rank is local, and the local rank is the rank */
    CHECK_EQ_INT(tk_comm_local_size(wc), wsize);
    CHECK_EQ_INT(tk_comm_local_rank(wc), tk_comm_rank(wc));
    for (int r = 0; r < wsize; r++)
        CHECK(tk_comm_host(wc, r) && !strcmp(tk_comm_host(wc, r), tk_comm_host(wc, 0)));
}

static void test_w_all_reduce(void)
{
    static const size_t counts[] = {0, 1, 7, 1000, 65537, (size_t)1 << 20 | 3};
    int me = tk_comm_rank(wc);
    for (size_t d = 0; d < NDT; d++) {
        tk_dtype dt = DTYPES[d].dt;
        size_t es = dt.bits / 8;
        for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
            size_t n = counts[k];
            void *buf = malloc(n * es + 1), *want = malloc(n * es + 1), *all = malloc(n * es * (size_t)wsize + 1);
            int64_t shape[1] = {(int64_t)n}, gshape[1] = {(int64_t)n * wsize};
            for (size_t i = 0; i < n; i++) {
                double s = 0;
                for (int r = 0; r < wsize; r++)
                    s += val(r, i);
                put(buf, dt, i, val(me, i));
                put(want, dt, i, s); /* exact in double; rounded once for f16/bf16 */
            }
            tk_tensor t = tens(buf, dt, shape, 1), g = tens(all, dt, gshape, 1);
            CHECK_RC(tk_comm_all_reduce_sum(wc, &t, NULL), TK_OK);
            if (memcmp(buf, want, n * es) != 0) {
                fprintf(stderr, "  all_reduce %s n=%zu differs from the sum\n", DTYPES[d].name, n);
                th_cur_failed++;
            }
            /* every rank holds the same bits */
            CHECK_RC(tk_comm_all_gather(wc, &g, &t, NULL), TK_OK);
            for (int r = 0; r < wsize; r++)
                if (memcmp((char *)all + (size_t)r * n * es, buf, n * es) != 0) {
                    fprintf(stderr, "  all_reduce %s n=%zu: rank %d holds other bits\n", DTYPES[d].name, n, r);
                    th_cur_failed++;
                }
            free(buf);
            free(want);
            free(all);
        }
    }
    /* f16/bf16 sums that do not fit: summed exactly (in f32 here) and rounded once, to nearest even */
    for (int bf = 0; bf < 2; bf++) {
        enum { N = 64 };
        uint16_t h[N], want[N];
        int64_t s[1] = {N};
        for (int i = 0; i < N; i++) {
            double exact = 0;
            for (int r = 0; r < wsize; r++) /* 1 + k/128: exact in both; in bf16 their sum is not */
                exact += 1.0 + (double)((i + r * 5) % 16) / 128.0;
            h[i] = enc_half(1.0 + (double)((i + me * 5) % 16) / 128.0, bf);
            want[i] = round_half(exact, bf);
        }
        tk_tensor t = tens(h, DTYPES[bf ? 2 : 3].dt, s, 1);
        CHECK_RC(tk_comm_all_reduce_sum(wc, &t, NULL), TK_OK);
        CHECK(memcmp(h, want, sizeof h) == 0);
    }
    /* 2-D: the shape does not matter, only the element count */
    float x[3][5];
    int64_t s35[2] = {3, 5};
    for (int i = 0; i < 15; i++)
        x[i / 5][i % 5] = (float)(me + i);
    tk_tensor t = tens(x, DTYPES[0].dt, s35, 2);
    CHECK_RC(tk_comm_all_reduce_sum(wc, &t, NULL), TK_OK);
    CHECK(x[2][4] == (float)(wsize * 14 + wsize * (wsize - 1) / 2));
}

static void test_w_all_gather(void)
{
    static const size_t counts[] = {1, 3, 1001, 300007};
    int me = tk_comm_rank(wc);
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        for (size_t d = 0; d < NDT; d++) {
            size_t n = counts[k], es = DTYPES[d].dt.bits / 8, part = n * es;
            uint8_t *in = malloc(part), *out = malloc(part * (size_t)wsize), *inpl = malloc(part * (size_t)wsize);
            int64_t s[1] = {(int64_t)n}, so[2] = {wsize, (int64_t)n};
            for (size_t i = 0; i < part; i++)
                in[i] = (uint8_t)(i * 31 + (size_t)me * 101 + d);
            memset(out, 0xee, part * (size_t)wsize);
            memset(inpl, 0xee, part * (size_t)wsize);
            memcpy(inpl + (size_t)me * part, in, part);
            tk_tensor ti = tens(in, DTYPES[d].dt, s, 1), to = tens(out, DTYPES[d].dt, so, 2);
            tk_tensor tip = tens(inpl + (size_t)me * part, DTYPES[d].dt, s, 1), top = tens(inpl, DTYPES[d].dt, so, 2);
            CHECK_RC(tk_comm_all_gather(wc, &to, &ti, NULL), TK_OK);
            CHECK_RC(tk_comm_all_gather(wc, &top, &tip, NULL), TK_OK); /* in place */
            for (int r = 0; r < wsize; r++)
                for (size_t i = 0; i < part; i++) {
                    uint8_t want = (uint8_t)(i * 31 + (size_t)r * 101 + d);
                    if (out[(size_t)r * part + i] != want || inpl[(size_t)r * part + i] != want) {
                        fprintf(stderr, "  all_gather %s n=%zu: rank %d's byte %zu is wrong\n", DTYPES[d].name, n, r,
                                i);
                        th_cur_failed++;
                        r = wsize;
                        break;
                    }
                }
            free(in);
            free(out);
            free(inpl);
        }
    }
    /* out of the wrong size is refused before anything moves */
    float a[3], b[7];
    int64_t s3[1] = {3}, s7[1] = {7};
    tk_tensor ta = tens(a, DTYPES[0].dt, s3, 1), tb = tens(b, DTYPES[0].dt, s7, 1);
    CHECK_RC(tk_comm_all_gather(wc, &tb, &ta, NULL), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "want");
}

static void test_w_broadcast(void)
{
    int me = tk_comm_rank(wc);
    for (int root = 0; root < wsize; root++) {
        size_t n = 100003;
        uint16_t *x = malloc(n * 2);
        int64_t s[1] = {(int64_t)n};
        for (size_t i = 0; i < n; i++)
            x[i] = (uint16_t)(me == root ? i * 7 + (size_t)root : 0xdead);
        tk_tensor t = tens(x, DTYPES[2].dt, s, 1);
        CHECK_RC(tk_comm_broadcast(wc, &t, root, NULL), TK_OK);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += x[i] != (uint16_t)(i * 7 + (size_t)root);
        CHECK_EQ_INT(bad, 0);
        free(x);
    }
}

/* GPU tensors on MPI: staged through host memory (a copy each way). Without a GPU every rank's copy
 * fails before MPI is entered, with the driver's status and what was being staged, and the
 * communicator stays usable; with one, every rank on cuda:(local rank % GPUs), the sums and gathers
 * are right, in every mix of host and device for the gather. */
static void gpu_staging_without_gpu(float *h, int64_t *s)
{
    tk_tensor t = tens(h, DTYPES[0].dt, s, 1);
    t.device.device_type = TK_DEV_CUDA;
    int rc = tk_comm_all_reduce_sum(wc, &t, NULL);
    CHECK(rc == TK_ERR_NO_DEVICE || rc == TK_ERR_LAUNCH);
    CHECK_CONTAINS(tk_last_error(), "staging through host memory");
    CHECK(strstr(tk_last_error(), "moves host memory") == NULL); /* the old refusal */
    CHECK_RC(tk_comm_barrier(wc), TK_OK);                        /* not broken: no rank entered MPI */
}

static void test_w_gpu_staging(void)
{
    enum { N = 70001 };
    int me = tk_comm_rank(wc), ndev = 0;
    int64_t s[1] = {N}, sa[1] = {(int64_t)N * wsize};
    float *h = malloc(N * sizeof *h), *all = malloc((size_t)N * wsize * sizeof *all);
    for (int i = 0; i < N; i++)
        h[i] = (float)(i % 101) + (float)me;
    if (tk_device_count(&ndev) != TK_OK || ndev == 0) {
        /* gpu-check's phase 1f sets TK_TEST_GPU=1 on a GPU machine: no device there is a failure */
        CHECK(!getenv("TK_TEST_GPU") || strcmp(getenv("TK_TEST_GPU"), "1") != 0);
        gpu_staging_without_gpu(h, s);
        free(h);
        free(all);
        return;
    }
    int dev = tk_comm_local_rank(wc) % ndev;
    void *d = NULL, *g = NULL;
    CHECK_RC(tk_device_alloc(&d, dev, N * sizeof(float)), TK_OK);
    CHECK_RC(tk_device_alloc(&g, dev, (size_t)N * wsize * sizeof(float)), TK_OK);
    CHECK_RC(tk_device_copy(d, h, N * sizeof(float), TK_COPY_H2D, dev), TK_OK);
    tk_tensor t = tens(d, DTYPES[0].dt, s, 1), tg = tens(g, DTYPES[0].dt, sa, 1);
    tk_tensor th = tens(h, DTYPES[0].dt, s, 1), ta = tens(all, DTYPES[0].dt, sa, 1);
    t.device.device_type = tg.device.device_type = TK_DEV_CUDA;
    t.device.device_id = tg.device.device_id = dev;
    CHECK_RC(tk_comm_all_gather(wc, &ta, &t, NULL), TK_OK); /* device in, host out */
    size_t bad = 0;
    for (int r = 0; r < wsize; r++)
        for (int i = 0; i < N; i++)
            bad += all[(size_t)r * N + i] != (float)(i % 101) + (float)r;
    CHECK_RC(tk_comm_all_gather(wc, &tg, &th, NULL), TK_OK); /* host in, device out */
    memset(all, 0, (size_t)N * wsize * sizeof *all);
    CHECK_RC(tk_device_copy(all, g, (size_t)N * wsize * sizeof(float), TK_COPY_D2H, dev), TK_OK);
    for (int r = 0; r < wsize; r++)
        for (int i = 0; i < N; i++)
            bad += all[(size_t)r * N + i] != (float)(i % 101) + (float)r;
    CHECK_RC(tk_comm_all_reduce_sum(wc, &t, NULL), TK_OK);
    CHECK_RC(tk_comm_broadcast(wc, &t, wsize - 1, NULL), TK_OK); /* every rank has the sums already */
    CHECK_RC(tk_device_copy(h, d, N * sizeof(float), TK_COPY_D2H, dev), TK_OK);
    for (int i = 0; i < N; i++)
        bad += h[i] != (float)wsize * (float)(i % 101) + (float)(wsize * (wsize - 1) / 2);
    CHECK_EQ_INT(bad, 0);
    tk_device_free(d, dev);
    tk_device_free(g, dev);
    free(h);
    free(all);
}

static void test_w_barrier(void)
{
    for (int i = 0; i < 20; i++)
        CHECK_RC(tk_comm_barrier(wc), TK_OK);
}

/* A rank dies or hangs in the 4th all-reduce: the survivors must not hang. Under mpirun's default
 * the launcher kills them when a rank dies; when it does not (hang, or orte_abort_on_non_zero_status
 * 0), their timeout fires: they print the error and abort the job. */
static int worker_die(int victim, const char *how)
{
    tk_comm *c = worker_comm(0);
    if (!c)
        return 1;
    int me = tk_comm_rank(c);
    float x[1000];
    int64_t s[1] = {1000};
    tk_tensor t = tens(x, DTYPES[0].dt, s, 1);
    for (int it = 0; it < 6; it++) {
        if (it == 3 && me == victim) {
            fprintf(stderr, "rank %d: dying (%s) before all_reduce %d\n", me, how, it);
            if (!strcmp(how, "kill"))
                raise(SIGKILL);
            else if (!strcmp(how, "exit"))
                _exit(3);
            else
                for (;;)
                    pause();
        }
        for (int i = 0; i < 1000; i++)
            x[i] = 1;
        int rc = tk_comm_all_reduce_sum(c, &t, NULL);
        if (rc != TK_OK) {
            fprintf(stderr, "rank %d: tk: %s (%s)\n", me, tk_last_error(), tk_status_str(rc));
            /* the communicator stays broken */
            if (tk_comm_barrier(c) != rc)
                fprintf(stderr, "rank %d: a broken communicator did not stay broken\n", me);
            tk_comm_abort(c, 9);
            return 9; /* not reached with MPI */
        }
        if (x[0] != (float)tk_comm_size(c))
            fprintf(stderr, "rank %d: sum %g\n", me, x[0]);
    }
    fprintf(stderr, "rank %d: no failure seen\n", me);
    tk_comm_free(c);
    return 0;
}

static int worker_expect(int n)
{
    tk_comm *c = worker_comm(n);
    if (!c)
        return 4; /* tk_comm_new printed the error */
    printf("rank %d of %d: size fits\n", tk_comm_rank(c), tk_comm_size(c));
    tk_comm_free(c);
    return 0;
}

#ifdef TK_HAVE_MPI
/* The host owns MPI: it initialises it, hands tk a sub-communicator, and finalises after tk is done. */
static int worker_host(void)
{
    int prov = 0, r = 0, n = 0, inited = 0, fin = 0;
    MPI_Comm half;
    tk_comm *c = NULL, *w = NULL;
    tk_comm_opts o = TK_COMM_OPTS_INIT;
    MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &prov);
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    MPI_Comm_split(MPI_COMM_WORLD, r % 2, r, &half);
    th_cur_name = "host";
    o.mpi_comm = &half;
    CHECK_RC(tk_comm_new(&c, &o), TK_OK);
    CHECK_RC(tk_comm_new(&w, NULL), TK_OK); /* AUTO: MPI, since the host initialised it */
    if (c && w) {
        CHECK_STR(tk_comm_backend(w), "mpi");
        CHECK_EQ_INT(tk_comm_size(w), n);
        CHECK_EQ_INT(tk_comm_size(c), (n + 1 - r % 2) / 2);
        CHECK_EQ_INT(tk_comm_rank(c), r / 2);
        int32_t v = r, s = 0;
        int64_t one[1] = {1};
        tk_tensor t = tens(&v, DTYPES[4].dt, one, 1);
        CHECK_RC(tk_comm_all_reduce_sum(c, &t, NULL), TK_OK);
        for (int i = r % 2; i < n; i += 2)
            s += i;
        CHECK_EQ_INT(v, s);
    }
    tk_comm_free(c);
    tk_comm_free(w);
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    CHECK(inited && !fin); /* tk did not finalise the host's MPI */
    /* the host's communicator still works after tk let go */
    int one = 1, sum = 0;
    MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    CHECK_EQ_INT(sum, n);
    MPI_Comm_free(&half);
    MPI_Finalize();
    printf("%d passed, %d failed, 0 skipped\n", th_cur_failed ? 0 : 1, th_cur_failed ? 1 : 0);
    return th_cur_failed ? 1 : 0;
}
#endif

static int worker(int argc, char **argv)
{
    const char *what = argv[2];
    int64_t n = 0;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 3 && strcmp(what, "die") != 0)
        n = strtol(argv[3], NULL, 10);
    if (!strcmp(what, "collectives")) {
        wsize = (int)n;
        if (!(wc = worker_comm(wsize)))
            return 1;
        RUN(test_w_identity);
        RUN(test_w_all_reduce);
        RUN(test_w_all_gather);
        RUN(test_w_broadcast);
        RUN(test_w_barrier);
        RUN(test_w_gpu_staging);
        tk_comm_free(wc);
        return th_done();
    }
    if (!strcmp(what, "die") && argc > 4)
        return worker_die((int)strtol(argv[3], NULL, 10), argv[4]);
    if (!strcmp(what, "expect"))
        return worker_expect((int)n);
#ifdef TK_HAVE_MPI
    if (!strcmp(what, "host"))
        return worker_host();
#endif
    fprintf(stderr, "test_comm: unknown worker '%s'\n", what);
    return 2;
}

int main(int argc, char **argv)
{
    if (argc > 2 && !strcmp(argv[1], "--worker"))
        return worker(argc, argv);
    RUN(test_self);
    RUN(test_auto_is_self_without_launcher);
    RUN(test_errors);
    RUN(test_backends_json);
    RUN(test_mpi_unavailable);
    RUN(test_nccl);
    return th_done();
}
