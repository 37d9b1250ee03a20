// <tk/device.cuh> — tk's device toolkit, version 1: the helpers every kernel package would otherwise
// write again. tk hands this file to NVRTC in memory under the name "tk/device.cuh" with every compile
// (nothing on the user's disk), so a package writes `#include <tk/device.cuh>` and, when it relies on
// this version, says so in kernel.json: "device_toolkit": 1. docs/device-toolkit.md is the manual.
//
// Rules this file keeps, so that a package built on it keeps its numerics:
//   - Versioned: TK_DEVICE_TOOLKIT_VERSION names what is here. A later version only adds names; a
//     helper's results (rounding, reduction order) never change within a version, and the file's
//     bytes are part of every compile's cache key.
//   - Every name is in namespace tk (macros: TK_DEV_), except the manifest's scalar types tk_i64,
//     tk_u64, tk_u32 at global scope (an i64 param is a `long long`).
//   - NVRTC-compatible: no host code, no standard headers; only cuda_fp16.h and cuda_bf16.h.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define TK_DEVICE_TOOLKIT_VERSION 1

typedef long long tk_i64; // manifest type i64
typedef unsigned long long tk_u64;
typedef unsigned int tk_u32;

namespace tk {

// ---- dtype conversions ---------------------------------------------------------------------------
// Loads widen exactly to fp32. Stores round once, to nearest even. f16 and bf16 follow IEEE (a value
// beyond the largest finite one becomes inf, as torch's .to() does); fp8 and int8 saturate.

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

// Two floats as one 32-bit register of two 16-bit values, `lo` in the low half (the lower column of
// an mma fragment pair), each rounded to nearest even; and back.
template <typename T> __device__ __forceinline__ tk_u32 pack2(float lo, float hi);
template <> __device__ __forceinline__ tk_u32 pack2<__half>(float lo, float hi)
{
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<tk_u32 *>(&h);
}
template <> __device__ __forceinline__ tk_u32 pack2<__nv_bfloat16>(float lo, float hi)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<tk_u32 *>(&h);
}
template <typename T> __device__ __forceinline__ float2 unpack2(tk_u32 v);
template <> __device__ __forceinline__ float2 unpack2<__half>(tk_u32 v)
{
    return __half22float2(*reinterpret_cast<__half2 *>(&v));
}
template <> __device__ __forceinline__ float2 unpack2<__nv_bfloat16>(tk_u32 v)
{
    return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&v));
}

// int8: round to nearest even, saturate to [-127, 127] (symmetric, as tk's CPU reference
// tk_ops__f32_to_i8); NaN gives 0. Returns the two's-complement byte.
__device__ __forceinline__ unsigned char f32_to_i8(float f)
{
    if (f != f)
        return 0;
    const float r = fminf(fmaxf(rintf(f), -127.0f), 127.0f);
    return (unsigned char)(signed char)(int)r;
}
__device__ __forceinline__ float i8_to_f32(unsigned char c) { return (float)(signed char)c; }

// OCP fp8. e4m3fn: bias 7, no inf, S.1111.111 is NaN, largest 448 (0x7e). e5m2: bias 15, IEEE-like
// (inf and NaN), largest 57344 (0x7b). Encoders round to nearest even and saturate to the largest
// finite value, inf included (__NV_SATFINITE); NaN gives S.1111.111 (a NaN in both); the sign of zero
// is kept. Bit for bit tk's CPU reference (ops/dtype.c). Decoders are exact.
template <int MBITS, int BIAS, tk_u32 MAXCODE> __device__ __forceinline__ unsigned char f32_to_fp8(float x)
{
    const tk_u32 u = __float_as_uint(x);
    const tk_u32 sign = (u >> 24) & 0x80u;
    const tk_u32 a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (unsigned char)(sign | 0x7fu);
    if (a == 0x7f800000u)
        return (unsigned char)(sign | MAXCODE);
    tk_u32 code;
    if (a < ((tk_u32)(128 - BIAS) << 23)) { // below the smallest normal 2^(1-BIAS): subnormal codes
        // round(|x| * 2^(BIAS - 1 + MBITS)); the largest result is the smallest normal's code
        code = (tk_u32)rintf(__uint_as_float(a) * __uint_as_float((tk_u32)(127 + BIAS - 1 + MBITS) << 23));
    } else {
        int e = (int)(a >> 23) - 127;
        const int sh = 23 - MBITS;
        const tk_u32 m = a & 0x7fffffu, half = 1u << (sh - 1);
        tk_u32 qm = m >> sh;
        const tk_u32 rem = m & ((1u << sh) - 1u);
        if (rem > half || (rem == half && (qm & 1u)))
            qm++;
        if (qm == (1u << MBITS)) {
            qm = 0;
            e++;
        }
        const int field = e + BIAS;
        code = field > (0x7f >> MBITS) ? 0x7fu : ((tk_u32)field << MBITS) | qm;
    }
    if (code > MAXCODE)
        code = MAXCODE;
    return (unsigned char)(sign | code);
}
__device__ __forceinline__ unsigned char f32_to_fp8_e4m3(float x) { return f32_to_fp8<3, 7, 0x7eu>(x); }
__device__ __forceinline__ unsigned char f32_to_fp8_e5m2(float x) { return f32_to_fp8<2, 15, 0x7bu>(x); }

