/*
 * casted.c — the casted ops (the ops of kernels-community/casted): 8-bit embedding tables and
 * weight-only 8-bit linears. Signatures, shape checks and CPU references.
 *
 *   casted_embedding               out[i, :] = decode(weight[ids[i], :]) * scale[ids[i]]
 *                                  weight [V, D] fp8_e4m3 / fp8_e5m2 / i8; scale [V] f32 (needed for
 *                                  i8, optional for fp8)
 *   casted_embedding_block_sparse  the same gather from a block-CSR table: row block rb = id / bs_r
 *                                  stores blocks k in row_ptr[rb] .. row_ptr[rb+1] at column blocks
 *                                  col_idx[k]; out[i, col_idx[k]*bs_c + c] =
 *                                  decode(values[k, id % bs_r, c]) * scale[k]; columns of no stored
 *                                  block are 0
 *   casted_linear                  out[m, n] = (sum_k x[m, k] * decode(weight[n, k])) * scale[n] + bias[n]
 *                                  weight [N, K] i8 / fp8_e4m3, scale [N] f32, bias [N] optional
 *
 * Numerics: 8-bit codes are decoded exactly (tk_ops__load_f32: OCP e4m3fn / e5m2, NaN codes give NaN,
 * e5m2 infinities stay infinite). Embeddings compute decode * scale in fp32 and round once to the
 * output dtype. The linear accumulates x * w in fp32 (eight interleaved partial sums, then added in a
 * fixed order), multiplies the sum by scale in fp32, adds the bias and rounds once to the output dtype.
 * Ids outside [0, V) are an error here (the GPU kernels write a zero row instead; see the package
 * README), as is a malformed block-CSR (row_ptr not starting at 0, decreasing, or not ending at nnzb;
 * a column index out of range or not strictly increasing within its row block). Strided tensors are
 * read and written through their strides.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "ops/ops.h"

#define BLK 1024 /* columns per step: the scratch rows live on the stack */

/* ---- helpers ---------------------------------------------------------------------------------- */

static int64_t last_dim(const tk_tensor *t) { return t->shape[t->ndim - 1]; }

/* Element offset of flat (row-major) index i of t. */
static int64_t flat_off(const tk_tensor *t, int64_t i)
{
    if (t->ndim == 0)
        return 0;
    int64_t d = last_dim(t);
    return tk_ops__row_offset(t, i / d) + (i % d) * tk_ops__col_stride(t);
}

/* The integer at flat index i of an i32 or i64 tensor. */
static int64_t int_at(const tk_tensor *t, int64_t i)
{
    int64_t o = flat_off(t, i);
    if (t->dtype.bits == 64)
        return ((const int64_t *)tk_ops__base(t))[o];
    return ((const int32_t *)tk_ops__base(t))[o];
}

static float f32_at(const tk_tensor *t, int64_t i)
{
    float f;
    tk_ops__load_f32(&f, tk_ops__base(t), flat_off(t, i), 1, 1, t->dtype);
    return f;
}

/* out must be ids.shape + [d]. */
static int check_gather_out(const tk_op_call *c, const tk_tensor *out, const tk_tensor *ids, int64_t d, const char *why)
{
    int64_t want[TK_OPS_MAX_RANK];
    int same = out->ndim == ids->ndim + 1 && ids->ndim < TK_OPS_MAX_RANK;
    for (int32_t k = 0; k < ids->ndim && k < TK_OPS_MAX_RANK - 1; k++)
        want[k] = ids->shape[k];
    int32_t wn = ids->ndim < TK_OPS_MAX_RANK ? ids->ndim + 1 : TK_OPS_MAX_RANK;
    want[wn - 1] = d;
    for (int32_t k = 0; same && k < wn; k++)
        same = out->shape[k] == want[k];
    if (!same)
        return tk__err(TK_ERR_INVALID, "%s: 'out' has shape %s, want %s (the shape of 'ids' %s, then %s)", c->op->name,
                       tk_ops__shape_fmt(out->ndim, out->shape), tk_ops__shape_fmt(wn, want),
                       tk_ops__shape_fmt(ids->ndim, ids->shape), why);
    return TK_OK;
}

/* A rank-1 tensor at param i must have n elements. */
static int check_vec(const tk_op_call *c, int i, int64_t n, const char *why)
{
    const tk_tensor *t = c->t[i];
    if (t && t->shape[0] != n)
        return tk__err(TK_ERR_INVALID, "%s: '%s' has shape %s, want [%lld] (%s)", c->op->name, c->op->params[i].name,
                       tk_ops__shape_fmt(t->ndim, t->shape), (long long)n, why);
    return TK_OK;
}

