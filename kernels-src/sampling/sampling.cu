// sampling.cu — argmax and temperature / top-k / top-p sampling over rows of logits
// (kernels-community/sampling).
//
// Variants (templates over T = float, __half, __nv_bfloat16; one manifest entry per op, dtype and tier):
//   tk_argmax<T>        v <= 16384: one block per row.
//   tk_argmax_split<T>  v > 16384: chunks of 16384 over blocks of 1024 threads; each block writes its
//                       chunk's best (key, index) to the workspace, and the last block of a row to
//                       arrive (__threadfence, then atomicAdd on the row's counter) combines them.
//   tk_sample<T>        one block per row, any v: no sort. top-k and top-p thresholds are found by
//                       radix selection over order-preserving 32-bit keys of the scaled logits (digits
//                       of 11, 11 and 10 bits: a 2048-bin shared-memory histogram per pass, counts for
//                       top-k, integer probability mass for top-p), then one draw by inverse CDF with
//                       a block-wide prefix scan in vocabulary order that stops at the tile holding the
//                       token. Passes over the row: 1 (greedy), 3 (no top-k/top-p), +2 for top-k,
//                       +3 for top-p; the row is re-read from L1/L2 each pass.
//
// The definition of `sample` is tk's ops/sampling.c, and the code below is the same computation in
// the same order: z = x * (1 / T) in fp32, keys, W = floor(exp_det(z - zmax) * 2^32) with exp_det
// built from fp32 multiplies and explicit fmas only (no libm: CUDA's expf is not glibc's), integer
// sums (order-independent, so atomics are deterministic), top-p's need = ceil(p * W1) in double, of
// the tokens tied at top-p's threshold only as many as the mass needs (the highest indices, as
// transformers' TopPLogitsWarper with a stable sort; a block-wide scan of tie counts in the draw), a
// Philox-4x32-10 draw keyed by the seed with counter (row, offset) (row part 0 with per-row seeds),
// target = umulhi(r, S). So the GPU picks exactly the CPU reference's token for the same seed. The
// package compiles with --fmad=false as well, so no multiply-add is contracted behind the code's back.
//
// argmax: ties give the lowest index; NaN counts as larger than +inf (torch.argmax), -0 equals +0.
// sample: NaN logits count as -inf; a row with nothing above -inf gives -1; T <= 0 is greedy; per-row
// temperatures / top_ks / top_ps / seeds (null when left out) replace the scalars.
//
// Launch assumptions: contiguous row-major tensors; v < 2^31. tk_argmax: grid = rows, blockDim any
// multiple of 32 <= 1024. tk_argmax_split: blockDim = 1024 (any multiple of 32 works), grid = rows *
// cdiv(v, 16384), a zero-filled workspace of 8 * cdiv(4 * rows, 8) + 8 * rows * cdiv(v, 16384) bytes.
// tk_sample: grid = rows, blockDim a multiple of 32 <= 1024, 16.6 KiB of static shared memory.
//
// NVRTC-compatible: no host code, no standard headers; the device toolkit <tk/device.cuh>.
#include <tk/device.cuh>

