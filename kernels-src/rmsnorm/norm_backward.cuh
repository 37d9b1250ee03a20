// norm_backward.cuh — the body of the backward kernels (rmsnorm.cu: rms_norm_backward,
// fused_add_rms_norm_backward; layernorm.cu: layer_norm_backward, fused_add_layer_norm_backward).
//
// With xh = (x - mean) * rstd (rms norm: mean = 0, rstd = rsqrt(mean(x^2) + eps); layer norm: the row
// mean and rstd = rsqrt(var + eps), var the biased variance) and gw = grad_out * weight:
//   grad_input  = rstd * (gw - c1 - xh * c2)   c1 = mean(gw) (layer norm; 0 for rms), c2 = mean(gw * xh)
//               (+ grad_residual in the fused forms: the gradient of the forward's input and residual)
//   grad_weight = sum over rows of grad_out * xh,   grad_bias = sum over rows of grad_out
//
// Launch: grid.x = G blocks (any G >= 1), blockDim.x = B, a multiple of 32 up to 1024 (the manifest
// gives 256 for d <= 2048, else align(cdiv(d, 8), 32) up to 1024). G is best at most what the GPU holds
// at once: a second wave of blocks would nearly double the time. At 64 registers an SM holds 1024 / B
// blocks; the manifest's G is at most sm_count * (1024 / B), one wave on the launching GPU. Every
// tensor contiguous; grad_input must not overlap grad_out or the saved input, except that the fused
// forms may accumulate in place (grad_input == grad_residual).
//
// Each block splits into W teams of bt threads, one row per team at a time (rows blockIdx.x * W + team,
// then + G * W, ...): bt is the smallest of 32, 64, 128 that holds the row at the register path's
// elements per thread and divides B, else B (one team). Teams reduce their row with warp shuffles (and
// shared memory across the team's warps); every team runs the same number of iterations, so block
// barriers stay uniform.
//   - registers (d <= 8 * B with 16-byte units, d <= 4 * B with scalars): each thread holds its up to 8
//     (4) elements of x and grad_out in T and its grad_weight/grad_bias partials in fp32: one read of
//     each input per row (weight re-read from L1); 16-byte loads when d is a multiple of the vector
//     width and every pointer is 16-byte aligned. The teams' partials are added in team order through
//     shared memory, then stored in the block's row of the workspace. At most 64 registers per thread
//     (__launch_bounds__(1024, 1)).
//   - streaming (larger d, one team): three passes over the row (two for rms), re-read from L1/L2, the
//     partials accumulated in the block's workspace row (each column owned by one thread).
// norm_common.cuh's combine_partials then adds the blocks' rows in a fixed order (deterministic). The
// workspace holds P x G x d floats (P = 2 for layer norm, else 1) and cdiv(G, GROUP) + 1 counters,
// zero-filled.
//
// Numerics: fp32 throughout; the row sums use the two-pass mean (no E[x^2] - mean^2 cancellation).
#pragma once

#include "norm_common.cuh"

