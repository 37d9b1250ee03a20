// decode.cu — attention_decode of kernels-community/flash-attn: split-KV flash-decoding over a paged
// KV cache, on tensor cores (mma.sync m16n8k16, fp32 accumulation), in one launch.
//
// Variants: tk_attention_decode<T, KV, D> with T = __half or __nv_bfloat16 (q, out) and KV = KV_SAME (the
// cache is T), KV_I8 or KV_FP8 (int8 / fp8 e4m3fn cache with per-kv-head scales k_scale, v_scale);
// head dim D in {64, 128, 256} (one instantiation each; the manifest pins q.shape[3] per kernel with
// min/max constraints), any block_size >= 1.
//
// Work split: grid (num_splits * nqt, Hkv, B), 128 threads (4 warps). A CTA owns one kv head hk of one
// sequence b, one tile of 16 query rows of that head's GQA group (row = si * G + gi: query token si,
// head hk * G + gi; nqt = cdiv(G * Sq, 16) tiles, usually 1) and one contiguous range of keys (its
// split). K and V are read once per CTA for all the query rows of the tile; the q tiles of a group
// are adjacent CTAs, so for G * Sq > 16 they share the K/V reads through L2. The warps take 16-key
// tiles of the range in turn, each with its own online softmax state; the 4 warp states are merged in
// shared memory at the end.
//
// Per 16-key tile a lane of group g (= lane / 4), t (= lane % 4) loads, for keys tile + g and
// tile + 8 + g, the 8 elements t*8..t*8+7 of every 32-column chunk of the K and V rows (16-byte loads,
// 8-byte for an 8-bit cache, coalesced 64/32 bytes per key per 4 lanes). Those registers ARE the B
// fragments of S = Q K^T after a permutation of the reduction dimension (k index 2t+i of mma step s
// of chunk c is column c*32 + t*8 + s*4 + i, k index 2t+8+i is c*32 + t*8 + s*4 + 2 + i), and Q's A
// fragments are read from shared memory with the same permutation. The S accumulators become P's A
// fragments without data movement (flash-attention 2's register reuse). V's B fragments need the
// key-major transpose: movmatrix.trans on each 8x8 block of the loaded V registers gives them, and the
// output columns of n-tile (c, j) come out as c*32 + t*8 + 2j + {0, 1}, so every lane owns 8
// contiguous output columns per chunk. At D = 256 K and V are held 4 chunks (128 columns) at a time and
// V is loaded after S, which keeps the kernel under 255 registers without spills.
//
// Split-KV: the key range [kbeg, kend) of a sequence (kbeg > 0 only with a sliding window) is cut into
// chunks of max(256, align(cdiv(n, num_splits), 64)) keys; `active` = the number of non-empty chunks.
// CTAs past `active` exit at once. With one active split the CTA writes out and lse directly. Else
// every CTA writes its unnormalised output rows and (m, l) to the workspace, bumps the unit's counter
// after __threadfence(), and the last one to arrive combines them (split_combine). The workspace is
// zero-filled by tk before every launch, so the counters start at 0; the manifest asks for 0 bytes when
// num_splits is 1.
//
// Masking (flash-attn 2 conventions): query token si of a sequence with seq_lens[b] = S keys sits at
// p = S - Sq + si; key j is visible iff j <= p and (window_left < 0 or j >= p - window_left).
// score = scale * q.k (scale 0: 1/sqrt(D)); with softcap > 0, score = softcap * tanh(score / softcap);
// then ALiBi adds -slope[h] * (p - j). A row with no visible key outputs 0 and lse = -inf.
// 8-bit caches: k_scale[hk] is folded into the score scale and v_scale[hk] into the output, so
// q.(k * s) is computed as s * (q.k) with k exact in T.
//
// Launch assumptions: all tensors contiguous; q, out, k_cache, v_cache 16-byte aligned (8-byte for an
// 8-bit cache); Hq % Hkv == 0; seq_lens[b] <= max_blocks * block_size (keys past the table are
// ignored) and block_table entries of used blocks valid; num_splits <= 64 (sW below).
//
// NVRTC-compatible: no host code, no standard headers.
#include "decode_common.cuh"

