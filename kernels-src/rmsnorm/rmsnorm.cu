// rmsnorm.cu — RMS normalisation kernels of kernels-community/rmsnorm (vLLM's rms_norm and
// fused_add_rms_norm ops).
//
// Variants (each a template over T = float, __half, __nv_bfloat16; one manifest entry per op and dtype):
//   tk_rms_norm            out[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * weight
//   tk_fused_add_rms_norm  residual[r, :] = input[r, :] + residual[r, :]   (rounded to T, stored), then
//                          input[r, :] = rms_norm(residual[r, :]) * weight
//
// Launch assumptions:
//   - every tensor is contiguous and row-major; weight is (d,); rms_norm may run in place (out == input),
//     fused_add_rms_norm needs input and residual not to overlap;
//   - one block per row (grid.x = rows = numel(input) / d, rows < 2^31), any block size that is a
//     multiple of 32 up to 1024; d >= 1, any value;
//   - 16-byte vector loads and stores when d is a multiple of the vector width (4 for f32, 8 for
//     f16/bf16) and every pointer is 16-byte aligned; scalar code otherwise.
//
// Numerics: elements are loaded as fp32; each thread sums its squares in fp32, the block reduces them
// with warp shuffles and shared memory, scale = rsqrtf(sum / d + eps), and x * scale * weight is computed
// in fp32 and rounded once to T (round to nearest even). fused_add_rms_norm adds in fp32, rounds the sum
// to T, stores it, and normalises the rounded sum (as vLLM's vectorised kernel does). vLLM rounds
// x * scale to T before multiplying by weight; these kernels round once, so f16/bf16 results can differ
// from vLLM's by one unit in the last place. The fp32 sum of squares overflows for |x| above ~1e19.
//
// NVRTC-compatible: no host code, no standard headers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

typedef long long tk_i64; // manifest type i64
typedef unsigned long long tk_u64;

namespace tk_rms {

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x)
{
    return __float2bfloat16_rn(x);
}

// N elements of T in 16 bytes: 4 for f32, 8 for f16 and bf16.
template <typename T> struct Vec {
    static constexpr int N = 16 / (int)sizeof(T);
};
template <typename T> struct __align__(16) Pack {
    T v[Vec<T>::N];
};

__device__ __forceinline__ bool aligned16(const void *p) { return (reinterpret_cast<tk_u64>(p) & 15ull) == 0; }

// The sum of v over the block, returned to every thread. blockDim.x is a multiple of 32, <= 1024.
__device__ __forceinline__ float block_sum(float v)
{
    __shared__ float warp_sums[32];
    __shared__ float total;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0)
        warp_sums[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < nwarps ? warp_sums[lane] : 0.0f;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0)
            total = v;
    }
    __syncthreads();
    return total;
}

// One row. With Fused: res = x + res (stored rounded), then x = norm(res); else out = norm(x).
template <typename T, bool Fused>
__device__ __forceinline__ void rms_row(T *out,                        // (rows, d) T; fused: input
                                        T *x,                          // (rows, d) T; fused: residual
                                        const T *add,                  // fused: input (== out), else unused
                                        const T *__restrict__ weight,  // (d,) T
                                        float eps, tk_i64 d)
{
    const tk_i64 row = blockIdx.x;
    T *o = out + row * d;
    T *xr = x + row * d;
    const T *ar = add + row * d;
    constexpr int N = Vec<T>::N;
    const bool vec = d % N == 0 && aligned16(out) && aligned16(x) && aligned16(weight);
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

    const float scale = rsqrtf(block_sum(ss) / (float)d + eps);

    // Each thread reads back only the elements it wrote above (same index mapping).
    if (vec) {
        const Pack<T> *xv = reinterpret_cast<const Pack<T> *>(xr);
        const Pack<T> *wv = reinterpret_cast<const Pack<T> *>(weight);
        Pack<T> *ov = reinterpret_cast<Pack<T> *>(o);
        for (tk_i64 i = threadIdx.x; i < d / N; i += blockDim.x) {
            Pack<T> a = xv[i], w = wv[i], r;
#pragma unroll
            for (int k = 0; k < N; k++)
                r.v[k] = from_f32<T>(__fmul_rn(__fmul_rn(to_f32(a.v[k]), scale), to_f32(w.v[k])));
            ov[i] = r;
        }
    } else {
        for (tk_i64 i = threadIdx.x; i < d; i += blockDim.x)
            o[i] = from_f32<T>(__fmul_rn(__fmul_rn(to_f32(xr[i]), scale), to_f32(weight[i])));
    }
}

} // namespace tk_rms

// ---- entry points (name expressions "tk_<op><float>", "<__half>", "<__nv_bfloat16>") -------------

// out may equal input (in place), so neither is __restrict__.
template <typename T>
__global__ void __launch_bounds__(1024) tk_rms_norm(T *out,                       // (..., d) T
                                                    const T *input,               // (..., d) T
                                                    const T *__restrict__ weight, // (d,) T
                                                    float eps, tk_i64 d)
{
    tk_rms::rms_row<T, false>(out, const_cast<T *>(input), input, weight, eps, d);
}

template <typename T>
__global__ void __launch_bounds__(1024) tk_fused_add_rms_norm(T *input,                     // (..., d) T, in/out
                                                              T *residual,                  // (..., d) T, in/out
                                                              const T *__restrict__ weight, // (d,) T
                                                              float eps, tk_i64 d)
{
    tk_rms::rms_row<T, true>(input, residual, input, weight, eps, d);
}
