/*
 * test_ops_cpu.c — every fast CPU implementation (ops/cpu_*.c) against its op's CPU reference, as the
 * GPU tests check kernels: the same call run by the reference and by the implementation, on random
 * and edge shapes (one row, odd sizes, sizes that are not multiples of the vector width, strided rows,
 * K blocks, GQA, varlen, paged caches) and on NaN / inf where the op defines them. An implementation
 * whose CPU features this machine lacks is skipped with the feature named. Also: the pick (what
 * tk_op_run runs), fits() refusing what an implementation does not take, and the thread pool (every
 * range once, nested and concurrent calls, the thread limit).
 *
 * Tolerances, |got - ref| <= tol per element (ref: the reference's result as stored):
 *   linear     u_out * |ref| + 2 u_out' + 2 sqrt(K) 2^-24 (sum_k |x_k w_k| + |bias|): both sum in f32,
 *              in different orders, then round once to the output dtype (u_out: 2^-24, 2^-11, 2^-8)
 *   attention  2 u_out |ref| + 4e-6 * max|v| (+ u_out max|v| for 16-bit): f32 against the reference's
 *              double, then one rounding
 *   norms      2 u_out |ref| + 1e-6 |ref| (f32 sum of squares against double)
 *   silu_and_mul  2 u_out |ref| + 4 2^-24 |ref| (the vector exp within 2 ulp of expf)
 *   rotary     exact (the same roundings)
 * NaN in the reference must be NaN here, and an inf the same inf.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "op_test.h"
#include "tensor_util.h"
#include "ops/cpu.h"
#include "ops/ops.h"

static tk_arg T(const char *name, tk_tensor *t) { return (tk_arg){TK_ARG_TENSOR, name, t, 0, 0}; }
static tk_arg I(const char *name, int64_t v) { return (tk_arg){TK_ARG_I64, name, NULL, v, 0}; }
static tk_arg F(const char *name, double v) { return (tk_arg){TK_ARG_F64, name, NULL, 0, v}; }

static double u_out(tk_dtype dt)
{
    return dt.bits == 32 ? ldexp(1, -24) : dt.code == TK_DL_BFLOAT ? ldexp(1, -8) : ldexp(1, -11);
}
static double u_abs(tk_dtype dt) { return dt.code == TK_DL_FLOAT && dt.bits == 16 ? ldexp(1, -24) : 0; }

/* The implementations of op, in table order. */
static size_t impls_of(const char *op, const tk_cpu_impl **out, size_t cap)
{
    size_t n = 0;
    for (size_t i = 0; i < tk_ops__cpu_impl_count() && n < cap; i++)
        if (!strcmp(tk_ops__cpu_impl_at(i)->op, op))
            out[n++] = tk_ops__cpu_impl_at(i);
    return n;
}

/* Why this machine cannot run im, or NULL. */
static const char *missing(const tk_cpu_impl *im)
{
    static char buf[128];
    unsigned lack = im->needs & ~tk_ops__cpu_features();
    if (!lack)
        return NULL;
    size_t len = (size_t)snprintf(buf, sizeof buf, "this CPU lacks");
    for (unsigned b = 1; b && len < sizeof buf; b <<= 1)
        if (lack & b)
            len += (size_t)snprintf(buf + len, sizeof buf - len, " %s", tk_ops__cpu_feature_str(b));
    return buf;
}

static int skipped_impls;
/* An implementation that may refuse the call run_all makes (its fits() narrower by design: the
 * integer-dot casted_linear takes decode's M <= 4 only); NULL: every implementation must take it. */
static const char *refusal_ok;

/* Copies a host tensor's buffer (same layout). */
static void host_copy(host_t *dst, const host_t *src, size_t bytes)
{
    *dst = *src;
    dst->t.shape = dst->shape;
    dst->t.strides = src->t.strides ? dst->strides : NULL;
    dst->buf = malloc(bytes);
    memcpy(dst->buf, src->buf, bytes);
    dst->t.data = dst->buf;
}

static size_t host_bytes(const host_t *h)
{
    int64_t rows = 1, rowlen = h->t.ndim ? h->shape[h->t.ndim - 1] : 1;
    for (int i = 0; i + 1 < h->t.ndim; i++)
        rows *= h->shape[i];
    if (h->t.strides && h->t.ndim > 0)
        rowlen = h->t.ndim > 1 ? h->strides[h->t.ndim - 2] : rowlen;
    return (size_t)(rows * rowlen) * h->t.dtype.bits / 8 + 16;
}

/* Runs args through the reference and then through every implementation of op (each on fresh copies
 * of the outputs `outs`, listed by arg index), calling cmp(ref outputs, got outputs) for each. */
typedef int (*cmp_fn)(void *ctx, host_t *const *ref, host_t *const *got, const char *impl);

static int run_all(const char *op, tk_arg *args, size_t nargs, host_t **outs, const int *out_arg, int nout, cmp_fn cmp,
                   void *ctx)
{
    int ok = 1;
    host_t *orig[4], *ref[4], *got[4];
    for (int o = 0; o < nout; o++) { /* keep the inputs of in-place outputs */
        orig[o] = malloc(sizeof(host_t));
        host_copy(orig[o], outs[o], host_bytes(outs[o]));
    }
    tk_op_call c;
    if (tk_ops__prepare(&c, op, args, nargs) != TK_OK) {
        fprintf(stderr, "  %s: prepare failed: %s\n", op, tk_last_error());
        return 0;
    }
    if (tk_ops__run_cpu(&c) != TK_OK) {
        fprintf(stderr, "  %s: reference failed: %s\n", op, tk_last_error());
        return 0;
    }
    for (int o = 0; o < nout; o++) {
        ref[o] = malloc(sizeof(host_t));
        host_copy(ref[o], outs[o], host_bytes(outs[o]));
    }
    const tk_cpu_impl *ims[8];
    size_t n = impls_of(op, ims, 8);
    for (size_t i = 0; i < n; i++) {
        if (missing(ims[i])) {
            skipped_impls++;
            continue;
        }
        for (int o = 0; o < nout; o++) { /* the outputs as they were before the reference ran */
            memcpy(outs[o]->buf, orig[o]->buf, host_bytes(outs[o]));
            got[o] = outs[o];
        }
        for (int o = 0; o < nout; o++)
            args[out_arg[o]].t = &outs[o]->t;
        if (tk_ops__prepare(&c, op, args, nargs) == TK_OK && refusal_ok && !strcmp(ims[i]->impl, refusal_ok) &&
            !ims[i]->fits(&c))
            continue;
        if (tk_ops__prepare(&c, op, args, nargs) != TK_OK || !ims[i]->fits(&c)) {
            fprintf(stderr, "  %s %s: does not take this call\n", op, ims[i]->impl);
            ok = 0;
            continue;
        }
        if (ims[i]->run(&c) != TK_OK) {
            fprintf(stderr, "  %s %s failed: %s\n", op, ims[i]->impl, tk_last_error());
            ok = 0;
            continue;
        }
        ok &= cmp(ctx, ref, got, ims[i]->impl);
    }
    for (int o = 0; o < nout; o++) {
        free(orig[o]->buf);
        free(orig[o]);
        free(ref[o]->buf);
        free(ref[o]);
    }
    return ok;
}

