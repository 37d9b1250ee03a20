// paged_kv_append.cu — paged_kv_append of kernels-community/flash-attn: writes the keys and values of N
// new tokens into their slots of a paged KV cache, quantising for an 8-bit cache.
//
// Variants: tk_paged_kv_append<T, KV>, T = __half or __nv_bfloat16 (k, v), KV = KV_SAME (the cache is
// T: a copy), KV_I8 or KV_FP8 (int8 / fp8 e4m3fn cache: q = quant(x / scale[h]) with x the T value
// in fp32, the IEEE division, and the quantisers of decode_common.cuh, which are bit for bit
// tk_ops__f32_to_i8 / tk_ops__f32_to_fp8_e4m3: round to nearest even, saturating to [-127, 127] /
// +-448, NaN -> 0 / S.1111.111 with the input's sign; a scale left out counts as 1).
//
// Token i goes to row slot = slot_mapping[i] of the cache seen as [num_blocks * block_size, Hkv * D]
// (slot = block * block_size + offset); a negative slot skips the token, and so does one past the
// cache (num_slots), rather than writing out of bounds.
//
// Launch: grid (N), one CTA per token, blockDim a multiple of 32 (<= 256); each thread moves 8
// elements per step (16-byte loads of k and v, 16- or 8-byte stores) when D % 8 == 0 and the
// pointers are aligned, element by element otherwise. Contiguous tensors.
//
// tk_paged_kv_append_copy<float>: f32 keys and values into an f32 cache (the decode path of an f32
// model), a copy with 16-byte moves when HD % 4 == 0 and the rows are aligned; scales are ignored, as
// for any cache of the keys' own dtype.
//
// NVRTC-compatible: no host code, no standard headers.
#include "decode_common.cuh"

namespace tkd {

// One element: bits = the T value's 16 bits, x = its fp32 value. A NaN keeps its sign into the fp8 NaN
// code as on the CPU (the GPU's division would return the canonical, positive NaN).
template <typename T, int KV>
__device__ __forceinline__ unsigned char quant_elem(u32 bits, float x, const float *__restrict__ scale, float s)
{
    if (KV == KV_FP8 && x != x)
        return (unsigned char)(((bits >> 8) & 0x80u) | 0x7fu);
    const float y = scale ? __fdiv_rn(x, s) : x;
    return KV == KV_I8 ? f32_to_i8(y) : f32_to_fp8_e4m3(y);
}

// One token's row of one tensor: HD = Hkv * D elements from src (T) to row `slot` of cache.
template <typename T, int KV>
__device__ __forceinline__ void append_row(void *__restrict__ cache, const T *__restrict__ src, i64 slot,
                                           const float *__restrict__ scale, int HD, int D)
{
    const int es = KV == KV_SAME ? 2 : 1;
    unsigned char *dst = reinterpret_cast<unsigned char *>(cache) + slot * HD * es;
    const bool vec = D % 8 == 0 && (reinterpret_cast<u64>(src) & 15u) == 0 &&
                     (reinterpret_cast<u64>(dst) & (u64)(8 * es - 1)) == 0;
    if (vec) {
        for (int i = threadIdx.x; i < HD / 8; i += blockDim.x) {
            const uint4 v = *reinterpret_cast<const uint4 *>(src + i * 8);
            if (KV == KV_SAME) {
                *reinterpret_cast<uint4 *>(dst + i * 16) = v;
            } else {
                const float s = scale ? scale[(i * 8) / D] : 1.0f;
                const u32 w[4] = {v.x, v.y, v.z, v.w};
                u32 out[2] = {0u, 0u};
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const float2 f = unpack2<T>(w[k]);
                    const u32 pair = (u32)quant_elem<T, KV>(w[k] & 0xffffu, f.x, scale, s) |
                                     ((u32)quant_elem<T, KV>(w[k] >> 16, f.y, scale, s) << 8);
                    out[k >> 1] |= pair << (16 * (k & 1));
                }
                *reinterpret_cast<uint2 *>(dst + i * 8) = make_uint2(out[0], out[1]);
            }
        }
    } else {
        for (int i = threadIdx.x; i < HD; i += blockDim.x) {
            if (KV == KV_SAME) {
                reinterpret_cast<T *>(dst)[i] = src[i];
            } else {
                const T x = src[i];
                dst[i] = quant_elem<T, KV>(*reinterpret_cast<const unsigned short *>(&x), to_f32(x), scale,
                                           scale ? scale[i / D] : 1.0f);
            }
        }
    }
}

} // namespace tkd

// ---- entry point (name expressions "tk_paged_kv_append<__half, 0>" ... KV: 0 same, 1 i8, 2 fp8) ---

template <typename T, int KV>
__global__ void tk_paged_kv_append(void *__restrict__ k_cache,            // [num_blocks, bs, Hkv, D] KV
                                   void *__restrict__ v_cache,            // [num_blocks, bs, Hkv, D] KV
                                   const T *__restrict__ k,               // [N, Hkv, D] T
                                   const T *__restrict__ v,               // [N, Hkv, D] T
                                   const long long *__restrict__ slot_mapping, // [N] i64
                                   const float *__restrict__ k_scale,     // [Hkv] f32, optional
                                   const float *__restrict__ v_scale,     // [Hkv] f32, optional
                                   int HD, int D, long long num_slots)
{
    const tkd::i64 tok = blockIdx.x;
    const tkd::i64 slot = slot_mapping[tok];
    if (slot < 0 || slot >= num_slots)
        return;
    tkd::append_row<T, KV>(k_cache, k + tok * HD, slot, k_scale, HD, D);
    tkd::append_row<T, KV>(v_cache, v + tok * HD, slot, v_scale, HD, D);
}

template <typename T>
__global__ void tk_paged_kv_append_copy(T *__restrict__ k_cache,             // [num_blocks, bs, Hkv, D] T
                                        T *__restrict__ v_cache,             // [num_blocks, bs, Hkv, D] T
                                        const T *__restrict__ k,             // [N, Hkv, D] T
                                        const T *__restrict__ v,             // [N, Hkv, D] T
                                        const long long *__restrict__ slot_mapping, // [N] i64
                                        const float *__restrict__ k_scale,   // unused (same-dtype cache)
                                        const float *__restrict__ v_scale,   // unused
                                        int HD, int D, long long num_slots)
{
    (void)k_scale;
    (void)v_scale;
    (void)D;
    const tkd::i64 tok = blockIdx.x;
    const tkd::i64 slot = slot_mapping[tok];
    if (slot < 0 || slot >= num_slots)
        return;
    const T *ks = k + tok * HD, *vs = v + tok * HD;
    T *kd = k_cache + slot * HD, *vd = v_cache + slot * HD;
    const int per = 16 / (int)sizeof(T);
    const bool vec = HD % per == 0 &&
                     ((reinterpret_cast<tkd::u64>(ks) | reinterpret_cast<tkd::u64>(vs) |
                       reinterpret_cast<tkd::u64>(kd) | reinterpret_cast<tkd::u64>(vd)) & 15u) == 0;
    if (vec) {
        for (int i = threadIdx.x; i < HD / per; i += blockDim.x) {
            reinterpret_cast<uint4 *>(kd)[i] = reinterpret_cast<const uint4 *>(ks)[i];
            reinterpret_cast<uint4 *>(vd)[i] = reinterpret_cast<const uint4 *>(vs)[i];
        }
    } else {
        for (int i = threadIdx.x; i < HD; i += blockDim.x) {
            kd[i] = ks[i];
            vd[i] = vs[i];
        }
    }
}
