/*
 * gpu_util.h — for the GPU tests (tests/test_gpu_*.c, run by `make test-gpu`): device copies of host
 * tensors, contexts with packages installed, and the coverage check; the comparison of a kernel's
 * result with the CPU reference is op_test.h's (compare_tensors, op_cmp). Header-only, static.
 *
 *     if (!gpu_device()) { SKIP("no CUDA device"); }
 *     gpu_ctx g; const char *pkgs[] = {"kernels-community/activation", NULL};
 *     CHECK_RC(gpu_ctx_new(&g, pkgs), TK_OK);                          ... gpu_ctx_free(&g);
 *     dev_tensor dx; CHECK_RC(dev_upload(&dx, &host_x), TK_OK);        dx.t is a CUDA tk_tensor
 *     ... tk_op_run(ctx, "op", args with &dx.t ..., NULL, &impl) ...; tk_device_sync(0);
 *     CHECK_RC(dev_download(&dx, &host_got), TK_OK);
 *     cmp_t c = compare_tensors(&host_got, &host_ref);                 (op_test.h)
 *     CHECK(cmp_ok(&c, tol_rel(dt), worst_tol));  cmp_print("op bf16 [4, 4096]", &c) on failure
 *
 * Everything runs on device 0. Host tensors must be contiguous (the tests make them so).
 *
 * A GPU test cannot pass by accident:
 * - TK_TEST_GPU=1 (make test-gpu, scripts/gpu-check.sh) turns "no device / libcuda not loadable" into
 *   a failure of every test that would skip; TK_TEST_GPU=0 forces the skip.
 * - Tests call gpu_op_run, not tk_op_run: it fills every output that starts all zero with 0xff bytes
 *   (NaN in every float dtype, -1 in integers; not the ones the op accumulates into, documented
 *   "+= ..." in its signature) on both the CPU and the GPU side, so a kernel that
 *   skips rows differs from the reference; it records which implementation ran, and TK_TEST_LOG=1
 *   prints that (and the library's info/warning log; 2: its debug log too) to stderr.
 * - A test declares the ops it covers (gpu_main: `--list-ops` prints them without a GPU, which the CI
 *   check tests/cli/gpu_coverage.sh compares with every kernel of kernels-src/PKG/kernel.json), and
 *   gpu_coverage (last RUN) fails unless every kernel of those ops that fits the device ran.
 */
#ifndef TK_TEST_GPU_UTIL_H
#define TK_TEST_GPU_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "harness.h"
#include "op_test.h"
#include "ops/ops.h"
#include "tk.h"

/* 1 when a CUDA device is usable; the tests SKIP otherwise. TK_TEST_GPU=0 forces a skip; with
 * TK_TEST_GPU=1 no usable device fails the calling test (the SKIP that follows then reports FAIL). */
static inline int gpu_device(void)
{
    const char *e = getenv("TK_TEST_GPU");
    int n = 0;
    if (e && strcmp(e, "0") == 0)
        return 0;
    int rc = tk_device_count(&n);
    if (rc == TK_OK && n > 0)
        return 1;
    if (e && strcmp(e, "1") == 0) {
        fprintf(stderr,
                "%s: TK_TEST_GPU=1 but no usable CUDA device (%s)\n"
                "HINT: check nvidia-smi and 'tk doctor'; TK_LIBCUDA=/path/to/libcuda.so.1 names the driver\n",
                th_cur_name ? th_cur_name : "gpu_device", rc != TK_OK ? tk_last_error() : "0 devices");
        th_cur_failed++;
    }
    return 0;
}

/* ---- which implementation ran ------------------------------------------------------------------ */

static int gpu_log_on(void)
{
    const char *e = getenv("TK_TEST_LOG");
    return e && *e && strcmp(e, "0") != 0;
}

/* The context's log callback: the library's messages to stderr under TK_TEST_LOG=1 (info and
 * warnings: autotune's choices, a kernel that failed and the one tried next), TK_TEST_LOG=2 also the
 * debug ones (every candidate skipped and why). */
static void gpu_log(void *user, int level, const char *msg)
{
    (void)user;
    const char *e = getenv("TK_TEST_LOG");
    if (gpu_log_on() && (level >= TK_LOG_INFO || (e && strcmp(e, "2") == 0)))
        fprintf(stderr, "tk[%s]: %s\n", level >= TK_LOG_WARN ? "warn" : level >= TK_LOG_INFO ? "info" : "debug", msg);
}

#define GPU_MAX_LAUNCHED 1024
static const char *const *gpu_ops_covered; /* NULL-terminated; set by gpu_main */
static char *gpu_launched[GPU_MAX_LAUNCHED]; /* every "org/name:kernel" that ran on the GPU */
static int gpu_nlaunched;

