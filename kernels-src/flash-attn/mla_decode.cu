// mla_decode.cu — mla_decode of kernels-community/flash-attn: DeepSeek multi-head latent attention in
// the absorbed form, one new token per sequence, over a paged latent cache, on tensor cores
// (mma.sync m16n8k16 with fp32 accumulation, operands through ldmatrix), split-KV in one launch.
//
// Variants: tk_mla_decode<T>, T = __half or __nv_bfloat16; latent rank R = 512 and rope dim P = 64
// (the manifest pins them), any Hq >= 1, any block_size >= 1.
//
// score(h, j) = scale * (q_nope[h] . c_kv[j] + q_pe[h] . k_pe[j]) (scale 0: 1/sqrt(R + P)),
// out[h] = sum_j softmax_j(score(h, .)) c_kv[j]: attention with one shared KV "head" whose key is the
// whole 576-element cache row and whose value is its first 512 elements. A CTA takes HT = 16 * MT
// heads (MT = min(4, cdiv(Hq, 16)), i.e. up to 64) of one sequence, so each latent row read from
// memory serves up to 64 heads: decode becomes a [HT x 576] x [576 x 32] and a [HT x 32] x [32 x 512]
// GEMM per 32-key tile instead of HT matrix-vector products.
//
// Grid (num_splits * nht, B), nht = cdiv(Hq, HT); 256 threads (8 warps), 1 CTA per SM. Per 32-key tile:
//   1. cp.async brings the 32 cache rows (36 KiB) into one of two shared buffers (the next tile loads
//      while this one computes); rows past the split are zero-filled;
//   2. S = Q K^T: 4 * MT (m16 x n8) tiles over the warps (a warp takes 2 n8 tiles of one m-tile when
//      MT > 2, so its Q fragments are read once for both), 36 k-steps each, A (Q, resident in shared
//      memory) and B (K rows) through ldmatrix; scaled, masked (keys past the range), written to sS;
//   3. online softmax: 4 threads per head row, 8 keys each: new max, alpha = 2^(m_old - m_new),
//      P = 2^(s - m_new) rounded to T into sP, l updated in fp32;
//   4. O = alpha * O + P V: warp w owns output columns [64w, 64w + 64) of all HT rows (MT * 8 n8 tiles,
//      128 fp32 accumulators per lane at MT = 4), A (P) by ldmatrix, B (V, key-major in shared memory)
//      by ldmatrix.trans.
// Split-KV as in decode.cu: chunks of max(256, align(cdiv(n, num_splits), 32)) keys; one active split
// writes out/lse directly, else partials go to the workspace and the last CTA combines them.
//
// Launch assumptions: contiguous tensors, 16-byte aligned data pointers, seq_lens[b] <= max_blocks *
// block_size, num_splits * HT <= 1024 (the combine weights live in the K buffers). Dynamic shared
// memory 74768 + 1404 * HT bytes (164,624 at HT = 64: within sm_80's 163 KiB opt-in).
//
// NVRTC-compatible: no host code, no standard headers.
#include "decode_common.cuh"

