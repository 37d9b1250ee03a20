// layers.cu — the layer kernels of kernels-community/layers, for tk's model pipelines.
//
// Variants (templates over T = float, __half, __nv_bfloat16; ids I = int or long long; one manifest
// entry per op and dtype):
//   tk_embedding<T, I>  out[i, :] = weight[ids[i], :]     out (n, D), ids (n,), weight (V, D)
//   tk_add<T>           out[i] = a[i] + b[i]              (n,) each
//   tk_tanh<T>          out[i] = tanh(input[i])           (n,) each
//   tk_softcap<T>       out[i] = cap * tanh(input[i] / cap) (n,) each
//   tk_embedding_backward<T, G, I>   grad_weight[ids[i], :] += grad_out[i, :]  (G = f32; deterministic:
//                       a thread per column walks the rows in order; see the kernel)
//   tk_tanh_backward<T> grad_input[i] = grad_out[i] * (1 - tanh(input[i])^2)
//
// Launch assumptions:
//   - every tensor is contiguous and row-major;
//   - add and tanh: a grid-stride loop over all n elements, any grid and block size; out may be an
//     input itself (each element is read before it is written, by the same thread) but must not
//     partly overlap one;
//   - embedding: a grid-stride loop over (row, 16-byte chunk) items, any grid and block size; out
//     must not overlap weight or ids.
//   16-byte vector loads and stores are used when every pointer is 16-byte aligned (and, for the
//   embedding, the row is a whole number of 16-byte chunks); otherwise scalar code runs.
//
// Numerics: add and tanh load each element as fp32, compute in fp32 (__fadd_rn, so no contraction;
// tanhf, the accurate CUDA version: these entries are built without fast math) and round once to T
// (round to nearest even), as tk's CPU reference (ops/layers.c) does. The embedding copies rows bit
// for bit. An id outside [0, V) writes a zero row: a kernel cannot report an error (the CPU
// reference rejects it).
//
// Conversions, packs and grid-stride helpers come from tk's device toolkit, <tk/device.cuh>.
// NVRTC-compatible: no host code, no standard headers, only <tk/device.cuh>.
#include <tk/device.cuh>

namespace tk_layers {

using namespace tk; // to_f32, from_f32, Vec, Pack, aligned16, grid_index, grid_stride, cdiv

struct Add {
    static __device__ __forceinline__ float f(float a, float b) { return __fadd_rn(a, b); }
};
struct Tanh {
    static __device__ __forceinline__ float f(float a, float) { return tanhf(a); }
};

// out[i] = Op(a[i], b[i]) for i < n; b == nullptr for a unary op. No __restrict__: out may be a or b.
template <typename T, typename Op>
__device__ __forceinline__ void elementwise(T *out,        // (n,) T
                                            const T *a,    // (n,) T
                                            const T *b,    // (n,) T or nullptr
                                            tk_i64 n)
{
    constexpr int N = Vec<T>::N;
    const tk_i64 tid = grid_index(), stride = grid_stride();
    const bool vec = aligned16(out) && aligned16(a) && (b == nullptr || aligned16(b));
    const tk_i64 nvec = vec ? n / N : 0;
    for (tk_i64 i = tid; i < nvec; i += stride) {
        Pack<T> x = reinterpret_cast<const Pack<T> *>(a)[i], y, r;
        if (b)
            y = reinterpret_cast<const Pack<T> *>(b)[i];
#pragma unroll
        for (int k = 0; k < N; k++)
            r.v[k] = from_f32<T>(Op::f(to_f32(x.v[k]), b ? to_f32(y.v[k]) : 0.0f));
        reinterpret_cast<Pack<T> *>(out)[i] = r;
    }
    for (tk_i64 i = nvec * N + tid; i < n; i += stride)
        out[i] = from_f32<T>(Op::f(to_f32(a[i]), b ? to_f32(b[i]) : 0.0f));
}

} // namespace tk_layers

// out[i] = a[i] + b[i]
template <typename T>
__global__ void tk_add(T *out,     // (n,) T
                       const T *a, // (n,) T
                       const T *b, // (n,) T
                       tk_i64 n)
{
    tk_layers::elementwise<T, tk_layers::Add>(out, a, b, n);
}

// out[i] = tanh(input[i])
template <typename T>
__global__ void tk_tanh(T *out,         // (n,) T
                        const T *input, // (n,) T
                        tk_i64 n)
{
    tk_layers::elementwise<T, tk_layers::Tanh>(out, input, nullptr, n);
}

