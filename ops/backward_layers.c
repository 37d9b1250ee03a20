/*
 * backward_layers.c — the backward passes of the dense layers (ops/layers.c): signatures, shape
 * checks and CPU references. Training (models/train.c) calls them through tk_op_run.
 *
 *   linear_backward     from grad_out [..., N] of out = x W^T + b (W [N, K]; transposed: W [K, N]):
 *                       grad_x      = grad_out W          [..., K]  (accumulate = 1: grad_x += it)
 *                       grad_weight += grad_out^T x       [N, K]    (transposed: x^T grad_out, [K, N])
 *                       grad_bias   += sum over rows of grad_out  [N]
 *   embedding_backward  grad_weight[ids[i], :] += grad_out[i, :], rows whose id is padding_idx skipped
 *                       (nn.Embedding's padding_idx: that row never gets a gradient)
 *
 * The weight and bias gradients are ACCUMULATED into, as PyTorch's .grad and as
 * fused_linear_cross_entropy's grad_weight: zero them before the first micro-batch. Each of the three
 * linear gradients is optional; their dtypes are independent of the inputs' (f32 gradients of bf16
 * activations are the mixed-precision case). The add op's backward is the identity (both terms get
 * grad_out), so it has no op of its own.
 *
 * Numerics. linear_backward converts every operand to dense fp32 (in place when already so) and
 * multiplies with OpenBLAS's cblas_sgemm, fp32 products and accumulation, beta = 1 for the
 * accumulating outputs, then rounds once to each output's dtype; grad_bias sums the rows in double in
 * row order, adds the old value and rounds once. embedding_backward adds rows in fp32 in the order of
 * the ids (each column block is owned by one thread, rows walked in order), so the result does not
 * depend on the thread count and is the same on every run: deterministic, as the GPU kernel is.
 * An id outside [0, V) is an error raised before anything is written.
 *
 * Threads: cblas_sgemm is called from the calling thread only (ops/layers.c says why).
 */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"

#define BLK 256                      /* columns per work item of embedding_backward */

static int is_f32(tk_dtype dt) { return dt.code == TK_DL_FLOAT && dt.bits == 32 && dt.lanes == 1; }
static int64_t last_dim(const tk_tensor *t) { return t->shape[t->ndim - 1]; }
static int64_t rows_of(const tk_tensor *t) { return t->ndim > 1 ? tk_ops__numel(t) / last_dim(t) : 1; }

/* ---- dense fp32 views ------------------------------------------------------------------------- */

/* A tensor as a dense row-major [rows, cols] fp32 matrix: its own memory when it already is one, else
 * a converted copy (owned, freed by f32_done, which stores it back when `writeback`). */
typedef struct {
    const tk_tensor *t;
    float *p;
    float *owned;
    int64_t rows, cols;
} f32m;

typedef struct {
    f32m *m;
    int store;
} conv_job;

static void conv_range(void *arg, int64_t lo, int64_t hi)
{
    const conv_job *j = arg;
    const tk_tensor *t = j->m->t;
    int64_t cs = tk_ops__col_stride(t), n = j->m->cols;
    for (int64_t r = lo; r < hi; r++) {
        if (j->store)
            tk_ops__store_f32(tk_ops__base(t), tk_ops__row_offset(t, r), cs, j->m->p + r * n, n, t->dtype);
        else
            tk_ops__load_f32(j->m->p + r * n, tk_ops__base(t), tk_ops__row_offset(t, r), cs, n, t->dtype);
    }
}

/* load: 1 to read the tensor's values (inputs, and outputs that are accumulated into). */
static int f32_view(f32m *m, const tk_tensor *t, int load)
{
    memset(m, 0, sizeof *m);
    m->t = t;
    m->cols = t->ndim ? last_dim(t) : 1;
    m->rows = rows_of(t);
    if (is_f32(t->dtype) && tk_ops__contiguous(t)) {
        m->p = tk_ops__base(t);
        return TK_OK;
    }
    size_t n = (size_t)(m->rows * m->cols);
    if (!(m->owned = malloc((n ? n : 1) * sizeof(float))))
        return TK_ERR_NOMEM;
    m->p = m->owned;
    if (load && n) {
        conv_job j = {m, 0};
        tk_ops__parallel(m->rows, m->cols, conv_range, &j);
    } else if (n) {
        memset(m->owned, 0, n * sizeof(float));
    }
    return TK_OK;
}

