/*
 * test_ops_rotary.c — the position-encoding ops (ops/rotary.c): each CPU reference against an
 * independent float64 computation written here on fresh random inputs, and the validation messages.
 *
 *   rotary_embedding: HF's form (q*cos + rotate_half(q)*sin; GPT-J's rotate_every_two) in float64 with
 *     the cache's own values; NeoX and GPT-J, partial rotary, GQA head counts, [T] and [B, S] positions,
 *     one token, odd sizes, strided views, rot_dim above the reference's block, every dtype pair; the
 *     columns past rot_dim must come back bit for bit. Then the cache op and this op end to end
 *     against exact cos/sin.
 *   rope_cos_sin_cache: every scaling against HF transformers' formulas (modeling_rope_utils) ported
 *     to float64 arrays here, plus values at known positions computed separately in Python (math,
 *     float64) and written in as literals.
 *   alibi_slopes: 8 and 12 heads against the known values, any head count against Press et al.'s
 *     recursive get_slopes, other max_bias against ggml's m0/m1 form.
 *   alibi_bias, sinusoidal_position_encoding: float64 formulas, known values, odd sizes.
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

#define PI 3.14159265358979323846

/* ---- host tensors ----------------------------------------------------------------------------- */

static int64_t *i64_at(host_t *h, int64_t i) { return (int64_t *)h->buf + elem_off(&h->t, i); }

/* |got-ref| <= atol*unit + rtol*|ref| per dtype: one rounding to the dtype plus a few fp32 ulps. */
static void tolerances(tk_dtype dt, double *atol, double *rtol)
{
    if (dt.bits == 32) {
        *atol = 1e-6;
        *rtol = 2e-6;
    } else if (dt.code == TK_DL_BFLOAT) {
        *atol = 1e-3;
        *rtol = 8e-3;
    } else {
        *atol = 1e-4;
        *rtol = 1e-3;
    }
}

static int run_op(const char *op, const tk_arg *args, size_t n)
{
    int rc = op_run_cpu(op, args, n);
    if (rc != TK_OK)
        fprintf(stderr, "  %s: rc %d: %s (seed %llu)\n", op, rc, tk_last_error(), (unsigned long long)seed);
    return rc;
}

/* ---- float64 references ----------------------------------------------------------------------- */

/* One head row x[d] rotated as HF does: neox: out = x*cos + rotate_half(x)*sin with
 * rotate_half(x) = cat(-x[half:], x[:half]) and cos = cat(c, c); GPT-J: rotate_every_two(x) =
 * (-x[1], x[0], -x[3], x[2], ...) and cos repeated per pair. Columns past rot pass through. */
static void ref_rope_row(double *out, const double *x, int64_t d, int64_t rot, const double *c, const double *s,
                         int neox)
{
    int64_t half = rot / 2;
    for (int64_t j = 0; j < d; j++) {
        if (j >= rot) {
            out[j] = x[j];
            continue;
        }
        double rh, cj, sj;
        if (neox) {
            rh = j < half ? -x[j + half] : x[j - half];
            cj = c[j % half];
            sj = s[j % half];
        } else {
            rh = j % 2 == 0 ? -x[j + 1] : x[j - 1];
            cj = c[j / 2];
            sj = s[j / 2];
        }
        out[j] = x[j] * cj + rh * sj;
    }
}

typedef struct {
    int scaling;
    double base, factor;
    int64_t omax, seq_len;
    double beta_fast, beta_slow;
    int truncate;
    double attention_factor, low_ff, high_ff;
} rcfg;

#define RCFG_DEFAULT {0, 10000.0, 1.0, 0, 0, 32.0, 1.0, 1, 0.0, 1.0, 4.0}

/* HF transformers' modeling_rope_utils, as float64 arrays: inv[dim/2] and the cos/sin multiplier. */
static double ref_inv_freq(double *inv, const rcfg *k, int64_t dim, int64_t rows)
{
    int64_t half = dim / 2;
    double base = k->base, mscale = 1.0;
    if (k->scaling == 2) { /* _compute_dynamic_ntk_parameters */
        double seq = (double)(k->seq_len ? k->seq_len : rows), mp = (double)k->omax;
        if (seq < mp)
            seq = mp;
        base = base * pow((k->factor * seq / mp) - (k->factor - 1), (double)dim / (double)(dim - 2));
    }
    for (int64_t i = 0; i < half; i++) /* base ** (arange(0, dim, 2) / dim) */
        inv[i] = 1.0 / pow(base, (double)(2 * i) / (double)dim);
    if (k->scaling == 1)
        for (int64_t i = 0; i < half; i++)
            inv[i] /= k->factor;
    if (k->scaling == 3) { /* _compute_yarn_parameters */
        double mp = (double)k->omax;
        double low = (dim * log(mp / (k->beta_fast * 2 * PI))) / (2 * log(k->base));
        double high = (dim * log(mp / (k->beta_slow * 2 * PI))) / (2 * log(k->base));
        if (k->truncate) {
            low = floor(low);
            high = ceil(high);
        }
        low = fmax(low, 0);
        high = fmin(high, (double)(dim - 1));
        if (low == high)
            high += 0.001;
        for (int64_t i = 0; i < half; i++) {
            double pos_freq = pow(k->base, (double)(2 * i) / (double)dim);
            double extra = 1.0 / pos_freq, inter = 1.0 / (k->factor * pos_freq);
            double ramp = fmin(fmax(((double)i - low) / (high - low), 0), 1);
            double ext_factor = 1 - ramp;
            inv[i] = inter * (1 - ext_factor) + extra * ext_factor;
        }
        mscale = k->factor <= 1 ? 1.0 : 0.1 * log(k->factor) + 1.0;
    }
    if (k->scaling == 4) { /* _compute_llama3_parameters */
        double ctx = (double)k->omax, low_wl = ctx / k->low_ff, high_wl = ctx / k->high_ff;
        for (int64_t i = 0; i < half; i++) {
            double wavelen = 2 * PI / inv[i];
            double llama = wavelen > low_wl ? inv[i] / k->factor : inv[i];
            double smooth = (ctx / wavelen - k->low_ff) / (k->high_ff - k->low_ff);
            double smoothed = (1 - smooth) * llama / k->factor + smooth * llama;
            int medium = !(wavelen < high_wl) && !(wavelen > low_wl);
            inv[i] = medium ? smoothed : llama;
        }
    }
    return k->attention_factor > 0 ? k->attention_factor : mscale;
}

/* ---- rotary_embedding ------------------------------------------------------------------------- */

/* One case: positions of shape pshape (pn dims), Hq/Hkv heads of d columns, rot rotated, a cache of
 * max_pos rows of random angles in dtype cdt. pad > 0: q and k are strided views. */
