/*
 * test_ops_softmax.c — the softmax ops (ops/softmax.c): the CPU references against an independent
 * float64 computation on fresh random inputs (row lengths 1, 7, 1000 and 300000, several leading
 * dims, strided views, in place, huge and tiny magnitudes, f32/f16/bf16), the special values (-inf
 * entries, all -inf rows, +inf, NaN: PyTorch's results), and the validation messages.
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

/* ---- the float64 reference (independent of ops/softmax.c) ------------------------------------- */

/* The plain formula in double with IEEE special values: max propagates NaN, so NaN rows are NaN;
 * +inf gives inf - inf = NaN in the sum; an all -inf row gives -inf - -inf = NaN. */
static void ref_softmax(double *ref, const double *x, int64_t n, int64_t d, int is_log)
{
    for (int64_t r = 0; r < n / d; r++) {
        const double *xr = x + r * d;
        double m = -INFINITY, s = 0;
        for (int64_t c = 0; c < d; c++)
            m = (isnan(xr[c]) || xr[c] > m) ? xr[c] : m;
        if (isnan(m))
            m = NAN;
        for (int64_t c = 0; c < d; c++)
            s += exp(xr[c] - m);
        for (int64_t c = 0; c < d; c++)
            ref[r * d + c] = is_log ? (xr[c] - m) - log(s) : exp(xr[c] - m) / s;
    }
}

/* ---- comparison ------------------------------------------------------------------------------- */

/* The CPU reference computes in double and rounds once: within an ulp of the dtype (relative), with
 * the dtype's subnormal spacing as the absolute floor. */
static void tolerances(tk_dtype dt, double *atol, double *rtol)
{
    if (dt.bits == 32) {
        *atol = 1.5e-45;
        *rtol = 0x1p-23;
    } else if (dt.code == TK_DL_BFLOAT) {
        *atol = 1e-40;
        *rtol = 0x1p-8;
    } else {
        *atol = 0x1p-24;
        *rtol = 0x1p-10;
    }
}

/* NaN must be NaN, an inf the same inf (a reference beyond the dtype's range rounds to inf); else
 * |got - ref| <= atol + rtol * |ref| (op_test.h). */
static int compare(const char *op, const tk_tensor *got, const double *ref, const char *what)
{
    double atol, rtol;
    tolerances(got->dtype, &atol, &rtol);
    op_cmp c = op_cmp_begin(atol, rtol, "%s %s %s %s", op, tk_ops__dtype_str(got->dtype), what,
                            tk_ops__shape_fmt(got->ndim, got->shape));
    c.cols = got->shape[got->ndim - 1];
    for (int64_t i = 0, n = numel(got); i < n; i++)
        op_cmp_at(&c, i, get(got, i), op_stored_inf(ref[i], got->dtype));
    return op_cmp_end(&c);
}

/* Runs op on input x (already filled) into out (or in place) and compares with the reference. */
static int run_and_compare(const char *op, host_t *x, host_t *out, const char *what)
{
    int is_log = strcmp(op, "log_softmax") == 0;
    int64_t n = numel(&x->t), d = x->t.shape[x->t.ndim - 1];
    double *xd = malloc(sizeof(double) * (size_t)(n ? n : 1)), *ref = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++)
        xd[i] = get(&x->t, i);
    if (n)
        ref_softmax(ref, xd, n, d, is_log);
    const tk_tensor *o = out ? &out->t : &x->t;
    tk_arg args[2] = {{TK_ARG_TENSOR, "out", o, 0, 0}, {TK_ARG_TENSOR, "input", &x->t, 0, 0}};
    int rc = op_run_cpu(op, args, 2);
    int ok = rc == TK_OK;
    if (!ok)
        fprintf(stderr, "  %s %s: rc %d: %s (seed %llu)\n", op, what, rc, tk_last_error(), (unsigned long long)seed);
    else
        ok = compare(op, o, ref, what);
    free(xd);
    free(ref);
    return ok;
}

/* One random case: values uniform in [-scale, scale] (+ shift), strided by pad, in place or not. */
static int check_case(const char *op, tk_dtype dt, int ndim, const int64_t *shape, int64_t pad, double scale,
                      double shift, int inplace)
{
    host_t x, y;
    host_new(&x, dt, ndim, shape, pad);
    host_new(&y, dt, ndim, shape, pad ? 0 : 2);
    for (int64_t i = 0, n = numel(&x.t); i < n; i++)
        set(&x.t, i, shift + uniform(-scale, scale));
    char what[96];
    snprintf(what, sizeof what, "%s%sscale %g shift %g", pad ? "strided " : "", inplace ? "in-place " : "", scale,
             shift);
    int ok = run_and_compare(op, &x, inplace ? NULL : &y, what);
    host_free(&x);
    host_free(&y);
    return ok;
}

static const char *const ops[] = {"softmax", "log_softmax"};

/* ---- tests ------------------------------------------------------------------------------------ */

