// embedding.cu — 8-bit embedding gathers of kernels-community/casted.
//
// Variants (templates over OutT = float / __nv_bfloat16, IdT = int / long long, F = the code format):
//   tk_casted_embedding               out[i, :] = decode(weight[ids[i], :]) * scale[ids[i]]
//                                     weight [V, D] codes, scale [V] f32 or null (fp8 only: unscaled)
//   tk_casted_embedding_block_sparse  the same row from a block-CSR table (README.md: the format):
//                                     out[i, col_idx[k]*bs_c + c] = decode(values[k, r, c]) * scale[k]
//                                     for the stored blocks k of row block ids[i] / bs_r, r = ids[i] % bs_r;
//                                     0 elsewhere
//
// Launch assumptions:
//   - contiguous row-major tensors; one thread per chunk of a row (16 codes for the dense table, 8 for
//     the block-sparse one): grid.x = cdiv(numel(ids) * cdiv(D, chunk), 256), block = 256;
//   - 16-byte loads of the dense table and 16-byte stores when D % 16 == 0 and the pointers are aligned
//     (block-sparse: 8-byte loads when bs_c % 8 == 0), scalar code otherwise, for any D;
//   - an id outside [0, V) writes a zero row (the CPU reference reports it as an error instead);
//   - block-sparse: row_ptr entries are clamped to [0, nnzb] and a column block is found by binary
//     search in col_idx[row_ptr[rb] .. row_ptr[rb+1]), so a malformed table cannot make a read out of
//     bounds; its rows are then unspecified (the CPU reference validates the structure).
//
// Numerics: codes decode exactly to fp32; decode * scale is one fp32 multiply, rounded once to OutT.
//
// NVRTC-compatible: no host code, no standard headers.
#include "casted.cuh"

namespace tk_casted {

// Binary search for column block cb in col_idx[lo, hi) (sorted); its index, or -1.
__device__ __forceinline__ tk_i64 find_block(const int *__restrict__ col_idx, tk_i64 lo, tk_i64 hi, tk_i64 cb)
{
    tk_i64 a = lo, b = hi;
    while (a < b) {
        const tk_i64 mid = (a + b) >> 1;
        if ((tk_i64)__ldg(col_idx + mid) < cb)
            a = mid + 1;
        else
            b = mid;
    }
    return (a < hi && (tk_i64)__ldg(col_idx + a) == cb) ? a : -1;
}

} // namespace tk_casted

// ---- entry points ---------------------------------------------------------------------------------

