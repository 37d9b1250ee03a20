/*
 * selftest.h — what proving a kernel needs from the op registry: for every standard op, a list of
 * small cases (random inputs, pre-filled outputs; edge shapes first), the per-dtype tolerances a
 * kernel's result is held to against the CPU reference, the comparison that reports the worst
 * element, and the routing decision that follows from recorded self-test results.
 *
 * Host only, no device: api/selftest.c runs a case's CPU reference here, the kernel on the GPU, and
 * compares (ops/cases.c); api/op.c asks tk_ops__route which candidates a call may use
 * (ops/route.c). The GPU tests (tests/op_test.h) use the same tolerances.
 *
 *     tk_ops_case c;
 *     for (size_t i = 0; (rc = tk_ops__case_make(&c, op, i, &spec)) != TK_ERR_NOT_FOUND; i++) {
 *         if (rc == TK_OK) { ... tk_ops__case_args(&c, args) ... run, compare each output ...
 *                            tk_ops__case_free(&c); }
 *     }
 */
#ifndef TK_OPS_SELFTEST_H
#define TK_OPS_SELFTEST_H

#include <stddef.h>
#include <stdint.h>

#include "ops/ops.h"

/* ---- cases (ops/cases.c) ---------------------------------------------------------------------- */

#define TK_OPS_CASE_MAX TK_OPS_MAX_PARAMS

/* What a tensor of a case is to the comparison. */
enum {
    TK_CASE_IN = 0,    /* read only */
    TK_CASE_OUT = 1,   /* written: pre-filled with 0xff bytes (NaN in every float dtype, -1 in integers)
                          on both sides, so an element a kernel skips differs from the reference */
    TK_CASE_INOUT = 2, /* updated in place (or accumulated into): starts from the case's values */
};

typedef struct {
    const char *name;  /* the op's parameter */
    tk_tensor t;       /* host, contiguous; t.data is owned by the case */
    int64_t shape[TK_OPS_MAX_RANK];
    int role;          /* TK_CASE_* */
    int exact;         /* 1: every element must equal the reference's (ids, copies, tokens, and the
                          ops whose GPU test asks for the same bits: adamw) */
    double rtol, atol; /* rtol > 0: each float element within atol + rtol * |ref| instead of the dtype's
                          tolerance: the bound of the op's own GPU test where it is tighter (one ulp
                          of the noise-schedule ops, the relative error of a double sum) */
} tk_ops_case_tensor;

typedef struct {
    const char *name;
    int kind;          /* TK_ARG_I64 or TK_ARG_F64 */
    int64_t i;
    double f;
} tk_ops_case_scalar;

typedef struct {
    const tk_op_desc *op;
    char label[200];   /* "silu bf16 out [3, 1000]; causal": what a report names */
    tk_ops_case_tensor t[TK_OPS_CASE_MAX];
    size_t nt;
    tk_ops_case_scalar s[TK_OPS_CASE_MAX];
    size_t ns;
    double tol_factor; /* multiplies the dtype's tolerance (reductions, long sums); 1 by default */
    uint64_t rng;
} tk_ops_case;

/* What the kernel under test takes, from its manifest entry (api/selftest.c builds it). */
typedef struct {
    const char *name;
    int has_dtype;     /* the kernel fixes this tensor's dtype */
    tk_dtype dtype;
} tk_ops_case_param;

/* A dimension the kernel's constraints bound: "q.shape[3]" in min/max (dim -1: the last); or, with dim
 * TK_OPS_CASE_PIN_SCALAR, a scalar parameter itself ("thresholding": min 1): a case giving it a value
 * outside the bounds does not apply to the kernel. */
#define TK_OPS_CASE_PIN_SCALAR (-1000)
typedef struct {
    const char *param;
    int dim;
    int64_t lo, hi;    /* inclusive; a dimension's hi < 0: no upper bound; a scalar's bounds are as they
                          are (INT64_MIN, INT64_MAX: none) */
} tk_ops_case_pin;

typedef struct {
    tk_dtype dtype;                 /* the primary dtype (constraints.dtypes), for tensors the kernel
                                       does not type */
    const tk_ops_case_param *params; /* the kernel's caller-given params; NULL: every parameter of the
                                        op is taken (tests on the CPU) */
    size_t nparams;
    const tk_ops_case_pin *pins;
    size_t npins;
} tk_ops_case_spec;

/* 1 when op has self-test cases (every standard op with a CPU reference; not declared ops). */
int tk_ops__case_has(const tk_op_desc *op);
/* Builds case `index` of op for spec into *c. TK_OK; TK_ERR_NOT_FOUND past the last case;
 * TK_ERR_UNSUPPORTED when this case does not apply to the kernel (it lacks a parameter the case needs:
 * go on with the next index); TK_ERR_NOMEM. The inputs are random from a seed fixed by op, index and
 * dtypes, so the same case is the same bytes in every run. On success free it with
 * tk_ops__case_free. */
int tk_ops__case_make(tk_ops_case *c, const tk_op_desc *op, size_t index, const tk_ops_case_spec *spec);
void tk_ops__case_free(tk_ops_case *c);
/* The case as tk_op_run's arguments, named, pointing at its host tensors. Returns the count (at most
 * 2 * TK_OPS_CASE_MAX). */