/* Rounds a converted output back into its tensor, and frees the copy. */
static void f32_done(f32m *m, int store)
{
    if (m->owned && store && m->rows * m->cols > 0) {
        conv_job j = {m, 1};
        tk_ops__parallel(m->rows, m->cols, conv_range, &j);
    }
    free(m->owned);
    m->owned = NULL;
}

/* ---- linear_backward(grad_x, grad_weight, grad_bias, grad_out, x, weight, transposed, accumulate) -- */

enum { LB_GX, LB_GW, LB_GB, LB_GO, LB_X, LB_W, LB_TRANS, LB_ACC };

static int shape_is(const tk_tensor *t, int32_t n, const int64_t *want)
{
    if (t->ndim != n)
        return 0;
    for (int32_t k = 0; k < n; k++)
        if (t->shape[k] != want[k])
            return 0;
    return 1;
}

static int check_linear_bwd(const tk_op_call *c)
{
    const char *op = c->op->name;
    const tk_tensor *go = c->t[LB_GO], *x = c->t[LB_X], *w = c->t[LB_W];
    int64_t tr = c->i[LB_TRANS];
    if (tr != 0 && tr != 1)
        return tk__err(TK_ERR_INVALID,
                       "%s: 'transposed' is %lld, want 0 (weight [N, K]) or 1 (weight [K, N], "
                       "GPT-2's Conv1D)",
                       op, (long long)tr);
    if (c->i[LB_ACC] != 0 && c->i[LB_ACC] != 1)
        return tk__err(TK_ERR_INVALID, "%s: 'accumulate' is %lld, want 0 (grad_x = ...) or 1 (grad_x += ...)", op,
                       (long long)c->i[LB_ACC]);
    int64_t n = w->shape[tr ? 1 : 0], k = w->shape[tr ? 0 : 1];
    const char *layout = tr ? "[K, N] with transposed=1" : "[N, K]";
    int64_t want[TK_OPS_MAX_RANK];
    for (int32_t d = 0; d < x->ndim; d++)
        want[d] = x->shape[d];
    if (last_dim(x) != k)
        return tk__err(TK_ERR_INVALID, "%s: 'x' has shape %s, but 'weight' %s (%s) wants K = %lld columns", op,
                       tk_ops__shape_fmt(x->ndim, x->shape), tk_ops__shape_fmt(w->ndim, w->shape), layout,
                       (long long)k);
    want[x->ndim - 1] = n;
    if (!shape_is(go, x->ndim, want))
        return tk__err(TK_ERR_INVALID,
                       "%s: 'grad_out' has shape %s, want %s (the forward's out: the leading "
                       "dimensions of 'x' %s, then N of 'weight' %s, %s)",
                       op, tk_ops__shape_fmt(go->ndim, go->shape), tk_ops__shape_fmt(x->ndim, want),
                       tk_ops__shape_fmt(x->ndim, x->shape), tk_ops__shape_fmt(w->ndim, w->shape), layout);
    if (c->t[LB_GX] && !tk_ops__same_shape(c->t[LB_GX], x))
        return tk__err(TK_ERR_INVALID, "%s: 'grad_x' has shape %s, want %s (the shape of 'x')", op,
                       tk_ops__shape_fmt(c->t[LB_GX]->ndim, c->t[LB_GX]->shape), tk_ops__shape_fmt(x->ndim, x->shape));
    if (c->t[LB_GW] && !tk_ops__same_shape(c->t[LB_GW], w))
        return tk__err(TK_ERR_INVALID, "%s: 'grad_weight' has shape %s, want %s (the shape of 'weight')", op,
                       tk_ops__shape_fmt(c->t[LB_GW]->ndim, c->t[LB_GW]->shape), tk_ops__shape_fmt(w->ndim, w->shape));
    if (c->t[LB_GB] && c->t[LB_GB]->shape[0] != n)
        return tk__err(TK_ERR_INVALID,
                       "%s: 'grad_bias' has shape %s, want [%lld] (N, one per output channel of "
                       "'weight' %s, %s)",
                       op, tk_ops__shape_fmt(c->t[LB_GB]->ndim, c->t[LB_GB]->shape), (long long)n,
                       tk_ops__shape_fmt(w->ndim, w->shape), layout);
    if (!c->t[LB_GX] && !c->t[LB_GW] && !c->t[LB_GB])
        return tk__err(TK_ERR_INVALID,
                       "%s: none of 'grad_x', 'grad_weight', 'grad_bias' is given: nothing to "
                       "compute",
                       op);
    if (n > INT_MAX || k > INT_MAX || rows_of(x) > INT_MAX)
        return tk__err(TK_ERR_UNSUPPORTED,
                       "%s: a dimension of 'x' %s or 'weight' %s is above %d, more than BLAS "
                       "takes",
                       op, tk_ops__shape_fmt(x->ndim, x->shape), tk_ops__shape_fmt(w->ndim, w->shape), INT_MAX);
    return TK_OK;
}

