// fwd_sm80.cu — FlashAttention-2 forward (the `attention` op) for sm_80 and newer, with mma.sync.
//
// Variants: tk_fa::fwd_sm80<T, D, BM, BN, STAGES, MINB> for T = __half / __nv_bfloat16 and head dim
// D = 64, 128, 256 (one manifest entry per dtype and D, plus a varlen entry with its own grid):
//   D =  64: BM 128 (8 warps), BN 64, 2 stages, 48 KiB shared memory
//   D = 128: BM 128 (8 warps), BN 64, 2 stages, 96 KiB
//   D = 256: BM  64 (4 warps), BN 32, 2 stages, 96 KiB
//
// Launch: grid (query tiles, Hq, sequences), block 32 * BM / 16 threads, dynamic shared memory
// (BM + 4 * BN) * D * 2 bytes. Every loop is grid-strided (tiles over gridDim.x, sequences over
// gridDim.z), so any grid is correct; the manifest's grid gives one tile per CTA. Tensors are
// contiguous: q/out [B, Sq, Hq, D], k/v [B, Sk, Hkv, D], lse [B, Hq, Sq] f32; every pointer 16-byte
// aligned (D is a multiple of 8, so rows are).
//
// Algorithm (per CTA: one BM-row query tile of one head of one sequence):
//   - Q tile -> shared (cp.async, zero-filled past the sequence end); K and V tiles stream through a
//     STAGES-deep cp.async ring; K of tile j and V of tile j are separate commit groups, so S = Q K^T
//     runs while V is still landing.
//   - each warp owns 16 query rows: S (16 x BN) = Q K^T with mma.m16n8k16 (fp32 accumulate), operands
//     by ldmatrix from XOR-swizzled shared tiles (conflict-free); scores go to the log2 domain
//     (scale * log2 e pre-multiplied), softcap / ALiBi applied, the mask only on tiles that cross the
//     causal diagonal, the window edges or the key end; online softmax (running max m, sum l, O rescaled
//     by exp2(m_old - m_new)); P is rounded to T in registers and reused directly as the A operand of
//     O += P V (V by ldmatrix.trans).
//   - key tiles outside the causal / window band are never loaded; a tile with no visible key at all
//     writes zeros and lse = -inf.
//   - epilogue: O / l staged through the warp's own rows of the Q tile, then 16-byte stores.
// Numerics: fp32 accumulation and softmax; P is rounded to T before the PV product (as flash-attn);
// exp2 via ex2.approx (rel. error ~2^-22); lse in natural log.
//
// NVRTC-compatible: no host code, no standard headers.
#include "common.cuh"

