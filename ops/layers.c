/*
 * layers.c — the dense layers the reference model pipelines are built from (models/): signatures,
 * shape checks and CPU references.
 *
 *   linear     out[..., n] = sum_k x[..., k] * weight[n, k] + bias[n]    weight [N, K]
 *              (transposed = 1: weight [K, N], GPT-2's Conv1D layout: sum_k x[..., k] * weight[k, n])
 *   embedding  out[i, :] = weight[ids[i], :]                            weight [V, D], ids i32 / i64
 *   add        out = a + b                                              same shapes; out may be a or b
 *   tanh       out = tanh(input)                                        (BERT's pooler)
 *   softcap    out = cap * tanh(input / cap)                            (Gemma 2's final logits)
 *
 * GPU implementations: linear runs on cuBLASLt (the built-in "builtin:cublaslt", api/builtin.c), the
 * other three on the kernels of kernels-community/layers.
 *
 * Numerics. linear converts x, weight and bias to fp32 and multiplies with OpenBLAS's cblas_sgemm
 * (fp32 products and fp32 accumulation, in OpenBLAS's own blocking order), adds the bias in fp32 and
 * rounds once to the output dtype. add computes a + b in fp32 and tanh uses tanhf, each rounding once.
 * embedding copies rows: exact for every dtype (f16 / bf16 -> f32 -> f16 / bf16 is the identity).
 *
 * Threads. tk calls cblas_sgemm from the calling thread only, never from inside its own worker
 * threads (tk_ops__parallel), so OpenBLAS's thread pool is never nested inside tk's. tk does not call
 * openblas_set_num_threads: the pool belongs to the process (the host program may use OpenBLAS too,
 * and the setting is global, so changing it per call would race with other callers). OpenBLAS sizes
 * it from OPENBLAS_NUM_THREADS (or OMP_NUM_THREADS), else the online cores, and runs small products
 * on one thread by itself. Set OPENBLAS_NUM_THREADS=1 when the caller already runs one op per core.
 *
 * Strided tensors are read and written through their strides. An embedding id outside [0, V) is an
 * error raised before anything is written (the GPU kernel writes a zero row instead).
 */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"

#define BLK 1024                      /* columns per step of the elementwise ops: stack scratch */
#define LIN_WBUF_FLOATS (16u << 20)   /* weight converted to fp32 at most 64 MiB at a time */

static int64_t last_dim(const tk_tensor *t) { return t->shape[t->ndim - 1]; }

static int is_f32(tk_dtype dt) { return dt.code == TK_DL_FLOAT && dt.bits == 32 && dt.lanes == 1; }

/* The bytes [lo, hi) a tensor's elements can touch (hi == lo when it is empty). */
static void span(const tk_tensor *t, uintptr_t *lo, uintptr_t *hi)
{
    uintptr_t base = (uintptr_t)tk_ops__base(t);
    int64_t n = tk_ops__numel(t), esz = (int64_t)tk_ops__dtype_size(t->dtype);
    if (n == 0) {
        *lo = *hi = base;
        return;
    }
    int64_t mn = 0, mx = 0;
    if (!t->strides) {
        mx = n - 1;
    } else {
        for (int32_t k = 0; k < t->ndim; k++) {
            int64_t d = (t->shape[k] - 1) * t->strides[k];
            if (d < 0)
                mn += d;
            else
                mx += d;
        }
    }
    *lo = base + (uintptr_t)(intptr_t)(mn * esz);
    *hi = base + (uintptr_t)(intptr_t)((mx + 1) * esz);
}

static int overlaps(const tk_tensor *a, const tk_tensor *b)
{
    uintptr_t alo, ahi, blo, bhi;
    if (!a || !b)
        return 0;
    span(a, &alo, &ahi);
    span(b, &blo, &bhi);
    return alo < bhi && blo < ahi;
}

