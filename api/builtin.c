/*
 * builtin.c — the built-in GPU implementations (see builtin.h): `linear` on cuBLASLt.
 *
 * linear maps onto one cuBLASLt product (jit/cublaslt.h): x [..., K] is a dense [M, K] matrix with M
 * the product of its leading dimensions, weight [N, K] (or [K, N] with transposed=1) is passed as
 * stored and transposed by the product's op flags, the bias goes through the epilogue, and out
 * [..., N] is a dense [M, N]. f32, f16 and bf16 accumulate in fp32 (CUBLAS_COMPUTE_32F). For f32
 * operands TF32 products are used only when TK_LINEAR_TF32=1 is set in the environment: the default
 * is plain fp32, the precision of the CPU reference.
 */
#include <stdlib.h>
#include <string.h>

#include "api/builtin.h"
#include "jit/cublaslt.h"

static int linear_cublaslt(const tk_op_call *c, void *stream)
{
    const tk_tensor *out = c->t[0], *x = c->t[1], *w = c->t[2], *b = c->t[3];
    int tr = c->i[4] != 0;
    tk_jit_gemm g;
    memset(&g, 0, sizeof g);
    g.device = c->device_id;
    g.stream = stream;
    g.dtype = x->dtype.code == TK_DL_BFLOAT ? TK_JIT_BLASLT_BF16
              : x->dtype.bits == 16         ? TK_JIT_BLASLT_F16
                                            : TK_JIT_BLASLT_F32;
    g.n = w->shape[tr ? 1 : 0];
    g.k = w->shape[tr ? 0 : 1];
    g.m = 1;
    for (int32_t d = 0; d < x->ndim - 1; d++)
        g.m *= x->shape[d];
    g.x = tk_ops__base(x);
    g.w = tk_ops__base(w);
    g.w_kn = tr;
    g.bias = b ? tk_ops__base(b) : NULL;
    g.y = tk_ops__base(out);
    const char *tf32 = getenv("TK_LINEAR_TF32");
    g.allow_tf32 = tf32 && strcmp(tf32, "1") == 0;
    return tk_jit__blaslt_gemm(&g);
}

static const tk_api_builtin builtins[] = {
    {"linear", "cublaslt", TK_VERSION_STRING, TK_OPS_FLOATS, 75, 0, linear_cublaslt},
};

size_t tk_api__builtin_count(void) { return sizeof builtins / sizeof builtins[0]; }

const tk_api_builtin *tk_api__builtin_at(size_t i)
{
    return i < tk_api__builtin_count() ? &builtins[i] : NULL;
}
