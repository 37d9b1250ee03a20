/*
 * cpu_fused.c — fast CPU implementations of the small fused ops every decoder layer runs, beside their
 * references: rms_norm and fused_add_rms_norm (ops/norm.c), silu_and_mul and gelu_tanh_and_mul
 * (ops/activation.c) and rotary_embedding with NeoX halves (ops/rotary.c). f32, f16 and bf16, eight lanes at a time; rows are
 * split over the pool only when there are enough of them (a decode step's single row runs on the
 * calling thread: a wake-up would cost more than the row).
 *
 * Numerics, against the references: rms_norm sums x^2 in eight f32 lanes (the reference in double)
 * and computes rstd in double from that sum, then (x * rstd) * w in f32 as the reference does;
 * fused_add_rms_norm rounds x + residual to T before normalising it, as the reference does;
 * silu_and_mul uses tk_exp8 (within 2 ulp of expf); gelu_tanh_and_mul computes x / (1 + exp(-2u)),
 * the same function as the reference's 0.5 x (1 + tanhf(u)) without its cancellation for negative u
 * (the two differ by about 1e-7 |x y|); rotary computes x1*cos - x2*sin and x2*cos +
 * x1*sin with each product rounded (fp contraction off, as the reference and the kernels) and matches
 * the reference exactly.
 *
 * They take contiguous rows (unit stride in the last dimension, evenly spaced rows); anything else, and
 * out-of-range positions (the reference reports them), runs the reference.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/cpu.h"
#include "ops/cpu_simd.h"

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

/* Rows below this many elements in all run on the calling thread. */
#define SERIAL_ELEMS 16384

/* ---- rms_norm and fused_add_rms_norm ------------------------------------------------------------ */

typedef struct {
    char *out;          /* the normalised result (fused: 'input') */
    const char *in;     /* rms_norm: input; fused: the input added to the residual */
    char *res;          /* fused: the residual, updated; NULL for rms_norm */
    const char *w;
    int64_t lo, li, lr; /* row strides (elements) */
    int ko, ki, kr, kw;
    int64_t d;
    float eps;
    int avx2;
} norm_t;

static int fits_norm(const tk_op_call *c)
{
    int64_t a, b;
    const tk_tensor *w = c->t[2];
    if (!tk_ops__cpu_rows(c->t[0], &a) || !tk_ops__cpu_rows(c->t[1], &b))
        return 0;
    return !w->strides || w->shape[0] <= 1 || w->strides[0] == 1;
}

static void norm_rows_c(const norm_t *n, int64_t lo, int64_t hi)
{
    for (int64_t r = lo; r < hi; r++) {
        const char *x = n->res ? n->res : n->in;
        int64_t xo = r * (n->res ? n->lr : n->li);
        int kx = n->res ? n->kr : n->ki;
        if (n->res)
            for (int64_t e = 0; e < n->d; e++)
                tk_cpu_st1(n->res, r * n->lr + e, n->kr,
                           tk_cpu_ld1(n->in, r * n->li + e, n->ki) + tk_cpu_ld1(n->res, r * n->lr + e, n->kr));
        float p[8] = {0};
        int64_t e = 0;
        for (; e + 8 <= n->d; e += 8)
            for (int l = 0; l < 8; l++) {
                float v = tk_cpu_ld1(x, xo + e + l, kx);
                p[l] += v * v;
            }
        for (int l = 0; e < n->d; e++, l++) {
            float v = tk_cpu_ld1(x, xo + e, kx);
            p[l] += v * v;
        }
        double ss = 0;
        for (int l = 0; l < 8; l++)
            ss += p[l];
        float rstd = (float)(1.0 / sqrt(ss / (double)n->d + (double)n->eps));
        for (e = 0; e < n->d; e++)
            tk_cpu_st1(n->out, r * n->lo + e, n->ko, (tk_cpu_ld1(x, xo + e, kx) * rstd) * tk_cpu_ld1(n->w, e, n->kw));
    }
}

