/*
 * cpu_simd.h — the AVX2 building blocks the fast CPU kernels share (ops/cpu_*.c): loads of eight f32,
 * f16, bf16 or i8 values as f32, stores that round to the dtype as tk_ops__store_f32 does (round to
 * nearest even, NaN stays NaN), a horizontal sum, an 8x8 transpose and exp().
 *
 * Every function carries TK_AVX2 (target avx2, fma, f16c): the including file compiles for baseline
 * x86-64 and calls them only from TK_AVX2 functions, after tk_ops__cpu_features() said the CPU has
 * them. Only x86-64 includes the AVX2 part; the element kinds and scalar helpers are for every
 * architecture.
 */
#ifndef TK_OPS_CPU_SIMD_H
#define TK_OPS_CPU_SIMD_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/convert.h"
#include "ops/cpu.h"

/* Element kinds of the kernels' operands. */
enum { K_F32 = 0, K_F16 = 1, K_BF16 = 2, K_I8 = 3 };

/* The kind of a float dtype (f32, f16, bf16) or i8; -1 for any other. */
static inline int tk_cpu_kind(tk_dtype dt)
{
    switch (tk_ops__dtype_bit(dt)) {
    case TK_OPS_F32: return K_F32;
    case TK_OPS_F16: return K_F16;
    case TK_OPS_BF16: return K_BF16;
    case TK_OPS_I8: return K_I8;
    default: return -1;
    }
}

static inline size_t tk_cpu_kind_size(int kind) { return kind == K_F32 ? 4 : kind == K_I8 ? 1 : 2; }

/* Element i of base as f32 (scalar: edges and the portable code). */
static inline float tk_cpu_ld1(const void *base, int64_t i, int kind)
{
    switch (kind) {
    case K_F32: return ((const float *)base)[i];
    case K_F16: return tk__f16_to_f32(((const uint16_t *)base)[i]);
    case K_BF16: {
        uint32_t u = (uint32_t)((const uint16_t *)base)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    default: return (float)((const int8_t *)base)[i];
    }
}

/* Stores v as element i of base, rounding to the kind as tk_ops__store_f32 does. */
static inline void tk_cpu_st1(void *base, int64_t i, int kind, float v)
{
    switch (kind) {
    case K_F32: ((float *)base)[i] = v; break;
    case K_F16: ((uint16_t *)base)[i] = tk__f32_to_f16(v); break;
    default: ((uint16_t *)base)[i] = tk__f32_to_bf16(v); break;
    }
}

#if TK_CPU_X86
#include <immintrin.h>

#define TK_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TK_AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

/* Eight elements from base + i (i in elements) as f32. */
TK_AVX2_INLINE __m256 tk_ld8(const void *base, int64_t i, int kind)
{
    switch (kind) {
    case K_F32: return _mm256_loadu_ps((const float *)base + i);
    case K_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + i)));
    case K_BF16:
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + i))), 16));
    default:
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const int8_t *)base + i))));
    }
}

/* The first n (0..8) elements from base + i, the others 0. */
TK_AVX2_INLINE __m256 tk_ld8_part(const void *base, int64_t i, int kind, int n)
{
    float t[8] = {0};
    for (int e = 0; e < n; e++)
        t[e] = tk_cpu_ld1(base, i + e, kind);
    return _mm256_loadu_ps(t);
}

/* f32 -> bf16 bits, round to nearest even; NaN -> quiet NaN (tk_ops__f32_to_bf16). Lanes as 32-bit. */
TK_AVX2_INLINE __m256i tk_f32_to_bf16_bits(__m256 v)
{
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(r, q, nan);
}

