/*
 * cpu_attention.c — fast CPU attention, beside the references of ops/attention.c: a blocked f32
 * flash-style forward for attention (prefill, varlen, causal, windows, GQA) and attention_decode (1..16
 * new queries per sequence over the paged cache, f32/f16/bf16 caches, f16/bf16 ones under f32 queries
 * too; decode reads the cache's rows where they are, widening 16-bit keys and values in registers).
 *
 * A task is one sequence, one KV head and a block of up to BQ query rows; it holds the block's rows for
 * every query head of the group (GQA: g = Hq / Hkv heads share the KV head), so each chunk of BK keys
 * and values is loaded (widened to f32, the keys transposed to [D][BK]) once for g * BQ query rows.
 * Per row the online softmax keeps the running max m, the sum l and the f32 accumulator, rescaled by
 * exp(m_old - m_new) when the max grows (the reference's combine). Tasks go to the pool.
 *
 * Numerics: f32 throughout (the reference computes in double): q is multiplied by the scale once,
 * scores are f32 dot products, exp is tk_exp8 (within 2 ulp of expf), out = acc / l rounded once to the
 * output dtype, lse = m + log(l) in f32. A row that sees no key gets 0 (lse -inf); a NaN score makes
 * the row NaN, as in the reference.
 *
 * They take what the models use: no ALiBi, float caches. A softcap (Gemma 2) bends each f32 score s into
 * cap * tanh(s / cap) before the mask, as the reference does in double: the vector tanh is (1 - e) /
 * (1 + e) with e = exp(-2|x|), and its odd series below |x| = 1/16, within about 1e-6 of tanhf. Calls
 * whose cu_seqlens, seq_lens or block tables are out of range run the reference, which reports them.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/cpu.h"
#include "ops/cpu_simd.h"

#define BQ 16       /* query rows (per head) of a task */
#define BK 64       /* keys per chunk */
#define MAX_G 16    /* query heads per KV head a task holds */
#define MAX_DP 256  /* head dims the fast path takes (padded to a multiple of 8) */

enum { A_OUT, A_Q, A_K, A_V, A_LSE, A_CUQ, A_CUK, A_MAXQ, A_ALIBI, A_SCALE, A_CAUSAL, A_WL, A_WR, A_SOFTCAP };
enum { D_OUT, D_Q, D_KC, D_VC, D_BT, D_SL, D_LSE, D_KS, D_VS, D_ALIBI, D_SCALE, D_WL, D_SOFTCAP };

/* The keys a query at position p sees among keys 0..nk-1 (the reference's key_range). */
static void key_range(int64_t wl, int64_t wr, int64_t p, int64_t nk, int64_t *lo, int64_t *hi)
{
    *hi = (wr < 0 || wr >= nk - 1 - p) ? nk - 1 : p + wr;
    *lo = (wl < 0 || wl >= p) ? 0 : p - wl;
}

/* ---- the shared core ----------------------------------------------------------------------------- */

/* The rows of a task: R = rows * g query rows, each with its own visible key range. */
typedef struct {
    int64_t R, d, dp;
    float *q;          /* [R][dp] f32, scaled, zero-padded */
    int64_t *lo, *hi;  /* [R] visible keys (absolute) */
    float *m, *l;      /* [R] */
    float *acc;        /* [R][dp] */
    int *nan;          /* [R] */
    float *kt;         /* [dp][BK]: the chunk's keys, transposed */
    float *vb;         /* [BK][dp]: the chunk's values */
    float *s;          /* [BK] scores of one row */
    float *sr;         /* [R][BK] scores of every row (the in-place chunks) */
    float cap;         /* softcap: scores become cap * tanh(score / cap); 0: off */
} rows_t;

static inline float softcap1(float s, float cap) { return cap * tanhf(s / cap); }

/* Where a chunk's key and value rows are: row t of the chunk starting at key j0. */
typedef const void *(*row_fn)(const void *src, int64_t key, int which);

static void load_chunk(rows_t *T, row_fn rowp, const void *src, int kind, int64_t j0, int64_t n)
{
    for (int64_t t = 0; t < n; t++) {
        const void *kr = rowp(src, j0 + t, 0), *vr = rowp(src, j0 + t, 1);
        float *vd = T->vb + t * T->dp;
        for (int64_t e = 0; e < T->d; e++) {
            T->kt[e * BK + t] = tk_cpu_ld1(kr, e, kind);
            vd[e] = tk_cpu_ld1(vr, e, kind);
        }
        for (int64_t e = T->d; e < T->dp; e++)
            vd[e] = 0;
    }
    for (int64_t e = 0; e < T->d; e++)
        for (int64_t t = n; t < BK; t++)
            T->kt[e * BK + t] = 0;
}

static void rows_init(rows_t *T)
{
    for (int64_t r = 0; r < T->R; r++) {
        T->m[r] = -INFINITY;
        T->l[r] = 0;
        T->nan[r] = 0;
        memset(T->acc + r * T->dp, 0, (size_t)T->dp * sizeof(float));
    }
}