#if TK_CPU_X86
TK_AVX2 static void norm_rows_avx2(const norm_t *n, int64_t lo, int64_t hi)
{
    int64_t d8 = n->d / 8 * 8;
    int rem = (int)(n->d - d8);
    for (int64_t r = lo; r < hi; r++) {
        const char *x = n->res ? n->res : n->in;
        int64_t xo = r * (n->res ? n->lr : n->li);
        int kx = n->res ? n->kr : n->ki;
        __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
        int64_t e = 0;
        if (n->res) { /* residual = input + residual, rounded to T; then the sum of squares of it */
            for (; e < d8; e += 8) {
                __m256 v = _mm256_add_ps(tk_ld8(n->in, r * n->li + e, n->ki), tk_ld8(n->res, r * n->lr + e, n->kr));
                tk_st8(n->res, r * n->lr + e, n->kr, v);
                v = tk_ld8(n->res, r * n->lr + e, n->kr);
                s0 = _mm256_fmadd_ps(v, v, s0);
            }
            if (rem) {
                __m256 v = _mm256_add_ps(tk_ld8_part(n->in, r * n->li + e, n->ki, rem),
                                         tk_ld8_part(n->res, r * n->lr + e, n->kr, rem));
                tk_st8_part(n->res, r * n->lr + e, n->kr, v, rem);
                v = tk_ld8_part(n->res, r * n->lr + e, n->kr, rem);
                s1 = _mm256_fmadd_ps(v, v, s1);
            }
        } else {
            for (; e + 16 <= d8; e += 16) {
                __m256 v = tk_ld8(x, xo + e, kx), u = tk_ld8(x, xo + e + 8, kx);
                s0 = _mm256_fmadd_ps(v, v, s0);
                s1 = _mm256_fmadd_ps(u, u, s1);
            }
            for (; e < d8; e += 8) {
                __m256 v = tk_ld8(x, xo + e, kx);
                s0 = _mm256_fmadd_ps(v, v, s0);
            }
            if (rem) {
                __m256 v = tk_ld8_part(x, xo + e, kx, rem);
                s1 = _mm256_fmadd_ps(v, v, s1);
            }
        }
        float lanes[8];
        _mm256_storeu_ps(lanes, _mm256_add_ps(s0, s1));
        double ss = 0;
        for (int l = 0; l < 8; l++)
            ss += lanes[l];
        __m256 rs = _mm256_set1_ps((float)(1.0 / sqrt(ss / (double)n->d + (double)n->eps)));
        for (e = 0; e < d8; e += 8)
            tk_st8(n->out, r * n->lo + e, n->ko,
                   _mm256_mul_ps(_mm256_mul_ps(tk_ld8(x, xo + e, kx), rs), tk_ld8(n->w, e, n->kw)));
        if (rem)
            tk_st8_part(
                n->out, r * n->lo + e, n->ko,
                _mm256_mul_ps(_mm256_mul_ps(tk_ld8_part(x, xo + e, kx, rem), rs), tk_ld8_part(n->w, e, n->kw, rem)),
                rem);
    }
}
#endif

static void norm_range(void *arg, int64_t lo, int64_t hi)
{
    const norm_t *n = arg;
#if TK_CPU_X86
    if (n->avx2) {
        norm_rows_avx2(n, lo, hi);
        return;
    }
#endif
    norm_rows_c(n, lo, hi);
}

static int run_norm(const tk_op_call *c, int avx2)
{
    int fused = c->op->params[1].role == TK_OPS_OUT;
    const tk_tensor *t0 = c->t[0], *t1 = c->t[1], *w = c->t[2];
    norm_t n;
    memset(&n, 0, sizeof n);
    int64_t s0 = 0, s1 = 0;
    tk_ops__cpu_rows(t0, &s0);
    tk_ops__cpu_rows(t1, &s1);
    n.out = tk_ops__base(t0);
    n.lo = s0;
    n.ko = tk_cpu_kind(t0->dtype);
    if (fused) { /* input (t0) is added to residual (t1), then overwritten with the result */
        n.in = tk_ops__base(t0);
        n.li = s0;
        n.ki = n.ko;
        n.res = tk_ops__base(t1);
        n.lr = s1;
        n.kr = tk_cpu_kind(t1->dtype);
    } else {
        n.in = tk_ops__base(t1);
        n.li = s1;
        n.ki = tk_cpu_kind(t1->dtype);
    }
    n.w = tk_ops__base(w);
    n.kw = tk_cpu_kind(w->dtype);
    n.d = t1->shape[t1->ndim - 1];
    n.eps = (float)c->f[3];
    n.avx2 = avx2;
    int64_t rows = tk_ops__cpu_nrows(t1);
    if (rows == 0 || n.d == 0)
        return TK_OK;
    int64_t grain = (4096 + n.d - 1) / n.d;
    tk_ops__parallel_for(rows, grain, rows * n.d < SERIAL_ELEMS ? 1 : 0, norm_range, &n);
    return TK_OK;
}

