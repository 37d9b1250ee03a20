// bwd_sm80.cu — FlashAttention-2 backward (the `attention_backward` op) for sm_80 and newer, with
// mma.sync, in ONE launch.
//
// Variants: tk_fa::bwd_sm80<T, D, BM, BN> for T = __half / __nv_bfloat16 (8 warps, 256 threads):
//   D =  64: BM 64, BN 64, 48 KiB + 1 KiB shared memory
//   D = 128: BM 64, BN 64, 80 KiB + 1 KiB
//   D = 256: BM 64, BN 32, 104 KiB + 1 KiB (more than sm_86 / sm_89 allow: A100 / H100 class only)
//
// Launch: grid (cdiv(Sk, BN), Hkv, B), block 256, dynamic shared memory as above, and a zero-filled
// workspace `ws` of B*Sq*Hq*D floats (the dQ accumulator, q's layout) followed by B*Hq*cdiv(Sq, BM)
// u32 arrival counters. Tensors contiguous, 16-byte aligned: q/out/dout/dq [B, Sq, Hq, D],
// k/v/dk/dv [B, Sk, Hkv, D], lse [B, Hq, Sq] f32 (natural log, from the forward). No varlen.
//
// Algorithm: a CTA owns key tile n (BN keys) of kv head hk and keeps dK, dV for it in registers. It
// walks every query head of hk's group and every query tile m that can see the key tile (tiles outside
// the causal / window band are skipped), so dK and dV of a GQA group are summed in registers, in a
// fixed order (deterministic), and written once. Per (head, query tile):
//   Delta = rowsum(dO o O) (from global memory, while Q and dO land in shared memory by cp.async)
//   S = Q K^T -> P = exp2(S_log2 - lse_log2)   (same masks / softcap / ALiBi as the forward)
//   dP = dO V^T,  dS = P o (dP - Delta) * scale * (softcap ? 1 - tanh^2 : 1)
//   P and dS -> shared (rounded to T);  dV += P^T dO,  dK += dS^T Q   (ldmatrix.trans of P / dS)
//   dQ_tile = dS K  -> fp32 atomics into the workspace (red.global.add.f32)
// The next tile's Q / dO loads are issued before the dQ product, so they overlap it. After its dQ
// atomics a CTA counts itself on the tile's counter (after __threadfence); the CTA that arrives last
// (gridDim.x arrivals: every key-tile CTA counts every tile, skipped ones included) converts the fp32
// dQ rows of that tile to T. So dQ is complete when the launch ends, without a second kernel; its
// summation order over key tiles is not fixed (fp32 atomics), dK and dV are deterministic.
// Numerics: fp32 accumulation; P and dS rounded to T before their products (as flash-attn).
//
// NVRTC-compatible: no host code, no standard headers.
#include "common.cuh"