/* Online softmax: a block's row maximum mc above the running maximum m rescales the running sum l (and,
 * by the factor returned, the caller's accumulator); 1 when the maximum stands. */
static inline float online_rescale(float *m, float *l, float mc)
{
    if (!(mc > *m))
        return 1.0f;
    float sc = expf(*m - mc);
    *l *= sc;
    *m = mc;
    return sc;
}

/* One chunk of keys [j0, j0 + n) for every row: portable. */
static void chunk_c(rows_t *T, int64_t j0, int64_t n)
{
    for (int64_t r = 0; r < T->R; r++) {
        int64_t a = T->lo[r] > j0 ? T->lo[r] : j0, b = T->hi[r] < j0 + n - 1 ? T->hi[r] : j0 + n - 1;
        if (a > b)
            continue;
        const float *q = T->q + r * T->dp;
        float mc = -INFINITY;
        for (int64_t j = a; j <= b; j++) {
            float s = 0;
            for (int64_t e = 0; e < T->d; e++)
                s += q[e] * T->kt[e * BK + (j - j0)];
            if (T->cap > 0)
                s = softcap1(s, T->cap);
            T->s[j - j0] = s;
            T->nan[r] |= isnan(s);
            mc = s > mc ? s : mc;
        }
        if (mc == -INFINITY)
            continue;
        float *acc = T->acc + r * T->dp;
        if (mc > T->m[r]) {
            float sc = expf(T->m[r] - mc);
            T->l[r] *= sc;
            for (int64_t e = 0; e < T->d; e++)
                acc[e] *= sc;
            T->m[r] = mc;
        }
        for (int64_t j = a; j <= b; j++) {
            float p = expf(T->s[j - j0] - T->m[r]);
            T->l[r] += p;
            const float *v = T->vb + (j - j0) * T->dp;
            for (int64_t e = 0; e < T->d; e++)
                acc[e] += p * v[e];
        }
    }
}

#if TK_CPU_X86
TK_AVX2 static void chunk_avx2(rows_t *T, int64_t j0, int64_t n)
{
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    for (int64_t r = 0; r < T->R; r++) {
        int64_t a = T->lo[r] > j0 ? T->lo[r] : j0, b = T->hi[r] < j0 + n - 1 ? T->hi[r] : j0 + n - 1;
        if (a > b)
            continue;
        const float *q = T->q + r * T->dp;
        /* scores of the 64 keys: eight groups of 8, eight independent FMA chains */
        __m256 s[8];
        for (int g = 0; g < 8; g++)
            s[g] = _mm256_setzero_ps();
        for (int64_t e = 0; e < T->d; e++) {
            __m256 qe = _mm256_broadcast_ss(q + e);
            const float *kr = T->kt + e * BK;
            for (int g = 0; g < 8; g++)
                s[g] = _mm256_fmadd_ps(qe, _mm256_load_ps(kr + 8 * g), s[g]);
        }
        if (T->cap > 0)
            for (int g = 0; g < 8; g++)
                s[g] = tk_softcap8(s[g], T->cap);
        /* mask keys outside [a, b] to -inf; the max, and NaN */
        __m256 mx = ninf;
        int nan = 0;
        __m256i idx0 = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        __m256i va = _mm256_set1_epi32((int)(a - j0)), vb = _mm256_set1_epi32((int)(b - j0));
        for (int g = 0; g < 8; g++) {
            __m256i id = _mm256_add_epi32(idx0, _mm256_set1_epi32(8 * g));
            __m256i out = _mm256_or_si256(_mm256_cmpgt_epi32(va, id), _mm256_cmpgt_epi32(id, vb));
            s[g] = _mm256_blendv_ps(s[g], ninf, _mm256_castsi256_ps(out));
            nan |= _mm256_movemask_ps(_mm256_cmp_ps(s[g], s[g], _CMP_UNORD_Q));
            mx = _mm256_max_ps(mx, s[g]);
        }
        T->nan[r] |= nan != 0;
        float mc = tk_hmax8(mx);
        if (mc == -INFINITY)
            continue; /* NaN scores: max ignores them; the row is NaN anyway */
        float *acc = T->acc + r * T->dp, sc = online_rescale(&T->m[r], &T->l[r], mc);
        __m256 mv = _mm256_set1_ps(T->m[r]), lsum = _mm256_setzero_ps();
        for (int g = 0; g < 8; g++) {
            __m256 p = tk_exp8(_mm256_sub_ps(s[g], mv)); /* exp(-inf) = 0 for masked keys */
            p = _mm256_blendv_ps(p, _mm256_setzero_ps(), _mm256_cmp_ps(p, p, _CMP_UNORD_Q));
            lsum = _mm256_add_ps(lsum, p);
            _mm256_store_ps(T->s + 8 * g, p);
        }
        T->l[r] += tk_hsum8(lsum);
        __m256 scv = _mm256_set1_ps(sc);
        int64_t ta = a - j0, tb = b - j0;
        for (int64_t x = 0; x < T->dp; x += 8) {
            __m256 av = _mm256_mul_ps(_mm256_load_ps(acc + x), scv);
            for (int64_t t = ta; t <= tb; t++)
                av = _mm256_fmadd_ps(_mm256_broadcast_ss(T->s + t), _mm256_load_ps(T->vb + t * T->dp + x), av);
            _mm256_store_ps(acc + x, av);
        }
    }
}
#endif

