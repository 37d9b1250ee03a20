/*
 * rotary.c — the position-encoding ops (the ops of kernels-community/rotary): signatures, shape checks
 * and CPU references.
 *
 *   rotary_embedding              RoPE on query and key in place, cos/sin looked up by position in a
 *                                 cache [max_pos, rot_dim] (cos in the first half of a row, sin in the
 *                                 second; vLLM's layout); NeoX/Llama half-split or GPT-J interleaved
 *                                 pairs; only the first rot_dim of the head_size columns rotate
 *   rope_cos_sin_cache            builds that cache: no scaling, linear, dynamic NTK, YaRN, Llama 3,
 *                                 LongRoPE (the inverse frequencies of HF transformers'
 *                                 modeling_rope_utils; LongRoPE's per-pair factors come as a tensor)
 *   alibi_slopes                  the ALiBi head slopes (geometric; the non-power-of-two heads rule)
 *   alibi_bias                    bias[h, i, j] = -slope[h] * |i + Sk - Sq - j|  (bottom-right aligned)
 *   sinusoidal_position_encoding  "Attention is all you need": sin on even, cos on odd columns
 *
 * Numerics. rotary_embedding loads x, cos and sin as fp32 and computes x1*cos - x2*sin and
 * x2*cos + x1*sin in fp32 (each product and the difference rounded: fp contraction is off, as the
 * kernels use __fmul_rn/__fsub_rn) and rounds once to T. The tables (the cache, the sinusoidal table,
 * the slopes) are computed in double — inverse frequency, angle = position * inv_freq, cos/sin and the
 * attention factor — rounded to fp32, then to the output dtype; the kernels do the same in double, so
 * the CPU and GPU tables agree to the last fp32 bit but for the odd rounding tie of libm vs CUDA's
 * double functions. (HF computes inv_freq and the angle in fp32, so its angles are off by up to about
 * position * 6e-8 rad; tk's are exact to double precision.) alibi_bias computes -(slope * |dist|) in
 * fp32 and rounds once to T.
 */
#include <math.h>
#include <stdlib.h>

#include "ops/ops.h"

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#define TK_PI 3.14159265358979323846

/* rope_cos_sin_cache's 'scaling' values (kernels-src/rotary/rotary.cu uses the same numbers). */
enum {
    SCALE_NONE = 0,
    SCALE_LINEAR = 1,
    SCALE_DYNAMIC = 2,
    SCALE_YARN = 3,
    SCALE_LLAMA3 = 4,
    SCALE_LONGROPE = 5,
    SCALE_COUNT
};

/* ---- helpers ---------------------------------------------------------------------------------- */

static int same_tensor(const tk_tensor *a, const tk_tensor *b)
{
    return a->data == b->data && a->byte_offset == b->byte_offset;
}

static int finite_pos(double v) { return isfinite(v) && v > 0; }

#define BLK 512 /* pairs / columns per step: the scratch rows live on the stack */

/* ---- rotary_embedding ------------------------------------------------------------------------- */

/* params: query, key, positions, cos_sin_cache, is_neox */
enum { RE_Q, RE_K, RE_POS, RE_CACHE, RE_NEOX };

static int check_rotary(const tk_op_call *c)
{
    const char *op = c->op->name;
    const tk_tensor *q = c->t[RE_Q], *k = c->t[RE_K], *pos = c->t[RE_POS], *cache = c->t[RE_CACHE];
    int32_t pn = pos->ndim;
    const tk_tensor *qk[2] = {q, k};
    const char *names[2] = {c->op->params[RE_Q].name, c->op->params[RE_K].name};
    const char *heads[2] = {"Hq", "Hkv"};
    for (int w = 0; w < 2; w++) {
        const tk_tensor *t = qk[w];
        int ok = t->ndim == pn + 2;
        for (int32_t d = 0; ok && d < pn; d++)
            ok = t->shape[d] == pos->shape[d];
        if (!ok)
            return tk__err(TK_ERR_INVALID,
                           "%s: '%s' has shape %s, want the shape of 'positions' %s followed by [%s, head_size]", op,
                           names[w], tk_ops__shape_fmt(t->ndim, t->shape), tk_ops__shape_fmt(pn, pos->shape), heads[w]);
    }
    int64_t d = q->shape[q->ndim - 1];
    if (k->shape[k->ndim - 1] != d)
        return tk__err(TK_ERR_INVALID, "%s: '%s' has shape %s, want head_size %lld (the last dimension of '%s' %s)", op,
                       names[1], tk_ops__shape_fmt(k->ndim, k->shape), (long long)d, names[0],
                       tk_ops__shape_fmt(q->ndim, q->shape));
    int64_t rot = cache->shape[1];
    if (rot <= 0 || rot % 2 || rot > d)
        return tk__err(TK_ERR_INVALID,
                       "%s: 'cos_sin_cache' has shape %s, want [max_pos, rot_dim] with rot_dim even, > 0 and <= "
                       "head_size %lld (cos then sin halves)",
                       op, tk_ops__shape_fmt(cache->ndim, cache->shape), (long long)d);
    unsigned cb = tk_ops__dtype_bit(cache->dtype), qb = tk_ops__dtype_bit(q->dtype);
    if (cb != TK_OPS_F32 && cb != qb)
        return tk__err(TK_ERR_INVALID, "%s: 'cos_sin_cache' has dtype %s, want f32 or %s (the dtype of '%s')", op,
                       tk_ops__dtype_str(cache->dtype), tk_ops__dtype_str(q->dtype), names[0]);
    int64_t neox = c->i[RE_NEOX];
    if (neox != 0 && neox != 1)
        return tk__err(TK_ERR_INVALID, "%s: 'is_neox' is %lld, want 1 (NeoX/Llama halves) or 0 (GPT-J pairs)", op,
                       (long long)neox);
    if (same_tensor(q, k) && tk_ops__numel(q) > 0)
        return tk__err(TK_ERR_INVALID, "%s: '%s' and '%s' are the same tensor; both are rotated in place", op, names[0],
                       names[1]);
    return TK_OK;
}

