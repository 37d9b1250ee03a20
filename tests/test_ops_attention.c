/*
 * test_ops_attention.c — the attention ops (ops/attention.c): each CPU reference against an independent
 * float64 implementation written here (plain loops over a full score matrix, explicit per-element
 * masks), on fresh random inputs:
 *
 *   attention           every mask combination (causal x window_left x window_right x ALiBi x softcap),
 *                       MHA / GQA / MQA, Sq and Sk of 1, 7, 33 and 150 (more than one key chunk),
 *                       Sq != Sk both ways, f32 / f16 / bf16, varlen with 3 sequences and padding rows
 *   attention_backward  against float64 analytic gradients (full P, dP, dS matrices) and against
 *                       float64 central finite differences of the forward on a tiny case
 *   attention_decode    paged caches with a shuffled block table, partial last blocks, NaN in every slot
 *                       no sequence owns, Sq = 1 and 4, f32/f16/bf16 and quantised i8 / fp8_e4m3 caches
 *   paged_kv_append     written slots (exact quantisation by an encoder written here), skipped tokens,
 *                       untouched slots, then decode over the appended cache
 *   mla_decode          the absorbed form against explicit MHA on decompressed K/V (W_UK, W_UV built here)
 *
 * plus fully masked rows (out 0, lse -inf) and the validation messages. Seeded: the seed is printed and
 * TK_TEST_SEED replays one.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "op_test.h"
#include "tensor_util.h"
#include "ops/ops.h"

/* ---- host tensors ----------------------------------------------------------------------------- */

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})

static void shuffle(int64_t *a, int64_t n)
{
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(next_u64() % (uint64_t)(i + 1)), t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

/* ---- fp8 e4m3fn, written here (bias 7, 3 mantissa bits, no inf, 0x7f / 0xff NaN, max 448) --------- */

static double e4m3_decode(uint8_t c)
{
    int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7)
        return NAN;
    double v = e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
    return s ? -v : v;
}

/* Nearest e4m3 value of y (ties to the even code), saturating to +-448. */
static double e4m3_round(double y)
{
    double a = fabs(y), best = 0;
    int bestc = 0;
    for (int c = 0; c < 0x7f; c++) {
        double v = e4m3_decode((uint8_t)c), dv = fabs(v - a), db = fabs(best - a);
        if (dv < db || (dv == db && (c & 1) == 0 && (bestc & 1))) {
            best = v;
            bestc = c;
        }
    }
    return y < 0 ? -best : best;
}

/* A random e4m3 code of magnitude <= 3.75 (exponent field <= 8), either sign. */
static uint8_t e4m3_random(void) { return (uint8_t)((next_u64() % 72) | (next_u64() & 1 ? 0x80 : 0)); }

/* ---- comparison ------------------------------------------------------------------------------- */

static void tol_of(tk_dtype dt, double *atol, double *rtol)
{
    if (dt.bits == 32) {
        *atol = 2e-6;
        *rtol = 1e-5;
    } else if (dt.code == TK_DL_BFLOAT) {
        *atol = 1e-3;
        *rtol = 8e-3;
    } else {
        *atol = 1e-4;
        *rtol = 1e-3;
    }
}

/* |got - ref| <= atol + rtol |ref| everywhere (op_test.h); an infinite ref wants exactly that value;
 * NaN never passes, not even against a NaN reference. Prints the worst element. */
static int compare(const char *what, const double *got, const double *ref, int64_t n, double atol, double rtol)
{
    op_cmp c = op_cmp_begin(atol, rtol, "%s", what);
    c.nan_fails = 1;
    for (int64_t i = 0; i < n; i++)
        op_cmp_at(&c, i, got[i], ref[i]);
    return op_cmp_end(&c);
}

#define TA(nm, tp) ((tk_arg){TK_ARG_TENSOR, nm, tp, 0, 0})
#define IA(nm, v) ((tk_arg){TK_ARG_I64, nm, NULL, v, 0})
#define FA(nm, v) ((tk_arg){TK_ARG_F64, nm, NULL, 0, v})

static int run(const char *op, const tk_arg *a, size_t n, const char *what)
{
    int rc = op_run_cpu(op, a, n);
    if (rc != TK_OK)
        fprintf(stderr, "  %s %s: rc %d: %s (seed %llu)\n", op, what, rc, tk_last_error(), (unsigned long long)seed);
    return rc == TK_OK;
}

/* ---- the float64 references ------------------------------------------------------------------- */

typedef struct {
    double scale, softcap;
    int causal;
    int64_t wl, wr;
    const double *alibi; /* [hq] or NULL */
} opts_t;

/* Is key j hidden from query i (of sq queries over sk keys)? */
static int masked(const opts_t *o, int64_t i, int64_t j, int64_t sq, int64_t sk)
{
    int64_t p = i + sk - sq;
    return (o->causal && j > p) || (o->wl >= 0 && j < p - o->wl) || (o->wr >= 0 && j > p + o->wr);
}

/* The full score matrix S [sq, sk] of head h (-inf where masked) and T = scale * q.k before the cap. */
static void scores(double *S, double *T, const double *q, const double *k, int64_t sq, int64_t sk, int64_t hq,
                   int64_t hkv, int64_t dk, int64_t h, const opts_t *o)
{
    int64_t hk = h / (hq / hkv);
    for (int64_t i = 0; i < sq; i++)
        for (int64_t j = 0; j < sk; j++) {
            double dot = 0;
            for (int64_t x = 0; x < dk; x++)
                dot += q[(i * hq + h) * dk + x] * k[(j * hkv + hk) * dk + x];
            double t = o->scale * dot, s = t;
            if (o->softcap > 0)
                s = o->softcap * tanh(t / o->softcap);
            if (o->alibi)
                s += -o->alibi[h] * fabs((double)(i + sk - sq - j));
            S[i * sk + j] = masked(o, i, j, sq, sk) ? -INFINITY : s;
            if (T)
                T[i * sk + j] = t;
        }
}

/* Row softmax of S in place (a row of -inf becomes 0); lse[i] gets log sum exp (-inf for such rows). */
static void softmax_rows(double *S, double *lse, int64_t sq, int64_t sk)
{
    for (int64_t i = 0; i < sq; i++) {
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < sk; j++)
            mx = fmax(mx, S[i * sk + j]);
        if (mx == -INFINITY) {
            for (int64_t j = 0; j < sk; j++)
                S[i * sk + j] = 0;
            lse[i] = -INFINITY;
            continue;
        }
        for (int64_t j = 0; j < sk; j++)
            sum += exp(S[i * sk + j] - mx);
        for (int64_t j = 0; j < sk; j++)
            S[i * sk + j] = exp(S[i * sk + j] - mx) / sum;
        lse[i] = mx + log(sum);
    }
}

/* One sequence: q [sq, hq, dk], k [sk, hkv, dk], v [sk, hkv, dv] -> out [sq, hq, dv], lse [hq, sq]. */
static void naive_attn(double *out, double *lse, const double *q, const double *k, const double *v, int64_t sq,
                       int64_t sk, int64_t hq, int64_t hkv, int64_t dk, int64_t dv, const opts_t *o)
{
    double *S = malloc(sizeof(double) * (size_t)(sq * sk + 1));
    for (int64_t h = 0; h < hq; h++) {
        int64_t hk = h / (hq / hkv);
        scores(S, NULL, q, k, sq, sk, hq, hkv, dk, h, o);
        softmax_rows(S, lse + h * sq, sq, sk);
        for (int64_t i = 0; i < sq; i++)
            for (int64_t x = 0; x < dv; x++) {
                double acc = 0;
                for (int64_t j = 0; j < sk; j++)
                    acc += S[i * sk + j] * v[(j * hkv + hk) * dv + x];
                out[(i * hq + h) * dv + x] = acc;
            }
    }
    free(S);
}

/* Gradients of one sequence by the matrix formulas: P = softmax(S), dP = dO V^T, D = rowsum(P o dP)
 * (or dO . outq when outq is given: flash-attn's form over the out it was handed), dS = P o (dP - D),
 * dT = dS o (1 - tanh^2(T / softcap)), dQ = scale dT K, dK = scale dT^T Q, dV = P^T dO. */
static void naive_bwd(double *dq, double *dk, double *dv, const double *q, const double *k, const double *v,
                      const double *dout, const double *outq, int64_t sq, int64_t sk, int64_t hq, int64_t hkv,
                      int64_t d, const opts_t *o)
{
    double *P = malloc(sizeof(double) * (size_t)(sq * sk + 1)), *T = malloc(sizeof(double) * (size_t)(sq * sk + 1));
    double *dS = malloc(sizeof(double) * (size_t)(sq * sk + 1)), *lse = malloc(sizeof(double) * (size_t)(sq + 1));
    memset(dq, 0, sizeof(double) * (size_t)(sq * hq * d));
    memset(dk, 0, sizeof(double) * (size_t)(sk * hkv * d));
    memset(dv, 0, sizeof(double) * (size_t)(sk * hkv * d));
    for (int64_t h = 0; h < hq; h++) {
        int64_t hk = h / (hq / hkv);
        scores(P, T, q, k, sq, sk, hq, hkv, d, h, o);
        softmax_rows(P, lse, sq, sk);
        for (int64_t i = 0; i < sq; i++) {
            const double *doi = dout + (i * hq + h) * d;
            double D = 0;
            for (int64_t j = 0; j < sk; j++) {
                double dp = 0;
                for (int64_t x = 0; x < d; x++)
                    dp += doi[x] * v[(j * hkv + hk) * d + x];
                dS[i * sk + j] = dp;
                D += P[i * sk + j] * dp;
            }
            if (outq) {
                D = 0;
                for (int64_t x = 0; x < d; x++)
                    D += doi[x] * outq[(i * hq + h) * d + x];
            }
            for (int64_t j = 0; j < sk; j++) {
                double g = 1;
                if (o->softcap > 0) {
                    double th = tanh(T[i * sk + j] / o->softcap);
                    g = 1 - th * th;
                }
                dS[i * sk + j] = P[i * sk + j] * (dS[i * sk + j] - D) * g;
            }
        }
        for (int64_t i = 0; i < sq; i++)
            for (int64_t j = 0; j < sk; j++)
                for (int64_t x = 0; x < d; x++) {
                    dq[(i * hq + h) * d + x] += o->scale * dS[i * sk + j] * k[(j * hkv + hk) * d + x];
                    dk[(j * hkv + hk) * d + x] += o->scale * dS[i * sk + j] * q[(i * hq + h) * d + x];
                    dv[(j * hkv + hk) * d + x] += P[i * sk + j] * dout[(i * hq + h) * d + x];
                }
    }
    free(P);
    free(T);
    free(dS);
    free(lse);
}