#if TK_CPU_X86
/* One chunk of keys [j0, j0 + n) for every row, reading each key and value row where it is (a paged
 * cache's rows, in the cache's kind) instead of staging the chunk: decode's few query rows would not
 * repay the copy (a transpose of K and a copy of V over the whole cache at every step). Needs d % 8 == 0
 * (the rows are read 8 elements at a time, never past d). */
/* One score q . k (softcapped with cap > 0): 8 columns a step, alternately into two accumulators. */
TK_AVX2_INLINE float score1(const float *q, const void *k, int kind, int64_t d, float cap)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t e = 0;
    for (; e + 16 <= d; e += 16) {
        s0 = _mm256_fmadd_ps(_mm256_load_ps(q + e), tk_ld8(k, e, kind), s0);
        s1 = _mm256_fmadd_ps(_mm256_load_ps(q + e + 8), tk_ld8(k, e + 8, kind), s1);
    }
    if (e < d)
        s0 = _mm256_fmadd_ps(_mm256_load_ps(q + e), tk_ld8(k, e, kind), s0);
    float v = tk_hsum8(_mm256_add_ps(s0, s1));
    return cap > 0 ? softcap1(v, cap) : v;
}

/* Every row's scores of the chunk's keys into T->sr (-INFINITY outside the row's range), for 16-bit keys
 * with d <= 64: each key widened into registers once for all the rows (a GQA group's query heads share
 * it), then dotted as score1 does, term for term. With f32 keys this measured 3% slower on a causal
 * prefill (nothing to share), so they keep score1. */
TK_AVX2_INLINE void scores_shared(rows_t *T, const void *const *kr, int kind, int64_t j0, int64_t n)
{
    const int64_t d = T->d;
    const int nv = (int)(d / 8);
    for (int64_t t = 0; t < BK; t++) {
        __m256 kv[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++)
            kv[i] = t < n && i < nv ? tk_ld8(kr[t], 8 * i, kind) : _mm256_setzero_ps();
        for (int64_t r = 0; r < T->R; r++) {
            float *s = T->sr + r * BK;
            if (t >= n || j0 + t < T->lo[r] || j0 + t > T->hi[r]) {
                s[t] = -INFINITY;
                continue;
            }
            const float *q = T->q + r * T->dp;
            __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++)
                if (i < nv) { /* score1's accumulators: even blocks of 8 (and an odd tail) s0, odd s1 */
                    if (i % 2 == 0)
                        s0 = _mm256_fmadd_ps(_mm256_load_ps(q + 8 * i), kv[i], s0);
                    else
                        s1 = _mm256_fmadd_ps(_mm256_load_ps(q + 8 * i), kv[i], s1);
                }
            float v = tk_hsum8(_mm256_add_ps(s0, s1));
            s[t] = T->cap > 0 ? softcap1(v, T->cap) : v;
        }
    }
}

