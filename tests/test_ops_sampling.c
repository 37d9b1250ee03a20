/*
 * test_ops_sampling.c — the sampling ops (ops/sampling.c) against independent computations:
 *   argmax: a plain scan in double (ties: lowest index; NaN wins) over rows of 1 to 300000 values.
 *   sample: the empirical distribution over many rows (one draw each, independent Philox counters)
 *     against float64 probabilities after temperature, top-k and top-p (chi-square, and filtered
 *     tokens never drawn); exact tokens where the weights are equal, predicted with this file's own
 *     Philox-4x32-10 (checked against Random123's known answers); greedy, top-k = 1 and tiny top-p
 *     against argmax; determinism per seed and offset; NaN / +inf / all -inf rows; per-row tensors;
 *     the validation messages.
 *
 * Uses only ops/ and common/. Inputs are random with a seed printed on any failure; set TK_TEST_SEED
 * to replay one.
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

static int64_t *ids(host_t *h) { return h->buf; }

/* ---- an independent Philox-4x32-10 (Salmon et al., SC'11), from the paper's definition ---------- */

static void philox_ref(uint32_t x[4], uint32_t k0, uint32_t k1)
{
    for (int round = 0; round < 10; round++) {
        if (round) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        uint64_t a = (uint64_t)0xD2511F53u * x[0], b = (uint64_t)0xCD9E8D57u * x[2];
        uint32_t y0 = (uint32_t)(b >> 32) ^ x[1] ^ k0, y1 = (uint32_t)b, y2 = (uint32_t)(a >> 32) ^ x[3] ^ k1,
                 y3 = (uint32_t)a;
        x[0] = y0;
        x[1] = y1;
        x[2] = y2;
        x[3] = y3;
    }
}

/* sample's documented draw: key = seed, counter = (row, offset); r = out[1]:out[0]. */
static uint64_t draw_ref(uint64_t sd, uint64_t row, uint64_t offset)
{
    uint32_t x[4] = {(uint32_t)row, (uint32_t)(row >> 32), (uint32_t)offset, (uint32_t)(offset >> 32)};
    philox_ref(x, (uint32_t)sd, (uint32_t)(sd >> 32));
    return ((uint64_t)x[1] << 32) | x[0];
}

/* ---- calling the ops -------------------------------------------------------------------------- */

typedef struct {
    double temperature, top_p;
    int64_t top_k, seed, offset;
    const tk_tensor *temperatures, *top_ks, *top_ps, *seeds;
} sopts;

static sopts defaults(void) { return (sopts){1.0, 1.0, 0, 0, 0, NULL, NULL, NULL, NULL}; }

static int run_sample(host_t *out, host_t *logits, const sopts *o)
{
    tk_arg a[11];
    size_t n = 0;
    a[n++] = (tk_arg){TK_ARG_TENSOR, "out", &out->t, 0, 0};
    a[n++] = (tk_arg){TK_ARG_TENSOR, "logits", &logits->t, 0, 0};
    a[n++] = (tk_arg){TK_ARG_F64, "temperature", NULL, 0, o->temperature};
    a[n++] = (tk_arg){TK_ARG_I64, "top_k", NULL, o->top_k, 0};
    a[n++] = (tk_arg){TK_ARG_F64, "top_p", NULL, 0, o->top_p};
    a[n++] = (tk_arg){TK_ARG_I64, "seed", NULL, o->seed, 0};
    a[n++] = (tk_arg){TK_ARG_I64, "offset", NULL, o->offset, 0};
    if (o->temperatures)
        a[n++] = (tk_arg){TK_ARG_TENSOR, "temperatures", o->temperatures, 0, 0};
    if (o->top_ks)
        a[n++] = (tk_arg){TK_ARG_TENSOR, "top_ks", o->top_ks, 0, 0};
    if (o->top_ps)
        a[n++] = (tk_arg){TK_ARG_TENSOR, "top_ps", o->top_ps, 0, 0};
    if (o->seeds)
        a[n++] = (tk_arg){TK_ARG_TENSOR, "seeds", o->seeds, 0, 0};
    int rc = op_run_cpu("sample", a, n);
    if (rc != TK_OK)
        fprintf(stderr, "  sample: rc %d: %s (seed %llu)\n", rc, tk_last_error(), (unsigned long long)seed);
    return rc;
}

static int run_argmax(host_t *out, host_t *in)
{
    tk_arg a[2] = {{TK_ARG_TENSOR, "out", &out->t, 0, 0}, {TK_ARG_TENSOR, "input", &in->t, 0, 0}};
    int rc = op_run_cpu("argmax", a, 2);
    if (rc != TK_OK)
        fprintf(stderr, "  argmax: rc %d: %s (seed %llu)\n", rc, tk_last_error(), (unsigned long long)seed);
    return rc;
}

/* ---- float64 references ----------------------------------------------------------------------- */

/* argmax in double: the first NaN, else the first of the largest (-0 == +0). */
static int64_t ref_argmax(const double *x, int64_t v)
{
    int64_t best = 0;
    for (int64_t i = 0; i < v; i++) {
        if (isnan(x[i]))
            return i;
        if (x[i] > x[best])
            best = i;
    }
    return best;
}

static int cmp_desc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The probabilities HF's warpers give (temperature, top-k keeping ties, top-p keeping the fewest most
 * likely tokens whose mass reaches p, of a tie the highest indices first), in double. NaN logits are
 * -inf. T > 0. */
