/*
 * bert.c — BertModel as transformers' modeling_bert.py computes it (an encoder: no causal mask), with
 * its pooler. Sentence embeddings pool its output in model.c (tk_model_embed).
 *
 *   x = layer_norm(word[ids] + position[positions] + token_type[0])
 *   per layer: q, k, v = x Wq, x Wk, x Wv (+ bias); a = attention(q, k, v) (bidirectional, within a
 *              sequence); x = layer_norm(x + a Wo); x = layer_norm(x + gelu(x Wi) Wout)
 *   pooled = tanh(x[first token of each sequence] Wp + bp)
 *
 * A batch is packed (varlen cu_seqlens), so no padding and no attention mask are needed: a sequence
 * attends to its own tokens only, which is what HF's padding mask does. Tensor names are BertModel's,
 * with the "bert." prefix of task models accepted.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/models.h"

/* ---- config.json ---- */

static int parse(tk_models_config *c, const tk_models_reader *r)
{
    int rc, flag;
    char pet[32];
    if ((rc = tk_models__cfg_int(r, "vocab_size", INT64_MIN, 1, &c->vocab)) ||
        (rc = tk_models__cfg_int(r, "hidden_size", INT64_MIN, 1, &c->hidden)) ||
        (rc = tk_models__cfg_int(r, "num_hidden_layers", INT64_MIN, 1, &c->layers)) ||
        (rc = tk_models__cfg_int(r, "num_attention_heads", INT64_MIN, 1, &c->heads)) ||
        (rc = tk_models__cfg_int(r, "intermediate_size", INT64_MIN, 1, &c->intermediate)) ||
        (rc = tk_models__cfg_int(r, "max_position_embeddings", 512, 1, &c->max_pos)) ||
        (rc = tk_models__cfg_int(r, "type_vocab_size", 2, 1, &c->type_vocab)) ||
        (rc = tk_models__cfg_num(r->root, r->what, "layer_norm_eps", 1e-12, &c->eps)) ||
        (rc = tk_models__cfg_str(r, "hidden_act", "gelu", c->act, sizeof c->act)) ||
        (rc = tk_models__cfg_str(r, "position_embedding_type", "absolute", pet, sizeof pet)))
        return rc;
    if (c->hidden % c->heads)
        return tk__err(TK_ERR_INVALID, "%s: hidden_size %lld is not a multiple of num_attention_heads %lld", r->what,
                       (long long)c->hidden, (long long)c->heads);
    c->kv_heads = c->heads;
    c->head_dim = c->hidden / c->heads;
    static const char *const acts[] = {"gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "quick_gelu", NULL};
    if ((rc = tk_models__cfg_act(r, "hidden_act", c->act, acts,
                                 "gelu, gelu_new, gelu_pytorch_tanh, gelu_fast, quick_gelu")) != TK_OK)
        return rc;
    if (strcmp(pet, "absolute")) {
        char got[48];
        snprintf(got, sizeof got, "'%s'", pet);
        return tk_models__cfg_unsupported(r, "position_embedding_type", got, "absolute");
    }
    if ((rc = tk_models__cfg_bool(r, "is_decoder", 0, &flag)) != TK_OK)
        return rc;
    if (flag)
        return tk_models__cfg_unsupported(r, "is_decoder", "true", "false (BertModel as an encoder)");
    /* BertForMaskedLM's decoder is the word embeddings unless this says otherwise */
    return tk_models__cfg_bool(r, "tie_word_embeddings", 1, &c->tie_embeddings);
}

typedef struct {
    const tk_mt *q, *qb, *k, *kb, *v, *vb, *o, *ob, *ln1_w, *ln1_b, *fi, *fi_b, *fo, *fo_b, *ln2_w, *ln2_b;
} layer_w;

typedef struct {
    const tk_mt *word, *pos, *type, *eln_w, *eln_b, *pool_w, *pool_b;
    /* BertForMaskedLM's head (cls.predictions): transform dense + act + LayerNorm, then the decoder
     * (the word embeddings when tied) and its bias; NULL when the checkpoint has none */
    const tk_mt *mlm_w, *mlm_b, *mlm_ln_w, *mlm_ln_b, *dec_w, *dec_b;
    layer_w *l;
    const char *act_op;
    tk_mt a, b, c, q, k, v, att, f, g, cls, pre, pooled;
    /* Training: xs[l] is layer l's input (xs[L] the head's); the other arrays hold every layer's saved
     * activations, or one set (recomputed) with activation checkpointing; then the gradients. */
    tk_mt *xs, *sq, *sk, *sv, *satt, *slse, *sr1, *sx1, *sf, *sg, *sr2;
    tk_mt e, tt1, tt2, hf, xnext, dA, dB, dr2, dI1, dI2, dq, dk, dv, datt;
} bert;

static int load(tk_model *m)
{
    const tk_models_config *c = &m->cfg;
    bert *s = calloc(1, sizeof *s);
    if (!s)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    m->state = s;
    if (!(s->l = calloc((size_t)c->layers, sizeof *s->l)))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    s->act_op = tk_models__act_op(c->act);
    const char *pre = tk_models__st_find(m->st, "bert.embeddings.word_embeddings.weight") ? "bert." : "";
    int64_t H = c->hidden, I = c->intermediate;
    int64_t vh[2] = {c->vocab, H}, ph[2] = {c->max_pos, H}, th[2] = {c->type_vocab, H}, h1[1] = {H}, hh[2] = {H, H},
            ih[2] = {I, H}, hi[2] = {H, I}, i1[1] = {I};
    char n[160];
#define NM(fmt, ...) (snprintf(n, sizeof n, "%s" fmt, pre, __VA_ARGS__), n)
    int rc;
    if ((rc = tk_models__weight(&s->word, m, NM("%s", "embeddings.word_embeddings.weight"), 2, vh)) ||
        (rc = tk_models__weight(&s->pos, m, NM("%s", "embeddings.position_embeddings.weight"), 2, ph)) ||
        (rc = tk_models__weight(&s->type, m, NM("%s", "embeddings.token_type_embeddings.weight"), 2, th)) ||
        (rc = tk_models__weight(&s->eln_w, m, NM("%s", "embeddings.LayerNorm.weight"), 1, h1)) ||
        (rc = tk_models__weight(&s->eln_b, m, NM("%s", "embeddings.LayerNorm.bias"), 1, h1)) ||
        (rc = tk_models__weight_opt(&s->pool_w, m, NM("%s", "pooler.dense.weight"), 2, hh)) ||
        (rc = tk_models__weight_opt(&s->pool_b, m, NM("%s", "pooler.dense.bias"), 1, h1)))
        return rc;
    for (int64_t l = 0; l < c->layers; l++) {
        layer_w *w = &s->l[l];
        long long L = (long long)l;
        if ((rc = tk_models__weight(&w->q, m, NM("encoder.layer.%lld.attention.self.query.weight", L), 2, hh)) ||
            (rc = tk_models__weight(&w->qb, m, NM("encoder.layer.%lld.attention.self.query.bias", L), 1, h1)) ||
            (rc = tk_models__weight(&w->k, m, NM("encoder.layer.%lld.attention.self.key.weight", L), 2, hh)) ||
            (rc = tk_models__weight(&w->kb, m, NM("encoder.layer.%lld.attention.self.key.bias", L), 1, h1)) ||
            (rc = tk_models__weight(&w->v, m, NM("encoder.layer.%lld.attention.self.value.weight", L), 2, hh)) ||
            (rc = tk_models__weight(&w->vb, m, NM("encoder.layer.%lld.attention.self.value.bias", L), 1, h1)) ||
            (rc = tk_models__weight(&w->o, m, NM("encoder.layer.%lld.attention.output.dense.weight", L), 2, hh)) ||
            (rc = tk_models__weight(&w->ob, m, NM("encoder.layer.%lld.attention.output.dense.bias", L), 1, h1)) ||
            (rc = tk_models__weight(&w->ln1_w, m, NM("encoder.layer.%lld.attention.output.LayerNorm.weight", L), 1,
                                    h1)) ||
            (rc =
                 tk_models__weight(&w->ln1_b, m, NM("encoder.layer.%lld.attention.output.LayerNorm.bias", L), 1, h1)) ||
            (rc = tk_models__weight(&w->fi, m, NM("encoder.layer.%lld.intermediate.dense.weight", L), 2, ih)) ||
            (rc = tk_models__weight(&w->fi_b, m, NM("encoder.layer.%lld.intermediate.dense.bias", L), 1, i1)) ||
            (rc = tk_models__weight(&w->fo, m, NM("encoder.layer.%lld.output.dense.weight", L), 2, hi)) ||
            (rc = tk_models__weight(&w->fo_b, m, NM("encoder.layer.%lld.output.dense.bias", L), 1, h1)) ||
            (rc = tk_models__weight(&w->ln2_w, m, NM("encoder.layer.%lld.output.LayerNorm.weight", L), 1, h1)) ||
            (rc = tk_models__weight(&w->ln2_b, m, NM("encoder.layer.%lld.output.LayerNorm.bias", L), 1, h1)))
            return rc;
    }
    /* BertForMaskedLM's head, when the checkpoint has it (names without the "bert." prefix) */
    int64_t v1[1] = {c->vocab};
    if ((rc = tk_models__weight_opt(&s->mlm_w, m, "cls.predictions.transform.dense.weight", 2, hh)) ||
        (rc = tk_models__weight_opt(&s->mlm_b, m, "cls.predictions.transform.dense.bias", 1, h1)) ||
        (rc = tk_models__weight_opt(&s->mlm_ln_w, m, "cls.predictions.transform.LayerNorm.weight", 1, h1)) ||
        (rc = tk_models__weight_opt(&s->mlm_ln_b, m, "cls.predictions.transform.LayerNorm.bias", 1, h1)) ||
        (rc = tk_models__weight_opt(&s->dec_b, m, "cls.predictions.bias", 1, v1)))
        return rc;
    if (!s->dec_b && (rc = tk_models__weight_opt(&s->dec_b, m, "cls.predictions.decoder.bias", 1, v1)) != TK_OK)
        return rc;
    if (s->mlm_w) {
        if (c->tie_embeddings)
            s->dec_w = s->word;
        else if ((rc = tk_models__weight(&s->dec_w, m, "cls.predictions.decoder.weight", 2, vh)) != TK_OK)
            return rc;
        if (!s->mlm_b || !s->mlm_ln_w || !s->mlm_ln_b || !s->dec_b)
            return tk__err(TK_ERR_INVALID,
                           "%s checkpoint '%s': cls.predictions.transform.dense.weight is there but "
                           "not the rest of the MLM head (its bias, LayerNorm, decoder bias)",
                           c->arch, m->dir);
    }
    tk_models__mark_embedding(s->word);
    tk_models__mark_embedding(s->pos);
    tk_models__mark_embedding(s->type);
#undef NM
    return TK_OK;
}

static int plan(tk_model *m, tk_models_batch *b)
{
    const tk_models_config *c = &m->cfg;
    bert *s = m->state;
    int64_t T = b->T, H = c->hidden;
    int64_t th[2] = {T, H}, t4[4] = {1, T, c->heads, c->head_dim}, ti[2] = {T, c->intermediate}, sh[2] = {b->nseq, H};
    int rc;
    if ((rc = tk_models__ws_tensor(m, &s->a, m->dtype, 2, th)) ||
        (rc = tk_models__ws_tensor(m, &s->b, m->dtype, 2, th)) ||
        (rc = tk_models__ws_tensor(m, &s->c, m->dtype, 2, th)) ||
        (rc = tk_models__ws_tensor(m, &s->q, m->dtype, 4, t4)) ||
        (rc = tk_models__ws_tensor(m, &s->k, m->dtype, 4, t4)) ||
        (rc = tk_models__ws_tensor(m, &s->v, m->dtype, 4, t4)) ||
        (rc = tk_models__ws_tensor(m, &s->att, m->dtype, 4, t4)) ||
        (rc = tk_models__ws_tensor(m, &s->f, m->dtype, 2, ti)) ||
        (rc = tk_models__ws_tensor(m, &s->g, m->dtype, 2, ti)) ||
        (rc = tk_models__ws_tensor(m, &s->cls, m->dtype, 2, sh)) ||
        (rc = tk_models__ws_tensor(m, &s->pre, m->dtype, 2, sh)) ||
        (rc = tk_models__ws_tensor(m, &s->pooled, m->dtype, 2, sh)))
        return rc;
    b->hidden = &s->a;
    b->logits = NULL;
    b->pooled = s->pool_w && s->pool_b ? &s->pooled : NULL;
    return TK_OK;
}

static int linear(tk_model *m, const tk_mt *out, const tk_mt *x, const tk_mt *w, const tk_mt *bias)
{
    tk_arg a[] = {TK_A_T("out", out), TK_A_T("x", x), TK_A_T("weight", w), TK_A_T("bias", bias)};
    return tk_models__op(m, "linear", a, TK_NARGS(a));
}

static int emb(tk_model *m, const tk_mt *out, const tk_mt *ids, const tk_mt *w)
{
    tk_arg a[] = {TK_A_T("out", out), TK_A_T("ids", ids), TK_A_T("weight", w)};
    return tk_models__op(m, "embedding", a, TK_NARGS(a));
}

static int add(tk_model *m, const tk_mt *out, const tk_mt *x, const tk_mt *y)
{
    tk_arg a[] = {TK_A_T("out", out), TK_A_T("a", x), TK_A_T("b", y)};
    return tk_models__op(m, "add", a, TK_NARGS(a));
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
    bert *s = m->state;
    int64_t th[2] = {b->T, c->hidden};
    tk_mt q2, k2, v2, a2;
    tk_models__view(&q2, &s->q, 2, th);
    tk_models__view(&k2, &s->k, 2, th);
    tk_models__view(&v2, &s->v, 2, th);
    tk_models__view(&a2, &s->att, 2, th);
    int rc;
    /* x (in a) = layer_norm(word + position + token type) */
    if ((rc = emb(m, &s->b, &b->ids, s->word)) || (rc = emb(m, &s->c, &b->pos32, s->pos)) ||
        (rc = add(m, &s->b, &s->b, &s->c)) || (rc = emb(m, &s->c, &b->tt, s->type)) ||
        (rc = add(m, &s->b, &s->b, &s->c)))
        return rc;
    tk_arg ln[] = {TK_A_T("out", &s->a), TK_A_T("input", &s->b), TK_A_T("weight", s->eln_w), TK_A_T("bias", s->eln_b),
                   TK_A_F("eps", c->eps)};
    if ((rc = tk_models__op(m, "layer_norm", ln, TK_NARGS(ln))) != TK_OK)
        return rc;
    for (int64_t l = 0; l < c->layers; l++) {
        const layer_w *w = &s->l[l];
        if ((rc = linear(m, &q2, &s->a, w->q, w->qb)) || (rc = linear(m, &k2, &s->a, w->k, w->kb)) ||
            (rc = linear(m, &v2, &s->a, w->v, w->vb)))
            return rc;
        tk_arg at[] = {TK_A_T("out", &s->att),
                       TK_A_T("q", &s->q),
                       TK_A_T("k", &s->k),
                       TK_A_T("v", &s->v),
                       TK_A_T("cu_seqlens_q", &b->cu),
                       TK_A_T("cu_seqlens_k", &b->cu),
                       TK_A_I("max_seqlen_q", b->max_len)};
        if ((rc = tk_models__op(m, "attention", at, TK_NARGS(at))) != TK_OK)
            return rc;
        /* b = layer_norm(a + att Wo); then a = layer_norm(b + gelu(b Wi) Wout) */
        if ((rc = linear(m, &s->b, &a2, w->o, w->ob)) || (rc = add_norm(m, &s->b, &s->a, w->ln1_w, w->ln1_b)))
            return rc;
        tk_arg ac[] = {TK_A_T("out", &s->g), TK_A_T("input", &s->f)};
        if ((rc = linear(m, &s->f, &s->b, w->fi, w->fi_b)) || (rc = tk_models__op(m, s->act_op, ac, TK_NARGS(ac))) ||
            (rc = linear(m, &s->a, &s->g, w->fo, w->fo_b)) || (rc = add_norm(m, &s->a, &s->b, w->ln2_w, w->ln2_b)))
            return rc;
    }
    if (b->pooled) {
        /* the first token of each sequence: rows cu[0..nseq) of the output, gathered by embedding */
        tk_mt first;
        tk_models__rows(&first, &b->cu, 0, b->nseq);
        tk_arg th2[] = {TK_A_T("out", &s->pooled), TK_A_T("input", &s->pre)};
        if ((rc = emb(m, &s->cls, &first, &s->a)) || (rc = linear(m, &s->pre, &s->cls, s->pool_w, s->pool_b)) ||
            (rc = tk_models__op(m, "tanh", th2, TK_NARGS(th2))))
            return rc;
    }
    return TK_OK;
}

/* ---- training (BertForMaskedLM): the forward that keeps what the backward needs, and the backward -- */

static int train_plan(tk_model *m, tk_models_batch *b)
{
    const tk_models_config *c = &m->cfg;
    bert *s = m->state;
    int64_t T = b->T, H = c->hidden, I = c->intermediate, L = c->layers;
    int64_t n = m->train_ckpt ? 1 : L;
    int64_t th[2] = {T, H}, t3[3] = {T, c->heads, c->head_dim}, ti[2] = {T, I}, tl[1] = {c->heads * T};
    tk_dtype f32 = {TK_DL_FLOAT, 32, 1};
    int rc;
    if ((rc = tk_models__t_layers(m, &s->xs, L + 1, m->dtype, 2, th)) ||
        (rc = tk_models__t_layers(m, &s->sq, n, m->dtype, 3, t3)) ||
        (rc = tk_models__t_layers(m, &s->sk, n, m->dtype, 3, t3)) ||
        (rc = tk_models__t_layers(m, &s->sv, n, m->dtype, 3, t3)) ||
        (rc = tk_models__t_layers(m, &s->satt, n, m->dtype, 3, t3)) ||
        (rc = tk_models__t_layers(m, &s->slse, n, f32, 1, tl)) ||
        (rc = tk_models__t_layers(m, &s->sr1, n, m->dtype, 2, th)) ||
        (rc = tk_models__t_layers(m, &s->sx1, n, m->dtype, 2, th)) ||
        (rc = tk_models__t_layers(m, &s->sf, n, m->dtype, 2, ti)) ||
        (rc = tk_models__t_layers(m, &s->sg, n, m->dtype, 2, ti)) ||
        (rc = tk_models__t_layers(m, &s->sr2, n, m->dtype, 2, th)))
        return rc;
    tk_mt *one[] = {&s->e, &s->tt1, &s->tt2, &s->hf, &s->xnext, &s->dA, &s->dB, &s->dr2};
    for (size_t i = 0; i < sizeof one / sizeof one[0]; i++)
        if ((rc = tk_models__ws_tensor(m, one[i], m->dtype, 2, th)) != TK_OK)
            return rc;
    if ((rc = tk_models__ws_tensor(m, &s->dq, m->dtype, 3, t3)) ||
        (rc = tk_models__ws_tensor(m, &s->dk, m->dtype, 3, t3)) ||
        (rc = tk_models__ws_tensor(m, &s->dv, m->dtype, 3, t3)) ||
        (rc = tk_models__ws_tensor(m, &s->datt, m->dtype, 3, t3)) ||
        (rc = tk_models__ws_tensor(m, &s->dI1, m->dtype, 2, ti)) ||
        (rc = tk_models__ws_tensor(m, &s->dI2, m->dtype, 2, ti)))
        return rc;
    b->hidden = &s->hf;
    b->logits = NULL;
    b->pooled = NULL;
    return TK_OK;
}

#define CHECK_T(what, t)                                                                                               \
    do {                                                                                                               \
        if ((rc = tk_models__train_check(m, what, l, t)) != TK_OK)                                                     \
            return rc;                                                                                                 \
    } while (0)

static int ln(tk_model *m, const tk_mt *out, const tk_mt *in, const tk_mt *w, const tk_mt *bias)
{
    tk_arg a[] = {TK_A_T("out", out), TK_A_T("input", in), TK_A_T("weight", w), TK_A_T("bias", bias),
                  TK_A_F("eps", m->cfg.eps)};
    return tk_models__op(m, "layer_norm", a, TK_NARGS(a));
}

/* Layer l (post-LN) from s->xs[l] into out, saving into set i. */
static int layer_fwd(tk_model *m, tk_models_batch *b, int64_t l, int64_t i, const tk_mt *out)
{
    const tk_models_config *c = &m->cfg;
    bert *s = m->state;
    const layer_w *w = &s->l[l];
    int64_t th[2] = {b->T, c->hidden};
    tk_mt q2, k2, v2, a2;
    tk_models__view(&q2, &s->sq[i], 2, th);
    tk_models__view(&k2, &s->sk[i], 2, th);
    tk_models__view(&v2, &s->sv[i], 2, th);
    tk_models__view(&a2, &s->satt[i], 2, th);
    const tk_mt *x = &s->xs[l], *r1 = &s->sr1[i], *x1 = &s->sx1[i], *r2 = &s->sr2[i];
    int rc;
    if ((rc = linear(m, &q2, x, w->q, w->qb)) || (rc = linear(m, &k2, x, w->k, w->kb)) ||
        (rc = linear(m, &v2, x, w->v, w->vb)))
        return rc;
    CHECK_T("query/key/value output", &q2);
    if ((rc = tk_models__t_attention(m, b, &s->satt[i], &s->slse[i], &s->sq[i], &s->sk[i], &s->sv[i], 0.0, 0, -1)) !=
        TK_OK)
        return rc;
    CHECK_T("attention output", &s->satt[i]);
    if ((rc = linear(m, r1, &a2, w->o, w->ob)) || (rc = add(m, r1, r1, x)) || (rc = ln(m, x1, r1, w->ln1_w, w->ln1_b)))
        return rc;
    CHECK_T("attention.output.LayerNorm output", x1);
    tk_arg ac[] = {TK_A_T("out", &s->sg[i]), TK_A_T("input", &s->sf[i])};
    if ((rc = linear(m, &s->sf[i], x1, w->fi, w->fi_b)) || (rc = tk_models__op(m, s->act_op, ac, TK_NARGS(ac))) ||
        (rc = linear(m, r2, &s->sg[i], w->fo, w->fo_b)) || (rc = add(m, r2, r2, x1)) ||
        (rc = ln(m, out, r2, w->ln2_w, w->ln2_b)))
        return rc;
    CHECK_T("intermediate output", &s->sf[i]);
    CHECK_T("layer output", out);
    return TK_OK;
}

static int train_forward(tk_model *m, tk_models_batch *b)
{
    const tk_models_config *c = &m->cfg;
    bert *s = m->state;
    int64_t l = -1;
    int rc;
    if ((rc = emb(m, &s->e, &b->ids, s->word)) || (rc = emb(m, &s->tt1, &b->pos32, s->pos)) ||
        (rc = add(m, &s->e, &s->e, &s->tt1)) || (rc = emb(m, &s->tt1, &b->tt, s->type)) ||
        (rc = add(m, &s->e, &s->e, &s->tt1)) || (rc = ln(m, &s->xs[0], &s->e, s->eln_w, s->eln_b)))
        return rc;
    CHECK_T("embeddings output", &s->xs[0]);
    for (l = 0; l < c->layers; l++)
        if ((rc = layer_fwd(m, b, l, m->train_ckpt ? 0 : l, &s->xs[l + 1])) != TK_OK)
            return rc;
    /* the MLM head's transform: hf = LayerNorm(act(dense(x))) */
    tk_arg ac[] = {TK_A_T("out", &s->tt2), TK_A_T("input", &s->tt1)};
    if ((rc = linear(m, &s->tt1, &s->xs[c->layers], s->mlm_w, s->mlm_b)) ||
        (rc = tk_models__op(m, s->act_op, ac, TK_NARGS(ac))) || (rc = ln(m, &s->hf, &s->tt2, s->mlm_ln_w, s->mlm_ln_b)))
        return rc;
    CHECK_T("cls.predictions.transform output", &s->hf);
    b->hidden = &s->hf;
    return TK_OK;
}

static void train_head(tk_model *m, const tk_mt **weight, const tk_mt **bias)
{
    bert *s = m->state;
    *weight = s->mlm_w ? s->dec_w : NULL;
    *bias = s->mlm_w ? s->dec_b : NULL;
}

static int train_backward(tk_model *m, tk_models_batch *b, const tk_mt *d_hidden)
{
    const tk_models_config *c = &m->cfg;
    bert *s = m->state;
    int64_t L = c->layers, th[2] = {b->T, c->hidden};
    char bwd[64];
    snprintf(bwd, sizeof bwd, "%s_backward", s->act_op);
    tk_mt dq2, dk2, dv2, dat2;
    tk_models__view(&dq2, &s->dq, 2, th);
    tk_models__view(&dk2, &s->dk, 2, th);
    tk_models__view(&dv2, &s->dv, 2, th);
    tk_models__view(&dat2, &s->datt, 2, th);
    tk_mt *dx = &s->dA, *dxn = &s->dB;
    int rc;
    /* the head's transform, back to dx = d xs[L] */
    tk_arg hb[] = {TK_A_T("grad_input", dxn), TK_A_T("grad_out", &s->dr2), TK_A_T("input", &s->tt1)};
    if ((rc = tk_models__t_norm_bwd(m, 0, &s->dr2, d_hidden, NULL, &s->tt2, s->mlm_ln_w, s->mlm_ln_b)) ||
        (rc = tk_models__op(m, bwd, hb, TK_NARGS(hb))) ||
        (rc = tk_models__t_linear_bwd(m, dx, 0, dxn, &s->xs[L], s->mlm_w, s->mlm_b, 0)))
        return rc;
    for (int64_t l = L - 1; l >= 0; l--) {
        const layer_w *w = &s->l[l];
        int64_t i = m->train_ckpt ? 0 : l;
        if (m->train_ckpt && (rc = layer_fwd(m, b, l, 0, &s->xnext)) != TK_OK)
            return rc;
        tk_mt a2;
        tk_models__view(&a2, &s->satt[i], 2, th);
        /* out = LN2(r2), r2 = x1 + fo(act(fi(x1))); x1 = LN1(r1), r1 = x + o(att) */
        tk_arg ab[] = {TK_A_T("grad_input", &s->dI2), TK_A_T("grad_out", &s->dI1), TK_A_T("input", &s->sf[i])};
        if ((rc = tk_models__t_norm_bwd(m, 0, &s->dr2, dx, NULL, &s->sr2[i], w->ln2_w, w->ln2_b)) ||
            (rc = tk_models__t_linear_bwd(m, &s->dI1, 0, &s->dr2, &s->sg[i], w->fo, w->fo_b, 0)) ||
            (rc = tk_models__op(m, bwd, ab, TK_NARGS(ab))) ||
            (rc = tk_models__t_linear_bwd(m, &s->dr2, 1, &s->dI2, &s->sx1[i], w->fi, w->fi_b, 0)) ||
            (rc = tk_models__t_norm_bwd(m, 0, dxn, &s->dr2, NULL, &s->sr1[i], w->ln1_w, w->ln1_b)) ||
            (rc = tk_models__t_linear_bwd(m, &dat2, 0, dxn, &a2, w->o, w->ob, 0)) ||
            (rc = tk_models__t_attention_bwd(m, b, &s->dq, &s->dk, &s->dv, &s->datt, &s->sq[i], &s->sk[i], &s->sv[i],
                                             &s->satt[i], &s->slse[i], 0.0, 0, -1)) ||
            (rc = tk_models__t_linear_bwd(m, dxn, 1, &dq2, &s->xs[l], w->q, w->qb, 0)) ||
            (rc = tk_models__t_linear_bwd(m, dxn, 1, &dk2, &s->xs[l], w->k, w->kb, 0)) ||
            (rc = tk_models__t_linear_bwd(m, dxn, 1, &dv2, &s->xs[l], w->v, w->vb, 0)))
            return rc;
        tk_mt *t = dx;
        dx = dxn;
        dxn = t;
    }
    /* the embeddings: xs[0] = LN(word + position + token type) */
    if ((rc = tk_models__t_norm_bwd(m, 0, dxn, dx, NULL, &s->e, s->eln_w, s->eln_b)) ||
        (rc = tk_models__t_emb_bwd(m, dxn, &b->ids, s->word, c->pad_id)) ||
        (rc = tk_models__t_emb_bwd(m, dxn, &b->pos32, s->pos, -1)))
        return rc;
    return tk_models__t_emb_bwd(m, dxn, &b->tt, s->type, -1);
}

static void free_state(tk_model *m)
{
    bert *s = m->state;
    if (s) {
        tk_mt *arr[] = {s->xs, s->sq, s->sk, s->sv, s->satt, s->slse, s->sr1, s->sx1, s->sf, s->sg, s->sr2};
        for (size_t i = 0; i < sizeof arr / sizeof arr[0]; i++)
            free(arr[i]);
        free(s->l);
    }
    free(s);
    m->state = NULL;
}

static const char *const classes[] = {"BertModel", "BertForMaskedLM", NULL};

const tk_models_arch tk_models__bert = {
    .name = "bert",
    .classes = classes,
    .caps = TK_ARCH_BOUNDED_POS | TK_ARCH_POOLER,
    .prefix = "",
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
