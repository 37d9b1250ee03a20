/*
 * gpt2.c — GPT2LMHeadModel as transformers' modeling_gpt2.py computes it.
 *
 *   x = wte[ids] + wpe[positions]
 *   per layer: h = layer_norm(x, ln_1); q, k, v = h c_attn (+ bias); a = attention(q, k, v) (causal);
 *              x += a c_proj; h = layer_norm(x, ln_2); x += gelu_new(h c_fc) mlp.c_proj
 *   hidden = layer_norm(x, ln_f); logits = hidden wte^T (tied)
 *
 * GPT-2's projections are Conv1D: weights stored [in, out], used as they are with linear's
 * transposed=1. c_attn is one [H, 3H] weight; attention takes contiguous q, k and v, so its columns are
 * split once at load into three [H, H] weights (still [in, out]). Checkpoints name tensors with a
 * "transformer." prefix (save_pretrained of GPT2LMHeadModel) or without (the original gpt2 upload).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/models.h"

/* ---- config.json ---- */

static int parse(tk_models_config *c, const tk_models_reader *r)
{
    int rc, flag;
    if ((rc = tk_models__cfg_int(r, "vocab_size", INT64_MIN, 1, &c->vocab)) ||
        (rc = tk_models__cfg_int(r, "n_embd", INT64_MIN, 1, &c->hidden)) ||
        (rc = tk_models__cfg_int(r, "n_layer", INT64_MIN, 1, &c->layers)) ||
        (rc = tk_models__cfg_int(r, "n_head", INT64_MIN, 1, &c->heads)) ||
        (rc = tk_models__cfg_int(r, "n_positions", 1024, 1, &c->max_pos)) ||
        (rc = tk_models__cfg_int(r, "n_inner", 4 * c->hidden, 1, &c->intermediate)) ||
        (rc = tk_models__cfg_num(r->root, r->what, "layer_norm_epsilon", 1e-5, &c->eps)) ||
        (rc = tk_models__cfg_bool(r, "tie_word_embeddings", 1, &c->tie_embeddings)) ||
        (rc = tk_models__cfg_str(r, "activation_function", "gelu_new", c->act, sizeof c->act)))
        return rc;
    if (c->hidden % c->heads)
        return tk__err(TK_ERR_INVALID, "%s: n_embd %lld is not a multiple of n_head %lld", r->what,
                       (long long)c->hidden, (long long)c->heads);
    c->kv_heads = c->heads;
    c->head_dim = c->hidden / c->heads;
    static const char *const acts[] = {"gelu_new", "gelu", "gelu_pytorch_tanh", "gelu_fast", "quick_gelu", NULL};
    if ((rc = tk_models__cfg_act(r, "activation_function", c->act, acts,
                                 "gelu_new, gelu, gelu_pytorch_tanh, gelu_fast, quick_gelu")) != TK_OK)
        return rc;
    if ((rc = tk_models__cfg_bool(r, "scale_attn_by_inverse_layer_idx", 0, &flag)) != TK_OK)
        return rc;
    if (flag)
        return tk_models__cfg_unsupported(r, "scale_attn_by_inverse_layer_idx", "true", "false");
    if ((rc = tk_models__cfg_bool(r, "add_cross_attention", 0, &flag)) != TK_OK)
        return rc;
    if (flag)
        return tk_models__cfg_unsupported(r, "add_cross_attention", "true",
                                          "false (GPT2LMHeadModel without an encoder)");
    if ((rc = tk_models__cfg_bool(r, "scale_attn_weights", 1, &flag)) != TK_OK)
        return rc;
    c->unscaled_attn = !flag;
    return TK_OK;
}

typedef struct {
    const tk_mt *ln1_w, *ln1_b, *q, *k, *v, *qb, *kb, *vb, *proj, *proj_b, *ln2_w, *ln2_b, *fc, *fc_b, *out, *out_b;
} layer_w;

typedef struct {
    const tk_mt *wte, *wpe, *lnf_w, *lnf_b, *lm_head;
    layer_w *l;
    const char *act_op;
    tk_mt x, h1, h2, pe, q, k, v, att, o, f, g, logits;
    tk_mt head_view; /* tensor parallelism, tied: the LM head's rows of wte */
    /* Training: xs[l] is layer l's input (xs[L] the final norm's); the other arrays hold every layer's
     * saved activations, or one set (recomputed) with activation checkpointing; then the gradients. */
    tk_mt *xs, *sh, *sq, *sk, *sv, *satt, *slse, *sxm, *sh2, *sf, *sg;
    tk_mt hf, xnext, dx, dxn, dxm, dh, dq, dk, dv, datt, df, dg, dh2;
} gpt2;

