/*
 * test_selftest.c — what the self-test (docs/selftest.md) is without a GPU: the op case tables (every
 * case valid, its CPU reference runs, the same case twice is the same bytes, every kernel tk ships has
 * cases that fit it), the comparison (one wrong element, an element never written, a wrong token are
 * caught; rounding is not), the routing decision as a pure function of recorded statuses, the planned
 * binary keys against what tk build compiles, the records as tk_selftest_records_json shows them
 * (an interrupted test), forgetting, the config keys, and tk_selftest's error without a device.
 * The GPU half is tests/test_gpu_selftest.c and scripts/gpu-check.sh's "selftest" phase.
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "harness.h"

#include "api/api.h"
#include "cache/kcache.h"
#include "ops/ops.h"
#include "ops/selftest.h"
#include "tk.h"

static const tk_dtype F32 = {TK_DL_FLOAT, 32, 1}, F16 = {TK_DL_FLOAT, 16, 1}, BF16 = {TK_DL_BFLOAT, 16, 1};

/* ---- the case tables ----------------------------------------------------------------------------- */

/* Every op with a CPU reference has cases; each case of each op in f32, f16 and bf16 (the kernel
 * "takes everything") is valid for the op and its CPU reference runs. */
static void test_every_case_is_valid(void)
{
    const tk_dtype dts[3] = {F32, F16, BF16};
    int ops = 0, cases = 0;
    for (size_t i = 0; i < tk_ops__count(); i++) {
        const tk_op_desc *op = tk_ops__at(i);
        if (!op->cpu)
            continue;
        if (!tk_ops__case_has(op)) {
            fprintf(stderr, "op %s has a CPU reference but no self-test cases (ops/cases.c)\n", op->name);
            CHECK(0);
            continue;
        }
        ops++;
        for (int d = 0; d < 3; d++) {
            tk_ops_case_spec s = {dts[d], NULL, 0, NULL, 0};
            int n = 0;
            for (size_t k = 0; k < 64; k++) {
                tk_ops_case c;
                int rc = tk_ops__case_make(&c, op, k, &s);
                if (rc == TK_ERR_NOT_FOUND)
                    break;
                if (rc == TK_ERR_UNSUPPORTED)
                    continue;
                CHECK_RC(rc, TK_OK);
                if (rc != TK_OK)
                    continue;
                tk_arg a[2 * TK_OPS_CASE_MAX];
                size_t na = tk_ops__case_args(&c, a);
                tk_op_call call;
                rc = tk_ops__prepare_op(&call, op, a, na);
                if (rc == TK_OK)
                    rc = tk_ops__run_cpu(&call);
                if (rc != TK_OK)
                    fprintf(stderr, "%s case %zu '%s': %s\n", op->name, k, c.label, tk_last_error());
                CHECK_RC(rc, TK_OK);
                CHECK(c.label[0] != '\0');
                /* every output is NaN bytes before the reference runs: check it wrote them */
                n++;
                tk_ops__case_free(&c);
            }
            CHECK(n > 0);
            cases += n;
        }
    }
    printf("%d ops, %d cases in three dtypes\n", ops, cases);
    CHECK(ops >= 40);
}

/* The same op, index and dtypes give the same bytes (so a CPU result is shared by the kernels that
 * see one case, and a failure replays); another index gives other bytes. */
static void test_cases_are_deterministic(void)
{
    const tk_op_desc *op = tk_ops__find("rms_norm");
    tk_ops_case_spec s = {BF16, NULL, 0, NULL, 0};
    tk_ops_case a, b, c;
    CHECK_RC(tk_ops__case_make(&a, op, 2, &s), TK_OK);
    CHECK_RC(tk_ops__case_make(&b, op, 2, &s), TK_OK);
    CHECK_RC(tk_ops__case_make(&c, op, 3, &s), TK_OK);
    CHECK_EQ_INT(a.nt, b.nt);
    for (size_t i = 0; i < a.nt; i++) {
        CHECK_STR(a.t[i].name, b.t[i].name);
        CHECK(memcmp(a.t[i].t.data, b.t[i].t.data, tk_ops__case_bytes(&a.t[i])) == 0);
    }
    CHECK(tk_ops__case_bytes(&a.t[1]) != tk_ops__case_bytes(&c.t[1]) ||
          memcmp(a.t[1].t.data, c.t[1].t.data, tk_ops__case_bytes(&a.t[1])) != 0);
    /* the output starts as NaN bytes */
    float f;
    tk_ops__load_f32(&f, a.t[0].t.data, 0, 1, 1, a.t[0].t.dtype);
    CHECK(a.t[0].role == TK_CASE_OUT && isnan(f));
    tk_ops__case_free(&a);
    tk_ops__case_free(&b);
    tk_ops__case_free(&c);
}

/* The edges: one row, a row length that is no multiple of 2, 4, 8 or 32, and (attention) the largest
 * head size a kernel's constraints allow; a kernel pinned to one head size gets only that. */
