/*
 * cpu_linear.c — fast CPU implementations of linear (f32, f16 and bf16 weights) and casted_linear (i8
 * weights with a per-row scale), beside the references of ops/layers.c and ops/casted.c.
 *
 *   GEMV (M <= 4 rows of x: decode)  each weight row is read once, straight from its own dtype (f16
 *        and bf16 widened to f32 in registers, i8 widened and scaled at the end), dotted with the M
 *        rows of x in f32; the rows are split over the pool's threads. Memory-bound: the weight is the
 *        whole traffic. transposed=1 (GPT-2's [K, N]) reads the weight row by row the same way.
 *   In-place tiles (AVX2, 4 < M <= 32: short prefills)  no packing: a register tile of 4 rows of x by
 *        3 weight rows, the weight read where it is (widened in registers) once per call, each loaded
 *        weight vector used for 4 rows of x; dot products summed across lanes once per tile.
 *   GEMV groups (portable, 4 < M <= 6)  the GEMV over each range of weight rows for every group of up
 *        to 4 rows of x: the weight is read from memory once, later groups find it cached.
 *   In-place-weight GEMM (AVX2: f32 weights past M = 8, 16-bit and i8 weights past M = 32)  the weight
 *        is the broadcast side, read where it is (6 rows at a time, each a sequential stream; 16-bit and
 *        i8 rows widened a depth block at a time), x packed once into 16-row panels; no weight
 *        packing, tasks of equal size (below, "AVX2 GEMM with the weight in place").
 *   GEMM (M > 6 portable, transposed weights past M = 4, and TK_CPU_WT=0: prefill)  blocked as BLIS blocks it: x packed once
 *        into 6-row panels (f32); per task (a block of MC rows and NC columns) the weight is packed KC
 *        deep into 16-column panels, widened to f32 on the way (so 16-bit and i8 weights cost one
 *        conversion per weight element and row block), and a 6x16 register tile of FMAs accumulates
 *        over K. Tasks go to the pool.
 *
 * Numerics: products and sums in f32 (the references sum in f32 too, through OpenBLAS or in 8 lanes),
 * in a different order, so results differ from the reference by a few f32 roundings of the sum; bias
 * (and the i8 scale) added in f32; the result rounded once to the output dtype. The portable entries
 * compute the same way in plain C (any architecture).
 *
 * They take contiguous rows (unit stride in the last dimension, evenly spaced rows) of x, out and the
 * weight; anything else runs the reference.
 */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/cpu.h"
#include "ops/cpu_simd.h"

#define GEMV_MAX_M 4  /* rows of x a GEMV takes; more go to the GEMM */
#define GROUPS_MAX_M 6 /* rows of x the GEMV takes in groups of GEMV_MAX_M (one pass over the weight) */
#define MR 6          /* GEMM register tile: MR rows of x ... */
#define NR 16         /* ... by NR output columns */
#define KC 256        /* depth of a packed block */
#define MC_MAX 144    /* rows of x per task (a multiple of MR and of BMR) */
#define NC 128        /* output columns per task at most (a multiple of NR); 64 when that gives too few tasks */
/* GEMV: bytes of weight rows per range handed to the pool. Each range is one stream from memory; 128 KiB
 * ranges decoded SmolLM2-135M in f32 with 2 threads at 51 tokens/s against 40 with 32 KiB ones (Zen 4
 * dev machine, 5 alternations, medians; bf16 47 against 41), 1 MiB no faster: a range's stream pays the
 * prefetchers' ramp-up again. A thread the OS delays still holds up a call by one range (~5 us). */
#define GEMV_GRAIN 131072

/* One linear call as the kernels see it: out[m, n] = scale[n] * sum_k x[m, k] w[n, k] + bias[n]. */
typedef struct {
    const void *x;
    int64_t ldx;
    int xk;
    void *out;
    int64_t ldo;
    int ok;
    const void *w;
    int64_t ldw; /* elements between weight rows (transposed: between rows of [K, N]) */
    int wk;
    int trans;
    const void *bias; /* NULL: none */
    int bk;
    const float *scale; /* i8: per output row of the weight; NULL: 1 */
    int64_t m, n, k;
    int avx2;
    /* GEMM */
    float *ap; /* packed x: ceil(m / MR) panels of [k][MR] */
    int64_t mc, nmb, nnb, nc;
} lin_t;

/* ---- fits ---------------------------------------------------------------------------------------- */

static int weight_rows(const tk_tensor *w, int64_t *ld)
{
    /* [R, C] with unit column stride */
    if (!w->strides) {
        *ld = w->shape[1];
        return 1;
    }
    if (w->shape[1] > 1 && w->strides[1] != 1)
        return 0;
    *ld = w->shape[0] > 1 ? w->strides[0] : w->shape[1];
    return *ld >= w->shape[1];
}

static int setup(lin_t *L, const tk_op_call *c, int casted)
{
    const tk_tensor *out = c->t[0], *x = c->t[1], *w = c->t[2];
    const tk_tensor *b = c->t[casted ? 4 : 3];
    memset(L, 0, sizeof *L);
    if (!tk_ops__cpu_rows(x, &L->ldx) || !tk_ops__cpu_rows(out, &L->ldo) || !weight_rows(w, &L->ldw))
        return 0;
    if (b && b->strides && b->shape[0] > 1 && b->strides[0] != 1)
        return 0;
    L->trans = casted ? 0 : c->i[4] != 0;
    L->xk = tk_cpu_kind(x->dtype);
    L->ok = tk_cpu_kind(out->dtype);
    L->wk = tk_cpu_kind(w->dtype);
    if (L->wk < 0 || L->xk < 0 || L->ok < 0 || (casted && L->wk != K_I8))
        return 0;
    if (casted) {
        const tk_tensor *s = c->t[3];
        if (s->strides && s->shape[0] > 1 && s->strides[0] != 1)
            return 0;
        L->scale = tk_ops__base(s);
    }
    L->x = tk_ops__base(x);
    L->out = tk_ops__base(out);
    L->w = tk_ops__base(w);
    L->bias = b ? tk_ops__base(b) : NULL;
    L->bk = b ? tk_cpu_kind(b->dtype) : K_F32;
    L->m = tk_ops__cpu_nrows(x);
    L->n = w->shape[L->trans ? 1 : 0];
    L->k = w->shape[L->trans ? 0 : 1];
    return 1;
}

static int fits_linear(const tk_op_call *c)
{
    lin_t L;
    return setup(&L, c, 0);
}

static int fits_casted(const tk_op_call *c)
{
    lin_t L;
    return setup(&L, c, 1);
}

/* out[i, n] = v * scale[n] + bias[n], rounded to out's dtype. */
static inline __attribute__((always_inline)) void put1(const lin_t *L, int64_t i, int64_t n, float v)
{
    if (L->scale)
        v *= L->scale[n];
    if (L->bias)
        v += tk_cpu_ld1(L->bias, n, L->bk);
    tk_cpu_st1(L->out, i * L->ldo + n, L->ok, v);
}

/* x rows as dense f32 [m][k] (its own memory when it is f32 already): scratch slot 0. */
static const float *x_f32(const lin_t *L, int64_t *ld)
{
    if (L->xk == K_F32) {
        *ld = L->ldx;
        return L->x;
    }
    float *buf = tk_ops__cpu_scratch(0, (size_t)(L->m * L->k) * sizeof(float) + 64);
    if (!buf)
        return NULL;
    for (int64_t i = 0; i < L->m; i++)
        for (int64_t e = 0; e < L->k; e++)
            buf[i * L->k + e] = tk_cpu_ld1(L->x, i * L->ldx + e, L->xk);
    *ld = L->k;
    return buf;
}

/* ---- GEMV: portable ------------------------------------------------------------------------------ */

typedef struct {
    const lin_t *L;
    const float *xf;
    int64_t ldxf;
} gemv_job;

static void gemv_range_c(void *arg, int64_t lo, int64_t hi)
{
    const gemv_job *j = arg;
    const lin_t *L = j->L;
    for (int64_t n = lo; n < hi; n++) {
        const char *wr = (const char *)L->w + (size_t)(n * L->ldw) * tk_cpu_kind_size(L->wk);
        for (int64_t i = 0; i < L->m; i++) {
            const float *xr = j->xf + i * j->ldxf;
            float p[8] = {0};
            int64_t e = 0;
            for (; e + 8 <= L->k; e += 8)
                for (int l = 0; l < 8; l++)
                    p[l] += xr[e + l] * tk_cpu_ld1(wr, e + l, L->wk);
            for (int l = 0; e < L->k; e++, l++)
                p[l] += xr[e] * tk_cpu_ld1(wr, e, L->wk);
            put1(L, i, n, ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7])));
        }
    }
}

/* transposed: columns [lo, hi) of y = x @ w, w [K, N]; y accumulated in a stack strip */
#define TSTRIP 256
static void gemvt_range_c(void *arg, int64_t lo, int64_t hi)
{
    const gemv_job *j = arg;
    const lin_t *L = j->L;
    float acc[GEMV_MAX_M][TSTRIP];
    for (int64_t n0 = lo; n0 < hi; n0 += TSTRIP) {
        int64_t nn = hi - n0 < TSTRIP ? hi - n0 : TSTRIP;
        for (int64_t i = 0; i < L->m; i++)
            memset(acc[i], 0, sizeof acc[i]);
        for (int64_t e = 0; e < L->k; e++) {
            const char *wr = (const char *)L->w + (size_t)(e * L->ldw + n0) * tk_cpu_kind_size(L->wk);
            for (int64_t i = 0; i < L->m; i++) {
                float xv = j->xf[i * j->ldxf + e];
                for (int64_t t = 0; t < nn; t++)
                    acc[i][t] += xv * tk_cpu_ld1(wr, t, L->wk);
            }
        }
        for (int64_t i = 0; i < L->m; i++)
            for (int64_t t = 0; t < nn; t++)
                put1(L, i, n0 + t, acc[i][t]);
    }
}

/* ---- GEMV: AVX2 ---------------------------------------------------------------------------------- */