static void ref_probs(double *prob, const double *x, int64_t v, double t, int64_t k, double p)
{
    double *z = malloc(sizeof(double) * (size_t)v), *s = malloc(sizeof(double) * (size_t)v);
    double zmax = -INFINITY, kth = -INFINITY, sum = 0;
    for (int64_t i = 0; i < v; i++) {
        z[i] = isnan(x[i]) ? -INFINITY : x[i] / t;
        zmax = z[i] > zmax ? z[i] : zmax;
        s[i] = z[i];
    }
    if (k > 0 && k < v) {
        qsort(s, (size_t)v, sizeof *s, cmp_desc);
        kth = s[k - 1];
    }
    for (int64_t i = 0; i < v; i++) {
        prob[i] = z[i] >= kth && z[i] > -INFINITY ? exp(z[i] - zmax) : 0;
        sum += prob[i];
    }
    for (int64_t i = 0; i < v; i++)
        prob[i] /= sum;
    if (p < 1) {
        /* HF's order: most likely first, and of equal ones the highest index first (its stable
         * ascending sort drops the lowest indices of a tie first); keep the shortest prefix whose mass
         * reaches p. Selection by repeated scans: v is small wherever top_p < 1 here. */
        char *kept = calloc((size_t)v, 1);
        double cum = 0;
        while (cum < p) {
            int64_t best = -1;
            for (int64_t i = v - 1; i >= 0; i--)
                if (!kept[i] && prob[i] > 0 && (best < 0 || prob[i] > prob[best]))
                    best = i;
            if (best < 0)
                break;
            kept[best] = 1;
            cum += prob[best];
        }
        sum = 0;
        for (int64_t i = 0; i < v; i++) {
            prob[i] = kept[i] ? prob[i] : 0;
            sum += prob[i];
        }
        free(kept);
        for (int64_t i = 0; i < v; i++)
            prob[i] /= sum;
    }
    free(z);
    free(s);
}

/* A top-p halfway between two consecutive cumulative masses of the top-k distribution, so float
 * rounding cannot move a token across the boundary; `which` picks the gap (1 = after the top token). */
static double safe_top_p(const double *x, int64_t v, double t, int64_t k, int which)
{
    double *pr = malloc(sizeof(double) * (size_t)v);
    ref_probs(pr, x, v, t, k, 1.0);
    qsort(pr, (size_t)v, sizeof *pr, cmp_desc);
    double cum = 0, p = 0.5;
    for (int64_t j = 0; j + 1 < v; j++) {
        cum += pr[j];
        if (j + 1 == which) {
            p = cum + pr[j + 1] / 2;
            break;
        }
    }
    free(pr);
    return p;
}

/* Wilson-Hilferty: the chi-square quantile for df degrees of freedom at a one-sided z (4.75: ~1e-6). */
static double chi2_crit(int df)
{
    double a = 2.0 / (9.0 * df);
    return df * pow(1 - a + 4.75 * sqrt(a), 3);
}

/* Draws of rows [r0, r0 + n) of out against prob: filtered tokens never drawn, and a chi-square over
 * the bins with expected count >= 5 (the rest pooled). */
static int check_distribution(const int64_t *got, int64_t n, const double *prob, int64_t v, const char *what)
{
    int64_t *count = calloc((size_t)v, sizeof *count), stray = 0;
    for (int64_t i = 0; i < n; i++) {
        if (got[i] < 0 || got[i] >= v || prob[got[i]] == 0)
            stray++;
        else
            count[got[i]]++;
    }
    double chi = 0, pooled_e = 0, pooled_c = 0;
    int bins = 0;
    for (int64_t i = 0; i < v; i++) {
        double e = prob[i] * (double)n;
        if (prob[i] == 0)
            continue;
        if (e < 5) {
            pooled_e += e;
            pooled_c += (double)count[i];
            continue;
        }
        chi += ((double)count[i] - e) * ((double)count[i] - e) / e;
        bins++;
    }
    if (pooled_e >= 5) {
        chi += (pooled_c - pooled_e) * (pooled_c - pooled_e) / pooled_e;
        bins++;
    }
    int ok = stray == 0 && (bins < 2 || chi <= chi2_crit(bins - 1));
    if (!ok) {
        fprintf(stderr,
                "  sample %s: %lld draws outside the kept set; chi-square %.2f over %d bins (limit %.2f); "
                "seed %llu\n   token: expected / got\n",
                what, (long long)stray, chi, bins, bins > 1 ? chi2_crit(bins - 1) : 0.0, (unsigned long long)seed);
        for (int64_t i = 0; i < v; i++)
            fprintf(stderr, "   %3lld: %10.1f / %lld\n", (long long)i, prob[i] * (double)n, (long long)count[i]);
    }
    free(count);
    return ok;
}

/* Distinct logits (spaced 0.37 apart before jitter, shuffled) so that no two tokens tie in any dtype
 * and no probability sits on a top-k or top-p boundary. */
static void fill_distinct(host_t *h, int64_t rows, int64_t v, double *x)
{
    for (int64_t i = 0; i < v; i++)
        x[i] = -1.5 + 0.37 * (double)i + uniform(0, 0.05);
    for (int64_t i = v - 1; i > 0; i--) {
        int64_t j = (int64_t)(next_u64() % (uint64_t)(i + 1));
        double t = x[i];
        x[i] = x[j];
        x[j] = t;
    }
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < v; i++)
            set(&h->t, r * v + i, x[i]);
    for (int64_t i = 0; i < v; i++)
        x[i] = get(&h->t, i); /* as stored */
}

/* ---- tests ------------------------------------------------------------------------------------ */

