/*
 * test_gpu_casted.c — kernels-community/casted on a GPU against the CPU references (ops/casted.c),
 * through tk_op_run on CUDA tensors, so the dispatch, the JIT compile and the launch rules all run.
 * Skips without a CUDA device.
 *
 *   casted_embedding, casted_embedding_block_sparse: every table dtype x output dtype x id dtype, the
 *       16-byte path and the scalar path (D, bs_c not multiples of the vector width); results must be
 *       bit-exact (one fp32 multiply, one rounding). Out-of-range ids give zero rows on the GPU.
 *   casted_linear: i8 and fp8_e4m3 weights over M = 1 .. 1024, with autotune off (checking the
 *       priority rule: GEMV serves M <= 8, the split-K GEMM M <= 256 and the GEMM the rest) and with
 *       the default autotune (checking the timed pick is a kernel that fits M), then each kernel forced
 *       through the config's "ops" override on shapes inside its bounds (K multiple of 16 or not, ragged
 *       M and N). bf16 output: relative L2 error <= 1e-2 and worst |diff| <= 2^-7 max|ref| (the fp32
 *       sums differ in order only; one bf16 rounding each).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_util.h"
#include "harness.h"
#include "op_test.h"
#include "tensor_util.h"

#define PKG "kernels-community/casted"

static int64_t rand_below(int64_t n) { return (int64_t)(next_u64() % (uint64_t)n); }

/* Random codes; e4m3 NaN codes only when nan_ok. */
static void fill_codes(host_t *h, int nan_ok)
{
    uint8_t *p = h->buf;
    for (int64_t i = 0; i < numel(&h->t); i++) {
        p[i] = (uint8_t)next_u64();
        if (!nan_ok && h->t.dtype.code == TK_DL_FLOAT8_E4M3FN && (p[i] & 0x7f) == 0x7f)
            p[i] = 0x7e;
    }
}

static void fill_ids(host_t *h, int64_t v)
{
    for (int64_t i = 0; i < numel(&h->t); i++) {
        int64_t id = rand_below(v);
        if (h->t.dtype.bits == 64)
            ((int64_t *)h->buf)[i] = id;
        else
            ((int32_t *)h->buf)[i] = (int32_t)id;
    }
}

static gpu_ctx g;

/* Runs op on the CPU (host tensors) into ref and on the GPU (device copies of the same tensors) into
 * got; args[0] is the output. Returns the GPU implementation's name, or NULL on failure. */
static const char *run_both(tk_ctx *ctx, const char *op, tk_arg *args, size_t n, host_t *ref, host_t *got)
{
    dev_tensor d[8];
    tk_arg gargs[8];
    const char *impl = NULL;
    int ok = 1;
    args[0].t = &ref->t;
    CHECK_RC(gpu_op_run(g.ctx, op, args, n, NULL, NULL), TK_OK);
    for (size_t i = 0; i < n; i++) {
        gargs[i] = args[i];
        memset(&d[i], 0, sizeof d[i]);
        if (args[i].kind == TK_ARG_TENSOR) {
            const tk_tensor *h = i == 0 ? &got->t : args[i].t;
            int rc = dev_upload(&d[i], h);
            CHECK_RC(rc, TK_OK);
            ok &= rc == TK_OK;
            gargs[i].t = &d[i].t;
        }
    }
    if (ok) {
        int rc = gpu_op_run(ctx, op, gargs, n, NULL, &impl);
        CHECK_RC(rc, TK_OK);
        if (rc == TK_OK)
            CHECK_RC(dev_download(&d[0], &got->t), TK_OK);
        else
            impl = NULL;
    }
    for (size_t i = 0; i < n; i++)
        dev_free(&d[i]);
    return impl;
}

/* Bit-exact agreement (NaN matches NaN). */
static void check_exact(const char *what, const host_t *got, const host_t *ref)
{
    cmp_t c = compare_tensors(&got->t, &ref->t);
    int ok = c.bad_nan == 0 && c.worst == 0;
    if (!ok)
        cmp_print(what, &c);
    CHECK(ok);
}

/* ---- embeddings ------------------------------------------------------------------------------- */