/* i8 codes have no scale of their own: the table must come with one. */
static int check_i8_scale(const tk_op_call *c, int iw, int is, const char *want)
{
    if (c->t[iw]->dtype.code == TK_DL_INT && !c->t[is])
        return tk__err(TK_ERR_INVALID, "%s: '%s' is i8 and needs '%s' %s (the dequantisation scale); none was given",
                       c->op->name, c->op->params[iw].name, c->op->params[is].name, want);
    return TK_OK;
}

/* Every id of the call in [0, v); names the first that is not. */
static int check_ids(const tk_op_call *c, const tk_tensor *ids, int64_t v, const char *table)
{
    for (int64_t i = 0, n = tk_ops__numel(ids); i < n; i++) {
        int64_t id = int_at(ids, i);
        if (id < 0 || id >= v)
            return tk__err(TK_ERR_INVALID, "%s: ids[%lld] = %lld is out of range for %s (want 0 <= id < %lld)",
                           c->op->name, (long long)i, (long long)id, table, (long long)v);
    }
    return TK_OK;
}

/* ---- casted_embedding(out, ids, weight, scale) ------------------------------------------------ */

static int check_embedding(const tk_op_call *c)
{
    const tk_tensor *out = c->t[0], *ids = c->t[1], *w = c->t[2];
    char why[160];
    snprintf(why, sizeof why, "the row width of 'weight' %s", tk_ops__shape_fmt(w->ndim, w->shape));
    int rc = check_gather_out(c, out, ids, w->shape[1], why);
    if (rc == TK_OK) {
        snprintf(why, sizeof why, "one per row of 'weight' %s", tk_ops__shape_fmt(w->ndim, w->shape));
        rc = check_vec(c, 3, w->shape[0], why);
    }
    return rc == TK_OK ? check_i8_scale(c, 2, 3, "[V]") : rc;
}

typedef struct {
    const tk_tensor *out, *ids, *w, *scale;
    int64_t d;
} emb_job;

static void emb_range(void *arg, int64_t lo, int64_t hi)
{
    const emb_job *j = arg;
    float x[BLK];
    void *ob = tk_ops__base(j->out);
    const void *wb = tk_ops__base(j->w);
    int64_t ocs = tk_ops__col_stride(j->out), wcs = tk_ops__col_stride(j->w);
    for (int64_t i = lo; i < hi; i++) {
        int64_t id = int_at(j->ids, i), oo = tk_ops__row_offset(j->out, i), wo = tk_ops__row_offset(j->w, id);
        float s = j->scale ? f32_at(j->scale, id) : 1.0f;
        for (int64_t c0 = 0; c0 < j->d; c0 += BLK) {
            int64_t n = j->d - c0 < BLK ? j->d - c0 : BLK;
            tk_ops__load_f32(x, wb, wo + c0 * wcs, wcs, n, j->w->dtype);
            if (j->scale)
                for (int64_t k = 0; k < n; k++)
                    x[k] *= s;
            tk_ops__store_f32(ob, oo + c0 * ocs, ocs, x, n, j->out->dtype);
        }
    }
}

static int cpu_embedding(const tk_op_call *c)
{
    emb_job j = {c->t[0], c->t[1], c->t[2], c->t[3], c->t[2]->shape[1]};
    char table[96];
    snprintf(table, sizeof table, "'weight' %s", tk_ops__shape_fmt(j.w->ndim, j.w->shape));
    int rc = check_ids(c, j.ids, j.w->shape[0], table);
    if (rc != TK_OK)
        return rc;
    int64_t n = tk_ops__numel(j.ids);
    if (j.d > 0)
        tk_ops__parallel(n, j.d * 4, emb_range, &j);
    return TK_OK;
}

/* ---- casted_embedding_block_sparse(out, ids, row_ptr, col_idx, values, scale, num_embeddings) --- */

enum { BS_OUT, BS_IDS, BS_ROW_PTR, BS_COL_IDX, BS_VALUES, BS_SCALE, BS_NUM };