/* 1 when a and b are the same elements: same first byte, shape and (effective) strides. */
static int same_view(const tk_tensor *a, const tk_tensor *b)
{
    if (tk_ops__base(a) != tk_ops__base(b) || !tk_ops__same_shape(a, b))
        return 0;
    int64_t sa = 1, sb = 1;
    for (int32_t k = a->ndim - 1; k >= 0; k--) {
        int64_t ea = a->strides ? a->strides[k] : sa, eb = b->strides ? b->strides[k] : sb;
        if (a->shape[k] != 1 && ea != eb)
            return 0;
        sa *= a->shape[k];
        sb *= b->shape[k];
    }
    return 1;
}

/* ---- linear(out, x, weight, bias, transposed) ------------------------------------------------- */

enum { L_OUT, L_X, L_W, L_BIAS, L_TRANS };

static int check_linear(const tk_op_call *c)
{
    const tk_tensor *out = c->t[L_OUT], *x = c->t[L_X], *w = c->t[L_W], *b = c->t[L_BIAS];
    int64_t tr = c->i[L_TRANS];
    if (tr != 0 && tr != 1)
        return tk__err(TK_ERR_INVALID,
                       "%s: 'transposed' is %lld, want 0 (weight [N, K], nn.Linear) or 1 (weight "
                       "[K, N], GPT-2's Conv1D)",
                       c->op->name, (long long)tr);
    char ws[96];
    snprintf(ws, sizeof ws, "%s", tk_ops__shape_fmt(w->ndim, w->shape));
    int64_t nn = w->shape[tr ? 1 : 0], kk = w->shape[tr ? 0 : 1];
    const char *kwhere = tr ? "the rows of 'weight'" : "the row width of 'weight'";
    const char *nwhere = tr ? "the row width of 'weight'" : "the rows of 'weight'";
    const char *layout = tr ? "[K, N] with transposed=1" : "[N, K]";
    int64_t want[TK_OPS_MAX_RANK];
    for (int32_t k = 0; k < x->ndim; k++)
        want[k] = x->shape[k];
    if (last_dim(x) != kk) {
        want[x->ndim - 1] = kk;
        return tk__err(TK_ERR_INVALID,
                       "%s: 'x' has shape %s, want %s (its last dimension is K, %s %s, %s)\n"
                       "HINT: %s",
                       c->op->name, tk_ops__shape_fmt(x->ndim, x->shape), tk_ops__shape_fmt(x->ndim, want), kwhere, ws,
                       layout,
                       tr ? "GPT-2's Conv1D weights are [in, out]; nn.Linear's are [out, in] (transposed=0)"
                          : "nn.Linear weights are [out, in]; pass transposed=1 for a weight stored [in, out]");
    }
    want[x->ndim - 1] = nn;
    int same = out->ndim == x->ndim;
    for (int32_t k = 0; same && k < x->ndim; k++)
        same = out->shape[k] == want[k];
    if (!same)
        return tk__err(TK_ERR_INVALID,
                       "%s: 'out' has shape %s, want %s (the leading dimensions of 'x' %s, then N, "
                       "%s %s, %s)",
                       c->op->name, tk_ops__shape_fmt(out->ndim, out->shape), tk_ops__shape_fmt(x->ndim, want),
                       tk_ops__shape_fmt(x->ndim, x->shape), nwhere, ws, layout);
    if (b && b->shape[0] != nn)
        return tk__err(TK_ERR_INVALID, "%s: 'bias' has shape %s, want [%lld] (one per output channel: N, %s %s, %s)",
                       c->op->name, tk_ops__shape_fmt(b->ndim, b->shape), (long long)nn, nwhere, ws, layout);
    if (overlaps(out, x) || overlaps(out, w) || overlaps(out, b))
        return tk__err(TK_ERR_INVALID, "%s: 'out' overlaps '%s' in memory; a linear cannot write over its inputs",
                       c->op->name,
                       overlaps(out, x)   ? "x"
                       : overlaps(out, w) ? "weight"
                                          : "bias");
    /* cblas takes int sizes; cuBLASLt int64 ones. Bound both by what cblas can take. */
    if (nn > INT_MAX || kk > INT_MAX)
        return tk__err(TK_ERR_UNSUPPORTED, "%s: 'weight' %s has a dimension above %d, more than BLAS takes",
                       c->op->name, ws, INT_MAX);
    return TK_OK;
}

