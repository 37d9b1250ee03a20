/*
 * test_ops_layers.c — the layer ops of the model pipelines (ops/layers.c: linear, embedding, add,
 * tanh): each CPU reference against an independent float64 computation on fresh random inputs, linear
 * against PyTorch (torch.nn.functional.linear, through tests/oracle_linear.py), and the validation
 * messages.
 *
 * Tolerances, |got - ref| <= tol with ref in float64 from the values as stored:
 *   linear     u_out * |ref| + (K + 2) * 2^-24 * (sum_k |x_k w_k| + |bias|)  (+ 2^-24 for f16: its
 *              subnormal spacing), u_out = 2^-24 (f32), 2^-11 (f16), 2^-8 (bf16): fp32 products and
 *              sums in any order, then one rounding to the output dtype.
 *   add        one fp32 sum rounded once: u_out * |ref| (+ 2^-24 for f16), so the result is the
 *              correctly rounded sum for f16 / bf16 and within one f32 ulp for f32.
 *   tanh       tanhf's error (a few f32 ulps: 8 * 2^-24 |ref| + 2^-30) plus u_out * |ref|.
 *   embedding  exact: rows are copied bit for bit.
 * Shapes are ragged: K not a multiple of anything, N = 1, K = 1, K = 0, M = 1, batch dimensions,
 * strided x / weight / out, transposed=1, with and without bias, and one weight bigger than the
 * 64 MiB conversion panel (so the panel loop runs more than once).
 *
 * Uses only ops/ and common/. Inputs are random with a seed printed on any failure; set TK_TEST_SEED
 * to replay one. The torch check needs the test venv (th_py_venv(): $TK_PY_VENV, default
 * ~/.cache/tk/py-venv); it skips without one, and fails under CI=true.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "op_test.h"
#include "tensor_util.h"
#include "ops/ops.h"

/* Relative rounding of one store in dtype dt, and its absolute floor (f16 subnormals). */
static double out_rel(tk_dtype dt)
{
    return dt.bits == 32 ? ldexp(1, -24) : dt.code == TK_DL_BFLOAT ? ldexp(1, -8) : ldexp(1, -11);
}
static double out_abs(tk_dtype dt) { return dt.code == TK_DL_FLOAT && dt.bits == 16 ? ldexp(1, -24) : 0; }

static tk_arg T(const char *name, tk_tensor *t) { return (tk_arg){TK_ARG_TENSOR, name, t, 0, 0}; }
static tk_arg I(const char *name, int64_t v) { return (tk_arg){TK_ARG_I64, name, NULL, v, 0}; }

/* ---- linear ----------------------------------------------------------------------------------- */

typedef struct {
    tk_dtype dt;
    int nd;           /* rank of x */
    int64_t xs[4];    /* shape of x, last K */
    int64_t n;
    int bias, tr;
    int64_t xpad, wpad, opad;
} lin_spec;

/* Runs one linear on random inputs; 1 when every element is within tolerance. */
static int lin_case(const lin_spec *s)
{
    int64_t K = s->xs[s->nd - 1], M = 1, osh[4], N = s->n;
    for (int i = 0; i < s->nd - 1; i++)
        M *= s->xs[i];
    memcpy(osh, s->xs, sizeof osh);
    osh[s->nd - 1] = N;
    int64_t wsh[2] = {s->tr ? K : N, s->tr ? N : K};
    host_t x, w, b, out;
    host_new(&x, s->dt, s->nd, s->xs, s->xpad);
    host_new(&w, s->dt, 2, wsh, s->wpad);
    host_new(&b, s->dt, 1, &N, 0);
    host_new(&out, s->dt, s->nd, osh, s->opad);
    fill(&x, 2.0);
    fill(&w, 1.0 / sqrt((double)(K ? K : 1)));
    fill(&b, 1.0);
    for (int64_t i = 0; i < M * N; i++)
        set(&out.t, i, 12345.0);
    tk_arg args[5] = {T("out", &out.t), T("x", &x.t), T("weight", &w.t), I("transposed", s->tr), T("bias", &b.t)};
    int rc = op_run_cpu("linear", args, s->bias ? 5 : 4), ok = rc == TK_OK;
    if (!ok)
        fprintf(stderr, "  linear: rc %d: %s (seed %llu)\n", rc, tk_last_error(), (unsigned long long)seed);
    op_cmp c = op_cmp_begin(0, 0, "linear %s M %lld N %lld K %lld%s%s out", tk_ops__dtype_str(s->dt), (long long)M,
                            (long long)N, (long long)K, s->bias ? " + bias" : "", s->tr ? " transposed" : "");
    c.cols = N;
    c.nan_fails = 1;
    c.inf_fails = 1;
    for (int64_t m = 0; ok && m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double acc = 0, mag = 0, bb = s->bias ? get(&b.t, n) : 0;
            for (int64_t k = 0; k < K; k++) {
                double p = get(&x.t, m * K + k) * get(&w.t, s->tr ? k * N + n : n * K + k);
                acc += p;
                mag += fabs(p);
            }
            double ref = acc + bb;
            double tol =
                out_rel(s->dt) * fabs(ref) + (double)(K + 2) * ldexp(1, -24) * (mag + fabs(bb)) + out_abs(s->dt);
            op_cmp_tol(&c, m * N + n, get(&out.t, m * N + n), ref, tol);
        }
    ok = ok && op_cmp_end(&c);
    host_free(&x);
    host_free(&w);
    host_free(&b);
    host_free(&out);
    return ok;
}

