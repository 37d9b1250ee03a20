// moe.cu — the mixture-of-experts layer of kernels-community/moe (tk's `moe` op; ops/moe.c is the
// reference and says what the op computes).
//
// Variants (templates over T = float, __half, __nv_bfloat16; one manifest entry per dtype, and one
// per dtype with the shared expert):
//   tk_moe<T>          out (T, H) = sum over the top_k experts of w_e * down_e(act(gate_e x) * up_e x);
//                      optional router_input, expert_scale, topk_ids, topk_weights
//   tk_moe_shared<T>   the same + sigmoid(x shared_gate^T) * shared(x) (shared_gate optional): three more
//                      parameters (shared_gate_up, shared_down, shared_gate) after expert_scale
// Each entry point's parameter list is exactly its manifest entries' list: the host packs one pointer
// per manifest parameter, so a kernel with more parameters than its manifest reads past that array
// (1.0.0 had one signature for both and crashed the host in cuLaunchKernel).
//
// A correct, simple grouped kernel, one launch: grid (E + 1, cdiv(T, TOK)). Block (e, tile) takes
// expert e (block E: the shared expert) over the tile's TOK tokens, so each expert's weights stream
// once per tile from L2 for all the tokens routed to it:
//   1. per token, the routing, recomputed by every block (cheap next to the experts): logits by one
//      warp per expert, rounded to T; softmax in fp32 and torch.topk's selection by thread 0 (the
//      same libstdc++ nth_element / sort / partial_sort code as the CPU reference, so ties break the
//      same way); the renormalisation, rounding and scale;
//   2. for a token routed to e (slot j): [g; u] = x gate_up[e]^T by one warp per row, rounded to T;
//      a = round(act(g) * u) into the block's workspace row; y = round(a down[e]^T), one warp per
//      output; part[t, j, :] = w * y (fp32, in the workspace);
//   3. the last block of the tile to finish (a counter per tile, after __threadfence) writes
//      out[t] = round(sum_j part[t, j] + part[t, K]) for its tokens, slot by slot: deterministic.
// Dot products: each lane sums a strided part in fp32, then the fixed butterfly (tk::warp_sum); the
// CPU reference sums in OpenBLAS's order, so results agree to fp32 rounding before the final rounding.
//
// Launch assumptions: blockDim.x == 256 (8 warps); dynamic shared memory 12 * E bytes (the (value,
// index) pairs of the selection, then the router probabilities); every tensor contiguous and row-major;
// the workspace (zero-filled by tk) holds part [T, K + 1, H] f32, the per-block rows of I floats and a
// counter per tile. Speed is not the goal of this version: there is no tensor-core GEMM yet.
//
// NVRTC-compatible: no host code, no standard headers, only <tk/device.cuh>.
#include <tk/device.cuh>

namespace tk_moe_impl {

using namespace tk; // to_f32, from_f32, warp_sum, cdiv

constexpr int TOK = 16;  // tokens per tile
constexpr int WARPS = 8; // blockDim.x / 32

template <typename T> __device__ __forceinline__ float rnd(float x) { return to_f32(from_f32<T>(x)); }

__device__ __forceinline__ float act_f(int act, float x)
{
    if (act == 1) {
        float x3 = __fmul_rn(__fmul_rn(x, x), x);
        float inner = __fmul_rn(0.79788456080286535588f, __fadd_rn(x, __fmul_rn(0.044715f, x3)));
        return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, tanhf(inner)));
    }
    if (act == 2)
        return __fmul_rn(__fmul_rn(x, 0.5f), __fadd_rn(1.0f, erff(__fmul_rn(x, 0.70710678118654752440f))));
    return __fdiv_rn(x, __fadd_rn(1.0f, expf(-x)));
}

// sum_k a[k] * b[k] over n, by one warp: lane-strided fp32 partials, then the butterfly.
template <typename A, typename B>
__device__ __forceinline__ float warp_dot(const A *a, const B *b, tk_i64 n)
{
    float s = 0.0f;
    for (tk_i64 k = threadIdx.x % 32; k < n; k += 32)
        s = __fadd_rn(s, __fmul_rn(to_f32(a[k]), to_f32(b[k])));
    return warp_sum(s);
}

// ---- torch.topk's CPU selection (libstdc++'s algorithms with torch's comparator), thread 0 only ----