namespace tk_fa {

template <typename T, int D, int BM, int BN, int STAGES, int MINB>
__global__ void __launch_bounds__(BM * 2, MINB)
fwd_sm80(T *__restrict__ out,              // (B, Sq, Hq, D)
         const T *__restrict__ q,          // (B, Sq, Hq, D)
         const T *__restrict__ k,          // (B, Sk, Hkv, D)
         const T *__restrict__ v,          // (B, Sk, Hkv, D)
         float *__restrict__ lse,          // (B, Hq, Sq) or null
         const int *__restrict__ cu_q,     // (nseq + 1) or null: varlen
         const int *__restrict__ cu_k,     // (nseq + 1) or null
         int max_seqlen_q,                 // only the launch rule uses it
         const float *__restrict__ alibi,  // (Hq) or null
         float scale, int causal, int window_left, int window_right, float softcap,
         int B, int Sq, int Sk, int Hq, int Hkv, int nseq)
{
    static_assert(D % 64 == 0 && BM % 16 == 0 && BN % 16 == 0 && STAGES >= 1, "tile shape");
    constexpr int NT = BM * 2;       // 32 threads per 16 rows
    constexpr int DC = D / 8;        // 16-byte chunks per row
    extern __shared__ __align__(128) unsigned char smem_raw[];
    T *sQ = reinterpret_cast<T *>(smem_raw);       // [BM][D] swizzled
    T *sK = sQ + BM * D;                           // [STAGES][BN][D]
    T *sV = sK + STAGES * BN * D;                  // [STAGES][BN][D]
    const u32 sQa = smem_u32(sQ), sKa = smem_u32(sK), sVa = smem_u32(sV);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int h = blockIdx.y, hk = h / (Hq / Hkv);
    (void)max_seqlen_q;

    if (scale == 0.0f)
        scale = rsqrtf((float)D);
    const bool use_sc = softcap > 0.0f;
    const float mul = use_sc ? scale / softcap : scale * TK_FA_LOG2E;
    const float sc_l2 = use_sc ? softcap * TK_FA_LOG2E : 0.0f;
    const float slope_l2 = alibi ? __ldg(alibi + h) * TK_FA_LOG2E : 0.0f;
    const i64 qstride = (i64)Hq * D, kstride = (i64)Hkv * D;
    // ldmatrix lane offsets (see sw_off): Q as the A operand, K as B (rows = keys), V as B with .trans
    const u32 lq = lane_off<D * 2>((lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4);
    const u32 lk = lane_off<D * 2>((lane & 7) + (lane >> 4) * 8, (lane >> 3) & 1);
    const u32 lv = lane_off<D * 2>((lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4);

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
        const T *qb = q + ((i64)sn.b * Sq + sn.q0) * qstride + (i64)h * D;
        T *ob = out + ((i64)sn.b * Sq + sn.q0) * qstride + (i64)h * D;
        const T *kb = k + ((i64)sn.b * Sk + sn.k0) * kstride + (i64)hk * D;
        const T *vb = v + ((i64)sn.b * Sk + sn.k0) * kstride + (i64)hk * D;
        float *lb = lse ? lse + ((i64)sn.b * Hq + h) * Sq + sn.q0 : nullptr;
        const int n_m = cdiv_i(sn.sq, BM);

        for (int it = blockIdx.x; it < n_m; it += gridDim.x) {
            // the longest causal tiles first
            const int m0 = (n_m - 1 - it) * BM;
            const int r1 = min(m0 + BM, mk.sq);
            int klo, khi;
            key_range(&klo, &khi, mk, m0, r1);
            const int nlo = klo / BN;
            const int ntiles = khi > klo ? cdiv_i(khi, BN) - nlo : 0;
            __syncthreads(); // the previous tile's readers of shared memory are done

            if (ntiles == 0) { // no row of the tile sees a key: zeros and lse = -inf
                for (int c = tid; c < (r1 - m0) * DC; c += NT) {
                    const int r = c / DC, col = (c % DC) * 8;
                    *reinterpret_cast<uint4 *>(ob + (i64)(m0 + r) * qstride + col) = make_uint4(0, 0, 0, 0);
                }
                if (lb)
                    for (int r = tid; r < r1 - m0; r += NT)
                        lb[m0 + r] = TK_FA_NEG_INF;
                continue;
            }

            // ---- loads: Q with K tile 0 in group 0, then V0, K1, V1, ... --------------------------
            load_tile<T, D, BM, NT>(sQa, qb + (i64)m0 * qstride, qstride, mk.sq - m0, tid);
            auto load_kv = [&](const T *src, u32 dst, int j) {
                if (j < ntiles) {
                    const int n0 = (nlo + j) * BN;
                    load_tile<T, D, BN, NT>(dst, src + (i64)n0 * kstride, kstride, mk.sk - n0, tid);
                }
            };
#pragma unroll
            for (int st = 0; st < STAGES; st++) {
                load_kv(kb, sKa + st * BN * D * 2, st);
                cp_async_commit();
                load_kv(vb, sVa + st * BN * D * 2, st);
                cp_async_commit();
            }

            float oacc[D / 8][4];
#pragma unroll
            for (int d = 0; d < D / 8; d++)
                oacc[d][0] = oacc[d][1] = oacc[d][2] = oacc[d][3] = 0.0f;
            float mrow[2] = {TK_FA_NEG_INF, TK_FA_NEG_INF}, lrow[2] = {0.0f, 0.0f};
            const int rA = m0 + warp * 16 + g; // this thread's rows: rA and rA + 8
            const int pA = rA + mk.off;

            for (int j = 0; j < ntiles; j++) {
                const int stage = j % STAGES;
                // K_j landed (group 2j); 2 * STAGES - 2 younger groups may still fly
                cp_async_wait<2 * STAGES - 2>();
                __syncthreads();
                if (j >= 1) { // V_{j-1} is consumed by every warp: refill its stage
                    load_kv(vb, sVa + ((j - 1) % STAGES) * BN * D * 2, j - 1 + STAGES);
                    cp_async_commit();
                }

                // ---- S = Q K^T for this warp's 16 rows ----------------------------------------
                float sacc[BN / 8][4];
#pragma unroll
                for (int n = 0; n < BN / 8; n++)
                    sacc[n][0] = sacc[n][1] = sacc[n][2] = sacc[n][3] = 0.0f;
                const u32 kst = sKa + stage * BN * D * 2;
#pragma unroll
                for (int kk = 0; kk < D / 16; kk++) {
                    u32 a[4];
                    ldsm_x4(a, sQa + sw_off(lq, 2 * kk) + warp * 16 * D * 2);
#pragma unroll
                    for (int nn = 0; nn < BN / 16; nn++) {
                        u32 b[4];
                        ldsm_x4(b, kst + sw_off(lk, 2 * kk) + nn * 16 * D * 2);
                        Mma<T>::run(sacc[2 * nn], a, b[0], b[1]);
                        Mma<T>::run(sacc[2 * nn + 1], a, b[2], b[3]);
                    }
                }

                // ---- scores -> log2 domain, mask, online softmax ---------------------------------
                const int n0 = (nlo + j) * BN;
                const bool full = tile_full(mk, m0, r1, n0, BN);
                if (!use_sc && slope_l2 == 0.0f && full) {
#pragma unroll
                    for (int n = 0; n < BN / 8; n++)
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            sacc[n][e] *= mul;
                } else {
#pragma unroll
                    for (int n = 0; n < BN / 8; n++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int col = n0 + n * 8 + 2 * t + (e & 1);
                            const int p = pA + (e >> 1) * 8;
                            float x = score_l2(sacc[n][e], mul, sc_l2, use_sc, slope_l2, p, col);
                            if (!full && !mk.visible(p, col))
                                x = TK_FA_NEG_INF;
                            sacc[n][e] = x;
                        }
                }
                float tmax[2] = {TK_FA_NEG_INF, TK_FA_NEG_INF};
#pragma unroll
                for (int n = 0; n < BN / 8; n++) {
                    tmax[0] = fmaxf(tmax[0], fmaxf(sacc[n][0], sacc[n][1]));
                    tmax[1] = fmaxf(tmax[1], fmaxf(sacc[n][2], sacc[n][3]));
                }
                float corr[2], mu[2];
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 1));
                    tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 2));
                    const float mnew = fmaxf(mrow[r], tmax[r]);
                    mu[r] = mnew == TK_FA_NEG_INF ? 0.0f : mnew; // a fully masked row so far: no NaN
                    corr[r] = ex2(mrow[r] - mu[r]);
                    mrow[r] = mnew;
                    lrow[r] *= corr[r];
                }
#pragma unroll
                for (int d = 0; d < D / 8; d++) {
                    oacc[d][0] *= corr[0];
                    oacc[d][1] *= corr[0];
                    oacc[d][2] *= corr[1];
                    oacc[d][3] *= corr[1];
                }
#pragma unroll
                for (int n = 0; n < BN / 8; n++) {
                    sacc[n][0] = ex2(sacc[n][0] - mu[0]);
                    sacc[n][1] = ex2(sacc[n][1] - mu[0]);
                    sacc[n][2] = ex2(sacc[n][2] - mu[1]);
                    sacc[n][3] = ex2(sacc[n][3] - mu[1]);
                    lrow[0] += sacc[n][0] + sacc[n][1];
                    lrow[1] += sacc[n][2] + sacc[n][3];
                }