static void emb_case(tk_dtype wdt, tk_dtype odt, tk_dtype idt, int64_t V, int64_t D, int64_t n, int with_scale,
                     int bad_ids)
{
    int64_t wsh[2] = {V, D}, osh[2] = {n, D};
    host_t w, s, ids, ref, got;
    host_new(&w, wdt, 2, wsh, 0);
    host_new(&s, F32, 1, &V, 0);
    host_new(&ids, idt, 1, &n, 0);
    host_new(&ref, odt, 2, osh, 0);
    host_new(&got, odt, 2, osh, 0);
    fill_codes(&w, 1);
    for (int64_t v = 0; v < V; v++)
        set(&s.t, v, uniform(-2, 2));
    fill_ids(&ids, V);
    host_t gids = ids; /* the GPU's ids: some out of range when bad_ids */
    gids.buf = malloc((size_t)n * idt.bits / 8 + 8);
    memcpy(gids.buf, ids.buf, (size_t)n * idt.bits / 8);
    gids.t.data = gids.buf;
    gids.t.shape = gids.shape;
    if (bad_ids)
        for (int64_t i = 0; i < n; i += 3)
            id_set(&gids, i, i % 2 ? -1 - i : V + i);
    tk_arg args[4] = {{TK_ARG_TENSOR, "out", NULL, 0, 0},
                      {TK_ARG_TENSOR, "ids", &ids.t, 0, 0},
                      {TK_ARG_TENSOR, "weight", &w.t, 0, 0},
                      {TK_ARG_TENSOR, "scale", &s.t, 0, 0}};
    args[0].t = &ref.t;
    CHECK_RC(gpu_op_run(g.ctx, "casted_embedding", args, with_scale ? 4 : 3, NULL, NULL), TK_OK);
    if (bad_ids) /* the GPU writes zero rows for them */
        for (int64_t i = 0; i < n; i += 3)
            for (int64_t c = 0; c < D; c++)
                set(&ref.t, i * D + c, 0.0);
    dev_tensor d[4];
    const tk_tensor *ht[4] = {&got.t, &gids.t, &w.t, &s.t};
    tk_arg gargs[4];
    for (int i = 0; i < 4; i++) {
        CHECK_RC(dev_upload(&d[i], ht[i]), TK_OK);
        gargs[i] = args[i];
        gargs[i].t = &d[i].t;
    }
    const char *impl = NULL;
    CHECK_RC(gpu_op_run(g.ctx, "casted_embedding", gargs, with_scale ? 4 : 3, NULL, &impl), TK_OK);
    CHECK(impl && strstr(impl, PKG ":embedding_"));
    CHECK_RC(dev_download(&d[0], &got.t), TK_OK);
    char what[160];
    snprintf(what, sizeof what, "casted_embedding %s -> %s ids %s [%lld, %lld] n %lld%s%s (%s)", tk_ops__dtype_str(wdt),
             tk_ops__dtype_str(odt), tk_ops__dtype_str(idt), (long long)V, (long long)D, (long long)n,
             with_scale ? "" : " unscaled", bad_ids ? " bad ids" : "", impl ? impl : "?");
    check_exact(what, &got, &ref);
    for (int i = 0; i < 4; i++)
        dev_free(&d[i]);
    free(w.buf);
    free(s.buf);
    free(ids.buf);
    free(gids.buf);
    free(ref.buf);
    free(got.buf);
}

static void test_embedding(void)
{
    const tk_dtype wdts[] = {E4M3, E5M2, I8}, odts[] = {F32, BF16}, idts[] = {I32, I64};
    const int64_t shapes[][3] = {{1000, 4096, 37}, {50, 100, 9}, {7, 16, 1}, {300, 2048, 513}}; /* V, D, n */
    for (size_t a = 0; a < 3; a++)
        for (size_t b = 0; b < 2; b++)
            for (size_t c = 0; c < 2; c++)
                for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
                    emb_case(wdts[a], odts[b], idts[c], shapes[s][0], shapes[s][1], shapes[s][2], 1, (int)(s & 1));
                    if (wdts[a].code != TK_DL_INT)
                        emb_case(wdts[a], odts[b], idts[c], shapes[s][0], shapes[s][1], shapes[s][2], 0, 0);
                }
}