static inline void gpu_record(const char *impl)
{
    for (int i = 0; i < gpu_nlaunched; i++)
        if (strcmp(gpu_launched[i], impl) == 0)
            return;
    if (gpu_nlaunched < GPU_MAX_LAUNCHED)
        gpu_launched[gpu_nlaunched++] = strdup(impl);
}

static inline int gpu_was_launched(const char *impl)
{
    for (int i = 0; i < gpu_nlaunched; i++)
        if (strcmp(gpu_launched[i], impl) == 0)
            return 1;
    return 0;
}

/* Fills t with 0xff bytes when all of its bytes are zero (a fresh output). Host or device. */
static inline void gpu_poison_if_zero(tk_tensor *t)
{
    size_t bytes = (size_t)tk_ops__numel(t) * (t->dtype.bits / 8);
    if (!bytes || !t->data)
        return;
    int dev = t->device.device_type == TK_DEV_CUDA;
    unsigned char *h = dev ? malloc(bytes) : (unsigned char *)tk_ops__base(t);
    if (!h)
        return;
    if (dev && (tk_device_sync(0) != TK_OK || tk_device_copy(h, tk_ops__base(t), bytes, TK_COPY_D2H, 0) != TK_OK)) {
        free(h);
        return;
    }
    size_t i = 0;
    while (i < bytes && h[i] == 0)
        i++;
    if (i == bytes) {
        if (dev)
            tk_device_memset((void *)tk_ops__base(t), 0xff, bytes, 0);
        else
            memset(h, 0xff, bytes);
    }
    if (dev)
        free(h);
}

/* tk_op_run for the tests: poisons the outputs that start all zero (see the top), runs, records and
 * (TK_TEST_LOG=1) prints which implementation ran. A GPU run of an op the test does not declare in
 * gpu_main's list fails the current test, so the list the CI check reads stays true. */
static inline int gpu_op_run(tk_ctx *ctx, const char *op, const tk_arg *args, size_t n, void *stream, const char **impl)
{
    const tk_op_desc *d = tk_ops__find(op);
    int cuda = 0;
    for (size_t i = 0; d && i < n; i++) {
        if (args[i].kind != TK_ARG_TENSOR || !args[i].t)
            continue;
        cuda |= args[i].t->device.device_type == TK_DEV_CUDA;
        int idx = tk_ops__param_index(d, args[i].name);
        /* not the outputs the op accumulates into ("+= ..." in its signature, e.g. grad_weight):
         * their zeros are the caller's starting value */
        const char *doc = idx >= 0 ? d->params[idx].doc : NULL;
        if (idx >= 0 && d->params[idx].role == TK_OPS_OUT && !(doc && strncmp(doc, "+=", 2) == 0))
            gpu_poison_if_zero((tk_tensor *)args[i].t);
    }
    const char *ran = NULL;
    int rc = tk_op_run(ctx, op, args, n, stream, &ran);
    if (impl)
        *impl = ran;
    if (rc == TK_OK && cuda && ran) {
        gpu_record(ran);
        int listed = 0;
        for (size_t i = 0; gpu_ops_covered && gpu_ops_covered[i]; i++)
            listed |= strcmp(gpu_ops_covered[i], op) == 0;
        if (gpu_ops_covered && !listed) {
            fprintf(stderr, "%s: op %s ran on the GPU but is not in this test's gpu_main list\n", th_cur_name, op);
            th_cur_failed++;
        }
    }
    if (gpu_log_on())
        fprintf(stderr, "ran %s on %s: %s%s%s\n", op, cuda ? "cuda" : "cpu",
                rc == TK_OK ? (ran ? ran : "?") : "error: ", rc == TK_OK ? "" : tk_status_str(rc),
                rc == TK_OK ? "" : "");
    return rc;
}

/* The test's main: `--list-ops` prints the ops the test covers, one a line, and exits (no GPU needed;
 * tests/cli/gpu_coverage.sh reads it). Otherwise records the list for gpu_op_run and gpu_coverage. */
static inline void gpu_main(int argc, char **argv, const char *const *ops)
{
    gpu_ops_covered = ops;
    if (argc > 1 && strcmp(argv[1], "--list-ops") == 0) {
        if (!ops[0])
            printf("-\n"); /* launches no op kernels (the communicator's tests) */
        for (size_t i = 0; ops[i]; i++)
            printf("%s\n", ops[i]);
        exit(0);
    }
}

