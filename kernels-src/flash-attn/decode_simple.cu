// decode_simple.cu — attention_decode of kernels-community/flash-attn on CUDA cores: the fallback for
// every call the tensor-core kernels of decode.cu do not take (head dims other than 64, 128 and 256,
// f32 queries, f16/bf16 caches under f32 queries, element-aligned views). Same op, same semantics
// (ops/attention.c, attention_decode): a paged KV cache, GQA, 1..16 new queries per sequence, causal
// with an optional left window, softcap, ALiBi, lse, i8 / fp8 e4m3fn caches with per-kv-head scales.
//
// Variants: tk_fa::decode_simple<T, C, 512> with T = float, __half or __nv_bfloat16 (q, out) and C the
// cache element: T itself, __half / __nv_bfloat16 under T = float, signed char (i8) or tk_fa::e4m3
// (fp8 e4m3fn); any head dim D <= 512 (the manifest bounds q.shape[3]), any block_size >= 1.
//
// Work split: grid (Hq * Sq, B), block 128 (4 warps). A CTA owns one query row: query token i of head h
// of sequence b (blockIdx.x = h * Sq + i). The warps take 32-key tiles of the row's visible keys in
// turn (fwd_simple.cu's scheme): lane j scores key j0 + j (q in shared memory as fp32, the key row read
// element by element), the warp's max and an online-softmax update follow, then every lane accumulates
// its output columns d = lane + 32e over the tile's weights (v rows read coalesced across lanes). The 4
// warp states (m, l, O) are merged in shared memory at the end.
//
// Masking (flash-attn 2, as the CPU reference): query i of a sequence with seq_lens[b] = S keys sits at
// p = S - Sq + i and sees keys j with max(0, p - window_left) <= j <= p (window_left < 0: no left bound)
// and j < max_blocks * block_size (keys past the table are ignored). score = scale * q.k (scale 0:
// 1/sqrt(D)); with softcap > 0, score = softcap * tanh(score / softcap); ALiBi subtracts slope[h] * (p -
// j). A row that sees no key (S = 0, or S < Sq for its first rows) outputs 0 and lse = -inf.
// Quantised caches: every element is dequantised to fp32 as stored * scale (k_scale[hk], v_scale[hk]),
// as the CPU reference does.
//
// Numerics: fp32 throughout (scores in the base-2 domain, exponentials with ex2.approx); the output is
// rounded once to T; lse is natural-log f32.
//
// Launch assumptions: all tensors contiguous and element-aligned (no vector loads, so any address tk
// accepts works); Hq % Hkv == 0; block_table entries of the used blocks valid. No workspace.
//
// NVRTC-compatible: no host code, no standard headers.
#include "common.cuh"