static void test_linear(void)
{
    const tk_dtype dts[] = {F32, F16, BF16};
    const int64_t mnk[][3] = {{1, 1, 1},     {1, 1, 77}, {3, 1, 100},   {1, 13, 33}, {5, 7, 1},
                              {9, 17, 1000}, {17, 5, 7}, {40, 33, 130}, {2, 3, 0},   {64, 96, 129}};
    int ok = 1;
    for (size_t d = 0; d < 3; d++)
        for (size_t i = 0; i < sizeof mnk / sizeof mnk[0]; i++)
            for (int tr = 0; tr < 2; tr++) {
                lin_spec s = {dts[d], 2, {mnk[i][0], mnk[i][2]}, mnk[i][1], (int)((i + tr) & 1), tr, 0, 0, 0};
                ok &= lin_case(&s);
                s.bias = !s.bias;
                s.xpad = 3, s.wpad = 2, s.opad = 1; /* every operand strided */
                ok &= lin_case(&s);
            }
    /* batch dimensions flattened into M */
    for (size_t d = 0; d < 3; d++) {
        lin_spec s3 = {dts[d], 3, {2, 3, 45}, 11, 1, 0, 0, 0, 0};
        ok &= lin_case(&s3);
        lin_spec s4 = {dts[d], 4, {2, 1, 3, 31}, 1, 0, 1, 0, 0, 2};
        ok &= lin_case(&s4);
    }
    CHECK(ok);
}

/* A weight of more than 16M elements is converted to fp32 in more than one panel. */
static void test_linear_panels(void)
{
    lin_spec a = {BF16, 2, {2, 4099}, 4097, 1, 0, 0, 0, 0};
    CHECK(lin_case(&a));
    lin_spec b = {F16, 2, {3, 4097}, 4099, 0, 1, 0, 0, 0};
    CHECK(lin_case(&b));
}

/* Several host threads calling linear at once (each cblas_sgemm shares OpenBLAS's one thread pool):
 * every result within the float64 bound. (Not compared bit for bit with a call made alone: OpenBLAS may
 * split a product differently when its pool is busy, which changes the summation order.) */
typedef struct {
    tk_tensor *out, *x, *w, *b;
    int rc;
} lin_thread;

static void *lin_thread_main(void *p)
{
    lin_thread *t = p;
    tk_op_call c;
    tk_arg args[4] = {T("out", t->out), T("x", t->x), T("weight", t->w), T("bias", t->b)};
    t->rc = tk_ops__prepare(&c, "linear", args, 4);
    for (int rep = 0; t->rc == TK_OK && rep < 5; rep++)
        t->rc = tk_ops__run_cpu(&c);
    return NULL;
}

static void test_linear_threads(void)
{
    enum { NT = 4 };
    int64_t xs[2] = {64, 300}, ws[2] = {200, 300}, os[2] = {64, 200}, n = 200;
    host_t x[NT], w, b, out[NT];
    host_new(&w, F32, 2, ws, 0);
    host_new(&b, F32, 1, &n, 0);
    fill(&w, 0.1);
    fill(&b, 1.0);
    lin_thread th[NT];
    pthread_t tid[NT];
    int started[NT] = {0};
    for (int i = 0; i < NT; i++) {
        host_new(&x[i], F32, 2, xs, 0);
        host_new(&out[i], F32, 2, os, 0);
        fill(&x[i], 2.0);
        th[i] = (lin_thread){&out[i].t, &x[i].t, &w.t, &b.t, TK_ERR_INTERNAL};
    }
    for (int i = 0; i < NT; i++)
        started[i] = pthread_create(&tid[i], NULL, lin_thread_main, &th[i]) == 0;
    for (int i = 0; i < NT; i++) {
        if (started[i])
            pthread_join(tid[i], NULL);
        CHECK(started[i]);
        CHECK_RC(th[i].rc, TK_OK);
        op_cmp c = op_cmp_begin(0, 0, "linear f32 [64, 300] x [200, 300]^T + bias on thread %d, out", i);
        c.cols = n;
        c.nan_fails = 1;
        c.inf_fails = 1;
        for (int64_t r = 0; r < 64; r++)
            for (int64_t j = 0; j < n; j++) {
                double acc = get(&b.t, j), mag = fabs(acc);
                for (int64_t k = 0; k < 300; k++) {
                    acc += get(&x[i].t, r * 300 + k) * get(&w.t, j * 300 + k);
                    mag += fabs(get(&x[i].t, r * 300 + k) * get(&w.t, j * 300 + k));
                }
                op_cmp_tol(&c, r * n + j, get(&out[i].t, r * n + j), acc, ldexp(1, -24) * (fabs(acc) + 302 * mag));
            }
        CHECK(op_cmp_end(&c));
        host_free(&x[i]);
        host_free(&out[i]);
    }
    host_free(&w);
    host_free(&b);
}