/* ---- attention (prefill) ---------------------------------------------------------------------- */

typedef struct {
    int64_t b, sq, sk, hq, hkv, d;
    int causal;
    int64_t wl, wr;
    int alibi;
    double softcap, scale; /* scale 0: left out (the default 1/sqrt(D)) */
} fcase;

static void fcase_str(char *s, size_t n, tk_dtype dt, const fcase *f)
{
    snprintf(s, n, "%s B%lld Sq%lld Sk%lld Hq%lld Hkv%lld D%lld causal %d wl %lld wr %lld alibi %d softcap %g scale %g",
             tk_ops__dtype_str(dt), (long long)f->b, (long long)f->sq, (long long)f->sk, (long long)f->hq,
             (long long)f->hkv, (long long)f->d, f->causal, (long long)f->wl, (long long)f->wr, f->alibi, f->softcap,
             f->scale);
}

static opts_t opts_of(const fcase *f, const double *alibi)
{
    opts_t o = {f->scale != 0 ? f->scale : 1.0 / sqrt((double)f->d),
                f->softcap,
                f->causal,
                f->wl,
                f->wr,
                f->alibi ? alibi : NULL};
    return o;
}

/* Builds the args of attention / attention_backward after the tensors: alibi and the scalars. */
static size_t mask_args(tk_arg *a, size_t n, const fcase *f, const tk_tensor *alibi)
{
    if (f->alibi)
        a[n++] = TA("alibi_slopes", alibi);
    if (f->scale != 0)
        a[n++] = FA("scale", f->scale);
    a[n++] = IA("causal", f->causal);
    a[n++] = IA("window_left", f->wl);
    a[n++] = IA("window_right", f->wr);
    if (f->softcap != 0)
        a[n++] = FA("softcap", f->softcap);
    return n;
}

static int fwd_case(tk_dtype dt, const fcase *f)
{
    char what[256];
    fcase_str(what, sizeof what, dt, f);
    host_t q, k, v, out, lse, al;
    host_new(&q, dt, 4, SHAPE(f->b, f->sq, f->hq, f->d), 0);
    host_new(&k, dt, 4, SHAPE(f->b, f->sk, f->hkv, f->d), 0);
    host_new(&v, dt, 4, SHAPE(f->b, f->sk, f->hkv, f->d), 0);
    host_new(&out, dt, 4, SHAPE(f->b, f->sq, f->hq, f->d), 0);
    host_new(&lse, F32, 3, SHAPE(f->b, f->hq, f->sq), 0);
    host_new(&al, F32, 1, SHAPE(f->hq), 0);
    double *qd = op_rand(&q, -2, 2), *kd = op_rand(&k, -2, 2), *vd = op_rand(&v, -1, 1), *ad = op_rand(&al, 0.05, 0.5);
    fill_const(&out, 7);
    fill_const(&lse, 7);
    tk_arg a[16] = {TA("out", &out.t), TA("q", &q.t), TA("k", &k.t), TA("v", &v.t), TA("lse", &lse.t)};
    size_t na = mask_args(a, 5, f, &al.t);
    int ok = run("attention", a, na, what);
    int64_t no = f->b * f->sq * f->hq * f->d, nl = f->b * f->hq * f->sq;
    double *ro = malloc(sizeof(double) * (size_t)(no + 1)), *rl = malloc(sizeof(double) * (size_t)(nl + 1));
    opts_t o = opts_of(f, ad);
    for (int64_t b = 0; b < f->b; b++)
        naive_attn(ro + b * f->sq * f->hq * f->d, rl + b * f->hq * f->sq, qd + b * f->sq * f->hq * f->d,
                   kd + b * f->sk * f->hkv * f->d, vd + b * f->sk * f->hkv * f->d, f->sq, f->sk, f->hq, f->hkv, f->d,
                   f->d, &o);
    if (ok) {
        double *go = op_values(&out.t), *gl = op_values(&lse.t), atol, rtol;
        tol_of(dt, &atol, &rtol);
        char w2[300];
        snprintf(w2, sizeof w2, "attention out %s", what);
        ok &= compare(w2, go, ro, no, atol, rtol);
        snprintf(w2, sizeof w2, "attention lse %s", what);
        ok &= compare(w2, gl, rl, nl, 1e-5, 1e-5);
        free(go);
        free(gl);
    }
    free(ro);
    free(rl);
    free(qd);
    free(kd);
    free(vd);
    free(ad);
    host_free(&q);
    host_free(&k);
    host_free(&v);
    host_free(&out);
    host_free(&lse);
    host_free(&al);
    return ok;
}

static const int64_t seq_shapes[][2] = {{1, 1}, {7, 7}, {33, 33}, {7, 33}, {33, 7}, {1, 33}, {5, 150}};
static const int64_t head_cfgs[][2] = {{4, 2}, {4, 1}, {2, 2}, {3, 1}};
static const int64_t head_dims[] = {8, 64, 5, 32};
/* Mask combination c (0..31): causal, window_left, window_right, ALiBi, softcap bits. */
static void combo(fcase *f, int c, int variant)
{
    f->causal = c & 1;
    f->wl = (c & 2) ? (variant & 1 ? 0 : 3) : -1;
    f->wr = (c & 4) ? (variant & 2 ? 0 : 2) : -1;
    f->alibi = (c >> 3) & 1;
    f->softcap = (c & 16) ? 5.0 : 0.0;
}

static void test_attention_masks(void)
{
    int n = 0;
    for (int c = 0; c < 32; c++)
        for (size_t s = 0; s < sizeof seq_shapes / sizeof seq_shapes[0]; s++, n++) {
            fcase f = {0};
            combo(&f, c, n);
            f.b = n % 3 == 0 ? 2 : 1;
            f.sq = seq_shapes[s][0];
            f.sk = seq_shapes[s][1];
            f.hq = head_cfgs[n % 4][0];
            f.hkv = head_cfgs[n % 4][1];
            f.d = head_dims[n % 4];
            f.scale = n % 5 == 0 ? 0.3 : 0;
            CHECK(fwd_case(*all_dtypes[n % 3], &f));
        }
}

/* Head dims up to 512 and each dtype on the same case. */
static void test_attention_dims(void)
{
    const int64_t dims[] = {1, 3, 64, 128, 256, 512};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        for (int t = 0; t < 3; t++) {
            fcase f = {1, 9, 70, 4, 2, dims[i], 1, -1, -1, 0, 0.0, 0};
            CHECK(fwd_case(*all_dtypes[t], &f));
        }
    /* big enough for several threads and several key chunks per query */
    fcase big = {2, 257, 300, 8, 2, 128, 1, 100, -1, 1, 30.0, 0};
    CHECK(fwd_case(BF16, &big));
}

/* Sq > Sk with causal: the first Sq - Sk queries see no key: out exactly 0, lse -inf. */
static void test_fully_masked(void)
{
    fcase f = {1, 7, 3, 2, 1, 8, 1, -1, -1, 0, 0.0, 0};
    CHECK(fwd_case(F32, &f));
    /* and explicitly */
    host_t q, k, v, out, lse;
    host_new(&q, F32, 4, SHAPE(1, 7, 2, 8), 0);
    host_new(&k, F32, 4, SHAPE(1, 3, 1, 8), 0);
    host_new(&v, F32, 4, SHAPE(1, 3, 1, 8), 0);
    host_new(&out, F32, 4, SHAPE(1, 7, 2, 8), 0);
    host_new(&lse, F32, 3, SHAPE(1, 2, 7), 0);
    free(op_rand(&q, -1, 1));
    free(op_rand(&k, -1, 1));
    free(op_rand(&v, -1, 1));
    fill_const(&out, 3);
    tk_arg a[6] = {TA("out", &out.t), TA("q", &q.t), TA("k", &k.t), TA("v", &v.t), TA("lse", &lse.t), IA("causal", 1)};
    CHECK(run("attention", a, 6, "fully masked"));
    const float *o = out.buf, *l = lse.buf;
    for (int64_t i = 0; i < 7; i++)
        for (int64_t h = 0; h < 2; h++) {
            int hidden = i < 4; /* p = i - 4 < 0 */
            CHECK(hidden ? l[h * 7 + i] == -INFINITY : isfinite(l[h * 7 + i]));
            for (int64_t x = 0; x < 8; x++)
                CHECK(hidden ? o[(i * 2 + h) * 8 + x] == 0.0f : o[(i * 2 + h) * 8 + x] != 0.0f);
        }
    /* a window that leaves nothing: non-causal, window_right 0, keys only at p >= 0 */
    tk_arg b[7] = {TA("out", &out.t), TA("q", &q.t),        TA("k", &k.t),        TA("v", &v.t),
                   TA("lse", &lse.t), IA("window_left", 0), IA("window_right", 0)};
    CHECK(run("attention", b, 7, "window of one"));
    for (int64_t h = 0; h < 2; h++) {
        CHECK(l[h * 7 + 0] == -INFINITY);
        CHECK(isfinite(l[h * 7 + 6]));
    }
    host_free(&q);
    host_free(&k);
    host_free(&v);
    host_free(&out);
    host_free(&lse);
}

/* Varlen: 3 sequences (one with Sq > Sk, one of a single query) packed with padding rows after them,
 * which must stay untouched. */
