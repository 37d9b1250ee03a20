// linear.cu — weight-only 8-bit linears of kernels-community/casted:
//   out[m, n] = (sum_k x[m, k] * decode(weight[n, k])) * scale[n] + bias[n]
//   x (M, K) bf16, weight (N, K) i8 or fp8 e4m3fn codes, scale (N,) f32, bias (N,) bf16 or null,
//   out (M, N) bf16; M is every leading dimension of x flattened.
//
// Variants (templates over F = tk_casted::I8 / tk_casted::E4M3):
//   tk_casted_linear_gemv<F>         decode (M <= 8). One warp per 4 output channels; each lane streams
//                                    16 codes per 128-bit load (ld.global.cs: read once), decodes them in
//                                    registers and does fp32 FMAs against x (re-read through L1), then a
//                                    shuffle reduction. grid = cdiv(N, 16), block = 128.
//   tk_casted_linear_gemm_splitk<F>  small M (<= 256 by the manifest). 64x64 tiles, 4 warps, k-tiles of
//                                    64, 3-stage cp.async pipeline; the K range is split over grid.z so
//                                    skinny problems fill the GPU: blocks add fp32 partials into the
//                                    zero-filled workspace (red.add), and the last block of a tile
//                                    (a counter per tile, after __threadfence) applies scale and bias.
//                                    grid = (cdiv(N, 64), cdiv(M, 64), splits), block = 128.
//   tk_casted_linear_gemm<F>         prefill. 128x128 tiles, 8 warps (2 x 4, 64x32 each), k-tiles of 32,
//                                    3-stage cp.async pipeline. grid = (cdiv(N, 128), cdiv(M, 128)),
//                                    block = 256.
//   Both GEMMs run mma.sync.m16n8k16 (bf16 in, fp32 accumulate; sm_80+). The weight tile is cp.async'd
//   to shared memory as codes and decoded to bf16 in registers right before the mma (exact: every i8 and
//   e4m3 value is a bf16). The k index inside each 32-wide slice is permuted identically for x and W so
//   a lane's fragments are contiguous: 8 codes of W (one 64-bit shared load) and 8 bf16 of x per row
//   (one 128-bit load) feed two k16 steps. Both reads are bank-conflict free without padding.
//
// Launch assumptions: contiguous row-major tensors. 16-byte vector loads (and cp.async) when K % 16 == 0
// and x and weight are 16-byte aligned; otherwise element loads (any K >= 0). M, N any size; tiles
// past the edges are zero-filled and not stored.
//
// Numerics: fp32 accumulation of exact products' sums (bf16 * decoded code), in an order that depends
// on the kernel (GEMV: per lane then a butterfly; GEMM: the mma's, then the k-tile order; split-K: a
// nondeterministic order of the split partial sums). y = sum * scale (fp32) + bias, rounded once to bf16.
// NaN codes (e4m3 S.1111.111) propagate to the outputs of their channel.
//
// NVRTC-compatible: no host code, no standard headers.
#include "casted.cuh"