static void test_edges_and_pins(void)
{
    const tk_op_desc *op = tk_ops__find("silu");
    tk_ops_case_spec s = {F32, NULL, 0, NULL, 0};
    int one_row = 0, odd = 0;
    for (size_t k = 0;; k++) {
        tk_ops_case c;
        if (tk_ops__case_make(&c, op, k, &s) != TK_OK)
            break;
        one_row |= c.t[0].t.shape[0] == 1;
        odd |= c.t[0].t.shape[1] % 2 == 1 && c.t[0].t.shape[1] > 32;
        tk_ops__case_free(&c);
    }
    CHECK(one_row);
    CHECK(odd);
    /* attention with q.shape[3] pinned to 128..128, and another allowing up to 512 */
    const tk_op_desc *at = tk_ops__find("attention");
    tk_ops_case_param ps[] = {{"out", 1, BF16}, {"q", 1, BF16},     {"k", 1, BF16},   {"v", 1, BF16},
                              {"lse", 1, F32},  {"causal", 0, F32}, {"scale", 0, F32}};
    tk_ops_case_pin d128 = {"q", 3, 128, 128}, d512 = {"q", 3, 0, 512};
    tk_ops_case_spec s1 = {BF16, ps, 7, &d128, 1}, s2 = {BF16, ps, 7, &d512, 1};
    int64_t max1 = 0, max2 = 0, n1 = 0;
    for (size_t k = 0; k < 32; k++) {
        tk_ops_case c;
        int rc = tk_ops__case_make(&c, at, k, &s1);
        if (rc == TK_ERR_NOT_FOUND)
            break;
        if (rc == TK_OK) {
            CHECK_EQ_INT(c.t[1].t.shape[3], 128);
            max1 = c.t[1].t.shape[3] > max1 ? c.t[1].t.shape[3] : max1;
            n1++;
            /* the kernel takes no alibi_slopes and no window: no case gives them */
            for (size_t j = 0; j < c.nt; j++)
                CHECK(strcmp(c.t[j].name, "alibi_slopes") != 0);
            tk_ops__case_free(&c);
        }
        if (tk_ops__case_make(&c, at, k, &s2) == TK_OK) {
            max2 = c.t[1].t.shape[3] > max2 ? c.t[1].t.shape[3] : max2;
            tk_ops__case_free(&c);
        }
    }
    CHECK(n1 >= 3);
    CHECK_EQ_INT(max1, 128);
    CHECK_EQ_INT(max2, 512);
}

/* ---- the comparison ----------------------------------------------------------------------------- */

/* A reference and a "kernel result" that differs from it as the broken test kernels do. */
static void test_compare(void)
{
    const tk_op_desc *op = tk_ops__find("silu");
    tk_ops_case_spec s = {F32, NULL, 0, NULL, 0};
    tk_ops_case c;
    CHECK_RC(tk_ops__case_make(&c, op, 2, &s), TK_OK); /* [2, 1000] */
    tk_arg a[8];
    size_t na = tk_ops__case_args(&c, a);
    tk_op_call call;
    CHECK_RC(tk_ops__prepare_op(&call, op, a, na), TK_OK);
    CHECK_RC(tk_ops__run_cpu(&call), TK_OK);
    tk_ops_case_tensor *ref = &c.t[0];
    size_t bytes = tk_ops__case_bytes(ref);
    int64_t n = tk_ops__numel(&ref->t);
    float *got = malloc(bytes);
    tk_ops_cmp r;

    memcpy(got, ref->t.data, bytes); /* equal */
    tk_ops__case_compare(&r, &c, ref, got);
    CHECK(r.ok);
    CHECK_EQ_INT(r.n, n);

    for (int64_t i = 0; i < n; i++) /* within rounding: a few ulps everywhere */
        got[i] = nextafterf(nextafterf(((float *)ref->t.data)[i], INFINITY), INFINITY);
    tk_ops__case_compare(&r, &c, ref, got);
    CHECK(r.ok);

    memcpy(got, ref->t.data, bytes); /* one wrong element, off by 1 */
    got[n / 2] += 1.0f;
    tk_ops__case_compare(&r, &c, ref, got);
    CHECK(!r.ok);
    CHECK_EQ_INT(r.bad, 1);
    CHECK_EQ_INT(r.worst, n / 2);
    CHECK(fabs(r.got - r.want - 1.0) < 1e-5);

    memcpy(got, ref->t.data, bytes); /* the last row never written: the NaN bytes stay */
    memset(got + n - 1000, 0xff, 1000 * sizeof(float));
    tk_ops__case_compare(&r, &c, ref, got);
    CHECK(!r.ok);
    CHECK_EQ_INT(r.bad, 1000);
    CHECK(r.worst >= n - 1000 && isnan(r.got));

    /* bf16: an error of one bf16 ulp passes, a sign flip does not */
    tk_ops_case cb;
    tk_ops_case_spec sb = {BF16, NULL, 0, NULL, 0};
    CHECK_RC(tk_ops__case_make(&cb, op, 2, &sb), TK_OK);
    na = tk_ops__case_args(&cb, a);
    CHECK_RC(tk_ops__prepare_op(&call, op, a, na), TK_OK);
    CHECK_RC(tk_ops__run_cpu(&call), TK_OK);
    uint16_t *gb = malloc(tk_ops__case_bytes(&cb.t[0]));
    memcpy(gb, cb.t[0].t.data, tk_ops__case_bytes(&cb.t[0]));
    for (int64_t i = 0; i < n; i++)
        gb[i] = (uint16_t)(gb[i] + 1); /* the next bf16 (away from zero) */
    tk_ops__case_compare(&r, &cb, &cb.t[0], gb);
    CHECK(r.ok);
    int64_t big = 0;
    for (int64_t i = 0; i < n; i++)
        if (fabsf(tk_ops__bf16_to_f32(((uint16_t *)cb.t[0].t.data)[i])) > 1.0f)
            big = i;
    gb[big] ^= 0x8000; /* -x for an |x| > 1 */
    tk_ops__case_compare(&r, &cb, &cb.t[0], gb);
    CHECK(!r.ok);
    CHECK_EQ_INT(r.worst, big);
    free(gb);
    tk_ops__case_free(&cb);

    /* tokens are exact: one different id fails */
    tk_ops_case cs;
    CHECK_RC(tk_ops__case_make(&cs, tk_ops__find("argmax"), 1, &s), TK_OK);
    na = tk_ops__case_args(&cs, a);
    CHECK_RC(tk_ops__prepare_op(&call, cs.op, a, na), TK_OK);
    CHECK_RC(tk_ops__run_cpu(&call), TK_OK);
    int64_t ids[8];
    memcpy(ids, cs.t[0].t.data, tk_ops__case_bytes(&cs.t[0]));
    tk_ops__case_compare(&r, &cs, &cs.t[0], ids);
    CHECK(r.ok);
    ids[1] += 1;
    tk_ops__case_compare(&r, &cs, &cs.t[0], ids);
    CHECK(!r.ok && r.worst == 1);
    tk_ops__case_free(&cs);
    free(got);
    tk_ops__case_free(&c);
}

