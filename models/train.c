/*
 * train.c — training: the optimiser, the loss, the step, and saving and resuming; and the backward
 * steps the families' train_backward is made of (their forward and backward live beside their
 * inference forward, as llm.c's gpt2_forward / gpt2_backward).
 *
 * A micro-batch (tk_train_accumulate): the family's train_forward keeps what its backward needs (every
 * layer's activations, or with activation checkpointing each layer's input only, the layer recomputed
 * in backward); the LM head and the loss run here (fused_linear_cross_entropy, or logits and
 * cross_entropy), with reduction = sum so accumulating micro-batches adds exact sums; then the family's
 * train_backward from the head input's gradient accumulates every weight's gradient (f32). A step
 * (tk_train_step): N = the non-ignored targets accumulated, the global norm ||g|| / N of the mean
 * loss's gradients (sum_squares per tensor, added in double), clip_grad_norm_'s coefficient
 * min(1, max_norm / (norm + 1e-6)), then one adamw op per weight with grad_scale = coef / N and the
 * scheduled lr (transformers' linear warmup + cosine), and the gradients are zeroed. Weights with one
 * dimension (norms, biases) and embedding tables form the no-decay group unless decay_all is set.
 *
 * Checkpoints are Hugging Face directories (model.safetensors f32 under the HF names: the families'
 * fused weights are split back, c_attn rebuilt from its q/k/v columns) plus optimizer.safetensors and
 * trainer_state.json, written into a temporary sibling, fsynced and renamed, so a kill at any moment
 * leaves the previous checkpoint whole.
 *
 * Everything goes through tk_op_run (models never call kernels), so the same code trains on the CPU
 * references or on GPU kernels. On the CPU every op is deterministic, so a run repeats bit for bit and
 * a resume continues it exactly.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <dirent.h>
#include <unistd.h>

#include "models/models.h"

#define TRAIN_MAGIC 0x74726e72u /* "trnr" */
#define STATE_FORMAT "tk-train-state"
#define STATE_VERSION 1

static const tk_dtype F32 = {TK_DL_FLOAT, 32, 1};
static const tk_dtype F64 = {TK_DL_FLOAT, 64, 1};
static const tk_dtype I64 = {TK_DL_INT, 64, 1};

/* One trained weight: its gradient and AdamW's moments, on the model's device. */
typedef struct {
    tk_models_weight *w;
    tk_mt grad, m1, m2;
    void *mem; /* grad, m1, m2 in one allocation */
    int64_t n;
    int decay;
} tweight;

/* One HF tensor of the checkpoint: assembled from parts of weights. */
typedef struct {
    tweight *tw;
    int kind;        /* TK_MODELS_SRC_* */
    int64_t a;       /* CAT: first element in the weight; COLS: first column in the HF tensor */
} part;

typedef struct {
    char *name;
    int ndim;
    int64_t shape[2], n;
    part parts[4];
    int np;
} hf_tensor;

struct tk_trainer {
    uint32_t magic;
    tk_model *m;
    tk_train_opts o;
    tweight *tw;
    size_t ntw;
    hf_tensor *hf;
    size_t nhf;
    int64_t step;
    int64_t tokens;     /* non-ignored targets accumulated since the last step */
    double loss_sum;    /* their loss */
    int64_t micro;      /* micro-batches since the last step */
    int have_logits;    /* the last batch's logits are in m->batch.logits */
    int fused;          /* the LM head and loss as one fused_linear_cross_entropy (opts' -1: on a GPU) */
    void *scratch;      /* [ntw] f64 on the device: sum_squares outputs */
    int64_t grad_bytes, opt_bytes, param_bytes;
    tk_comm *comm;      /* data parallel over > 1 ranks, else NULL */
    float *bucket;      /* data parallel on the CPU: small gradients packed for one all-reduce */
};

/* Gradients are all-reduced in buckets of at most this many bytes (a larger tensor alone, in place). */
#define DP_BUCKET_BYTES ((size_t)4 << 20)

/* ---- small device helpers --------------------------------------------------------------------- */

static void mt_init(tk_mt *t, void *data, tk_dtype dt, int ndim, const int64_t *shape, const tk_model *m)
{
    memset(t, 0, sizeof *t);
    t->t.data = data;
    t->t.dtype = dt;
    t->t.ndim = ndim;
    t->t.device.device_type = m->dev_type;
    t->t.device.device_id = m->dev_id;
    for (int i = 0; i < ndim; i++)
        t->shape[i] = shape[i];
    t->t.shape = t->shape;
}

static int64_t mt_numel(const tk_mt *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->t.ndim; i++)
        n *= t->shape[i];
    return n;
}

static int zero(tk_model *m, void *p, size_t bytes)
{
    if (m->dev_type == TK_DEV_CUDA)
        return tk_device_memset(p, 0, bytes, m->dev_id);
    memset(p, 0, bytes);
    return TK_OK;
}

static int op(tk_model *m, const char *name, const tk_arg *a, size_t n)
{
    int rc = tk_op_run(m->ctx, name, a, n, NULL, NULL);
    return rc == TK_OK ? TK_OK : tk__err_wrap(rc, "%s training, op %s", m->arch->name, name);
}

/* ---- what the families use -------------------------------------------------------------------- */

tk_models_weight *tk_models__weight_of(const tk_mt *w)
{
    return w ? (tk_models_weight *)((char *)w - offsetof(tk_models_weight, mt)) : NULL;
}

const tk_mt *tk_models__grad(const tk_mt *w)
{
    tk_models_weight *x = tk_models__weight_of(w);
    return x ? x->grad : NULL;
}

void tk_models__mark_embedding(const tk_mt *w)
{
    tk_models_weight *x = tk_models__weight_of(w);
    if (x)
        x->embedding = 1;
}

int tk_models__t_layers(tk_model *m, tk_mt **arr, int64_t n, tk_dtype dt, int ndim, const int64_t *shape)
{
    if (!*arr && !(*arr = calloc((size_t)m->cfg.layers + 1, sizeof **arr)))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    for (int64_t l = 0; l < n; l++) {
        int rc = tk_models__ws_tensor(m, &(*arr)[l], dt, ndim, shape);
        if (rc != TK_OK)
            return rc;
    }
    return TK_OK;
}

int tk_models__train_plan_head(tk_model *m, tk_models_batch *b)
{
    int64_t T = b->T, one = 1, H = m->cfg.hidden, gs[2] = {2, H}, th[2] = {T, b->hidden->shape[1]},
            tv[2] = {T, m->cfg.vocab};
    int rc;
    if ((rc = tk_models__ws_tensor(m, &b->targets, I64, 1, &T)) ||
        (rc = tk_models__ws_tensor(m, &b->loss, F32, 1, &one)) ||
        (rc = tk_models__ws_tensor(m, &b->gscratch, F32, 2, gs)) ||
        (rc = tk_models__ws_tensor(m, &b->d_hidden, m->dtype, 2, th)))
        return rc;
    struct tk_trainer *t = m->trainer;
    if (t && !t->fused) {
        if ((rc = tk_models__ws_tensor(m, &b->tlogits, m->dtype, 2, tv)) ||
            (rc = tk_models__ws_tensor(m, &b->dlogits, m->dtype, 2, tv)))
            return rc;
        b->logits = &b->tlogits;
    }
    return TK_OK;
}

int tk_models__train_check(tk_model *m, const char *what, int64_t layer, const tk_mt *t)
{
    if (!m->train_check)
        return TK_OK;
    void *d = NULL;
    double v = 0;
    int64_t one = 1;
    int rc = tk_models__dev_alloc(m, &d, sizeof(double));
    if (rc != TK_OK)
        return rc;
    tk_mt out;
    mt_init(&out, d, F64, 1, &one, m);
    tk_arg a[] = {TK_A_T("out", &out), TK_A_T("input", t)};
    if ((rc = op(m, "sum_squares", a, 2)) == TK_OK)
        rc = tk_models__from_dev(m, &v, d, sizeof v);
    tk_models__dev_free(m, d);
    if (rc != TK_OK)
        return rc;
    if (!isfinite(v)) {
        if (layer >= 0)
            return tk__err(TK_ERR_INVALID, "layer %lld: the %s is the first tensor that holds NaN or inf",
                           (long long)layer, what);
        return tk__err(TK_ERR_INVALID, "the %s is the first tensor that holds NaN or inf", what);
    }
    return TK_OK;
}

