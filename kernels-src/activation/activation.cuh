// activation.cuh — scalar activation functions, dtype conversions and 16-byte packs for activation.cu.
//
// Every function computes in fp32. The expression order is part of the contract: tk's CPU reference
// (ops/activation.c) evaluates the same operations in the same order with expf / erff / tanhf, so the
// fp32 results agree up to the device math library's ulp error (CUDA's expf, erff and tanhf are within
// 2 ulp; glibc's are within 1). Multiplies that feed an add are written with __fmul_rn / __fadd_rn so
// that -fmad cannot contract them into an FMA the CPU does not do.
//
// NVRTC-compatible: no host code, no standard headers, only cuda_fp16.h and cuda_bf16.h.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

typedef long long tk_i64;            // manifest type i64
typedef unsigned long long tk_u64;

namespace tk_act {

// ---- dtype conversions: load as fp32, store with one round-to-nearest-even --------------------

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

// ---- 16-byte packs -----------------------------------------------------------------------------

// VEC elements of T in 16 bytes: 4 for f32, 8 for f16 and bf16.
template <typename T> struct Vec {
    static constexpr int N = 16 / (int)sizeof(T);
};

template <typename T> struct __align__(16) Pack {
    T v[Vec<T>::N];
};

__device__ __forceinline__ bool aligned16(const void *p)
{
    return (reinterpret_cast<tk_u64>(p) & 15ull) == 0;
}

// ---- activations (fp32 in, fp32 out) -----------------------------------------------------------

// Constants as decimal literals shared with the CPU reference, so both round them identically.
#define TK_ACT_SQRT1_2 0.70710678118654752440f   // 1/sqrt(2)
#define TK_ACT_SQRT_2_PI 0.79788456080286535588f  // sqrt(2/pi)
#define TK_ACT_KAPPA 0.044715f
#define TK_ACT_GELU_NEW_C 0.79788456f             // as in GPT-2's gelu_new / vLLM's gelu_new
#define TK_ACT_QUICK 1.702f

// silu(x) = x * sigmoid(x) = x / (1 + exp(-x))
struct Silu {
    static __device__ __forceinline__ float f(float x, float) { return x / (1.0f + expf(-x)); }
};

// gelu(x) = 0.5 x (1 + erf(x / sqrt 2))   (PyTorch approximate='none')
struct Gelu {
    static __device__ __forceinline__ float f(float x, float)
    {
        return __fmul_rn(__fmul_rn(x, 0.5f), 1.0f + erff(__fmul_rn(x, TK_ACT_SQRT1_2)));
    }
};

// gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))   (PyTorch approximate='tanh')
struct GeluTanh {
    static __device__ __forceinline__ float f(float x, float)
    {
        float x3 = __fmul_rn(__fmul_rn(x, x), x);
        float inner = __fmul_rn(TK_ACT_SQRT_2_PI, __fadd_rn(x, __fmul_rn(TK_ACT_KAPPA, x3)));
        return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, tanhf(inner)));
    }
};

// gelu_new(x) = 0.5 x (1 + tanh(0.79788456 (x + 0.044715 x^3)))   (GPT-2)
struct GeluNew {
    static __device__ __forceinline__ float f(float x, float)
    {
        float x3 = __fmul_rn(__fmul_rn(x, x), x);
        float t = tanhf(__fmul_rn(TK_ACT_GELU_NEW_C, __fadd_rn(x, __fmul_rn(TK_ACT_KAPPA, x3))));
        return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, t));
    }
};

// gelu_fast(x) = 0.5 x (1 + tanh(x * 0.79788456 * (1 + 0.044715 x x)))
struct GeluFast {
    static __device__ __forceinline__ float f(float x, float)
    {
        float inner = __fadd_rn(1.0f, __fmul_rn(__fmul_rn(TK_ACT_KAPPA, x), x));
        float t = tanhf(__fmul_rn(__fmul_rn(x, TK_ACT_GELU_NEW_C), inner));
        return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, t));
    }
};

// gelu_quick(x) = x * sigmoid(1.702 x) = x / (1 + exp(-1.702 x))
struct GeluQuick {
    static __device__ __forceinline__ float f(float x, float)
    {
        return x / (1.0f + expf(__fmul_rn(-TK_ACT_QUICK, x)));
    }
};

// fatrelu(x; threshold) = x if x > threshold else 0. A NaN x gives 0, as in the Hugging Face kernel
// (PyTorch's F.threshold would keep the NaN).
struct FatRelu {
    static __device__ __forceinline__ float f(float x, float threshold) { return x > threshold ? x : 0.0f; }
};

} // namespace tk_act