// out[i] = cap * tanh(input[i] / cap) (fp32, tanhf; out may be input). A grid-stride loop.
template <typename T>
__global__ void tk_softcap(T *out,         // (n,) T
                           const T *input, // (n,) T
                           float cap, tk_i64 n)
{
    const tk_i64 tid = tk::grid_index(), stride = tk::grid_stride();
    for (tk_i64 i = tid; i < n; i += stride)
        out[i] = tk::from_f32<T>(cap * tanhf(__fdiv_rn(tk::to_f32(input[i]), cap)));
}

// out[i, :] = weight[ids[i], :], a zero row for an id outside [0, V). Items are (row i, 16-byte chunk
// c) pairs: chunk c of a row covers bytes [16c, 16c + 16) of it.
template <typename T, typename I>
__global__ void tk_embedding(T *__restrict__ out,          // (n, D) T
                             const I *__restrict__ ids,    // (n,) i32 or i64
                             const T *__restrict__ weight, // (V, D) T
                             tk_i64 n, tk_i64 V, tk_i64 D)
{
    using namespace tk_layers;
    constexpr int N = Vec<T>::N;
    const tk_i64 chunks = cdiv(D, N);
    const tk_i64 tid = grid_index(), stride = grid_stride();
    const bool vec = D % N == 0 && aligned16(out) && aligned16(weight);
    for (tk_i64 it = tid; it < n * chunks; it += stride) {
        const tk_i64 i = it / chunks, c = it % chunks;
        const tk_i64 id = (tk_i64)ids[i];
        const bool ok = id >= 0 && id < V;
        T *o = out + i * D;
        const T *w = weight + (ok ? id : 0) * D;
        if (vec) {
            Pack<T> r;
            if (ok) {
                r = reinterpret_cast<const Pack<T> *>(w)[c];
            } else {
#pragma unroll
                for (int k = 0; k < N; k++)
                    r.v[k] = from_f32<T>(0.0f);
            }
            reinterpret_cast<Pack<T> *>(o)[c] = r;
        } else {
            const tk_i64 end = (c + 1) * N < D ? (c + 1) * N : D;
            for (tk_i64 d = c * N; d < end; d++)
                o[d] = ok ? w[d] : from_f32<T>(0.0f);
        }
    }
}

// grad_weight[ids[i], :] += grad_out[i, :] for every row i whose id is in [0, V) and not padding_idx
// (nn.Embedding's padding_idx: that row never gets a gradient). Each thread owns one column of every
// row it touches and walks the rows in order, so no two threads write one element and the sums are in
// the rows' order: deterministic, the same on every run and equal to the CPU reference's order. grid
// x: column blocks (grid-strided), any block size. grad_weight is f32 (or T), accumulated into.
template <typename T, typename G, typename I>
__global__ void tk_embedding_backward(G *__restrict__ grad_weight,  // (V, D) G, accumulated
                                      const T *__restrict__ grad_out, // (n, D) T
                                      const I *__restrict__ ids,      // (n,) i32 or i64
                                      tk_i64 padding_idx, tk_i64 n, tk_i64 V, tk_i64 D)
{
    using namespace tk_layers;
    for (tk_i64 c = grid_index(); c < D; c += grid_stride()) {
        for (tk_i64 i = 0; i < n; i++) {
            const tk_i64 id = (tk_i64)ids[i];
            if (id < 0 || id >= V || id == padding_idx)
                continue;
            G *w = grad_weight + id * D + c;
            *w = from_f32<G>(__fadd_rn(to_f32(*w), to_f32(grad_out[i * D + c])));
        }
    }
}

// grad_input[i] = grad_out[i] * (1 - tanh(input[i])^2)   (fp32, tanhf; grad_input may be grad_out)
template <typename T>
__global__ void tk_tanh_backward(T *grad_input,        // (n,) T
                                 const T *grad_out,    // (n,) T
                                 const T *input,       // (n,) T
                                 tk_i64 n)
{
    using namespace tk_layers;
    for (tk_i64 i = grid_index(); i < n; i += grid_stride()) {
        const float t = tanhf(to_f32(input[i]));
        grad_input[i] = from_f32<T>(__fmul_rn(to_f32(grad_out[i]), __fsub_rn(1.0f, __fmul_rn(t, t))));
    }
}
