// layernorm.cu — layer normalisation kernels of kernels-community/rmsnorm: layer_norm,
// fused_add_layer_norm (the residual add fused in, in place, as fused_add_rms_norm), and their backward
// passes.
//
// Variants (each a template over T = float, __half, __nv_bfloat16; one manifest entry per op and dtype):
//   tk_layer_norm                     out[r, :] = (x - mean) * rsqrt(var + eps) * weight + bias
//                                     (mean, biased var over the row; bias may be null)
//   tk_fused_add_layer_norm           residual = input + residual (rounded to T, stored), then
//                                     input = layer_norm(residual)
//   tk_layer_norm_backward            xh = (x - mean) * rstd, gw = grad_out * weight:
//                                     grad_input = rstd * (gw - mean(gw) - xh * mean(gw * xh));
//                                     grad_weight = sum over rows of grad_out * xh;
//                                     grad_bias = sum over rows of grad_out (may be null: not computed)
//   tk_fused_add_layer_norm_backward  the same on the forward's updated residual, plus grad_residual
//
// Forward launch: one block per row (grid.x = rows = numel(input) / d < 2^31), blockDim.x a multiple
// of 32 up to 1024, any d >= 1. Every tensor contiguous; layer_norm may run in place (out == input);
// fused_add_layer_norm needs input and residual not to overlap. When the row fits in registers (16
// elements per thread for f16/bf16 with 16-byte loads, else 8: d <= 16384 / 8192 at 1024 threads) each
// thread keeps its elements between the passes (one read of the row); otherwise the row is re-read
// from L1/L2. 16-byte loads and stores when d is a multiple of the vector width (4 for
// f32, 8 for f16/bf16) and every pointer is 16-byte aligned; scalar code otherwise.
// The backward kernels' launch and workspace are described in norm_backward.cuh.
//
// Numerics: elements are loaded as fp32; mean = sum(x) / d, then var = sum((x - mean)^2) / d (two
// passes: no E[x^2] - mean^2 cancellation), both reduced per block with warp shuffles and shared memory;
// rstd = rsqrtf(var + eps); ((x - mean) * rstd) * weight + bias is computed in fp32 with separate
// roundings (no FMA contraction, as tk's CPU reference) and rounded once to T. The fused form adds in
// fp32, rounds the sum to T, stores it, and normalises the rounded sum. (x - mean)^2 overflows fp32 for
// |x - mean| above ~1e19.
//
// NVRTC-compatible: no host code, no standard headers.
#include "norm_backward.cuh"

namespace tk_norm {

// y = ((x - mean) * rstd) * w (+ b), each step rounded (matches ops/norm.c's order).
__device__ __forceinline__ float ln_out(float x, float mean, float rstd, float w, bool has_b, float b)
{
    const float y = __fmul_rn(__fmul_rn(__fsub_rn(x, mean), rstd), w);
    return has_b ? __fadd_rn(y, b) : y;
}

// One row in registers: thread t owns units t + c * blockDim.x (c < C) of U elements, kept in T between
// the passes. With Fused: x = add + x (stored rounded) first; out may be x (plain) or add (fused).
template <typename T, int U, int C, bool Fused>
__device__ __forceinline__ void ln_fwd_reg(T *out, T *x, const T *add, const T *w, const T *b, float eps, tk_i64 d)
{
    typedef Units<T, U> V;
    const tk_i64 row = blockIdx.x, nu = d / U, B = blockDim.x;
    V *xr = reinterpret_cast<V *>(x + row * d);
    const V *ar = reinterpret_cast<const V *>(add + row * d);
    V xs[C];
    float t[1] = {0.0f};
#pragma unroll
    for (int c = 0; c < C; c++) {
        const tk_i64 u = threadIdx.x + c * B;
        if (u < nu) {
            xs[c] = xr[u];
            if (Fused) {
                const V p = ar[u];
#pragma unroll
                for (int k = 0; k < U; k++)
                    xs[c].v[k] = from_f32<T>(to_f32(p.v[k]) + to_f32(xs[c].v[k]));
                xr[u] = xs[c];
            }
#pragma unroll
            for (int k = 0; k < U; k++)
                t[0] += to_f32(xs[c].v[k]);
        }
    }
    block_sum(t);
    const float mean = t[0] / (float)d;
    t[0] = 0.0f;
#pragma unroll
    for (int c = 0; c < C; c++)
        if (threadIdx.x + c * B < nu)
#pragma unroll
            for (int k = 0; k < U; k++) {
                const float dl = to_f32(xs[c].v[k]) - mean;
                t[0] = fmaf(dl, dl, t[0]);
            }
    block_sum(t);
    const float rstd = rsqrtf(t[0] / (float)d + eps);
    V *orow = reinterpret_cast<V *>(out + row * d);
    const bool has_b = b != nullptr;
#pragma unroll
    for (int c = 0; c < C; c++) {
        const tk_i64 u = threadIdx.x + c * B;
        if (u < nu) {
            const V wv = reinterpret_cast<const V *>(w)[u];
            V bv, r;
            if (has_b)
                bv = reinterpret_cast<const V *>(b)[u];
#pragma unroll
            for (int k = 0; k < U; k++)
                r.v[k] = from_f32<T>(ln_out(to_f32(xs[c].v[k]), mean, rstd, to_f32(wv.v[k]), has_b,
                                            has_b ? to_f32(bv.v[k]) : 0.0f));
            orow[u] = r;
        }
    }
}

// One row, any d: three passes, the row re-read (each thread reads back only what it wrote).
template <typename T, int U, bool Fused>
__device__ __forceinline__ void ln_fwd_any(T *out, T *x, const T *add, const T *w, const T *b, float eps, tk_i64 d)
{
    typedef Units<T, U> V;
    const tk_i64 row = blockIdx.x, nu = d / U;
    V *xr = reinterpret_cast<V *>(x + row * d);
    const V *ar = reinterpret_cast<const V *>(add + row * d);
    float t[1] = {0.0f};
    for (tk_i64 u = threadIdx.x; u < nu; u += blockDim.x) {
        V a = xr[u];
        if (Fused) {
            const V p = ar[u];
#pragma unroll
            for (int k = 0; k < U; k++)
                a.v[k] = from_f32<T>(to_f32(p.v[k]) + to_f32(a.v[k]));
            xr[u] = a;
        }
#pragma unroll
        for (int k = 0; k < U; k++)
            t[0] += to_f32(a.v[k]);
    }
    block_sum(t);
    const float mean = t[0] / (float)d;
    t[0] = 0.0f;
    for (tk_i64 u = threadIdx.x; u < nu; u += blockDim.x) {
        const V a = xr[u];
#pragma unroll
        for (int k = 0; k < U; k++) {
            const float dl = to_f32(a.v[k]) - mean;
            t[0] = fmaf(dl, dl, t[0]);
        }
    }
    block_sum(t);
    const float rstd = rsqrtf(t[0] / (float)d + eps);
    V *orow = reinterpret_cast<V *>(out + row * d);
    const bool has_b = b != nullptr;
    for (tk_i64 u = threadIdx.x; u < nu; u += blockDim.x) {
        const V a = xr[u], wv = reinterpret_cast<const V *>(w)[u];
        V bv, r;
        if (has_b)
            bv = reinterpret_cast<const V *>(b)[u];
#pragma unroll
        for (int k = 0; k < U; k++)
            r.v[k] = from_f32<T>(ln_out(to_f32(a.v[k]), mean, rstd, to_f32(wv.v[k]), has_b,
                                        has_b ? to_f32(bv.v[k]) : 0.0f));
        orow[u] = r;
    }
}

template <typename T, bool Fused>
__device__ __forceinline__ void ln_fwd(T *out, T *x, const T *add, const T *w, const T *b, float eps, tk_i64 d)
{
    constexpr int N = Vec<T>::N, C = 2; // 16 (f16/bf16) or 8 (f32) elements per thread in registers
    const bool vec = d % N == 0 && aligned16(out) && aligned16(x) && aligned16(w) && (!b || aligned16(b));
    if (vec) {
        if (d / N <= (tk_i64)C * blockDim.x)
            ln_fwd_reg<T, N, C, Fused>(out, x, add, w, b, eps, d);
        else
            ln_fwd_any<T, N, Fused>(out, x, add, w, b, eps, d);
    } else {
        if (d <= 8 * (tk_i64)blockDim.x)
            ln_fwd_reg<T, 1, 8, Fused>(out, x, add, w, b, eps, d);
        else
            ln_fwd_any<T, 1, Fused>(out, x, add, w, b, eps, d);
    }
}

} // namespace tk_norm