typedef struct {
    const tk_tensor *t[2]; /* query, key */
    int64_t heads[2];
    const tk_tensor *pos, *cache;
    int64_t rot, half;
    int neox;
    int inverse; /* rotary_embedding_backward: rotate by -angle (the transpose of the rotation) */
} rope_job;

static int64_t load_pos(const tk_tensor *pos, int64_t tok)
{
    return ((const int64_t *)tk_ops__base(pos))[tk_ops__flat_offset(pos, tok)];
}

/* Rotates n pairs starting at pair p0 of one head row (element offset off, column stride cs). */
static void rotate_pairs(void *base, tk_dtype dt, int64_t off, int64_t cs, const rope_job *j, int64_t p0, int64_t n,
                         const float *cosv, const float *sinv)
{
    float a[2 * BLK], b[BLK];
    if (j->neox) {
        /* pair i is (x[i], x[half + i]) */
        tk_ops__load_f32(a, base, off + p0 * cs, cs, n, dt);
        tk_ops__load_f32(b, base, off + (j->half + p0) * cs, cs, n, dt);
        if (j->inverse)
            for (int64_t i = 0; i < n; i++) {
                float x1 = a[i], x2 = b[i];
                a[i] = x1 * cosv[i] + x2 * sinv[i];
                b[i] = x2 * cosv[i] - x1 * sinv[i];
            }
        else
            for (int64_t i = 0; i < n; i++) {
                float x1 = a[i], x2 = b[i];
                a[i] = x1 * cosv[i] - x2 * sinv[i];
                b[i] = x2 * cosv[i] + x1 * sinv[i];
            }
        tk_ops__store_f32(base, off + p0 * cs, cs, a, n, dt);
        tk_ops__store_f32(base, off + (j->half + p0) * cs, cs, b, n, dt);
    } else {
        /* pair i is (x[2i], x[2i + 1]) */
        tk_ops__load_f32(a, base, off + 2 * p0 * cs, cs, 2 * n, dt);
        for (int64_t i = 0; i < n; i++) {
            float x1 = a[2 * i], x2 = a[2 * i + 1];
            if (j->inverse) {
                a[2 * i] = x1 * cosv[i] + x2 * sinv[i];
                a[2 * i + 1] = x2 * cosv[i] - x1 * sinv[i];
            } else {
                a[2 * i] = x1 * cosv[i] - x2 * sinv[i];
                a[2 * i + 1] = x2 * cosv[i] + x1 * sinv[i];
            }
        }
        tk_ops__store_f32(base, off + 2 * p0 * cs, cs, a, 2 * n, dt);
    }
}

static void rope_range(void *arg, int64_t lo, int64_t hi)
{
    const rope_job *j = arg;
    float cosv[BLK], sinv[BLK];
    const void *cb = tk_ops__base(j->cache);
    int64_t ccs = tk_ops__col_stride(j->cache);
    for (int64_t tok = lo; tok < hi; tok++) {
        int64_t p = load_pos(j->pos, tok); /* checked in range by cpu_rotary */
        int64_t co = tk_ops__row_offset(j->cache, p);
        for (int64_t p0 = 0; p0 < j->half; p0 += BLK) {
            int64_t n = j->half - p0 < BLK ? j->half - p0 : BLK;
            tk_ops__load_f32(cosv, cb, co + p0 * ccs, ccs, n, j->cache->dtype);
            tk_ops__load_f32(sinv, cb, co + (j->half + p0) * ccs, ccs, n, j->cache->dtype);
            for (int w = 0; w < 2; w++) {
                const tk_tensor *t = j->t[w];
                void *base = tk_ops__base(t);
                int64_t cs = tk_ops__col_stride(t);
                for (int64_t h = 0; h < j->heads[w]; h++)
                    rotate_pairs(base, t->dtype, tk_ops__row_offset(t, tok * j->heads[w] + h), cs, j, p0, n, cosv,
                                 sinv);
            }
        }
    }
}