TK_AVX2_INLINE void chunk_inplace(rows_t *T, row_fn rowp, const void *src, int kind, int64_t j0, int64_t n)
{
    const void *kr[BK], *vr[BK];
    size_t rb = (size_t)T->d * tk_cpu_kind_size(kind);
    for (int64_t t = 0; t < n; t++) {
        kr[t] = rowp(src, j0 + t, 0);
        vr[t] = rowp(src, j0 + t, 1);
    }
    /* every line of the chunk's rows requested up front: the rows are scattered (one head's slice of
     * each slot), so the hardware prefetcher would meet them one miss at a time */
    for (int64_t t = 0; t < n; t++)
        for (size_t o = 0; o < rb; o += 64) {
            _mm_prefetch((const char *)kr[t] + o, _MM_HINT_T0);
            _mm_prefetch((const char *)vr[t] + o, _MM_HINT_T0);
        }
    const int64_t d = T->d, shared = d <= 64 && kind != K_F32; /* f32 keys need no widening to share */
    if (shared)
        scores_shared(T, kr, kind, j0, n);
    for (int64_t r = 0; r < T->R; r++) {
        int64_t a = T->lo[r] > j0 ? T->lo[r] : j0, b = T->hi[r] < j0 + n - 1 ? T->hi[r] : j0 + n - 1;
        if (a > b)
            continue;
        const float *q = T->q + r * T->dp;
        float *s = T->sr + r * BK;
        int64_t ta = a - j0, tb = b - j0;
        if (!shared)
            for (int64_t t = 0; t < BK; t++)
                s[t] = t >= ta && t <= tb ? score1(q, kr[t], kind, d, T->cap) : -INFINITY;
        int nan = 0;
        float mc = -INFINITY;
        for (int64_t t = ta; t <= tb; t++) {
            nan |= isnan(s[t]);
            mc = s[t] > mc ? s[t] : mc;
        }
        T->nan[r] |= nan;
        if (mc == -INFINITY)
            continue; /* NaN scores: max ignores them; the row is NaN anyway */
        float *acc = T->acc + r * T->dp, sc = online_rescale(&T->m[r], &T->l[r], mc);
        __m256 mv = _mm256_set1_ps(T->m[r]), lsum = _mm256_setzero_ps();
        for (int64_t t = ta / 8 * 8; t <= tb; t += 8) {
            __m256 p = tk_exp8(_mm256_sub_ps(_mm256_load_ps(s + t), mv)); /* exp(-inf) = 0 outside [a, b] */
            p = _mm256_blendv_ps(p, _mm256_setzero_ps(), _mm256_cmp_ps(p, p, _CMP_UNORD_Q));
            lsum = _mm256_add_ps(lsum, p);
            _mm256_store_ps(s + t, p);
        }
        T->l[r] += tk_hsum8(lsum);
        /* acc = acc sc + sum_t p_t v_t, each element's terms in t's order: 64 columns at a time in eight
         * independent chains (one chain per 8 columns ran at the FMA's latency) */
        __m256 scv = _mm256_set1_ps(sc);
        for (int64_t x0 = 0; x0 < d; x0 += 64) {
            const int nv = d - x0 >= 64 ? 8 : (int)(d - x0) / 8;
            __m256 av[8];
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++)
                av[i] = i < nv ? _mm256_mul_ps(_mm256_load_ps(acc + x0 + 8 * i), scv) : _mm256_setzero_ps();
            for (int64_t t = ta; t <= tb; t++) {
                __m256 pt = _mm256_broadcast_ss(s + t);
#pragma GCC unroll 8
                for (int i = 0; i < 8; i++)
                    if (i < nv)
                        av[i] = _mm256_fmadd_ps(pt, tk_ld8(vr[t], x0 + 8 * i, kind), av[i]);
            }
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++)
                if (i < nv)
                    _mm256_store_ps(acc + x0 + 8 * i, av[i]);
        }
    }
}

/* One instance per cache kind, so the loads are not a switch in the inner loops. */
TK_AVX2 static void chunk_inplace_avx2(rows_t *T, row_fn rowp, const void *src, int kind, int64_t j0, int64_t n)
{
    if (kind == K_F32)
        chunk_inplace(T, rowp, src, K_F32, j0, n);
    else if (kind == K_F16)
        chunk_inplace(T, rowp, src, K_F16, j0, n);
    else
        chunk_inplace(T, rowp, src, K_BF16, j0, n);
}
#endif

/* Loads each row's q (scaled), then runs the chunks covering every row's keys. */
static void rows_run(rows_t *T, row_fn rowp, const void *src, int kind, int avx2, int inplace)
{
    int64_t lo = INT64_MAX, hi = -1;
    for (int64_t r = 0; r < T->R; r++)
        if (T->lo[r] <= T->hi[r]) {
            lo = T->lo[r] < lo ? T->lo[r] : lo;
            hi = T->hi[r] > hi ? T->hi[r] : hi;
        }
    rows_init(T);
    for (int64_t j0 = lo; j0 <= hi; j0 += BK) {
        int64_t n = hi - j0 + 1 < BK ? hi - j0 + 1 : BK;
#if TK_CPU_X86
        if (avx2 && inplace && T->d % 8 == 0) {
            chunk_inplace_avx2(T, rowp, src, kind, j0, n);
            continue;
        }
#endif
        load_chunk(T, rowp, src, kind, j0, n);
#if TK_CPU_X86
        if (avx2)
            chunk_avx2(T, j0, n);
        else
#endif
            chunk_c(T, j0, n);
    }
}

/* Row r's result: out[0..d) in out's kind, and its lse. */
static void rows_store(const rows_t *T, int64_t r, void *out, int64_t off, int kind, float *lse)
{
    const float *acc = T->acc + r * T->dp;
    float l = T->l[r];
    for (int64_t e = 0; e < T->d; e++) {
        float v = T->nan[r] ? NAN : T->m[r] == -INFINITY ? 0.0f : acc[e] / l;
        tk_cpu_st1(out, off + e, kind, v);
    }
    if (lse)
        *lse = T->nan[r] ? NAN : T->m[r] == -INFINITY ? -INFINITY : T->m[r] + logf(l);
}

/* Buffers of a task's rows on the thread's scratch (slot 3). */
static int rows_alloc(rows_t *T, int64_t R, int64_t d)
{
    T->R = R;
    T->d = d;
    T->dp = (d + 7) / 8 * 8;
    size_t f = (size_t)(R * T->dp * 2 + R * 2 + T->dp * BK + BK * T->dp + BK + R * BK) + 64;
    size_t bytes = f * sizeof(float) + (size_t)R * (2 * sizeof(int64_t) + sizeof(int)) + 256;
    char *p = tk_ops__cpu_scratch(3, bytes);
    if (!p)
        return 0;
    T->kt = (float *)p;
    T->vb = T->kt + T->dp * BK;
    T->s = T->vb + BK * T->dp;
    T->sr = T->s + BK;
    T->q = T->sr + R * BK;
    T->acc = T->q + R * T->dp;
    T->m = T->acc + R * T->dp;
    T->l = T->m + R;
    T->lo = (int64_t *)(((uintptr_t)(T->l + R) + 7) & ~(uintptr_t)7);
    T->hi = T->lo + R;
    T->nan = (int *)(T->hi + R);
    return 1;
}

