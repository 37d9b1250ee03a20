// bwd_simple.cu — the `attention_backward` op on CUDA cores: one warp per row, in f32, f16 and bf16,
// for any head dim D <= 512, GQA, every mask of the forward (causal, windows, ALiBi, softcap) and the
// varlen batch (cu_seqlens), which the tensor-core backward (bwd_sm80.cu: D 64/128/256, bf16/f16, no
// varlen) does not take. Training's attention on small heads, f32 models and packed batches runs here.
//
// Variants: tk_fa::bwd_simple<T, 512> for T = float, __half, __nv_bfloat16.
// Launch: grid (any x, Hq + Hkv, sequences: B, or varlen max(nseq, 1)), block 128 (4 warps).
// blockIdx.y < Hq: the warps compute dq for query rows of head y (rows 4 * blockIdx.x + warp,
// grid-strided); otherwise dk and dv for key rows of kv head y - Hq. Static shared memory 16 KiB.
// Contiguous tensors, any element-aligned address (scalar loads only); no workspace and no atomics:
// every output row is written once, by one warp, in a fixed order, so the result is deterministic.
// Varlen rows no sequence owns get zero gradients.
//
// Per query row i (head h): D_i = dout_i . out_i; for each visible key j (32 at a time, lane j0 + l):
//   P_ij = 2^(x_ij - lse_i log2 e)   (x the forward's log2-domain score, lse the forward's)
//   dS_ij = P_ij (dout_i . v_j - D_i) (1 - tanh^2 with softcap)
//   dq_i += scale dS_ij k_j           (lane-owned columns; the weights shuffled from lane to lane)
// Per key row j (kv head hk): over the group's query heads and the queries that see j, recomputing
// P, D_i and dS the same way: dv_j += P_ij dout_i, dk_j += scale dS_ij q_i.
// Numerics: fp32 (fmaf dot products, ex2.approx), each output rounded once to T.
//
// NVRTC-compatible: no host code, no standard headers.
#include "common.cuh"