namespace tk_smp {

// to_f32, Vec, Pack, aligned16, block_max / block_sum over tk_u64, philox_u64 (<tk/device.cuh>)
using namespace tk;

constexpr tk_i64 CHUNK = 16384;          // argmax_split: elements per block
constexpr unsigned KEY_NEG_INF = 0x007FFFFFu; // key_of(-inf)
constexpr unsigned KEY_NAN = 0xFFFFFFFFu;     // argmax: NaN above +inf (0xFF800000)
constexpr int NBINS = 2048;

// ---- the pieces of ops/sampling.c, bit for bit ----------------------------------------------------

// a < b <=> key_of(a) < key_of(b); -0 is +0, NaN is -inf.
__device__ __forceinline__ unsigned key_of(float z)
{
    if (z != z)
        z = __int_as_float(0xff800000);
    if (z == 0.0f)
        z = 0.0f;
    const unsigned u = __float_as_uint(z);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float float_of_key(unsigned k)
{
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}

// e^d for d in [-23, 0] (see ops/sampling.c: the same operations in the same order).
__device__ __forceinline__ float exp_det(float d)
{
    const float n = rintf(__fmul_rn(d, 1.44269504f));
    float r = __fmaf_rn(-n, 0.693145751953125f, d);
    r = __fmaf_rn(-n, 1.42860677e-6f, r);
    float p = 1.98412698e-4f;
    p = __fmaf_rn(p, r, 1.38888889e-3f);
    p = __fmaf_rn(p, r, 8.33333333e-3f);
    p = __fmaf_rn(p, r, 4.16666667e-2f);
    p = __fmaf_rn(p, r, 1.66666667e-1f);
    p = __fmaf_rn(p, r, 0.5f);
    p = __fmaf_rn(p, r, 1.0f);
    p = __fmaf_rn(p, r, 1.0f);
    return __fmul_rn(p, __uint_as_float((unsigned)(127 + (int)n) << 23));
}

__device__ __forceinline__ tk_u64 weight_of(float z, float zmax)
{
    if (z == zmax)
        return 1ull << 32;
    const float d = __fsub_rn(z, zmax);
    if (!(d >= -23.0f))
        return 0;
    return __float2ull_rz(__fmul_rn(exp_det(d), 4294967296.0f));
}

// The draw: Philox-4x32-10 keyed by the seed, counter (row, offset) (tk::philox_u64).
__device__ __forceinline__ tk_u64 draw(tk_u64 seed, tk_u64 row, tk_u64 offset) { return philox_u64(seed, row, offset); }

__device__ __forceinline__ tk_u64 top_p_need(double p, tk_u64 total)
{
    const double pm = __dmul_rn(p, __ull2double_rn(total));
    if (!(pm > 0.0))
        return 1;
    if (pm >= __ull2double_rn(total))
        return total;
    const tk_u64 need = __double2ull_rz(ceil(pm));
    return need < 1 ? 1 : need > total ? total : need;
}

// ---- block-wide helpers (blockDim.x a multiple of 32; every thread calls them) ------------------

// The exclusive prefix sum of v over the threads in order; *total gets the sum over the block.
__device__ __forceinline__ tk_u64 block_exclusive_scan(tk_u64 v, tk_u64 *total)
{
    __shared__ tk_u64 warp_incl[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    tk_u64 incl = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const tk_u64 w = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o)
            incl += w;
    }
    __syncthreads(); // the previous call's readers are done
    if (lane == 31)
        warp_incl[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        tk_u64 w = lane < nwarps ? warp_incl[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const tk_u64 u = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o)
                w += u;
        }
        if (lane < nwarps)
            warp_incl[lane] = w; // inclusive over warps
    }
    __syncthreads();
    *total = warp_incl[nwarps - 1];
    return (warp ? warp_incl[warp - 1] : 0) + incl - v;
}

// Calls f(index, value) for every element of the row, each thread a strided share (16-byte vectors
// when vec). Which thread sees which element does not change any result: all combinations below are
// max or integer sums.
template <typename T, typename F> __device__ __forceinline__ void for_each(const T *x, tk_i64 n, bool vec, F f)
{
    constexpr int N = Vec<T>::N;
    if (vec) {
        const Pack<T> *xv = reinterpret_cast<const Pack<T> *>(x);
        for (tk_i64 vi = threadIdx.x; vi < n / N; vi += blockDim.x) {
            const Pack<T> p = xv[vi];
#pragma unroll
            for (int k = 0; k < N; k++)
                f(vi * N + k, to_f32(p.v[k]));
        }
    } else {
        for (tk_i64 i = threadIdx.x; i < n; i += blockDim.x)
            f(i, to_f32(x[i]));
    }
}

__device__ __forceinline__ tk_u64 pack(unsigned key, tk_i64 i)
{
    return ((tk_u64)key << 32) | (tk_u64)(0xFFFFFFFFu - (unsigned)i); // larger key, then lower index
}
__device__ __forceinline__ tk_i64 unpack_index(tk_u64 p) { return (tk_i64)(0xFFFFFFFFu - (unsigned)p); }

__device__ __forceinline__ unsigned key_nanmax(float x) { return x != x ? KEY_NAN : key_of(x); }

// argmax's best packed (key, index) of this thread over elements [lo, hi) of row x.
template <typename T> __device__ __forceinline__ tk_u64 best_in(const T *x, tk_i64 lo, tk_i64 hi, bool vec)
{
    tk_u64 best = 0;
    for_each<T>(x + lo, hi - lo, vec, [&](tk_i64 i, float v) {
        const tk_u64 p = pack(key_nanmax(v), lo + i);
        best = p > best ? p : best;
    });
    return best;
}

