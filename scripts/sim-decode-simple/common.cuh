// common.cuh (host shim) — stands in for kernels-src/flash-attn/common.cuh when run.sh compiles
// decode_simple.cu as host C++: one OS thread per CUDA thread of a block, a block-wide std::barrier for
// __syncthreads and per-warp barriers around a shared slot array for __shfl_sync / __shfl_xor_sync
// (every shuffle of the kernel is reached by all 32 lanes), __shared__ as function statics (blocks run
// one at a time), host f16 (F16C) / bf16 (round to nearest even) types, ex2 as exp2f, and
// fp8_e4m3_to_f32 copied from jit/device/tk_device.cuh. A development aid, not part of any package.
#pragma once
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <immintrin.h>
using std::min;
using std::max;
typedef long long i64;
struct dim3s { unsigned x, y, z; };
extern thread_local dim3s threadIdx, blockIdx;
extern dim3s gridDim, blockDim;
extern std::barrier<> *g_block_bar;
extern std::barrier<> *g_warp_bar[32];
extern uint64_t g_shfl[32][32];
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __shared__ static
#define __launch_bounds__(x)
inline float __int_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
#define TK_FA_LOG2E 1.4426950408889634f
#define TK_FA_LN2 0.6931471805599453f
#define TK_FA_NEG_INF __int_as_float(0xff800000)
inline void __syncthreads() { g_block_bar->arrive_and_wait(); }
template <typename T> inline T shfl_idx(T v, int src)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    g_shfl[w][lane] = b;
    g_warp_bar[w]->arrive_and_wait();
    uint64_t r = g_shfl[w][src & 31];
    g_warp_bar[w]->arrive_and_wait();
    T o;
    memcpy(&o, &r, sizeof o);
    return o;
}
template <typename T> inline T __shfl_sync(unsigned, T v, int src) { return shfl_idx(v, src); }
template <typename T> inline T __shfl_xor_sync(unsigned, T v, int m) { return shfl_idx(v, (int)(threadIdx.x & 31) ^ m); }
inline float ex2(float x) { return exp2f(x); }
struct __half { uint16_t x; };
struct __nv_bfloat16 { uint16_t x; };
inline float __half2float(__half h) { return _cvtsh_ss(h.x); }
inline float __bfloat162float(__nv_bfloat16 h) { return __uint_as_float((unsigned)h.x << 16); }
inline float to_f32(float x) { return x; }
inline float to_f32(__half x) { return __half2float(x); }
inline float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> T from_f32(float x);
template <> inline float from_f32<float>(float x) { return x; }
template <> inline __half from_f32<__half>(float x) { return __half{(uint16_t)_cvtss_sh(x, 0)}; }
template <> inline __nv_bfloat16 from_f32<__nv_bfloat16>(float x)
{
    unsigned u = __float_as_uint(x);
    if (std::isnan(x)) return __nv_bfloat16{(uint16_t)((u >> 16) | 0x40)};
    u += 0x7fff + ((u >> 16) & 1);
    return __nv_bfloat16{(uint16_t)(u >> 16)};
}
// copied from jit/device/tk_device.cuh
inline float fp8_e4m3_to_f32(unsigned char c)
{
    const uint32_t s = (uint32_t)(c & 0x80u) << 24, e = (c >> 3) & 15u, m = c & 7u;
    if ((c & 0x7fu) == 0x7fu)
        return __uint_as_float(s | 0x7fc00000u);
    if (e == 0)
        return __uint_as_float(s | __float_as_uint((float)m * 0.001953125f));
    return __uint_as_float(s | ((e + 120u) << 23) | (m << 20));
}