/* ---- linear and casted_linear ----------------------------------------------------------------- */

typedef struct {
    const host_t *x, *w, *b, *scale;
    int tr;
    int64_t m, n, k;
} lin_ctx;

static int lin_cmp(void *p, host_t *const *ref, host_t *const *got, const char *impl)
{
    const lin_ctx *L = p;
    tk_dtype dt = got[0]->t.dtype;
    op_cmp c = op_cmp_begin(0, 0, "%s %s %s x[%lld, %lld] w %s%s%s", impl, tk_ops__dtype_str(dt),
                            L->scale ? "casted_linear" : "linear", (long long)L->m, (long long)L->k,
                            tk_ops__dtype_str(L->w->t.dtype), L->tr ? " transposed" : "", L->b ? " bias" : "");
    c.cols = L->n;
    for (int64_t i = 0; i < L->m; i++)
        for (int64_t j = 0; j < L->n; j++) {
            double s = 0;
            for (int64_t e = 0; e < L->k; e++) {
                double wv = L->tr                     ? get(&L->w->t, e * L->n + j)
                            : L->w->t.dtype.bits == 8 ? (double)((const int8_t *)L->w->buf)[j * L->k + e]
                                                      : get(&L->w->t, j * L->k + e);
                s += fabs(get(&L->x->t, i * L->k + e) * wv);
            }
            if (L->scale)
                s *= fabs(((const float *)L->scale->buf)[j]);
            if (L->b)
                s += fabs(get(&L->b->t, j));
            double r = get(&ref[0]->t, i * L->n + j), g = get(&got[0]->t, i * L->n + j);
            double tol = u_out(dt) * fabs(r) + 2 * u_abs(dt) +
                         2 * sqrt((double)L->k + 1) * ldexp(1, -24) * s * (1 + u_out(dt) * 4);
            if (dt.bits == 16)
                tol += u_out(dt) * fabs(r); /* both round an f32 sum that may differ in the last bits */
            if (strstr(impl, "-q8")) { /* x rounded to d_b x_q per block of 32: |x - d_b x_q| <= d_b / 2 */
                double q = 0;
                for (int64_t b0 = 0; b0 < L->k; b0 += 32) {
                    double amax = 0, sw = 0;
                    for (int64_t e = b0; e < L->k && e < b0 + 32; e++) {
                        amax = fmax(amax, fabs(get(&L->x->t, i * L->k + e)));
                        sw += fabs((double)((const int8_t *)L->w->buf)[j * L->k + e]);
                    }
                    q += amax / 127 / 2 * sw;
                }
                tol += q * fabs(((const float *)L->scale->buf)[j]) * (1 + 1e-5) * (1 + u_out(dt));
            }
            op_cmp_tol(&c, i * L->n + j, g, r, tol);
        }
    return op_cmp_end(&c);
}

static int lin_case(tk_dtype dt, int64_t m, int64_t k, int64_t n, int bias, int tr, int64_t xpad, int special)
{
    host_t x, w, b, out;
    int64_t xs[2] = {m, k}, ws[2] = {tr ? k : n, tr ? n : k}, bs[1] = {n}, os[2] = {m, n};
    host_new(&x, dt, 2, xs, xpad);
    host_new(&w, dt, 2, ws, 0);
    host_new(&b, dt, 1, bs, 0);
    host_new(&out, dt, 2, os, 0);
    fill_range(&x, -2, 2);
    fill_range(&w, -1, 1);
    fill_range(&b, -1, 1);
    if (special && m * k >= 3) { /* NaN and inf in x: their rows are NaN / inf or NaN in both */
        set(&x.t, 0, NAN);
        set(&x.t, m * k - 1, INFINITY);
    }
    tk_arg a[5] = {T("out", &out.t), T("x", &x.t), T("weight", &w.t), I("transposed", tr), T("bias", &b.t)};
    host_t *outs[1] = {&out};
    int oa[1] = {0};
    lin_ctx L = {&x, &w, bias ? &b : NULL, NULL, tr, m, n, k};
    int ok = run_all("linear", a, bias ? 5 : 4, outs, oa, 1, lin_cmp, &L);
    free(x.buf);
    free(w.buf);
    free(b.buf);
    free(out.buf);
    return ok;
}

static void test_linear(void)
{
    static const int64_t shapes[][3] = {
        {1, 1, 1},      {1, 7, 5},      {1, 64, 33},    {2, 17, 9},     {3, 100, 37},  {4, 33, 70},
        {5, 33, 17},    {7, 300, 50},   {13, 257, 129}, {64, 600, 96},  {1, 0, 5},     {6, 1, 16},
        {150, 40, 20},  {8, 576, 200},  {6, 100, 333},  {7, 70, 40},    {5, 300, 200}, {11, 129, 131},
        {17, 577, 100}, {22, 576, 193}, {31, 1000, 70}, {32, 64, 7},    {33, 40, 20},  {12, 8, 3},
        {9, 7, 4},      {6, 15, 1},     {32, 300, 250}, {26, 1536, 50}, {40, 257, 70}, {45, 31, 33},
        {300, 513, 97}, {70, 64, 1000}, {9, 1100, 13},  {1, 45, 20},    {1, 576, 70},  {1, 1000, 9}};
    /* M 1 with 16-bit weights: four chains of 32 columns, then 8, then the rest (K 45 takes all three).
     * cpu-avx2: M 5..32 runs the in-place 4x3 tiles (M and N past and below multiples of 4 and 3, K of
     * 8; threaded in ranges of 64 KiB of weight rows, whose ends fall inside a tile of 3 rows), M 33 and
     * up the in-place-weight GEMM (16-bit weights widened a depth block at a time); f32 weights past
     * M = 8 too (x in panels of 16 rows, a last panel
     * of up to 8 rows by the half tile: M 9, 17, 22, 40, 45; 6-row weight groups cut short: N 13, 20,
     * 97; depth blocks of equal odd length: K 577, 1000, 1100; row blocks: M 300; tasks of at most 22
     * groups: N 1000). cpu-portable: M 5..6 the GEMV in groups of 4 rows (threaded when N * K passes 64
     * KiB), M 7 and up the GEMM. Transposed weights: the GEMM past M = 4. cpu-avx512bf16 (bf16 x and
     * weight, M 5 and up: 4x4 in-place tiles to M 32, the packed GEMM above; not transposed; it refuses
     * the rest): odd K (a pair padded with 0, also in a
     * second depth block of one element: K 257, 513), N past multiples of 16 and 32, M past multiples of
     * 12 and over two row blocks (300). */
    refusal_ok = "cpu-avx512bf16";
    for (size_t d = 0; d < 3; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int tr = 0; tr < 2; tr++) {
                const int64_t *sh = shapes[s];
                CHECK(lin_case(*all_dtypes[d], sh[0], sh[1], sh[2], (int)(s % 2), tr, s % 3 == 0 ? 3 : 0, 0));
            }
    for (size_t d = 0; d < 3; d++) {
        CHECK(lin_case(*all_dtypes[d], 1, 40, 9, 1, 0, 0, 1));
        CHECK(lin_case(*all_dtypes[d], 9, 40, 9, 0, 0, 0, 1));
        CHECK(lin_case(*all_dtypes[d], 5, 41, 7, 1, 0, 0, 1));
        CHECK(lin_case(*all_dtypes[d], 32, 100, 10, 0, 0, 0, 1));
        CHECK(lin_case(*all_dtypes[d], 40, 100, 10, 1, 0, 0, 1));
    }
    refusal_ok = NULL;
}

