/*
 * op_test.h — the scaffolding every op test shares (tests/test_ops*.c on the CPU references,
 * tests/test_gpu_*.c on the kernels): the seed, random and integer host tensors, one CPU run of an
 * op, and the element-by-element comparison of a result with a float64 reference. Header-only,
 * static; builds on tensor_util.h (host_t, get/set, uniform).
 *
 *     int main(void) { op_test_seed(); RUN(test_x); return th_done(); }      TK_TEST_SEED=N replays
 *
 *     double *xv = op_rand(&x, -2, 2);                    random x (rounded to its dtype), its values
 *     CHECK_RC(op_run_cpu("rms_norm", args, 4), TK_OK);   prepare + the CPU reference
 *
 *     op_cmp c = op_cmp_begin(atol, rtol, "rms_norm %s %s out", dtype, shape);
 *     c.cols = d;                                         optional: report the worst as [row, col]
 *     for (i = 0; i < n; i++)
 *         op_cmp_at(&c, i, got_i, ref_i);                 |got - ref| <= atol + rtol*|ref|
 *         (or op_cmp_tol(&c, i, got_i, ref_i, tol_i)      a tolerance of the test's own formula,
 *          or op_cmp_exact(&c, i, got_i, ref_i))          or equal, the sign of a zero included)
 *     ok &= op_cmp_end(&c);                               prints the worst element when any is off
 *
 *     ok &= op_close_tensor("softmax out", &out.t, ref, atol, rtol);     the loop above in one call
 *
 *     cmp_t r = compare_tensors(&got.t, &ref.t);          the GPU tests: relative L2 norm of the
 *     CHECK(cmp_ok(&r, tol_rel(dt), worst_tol));          difference and the worst element, a kernel
 *                                                         against the CPU reference (cmp_print)
 *
 * What passes, element by element:
 *     ref NaN      got NaN (c.nan_fails = 1: nothing passes, NaN is never a right answer)
 *     ref +-inf    got the same inf (c.inf_fails = 1: nothing passes)
 *     otherwise    |got - ref| <= tol, tol = atol + rtol*|ref| or the caller's; a NaN or inf got fails
 * A reference that is finite but overflows the output dtype is only an inf where the test says so:
 * op_cmp_at(&c, i, got, op_stored_inf(ref, dt)).
 *
 * A failure prints one line, e.g.
 *     rms_norm bf16 'out' [5, 8]: 35 of 40 elements off; worst [37] (row 4, col 5): got -2.375 want
 *     -2.36862607, |diff| 0.00637 > tol 0.000337 (atol 0.0001 + rtol 0.0001*|want|), rel err 0.00269
 *     (seed 7; TK_TEST_SEED=7 replays it)
 * where the worst element is the one with the largest |got - want| / tol (a failing one before any
 * that passes). After op_cmp_end, c.worst is its index for a test that prints more about it.
 */
#ifndef TK_TEST_OP_TEST_H
#define TK_TEST_OP_TEST_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "ops/ops.h"
#include "ops/selftest.h"
#include "tensor_util.h"
#include "tk.h"

/* ---- the seed ---------------------------------------------------------------------------------- */

/* Seeds the test's random stream (tensor_util.h's seed and rng) from TK_TEST_SEED, else the clock,
 * and prints it first, so any failure can be replayed. */
static inline void op_test_seed(void)
{
    const char *env = getenv("TK_TEST_SEED");
    seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
    rng = seed;
    printf("seed %llu (TK_TEST_SEED=%llu replays it)\n", (unsigned long long)seed, (unsigned long long)seed);
}

/* ---- host tensors ---------------------------------------------------------------------------- */

/* The elements of t as doubles (what an op reads), in a malloc'd array of numel + 1; free it. */
static inline double *op_values(const tk_tensor *t)
{
    int64_t n = numel(t);
    double *v = malloc(sizeof(double) * (size_t)(n + 1));
    for (int64_t i = 0; v && i < n; i++)
        v[i] = get(t, i);
    return v;
}

/* Uniform values in [lo, hi] rounded to the tensor's dtype (one draw per element, in order). */
static inline void fill_range(host_t *h, double lo, double hi)
{
    for (int64_t i = 0, n = numel(&h->t); i < n; i++)
        set(&h->t, i, uniform(lo, hi));
}