namespace tkd {

#define DEC_THREADS 128
#define DEC_WARPS 4
#define DEC_MIN_CHUNK 256
// shared memory: sQ [16][D + 32] T | sO [16][D + 4] f32 (merged warp outputs; later the combine
// weights, <= 64 splits x 16 rows = 4 KiB <= sO) | sML [4 warps][16] float2 | sRow [16] float2 | flag
#define DEC_SQ_BYTES(D) (16 * ((D) + 32) * 2)
#define DEC_SO_BYTES(D) (16 * ((D) + 4) * 4)
#define DEC_SMEM(D) (DEC_SQ_BYTES(D) + DEC_SO_BYTES(D) + DEC_WARPS * 16 * 8 + 16 * 8 + 16)

// Tile row r of a decode CTA -> its row of q/out ([B, Sq, Hq, D] as rows of D) and its lse index.
struct DecRows {
    int b, Sq, Hq, G, hk, qt;
    __device__ __forceinline__ i64 out_row(int r) const
    {
        const int rr = qt * 16 + r, si = rr / G, gi = rr - si * G;
        return ((i64)b * Sq + si) * Hq + hk * G + gi;
    }
    __device__ __forceinline__ i64 lse_idx(int r) const // lse [B, Hq, Sq]
    {
        const int rr = qt * 16 + r, si = rr / G, gi = rr - si * G;
        return ((i64)b * Hq + hk * G + gi) * Sq + si;
    }
};

template <typename T, int KV, int D>
__device__ __forceinline__ void decode_cta(unsigned char *smem,
                                           T *__restrict__ out,               // [B, Sq, Hq, D] T
                                           const T *__restrict__ q,           // [B, Sq, Hq, D] T
                                           const void *__restrict__ k_cache,  // [nb, bs, Hkv, D] KV
                                           const void *__restrict__ v_cache,  // [nb, bs, Hkv, D] KV
                                           const int *__restrict__ block_table, // [B, max_blocks] i32
                                           const int *__restrict__ seq_lens,  // [B] i32
                                           float *__restrict__ lse,           // [B, Hq, Sq] f32 or null
                                           const float *__restrict__ k_scale, // [Hkv] f32 or null
                                           const float *__restrict__ v_scale, // [Hkv] f32 or null
                                           const float *__restrict__ alibi,   // [Hq] f32 or null
                                           float scale, i64 window_left, float softcap,
                                           unsigned char *__restrict__ ws, int Sq, int Hq, int Hkv, int bs,
                                           int max_blocks, int ns)
{
    constexpr int NC = D / 32; // 32-column chunks of a row
    constexpr int QS = D + 32; // sQ row stride (elements): rows 64 bytes apart mod 128, no bank conflicts
    constexpr int OS = D + 4;  // sO row stride (floats)
    constexpr int C8 = D / 8;
    constexpr int CG = NC < 4 ? NC : 4;   // chunks of K (and V) held in registers at a time
    constexpr bool VEARLY = CG == NC;     // V loaded together with K (D <= 128)
    T *sQ = reinterpret_cast<T *>(smem);
    float *sO = reinterpret_cast<float *>(smem + DEC_SQ_BYTES(D));
    float2 *sML = reinterpret_cast<float2 *>(smem + DEC_SQ_BYTES(D) + DEC_SO_BYTES(D));
    float2 *sRow = sML + DEC_WARPS * 16;
    int *sFlag = reinterpret_cast<int *>(sRow + 16);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int G = Hq / Hkv, nrows = G * Sq, nqt = (nrows + 15) >> 4;
    const int qt = blockIdx.x % nqt, split = blockIdx.x / nqt;
    const int hk = blockIdx.y, b = blockIdx.z;
    const int rows = min(16, nrows - qt * 16);
    const DecRows map = {b, Sq, Hq, G, hk, qt};

    // this split's keys
    const int seq = seq_lens[b];
    const int kend = (int)min((i64)seq, (i64)max_blocks * bs);
    // window_left clamped so that p - wl cannot overflow (keys are < 2^31)
    const int wl = window_left < 0 ? -1 : (int)min(window_left, (i64)0x3fffffff);
    const int kbeg = wl < 0 ? 0 : max(0, seq - Sq - wl);
    const int n = max(0, kend - kbeg);
    const int chunk = max(DEC_MIN_CHUNK, (int)((cdiv(n, ns) + 63) / 64 * 64));
    const int active = max(1, (int)cdiv(n, chunk));
    if (split >= active)
        return;
    const int s0 = kbeg + split * chunk, s1 = min(kend, s0 + chunk);

    // Q tile -> shared (zero rows past the tile), sO = 0
    for (int idx = tid; idx < 16 * C8; idx += DEC_THREADS) {
        const int r = idx / C8, c = idx - r * C8;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (r < rows)
            v = *reinterpret_cast<const uint4 *>(q + map.out_row(r) * D + c * 8);
        *reinterpret_cast<uint4 *>(sQ + r * QS + c * 8) = v;
    }
    for (int idx = tid; idx < 16 * OS; idx += DEC_THREADS)
        sO[idx] = 0.0f;

    // the lane's two rows: g and g + 8
    int pos[2];
    float slope[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = g + 8 * i;
        pos[i] = -1; // a padding row: nothing visible (keys are >= 0)
        slope[i] = 0.0f;
        if (r < rows) {
            const int rr = qt * 16 + r, si = rr / G, gi = rr - si * G;
            pos[i] = seq - Sq + si;
            if (alibi)
                slope[i] = alibi[hk * G + gi];
        }
    }
    const float sm = (scale == 0.0f ? 1.0f / sqrtf((float)D) : scale) * (k_scale ? k_scale[hk] : 1.0f);
    __syncthreads();

    float o[NC][4][4];
#pragma unroll
    for (int c = 0; c < NC; c++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                o[c][j][e] = 0.0f;
    float mrow[2] = {neg_inf(), neg_inf()}, lrow[2] = {0.0f, 0.0f};

    const int *bt = block_table + (i64)b * max_blocks;
    const i64 tok_stride = (i64)Hkv * D; // elements between consecutive tokens of a block
    for (int kt = s0 + warp * 16; kt < s1; kt += DEC_WARPS * 16) {
        // element offsets of this lane's two key rows (+ t*8), -1 for keys past the split
        i64 roff[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int key = kt + h * 8 + g;
            roff[h] = -1;
            if (key < s1) {
                const int lb = key / bs;
                roff[h] = ((i64)bt[lb] * bs + (key - lb * bs)) * tok_stride + (i64)hk * D + t * 8;
            }
        }
        // S = Q K^T for rows g, g+8 and keys kt + h*8 + 2t + {0, 1}, CG chunks of K in registers at a
        // time; V is loaded with K when it all fits (D <= 128), else one chunk group at a time in P V
        float acc[2][4];
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[h][e] = 0.0f;
        u32 vr[2][CG][4];
#pragma unroll
        for (int cg = 0; cg < NC; cg += CG) {
            u32 kr[2][CG][4];
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int cc = 0; cc < CG; cc++) {
                    if (roff[h] >= 0) {
                        load8<T, KV>(kr[h][cc], k_cache, roff[h] + (cg + cc) * 32);
                        if (VEARLY)
                            load8<T, KV>(vr[h][cc], v_cache, roff[h] + (cg + cc) * 32);
                    } else {
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            kr[h][cc][e] = vr[h][cc][e] = 0u;
                    }
                }
#pragma unroll
            for (int cc = 0; cc < CG; cc++) {
                const int c = cg + cc;
                const uint4 qa = *reinterpret_cast<const uint4 *>(sQ + g * QS + c * 32 + t * 8);
                const uint4 qb = *reinterpret_cast<const uint4 *>(sQ + (g + 8) * QS + c * 32 + t * 8);
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    mma16816<T>(acc[h], qa.x, qb.x, qa.y, qb.y, kr[h][cc][0], kr[h][cc][1]);
                    mma16816<T>(acc[h], qa.z, qb.z, qa.w, qb.w, kr[h][cc][2], kr[h][cc][3]);
                }
            }
        }

        // scores (base 2), masks, online softmax
        float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int i = e >> 1, key = kt + h * 8 + 2 * t + (e & 1);
                float x = acc[h][e] * sm;
                if (softcap > 0.0f)
                    x = softcap * tanhf(x / softcap);
                x -= slope[i] * (float)(pos[i] - key);
                const bool vis = key < s1 && key <= pos[i] && (wl < 0 || key >= pos[i] - wl);
                x = vis ? x * TKD_LOG2E : neg_inf();
                acc[h][e] = x;
                mx[i] = fmaxf(mx[i], x);
            }
        float alpha[2], msub[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
            const float mn = fmaxf(mrow[i], mx[i]);
            msub[i] = mn == neg_inf() ? 0.0f : mn;
            alpha[i] = exp2f(mrow[i] - msub[i]);
            mrow[i] = mn;
        }
        float ps[2] = {0.0f, 0.0f};
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                acc[h][e] = exp2f(acc[h][e] - msub[e >> 1]);
                ps[e >> 1] += acc[h][e];
            }
