// casted.cuh — device helpers shared by the kernels of kernels-community/casted: exact decoders of
// 8-bit codes (i8, OCP fp8 e4m3fn and e5m2) to fp32 and to packed bf16, bf16 unpacking, and stores.
//
// Every decoder is exact: each i8, e4m3 and e5m2 value is representable in f16, bf16 (i8: integers up
// to 256; e4m3: 4 significant bits, 2^-9 .. 448; e5m2 is the top byte of an f16) and fp32.
//   i8    the "magic number" conversion: 0x4B0000xx is 2^23 + xx, so byte ^ 0x80 placed there and
//         2^23 + 128 subtracted gives the signed value (two integer ops and one add per element).
//   e5m2  the code is the high byte of the f16 with the same value (inf and NaN included).
//   e4m3  sm_89+: the hardware cvt.rn.f16x2.e4m3x2. sm_80: the code's bits placed in an f16
//         (sign, then exponent+mantissa one bit lower) are the value * 2^-8, subnormals included, so one
//         f16x2 multiply by 256 gives the value; S.1111.111 (NaN in e4m3fn) is patched to an f16 NaN.
//
// The scalar types, alignment tests, RNE packing and stores come from tk's device toolkit,
// <tk/device.cuh>; what stays here is the casted package's own vectorised decoding.
//
// NVRTC-compatible: no host code, no standard headers.
#pragma once

#include <tk/device.cuh>

namespace tk_casted {

using namespace tk; // tk_u32 / tk_u64 / tk_i64, aligned, pack2, from_f32 (<tk/device.cuh>)

enum Fmt { I8 = 0, E4M3 = 1, E5M2 = 2 };

// ---- f16x2 / bf16x2 / f32 conversions on raw bits --------------------------------------------------

__device__ __forceinline__ void f16x2_to_f32(tk_u32 h, float &lo, float &hi)
{
    asm("{\n\t.reg .b16 a, b;\n\tmov.b32 {a, b}, %2;\n\tcvt.f32.f16 %0, a;\n\tcvt.f32.f16 %1, b;\n\t}"
        : "=f"(lo), "=f"(hi)
        : "r"(h));
}

// {lo, hi} rounded to nearest even into a bf16x2 (lo in the low half): cvt.rn.bf16x2.f32.
__device__ __forceinline__ tk_u32 pack_bf16x2(float lo, float hi) { return pack2<__nv_bfloat16>(lo, hi); }

// bf16 halves of a 32-bit word as fp32 (exact).
__device__ __forceinline__ float bf16_lo(tk_u32 u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf16_hi(tk_u32 u) { return __uint_as_float(u & 0xffff0000u); }

// ---- 8-bit decoders --------------------------------------------------------------------------------

// Four e4m3 codes (byte j of w) to two f16x2: lo = {b0, b1}, hi = {b2, b3}.
__device__ __forceinline__ void e4m3x4_to_f16x2(tk_u32 w, tk_u32 &lo, tk_u32 &hi)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    asm("{\n\t.reg .b16 a, b;\n\tmov.b32 {a, b}, %2;\n\tcvt.rn.f16x2.e4m3x2 %0, a;\n\tcvt.rn.f16x2.e4m3x2 %1, b;\n\t}"
        : "=r"(lo), "=r"(hi)
        : "r"(w));
#else
    tk_u32 t[2] = {__byte_perm(w, 0u, 0x1404), __byte_perm(w, 0u, 0x3424)}; // code j at bits 8..15 of half j
    tk_u32 r[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const tk_u32 h = (t[i] & 0x80008000u) | ((t[i] >> 1) & 0x3f803f80u); // value * 2^-8 as f16 bits
        tk_u32 v;
        asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(v) : "r"(h), "r"(0x5c005c00u)); // * 256, exact
        const tk_u32 nan = __vcmpeq2(t[i] & 0x7f007f00u, 0x7f007f00u);       // 0xffff where the code is NaN
        r[i] = v | (nan & 0x7e007e00u);
    }
    lo = r[0];
    hi = r[1];
#endif
}

// Four codes (byte j of w) to fp32 f[0..3].
template <int F> __device__ __forceinline__ void dq4(tk_u32 w, float *f)
{
    if (F == I8) {
        const tk_u32 v = w ^ 0x80808080u; // byte + 128, unsigned
        f[0] = __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7540)) - 8388736.0f;
        f[1] = __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7541)) - 8388736.0f;
        f[2] = __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7542)) - 8388736.0f;
        f[3] = __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7543)) - 8388736.0f;
    } else {
        tk_u32 lo, hi;
        if (F == E4M3) {
            e4m3x4_to_f16x2(w, lo, hi);
        } else {
            lo = __byte_perm(w, 0u, 0x1404);
            hi = __byte_perm(w, 0u, 0x3424);
        }
        f16x2_to_f32(lo, f[0], f[1]);
        f16x2_to_f32(hi, f[2], f[3]);
    }
}

// Sixteen codes to fp32.
template <int F> __device__ __forceinline__ void dq16(const uint4 &v, float *f)
{
    dq4<F>(v.x, f);
    dq4<F>(v.y, f + 4);
    dq4<F>(v.z, f + 8);
    dq4<F>(v.w, f + 12);
}

// One code to fp32.
template <int F> __device__ __forceinline__ float dq1(unsigned char c)
{
    float f[4];
    dq4<F>((tk_u32)c, f);
    return f[0];
}

// Four codes to two bf16x2 (exact): lo = {b0, b1}, hi = {b2, b3}.
template <int F> __device__ __forceinline__ void dq4_bf16(tk_u32 w, tk_u32 &lo, tk_u32 &hi)
{
    float f[4];
    if (F == I8) {
        dq4<I8>(w, f); // integers: their fp32 upper halves are the bf16 values
        lo = __byte_perm(__float_as_uint(f[0]), __float_as_uint(f[1]), 0x7632);
        hi = __byte_perm(__float_as_uint(f[2]), __float_as_uint(f[3]), 0x7632);
    } else {
        dq4<F>(w, f);
        lo = pack_bf16x2(f[0], f[1]);
        hi = pack_bf16x2(f[2], f[3]);
    }
}

// ---- stores ----------------------------------------------------------------------------------------

template <typename T> __device__ __forceinline__ void store1(T *o, float v) { *o = from_f32<T>(v); }

// N (a multiple of 4) values to 16-byte aligned o.
template <int N> __device__ __forceinline__ void storev(float *o, const float *f)
{
#pragma unroll
    for (int i = 0; i < N; i += 4)
        *reinterpret_cast<float4 *>(o + i) = make_float4(f[i], f[i + 1], f[i + 2], f[i + 3]);
}

// N (a multiple of 8) values to 16-byte aligned o, rounded to bf16.
template <int N> __device__ __forceinline__ void storev(__nv_bfloat16 *o, const float *f)
{
#pragma unroll
    for (int i = 0; i < N; i += 8)
        *reinterpret_cast<uint4 *>(o + i) = make_uint4(pack_bf16x2(f[i], f[i + 1]), pack_bf16x2(f[i + 2], f[i + 3]),
                                                       pack_bf16x2(f[i + 4], f[i + 5]), pack_bf16x2(f[i + 6], f[i + 7]));
}

} // namespace tk_casted
