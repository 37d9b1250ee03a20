/*
 * sampling.c — the sampling ops (the ops of kernels-community/sampling): signatures, shape checks and
 * CPU references.
 *
 *   argmax  out[...] = the index of the largest element of input[..., :] (i64). Ties give the lowest
 *           index; NaN counts as larger than everything (torch.argmax), so the first NaN wins.
 *   sample  out[b] = a token drawn from softmax(logits[b, :] / temperature) after top-k and top-p, with
 *           HF generate / vLLM semantics: temperature 0 is greedy (the argmax), top_k 0 and top_p 1
 *           are off; temperature, then top-k, then top-p, then one uniform draw by inverse CDF.
 *
 * The definition `sample` computes, exactly (kernels-src/sampling/sampling.cu does the same in the same
 * order, so the CPU and the GPU pick the same token for the same seed, bit for bit):
 *   1. z_i = x_i * (1 / T) in fp32 (1 / T rounded to fp32 first; HF divides, which can differ by an
 *      ulp). NaN logits count as -inf. A row with no logit above -inf gives -1; T <= 0 gives the
 *      argmax of z (lowest index on ties).
 *   2. keys: z mapped to u32 in order (-0 = +0). top-k keeps every token whose key is >= the k-th
 *      largest key (ties at the boundary are all kept, as HF's `scores < topk[-1]` filter).
 *   3. weights: W_i = floor(e^(z_i - z_max) * 2^32) as an integer, with e^ computed by exp_det below
 *      (fp32 operations with explicit fmas only, so the CPU and the GPU agree bit for bit). W_i = 0
 *      once e^(z_i - z_max) < 2^-32: a token 2^32 times less likely than the best is never drawn.
 *   4. top-p keeps the shortest prefix of the top-k tokens, ordered by key descending and, among
 *      equal keys, by index descending, whose mass reaches need = ceil(p * sum_{top-k} W) (in double,
 *      at least 1); never empty. That is transformers' TopPLogitsWarper (and vLLM): its stable
 *      ascending sort drops the lowest indices of a tie first, so of the tokens tied at the boundary
 *      only as many are kept as the mass needs, the highest indices. Found as the largest key t with
 *      sum_{key >= t} W >= need; every key > t is kept (mass A), and of the n tokens with key t (each
 *      of weight w) the c = ceil((need - A) / w) highest indices; the n - c lowest are dropped.
 *   5. r = a 64-bit draw of Philox-4x32-10 (key = seed, counter = (row, offset); with per-row seeds the
 *      row part is 0, so a request's draw does not depend on its batch slot); target = floor(r * S /
 *      2^64) for S = the kept mass; the token is the first kept index (vocabulary order) whose
 *      running sum of W exceeds target.
 * All sums are integers, so the order of summation does not matter. Probabilities are the kept W over
 * their sum; they differ from float64 softmax probabilities by about 1e-7 relative (fp32 z and exp),
 * and tokens below the 2^-32 cut-off are never sampled.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/sample_math.h"
#include "ops/ops.h"

/* ---- the pieces sampling.cu mirrors bit for bit (common/sample_math.h) ------------------------ */

/* randn (ops/diffusion.c) draws with the sample op's generator. */
void tk_ops__philox4x32_10(uint32_t out[4], const uint32_t ctr[4], const uint32_t key[2])
{
    tk__philox4x32_10(out, ctr, key);
}

/* need = ceil(p * total) in double, clamped to [1, total]. */
static uint64_t top_p_need(double p, uint64_t total)
{
    double pm = p * (double)total;
    if (!(pm > 0))
        return 1;
    if (pm >= (double)total)
        return total;
    uint64_t need = (uint64_t)ceil(pm);
    return need < 1 ? 1 : need > total ? total : need;
}

/* The largest t with sum_{key >= t, key >= lo} w(key) >= need (need in [1, that sum over all]), digit
 * by digit from the top (11, 11, then 10 bits, as the kernel's histograms); w = 1 (by_mass 0) or the
 * weight. *mass gets the sum at t, *mass_above the sum over key > t. hist has 2048 entries. */