#if TK_CPU_X86
/* GEMV: bytes ahead of the weight read that each step prefetches (0: none), for weights of kind wk. The
 * weight streams from memory once per call. On a Zen 3 VM (no AVX-512) a software prefetch 4 KiB ahead
 * read the 113 MB f32 LM head of SmolLM-135M about 10% faster than the hardware prefetcher alone (one
 * thread, bench/cpu_ops). On a Zen 4 VM (AVX-512; SmolLM2-135M decode, medians of 3-4, 2026-11-28) it
 * slowed f32 (one thread 35.1 tokens/s with 4 KiB against 43.6 with none; two 48.1 against 53.3) and
 * still helped the weights widened in registers (bf16 68.9 against 62.9 and 87.9 against 76.9; int8
 * 105.5 against 84.0 and 137.9 against 119.9), whose loop spends longer per byte. Once the 16-bit and i8
 * rows ran in four chains (gemv_row4), the same VM (medians of 5 alternations, 2026-11-28, 17:30-17:50
 * UTC) decoded 16-bit faster with none: bf16 66.5 against 62.6 tokens/s on one thread, 91.6 against 88.0
 * on two; f16 69.3 against 60.1 and 93.4 against 88.5 (every alternation), while i8 still gained on two
 * threads (167.3 against 157.8; one thread level, 126.6 against 125.5). Two machines measured: on a CPU
 * with AVX-512, f32 and 16-bit weights get none and i8 4 KiB; without it, everything 4 KiB. */
static int64_t gemv_pf(int wk)
{
    static int avx512 = -1;
    int v = __atomic_load_n(&avx512, __ATOMIC_RELAXED);
    if (v < 0) {
        v = (tk_ops__cpu_features() & TK_CPU_AVX512F) != 0;
        __atomic_store_n(&avx512, v, __ATOMIC_RELAXED);
    }
    return v && wk != K_I8 ? 0 : 4096;
}

/* One weight row against M rows of x: 16 columns a step, two accumulators a row. */
TK_AVX2_INLINE void gemv_row_avx2(int M, int wk, int64_t pf, const void *wr, const float *xf, int64_t ldx, int64_t k,
                                  float *dst)
{
    __m256 a0[GEMV_MAX_M], a1[GEMV_MAX_M];
    for (int i = 0; i < M; i++)
        a0[i] = a1[i] = _mm256_setzero_ps();
    int64_t e = 0;
    for (; e + 16 <= k; e += 16) {
        if (pf)
            _mm_prefetch((const char *)wr + e * (int64_t)tk_cpu_kind_size(wk) + pf, _MM_HINT_T0);
        __m256 w0 = tk_ld8(wr, e, wk), w1 = tk_ld8(wr, e + 8, wk);
        for (int i = 0; i < M; i++) {
            a0[i] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xf + i * ldx + e), a0[i]);
            a1[i] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xf + i * ldx + e + 8), a1[i]);
        }
    }
    if (e + 8 <= k) {
        __m256 w0 = tk_ld8(wr, e, wk);
        for (int i = 0; i < M; i++)
            a0[i] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xf + i * ldx + e), a0[i]);
        e += 8;
    }
    if (e < k) {
        int r = (int)(k - e);
        __m256 w0 = tk_ld8_part(wr, e, wk, r);
        for (int i = 0; i < M; i++)
            a1[i] = _mm256_fmadd_ps(w0, tk_ld8_part(xf + i * ldx, e, K_F32, r), a1[i]);
    }
    for (int i = 0; i < M; i++)
        dst[i] = tk_hsum8(_mm256_add_ps(a0[i], a1[i]));
}

/* One 16-bit or i8 weight row against one row of x (decode), 32 columns a step in four accumulators.
 * Those weights are a half and a quarter of f32's bytes, and each is widened in a register, so one
 * thread's GEMV waits on its FMA chains more than f32's does. Two chains (gemv_row_avx2) against four,
 * SmolLM2-135M decode, medians of 5 alternations, Zen 4, 2026-11-28: --quant int8 96.5 -> 107.4
 * tokens/s on one thread, 130.2 -> 142.0 on two; bf16 49.5 -> 58.3 and 77.0 -> 81.3 with two prefetches
 * a 64-byte step (one a step was slower than two chains: 5 of 5 alternations; since then none on a CPU
 * with AVX-512 measured faster still: gemv_pf). f32 weights measured the same either way and keep two. */
TK_AVX2_INLINE float gemv_row4(int wk, int64_t pf, const void *wr, const float *x, int64_t k)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    const int64_t es = (int64_t)tk_cpu_kind_size(wk);
    int64_t e = 0;
    for (; e + 32 <= k; e += 32) {
        if (pf) /* a 16-bit step is a whole line: the next one too */
            _mm_prefetch((const char *)wr + e * es + pf, _MM_HINT_T0);
        if (pf && es > 1)
            _mm_prefetch((const char *)wr + e * es + pf + 64, _MM_HINT_T0);
        a0 = _mm256_fmadd_ps(tk_ld8(wr, e, wk), _mm256_loadu_ps(x + e), a0);
        a1 = _mm256_fmadd_ps(tk_ld8(wr, e + 8, wk), _mm256_loadu_ps(x + e + 8), a1);
        a2 = _mm256_fmadd_ps(tk_ld8(wr, e + 16, wk), _mm256_loadu_ps(x + e + 16), a2);
        a3 = _mm256_fmadd_ps(tk_ld8(wr, e + 24, wk), _mm256_loadu_ps(x + e + 24), a3);
    }
    for (; e + 8 <= k; e += 8)
        a0 = _mm256_fmadd_ps(tk_ld8(wr, e, wk), _mm256_loadu_ps(x + e), a0);
    if (e < k) {
        int r = (int)(k - e);
        a1 = _mm256_fmadd_ps(tk_ld8_part(wr, e, wk, r), tk_ld8_part(x, e, K_F32, r), a1);
    }
    return tk_hsum8(_mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3)));
}

TK_AVX2_INLINE void gemv_rows_avx2(int M, int wk, const gemv_job *j, int64_t lo, int64_t hi)
{
    const lin_t *L = j->L;
    size_t es = tk_cpu_kind_size(wk);
    const int64_t pf = gemv_pf(wk);
    if (M == 1 && wk != K_F32) {
        for (int64_t n = lo; n < hi; n++)
            put1(L, 0, n, gemv_row4(wk, pf, (const char *)L->w + (size_t)(n * L->ldw) * es, j->xf, L->k));
        return;
    }
    for (int64_t n = lo; n < hi; n++) {
        float y[GEMV_MAX_M];
        gemv_row_avx2(M, wk, pf, (const char *)L->w + (size_t)(n * L->ldw) * es, j->xf, j->ldxf, L->k, y);
        for (int i = 0; i < M; i++)
            put1(L, i, n, y[i]);
    }
}

#define GEMV_INST(M, WK, NAME)                                                                                         \
    TK_AVX2 static void NAME(const gemv_job *j, int64_t lo, int64_t hi) { gemv_rows_avx2(M, WK, j, lo, hi); }
GEMV_INST(1, K_F32, gemv_1_f32)
GEMV_INST(2, K_F32, gemv_2_f32)
GEMV_INST(3, K_F32, gemv_3_f32)
GEMV_INST(4, K_F32, gemv_4_f32)
GEMV_INST(1, K_F16, gemv_1_f16)
GEMV_INST(2, K_F16, gemv_2_f16)
GEMV_INST(3, K_F16, gemv_3_f16)
GEMV_INST(4, K_F16, gemv_4_f16)
GEMV_INST(1, K_BF16, gemv_1_bf16)
GEMV_INST(2, K_BF16, gemv_2_bf16)
GEMV_INST(3, K_BF16, gemv_3_bf16)
GEMV_INST(4, K_BF16, gemv_4_bf16)
GEMV_INST(1, K_I8, gemv_1_i8)
GEMV_INST(2, K_I8, gemv_2_i8)
GEMV_INST(3, K_I8, gemv_3_i8)
GEMV_INST(4, K_I8, gemv_4_i8)

static void (*const gemv_avx2[4][GEMV_MAX_M])(const gemv_job *, int64_t, int64_t) = {
    {gemv_1_f32, gemv_2_f32, gemv_3_f32, gemv_4_f32},
    {gemv_1_f16, gemv_2_f16, gemv_3_f16, gemv_4_f16},
    {gemv_1_bf16, gemv_2_bf16, gemv_3_bf16, gemv_4_bf16},
    {gemv_1_i8, gemv_2_i8, gemv_3_i8, gemv_4_i8},
};

static void gemv_range_avx2(void *arg, int64_t lo, int64_t hi)
{
    const gemv_job *j = arg;
    gemv_avx2[j->L->wk][j->L->m - 1](j, lo, hi);
}

TK_AVX2 static void gemvt_range_avx2(void *arg, int64_t lo, int64_t hi)
{
    const gemv_job *j = arg;
    const lin_t *L = j->L;
    size_t es = tk_cpu_kind_size(L->wk);
    float acc[GEMV_MAX_M][TSTRIP] __attribute__((aligned(32)));
    for (int64_t n0 = lo; n0 < hi; n0 += TSTRIP) {
        int64_t nn = hi - n0 < TSTRIP ? hi - n0 : TSTRIP, nv = nn / 8 * 8;
        for (int64_t i = 0; i < L->m; i++)
            memset(acc[i], 0, sizeof acc[i]);
        for (int64_t e = 0; e < L->k; e++) {
            const char *wr = (const char *)L->w + (size_t)(e * L->ldw + n0) * es;
            for (int64_t i = 0; i < L->m; i++) {
                __m256 xv = _mm256_set1_ps(j->xf[i * j->ldxf + e]);
                int64_t t = 0;
                for (; t < nv; t += 8)
                    _mm256_store_ps(acc[i] + t, _mm256_fmadd_ps(xv, tk_ld8(wr, t, L->wk), _mm256_load_ps(acc[i] + t)));
                for (; t < nn; t++)
                    acc[i][t] += j->xf[i * j->ldxf + e] * tk_cpu_ld1(wr, t, L->wk);
            }
        }
        for (int64_t i = 0; i < L->m; i++)
            for (int64_t t = 0; t < nn; t++)
                put1(L, i, n0 + t, acc[i][t]);
    }
}
#endif

/* Rows of the weight per range: GEMV_GRAIN bytes of it, less where that would give fewer than two
 * ranges a thread (a small weight on many cores), not under 16 KiB, at least 8 rows; then evened out so
 * the ranges are of one size and their count a multiple of the threads. Every thread then gets the same
 * number of bytes: 128 KiB ranges left SmolLM2's 576 x 576 bf16 q_proj and o_proj in 5 full ranges and
 * a sliver, so on 2 threads one read 3 while the other waited (about 7 us a call, 60 calls a token). */
static int64_t gemv_grain(const lin_t *L)
{
    int64_t row = L->k * (int64_t)tk_cpu_kind_size(L->wk), t = tk_ops__threads();
    int64_t bytes = GEMV_GRAIN, spread = L->n * row / (2 * t);
    if (spread < bytes)
        bytes = spread > 16384 ? spread : 16384;
    int64_t g = row > 0 ? (bytes + row - 1) / row : 64;
    g = g < 8 ? 8 : g;
    int64_t ranges = (L->n + g - 1) / g;
    ranges = (ranges + t - 1) / t * t;
    int64_t even = (L->n + ranges - 1) / ranges;
    return even < 8 ? 8 : even;
}