#pragma unroll
        for (int i = 0; i < 2; i++)
            lrow[i] = lrow[i] * alpha[i] + ps[i];
#pragma unroll
        for (int c = 0; c < NC; c++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                o[c][j][0] *= alpha[0];
                o[c][j][1] *= alpha[0];
                o[c][j][2] *= alpha[1];
                o[c][j][3] *= alpha[1];
            }

        // O += P V: P's A fragment is the S accumulator layout (keys 0..7 from h = 0, 8..15 from h = 1)
        const u32 pa0 = pack2<T>(acc[0][0], acc[0][1]), pa1 = pack2<T>(acc[0][2], acc[0][3]);
        const u32 pa2 = pack2<T>(acc[1][0], acc[1][1]), pa3 = pack2<T>(acc[1][2], acc[1][3]);
#pragma unroll
        for (int cg = 0; cg < NC; cg += CG) {
            if (!VEARLY) {
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int cc = 0; cc < CG; cc++) {
                        if (roff[h] >= 0) {
                            load8<T, KV>(vr[h][cc], v_cache, roff[h] + (cg + cc) * 32);
                        } else {
#pragma unroll
                            for (int e = 0; e < 4; e++)
                                vr[h][cc][e] = 0u;
                        }
                    }
            }
#pragma unroll
            for (int cc = 0; cc < CG; cc++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    mma16816<T>(o[cg + cc][j], pa0, pa1, pa2, pa3, movmatrix_t(vr[0][cc][j]),
                                movmatrix_t(vr[1][cc][j]));
        }
    }

    // merge the 4 warps: row max M and sum L per row, then sO = sum over warps of O_w * 2^(m_w - M)