static int rope_case(tk_dtype dt, tk_dtype cdt, int pn, const int64_t *pshape, int64_t hq, int64_t hkv, int64_t d,
                     int64_t rot, int64_t max_pos, int neox, int64_t pad)
{
    int64_t qs[8], ks[8], cs[2] = {max_pos, rot}, ntok = 1, half = rot / 2;
    for (int i = 0; i < pn; i++) {
        qs[i] = ks[i] = pshape[i];
        ntok *= pshape[i];
    }
    qs[pn] = hq;
    ks[pn] = hkv;
    qs[pn + 1] = ks[pn + 1] = d;
    host_t pos, q, k, cache;
    host_new(&pos, I64, pn, pshape, 0);
    host_new(&q, dt, pn + 2, qs, pad);
    host_new(&k, dt, pn + 2, ks, pad);
    host_new(&cache, cdt, 2, cs, 0);
    for (int64_t t = 0; t < ntok; t++)
        *i64_at(&pos, t) = (int64_t)(next_u64() % (uint64_t)max_pos);
    if (ntok > 1)
        *i64_at(&pos, ntok - 1) = max_pos - 1; /* the last row of the cache */
    for (int64_t p = 0; p < max_pos; p++)
        for (int64_t i = 0; i < half; i++) {
            double a = uniform(-PI, PI);
            set(&cache.t, p * rot + i, cos(a));
            set(&cache.t, p * rot + half + i, sin(a));
        }
    double scale = uniform(0.5, 8.0);
    host_t *qk[2] = {&q, &k};
    int64_t heads[2] = {hq, hkv};
    double *x[2], *ref[2];
    for (int w = 0; w < 2; w++) {
        int64_t n = numel(&qk[w]->t);
        x[w] = malloc(sizeof(double) * (size_t)(n + 1));
        ref[w] = malloc(sizeof(double) * (size_t)(n + 1));
        for (int64_t i = 0; i < n; i++) {
            set(&qk[w]->t, i, uniform(-scale, scale));
            x[w][i] = get(&qk[w]->t, i);
        }
    }
    double *cv = malloc(sizeof(double) * (size_t)half), *sv = malloc(sizeof(double) * (size_t)half);
    for (int64_t t = 0; t < ntok; t++) {
        int64_t p = *i64_at(&pos, t);
        for (int64_t i = 0; i < half; i++) {
            cv[i] = get(&cache.t, p * rot + i);
            sv[i] = get(&cache.t, p * rot + half + i);
        }
        for (int w = 0; w < 2; w++)
            for (int64_t h = 0; h < heads[w]; h++) {
                int64_t o = (t * heads[w] + h) * d;
                ref_rope_row(ref[w] + o, x[w] + o, d, rot, cv, sv, neox);
            }
    }
    tk_arg args[5] = {{TK_ARG_TENSOR, "query", &q.t, 0, 0},
                      {TK_ARG_TENSOR, "key", &k.t, 0, 0},
                      {TK_ARG_TENSOR, "positions", &pos.t, 0, 0},
                      {TK_ARG_TENSOR, "cos_sin_cache", &cache.t, 0, 0},
                      {TK_ARG_I64, "is_neox", NULL, neox, 0}};
    int ok = run_op("rotary_embedding", args, 5) == TK_OK;
    char what[160];
    snprintf(what, sizeof what, "rotary_embedding %s cache %s %s q %s k %s rot %lld%s", tk_ops__dtype_str(dt),
             tk_ops__dtype_str(cdt), neox ? "neox" : "gptj", tk_ops__shape_fmt(pn + 2, qs),
             tk_ops__shape_fmt(pn + 2, ks), (long long)rot, pad ? " strided" : "");
    double atol, rtol;
    tolerances(dt, &atol, &rtol);
    for (int w = 0; ok && w < 2; w++) {
        op_cmp c = op_cmp_begin(atol * scale, rtol, "%s %s", what, w ? "key" : "query");
        c.cols = d;
        c.nan_fails = 1;
        c.inf_fails = 1;
        op_cmp kept = op_cmp_begin(0, 0, "%s %s columns past rot_dim (untouched)", what, w ? "key" : "query");
        kept.cols = d;
        kept.nan_fails = 1;
        int64_t n = numel(&qk[w]->t);
        for (int64_t i = 0; i < n; i++) {
            double g = get(&qk[w]->t, i);
            if (i % d >= rot) /* not rotated: untouched, bit for bit */
                op_cmp_exact(&kept, i, g, x[w][i]);
            else
                op_cmp_at(&c, i, g, ref[w][i]);
        }
        ok &= op_cmp_end(&c);
        ok &= op_cmp_end(&kept);
    }
    for (int w = 0; w < 2; w++) {
        free(x[w]);
        free(ref[w]);
    }
    free(cv);
    free(sv);
    host_free(&pos);
    host_free(&q);
    host_free(&k);
    host_free(&cache);
    return ok;
}

static void test_rotary_embedding(void)
{
    /* {ntok or B, S (0: positions rank 1), Hq, Hkv, d, rot, max_pos} */
    static const int64_t cases[][7] = {
        {1, 0, 1, 1, 2, 2, 1},       /* one token, one pair */
        {7, 0, 8, 2, 64, 64, 50},    /* GQA 4:1 */
        {5, 0, 4, 1, 128, 128, 300}, /* MQA */
        {3, 0, 3, 3, 10, 10, 9},     /* odd head count, d not a multiple of 8 */
        {4, 0, 6, 2, 80, 32, 20},    /* partial rotary (GPT-NeoX style: 32 of 80) */
        {2, 0, 2, 2, 96, 24, 7},     /* partial rotary, rot_dim/2 = 12 */
        {6, 0, 5, 1, 7, 6, 11},      /* odd head_size, one column passes through */
        {2, 3, 4, 2, 32, 16, 16},    /* [B, S] positions */
        {1, 1, 2, 1, 16, 8, 4},      /* [1, 1] positions */
        {2, 0, 2, 1, 1100, 1026, 3}, /* rot_dim/2 = 513: more than one reference block */
    };
    int ok = 1;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int64_t *cc = cases[ci];
        int64_t ps[2] = {cc[0], cc[1]};
        int pn = cc[1] ? 2 : 1;
        for (size_t di = 0; di < 3; di++) {
            tk_dtype dt = *all_dtypes[di];
            for (int neox = 0; neox < 2; neox++) {
                ok &= rope_case(dt, dt, pn, ps, cc[2], cc[3], cc[4], cc[5], cc[6], neox, 0);
                if (dt.bits == 16)
                    ok &= rope_case(dt, F32, pn, ps, cc[2], cc[3], cc[4], cc[5], cc[6], neox, 0);
                ok &= rope_case(dt, dt.bits == 16 ? F32 : dt, pn, ps, cc[2], cc[3], cc[4], cc[5], cc[6], neox,
                                1 + (int64_t)(next_u64() % 5));
            }
        }
    }
    CHECK(ok);
}

/* rope_cos_sin_cache then rotary_embedding against HF's RoPE with exact cos/sin (f32 cache). */
static void test_rope_end_to_end(void)
{
    int ok = 1;
    const int64_t ntok = 9, hq = 4, hkv = 2, d = 64;
    const int64_t rots[2] = {64, 16};
    for (int ri = 0; ri < 2; ri++)
        for (int neox = 0; neox < 2; neox++)
            for (size_t di = 0; di < 3; di++) {
                tk_dtype dt = *all_dtypes[di];
                int64_t rot = rots[ri], half = rot / 2, max_pos = 2048, cs[2] = {max_pos, rot};
                int64_t qs[3] = {ntok, hq, d}, ks[3] = {ntok, hkv, d};
                double base = ri ? 500000.0 : 10000.0;
                host_t cache, pos, q, k;
                host_new(&cache, F32, 2, cs, 0);
                host_new(&pos, I64, 1, &ntok, 0);
                host_new(&q, dt, 3, qs, 0);
                host_new(&k, dt, 3, ks, 0);
                tk_arg ca[2] = {{TK_ARG_TENSOR, "out", &cache.t, 0, 0}, {TK_ARG_F64, "base", NULL, 0, base}};
                ok &= run_op("rope_cos_sin_cache", ca, 2) == TK_OK;
                for (int64_t t = 0; t < ntok; t++)
                    *i64_at(&pos, t) = t == 0 ? 0 : (int64_t)(next_u64() % (uint64_t)max_pos);
                host_t *qk[2] = {&q, &k};
                int64_t heads[2] = {hq, hkv};
                double *x[2], *ref[2], cv[64], sv[64];
                for (int w = 0; w < 2; w++) {
                    int64_t n = numel(&qk[w]->t);
                    x[w] = malloc(sizeof(double) * (size_t)n);
                    ref[w] = malloc(sizeof(double) * (size_t)n);
                    for (int64_t i = 0; i < n; i++) {
                        set(&qk[w]->t, i, uniform(-2, 2));
                        x[w][i] = get(&qk[w]->t, i);
                    }
                }
                for (int64_t t = 0; t < ntok; t++) {
                    double p = (double)*i64_at(&pos, t);
                    for (int64_t i = 0; i < half; i++) {
                        double f = pow(base, -(double)(2 * i) / (double)rot);
                        cv[i] = cos(p * f);
                        sv[i] = sin(p * f);
                    }
                    for (int w = 0; w < 2; w++)
                        for (int64_t h = 0; h < heads[w]; h++)
                            ref_rope_row(ref[w] + (t * heads[w] + h) * d, x[w] + (t * heads[w] + h) * d, d, rot, cv, sv,
                                         neox);
                }
                tk_arg ra[5] = {{TK_ARG_TENSOR, "query", &q.t, 0, 0},
                                {TK_ARG_TENSOR, "key", &k.t, 0, 0},
                                {TK_ARG_TENSOR, "positions", &pos.t, 0, 0},
                                {TK_ARG_TENSOR, "cos_sin_cache", &cache.t, 0, 0},
                                {TK_ARG_I64, "is_neox", NULL, neox, 0}};
                ok &= run_op("rotary_embedding", ra, 5) == TK_OK;
                double atol, rtol;
                tolerances(dt, &atol, &rtol);
                char what[128];
                snprintf(what, sizeof what, "rope end to end %s %s rot %lld base %g", tk_ops__dtype_str(dt),
                         neox ? "neox" : "gptj", (long long)rot, base);
                for (int w = 0; w < 2; w++) {
                    op_cmp c = op_cmp_begin(atol * 2, rtol, "%s %s", what, w ? "key" : "query");
                    c.cols = d;
                    c.nan_fails = 1;
                    c.inf_fails = 1;
                    for (int64_t i = 0; i < numel(&qk[w]->t); i++)
                        op_cmp_at(&c, i, get(&qk[w]->t, i), ref[w][i]);
                    ok &= op_cmp_end(&c);
                    free(x[w]);
                    free(ref[w]);
                }
                host_free(&cache);
                host_free(&pos);
                host_free(&q);
                host_free(&k);
            }
    CHECK(ok);
}