// One digit of a radix selection: scanning hist's nb bins from the top, the bin b where above + the
// bins >= b first reach need. Every thread gets b; *above becomes the mass of the bins above b (plus
// the old *above), *at hist[b]. As ops/sampling.c's select_key: bin 0 if need is never reached.
__device__ unsigned find_bin(const tk_u64 *hist, int nb, tk_u64 need, tk_u64 *above, tk_u64 *at)
{
    __shared__ unsigned s_bin;
    __shared__ tk_u64 s_above, s_at;
    const int per = (nb + blockDim.x - 1) / blockDim.x; // thread t: positions [t * per, (t + 1) * per)
    const int p0 = threadIdx.x * per, p1 = p0 + per < nb ? p0 + per : nb;
    tk_u64 local = 0;
    for (int q = p0; q < p1; q++)
        local += hist[nb - 1 - q]; // position q is bin nb - 1 - q: descending
    tk_u64 total;
    const tk_u64 excl = block_exclusive_scan(local, &total);
    const tk_u64 base = *above;
    if (threadIdx.x == 0) {
        s_bin = 0;
        s_above = base + total - hist[0];
        s_at = hist[0];
    }
    __syncthreads();
    if (base + excl < need && base + excl + local >= need) {
        tk_u64 acc = base + excl;
        for (int q = p0; q < p1; q++) {
            const tk_u64 h = hist[nb - 1 - q];
            if (acc + h >= need) {
                s_bin = nb - 1 - q;
                s_above = acc;
                s_at = h;
                break;
            }
            acc += h;
        }
    }
    __syncthreads();
    const unsigned b = s_bin;
    *above = s_above;
    *at = s_at;
    __syncthreads(); // before the next call overwrites s_*
    return b;
}

} // namespace tk_smp

// ---- entry points ----------------------------------------------------------------------------------

template <typename T>
__global__ void __launch_bounds__(1024) tk_argmax(tk_i64 *out,     // (rows,) i64
                                                  const T *input,  // (rows, v) T
                                                  tk_i64 v)
{
    using namespace tk_smp;
    const T *x = input + (tk_i64)blockIdx.x * v;
    const tk_u64 best = block_max(best_in(x, 0, v, v % Vec<T>::N == 0 && aligned16(x)));
    if (threadIdx.x == 0)
        out[blockIdx.x] = unpack_index(best);
}

// ws (zero-filled): u32 count[rows] at byte 0; u64 part[rows][C] at byte 8 * cdiv(4 * rows, 8).
template <typename T>
__global__ void __launch_bounds__(1024) tk_argmax_split(tk_i64 *out,    // (rows,) i64
                                                        const T *input, // (rows, v) T
                                                        tk_i64 v, tk_i64 rows, void *ws)
{
    using namespace tk_smp;
    __shared__ bool s_last;
    const tk_i64 C = (v + CHUNK - 1) / CHUNK, row = blockIdx.x / C, c = blockIdx.x % C;
    unsigned *count = reinterpret_cast<unsigned *>(ws);
    tk_u64 *part = reinterpret_cast<tk_u64 *>(reinterpret_cast<char *>(ws) + ((4 * rows + 7) / 8) * 8) + row * C;
    const T *x = input + row * v;
    const tk_i64 lo = c * CHUNK, hi = lo + CHUNK < v ? lo + CHUNK : v;
    const bool vec = v % Vec<T>::N == 0 && aligned16(input); // then every chunk start is aligned too
    const tk_u64 best = block_max(best_in(x, lo, hi, vec));
    if (threadIdx.x == 0) {
        part[c] = best;
        __threadfence();
        s_last = atomicAdd(&count[row], 1u) == (unsigned)(C - 1);
    }
    __syncthreads();
    if (!s_last)
        return;
    __threadfence();
    tk_u64 b = 0;
    for (tk_i64 j = threadIdx.x; j < C; j += blockDim.x) {
        const tk_u64 p = __ldcg(&part[j]);
        b = p > b ? p : b;
    }
    b = block_max(b);
    if (threadIdx.x == 0)
        out[row] = unpack_index(b);
}

