/*
 * test_ops_norm.c — the norm ops (ops/norm.c): each CPU reference against an independent float64
 * computation on fresh random inputs (ragged d including 1 and non-multiples of 8, one row, strided
 * views, large and tiny magnitudes, f32/f16/bf16), and the validation messages.
 *
 * Uses only ops/ and common/. Inputs are random with a seed printed on any failure; set TK_TEST_SEED
 * to replay one.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"
#include "tensor_util.h"
#include "ops/ops.h"

/* ---- host tensors ----------------------------------------------------------------------------- */

static const tk_dtype *all_dtypes[] = {&F32, &F16, &BF16};

typedef struct {
    tk_tensor t;
    int64_t shape[8], strides[8];
    void *buf;
} host_t;

/* A tensor of `ndim` dims; with `pad` > 0 each row of the last dimension is `pad` elements longer
 * than the shape (a strided view of a bigger buffer). */
static void host_new(host_t *h, tk_dtype dt, int ndim, const int64_t *shape, int64_t pad)
{
    memset(h, 0, sizeof *h);
    int64_t rowlen = shape[ndim - 1] + pad, rows = 1;
    for (int i = 0; i < ndim; i++) {
        h->shape[i] = shape[i];
        if (i < ndim - 1)
            rows *= shape[i];
    }
    h->buf = calloc(1, (size_t)(rows * rowlen) * dt.bits / 8 + 16);
    h->t.data = h->buf;
    h->t.device.device_type = TK_DEV_CPU;
    h->t.ndim = ndim;
    h->t.dtype = dt;
    h->t.shape = h->shape;
    if (pad > 0) {
        int64_t s = 1;
        for (int i = ndim - 1; i >= 0; i--) {
            h->strides[i] = s;
            s *= i == ndim - 1 ? rowlen : shape[i];
        }
        h->t.strides = h->strides;
    }
}

static void host_free(host_t *h) { free(h->buf); }

/* Uniform values in [-scale, scale], rounded to the dtype. */
static void fill(host_t *h, double scale)
{
    for (int64_t i = 0, n = numel(&h->t); i < n; i++)
        set(&h->t, i, uniform(-scale, scale));
}

/* |got-ref| <= atol + rtol*|ref|, per dtype; atol is relative to the output's scale (see compare). */
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

/* Compares every element of got (n elements of d columns) with ref; prints the worst on failure.
 * `unit` scales atol (the output's typical magnitude). Returns 1 when all match. */
static int compare(const char *op, const char *which, const tk_tensor *got, const double *ref, double unit,
                   const char *what)
{
    double atol, rtol;
    tolerances(got->dtype, &atol, &rtol);
    atol *= unit;
    int64_t n = numel(got), d = got->shape[got->ndim - 1], bad = 0, worst = 0;
    double worst_ratio = -1, worst_got = 0;
    for (int64_t i = 0; i < n; i++) {
        double g = get(got, i), refq = quantize(ref[i], got->dtype), ratio;
        if (isinf(refq))
            ratio = g == refq ? 0 : INFINITY;
        else
            ratio = isfinite(g) ? fabs(g - ref[i]) / (atol + rtol * fabs(ref[i])) : INFINITY;
        if (ratio > 1)
            bad++;
        if (ratio > worst_ratio) {
            worst_ratio = ratio;
            worst = i;
            worst_got = g;
        }
    }
    if (bad)
        fprintf(stderr,
                "  %s %s '%s' %s %s: %lld of %lld elements off; worst [%lld] (row %lld, col %lld): got %.9g "
                "ref %.9g |diff| %.3g > %.3g (seed %llu)\n",
                op, tk_ops__dtype_str(got->dtype), which, what, tk_ops__shape_fmt(got->ndim, got->shape),
                (long long)bad, (long long)n, (long long)worst, (long long)(worst / d), (long long)(worst % d),
                worst_got, ref[worst], fabs(worst_got - ref[worst]), atol + rtol * fabs(ref[worst]),
                (unsigned long long)seed);
    return bad == 0;
}

/* ---- the float64 references (independent of ops/norm.c) -------------------------------------- */

/* ref[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w, all in double. x is n doubles. */
static void ref_rms(double *ref, const double *x, const double *w, int64_t n, int64_t d, double eps)
{
    for (int64_t r = 0; r < n / d; r++) {
        const double *xr = x + r * d;
        double ss = 0;
        for (int64_t c = 0; c < d; c++)
            ss += xr[c] * xr[c];
        double inv = 1.0 / sqrt(ss / (double)d + eps);
        for (int64_t c = 0; c < d; c++)
            ref[r * d + c] = xr[c] * inv * w[c];
    }
}