/* Positions outside [0, max_pos) are refused before anything is written. */
static void test_rotary_bad_position(void)
{
    int64_t ps = 3, qs[3] = {3, 2, 8}, cs[2] = {16, 8};
    host_t pos, q, k, cache;
    host_new(&pos, I64, 1, &ps, 0);
    host_new(&q, F32, 3, qs, 0);
    host_new(&k, F32, 3, qs, 0);
    host_new(&cache, F32, 2, cs, 0);
    for (int64_t i = 0; i < 48; i++) {
        set(&q.t, i, 1.0 + (double)i);
        set(&k.t, i, -1.0 - (double)i);
    }
    for (int64_t i = 0; i < 128; i++)
        set(&cache.t, i, 0.5);
    int64_t bad[2] = {16, -1};
    for (int b = 0; b < 2; b++) {
        *i64_at(&pos, 0) = 0;
        *i64_at(&pos, 1) = 5;
        *i64_at(&pos, 2) = bad[b];
        tk_arg a[4] = {{TK_ARG_TENSOR, "query", &q.t, 0, 0},
                       {TK_ARG_TENSOR, "key", &k.t, 0, 0},
                       {TK_ARG_TENSOR, "positions", &pos.t, 0, 0},
                       {TK_ARG_TENSOR, "cos_sin_cache", &cache.t, 0, 0}};
        tk_op_call c;
        CHECK_RC(tk_ops__prepare(&c, "rotary_embedding", a, 4), TK_OK);
        CHECK(c.i[4] == 1); /* is_neox defaults to 1 */
        CHECK_RC(tk_ops__run_cpu(&c), TK_ERR_INVALID);
        CHECK_CONTAINS(tk_last_error(), b ? "rotary_embedding: 'positions' holds -1 at flat index 2, outside [0, 16)"
                                          : "rotary_embedding: 'positions' holds 16 at flat index 2, outside [0, 16) "
                                            "(the rows of 'cos_sin_cache' [16, 8])");
        int same = 1;
        for (int64_t i = 0; i < 48; i++)
            same &= get(&q.t, i) == 1.0 + (double)i && get(&k.t, i) == -1.0 - (double)i;
        CHECK(same);
    }
    host_free(&pos);
    host_free(&q);
    host_free(&k);
    host_free(&cache);
}

/* ---- rope_cos_sin_cache ----------------------------------------------------------------------- */

static const char *scaling_names[] = {"none", "linear", "dynamic", "yarn", "llama3"};

static int run_cache(host_t *out, const rcfg *k)
{
    tk_arg a[12] = {{TK_ARG_TENSOR, "out", &out->t, 0, 0},
                    {TK_ARG_F64, "base", NULL, 0, k->base},
                    {TK_ARG_I64, "scaling", NULL, k->scaling, 0},
                    {TK_ARG_F64, "factor", NULL, 0, k->factor},
                    {TK_ARG_I64, "original_max_position_embeddings", NULL, k->omax, 0},
                    {TK_ARG_I64, "seq_len", NULL, k->seq_len, 0},
                    {TK_ARG_F64, "beta_fast", NULL, 0, k->beta_fast},
                    {TK_ARG_F64, "beta_slow", NULL, 0, k->beta_slow},
                    {TK_ARG_I64, "truncate", NULL, k->truncate, 0},
                    {TK_ARG_F64, "attention_factor", NULL, 0, k->attention_factor},
                    {TK_ARG_F64, "low_freq_factor", NULL, 0, k->low_ff},
                    {TK_ARG_F64, "high_freq_factor", NULL, 0, k->high_ff}};
    return run_op("rope_cos_sin_cache", a, 12);
}

/* Builds a cache of rows x rot and compares every element with the float64 formulas. */
static int cache_case(tk_dtype dt, const rcfg *k, int64_t rows, int64_t rot, int64_t pad)
{
    int64_t sh[2] = {rows, rot}, half = rot / 2;
    host_t out;
    host_new(&out, dt, 2, sh, pad);
    int ok = run_cache(&out, k) == TK_OK;
    double *inv = malloc(sizeof(double) * (size_t)half);
    double ms = ref_inv_freq(inv, k, rot, rows);
    double atol, rtol;
    tolerances(dt, &atol, &rtol);
    atol = dt.bits == 32 ? 1e-7 : 1e-6; /* the values are one rounding of an exact number */
    if (dt.bits == 32)
        rtol = 2e-7;
    op_cmp c =
        op_cmp_begin(atol * ms, rtol,
                     "rope_cos_sin_cache %s %s [%lld, %lld]%s base %g factor %g omax %lld seq %lld beta %g/%g trunc %d "
                     "attn %g low/high %g/%g",
                     tk_ops__dtype_str(dt), scaling_names[k->scaling], (long long)rows, (long long)rot,
                     pad ? " strided" : "", k->base, k->factor, (long long)k->omax, (long long)k->seq_len, k->beta_fast,
                     k->beta_slow, k->truncate, k->attention_factor, k->low_ff, k->high_ff);
    c.cols = rot;
    c.nan_fails = 1;
    c.inf_fails = 1;
    for (int64_t p = 0; ok && p < rows; p++)
        for (int64_t i = 0; i < half; i++) {
            double a = (double)p * inv[i];
            op_cmp_at(&c, p * rot + i, get(&out.t, p * rot + i), cos(a) * ms);
            op_cmp_at(&c, p * rot + half + i, get(&out.t, p * rot + half + i), sin(a) * ms);
        }
    ok &= op_cmp_end(&c);
    free(inv);
    host_free(&out);
    return ok;
}

static void test_cache_formulas(void)
{
    int ok = 1;
    static const int64_t shapes[][2] = {{1, 2}, {5, 6}, {64, 8}, {300, 64}, {2100, 128}, {7, 1030}, {33, 96}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int s = 0; s < 5; s++)
            for (size_t di = 0; di < 3; di++) {
                int64_t rows = shapes[si][0], rot = shapes[si][1];
                if (s == 2 && rot <= 2)
                    continue; /* dynamic needs rot_dim > 2 */
                rcfg k = RCFG_DEFAULT;
                k.scaling = s;
                k.base = next_u64() & 1 ? 10000.0 : uniform(100.0, 1e6);
                k.factor = uniform(1.0, 16.0);
                k.omax = 16 + (int64_t)(next_u64() % 4096);
                k.seq_len = next_u64() & 1 ? 0 : (int64_t)(next_u64() % 8192);
                k.beta_fast = uniform(8, 64);
                k.beta_slow = uniform(0.5, 2);
                k.truncate = (int)(next_u64() & 1);
                k.attention_factor = next_u64() % 4 == 0 ? uniform(0.5, 2) : 0.0;
                k.low_ff = uniform(0.5, 2);
                k.high_ff = k.low_ff + uniform(0.5, 6);
                ok &= cache_case(*all_dtypes[di], &k, rows, rot, di == 1 ? 3 : 0);
            }
    /* the HF defaults of real models */
    rcfg yarn = {3, 10000.0, 4.0, 4096, 0, 32.0, 1.0, 1, 0.0, 1.0, 4.0};
    rcfg llama3 = {4, 500000.0, 8.0, 8192, 0, 32.0, 1.0, 1, 0.0, 1.0, 4.0};
    rcfg dyn = {2, 10000.0, 2.0, 2048, 4096, 32.0, 1.0, 1, 0.0, 1.0, 4.0};
    /* a correction range that collapses to [0, 0]: HF's "max += 0.001" */
    rcfg yarn_short = {3, 10000.0, 4.0, 6, 0, 32.0, 1.0, 1, 0.0, 1.0, 4.0};
    for (size_t di = 0; di < 3; di++) {
        ok &= cache_case(*all_dtypes[di], &yarn_short, 200, 128, 0);
        ok &= cache_case(*all_dtypes[di], &yarn, 3001, 128, 0);
        ok &= cache_case(*all_dtypes[di], &llama3, 5001, 128, 0);
        ok &= cache_case(*all_dtypes[di], &dyn, 3001, 128, 0);
    }
    CHECK(ok);
}