typedef struct {
    const float *g;   /* [m, n] */
    double *acc;      /* [n] */
    int64_t m, n;
} colsum_job;

/* Items are column blocks: each sums its columns over every row, rows in order. */
static void colsum_range(void *arg, int64_t lo, int64_t hi)
{
    const colsum_job *j = arg;
    for (int64_t b = lo; b < hi; b++) {
        int64_t c0 = b * BLK, c1 = c0 + BLK < j->n ? c0 + BLK : j->n;
        for (int64_t r = 0; r < j->m; r++) {
            const float *gr = j->g + r * j->n;
            for (int64_t c = c0; c < c1; c++)
                j->acc[c] += gr[c];
        }
    }
}

static int cpu_linear_bwd(const tk_op_call *c)
{
    const tk_tensor *gx = c->t[LB_GX], *gw = c->t[LB_GW], *gb = c->t[LB_GB];
    int tr = c->i[LB_TRANS] != 0, acc = c->i[LB_ACC] != 0;
    f32m G, X, W, GX, GW;
    memset(&X, 0, sizeof X);
    memset(&W, 0, sizeof W);
    memset(&GX, 0, sizeof GX);
    memset(&GW, 0, sizeof GW);
    double *bsum = NULL;
    int rc = f32_view(&G, c->t[LB_GO], 1);
    int64_t m = G.rows, n = G.cols, k = last_dim(c->t[LB_X]);
    if (rc == TK_OK && gx) {
        /* grad_x [m, k] (+)= grad_out [m, n] @ W: W [n, k] as is, or W [k, n] transposed */
        if ((rc = f32_view(&W, c->t[LB_W], 1)) == TK_OK && (rc = f32_view(&GX, gx, acc)) == TK_OK && m > 0 && k > 0) {
            if (n > 0)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, tr ? CblasTrans : CblasNoTrans, (int)m, (int)k, (int)n, 1.0f,
                            G.p, (int)n, W.p, tr ? (int)n : (int)k, acc ? 1.0f : 0.0f, GX.p, (int)k);
            else if (!acc)
                memset(GX.p, 0, (size_t)(m * k) * sizeof(float));
        }
        if (rc == TK_OK)
            f32_done(&GX, 1);
    }
    if (rc == TK_OK && gw) {
        /* grad_weight [n, k] += grad_out^T x, or [k, n] += x^T grad_out */
        if ((rc = f32_view(&X, c->t[LB_X], 1)) == TK_OK && (rc = f32_view(&GW, gw, 1)) == TK_OK && m > 0 && n > 0 &&
            k > 0) {
            if (tr)
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)k, (int)n, (int)m, 1.0f, X.p, (int)k, G.p,
                            (int)n, 1.0f, GW.p, (int)n);
            else
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)n, (int)k, (int)m, 1.0f, G.p, (int)n, X.p,
                            (int)k, 1.0f, GW.p, (int)k);
        }
        if (rc == TK_OK)
            f32_done(&GW, 1);
    }
    if (rc == TK_OK && gb) {
        if (!(bsum = calloc((size_t)(n ? n : 1), sizeof *bsum))) {
            rc = TK_ERR_NOMEM;
        } else {
            colsum_job j = {G.p, bsum, m, n};
            tk_ops__parallel((n + BLK - 1) / BLK, m * BLK, colsum_range, &j);
            float v[BLK];
            int64_t cs = tk_ops__col_stride(gb);
            for (int64_t c0 = 0; c0 < n; c0 += BLK) {
                int64_t cnt = n - c0 < BLK ? n - c0 : BLK;
                tk_ops__load_f32(v, tk_ops__base(gb), c0 * cs, cs, cnt, gb->dtype);
                for (int64_t i = 0; i < cnt; i++)
                    v[i] = (float)((double)v[i] + bsum[c0 + i]);
                tk_ops__store_f32(tk_ops__base(gb), c0 * cs, cs, v, cnt, gb->dtype);
            }
        }
    }
    free(GX.owned);
    free(GW.owned);
    free(G.owned);
    free(X.owned);
    free(W.owned);
    free(bsum);
    if (rc == TK_ERR_NOMEM)
        return tk__err(TK_ERR_NOMEM, "%s: out of memory for the fp32 operands (M %lld, N %lld, K %lld)", c->op->name,
                       (long long)m, (long long)n, (long long)k);
    return rc;
}