namespace tk_casted {

__device__ __forceinline__ float bf16_at(const __nv_bfloat16 *p, tk_i64 i)
{
    return bf16_lo((tk_u32) reinterpret_cast<const unsigned short *>(p)[i]);
}

// y = acc * scale[n] + bias[n] in fp32 (no contraction: the CPU reference's order).
__device__ __forceinline__ float finish(float acc, const float *__restrict__ scale, const __nv_bfloat16 *bias, tk_i64 n)
{
    float y = __fmul_rn(acc, __ldg(scale + n));
    if (bias)
        y = __fadd_rn(y, bf16_at(bias, n));
    return y;
}

// ---- GEMV ------------------------------------------------------------------------------------------

constexpr int GEMV_WARPS = 4; // per block
constexpr int GEMV_ROWS = 4;  // output channels per warp
constexpr int GEMV_MAXM = 8;  // rows of x (the manifest's constraint)
static_assert(GEMV_ROWS * GEMV_MAXM == 32, "one result per lane");

template <int F>
__device__ __forceinline__ void gemv(__nv_bfloat16 *__restrict__ out, const __nv_bfloat16 *__restrict__ x,
                                     const unsigned char *__restrict__ w, const float *__restrict__ scale,
                                     const __nv_bfloat16 *__restrict__ bias, tk_i64 M, tk_i64 N, tk_i64 K)
{
    constexpr int R = GEMV_ROWS, MM = GEMV_MAXM;
    const int lane = threadIdx.x & 31;
    const tk_i64 n0 = ((tk_i64)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5)) * R;
    if (n0 >= N)
        return; // the whole warp
    float acc[R][MM];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < MM; m++)
            acc[r][m] = 0.0f;
    // Channels past N read row N-1 (valid memory); their sums are dropped.
    tk_i64 wrow[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        wrow[r] = (n0 + r < N ? n0 + r : N - 1) * K;

    if ((K & 15) == 0 && aligned(x, 16) && aligned(w, 16)) {
        const tk_i64 kc = K >> 4; // 16-code chunks per row
#pragma unroll 2
        for (tk_i64 c = lane; c < kc; c += 32) {
            float wf[R][16];
#pragma unroll
            for (int r = 0; r < R; r++)
                dq16<F>(__ldcs(reinterpret_cast<const uint4 *>(w + wrow[r]) + c), wf[r]);
#pragma unroll
            for (int m = 0; m < MM; m++) {
                if (m < M) {
                    const uint4 *xp = reinterpret_cast<const uint4 *>(x + m * K) + 2 * c;
                    const uint4 a = __ldg(xp), b = __ldg(xp + 1);
                    const tk_u32 u[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
                    for (int j = 0; j < 8; j++) {
                        const float x0 = bf16_lo(u[j]), x1 = bf16_hi(u[j]);
#pragma unroll
                        for (int r = 0; r < R; r++) {
                            acc[r][m] = fmaf(x0, wf[r][2 * j], acc[r][m]);
                            acc[r][m] = fmaf(x1, wf[r][2 * j + 1], acc[r][m]);
                        }
                    }
                }
            }
        }
    } else {
        for (tk_i64 k = lane; k < K; k += 32) {
            float wf[R];
#pragma unroll
            for (int r = 0; r < R; r++)
                wf[r] = dq1<F>(__ldg(w + wrow[r] + k));
#pragma unroll
            for (int m = 0; m < MM; m++) {
                if (m < M) {
                    const float xv = bf16_at(x, m * K + k);
#pragma unroll
                    for (int r = 0; r < R; r++)
                        acc[r][m] = fmaf(xv, wf[r], acc[r][m]);
                }
            }
        }
    }

    float mine = 0.0f; // lane r * MM + m keeps the sum of (channel n0 + r, row m)
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < MM; m++)
            if (m < M) {
                const float s = warp_sum(acc[r][m]);
                if (lane == r * MM + m)
                    mine = s;
            }
    const int m = lane % MM;
    const tk_i64 n = n0 + lane / MM;
    if (m < M && n < N)
        out[m * N + n] = __float2bfloat16_rn(finish(mine, scale, bias, n));
}

// ---- GEMM ------------------------------------------------------------------------------------------

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, int src_bytes)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// d += a (16x16, row) * b (16x8, col); bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_bf16(float *d, tk_u32 a0, tk_u32 a1, tk_u32 a2, tk_u32 a3, tk_u32 b0, tk_u32 b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Tile shape: BM x BN outputs per block, KP k-slices of 32 per pipeline stage, WM x WN per warp.
template <int BM, int BN, int KP, int WM, int WN, int STAGES> struct Tile {
    static constexpr int WARPS_N = BN / WN, WARPS = (BM / WM) * (BN / WN), THREADS = WARPS * 32;
    static constexpr int MT = WM / 16, NT = WN / 8, BK = 32 * KP;
    static_assert(BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && WN % 8 == 0, "tile shape");
    static constexpr int SMEM = STAGES * KP * 32 * (BM * 2 + BN);
    static_assert(SMEM <= 48 * 1024, "static shared memory");
};

// Stores the pair (v0, v1) of outputs (row, n), (row, n + 1) with n even, after scale and bias: one
// 32-bit store when the pair is 4-byte aligned.
__device__ __forceinline__ void store_pair(__nv_bfloat16 *out, const float *__restrict__ scale,
                                           const __nv_bfloat16 *bias, tk_i64 row, tk_i64 n, tk_i64 N, float v0,
                                           float v1)
{
    if (n >= N)
        return;
    const float y0 = finish(v0, scale, bias, n);
    if (n + 1 < N) {
        const float y1 = finish(v1, scale, bias, n + 1);
        if ((N & 1) == 0 && aligned(out, 4)) {
            *reinterpret_cast<tk_u32 *>(out + row * N + n) = pack_bf16x2(y0, y1);
            return;
        }
        out[row * N + n + 1] = __float2bfloat16_rn(y1);
    }
    out[row * N + n] = __float2bfloat16_rn(y0);
}

