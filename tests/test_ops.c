/*
 * test_ops.c — the op registry: every CPU reference against an independent float64 computation on
 * fresh random inputs (ragged shapes, strided views, edge values, f32/f16/bf16), the half/bfloat16
 * conversions exhaustively, and the validation messages.
 *
 * Uses only ops/ and common/ (no context, no package API). Inputs are random with a seed printed on
 * any failure; set TK_TEST_SEED to replay one.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "op_test.h"
#include "tensor_util.h"
#include "api/api.h"
#include "ops/ops.h"

/* ---- the float64 references (independent of ops/activation.c) --------------------------------- */

static double r_silu(double x, double p)
{
    (void)p;
    return x / (1.0 + exp(-x));
}
static double r_gelu(double x, double p)
{
    (void)p;
    return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
}
static double r_gelu_tanh(double x, double p)
{
    (void)p;
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
static double r_gelu_new(double x, double p)
{
    (void)p;
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * pow(x, 3.0))));
}
static double r_gelu_fast(double x, double p)
{
    (void)p;
    return 0.5 * x * (1.0 + tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)));
}
static double r_gelu_quick(double x, double p)
{
    (void)p;
    return x / (1.0 + exp(-1.702 * x));
}
static double r_fatrelu(double x, double th) { return x > (double)(float)th ? x : 0.0; }

typedef struct {
    const char *op;
    double (*f)(double, double);
    int gated, act_first;
} ref_op;

static const ref_op refs[] = {
    {"silu_and_mul", r_silu, 1, 1},       {"mul_and_silu", r_silu, 1, 0},
    {"gelu_and_mul", r_gelu, 1, 1},       {"gelu_tanh_and_mul", r_gelu_tanh, 1, 1},
    {"fatrelu_and_mul", r_fatrelu, 1, 1}, {"gelu", r_gelu, 0, 0},
    {"gelu_tanh", r_gelu_tanh, 0, 0},     {"silu", r_silu, 0, 0},
    {"gelu_new", r_gelu_new, 0, 0},       {"gelu_fast", r_gelu_fast, 0, 0},
    {"gelu_quick", r_gelu_quick, 0, 0},
};
#define NREFS (sizeof refs / sizeof refs[0])

/* |got-ref| <= atol + rtol*|ref|, per dtype. */
static void tolerances(tk_dtype dt, double *atol, double *rtol)
{
    if (dt.bits == 32) {
        *atol = 5e-6;
        *rtol = 2e-6;
    } else if (dt.code == TK_DL_BFLOAT) {
        *atol = 1e-5;
        *rtol = 8e-3;
    } else {
        *atol = 1e-5;
        *rtol = 1e-3;
    }
}

/* Runs op on `in` into `out` through the registry, then compares every element with the float64
 * reference (a reference beyond the dtype's range wants the inf it rounds to). Returns 1 when all
 * match; prints the worst element and its input otherwise. */
static int run_and_compare(const ref_op *r, host_t *out, host_t *in, double threshold, const char *what)
{
    tk_arg args[3] = {{TK_ARG_TENSOR, "out", &out->t, 0, 0},
                      {TK_ARG_TENSOR, "input", &in->t, 0, 0},
                      {TK_ARG_F64, "threshold", NULL, 0, threshold}};
    size_t nargs = strcmp(r->op, "fatrelu_and_mul") == 0 ? 3 : 2;
    int rc = op_run_cpu(r->op, args, nargs);
    if (rc != TK_OK) {
        fprintf(stderr, "  %s %s %s: rc %d: %s (seed %llu)\n", r->op, tk_ops__dtype_str(in->t.dtype), what, rc,
                tk_last_error(), (unsigned long long)seed);
        return 0;
    }
    double atol, rtol;
    tolerances(out->t.dtype, &atol, &rtol);
    int64_t n = numel(&out->t), d = out->t.ndim ? out->t.shape[out->t.ndim - 1] : 1;
    op_cmp c = op_cmp_begin(atol, rtol, "%s %s %s %s", r->op, tk_ops__dtype_str(in->t.dtype), what,
                            tk_ops__shape_fmt(out->t.ndim, out->t.shape));
    c.cols = d;
    for (int64_t i = 0; i < n; i++) {
        int64_t row = i / d, col = i % d;
        double ref;
        if (r->gated) {
            double x = get(&in->t, row * 2 * d + col), y = get(&in->t, row * 2 * d + d + col);
            ref = r->act_first ? r->f(x, threshold) * y : x * r->f(y, threshold);
        } else {
            ref = r->f(get(&in->t, i), threshold);
        }
        op_cmp_at(&c, i, get(&out->t, i), op_stored_inf(ref, out->t.dtype));
    }
    if (op_cmp_end(&c))
        return 1;
    int64_t row = c.worst / d, col = c.worst % d;
    fprintf(stderr, "    at the worst element x=%.9g\n",
            r->gated ? get(&in->t, row * 2 * d + col) : get(&in->t, c.worst));
    return 0;
}

