// fwd_simple.cu — the `attention` op on CUDA cores: one warp per query row. For tiny problems (where
// a 64/128-row tensor-core tile is mostly padding and launch latency dominates) and for any head dim
// D <= 512 (the tensor-core kernels take D = 64, 128, 256 only), in f32, f16 and bf16.
//
// Variants: tk_fa::fwd_simple<T, 512> for T = float, __half, __nv_bfloat16.
// Launch: grid (cdiv(rows, 4), Hq, sequences), block 128 (4 warps, warp w takes row 4 * blockIdx.x + w,
// grid-strided), static shared memory 8 KiB (the warps' query rows in fp32). Same tensors, masks and
// varlen rules as fwd_sm80.cu (see common.cuh); contiguous tensors, any alignment.
//
// Per row: keys are taken 32 at a time, lane j scoring key j0 + j (q from shared memory, k read with
// 16-byte loads when rows are 16-byte aligned); the warp's max and an online-softmax update follow,
// then every lane accumulates its D / 32 output columns over the 32 weights (v read coalesced).
// Numerics: fp32 throughout; exp2 via ex2.approx; output rounded once to T.
//
// NVRTC-compatible: no host code, no standard headers.
#include "common.cuh"

namespace tk_fa {

template <typename T> struct __align__(16) Pack16 {
    T v[16 / sizeof(T)];
};

template <typename T, int DMAX>
__global__ void __launch_bounds__(128, 4)
fwd_simple(T *__restrict__ out,              // (B, Sq, Hq, D)
           const T *__restrict__ q,          // (B, Sq, Hq, D)
           const T *__restrict__ k,          // (B, Sk, Hkv, D)
           const T *__restrict__ v,          // (B, Sk, Hkv, D)
           float *__restrict__ lse,          // (B, Hq, Sq) or null
           const int *__restrict__ cu_q,     // (nseq + 1) or null
           const int *__restrict__ cu_k,     // (nseq + 1) or null
           int max_seqlen_q,                 // only the launch rule uses it
           const float *__restrict__ alibi,  // (Hq) or null
           float scale, int causal, int window_left, int window_right, float softcap,
           int B, int Sq, int Sk, int Hq, int Hkv, int nseq, int D)
{
    constexpr int RPB = 4, NV = DMAX / 32, VN = 16 / (int)sizeof(T);
    __shared__ float sq_[RPB][DMAX];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int h = blockIdx.y, hk = h / (Hq / Hkv);
    (void)max_seqlen_q;
    if (D > DMAX)
        return; // the manifest's constraints keep D <= DMAX

    if (scale == 0.0f)
        scale = rsqrtf((float)D);
    const bool use_sc = softcap > 0.0f;
    const float mul = use_sc ? scale / softcap : scale * TK_FA_LOG2E;
    const float sc_l2 = use_sc ? softcap * TK_FA_LOG2E : 0.0f;
    const float slope_l2 = alibi ? __ldg(alibi + h) * TK_FA_LOG2E : 0.0f;
    const i64 qstride = (i64)Hq * D, kstride = (i64)Hkv * D;
    // 16-byte k loads: every row starts 16-byte aligned
    const bool vec = (D % VN) == 0 && (reinterpret_cast<u64>(k) & 15) == 0;

    for (int s = blockIdx.z;; s += gridDim.z) {
        Seq sn;
        if (!seq_at(&sn, s, cu_q, cu_k, nseq, B, Sq, Sk))
            break;
        Mask mk;
        mk.sq = sn.sq;
        mk.sk = sn.sk;
        mk.off = sn.sk - sn.sq;
        mk.wl = window_left;
        mk.wr = causal ? 0 : window_right;
        const T *kb = k + ((i64)sn.b * Sk + sn.k0) * kstride + (i64)hk * D;
        const T *vb = v + ((i64)sn.b * Sk + sn.k0) * kstride + (i64)hk * D;

        for (int i0 = blockIdx.x * RPB; i0 < sn.sq; i0 += gridDim.x * RPB) {
            const int i = i0 + warp; // warp-uniform
            if (i >= sn.sq)
                continue;
            const i64 row = (i64)sn.b * Sq + sn.q0 + i;
            const T *qr = q + row * qstride + (i64)h * D;
            __syncwarp();
            for (int d = lane; d < D; d += 32)
                sq_[warp][d] = to_f32(qr[d]);
            __syncwarp();

            const int p = i + mk.off;
            int klo, khi;
            key_range(&klo, &khi, mk, i, i + 1);
            float m = TK_FA_NEG_INF, l = 0.0f, o[NV];
#pragma unroll
            for (int e = 0; e < NV; e++)
                o[e] = 0.0f;

            for (int j0 = klo; j0 < khi; j0 += 32) {
                const int j = j0 + lane;
                float x = TK_FA_NEG_INF;
                if (j < khi && mk.visible(p, j)) {
                    const T *kr = kb + (i64)j * kstride;
                    float dot = 0.0f;
                    if (vec) {
                        for (int d = 0; d < D; d += VN) {
                            const Pack16<T> pk = *reinterpret_cast<const Pack16<T> *>(kr + d);
#pragma unroll
                            for (int u = 0; u < VN; u++)
                                dot = fmaf(sq_[warp][d + u], to_f32(pk.v[u]), dot);
                        }
                    } else {
                        for (int d = 0; d < D; d++)
                            dot = fmaf(sq_[warp][d], to_f32(kr[d]), dot);
                    }
                    x = score_l2(dot, mul, sc_l2, use_sc, slope_l2, p, j);
                }
                const float mx = warp_max(x);
                const float mnew = fmaxf(m, mx);
                const float mu = mnew == TK_FA_NEG_INF ? 0.0f : mnew;
                const float corr = ex2(m - mu);
                const float pj = ex2(x - mu);
                m = mnew;
                l = l * corr + pj; // per-lane partial sums, reduced at the end
#pragma unroll
                for (int e = 0; e < NV; e++)
                    o[e] *= corr;
                const int nj = min(32, khi - j0);
                for (int jj = 0; jj < nj; jj++) {
                    const float w = __shfl_sync(0xffffffffu, pj, jj);
                    if (w == 0.0f) // warp-uniform: masked or underflowed
                        continue;
                    const T *vr = vb + (i64)(j0 + jj) * kstride;
#pragma unroll
                    for (int e = 0; e < NV; e++) {
                        const int d = lane + 32 * e;
                        if (d < D)
                            o[e] = fmaf(w, to_f32(vr[d]), o[e]);
                    }
                }
            }
            l = warp_sum(l);
            const float inv = l > 0.0f ? 1.0f / l : 0.0f;
            T *orow = out + row * qstride + (i64)h * D;
#pragma unroll
            for (int e = 0; e < NV; e++) {
                const int d = lane + 32 * e;
                if (d < D)
                    orow[d] = from_f32<T>(o[e] * inv);
            }
            if (lse && lane == 0)
                lse[((i64)sn.b * Hq + h) * Sq + sn.q0 + i] = l > 0.0f ? (m + log2f(l)) * TK_FA_LN2 : TK_FA_NEG_INF;
        }
    }
}

} // namespace tk_fa