/* Values at known positions: float64 results of HF's formulas computed separately (Python's math). */
static void test_cache_known_values(void)
{
    typedef struct {
        rcfg k;
        int64_t rows, p, i;
        double cos_v, sin_v;
    } known;
    const known kv[] = {
        {{0, 10000.0, 1.0, 0, 0, 32, 1, 1, 0, 1, 4}, 4096, 1, 0, 0.54030230586813977, 0.8414709848078965},
        {{0, 10000.0, 1.0, 0, 0, 32, 1, 1, 0, 1, 4}, 4096, 1000, 1, 0.43995386270170594, -0.89802037766069009},
        {{0, 10000.0, 1.0, 0, 0, 32, 1, 1, 0, 1, 4}, 4096, 4095, 63, 0.89025881218308256, 0.4554549893571998},
        /* linear, factor 4: position 8 acts as 2 */
        {{1, 10000.0, 4.0, 0, 0, 32, 1, 1, 0, 1, 4}, 1001, 8, 0, -0.41614683654714241, 0.90929742682568171},
        {{1, 10000.0, 4.0, 0, 0, 32, 1, 1, 0, 1, 4}, 1001, 1000, 1, -0.96138299963726814, 0.27521396768414313},
        /* dynamic NTK, factor 2, max_pos 2048, seq_len 4096: base = 10000 * 3^(128/126) */
        {{2, 10000.0, 2.0, 2048, 4096, 32, 1, 1, 0, 1, 4}, 3001, 3000, 1, -0.424892366186156, 0.90524387717163246},
        {{2, 10000.0, 2.0, 2048, 0, 32, 1, 1, 0, 1, 4}, 4096, 3000, 40, 0.010275670683801457, -0.99994720390228509},
        /* dynamic with seq_len <= max_pos is no scaling */
        {{2, 10000.0, 2.0, 4096, 1000, 32, 1, 1, 0, 1, 4}, 1001, 1000, 1, 0.43995386270170594, -0.89802037766069009},
        /* YaRN, factor 4, original 4096, beta 32/1: correction range [20, 46], mscale 1.1386294361119891 */
        {{3, 10000.0, 4.0, 4096, 0, 32, 1, 1, 0, 1, 4}, 3001, 0, 5, 1.1386294361119891, 0.0},
        {{3, 10000.0, 4.0, 4096, 0, 32, 1, 1, 0, 1, 4}, 3001, 100, 0, 0.98186165130165182, -0.57656282440329054},
        {{3, 10000.0, 4.0, 4096, 0, 32, 1, 1, 0, 1, 4}, 3001, 100, 63, 1.1386246911566711, 0.0032871673339894018},
        {{3, 10000.0, 4.0, 4096, 0, 32, 1, 1, 0, 1, 4}, 3001, 100, 30, 0.6633845007247352, 0.92541774187601356},
        {{3, 10000.0, 4.0, 4096, 0, 32, 1, 1, 0, 1, 4}, 3001, 3000, 25, 0.42464170839441784, 1.0564830392735023},
        /* YaRN with an explicit attention_factor: 1 */
        {{3, 10000.0, 4.0, 4096, 0, 32, 1, 1, 1.0, 1, 4}, 16, 0, 0, 1.0, 0.0},
        /* Llama 3.1: base 500000, factor 8, low 1, high 4, original 8192; pairs 29..34 are smoothed */
        {{4, 500000.0, 8.0, 8192, 0, 32, 1, 1, 0, 1, 4}, 5001, 5000, 0, 0.15466840618074712, -0.98796643876677681},
        {{4, 500000.0, 8.0, 8192, 0, 32, 1, 1, 0, 1, 4}, 5001, 5000, 63, 0.99999882271189033, 0.0015344623922888623},
        {{4, 500000.0, 8.0, 8192, 0, 32, 1, 1, 0, 1, 4}, 5001, 5000, 30, 0.83849412710512516, 0.54491063378338855},
        {{4, 500000.0, 8.0, 8192, 0, 32, 1, 1, 0, 1, 4}, 5001, 5000, 20, 0.43496995994512022, 0.90044496441778188},
        {{4, 500000.0, 8.0, 8192, 0, 32, 1, 1, 0, 1, 4}, 5001, 5000, 40, 0.9853460742751512, 0.17056703641251506},
    };
    for (size_t n = 0; n < sizeof kv / sizeof kv[0]; n++) {
        const known *e = &kv[n];
        int64_t sh[2] = {e->rows, 128};
        host_t out;
        host_new(&out, F32, 2, sh, 0);
        CHECK_RC(run_cache(&out, &e->k), TK_OK);
        double gc = get(&out.t, e->p * 128 + e->i), gs = get(&out.t, e->p * 128 + 64 + e->i);
        if (!(fabs(gc - e->cos_v) <= 2e-7 && fabs(gs - e->sin_v) <= 2e-7)) {
            fprintf(stderr, "  %s case %zu: row %lld pair %lld: got cos %.9g sin %.9g, want %.9g %.9g\n",
                    scaling_names[e->k.scaling], n, (long long)e->p, (long long)e->i, gc, gs, e->cos_v, e->sin_v);
            CHECK(0);
        }
        host_free(&out);
    }
}

#define EXPECT_INVALID_RC(call, msg)                                                                                   \
    do {                                                                                                               \
        CHECK_RC(call, TK_ERR_INVALID);                                                                                \
        CHECK_CONTAINS(tk_last_error(), msg);                                                                          \
    } while (0)
#define EXPECT_INVALID(op, args, n, msg)                                                                               \
    do {                                                                                                               \
        tk_op_call c_;                                                                                                 \
        CHECK_RC(tk_ops__prepare(&c_, op, args, n), TK_ERR_INVALID);                                                   \
        CHECK_CONTAINS(tk_last_error(), msg);                                                                          \
    } while (0)

/* ---- rope_cos_sin_cache: LongRoPE ------------------------------------------------------------- */

/* The call of scaling (5: longrope) with the factors ext (f32 [rot/2], or NULL); factor, omax and
 * attention_factor as given. */
static int run_scaled(host_t *out, int scaling, double base, double factor, int64_t omax, double attn, host_t *ext)
{
    tk_arg a[13] = {{TK_ARG_TENSOR, "out", &out->t, 0, 0},
                    {TK_ARG_F64, "base", NULL, 0, base},
                    {TK_ARG_I64, "scaling", NULL, scaling, 0},
                    {TK_ARG_F64, "factor", NULL, 0, factor},
                    {TK_ARG_I64, "original_max_position_embeddings", NULL, omax, 0},
                    {TK_ARG_I64, "seq_len", NULL, 0, 0},
                    {TK_ARG_F64, "beta_fast", NULL, 0, 32},
                    {TK_ARG_F64, "beta_slow", NULL, 0, 1},
                    {TK_ARG_I64, "truncate", NULL, 1, 0},
                    {TK_ARG_F64, "attention_factor", NULL, 0, attn},
                    {TK_ARG_F64, "low_freq_factor", NULL, 0, 1},
                    {TK_ARG_F64, "high_freq_factor", NULL, 0, 4},
                    {TK_ARG_TENSOR, "ext_factors", ext ? &ext->t : NULL, 0, 0}};
    return run_op("rope_cos_sin_cache", a, ext ? 13 : 12);
}

