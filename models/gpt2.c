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

typedef struct {
    const tk_mt *ln1_w, *ln1_b, *q, *k, *v, *qb, *kb, *vb, *proj, *proj_b, *ln2_w, *ln2_b, *fc, *fc_b, *out, *out_b;
} layer_w;

typedef struct {
    const tk_mt *wte, *wpe, *lnf_w, *lnf_b, *lm_head;
    layer_w *l;
    const char *act_op;
    tk_mt x, h1, h2, pe, q, k, v, att, o, f, g, logits;
} gpt2;

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
    int64_t vh[2] = {c->vocab, H}, ph[2] = {c->max_pos, H}, h1[1] = {H}, fcw[2] = {H, I}, i1[1] = {I},
            outw[2] = {I, H}, projw[2] = {H, H};
    char n[128];
#define NM(fmt, ...) (snprintf(n, sizeof n, "%s" fmt, pre, __VA_ARGS__), n)
    int rc;
    if ((rc = tk_models__weight(&s->wte, m, NM("%s", "wte.weight"), 2, vh)) ||
        (rc = tk_models__weight(&s->wpe, m, NM("%s", "wpe.weight"), 2, ph)) ||
        (rc = tk_models__weight(&s->lnf_w, m, NM("%s", "ln_f.weight"), 1, h1)) ||
        (rc = tk_models__weight(&s->lnf_b, m, NM("%s", "ln_f.bias"), 1, h1)))
        return rc;
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
    if (c->tie_embeddings) {
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
    int64_t T = b->T, H = c->hidden, D = c->head_dim;
    int64_t th[2] = {T, H}, t4[4] = {1, T, c->heads, D}, ti[2] = {T, c->intermediate}, tv[2] = {T, c->vocab};
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
    int64_t T = b->T, H = c->hidden;
    int64_t th[2] = {T, H};
    tk_mt q2, k2, v2, a2;
    tk_models__view(&q2, &s->q, 2, th);
    tk_models__view(&k2, &s->k, 2, th);
    tk_models__view(&v2, &s->v, 2, th);
    tk_models__view(&a2, &s->att, 2, th);
    int rc;
    /* x = wte[ids] + wpe[positions] */
    tk_arg e1[] = {TK_A_T("out", &s->x), TK_A_T("ids", &b->ids), TK_A_T("weight", s->wte)};
    tk_arg e2[] = {TK_A_T("out", &s->pe), TK_A_T("ids", &b->pos32), TK_A_T("weight", s->wpe)};
    tk_arg ad[] = {TK_A_T("out", &s->x), TK_A_T("a", &s->x), TK_A_T("b", &s->pe)};
    if ((rc = tk_models__op(m, "embedding", e1, TK_NARGS(e1))) ||
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
        if ((rc = tk_models__attend(m, b, l, &s->att, &s->q, &s->k, &s->v, c->unscaled_attn ? 1.0 : 0.0, -1)) ||
            (rc = linear(m, &s->o, &a2, w->proj, w->proj_b, 1)) ||
            (rc = add_norm(m, &s->o, &s->x, w->ln2_w, w->ln2_b)))
            return rc;
        tk_arg ac[] = {TK_A_T("out", &s->g), TK_A_T("input", &s->f)};
        if ((rc = linear(m, &s->f, &s->o, w->fc, w->fc_b, 1)) ||
            (rc = tk_models__op(m, s->act_op, ac, TK_NARGS(ac))) ||
            (rc = linear(m, other, &s->g, w->out, w->out_b, 1)))
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
    if (b->want_logits && (rc = linear(m, &s->logits, h, s->lm_head, NULL, 0)) != TK_OK)
        return rc;
    return TK_OK;
}

static void free_state(tk_model *m)
{
    gpt2 *s = m->state;
    if (s)
        free(s->l);
    free(s);
    m->state = NULL;
}

const tk_models_arch tk_models__gpt2 = {"gpt2", load, plan, forward, free_state, NULL, NULL, NULL, NULL};
