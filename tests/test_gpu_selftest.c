/*
 * test_gpu_selftest.c — tk_selftest on a GPU (docs/selftest.md): every package tk ships passes on this
 * GPU; the broken test package (tests/data/selftest/broken: one wrong element, the last row skipped, a
 * trap) is caught kernel by kernel by `tk selftest` in a process of its own (the trap ends CUDA in the
 * process that runs it) and all three recorded; a self-test in this process then tests the wrong ones
 * again but not the recorded trap, and CUDA here stays usable; then
 * tk_op_run, with that package added as a directory (its kernels rank first), is routed around them to
 * a good silu kernel, and the result is right; with "selftest": "off" the broken kernel runs again;
 * with "required" a never-tested kernel is self-tested on first use. Skips without a CUDA device.
 *
 * Run from the repository root (the broken package is found by its path), as make test-gpu and
 * scripts/gpu-check.sh do.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "common/common.h"
#include "gpu_util.h"
#include "harness.h"
#include "op_test.h"
#include "tensor_util.h"

/* the broken package: $TK_SELFTEST_BROKEN, else its place in the checkout (run from its root) */
static const char *broken_dir(void)
{
    const char *e = getenv("TK_SELFTEST_BROKEN");
    return e && *e ? e : "./tests/data/selftest/broken";
}
#define BROKEN broken_dir()

static json_t *kernel_row(json_t *report, const char *kernel)
{
    size_t i;
    json_t *k;
    json_array_foreach(json_object_get(report, "kernels"), i, k)
        if (!strcmp(json_string_value(json_object_get(k, "kernel")), kernel))
            return k;
    return NULL;
}

static const char *status_of(json_t *report, const char *kernel)
{
    return json_string_value(json_object_get(kernel_row(report, kernel), "status"));
}

/* Shipped packages pass: no kernel failed, crashed or timed out, and each of them ran cases. Prints
 * each package's time (the budget: about a second per package after compilation). The packages that
 * compile quickly; scripts/gpu-check.sh phase 1b runs `tk selftest` over all of them (with the compiles
 * its bench home already holds), $TK_SELFTEST_ALL=1 makes this test do the same. */
static void test_shipped_packages_pass(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    static const char *quick[] = {"kernels-community/activation", "kernels-community/rotary",
                                  "kernels-community/softmax",    "kernels-community/sampling",
                                  "kernels-community/layers",     NULL};
    static const char *all[] = {"kernels-community/activation", "kernels-community/rmsnorm",
                                "kernels-community/rotary",     "kernels-community/softmax",
                                "kernels-community/sampling",   "kernels-community/cross-entropy",
                                "kernels-community/casted",     "kernels-community/layers",
                                "kernels-community/flash-attn", NULL};
    const char *e = getenv("TK_SELFTEST_ALL");
    const char *const *pkgs = e && !strcmp(e, "1") ? all : quick;
    gpu_ctx g;
    CHECK_RC(gpu_ctx_new(&g, pkgs), TK_OK);
    for (size_t i = 0; pkgs[i]; i++) {
        char *report = NULL;
        tk_selftest_opts o = TK_SELFTEST_OPTS_INIT;
        int rc = tk_selftest(&report, g.ctx, pkgs[i], &o);
        json_t *r = report ? json_loads(report, 0, NULL) : NULL, *k;
        size_t j;
        if (rc != TK_OK)
            fprintf(stderr, "%s: %s\n", pkgs[i], tk_last_error());
        CHECK_RC(rc, TK_OK);
        json_array_foreach(json_object_get(r, "kernels"), j, k) {
            const char *st = json_string_value(json_object_get(k, "status"));
            if (strcmp(st, "passed") && strcmp(st, "skipped"))
                fprintf(stderr, "%s:%s %s: %s\n", pkgs[i], json_string_value(json_object_get(k, "kernel")), st,
                        json_string_value(json_object_get(json_object_get(k, "detail"), "summary")));
            CHECK(!strcmp(st, "passed") || !strcmp(st, "skipped"));
        }
        json_t *c = json_object_get(r, "counts");
        printf("selftest %s: %lld passed, %lld skipped, %.3f s (loading %.3f s) on %s\n", pkgs[i],
               (long long)json_integer_value(json_object_get(c, "passed")),
               (long long)json_integer_value(json_object_get(c, "skipped")),
               json_real_value(json_object_get(r, "seconds")), json_real_value(json_object_get(r, "load_seconds")),
               json_string_value(json_object_get(json_object_get(r, "device"), "name")));
        json_decref(r);
        tk_free(report);
    }
    /* what is recorded now: every installed kernel of this GPU passed, none never tested */
    char *js = NULL;
    CHECK_RC(tk_selftest_results_json(&js, g.ctx, NULL, 0), TK_OK);
    json_t *res = js ? json_loads(js, 0, NULL) : NULL, *p;
    size_t i;
    json_array_foreach(json_object_get(res, "packages"), i, p) {
        CHECK_EQ_INT(json_integer_value(json_object_get(p, "failed")), 0);
        CHECK_EQ_INT(json_integer_value(json_object_get(p, "never_tested")), 0);
    }
    json_decref(res);
    tk_free(js);
    gpu_ctx_free(&g);
}

