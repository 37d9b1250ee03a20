// rotary.cu — position-encoding kernels of kernels-community/rotary: RoPE applied in place with a
// cos/sin cache (vLLM's rotary_embedding), the cache builder with HF transformers' scalings, ALiBi
// slopes and bias, and the sinusoidal table of "Attention is all you need".
//
// Variants (entry points at the end; T = float, __half, __nv_bfloat16):
//   tk_rotary_embedding<T, C>       query [N, Hq, D] and key [N, Hkv, D] rotated in place; C (the cache
//                                   dtype) is float or T. One block per token.
//   tk_rotary_embedding_backward<T, C>  the gradients of the rotated query and key rotated back in place
//                                   (by -angle): rotary_embedding_backward. Same launch.
//   tk_rope_cos_sin_cache<T>        out [max_pos, rot_dim]: cos(p*inv_freq) then sin(p*inv_freq), times
//                                   the attention factor. 32 positions per block.
//   tk_alibi_slopes                 out [H] f32.
//   tk_alibi_bias<T>                out [H, Sq, Sk] = -slope[h] * |i + Sk - Sq - j|. One block per (h, i).
//   tk_sinusoidal_position_encoding<T>  out [S, D]. One block per row.
//
// Launch assumptions: contiguous row-major tensors; any block size (multiples of 32 are best).
// tk_rotary_embedding needs rot_dim * 4 bytes of dynamic shared memory and rot_dim even, <= D;
// tk_rope_cos_sin_cache needs rot_dim / 2 * 8 bytes. 16-byte vector loads and stores are used when
// the row lengths are multiples of the vector width (4 for f32, 8 for f16/bf16) and the base pointers
// are 16-byte aligned; scalar code runs otherwise.
//
// Numerics: RoPE loads x and cos/sin as fp32, computes x1*cos - x2*sin and x2*cos + x1*sin with
// explicitly rounded multiplies and adds (__fmul_rn/__fsub_rn/__fadd_rn: no FMA contraction, so the
// result is bit-identical to tk's CPU reference) and rounds once to T. A token whose position is
// outside [0, max_pos) is left unchanged (the CPU reference refuses such a call). The tables are
// computed in double — inverse frequency, angle, sincos, attention factor — and rounded to fp32, then
// to T (round to nearest even). ALiBi bias is -(slope * |dist|) in fp32, rounded once to T.
//
// NVRTC-compatible: no host code, no standard headers; the device toolkit <tk/device.cuh>.
#include <tk/device.cuh>

