// rmsnorm.cu — RMS normalisation kernels of kernels-community/rmsnorm: vLLM's rms_norm and
// fused_add_rms_norm, and their backward passes.
//
// Variants (each a template over T = float, __half, __nv_bfloat16; one manifest entry per op and dtype;
// the two forwards also with an f32 weight over 16-bit T, W = float, for Gemma's (1 + w) norms):
//   tk_rms_norm                     out[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * weight
//   tk_fused_add_rms_norm           residual[r, :] = input[r, :] + residual[r, :]   (rounded to T, stored),
//                                   then input[r, :] = rms_norm(residual[r, :]) * weight
//   tk_rms_norm_backward            grad_input = rstd * (gw - xh * mean(gw * xh)), xh = x * rstd,
//                                   gw = grad_out * weight; grad_weight = sum over rows of grad_out * xh
//   tk_fused_add_rms_norm_backward  the same on the forward's updated residual, plus grad_residual
//   tk_rms_norm_sumsq               sumsq[r] = sum(x[r, :]^2) (f32): a row's part of rms_norm's sum
//   tk_rms_norm_by_sumsq            out[r, :] = x[r, :] * rsqrt(sumsq[r] / width + eps) * weight: rms_norm
//                                   of d columns of a row of width columns, its sum of squares given
//                                   (the two halves of a norm whose row is split over ranks)
//
// Launch assumptions (forward):
//   - every tensor is contiguous and row-major; weight is (d,); rms_norm may run in place (out == input),
//     fused_add_rms_norm needs input and residual not to overlap;
//   - one block per row (grid.x = rows = numel(input) / d, rows < 2^31), any block size that is a
//     multiple of 32 up to 1024; d >= 1, any value; sumsq is (rows,) f32, width 0 meaning d;
//   - 16-byte vector loads and stores when d is a multiple of the vector width (4 for f32, 8 for
//     f16/bf16) and every pointer is 16-byte aligned; scalar code otherwise.
// The backward kernels' launch and workspace are described in norm_backward.cuh.
//
// Numerics: elements are loaded as fp32; each thread sums its squares in fp32, the block reduces them
// with warp shuffles and shared memory, scale = rsqrtf(sum / d + eps) (by_sumsq: the given sum over
// width), and x * scale * weight is computed in fp32 and rounded once to T (round to nearest even).
// fused_add_rms_norm adds in fp32, rounds the sum to T, stores it, and normalises the rounded sum (as
// vLLM's vectorised kernel does). vLLM rounds x * scale to T before multiplying by weight; these kernels
// round once, so f16/bf16 results can differ from vLLM's by one unit in the last place. The fp32 sum of
// squares overflows for |x| above ~1e19 (rms_norm_sumsq stores it: the same range).
//
// NVRTC-compatible: no host code, no standard headers.
#include "norm_backward.cuh"