/* fill_range, returning the stored values as op_values does. */
static inline double *op_rand(host_t *h, double lo, double hi)
{
    fill_range(h, lo, hi);
    return op_values(&h->t);
}

/* Every element v. */
static inline void fill_const(host_t *h, double v)
{
    for (int64_t i = 0, n = numel(&h->t); i < n; i++)
        set(&h->t, i, v);
}

/* ---- integer tensors ------------------------------------------------------------------------- */

/* Element i of an i32 or i64 host tensor (ids, positions), honouring strides. */
static inline int64_t id_get(const host_t *h, int64_t i)
{
    int64_t o = elem_off(&h->t, i);
    return h->t.dtype.bits == 64 ? ((const int64_t *)h->buf)[o] : ((const int32_t *)h->buf)[o];
}

static inline void id_set(host_t *h, int64_t i, int64_t v)
{
    int64_t o = elem_off(&h->t, i);
    if (h->t.dtype.bits == 64)
        ((int64_t *)h->buf)[o] = v;
    else
        ((int32_t *)h->buf)[o] = (int32_t)v;
}

/* ---- running an op's CPU reference ------------------------------------------------------------- */

/* Validates the call (tk_ops__prepare) and runs the op's CPU reference; the status of the first that
 * fails. Prints nothing: validation tests expect the failures. */
static inline int op_run_cpu(const char *op, const tk_arg *args, size_t n)
{
    tk_op_call c;
    int rc = tk_ops__prepare(&c, op, args, n);
    return rc == TK_OK ? tk_ops__run_cpu(&c) : rc;
}

/* ---- comparing with a reference ---------------------------------------------------------------- */

enum { OP_CMP_ATOL_RTOL, OP_CMP_OWN_TOL, OP_CMP_EXACT }; /* how the worst element was judged */

typedef struct {
    char what[192];   /* names the comparison in the failure line: op, dtype, shape, output */
    double atol, rtol; /* op_cmp_at's tolerance */
    int64_t cols;     /* > 0: the worst element is also shown as [row, col] of rows of cols */
    int nan_fails;    /* 1: a NaN reference fails whatever got is */
    int inf_fails;    /* 1: so does an infinite one (the tests whose references are finite by construction) */
    int64_t n, bad;   /* elements compared, and those off */
    int64_t worst;    /* the worst element's index (-1 before the first) */
    int worst_ok, worst_kind;
    double worst_ratio, worst_got, worst_ref, worst_tol;
} op_cmp;

__attribute__((format(printf, 3, 4))) static inline op_cmp op_cmp_begin(double atol, double rtol, const char *fmt, ...)
{
    op_cmp c;
    memset(&c, 0, sizeof c);
    c.atol = atol;
    c.rtol = rtol;
    c.worst = -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c.what, sizeof c.what, fmt, ap);
    va_end(ap);
    return c;
}

/* Counts element i and keeps it when it is the worst so far: a failing element before a passing
 * one, then the largest |got - ref| / tol. */
static inline void op_cmp__keep(op_cmp *c, int64_t i, int ok, double ratio, double got, double ref, double tol,
                                int kind)
{
    c->n++;
    c->bad += !ok;
    if (c->worst < 0 || (!ok && c->worst_ok) || (ok == c->worst_ok && ratio > c->worst_ratio)) {
        c->worst = i;
        c->worst_ok = ok;
        c->worst_kind = kind;
        c->worst_ratio = ratio;
        c->worst_got = got;
        c->worst_ref = ref;
        c->worst_tol = tol;
    }
}

static inline void op_cmp__elem(op_cmp *c, int64_t i, double got, double ref, double tol, int kind)
{
    int ok;
    double ratio;
    if (isnan(ref)) {
        ok = !c->nan_fails && isnan(got);
        ratio = ok ? 0 : INFINITY;
    } else if (isinf(ref)) {
        ok = !c->inf_fails && got == ref;
        ratio = ok ? 0 : INFINITY;
    } else {
        double d = fabs(got - ref); /* NaN when got is NaN: fails */
        ok = d <= tol;
        ratio = !isfinite(d) ? INFINITY : tol > 0 ? d / tol : d > 0 ? INFINITY : 0;
    }
    op_cmp__keep(c, i, ok, ratio, got, ref, tol, kind);
}

