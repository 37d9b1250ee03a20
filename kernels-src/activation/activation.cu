// activation.cu — activation kernels of kernels-community/activation (the Hugging Face community
// activation kernel's ops, with vLLM's definitions).
//
// Variants (each a template over T = float, __half, __nv_bfloat16; one manifest entry per op and dtype):
//   gated, input (..., 2d) -> out (..., d):
//     tk_silu_and_mul       out = silu(x[:d]) * x[d:]
//     tk_mul_and_silu       out = x[:d] * silu(x[d:])
//     tk_gelu_and_mul       out = gelu(x[:d]) * x[d:]          (erf gelu)
//     tk_gelu_tanh_and_mul  out = gelu_tanh(x[:d]) * x[d:]
//     tk_fatrelu_and_mul    out = fatrelu(x[:d], threshold) * x[d:]
//   elementwise, input (...) -> out (...):
//     tk_gelu, tk_gelu_tanh, tk_silu, tk_gelu_new, tk_gelu_fast, tk_gelu_quick
//
// Launch assumptions:
//   - every tensor is contiguous, row-major, and `out` does not overlap `input`;
//   - gated kernels: one block per row (grid.x = rows = numel(out) / d), any block size, a block-stride
//     loop over the row; rows < 2^31;
//   - elementwise kernels: a grid-stride loop over all n elements, any grid and block size.
//   16-byte vector loads and stores are used when the pointers are 16-byte aligned (and, for the gated
//   kernels, d is a multiple of the vector width: 4 for f32, 8 for f16/bf16); otherwise scalar code
//   runs (elementwise kernels vectorise the body and finish with a scalar tail).
//
// Numerics: every element is loaded as fp32, computed in fp32 and rounded once to T (round to nearest
// even). The fp32 entries are built without fast math, so expf / erff / tanhf and '/' are the
// accurate CUDA versions and the order of operations matches tk's CPU reference (see activation.cuh).
// For f16/bf16 this rounds once where the Hugging Face kernel rounds act(x) to T before the multiply,
// so results may differ from it by one unit in the last place.
#include "activation.cuh"

namespace tk_act {

// out[r, i] = act(x[r, i]) * x[r, d + i]   (act_first), or x[r, i] * act(x[r, d + i])
template <typename T, typename Act, bool act_first>
__device__ __forceinline__ void and_mul(T *__restrict__ out,         // (rows, d) T
                                        const T *__restrict__ input, // (rows, 2d) T
                                        tk_i64 d, float param)
{
    const tk_i64 row = blockIdx.x;
    const T *x = input + row * 2 * d; // (d,) the first half
    const T *y = x + d;               // (d,) the second half
    T *o = out + row * d;             // (d,)
    constexpr int N = Vec<T>::N;

    if (d % N == 0 && aligned16(input) && aligned16(out)) {
        const Pack<T> *xv = reinterpret_cast<const Pack<T> *>(x);
        const Pack<T> *yv = reinterpret_cast<const Pack<T> *>(y);
        Pack<T> *ov = reinterpret_cast<Pack<T> *>(o);
        for (tk_i64 i = threadIdx.x; i < d / N; i += blockDim.x) {
            Pack<T> a = xv[i], b = yv[i], r;
#pragma unroll
            for (int k = 0; k < N; k++) {
                float fa = to_f32(a.v[k]), fb = to_f32(b.v[k]);
                float v = act_first ? __fmul_rn(Act::f(fa, param), fb) : __fmul_rn(fa, Act::f(fb, param));
                r.v[k] = from_f32<T>(v);
            }
            ov[i] = r;
        }
    } else {
        for (tk_i64 i = threadIdx.x; i < d; i += blockDim.x) {
            float fa = to_f32(x[i]), fb = to_f32(y[i]);
            float v = act_first ? __fmul_rn(Act::f(fa, param), fb) : __fmul_rn(fa, Act::f(fb, param));
            o[i] = from_f32<T>(v);
        }
    }
}

// out[i] = act(input[i]) for i < n: 16-byte packs, then the scalar tail (tk::map)
template <typename T, typename Act>
__device__ __forceinline__ void unary(T *__restrict__ out,         // (n,) T
                                      const T *__restrict__ input, // (n,) T
                                      tk_i64 n)
{
    map(out, input, n, [](float x) { return Act::f(x, 0.0f); });
}

} // namespace tk_act

// ---- entry points (name expressions "tk_<op><float>", "<__half>", "<__nv_bfloat16>") -------------

#define TK_ACT_AND_MUL(name, Act, act_first)                                                           \
    template <typename T>                                                                              \
    __global__ void __launch_bounds__(1024) name(T *__restrict__ out,         /* (..., d) T */         \
                                                 const T *__restrict__ input, /* (..., 2d) T */        \
                                                 tk_i64 d)                                             \
    {                                                                                                  \
        tk_act::and_mul<T, tk_act::Act, act_first>(out, input, d, 0.0f);                               \
    }

TK_ACT_AND_MUL(tk_silu_and_mul, Silu, true)
TK_ACT_AND_MUL(tk_mul_and_silu, Silu, false)
TK_ACT_AND_MUL(tk_gelu_and_mul, Gelu, true)
TK_ACT_AND_MUL(tk_gelu_tanh_and_mul, GeluTanh, true)

template <typename T>
__global__ void __launch_bounds__(1024) tk_fatrelu_and_mul(T *__restrict__ out,         // (..., d) T
                                                           const T *__restrict__ input, // (..., 2d) T
                                                           tk_i64 d, float threshold)
{
    tk_act::and_mul<T, tk_act::FatRelu, true>(out, input, d, threshold);
}

#define TK_ACT_UNARY(name, Act)                                                                        \
    template <typename T>                                                                              \
    __global__ void __launch_bounds__(1024) name(T *__restrict__ out,         /* (...) T, n elements */\
                                                 const T *__restrict__ input, /* (...) T, n elements */\
                                                 tk_i64 n)                                             \
    {                                                                                                  \
        tk_act::unary<T, tk_act::Act>(out, input, n);                                                  \
    }

TK_ACT_UNARY(tk_gelu, Gelu)
TK_ACT_UNARY(tk_gelu_tanh, GeluTanh)
TK_ACT_UNARY(tk_silu, Silu)
TK_ACT_UNARY(tk_gelu_new, GeluNew)
TK_ACT_UNARY(tk_gelu_fast, GeluFast)
TK_ACT_UNARY(tk_gelu_quick, GeluQuick)