/* A block table with row block 1 empty and each other block stored with probability 1/2. */
static void bs_case(tk_dtype vdt, tk_dtype odt, tk_dtype idt, int64_t nrb, int64_t bs_r, int64_t ncb, int64_t bs_c,
                    int64_t n, int with_scale)
{
    int64_t n1 = nrb + 1, cap = nrb * ncb, nnzb = 0, D = ncb * bs_c, osh[2] = {n, D};
    host_t rp, ci, vals, s, ids, ref, got;
    host_new(&rp, I32, 1, &n1, 0);
    host_new(&ci, I32, 1, &cap, 0);
    int32_t *rpp = rp.buf, *cip = ci.buf;
    for (int64_t rb = 0; rb < nrb; rb++) {
        for (int64_t cb = 0; cb < ncb; cb++)
            if (rb != 1 && next_u64() % 2)
                cip[nnzb++] = (int32_t)cb;
        rpp[rb + 1] = (int32_t)nnzb;
    }
    ci.shape[0] = nnzb;
    int64_t vsh[3] = {nnzb, bs_r, bs_c};
    host_new(&vals, vdt, 3, vsh, 0);
    host_new(&s, F32, 1, &nnzb, 0);
    host_new(&ids, idt, 1, &n, 0);
    host_new(&ref, odt, 2, osh, 0);
    host_new(&got, odt, 2, osh, 0);
    fill_codes(&vals, 1);
    for (int64_t k = 0; k < nnzb; k++)
        set(&s.t, k, uniform(-2, 2));
    fill_ids(&ids, nrb * bs_r);
    tk_arg args[6] = {{TK_ARG_TENSOR, "out", NULL, 0, 0},       {TK_ARG_TENSOR, "ids", &ids.t, 0, 0},
                      {TK_ARG_TENSOR, "row_ptr", &rp.t, 0, 0},  {TK_ARG_TENSOR, "col_idx", &ci.t, 0, 0},
                      {TK_ARG_TENSOR, "values", &vals.t, 0, 0}, {TK_ARG_TENSOR, "scale", &s.t, 0, 0}};
    const char *impl = run_both(g.ctx, "casted_embedding_block_sparse", args, with_scale ? 6 : 5, &ref, &got);
    CHECK(impl && strstr(impl, PKG ":embedding_block_sparse_"));
    char what[200];
    snprintf(what, sizeof what,
             "casted_embedding_block_sparse %s -> %s ids %s, %lld x %lld blocks of %lld x %lld, "
             "nnzb %lld, n %lld (%s)",
             tk_ops__dtype_str(vdt), tk_ops__dtype_str(odt), tk_ops__dtype_str(idt), (long long)nrb, (long long)ncb,
             (long long)bs_r, (long long)bs_c, (long long)nnzb, (long long)n, impl ? impl : "?");
    check_exact(what, &got, &ref);
    free(rp.buf);
    free(ci.buf);
    free(vals.buf);
    free(s.buf);
    free(ids.buf);
    free(ref.buf);
    free(got.buf);
}

static void test_block_sparse(void)
{
    const tk_dtype vdts[] = {E4M3, E5M2, I8}, odts[] = {F32, BF16}, idts[] = {I32, I64};
    const int64_t geo[][5] = {{64, 16, 32, 32, 100}, {10, 3, 7, 5, 17}, {5, 4, 9, 8, 1}, {3, 1, 2, 16, 40}};
    for (size_t a = 0; a < 3; a++)
        for (size_t b = 0; b < 2; b++)
            for (size_t c = 0; c < 2; c++)
                for (size_t s = 0; s < sizeof geo / sizeof geo[0]; s++) {
                    const int64_t *q = geo[s];
                    bs_case(vdts[a], odts[b], idts[c], q[0], q[1], q[2], q[3], q[4], 1);
                    if (vdts[a].code != TK_DL_INT)
                        bs_case(vdts[a], odts[b], idts[c], q[0], q[1], q[2], q[3], q[4], 0);
                }
}

/* ---- casted_linear ---------------------------------------------------------------------------- */