struct Elem {
    float v;
    int i;
};
__device__ __forceinline__ bool gt(const Elem &x, const Elem &y) { return (isnan(x.v) && !isnan(y.v)) || x.v > y.v; }
__device__ __forceinline__ void swp(Elem *a, Elem *b)
{
    Elem t = *a;
    *a = *b;
    *b = t;
}
__device__ void median_to_first(Elem *r, Elem *a, Elem *b, Elem *c)
{
    if (gt(*a, *b)) {
        if (gt(*b, *c))
            swp(r, b);
        else if (gt(*a, *c))
            swp(r, c);
        else
            swp(r, a);
    } else if (gt(*a, *c)) {
        swp(r, a);
    } else if (gt(*b, *c)) {
        swp(r, c);
    } else {
        swp(r, b);
    }
}
__device__ Elem *partition(Elem *first, Elem *last, Elem *pivot)
{
    for (;;) {
        while (gt(*first, *pivot))
            ++first;
        --last;
        while (gt(*pivot, *last))
            --last;
        if (!(first < last))
            return first;
        swp(first, last);
        ++first;
    }
}
__device__ Elem *partition_pivot(Elem *first, Elem *last)
{
    Elem *mid = first + (last - first) / 2;
    median_to_first(first, first + 1, mid, last - 1);
    return partition(first + 1, last, first);
}
__device__ void linear_insert(Elem *last)
{
    Elem val = *last, *next = last - 1;
    while (gt(val, *next)) {
        *last = *next;
        last = next;
        --next;
    }
    *last = val;
}
__device__ void insertion_sort(Elem *first, Elem *last)
{
    if (first == last)
        return;
    for (Elem *i = first + 1; i != last; ++i) {
        if (gt(*i, *first)) {
            Elem val = *i;
            for (Elem *p = i; p != first; --p)
                *p = *(p - 1);
            *first = val;
        } else {
            linear_insert(i);
        }
    }
}
__device__ void push_heap(Elem *f, long hole, long top, Elem val)
{
    long parent = (hole - 1) / 2;
    while (hole > top && gt(f[parent], val)) {
        f[hole] = f[parent];
        hole = parent;
        parent = (hole - 1) / 2;
    }
    f[hole] = val;
}
__device__ void adjust_heap(Elem *f, long hole, long len, Elem val)
{
    long top = hole, child = hole;
    while (child < (len - 1) / 2) {
        child = 2 * (child + 1);
        if (gt(f[child], f[child - 1]))
            child--;
        f[hole] = f[child];
        hole = child;
    }
    if ((len & 1) == 0 && child == (len - 2) / 2) {
        child = 2 * (child + 1);
        f[hole] = f[child - 1];
        hole = child - 1;
    }
    push_heap(f, hole, top, val);
}
__device__ void pop_heap(Elem *first, Elem *last, Elem *result)
{
    Elem val = *result;
    *result = *first;
    adjust_heap(first, 0, last - first, val);
}
__device__ void heap_select(Elem *first, Elem *middle, Elem *last)
{
    long len = middle - first;
    if (len >= 2)
        for (long parent = (len - 2) / 2;; parent--) {
            adjust_heap(first, parent, len, first[parent]);
            if (parent == 0)
                break;
        }
    for (Elem *i = middle; i < last; ++i)
        if (gt(*i, *first))
            pop_heap(first, middle, i);
}
__device__ void sort_heap(Elem *first, Elem *last)
{
    while (last - first > 1) {
        --last;
        pop_heap(first, last, last);
    }
}
__device__ int lg(long n)
{
    int r = 0;
    while (n > 1) {
        n >>= 1;
        r++;
    }
    return r;
}
__device__ void sort_elems(Elem *first, Elem *last)
{
    if (first == last)
        return;
    // introsort's loop without recursion: the right part of each cut is sorted by an explicit stack
    Elem *stk_f[64], *stk_l[64];
    int depth[64], sp = 0;
    stk_f[sp] = first;
    stk_l[sp] = last;
    depth[sp++] = 2 * lg(last - first);
    while (sp > 0) {
        --sp;
        Elem *f = stk_f[sp], *l = stk_l[sp];
        int d = depth[sp];
        while (l - f > 16) {
            if (d == 0) {
                heap_select(f, l, l);
                sort_heap(f, l);
                break;
            }
            --d;
            Elem *cut = partition_pivot(f, l);
            if (sp < 64) {
                stk_f[sp] = cut;
                stk_l[sp] = l;
                depth[sp++] = d;
            }
            l = cut;
        }
    }
    if (last - first > 16) {
        insertion_sort(first, first + 16);
        for (Elem *i = first + 16; i != last; ++i)
            linear_insert(i);
    } else {
        insertion_sort(first, last);
    }
}
__device__ void nth_element(Elem *first, Elem *nth, Elem *last)
{
    if (first == last || nth == last)
        return;
    int depth = 2 * lg(last - first);
    while (last - first > 3) {
        if (depth == 0) {
            heap_select(first, nth + 1, last);
            swp(first, nth);
            return;
        }
        --depth;
        Elem *cut = partition_pivot(first, last);
        if (cut <= nth)
            first = cut;
        else
            last = cut;
    }
    insertion_sort(first, last);
}
__device__ void topk_torch(Elem *q, long n, long k)
{
    if (k * 64 <= n) {
        heap_select(q, q + k, q + n);
        sort_heap(q, q + k);
    } else {
        nth_element(q, q + k - 1, q + n);
        sort_elems(q, q + k - 1);
    }
}

} // namespace tk_moe_impl

