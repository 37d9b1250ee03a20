/*
 * test_ops_casted.c — the casted ops (ops/casted.c): each CPU reference against an independent float64
 * computation on fresh random inputs, and the validation messages.
 *
 * The fp8 codes are decoded here with tables built from the bit layouts (not ops/dtype.c), and the
 * test also checks ops/dtype.c's fp8 and i8 conversions, which the references are built on, against
 * those tables and a brute-force nearest-code search (saturation at +-448 / +-57344, subnormals, NaN).
 * Embedding results are exact (one fp32 multiply, one rounding), so they are compared bit for bit;
 * linear results within the fp32 summation bound plus the output rounding. Shapes are ragged: D and K
 * not multiples of the kernels' vector widths, M = 1, K = 0, strided outputs, out-of-range ids, empty
 * row blocks and all-zero blocks in the sparse table.
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

/* ---- independent fp8 decoding and output rounding ---------------------------------------------- */

static double tab_e4m3[256], tab_e5m2[256];

static void build_tables(void)
{
    for (int c = 0; c < 256; c++) {
        double sign = (c & 0x80) ? -1.0 : 1.0;
        int e = (c >> 3) & 15, m = c & 7;                    /* e4m3fn: bias 7, no inf, S.1111.111 = NaN */
        if (e == 15 && m == 7)
            tab_e4m3[c] = NAN;
        else
            tab_e4m3[c] = sign * (e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10));
        e = (c >> 2) & 31, m = c & 3;                         /* e5m2: bias 15, IEEE inf and NaN */
        if (e == 31)
            tab_e5m2[c] = m == 0 ? sign * INFINITY : NAN;
        else
            tab_e5m2[c] = sign * (e == 0 ? ldexp(m, -16) : ldexp(4 + m, e - 17));
    }
}

static int is_fp8(tk_dtype dt) { return dt.code == TK_DL_FLOAT8_E4M3FN || dt.code == TK_DL_FLOAT8_E5M2; }

static double decode(tk_dtype dt, uint8_t c)
{
    if (dt.code == TK_DL_FLOAT8_E4M3FN)
        return tab_e4m3[c];
    if (dt.code == TK_DL_FLOAT8_E5M2)
        return tab_e5m2[c];
    return (double)(int8_t)c;
}