static uint32_t select_key(const uint32_t *keys, int64_t n, uint32_t lo, uint64_t need, int by_mass, float zmax,
                           uint64_t *mass, uint64_t *mass_above, uint64_t *hist)
{
    static const int shift[3] = {21, 10, 0}, nbits[3] = {11, 11, 10};
    uint32_t mask = 0, val = 0;
    uint64_t above = 0, at = 0;
    for (int p = 0; p < 3; p++) {
        uint32_t nb = 1u << nbits[p];
        memset(hist, 0, nb * sizeof *hist);
        for (int64_t i = 0; i < n; i++) {
            uint32_t k = keys[i];
            if (k < lo || (k & mask) != val)
                continue;
            hist[(k >> shift[p]) & (nb - 1)] += by_mass ? tk__weight_of(tk__float_of_key(k), zmax) : 1;
        }
        uint32_t b = nb - 1;
        uint64_t acc = above;
        for (;; b--) {
            if (acc + hist[b] >= need || b == 0)
                break;
            acc += hist[b];
        }
        above = acc;
        at = hist[b];
        val |= b << shift[p];
        mask |= (nb - 1) << shift[p];
    }
    *mass = above + at;
    *mass_above = above;
    return val;
}

/* ---- shape checks ----------------------------------------------------------------------------- */

static int check_argmax(const tk_op_call *c)
{
    const tk_tensor *out = c->t[0], *in = c->t[1];
    int same = out->ndim == in->ndim - 1;
    for (int32_t k = 0; same && k < out->ndim; k++)
        same = out->shape[k] == in->shape[k];
    if (!same)
        return tk__err(TK_ERR_INVALID,
                       "%s: 'out' has shape %s, want %s (the shape of 'input' %s without its last "
                       "dimension)",
                       c->op->name, tk_ops__shape_fmt(out->ndim, out->shape),
                       tk_ops__shape_fmt(in->ndim - 1, in->shape), tk_ops__shape_fmt(in->ndim, in->shape));
    if (in->shape[in->ndim - 1] == 0 && tk_ops__numel(out) > 0)
        return tk__err(TK_ERR_INVALID, "%s: 'input' has shape %s: an empty last dimension has no argmax", c->op->name,
                       tk_ops__shape_fmt(in->ndim, in->shape));
    return TK_OK;
}

enum { S_OUT, S_LOGITS, S_TEMP, S_TOPK, S_TOPP, S_SEED, S_OFFSET, S_TEMPS, S_TOPKS, S_TOPPS, S_SEEDS };

static int check_sample(const tk_op_call *c)
{
    const tk_tensor *out = c->t[S_OUT], *lg = c->t[S_LOGITS];
    const char *op = c->op->name;
    int64_t b = lg->shape[0];
    if (out->shape[0] != b)
        return tk__err(TK_ERR_INVALID, "%s: 'out' has shape %s, want [%lld] (one token per row of 'logits' %s)", op,
                       tk_ops__shape_fmt(out->ndim, out->shape), (long long)b, tk_ops__shape_fmt(lg->ndim, lg->shape));
    if (lg->shape[1] == 0 && b > 0)
        return tk__err(TK_ERR_INVALID, "%s: 'logits' has shape %s: an empty vocabulary has nothing to sample", op,
                       tk_ops__shape_fmt(lg->ndim, lg->shape));
    for (int i = S_TEMPS; i <= S_SEEDS; i++) {
        const tk_tensor *t = c->t[i];
        if (t && t->shape[0] != b)
            return tk__err(TK_ERR_INVALID, "%s: '%s' has shape %s, want [%lld] (one value per row of 'logits' %s)", op,
                           c->op->params[i].name, tk_ops__shape_fmt(t->ndim, t->shape), (long long)b,
                           tk_ops__shape_fmt(lg->ndim, lg->shape));
    }
    double temp = c->f[S_TEMP], p = c->f[S_TOPP];
    if (!(temp >= 0) || !isfinite((float)temp))
        return tk__err(TK_ERR_INVALID, "%s: 'temperature' is %g, want a finite value >= 0 (as f32; 0 is greedy)", op,
                       temp);
    if (c->i[S_TOPK] < 0)
        return tk__err(TK_ERR_INVALID, "%s: 'top_k' is %lld, want >= 0 (0 keeps every token)", op,
                       (long long)c->i[S_TOPK]);
    if (!(p > 0 && p <= 1))
        return tk__err(TK_ERR_INVALID, "%s: 'top_p' is %g, want a value in (0, 1] (1 keeps every token)", op, p);
    return TK_OK;
}

