/*
 * test_gpu_layers.c — the layer ops on a GPU against their CPU references, through tk_op_run on CUDA
 * tensors: linear on cuBLASLt (the built-in "builtin:cublaslt"), embedding, add and tanh on
 * kernels-community/layers (dispatch, JIT compile, module load, launch rules). The GPU cases skip
 * without a CUDA device; two checks run anywhere: cuBLASLt's loader (when the library is installed)
 * and the built-in's place in the op list.
 *
 * linear runs every dtype over odd M, N and K (K not a multiple of any tile or vector width, K = 0,
 * N = 1, a 50257-column vocabulary), with and without a transposed weight and a bias.
 *
 * Tolerances: linear's GPU and CPU results are both fp32 sums rounded once, in different orders, so
 * they agree within two output roundings and twice the fp32 summation bound:
 * 2 u_out |ref| + 2 (K + 2) 2^-24 sum_k |x_k w_k| (+ f16 subnormal spacing). embedding is bit-exact
 * (and a zero row for an out-of-range id, where the CPU reference refuses). add is bit-exact (one
 * correctly rounded fp32 add, rounded once). tanh within 4 fp32 ulps plus one output rounding.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_util.h"
#include "harness.h"
#include "jit/cublaslt.h"
#include "op_test.h"
#include "tensor_util.h"

static gpu_ctx g;

static double out_rel(tk_dtype dt)
{
    return dt.bits == 32 ? ldexp(1, -24) : dt.code == TK_DL_BFLOAT ? ldexp(1, -8) : ldexp(1, -11);
}
static double out_abs(tk_dtype dt) { return dt.code == TK_DL_FLOAT && dt.bits == 16 ? ldexp(1, -24) : 0; }

static tk_arg T(const char *name, tk_tensor *t) { return (tk_arg){TK_ARG_TENSOR, name, t, 0, 0}; }
static tk_arg I(const char *name, int64_t v) { return (tk_arg){TK_ARG_I64, name, NULL, v, 0}; }

/* ---- anywhere --------------------------------------------------------------------------------- */

static void test_cublaslt_loader(void)
{
    size_t version = 0;
    const char *path = NULL;
    /* the algorithm description refuses what is no product before it loads anything */
    tk_jit_gemm none;
    tk_jit_blaslt_algo al;
    memset(&none, 0, sizeof none);
    none.m = 4;
    none.n = 8;
    CHECK_RC(tk_jit__blaslt_algo_info(&none, &al), TK_ERR_INVALID); /* k = 0 */
    CHECK_CONTAINS(tk_last_error(), "no product");
    none.k = 16;
    CHECK_RC(tk_jit__blaslt_algo_info(&none, NULL), TK_ERR_INVALID);
    int rc = tk_jit__blaslt_version(&version, &path);
    if (rc == TK_ERR_UNSUPPORTED) {
        CHECK_CONTAINS(tk_last_error(), "HINT:"); /* says what to install */
        SKIP("cuBLASLt is not installed");
    }
    CHECK_RC(rc, TK_OK);
    printf("cuBLASLt %zu from %s\n", version, path ? path : "?");
    CHECK(version >= 110000);
}

static void test_builtin_listed(void)
{
    char home[] = "/tmp/tk-layers-ops.XXXXXX", cmd[128], *json = NULL;
    CHECK(mkdtemp(home) != NULL);
    tk_ctx *ctx = NULL;
    tk_ctx_opts o = TK_CTX_OPTS_INIT;
    o.home = home;
    o.offline = 1;
    CHECK_RC(tk_ctx_new(&ctx, &o), TK_OK);
    CHECK_RC(tk_ops_json(&json, ctx), TK_OK);
    const char *lin = json ? strstr(json, "\"name\": \"linear\"") : NULL;
    const char *next = lin ? strstr(lin + 1, "\"name\": \"embedding\"") : NULL;
    const char *bi = lin ? strstr(lin, "\"impl\": \"builtin:cublaslt\"") : NULL;
    CHECK(lin && bi && (!next || bi < next)); /* listed under linear, no package needed */
    tk_free(json);
    if (!gpu_device()) { /* CUDA tensors without a device: a clear error, nothing dereferenced */
        int64_t xs[2] = {2, 8}, ws[2] = {4, 8}, os[2] = {2, 4};
        tk_tensor x = {(void *)(uintptr_t)0x1000, {TK_DEV_CUDA, 0}, 2, F32, xs, NULL, 0};
        tk_tensor w = x, out = x;
        w.shape = ws;
        out.shape = os;
        out.data = (void *)(uintptr_t)0x2000;
        int rc = tk_op_run(ctx, "linear", (tk_arg[]){T("out", &out), T("x", &x), T("weight", &w)}, 3, NULL, NULL);
        CHECK_EQ_INT(rc, TK_ERR_NO_DEVICE);
        printf("linear on cuda:0 without a device: %s\n", tk_last_error());
    }
    tk_ctx_free(ctx);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", home);
    CHECK(system(cmd) == 0);
}