namespace tk_norm {

constexpr int BWD_PER_THREAD = 8; // elements of a row per thread on the register path

template <typename T, int U> __device__ __forceinline__ void load_units(float (&dst)[U], const T *row, tk_i64 u)
{
    const Units<T, U> a = reinterpret_cast<const Units<T, U> *>(row)[u];
#pragma unroll
    for (int k = 0; k < U; k++)
        dst[k] = to_f32(a.v[k]);
}

template <typename T, int U> __device__ __forceinline__ void store_units(T *row, tk_i64 u, const float (&src)[U])
{
    Units<T, U> a;
#pragma unroll
    for (int k = 0; k < U; k++)
        a.v[k] = from_f32<T>(src[k]);
    reinterpret_cast<Units<T, U> *>(row)[u] = a;
}

// p[k] (+)= v[k] for k < U; p is 16-byte aligned when U % 4 == 0.
template <int U, bool Add> __device__ __forceinline__ void put_f32(float *p, const float (&v)[U])
{
    if constexpr (U % 4 == 0) {
#pragma unroll
        for (int q = 0; q < U / 4; q++) {
            float4 *p4 = reinterpret_cast<float4 *>(p) + q;
            float4 a = Add ? *p4 : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            a.x += v[4 * q];
            a.y += v[4 * q + 1];
            a.z += v[4 * q + 2];
            a.w += v[4 * q + 3];
            *p4 = a;
        }
    } else {
#pragma unroll
        for (int k = 0; k < U; k++)
            p[k] = Add ? p[k] + v[k] : v[k];
    }
}

// Replaces each v[k] with its sum over the thread's team (bt consecutive threads, bt a multiple of 32
// dividing blockDim.x), in every thread of the team; the warps' sums are added in warp order. Every
// thread of the block must call it with the same bt.
template <int K> __device__ __forceinline__ void team_sum(float (&v)[K], int bt)
{
    __shared__ float part[K][32];
#pragma unroll
    for (int k = 0; k < K; k++)
        v[k] = warp_sum(v[k]);
    if (bt == 32)
        return;
    const int warp = threadIdx.x >> 5, nw = bt >> 5, w0 = (threadIdx.x / bt) * nw;
    if ((threadIdx.x & 31) == 0)
#pragma unroll
        for (int k = 0; k < K; k++)
            part[k][warp] = v[k];
    __syncthreads();
#pragma unroll
    for (int k = 0; k < K; k++) {
        float s = 0.0f;
        for (int i = 0; i < nw; i++)
            s += part[k][w0 + i];
        v[k] = s;
    }
    __syncthreads(); // part is rewritten by the next call
}

// Register path: thread t of team `team` owns units tl + c * bt (tl = t % bt, c < C) of U elements,
// U * C <= BWD_PER_THREAD.
template <typename T, int U, int C, bool Layer, bool Fused>
__device__ __forceinline__ void bwd_rows_reg(T *gi, const T *go, const T *gr, const T *x, const T *w, float eps,
                                             tk_i64 d, tk_i64 rows, int bt, float *pw, float *pb,
                                             float (&red)[2][BWD_PER_THREAD * 128])
{
    typedef Units<T, U> V;
    const int nu = (int)(d / U); // d <= 8 * 1024 here
    const int W = blockDim.x / bt, team = threadIdx.x / bt, tl = threadIdx.x % bt;
    const V *wr = reinterpret_cast<const V *>(w);
    float aw[C][U], ab[C][U];
#pragma unroll
    for (int c = 0; c < C; c++)
#pragma unroll
        for (int k = 0; k < U; k++)
            aw[c][k] = ab[c][k] = 0.0f;
    for (tk_i64 base = (tk_i64)blockIdx.x * W; base < rows; base += (tk_i64)gridDim.x * W) {
        const tk_i64 row = base + team;
        const bool active = row < rows;
        const V *xr = reinterpret_cast<const V *>(x + row * d), *gor = reinterpret_cast<const V *>(go + row * d);
        V xs[C], gs[C];
#pragma unroll
        for (int c = 0; c < C; c++) {
            const int u = tl + c * bt;
            if (active && u < nu) {
                xs[c] = xr[u];
                gs[c] = gor[u];
            }
        }
        float mean = 0.0f;
        if (Layer) {
            float t[1] = {0.0f};
#pragma unroll
            for (int c = 0; c < C; c++)
                if (active && tl + c * bt < nu)
#pragma unroll
                    for (int k = 0; k < U; k++)
                        t[0] += to_f32(xs[c].v[k]);
            team_sum(t, bt);
            mean = t[0] / (float)d;
        }
        // sum (x - mean)^2, sum gw, sum gw * (x - mean)
        float t[3] = {0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int c = 0; c < C; c++) {
            const int u = tl + c * bt;
            if (active && u < nu) {
                const V wv = wr[u];
#pragma unroll
                for (int k = 0; k < U; k++) {
                    const float xm = to_f32(xs[c].v[k]) - mean, g = to_f32(gs[c].v[k]) * to_f32(wv.v[k]);
                    t[0] = fmaf(xm, xm, t[0]);
                    t[1] += g;
                    t[2] = fmaf(g, xm, t[2]);
                }
            }
        }
        team_sum(t, bt);
        const float rstd = rsqrtf(t[0] / (float)d + eps);
        const float c1 = Layer ? t[1] / (float)d : 0.0f, c2 = t[2] * rstd / (float)d;
        T *gir = gi + row * d;
        const T *grr = Fused ? gr + row * d : nullptr;
#pragma unroll
        for (int c = 0; c < C; c++) {
            const int u = tl + c * bt;
            if (active && u < nu) {
                const V wv = wr[u];
                float o[U];
                if constexpr (Fused)
                    load_units<T, U>(o, grr, u); // grad_residual may be grad_input: read before the store
#pragma unroll
                for (int k = 0; k < U; k++) {
                    const float gk = to_f32(gs[c].v[k]);
                    const float xh = (to_f32(xs[c].v[k]) - mean) * rstd, g = gk * to_f32(wv.v[k]);
                    const float dx = rstd * (g - c1 - xh * c2);
                    if constexpr (Fused)
                        o[k] += dx;
                    else
                        o[k] = dx;
                    aw[c][k] = fmaf(gk, xh, aw[c][k]);
                    ab[c][k] += gk;
                }
                store_units<T, U>(gir, u, o);
            }
        }
    }

    if (W == 1) {
#pragma unroll
        for (int c = 0; c < C; c++) {
            const int u = tl + c * bt;
            if (u < nu) {
                put_f32<U, false>(pw + u * U, aw[c]);
                if (pb)
                    put_f32<U, false>(pb + u * U, ab[c]);
            }
        }
        return;
    }
    // Several teams (then bt <= 128 and d <= BWD_PER_THREAD * 128): add their partials in team order.
    for (int tm = 0; tm < W; tm++) {
        if (team == tm) {
#pragma unroll
            for (int c = 0; c < C; c++) {
                const int u = tl + c * bt;
                if (u < nu)
#pragma unroll
                    for (int k = 0; k < U; k++) {
                        const int j = u * U + k;
                        red[0][j] = tm ? red[0][j] + aw[c][k] : aw[c][k];
                        red[1][j] = tm ? red[1][j] + ab[c][k] : ab[c][k];
                    }
            }
        }
        __syncthreads();
    }
    for (int j = threadIdx.x; j < nu * U; j += blockDim.x) {
        pw[j] = red[0][j];
        if (pb)
            pb[j] = red[1][j];
    }
}

// Streaming path, one team (the block): the row is re-read per pass (from L1/L2) and the partials live in
// the workspace (each unit owned by one thread, so plain read-modify-writes).
template <typename T, int U, bool Layer, bool Fused>
__device__ __forceinline__ void bwd_rows_any(T *gi, const T *go, const T *gr, const T *x, const T *w, float eps,
                                             tk_i64 d, tk_i64 rows, float *pw, float *pb)
{
    const tk_i64 nu = d / U;
    const int B = blockDim.x;
    for (tk_i64 row = blockIdx.x; row < rows; row += gridDim.x) {
        const T *xr = x + row * d, *gor = go + row * d;
        float mean = 0.0f;
        if (Layer) {
            float t[1] = {0.0f};
            for (tk_i64 u = threadIdx.x; u < nu; u += B) {
                float xv[U];
                load_units<T, U>(xv, xr, u);
#pragma unroll
                for (int k = 0; k < U; k++)
                    t[0] += xv[k];
            }
            team_sum(t, B);
            mean = t[0] / (float)d;
        }
        float t[3] = {0.0f, 0.0f, 0.0f};
        for (tk_i64 u = threadIdx.x; u < nu; u += B) {
            float xv[U], gv[U], wv[U];
            load_units<T, U>(xv, xr, u);
            load_units<T, U>(gv, gor, u);
            load_units<T, U>(wv, w, u);
#pragma unroll
            for (int k = 0; k < U; k++) {
                const float xm = xv[k] - mean, g = gv[k] * wv[k];
                t[0] = fmaf(xm, xm, t[0]);
                t[1] += g;
                t[2] = fmaf(g, xm, t[2]);
            }
        }
        team_sum(t, B);
        const float rstd = rsqrtf(t[0] / (float)d + eps);
        const float c1 = Layer ? t[1] / (float)d : 0.0f, c2 = t[2] * rstd / (float)d;
        T *gir = gi + row * d;
        const T *grr = Fused ? gr + row * d : nullptr;
        for (tk_i64 u = threadIdx.x; u < nu; u += B) {
            float xv[U], gv[U], wv[U], o[U], a[U];
            load_units<T, U>(xv, xr, u);
            load_units<T, U>(gv, gor, u);
            load_units<T, U>(wv, w, u);
            if constexpr (Fused)
                load_units<T, U>(o, grr, u);
#pragma unroll
            for (int k = 0; k < U; k++) {
                const float xh = (xv[k] - mean) * rstd, g = gv[k] * wv[k];
                const float dx = rstd * (g - c1 - xh * c2);
                if constexpr (Fused)
                    o[k] += dx;
                else
                    o[k] = dx;
                a[k] = gv[k] * xh;
            }
            store_units<T, U>(gir, u, o);
            put_f32<U, true>(pw + u * U, a);
            if (pb)
                put_f32<U, true>(pb + u * U, gv);
        }
    }
}

// The whole backward kernel: the block's rows, then the cross-block sums. gb and gr may be null (no
// grad_bias; not fused).
template <typename T, bool Layer, bool Fused>
__device__ __forceinline__ void norm_bwd(T *gi, T *gw, T *gb, const T *go, const T *gr, const T *x, const T *w,
                                         float eps, tk_i64 d, tk_i64 rows, float *ws)
{
    constexpr int N = Vec<T>::N, C = BWD_PER_THREAD / N;
    const int B = blockDim.x;
    const tk_i64 G = gridDim.x;
    float *pw = ws + (tk_i64)blockIdx.x * d;
    float *pb = Layer && gb ? ws + (G + blockIdx.x) * d : nullptr;
    const bool vec = d % N == 0 && aligned16(gi) && aligned16(go) && aligned16(x) && aligned16(w) &&
                     (!Fused || aligned16(gr)) && aligned16(ws);
    // per thread on the register path: 8 elements in 16-byte units, 4 scalars (registers: <= 64)
    const int pt = vec ? BWD_PER_THREAD : BWD_PER_THREAD / 2;
    if (d <= (tk_i64)pt * B) {
        // the team: the smallest of 32, 64, 128 threads that holds the row and divides B, else B
        const tk_i64 need = (d + pt - 1) / pt;
        int bt = B;
        for (int t = 32; t <= 128 && t < B; t *= 2)
            if (need <= t && B % t == 0) {
                bt = t;
                break;
            }
        __shared__ float red[2][BWD_PER_THREAD * 128]; // the teams' partials (several teams only)
        if (vec)
            bwd_rows_reg<T, N, C, Layer, Fused>(gi, go, gr, x, w, eps, d, rows, bt, pw, pb, red);
        else
            bwd_rows_reg<T, 1, BWD_PER_THREAD / 2, Layer, Fused>(gi, go, gr, x, w, eps, d, rows, bt, pw, pb, red);
    } else if (vec) {
        bwd_rows_any<T, N, Layer, Fused>(gi, go, gr, x, w, eps, d, rows, pw, pb);
    } else {
        bwd_rows_any<T, 1, Layer, Fused>(gi, go, gr, x, w, eps, d, rows, pw, pb);
    }
    combine_partials<T>(gw, Layer ? gb : nullptr, ws, Layer ? 2 : 1, d);
}

} // namespace tk_norm