typedef struct {
    tk_tensor t; /* the device tensor: shape and dtype of the host one, contiguous, on cuda:0 */
    int64_t shape[TK_OPS_MAX_RANK];
    void *ptr;   /* the allocation; the tensor's first byte is ptr + off (t.byte_offset) */
    size_t off;
    size_t bytes;
} dev_tensor;

/* Bytes by which dev_upload shifts every new device tensor from its 256-byte aligned allocation (as
 * t.byte_offset), rounded up to the tensor's element size (tk refuses a view that starts inside an
 * element, for every kernel): 0 normally; a test sets it to an element size to check that kernels take
 * misaligned views (scalar fallbacks) or refuse them clearly (constraints.align), never fault. With
 * 2, bf16 tensors start 2 bytes and an f32 lse 4 bytes past a 16-byte boundary. */
static size_t gpu_misalign;

/* The device address of d's first byte. */
static inline void *dev_data(const dev_tensor *d) { return (char *)d->ptr + d->off; }

static inline size_t host_bytes(const tk_tensor *h) { return (size_t)tk_ops__numel(h) * (h->dtype.bits / 8); }

/* Allocates a device tensor shaped like h and copies h's bytes into it. */
static inline int dev_upload(dev_tensor *d, const tk_tensor *h)
{
    memset(d, 0, sizeof *d);
    if (!tk_ops__contiguous(h) || h->ndim > TK_OPS_MAX_RANK)
        return TK_ERR_INVALID;
    d->bytes = host_bytes(h);
    size_t esize = h->dtype.bits >= 8 ? (size_t)h->dtype.bits / 8 : 1;
    d->off = (gpu_misalign + esize - 1) / esize * esize;
    int rc = tk_device_alloc(&d->ptr, 0, d->bytes + d->off + 1);
    if (rc != TK_OK)
        return rc;
    if (d->bytes && (rc = tk_device_copy(dev_data(d), tk_ops__base(h), d->bytes, TK_COPY_H2D, 0)) != TK_OK)
        return rc;
    memcpy(d->shape, h->shape, (size_t)h->ndim * sizeof *d->shape);
    d->t = *h;
    d->t.data = d->ptr;
    d->t.byte_offset = d->off;
    d->t.strides = NULL;
    d->t.shape = d->shape;
    d->t.device.device_type = TK_DEV_CUDA;
    d->t.device.device_id = 0;
    return TK_OK;
}

/* Copies the device tensor back into h (same shape and dtype, contiguous). Synchronises first. */
static inline int dev_download(const dev_tensor *d, tk_tensor *h)
{
    int rc = tk_device_sync(0);
    if (rc != TK_OK)
        return rc;
    if (host_bytes(h) != d->bytes || !tk_ops__contiguous(h))
        return TK_ERR_INVALID;
    return d->bytes ? tk_device_copy(tk_ops__base(h), dev_data(d), d->bytes, TK_COPY_D2H, 0) : TK_OK;
}

static inline void dev_free(dev_tensor *d)
{
    if (d->ptr)
        tk_device_free(d->ptr, 0);
    memset(d, 0, sizeof *d);
}

/* ---- a context with packages installed --------------------------------------------------------- */

/* A context on a fresh home under /tmp (removed by gpu_ctx_free) using the build's embedded default
 * registry, with each package of the NULL-terminated list installed (tk_pkg_get; compiled on first
 * use by tk_op_run). The shared compiled-binary cache is the home's own, so the first run compiles. */
typedef struct {
    tk_ctx *ctx;
    char home[64];
} gpu_ctx;

static inline int gpu_ctx_new(gpu_ctx *g, const char *const *pkgs)
{
    memset(g, 0, sizeof *g);
    snprintf(g->home, sizeof g->home, "/tmp/tk-gpu-test.XXXXXX");
    if (!mkdtemp(g->home))
        return TK_ERR_IO;
    tk_ctx_opts o = TK_CTX_OPTS_INIT;
    o.home = g->home;
    o.endpoint = NULL; /* $TK_ENDPOINT, else the default registry: build/registry, or the bundle's */
    o.offline = 0;
    o.log = gpu_log;
    int rc = tk_ctx_new(&g->ctx, &o);
    if (rc == TK_OK && gpu_log_on())
        fprintf(stderr, "gpu_ctx_new: home %s, registry %s\n", g->home, tk_ctx_endpoint(g->ctx));
    for (size_t i = 0; rc == TK_OK && pkgs && pkgs[i]; i++) {
        tk_pkg *p = NULL;
        if ((rc = tk_pkg_get(&p, g->ctx, pkgs[i], NULL)) == TK_OK)
            tk_pkg_free(p);
        else
            fprintf(stderr, "gpu_ctx_new: tk_pkg_get %s: %s\n", pkgs[i], tk_last_error());
    }
    return rc;
}