/* One case: rows x d (as ndim dims), one dtype, values of magnitude `scale`, the weights of
 * magnitude 1. With `fused` runs fused_add_rms_norm, else rms_norm (in place when `inplace`). */
static int check_case(int fused, tk_dtype dt, int ndim, const int64_t *shape, int64_t pad, double scale,
                      double eps, int inplace)
{
    const char *op = fused ? "fused_add_rms_norm" : "rms_norm";
    int64_t d = shape[ndim - 1];
    host_t a, b, w;
    host_new(&a, dt, ndim, shape, pad);       /* rms_norm: input; fused: input */
    host_new(&b, dt, ndim, shape, pad ? 0 : 1); /* rms_norm: out; fused: residual */
    host_new(&w, dt, 1, &d, 0);
    fill(&a, scale);
    fill(&b, scale);
    for (int64_t c = 0; c < d; c++)
        set(&w.t, c, uniform(0.25, 2.0) * (next_u64() & 1 ? 1 : -1));
    int64_t n = numel(&a.t);
    double *x = malloc(sizeof(double) * (size_t)n), *ref = malloc(sizeof(double) * (size_t)n);
    double *sum = malloc(sizeof(double) * (size_t)n), *wd = malloc(sizeof(double) * (size_t)d);
    for (int64_t c = 0; c < d; c++)
        wd[c] = get(&w.t, c);
    for (int64_t i = 0; i < n; i++) {
        x[i] = get(&a.t, i);
        sum[i] = quantize(x[i] + get(&b.t, i), dt); /* fused: the residual it must write, in T */
    }
    ref_rms(ref, fused ? sum : x, wd, n, d, (double)(float)eps);

    const tk_tensor *out = fused ? &a.t : inplace ? &a.t : &b.t;
    tk_arg args[4] = {{TK_ARG_TENSOR, fused ? "input" : "out", fused ? &a.t : out, 0, 0},
                      {TK_ARG_TENSOR, fused ? "residual" : "input", fused ? &b.t : &a.t, 0, 0},
                      {TK_ARG_TENSOR, "weight", &w.t, 0, 0},
                      {TK_ARG_F64, "eps", NULL, 0, eps}};
    tk_op_call call;
    int rc = tk_ops__prepare(&call, op, args, 4);
    if (rc == TK_OK)
        rc = tk_ops__run_cpu(&call);
    char what[96];
    snprintf(what, sizeof what, "%s%sscale %g eps %g", pad ? "strided " : "", inplace ? "in-place " : "", scale,
             eps);
    int ok = 1;
    if (rc != TK_OK) {
        fprintf(stderr, "  %s %s %s: rc %d: %s (seed %llu)\n", op, tk_ops__dtype_str(dt), what, rc, tk_last_error(),
                (unsigned long long)seed);
        ok = 0;
    } else {
        /* The output's scale: x / rms(x) is O(1) unless eps dominates mean(x^2). */
        double ms = scale * scale / 3.0, unit = sqrt(ms / (ms + eps));
        ok &= compare(op, fused ? "input" : "out", out, ref, unit, what);
        if (fused)
            ok &= compare(op, "residual", &b.t, sum, scale, what);
    }
    free(x);
    free(ref);
    free(sum);
    free(wd);
    host_free(&a);
    host_free(&b);
    host_free(&w);
    return ok;
}

/* Ragged shapes: d of 1 and non-multiples of 8, one row, several leading dims, a row longer than the
 * reference's 1024-column block. */
static const int64_t shapes[][3] = {
    {1, 1, 1}, {1, 1, 7}, {1, 3, 1}, {1, 5, 8}, {2, 3, 13}, {1, 4, 100}, {1, 1, 1000}, {1, 2, 2049}, {3, 7, 33},
};

static int check_op(int fused)
{
    int ok = 1;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t k = 0; k < 3; k++) {
            const int64_t *sh = shapes[s][0] == 1 ? shapes[s] + 1 : shapes[s];
            int nd = shapes[s][0] == 1 ? 2 : 3;
            tk_dtype dt = *all_dtypes[k];
            double eps = uniform(1e-6, 1e-5);
            ok &= check_case(fused, dt, nd, sh, 0, uniform(0.5, 4.0), eps, 0);
            ok &= check_case(fused, dt, nd, sh, 3, uniform(0.5, 4.0), eps, 0);
            if (!fused)
                ok &= check_case(fused, dt, nd, sh, 0, uniform(0.5, 4.0), eps, 1);
        }
    return ok;
}

/* ---- tests ------------------------------------------------------------------------------------ */