namespace tk_moe_impl {

// The whole layer; tk_moe and tk_moe_shared below are its two entry points (a __global__ function's
// parameter list is what the host packs, so the one without a shared expert has no shared_* parameters).
template <typename T>
__device__ __forceinline__ void moe_body(
       T *out,                  // (T, H)
       const T *input,          // (T, H)
       const T *router_weight,  // (E, H)
       const T *gate_up,        // (E, 2I, H): gate rows then up rows
       const T *down,           // (E, H, I)
       tk_i64 top_k, tk_i64 norm_topk_prob, tk_i64 activation, tk_i64 round_weights,
       const T *router_input,   // (T, H) or null: input
       const T *expert_scale,   // (E,) or null
       const T *shared_gate_up, // (2Is, H) or null
       const T *shared_down,    // (H, Is) or null
       const T *shared_gate,    // (1, H) or null
       int *topk_ids,           // (T, K) or null
       float *topk_weights,     // (T, K) or null
       tk_i64 ntok, tk_i64 H, tk_i64 E, tk_i64 I, tk_i64 Is,
       float *ws)               // part (T, K + 1, H) | rows (gridDim.x * gridDim.y, max(I, Is)) | counters
{
    extern __shared__ float smem[]; // Elem q (E) | p (E): 12 E bytes
    Elem *q = reinterpret_cast<Elem *>(smem);
    float *p = smem + 2 * E;
    __shared__ int s_slot;
    __shared__ float s_w;
    __shared__ bool s_last;
    const tk_i64 K = top_k, e = blockIdx.x, tile = blockIdx.y, Imax = I > Is ? I : Is;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *part = ws;
    float *row = ws + ntok * (K + 1) * H + ((tk_i64)blockIdx.y * gridDim.x + blockIdx.x) * Imax;
    unsigned *counter = reinterpret_cast<unsigned *>(ws + ntok * (K + 1) * H + (tk_i64)gridDim.x * gridDim.y * Imax);
    const T *rin = router_input ? router_input : input;
    const bool shared = e == E;
    const tk_i64 t0 = tile * TOK, t1 = t0 + TOK < ntok ? t0 + TOK : ntok;

    for (tk_i64 t = t0; t < t1; t++) {
        const T *x = input + t * H;
        float w = 1.0f;
        int slot = (int)K;
        if (!shared) {
            // 1. routing
            for (tk_i64 r = warp; r < E; r += WARPS) {
                float l = warp_dot(rin + t * H, router_weight + r * H, H);
                if (lane == 0)
                    p[r] = rnd<T>(l);
            }
            __syncthreads();
            if (threadIdx.x == 0) {
                float mx = -__int_as_float(0x7f800000), sum = 0.0f; // -inf
                for (tk_i64 r = 0; r < E; r++)
                    mx = p[r] > mx ? p[r] : mx;
                for (tk_i64 r = 0; r < E; r++) {
                    p[r] = expf(__fsub_rn(p[r], mx));
                    sum = __fadd_rn(sum, p[r]);
                }
                for (tk_i64 r = 0; r < E; r++)
                    q[r] = Elem{__fdiv_rn(p[r], sum), (int)r};
                topk_torch(q, (long)E, (long)K);
                float ks = 0.0f;
                for (tk_i64 j = 0; j < K; j++)
                    ks = __fadd_rn(ks, q[j].v);
                s_slot = -1;
                for (tk_i64 j = 0; j < K; j++) {
                    float wj = norm_topk_prob ? __fdiv_rn(q[j].v, ks) : q[j].v;
                    if (round_weights)
                        wj = rnd<T>(wj);
                    if (expert_scale)
                        wj = __fmul_rn(wj, to_f32(expert_scale[q[j].i]));
                    if (q[j].i == e) {
                        s_slot = (int)j;
                        s_w = wj;
                    }
                    if (e == 0 && topk_ids)
                        topk_ids[t * K + j] = q[j].i;
                    if (e == 0 && topk_weights)
                        topk_weights[t * K + j] = wj;
                }
            }
            __syncthreads();
            slot = s_slot;
            w = s_w;
            if (slot < 0)
                continue;
        } else if (!shared_gate_up) {
            break; // no shared expert: this block only counts itself below
        }
        // 2. the expert's MLP on token t
        const T *gu = shared ? shared_gate_up : gate_up + e * 2 * I * H;
        const T *dn = shared ? shared_down : down + e * H * I;
        const tk_i64 n = shared ? Is : I;
        for (tk_i64 i = warp; i < n; i += WARPS) {
            float g = rnd<T>(warp_dot(x, gu + i * H, H));
            float u = rnd<T>(warp_dot(x, gu + (n + i) * H, H));
            if (lane == 0)
                row[i] = rnd<T>(__fmul_rn(act_f((int)activation, g), u));
        }
        __syncthreads();
        if (shared && shared_gate) {
            float s = rnd<T>(warp_dot(x, shared_gate, H)); // every warp computes it (no broadcast needed)
            w = rnd<T>(__fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-s))));
        }
        for (tk_i64 h = warp; h < H; h += WARPS) {
            float y = rnd<T>(warp_dot(row, dn + h * n, n));
            if (lane == 0)
                part[(t * (K + 1) + slot) * H + h] = shared ? rnd<T>(__fmul_rn(w, y)) : __fmul_rn(w, y);
        }
        __syncthreads(); // row is rewritten by the next token
    }
    // 3. the tile's last block sums the parts
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0)
        s_last = atomicAdd(counter + tile, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!s_last)
        return;
    __threadfence();
    for (tk_i64 idx = threadIdx.x; idx < (t1 - t0) * H; idx += blockDim.x) {
        tk_i64 t = t0 + idx / H, h = idx % H;
        float s = 0.0f;
        for (tk_i64 j = 0; j <= K; j++)
            s = __fadd_rn(s, __ldcg(part + (t * (K + 1) + j) * H + h));
        out[t * H + h] = from_f32<T>(s);
    }
}

} // namespace tk_moe_impl