/* Rows of a tensor converted to dense fp32: dst[r, 0..n) = t[row r0 + r][c0 .. c0+n). */
typedef struct {
    float *dst;
    const tk_tensor *t;
    int64_t r0, c0, n, ld; /* first row, first column, columns, dst row stride */
} conv_job;

static void conv_range(void *arg, int64_t lo, int64_t hi)
{
    const conv_job *j = arg;
    int64_t cs = tk_ops__col_stride(j->t);
    for (int64_t r = lo; r < hi; r++)
        tk_ops__load_f32(j->dst + r * j->ld, tk_ops__base(j->t), tk_ops__row_offset(j->t, j->r0 + r) + j->c0 * cs, cs,
                         j->n, j->t->dtype);
}

static void to_f32(float *dst, const tk_tensor *t, int64_t r0, int64_t rows, int64_t c0, int64_t n, int64_t ld)
{
    conv_job j = {dst, t, r0, c0, n, ld};
    if (n > 0)
        tk_ops__parallel(rows, n, conv_range, &j);
}

/* y (dense [m, n] fp32, row stride ldy) + bias, rounded once into out. */
typedef struct {
    const tk_tensor *out;
    float *y;
    const float *bias; /* NULL: none */
    int64_t n, ldy;
    int store; /* 0: y is out itself, only add the bias */
} store_job;

static void store_range(void *arg, int64_t lo, int64_t hi)
{
    const store_job *j = arg;
    int64_t ocs = tk_ops__col_stride(j->out);
    for (int64_t r = lo; r < hi; r++) {
        float *yr = j->y + r * j->ldy;
        if (j->bias)
            for (int64_t i = 0; i < j->n; i++)
                yr[i] += j->bias[i];
        if (j->store)
            tk_ops__store_f32(tk_ops__base(j->out), tk_ops__row_offset(j->out, r), ocs, yr, j->n, j->out->dtype);
    }
}

