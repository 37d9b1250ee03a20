// fused_linear_ce.cu — the fused_linear_cross_entropy op of kernels-community/cross-entropy:
// logits = hidden @ weight^T (+ bias) and their cross-entropy, loss and gradients, in one launch, never
// materialising the [N, V] logits: each block owns BM = 64 tokens and streams the vocabulary past them
// in tiles of BN = 128 logits computed on the tensor cores (mma.sync m16n8k16, fp32 accumulation).
//
// Variants: tk_fused_linear_ce<T>, T = __half, __nv_bfloat16 (sm_80+).
//
// Per block (rows row0 .. row0 + 63):
//   pass 1  for each vocab tile: logits tile [64 x 128] = hidden[rows] . weight[tile]^T (+ bias),
//           folded into a per-thread online (m, d, s) for each of its rows (ce_common.cuh); the states
//           are merged over the block: lse, loss.
//   pass 2  (only when a gradient is asked for) for each vocab tile: the logits tile again, its
//           gradient g = scale (softmax - eps/V - (1 - eps) onehot) rounded to T into shared memory, then
//             grad_hidden[rows] += g . weight[tile]      (fp32, in the workspace: the block owns its rows,
//                                                        no atomics; written to T at the end)
//             grad_weight[tile] += g^T . hidden[rows]    (fp32 atomicAdd into the caller's tensor)
//             grad_bias[tile]   += column sums of g      (fp32 atomicAdd)
// So each weight tile is read 2x (forward only: 1x) per block, plus 1x per hidden chunk in pass 2, and
// no [N, V] buffer exists anywhere: the workspace is [N, H] fp32 plus the loss partials.
//
// What it is not: a TMA/wgmma persistent kernel. Tiles are staged through registers into padded
// shared memory (no cp.async pipeline), so expect it to be bound by L2 bandwidth on the weight tiles
// rather than by the tensor cores; the point is the memory: O(N H) instead of O(N V).
//
// Semantics as the CPU reference (ops/loss.c): ignore_index rows contribute nothing; mean divides by the
// non-ignored rows (0 when none); grad_weight and grad_bias are ACCUMULATED (+=, fp32), so the caller
// zeroes them first, or accumulates micro-batches; their atomic adds make them order-nondeterministic
// in the last bits. The gradient is rounded to T before the two backward GEMMs (as Liger-Kernel does).
// A target outside [0, V) that is not ignore_index gives NaN loss and NaN gradients for its row.
//
// Launch assumptions (kernel.json): grid.x = cdiv(N, 64), blockDim.x = 256, dynamic shared memory
// SMEM bytes (below). Tensors contiguous. 16-byte loads when H % 8 == 0 and hidden / weight are
// 16-byte aligned; element loads otherwise (any H).
//
// NVRTC-compatible: no host code, no standard headers.
#include "ce_common.cuh"