template <typename T>
__global__ void __launch_bounds__(1024) tk_sample(tk_i64 *out,               // (rows,) i64
                                                  const T *logits,           // (rows, v) T
                                                  const float *temperatures, // (rows,) f32 or null
                                                  const int *top_ks,         // (rows,) i32 or null
                                                  const float *top_ps,       // (rows,) f32 or null
                                                  const tk_i64 *seeds,       // (rows,) i64 or null
                                                  float temperature, tk_i64 top_k, double top_p, tk_i64 seed,
                                                  tk_i64 offset, tk_i64 v)
{
    using namespace tk_smp;
    __shared__ tk_u64 hist[NBINS];
    __shared__ tk_i64 s_pick;
    const tk_i64 row = blockIdx.x;
    const T *x = logits + row * v;
    const bool vec = v % Vec<T>::N == 0 && aligned16(x);
    const float temp = temperatures ? temperatures[row] : temperature;
    const tk_i64 k = top_ks ? (tk_i64)top_ks[row] : top_k;
    const double p = top_ps ? (double)top_ps[row] : top_p;
    const tk_u64 sd = (tk_u64)(seeds ? seeds[row] : seed), ctr_row = seeds ? 0ull : (tk_u64)row;
    const bool greedy = !(temp > 0.0f);
    const float inv_t = greedy ? 1.0f : __fdiv_rn(1.0f, temp);
    const bool topk_on = !greedy && k > 0 && k < v;

    // Pass 1: the largest key (lowest index on ties), and top-k's first-digit counts.
    for (int b = threadIdx.x; b < NBINS; b += blockDim.x)
        hist[b] = 0;
    __syncthreads();
    tk_u64 best = 0;
    for_each<T>(x, v, vec, [&](tk_i64 i, float xv) {
        const unsigned key = key_of(__fmul_rn(xv, inv_t));
        const tk_u64 pk = pack(key, i);
        best = pk > best ? pk : best;
        if (topk_on)
            atomicAdd(&hist[key >> 21], 1ull);
    });
    best = block_max(best); // also orders the histogram's atomics before its readers
    if ((unsigned)(best >> 32) <= KEY_NEG_INF || greedy) {
        if (threadIdx.x == 0)
            out[row] = (unsigned)(best >> 32) <= KEY_NEG_INF ? -1 : unpack_index(best);
        return;
    }
    const float zmax = float_of_key((unsigned)(best >> 32));

    // The digits of a selection: 11, 11, 10 bits from the top. Pass 0's histogram is built by the
    // caller; lo filters keys (top-k's threshold, for top-p); w = 1 (counts) or the weight.
    auto select = [&](unsigned lo, tk_u64 need, bool by_mass, tk_u64 *mass, tk_u64 *mass_above) -> unsigned {
        unsigned mask = 0, val = 0;
        tk_u64 above = 0, at = 0;
        for (int ps = 0; ps < 3; ps++) {
            const int shift = ps == 0 ? 21 : ps == 1 ? 10 : 0, nb = ps == 2 ? 1024 : 2048;
            if (ps > 0) {
                for (int b = threadIdx.x; b < NBINS; b += blockDim.x)
                    hist[b] = 0;
                __syncthreads();
                for_each<T>(x, v, vec, [&](tk_i64, float xv) {
                    const unsigned key = key_of(__fmul_rn(xv, inv_t));
                    if (key < lo || (key & mask) != val)
                        return;
                    const tk_u64 w = by_mass ? weight_of(float_of_key(key), zmax) : 1ull;
                    if (w)
                        atomicAdd(&hist[(key >> shift) & (nb - 1)], w);
                });
                __syncthreads();
            }
            const unsigned b = find_bin(hist, nb, need, &above, &at);
            val |= b << shift;
            mask |= (unsigned)(nb - 1) << shift;
        }
        *mass = above + at;
        *mass_above = above;
        return val;
    };

    unsigned t = 0;
    tk_u64 mass = 0, above = 0, drop = 0; // drop: the lowest indices of the tie at t that top-p leaves out
    if (topk_on)
        t = select(0, (tk_u64)k, false, &mass, &above);
    if (p < 1.0) {
        // top-p's first digit over the top-k set, with its total mass W1
        __syncthreads(); // select's last find_bin readers are done with hist
        for (int b = threadIdx.x; b < NBINS; b += blockDim.x)
            hist[b] = 0;
        __syncthreads();
        tk_u64 mine = 0;
        for_each<T>(x, v, vec, [&](tk_i64, float xv) {
            const unsigned key = key_of(__fmul_rn(xv, inv_t));
            if (key < t)
                return;
            const tk_u64 w = weight_of(float_of_key(key), zmax);
            if (w) {
                mine += w;
                atomicAdd(&hist[key >> 21], w);
            }
        });
        const tk_u64 w1 = block_sum(mine);
        const tk_u64 need = top_p_need(p, w1);
        t = select(t, need, true, &mass, &above);
        // Of the tokens tied at t (each of weight wt), keep only as many as the mass needs: the
        // highest indices, as TopPLogitsWarper's stable ascending sort does (ops/sampling.c, step 4).
        const tk_u64 wt = weight_of(float_of_key(t), zmax);
        if (wt > 0 && need > above) {
            const tk_u64 tied = (mass - above) / wt, keep = (need - above + wt - 1) / wt;
            drop = keep < tied ? tied - keep : 0;
            mass = above + (tied - drop) * wt;
        }
    } else {
        tk_u64 mine = 0;
        for_each<T>(x, v, vec, [&](tk_i64, float xv) {
            const unsigned key = key_of(__fmul_rn(xv, inv_t));
            if (key >= t)
                mine += weight_of(float_of_key(key), zmax);
        });
        mass = block_sum(mine);
    }

    // The draw: the first kept index whose running weight exceeds target. Thread j owns the N
    // consecutive elements [tile + j * N, tile + (j + 1) * N) of each tile, so a block-wide exclusive
    // scan orders the partial sums by index.
    const tk_u64 target = __umul64hi(draw(sd, ctr_row, (tk_u64)offset), mass);
    constexpr int N = Vec<T>::N;
    tk_u64 running = 0, tied_before = 0; // tied_before: tokens with key t in the tiles before
    if (threadIdx.x == 0)
        s_pick = -1;
    for (tk_i64 tile = 0; tile < v; tile += (tk_i64)blockDim.x * N) {
        const tk_i64 base = tile + (tk_i64)threadIdx.x * N;
        tk_u64 w[N], local = 0;
        float xs[N];
        if (vec && base + N <= v) {
            const Pack<T> pk = *reinterpret_cast<const Pack<T> *>(x + base);
#pragma unroll
            for (int q = 0; q < N; q++)
                xs[q] = to_f32(pk.v[q]);
        } else {
#pragma unroll
            for (int q = 0; q < N; q++)
                xs[q] = base + q < v ? to_f32(x[base + q]) : __int_as_float(0xff800000);
        }
        unsigned keys[N];
        tk_u64 ties = 0;
#pragma unroll
        for (int q = 0; q < N; q++) {
            keys[q] = key_of(__fmul_rn(xs[q], inv_t));
            ties += (base + q < v && keys[q] == t) ? 1ull : 0ull;
        }
        // The rank of this thread's first tied token among the row's tied tokens, in index order
        // (drop is the same in every thread, so every thread takes the scan or none does).
        tk_u64 rank = 0, tile_ties = 0;
        if (drop > 0)
            rank = tied_before + block_exclusive_scan(ties, &tile_ties);
#pragma unroll
        for (int q = 0; q < N; q++) {
            const bool in = base + q < v && keys[q] >= t;
            const bool dropped = in && keys[q] == t && rank++ < drop;
            w[q] = (in && !dropped) ? weight_of(float_of_key(keys[q]), zmax) : 0ull;
            local += w[q];
        }
        tied_before += tile_ties;
        tk_u64 tile_total;
        const tk_u64 excl = block_exclusive_scan(local, &tile_total);
        if (running + excl <= target && target < running + excl + local) {
            tk_u64 acc = running + excl;
#pragma unroll
            for (int q = 0; q < N; q++) {
                acc += w[q];
                if (acc > target) {
                    s_pick = base + q;
                    break;
                }
            }
        }
        if (target < running + tile_total)
            break; // the same decision in every thread
        running += tile_total;
    }
    __syncthreads();
    if (threadIdx.x == 0)
        out[row] = s_pick;
}