static void test_registry(void)
{
    const char *names[] = {"argmax", "sample"};
    for (size_t i = 0; i < 2; i++) {
        const tk_op_desc *op = tk_ops__find(names[i]);
        CHECK(op != NULL);
        if (!op)
            continue;
        CHECK_STR(op->family, "sampling");
        CHECK_STR(op->package, "kernels-community/sampling");
    }
    tk_buf b = TK_BUF_INIT;
    CHECK_RC(tk_ops__signature(&b, tk_ops__find("argmax")), TK_OK);
    CHECK_STR(b.data, "argmax(out: i64[...], input: f32|f16|bf16[..., v]) -> out");
    tk__buf_free(&b);
    CHECK_RC(tk_ops__signature(&b, tk_ops__find("sample")), TK_OK);
    CHECK_STR(b.data, "sample(out: i64[b], logits: f32|f16|bf16[b, v], temperature: f64 = 1, top_k: i64 = 0, "
                      "top_p: f64 = 1, seed: i64 = 0, offset: i64 = 0, temperatures: f32[b]?, top_ks: i32[b]?, "
                      "top_ps: f32[b]?, seeds: i64[b]?) -> out");
    tk__buf_free(&b);
}

/* Random123's known answers for philox4x32_10 (counter, key -> output), for this file's Philox. */
static void test_philox_known_answers(void)
{
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d, 0x41c83b0e, 0xa20bc7c6,
         0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09, 0x94fdcceb, 0x5001e420,
         0x24126ea1},
    };
    for (int i = 0; i < 3; i++) {
        uint32_t x[4] = {kat[i][0], kat[i][1], kat[i][2], kat[i][3]};
        philox_ref(x, kat[i][4], kat[i][5]);
        for (int j = 0; j < 4; j++)
            CHECK_EQ_INT(x[j], kat[i][6 + j]);
    }
}

/* argmax against the double scan: lengths 1 to 300000, leading dims, strides, every dtype. */
static void test_argmax_random(void)
{
    static const int64_t shapes[][4] = {{1, 1}, {1, 7}, {2, 5, 1}, {2, 3, 1000}, {3, 2, 2, 33}, {2, 2, 300000}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t k = 0; k < 3; k++)
            for (int pad = 0; pad < 2; pad++) {
                int nd = (int)shapes[s][0];
                const int64_t *sh = shapes[s] + 1;
                int64_t v = sh[nd - 1];
                host_t x, out;
                host_new(&x, *all_dtypes[k], nd, sh, pad ? 3 : 0);
                host_new(&out, I64, nd - 1, sh, 0);
                int64_t n = numel(&x.t), rows = n / v;
                double *xd = op_rand(&x, -50, 50);
                CHECK_RC(run_argmax(&out, &x), TK_OK);
                op_cmp c = op_cmp_begin(0, 0, "argmax %s %s%s, index per row", tk_ops__dtype_str(x.t.dtype),
                                        tk_ops__shape_fmt(nd, sh), pad ? " strided" : "");
                for (int64_t r = 0; r < rows; r++)
                    op_cmp_exact(&c, r, (double)ids(&out)[r], (double)ref_argmax(xd + r * v, v));
                CHECK(op_cmp_end(&c));
                free(xd);
                host_free(&x);
                host_free(&out);
            }
}

/* Ties give the lowest index; NaN wins (the first NaN, even over +inf); -0 equals +0; an all -inf row
 * gives 0. */
static void test_argmax_ties_and_nan(void)
{
    const int64_t sh[2] = {6, 5};
    static const double rows[6][5] = {{1, 7, 3, 7, 7},
                                      {-INFINITY, INFINITY, NAN, INFINITY, NAN},
                                      {-0.0, 0.0, -1, -2, -3},
                                      {-1, 0.0, -0.0, -5, 0.0},
                                      {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY},
                                      {2, 2, 2, 2, 2}};
    static const int64_t want[6] = {1, 2, 0, 1, 0, 0};
    for (size_t k = 0; k < 3; k++) {
        host_t x, out;
        host_new(&x, *all_dtypes[k], 2, sh, 0);
        host_new(&out, I64, 1, sh, 0);
        for (int r = 0; r < 6; r++)
            for (int c = 0; c < 5; c++)
                set(&x.t, r * 5 + c, rows[r][c]);
        CHECK_RC(run_argmax(&out, &x), TK_OK);
        for (int r = 0; r < 6; r++)
            CHECK_EQ_INT(ids(&out)[r], want[r]);
        host_free(&x);
        host_free(&out);
    }
    /* a 1-D input gives a rank-0 output; a planted late tie in a long row */
    int64_t v = 300000;
    host_t x, out;
    host_new(&x, BF16, 1, &v, 0);
    host_new(&out, I64, 0, &v, 0);
    for (int64_t i = 0; i < v; i++)
        set(&x.t, i, uniform(-10, 10));
    set(&x.t, 123457, 100);
    set(&x.t, 299999, 100);
    CHECK_RC(run_argmax(&out, &x), TK_OK);
    CHECK_EQ_INT(ids(&out)[0], 123457);
    host_free(&x);
    host_free(&out);
}

/* Equal weights make the draw exact: with m kept tokens of equal weight, the token is the
 * floor(r * m / 2^64)-th of them, r from this file's Philox. Also checks ties at the top-k boundary
 * (all kept), +inf (only the +inf tokens), NaN (never), and the counter layout of per-row seeds. */
