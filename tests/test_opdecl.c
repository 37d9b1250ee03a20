/*
 * test_opdecl.c — ops that packages declare (kernel.json "ops"): the shape patterns (ops/declared.c),
 * declarations turned into descriptors and their errors (manifest/opdecl.c), kernels checked against the
 * signature, and the public path: tk_ops_add_package on tests/data/opdecl, then tk_ops_json and
 * tk_op_run on host tensors (shapes checked, then "no CPU reference" named).
 */
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "harness.h"
#include "ops/ops.h"

static void test_patterns(void)
{
    int lo, hi;
    const char *why;
    CHECK_EQ_INT(tk_ops__pattern_check("[..., 2*d]", &lo, &hi, &why), 0);
    CHECK_EQ_INT(lo, 1);
    CHECK_EQ_INT(hi, -1);
    CHECK_EQ_INT(tk_ops__pattern_check("[b, n, 4]", &lo, &hi, &why), 0);
    CHECK_EQ_INT(lo, 3);
    CHECK_EQ_INT(hi, 3);
    CHECK_EQ_INT(tk_ops__pattern_check("[]", &lo, &hi, &why), 0);
    CHECK_EQ_INT(hi, 0);
    static const char *const bad[] = {"",      "[",     "[..., ...]",      "[2d]",    "[2*]",
                                      "[n,]",  "[, n]", "[n] x",           "[n | 1]", "[R+P]",
                                      "[0*n]", "n",     "[99999999999999]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(tk_ops__pattern_check(bad[i], &lo, &hi, &why) == -1 && why && *why);
}

static json_t *scale_add_decl(void)
{
    return json_loads(
        "{\"name\": \"scale_add\", \"summary\": \"out = alpha * x + y\", \"params\": ["
        "{\"name\": \"out\", \"kind\": \"tensor\", \"role\": \"out\", \"dtype_like\": \"x\", "
        "\"shape\": \"[..., n]\"},"
        "{\"name\": \"x\", \"kind\": \"tensor\", \"dtypes\": [\"f32\", \"f16\"], \"shape\": \"[..., n]\"},"
        "{\"name\": \"y\", \"kind\": \"tensor\", \"dtype_like\": \"x\", \"shape\": \"[..., 2*n]\"},"
        "{\"name\": \"alpha\", \"kind\": \"f64\", \"default\": 1.5}]}",
        0, NULL);
}

static void test_declare_and_check_shapes(void)
{
    json_t *j = scale_add_decl();
    struct tk_op_desc *op = NULL;
    CHECK_RC(tk_manifest__op_declare(&op, j, "me/sa"), TK_OK);
    if (!op) {
        json_decref(j);
        return;
    }
    CHECK(tk_ops__is_declared(op));
    CHECK_STR(op->package, "me/sa");
    CHECK_EQ_INT(op->params[0].dtype_like, 1);
    CHECK_EQ_INT((int)op->params[0].dtypes, (int)(TK_OPS_F32 | TK_OPS_F16));
    CHECK(op->params[3].optional && op->params[3].def == 1.5);
    tk_buf sig = TK_BUF_INIT;
    CHECK_RC(tk_ops__signature(&sig, op), TK_OK);
    CHECK_STR(sig.data, "scale_add(out: T[..., n], x: T[..., n], y: T[..., 2*n], alpha: f64 = 1.5) -> out; "
                        "T in {f32, f16}");
    tk__buf_free(&sig);

    float buf[64] = {0};
    int64_t so[2] = {2, 4}, sx[2] = {2, 4}, sy[2] = {2, 8}, sbad[2] = {2, 6}, slead[2] = {3, 8};
    tk_tensor to = {buf, {TK_DEV_CPU, 0}, 2, {TK_DL_FLOAT, 32, 1}, so, NULL, 0};
    tk_tensor tx = to, ty = to;
    tx.shape = sx;
    ty.shape = sy;
    tk_arg args[3] = {
        {TK_ARG_TENSOR, "out", &to, 0, 0}, {TK_ARG_TENSOR, "x", &tx, 0, 0}, {TK_ARG_TENSOR, "y", &ty, 0, 0}};
    tk_op_call c;
    CHECK_RC(tk_ops__prepare_op(&c, op, args, 3), TK_OK);
    CHECK(c.f[3] == 1.5); /* the default */
    CHECK_RC(tk_ops__run_cpu(&c), TK_ERR_UNSUPPORTED);
    CHECK_CONTAINS(tk_last_error(), "no CPU reference for op scale_add (declared by me/sa)");
    ty.shape = sbad; /* 6 is not 2 * 4 */
    CHECK_RC(tk_ops__prepare_op(&c, op, args, 3), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "'y' has shape [2, 6], want [..., 2*n] with n = 4 (from 'out' [2, 4])");
    ty.shape = slead;
    CHECK_RC(tk_ops__prepare_op(&c, op, args, 3), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "its leading dims (\"...\") are [3], but those of 'out' [2, 4] are [2]");
    ty.shape = sy;
    tx.dtype = (tk_dtype){TK_DL_BFLOAT, 16, 1};
    CHECK_RC(tk_ops__prepare_op(&c, op, args, 3), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "'x' has dtype bf16, want f32 or f16");

    /* a kernel against the signature */
    json_t *k = json_loads("{\"name\": \"k\", \"params\": [{\"name\": \"out\", \"type\": \"tensor\", \"dtype\": "
                           "\"f32\"}, {\"name\": \"x\", \"type\": \"tensor\", \"dtype\": \"f32\"}, {\"name\": \"y\", "
                           "\"type\": \"tensor\", \"dtype\": \"f32\"}, {\"name\": \"alpha\", \"type\": \"f32\"}, "
                           "{\"name\": \"n\", \"type\": \"i64\", \"value\": \"numel(x)\"}]}",
                           0, NULL);
    CHECK_RC(tk_manifest__op_check_kernel(op, k), TK_OK);
    json_object_set_new(json_array_get(json_object_get(k, "params"), 3), "type", json_string("i64"));
    CHECK_RC(tk_manifest__op_check_kernel(op, k), TK_ERR_MANIFEST);
    CHECK_CONTAINS(tk_last_error(), "param 'alpha' is a i64, but op 'scale_add' has it as a f64");
    json_array_remove(json_object_get(k, "params"), 3);
    CHECK_RC(tk_manifest__op_check_kernel(op, k), TK_OK); /* a scalar left out takes its default */
    json_array_remove(json_object_get(k, "params"), 0);
    CHECK_RC(tk_manifest__op_check_kernel(op, k), TK_ERR_MANIFEST);
    CHECK_CONTAINS(tk_last_error(), "does not take 'out', a tensor op 'scale_add' requires");
    json_decref(k);

    /* the same signature is the same op; another default is not */
    struct tk_op_desc *op2 = NULL;
    CHECK_RC(tk_manifest__op_declare(&op2, j, "other/sa"), TK_OK);
    CHECK(op2 && tk_manifest__op_same(op, op2));
    tk_manifest__op_declared_free(op2);
    json_object_set_new(json_array_get(json_object_get(j, "params"), 3), "default", json_real(2.0));
    CHECK_RC(tk_manifest__op_declare(&op2, j, "other/sa"), TK_OK);
    CHECK(op2 && !tk_manifest__op_same(op, op2));
    tk_manifest__op_declared_free(op2);
    tk_manifest__op_declared_free(op);
    json_decref(j);
}

static void test_bad_declarations(void)
{
    static const struct {
        const char *json, *want;
    } cases[] = {
        {"{\"name\": \"silu_and_mul\", \"params\": [{\"name\": \"x\", \"kind\": \"tensor\", \"dtypes\": [\"f32\"]}]}",
         "one of tk's own ops"},
        {"{\"name\": \"1op\", \"params\": []}", "an op needs a 'name'"},
        {"{\"name\": \"o\", \"params\": []}", "'params' must be a list of 1 to 16"},
        {"{\"name\": \"o\", \"params\": [{\"name\": \"a\", \"kind\": \"i64\"}]}", "needs at least one tensor"},
        {"{\"name\": \"o\", \"params\": [{\"name\": \"x\", \"kind\": \"tensor\"}]}", "needs 'dtypes' (a list)"},
        {"{\"name\": \"o\", \"params\": [{\"name\": \"x\", \"kind\": \"tensor\", \"dtypes\": [\"f32\"], "
         "\"dtype_like\": \"x\"}]}",
         "one of the two"},
        {"{\"name\": \"o\", \"params\": [{\"name\": \"x\", \"kind\": \"tensor\", \"dtype_like\": \"x\"}]}",
         "has dtype_like 'x'"},
        {"{\"name\": \"o\", \"params\": [{\"name\": \"x\", \"kind\": \"tensor\", \"dtypes\": [\"f32\"], "
         "\"shape\": \"[n, ...,]\"}]}",
         "tensor 'x' has shape [n, ...,]"},
        {"{\"name\": \"o\", \"params\": [{\"name\": \"x\", \"kind\": \"tensor\", \"dtypes\": []}]}",
         "'dtypes' must be a non-empty list"},
        {"{\"name\": \"o\", \"params\": [{\"name\": \"x\", \"kind\": \"tensor\", \"dtypes\": [\"f32\"]}, "
         "{\"name\": \"s\", \"kind\": \"i64\", \"default\": 0.5}]}",
         "'default' must be an integer"},
        {"{\"name\": \"o\", \"params\": [{\"name\": \"x\", \"kind\": \"tensor\", \"dtypes\": [\"f32\"], "
         "\"default\": 1}]}",
         "cannot have a 'default'"},
        {"{\"name\": \"o\", \"params\": [{\"name\": \"x\", \"kind\": \"tensor\", \"dtypes\": [\"f32\"]}, "
         "{\"name\": \"x\", \"kind\": \"f64\"}]}",
         "param 'x' is declared twice"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *j = json_loads(cases[i].json, 0, NULL);
        struct tk_op_desc *op = (struct tk_op_desc *)1;
        CHECK(j != NULL);
        CHECK_RC(tk_manifest__op_declare(&op, j, "me/x"), TK_ERR_MANIFEST);
        CHECK(op == NULL);
        CHECK_CONTAINS(tk_last_error(), cases[i].want);
        json_decref(j);
    }
}

/* The public path: a package directory's op through tk_ops_add_package, tk_ops_json and tk_op_run. */
static void test_public_api(void)
{
    char home[] = "/tmp/tk-opdecl-XXXXXX";
    if (!mkdtemp(home)) {
        SKIP("mkdtemp failed");
        return;
    }
    tk_ctx_opts co = TK_CTX_OPTS_INIT;
    co.home = home;
    co.offline = 1;
    tk_ctx *ctx = NULL;
    CHECK_RC(tk_ctx_new(&ctx, &co), TK_OK);
    if (!ctx)
        return;
    float d[32] = {0};
    int64_t s[2] = {4, 8};
    tk_tensor t = {d, {TK_DEV_CPU, 0}, 2, {TK_DL_FLOAT, 32, 1}, s, NULL, 0};
    tk_arg args[3] = {{TK_ARG_TENSOR, "out", &t, 0, 0}, {TK_ARG_TENSOR, "x", &t, 0, 0}, {TK_ARG_TENSOR, "y", &t, 0, 0}};
    CHECK_RC(tk_op_run(ctx, "scale_add", args, 3, NULL, NULL), TK_ERR_NOT_FOUND);
    CHECK_RC(tk_ops_add_package(ctx, "tests/data/no-such-dir"), TK_ERR_NOT_FOUND);
    CHECK_RC(tk_ops_add_package(ctx, "tests/data/opdecl"), TK_OK);
    char *json = NULL;
    CHECK_RC(tk_ops_json(&json, ctx), TK_OK);
    CHECK_CONTAINS(json, "\"declared_by\": \"test-org/scale-add\"");
    CHECK_CONTAINS(json, "\"impl\": \"test-org/scale-add@local:scale_add_f32\"");
    tk_free(json);
    const char *impl = "x";
    CHECK_RC(tk_op_run(ctx, "scale_add", args, 3, NULL, &impl), TK_ERR_UNSUPPORTED);
    CHECK(impl == NULL);
    CHECK_CONTAINS(tk_last_error(), "no CPU reference for op scale_add (declared by test-org/scale-add)");
    int64_t s2[2] = {4, 7};
    tk_tensor t2 = t;
    t2.shape = s2;
    args[2].t = &t2;
    CHECK_RC(tk_op_run(ctx, "scale_add", args, 3, NULL, NULL), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "'y' has shape [4, 7], want [..., n] with n = 8");
    tk_ctx_free(ctx);
    char *rm = tk__fmt("rm -rf '%s'", home);
    if (rm && system(rm) != 0)
        fprintf(stderr, "could not remove %s\n", home);
    free(rm);
}

int main(void)
{
    RUN(test_patterns);
    RUN(test_declare_and_check_shapes);
    RUN(test_bad_declarations);
    RUN(test_public_api);
    return th_done();
}
