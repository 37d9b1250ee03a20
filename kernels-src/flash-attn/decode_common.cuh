// decode_common.cuh — device code shared by the decode kernels of kernels-community/flash-attn
// (decode.cu: attention_decode, mla_decode.cu: mla_decode, paged_kv_append.cu: paged_kv_append).
//
// What is here:
//   - 16-byte stores of f16 / bf16 pairs packed in 32-bit registers (tk::pack2, the operand format of
//     the tensor-core instructions);
//   - the PTX wrappers (mma.sync m16n8k16 with fp32 accumulation, movmatrix, ldmatrix, cp.async);
//   - loads of 8 consecutive KV-cache elements as 4 packed pairs of T, dequantising 8-bit caches
//     (i8, fp8 e4m3fn) exactly into T in registers (every i8 and e4m3 value is exact in f16 and bf16);
//   - (the quantisers of paged_kv_append, bit for bit those of the CPU references (ops/dtype.c), are
//     tk::f32_to_i8 and tk::f32_to_fp8_e4m3 of the device toolkit);
//   - the split-KV combine run by the last CTA of a split reduction.
//
// Numerics shared by the attention kernels: scores and the online softmax are fp32, kept in the base-2
// domain (score * log2(e)) so exp2f does the exponentials; P is rounded to T for the P·V product, the
// running sum l is accumulated from the unrounded fp32 P (as flash-attention does).
//
// NVRTC-compatible: no host code, no standard headers. TKD_HOST_SIM is defined only by a host-side
// simulator used while developing these kernels (it provides the PTX wrappers itself); the package
// never defines it.
#pragma once
#include <tk/device.cuh>

namespace tkd {

// pack2 / unpack2 (f16 and bf16 pairs), f32_to_i8, f32_to_fp8_e4m3, cdiv (<tk/device.cuh>)
using namespace tk;

typedef long long i64;
typedef unsigned int u32;
typedef unsigned long long u64;

// The element type of a KV cache relative to the query dtype T.
enum { KV_SAME = 0, KV_I8 = 1, KV_FP8 = 2 };

#define TKD_LOG2E 1.4426950408889634f
#define TKD_LN2 0.6931471805599453f

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// 8 floats rounded to T and stored with one 16-byte store (p 16-byte aligned).
template <typename T> __device__ __forceinline__ void store8(T *p, const float (&v)[8])
{
    uint4 w;
    w.x = pack2<T>(v[0], v[1]);
    w.y = pack2<T>(v[2], v[3]);
    w.z = pack2<T>(v[4], v[5]);
    w.w = pack2<T>(v[6], v[7]);
    *reinterpret_cast<uint4 *>(p) = w;
}

// ---- PTX wrappers -----------------------------------------------------------------------------

#ifndef TKD_HOST_SIM

// d += A (16x16, row) * B (16x8, col), fp32 accumulate. Fragments (g = lane / 4, t = lane % 4):
//   a0 (row g, k 2t..2t+1), a1 (row g+8, k 2t..), a2 (row g, k 2t+8..), a3 (row g+8, k 2t+8..);
//   b0 (k 2t..2t+1, col g), b1 (k 2t+8.., col g);  d0,d1 (row g, col 2t..2t+1), d2,d3 (row g+8, ...).
template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1);

