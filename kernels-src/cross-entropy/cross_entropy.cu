// cross_entropy.cu — the cross_entropy op of kernels-community/cross-entropy: the loss of each row AND
// its gradient w.r.t. the logits in one launch, Liger-Kernel style (the gradient may overwrite the
// logits in place), with ignore_index, label smoothing and none / mean / sum reductions.
//
// Variants: tk_cross_entropy<T>, T = float, __half, __nv_bfloat16 (one manifest entry per dtype).
//
// Per row (x = logits[row, :], V classes, eps = label_smoothing, t = target[row]):
//     loss = log d + (1 - eps)(m - x_t) + eps s / V     with m = max x, d = sum exp(x - m), s = sum (m - x)
//     lse  = m + log d
//     grad = scale * (exp(x - m) / d - eps / V - (1 - eps) [j == t])
// scale = 1 / (rows whose target is not ignore_index) for mean (0 when there are none), else 1.
//
// Launch assumptions (kernel.json): grid.x = min(N, 1024), blocks stride over rows (row = blockIdx.x +
// k * gridDim.x); blockDim.x a multiple of 32, <= 512. Tensors contiguous. 'grad' may be null (no
// gradient), equal to 'logits' (in place: each element is read, then written by the same thread) or
// apart; 'lse' may be null. The workspace holds the loss partials (ce_common.cuh).
//
// Each row is read twice: pass 1 keeps a per-thread online (m, d, s) with no separate max pass, the
// block merges the states; pass 2 re-reads the row (from L2 when it is still there) and writes the
// gradient. An ignored row is not read at all unless 'lse' is asked for. 16-byte loads and stores
// when V is a multiple of 16 / sizeof(T) and the pointers are 16-byte aligned; scalar code otherwise.
//
// Numerics: fp32 throughout, expf/logf; the loss partials of the blocks are doubles added in block
// order by the last block, so the result does not depend on timing. A target outside [0, V) that is
// not ignore_index gives a NaN loss and a NaN gradient row (the CPU reference reports an error).
//
// NVRTC-compatible: no host code, no standard headers.
#include "ce_common.cuh"

namespace tk_ce {

template <typename T>
__device__ __forceinline__ void zero_row(T *g, tk_i64 v, bool vec)
{
    constexpr int N = Vec<T>::N;
    if (vec) {
        Pack<T> z;
#pragma unroll
        for (int k = 0; k < N; k++)
            z.v[k] = from_f32<T>(0.0f);
        for (tk_i64 i = threadIdx.x; i < v / N; i += blockDim.x)
            reinterpret_cast<Pack<T> *>(g)[i] = z;
    } else {
        for (tk_i64 i = threadIdx.x; i < v; i += blockDim.x)
            g[i] = from_f32<T>(0.0f);
    }
}

} // namespace tk_ce

template <typename T>
__global__ void __launch_bounds__(512) tk_cross_entropy(const T *logits,               // (N, V) T
                                                         const tk_i64 *__restrict__ target, // (N,) i64
                                                         float *__restrict__ loss,      // (N,) or () f32
                                                         T *grad,                       // (N, V) T, null, or logits
                                                         float *__restrict__ lse,       // (N,) f32 or null
                                                         tk_i64 ignore_index, float label_smoothing,
                                                         tk_i64 reduction, tk_i64 n, tk_i64 v, void *ws)
{
    using namespace tk_ce;
    constexpr int N = Vec<T>::N;
    const bool vec = v % N == 0 && aligned16(logits) && (!grad || aligned16(grad));
    const float eps = label_smoothing, smooth = label_smoothing / (float)v, one_m = 1.0f - label_smoothing;

    float gscale = 1.0f;
    if (reduction == RED_MEAN && grad) {
        const double valid = count_valid(target, n, ignore_index);
        gscale = valid > 0.0 ? (float)(1.0 / valid) : 0.0f;
    }

    double part_sum = 0.0, part_cnt = 0.0; // thread 0's
    for (tk_i64 row = blockIdx.x; row < n; row += gridDim.x) {
        const tk_i64 t = target[row];
        const bool ignored = t == ignore_index, bad = !ignored && (t < 0 || t >= v);
        const T *x = logits + row * v;
        T *g = grad ? grad + row * v : nullptr;
        if (ignored && !lse) {
            if (g)
                zero_row(g, v, vec);
            if (threadIdx.x == 0 && reduction == RED_NONE)
                loss[row] = 0.0f;
            continue;
        }
        // The target's logit, read before pass 2 may overwrite it (block_lse below is a barrier).
        const float xt = ignored || bad ? 0.0f : to_f32(x[t]);

        // pass 1: online (m, d, s) per thread, then merged over the block
        Lse st = lse_init();
        if (vec) {
            const Pack<T> *xv = reinterpret_cast<const Pack<T> *>(x);
            for (tk_i64 i = threadIdx.x; i < v / N; i += blockDim.x) {
                const Pack<T> p = xv[i];
                float f[N];
                bool ok[N];
#pragma unroll
                for (int k = 0; k < N; k++) {
                    f[k] = to_f32(p.v[k]);
                    ok[k] = true;
                }
                lse_fold(st, f, ok);
            }
        } else {
            for (tk_i64 i = threadIdx.x; i < v; i += blockDim.x) {
                const float f[1] = {to_f32(x[i])};
                const bool ok[1] = {true};
                lse_fold(st, f, ok);
            }
        }
        st = block_lse(st);

        const float logd = logf(st.d);
        if (threadIdx.x == 0) {
            float l = 0.0f;
            if (bad || (!ignored && st.m == TK_CE_NEG_INF)) {
                l = __int_as_float(0x7fffffff); // NaN
            } else if (!ignored) {
                l = logd;
                if (eps < 1.0f) // (a term of weight 0 is absent: no 0 * inf)
                    l += one_m * (st.m - xt);
                if (eps > 0.0f)
                    l += eps * st.s / (float)v;
            }
            if (lse)
                lse[row] = st.m + logd;
            if (reduction == RED_NONE)
                loss[row] = l;
            part_sum += (double)l;
            part_cnt += ignored ? 0.0 : 1.0;
        }
        if (!g)
            continue;

        // pass 2: the gradient, each thread over the elements it read in pass 1
        if (ignored) {
            zero_row(g, v, vec);
            continue;
        }
        const float inv_d = bad ? __int_as_float(0x7fffffff) : 1.0f / st.d, m = st.m;
        if (vec) {
            const Pack<T> *xv = reinterpret_cast<const Pack<T> *>(x);
            Pack<T> *gv = reinterpret_cast<Pack<T> *>(g);
            for (tk_i64 i = threadIdx.x; i < v / N; i += blockDim.x) {
                const Pack<T> p = xv[i];
                Pack<T> r;
#pragma unroll
                for (int k = 0; k < N; k++) {
                    float y = expf(to_f32(p.v[k]) - m) * inv_d - smooth;
                    if (i * N + k == t)
                        y -= one_m;
                    r.v[k] = from_f32<T>(gscale * y);
                }
                gv[i] = r;
            }
        } else {
            for (tk_i64 i = threadIdx.x; i < v; i += blockDim.x) {
                float y = expf(to_f32(x[i]) - m) * inv_d - smooth;
                if (i == t)
                    y -= one_m;
                g[i] = from_f32<T>(gscale * y);
            }
        }
    }
    finish_loss(ws, part_sum, part_cnt, loss, reduction);
}