/* ---- CPU references --------------------------------------------------------------------------- */

#define BLK 1024

/* Element r of a rank-1 tensor of i32 or i64, through its stride. */
static int64_t int_at(const tk_tensor *t, int64_t r)
{
    int64_t o = r * tk_ops__col_stride(t);
    return t->dtype.bits == 64 ? ((const int64_t *)tk_ops__base(t))[o] : ((const int32_t *)tk_ops__base(t))[o];
}

static float float_at(const tk_tensor *t, int64_t r)
{
    float f;
    tk_ops__load_f32(&f, tk_ops__base(t), r * tk_ops__col_stride(t), 1, 1, t->dtype);
    return f;
}

/* Stores v at flat (row-major) index r of an i64 tensor, through its strides. */
static void store_i64(const tk_tensor *t, int64_t r, int64_t v)
{
    int64_t off = r;
    if (t->strides) {
        off = 0;
        for (int32_t k = t->ndim - 1; k >= 0; k--) {
            off += (r % t->shape[k]) * t->strides[k];
            r /= t->shape[k];
        }
    }
    ((int64_t *)tk_ops__base(t))[off] = v;
}

typedef struct {
    const tk_op_call *c;
    int64_t v;
    int failed; /* set when a thread could not allocate its scratch */
} smp_job;

static void argmax_range(void *arg, int64_t lo, int64_t hi)
{
    const smp_job *j = arg;
    const tk_tensor *out = j->c->t[0], *in = j->c->t[1];
    const void *ib = tk_ops__base(in);
    int64_t ics = tk_ops__col_stride(in);
    float x[BLK];
    for (int64_t r = lo; r < hi; r++) {
        int64_t io = tk_ops__row_offset(in, r), best = 0;
        uint32_t bk = 0;
        for (int64_t c0 = 0; c0 < j->v; c0 += BLK) {
            int64_t n = j->v - c0 < BLK ? j->v - c0 : BLK;
            tk_ops__load_f32(x, ib, io + c0 * ics, ics, n, in->dtype);
            for (int64_t i = 0; i < n; i++) {
                uint32_t k = isnan(x[i]) ? TK_KEY_NAN : tk__key_of(x[i]);
                if (k > bk || (c0 + i == 0)) {
                    bk = k;
                    best = c0 + i;
                }
            }
        }
        store_i64(out, r, best);
    }
}

static int cpu_argmax(const tk_op_call *c)
{
    const tk_tensor *in = c->t[1];
    smp_job j = {c, in->shape[in->ndim - 1], 0};
    int64_t rows = tk_ops__numel(c->t[0]);
    if (rows == 0 || j.v == 0)
        return TK_OK;
    tk_ops__parallel(rows, j.v * 4, argmax_range, &j);
    return TK_OK;
}