/* A K = 0 product is the bias (or 0); M = 0 writes nothing. */
static void test_linear_empty(void)
{
    int64_t xs[2] = {3, 0}, ws[2] = {4, 0}, os[2] = {3, 4}, n = 4, xs0[2] = {0, 5}, ws0[2] = {4, 5}, os0[2] = {0, 4};
    host_t x, w, b, out;
    host_new(&x, F32, 2, xs, 0);
    host_new(&w, F32, 2, ws, 0);
    host_new(&b, F32, 1, &n, 0);
    host_new(&out, F32, 2, os, 0);
    fill(&b, 1.0);
    for (int64_t i = 0; i < 12; i++)
        set(&out.t, i, 7.0);
    tk_arg args[4] = {T("out", &out.t), T("x", &x.t), T("weight", &w.t), T("bias", &b.t)};
    CHECK_RC(op_run_cpu("linear", args, 4), TK_OK);
    for (int64_t i = 0; i < 12; i++)
        CHECK(get(&out.t, i) == get(&b.t, i % 4));
    CHECK_RC(op_run_cpu("linear", args, 3), TK_OK);
    for (int64_t i = 0; i < 12; i++)
        CHECK(get(&out.t, i) == 0.0);
    host_free(&x);
    host_free(&w);
    host_free(&out);
    host_new(&x, F32, 2, xs0, 0);
    host_new(&w, F32, 2, ws0, 0);
    host_new(&out, F32, 2, os0, 0);
    tk_arg a0[4] = {T("out", &out.t), T("x", &x.t), T("weight", &w.t), T("bias", &b.t)};
    CHECK_RC(op_run_cpu("linear", a0, 4), TK_OK);
    host_free(&x);
    host_free(&w);
    host_free(&b);
    host_free(&out);
}

static void test_linear_validation(void)
{
    int64_t xs[2] = {4, 32}, ws[2] = {16, 32}, os[2] = {4, 16}, n = 16, bad_x[2] = {4, 31}, bad_o[2] = {4, 15},
            n15 = 15;
    host_t x, w, b, out, xb, ob, b15, bf, wt;
    host_new(&x, BF16, 2, xs, 0);
    host_new(&w, BF16, 2, ws, 0);
    host_new(&b, BF16, 1, &n, 0);
    host_new(&out, BF16, 2, os, 0);
    host_new(&xb, BF16, 2, bad_x, 0);
    host_new(&ob, BF16, 2, bad_o, 0);
    host_new(&b15, BF16, 1, &n15, 0);
    host_new(&bf, F32, 1, &n, 0);
    int64_t wts[2] = {32, 16};
    host_new(&wt, BF16, 2, wts, 0);
    const char *op = "linear";
    tk_arg a[5] = {T("out", &out.t), T("x", &xb.t), T("weight", &w.t), T("bias", &b.t), I("transposed", 0)};
    CHECK_RC(op_run_cpu(op, a, 5), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "linear: 'x' has shape [4, 31], want [4, 32] (its last dimension is K, the row "
                                    "width of 'weight' [16, 32], [N, K])");
    CHECK_CONTAINS(tk_last_error(), "HINT: nn.Linear weights are [out, in]; pass transposed=1");
    a[1].t = &x.t;
    a[0].t = &ob.t;
    CHECK_RC(op_run_cpu(op, a, 5), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "linear: 'out' has shape [4, 15], want [4, 16] (the leading dimensions of 'x' "
                                    "[4, 32], then N, the rows of 'weight' [16, 32], [N, K])");
    a[0].t = &out.t;
    a[3].t = &b15.t;
    CHECK_RC(op_run_cpu(op, a, 5), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "linear: 'bias' has shape [15], want [16] (one per output channel");
    a[3].t = &bf.t;
    CHECK_RC(op_run_cpu(op, a, 5), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "linear: 'bias' has dtype f32, want bf16 (the dtype of 'x')");
    a[3].t = &b.t;
    a[4].i = 2;
    CHECK_RC(op_run_cpu(op, a, 5), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "linear: 'transposed' is 2, want 0");
    /* a [K, N] weight without transposed=1: named, with the hint */
    a[4].i = 0;
    a[2].t = &wt.t;
    CHECK_RC(op_run_cpu(op, a, 5), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "linear: 'x' has shape [4, 32], want [4, 16]");
    a[4].i = 1;
    CHECK_RC(op_run_cpu(op, a, 5), TK_OK);
    /* transposed=1 with an [N, K] weight */
    a[2].t = &w.t;
    CHECK_RC(op_run_cpu(op, a, 5), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(),
                   "(its last dimension is K, the rows of 'weight' [16, 32], [K, N] with transposed=1)");
    CHECK_CONTAINS(tk_last_error(), "HINT: GPT-2's Conv1D weights are [in, out]");
    a[4].i = 0;
    /* a 1-D weight, a missing weight */
    CHECK_RC(op_run_cpu(op, (tk_arg[]){T("out", &out.t), T("x", &x.t), T("weight", &b.t)}, 3), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "linear: 'weight' has rank 1 (shape [16]), want 2");
    CHECK_RC(op_run_cpu(op, (tk_arg[]){T("out", &out.t), T("x", &x.t)}, 2), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "linear: missing argument 'weight'");
    /* out over x */
    int64_t sq[2] = {4, 16}, wsq[2] = {16, 16};
    host_t xsq, wsq_;
    host_new(&xsq, F32, 2, sq, 0);
    host_new(&wsq_, F32, 2, wsq, 0);
    CHECK_RC(op_run_cpu(op, (tk_arg[]){T("out", &xsq.t), T("x", &xsq.t), T("weight", &wsq_.t)}, 3), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "linear: 'out' overlaps 'x' in memory");
    host_free(&xsq);
    host_free(&wsq_);
    host_free(&x);
    host_free(&w);
    host_free(&b);
    host_free(&out);
    host_free(&xb);
    host_free(&ob);
    host_free(&b15);
    host_free(&bf);
    host_free(&wt);
}