/* Element i: |got - ref| <= c->atol + c->rtol*|ref| (NaN and inf as at the top). */
static inline void op_cmp_at(op_cmp *c, int64_t i, double got, double ref)
{
    op_cmp__elem(c, i, got, ref, c->atol + c->rtol * fabs(ref), OP_CMP_ATOL_RTOL);
}

/* Element i against the caller's tolerance: |got - ref| <= tol (NaN and inf as at the top). */
static inline void op_cmp_tol(op_cmp *c, int64_t i, double got, double ref, double tol)
{
    op_cmp__elem(c, i, got, ref, tol, OP_CMP_OWN_TOL);
}

/* Element i exactly: the same value with the same sign of zero, or both NaN (c->nan_fails and
 * c->inf_fails as at the top). */
static inline void op_cmp_exact(op_cmp *c, int64_t i, double got, double ref)
{
    int ok = isnan(got) || isnan(ref) ? !c->nan_fails && isnan(got) && isnan(ref)
                                      : got == ref && !signbit(got) == !signbit(ref) && !(c->inf_fails && isinf(ref));
    double d = fabs(got - ref);
    op_cmp__keep(c, i, ok, ok ? 0 : isfinite(d) ? d : INFINITY, got, ref, 0, OP_CMP_EXACT);
}

/* 1 when every element compared passed; otherwise prints the failure line (see the top) and 0. */
static inline int op_cmp_end(const op_cmp *c)
{
    if (!c->bad)
        return 1;
    char where[64] = "", tol[96];
    if (c->cols > 0)
        snprintf(where, sizeof where, " (row %lld, col %lld)", (long long)(c->worst / c->cols),
                 (long long)(c->worst % c->cols));
    double got = c->worst_got, ref = c->worst_ref, d = fabs(got - ref);
    char how[96] = "", rel[32] = "";
    if (isnan(ref))
        snprintf(tol, sizeof tol, "%s", c->nan_fails ? "a NaN reference fails here (nan_fails)" : "want NaN");
    else if (isinf(ref))
        snprintf(tol, sizeof tol, "%s",
                 c->inf_fails ? "an infinite reference fails here (inf_fails)" : "want that inf");
    else if (c->worst_kind == OP_CMP_EXACT)
        snprintf(tol, sizeof tol, "|diff| %.3g, want them equal (the sign of a zero counts)", d);
    else if (isnan(got))
        snprintf(tol, sizeof tol, "NaN is never within tol %.3g", c->worst_tol);
    else
        snprintf(tol, sizeof tol, "|diff| %.3g > tol %.3g%s", d, c->worst_tol,
                 c->worst_kind == OP_CMP_ATOL_RTOL ? "" : " (the test's formula)");
    if (c->worst_kind == OP_CMP_ATOL_RTOL && isfinite(ref))
        snprintf(how, sizeof how, " (atol %.3g + rtol %.3g*|want|)", c->atol, c->rtol);
    if (isfinite(ref) && ref != 0 && isfinite(d))
        snprintf(rel, sizeof rel, ", rel err %.3g", d / fabs(ref));
    fprintf(stderr,
            "  %s: %lld of %lld elements off; worst [%lld]%s: got %.9g want %.9g, %s%s%s "
            "(seed %llu; TK_TEST_SEED=%llu replays it)\n",
            c->what, (long long)c->bad, (long long)c->n, (long long)c->worst, where, got, ref, tol, how, rel,
            (unsigned long long)seed, (unsigned long long)seed);
    return 0;
}

/* Every element of host tensor got (any float dtype, any strides) against ref[i], |got - ref| <=
 * atol + rtol*|ref|; the failure line names got's dtype and shape after `what`, and the worst element
 * as [row, col] of got's last dimension. */