/* ---- attention (prefill) ------------------------------------------------------------------------- */

typedef struct {
    const char *q, *k, *v;
    char *out;
    float *lse;
    int kind;
    int64_t sq, hq, hkv, d, g, nseq, nqb; /* nqb: query blocks of the longest sequence */
    int64_t *q0, *k0;                     /* row starts */
    float scale;
    int64_t wl, wr;
    int avx2, nomem;
    float cap; /* softcap, 0: off */
} fwd_t;

typedef struct {
    const fwd_t *f;
    const char *k, *v; /* key row 0 of the sequence at the task's kv head */
    int64_t stride;    /* bytes from one key row to the next */
} dense_src;

static const void *dense_row(const void *src, int64_t key, int which)
{
    const dense_src *s = src;
    return (which ? s->v : s->k) + key * s->stride;
}

static void fwd_range(void *arg, int64_t lo, int64_t hi)
{
    fwd_t *f = arg;
    size_t es = tk_cpu_kind_size(f->kind);
    rows_t T;
    if (!rows_alloc(&T, BQ * f->g, f->d)) {
        __atomic_store_n(&f->nomem, 1, __ATOMIC_RELAXED);
        return;
    }
    T.cap = f->cap;
    for (int64_t it = lo; it < hi; it++) {
        int64_t qb = it % f->nqb, hk = (it / f->nqb) % f->hkv, s = it / (f->nqb * f->hkv);
        int64_t nq = f->q0[s + 1] - f->q0[s], nk = f->k0[s + 1] - f->k0[s];
        int64_t i0 = qb * BQ, ni = nq - i0 < BQ ? nq - i0 : BQ;
        if (ni <= 0)
            continue;
        T.R = ni * f->g;
        for (int64_t i = 0; i < ni; i++)
            for (int64_t h = 0; h < f->g; h++) {
                int64_t r = i * f->g + h, row = (f->q0[s] + i0 + i) * f->hq + hk * f->g + h;
                float *qd = T.q + r * T.dp;
                for (int64_t e = 0; e < f->d; e++)
                    qd[e] = tk_cpu_ld1(f->q, row * f->d + e, f->kind) * f->scale;
                for (int64_t e = f->d; e < T.dp; e++)
                    qd[e] = 0;
                key_range(f->wl, f->wr, i0 + i + nk - nq, nk, &T.lo[r], &T.hi[r]);
            }
        dense_src src = {f, f->k + (f->k0[s] * f->hkv + hk) * f->d * es, f->v + (f->k0[s] * f->hkv + hk) * f->d * es,
                         f->hkv * f->d * (int64_t)es};
        rows_run(&T, dense_row, &src, f->kind, f->avx2, 0);
        for (int64_t i = 0; i < ni; i++)
            for (int64_t h = 0; h < f->g; h++) {
                int64_t r = i * f->g + h, qh = hk * f->g + h, qrow = f->q0[s] + i0 + i;
                float lse;
                rows_store(&T, r, f->out, (qrow * f->hq + qh) * f->d, f->kind, &lse);
                if (f->lse) /* [B, Hq, Sq] */
                    f->lse[((qrow / f->sq) * f->hq + qh) * f->sq + qrow % f->sq] = lse;
            }
    }
}

/* cu_seqlens valid (the reference's read_cu checks): 1, else 0 (the reference then reports it). */
static int cu_ok(const tk_tensor *t, int64_t total, int64_t maxlen)
{
    const int32_t *cu = tk_ops__base(t);
    for (int64_t s = 0; s < t->shape[0]; s++) {
        if (cu[s] < 0 || cu[s] > total || (s > 0 && cu[s] < cu[s - 1]) ||
            (s > 0 && maxlen > 0 && cu[s] - cu[s - 1] > maxlen))
            return 0;
    }
    return 1;
}

static int fits_attention(const tk_op_call *c)
{
    const tk_tensor *q = c->t[A_Q], *k = c->t[A_K];
    if (c->t[A_ALIBI] || tk_cpu_kind(q->dtype) < 0 || tk_cpu_kind(q->dtype) == K_I8)
        return 0;
    int64_t d = q->shape[3], g = q->shape[2] / k->shape[2];
    if (d > MAX_DP || g > MAX_G)
        return 0;
    if (c->t[A_CUQ] && (!cu_ok(c->t[A_CUQ], q->shape[1], c->i[A_MAXQ]) || !cu_ok(c->t[A_CUK], k->shape[1], 0)))
        return 0;
    return 1;
}