static int run_gemv(const lin_t *L)
{
    gemv_job j = {L, NULL, 0};
    if (!(j.xf = x_f32(L, &j.ldxf)))
        return tk__err(TK_ERR_NOMEM, "linear: out of memory for x as f32");
    int64_t bytes = L->n * L->k * (int64_t)tk_cpu_kind_size(L->wk);
    int nt = bytes < (1 << 16) ? 1 : 0;
    void (*fn)(void *, int64_t, int64_t);
#if TK_CPU_X86
    if (L->avx2)
        fn = L->trans ? gemvt_range_avx2 : gemv_range_avx2;
    else
#endif
        fn = L->trans ? gemvt_range_c : gemv_range_c;
    int64_t grain = L->trans ? 64 : gemv_grain(L);
    tk_ops__parallel_for(L->n, grain, nt, fn, &j);
    return TK_OK;
}

/* ---- GEMV over row groups: GEMV_MAX_M < M <= GROUPS_MAX_M ---------------------------------------- */

/* A short prefill (a chat turn, a server's fresh prompt) through the GEMM pays for packing every weight
 * block (a transposed copy of the whole weight per call) against too few rows of x to repay it: on
 * SmolLM-135M's shapes, one thread, M = 5 took about 1.3x the CPU time of the same rows run as GEMV
 * groups; at M = 8 the two were even (bench/RESULTS.md). Here each range of weight rows (at most 128 KiB of the weight, gemv_grain: within L2) is
 * read from memory once and dotted with x in groups of up to GEMV_MAX_M rows by the GEMV kernels, the
 * later groups reading it from the cache. Past GROUPS_MAX_M rows the GEMM's register tile wins. The
 * numerics are the GEMV's, row for row (transposed weights keep the GEMM). The job is the GEMV's:
 * the whole x, each group's view made per range. The AVX2 entries run the in-place tiles below instead
 * (faster); this serves cpu-portable. */

static void gemv_groups_range(void *arg, int64_t lo, int64_t hi)
{
    const gemv_job *g = arg;
    const lin_t *L = g->L;
    size_t os = tk_cpu_kind_size(L->ok);
    for (int64_t i0 = 0; i0 < L->m; i0 += GEMV_MAX_M) {
        lin_t Lg = *L;
        Lg.m = L->m - i0 < GEMV_MAX_M ? L->m - i0 : GEMV_MAX_M;
        Lg.out = (char *)L->out + (size_t)(i0 * L->ldo) * os;
        gemv_job j = {&Lg, g->xf + i0 * g->ldxf, g->ldxf};
#if TK_CPU_X86
        if (L->avx2)
            gemv_range_avx2(&j, lo, hi);
        else
#endif
            gemv_range_c(&j, lo, hi);
    }
}

static int run_gemv_groups(const lin_t *L)
{
    gemv_job g = {L, NULL, 0};
    if (!(g.xf = x_f32(L, &g.ldxf)))
        return tk__err(TK_ERR_NOMEM, "linear: out of memory for x as f32");
    int64_t bytes = L->n * L->k * (int64_t)tk_cpu_kind_size(L->wk);
    tk_ops__parallel_for(L->n, gemv_grain(L), bytes < (1 << 16) ? 1 : 0, gemv_groups_range, &g);
    return TK_OK;
}

/* ---- In-place tiles: GEMV_MAX_M < M <= TILE_MAX_M (AVX2) ------------------------------------------ */

/* A short prefill (5 to TILE_MAX_M rows of x: a chat turn, a server's fresh prompt) reads the weight
 * where it is, with no packing: the GEMM's packing (a transposed f32 copy of every weight block, per
 * call) is a cost independent of M that a few rows of x cannot repay, and the GEMV groups reload every
 * weight vector once per 4 rows of x. Here a tile of TM rows of x by TN weight rows keeps TM x TN
 * accumulators in registers: each step of 8 along K loads TN weight vectors (16-bit and i8 widened in
 * the register, as the GEMV does) and TM vectors of x, and issues TM x TN FMAs; each accumulator is
 * summed across its 8 lanes once per tile. The outer loop runs TN weight rows at a time (a few KiB,
 * in L1) over every group of TM rows of x (x stays in L1/L2), so the weight streams from memory once
 * per call; each step prefetches one line of the weight, up to TILE_PF bytes past the rows being
 * read, so the next rows are on their way while the present ones are multiplied (without it, or 4 KiB
 * ahead, 8 rows of x took 1.2-1.7x the time on the development machine). Ranges of weight rows go to
 * the pool. On SmolLM-135M's weights streamed from memory (bench/linear_small.c, one thread) this
 * takes 0.4-0.8x the GEMM's CPU time for 5 to 16 rows of x, even at 32 (f32; bf16 0.65x), and more
 * than the GEMM from 40 on, hence TILE_MAX_M (bench/RESULTS.md). A K-blocked variant (slices of
 * the weight and of x kept in L1 across the tiles) was slower here and is not kept.
 * Numerics: each dot accumulated in 8 f32 lanes along K (the GEMV: 16), the lanes summed at the end,
 * then the i8 scale and the bias in f32 and one rounding to the output dtype. */
#define TILE_MAX_M 32 /* rows of x the in-place tiles take; more go to the GEMM */
#define TM 4          /* tile: TM rows of x ... */
#define TN 3          /* ... by TN weight rows */
#define TILE_PF 16384     /* bytes ahead of the rows being read that the prefetch may run */
#define TILE_GRAIN 65536  /* bytes of weight rows per range handed to the pool */

#if TK_CPU_X86
/* Sums of each of a[0..3] across its lanes: {sum a[0], sum a[1], sum a[2], sum a[3]}. */
TK_AVX2_INLINE __m128 hsum4x8(__m256 a0, __m256 a1, __m256 a2, __m256 a3)
{
    __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

/* y[i][j] = dot(x row i, weight row j) for i < MT, j < NT; *pf: the next line to prefetch, one a step
 * while below lim. */
TK_AVX2_INLINE void tile_avx2(int MT, int NT, int wk, const char *w, size_t ldwb, const float *xf, int64_t ldx,
                              int64_t k, float y[TM][TN], const char **pf, const char *lim)
{
    __m256 acc[TM][TN];
#pragma GCC unroll 4
    for (int i = 0; i < MT; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NT; j++)
            acc[i][j] = _mm256_setzero_ps();
    const char *p = *pf;
    int64_t e = 0;
    for (; e + 8 <= k; e += 8) {
        if (p < lim) {
            _mm_prefetch(p, _MM_HINT_T0);
            p += 64;
        }
        __m256 wv[TN];
#pragma GCC unroll 4
        for (int j = 0; j < NT; j++)
            wv[j] = tk_ld8(w + j * ldwb, e, wk);
#pragma GCC unroll 4
        for (int i = 0; i < MT; i++) {
            __m256 xv = _mm256_loadu_ps(xf + i * ldx + e);
#pragma GCC unroll 4
            for (int j = 0; j < NT; j++)
                acc[i][j] = _mm256_fmadd_ps(wv[j], xv, acc[i][j]);
        }
    }
    if (e < k) {
        int r = (int)(k - e);
        __m256 wv[TN];
#pragma GCC unroll 4
        for (int j = 0; j < NT; j++)
            wv[j] = tk_ld8_part(w + j * ldwb, e, wk, r);
#pragma GCC unroll 4
        for (int i = 0; i < MT; i++) {
            __m256 xv = tk_ld8_part(xf + i * ldx, e, K_F32, r);
#pragma GCC unroll 4
            for (int j = 0; j < NT; j++)
                acc[i][j] = _mm256_fmadd_ps(wv[j], xv, acc[i][j]);
        }
    }
    *pf = p;
    if (MT == 4) {
#pragma GCC unroll 4
        for (int j = 0; j < NT; j++) {
            float s[4];
            _mm_storeu_ps(s, hsum4x8(acc[0][j], acc[1][j], acc[2][j], acc[3][j]));
            for (int i = 0; i < 4; i++)
                y[i][j] = s[i];
        }
    } else {
#pragma GCC unroll 4
        for (int i = 0; i < MT; i++)
#pragma GCC unroll 4
            for (int j = 0; j < NT; j++)
                y[i][j] = tk_hsum8(acc[i][j]);
    }
}

#define TILE_CASE(MT, NT)                                                                                              \
    case (MT - 1) * TN + NT - 1: tile_avx2(MT, NT, wk, wb, ldwb, xf, j->ldxf, L->k, y, &pf, lim); break

/* Weight rows [lo, hi) against every row of x, TN rows at a time. */
TK_AVX2_INLINE void tile_rows_avx2(int wk, const gemv_job *j, int64_t lo, int64_t hi)
{
    const lin_t *L = j->L;
    size_t ldwb = (size_t)L->ldw * tk_cpu_kind_size(wk);
    const char *pf = (const char *)L->w + (size_t)lo * ldwb, *end = (const char *)L->w + (size_t)hi * ldwb;
    for (int64_t n0 = lo; n0 < hi; n0 += TN) {
        int nt = hi - n0 < TN ? (int)(hi - n0) : TN;
        const char *wb = (const char *)L->w + (size_t)n0 * ldwb;
        /* at most TILE_PF ahead of the rows being read, never past the range */
        const char *lim = wb + (size_t)nt * ldwb + TILE_PF < end ? wb + (size_t)nt * ldwb + TILE_PF : end;
        for (int64_t i0 = 0; i0 < L->m; i0 += TM) {
            int mt = L->m - i0 < TM ? (int)(L->m - i0) : TM;
            const float *xf = j->xf + i0 * j->ldxf;
            float y[TM][TN];
            switch ((mt - 1) * TN + nt - 1) {
                TILE_CASE(1, 1);
                TILE_CASE(1, 2);
                TILE_CASE(1, 3);
                TILE_CASE(2, 1);
                TILE_CASE(2, 2);
                TILE_CASE(2, 3);
                TILE_CASE(3, 1);
                TILE_CASE(3, 2);
                TILE_CASE(3, 3);
                TILE_CASE(4, 1);
                TILE_CASE(4, 2);
                TILE_CASE(4, 3);
            }
            for (int i = 0; i < mt; i++)
                for (int t = 0; t < nt; t++)
                    put1(L, i0 + i, n0 + t, y[i][t]);
        }
    }
}
#undef TILE_CASE

#define TILE_INST(WK, NAME)                                                                                            \
    TK_AVX2 static void NAME(const gemv_job *j, int64_t lo, int64_t hi) { tile_rows_avx2(WK, j, lo, hi); }
TILE_INST(K_F32, tile_f32)
TILE_INST(K_F16, tile_f16)
TILE_INST(K_BF16, tile_bf16)
TILE_INST(K_I8, tile_i8)

static void (*const tile_avx2_kind[4])(const gemv_job *, int64_t, int64_t) = {tile_f32, tile_f16, tile_bf16, tile_i8};

static void tile_range_avx2(void *arg, int64_t lo, int64_t hi)
{
    const gemv_job *j = arg;
    tile_avx2_kind[j->L->wk](j, lo, hi);
}

static int run_tiles(const lin_t *L)
{
    gemv_job j = {L, NULL, 0};
    if (!(j.xf = x_f32(L, &j.ldxf)))
        return tk__err(TK_ERR_NOMEM, "linear: out of memory for x as f32");
    int64_t bytes = L->n * L->k * (int64_t)tk_cpu_kind_size(L->wk);
    int64_t row = L->k * (int64_t)tk_cpu_kind_size(L->wk);
    int64_t grain = row > 0 ? (TILE_GRAIN + row - 1) / row : 64;
    grain = (grain + TN - 1) / TN * TN;
    tk_ops__parallel_for(L->n, grain, bytes < (1 << 16) ? 1 : 0, tile_range_avx2, &j);
    return TK_OK;
}
#endif

/* ---- GEMV with integer dot products: i8 weights, x quantised to i8 per block of 32 ------------------ */

/* casted_linear's decode (M <= 4) as llama.cpp's Q8_0 runs it: each row of x is quantised per block of
 * QB values to i8 with its own f32 step (d_b = max |x_b| / 127, x_b ~ d_b * round(x_b / d_b)), and every
 * block of the weight row is dotted with it in integers (AVX2: vpmaddubsw of |w| and x signed by w, then
 * vpmaddwd: exact, no i16 saturation since |w| <= 128 and |x_q| <= 127), the block's i32 sum scaled by
 * d_b in f32. out[i, n] = scale[n] * sum_b d_b sum_{k in b} x_q[k] w[n, k] + bias[n].
 *
 * Numerical contract: the only departure from the reference (an f32 dot of x with the i8 weight) is the
 * rounding of x: |x - d_b x_q| <= d_b / 2 per element, so |out - ref| <= scale[n] sum_b (d_b / 2) sum_{k in
 * b} |w[n, k]| plus the f32 roundings of the reference's own tolerance (tests/test_ops_cpu.c checks that
 * bound). A row of x holding NaN or inf runs the f32 path (its row is NaN / inf as in the reference). */
#define QB 32

#if TK_CPU_X86
typedef struct {
    const lin_t *L;
    const float *xf;
    int64_t ldxf;
    const int8_t *xq; /* [m][kp] */
    const float *xd;  /* [m][kp / QB] */
    int64_t kp;
} q8_job;

/* Row i of x (f32) quantised into xq[kp] (zero past k) and xd[kp / QB]; 0 when it holds NaN or inf. */
static int quant_row_q8(const float *x, int64_t k, int64_t kp, int8_t *xq, float *xd)
{
    for (int64_t b = 0; b * QB < kp; b++) {
        int64_t e0 = b * QB, n = k - e0 < QB ? (k - e0 > 0 ? k - e0 : 0) : QB;
        float amax = 0;
        for (int64_t e = 0; e < n; e++) {
            float a = fabsf(x[e0 + e]);
            if (!(a <= 3.4e38f)) /* NaN or inf */
                return 0;
            amax = a > amax ? a : amax;
        }
        float d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
        xd[b] = d;
        for (int64_t e = 0; e < QB; e++) {
            float v = e < n ? nearbyintf(x[e0 + e] * id) : 0.0f;
            xq[e0 + e] = (int8_t)(v > 127.0f ? 127 : v < -127.0f ? -127 : v);
        }
    }
    return 1;
}

/* The 32-element block products of w (32 i8) with M quantised rows, into acc[i] scaled by the rows' d. */
TK_AVX2_INLINE void q8_block(int M, __m256i w, const int8_t *xq, int64_t kp, const float *xd, int64_t nbk, int64_t b,
                             __m256 *acc)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i aw = _mm256_abs_epi8(w); /* |-128| = 128 as an unsigned byte */
    for (int i = 0; i < M; i++) {
        __m256i x = _mm256_load_si256((const __m256i *)(xq + i * kp + b * QB));
        __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w)), ones);
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcast_ss(xd + i * nbk + b), acc[i]);
    }
}