/* One op on one shape (the shape of out's rows: rows x d, written as ndim dims) in every dtype. */
static int check_shape(const ref_op *r, int ndim, const int64_t *oshape, int64_t pad_in, int64_t pad_out)
{
    int ok = 1;
    int64_t ishape[8];
    memcpy(ishape, oshape, sizeof(int64_t) * (size_t)ndim);
    if (r->gated)
        ishape[ndim - 1] *= 2;
    for (size_t k = 0; k < 3; k++) {
        host_t in, out;
        host_new(&in, *all_dtypes[k], ndim, ishape, pad_in);
        host_new(&out, *all_dtypes[k], ndim, oshape, pad_out);
        fill(&in, uniform(0.5, 6.0));
        double th = uniform(-1.0, 1.0);
        char what[64];
        snprintf(what, sizeof what, "%s%s", pad_in ? "strided-in " : "",
                 pad_out  ? "strided-out"
                 : pad_in ? ""
                          : "contiguous");
        ok &= run_and_compare(r, &out, &in, th, what);
        host_free(&in);
        host_free(&out);
    }
    return ok;
}

/* ---- tests ------------------------------------------------------------------------------------ */

static void test_registry(void)
{
    CHECK(tk_ops__count() >= NREFS);
    for (size_t i = 0; i < NREFS; i++) {
        const tk_op_desc *op = tk_ops__find(refs[i].op);
        CHECK(op != NULL);
        if (!op)
            continue;
        CHECK_STR(op->name, refs[i].op);
        CHECK(op->cpu != NULL && op->check != NULL);
    }
    for (size_t i = 0; i < tk_ops__count(); i++)
        CHECK(tk_ops__find(tk_ops__at(i)->name) == tk_ops__at(i));
    CHECK(tk_ops__at(tk_ops__count()) == NULL);
    CHECK(tk_ops__find("nope") == NULL);

    tk_buf b = TK_BUF_INIT;
    CHECK_RC(tk_ops__signature(&b, tk_ops__find("silu_and_mul")), TK_OK);
    CHECK_STR(b.data, "silu_and_mul(out: T[..., d], input: T[..., 2*d]) -> out; T in {f32, f16, bf16}");
    tk__buf_free(&b);
    CHECK_RC(tk_ops__signature(&b, tk_ops__find("fatrelu_and_mul")), TK_OK);
    CHECK_CONTAINS(b.data, ", threshold: f64 = 0) -> out;");
    tk__buf_free(&b);
}

static void test_dtype_names(void)
{
    tk_dtype dt;
    CHECK_RC(tk_ops__dtype_parse(&dt, "bf16"), TK_OK);
    CHECK(dt.code == TK_DL_BFLOAT && dt.bits == 16 && dt.lanes == 1);
    CHECK_STR(tk_ops__dtype_str(dt), "bf16");
    CHECK_STR(tk_ops__dtype_str(F16), "f16");
    CHECK_STR(tk_ops__dtype_str(F32), "f32");
    CHECK_RC(tk_ops__dtype_parse(&dt, "float17"), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "unknown dtype 'float17'");
    /* the public parser takes the spellings people type; manifests keep one name per dtype */
    static const struct {
        const char *in, *want;
    } alias[] = {{"half", "f16"},
                 {"fp16", "f16"},
                 {"float16", "f16"},
                 {"FP16", "f16"},
                 {"bfloat16", "bf16"},
                 {"BF16", "bf16"},
                 {"float32", "f32"},
                 {"fp32", "f32"},
                 {"float", "f32"},
                 {"double", "f64"},
                 {"int8", "i8"},
                 {"uint8", "u8"},
                 {"int64", "i64"},
                 {"float8_e4m3fn", "fp8_e4m3"},
                 {"float8_e5m2", "fp8_e5m2"}};
    for (size_t i = 0; i < sizeof alias / sizeof *alias; i++) {
        CHECK_RC(tk_dtype_parse(&dt, alias[i].in), TK_OK);
        CHECK_STR(tk_dtype_name(dt), alias[i].want);
    }
    CHECK_RC(tk_ops__dtype_parse(&dt, "half"), TK_ERR_INVALID);
    CHECK_RC(tk_dtype_parse(&dt, "float17"), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "float16/fp16/half");
    tk_dtype odd = {TK_DL_FLOAT, 32, 4};
    CHECK_STR(tk_ops__dtype_str(odd), "?");
    CHECK_EQ_INT(tk_ops__dtype_size(BF16), 2);
}

/* The half value of bits h computed from its fields with ldexp: independent of the library. */
static double half_value(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    double s = (h & 0x8000) ? -1.0 : 1.0;
    if (e == 31)
        return m ? NAN : s * INFINITY;
    return e ? s * ldexp(1024 + m, e - 25) : s * ldexp(m, -24);
}