/* Tensor parallelism (Megatron-LM's split; GPT-2 has no plan in transformers, so --tp-plan gives it,
 * docs/parallel.md): c_attn's q, k and v blocks on their columns (the rank's heads), the MLP's c_fc on
 * its columns, both c_proj on their rows (partial sums, all-reduced), the norms and wpe whole. */
static int tp_check(tk_model *m, const char *pre)
{
    static const tk_models_tp_want want[] = {{"attn.c_attn.weight", 1, 3}, {"attn.c_attn.bias", 0, 1},
                                             {"attn.c_proj.weight", 0, 1}, {"attn.c_proj.bias", -1, 1},
                                             {"mlp.c_fc.weight", 1, 1},    {"mlp.c_fc.bias", 0, 1},
                                             {"mlp.c_proj.weight", 0, 1},  {"mlp.c_proj.bias", -1, 1}};
    char layers[32], embed[48];
    snprintf(layers, sizeof layers, "%sh.", pre);
    snprintf(embed, sizeof embed, "%swte.weight", pre);
    return tk_models__tp_check(m, layers, want, sizeof want / sizeof want[0], embed,
                               "attn.c_attn {\"style\": \"packed_colwise\", \"split\": 3}, mlp.c_fc colwise, "
                               "attn.c_proj and mlp.c_proj rowwise");
}

/* The heads, MLP width and LM head rows this process computes (the rank's under tensor parallelism). */
static void local_sizes(const tk_model *m, int64_t *heads, int64_t *inter, int64_t *vocab)
{
    const tk_models_config *c = &m->cfg;
    *heads = m->tp ? m->tp->heads : c->heads;
    *inter = m->tp ? m->tp->inter : c->intermediate;
    *vocab = m->tp && m->tp->head_split ? m->tp->vocab_len : c->vocab;
}

static int load(tk_model *m)
{
    const tk_models_config *c = &m->cfg;
    gpt2 *s = calloc(1, sizeof *s);
    if (!s)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    m->state = s;
    if (!(s->l = calloc((size_t)c->layers, sizeof *s->l)))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    s->act_op = tk_models__act_op(c->act);
    const char *pre = tk_models__st_find(m->st, "transformer.wte.weight") ? "transformer." : "";
    int64_t H = c->hidden, I = c->intermediate;
    int64_t vh[2] = {c->vocab, H}, ph[2] = {c->max_pos, H}, h1[1] = {H}, fcw[2] = {H, I}, i1[1] = {I}, outw[2] = {I, H},
            projw[2] = {H, H};
    char n[128];
#define NM(fmt, ...) (snprintf(n, sizeof n, "%s" fmt, pre, __VA_ARGS__), n)
    int rc;
    if (m->tp && (rc = tp_check(m, pre)) != TK_OK)
        return rc;
    if ((rc = tk_models__weight(&s->wte, m, NM("%s", "wte.weight"), 2, vh)) ||
        (rc = tk_models__weight(&s->wpe, m, NM("%s", "wpe.weight"), 2, ph)) ||
        (rc = tk_models__weight(&s->lnf_w, m, NM("%s", "ln_f.weight"), 1, h1)) ||
        (rc = tk_models__weight(&s->lnf_b, m, NM("%s", "ln_f.bias"), 1, h1)))
        return rc;
    tk_models__mark_embedding(s->wte);
    tk_models__mark_embedding(s->wpe);
    for (int64_t l = 0; l < c->layers; l++) {
        layer_w *w = &s->l[l];
        long long L = (long long)l;
        if ((rc = tk_models__weight(&w->ln1_w, m, NM("h.%lld.ln_1.weight", L), 1, h1)) ||
            (rc = tk_models__weight(&w->ln1_b, m, NM("h.%lld.ln_1.bias", L), 1, h1)) ||
            (rc = tk_models__weight(&w->ln2_w, m, NM("h.%lld.ln_2.weight", L), 1, h1)) ||
            (rc = tk_models__weight(&w->ln2_b, m, NM("h.%lld.ln_2.bias", L), 1, h1)) ||
            (rc = tk_models__weight_cols(&w->q, m, NM("h.%lld.attn.c_attn.weight", L), H, 3 * H, 0, H)) ||
            (rc = tk_models__weight_cols(&w->k, m, n, H, 3 * H, H, H)) ||
            (rc = tk_models__weight_cols(&w->v, m, n, H, 3 * H, 2 * H, H)) ||
            (rc = tk_models__weight_cols(&w->qb, m, NM("h.%lld.attn.c_attn.bias", L), 0, 3 * H, 0, H)) ||
            (rc = tk_models__weight_cols(&w->kb, m, n, 0, 3 * H, H, H)) ||
            (rc = tk_models__weight_cols(&w->vb, m, n, 0, 3 * H, 2 * H, H)) ||
            (rc = tk_models__weight(&w->proj, m, NM("h.%lld.attn.c_proj.weight", L), 2, projw)) ||
            (rc = tk_models__weight(&w->proj_b, m, NM("h.%lld.attn.c_proj.bias", L), 1, h1)) ||
            (rc = tk_models__weight(&w->fc, m, NM("h.%lld.mlp.c_fc.weight", L), 2, fcw)) ||
            (rc = tk_models__weight(&w->fc_b, m, NM("h.%lld.mlp.c_fc.bias", L), 1, i1)) ||
            (rc = tk_models__weight(&w->out, m, NM("h.%lld.mlp.c_proj.weight", L), 2, outw)) ||
            (rc = tk_models__weight(&w->out_b, m, NM("h.%lld.mlp.c_proj.bias", L), 1, h1)))
            return rc;
    }
#undef NM
    if (c->tie_embeddings && m->tp && m->tp->head_split) { /* the rank's rows, without the zero row */
        tk_models__rows(&s->head_view, s->wte, m->tp->embed_split ? 0 : m->tp->vocab_off, m->tp->vocab_len);
        s->lm_head = &s->head_view;
    } else if (c->tie_embeddings) {
        s->lm_head = s->wte;
    } else if ((rc = tk_models__weight(&s->lm_head, m, "lm_head.weight", 2, vh)) != TK_OK) {
        return rc;
    }
    return TK_OK;
}