TK_AVX2_INLINE void q8_rows_avx2(int M, const q8_job *j, int64_t lo, int64_t hi)
{
    const lin_t *L = j->L;
    int64_t k = L->k, nb = k / QB, nbk = j->kp / QB, pf = gemv_pf(K_I8);
    for (int64_t n = lo; n < hi; n++) {
        const int8_t *wr = (const int8_t *)L->w + n * L->ldw;
        __m256 a0[GEMV_MAX_M], a1[GEMV_MAX_M];
        for (int i = 0; i < M; i++)
            a0[i] = a1[i] = _mm256_setzero_ps();
        int64_t b = 0;
        for (; b + 2 <= nb; b += 2) { /* two chains of FMAs */
            if (pf)
                _mm_prefetch((const char *)wr + b * QB + pf, _MM_HINT_T0);
            q8_block(M, _mm256_loadu_si256((const __m256i *)(wr + b * QB)), j->xq, j->kp, j->xd, nbk, b, a0);
            q8_block(M, _mm256_loadu_si256((const __m256i *)(wr + b * QB + QB)), j->xq, j->kp, j->xd, nbk, b + 1, a1);
        }
        if (b < nb) {
            q8_block(M, _mm256_loadu_si256((const __m256i *)(wr + b * QB)), j->xq, j->kp, j->xd, nbk, b, a0);
            b++;
        }
        if (b * QB < k) { /* the last partial block: never read past the row */
            int8_t t[QB] __attribute__((aligned(32))) = {0};
            memcpy(t, wr + b * QB, (size_t)(k - b * QB));
            q8_block(M, _mm256_load_si256((const __m256i *)t), j->xq, j->kp, j->xd, nbk, b, a1);
        }
        for (int i = 0; i < M; i++)
            put1(L, i, n, tk_hsum8(_mm256_add_ps(a0[i], a1[i])));
    }
}

#define Q8_INST(M)                                                                                                     \
    TK_AVX2 static void q8_rows_##M(const q8_job *j, int64_t lo, int64_t hi) { q8_rows_avx2(M, j, lo, hi); }
Q8_INST(1)
Q8_INST(2)
Q8_INST(3)
Q8_INST(4)
static void (*const q8_avx2[GEMV_MAX_M])(const q8_job *, int64_t, int64_t) = {q8_rows_1, q8_rows_2, q8_rows_3,
                                                                              q8_rows_4};

static void q8_range(void *arg, int64_t lo, int64_t hi)
{
    const q8_job *j = arg;
    q8_avx2[j->L->m - 1](j, lo, hi);
}

static int run_gemv_q8(const lin_t *L)
{
    q8_job j = {L, NULL, 0, NULL, NULL, (L->k + QB - 1) / QB * QB};
    if (!(j.xf = x_f32(L, &j.ldxf)))
        return tk__err(TK_ERR_NOMEM, "casted_linear: out of memory for x as f32");
    int64_t nbk = j.kp / QB;
    int8_t *xq = tk_ops__cpu_scratch(1, (size_t)(L->m * j.kp) + (size_t)(L->m * nbk) * sizeof(float) + 64);
    if (!xq)
        return tk__err(TK_ERR_NOMEM, "casted_linear: out of memory for x quantised");
    float *xd = (float *)(xq + L->m * j.kp); /* kp is a multiple of 32: aligned */
    for (int64_t i = 0; i < L->m; i++)
        if (!quant_row_q8(j.xf + i * j.ldxf, L->k, j.kp, xq + i * j.kp, xd + i * nbk))
            return run_gemv(L); /* NaN or inf in x: the f32 path gives the reference's NaN / inf */
    j.xq = xq;
    j.xd = xd;
    int64_t bytes = L->n * L->k;
    tk_ops__parallel_for(L->n, gemv_grain(L), bytes < (1 << 16) ? 1 : 0, q8_range, &j);
    return TK_OK;
}
#endif

/* ---- GEMM ---------------------------------------------------------------------------------------- */

/* x packed into panels of MR rows: ap[p][e][r] = x[p*MR + r][e] (0 beyond m). */
typedef struct {
    const lin_t *L;
} pack_job;

static void pack_a_range(void *arg, int64_t lo, int64_t hi)
{
    const lin_t *L = ((const pack_job *)arg)->L;
    for (int64_t p = lo; p < hi; p++) {
        float *dst = L->ap + p * L->k * MR;
        for (int r = 0; r < MR; r++) {
            int64_t i = p * MR + r;
            if (i >= L->m) {
                for (int64_t e = 0; e < L->k; e++)
                    dst[e * MR + r] = 0;
                continue;
            }
            const char *src = (const char *)L->x + (size_t)(i * L->ldx) * tk_cpu_kind_size(L->xk);
            if (L->xk == K_F32)
                for (int64_t e = 0; e < L->k; e++)
                    dst[e * MR + r] = ((const float *)src)[e];
            else
                for (int64_t e = 0; e < L->k; e++)
                    dst[e * MR + r] = tk_cpu_ld1(src, e, L->xk);
        }
    }
}

/* The weight block for output columns [n0, n0 + nn) and depth [e0, e0 + kc), packed as nn/NR panels
 * (nn rounded up) of [kc][NR] f32: bp[q][e][c] = w(n0 + q*NR + c, e0 + e), 0 beyond n. */
static void pack_b_c(const lin_t *L, float *bp, int64_t n0, int64_t nn, int64_t e0, int64_t kc)
{
    size_t es = tk_cpu_kind_size(L->wk);
    for (int64_t q = 0; q * NR < nn; q++)
        for (int c = 0; c < NR; c++) {
            int64_t n = n0 + q * NR + c;
            float *dst = bp + q * kc * NR + c;
            if (q * NR + c >= nn) {
                for (int64_t e = 0; e < kc; e++)
                    dst[e * NR] = 0;
            } else if (L->trans) {
                for (int64_t e = 0; e < kc; e++)
                    dst[e * NR] = tk_cpu_ld1((const char *)L->w + (size_t)((e0 + e) * L->ldw) * es, n, L->wk);
            } else {
                const char *wr = (const char *)L->w + (size_t)(n * L->ldw + e0) * es;
                for (int64_t e = 0; e < kc; e++)
                    dst[e * NR] = tk_cpu_ld1(wr, e, L->wk);
            }
        }
}

