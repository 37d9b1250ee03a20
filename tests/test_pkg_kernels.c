/*
 * test_pkg_kernels.c — tk_pkg_kernel_* and tk_pkg_op_*: a package's kernels and ops, read without a
 * GPU, from packages the build's registry holds (got with the default endpoint into a scratch home),
 * checked against the manifest's own JSON.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "common/common.h"
#include "harness.h"

static char home[256];
static tk_ctx *ctx;

static tk_pkg *get(const char *ref)
{
    tk_pkg *p = NULL;
    if (tk_pkg_get(&p, ctx, ref, NULL) != TK_OK) {
        printf("    tk_pkg_get %s: %s\n", ref, tk_last_error());
        return NULL;
    }
    return p;
}

static void test_kernels_match_manifest(void)
{
    tk_pkg *p = get("kernels-community/flash-attn");
    CHECK(p != NULL);
    if (!p)
        return;
    json_t *m = json_loads(tk_pkg_manifest(p), 0, NULL), *kv;
    json_t *ks = json_object_get(m, "kernels");
    CHECK(json_array_size(ks) > 10);
    CHECK_EQ_INT((int)tk_pkg_kernel_count(p), (int)json_array_size(ks));
    size_t i;
    int seen_sm90a = 0, seen_sm80 = 0;
    json_array_foreach(ks, i, kv) {
        json_t *cons = json_object_get(kv, "constraints");
        CHECK_STR(tk_pkg_kernel_name(p, i), json_string_value(json_object_get(kv, "name")));
        CHECK_STR(tk_pkg_kernel_op(p, i), json_string_value(json_object_get(kv, "op")));
        CHECK_EQ_INT(tk_pkg_kernel_min_cc(p, i), (int)json_integer_value(json_object_get(cons, "min_cc")));
        CHECK_EQ_INT(tk_pkg_kernel_max_cc(p, i), (int)json_integer_value(json_object_get(cons, "max_cc")));
        CHECK_EQ_INT(tk_pkg_kernel_arch_specific(p, i), json_is_true(json_object_get(cons, "arch_specific")));
        /* dtypes: the manifest's list, comma-joined */
        char want[256] = "";
        size_t j;
        json_t *d;
        json_array_foreach(json_object_get(cons, "dtypes"), j, d) {
            if (j)
                strcat(want, ",");
            strcat(want, json_string_value(d));
        }
        CHECK_STR(tk_pkg_kernel_dtypes(p, i), want);
        if (!strcmp(tk_pkg_kernel_name(p, i), "attention_sm90_bf16_d64")) {
            seen_sm90a = 1;
            CHECK_STR(tk_pkg_kernel_archs(p, i), "sm_90a");
            CHECK_STR(tk_pkg_kernel_dtypes(p, i), "bf16");
        }
        if (!strcmp(tk_pkg_kernel_name(p, i), "attention_sm80_f16_d128")) {
            seen_sm80 = 1;
            CHECK_STR(tk_pkg_kernel_archs(p, i), "sm_80+");
        }
    }
    CHECK(seen_sm90a && seen_sm80);
    /* ops: distinct, sorted, each one some kernel's op */
    CHECK(tk_pkg_op_count(p) >= 2);
    for (i = 0; i < tk_pkg_op_count(p); i++) {
        if (i)
            CHECK(strcmp(tk_pkg_op_at(p, i - 1), tk_pkg_op_at(p, i)) < 0);
        int found = 0;
        for (size_t k = 0; k < tk_pkg_kernel_count(p); k++)
            found |= !strcmp(tk_pkg_kernel_op(p, k), tk_pkg_op_at(p, i));
        CHECK(found);
    }
    CHECK_STR(tk_pkg_op_at(p, 0), "attention");
    /* out of range and NULL */
    size_t n = tk_pkg_kernel_count(p);
    CHECK(tk_pkg_kernel_name(p, n) == NULL);
    CHECK(tk_pkg_kernel_archs(p, n) == NULL);
    CHECK_EQ_INT(tk_pkg_kernel_min_cc(p, n), -1);
    CHECK(tk_pkg_op_at(p, tk_pkg_op_count(p)) == NULL);
    CHECK_EQ_INT((int)tk_pkg_kernel_count(NULL), 0);
    CHECK_EQ_INT((int)tk_pkg_op_count(NULL), 0);
    json_decref(m);
    tk_pkg_free(p);
}

static void test_info_json_has_kernels_and_ops(void)
{
    tk_pkg *p = get("kernels-community/activation");
    CHECK(p != NULL);
    if (!p)
        return;
    tk_pkg *q = NULL; /* the installed record reads the same, offline */
    CHECK_RC(tk_pkg_info(&q, ctx, "kernels-community/activation"), TK_OK);
    CHECK_EQ_INT((int)tk_pkg_kernel_count(q), (int)tk_pkg_kernel_count(p));
    char *js = NULL;
    CHECK_RC(tk_pkg_to_json(&js, q), TK_OK);
    json_t *j = js ? json_loads(js, 0, NULL) : NULL;
    json_t *k0 = json_array_get(json_object_get(j, "kernels"), 0);
    CHECK_STR(json_string_value(json_object_get(k0, "name")), tk_pkg_kernel_name(q, 0));
    CHECK_STR(json_string_value(json_object_get(k0, "archs")), tk_pkg_kernel_archs(q, 0));
    CHECK(json_is_array(json_object_get(k0, "dtypes")));
    CHECK(json_is_boolean(json_object_get(k0, "arch_specific")));
    CHECK_EQ_INT((int)json_array_size(json_object_get(j, "ops")), (int)tk_pkg_op_count(q));
    CHECK_STR(json_string_value(json_array_get(json_object_get(j, "ops"), 0)), tk_pkg_op_at(q, 0));
    json_decref(j);
    tk_free(js);
    tk_pkg_free(q);
    tk_pkg_free(p);
}

int main(void)
{
    snprintf(home, sizeof home, "/tmp/tk-test-pkgk.%d", (int)getpid());
    unsetenv("TK_ENDPOINT");
    tk_ctx_opts o = TK_CTX_OPTS_INIT;
    o.home = home;
    o.offline = 0;
    if (tk_ctx_new(&ctx, &o) != TK_OK) {
        printf("tk_ctx_new: %s\n", tk_last_error());
        return 1;
    }
    RUN(test_kernels_match_manifest);
    RUN(test_info_json_has_kernels_and_ops);
    tk_ctx_free(ctx);
    tk__rmtree(home);
    return th_done();
}