/* ---- silu_and_mul -------------------------------------------------------------------------------- */

typedef struct {
    char *out;
    const char *in;
    int64_t lo, li, d;
    int ko, ki, avx2;
    int gelu; /* gelu_tanh_and_mul (Gemma's GeGLU), else silu_and_mul */
} act_t;

/* gelu_tanh's constants (ops/activation.c) */
#define GELU_C 0.79788456080286535588f /* sqrt(2 / pi) */
#define GELU_K 0.044715f

static int fits_act(const tk_op_call *c)
{
    int64_t a, b;
    return tk_ops__cpu_rows(c->t[0], &a) && tk_ops__cpu_rows(c->t[1], &b);
}

static void act_rows_c(const act_t *a, int64_t lo, int64_t hi)
{
    for (int64_t r = lo; r < hi; r++)
        for (int64_t e = 0; e < a->d; e++) {
            float x = tk_cpu_ld1(a->in, r * a->li + e, a->ki), y = tk_cpu_ld1(a->in, r * a->li + a->d + e, a->ki), v;
            if (a->gelu) { /* the reference's formula */
                float x3 = (x * x) * x;
                v = (0.5f * x) * (1.0f + tanhf(GELU_C * (x + GELU_K * x3)));
            } else {
                v = x / (1.0f + expf(-x));
            }
            tk_cpu_st1(a->out, r * a->lo + e, a->ko, v * y);
        }
}

#if TK_CPU_X86
TK_AVX2_INLINE __m256 silu_mul8(__m256 x, __m256 y)
{
    __m256 one = _mm256_set1_ps(1.0f);
    __m256 e = tk_exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
    return _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), y);
}

/* gelu_tanh(x) * y. 0.5 x (1 + tanh(u)) is exactly x / (1 + exp(-2u)) (tanh(u) = 2 sigmoid(2u) - 1),
 * u = sqrt(2/pi) (x + 0.044715 x^3): one vector exp, and no cancellation in 1 + tanh(u) for negative u
 * (where the reference's tanhf loses relative precision: its result is within about 1e-7 |x| of this). */
TK_AVX2_INLINE __m256 gelu_mul8(__m256 x, __m256 y)
{
    __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
    __m256 u2 = _mm256_mul_ps(_mm256_set1_ps(-2.0f * GELU_C), _mm256_fmadd_ps(_mm256_set1_ps(GELU_K), x3, x));
    __m256 e = tk_exp8(u2);
    return _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), y);
}

TK_AVX2_INLINE void act_rows8(const act_t *a, int64_t lo, int64_t hi, int gelu)
{
    int64_t d8 = a->d / 8 * 8;
    int rem = (int)(a->d - d8);
    for (int64_t r = lo; r < hi; r++) {
        int64_t io = r * a->li, oo = r * a->lo, e = 0;
        for (; e < d8; e += 8) {
            __m256 x = tk_ld8(a->in, io + e, a->ki), y = tk_ld8(a->in, io + a->d + e, a->ki);
            tk_st8(a->out, oo + e, a->ko, gelu ? gelu_mul8(x, y) : silu_mul8(x, y));
        }
        if (rem) {
            __m256 x = tk_ld8_part(a->in, io + e, a->ki, rem), y = tk_ld8_part(a->in, io + a->d + e, a->ki, rem);
            tk_st8_part(a->out, oo + e, a->ko, gelu ? gelu_mul8(x, y) : silu_mul8(x, y), rem);
        }
    }
}

TK_AVX2 static void act_rows_avx2(const act_t *a, int64_t lo, int64_t hi)
{
    if (a->gelu)
        act_rows8(a, lo, hi, 1);
    else
        act_rows8(a, lo, hi, 0);
}
#endif

