/*
 * silu_and_mul.c — a host program that uses tk the way an application would: get
 * kernels-community/activation, run silu_and_mul_f32 on the GPU through the declarative call, and
 * check it against a CPU reference in double precision.
 *
 * Only tk.h and libtk are used: device memory comes from tk_device_alloc (a real application would
 * pass its framework's tensors instead: tk_tensor is DLPack's DLTensor). Without a GPU it prints why
 * and exits 0 with a skip message.
 *
 *     build/examples/silu_and_mul [ROWS D]
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "tk.h"

static double silu(double x) { return x / (1.0 + exp(-x)); }

int main(int argc, char **argv)
{
    int64_t rows = argc > 2 ? atoll(argv[1]) : 64, d = argc > 2 ? atoll(argv[2]) : 1000;
    int ndev = 0, rc, status = 1;
    tk_ctx *ctx = NULL;
    tk_kernel *k = NULL;
    const tk_function *fn = NULL;
    float *in = NULL, *out = NULL;
    void *din = NULL, *dout = NULL;

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

    in = malloc((size_t)(rows * 2 * d) * sizeof *in);
    out = malloc((size_t)(rows * d) * sizeof *out);
    if (!in || !out)
        goto done;
    srand(1);
    for (int64_t i = 0; i < rows * 2 * d; i++)
        in[i] = (float)rand() / (float)RAND_MAX * 8.0f - 4.0f;
    if (tk_device_alloc(&din, 0, (size_t)(rows * 2 * d) * sizeof *in) != TK_OK ||
        tk_device_alloc(&dout, 0, (size_t)(rows * d) * sizeof *out) != TK_OK ||
        tk_device_copy(din, in, (size_t)(rows * 2 * d) * sizeof *in, TK_COPY_H2D, 0) != TK_OK) {
        fprintf(stderr, "device memory: %s\n", tk_last_error());
        goto done;
    }
    {
        int64_t in_shape[2] = {rows, 2 * d}, out_shape[2] = {rows, d};
        tk_tensor tin = {din, {TK_DEV_CUDA, 0}, 2, {TK_DL_FLOAT, 32, 1}, in_shape, NULL, 0};
        tk_tensor tout = {dout, {TK_DEV_CUDA, 0}, 2, {TK_DL_FLOAT, 32, 1}, out_shape, NULL, 0};
        tk_arg args[2] = {{TK_ARG_TENSOR, "out", &tout, 0, 0}, {TK_ARG_TENSOR, "input", &tin, 0, 0}};
        rc = tk_function_call(fn, args, 2, NULL);
        if (rc != TK_OK) {
            fprintf(stderr, "tk_function_call: %s\n", tk_last_error());
            goto done;
        }
    }
    /* the sync reports a fault of the kernel; the copy brings the result back */
    if (tk_device_sync(0) != TK_OK ||
        tk_device_copy(out, dout, (size_t)(rows * d) * sizeof *out, TK_COPY_D2H, 0) != TK_OK) {
        fprintf(stderr, "the kernel failed on the GPU: %s\n", tk_last_error());
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
        printf("silu_and_mul_f32 (%lld x %lld): max |err| %.3g at %lld; %s\n", (long long)rows, (long long)d, worst,
               (long long)wi, bad ? "MISMATCH" : "ok");
        status = bad ? 1 : 0;
    }
done:
    tk_device_free(din, 0);
    tk_device_free(dout, 0);
    free(in);
    free(out);
    tk_kernel_free(k);
    tk_ctx_free(ctx);
    return status;
}