static void test_f16_exhaustive(void)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        double want = half_value((uint16_t)h);
        float got = tk_ops__f16_to_f32((uint16_t)h);
        if (isnan(want) ? !isnan(got) : (double)got != want || !signbit(got) != !signbit(want))
            bad++;
        /* round trip, NaNs come back as NaN */
        uint16_t back = tk_ops__f32_to_f16(got);
        if (isnan(want) ? (back & 0x7c00) != 0x7c00 || !(back & 0x3ff) : back != h)
            bad++;
    }
    CHECK_EQ_INT(bad, 0);
    /* Round to nearest even at every midpoint between neighbours (positive finite halves). */
    bad = 0;
    for (uint32_t h = 0; h < 0x7bff; h++) {
        float a = (float)half_value((uint16_t)h), b = (float)half_value((uint16_t)(h + 1));
        float mid = (float)(((double)a + (double)b) / 2); /* exact in f32 */
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        if (tk_ops__f32_to_f16(mid) != even || tk_ops__f32_to_f16(nextafterf(mid, 0)) != h ||
            tk_ops__f32_to_f16(nextafterf(mid, INFINITY)) != h + 1 || tk_ops__f32_to_f16(-mid) != (even | 0x8000))
            bad++;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(tk_ops__f32_to_f16(65504.0f), 0x7bff);
    CHECK_EQ_INT(tk_ops__f32_to_f16(65519.99f), 0x7bff);
    CHECK_EQ_INT(tk_ops__f32_to_f16(65520.0f), 0x7c00);
    CHECK_EQ_INT(tk_ops__f32_to_f16(-1e30f), 0xfc00);
    CHECK_EQ_INT(tk_ops__f32_to_f16(INFINITY), 0x7c00);
    CHECK_EQ_INT(tk_ops__f32_to_f16(0x1.0p-25f), 0x0000);            /* a tie with 0: even */
    CHECK_EQ_INT(tk_ops__f32_to_f16(nextafterf(0x1.0p-25f, 1)), 1);  /* just above: the smallest */
    CHECK_EQ_INT(tk_ops__f32_to_f16(1e-30f), 0);
    CHECK_EQ_INT(tk_ops__f32_to_f16(-0.0f), 0x8000);
    CHECK(isnan(tk_ops__f16_to_f32(tk_ops__f32_to_f16(NAN))));
}

static void test_bf16_exhaustive(void)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float got = tk_ops__bf16_to_f32((uint16_t)h);
        uint32_t bits;
        memcpy(&bits, &got, 4);
        if (bits != h << 16)
            bad++;
        uint16_t back = tk_ops__f32_to_bf16(got);
        if (isnan(got) ? !isnan(tk_ops__bf16_to_f32(back)) : back != h)
            bad++;
    }
    CHECK_EQ_INT(bad, 0);
    bad = 0;
    for (uint32_t h = 0; h < 0x7f7f; h++) { /* positive finite neighbours */
        float a = tk_ops__bf16_to_f32((uint16_t)h), b = tk_ops__bf16_to_f32((uint16_t)(h + 1));
        float mid = (float)(((double)a + (double)b) / 2);
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        if (tk_ops__f32_to_bf16(mid) != even || tk_ops__f32_to_bf16(nextafterf(mid, 0)) != h ||
            tk_ops__f32_to_bf16(nextafterf(mid, INFINITY)) != h + 1)
            bad++;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(tk_ops__f32_to_bf16(3.4028235e38f), 0x7f80); /* FLT_MAX rounds up to inf */
    CHECK(isnan(tk_ops__bf16_to_f32(tk_ops__f32_to_bf16(NAN))));
    float snan;
    uint32_t sb = 0x7f800001u; /* a signalling NaN whose payload is all in the dropped bits */
    memcpy(&snan, &sb, 4);
    CHECK(isnan(tk_ops__bf16_to_f32(tk_ops__f32_to_bf16(snan))));
}

/* Ragged shapes: d not a multiple of 8, d = 1, a single row, many rows, a row longer than one work
 * block, enough work to use several threads, rank 1 and 3. */
static void test_activations_ragged(void)
{
    static const int64_t shapes[][3] = {
        {1, 1, 0},    {1, 7, 0},    {3, 13, 0},   {4, 8, 0},      {64, 33, 0},
        {1, 5000, 0}, {2049, 3, 0}, {7, 1024, 0}, {300, 1001, 0}, {1, 300001, 0},
    };
    for (size_t i = 0; i < NREFS; i++) {
        int ok = 1;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            ok &= check_shape(&refs[i], 2, shapes[s], 0, 0);
        int64_t r1[1] = {9}, r3[3] = {2, 3, 5};
        ok &= check_shape(&refs[i], 1, r1, 0, 0);
        ok &= check_shape(&refs[i], 3, r3, 0, 0);
        if (!refs[i].gated) {
            int64_t r0[1] = {0};
            ok &= check_shape(&refs[i], 0, r0, 0, 0); /* a scalar */
        }
        CHECK(ok);
    }
}

