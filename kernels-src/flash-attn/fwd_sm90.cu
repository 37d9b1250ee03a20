// fwd_sm90.cu — FlashAttention forward (the `attention` op) for sm_90a (H100 / H200): wgmma with
// shared-memory descriptors and warp specialisation. Compiled for sm_90a only (arch-specific).
//
// Variants: tk_fa::fwd_sm90<T, D, BN, NCW, STAGES> for T = __half / __nv_bfloat16:
//   D =  64: 2 consumer warpgroups (BM 128), BN 128, 2 stages, 384 threads, 81 KiB shared memory
//   D = 128: 2 consumer warpgroups (BM 128), BN  64, 2 stages, 384 threads, 97 KiB
//   D = 256: 1 consumer warpgroup  (BM  64), BN  64, 2 stages, 256 threads, 161 KiB
// Same tensors, grid (query tiles, Hq, sequences; grid-strided), masks, varlen and numerics as
// fwd_sm80.cu (see its header and common.cuh); 16-byte aligned pointers.
//
// Roles: warpgroup 0 is the producer, warpgroups 1..NCW the consumers, each owning 64 query rows.
//   - producer: cp.async of the Q tile and of K / V tiles into a STAGES-deep ring, in the 128-byte
//     swizzled layout wgmma reads ([D/64][rows][64 elements], 1 KiB-aligned 8-row atoms, 16-byte chunk
//     index XOR row % 8). After its copies land (cp.async.wait_group) each producer thread makes them
//     visible to the async proxy (fence.proxy.async) and arrives on the stage's "full" mbarrier; it
//     refills a stage once the consumers arrived on its "empty" mbarrier. K and V of a stage are
//     separate barriers, so S = Q K^T starts before V has landed. (TMA would need a CUtensorMap built
//     on the host, which tk cannot pass today; cp.async.bulk cannot write the swizzled layout. So the
//     producer uses cp.async, 16 bytes per thread.)
//   - consumer: S (64 x BN) = Q K^T with wgmma m64nBNk16, both operands in shared memory (K-major
//     descriptors, 128B swizzle); then the same log2-domain online softmax as fwd_sm80.cu on the
//     accumulator registers; P is rounded to T in registers and is the A operand (registers) of
//     O += P V, wgmma m64nDk16 with V as an MN-major ("transposed") shared-memory B operand.
//   - epilogue: O / l staged through the consumer's own rows of the Q tile (named barrier per
//     warpgroup), 16-byte stores, then the Q tile is released to the producer.
// Not done (FA3 has them): intra-warpgroup overlap of softmax with the next QK^T, setmaxnreg register
// reallocation between producer and consumers, TMA, FP8.
//
// NVRTC-compatible: no host code, no standard headers.
#include "fwd_sm90_wgmma.cuh"

namespace tk_fa {

// ---- mbarriers, proxy fence, raw shared memory -------------------------------------------------

__device__ __forceinline__ void mbar_init(u32 addr, u32 count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(addr), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 addr)
{
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(addr) : "memory");
}
// Waits for the completion of the barrier's phase with parity `parity`.
__device__ __forceinline__ void mbar_wait(u32 addr, u32 parity)
{
    u32 done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(addr), "r"(parity)
                     : "memory");
    } while (!done);
}
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void named_sync(int id, int nthreads)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(nthreads) : "memory");
}
__device__ __forceinline__ void st_shared_u32(u32 addr, u32 v)
{
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ uint4 ld_shared_v4(u32 addr)
{
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(addr)
                 : "memory");
    return v;
}

// Byte offset of element (r, c) in an R-row tile of D columns laid out as wgmma's 128B-swizzle atoms:
// [D/64 column blocks][R rows][64 elements], 128-byte rows, chunk (c % 64) / 8 XOR r % 8.
template <int D, int R> __device__ __forceinline__ u32 off90(int r, int c)
{
    return (u32)((c >> 6) * R * 128 + r * 128 + ((((c >> 3) & 7) ^ (r & 7)) << 4) + (c & 7) * 2);
}