static int check_block_sparse(const tk_op_call *c)
{
    const tk_tensor *out = c->t[BS_OUT], *ids = c->t[BS_IDS], *rp = c->t[BS_ROW_PTR], *v = c->t[BS_VALUES];
    const char *name = c->op->name;
    char vs[96];
    snprintf(vs, sizeof vs, "%s", tk_ops__shape_fmt(v->ndim, v->shape));
    int64_t nnzb = v->shape[0], bs_r = v->shape[1], bs_c = v->shape[2];
    char why[160];
    if (bs_r < 1 || bs_c < 1)
        return tk__err(TK_ERR_INVALID, "%s: 'values' has shape %s, want [nnzb, bs_r, bs_c] with block sizes >= 1", name,
                       vs);
    if (rp->shape[0] < 1)
        return tk__err(TK_ERR_INVALID, "%s: 'row_ptr' has shape %s, want [R + 1] (one more than the row blocks)", name,
                       tk_ops__shape_fmt(rp->ndim, rp->shape));
    snprintf(why, sizeof why, "one column block index per stored block of 'values' %s", vs);
    int rc = check_vec(c, BS_COL_IDX, nnzb, why);
    if (rc == TK_OK) {
        snprintf(why, sizeof why, "one per stored block of 'values' %s", vs);
        rc = check_vec(c, BS_SCALE, nnzb, why);
    }
    if (rc == TK_OK)
        rc = check_i8_scale(c, BS_VALUES, BS_SCALE, "[nnzb]");
    if (rc != TK_OK)
        return rc;
    rc = check_gather_out(c, out, ids, out->ndim == ids->ndim + 1 ? last_dim(out) : bs_c, "D");
    if (rc != TK_OK)
        return rc;
    if (last_dim(out) % bs_c != 0)
        return tk__err(TK_ERR_INVALID,
                       "%s: 'out' has shape %s: its last dimension D must be a multiple of the block "
                       "width bs_c = %lld of 'values' %s",
                       name, tk_ops__shape_fmt(out->ndim, out->shape), (long long)bs_c, vs);
    int64_t rows = (rp->shape[0] - 1) * bs_r, ne = c->i[BS_NUM];
    if (ne < 0 || ne > rows)
        return tk__err(TK_ERR_INVALID,
                       "%s: 'num_embeddings' is %lld, want 1 to %lld (the rows of %lld row blocks of %lld; 0: all "
                       "of them)",
                       name, (long long)ne, (long long)rows, (long long)(rp->shape[0] - 1), (long long)bs_r);
    return TK_OK;
}

/* The block-CSR structure, checked before the gather reads through it. */
static int check_csr(const tk_op_call *c, int64_t ncb)
{
    const tk_tensor *rp = c->t[BS_ROW_PTR], *ci = c->t[BS_COL_IDX];
    const char *name = c->op->name;
    int64_t nr = rp->shape[0] - 1, nnzb = ci->shape[0];
    int64_t first = int_at(rp, 0), last = int_at(rp, nr);
    if (first != 0)
        return tk__err(TK_ERR_INVALID, "%s: row_ptr[0] = %lld, want 0", name, (long long)first);
    if (last != nnzb)
        return tk__err(TK_ERR_INVALID, "%s: row_ptr[%lld] = %lld, want %lld (nnzb, the stored blocks of 'values')",
                       name, (long long)nr, (long long)last, (long long)nnzb);
    int64_t prev = 0;
    for (int64_t rb = 0; rb < nr; rb++) {
        int64_t lo = int_at(rp, rb), hi = int_at(rp, rb + 1);
        if (hi < lo || hi > nnzb)
            return tk__err(TK_ERR_INVALID,
                           "%s: row_ptr[%lld] = %lld after row_ptr[%lld] = %lld: row_ptr must not "
                           "decrease",
                           name, (long long)(rb + 1), (long long)hi, (long long)rb, (long long)lo);
        for (int64_t k = lo; k < hi; k++) {
            int64_t cb = int_at(ci, k);
            if (cb < 0 || cb >= ncb)
                return tk__err(TK_ERR_INVALID,
                               "%s: col_idx[%lld] = %lld is out of range (want 0 <= col < %lld, "
                               "the column blocks of D)",
                               name, (long long)k, (long long)cb, (long long)ncb);
            if (k > lo && cb <= prev)
                return tk__err(TK_ERR_INVALID,
                               "%s: col_idx[%lld] = %lld after col_idx[%lld] = %lld in row block "
                               "%lld: column indices must be strictly increasing within a row block",
                               name, (long long)k, (long long)cb, (long long)(k - 1), (long long)prev, (long long)rb);
            prev = cb;
        }
    }
    return TK_OK;
}

static const float zeros[BLK];

typedef struct {
    const tk_tensor *out, *ids, *rp, *ci, *v, *scale;
    int64_t d, bs_r, bs_c;
} bs_job;