namespace tk_fa {

template <typename T, int D, int BM, int BN>
__global__ void __launch_bounds__(256, 1)
bwd_sm80(T *__restrict__ dq,               // (B, Sq, Hq, D)
         T *__restrict__ dk,               // (B, Sk, Hkv, D)
         T *__restrict__ dv,               // (B, Sk, Hkv, D)
         const T *__restrict__ dout,       // (B, Sq, Hq, D)
         const T *__restrict__ q,          // (B, Sq, Hq, D)
         const T *__restrict__ k,          // (B, Sk, Hkv, D)
         const T *__restrict__ v,          // (B, Sk, Hkv, D)
         const T *__restrict__ o,          // (B, Sq, Hq, D) the forward's output
         const float *__restrict__ lse,    // (B, Hq, Sq)
         const float *__restrict__ alibi,  // (Hq) or null
         float scale, int causal, int window_left, int window_right, float softcap,
         void *__restrict__ ws,            // zero-filled: dQ accumulator f32 (B, Sq, Hq, D), counters
         int B, int Sq, int Sk, int Hq, int Hkv)
{
    constexpr int NW = 8, NT = 256, DC = D / 8;
    constexpr int RG = BM / 16, CG = NW / RG, SPN = BN / CG; // S / dP: warp = 16 rows x SPN keys
    constexpr int KG = BN / 16, DG = NW / KG, DW = D / DG;   // dK / dV: warp = 16 keys x DW
    constexpr int QDG = NW / RG, QDW = D / QDG;              // dQ: warp = 16 rows x QDW
    static_assert(NW % RG == 0 && NW % KG == 0 && SPN % 16 == 0 && DW % 16 == 0 && QDW % 16 == 0,
                  "warp tiling");
    static_assert(DC <= 32, "Delta: one 16-byte chunk per lane");
    extern __shared__ __align__(128) unsigned char smem_raw[];
    T *sK = reinterpret_cast<T *>(smem_raw);   // [BN][D]
    T *sV = sK + BN * D;                       // [BN][D]
    T *sQ = sV + BN * D;                       // [BM][D]
    T *sdO = sQ + BM * D;                      // [BM][D]
    T *sP = sdO + BM * D;                      // [BM][BN]
    T *sdS = sP + BM * BN;                     // [BM][BN]
    float *sLse = reinterpret_cast<float *>(sdS + BM * BN); // [BM] log2 domain
    float *sDelta = sLse + BM;                               // [BM]
    __shared__ int s_last;
    const u32 sKa = smem_u32(sK), sVa = smem_u32(sV), sQa = smem_u32(sQ), sdOa = smem_u32(sdO);
    const u32 sPa = smem_u32(sP), sdSa = smem_u32(sdS);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int nb = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
    const int G = Hq / Hkv, n0 = nb * BN;
    if (scale == 0.0f)
        scale = rsqrtf((float)D);
    const bool use_sc = softcap > 0.0f;
    const float mul = use_sc ? scale / softcap : scale * TK_FA_LOG2E;
    const float sc_l2 = use_sc ? softcap * TK_FA_LOG2E : 0.0f;
    Mask mk;
    mk.sq = Sq;
    mk.sk = Sk;
    mk.off = Sk - Sq;
    mk.wl = window_left;
    mk.wr = causal ? 0 : window_right;
    const int n_m = cdiv_i(Sq, BM);
    // query tiles that can see a key of [n0, n0 + BN): rows i with i + off + wr >= n0 and
    // i + off - wl <= n0 + BN - 1
    int m_lo = 0, m_hi = n_m;
    if (mk.wr >= 0)
        m_lo = max(0, floordiv_i(n0 - mk.wr - mk.off, BM));
    if (mk.wl >= 0)
        m_hi = min(n_m, floordiv_i(n0 + BN - 1 + mk.wl - mk.off, BM) + 1);
    const int n_act = m_hi > m_lo ? G * (m_hi - m_lo) : 0;

    const i64 qstride = (i64)Hq * D, kstride = (i64)Hkv * D;
    const T *kb = k + ((i64)b * Sk * Hkv + hk) * D;
    const T *vb = v + ((i64)b * Sk * Hkv + hk) * D;
    float *dq_acc = reinterpret_cast<float *>(ws);
    unsigned *cnt = reinterpret_cast<unsigned *>(dq_acc + (i64)B * Sq * Hq * D);

    // lane offsets for the [*][D] tiles (see sw_off): "A" rows (l&7) + 8((l>>3)&1), chunk l>>4 (A
    // operands, and B operands read with .trans); "B" rows (l&7) + 8(l>>4), chunk (l>>3)&1
    const u32 la = lane_off<D * 2>((lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4);
    const u32 lb = lane_off<D * 2>((lane & 7) + (lane >> 4) * 8, (lane >> 3) & 1);
    const int ar = (lane & 7) + ((lane >> 3) & 1) * 8, ac = (lane >> 4) * 8; // same patterns for sP/sdS
    const int br = (lane & 7) + (lane >> 4) * 8, bc = ((lane >> 3) & 1) * 8;

    // item it of the active list: head hk * G + it / (m_hi - m_lo), query tile m_lo + it % (...)
    auto item_h = [&](int it) { return hk * G + it / (m_hi - m_lo); };
    auto item_m = [&](int it) { return m_lo + it % (m_hi - m_lo); };

    // Q, dO of an item -> shared (async); lse, Delta -> shared (sync)
    auto stage_item = [&](int it) {
        const int h = item_h(it), m0 = item_m(it) * BM;
        const i64 rb = ((i64)b * Sq + m0) * qstride + (i64)h * D;
        load_tile<T, D, BM, NT>(sQa, q + rb, qstride, Sq - m0, tid);
        load_tile<T, D, BM, NT>(sdOa, dout + rb, qstride, Sq - m0, tid);
        cp_async_commit();
        const float *lh = lse + ((i64)b * Hq + h) * Sq;
        for (int r = warp; r < BM; r += NW) { // warp-uniform rows
            const bool ok = m0 + r < Sq;
            float s = 0.0f;
            if (ok && lane < DC) {
                const uint4 x = *reinterpret_cast<const uint4 *>(dout + rb + (i64)r * qstride + lane * 8);
                const uint4 y = *reinterpret_cast<const uint4 *>(o + rb + (i64)r * qstride + lane * 8);
                const T *xa = reinterpret_cast<const T *>(&x), *ya = reinterpret_cast<const T *>(&y);
#pragma unroll
                for (int u = 0; u < 8; u++)
                    s = fmaf(to_f32(xa[u]), to_f32(ya[u]), s);
            }
            s = warp_sum(s);
            if (lane == 0) {
                sDelta[r] = s;
                sLse[r] = ok ? __ldg(lh + m0 + r) * TK_FA_LOG2E : TK_FA_NEG_INF; // -inf: P = 0
            }
        }
    };

    // Counts this CTA on (h, tile m); the last of the gridDim.x key-tile CTAs converts dQ of the tile.
    auto arrive = [&](int h, int m) {
        __threadfence(); // this thread's dQ atomics before the count
        __syncthreads();
        if (tid == 0) {
            const unsigned prev = atomicAdd(cnt + ((i64)b * Hq + h) * n_m + m, 1u);
            s_last = prev == gridDim.x - 1;
        }
        __syncthreads();
        if (s_last) {
            __threadfence();
            const int m0 = m * BM, rows = min(BM, Sq - m0);
            const i64 rb = ((i64)b * Sq + m0) * qstride + (i64)h * D;
            for (int c = tid; c < rows * (D / 4); c += NT) {
                const int r = c / (D / 4), col = (c % (D / 4)) * 4;
                const float4 x = __ldcg(reinterpret_cast<const float4 *>(dq_acc + rb + (i64)r * qstride + col));
                uint2 y;
                y.x = pack2<T>(x.x, x.y);
                y.y = pack2<T>(x.z, x.w);
                *reinterpret_cast<uint2 *>(dq + rb + (i64)r * qstride + col) = y;
            }
        }
    };

    // tiles this CTA's keys cannot reach: count them (no dQ contribution)
    for (int hh = 0; hh < G; hh++)
        for (int m = 0; m < n_m; m++)
            if (m < m_lo || m >= m_hi)
                arrive(hk * G + hh, m);

    load_tile<T, D, BN, NT>(sKa, kb + (i64)n0 * kstride, kstride, Sk - n0, tid);
    load_tile<T, D, BN, NT>(sVa, vb + (i64)n0 * kstride, kstride, Sk - n0, tid);
    cp_async_commit();
    if (n_act > 0)
        stage_item(0);

    float dka[DW / 8][4], dva[DW / 8][4];
#pragma unroll
    for (int d = 0; d < DW / 8; d++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            dka[d][e] = dva[d][e] = 0.0f;

    const int rg = warp % RG, cg = warp / RG; // S / dP and dQ row group; S / dP key group
    const int kg = warp % KG, dg = warp / KG; // dK / dV key group and column group

    for (int it = 0; it < n_act; it++) {
        const int h = item_h(it), m = item_m(it), m0 = m * BM;
        const float slope_l2 = alibi ? __ldg(alibi + h) * TK_FA_LOG2E : 0.0f;
        cp_async_wait<0>();
        __syncthreads();

        // ---- S = Q K^T and dP = dO V^T for this warp's 16 rows x SPN keys --------------------------
        float sacc[SPN / 8][4], dpacc[SPN / 8][4];
#pragma unroll
        for (int n = 0; n < SPN / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                sacc[n][e] = dpacc[n][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            u32 a[4], c[4];
            ldsm_x4(a, sQa + sw_off(la, 2 * kk) + rg * 16 * D * 2);
            ldsm_x4(c, sdOa + sw_off(la, 2 * kk) + rg * 16 * D * 2);
#pragma unroll
            for (int nn = 0; nn < SPN / 16; nn++) {
                u32 bk[4], bv[4];
                ldsm_x4(bk, sKa + sw_off(lb, 2 * kk) + (cg * SPN + nn * 16) * D * 2);
                ldsm_x4(bv, sVa + sw_off(lb, 2 * kk) + (cg * SPN + nn * 16) * D * 2);
                Mma<T>::run(sacc[2 * nn], a, bk[0], bk[1]);
                Mma<T>::run(sacc[2 * nn + 1], a, bk[2], bk[3]);
                Mma<T>::run(dpacc[2 * nn], c, bv[0], bv[1]);
                Mma<T>::run(dpacc[2 * nn + 1], c, bv[2], bv[3]);
            }
        }

        // ---- P, dS -> shared ------------------------------------------------------------------
        {
            const int r1 = min(m0 + BM, Sq);
            const bool full = tile_full(mk, m0, r1, n0, BN);
            const int rl = rg * 16 + g; // local rows rl, rl + 8
            const float lse0 = sLse[rl], lse1 = sLse[rl + 8];
            const float dl0 = sDelta[rl], dl1 = sDelta[rl + 8];
#pragma unroll
            for (int n = 0; n < SPN / 8; n++) {
                const int cl = cg * SPN + n * 8 + 2 * t; // local key column
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int p = m0 + rl + (e >> 1) * 8 + mk.off, j = n0 + cl + (e & 1);
                    const float lr = (e >> 1) ? lse1 : lse0;
                    float x, dfac = scale;
                    if (use_sc) {
                        const float th = tanh_acc(sacc[n][e] * mul);
                        x = sc_l2 * th;
                        dfac = scale * (1.0f - th * th);
                    } else {
                        x = sacc[n][e] * mul;
                    }
                    if (slope_l2 != 0.0f)
                        x -= slope_l2 * fabsf((float)(p - j));
                    const bool vis = full || mk.visible(p, j);
                    const float pr = (vis && lr != TK_FA_NEG_INF) ? ex2(x - lr) : 0.0f;
                    sacc[n][e] = pr;
                    dpacc[n][e] = pr * (dpacc[n][e] - ((e >> 1) ? dl1 : dl0)) * dfac;
                }
                *reinterpret_cast<u32 *>(sP + swz<BN>(rl, cl)) = pack2<T>(sacc[n][0], sacc[n][1]);
                *reinterpret_cast<u32 *>(sP + swz<BN>(rl + 8, cl)) = pack2<T>(sacc[n][2], sacc[n][3]);
                *reinterpret_cast<u32 *>(sdS + swz<BN>(rl, cl)) = pack2<T>(dpacc[n][0], dpacc[n][1]);
                *reinterpret_cast<u32 *>(sdS + swz<BN>(rl + 8, cl)) = pack2<T>(dpacc[n][2], dpacc[n][3]);
            }
        }
        __syncthreads();

        // ---- dV += P^T dO, dK += dS^T Q (this warp: 16 keys x DW columns) ------------------------
#pragma unroll
        for (int kq = 0; kq < BM / 16; kq++) {
            u32 ap[4], as[4];
            ldsm_x4_t(ap, sPa + 2 * swz<BN>(kq * 16 + br, kg * 16 + bc));
            ldsm_x4_t(as, sdSa + 2 * swz<BN>(kq * 16 + br, kg * 16 + bc));
#pragma unroll
            for (int dd = 0; dd < DW / 16; dd++) {
                u32 bo[4], bq[4];
                ldsm_x4_t(bo, sdOa + sw_off(la, (dg * DW + dd * 16) / 8) + kq * 16 * D * 2);
                ldsm_x4_t(bq, sQa + sw_off(la, (dg * DW + dd * 16) / 8) + kq * 16 * D * 2);
                Mma<T>::run(dva[2 * dd], ap, bo[0], bo[1]);
                Mma<T>::run(dva[2 * dd + 1], ap, bo[2], bo[3]);
                Mma<T>::run(dka[2 * dd], as, bq[0], bq[1]);
                Mma<T>::run(dka[2 * dd + 1], as, bq[2], bq[3]);
            }
        }
        __syncthreads(); // sQ, sdO, sLse, sDelta are free: stage the next item under the dQ product
        if (it + 1 < n_act)
            stage_item(it + 1);

        // ---- dQ += dS K -> workspace (fp32 atomics) ----------------------------------------------
        {
            float dqa[QDW / 8][4];
#pragma unroll
            for (int d = 0; d < QDW / 8; d++)
                dqa[d][0] = dqa[d][1] = dqa[d][2] = dqa[d][3] = 0.0f;
            const int qdg = cg;
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) {
                u32 a[4];
                ldsm_x4(a, sdSa + 2 * swz<BN>(rg * 16 + ar, kk * 16 + ac));
#pragma unroll
                for (int dd = 0; dd < QDW / 16; dd++) {
                    u32 bk[4];
                    ldsm_x4_t(bk, sKa + sw_off(la, (qdg * QDW + dd * 16) / 8) + kk * 16 * D * 2);
                    Mma<T>::run(dqa[2 * dd], a, bk[0], bk[1]);
                    Mma<T>::run(dqa[2 * dd + 1], a, bk[2], bk[3]);
                }
            }
            const int row = m0 + rg * 16 + g;
            float *acc = dq_acc + ((i64)b * Sq + row) * qstride + (i64)h * D + qdg * QDW + 2 * t;
#pragma unroll
            for (int d = 0; d < QDW / 8; d++) {
                if (row < Sq) {
                    atomicAdd(acc + d * 8, dqa[d][0]);
                    atomicAdd(acc + d * 8 + 1, dqa[d][1]);
                }
                if (row + 8 < Sq) {
                    atomicAdd(acc + 8 * qstride + d * 8, dqa[d][2]);
                    atomicAdd(acc + 8 * qstride + d * 8 + 1, dqa[d][3]);
                }
            }
        }
        arrive(h, m);
    }
    cp_async_wait<0>();

    // ---- dK, dV -> global (T) ------------------------------------------------------------------------
    {
        const int key = n0 + kg * 16 + g;
        const i64 base = ((i64)b * Sk + key) * kstride + (i64)hk * D + dg * DW + 2 * t;
#pragma unroll
        for (int d = 0; d < DW / 8; d++) {
            if (key < Sk) {
                *reinterpret_cast<u32 *>(dk + base + d * 8) = pack2<T>(dka[d][0], dka[d][1]);
                *reinterpret_cast<u32 *>(dv + base + d * 8) = pack2<T>(dva[d][0], dva[d][1]);
            }
            if (key + 8 < Sk) {
                *reinterpret_cast<u32 *>(dk + base + 8 * kstride + d * 8) = pack2<T>(dka[d][2], dka[d][3]);
                *reinterpret_cast<u32 *>(dv + base + 8 * kstride + d * 8) = pack2<T>(dva[d][2], dva[d][3]);
            }
        }
    }
}

} // namespace tk_fa