static void test_activations_strided(void)
{
    static const int64_t shapes[][2] = {{5, 7}, {3, 1}, {16, 64}, {2, 2000}};
    for (size_t i = 0; i < NREFS; i++) {
        int ok = 1;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            ok &= check_shape(&refs[i], 2, shapes[s], 3, 0);
            ok &= check_shape(&refs[i], 2, shapes[s], 0, 5);
            ok &= check_shape(&refs[i], 2, shapes[s], 1, 2);
        }
        CHECK(ok);
    }
    /* A transposed view (strides [1, rows]) must give what the contiguous copy gives. */
    for (size_t i = 0; i < NREFS; i++) {
        if (refs[i].gated)
            continue;
        int64_t shp[2] = {6, 11};
        host_t a, out;
        host_new(&a, F32, 2, shp, 0);
        host_new(&out, F32, 2, shp, 0);
        int64_t tshape[2] = {11, 6}, tstr[2] = {1, 11};
        fill(&a, 4.0);
        a.t.shape = tshape;
        a.t.strides = tstr;
        out.t.shape = tshape;
        out.t.strides = tstr;
        CHECK(run_and_compare(&refs[i], &out, &a, 0, "transposed"));
        host_free(&a);
        host_free(&out);
    }
}

/* Large and tiny magnitudes, zeros, infinities and NaN. */
static void test_activations_edges(void)
{
    static const double edges[] = {0.0,  -0.0,   1e-30,  -1e-30, 1e-8,  -1e-8, 6e-8,  0.5,      -0.5,      1.0,   -1.0,
                                   3.0,  -3.0,   10.0,   -10.0,  20.0,  -20.0, 80.0,  -80.0,    100.0,     -100., 1e4,
                                   -1e4, 65504., -65504, 1e20,   -1e20, 3e38,  -3e38, INFINITY, -INFINITY, NAN};
    const size_t ne = sizeof edges / sizeof edges[0];
    static const double mults[] = {1.0, -2.0, 0.0, 0.25, 1e-3, 7.5, INFINITY, -INFINITY, NAN, 1e30};
    const size_t nm = sizeof mults / sizeof mults[0];
    for (size_t i = 0; i < NREFS; i++) {
        const ref_op *r = &refs[i];
        int ok = 1;
        for (size_t k = 0; k < 3; k++) {
            tk_dtype dt = *all_dtypes[k];
            host_t in, out;
            if (!r->gated) {
                int64_t shp[1] = {(int64_t)ne};
                host_new(&in, dt, 1, shp, 0);
                host_new(&out, dt, 1, shp, 0);
                for (size_t e = 0; e < ne; e++)
                    set(&in.t, (int64_t)e, edges[e]);
            } else {
                /* Row e: the edge in the activated half, a moderate multiplier in the other; and the
                 * other way round, moderate activations times the extreme multipliers. (An activation
                 * that underflows to 0 in fp32 but not in f64, times inf, gives NaN against inf: no
                 * fair comparison, so those pairs are left out.) */
                int64_t rows = (int64_t)(ne * 4 + nm * 3);
                int64_t ishp[2] = {rows, 2}, oshp[2] = {rows, 1};
                host_new(&in, dt, 2, ishp, 0);
                host_new(&out, dt, 2, oshp, 0);
                int64_t row = 0;
                for (size_t e = 0; e < ne; e++)
                    for (size_t m = 0; m < 4; m++, row++) {
                        set(&in.t, row * 2 + (r->act_first ? 0 : 1), edges[e]);
                        set(&in.t, row * 2 + (r->act_first ? 1 : 0), mults[m]);
                    }
                static const double moderate[] = {1.5, -2.0, 0.25};
                for (size_t m = 0; m < nm; m++)
                    for (size_t v = 0; v < 3; v++, row++) {
                        set(&in.t, row * 2 + (r->act_first ? 0 : 1), moderate[v]);
                        set(&in.t, row * 2 + (r->act_first ? 1 : 0), mults[m]);
                    }
            }
            ok &= run_and_compare(r, &out, &in, 0.0, "edges");
            /* fatrelu with a threshold of its own */
            if (strcmp(r->op, "fatrelu_and_mul") == 0)
                ok &= run_and_compare(r, &out, &in, 0.7, "edges threshold 0.7");
            host_free(&in);
            host_free(&out);
        }
        CHECK(ok);
    }
}

/* The comparison every op test relies on (tests/op_test.h) fails where it must: an element just past
 * its tolerance, NaN or inf where the reference is finite, the policies for NaN and inf references,
 * the sign of a zero when exact; and it names the worst element. */