/* special: NaN and inf in x (their rows are NaN / inf in both: the integer-dot path runs them in f32) */
static int casted_case(tk_dtype dt, int64_t m, int64_t k, int64_t n, int bias, int special)
{
    host_t x, w, sc, b, out;
    int64_t xs[2] = {m, k}, ws[2] = {n, k}, ns[1] = {n}, os[2] = {m, n};
    host_new(&x, dt, 2, xs, 0);
    host_new(&w, I8, 2, ws, 0);
    host_new(&sc, F32, 1, ns, 0);
    host_new(&b, dt, 1, ns, 0);
    host_new(&out, dt, 2, os, 0);
    fill_range(&x, -2, 2);
    fill_range(&b, -1, 1);
    for (int64_t i = 0; i < n * k; i++)
        ((int8_t *)w.buf)[i] = (int8_t)(i % 7 == 0    ? -127
                                        : i % 11 == 0 ? 127
                                        : i % 13 == 0 ? -128
                                                      : (int)uniform(-127, 127));
    for (int64_t i = 0; i < n; i++)
        ((float *)sc.buf)[i] = (float)uniform(0.001, 0.02);
    if (k >= 40) /* a block of x much smaller than the rest, and one all zero: their own steps */
        for (int64_t e = 0; e < 32 && 32 + e < k; e++)
            set(&x.t, 32 + e, e < 16 ? 0.0 : get(&x.t, 32 + e) * 1e-3);
    if (special && m * k >= 3) {
        set(&x.t, 0, NAN);
        set(&x.t, m * k - 1, INFINITY);
    }
    tk_arg a[5] = {T("out", &out.t), T("x", &x.t), T("weight", &w.t), T("scale", &sc.t), T("bias", &b.t)};
    host_t *outs[1] = {&out};
    int oa[1] = {0};
    lin_ctx L = {&x, &w, bias ? &b : NULL, &sc, 0, m, n, k};
    refusal_ok = m > 4 || k == 0 ? "cpu-avx2-q8" : NULL;
    int ok = run_all("casted_linear", a, bias ? 5 : 4, outs, oa, 1, lin_cmp, &L);
    refusal_ok = NULL;
    free(x.buf);
    free(w.buf);
    free(sc.buf);
    free(b.buf);
    free(out.buf);
    return ok;
}

static void test_casted_linear(void)
{
    /* M 1..4 is decode (the integer-dot GEMV as well; M 1: four chains of 32 columns, then 8, then the
     * rest: K 45 takes all three); K below, at and past blocks of 32; N * K past
     * 64 KiB runs threaded; M 33 and up the in-place-weight GEMM (each depth block's rows widened to f32
     * first: K 1100 in two blocks of 550, N 61 ending in a short group, M 150 in two row blocks) */
    static const int64_t shapes[][3] = {{1, 1, 1},      {1, 70, 33},    {3, 19, 40},   {4, 256, 8},     {5, 33, 17},
                                        {40, 300, 70},  {1, 32, 5},     {2, 64, 300},  {4, 1000, 70},   {1, 576, 200},
                                        {3, 95, 129},   {1, 0, 4},      {6, 576, 200}, {8, 33, 9},      {13, 300, 131},
                                        {32, 577, 100}, {29, 1000, 70}, {33, 64, 10},  {150, 1100, 61}, {1, 45, 20},
                                        {1, 1000, 70},  {1, 8, 3}};
    for (size_t d = 0; d < 3; d++) {
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            CHECK(casted_case(*all_dtypes[d], shapes[s][0], shapes[s][1], shapes[s][2], (int)(s % 2), 0));
        CHECK(casted_case(*all_dtypes[d], 2, 70, 9, 1, 1));
    }
}

/* ---- attention (prefill, varlen) and attention_decode ------------------------------------------ */

typedef struct {
    const char *what;
    double vmax;
    int64_t d;
} att_ctx;

static int att_cmp(void *p, host_t *const *ref, host_t *const *got, const char *impl)
{
    const att_ctx *A = p;
    tk_dtype dt = got[0]->t.dtype;
    op_cmp c = op_cmp_begin(0, 0, "%s %s %s", impl, tk_ops__dtype_str(dt), A->what);
    c.cols = A->d;
    int64_t n = numel(&ref[0]->t);
    for (int64_t i = 0; i < n; i++) {
        double r = get(&ref[0]->t, i), g = get(&got[0]->t, i);
        op_cmp_tol(&c, i, g, r, 2 * u_out(dt) * fabs(r) + 4e-6 * A->vmax + (dt.bits == 16 ? u_out(dt) * A->vmax : 0));
    }
    int ok = op_cmp_end(&c);
    if (ref[1]) { /* lse, f32 */
        op_cmp l = op_cmp_begin(2e-5, 2e-5, "%s %s %s lse", impl, tk_ops__dtype_str(dt), A->what);
        for (int64_t i = 0, nl = numel(&ref[1]->t); i < nl; i++)
            op_cmp_at(&l, i, get(&got[1]->t, i), get(&ref[1]->t, i));
        ok &= op_cmp_end(&l);
    }
    return ok;
}

static int att_cmp_out(void *p, host_t *const *ref, host_t *const *got, const char *impl)
{
    host_t *r2[2] = {ref[0], NULL}, *g2[2] = {got[0], NULL};
    return att_cmp(p, r2, g2, impl);
}