/* Eight f32 stored to base + i, rounded to the kind (f32, f16, bf16). */
TK_AVX2_INLINE void tk_st8(void *base, int64_t i, int kind, __m256 v)
{
    if (kind == K_F32) {
        _mm256_storeu_ps((float *)base + i, v);
    } else if (kind == K_F16) {
        _mm_storeu_si128((__m128i *)((uint16_t *)base + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    } else {
        __m256i b = tk_f32_to_bf16_bits(v);
        __m128i lo = _mm256_castsi256_si128(b), hi = _mm256_extracti128_si256(b, 1);
        _mm_storeu_si128((__m128i *)((uint16_t *)base + i), _mm_packus_epi32(lo, hi));
    }
}

/* The first n (0..8) lanes of v stored to base + i. */
TK_AVX2_INLINE void tk_st8_part(void *base, int64_t i, int kind, __m256 v, int n)
{
    float t[8];
    _mm256_storeu_ps(t, v);
    for (int e = 0; e < n; e++)
        tk_cpu_st1(base, i + e, kind, t[e]);
}

TK_AVX2_INLINE float tk_hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

TK_AVX2_INLINE float tk_hmax8(__m256 v)
{
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* In place: r[j] becomes column j of the 8x8 matrix whose rows were r[0..7]. */
TK_AVX2_INLINE void tk_tr8x8(__m256 *r)
{
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0)),
           s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
    __m256 s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0)),
           s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
    __m256 s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0)),
           s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
    __m256 s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0)),
           s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
    r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
    r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

/* exp(x) for f32 lanes: Cephes' expf (range reduction by ln 2 in two parts, a degree-5 polynomial),
 * within 2 ulp of expf over the normal range; exp(-inf) = 0, exp(+inf) = +inf, NaN stays NaN, inputs
 * below -87.3 give 0 (expf's subnormal results are flushed) and above 88.72 give +inf. */
TK_AVX2_INLINE __m256 tk_exp8(__m256 x)
{
    const __m256 hi = _mm256_set1_ps(88.7228391f), lo = _mm256_set1_ps(-87.3365447f);
    __m256 over = _mm256_cmp_ps(x, hi, _CMP_GT_OQ), under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    __m256 fx = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 z = _mm256_mul_ps(r, r);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, z, r);
    y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
    /* 2^fx: fx in [-126, 128]; 2^128 would overflow the exponent, so scale by 2^(fx-1) twice */
    __m256i e = _mm256_cvtps_epi32(fx);
    __m256i e1 = _mm256_srai_epi32(e, 1), e2 = _mm256_sub_epi32(e, e1);
    __m256 p1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e1, _mm256_set1_epi32(127)), 23));
    __m256 p2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e2, _mm256_set1_epi32(127)), 23));
    y = _mm256_mul_ps(_mm256_mul_ps(y, p1), p2);
    y = _mm256_blendv_ps(y, _mm256_setzero_ps(), under);
    y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), over);
    return _mm256_blendv_ps(y, x, nan);
}

/* cap * tanh(s / cap) on 8 lanes: (1 - e) / (1 + e) with e = exp(-2|x|), and tanh's odd series below
 * |x| = 1/16, within about 1e-6 of tanhf; NaN stays NaN, +-inf gives +-cap (attention's scores,
 * Gemma 2's final logits). */
TK_AVX2_INLINE __m256 tk_softcap8(__m256 s, float cap)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 x = _mm256_div_ps(s, _mm256_set1_ps(cap)), ax = _mm256_andnot_ps(sign, x);
    __m256 e = tk_exp8(_mm256_mul_ps(ax, _mm256_set1_ps(-2.0f)));
    __m256 big = _mm256_div_ps(_mm256_sub_ps(_mm256_set1_ps(1.0f), e), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
    /* x - x^3/3 + 2x^5/15 - 17x^7/315 */
    __m256 z = _mm256_mul_ps(ax, ax);
    __m256 p = _mm256_fmadd_ps(z, _mm256_set1_ps(-17.0f / 315.0f), _mm256_set1_ps(2.0f / 15.0f));
    p = _mm256_fmadd_ps(z, p, _mm256_set1_ps(-1.0f / 3.0f));
    __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(z, ax), p, ax);
    __m256 t = _mm256_blendv_ps(big, small, _mm256_cmp_ps(ax, _mm256_set1_ps(0.0625f), _CMP_LT_OQ));
    t = _mm256_or_ps(t, _mm256_and_ps(x, sign)); /* the sign back */
    t = _mm256_blendv_ps(t, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    return _mm256_mul_ps(t, _mm256_set1_ps(cap));
}
#endif /* TK_CPU_X86 */

#endif /* TK_OPS_CPU_SIMD_H */