/* ---- embedding_backward(grad_weight, grad_out, ids, padding_idx) ----------------------------------- */

enum { EB_GW, EB_GO, EB_IDS, EB_PAD };

static int check_embedding_bwd(const tk_op_call *c)
{
    const tk_tensor *gw = c->t[EB_GW], *go = c->t[EB_GO], *ids = c->t[EB_IDS];
    int64_t want[TK_OPS_MAX_RANK];
    int32_t wn = ids->ndim + 1;
    for (int32_t k = 0; k < ids->ndim; k++)
        want[k] = ids->shape[k];
    want[wn - 1] = gw->shape[1];
    if (!shape_is(go, wn, want))
        return tk__err(TK_ERR_INVALID,
                       "%s: 'grad_out' has shape %s, want %s (the shape of 'ids' %s, then D, the row "
                       "width of 'grad_weight' %s)",
                       c->op->name, tk_ops__shape_fmt(go->ndim, go->shape), tk_ops__shape_fmt(wn, want),
                       tk_ops__shape_fmt(ids->ndim, ids->shape), tk_ops__shape_fmt(gw->ndim, gw->shape));
    if (c->i[EB_PAD] < -1 || c->i[EB_PAD] >= gw->shape[0])
        return tk__err(TK_ERR_INVALID, "%s: 'padding_idx' is %lld, want -1 (none) or a row of 'grad_weight' %s",
                       c->op->name, (long long)c->i[EB_PAD], tk_ops__shape_fmt(gw->ndim, gw->shape));
    return TK_OK;
}

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

typedef struct {
    const tk_tensor *gw, *go;
    const int64_t *ids; /* [n] */
    int64_t n, d, pad;
} emb_job;

/* Items are column blocks: every row of grad_out is added into its id's row, rows in order. */
static void emb_range(void *arg, int64_t lo, int64_t hi)
{
    const emb_job *j = arg;
    float g[BLK], w[BLK];
    int64_t gcs = tk_ops__col_stride(j->go), wcs = tk_ops__col_stride(j->gw);
    for (int64_t b = lo; b < hi; b++) {
        int64_t c0 = b * BLK, cnt = j->d - c0 < BLK ? j->d - c0 : BLK;
        for (int64_t i = 0; i < j->n; i++) {
            if (j->ids[i] == j->pad)
                continue;
            int64_t go = tk_ops__row_offset(j->go, i) + c0 * gcs, wo = tk_ops__row_offset(j->gw, j->ids[i]) + c0 * wcs;
            tk_ops__load_f32(g, tk_ops__base(j->go), go, gcs, cnt, j->go->dtype);
            tk_ops__load_f32(w, tk_ops__base(j->gw), wo, wcs, cnt, j->gw->dtype);
            for (int64_t x = 0; x < cnt; x++)
                w[x] += g[x];
            tk_ops__store_f32(tk_ops__base(j->gw), wo, wcs, w, cnt, j->gw->dtype);
        }
    }
}

