/*
 * test_expr.c — launch-rule expressions: parsing, name checks with clear messages, and int64
 * evaluation with overflow, division-by-zero and index checks.
 */
#include "harness.h"

#include "jit/jit.h"
#include "manifest/expr.h"
#include "tk.h"

static const tk_manifest_var params[] = {
    {"out", TK_MANIFEST_P_TENSOR, 1}, {"input", TK_MANIFEST_P_TENSOR, 1}, {"d", TK_MANIFEST_P_I64, 1},
    {"alpha", TK_MANIFEST_P_F32, 1},  {"later", TK_MANIFEST_P_I64, 0},
};
#define NP (sizeof params / sizeof *params)

static int64_t out_shape[] = {4, 6, 8};
static int64_t in_shape[] = {4, 6, 16};
static int64_t in_strides[] = {200, 20, 1};

static void values(tk_manifest_value v[NP])
{
    memset(v, 0, sizeof(tk_manifest_value) * NP);
    v[0].known = 1;
    v[0].ndim = 3;
    v[0].shape = out_shape;
    v[1].known = 1;
    v[1].ndim = 3;
    v[1].shape = in_shape;
    v[1].strides = in_strides;
    v[2].known = 1;
    v[2].i = 8;
}

/* Parses and evaluates; returns the status, *got the value. */
static int eval(const char *src, int64_t *got)
{
    tk_manifest_expr *e = NULL;
    tk_manifest_value v[NP];
    int rc = tk_manifest__expr_parse(&e, src, params, NP, "kernel 'k', launch.grid[0]");
    *got = -999;
    if (rc != TK_OK)
        return rc;
    values(v);
    rc = tk_manifest__expr_eval(got, e, v, NP);
    tk_manifest__expr_free(e);
    return rc;
}

#define EVAL_EQ(src, want)                                                                                             \
    do {                                                                                                               \
        int64_t g_;                                                                                                    \
        CHECK_RC(eval(src, &g_), TK_OK);                                                                               \
        CHECK_EQ_INT(g_, want);                                                                                        \
    } while (0)

static void test_arithmetic(void)
{
    EVAL_EQ("1", 1);
    EVAL_EQ("1 + 2 * 3", 7);
    EVAL_EQ("(1 + 2) * 3", 9);
    EVAL_EQ("7 / 2", 3);
    EVAL_EQ("-7 / 2", -3); /* C truncation */
    EVAL_EQ("-7 % 3", -1);
    EVAL_EQ("- -5", 5);
    EVAL_EQ("10 - 2 - 3", 5); /* left associative */
    EVAL_EQ("100 / 10 / 5", 2);
    EVAL_EQ("  2*  3 ", 6);
    EVAL_EQ("9223372036854775807", INT64_MAX);
}

static void test_functions(void)
{
    EVAL_EQ("min(3, 9)", 3);
    EVAL_EQ("max(3, -9)", 3);
    EVAL_EQ("cdiv(10, 4)", 3);
    EVAL_EQ("cdiv(8, 4)", 2);
    EVAL_EQ("cdiv(0, 4)", 0);
    EVAL_EQ("cdiv(-10, 4)", -2);
    EVAL_EQ("cdiv(-10, -4)", 3);
    EVAL_EQ("align(10, 8)", 16);
    EVAL_EQ("align(16, 8)", 16);
    EVAL_EQ("min(1024, cdiv(out.shape[-1], 4) * 1)", 2);
}

static void test_tensors(void)
{
    EVAL_EQ("numel(out)", 4 * 6 * 8);
    EVAL_EQ("numel(out) / out.shape[-1]", 24);
    EVAL_EQ("out.shape[0]", 4);
    EVAL_EQ("out.shape[-3]", 4);
    EVAL_EQ("out.shape[1 + 1]", 8);
    EVAL_EQ("out.ndim", 3);
    EVAL_EQ("out.stride[0]", 48); /* contiguous */
    EVAL_EQ("out.stride[-1]", 1);
    EVAL_EQ("input.stride[1]", 20); /* explicit strides */
    EVAL_EQ("input.shape[-1] / 2", 8);
    EVAL_EQ("d * 2", 16);
}