static void test_op_cmp(void)
{
    fprintf(stderr, "test_op_cmp: the comparison failures printed below are expected\n");
    op_cmp c = op_cmp_begin(1e-3, 1e-2, "inside");
    op_cmp_at(&c, 0, 1.0 + 0.011 - 1e-12, 1.0); /* tol = 1e-3 + 1e-2 * 1 */
    op_cmp_at(&c, 1, -2.0 - 0.021 + 1e-12, -2.0);
    op_cmp_at(&c, 2, NAN, NAN);
    op_cmp_at(&c, 3, -INFINITY, -INFINITY);
    CHECK(op_cmp_end(&c));
    CHECK_EQ_INT(c.n, 4);

    c = op_cmp_begin(1e-3, 1e-2, "outside");
    c.cols = 2;
    op_cmp_at(&c, 0, 1.0, 1.0);
    op_cmp_at(&c, 1, 2.0 + 0.021 + 1e-9, 2.0); /* just past */
    op_cmp_at(&c, 2, 5.5, 5.0);                /* far past: the worst */
    op_cmp_at(&c, 3, 3.0, 3.0);
    CHECK(!op_cmp_end(&c));
    CHECK_EQ_INT(c.bad, 2);
    CHECK_EQ_INT(c.worst, 2);

    const double gots[] = {NAN, INFINITY, 1e30, 0.0, -INFINITY};
    const double refs[] = {0.0, 1e300, INFINITY, NAN, INFINITY};
    for (int i = 0; i < 5; i++) { /* NaN or inf against a finite ref, a finite or other value against them */
        c = op_cmp_begin(1e300, 1, "non-finite %d", i);
        op_cmp_at(&c, 0, gots[i], refs[i]);
        CHECK(!op_cmp_end(&c));
    }
    c = op_cmp_begin(0, 0, "nan_fails");
    c.nan_fails = 1;
    op_cmp_at(&c, 0, NAN, NAN);
    CHECK(!op_cmp_end(&c));
    c = op_cmp_begin(0, 0, "inf_fails");
    c.inf_fails = 1;
    op_cmp_tol(&c, 0, INFINITY, INFINITY, INFINITY);
    CHECK(!op_cmp_end(&c));

    c = op_cmp_begin(0, 0, "own tolerance");
    op_cmp_tol(&c, 0, 1.5, 1.0, 0.5);
    CHECK(op_cmp_end(&c));
    op_cmp_tol(&c, 1, 1.5, 1.0, 0.25);
    CHECK(!op_cmp_end(&c));
    CHECK_EQ_INT(c.worst, 1);

    c = op_cmp_begin(0, 0, "exact");
    op_cmp_exact(&c, 0, 0.0, 0.0);
    op_cmp_exact(&c, 1, NAN, NAN);
    op_cmp_exact(&c, 2, 0x1p-1074, 0x1p-1074);
    CHECK(op_cmp_end(&c));
    op_cmp_exact(&c, 3, -0.0, 0.0);
    CHECK(!op_cmp_end(&c));
    CHECK_EQ_INT(c.worst, 3);

    /* a reference beyond the dtype's range is that inf only through op_stored_inf */
    CHECK(op_stored_inf(1e6, F16) == INFINITY && op_stored_inf(-1e39, BF16) == -INFINITY);
    CHECK(op_stored_inf(1e6, F32) == 1e6 && op_stored_inf(1.25, F16) == 1.25);

    /* the tensor form reads a strided view and reports [row, col] of its last dimension */
    int64_t shp[2] = {3, 5};
    host_t h;
    host_new(&h, BF16, 2, shp, 2);
    fill_range(&h, -1, 1);
    double *want = op_values(&h.t);
    CHECK(op_close_tensor("strided bf16", &h.t, want, 0, 0));
    want[7] += 0.5;
    CHECK(!op_close_tensor("strided bf16, element [1, 2] off", &h.t, want, 0.1, 0));
    free(want);
    host_free(&h);
}

static void test_fatrelu_semantics(void)
{
    /* x[:d] = {-1, 0.5, 0.7, 2, NaN}, x[d:] = 3: threshold 0.6 keeps 0.7 and 2, NaN becomes 0. */
    int64_t ishp[2] = {1, 10}, oshp[2] = {1, 5};
    host_t in, out;
    host_new(&in, F32, 2, ishp, 0);
    host_new(&out, F32, 2, oshp, 0);
    float *x = in.buf;
    const float v[5] = {-1.0f, 0.5f, 0.7f, 2.0f, NAN};
    for (int i = 0; i < 5; i++) {
        x[i] = v[i];
        x[5 + i] = 3.0f;
    }
    tk_arg args[3] = {
        {TK_ARG_TENSOR, NULL, &out.t, 0, 0}, {TK_ARG_TENSOR, NULL, &in.t, 0, 0}, {TK_ARG_F64, NULL, NULL, 0, 0.6}};
    tk_op_call c;
    CHECK_RC(tk_ops__prepare(&c, "fatrelu_and_mul", args, 3), TK_OK);
    CHECK_RC(tk_ops__run_cpu(&c), TK_OK);
    const float *o = out.buf;
    CHECK(o[0] == 0.0f && o[1] == 0.0f && o[2] == 0.7f * 3.0f && o[3] == 6.0f && o[4] == 0.0f);
    /* the default threshold is 0; an integer scalar is accepted for it */
    tk_arg iargs[3] = {{TK_ARG_TENSOR, "input", &in.t, 0, 0},
                       {TK_ARG_TENSOR, "out", &out.t, 0, 0},
                       {TK_ARG_I64, "threshold", NULL, 1, 0}};
    CHECK_RC(tk_ops__prepare(&c, "fatrelu_and_mul", iargs, 2), TK_OK);
    CHECK(c.f[2] == 0.0);
    CHECK_RC(tk_ops__prepare(&c, "fatrelu_and_mul", iargs, 3), TK_OK);
    CHECK(c.f[2] == 1.0);
    CHECK_RC(tk_ops__run_cpu(&c), TK_OK);
    CHECK(o[0] == 0.0f && o[1] == 0.0f && o[2] == 0.0f && o[3] == 6.0f);
    host_free(&in);
    host_free(&out);
}