/* Runs case `index` of op in dtype dt through the CPU reference into *c. */
static int ref_case(tk_ops_case *c, const char *op, size_t index, tk_dtype dt)
{
    tk_ops_case_spec s = {dt, NULL, 0, NULL, 0};
    tk_arg a[2 * TK_OPS_CASE_MAX];
    tk_op_call call;
    int rc = tk_ops__case_make(c, tk_ops__find(op), index, &s);
    if (rc != TK_OK)
        return rc;
    size_t na = tk_ops__case_args(c, a);
    if ((rc = tk_ops__prepare_op(&call, c->op, a, na)) == TK_OK)
        rc = tk_ops__run_cpu(&call);
    if (rc != TK_OK)
        tk_ops__case_free(c);
    return rc;
}

/* The index of the case tensor named `name` (-1: none). */
static int tensor_of(const tk_ops_case *c, const char *name)
{
    for (size_t i = 0; i < c->nt; i++)
        if (!strcmp(c->t[i].name, name))
            return (int)i;
    return -1;
}

/* The ops whose GPU tests hold a kernel to more than the dtype's tolerance carry that bound into their
 * cases: the noise-schedule ops one ulp per element (test_gpu_diffusion.c), adamw the same bits
 * (test_gpu_train.c), sum_squares 1e-12 relative (its double sum). */
static void test_ops_own_tolerances(void)
{
    tk_ops_case c;
    tk_ops_cmp r;
    /* q_sample [3, 5, 7] f32: every element one ulp off passes, one element two ulps off does not (the
     * dtype's tolerance would take both) */
    CHECK_RC(ref_case(&c, "q_sample", 1, F32), TK_OK);
    int o = tensor_of(&c, "out");
    CHECK(o >= 0 && c.t[o].rtol > 0);
    if (o >= 0) {
        int64_t n = tk_ops__numel(&c.t[o].t);
        const float *ref = c.t[o].t.data;
        float *got = malloc((size_t)n * sizeof *got);
        for (int64_t i = 0; i < n; i++)
            got[i] = nextafterf(ref[i], copysignf(INFINITY, ref[i]));
        tk_ops__case_compare(&r, &c, &c.t[o], got);
        CHECK(r.ok);
        got[n / 2] = nextafterf(got[n / 2], copysignf(INFINITY, got[n / 2]));
        tk_ops__case_compare(&r, &c, &c.t[o], got);
        CHECK(!r.ok);
        CHECK_EQ_INT(r.bad, 1);
        CHECK_EQ_INT(r.worst, n / 2);
        tk_ops_case_tensor loose = c.t[o];
        loose.rtol = 0;
        tk_ops__case_compare(&r, &c, &loose, got);
        CHECK(r.ok);
        free(got);
    }
    tk_ops__case_free(&c);

    /* adamw: one ulp off in the updated param fails, and so in each moment */
    CHECK_RC(ref_case(&c, "adamw", 4, F32), TK_OK); /* step 7 with a copy, [1000] */
    const char *outs[] = {"param", "exp_avg", "exp_avg_sq", "param_copy"};
    for (size_t k = 0; k < 4; k++) {
        int t = tensor_of(&c, outs[k]);
        CHECK(t >= 0);
        if (t < 0)
            continue;
        float *got = tk_ops__case_copy(&c, (size_t)t);
        tk_ops__case_compare(&r, &c, &c.t[t], got);
        CHECK(r.ok);
        got[7] = nextafterf(got[7], INFINITY);
        tk_ops__case_compare(&r, &c, &c.t[t], got);
        CHECK(!r.ok && r.worst == 7);
        free(got);
    }
    tk_ops__case_free(&c);

    /* sum_squares into f64: 1e-13 relative passes, 1e-11 does not */
    CHECK_RC(ref_case(&c, "sum_squares", 6, F32), TK_OK); /* f64 out, [3, 4099] */
    CHECK(c.t[0].t.dtype.bits == 64);
    double want = *(double *)c.t[0].t.data, got = want * (1 + 1e-13);
    CHECK(want > 1000);
    tk_ops__case_compare(&r, &c, &c.t[0], &got);
    CHECK(r.ok);
    got = want * (1 + 1e-11);
    tk_ops__case_compare(&r, &c, &c.t[0], &got);
    CHECK(!r.ok);
    tk_ops__case_free(&c);
}