template <>
__device__ __forceinline__ void mma16816<__half>(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                                        u32 b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Transposes an 8x8 matrix of 16-bit elements held one row per 4 lanes (lane l: row l/4, columns
// 2(l%4), 2(l%4)+1): afterwards lane l holds column l/4, rows 2(l%4) and 2(l%4)+1 of the input.
__device__ __forceinline__ u32 movmatrix_t(u32 x)
{
    u32 y;
    asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}

__device__ __forceinline__ u32 smem_u32(const void *p) { return (u32)__cvta_generic_to_shared(p); }

// Four 8x8 matrices of 16-bit elements from shared memory; lanes 8i..8i+7 give the row addresses of
// matrix i (16 bytes each), r[i] receives matrix i in the fragment layout above (.trans: transposed).
__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

// 16 bytes global -> shared, asynchronously; when !valid nothing is read and the 16 bytes are zeroed.
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

#endif // TKD_HOST_SIM

// ---- 8-bit KV dequantisation (exact) ----------------------------------------------------------

// Two int8 (bytes 0,1 of w when hi == 0, bytes 2,3 when hi == 1) as a packed pair of T.
template <typename T> __device__ __forceinline__ u32 i8_pair(u32 w, int hi);

template <> __device__ __forceinline__ u32 i8_pair<__half>(u32 w, int hi)
{
    // byte b -> half 0x64xx with xx = b ^ 0x80: the value 1024 + (b + 128); subtract 1152
    u32 v = __byte_perm(w ^ 0x80808080u, 0x64646464u, hi ? 0x5342 : 0x5140);
    __half2 h = *reinterpret_cast<__half2 *>(&v);
    h = __hsub2(h, __float2half2_rn(1152.0f));
    return *reinterpret_cast<u32 *>(&h);
}

template <> __device__ __forceinline__ u32 i8_pair<__nv_bfloat16>(u32 w, int hi)
{
    const u32 x = w ^ 0x80808080u;
    const u32 b0 = (x >> (hi ? 16 : 0)) & 0xffu, b1 = (x >> (hi ? 24 : 8)) & 0xffu;
    // 2^23 + u is exact in fp32; subtracting 2^23 + 128 gives the signed byte exactly
    const float f0 = __uint_as_float(0x4b000000u | b0) - 8388736.0f;
    const float f1 = __uint_as_float(0x4b000000u | b1) - 8388736.0f;
    return pack2<__nv_bfloat16>(f0, f1);
}

// Two fp8 e4m3fn bytes as a half2: the byte S.EEEE.MMM shifted into S.0EEEE.MMM0000000 is the half
// with the same bits scaled by 2^-8 (normals and subnormals alike), so one exact multiply by 256
// finishes. The NaN codes (S.1111.111) come out as +-480.
__device__ __forceinline__ __half2 fp8x2_to_half2(u32 w, int hi)
{
    const u32 v = __byte_perm(w, 0u, hi ? 0x3424 : 0x1404); // bytes [0, b_lo, 0, b_hi]
    u32 h = (v & 0x80008000u) | ((v & 0x7f007f00u) >> 1);
    __half2 r = *reinterpret_cast<__half2 *>(&h);
    return __hmul2(r, __float2half2_rn(256.0f));
}

template <typename T> __device__ __forceinline__ u32 fp8_pair(u32 w, int hi);

template <> __device__ __forceinline__ u32 fp8_pair<__half>(u32 w, int hi)
{
    __half2 h = fp8x2_to_half2(w, hi);
    return *reinterpret_cast<u32 *>(&h);
}

template <> __device__ __forceinline__ u32 fp8_pair<__nv_bfloat16>(u32 w, int hi)
{
    const float2 f = __half22float2(fp8x2_to_half2(w, hi)); // exact, then exact in bf16
    return pack2<__nv_bfloat16>(f.x, f.y);
}

// 8 consecutive cache elements starting at element index off (8-element aligned) as 4 packed pairs
// of T: r[i] holds elements 2i (low half) and 2i+1 (high half). 16-byte loads for a 16-bit cache,
// 8-byte loads for an 8-bit one.
template <typename T, int KV>
__device__ __forceinline__ void load8(u32 (&r)[4], const void *__restrict__ base, i64 off)
{
    if (KV == KV_SAME) {
        const uint4 v = __ldg(reinterpret_cast<const uint4 *>(reinterpret_cast<const T *>(base) + off));
        r[0] = v.x;
        r[1] = v.y;
        r[2] = v.z;
        r[3] = v.w;
    } else {
        const uint2 v = __ldg(reinterpret_cast<const uint2 *>(reinterpret_cast<const unsigned char *>(base) + off));
        if (KV == KV_I8) {
            r[0] = i8_pair<T>(v.x, 0);
            r[1] = i8_pair<T>(v.x, 1);
            r[2] = i8_pair<T>(v.y, 0);
            r[3] = i8_pair<T>(v.y, 1);
        } else {
            r[0] = fp8_pair<T>(v.x, 0);
            r[1] = fp8_pair<T>(v.x, 1);
            r[2] = fp8_pair<T>(v.y, 0);
            r[3] = fp8_pair<T>(v.y, 1);
        }
    }
}

// ---- split-KV combine -------------------------------------------------------------------------

// The workspace of a split reduction over U units (a unit: one output tile of ht rows), ns splits
// each: a u32 arrival counter per unit, then (m, l) per unit, split and row (float2: the row max of
// the base-2 scores and the sum of exp2(score - m)), then the unnormalised fp32 output rows.
struct SplitWs {
    u32 *cnt;
    float2 *ml; // [U][ns][ht]
    float *o;   // [U][ns][ht][D]
};

__device__ __forceinline__ SplitWs split_ws(unsigned char *ws, i64 U, int ns, int ht)
{
    SplitWs w;
    w.cnt = reinterpret_cast<u32 *>(ws);
    w.ml = reinterpret_cast<float2 *>(ws + ((U * 4 + 15) / 16) * 16);
    w.o = reinterpret_cast<float *>(w.ml + U * ns * ht);
    return w;
}

// Run by every thread of the CTA that arrived last for unit u, after __threadfence(): combines the
// `active` splits of the unit (rows 0..rows-1) with the log-sum-exp rescaling and writes the output
// rows (times oscale) and lse (when given). sW: shared memory for active * ht floats. The partials
// are read with ld.global.cg (L2) since other CTAs wrote them.
//   Map::out_row(r): the output row of tile row r (element offset / D); Map::lse_idx(r): its lse index.
template <typename T, int D, int NT, class Map>
__device__ __forceinline__ void split_combine(T *out, float *lse, const SplitWs &w, i64 u, int ns, int active,
                                              int ht, int rows, float oscale, float *sW, const Map &map)
{
    const int tid = threadIdx.x;
    for (int r = tid; r < rows; r += NT) {
        float M = neg_inf();
        for (int s = 0; s < active; s++)
            M = fmaxf(M, __ldcg(&w.ml[(u * ns + s) * ht + r]).x);
        float L = 0.0f;
        if (M != neg_inf())
            for (int s = 0; s < active; s++) {
                const float2 ml = __ldcg(&w.ml[(u * ns + s) * ht + r]);
                if (ml.x != neg_inf())
                    L += ml.y * exp2f(ml.x - M);
            }
        const float inv = L > 0.0f ? 1.0f / L : 0.0f;
        for (int s = 0; s < active; s++) {
            const float2 ml = __ldcg(&w.ml[(u * ns + s) * ht + r]);
            sW[s * ht + r] = (L > 0.0f && ml.x != neg_inf()) ? exp2f(ml.x - M) * inv : 0.0f;
        }
        if (lse)
            lse[map.lse_idx(r)] = L > 0.0f ? (M + log2f(L)) * TKD_LN2 : neg_inf();
    }
    __syncthreads();
    constexpr int C8 = D / 8;
    for (int idx = tid; idx < rows * C8; idx += NT) {
        const int r = idx / C8, c = idx - r * C8;
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        for (int s = 0; s < active; s++) {
            const float wt = sW[s * ht + r];
            if (wt != 0.0f) {
                const float4 *p = reinterpret_cast<const float4 *>(w.o + ((u * ns + s) * ht + r) * D + c * 8);
                const float4 x0 = __ldcg(p), x1 = __ldcg(p + 1);
                acc[0] = fmaf(wt, x0.x, acc[0]);
                acc[1] = fmaf(wt, x0.y, acc[1]);
                acc[2] = fmaf(wt, x0.z, acc[2]);
                acc[3] = fmaf(wt, x0.w, acc[3]);
                acc[4] = fmaf(wt, x1.x, acc[4]);
                acc[5] = fmaf(wt, x1.y, acc[5]);
                acc[6] = fmaf(wt, x1.z, acc[6]);
                acc[7] = fmaf(wt, x1.w, acc[7]);
            }
        }
#pragma unroll
        for (int k = 0; k < 8; k++)
            acc[k] *= oscale;
        store8<T>(out + map.out_row(r) * D + c * 8, acc);
    }
}

} // namespace tkd