/* varlen prefill: sequences of the given lengths packed in one [1, total, H, D] batch. */
static int prefill_case(tk_dtype dt, const int *lens, int nseq, int64_t hq, int64_t hkv, int64_t d, int causal,
                        int64_t wl, int special, double cap)
{
    int64_t total = 0;
    for (int s = 0; s < nseq; s++)
        total += lens[s];
    host_t q, k, v, out, lse, cu;
    int64_t qs[4] = {1, total, hq, d}, ks[4] = {1, total, hkv, d}, ls[3] = {1, hq, total}, cs[1] = {nseq + 1};
    host_new(&q, dt, 4, qs, 0);
    host_new(&k, dt, 4, ks, 0);
    host_new(&v, dt, 4, ks, 0);
    host_new(&out, dt, 4, qs, 0);
    host_new(&lse, F32, 3, ls, 0);
    host_new(&cu, I32, 1, cs, 0);
    fill_range(&q, -2, 2);
    fill_range(&k, -2, 2);
    fill_range(&v, -3, 3);
    int32_t *cuv = cu.buf;
    cuv[0] = 0;
    for (int s = 0; s < nseq; s++)
        cuv[s + 1] = cuv[s] + lens[s];
    if (special && total > 2) /* a NaN key: every query that sees key 1 of sequence 0 is NaN */
        set(&k.t, 1 * hkv * d, NAN);
    int maxq = 0;
    for (int s = 0; s < nseq; s++)
        maxq = lens[s] > maxq ? lens[s] : maxq;
    tk_arg a[] = {T("out", &out.t),
                  T("q", &q.t),
                  T("k", &k.t),
                  T("v", &v.t),
                  T("lse", &lse.t),
                  T("cu_seqlens_q", &cu.t),
                  T("cu_seqlens_k", &cu.t),
                  I("max_seqlen_q", maxq),
                  I("causal", causal),
                  I("window_left", wl),
                  F("softcap", cap)};
    char what[160];
    snprintf(what, sizeof what, "attention lens %d.. (%d seqs) Hq %lld Hkv %lld D %lld causal %d wl %lld softcap %g",
             lens[0], nseq, (long long)hq, (long long)hkv, (long long)d, causal, (long long)wl, cap);
    att_ctx A = {what, 3, d};
    host_t *outs[2] = {&out, &lse};
    int oa[2] = {0, 4};
    int ok = run_all("attention", a, sizeof a / sizeof a[0], outs, oa, 2, att_cmp, &A);
    free(q.buf);
    free(k.buf);
    free(v.buf);
    free(out.buf);
    free(lse.buf);
    free(cu.buf);
    return ok;
}

static void test_attention(void)
{
    static const int lens_a[] = {1, 17, 70}, lens_b[] = {130}, lens_c[] = {5, 0, 9};
    for (size_t t = 0; t < 3; t++) {
        tk_dtype dt = *all_dtypes[t];
        CHECK(prefill_case(dt, lens_a, 3, 6, 2, 64, 1, -1, 0, 0));
        CHECK(prefill_case(dt, lens_a, 3, 6, 2, 64, 0, -1, 0, 0));
        CHECK(prefill_case(dt, lens_b, 1, 4, 4, 20, 1, 31, 0, 0));
        CHECK(prefill_case(dt, lens_c, 3, 3, 1, 8, 1, -1, 0, 0));
        CHECK(prefill_case(dt, lens_a, 3, 2, 1, 13, 1, 5, 1, 0));
        /* softcap (Gemma 2): a cap that bends most scores (2, the tiny test model's), Gemma 2's 50, and
         * with a window, a NaN key and an odd head dim */
        CHECK(prefill_case(dt, lens_a, 3, 6, 2, 64, 1, -1, 0, 2.0));
        CHECK(prefill_case(dt, lens_a, 3, 6, 2, 64, 1, -1, 0, 50.0));
        CHECK(prefill_case(dt, lens_b, 1, 4, 4, 16, 1, 31, 0, 0.3));
        CHECK(prefill_case(dt, lens_a, 3, 2, 1, 13, 1, 5, 1, 2.0));
    }
    /* dense (no cu_seqlens), B = 2, Sq < Sk: bottom-right aligned causal */
    for (size_t t = 0; t < 3; t++) {
        tk_dtype dt = *all_dtypes[t];
        host_t q, k, v, out;
        int64_t qs[4] = {2, 5, 4, 32}, ks[4] = {2, 77, 2, 32};
        host_new(&q, dt, 4, qs, 0);
        host_new(&k, dt, 4, ks, 0);
        host_new(&v, dt, 4, ks, 0);
        host_new(&out, dt, 4, qs, 0);
        fill_range(&q, -2, 2);
        fill_range(&k, -2, 2);
        fill_range(&v, -3, 3);
        tk_arg a[] = {T("out", &out.t), T("q", &q.t), T("k", &k.t), T("v", &v.t), I("causal", 1)};
        att_ctx A = {"attention dense B 2 Sq 5 Sk 77", 3, 32};
        host_t *outs[1] = {&out};
        int oa[1] = {0};
        CHECK(run_all("attention", a, sizeof a / sizeof a[0], outs, oa, 1, att_cmp_out, &A));
        free(q.buf);
        free(k.buf);
        free(v.buf);
        free(out.buf);
    }
}

/* cdt: the caches' dtype (dt, or f16 / bf16 under f32 queries); special: a NaN key (key 1 of sequence 0,
 * every query head of its KV head 0 sees it: those rows are NaN in both). */
static int decode_case(tk_dtype dt, tk_dtype cdt, int64_t b, int64_t sq, const int *lens, int64_t hq, int64_t hkv,
                       int64_t d, int64_t bs, int64_t wl, int special, double cap)
{
    int64_t maxb = 0;
    for (int64_t s = 0; s < b; s++)
        maxb = (lens[s] + bs - 1) / bs > maxb ? (lens[s] + bs - 1) / bs : maxb;
    int64_t nblocks = b * maxb + 3;
    host_t q, out, kc, vc, bt, sl, lse;
    int64_t qs[4] = {b, sq, hq, d}, cs[4] = {nblocks, bs, hkv, d}, bts[2] = {b, maxb}, sls[1] = {b},
            ls[3] = {b, hq, sq};
    host_new(&q, dt, 4, qs, 0);
    host_new(&out, dt, 4, qs, 0);
    host_new(&kc, cdt, 4, cs, 0);
    host_new(&vc, cdt, 4, cs, 0);
    host_new(&bt, I32, 2, bts, 0);
    host_new(&sl, I32, 1, sls, 0);
    host_new(&lse, F32, 3, ls, 0);
    fill_range(&q, -2, 2);
    fill_range(&kc, -2, 2);
    fill_range(&vc, -3, 3);
    int32_t *tab = bt.buf, *slv = sl.buf;
    for (int64_t i = 0; i < b * maxb; i++) /* blocks scattered: sequence s, logical block l -> a permutation */
        tab[i] = (int32_t)((i * 7 + 3) % (b * maxb));
    for (int64_t s = 0; s < b; s++)
        slv[s] = lens[s];
    if (special && lens[0] > 1) /* key 1 of sequence 0, KV head 0 */
        set(&kc.t, ((int64_t)tab[0] * bs + 1) * hkv * d, NAN);
    tk_arg a[] = {T("out", &out.t),        T("q", &q.t),         T("k_cache", &kc.t), T("v_cache", &vc.t),
                  T("block_table", &bt.t), T("seq_lens", &sl.t), T("lse", &lse.t),    I("window_left", wl),
                  F("softcap", cap)};
    char what[160];
    snprintf(what, sizeof what,
             "attention_decode cache %s B %lld Sq %lld lens %d.. Hq %lld Hkv %lld D %lld bs %lld wl %lld softcap %g%s",
             tk_ops__dtype_str(cdt), (long long)b, (long long)sq, lens[0], (long long)hq, (long long)hkv, (long long)d,
             (long long)bs, (long long)wl, cap, special ? " NaN key" : "");
    att_ctx A = {what, 3, d};
    host_t *outs[2] = {&out, &lse};
    int oa[2] = {0, 6};
    int ok = run_all("attention_decode", a, sizeof a / sizeof a[0], outs, oa, 2, att_cmp, &A);
    free(q.buf);
    free(out.buf);
    free(kc.buf);
    free(vc.buf);
    free(bt.buf);
    free(sl.buf);
    free(lse.buf);
    return ok;
}