static int cpu_linear(const tk_op_call *c)
{
    const tk_tensor *out = c->t[L_OUT], *x = c->t[L_X], *w = c->t[L_W], *b = c->t[L_BIAS];
    int tr = c->i[L_TRANS] != 0;
    int64_t n = w->shape[tr ? 1 : 0], k = w->shape[tr ? 0 : 1], m = 1;
    for (int32_t d = 0; d < x->ndim - 1; d++) /* M: the product of the leading dimensions */
        m *= x->shape[d];
    if (m == 0 || n == 0)
        return TK_OK;
    if (m > INT_MAX)
        return tk__err(TK_ERR_UNSUPPORTED, "%s: 'x' %s has %lld rows, more than BLAS takes (%d)", c->op->name,
                       tk_ops__shape_fmt(x->ndim, x->shape), (long long)m, INT_MAX);

    float *xbuf = NULL, *wbuf = NULL, *ybuf = NULL, *bbuf = NULL;
    const float *xf, *wf = NULL;
    float *y;
    int64_t ldx = k > 0 ? k : 1, ldw = 0, ldy = n;
    int rc = TK_OK;

    /* x: used in place when it is dense fp32, else converted once. */
    if (is_f32(x->dtype) && tk_ops__contiguous(x)) {
        xf = tk_ops__base(x);
    } else {
        if (!(xbuf = malloc((size_t)(m * ldx) * sizeof(float))))
            goto nomem;
        to_f32(xbuf, x, 0, m, 0, k, ldx);
        xf = xbuf;
    }
    /* weight: used in place when fp32 with unit column stride, else converted in column panels. */
    int64_t wrs = w->strides ? w->strides[0] : w->shape[1], wcs = tk_ops__col_stride(w);
    int w_direct = is_f32(w->dtype) && (wcs == 1 || w->shape[1] == 1) && wrs >= (w->shape[1] > 1 ? w->shape[1] : 1) &&
                   wrs <= INT_MAX;
    int64_t nb = n;
    if (w_direct) {
        wf = tk_ops__base(w);
        ldw = wrs;
    } else {
        int64_t kk = k > 0 ? k : 1;
        nb = (int64_t)LIN_WBUF_FLOATS / kk;
        nb = nb < 1 ? 1 : nb > n ? n : nb;
        if (!(wbuf = malloc((size_t)(nb * kk) * sizeof(float))))
            goto nomem;
    }
    /* y: written in place when out is dense fp32, else in fp32 and rounded once into out. */
    int y_direct = is_f32(out->dtype) && tk_ops__contiguous(out);
    if (y_direct) {
        y = tk_ops__base(out);
    } else {
        if (!(ybuf = malloc((size_t)(m * n) * sizeof(float))))
            goto nomem;
        y = ybuf;
    }
    if (b) {
        if (!(bbuf = malloc((size_t)n * sizeof(float))))
            goto nomem;
        tk_ops__load_f32(bbuf, tk_ops__base(b), 0, tk_ops__col_stride(b), n, b->dtype);
    }

    for (int64_t n0 = 0; n0 < n; n0 += nb) {
        int64_t cnt = n - n0 < nb ? n - n0 : nb;
        const float *bp;
        int64_t ldb;
        if (k == 0) {
            for (int64_t r = 0; r < m; r++)
                memset(y + r * ldy + n0, 0, (size_t)cnt * sizeof(float));
            continue;
        }
        if (w_direct) {
            bp = tr ? wf + n0 : wf + n0 * ldw; /* [K, N] columns n0..; or [N, K] rows n0.. */
            ldb = ldw;
        } else if (tr) { /* weight [K, N]: the panel is columns n0 .. n0+cnt of every row, as [K, cnt] */
            to_f32(wbuf, w, 0, k, n0, cnt, cnt);
            bp = wbuf;
            ldb = cnt;
        } else { /* weight [N, K]: rows n0 .. n0+cnt, as [cnt, K] */
            to_f32(wbuf, w, n0, cnt, 0, k, k);
            bp = wbuf;
            ldb = k;
        }
        /* y[:, n0:n0+cnt] = x @ B, B = weight^T (transposed=0) or weight (transposed=1). One row (a
         * decode step) goes through sgemv: sgemm would pack the whole weight for a single row. */
        if (m == 1) {
            if (tr)
                cblas_sgemv(CblasRowMajor, CblasTrans, (int)k, (int)cnt, 1.0f, bp, (int)ldb, xf, 1, 0.0f, y + n0, 1);
            else
                cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)cnt, (int)k, 1.0f, bp, (int)ldb, xf, 1, 0.0f, y + n0, 1);
            continue;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, tr ? CblasNoTrans : CblasTrans, (int)m, (int)cnt, (int)k, 1.0f, xf,
                    (int)ldx, bp, (int)ldb, 0.0f, y + n0, (int)ldy);
    }
    store_job sj = {out, y, bbuf, n, ldy, !y_direct};
    if (bbuf || !y_direct)
        tk_ops__parallel(m, n * 2, store_range, &sj);
    goto done;
nomem:
    rc = tk__err(TK_ERR_NOMEM, "%s: out of memory for the fp32 operands (M %lld, N %lld, K %lld)", c->op->name,
                 (long long)m, (long long)n, (long long)k);
done:
    free(xbuf);
    free(wbuf);
    free(ybuf);
    free(bbuf);
    return rc;
}

/* ---- embedding(out, ids, weight) -------------------------------------------------------------- */

enum { E_OUT, E_IDS, E_W };