int tk_models__t_linear_bwd(tk_model *m, const tk_mt *gx, int accumulate, const tk_mt *go, const tk_mt *x,
                            const tk_mt *w, const tk_mt *bias, int transposed)
{
    const tk_mt *gw = tk_models__grad(w), *gb = bias ? tk_models__grad(bias) : NULL;
    tk_arg a[8];
    size_t n = 0;
    if (gx)
        a[n++] = (tk_arg){TK_ARG_TENSOR, "grad_x", &gx->t, 0, 0};
    if (gw)
        a[n++] = (tk_arg){TK_ARG_TENSOR, "grad_weight", &gw->t, 0, 0};
    if (gb)
        a[n++] = (tk_arg){TK_ARG_TENSOR, "grad_bias", &gb->t, 0, 0};
    if (n == 0)
        return TK_OK;
    a[n++] = (tk_arg)TK_A_T("grad_out", go);
    a[n++] = (tk_arg)TK_A_T("x", x);
    a[n++] = (tk_arg)TK_A_T("weight", w);
    a[n++] = (tk_arg)TK_A_I("transposed", transposed);
    a[n++] = (tk_arg)TK_A_I("accumulate", accumulate);
    return op(m, "linear_backward", a, n);
}

/* grad(w) += g: the norm backwards overwrite their weight gradients, so they go through a scratch. */
static int grad_add(tk_model *m, const tk_mt *w, const tk_mt *g)
{
    const tk_mt *gw = tk_models__grad(w);
    if (!gw)
        return TK_OK;
    tk_arg a[] = {TK_A_T("out", gw), TK_A_T("a", gw), TK_A_T("b", g)};
    return op(m, "add", a, 3);
}

int tk_models__grad_add(tk_model *m, const tk_mt *w, const tk_mt *g) { return grad_add(m, w, g); }

int tk_models__t_norm_bwd(tk_model *m, int rms, const tk_mt *gi, const tk_mt *go, const tk_mt *gres, const tk_mt *x,
                          const tk_mt *w, const tk_mt *bias)
{
    tk_models_batch *b = &m->batch;
    int64_t H = w->shape[0];
    tk_mt sw, sb;
    tk_models__view(&sw, &b->gscratch, 1, &H);
    sb = sw;
    sb.t.data = (char *)b->gscratch.t.data + (size_t)b->gscratch.shape[1] * sizeof(float);
    sb.t.shape = sb.shape;
    tk_arg a[9];
    size_t n = 0;
    a[n++] = (tk_arg)TK_A_T("grad_input", gi);
    a[n++] = (tk_arg)TK_A_T("grad_weight", &sw);
    if (!rms && bias)
        a[n++] = (tk_arg)TK_A_T("grad_bias", &sb);
    a[n++] = (tk_arg)TK_A_T("grad_out", go);
    if (gres) {
        a[n++] = (tk_arg)TK_A_T("grad_residual", gres);
        a[n++] = (tk_arg)TK_A_T("residual", x);
    } else {
        a[n++] = (tk_arg)TK_A_T("input", x);
    }
    a[n++] = (tk_arg)TK_A_T("weight", w);
    a[n++] = (tk_arg)TK_A_F("eps", m->cfg.eps);
    const char *name = rms ? (gres ? "fused_add_rms_norm_backward" : "rms_norm_backward")
                           : (gres ? "fused_add_layer_norm_backward" : "layer_norm_backward");
    int rc = op(m, name, a, n);
    if (rc == TK_OK)
        rc = grad_add(m, w, &sw);
    if (rc == TK_OK && !rms && bias)
        rc = grad_add(m, bias, &sb);
    return rc;
}

int tk_models__t_emb_bwd(tk_model *m, const tk_mt *go, const tk_mt *ids, const tk_mt *w, int64_t pad)
{
    const tk_mt *gw = tk_models__grad(w);
    if (!gw)
        return TK_OK;
    if (pad < 0 || pad >= w->shape[0])
        pad = -1;
    tk_arg a[] = {TK_A_T("grad_weight", gw), TK_A_T("grad_out", go), TK_A_T("ids", ids), TK_A_I("padding_idx", pad)};
    return op(m, "embedding_backward", a, 4);
}

/* 4-D views of q-like [T, H, D] tensors: [nseq, S, H, D] when every sequence has S tokens (the dense
 * kernels), else [1, T, H, D] with cu_seqlens (varlen); lse [Hq * T] as [nseq, Hq, S] or [1, Hq, T]. */
static int dense(const tk_models_batch *b) { return b->nseq * b->max_len == b->T; }

static void view4(tk_mt *v, const tk_models_batch *b, const tk_mt *t)
{
    int64_t h = t->shape[t->t.ndim - 2], d = t->shape[t->t.ndim - 1];
    int64_t s4[4] = {dense(b) ? b->nseq : 1, dense(b) ? b->max_len : b->T, h, d};
    tk_models__view(v, t, 4, s4);
}

static void view_lse(tk_mt *v, const tk_models_batch *b, const tk_mt *lse, int64_t hq)
{
    int64_t s3[3] = {dense(b) ? b->nseq : 1, hq, dense(b) ? b->max_len : b->T};
    tk_models__view(v, lse, 3, s3);
}

int tk_models__t_attention(tk_model *m, tk_models_batch *b, const tk_mt *out, const tk_mt *lse, const tk_mt *q,
                           const tk_mt *k, const tk_mt *v, double scale, int causal, int64_t window_left)
{
    tk_mt o4, q4, k4, v4, l3;
    view4(&o4, b, out);
    view4(&q4, b, q);
    view4(&k4, b, k);
    view4(&v4, b, v);
    view_lse(&l3, b, lse, q->shape[q->t.ndim - 2]);
    tk_arg a[] = {TK_A_T("out", &o4),
                  TK_A_T("q", &q4),
                  TK_A_T("k", &k4),
                  TK_A_T("v", &v4),
                  TK_A_T("lse", &l3),
                  TK_A_F("scale", scale),
                  TK_A_I("causal", causal),
                  TK_A_I("window_left", window_left),
                  TK_A_T("cu_seqlens_q", &b->cu),
                  TK_A_T("cu_seqlens_k", &b->cu),
                  TK_A_I("max_seqlen_q", b->max_len)};
    return op(m, "attention", a, dense(b) ? 8 : 11);
}

int tk_models__t_attention_bwd(tk_model *m, tk_models_batch *b, const tk_mt *dq, const tk_mt *dk, const tk_mt *dv,
                               const tk_mt *dout, const tk_mt *q, const tk_mt *k, const tk_mt *v, const tk_mt *out,
                               const tk_mt *lse, double scale, int causal, int64_t window_left)
{
    tk_mt dq4, dk4, dv4, do4, q4, k4, v4, o4, l3;
    view4(&dq4, b, dq);
    view4(&dk4, b, dk);
    view4(&dv4, b, dv);
    view4(&do4, b, dout);
    view4(&q4, b, q);
    view4(&k4, b, k);
    view4(&v4, b, v);
    view4(&o4, b, out);
    view_lse(&l3, b, lse, q->shape[q->t.ndim - 2]);
    tk_arg a[] = {TK_A_T("dq", &dq4),
                  TK_A_T("dk", &dk4),
                  TK_A_T("dv", &dv4),
                  TK_A_T("dout", &do4),
                  TK_A_T("q", &q4),
                  TK_A_T("k", &k4),
                  TK_A_T("v", &v4),
                  TK_A_T("out", &o4),
                  TK_A_T("lse", &l3),
                  TK_A_F("scale", scale),
                  TK_A_I("causal", causal),
                  TK_A_I("window_left", window_left),
                  TK_A_T("cu_seqlens_q", &b->cu),
                  TK_A_T("cu_seqlens_k", &b->cu),
                  TK_A_I("max_seqlen_q", b->max_len)};
    return op(m, "attention_backward", a, dense(b) ? 12 : 15);
}

/* ---- the trainer ------------------------------------------------------------------------------ */

static int check_trainer(const tk_trainer *t, const char *fn)
{
    if (!t || t->magic != TRAIN_MAGIC)
        return tk__err(TK_ERR_INVALID, "%s: not a tk_trainer (NULL or freed)", fn);
    return TK_OK;
}