/* One row of sample: keys is scratch for v keys, hist for 2048 counters. */
static int64_t sample_row(const smp_job *j, int64_t r, uint32_t *keys, uint64_t *hist)
{
    const tk_op_call *c = j->c;
    const tk_tensor *lg = c->t[S_LOGITS];
    int64_t v = j->v;
    float temp = c->t[S_TEMPS] ? float_at(c->t[S_TEMPS], r) : (float)c->f[S_TEMP];
    int64_t k = c->t[S_TOPKS] ? int_at(c->t[S_TOPKS], r) : c->i[S_TOPK];
    double p = c->t[S_TOPPS] ? (double)float_at(c->t[S_TOPPS], r) : c->f[S_TOPP];
    uint64_t seed = (uint64_t)(c->t[S_SEEDS] ? int_at(c->t[S_SEEDS], r) : c->i[S_SEED]);
    uint64_t ctr_row = c->t[S_SEEDS] ? 0 : (uint64_t)r;
    int greedy = !(temp > 0);
    float inv_t = greedy ? 1.0f : 1.0f / temp;

    /* keys, and the largest (lowest index on ties) */
    float x[BLK];
    const void *base = tk_ops__base(lg);
    int64_t io = tk_ops__row_offset(lg, r), cs = tk_ops__col_stride(lg), arg = 0;
    uint32_t kmax = 0;
    for (int64_t c0 = 0; c0 < v; c0 += BLK) {
        int64_t n = v - c0 < BLK ? v - c0 : BLK;
        tk_ops__load_f32(x, base, io + c0 * cs, cs, n, lg->dtype);
        for (int64_t i = 0; i < n; i++) {
            uint32_t kk = tk__key_of(x[i] * inv_t);
            keys[c0 + i] = kk;
            if (kk > kmax) {
                kmax = kk;
                arg = c0 + i;
            }
        }
    }
    if (kmax <= TK_KEY_NEG_INF)
        return -1; /* nothing above -inf */
    if (greedy)
        return arg;
    float zmax = tk__float_of_key(kmax);

    uint64_t mass, above, drop = 0; /* drop: the lowest indices of the tie at t that top-p leaves out */
    uint32_t t = 0;
    if (k > 0 && k < v)
        t = select_key(keys, v, 0, (uint64_t)k, 0, zmax, &mass, &above, hist);
    if (p < 1) {
        uint64_t total = 0;
        for (int64_t i = 0; i < v; i++)
            if (keys[i] >= t)
                total += tk__weight_of(tk__float_of_key(keys[i]), zmax);
        uint64_t need = top_p_need(p, total);
        t = select_key(keys, v, t, need, 1, zmax, &mass, &above, hist);
        uint64_t w = tk__weight_of(tk__float_of_key(t), zmax);
        if (w > 0 && need > above) {
            uint64_t tied = (mass - above) / w, keep = (need - above + w - 1) / w;
            drop = keep < tied ? tied - keep : 0;
            mass = above + (tied - drop) * w;
        }
    } else {
        mass = 0;
        for (int64_t i = 0; i < v; i++)
            if (keys[i] >= t)
                mass += tk__weight_of(tk__float_of_key(keys[i]), zmax);
    }
    uint64_t target = tk__mulhi64(tk__sample_draw(seed, ctr_row, (uint64_t)c->i[S_OFFSET]), mass), acc = 0,
             seen_tied = 0;
    for (int64_t i = 0; i < v; i++) {
        if (keys[i] < t || (keys[i] == t && seen_tied++ < drop))
            continue;
        acc += tk__weight_of(tk__float_of_key(keys[i]), zmax);
        if (acc > target)
            return i;
    }
    return -1; /* unreachable: target < mass */
}

static void sample_range(void *arg, int64_t lo, int64_t hi)
{
    smp_job *j = arg;
    uint32_t *keys = malloc((size_t)j->v * sizeof *keys);
    uint64_t *hist = malloc(2048 * sizeof *hist);
    if (!keys || !hist) {
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
    } else {
        for (int64_t r = lo; r < hi; r++)
            store_i64(j->c->t[S_OUT], r, sample_row(j, r, keys, hist));
    }
    free(keys);
    free(hist);
}