/* The fp32 reference evaluates the documented formula in fp32, in the kernel's order. */
static void test_f32_formula_order(void)
{
    int64_t ishp[2] = {1, 2 * 257}, oshp[2] = {1, 257};
    host_t in, out;
    host_new(&in, F32, 2, ishp, 0);
    host_new(&out, F32, 2, oshp, 0);
    fill(&in, 8.0);
    tk_arg args[2] = {{TK_ARG_TENSOR, NULL, &out.t, 0, 0}, {TK_ARG_TENSOR, NULL, &in.t, 0, 0}};
    tk_op_call c;
    CHECK_RC(tk_ops__prepare(&c, "silu_and_mul", args, 2), TK_OK);
    CHECK_RC(tk_ops__run_cpu(&c), TK_OK);
    const float *x = in.buf, *o = out.buf;
    int bad = 0;
    for (int i = 0; i < 257; i++) {
        volatile float e = expf(-x[i]);
        volatile float den = 1.0f + e;
        volatile float s = x[i] / den;
        volatile float want = s * x[257 + i];
        bad += o[i] != want;
    }
    CHECK_EQ_INT(bad, 0);
    host_free(&in);
    host_free(&out);
}

static void test_empty(void)
{
    int64_t ishp[2] = {0, 8}, oshp[2] = {0, 4};
    host_t in, out;
    host_new(&in, BF16, 2, ishp, 0);
    host_new(&out, BF16, 2, oshp, 0);
    in.t.data = out.t.data = NULL; /* no elements: no data needed */
    tk_arg args[2] = {{TK_ARG_TENSOR, NULL, &out.t, 0, 0}, {TK_ARG_TENSOR, NULL, &in.t, 0, 0}};
    tk_op_call c;
    CHECK_RC(tk_ops__prepare(&c, "gelu_and_mul", args, 2), TK_OK);
    CHECK_RC(tk_ops__run_cpu(&c), TK_OK);
    int64_t i2[2] = {3, 0}, o2[2] = {3, 0};
    in.t.shape = i2;
    out.t.shape = o2;
    CHECK_RC(tk_ops__prepare(&c, "silu_and_mul", args, 2), TK_OK);
    CHECK_RC(tk_ops__run_cpu(&c), TK_OK);
    host_free(&in);
    host_free(&out);
}

/* ---- validation ------------------------------------------------------------------------------- */

static int prep2(const char *op, tk_tensor *out, tk_tensor *in)
{
    tk_arg args[2] = {{TK_ARG_TENSOR, "out", out, 0, 0}, {TK_ARG_TENSOR, "input", in, 0, 0}};
    tk_op_call c;
    return tk_ops__prepare(&c, op, args, 2);
}