static int run_longrope(host_t *out, double base, double factor, int64_t omax, double attn, host_t *ext)
{
    return run_scaled(out, 5, base, factor, omax, attn, ext);
}

/* transformers' _compute_longrope_parameters in float64: inv_freq = 1 / (ext * base^(2i/dim)), the
 * multiplier attention_factor, else sqrt(1 + ln(factor) / ln(omax)) when factor > 1, else 1. Every
 * element of random tables in each dtype, and two values computed separately (Python's math). */
static void test_cache_longrope(void)
{
    int ok = 1;
    static const int64_t shapes[][2] = {{1, 2}, {40, 8}, {300, 96}, {1100, 128}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (size_t di = 0; di < 3; di++) {
            int64_t rows = shapes[si][0], rot = shapes[si][1], half = rot / 2, sh[2] = {rows, rot};
            host_t out, ext;
            host_new(&out, *all_dtypes[di], 2, sh, di == 1 ? 3 : 0);
            host_new(&ext, F32, 1, &half, 0);
            for (int64_t i = 0; i < half; i++)
                ((float *)ext.buf)[i] = (float)uniform(1.0, 12.0);
            double base = next_u64() & 1 ? 10000.0 : uniform(100.0, 1e6), factor = uniform(0.5, 40.0);
            int64_t omax = 2 + (int64_t)(next_u64() % 8192);
            double attn = next_u64() % 3 == 0 ? uniform(0.5, 2) : 0.0;
            ok &= run_longrope(&out, base, factor, omax, attn, &ext) == TK_OK;
            double ms = attn > 0 ? attn : factor > 1 ? sqrt(1 + log(factor) / log((double)omax)) : 1.0;
            double atol, rtol; /* as cache_case: one rounding of an exact number */
            tolerances(*all_dtypes[di], &atol, &rtol);
            atol = all_dtypes[di]->bits == 32 ? 1e-7 : 1e-6;
            if (all_dtypes[di]->bits == 32)
                rtol = 2e-7;
            op_cmp c = op_cmp_begin(atol * ms, rtol,
                                    "rope_cos_sin_cache %s longrope [%lld, %lld] base %g factor %g omax %lld attn %g",
                                    tk_ops__dtype_str(*all_dtypes[di]), (long long)rows, (long long)rot, base, factor,
                                    (long long)omax, attn);
            c.cols = rot;
            c.nan_fails = 1;
            c.inf_fails = 1;
            for (int64_t p = 0; ok && p < rows; p++)
                for (int64_t i = 0; i < half; i++) {
                    double inv = 1.0 / ((double)((float *)ext.buf)[i] * pow(base, (double)(2 * i) / (double)rot));
                    double a = (double)p * inv;
                    op_cmp_at(&c, p * rot + i, get(&out.t, p * rot + i), cos(a) * ms);
                    op_cmp_at(&c, p * rot + half + i, get(&out.t, p * rot + half + i), sin(a) * ms);
                }
            ok &= op_cmp_end(&c);
            host_free(&out);
            host_free(&ext);
        }
    CHECK(ok);
    /* base 10000, rot 8, factors 1 2 4 8, factor 32 (131072 / 4096), original 4096: the multiplier is
     * sqrt(1 + ln 32 / ln 4096) = sqrt(17 / 12) */
    int64_t sh[2] = {3001, 8}, half = 4;
    host_t out, ext;
    host_new(&out, F32, 2, sh, 0);
    host_new(&ext, F32, 1, &half, 0);
    for (int i = 0; i < 4; i++)
        ((float *)ext.buf)[i] = (float)(1 << i);
    CHECK_RC(run_longrope(&out, 10000.0, 32.0, 4096, 0.0, &ext), TK_OK);
    const struct {
        int64_t p, i;
        double c, s;
    } kv[] = {{100, 2, 1.1532364521954495, 0.29446961132571786}, {3000, 3, 1.107525597350067, 0.435951508634898}};
    for (size_t n = 0; n < 2; n++) {
        double gc = get(&out.t, kv[n].p * 8 + kv[n].i), gs = get(&out.t, kv[n].p * 8 + 4 + kv[n].i);
        if (!(fabs(gc - kv[n].c) <= 3e-7 && fabs(gs - kv[n].s) <= 3e-7)) {
            fprintf(stderr, "  longrope row %lld pair %lld: got cos %.9g sin %.9g, want %.9g %.9g\n",
                    (long long)kv[n].p, (long long)kv[n].i, gc, gs, kv[n].c, kv[n].s);
            CHECK(0);
        }
    }
    /* the refusals: no factors, factors of the wrong length, a factor <= 0 or NaN, factors for another
     * scaling, an original length whose log is 0 */
    EXPECT_INVALID_RC(run_longrope(&out, 10000.0, 32.0, 4096, 0.0, NULL),
                      "rope_cos_sin_cache: longrope scaling needs 'ext_factors'");
    int64_t three = 3;
    host_t ext3;
    host_new(&ext3, F32, 1, &three, 0);
    for (int i = 0; i < 3; i++)
        ((float *)ext3.buf)[i] = 1.0f;
    EXPECT_INVALID_RC(run_longrope(&out, 10000.0, 32.0, 4096, 0.0, &ext3),
                      "rope_cos_sin_cache: 'ext_factors' has shape [3], want [4] (rot_dim / 2 of 'out' [3001, 8])");
    ((float *)ext.buf)[2] = 0.0f;
    EXPECT_INVALID_RC(run_longrope(&out, 10000.0, 32.0, 4096, 0.0, &ext),
                      "rope_cos_sin_cache: 'ext_factors'[2] is 0, want a finite value > 0");
    ((float *)ext.buf)[2] = NAN;
    EXPECT_INVALID_RC(run_longrope(&out, 10000.0, 32.0, 4096, 0.0, &ext),
                      "rope_cos_sin_cache: 'ext_factors'[2] is nan, want a finite value > 0");
    ((float *)ext.buf)[2] = 4.0f;
    EXPECT_INVALID_RC(run_longrope(&out, 10000.0, 32.0, 1, 0.0, &ext),
                      "'original_max_position_embeddings' is 1, want >= 2 for longrope's default attention factor");
    CHECK_RC(run_longrope(&out, 10000.0, 32.0, 1, 1.5, &ext), TK_OK); /* an explicit attention factor */
    EXPECT_INVALID_RC(
        run_scaled(&out, 1, 10000.0, 2.0, 0, 0.0, &ext),
        "rope_cos_sin_cache: 'ext_factors' is given, but only longrope scaling (5) takes it; 'scaling' is "
        "1 (linear)");
    host_free(&out);
    host_free(&ext);
    host_free(&ext3);
}

/* ---- ALiBi ------------------------------------------------------------------------------------ */

/* Press et al.'s get_slopes, recursively, in float64. */
static void press_slopes(double *out, int n)
{
    double l = log2((double)n);
    if (l == floor(l)) {
        double start = pow(2.0, -pow(2.0, -(l - 3)));
        for (int i = 0; i < n; i++)
            out[i] = start * pow(start, i);
        return;
    }
    int p = 1 << (int)floor(l);
    double *big = malloc(sizeof(double) * (size_t)(2 * p));
    press_slopes(out, p);
    press_slopes(big, 2 * p);
    for (int i = 0; i < n - p; i++)
        out[p + i] = big[2 * i];
    free(big);
}

static int run_slopes(host_t *out, double max_bias)
{
    tk_arg a[2] = {{TK_ARG_TENSOR, "out", &out->t, 0, 0}, {TK_ARG_F64, "max_bias", NULL, 0, max_bias}};
    return run_op("alibi_slopes", a, 2);
}

static void test_alibi_slopes(void)
{
    static const double want8[8] = {0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625};
    static const double want12[12] = {0.5,
                                      0.25,
                                      0.125,
                                      0.0625,
                                      0.03125,
                                      0.015625,
                                      0.0078125,
                                      0.00390625,
                                      0.70710678118654757,
                                      0.35355339059327384,
                                      0.17677669529663692,
                                      0.088388347648318488};
    int64_t n8 = 8, n12 = 12;
    host_t s8, s12;
    host_new(&s8, F32, 1, &n8, 0);
    host_new(&s12, F32, 1, &n12, 0);
    CHECK_RC(run_slopes(&s8, 8.0), TK_OK);
    CHECK_RC(run_slopes(&s12, 8.0), TK_OK);
    for (int h = 0; h < 8; h++)
        CHECK(get(&s8.t, h) == (double)(float)want8[h]);
    for (int h = 0; h < 12; h++)
        CHECK(get(&s12.t, h) == (double)(float)want12[h]);
    host_free(&s8);
    host_free(&s12);

    /* every head count 1..80 against the recursion; max_bias left out defaults to 8 */
    int ok = 1;
    for (int n = 1; n <= 80; n++) {
        int64_t nn = n;
        host_t s;
        host_new(&s, F32, 1, &nn, 0);
        tk_arg a[1] = {{TK_ARG_TENSOR, "out", &s.t, 0, 0}};
        ok &= run_op("alibi_slopes", a, 1) == TK_OK;
        double ref[80];
        press_slopes(ref, n);
        op_cmp c = op_cmp_begin(0, 1e-7, "alibi_slopes %d heads", n);
        c.nan_fails = 1;
        c.inf_fails = 1;
        for (int h = 0; h < n; h++)
            op_cmp_at(&c, h, get(&s.t, h), ref[h]);
        ok &= op_cmp_end(&c);
        host_free(&s);
    }
    /* other max_bias: ggml's m0 = 2^(-max_bias / p), m1 = 2^(-max_bias / 2 / p) */
    for (int r = 0; r < 20; r++) {
        int64_t n = 1 + (int64_t)(next_u64() % 100);
        double mb = uniform(0.5, 16);
        host_t s;
        host_new(&s, F32, 1, &n, 0);
        ok &= run_slopes(&s, mb) == TK_OK;
        int64_t p = 1;
        while (p * 2 <= n)
            p *= 2;
        double m0 = pow(2.0, -mb / (double)p), m1 = pow(2.0, -mb / 2.0 / (double)p);
        op_cmp c = op_cmp_begin(0, 2e-7, "alibi_slopes %lld heads max_bias %g", (long long)n, mb);
        c.nan_fails = 1;
        c.inf_fails = 1;
        for (int64_t h = 0; h < n; h++)
            op_cmp_at(&c, h, get(&s.t, h), h < p ? pow(m0, (double)(h + 1)) : pow(m1, (double)(2 * (h - p) + 1)));
        ok &= op_cmp_end(&c);
        host_free(&s);
    }
    CHECK(ok);
}

static int bias_case(tk_dtype dt, int64_t h, int64_t sq, int64_t sk, int64_t pad)
{
    int64_t sh[3] = {h, sq, sk};
    host_t out, sl;
    host_new(&out, dt, 3, sh, pad);
    host_new(&sl, F32, 1, &h, 0);
    for (int64_t i = 0; i < h; i++)
        set(&sl.t, i, uniform(0.001, 1.0));
    tk_arg a[2] = {{TK_ARG_TENSOR, "out", &out.t, 0, 0}, {TK_ARG_TENSOR, "slopes", &sl.t, 0, 0}};
    int ok = run_op("alibi_bias", a, 2) == TK_OK;
    double atol, rtol;
    tolerances(dt, &atol, &rtol);
    op_cmp c = op_cmp_begin(1e-30, rtol, "alibi_bias %s [%lld, %lld, %lld]%s", tk_ops__dtype_str(dt), (long long)h,
                            (long long)sq, (long long)sk, pad ? " strided" : "");
    c.cols = sk;
    c.nan_fails = 1;
    c.inf_fails = 1;
    for (int64_t hh = 0; ok && hh < h; hh++)
        for (int64_t i = 0; i < sq; i++)
            for (int64_t j = 0; j < sk; j++) {
                /* query i sits at key position i + sk - sq */
                double ref = -get(&sl.t, hh) * fabs((double)(i + sk - sq) - (double)j);
                op_cmp_at(&c, (hh * sq + i) * sk + j, get(&out.t, (hh * sq + i) * sk + j), ref);
            }
    ok &= op_cmp_end(&c);
    host_free(&out);
    host_free(&sl);
    return ok;
}

static void test_alibi_bias(void)
{
    static const int64_t shapes[][3] = {{1, 1, 1}, {8, 1, 17}, {12, 5, 5}, {3, 7, 4}, {2, 9, 1100}, {5, 33, 40}};
    int ok = 1;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t di = 0; di < 3; di++) {
            ok &= bias_case(*all_dtypes[di], shapes[s][0], shapes[s][1], shapes[s][2], 0);
            ok &= bias_case(*all_dtypes[di], shapes[s][0], shapes[s][1], shapes[s][2], 2);
        }
    CHECK(ok);

    /* known values: one query (decode) over 4 keys sits at position 3 */
    int64_t sh[3] = {1, 1, 4}, one = 1;
    host_t out, sl;
    host_new(&out, F32, 3, sh, 0);
    host_new(&sl, F32, 1, &one, 0);
    set(&sl.t, 0, 0.5);
    tk_arg a[2] = {{TK_ARG_TENSOR, "out", &out.t, 0, 0}, {TK_ARG_TENSOR, "slopes", &sl.t, 0, 0}};
    CHECK_RC(run_op("alibi_bias", a, 2), TK_OK);
    CHECK(get(&out.t, 0) == -1.5 && get(&out.t, 1) == -1.0 && get(&out.t, 2) == -0.5 && get(&out.t, 3) == 0.0);
    host_free(&out);
    host_free(&sl);
}

