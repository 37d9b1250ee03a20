// diffusion.cu — the noise-schedule ops of denoising diffusion (kernels-community/diffusion): forward
// noising, the DDPM posterior, the DDPM and DDIM reverse steps, and Philox normal draws.
//
// Variants (templates over T = float, __half, __nv_bfloat16; one manifest entry per op, dtype and tier):
//   tk_q_sample<T>             out = sqrt(ab_t) x0 + sqrt(1 - ab_t) noise
//   tk_ddpm_posterior<T>       mean = c0 x0 + ct x_t; log_variance by variance_type
//   tk_ddpm_step<T>            DDPMScheduler.step, elementwise (clipping or none)
//   tk_ddpm_step_threshold<T>  the same with dynamic thresholding: one block per batch row
//   tk_ddim_step<T>, tk_ddim_step_threshold<T>   DDIMScheduler.step, the same two tiers
//   tk_randn<T>                standard normal draws (Philox-4x32-10, Box-Muller)
//
// The definition is tk's ops/diffusion.c, and the code below is the same computation in the same
// order: each element loaded as fp32 and computed in float64 (diffusers' formulas and order of
// operations), rounded once to fp32 and then to T. The package compiles with --fmad=false, so no
// multiply-add is contracted, and +, -, *, / and sqrt are correctly rounded here as on the CPU: the
// results are the CPU's bit for bit except where CUDA's double log / exp / sin / cos differ from
// glibc's by an ulp (learned_range, fixed_small_log, randn), which almost never reaches the fp32 result.
//
// ab is alphas_cumprod, an f64 table (nt,); timesteps and prev_timesteps are i64, one per batch row
// (dimension 0); prev < 0 means ab_prev = 1. A kernel cannot report errors: a timestep outside [0, nt)
// or a prev >= nt makes its batch row NaN (the CPU reference rejects it, and a table value outside
// [0, 1], with a message).
//
// Dynamic thresholding (the *_threshold entries): s = clamp(quantile(|x0|, ratio), 1, sample_max_value)
// per batch row, where x0 is rounded to fp32 and the quantile is torch.quantile's on the CPU: rank r =
// float(ratio) * (R - 1) in double, w = fp32(r - floor(r)), the order statistics at floor(r) and
// ceil(r), one fp32 fma. The order statistics are found by radix selection over the fp32 bit patterns
// of |x0| (order-preserving for values >= 0): four passes of an 8-bit digit, a 256-bin shared-memory
// histogram each, then one pass for the next larger value; a row holding a NaN gives s = NaN.
//
// Launch assumptions: contiguous row-major tensors. The elementwise kernels: a grid-stride loop over
// all n elements, any grid and block size. The threshold kernels: grid = batch rows, blockDim a
// multiple of 32 <= 512 (__launch_bounds__(512): their float64 math needs up to 64 registers, the
// most a 1024-thread block could have), rows of at most 2^24 elements (as torch.quantile). Outputs may be inputs of
// their own shape (prev_sample = sample: each element is read before the same thread writes it);
// prev_sample and pred_original_sample must not overlap.
//
// NVRTC-compatible: no host code, no standard headers; the device toolkit <tk/device.cuh>.
#include <tk/device.cuh>