static int cpu_rotary(const tk_op_call *c)
{
    const tk_tensor *q = c->t[RE_Q], *k = c->t[RE_K];
    rope_job j = {{q, k},
                  {q->shape[q->ndim - 2], k->shape[k->ndim - 2]},
                  c->t[RE_POS],
                  c->t[RE_CACHE],
                  0,
                  0,
                  (int)c->i[RE_NEOX],
                  c->op->data != NULL};
    j.rot = j.cache->shape[1];
    j.half = j.rot / 2;
    int64_t ntok = tk_ops__numel(j.pos), max_pos = j.cache->shape[0];
    /* The kernels cannot report a bad position (they leave that token as it is); the reference refuses
     * the call before it writes anything. */
    for (int64_t t = 0; t < ntok; t++) {
        int64_t p = load_pos(j.pos, t);
        if (p < 0 || p >= max_pos)
            return tk__err(TK_ERR_INVALID,
                           "%s: 'positions' holds %lld at flat index %lld, outside [0, %lld) (the rows of "
                           "'cos_sin_cache' %s)",
                           c->op->name, (long long)p, (long long)t, (long long)max_pos,
                           tk_ops__shape_fmt(j.cache->ndim, j.cache->shape));
    }
    if (ntok == 0 || (j.heads[0] == 0 && j.heads[1] == 0))
        return TK_OK;
    tk_ops__parallel(ntok, (j.heads[0] + j.heads[1] + 1) * j.rot * 4, rope_range, &j);
    return TK_OK;
}

/* ---- rope_cos_sin_cache ----------------------------------------------------------------------- */

/* params: out, base, scaling, factor, original_max_position_embeddings, seq_len, beta_fast, beta_slow,
 * truncate, attention_factor, low_freq_factor, high_freq_factor, ext_factors */
enum {
    RC_OUT,
    RC_BASE,
    RC_SCALING,
    RC_FACTOR,
    RC_OMAX,
    RC_SEQ,
    RC_BFAST,
    RC_BSLOW,
    RC_TRUNC,
    RC_ATTN,
    RC_LOWF,
    RC_HIGHF,
    RC_EXT
};

static const char *scaling_name(int64_t s)
{
    static const char *names[SCALE_COUNT] = {"none", "linear", "dynamic", "yarn", "llama3", "longrope"};
    return s >= 0 && s < SCALE_COUNT ? names[s] : "?";
}