static int check_embedding(const tk_op_call *c)
{
    const tk_tensor *out = c->t[E_OUT], *ids = c->t[E_IDS], *w = c->t[E_W];
    int64_t want[TK_OPS_MAX_RANK];
    int32_t wn = ids->ndim + 1; /* ids has rank < TK_OPS_MAX_RANK (its max_rank) */
    for (int32_t k = 0; k < ids->ndim; k++)
        want[k] = ids->shape[k];
    want[wn - 1] = w->shape[1];
    int same = out->ndim == wn;
    for (int32_t k = 0; same && k < wn; k++)
        same = out->shape[k] == want[k];
    if (!same)
        return tk__err(TK_ERR_INVALID,
                       "%s: 'out' has shape %s, want %s (the shape of 'ids' %s, then D, the row "
                       "width of 'weight' %s)",
                       c->op->name, tk_ops__shape_fmt(out->ndim, out->shape), tk_ops__shape_fmt(wn, want),
                       tk_ops__shape_fmt(ids->ndim, ids->shape), tk_ops__shape_fmt(w->ndim, w->shape));
    if (overlaps(out, w) || overlaps(out, ids))
        return tk__err(TK_ERR_INVALID, "%s: 'out' overlaps '%s' in memory", c->op->name,
                       overlaps(out, w) ? "weight" : "ids");
    return TK_OK;
}

/* The integer at flat (row-major) index i of an i32 or i64 tensor. */
static int64_t id_at(const tk_tensor *t, int64_t i)
{
    int64_t o = i;
    if (t->strides) {
        o = 0;
        for (int32_t k = t->ndim - 1; k >= 0; k--) {
            o += (i % t->shape[k]) * t->strides[k];
            i /= t->shape[k];
        }
    }
    const void *b = tk_ops__base(t);
    return t->dtype.bits == 64 ? ((const int64_t *)b)[o] : ((const int32_t *)b)[o];
}

/* "ids[3]" or "ids[1, 2]": the position of flat index i. */
static const char *pos_fmt(const tk_tensor *t, int64_t i)
{
    int64_t idx[TK_OPS_MAX_RANK];
    for (int32_t k = t->ndim - 1; k >= 0; k--) {
        idx[k] = i % t->shape[k];
        i /= t->shape[k];
    }
    return tk_ops__shape_fmt(t->ndim, idx);
}

typedef struct {
    const tk_tensor *out, *ids, *w;
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
        int64_t id = id_at(j->ids, i), oo = tk_ops__row_offset(j->out, i), wo = tk_ops__row_offset(j->w, id);
        for (int64_t c0 = 0; c0 < j->d; c0 += BLK) {
            int64_t n = j->d - c0 < BLK ? j->d - c0 : BLK;
            tk_ops__load_f32(x, wb, wo + c0 * wcs, wcs, n, j->w->dtype);
            tk_ops__store_f32(ob, oo + c0 * ocs, ocs, x, n, j->out->dtype);
        }
    }
}

static int cpu_embedding(const tk_op_call *c)
{
    emb_job j = {c->t[E_OUT], c->t[E_IDS], c->t[E_W], c->t[E_W]->shape[1]};
    int64_t v = j.w->shape[0], n = tk_ops__numel(j.ids);
    for (int64_t i = 0; i < n; i++) { /* every id first: nothing is written when one is bad */
        int64_t id = id_at(j.ids, i);
        if (id < 0 || id >= v)
            return tk__err(TK_ERR_INVALID, "%s: ids%s = %lld is out of range for 'weight' %s (want 0 <= id < %lld)",
                           c->op->name, j.ids->ndim ? pos_fmt(j.ids, i) : "[]", (long long)id,
                           tk_ops__shape_fmt(j.w->ndim, j.w->shape), (long long)v);
    }
    if (j.d > 0)
        tk_ops__parallel(n, j.d * 2, emb_range, &j);
    return TK_OK;
}

/* ---- add(out, a, b) and tanh(out, input) ------------------------------------------------------ */

static int check_add(const tk_op_call *c)
{
    const tk_tensor *out = c->t[0], *a = c->t[1], *b = c->t[2];
    if (!tk_ops__same_shape(b, a))
        return tk__err(TK_ERR_INVALID, "%s: 'b' has shape %s, want %s (the shape of 'a'; add does not broadcast)",
                       c->op->name, tk_ops__shape_fmt(b->ndim, b->shape), tk_ops__shape_fmt(a->ndim, a->shape));
    if (!tk_ops__same_shape(out, a))
        return tk__err(TK_ERR_INVALID, "%s: 'out' has shape %s, want %s (the shape of 'a')", c->op->name,
                       tk_ops__shape_fmt(out->ndim, out->shape), tk_ops__shape_fmt(a->ndim, a->shape));
    for (int i = 1; i <= 2; i++)
        if (overlaps(out, c->t[i]) && !same_view(out, c->t[i]))
            return tk__err(TK_ERR_INVALID,
                           "%s: 'out' partly overlaps '%s' in memory; it may be '%s' itself (same "
                           "data and strides) or apart from it",
                           c->op->name, i == 1 ? "a" : "b", i == 1 ? "a" : "b");
    return TK_OK;
}