/* ---- linear against PyTorch ------------------------------------------------------------------- */

static int write_f32(const char *path, const tk_tensor *t)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return 0;
    int ok = 1;
    for (int64_t i = 0, n = numel(t); ok && i < n; i++) {
        float v = (float)get(t, i);
        ok = fwrite(&v, sizeof v, 1, f) == 1;
    }
    return fclose(f) == 0 && ok;
}

/* tests/oracle_linear.py computes torch.nn.functional.linear on the same values in the same dtype
 * (for transposed=1: linear(x, weight.T), what transformers' Conv1D computes), all cases in one
 * process. Both results are fp32 sums rounded once, so they agree within two output roundings and
 * two summation bounds. */
static const struct {
    tk_dtype dt;
    int64_t m, n, k;
    int tr, bias;
} torch_cases[] = {{{TK_DL_FLOAT, 32, 1}, 7, 33, 129, 0, 1},  {{TK_DL_FLOAT, 32, 1}, 5, 17, 64, 1, 1},
                   {{TK_DL_BFLOAT, 16, 1}, 9, 31, 257, 0, 1}, {{TK_DL_BFLOAT, 16, 1}, 4, 12, 96, 1, 0},
                   {{TK_DL_FLOAT, 16, 1}, 6, 20, 77, 0, 0},   {{TK_DL_FLOAT, 16, 1}, 3, 1, 100, 1, 1}};
#define NTORCH (sizeof torch_cases / sizeof torch_cases[0])