/* A result that is 0 exactly (attention_backward's dq with one key: the softmax of one score has no
 * gradient) and the f32 rounding a kernel leaves in it: the values the first GPU run's sm80 and simple
 * backward kernels gave on an H200 pass (they failed against a tolerance of 1e-30); a wrong element, an
 * unwritten one, or dq of a kernel that forgot the key's gradient does not. */
static void test_compare_zero_reference(void)
{
    static const struct {
        const tk_dtype *dt;
        size_t index; /* 0: B 1 Sq 1 Sk 1 Hq 1 Hkv 1, 2: the same causal */
        float err;    /* what the GPU gave where 0 was wanted */
    } cs[] = {{&F32, 2, 2.9179148e-08f},
              {&F16, 0, -1.1920929e-07f},
              {&BF16, 0, -1.0477379e-08f},
              {&BF16, 0, -5.96046448e-08f},
              {&F16, 0, -5.96046448e-08f}};
    for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++) {
        tk_ops_case c;
        tk_ops_cmp r;
        CHECK_RC(ref_case(&c, "attention_backward", cs[k].index, *cs[k].dt), TK_OK);
        int q = tensor_of(&c, "dq");
        CHECK(q >= 0);
        if (q < 0)
            continue;
        const tk_ops_case_tensor *ref = &c.t[q];
        int64_t n = tk_ops__numel(&ref->t);
        for (int64_t i = 0; i < n; i++) { /* the case: a reference of zeros */
            float w;
            tk_ops__load_f32(&w, ref->t.data, i, 1, 1, ref->t.dtype);
            CHECK(w == 0);
        }
        CHECK(tk_ops__case_input_scale(&c) > 0.5 && tk_ops__case_input_scale(&c) <= 1.0);
        void *got = tk_ops__case_copy(&c, (size_t)q);
        for (int64_t i = 0; i < n; i++) { /* rounding in every element, both signs */
            float e = i % 3 ? cs[k].err : -cs[k].err;
            tk_ops__store_f32(got, i, 1, &e, 1, ref->t.dtype);
        }
        tk_ops__case_compare(&r, &c, ref, got);
        CHECK(r.ok);
        CHECK_EQ_INT(r.n, n);
        float wrong = 0.01f; /* one element off by 1e-2: a kernel's real error */
        tk_ops__store_f32(got, n / 2, 1, &wrong, 1, ref->t.dtype);
        tk_ops__case_compare(&r, &c, ref, got);
        CHECK(!r.ok);
        CHECK_EQ_INT(r.bad, 1);
        CHECK_EQ_INT(r.worst, n / 2);
        memset((char *)got + (size_t)(n - 1) * (ref->t.dtype.bits / 8), 0xff, ref->t.dtype.bits / 8); /* unwritten */
        tk_ops__case_compare(&r, &c, ref, got);
        CHECK(!r.ok);
        CHECK_EQ_INT(r.bad, 2);
        /* dq of a kernel that lost the cancellation (dS = dP, not P * (dP - D)): of the size of k * scale */
        int k_ = tensor_of(&c, "k");
        CHECK(k_ >= 0);
        if (k_ >= 0) {
            for (int64_t i = 0; i < n; i++) {
                float kv;
                tk_ops__load_f32(&kv, c.t[k_].t.data, i, 1, 1, c.t[k_].t.dtype);
                kv *= 0.125f; /* scale 1/sqrt(64), dP of magnitude ~1 */
                tk_ops__store_f32(got, i, 1, &kv, 1, ref->t.dtype);
            }
            tk_ops__case_compare(&r, &c, ref, got);
            CHECK(!r.ok);
            CHECK(r.bad > n / 2);
        }
        free(got);
        tk_ops__case_free(&c);
    }
    /* without the case (no inputs to size it), the floor is the old tiny one: 1e-8 off a 0 fails */
    tk_ops_case c;
    tk_ops_cmp r;
    CHECK_RC(ref_case(&c, "attention_backward", 0, F32), TK_OK);
    int q = tensor_of(&c, "dq");
    CHECK(q >= 0);
    if (q >= 0) {
        float *got = tk_ops__case_copy(&c, (size_t)q);
        got[0] = 1e-8f;
        tk_ops__case_compare(&r, NULL, &c.t[q], got);
        CHECK(!r.ok);
        tk_ops__case_compare(&r, &c, &c.t[q], got);
        CHECK(r.ok);
        free(got);
    }
    tk_ops__case_free(&c);
}

/* A bound on a scalar in a kernel's constraints ("thresholding": min 1) pins its cases as a bound on a
 * dimension does: the _threshold kernels get only the thresholding cases, the others none. */