/* One call on ctx; `want` is the kernel name the dispatch must pick (its prefix), NULL: any. The
 * implementation that ran is copied to picked (picked_size bytes; "" when the call failed) unless
 * picked is NULL. */
static void lin_case_picked(tk_ctx *ctx, tk_dtype wdt, int64_t M, int64_t N, int64_t K, int with_bias, const char *want,
                            char *picked, size_t picked_size)
{
    int64_t xs[2] = {M, K}, wsh[2] = {N, K}, osh[2] = {M, N};
    host_t x, w, s, b, ref, got;
    host_new(&x, BF16, 2, xs, 0);
    host_new(&w, wdt, 2, wsh, 0);
    host_new(&s, F32, 1, &N, 0);
    host_new(&b, BF16, 1, &N, 0);
    host_new(&ref, BF16, 2, osh, 0);
    host_new(&got, BF16, 2, osh, 0);
    fill_range(&x, -1, 1);
    fill_codes(&w, 0);
    double unit = (wdt.code == TK_DL_INT ? 1.0 / 64 : 1.0 / 128) / sqrt((double)(K ? K : 1));
    for (int64_t n = 0; n < N; n++) {
        set(&s.t, n, unit * uniform(0.5, 2));
        set(&b.t, n, uniform(-0.5, 0.5));
    }
    tk_arg args[5] = {{TK_ARG_TENSOR, "out", NULL, 0, 0},
                      {TK_ARG_TENSOR, "x", &x.t, 0, 0},
                      {TK_ARG_TENSOR, "weight", &w.t, 0, 0},
                      {TK_ARG_TENSOR, "scale", &s.t, 0, 0},
                      {TK_ARG_TENSOR, "bias", &b.t, 0, 0}};
    const char *impl = run_both(ctx, "casted_linear", args, with_bias ? 5 : 4, &ref, &got);
    if (picked)
        snprintf(picked, picked_size, "%s", impl ? impl : "");
    char what[200];
    snprintf(what, sizeof what, "casted_linear %s M %lld N %lld K %lld%s (%s)", tk_ops__dtype_str(wdt), (long long)M,
             (long long)N, (long long)K, with_bias ? " + bias" : "", impl ? impl : "?");
    if (want && (!impl || !strstr(impl, want))) {
        fprintf(stderr, "%s: want %s\n", what, want);
        CHECK(0);
    }
    double maxref = 0;
    for (int64_t i = 0; i < M * N; i++)
        maxref = fmax(maxref, fabs(get(&ref.t, i)));
    cmp_t c = compare_tensors(&got.t, &ref.t);
    int ok = impl && cmp_ok(&c, tol_rel(BF16), ldexp(maxref, -7) + 1e-6);
    if (!ok)
        cmp_print(what, &c);
    CHECK(ok);
    free(x.buf);
    free(w.buf);
    free(s.buf);
    free(b.buf);
    free(ref.buf);
    free(got.buf);
}

static void lin_case(tk_ctx *ctx, tk_dtype wdt, int64_t M, int64_t N, int64_t K, int with_bias, const char *want)
{
    lin_case_picked(ctx, wdt, M, N, K, with_bias, want, NULL, 0);
}

static tk_ctx *config_ctx(const char *text);

/* The kernels whose constraints a call with M rows fits (kernel.json's "max": GEMV M <= 8, split-K
 * M <= 256, the GEMM any M), in priority order: the dispatch's candidates. */
static size_t fitting(const char *out[3], int64_t m)
{
    size_t n = 0;
    if (m <= 8)
        out[n++] = "linear_gemv_";
    if (m <= 256)
        out[n++] = "linear_gemm_splitk_";
    out[n++] = "linear_gemm_";
    return n;
}

/* The dispatch rule of kernels-src/casted/README.md ("Kernels"): the fitting kernels by priority, GEMV
 * (20) before split-K (10) before the GEMM (0); with autotune on (tk's default) the first call of each
 * shape bucket times the fitting kernels and the fastest runs. So the pick is asserted exactly with
 * autotune off (a deterministic rule of M alone) and, with autotune on, is asserted to be one of the
 * fitting kernels: which of them is fastest is the GPU's answer, not the test's (the first GPU run,
 * an H200: the plain GEMM beat split-K at i8 M 64 N 1024 K 4096, 121.8 against 300.3 us). Every call
 * is also checked against the CPU reference. */