                // V_j landed (group 2j + 1); every warp is past S, so K's stage can be refilled
                cp_async_wait<2 * STAGES - 2>();
                __syncthreads();
                load_kv(kb, sKa + stage * BN * D * 2, j + STAGES);
                cp_async_commit();

                // ---- O += P V: P from registers (the C fragment of S is the A fragment of P) -------
                const u32 vst = sVa + stage * BN * D * 2;
#pragma unroll
                for (int kk = 0; kk < BN / 16; kk++) {
                    u32 a[4];
                    a[0] = pack2<T>(sacc[2 * kk][0], sacc[2 * kk][1]);
                    a[1] = pack2<T>(sacc[2 * kk][2], sacc[2 * kk][3]);
                    a[2] = pack2<T>(sacc[2 * kk + 1][0], sacc[2 * kk + 1][1]);
                    a[3] = pack2<T>(sacc[2 * kk + 1][2], sacc[2 * kk + 1][3]);
#pragma unroll
                    for (int dd = 0; dd < D / 16; dd++) {
                        u32 b[4];
                        ldsm_x4_t(b, vst + sw_off(lv, 2 * dd) + kk * 16 * D * 2);
                        Mma<T>::run(oacc[2 * dd], a, b[0], b[1]);
                        Mma<T>::run(oacc[2 * dd + 1], a, b[2], b[3]);
                    }
                }
            }
            cp_async_wait<0>(); // only empty groups can be left

            // ---- epilogue: O / l through this warp's own Q rows, 16-byte stores ------------------
            float inv[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                lrow[r] += __shfl_xor_sync(0xffffffffu, lrow[r], 1);
                lrow[r] += __shfl_xor_sync(0xffffffffu, lrow[r], 2);
                inv[r] = lrow[r] > 0.0f ? 1.0f / lrow[r] : 0.0f;
            }
#pragma unroll
            for (int d = 0; d < D / 8; d++) {
                const int col = d * 8 + 2 * t;
                *reinterpret_cast<u32 *>(sQ + swz<D>(warp * 16 + g, col)) =
                    pack2<T>(oacc[d][0] * inv[0], oacc[d][1] * inv[0]);
                *reinterpret_cast<u32 *>(sQ + swz<D>(warp * 16 + g + 8, col)) =
                    pack2<T>(oacc[d][2] * inv[1], oacc[d][3] * inv[1]);
            }
            __syncwarp();
            for (int c = lane; c < 16 * DC; c += 32) {
                const int r = c / DC, col = (c % DC) * 8, row = m0 + warp * 16 + r;
                if (row < mk.sq)
                    *reinterpret_cast<uint4 *>(ob + (i64)row * qstride + col) =
                        *reinterpret_cast<const uint4 *>(sQ + swz<D>(warp * 16 + r, col));
            }
            if (lb && t == 0) {
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int row = rA + r * 8;
                    if (row < mk.sq)
                        lb[row] = lrow[r] > 0.0f ? (mrow[r] + log2f(lrow[r])) * TK_FA_LN2 : TK_FA_NEG_INF;
                }
            }
        }
    }
}

} // namespace tk_fa