namespace tk_flce {

using namespace tk_ce;

constexpr int BM = 64;  // tokens per block
constexpr int BN = 128; // vocabulary columns per tile
constexpr int BK = 32;  // hidden columns per k-step of the logits GEMM
constexpr int HC = 128; // hidden columns per chunk of the backward GEMMs
constexpr int NT = 256; // threads: 8 warps
constexpr int PK = BK + 8, PG = BN + 8, PH = HC + 8; // padded pitches (elements): conflict-free fragments

// shared memory carve-up (bytes)
constexpr int SZ_A = (BM + BN) * PK * 2;             // logits GEMM: hs [BM][PK], wk [BN][PK]
constexpr int SZ_B = (BN + BM) * PH * 2;             // backward: wt [BN][PH], hs2 [BM][PH]
constexpr int OFF_G = SZ_A > SZ_B ? SZ_A : SZ_B;     // gs [BM][PG]: the gradient tile, T
constexpr int OFF_ST = OFF_G + BM * PG * 2;          // per (warp column, row) states: m, d, s, n
constexpr int OFF_ROW = OFF_ST + 4 * 4 * BM * 4;     // r_m, r_invd, r_xt, r_loss [BM] f32; r_t [BM] i64
constexpr int OFF_GB = OFF_ROW + 4 * BM * 4 + BM * 8; // column sums of g [BN] f32
constexpr int SMEM = OFF_GB + BN * 4;
static_assert(SMEM == 75776, "kernel.json's smem must match");

template <typename T> struct Mma;
template <> struct Mma<__half> {
    static __device__ __forceinline__ void run(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1)
    {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};
template <> struct Mma<__nv_bfloat16> {
    static __device__ __forceinline__ void run(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1)
    {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

template <typename T> struct __align__(4) Pair {
    T v[2];
};

__device__ __forceinline__ unsigned lds32(const void *p) { return *reinterpret_cast<const unsigned *>(p); }

__device__ __forceinline__ unsigned smem_addr(const void *p)
{
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// B fragment (k16 x n8) from a row-major [k][n] tile: rows k0 .. k0+15 at column n0.
__device__ __forceinline__ void ldm_b_trans(unsigned &b0, unsigned &b1, const void *row_k0_n0, int pitch_bytes)
{
    const int lane = threadIdx.x & 31;
    const char *p = reinterpret_cast<const char *>(row_k0_n0) + (lane & 15) * pitch_bytes;
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(b0), "=r"(b1)
                 : "r"(smem_addr(p))
                 : "memory");
}

// A fragment (m16 x k16) of A = S^T where S is a row-major [k][m] tile: S rows k0.., columns m0...
__device__ __forceinline__ void ldm_a_trans(unsigned (&a)[4], const void *row_k0_m0, int pitch_bytes)
{
    const int lane = threadIdx.x & 31, q = lane >> 3, r = lane & 7;
    const char *p = reinterpret_cast<const char *>(row_k0_m0) + (r + ((q & 2) ? 8 : 0)) * pitch_bytes +
                    ((q & 1) ? 16 : 0);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                 : "r"(smem_addr(p))
                 : "memory");
}

// Copies rows [r0, r0 + R) x columns [c0, c0 + C) of a row-major (rows x cols) matrix into shared
// memory at dst (pitch P elements), zero outside the matrix. 8 elements per step.
template <typename T, int R, int C, int P>
__device__ __forceinline__ void load_tile(T *dst, const T *src, tk_i64 rows, tk_i64 cols, tk_i64 r0, tk_i64 c0,
                                          bool vec)
{
    constexpr int CH = C / 8;
    for (int i = threadIdx.x; i < R * CH; i += NT) {
        const int r = i / CH, c = (i % CH) * 8;
        const tk_i64 gr = r0 + r, gc = c0 + c;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (gr < rows) {
            const T *s = src + gr * cols + gc;
            if (vec) {
                if (gc < cols) // cols % 8 == 0: all 8 are inside
                    v = *reinterpret_cast<const uint4 *>(s);
            } else {
                Pack<T> e; // 8 elements of a 16-bit T
#pragma unroll
                for (int k = 0; k < 8; k++)
                    e.v[k] = gc + k < cols ? s[k] : from_f32<T>(0.0f);
                v = *reinterpret_cast<const uint4 *>(&e);
            }
        }
        *reinterpret_cast<uint4 *>(dst + r * P + c) = v;
    }
}

// acc[mi][ni][.] = hidden[row0 + wm*32 + mi*16 .., :] . weight[v0 + wn*32 + ni*8 .., :]^T: the warp's
// 32 x 32 part of the [BM x BN] logits tile. Ends with a barrier (the staging buffers are free).
template <typename T>
__device__ __forceinline__ void logits_tile(float (&acc)[2][4][4], const T *hidden, const T *weight, tk_i64 n,
                                            tk_i64 v, tk_i64 h, tk_i64 row0, tk_i64 v0, bool vec, char *smem)
{
    T *hs = reinterpret_cast<T *>(smem);
    T *wk = hs + BM * PK;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wm = warp >> 2, wn = warp & 3;
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int c = 0; c < 4; c++)
                acc[mi][ni][c] = 0.0f;
    for (tk_i64 k0 = 0; k0 < h; k0 += BK) {
        load_tile<T, BM, BK, PK>(hs, hidden, n, h, row0, k0, vec);
        load_tile<T, BN, BK, PK>(wk, weight, v, h, v0, k0, vec);
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            unsigned a[2][4];
#pragma unroll
            for (int mi = 0; mi < 2; mi++) {
                const T *p = hs + (wm * 32 + mi * 16 + g) * PK + kk + 2 * t;
                a[mi][0] = lds32(p);
                a[mi][1] = lds32(p + 8 * PK);
                a[mi][2] = lds32(p + 8);
                a[mi][3] = lds32(p + 8 * PK + 8);
            }
#pragma unroll
            for (int ni = 0; ni < 4; ni++) {
                const T *p = wk + (wn * 32 + ni * 8 + g) * PK + kk + 2 * t;
                const unsigned b0 = lds32(p), b1 = lds32(p + 8);
#pragma unroll
                for (int mi = 0; mi < 2; mi++)
                    Mma<T>::run(acc[mi][ni], a[mi], b0, b1);
            }
        }
        __syncthreads();
    }
}

} // namespace tk_flce