/* c[MR][ldc] (+)= a[kc][MR] b[kc][NR] */
static void ukernel_c(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int acc)
{
    float t[MR][NR];
    memset(t, 0, sizeof t);
    for (int64_t e = 0; e < kc; e++)
        for (int r = 0; r < MR; r++) {
            float av = a[e * MR + r];
            for (int q = 0; q < NR; q++)
                t[r][q] += av * b[e * NR + q];
        }
    for (int r = 0; r < MR; r++)
        for (int q = 0; q < NR; q++)
            c[r * ldc + q] = acc ? c[r * ldc + q] + t[r][q] : t[r][q];
}

#if TK_CPU_X86
/* Eight rows (src: each row's start; elements e0 .. e0 + n) transposed into dst[e * 16 + c], rows
 * c >= valid as zeros: a half of one 16-wide panel, for both GEMMs' packing. */
TK_AVX2_INLINE void pack8_rows(float *dst, const char *const *src, int valid, int kind, int64_t e0, int64_t n)
{
    int64_t e = 0;
    for (; e + 8 <= n; e += 8) {
        __m256 r[8];
        for (int c = 0; c < 8; c++)
            r[c] = c < valid ? tk_ld8(src[c], e0 + e, kind) : _mm256_setzero_ps();
        tk_tr8x8(r);
        for (int t = 0; t < 8; t++)
            _mm256_storeu_ps(dst + (e + t) * 16, r[t]);
    }
    for (; e < n; e++)
        for (int c = 0; c < 8; c++)
            dst[e * 16 + c] = c < valid ? tk_cpu_ld1(src[c], e0 + e, kind) : 0.0f;
}

TK_AVX2 static void pack_b_avx2(const lin_t *L, float *bp, int64_t n0, int64_t nn, int64_t e0, int64_t kc)
{
    if (L->trans) { /* rows of [K, N] are already NR-wide runs of columns */
        size_t es = tk_cpu_kind_size(L->wk);
        for (int64_t q = 0; q * NR < nn; q++) {
            int64_t c0 = q * NR, cn = nn - c0 < NR ? nn - c0 : NR;
            for (int64_t e = 0; e < kc; e++) {
                const char *wr = (const char *)L->w + (size_t)((e0 + e) * L->ldw + n0 + c0) * es;
                float *dst = bp + (q * kc + e) * NR;
                if (cn == NR) {
                    _mm256_storeu_ps(dst, tk_ld8(wr, 0, L->wk));
                    _mm256_storeu_ps(dst + 8, tk_ld8(wr, 8, L->wk));
                } else {
                    _mm256_storeu_ps(dst, tk_ld8_part(wr, 0, L->wk, cn < 8 ? (int)cn : 8));
                    _mm256_storeu_ps(dst + 8, tk_ld8_part(wr, 8, L->wk, cn > 8 ? (int)cn - 8 : 0));
                }
            }
        }
        return;
    }
    size_t es = tk_cpu_kind_size(L->wk);
    for (int64_t q = 0; q * NR < nn; q++)
        for (int h = 0; h < 2; h++) {
            int64_t c0 = q * NR + h * 8, valid = nn - c0 < 8 ? nn - c0 : 8;
            const char *wr[8];
            for (int c = 0; c < 8; c++) /* rows past nn point at the last one and are packed as zeros */
                wr[c] = (const char *)L->w + (size_t)((n0 + c0 + (c < valid ? c : valid - 1)) * L->ldw) * es;
            pack8_rows(bp + q * kc * NR + h * 8, wr, (int)valid, L->wk, e0, kc);
        }
}

/* The 6x16 register tile both f32 GEMMs run: c[6][ldc] (+)= sum over kc steps of 6 broadcast scalars
 * (row r's at p[r] + e * ps) times 16 floats of b (b + e * 16). ps is a constant in each caller (the
 * packed x panel's 6, a weight row's 1), so the compiler folds it into the addresses. */
TK_AVX2_INLINE void tile6x16(int64_t kc, const float *const *p, const int64_t ps, const float *b, float *c, int64_t ldc,
                             int acc)
{
    const float *p0 = p[0], *p1 = p[1], *p2 = p[2], *p3 = p[3], *p4 = p[4], *p5 = p[5];
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00,
           c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    for (int64_t e = 0; e < kc; e++, b += 16) {
        __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8), av;
        av = _mm256_broadcast_ss(p0 + e * ps);
        c00 = _mm256_fmadd_ps(av, b0, c00);
        c01 = _mm256_fmadd_ps(av, b1, c01);
        av = _mm256_broadcast_ss(p1 + e * ps);
        c10 = _mm256_fmadd_ps(av, b0, c10);
        c11 = _mm256_fmadd_ps(av, b1, c11);
        av = _mm256_broadcast_ss(p2 + e * ps);
        c20 = _mm256_fmadd_ps(av, b0, c20);
        c21 = _mm256_fmadd_ps(av, b1, c21);
        av = _mm256_broadcast_ss(p3 + e * ps);
        c30 = _mm256_fmadd_ps(av, b0, c30);
        c31 = _mm256_fmadd_ps(av, b1, c31);
        av = _mm256_broadcast_ss(p4 + e * ps);
        c40 = _mm256_fmadd_ps(av, b0, c40);
        c41 = _mm256_fmadd_ps(av, b1, c41);
        av = _mm256_broadcast_ss(p5 + e * ps);
        c50 = _mm256_fmadd_ps(av, b0, c50);
        c51 = _mm256_fmadd_ps(av, b1, c51);
    }
#define ST(r, v0, v1)                                                                                                  \
    do {                                                                                                               \
        float *cr = c + (r) * ldc;                                                                                     \
        if (acc) {                                                                                                     \
            v0 = _mm256_add_ps(v0, _mm256_load_ps(cr));                                                                \
            v1 = _mm256_add_ps(v1, _mm256_load_ps(cr + 8));                                                            \
        }                                                                                                              \
        _mm256_store_ps(cr, v0);                                                                                       \
        _mm256_store_ps(cr + 8, v1);                                                                                   \
    } while (0)
    ST(0, c00, c01);
    ST(1, c10, c11);
    ST(2, c20, c21);
    ST(3, c30, c31);
    ST(4, c40, c41);
    ST(5, c50, c51);
#undef ST
}

/* c[MR][ldc] (+)= a[kc][MR] b[kc][NR] (the packed GEMM) */
TK_AVX2 static void ukernel_avx2(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int acc)
{
    const float *p[6] = {a, a + 1, a + 2, a + 3, a + 4, a + 5};
    tile6x16(kc, p, MR, b, c, ldc, acc);
}
#endif

#if TK_CPU_X86
/* out[m0 + r, n0 + q] = ct[r][q] * scale + bias for r < mm, q < nn: eight columns a step. */
TK_AVX2 static void store_tile_avx2(const lin_t *L, const float *ct, int64_t ldc, int64_t m0, int64_t mm, int64_t n0,
                                    int64_t nn)
{
    int64_t n8 = nn / 8 * 8;
    int rem = (int)(nn - n8);
    for (int64_t r = 0; r < mm; r++) {
        const float *c = ct + r * ldc;
        int64_t o = (m0 + r) * L->ldo + n0, q = 0;
        for (; q < n8; q += 8) {
            __m256 v = _mm256_loadu_ps(c + q);
            if (L->scale)
                v = _mm256_mul_ps(v, _mm256_loadu_ps(L->scale + n0 + q));
            if (L->bias)
                v = _mm256_add_ps(v, tk_ld8(L->bias, n0 + q, L->bk));
            tk_st8(L->out, o + q, L->ok, v);
        }
        if (rem) {
            __m256 v = tk_ld8_part(c, q, K_F32, rem);
            if (L->scale)
                v = _mm256_mul_ps(v, tk_ld8_part(L->scale, n0 + q, K_F32, rem));
            if (L->bias)
                v = _mm256_add_ps(v, tk_ld8_part(L->bias, n0 + q, L->bk, rem));
            tk_st8_part(L->out, o + q, L->ok, v, rem);
        }
    }
}
#endif

/* One task: rows [m0, m0 + mc) and columns [n0, n0 + nn) of out. */
typedef struct {
    const lin_t *L;
    int nomem;
} gemm_job;

static void gemm_range(void *arg, int64_t lo, int64_t hi)
{
    gemm_job *j = arg;
    const lin_t *L = j->L;
    const int64_t nc = L->nc;
    float *bp = tk_ops__cpu_scratch(1, (size_t)(nc * KC) * sizeof(float));
    float *ct = tk_ops__cpu_scratch(2, (size_t)(L->mc * nc) * sizeof(float));
    if (!bp || !ct) {
        __atomic_store_n(&j->nomem, 1, __ATOMIC_RELAXED);
        return;
    }
    for (int64_t t = lo; t < hi; t++) {
        int64_t mb = t / L->nnb, nb = t % L->nnb;
        int64_t m0 = mb * L->mc, n0 = nb * nc;
        int64_t mm = L->m - m0 < L->mc ? L->m - m0 : L->mc, nn = L->n - n0 < nc ? L->n - n0 : nc;
        int64_t mp = (mm + MR - 1) / MR, np = (nn + NR - 1) / NR;
        for (int64_t e0 = 0; e0 < L->k; e0 += KC) {
            int64_t kc = L->k - e0 < KC ? L->k - e0 : KC;
#if TK_CPU_X86
            if (L->avx2)
                pack_b_avx2(L, bp, n0, nn, e0, kc);
            else
#endif
                pack_b_c(L, bp, n0, nn, e0, kc);
            for (int64_t q = 0; q < np; q++)
                for (int64_t p = 0; p < mp; p++) {
                    const float *a = L->ap + ((m0 / MR + p) * L->k + e0) * MR;
                    const float *b = bp + q * kc * NR;
                    float *c = ct + p * MR * nc + q * NR;
#if TK_CPU_X86
                    if (L->avx2)
                        ukernel_avx2(kc, a, b, c, nc, e0 > 0);
                    else
#endif
                        ukernel_c(kc, a, b, c, nc, e0 > 0);
                }
        }
        if (L->k == 0)
            for (int64_t r = 0; r < mm; r++)
                memset(ct + r * nc, 0, (size_t)nn * sizeof(float));
#if TK_CPU_X86
        if (L->avx2) {
            store_tile_avx2(L, ct, nc, m0, mm, n0, nn);
            continue;
        }
#endif
        for (int64_t r = 0; r < mm; r++)
            for (int64_t q = 0; q < nn; q++)
                put1(L, m0 + r, n0 + q, ct[r * nc + q]);
    }
}