static void test_attention_decode(void)
{
    static const int l1[] = {5, 40}, l2[] = {200}, l3[] = {16, 3, 70}, l4[] = {1, 129}, l5[] = {1000};
    for (size_t t = 0; t < 3; t++) {
        tk_dtype dt = *all_dtypes[t];
        CHECK(decode_case(dt, dt, 2, 1, l1, 9, 3, 64, 16, -1, 0, 0));
        CHECK(decode_case(dt, dt, 1, 1, l2, 4, 1, 64, 8, -1, 0, 0));
        CHECK(decode_case(dt, dt, 1, 4, l2, 4, 2, 20, 32, 50, 0, 0));
        CHECK(decode_case(dt, dt, 3, 3, l3, 6, 6, 12, 16, -1, 0, 0));
        /* head dims the in-place path takes (multiples of 8, with and without a 16-wide tail), windows
         * that cut chunks, 16 queries, a NaN key */
        CHECK(decode_case(dt, dt, 2, 1, l4, 8, 2, 8, 8, -1, 0, 0));
        CHECK(decode_case(dt, dt, 1, 16, l2, 6, 3, 24, 16, 70, 0, 0));
        CHECK(decode_case(dt, dt, 2, 2, l4, 4, 1, 128, 32, 5, 0, 0));
        CHECK(decode_case(dt, dt, 1, 4, l2, 4, 2, 96, 16, -1, 0, 0)); /* V summed 64 columns, then 32 */
        CHECK(decode_case(dt, dt, 2, 1, l1, 9, 3, 64, 16, -1, 1, 0));
        /* softcap: in place (D % 8 == 0) and staged, with a window and a NaN key */
        CHECK(decode_case(dt, dt, 2, 1, l1, 9, 3, 64, 16, -1, 0, 2.0));
        CHECK(decode_case(dt, dt, 1, 4, l2, 4, 2, 20, 32, 50, 0, 50.0));
        CHECK(decode_case(dt, dt, 2, 1, l1, 9, 3, 64, 16, 3, 1, 0.3));
        /* keys split into segments (fewer than 8 sequence-KV-head pairs, 128 keys or more): SmolLM2's
         * heads, a NaN key, a window that leaves whole segments out, a sequence shorter than a segment,
         * 16 queries, a softcap */
        CHECK(decode_case(dt, dt, 1, 1, l2, 9, 3, 64, 16, -1, 0, 0));
        CHECK(decode_case(dt, dt, 1, 1, l2, 9, 3, 64, 16, -1, 1, 0));
        CHECK(decode_case(dt, dt, 1, 1, l2, 9, 3, 64, 16, 40, 0, 0));
        CHECK(decode_case(dt, dt, 2, 1, l4, 8, 2, 64, 16, -1, 1, 0));
        CHECK(decode_case(dt, dt, 1, 16, l2, 6, 3, 64, 16, 70, 0, 2.0));
        CHECK(decode_case(dt, dt, 1, 1, l5, 4, 1, 32, 16, -1, 0, 0));
    }
    /* 16-bit caches under f32 queries (--kv-dtype f16 of an f32 model): in place and staged */
    for (size_t t = 1; t < 3; t++) {
        CHECK(decode_case(F32, *all_dtypes[t], 2, 1, l1, 9, 3, 64, 16, -1, 0, 0));
        CHECK(decode_case(F32, *all_dtypes[t], 1, 4, l2, 4, 2, 20, 32, 50, 0, 0));
        CHECK(decode_case(F32, *all_dtypes[t], 2, 1, l1, 9, 3, 64, 16, -1, 1, 0));
    }
}

/* ---- rms_norm, fused_add_rms_norm ------------------------------------------------------------- */

typedef struct {
    const char *what;
    int64_t d;
    double rtol;
} ew_ctx;

static int ew_cmp(void *p, host_t *const *ref, host_t *const *got, const char *impl)
{
    const ew_ctx *E = p;
    int ok = 1;
    for (int o = 0; o < 2 && ref[o]; o++) {
        tk_dtype dt = got[o]->t.dtype;
        op_cmp c = op_cmp_begin(0, 0, "%s %s %s out %d", impl, tk_ops__dtype_str(dt), E->what, o);
        c.cols = E->d;
        for (int64_t i = 0, n = numel(&ref[o]->t); i < n; i++) {
            double r = get(&ref[o]->t, i);
            op_cmp_tol(&c, i, get(&got[o]->t, i), r, 2 * u_out(dt) * fabs(r) + E->rtol * fabs(r) + 2 * u_abs(dt));
        }
        ok &= op_cmp_end(&c);
    }
    return ok;
}

static int ew_cmp1(void *p, host_t *const *ref, host_t *const *got, const char *impl)
{
    host_t *r2[2] = {ref[0], NULL}, *g2[2] = {got[0], NULL};
    return ew_cmp(p, r2, g2, impl);
}

/* w32: an f32 weight (Gemma's (1 + w) norms over 16-bit x) */
static int norm_case(tk_dtype dt, int64_t rows, int64_t d, int fused, int64_t pad, int special, int w32)
{
    host_t x, r, w, out;
    int64_t s2[2] = {rows, d}, s1[1] = {d};
    host_new(&x, dt, 2, s2, pad);
    host_new(&r, dt, 2, s2, 0);
    host_new(&w, w32 ? F32 : dt, 1, s1, 0);
    host_new(&out, dt, 2, s2, 0);
    fill_range(&x, -3, 3);
    fill_range(&r, -3, 3);
    fill_range(&w, -1.5, 1.5);
    if (special && rows > 1) {
        set(&x.t, 0, NAN);         /* row 0 NaN */
        set(&x.t, d, INFINITY);    /* row 1: inf / inf = NaN in both */
    }
    char what[96];
    snprintf(what, sizeof what, "%s [%lld, %lld]%s%s", fused ? "fused_add_rms_norm" : "rms_norm", (long long)rows,
             (long long)d, pad ? " strided" : "", w32 ? " f32 weight" : "");
    ew_ctx E = {what, d, 2e-6};
    int ok;
    if (fused) {
        tk_arg a[] = {T("input", &x.t), T("residual", &r.t), T("weight", &w.t), F("eps", 1e-5)};
        host_t *outs[2] = {&x, &r};
        int oa[2] = {0, 1};
        ok = run_all("fused_add_rms_norm", a, 4, outs, oa, 2, ew_cmp, &E);
    } else {
        tk_arg a[] = {T("out", &out.t), T("input", &x.t), T("weight", &w.t), F("eps", 1e-6)};
        host_t *outs[1] = {&out};
        int oa[1] = {0};
        ok = run_all("rms_norm", a, 4, outs, oa, 1, ew_cmp1, &E);
    }
    free(x.buf);
    free(r.buf);
    free(w.buf);
    free(out.buf);
    return ok;
}