static int varlen_case(tk_dtype dt, const fcase *f)
{
    char what[256];
    fcase_str(what, sizeof what, dt, f);
    const int32_t cq[4] = {0, 5, 6, 18}, ck[4] = {0, 3, 12, 32};
    const int64_t tq = 20, tk = 33, hq = f->hq, hkv = f->hkv, d = f->d;
    host_t q, k, v, out, lse, al, cuq, cuk;
    host_new(&q, dt, 4, SHAPE(1, tq, hq, d), 0);
    host_new(&k, dt, 4, SHAPE(1, tk, hkv, d), 0);
    host_new(&v, dt, 4, SHAPE(1, tk, hkv, d), 0);
    host_new(&out, dt, 4, SHAPE(1, tq, hq, d), 0);
    host_new(&lse, F32, 3, SHAPE(1, hq, tq), 0);
    host_new(&al, F32, 1, SHAPE(hq), 0);
    host_new(&cuq, I32, 1, SHAPE(4), 0);
    host_new(&cuk, I32, 1, SHAPE(4), 0);
    memcpy(cuq.buf, cq, sizeof cq);
    memcpy(cuk.buf, ck, sizeof ck);
    double *qd = op_rand(&q, -2, 2), *kd = op_rand(&k, -2, 2), *vd = op_rand(&v, -1, 1), *ad = op_rand(&al, 0.05, 0.5);
    fill_const(&out, 7);
    fill_const(&lse, 7);
    tk_arg a[16] = {TA("out", &out.t),
                    TA("q", &q.t),
                    TA("k", &k.t),
                    TA("v", &v.t),
                    TA("lse", &lse.t),
                    TA("cu_seqlens_q", &cuq.t),
                    TA("cu_seqlens_k", &cuk.t),
                    IA("max_seqlen_q", 12)};
    size_t na = mask_args(a, 8, f, &al.t);
    int ok = run("attention", a, na, what);
    double *ro = malloc(sizeof(double) * (size_t)(tq * hq * d)), *rl = malloc(sizeof(double) * (size_t)(hq * tq));
    double *sl = malloc(sizeof(double) * (size_t)(hq * tq));
    for (int64_t i = 0; i < tq * hq * d; i++)
        ro[i] = 7;
    for (int64_t i = 0; i < hq * tq; i++)
        rl[i] = 7;
    opts_t o = opts_of(f, ad);
    for (int s = 0; s < 3; s++) {
        int64_t nq = cq[s + 1] - cq[s], nk = ck[s + 1] - ck[s];
        naive_attn(ro + cq[s] * hq * d, sl, qd + cq[s] * hq * d, kd + ck[s] * hkv * d, vd + ck[s] * hkv * d, nq, nk, hq,
                   hkv, d, d, &o);
        for (int64_t h = 0; h < hq; h++)
            for (int64_t i = 0; i < nq; i++)
                rl[h * tq + cq[s] + i] = sl[h * nq + i];
    }
    if (ok) {
        double *go = op_values(&out.t), *gl = op_values(&lse.t), atol, rtol;
        tol_of(dt, &atol, &rtol);
        char w2[300];
        snprintf(w2, sizeof w2, "varlen out %s", what);
        ok &= compare(w2, go, ro, tq * hq * d, atol, rtol);
        snprintf(w2, sizeof w2, "varlen lse %s", what);
        ok &= compare(w2, gl, rl, hq * tq, 1e-5, 1e-5);
        free(go);
        free(gl);
    }
    free(ro);
    free(rl);
    free(sl);
    free(qd);
    free(kd);
    free(vd);
    free(ad);
    host_free(&q);
    host_free(&k);
    host_free(&v);
    host_free(&out);
    host_free(&lse);
    host_free(&al);
    host_free(&cuq);
    host_free(&cuk);
    return ok;
}

static void test_attention_varlen(void)
{
    for (int c = 0; c < 32; c++) {
        fcase f = {0};
        combo(&f, c, c);
        f.b = 1;
        f.hq = head_cfgs[c % 4][0];
        f.hkv = head_cfgs[c % 4][1];
        f.d = head_dims[c % 4];
        CHECK(varlen_case(*all_dtypes[c % 3], &f));
    }
}

/* ---- attention_backward ----------------------------------------------------------------------- */