static int plan(tk_model *m, tk_models_batch *b)
{
    const tk_models_config *c = &m->cfg;
    gpt2 *s = m->state;
    int64_t T = b->T, H = c->hidden, D = c->head_dim, NH, I, V;
    local_sizes(m, &NH, &I, &V);
    int64_t th[2] = {T, H}, t4[4] = {1, T, NH, D}, ti[2] = {T, I}, tv[2] = {T, V};
    int rc;
    if ((rc = tk_models__ws_tensor(m, &s->x, m->dtype, 2, th)) ||
        (rc = tk_models__ws_tensor(m, &s->h1, m->dtype, 2, th)) ||
        (rc = tk_models__ws_tensor(m, &s->h2, m->dtype, 2, th)) ||
        (rc = tk_models__ws_tensor(m, &s->pe, m->dtype, 2, th)) ||
        (rc = tk_models__ws_tensor(m, &s->q, m->dtype, 4, t4)) ||
        (rc = tk_models__ws_tensor(m, &s->k, m->dtype, 4, t4)) ||
        (rc = tk_models__ws_tensor(m, &s->v, m->dtype, 4, t4)) ||
        (rc = tk_models__ws_tensor(m, &s->att, m->dtype, 4, t4)) ||
        (rc = tk_models__ws_tensor(m, &s->o, m->dtype, 2, th)) ||
        (rc = tk_models__ws_tensor(m, &s->f, m->dtype, 2, ti)) ||
        (rc = tk_models__ws_tensor(m, &s->g, m->dtype, 2, ti)) ||
        (rc = tk_models__ws_tensor(m, &s->logits, m->dtype, 2, tv)))
        return rc;
    b->hidden = &s->h1;
    b->logits = &s->logits;
    return TK_OK;
}

/* out = x W (+ bias), W stored [in, out] (Conv1D) unless plain. */
static int linear(tk_model *m, const tk_mt *out, const tk_mt *x, const tk_mt *w, const tk_mt *bias, int conv1d)
{
    return tk_models__linear(m, out, x, w, bias, conv1d);
}