static void test_norms(void)
{
    static const int64_t shapes[][2] = {{1, 576}, {5, 13}, {3, 1}, {2, 8}, {40, 1000}, {7, 17}};
    for (size_t t = 0; t < 3; t++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int fused = 0; fused < 2; fused++) {
                CHECK(norm_case(*all_dtypes[t], shapes[s][0], shapes[s][1], fused, s == 1 ? 4 : 0, 0, 0));
                CHECK(norm_case(*all_dtypes[t], shapes[s][0], shapes[s][1], fused, 0, 1, 0));
                if (all_dtypes[t]->bits == 16)
                    CHECK(norm_case(*all_dtypes[t], shapes[s][0], shapes[s][1], fused, s == 1 ? 4 : 0, 0, 1));
            }
}

/* ---- silu_and_mul ----------------------------------------------------------------------------- */

static int act_case(tk_dtype dt, int64_t rows, int64_t d, int64_t pad, int special)
{
    host_t in, out;
    int64_t is[2] = {rows, 2 * d}, os[2] = {rows, d};
    host_new(&in, dt, 2, is, pad);
    host_new(&out, dt, 2, os, 0);
    fill_range(&in, -12, 12);
    if (special) {
        static const double vals[] = {NAN, INFINITY, -INFINITY, 100, -100, 88.5, -88.5, -87.2, 0, -0.0, 1e-30};
        for (size_t i = 0; i < sizeof vals / sizeof vals[0] && (int64_t)i < rows * d; i++)
            set(&in.t, (int64_t)((i / (size_t)d) * 2 * d + i % (size_t)d), vals[i]);
    }
    char what[96];
    snprintf(what, sizeof what, "silu_and_mul [%lld, %lld]%s%s", (long long)rows, (long long)(2 * d),
             pad ? " strided" : "", special ? " nan/inf" : "");
    ew_ctx E = {what, d, 4 * ldexp(1, -24)};
    tk_arg a[] = {T("out", &out.t), T("input", &in.t)};
    host_t *outs[1] = {&out};
    int oa[1] = {0};
    int ok = run_all("silu_and_mul", a, 2, outs, oa, 1, ew_cmp1, &E);
    free(in.buf);
    free(out.buf);
    return ok;
}

static void test_silu_and_mul(void)
{
    static const int64_t shapes[][2] = {{1, 13}, {4, 576}, {3, 1}, {2, 8}, {9, 1536}, {1, 20}};
    for (size_t t = 0; t < 3; t++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            CHECK(act_case(*all_dtypes[t], shapes[s][0], shapes[s][1], s == 2 ? 5 : 0, 0));
            CHECK(act_case(*all_dtypes[t], shapes[s][0], shapes[s][1], 0, 1));
        }
}

/* ---- gelu_tanh_and_mul (GeGLU) ----------------------------------------------------------------- */

/* The reference computes 0.5 x (1 + tanhf(u)): for negative u, 1 + tanhf(u) keeps only an absolute
 * accuracy of about one ulp of 1, so both sides are held to 2 u_out |ref| + 4 2^-24 |ref| + 2^-22 |x y|. */
typedef struct {
    const char *what;
    int64_t d;
    const host_t *in;
} gelu_ctx;

static int gelu_cmp(void *p, host_t *const *ref, host_t *const *got, const char *impl)
{
    const gelu_ctx *G = p;
    tk_dtype dt = got[0]->t.dtype;
    op_cmp c = op_cmp_begin(0, 0, "%s %s %s", impl, tk_ops__dtype_str(dt), G->what);
    c.cols = G->d;
    for (int64_t i = 0, n = numel(&ref[0]->t); i < n; i++) {
        int64_t row = i / G->d, e = i % G->d;
        double x = get(&G->in->t, row * 2 * G->d + e), y = get(&G->in->t, row * 2 * G->d + G->d + e);
        double r = get(&ref[0]->t, i), xy = fabs(x * y);
        op_cmp_tol(&c, i, get(&got[0]->t, i), r,
                   2 * u_out(dt) * fabs(r) + 4 * ldexp(1, -24) * fabs(r) + ldexp(1, -22) * (isfinite(xy) ? xy : 0) +
                       2 * u_abs(dt));
    }
    return op_cmp_end(&c);
}

static int gelu_case(tk_dtype dt, int64_t rows, int64_t d, int special)
{
    host_t in, out;
    int64_t is[2] = {rows, 2 * d}, os[2] = {rows, d};
    host_new(&in, dt, 2, is, 0);
    host_new(&out, dt, 2, os, 0);
    fill_range(&in, -8, 8);
    if (special) {
        static const double vals[] = {NAN, INFINITY, -INFINITY, 100, -100, 1e13, -1e13, -5, 0, -0.0, 1e-30};
        for (size_t i = 0; i < sizeof vals / sizeof vals[0] && (int64_t)i < rows * d; i++)
            set(&in.t, (int64_t)((i / (size_t)d) * 2 * d + i % (size_t)d), vals[i]);
    }
    char what[96];
    snprintf(what, sizeof what, "gelu_tanh_and_mul [%lld, %lld]%s", (long long)rows, (long long)(2 * d),
             special ? " nan/inf" : "");
    gelu_ctx G = {what, d, &in};
    tk_arg a[] = {T("out", &out.t), T("input", &in.t)};
    host_t *outs[1] = {&out};
    int oa[1] = {0};
    int ok = run_all("gelu_tanh_and_mul", a, 2, outs, oa, 1, gelu_cmp, &G);
    free(in.buf);
    free(out.buf);
    return ok;
}

static void test_gelu_tanh_and_mul(void)
{
    static const int64_t shapes[][2] = {{1, 13}, {4, 576}, {3, 1}, {2, 8}, {9, 1536}, {1, 20}};
    for (size_t t = 0; t < 3; t++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            CHECK(gelu_case(*all_dtypes[t], shapes[s][0], shapes[s][1], 0));
            CHECK(gelu_case(*all_dtypes[t], shapes[s][0], shapes[s][1], 1));
        }
}

/* ---- softcap (Gemma 2's final logits) ---------------------------------------------------------- */

/* The vector tanh is within about 1e-6 of tanhf: both sides are held to 2 u_out |ref| + 4e-6 cap. */
typedef struct {
    const char *what;
    double cap;
} cap_ctx;

