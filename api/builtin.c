/*
 * builtin.c — the built-in GPU implementations (see builtin.h): `linear` and `linear_backward` on
 * cuBLASLt.
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

static int blaslt_type(tk_dtype dt)
{
    return dt.code == TK_DL_BFLOAT ? TK_JIT_BLASLT_BF16 : dt.bits == 16 ? TK_JIT_BLASLT_F16 : TK_JIT_BLASLT_F32;
}

/* A gradient output of dtype `out` for operands of dtype `in`: the same dtype, or f32. */
static int grad_out_ok(tk_dtype out, tk_dtype in, int *y_f32)
{
    *y_f32 = 0;
    if (tk_ops__dtype_bit(out) == tk_ops__dtype_bit(in))
        return 1;
    *y_f32 = out.code == TK_DL_FLOAT && out.bits == 32;
    return *y_f32;
}

/* linear_backward as up to three cuBLASLt products (grad_x, grad_weight, grad_bias; see cublaslt.h's
 * x_km, accumulate, y_f32 and x_ones), on dense operands. */
static int linear_backward_cublaslt(const tk_op_call *c, void *stream)
{
    const tk_tensor *gx = c->t[0], *gw = c->t[1], *gb = c->t[2], *go = c->t[3], *x = c->t[4], *w = c->t[5];
    int tr = c->i[6] != 0, acc = c->i[7] != 0;
    const tk_tensor *all[] = {gx, gw, gb, go, x, w};
    for (size_t i = 0; i < 6; i++)
        if (all[i] && !tk_ops__contiguous(all[i]))
            return tk__err(TK_ERR_UNSUPPORTED, "linear_backward on cuBLASLt: '%s' is not contiguous",
                           c->op->params[i].name);
    int64_t n = go->shape[go->ndim - 1], k = x->shape[x->ndim - 1], m = 1;
    for (int32_t d = 0; d < go->ndim - 1; d++)
        m *= go->shape[d];
    const char *tf32 = getenv("TK_LINEAR_TF32");
    tk_jit_gemm g;
    int rc = TK_OK, yf;
    const tk_tensor *outs[3] = {gx, gw, gb};
    for (int i = 0; i < 3; i++)
        if (outs[i] && !grad_out_ok(outs[i]->dtype, go->dtype, &yf))
            return tk__err(TK_ERR_UNSUPPORTED,
                           "linear_backward on cuBLASLt: '%s' is %s for %s operands; it takes "
                           "their dtype or f32",
                           c->op->params[i].name, tk_ops__dtype_str(outs[i]->dtype), tk_ops__dtype_str(go->dtype));
#define BASE()                                                                                                         \
    do {                                                                                                               \
        memset(&g, 0, sizeof g);                                                                                       \
        g.device = c->device_id;                                                                                       \
        g.stream = stream;                                                                                             \
        g.dtype = blaslt_type(go->dtype);                                                                              \
        g.allow_tf32 = tf32 && strcmp(tf32, "1") == 0;                                                                 \
    } while (0)
    if (gx) { /* grad_x [m, k] (+)= grad_out [m, n] W, W [n, k] (w_kn) or [k, n] */
        BASE();
        g.m = m, g.n = k, g.k = n;
        g.x = tk_ops__base(go);
        g.w = tk_ops__base(w);
        g.w_kn = !tr;
        g.y = tk_ops__base(gx);
        g.accumulate = acc;
        grad_out_ok(gx->dtype, go->dtype, &g.y_f32);
        rc = tk_jit__blaslt_gemm(&g);
    }
    if (rc == TK_OK && gw) { /* [n, k] += grad_out^T x, or [k, n] += x^T grad_out */
        BASE();
        g.m = tr ? k : n, g.n = tr ? n : k, g.k = m;
        g.x = tk_ops__base(tr ? x : go);
        g.x_km = 1;
        g.w = tk_ops__base(tr ? go : x);
        g.w_kn = 1;
        g.y = tk_ops__base(gw);
        g.accumulate = 1;
        grad_out_ok(gw->dtype, go->dtype, &g.y_f32);
        rc = tk_jit__blaslt_gemm(&g);
    }
    if (rc == TK_OK && gb) { /* [n] += ones[m] grad_out */
        BASE();
        g.m = 1, g.n = n, g.k = m;
        g.x_ones = 1;
        g.w = tk_ops__base(go);
        g.w_kn = 1;
        g.y = tk_ops__base(gb);
        g.accumulate = 1;
        grad_out_ok(gb->dtype, go->dtype, &g.y_f32);
        rc = tk_jit__blaslt_gemm(&g);
    }
#undef BASE
    return rc;
}

static const tk_api_builtin builtins[] = {
    {"linear", "cublaslt", TK_VERSION_STRING, TK_OPS_FLOATS, 75, 0, linear_cublaslt},
    {"linear_backward", "cublaslt", TK_VERSION_STRING, TK_OPS_FLOATS, 75, 0, linear_backward_cublaslt},
};

size_t tk_api__builtin_count(void) { return sizeof builtins / sizeof builtins[0]; }

const tk_api_builtin *tk_api__builtin_at(size_t i) { return i < tk_api__builtin_count() ? &builtins[i] : NULL; }