namespace tk_dif {

using namespace tk; // to_f32, from_f32, grid_index, grid_stride, philox4x32_10

enum { PRED_EPSILON = 0, PRED_SAMPLE = 1, PRED_V = 2 };
enum { VAR_FIXED_SMALL = 0, VAR_FIXED_SMALL_LOG, VAR_FIXED_LARGE, VAR_FIXED_LARGE_LOG, VAR_LEARNED, VAR_LEARNED_RANGE };

__device__ __forceinline__ double nan_d() { return __longlong_as_double(0x7ff8000000000000ll); }
__device__ __forceinline__ float nan_f() { return __int_as_float(0x7fc00000); }

// A batch row: ab at t and at prev (1 when prev < 0); ok = 0 when a timestep is out of range.
struct Row {
    double at, ap;
    tk_i64 t;
    bool ok;
};

__device__ __forceinline__ Row row_of(const tk_i64 *ts,   // (B,) i64
                                      const tk_i64 *prev, // (B,) i64 or nullptr
                                      const double *ab,   // (nt,) f64
                                      tk_i64 nt, tk_i64 b)
{
    Row r;
    const tk_i64 t = ts[b], p = prev ? prev[b] : -1;
    r.ok = t >= 0 && t < nt && p < nt;
    r.t = t;
    r.at = r.ok ? ab[t] : 0.0;
    r.ap = r.ok && p >= 0 ? ab[p] : 1.0;
    return r;
}

struct Opts {
    int pred, var, clip, thr, use_clipped;
    double clip_range, eta;
};

__device__ __forceinline__ double x0_of(int pred, double m, double x, double at)
{
    const double bt = 1 - at;
    if (pred == PRED_EPSILON)
        return (x - sqrt(bt) * m) / sqrt(at);
    if (pred == PRED_SAMPLE)
        return m;
    return sqrt(at) * x - sqrt(bt) * m;
}

__device__ __forceinline__ double clip_x0(const Opts &o, double x0, float s)
{
    if (o.thr) {
        if (s != s)
            return nan_d();
        const double sd = (double)s;
        const double v = x0 < -sd ? -sd : x0 > sd ? sd : x0;
        return v / sd;
    }
    if (o.clip) {
        const double r = o.clip_range;
        return x0 < -r ? -r : x0 > r ? r : x0;
    }
    return x0;
}

__device__ __forceinline__ double ddpm_var_clamped(const Row &r)
{
    const double bt = 1 - r.at, bp = 1 - r.ap, cb = 1 - r.at / r.ap;
    const double v = bp / bt * cb;
    return v < 1e-20 ? 1e-20 : v;
}

__device__ __forceinline__ double ddpm_log_variance(int var, const Row &r, double pv)
{
    const double cb = 1 - r.at / r.ap, v = ddpm_var_clamped(r);
    switch (var) {
    case VAR_FIXED_SMALL:
    case VAR_FIXED_SMALL_LOG: return log(v);
    case VAR_FIXED_LARGE:
    case VAR_FIXED_LARGE_LOG: return log(cb);
    case VAR_LEARNED: return log(pv);
    default: {
        const double frac = (pv + 1) / 2;
        return frac * log(cb) + (1 - frac) * log(v);
    }
    }
}

__device__ __forceinline__ double ddpm_std(int var, const Row &r, double pv)
{
    const double cb = 1 - r.at / r.ap;
    switch (var) {
    case VAR_FIXED_SMALL: return sqrt(ddpm_var_clamped(r));
    case VAR_FIXED_SMALL_LOG: return exp(0.5 * log(ddpm_var_clamped(r)));
    case VAR_FIXED_LARGE: return sqrt(cb);
    case VAR_LEARNED: return sqrt(pv);
    default: return exp(0.5 * ddpm_log_variance(VAR_LEARNED_RANGE, r, pv));
    }
}

__device__ __forceinline__ double ddpm_mean(const Row &r, double x0, double x)
{
    const double bt = 1 - r.at, bp = 1 - r.ap, ca = r.at / r.ap, cb = 1 - ca;
    const double c0 = sqrt(r.ap) * cb / bt, ct = sqrt(ca) * bp / bt;
    return c0 * x0 + ct * x;
}

__device__ __forceinline__ double ddpm_elem(const Opts &o, const Row &r, double m, double x, double pv, bool has_z,
                                            double z, float s, double *x0)
{
    *x0 = clip_x0(o, x0_of(o.pred, m, x, r.at), s);
    double prev = ddpm_mean(r, *x0, x);
    if (has_z && r.t > 0)
        prev = prev + ddpm_std(o.var, r, pv) * z;
    return prev;
}

__device__ __forceinline__ double ddim_elem(const Opts &o, const Row &r, double m, double x, bool has_z, double z,
                                            float s, double *x0_out)
{
    const double at = r.at, ap = r.ap, bt = 1 - at;
    double x0, eps;
    if (o.pred == PRED_EPSILON) {
        x0 = (x - sqrt(bt) * m) / sqrt(at);
        eps = m;
    } else if (o.pred == PRED_SAMPLE) {
        x0 = m;
        eps = (x - sqrt(at) * x0) / sqrt(bt);
    } else {
        x0 = sqrt(at) * x - sqrt(bt) * m;
        eps = sqrt(at) * m + sqrt(bt) * x;
    }
    x0 = clip_x0(o, x0, s);
    const double bp = 1 - ap, variance = (bp / bt) * (1 - at / ap), std = o.eta * sqrt(variance);
    if (o.use_clipped)
        eps = (x - sqrt(at) * x0) / sqrt(bt);
    const double dir = sqrt(1 - ap - std * std) * eps;
    double prev = sqrt(ap) * x0 + dir;
    if (o.eta > 0 && has_z)
        prev = prev + std * z;
    *x0_out = x0;
    return prev;
}

// Element e of batch row b: the step's x_{t-1} (and *x0). i = b * row + e; the model output's
// element is b * mrow + e, the predicted variance (mrow = 2 * row) a row after it.
template <typename T, bool DDIM>
__device__ __forceinline__ double step_at(const Opts &o, const Row &r, const T *mo, const T *x, const T *noise,
                                          tk_i64 i, tk_i64 b, tk_i64 e, tk_i64 row, tk_i64 mrow, float s, double *x0)
{
    if (!r.ok) {
        *x0 = nan_d();
        return nan_d();
    }
    const tk_i64 mi = b * mrow + e;
    const double m = to_f32(mo[mi]), xv = to_f32(x[i]);
    const bool has_z = noise != nullptr;
    const double z = has_z ? (double)to_f32(noise[i]) : 0.0;
    if (DDIM)
        return ddim_elem(o, r, m, xv, has_z, z, s, x0);
    const double pv = mrow != row ? (double)to_f32(mo[mi + row]) : 0.0;
    return ddpm_elem(o, r, m, xv, pv, has_z, z, s, x0);
}

template <typename T, bool DDIM>
__device__ __forceinline__ void step_elementwise(T *prev_sample, T *x0_out, const T *mo, const T *x,
                                                 const tk_i64 *ts, const tk_i64 *prev_ts, const double *ab,
                                                 const T *noise, const Opts &o, tk_i64 n, tk_i64 row, tk_i64 mrow,
                                                 tk_i64 nt)
{
    for (tk_i64 i = grid_index(); i < n; i += grid_stride()) {
        const tk_i64 b = i / row, e = i - b * row;
        const Row r = row_of(ts, prev_ts, ab, nt, b);
        double x0;
        const double v = step_at<T, DDIM>(o, r, mo, x, noise, i, b, e, row, mrow, 1.0f, &x0);
        prev_sample[i] = from_f32<T>((float)v);
        if (x0_out)
            x0_out[i] = from_f32<T>((float)x0);
    }
}

// |x0| of element e of row b rounded to fp32, as its bit pattern (order-preserving: >= 0); *nan set.
template <typename T>
__device__ __forceinline__ unsigned abs_key(const Opts &o, const Row &r, const T *mo, const T *x, tk_i64 b,
                                            tk_i64 e, tk_i64 row, tk_i64 mrow, bool *nan)
{
    const float v = fabsf((float)x0_of(o.pred, to_f32(mo[b * mrow + e]), to_f32(x[b * row + e]), r.at));
    *nan = v != v;
    return __float_as_uint(v);
}

// The threshold s of batch row b (the same value in every thread); NaN when the row holds a NaN.
template <typename T>
__device__ float row_threshold(const Opts &o, const Row &r, const T *mo, const T *x, tk_i64 b, tk_i64 row,
                               tk_i64 mrow, double ratio, double max_value)
{
    __shared__ unsigned hist[256];
    __shared__ unsigned sh_prefix, sh_krem, sh_nan, sh_le, sh_min_gt;
    const int tid = threadIdx.x;
    if (tid == 0) {
        sh_nan = 0;
        sh_le = 0;
        sh_min_gt = 0xffffffffu;
    }
    __syncthreads();
    unsigned nan_count = 0;
    for (tk_i64 e = tid; e < row; e += blockDim.x) {
        bool nan;
        abs_key<T>(o, r, mo, x, b, e, row, mrow, &nan);
        nan_count += nan;
    }
    if (nan_count)
        atomicAdd(&sh_nan, nan_count);
    __syncthreads();
    if (sh_nan)
        return nan_f();

    const double rank = (double)(float)ratio * (double)(row - 1);
    const tk_i64 lo = (tk_i64)rank;
    tk_i64 hi = (tk_i64)ceil(rank);
    if (hi > row - 1)
        hi = row - 1;
    unsigned prefix = 0, mask = 0, krem = (unsigned)lo;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int k = tid; k < 256; k += blockDim.x)
            hist[k] = 0;
        __syncthreads();
        for (tk_i64 e = tid; e < row; e += blockDim.x) {
            bool nan;
            const unsigned key = abs_key<T>(o, r, mo, x, b, e, row, mrow, &nan);
            if ((key & mask) == prefix)
                atomicAdd(&hist[(key >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (tid == 0) {
            unsigned acc = 0, d = 0;
            for (; d < 255; d++) {
                if (acc + hist[d] > krem)
                    break;
                acc += hist[d];
            }
            sh_prefix = prefix | (d << shift);
            sh_krem = krem - acc;
        }
        __syncthreads();
        prefix = sh_prefix;
        krem = sh_krem;
        mask |= 255u << shift;
        __syncthreads();
    }
    // prefix is the key at sorted index lo; the one at hi is it again, or the smallest larger key
    unsigned le = 0, min_gt = 0xffffffffu;
    for (tk_i64 e = tid; e < row; e += blockDim.x) {
        bool nan;
        const unsigned key = abs_key<T>(o, r, mo, x, b, e, row, mrow, &nan);
        if (key <= prefix)
            le++;
        else if (key < min_gt)
            min_gt = key;
    }
    atomicAdd(&sh_le, le);
    atomicMin(&sh_min_gt, min_gt);
    __syncthreads();
    const unsigned khi = hi < (tk_i64)sh_le ? prefix : sh_min_gt;
    const float a = __uint_as_float(prefix), bb = __uint_as_float(khi), d = __fsub_rn(bb, a);
    const float w = (float)(rank - (double)lo);
    const float q = fabsf(w) < 0.5f ? __fmaf_rn(w, d, a) : __fmaf_rn(-d, __fsub_rn(1.0f, w), bb);
    return fminf(fmaxf(q, 1.0f), (float)max_value);
}

template <typename T, bool DDIM>
__device__ __forceinline__ void step_threshold(T *prev_sample, T *x0_out, const T *mo, const T *x,
                                               const tk_i64 *ts, const tk_i64 *prev_ts, const double *ab,
                                               const T *noise, const Opts &o, double ratio, double max_value,
                                               tk_i64 row, tk_i64 mrow, tk_i64 nt)
{
    const tk_i64 b = blockIdx.x;
    if (row == 0)
        return;
    const Row r = row_of(ts, prev_ts, ab, nt, b);
    const float s = r.ok ? row_threshold<T>(o, r, mo, x, b, row, mrow, ratio, max_value) : nan_f();
    for (tk_i64 e = threadIdx.x; e < row; e += blockDim.x) {
        const tk_i64 i = b * row + e;
        double x0;
        const double v = step_at<T, DDIM>(o, r, mo, x, noise, i, b, e, row, mrow, s, &x0);
        prev_sample[i] = from_f32<T>((float)v);
        if (x0_out)
            x0_out[i] = from_f32<T>((float)x0);
    }
}

} // namespace tk_dif

// out[i] = sqrt(ab[t_b]) x0[i] + sqrt(1 - ab[t_b]) noise[i], b = i / row
template <typename T>
__global__ void tk_q_sample(T *out,                   // (B, ...) T
                            const T *x0,              // (B, ...) T
                            const T *noise,           // (B, ...) T
                            const tk_i64 *timesteps,  // (B,) i64
                            const double *ab,         // (nt,) f64
                            tk_i64 n, tk_i64 row, tk_i64 nt)
{
    using namespace tk_dif;
    for (tk_i64 i = grid_index(); i < n; i += grid_stride()) {
        const Row r = row_of(timesteps, nullptr, ab, nt, i / row);
        const double v = r.ok ? sqrt(r.at) * (double)to_f32(x0[i]) + sqrt(1 - r.at) * (double)to_f32(noise[i]) : nan_d();
        out[i] = from_f32<T>((float)v);
    }
}

// mean = c0 x0 + ct x_t; log_variance (nullptr: not asked for) by variance_type
template <typename T>
__global__ void tk_ddpm_posterior(T *mean,                   // (B, ...) T
                                  T *log_variance,           // (B, ...) T or nullptr
                                  const T *x0,               // (B, ...) T
                                  const T *sample,           // (B, ...) T
                                  const tk_i64 *timesteps,   // (B,) i64
                                  const tk_i64 *prev_ts,     // (B,) i64
                                  const double *ab,          // (nt,) f64
                                  const T *pv,               // (B, ...) T or nullptr
                                  tk_i64 variance_type, tk_i64 n, tk_i64 row, tk_i64 nt)
{
    using namespace tk_dif;
    for (tk_i64 i = grid_index(); i < n; i += grid_stride()) {
        const Row r = row_of(timesteps, prev_ts, ab, nt, i / row);
        double m = nan_d(), lv = nan_d();
        if (r.ok) {
            m = ddpm_mean(r, (double)to_f32(x0[i]), (double)to_f32(sample[i]));
            if (log_variance)
                lv = ddpm_log_variance((int)variance_type, r, pv ? (double)to_f32(pv[i]) : 0.0);
        }
        mean[i] = from_f32<T>((float)m);
        if (log_variance)
            log_variance[i] = from_f32<T>((float)lv);
    }
}

#define TK_DIF_STEP_PARAMS                                                                                   \
    T *prev_sample,          /* (B, C, ...) T */                                                             \
        T *pred_x0,          /* (B, C, ...) T or nullptr */                                                  \
        const T *mo,         /* (B, M, ...) T, M = C or 2C (learned variance) */                             \
        const T *sample,     /* (B, C, ...) T */                                                             \
        const tk_i64 *ts,    /* (B,) i64 */                                                                  \
        const tk_i64 *prev,  /* (B,) i64 */                                                                  \
        const double *ab,    /* (nt,) f64 */                                                                 \
        const T *noise       /* (B, C, ...) T or nullptr */

template <typename T>
__global__ void tk_ddpm_step(TK_DIF_STEP_PARAMS, tk_i64 prediction_type, tk_i64 variance_type, tk_i64 clip_sample,
                             double clip_sample_range, tk_i64 thresholding, double ratio, double max_value, tk_i64 n,
                             tk_i64 row, tk_i64 mrow, tk_i64 nt)
{
    const tk_dif::Opts o = {(int)prediction_type, (int)variance_type, (int)clip_sample, 0, 0, clip_sample_range, 0.0};
    tk_dif::step_elementwise<T, false>(prev_sample, pred_x0, mo, sample, ts, prev, ab, noise, o, n, row, mrow, nt);
}

template <typename T>
__global__ void __launch_bounds__(512) tk_ddpm_step_threshold(TK_DIF_STEP_PARAMS, tk_i64 prediction_type, tk_i64 variance_type,
                                       tk_i64 clip_sample, double clip_sample_range, tk_i64 thresholding, double ratio,
                                       double max_value, tk_i64 n, tk_i64 row, tk_i64 mrow, tk_i64 nt)
{
    const tk_dif::Opts o = {(int)prediction_type, (int)variance_type, (int)clip_sample, 1, 0, clip_sample_range, 0.0};
    tk_dif::step_threshold<T, false>(prev_sample, pred_x0, mo, sample, ts, prev, ab, noise, o, ratio, max_value, row,
                                     mrow, nt);
}

template <typename T>
__global__ void tk_ddim_step(TK_DIF_STEP_PARAMS, double eta, tk_i64 prediction_type, tk_i64 clip_sample,
                             double clip_sample_range, tk_i64 thresholding, double ratio, double max_value,
                             tk_i64 use_clipped_model_output, tk_i64 n, tk_i64 row, tk_i64 mrow, tk_i64 nt)
{
    const tk_dif::Opts o = {(int)prediction_type, 0, (int)clip_sample, 0, (int)use_clipped_model_output,
                            clip_sample_range, eta};
    tk_dif::step_elementwise<T, true>(prev_sample, pred_x0, mo, sample, ts, prev, ab, noise, o, n, row, mrow, nt);
}

template <typename T>
__global__ void __launch_bounds__(512) tk_ddim_step_threshold(TK_DIF_STEP_PARAMS, double eta, tk_i64 prediction_type, tk_i64 clip_sample,
                                       double clip_sample_range, tk_i64 thresholding, double ratio, double max_value,
                                       tk_i64 use_clipped_model_output, tk_i64 n, tk_i64 row, tk_i64 mrow, tk_i64 nt)
{
    const tk_dif::Opts o = {(int)prediction_type, 0, (int)clip_sample, 1, (int)use_clipped_model_output,
                            clip_sample_range, eta};
    tk_dif::step_threshold<T, true>(prev_sample, pred_x0, mo, sample, ts, prev, ab, noise, o, ratio, max_value, row,
                                    mrow, nt);
}

// out[2p], out[2p + 1] = Box-Muller of one Philox-4x32-10 block: key seed, counter (p, offset)
template <typename T>
__global__ void tk_randn(T *out, // (...) T
                        tk_i64 seed, tk_i64 offset, tk_i64 n)
{
    using namespace tk_dif;
    const tk_u64 s = (tk_u64)seed, off = (tk_u64)offset;
    for (tk_i64 p = grid_index(); 2 * p < n; p += grid_stride()) {
        const tk_u64 pp = (tk_u64)p;
        const uint4 o = philox4x32_10(make_uint4((tk_u32)pp, (tk_u32)(pp >> 32), (tk_u32)off, (tk_u32)(off >> 32)),
                                      make_uint2((tk_u32)s, (tk_u32)(s >> 32)));
        const double u1 = (double)(((((tk_u64)o.y << 32) | o.x) >> 11) + 1) * 0x1.0p-53;
        const double u2 = (double)((((tk_u64)o.w << 32) | o.z) >> 11) * 0x1.0p-53;
        const double rr = sqrt(-2 * log(u1)), a = 2 * 3.14159265358979323846 * u2;
        out[2 * p] = from_f32<T>((float)(rr * cos(a)));
        if (2 * p + 1 < n)
            out[2 * p + 1] = from_f32<T>((float)(rr * sin(a)));
    }
}
