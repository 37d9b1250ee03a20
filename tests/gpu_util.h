/*
 * gpu_util.h — for the GPU tests (tests/test_gpu_*.c, run by `make test-gpu`): device copies of host
 * tensors and the comparison of a kernel's result with the CPU reference. Header-only, static.
 *
 *     if (!gpu_device()) { SKIP("no CUDA device"); }
 *     gpu_ctx g; const char *pkgs[] = {"kernels-community/activation", NULL};
 *     CHECK_RC(gpu_ctx_new(&g, pkgs), TK_OK);                          ... gpu_ctx_free(&g);
 *     dev_tensor dx; CHECK_RC(dev_upload(&dx, &host_x), TK_OK);        dx.t is a CUDA tk_tensor
 *     ... tk_op_run(ctx, "op", args with &dx.t ..., NULL, &impl) ...; tk_device_sync(0);
 *     CHECK_RC(dev_download(&dx, &host_got), TK_OK);
 *     cmp_t c = compare_tensors(&host_got, &host_ref);
 *     CHECK(cmp_ok(&c, tol_rel(dt), tol_abs(dt)));  cmp_print("op bf16 [4, 4096]", &c) on failure
 *
 * Everything runs on device 0. Host tensors must be contiguous (the tests make them so).
 */
#ifndef TK_TEST_GPU_UTIL_H
#define TK_TEST_GPU_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"
#include "tk.h"

/* 1 when a CUDA device is usable; the tests SKIP otherwise. TK_TEST_GPU=0 forces a skip. */
static inline int gpu_device(void)
{
    const char *e = getenv("TK_TEST_GPU");
    int n = 0;
    if (e && strcmp(e, "0") == 0)
        return 0;
    return tk_device_count(&n) == TK_OK && n > 0;
}

typedef struct {
    tk_tensor t; /* the device tensor: shape and dtype of the host one, contiguous, on cuda:0 */
    int64_t shape[TK_OPS_MAX_RANK];
    void *ptr;
    size_t bytes;
} dev_tensor;

static inline size_t host_bytes(const tk_tensor *h)
{
    return (size_t)tk_ops__numel(h) * (h->dtype.bits / 8);
}

/* Allocates a device tensor shaped like h and copies h's bytes into it. */
static inline int dev_upload(dev_tensor *d, const tk_tensor *h)
{
    memset(d, 0, sizeof *d);
    if (!tk_ops__contiguous(h) || h->ndim > TK_OPS_MAX_RANK)
        return TK_ERR_INVALID;
    d->bytes = host_bytes(h);
    int rc = tk_device_alloc(&d->ptr, 0, d->bytes ? d->bytes : 1);
    if (rc != TK_OK)
        return rc;
    if (d->bytes && (rc = tk_device_copy(d->ptr, tk_ops__base(h), d->bytes, TK_COPY_H2D, 0)) != TK_OK)
        return rc;
    memcpy(d->shape, h->shape, (size_t)h->ndim * sizeof *d->shape);
    d->t = *h;
    d->t.data = d->ptr;
    d->t.byte_offset = 0;
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
    return d->bytes ? tk_device_copy(tk_ops__base(h), d->ptr, d->bytes, TK_COPY_D2H, 0) : TK_OK;
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
    o.endpoint = NULL; /* the default registry: build/registry */
    o.offline = 0;
    int rc = tk_ctx_new(&g->ctx, &o);
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

/* ---- comparison ------------------------------------------------------------------------------- */

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
 * with room for a different summation order. */
static inline double tol_rel(tk_dtype dt)
{
    if (dt.code == TK_DL_BFLOAT)
        return 1e-2;
    if (dt.code == TK_DL_FLOAT && dt.bits == 16)
        return 2e-3;
    if (dt.bits == 8)
        return 6e-2;
    return 1e-5;
}

static inline int cmp_ok(const cmp_t *c, double rel_tol, double worst_tol)
{
    return c->bad_nan == 0 && c->rel <= rel_tol && c->worst <= worst_tol;
}

static inline void cmp_print(const char *what, const cmp_t *c)
{
    fprintf(stderr, "%s: rel %.3g, worst |d| %.3g at %lld (got %.9g, ref %.9g), NaN/inf mismatches %lld of %lld\n",
            what, c->rel, c->worst, (long long)c->worst_i, c->worst_got, c->worst_ref, (long long)c->bad_nan,
            (long long)c->n);
}

#endif /* TK_TEST_GPU_UTIL_H */