static int cpu_sample(const tk_op_call *c)
{
    const tk_tensor *lg = c->t[S_LOGITS];
    smp_job j = {c, lg->shape[1], 0};
    int64_t rows = lg->shape[0];
    if (rows == 0)
        return TK_OK;
    tk_ops__parallel(rows, j.v * 24, sample_range, &j);
    if (j.failed)
        return tk__err(TK_ERR_NOMEM, "%s: out of memory for a row of %lld keys", c->op->name, (long long)j.v);
    return TK_OK;
}

/* ---- the table -------------------------------------------------------------------------------- */

static const tk_op_param argmax_params[] = {
    TK_OPS_TENSOR("out", TK_OPS_OUT, TK_OPS_I64, -1, 0, -1, "[...]", "the index of each row's largest element"),
    TK_OPS_TENSOR("input", TK_OPS_IN, TK_OPS_FLOATS, -1, 1, -1, "[..., v]",
                  "rows of values (ties: the lowest index; NaN wins)"),
};

#define ROW_TENSOR(nm, bits, docs)                                                                                     \
    {.name = nm,                                                                                                       \
     .kind = TK_ARG_TENSOR,                                                                                            \
     .role = TK_OPS_IN,                                                                                                \
     .dtypes = bits,                                                                                                   \
     .dtype_like = -1,                                                                                                 \
     .min_rank = 1,                                                                                                    \
     .max_rank = 1,                                                                                                    \
     .shape = "[b]",                                                                                                   \
     .optional = 1,                                                                                                    \
     .doc = docs}

static const tk_op_param sample_params[] = {
    TK_OPS_TENSOR("out", TK_OPS_OUT, TK_OPS_I64, -1, 1, 1, "[b]",
                  "the sampled token of each row (-1: no logit above -inf)"),
    TK_OPS_TENSOR("logits", TK_OPS_IN, TK_OPS_FLOATS, -1, 2, 2, "[b, v]",
                  "unnormalised log-probabilities (NaN counts as -inf)"),
    TK_OPS_SCALAR("temperature", TK_ARG_F64, 1.0, "logits are divided by it (as f32); 0 is greedy"),
    TK_OPS_SCALAR("top_k", TK_ARG_I64, 0, "keep the k most likely tokens (ties kept); 0 is off"),
    TK_OPS_SCALAR("top_p", TK_ARG_F64, 1.0, "keep the fewest most likely tokens whose mass reaches p; 1 is off"),
    TK_OPS_SCALAR("seed", TK_ARG_I64, 0, "the Philox key (the same seed and offset give the same tokens)"),
    TK_OPS_SCALAR("offset", TK_ARG_I64, 0, "the Philox counter's high half: advance it per step"),
    ROW_TENSOR("temperatures", TK_OPS_F32, "per-row temperature, replaces 'temperature' (<= 0: greedy)"),
    ROW_TENSOR("top_ks", TK_OPS_I32, "per-row top-k, replaces 'top_k' (<= 0: off)"),
    ROW_TENSOR("top_ps", TK_OPS_F32, "per-row top-p, replaces 'top_p' (>= 1 or NaN: off)"),
    ROW_TENSOR("seeds", TK_OPS_I64, "per-row seed, replaces 'seed'; the counter's row part is then 0"),
};

#define PKG "kernels-community/sampling"

const tk_op_desc tk_ops__sampling[] = {
    {"argmax", "sampling", "out = argmax(input, -1): the lowest index of the largest value, NaN largest", argmax_params,
     sizeof argmax_params / sizeof argmax_params[0], check_argmax, cpu_argmax, NULL, PKG},
    {"sample", "sampling",
     "out[b] = a token drawn from softmax(logits[b] / temperature) after top-k then top-p (seeded Philox)",
     sample_params, sizeof sample_params / sizeof sample_params[0], check_sample, cpu_sample, NULL, PKG},
};
const size_t tk_ops__sampling_count = sizeof tk_ops__sampling / sizeof tk_ops__sampling[0];