static void test_eval_errors(void)
{
    int64_t g;
    CHECK_RC(eval("1 / 0", &g), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "division by zero");
    CHECK_CONTAINS(tk_last_error(), "launch.grid[0]");
    CHECK_RC(eval("5 % (d - 8)", &g), TK_ERR_INVALID);
    CHECK_RC(eval("cdiv(1, 0)", &g), TK_ERR_INVALID);
    CHECK_RC(eval("align(1, 0)", &g), TK_ERR_INVALID);
    CHECK_RC(eval("9223372036854775807 + 1", &g), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "overflow");
    CHECK_RC(eval("-9223372036854775807 - 2", &g), TK_ERR_INVALID);
    CHECK_RC(eval("4611686018427387904 * 2", &g), TK_ERR_INVALID);
    CHECK_RC(eval("(-9223372036854775807 - 1) / -1", &g), TK_ERR_INVALID);
    CHECK_RC(eval("-(-9223372036854775807 - 1)", &g), TK_ERR_INVALID);
    CHECK_RC(eval("align(9223372036854775807, 2)", &g), TK_ERR_INVALID);
    CHECK_RC(eval("out.shape[3]", &g), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "out of range");
    CHECK_RC(eval("out.shape[-4]", &g), TK_ERR_INVALID);
    CHECK_RC(eval("out.stride[7]", &g), TK_ERR_INVALID);

    /* an unbound value */
    {
        tk_manifest_expr *e = NULL;
        tk_manifest_value v[NP];
        CHECK_RC(tk_manifest__expr_parse(&e, "d + 1", params, NP, "x"), TK_OK);
        values(v);
        v[2].known = 0;
        CHECK_RC(tk_manifest__expr_eval(&g, e, v, NP), TK_ERR_INVALID);
        CHECK_CONTAINS(tk_last_error(), "'d' has no value");
        tk_manifest__expr_free(e);
    }
}

/* A malformed expression fails to parse with TK_ERR_MANIFEST, the context, the column and `why`. */
static void bad(const char *src, const char *why, int col)
{
    tk_manifest_expr *e = (tk_manifest_expr *)1;
    char colbuf[32];
    CHECK_RC(tk_manifest__expr_parse(&e, src, params, NP, "kernel 'silu_f32', launch.block[0]"), TK_ERR_MANIFEST);
    CHECK(e == NULL);
    CHECK_CONTAINS(tk_last_error(), "kernel 'silu_f32', launch.block[0]");
    CHECK_CONTAINS(tk_last_error(), why);
    snprintf(colbuf, sizeof colbuf, "column %d:", col);
    CHECK_CONTAINS(tk_last_error(), colbuf);
}

static void test_malformed(void)
{
    bad("", "empty expression", 1);
    bad("   ", "empty expression", 1);
    bad("numel(outt)", "'outt' is not a tensor parameter", 7);
    bad("outt.shape[0]", "unknown name 'outt'", 1);
    bad("outt.shape[0]", "out, input, d, alpha, later", 1); /* the message lists the params */
    bad("out.shape[", "expected a value, found the end", 11);
    bad("out.shape[0", "expected ']'", 12);
    bad("1 +", "expected a value", 4);
    bad("1 2", "unexpected '2' after a complete expression", 3);
    bad("(1 + 2", "expected ')'", 7);
    bad("foo(1)", "unknown function 'foo'", 1);
    bad("min(1)", "expected ','", 6);
    bad("min(1, 2, 3)", "expected ')'", 9);
    bad("out", "'out' is a tensor", 4);
    bad("out.size[0]", "unknown tensor attribute 'size'", 5);
    bad("alpha * 2", "floating-point", 1);
    bad("later + 1", "not yet computed", 1);
    bad("1.5", "only integers", 2);
    bad("2 $ 3", "unexpected '$'", 3);
    bad("99999999999999999999", "out of range", 1);
    bad("numel(d)", "'d' is not a tensor parameter", 7);
    bad("d[0]", "unexpected '['", 2);

    /* the message shows the expression with a caret under the spot */
    {
        tk_manifest_expr *e = NULL;
        CHECK_RC(tk_manifest__expr_parse(&e, "1 + oops", params, NP, "k"), TK_ERR_MANIFEST);
        CHECK_CONTAINS(tk_last_error(), "\n    1 + oops\n        ^");
    }
    /* deep nesting and huge expressions are refused, not a stack overflow */
    {
        char deep[600];
        size_t n = 0;
        for (int i = 0; i < 200; i++)
            deep[n++] = '(';
        deep[n++] = '1';
        for (int i = 0; i < 200; i++)
            deep[n++] = ')';
        deep[n] = '\0';
        bad(deep, "nested too deeply", 65);
        char negs[300];
        memset(negs, '-', 250);
        negs[250] = '1';
        negs[251] = '\0';
        bad(negs, "nested too deeply", 64);
        char big[1100];
        memset(big, '1', sizeof big - 1);
        big[sizeof big - 1] = '\0';
        tk_manifest_expr *e = NULL;
        CHECK_RC(tk_manifest__expr_parse(&e, big, params, NP, "k"), TK_ERR_MANIFEST);
        char many[1000];
        n = 0;
        for (int i = 0; i < 300; i++) {
            many[n++] = '1';
            many[n++] = '+';
        }
        many[n++] = '1';
        many[n] = '\0';
        CHECK_RC(tk_manifest__expr_parse(&e, many, params, NP, "k"), TK_ERR_MANIFEST);
        CHECK_CONTAINS(tk_last_error(), "too long");
    }
    CHECK_RC(tk_manifest__expr_parse(&(tk_manifest_expr *){NULL}, NULL, params, NP, "k"), TK_ERR_MANIFEST);
}