static int layer_norm(tk_model *m, const tk_mt *out, const tk_mt *in, const tk_mt *w, const tk_mt *bias)
{
    tk_arg a[] = {TK_A_T("out", out), TK_A_T("input", in), TK_A_T("weight", w), TK_A_T("bias", bias),
                  TK_A_F("eps", m->cfg.eps)};
    return tk_models__op(m, "layer_norm", a, TK_NARGS(a));
}

/* input, residual = layer_norm(residual + input), residual + input */
static int add_norm(tk_model *m, const tk_mt *in, const tk_mt *res, const tk_mt *w, const tk_mt *bias)
{
    tk_arg a[] = {TK_A_T("input", in), TK_A_T("residual", res), TK_A_T("weight", w), TK_A_T("bias", bias),
                  TK_A_F("eps", m->cfg.eps)};
    return tk_models__op(m, "fused_add_layer_norm", a, TK_NARGS(a));
}

static int forward(tk_model *m, tk_models_batch *b)
{
    const tk_models_config *c = &m->cfg;
    gpt2 *s = m->state;
    int64_t T = b->T, NH, I, V;
    local_sizes(m, &NH, &I, &V);
    int64_t th[2] = {T, NH * c->head_dim};
    tk_mt q2, k2, v2, a2;
    tk_models__view(&q2, &s->q, 2, th);
    tk_models__view(&k2, &s->k, 2, th);
    tk_models__view(&v2, &s->v, 2, th);
    tk_models__view(&a2, &s->att, 2, th);
    int rc;
    /* x = wte[ids] + wpe[positions]; split: the rank's wte rows (zeros for the other ids) all-reduced
     * before wpe is added once */
    int vp = m->tp && m->tp->embed_split, r0 = !m->tp || m->tp->rank == 0;
    tk_arg e1[] = {TK_A_T("out", &s->x), TK_A_T("ids", vp ? &b->tp_ids : &b->ids), TK_A_T("weight", s->wte)};
    tk_arg e2[] = {TK_A_T("out", &s->pe), TK_A_T("ids", &b->pos32), TK_A_T("weight", s->wpe)};
    tk_arg ad[] = {TK_A_T("out", &s->x), TK_A_T("a", &s->x), TK_A_T("b", &s->pe)};
    if ((rc = tk_models__op(m, "embedding", e1, TK_NARGS(e1))) || (vp && (rc = tk_models__tp_reduce(m, &s->x))) ||
        (rc = tk_models__op(m, "embedding", e2, TK_NARGS(e2))) || (rc = tk_models__op(m, "add", ad, TK_NARGS(ad))))
        return rc;
    tk_mt *h = &s->h1, *other = &s->h2;
    if ((rc = layer_norm(m, h, &s->x, s->l[0].ln1_w, s->l[0].ln1_b)) != TK_OK)
        return rc;
    for (int64_t l = 0; l < c->layers; l++) {
        const layer_w *w = &s->l[l];
        if ((rc = linear(m, &q2, h, w->q, w->qb, 1)) || (rc = linear(m, &k2, h, w->k, w->kb, 1)) ||
            (rc = linear(m, &v2, h, w->v, w->vb, 1)))
            return rc;
        /* split: the c_proj partial sums (their biases on rank 0 alone) all-reduced */
        if ((rc = tk_models__attend(m, b, l, &s->att, &s->q, &s->k, &s->v, c->unscaled_attn ? 1.0 : 0.0, -1)) ||
            (rc = linear(m, &s->o, &a2, w->proj, r0 ? w->proj_b : NULL, 1)) || (rc = tk_models__tp_reduce(m, &s->o)) ||
            (rc = add_norm(m, &s->o, &s->x, w->ln2_w, w->ln2_b)))
            return rc;
        tk_arg ac[] = {TK_A_T("out", &s->g), TK_A_T("input", &s->f)};
        if (I == 0) { /* torch.chunk left this rank no MLP features */
            memset(other->t.data, 0, (size_t)(other->shape[0] * other->shape[1]) * (other->t.dtype.bits / 8u));
        } else if ((rc = linear(m, &s->f, &s->o, w->fc, w->fc_b, 1)) ||
                   (rc = tk_models__op(m, s->act_op, ac, TK_NARGS(ac))) ||
                   (rc = linear(m, other, &s->g, w->out, r0 ? w->out_b : NULL, 1))) {
            return rc;
        }
        if ((rc = tk_models__tp_reduce(m, other)) != TK_OK)
            return rc;
        const tk_mt *nw = l + 1 < c->layers ? s->l[l + 1].ln1_w : s->lnf_w;
        const tk_mt *nb = l + 1 < c->layers ? s->l[l + 1].ln1_b : s->lnf_b;
        if ((rc = add_norm(m, other, &s->x, nw, nb)) != TK_OK)
            return rc;
        tk_mt *t = h;
        h = other;
        other = t;
    }
    b->hidden = h;
    if (b->want_logits && V > 0 && (rc = linear(m, &s->logits, h, s->lm_head, NULL, 0)) != TK_OK)
        return rc;
    return TK_OK;
}

