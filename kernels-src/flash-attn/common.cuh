// common.cuh — shared pieces of the prefill attention kernels of kernels-community/flash-attn
// (fwd_sm80.cu, fwd_sm90.cu, bwd_sm80.cu, fwd_simple.cu): inline-PTX wrappers for
// mma.sync / ldmatrix / cp.async, the XOR swizzle of the shared-memory tiles, fast exp2/tanh and the
// masking rules every attention op shares.
//
// Masking (flash-attn 2 conventions, as ops/attention.c): query i of a sequence with sq queries and sk
// keys sits at position p = i + (sk - sq). Key j is visible iff j < sk, j <= p + wr (wr >= 0) and
// j >= p - wl (wl >= 0); causal sets wr = 0. Scores are computed in the log2 domain:
//   x = (softcap > 0 ? softcap * tanh(scale * q.k / softcap) : scale * q.k) * log2(e)
//       - slope * log2(e) * |p - j|          (ALiBi, when slopes are given)
// so that softmax weights are exp2(x - max). lse is converted back to natural log on the way out.
//
// Conversions and RNE pair packing come from tk's device toolkit, <tk/device.cuh>.
//
// NVRTC-compatible: no host code, no standard headers, only <tk/device.cuh>.
#pragma once

#include <tk/device.cuh>