/* ---- sinusoidal_position_encoding ------------------------------------------------------------- */

static int run_sin(host_t *out, double base, int64_t offset)
{
    tk_arg a[3] = {{TK_ARG_TENSOR, "out", &out->t, 0, 0},
                   {TK_ARG_F64, "base", NULL, 0, base},
                   {TK_ARG_I64, "offset", NULL, offset, 0}};
    return run_op("sinusoidal_position_encoding", a, 3);
}

static void test_sinusoidal(void)
{
    static const int64_t shapes[][2] = {{1, 1}, {1, 2}, {5, 7}, {64, 6}, {300, 512}, {3, 1031}, {17, 33}};
    int ok = 1;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t di = 0; di < 3; di++) {
            tk_dtype dt = *all_dtypes[di];
            int64_t rows = shapes[s][0], d = shapes[s][1], off = next_u64() & 1 ? 0 : (int64_t)(next_u64() % 5000);
            double base = next_u64() & 1 ? 10000.0 : uniform(10, 1e5);
            host_t out;
            host_new(&out, dt, 2, shapes[s], di == 2 ? 3 : 0);
            ok &= run_sin(&out, base, off) == TK_OK;
            double rtol, atol;
            tolerances(dt, &atol, &rtol);
            atol = dt.bits == 32 ? 1e-7 : 1e-6;
            if (dt.bits == 32)
                rtol = 2e-7;
            op_cmp c = op_cmp_begin(atol, rtol, "sinusoidal %s [%lld, %lld] base %g offset %lld", tk_ops__dtype_str(dt),
                                    (long long)rows, (long long)d, base, (long long)off);
            c.cols = d;
            c.nan_fails = 1;
            c.inf_fails = 1;
            for (int64_t p = 0; p < rows; p++)
                for (int64_t i = 0; 2 * i < d; i++) {
                    /* PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(...) */
                    double a = (double)(p + off) / pow(base, (double)(2 * i) / (double)d);
                    op_cmp_at(&c, p * d + 2 * i, get(&out.t, p * d + 2 * i), sin(a));
                    if (2 * i + 1 < d)
                        op_cmp_at(&c, p * d + 2 * i + 1, get(&out.t, p * d + 2 * i + 1), cos(a));
                }
            ok &= op_cmp_end(&c);
            host_free(&out);
        }
    CHECK(ok);

    /* known values (Python, float64), d = 6: rows 1 and 7; then the same rows through offset */
    static const double row1[6] = {0.8414709848078965,  0.54030230586813977,   0.046399223464731285,
                                   0.99892297604063041, 0.0021544330233656045, 0.99999767920648086};
    static const double row7[6] = {0.65698659871878906, 0.7539022543433046,   0.31922465060631494,
                                   0.9476790714399449,  0.015080471170057421, 0.9998862832288925};
    int64_t sh[2] = {8, 6};
    host_t out;
    host_new(&out, F32, 2, sh, 0);
    tk_arg a[1] = {{TK_ARG_TENSOR, "out", &out.t, 0, 0}}; /* base 10000 and offset 0 by default */
    CHECK_RC(run_op("sinusoidal_position_encoding", a, 1), TK_OK);
    for (int j = 0; j < 6; j++) {
        CHECK(fabs(get(&out.t, 6 + j) - row1[j]) <= 1e-7);
        CHECK(fabs(get(&out.t, 42 + j) - row7[j]) <= 1e-7);
        CHECK(get(&out.t, j) == (j % 2 ? 1.0 : 0.0)); /* position 0 */
    }
    CHECK_RC(run_sin(&out, 10000.0, 1), TK_OK);
    for (int j = 0; j < 6; j++)
        CHECK(fabs(get(&out.t, j) - row1[j]) <= 1e-7 && fabs(get(&out.t, 36 + j) - row7[j]) <= 1e-7);
    host_free(&out);
}