// A shared-memory matrix descriptor, 128-byte swizzle, base offset 0 (atoms 1 KiB aligned).
__device__ __forceinline__ u64 desc_sw128(u32 addr, u32 lbo, u32 sbo)
{
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)((lbo & 0x3FFFF) >> 4) << 16) |
           ((u64)((sbo & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}

// R x D tile from global rows src + r * stride (rows >= valid zero-filled) into an off90 tile, by the
// 128 producer threads.
template <typename T, int D, int R>
__device__ __forceinline__ void load90(u32 dst, const T *src, i64 stride, int valid, int ptid)
{
    constexpr int DC = D / 8, RSTEP = 128 / DC;
    static_assert(128 % DC == 0 && R % RSTEP == 0, "producer threads cover whole rows");
    const int lr = ptid / DC, lcol = (ptid % DC) * 8;
    const T *p = src + lcol;
#pragma unroll
    for (int i = 0; i < R / RSTEP; i++) {
        const int r = lr + i * RSTEP;
        const bool ok = r < valid;
        cp_async16(dst + off90<D, R>(r, lcol), p + (ok ? (i64)r * stride : 0), ok ? 16 : 0);
    }
}

template <typename T, int D, int BN, int NCW, int STAGES>
__global__ void __launch_bounds__(128 * (NCW + 1), 1)
fwd_sm90(T *__restrict__ out,              // (B, Sq, Hq, D)
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
    constexpr int BM = 64 * NCW, DC = D / 8;
    static_assert(D % 64 == 0 && BN % 16 == 0 && BN <= 256, "tile shape");
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    // [0] q_full, [1] q_empty, [2 + s] k_full, [2 + S + s] k_empty, [2 + 2S + s] v_full, [2 + 3S + s] v_empty
    __shared__ __align__(8) unsigned long long bars[2 + 4 * STAGES];
    const u32 base = (smem_u32(smem_raw) + 1023u) & ~1023u;
    const u32 sQa = base, sKa = sQa + BM * D * 2, sVa = sKa + STAGES * BN * D * 2;
    const u32 bar0 = smem_u32(bars);
    const u32 q_full = bar0, q_empty = bar0 + 8;
    auto k_full = [&](int s) { return bar0 + 8 * (2 + s); };
    auto k_empty = [&](int s) { return bar0 + 8 * (2 + STAGES + s); };
    auto v_full = [&](int s) { return bar0 + 8 * (2 + 2 * STAGES + s); };
    auto v_empty = [&](int s) { return bar0 + 8 * (2 + 3 * STAGES + s); };

    const int tid = threadIdx.x;
    if (tid == 0) {
        mbar_init(q_full, 128);
        mbar_init(q_empty, 128 * NCW);
        for (int s = 0; s < STAGES; s++) {
            mbar_init(k_full(s), 128);
            mbar_init(k_empty(s), 128 * NCW);
            mbar_init(v_full(s), 128);
            mbar_init(v_empty(s), 128 * NCW);
        }
    }
    __syncthreads(); // the last CTA-wide barrier: the roles split below

    const int h = blockIdx.y, hk = h / (Hq / Hkv);
    (void)max_seqlen_q;
    if (scale == 0.0f)
        scale = rsqrtf((float)D);
    const bool use_sc = softcap > 0.0f;
    const float mul = use_sc ? scale / softcap : scale * TK_FA_LOG2E;
    const float sc_l2 = use_sc ? softcap * TK_FA_LOG2E : 0.0f;
    const float slope_l2 = alibi ? __ldg(alibi + h) * TK_FA_LOG2E : 0.0f;
    const i64 qstride = (i64)Hq * D, kstride = (i64)Hkv * D;
    const bool producer = tid < 128;
    // consumer identity
    const int ctid = tid - 128, cw = ctid >> 7, wi = (ctid >> 5) & 3, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;

    u32 kv_it = 0, wt = 0; // K/V tiles and work tiles so far: stage and barrier phases
    float sacc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; i++)
        sacc[i] = 0.0f;

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

        for (int it = blockIdx.x; it < n_m; it += gridDim.x, wt++) {
            const int m0 = (n_m - 1 - it) * BM;
            const int r1 = min(m0 + BM, mk.sq);
            int klo, khi;
            key_range(&klo, &khi, mk, m0, r1);
            const int nlo = klo / BN;
            const int ntiles = khi > klo ? cdiv_i(khi, BN) - nlo : 0;

            if (producer) {
                // ---- producer warpgroup ---------------------------------------------------------
                if (wt > 0)
                    mbar_wait(q_empty, (wt - 1) & 1);
                load90<T, D, BM>(sQa, qb + (i64)m0 * qstride, qstride, mk.sq - m0, tid);
                cp_async_commit();
                cp_async_wait<0>();
                fence_proxy_async();
                mbar_arrive(q_full);
                for (int j = 0; j < ntiles; j++, kv_it++) {
                    const int st = kv_it % STAGES;
                    const u32 use = kv_it / STAGES;
                    const int n0 = (nlo + j) * BN;
                    if (use > 0)
                        mbar_wait(k_empty(st), (use - 1) & 1);
                    load90<T, D, BN>(sKa + st * BN * D * 2, kb + (i64)n0 * kstride, kstride, mk.sk - n0, tid);
                    cp_async_commit();
                    if (use > 0)
                        mbar_wait(v_empty(st), (use - 1) & 1);
                    load90<T, D, BN>(sVa + st * BN * D * 2, vb + (i64)n0 * kstride, kstride, mk.sk - n0, tid);
                    cp_async_commit();
                    cp_async_wait<1>();
                    fence_proxy_async();
                    mbar_arrive(k_full(st));
                    cp_async_wait<0>();
                    fence_proxy_async();
                    mbar_arrive(v_full(st));
                }
                continue;
            }

            // ---- consumer warpgroup cw: rows m0 + 64 cw .. + 63 --------------------------------------
            mbar_wait(q_full, wt & 1);
            const int wrow = cw * 64 + wi * 16 + g; // this thread's rows in the tile: wrow, wrow + 8
            const int rA = m0 + wrow, pA = rA + mk.off;
            if (ntiles == 0) { // no row of the tile sees a key
                const uint2 z = make_uint2(0, 0);
                for (int c = ctid & 127; c < 64 * (D / 4); c += 128) {
                    const int r = c / (D / 4), row = m0 + cw * 64 + r;
                    if (row < mk.sq)
                        *reinterpret_cast<uint2 *>(ob + (i64)row * qstride + (c % (D / 4)) * 4) = z;
                }
                if (lb && t == 0) {
                    if (rA < mk.sq)
                        lb[rA] = TK_FA_NEG_INF;
                    if (rA + 8 < mk.sq)
                        lb[rA + 8] = TK_FA_NEG_INF;
                }
                mbar_arrive(q_empty);
                continue;
            }

            float oacc[D / 2];
#pragma unroll
            for (int i = 0; i < D / 2; i++)
                oacc[i] = 0.0f;
            float mrow[2] = {TK_FA_NEG_INF, TK_FA_NEG_INF}, lrow[2] = {0.0f, 0.0f};
            const u32 qdesc_base = sQa + cw * 64 * 128;

            for (int j = 0; j < ntiles; j++, kv_it++) {
                const int st = kv_it % STAGES;
                const u32 use = kv_it / STAGES;
                const u32 kst = sKa + st * BN * D * 2, vst = sVa + st * BN * D * 2;

                // ---- S = Q K^T ------------------------------------------------------------------
                mbar_wait(k_full(st), use & 1);
                wg_fence();
#pragma unroll
                for (int kk = 0; kk < D / 16; kk++) {
                    const u64 da = desc_sw128(qdesc_base + (kk >> 2) * BM * 128 + (kk & 3) * 32, 16, 1024);
                    const u64 db = desc_sw128(kst + (kk >> 2) * BN * 128 + (kk & 3) * 32, 16, 1024);
                    WgSS<T, BN>::run(sacc, da, db, kk > 0);
                }
                wg_commit();
                wg_wait<0>();
#pragma unroll
                for (int i = 0; i < BN / 2; i++)
                    wg_pin(sacc[i]);
                mbar_arrive(k_empty(st));

                // ---- scores -> log2 domain, mask, online softmax (as fwd_sm80.cu) ------------------
                const int n0 = (nlo + j) * BN;
                const bool full = tile_full(mk, m0, r1, n0, BN);
                if (!use_sc && slope_l2 == 0.0f && full) {
#pragma unroll
                    for (int i = 0; i < BN / 2; i++)
                        sacc[i] *= mul;
                } else {
#pragma unroll
                    for (int i = 0; i < BN / 2; i++) {
                        const int col = n0 + (i >> 2) * 8 + 2 * t + (i & 1);
                        const int p = pA + ((i >> 1) & 1) * 8;
                        float x = score_l2(sacc[i], mul, sc_l2, use_sc, slope_l2, p, col);
                        if (!full && !mk.visible(p, col))
                            x = TK_FA_NEG_INF;
                        sacc[i] = x;
                    }
                }
                float tmax[2] = {TK_FA_NEG_INF, TK_FA_NEG_INF};
#pragma unroll
                for (int n = 0; n < BN / 8; n++) {
                    tmax[0] = fmaxf(tmax[0], fmaxf(sacc[4 * n], sacc[4 * n + 1]));
                    tmax[1] = fmaxf(tmax[1], fmaxf(sacc[4 * n + 2], sacc[4 * n + 3]));
                }
                float corr[2], mu[2];
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 1));
                    tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 2));
                    const float mnew = fmaxf(mrow[r], tmax[r]);
                    mu[r] = mnew == TK_FA_NEG_INF ? 0.0f : mnew;
                    corr[r] = ex2(mrow[r] - mu[r]);
                    mrow[r] = mnew;
                    lrow[r] *= corr[r];
                }