static inline void gpu_ctx_free(gpu_ctx *g)
{
    char cmd[128];
    tk_ctx_free(g->ctx);
    if (g->home[0]) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g->home);
        if (system(cmd) != 0)
            fprintf(stderr, "gpu_ctx_free: could not remove %s\n", g->home);
    }
    memset(g, 0, sizeof *g);
}

/* A context on g's home (same packages, same compiled-binary cache) whose config pins op to one
 * kernel ("ops": {op: "pkg:kernel"}), so dispatch runs that kernel or fails with TK_ERR_UNSUPPORTED
 * when it does not fit the call. NULL on failure. Free with tk_ctx_free. */
static inline tk_ctx *gpu_pinned_ctx(const gpu_ctx *g, const char *op, const char *pkg, const char *kernel)
{
    char path[128];
    snprintf(path, sizeof path, "%s/config.json", g->home);
    FILE *f = fopen(path, "w");
    if (!f)
        return NULL;
    fprintf(f, "{\"ops\": {\"%s\": \"%s:%s\"}}\n", op, pkg, kernel);
    fclose(f);
    tk_ctx_opts o = TK_CTX_OPTS_INIT;
    o.home = g->home;
    o.offline = 1;
    o.log = gpu_log;
    tk_ctx *ctx = NULL;
    if (tk_ctx_new(&ctx, &o) != TK_OK)
        ctx = NULL;
    remove(path);
    return ctx;
}

/* The kernels of installed package pkg for op (NULL: every op), from its manifest, as a json array of
 * the manifest's kernel objects (caller json_decref's). Kernels whose min_cc/max_cc exclude cc are
 * left out when cc > 0. NULL when the package is not installed. */
static inline json_t *gpu_pkg_kernels(tk_ctx *ctx, const char *pkg, const char *op, int cc)
{
    tk_pkg *p = NULL;
    if (tk_pkg_info(&p, ctx, pkg) != TK_OK)
        return NULL;
    json_t *m = json_loads(tk_pkg_manifest(p), 0, NULL), *out = json_array();
    tk_pkg_free(p);
    size_t i;
    json_t *k;
    json_array_foreach(json_object_get(m, "kernels"), i, k) {
        const char *kop = json_string_value(json_object_get(k, "op"));
        json_t *c = json_object_get(k, "constraints");
        json_int_t lo = json_integer_value(json_object_get(c, "min_cc")),
                   hi = json_integer_value(json_object_get(c, "max_cc"));
        if (op && (!kop || strcmp(kop, op) != 0))
            continue;
        if (cc > 0 && ((lo && cc < lo) || (hi && cc > hi)))
            continue;
        json_array_append(out, k);
    }
    json_decref(m);
    return out;
}

static inline void gpu_ctx_free(gpu_ctx *g);

/* The last test of every GPU binary (skips without a device): every kernel of the ops the test
 * declares (gpu_main), in the packages pkgs (NULL-terminated), that fits this device must have run at
 * least once in this process (through dispatch, autotune's winner or an override). A kernel added to
 * a package without a case that reaches it fails here. */
static inline void gpu_coverage_check(const char *const *pkgs)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    tk_device_info di;
    gpu_ctx g;
    int rc = gpu_ctx_new(&g, pkgs);
    CHECK_RC(rc, TK_OK);
    CHECK_RC(tk_device_info_get(&di, 0), TK_OK);
    int cc = di.cc_major * 10 + di.cc_minor, total = 0, missing = 0;
    for (size_t p = 0; rc == TK_OK && pkgs[p]; p++)
        for (size_t o = 0; gpu_ops_covered && gpu_ops_covered[o]; o++) {
            json_t *ks = gpu_pkg_kernels(g.ctx, pkgs[p], gpu_ops_covered[o], cc), *k;
            size_t i;
            json_array_foreach(ks, i, k) {
                char impl[256];
                snprintf(impl, sizeof impl, "%s:%s", pkgs[p], json_string_value(json_object_get(k, "name")));
                total++;
                if (!gpu_was_launched(impl)) {
                    fprintf(stderr, "gpu_coverage: %s fits sm_%d but no case ran it\n", impl, cc);
                    missing++;
                }
            }
            json_decref(ks);
        }
    printf("gpu_coverage: %d of %d kernels ran (sm_%d)\n", total - missing, total, cc);
    CHECK(total > 0);
    CHECK_EQ_INT(missing, 0);
    gpu_ctx_free(&g);
}

#endif /* TK_TEST_GPU_UTIL_H */