namespace tk_fa {

// The fp8 e4m3fn cache element (a tag type, so the template parameter names the encoding).
struct e4m3 {
    unsigned char x;
};

// One cache element as fp32 (exact for every cache dtype).
__device__ __forceinline__ float kv_f32(float x) { return x; }
__device__ __forceinline__ float kv_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float kv_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float kv_f32(signed char x) { return (float)x; }
__device__ __forceinline__ float kv_f32(e4m3 x) { return fp8_e4m3_to_f32(x.x); }

#define DECS_WARPS 4

template <typename T, typename C, int DMAX>
__global__ void __launch_bounds__(DECS_WARPS * 32)
    decode_simple(T *__restrict__ out,                 // [B, Sq, Hq, D] T
                  const T *__restrict__ q,             // [B, Sq, Hq, D] T
                  const C *__restrict__ k_cache,       // [num_blocks, block_size, Hkv, D] C
                  const C *__restrict__ v_cache,       // [num_blocks, block_size, Hkv, D] C
                  const int *__restrict__ block_table, // [B, max_blocks] i32
                  const int *__restrict__ seq_lens,    // [B] i32
                  float *__restrict__ lse,             // [B, Hq, Sq] f32 or null
                  const float *__restrict__ k_scale,   // [Hkv] f32 or null (i8 / fp8 caches)
                  const float *__restrict__ v_scale,   // [Hkv] f32 or null
                  const float *__restrict__ alibi,     // [Hq] f32 or null
                  float scale, i64 window_left, float softcap, int Sq, int Hq, int Hkv, int block_size,
                  int max_blocks, int D)
{
    constexpr int NV = DMAX / 32;
    __shared__ float sq_[DMAX];
    __shared__ float so_[DECS_WARPS][DMAX];
    __shared__ float sm_[DECS_WARPS], sl_[DECS_WARPS];
    if (D > DMAX)
        return; // the manifest's constraints keep D <= DMAX
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int i = blockIdx.x % Sq, h = blockIdx.x / Sq, b = blockIdx.y;
    const int hk = h / (Hq / Hkv);
    const i64 row = ((i64)b * Sq + i) * Hq + h; // of q and out, in rows of D

    for (int d = threadIdx.x; d < D; d += DECS_WARPS * 32)
        sq_[d] = to_f32(q[row * D + d]);
    __syncthreads();

    // the visible keys [klo, khi)
    const i64 seq = seq_lens[b], p = seq - Sq + i;
    const i64 kend = min(seq, (i64)max_blocks * block_size);
    const i64 khi = min(p + 1, kend);
    const i64 klo = (window_left < 0 || window_left >= p) ? 0 : p - window_left;

    const float sc = scale == 0.0f ? 1.0f / sqrtf((float)D) : scale;
    const bool use_sc = softcap > 0.0f;
    const float slope = alibi ? alibi[h] : 0.0f;
    const float ks = k_scale ? k_scale[hk] : 1.0f, vs = v_scale ? v_scale[hk] : 1.0f;
    const int *bt = block_table + (i64)b * max_blocks;
    const i64 tok = (i64)Hkv * D; // elements between consecutive tokens of a block

    float m = TK_FA_NEG_INF, l = 0.0f, o[NV];
#pragma unroll
    for (int e = 0; e < NV; e++)
        o[e] = 0.0f;

    for (i64 j0 = klo + (i64)warp * 32; j0 < khi; j0 += DECS_WARPS * 32) { // warp-uniform
        const i64 j = j0 + lane;
        float x = TK_FA_NEG_INF;
        i64 base = 0; // element offset of key j's row of head hk
        if (j < khi) {
            const i64 lb = j / block_size;
            base = ((i64)bt[lb] * block_size + (j - lb * block_size)) * tok + (i64)hk * D;
            const C *kr = k_cache + base;
            float dot = 0.0f;
            for (int d = 0; d < D; d++)
                dot = fmaf(sq_[d], kv_f32(kr[d]) * ks, dot);
            float s = sc * dot;
            if (use_sc)
                s = softcap * tanhf(s / softcap);
            s -= slope * (float)(p - j);
            x = s * TK_FA_LOG2E;
        }
        float mx = x;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        const float mnew = fmaxf(m, mx);
        const float mu = mnew == TK_FA_NEG_INF ? 0.0f : mnew;
        const float corr = ex2(m - mu);
        const float pj = ex2(x - mu);
        m = mnew;
        l = l * corr + pj; // per-lane partial sums, reduced at the end
#pragma unroll
        for (int e = 0; e < NV; e++)
            o[e] *= corr;
        const int nj = (int)min((i64)32, khi - j0);
        for (int jj = 0; jj < nj; jj++) {
            const float w = __shfl_sync(0xffffffffu, pj, jj);
            const i64 vb = __shfl_sync(0xffffffffu, base, jj);
            if (w == 0.0f) // warp-uniform: underflowed
                continue;
            const C *vr = v_cache + vb;
#pragma unroll
            for (int e = 0; e < NV; e++) {
                const int d = lane + 32 * e;
                if (d < D)
                    o[e] = fmaf(w, kv_f32(vr[d]) * vs, o[e]);
            }
        }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        l += __shfl_xor_sync(0xffffffffu, l, off);

    // merge the warps: M = max m_w, L = sum l_w 2^(m_w - M), O = sum O_w 2^(m_w - M) / L
    if (lane == 0) {
        sm_[warp] = m;
        sl_[warp] = l;
    }
#pragma unroll
    for (int e = 0; e < NV; e++) {
        const int d = lane + 32 * e;
        if (d < D)
            so_[warp][d] = o[e];
    }
    __syncthreads();
    float M = TK_FA_NEG_INF, L = 0.0f, wt[DECS_WARPS];
#pragma unroll
    for (int w = 0; w < DECS_WARPS; w++)
        M = fmaxf(M, sm_[w]);
#pragma unroll
    for (int w = 0; w < DECS_WARPS; w++) {
        wt[w] = sm_[w] == TK_FA_NEG_INF ? 0.0f : exp2f(sm_[w] - M);
        L += sl_[w] * wt[w];
    }
    const float inv = L == 0.0f ? 0.0f : 1.0f / L; // NaN scores give NaN, as in the CPU reference
    T *orow = out + row * D;
    for (int d = threadIdx.x; d < D; d += DECS_WARPS * 32) {
        float acc = 0.0f;
#pragma unroll
        for (int w = 0; w < DECS_WARPS; w++)
            acc = fmaf(wt[w], so_[w][d], acc);
        orow[d] = from_f32<T>(acc * inv);
    }
    if (lse && threadIdx.x == 0)
        lse[((i64)b * Hq + h) * Sq + i] = L == 0.0f ? TK_FA_NEG_INF : (M + log2f(L)) * TK_FA_LN2;
}

} // namespace tk_fa