static void test_exact_draws(void)
{
    enum { B = 64, V = 4 };
    const int64_t sh[2] = {B, V};
    static const struct {
        double x[V];
        int64_t top_k;
        int kept[V], m;
    } cases[] = {
        {{0.5, 0.5, 0.5, 0.5}, 0, {0, 1, 2, 3}, 4},
        {{1, 3, 3, 2}, 2, {1, 2}, 2},
        {{3, 1, 3, 3}, 2, {0, 2, 3}, 3},          /* top_k 2, but the 2nd largest ties with 2 more */
        {{INFINITY, 0, INFINITY, 5}, 0, {0, 2}, 2},
        {{NAN, 1, NAN, 1}, 0, {1, 3}, 2},
        {{-INFINITY, 7, -INFINITY, -INFINITY}, 0, {1}, 1},
    };
    for (size_t cs = 0; cs < sizeof cases / sizeof cases[0]; cs++)
        for (size_t k = 0; k < 3; k++)
            for (int per_row_seed = 0; per_row_seed < 2; per_row_seed++) {
                host_t x, out, seeds;
                const int64_t b = B;
                host_new(&x, *all_dtypes[k], 2, sh, 0);
                host_new(&out, I64, 1, sh, 0);
                host_new(&seeds, I64, 1, &b, 0);
                for (int r = 0; r < B; r++) {
                    for (int c = 0; c < V; c++)
                        set(&x.t, r * V + c, cases[cs].x[c]);
                    ids(&seeds)[r] = (int64_t)(next_u64() >> (r % 3 ? 0 : 1)); /* some negative */
                }
                sopts o = defaults();
                o.temperature = uniform(0.3, 3);
                o.top_k = cases[cs].top_k;
                o.seed = (int64_t)next_u64();
                o.offset = (int64_t)(next_u64() >> 20);
                o.seeds = per_row_seed ? &seeds.t : NULL;
                CHECK_RC(run_sample(&out, &x, &o), TK_OK);
                for (int r = 0; r < B; r++) {
                    uint64_t rr = per_row_seed ? draw_ref((uint64_t)ids(&seeds)[r], 0, (uint64_t)o.offset)
                                               : draw_ref((uint64_t)o.seed, (uint64_t)r, (uint64_t)o.offset);
                    /* floor(r * m / 2^64): m * 2^32 mass, target / 2^32 */
                    uint64_t idx = (uint64_t)(((unsigned __int128)rr * (unsigned)cases[cs].m) >> 64);
                    int64_t want = cases[cs].kept[idx];
                    if (ids(&out)[r] != want) {
                        fprintf(stderr, "  exact draw case %zu %s row %d%s: got %lld want %lld (seed %llu)\n", cs,
                                tk_ops__dtype_str(x.t.dtype), r, per_row_seed ? " (per-row seed)" : "",
                                (long long)ids(&out)[r], (long long)want, (unsigned long long)seed);
                        CHECK(0);
                        break;
                    }
                }
                host_free(&x);
                host_free(&out);
                host_free(&seeds);
            }
}

/* The weights themselves: rows [0, d] with d spread over [-23, 0] (and below), T = 1. Token 1 is drawn
 * iff target = floor(r * S / 2^64) >= W0 = 2^32, with S = 2^32 + W1 and W1 = e^d * 2^32 (float64 here);
 * rows where target is within 2e-6 of S from that boundary are skipped (the op computes e^d in fp32).
 * Below d = -23 the weight is 0 and token 1 is never drawn. */
static void test_weights(void)
{
    enum { B = 200000 };
    const int64_t sh[2] = {B, 2};
    host_t x, out;
    host_new(&x, F32, 2, sh, 0);
    host_new(&out, I64, 1, sh, 0);
    for (int64_t r = 0; r < B; r++) {
        set(&x.t, r * 2, 0.0);
        set(&x.t, r * 2 + 1, r < B - 100 ? -23.0 * pow(uniform(0, 1), 3) : uniform(-40, -23.0001));
    }
    sopts o = defaults();
    o.seed = (int64_t)next_u64();
    o.offset = 3;
    CHECK_RC(run_sample(&out, &x, &o), TK_OK);
    int64_t checked = 0, wrong = 0;
    for (int64_t r = 0; r < B; r++) {
        double d = get(&x.t, r * 2 + 1), w1 = d >= -23 ? floor(exp(d) * 0x1p32) : 0, s = 0x1p32 + w1;
        double target = ldexp((double)draw_ref((uint64_t)o.seed, (uint64_t)r, 3), -64) * s;
        if (fabs(target - 0x1p32) < 2e-6 * s)
            continue;
        checked++;
        if (ids(&out)[r] != (target >= 0x1p32 ? 1 : 0)) {
            if (!wrong)
                fprintf(stderr, "  weights: row %lld d %.9g: got token %lld (seed %llu)\n", (long long)r, d,
                        (long long)ids(&out)[r], (unsigned long long)seed);
            wrong++;
        }
    }
    CHECK(wrong == 0 && checked > B * 9 / 10);
    host_free(&x);
    host_free(&out);
}