static int bwd_case(tk_dtype dt, const fcase *f)
{
    char what[256];
    fcase_str(what, sizeof what, dt, f);
    int64_t b = f->b, sq = f->sq, sk = f->sk, hq = f->hq, hkv = f->hkv, d = f->d;
    int64_t nq = b * sq * hq * d, nk = b * sk * hkv * d;
    host_t q, k, v, dout, out, lse, al, dq, dk, dv;
    host_new(&q, dt, 4, SHAPE(b, sq, hq, d), 0);
    host_new(&k, dt, 4, SHAPE(b, sk, hkv, d), 0);
    host_new(&v, dt, 4, SHAPE(b, sk, hkv, d), 0);
    host_new(&dout, dt, 4, SHAPE(b, sq, hq, d), 0);
    host_new(&out, dt, 4, SHAPE(b, sq, hq, d), 0);
    host_new(&dq, dt, 4, SHAPE(b, sq, hq, d), 0);
    host_new(&dk, dt, 4, SHAPE(b, sk, hkv, d), 0);
    host_new(&dv, dt, 4, SHAPE(b, sk, hkv, d), 0);
    host_new(&lse, F32, 3, SHAPE(b, hq, sq), 0);
    host_new(&al, F32, 1, SHAPE(hq), 0);
    double *qd = op_rand(&q, -2, 2), *kd = op_rand(&k, -2, 2), *vd = op_rand(&v, -1, 1), *gd = op_rand(&dout, -1, 1);
    double *ad = op_rand(&al, 0.05, 0.5);
    opts_t o = opts_of(f, ad);
    /* the forward in float64, handed to the op as out (rounded to T) and lse (f32) */
    double *fo = malloc(sizeof(double) * (size_t)(nq + 1)), *fl = malloc(sizeof(double) * (size_t)(b * hq * sq + 1));
    for (int64_t bb = 0; bb < b; bb++)
        naive_attn(fo + bb * sq * hq * d, fl + bb * hq * sq, qd + bb * sq * hq * d, kd + bb * sk * hkv * d,
                   vd + bb * sk * hkv * d, sq, sk, hq, hkv, d, d, &o);
    for (int64_t i = 0; i < nq; i++)
        set(&out.t, i, fo[i]);
    for (int64_t i = 0; i < b * hq * sq; i++)
        set(&lse.t, i, fl[i]);
    double *oq = op_values(&out.t);
    tk_arg a[16] = {TA("dq", &dq.t), TA("dk", &dk.t), TA("dv", &dv.t),   TA("dout", &dout.t), TA("q", &q.t),
                    TA("k", &k.t),   TA("v", &v.t),   TA("out", &out.t), TA("lse", &lse.t)};
    size_t na = mask_args(a, 9, f, &al.t);
    int ok = run("attention_backward", a, na, what);
    double *rq = malloc(sizeof(double) * (size_t)(nq + 1)), *rk = malloc(sizeof(double) * (size_t)(nk + 1)),
           *rv = malloc(sizeof(double) * (size_t)(nk + 1));
    for (int64_t bb = 0; bb < b; bb++)
        naive_bwd(rq + bb * sq * hq * d, rk + bb * sk * hkv * d, rv + bb * sk * hkv * d, qd + bb * sq * hq * d,
                  kd + bb * sk * hkv * d, vd + bb * sk * hkv * d, gd + bb * sq * hq * d,
                  dt.bits == 32 ? NULL : oq + bb * sq * hq * d, sq, sk, hq, hkv, d, &o);
    if (ok) {
        double atol, rtol, unit = 1e-30;
        tol_of(dt, &atol, &rtol);
        for (int64_t i = 0; i < nq; i++)
            unit = fmax(unit, fabs(rq[i]));
        for (int64_t i = 0; i < nk; i++)
            unit = fmax(unit, fmax(fabs(rk[i]), fabs(rv[i])));
        double *g1 = op_values(&dq.t), *g2 = op_values(&dk.t), *g3 = op_values(&dv.t);
        char w2[300];
        snprintf(w2, sizeof w2, "backward dq %s", what);
        ok &= compare(w2, g1, rq, nq, atol * unit, rtol);
        snprintf(w2, sizeof w2, "backward dk %s", what);
        ok &= compare(w2, g2, rk, nk, atol * unit, rtol);
        snprintf(w2, sizeof w2, "backward dv %s", what);
        ok &= compare(w2, g3, rv, nk, atol * unit, rtol);
        free(g1);
        free(g2);
        free(g3);
    }
    free(qd);
    free(kd);
    free(vd);
    free(gd);
    free(ad);
    free(fo);
    free(fl);
    free(oq);
    free(rq);
    free(rk);
    free(rv);
    host_t *all[] = {&q, &k, &v, &dout, &out, &lse, &al, &dq, &dk, &dv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        host_free(all[i]);
    return ok;
}

static void test_backward(void)
{
    const int64_t shapes[][2] = {{7, 7}, {5, 9}, {9, 5}, {1, 6}, {33, 33}};
    int n = 0;
    for (int c = 0; c < 32; c++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++, n++) {
            if (shapes[s][0] == 33 && c % 4)
                continue; /* the larger shape on a quarter of the combinations */
            fcase f = {0};
            combo(&f, c, n);
            f.b = n % 4 == 0 ? 2 : 1;
            f.sq = shapes[s][0];
            f.sk = shapes[s][1];
            f.hq = head_cfgs[n % 4][0];
            f.hkv = head_cfgs[n % 4][1];
            f.d = head_dims[n % 4] > 32 ? 16 : head_dims[n % 4];
            f.scale = n % 5 == 0 ? 0.3 : 0;
            CHECK(bwd_case(*all_dtypes[n % 3], &f));
        }
}

/* loss = sum(dout * attention(q, k, v)) in float64, for finite differences. */
static double fd_loss(const double *q, const double *k, const double *v, const double *dout, const fcase *f,
                      const opts_t *o)
{
    int64_t n = f->sq * f->hq * f->d;
    double *out = malloc(sizeof(double) * (size_t)n), *lse = malloc(sizeof(double) * (size_t)(f->hq * f->sq)), l = 0;
    naive_attn(out, lse, q, k, v, f->sq, f->sk, f->hq, f->hkv, f->d, f->d, o);
    for (int64_t i = 0; i < n; i++)
        l += dout[i] * out[i];
    free(out);
    free(lse);
    return l;
}

/* The op's forward then backward, against central differences of the float64 forward. */
static int fd_case(const fcase *f)
{
    char what[256];
    fcase_str(what, sizeof what, F32, f);
    int64_t nq = f->sq * f->hq * f->d, nk = f->sk * f->hkv * f->d;
    host_t q, k, v, dout, out, lse, al, dq, dk, dv;
    host_new(&q, F32, 4, SHAPE(1, f->sq, f->hq, f->d), 0);
    host_new(&k, F32, 4, SHAPE(1, f->sk, f->hkv, f->d), 0);
    host_new(&v, F32, 4, SHAPE(1, f->sk, f->hkv, f->d), 0);
    host_new(&dout, F32, 4, SHAPE(1, f->sq, f->hq, f->d), 0);
    host_new(&out, F32, 4, SHAPE(1, f->sq, f->hq, f->d), 0);
    host_new(&dq, F32, 4, SHAPE(1, f->sq, f->hq, f->d), 0);
    host_new(&dk, F32, 4, SHAPE(1, f->sk, f->hkv, f->d), 0);
    host_new(&dv, F32, 4, SHAPE(1, f->sk, f->hkv, f->d), 0);
    host_new(&lse, F32, 3, SHAPE(1, f->hq, f->sq), 0);
    host_new(&al, F32, 1, SHAPE(f->hq), 0);
    double *x[3] = {op_rand(&q, -1.5, 1.5), op_rand(&k, -1.5, 1.5), op_rand(&v, -1, 1)};
    double *gd = op_rand(&dout, -1, 1), *ad = op_rand(&al, 0.1, 0.6);
    opts_t o = opts_of(f, ad);
    tk_arg a[16] = {TA("out", &out.t), TA("q", &q.t), TA("k", &k.t), TA("v", &v.t), TA("lse", &lse.t)};
    size_t na = mask_args(a, 5, f, &al.t);
    int ok = run("attention", a, na, what);
    tk_arg b[16] = {TA("dq", &dq.t), TA("dk", &dk.t), TA("dv", &dv.t),   TA("dout", &dout.t), TA("q", &q.t),
                    TA("k", &k.t),   TA("v", &v.t),   TA("out", &out.t), TA("lse", &lse.t)};
    size_t nb = mask_args(b, 9, f, &al.t);
    ok = ok && run("attention_backward", b, nb, what);
    const host_t *grads[3] = {&dq, &dk, &dv};
    const int64_t lens[3] = {nq, nk, nk};
    const char *names[3] = {"dq", "dk", "dv"};
    for (int t = 0; ok && t < 3; t++) {
        double *fd = malloc(sizeof(double) * (size_t)lens[t]), *got = op_values(&(grads[t])->t), h = 1e-5;
        for (int64_t i = 0; i < lens[t]; i++) {
            double keep = x[t][i];
            x[t][i] = keep + h;
            double lp = fd_loss(x[0], x[1], x[2], gd, f, &o);
            x[t][i] = keep - h;
            double lm = fd_loss(x[0], x[1], x[2], gd, f, &o);
            x[t][i] = keep;
            fd[i] = (lp - lm) / (2 * h);
        }
        char w2[300];
        snprintf(w2, sizeof w2, "finite differences %s %s", names[t], what);
        ok &= compare(w2, got, fd, lens[t], 1e-5, 1e-4);
        free(fd);
        free(got);
    }
    for (int t = 0; t < 3; t++)
        free(x[t]);
    free(gd);
    free(ad);
    host_t *all[] = {&q, &k, &v, &dout, &out, &lse, &al, &dq, &dk, &dv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        host_free(all[i]);
    return ok;
}

static void test_backward_finite_differences(void)
{
    fcase a = {1, 3, 5, 2, 1, 4, 1, 2, -1, 1, 2.0, 0};   /* causal, window, ALiBi, softcap, MQA */
    fcase b = {1, 4, 4, 2, 2, 3, 0, -1, 1, 0, 0.0, 0.7}; /* window_right only, explicit scale */
    fcase c = {1, 5, 3, 4, 2, 4, 1, -1, -1, 0, 3.0, 0};  /* Sq > Sk causal: two fully masked rows */
    CHECK(fd_case(&a));
    CHECK(fd_case(&b));
    CHECK(fd_case(&c));
}

/* ---- attention_decode ------------------------------------------------------------------------- */

typedef struct {
    int64_t sq, bs, hq, hkv, d, wl;
    int alibi;
    double softcap;
    int nseq;
    int lens[4];
} dcase;

/* The paged layout of a decode case: a shuffled block table (unused entries hold junk ids). */
typedef struct {
    int64_t nblocks, mb;
    host_t bt, sl;
} pages_t;

static void pages_new(pages_t *pg, const int *lens, int nseq, int64_t bs)
{
    int64_t used = 0, mb = 1;
    for (int s = 0; s < nseq; s++) {
        int64_t nb = (lens[s] + bs - 1) / bs;
        used += nb;
        if (nb + 1 > mb)
            mb = nb + 1;
    }
    pg->nblocks = used + 3;
    pg->mb = mb;
    int64_t *perm = malloc(sizeof(int64_t) * (size_t)pg->nblocks);
    for (int64_t i = 0; i < pg->nblocks; i++)
        perm[i] = i;
    shuffle(perm, pg->nblocks);
    host_new(&pg->bt, I32, 2, SHAPE(nseq, mb), 0);
    host_new(&pg->sl, I32, 1, SHAPE(nseq), 0);
    int32_t *bt = pg->bt.buf, *sl = pg->sl.buf;
    int64_t next = 0;
    for (int s = 0; s < nseq; s++) {
        sl[s] = lens[s];
        for (int64_t b = 0; b < mb; b++)
            bt[s * mb + b] = b * bs < lens[s] ? (int32_t)perm[next++] : (b & 1 ? -1 : 1000000);
    }
    free(perm);
}

static void pages_free(pages_t *pg)
{
    host_free(&pg->bt);
    host_free(&pg->sl);
}

static int64_t slot_of(const pages_t *pg, int s, int64_t j, int64_t bs)
{
    return (int64_t)((const int32_t *)pg->bt.buf)[s * pg->mb + j / bs] * bs + j % bs;
}

/* Stores random values into every key slot of every sequence of a paged cache (junk NaN elsewhere);
 * returns per sequence the dequantised values [len, hkv, d] in *vals[s]. */
static void fill_cache(host_t *cache, const pages_t *pg, const int *lens, int nseq, int64_t hkv, int64_t d, int64_t bs,
                       const double *scale, double **vals)
{
    int64_t n = numel(&cache->t);
    tk_dtype dt = cache->t.dtype;
    uint8_t *raw = cache->buf;
    for (int64_t i = 0; i < n; i++) {
        if (dt.bits == 8)
            raw[i] = 0x7f; /* i8: 127 (large); fp8: NaN */
        else
            set(&cache->t, i, NAN);
    }
    for (int s = 0; s < nseq; s++) {
        vals[s] = malloc(sizeof(double) * (size_t)(lens[s] * hkv * d + 1));
        for (int64_t j = 0; j < lens[s]; j++)
            for (int64_t h = 0; h < hkv; h++)
                for (int64_t x = 0; x < d; x++) {
                    int64_t e = (slot_of(pg, s, j, bs) * hkv + h) * d + x, r = (j * hkv + h) * d + x;
                    if (dt.bits != 8) {
                        set(&cache->t, e, uniform(-2, 2));
                        vals[s][r] = get(&cache->t, e);
                    } else if (dt.code == TK_DL_INT) {
                        int c = (int)(next_u64() % 255) - 127;
                        raw[e] = (uint8_t)(int8_t)c;
                        vals[s][r] = c * scale[h];
                    } else {
                        raw[e] = e4m3_random();
                        vals[s][r] = e4m3_decode(raw[e]) * scale[h];
                    }
                }
    }
}

static int decode_case(tk_dtype qdt, tk_dtype cdt, const dcase *c)
{
    char what[256];
    snprintf(what, sizeof what, "q %s cache %s Sq %lld bs %lld Hq %lld Hkv %lld D %lld wl %lld alibi %d softcap %g",
             tk_ops__dtype_str(qdt), tk_ops__dtype_str(cdt), (long long)c->sq, (long long)c->bs, (long long)c->hq,
             (long long)c->hkv, (long long)c->d, (long long)c->wl, c->alibi, c->softcap);
    int nseq = c->nseq, quant = cdt.bits == 8;
    int64_t hq = c->hq, hkv = c->hkv, d = c->d, sq = c->sq;
    pages_t pg;
    pages_new(&pg, c->lens, nseq, c->bs);
    host_t kc, vc, q, out, lse, ks, vs, al;
    host_new(&kc, cdt, 4, SHAPE(pg.nblocks, c->bs, hkv, d), 0);
    host_new(&vc, cdt, 4, SHAPE(pg.nblocks, c->bs, hkv, d), 0);
    host_new(&q, qdt, 4, SHAPE(nseq, sq, hq, d), 0);
    host_new(&out, qdt, 4, SHAPE(nseq, sq, hq, d), 0);
    host_new(&lse, F32, 3, SHAPE(nseq, hq, sq), 0);
    host_new(&ks, F32, 1, SHAPE(hkv), 0);
    host_new(&vs, F32, 1, SHAPE(hkv), 0);
    host_new(&al, F32, 1, SHAPE(hq), 0);
    double qs = cdt.code == TK_DL_INT ? 0.02 : 0.5;
    double *ksd = op_rand(&ks, qs * 0.5, qs), *vsd = op_rand(&vs, qs * 0.5, qs), *ad = op_rand(&al, 0.05, 0.5);
    double *kv[4], *vv[4];
    fill_cache(&kc, &pg, c->lens, nseq, hkv, d, c->bs, ksd, kv);
    fill_cache(&vc, &pg, c->lens, nseq, hkv, d, c->bs, vsd, vv);
    double *qd = op_rand(&q, -1.5, 1.5);
    tk_arg a[16] = {TA("out", &out.t),
                    TA("q", &q.t),
                    TA("k_cache", &kc.t),
                    TA("v_cache", &vc.t),
                    TA("block_table", &pg.bt.t),
                    TA("seq_lens", &pg.sl.t),
                    TA("lse", &lse.t)};
    size_t na = 7;
    if (quant) {
        a[na++] = TA("k_scale", &ks.t);
        a[na++] = TA("v_scale", &vs.t);
    }
    if (c->alibi)
        a[na++] = TA("alibi_slopes", &al.t);
    a[na++] = IA("window_left", c->wl);
    if (c->softcap != 0)
        a[na++] = FA("softcap", c->softcap);
    int ok = run("attention_decode", a, na, what);
    int64_t no = nseq * sq * hq * d, nl = nseq * hq * sq;
    double *ro = malloc(sizeof(double) * (size_t)no), *rl = malloc(sizeof(double) * (size_t)nl);
    opts_t o = {1.0 / sqrt((double)d), c->softcap, 1, c->wl, -1, c->alibi ? ad : NULL};
    for (int s = 0; s < nseq; s++)
        naive_attn(ro + s * sq * hq * d, rl + s * hq * sq, qd + s * sq * hq * d, kv[s], vv[s], sq, c->lens[s], hq, hkv,
                   d, d, &o);
    if (ok) {
        double *go = op_values(&out.t), *gl = op_values(&lse.t), atol, rtol;
        tol_of(qdt, &atol, &rtol);
        char w2[300];
        snprintf(w2, sizeof w2, "decode out %s", what);
        ok &= compare(w2, go, ro, no, atol, rtol);
        snprintf(w2, sizeof w2, "decode lse %s", what);
        ok &= compare(w2, gl, rl, nl, 1e-5, 1e-5);
        free(go);
        free(gl);
    }
    for (int s = 0; s < nseq; s++) {
        free(kv[s]);
        free(vv[s]);
    }
    free(ro);
    free(rl);
    free(qd);
    free(ksd);
    free(vsd);
    free(ad);
    host_t *all[] = {&kc, &vc, &q, &out, &lse, &ks, &vs, &al};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        host_free(all[i]);
    pages_free(&pg);
    return ok;
}

static void test_decode(void)
{
    /* lengths: partial last blocks, one block exactly, a single key, more keys than a chunk, and 3 < Sq = 4
     * (its first query sees nothing) */
    const int lens[][4] = {{37, 1, 150, 16}, {3, 70, 8, 129}};
    const int64_t bss[] = {8, 16, 32};
    int n = 0;
    for (int sqi = 0; sqi < 2; sqi++)
        for (int m = 0; m < 8; m++, n++) {
            dcase c = {sqi ? 4 : 1,
                       bss[n % 3],
                       head_cfgs[n % 4][0],
                       head_cfgs[n % 4][1],
                       n % 2 ? 64 : 16,
                       m & 1 ? 5 : -1,
                       (m >> 1) & 1,
                       m & 4 ? 4.0 : 0.0,
                       4,
                       {0}};
            memcpy(c.lens, lens[n % 2], sizeof c.lens);
            CHECK(decode_case(*all_dtypes[n % 3], *all_dtypes[n % 3], &c));
            CHECK(decode_case(n % 2 ? BF16 : F16, I8, &c));
            CHECK(decode_case(n % 2 ? F16 : F32, E4M3, &c));
        }
    /* D = 128 over many keys; a sequence of length 0 (padding: out 0, lse -inf) */
    dcase c = {2, 16, 8, 2, 128, -1, 0, 0.0, 3, {300, 0, 17, 0}};
    CHECK(decode_case(F32, F32, &c));
    CHECK(decode_case(BF16, E4M3, &c));
}

/* ---- paged_kv_append -------------------------------------------------------------------------- */

/* Appends the keys/values of 3 sequences (tokens in a shuffled order, plus skipped tokens with slot -1
 * holding huge values) into a cache of dtype cdt, checks every slot, then decodes over it. */
static int append_case(tk_dtype dt, tk_dtype cdt)
{
    char what[128];
    snprintf(what, sizeof what, "k %s cache %s", tk_ops__dtype_str(dt), tk_ops__dtype_str(cdt));
    const int lens[3] = {5, 20, 33};
    const int64_t bs = 8, hkv = 2, hq = 4, d = 16, nskip = 3;
    int quant = cdt.bits == 8, ok = 1;
    pages_t pg;
    pages_new(&pg, lens, 3, bs);
    int64_t ntok = 5 + 20 + 33 + nskip, nslots = pg.nblocks * bs;
    host_t kc, vc, k, v, sm, ks, vs;
    host_new(&kc, cdt, 4, SHAPE(pg.nblocks, bs, hkv, d), 0);
    host_new(&vc, cdt, 4, SHAPE(pg.nblocks, bs, hkv, d), 0);
    host_new(&k, dt, 3, SHAPE(ntok, hkv, d), 0);
    host_new(&v, dt, 3, SHAPE(ntok, hkv, d), 0);
    host_new(&sm, I64, 1, SHAPE(ntok), 0);
    host_new(&ks, F32, 1, SHAPE(hkv), 0);
    host_new(&vs, F32, 1, SHAPE(hkv), 0);
    /* head 0's scales make many values saturate (|x / scale| past 127 or 448) */
    float *ksf = ks.buf, *vsf = vs.buf;
    double big = cdt.code == TK_DL_INT ? 1.0 / 200 : 1.0 / 600, fine = cdt.code == TK_DL_INT ? 1.0 / 100 : 1.0 / 200;
    ksf[0] = (float)big;
    vsf[0] = (float)(big * 1.3);
    ksf[1] = (float)fine;
    vsf[1] = (float)(fine * 0.7);
    double *kd = op_rand(&k, -1, 1), *vd = op_rand(&v, -1, 1);
    /* token order: shuffled (sequence, position) pairs, then the skipped ones */
    int64_t *order = malloc(sizeof(int64_t) * (size_t)ntok), *owner = malloc(sizeof(int64_t) * (size_t)ntok);
    int64_t t = 0;
    for (int s = 0; s < 3; s++)
        for (int j = 0; j < lens[s]; j++)
            order[t++] = s * 1000 + j;
    shuffle(order, t);
    int64_t *slots = sm.buf;
    for (int64_t i = 0; i < ntok; i++) {
        if (i < t) {
            slots[i] = slot_of(&pg, (int)(order[i] / 1000), order[i] % 1000, bs);
        } else {
            slots[i] = -1 - (int64_t)i; /* skipped: any negative */
            for (int64_t e = 0; e < hkv * d; e++) {
                set(&k.t, i * hkv * d + e, 1000.0);
                set(&v.t, i * hkv * d + e, -1000.0);
            }
        }
        owner[i] = slots[i];
    }
    /* junk in every slot first */
    memset(kc.buf, 0x55, (size_t)(numel(&kc.t) * cdt.bits / 8));
    memset(vc.buf, 0x55, (size_t)(numel(&vc.t) * cdt.bits / 8));
    tk_arg a[7] = {TA("k_cache", &kc.t),      TA("v_cache", &vc.t), TA("k", &k.t),       TA("v", &v.t),
                   TA("slot_mapping", &sm.t), TA("k_scale", &ks.t), TA("v_scale", &vs.t)};
    ok &= run("paged_kv_append", a, quant ? 7 : 5, what);
    /* every slot: the token written there, quantised here, or the junk */
    int64_t *tok_at = malloc(sizeof(int64_t) * (size_t)nslots);
    for (int64_t s = 0; s < nslots; s++)
        tok_at[s] = -1;
    for (int64_t i = 0; i < ntok; i++)
        if (owner[i] >= 0)
            tok_at[owner[i]] = i;
    int64_t bad = 0;
    for (int64_t s = 0; ok && s < nslots; s++)
        for (int kvi = 0; kvi < 2; kvi++) {
            const host_t *cache = kvi ? &vc : &kc;
            const double *src = kvi ? vd : kd;
            const float *sc = kvi ? vsf : ksf;
            for (int64_t e = 0; e < hkv * d; e++) {
                int64_t ci = s * hkv * d + e, h = e / d;
                const uint8_t *raw = cache->buf;
                if (tok_at[s] < 0) {
                    int junk = cdt.bits == 8 ? raw[ci] == 0x55
                                             : memcmp(raw + ci * (cdt.bits / 8), "\x55\x55\x55\x55", cdt.bits / 8) == 0;
                    bad += !junk;
                    continue;
                }
                double x = src[tok_at[s] * hkv * d + e];
                if (!quant) { /* the same dtype, or f32 rounded to the 16-bit cache (nearest even) */
                    double want = cdt.bits == 16 && dt.bits == 32
                                      ? (cdt.code == TK_DL_BFLOAT ? tk_ops__bf16_to_f32(tk_ops__f32_to_bf16((float)x))
                                                                  : tk_ops__f16_to_f32(tk_ops__f32_to_f16((float)x)))
                                      : x;
                    bad += get(&cache->t, ci) != want;
                    continue;
                }
                double y = (float)((double)(float)x / (double)sc[h]); /* x / scale in fp32 */
                double want = cdt.code == TK_DL_INT ? fmin(127, fmax(-127, nearbyint(y))) : e4m3_round(y);
                double got = cdt.code == TK_DL_INT ? (double)(int8_t)raw[ci] : e4m3_decode(raw[ci]);
                if (got != want) {
                    if (bad < 5)
                        fprintf(stderr,
                                "  append %s: slot %lld elem %lld: x %.9g / scale %.9g = %.9g: stored %g, want %g\n",
                                what, (long long)s, (long long)e, x, (double)sc[h], y, got, want);
                    bad++;
                }
            }
        }
    if (bad)
        fprintf(stderr, "  append %s: %lld cache elements wrong (seed %llu)\n", what, (long long)bad,
                (unsigned long long)seed);
    ok &= bad == 0;

    /* decode over the appended cache, against attention on the dequantised values */
    if (ok) {
        host_t q, out, lse;
        host_new(&q, dt, 4, SHAPE(3, 1, hq, d), 0);
        host_new(&out, dt, 4, SHAPE(3, 1, hq, d), 0);
        host_new(&lse, F32, 3, SHAPE(3, hq, 1), 0);
        double *qd = op_rand(&q, -2, 2);
        tk_arg b[9] = {TA("out", &out.t),           TA("q", &q.t),
                       TA("k_cache", &kc.t),        TA("v_cache", &vc.t),
                       TA("block_table", &pg.bt.t), TA("seq_lens", &pg.sl.t),
                       TA("lse", &lse.t),           TA("k_scale", &ks.t),
                       TA("v_scale", &vs.t)};
        ok &= run("attention_decode", b, quant ? 9 : 7, what);
        double *ro = malloc(sizeof(double) * (size_t)(3 * hq * d)), *rl = malloc(sizeof(double) * (size_t)(3 * hq));
        opts_t o = {1.0 / sqrt((double)d), 0, 1, -1, -1, NULL};
        for (int s = 0; s < 3; s++) {
            double *kk = malloc(sizeof(double) * (size_t)(lens[s] * hkv * d)),
                   *vv = malloc(sizeof(double) * (size_t)(lens[s] * hkv * d));
            for (int64_t j = 0; j < lens[s]; j++)
                for (int64_t e = 0; e < hkv * d; e++) {
                    int64_t ci = slot_of(&pg, s, j, bs) * hkv * d + e, h = e / d;
                    const uint8_t *rk = kc.buf, *rv = vc.buf;
                    if (!quant) {
                        kk[j * hkv * d + e] = get(&kc.t, ci);
                        vv[j * hkv * d + e] = get(&vc.t, ci);
                    } else if (cdt.code == TK_DL_INT) {
                        kk[j * hkv * d + e] = (int8_t)rk[ci] * (double)ksf[h];
                        vv[j * hkv * d + e] = (int8_t)rv[ci] * (double)vsf[h];
                    } else {
                        kk[j * hkv * d + e] = e4m3_decode(rk[ci]) * (double)ksf[h];
                        vv[j * hkv * d + e] = e4m3_decode(rv[ci]) * (double)vsf[h];
                    }
                }
            naive_attn(ro + s * hq * d, rl + s * hq, qd + s * hq * d, kk, vv, 1, lens[s], hq, hkv, d, d, &o);
            free(kk);
            free(vv);
        }
        if (ok) {
            double *go = op_values(&out.t), *gl = op_values(&lse.t), atol, rtol;
            tol_of(dt, &atol, &rtol);
            char w2[200];
            snprintf(w2, sizeof w2, "decode after append out %s", what);
            ok &= compare(w2, go, ro, 3 * hq * d, atol, rtol);
            snprintf(w2, sizeof w2, "decode after append lse %s", what);
            ok &= compare(w2, gl, rl, 3 * hq, 1e-5, 1e-5);
            free(go);
            free(gl);
        }
        free(ro);
        free(rl);
        free(qd);
        host_free(&q);
        host_free(&out);
        host_free(&lse);
    }
    free(tok_at);
    free(order);
    free(owner);
    free(kd);
    free(vd);
    host_t *all[] = {&kc, &vc, &k, &v, &sm, &ks, &vs};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        host_free(all[i]);
    pages_free(&pg);
    return ok;
}

static void test_paged_kv_append(void)
{
    for (int t = 0; t < 3; t++) {
        CHECK(append_case(*all_dtypes[t], *all_dtypes[t]));
        CHECK(append_case(*all_dtypes[t], I8));
        CHECK(append_case(*all_dtypes[t], E4M3));
    }
    /* f32 keys and values into 16-bit caches (--kv-dtype f16 of an f32 model) */
    CHECK(append_case(F32, F16));
    CHECK(append_case(F32, BF16));
    /* the encoder written here against a few fixed points */
    CHECK(e4m3_round(448) == 448 && e4m3_round(1e9) == 448 && e4m3_round(-500) == -448);
    CHECK(e4m3_round(1.0625) == 1.0 && e4m3_round(1.1875) == 1.25 && e4m3_decode(0x01) == ldexp(1, -9));
}

/* ---- mla_decode ------------------------------------------------------------------------------- */

/* with_weights: build W_UK [Hq, Dn, R], W_UV [Hq, R, Dv], absorb W_UK into the query, and check that
 * out @ W_UV equals MHA over the decompressed per-head K = [W_UK c_kv, k_pe], V = c_kv W_UV. Else
 * check the latent output against attention over keys [c_kv, k_pe] and values c_kv directly. */
static int mla_case(tk_dtype dt, int with_weights)
{
    char what[64];
    snprintf(what, sizeof what, "%s %s", tk_ops__dtype_str(dt), with_weights ? "vs decompressed MHA" : "latent");
    const int lens[3] = {1, 45, 0};
    const int64_t hq = 4, r = 32, p = 8, dn = 16, dvh = 12, bs = 16, w = r + p;
    pages_t pg;
    pages_new(&pg, lens, 3, bs);
    host_t kv, qn, qp, out, lse;
    host_new(&kv, dt, 3, SHAPE(pg.nblocks, bs, w), 0);
    host_new(&qn, dt, 3, SHAPE(3, hq, r), 0);
    host_new(&qp, dt, 3, SHAPE(3, hq, p), 0);
    host_new(&out, dt, 3, SHAPE(3, hq, r), 0);
    host_new(&lse, F32, 2, SHAPE(3, hq), 0);
    fill_const(&kv, NAN);
    double *lat[3]; /* per sequence [len, R + P]: c_kv then k_pe */
    for (int s = 0; s < 3; s++) {
        lat[s] = malloc(sizeof(double) * (size_t)(lens[s] * w + 1));
        for (int64_t j = 0; j < lens[s]; j++)
            for (int64_t x = 0; x < w; x++) {
                int64_t e = slot_of(&pg, s, j, bs) * w + x;
                set(&kv.t, e, uniform(-1, 1));
                lat[s][j * w + x] = get(&kv.t, e);
            }
    }
    double *qpd = op_rand(&qp, -1, 1), *qnd;
    double *wuk = NULL, *wuv = NULL, *qfull = NULL, scale;
    if (with_weights) {
        scale = 1.0 / sqrt((double)(dn + p));
        wuk = malloc(sizeof(double) * (size_t)(hq * dn * r));
        wuv = malloc(sizeof(double) * (size_t)(hq * r * dvh));
        qfull = malloc(sizeof(double) * (size_t)(3 * hq * dn));
        for (int64_t i = 0; i < hq * dn * r; i++)
            wuk[i] = uniform(-0.5, 0.5);
        for (int64_t i = 0; i < hq * r * dvh; i++)
            wuv[i] = uniform(-0.5, 0.5);
        for (int64_t i = 0; i < 3 * hq * dn; i++)
            qfull[i] = uniform(-1, 1);
        /* q_nope[b, h, :] = W_UK[h]^T q[b, h, :] */
        for (int64_t b = 0; b < 3; b++)
            for (int64_t h = 0; h < hq; h++)
                for (int64_t c = 0; c < r; c++) {
                    double acc = 0;
                    for (int64_t x = 0; x < dn; x++)
                        acc += qfull[(b * hq + h) * dn + x] * wuk[(h * dn + x) * r + c];
                    set(&qn.t, (b * hq + h) * r + c, acc);
                }
        qnd = op_values(&qn.t);
    } else {
        scale = 0.15;
        qnd = op_rand(&qn, -2, 2);
    }
    tk_arg a[8] = {TA("out", &out.t),           TA("q_nope", &qn.t),      TA("q_pe", &qp.t), TA("kv_cache", &kv.t),
                   TA("block_table", &pg.bt.t), TA("seq_lens", &pg.sl.t), TA("lse", &lse.t), FA("scale", scale)};
    int ok = run("mla_decode", a, 8, what);
    double *got = op_values(&out.t), *gl = op_values(&lse.t);
    for (int64_t b = 0; ok && b < 3; b++) {
        int64_t L = lens[b];
        opts_t o = {scale, 0, 1, -1, -1, NULL};
        double rl[4], atol, rtol;
        char w2[160];
        if (with_weights) {
            /* explicit MHA: Q [1, Hq, Dn + P], K [L, Hq, Dn + P], V [L, Hq, Dv] */
            double *Q = malloc(sizeof(double) * (size_t)(hq * (dn + p))),
                   *K = malloc(sizeof(double) * (size_t)(L * hq * (dn + p) + 1)),
                   *V = malloc(sizeof(double) * (size_t)(L * hq * dvh + 1)),
                   *ro = malloc(sizeof(double) * (size_t)(hq * dvh)), *go = malloc(sizeof(double) * (size_t)(hq * dvh));
            for (int64_t h = 0; h < hq; h++) {
                for (int64_t x = 0; x < dn; x++)
                    Q[h * (dn + p) + x] = qfull[(b * hq + h) * dn + x];
                for (int64_t x = 0; x < p; x++)
                    Q[h * (dn + p) + dn + x] = qpd[(b * hq + h) * p + x];
                for (int64_t j = 0; j < L; j++) {
                    const double *c = lat[b] + j * w;
                    for (int64_t x = 0; x < dn; x++) {
                        double acc = 0;
                        for (int64_t cc = 0; cc < r; cc++)
                            acc += wuk[(h * dn + x) * r + cc] * c[cc];
                        K[(j * hq + h) * (dn + p) + x] = acc;
                    }
                    for (int64_t x = 0; x < p; x++)
                        K[(j * hq + h) * (dn + p) + dn + x] = c[r + x];
                    for (int64_t y = 0; y < dvh; y++) {
                        double acc = 0;
                        for (int64_t cc = 0; cc < r; cc++)
                            acc += c[cc] * wuv[(h * r + cc) * dvh + y];
                        V[(j * hq + h) * dvh + y] = acc;
                    }
                }
                /* the op's latent output, decompressed */
                for (int64_t y = 0; y < dvh; y++) {
                    double acc = 0;
                    for (int64_t cc = 0; cc < r; cc++)
                        acc += got[(b * hq + h) * r + cc] * wuv[(h * r + cc) * dvh + y];
                    go[h * dvh + y] = acc;
                }
            }
            naive_attn(ro, rl, Q, K, V, 1, L, hq, hq, dn + p, dvh, &o);
            tol_of(dt, &atol, &rtol);
            snprintf(w2, sizeof w2, "mla %s seq %lld out @ W_UV", what, (long long)b);
            ok &= compare(w2, go, ro, hq * dvh, atol * 4, rtol * 4);
            free(Q);
            free(K);
            free(V);
            free(ro);
            free(go);
        } else {
            double *Q = malloc(sizeof(double) * (size_t)(hq * w)), *V = malloc(sizeof(double) * (size_t)(L * r + 1)),
                   *ro = malloc(sizeof(double) * (size_t)(hq * r));
            for (int64_t h = 0; h < hq; h++) {
                memcpy(Q + h * w, qnd + (b * hq + h) * r, sizeof(double) * (size_t)r);
                memcpy(Q + h * w + r, qpd + (b * hq + h) * p, sizeof(double) * (size_t)p);
            }
            for (int64_t j = 0; j < L; j++)
                memcpy(V + j * r, lat[b] + j * w, sizeof(double) * (size_t)r);
            naive_attn(ro, rl, Q, lat[b], V, 1, L, hq, 1, w, r, &o);
            tol_of(dt, &atol, &rtol);
            snprintf(w2, sizeof w2, "mla %s seq %lld out", what, (long long)b);
            ok &= compare(w2, got + b * hq * r, ro, hq * r, atol, rtol);
            free(Q);
            free(V);
            free(ro);
        }
        snprintf(w2, sizeof w2, "mla %s seq %lld lse", what, (long long)b);
        ok &= compare(w2, gl + b * hq, rl, hq, 1e-5, 1e-5);
    }
    for (int s = 0; s < 3; s++)
        free(lat[s]);
    free(got);
    free(gl);
    free(qpd);
    free(qnd);
    free(wuk);
    free(wuv);
    free(qfull);
    host_t *all[] = {&kv, &qn, &qp, &out, &lse};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        host_free(all[i]);
    pages_free(&pg);
    return ok;
}

static void test_mla_decode(void)
{
    CHECK(mla_case(F32, 1));
    CHECK(mla_case(F32, 0));
    CHECK(mla_case(F16, 0));
    CHECK(mla_case(BF16, 0));
}

/* ---- registry and validation ------------------------------------------------------------------ */

static void test_registry(void)
{
    static const char *const names[5][19] = {
        {"attention", "out", "q", "k", "v", "lse", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "alibi_slopes",
         "scale", "causal", "window_left", "window_right", "softcap"},
        {"attention_backward", "dq", "dk", "dv", "dout", "q", "k", "v", "out", "lse", "alibi_slopes", "scale", "causal",
         "window_left", "window_right", "softcap", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q"},
        {"attention_decode", "out", "q", "k_cache", "v_cache", "block_table", "seq_lens", "lse", "k_scale", "v_scale",
         "alibi_slopes", "scale", "window_left", "softcap"},
        {"paged_kv_append", "k_cache", "v_cache", "k", "v", "slot_mapping", "k_scale", "v_scale"},
        {"mla_decode", "out", "q_nope", "q_pe", "kv_cache", "block_table", "seq_lens", "lse", "scale"},
    };
    for (int o = 0; o < 5; o++) {
        const tk_op_desc *op = tk_ops__find(names[o][0]);
        CHECK(op != NULL);
        if (!op)
            continue;
        CHECK_STR(op->family, "attention");
        CHECK_STR(op->package, "kernels-community/flash-attn");
        CHECK(op->cpu != NULL && op->check != NULL);
        size_t n = 0;
        while (n + 1 < 19 && names[o][n + 1])
            n++;
        CHECK_EQ_INT(op->nparams, n);
        for (size_t i = 0; i < n && i < op->nparams; i++)
            CHECK_STR(op->params[i].name, names[o][i + 1]);
    }
    /* defaults, optionality, roles */
    const tk_op_desc *op = tk_ops__find("attention");
    if (op) {
        CHECK(op->params[tk_ops__param_index(op, "window_left")].def == -1);
        CHECK(op->params[tk_ops__param_index(op, "window_right")].def == -1);
        CHECK(op->params[tk_ops__param_index(op, "scale")].def == 0);
        CHECK(op->params[tk_ops__param_index(op, "causal")].def == 0);
        CHECK(op->params[tk_ops__param_index(op, "softcap")].def == 0);
        CHECK(op->params[tk_ops__param_index(op, "max_seqlen_q")].def == 0);
        CHECK(op->params[tk_ops__param_index(op, "lse")].optional == 1);
        CHECK(op->params[tk_ops__param_index(op, "lse")].role == TK_OPS_OUT);
        CHECK(op->params[tk_ops__param_index(op, "cu_seqlens_q")].dtypes == TK_OPS_I32);
        CHECK(op->params[tk_ops__param_index(op, "k")].dtype_like == tk_ops__param_index(op, "q"));
    }
    op = tk_ops__find("paged_kv_append");
    if (op) {
        CHECK(op->params[0].role == TK_OPS_OUT && op->params[1].role == TK_OPS_OUT);
        CHECK(op->params[tk_ops__param_index(op, "slot_mapping")].dtypes == TK_OPS_I64);
        CHECK(op->params[0].dtypes == (TK_OPS_FLOATS | TK_OPS_I8 | TK_OPS_FP8_E4M3));
    }
    op = tk_ops__find("attention_backward");
    if (op)
        CHECK(op->params[tk_ops__param_index(op, "lse")].optional == 0);
    tk_buf b = TK_BUF_INIT;
    CHECK_RC(tk_ops__signature(&b, tk_ops__find("mla_decode")), TK_OK);
    CHECK_CONTAINS(b.data, "mla_decode(out: T[B, Hq, R], q_nope: T[B, Hq, R], q_pe: T[B, Hq, P]");
    CHECK_CONTAINS(b.data, "-> out, lse");
    tk__buf_free(&b);
}

/* Runs prepare (and the CPU reference when prepare passes) and wants TK_ERR_INVALID with `msg`. */
static int expect_invalid(const char *op, const tk_arg *a, size_t n, const char *msg)
{
    int rc = op_run_cpu(op, a, n);
    if (rc != TK_ERR_INVALID || !strstr(tk_last_error(), msg)) {
        fprintf(stderr, "  %s: rc %d, error \"%s\"; want TK_ERR_INVALID with \"%s\"\n", op, rc, tk_last_error(), msg);
        return 0;
    }
    return 1;
}

static void test_validation(void)
{
    host_t q, k, v, out, k3, lse, cu, cu3, q600, k600;
    host_new(&q, F32, 4, SHAPE(2, 5, 4, 8), 0);
    host_new(&out, F32, 4, SHAPE(2, 5, 4, 8), 0);
    host_new(&k, F32, 4, SHAPE(2, 6, 2, 8), 0);
    host_new(&v, F32, 4, SHAPE(2, 6, 2, 8), 0);
    host_new(&k3, F32, 4, SHAPE(2, 6, 3, 8), 0);
    host_new(&lse, F32, 3, SHAPE(2, 5, 4), 0);
    host_new(&cu, I32, 1, SHAPE(3), 0);
    host_new(&cu3, I32, 1, SHAPE(4), 0);
    host_new(&q600, F32, 4, SHAPE(1, 1, 1, 600), 0);
    host_new(&k600, F32, 4, SHAPE(1, 1, 1, 600), 0);
    tk_arg a[10] = {TA("out", &out.t), TA("q", &q.t), TA("k", &k3.t), TA("v", &k3.t)};
    CHECK(expect_invalid("attention", a, 4,
                         "attention: 'q' [2, 5, 4, 8] has 4 heads and 'k' [2, 6, 3, 8] has 3: want Hq % Hkv == 0"));
    a[2] = TA("k", &k.t);
    a[3] = TA("v", &v.t);
    a[4] = TA("lse", &lse.t);
    CHECK(expect_invalid("attention", a, 5, "attention: 'lse' has shape [2, 5, 4], want [2, 4, 5]"));
    a[4] = TA("cu_seqlens_q", &cu.t);
    CHECK(expect_invalid("attention", a, 5, "attention: 'cu_seqlens_q' is given without 'cu_seqlens_k'"));
    a[5] = TA("cu_seqlens_k", &cu3.t);
    CHECK(expect_invalid("attention", a, 6, "attention: 'cu_seqlens_k' has shape [4], want [3]"));
    a[5] = TA("cu_seqlens_k", &cu.t);
    CHECK(expect_invalid("attention", a, 6, "attention: 'q' has shape [2, 5, 4, 8], want B == 1 with cu_seqlens"));
    tk_arg c2[5] = {TA("out", &out.t), TA("q", &q.t), TA("k", &k.t), TA("v", &v.t), IA("window_left", -2)};
    CHECK(expect_invalid("attention", c2, 5, "attention: 'window_left' is -2, want >= 0 keys, or -1"));
    c2[4] = FA("softcap", -1);
    CHECK(expect_invalid("attention", c2, 5, "attention: 'softcap' is -1, want a finite value >= 0"));
    c2[4] = FA("scale", INFINITY);
    CHECK(expect_invalid("attention", c2, 5, "attention: 'scale' is inf, want a finite value"));
    c2[4] = FA("scale", 1e300); /* inf as f32 */
    CHECK(expect_invalid("attention", c2, 5, "attention: 'scale' is 1e+300, want a finite value as f32"));
    c2[4] = IA("causal", 2);
    CHECK(expect_invalid("attention", c2, 5, "attention: 'causal' is 2, want 0 or 1"));
    tk_arg big[4] = {TA("out", &q600.t), TA("q", &q600.t), TA("k", &k600.t), TA("v", &k600.t)};
    CHECK(expect_invalid("attention", big, 4, "head dim 600, want 1 to 512"));
    tk_arg kd[4] = {TA("out", &out.t), TA("q", &q.t), TA("k", &k600.t), TA("v", &k600.t)};
    CHECK(expect_invalid("attention", kd, 4, "attention: 'k' has shape [1, 1, 1, 600], want [2, Sk, Hkv, 8]"));

    /* varlen value checks (CPU) */
    host_t q1, o1, k1, cq, ck;
    host_new(&q1, F32, 4, SHAPE(1, 10, 2, 4), 0);
    host_new(&o1, F32, 4, SHAPE(1, 10, 2, 4), 0);
    host_new(&k1, F32, 4, SHAPE(1, 12, 2, 4), 0);
    host_new(&cq, I32, 1, SHAPE(3), 0);
    host_new(&ck, I32, 1, SHAPE(3), 0);
    int32_t *cqv = cq.buf, *ckv = ck.buf;
    cqv[0] = 0, cqv[1] = 6, cqv[2] = 4;
    ckv[0] = 0, ckv[1] = 6, ckv[2] = 12;
    tk_arg vl[7] = {
        TA("out", &o1.t),          TA("q", &q1.t),       TA("k", &k1.t), TA("v", &k1.t), TA("cu_seqlens_q", &cq.t),
        TA("cu_seqlens_k", &ck.t), IA("max_seqlen_q", 6)};
    CHECK(expect_invalid("attention", vl, 6, "attention: 'max_seqlen_q' is 0, want 1 to 10 with cu_seqlens"));
    CHECK(expect_invalid("attention", vl, 7,
                         "attention: 'cu_seqlens_q'[2] is 4, less than 'cu_seqlens_q'[1] = 6: want non-decreasing"));
    cqv[2] = 10;
    vl[6] = IA("max_seqlen_q", 5);
    CHECK(expect_invalid("attention", vl, 7, "sequence 0 has 6 queries"));
    vl[6] = IA("max_seqlen_q", 6);
    ckv[2] = 13;
    CHECK(expect_invalid("attention", vl, 7, "attention: 'cu_seqlens_k'[2] is 13, want 0 to 12 (the rows of 'k')"));
    ckv[2] = 12;
    tk_op_call call;
    CHECK_RC(tk_ops__prepare(&call, "attention", vl, 7), TK_OK);
    CHECK_RC(tk_ops__run_cpu(&call), TK_OK);

    /* decode */
    host_t dq, dout, dqb, doutb, kc, kc12, kci8, kcf16, bt, bt3, sl, ks, q17, sl3;
    host_new(&dq, F32, 4, SHAPE(2, 1, 4, 8), 0);
    host_new(&dout, F32, 4, SHAPE(2, 1, 4, 8), 0);
    host_new(&dqb, BF16, 4, SHAPE(2, 1, 4, 8), 0);
    host_new(&doutb, BF16, 4, SHAPE(2, 1, 4, 8), 0);
    host_new(&q17, F32, 4, SHAPE(2, 17, 4, 8), 0);
    host_new(&kc, F32, 4, SHAPE(4, 16, 2, 8), 0);
    host_new(&kc12, F32, 4, SHAPE(4, 12, 2, 8), 0);
    host_new(&kci8, I8, 4, SHAPE(4, 16, 2, 8), 0);
    host_new(&kcf16, F16, 4, SHAPE(4, 16, 2, 8), 0);
    host_new(&bt, I32, 2, SHAPE(2, 2), 0);
    host_new(&bt3, I32, 2, SHAPE(3, 2), 0);
    host_new(&sl, I32, 1, SHAPE(2), 0);
    host_new(&sl3, I32, 1, SHAPE(3), 0);
    host_new(&ks, F32, 1, SHAPE(2), 0);
    tk_arg d[8] = {TA("out", &dout.t),       TA("q", &dq.t),        TA("k_cache", &kc.t), TA("v_cache", &kc.t),
                   TA("block_table", &bt.t), TA("seq_lens", &sl.t), TA("k_scale", &ks.t), TA("v_scale", &ks.t)};
    CHECK(expect_invalid(
        "attention_decode", d, 7,
        "attention_decode: 'k_scale' is given but 'k_cache' is f32; the scales are for i8 and fp8_e4m3"));
    d[2] = TA("k_cache", &kci8.t);
    d[3] = TA("v_cache", &kci8.t);
    CHECK(expect_invalid("attention_decode", d, 6, "attention_decode: 'k_scale' is missing: 'k_cache' is i8"));
    CHECK(expect_invalid("attention_decode", d, 7, "attention_decode: 'v_scale' is missing"));
    d[2] = TA("k_cache", &kcf16.t);
    d[3] = TA("v_cache", &kcf16.t);
    CHECK_RC(tk_ops__prepare(&call, "attention_decode", d, 6), TK_OK); /* a 16-bit cache under f32 q */
    d[0] = TA("out", &doutb.t);
    d[1] = TA("q", &dqb.t);
    CHECK(expect_invalid("attention_decode", d, 6,
                         "attention_decode: 'k_cache' has dtype f16, want bf16 (the dtype of 'q') or i8 / fp8_e4m3"));
    d[2] = TA("k_cache", &kc.t);
    d[3] = TA("v_cache", &kc.t);
    CHECK(expect_invalid("attention_decode", d, 6, /* never a wider cache */
                         "attention_decode: 'k_cache' has dtype f32, want bf16 (the dtype of 'q') or i8 / fp8_e4m3"));
    d[0] = TA("out", &dout.t);
    d[1] = TA("q", &dq.t);
    d[2] = TA("k_cache", &kc12.t);
    d[3] = TA("v_cache", &kc12.t);
    CHECK(expect_invalid("attention_decode", d, 6, "block_size 12, want a power of two from 8 to 256"));
    d[2] = TA("k_cache", &kc.t);
    d[3] = TA("v_cache", &kc.t);
    d[4] = TA("block_table", &bt3.t);
    CHECK(expect_invalid("attention_decode", d, 6,
                         "attention_decode: 'block_table' has shape [3, 2], want [2, max_blocks_per_seq]"));
    d[4] = TA("block_table", &bt.t);
    d[5] = TA("seq_lens", &sl3.t);
    CHECK(expect_invalid("attention_decode", d, 6, "attention_decode: 'seq_lens' has shape [3], want [2]"));
    d[5] = TA("seq_lens", &sl.t);
    d[0] = TA("out", &q17.t);
    d[1] = TA("q", &q17.t);
    CHECK(expect_invalid("attention_decode", d, 6, "17 new tokens per sequence, want 1 to 16"));
    d[0] = TA("out", &dout.t);
    d[1] = TA("q", &dq.t);
    int32_t *btv = bt.buf, *slv = sl.buf;
    btv[0] = 3, btv[1] = 1, btv[2] = 0, btv[3] = 9;
    slv[0] = 20, slv[1] = 33;
    CHECK(expect_invalid("attention_decode", d, 6, "attention_decode: 'seq_lens'[1] is 33, want 0 to 32"));
    slv[1] = 17;
    CHECK(expect_invalid("attention_decode", d, 6,
                         "attention_decode: 'block_table'[1, 1] is 9, want a block of the cache, 0 to 3"));
    slv[1] = 16; /* the junk id 9 is in a logical block no key uses */
    CHECK_RC(tk_ops__prepare(&call, "attention_decode", d, 6), TK_OK);
    CHECK_RC(tk_ops__run_cpu(&call), TK_OK);

    /* paged_kv_append */
    host_t nk, sm, sm2, kcq;
    host_new(&nk, F32, 3, SHAPE(3, 2, 8), 0);
    host_new(&sm, I64, 1, SHAPE(3), 0);
    host_new(&sm2, I64, 1, SHAPE(2), 0);
    host_new(&kcq, E4M3, 4, SHAPE(4, 16, 2, 8), 0);
    int64_t *smv = sm.buf;
    smv[0] = 5, smv[1] = -1, smv[2] = 64;
    tk_arg p[7] = {TA("k_cache", &kc.t),      TA("v_cache", &kc.t), TA("k", &nk.t),      TA("v", &nk.t),
                   TA("slot_mapping", &sm.t), TA("k_scale", &ks.t), TA("v_scale", &ks.t)};
    CHECK(
        expect_invalid("paged_kv_append", p, 5,
                       "paged_kv_append: 'slot_mapping'[2] is 64, want a slot below 64 (num_blocks 4 * block_size 16"));
    smv[2] = 5;
    CHECK(expect_invalid("paged_kv_append", p, 5, "paged_kv_append: 'slot_mapping' gives slot 5 to tokens 0 and 2"));
    smv[2] = 6;
    CHECK_RC(tk_ops__prepare(&call, "paged_kv_append", p, 5), TK_OK);
    CHECK_RC(tk_ops__run_cpu(&call), TK_OK);
    p[0] = TA("k_cache", &kcq.t);
    p[1] = TA("v_cache", &kcq.t);
    float *ksv = ks.buf;
    ksv[0] = 1, ksv[1] = 0;
    CHECK(expect_invalid("paged_kv_append", p, 7, "paged_kv_append: 'k_scale'[1] is 0, want a finite scale > 0"));
    ksv[1] = 0.5f;
    CHECK_RC(tk_ops__prepare(&call, "paged_kv_append", p, 7), TK_OK);
    CHECK_RC(tk_ops__run_cpu(&call), TK_OK);
    p[4] = TA("slot_mapping", &sm2.t);
    CHECK(expect_invalid("paged_kv_append", p, 7, "paged_kv_append: 'slot_mapping' has shape [2], want [3]"));
    p[4] = TA("slot_mapping", &sm.t);
    p[2] = TA("k", &dq.t);
    CHECK(expect_invalid("paged_kv_append", p, 7, "paged_kv_append: 'k' has rank 4"));

    /* mla_decode */
    host_t mq, mp, mkv, mkvbad, mo;
    host_new(&mq, BF16, 3, SHAPE(2, 4, 32), 0);
    host_new(&mo, BF16, 3, SHAPE(2, 4, 32), 0);
    host_new(&mp, BF16, 3, SHAPE(2, 4, 8), 0);
    host_new(&mkv, BF16, 3, SHAPE(4, 16, 40), 0);
    host_new(&mkvbad, BF16, 3, SHAPE(4, 16, 32), 0);
    tk_arg m[6] = {TA("out", &mo.t),          TA("q_nope", &mq.t),      TA("q_pe", &mp.t),
                   TA("kv_cache", &mkvbad.t), TA("block_table", &bt.t), TA("seq_lens", &sl.t)};
    CHECK(expect_invalid("mla_decode", m, 6,
                         "mla_decode: 'kv_cache' has shape [4, 16, 32], want [num_blocks, block_size, 40]"));
    m[3] = TA("kv_cache", &mkv.t);
    m[2] = TA("q_pe", &mq.t);
    CHECK(expect_invalid("mla_decode", m, 6, "want [num_blocks, block_size, 64]"));
    m[2] = TA("q_pe", &mp.t);
    m[1] = TA("q_nope", &q1.t);
    CHECK(expect_invalid("mla_decode", m, 6, "mla_decode: 'q_nope' has rank 4"));
    m[1] = TA("q_nope", &mq.t);
    CHECK_RC(tk_ops__prepare(&call, "mla_decode", m, 6), TK_OK);
    CHECK_RC(tk_ops__run_cpu(&call), TK_OK);

    /* backward: lse is required; a non-contiguous tensor is refused */
    tk_arg bw[8] = {TA("dq", &q.t), TA("dk", &k.t), TA("dv", &v.t), TA("dout", &q.t),
                    TA("q", &q.t),  TA("k", &k.t),  TA("v", &v.t),  TA("out", &out.t)};
    CHECK(expect_invalid("attention_backward", bw, 8, "attention_backward: missing argument 'lse'"));
    int64_t strides[4] = {160, 32, 8, 2};
    host_t qs;
    host_new(&qs, F32, 4, SHAPE(2, 5, 4, 16), 0);
    qs.shape[3] = 8;
    qs.t.strides = strides;
    tk_arg ns[4] = {TA("out", &out.t), TA("q", &qs.t), TA("k", &k.t), TA("v", &v.t)};
    CHECK(expect_invalid("attention", ns, 4, "attention: 'q' (shape [2, 5, 4, 8]) is not contiguous"));

    host_t *all[] = {&q,  &k,   &v,   &out,  &k3,  &lse,   &cu,  &cu3,  &q600, &k600,  &q1,     &o1,  &k1,
                     &cq, &ck,  &dq,  &dout, &dqb, &doutb, &kc,  &kc12, &kci8, &kcf16, &bt,     &bt3, &sl,
                     &ks, &q17, &sl3, &nk,   &sm,  &sm2,   &kcq, &mq,   &mp,   &mkv,   &mkvbad, &mo,  &qs};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        host_free(all[i]);
}

int main(void)
{
    op_test_seed();
    RUN(test_registry);
    RUN(test_attention_masks);
    RUN(test_attention_dims);
    RUN(test_fully_masked);
    RUN(test_attention_varlen);
    RUN(test_backward);
    RUN(test_backward_finite_differences);
    RUN(test_decode);
    RUN(test_paged_kv_append);
    RUN(test_mla_decode);
    RUN(test_validation);
    return th_done();
}