static int cap_cmp(void *p, host_t *const *ref, host_t *const *got, const char *impl)
{
    const cap_ctx *C = p;
    tk_dtype dt = got[0]->t.dtype;
    op_cmp c = op_cmp_begin(0, 0, "%s %s %s", impl, tk_ops__dtype_str(dt), C->what);
    for (int64_t i = 0, n = numel(&ref[0]->t); i < n; i++) {
        double r = get(&ref[0]->t, i);
        op_cmp_tol(&c, i, get(&got[0]->t, i), r, 2 * u_out(dt) * fabs(r) + 4e-6 * C->cap + 2 * u_abs(dt));
    }
    return op_cmp_end(&c);
}

static int cap_case(tk_dtype dt, int64_t rows, int64_t d, double cap, int64_t pad, int inplace, int special)
{
    host_t in, out;
    int64_t sh[2] = {rows, d};
    host_new(&in, dt, 2, sh, pad);
    host_new(&out, dt, 2, sh, 0);
    fill_range(&in, -4 * cap, 4 * cap);
    if (special) {
        static const double vals[] = {NAN, INFINITY, -INFINITY, 1e30, -1e30, 0, -0.0, 1e-30, 1e-3, -1e-3, 0.06};
        for (size_t i = 0; i < sizeof vals / sizeof vals[0] && (int64_t)i < rows * d; i++)
            set(&in.t, (int64_t)i, vals[i] * (fabs(vals[i]) < 1 ? cap : 1));
    }
    char what[96];
    snprintf(what, sizeof what, "softcap [%lld, %lld] cap %g%s%s%s", (long long)rows, (long long)d, cap,
             pad ? " strided" : "", inplace ? " in place" : "", special ? " nan/inf" : "");
    cap_ctx C = {what, cap};
    host_t *o = inplace ? &in : &out;
    tk_arg a[] = {T("out", &o->t), T("input", &in.t), F("cap", cap)};
    host_t *outs[1] = {o};
    int oa[1] = {0};
    int ok = run_all("softcap", a, 3, outs, oa, 1, cap_cmp, &C);
    free(in.buf);
    free(out.buf);
    return ok;
}

static void test_softcap(void)
{
    static const int64_t shapes[][2] = {{1, 13}, {4, 576}, {3, 1}, {2, 8}, {2, 50257}, {1, 20}};
    static const double caps[] = {30, 2, 50};
    for (size_t t = 0; t < 3; t++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            double cap = caps[s % 3];
            CHECK(cap_case(*all_dtypes[t], shapes[s][0], shapes[s][1], cap, s == 2 ? 5 : 0, 0, 0));
            CHECK(cap_case(*all_dtypes[t], shapes[s][0], shapes[s][1], cap, 0, 1, 0));
            CHECK(cap_case(*all_dtypes[t], shapes[s][0], shapes[s][1], cap, 0, 0, 1));
        }
}

/* ---- rotary_embedding ------------------------------------------------------------------------- */

static int rope_case(tk_dtype dt, tk_dtype cdt, int64_t ntok, int64_t hq, int64_t hkv, int64_t d, int64_t rot)
{
    host_t q, k, pos, cache;
    int64_t qs[3] = {ntok, hq, d}, ks[3] = {ntok, hkv, d}, ps[1] = {ntok}, cs[2] = {300, rot};
    host_new(&q, dt, 3, qs, 0);
    host_new(&k, dt, 3, ks, 0);
    host_new(&pos, I64, 1, ps, 0);
    host_new(&cache, cdt, 2, cs, 0);
    fill_range(&q, -3, 3);
    fill_range(&k, -3, 3);
    fill_range(&cache, -1, 1);
    for (int64_t t = 0; t < ntok; t++)
        id_set(&pos, t, (t * 37 + 11) % 300);
    char what[96];
    snprintf(what, sizeof what, "rotary_embedding T %lld Hq %lld Hkv %lld D %lld rot %lld cache %s", (long long)ntok,
             (long long)hq, (long long)hkv, (long long)d, (long long)rot, tk_ops__dtype_str(cdt));
    ew_ctx E = {what, d, 0};
    tk_arg a[] = {T("query", &q.t), T("key", &k.t), T("positions", &pos.t), T("cos_sin_cache", &cache.t),
                  I("is_neox", 1)};
    host_t *outs[2] = {&q, &k};
    int oa[2] = {0, 1};
    int ok = run_all("rotary_embedding", a, 5, outs, oa, 2, ew_cmp, &E);
    free(q.buf);
    free(k.buf);
    free(pos.buf);
    free(cache.buf);
    return ok;
}

static void test_rotary(void)
{
    for (size_t t = 0; t < 3; t++) {
        tk_dtype dt = *all_dtypes[t];
        CHECK(rope_case(dt, F32, 1, 9, 3, 64, 64));
        CHECK(rope_case(dt, F32, 7, 4, 2, 20, 12));
        CHECK(rope_case(dt, dt, 5, 2, 1, 34, 34));
        CHECK(rope_case(dt, F32, 130, 3, 1, 64, 32));
    }
}

/* ---- the pick and fits ------------------------------------------------------------------------- */

