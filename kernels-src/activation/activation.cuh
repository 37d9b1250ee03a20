// activation.cuh — the scalar activation functions of activation.cu. Conversions, 16-byte packs and the
// vector loop come from tk's device toolkit, <tk/device.cuh> (docs/device-toolkit.md).
//
// Every function computes in fp32. The expression order is part of the contract: tk's CPU reference
// (ops/activation.c) evaluates the same operations in the same order with expf / erff / tanhf, so the
// fp32 results agree up to the device math library's ulp error (CUDA's expf, erff and tanhf are within
// 2 ulp; glibc's are within 1). Multiplies that feed an add are written with __fmul_rn / __fadd_rn so
// that -fmad cannot contract them into an FMA the CPU does not do.
//
// NVRTC-compatible: no host code, no standard headers, only <tk/device.cuh>.
#pragma once

#include <tk/device.cuh>

namespace tk_act {

using namespace tk; // to_f32, from_f32, Vec, Pack, aligned16, map (<tk/device.cuh>)

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