/* v (exact in double) rounded once to fp32, then to the output dtype (f32 or bf16), to nearest even. */
static double round_out(double v, tk_dtype dt)
{
    float f = (float)v;
    if (dt.bits == 32 || isnan(f))
        return f;
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

/* Same value, or both NaN; zeros must agree in sign. */
static int same_value(double a, double b)
{
    if (isnan(a) || isnan(b))
        return isnan(a) && isnan(b);
    return a == b && signbit(a) == signbit(b);
}

/* ---- host tensors ----------------------------------------------------------------------------- */

static void set_code(host_t *h, int64_t i, uint8_t c) { ((uint8_t *)h->buf)[elem_off(&h->t, i)] = c; }
static uint8_t get_code(const host_t *h, int64_t i) { return ((const uint8_t *)h->buf)[elem_off(&h->t, i)]; }

static int64_t rand_below(int64_t n) { return (int64_t)(next_u64() % (uint64_t)n); }

/* The codes of a format that stress the decoders: extremes, subnormals, zeros, NaN and inf. */
static uint8_t edge_code(tk_dtype dt)
{
    static const uint8_t e4m3[] = {0x7e, 0xfe, 0x7f, 0xff, 0x01, 0x81, 0x07, 0x08, 0x80, 0x00, 0x77};
    static const uint8_t e5m2[] = {0x7b, 0xfb, 0x7c, 0xfc, 0x7d, 0x7f, 0x01, 0x83, 0x80, 0x04};
    static const uint8_t i8[] = {0x80, 0x7f, 0x81, 0x00, 0xff, 0x01};
    if (dt.code == TK_DL_FLOAT8_E4M3FN)
        return e4m3[rand_below(sizeof e4m3)];
    if (dt.code == TK_DL_FLOAT8_E5M2)
        return e5m2[rand_below(sizeof e5m2)];
    return i8[rand_below(sizeof i8)];
}

/* A random code; one in `edge_every` is an edge code (0: never). */
static uint8_t rand_code(tk_dtype dt, int edge_every)
{
    if (edge_every && rand_below(edge_every) == 0)
        return edge_code(dt);
    return (uint8_t)next_u64();
}

static double rand_scale(void)
{
    double s = rand_below(4) == 0 ? ldexp(1.0, (int)rand_below(9) - 4) : uniform(0.01, 2.0);
    return (float)(next_u64() & 1 ? s : -s);
}

/* ---- the conversions the references are built on (ops/dtype.c) --------------------------------- */

/* The nearest finite code to v (saturating, ties to the even code), by searching the table. */
static uint8_t nearest_code(const double *tab, uint8_t maxcode, double v)
{
    double a = fabs(v);
    int best = 0;
    if (isinf(v)) /* saturates, as every finite value beyond the largest does */
        return (uint8_t)(maxcode | (v < 0 ? 0x80 : 0));
    for (int c = 1; c <= maxcode; c++) {
        double d = fabs(tab[c] - a), db = fabs(tab[best] - a);
        if (d < db || (d == db && (c & 1) == 0))
            best = c;
    }
    return (uint8_t)(best | (signbit(v) ? 0x80 : 0));
}

static void test_fp8_conversions(void)
{
    for (int c = 0; c < 256; c++) {
        CHECK(same_value(tk_ops__fp8_e4m3_to_f32((uint8_t)c), tab_e4m3[c]));
        CHECK(same_value(tk_ops__fp8_e5m2_to_f32((uint8_t)c), tab_e5m2[c]));
    }
    CHECK(tab_e4m3[0x7e] == 448 && tab_e4m3[0x01] == ldexp(1, -9) && isnan(tab_e4m3[0xff]));
    CHECK(tab_e5m2[0x7b] == 57344 && tab_e5m2[0x01] == ldexp(1, -16) && isinf(tab_e5m2[0xfc]));

    /* encodes: every code's value, the midpoints between neighbours (ties), random values over the
     * whole range, beyond the largest finite value (saturation) and below the smallest subnormal */
    double probes[4096];
    int np = 0;
    for (int c = 0; c < 127; c++) {
        probes[np++] = tab_e4m3[c];
        probes[np++] = (tab_e4m3[c] + tab_e4m3[c + 1]) / 2;
        probes[np++] = tab_e5m2[c];
        if (c < 0x7b)
            probes[np++] = (tab_e5m2[c] + tab_e5m2[c + 1]) / 2;
    }
    double fixed[] = {448,           449,           463.99,          464,           465,           480, 1e6,
                      INFINITY,      57344,         57345,           61439,         61440,         1e9, 1e-30,
                      ldexp(1, -10), ldexp(1, -11), ldexp(1.5, -10), ldexp(1, -17), ldexp(1, -18), 0.0};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        probes[np++] = fixed[i];
    while (np < 4000)
        probes[np++] = (float)ldexp(uniform(1, 2), (int)rand_below(40) - 20);
    int bad = 0;
    for (int i = 0; i < np; i++)
        for (int s = 0; s < 2 && !isnan(probes[i]); s++) {
            float v = (float)(s ? -probes[i] : probes[i]);
            uint8_t e4 = tk_ops__f32_to_fp8_e4m3(v), e5 = tk_ops__f32_to_fp8_e5m2(v);
            uint8_t w4 = nearest_code(tab_e4m3, 0x7e, v), w5 = nearest_code(tab_e5m2, 0x7b, v);
            if (e4 != w4 || e5 != w5) {
                if (bad++ < 5)
                    fprintf(stderr, "  f32_to_fp8(%.9g): e4m3 0x%02x want 0x%02x, e5m2 0x%02x want 0x%02x\n", (double)v,
                            e4, w4, e5, w5);
            }
        }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(tk_ops__f32_to_fp8_e4m3(1e6f), 0x7e);
    CHECK_EQ_INT(tk_ops__f32_to_fp8_e4m3(-INFINITY), 0xfe);
    CHECK_EQ_INT(tk_ops__f32_to_fp8_e5m2(-1e9f), 0xfb);
    CHECK(isnan(tk_ops__fp8_e4m3_to_f32(tk_ops__f32_to_fp8_e4m3(NAN))));
    CHECK(isnan(tk_ops__fp8_e5m2_to_f32(tk_ops__f32_to_fp8_e5m2(NAN))));
    /* i8: round to nearest even, saturating to [-127, 127], NaN to 0 */
    CHECK_EQ_INT(tk_ops__f32_to_i8(2.5f), 2);
    CHECK_EQ_INT(tk_ops__f32_to_i8(-3.5f), -4);
    CHECK_EQ_INT(tk_ops__f32_to_i8(126.5f), 126);
    CHECK_EQ_INT(tk_ops__f32_to_i8(300.0f), 127);
    CHECK_EQ_INT(tk_ops__f32_to_i8(-128.0f), -127);
    CHECK_EQ_INT(tk_ops__f32_to_i8(NAN), 0);
}

/* ---- casted_embedding ------------------------------------------------------------------------- */

/* One case: a [V, D] table of codes (edge codes one in 6), ids of shape ids_shape, out with rows
 * `pad` elements longer than D. Compares every element exactly. */
static int emb_case(tk_dtype wdt, tk_dtype odt, tk_dtype idt, int64_t V, int64_t D, int nd, const int64_t *ids_shape,
                    int with_scale, int64_t pad, double scale_mag)
{
    int64_t wsh[2] = {V, D}, osh[8];
    for (int i = 0; i < nd; i++)
        osh[i] = ids_shape[i];
    osh[nd] = D;
    host_t w, s, ids, out;
    host_new(&w, wdt, 2, wsh, 0);
    host_new(&s, F32, 1, &V, 0);
    host_new(&ids, idt, nd, ids_shape, 0);
    host_new(&out, odt, nd + 1, osh, pad);
    for (int64_t i = 0; i < V * D; i++)
        set_code(&w, i, rand_code(wdt, 6));
    for (int64_t v = 0; v < V; v++)
        set(&s.t, v, rand_scale() * scale_mag);
    int64_t n = numel(&ids.t);
    for (int64_t i = 0; i < n; i++)
        id_set(&ids, i, rand_below(V));
    for (int64_t i = 0; i < n * D; i++)
        set(&out.t, i, 12345.0); /* every element must be written */

    tk_arg args[4] = {{TK_ARG_TENSOR, "out", &out.t, 0, 0},
                      {TK_ARG_TENSOR, "ids", &ids.t, 0, 0},
                      {TK_ARG_TENSOR, "weight", &w.t, 0, 0},
                      {TK_ARG_TENSOR, "scale", &s.t, 0, 0}};
    int rc = op_run_cpu("casted_embedding", args, with_scale ? 4 : 3), ok = rc == TK_OK;
    if (!ok)
        fprintf(stderr, "  casted_embedding: rc %d: %s (seed %llu)\n", rc, tk_last_error(), (unsigned long long)seed);
    op_cmp cmp = op_cmp_begin(0, 0, "casted_embedding %s -> %s, ids %s, V %lld D %lld%s out", tk_ops__dtype_str(wdt),
                              tk_ops__dtype_str(odt), tk_ops__dtype_str(idt), (long long)V, (long long)D,
                              with_scale ? "" : " unscaled");
    cmp.cols = D;
    for (int64_t i = 0; ok && i < n; i++) {
        int64_t row = id_get(&ids, i);
        double sc = with_scale ? get(&s.t, row) : 1.0;
        for (int64_t c = 0; c < D; c++) {
            uint8_t code = get_code(&w, row * D + c);
            double want = round_out(with_scale ? decode(wdt, code) * sc : decode(wdt, code), odt);
            op_cmp_exact(&cmp, i * D + c, get(&out.t, i * D + c), want);
        }
    }
    if (ok && !op_cmp_end(&cmp)) {
        int64_t row = id_get(&ids, cmp.worst / D);
        fprintf(stderr, "    at the worst element: id %lld, code 0x%02x, scale %.9g\n", (long long)row,
                get_code(&w, row * D + cmp.worst % D), with_scale ? get(&s.t, row) : 1.0);
        ok = 0;
    }
    host_free(&w);
    host_free(&s);
    host_free(&ids);
    host_free(&out);
    return ok;
}

static void test_embedding(void)
{
    const tk_dtype wdts[] = {E4M3, E5M2, I8}, odts[] = {F32, BF16}, idts[] = {I32, I64};
    const int64_t dims[][2] = {{1, 1}, {5, 7}, {17, 16}, {40, 33}, {9, 100}, {3, 1030}}; /* V, D */
    int ok = 1;
    for (size_t a = 0; a < 3; a++)
        for (size_t b = 0; b < 2; b++)
            for (size_t c = 0; c < 2; c++)
                for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++) {
                    int64_t ish1[1] = {1 + rand_below(12)}, ish2[2] = {2, 1 + rand_below(5)};
                    for (int sc = is_fp8(wdts[a]) ? 0 : 1; sc < 2; sc++) {
                        ok &= emb_case(wdts[a], odts[b], idts[c], dims[d][0], dims[d][1], 1, ish1, sc, 0, 1.0);
                        ok &= emb_case(wdts[a], odts[b], idts[c], dims[d][0], dims[d][1], 2, ish2, sc, 3, 1.0);
                    }
                }
    /* scales that push decoded * scale past fp32's range (inf) and into its subnormals */
    int64_t one[1] = {64};
    ok &= emb_case(E4M3, F32, I64, 8, 24, 1, one, 1, 0, 1e37);
    ok &= emb_case(E5M2, BF16, I32, 8, 24, 1, one, 1, 0, 1e-40);
    ok &= emb_case(I8, F32, I32, 8, 24, 1, one, 1, 0, 1e-43);
    CHECK(ok);
}