static void act_range(void *arg, int64_t lo, int64_t hi)
{
    const act_t *a = arg;
#if TK_CPU_X86
    if (a->avx2) {
        act_rows_avx2(a, lo, hi);
        return;
    }
#endif
    act_rows_c(a, lo, hi);
}

static int run_act(const tk_op_call *c, int avx2)
{
    act_t a;
    memset(&a, 0, sizeof a);
    tk_ops__cpu_rows(c->t[0], &a.lo);
    tk_ops__cpu_rows(c->t[1], &a.li);
    a.out = tk_ops__base(c->t[0]);
    a.in = tk_ops__base(c->t[1]);
    a.ko = tk_cpu_kind(c->t[0]->dtype);
    a.ki = tk_cpu_kind(c->t[1]->dtype);
    a.d = c->t[0]->shape[c->t[0]->ndim - 1];
    a.avx2 = avx2;
    a.gelu = !strcmp(c->op->name, "gelu_tanh_and_mul");
    int64_t rows = tk_ops__cpu_nrows(c->t[0]);
    if (rows == 0 || a.d == 0)
        return TK_OK;
    int64_t grain = (4096 + a.d - 1) / a.d;
    tk_ops__parallel_for(rows, grain, rows * a.d < SERIAL_ELEMS ? 1 : 0, act_range, &a);
    return TK_OK;
}

/* ---- softcap (Gemma 2's final logits): cap * tanh(x / cap), eight lanes a step ------------------- */

typedef struct {
    const char *in;
    char *out;
    int64_t li, lo, d;
    int ki, ko;
    float cap;
} cap_t;

#if TK_CPU_X86
/* Rows with a contiguous last dimension; out is input itself or apart (check_softcap refuses a partial
 * overlap), and each step reads its eight elements before writing them. */
static int fits_softcap(const tk_op_call *c)
{
    int64_t a;
    return c->t[0]->ndim >= 1 && tk_ops__cpu_rows(c->t[0], &a) && tk_ops__cpu_rows(c->t[1], &a);
}

TK_AVX2 static void cap_range_avx2(void *arg, int64_t lo, int64_t hi)
{
    const cap_t *a = arg;
    int64_t d8 = a->d / 8 * 8;
    int rem = (int)(a->d - d8);
    for (int64_t r = lo; r < hi; r++) {
        int64_t i = r * a->li, o = r * a->lo, e = 0;
        for (; e < d8; e += 8)
            tk_st8(a->out, o + e, a->ko, tk_softcap8(tk_ld8(a->in, i + e, a->ki), a->cap));
        if (rem)
            tk_st8_part(a->out, o + e, a->ko, tk_softcap8(tk_ld8_part(a->in, i + e, a->ki, rem), a->cap), rem);
    }
}

static int run_softcap_avx2(const tk_op_call *c)
{
    cap_t a = {tk_ops__base(c->t[1]), tk_ops__base(c->t[0]), 0, 0, 0, 0, 0, (float)c->f[2]};
    tk_ops__cpu_rows(c->t[0], &a.lo);
    tk_ops__cpu_rows(c->t[1], &a.li);
    a.ko = tk_cpu_kind(c->t[0]->dtype);
    a.ki = tk_cpu_kind(c->t[1]->dtype);
    a.d = c->t[0]->shape[c->t[0]->ndim - 1];
    int64_t rows = tk_ops__cpu_nrows(c->t[0]);
    if (rows == 0 || a.d == 0)
        return TK_OK;
    tk_ops__parallel_for(rows, (16384 + a.d - 1) / a.d, rows * a.d < SERIAL_ELEMS ? 1 : 0, cap_range_avx2, &a);
    return TK_OK;
}
#endif

/* ---- rotary_embedding (NeoX halves) --------------------------------------------------------------- */

enum { RE_Q, RE_K, RE_POS, RE_CACHE, RE_NEOX };

typedef struct {
    char *t[2];
    int64_t ld[2], heads[2];
    int kind;
    const int64_t *pos;
    const char *cache;
    int64_t ldc, rot, half;
    int kc, avx2;
} rope_t;