/* The GEMM's tasks, run on the pool: row blocks of at most MC_MAX rows, as even as the tile's mr rows
 * allow (MC_MAX is a multiple of every mr), by blocks of NC columns, halved when that gives fewer than
 * four tasks a thread (a delayed thread then costs less). */
static int gemm_tasks(lin_t *L, int64_t mr, void (*range)(void *, int64_t, int64_t))
{
    int64_t nmb = (L->m + MC_MAX - 1) / MC_MAX;
    L->mc = ((L->m + nmb - 1) / nmb + mr - 1) / mr * mr;
    L->nmb = (L->m + L->mc - 1) / L->mc;
    L->nc = NC;
    if (L->nmb * ((L->n + NC - 1) / NC) < 4 * (int64_t)tk_ops__threads())
        L->nc = NC / 2;
    L->nnb = (L->n + L->nc - 1) / L->nc;
    gemm_job j = {L, 0};
    tk_ops__parallel_for(L->nmb * L->nnb, 1, 0, range, &j);
    if (j.nomem)
        return tk__err(TK_ERR_NOMEM, "linear: out of memory for a thread's GEMM blocks");
    return TK_OK;
}

static int run_gemm(lin_t *L)
{
    int64_t panels = (L->m + MR - 1) / MR;
    L->ap = tk_ops__cpu_scratch(0, (size_t)(panels * MR * (L->k > 0 ? L->k : 1)) * sizeof(float));
    if (!L->ap)
        return tk__err(TK_ERR_NOMEM, "linear: out of memory packing x (%lld x %lld)", (long long)L->m, (long long)L->k);
    pack_job pj = {L};
    tk_ops__parallel_for(panels, 4, 0, pack_a_range, &pj);
    return gemm_tasks(L, MR, gemm_range);
}

/* ---- AVX2 GEMM with the weight in place (prefill) --------------------------------------------------
 *
 * The GEMM above packs every weight block before using it (a transpose of the whole weight per call:
 * 10% of a 128-token prefill of SmolLM2-135M on one thread). With f32 weights the roles can swap: the
 * weight becomes the broadcast side, read where it is (WR rows, one scalar of each a step, each row a
 * sequential stream), and x the vector side, packed once per call into panels of 16 rows ([K][16]:
 * x is small). A WR x 16 tile (WR weight rows by 16 rows of x, 12 ymm accumulators) runs WKC deep;
 * within a depth block a group's rows (WR x KC floats) stay in L1 while the task's x panels stream
 * from L2. The tile is the transposed output (weight rows by rows of x), accumulated in a per-task
 * buffer and transposed once into out at the end. 16-bit and i8 weights (past TILE_MAX_M rows, where
 * the in-place tiles stop) are widened to f32 a group's depth block at a time into a small buffer the
 * tile then reads once per panel. Numerics: the same f32 products summed in k order per depth block,
 * as the packed GEMM does. */
#if TK_CPU_X86
#define WR 6          /* weight rows a tile */
#define WX 16         /* rows of x a tile (a packed panel) */
#define WG_MAX 22     /* weight groups (of WR rows) a task at most: 132 rows */
#define WT_MIN_M 8    /* f32 weights past this many rows of x take this GEMM, not the in-place tiles */
#define WKC 512       /* depth of a block at most (blocks of equal depth): a group's rows, 12 KiB, stay in L1 */

/* x packed into panels of WX rows, all of K: xp[p][e][c] = x[p*WX + c][e] (0 beyond m). */
TK_AVX2 static void pack_x16_range(void *arg, int64_t lo, int64_t hi)
{
    const lin_t *L = ((const pack_job *)arg)->L;
    size_t es = tk_cpu_kind_size(L->xk);
    for (int64_t p = lo; p < hi; p++)
        for (int h = 0; h < 2; h++) {
            int64_t r0 = p * WX + h * 8, valid = L->m - r0 < 8 ? (L->m - r0 > 0 ? L->m - r0 : 0) : 8;
            const char *xr[8];
            for (int c = 0; c < 8; c++) /* rows past m point at row m - 1 and are packed as zeros */
                xr[c] = (const char *)L->x + (size_t)((r0 + c < L->m ? r0 + c : L->m - 1) * L->ldx) * es;
            pack8_rows(L->ap + p * L->k * WX + h * 8, xr, (int)valid, L->xk, 0, L->k);
        }
}

/* c[WR][ldc] (+)= w[r][0..kc) x b[kc][WX]: w holds WR row pointers (at the block's depth). */
TK_AVX2 static void ukernel_wt(int64_t kc, const float *const *w, const float *b, float *c, int64_t ldc, int acc)
{
    tile6x16(kc, w, 1, b, c, ldc, acc);
}

/* The same over a half panel (x rows 0..7 of the panel: a last panel holding 8 rows or fewer), the
 * k steps alternating between two accumulators a row so that 12 FMA chains are in flight. */
TK_AVX2 static void ukernel_wt_half(int64_t kc, const float *const *w, const float *b, float *c, int64_t ldc, int acc)
{
    const float *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3], *w4 = w[4], *w5 = w[5];
    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;
    __m256 d0 = c0, d1 = c0, d2 = c0, d3 = c0, d4 = c0, d5 = c0;
    int64_t e = 0;
    for (; e + 2 <= kc; e += 2, b += 2 * WX) {
        __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + WX);
        c0 = _mm256_fmadd_ps(_mm256_broadcast_ss(w0 + e), b0, c0);
        d0 = _mm256_fmadd_ps(_mm256_broadcast_ss(w0 + e + 1), b1, d0);
        c1 = _mm256_fmadd_ps(_mm256_broadcast_ss(w1 + e), b0, c1);
        d1 = _mm256_fmadd_ps(_mm256_broadcast_ss(w1 + e + 1), b1, d1);
        c2 = _mm256_fmadd_ps(_mm256_broadcast_ss(w2 + e), b0, c2);
        d2 = _mm256_fmadd_ps(_mm256_broadcast_ss(w2 + e + 1), b1, d2);
        c3 = _mm256_fmadd_ps(_mm256_broadcast_ss(w3 + e), b0, c3);
        d3 = _mm256_fmadd_ps(_mm256_broadcast_ss(w3 + e + 1), b1, d3);
        c4 = _mm256_fmadd_ps(_mm256_broadcast_ss(w4 + e), b0, c4);
        d4 = _mm256_fmadd_ps(_mm256_broadcast_ss(w4 + e + 1), b1, d4);
        c5 = _mm256_fmadd_ps(_mm256_broadcast_ss(w5 + e), b0, c5);
        d5 = _mm256_fmadd_ps(_mm256_broadcast_ss(w5 + e + 1), b1, d5);
    }
    if (e < kc) {
        __m256 b0 = _mm256_load_ps(b);
        c0 = _mm256_fmadd_ps(_mm256_broadcast_ss(w0 + e), b0, c0);
        c1 = _mm256_fmadd_ps(_mm256_broadcast_ss(w1 + e), b0, c1);
        c2 = _mm256_fmadd_ps(_mm256_broadcast_ss(w2 + e), b0, c2);
        c3 = _mm256_fmadd_ps(_mm256_broadcast_ss(w3 + e), b0, c3);
        c4 = _mm256_fmadd_ps(_mm256_broadcast_ss(w4 + e), b0, c4);
        c5 = _mm256_fmadd_ps(_mm256_broadcast_ss(w5 + e), b0, c5);
    }
    __m256 v[WR] = {_mm256_add_ps(c0, d0), _mm256_add_ps(c1, d1), _mm256_add_ps(c2, d2),
                    _mm256_add_ps(c3, d3), _mm256_add_ps(c4, d4), _mm256_add_ps(c5, d5)};
    for (int r = 0; r < WR; r++) {
        float *cr = c + r * ldc;
        _mm256_store_ps(cr, acc ? _mm256_add_ps(v[r], _mm256_load_ps(cr)) : v[r]);
    }
}

/* Task t's weight rows: groups [g0, g1) of WR rows, the groups spread evenly over the row block's tasks. */
static void wt_groups(const lin_t *L, int64_t nb, int64_t *n0, int64_t *nn)
{
    int64_t G = (L->n + WR - 1) / WR, g0 = nb * G / L->nnb, g1 = (nb + 1) * G / L->nnb;
    *n0 = g0 * WR;
    *nn = (g1 * WR < L->n ? g1 * WR : L->n) - *n0;
}

/* The group's depth block [e0, e0 + kc) of its WR rows (byte pointers to the rows' starts) as f32: f32
 * rows where they are; 16-bit and i8 rows widened into wf (WR x WKC floats, per thread), 8 at a time.
 * The kernel then reads each widened value once per panel of x: the widening costs 1/panels of it. */
TK_AVX2 static void wt_block(const lin_t *L, const char *const *wr, int64_t e0, int64_t kc, float *wf, const float **we)
{
    for (int r = 0; r < WR; r++) {
        if (L->wk == K_F32) {
            we[r] = (const float *)wr[r] + e0;
            continue;
        }
        float *d = wf + r * WKC;
        int64_t e = 0;
        for (; e + 8 <= kc; e += 8)
            _mm256_storeu_ps(d + e, tk_ld8(wr[r], e0 + e, L->wk));
        if (e < kc)
            _mm256_storeu_ps(d + e, tk_ld8_part(wr[r], e0 + e, L->wk, (int)(kc - e)));
        we[r] = d;
    }
}

/* One task's tiles over rows [m0, m0 + mm) of x and weight rows [n0, n0 + nn): ct[nn][ldc] (transposed). */
TK_AVX2 static void wt_tiles(const lin_t *L, float *ct, int64_t ldc, float *wf, int64_t m0, int64_t mm, int64_t n0,
                             int64_t nn)
{
    size_t es = tk_cpu_kind_size(L->wk);
    int64_t mp = (mm + WX - 1) / WX, nkb = (L->k + WKC - 1) / WKC, kb = (L->k + nkb - 1) / nkb;
    for (int64_t g = 0; g < nn; g += WR) {
        const char *wr[WR];
        for (int r = 0; r < WR; r++) /* a short last group repeats its last row (its results unused) */
            wr[r] = (const char *)L->w + (size_t)((n0 + (g + r < nn ? g + r : nn - 1)) * L->ldw) * es;
        for (int64_t e0 = 0; e0 < L->k; e0 += kb) { /* each weight row read front to back: one stream */
            int64_t kc = L->k - e0 < kb ? L->k - e0 : kb;
            const float *we[WR];
            wt_block(L, wr, e0, kc, wf, we);
            for (int64_t p = 0; p < mp; p++) {
                const float *xp = L->ap + ((m0 / WX + p) * L->k + e0) * WX;
                if (mm - p * WX <= WX / 2) /* a last panel of 8 rows or fewer: half the FMAs */
                    ukernel_wt_half(kc, we, xp, ct + g * ldc + p * WX, ldc, e0 > 0);
                else
                    ukernel_wt(kc, we, xp, ct + g * ldc + p * WX, ldc, e0 > 0);
            }
        }
    }
}