static void test_validation(void)
{
    int64_t ishp[2] = {4, 16}, oshp[2] = {4, 8};
    host_t in, out;
    host_new(&in, F32, 2, ishp, 0);
    host_new(&out, F32, 2, oshp, 0);
    tk_op_call c;

    CHECK_RC(prep2("silu_and_mul", &out.t, &in.t), TK_OK);

    CHECK_RC(prep2("silu_and_mull", &out.t, &in.t), TK_ERR_NOT_FOUND);
    CHECK_CONTAINS(tk_last_error(), "unknown op 'silu_and_mull'");
    CHECK_CONTAINS(tk_last_error(), "did you mean 'silu_and_mul'?");
    CHECK_RC(prep2("frobnicate_everything", &out.t, &in.t), TK_ERR_NOT_FOUND);
    CHECK_CONTAINS(tk_last_error(), "'tk ops' lists every op");
    CHECK_RC(tk_ops__prepare(&c, NULL, NULL, 0), TK_ERR_INVALID);

    /* wrong shapes */
    out.shape[1] = 7;
    CHECK_RC(prep2("silu_and_mul", &out.t, &in.t), TK_ERR_INVALID);
    CHECK_STR(tk_last_error(), "silu_and_mul: 'out' has shape [4, 7], want [4, 8] (input [4, 16] halves its last "
                               "dimension)");
    out.shape[1] = 8;
    out.shape[0] = 5;
    CHECK_RC(prep2("gelu_tanh_and_mul", &out.t, &in.t), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "'out' has shape [5, 8], want [4, 8]");
    out.shape[0] = 4;
    in.shape[1] = 15;
    CHECK_RC(prep2("silu_and_mul", &out.t, &in.t), TK_ERR_INVALID);
    CHECK_STR(tk_last_error(), "silu_and_mul: 'input' has shape [4, 15]: its last dimension must be even (2*d)");
    in.shape[1] = 16;
    CHECK_RC(prep2("gelu", &out.t, &in.t), TK_ERR_INVALID);
    CHECK_STR(tk_last_error(), "gelu: 'out' has shape [4, 8], want [4, 16] (the shape of 'input')");
    in.shape[1] = -16;
    CHECK_RC(prep2("silu", &in.t, &in.t), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "dimension 1 is negative");
    in.shape[1] = 16;

    /* wrong ranks */
    out.t.ndim = 1;
    out.shape[0] = 8;
    CHECK_RC(prep2("silu_and_mul", &out.t, &in.t), TK_ERR_INVALID);
    CHECK_STR(tk_last_error(), "silu_and_mul: 'out' has shape [8], want [4, 8] (input [4, 16] halves its last "
                               "dimension)");
    out.t.ndim = 2;
    out.shape[0] = 4;
    in.t.ndim = 0;
    CHECK_RC(prep2("mul_and_silu", &out.t, &in.t), TK_ERR_INVALID);
    CHECK_STR(tk_last_error(), "mul_and_silu: 'input' has rank 0 (shape []), want at least 1");
    in.t.ndim = 2;

    /* wrong dtypes */
    in.t.dtype = (tk_dtype){TK_DL_INT, 32, 1};
    CHECK_RC(prep2("silu_and_mul", &out.t, &in.t), TK_ERR_INVALID);
    CHECK_STR(tk_last_error(), "silu_and_mul: 'input' has dtype i32, want f32, f16 or bf16");
    in.t.dtype = BF16;
    out.t.dtype = F16;
    CHECK_RC(prep2("silu_and_mul", &out.t, &in.t), TK_ERR_INVALID);
    CHECK_STR(tk_last_error(), "silu_and_mul: 'out' has dtype f16, want bf16 (the dtype of 'input')");
    in.t.dtype = (tk_dtype){TK_DL_FLOAT, 32, 2};
    CHECK_RC(prep2("silu_and_mul", &out.t, &in.t), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "'input' has an unknown dtype (code 2, 32 bits, 2 lanes)");
    in.t.dtype = F32;
    out.t.dtype = F32;

    /* binding */
    tk_arg one[1] = {{TK_ARG_TENSOR, "input", &in.t, 0, 0}};
    CHECK_RC(tk_ops__prepare(&c, "silu_and_mul", one, 1), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "silu_and_mul: missing argument 'out'");
    CHECK_CONTAINS(tk_last_error(), "HINT: the signature is silu_and_mul(out:");
    tk_arg badname[2] = {{TK_ARG_TENSOR, "output", &out.t, 0, 0}, {TK_ARG_TENSOR, "input", &in.t, 0, 0}};
    CHECK_RC(tk_ops__prepare(&c, "silu_and_mul", badname, 2), TK_ERR_INVALID);
    CHECK_STR(tk_last_error(), "silu_and_mul: no parameter named 'output' (parameters: out, input)");
    tk_arg twice[2] = {{TK_ARG_TENSOR, NULL, &out.t, 0, 0}, {TK_ARG_TENSOR, "out", &in.t, 0, 0}};
    CHECK_RC(tk_ops__prepare(&c, "silu_and_mul", twice, 2), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "argument 'out' given twice");
    tk_arg three[3] = {
        {TK_ARG_TENSOR, NULL, &out.t, 0, 0}, {TK_ARG_TENSOR, NULL, &in.t, 0, 0}, {TK_ARG_F64, NULL, NULL, 0, 1.0}};
    CHECK_RC(tk_ops__prepare(&c, "silu_and_mul", three, 3), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "silu_and_mul: takes 2 arguments, got 3");
    tk_arg scalar_for_tensor[2] = {{TK_ARG_TENSOR, NULL, &out.t, 0, 0}, {TK_ARG_F64, NULL, NULL, 0, 1.0}};
    CHECK_RC(tk_ops__prepare(&c, "silu_and_mul", scalar_for_tensor, 2), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "'input' must be a tensor, got a scalar");
    tk_arg tensor_for_scalar[3] = {{TK_ARG_TENSOR, NULL, &out.t, 0, 0},
                                   {TK_ARG_TENSOR, NULL, &in.t, 0, 0},
                                   {TK_ARG_TENSOR, "threshold", &in.t, 0, 0}};
    CHECK_RC(tk_ops__prepare(&c, "fatrelu_and_mul", tensor_for_scalar, 3), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "'threshold' must be a scalar, got a tensor");
    tk_arg nullt[2] = {{TK_ARG_TENSOR, NULL, NULL, 0, 0}, {TK_ARG_TENSOR, NULL, &in.t, 0, 0}};
    CHECK_RC(tk_ops__prepare(&c, "silu_and_mul", nullt, 2), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "'out' is a NULL tensor");
    CHECK_RC(tk_ops__prepare(&c, "silu_and_mul", NULL, 2), TK_ERR_INVALID);

    /* data and devices */
    void *saved = in.t.data;
    in.t.data = NULL;
    CHECK_RC(prep2("silu_and_mul", &out.t, &in.t), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "'input' has shape [4, 16] but a NULL data pointer");
    in.t.data = saved;
    out.t.device.device_type = TK_DEV_CUDA;
    CHECK_RC(prep2("silu_and_mul", &out.t, &in.t), TK_ERR_INVALID);
    CHECK_STR(tk_last_error(), "silu_and_mul: 'input' is on cpu but 'out' is on cuda:0");
    in.t.device.device_type = TK_DEV_CUDA;
    in.t.device.device_id = 1;
    CHECK_RC(prep2("silu_and_mul", &out.t, &in.t), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "'input' is on cuda:1 but 'out' is on cuda:0");
    in.t.device.device_id = 0;
    CHECK_RC(prep2("silu_and_mul", &out.t, &in.t), TK_OK);
    CHECK_RC(tk_ops__prepare(&c, "silu_and_mul",
                             (tk_arg[]){{TK_ARG_TENSOR, NULL, &out.t, 0, 0}, {TK_ARG_TENSOR, NULL, &in.t, 0, 0}}, 2),
             TK_OK);
    CHECK(c.device_type == TK_DEV_CUDA && c.dtype.bits == 32);
    CHECK_RC(tk_ops__run_cpu(&c), TK_ERR_UNSUPPORTED);
    CHECK_CONTAINS(tk_last_error(), "needs host tensors");
    in.t.device.device_type = 3; /* cuda host: not supported */
    out.t.device.device_type = 3;
    CHECK_RC(prep2("silu_and_mul", &out.t, &in.t), TK_ERR_UNSUPPORTED);
    CHECK_CONTAINS(tk_last_error(), "'out' is on device type 3");

    host_free(&in);
    host_free(&out);
}