static void test_pick(void)
{
    /* On this machine the first usable implementation of silu_and_mul wins; a strided-within-row
     * input (column stride 2) fits none and runs the reference. */
    host_t in, out;
    int64_t is[2] = {2, 16}, os[2] = {2, 8};
    host_new(&in, F32, 2, is, 16);
    host_new(&out, F32, 2, os, 0);
    fill_range(&in, -1, 1);
    in.t.strides = NULL;
    tk_arg a[] = {T("out", &out.t), T("input", &in.t)};
    tk_op_call c;
    CHECK_RC(tk_ops__prepare(&c, "silu_and_mul", a, 2), TK_OK);
    const tk_cpu_impl *want = NULL;
    for (size_t i = 0; i < tk_ops__cpu_impl_count() && !want; i++)
        if (!strcmp(tk_ops__cpu_impl_at(i)->op, "silu_and_mul") && tk_ops__cpu_impl_usable(tk_ops__cpu_impl_at(i)))
            want = tk_ops__cpu_impl_at(i);
    const tk_cpu_impl *got = tk_ops__cpu_pick(&c);
    CHECK(got == want);
    const char *impl = NULL;
    CHECK_RC(tk_ops__run_cpu_best(&c, &impl), TK_OK);
    CHECK_STR(impl, want ? want->impl : TK_CPU_IMPL_REFERENCE);
    int64_t strides[2] = {32, 2};
    in.t.strides = strides;
    CHECK_RC(tk_ops__prepare(&c, "silu_and_mul", a, 2), TK_OK);
    CHECK(tk_ops__cpu_pick(&c) == NULL);
    CHECK_RC(tk_ops__run_cpu_best(&c, &impl), TK_OK);
    CHECK_STR(impl, TK_CPU_IMPL_REFERENCE);
    /* attention with ALiBi: no fast implementation takes it */
    free(in.buf);
    free(out.buf);
    /* a bad position: fits says no, so the reference reports it */
    host_t q, k, pos, cache;
    int64_t qs[3] = {1, 1, 8}, ps[1] = {1}, cs[2] = {4, 8};
    host_new(&q, F32, 3, qs, 0);
    host_new(&k, F32, 3, qs, 0);
    host_new(&pos, I64, 1, ps, 0);
    host_new(&cache, F32, 2, cs, 0);
    id_set(&pos, 0, 9);
    tk_arg r[] = {T("query", &q.t), T("key", &k.t), T("positions", &pos.t), T("cos_sin_cache", &cache.t)};
    CHECK_RC(tk_ops__prepare(&c, "rotary_embedding", r, 4), TK_OK);
    CHECK(tk_ops__cpu_pick(&c) == NULL);
    CHECK_RC(tk_ops__run_cpu_best(&c, &impl), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "outside [0, 4)");
    free(q.buf);
    free(k.buf);
    free(pos.buf);
    free(cache.buf);
    /* casted_linear: the integer-dot GEMV takes decode's rows (M <= 4), the f32-activation one the rest */
    for (int64_t m = 1; m <= 8; m += 3) {
        host_t x, w, sc, o;
        int64_t xs[2] = {m, 64}, ws[2] = {8, 64}, ns[1] = {8}, os2[2] = {m, 8};
        host_new(&x, F32, 2, xs, 0);
        host_new(&w, I8, 2, ws, 0);
        host_new(&sc, F32, 1, ns, 0);
        host_new(&o, F32, 2, os2, 0);
        tk_arg ca[] = {T("out", &o.t), T("x", &x.t), T("weight", &w.t), T("scale", &sc.t)};
        CHECK_RC(tk_ops__prepare(&c, "casted_linear", ca, 4), TK_OK);
        const tk_cpu_impl *p = tk_ops__cpu_pick(&c);
        int q8 = 0; /* the table has it (an x86 build) and this CPU runs it */
        for (size_t i = 0; i < tk_ops__cpu_impl_count(); i++)
            q8 |=
                !strcmp(tk_ops__cpu_impl_at(i)->impl, "cpu-avx2-q8") && tk_ops__cpu_impl_usable(tk_ops__cpu_impl_at(i));
        if (q8) { /* TK_CPU_Q8=1 (main sets it): q8 for decode's rows; off, the f32-activation GEMV */
            CHECK(p != NULL);
            CHECK_STR(p ? p->impl : "", m <= 4 ? "cpu-avx2-q8" : "cpu-avx2");
            tk_ops__cpu_set_act_quant(0);
            p = tk_ops__cpu_pick(&c);
            CHECK(p != NULL);
            CHECK_STR(p ? p->impl : "", "cpu-avx2");
            tk_ops__cpu_set_act_quant(1);
        }
        free(x.buf);
        free(w.buf);
        free(sc.buf);
        free(o.buf);
    }
    if (skipped_impls)
        printf("note: %d implementation runs skipped (features this CPU lacks)\n", skipped_impls);
    for (size_t i = 0; i < tk_ops__cpu_impl_count(); i++) {
        const char *why = missing(tk_ops__cpu_impl_at(i));
        if (why)
            printf("skip %s %s: %s\n", tk_ops__cpu_impl_at(i)->op, tk_ops__cpu_impl_at(i)->impl, why);
    }
}

/* ---- the pool ---------------------------------------------------------------------------------- */

typedef struct {
    atomic_int *hits;
    int64_t n;
    atomic_int bad;
    int nested;
} pool_job;

static void count_range(void *arg, int64_t lo, int64_t hi)
{
    pool_job *j = arg;
    if (lo < 0 || hi > j->n || lo >= hi)
        atomic_store(&j->bad, 1);
    for (int64_t i = lo; i < hi; i++)
        atomic_fetch_add(&j->hits[i], 1);
    if (j->nested) { /* a call from inside a job runs on this thread alone */
        pool_job inner = {calloc(10, sizeof(atomic_int)), 10, 0, 0};
        tk_ops__parallel_for(10, 1, 4, count_range, &inner);
        for (int i = 0; i < 10; i++)
            if (atomic_load(&inner.hits[i]) != 1)
                atomic_store(&j->bad, 1);
        free((void *)inner.hits);
    }
}

static int pool_once(int64_t n, int64_t grain, int threads, int nested)
{
    pool_job j = {calloc((size_t)n + 1, sizeof(atomic_int)), n, 0, nested};
    tk_ops__parallel_for(n, grain, threads, count_range, &j);
    int ok = !atomic_load(&j.bad);
    for (int64_t i = 0; i < n; i++)
        ok &= atomic_load(&j.hits[i]) == 1;
    free((void *)j.hits);
    return ok;
}

static void *pool_thread(void *p)
{
    int *ok = p;
    for (int r = 0; r < 200; r++)
        *ok &= pool_once(1000 + r, 7, 3, r % 5 == 0);
    return NULL;
}

static void test_pool(void)
{
    CHECK(pool_once(1, 1, 4, 0));
    CHECK(pool_once(1000, 7, 4, 0));
    CHECK(pool_once(1000, 1, 8, 1));
    CHECK(pool_once(5, 100, 4, 0));
    for (int r = 0; r < 500; r++) /* back to back: the spin and the wake-ups */
        if (!pool_once(64, 1, 3, 0)) {
            CHECK(0);
            break;
        }
    /* several host threads at once: one holds the pool, the others run alone */
    pthread_t t[3];
    int ok[3] = {1, 1, 1};
    for (int i = 0; i < 3; i++)
        pthread_create(&t[i], NULL, pool_thread, &ok[i]);
    for (int i = 0; i < 3; i++) {
        pthread_join(t[i], NULL);
        CHECK(ok[i]);
    }
    /* the thread limit is per thread */
    int prev = tk_ops__set_threads(3);
    CHECK_EQ_INT(tk_ops__threads(), 3);
    tk_ops__set_threads(prev);
    CHECK_EQ_INT(tk_ops__threads(), tk_ops__default_threads());
    CHECK(tk_ops__default_threads() >= 1);
    /* the reference helper still splits by cost */
    CHECK(pool_once(100000, 1000, 0, 0));
    /* a forked child has no workers of its own: its calls still cover every range */
    pid_t pid = fork();
    if (pid == 0)
        _exit(pool_once(1000, 3, 4, 0) && pool_once(5000, 1, 2, 1) ? 0 : 1);
    int st = -1;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

int main(void)
{
    op_test_seed();
    printf("cpu features:");
    for (unsigned b = 1; b; b <<= 1)
        if ((tk_ops__cpu_features() & b) && tk_ops__cpu_feature_str(b))
            printf(" %s", tk_ops__cpu_feature_str(b));
    printf("; mode %d; threads %d\n", tk_ops__cpu_mode(), tk_ops__threads());
    tk_ops__cpu_set_act_quant(1); /* TK_CPU_Q8=1: cpu-avx2-q8 is tested against the reference too */
    RUN(test_pool);
    RUN(test_linear);
    RUN(test_casted_linear);
    RUN(test_attention);
    RUN(test_attention_decode);
    RUN(test_norms);
    RUN(test_silu_and_mul);
    RUN(test_gelu_tanh_and_mul);
    RUN(test_softcap);
    RUN(test_rotary);
    RUN(test_pick);
    return th_done();
}