static inline int op_close_tensor(const char *what, const tk_tensor *got, const double *ref, double atol, double rtol)
{
    op_cmp c = op_cmp_begin(atol, rtol, "%s (%s %s)", what, tk_ops__dtype_str(got->dtype),
                            tk_ops__shape_fmt(got->ndim, got->shape));
    c.cols = got->ndim ? got->shape[got->ndim - 1] : 0;
    for (int64_t i = 0, n = numel(got); i < n; i++)
        op_cmp_at(&c, i, get(got, i), ref[i]);
    return op_cmp_end(&c);
}

/* ref, or the inf it becomes when stored in dt overflows it: for the tests whose reference may lie
 * beyond the output dtype's range, where the right answer is that inf. */
static inline double op_stored_inf(double ref, tk_dtype dt)
{
    double q = quantize(ref, dt);
    return isinf(q) && !isinf(ref) ? q : ref;
}

/* ---- comparing whole tensors by relative norm (the GPU tests: a kernel against the CPU reference) */

typedef struct {
    double rel;        /* ||got - ref||_2 / ||ref||_2 over the finite reference elements */
    double worst;      /* max |got - ref| over them */
    int64_t worst_i;   /* its flat index */
    double worst_got, worst_ref;
    int64_t bad_nan;   /* elements where exactly one of got/ref is NaN, or an inf that differs */
    int64_t n;
} cmp_t;

static inline double elem_at(const tk_tensor *t, int64_t i)
{
    const void *b = tk_ops__base(t);
    if (t->dtype.code == TK_DL_INT) {
        switch (t->dtype.bits) {
        case 64: return (double)((const int64_t *)b)[i];
        case 32: return (double)((const int32_t *)b)[i];
        case 8: return (double)((const int8_t *)b)[i];
        default: return NAN;
        }
    }
    if (t->dtype.code == TK_DL_FLOAT && t->dtype.bits == 64)
        return ((const double *)b)[i];
    float f;
    tk_ops__load_f32(&f, b, i, 1, 1, t->dtype);
    return f;
}

/* Compares two host tensors of the same numel element by element, as doubles. NaN matches NaN and an
 * inf matches the same inf; anything else involving them counts in bad_nan (NaN never passes). */
static inline cmp_t compare_tensors(const tk_tensor *got, const tk_tensor *ref)
{
    cmp_t c;
    memset(&c, 0, sizeof c);
    c.worst_i = -1;
    int64_t n = tk_ops__numel(ref);
    if (tk_ops__numel(got) != n) {
        c.bad_nan = 1;
        return c;
    }
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double g = elem_at(got, i), r = elem_at(ref, i);
        if (isnan(r) || isnan(g) || isinf(r) || isinf(g)) {
            if (!((isnan(r) && isnan(g)) || (isinf(r) && g == r)))
                c.bad_nan++;
            continue;
        }
        double d = fabs(g - r);
        num += d * d;
        den += r * r;
        if (d > c.worst || c.worst_i < 0) {
            c.worst = d;
            c.worst_i = i;
            c.worst_got = g;
            c.worst_ref = r;
        }
    }
    c.n = n;
    c.rel = den > 0 ? sqrt(num / den) : sqrt(num);
    return c;
}

/* Relative-norm tolerances per dtype of the compared output: the rounding of one store in that dtype,
 * with room for a different summation order. The library's table (ops/cases.c), which tk selftest
 * holds every kernel to on the user's GPU: the GPU tests and the self-test agree on what is right. */
static inline double tol_rel(tk_dtype dt) { return tk_ops__tol_rel(dt); }

static inline int cmp_ok(const cmp_t *c, double rel_tol, double worst_tol)
{
    return c->bad_nan == 0 && c->rel <= rel_tol && c->worst <= worst_tol;
}

static inline void cmp_print(const char *what, const cmp_t *c)
{
    fprintf(stderr,
            "%s: rel %.3g, worst |d| %.3g at %lld (got %.9g, ref %.9g), NaN/inf mismatches %lld of %lld "
            "(seed %llu)\n",
            what, c->rel, c->worst, (long long)c->worst_i, c->worst_got, c->worst_ref, (long long)c->bad_nan,
            (long long)c->n, (unsigned long long)seed);
}

#endif /* TK_TEST_OP_TEST_H */
