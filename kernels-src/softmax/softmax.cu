// softmax.cu — softmax and log_softmax over the last dimension (kernels-community/softmax), for rows
// of any length: 1 to billions of elements.
//
// Variants (templates over T = float, __half, __nv_bfloat16 and LOG; one manifest entry per op, dtype
// and tier; constraints.min/max on d = input.shape[-1] pick the tier):
//   tk_softmax_warp<T, LOG>   d <= 1024: one warp per row, 8 rows per 256-thread block. The row stays in
//                             registers (32 values per lane): one read and one write of each element.
//   tk_softmax_block<T, LOG>  1024 < d <= 16384: one block per row (blockDim >= d / 16), up to 16 values
//                             per thread in registers: one read and one write.
//   tk_softmax_split<T, LOG>  d > 16384: each row is cut into chunks of 16384 elements, and every chunk
//                             gets two blocks of 1024 threads: a phase-1 block reduces its chunk to a
//                             partial (max, sum) in the workspace; a phase-2 block waits until every
//                             partial of its row is there, combines them, and writes its chunk. Blocks
//                             take their (row, chunk, phase) from a ticket counter (atomicAdd on the
//                             zero-filled workspace), ordered row by row with a row's phase-1 tickets
//                             first. A phase-2 block only ever waits on blocks with lower tickets, and
//                             a block holding a ticket is already resident and never waits itself in
//                             phase 1, so the spin cannot deadlock whatever the occupancy or the
//                             scheduling order. Each element is read twice (the second read mostly hits
//                             L2: a row's phase-2 tickets follow its phase-1 tickets) and written once,
//                             and the whole GPU works on a single long row. The alternative, one block
//                             looping over a whole row, leaves all but one SM idle for a 256k-vocabulary
//                             row; "last block combines" alone cannot write the outputs in parallel.
//
// Launch assumptions: contiguous row-major tensors; out may be input itself (every element is read
// before the same element is written, and in the split tier a chunk is written only after all of its
// row's phase-1 reads). tk_softmax_warp needs blockDim = 256 and grid = cdiv(rows, 8);
// tk_softmax_block needs blockDim >= cdiv(d, 16) (a multiple of 32) and grid = rows;
// tk_softmax_split needs blockDim = 1024, grid = 2 * rows * cdiv(d, 16384) (< 2^31), and a zero-filled
// workspace of 16 * cdiv(16 + 4 * rows, 16) + 8 * rows * cdiv(d, 16384) bytes. 16-byte vector loads
// and stores when d is a multiple of 16 / sizeof(T) and both pointers are 16-byte aligned.
//
// Numerics (fp32 throughout): m = max(x) (fmaxf), s = sum exp(x - m) with expf (not __expf: the
// result keeps ~1e-6 relative accuracy even for x - m near -80), softmax = exp(x - m) * (1 / s),
// log_softmax = (x - m) - log(s), rounded once to T. Special values as PyTorch: a row holding a NaN, a
// +inf, or nothing but -inf is NaN everywhere; -inf entries of other rows give 0 / -inf.
//
// NVRTC-compatible: no host code, no standard headers; the device toolkit <tk/device.cuh>.
#include <tk/device.cuh>

namespace tk_sm {

// to_f32, from_f32, Vec, Pack, aligned16, warp_max, warp_sum, block_max, block_sum (<tk/device.cuh>)
using namespace tk;

constexpr int WARP_ITEMS = 32;   // values per lane in the warp tier (d <= 32 * 32)
constexpr int BLOCK_ITEMS = 16;  // values per thread in the block and split tiers
constexpr tk_i64 CHUNK = 16384;  // split tier: elements per chunk (= 1024 threads * 16)

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }
__device__ __forceinline__ float qnan() { return __int_as_float(0x7fffffff); }

// exp(x - m), with -inf entries 0 whatever m is (a -inf max must not turn them into NaN).
__device__ __forceinline__ float ex(float x, float m) { return x == neg_inf() ? 0.0f : expf(x - m); }

