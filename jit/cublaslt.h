/*
 * cublaslt.h — matrix products on the GPU through cuBLASLt, loaded at run time with dlopen (never
 * linked, as libcuda and NVRTC are), so libtk builds and runs where the CUDA toolkit is absent.
 *
 * One call is one row-major product with an optional bias, the shape of the `linear` op:
 *
 *     y[m, n] = sum_k x[m, k] * w[n, k] + bias[n]     (w_kn = 0: w is [n, k], nn.Linear)
 *     y[m, n] = sum_k x[m, k] * w[k, n] + bias[n]     (w_kn = 1: w is [k, n], GPT-2's Conv1D)
 *
 * x, w, bias and y share one dtype (f32, f16 or bf16; y f32 with y_f32); the product accumulates in fp32
 * (CUBLAS_COMPUTE_32F; TF32 only when allow_tf32 is set) and the bias is added in the epilogue
 * before the one rounding to the output dtype. A split-K algorithm is used only when it adds its
 * parts in fp32 (never in a 16-bit y's type; cublaslt.c). Internal names are tk_jit__blaslt_*.
 */
#ifndef TK_JIT_CUBLASLT_H
#define TK_JIT_CUBLASLT_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

enum { TK_JIT_BLASLT_F32 = 0, TK_JIT_BLASLT_F16 = 1, TK_JIT_BLASLT_BF16 = 2 };

typedef struct {
    int device;          /* CUDA ordinal: the pointers are on it */
    void *stream;        /* CUstream (NULL: the legacy default stream) */
    int dtype;           /* TK_JIT_BLASLT_* of every operand */
    int64_t m, n, k;
    const void *x;       /* [m, k] row-major, dense */
    const void *w;       /* [n, k] row-major (w_kn = 0) or [k, n] (w_kn = 1), dense */
    int w_kn;
    const void *bias;    /* [n], or NULL */
    void *y;             /* [m, n] row-major, dense; must not overlap the inputs */
    int allow_tf32;      /* f32 only: CUBLAS_COMPUTE_32F_FAST_TF32 (10-bit mantissa products) */
    /* The backward's products (api/builtin.c, linear_backward); zero keeps the forward's product: */
    int x_km;            /* 1: x is stored [k, m] (x^T row-major): grad_weight = grad_out^T x */
    int accumulate;      /* 1: y += the product (beta = 1); no bias then */
    int y_f32;           /* 1: y is f32 whatever dtype (f32 gradients of bf16/f16 operands) */
    int x_ones;          /* 1: x is a row of k ones (m must be 1; x is ignored): y = the column sums of w,
                            w_kn = 1 (the bias gradient) */
} tk_jit_gemm;

/* Loads cuBLASLt once per process: $TK_CUBLASLT, then libcublasLt.so.13 / .so.12 / .so from the
 * loader's path, $CUDA_HOME, $CUDA_PATH and /usr/local/cuda. TK_ERR_UNSUPPORTED with a hint when
 * it cannot be found; the result is remembered. Thread-safe. */
int tk_jit__blaslt_load(void);
/* The loaded library's version (cublasLtGetVersion: 130000 for 13.0.0) and path; loads it. */
int tk_jit__blaslt_version(size_t *version, const char **path);

/* Enqueues the product on g->stream (asynchronous, like a kernel launch). Errors: TK_ERR_UNSUPPORTED
 * (no cuBLASLt, or no algorithm for this shape, dtype and alignment), TK_ERR_NOMEM (workspace),
 * TK_ERR_NO_DEVICE, TK_ERR_LAUNCH (any other cuBLASLt or driver failure, with its status name). */
int tk_jit__blaslt_gemm(const tk_jit_gemm *g);

/* The algorithm tk_jit__blaslt_gemm uses for g (the one it cached, or the heuristic's pick, cached
 * then), as cuBLASLt describes it: for tests and diagnostics (a split-K product must reduce its parts
 * in fp32 when y is 16-bit). */
typedef struct {
    int algo_id;        /* CUBLASLT_ALGO_CONFIG_ID */
    int tile_id;        /* CUBLASLT_ALGO_CONFIG_TILE_ID (cublasLtMatmulTile_t) */
    int splitk;         /* CUBLASLT_ALGO_CONFIG_SPLITK_NUM: 1 = no split */
    int reduction;      /* CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME: 0 none, 1 in place (output type),
                           2 compute type (fp32 here), 4 output type */
    size_t workspace;   /* bytes */
} tk_jit_blaslt_algo;

/* Fills *info for g (whose pointers only lend their alignments; nothing is launched). Errors:
 * TK_ERR_INVALID (no product: m, n or k is 0, or bad arguments), TK_ERR_UNSUPPORTED (no cuBLASLt, no
 * algorithm, or a cuBLASLt without cublasLtMatmulAlgoConfigGetAttribute), TK_ERR_NO_DEVICE,
 * TK_ERR_LAUNCH. Thread-safe. */
int tk_jit__blaslt_algo_info(const tk_jit_gemm *g, tk_jit_blaslt_algo *info);

#endif /* TK_JIT_CUBLASLT_H */