static int check_tanh(const tk_op_call *c)
{
    int rc = tk_ops__check_out_like_input(c);
    if (rc == TK_OK && overlaps(c->t[0], c->t[1]) && !same_view(c->t[0], c->t[1]))
        return tk__err(TK_ERR_INVALID,
                       "%s: 'out' partly overlaps 'input' in memory; it may be 'input' itself "
                       "(same data and strides) or apart from it",
                       c->op->name);
    return rc;
}

static int check_softcap(const tk_op_call *c)
{
    double cap = c->f[2];
    if (!isfinite((float)cap) || !(cap > 0))
        return tk__err(TK_ERR_INVALID, "%s: 'cap' is %g, want a finite value > 0 as f32", c->op->name, cap);
    return check_tanh(c);
}

typedef struct {
    const tk_tensor *out, *a, *b; /* b NULL: tanh, or with cap > 0 softcap */
    int64_t d, nblk;
    float cap;
} ew_job;

/* Work items are (row, column block): each block is read whole before it is written, so out may be
 * a or b itself. */
static void ew_range(void *arg, int64_t lo, int64_t hi)
{
    const ew_job *j = arg;
    float x[BLK], y[BLK];
    int64_t ocs = tk_ops__col_stride(j->out), acs = tk_ops__col_stride(j->a), bcs = j->b ? tk_ops__col_stride(j->b) : 0;
    for (int64_t it = lo; it < hi; it++) {
        int64_t r = it / j->nblk, c0 = (it % j->nblk) * BLK, n = j->d - c0 < BLK ? j->d - c0 : BLK;
        tk_ops__load_f32(x, tk_ops__base(j->a), tk_ops__row_offset(j->a, r) + c0 * acs, acs, n, j->a->dtype);
        if (j->b) {
            tk_ops__load_f32(y, tk_ops__base(j->b), tk_ops__row_offset(j->b, r) + c0 * bcs, bcs, n, j->b->dtype);
            for (int64_t i = 0; i < n; i++)
                x[i] = x[i] + y[i];
        } else if (j->cap > 0) {
            for (int64_t i = 0; i < n; i++)
                x[i] = j->cap * tanhf(x[i] / j->cap);
        } else {
            for (int64_t i = 0; i < n; i++)
                x[i] = tanhf(x[i]);
        }
        tk_ops__store_f32(tk_ops__base(j->out), tk_ops__row_offset(j->out, r) + c0 * ocs, ocs, x, n, j->out->dtype);
    }
}

static int cpu_elementwise(const tk_op_call *c)
{
    int is_add = !strcmp(c->op->name, "add");
    ew_job j = {c->t[0], c->t[1], is_add ? c->t[2] : NULL, 0, 0, 0.0f};
    if (!strcmp(c->op->name, "softcap"))
        j.cap = (float)c->f[2];
    int64_t numel = tk_ops__numel(j.out);
    if (numel == 0)
        return TK_OK;
    j.d = j.out->ndim ? last_dim(j.out) : 1;
    j.nblk = (j.d + BLK - 1) / BLK;
    tk_ops__parallel(numel / j.d * j.nblk, (j.d < BLK ? j.d : BLK) * (is_add ? 4 : 16), ew_range, &j);
    return TK_OK;
}

/* ---- the table -------------------------------------------------------------------------------- */