__device__ __forceinline__ float fp8_e4m3_to_f32(unsigned char c)
{
    const tk_u32 s = (tk_u32)(c & 0x80u) << 24, e = (c >> 3) & 15u, m = c & 7u;
    if ((c & 0x7fu) == 0x7fu)
        return __uint_as_float(s | 0x7fc00000u);
    if (e == 0) // m * 2^-9, exact
        return __uint_as_float(s | __float_as_uint((float)m * 0.001953125f));
    return __uint_as_float(s | ((e + 120u) << 23) | (m << 20));
}
// e5m2 is the top byte of the f16 with the same value (inf and NaN included).
__device__ __forceinline__ float fp8_e5m2_to_f32(unsigned char c)
{
    return __half2float(__ushort_as_half((unsigned short)((unsigned)c << 8)));
}

// ---- aligned vectors with a scalar tail ----------------------------------------------------------

// Vec<T>::N elements of T in 16 bytes (4 for f32, 8 for f16 and bf16, 16 for 8-bit types), and the
// 16-byte aligned pack that moves them with one load or store.
template <typename T> struct Vec {
    static constexpr int N = 16 / (int)sizeof(T);
};
template <typename T> struct __align__(16) Pack {
    T v[Vec<T>::N];
};

__device__ __forceinline__ bool aligned16(const void *p) { return (reinterpret_cast<tk_u64>(p) & 15ull) == 0; }
// p is a multiple of n bytes (n a power of two).
__device__ __forceinline__ bool aligned(const void *p, unsigned n) { return (reinterpret_cast<tk_u64>(p) & (n - 1)) == 0; }

__device__ __forceinline__ tk_i64 cdiv(tk_i64 a, tk_i64 b) { return (a + b - 1) / b; }