static int check_opts(const tk_train_opts *o)
{
    if (o->version < 1 || o->version > TK_TRAIN_OPTS_VERSION)
        return tk__err(TK_ERR_INVALID, "tk_train_new: opts->version is %u, want 1 to %d (TK_TRAIN_OPTS_INIT)",
                       o->version, TK_TRAIN_OPTS_VERSION);
    if (!(o->lr >= 0) || !isfinite(o->lr))
        return tk__err(TK_ERR_INVALID, "training: lr is %g, want a finite value >= 0", o->lr);
    if (!(o->beta1 >= 0 && o->beta1 < 1) || !(o->beta2 >= 0 && o->beta2 < 1))
        return tk__err(TK_ERR_INVALID, "training: betas are (%g, %g), want each in [0, 1)", o->beta1, o->beta2);
    if (!(o->eps >= 0) || !isfinite(o->eps))
        return tk__err(TK_ERR_INVALID, "training: eps is %g, want a finite value >= 0", o->eps);
    if (!(o->weight_decay >= 0) || !isfinite(o->weight_decay))
        return tk__err(TK_ERR_INVALID, "training: weight_decay is %g, want a finite value >= 0", o->weight_decay);
    if (isnan(o->max_grad_norm) || isinf(o->max_grad_norm))
        return tk__err(TK_ERR_INVALID, "training: max_grad_norm is %g, want a finite value (<= 0: no clipping)",
                       o->max_grad_norm);
    if (o->warmup_steps < 0 || o->total_steps < 0)
        return tk__err(TK_ERR_INVALID, "training: warmup_steps %lld and total_steps %lld must be >= 0",
                       (long long)o->warmup_steps, (long long)o->total_steps);
    if (!(o->min_lr_ratio >= 0 && o->min_lr_ratio <= 1))
        return tk__err(TK_ERR_INVALID, "training: min_lr_ratio is %g, want 0 to 1", o->min_lr_ratio);
    if (!(o->label_smoothing >= 0 && o->label_smoothing < 1))
        return tk__err(TK_ERR_INVALID, "training: label_smoothing is %g, want 0 <= it < 1", o->label_smoothing);
    return TK_OK;
}

/* The HF tensor named `name`, made on first sight. */
static hf_tensor *hf_get(tk_trainer *t, const char *name, int ndim, int64_t r, int64_t c)
{
    for (size_t i = 0; i < t->nhf; i++)
        if (!strcmp(t->hf[i].name, name))
            return &t->hf[i];
    hf_tensor *h = &t->hf[t->nhf];
    memset(h, 0, sizeof *h);
    if (!(h->name = tk__strdup(name)))
        return NULL;
    h->ndim = ndim;
    h->shape[0] = r;
    h->shape[1] = c;
    h->n = ndim == 2 ? r * c : r;
    t->nhf++;
    return h;
}

static int build_hf(tk_trainer *t)
{
    size_t cap = 0;
    for (size_t i = 0; i < t->ntw; i++)
        cap += (size_t)(t->tw[i].w->src.n ? t->tw[i].w->src.n : 1);
    if (!(t->hf = calloc(cap + 1, sizeof *t->hf)))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < t->ntw; i++) {
        tweight *tw = &t->tw[i];
        const tk_models_src *s = &tw->w->src;
        const tk_mt *mt = &tw->w->mt;
        if (s->n < 1)
            return tk__err(TK_ERR_INTERNAL, "training: a weight without a checkpoint name");
        for (int k = 0; k < (s->kind == TK_MODELS_SRC_CAT ? s->n : 1); k++) {
            hf_tensor *h;
            if (s->kind == TK_MODELS_SRC_WHOLE)
                h = hf_get(t, s->names[0], mt->t.ndim, mt->shape[0], mt->t.ndim > 1 ? mt->shape[1] : 0);
            else if (s->kind == TK_MODELS_SRC_CAT)
                h = hf_get(t, s->names[k], s->cols ? 2 : 1, s->rows, s->cols);
            else
                h = s->rows ? hf_get(t, s->names[0], 2, s->rows, s->cols) : hf_get(t, s->names[0], 1, s->cols, 0);
            if (!h)
                return tk__err(TK_ERR_NOMEM, "out of memory");
            if (h->np == 4)
                return tk__err(TK_ERR_INTERNAL, "training: tensor '%s' in more than 4 parts", h->name);
            part *p = &h->parts[h->np++];
            p->tw = tw;
            p->kind = s->kind;
            p->a = s->kind == TK_MODELS_SRC_CAT    ? k * s->rows * (s->cols ? s->cols : 1)
                   : s->kind == TK_MODELS_SRC_COLS ? s->c0
                                                   : 0;
        }
    }
    return TK_OK;
}

/* The buffer of a trained weight that `what` names. */
static const tk_mt *buf_of(tweight *tw, int what)
{
    switch (what) {
    case TK_TRAIN_PARAM: return &tw->w->mt;
    case TK_TRAIN_GRAD: return &tw->grad;
    case TK_TRAIN_EXP_AVG: return &tw->m1;
    default: return &tw->m2;
    }
}

/* Copies HF tensor h's `what` to (put = 0) or from (put = 1) host f32 memory `host`. */
static int hf_xfer(tk_trainer *t, const hf_tensor *h, int what, float *host, int put)
{
    tk_model *m = t->m;
    int rc = TK_OK;
    for (int i = 0; i < h->np && rc == TK_OK; i++) {
        const part *p = &h->parts[i];
        char *base = buf_of(p->tw, what)->t.data;
        if (p->kind != TK_MODELS_SRC_COLS) {
            int64_t off = p->kind == TK_MODELS_SRC_CAT ? p->a : 0;
            size_t bytes = (size_t)h->n * sizeof(float);
            rc = put ? tk_models__to_dev(m, base + off * 4, host, bytes)
                     : tk_models__from_dev(m, host, base + off * 4, bytes);
            continue;
        }
        /* columns [a, a + nc) of h's rows are the weight's rows */
        int64_t rows = h->ndim == 2 ? h->shape[0] : 1, cols = h->ndim == 2 ? h->shape[1] : h->shape[0];
        int64_t nc = p->tw->w->src.nc;
        for (int64_t r = 0; r < rows && rc == TK_OK; r++) {
            float *hp = host + r * cols + p->a;
            char *wp = base + (size_t)(r * nc) * 4;
            rc = put ? tk_models__to_dev(m, wp, hp, (size_t)nc * 4) : tk_models__from_dev(m, hp, wp, (size_t)nc * 4);
        }
    }
    return rc;
}

static const hf_tensor *hf_find(const tk_trainer *t, const char *name)
{
    for (size_t i = 0; name && i < t->nhf; i++)
        if (!strcmp(t->hf[i].name, name))
            return &t->hf[i];
    return NULL;
}

void tk_train_free(tk_trainer *t)
{
    if (!t || t->magic != TRAIN_MAGIC)
        return;
    tk_model *m = t->m;
    for (size_t i = 0; i < t->ntw; i++) {
        t->tw[i].w->grad = NULL;
        tk_models__dev_free(m, t->tw[i].mem);
    }
    for (size_t i = 0; i < t->nhf; i++)
        free(t->hf[i].name);
    free(t->hf);
    free(t->tw);
    tk_models__dev_free(m, t->scratch);
    free(t->bucket);
    if (m && m->trainer == t) {
        m->trainer = NULL;
        m->training = 0;
        m->train_ckpt = 0;
        m->train_check = 0;
    }
    t->magic = 0;
    free(t);
}