namespace tk_fa {

template <typename T, int DMAX>
__global__ void __launch_bounds__(128, 2)
bwd_simple(T *__restrict__ dq,               // (B, Sq, Hq, D)
           T *__restrict__ dk,               // (B, Sk, Hkv, D)
           T *__restrict__ dv,               // (B, Sk, Hkv, D)
           const T *__restrict__ dout,       // (B, Sq, Hq, D)
           const T *__restrict__ q,          // (B, Sq, Hq, D)
           const T *__restrict__ k,          // (B, Sk, Hkv, D)
           const T *__restrict__ v,          // (B, Sk, Hkv, D)
           const T *__restrict__ o,          // (B, Sq, Hq, D) the forward's out
           const float *__restrict__ lse,    // (B, Hq, Sq) natural log
           const float *__restrict__ alibi,  // (Hq) or null
           float scale, int causal, int window_left, int window_right, float softcap,
           const int *__restrict__ cu_q,     // (nseq + 1) or null
           const int *__restrict__ cu_k,     // (nseq + 1) or null
           int max_seqlen_q,                 // only the launch rule uses it
           int B, int Sq, int Sk, int Hq, int Hkv, int nseq, int D)
{
    constexpr int RPB = 4, NV = DMAX / 32;
    __shared__ float sa[RPB][DMAX], sb[RPB][DMAX];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    (void)max_seqlen_q;
    if (D > DMAX)
        return; // the manifest's constraints keep D <= DMAX
    if (scale == 0.0f)
        scale = rsqrtf((float)D);
    const bool use_sc = softcap > 0.0f;
    const float mul = use_sc ? scale / softcap : scale * TK_FA_LOG2E;
    const float sc_l2 = use_sc ? softcap * TK_FA_LOG2E : 0.0f;
    const int g = Hq / Hkv;
    const bool is_q = (int)blockIdx.y < Hq;
    const i64 qs = (i64)Hq * D, ks = (i64)Hkv * D;

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
        const i64 qbase = (i64)sn.b * Sq + sn.q0, kbase = (i64)sn.b * Sk + sn.k0;
        const int rows = is_q ? sn.sq : sn.sk;
        for (int r0 = blockIdx.x * RPB; r0 < rows; r0 += gridDim.x * RPB) {
            const int r = r0 + warp; // warp-uniform
            if (r >= rows)
                continue;
            float acc_a[NV], acc_b[NV];
#pragma unroll
            for (int e = 0; e < NV; e++)
                acc_a[e] = acc_b[e] = 0.0f;
            __syncwarp();
            if (is_q) {
                // ---- dq of query r, head h ----
                const int h = blockIdx.y, hk = h / g, p = r + mk.off;
                const i64 row = qbase + r;
                const T *qr = q + row * qs + (i64)h * D, *dr = dout + row * qs + (i64)h * D,
                        *orow = o + row * qs + (i64)h * D;
                float di = 0.0f;
                for (int d = lane; d < D; d += 32) {
                    sa[warp][d] = to_f32(qr[d]);
                    sb[warp][d] = to_f32(dr[d]);
                    di = fmaf(sb[warp][d], to_f32(orow[d]), di);
                }
                di = warp_sum(di);
                __syncwarp();
                const float l2 = lse[((i64)sn.b * Hq + h) * Sq + sn.q0 + r] * TK_FA_LOG2E;
                const float slope_l2 = alibi ? __ldg(alibi + h) * TK_FA_LOG2E : 0.0f;
                int klo, khi;
                key_range(&klo, &khi, mk, r, r + 1);
                for (int j0 = klo; j0 < khi; j0 += 32) {
                    const int j = j0 + lane;
                    float ds = 0.0f;
                    if (j < khi && mk.visible(p, j) && l2 != TK_FA_NEG_INF) {
                        const T *kr = k + (kbase + j) * ks + (i64)hk * D, *vr = v + (kbase + j) * ks + (i64)hk * D;
                        float qk = 0.0f, dp = 0.0f;
                        for (int d = 0; d < D; d++) {
                            qk = fmaf(sa[warp][d], to_f32(kr[d]), qk);
                            dp = fmaf(sb[warp][d], to_f32(vr[d]), dp);
                        }
                        const float x = score_l2(qk, mul, sc_l2, use_sc, slope_l2, p, j);
                        const float pij = ex2(x - l2);
                        float dcap = 1.0f;
                        if (use_sc) {
                            const float t = tanh_acc(qk * mul);
                            dcap = 1.0f - t * t;
                        }
                        ds = pij * (dp - di) * dcap * scale;
                    }
                    const int nj = min(32, khi - j0);
                    for (int jj = 0; jj < nj; jj++) {
                        const float w = __shfl_sync(0xffffffffu, ds, jj);
                        if (w == 0.0f)
                            continue;
                        const T *kr = k + (kbase + j0 + jj) * ks + (i64)hk * D;
#pragma unroll
                        for (int e = 0; e < NV; e++) {
                            const int d = lane + 32 * e;
                            if (d < D)
                                acc_a[e] = fmaf(w, to_f32(kr[d]), acc_a[e]);
                        }
                    }
                }
                T *out = dq + row * qs + (i64)h * D;
#pragma unroll
                for (int e = 0; e < NV; e++) {
                    const int d = lane + 32 * e;
                    if (d < D)
                        out[d] = from_f32<T>(acc_a[e]);
                }
            } else {
                // ---- dk, dv of key r, kv head hk ----
                const int hk = blockIdx.y - Hq, j = r;
                const i64 krow = kbase + j;
                const T *kr = k + krow * ks + (i64)hk * D, *vr = v + krow * ks + (i64)hk * D;
                for (int d = lane; d < D; d += 32) {
                    sa[warp][d] = to_f32(kr[d]);
                    sb[warp][d] = to_f32(vr[d]);
                }
                __syncwarp();
                // the queries i that see key j: j <= i + off + wr and j >= i + off - wl
                int ilo = 0, ihi = sn.sq;
                if (mk.wr >= 0)
                    ilo = max(0, j - mk.off - mk.wr);
                if (mk.wl >= 0)
                    ihi = min(ihi, j - mk.off + mk.wl + 1);
                for (int h = hk * g; h < (hk + 1) * g; h++) {
                    const float slope_l2 = alibi ? __ldg(alibi + h) * TK_FA_LOG2E : 0.0f;
                    for (int i0 = ilo; i0 < ihi; i0 += 32) {
                        const int i = i0 + lane, p = i + mk.off;
                        float pij = 0.0f, ds = 0.0f;
                        if (i < ihi && mk.visible(p, j)) {
                            const i64 row = qbase + i;
                            const float l2 = lse[((i64)sn.b * Hq + h) * Sq + sn.q0 + i] * TK_FA_LOG2E;
                            const T *qr = q + row * qs + (i64)h * D, *dr = dout + row * qs + (i64)h * D,
                                    *orow = o + row * qs + (i64)h * D;
                            float qk = 0.0f, dp = 0.0f, di = 0.0f;
                            for (int d = 0; d < D; d++) {
                                const float dd = to_f32(dr[d]);
                                qk = fmaf(to_f32(qr[d]), sa[warp][d], qk);
                                dp = fmaf(dd, sb[warp][d], dp);
                                di = fmaf(dd, to_f32(orow[d]), di);
                            }
                            if (l2 != TK_FA_NEG_INF) {
                                const float x = score_l2(qk, mul, sc_l2, use_sc, slope_l2, p, j);
                                pij = ex2(x - l2);
                                float dcap = 1.0f;
                                if (use_sc) {
                                    const float t = tanh_acc(qk * mul);
                                    dcap = 1.0f - t * t;
                                }
                                ds = pij * (dp - di) * dcap * scale;
                            }
                        }
                        const int ni = min(32, ihi - i0);
                        for (int ii = 0; ii < ni; ii++) {
                            const float wp = __shfl_sync(0xffffffffu, pij, ii);
                            const float ws = __shfl_sync(0xffffffffu, ds, ii);
                            if (wp == 0.0f && ws == 0.0f)
                                continue;
                            const i64 row = qbase + i0 + ii;
                            const T *qr = q + row * qs + (i64)h * D, *dr = dout + row * qs + (i64)h * D;
#pragma unroll
                            for (int e = 0; e < NV; e++) {
                                const int d = lane + 32 * e;
                                if (d < D) {
                                    acc_a[e] = fmaf(ws, to_f32(qr[d]), acc_a[e]);
                                    acc_b[e] = fmaf(wp, to_f32(dr[d]), acc_b[e]);
                                }
                            }
                        }
                    }
                }
                T *ok = dk + krow * ks + (i64)hk * D, *ov = dv + krow * ks + (i64)hk * D;
#pragma unroll
                for (int e = 0; e < NV; e++) {
                    const int d = lane + 32 * e;
                    if (d < D) {
                        ok[d] = from_f32<T>(acc_a[e]);
                        ov[d] = from_f32<T>(acc_b[e]);
                    }
                }
            }
        }
    }