static void test_scalar_pins(void)
{
    const char *ops[] = {"ddpm_step", "ddim_step"};
    tk_ops_case_param ps[TK_OPS_MAX_PARAMS];
    const tk_op_desc *op = NULL;
    for (size_t o = 0; o < 2; o++) {
        op = tk_ops__find(ops[o]);
        size_t np = 0;
        for (size_t i = 0; op && i < op->nparams && np < TK_OPS_MAX_PARAMS; i++)
            ps[np++] = (tk_ops_case_param){op->params[i].name, 0, F32};
        tk_ops_case_pin thr = {"thresholding", TK_OPS_CASE_PIN_SCALAR, 1, INT64_MAX},
                        plain = {"thresholding", TK_OPS_CASE_PIN_SCALAR, INT64_MIN, 0};
        tk_ops_case_spec st = {F32, ps, np, &thr, 1}, sp = {F32, ps, np, &plain, 1}, all = {F32, ps, np, NULL, 0};
        int n_thr = 0, n_plain = 0, n_all = 0;
        for (size_t k = 0; k < 64; k++) {
            tk_ops_case c;
            int rc = tk_ops__case_make(&c, op, k, &all);
            if (rc == TK_ERR_NOT_FOUND)
                break;
            n_all += rc == TK_OK;
            if (rc == TK_OK)
                tk_ops__case_free(&c);
            for (int w = 0; w < 2; w++) {
                if (tk_ops__case_make(&c, op, k, w ? &st : &sp) != TK_OK)
                    continue;
                int64_t thv = -1;
                for (size_t i = 0; i < c.ns; i++)
                    if (!strcmp(c.s[i].name, "thresholding"))
                        thv = c.s[i].i;
                CHECK_EQ_INT(thv, w ? 1 : 0);
                *(w ? &n_thr : &n_plain) += 1;
                tk_ops__case_free(&c);
            }
        }
        printf("%s: %d cases, %d thresholding\n", ops[o], n_all, n_thr);
        CHECK(n_thr >= 3 && n_plain >= 3);
        CHECK_EQ_INT(n_thr + n_plain, n_all);
    }
    /* attention_backward has a case that gives cu_seqlens_q and cu_seqlens_k, which the varlen kernels
     * require (test_every_shipped_kernel_has_cases: they are planned) */
    op = tk_ops__find("attention_backward");
    size_t np = 0;
    for (size_t i = 0; op && i < op->nparams && np < TK_OPS_MAX_PARAMS; i++)
        ps[np++] = (tk_ops_case_param){op->params[i].name, 0, F32};
    tk_ops_case_spec s = {BF16, ps, np, NULL, 0};
    int varlen = 0;
    for (size_t k = 0; k < 64; k++) {
        tk_ops_case c;
        int rc = tk_ops__case_make(&c, op, k, &s);
        if (rc == TK_ERR_NOT_FOUND)
            break;
        if (rc != TK_OK)
            continue;
        varlen += tensor_of(&c, "cu_seqlens_q") >= 0 && tensor_of(&c, "cu_seqlens_k") >= 0;
        tk_ops__case_free(&c);
    }
    CHECK(varlen >= 1);
}

/* ---- routing -------------------------------------------------------------------------------------- */

static void test_route(void)
{
    int act[8];
    const int none[] = {TK_ST_NONE, TK_ST_NONE};
    const int mixed[] = {TK_ST_FAILED,   TK_ST_NONE,        TK_ST_PASSED,   TK_ST_CRASHED,
                         TK_ST_UNTESTED, TK_ST_INTERRUPTED, TK_ST_TIMED_OUT};
    const int allbad[] = {TK_ST_FAILED, TK_ST_CRASHED, TK_ST_TIMED_OUT};
    /* off: everything is used, records or not */
    CHECK_EQ_INT(tk_ops__route(act, mixed, 7, TK_SELFTEST_OFF, 0), TK_ROUTE_OK);
    for (int i = 0; i < 7; i++)
        CHECK_EQ_INT(act[i], TK_ROUTE_USE);
    /* record: the failed, crashed, timed-out and interrupted ones are skipped, the rest used in order */
    CHECK_EQ_INT(tk_ops__route(act, mixed, 7, TK_SELFTEST_RECORD, 0), TK_ROUTE_OK);
    const int want_rec[] = {TK_ROUTE_SKIP, TK_ROUTE_USE,  TK_ROUTE_USE, TK_ROUTE_SKIP,
                            TK_ROUTE_USE,  TK_ROUTE_SKIP, TK_ROUTE_SKIP};
    for (int i = 0; i < 7; i++)
        CHECK_EQ_INT(act[i], want_rec[i]);
    /* required: only passed is used; never tested is tested first; untestable is skipped */
    CHECK_EQ_INT(tk_ops__route(act, mixed, 7, TK_SELFTEST_REQUIRED, 0), TK_ROUTE_OK);
    const int want_req[] = {TK_ROUTE_SKIP, TK_ROUTE_TEST_FIRST, TK_ROUTE_USE, TK_ROUTE_SKIP,
                            TK_ROUTE_SKIP, TK_ROUTE_SKIP,       TK_ROUTE_SKIP};
    for (int i = 0; i < 7; i++)
        CHECK_EQ_INT(act[i], want_req[i]);
    CHECK_EQ_INT(tk_ops__route(act, none, 2, TK_SELFTEST_RECORD, 0), TK_ROUTE_OK);
    CHECK_EQ_INT(tk_ops__route(act, none, 2, TK_SELFTEST_REQUIRED, 0), TK_ROUTE_OK);
    CHECK_EQ_INT(act[0], TK_ROUTE_TEST_FIRST);
    /* nothing left: the CPU reference where the caller allows it, else the error */
    CHECK_EQ_INT(tk_ops__route(act, allbad, 3, TK_SELFTEST_RECORD, 0), TK_ROUTE_ERROR);
    CHECK_EQ_INT(tk_ops__route(act, allbad, 3, TK_SELFTEST_RECORD, 1), TK_ROUTE_CPU);
    CHECK_EQ_INT(tk_ops__route(act, allbad, 3, TK_SELFTEST_OFF, 0), TK_ROUTE_OK);
    const int untestable[] = {TK_ST_UNTESTED};
    CHECK_EQ_INT(tk_ops__route(act, untestable, 1, TK_SELFTEST_RECORD, 0), TK_ROUTE_OK);
    CHECK_EQ_INT(tk_ops__route(act, untestable, 1, TK_SELFTEST_REQUIRED, 0), TK_ROUTE_ERROR);
    /* no candidate at all is dispatch's own "not installed" case, not a self-test one */
    CHECK_EQ_INT(tk_ops__route(act, NULL, 0, TK_SELFTEST_REQUIRED, 0), TK_ROUTE_OK);
    /* names */
    for (int st = TK_ST_NONE; st <= TK_ST_INTERRUPTED; st++)
        CHECK_EQ_INT(tk_ops__st_parse(tk_ops__st_name(st)), st);
    CHECK_EQ_INT(tk_ops__st_parse("running"), -1);
}