namespace tk_rot {

using namespace tk; // to_f32, from_f32, Vec, Pack, aligned16 (<tk/device.cuh>)

#define TK_ROT_PI 3.14159265358979323846

// rope_cos_sin_cache's 'scaling' values (ops/rotary.c uses the same numbers).
enum { SCALE_NONE = 0, SCALE_LINEAR = 1, SCALE_DYNAMIC = 2, SCALE_YARN = 3, SCALE_LLAMA3 = 4, SCALE_LONGROPE = 5 };

// (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), each operation rounded (no contraction).
__device__ __forceinline__ void rot2(float &x1, float &x2, float c, float s)
{
    const float a = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
    const float b = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
    x1 = a;
    x2 = b;
}

// Rotates the first rot_dim = 2 * half columns of `heads` rows of D columns starting at x.
// cs: cos[half] then sin[half] of this token, in shared memory.
template <typename T>
__device__ __forceinline__ void rotate_heads(T *x, // (heads, D) T of one token
                                             bool vec, bool neox, int heads, int D, int half, const float *cs)
{
    constexpr int V = Vec<T>::N;
    const float *sn = cs + half;
    if (vec && neox) {
        // item = (head, V consecutive pairs): x[c..c+V) with x[half+c..half+c+V)
        const int per = half / V, items = heads * per;
        for (int it = threadIdx.x; it < items; it += blockDim.x) {
            const int h = it / per, c = (it - h * per) * V;
            Pack<T> *p1 = reinterpret_cast<Pack<T> *>(x + (tk_i64)h * D + c);
            Pack<T> *p2 = reinterpret_cast<Pack<T> *>(x + (tk_i64)h * D + half + c);
            Pack<T> a = *p1, b = *p2;
#pragma unroll
            for (int k = 0; k < V; k++) {
                float x1 = to_f32(a.v[k]), x2 = to_f32(b.v[k]);
                rot2(x1, x2, cs[c + k], sn[c + k]);
                a.v[k] = from_f32<T>(x1);
                b.v[k] = from_f32<T>(x2);
            }
            *p1 = a;
            *p2 = b;
        }
    } else if (vec) {
        // item = (head, V consecutive elements = V/2 adjacent pairs)
        const int per = 2 * half / V, items = heads * per;
        for (int it = threadIdx.x; it < items; it += blockDim.x) {
            const int h = it / per, e = (it - h * per) * V;
            Pack<T> *p = reinterpret_cast<Pack<T> *>(x + (tk_i64)h * D + e);
            Pack<T> a = *p;
#pragma unroll
            for (int k = 0; k < V / 2; k++) {
                const int f = e / 2 + k;
                float x1 = to_f32(a.v[2 * k]), x2 = to_f32(a.v[2 * k + 1]);
                rot2(x1, x2, cs[f], sn[f]);
                a.v[2 * k] = from_f32<T>(x1);
                a.v[2 * k + 1] = from_f32<T>(x2);
            }
            *p = a;
        }
    } else {
        const int items = heads * half;
        for (int it = threadIdx.x; it < items; it += blockDim.x) {
            const int h = it / half, i = it - h * half;
            T *r = x + (tk_i64)h * D;
            const int i1 = neox ? i : 2 * i, i2 = neox ? half + i : 2 * i + 1;
            float x1 = to_f32(r[i1]), x2 = to_f32(r[i2]);
            rot2(x1, x2, cs[i], sn[i]);
            r[i1] = from_f32<T>(x1);
            r[i2] = from_f32<T>(x2);
        }
    }
}

// The inverse frequency of pair i for rotary dimension dim, in double: HF transformers'
// modeling_rope_utils formulas (see ops/rotary.c, rope_inv_freq, which is the same code on the CPU).
__device__ __forceinline__ double inv_freq(int scaling, tk_i64 i, tk_i64 dim, double base, double factor,
                                           tk_i64 omax, tk_i64 seq_len, double beta_fast, double beta_slow,
                                           int truncate, double low_ff, double high_ff, const float *ext)
{
    const double e = (double)(2 * i) / (double)dim; // arange(0, dim, 2) / dim
    switch (scaling) {
    case SCALE_LINEAR: // _compute_linear_scaling_rope_parameters: inv_freq /= factor
        return 1.0 / pow(base, e) / factor;
    case SCALE_DYNAMIC: { // _compute_dynamic_ntk_parameters
        const double mp = (double)omax, sl = (double)(seq_len > omax ? seq_len : omax);
        const double b = base * pow(factor * sl / mp - (factor - 1.0), (double)dim / (double)(dim - 2));
        return 1.0 / pow(b, e);
    }
    case SCALE_YARN: { // _compute_yarn_parameters (find_correction_range, linear_ramp_factor)
        const double pos_freq = pow(base, e);
        const double extrap = 1.0 / pos_freq, interp = 1.0 / (factor * pos_freq);
        const double mp = (double)omax, lb = 2.0 * log(base);
        double low = (double)dim * log(mp / (beta_fast * 2.0 * TK_ROT_PI)) / lb;
        double high = (double)dim * log(mp / (beta_slow * 2.0 * TK_ROT_PI)) / lb;
        if (truncate) {
            low = floor(low);
            high = ceil(high);
        }
        if (low < 0)
            low = 0;
        if (high > (double)(dim - 1))
            high = (double)(dim - 1);
        if (low == high)
            high += 0.001;
        double ramp = ((double)i - low) / (high - low);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        const double ef = 1.0 - ramp;
        return interp * (1.0 - ef) + extrap * ef;
    }
    case SCALE_LLAMA3: { // _compute_llama3_parameters
        const double inv = 1.0 / pow(base, e), ctx = (double)omax;
        const double low_wl = ctx / low_ff, high_wl = ctx / high_ff;
        const double wl = 2.0 * TK_ROT_PI / inv;
        if (wl > low_wl)
            return inv / factor;
        if (wl < high_wl)
            return inv;
        const double smooth = (ctx / wl - low_ff) / (high_ff - low_ff);
        return (1.0 - smooth) * inv / factor + smooth * inv;
    }
    case SCALE_LONGROPE: // _compute_longrope_parameters: 1 / (ext_factors * base ** e)
        return 1.0 / ((double)ext[i] * pow(base, e));
    default: // _compute_default_rope_parameters
        return 1.0 / pow(base, e);
    }
}

// Press et al.'s slopes; see ops/rotary.c, alibi_slope.
__device__ __forceinline__ double alibi_slope(tk_i64 h, tk_i64 n, double max_bias)
{
    tk_i64 p = 1;
    while (p * 2 <= n)
        p *= 2;
    if (h < p)
        return exp2(-max_bias * (double)(h + 1) / (double)p);
    return exp2(-max_bias * (double)(2 * (h - p) + 1) / (double)(2 * p));
}

constexpr int CACHE_ROWS = 32; // positions per block of tk_rope_cos_sin_cache (the manifest's grid)

} // namespace tk_rot