int tk_train_new(tk_trainer **out, tk_model *m, const tk_train_opts *opts)
{
    *out = NULL;
    tk_train_opts def = TK_TRAIN_OPTS_INIT;
    if (!opts)
        opts = &def;
    int rc = check_opts(opts);
    if (rc != TK_OK)
        return rc;
    if (!m || !m->arch)
        return tk__err(TK_ERR_INVALID, "tk_train_new: not a loaded model");
    if (!m->arch->train_plan)
        return tk__err(TK_ERR_UNSUPPORTED,
                       "%s: tk cannot train this architecture\nHINT: tk trains LlamaForCausalLM, "
                       "MistralForCausalLM, Qwen2ForCausalLM, GPT2LMHeadModel and BertForMaskedLM",
                       m->cfg.arch);
    if (!(m->dtype.code == TK_DL_FLOAT && m->dtype.bits == 32))
        return tk__err(TK_ERR_UNSUPPORTED,
                       "%s: training needs f32 weights (the master weights AdamW updates); this "
                       "model computes in %s\nHINT: load it with dtype f32 (tk_model_opts.dtype = \"f32\", tk train "
                       "--dtype f32)",
                       m->cfg.arch, tk_dtype_name(m->dtype));
    if (m->tp)
        return tk__err(TK_ERR_UNSUPPORTED,
                       "%s: the model is split over %d ranks (tensor parallelism), which tk "
                       "does not train\nHINT: train it in one process (data-parallel training is to come: "
                       "docs/parallel.md)",
                       m->cfg.arch, m->tp->world);
    if (m->quant.bits)
        return tk__err(TK_ERR_UNSUPPORTED,
                       "%s: weight-only quantisation is on; training needs the float weights\n"
                       "HINT: tk_model_quantize(model, \"none\") first",
                       m->cfg.arch);
    if (m->trainer)
        return tk__err(TK_ERR_INVALID, "%s: the model already has a trainer; free it first", m->cfg.arch);
    const tk_mt *hw = NULL, *hb = NULL;
    m->arch->train_head(m, &hw, &hb);
    if (!hw)
        return tk__err(TK_ERR_UNSUPPORTED,
                       "%s checkpoint '%s' has no LM head to train (BertModel without "
                       "cls.predictions.*)\nHINT: tk trains BERT as BertForMaskedLM",
                       m->cfg.arch, m->dir);
    tk_trainer *t = calloc(1, sizeof *t);
    if (!t)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    t->magic = TRAIN_MAGIC;
    t->m = m;
    /* a version-1 caller's struct ends before comm */
    memcpy(&t->o, opts, opts->version >= 2 ? sizeof t->o : offsetof(tk_train_opts, comm));
    t->o.version = TK_TRAIN_OPTS_VERSION;
    if (opts->version < 2)
        t->o.comm = NULL;
    if (t->o.comm && tk_comm_size(t->o.comm) > 1) {
        t->comm = t->o.comm;
        if (m->dev_type == TK_DEV_CUDA && strcmp(tk_comm_backend(t->comm), "nccl")) {
            rc = tk__err(TK_ERR_UNSUPPORTED,
                         "%s: data-parallel training of a GPU model needs the NCCL backend; the "
                         "communicator is '%s'\nHINT: tk_comm_opts.backend = TK_COMM_NCCL, or train on the CPU",
                         m->cfg.arch, tk_comm_backend(t->comm));
            goto fail;
        }
        if (m->dev_type != TK_DEV_CUDA && !(t->bucket = malloc(DP_BUCKET_BYTES))) {
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
            goto fail;
        }
    }
    /* auto: fused on a GPU (its kernel never holds the logits); on the CPU the logits and two OpenBLAS
     * products are several times faster than the fused reference's chunked loops */
    t->fused = opts->fused_loss < 0 ? m->dev_type == TK_DEV_CUDA : opts->fused_loss != 0;
    if (!(t->tw = calloc(m->nw ? m->nw : 1, sizeof *t->tw))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < m->nw; i++) {
        tk_models_weight *w = m->w[i];
        tweight *tw = &t->tw[t->ntw++];
        tw->w = w;
        tw->n = mt_numel(&w->mt);
        size_t bytes = (size_t)tw->n * sizeof(float);
        /* a weight read in place from the mapping becomes a copy AdamW may write (the model's huge-page
         * copies are its own memory already) */
        if (w->mapped) {
            void *p = NULL;
            if ((rc = tk_models__dev_alloc(m, &p, bytes)) != TK_OK)
                goto fail;
            memcpy(p, w->mt.t.data, bytes); /* only CPU weights are mapped */
            w->owned = p;
            w->mt.t.data = p;
            m->mapped_bytes -= (int64_t)bytes;
            w->mapped = 0;
        }
        if ((rc = tk_models__dev_alloc(m, &tw->mem, 3 * bytes)) != TK_OK || (rc = zero(m, tw->mem, 3 * bytes)) != TK_OK)
            goto fail;
        mt_init(&tw->grad, tw->mem, F32, w->mt.t.ndim, w->mt.shape, m);
        mt_init(&tw->m1, (char *)tw->mem + bytes, F32, w->mt.t.ndim, w->mt.shape, m);
        mt_init(&tw->m2, (char *)tw->mem + 2 * bytes, F32, w->mt.t.ndim, w->mt.shape, m);
        tw->decay = opts->decay_all || (w->mt.t.ndim >= 2 && !w->embedding);
        t->grad_bytes += (int64_t)bytes;
        t->opt_bytes += 2 * (int64_t)bytes;
        t->param_bytes += (int64_t)bytes;
    }
    for (size_t i = 0; i < t->ntw; i++)
        t->tw[i].w->grad = &t->tw[i].grad;
    if ((rc = build_hf(t)) != TK_OK)
        goto fail;
    if ((rc = tk_models__dev_alloc(m, &t->scratch, (t->ntw + 1) * sizeof(double))) != TK_OK)
        goto fail;
    m->trainer = t;
    m->training = 1;
    m->train_ckpt = opts->checkpointing != 0;
    m->planned = 0; /* plan again: the training activations */
    *out = t;
    return TK_OK;
fail:
    tk_train_free(t);
    return rc;
}

int64_t tk_train_step_count(const tk_trainer *t) { return t && t->magic == TRAIN_MAGIC ? t->step : 0; }

/* transformers' get_cosine_schedule_with_warmup (get_constant_schedule_with_warmup when total_steps is
 * 0; the min-lr variant's floor): the lr of the step after `done` steps. */
static double lr_at(const tk_train_opts *o, int64_t done)
{
    if (done < o->warmup_steps)
        return o->lr * (double)done / (double)(o->warmup_steps > 1 ? o->warmup_steps : 1);
    if (o->total_steps <= 0)
        return o->lr;
    int64_t span = o->total_steps - o->warmup_steps;
    double progress = (double)(done - o->warmup_steps) / (double)(span > 1 ? span : 1);
    double f = 0.5 * (1.0 + cos(M_PI * 0.5 * 2.0 * progress));
    f = f > 0 ? f : 0;
    return o->lr * (f * (1.0 - o->min_lr_ratio) + o->min_lr_ratio);
}

/* After a non-finite loss: the first parameter, or the first forward tensor, that holds NaN or inf. */
static int diagnose(tk_trainer *t, double loss)
{
    loss = isnan(loss) ? NAN : loss; /* "nan", never "-nan" */
    tk_model *m = t->m;
    int64_t one = 1;
    for (size_t i = 0; i < t->ntw; i++) {
        double v = 0;
        tk_mt out;
        mt_init(&out, t->scratch, F64, 1, &one, m);
        tk_arg a[] = {TK_A_T("out", &out), TK_A_T("input", &t->tw[i].w->mt)};
        if (op(m, "sum_squares", a, 2) == TK_OK && tk_models__from_dev(m, &v, t->scratch, sizeof v) == TK_OK &&
            !isfinite(v))
            return tk__err(TK_ERR_INVALID,
                           "step %lld: the loss is %g; parameter '%s' holds NaN or inf\nHINT: a "
                           "lower learning rate, or clipping (max_grad_norm)",
                           (long long)t->step + 1, loss, t->tw[i].w->src.names[0]);
    }
    m->train_check = 1;
    int rc = m->arch->train_forward(m, &m->batch);
    m->train_check = 0;
    if (rc != TK_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", tk_last_error());
        return tk__err(rc,
                       "step %lld: the loss is %g; %s\nHINT: a lower learning rate, or clipping "
                       "(max_grad_norm); the checkpoint's weights may be too large for f32 activations",
                       (long long)t->step + 1, loss, why);
    }
    return tk__err(TK_ERR_INVALID,
                   "step %lld: the loss is %g, but every activation is finite: the LM head's "
                   "logits overflow\nHINT: a lower learning rate, or clipping (max_grad_norm)",
                   (long long)t->step + 1, loss);
}