/* The autotune key text (api/op.c): shapes bucketed to powers of two, integer scalars exact, float
 * scalars left out, absent optional tensors marked. */
static void test_tune_key(void)
{
    host_t in, out, w;
    int64_t s2[2] = {3, 4097}, s1[1] = {4097};
    host_new(&in, F32, 2, s2, 0);
    host_new(&out, F32, 2, s2, 0);
    host_new(&w, F32, 1, s1, 0);
    tk_arg a[] = {{TK_ARG_TENSOR, "out", &out.t, 0, 0},
                  {TK_ARG_TENSOR, "input", &in.t, 0, 0},
                  {TK_ARG_TENSOR, "weight", &w.t, 0, 0},
                  {TK_ARG_F64, "eps", NULL, 0, 1e-5}};
    tk_op_call c;
    CHECK_RC(tk_ops__prepare(&c, "rms_norm", a, 4), TK_OK);
    tk_buf b = TK_BUF_INIT;
    CHECK_RC(tk_api__tune_text(&b, "NVIDIA H100 80GB HBM3", 90, &c), TK_OK);
    CHECK_STR(b.data, "tune-1|NVIDIA H100 80GB HBM3|sm_90|rms_norm|out:f32[4,8192]|input:f32[4,8192]|weight:f32[8192]");
    tk__buf_free(&b);
    /* a shape in the same bucket gives the same text; the next bucket does not */
    tk_buf b2 = TK_BUF_INIT, b3 = TK_BUF_INIT;
    in.shape[1] = out.shape[1] = w.shape[0] = 8192;
    in.shape[0] = out.shape[0] = 4;
    CHECK_RC(tk_ops__prepare(&c, "rms_norm", a, 4), TK_OK);
    CHECK_RC(tk_api__tune_text(&b2, "NVIDIA H100 80GB HBM3", 90, &c), TK_OK);
    CHECK_STR(b2.data,
              "tune-1|NVIDIA H100 80GB HBM3|sm_90|rms_norm|out:f32[4,8192]|input:f32[4,8192]|weight:f32[8192]");
    in.shape[0] = out.shape[0] = 5;
    CHECK_RC(tk_ops__prepare(&c, "rms_norm", a, 4), TK_OK);
    CHECK_RC(tk_api__tune_text(&b3, "NVIDIA H100 80GB HBM3", 90, &c), TK_OK);
    CHECK(strstr(b3.data, "out:f32[8,8192]") != NULL);
    tk__buf_free(&b2);
    tk__buf_free(&b3);
    host_free(&in);
    host_free(&out);
    host_free(&w);
}

int main(void)
{
    op_test_seed();
    RUN(test_registry);
    RUN(test_dtype_names);
    RUN(test_f16_exhaustive);
    RUN(test_bf16_exhaustive);
    RUN(test_activations_ragged);
    RUN(test_activations_strided);
    RUN(test_activations_edges);
    RUN(test_op_cmp);
    RUN(test_fatrelu_semantics);
    RUN(test_f32_formula_order);
    RUN(test_empty);
    RUN(test_validation);
    RUN(test_tune_key);
    return th_done();
}