/* silu on [3, 1000] f32 through tk_op_run; *impl what ran; the result checked against the CPU. */
static int silu_on_gpu(tk_ctx *ctx, const char **impl, int *right)
{
    int64_t shape[2] = {3, 1000};
    host_t x, ref, got;
    dev_tensor dx, dout;
    host_new(&x, F32, 2, shape, 0);
    host_new(&ref, F32, 2, shape, 0);
    host_new(&got, F32, 2, shape, 0);
    fill(&x, 4);
    tk_arg ca[] = {{TK_ARG_TENSOR, "out", &ref.t, 0, 0}, {TK_ARG_TENSOR, "input", &x.t, 0, 0}};
    int rc = tk_op_run(ctx, "silu", ca, 2, NULL, NULL);
    if (rc == TK_OK)
        rc = dev_upload(&dx, &x.t);
    if (rc == TK_OK)
        rc = dev_upload(&dout, &got.t);
    if (rc == TK_OK) {
        tk_arg ga[] = {{TK_ARG_TENSOR, "out", &dout.t, 0, 0}, {TK_ARG_TENSOR, "input", &dx.t, 0, 0}};
        rc = tk_op_run(ctx, "silu", ga, 2, NULL, impl);
        if (rc == TK_OK)
            rc = dev_download(&dout, &got.t);
        cmp_t c = compare_tensors(&got.t, &ref.t);
        *right = rc == TK_OK && cmp_ok(&c, 1e-5, 1e-5);
        dev_free(&dx);
        dev_free(&dout);
    }
    host_free(&x);
    host_free(&ref);
    host_free(&got);
    return rc;
}

static int write_config(const gpu_ctx *g, const char *text)
{
    char path[128];
    snprintf(path, sizeof path, "%s/config.json", g->home);
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fputs(text, f);
    return fclose(f);
}

static tk_ctx *ctx_on(const gpu_ctx *g)
{
    tk_ctx_opts o = TK_CTX_OPTS_INIT;
    o.home = g->home;
    o.offline = 1;
    o.log = gpu_log;
    tk_ctx *ctx = NULL;
    return tk_ctx_new(&ctx, &o) == TK_OK ? ctx : NULL;
}