static int check_cache(const tk_op_call *c)
{
    const char *op = c->op->name;
    const tk_tensor *out = c->t[RC_OUT];
    int64_t rot = out->shape[1], s = c->i[RC_SCALING];
    if (rot <= 0 || rot % 2)
        return tk__err(TK_ERR_INVALID,
                       "%s: 'out' has shape %s, want [max_pos, rot_dim] with rot_dim even and > 0 (cos then sin "
                       "halves)",
                       op, tk_ops__shape_fmt(out->ndim, out->shape));
    if (s < 0 || s >= SCALE_COUNT)
        return tk__err(TK_ERR_INVALID,
                       "%s: 'scaling' is %lld, want 0 (none), 1 (linear), 2 (dynamic), 3 (yarn), 4 (llama3) or 5 "
                       "(longrope)",
                       op, (long long)s);
    const char *sn = scaling_name(s);
    double base = c->f[RC_BASE], factor = c->f[RC_FACTOR];
    if (!finite_pos(base))
        return tk__err(TK_ERR_INVALID, "%s: 'base' is %g, want a finite value > 0 (rope_theta)", op, base);
    if (s == SCALE_YARN && !(base > 1))
        return tk__err(TK_ERR_INVALID,
                       "%s: 'base' is %g, want > 1 for yarn (its correction range divides by log(base))", op, base);
    if (!finite_pos(factor))
        return tk__err(TK_ERR_INVALID, "%s: 'factor' is %g, want a finite value > 0", op, factor);
    int64_t omax = c->i[RC_OMAX];
    if ((s == SCALE_DYNAMIC || s == SCALE_YARN || s == SCALE_LLAMA3 || s == SCALE_LONGROPE) && omax <= 0)
        return tk__err(TK_ERR_INVALID,
                       "%s: 'original_max_position_embeddings' is %lld, want > 0 for %s scaling (the pretrained "
                       "context length)",
                       op, (long long)omax, sn);
    if (c->i[RC_SEQ] < 0)
        return tk__err(TK_ERR_INVALID, "%s: 'seq_len' is %lld, want >= 0 (0: the rows of 'out')", op,
                       (long long)c->i[RC_SEQ]);
    if (s == SCALE_DYNAMIC && rot <= 2)
        return tk__err(TK_ERR_INVALID,
                       "%s: 'out' has shape %s, want rot_dim > 2 for dynamic scaling (the base is raised to "
                       "rot_dim / (rot_dim - 2))",
                       op, tk_ops__shape_fmt(out->ndim, out->shape));
    if (s == SCALE_YARN) {
        if (!finite_pos(c->f[RC_BFAST]) || !finite_pos(c->f[RC_BSLOW]))
            return tk__err(TK_ERR_INVALID, "%s: 'beta_fast' is %g and 'beta_slow' is %g, want finite values > 0", op,
                           c->f[RC_BFAST], c->f[RC_BSLOW]);
        if (c->i[RC_TRUNC] != 0 && c->i[RC_TRUNC] != 1)
            return tk__err(TK_ERR_INVALID, "%s: 'truncate' is %lld, want 0 or 1", op, (long long)c->i[RC_TRUNC]);
    }
    if (s == SCALE_LLAMA3) {
        double lf = c->f[RC_LOWF], hf = c->f[RC_HIGHF];
        if (!finite_pos(lf) || !isfinite(hf) || !(hf > lf))
            return tk__err(TK_ERR_INVALID,
                           "%s: 'low_freq_factor' is %g and 'high_freq_factor' is %g, want finite values with "
                           "0 < low_freq_factor < high_freq_factor",
                           op, lf, hf);
    }
    double af = c->f[RC_ATTN];
    if (!isfinite(af) || af < 0)
        return tk__err(TK_ERR_INVALID, "%s: 'attention_factor' is %g, want a finite value >= 0 (0: the default)", op,
                       af);
    const tk_tensor *ext = c->t[RC_EXT];
    if (s == SCALE_LONGROPE) {
        if (!ext)
            return tk__err(TK_ERR_INVALID,
                           "%s: longrope scaling needs 'ext_factors' (rope_parameters' short_factor or long_factor, "
                           "rot_dim / 2 values)",
                           op);
        if (ext->shape[0] != rot / 2)
            return tk__err(TK_ERR_INVALID, "%s: 'ext_factors' has shape %s, want [%lld] (rot_dim / 2 of 'out' %s)", op,
                           tk_ops__shape_fmt(ext->ndim, ext->shape), (long long)(rot / 2),
                           tk_ops__shape_fmt(out->ndim, out->shape));
        if (af == 0 && factor > 1 && omax < 2)
            return tk__err(TK_ERR_INVALID,
                           "%s: 'original_max_position_embeddings' is %lld, want >= 2 for longrope's default "
                           "attention factor (it divides by its log)",
                           op, (long long)omax);
        if (ext->device.device_type == TK_DEV_CPU) {
            const void *eb = tk_ops__base(ext);
            int64_t cs = tk_ops__col_stride(ext);
            for (int64_t i = 0; i < rot / 2; i++) {
                float v;
                tk_ops__load_f32(&v, eb, i * cs, cs, 1, ext->dtype);
                if (!(isfinite(v) && v > 0))
                    return tk__err(TK_ERR_INVALID, "%s: 'ext_factors'[%lld] is %g, want a finite value > 0", op,
                                   (long long)i, (double)v);
            }
        }
    } else if (ext) {
        return tk__err(TK_ERR_INVALID,
                       "%s: 'ext_factors' is given, but only longrope scaling (5) takes it; 'scaling' "
                       "is %lld (%s)",
                       op, (long long)s, sn);
    }
    return TK_OK;
}

typedef struct {
    int scaling;
    double base, factor;
    int64_t omax, seq_len;
    double beta_fast, beta_slow;
    int truncate;
    double attention_factor, low_freq_factor, high_freq_factor;
    const float *ext; /* longrope: the factor of each pair */
} rope_cfg;

/* The inverse frequency of pair i (0 <= i < dim/2) for a rotary dimension dim, in double. Each branch
 * is the formula of HF transformers' modeling_rope_utils (v5), computed in double where HF uses fp32
 * tensors; kernels-src/rotary/rotary.cu (tk_rot::inv_freq) is the same code. */