static void test_embedding_ids(void)
{
    int64_t wsh[2] = {10, 4}, ish[1] = {5}, osh[2] = {5, 4}, v = 10;
    host_t w, s, ids, out;
    host_new(&w, E4M3, 2, wsh, 0);
    host_new(&s, F32, 1, &v, 0);
    host_new(&ids, I64, 1, ish, 0);
    host_new(&out, F32, 2, osh, 0);
    for (int64_t i = 0; i < 5; i++)
        id_set(&ids, i, i);
    for (int64_t i = 0; i < 20; i++)
        set(&out.t, i, 7.0);
    tk_arg args[4] = {{TK_ARG_TENSOR, "out", &out.t, 0, 0},
                      {TK_ARG_TENSOR, "ids", &ids.t, 0, 0},
                      {TK_ARG_TENSOR, "weight", &w.t, 0, 0},
                      {TK_ARG_TENSOR, "scale", &s.t, 0, 0}};
    id_set(&ids, 3, 10);
    CHECK_RC(op_run_cpu("casted_embedding", args, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(),
                   "casted_embedding: ids[3] = 10 is out of range for 'weight' [10, 4] (want 0 <= id < 10)");
    id_set(&ids, 3, -1);
    CHECK_RC(op_run_cpu("casted_embedding", args, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "ids[3] = -1 is out of range");
    id_set(&ids, 3, (int64_t)1 << 40);
    CHECK_RC(op_run_cpu("casted_embedding", args, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "ids[3] = 1099511627776 is out of range");
    int untouched = 1; /* nothing is written when an id is bad */
    for (int64_t i = 0; i < 20; i++)
        untouched &= get(&out.t, i) == 7.0;
    CHECK(untouched);
    id_set(&ids, 3, 9);
    CHECK_RC(op_run_cpu("casted_embedding", args, 4), TK_OK);
    host_free(&w);
    host_free(&s);
    host_free(&ids);
    host_free(&out);
}

static void test_embedding_validation(void)
{
    int64_t wsh[2] = {10, 4}, ish[2] = {2, 3}, osh[3] = {2, 3, 4}, bad_osh[3] = {2, 3, 5}, v = 10, v9 = 9,
            s2[2] = {10, 1};
    host_t w, wi8, s, s9, sr2, ids, idsf, out, out5;
    host_new(&w, E5M2, 2, wsh, 0);
    host_new(&wi8, I8, 2, wsh, 0);
    host_new(&s, F32, 1, &v, 0);
    host_new(&s9, F32, 1, &v9, 0);
    host_new(&sr2, F32, 2, s2, 0);
    host_new(&ids, I32, 2, ish, 0);
    host_new(&idsf, F32, 2, ish, 0);
    host_new(&out, BF16, 3, osh, 0);
    host_new(&out5, BF16, 3, bad_osh, 0);
    tk_arg a[4] = {{TK_ARG_TENSOR, "out", &out5.t, 0, 0},
                   {TK_ARG_TENSOR, "ids", &ids.t, 0, 0},
                   {TK_ARG_TENSOR, "weight", &w.t, 0, 0},
                   {TK_ARG_TENSOR, "scale", &s.t, 0, 0}};
    tk_op_call c;
    CHECK_RC(tk_ops__prepare(&c, "casted_embedding", a, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "casted_embedding: 'out' has shape [2, 3, 5], want [2, 3, 4] (the shape of 'ids' "
                                    "[2, 3], then the row width of 'weight' [10, 4])");
    a[0].t = &out.t;
    a[3].t = &s9.t;
    CHECK_RC(tk_ops__prepare(&c, "casted_embedding", a, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(),
                   "casted_embedding: 'scale' has shape [9], want [10] (one per row of 'weight' [10, 4])");
    a[3].t = &sr2.t;
    CHECK_RC(tk_ops__prepare(&c, "casted_embedding", a, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "casted_embedding: 'scale' has rank 2 (shape [10, 1]), want 1");
    a[3].t = &s.t;
    a[2].t = &wi8.t;
    CHECK_RC(tk_ops__prepare(&c, "casted_embedding", a, 4), TK_OK);
    CHECK_RC(tk_ops__prepare(&c, "casted_embedding", a, 3), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "casted_embedding: 'weight' is i8 and needs 'scale' [V]");
    a[2].t = &w.t;
    CHECK_RC(tk_ops__prepare(&c, "casted_embedding", a, 3), TK_OK); /* fp8 without a scale */
    a[1].t = &idsf.t;
    CHECK_RC(tk_ops__prepare(&c, "casted_embedding", a, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "casted_embedding: 'ids' has dtype f32, want i32 or i64");
    a[1].t = &ids.t;
    a[2].t = &out.t;
    CHECK_RC(tk_ops__prepare(&c, "casted_embedding", a, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "casted_embedding: 'weight' has dtype bf16, want i8, fp8_e4m3 or fp8_e5m2");
    host_free(&w);
    host_free(&wi8);
    host_free(&s);
    host_free(&s9);
    host_free(&sr2);
    host_free(&ids);
    host_free(&idsf);
    host_free(&out);
    host_free(&out5);
}

/* ---- casted_embedding_block_sparse ------------------------------------------------------------ */

typedef struct {
    host_t rp, ci, vals, sc;
    int64_t nrb, bs_r, bs_c, ncb, nnzb;
} bsr_t;

/* A random block table: each (row block, column block) stored with probability `density`; row block
 * 1 (when there is one) stores nothing, and the first stored block holds only zero codes. */
static void bsr_new(bsr_t *b, tk_dtype vdt, int64_t nrb, int64_t bs_r, int64_t ncb, int64_t bs_c, double density)
{
    memset(b, 0, sizeof *b);
    b->nrb = nrb, b->bs_r = bs_r, b->bs_c = bs_c, b->ncb = ncb;
    int64_t n1 = nrb + 1, cap = nrb * ncb;
    host_new(&b->rp, I32, 1, &n1, 0);
    int64_t *cols = malloc(sizeof(int64_t) * (size_t)(cap ? cap : 1));
    int64_t nnzb = 0;
    id_set(&b->rp, 0, 0);
    for (int64_t rb = 0; rb < nrb; rb++) {
        for (int64_t cb = 0; cb < ncb; cb++)
            if (rb != 1 && uniform(0, 1) < density)
                cols[nnzb++] = cb;
        id_set(&b->rp, rb + 1, nnzb);
    }
    b->nnzb = nnzb;
    int64_t vsh[3] = {nnzb, bs_r, bs_c};
    host_new(&b->ci, I32, 1, &nnzb, 0);
    host_new(&b->vals, vdt, 3, vsh, 0);
    host_new(&b->sc, F32, 1, &nnzb, 0);
    for (int64_t k = 0; k < nnzb; k++) {
        id_set(&b->ci, k, cols[k]);
        set(&b->sc.t, k, rand_scale());
        for (int64_t e = 0; e < bs_r * bs_c; e++)
            set_code(&b->vals, k * bs_r * bs_c + e, k == 0 ? 0 : rand_code(vdt, 8));
    }
    free(cols);
}

static void bsr_free(bsr_t *b)
{
    host_free(&b->rp);
    host_free(&b->ci);
    host_free(&b->vals);
    host_free(&b->sc);
}

/* The dense row `id` of the table, each element decoded and scaled in double (exact), 0 where no
 * block is stored. */
static void bsr_dense_row(const bsr_t *b, int64_t id, int with_scale, double *row)
{
    int64_t d = b->ncb * b->bs_c, rb = id / b->bs_r, r = id % b->bs_r;
    for (int64_t c = 0; c < d; c++)
        row[c] = 0.0;
    for (int64_t k = id_get(&b->rp, rb); k < id_get(&b->rp, rb + 1); k++) {
        int64_t cb = id_get(&b->ci, k);
        for (int64_t c = 0; c < b->bs_c; c++) {
            double v = decode(b->vals.t.dtype, get_code(&b->vals, (k * b->bs_r + r) * b->bs_c + c));
            row[cb * b->bs_c + c] = with_scale ? v * get(&b->sc.t, k) : v;
        }
    }
}

static int bs_case(tk_dtype vdt, tk_dtype odt, tk_dtype idt, int64_t nrb, int64_t bs_r, int64_t ncb, int64_t bs_c,
                   int64_t num_emb, double density, int with_scale, int64_t nids, int64_t pad)
{
    bsr_t b;
    bsr_new(&b, vdt, nrb, bs_r, ncb, bs_c, density);
    int64_t d = ncb * bs_c, V = num_emb ? num_emb : nrb * bs_r, osh[2] = {nids, d};
    host_t ids, out;
    host_new(&ids, idt, 1, &nids, 0);
    host_new(&out, odt, 2, osh, pad);
    for (int64_t i = 0; i < nids; i++)
        id_set(&ids, i, i < V && i < 4 ? i : rand_below(V)); /* the first rows include row block 1 */
    for (int64_t i = 0; i < nids * d; i++)
        set(&out.t, i, 12345.0);
    tk_arg args[7] = {{TK_ARG_TENSOR, "out", &out.t, 0, 0},
                      {TK_ARG_TENSOR, "ids", &ids.t, 0, 0},
                      {TK_ARG_TENSOR, "row_ptr", &b.rp.t, 0, 0},
                      {TK_ARG_TENSOR, "col_idx", &b.ci.t, 0, 0},
                      {TK_ARG_TENSOR, "values", &b.vals.t, 0, 0},
                      {TK_ARG_TENSOR, "scale", &b.sc.t, 0, 0},
                      {TK_ARG_I64, "num_embeddings", NULL, num_emb, 0}};
    if (!with_scale)
        args[5] = args[6];
    int rc = op_run_cpu("casted_embedding_block_sparse", args, with_scale ? 7 : 6), ok = rc == TK_OK;
    if (!ok)
        fprintf(stderr, "  casted_embedding_block_sparse: rc %d: %s (seed %llu)\n", rc, tk_last_error(),
                (unsigned long long)seed);
    double *row = malloc(sizeof(double) * (size_t)(d ? d : 1));
    op_cmp cmp = op_cmp_begin(0, 0, "casted_embedding_block_sparse %s -> %s, %lld x %lld blocks of %lld x %lld out",
                              tk_ops__dtype_str(vdt), tk_ops__dtype_str(odt), (long long)nrb, (long long)ncb,
                              (long long)bs_r, (long long)bs_c);
    cmp.cols = d;
    for (int64_t i = 0; ok && i < nids; i++) {
        int64_t id = id_get(&ids, i);
        bsr_dense_row(&b, id, with_scale, row);
        for (int64_t c = 0; c < d; c++)
            op_cmp_exact(&cmp, i * d + c, get(&out.t, i * d + c), round_out(row[c], odt));
    }
    if (ok && !op_cmp_end(&cmp)) {
        fprintf(stderr, "    the worst element's row is id %lld\n", (long long)id_get(&ids, cmp.worst / (d ? d : 1)));
        ok = 0;
    }
    free(row);
    host_free(&ids);
    host_free(&out);
    bsr_free(&b);
    return ok;
}

static void test_block_sparse(void)
{
    const tk_dtype vdts[] = {E4M3, E5M2, I8}, odts[] = {F32, BF16}, idts[] = {I32, I64};
    /* nrb, bs_r, ncb, bs_c */
    const int64_t geo[][4] = {{1, 1, 1, 1}, {3, 2, 4, 8}, {5, 4, 3, 16}, {4, 3, 5, 5}, {2, 1, 2, 700}, {6, 8, 2, 32}};
    int ok = 1;
    for (size_t a = 0; a < 3; a++)
        for (size_t o = 0; o < 2; o++)
            for (size_t g = 0; g < sizeof geo / sizeof geo[0]; g++) {
                const int64_t *q = geo[g];
                tk_dtype idt = idts[rand_below(2)];
                double density = g % 2 ? 0.5 : 0.8;
                for (int sc = is_fp8(vdts[a]) ? 0 : 1; sc < 2; sc++)
                    ok &= bs_case(vdts[a], odts[o], idt, q[0], q[1], q[2], q[3], 0, density, sc, 1 + rand_below(20),
                                  sc ? 0 : 2);
                /* a partial last row block: num_embeddings < nrb * bs_r */
                if (q[1] > 1)
                    ok &=
                        bs_case(vdts[a], odts[o], idt, q[0], q[1], q[2], q[3], (q[0] - 1) * q[1] + 1, density, 1, 9, 0);
            }
    /* an empty table (nnzb = 0): every row is zeros; and a full one */
    ok &= bs_case(E4M3, BF16, I32, 3, 2, 4, 8, 0, 0.0, 0, 6, 0);
    ok &= bs_case(I8, F32, I64, 3, 2, 4, 8, 0, 1.0, 1, 6, 1);
    CHECK(ok);
}

static void test_block_sparse_validation(void)
{
    bsr_t b;
    bsr_new(&b, I8, 3, 2, 4, 8, 1.0); /* row blocks 0 and 2 store 4 blocks each: nnzb 8 */
    CHECK_EQ_INT(b.nnzb, 8);
    int64_t nids = 2, osh[2] = {2, 32}, osh30[2] = {2, 30}, v3[3] = {8, 2, 0}, n7 = 7;
    host_t ids, out, out30, v0, sc7;
    host_new(&ids, I32, 1, &nids, 0);
    host_new(&out, F32, 2, osh, 0);
    host_new(&out30, F32, 2, osh30, 0);
    host_new(&v0, I8, 3, v3, 0);
    host_new(&sc7, F32, 1, &n7, 0);
    id_set(&ids, 0, 5);
    id_set(&ids, 1, 0);
    tk_arg a[7] = {{TK_ARG_TENSOR, "out", &out.t, 0, 0},       {TK_ARG_TENSOR, "ids", &ids.t, 0, 0},
                   {TK_ARG_TENSOR, "row_ptr", &b.rp.t, 0, 0},  {TK_ARG_TENSOR, "col_idx", &b.ci.t, 0, 0},
                   {TK_ARG_TENSOR, "values", &b.vals.t, 0, 0}, {TK_ARG_TENSOR, "scale", &b.sc.t, 0, 0},
                   {TK_ARG_I64, "num_embeddings", NULL, 0, 0}};
    const char *op = "casted_embedding_block_sparse";
    CHECK_RC(op_run_cpu(op, a, 7), TK_OK);

    a[0].t = &out30.t;
    CHECK_RC(op_run_cpu(op, a, 7), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "casted_embedding_block_sparse: 'out' has shape [2, 30]: its last dimension D must "
                                    "be a multiple of the block width bs_c = 8 of 'values' [8, 2, 8]");
    a[0].t = &out.t;
    a[4].t = &v0.t;
    CHECK_RC(op_run_cpu(op, a, 7), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "'values' has shape [8, 2, 0], want [nnzb, bs_r, bs_c] with block sizes >= 1");
    a[4].t = &b.vals.t;
    a[5].t = &sc7.t;
    CHECK_RC(op_run_cpu(op, a, 7), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "'scale' has shape [7], want [8] (one per stored block of 'values' [8, 2, 8])");
    a[5] = a[6];
    CHECK_RC(op_run_cpu(op, a, 6), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "casted_embedding_block_sparse: 'values' is i8 and needs 'scale' [nnzb]");
    a[5] = (tk_arg){TK_ARG_TENSOR, "scale", &b.sc.t, 0, 0};
    a[6].i = 7;
    CHECK_RC(op_run_cpu(op, a, 7), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(),
                   "'num_embeddings' is 7, want 1 to 6 (the rows of 3 row blocks of 2; 0: all of them)");
    a[6].i = 5; /* row 5 is past V = 5 */
    CHECK_RC(op_run_cpu(op, a, 7), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "casted_embedding_block_sparse: ids[0] = 5 is out of range for a table of 5 rows "
                                    "('num_embeddings') (want 0 <= id < 5)");
    a[6].i = 0;

    /* malformed CSR structures */
    id_set(&b.rp, 0, 1);
    CHECK_RC(op_run_cpu(op, a, 7), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "casted_embedding_block_sparse: row_ptr[0] = 1, want 0");
    id_set(&b.rp, 0, 0);
    id_set(&b.rp, 3, 7);
    CHECK_RC(op_run_cpu(op, a, 7), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "row_ptr[3] = 7, want 8 (nnzb, the stored blocks of 'values')");
    id_set(&b.rp, 3, 8);
    id_set(&b.rp, 2, 3); /* row_ptr = 0 4 3 8 */
    CHECK_RC(op_run_cpu(op, a, 7), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "row_ptr[2] = 3 after row_ptr[1] = 4: row_ptr must not decrease");
    id_set(&b.rp, 2, 4);
    id_set(&b.ci, 5, 4);
    CHECK_RC(op_run_cpu(op, a, 7), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "col_idx[5] = 4 is out of range (want 0 <= col < 4, the column blocks of D)");
    id_set(&b.ci, 5, 0); /* col_idx of row block 2: 0 0 2 3 */
    CHECK_RC(op_run_cpu(op, a, 7), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "col_idx[5] = 0 after col_idx[4] = 0 in row block 2: column indices must be "
                                    "strictly increasing within a row block");
    id_set(&b.ci, 5, 1);
    CHECK_RC(op_run_cpu(op, a, 7), TK_OK);

    host_free(&ids);
    host_free(&out);
    host_free(&out30);
    host_free(&v0);
    host_free(&sc7);
    bsr_free(&b);
}

/* ---- casted_linear ---------------------------------------------------------------------------- */

/* Relative rounding of one store in dtype dt. */
static double out_rel(tk_dtype dt)
{
    return dt.bits == 32 ? ldexp(1, -24) : dt.code == TK_DL_BFLOAT ? ldexp(1, -8) : ldexp(1, -11);
}

/* out[..., n] = x @ decode(W)^T * scale + bias for x of shape xs (nd dims, last K); W codes random
 * (edge codes one in `edge_every`, NaN codes replaced unless `nan_ok`); x of magnitude xmag. */
static int lin_case(tk_dtype wdt, tk_dtype xdt, int nd, const int64_t *xs, int64_t N, int with_bias, int edge_every,
                    double xmag, int64_t pad, int nan_ok)
{
    int64_t K = xs[nd - 1], M = 1, osh[8], wsh[2] = {N, K};
    for (int i = 0; i < nd - 1; i++)
        M *= xs[i];
    memcpy(osh, xs, sizeof(int64_t) * (size_t)nd);
    osh[nd - 1] = N;
    host_t x, w, s, bias, out;
    host_new(&x, xdt, nd, xs, pad);
    host_new(&w, wdt, 2, wsh, 0);
    host_new(&s, F32, 1, &N, 0);
    host_new(&bias, xdt, 1, &N, 0);
    host_new(&out, xdt, nd, osh, pad ? pad + 1 : 0);
    fill_range(&x, -xmag, xmag);
    for (int64_t i = 0; i < N * K; i++) {
        uint8_t c = rand_code(wdt, edge_every);
        while (!nan_ok && isnan(decode(wdt, c)))
            c = rand_code(wdt, 0);
        set_code(&w, i, c);
    }
    for (int64_t n = 0; n < N; n++) {
        set(&s.t, n, (wdt.code == TK_DL_INT ? 0.01 : 0.05) * rand_scale());
        set(&bias.t, n, uniform(-1, 1));
    }
    for (int64_t i = 0; i < M * N; i++)
        set(&out.t, i, 12345.0);
    tk_arg args[5] = {{TK_ARG_TENSOR, "out", &out.t, 0, 0},
                      {TK_ARG_TENSOR, "x", &x.t, 0, 0},
                      {TK_ARG_TENSOR, "weight", &w.t, 0, 0},
                      {TK_ARG_TENSOR, "scale", &s.t, 0, 0},
                      {TK_ARG_TENSOR, "bias", &bias.t, 0, 0}};
    int rc = op_run_cpu("casted_linear", args, with_bias ? 5 : 4), ok = rc == TK_OK;
    if (!ok)
        fprintf(stderr, "  casted_linear: rc %d: %s (seed %llu)\n", rc, tk_last_error(), (unsigned long long)seed);
    op_cmp cmp =
        op_cmp_begin(0, 0, "casted_linear %s x %s, M %lld N %lld K %lld%s out", tk_ops__dtype_str(xdt),
                     tk_ops__dtype_str(wdt), (long long)M, (long long)N, (long long)K, with_bias ? " + bias" : "");
    cmp.cols = N;
    cmp.inf_fails = 1;
    for (int64_t m = 0; ok && m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double acc = 0, mag = 0, sc = get(&s.t, n), b = with_bias ? get(&bias.t, n) : 0;
            for (int64_t k = 0; k < K; k++) {
                double p = get(&x.t, m * K + k) * decode(wdt, get_code(&w, n * K + k));
                acc += p;
                mag += fabs(p);
            }
            double ref = acc * sc + b;
            /* fp32 products and sums (at most K + 8 roundings of partial sums of |terms|), the scale and
             * bias steps, then one rounding to the output dtype; a NaN reference wants NaN */
            double tol = out_rel(xdt) * fabs(ref) + (double)(K + 10) * ldexp(1, -24) * (mag * fabs(sc) + fabs(b)) +
                         (xdt.code == TK_DL_FLOAT && xdt.bits == 16 ? ldexp(1, -24) : 0);
            op_cmp_tol(&cmp, m * N + n, get(&out.t, m * N + n), ref, tol);
        }
    ok = ok && op_cmp_end(&cmp);
    host_free(&x);
    host_free(&w);
    host_free(&s);
    host_free(&bias);
    host_free(&out);
    return ok;
}

static void test_linear(void)
{
    const tk_dtype wdts[] = {I8, E4M3}, xdts[] = {BF16, F32, F16};
    const int64_t mnk[][3] = {{1, 1, 1},     {1, 64, 256}, {1, 13, 33},   {3, 7, 100}, {8, 40, 16},
                              {9, 17, 1000}, {17, 5, 7},   {40, 33, 130}, {2, 3, 0}};
    int ok = 1;
    for (size_t a = 0; a < 2; a++)
        for (size_t b = 0; b < 3; b++)
            for (size_t i = 0; i < sizeof mnk / sizeof mnk[0]; i++) {
                int64_t xs2[2] = {mnk[i][0], mnk[i][2]};
                ok &= lin_case(wdts[a], xdts[b], 2, xs2, mnk[i][1], (int)(i & 1), 0, 2.0, 0, 0);
                ok &= lin_case(wdts[a], xdts[b], 2, xs2, mnk[i][1], 1, 0, 2.0, 3, 0);
            }
    /* leading dimensions flattened into M */
    int64_t xs3[3] = {2, 3, 45};
    ok &= lin_case(I8, BF16, 3, xs3, 11, 1, 0, 2.0, 0, 0);
    ok &= lin_case(E4M3, BF16, 3, xs3, 11, 0, 0, 2.0, 2, 0);
    /* extreme codes (+-448, e4m3 subnormals, i8 -128) and large activations */
    int64_t xs[2] = {4, 77};
    ok &= lin_case(E4M3, BF16, 2, xs, 9, 1, 2, 3e4, 0, 0);
    ok &= lin_case(I8, BF16, 2, xs, 9, 1, 2, 3e4, 0, 0);
    ok &= lin_case(E4M3, F32, 2, xs, 9, 1, 2, 1e-3, 0, 0);
    CHECK(ok);
}

/* A NaN code poisons exactly the channel it sits in. */
static void test_linear_nan(void)
{
    int64_t xs[2] = {3, 20}, wsh[2] = {4, 20}, n = 4, osh[2] = {3, 4};
    host_t x, w, s, out;
    host_new(&x, BF16, 2, xs, 0);
    host_new(&w, E4M3, 2, wsh, 0);
    host_new(&s, F32, 1, &n, 0);
    host_new(&out, BF16, 2, osh, 0);
    for (int64_t i = 0; i < 60; i++)
        set(&x.t, i, uniform(-1, 1));
    for (int64_t i = 0; i < 80; i++)
        set_code(&w, i, 0x38); /* 1.0 */
    for (int64_t i = 0; i < 4; i++)
        set(&s.t, i, 0.5);
    set_code(&w, 2 * 20 + 5, 0xff); /* NaN in channel 2 */
    tk_arg args[4] = {{TK_ARG_TENSOR, "out", &out.t, 0, 0},
                      {TK_ARG_TENSOR, "x", &x.t, 0, 0},
                      {TK_ARG_TENSOR, "weight", &w.t, 0, 0},
                      {TK_ARG_TENSOR, "scale", &s.t, 0, 0}};
    CHECK_RC(op_run_cpu("casted_linear", args, 4), TK_OK);
    for (int64_t m = 0; m < 3; m++) {
        double sum = 0;
        for (int64_t k = 0; k < 20; k++)
            sum += get(&x.t, m * 20 + k);
        for (int64_t c = 0; c < 4; c++) {
            double got = get(&out.t, m * 4 + c);
            if (c == 2)
                CHECK(isnan(got));
            else
                CHECK(fabs(got - 0.5 * sum) <= ldexp(1, -8) * fabs(0.5 * sum) + 1e-5);
        }
    }
    host_free(&x);
    host_free(&w);
    host_free(&s);
    host_free(&out);
}

static void test_linear_validation(void)
{
    int64_t xs[2] = {4, 32}, xs31[2] = {4, 31}, ws[2] = {16, 32}, os[2] = {4, 16}, os15[2] = {4, 15},
            os3[3] = {1, 4, 16};
    int64_t n16 = 16, n15 = 15;
    host_t x, x31, w, w5, out, out15, out3, s, s15, bias, bias15, biasf;
    host_new(&x, BF16, 2, xs, 0);
    host_new(&x31, BF16, 2, xs31, 0);
    host_new(&w, I8, 2, ws, 0);
    host_new(&w5, E5M2, 2, ws, 0);
    host_new(&out, BF16, 2, os, 0);
    host_new(&out15, BF16, 2, os15, 0);
    host_new(&out3, BF16, 3, os3, 0);
    host_new(&s, F32, 1, &n16, 0);
    host_new(&s15, F32, 1, &n15, 0);
    host_new(&bias, BF16, 1, &n16, 0);
    host_new(&bias15, BF16, 1, &n15, 0);
    host_new(&biasf, F32, 1, &n16, 0);
    tk_arg a[5] = {{TK_ARG_TENSOR, "out", &out.t, 0, 0},
                   {TK_ARG_TENSOR, "x", &x31.t, 0, 0},
                   {TK_ARG_TENSOR, "weight", &w.t, 0, 0},
                   {TK_ARG_TENSOR, "scale", &s.t, 0, 0},
                   {TK_ARG_TENSOR, "bias", &bias.t, 0, 0}};
    tk_op_call c;
    const char *op = "casted_linear";
    CHECK_RC(tk_ops__prepare(&c, op, a, 5), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "casted_linear: 'x' has shape [4, 31], want [4, 32] (its last dimension is K, the "
                                    "row width of 'weight' [16, 32])");
    a[1].t = &x.t;
    a[0].t = &out15.t;
    CHECK_RC(tk_ops__prepare(&c, op, a, 5), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "casted_linear: 'out' has shape [4, 15], want [4, 16] (the leading dimensions of "
                                    "'x' [4, 32], then N, the rows of 'weight' [16, 32])");
    a[0].t = &out3.t;
    CHECK_RC(tk_ops__prepare(&c, op, a, 5), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "'out' has shape [1, 4, 16], want [4, 16]");
    a[0].t = &out.t;
    a[3].t = &s15.t;
    CHECK_RC(tk_ops__prepare(&c, op, a, 5), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "casted_linear: 'scale' has shape [15], want [16] (one per output channel: the "
                                    "rows of 'weight' [16, 32])");
    a[3].t = &s.t;
    a[4].t = &bias15.t;
    CHECK_RC(tk_ops__prepare(&c, op, a, 5), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "casted_linear: 'bias' has shape [15], want [16]");
    a[4].t = &biasf.t;
    CHECK_RC(tk_ops__prepare(&c, op, a, 5), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "casted_linear: 'bias' has dtype f32, want bf16 (the dtype of 'x')");
    a[4].t = &bias.t;
    a[2].t = &w5.t;
    CHECK_RC(tk_ops__prepare(&c, op, a, 5), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "casted_linear: 'weight' has dtype fp8_e5m2, want i8 or fp8_e4m3");
    a[2].t = &w.t;
    CHECK_RC(tk_ops__prepare(&c, op, a, 3), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "casted_linear: missing argument 'scale'");
    CHECK_RC(tk_ops__prepare(&c, op, a, 4), TK_OK); /* bias is optional */
    CHECK_RC(tk_ops__prepare(&c, op, a, 5), TK_OK);
    host_free(&x);
    host_free(&x31);
    host_free(&w);
    host_free(&w5);
    host_free(&out);
    host_free(&out15);
    host_free(&out3);
    host_free(&s);
    host_free(&s15);
    host_free(&bias);
    host_free(&bias15);
    host_free(&biasf);
}

/* Empty calls: nothing to gather, no rows of x, no output channels. */
static void test_empty(void)
{
    int64_t z = 0, wsh[2] = {4, 8}, osh[2] = {0, 8}, xs[2] = {0, 8}, os2[2] = {0, 4}, n4 = 4;
    host_t ids, w, out, x, wl, s, ol;
    host_new(&ids, I32, 1, &z, 0);
    host_new(&w, E4M3, 2, wsh, 0);
    host_new(&out, BF16, 2, osh, 0);
    tk_arg a[3] = {{TK_ARG_TENSOR, "out", &out.t, 0, 0},
                   {TK_ARG_TENSOR, "ids", &ids.t, 0, 0},
                   {TK_ARG_TENSOR, "weight", &w.t, 0, 0}};
    CHECK_RC(op_run_cpu("casted_embedding", a, 3), TK_OK);
    host_new(&x, BF16, 2, xs, 0);
    host_new(&wl, I8, 2, wsh, 0);
    host_new(&s, F32, 1, &n4, 0);
    host_new(&ol, BF16, 2, os2, 0);
    tk_arg l[4] = {{TK_ARG_TENSOR, "out", &ol.t, 0, 0},
                   {TK_ARG_TENSOR, "x", &x.t, 0, 0},
                   {TK_ARG_TENSOR, "weight", &wl.t, 0, 0},
                   {TK_ARG_TENSOR, "scale", &s.t, 0, 0}};
    CHECK_RC(op_run_cpu("casted_linear", l, 4), TK_OK);
    host_free(&ids);
    host_free(&w);
    host_free(&out);
    host_free(&x);
    host_free(&wl);
    host_free(&s);
    host_free(&ol);
}

static void test_registry(void)
{
    const char *names[] = {"casted_embedding", "casted_embedding_block_sparse", "casted_linear"};
    for (size_t i = 0; i < 3; i++) {
        const tk_op_desc *op = tk_ops__find(names[i]);
        CHECK(op != NULL);
        if (!op)
            continue;
        CHECK_STR(op->family, "casted");
        CHECK_STR(op->package, "kernels-community/casted");
        CHECK(op->cpu != NULL && op->check != NULL);
    }
    tk_buf b = TK_BUF_INIT;
    CHECK_RC(tk_ops__signature(&b, tk_ops__find("casted_linear")), TK_OK);
    CHECK_STR(b.data, "casted_linear(out: T[..., N], x: T[..., K], weight: i8|fp8_e4m3[N, K], scale: f32[N], "
                      "bias: T[N]?) -> out; T in {f32, f16, bf16}");
    tk__buf_free(&b);
}

int main(void)
{
    op_test_seed();
    build_tables();
    RUN(test_registry);
    RUN(test_fp8_conversions);
    RUN(test_embedding);
    RUN(test_embedding_ids);
    RUN(test_embedding_validation);
    RUN(test_block_sparse);
    RUN(test_block_sparse_validation);
    RUN(test_linear);
    RUN(test_linear_nan);
    RUN(test_linear_validation);
    RUN(test_empty);
    return th_done();
}