static int fits_rotary(const tk_op_call *c)
{
    const tk_tensor *q = c->t[RE_Q], *k = c->t[RE_K], *pos = c->t[RE_POS], *cache = c->t[RE_CACHE];
    int64_t a;
    if (c->i[RE_NEOX] != 1 || !tk_ops__cpu_rows(q, &a) || !tk_ops__cpu_rows(k, &a) || !tk_ops__cpu_rows(cache, &a) ||
        !tk_ops__contiguous(pos))
        return 0;
    const int64_t *p = tk_ops__base(pos);
    for (int64_t t = 0, n = tk_ops__numel(pos); t < n; t++)
        if (p[t] < 0 || p[t] >= cache->shape[0])
            return 0; /* the reference reports it */
    return 1;
}

static void rope_rows_c(const rope_t *j, int64_t lo, int64_t hi)
{
    for (int64_t tok = lo; tok < hi; tok++) {
        const char *cr = j->cache + (size_t)(j->pos[tok] * j->ldc) * tk_cpu_kind_size(j->kc);
        for (int w = 0; w < 2; w++)
            for (int64_t h = 0; h < j->heads[w]; h++) {
                int64_t off = (tok * j->heads[w] + h) * j->ld[w];
                for (int64_t i = 0; i < j->half; i++) {
                    float cv = tk_cpu_ld1(cr, i, j->kc), sv = tk_cpu_ld1(cr, j->half + i, j->kc);
                    float x1 = tk_cpu_ld1(j->t[w], off + i, j->kind),
                          x2 = tk_cpu_ld1(j->t[w], off + j->half + i, j->kind);
                    tk_cpu_st1(j->t[w], off + i, j->kind, x1 * cv - x2 * sv);
                    tk_cpu_st1(j->t[w], off + j->half + i, j->kind, x2 * cv + x1 * sv);
                }
            }
    }
}

#if TK_CPU_X86
TK_AVX2 static void rope_rows_avx2(const rope_t *j, int64_t lo, int64_t hi)
{
    int64_t h8 = j->half / 8 * 8;
    int rem = (int)(j->half - h8);
    for (int64_t tok = lo; tok < hi; tok++) {
        const char *cr = j->cache + (size_t)(j->pos[tok] * j->ldc) * tk_cpu_kind_size(j->kc);
        for (int w = 0; w < 2; w++)
            for (int64_t h = 0; h < j->heads[w]; h++) {
                int64_t off = (tok * j->heads[w] + h) * j->ld[w], i = 0;
                for (; i < h8; i += 8) {
                    __m256 cv = tk_ld8(cr, i, j->kc), sv = tk_ld8(cr, j->half + i, j->kc);
                    __m256 x1 = tk_ld8(j->t[w], off + i, j->kind), x2 = tk_ld8(j->t[w], off + j->half + i, j->kind);
                    tk_st8(j->t[w], off + i, j->kind, _mm256_sub_ps(_mm256_mul_ps(x1, cv), _mm256_mul_ps(x2, sv)));
                    tk_st8(j->t[w], off + j->half + i, j->kind,
                           _mm256_add_ps(_mm256_mul_ps(x2, cv), _mm256_mul_ps(x1, sv)));
                }
                if (rem) {
                    __m256 cv = tk_ld8_part(cr, i, j->kc, rem), sv = tk_ld8_part(cr, j->half + i, j->kc, rem);
                    __m256 x1 = tk_ld8_part(j->t[w], off + i, j->kind, rem);
                    __m256 x2 = tk_ld8_part(j->t[w], off + j->half + i, j->kind, rem);
                    tk_st8_part(j->t[w], off + i, j->kind, _mm256_sub_ps(_mm256_mul_ps(x1, cv), _mm256_mul_ps(x2, sv)),
                                rem);
                    tk_st8_part(j->t[w], off + j->half + i, j->kind,
                                _mm256_add_ps(_mm256_mul_ps(x2, cv), _mm256_mul_ps(x1, sv)), rem);
                }
            }
    }
}
#endif

static void rope_range(void *arg, int64_t lo, int64_t hi)
{
    const rope_t *j = arg;
#if TK_CPU_X86
    if (j->avx2) {
        rope_rows_avx2(j, lo, hi);
        return;
    }
#endif
    rope_rows_c(j, lo, hi);
}