/* The forward and the head's loss (and with grad, the head's gradients and d_hidden). */
static int forward_loss(tk_trainer *t, const int32_t *ids, const int64_t *targets, const size_t *lens, size_t nseq,
                        int grad, double *loss, int64_t *ntok)
{
    tk_model *m = t->m;
    const tk_train_opts *o = &t->o;
    if (!targets)
        return tk__err(TK_ERR_INVALID, "training: targets is NULL (one per token: the class each position predicts, "
                                       "or ignore_index)");
    size_t T = 0;
    for (size_t s = 0; lens && s < nseq; s++)
        T += lens[s];
    int64_t n = 0;
    for (size_t i = 0; i < T; i++) {
        if (targets[i] == o->ignore_index)
            continue;
        if (targets[i] < 0 || targets[i] >= m->cfg.vocab)
            return tk__err(TK_ERR_INVALID,
                           "training: target %lld at position %zu is outside the vocabulary [0, %lld) "
                           "and is not ignore_index (%lld)",
                           (long long)targets[i], i, (long long)m->cfg.vocab, (long long)o->ignore_index);
        n++;
    }
    int rc = tk_models__prepare(m, ids, lens, nseq);
    if (rc == TK_ERR_NOMEM) {
        char why[512];
        snprintf(why, sizeof why, "%s", tk_last_error());
        return tk__err(rc, "training: %s%s\nHINT: fewer tokens per micro-batch (batch size x sequence length)%s", why,
                       m->train_ckpt ? " (with activation checkpointing)" : "",
                       m->train_ckpt ? "" : ", or activation checkpointing");
    }
    if (rc != TK_OK)
        return rc;
    tk_models_batch *b = &m->batch;
    if ((rc = tk_models__to_dev(m, b->targets.t.data, targets, T * sizeof(int64_t))) != TK_OK)
        return rc;
    t->have_logits = 0;
    if ((rc = m->arch->train_forward(m, b)) != TK_OK)
        return rc;
    const tk_mt *hw, *hb;
    m->arch->train_head(m, &hw, &hb);
    const tk_mt *gw = grad ? tk_models__grad(hw) : NULL, *gb = grad && hb ? tk_models__grad(hb) : NULL;
    if (t->fused) {
        tk_arg a[12];
        size_t k = 0;
        a[k++] = (tk_arg)TK_A_T("hidden", b->hidden);
        a[k++] = (tk_arg)TK_A_T("weight", hw);
        a[k++] = (tk_arg)TK_A_T("target", &b->targets);
        a[k++] = (tk_arg)TK_A_T("loss", &b->loss);
        if (hb)
            a[k++] = (tk_arg)TK_A_T("bias", hb);
        if (grad) {
            a[k++] = (tk_arg)TK_A_T("grad_hidden", &b->d_hidden);
            if (gw)
                a[k++] = (tk_arg)TK_A_T("grad_weight", gw);
            if (gb)
                a[k++] = (tk_arg)TK_A_T("grad_bias", gb);
        }
        a[k++] = (tk_arg)TK_A_I("ignore_index", o->ignore_index);
        a[k++] = (tk_arg)TK_A_F("label_smoothing", o->label_smoothing);
        a[k++] = (tk_arg)TK_A_I("reduction", 2);
        if ((rc = op(m, "fused_linear_cross_entropy", a, k)) != TK_OK)
            return rc;
    } else {
        tk_arg l[] = {TK_A_T("out", b->logits),
                      TK_A_T("x", b->hidden),
                      TK_A_T("weight", hw),
                      {TK_ARG_TENSOR, "bias", hb ? &hb->t : NULL, 0, 0}};
        if ((rc = op(m, "linear", l, hb ? 4 : 3)) != TK_OK)
            return rc;
        t->have_logits = 1;
        tk_arg a[8];
        size_t k = 0;
        a[k++] = (tk_arg)TK_A_T("logits", b->logits);
        a[k++] = (tk_arg)TK_A_T("target", &b->targets);
        a[k++] = (tk_arg)TK_A_T("loss", &b->loss);
        if (grad)
            a[k++] = (tk_arg)TK_A_T("grad", &b->dlogits);
        a[k++] = (tk_arg)TK_A_I("ignore_index", o->ignore_index);
        a[k++] = (tk_arg)TK_A_F("label_smoothing", o->label_smoothing);
        a[k++] = (tk_arg)TK_A_I("reduction", 2);
        if ((rc = op(m, "cross_entropy", a, k)) != TK_OK)
            return rc;
        if (grad && (rc = tk_models__t_linear_bwd(m, &b->d_hidden, 0, &b->dlogits, b->hidden, hw, hb, 0)) != TK_OK)
            return rc;
    }
    float lf = 0;
    if ((rc = tk_models__from_dev(m, &lf, b->loss.t.data, sizeof lf)) != TK_OK)
        return rc;
    if (!isfinite(lf))
        return diagnose(t, lf);
    *loss = lf;
    *ntok = n;
    return TK_OK;
}

int tk_train_accumulate(tk_trainer *t, const int32_t *ids, const int64_t *targets, const size_t *lens, size_t nseq,
                        double *loss)
{
    int rc = check_trainer(t, "tk_train_accumulate");
    if (rc != TK_OK)
        return rc;
    double l = 0;
    int64_t n = 0;
    if ((rc = forward_loss(t, ids, targets, lens, nseq, 1, &l, &n)) != TK_OK)
        return rc;
    tk_model *m = t->m;
    if ((rc = m->arch->train_backward(m, &m->batch, &m->batch.d_hidden)) != TK_OK)
        return rc;
    t->loss_sum += l;
    t->tokens += n;
    t->micro++;
    if (loss)
        *loss = n ? l / (double)n : 0.0;
    return TK_OK;
}

int tk_train_eval(tk_trainer *t, const int32_t *ids, const int64_t *targets, const size_t *lens, size_t nseq,
                  double *loss_sum, int64_t *tokens)
{
    int rc = check_trainer(t, "tk_train_eval");
    if (rc != TK_OK)
        return rc;
    double l = 0;
    int64_t n = 0;
    if ((rc = forward_loss(t, ids, targets, lens, nseq, 0, &l, &n)) != TK_OK)
        return rc;
    if (loss_sum)
        *loss_sum = l;
    if (tokens)
        *tokens = n;
    return TK_OK;
}

int tk_train_logits(tk_trainer *t, float *out)
{
    int rc = check_trainer(t, "tk_train_logits");
    if (rc != TK_OK)
        return rc;
    if (!t->have_logits)
        return tk__err(TK_ERR_INVALID, "tk_train_logits: %s",
                       t->fused ? "the fused loss never makes the logits "
                                  "(fused_loss = 0 keeps them)"
                                : "no batch yet");
    const tk_mt *lg = t->m->batch.logits;
    return tk_models__from_dev(t->m, out, lg->t.data, (size_t)mt_numel(lg) * sizeof(float));
}

/* Data parallel: one all-reduce (sum) of a device buffer of n f32 values. */
static int dp_sum(tk_trainer *t, void *data, int64_t n)
{
    tk_tensor x = {data, {t->m->dev_type, t->m->dev_id}, 1, F32, &n, NULL, 0};
    return tk_comm_all_reduce_sum(t->comm, &x, NULL);
}

/* Data parallel: sums the step's loss, token count and every gradient over the ranks. The gradients go
 * in weight order, packed into buckets of up to DP_BUCKET_BYTES (the norms and biases, too small for an
 * all-reduce each to be worth its latency, travel together; a tensor larger than a bucket is reduced in
 * place alone). On a GPU (NCCL) each tensor is reduced in place. */
static int dp_reduce(tk_trainer *t)
{
    double head[2] = {t->loss_sum, (double)t->tokens}; /* counts below 2^53 are exact in f64 */
    int64_t two = 2;
    tk_tensor h = {head, {TK_DEV_CPU, 0}, 1, F64, &two, NULL, 0};
    int rc = tk_comm_all_reduce_sum(t->comm, &h, NULL);
    if (rc != TK_OK)
        return tk__err_wrap(rc, "step %lld: summing the loss over %d ranks", (long long)t->step + 1,
                            tk_comm_size(t->comm));
    t->loss_sum = head[0];
    t->tokens = (int64_t)head[1];
    const size_t cap = DP_BUCKET_BYTES / sizeof(float);
    size_t i = 0;
    while (i < t->ntw && rc == TK_OK) {
        if (!t->bucket || (size_t)t->tw[i].n > cap) {
            rc = dp_sum(t, t->tw[i].grad.t.data, t->tw[i].n);
            i++;
            continue;
        }
        size_t k = i, used = 0;
        for (; k < t->ntw && (size_t)t->tw[k].n <= cap - used; k++) {
            memcpy(t->bucket + used, t->tw[k].grad.t.data, (size_t)t->tw[k].n * sizeof(float));
            used += (size_t)t->tw[k].n;
        }
        if ((rc = dp_sum(t, t->bucket, (int64_t)used)) != TK_OK)
            break;
        for (used = 0; i < k; i++) {
            memcpy(t->tw[i].grad.t.data, t->bucket + used, (size_t)t->tw[i].n * sizeof(float));
            used += (size_t)t->tw[i].n;
        }
    }
    if (rc != TK_OK)
        return tk__err_wrap(rc, "step %lld: summing the gradients over %d ranks", (long long)t->step + 1,
                            tk_comm_size(t->comm));
    return TK_OK;
}