// Without a shared expert (Mixtral, Qwen3-MoE, DiffusionGemma's routed experts): manifest entries moe_*.
template <typename T>
__global__ void __launch_bounds__(256)
tk_moe(T *out, const T *input, const T *router_weight, const T *gate_up, const T *down, tk_i64 top_k,
       tk_i64 norm_topk_prob, tk_i64 activation, tk_i64 round_weights, const T *router_input, const T *expert_scale,
       int *topk_ids, float *topk_weights, tk_i64 ntok, tk_i64 H, tk_i64 E, tk_i64 I, tk_i64 Is, float *ws)
{
    tk_moe_impl::moe_body<T>(out, input, router_weight, gate_up, down, top_k, norm_topk_prob, activation,
                             round_weights, router_input, expert_scale, nullptr, nullptr, nullptr, topk_ids,
                             topk_weights, ntok, H, E, I, Is, ws);
}

// With the shared expert (Qwen2-MoE): manifest entries moe_shared_*.
template <typename T>
__global__ void __launch_bounds__(256)
tk_moe_shared(T *out, const T *input, const T *router_weight, const T *gate_up, const T *down, tk_i64 top_k,
              tk_i64 norm_topk_prob, tk_i64 activation, tk_i64 round_weights, const T *router_input,
              const T *expert_scale, const T *shared_gate_up, const T *shared_down, const T *shared_gate,
              int *topk_ids, float *topk_weights, tk_i64 ntok, tk_i64 H, tk_i64 E, tk_i64 I, tk_i64 Is, float *ws)
{
    tk_moe_impl::moe_body<T>(out, input, router_weight, gate_up, down, top_k, norm_topk_prob, activation,
                             round_weights, router_input, expert_scale, shared_gate_up, shared_down, shared_gate,
                             topk_ids, topk_weights, ntok, H, E, I, Is, ws);
}