// x[j] = element (t + j * G) of row (scalar), or elements of vector (t + j' * G) (vec); -inf beyond d.
template <typename T, int ITEMS>
__device__ __forceinline__ void load_row(float (&x)[ITEMS], const T *row, tk_i64 d, int t, int G, bool vec)
{
    constexpr int N = Vec<T>::N;
    if (vec) {
        const Pack<T> *rv = reinterpret_cast<const Pack<T> *>(row);
#pragma unroll
        for (int j = 0; j < ITEMS / N; j++) {
            const tk_i64 vi = t + (tk_i64)j * G;
            if (vi * N < d) {
                Pack<T> p = rv[vi];
#pragma unroll
                for (int k = 0; k < N; k++)
                    x[j * N + k] = to_f32(p.v[k]);
            } else {
#pragma unroll
                for (int k = 0; k < N; k++)
                    x[j * N + k] = neg_inf();
            }
        }
    } else {
#pragma unroll
        for (int j = 0; j < ITEMS; j++) {
            const tk_i64 e = t + (tk_i64)j * G;
            x[j] = e < d ? to_f32(row[e]) : neg_inf();
        }
    }
}

template <typename T, int ITEMS>
__device__ __forceinline__ void store_row(T *row, const float (&y)[ITEMS], tk_i64 d, int t, int G, bool vec)
{
    constexpr int N = Vec<T>::N;
    if (vec) {
        Pack<T> *rv = reinterpret_cast<Pack<T> *>(row);
#pragma unroll
        for (int j = 0; j < ITEMS / N; j++) {
            const tk_i64 vi = t + (tk_i64)j * G;
            if (vi * N < d) {
                Pack<T> p;
#pragma unroll
                for (int k = 0; k < N; k++)
                    p.v[k] = from_f32<T>(y[j * N + k]);
                rv[vi] = p;
            }
        }
    } else {
#pragma unroll
        for (int j = 0; j < ITEMS; j++) {
            const tk_i64 e = t + (tk_i64)j * G;
            if (e < d)
                row[e] = from_f32<T>(y[j]);
        }
    }
}

template <int ITEMS> __device__ __forceinline__ float local_max(const float (&x)[ITEMS])
{
    float m = neg_inf();
#pragma unroll
    for (int j = 0; j < ITEMS; j++)
        m = fmaxf(m, x[j]);
    return m;
}

template <int ITEMS> __device__ __forceinline__ float local_sum(const float (&x)[ITEMS], float m)
{
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < ITEMS; j++)
        s += ex(x[j], m);
    return s;
}

// x[j] := the output for the row's max m and sum s (both over the whole row). m is never NaN (fmaxf
// skips NaN); m = +-inf means a +inf or nothing above -inf: NaN. A NaN element made s NaN: NaN.
template <bool LOG, int ITEMS> __device__ __forceinline__ void finish(float (&x)[ITEMS], float m, float s)
{
    const bool bad = !(fabsf(m) <= 3.40282347e38f); // m = +-inf
    const float inv = 1.0f / s, ls = logf(s);
#pragma unroll
    for (int j = 0; j < ITEMS; j++)
        x[j] = bad ? qnan() : LOG ? (x[j] - m) - ls : ex(x[j], m) * inv;
}

template <typename T> __device__ __forceinline__ bool vec_ok(const T *a, const T *b, tk_i64 d)
{
    return d % Vec<T>::N == 0 && aligned16(a) && aligned16(b);
}

} // namespace tk_sm

// ---- entry points (name expressions "tk_softmax_<tier><T, LOG>") --------------------------------

// out may equal input, so neither is __restrict__.
template <typename T, bool LOG>
__global__ void __launch_bounds__(256) tk_softmax_warp(T *out,        // (rows, d) T
                                                       const T *input, // (rows, d) T
                                                       tk_i64 d, tk_i64 rows)
{
    using namespace tk_sm;
    const tk_i64 row = (tk_i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows)
        return; // a whole warp: no block-wide barrier below
    const int lane = threadIdx.x & 31;
    const bool vec = vec_ok(out, input, d);
    float x[WARP_ITEMS];
    load_row<T, WARP_ITEMS>(x, input + row * d, d, lane, 32, vec);
    const float m = warp_max(local_max(x));
    const float s = warp_sum(local_sum(x, m));
    finish<LOG>(x, m, s);
    store_row<T, WARP_ITEMS>(out + row * d, x, d, lane, 32, vec);
}