int tk_train_step(tk_trainer *t, tk_train_stats *st)
{
    int rc = check_trainer(t, "tk_train_step");
    if (rc != TK_OK)
        return rc;
    tk_model *m = t->m;
    const tk_train_opts *o = &t->o;
    if (t->micro == 0)
        return tk__err(TK_ERR_INVALID, "tk_train_step: nothing accumulated since the last step\nHINT: call "
                                       "tk_train_accumulate first");
    if (t->comm && (rc = dp_reduce(t)) != TK_OK)
        return rc;
    if (t->tokens == 0)
        return tk__err(TK_ERR_INVALID,
                       "step %lld: every target of its %lld micro-batches is ignore_index: no loss "
                       "to step on",
                       (long long)t->step + 1, (long long)t->micro);
    /* the global norm of the mean loss's gradient: sqrt(sum of every tensor's sum of squares) / N */
    int64_t one = 1;
    double total = 0;
    for (size_t i = 0; i < t->ntw; i++) {
        tk_mt out;
        mt_init(&out, (char *)t->scratch + i * sizeof(double), F64, 1, &one, m);
        tk_arg a[] = {TK_A_T("out", &out), TK_A_T("input", &t->tw[i].grad)};
        if ((rc = op(m, "sum_squares", a, 2)) != TK_OK)
            return rc;
    }
    double *ss = malloc((t->ntw + 1) * sizeof *ss);
    if (!ss)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    if ((rc = tk_models__from_dev(m, ss, t->scratch, t->ntw * sizeof *ss)) != TK_OK) {
        free(ss);
        return rc;
    }
    for (size_t i = 0; i < t->ntw; i++) {
        if (!isfinite(ss[i])) {
            rc = tk__err(TK_ERR_INVALID,
                         "step %lld: the gradient of '%s' holds NaN or inf\nHINT: a lower learning "
                         "rate, or clipping (max_grad_norm)",
                         (long long)t->step + 1, t->tw[i].w->src.names[0]);
            free(ss);
            return rc;
        }
        total += ss[i];
    }
    free(ss);
    double N = (double)t->tokens, norm = sqrt(total) / N, coef = 1.0;
    if (o->max_grad_norm > 0) {
        coef = o->max_grad_norm / (norm + 1e-6);
        coef = coef < 1.0 ? coef : 1.0;
    }
    double lr = lr_at(o, t->step);
    for (size_t i = 0; i < t->ntw; i++) {
        tweight *tw = &t->tw[i];
        tk_arg a[] = {TK_A_T("param", &tw->w->mt),
                      TK_A_T("grad", &tw->grad),
                      TK_A_T("exp_avg", &tw->m1),
                      TK_A_T("exp_avg_sq", &tw->m2),
                      TK_A_F("lr", lr),
                      TK_A_F("beta1", o->beta1),
                      TK_A_F("beta2", o->beta2),
                      TK_A_F("eps", o->eps),
                      TK_A_F("weight_decay", tw->decay ? o->weight_decay : 0.0),
                      TK_A_I("step", t->step + 1),
                      TK_A_F("grad_scale", coef / N)};
        if ((rc = op(m, "adamw", a, TK_NARGS(a))) != TK_OK)
            return rc;
        if ((rc = zero(m, tw->grad.t.data, (size_t)tw->n * sizeof(float))) != TK_OK)
            return rc;
    }
    t->step++;
    if (st) {
        st->step = t->step;
        st->loss = t->loss_sum / N;
        st->lr = lr;
        st->grad_norm = norm;
        st->tokens = t->tokens;
    }
    t->loss_sum = 0;
    t->tokens = 0;
    t->micro = 0;
    return TK_OK;
}

size_t tk_train_tensor_count(const tk_trainer *t) { return t && t->magic == TRAIN_MAGIC ? t->nhf : 0; }

const char *tk_train_tensor_name(const tk_trainer *t, size_t i, int64_t *numel)
{
    if (!t || t->magic != TRAIN_MAGIC || i >= t->nhf)
        return NULL;
    if (numel)
        *numel = t->hf[i].n;
    return t->hf[i].name;
}

int tk_train_tensor_get(tk_trainer *t, const char *name, int what, float *out, size_t n)
{
    int rc = check_trainer(t, "tk_train_tensor_get");
    if (rc != TK_OK)
        return rc;
    const hf_tensor *h = hf_find(t, name);
    if (!h)
        return tk__err(TK_ERR_NOT_FOUND, "training: no trained tensor named '%s'", name ? name : "(null)");
    if (what < TK_TRAIN_PARAM || what > TK_TRAIN_EXP_AVG_SQ)
        return tk__err(TK_ERR_INVALID,
                       "tk_train_tensor_get: 'what' is %d, want TK_TRAIN_PARAM, _GRAD, _EXP_AVG or "
                       "_EXP_AVG_SQ",
                       what);
    if ((int64_t)n != h->n)
        return tk__err(TK_ERR_INVALID, "tk_train_tensor_get: '%s' has %lld elements, the buffer %zu", name,
                       (long long)h->n, n);
    if ((rc = hf_xfer(t, h, what, out, 0)) != TK_OK)
        return rc;
    if (what == TK_TRAIN_GRAD && t->tokens > 0)
        for (size_t i = 0; i < n; i++)
            out[i] = (float)((double)out[i] / (double)t->tokens);
    return TK_OK;
}

int tk_train_info_json(char **out, const tk_trainer *t)
{
    *out = NULL;
    int rc = check_trainer(t, "tk_train_info_json");
    if (rc != TK_OK)
        return rc;
    int64_t params = 0;
    for (size_t i = 0; i < t->ntw; i++)
        params += t->tw[i].n;
    json_t *o = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:b, s:b}", "step", (json_int_t)t->step, "parameters",
                          (json_int_t)params, "param_bytes", (json_int_t)t->param_bytes, "grad_bytes",
                          (json_int_t)t->grad_bytes, "optimizer_bytes", (json_int_t)t->opt_bytes, "activation_bytes",
                          (json_int_t)(t->m->planned ? t->m->ws_bytes : 0), "checkpointing", t->o.checkpointing != 0,
                          "fused_loss", t->fused != 0);
    if (!o)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    *out = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    return *out ? TK_OK : tk__err(TK_ERR_NOMEM, "out of memory");
}

/* ---- saving and resuming ---------------------------------------------------------------------- */

/* One tensor of a safetensors file being written: host bytes, or an HF tensor's buffer assembled. */
typedef struct {
    char *name;
    const char *dtype;
    int ndim;
    int64_t shape[TK_ST_MAX_RANK];
    size_t bytes;
    const void *data;  /* NULL: from h */
    const hf_tensor *h;
    int what;
} st_item;

/* Writes n bytes to a new file (O_EXCL, never through a link) and syncs it. */
static int write_new(const char *path, const void *data, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0)
        return tk__err_sys("cannot create", path);
    int rc = tk__write_all(fd, data, n, path);
    if (rc == TK_OK && fsync(fd) != 0)
        rc = tk__err_sys("cannot sync", path);
    if (close(fd) != 0 && rc == TK_OK)
        rc = tk__err_sys("cannot close", path);
    return rc;
}