#pragma unroll
    for (int i = 0; i < 2; i++) {
        lrow[i] += __shfl_xor_sync(0xffffffffu, lrow[i], 1);
        lrow[i] += __shfl_xor_sync(0xffffffffu, lrow[i], 2);
    }
    if (t == 0) {
        sML[warp * 16 + g] = make_float2(mrow[0], lrow[0]);
        sML[warp * 16 + g + 8] = make_float2(mrow[1], lrow[1]);
    }
    __syncthreads();
    if (tid < 16) {
        float M = neg_inf(), L = 0.0f;
        for (int w = 0; w < DEC_WARPS; w++)
            M = fmaxf(M, sML[w * 16 + tid].x);
        for (int w = 0; w < DEC_WARPS; w++) {
            const float2 ml = sML[w * 16 + tid];
            if (ml.x != neg_inf())
                L += ml.y * exp2f(ml.x - M);
        }
        sRow[tid] = make_float2(M, L);
    }
    __syncthreads();
    {
        float f[2];
#pragma unroll
        for (int i = 0; i < 2; i++)
            f[i] = mrow[i] == neg_inf() ? 0.0f : exp2f(mrow[i] - sRow[g + 8 * i].x);
#pragma unroll
        for (int c = 0; c < NC; c++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int d = c * 32 + t * 8 + 2 * j;
                atomicAdd(&sO[g * OS + d], o[c][j][0] * f[0]);
                atomicAdd(&sO[g * OS + d + 1], o[c][j][1] * f[0]);
                atomicAdd(&sO[(g + 8) * OS + d], o[c][j][2] * f[1]);
                atomicAdd(&sO[(g + 8) * OS + d + 1], o[c][j][3] * f[1]);
            }
    }
    __syncthreads();

    const float vs = v_scale ? v_scale[hk] : 1.0f;
    if (active == 1) {
        for (int idx = tid; idx < rows * C8; idx += DEC_THREADS) {
            const int r = idx / C8, c = idx - r * C8;
            const float L = sRow[r].y, inv = L > 0.0f ? vs / L : 0.0f;
            float v[8];
#pragma unroll
            for (int k = 0; k < 8; k++)
                v[k] = sO[r * OS + c * 8 + k] * inv;
            store8<T>(out + map.out_row(r) * D + c * 8, v);
        }
        if (lse && tid < rows) {
            const float2 ml = sRow[tid];
            lse[map.lse_idx(tid)] = ml.y > 0.0f ? (ml.x + log2f(ml.y)) * TKD_LN2 : neg_inf();
        }
        return;
    }

    // partial -> workspace; the last CTA of the unit combines
    const i64 U = (i64)gridDim.y * gridDim.z * nqt;
    const i64 u = ((i64)b * Hkv + hk) * nqt + qt;
    const SplitWs w = split_ws(ws, U, ns, 16);
    const i64 slot = u * ns + split;
    if (tid < rows)
        w.ml[slot * 16 + tid] = sRow[tid];
    for (int idx = tid; idx < rows * (D / 4); idx += DEC_THREADS) {
        const int r = idx / (D / 4), c = idx - r * (D / 4);
        *reinterpret_cast<float4 *>(w.o + (slot * 16 + r) * D + c * 4) =
            *reinterpret_cast<const float4 *>(sO + r * OS + c * 4);
    }
    __threadfence();
    __syncthreads();
    if (tid == 0)
        *sFlag = atomicAdd(&w.cnt[u], 1u) == (u32)(active - 1);
    __syncthreads();
    if (!*sFlag)
        return;
    __threadfence();
    split_combine<T, D, DEC_THREADS>(out, lse, w, u, ns, active, 16, rows, vs, sO, map);
}

} // namespace tkd