    // Varlen: rows no sequence owns (before cu[0] and from cu[nseq] on, in q and in k) get zero
    // gradients, as in the CPU reference: nothing depends on them. The blocks with z = 0 write them,
    // grid-strided; the launch rule gives z >= 1 even when nseq is 0.
    if (cu_q && blockIdx.z == 0) {
        const int total = is_q ? Sq : Sk;
        const int *cu = is_q ? cu_q : cu_k;
        int lo = 0, hi = 0; // the owned rows [lo, hi)
        if (nseq > 0) {
            lo = min(max(__ldg(cu), 0), total);
            hi = min(max(__ldg(cu + nseq), lo), total);
        }
        const int nfree = total - (hi - lo);
        const T zero = from_f32<T>(0.0f);
        for (int r0 = blockIdx.x * RPB; r0 < nfree; r0 += gridDim.x * RPB) {
            const int r = r0 + warp; // warp-uniform
            if (r >= nfree)
                continue;
            const i64 row = r < lo ? r : hi + (r - lo);
            if (is_q) {
                T *out = dq + row * qs + (i64)blockIdx.y * D;
                for (int d = lane; d < D; d += 32)
                    out[d] = zero;
            } else {
                const i64 off = row * ks + (i64)(blockIdx.y - Hq) * D;
                for (int d = lane; d < D; d += 32) {
                    dk[off + d] = zero;
                    dv[off + d] = zero;
                }
            }
        }
    }
}

} // namespace tk_fa