static int cpu_embedding_bwd(const tk_op_call *c)
{
    const tk_tensor *ids = c->t[EB_IDS], *gw = c->t[EB_GW];
    int64_t n = tk_ops__numel(ids), v = gw->shape[0];
    int64_t *idv = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    if (!idv)
        return tk__err(TK_ERR_NOMEM, "%s: out of memory", c->op->name);
    for (int64_t i = 0; i < n; i++) {
        idv[i] = id_at(ids, i);
        if (idv[i] < 0 || idv[i] >= v) {
            int64_t id = idv[i];
            free(idv);
            return tk__err(TK_ERR_INVALID,
                           "%s: ids holds %lld at flat index %lld, out of range for 'grad_weight' %s "
                           "(want 0 <= id < %lld)",
                           c->op->name, (long long)id, (long long)i, tk_ops__shape_fmt(gw->ndim, gw->shape),
                           (long long)v);
        }
    }
    emb_job j = {gw, c->t[EB_GO], idv, n, gw->shape[1], c->i[EB_PAD]};
    if (j.d > 0 && n > 0)
        tk_ops__parallel((j.d + BLK - 1) / BLK, n * BLK * 3, emb_range, &j);
    free(idv);
    return TK_OK;
}

/* ---- the table -------------------------------------------------------------------------------- */

static const tk_op_param linear_bwd_params[] = {
    TK_OPS_TENSOR_OPT("grad_x", TK_OPS_OUT, TK_OPS_FLOATS, -1, 1, -1, "[..., K]",
                      "grad_out @ weight (accumulate=1: added to what it holds)"),
    TK_OPS_TENSOR_OPT("grad_weight", TK_OPS_OUT, TK_OPS_FLOATS, -1, 2, 2, "[N, K]",
                      "+= grad_out^T x (accumulated: zero it first); [K, N] with transposed=1"),
    TK_OPS_TENSOR_OPT("grad_bias", TK_OPS_OUT, TK_OPS_FLOATS, -1, 1, 1, "[N]",
                      "+= the sum of grad_out's rows (accumulated: zero it first)"),
    TK_OPS_TENSOR("grad_out", TK_OPS_IN, TK_OPS_FLOATS, -1, 1, -1, "[..., N]", "the gradient of the forward's out"),
    TK_OPS_TENSOR("x", TK_OPS_IN, TK_OPS_FLOATS, 3, 1, -1, "[..., K]", "the forward's input"),
    TK_OPS_TENSOR("weight", TK_OPS_IN, TK_OPS_FLOATS, 3, 2, 2, "[N, K]",
                  "the forward's weight ([K, N] with transposed=1)"),
    TK_OPS_SCALAR("transposed", TK_ARG_I64, 0, "1: weight is [K, N] (GPT-2's Conv1D), as in linear"),
    TK_OPS_SCALAR("accumulate", TK_ARG_I64, 0, "1: grad_x += grad_out @ weight (a second branch into the same input)"),
};

static const tk_op_param embedding_bwd_params[] = {
    TK_OPS_TENSOR("grad_weight", TK_OPS_OUT, TK_OPS_FLOATS, -1, 2, 2, "[V, D]",
                  "grad_weight[ids[i]] += grad_out[i] (accumulated: zero it first)"),
    TK_OPS_TENSOR("grad_out", TK_OPS_IN, TK_OPS_FLOATS, -1, 1, -1, "[..., D]", "the gradient of the forward's out"),
    TK_OPS_TENSOR("ids", TK_OPS_IN, TK_OPS_I32 | TK_OPS_I64, -1, 0, TK_OPS_MAX_RANK - 1, "[...]",
                  "the forward's ids, each in [0, V)"),
    TK_OPS_SCALAR("padding_idx", TK_ARG_I64, -1,
                  "rows with this id add nothing (nn.Embedding's padding_idx); -1: none"),
};

#define PKG "kernels-community/layers"
#define COUNT(a) (sizeof a / sizeof a[0])

const tk_op_desc tk_ops__backward_layers[] = {
    {"linear_backward", "layers",
     "grad_x = grad_out @ W (or += with accumulate=1); grad_weight += grad_out^T x; grad_bias += sum(grad_out)",
     linear_bwd_params, COUNT(linear_bwd_params), check_linear_bwd, cpu_linear_bwd, NULL, NULL},
    {"embedding_backward", "layers",
     "grad_weight[ids[i], :] += grad_out[i, :]  (deterministic; padding_idx rows skipped)", embedding_bwd_params,
     COUNT(embedding_bwd_params), check_embedding_bwd, cpu_embedding_bwd, NULL, PKG},
};
const size_t tk_ops__backward_layers_count = COUNT(tk_ops__backward_layers);