static int write_st(tk_trainer *t, const char *path, const st_item *it, size_t n)
{
    json_t *hdr = json_object(), *meta = json_pack("{s:s}", "format", "pt");
    int rc = TK_OK, fd = -1;
    char *text = NULL;
    float *buf = NULL;
    size_t off = 0, maxn = 0;
    if (!hdr || !meta || json_object_set_new(hdr, "__metadata__", meta)) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *shape = json_array();
        for (int d = 0; d < it[i].ndim; d++)
            json_array_append_new(shape, json_integer(it[i].shape[d]));
        json_t *e = json_pack("{s:s, s:o, s:[I, I]}", "dtype", it[i].dtype, "shape", shape, "data_offsets",
                              (json_int_t)off, (json_int_t)(off + it[i].bytes));
        if (!e || json_object_set_new(hdr, it[i].name, e)) {
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
            goto done;
        }
        off += it[i].bytes;
        if (!it[i].data && it[i].bytes > maxn)
            maxn = it[i].bytes;
    }
    if (!(text = json_dumps(hdr, JSON_COMPACT | JSON_PRESERVE_ORDER))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    size_t hl = strlen(text), pad = (8 - hl % 8) % 8;
    uint8_t len8[8];
    uint64_t total = hl + pad;
    for (int k = 0; k < 8; k++)
        len8[k] = (uint8_t)(total >> (8 * k));
    if (maxn && !(buf = malloc(maxn))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory writing '%s'", path);
        goto done;
    }
    if ((fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644)) < 0) {
        rc = tk__err_sys("cannot create", path);
        goto done;
    }
    if ((rc = tk__write_all(fd, len8, 8, path)) || (rc = tk__write_all(fd, text, hl, path)) ||
        (rc = tk__write_all(fd, "        ", pad, path)))
        goto done;
    for (size_t i = 0; i < n && rc == TK_OK; i++) {
        const void *p = it[i].data;
        if (!p) {
            if ((rc = hf_xfer(t, it[i].h, it[i].what, buf, 0)) != TK_OK)
                break;
            p = buf;
        }
        rc = tk__write_all(fd, p, it[i].bytes, path);
    }
    if (rc == TK_OK && fsync(fd) != 0)
        rc = tk__err_sys("cannot sync", path);
done:
    if (fd >= 0 && close(fd) != 0 && rc == TK_OK)
        rc = tk__err_sys("cannot close", path);
    free(buf);
    free(text);
    json_decref(hdr);
    return rc;
}

/* A checkpoint tensor tk does not train but must keep (a buffer, a pooler), unless it is a tied alias
 * of one it trains (transformers ties them again at load; a stale copy would shadow the trained one). */
static int keep_extra(const tk_trainer *t, const char *name)
{
    if (hf_find(t, name))
        return 0;
    int tie = t->m->cfg.tie_embeddings;
    if (tie && (!strcmp(name, "lm_head.weight") || tk__has_suffix(name, "cls.predictions.decoder.weight")))
        return 0;
    if (tk__has_suffix(name, "cls.predictions.decoder.bias") || tk__has_suffix(name, "cls.predictions.bias"))
        return 0; /* one parameter under two names: the trained one is saved */
    return 1;
}

static int save_weights(tk_trainer *t, const char *path, int optimizer)
{
    tk_model *m = t->m;
    size_t cap = 2 * t->nhf + tk_models__st_count(m->st) + 1, n = 0;
    st_item *it = calloc(cap, sizeof *it);
    int rc = it ? TK_OK : tk__err(TK_ERR_NOMEM, "out of memory");
    for (int pass = 0; rc == TK_OK && pass < (optimizer ? 2 : 1); pass++)
        for (size_t i = 0; rc == TK_OK && i < t->nhf; i++) {
            const hf_tensor *h = &t->hf[i];
            st_item *x = &it[n++];
            x->name = optimizer ? tk__fmt("%s.%s", pass ? "exp_avg_sq" : "exp_avg", h->name) : tk__strdup(h->name);
            if (!x->name)
                rc = tk__err(TK_ERR_NOMEM, "out of memory");
            x->dtype = "F32";
            x->ndim = h->ndim;
            x->shape[0] = h->shape[0];
            x->shape[1] = h->shape[1];
            x->bytes = (size_t)h->n * sizeof(float);
            x->h = h;
            x->what = optimizer ? (pass ? TK_TRAIN_EXP_AVG_SQ : TK_TRAIN_EXP_AVG) : TK_TRAIN_PARAM;
        }
    for (size_t i = 0; rc == TK_OK && !optimizer && i < tk_models__st_count(m->st); i++) {
        const tk_st_tensor *s = tk_models__st_at(m->st, i);
        if (!keep_extra(t, s->name))
            continue;
        st_item *x = &it[n++];
        if (!(x->name = tk__strdup(s->name)))
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
        x->dtype = tk_models__st_dtype_name(s->dtype);
        x->ndim = s->ndim;
        for (int d = 0; d < s->ndim; d++)
            x->shape[d] = s->shape[d];
        x->bytes = (size_t)(s->end - s->begin);
        x->data = s->data;
    }
    if (rc == TK_OK)
        rc = write_st(t, path, it, n);
    for (size_t i = 0; it && i < n; i++)
        free(it[i].name);
    free(it);
    return rc;
}

/* config.json with its dtype made float32 (the weights are saved in f32; tk refuses a config whose
 * torch_dtype disagrees with the weights). */
static int save_config(tk_trainer *t, const char *dst)
{
    char *src = tk__path_join(t->m->dir, "config.json"), *text = NULL, *out = NULL;
    size_t len = 0;
    json_t *j = NULL;
    int rc = src ? tk__read_file(&text, &len, src, 16u << 20) : tk__err(TK_ERR_NOMEM, "out of memory");
    if (rc == TK_OK && !(j = json_loadb(text, len, 0, NULL)))
        rc = tk__err(TK_ERR_INVALID, "'%s' is not JSON", src);
    if (rc == TK_OK) {
        int had = 0;
        if (json_object_get(j, "dtype")) {
            json_object_set_new(j, "dtype", json_string("float32"));
            had = 1;
        }
        if (json_object_get(j, "torch_dtype") || !had)
            json_object_set_new(j, "torch_dtype", json_string("float32"));
        if (!(out = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER)))
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
    }
    if (rc == TK_OK)
        rc = write_new(dst, out, strlen(out));
    free(out);
    json_decref(j);
    free(text);
    free(src);
    return rc;
}

/* The model directory's other files (tokenizer, generation config, README, ...), regular files only. */
static int copy_files(tk_trainer *t, const char *dst)
{
    DIR *d = opendir(t->m->dir);
    if (!d)
        return tk__err_sys("cannot read", t->m->dir);
    int rc = TK_OK;
    struct dirent *e;
    while (rc == TK_OK && (e = readdir(d))) {
        const char *nm = e->d_name;
        if (nm[0] == '.' || tk__has_suffix(nm, ".safetensors") || tk__has_suffix(nm, ".safetensors.index.json") ||
            !strcmp(nm, "config.json") || !strcmp(nm, "trainer_state.json") || tk__has_suffix(nm, ".bin") ||
            tk__has_suffix(nm, ".pt") || tk__has_suffix(nm, ".pth"))
            continue;
        char *s = tk__path_join(t->m->dir, nm), *o = tk__path_join(dst, nm);
        struct stat st;
        if (!s || !o)
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
        else if (lstat(s, &st) == 0 && S_ISREG(st.st_mode))
            rc = tk__copy_file(s, o, 0644);
        free(s);
        free(o);
    }
    closedir(d);
    return rc;
}

static json_t *opts_json(const tk_train_opts *o)
{
    return json_pack("{s:f, s:f, s:f, s:f, s:f, s:b, s:f, s:I, s:I, s:f, s:b, s:I, s:I, s:f}", "lr", o->lr, "beta1",
                     o->beta1, "beta2", o->beta2, "eps", o->eps, "weight_decay", o->weight_decay, "decay_all",
                     o->decay_all != 0, "max_grad_norm", o->max_grad_norm, "warmup_steps", (json_int_t)o->warmup_steps,
                     "total_steps", (json_int_t)o->total_steps, "min_lr_ratio", o->min_lr_ratio, "checkpointing",
                     o->checkpointing != 0, "fused_loss", (json_int_t)o->fused_loss, "ignore_index",
                     (json_int_t)o->ignore_index, "label_smoothing", o->label_smoothing);
}