static void test_linear_torch(void)
{
    const char *venv = th_py_venv();
    char py[600], dir[] = "/tmp/tk-linear-XXXXXX", path[700], cmd[2048];
    snprintf(py, sizeof py, "%s/bin/python", venv);
    /* found, not imported: oracle_linear.py imports it, and an import costs seconds */
    snprintf(cmd, sizeof cmd,
             "'%s' -c 'import importlib.util as u, sys; sys.exit(u.find_spec(\"torch\") is None)' >/dev/null 2>&1", py);
    if (system(cmd) != 0) {
        if (getenv("CI") && *getenv("CI")) {
            fprintf(stderr, "  no torch in %s (CI: the oracle is required; run scripts/setup.sh --test)\n", py);
            CHECK(!"torch oracle missing under CI");
            return;
        }
        SKIP("no torch in the test venv (TK_PY_VENV or ~/.cache/tk/py-venv); run scripts/setup.sh --test");
    }
    if (!mkdtemp(dir)) {
        CHECK(!"mkdtemp");
        return;
    }
    host_t x[NTORCH], w[NTORCH], b[NTORCH], out[NTORCH];
    snprintf(path, sizeof path, "%s/cases.txt", dir);
    FILE *cf = fopen(path, "w");
    CHECK(cf != NULL);
    for (size_t c = 0; c < NTORCH; c++) {
        int64_t xs[2] = {torch_cases[c].m, torch_cases[c].k}, os[2] = {torch_cases[c].m, torch_cases[c].n};
        int64_t n = torch_cases[c].n, tr = torch_cases[c].tr;
        int64_t ws[2] = {tr ? torch_cases[c].k : n, tr ? n : torch_cases[c].k};
        tk_dtype dt = torch_cases[c].dt;
        host_new(&x[c], dt, 2, xs, 0);
        host_new(&w[c], dt, 2, ws, 0);
        host_new(&b[c], dt, 1, &n, 0);
        host_new(&out[c], dt, 2, os, 0);
        fill(&x[c], 2.0);
        fill(&w[c], 0.2);
        fill(&b[c], 1.0);
        tk_arg args[5] = {T("out", &out[c].t), T("x", &x[c].t), T("weight", &w[c].t), I("transposed", tr),
                          T("bias", &b[c].t)};
        CHECK_RC(op_run_cpu("linear", args, torch_cases[c].bias ? 5 : 4), TK_OK);
        const char *names[3] = {"x", "w", "b"};
        const tk_tensor *ts[3] = {&x[c].t, &w[c].t, &b[c].t};
        for (int i = 0; i < 3; i++) {
            snprintf(path, sizeof path, "%s/%zu.%s.bin", dir, c, names[i]);
            CHECK(write_f32(path, ts[i]));
        }
        if (cf)
            fprintf(cf, "%zu %lld %lld %lld %s %d %d\n", c, (long long)torch_cases[c].m, (long long)n,
                    (long long)torch_cases[c].k, tk_ops__dtype_str(dt), (int)tr, torch_cases[c].bias);
    }
    if (cf)
        fclose(cf);
    snprintf(cmd, sizeof cmd, "'%s' tests/oracle_linear.py '%s'", py, dir);
    int st = system(cmd);
    CHECK(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    for (size_t c = 0; c < NTORCH; c++) {
        tk_dtype dt = torch_cases[c].dt;
        int64_t n = torch_cases[c].n, kk = torch_cases[c].k, tr = torch_cases[c].tr;
        snprintf(path, sizeof path, "%s/%zu.out.bin", dir, c);
        FILE *f = fopen(path, "rb");
        CHECK(f != NULL);
        int64_t cnt = torch_cases[c].m * n;
        op_cmp cmp = op_cmp_begin(0, 0, "linear vs torch %s M %lld N %lld K %lld tr %d out", tk_ops__dtype_str(dt),
                                  (long long)torch_cases[c].m, (long long)n, (long long)kk, (int)tr);
        cmp.cols = n;
        cmp.nan_fails = 1;
        cmp.inf_fails = 1;
        for (int64_t i = 0; f && i < cnt; i++) {
            float want;
            if (fread(&want, sizeof want, 1, f) != 1) {
                CHECK(!"short oracle output");
                break;
            }
            int64_t m = i / n, j = i % n;
            double mag = torch_cases[c].bias ? fabs(get(&b[c].t, j)) : 0;
            for (int64_t k = 0; k < kk; k++)
                mag += fabs(get(&x[c].t, m * kk + k) * get(&w[c].t, tr ? k * n + j : j * kk + k));
            double got = get(&out[c].t, i);
            double tol =
                out_rel(dt) * (fabs(got) + fabs(want)) + 2.0 * (double)(kk + 2) * ldexp(1, -24) * mag + 2 * out_abs(dt);
            op_cmp_tol(&cmp, i, got, want, tol);
        }
        if (f)
            fclose(f);
        CHECK(op_cmp_end(&cmp));
        const char *names[4] = {"x", "w", "b", "out"};
        for (int i = 0; i < 4; i++) {
            snprintf(path, sizeof path, "%s/%zu.%s.bin", dir, c, names[i]);
            unlink(path);
        }
        host_free(&x[c]);
        host_free(&w[c]);
        host_free(&b[c]);
        host_free(&out[c]);
    }
    snprintf(path, sizeof path, "%s/cases.txt", dir);
    unlink(path);
    rmdir(dir);
}

/* ---- embedding -------------------------------------------------------------------------------- */

static int emb_case(tk_dtype dt, tk_dtype idt, int nd, const int64_t *is, int64_t V, int64_t D, int64_t pad)
{
    int64_t osh[8], wsh[2] = {V, D}, n = 1;
    for (int i = 0; i < nd; i++) {
        osh[i] = is[i];
        n *= is[i];
    }
    osh[nd] = D;
    host_t ids, w, out;
    host_new(&ids, idt, nd, is, nd ? pad : 0);
    host_new(&w, dt, 2, wsh, pad);
    host_new(&out, dt, nd + 1, osh, pad ? pad + 1 : 0);
    fill(&w, 3.0);
    for (int64_t i = 0; i < n; i++)
        id_set(&ids, i, i == 0 ? V - 1 : i == 1 ? 0 : (int64_t)(next_u64() % (uint64_t)V));
    int rc = op_run_cpu("embedding", (tk_arg[]){T("out", &out.t), T("ids", &ids.t), T("weight", &w.t)}, 3);
    int ok = rc == TK_OK;
    if (!ok)
        fprintf(stderr, "  embedding: rc %d: %s\n", rc, tk_last_error());
    op_cmp c = op_cmp_begin(0, 0, "embedding %s, ids %s, V %lld D %lld out", tk_ops__dtype_str(dt),
                            tk_ops__dtype_str(idt), (long long)V, (long long)D);
    c.cols = D;
    c.nan_fails = 1;
    for (int64_t i = 0; ok && i < n; i++) {
        int64_t id = id_get(&ids, i);
        for (int64_t d = 0; d < D; d++) /* a copy: the row's values exactly */
            op_cmp_exact(&c, i * D + d, get(&out.t, i * D + d), get(&w.t, id * D + d));
    }
    ok = ok && op_cmp_end(&c);
    host_free(&ids);
    host_free(&w);
    host_free(&out);
    return ok;
}

static void test_embedding(void)
{
    const tk_dtype dts[] = {F32, F16, BF16};
    int64_t i1[1] = {7}, i2[2] = {3, 5}, i0[1] = {1}, ibig[1] = {40};
    int ok = 1;
    for (size_t d = 0; d < 3; d++)
        for (int it = 0; it < 2; it++) {
            tk_dtype idt = it ? I64 : I32;
            ok &= emb_case(dts[d], idt, 1, i1, 11, 33, 0);
            ok &= emb_case(dts[d], idt, 2, i2, 50, 1, 0);
            ok &= emb_case(dts[d], idt, 1, i0, 1, 5, 2);
            ok &= emb_case(dts[d], idt, 2, i2, 9, 1030, 3); /* rows longer than one 1024-column block */
            ok &= emb_case(dts[d], idt, 0, NULL, 4, 6, 0);  /* one id, rank 0 */
            ok &= emb_case(dts[d], idt, 1, ibig, 3000, 17, 1);
        }
    CHECK(ok);
}

static void test_embedding_validation(void)
{
    int64_t is[2] = {2, 3}, ws[2] = {10, 4}, os[3] = {2, 3, 4}, bad_os[3] = {2, 3, 5}, flat[2] = {6, 4};
    host_t ids, ids64, w, out, ob, of, wf;
    host_new(&ids, I32, 2, is, 0);
    host_new(&ids64, I64, 2, is, 0);
    host_new(&w, BF16, 2, ws, 0);
    host_new(&wf, F32, 2, ws, 0);
    host_new(&out, BF16, 3, os, 0);
    host_new(&ob, BF16, 3, bad_os, 0);
    host_new(&of, BF16, 2, flat, 0);
    fill(&w, 1.0);
    for (int64_t i = 0; i < 6; i++) {
        id_set(&ids, i, i);
        id_set(&ids64, i, i);
    }
    for (int64_t i = 0; i < 24; i++)
        set(&out.t, i, 5.0);
    const char *op = "embedding";
    id_set(&ids, 4, 10);
    CHECK_RC(op_run_cpu(op, (tk_arg[]){T("out", &out.t), T("ids", &ids.t), T("weight", &w.t)}, 3), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(),
                   "embedding: ids[1, 1] = 10 is out of range for 'weight' [10, 4] (want 0 <= id < 10)");
    int untouched = 1;
    for (int64_t i = 0; i < 24; i++)
        untouched &= get(&out.t, i) == 5.0;
    CHECK(untouched); /* nothing written before the bad id was found */
    id_set(&ids, 4, 4);
    id_set(&ids64, 5, -1);
    CHECK_RC(op_run_cpu(op, (tk_arg[]){T("out", &out.t), T("ids", &ids64.t), T("weight", &w.t)}, 3), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "embedding: ids[1, 2] = -1 is out of range");
    id_set(&ids64, 5, (int64_t)1 << 40);
    CHECK_RC(op_run_cpu(op, (tk_arg[]){T("out", &out.t), T("ids", &ids64.t), T("weight", &w.t)}, 3), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "ids[1, 2] = 1099511627776 is out of range");
    CHECK_RC(op_run_cpu(op, (tk_arg[]){T("out", &ob.t), T("ids", &ids.t), T("weight", &w.t)}, 3), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "embedding: 'out' has shape [2, 3, 5], want [2, 3, 4] (the shape of 'ids' [2, 3], "
                                    "then D, the row width of 'weight' [10, 4])");
    CHECK_RC(op_run_cpu(op, (tk_arg[]){T("out", &of.t), T("ids", &ids.t), T("weight", &w.t)}, 3), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "embedding: 'out' has shape [6, 4], want [2, 3, 4]");
    CHECK_RC(op_run_cpu(op, (tk_arg[]){T("out", &out.t), T("ids", &ids.t), T("weight", &wf.t)}, 3), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "embedding: 'weight' has dtype f32, want bf16 (the dtype of 'out')");
    CHECK_RC(op_run_cpu(op, (tk_arg[]){T("out", &out.t), T("ids", &w.t), T("weight", &w.t)}, 3), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "embedding: 'ids' has dtype bf16, want i32 or i64");
    CHECK_RC(op_run_cpu(op, (tk_arg[]){T("out", &out.t), T("ids", &ids.t), T("weight", &w.t)}, 3), TK_OK);
    host_free(&ids);
    host_free(&ids64);
    host_free(&w);
    host_free(&wf);
    host_free(&out);
    host_free(&ob);
    host_free(&of);
}

/* ---- add and tanh ----------------------------------------------------------------------------- */

/* alias: 0 apart, 1 out is a, 2 out is b. */
static int add_case(tk_dtype dt, int nd, const int64_t *sh, int64_t pad, int alias)
{
    host_t a, b, out, a0, b0;
    host_new(&a, dt, nd, sh, pad);
    host_new(&b, dt, nd, sh, pad ? pad + 1 : 0);
    host_new(&out, dt, nd, sh, 0);
    host_new(&a0, dt, nd, sh, 0);
    host_new(&b0, dt, nd, sh, 0);
    fill(&a, 4.0);
    fill(&b, 4.0);
    int64_t n = numel(&a.t);
    for (int64_t i = 0; i < n; i++) {
        if (i % 7 == 3) /* exact cancellation and a tie for the rounding */
            set(&b.t, i, -get(&a.t, i));
        set(&a0.t, i, get(&a.t, i));
        set(&b0.t, i, get(&b.t, i));
    }
    tk_tensor *o = alias == 1 ? &a.t : alias == 2 ? &b.t : &out.t;
    int rc = op_run_cpu("add", (tk_arg[]){T("out", o), T("a", &a.t), T("b", &b.t)}, 3), ok = rc == TK_OK;
    if (!ok)
        fprintf(stderr, "  add: rc %d: %s\n", rc, tk_last_error());
    op_cmp c = op_cmp_begin(0, 0, "add %s %s alias %d out", tk_ops__dtype_str(dt), tk_ops__shape_fmt(nd, sh), alias);
    c.nan_fails = 1;
    c.inf_fails = 1;
    for (int64_t i = 0; ok && i < n; i++) {
        double ref = get(&a0.t, i) + get(&b0.t, i);
        op_cmp_tol(&c, i, get(o, i), ref, out_rel(dt) * fabs(ref) + out_abs(dt));
    }
    ok = ok && op_cmp_end(&c);
    host_free(&a);
    host_free(&b);
    host_free(&out);
    host_free(&a0);
    host_free(&b0);
    return ok;
}

static void test_add(void)
{
    const tk_dtype dts[] = {F32, F16, BF16};
    int64_t s1[1] = {1}, s2[2] = {3, 1029}, s3[3] = {2, 3, 5};
    int ok = 1;
    for (size_t d = 0; d < 3; d++)
        for (int alias = 0; alias < 3; alias++) {
            ok &= add_case(dts[d], 1, s1, 0, alias);
            ok &= add_case(dts[d], 2, s2, 0, alias);
            ok &= add_case(dts[d], 3, s3, alias ? 0 : 2, alias);
            ok &= add_case(dts[d], 0, NULL, 0, alias);
        }
    CHECK(ok);
}

/* softcap: cap * tanh(x / cap) against float64, out apart from or aliasing input; a cap that is not
 * finite and > 0 is refused. */
static void test_softcap(void)
{
    const tk_dtype dts[] = {F32, F16, BF16};
    const double caps[] = {3.0, 30.0};
    int64_t sh[2] = {3, 1029};
    int ok = 1;
    for (size_t d = 0; d < 3; d++)
        for (size_t k = 0; k < 2; k++)
            for (int alias = 0; alias < 2; alias++) {
                host_t a, out, a0;
                host_new(&a, dts[d], 2, sh, 0);
                host_new(&out, dts[d], 2, sh, 0);
                host_new(&a0, dts[d], 2, sh, 0);
                fill(&a, 4 * caps[k]);
                int64_t n = numel(&a.t);
                for (int64_t i = 0; i < n; i++)
                    set(&a0.t, i, get(&a.t, i));
                tk_tensor *o = alias ? &a.t : &out.t;
                tk_arg args[] = {T("out", o), T("input", &a.t), {TK_ARG_F64, "cap", NULL, 0, caps[k]}};
                int rc = op_run_cpu("softcap", args, 3);
                ok &= rc == TK_OK;
                op_cmp c = op_cmp_begin(0, 0, "softcap %s cap %g alias %d", tk_ops__dtype_str(dts[d]), caps[k], alias);
                c.nan_fails = 1;
                c.inf_fails = 1;
                for (int64_t i = 0; rc == TK_OK && i < n; i++) {
                    double ref = caps[k] * tanh(get(&a0.t, i) / caps[k]);
                    op_cmp_tol(&c, i, get(o, i), ref,
                               16 * ldexp(1, -24) * fabs(ref) + ldexp(1, -30) + out_rel(dts[d]) * fabs(ref) +
                                   out_abs(dts[d]));
                }
                ok &= rc == TK_OK && op_cmp_end(&c);
                host_free(&a);
                host_free(&out);
                host_free(&a0);
            }
    CHECK(ok);
    host_t x;
    host_new(&x, F32, 2, sh, 0);
    tk_arg bad[] = {T("out", &x.t), T("input", &x.t), {TK_ARG_F64, "cap", NULL, 0, 0.0}};
    CHECK_RC(op_run_cpu("softcap", bad, 3), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "softcap: 'cap' is 0, want a finite value > 0");
    host_free(&x);
}

static void test_add_validation(void)
{
    int64_t s[2] = {4, 8}, s2[2] = {4, 9}, s1[1] = {8};
    host_t a, b, c, f, r;
    host_new(&a, F16, 2, s, 0);
    host_new(&b, F16, 2, s2, 0);
    host_new(&c, F16, 2, s, 0);
    host_new(&f, F32, 2, s, 0);
    host_new(&r, F16, 1, s1, 0);
    CHECK_RC(op_run_cpu("add", (tk_arg[]){T("out", &c.t), T("a", &a.t), T("b", &b.t)}, 3), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(),
                   "add: 'b' has shape [4, 9], want [4, 8] (the shape of 'a'; add does not broadcast)");
    CHECK_RC(op_run_cpu("add", (tk_arg[]){T("out", &c.t), T("a", &a.t), T("b", &r.t)}, 3), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "add: 'b' has shape [8], want [4, 8]");
    CHECK_RC(op_run_cpu("add", (tk_arg[]){T("out", &b.t), T("a", &a.t), T("b", &c.t)}, 3), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "add: 'out' has shape [4, 9], want [4, 8] (the shape of 'a')");
    CHECK_RC(op_run_cpu("add", (tk_arg[]){T("out", &c.t), T("a", &a.t), T("b", &f.t)}, 3), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "add: 'b' has dtype f32, want f16 (the dtype of 'a')");
    /* out shifted one element into a: a partial overlap */
    tk_tensor shifted = a.t;
    shifted.byte_offset = 2;
    int64_t s31[2] = {3, 8};
    shifted.shape = s31;
    tk_tensor a3 = a.t, c3 = c.t;
    a3.shape = s31;
    c3.shape = s31;
    CHECK_RC(op_run_cpu("add", (tk_arg[]){T("out", &shifted), T("a", &a3), T("b", &c3)}, 3), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "add: 'out' partly overlaps 'a' in memory");
    CHECK_RC(op_run_cpu("tanh", (tk_arg[]){T("out", &shifted), T("input", &a3)}, 2), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "tanh: 'out' partly overlaps 'input' in memory");
    CHECK_RC(op_run_cpu("tanh", (tk_arg[]){T("out", &b.t), T("input", &a.t)}, 2), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "tanh: 'out' has shape [4, 9], want [4, 8] (the shape of 'input')");
    host_free(&a);
    host_free(&b);
    host_free(&c);
    host_free(&f);
    host_free(&r);
}

static int tanh_case(tk_dtype dt, int nd, const int64_t *sh, int64_t pad, int inplace, double scale)
{
    host_t x, out, x0;
    host_new(&x, dt, nd, sh, pad);
    host_new(&out, dt, nd, sh, pad ? pad + 2 : 0);
    host_new(&x0, dt, nd, sh, 0);
    fill(&x, scale);
    int64_t n = numel(&x.t);
    for (int64_t i = 0; i < n; i++) {
        if (i % 11 == 5) /* edges: 0, saturation, -0 */
            set(&x.t, i, (double)(i % 3) * 20.0 - 20.0);
        set(&x0.t, i, get(&x.t, i));
    }
    tk_tensor *o = inplace ? &x.t : &out.t;
    int rc = op_run_cpu("tanh", (tk_arg[]){T("out", o), T("input", &x.t)}, 2), ok = rc == TK_OK;
    op_cmp c = op_cmp_begin(0, 0, "tanh %s %s%s out", tk_ops__dtype_str(dt), tk_ops__shape_fmt(nd, sh),
                            inplace ? " in place" : "");
    c.nan_fails = 1;
    c.inf_fails = 1;
    for (int64_t i = 0; ok && i < n; i++) {
        double ref = tanh(get(&x0.t, i));
        op_cmp_tol(&c, i, get(o, i), ref, (8 * ldexp(1, -24) + out_rel(dt)) * fabs(ref) + ldexp(1, -30) + out_abs(dt));
    }
    if (ok && !op_cmp_end(&c)) {
        fprintf(stderr, "    at the worst element x=%.9g\n", get(&x0.t, c.worst));
        ok = 0;
    }
    host_free(&x);
    host_free(&out);
    host_free(&x0);
    return ok;
}

static void test_tanh(void)
{
    const tk_dtype dts[] = {F32, F16, BF16};
    int64_t s1[1] = {1}, s2[2] = {5, 1100}, s3[3] = {2, 1, 37};
    int ok = 1;
    for (size_t d = 0; d < 3; d++)
        for (int inplace = 0; inplace < 2; inplace++) {
            ok &= tanh_case(dts[d], 1, s1, 0, inplace, 1.0);
            ok &= tanh_case(dts[d], 2, s2, inplace ? 0 : 3, inplace, 3.0);
            ok &= tanh_case(dts[d], 3, s3, 0, inplace, 1e-3); /* tiny: tanh x ~ x */
            ok &= tanh_case(dts[d], 0, NULL, 0, inplace, 2.0);
        }
    CHECK(ok);
}

/* ---- the registry ----------------------------------------------------------------------------- */

static void test_registry(void)
{
    const char *sigs[][2] = {
        {"linear", "linear(out: T[..., N], x: T[..., K], weight: T[N, K], bias: T[N]?, transposed: i64 = 0) -> out; "
                   "T in {f32, f16, bf16}"},
        {"embedding", "embedding(out: T[..., D], ids: i32|i64[...], weight: T[V, D]) -> out; T in {f32, f16, bf16}"},
        {"add", "add(out: T[...], a: T[...], b: T[...]) -> out; T in {f32, f16, bf16}"},
        {"tanh", "tanh(out: T[...], input: T[...]) -> out; T in {f32, f16, bf16}"},
    };
    for (size_t i = 0; i < 4; i++) {
        const tk_op_desc *op = tk_ops__find(sigs[i][0]);
        CHECK(op != NULL);
        if (!op)
            continue;
        CHECK_STR(op->family, "layers");
        CHECK(op->cpu != NULL && op->check != NULL);
        tk_buf b = TK_BUF_INIT;
        CHECK_RC(tk_ops__signature(&b, op), TK_OK);
        CHECK_STR(b.data, sigs[i][1]);
        tk__buf_free(&b);
    }
    CHECK(tk_ops__find("linear")->package == NULL); /* a built-in (cuBLASLt) serves it on the GPU */
    CHECK_STR(tk_ops__find("embedding")->package, "kernels-community/layers");
}

int main(void)
{
    op_test_seed();
    RUN(test_registry);
    RUN(test_linear);
    RUN(test_linear_panels);
    RUN(test_linear_threads);
    RUN(test_linear_empty);
    RUN(test_linear_validation);
    RUN(test_linear_torch);
    RUN(test_embedding);
    RUN(test_embedding_validation);
    RUN(test_add);
    RUN(test_add_validation);
    RUN(test_softcap);
    RUN(test_tanh);
    return th_done();
}