static int run_attention(const tk_op_call *c, int avx2)
{
    const tk_tensor *q = c->t[A_Q], *k = c->t[A_K];
    int64_t b = q->shape[0], sq = q->shape[1], hq = q->shape[2], d = q->shape[3], sk = k->shape[1];
    int64_t nseq = c->t[A_CUQ] ? c->t[A_CUQ]->shape[0] - 1 : b;
    int64_t *starts = malloc(sizeof(int64_t) * (size_t)(2 * (nseq + 1)));
    if (!starts)
        return tk__err(TK_ERR_NOMEM, "%s: out of memory", c->op->name);
    fwd_t f = {tk_ops__base(q),
               tk_ops__base(k),
               tk_ops__base(c->t[A_V]),
               tk_ops__base(c->t[A_OUT]),
               c->t[A_LSE] ? tk_ops__base(c->t[A_LSE]) : NULL,
               tk_cpu_kind(q->dtype),
               sq,
               hq,
               k->shape[2],
               d,
               hq / k->shape[2],
               nseq,
               0,
               starts,
               starts + nseq + 1,
               0,
               c->i[A_WL],
               c->i[A_CAUSAL] ? 0 : c->i[A_WR],
               avx2,
               0,
               0.0f};
    double sc = c->f[A_SCALE] != 0 ? c->f[A_SCALE] : 1.0 / sqrt((double)d);
    f.scale = (float)sc;
    f.cap = (float)c->f[A_SOFTCAP];
    int64_t maxq = 0;
    for (int64_t s = 0; s <= nseq; s++) {
        if (c->t[A_CUQ]) {
            f.q0[s] = ((const int32_t *)tk_ops__base(c->t[A_CUQ]))[s];
            f.k0[s] = ((const int32_t *)tk_ops__base(c->t[A_CUK]))[s];
        } else {
            f.q0[s] = s * sq;
            f.k0[s] = s * sk;
        }
        if (s > 0 && f.q0[s] - f.q0[s - 1] > maxq)
            maxq = f.q0[s] - f.q0[s - 1];
    }
    f.nqb = (maxq + BQ - 1) / BQ;
    int64_t tasks = nseq * f.hkv * f.nqb;
    int64_t work = b * sq * hq * (sk / (nseq > 0 ? nseq : 1) + 1) * d;
    if (tasks > 0 && hq > 0)
        tk_ops__parallel_for(tasks, 1, work < (1 << 18) ? 1 : 0, fwd_range, &f);
    free(starts);
    if (f.nomem)
        return tk__err(TK_ERR_NOMEM, "%s: out of memory for a thread's blocks", c->op->name);
    return TK_OK;
}

/* ---- attention_decode (paged) -------------------------------------------------------------------- */

typedef struct {
    const char *q;
    char *out;
    const char *kc, *vc;
    float *lse;
    const int32_t *tab, *lens;
    int kind, ckind; /* of q and out; of the caches */
    int64_t b, sq, hq, hkv, d, g, bs, mb;
    float scale;
    int64_t wl;
    int avx2, nomem;
    float cap;            /* softcap, 0: off */
    int64_t nseg, segk;   /* each (sequence, KV head) as nseg tasks of segk keys */
    float *part;          /* nseg > 1: every task's rows' m, l, NaN flag and acc (PART_HEAD + dp floats) */
} dec_t;

#define PART_HEAD 8 /* m, l, the NaN flag, padding to keep acc 32-byte aligned */
#define SPLIT_TASKS 8 /* decode splits the keys until about this many tasks (SmolLM2: 3 KV heads) */

typedef struct {
    const dec_t *j;
    const int32_t *tab;
    int64_t hk;
} paged_src;

static const void *paged_row(const void *src, int64_t key, int which)
{
    const paged_src *s = src;
    const dec_t *j = s->j;
    int64_t slot = (int64_t)s->tab[key / j->bs] * j->bs + key % j->bs;
    return (which ? j->vc : j->kc) + ((slot * j->hkv + s->hk) * j->d) * (int64_t)tk_cpu_kind_size(j->ckind);
}

/* Task it's rows as partial results: the running max, sum and accumulator of its keys. */
static void part_store(const dec_t *j, const rows_t *T, int64_t it)
{
    int64_t ps = PART_HEAD + T->dp;
    for (int64_t r = 0; r < T->R; r++) {
        float *p = j->part + (it * T->R + r) * ps;
        p[0] = T->m[r];
        p[1] = T->l[r];
        p[2] = (float)T->nan[r];
        memcpy(p + PART_HEAD, T->acc + r * T->dp, (size_t)T->d * sizeof(float));
    }
}

/* The rows of a split (sequence, KV head) from its tasks' partial results: the reference's combine of
 * online-softmax blocks (each part rescaled by exp(m_part - m)), then out = acc / l as rows_store. */