/* ---- training: the forward that keeps what the backward needs, and the backward ------------------ */

static int train_plan(tk_model *m, tk_models_batch *b)
{
    const tk_models_config *c = &m->cfg;
    gpt2 *s = m->state;
    int64_t T = b->T, H = c->hidden, D = c->head_dim, I = c->intermediate, L = c->layers;
    int64_t n = m->train_ckpt ? 1 : L;
    int64_t th[2] = {T, H}, t3[3] = {T, c->heads, D}, ti[2] = {T, I}, tl[1] = {c->heads * T};
    tk_dtype f32 = {TK_DL_FLOAT, 32, 1};
    int rc;
    if ((rc = tk_models__t_layers(m, &s->xs, L + 1, m->dtype, 2, th)) ||
        (rc = tk_models__t_layers(m, &s->sh, n, m->dtype, 2, th)) ||
        (rc = tk_models__t_layers(m, &s->sq, n, m->dtype, 3, t3)) ||
        (rc = tk_models__t_layers(m, &s->sk, n, m->dtype, 3, t3)) ||
        (rc = tk_models__t_layers(m, &s->sv, n, m->dtype, 3, t3)) ||
        (rc = tk_models__t_layers(m, &s->satt, n, m->dtype, 3, t3)) ||
        (rc = tk_models__t_layers(m, &s->slse, n, f32, 1, tl)) ||
        (rc = tk_models__t_layers(m, &s->sxm, n, m->dtype, 2, th)) ||
        (rc = tk_models__t_layers(m, &s->sh2, n, m->dtype, 2, th)) ||
        (rc = tk_models__t_layers(m, &s->sf, n, m->dtype, 2, ti)) ||
        (rc = tk_models__t_layers(m, &s->sg, n, m->dtype, 2, ti)))
        return rc;
    tk_mt *one[] = {&s->hf, &s->xnext, &s->pe, &s->dx, &s->dxn, &s->dxm, &s->dh, &s->dh2};
    for (size_t i = 0; i < sizeof one / sizeof one[0]; i++)
        if ((rc = tk_models__ws_tensor(m, one[i], m->dtype, 2, th)) != TK_OK)
            return rc;
    if ((rc = tk_models__ws_tensor(m, &s->dq, m->dtype, 3, t3)) ||
        (rc = tk_models__ws_tensor(m, &s->dk, m->dtype, 3, t3)) ||
        (rc = tk_models__ws_tensor(m, &s->dv, m->dtype, 3, t3)) ||
        (rc = tk_models__ws_tensor(m, &s->datt, m->dtype, 3, t3)) ||
        (rc = tk_models__ws_tensor(m, &s->df, m->dtype, 2, ti)) ||
        (rc = tk_models__ws_tensor(m, &s->dg, m->dtype, 2, ti)))
        return rc;
    b->hidden = &s->hf;
    b->logits = NULL;
    return TK_OK;
}

#define CHECK_T(what, t)                                                                                               \
    do {                                                                                                               \
        if ((rc = tk_models__train_check(m, what, l, t)) != TK_OK)                                                     \
            return rc;                                                                                                 \
    } while (0)

static double attn_scale(const tk_models_config *c) { return c->unscaled_attn ? 1.0 : 0.0; }