template <int F, int BM, int BN, int KP, int WM, int WN, int STAGES, bool SPLIT>
__device__ __forceinline__ void gemm(__nv_bfloat16 *__restrict__ out, const __nv_bfloat16 *__restrict__ x,
                                     const unsigned char *__restrict__ w, const float *__restrict__ scale,
                                     const __nv_bfloat16 *__restrict__ bias, float *__restrict__ ws, tk_i64 M,
                                     tk_i64 N, tk_i64 K, int splits)
{
    typedef Tile<BM, BN, KP, WM, WN, STAGES> T;
    constexpr int MT = T::MT, NT = T::NT, BK = T::BK, THREADS = T::THREADS;
    // k-slice p of a stage holds k0 + 32p .. k0 + 32p + 31 for every row: rows of 64 (x) / 32 (W) bytes
    __shared__ __align__(16) unsigned short xs[STAGES][KP][BM][32];
    __shared__ __align__(16) unsigned char wsm[STAGES][KP][BN][32];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tig = lane & 3;
    const int wm = warp / T::WARPS_N, wn = warp % T::WARPS_N;
    const tk_i64 m0 = (tk_i64)blockIdx.y * BM, n0 = (tk_i64)blockIdx.x * BN;
    const tk_i64 KT = (K + BK - 1) / BK;
    tk_i64 kt0 = 0, kt1 = KT;
    if (SPLIT && splits > 1) {
        const tk_i64 per = (KT + splits - 1) / splits;
        kt0 = (tk_i64)blockIdx.z * per < KT ? (tk_i64)blockIdx.z * per : KT;
        kt1 = kt0 + per < KT ? kt0 + per : KT;
    }
    const bool vec = (K & 15) == 0 && aligned(x, 16) && aligned(w, 16);
    const unsigned short *xr = reinterpret_cast<const unsigned short *>(x);

    // Global -> shared for k-tile kt into stage s: cp.async, zero-filled past M, N and K.
    auto load = [&](int s, tk_i64 kt) {
        const tk_i64 k0 = kt * BK;
#pragma unroll
        for (int c = tid; c < BM * KP * 4; c += THREADS) { // 8 bf16 per chunk
            const int p = c / (BM * 4), row = (c % (BM * 4)) >> 2, q = c & 3;
            const tk_i64 gm = m0 + row, gk = k0 + p * 32 + q * 8;
            unsigned short *dst = &xs[s][p][row][q * 8];
            if (vec) {
                const bool ok = gm < M && gk < K;
                cp_async16(dst, ok ? (const void *)(x + gm * K + gk) : (const void *)x, ok ? 16 : 0);
            } else {
                tk_u32 u[4];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const tk_u32 lo = gm < M && gk + 2 * e < K ? xr[gm * K + gk + 2 * e] : 0u;
                    const tk_u32 hi = gm < M && gk + 2 * e + 1 < K ? xr[gm * K + gk + 2 * e + 1] : 0u;
                    u[e] = lo | (hi << 16);
                }
                *reinterpret_cast<uint4 *>(dst) = make_uint4(u[0], u[1], u[2], u[3]);
            }
        }
#pragma unroll
        for (int c = tid; c < BN * KP * 2; c += THREADS) { // 16 codes per chunk
            const int p = c / (BN * 2), row = (c % (BN * 2)) >> 1, q = c & 1;
            const tk_i64 gn = n0 + row, gk = k0 + p * 32 + q * 16;
            unsigned char *dst = &wsm[s][p][row][q * 16];
            if (vec) {
                const bool ok = gn < N && gk < K;
                cp_async16(dst, ok ? (const void *)(w + gn * K + gk) : (const void *)w, ok ? 16 : 0);
            } else {
                tk_u32 u[4];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    tk_u32 v = 0;
#pragma unroll
                    for (int b = 0; b < 4; b++)
                        if (gn < N && gk + 4 * e + b < K)
                            v |= (tk_u32)w[gn * K + gk + 4 * e + b] << (8 * b);
                    u[e] = v;
                }
                *reinterpret_cast<uint4 *>(dst) = make_uint4(u[0], u[1], u[2], u[3]);
            }
        }
    };

    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[i][j][e] = 0.0f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (kt0 + s < kt1)
            load(s, kt0 + s);
        cp_async_commit();
    }
    for (tk_i64 kt = kt0; kt < kt1; kt++) {
        cp_async_wait<STAGES - 2>(); // k-tile kt has landed (this thread's part) ...
        __syncthreads();             // ... everyone's, and stage (kt - 1) % STAGES is free again
        const tk_i64 nk = kt + STAGES - 1;
        if (nk < kt1)
            load((int)((nk - kt0) % STAGES), nk);
        cp_async_commit();

        const int s = (int)((kt - kt0) % STAGES);
#pragma unroll
        for (int p = 0; p < KP; p++) {
            // Lane (g, tig) holds physical k = 8 tig .. 8 tig + 7 of its rows; k16 step h uses 8 tig + 4h ..
            // + 3 as the logical k {2 tig, 2 tig + 1, 2 tig + 8, 2 tig + 9}, the same map for x and W.
            tk_u32 bf[NT][4];
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const uint2 v = *reinterpret_cast<const uint2 *>(&wsm[s][p][wn * WN + j * 8 + g][tig * 8]);
                dq4_bf16<F>(v.x, bf[j][0], bf[j][1]);
                dq4_bf16<F>(v.y, bf[j][2], bf[j][3]);
            }
#pragma unroll
            for (int i = 0; i < MT; i++) {
                const int r = wm * WM + i * 16 + g;
                const uint4 a = *reinterpret_cast<const uint4 *>(&xs[s][p][r][tig * 8]);
                const uint4 b = *reinterpret_cast<const uint4 *>(&xs[s][p][r + 8][tig * 8]);
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    mma_bf16(acc[i][j], a.x, b.x, a.y, b.y, bf[j][0], bf[j][1]);
                    mma_bf16(acc[i][j], a.z, b.z, a.w, b.w, bf[j][2], bf[j][3]);
                }
            }
        }
    }
    cp_async_wait<0>();

    // Accumulator e of (i, j): row wm*WM + 16i + g + 8(e >= 2), column wn*WN + 8j + 2 tig + (e & 1).
    if (!SPLIT || splits <= 1) {
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const tk_i64 row = m0 + wm * WM + i * 16 + g + 8 * h, n = n0 + wn * WN + j * 8 + 2 * tig;
                    if (row < M)
                        store_pair(out, scale, bias, row, n, N, acc[i][j][2 * h], acc[i][j][2 * h + 1]);
                }
        return;
    }

    // Split K: add the partials into ws[M][N] (fp32), then the last block of the tile finishes it.
    unsigned *counter = reinterpret_cast<unsigned *>(ws + M * N) + (tk_i64)blockIdx.y * gridDim.x + blockIdx.x;
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const tk_i64 row = m0 + wm * WM + i * 16 + g + 8 * (e >> 1), n = n0 + wn * WN + j * 8 + 2 * tig + (e & 1);
                if (row < M && n < N)
                    atomicAdd(ws + row * N + n, acc[i][j][e]);
            }
    __shared__ unsigned last;
    __threadfence();
    __syncthreads();
    if (tid == 0)
        last = atomicAdd(counter, 1u) == (unsigned)(splits - 1);
    __syncthreads();
    if (!last)
        return;
    __threadfence();
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const tk_i64 row = m0 + wm * WM + i * 16 + g + 8 * h, n = n0 + wn * WN + j * 8 + 2 * tig;
                if (row < M && n < N)
                    store_pair(out, scale, bias, row, n, N, __ldcg(ws + row * N + n),
                               n + 1 < N ? __ldcg(ws + row * N + n + 1) : 0.0f);
            }
}

} // namespace tk_casted