static void test_registry(void)
{
    const char *names[] = {"rms_norm", "fused_add_rms_norm"};
    for (size_t i = 0; i < 2; i++) {
        const tk_op_desc *op = tk_ops__find(names[i]);
        CHECK(op != NULL);
        if (!op)
            continue;
        CHECK_STR(op->family, "norm");
        CHECK_STR(op->package, "kernels-community/rmsnorm");
        CHECK(op->cpu != NULL && op->check != NULL);
    }
    tk_buf b = TK_BUF_INIT;
    CHECK_RC(tk_ops__signature(&b, tk_ops__find("rms_norm")), TK_OK);
    CHECK_STR(b.data, "rms_norm(out: T[..., d], input: T[..., d], weight: T[d], eps: f64 = 1e-06) -> out; "
                      "T in {f32, f16, bf16}");
    tk__buf_free(&b);
    CHECK_RC(tk_ops__signature(&b, tk_ops__find("fused_add_rms_norm")), TK_OK);
    CHECK_CONTAINS(b.data, ") -> input, residual; T in {f32, f16, bf16}");
    tk__buf_free(&b);
}

static void test_rms_norm(void) { CHECK(check_op(0)); }
static void test_fused_add_rms_norm(void) { CHECK(check_op(1)); }

/* Magnitudes near each dtype's ends: the sum of squares must not overflow or underflow on the way. */
static void test_magnitudes(void)
{
    const int64_t sh[2] = {3, 37};
    for (int fused = 0; fused < 2; fused++) {
        CHECK(check_case(fused, F32, 2, sh, 0, 1e30, 1e-6, 0));  /* x^2 overflows f32 */
        CHECK(check_case(fused, F32, 2, sh, 0, 1e-20, 1e-6, 0)); /* eps dominates */
        CHECK(check_case(fused, F32, 2, sh, 0, 1e-20, 0.0, 0));  /* x^2 underflows f32 without eps */
        CHECK(check_case(fused, F16, 2, sh, 0, 2e4, 1e-6, 0));   /* x^2 overflows f16 */
        CHECK(check_case(fused, F16, 2, sh, 0, 1e-3, 1e-6, 0));
        CHECK(check_case(fused, BF16, 2, sh, 0, 1e30, 1e-6, 0));
        CHECK(check_case(fused, BF16, 2, sh, 0, 1e-20, 1e-6, 0));
    }
}

/* An all-zero row with eps > 0 gives zeros; eps left out takes the default 1e-6. */
static void test_zero_row(void)
{
    int64_t sh[2] = {2, 5}, d = 5;
    host_t x, y, w;
    host_new(&x, F32, 2, sh, 0);
    host_new(&y, F32, 2, sh, 0);
    host_new(&w, F32, 1, &d, 0);
    for (int64_t c = 0; c < d; c++)
        set(&w.t, c, 1.0);
    tk_arg args[4] = {{TK_ARG_TENSOR, "out", &y.t, 0, 0}, {TK_ARG_TENSOR, "input", &x.t, 0, 0},
                      {TK_ARG_TENSOR, "weight", &w.t, 0, 0}, {TK_ARG_F64, "eps", NULL, 0, 1e-5}};
    tk_op_call c;
    CHECK_RC(tk_ops__prepare(&c, "rms_norm", args, 4), TK_OK);
    CHECK_RC(tk_ops__run_cpu(&c), TK_OK);
    for (int64_t i = 0; i < 10; i++)
        CHECK(get(&y.t, i) == 0.0);
    /* eps left out takes the default */
    CHECK_RC(tk_ops__prepare(&c, "rms_norm", args, 3), TK_OK);
    CHECK(c.f[3] == 1e-6);
    host_free(&x);
    host_free(&y);
    host_free(&w);
}

/* Empty tensors are accepted and touch nothing. */
static void test_empty(void)
{
    int64_t sh[2] = {0, 16}, d = 16;
    host_t x, y, w;
    host_new(&x, BF16, 2, sh, 0);
    host_new(&y, BF16, 2, sh, 0);
    host_new(&w, BF16, 1, &d, 0);
    tk_arg args[3] = {{TK_ARG_TENSOR, "input", &x.t, 0, 0}, {TK_ARG_TENSOR, "residual", &y.t, 0, 0},
                      {TK_ARG_TENSOR, "weight", &w.t, 0, 0}};
    tk_op_call c;
    CHECK_RC(tk_ops__prepare(&c, "fused_add_rms_norm", args, 3), TK_OK);
    CHECK_RC(tk_ops__run_cpu(&c), TK_OK);
    host_free(&x);
    host_free(&y);
    host_free(&w);
}