namespace tk_fa {

using namespace tk; // to_f32, from_f32, pack2 (<tk/device.cuh>)

typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

#define TK_FA_LOG2E 1.4426950408889634f
#define TK_FA_LN2 0.6931471805599453f
#define TK_FA_NEG_INF __int_as_float(0xff800000)

// ---- fast math ---------------------------------------------------------------------------------

// 2^x with the SFU (relative error ~2^-22); ex2(-inf) = +0, which the online softmax relies on.
__device__ __forceinline__ float ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// tanh(x) = 1 - 2 / (exp(2x) + 1): absolute error ~1e-7 for every x (tanh.approx.f32's ~2^-11
// relative error would be ~0.02 in a softcap-50 logit). Saturates to +-1 without NaN.
__device__ __forceinline__ float tanh_acc(float x)
{
    float e = ex2(x * (2.0f * TK_FA_LOG2E));
    return 1.0f - __fdividef(2.0f, e + 1.0f);
}

__device__ __forceinline__ int cdiv_i(int a, int b) { return (a + b - 1) / b; }
// floor(a / b) for b > 0 and any sign of a.
__device__ __forceinline__ int floordiv_i(int a, int b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// ---- shared memory addressing ------------------------------------------------------------------

__device__ __forceinline__ u32 smem_u32(const void *p) { return (u32)__cvta_generic_to_shared(p); }

// Element offset of (row, col) in a [rows][COLS] tile of 16-bit elements whose 16-byte chunks are
// XOR-swizzled so that 8 consecutive rows read at the same logical chunk hit 8 different 16-byte bank
// groups (conflict-free ldmatrix and cp.async). col must be a multiple of 8 for chunk reads; any col
// works for single elements. Rows of >= 128 bytes XOR the chunk with (row & 7) (inside the row's
// aligned group of 8 chunks); 64-byte rows XOR with ((row >> 1) & 3).
template <int COLS> __device__ __forceinline__ int swz(int row, int col)
{
    constexpr int CH = COLS / 8; // 16-byte chunks per row
    static_assert(CH == 4 || CH % 8 == 0, "swizzled tiles have 32 or a multiple of 64 columns");
    const int c = col >> 3;
    const int pc = CH >= 8 ? (c ^ (row & 7)) : (c ^ ((row >> 1) & 3));
    return row * COLS + (pc << 3) + (col & 7);
}

// ldmatrix addressing without per-use swizzle arithmetic. For a tile with rows of ROWB >= 128 bytes
// (a multiple of 128) swizzled as swz<>, a lane reading row (rbase + lrow) at chunk (cb8 + lch), with
// rbase a multiple of 8, cb8 even and lch in {0, 1}, has the byte offset
//   sw_off(lane_off<ROWB>(lrow, lch, lrow & 7), cb8) + rbase * ROWB,
// where lane_off is computed once per thread and cb8 / rbase are compile-time after unrolling: the
// XOR only touches bits 4..6, which the row part leaves zero.
template <int ROWB> __device__ __forceinline__ u32 lane_off(int lrow, int lch)
{
    static_assert(ROWB % 128 == 0, "rows of a multiple of 128 bytes");
    return (u32)(lrow * ROWB + ((lch ^ (lrow & 7)) << 4));
}
__device__ __forceinline__ u32 sw_off(u32 L, int cb8) { return (L ^ (u32)((cb8 & 7) << 4)) + (u32)((cb8 & ~7) << 4); }

// ---- cp.async ----------------------------------------------------------------------------------

// 16 bytes global -> shared; src_bytes = 0 writes zeros without reading src (src must still be a
// mapped address). .cg: cache in L2 only (the tile is reused from shared memory, not L1).
__device__ __forceinline__ void cp_async16(u32 dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Copies a ROWS x D tile of 16-bit T from global rows src + r * stride (r < valid; rows >= valid are
// zero-filled, src itself must stay a mapped address) into a swz<D> tile at shared byte address dst.
// NT threads; thread tid copies column chunk tid % (D / 8) of rows tid / (D / 8) + i * NT / (D / 8).
template <typename T, int D, int ROWS, int NT>
__device__ __forceinline__ void load_tile(u32 dst, const T *src, i64 stride, int valid, int tid)
{
    constexpr int DC = D / 8, RSTEP = NT / DC;
    static_assert(NT % DC == 0 && ROWS % RSTEP == 0, "threads cover whole rows");
    const int lr = tid / DC, lcol = (tid % DC) * 8;
    const T *p = src + lcol;
#pragma unroll
    for (int i = 0; i < ROWS / RSTEP; i++) {
        const int r = lr + i * RSTEP;
        const bool ok = r < valid;
        cp_async16(dst + 2 * swz<D>(r, lcol), p + (ok ? (i64)r * stride : 0), ok ? 16 : 0);
    }
}

// ---- ldmatrix ----------------------------------------------------------------------------------

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, register i holds matrix
// i's fragment: lane l gets row l/4, columns 2(l%4), 2(l%4)+1 (with .trans: row 2(l%4) and 2(l%4)+1
// of column l/4, i.e. the transposed matrix's fragment).
__device__ __forceinline__ void ldsm_x4(u32 r[4], u32 addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(u32 r[4], u32 addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// ---- mma.sync m16n8k16, fp32 accumulate --------------------------------------------------------
//
// Fragments (g = lane / 4, t = lane % 4):
//   A (16x16, row): a[0] = (g, 2t..2t+1), a[1] = (g+8, 2t..), a[2] = (g, 2t+8..), a[3] = (g+8, 2t+8..)
//   B (16x8, col):  b[0] = (k 2t..2t+1, n g), b[1] = (k 2t+8..2t+9, n g)
//   C (16x8 f32):   c[0..1] = (g, 2t..2t+1), c[2..3] = (g+8, 2t..2t+1)
template <typename T> struct Mma;
template <> struct Mma<__half> {
    static __device__ __forceinline__ void run(float c[4], const u32 a[4], u32 b0, u32 b1)
    {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};
template <> struct Mma<__nv_bfloat16> {
    static __device__ __forceinline__ void run(float c[4], const u32 a[4], u32 b0, u32 b1)
    {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

// ---- masking -----------------------------------------------------------------------------------

// One sequence's geometry and the call's score options, as the kernels see them.
struct Mask {
    int sq, sk;   // this sequence's queries and keys
    int off;      // sk - sq: query i sits at position i + off
    int wl, wr;   // window; -1 = unbounded (causal has wr = 0)
    __device__ __forceinline__ bool visible(int p, int j) const
    {
        return j < sk && (wr < 0 || j <= p + wr) && (wl < 0 || j >= p - wl);
    }
};

// The scaled score in the log2 domain, before the mask: softcap, then ALiBi (slope_l2 = slope *
// log2(e), 0 without ALiBi). mul = scale * log2(e) without softcap, scale / softcap with it.
__device__ __forceinline__ float score_l2(float qk, float mul, float softcap_l2, bool use_softcap,
                                          float slope_l2, int p, int j)
{
    float x = use_softcap ? softcap_l2 * tanh_acc(qk * mul) : qk * mul;
    if (slope_l2 != 0.0f)
        x -= slope_l2 * fabsf((float)(p - j));
    return x;
}

// Where a sequence's rows and keys start in the packed tensors. Non-varlen (cu_q null): sequence s is
// batch s < B. Varlen: batch 0, sequence s < nseq owns rows cu_q[s]..cu_q[s+1] of q and cu_k[s].. of k.
// nseq must be the true count (cu_seqlens_q.shape[0] - 1, from the launch rule): the arrays hold
// nseq + 1 entries and nothing in them marks the end (rows after cu_q[nseq] may be padding), so s is
// checked against nseq before any entry is read, and nothing past cu_q[nseq] is ever read. The offsets
// are clamped to the tensors' rows, so malformed cu_seqlens (the CPU reference rejects them; a kernel
// cannot report) give empty or truncated sequences, never an access outside q, k or lse.
struct Seq {
    int b, q0, k0, sq, sk;
};
// Fills *o for sequence s; false when s is past the last sequence.
__device__ __forceinline__ bool seq_at(Seq *o, int s, const int *cu_q, const int *cu_k, int nseq, int B,
                                       int Sq, int Sk)
{
    if (!cu_q) {
        if (s >= B)
            return false;
        o->b = s;
        o->q0 = 0;
        o->k0 = 0;
        o->sq = Sq;
        o->sk = Sk;
        return true;
    }
    if (s < 0 || s >= nseq)
        return false;
    const int q0 = min(max(__ldg(cu_q + s), 0), Sq), q1 = min(max(__ldg(cu_q + s + 1), q0), Sq);
    const int k0 = min(max(__ldg(cu_k + s), 0), Sk), k1 = min(max(__ldg(cu_k + s + 1), k0), Sk);
    o->b = 0;
    o->q0 = q0;
    o->sq = q1 - q0;
    o->k0 = k0;
    o->sk = k1 - k0;
    return true;
}

// The key range [lo, hi) that rows [r0, r1) (r1 > r0) of a sequence can see, clamped to [0, sk);
// empty when hi <= lo.
__device__ __forceinline__ void key_range(int *lo, int *hi, const Mask &m, int r0, int r1)
{
    int l = 0, h = m.sk;
    if (m.wr >= 0)
        h = min(h, r1 - 1 + m.off + m.wr + 1);
    if (m.wl >= 0)
        l = max(0, r0 + m.off - m.wl);
    *lo = l;
    *hi = h;
}

// True when every (row in [r0, r1), key in [n0, n0 + bn)) pair is visible, so no mask is needed.
__device__ __forceinline__ bool tile_full(const Mask &m, int r0, int r1, int n0, int bn)
{
    if (n0 + bn > m.sk)
        return false;
    if (m.wr >= 0 && n0 + bn - 1 > r0 + m.off + m.wr)
        return false;
    if (m.wl >= 0 && n0 < r1 - 1 + m.off - m.wl)
        return false;
    return true;
}

} // namespace tk_fa