/* ---- registry, empty tensors, validation ------------------------------------------------------ */

static void test_registry(void)
{
    const char *names[] = {"rotary_embedding", "rope_cos_sin_cache", "alibi_slopes", "alibi_bias",
                           "sinusoidal_position_encoding"};
    for (size_t i = 0; i < 5; i++) {
        const tk_op_desc *op = tk_ops__find(names[i]);
        CHECK(op != NULL);
        if (!op)
            continue;
        CHECK_STR(op->family, "rotary");
        CHECK_STR(op->package, "kernels-community/rotary");
        CHECK(op->cpu != NULL && op->check != NULL);
    }
    tk_buf b = TK_BUF_INIT;
    CHECK_RC(tk_ops__signature(&b, tk_ops__find("rotary_embedding")), TK_OK);
    CHECK_STR(b.data, "rotary_embedding(query: T[..., Hq, head_size], key: T[..., Hkv, head_size], positions: "
                      "i64[...], cos_sin_cache: f32|f16|bf16[max_pos, rot_dim], is_neox: i64 = 1) -> query, key; "
                      "T in {f32, f16, bf16}");
    tk__buf_free(&b);
    CHECK_RC(tk_ops__signature(&b, tk_ops__find("alibi_slopes")), TK_OK);
    CHECK_STR(b.data, "alibi_slopes(out: f32[H], max_bias: f64 = 8) -> out");
    tk__buf_free(&b);
}

static void test_empty(void)
{
    int64_t ps = 0, qs[3] = {0, 4, 8}, cs[2] = {16, 8}, es[2] = {0, 8}, bs[3] = {2, 0, 5}, two = 2;
    host_t pos, q, k, cache, e, bias, sl;
    host_new(&pos, I64, 1, &ps, 0);
    host_new(&q, BF16, 3, qs, 0);
    host_new(&k, BF16, 3, qs, 0);
    host_new(&cache, F32, 2, cs, 0);
    host_new(&e, F16, 2, es, 0);
    host_new(&bias, F32, 3, bs, 0);
    host_new(&sl, F32, 1, &two, 0);
    tk_arg a[4] = {{TK_ARG_TENSOR, "query", &q.t, 0, 0},
                   {TK_ARG_TENSOR, "key", &k.t, 0, 0},
                   {TK_ARG_TENSOR, "positions", &pos.t, 0, 0},
                   {TK_ARG_TENSOR, "cos_sin_cache", &cache.t, 0, 0}};
    CHECK_RC(run_op("rotary_embedding", a, 4), TK_OK);
    tk_arg c[1] = {{TK_ARG_TENSOR, "out", &e.t, 0, 0}};
    CHECK_RC(run_op("rope_cos_sin_cache", c, 1), TK_OK);
    CHECK_RC(run_op("sinusoidal_position_encoding", c, 1), TK_OK);
    tk_arg b[2] = {{TK_ARG_TENSOR, "out", &bias.t, 0, 0}, {TK_ARG_TENSOR, "slopes", &sl.t, 0, 0}};
    CHECK_RC(run_op("alibi_bias", b, 2), TK_OK);
    host_free(&pos);
    host_free(&q);
    host_free(&k);
    host_free(&cache);
    host_free(&e);
    host_free(&bias);
    host_free(&sl);
}

static void test_validation_rotary(void)
{
    int64_t p4 = 4, p3 = 3, q[3] = {4, 8, 64}, kk[3] = {4, 2, 64}, k32[3] = {4, 2, 32}, c[2] = {100, 64},
            codd[2] = {100, 63}, cbig[2] = {100, 128};
    host_t pos, pos3, pos32, qt, kt, k32t, ct, coddt, cbigt, cf16, qbf;
    host_new(&pos, I64, 1, &p4, 0);
    host_new(&pos3, I64, 1, &p3, 0);
    host_new(&pos32, I32, 1, &p4, 0);
    host_new(&qt, F16, 3, q, 0);
    host_new(&kt, F16, 3, kk, 0);
    host_new(&k32t, F16, 3, k32, 0);
    host_new(&ct, F32, 2, c, 0);
    host_new(&coddt, F32, 2, codd, 0);
    host_new(&cbigt, F32, 2, cbig, 0);
    host_new(&cf16, F16, 2, c, 0);
    host_new(&qbf, BF16, 3, q, 0);
    tk_arg a[5] = {{TK_ARG_TENSOR, "query", &qt.t, 0, 0},
                   {TK_ARG_TENSOR, "key", &kt.t, 0, 0},
                   {TK_ARG_TENSOR, "positions", &pos.t, 0, 0},
                   {TK_ARG_TENSOR, "cos_sin_cache", &ct.t, 0, 0},
                   {TK_ARG_I64, "is_neox", NULL, 0, 0}};
    tk_op_call call;
    CHECK_RC(tk_ops__prepare(&call, "rotary_embedding", a, 5), TK_OK);
    a[3].t = &cf16.t; /* an f16 cache with f16 q/k is fine too */
    CHECK_RC(tk_ops__prepare(&call, "rotary_embedding", a, 5), TK_OK);

    a[2].t = &pos3.t;
    EXPECT_INVALID("rotary_embedding", a, 5,
                   "rotary_embedding: 'query' has shape [4, 8, 64], want the shape of 'positions' [3] followed by "
                   "[Hq, head_size]");
    a[2].t = &pos32.t;
    EXPECT_INVALID("rotary_embedding", a, 5, "rotary_embedding: 'positions' has dtype i32, want i64");
    a[2].t = &pos.t;
    a[1].t = &k32t.t;
    EXPECT_INVALID("rotary_embedding", a, 5,
                   "rotary_embedding: 'key' has shape [4, 2, 32], want head_size 64 (the last dimension of 'query' "
                   "[4, 8, 64])");
    a[1].t = &kt.t;
    a[3].t = &coddt.t;
    EXPECT_INVALID("rotary_embedding", a, 5,
                   "rotary_embedding: 'cos_sin_cache' has shape [100, 63], want [max_pos, rot_dim] with rot_dim even, "
                   "> 0 and <= head_size 64");
    a[3].t = &cbigt.t;
    EXPECT_INVALID("rotary_embedding", a, 5, "'cos_sin_cache' has shape [100, 128], want [max_pos, rot_dim]");
    a[3].t = &cf16.t;
    a[0].t = &qbf.t;
    EXPECT_INVALID("rotary_embedding", a, 5, "rotary_embedding: 'key' has dtype f16, want bf16 (the dtype of 'query')");
    host_t kbf;
    host_new(&kbf, BF16, 3, kk, 0);
    a[1].t = &kbf.t;
    EXPECT_INVALID("rotary_embedding", a, 5,
                   "rotary_embedding: 'cos_sin_cache' has dtype f16, want f32 or bf16 (the dtype of 'query')");
    a[3].t = &ct.t; /* bf16 q/k with an f32 cache */
    CHECK_RC(tk_ops__prepare(&call, "rotary_embedding", a, 5), TK_OK);
    a[1].t = &qbf.t;
    EXPECT_INVALID("rotary_embedding", a, 5,
                   "rotary_embedding: 'query' and 'key' are the same tensor; both are rotated in place");
    a[1].t = &kbf.t;
    a[4].i = 2;
    EXPECT_INVALID("rotary_embedding", a, 5,
                   "rotary_embedding: 'is_neox' is 2, want 1 (NeoX/Llama halves) or 0 (GPT-J pairs)");
    EXPECT_INVALID("rotary_embedding", a, 3, "rotary_embedding: missing argument 'cos_sin_cache'");
    host_free(&kbf);
    host_free(&pos);
    host_free(&pos3);
    host_free(&pos32);
    host_free(&qt);
    host_free(&kt);
    host_free(&k32t);
    host_free(&ct);
    host_free(&coddt);
    host_free(&cbigt);
    host_free(&cf16);
    host_free(&qbf);
}

