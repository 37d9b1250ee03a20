// max_margin.cu — the max_margin_loss op of kernels-community/cross-entropy (hinge ranking loss):
//     loss[i, k] = max(0, margin - pos[i] + neg[i, k])      reduced by none / mean (over the N K pairs) / sum
//     grad_neg[i, k] = scale [margin - pos[i] + neg[i, k] > 0],  grad_pos[i] = -sum_k grad_neg[i, k]
// with scale = 1 / (N K) for mean, else 1. At the kink (exactly 0) the gradient is 0; a NaN score gives
// a NaN loss and a zero gradient.
//
// Variants: tk_max_margin_loss<T>, T = float, __half, __nv_bfloat16.
//
// Launch assumptions (kernel.json): blockDim.x = 256 (8 warps), grid.x = min(cdiv(N, 8), 1024); each
// warp takes anchors i = (blockIdx.x * 8 + warp) + j * gridDim.x * 8 and its lanes stride over the K
// negatives. Tensors contiguous; neg is (N,) (K = 1) or (N, K). grad_pos / grad_neg may be null.
//
// Numerics: fp32 per pair; the sum is fp64: each lane adds its pairs in order, the warp, the block and
// then the last block (ce_common.cuh) combine in a fixed order, so the result does not depend on timing.
//
// NVRTC-compatible: no host code, no standard headers.
#include "ce_common.cuh"

template <typename T>
__global__ void __launch_bounds__(256) tk_max_margin_loss(const T *__restrict__ pos,  // (N,) T
                                                          const T *__restrict__ neg,  // (N, K) T
                                                          float *__restrict__ loss,   // (N, K) or () f32
                                                          T *__restrict__ grad_pos,   // (N,) T or null
                                                          T *__restrict__ grad_neg,   // (N, K) T or null
                                                          float margin, tk_i64 reduction, tk_i64 n, tk_i64 k,
                                                          void *ws)
{
    using namespace tk_ce;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float scale = reduction == RED_MEAN ? (n * k > 0 ? (float)(1.0 / (double)(n * k)) : 0.0f) : 1.0f;
    double sum = 0.0;
    for (tk_i64 i = (tk_i64)blockIdx.x * 8 + warp; i < n; i += (tk_i64)gridDim.x * 8) {
        const float p = to_f32(pos[i]);
        int active = 0;
        for (tk_i64 q = lane; q < k; q += 32) {
            const float hng = margin - p + to_f32(neg[i * k + q]);
            const float l = hng > 0.0f ? hng : (hng <= 0.0f ? 0.0f : hng); // NaN stays NaN
            const bool on = hng > 0.0f;
            active += on;
            if (reduction == RED_NONE)
                loss[i * k + q] = l;
            else
                sum += (double)l;
            if (grad_neg)
                grad_neg[i * k + q] = from_f32<T>(on ? scale : 0.0f);
        }
        if (grad_pos) {
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
                active += __shfl_xor_sync(0xffffffffu, active, o);
            if (lane == 0)
                grad_pos[i] = from_f32<T>(-(float)active * scale);
        }
    }
    if (reduction == RED_NONE)
        return;
    // the block's sum (fixed order), then across blocks; the count slot carries N K for mean
    const double total = block_sum(sum);
    finish_loss(ws, total, blockIdx.x == 0 ? (double)(n * k) : 0.0, loss, reduction);
}