static void test_linear_dispatch(void)
{
    const tk_dtype wdts[] = {I8, E4M3};
    const int64_t mnk[][3] = {{1, 4096, 4096},   {3, 1000, 1000},  {8, 2048, 1024}, {9, 2048, 4096},
                              {64, 1024, 4096},  {200, 513, 1040}, {256, 256, 33},  {257, 1024, 1024},
                              {517, 1000, 2048}, {1024, 512, 256}};
    tk_ctx *prio = config_ctx("{\"autotune\": false}\n");
    CHECK(prio != NULL);
    for (size_t a = 0; a < 2; a++)
        for (size_t i = 0; i < sizeof mnk / sizeof mnk[0]; i++) {
            int64_t m = mnk[i][0];
            const char *fit[3], *wsuf = a ? "e4m3" : "i8";
            size_t nfit = fitting(fit, m);
            char want[96], picked[160] = "";
            /* autotune off: the highest-priority fitting kernel */
            snprintf(want, sizeof want, PKG ":%s%s", fit[0], wsuf);
            if (prio)
                lin_case(prio, wdts[a], m, mnk[i][1], mnk[i][2], (int)(i & 1), want);
            /* autotune on (the default): any fitting kernel, and a right answer */
            lin_case_picked(g.ctx, wdts[a], m, mnk[i][1], mnk[i][2], (int)(i & 1), NULL, picked, sizeof picked);
            int fits = 0;
            for (size_t f = 0; f < nfit; f++) {
                snprintf(want, sizeof want, PKG ":%s%s", fit[f], wsuf);
                fits |= strcmp(picked, want) == 0;
            }
            if (!fits)
                fprintf(stderr,
                        "casted_linear %s M %lld N %lld K %lld (autotune): picked '%s', which M = %lld "
                        "does not fit (want %s%s%s%s%s for %s)\n",
                        tk_ops__dtype_str(wdts[a]), (long long)m, (long long)mnk[i][1], (long long)mnk[i][2], picked,
                        (long long)m, fit[0], nfit > 1 ? ", " : "", nfit > 1 ? fit[1] : "", nfit > 2 ? ", " : "",
                        nfit > 2 ? fit[2] : "", wsuf);
            CHECK(fits);
        }
    if (prio)
        tk_ctx_free(prio);
}

/* A context on the test's home whose config.json is text (removed again once the context has read it). */
static tk_ctx *config_ctx(const char *text)
{
    char path[128];
    snprintf(path, sizeof path, "%s/config.json", g.home);
    FILE *f = fopen(path, "w");
    if (!f)
        return NULL;
    fputs(text, f);
    fclose(f);
    tk_ctx_opts o = TK_CTX_OPTS_INIT;
    o.home = g.home;
    o.offline = 1; /* the package is installed already */
    o.log = gpu_log;
    tk_ctx *ctx = NULL;
    if (tk_ctx_new(&ctx, &o) != TK_OK)
        ctx = NULL;
    remove(path);
    return ctx;
}

/* A context on the test's home whose config pins casted_linear to one kernel. */
static tk_ctx *pinned_ctx(const char *kernel)
{
    char text[256];
    snprintf(text, sizeof text, "{\"ops\": {\"casted_linear\": \"" PKG ":%s\"}}\n", kernel);
    return config_ctx(text);
}

static void test_linear_each_kernel(void)
{
    static const struct {
        const char *kernel;
        int64_t max_m;
    } ks[] = {{"linear_gemv", 8}, {"linear_gemm_splitk", 256}, {"linear_gemm", 1 << 20}};
    const int64_t nk[][2] = {{4096, 4096}, {200, 48}, {77, 40}, {3, 1}, {130, 4104}};
    const int64_t ms[] = {1, 2, 5, 8, 16, 70, 129, 256, 300};
    for (size_t k = 0; k < 3; k++)
        for (int wi = 0; wi < 2; wi++) {
            char name[64];
            snprintf(name, sizeof name, "%s_%s", ks[k].kernel, wi ? "e4m3" : "i8");
            tk_ctx *ctx = pinned_ctx(name);
            CHECK(ctx != NULL);
            if (!ctx)
                continue;
            for (size_t m = 0; m < sizeof ms / sizeof ms[0]; m++)
                for (size_t s = 0; s < sizeof nk / sizeof nk[0]; s++)
                    if (ms[m] <= ks[k].max_m && (ms[m] * nk[s][0] <= 300 * 200 || ms[m] <= 16))
                        lin_case(ctx, wi ? E4M3 : I8, ms[m], nk[s][0], nk[s][1], (int)((m + s) & 1), name);
            tk_ctx_free(ctx);
        }
}