/* Rows with nothing above -inf give -1 in every mode; greedy ignores NaN (unlike argmax). */
static void test_degenerate_rows(void)
{
    const int64_t sh[2] = {3, 4};
    host_t x, out;
    host_new(&x, F32, 2, sh, 0);
    host_new(&out, I64, 1, sh, 0);
    static const double rows[3][4] = {
        {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, {NAN, -INFINITY, NAN, NAN}, {NAN, 1, 2, 2}};
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 4; c++)
            set(&x.t, r * 4 + c, rows[r][c]);
    for (int mode = 0; mode < 4; mode++) {
        sopts o = defaults();
        o.temperature = mode == 0 ? 0.0 : 1.0;
        o.top_k = mode == 2 ? 1 : 0;
        o.top_p = mode == 3 ? 0.5 : 1.0;
        CHECK_RC(run_sample(&out, &x, &o), TK_OK);
        CHECK_EQ_INT(ids(&out)[0], -1);
        CHECK_EQ_INT(ids(&out)[1], -1);
        if (mode == 0)
            CHECK_EQ_INT(ids(&out)[2], 2); /* greedy: the first of the tied 2s; NaN is -inf */
        else
            CHECK(ids(&out)[2] >= 1 && ids(&out)[2] <= 3);
    }
    /* top-k 1 keeps both tied 2s (HF keeps ties): both appear over many seeds */
    int seen[4] = {0};
    for (int s = 0; s < 64; s++) {
        sopts o = defaults();
        o.top_k = 1;
        o.seed = s;
        CHECK_RC(run_sample(&out, &x, &o), TK_OK);
        if (ids(&out)[2] >= 0 && ids(&out)[2] < 4)
            seen[ids(&out)[2]]++;
    }
    CHECK(seen[0] == 0 && seen[1] == 0 && seen[2] > 0 && seen[3] > 0);
    host_free(&x);
    host_free(&out);
}

/* Greedy (temperature 0), top-k 1 and a tiny top-p all give the argmax (a unique max here), for any
 * seed; rows of 1000 and 300000. */
static void test_greedy_equivalents(void)
{
    static const int64_t shapes[][2] = {{16, 1000}, {2, 300000}, {5, 1}, {4, 7}};
    for (size_t s = 0; s < 4; s++)
        for (size_t k = 0; k < 3; k++) {
            int64_t b = shapes[s][0], v = shapes[s][1];
            host_t x, out, am;
            host_new(&x, *all_dtypes[k], 2, shapes[s], 0);
            host_new(&out, I64, 1, shapes[s], 0);
            host_new(&am, I64, 1, shapes[s], 0);
            for (int64_t r = 0; r < b; r++) {
                for (int64_t i = 0; i < v; i++)
                    set(&x.t, r * v + i, uniform(-8, 8));
                set(&x.t, r * v + (int64_t)(next_u64() % (uint64_t)v), 9); /* a unique max */
            }
            CHECK_RC(run_argmax(&am, &x), TK_OK);
            for (int mode = 0; mode < 3; mode++) {
                sopts o = defaults();
                o.temperature = mode == 0 ? 0.0 : uniform(0.2, 2);
                o.top_k = mode == 1 ? 1 : 0;
                o.top_p = mode == 2 ? 1e-9 : 1.0;
                o.seed = (int64_t)next_u64();
                CHECK_RC(run_sample(&out, &x, &o), TK_OK);
                for (int64_t r = 0; r < b; r++)
                    if (ids(&out)[r] != ids(&am)[r]) {
                        fprintf(stderr,
                                "  sample mode %d %s [%lld, %lld] row %lld: got %lld, argmax %lld (seed %llu)\n", mode,
                                tk_ops__dtype_str(x.t.dtype), (long long)b, (long long)v, (long long)r,
                                (long long)ids(&out)[r], (long long)ids(&am)[r], (unsigned long long)seed);
                        CHECK(0);
                        break;
                    }
            }
            host_free(&x);
            host_free(&out);
            host_free(&am);
        }
}

/* The same seed and offset give the same tokens; another seed or offset gives others. */
static void test_determinism(void)
{
    const int64_t sh[2] = {64, 1000};
    host_t x, a, b;
    host_new(&x, BF16, 2, sh, 0);
    host_new(&a, I64, 1, sh, 0);
    host_new(&b, I64, 1, sh, 0);
    fill_range(&x, -2, 2);
    sopts o = defaults();
    o.top_k = 200;
    o.top_p = 0.95;
    o.seed = 1234;
    o.offset = 7;
    CHECK_RC(run_sample(&a, &x, &o), TK_OK);
    CHECK_RC(run_sample(&b, &x, &o), TK_OK);
    CHECK(memcmp(a.buf, b.buf, 64 * sizeof(int64_t)) == 0);
    o.seed = 1235;
    CHECK_RC(run_sample(&b, &x, &o), TK_OK);
    int differ = 0;
    for (int r = 0; r < 64; r++)
        differ += ids(&a)[r] != ids(&b)[r];
    CHECK(differ > 32);
    o.seed = 1234;
    o.offset = 8;
    CHECK_RC(run_sample(&b, &x, &o), TK_OK);
    differ = 0;
    for (int r = 0; r < 64; r++)
        differ += ids(&a)[r] != ids(&b)[r];
    CHECK(differ > 32);
    host_free(&x);
    host_free(&a);
    host_free(&b);
}

/* The empirical distribution of many draws against the float64 probabilities. */
static void test_distribution(void)
{
    enum { N = 40000 };
    static const struct {
        int64_t v;
        double t;
        int64_t k;
        int p_gap; /* 0: top_p off; else the gap safe_top_p picks */
        int dt;
    } cases[] = {
        {10, 1.0, 0, 0, 0}, {10, 0.6, 4, 0, 1}, {10, 1.5, 0, 3, 2},
        {12, 0.8, 7, 4, 0}, {9, 2.5, 0, 5, 1},  {10, 1.0, 10, 0, 2}, /* top_k = v: off */
    };
    for (size_t cs = 0; cs < sizeof cases / sizeof cases[0]; cs++) {
        int64_t v = cases[cs].v, sh[2] = {N, v};
        host_t x, out;
        host_new(&x, *all_dtypes[cases[cs].dt], 2, sh, 0);
        host_new(&out, I64, 1, sh, 0);
        double *xd = malloc(sizeof(double) * (size_t)v), *prob = malloc(sizeof(double) * (size_t)v);
        fill_distinct(&x, N, v, xd);
        sopts o = defaults();
        o.temperature = cases[cs].t;
        o.top_k = cases[cs].k;
        o.top_p = cases[cs].p_gap ? safe_top_p(xd, v, o.temperature, o.top_k, cases[cs].p_gap) : 1.0;
        o.seed = (int64_t)next_u64();
        ref_probs(prob, xd, v, o.temperature, o.top_k, o.top_p);
        char what[96];
        snprintf(what, sizeof what, "%s v %lld T %g top_k %lld top_p %.4f", tk_ops__dtype_str(x.t.dtype), (long long)v,
                 o.temperature, (long long)o.top_k, o.top_p);
        CHECK_RC(run_sample(&out, &x, &o), TK_OK);
        CHECK(check_distribution(ids(&out), N, prob, v, what));
        free(xd);
        free(prob);
        host_free(&x);
        host_free(&out);
    }
}