/* ---- linear on cuBLASLt ----------------------------------------------------------------------- */

static int lin_case(tk_dtype dt, int64_t m, int64_t n, int64_t k, int tr, int bias)
{
    int64_t xs[2] = {m, k}, os[2] = {m, n}, ws[2] = {tr ? k : n, tr ? n : k};
    host_t x, w, b, ref, got;
    dev_tensor dx, dw, db, dout;
    host_new(&x, dt, 2, xs, 0);
    host_new(&w, dt, 2, ws, 0);
    host_new(&b, dt, 1, &n, 0);
    host_new(&ref, dt, 2, os, 0);
    host_new(&got, dt, 2, os, 0);
    fill(&x, 2.0);
    fill(&w, 1.0 / sqrt((double)(k ? k : 1)));
    fill(&b, 1.0);
    tk_arg ca[5] = {T("out", &ref.t), T("x", &x.t), T("weight", &w.t), I("transposed", tr), T("bias", &b.t)};
    CHECK_RC(gpu_op_run(g.ctx, "linear", ca, bias ? 5 : 4, NULL, NULL), TK_OK);
    int ok = dev_upload(&dx, &x.t) == TK_OK && dev_upload(&dw, &w.t) == TK_OK && dev_upload(&db, &b.t) == TK_OK &&
             dev_upload(&dout, &got.t) == TK_OK;
    CHECK(ok);
    const char *impl = NULL;
    tk_arg ga[5] = {T("out", &dout.t), T("x", &dx.t), T("weight", &dw.t), I("transposed", tr), T("bias", &db.t)};
    int rc = gpu_op_run(g.ctx, "linear", ga, bias ? 5 : 4, NULL, &impl);
    if (rc != TK_OK)
        fprintf(stderr, "  linear on cuda: %s\n", tk_last_error());
    ok &= rc == TK_OK && impl && strcmp(impl, "builtin:cublaslt") == 0;
    ok &= dev_download(&dout, &got.t) == TK_OK;
    /* The algorithm cuBLASLt ran (cached by the product's shape and alignments): a split-K one must
     * add its parts in fp32 (reduction scheme 2) when the output is 16-bit; 1 (in place) and 4
     * (output type) round every part to the output's dtype first. */
    tk_jit_gemm gg;
    tk_jit_blaslt_algo al;
    memset(&gg, 0, sizeof gg);
    gg.dtype = dt.code == TK_DL_BFLOAT ? TK_JIT_BLASLT_BF16 : dt.bits == 16 ? TK_JIT_BLASLT_F16 : TK_JIT_BLASLT_F32;
    gg.m = m;
    gg.n = n;
    gg.k = k;
    gg.x = dev_data(&dx);
    gg.w = dev_data(&dw);
    gg.w_kn = tr;
    gg.bias = bias ? dev_data(&db) : NULL;
    gg.y = dev_data(&dout);
    int arc = ok && k > 0 ? tk_jit__blaslt_algo_info(&gg, &al) : TK_ERR_INVALID;
    int red_ok = arc != TK_OK || dt.bits == 32 || al.splitk <= 1 || al.reduction == 0 || al.reduction == 2;
    if (arc == TK_OK && (!red_ok || getenv("TK_TEST_LOG")))
        printf("  linear %s M %lld N %lld K %lld tr %d bias %d: cuBLASLt algo %d tile %d split-K %d reduction %d "
               "workspace %zu\n",
               tk_dtype_name(dt), (long long)m, (long long)n, (long long)k, tr, bias, al.algo_id, al.tile_id, al.splitk,
               al.reduction, al.workspace);
    else if (ok && k > 0 && arc != TK_ERR_UNSUPPORTED)
        printf("  linear %s M %lld N %lld K %lld: no algorithm description: %s\n", tk_dtype_name(dt), (long long)m,
               (long long)n, (long long)k, tk_last_error());
    ok &= red_ok && (arc == TK_OK || arc == TK_ERR_UNSUPPORTED || k == 0);
    op_cmp c = op_cmp_begin(0, 0, "linear %s M %lld N %lld K %lld tr %d bias %d out, cuda against cpu",
                            tk_dtype_name(dt), (long long)m, (long long)n, (long long)k, tr, bias);
    c.cols = n;
    c.nan_fails = 1;
    c.inf_fails = 1;
    for (int64_t i = 0; ok && i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double mag = bias ? fabs(get(&b.t, j)) : 0;
            for (int64_t kk = 0; kk < k; kk++)
                mag += fabs(get(&x.t, i * k + kk) * get(&w.t, tr ? kk * n + j : j * k + kk));
            double r = get(&ref.t, i * n + j);
            double tol = 2 * out_rel(dt) * fabs(r) + 2.0 * (double)(k + 2) * ldexp(1, -24) * mag + 2 * out_abs(dt);
            op_cmp_tol(&c, i * n + j, get(&got.t, i * n + j), r, tol);
        }
    ok = ok && op_cmp_end(&c);
    dev_free(&dx);
    dev_free(&dw);
    dev_free(&db);
    dev_free(&dout);
    host_free(&x);
    host_free(&w);
    host_free(&b);
    host_free(&ref);
    host_free(&got);
    return ok;
}