size_t tk_ops__case_args(const tk_ops_case *c, tk_arg *args);
/* A copy of tensor i's bytes (the reference's result after a CPU run): malloc'd, NULL on OOM. */
void *tk_ops__case_copy(const tk_ops_case *c, size_t i);
/* Bytes of a case tensor. */
size_t tk_ops__case_bytes(const tk_ops_case_tensor *t);

/* ---- tolerances and the comparison ------------------------------------------------------------ */

/* The relative-norm tolerance of one store in dt with room for another summation order: bf16 1e-2,
 * f16 2e-3, 8-bit 6e-2, else 1e-5 (the GPU tests' tol_rel). */
double tk_ops__tol_rel(tk_dtype dt);

/* The result of comparing one output. */
typedef struct {
    int ok;
    int64_t n, bad;       /* elements compared, elements off */
    int64_t worst;        /* flat index of the worst element (-1: none) */
    double got, want, tol; /* at the worst element */
    double max_ref;       /* max |ref| over the finite reference elements */
} tk_ops_cmp;

/* The absolute tolerance per unit of input magnitude: sixteen f32 rounding steps (about 9.5e-7).
 * Kernels compute in f32 whatever they store, so a result that cancels to about zero is off by the f32
 * rounding of its terms, whose size the inputs give; a relative tolerance alone is 0 there. (The role
 * of torch.testing.assert_close's atol, 1e-5 for every float dtype whatever the inputs; with the
 * cases' inputs of magnitude 0.5 to 8 this one is tighter.) */
#define TK_OPS_ATOL 0x1p-20

/* max |x| over the case's float inputs (TK_CASE_IN and TK_CASE_INOUT tensors of 16 bits or more, not
 * exact ones; 8-bit codes and integers left out): the size of what its outputs are computed from. 0
 * for c NULL or no such tensor. */
double tk_ops__case_input_scale(const tk_ops_case *c);

/* Compares got with ref (host tensors of the same shape and dtype). Floats: NaN must be NaN, an inf
 * the same inf, else |got - ref| <= f * (4 * r * |ref| + 16 * r * max|ref|) + max(tiny, f * TK_OPS_ATOL * s),
 * r = tk_ops__tol_rel(dtype), f the case's tol_factor and s tk_ops__case_input_scale(c) (or, where
 * the tensor sets rtol, |got - ref| <= atol + rtol * |ref|); integers and exact tensors: equal. (The
 * input term is a max with the tiny floor: i8 codes keep their step of 1.) */
void tk_ops__case_compare(tk_ops_cmp *r, const tk_ops_case *c, const tk_ops_case_tensor *ref, const void *got);

/* ---- routing around kernels that failed (ops/route.c) ----------------------------------------- */

/* A kernel's recorded self-test on this GPU, driver, tk and binary. */
enum {
    TK_ST_NONE = 0,        /* never tested (or only an older binary, driver or tk was) */
    TK_ST_PASSED = 1,
    TK_ST_FAILED = 2,      /* a wrong result, or a launch the driver refused */
    TK_ST_CRASHED = 3,     /* a device fault: the context died */
    TK_ST_TIMED_OUT = 4,   /* a launch passed the time limit */
    TK_ST_UNTESTED = 5,    /* cannot be tested: no CPU reference, or no case fits it */
    TK_ST_INTERRUPTED = 6, /* the process that tested it ended mid-test (it may have taken it down) */
};
/* "passed", "failed", ... "never_tested"; and back (-1 for an unknown name). */
const char *tk_ops__st_name(int st);
int tk_ops__st_parse(const char *s);
/* 1 for a status that routing avoids (failed, crashed, timed out, interrupted). */
int tk_ops__st_bad(int st);

/* The config's "selftest". */
enum { TK_SELFTEST_OFF = 0, TK_SELFTEST_RECORD = 1, TK_SELFTEST_REQUIRED = 2 };

/* What dispatch does with each candidate. */
enum { TK_ROUTE_USE = 0, TK_ROUTE_SKIP = 1, TK_ROUTE_TEST_FIRST = 2 };
/* When no candidate is left. */
enum { TK_ROUTE_OK = 0, TK_ROUTE_CPU = 1, TK_ROUTE_ERROR = 2 };

/* The routing decision, a pure function of the candidates' recorded statuses (status[i], in dispatch
 * order), the mode and whether the caller allows the CPU reference:
 *   off       every candidate is used;
 *   record    a candidate whose self-test failed, crashed, timed out or was interrupted is skipped;
 *   required  only candidates that passed are used; one never tested is tested first; one that
 *             cannot be tested is skipped.
 * action[i] receives TK_ROUTE_*. Returns TK_ROUTE_OK when a candidate is left (or there were none),
 * else TK_ROUTE_CPU when cpu_allowed, else TK_ROUTE_ERROR. */
int tk_ops__route(int *action, const int *status, size_t n, int mode, int cpu_allowed);

#endif /* TK_OPS_SELFTEST_H */
