/*
 * silu_and_mul.c — a host program that uses tk the way an application would: get
 * kernels-community/activation, run silu_and_mul_f32 on the GPU through the declarative call, and
 * check it against a CPU reference in double precision.
 *
 * Only tk.h and libtk are used for tk; device memory comes from the CUDA driver, loaded with dlopen
 * (a real application would use its framework's tensors: tk_tensor is DLPack's DLTensor). Without a
 * GPU it prints why and exits 0 with a skip message.
 *
 *     build/examples/silu_and_mul [ROWS D]
 */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "tk.h"

typedef int (*cu_fn)();

static double silu(double x) { return x / (1.0 + exp(-x)); }

int main(int argc, char **argv)
{
    int64_t rows = argc > 2 ? atoll(argv[1]) : 64, d = argc > 2 ? atoll(argv[2]) : 1000;
    int ndev = 0, rc, status = 1;
    tk_ctx *ctx = NULL;
    tk_kernel *k = NULL;
    const tk_function *fn = NULL;
    float *in = NULL, *out = NULL;
    uint64_t din = 0, dout = 0;
    void *h = NULL, *cuctx = NULL;
    cu_fn retain, setcur, memalloc, memfree = NULL, htod, dtoh, sync;
    int cudev = 0;

    if (rows < 1 || d < 1) {
        fprintf(stderr, "usage: silu_and_mul [ROWS D]\n");
        return 2;
    }
    rc = tk_device_count(&ndev);
    if (rc != TK_OK || ndev == 0) {
        printf("skip: silu_and_mul needs a CUDA GPU: %s\n", rc != TK_OK ? tk_last_error() : "no device found");
        return 0;
    }
    if (tk_ctx_new(&ctx, NULL) != TK_OK) {
        fprintf(stderr, "tk: %s\n", tk_last_error());
        return 1;
    }
    rc = tk_get_kernel(&k, ctx, "kernels-community/activation", NULL);
    if (rc != TK_OK) {
        fprintf(stderr, "tk_get_kernel: %s (%s)\n", tk_last_error(), tk_status_str(rc));
        goto done;
    }
    if (tk_kernel_function(&fn, k, "silu_and_mul_f32") != TK_OK) {
        fprintf(stderr, "%s\n", tk_last_error());
        goto done;
    }

    h = dlopen("libcuda.so.1", RTLD_NOW);
    retain = (cu_fn)dlsym(h, "cuDevicePrimaryCtxRetain");
    setcur = (cu_fn)dlsym(h, "cuCtxSetCurrent");
    memalloc = (cu_fn)dlsym(h, "cuMemAlloc_v2");
    memfree = (cu_fn)dlsym(h, "cuMemFree_v2");
    htod = (cu_fn)dlsym(h, "cuMemcpyHtoD_v2");
    dtoh = (cu_fn)dlsym(h, "cuMemcpyDtoH_v2");
    sync = (cu_fn)dlsym(h, "cuCtxSynchronize");
    if (!retain || retain(&cuctx, cudev) != 0 || setcur(cuctx) != 0) {
        fprintf(stderr, "cannot make the primary CUDA context current\n");
        goto done;
    }
    in = malloc((size_t)(rows * 2 * d) * sizeof *in);
    out = malloc((size_t)(rows * d) * sizeof *out);
    if (!in || !out)
        goto done;
    srand(1);
    for (int64_t i = 0; i < rows * 2 * d; i++)
        in[i] = (float)rand() / (float)RAND_MAX * 8.0f - 4.0f;
    if (memalloc(&din, (size_t)(rows * 2 * d) * sizeof *in) != 0 ||
        memalloc(&dout, (size_t)(rows * d) * sizeof *out) != 0 ||
        htod(din, in, (size_t)(rows * 2 * d) * sizeof *in) != 0) {
        fprintf(stderr, "device allocation or copy failed\n");
        goto done;
    }
    {
        int64_t in_shape[2] = {rows, 2 * d}, out_shape[2] = {rows, d};
        tk_tensor tin = {(void *)(uintptr_t)din, {TK_DEV_CUDA, 0}, 2, {TK_DL_FLOAT, 32, 1}, in_shape, NULL, 0};
        tk_tensor tout = {(void *)(uintptr_t)dout, {TK_DEV_CUDA, 0}, 2, {TK_DL_FLOAT, 32, 1}, out_shape, NULL, 0};
        tk_arg args[2] = {{TK_ARG_TENSOR, "out", &tout, 0, 0}, {TK_ARG_TENSOR, "input", &tin, 0, 0}};
        rc = tk_function_call(fn, args, 2, NULL);
        if (rc != TK_OK) {
            fprintf(stderr, "tk_function_call: %s\n", tk_last_error());
            goto done;
        }
    }
    if (sync() != 0 || dtoh(out, dout, (size_t)(rows * d) * sizeof *out) != 0) {
        fprintf(stderr, "the kernel failed on the GPU\n");
        goto done;
    }
    {
        double worst = 0;
        int64_t wi = 0;
        int bad = 0;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < d; j++) {
                double ref = silu(in[r * 2 * d + j]) * in[r * 2 * d + d + j];
                double got = out[r * d + j], err = fabs(got - ref);
                if (err > 1e-5 + 1e-5 * fabs(ref))
                    bad++;
                if (err > worst) {
                    worst = err;
                    wi = r * d + j;
                }
            }
        printf("silu_and_mul_f32 (%lld x %lld): max |err| %.3g at %lld; %s\n", (long long)rows,
               (long long)d, worst, (long long)wi, bad ? "MISMATCH" : "ok");
        status = bad ? 1 : 0;
    }
done:
    if (din && memfree)
        memfree(din);
    if (dout && memfree)
        memfree(dout);
    free(in);
    free(out);
    tk_kernel_free(k);
    tk_ctx_free(ctx);
    return status;
}