static void test_linear(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    const char *pkgs[] = {NULL};
    CHECK_RC(gpu_ctx_new(&g, pkgs), TK_OK);
    const tk_dtype dts[] = {F32, F16, BF16};
    /* Small grids with a short K ({64, 96, 77}, {32, 48, 200}, {8, 64, 333}, {33, 65, 31}) are where
     * cuBLASLt's heuristic picks split-K: before cublaslt.c limited the reduction to fp32 parts, bf16
     * runs summed 16-bit parts (the first GPU run: 368 of 6144 elements off at {64, 96, 77}). */
    const int64_t mnk[][3] = {{1, 1, 1},    {1, 768, 768},    {7, 33, 129},   {3, 1, 100},
                              {64, 96, 77}, {32, 48, 200},    {8, 64, 333},   {33, 65, 31},
                              {1, 96, 77},  {16, 4096, 4096}, {5, 50257, 64}, {2, 3, 0}};
    int ok = 1;
    for (size_t d = 0; d < 3; d++)
        for (size_t i = 0; i < sizeof mnk / sizeof mnk[0]; i++)
            for (int tr = 0; tr < 2; tr++)
                for (int bias = 0; bias < 2; bias++)
                    ok &= lin_case(dts[d], mnk[i][0], mnk[i][1], mnk[i][2], tr, bias);
    CHECK(ok);
    gpu_ctx_free(&g);
}

/* ---- embedding, add, tanh on kernels-community/layers ----------------------------------------- */

static void test_embedding(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    const char *pkgs[] = {"kernels-community/layers", NULL};
    CHECK_RC(gpu_ctx_new(&g, pkgs), TK_OK);
    const tk_dtype dts[] = {F32, F16, BF16};
    const int64_t vd[][2] = {{11, 1}, {50, 7}, {1000, 768}, {5, 4097}};
    for (size_t d = 0; d < 3; d++)
        for (int it = 0; it < 2; it++)
            for (size_t s = 0; s < sizeof vd / sizeof vd[0]; s++) {
                int64_t V = vd[s][0], D = vd[s][1], is[2] = {3, 9}, ws[2] = {V, D}, os[3] = {3, 9, D};
                host_t ids, w, got;
                dev_tensor di, dw, dout;
                host_new(&ids, it ? I64 : I32, 2, is, 0);
                host_new(&w, dts[d], 2, ws, 0);
                host_new(&got, dts[d], 3, os, 0);
                fill(&w, 3.0);
                for (int64_t i = 0; i < 27; i++) {
                    int64_t id = i == 5 ? V : i == 6 ? -1 : (int64_t)(next_u64() % (uint64_t)V); /* two bad ids */
                    id_set(&ids, i, id);
                }
                CHECK_RC(dev_upload(&di, &ids.t), TK_OK);
                CHECK_RC(dev_upload(&dw, &w.t), TK_OK);
                CHECK_RC(dev_upload(&dout, &got.t), TK_OK);
                const char *impl = NULL;
                CHECK_RC(gpu_op_run(g.ctx, "embedding",
                                    (tk_arg[]){T("out", &dout.t), T("ids", &di.t), T("weight", &dw.t)}, 3, NULL, &impl),
                         TK_OK);
                CHECK(impl && strstr(impl, "kernels-community/layers:embedding_") == impl);
                CHECK_RC(dev_download(&dout, &got.t), TK_OK);
                /* the row's values (0 for an id out of range), equal: a tolerance of 0 */
                op_cmp cmp = op_cmp_begin(0, 0, "embedding %s V %lld D %lld out, cuda", tk_dtype_name(dts[d]),
                                          (long long)V, (long long)D);
                cmp.cols = D;
                cmp.nan_fails = 1;
                for (int64_t i = 0; i < 27; i++) {
                    int64_t id = id_get(&ids, i);
                    for (int64_t c = 0; c < D; c++)
                        op_cmp_tol(&cmp, i * D + c, get(&got.t, i * D + c),
                                   id >= 0 && id < V ? get(&w.t, id * D + c) : 0.0, 0);
                }
                CHECK(op_cmp_end(&cmp));
                dev_free(&di);
                dev_free(&dw);
                dev_free(&dout);
                host_free(&ids);
                host_free(&w);
                host_free(&got);
            }
    gpu_ctx_free(&g);
}