/* ---- the API without a GPU ------------------------------------------------------------------------- */

static char home[] = "/tmp/tk-test.selftestXXXXXX";

static tk_ctx *new_ctx(void)
{
    tk_ctx_opts o = TK_CTX_OPTS_INIT;
    o.home = home;
    o.offline = 0;
    tk_ctx *ctx = NULL;
    if (tk_ctx_new(&ctx, &o) != TK_OK) {
        fprintf(stderr, "tk_ctx_new: %s\n", tk_last_error());
        return NULL;
    }
    return ctx;
}

static int write_config(const char *text)
{
    char path[128];
    snprintf(path, sizeof path, "%s/config.json", home);
    if (!text)
        return remove(path);
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fputs(text, f);
    return fclose(f);
}

/* Without a driver (or a GPU), tk_selftest fails with TK_ERR_NO_DEVICE, a message saying what a
 * self-test needs and a hint; nothing is recorded. */
static void test_no_device(void)
{
    tk_ctx *ctx = new_ctx();
    int n = 0;
    CHECK(ctx != NULL);
    if (!ctx)
        return;
    if (tk_device_count(&n) == TK_OK && n > 0) {
        tk_ctx_free(ctx);
        SKIP("this machine has a GPU (tests/test_gpu_selftest.c covers it)");
    }
    char *report = (char *)1;
    CHECK_RC(tk_selftest(&report, ctx, "kernels-community/activation", NULL), TK_ERR_NO_DEVICE);
    CHECK(report == NULL);
    CHECK_CONTAINS(tk_last_error(), "self-test needs the GPU");
    CHECK_CONTAINS(tk_last_error(), "HINT:");
    CHECK_RC(tk_selftest_results_json(&report, ctx, NULL, 0), TK_ERR_NO_DEVICE);
    CHECK_RC(tk_selftest_records_json(&report, ctx, NULL), TK_OK);
    CHECK_STR(report, "[]");
    tk_free(report);
    /* bad arguments come first */
    tk_selftest_opts o = TK_SELFTEST_OPTS_INIT;
    o.version = 99;
    CHECK_RC(tk_selftest(&report, ctx, "x/y", &o), TK_ERR_INVALID);
    o.version = TK_SELFTEST_OPTS_VERSION;
    o.op = "no_such_op";
    CHECK_RC(tk_selftest(&report, ctx, "x/y", &o), TK_ERR_NOT_FOUND);
    CHECK_RC(tk_selftest(NULL, ctx, "x/y", NULL), TK_ERR_INVALID);
    tk_ctx_free(ctx);
}

/* The config key and its environment override are checked when a context is made. */
static void test_config(void)
{
    tk_ctx *ctx = NULL;
    tk_ctx_opts o = TK_CTX_OPTS_INIT;
    o.home = home;
    CHECK_EQ_INT(write_config("{\"selftest\": \"sometimes\"}"), 0);
    CHECK_RC(tk_ctx_new(&ctx, &o), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "\"selftest\" must be \"off\", \"record\" or \"required\"");
    CHECK_EQ_INT(write_config("{\"cpu_fallback\": \"yes\"}"), 0);
    CHECK_RC(tk_ctx_new(&ctx, &o), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "cpu_fallback");
    CHECK_EQ_INT(write_config("{\"selftest\": \"required\", \"cpu_fallback\": true}"), 0);
    CHECK_RC(tk_ctx_new(&ctx, &o), TK_OK);
    CHECK_EQ_INT(tk_api__selftest_mode(ctx), TK_SELFTEST_REQUIRED);
    CHECK_EQ_INT(tk_api__cpu_fallback(ctx), 1);
    setenv("TK_SELFTEST", "off", 1);
    CHECK_EQ_INT(tk_api__selftest_mode(ctx), TK_SELFTEST_OFF);
    tk_ctx_free(ctx);
    setenv("TK_SELFTEST", "on", 1);
    CHECK_RC(tk_ctx_new(&ctx, &o), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "TK_SELFTEST='on'");
    unsetenv("TK_SELFTEST");
    CHECK_EQ_INT(write_config(NULL), 0);
    CHECK_RC(tk_ctx_new(&ctx, &o), TK_OK);
    CHECK_EQ_INT(tk_api__selftest_mode(ctx), TK_SELFTEST_RECORD); /* the default */
    CHECK_EQ_INT(tk_api__cpu_fallback(ctx), 0);
    tk_ctx_free(ctx);
}