static void part_combine(const dec_t *j, int64_t bh, float *acc)
{
    int64_t R = j->sq * j->g, dp = (j->d + 7) / 8 * 8, ps = PART_HEAD + dp, b = bh / j->hkv, hk = bh % j->hkv;
    for (int64_t r = 0; r < R; r++) {
        const float *p0 = j->part + (bh * j->nseg * R + r) * ps;
        float m = -INFINITY, l = 0;
        int nan = 0;
        for (int64_t s = 0; s < j->nseg; s++) {
            const float *p = p0 + s * R * ps;
            nan |= p[2] != 0;
            m = p[0] > m ? p[0] : m;
        }
        memset(acc, 0, (size_t)j->d * sizeof *acc);
        for (int64_t s = 0; s < j->nseg && m != -INFINITY; s++) {
            const float *p = p0 + s * R * ps;
            if (p[0] == -INFINITY)
                continue;
            float sc = expf(p[0] - m);
            l += p[1] * sc;
            for (int64_t e = 0; e < j->d; e++)
                acc[e] += p[PART_HEAD + e] * sc;
        }
        int64_t i = r / j->g, qh = hk * j->g + r % j->g, row = (b * j->sq + i) * j->hq + qh;
        for (int64_t e = 0; e < j->d; e++)
            tk_cpu_st1(j->out, row * j->d + e, j->kind, nan ? NAN : m == -INFINITY ? 0.0f : acc[e] / l);
        if (j->lse)
            j->lse[(b * j->hq + qh) * j->sq + i] = nan ? NAN : m == -INFINITY ? -INFINITY : m + logf(l);
    }
}

static void dec_range(void *arg, int64_t lo, int64_t hi)
{
    dec_t *j = arg;
    rows_t T;
    if (!rows_alloc(&T, j->sq * j->g, j->d)) {
        __atomic_store_n(&j->nomem, 1, __ATOMIC_RELAXED);
        return;
    }
    T.cap = j->cap;
    for (int64_t it = lo; it < hi; it++) {
        int64_t bh = it / j->nseg, b = bh / j->hkv, hk = bh % j->hkv, nk = j->lens[b];
        int64_t s0 = it % j->nseg * j->segk, s1 = s0 + j->segk; /* this task's keys (segk: all when not split) */
        for (int64_t i = 0; i < j->sq; i++)
            for (int64_t h = 0; h < j->g; h++) {
                int64_t r = i * j->g + h, row = (b * j->sq + i) * j->hq + hk * j->g + h;
                float *qd = T.q + r * T.dp;
                for (int64_t e = 0; e < j->d; e++)
                    qd[e] = tk_cpu_ld1(j->q, row * j->d + e, j->kind) * j->scale;
                for (int64_t e = j->d; e < T.dp; e++)
                    qd[e] = 0;
                key_range(j->wl, 0, nk - j->sq + i, nk, &T.lo[r], &T.hi[r]);
                T.lo[r] = T.lo[r] > s0 ? T.lo[r] : s0;
                T.hi[r] = T.hi[r] < s1 - 1 ? T.hi[r] : s1 - 1;
            }
        paged_src src = {j, j->tab + b * j->mb, hk};
        rows_run(&T, paged_row, &src, j->ckind, j->avx2, 1);
        if (j->nseg > 1) {
            part_store(j, &T, it);
            continue;
        }
        for (int64_t i = 0; i < j->sq; i++)
            for (int64_t h = 0; h < j->g; h++) {
                int64_t r = i * j->g + h, qh = hk * j->g + h, row = (b * j->sq + i) * j->hq + qh;
                float lse;
                rows_store(&T, r, j->out, row * j->d, j->kind, &lse);
                if (j->lse) /* [B, Hq, Sq] */
                    j->lse[(b * j->hq + qh) * j->sq + i] = lse;
            }
    }
}

static int fits_decode(const tk_op_call *c)
{
    const tk_tensor *q = c->t[D_Q], *kc = c->t[D_KC], *bt = c->t[D_BT];
    int ck = tk_cpu_kind(kc->dtype);
    if (c->t[D_ALIBI] || c->t[D_KS] || tk_cpu_kind(q->dtype) < 0 || tk_cpu_kind(q->dtype) == K_I8 || ck < 0 ||
        ck == K_I8)
        return 0; /* float caches: q's dtype, or f16/bf16 under f32 q (the op's checks) */
    int64_t d = q->shape[3], g = q->shape[2] / kc->shape[2], sq = q->shape[1];
    if (d > MAX_DP || g * sq > MAX_G * BQ)
        return 0;
    /* the reference's check_pages: seq_lens and the used block ids in range */
    const int32_t *tab = tk_ops__base(bt), *lens = tk_ops__base(c->t[D_SL]);
    int64_t nb = kc->shape[0], bs = kc->shape[1], mb = bt->shape[1];
    for (int64_t s = 0; s < bt->shape[0]; s++) {
        if (lens[s] < 0 || lens[s] > mb * bs)
            return 0;
        for (int64_t lb = 0; lb * bs < lens[s]; lb++)
            if (tab[s * mb + lb] < 0 || tab[s * mb + lb] >= nb)
                return 0;
    }
    return 1;
}