// ---- entry points ------------------------------------------------------------------------------

// query and key are rotated in place; positions index the rows of cos_sin_cache.
template <typename T, typename C>
__global__ void __launch_bounds__(512) tk_rotary_embedding(T *query,                              // (N, Hq, D) T
                                                           T *key,                                // (N, Hkv, D) T
                                                           const tk_i64 *__restrict__ positions,  // (N,) i64
                                                           const C *__restrict__ cos_sin_cache,   // (max_pos, rot) C
                                                           int is_neox, tk_i64 num_heads, tk_i64 num_kv_heads,
                                                           tk_i64 head_size, tk_i64 rot_dim, tk_i64 max_pos)
{
    using namespace tk_rot;
    extern __shared__ float cs[]; // (rot_dim,) f32: cos then sin of this token
    const tk_i64 tok = blockIdx.x;
    const tk_i64 pos = positions[tok];
    if (pos < 0 || pos >= max_pos)
        return; // the whole block leaves: no barrier is skipped by part of it
    const C *row = cos_sin_cache + pos * rot_dim;
    for (int i = threadIdx.x; i < (int)rot_dim; i += blockDim.x)
        cs[i] = to_f32(row[i]);
    __syncthreads();

    constexpr int V = Vec<T>::N;
    const int D = (int)head_size, half = (int)(rot_dim / 2);
    const bool neox = is_neox != 0;
    const bool shape_ok = D % V == 0 && (neox ? half % V == 0 : (2 * half) % V == 0);
    T *q = query + tok * num_heads * head_size;
    T *k = key + tok * num_kv_heads * head_size;
    rotate_heads<T>(q, shape_ok && aligned16(query), neox, (int)num_heads, D, half, cs);
    rotate_heads<T>(k, shape_ok && aligned16(key), neox, (int)num_kv_heads, D, half, cs);
}

// rotary_embedding's backward: the gradients of the rotated query and key, rotated back in place by
// -angle (the rotation's transpose): the same code with sin negated in shared memory.
template <typename T, typename C>
__global__ void __launch_bounds__(512) tk_rotary_embedding_backward(T *grad_query,   // (N, Hq, D) T
                                                                    T *grad_key,     // (N, Hkv, D) T
                                                                    const tk_i64 *__restrict__ positions, // (N,)
                                                                    const C *__restrict__ cos_sin_cache, // (max_pos, rot)
                                                                    int is_neox, tk_i64 num_heads, tk_i64 num_kv_heads,
                                                                    tk_i64 head_size, tk_i64 rot_dim, tk_i64 max_pos)
{
    using namespace tk_rot;
    extern __shared__ float cs[]; // (rot_dim,) f32: cos then -sin of this token
    const tk_i64 tok = blockIdx.x;
    const tk_i64 pos = positions[tok];
    if (pos < 0 || pos >= max_pos)
        return;
    const C *row = cos_sin_cache + pos * rot_dim;
    const int half = (int)(rot_dim / 2);
    for (int i = threadIdx.x; i < (int)rot_dim; i += blockDim.x)
        cs[i] = i < half ? to_f32(row[i]) : -to_f32(row[i]);
    __syncthreads();
    constexpr int V = Vec<T>::N;
    const int D = (int)head_size;
    const bool neox = is_neox != 0;
    const bool shape_ok = D % V == 0 && (neox ? half % V == 0 : (2 * half) % V == 0);
    rotate_heads<T>(grad_query + tok * num_heads * head_size, shape_ok && aligned16(grad_query), neox, (int)num_heads,
                    D, half, cs);
    rotate_heads<T>(grad_key + tok * num_kv_heads * head_size, shape_ok && aligned16(grad_key), neox,
                    (int)num_kv_heads, D, half, cs);
}