static void bs_range(void *arg, int64_t lo, int64_t hi)
{
    const bs_job *j = arg;
    float x[BLK];
    void *ob = tk_ops__base(j->out);
    const void *vb = tk_ops__base(j->v);
    int64_t ocs = tk_ops__col_stride(j->out), vcs = tk_ops__col_stride(j->v);
    for (int64_t i = lo; i < hi; i++) {
        int64_t id = int_at(j->ids, i), oo = tk_ops__row_offset(j->out, i);
        int64_t rb = id / j->bs_r, r = id % j->bs_r;
        for (int64_t c0 = 0; c0 < j->d; c0 += BLK) {
            int64_t n = j->d - c0 < BLK ? j->d - c0 : BLK;
            tk_ops__store_f32(ob, oo + c0 * ocs, ocs, zeros, n, j->out->dtype);
        }
        for (int64_t k = int_at(j->rp, rb), end = int_at(j->rp, rb + 1); k < end; k++) {
            int64_t col = int_at(j->ci, k) * j->bs_c, vo = tk_ops__row_offset(j->v, k * j->bs_r + r);
            float s = j->scale ? f32_at(j->scale, k) : 1.0f;
            for (int64_t c0 = 0; c0 < j->bs_c; c0 += BLK) {
                int64_t n = j->bs_c - c0 < BLK ? j->bs_c - c0 : BLK;
                tk_ops__load_f32(x, vb, vo + c0 * vcs, vcs, n, j->v->dtype);
                if (j->scale)
                    for (int64_t e = 0; e < n; e++)
                        x[e] *= s;
                tk_ops__store_f32(ob, oo + (col + c0) * ocs, ocs, x, n, j->out->dtype);
            }
        }
    }
}

static int cpu_block_sparse(const tk_op_call *c)
{
    const tk_tensor *v = c->t[BS_VALUES];
    bs_job j = {c->t[BS_OUT],   c->t[BS_IDS],           c->t[BS_ROW_PTR], c->t[BS_COL_IDX], v,
                c->t[BS_SCALE], last_dim(c->t[BS_OUT]), v->shape[1],      v->shape[2]};
    int64_t rows = (j.rp->shape[0] - 1) * j.bs_r, ne = c->i[BS_NUM] ? c->i[BS_NUM] : rows;
    int rc = check_csr(c, j.d / j.bs_c);
    if (rc != TK_OK)
        return rc;
    char table[96];
    snprintf(table, sizeof table, "a table of %lld rows ('num_embeddings')", (long long)ne);
    if ((rc = check_ids(c, j.ids, ne, table)) != TK_OK)
        return rc;
    int64_t n = tk_ops__numel(j.ids);
    if (j.d > 0)
        tk_ops__parallel(n, j.d * 4, bs_range, &j);
    return TK_OK;
}

/* ---- casted_linear(out, x, weight, scale, bias) ----------------------------------------------- */

static int check_linear(const tk_op_call *c)
{
    const tk_tensor *out = c->t[0], *x = c->t[1], *w = c->t[2];
    char ws[96];
    snprintf(ws, sizeof ws, "%s", tk_ops__shape_fmt(w->ndim, w->shape));
    int64_t nn = w->shape[0], kk = w->shape[1];
    if (last_dim(x) != kk) {
        int64_t want[TK_OPS_MAX_RANK];
        for (int32_t k = 0; k < x->ndim; k++)
            want[k] = x->shape[k];
        want[x->ndim - 1] = kk;
        return tk__err(TK_ERR_INVALID,
                       "%s: 'x' has shape %s, want %s (its last dimension is K, the row width of "
                       "'weight' %s)",
                       c->op->name, tk_ops__shape_fmt(x->ndim, x->shape), tk_ops__shape_fmt(x->ndim, want), ws);
    }
    int same = out->ndim == x->ndim && last_dim(out) == nn;
    for (int32_t k = 0; same && k < x->ndim - 1; k++)
        same = out->shape[k] == x->shape[k];
    if (!same) {
        int64_t want[TK_OPS_MAX_RANK];
        for (int32_t k = 0; k < x->ndim; k++)
            want[k] = x->shape[k];
        want[x->ndim - 1] = nn;
        return tk__err(TK_ERR_INVALID,
                       "%s: 'out' has shape %s, want %s (the leading dimensions of 'x' %s, then N, "
                       "the rows of 'weight' %s)",
                       c->op->name, tk_ops__shape_fmt(out->ndim, out->shape), tk_ops__shape_fmt(x->ndim, want),
                       tk_ops__shape_fmt(x->ndim, x->shape), ws);
    }
    char why[160];
    snprintf(why, sizeof why, "one per output channel: the rows of 'weight' %s", ws);
    int rc = check_vec(c, 3, nn, why);
    return rc == TK_OK ? check_vec(c, 4, nn, why) : rc;
}