/* A NaN code poisons exactly its channel, in every kernel. */
static void test_linear_nan(void)
{
    const int64_t ms[] = {2, 100, 400};
    for (size_t i = 0; i < 3; i++) {
        int64_t M = ms[i], N = 40, K = 64, xs[2] = {M, K}, wsh[2] = {N, K}, osh[2] = {M, N};
        host_t x, w, s, ref, got;
        host_new(&x, BF16, 2, xs, 0);
        host_new(&w, E4M3, 2, wsh, 0);
        host_new(&s, F32, 1, &N, 0);
        host_new(&ref, BF16, 2, osh, 0);
        host_new(&got, BF16, 2, osh, 0);
        for (int64_t e = 0; e < M * K; e++)
            set(&x.t, e, uniform(-1, 1));
        fill_codes(&w, 0);
        ((uint8_t *)w.buf)[7 * K + 9] = 0x7f;
        for (int64_t n = 0; n < N; n++)
            set(&s.t, n, 0.01);
        tk_arg args[4] = {{TK_ARG_TENSOR, "out", NULL, 0, 0},
                          {TK_ARG_TENSOR, "x", &x.t, 0, 0},
                          {TK_ARG_TENSOR, "weight", &w.t, 0, 0},
                          {TK_ARG_TENSOR, "scale", &s.t, 0, 0}};
        const char *impl = run_both(g.ctx, "casted_linear", args, 4, &ref, &got);
        int nan_ok = 1;
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++)
                nan_ok &= isnan(get(&got.t, m * N + n)) == (n == 7);
        if (!nan_ok)
            fprintf(stderr, "casted_linear NaN code, M %lld (%s): NaN outside channel 7 or missing\n", (long long)M,
                    impl ? impl : "?");
        CHECK(nan_ok);
        free(x.buf);
        free(w.buf);
        free(s.buf);
        free(ref.buf);
        free(got.buf);
    }
}

static void test_setup(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    const char *pkgs[] = {PKG, NULL};
    CHECK_RC(gpu_ctx_new(&g, pkgs), TK_OK);
}

#define NEEDS_GPU()                                                                                                    \
    do {                                                                                                               \
        if (!g.ctx)                                                                                                    \
            SKIP("no CUDA device");                                                                                    \
    } while (0)

static void test_embedding_gpu(void)
{
    NEEDS_GPU();
    test_embedding();
}
static void test_block_sparse_gpu(void)
{
    NEEDS_GPU();
    test_block_sparse();
}
static void test_linear_dispatch_gpu(void)
{
    NEEDS_GPU();
    test_linear_dispatch();
}
static void test_linear_each_kernel_gpu(void)
{
    NEEDS_GPU();
    test_linear_each_kernel();
}
static void test_linear_nan_gpu(void)
{
    NEEDS_GPU();
    test_linear_nan();
}

static void test_coverage(void)
{
    const char *pkgs[] = {"kernels-community/casted", NULL};
    gpu_coverage_check(pkgs);
}

int main(int argc, char **argv)
{
    static const char *const ops[] = {"casted_embedding", "casted_embedding_block_sparse", "casted_linear", NULL};
    gpu_main(argc, argv, ops);
    op_test_seed();
    RUN(test_setup);
    RUN(test_embedding_gpu);
    RUN(test_block_sparse_gpu);
    RUN(test_linear_dispatch_gpu);
    RUN(test_linear_each_kernel_gpu);
    RUN(test_linear_nan_gpu);
    if (g.home[0])
        gpu_ctx_free(&g);
    RUN(test_coverage);
    return th_done();
}
