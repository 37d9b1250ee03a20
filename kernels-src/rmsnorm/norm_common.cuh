// norm_common.cuh — what the kernels of kernels-community/rmsnorm share beyond tk's device toolkit
// (<tk/device.cuh>: conversions, 16-byte packs, the K-way block sum): scalar-or-vector units and the
// deterministic cross-block sum behind grad_weight/grad_bias.
//
// NVRTC-compatible: no host code, no standard headers, only <tk/device.cuh>.
#pragma once

#include <tk/device.cuh>

namespace tk_norm {

using namespace tk; // to_f32, from_f32, Vec, Pack, aligned16, block_sum (<tk/device.cuh>)

// ---- vector loads ------------------------------------------------------------------------------

// U elements of T loaded and stored as one unit: U = Vec<T>::N (a 16-byte vector) or 1 (a scalar).
template <typename T, int U> struct alignas(sizeof(T) * U) Units {
    T v[U];
};

// ---- grad_weight / grad_bias across blocks -----------------------------------------------------
//
// Each block of the backward kernels leaves its partial sums (fp32, d columns) in its own row of a
// zero-filled workspace: ws = [pw: gridDim.x x d][pb: gridDim.x x d, layer norm][counters]. The blocks
// then meet in groups of GROUP: the last of each group to arrive (threadfence + atomicAdd on the group's
// counter) adds the group's rows in block order into the group's first row; the last group to finish
// adds the group rows in group order and writes the result, rounded once to T. The order of every sum
// is fixed, so the result is deterministic (it does not depend on which block arrives when).

constexpr int GROUP = 16;

// The workspace bytes the launch rule must give: the partials (P = 1 or 2 arrays) and the counters.
//   4 * P * gridDim.x * d + 4 * (cdiv(gridDim.x, GROUP) + 1)

// For j < d: acc = sum over k < n, in order, of src[k * stride + j]; then sink(j, acc) (VW columns at
// a time: VW = 4 needs d % 4 == 0 and src 16-byte aligned, with stride % 4 == 0). Loads bypass L1
// (other blocks wrote them).
template <int VW, typename Sink>
__device__ __forceinline__ void column_sums(const float *src, tk_i64 stride, int n, tk_i64 d, Sink sink)
{
    constexpr int KB = 4; // rows loaded ahead per thread (16 floats with VW = 4)
    for (tk_i64 j = (tk_i64)threadIdx.x * VW; j < d; j += (tk_i64)blockDim.x * VW) {
        float acc[VW];
#pragma unroll
        for (int e = 0; e < VW; e++)
            acc[e] = 0.0f;
        for (int k0 = 0; k0 < n; k0 += KB) {
            float t[KB][VW];
#pragma unroll
            for (int kk = 0; kk < KB; kk++) {
                if (k0 + kk >= n)
                    continue;
                const float *p = src + (tk_i64)(k0 + kk) * stride + j;
                if constexpr (VW == 4) {
                    float4 q = __ldcg(reinterpret_cast<const float4 *>(p));
                    t[kk][0] = q.x;
                    t[kk][1] = q.y;
                    t[kk][2] = q.z;
                    t[kk][3] = q.w;
                } else {
                    t[kk][0] = __ldcg(p);
                }
            }
#pragma unroll
            for (int kk = 0; kk < KB; kk++) {
                if (k0 + kk >= n)
                    continue;
#pragma unroll
                for (int e = 0; e < VW; e++)
                    acc[e] += t[kk][e];
            }
        }
        sink(j, acc);
    }
}

// Adds the n rows at src (row stride `stride`) column by column; the sums go to dst32 (fp32) when it
// is not null, else to dst (rounded to T; dst may be null: nothing to write).
template <typename T>
__device__ __forceinline__ void sum_rows(const float *src, tk_i64 stride, int n, tk_i64 d, float *dst32, T *dst)
{
    if (d % 4 == 0 && aligned16(src) && (!dst32 || aligned16(dst32))) {
        column_sums<4>(src, stride, n, d, [&](tk_i64 j, const float(&a)[4]) {
            if (dst32) {
                *reinterpret_cast<float4 *>(dst32 + j) = make_float4(a[0], a[1], a[2], a[3]);
            } else if (dst) {
#pragma unroll
                for (int e = 0; e < 4; e++)
                    dst[j + e] = from_f32<T>(a[e]);
            }
        });
    } else {
        column_sums<1>(src, stride, n, d, [&](tk_i64 j, const float(&a)[1]) {
            if (dst32)
                dst32[j] = a[0];
            else if (dst)
                dst[j] = from_f32<T>(a[0]);
        });
    }
}

// Called by every thread of every block once its partial rows are in the workspace (after the block's
// own writes). Returns in all but the last block; that one writes gw (and gb when not null).
template <typename T>
__device__ void combine_partials(T *gw, T *gb, float *ws, int narrays, tk_i64 d)
{
    __shared__ unsigned last;
    const tk_i64 G = gridDim.x;
    const unsigned g = blockIdx.x / GROUP, ng = (unsigned)((G + GROUP - 1) / GROUP);
    const int gsize = (int)min((tk_i64)GROUP, G - (tk_i64)g * GROUP);
    float *pw = ws, *pb = ws + G * d;
    unsigned *cnt = reinterpret_cast<unsigned *>(ws + (tk_i64)narrays * G * d);

    __threadfence(); // this thread's partials are visible device-wide before the block is counted
    __syncthreads();
    if (threadIdx.x == 0)
        last = atomicAdd(&cnt[g], 1u) == (unsigned)gsize - 1;
    __syncthreads();
    if (!last)
        return;
    __threadfence();

    // The group's rows, in block order, into its first row (or straight to the result: one group).
    const tk_i64 first = (tk_i64)g * GROUP * d;
    sum_rows<T>(pw + first, d, gsize, d, ng == 1 ? nullptr : pw + first, gw);
    if (gb)
        sum_rows<T>(pb + first, d, gsize, d, ng == 1 ? nullptr : pb + first, gb);
    if (ng == 1)
        return;

    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0)
        last = atomicAdd(&cnt[ng], 1u) == ng - 1;
    __syncthreads();
    if (!last)
        return;
    __threadfence();
    sum_rows<T>(pw, (tk_i64)GROUP * d, (int)ng, d, nullptr, gw);
    if (gb)
        sum_rows<T>(pb, (tk_i64)GROUP * d, (int)ng, d, nullptr, gb);
}

} // namespace tk_norm