template <typename T>
__global__ void __launch_bounds__(256) tk_rope_cos_sin_cache(T *out, // (max_pos, rot_dim) T
                                                             double base, int scaling, double factor,
                                                             tk_i64 original_max_position_embeddings, tk_i64 seq_len,
                                                             double beta_fast, double beta_slow, int truncate,
                                                             double attention_factor, double low_freq_factor,
                                                             double high_freq_factor,
                                                             const float *__restrict__ ext_factors, // (rot_dim / 2,) or null
                                                             tk_i64 max_pos, tk_i64 rot_dim)
{
    using namespace tk_rot;
    extern __shared__ double inv[]; // (rot_dim / 2,) f64
    const int half = (int)(rot_dim / 2);
    const tk_i64 sl = seq_len ? seq_len : max_pos;
    for (int i = threadIdx.x; i < half; i += blockDim.x)
        inv[i] = inv_freq(scaling, i, rot_dim, base, factor, original_max_position_embeddings, sl, beta_fast,
                          beta_slow, truncate, low_freq_factor, high_freq_factor, ext_factors);
    __syncthreads();
    // attention_factor > 0 wins; else YaRN's get_mscale(factor) = 0.1 ln(factor) + 1 (factor > 1); else
    // LongRoPE's sqrt(1 + ln(factor) / ln(original_max_position_embeddings)) (factor > 1); else 1
    const double mscale =
        attention_factor > 0                        ? attention_factor
        : (scaling == SCALE_YARN && factor > 1)     ? 0.1 * log(factor) + 1.0
        : (scaling == SCALE_LONGROPE && factor > 1) ? sqrt(1.0 + log(factor) / log((double)original_max_position_embeddings))
                                                    : 1.0;
    const tk_i64 p0 = (tk_i64)blockIdx.x * CACHE_ROWS;
    const int rows = (int)(max_pos - p0 < CACHE_ROWS ? max_pos - p0 : CACHE_ROWS);
    for (int it = threadIdx.x; it < rows * half; it += blockDim.x) {
        const int r = it / half, i = it - r * half;
        const tk_i64 p = p0 + r;
        double s, c;
        sincos((double)p * inv[i], &s, &c);
        T *o = out + p * rot_dim;
        o[i] = from_f32<T>((float)(c * mscale));
        o[half + i] = from_f32<T>((float)(s * mscale));
    }
}

__global__ void __launch_bounds__(256) tk_alibi_slopes(float *out, // (H,) f32
                                                       double max_bias, tk_i64 num_heads)
{
    const tk_i64 h = (tk_i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (h < num_heads)
        out[h] = (float)tk_rot::alibi_slope(h, num_heads, max_bias);
}

template <typename T>
__global__ void __launch_bounds__(256) tk_alibi_bias(T *out,                          // (H, Sq, Sk) T
                                                     const float *__restrict__ slopes, // (H,) f32
                                                     tk_i64 seqlen_q, tk_i64 seqlen_k)
{
    using namespace tk_rot;
    constexpr int V = Vec<T>::N;
    const tk_i64 row = blockIdx.x, h = row / seqlen_q, qi = row - h * seqlen_q;
    const tk_i64 pi = qi + seqlen_k - seqlen_q; // query qi's absolute position (bottom-right aligned)
    const float slope = slopes[h];
    T *o = out + row * seqlen_k;
    if (seqlen_k % V == 0 && aligned16(out)) {
        for (tk_i64 c = (tk_i64)threadIdx.x * V; c < seqlen_k; c += (tk_i64)blockDim.x * V) {
            Pack<T> a;
#pragma unroll
            for (int k = 0; k < V; k++) {
                const tk_i64 d = pi - (c + k);
                a.v[k] = from_f32<T>(-__fmul_rn(slope, (float)(d < 0 ? -d : d)));
            }
            *reinterpret_cast<Pack<T> *>(o + c) = a;
        }
    } else {
        for (tk_i64 c = threadIdx.x; c < seqlen_k; c += blockDim.x) {
            const tk_i64 d = pi - c;
            o[c] = from_f32<T>(-__fmul_rn(slope, (float)(d < 0 ? -d : d)));
        }
    }
}

template <typename T>
__global__ void __launch_bounds__(256) tk_sinusoidal_position_encoding(T *out, // (S, D) T
                                                                       double base, tk_i64 offset, tk_i64 dim)
{
    using namespace tk_rot;
    const tk_i64 row = blockIdx.x;
    const double p = (double)(offset + row);
    T *o = out + row * dim;
    // pair k covers columns 2k (sin) and 2k + 1 (cos), with angle p / base^(2k / dim)
    for (tk_i64 k = threadIdx.x; 2 * k < dim; k += blockDim.x) {
        double s, c;
        sincos(p * (1.0 / pow(base, (double)(2 * k) / (double)dim)), &s, &c);
        o[2 * k] = from_f32<T>((float)s);
        if (2 * k + 1 < dim)
            o[2 * k + 1] = from_f32<T>((float)c);
    }
}