static void collect_key(void *user, const char *kernel, const char *key)
{
    json_object_set_new((json_t *)user, kernel, json_string(key));
}

static int collect_entry(void *user, const tk_kcache_entry *e)
{
    json_object_set_new((json_t *)user, e->key, json_string(e->target));
    return 0;
}

/* The binary keys dispatch plans for routing (no compile: tk_api__kernel_keys) are the keys tk build
 * compiles to: a record made for a built binary is found by the lookup. Needs NVRTC (skips without). */
static void test_planned_keys_match_the_build(void)
{
    tk_ctx *ctx = new_ctx();
    tk_pkg *p = NULL;
    CHECK(ctx != NULL);
    if (!ctx)
        return;
    CHECK_RC(tk_pkg_get(&p, ctx, "kernels-community/layers", NULL), TK_OK); /* one quick compile */
    if (!p) {
        tk_ctx_free(ctx);
        return;
    }
    char ref[128];
    snprintf(ref, sizeof ref, "%s@%s", tk_pkg_name(p), tk_pkg_commit(p));
    tk_build_opts bo = TK_BUILD_OPTS_INIT;
    const char *archs[] = {"sm_90"};
    bo.archs = archs;
    bo.narchs = 1;
    int rc = tk_build(ctx, ref, &bo, NULL, NULL);
    if (rc == TK_ERR_NO_NVRTC) {
        tk_pkg_free(p);
        tk_ctx_free(ctx);
        SKIP("no NVRTC: nothing to compare the planned keys with");
    }
    CHECK_RC(rc, TK_OK);
    json_t *planned = json_object(), *built = json_object(), *v;
    const char *kernel;
    CHECK_RC(tk_api__kernel_keys(ctx, ref, 90, collect_key, planned), TK_OK);
    tk_kcache *kc = NULL;
    CHECK_RC(tk_api__kcache(&kc, ctx), TK_OK);
    if (kc)
        CHECK_RC(tk_kcache__list(kc, collect_entry, built), TK_OK);
    CHECK(json_object_size(planned) == tk_pkg_kernel_count(p));
    json_object_foreach(planned, kernel, v) {
        const char *target = json_string_value(json_object_get(built, json_string_value(v)));
        if (!target)
            fprintf(stderr, "planned key of %s (%.12s) is not a built binary\n", kernel, json_string_value(v));
        CHECK(target && !strcmp(target, "sm_90"));
    }
    json_decref(planned);
    json_decref(built);
    tk_pkg_free(p);
    tk_ctx_free(ctx);
}

/* Every kernel tk ships has cases that fit it, for sm_80 and sm_90 (no kernel is left "untested"),
 * and the plan runs their CPU references: tk_selftest's plan mode over every package. */
static void test_every_shipped_kernel_has_cases(void)
{
    static const char *pkgs[] = {"activation", "casted",  "cross-entropy", "diffusion", "flash-attn", "layers",
                                 "moe",        "rmsnorm", "rotary",        "sampling",  "softmax",    "training"};
    tk_ctx *ctx = new_ctx();
    CHECK(ctx != NULL);
    if (!ctx)
        return;
    for (size_t i = 0; i < sizeof pkgs / sizeof pkgs[0]; i++)
        for (int a = 0; a < 2; a++) {
            char ref[128], *report = NULL;
            snprintf(ref, sizeof ref, "kernels-community/%s", pkgs[i]);
            tk_selftest_opts o = TK_SELFTEST_OPTS_INIT;
            o.plan_only = 1;
            o.arch = a ? "sm_90" : "sm_80";
            CHECK_RC(tk_selftest(&report, ctx, ref, &o), TK_OK);
            json_t *r = report ? json_loads(report, 0, NULL) : NULL, *k;
            size_t j;
            int planned = 0;
            CHECK(json_is_true(json_object_get(r, "plan")));
            json_array_foreach(json_object_get(r, "kernels"), j, k) {
                const char *st = json_string_value(json_object_get(k, "status"));
                if (strcmp(st, "planned") && strcmp(st, "skipped"))
                    fprintf(stderr, "%s %s %s: %s (%s)\n", ref, o.arch, json_string_value(json_object_get(k, "kernel")),
                            st, json_string_value(json_object_get(json_object_get(k, "detail"), "summary")));
                CHECK(!strcmp(st, "planned") || !strcmp(st, "skipped"));
                planned += !strcmp(st, "planned");
                CHECK(!strcmp(st, "skipped") || json_integer_value(json_object_get(k, "cases")) > 0);
                /* a scalar bound pins the cases: the _threshold steps get the thresholding ones only */
                const char *kn = json_string_value(json_object_get(k, "kernel"));
                if (kn && strstr(kn, "_step_")) {
                    size_t li;
                    json_t *l;
                    json_array_foreach(json_object_get(json_object_get(k, "detail"), "case_labels"), li, l)
                        CHECK((strstr(json_string_value(l), "thresholding") != NULL) ==
                              (strstr(kn, "_threshold") != NULL));
                }
            }
            printf("%s %s: %d kernels planned, CPU references %.3f s\n", ref, o.arch, planned,
                   json_real_value(json_object_get(r, "cpu_seconds")));
            CHECK(planned > 0);
            json_decref(r);
            tk_free(report);
        }
    /* the broken test package: each of its three kernels has silu's cases */
    char *report = NULL;
    tk_selftest_opts o = TK_SELFTEST_OPTS_INIT;
    o.plan_only = 1;
    o.arch = "sm_80";
    CHECK_RC(tk_selftest(&report, ctx, "./tests/data/selftest/broken", &o), TK_OK);
    json_t *r = report ? json_loads(report, 0, NULL) : NULL;
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(r, "counts"), "planned")), 3);
    CHECK(json_is_true(json_object_get(r, "local")));
    json_decref(r);
    tk_free(report);
    o.arch = "sm_9x";
    CHECK_RC(tk_selftest(&report, ctx, "./tests/data/selftest/broken", &o), TK_ERR_INVALID);
    tk_ctx_free(ctx);
}