static double rope_inv_freq(const rope_cfg *k, int64_t i, int64_t dim)
{
    /* _compute_default_rope_parameters: 1 / base ** (arange(0, dim, 2) / dim) */
    double e = (double)(2 * i) / (double)dim;
    switch (k->scaling) {
    case SCALE_LINEAR:
        /* _compute_linear_scaling_rope_parameters: inv_freq /= factor (= position / factor) */
        return 1.0 / pow(k->base, e) / k->factor;
    case SCALE_DYNAMIC: {
        /* _compute_dynamic_ntk_parameters: seq_len = max(seq_len, max_position_embeddings);
         * base *= ((factor * seq_len / max_pos) - (factor - 1)) ** (dim / (dim - 2)) */
        double mp = (double)k->omax, sl = (double)(k->seq_len > k->omax ? k->seq_len : k->omax);
        double b = k->base * pow(k->factor * sl / mp - (k->factor - 1.0), (double)dim / (double)(dim - 2));
        return 1.0 / pow(b, e);
    }
    case SCALE_YARN: {
        /* _compute_yarn_parameters: find_correction_dim(r) = dim * ln(max_pos / (r * 2 pi)) / (2 ln base);
         * low = floor(dim(beta_fast)), high = ceil(dim(beta_slow)) when truncate; clamped to [0, dim - 1];
         * ramp = clamp((i - low) / (high - low), 0, 1) (high += 0.001 when equal);
         * extrapolation_factor = 1 - ramp;
         * inv = inv_interp * (1 - extrapolation_factor) + inv_extrap * extrapolation_factor */
        double pos_freq = pow(k->base, e);
        double extrap = 1.0 / pos_freq, interp = 1.0 / (k->factor * pos_freq);
        double mp = (double)k->omax, lb = 2.0 * log(k->base);
        double low = (double)dim * log(mp / (k->beta_fast * 2.0 * TK_PI)) / lb;
        double high = (double)dim * log(mp / (k->beta_slow * 2.0 * TK_PI)) / lb;
        if (k->truncate) {
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
        double ef = 1.0 - ramp;
        return interp * (1.0 - ef) + extrap * ef;
    }
    case SCALE_LLAMA3: {
        /* _compute_llama3_parameters: wavelen = 2 pi / inv; low_wl = old_ctx / low_freq_factor,
         * high_wl = old_ctx / high_freq_factor; wavelen > low_wl: inv / factor; wavelen < high_wl: inv;
         * else smooth = (old_ctx / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor),
         * inv = (1 - smooth) * inv / factor + smooth * inv */
        double inv = 1.0 / pow(k->base, e), ctx = (double)k->omax;
        double low_wl = ctx / k->low_freq_factor, high_wl = ctx / k->high_freq_factor;
        double wl = 2.0 * TK_PI / inv;
        if (wl > low_wl)
            return inv / k->factor;
        if (wl < high_wl)
            return inv;
        double smooth = (ctx / wl - k->low_freq_factor) / (k->high_freq_factor - k->low_freq_factor);
        return (1.0 - smooth) * inv / k->factor + smooth * inv;
    }
    case SCALE_LONGROPE:
        /* _compute_longrope_parameters: inv_freq = 1 / (ext_factors * base ** (arange(0, dim, 2) / dim));
         * the caller picks short_factor or long_factor (long when the sequence is longer than
         * original_max_position_embeddings: HF's longrope_frequency_update) */
        return 1.0 / ((double)k->ext[i] * pow(k->base, e));
    default: return 1.0 / pow(k->base, e);
    }
}

/* The factor cos and sin are multiplied by: attention_factor when > 0, else YaRN's
 * get_mscale(factor) = 0.1 * ln(factor) + 1, LongRoPE's sqrt(1 + ln(factor) / ln(original max)) (both 1
 * when factor <= 1), else 1. */
static double rope_mscale(const rope_cfg *k)
{
    if (k->attention_factor > 0)
        return k->attention_factor;
    if (k->scaling == SCALE_YARN && k->factor > 1)
        return 0.1 * log(k->factor) + 1.0;
    if (k->scaling == SCALE_LONGROPE && k->factor > 1)
        return sqrt(1.0 + log(k->factor) / log((double)k->omax));
    return 1.0;
}

typedef struct {
    const tk_tensor *out;
    const double *inv;
    double mscale;
    int64_t half;
} cache_job;

static void cache_range(void *arg, int64_t lo, int64_t hi)
{
    const cache_job *j = arg;
    float cv[BLK], sv[BLK];
    void *ob = tk_ops__base(j->out);
    int64_t cs = tk_ops__col_stride(j->out);
    for (int64_t p = lo; p < hi; p++) {
        int64_t oo = tk_ops__row_offset(j->out, p);
        for (int64_t i0 = 0; i0 < j->half; i0 += BLK) {
            int64_t n = j->half - i0 < BLK ? j->half - i0 : BLK;
            for (int64_t i = 0; i < n; i++) {
                double a = (double)p * j->inv[i0 + i];
                cv[i] = (float)(cos(a) * j->mscale);
                sv[i] = (float)(sin(a) * j->mscale);
            }
            tk_ops__store_f32(ob, oo + i0 * cs, cs, cv, n, j->out->dtype);
            tk_ops__store_f32(ob, oo + (j->half + i0) * cs, cs, sv, n, j->out->dtype);
        }
    }
}

static int cpu_cache(const tk_op_call *c)
{
    const tk_tensor *out = c->t[RC_OUT];
    int64_t rows = out->shape[0], rot = out->shape[1], half = rot / 2;
    rope_cfg k = {(int)c->i[RC_SCALING],
                  c->f[RC_BASE],
                  c->f[RC_FACTOR],
                  c->i[RC_OMAX],
                  c->i[RC_SEQ] ? c->i[RC_SEQ] : rows,
                  c->f[RC_BFAST],
                  c->f[RC_BSLOW],
                  (int)c->i[RC_TRUNC],
                  c->f[RC_ATTN],
                  c->f[RC_LOWF],
                  c->f[RC_HIGHF],
                  NULL};
    if (rows == 0)
        return TK_OK;
    double *inv = malloc(sizeof(double) * (size_t)half + sizeof(float) * (size_t)half);
    if (!inv)
        return tk__err(TK_ERR_NOMEM, "%s: out of memory", c->op->name);
    const tk_tensor *ext = c->t[RC_EXT];
    if (ext) { /* as f32, contiguous (checked finite and > 0) */
        float *e = (float *)(inv + half);
        tk_ops__load_f32(e, tk_ops__base(ext), 0, tk_ops__col_stride(ext), half, ext->dtype);
        k.ext = e;
    }
    for (int64_t i = 0; i < half; i++)
        inv[i] = rope_inv_freq(&k, i, rot);
    cache_job j = {out, inv, rope_mscale(&k), half};
    tk_ops__parallel(rows, rot * 40, cache_range, &j);
    free(inv);
    return TK_OK;
}

/* ---- alibi_slopes and alibi_bias -------------------------------------------------------------- */

/* The slope of head h of n: with p the largest power of two <= n, heads h < p take
 * 2^(-max_bias * (h + 1) / p) and the rest 2^(-max_bias * (2 (h - p) + 1) / (2 p)) — the odd-indexed
 * slopes of the 2p-head sequence (Press et al.'s get_slopes; max_bias 8 gives theirs exactly). */
static double alibi_slope(int64_t h, int64_t n, double max_bias)
{
    int64_t p = 1;
    while (p * 2 <= n)
        p *= 2;
    if (h < p)
        return exp2(-max_bias * (double)(h + 1) / (double)p);
    return exp2(-max_bias * (double)(2 * (h - p) + 1) / (double)(2 * p));
}

static int check_slopes(const tk_op_call *c)
{
    double mb = c->f[1];
    if (!finite_pos(mb))
        return tk__err(TK_ERR_INVALID, "%s: 'max_bias' is %g, want a finite value > 0 (8 is ALiBi's)", c->op->name, mb);
    return TK_OK;
}

typedef struct {
    const tk_tensor *out;
    int64_t n;
    double max_bias;
} slopes_job;

static void slopes_range(void *arg, int64_t lo, int64_t hi)
{
    const slopes_job *j = arg;
    void *ob = tk_ops__base(j->out);
    int64_t cs = tk_ops__col_stride(j->out);
    for (int64_t h = lo; h < hi; h++) {
        float v = (float)alibi_slope(h, j->n, j->max_bias);
        tk_ops__store_f32(ob, h * cs, cs, &v, 1, j->out->dtype);
    }
}

static int cpu_slopes(const tk_op_call *c)
{
    slopes_job j = {c->t[0], c->t[0]->shape[0], c->f[1]};
    tk_ops__parallel(j.n, 64, slopes_range, &j);
    return TK_OK;
}

static int check_bias(const tk_op_call *c)
{
    const tk_tensor *out = c->t[0], *s = c->t[1];
    if (s->shape[0] != out->shape[0])
        return tk__err(TK_ERR_INVALID, "%s: 'slopes' has shape %s, want [%lld] (the heads of 'out' %s)", c->op->name,
                       tk_ops__shape_fmt(s->ndim, s->shape), (long long)out->shape[0],
                       tk_ops__shape_fmt(out->ndim, out->shape));
    return TK_OK;
}

typedef struct {
    const tk_tensor *out, *slopes;
    int64_t sq, sk;
} bias_job;

static void bias_range(void *arg, int64_t lo, int64_t hi)
{
    const bias_job *j = arg;
    float v[BLK], slope;
    void *ob = tk_ops__base(j->out);
    int64_t cs = tk_ops__col_stride(j->out), scs = tk_ops__col_stride(j->slopes);
    for (int64_t r = lo; r < hi; r++) {
        int64_t h = r / j->sq, qi = r % j->sq, pi = qi + j->sk - j->sq; /* query qi's absolute position */
        tk_ops__load_f32(&slope, tk_ops__base(j->slopes), h * scs, scs, 1, j->slopes->dtype);
        int64_t oo = tk_ops__row_offset(j->out, r);
        for (int64_t c0 = 0; c0 < j->sk; c0 += BLK) {
            int64_t n = j->sk - c0 < BLK ? j->sk - c0 : BLK;
            for (int64_t i = 0; i < n; i++) {
                int64_t dist = pi - (c0 + i);
                v[i] = -(slope * (float)(dist < 0 ? -dist : dist));
            }
            tk_ops__store_f32(ob, oo + c0 * cs, cs, v, n, j->out->dtype);
        }
    }
}

static int cpu_bias(const tk_op_call *c)
{
    const tk_tensor *out = c->t[0];
    bias_job j = {out, c->t[1], out->shape[1], out->shape[2]};
    int64_t rows = out->shape[0] * out->shape[1];
    if (rows == 0 || j.sk == 0)
        return TK_OK;
    tk_ops__parallel(rows, j.sk * 4, bias_range, &j);
    return TK_OK;
}

/* ---- sinusoidal_position_encoding ------------------------------------------------------------- */

static int check_sin(const tk_op_call *c)
{
    double base = c->f[1];
    if (!finite_pos(base))
        return tk__err(TK_ERR_INVALID, "%s: 'base' is %g, want a finite value > 0 (10000 in the paper)", c->op->name,
                       base);
    if (c->i[2] < 0)
        return tk__err(TK_ERR_INVALID, "%s: 'offset' is %lld, want >= 0 (the position of row 0)", c->op->name,
                       (long long)c->i[2]);
    return TK_OK;
}

typedef struct {
    const tk_tensor *out;
    double base;
    int64_t offset, d;
} sin_job;

static void sin_range(void *arg, int64_t lo, int64_t hi)
{
    const sin_job *j = arg;
    float v[BLK];
    void *ob = tk_ops__base(j->out);
    int64_t cs = tk_ops__col_stride(j->out);
    for (int64_t r = lo; r < hi; r++) {
        double p = (double)(j->offset + r);
        int64_t oo = tk_ops__row_offset(j->out, r);
        for (int64_t c0 = 0; c0 < j->d; c0 += BLK) {
            int64_t n = j->d - c0 < BLK ? j->d - c0 : BLK;
            for (int64_t i = 0; i < n; i++) {
                int64_t col = c0 + i, even = col & ~(int64_t)1;
                /* PE[p, 2i] = sin(p / base^(2i/d)), PE[p, 2i + 1] = cos(p / base^(2i/d)) */
                double a = p * (1.0 / pow(j->base, (double)even / (double)j->d));
                v[i] = (float)(col & 1 ? cos(a) : sin(a));
            }
            tk_ops__store_f32(ob, oo + c0 * cs, cs, v, n, j->out->dtype);
        }
    }
}

static int cpu_sin(const tk_op_call *c)
{
    const tk_tensor *out = c->t[0];
    sin_job j = {out, c->f[1], c->i[2], out->shape[1]};
    if (out->shape[0] == 0 || j.d == 0)
        return TK_OK;
    tk_ops__parallel(out->shape[0], j.d * 40, sin_range, &j);
    return TK_OK;
}

/* ---- the table -------------------------------------------------------------------------------- */

#define F64(nm, dv, dc) {.name = nm, .kind = TK_ARG_F64, .optional = 1, .def = dv, .dtype_like = -1, .doc = dc}
#define I64(nm, dv, dc) {.name = nm, .kind = TK_ARG_I64, .optional = 1, .def = dv, .dtype_like = -1, .doc = dc}

#define POS_AND_CACHE                                                                                                  \
    {.name = "positions",                                                                                              \
     .kind = TK_ARG_TENSOR,                                                                                            \
     .role = TK_OPS_IN,                                                                                                \
     .dtypes = TK_OPS_I64,                                                                                             \
     .dtype_like = -1,                                                                                                 \
     .min_rank = 1,                                                                                                    \
     .max_rank = TK_OPS_MAX_RANK - 2,                                                                                  \
     .shape = "[...]",                                                                                                 \
     .doc = "each token's position: its row of cos_sin_cache ([T] or [B, S])"},                                        \
        {.name = "cos_sin_cache",                                                                                      \
         .kind = TK_ARG_TENSOR,                                                                                        \
         .role = TK_OPS_IN,                                                                                            \
         .dtypes = TK_OPS_FLOATS,                                                                                      \
         .dtype_like = -1,                                                                                             \
         .min_rank = 2,                                                                                                \
         .max_rank = 2,                                                                                                \
         .shape = "[max_pos, rot_dim]",                                                                                \
         .doc = "row p: cos(p*inv_freq) then sin(p*inv_freq), rot_dim/2 each; f32 or the dtype of query"}

static const tk_op_param rotary_params[] = {
    TK_OPS_TENSOR("query", TK_OPS_OUT, TK_OPS_FLOATS, -1, 3, -1, "[..., Hq, head_size]", "rotated in place"),
    TK_OPS_TENSOR("key", TK_OPS_OUT, TK_OPS_FLOATS, 0, 3, -1, "[..., Hkv, head_size]", "rotated in place"),
    POS_AND_CACHE,
    I64("is_neox", 1, "1: rotate (x[i], x[rot_dim/2 + i]) (NeoX/Llama); 0: (x[2i], x[2i+1]) (GPT-J)"),
};

/* The backward's arguments are the gradients of the forward's rotated query and key, rotated back in
 * place (by -angle: the rotation's transpose), which gives the gradients of the unrotated ones. */
static const tk_op_param rotary_bwd_params[] = {
    TK_OPS_TENSOR("grad_query", TK_OPS_OUT, TK_OPS_FLOATS, -1, 3, -1, "[..., Hq, head_size]",
                  "the gradient of the rotated query; on return, of the query before rotation"),
    TK_OPS_TENSOR("grad_key", TK_OPS_OUT, TK_OPS_FLOATS, 0, 3, -1, "[..., Hkv, head_size]",
                  "the gradient of the rotated key; on return, of the key before rotation"),
    POS_AND_CACHE,
    I64("is_neox", 1, "as the forward's"),
};
static const int rotary_inverse = 1;

static const tk_op_param cache_params[] = {
    TK_OPS_TENSOR("out", TK_OPS_OUT, TK_OPS_FLOATS, -1, 2, 2, "[max_pos, rot_dim]",
                  "row p: cos(p*inv_freq[i]) then sin(...)"),
    F64("base", 10000.0, "rope_theta"),
    I64("scaling", 0, "0 none, 1 linear, 2 dynamic (NTK), 3 yarn, 4 llama3, 5 longrope"),
    F64("factor", 1.0, "the scaling factor (linear, dynamic, yarn, llama3; longrope: for the attention factor)"),
    I64("original_max_position_embeddings", 0,
        "pretrained context (dynamic: HF's max_position_embeddings; yarn, llama3, longrope)"),
    I64("seq_len", 0, "dynamic: the sequence length the base is scaled for (0: the rows of out)"),
    F64("beta_fast", 32.0, "yarn"),
    F64("beta_slow", 1.0, "yarn"),
    I64("truncate", 1, "yarn: floor/ceil the correction range"),
    F64("attention_factor", 0.0,
        "cos/sin multiplier; 0: yarn 0.1*ln(factor)+1, longrope sqrt(1+ln(factor)/ln(original)), else 1"),
    F64("low_freq_factor", 1.0, "llama3"),
    F64("high_freq_factor", 4.0, "llama3"),
    TK_OPS_TENSOR_OPT(
        "ext_factors", TK_OPS_IN, TK_OPS_F32, -1, 1, 1, "[rot_dim/2]",
        "longrope: each pair's factor, inv_freq = 1/(ext*base^(2i/rot_dim)) (short_factor or long_factor)"),
};

static const tk_op_param slopes_params[] = {
    TK_OPS_TENSOR("out", TK_OPS_OUT, TK_OPS_F32, -1, 1, 1, "[H]", "the slope of each head"),
    F64("max_bias", 8.0, "slopes are 2^(-max_bias*k/p); 8 is ALiBi's"),
};

static const tk_op_param bias_params[] = {
    TK_OPS_TENSOR("out", TK_OPS_OUT, TK_OPS_FLOATS, -1, 3, 3, "[H, Sq, Sk]", "-slope[h] * |i + Sk - Sq - j|"),
    TK_OPS_TENSOR("slopes", TK_OPS_IN, TK_OPS_F32, -1, 1, 1, "[H]", "the head slopes (alibi_slopes)"),
};

static const tk_op_param sin_params[] = {
    TK_OPS_TENSOR("out", TK_OPS_OUT, TK_OPS_FLOATS, -1, 2, 2, "[S, d]", "row s: position offset + s"),
    F64("base", 10000.0, "the wavelength base"),
    I64("offset", 0, "the position of row 0"),
};

#define PKG "kernels-community/rotary"
#define N(a) (sizeof a / sizeof a[0])

const tk_op_desc tk_ops__rotary[] = {
    {"rotary_embedding", "rotary",
     "RoPE on query and key in place: pairs (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), cos/sin at positions",
     rotary_params, N(rotary_params), check_rotary, cpu_rotary, NULL, PKG},
    {"rotary_embedding_backward", "rotary",
     "rotary_embedding's backward in place: pairs (g1, g2) -> (g1 cos + g2 sin, g2 cos - g1 sin) (the inverse rotation)",
     rotary_bwd_params, N(rotary_bwd_params), check_rotary, cpu_rotary, &rotary_inverse, PKG},
    {"rope_cos_sin_cache", "rotary",
     "out[p] = [cos(p*inv_freq), sin(p*inv_freq)] * mscale; inv_freq by HF's none/linear/dynamic/yarn/llama3/longrope",
     cache_params, N(cache_params), check_cache, cpu_cache, NULL, PKG},
    {"alibi_slopes", "rotary", "ALiBi head slopes 2^(-max_bias*(h+1)/H), the non-power-of-two rule for other H",
     slopes_params, N(slopes_params), check_slopes, cpu_slopes, NULL, PKG},
    {"alibi_bias", "rotary", "out[h, i, j] = -slopes[h] * |i + Sk - Sq - j|  (bottom-right aligned)", bias_params,
     N(bias_params), check_bias, cpu_bias, NULL, PKG},
    {"sinusoidal_position_encoding", "rotary",
     "out[s, 2i] = sin(p / base^(2i/d)), out[s, 2i+1] = cos(p / base^(2i/d)), p = offset + s", sin_params,
     N(sin_params), check_sin, cpu_sin, NULL, PKG},
};
const size_t tk_ops__rotary_count = N(tk_ops__rotary);