namespace tk_norm {

template <typename A, typename B> struct same_type {
    static constexpr bool value = false;
};
template <typename A> struct same_type<A, A> {
    static constexpr bool value = true;
};

// The N weights of pack i as fp32: one 16-byte pack when W is T, else N scalar loads (f32 weights).
template <typename T, typename W, int N>
__device__ __forceinline__ void weights_f32(float (&f)[N], const W *__restrict__ weight, tk_i64 i)
{
    if constexpr (same_type<T, W>::value) {
        Pack<T> w = reinterpret_cast<const Pack<T> *>(weight)[i];
#pragma unroll
        for (int k = 0; k < N; k++)
            f[k] = to_f32(w.v[k]);
    } else {
#pragma unroll
        for (int k = 0; k < N; k++)
            f[k] = to_f32(weight[i * N + k]);
    }
}

// o[i] = x[i] * scale * weight[i] for the row's d elements (fp32, rounded once to T); vec: 16-byte packs
// (d % N == 0, o, x and a T weight 16-byte aligned).
template <typename T, typename W>
__device__ __forceinline__ void scale_row(T *o,                         // (d,) T: the row's output
                                          const T *xr,                  // (d,) T: the row
                                          const W *__restrict__ weight, // (d,) W: T, or f32
                                          float scale, tk_i64 d, bool vec)
{
    constexpr int N = Vec<T>::N;
    if (vec) {
        const Pack<T> *xv = reinterpret_cast<const Pack<T> *>(xr);
        Pack<T> *ov = reinterpret_cast<Pack<T> *>(o);
        for (tk_i64 i = threadIdx.x; i < d / N; i += blockDim.x) {
            Pack<T> a = xv[i], r;
            float w[N];
            weights_f32<T, W, N>(w, weight, i);
#pragma unroll
            for (int k = 0; k < N; k++)
                r.v[k] = from_f32<T>(__fmul_rn(__fmul_rn(to_f32(a.v[k]), scale), w[k]));
            ov[i] = r;
        }
    } else {
        for (tk_i64 i = threadIdx.x; i < d; i += blockDim.x)
            o[i] = from_f32<T>(__fmul_rn(__fmul_rn(to_f32(xr[i]), scale), to_f32(weight[i])));
    }
}

// One row. With Fused: res = x + res (stored rounded), then x = norm(res); else out = norm(x).
template <typename T, typename W, bool Fused>
__device__ __forceinline__ void rms_row(T *out,                        // (rows, d) T; fused: input
                                        T *x,                          // (rows, d) T; fused: residual
                                        const T *add,                  // fused: input (== out), else unused
                                        const W *__restrict__ weight,  // (d,) W: T, or f32
                                        float eps, tk_i64 d)
{
    const tk_i64 row = blockIdx.x;
    T *o = out + row * d;
    T *xr = x + row * d;
    const T *ar = add + row * d;
    constexpr int N = Vec<T>::N;
    // f32 weights are read a scalar at a time: their alignment does not matter
    const bool vec = d % N == 0 && aligned16(out) && aligned16(x) && (!same_type<T, W>::value || aligned16(weight));
    float ss = 0.0f;

    if (vec) {
        Pack<T> *xv = reinterpret_cast<Pack<T> *>(xr);
        const Pack<T> *av = reinterpret_cast<const Pack<T> *>(ar);
        for (tk_i64 i = threadIdx.x; i < d / N; i += blockDim.x) {
            Pack<T> a = xv[i];
            if (Fused) {
                Pack<T> b = av[i];
#pragma unroll
                for (int k = 0; k < N; k++)
                    a.v[k] = from_f32<T>(to_f32(b.v[k]) + to_f32(a.v[k]));
                xv[i] = a;
            }
#pragma unroll
            for (int k = 0; k < N; k++) {
                float f = to_f32(a.v[k]);
                ss = fmaf(f, f, ss);
            }
        }
    } else {
        for (tk_i64 i = threadIdx.x; i < d; i += blockDim.x) {
            T a = xr[i];
            if (Fused) {
                a = from_f32<T>(to_f32(ar[i]) + to_f32(a));
                xr[i] = a;
            }
            float f = to_f32(a);
            ss = fmaf(f, f, ss);
        }
    }

    float t[1] = {ss};
    block_sum(t);
    // Each thread reads back only the elements it wrote above (scale_row's index mapping is the same).
    scale_row<T, W>(o, xr, weight, rsqrtf(t[0] / (float)d + eps), d, vec);
}

// A row's sum of squares in fp32 (16-byte packs when vec, else scalars; block_sum): every thread gets it.
template <typename T> __device__ __forceinline__ float sumsq_row(const T *xr, tk_i64 d, bool vec)
{
    constexpr int N = Vec<T>::N;
    float ss = 0.0f;
    if (vec) {
        const Pack<T> *xv = reinterpret_cast<const Pack<T> *>(xr);
        for (tk_i64 i = threadIdx.x; i < d / N; i += blockDim.x) {
            Pack<T> a = xv[i];
#pragma unroll
            for (int k = 0; k < N; k++) {
                float f = to_f32(a.v[k]);
                ss = fmaf(f, f, ss);
            }
        }
    } else {
        for (tk_i64 i = threadIdx.x; i < d; i += blockDim.x) {
            float f = to_f32(xr[i]);
            ss = fmaf(f, f, ss);
        }
    }
    float t[1] = {ss};
    block_sum(t);
    return t[0];
}

} // namespace tk_norm