static void test_validation(void)
{
    int64_t s48[2] = {4, 8}, s47[2] = {4, 7}, s8 = 8, s7 = 7, s18[2] = {1, 8};
    host_t x, y, y2, w, w7, w2, xf16;
    host_new(&x, F32, 2, s48, 0);
    host_new(&y, F32, 2, s48, 0);
    host_new(&y2, F32, 2, s47, 0);
    host_new(&w, F32, 1, &s8, 0);
    host_new(&w7, F32, 1, &s7, 0);
    host_new(&w2, F32, 2, s18, 0);
    host_new(&xf16, F16, 2, s48, 0);
    tk_op_call c;

    tk_arg a1[4] = {{TK_ARG_TENSOR, "out", &y2.t, 0, 0}, {TK_ARG_TENSOR, "input", &x.t, 0, 0},
                    {TK_ARG_TENSOR, "weight", &w.t, 0, 0}, {TK_ARG_F64, "eps", NULL, 0, 1e-6}};
    CHECK_RC(tk_ops__prepare(&c, "rms_norm", a1, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "rms_norm: 'out' has shape [4, 7], want [4, 8] (the shape of 'input')");

    a1[0].t = &y.t;
    a1[2].t = &w7.t;
    CHECK_RC(tk_ops__prepare(&c, "rms_norm", a1, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(),
                   "rms_norm: 'weight' has shape [7], want [8] (the last dimension of 'input' [4, 8])");

    a1[2].t = &w2.t;
    CHECK_RC(tk_ops__prepare(&c, "rms_norm", a1, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "rms_norm: 'weight' has rank 2 (shape [1, 8]), want 1");

    a1[2].t = &w.t;
    a1[1].t = &xf16.t;
    CHECK_RC(tk_ops__prepare(&c, "rms_norm", a1, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "rms_norm: 'out' has dtype f32, want f16 (the dtype of 'input')");

    a1[1].t = &x.t;
    a1[3].f = -1.0;
    CHECK_RC(tk_ops__prepare(&c, "rms_norm", a1, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "rms_norm: 'eps' is -1, want a finite value >= 0");
    a1[3].f = NAN;
    CHECK_RC(tk_ops__prepare(&c, "rms_norm", a1, 4), TK_ERR_INVALID);
    a1[3].f = 1e300; /* inf as f32 */
    CHECK_RC(tk_ops__prepare(&c, "rms_norm", a1, 4), TK_ERR_INVALID);
    a1[3].f = 1e-6;
    CHECK_RC(tk_ops__prepare(&c, "rms_norm", a1, 4), TK_OK);

    tk_arg a2[4] = {{TK_ARG_TENSOR, "input", &x.t, 0, 0}, {TK_ARG_TENSOR, "residual", &y2.t, 0, 0},
                    {TK_ARG_TENSOR, "weight", &w.t, 0, 0}, {TK_ARG_F64, "eps", NULL, 0, 1e-6}};
    CHECK_RC(tk_ops__prepare(&c, "fused_add_rms_norm", a2, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(),
                   "fused_add_rms_norm: 'residual' has shape [4, 7], want [4, 8] (the shape of 'input')");
    a2[1].t = &x.t;
    CHECK_RC(tk_ops__prepare(&c, "fused_add_rms_norm", a2, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "fused_add_rms_norm: 'input' and 'residual' are the same tensor");
    a2[1].t = &y.t;
    a2[2].t = &w7.t;
    CHECK_RC(tk_ops__prepare(&c, "fused_add_rms_norm", a2, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "fused_add_rms_norm: 'weight' has shape [7], want [8] (the last dimension "
                                    "of 'input' [4, 8])");
    a2[2].t = &w.t;
    a2[1].t = &xf16.t;
    CHECK_RC(tk_ops__prepare(&c, "fused_add_rms_norm", a2, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "'residual' has dtype f16, want f32 (the dtype of 'input')");
    a2[1].t = &y.t;
    CHECK_RC(tk_ops__prepare(&c, "fused_add_rms_norm", a2, 2), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "fused_add_rms_norm: missing argument 'weight'");

    /* rank 0 input: there is no last dimension to normalise */
    host_t s;
    host_new(&s, F32, 1, &s8, 0);
    s.t.ndim = 0;
    a1[0].t = &s.t;
    a1[1].t = &s.t;
    CHECK_RC(tk_ops__prepare(&c, "rms_norm", a1, 4), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "rms_norm: 'out' has rank 0 (shape []), want at least 1");
    host_free(&s);

    host_free(&x);
    host_free(&y);
    host_free(&y2);
    host_free(&w);
    host_free(&w7);
    host_free(&w2);
    host_free(&xf16);
}

int main(void)
{
    const char *env = getenv("TK_TEST_SEED");
    seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
    rng = seed;
    printf("seed %llu\n", (unsigned long long)seed);
    RUN(test_registry);
    RUN(test_rms_norm);
    RUN(test_fused_add_rms_norm);
    RUN(test_magnitudes);
    RUN(test_zero_row);
    RUN(test_empty);
    RUN(test_validation);
    return th_done();
}