// ---- entry points ----------------------------------------------------------------------------------

template <int F>
__global__ void __launch_bounds__(128) tk_casted_linear_gemv(__nv_bfloat16 *__restrict__ out,          // (M, N) bf16
                                                             const __nv_bfloat16 *__restrict__ x,      // (M, K) bf16
                                                             const unsigned char *__restrict__ weight, // (N, K) codes
                                                             const float *__restrict__ scale,          // (N,) f32
                                                             const __nv_bfloat16 *__restrict__ bias,   // (N,) or null
                                                             tk_i64 M, tk_i64 N, tk_i64 K)
{
    tk_casted::gemv<F>(out, x, weight, scale, bias, M, N, K);
}

template <int F>
__global__ void __launch_bounds__(128) tk_casted_linear_gemm_splitk(__nv_bfloat16 *__restrict__ out,          // (M, N) bf16
                                                                    const __nv_bfloat16 *__restrict__ x,      // (M, K) bf16
                                                                    const unsigned char *__restrict__ weight, // (N, K) codes
                                                                    const float *__restrict__ scale,          // (N,) f32
                                                                    const __nv_bfloat16 *__restrict__ bias,   // (N,) or null
                                                                    float *__restrict__ ws, // M*N f32 + tile counters, zeroed
                                                                    tk_i64 M, tk_i64 N, tk_i64 K, int splits)
{
    tk_casted::gemm<F, 64, 64, 2, 32, 32, 3, true>(out, x, weight, scale, bias, ws, M, N, K, splits);
}

template <int F>
__global__ void __launch_bounds__(256) tk_casted_linear_gemm(__nv_bfloat16 *__restrict__ out,          // (M, N) bf16
                                                             const __nv_bfloat16 *__restrict__ x,      // (M, K) bf16
                                                             const unsigned char *__restrict__ weight, // (N, K) codes
                                                             const float *__restrict__ scale,          // (N,) f32
                                                             const __nv_bfloat16 *__restrict__ bias,   // (N,) or null
                                                             tk_i64 M, tk_i64 N, tk_i64 K)
{
    tk_casted::gemm<F, 128, 128, 1, 64, 32, 3, false>(out, x, weight, scale, bias, nullptr, M, N, K, 1);
}