#define MB 16 /* rows of x per work item: one decoded weight row serves them all */

typedef struct {
    const tk_tensor *out, *w, *scale, *bias;
    const float *xf; /* x decoded to fp32, [m, k] dense */
    int64_t m, n, k, nmb;
    atomic_int nomem;
} lin_job;

static float dot(const float *a, const float *b, int64_t k)
{
    float p[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= k; i += 8)
        for (int e = 0; e < 8; e++)
            p[e] += a[i + e] * b[i + e];
    for (int e = 0; i < k; i++, e++)
        p[e] += a[i] * b[i];
    return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

/* Items are (weight row n, block of MB rows of x), n-major so consecutive items share the row. */
static void lin_range(void *arg, int64_t lo, int64_t hi)
{
    lin_job *j = arg;
    float *wrow = malloc((size_t)(j->k > 0 ? j->k : 1) * sizeof(float));
    if (!wrow) {
        atomic_store(&j->nomem, 1);
        return;
    }
    void *ob = tk_ops__base(j->out);
    const void *wb = tk_ops__base(j->w);
    int64_t ocs = tk_ops__col_stride(j->out), wcs = tk_ops__col_stride(j->w), loaded = -1;
    for (int64_t it = lo; it < hi; it++) {
        int64_t n = it / j->nmb, m0 = (it % j->nmb) * MB, m1 = m0 + MB < j->m ? m0 + MB : j->m;
        if (n != loaded) {
            tk_ops__load_f32(wrow, wb, tk_ops__row_offset(j->w, n), wcs, j->k, j->w->dtype);
            loaded = n;
        }
        float s = f32_at(j->scale, n), b = j->bias ? f32_at(j->bias, n) : 0.0f;
        for (int64_t m = m0; m < m1; m++) {
            float y = dot(j->xf + m * j->k, wrow, j->k) * s + b;
            tk_ops__store_f32(ob, tk_ops__row_offset(j->out, m) + n * ocs, 1, &y, 1, j->out->dtype);
        }
    }
    free(wrow);
}

static int cpu_linear(const tk_op_call *c)
{
    const tk_tensor *x = c->t[1], *w = c->t[2];
    int64_t k = w->shape[1], n = w->shape[0], m = 1;
    for (int32_t d = 0; d < x->ndim - 1; d++) /* M: the product of the leading dimensions (K may be 0) */
        m *= x->shape[d];
    if (m == 0 || n == 0)
        return TK_OK;
    float *xf = malloc((size_t)(m * k > 0 ? m * k : 1) * sizeof(float));
    if (!xf)
        return tk__err(TK_ERR_NOMEM, "%s: out of memory for x as fp32 (%lld x %lld)", c->op->name, (long long)m,
                       (long long)k);
    int64_t xcs = tk_ops__col_stride(x);
    for (int64_t r = 0; r < m; r++)
        tk_ops__load_f32(xf + r * k, tk_ops__base(x), tk_ops__row_offset(x, r), xcs, k, x->dtype);
    lin_job j = {c->t[0], w, c->t[3], c->t[4], xf, m, n, k, (m + MB - 1) / MB, 0};
    tk_ops__parallel(n * j.nmb, (k + 1) * (m < MB ? m : MB) * 2, lin_range, &j);
    free(xf);
    if (atomic_load(&j.nomem))
        return tk__err(TK_ERR_NOMEM, "%s: out of memory for a decoded weight row (%lld values)", c->op->name,
                       (long long)k);
    return TK_OK;
}

/* ---- the table -------------------------------------------------------------------------------- */

#define OUT_PARAM(doc_)                                                                                                \
    {.name = "out",                                                                                                    \
     .kind = TK_ARG_TENSOR,                                                                                            \
     .role = TK_OPS_OUT,                                                                                               \
     .dtypes = TK_OPS_F32 | TK_OPS_BF16,                                                                               \
     .dtype_like = -1,                                                                                                 \
     .min_rank = 2,                                                                                                    \
     .max_rank = -1,                                                                                                   \
     .shape = "[..., D]",                                                                                              \
     .doc = doc_}
#define IDS_PARAM                                                                                                      \
    {.name = "ids",                                                                                                    \
     .kind = TK_ARG_TENSOR,                                                                                            \
     .role = TK_OPS_IN,                                                                                                \
     .dtypes = TK_OPS_I32 | TK_OPS_I64,                                                                                \
     .dtype_like = -1,                                                                                                 \
     .min_rank = 1,                                                                                                    \
     .max_rank = TK_OPS_MAX_RANK - 1,                                                                                  \
     .shape = "[...]",                                                                                                 \
     .doc = "the rows to gather"}
#define TABLE_DTYPES (TK_OPS_FP8_E4M3 | TK_OPS_FP8_E5M2 | TK_OPS_I8)

static const tk_op_param emb_params[] = {
    OUT_PARAM("the gathered rows: out[i, :] = decode(weight[ids[i], :]) * scale[ids[i]]"),
    IDS_PARAM,
    TK_OPS_TENSOR("weight", TK_OPS_IN, TABLE_DTYPES, -1, 2, 2, "[V, D]",
                  "the table as fp8 (e4m3fn or e5m2) or i8 codes"),
    TK_OPS_TENSOR_OPT("scale", TK_OPS_IN, TK_OPS_F32, -1, 1, 1, "[V]",
                      "per-row dequantisation scale (required for i8; fp8 without it is unscaled)"),
};

static const tk_op_param bs_params[] = {
    OUT_PARAM("the gathered rows, 0 where the row's block row stores no block"),
    IDS_PARAM,
    TK_OPS_TENSOR("row_ptr", TK_OPS_IN, TK_OPS_I32, -1, 1, 1, "[R + 1]",
                  "block CSR: row block rb stores blocks row_ptr[rb] .. row_ptr[rb+1]-1"),
    TK_OPS_TENSOR("col_idx", TK_OPS_IN, TK_OPS_I32, -1, 1, 1, "[nnzb]",
                  "the column block of each stored block, strictly increasing within a row block"),
    TK_OPS_TENSOR("values", TK_OPS_IN, TABLE_DTYPES, -1, 3, 3, "[nnzb, bs_r, bs_c]",
                  "the stored blocks as fp8 or i8 codes"),
    TK_OPS_TENSOR_OPT("scale", TK_OPS_IN, TK_OPS_F32, -1, 1, 1, "[nnzb]",
                      "per-block dequantisation scale (required for i8)"),
    TK_OPS_SCALAR("num_embeddings", TK_ARG_I64, 0, "V, the table's rows (<= R * bs_r); 0: R * bs_r"),
};

static const tk_op_param lin_params[] = {
    TK_OPS_TENSOR("out", TK_OPS_OUT, TK_OPS_FLOATS, 1, 1, -1, "[..., N]", "x @ decode(weight)^T * scale + bias"),
    TK_OPS_TENSOR("x", TK_OPS_IN, TK_OPS_FLOATS, -1, 1, -1, "[..., K]", "the activations (the kernels take bf16)"),
    TK_OPS_TENSOR("weight", TK_OPS_IN, TK_OPS_I8 | TK_OPS_FP8_E4M3, -1, 2, 2, "[N, K]",
                  "the weight as i8 or fp8_e4m3 codes"),
    TK_OPS_TENSOR("scale", TK_OPS_IN, TK_OPS_F32, -1, 1, 1, "[N]", "per-output-channel dequantisation scale"),
    TK_OPS_TENSOR_OPT("bias", TK_OPS_IN, TK_OPS_FLOATS, 1, 1, 1, "[N]", "added after the scale"),
};

#define PKG "kernels-community/casted"
#define COUNT(a) (sizeof a / sizeof a[0])

const tk_op_desc tk_ops__casted[] = {
    {"casted_embedding", "casted", "out[i, :] = decode(weight[ids[i], :]) * scale[ids[i]]  (fp8 or i8 table)",
     emb_params, COUNT(emb_params), check_embedding, cpu_embedding, NULL, PKG},
    {"casted_embedding_block_sparse", "casted",
     "out[i, :] = the row ids[i] of a block-CSR table of fp8 or i8 blocks (0 where no block is stored)", bs_params,
     COUNT(bs_params), check_block_sparse, cpu_block_sparse, NULL, PKG},
    {"casted_linear", "casted", "out = x @ decode(weight)^T * scale + bias  (i8 or fp8_e4m3 weight, fp32 accumulation)",
     lin_params, COUNT(lin_params), check_linear, cpu_linear, NULL, PKG},
};
const size_t tk_ops__casted_count = COUNT(tk_ops__casted);