// Grid-stride loops: for (tk_i64 i = tk::grid_index(); i < n; i += tk::grid_stride()).
__device__ __forceinline__ tk_i64 grid_index() { return (tk_i64)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ tk_i64 grid_stride() { return (tk_i64)gridDim.x * blockDim.x; }

// out[i] = F(in[i]) for i < n over a 1-D grid: Pack<T> loads and stores when both pointers are 16-byte
// aligned, then the scalar tail (everything, when they are not). f: float -> float, computed in fp32,
// rounded once to T. Element i goes through the same f either way, so the result does not depend on
// the alignment.
template <typename T, typename F>
__device__ __forceinline__ void map(T *out, const T *in, tk_i64 n, F f)
{
    constexpr int N = Vec<T>::N;
    const tk_i64 tid = grid_index(), stride = grid_stride();
    const tk_i64 nvec = (aligned16(in) && aligned16(out)) ? n / N : 0;
    const Pack<T> *iv = reinterpret_cast<const Pack<T> *>(in);
    Pack<T> *ov = reinterpret_cast<Pack<T> *>(out);
    for (tk_i64 i = tid; i < nvec; i += stride) {
        Pack<T> a = iv[i], r;
#pragma unroll
        for (int k = 0; k < N; k++)
            r.v[k] = from_f32<T>(f(to_f32(a.v[k])));
        ov[i] = r;
    }
    for (tk_i64 i = nvec * N + tid; i < n; i += stride)
        out[i] = from_f32<T>(f(to_f32(in[i])));
}

// ---- warp and block reductions -------------------------------------------------------------------
// Warp: a butterfly (__shfl_xor_sync with offsets 16, 8, 4, 2, 1) over the full warp; every lane
// gets the result, and every lane of the warp must call it. The order of the adds is fixed, so a
// result is the same from run to run.
//
// Block (the shared-memory contract): blockDim.x is a multiple of 32 and at most 1024, blockDim.y =
// blockDim.z = 1, and every thread of the block calls it (it has barriers). Each call uses its own
// static __shared__ slots: 33 values of its type (32 warp partials and the total), counted in the
// kernel's static shared memory, not in the launch's dynamic smem. It starts with a barrier, so back-
// to-back calls need no __syncthreads between them; the caller's own shared memory is untouched.
// Order: each warp reduces as above, then warp 0 reduces the warp partials the same way (partials of
// missing warps count as the identity: 0 for a sum, -inf (float) or 0 (tk_u64) for a max). Types:
// float, double and tk_u64 sums (integer sums are exact in any order), float and tk_u64 maxima.

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ double warp_sum(double v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ tk_u64 warp_sum(tk_u64 v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
// fmaxf: a NaN lane is ignored unless every lane is NaN.
__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ tk_u64 warp_max(tk_u64 v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const tk_u64 w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    return v;
}

namespace detail {
// The identity of a max: -inf for float, 0 for tk_u64.
__device__ __forceinline__ float lowest(float) { return -__int_as_float(0x7f800000); }
__device__ __forceinline__ tk_u64 lowest(tk_u64) { return 0; }
template <bool Max, typename V> __device__ __forceinline__ V identity(V v)
{
    if constexpr (Max)
        return lowest(v);
    else
        return (V)0;
}
template <bool Max, typename V> __device__ __forceinline__ V reduce_warp(V v)
{
    if constexpr (Max)
        return warp_max(v);
    else
        return warp_sum(v);
}
template <bool Max, typename V> __device__ __forceinline__ V block_reduce(V v)
{
    __shared__ V partial[32];
    __shared__ V total;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = reduce_warp<Max>(v);
    __syncthreads(); // the previous call's readers are done with `total`
    if (lane == 0)
        partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < nwarps ? partial[lane] : identity<Max>(v);
        v = reduce_warp<Max>(v);
        if (lane == 0)
            total = v;
    }
    __syncthreads();
    return total;
}
} // namespace detail

__device__ __forceinline__ float block_sum(float v) { return detail::block_reduce<false>(v); }
__device__ __forceinline__ double block_sum(double v) { return detail::block_reduce<false>(v); }
__device__ __forceinline__ tk_u64 block_sum(tk_u64 v) { return detail::block_reduce<false>(v); }
__device__ __forceinline__ float block_max(float v) { return detail::block_reduce<true>(v); }
__device__ __forceinline__ tk_u64 block_max(tk_u64 v) { return detail::block_reduce<true>(v); }

// K sums at once (v[k] replaced by its sum over the block, in every thread): one pass of barriers for
// all K. Same contract and order as block_sum, with K x 33 floats of static shared memory.
template <int K> __device__ __forceinline__ void block_sum(float (&v)[K])
{
    __shared__ float part[K][32];
    __shared__ float total[K];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
#pragma unroll
    for (int k = 0; k < K; k++) {
        v[k] = warp_sum(v[k]);
        if (lane == 0)
            part[k][warp] = v[k];
    }
    __syncthreads();
    if (warp == 0) {
#pragma unroll
        for (int k = 0; k < K; k++) {
            float s = lane < nwarps ? part[k][lane] : 0.0f;
            s = warp_sum(s);
            if (lane == 0)
                total[k] = s;
        }
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < K; k++)
        v[k] = total[k];
}

// ---- Philox-4x32-10 --------------------------------------------------------------------------------
// The counter-based generator of Salmon et al., "Parallel random numbers: as easy as 1, 2, 3" (SC'11),
// as Random123 and cuRAND define it: ten rounds over a 128-bit counter with a 64-bit key. Pure: the
// same (counter, key) always gives the same four words, on every GPU and on the CPU (tk's sampling
// reference, ops/sampling.c, computes the same function).
__device__ __forceinline__ uint4 philox4x32_10(uint4 ctr, uint2 key)
{
    tk_u32 c0 = ctr.x, c1 = ctr.y, c2 = ctr.z, c3 = ctr.w, k0 = key.x, k1 = key.y;
#pragma unroll
    for (int i = 0; i < 10; i++) {
        const tk_u32 hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        const tk_u32 hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        const tk_u32 n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c1 = lo1;
        c3 = lo0;
        c0 = n0;
        c2 = n2;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    return make_uint4(c0, c1, c2, c3);
}

// 64 random bits for (seed, a, b): Philox with key = seed and counter = (a, b) as 64-bit halves; the
// first two output words, low word first.
__device__ __forceinline__ tk_u64 philox_u64(tk_u64 seed, tk_u64 a, tk_u64 b)
{
    const uint4 r = philox4x32_10(make_uint4((tk_u32)a, (tk_u32)(a >> 32), (tk_u32)b, (tk_u32)(b >> 32)),
                                  make_uint2((tk_u32)seed, (tk_u32)(seed >> 32)));
    return ((tk_u64)r.y << 32) | r.x;
}

} // namespace tk