static void test_registry(void)
{
    for (size_t i = 0; i < 2; i++) {
        const tk_op_desc *op = tk_ops__find(ops[i]);
        CHECK(op != NULL);
        if (!op)
            continue;
        CHECK_STR(op->family, "softmax");
        CHECK_STR(op->package, "kernels-community/softmax");
        CHECK(op->cpu != NULL && op->check != NULL);
        tk_buf b = TK_BUF_INIT;
        CHECK_RC(tk_ops__signature(&b, op), TK_OK);
        char want[128];
        snprintf(want, sizeof want, "%s(out: T[..., d], input: T[..., d]) -> out; T in {f32, f16, bf16}", ops[i]);
        CHECK_STR(b.data, want);
        tk__buf_free(&b);
    }
}

/* Row lengths 1, 7, 1000 and 300000 (one row), ragged leading dims, strided and in place. */
static void test_random(void)
{
    static const int64_t shapes[][4] = {{2, 1, 1},    {2, 5, 1},     {2, 1, 7},      {3, 2, 3, 7},
                                        {2, 4, 1000}, {3, 2, 3, 33}, {2, 1, 300000}, {2, 3, 1025}};
    for (size_t o = 0; o < 2; o++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (size_t k = 0; k < 3; k++) {
                int nd = (int)shapes[s][0];
                const int64_t *sh = shapes[s] + 1;
                tk_dtype dt = *all_dtypes[k];
                CHECK(check_case(ops[o], dt, nd, sh, 0, uniform(1, 8), uniform(-3, 3), 0));
                CHECK(check_case(ops[o], dt, nd, sh, 0, uniform(1, 8), 0, 1));
                if (sh[nd - 1] < 100000)
                    CHECK(check_case(ops[o], dt, nd, sh, 5, uniform(1, 8), 0, 0));
            }
}

/* Magnitudes near each dtype's ends: exp(x - m) must not overflow, and a huge shared shift must not
 * matter (softmax is shift-invariant). */
static void test_magnitudes(void)
{
    const int64_t sh[2] = {3, 37};
    for (size_t o = 0; o < 2; o++) {
        CHECK(check_case(ops[o], F32, 2, sh, 0, 1e30, 0, 0));     /* one-hot rows; log: -1e30s */
        CHECK(check_case(ops[o], F32, 2, sh, 0, 3e38, 0, 0));     /* x - m overflows f32: -inf */
        CHECK(check_case(ops[o], F32, 2, sh, 0, 1e-30, 0, 0));    /* uniform rows */
        CHECK(check_case(ops[o], F32, 2, sh, 0, 10, 1e6, 0));     /* a shift of 1e6 */
        CHECK(check_case(ops[o], F32, 2, sh, 0, 50, 0, 0));       /* exp(x - m) down to 1e-44 */
        CHECK(check_case(ops[o], F16, 2, sh, 0, 6e4, 0, 0));
        CHECK(check_case(ops[o], F16, 2, sh, 0, 1e-4, 0, 0));
        CHECK(check_case(ops[o], F16, 2, sh, 0, 8, 3e4, 0));
        CHECK(check_case(ops[o], BF16, 2, sh, 0, 1e30, 0, 0));
        CHECK(check_case(ops[o], BF16, 2, sh, 0, 1e-30, 0, 0));
        CHECK(check_case(ops[o], BF16, 2, sh, 0, 20, 0, 0));
    }
}

/* PyTorch's special values: -inf entries give 0 / -inf; a row of only -inf, or with a +inf or a
 * NaN, is NaN everywhere; the other rows are untouched by them. */
static void test_special_values(void)
{
    const int64_t sh[2] = {7, 9};
    for (size_t o = 0; o < 2; o++)
        for (size_t k = 0; k < 3; k++) {
            host_t x, y;
            host_new(&x, *all_dtypes[k], 2, sh, 0);
            host_new(&y, *all_dtypes[k], 2, sh, 0);
            for (int64_t i = 0; i < 63; i++)
                set(&x.t, i, uniform(-4, 4));
            set(&x.t, 0 * 9 + 3, -INFINITY); /* row 0: some -inf */
            set(&x.t, 0 * 9 + 8, -INFINITY);
            for (int64_t c = 0; c < 9; c++)   /* row 1: all -inf */
                set(&x.t, 1 * 9 + c, -INFINITY);
            set(&x.t, 2 * 9 + 4, INFINITY);  /* row 2: a +inf */
            set(&x.t, 3 * 9 + 0, NAN);       /* row 3: a NaN */
            set(&x.t, 4 * 9 + 1, INFINITY);  /* row 4: +inf and -inf */
            set(&x.t, 4 * 9 + 2, -INFINITY);
            for (int64_t c = 0; c < 8; c++)   /* row 5: all -inf but one */
                set(&x.t, 5 * 9 + c, -INFINITY);
            set(&x.t, 6 * 9 + 0, NAN);       /* row 6: NaN and -inf only */
            for (int64_t c = 1; c < 9; c++)
                set(&x.t, 6 * 9 + c, -INFINITY);
            CHECK(run_and_compare(ops[o], &x, &y, "special values"));
            /* spot checks of the semantics themselves */
            int is_log = o == 1;
            CHECK(is_log ? get(&y.t, 3) == -INFINITY : get(&y.t, 3) == 0.0);
            CHECK(isnan(get(&y.t, 9)) && isnan(get(&y.t, 2 * 9)) && isnan(get(&y.t, 3 * 9 + 5)) &&
                  isnan(get(&y.t, 4 * 9)) && isnan(get(&y.t, 6 * 9 + 3)));
            CHECK(is_log ? get(&y.t, 5 * 9 + 8) == 0.0 : get(&y.t, 5 * 9 + 8) == 1.0);
            CHECK(run_and_compare(ops[o], &x, NULL, "special values in place"));
            host_free(&x);
            host_free(&y);
        }
}

/* A softmax row sums to 1 and log_softmax's exp sums to 1 (a property, on top of the reference). */
static void test_sums_to_one(void)
{
    const int64_t sh[2] = {4, 5000};
    host_t x, y;
    host_new(&x, F32, 2, sh, 0);
    host_new(&y, F32, 2, sh, 0);
    fill_range(&x, -20, 20);
    for (size_t o = 0; o < 2; o++) {
        tk_arg args[2] = {{TK_ARG_TENSOR, "out", &y.t, 0, 0}, {TK_ARG_TENSOR, "input", &x.t, 0, 0}};
        tk_op_call c;
        CHECK_RC(tk_ops__prepare(&c, ops[o], args, 2), TK_OK);
        CHECK_RC(tk_ops__run_cpu(&c), TK_OK);
        for (int64_t r = 0; r < 4; r++) {
            double s = 0;
            for (int64_t i = 0; i < 5000; i++)
                s += o ? exp(get(&y.t, r * 5000 + i)) : get(&y.t, r * 5000 + i);
            CHECK(fabs(s - 1) < 1e-5);
        }
    }
    host_free(&x);
    host_free(&y);
}

static void test_empty(void)
{
    const int64_t sh[2] = {0, 16}, sh2[2] = {4, 0};
    for (int k = 0; k < 2; k++) {
        host_t x, y;
        host_new(&x, BF16, 2, k ? sh2 : sh, 0);
        host_new(&y, BF16, 2, k ? sh2 : sh, 0);
        tk_arg args[2] = {{TK_ARG_TENSOR, "out", &y.t, 0, 0}, {TK_ARG_TENSOR, "input", &x.t, 0, 0}};
        tk_op_call c;
        CHECK_RC(tk_ops__prepare(&c, "log_softmax", args, 2), TK_OK);
        CHECK_RC(tk_ops__run_cpu(&c), TK_OK);
        host_free(&x);
        host_free(&y);
    }
}

static void test_validation(void)
{
    int64_t s48[2] = {4, 8}, s47[2] = {4, 7}, s348[3] = {1, 4, 8};
    host_t x, y7, y3, yh, s;
    host_new(&x, F32, 2, s48, 0);
    host_new(&y7, F32, 2, s47, 0);
    host_new(&y3, F32, 3, s348, 0);
    host_new(&yh, F16, 2, s48, 0);
    host_new(&s, F32, 1, s48, 0);
    s.t.ndim = 0;
    tk_op_call c;
    tk_arg a[2] = {{TK_ARG_TENSOR, "out", &y7.t, 0, 0}, {TK_ARG_TENSOR, "input", &x.t, 0, 0}};
    CHECK_RC(tk_ops__prepare(&c, "softmax", a, 2), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "softmax: 'out' has shape [4, 7], want [4, 8] (the shape of 'input')");
    a[0].t = &y3.t;
    CHECK_RC(tk_ops__prepare(&c, "log_softmax", a, 2), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "log_softmax: 'out' has shape [1, 4, 8], want [4, 8] (the shape of 'input')");
    a[0].t = &yh.t;
    CHECK_RC(tk_ops__prepare(&c, "softmax", a, 2), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "softmax: 'out' has dtype f16, want f32 (the dtype of 'input')");
    a[0].t = &s.t;
    a[1].t = &s.t;
    CHECK_RC(tk_ops__prepare(&c, "softmax", a, 2), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "softmax: 'out' has rank 0 (shape []), want at least 1");
    CHECK_RC(tk_ops__prepare(&c, "softmax", a, 1), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "softmax: missing argument 'input'");
    CHECK_RC(tk_ops__prepare(&c, "softmx", a, 2), TK_ERR_NOT_FOUND);
    CHECK_CONTAINS(tk_last_error(), "did you mean 'softmax'?");
    a[0].t = &x.t;
    a[1].t = &x.t;
    CHECK_RC(tk_ops__prepare(&c, "softmax", a, 2), TK_OK); /* in place */
    host_free(&x);
    host_free(&y7);
    host_free(&y3);
    host_free(&yh);
    host_free(&s);
}

int main(void)
{
    op_test_seed();
    RUN(test_registry);
    RUN(test_random);
    RUN(test_magnitudes);
    RUN(test_special_values);
    RUN(test_sums_to_one);
    RUN(test_empty);
    RUN(test_validation);
    return th_done();
}