static void test_validation_tables(void)
{
    int64_t c[2] = {16, 8}, codd[2] = {16, 7}, c2[2] = {16, 2}, c3[3] = {2, 3, 4}, h3 = 3, h2 = 2;
    host_t ct, coddt, c2t, bias, sl3, sl2, slf16;
    host_new(&ct, F32, 2, c, 0);
    host_new(&coddt, F32, 2, codd, 0);
    host_new(&c2t, F32, 2, c2, 0);
    host_new(&bias, F32, 3, c3, 0);
    host_new(&sl3, F32, 1, &h3, 0);
    host_new(&sl2, F32, 1, &h2, 0);
    host_new(&slf16, F16, 1, &h2, 0);

    rcfg k = RCFG_DEFAULT;
    tk_arg a[12] = {{TK_ARG_TENSOR, "out", &coddt.t, 0, 0},
                    {TK_ARG_F64, "base", NULL, 0, k.base},
                    {TK_ARG_I64, "scaling", NULL, 0, 0},
                    {TK_ARG_F64, "factor", NULL, 0, 1.0},
                    {TK_ARG_I64, "original_max_position_embeddings", NULL, 0, 0},
                    {TK_ARG_I64, "seq_len", NULL, 0, 0},
                    {TK_ARG_F64, "beta_fast", NULL, 0, 32},
                    {TK_ARG_F64, "beta_slow", NULL, 0, 1},
                    {TK_ARG_I64, "truncate", NULL, 1, 0},
                    {TK_ARG_F64, "attention_factor", NULL, 0, 0},
                    {TK_ARG_F64, "low_freq_factor", NULL, 0, 1},
                    {TK_ARG_F64, "high_freq_factor", NULL, 0, 4}};
    const char *op = "rope_cos_sin_cache";
    EXPECT_INVALID(op, a, 12,
                   "rope_cos_sin_cache: 'out' has shape [16, 7], want [max_pos, rot_dim] with rot_dim even and > 0");
    a[0].t = &ct.t;
    tk_op_call call;
    CHECK_RC(tk_ops__prepare(&call, op, a, 12), TK_OK);
    a[2].i = 5;
    a[2].i = 6;
    EXPECT_INVALID(op, a, 12,
                   "rope_cos_sin_cache: 'scaling' is 6, want 0 (none), 1 (linear), 2 (dynamic), 3 (yarn), 4 (llama3) "
                   "or 5 (longrope)");
    a[2].i = 0;
    a[1].f = 0;
    EXPECT_INVALID(op, a, 12, "rope_cos_sin_cache: 'base' is 0, want a finite value > 0 (rope_theta)");
    a[1].f = 1.0;
    a[2].i = 3;
    a[4].i = 4096;
    EXPECT_INVALID(op, a, 12, "rope_cos_sin_cache: 'base' is 1, want > 1 for yarn");
    a[1].f = 10000;
    a[3].f = -2;
    EXPECT_INVALID(op, a, 12, "rope_cos_sin_cache: 'factor' is -2, want a finite value > 0");
    a[3].f = 4;
    a[4].i = 0;
    EXPECT_INVALID(op, a, 12, "rope_cos_sin_cache: 'original_max_position_embeddings' is 0, want > 0 for yarn scaling");
    a[4].i = 4096;
    a[6].f = 0;
    EXPECT_INVALID(op, a, 12, "rope_cos_sin_cache: 'beta_fast' is 0 and 'beta_slow' is 1, want finite values > 0");
    a[6].f = 32;
    a[8].i = 2;
    EXPECT_INVALID(op, a, 12, "rope_cos_sin_cache: 'truncate' is 2, want 0 or 1");
    a[8].i = 1;
    CHECK_RC(tk_ops__prepare(&call, op, a, 12), TK_OK);
    a[2].i = 4;
    a[10].f = 4;
    EXPECT_INVALID(op, a, 12,
                   "rope_cos_sin_cache: 'low_freq_factor' is 4 and 'high_freq_factor' is 4, want finite values with "
                   "0 < low_freq_factor < high_freq_factor");
    a[10].f = 1;
    a[9].f = -1;
    EXPECT_INVALID(op, a, 12, "rope_cos_sin_cache: 'attention_factor' is -1, want a finite value >= 0");
    a[9].f = 0;
    a[2].i = 2;
    a[0].t = &c2t.t;
    EXPECT_INVALID(op, a, 12, "rope_cos_sin_cache: 'out' has shape [16, 2], want rot_dim > 2 for dynamic scaling");
    a[0].t = &ct.t;
    a[5].i = -1;
    EXPECT_INVALID(op, a, 12, "rope_cos_sin_cache: 'seq_len' is -1, want >= 0");
    a[5].i = 0;
    CHECK_RC(tk_ops__prepare(&call, op, a, 12), TK_OK);

    tk_arg s[2] = {{TK_ARG_TENSOR, "out", &slf16.t, 0, 0}, {TK_ARG_F64, "max_bias", NULL, 0, 8}};
    EXPECT_INVALID("alibi_slopes", s, 2, "alibi_slopes: 'out' has dtype f16, want f32");
    s[0].t = &sl2.t;
    s[1].f = 0;
    EXPECT_INVALID("alibi_slopes", s, 2, "alibi_slopes: 'max_bias' is 0, want a finite value > 0");

    tk_arg b[2] = {{TK_ARG_TENSOR, "out", &bias.t, 0, 0}, {TK_ARG_TENSOR, "slopes", &sl3.t, 0, 0}};
    EXPECT_INVALID("alibi_bias", b, 2, "alibi_bias: 'slopes' has shape [3], want [2] (the heads of 'out' [2, 3, 4])");
    b[1].t = &sl2.t;
    CHECK_RC(tk_ops__prepare(&call, "alibi_bias", b, 2), TK_OK);
    b[0].t = &ct.t;
    EXPECT_INVALID("alibi_bias", b, 2, "alibi_bias: 'out' has rank 2 (shape [16, 8]), want 3");

    tk_arg p[3] = {
        {TK_ARG_TENSOR, "out", &ct.t, 0, 0}, {TK_ARG_F64, "base", NULL, 0, -1}, {TK_ARG_I64, "offset", NULL, 0, 0}};
    const char *sp = "sinusoidal_position_encoding";
    EXPECT_INVALID(sp, p, 3, "sinusoidal_position_encoding: 'base' is -1, want a finite value > 0");
    p[1].f = 10000;
    p[2].i = -3;
    EXPECT_INVALID(sp, p, 3, "sinusoidal_position_encoding: 'offset' is -3, want >= 0");
    p[0].t = &sl2.t;
    p[2].i = 0;
    EXPECT_INVALID(sp, p, 3, "sinusoidal_position_encoding: 'out' has rank 1 (shape [2]), want 2");

    host_free(&ct);
    host_free(&coddt);
    host_free(&c2t);
    host_free(&bias);
    host_free(&sl3);
    host_free(&sl2);
    host_free(&slf16);
}

int main(void)
{
    op_test_seed();
    RUN(test_registry);
    RUN(test_rotary_embedding);
    RUN(test_rope_end_to_end);
    RUN(test_rotary_bad_position);
    RUN(test_cache_formulas);
    RUN(test_cache_known_values);
    RUN(test_cache_longrope);
    RUN(test_alibi_slopes);
    RUN(test_alibi_bias);
    RUN(test_sinusoidal);
    RUN(test_empty);
    RUN(test_validation_rotary);
    RUN(test_validation_tables);
    return th_done();
}