/* Layer l from s->xs[l] into out, saving into set i. */
static int layer_fwd(tk_model *m, tk_models_batch *b, int64_t l, int64_t i, const tk_mt *out)
{
    const tk_models_config *c = &m->cfg;
    gpt2 *s = m->state;
    const layer_w *w = &s->l[l];
    int64_t th[2] = {b->T, c->hidden};
    tk_mt q2, k2, v2, a2;
    tk_models__view(&q2, &s->sq[i], 2, th);
    tk_models__view(&k2, &s->sk[i], 2, th);
    tk_models__view(&v2, &s->sv[i], 2, th);
    tk_models__view(&a2, &s->satt[i], 2, th);
    const tk_mt *x = &s->xs[l], *h = &s->sh[i], *xm = &s->sxm[i], *h2 = &s->sh2[i];
    int rc;
    if ((rc = layer_norm(m, h, x, w->ln1_w, w->ln1_b)) != TK_OK)
        return rc;
    CHECK_T("ln_1 output", h);
    if ((rc = linear(m, &q2, h, w->q, w->qb, 1)) || (rc = linear(m, &k2, h, w->k, w->kb, 1)) ||
        (rc = linear(m, &v2, h, w->v, w->vb, 1)))
        return rc;
    CHECK_T("c_attn output", &q2);
    if ((rc = tk_models__t_attention(m, b, &s->satt[i], &s->slse[i], &s->sq[i], &s->sk[i], &s->sv[i], attn_scale(c), 1,
                                     -1)) != TK_OK)
        return rc;
    CHECK_T("attention output", &s->satt[i]);
    tk_arg ad[] = {TK_A_T("out", xm), TK_A_T("a", xm), TK_A_T("b", x)};
    if ((rc = linear(m, xm, &a2, w->proj, w->proj_b, 1)) || (rc = tk_models__op(m, "add", ad, TK_NARGS(ad))) ||
        (rc = layer_norm(m, h2, xm, w->ln2_w, w->ln2_b)))
        return rc;
    CHECK_T("residual after attention", xm);
    CHECK_T("ln_2 output", h2);
    tk_arg ac[] = {TK_A_T("out", &s->sg[i]), TK_A_T("input", &s->sf[i])};
    tk_arg a3[] = {TK_A_T("out", out), TK_A_T("a", out), TK_A_T("b", xm)};
    if ((rc = linear(m, &s->sf[i], h2, w->fc, w->fc_b, 1)) || (rc = tk_models__op(m, s->act_op, ac, TK_NARGS(ac))) ||
        (rc = linear(m, out, &s->sg[i], w->out, w->out_b, 1)) || (rc = tk_models__op(m, "add", a3, TK_NARGS(a3))))
        return rc;
    CHECK_T("c_fc output", &s->sf[i]);
    CHECK_T("layer output", out);
    return TK_OK;
}

static int train_forward(tk_model *m, tk_models_batch *b)
{
    const tk_models_config *c = &m->cfg;
    gpt2 *s = m->state;
    int64_t l = -1;
    int rc;
    tk_arg e1[] = {TK_A_T("out", &s->xs[0]), TK_A_T("ids", &b->ids), TK_A_T("weight", s->wte)};
    tk_arg e2[] = {TK_A_T("out", &s->pe), TK_A_T("ids", &b->pos32), TK_A_T("weight", s->wpe)};
    tk_arg ad[] = {TK_A_T("out", &s->xs[0]), TK_A_T("a", &s->xs[0]), TK_A_T("b", &s->pe)};
    if ((rc = tk_models__op(m, "embedding", e1, TK_NARGS(e1))) ||
        (rc = tk_models__op(m, "embedding", e2, TK_NARGS(e2))) || (rc = tk_models__op(m, "add", ad, TK_NARGS(ad))))
        return rc;
    CHECK_T("wte + wpe", &s->xs[0]);
    for (l = 0; l < c->layers; l++)
        if ((rc = layer_fwd(m, b, l, m->train_ckpt ? 0 : l, &s->xs[l + 1])) != TK_OK)
            return rc;
    if ((rc = layer_norm(m, &s->hf, &s->xs[c->layers], s->lnf_w, s->lnf_b)) != TK_OK)
        return rc;
    CHECK_T("ln_f output", &s->hf);
    b->hidden = &s->hf;
    return TK_OK;
}

static void train_head(tk_model *m, const tk_mt **weight, const tk_mt **bias)
{
    gpt2 *s = m->state;
    *weight = s->lm_head;
    *bias = NULL;
}