#pragma unroll
                for (int i = 0; i < D / 2; i++)
                    oacc[i] *= corr[(i >> 1) & 1];
                u32 pa[BN / 16][4];
#pragma unroll
                for (int n = 0; n < BN / 8; n++) {
                    const float p0 = ex2(sacc[4 * n] - mu[0]), p1 = ex2(sacc[4 * n + 1] - mu[0]);
                    const float p2 = ex2(sacc[4 * n + 2] - mu[1]), p3 = ex2(sacc[4 * n + 3] - mu[1]);
                    lrow[0] += p0 + p1;
                    lrow[1] += p2 + p3;
                    // A fragment of keys 16 (n / 2) ..: n even -> a[0], a[1]; n odd -> a[2], a[3]
                    pa[n >> 1][(n & 1) * 2] = pack2<T>(p0, p1);
                    pa[n >> 1][(n & 1) * 2 + 1] = pack2<T>(p2, p3);
                }

                // ---- O += P V --------------------------------------------------------------------
                mbar_wait(v_full(st), use & 1);
                wg_fence();
#pragma unroll
                for (int ks = 0; ks < BN / 16; ks++)
                    WgRS<T, D>::run(oacc, pa[ks], desc_sw128(vst + ks * 16 * 128, BN * 128, 1024), 1);
                wg_commit();
                wg_wait<0>();
