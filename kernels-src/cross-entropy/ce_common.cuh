// ce_common.cuh — pieces shared by the kernels of kernels-community/cross-entropy: the online
// log-sum-exp state and its block reduction, and the one-launch cross-block reduction of a loss
// (partials in the workspace, the last block to arrive combines them in block order). Conversions,
// 16-byte packs and the block sum come from tk's device toolkit, <tk/device.cuh>.
//
// NVRTC-compatible: no host code, no standard headers.
#pragma once
#include <tk/device.cuh>

namespace tk_ce {

using namespace tk; // to_f32, from_f32, Vec, Pack, aligned16, block_sum (<tk/device.cuh>)

enum { RED_NONE = 0, RED_MEAN = 1, RED_SUM = 2 };

#define TK_CE_NEG_INF (-__int_as_float(0x7f800000))

// Online state of a row (or part of one): m = max, d = sum exp(x - m), s = sum (m - x) (each term
// >= 0, so the smoothing term has no cancellation), n = elements seen.
// A -inf element has probability 0 and adds +inf to s; a NaN makes d NaN; +inf makes d NaN through
// exp(inf - inf). While every element seen is -inf, m = -inf and d = s = 0.
struct Lse {
    float m, d, s;
    int n;
};

__device__ __forceinline__ Lse lse_init()
{
    Lse r;
    r.m = TK_CE_NEG_INF;
    r.d = 0.0f;
    r.s = 0.0f;
    r.n = 0;
    return r;
}

// Folds `cnt` values x[0..cnt) (those with ok[i]) into st.
template <int K>
__device__ __forceinline__ void lse_fold(Lse &st, const float (&x)[K], const bool (&ok)[K])
{
    float bm = TK_CE_NEG_INF;
    int cnt = 0;
#pragma unroll
    for (int i = 0; i < K; i++)
        if (ok[i]) {
            bm = fmaxf(bm, x[i]); // NaN is ignored here and caught by exp below
            cnt++;
        }
    if (cnt == 0)
        return;
    const float mn = fmaxf(st.m, bm);
    if (mn == TK_CE_NEG_INF) { // everything so far is -inf (or NaN)
#pragma unroll
        for (int i = 0; i < K; i++)
            if (ok[i] && x[i] != x[i])
                st.d = x[i];
        st.n += cnt;
        return;
    }
    st.d *= expf(st.m - mn); // m = -inf: d was 0 (or NaN, which stays)
    if (st.n)
        st.s += (float)st.n * (mn - st.m); // m = -inf: +inf, those elements are -inf
#pragma unroll
    for (int i = 0; i < K; i++)
        if (ok[i]) {
            st.d += expf(x[i] - mn);
            st.s += mn - x[i];
        }
    st.m = mn;
    st.n += cnt;
}

__device__ __forceinline__ Lse lse_merge(const Lse &a, const Lse &b)
{
    Lse r;
    r.m = fmaxf(a.m, b.m);
    r.n = a.n + b.n;
    if (r.m == TK_CE_NEG_INF) {
        r.d = a.d + b.d; // 0, or NaN carried
        r.s = 0.0f;
        return r;
    }
    r.d = a.d * expf(a.m - r.m) + b.d * expf(b.m - r.m);
    r.s = a.s + b.s + (a.n ? (float)a.n * (r.m - a.m) : 0.0f) + (b.n ? (float)b.n * (r.m - b.m) : 0.0f);
    return r;
}

__device__ __forceinline__ Lse lse_shfl_xor(const Lse &a, int o)
{
    Lse r;
    r.m = __shfl_xor_sync(0xffffffffu, a.m, o);
    r.d = __shfl_xor_sync(0xffffffffu, a.d, o);
    r.s = __shfl_xor_sync(0xffffffffu, a.s, o);
    r.n = __shfl_xor_sync(0xffffffffu, a.n, o);
    return r;
}

// The merged state of the whole block, returned to every thread. blockDim.x is a multiple of 32.
// Starts with a barrier, so the shared slots may be reused by consecutive calls.
__device__ __forceinline__ Lse block_lse(Lse v)
{
    __shared__ Lse slots[32];
    __shared__ Lse total;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = lse_merge(v, lse_shfl_xor(v, o));
    __syncthreads();
    if (lane == 0)
        slots[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < nwarps ? slots[lane] : lse_init();
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            v = lse_merge(v, lse_shfl_xor(v, o));
        if (lane == 0)
            total = v;
    }
    __syncthreads();
    return total;
}

// The number of targets that are not ignore_index, over all n (every block reads all of them: 8n
// bytes from L2 per block, once per launch).
__device__ __forceinline__ double count_valid(const tk_i64 *__restrict__ target, tk_i64 n, tk_i64 ignore_index)
{
    double c = 0.0;
    for (tk_i64 i = threadIdx.x; i < n; i += blockDim.x)
        c += target[i] != ignore_index ? 1.0 : 0.0;
    return block_sum(c);
}

// Workspace bytes the reduction needs for `blocks` blocks: two doubles a block and a counter.
// Layout: psum[blocks] | pcnt[blocks] | counter (u32, padded to 16 bytes).

// Called by every thread of every block after its rows are done (thread 0's part_sum / part_cnt
// count). For reduction mean or sum, the last block to arrive writes loss[0] = sum (or sum / count,
// 0 when count is 0), adding the partials in block order so the result does not depend on timing.
__device__ __forceinline__ void finish_loss(void *ws, double part_sum, double part_cnt, float *loss,
                                            tk_i64 reduction)
{
    if (reduction == RED_NONE)
        return;
    double *psum = reinterpret_cast<double *>(ws);
    double *pcnt = psum + gridDim.x;
    unsigned *counter = reinterpret_cast<unsigned *>(pcnt + gridDim.x);
    __shared__ int is_last;
    __syncthreads();
    if (threadIdx.x == 0) {
        psum[blockIdx.x] = part_sum;
        pcnt[blockIdx.x] = part_cnt;
        __threadfence();
        is_last = atomicAdd(counter, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!is_last || threadIdx.x >= 32)
        return;
    __threadfence();
    // warp 0: lane l adds blocks l, l + 32, ... in order, then a fixed shuffle tree
    double s = 0.0, c = 0.0;
    for (unsigned b = threadIdx.x; b < gridDim.x; b += 32) {
        s += __ldcg(psum + b);
        c += __ldcg(pcnt + b);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        s += __shfl_xor_sync(0xffffffffu, s, o);
        c += __shfl_xor_sync(0xffffffffu, c, o);
    }
    if (threadIdx.x == 0)
        loss[0] = (float)(reduction == RED_MEAN ? (c > 0.0 ? s / c : 0.0) : s);
}

} // namespace tk_ce