static void test_src_kept(void)
{
    tk_manifest_expr *e = NULL;
    CHECK_RC(tk_manifest__expr_parse(&e, "cdiv(numel(out), 256)", params, NP, "k"), TK_OK);
    CHECK_STR(tk_manifest__expr_src(e), "cdiv(numel(out), 256)");
    tk_manifest__expr_free(e);
    tk_manifest__expr_free(NULL);
}

/* sm_count: the device's multiprocessors, known only at launch; a parameter of that name wins. */
static void test_sm_count(void)
{
    tk_manifest_expr *e = NULL;
    tk_manifest_value v[NP];
    int64_t g = 0;
    values(v);
    CHECK_RC(tk_manifest__expr_parse(&e, "max(1, min(64, cdiv(2 * sm_count, d)))", params, NP, "k"), TK_OK);
    CHECK_RC(tk_manifest__expr_eval_dev(&g, e, v, NP, 132), TK_OK);
    CHECK_EQ_INT(g, 33); /* cdiv(264, 8) */
    CHECK_RC(tk_manifest__expr_eval_dev(&g, e, v, NP, 108), TK_OK);
    CHECK_EQ_INT(g, 27);
    CHECK_RC(tk_manifest__expr_eval(&g, e, v, NP), TK_ERR_INVALID); /* no device */
    CHECK_CONTAINS(tk_last_error(), "sm_count is known only when launching on a device");
    tk_manifest__expr_free(e);
    e = NULL;
    const tk_manifest_var shadow[] = {{"sm_count", TK_MANIFEST_P_I64, 1}};
    tk_manifest_value sv = {1, 7, 0, NULL, NULL};
    CHECK_RC(tk_manifest__expr_parse(&e, "sm_count + 1", shadow, 1, "k"), TK_OK);
    CHECK_RC(tk_manifest__expr_eval_dev(&g, e, &sv, 1, 132), TK_OK);
    CHECK_EQ_INT(g, 8);
    tk_manifest__expr_free(e);
    e = NULL;
    CHECK_RC(tk_manifest__expr_parse(&e, "sm_counts + 1", params, NP, "k"), TK_ERR_MANIFEST);
    CHECK_CONTAINS(tk_last_error(), "unknown name 'sm_counts'");
}

/* The dynamic shared memory opt-in counts static + dynamic against the default 48 KiB. */
static void test_smem_optin(void)
{
    CHECK_EQ_INT(tk_jit__smem_optin(0, 48 * 1024), 0);
    CHECK_EQ_INT(tk_jit__smem_optin(0, 48 * 1024 + 1), 48 * 1024 + 1);
    CHECK_EQ_INT(tk_jit__smem_optin(1024, 48 * 1024), 48 * 1024);    /* 49 KiB in all: opt in */
    CHECK_EQ_INT(tk_jit__smem_optin(8708, 40 * 1024), 40 * 1024);     /* dynamic alone fits, the sum does not */
    CHECK_EQ_INT(tk_jit__smem_optin(8708, 30 * 1024), 0);
    CHECK_EQ_INT(tk_jit__smem_optin(60 * 1024, 0), 0);                /* static only: nothing to raise */
}

int main(void)
{
    RUN(test_arithmetic);
    RUN(test_functions);
    RUN(test_tensors);
    RUN(test_eval_errors);
    RUN(test_malformed);
    RUN(test_src_kept);
    RUN(test_sm_count);
    RUN(test_smem_optin);
    return th_done();
}