int tk_train_save(tk_trainer *t, const char *dir, const char *extra_json)
{
    int rc = check_trainer(t, "tk_train_save");
    if (rc != TK_OK)
        return rc;
    if (!dir || !*dir)
        return tk__err(TK_ERR_INVALID, "tk_train_save: no directory");
    if (tk__path_exists(dir))
        return tk__err(TK_ERR_INVALID,
                       "checkpoint directory '%s' exists already; a checkpoint is written whole, "
                       "never over another",
                       dir);
    json_t *extra = NULL, *st = NULL;
    if (extra_json && !(extra = json_loads(extra_json, JSON_DECODE_ANY, NULL)))
        return tk__err(TK_ERR_INVALID, "tk_train_save: extra_json is not JSON");
    char *parent = tk__dirname(dir), *base = NULL, *tmp = NULL, *p = NULL, *text = NULL;
    const char *slash = strrchr(dir, '/');
    base = tk__strdup(slash ? slash + 1 : dir);
    tmp = parent && base ? tk__tmp_path(parent, base) : NULL;
    if (!tmp) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((rc = tk__mkdirs(parent, 0755)) != TK_OK)
        goto done;
    if (mkdir(tmp, 0755) != 0) {
        rc = tk__err_sys("cannot create the checkpoint directory", tmp);
        goto done;
    }
#define STEP(expr)                                                                                                     \
    do {                                                                                                               \
        if ((rc = (expr)) != TK_OK)                                                                                    \
            goto undo;                                                                                                 \
    } while (0)
#define PATH(nm)                                                                                                       \
    do {                                                                                                               \
        free(p);                                                                                                       \
        if (!(p = tk__path_join(tmp, nm))) {                                                                           \
            rc = tk__err(TK_ERR_NOMEM, "out of memory");                                                               \
            goto undo;                                                                                                 \
        }                                                                                                              \
    } while (0)
    PATH("model.safetensors");
    STEP(save_weights(t, p, 0));
    PATH("optimizer.safetensors");
    STEP(save_weights(t, p, 1));
    PATH("config.json");
    STEP(save_config(t, p));
    STEP(copy_files(t, tmp));
    st = json_pack("{s:s, s:i, s:I, s:s, s:s, s:o}", "format", STATE_FORMAT, "version", STATE_VERSION, "step",
                   (json_int_t)t->step, "architecture", t->m->cfg.arch, "tk_version", TK_VERSION_STRING, "opts",
                   opts_json(&t->o));
    if (!st || (extra && json_object_set(st, "extra", extra)) ||
        !(text = json_dumps(st, JSON_INDENT(2) | JSON_PRESERVE_ORDER))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto undo;
    }
    PATH("trainer_state.json");
    STEP(write_new(p, text, strlen(text)));
    STEP(tk__fsync_dir(tmp));
    if (rename(tmp, dir) != 0) {
        rc = tk__err_sys("cannot move the checkpoint into place", dir);
        goto undo;
    }
    rc = tk__fsync_dir(parent);
    goto done;
undo:
    tk__rmtree(tmp);
done:
#undef STEP
#undef PATH
    json_decref(extra);
    json_decref(st);
    free(text);
    free(p);
    free(tmp);
    free(base);
    free(parent);
    return rc;
}

/* The Adam moments of every trained tensor from the optimiser state's safetensors (parsed: ts). */
static int load_moments(tk_trainer *t, const tk_st_tensor *ts, size_t nts, const char *op)
{
    int rc = TK_OK;
    for (size_t i = 0; i < t->nhf && rc == TK_OK; i++) {
        const hf_tensor *h = &t->hf[i];
        for (int pass = 0; pass < 2 && rc == TK_OK; pass++) {
            char *nm = tk__fmt("%s.%s", pass ? "exp_avg_sq" : "exp_avg", h->name);
            const tk_st_tensor *x = NULL;
            for (size_t k = 0; nm && k < nts; k++)
                if (!strcmp(ts[k].name, nm))
                    x = &ts[k];
            if (!nm)
                rc = tk__err(TK_ERR_NOMEM, "out of memory");
            else if (!x)
                rc = tk__err(TK_ERR_INVALID, "'%s' has no tensor '%s'\nHINT: the state belongs to another model", op,
                             nm);
            else if (x->dtype != TK_ST_F32 || (int64_t)(x->end - x->begin) != h->n * 4)
                rc = tk__err(TK_ERR_INVALID, "'%s': tensor '%s' is %s with %lld bytes, want F32 with %lld", op, nm,
                             tk_models__st_dtype_name(x->dtype), (long long)(x->end - x->begin), (long long)h->n * 4);
            else {
                float *buf = malloc((size_t)h->n * sizeof(float) + 1);
                if (!buf) {
                    rc = tk__err(TK_ERR_NOMEM, "out of memory");
                } else {
                    memcpy(buf, x->data, (size_t)h->n * sizeof(float));
                    rc = hf_xfer(t, h, pass ? TK_TRAIN_EXP_AVG_SQ : TK_TRAIN_EXP_AVG, buf, 1);
                    free(buf);
                }
            }
            free(nm);
        }
    }
    return rc;
}

int tk_train_resume(tk_trainer *t, const char *dir, char **extra_json)
{
    if (extra_json)
        *extra_json = NULL;
    int rc = check_trainer(t, "tk_train_resume");
    if (rc != TK_OK)
        return rc;
    char *sp = dir ? tk__path_join(dir, "trainer_state.json") : NULL,
         *op = dir ? tk__path_join(dir, "optimizer.safetensors") : NULL;
    char *text = NULL, *rd = NULL, *rm = NULL;
    size_t len = 0;
    json_t *st = NULL;
    tk_st_tensor *ts = NULL;
    size_t nts = 0;
    void *map = MAP_FAILED;
    size_t maplen = 0;
    int fd = -1;
    if (!sp || !op) {
        rc = tk__err(TK_ERR_INVALID, "tk_train_resume: no directory");
        goto done;
    }
    if (!tk__path_exists(sp)) {
        rc = tk__err(TK_ERR_NOT_FOUND,
                     "'%s' has no trainer_state.json: not a checkpoint tk train wrote\nHINT: "
                     "resume from a checkpoint directory (tk_train_save)",
                     dir);
        goto done;
    }
    rd = realpath(dir, NULL);
    rm = realpath(t->m->dir, NULL);
    if (rd && rm && strcmp(rd, rm)) {
        rc = tk__err(TK_ERR_INVALID,
                     "the model was loaded from '%s' but the training state is in '%s'\nHINT: load "
                     "the model from the checkpoint directory you resume",
                     t->m->dir, dir);
        goto done;
    }
    if ((rc = tk__read_file(&text, &len, sp, 16u << 20)) != TK_OK)
        goto done;
    json_t *fmt, *ver, *step;
    if (!(st = json_loadb(text, len, 0, NULL)) || !json_is_string(fmt = json_object_get(st, "format")) ||
        strcmp(json_string_value(fmt), STATE_FORMAT) || !json_is_integer(ver = json_object_get(st, "version")) ||
        !json_is_integer(step = json_object_get(st, "step")) || json_integer_value(step) < 0) {
        rc = tk__err(TK_ERR_INVALID, "'%s' is not a tk training state (want format \"%s\" and a step)", sp,
                     STATE_FORMAT);
        goto done;
    }
    if (json_integer_value(ver) != STATE_VERSION) {
        rc = tk__err(TK_ERR_UNSUPPORTED, "'%s' has version %lld; this tk reads version %d", sp,
                     (long long)json_integer_value(ver), STATE_VERSION);
        goto done;
    }
    struct stat sb;
    if ((fd = open(op, O_RDONLY | O_CLOEXEC)) < 0) {
        rc = errno == ENOENT ? tk__err(TK_ERR_NOT_FOUND, "'%s' is missing: the optimiser state", op)
                             : tk__err_sys("cannot open", op);
        goto done;
    }
    if (fstat(fd, &sb) != 0 || sb.st_size < 8) {
        rc = tk__err(TK_ERR_INVALID, "'%s' is too short to be a safetensors file", op);
        goto done;
    }
    maplen = (size_t)sb.st_size;
    if ((map = mmap(NULL, maplen, PROT_READ, MAP_PRIVATE, fd, 0)) == MAP_FAILED) {
        rc = tk__err_sys("cannot map", op);
        goto done;
    }
    if ((rc = tk_models__st_parse(&ts, &nts, map, maplen, op)) != TK_OK)
        goto done;
    if ((rc = load_moments(t, ts, nts, op)) != TK_OK)
        goto done;
    for (size_t i = 0; i < t->ntw && rc == TK_OK; i++)
        rc = zero(t->m, t->tw[i].grad.t.data, (size_t)t->tw[i].n * sizeof(float));
    t->step = json_integer_value(step);
    t->tokens = 0;
    t->loss_sum = 0;
    t->micro = 0;
    json_t *extra = json_object_get(st, "extra");
    if (rc == TK_OK && extra && extra_json &&
        !(*extra_json = json_dumps(extra, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY)))
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
done:
    if (ts)
        tk_models__st_free(ts, nts);
    if (map != MAP_FAILED)
        munmap(map, maplen);
    if (fd >= 0)
        close(fd);
    json_decref(st);
    free(text);
    free(rd);
    free(rm);
    free(sp);
    free(op);
    return rc;
}