// ---- entry point (name expressions "tk_attention_decode<__half, 0, 128>" ...; KV: 0 same, 1 i8, 2 fp8) --

template <typename T, int KV, int D>
__global__ void __launch_bounds__(DEC_THREADS)
    tk_attention_decode(T *__restrict__ out,                  // [B, Sq, Hq, D] T
                        const T *__restrict__ q,              // [B, Sq, Hq, D] T
                        const void *__restrict__ k_cache,     // [num_blocks, block_size, Hkv, D] KV
                        const void *__restrict__ v_cache,     // [num_blocks, block_size, Hkv, D] KV
                        const int *__restrict__ block_table,  // [B, max_blocks] i32
                        const int *__restrict__ seq_lens,     // [B] i32
                        float *__restrict__ lse,              // [B, Hq, Sq] f32, optional
                        const float *__restrict__ k_scale,    // [Hkv] f32, optional
                        const float *__restrict__ v_scale,    // [Hkv] f32, optional
                        const float *__restrict__ alibi_slopes, // [Hq] f32, optional
                        float scale, tkd::i64 window_left, float softcap,
                        unsigned char *__restrict__ ws,       // workspace (zero-filled)
                        int Sq, int Hq, int Hkv, int block_size, int max_blocks, int num_splits)
{
    __shared__ __align__(16) unsigned char smem[DEC_SMEM(D)];
    tkd::decode_cta<T, KV, D>(smem, out, q, k_cache, v_cache, block_table, seq_lens, lse, k_scale, v_scale,
                              alibi_slopes, scale, window_left, softcap, ws, Sq, Hq, Hkv, block_size, max_blocks,
                              num_splits);
}