// ---- entry points (name expressions "tk_<op><float>", "<__half>", "<__nv_bfloat16>"; the forwards'
// f32-weight variants "<__half, float>", "<__nv_bfloat16, float>") ---------------------------------

// out may equal input (in place), so neither is __restrict__.
template <typename T, typename W = T>
__global__ void __launch_bounds__(1024) tk_rms_norm(T *out,                       // (..., d) T
                                                    const T *input,               // (..., d) T
                                                    const W *__restrict__ weight, // (d,) W
                                                    float eps, tk_i64 d)
{
    tk_norm::rms_row<T, W, false>(out, const_cast<T *>(input), input, weight, eps, d);
}

template <typename T, typename W = T>
__global__ void __launch_bounds__(1024) tk_fused_add_rms_norm(T *input,                     // (..., d) T, in/out
                                                              T *residual,                  // (..., d) T, in/out
                                                              const W *__restrict__ weight, // (d,) W
                                                              float eps, tk_i64 d)
{
    tk_norm::rms_row<T, W, true>(input, residual, input, weight, eps, d);
}

template <typename T>
__global__ void __launch_bounds__(1024) tk_rms_norm_sumsq(float *__restrict__ out,   // (...,) f32
                                                          const T *__restrict__ input, // (..., d) T
                                                          tk_i64 d)
{
    const T *xr = input + (tk_i64)blockIdx.x * d;
    const float ss = tk_norm::sumsq_row<T>(xr, d, d % tk::Vec<T>::N == 0 && tk::aligned16(input));
    if (threadIdx.x == 0)
        out[blockIdx.x] = ss;
}

// out may equal input (in place), so neither is __restrict__.
template <typename T, typename W = T>
__global__ void __launch_bounds__(1024) tk_rms_norm_by_sumsq(T *out,                        // (..., d) T
                                                             const T *input,                // (..., d) T
                                                             const W *__restrict__ weight,  // (d,) W
                                                             const float *__restrict__ sumsq, // (...,) f32
                                                             float eps, tk_i64 d,
                                                             tk_i64 width)                  // 0: d
{
    const tk_i64 row = blockIdx.x;
    constexpr int N = tk::Vec<T>::N;
    const bool vec = d % N == 0 && tk::aligned16(out) && tk::aligned16(input) &&
                     (!tk_norm::same_type<T, W>::value || tk::aligned16(weight));
    const float scale = rsqrtf(sumsq[row] / (float)(width > 0 ? width : d) + eps);
    tk_norm::scale_row<T, W>(out + row * d, input + row * d, weight, scale, d, vec);
}

// grad_input must not overlap grad_out or input.
template <typename T>
__global__ void __launch_bounds__(1024, 1) tk_rms_norm_backward(T *grad_input,                 // (..., d) T
                                                            T *grad_weight,                // (d,) T
                                                            const T *grad_out,             // (..., d) T
                                                            const T *input,                // (..., d) T
                                                            const T *__restrict__ weight,  // (d,) T
                                                            float eps, tk_i64 d,
                                                            tk_i64 rows,                   // numel(input) / d
                                                            float *ws)                     // see norm_backward.cuh
{
    tk_norm::norm_bwd<T, false, false>(grad_input, grad_weight, nullptr, grad_out, nullptr, input, weight, eps, d,
                                       rows, ws);
}

// grad_input may be grad_residual (accumulated in place).
template <typename T>
__global__ void __launch_bounds__(1024, 1)
    tk_fused_add_rms_norm_backward(T *grad_input,                // (..., d) T
                                   T *grad_weight,               // (d,) T
                                   const T *grad_out,            // (..., d) T: of the forward's input
                                   const T *grad_residual,       // (..., d) T: of its updated residual
                                   const T *residual,            // (..., d) T: the updated residual
                                   const T *__restrict__ weight, // (d,) T
                                   float eps, tk_i64 d, tk_i64 rows, float *ws)
{
    tk_norm::norm_bwd<T, false, true>(grad_input, grad_weight, nullptr, grad_out, grad_residual, residual, weight,
                                      eps, d, rows, ws);
}