/* out[m0 + r][n0 + q] = ct[q][r] (scale, bias, rounding as store_tile_avx2): 8 x 8 blocks transposed in
 * registers, the edges one element at a time. */
TK_AVX2 static void store_wt_avx2(const lin_t *L, const float *ct, int64_t ldc, int64_t m0, int64_t mm, int64_t n0,
                                  int64_t nn)
{
    int64_t m8 = mm / 8 * 8, n8 = nn / 8 * 8;
    for (int64_t r = 0; r < m8; r += 8)
        for (int64_t q = 0; q < n8; q += 8) {
            __m256 v[8];
            for (int i = 0; i < 8; i++)
                v[i] = _mm256_load_ps(ct + (q + i) * ldc + r);
            tk_tr8x8(v); /* v[i]: row r + i of out, columns q .. q + 7 */
            __m256 sc = L->scale ? _mm256_loadu_ps(L->scale + n0 + q) : _mm256_set1_ps(1.0f);
            __m256 bi = L->bias ? tk_ld8(L->bias, n0 + q, L->bk) : _mm256_setzero_ps();
            for (int i = 0; i < 8; i++)
                tk_st8(L->out, (m0 + r + i) * L->ldo + n0 + q, L->ok, _mm256_add_ps(_mm256_mul_ps(v[i], sc), bi));
        }
    for (int64_t r = 0; r < mm; r++)
        for (int64_t q = r < m8 ? n8 : 0; q < nn; q++)
            put1(L, m0 + r, n0 + q, ct[q * ldc + r]);
}

static void wt_range(void *arg, int64_t lo, int64_t hi)
{
    gemm_job *j = arg;
    const lin_t *L = j->L;
    int64_t ldc = (L->mc + WX - 1) / WX * WX, rows = (WG_MAX + 1) * WR;
    float *ct = tk_ops__cpu_scratch(1, (size_t)(rows * ldc) * sizeof(float));
    float *wf = L->wk == K_F32 ? NULL : tk_ops__cpu_scratch(2, (size_t)(WR * WKC + 8) * sizeof(float));
    if (!ct || (L->wk != K_F32 && !wf)) {
        __atomic_store_n(&j->nomem, 1, __ATOMIC_RELAXED);
        return;
    }
    for (int64_t t = lo; t < hi; t++) {
        int64_t mb = t / L->nnb, m0 = mb * L->mc, mm = L->m - m0 < L->mc ? L->m - m0 : L->mc, n0, nn;
        wt_groups(L, t % L->nnb, &n0, &nn);
        wt_tiles(L, ct, ldc, wf, m0, mm, n0, nn);
        store_wt_avx2(L, ct, ldc, m0, mm, n0, nn);
    }
}

/* Tasks: the row blocks (as gemm_tasks cuts them) by a multiple of the thread count of weight-row
 * blocks, each of at most WG_MAX groups, and at least two tasks a thread: equal tasks, so the threads
 * finish together (a 576-row weight on 2 threads: 6 tasks of 96 rows, where 64-column blocks gave 9). */
static int run_gemm_wt(lin_t *L)
{
    int64_t panels = (L->m + WX - 1) / WX, nt = tk_ops__threads(), G = (L->n + WR - 1) / WR, T = nt;
    L->ap = tk_ops__cpu_scratch(0, (size_t)(panels * WX * L->k) * sizeof(float));
    if (!L->ap)
        return tk__err(TK_ERR_NOMEM, "linear: out of memory packing x (%lld x %lld)", (long long)L->m, (long long)L->k);
    pack_job pj = {L};
    tk_ops__parallel_for(panels, 1, 0, pack_x16_range, &pj);
    int64_t nmb = (L->m + MC_MAX - 1) / MC_MAX;
    L->mc = ((L->m + nmb - 1) / nmb + WX - 1) / WX * WX;
    L->nmb = (L->m + L->mc - 1) / L->mc;
    while (T < G && ((G + T - 1) / T > WG_MAX || L->nmb * T < 2 * nt))
        T += nt;
    L->nnb = T < G ? T : G;
    gemm_job j = {L, 0};
    tk_ops__parallel_for(L->nmb * L->nnb, 1, 0, wt_range, &j);
    if (j.nomem)
        return tk__err(TK_ERR_NOMEM, "linear: out of memory for a thread's GEMM blocks");
    return TK_OK;
}
#endif

/* ---- AVX-512 BF16 GEMM: bf16 x and weight, M > TILE_MAX_M (prefill) -------------------------------
 *
 * vdpbf16ps multiplies pairs of bf16 and adds both products to an f32 lane: 32 products a zmm
 * instruction where the f32 FMA does 16. x and the weight are packed as 32-bit words holding a pair of
 * consecutive k (x: panels of BMR rows, ap[p][e2][r]; the weight: panels of 16 columns per depth
 * block, bp[q][e2][c]), and a BMR x 32 tile of f32 accumulators (24 zmm) takes a broadcast pair of x
 * against two panels' pairs each step. Numerics: the products of two bf16 are exact in f32; each lane
 * adds the pair's odd product, then the even one (round to nearest even, denormals flushed to zero,
 * as the instruction does), so the sum over k runs in another order than the f32 paths' and rounds as
 * often: within the linear tolerance (tests/test_ops_cpu.c). The write-out (bias, rounding) is the
 * AVX2 GEMM's. */
#if TK_CPU_X86
#define TK_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma,f16c")))
#define BMR 12  /* rows of x a tile */
#define BKC 256 /* depth of a packed block (128 pairs; even) */

/* x packed as pairs: ap[p][e2][r] = (x[p BMR + r][2 e2], x[...][2 e2 + 1]), low then high half; 0 beyond m
 * and beyond an odd k. */
static void pack_a_bf16(void *arg, int64_t lo, int64_t hi)
{
    const lin_t *L = ((const pack_job *)arg)->L;
    int64_t k2 = (L->k + 1) / 2;
    for (int64_t p = lo; p < hi; p++) {
        uint32_t *dst = (uint32_t *)L->ap + p * k2 * BMR;
        for (int r = 0; r < BMR; r++) {
            int64_t i = p * BMR + r;
            const uint16_t *src = i < L->m ? (const uint16_t *)L->x + i * L->ldx : NULL;
            for (int64_t e2 = 0; e2 < k2; e2++) {
                uint32_t a = src ? src[2 * e2] : 0, b = src && 2 * e2 + 1 < L->k ? src[2 * e2 + 1] : 0;
                dst[e2 * BMR + r] = a | b << 16;
            }
        }
    }
}

/* The weight's columns [n0, n0 + 16 np) (0 from nn on) at depth [e0, e0 + kc), e0 even, as np panels of
 * [kc2][16] pairs: bp[q][e2][c] = (w[n0 + 16 q + c][e0 + 2 e2], w[...][e0 + 2 e2 + 1]). */
static void pack_b_bf16(const lin_t *L, uint32_t *bp, int64_t n0, int64_t nn, int64_t np, int64_t e0, int64_t kc)
{
    int64_t kc2 = (kc + 1) / 2, pairs = kc / 2;
    for (int64_t q = 0; q < np; q++)
        for (int c = 0; c < 16; c++) {
            int64_t n = q * 16 + c;
            uint32_t *dst = bp + q * kc2 * 16 + c;
            if (n >= nn) {
                for (int64_t e2 = 0; e2 < kc2; e2++)
                    dst[e2 * 16] = 0;
                continue;
            }
            const uint16_t *wr = (const uint16_t *)L->w + (n0 + n) * L->ldw + e0;
            for (int64_t e2 = 0; e2 < pairs; e2++) {
                uint32_t v;
                memcpy(&v, wr + 2 * e2, sizeof v); /* little-endian: the even k in the low half */
                dst[e2 * 16] = v;
            }
            if (kc2 > pairs) /* an odd k's last element, paired with 0 */
                dst[pairs * 16] = wr[2 * pairs];
        }
}

/* c[BMR][ldc] (+)= the pairs' dot products: a [kc2][BMR], b0 and b1 [kc2][16] (columns 0-15, 16-31). */
TK_AVX512BF16 static void ukernel_bf16(int64_t kc2, const uint32_t *a, const uint32_t *b0, const uint32_t *b1, float *c,
                                       int64_t ldc, int acc)
{
    __m512 c0[BMR], c1[BMR];
#pragma GCC unroll 12
    for (int r = 0; r < BMR; r++)
        c0[r] = c1[r] = _mm512_setzero_ps();
    for (int64_t e2 = 0; e2 < kc2; e2++, a += BMR) {
        __m512bh w0 = (__m512bh)_mm512_loadu_si512(b0 + e2 * 16), w1 = (__m512bh)_mm512_loadu_si512(b1 + e2 * 16);
#pragma GCC unroll 12
        for (int r = 0; r < BMR; r++) {
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[r]);
            c0[r] = _mm512_dpbf16_ps(c0[r], av, w0);
            c1[r] = _mm512_dpbf16_ps(c1[r], av, w1);
        }
    }
#pragma GCC unroll 12
    for (int r = 0; r < BMR; r++) {
        float *cr = c + r * ldc;
        if (acc) {
            c0[r] = _mm512_add_ps(c0[r], _mm512_loadu_ps(cr));
            c1[r] = _mm512_add_ps(c1[r], _mm512_loadu_ps(cr + 16));
        }
        _mm512_storeu_ps(cr, c0[r]);
        _mm512_storeu_ps(cr + 16, c1[r]);
    }
}