// ---- entry points (name expressions "tk_<op><float>", "<__half>", "<__nv_bfloat16>") -------------

// out may equal input (in place), so neither is __restrict__. bias may be null.
template <typename T>
__global__ void __launch_bounds__(1024) tk_layer_norm(T *out,                       // (..., d) T
                                                      const T *input,               // (..., d) T
                                                      const T *__restrict__ weight, // (d,) T
                                                      const T *__restrict__ bias,   // (d,) T or null
                                                      float eps, tk_i64 d)
{
    tk_norm::ln_fwd<T, false>(out, const_cast<T *>(input), input, weight, bias, eps, d);
}

template <typename T>
__global__ void __launch_bounds__(1024) tk_fused_add_layer_norm(T *input,                     // (..., d) T, in/out
                                                                T *residual,                  // (..., d) T, in/out
                                                                const T *__restrict__ weight, // (d,) T
                                                                const T *__restrict__ bias,   // (d,) T or null
                                                                float eps, tk_i64 d)
{
    tk_norm::ln_fwd<T, true>(input, residual, input, weight, bias, eps, d);
}

// grad_input must not overlap grad_out or input. grad_bias may be null.
template <typename T>
__global__ void __launch_bounds__(1024, 1) tk_layer_norm_backward(T *grad_input,                // (..., d) T
                                                              T *grad_weight,               // (d,) T
                                                              T *grad_bias,                 // (d,) T or null
                                                              const T *grad_out,            // (..., d) T
                                                              const T *input,               // (..., d) T
                                                              const T *__restrict__ weight, // (d,) T
                                                              float eps, tk_i64 d,
                                                              tk_i64 rows,                  // numel(input) / d
                                                              float *ws)                    // see norm_backward.cuh
{
    tk_norm::norm_bwd<T, true, false>(grad_input, grad_weight, grad_bias, grad_out, nullptr, input, weight, eps, d,
                                      rows, ws);
}

// grad_input may be grad_residual (accumulated in place). grad_bias may be null.
template <typename T>
__global__ void __launch_bounds__(1024, 1)
    tk_fused_add_layer_norm_backward(T *grad_input,                // (..., d) T
                                     T *grad_weight,               // (d,) T
                                     T *grad_bias,                 // (d,) T or null
                                     const T *grad_out,            // (..., d) T: of the forward's input
                                     const T *grad_residual,       // (..., d) T: of its updated residual
                                     const T *residual,            // (..., d) T: the updated residual
                                     const T *__restrict__ weight, // (d,) T
                                     float eps, tk_i64 d, tk_i64 rows, float *ws)
{
    tk_norm::norm_bwd<T, true, true>(grad_input, grad_weight, grad_bias, grad_out, grad_residual, residual, weight,
                                     eps, d, rows, ws);
}