/* Per-row temperatures, top_ks, top_ps and seeds replace the scalars: three groups of rows with their
 * own settings, each against its own float64 distribution. */
static void test_per_row(void)
{
    enum { G = 20000, V = 10 };
    const int64_t sh[2] = {3 * G, V}, b = 3 * G;
    host_t x, out, temps, ks, ps, seeds;
    host_new(&x, F16, 2, sh, 0);
    host_new(&out, I64, 1, sh, 0);
    host_new(&temps, F32, 1, &b, 0);
    host_new(&ks, I32, 1, &b, 0);
    host_new(&ps, F32, 1, &b, 0);
    host_new(&seeds, I64, 1, &b, 0);
    double xd[V], prob[V];
    fill_distinct(&x, 3 * G, V, xd);
    const double gt[3] = {0.7, 1.0, 1.8};
    const int32_t gk[3] = {3, 0, -5}; /* <= 0: off */
    double gp[3] = {1.0, 0, 2.0};     /* >= 1: off */
    gp[1] = (float)safe_top_p(xd, V, gt[1], 0, 4);
    for (int64_t r = 0; r < b; r++) {
        int g = (int)(r / G);
        set(&temps.t, r, gt[g]);
        ((int32_t *)ks.buf)[r] = gk[g];
        set(&ps.t, r, gp[g]);
        ids(&seeds)[r] = (int64_t)next_u64();
    }
    sopts o = defaults();
    o.temperature = 0; /* replaced: would be greedy */
    o.top_k = 1;
    o.top_p = 0.01;
    o.temperatures = &temps.t;
    o.top_ks = &ks.t;
    o.top_ps = &ps.t;
    o.seeds = &seeds.t;
    CHECK_RC(run_sample(&out, &x, &o), TK_OK);
    for (int g = 0; g < 3; g++) {
        ref_probs(prob, xd, V, gt[g], gk[g], gp[g]);
        char what[64];
        snprintf(what, sizeof what, "per-row group %d", g);
        CHECK(check_distribution(ids(&out) + g * G, G, prob, V, what));
    }
    /* a per-row temperature <= 0 is greedy for that row only */
    set(&temps.t, 0, 0.0);
    set(&temps.t, 1, -1.0);
    CHECK_RC(run_sample(&out, &x, &o), TK_OK);
    int64_t am = ref_argmax(xd, V);
    CHECK_EQ_INT(ids(&out)[0], am);
    CHECK_EQ_INT(ids(&out)[1], am);
    host_free(&x);
    host_free(&out);
    host_free(&temps);
    host_free(&ks);
    host_free(&ps);
    host_free(&seeds);
}

/* A vocabulary of 300000 with top-k 50 and top-p: every draw lies in the float64 kept set. */
static void test_large_vocab(void)
{
    const int64_t v = 300000, sh[2] = {8, v};
    host_t x, out;
    host_new(&x, BF16, 2, sh, 0);
    host_new(&out, I64, 1, sh, 0);
    double *xd = malloc(sizeof(double) * (size_t)v), *prob = malloc(sizeof(double) * (size_t)v);
    for (int64_t i = 0; i < v; i++)
        set(&x.t, i, uniform(-10, 10) + (i % 1000 == 0 ? 5 : 0));
    for (int64_t r = 1; r < 8; r++)
        memcpy((uint16_t *)x.buf + r * v, x.buf, (size_t)v * 2);
    for (int64_t i = 0; i < v; i++)
        xd[i] = get(&x.t, i);
    sopts o = defaults();
    o.temperature = 0.9;
    o.top_k = 50;
    o.top_p = 0.9;
    ref_probs(prob, xd, v, o.temperature, o.top_k, o.top_p);
    for (int s = 0; s < 4; s++) {
        o.seed = (int64_t)next_u64();
        CHECK_RC(run_sample(&out, &x, &o), TK_OK);
        for (int r = 0; r < 8; r++) {
            int64_t t = ids(&out)[r];
            CHECK(t >= 0 && t < v && prob[t] > 0);
        }
    }
    free(xd);
    free(prob);
    host_free(&x);
    host_free(&out);
}

/* The set of tokens sample draws from `row` (T = 1, no top-k, top_p p) in `draws` independent draws
 * (one per row of a batch), as 0/1 flags in seen[v]; 0 on an op failure. */
static int drawn_set(char *seen, const double *row, int64_t v, double p, int64_t draws, tk_dtype dt)
{
    const int64_t sh[2] = {draws, v};
    host_t x, out;
    host_new(&x, dt, 2, sh, 0);
    host_new(&out, I64, 1, sh, 0);
    for (int64_t r = 0; r < draws; r++)
        for (int64_t i = 0; i < v; i++)
            set(&x.t, r * v + i, row[i]);
    sopts o = defaults();
    o.top_p = p;
    o.seed = (int64_t)next_u64();
    int ok = run_sample(&out, &x, &o) == TK_OK;
    memset(seen, 0, (size_t)v);
    for (int64_t r = 0; ok && r < draws; r++) {
        int64_t t = ids(&out)[r];
        if (t < 0 || t >= v)
            ok = 0;
        else
            seen[t] = 1;
    }
    host_free(&x);
    host_free(&out);
    return ok;
}