static int train_backward(tk_model *m, tk_models_batch *b, const tk_mt *d_hidden)
{
    const tk_models_config *c = &m->cfg;
    gpt2 *s = m->state;
    int64_t L = c->layers, th[2] = {b->T, c->hidden};
    char bwd[64];
    snprintf(bwd, sizeof bwd, "%s_backward", s->act_op);
    tk_mt dq2, dk2, dv2, dat2;
    tk_models__view(&dq2, &s->dq, 2, th);
    tk_models__view(&dk2, &s->dk, 2, th);
    tk_models__view(&dv2, &s->dv, 2, th);
    tk_models__view(&dat2, &s->datt, 2, th);
    tk_mt *dx = &s->dx, *dxn = &s->dxn;
    int rc;
    if ((rc = tk_models__t_norm_bwd(m, 0, dx, d_hidden, NULL, &s->xs[L], s->lnf_w, s->lnf_b)) != TK_OK)
        return rc;
    for (int64_t l = L - 1; l >= 0; l--) {
        const layer_w *w = &s->l[l];
        int64_t i = m->train_ckpt ? 0 : l;
        if (m->train_ckpt && (rc = layer_fwd(m, b, l, 0, &s->xnext)) != TK_OK)
            return rc;
        tk_mt a2;
        tk_models__view(&a2, &s->satt[i], 2, th);
        /* MLP: out = xm + c_proj(act(c_fc(h2))) */
        tk_arg ab[] = {TK_A_T("grad_input", &s->df), TK_A_T("grad_out", &s->dg), TK_A_T("input", &s->sf[i])};
        if ((rc = tk_models__t_linear_bwd(m, &s->dg, 0, dx, &s->sg[i], w->out, w->out_b, 1)) ||
            (rc = tk_models__op(m, bwd, ab, TK_NARGS(ab))) ||
            (rc = tk_models__t_linear_bwd(m, &s->dh2, 0, &s->df, &s->sh2[i], w->fc, w->fc_b, 1)) ||
            (rc = tk_models__t_norm_bwd(m, 0, &s->dxm, &s->dh2, dx, &s->sxm[i], w->ln2_w, w->ln2_b)))
            return rc;
        /* attention: xm = x + c_proj(att) */
        if ((rc = tk_models__t_linear_bwd(m, &dat2, 0, &s->dxm, &a2, w->proj, w->proj_b, 1)) ||
            (rc = tk_models__t_attention_bwd(m, b, &s->dq, &s->dk, &s->dv, &s->datt, &s->sq[i], &s->sk[i], &s->sv[i],
                                             &s->satt[i], &s->slse[i], attn_scale(c), 1, -1)) ||
            (rc = tk_models__t_linear_bwd(m, &s->dh, 0, &dq2, &s->sh[i], w->q, w->qb, 1)) ||
            (rc = tk_models__t_linear_bwd(m, &s->dh, 1, &dk2, &s->sh[i], w->k, w->kb, 1)) ||
            (rc = tk_models__t_linear_bwd(m, &s->dh, 1, &dv2, &s->sh[i], w->v, w->vb, 1)) ||
            (rc = tk_models__t_norm_bwd(m, 0, dxn, &s->dh, &s->dxm, &s->xs[l], w->ln1_w, w->ln1_b)))
            return rc;
        tk_mt *t = dx;
        dx = dxn;
        dxn = t;
    }
    if ((rc = tk_models__t_emb_bwd(m, dx, &b->ids, s->wte, -1)) != TK_OK)
        return rc;
    return tk_models__t_emb_bwd(m, dx, &b->pos32, s->wpe, -1);
}

static void free_state(tk_model *m)
{
    gpt2 *s = m->state;
    if (s) {
        tk_mt *arr[] = {s->xs, s->sh, s->sq, s->sk, s->sv, s->satt, s->slse, s->sxm, s->sh2, s->sf, s->sg};
        for (size_t i = 0; i < sizeof arr / sizeof arr[0]; i++)
            free(arr[i]);
        free(s->l);
    }
    free(s);
    m->state = NULL;
}

static const char *const classes[] = {"GPT2LMHeadModel", NULL};

const tk_models_arch tk_models__gpt2 = {
    .name = "gpt2",
    .classes = classes,
    .caps = TK_ARCH_CAUSAL_LM | TK_ARCH_BOUNDED_POS | TK_ARCH_TP_CONV1D,
    .prefix = "transformer.",
    .parse = parse,
    .load = load,
    .plan = plan,
    .forward = forward,
    .free_state = free_state,
    .train_plan = train_plan,
    .train_forward = train_forward,
    .train_head = train_head,
    .train_backward = train_backward,
};