static void gemm_range_bf16(void *arg, int64_t lo, int64_t hi)
{
    gemm_job *j = arg;
    const lin_t *L = j->L;
    const int64_t nc = L->nc, k2 = (L->k + 1) / 2;
    uint32_t *bp = tk_ops__cpu_scratch(1, (size_t)(nc * (BKC / 2)) * sizeof(uint32_t));
    float *ct = tk_ops__cpu_scratch(2, (size_t)(L->mc * nc) * sizeof(float));
    if (!bp || !ct) {
        __atomic_store_n(&j->nomem, 1, __ATOMIC_RELAXED);
        return;
    }
    for (int64_t t = lo; t < hi; t++) {
        int64_t mb = t / L->nnb, nb = t % L->nnb;
        int64_t m0 = mb * L->mc, n0 = nb * nc;
        int64_t mm = L->m - m0 < L->mc ? L->m - m0 : L->mc, nn = L->n - n0 < nc ? L->n - n0 : nc;
        int64_t mp = (mm + BMR - 1) / BMR, np = (nn + 31) / 32 * 2; /* 16-column panels, in pairs */
        for (int64_t e0 = 0; e0 < L->k; e0 += BKC) {
            int64_t kc = L->k - e0 < BKC ? L->k - e0 : BKC, kc2 = (kc + 1) / 2;
            pack_b_bf16(L, bp, n0, nn, np, e0, kc);
            for (int64_t q = 0; q < np; q += 2)
                for (int64_t p = 0; p < mp; p++) {
                    const uint32_t *a = (const uint32_t *)L->ap + ((m0 / BMR + p) * k2 + e0 / 2) * BMR;
                    ukernel_bf16(kc2, a, bp + q * kc2 * 16, bp + (q + 1) * kc2 * 16, ct + p * BMR * nc + q * 16, nc,
                                 e0 > 0);
                }
        }
        store_tile_avx2(L, ct, nc, m0, mm, n0, nn);
    }
}

static int run_gemm_bf16(lin_t *L)
{
    int64_t k2 = (L->k + 1) / 2, panels = (L->m + BMR - 1) / BMR;
    L->ap = tk_ops__cpu_scratch(0, (size_t)(panels * BMR * k2) * sizeof(uint32_t));
    if (!L->ap)
        return tk__err(TK_ERR_NOMEM, "linear: out of memory packing x (%lld x %lld)", (long long)L->m, (long long)L->k);
    pack_job pj = {L};
    tk_ops__parallel_for(panels, 2, 0, pack_a_bf16, &pj);
    return gemm_tasks(L, BMR, gemm_range_bf16);
}

/* Short prefills (GEMV_MAX_M < M <= TILE_MAX_M) in place, as the AVX2 tiles: a weight row's consecutive
 * bf16 are already pairs, so a zmm of 32 bf16 of a row of x and one of a weight row go straight into
 * vdpbf16ps, 16 lanes of partial sums of one dot product, added across the lanes once per tile. Tiles of
 * BTM rows of x by BTN weight rows (16 accumulators); a partial tile repeats its last row and stores
 * only the real ones; the depth's tail is a masked load (zeros). The weight is read where it is, once
 * per call; each tile's weight rows stay in L1 while the rows of x pass over them. */
#define BTM 4
#define BTN 4

TK_AVX512BF16 static void btile_range(void *arg, int64_t lo, int64_t hi)
{
    const lin_t *L = ((const gemv_job *)arg)->L;
    const int64_t K = L->k;
    for (int64_t n0 = lo; n0 < hi; n0 += BTN) {
        const uint16_t *w[BTN];
        for (int t = 0; t < BTN; t++)
            w[t] = (const uint16_t *)L->w + (n0 + t < hi ? n0 + t : hi - 1) * L->ldw;
        for (int64_t m0 = 0; m0 < L->m; m0 += BTM) {
            const uint16_t *x[BTM];
            for (int i = 0; i < BTM; i++)
                x[i] = (const uint16_t *)L->x + (m0 + i < L->m ? m0 + i : L->m - 1) * L->ldx;
            __m512 acc[BTM][BTN];
#pragma GCC unroll 16
            for (int q = 0; q < BTM * BTN; q++)
                acc[q / BTN][q % BTN] = _mm512_setzero_ps();
            for (int64_t e = 0; e < K; e += 32) {
                __mmask32 mk = K - e >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << (K - e)) - 1);
                __m512i wv[BTN], xv[BTM];
#pragma GCC unroll 4
                for (int t = 0; t < BTN; t++)
                    wv[t] = _mm512_maskz_loadu_epi16(mk, w[t] + e);
#pragma GCC unroll 4
                for (int i = 0; i < BTM; i++)
                    xv[i] = _mm512_maskz_loadu_epi16(mk, x[i] + e);
#pragma GCC unroll 16
                for (int q = 0; q < BTM * BTN; q++)
                    acc[q / BTN][q % BTN] =
                        _mm512_dpbf16_ps(acc[q / BTN][q % BTN], (__m512bh)xv[q / BTN], (__m512bh)wv[q % BTN]);
            }
            float sum[BTM * BTN]; /* the lanes added with constant indices: acc stays in registers */
#pragma GCC unroll 16
            for (int q = 0; q < BTM * BTN; q++)
                sum[q] = _mm512_reduce_add_ps(acc[q / BTN][q % BTN]);
            for (int i = 0; i < BTM && m0 + i < L->m; i++)
                for (int t = 0; t < BTN && n0 + t < hi; t++)
                    put1(L, m0 + i, n0 + t, sum[i * BTN + t]);
        }
    }
}

static int run_btiles(const lin_t *L)
{
    gemv_job j = {L, NULL, 0};
    int64_t row = L->k * 2, bytes = L->n * row;
    int64_t grain = (TILE_GRAIN + row - 1) / row;
    grain = (grain + BTN - 1) / BTN * BTN;
    tk_ops__parallel_for(L->n, grain, bytes < (1 << 16) ? 1 : 0, btile_range, &j);
    return TK_OK;
}

/* bf16 x and weight [N, K] (not transposed), more rows than the GEMV takes, some depth */
static int fits_linear_bf16(const tk_op_call *c)
{
    lin_t L;
    return setup(&L, c, 0) && !L.trans && L.xk == K_BF16 && L.wk == K_BF16 && L.m > GEMV_MAX_M && L.k > 0;
}

static int run_linear_bf16(const tk_op_call *c)
{
    lin_t L;
    if (!setup(&L, c, 0))
        return tk__err(TK_ERR_INTERNAL, "%s: the fast CPU implementation was picked for a layout it does not take",
                       c->op->name);
    L.avx2 = 1;
    if (L.n == 0)
        return TK_OK;
    return L.m <= TILE_MAX_M ? run_btiles(&L) : run_gemm_bf16(&L);
}
#endif

#if TK_CPU_X86
/* TK_CPU_WT=0: f32 weights through the packed GEMM (A/B timings) */
static int wt_off(void)
{
    const char *e = getenv("TK_CPU_WT");
    return e && !strcmp(e, "0");
}
#endif

static int run(const tk_op_call *c, int casted, int avx2)
{
    lin_t L;
    if (!setup(&L, c, casted))
        return tk__err(TK_ERR_INTERNAL, "%s: the fast CPU implementation was picked for a layout it does not take",
                       c->op->name);
    L.avx2 = avx2;
    if (L.m == 0 || L.n == 0)
        return TK_OK;
    if (L.m <= GEMV_MAX_M || L.k == 0)
        return run_gemv(&L);
#if TK_CPU_X86
    if (L.avx2 && !L.trans && L.m <= TILE_MAX_M && !(L.wk == K_F32 && L.m > WT_MIN_M && !wt_off()))
        return run_tiles(&L);
#endif
    if (L.m <= GROUPS_MAX_M && !L.trans)
        return run_gemv_groups(&L);
#if TK_CPU_X86
    if (L.avx2 && !L.trans && !wt_off())
        return run_gemm_wt(&L);
#endif
    return run_gemm(&L);
}

static int run_linear_c(const tk_op_call *c) { return run(c, 0, 0); }
static int run_casted_c(const tk_op_call *c) { return run(c, 1, 0); }
#if TK_CPU_X86
static int run_linear_avx2(const tk_op_call *c) { return run(c, 0, 1); }
static int run_casted_avx2(const tk_op_call *c) { return run(c, 1, 1); }
/* The integer-dot GEMV: decode's rows (M <= 4) with some depth, when TK_CPU_Q8=1 asks for it: it
 * quantises x, so its results leave casted_linear's contract (the reference's f32 x) by up to the
 * bound docs/cpu.md gives, and greedy tokens can differ from transformers' int8 weight-only run. */
static int fits_casted_q8(const tk_op_call *c)
{
    lin_t L;
    return tk_ops__cpu_act_quant() && setup(&L, c, 1) && L.m >= 1 && L.m <= GEMV_MAX_M && L.k > 0;
}

static int run_casted_q8(const tk_op_call *c)
{
    lin_t L;
    if (!setup(&L, c, 1))
        return tk__err(TK_ERR_INTERNAL, "%s: the fast CPU implementation was picked for a layout it does not take",
                       c->op->name);
    L.avx2 = 1;
    return L.n == 0 ? TK_OK : run_gemv_q8(&L);
}
#endif

const tk_cpu_impl tk_ops__cpu_linear_impls[] = {
#if TK_CPU_X86
    {"linear", "cpu-avx512bf16", TK_CPU_X86_AVX2 | TK_CPU_AVX512F | TK_CPU_AVX512BF16, fits_linear_bf16,
     run_linear_bf16,
     "bf16 x and weights, more than 4 rows (prefill): pairs of bf16 dotted by vdpbf16ps, f32 accumulation; "
     "in-place 4x4 tiles up to 32 rows, a packed 12x32 tile above; threaded"},
    {"linear", "cpu-avx2", TK_CPU_X86_AVX2, fits_linear, run_linear_avx2,
     "f32/f16/bf16 weights read in their dtype: GEMV (M <= 4), 4x3 in-place tiles (M <= 32; f32: M <= 8), a "
     "GEMM reading the weight in place (6x16 FMA tiles) above, the packed GEMM for transposed weights; threaded"},
    {"casted_linear", "cpu-avx2-q8", TK_CPU_X86_AVX2, fits_casted_q8, run_casted_q8,
     "decode (M <= 4): x quantised to i8 per 32 (Q8_0's activations), integer dots (vpmaddubsw), threaded; "
     "TK_CPU_Q8=1 only"},
    {"casted_linear", "cpu-avx2", TK_CPU_X86_AVX2, fits_casted, run_casted_avx2,
     "i8 weights widened in registers against f32 x: in-place tiles (M <= 32) and the in-place-weight GEMM "
     "(prefill), threaded"},
#endif
    {"linear", "cpu-portable", 0, fits_linear, run_linear_c, "the same blocking in plain C"},
    {"casted_linear", "cpu-portable", 0, fits_casted, run_casted_c, "the same blocking in plain C (i8 weights)"},
};
const size_t tk_ops__cpu_linear_count = sizeof tk_ops__cpu_linear_impls / sizeof tk_ops__cpu_linear_impls[0];