/* seen[] against the kept ids; prints both sets on a mismatch. */
static int same_set(const char *seen, int64_t v, const int64_t *kept, int64_t nkept, const char *what)
{
    char *want = calloc((size_t)v, 1);
    for (int64_t j = 0; j < nkept; j++)
        want[kept[j]] = 1;
    int same = memcmp(want, seen, (size_t)v) == 0;
    if (!same) {
        fprintf(stderr, "  top-p %s: tk keeps {", what);
        for (int64_t i = 0; i < v; i++)
            if (seen[i])
                fprintf(stderr, " %lld", (long long)i);
        fprintf(stderr, " }, transformers keeps {");
        for (int64_t i = 0; i < v; i++)
            if (want[i])
                fprintf(stderr, " %lld", (long long)i);
        fprintf(stderr, " } (seed %llu)\n", (unsigned long long)seed);
    }
    free(want);
    return same;
}

/* The example: TopPLogitsWarper(0.5) keeps {0, 3, 7} of these logits (mass 0.511): of the four
 * tokens tied at 1, only as many as the mass needs, the highest ids. 2000 draws hit each of the three
 * (probabilities 0.72, 0.14, 0.14 after renormalising) with certainty for practical purposes. */
static void test_top_p_ties_example(void)
{
    static const double row[12] = {2, 1, 1, 1, .5, 0, -1, 1, -2, .3, .2, .1};
    static const int64_t kept[3] = {0, 3, 7};
    char seen[12];
    for (size_t k = 0; k < 3; k++) {
        CHECK(drawn_set(seen, row, 12, 0.5, 2000, *all_dtypes[k]));
        CHECK(same_set(seen, 12, kept, 3, tk_ops__dtype_str(*all_dtypes[k])));
    }
}

/* sample's kept set against transformers' TopPLogitsWarper itself, run by tests/top_p_oracle.py on rows
 * full of exact ties (small vocabularies with a few levels; 2000- and 4099-token rows with a tie group of
 * tens where the nucleus ends), in f32, f16 and bf16. Each case gives enough draws to hit every kept
 * token (with probability 1 - e^-30); a token outside the kept set is never drawn. The venv is
 * $TK_PY_VENV (default ~/.cache/tk/py-venv: th_py_venv()); without it the test skips, and fails in CI. */
static void test_top_p_ties_vs_transformers(void)
{
    const char *venv = th_py_venv();
    char py[1024], cmd[2300];
    snprintf(py, sizeof py, "%s/bin/python", venv);
    /* found, not imported: top_p_oracle.py imports it, and an import costs seconds */
    snprintf(cmd, sizeof cmd,
             "'%s' -c 'import importlib.util as u, sys; sys.exit(u.find_spec(\"transformers\") is None)' 2>/dev/null",
             py);
    if (system(cmd) != 0) {
        if (getenv("CI") && *getenv("CI")) {
            fprintf(stderr, "  %s cannot import transformers (scripts/setup.sh --test installs it)\n", py);
            CHECK(0);
            return;
        }
        SKIP("no transformers venv; run scripts/setup.sh --test or set TK_PY_VENV");
    }
    snprintf(cmd, sizeof cmd, "'%s' tests/top_p_oracle.py %llu 15", py, (unsigned long long)(seed % 1000000007));
    FILE *f = popen(cmd, "r");
    CHECK(f != NULL);
    if (!f)
        return;
    size_t cap = 1 << 20;
    char *line = malloc(cap);
    int cases = 0;
    while (fgets(line, (int)cap, f)) {
        char *s = line, *end;
        double p = strtod(s, &end);
        int64_t v = strtoll(end, &end, 10), draws = strtoll(end, &end, 10), nk = strtoll(end, &end, 10);
        int64_t *kept = malloc(sizeof(int64_t) * (size_t)(nk > 0 ? nk : 1));
        double *row = malloc(sizeof(double) * (size_t)v);
        char *seen = malloc((size_t)v);
        for (int64_t j = 0; j < nk; j++)
            kept[j] = strtoll(end, &end, 10);
        end = strchr(end, '|');
        CHECK(end != NULL && v > 0 && nk > 0);
        for (int64_t i = 0; end && i < v; i++)
            row[i] = strtod(end + (i == 0), &end);
        if (end) {
            for (size_t k = 0; k < 3; k++) {
                char what[160];
                snprintf(what, sizeof what, "case %d (v %lld, p %.6f, %s)", cases, (long long)v, p,
                         tk_ops__dtype_str(*all_dtypes[k]));
                CHECK(drawn_set(seen, row, v, p, draws, *all_dtypes[k]));
                CHECK(same_set(seen, v, kept, nk, what));
            }
        }
        cases++;
        free(kept);
        free(row);
        free(seen);
    }
    free(line);
    CHECK(pclose(f) == 0);
    CHECK(cases == 15);
}

static void test_empty(void)
{
    const int64_t sh[2] = {0, 16};
    host_t x, out;
    host_new(&x, F32, 2, sh, 0);
    host_new(&out, I64, 1, sh, 0);
    sopts o = defaults();
    CHECK_RC(run_sample(&out, &x, &o), TK_OK);
    CHECK_RC(run_argmax(&out, &x), TK_OK);
    host_free(&x);
    host_free(&out);
}

