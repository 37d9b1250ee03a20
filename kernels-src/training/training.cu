// training.cu — the kernels of kernels-community/training: the backward passes of the activations
// and softmaxes, and the optimiser's two ops (AdamW, the squared norm clip_grad_norm_ needs).
//
// Variants (T = float, __half, __nv_bfloat16; one manifest entry per op and dtype):
//   tk_act_backward<T, A>          grad_input = grad_out * A'(input)             (n,) each
//   tk_gated_backward<T, A, first> input (rows, 2d) = [a, b], out = A(a) b (first) or a A(b):
//                                  grad_input = [grad_out b A'(a), grad_out A(a)] (or the mirror)
//   tk_softmax_backward<T, LOG>    y = the forward's out: grad_input = y (g - sum(g y)), or for
//                                  log_softmax g - exp(y) sum(g). One block per row.
//   tk_adamw<P, C>                 torch.optim.AdamW's step on one tensor (P = f32 param, grad and
//                                  moments f32; C the optional param_copy's dtype)
//   tk_sum_squares<T, O>           out[0] = sum of input^2 in double (O = double or float)
//
// Launch assumptions: contiguous tensors, any alignment. Elementwise kernels: a grid-stride loop, any
// grid and block size; grad_input may be grad_out itself for the plain backwards (each element is read
// before it is written by the same thread). softmax: one block per row (grid-strided), any block size
// that is a multiple of 32. sum_squares: ONE block (the manifest launches 1 x 1024): each thread sums a
// fixed strided subset in double, then a fixed tree: deterministic, independent of the launch.
//
// Numerics: fp32 with the accurate CUDA functions (erff, expf, tanhf: these entries are built without
// fast math), the same formulas as tk's CPU references (ops/backward_act.c), which compute in double.
// AdamW is exactly the CPU reference's fp32 sequence (ops/optim.c): __fmul_rn / __fadd_rn / __fsub_rn /
// __fdiv_rn / __fsqrt_rn keep every operation rounded alone, and the scalars are computed in double
// on the device as there; the CPU and GPU steps then agree to the bit (but for pow()'s last ulp).
//
// NVRTC-compatible: no host code, no standard headers, only <tk/device.cuh>.
#include <tk/device.cuh>

namespace tk_train {

using namespace tk;

#define TK_TR_SQRT1_2 0.70710678118654752440f
#define TK_TR_INV_SQRT_2PI 0.39894228040143267794f
#define TK_TR_SQRT_2_PI 0.79788456080286535588f
#define TK_TR_KAPPA 0.044715f
#define TK_TR_GELU_NEW_C 0.79788456f
#define TK_TR_QUICK 1.702f

__device__ __forceinline__ float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }

struct Silu {
    static __device__ __forceinline__ float f(float x) { return x * sigm(x); }
    static __device__ __forceinline__ float d(float x)
    {
        const float s = sigm(x);
        return s * (1.0f + x * (1.0f - s));
    }
};
struct Gelu {
    static __device__ __forceinline__ float f(float x) { return 0.5f * x * (1.0f + erff(x * TK_TR_SQRT1_2)); }
    static __device__ __forceinline__ float d(float x)
    {
        return 0.5f * (1.0f + erff(x * TK_TR_SQRT1_2)) + x * expf(-0.5f * x * x) * TK_TR_INV_SQRT_2PI;
    }
};
template <int NEW> struct GeluTanh {
    static __device__ __forceinline__ float c() { return NEW ? TK_TR_GELU_NEW_C : TK_TR_SQRT_2_PI; }
    static __device__ __forceinline__ float f(float x)
    {
        return 0.5f * x * (1.0f + tanhf(c() * (x + TK_TR_KAPPA * x * x * x)));
    }
    static __device__ __forceinline__ float d(float x)
    {
        const float t = tanhf(c() * (x + TK_TR_KAPPA * x * x * x));
        return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * c() * (1.0f + 3.0f * TK_TR_KAPPA * x * x);
    }
};
struct GeluQuick {
    static __device__ __forceinline__ float f(float x) { return x * sigm(TK_TR_QUICK * x); }
    static __device__ __forceinline__ float d(float x)
    {
        const float s = sigm(TK_TR_QUICK * x);
        return s * (1.0f + TK_TR_QUICK * x * (1.0f - s));
    }
};

} // namespace tk_train

// grad_input[i] = grad_out[i] * A'(input[i]). No __restrict__: grad_input may be grad_out.
template <typename T, typename A>
__global__ void tk_act_backward(T *grad_input,       // (n,) T
                                const T *grad_out,   // (n,) T
                                const T *input,      // (n,) T
                                tk_i64 n)
{
    using namespace tk_train;
    for (tk_i64 i = grid_index(); i < n; i += grid_stride())
        grad_input[i] = from_f32<T>(to_f32(grad_out[i]) * A::d(to_f32(input[i])));
}