/* Records as the API shows them: a "running" record whose process has ended reads "interrupted"; one
 * whose process lives reads "running"; narrowing by package; forgetting. */
static void test_records(void)
{
    tk_ctx *ctx = new_ctx();
    tk_kcache *kc = NULL;
    CHECK(ctx != NULL);
    if (!ctx)
        return;
    CHECK_RC(tk_api__kcache(&kc, ctx), TK_OK);
    pid_t child = fork();
    if (child == 0)
        _exit(0);
    waitpid(child, NULL, 0); /* its pid is now one of a process that has ended */
    char k1[TK_SHA256_HEX], k2[TK_SHA256_HEX];
    tk__sha256_hex(k1, "a", 1);
    tk__sha256_hex(k2, "b", 1);
    tk_kcache_selftest r = {0};
    r.binary_key = k1;
    r.kernel = "silu_trap_f32";
    r.gpu_uuid = "GPU-00000000-0000-0000-0000-000000000001";
    r.driver = "570.86.15/12080";
    r.tk_version = TK_VERSION_STRING;
    r.package = "tk-test/broken-silu@local";
    r.op = "silu";
    r.status = "running";
    r.pid = child;
    r.gpu_name = "NVIDIA H100 80GB HBM3";
    CHECK_RC(tk_kcache__selftest_put(kc, &r), TK_OK);
    r.binary_key = k2;
    r.kernel = "silu_f32";
    r.package = "kernels-community/activation@0123456789abcdef0123456789abcdef01234567";
    r.pid = getpid(); /* a test in progress: this process */
    CHECK_RC(tk_kcache__selftest_put(kc, &r), TK_OK);
    char *js = NULL;
    CHECK_RC(tk_selftest_records_json(&js, ctx, NULL), TK_OK);
    json_t *arr = js ? json_loads(js, 0, NULL) : NULL, *x;
    tk_free(js);
    CHECK_EQ_INT(json_array_size(arr), 2);
    size_t i;
    json_array_foreach(arr, i, x) {
        const char *pkg = json_string_value(json_object_get(x, "package"));
        if (!strcmp(pkg, "tk-test/broken-silu")) {
            CHECK_STR(json_string_value(json_object_get(x, "status")), "interrupted");
            CHECK(json_is_null(json_object_get(x, "commit")));
        } else {
            CHECK_STR(pkg, "kernels-community/activation");
            CHECK_STR(json_string_value(json_object_get(x, "status")), "running");
            CHECK_STR(json_string_value(json_object_get(x, "commit")), "0123456789abcdef0123456789abcdef01234567");
        }
        CHECK_STR(json_string_value(json_object_get(x, "gpu_name")), "NVIDIA H100 80GB HBM3");
        CHECK(json_is_object(json_object_get(x, "detail")));
    }
    json_decref(arr);
    CHECK_RC(tk_selftest_records_json(&js, ctx, "kernels-community/activation"), TK_OK);
    arr = js ? json_loads(js, 0, NULL) : NULL;
    tk_free(js);
    CHECK_EQ_INT(json_array_size(arr), 1);
    json_decref(arr);
    CHECK_RC(tk_selftest_records_json(&js, ctx, "kernels-community/activ"), TK_OK); /* a name, not a prefix */
    CHECK_STR(js, "[]");
    tk_free(js);
    int64_t removed = -1;
    CHECK_RC(tk_selftest_forget(ctx, "./tests/data/selftest/broken", &removed), TK_OK);
    CHECK_EQ_INT(removed, 1);
    CHECK_RC(tk_selftest_forget(ctx, NULL, &removed), TK_OK);
    CHECK_EQ_INT(removed, 1);
    CHECK_RC(tk_selftest_forget(ctx, "nobody/nothing", &removed), TK_ERR_NOT_FOUND);
    tk_ctx_free(ctx);
}

int main(void)
{
    if (!mkdtemp(home)) {
        perror("mkdtemp");
        return 1;
    }
    unsetenv("TK_SELFTEST");
    unsetenv("TK_ENDPOINT");
    RUN(test_every_case_is_valid);
    RUN(test_cases_are_deterministic);
    RUN(test_edges_and_pins);
    RUN(test_compare);
    RUN(test_ops_own_tolerances);
    RUN(test_compare_zero_reference);
    RUN(test_scalar_pins);
    RUN(test_route);
    RUN(test_config);
    RUN(test_no_device);
    RUN(test_records);
    RUN(test_planned_keys_match_the_build);
    RUN(test_every_shipped_kernel_has_cases);
    tk__rmtree(home);
    return th_done();
}