/* Fewer (sequence, KV head) pairs than SPLIT_TASKS leave threads idle while one runs two (SmolLM2's 3 KV
 * heads on 2 threads: the step waits for 2 of the 3): each pair's keys are then cut into up to
 * SPLIT_TASKS / pairs segments of at least BK keys, whose partial results part_combine joins. The cut
 * depends on the shapes alone, never on the thread count, so every thread count computes the same
 * values. */
static int split_keys(dec_t *j, int64_t work)
{
    int64_t pairs = j->b * j->hkv, maxk = 0;
    for (int64_t s = 0; s < j->b; s++)
        maxk = j->lens[s] > maxk ? j->lens[s] : maxk;
    j->nseg = 1;
    j->segk = maxk;
    j->part = NULL;
    if (pairs >= SPLIT_TASKS || work < (1 << 15))
        return TK_OK;
    int64_t nseg = (SPLIT_TASKS + pairs - 1) / pairs;
    nseg = nseg < maxk / BK ? nseg : maxk / BK;
    if (nseg < 2)
        return TK_OK;
    int64_t R = j->sq * j->g, ps = PART_HEAD + (j->d + 7) / 8 * 8;
    if (!(j->part = malloc((size_t)(pairs * nseg * R * ps) * sizeof(float))))
        return TK_ERR_NOMEM;
    j->nseg = nseg;
    j->segk = (maxk + nseg - 1) / nseg;
    return TK_OK;
}

static int run_decode(const tk_op_call *c, int avx2)
{
    const tk_tensor *q = c->t[D_Q], *kc = c->t[D_KC];
    int64_t b = q->shape[0], d = q->shape[3];
    dec_t j = {tk_ops__base(q),
               tk_ops__base(c->t[D_OUT]),
               tk_ops__base(kc),
               tk_ops__base(c->t[D_VC]),
               c->t[D_LSE] ? tk_ops__base(c->t[D_LSE]) : NULL,
               tk_ops__base(c->t[D_BT]),
               tk_ops__base(c->t[D_SL]),
               tk_cpu_kind(q->dtype),
               tk_cpu_kind(kc->dtype),
               b,
               q->shape[1],
               q->shape[2],
               kc->shape[2],
               d,
               q->shape[2] / kc->shape[2],
               kc->shape[1],
               c->t[D_BT]->shape[1],
               0,
               c->i[D_WL],
               avx2,
               0,
               0.0f,
               1,
               0,
               NULL};
    j.scale = (float)(c->f[D_SCALE] != 0 ? c->f[D_SCALE] : 1.0 / sqrt((double)d));
    j.cap = (float)c->f[D_SOFTCAP];
    int64_t keys = 0;
    for (int64_t s = 0; s < b; s++)
        keys += j.lens[s];
    /* the pool's threads spin between a decode step's ops, so a kv head is worth handing out from about
     * 32k multiply-adds (2^18 before: SmolLM2's 3 kv heads ran on one thread below 455 keys; 2 threads,
     * 400 new tokens in bf16: 108.3 -> 109.2 tokens/s, 4 of 6 alternations) */
    int64_t work = keys * j.hq * j.sq * d;
    int rc = split_keys(&j, work);
    if (rc != TK_OK)
        return tk__err(rc, "%s: out of memory for the split keys' partial results", c->op->name);
    tk_ops__parallel_for(b * j.hkv * j.nseg, 1, work < (1 << 15) ? 1 : 0, dec_range, &j);
    float acc[MAX_DP];
    for (int64_t bh = 0; j.nseg > 1 && !j.nomem && bh < b * j.hkv; bh++)
        part_combine(&j, bh, acc);
    free(j.part);
    if (j.nomem)
        return tk__err(TK_ERR_NOMEM, "%s: out of memory for a thread's blocks", c->op->name);
    return TK_OK;
}

static int run_attention_c(const tk_op_call *c) { return run_attention(c, 0); }
static int run_decode_c(const tk_op_call *c) { return run_decode(c, 0); }
#if TK_CPU_X86
static int run_attention_avx2(const tk_op_call *c) { return run_attention(c, 1); }
static int run_decode_avx2(const tk_op_call *c) { return run_decode(c, 1); }
#endif

const tk_cpu_impl tk_ops__cpu_attn_impls[] = {
#if TK_CPU_X86
    {"attention", "cpu-avx2", TK_CPU_X86_AVX2, fits_attention, run_attention_avx2,
     "f32 flash-style blocks (online softmax, GQA heads share each K/V chunk, softcap); no ALiBi"},
    {"attention_decode", "cpu-avx2", TK_CPU_X86_AVX2, fits_decode, run_decode_avx2,
     "the same over the paged cache, its rows read in place (f32/f16/bf16 caches, 16-bit under f32 q)"},
#endif
    {"attention", "cpu-portable", 0, fits_attention, run_attention_c, "the same blocking in plain C"},
    {"attention_decode", "cpu-portable", 0, fits_decode, run_decode_c, "the same blocking in plain C"},
};
const size_t tk_ops__cpu_attn_count = sizeof tk_ops__cpu_attn_impls / sizeof tk_ops__cpu_attn_impls[0];