namespace tkd {

#define MLA_R 512
#define MLA_P 64
#define MLA_DK 576               // R + P: the key row
#define MLA_NK 32                // keys per tile
#define MLA_THREADS 256
#define MLA_KS (MLA_DK + 8)      // shared row stride of K and Q (elements): 1168 bytes, 16 mod 128
#define MLA_SS 36                // sS row stride (floats)
#define MLA_PS 40                // sP row stride (elements): 80 bytes
#define MLA_MIN_CHUNK 256
#define MLA_SK_BYTES (2 * MLA_NK * MLA_KS * 2) // 74752

struct MlaRows {
    int b, Hq, h0;
    __device__ __forceinline__ i64 out_row(int r) const { return (i64)b * Hq + h0 + r; }
    __device__ __forceinline__ i64 lse_idx(int r) const { return (i64)b * Hq + h0 + r; }
};

template <typename T>
__device__ __forceinline__ void mla_cta(unsigned char *smem,
                                        T *__restrict__ out,            // [B, Hq, R] T
                                        const T *__restrict__ q_nope,   // [B, Hq, R] T
                                        const T *__restrict__ q_pe,     // [B, Hq, P] T
                                        const T *__restrict__ kv_cache, // [nb, bs, R + P] T
                                        const int *__restrict__ block_table, // [B, max_blocks] i32
                                        const int *__restrict__ seq_lens,    // [B] i32
                                        float *__restrict__ lse,             // [B, Hq] f32 or null
                                        float scale, unsigned char *__restrict__ ws, int Hq, int bs,
                                        int max_blocks, int ns)
{
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int MT = min(4, (Hq + 15) >> 4), HT = MT * 16;
    const int nht = (Hq + HT - 1) / HT;
    const int ht = blockIdx.x % nht, split = blockIdx.x / nht, b = blockIdx.y;
    const int h0 = ht * HT, rows = min(HT, Hq - h0);
    const MlaRows map = {b, Hq, h0};

    T *sK = reinterpret_cast<T *>(smem);                              // [2][32][584]
    T *sQ = reinterpret_cast<T *>(smem + MLA_SK_BYTES);               // [HT][584]
    float *sS = reinterpret_cast<float *>(smem + MLA_SK_BYTES + HT * MLA_KS * 2); // [HT][36]
    T *sP = reinterpret_cast<T *>(sS + HT * MLA_SS);                  // [HT][40]
    float *sAlpha = reinterpret_cast<float *>(sP + HT * MLA_PS);      // [HT]
    float2 *sRow = reinterpret_cast<float2 *>(sAlpha + HT);           // [HT]
    int *sFlag = reinterpret_cast<int *>(sRow + HT);

    const int seq = seq_lens[b];
    const int kend = (int)min((i64)seq, (i64)max_blocks * bs);
    const int n = max(0, kend);
    const int chunk = max(MLA_MIN_CHUNK, (int)((cdiv(n, ns) + 31) / 32 * 32));
    const int active = max(1, (int)cdiv(n, chunk));
    if (split >= active)
        return;
    const int s0 = split * chunk, s1 = min(kend, s0 + chunk);
    const int ntiles = s1 > s0 ? (s1 - s0 + MLA_NK - 1) / MLA_NK : 0;
    const float sm = (scale == 0.0f ? 1.0f / sqrtf((float)MLA_DK) : scale) * TKD_LOG2E;
    const int *bt = block_table + (i64)b * max_blocks;

    // tile `tile` of the split -> sK[stage]: thread = (row tid / 8, 16-byte columns tid % 8 + 8i)
    auto issue = [&](int tile, int stage) {
        const int row = tid >> 3, sub = tid & 7, key = s0 + tile * MLA_NK + row;
        const bool ok = key < s1;
        i64 roff = 0;
        if (ok) {
            const int lb = key / bs;
            roff = ((i64)bt[lb] * bs + (key - lb * bs)) * MLA_DK;
        }
        T *dst = sK + (stage * MLA_NK + row) * MLA_KS;
#pragma unroll
        for (int i = 0; i < MLA_DK / 64; i++) {
            const int ch = sub + 8 * i;
            cp_async16(dst + ch * 8, kv_cache + roff + ch * 8, ok);
        }
    };
    if (ntiles > 0)
        issue(0, 0);
    cp_async_commit();

    // Q tile: rows = heads h0 .. h0 + HT - 1 (zero past Hq), columns q_nope then q_pe
    for (int idx = tid; idx < HT * (MLA_DK / 8); idx += MLA_THREADS) {
        const int r = idx / (MLA_DK / 8), c = idx - r * (MLA_DK / 8);
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (r < rows) {
            const i64 h = (i64)b * Hq + h0 + r;
            v = c < MLA_R / 8 ? *reinterpret_cast<const uint4 *>(q_nope + h * MLA_R + c * 8)
                              : *reinterpret_cast<const uint4 *>(q_pe + h * MLA_P + (c - MLA_R / 8) * 8);
        }
        *reinterpret_cast<uint4 *>(sQ + r * MLA_KS + c * 8) = v;
    }

    // softmax state: thread tid < 4 * HT owns row tid / 4 (keys (tid % 4) * 8 .. + 7 of a tile)
    const int sr = tid >> 2, sq = tid & 3;
    float m_run = neg_inf(), l_run = 0.0f;
    float o[4][8][4]; // [m-tile][n8 tile of the warp's 64 columns][fragment]
#pragma unroll
    for (int mt = 0; mt < 4; mt++)
#pragma unroll
        for (int nn = 0; nn < 8; nn++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                o[mt][nn][e] = 0.0f;

    // ldmatrix lane address parts: A fragments (rows +0..15, column halves) and B (.x4 over 8 rows)
    const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8, a_col = (lane >> 4) * 8;
    const int b_row = lane & 7, b_col = (lane >> 3) * 8;
    // S work split: 4 * MT (m16, n8) tiles; with more than 8 a warp takes 2 n8 tiles of one m-tile
    const int npt = 4 * MT > 8 ? 2 : 1, ntask = 4 * MT / npt;

    for (int it = 0; it < ntiles; it++) {
        const int stage = it & 1;
        if (it + 1 < ntiles)
            issue(it + 1, stage ^ 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const T *kS = sK + stage * MLA_NK * MLA_KS;
        const int kt = s0 + it * MLA_NK;

        // 2. S: task = (m-tile mt, npt consecutive n8 tiles from nt0); the Q fragments of a k-step serve
        //    all npt key tiles; two accumulators per tile (even / odd k16 step) halve the mma chain
        for (int task = warp; task < ntask; task += MLA_THREADS / 32) {
            const int mt = task / (4 / npt), nt0 = (task % (4 / npt)) * npt;
            float acc[2][2][4];
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int st = 0; st < 2; st++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        acc[j][st][e] = 0.0f;
            const T *qa = sQ + (mt * 16 + a_row) * MLA_KS + a_col;
            const T *kb = kS + (nt0 * 8 + b_row) * MLA_KS + b_col;
#pragma unroll 6
            for (int kc = 0; kc < MLA_DK / 32; kc++) {
                u32 a[4], a2[4];
                ldmatrix_x4(a, qa + kc * 32);      // k 0..15 of the 32-column chunk
                ldmatrix_x4(a2, qa + kc * 32 + 16); // k 16..31
#pragma unroll
                for (int j = 0; j < 2; j++)
                    if (j < npt) {
                        u32 bb[4]; // b0, b1 of k 0..15, b0, b1 of k 16..31 for keys (nt0 + j) * 8 + 0..7
                        ldmatrix_x4(bb, kb + j * 8 * MLA_KS + kc * 32);
                        mma16816<T>(acc[j][0], a[0], a[1], a[2], a[3], bb[0], bb[1]);
                        mma16816<T>(acc[j][1], a2[0], a2[1], a2[2], a2[3], bb[2], bb[3]);
                    }
            }
#pragma unroll
            for (int j = 0; j < 2; j++)
                if (j < npt)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int col = (nt0 + j) * 8 + 2 * t + (e & 1), row = mt * 16 + g + (e >> 1) * 8;
                        sS[row * MLA_SS + col] = kt + col < s1 ? (acc[j][0][e] + acc[j][1][e]) * sm : neg_inf();
                    }
        }
        __syncthreads();

        // 3. online softmax over the tile's 32 keys
        if (sr < HT) { // whole warps: 4 * HT is a multiple of 64
            const float4 x0 = *reinterpret_cast<const float4 *>(sS + sr * MLA_SS + sq * 8);
            const float4 x1 = *reinterpret_cast<const float4 *>(sS + sr * MLA_SS + sq * 8 + 4);
            float x[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
            float mx = x[0];
#pragma unroll
            for (int k = 1; k < 8; k++)
                mx = fmaxf(mx, x[k]);
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mn = fmaxf(m_run, mx), ms = mn == neg_inf() ? 0.0f : mn;
            const float alpha = exp2f(m_run - ms);
            float sum = 0.0f;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                x[k] = exp2f(x[k] - ms);
                sum += x[k];
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            l_run = l_run * alpha + sum;
            m_run = mn;
            store8<T>(sP + sr * MLA_PS + sq * 8, x);
            if (sq == 0)
                sAlpha[sr] = alpha;
        }
        __syncthreads();

        // 4. O = alpha O + P V over the warp's 64 columns
#pragma unroll
        for (int mt = 0; mt < 4; mt++)
            if (mt < MT) {
                const float a0 = sAlpha[mt * 16 + g], a1 = sAlpha[mt * 16 + g + 8];
#pragma unroll
                for (int nn = 0; nn < 8; nn++) {
                    o[mt][nn][0] *= a0;
                    o[mt][nn][1] *= a0;
                    o[mt][nn][2] *= a1;
                    o[mt][nn][3] *= a1;
                }
            }
#pragma unroll
        for (int ks = 0; ks < MLA_NK / 16; ks++) {
            u32 bv[4][4]; // [n8 pair np]: b0, b1 of n-tile 2np, b0, b1 of n-tile 2np + 1
#pragma unroll
            for (int np = 0; np < 4; np++)
                ldmatrix_x4_trans(bv[np], kS + (ks * 16 + a_row) * MLA_KS + warp * 64 + np * 16 + a_col);
#pragma unroll
            for (int mt = 0; mt < 4; mt++)
                if (mt < MT) {
                    u32 pa[4];
                    ldmatrix_x4(pa, sP + (mt * 16 + a_row) * MLA_PS + ks * 16 + a_col);
#pragma unroll
                    for (int np = 0; np < 4; np++) {
                        mma16816<T>(o[mt][2 * np], pa[0], pa[1], pa[2], pa[3], bv[np][0], bv[np][1]);
                        mma16816<T>(o[mt][2 * np + 1], pa[0], pa[1], pa[2], pa[3], bv[np][2], bv[np][3]);
                    }
                }
        }
        __syncthreads(); // sK[stage], sS, sP and sAlpha are rewritten next
    }
    cp_async_wait<0>();

    if (sr < HT && sq == 0)
        sRow[sr] = make_float2(m_run, l_run);
    __syncthreads();

    if (active == 1) {
#pragma unroll
        for (int mt = 0; mt < 4; mt++)
            if (mt < MT)
#pragma unroll
                for (int hi = 0; hi < 2; hi++) {
                    const int r = mt * 16 + g + hi * 8;
                    if (r < rows) {
                        const float L = sRow[r].y, inv = L > 0.0f ? 1.0f / L : 0.0f;
                        T *dst = out + map.out_row(r) * MLA_R + warp * 64 + 2 * t;
#pragma unroll
                        for (int nn = 0; nn < 8; nn++)
                            *reinterpret_cast<u32 *>(dst + nn * 8) =
                                pack2<T>(o[mt][nn][2 * hi] * inv, o[mt][nn][2 * hi + 1] * inv);
                    }
                }
        if (lse && tid < rows) {
            const float2 ml = sRow[tid];
            lse[map.lse_idx(tid)] = ml.y > 0.0f ? (ml.x + log2f(ml.y)) * TKD_LN2 : neg_inf();
        }
        return;
    }

    const i64 U = (i64)gridDim.y * nht;
    const i64 u = (i64)b * nht + ht;
    const SplitWs w = split_ws(ws, U, ns, HT);
    const i64 slot = u * ns + split;
    if (tid < rows)
        w.ml[slot * HT + tid] = sRow[tid];
#pragma unroll
    for (int mt = 0; mt < 4; mt++)
        if (mt < MT)
#pragma unroll
            for (int hi = 0; hi < 2; hi++) {
                const int r = mt * 16 + g + hi * 8;
                if (r < rows) {
                    float *dst = w.o + (slot * HT + r) * MLA_R + warp * 64 + 2 * t;
#pragma unroll
                    for (int nn = 0; nn < 8; nn++)
                        *reinterpret_cast<float2 *>(dst + nn * 8) =
                            make_float2(o[mt][nn][2 * hi], o[mt][nn][2 * hi + 1]);
                }
            }
    __threadfence();
    __syncthreads();
    if (tid == 0)
        *sFlag = atomicAdd(&w.cnt[u], 1u) == (u32)(active - 1);
    __syncthreads();
    if (!*sFlag)
        return;
    __threadfence();
    split_combine<T, MLA_R, MLA_THREADS>(out, lse, w, u, ns, active, HT, rows, 1.0f,
                                         reinterpret_cast<float *>(smem), map);
}

} // namespace tkd

// ---- entry point (name expressions "tk_mla_decode<__half>", "tk_mla_decode<__nv_bfloat16>") ------

template <typename T>
__global__ void __launch_bounds__(MLA_THREADS, 1)
    tk_mla_decode(T *__restrict__ out,                 // [B, Hq, R] T
                  const T *__restrict__ q_nope,        // [B, Hq, R] T
                  const T *__restrict__ q_pe,          // [B, Hq, P] T
                  const T *__restrict__ kv_cache,      // [num_blocks, block_size, R + P] T
                  const int *__restrict__ block_table, // [B, max_blocks] i32
                  const int *__restrict__ seq_lens,    // [B] i32
                  float *__restrict__ lse,             // [B, Hq] f32, optional
                  float scale,
                  unsigned char *__restrict__ ws,      // workspace (zero-filled)
                  int Hq, int block_size, int max_blocks, int num_splits)
{
    extern __shared__ __align__(16) unsigned char tkd_mla_smem[];
    tkd::mla_cta<T>(tkd_mla_smem, out, q_nope, q_pe, kv_cache, block_table, seq_lens, lse, scale, ws, Hq,
                    block_size, max_blocks, num_splits);
}