static int run_rotary(const tk_op_call *c, int avx2)
{
    const tk_tensor *q = c->t[RE_Q], *k = c->t[RE_K], *cache = c->t[RE_CACHE];
    rope_t j;
    memset(&j, 0, sizeof j);
    j.t[0] = tk_ops__base(q);
    j.t[1] = tk_ops__base(k);
    tk_ops__cpu_rows(q, &j.ld[0]);
    tk_ops__cpu_rows(k, &j.ld[1]);
    tk_ops__cpu_rows(cache, &j.ldc);
    j.heads[0] = q->shape[q->ndim - 2];
    j.heads[1] = k->shape[k->ndim - 2];
    j.kind = tk_cpu_kind(q->dtype);
    j.pos = tk_ops__base(c->t[RE_POS]);
    j.cache = tk_ops__base(cache);
    j.kc = tk_cpu_kind(cache->dtype);
    j.rot = cache->shape[1];
    j.half = j.rot / 2;
    j.avx2 = avx2;
    int64_t ntok = tk_ops__numel(c->t[RE_POS]);
    if (ntok == 0 || (j.heads[0] == 0 && j.heads[1] == 0))
        return TK_OK;
    int64_t per = (j.heads[0] + j.heads[1]) * j.rot;
    tk_ops__parallel_for(ntok, (4096 + per - 1) / (per > 0 ? per : 1), ntok * per < SERIAL_ELEMS ? 1 : 0, rope_range,
                         &j);
    return TK_OK;
}

static int run_norm_c(const tk_op_call *c) { return run_norm(c, 0); }
static int run_act_c(const tk_op_call *c) { return run_act(c, 0); }
static int run_rotary_c(const tk_op_call *c) { return run_rotary(c, 0); }
#if TK_CPU_X86
static int run_norm_avx2(const tk_op_call *c) { return run_norm(c, 1); }
static int run_act_avx2(const tk_op_call *c) { return run_act(c, 1); }
static int run_rotary_avx2(const tk_op_call *c) { return run_rotary(c, 1); }
#endif

const tk_cpu_impl tk_ops__cpu_fused_impls[] = {
#if TK_CPU_X86
    {"rms_norm", "cpu-avx2", TK_CPU_X86_AVX2, fits_norm, run_norm_avx2, "eight lanes a step, f32 sum of squares"},
    {"fused_add_rms_norm", "cpu-avx2", TK_CPU_X86_AVX2, fits_norm, run_norm_avx2,
     "the add, its rounding to T and the norm in one pass over the row"},
    {"silu_and_mul", "cpu-avx2", TK_CPU_X86_AVX2, fits_act, run_act_avx2, "vector exp (within 2 ulp of expf)"},
    {"gelu_tanh_and_mul", "cpu-avx2", TK_CPU_X86_AVX2, fits_act, run_act_avx2,
     "x / (1 + exp(-2u)), the same function as 0.5 x (1 + tanh(u)), with a vector exp"},
    {"rotary_embedding", "cpu-avx2", TK_CPU_X86_AVX2, fits_rotary, run_rotary_avx2,
     "NeoX halves, eight pairs a step (exact: same roundings as the reference)"},
    {"softcap", "cpu-avx2", TK_CPU_X86_AVX2, fits_softcap, run_softcap_avx2,
     "eight lanes a step: a vector tanh from exp (within about 1e-6 of tanhf)"},
#endif
    {"rms_norm", "cpu-portable", 0, fits_norm, run_norm_c, "plain C, eight partial sums"},
    {"fused_add_rms_norm", "cpu-portable", 0, fits_norm, run_norm_c, "plain C, eight partial sums"},
    {"silu_and_mul", "cpu-portable", 0, fits_act, run_act_c, "plain C"},
    {"gelu_tanh_and_mul", "cpu-portable", 0, fits_act, run_act_c, "plain C (the reference's formula)"},
    {"rotary_embedding", "cpu-portable", 0, fits_rotary, run_rotary_c, "plain C (NeoX halves)"},
};
const size_t tk_ops__cpu_fused_count = sizeof tk_ops__cpu_fused_impls / sizeof tk_ops__cpu_fused_impls[0];