static const tk_op_param linear_params[] = {
    TK_OPS_TENSOR("out", TK_OPS_OUT, TK_OPS_FLOATS, 1, 1, -1, "[..., N]",
                  "x @ weight^T + bias (must not overlap the inputs)"),
    TK_OPS_TENSOR("x", TK_OPS_IN, TK_OPS_FLOATS, -1, 1, -1, "[..., K]", "the activations"),
    TK_OPS_TENSOR("weight", TK_OPS_IN, TK_OPS_FLOATS, 1, 2, 2, "[N, K]",
                  "nn.Linear's [out, in]; [K, N] with transposed=1"),
    TK_OPS_TENSOR_OPT("bias", TK_OPS_IN, TK_OPS_FLOATS, 1, 1, 1, "[N]", "added to every row (fp32)"),
    TK_OPS_SCALAR("transposed", TK_ARG_I64, 0, "1: weight is [K, N] (GPT-2's Conv1D: x @ weight + bias)"),
};

static const tk_op_param embedding_params[] = {
    TK_OPS_TENSOR("out", TK_OPS_OUT, TK_OPS_FLOATS, -1, 1, -1, "[..., D]", "out[i, :] = weight[ids[i], :]"),
    TK_OPS_TENSOR("ids", TK_OPS_IN, TK_OPS_I32 | TK_OPS_I64, -1, 0, TK_OPS_MAX_RANK - 1, "[...]",
                  "the rows to gather, each in [0, V)"),
    TK_OPS_TENSOR("weight", TK_OPS_IN, TK_OPS_FLOATS, 0, 2, 2, "[V, D]", "the table"),
};

static const tk_op_param add_params[] = {
    TK_OPS_TENSOR("out", TK_OPS_OUT, TK_OPS_FLOATS, 1, 0, -1, "[...]", "a + b (may be 'a' or 'b' itself)"),
    TK_OPS_TENSOR("a", TK_OPS_IN, TK_OPS_FLOATS, -1, 0, -1, "[...]", "the first term"),
    TK_OPS_TENSOR("b", TK_OPS_IN, TK_OPS_FLOATS, 1, 0, -1, "[...]", "the second term (same shape: no broadcasting)"),
};

static const tk_op_param tanh_params[] = {
    TK_OPS_TENSOR("out", TK_OPS_OUT, TK_OPS_FLOATS, 1, 0, -1, "[...]", "the result (may be 'input' itself)"),
    TK_OPS_TENSOR("input", TK_OPS_IN, TK_OPS_FLOATS, -1, 0, -1, "[...]", "x"),
};

static const tk_op_param softcap_params[] = {
    TK_OPS_TENSOR("out", TK_OPS_OUT, TK_OPS_FLOATS, 1, 0, -1, "[...]", "the result (may be 'input' itself)"),
    TK_OPS_TENSOR("input", TK_OPS_IN, TK_OPS_FLOATS, -1, 0, -1, "[...]", "x"),
    {.name = "cap", .kind = TK_ARG_F64, .dtype_like = -1, .doc = "the softcap (> 0; rounded to f32)"},
};

#define PKG "kernels-community/layers"
#define COUNT(a) (sizeof a / sizeof a[0])

const tk_op_desc tk_ops__layers[] = {
    {"linear", "layers", "out = x @ weight^T + bias  (fp32 accumulation; transposed=1: x @ weight + bias)",
     linear_params, COUNT(linear_params), check_linear, cpu_linear, NULL, NULL},
    {"embedding", "layers", "out[i, :] = weight[ids[i], :]", embedding_params, COUNT(embedding_params), check_embedding,
     cpu_embedding, NULL, PKG},
    {"add", "layers", "out = a + b  (residual add)", add_params, COUNT(add_params), check_add, cpu_elementwise, NULL,
     PKG},
    {"tanh", "layers", "out = tanh(x)", tanh_params, COUNT(tanh_params), check_tanh, cpu_elementwise, NULL, PKG},
    {"softcap", "layers", "out = cap * tanh(x / cap)  (Gemma 2's final logit softcap)", softcap_params,
     COUNT(softcap_params), check_softcap, cpu_elementwise, NULL, PKG},
};
const size_t tk_ops__layers_count = COUNT(tk_ops__layers);
