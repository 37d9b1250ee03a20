/*
 * sample_math.h — the integer arithmetic of the `sample` and `argmax` ops (ops/sampling.c has the
 * definition), shared with the vocabulary-parallel pick of a split LM head (models/tp_pick.c), which
 * must draw the very token one process draws. kernels-src/sampling/sampling.cu mirrors it on the GPU.
 *
 * Keys order floats as u32 (-0 = +0, NaN as -inf, or above +inf for argmax); weights are
 * W = floor(e^(z - zmax) * 2^32) with e^ from fmas only, so sums of weights are exact integers and
 * the order in which ranks add them does not matter; the draw is Philox-4x32-10. The softmax sums of
 * generation's processors (models/generate.c: log_softmax, min-p) are made order-independent the same
 * way: each term e in [0, 1] is taken as the integer floor(e * 2^63) and added exactly in 128 bits
 * (tk_fsum), so one process summing a row in index order and ranks summing their columns and then
 * each other's totals get the same bits. A file including this header must compile without fp
 * contraction (the pragma below does so for GCC and clang).
 */
#ifndef TK_COMMON_SAMPLE_MATH_H
#define TK_COMMON_SAMPLE_MATH_H

#include <math.h>
#include <stdint.h>

#include "common/convert.h"

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#define TK_KEY_NEG_INF 0x007FFFFFu /* key of -inf: the smallest key sample produces */
#define TK_KEY_NAN 0xFFFFFFFFu     /* argmax's NaN: above +inf (0xFF800000) */

/* a < b <=> key(a) < key(b); -0 maps to +0's key and NaN to -inf's. */
static inline uint32_t tk__key_of(float z)
{
    if (z != z)
        z = -INFINITY;
    if (z == 0.0f)
        z = 0.0f;
    uint32_t u = tk__f32_bits(z);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* argmax's key: NaN above everything. */
static inline uint32_t tk__argmax_key(float z) { return z != z ? TK_KEY_NAN : tk__key_of(z); }

static inline float tk__float_of_key(uint32_t k) { return tk__bits_f32((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k); }

/* The keys of the k largest non-NaN values of x[0..n) into heap[0..k), a min-heap (heap[0] the
 * smallest kept, in no other order); returns how many were kept (< k when fewer are not NaN). Ties
 * keep whichever came first; the threshold heap[0] is the same either way. */
static inline int64_t tk__top_keys(uint32_t *heap, const float *x, int64_t n, int64_t k)
{
    int64_t h = 0;
    for (int64_t i = 0; i < n; i++) {
        if (x[i] != x[i])
            continue;
        uint32_t v = tk__key_of(x[i]);
        if (h < k) { /* sift up */
            int64_t j = h++;
            for (; j > 0 && heap[(j - 1) / 2] > v; j = (j - 1) / 2)
                heap[j] = heap[(j - 1) / 2];
            heap[j] = v;
        } else if (v > heap[0]) { /* replace the root, sift down */
            int64_t j = 0;
            for (;;) {
                int64_t c = 2 * j + 1;
                if (c >= k)
                    break;
                if (c + 1 < k && heap[c + 1] < heap[c])
                    c++;
                if (heap[c] >= v)
                    break;
                heap[j] = heap[c];
                j = c;
            }
            heap[j] = v;
        }
    }
    return h;
}

/* e^d for d in [-23, 0]: n = rint(d log2 e), r = d - n ln2 (ln 2 in two parts, fmas), a degree-7
 * Taylor polynomial on |r| <= 0.347 (truncation < 6e-9), times 2^n (exact: n >= -34). */
static inline float tk__exp_det(float d)
{
    float n = rintf(d * 1.44269504f);
    float r = fmaf(-n, 0.693145751953125f, d);
    r = fmaf(-n, 1.42860677e-6f, r);
    float p = 1.98412698e-4f;
    p = fmaf(p, r, 1.38888889e-3f);
    p = fmaf(p, r, 8.33333333e-3f);
    p = fmaf(p, r, 4.16666667e-2f);
    p = fmaf(p, r, 1.66666667e-1f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    return p * tk__bits_f32((uint32_t)(127 + (int)n) << 23);
}

/* W = floor(e^(z - zmax) * 2^32); z is a key's float (never NaN), zmax the row's largest. */
static inline uint64_t tk__weight_of(float z, float zmax)
{
    if (z == zmax)
        return 1ull << 32;
    float d = z - zmax;
    if (!(d >= -23.0f)) /* e^d * 2^32 < 1, and -inf */
        return 0;
    return (uint64_t)(tk__exp_det(d) * 4294967296.0f);
}

/* Philox-4x32-10 (Salmon et al., SC'11; Random123's philox4x32_10). */
static inline void tk__philox4x32_10(uint32_t out[4], const uint32_t ctr[4], const uint32_t key[2])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
    for (int i = 0; i < 10; i++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* A row's 64-bit draw: key = seed, counter = (row, offset). */
static inline uint64_t tk__sample_draw(uint64_t seed, uint64_t row, uint64_t offset)
{
    uint32_t ctr[4] = {(uint32_t)row, (uint32_t)(row >> 32), (uint32_t)offset, (uint32_t)(offset >> 32)};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)}, o[4];
    tk__philox4x32_10(o, ctr, key);
    return ((uint64_t)o[1] << 32) | o[0];
}

/* floor(a * b / 2^64) */
static inline uint64_t tk__mulhi64(uint64_t a, uint64_t b)
{
    uint64_t a0 = (uint32_t)a, a1 = a >> 32, b0 = (uint32_t)b, b1 = b >> 32;
    uint64_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
    uint64_t mid = (p00 >> 32) + (uint32_t)p01 + (uint32_t)p10;
    return p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
}

/* An order-independent sum of terms in [0, 1] (e^(z - zmax) of a softmax): each term is truncated to
 * floor(e * 2^63), an integer, and added exactly into hi * 2^64 + lo; a NaN term makes the sum NaN.
 * Truncation moves a sum of V terms by less than V * 2^-63 (1e-14 for V = 10^5), far below f32's
 * rounding of what is computed from it. */
typedef struct tk_fsum {
    uint64_t hi, lo;
    int nan;
} tk_fsum;

static inline void tk__fsum_add(tk_fsum *s, double e)
{
    if (e != e) {
        s->nan = 1;
        return;
    }
    uint64_t v = e >= 1.0 ? 1ull << 63 : e > 0 ? (uint64_t)(e * 9223372036854775808.0) : 0;
    s->lo += v;
    s->hi += s->lo < v;
}

static inline void tk__fsum_merge(tk_fsum *a, const tk_fsum *b)
{
    a->lo += b->lo;
    a->hi += b->hi + (a->lo < b->lo);
    a->nan |= b->nan;
}

/* The sum as a double (NaN if a term was): the same bits for the same integer, however it was added. */
static inline double tk__fsum_value(const tk_fsum *s)
{
    if (s->nan)
        return NAN;
    return ((double)s->hi * 18446744073709551616.0 + (double)s->lo) * 0x1p-63;
}

#endif /* TK_COMMON_SAMPLE_MATH_H */
