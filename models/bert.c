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

typedef struct {
    const tk_mt *q, *qb, *k, *kb, *v, *vb, *o, *ob, *ln1_w, *ln1_b, *fi, *fi_b, *fo, *fo_b, *ln2_w, *ln2_b;
} layer_w;

typedef struct {
    const tk_mt *word, *pos, *type, *eln_w, *eln_b, *pool_w, *pool_b;
    layer_w *l;
    const char *act_op;
    tk_mt a, b, c, q, k, v, att, f, g, cls, pre, pooled;
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
    int64_t vh[2] = {c->vocab, H}, ph[2] = {c->max_pos, H}, th[2] = {c->type_vocab, H}, h1[1] = {H},
            hh[2] = {H, H}, ih[2] = {I, H}, hi[2] = {H, I}, i1[1] = {I};
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
            (rc = tk_models__weight(&w->ln1_b, m, NM("encoder.layer.%lld.attention.output.LayerNorm.bias", L), 1,
                                    h1)) ||
            (rc = tk_models__weight(&w->fi, m, NM("encoder.layer.%lld.intermediate.dense.weight", L), 2, ih)) ||
            (rc = tk_models__weight(&w->fi_b, m, NM("encoder.layer.%lld.intermediate.dense.bias", L), 1, i1)) ||
            (rc = tk_models__weight(&w->fo, m, NM("encoder.layer.%lld.output.dense.weight", L), 2, hi)) ||
            (rc = tk_models__weight(&w->fo_b, m, NM("encoder.layer.%lld.output.dense.bias", L), 1, h1)) ||
            (rc = tk_models__weight(&w->ln2_w, m, NM("encoder.layer.%lld.output.LayerNorm.weight", L), 1, h1)) ||
            (rc = tk_models__weight(&w->ln2_b, m, NM("encoder.layer.%lld.output.LayerNorm.bias", L), 1, h1)))
            return rc;
    }
#undef NM
    return TK_OK;
}

static int plan(tk_model *m, tk_models_batch *b)
{
    const tk_models_config *c = &m->cfg;
    bert *s = m->state;
    int64_t T = b->T, H = c->hidden;
    int64_t th[2] = {T, H}, t4[4] = {1, T, c->heads, c->head_dim}, ti[2] = {T, c->intermediate},
            sh[2] = {b->nseq, H};
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
    tk_arg ln[] = {TK_A_T("out", &s->a), TK_A_T("input", &s->b), TK_A_T("weight", s->eln_w),
                   TK_A_T("bias", s->eln_b), TK_A_F("eps", c->eps)};
    if ((rc = tk_models__op(m, "layer_norm", ln, TK_NARGS(ln))) != TK_OK)
        return rc;
    for (int64_t l = 0; l < c->layers; l++) {
        const layer_w *w = &s->l[l];
        if ((rc = linear(m, &q2, &s->a, w->q, w->qb)) || (rc = linear(m, &k2, &s->a, w->k, w->kb)) ||
            (rc = linear(m, &v2, &s->a, w->v, w->vb)))
            return rc;
        tk_arg at[] = {TK_A_T("out", &s->att),         TK_A_T("q", &s->q),
                       TK_A_T("k", &s->k),             TK_A_T("v", &s->v),
                       TK_A_T("cu_seqlens_q", &b->cu), TK_A_T("cu_seqlens_k", &b->cu),
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

static void free_state(tk_model *m)
{
    bert *s = m->state;
    if (s)
        free(s->l);
    free(s);
    m->state = NULL;
}

const tk_models_arch tk_models__bert = {"bert", load, plan, forward, free_state, NULL, NULL, NULL, NULL};