#pragma unroll
                for (int i = 0; i < D / 2; i++)
                    wg_pin(oacc[i]);
#pragma unroll
                for (int i = 0; i < BN / 16; i++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        wg_pin(pa[i][e]);
                mbar_arrive(v_empty(st));
            }

            // ---- epilogue: O / l via this warpgroup's rows of the Q tile, 16-byte stores -------------
            float inv[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                lrow[r] += __shfl_xor_sync(0xffffffffu, lrow[r], 1);
                lrow[r] += __shfl_xor_sync(0xffffffffu, lrow[r], 2);
                inv[r] = lrow[r] > 0.0f ? 1.0f / lrow[r] : 0.0f;
            }
#pragma unroll
            for (int n = 0; n < D / 8; n++) {
                const int col = n * 8 + 2 * t;
                st_shared_u32(sQa + off90<D, BM>(wrow, col), pack2<T>(oacc[4 * n] * inv[0], oacc[4 * n + 1] * inv[0]));
                st_shared_u32(sQa + off90<D, BM>(wrow + 8, col),
                              pack2<T>(oacc[4 * n + 2] * inv[1], oacc[4 * n + 3] * inv[1]));
            }
            named_sync(1 + cw, 128);
            for (int c = ctid & 127; c < 64 * DC; c += 128) {
                const int r = c / DC, col = (c % DC) * 8, row = m0 + cw * 64 + r;
                if (row < mk.sq)
                    *reinterpret_cast<uint4 *>(ob + (i64)row * qstride + col) =
                        ld_shared_v4(sQa + off90<D, BM>(cw * 64 + r, col));
            }
            if (lb && t == 0) {
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int row = rA + r * 8;
                    if (row < mk.sq)
                        lb[row] = lrow[r] > 0.0f ? (mrow[r] + log2f(lrow[r])) * TK_FA_LN2 : TK_FA_NEG_INF;
                }
            }
            mbar_arrive(q_empty);
        }
    }
}

} // namespace tk_fa