template <typename T>
__global__ void __launch_bounds__(256) tk_fused_linear_ce(const T *__restrict__ hidden,     // (N, H) T
                                                          const T *__restrict__ weight,     // (V, H) T
                                                          const tk_i64 *__restrict__ target, // (N,) i64
                                                          float *__restrict__ loss,         // (N,) or () f32
                                                          const T *__restrict__ bias,       // (V,) T or null
                                                          T *__restrict__ grad_hidden,      // (N, H) T or null
                                                          float *__restrict__ grad_weight,  // (V, H) f32 or null, +=
                                                          float *__restrict__ grad_bias,    // (V,) f32 or null, +=
                                                          float *__restrict__ lse,          // (N,) f32 or null
                                                          tk_i64 ignore_index, float label_smoothing,
                                                          tk_i64 reduction, tk_i64 n, tk_i64 h, tk_i64 v, void *ws)
{
    using namespace tk_flce;
    extern __shared__ __align__(16) char smem[];
    T *gs = reinterpret_cast<T *>(smem + OFF_G);
    float *st_m = reinterpret_cast<float *>(smem + OFF_ST), *st_d = st_m + 4 * BM, *st_s = st_d + 4 * BM;
    int *st_n = reinterpret_cast<int *>(st_s + 4 * BM);
    float *r_m = reinterpret_cast<float *>(smem + OFF_ROW), *r_invd = r_m + BM, *r_xt = r_invd + BM,
          *r_loss = r_xt + BM;
    tk_i64 *r_t = reinterpret_cast<tk_i64 *>(r_loss + BM);
    float *gb = reinterpret_cast<float *>(smem + OFF_GB);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int wm = warp >> 2, wn = warp & 3;
    const tk_i64 row0 = (tk_i64)blockIdx.x * BM;
    const bool vec = h % 8 == 0 && aligned16(hidden) && aligned16(weight);
    const bool want_grad = grad_hidden || grad_weight || grad_bias;
    const float eps = label_smoothing, smooth = label_smoothing / (float)v, one_m = 1.0f - label_smoothing;
    const float qnan = __int_as_float(0x7fffffff);
    // workspace: loss partials (ce_common.cuh), then dh [N, H] f32 (16-byte aligned)
    float *dh = reinterpret_cast<float *>(reinterpret_cast<char *>(ws) + 16 * (tk_i64)gridDim.x + 16);

    float gscale = 1.0f;
    if (reduction == RED_MEAN && want_grad) {
        const double valid = count_valid(target, n, ignore_index);
        gscale = valid > 0.0 ? (float)(1.0 / valid) : 0.0f;
    }
    // r_t: the target column, -1 for an ignored (or padding) row, -2 for one out of range
    for (int r = tid; r < BM; r += NT) {
        tk_i64 y = -1;
        if (row0 + r < n) {
            y = target[row0 + r];
            y = y == ignore_index ? -1 : (y < 0 || y >= v) ? -2 : y;
        }
        r_t[r] = y;
        r_xt[r] = qnan;
    }
    for (int c = tid; c < BN; c += NT)
        gb[c] = 0.0f;
    __syncthreads();

    // This thread's rows (local): wm*32 + mi*16 + g + 8*hh, index q = mi*2 + hh.
    int lrow[4];
    tk_i64 tgt[4];
#pragma unroll
    for (int q = 0; q < 4; q++) {
        lrow[q] = wm * 32 + (q >> 1) * 16 + g + 8 * (q & 1);
        tgt[q] = r_t[lrow[q]];
    }

    // ---- pass 1: online log-sum-exp over the vocabulary ----
    Lse st[4];
#pragma unroll
    for (int q = 0; q < 4; q++)
        st[q] = lse_init();
    float acc[2][4][4];
    for (tk_i64 v0 = 0; v0 < v; v0 += BN) {
        logits_tile(acc, hidden, weight, n, v, h, row0, v0, vec, smem);
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int mi = q >> 1, hh = q & 1;
            float x[8];
            bool ok[8];
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const tk_i64 col = v0 + wn * 32 + ni * 8 + 2 * t4 + e;
                    const bool in = col < v;
                    float y = acc[mi][ni][hh * 2 + e];
                    if (bias && in)
                        y += to_f32(bias[col]);
                    x[ni * 2 + e] = y;
                    ok[ni * 2 + e] = in;
                    if (in && col == tgt[q])
                        r_xt[lrow[q]] = y;
                }
            lse_fold(st[q], x, ok);
        }
    }
    // merge: the 4 lanes of a quad share rows, then the 4 warp columns through shared memory