template <typename OutT, typename IdT, int F>
__global__ void __launch_bounds__(256) tk_casted_embedding(OutT *__restrict__ out,                // (n, D) OutT
                                                           const IdT *__restrict__ ids,           // (n,) IdT
                                                           const unsigned char *__restrict__ weight, // (V, D) codes
                                                           const float *__restrict__ scale,       // (V,) f32 or null
                                                           tk_i64 n, tk_i64 V, tk_i64 D)
{
    using namespace tk_casted;
    const tk_i64 cpr = (D + 15) >> 4; // chunks per row
    const tk_i64 item = (tk_i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (item >= n * cpr)
        return;
    const tk_i64 row = item / cpr, c0 = (item - row * cpr) << 4;
    const tk_i64 id = (tk_i64)ids[row];
    const bool vec = (D & 15) == 0 && aligned(weight, 16) && aligned(out, 16);
    const tk_i64 cnt = D - c0 < 16 ? D - c0 : 16;
    OutT *o = out + row * D + c0;
    float f[16];
#pragma unroll
    for (int j = 0; j < 16; j++)
        f[j] = 0.0f;
    if (id >= 0 && id < V) {
        const unsigned char *w = weight + id * D + c0;
        if (vec) {
            dq16<F>(__ldg(reinterpret_cast<const uint4 *>(w)), f);
        } else {
#pragma unroll
            for (int j = 0; j < 16; j++)
                if (j < cnt)
                    f[j] = dq1<F>(__ldg(w + j));
        }
        if (scale) {
            const float s = __ldg(scale + id);
#pragma unroll
            for (int j = 0; j < 16; j++)
                f[j] = __fmul_rn(f[j], s);
        }
    }
    if (vec) {
        storev<16>(o, f);
    } else {
#pragma unroll
        for (int j = 0; j < 16; j++)
            if (j < cnt)
                store1(o + j, f[j]);
    }
}

template <typename OutT, typename IdT, int F>
__global__ void __launch_bounds__(256)
    tk_casted_embedding_block_sparse(OutT *__restrict__ out,                // (n, D) OutT
                                     const IdT *__restrict__ ids,           // (n,) IdT
                                     const int *__restrict__ row_ptr,       // (nrb + 1,) i32
                                     const int *__restrict__ col_idx,       // (nnzb,) i32
                                     const unsigned char *__restrict__ values, // (nnzb, bs_r, bs_c) codes
                                     const float *__restrict__ scale,       // (nnzb,) f32 or null
                                     tk_i64 num_embeddings,                 // V; 0: nrb * bs_r
                                     tk_i64 n, tk_i64 D, tk_i64 nrb, tk_i64 nnzb, tk_i64 bs_r, tk_i64 bs_c)
{
    using namespace tk_casted;
    const tk_i64 cpr = (D + 7) >> 3;
    const tk_i64 item = (tk_i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (item >= n * cpr)
        return;
    const tk_i64 row = item / cpr, c0 = (item - row * cpr) << 3;
    const tk_i64 id = (tk_i64)ids[row];
    tk_i64 V = nrb * bs_r;
    if (num_embeddings > 0 && num_embeddings < V)
        V = num_embeddings;
    const bool vec = (bs_c & 7) == 0 && (D & 7) == 0 && aligned(values, 8) && aligned(out, 16);
    const tk_i64 cnt = D - c0 < 8 ? D - c0 : 8;
    OutT *o = out + row * D + c0;
    float f[8];
#pragma unroll
    for (int j = 0; j < 8; j++)
        f[j] = 0.0f;
    if (id >= 0 && id < V) {
        const tk_i64 rb = id / bs_r, r = id - rb * bs_r;
        tk_i64 lo = __ldg(row_ptr + rb), hi = __ldg(row_ptr + rb + 1);
        lo = lo < 0 ? 0 : lo > nnzb ? nnzb : lo;
        hi = hi < lo ? lo : hi > nnzb ? nnzb : hi;
        if (vec) { // the chunk lies in one column block
            const tk_i64 cb = c0 / bs_c, k = find_block(col_idx, lo, hi, cb);
            if (k >= 0) {
                const uint2 v =
                    __ldg(reinterpret_cast<const uint2 *>(values + (k * bs_r + r) * bs_c + (c0 - cb * bs_c)));
                dq4<F>(v.x, f);
                dq4<F>(v.y, f + 4);
                if (scale) {
                    const float s = __ldg(scale + k);
#pragma unroll
                    for (int j = 0; j < 8; j++)
                        f[j] = __fmul_rn(f[j], s);
                }
            }
        } else {
            tk_i64 cb_prev = -1, k = -1;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const tk_i64 c = c0 + j, cb = c / bs_c;
                if (j < cnt && cb != cb_prev) {
                    k = find_block(col_idx, lo, hi, cb);
                    cb_prev = cb;
                }
                if (j < cnt && k >= 0) {
                    f[j] = dq1<F>(__ldg(values + (k * bs_r + r) * bs_c + (c - cb * bs_c)));
                    if (scale)
                        f[j] = __fmul_rn(f[j], __ldg(scale + k));
                }
            }
        }
    }
    if (vec) {
        storev<8>(o, f);
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (j < cnt)
                store1(o + j, f[j]);
    }
}