/* The broken package is caught and recorded, and dispatch goes around it. */
static void test_broken_package_is_caught_and_routed_around(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    const char *pkgs[] = {"kernels-community/activation", NULL};
    gpu_ctx g;
    if (!tk__is_dir(BROKEN)) {
        fprintf(stderr, "%s is not a directory: run from the checkout's root or set TK_SELFTEST_BROKEN\n", BROKEN);
        CHECK(0);
        return;
    }
    CHECK_RC(gpu_ctx_new(&g, pkgs), TK_OK);
    /* The trap ends CUDA in the process that runs it (a sticky error: NVIDIA's rule, seen on the first
     * GPU run), so the first self-test of the package runs in a process of its own: `tk selftest`. */
    char cmd[2048], tk[1024];
    ssize_t n = readlink("/proc/self/exe", tk, sizeof tk - 16);
    tk[n > 0 ? n : 0] = '\0';
    char *slash = strrchr(tk, '/');
    snprintf(slash ? slash : tk, sizeof tk - (size_t)(slash ? slash - tk : 0), "/../tk"); /* build/tests/.. */
    snprintf(cmd, sizeof cmd, "TK_HOME='%s' '%s' selftest --json --timeout 2 '%s'", g.home, tk, BROKEN);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL);
    char *out = NULL;
    size_t cap = 0, len = 0;
    for (char buf[4096]; p && (n = (ssize_t)fread(buf, 1, sizeof buf, p)) > 0; len += (size_t)n) {
        char *grown = realloc(out, (cap = len + (size_t)n + 1));
        if (!grown)
            break;
        out = grown;
        memcpy(out + len, buf, (size_t)n);
        out[len + (size_t)n] = '\0';
    }
    int st = p ? pclose(p) : -1;
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 10); /* TK_EXIT_SELFTEST */
    json_t *arr = out ? json_loads(out, 0, NULL) : NULL, *r = json_array_get(arr, 0);
    if (out)
        printf("%s\n", out);
    free(out);
    CHECK_STR(status_of(r, "silu_wrong_element_f32"), "failed");
    CHECK_STR(status_of(r, "silu_skip_last_row_f32"), "failed");
    CHECK_STR(status_of(r, "silu_trap_f32"), "crashed");
    CHECK(json_string_value(json_object_get(r, "cuda_lost")) != NULL);
    CHECK(json_is_false(json_object_get(r, "ok")));
    /* the worst element of the wrong one is the planted one: off by 1 */
    json_t *d = json_object_get(kernel_row(r, "silu_wrong_element_f32"), "detail");
    CHECK(fabs(json_real_value(json_object_get(d, "got")) - json_real_value(json_object_get(d, "want")) - 1.0) < 1e-3);
    CHECK_EQ_INT(json_integer_value(json_object_get(d, "bad")), 1);
    CHECK_CONTAINS(json_string_value(
                       json_object_get(json_object_get(kernel_row(r, "silu_skip_last_row_f32"), "detail"), "summary")),
                   "never wrote");
    json_decref(arr);

    /* In this process, with the trap on record: the wrong ones are tested again, the trap is not run
     * (it would end CUDA here), and CUDA stays usable */
    char *report = NULL;
    tk_selftest_opts o = TK_SELFTEST_OPTS_INIT;
    o.launch_timeout_s = 2;
    CHECK_RC(tk_selftest(&report, g.ctx, BROKEN, &o), TK_ERR_SELFTEST);
    r = report ? json_loads(report, 0, NULL) : NULL;
    CHECK_STR(status_of(r, "silu_wrong_element_f32"), "failed");
    CHECK_STR(status_of(r, "silu_skip_last_row_f32"), "failed");
    CHECK_STR(status_of(r, "silu_trap_f32"), "crashed");
    CHECK(json_is_true(json_object_get(json_object_get(kernel_row(r, "silu_trap_f32"), "detail"), "not_run")));
    CHECK(json_is_null(json_object_get(r, "cuda_lost")));
    json_decref(r);
    tk_free(report);
    /* the process's CUDA is unharmed: the good package's self-test passes in it */
    CHECK_RC(tk_selftest(&report, g.ctx, "kernels-community/activation", &o), TK_OK);
    tk_free(report);

    /* dispatch with the broken package first in line: routed to activation's silu, right result */
    tk_ctx *ctx = ctx_on(&g);
    CHECK(ctx != NULL);
    CHECK_RC(tk_ops_add_package(ctx, BROKEN), TK_OK);
    const char *impl = NULL;
    int right = 0;
    CHECK_RC(silu_on_gpu(ctx, &impl, &right), TK_OK);
    CHECK_STR(impl, "kernels-community/activation:silu_f32");
    CHECK(right);
    tk_ctx_free(ctx);

    /* "selftest": "off": the records are ignored, the first broken kernel runs (and is wrong) */
    CHECK_EQ_INT(write_config(&g, "{\"selftest\": \"off\"}"), 0);
    ctx = ctx_on(&g);
    CHECK(ctx != NULL);
    CHECK_RC(tk_ops_add_package(ctx, BROKEN), TK_OK);
    impl = NULL;
    right = 1;
    int rc = silu_on_gpu(ctx, &impl, &right);
    CHECK(rc != TK_OK || (impl && strstr(impl, "tk-test/broken-silu@local:") && !right));
    tk_ctx_free(ctx);

    /* forgotten records and "required": the first use tests the good one (the broken ones keep their
     * records: testing the trap on first use would end CUDA in this process) */
    CHECK_RC(tk_selftest_forget(g.ctx, "kernels-community/activation", NULL), TK_OK);
    CHECK_EQ_INT(write_config(&g, "{\"selftest\": \"required\"}"), 0);
    ctx = ctx_on(&g);
    CHECK(ctx != NULL);
    CHECK_RC(tk_ops_add_package(ctx, BROKEN), TK_OK);
    impl = NULL;
    right = 0;
    CHECK_RC(silu_on_gpu(ctx, &impl, &right), TK_OK);
    CHECK_STR(impl, "kernels-community/activation:silu_f32");
    CHECK(right);
    char *js = NULL;
    CHECK_RC(tk_selftest_records_json(&js, ctx, NULL), TK_OK);
    CHECK_CONTAINS(js, "silu_trap_f32");
    CHECK_CONTAINS(js, "\"passed\""); /* activation's silu_f32, tested on first use */
    tk_free(js);
    tk_ctx_free(ctx);

    /* nothing left: an error naming the failed self-test, or the CPU reference when allowed */
    CHECK_EQ_INT(write_config(&g, "{\"ops\": {\"silu\": \"tk-test/broken-silu\"}}"), 0);
    ctx = ctx_on(&g);
    CHECK(ctx != NULL);
    CHECK_RC(tk_ops_add_package(ctx, BROKEN), TK_OK);
    CHECK_RC(silu_on_gpu(ctx, &impl, &right), TK_ERR_SELFTEST);
    CHECK_CONTAINS(tk_last_error(), "self-test");
    CHECK_CONTAINS(tk_last_error(), "tk selftest");
    tk_ctx_free(ctx);
    CHECK_EQ_INT(write_config(&g, "{\"ops\": {\"silu\": \"tk-test/broken-silu\"}, \"cpu_fallback\": true}"), 0);
    ctx = ctx_on(&g);
    CHECK(ctx != NULL);
    CHECK_RC(tk_ops_add_package(ctx, BROKEN), TK_OK);
    impl = NULL;
    CHECK_RC(silu_on_gpu(ctx, &impl, &right), TK_OK);
    CHECK_STR(impl, "cpu-reference (fallback)");
    CHECK(right);
    tk_ctx_free(ctx);
    gpu_ctx_free(&g);
}

int main(int argc, char **argv)
{
    static const char *const ops[] = {"silu", NULL};
    gpu_main(argc, argv, ops);
    op_test_seed();
    RUN(test_shipped_packages_pass);
    RUN(test_broken_package_is_caught_and_routed_around);
    return th_done();
}