template <typename T, bool LOG>
__global__ void __launch_bounds__(1024) tk_softmax_block(T *out,        // (rows, d) T
                                                         const T *input, // (rows, d) T
                                                         tk_i64 d, tk_i64 rows)
{
    using namespace tk_sm;
    const tk_i64 row = blockIdx.x;
    const bool vec = vec_ok(out, input, d);
    float x[BLOCK_ITEMS];
    load_row<T, BLOCK_ITEMS>(x, input + row * d, d, threadIdx.x, blockDim.x, vec);
    const float m = block_max(local_max(x));
    const float s = block_sum(local_sum(x, m));
    finish<LOG>(x, m, s);
    store_row<T, BLOCK_ITEMS>(out + row * d, x, d, threadIdx.x, blockDim.x, vec);
}

// ws (zero-filled): u32 ticket at byte 0; u32 done[rows] at byte 16; float2 part[rows][C] (chunk max,
// sum of exp(x - chunk max)) at byte 16 * cdiv(16 + 4 * rows, 16).
template <typename T, bool LOG>
__global__ void __launch_bounds__(1024) tk_softmax_split(T *out,        // (rows, d) T
                                                         const T *input, // (rows, d) T
                                                         tk_i64 d, tk_i64 rows,
                                                         void *ws)
{
    using namespace tk_sm;
    __shared__ unsigned s_ticket;
    unsigned *ticket = reinterpret_cast<unsigned *>(ws);
    unsigned *done = ticket + 4;
    float2 *part = reinterpret_cast<float2 *>(reinterpret_cast<char *>(ws) + ((16 + 4 * rows + 15) / 16) * 16);
    const tk_i64 C = (d + CHUNK - 1) / CHUNK;

    if (threadIdx.x == 0)
        s_ticket = atomicAdd(ticket, 1u);
    __syncthreads();
    const tk_i64 t = s_ticket, row = t / (2 * C), k = t % (2 * C);
    const bool phase2 = k >= C;
    const tk_i64 c = phase2 ? k - C : k, c0 = c * CHUNK;
    const tk_i64 n = d - c0 < CHUNK ? d - c0 : CHUNK;
    const bool vec = vec_ok(out, input, d); // then every chunk start is 16-byte aligned too
    float x[BLOCK_ITEMS];

    if (!phase2) {
        load_row<T, BLOCK_ITEMS>(x, input + row * d + c0, n, threadIdx.x, blockDim.x, vec);
        const float m = block_max(local_max(x));
        const float s = block_sum(local_sum(x, m));
        if (threadIdx.x == 0) {
            part[row * C + c] = make_float2(m, s);
            __threadfence();
            atomicAdd(&done[row], 1u);
        }
        return;
    }

    // Phase 2: the row's partials come from blocks with lower tickets, all resident and not waiting.
    if (threadIdx.x == 0) {
        while (*reinterpret_cast<volatile unsigned *>(&done[row]) < (unsigned)C)
            __nanosleep(100);
        __threadfence();
    }
    __syncthreads();
    const float2 *rp = part + row * C;
    float pm = neg_inf();
    for (tk_i64 j = threadIdx.x; j < C; j += blockDim.x)
        pm = fmaxf(pm, __ldcg(&rp[j].x));
    const float M = block_max(pm);
    float ps = 0.0f;
    for (tk_i64 j = threadIdx.x; j < C; j += blockDim.x) {
        const float2 p = __ldcg(&rp[j]);
        ps += p.x == neg_inf() ? p.y : p.y * expf(p.x - M); // a -inf chunk holds 0, or NaN to pass on
    }
    const float S = block_sum(ps);
    load_row<T, BLOCK_ITEMS>(x, input + row * d + c0, n, threadIdx.x, blockDim.x, vec);
    finish<LOG>(x, M, S);
    store_row<T, BLOCK_ITEMS>(out + row * d + c0, x, n, threadIdx.x, blockDim.x, vec);
}