#pragma unroll
    for (int q = 0; q < 4; q++) {
        st[q] = lse_merge(st[q], lse_shfl_xor(st[q], 1));
        st[q] = lse_merge(st[q], lse_shfl_xor(st[q], 2));
        if (t4 == 0) {
            st_m[wn * BM + lrow[q]] = st[q].m;
            st_d[wn * BM + lrow[q]] = st[q].d;
            st_s[wn * BM + lrow[q]] = st[q].s;
            st_n[wn * BM + lrow[q]] = st[q].n;
        }
    }
    __syncthreads();
    if (tid < BM) {
        Lse a = lse_init();
        for (int w = 0; w < 4; w++) {
            Lse b;
            b.m = st_m[w * BM + tid];
            b.d = st_d[w * BM + tid];
            b.s = st_s[w * BM + tid];
            b.n = st_n[w * BM + tid];
            a = lse_merge(a, b);
        }
        const tk_i64 y = r_t[tid], row = row0 + tid;
        const float logd = logf(a.d);
        float l = 0.0f;
        if (y == -2 || (y >= 0 && a.m == TK_CE_NEG_INF)) {
            l = qnan;
        } else if (y >= 0) {
            l = logd;
            if (eps < 1.0f)
                l += one_m * (a.m - r_xt[tid]);
            if (eps > 0.0f)
                l += eps * a.s / (float)v;
        }
        r_m[tid] = a.m;
        r_invd[tid] = y == -2 ? qnan : 1.0f / a.d;
        r_loss[tid] = l;
        if (row < n) {
            if (lse)
                lse[row] = a.m + logd;
            if (reduction == RED_NONE)
                loss[row] = l;
        }
    }
    __syncthreads();
    double part_sum = 0.0, part_cnt = 0.0;
    if (tid == 0)
        for (int r = 0; r < BM; r++) { // in row order: deterministic
            part_sum += (double)r_loss[r];
            part_cnt += r_t[r] == -1 ? 0.0 : 1.0;
        }

    // ---- pass 2: the gradient, tile by tile ----
    if (want_grad) {
        float m[4], invd[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            m[q] = r_m[lrow[q]];
            invd[q] = r_invd[lrow[q]];
        }
        T *wt = reinterpret_cast<T *>(smem);
        T *hs2 = wt + BN * PH;
        for (tk_i64 v0 = 0; v0 < v; v0 += BN) {
            logits_tile(acc, hidden, weight, n, v, h, row0, v0, vec, smem);
            float colsum[4][2];
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
                colsum[ni][0] = colsum[ni][1] = 0.0f;
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int mi = q >> 1, hh = q & 1;
#pragma unroll
                for (int ni = 0; ni < 4; ni++) {
                    float y2[2];
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const tk_i64 col = v0 + wn * 32 + ni * 8 + 2 * t4 + e;
                        float y = 0.0f;
                        if (col < v && tgt[q] != -1) {
                            float x = acc[mi][ni][hh * 2 + e];
                            if (bias)
                                x += to_f32(bias[col]);
                            y = expf(x - m[q]) * invd[q] - smooth;
                            if (col == tgt[q])
                                y -= one_m;
                            y *= gscale;
                        }
                        y2[e] = y;
                        colsum[ni][e] += y;
                    }
                    Pair<T> pr;
                    pr.v[0] = from_f32<T>(y2[0]);
                    pr.v[1] = from_f32<T>(y2[1]);
                    *reinterpret_cast<Pair<T> *>(gs + lrow[q] * PG + wn * 32 + ni * 8 + 2 * t4) = pr;
                }
            }
            if (grad_bias) {
                // the warp's 32 rows: reduce over g (lane bits 2..4), then the two warp rows in smem
#pragma unroll
                for (int ni = 0; ni < 4; ni++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        float s = colsum[ni][e];
                        s += __shfl_xor_sync(0xffffffffu, s, 4);
                        s += __shfl_xor_sync(0xffffffffu, s, 8);
                        s += __shfl_xor_sync(0xffffffffu, s, 16);
                        if (g == 0)
                            atomicAdd(gb + wn * 32 + ni * 8 + 2 * t4 + e, s);
                    }
            }
            __syncthreads(); // gs and gb complete
            if (grad_bias && tid < BN) {
                if (v0 + tid < v)
                    atomicAdd(grad_bias + v0 + tid, gb[tid]);
                gb[tid] = 0.0f; // next read after at least one more barrier
            }
            for (tk_i64 hc = 0; hc < h; hc += HC) {
                load_tile<T, BN, HC, PH>(wt, weight, v, h, v0, hc, vec);
                if (grad_weight)
                    load_tile<T, BM, HC, PH>(hs2, hidden, n, h, row0, hc, vec);
                __syncthreads();
                if (grad_hidden) {
                    // dh[rows, hc + wn*32 ..] += gs[rows, :] . wt[:, wn*32 ..]   (M 64, N 128, K 128)
                    float c2[2][4][4];
#pragma unroll
                    for (int mi = 0; mi < 2; mi++)
#pragma unroll
                        for (int ni = 0; ni < 4; ni++)
#pragma unroll
                            for (int c = 0; c < 4; c++)
                                c2[mi][ni][c] = 0.0f;
#pragma unroll
                    for (int kk = 0; kk < BN; kk += 16) {
                        unsigned a[2][4];
#pragma unroll
                        for (int mi = 0; mi < 2; mi++) {
                            const T *p = gs + (wm * 32 + mi * 16 + g) * PG + kk + 2 * t4;
                            a[mi][0] = lds32(p);
                            a[mi][1] = lds32(p + 8 * PG);
                            a[mi][2] = lds32(p + 8);
                            a[mi][3] = lds32(p + 8 * PG + 8);
                        }
#pragma unroll
                        for (int ni = 0; ni < 4; ni++) {
                            unsigned b0, b1;
                            ldm_b_trans(b0, b1, wt + kk * PH + wn * 32 + ni * 8, PH * 2);
#pragma unroll
                            for (int mi = 0; mi < 2; mi++)
                                Mma<T>::run(c2[mi][ni], a[mi], b0, b1);
                        }
                    }
                    // read-modify-write of the block's own rows: each element has one owner thread
#pragma unroll
                    for (int mi = 0; mi < 2; mi++)
#pragma unroll
                        for (int hh = 0; hh < 2; hh++) {
                            const tk_i64 row = row0 + wm * 32 + mi * 16 + g + 8 * hh;
                            if (row >= n)
                                continue;
#pragma unroll
                            for (int ni = 0; ni < 4; ni++)
#pragma unroll
                                for (int e = 0; e < 2; e++) {
                                    const tk_i64 col = hc + wn * 32 + ni * 8 + 2 * t4 + e;
                                    if (col < h)
                                        dh[row * h + col] += c2[mi][ni][hh * 2 + e];
                                }
                        }
                }
                if (grad_weight) {
                    // grad_weight[v0 + wv*32 .., hc + wh*64 ..] += gs^T . hs2   (M 128, N 128, K 64)
                    const int wv = warp >> 1, wh = warp & 1;
                    float c3[2][8][4];
#pragma unroll
                    for (int mi = 0; mi < 2; mi++)
#pragma unroll
                        for (int ni = 0; ni < 8; ni++)
#pragma unroll
                            for (int c = 0; c < 4; c++)
                                c3[mi][ni][c] = 0.0f;
#pragma unroll
                    for (int kk = 0; kk < BM; kk += 16) {
                        unsigned a[2][4];
#pragma unroll
                        for (int mi = 0; mi < 2; mi++)
                            ldm_a_trans(a[mi], gs + kk * PG + wv * 32 + mi * 16, PG * 2);
#pragma unroll
                        for (int ni = 0; ni < 8; ni++) {
                            unsigned b0, b1;
                            ldm_b_trans(b0, b1, hs2 + kk * PH + wh * 64 + ni * 8, PH * 2);
#pragma unroll
                            for (int mi = 0; mi < 2; mi++)
                                Mma<T>::run(c3[mi][ni], a[mi], b0, b1);
                        }
                    }
#pragma unroll
                    for (int mi = 0; mi < 2; mi++)
#pragma unroll
                        for (int hh = 0; hh < 2; hh++) {
                            const tk_i64 vr = v0 + wv * 32 + mi * 16 + g + 8 * hh;
                            if (vr >= v)
                                continue;
#pragma unroll
                            for (int ni = 0; ni < 8; ni++)
#pragma unroll
                                for (int e = 0; e < 2; e++) {
                                    const tk_i64 col = hc + wh * 64 + ni * 8 + 2 * t4 + e;
                                    if (col < h)
                                        atomicAdd(grad_weight + vr * h + col, c3[mi][ni][hh * 2 + e]);
                                }
                        }
                }
                __syncthreads(); // wt / hs2 are reloaded next
            }
            __syncthreads(); // gs and gb are rewritten by the next tile (also when h == 0)
        }
        if (grad_hidden) {
            // this block's rows of dh are final (the barrier above orders every thread's writes)
            for (tk_i64 i = tid; i < (tk_i64)BM * h; i += NT) {
                const tk_i64 row = row0 + i / h;
                if (row < n)
                    grad_hidden[row * h + i % h] = from_f32<T>(dh[row * h + i % h]);
            }
        }
    }
    finish_loss(ws, part_sum, part_cnt, loss, reduction);
}