// input (rows, 2d) = [a | b]; out (rows, d) = A(a) * b (FIRST) or a * A(b).
template <typename T, typename A, int FIRST>
__global__ void tk_gated_backward(T *__restrict__ grad_input,      // (rows, 2d) T
                                  const T *__restrict__ grad_out,  // (rows, d) T
                                  const T *__restrict__ input,     // (rows, 2d) T
                                  tk_i64 rows, tk_i64 d)
{
    using namespace tk_train;
    for (tk_i64 it = grid_index(); it < rows * d; it += grid_stride()) {
        const tk_i64 r = it / d, c = it - r * d;
        const float a = to_f32(input[r * 2 * d + c]), b = to_f32(input[r * 2 * d + d + c]);
        const float g = to_f32(grad_out[it]);
        float ga, gb;
        if (FIRST) {
            ga = g * b * A::d(a);
            gb = g * A::f(a);
        } else {
            ga = g * A::f(b);
            gb = g * a * A::d(b);
        }
        grad_input[r * 2 * d + c] = from_f32<T>(ga);
        grad_input[r * 2 * d + d + c] = from_f32<T>(gb);
    }
}

// One block per row (grid-strided): s = sum(g * y) (LOG: sum(g)) in fp32, then the row.
template <typename T, int LOG>
__global__ void tk_softmax_backward(T *grad_input,       // (rows, d) T (may be grad_out)
                                    const T *grad_out,   // (rows, d) T
                                    const T *out,        // (rows, d) T the forward's out
                                    tk_i64 rows, tk_i64 d)
{
    using namespace tk_train;
    for (tk_i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T *g = grad_out + r * d, *y = out + r * d;
        float s = 0.0f;
        for (tk_i64 c = threadIdx.x; c < d; c += blockDim.x)
            s += LOG ? to_f32(g[c]) : to_f32(g[c]) * to_f32(y[c]);
        s = block_sum(s);
        T *gi = grad_input + r * d;
        for (tk_i64 c = threadIdx.x; c < d; c += blockDim.x) {
            const float gv = to_f32(g[c]), yv = to_f32(y[c]);
            gi[c] = from_f32<T>(LOG ? gv - expf(yv) * s : yv * (gv - s));
        }
    }
}

// torch.optim.AdamW, single-tensor path, fp32 (see ops/optim.c for the sequence).
template <typename C>
__global__ void tk_adamw(float *param,                   // (n,) f32
                         const float *__restrict__ grad, // (n,) f32
                         float *exp_avg,                 // (n,) f32
                         float *exp_avg_sq,              // (n,) f32
                         C *param_copy,                  // (n,) C or null
                         double lr, double beta1, double beta2, double eps, double weight_decay, tk_i64 step,
                         double grad_scale, tk_i64 n)
{
    using namespace tk_train;
    const double bc1 = 1.0 - pow(beta1, (double)step), bc2 = 1.0 - pow(beta2, (double)step);
    const float decay = (float)(1.0 - lr * weight_decay), omb1 = (float)(1.0 - beta1), b2 = (float)beta2,
                omb2 = (float)(1.0 - beta2), bc2s = (float)sqrt(bc2), feps = (float)eps,
                nstep = (float)(-(lr / bc1)), gs = (float)grad_scale;
    for (tk_i64 i = grid_index(); i < n; i += grid_stride()) {
        const float g = __fmul_rn(grad[i], gs);
        const float p = __fmul_rn(param[i], decay);
        const float m = __fadd_rn(exp_avg[i], __fmul_rn(omb1, __fsub_rn(g, exp_avg[i])));
        const float v = __fadd_rn(__fmul_rn(exp_avg_sq[i], b2), __fmul_rn(__fmul_rn(omb2, g), g));
        const float den = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), bc2s), feps);
        const float np = __fadd_rn(p, __fdiv_rn(__fmul_rn(nstep, m), den));
        param[i] = np;
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
        if (param_copy)
            param_copy[i] = from_f32<C>(np);
    }
}

// out[0] = sum of input^2 in double. ONE block: thread t sums elements t, t + blockDim, ... in order,
// then block_sum's fixed tree.
template <typename T, typename O>
__global__ void tk_sum_squares(O *out,                       // (1,) f64 or f32
                               const T *__restrict__ input,  // (n,) T
                               tk_i64 n)
{
    using namespace tk_train;
    double s = 0.0;
    for (tk_i64 i = threadIdx.x; i < n; i += blockDim.x) {
        const double x = (double)to_f32(input[i]);
        s += x * x;
    }
    s = block_sum(s);
    if (threadIdx.x == 0)
        out[0] = (O)s;
}