/* add (alias: 0 apart, 1 out is a), tanh or softcap (cap 3), against the CPU reference on the same inputs. */
static int ew_case(const char *op, tk_dtype dt, int64_t rows, int64_t cols, int alias)
{
    int is_add = strcmp(op, "add") == 0, is_cap = strcmp(op, "softcap") == 0;
    int64_t sh[2] = {rows, cols};
    host_t a, b, ref, got;
    dev_tensor da, db, dout;
    host_new(&a, dt, 2, sh, 0);
    host_new(&b, dt, 2, sh, 0);
    host_new(&ref, dt, 2, sh, 0);
    host_new(&got, dt, 2, sh, 0);
    fill(&a, 5.0);
    fill(&b, 5.0);
    tk_arg cap = {TK_ARG_F64, "cap", NULL, 0, 3.0};
    tk_arg ca[3] = {T("out", &ref.t), T(is_add ? "a" : "input", &a.t), is_cap ? cap : T("b", &b.t)};
    CHECK_RC(gpu_op_run(g.ctx, op, ca, is_add || is_cap ? 3 : 2, NULL, NULL), TK_OK);
    int ok = dev_upload(&da, &a.t) == TK_OK && dev_upload(&db, &b.t) == TK_OK && dev_upload(&dout, &got.t) == TK_OK;
    tk_tensor *o = alias ? &da.t : &dout.t;
    const char *impl = NULL;
    tk_arg ga[3] = {T("out", o), T(is_add ? "a" : "input", &da.t), is_cap ? cap : T("b", &db.t)};
    ok &= gpu_op_run(g.ctx, op, ga, is_add || is_cap ? 3 : 2, NULL, &impl) == TK_OK;
    ok &= impl && strstr(impl, "kernels-community/layers:") == impl;
    ok &= dev_download(alias ? &da : &dout, &got.t) == TK_OK;
    op_cmp c = op_cmp_begin(0, 0, "%s %s [%lld, %lld] alias %d out, cuda against cpu", op, tk_dtype_name(dt),
                            (long long)rows, (long long)cols, alias);
    c.cols = cols;
    c.nan_fails = 1;
    c.inf_fails = 1;
    for (int64_t i = 0; ok && i < rows * cols; i++) {
        double r = get(&ref.t, i);
        /* softcap: tanhf's error (4 ulps) scaled by cap, one division's rounding, the output rounding */
        double tol =
            is_add ? 0 : (is_cap ? 3.0 * 6 : 4) * ldexp(1, -24) * fabs(r) + out_rel(dt) * fabs(r) + out_abs(dt);
        op_cmp_tol(&c, i, get(&got.t, i), r, tol);
    }
    ok = ok && op_cmp_end(&c);
    dev_free(&da);
    dev_free(&db);
    dev_free(&dout);
    host_free(&a);
    host_free(&b);
    host_free(&ref);
    host_free(&got);
    return ok;
}

static void test_add_tanh(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    const char *pkgs[] = {"kernels-community/layers", NULL};
    CHECK_RC(gpu_ctx_new(&g, pkgs), TK_OK);
    const tk_dtype dts[] = {F32, F16, BF16};
    const int64_t shapes[][2] = {{1, 1}, {3, 7}, {5, 1001}, {64, 4096}};
    int ok = 1;
    for (size_t d = 0; d < 3; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int alias = 0; alias < 2; alias++) {
                ok &= ew_case("add", dts[d], shapes[s][0], shapes[s][1], alias);
                ok &= ew_case("tanh", dts[d], shapes[s][0], shapes[s][1], alias);
                ok &= ew_case("softcap", dts[d], shapes[s][0], shapes[s][1], alias);
            }
    CHECK(ok);
    gpu_ctx_free(&g);
}

static void test_coverage(void)
{
    const char *pkgs[] = {"kernels-community/layers", NULL};
    gpu_coverage_check(pkgs);
}

int main(int argc, char **argv)
{
    static const char *const ops[] = {"linear", "embedding", "add", "tanh", "softcap", NULL};
    gpu_main(argc, argv, ops);
    op_test_seed();
    RUN(test_cublaslt_loader);
    RUN(test_builtin_listed);
    RUN(test_linear);
    RUN(test_embedding);
    RUN(test_add_tanh);
    RUN(test_coverage);
    return th_done();
}