static void test_validation(void)
{
    int64_t s48[2] = {4, 8}, s40[2] = {4, 0}, s4 = 4, s3 = 3, s248[3] = {2, 4, 8};
    host_t x, x0, x3, o4, o3, oi32, k4i64, t3, o24;
    host_new(&x, F32, 2, s48, 0);
    host_new(&x0, F32, 2, s40, 0);
    host_new(&x3, F32, 3, s248, 0);
    host_new(&o4, I64, 1, &s4, 0);
    host_new(&o3, I64, 1, &s3, 0);
    host_new(&oi32, I32, 1, &s4, 0);
    host_new(&k4i64, I64, 1, &s4, 0);
    host_new(&t3, F32, 1, &s3, 0);
    host_new(&o24, I64, 2, s248, 0);
    tk_op_call c;

    /* argmax */
    tk_arg a[2] = {{TK_ARG_TENSOR, "out", &o3.t, 0, 0}, {TK_ARG_TENSOR, "input", &x.t, 0, 0}};
    CHECK_RC(tk_ops__prepare(&c, "argmax", a, 2), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "argmax: 'out' has shape [3], want [4] (the shape of 'input' [4, 8] without "
                                    "its last dimension)");
    a[0].t = &oi32.t;
    CHECK_RC(tk_ops__prepare(&c, "argmax", a, 2), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "argmax: 'out' has dtype i32, want i64");
    a[0].t = &o4.t;
    a[1].t = &x0.t;
    CHECK_RC(tk_ops__prepare(&c, "argmax", a, 2), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "argmax: 'input' has shape [4, 0]: an empty last dimension has no argmax");
    a[0].t = &o24.t; /* [2, 4] */
    a[1].t = &x3.t;
    CHECK_RC(tk_ops__prepare(&c, "argmax", a, 2), TK_OK);

    /* sample */
    tk_arg s[4] = {{TK_ARG_TENSOR, "out", &o3.t, 0, 0},
                   {TK_ARG_TENSOR, "logits", &x.t, 0, 0},
                   {TK_ARG_F64, "temperature", NULL, 0, 1.0},
                   {TK_ARG_TENSOR, "top_ks", &k4i64.t, 0, 0}};
    CHECK_RC(tk_ops__prepare(&c, "sample", s, 2), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "sample: 'out' has shape [3], want [4] (one token per row of 'logits' [4, 8])");
    s[0].t = &o4.t;
    s[1].t = &x3.t;
    CHECK_RC(tk_ops__prepare(&c, "sample", s, 2), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "sample: 'logits' has rank 3 (shape [2, 4, 8]), want 2");
    s[1].t = &x0.t;
    CHECK_RC(tk_ops__prepare(&c, "sample", s, 2), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "sample: 'logits' has shape [4, 0]: an empty vocabulary has nothing to sample");
    s[1].t = &x.t;
    s[2].f = -0.5;
    CHECK_RC(tk_ops__prepare(&c, "sample", s, 3), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "sample: 'temperature' is -0.5, want a finite value >= 0 (as f32; 0 is greedy)");
    s[2].f = 1e300;
    CHECK_RC(tk_ops__prepare(&c, "sample", s, 3), TK_ERR_INVALID);
    s[2].f = NAN;
    CHECK_RC(tk_ops__prepare(&c, "sample", s, 3), TK_ERR_INVALID);
    s[2] = (tk_arg){TK_ARG_I64, "top_k", NULL, -1, 0};
    CHECK_RC(tk_ops__prepare(&c, "sample", s, 3), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "sample: 'top_k' is -1, want >= 0 (0 keeps every token)");
    s[2] = (tk_arg){TK_ARG_F64, "top_p", NULL, 0, 0.0};
    CHECK_RC(tk_ops__prepare(&c, "sample", s, 3), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "sample: 'top_p' is 0, want a value in (0, 1] (1 keeps every token)");
    s[2].f = 1.5;
    CHECK_RC(tk_ops__prepare(&c, "sample", s, 3), TK_ERR_INVALID);
    s[2].f = 1.0;
    CHECK_RC(tk_ops__prepare(&c, "sample", s, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "sample: 'top_ks' has dtype i64, want i32");
    s[3] = (tk_arg){TK_ARG_TENSOR, "temperatures", &t3.t, 0, 0};
    CHECK_RC(tk_ops__prepare(&c, "sample", s, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "sample: 'temperatures' has shape [3], want [4] (one value per row of 'logits' "
                                    "[4, 8])");
    CHECK_RC(tk_ops__prepare(&c, "sample", s, 3), TK_OK);
    CHECK(c.t[7] == NULL && c.f[2] == 1.0 && c.i[3] == 0 && c.i[5] == 0);

    host_free(&x);
    host_free(&x0);
    host_free(&x3);
    host_free(&o4);
    host_free(&o3);
    host_free(&oi32);
    host_free(&k4i64);
    host_free(&t3);
    host_free(&o24);
}

int main(void)
{
    op_test_seed();
    RUN(test_registry);
    RUN(test_philox_known_answers);
    RUN(test_argmax_random);
    RUN(test_argmax_ties_and_nan);
    RUN(test_exact_draws);
    RUN(test_weights);
    RUN(test_degenerate_rows);
    RUN(test_greedy_equivalents);
    RUN(test_determinism);
    RUN(test_distribution);
    RUN(test_per_row);
    RUN(test_large_vocab);
    RUN(test_top_p_ties_example);
    RUN(test_top_p_ties_vs_transformers);
    RUN(test_empty);
    RUN(test_validation);
    return th_done();
}
