/*
 * diffusion_gemma.c — DiffusionGemmaForBlockDiffusion (google/diffusiongemma-*): block diffusion over a
 * Gemma-4-style text stack, as transformers 5.24's modeling_diffusion_gemma.py computes it (the whole
 * account is in docs/diffusion.md, "Block diffusion"). One set of weights (model.decoder.*; the
 * encoder's are tied to them) runs twice: as the encoder over the prompt (causal, sliding windows) and
 * as the decoder over a canvas of canvas_length tokens, which attends bidirectionally to the encoder's
 * keys and values (the sliding layers to the last sliding_window - 1 of them) and to itself. Per layer:
 *
 *   x += post_attention_layernorm(attn(input_layernorm(x)))
 *   x  = (x + post_feedforward_layernorm(post_feedforward_layernorm_1(mlp(pre_feedforward_layernorm(x)))
 *          + post_feedforward_layernorm_2(moe(pre_feedforward_layernorm_2(x), router(x))))) * layer_scalar
 *
 * with RMSNorms scaling by w (not 1 + w), q/k normed per head, v normed per head without a weight,
 * attention scale 1, full layers of global head size whose value is their raw key projection and whose
 * RoPE is proportional (theta^(-2i/D) for the first partial_rotary_factor D/2 pairs, 0 beyond), the
 * router softmax(proj(rmsnorm(x) * scale / sqrt(H))) with per_expert_scale (the moe op's router_input
 * and expert_scale), embeddings times sqrt(H), the final logits softcapped.
 *
 * tk_model_forward on such a model: each sequence's last canvas_length tokens are the canvas (the
 * decoder, without self-conditioning: the first denoising step's logits), the tokens before them the
 * prompt (the encoder; their logits are lm_head over the encoder's last hidden state). Generation
 * (block_diffusion.c) instead keeps the encoder's keys and values in a tk_models_dgemma_kv (a contiguous
 * store per layer; why not the paged cache: at its definition): tk_models__dgemma_encode appends the
 * prompt or a finished block, tk_models__dgemma_denoise runs the decoder over the canvas alone against
 * it (or, without one, the whole-sequence forward above). layer_scalar is
 * folded in at load: the stream is carried divided by S_l (the product of the scalars before layer l),
 * so the post norms' weights are divided by S_l and the norms of the stream use eps / S_l^2.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/models.h"

#define PRE "model.decoder."

typedef struct {
    const tk_mt *in_norm, *q, *k, *v, *o, *q_norm, *k_norm, *v_ones, *post_attn;
    const tk_mt *pre_ff, *gate_up, *down, *post_ff1, *pre_ff2, *router, *router_scale, *expert_scale, *post_ff2;
    const tk_mt *post_ff;
    tk_mt experts_gu, experts_down;
    double eps;      /* the stream's norms: eps / S_l^2 */
    int64_t D, Hkv;  /* this layer's head size and kv heads */
} dg_layer;

/* One sequence's rows in a forward: ne encoder rows from row e0 (causal) and a canvas of canvas_length
 * rows from row c0 (bidirectional), at positions L0 onwards (L0 tokens already in its cache). Their keys
 * and values go to rows kbase + position of the key buffers: the sequence's cache (kv), or the
 * workspace's (kv NULL: a plain forward, kbase its first row). sc and logits: a step's (below). */
typedef struct {
    int64_t e0, ne, c0, L0, kbase;
    struct tk_models_dgemma_kv *kv;
    const float *sc; /* its self-conditioning logits [C, V] (host f32), or NULL */
    float *logits;   /* its canvas's logits [C, V] out (host f32) */
} dg_seg;

typedef struct {
    const tk_mt *embed, *lm_head, *norm, *ones_h;
    const tk_mt *sc_pre, *sc_gate_up, *sc_down; /* self-conditioning (its post_norm is ones_h) */
    double final_eps;
    dg_layer *l;
    /* the cos/sin tables (sliding: head_dim, default RoPE; full: global head size, proportional) */
    tk_mt cs[2];
    void *cs_mem[2];
    int64_t cs_rows;
    tk_mt x, h, r, o, m1, m2, q, k, v, qn, kn, att, gu, act, logits;
    /* This forward's sequences. A plain forward (tk_model_forward): one a sequence of the batch, its
     * prompt then its canvas, the keys in the workspace. A step (tk_models__dgemma_step, stepping 1):
     * every encoder row first, then the canvases, those with self-conditioning first (nsc of them), so
     * that the self-conditioning and the LM head each run once over contiguous rows. */
    dg_seg *seg;
    size_t nseg, cap_seg, nsc;
    int stepping;
} dg_state;

/* The encoder's keys and values, per layer [cap, Hkv * D] in the compute dtype on the model's device
 * (t[2l] keys, t[2l + 1] values), rows [0, len) encoded. A denoising step writes the canvas's keys and
 * values to rows [len, len + C) (the block's encoding overwrites them) and attends over rows [k0, len + C).
 * Not the paged cache of kv_cache.c: it holds one head size and one kv head count for every layer, and
 * DiffusionGemma's full layers differ from its sliding ones (global_head_dim, num_global_key_value_heads);
 * and its attention_decode is causal by position, where the canvas attends bidirectionally to the cache
 * and to itself, which the `attention` op does over contiguous keys. The sliding layers keep every row
 * too though they read only the last sliding_window - 1 (a ring would need two attention runs). */
struct tk_models_dgemma_kv {
    int64_t len, cap;
    int64_t layers;
    void **mem; /* [2 * layers] */
    tk_mt *t;   /* [2 * layers] */
};

/* ---- config.json ------------------------------------------------------------------------------ */

/* per_layer_config (v5) or global_head_dim / num_global_key_value_heads: the full layers' sizes */
static int parse_global(tk_models_config *c, const tk_models_reader *t)
{
    int64_t gd, gkv;
    int rc;
    if ((rc = tk_models__cfg_int(t, "global_head_dim", 512, 2, &gd)) ||
        (rc = tk_models__cfg_int(t, "num_global_key_value_heads", c->kv_heads, 1, &gkv)))
        return rc;
    c->global_head_dim = gd;
    c->global_kv_heads = gkv;
    json_t *plc = json_object_get(t->root, "per_layer_config");
    int seen = 0;
    for (int64_t l = 0; json_is_object(plc) && l < c->layers; l++) {
        char key[24];
        snprintf(key, sizeof key, "%lld", (long long)l);
        json_t *o = json_object_get(plc, key);
        if (!json_is_object(o))
            continue;
        tk_models_reader sub = {t->what, o};
        int64_t d, kv;
        if ((rc = tk_models__cfg_int(&sub, "head_dim", c->sliding[l] ? c->head_dim : gd, 2, &d)) ||
            (rc = tk_models__cfg_int(&sub, "num_key_value_heads", c->sliding[l] ? c->kv_heads : gkv, 1, &kv)))
            return rc;
        int64_t wd = c->sliding[l] ? c->head_dim : (seen ? c->global_head_dim : d);
        int64_t wkv = c->sliding[l] ? c->kv_heads : (seen ? c->global_kv_heads : kv);
        if (d != wd || kv != wkv)
            return tk__err(TK_ERR_UNSUPPORTED,
                           "%s: per_layer_config.%s gives head_dim %lld and %lld kv heads; tk runs one size for "
                           "the sliding layers (%lld, %lld) and one for the full ones\nHINT: a DiffusionGemma "
                           "checkpoint as transformers writes it varies only the full_attention layers",
                           t->what, key, (long long)d, (long long)kv, (long long)c->head_dim, (long long)c->kv_heads);
        if (!c->sliding[l]) {
            c->global_head_dim = d;
            c->global_kv_heads = kv;
            seen = 1;
        }
    }
    if (c->global_head_dim % 2 || c->global_head_dim > 512 || c->heads % c->global_kv_heads)
        return tk__err(TK_ERR_UNSUPPORTED,
                       "%s: full layers of head size %lld with %lld kv heads for %lld heads; "
                       "the attention op takes even head sizes up to 512 and heads a multiple of kv heads",
                       t->what, (long long)c->global_head_dim, (long long)c->global_kv_heads, (long long)c->heads);
    return TK_OK;
}

/* rope_parameters.{full_attention, sliding_attention}: proportional (or default) and default */
static int parse_rope(tk_models_config *c, const tk_models_reader *t)
{
    json_t *rp = json_object_get(t->root, "rope_parameters");
    static const char *const keys[2] = {"sliding_attention", "full_attention"};
    for (int i = 0; i < 2; i++) {
        json_t *o = json_is_object(rp) ? json_object_get(rp, keys[i]) : NULL;
        tk_models_rope *r = i ? &c->rope : &c->rope_local;
        memset(r, 0, sizeof *r);
        tk_models_reader sub = {t->what, o ? o : json_object()};
        char type[24];
        int rc = tk_models__cfg_str(&sub, "rope_type", i ? "proportional" : "default", type, sizeof type);
        if (rc == TK_OK)
            rc = tk_models__cfg_num(sub.root, t->what, "rope_theta", i ? 1e6 : 1e4, &r->theta);
        if (rc == TK_OK)
            rc = tk_models__cfg_num(sub.root, t->what, "partial_rotary_factor", i ? 0.25 : 1.0,
                                    &r->partial_rotary_factor);
        if (rc == TK_OK)
            rc = tk_models__cfg_num(sub.root, t->what, "factor", 1.0, &r->factor);
        int prop = !strcmp(type, "proportional");
        if (rc == TK_OK && ((strcmp(type, "default") && !prop) || (!prop && r->partial_rotary_factor != 1.0) ||
                            !(r->factor > 0) || !(r->partial_rotary_factor > 0 && r->partial_rotary_factor <= 1)))
            rc = tk_models__cfg_unsupported(&sub, keys[i], type,
                                            "rope_type 'proportional' (partial_rotary_factor in (0, 1], factor > 0) "
                                            "or 'default' (whole head)");
        if (!o)
            json_decref(sub.root);
        if (rc != TK_OK)
            return rc;
        r->type = r->factor != 1.0 ? TK_ROPE_LINEAR : TK_ROPE_DEFAULT;
        if (!prop)
            r->partial_rotary_factor = 1.0;
    }
    c->rope_local_on = 1;
    return TK_OK;
}

/* the text_config's sizes, norms, window and experts */
static int parse_text(tk_models_config *c, const tk_models_reader *t)
{
    int rc, bias = 0;
    char bidi[16] = "";
    if ((rc = tk_models__cfg_int(t, "vocab_size", 262144, 1, &c->vocab)) ||
        (rc = tk_models__cfg_int(t, "hidden_size", 2304, 1, &c->hidden)) ||
        (rc = tk_models__cfg_int(t, "intermediate_size", 9216, 1, &c->intermediate)) ||
        (rc = tk_models__cfg_int(t, "num_hidden_layers", 30, 1, &c->layers)) ||
        (rc = tk_models__cfg_int(t, "num_attention_heads", 8, 1, &c->heads)) ||
        (rc = tk_models__cfg_int(t, "num_key_value_heads", 4, 1, &c->kv_heads)) ||
        (rc = tk_models__cfg_int(t, "head_dim", 256, 2, &c->head_dim)) ||
        (rc = tk_models__cfg_bound(t, "max_position_embeddings", 131072, 1, &c->max_pos)) ||
        (rc = tk_models__cfg_int(t, "sliding_window", 512, 1, &c->sliding_window)) ||
        (rc = tk_models__cfg_int(t, "num_experts", INT64_MIN, 1, &c->experts)) ||
        (rc = tk_models__cfg_int(t, "top_k_experts", INT64_MIN, 1, &c->experts_topk)) ||
        (rc = tk_models__cfg_int(t, "moe_intermediate_size", INT64_MIN, 1, &c->moe_intermediate)) ||
        (rc = tk_models__cfg_num(t->root, t->what, "rms_norm_eps", 1e-6, &c->eps)) ||
        (rc = tk_models__cfg_num(t->root, t->what, "final_logit_softcapping", 30.0, &c->final_softcap)) ||
        (rc = tk_models__cfg_str(t, "hidden_activation", "gelu_pytorch_tanh", c->act, sizeof c->act)) ||
        (rc = tk_models__cfg_bool(t, "attention_bias", 0, &bias)) ||
        (rc = tk_models__cfg_str(t, "use_bidirectional_attention", "", bidi, sizeof bidi)))
        return rc;
    static const char *const acts[] = {"gelu_pytorch_tanh", NULL};
    if ((rc = tk_models__cfg_act(t, "hidden_activation", c->act, acts, "gelu_pytorch_tanh")) != TK_OK)
        return rc;
    if (bias)
        return tk_models__cfg_unsupported(t, "attention_bias", "true", "false (DiffusionGemma's)");
    if (!strcmp(bidi, "all"))
        return tk_models__cfg_unsupported(t, "use_bidirectional_attention", "'all'",
                                          "null or 'vision' (the text encoder causal)");
    if (c->heads % c->kv_heads || c->experts_topk > c->experts || c->final_softcap < 0)
        return tk__err(TK_ERR_INVALID,
                       "%s: %lld heads over %lld kv heads, top %lld of %lld experts, softcap %g: "
                       "heads must be a multiple of kv heads, top_k_experts at most num_experts, the softcap >= 0",
                       t->what, (long long)c->heads, (long long)c->kv_heads, (long long)c->experts_topk,
                       (long long)c->experts, c->final_softcap);
    if (c->layers > TK_MODELS_MAX_LAYERS)
        return TK_OK; /* config.c names the limit */
    json_t *lt = json_object_get(t->root, "layer_types");
    for (int64_t l = 0; l < c->layers; l++) /* DiffusionGemmaTextConfig's default: five sliding to one full */
        c->sliding[l] = (l + 1) % 6 != 0;
    if (lt && !json_is_null(lt) && (rc = tk_models__cfg_layer_types(c, t)) != TK_OK)
        return rc;
    c->sliding[c->layers - 1] = 0; /* the last layer is always full (the config forces it) */
    return TK_OK;
}

static int parse(tk_models_config *c, const tk_models_reader *r)
{
    json_t *tc = json_object_get(r->root, "text_config");
    if (!json_is_object(tc))
        return tk__err(TK_ERR_INVALID,
                       "%s: DiffusionGemma's config has no 'text_config' object\nHINT: write the "
                       "checkpoint with transformers' save_pretrained (DiffusionGemmaConfig)",
                       r->what);
    tk_models_reader t = {r->what, tc};
    int rc;
    if ((rc = parse_text(c, &t)) || (rc = parse_global(c, &t)) || (rc = parse_rope(c, &t)) ||
        (rc = tk_models__cfg_int(r, "canvas_length", 256, 1, &c->canvas)) ||
        (rc = tk_models__cfg_bool(r, "tie_word_embeddings", 1, &c->tie_embeddings)))
        return rc;
    static const char *const ids[3] = {"bos_token_id", "eos_token_id", "pad_token_id"};
    int64_t *dst[3] = {&c->bos_id, &c->eos_id, &c->pad_id};
    for (int i = 0; i < 3; i++) { /* the text config's, where the top level has none */
        json_t *v = json_object_get(tc, ids[i]);
        if (*dst[i] < 0 && json_is_integer(v) && json_integer_value(v) >= 0)
            *dst[i] = json_integer_value(v);
    }
    c->post_norms = 1;
    c->embed_scale = sqrt((double)c->hidden);
    c->embed_scale_rounded = 1;
    c->attn_scale = 1.0;
    c->mask_id = -1;
    c->diffusion = TK_DIFF_BLOCK; /* tk generate picks block diffusion (block_diffusion.c) */
    return TK_OK;
}

/* ---- weights ---------------------------------------------------------------------------------- */

/* layer l's layer_scalar from the checkpoint (1 when absent), as f32 */
static int layer_scalar(tk_model *m, const char *name, double *out)
{
    const tk_st_tensor *t = tk_models__st_find(m->st, name);
    float f = 1.0f;
    *out = 1.0;
    if (!t)
        return TK_OK;
    if (t->ndim > 1 || (t->ndim == 1 && t->shape[0] != 1))
        return tk__err(TK_ERR_INVALID, "%s: %s is not one number", m->cfg.arch, name);
    int rc = tk_models__to_f32(&f, t->data, 1, t->dtype);
    *out = f;
    return rc;
}

static int load_attn(tk_model *m, dg_layer *w, int64_t l, double inv_s)
{
    const tk_models_config *c = &m->cfg;
    int64_t H = c->hidden, D = w->D, Q = c->heads * D, KV = w->Hkv * D;
    int64_t qw[2] = {Q, H}, kw[2] = {KV, H}, ow[2] = {H, Q}, d1[1] = {D}, h1[1] = {H};
    char n[160];
    int rc;
#define LN(s) (snprintf(n, sizeof n, PRE "layers.%lld.%s", (long long)l, s), n)
    if ((rc = tk_models__weight(&w->in_norm, m, LN("input_layernorm.weight"), 1, h1)) ||
        (rc = tk_models__weight(&w->q, m, LN("self_attn.q_proj.weight"), 2, qw)) ||
        (rc = tk_models__weight(&w->k, m, LN("self_attn.k_proj.weight"), 2, kw)) ||
        (c->sliding[l] && (rc = tk_models__weight(&w->v, m, LN("self_attn.v_proj.weight"), 2, kw))) ||
        (rc = tk_models__weight(&w->o, m, LN("self_attn.o_proj.weight"), 2, ow)) ||
        (rc = tk_models__weight(&w->q_norm, m, LN("self_attn.q_norm.weight"), 1, d1)) ||
        (rc = tk_models__weight(&w->k_norm, m, LN("self_attn.k_norm.weight"), 1, d1)) ||
        (rc = tk_models__weight_xf(&w->v_ones, m, LN("self_attn.q_norm.weight"), 1, d1, 0, 1, 0, 0)) ||
        (rc = tk_models__weight_xf(&w->post_attn, m, LN("post_attention_layernorm.weight"), 1, h1, inv_s, 0, 0, 1)))
        return rc;
#undef LN
    return TK_OK;
}

static int load_ff(tk_model *m, dg_layer *w, int64_t l, double inv_s)
{
    const tk_models_config *c = &m->cfg;
    int64_t H = c->hidden, I = c->intermediate, E = c->experts, Ie = c->moe_intermediate;
    int64_t dw[2] = {H, I}, rw[2] = {E, H}, e1[1] = {E}, h1[1] = {H}, egu[3] = {E, 2 * Ie, H}, edn[3] = {E, H, Ie};
    char n[160], g[160], u[160];
    const tk_mt *gu, *dn;
    int rc;
#define LN(s) (snprintf(n, sizeof n, PRE "layers.%lld.%s", (long long)l, s), n)
    snprintf(g, sizeof g, PRE "layers.%lld.mlp.gate_proj.weight", (long long)l);
    snprintf(u, sizeof u, PRE "layers.%lld.mlp.up_proj.weight", (long long)l);
    const char *gup[2] = {g, u};
    if ((rc = tk_models__weight(&w->pre_ff, m, LN("pre_feedforward_layernorm.weight"), 1, h1)) ||
        (rc = tk_models__weight_cat(&w->gate_up, m, gup, 2, I, H)) ||
        (rc = tk_models__weight(&w->down, m, LN("mlp.down_proj.weight"), 2, dw)) ||
        (rc = tk_models__weight(&w->post_ff1, m, LN("post_feedforward_layernorm_1.weight"), 1, h1)) ||
        (rc = tk_models__weight(&w->pre_ff2, m, LN("pre_feedforward_layernorm_2.weight"), 1, h1)) ||
        (rc = tk_models__weight(&w->router, m, LN("router.proj.weight"), 2, rw)) ||
        (rc = tk_models__weight_xf(&w->router_scale, m, LN("router.scale"), 1, h1, 1.0 / sqrt((double)H), 0, 0, 1)) ||
        (rc = tk_models__weight(&w->expert_scale, m, LN("router.per_expert_scale"), 1, e1)) ||
        (rc = tk_models__weight(&gu, m, LN("experts.gate_up_proj"), 3, egu)) ||
        (rc = tk_models__weight(&dn, m, LN("experts.down_proj"), 3, edn)) ||
        (rc = tk_models__weight(&w->post_ff2, m, LN("post_feedforward_layernorm_2.weight"), 1, h1)) ||
        (rc = tk_models__weight_xf(&w->post_ff, m, LN("post_feedforward_layernorm.weight"), 1, h1, inv_s, 0, 0, 1)))
        return rc;
#undef LN
    tk_models__view(&w->experts_gu, gu, 3, egu);
    tk_models__view(&w->experts_down, dn, 3, edn);
    return TK_OK;
}

/* the encoder's and the decoder's layer_scalar (they must agree) into the running product *S */
static int load_scalar(tk_model *m, int64_t l, double *ls)
{
    char a[160], b[160];
    double enc;
    snprintf(a, sizeof a, PRE "layers.%lld.layer_scalar", (long long)l);
    snprintf(b, sizeof b, "model.encoder.language_model.layers.%lld.layer_scalar", (long long)l);
    int rc;
    if ((rc = layer_scalar(m, a, ls)) || (rc = layer_scalar(m, b, &enc)))
        return rc;
    if (tk_models__st_find(m->st, b) && enc != *ls)
        return tk__err(TK_ERR_UNSUPPORTED,
                       "%s: layer %lld's layer_scalar is %g in the encoder and %g in the "
                       "decoder; tk folds one scalar per layer into the weights\nHINT: transformers' "
                       "DiffusionGemma checkpoints keep them equal",
                       m->cfg.arch, (long long)l, enc, *ls);
    if (!(*ls != 0) || !isfinite(*ls))
        return tk__err(TK_ERR_INVALID, "%s: layer %lld's layer_scalar is %g", m->cfg.arch, (long long)l, *ls);
    return TK_OK;
}

static int load(tk_model *m)
{
    const tk_models_config *c = &m->cfg;
    dg_state *s = calloc(1, sizeof *s);
    if (!s || !(s->l = calloc((size_t)c->layers, sizeof *s->l))) {
        free(s);
        return tk__err(TK_ERR_NOMEM, "out of memory");
    }
    m->state = s;
    int64_t V = c->vocab, H = c->hidden, I = c->intermediate, vh[2] = {V, H}, h1[1] = {H}, dw[2] = {H, I};
    float es = (float)c->embed_scale; /* the scale in the compute dtype, then one rounding of the product */
    uint16_t lo[2];
    tk_models__from_f32(lo, &es, 1, m->dtype);
    tk_models__dtype_to_f32(&es, lo, 1, m->dtype);
    const char *emb = PRE "embed_tokens.weight";
    const char *sgu[2] = {PRE "self_conditioning.gate_proj.weight", PRE "self_conditioning.up_proj.weight"};
    int rc;
    if ((rc = tk_models__weight(&s->lm_head, m, c->tie_embeddings ? emb : "lm_head.weight", 2, vh)) ||
        (rc = tk_models__weight_xf(&s->embed, m, emb, 2, vh, es, 0, 0, !c->tie_embeddings)) ||
        (rc = tk_models__weight_xf(&s->ones_h, m, PRE "norm.weight", 1, h1, 0, 1, 0, 0)) ||
        (rc = tk_models__weight(&s->sc_pre, m, PRE "self_conditioning.pre_norm.weight", 1, h1)) ||
        (rc = tk_models__weight_cat(&s->sc_gate_up, m, sgu, 2, I, H)) ||
        (rc = tk_models__weight(&s->sc_down, m, PRE "self_conditioning.down_proj.weight", 2, dw)))
        return rc;
    tk_models__mark_embedding(s->embed);
    double S = 1.0; /* the product of the layer scalars before layer l */
    for (int64_t l = 0; l < c->layers; l++) {
        dg_layer *w = &s->l[l];
        double ls;
        w->D = c->sliding[l] ? c->head_dim : c->global_head_dim;
        w->Hkv = c->sliding[l] ? c->kv_heads : c->global_kv_heads;
        w->eps = c->eps / (S * S);
        if ((rc = load_scalar(m, l, &ls)) || (rc = load_attn(m, w, l, 1.0 / S)) || (rc = load_ff(m, w, l, 1.0 / S)))
            return rc;
        S *= ls;
    }
    s->final_eps = c->eps / (S * S);
    return tk_models__weight(&s->norm, m, PRE "norm.weight", 1, h1);
}

static void free_state(tk_model *m)
{
    dg_state *s = m->state;
    if (!s)
        return;
    for (int i = 0; i < 2; i++)
        if (s->cs_mem[i])
            tk_models__dev_free(m, s->cs_mem[i]);
    free(s->l);
    free(s->seg);
    free(s);
    m->state = NULL;
}

/* ---- forward ---------------------------------------------------------------------------------- */

static int plan(tk_model *m, tk_models_batch *b)
{
    const tk_models_config *c = &m->cfg;
    dg_state *s = m->state;
    int64_t T = b->T, H = c->hidden, Dm = c->head_dim > c->global_head_dim ? c->head_dim : c->global_head_dim;
    int64_t kvs = c->kv_heads * c->head_dim, kvg = c->global_kv_heads * c->global_head_dim;
    int64_t I = c->intermediate > c->moe_intermediate ? c->intermediate : c->moe_intermediate;
    int64_t th[2] = {T, H}, tq[2] = {T, c->heads * Dm}, tkv[2] = {T, kvs > kvg ? kvs : kvg}, tgu[2] = {T, 2 * I},
            ti[2] = {T, I}, tv[2] = {m->plan_key > 0 ? m->plan_key : T, c->vocab};
    tk_mt *hs[6] = {&s->x, &s->h, &s->r, &s->o, &s->m1, &s->m2};
    int rc = TK_OK;
    for (int i = 0; i < 6 && rc == TK_OK; i++)
        rc = tk_models__ws_tensor(m, hs[i], m->dtype, 2, th);
    if (rc || (rc = tk_models__ws_tensor(m, &s->q, m->dtype, 2, tq)) ||
        (rc = tk_models__ws_tensor(m, &s->qn, m->dtype, 2, tq)) ||
        (rc = tk_models__ws_tensor(m, &s->att, m->dtype, 2, tq)) ||
        (rc = tk_models__ws_tensor(m, &s->k, m->dtype, 2, tkv)) ||
        (rc = tk_models__ws_tensor(m, &s->kn, m->dtype, 2, tkv)) ||
        (rc = tk_models__ws_tensor(m, &s->v, m->dtype, 2, tkv)) ||
        (rc = tk_models__ws_tensor(m, &s->gu, m->dtype, 2, tgu)) ||
        (rc = tk_models__ws_tensor(m, &s->act, m->dtype, 2, ti)) ||
        (rc = tk_models__ws_tensor(m, &s->logits, m->dtype, 2, tv)))
        return rc;
    b->logits = &s->logits;
    b->hidden = &s->h;
    return TK_OK;
}

/* The two cos/sin tables for positions [0, max_len), grown by doubling: the sliding layers' RoPE over
 * head_dim, the full layers' over the global head size with the pairs past partial_rotary_factor made
 * the identity (cos 1, sin 0: proportional RoPE's zero frequencies). */
static int rope_tables(tk_model *m, dg_state *s, int64_t max_len)
{
    const tk_models_config *c = &m->cfg;
    if (s->cs_rows >= max_len)
        return TK_OK;
    int64_t rows = s->cs_rows ? s->cs_rows : 256;
    while (rows < max_len)
        rows *= 2;
    for (int i = 0; i < 2; i++) {
        const tk_models_rope *r = i ? &c->rope : &c->rope_local;
        int64_t rot = i ? c->global_head_dim : c->head_dim, shp[2] = {rows, rot};
        size_t bytes = (size_t)(rows * rot) * sizeof(float);
        if (s->cs_mem[i])
            tk_models__dev_free(m, s->cs_mem[i]);
        s->cs_mem[i] = NULL;
        s->cs_rows = 0;
        int rc = tk_models__dev_alloc(m, &s->cs_mem[i], bytes);
        if (rc != TK_OK)
            return rc;
        tk_models__view(&s->cs[i], &s->x, 2, shp);
        s->cs[i].t.data = s->cs_mem[i];
        s->cs[i].t.dtype = (tk_dtype){TK_DL_FLOAT, 32, 1};
        tk_arg a[] = {TK_A_T("out", &s->cs[i]), TK_A_F("base", r->theta), TK_A_I("scaling", r->type),
                      TK_A_F("factor", r->factor)};
        if ((rc = tk_models__op(m, "rope_cos_sin_cache", a, TK_NARGS(a))) != TK_OK)
            return rc;
        int64_t half = rot / 2, keep = (int64_t)floor(r->partial_rotary_factor * (double)rot / 2.0);
        if (keep < half) {
            float *h = malloc(bytes);
            rc = h ? tk_models__from_dev(m, h, s->cs_mem[i], bytes) : tk__err(TK_ERR_NOMEM, "out of memory");
            for (int64_t p = 0; rc == TK_OK && p < rows; p++)
                for (int64_t j = keep; j < half; j++) {
                    h[p * rot + j] = 1.0f;
                    h[p * rot + half + j] = 0.0f;
                }
            if (rc == TK_OK)
                rc = tk_models__to_dev(m, s->cs_mem[i], h, bytes);
            free(h);
            if (rc != TK_OK)
                return rc;
        }
    }
    s->cs_rows = rows;
    return TK_OK;
}

static int rms(tk_model *m, const tk_mt *out, const tk_mt *in, const tk_mt *w, double eps)
{
    tk_arg a[] = {TK_A_T("out", out), TK_A_T("input", in), TK_A_T("weight", w), TK_A_F("eps", eps)};
    return tk_models__op(m, "rms_norm", a, TK_NARGS(a));
}

static int add(tk_model *m, const tk_mt *x, const tk_mt *y)
{
    tk_arg a[] = {TK_A_T("out", x), TK_A_T("a", x), TK_A_T("b", y)};
    return tk_models__op(m, "add", a, TK_NARGS(a));
}

/* rows [r0, r0 + n) of a [T, heads * D] buffer as [1, n, heads, D] */
static void heads_view(tk_mt *v, const tk_mt *t, int64_t r0, int64_t n, int64_t heads, int64_t D)
{
    int64_t shp[4] = {1, n, heads, D};
    tk_mt rows;
    tk_models__view(&rows, t, 2, (int64_t[]){t->shape[0], heads * D});
    tk_models__rows(&rows, &rows, r0, n);
    tk_models__view(v, &rows, 4, shp);
}

static int attend(tk_model *m, const dg_layer *w, int64_t q0, int64_t nq, const tk_mt *kb, const tk_mt *vb, int64_t k0,
                  int64_t nk, int causal, int64_t window)
{
    dg_state *s = m->state;
    tk_mt o4, q4, k4, v4;
    heads_view(&o4, &s->att, q0, nq, m->cfg.heads, w->D);
    heads_view(&q4, &s->qn, q0, nq, m->cfg.heads, w->D);
    heads_view(&k4, kb, k0, nk, w->Hkv, w->D);
    heads_view(&v4, vb, k0, nk, w->Hkv, w->D);
    tk_arg a[] = {TK_A_T("out", &o4),
                  TK_A_T("q", &q4),
                  TK_A_T("k", &k4),
                  TK_A_T("v", &v4),
                  TK_A_F("scale", 1.0),
                  TK_A_I("causal", causal),
                  TK_A_I("window_left", window)};
    return tk_models__op(m, "attention", a, TK_NARGS(a));
}

/* The key and value buffers of sequence g at layer l: its cache's, or the workspace's */
static void kv_bufs(const dg_state *s, const dg_seg *g, int64_t l, const tk_mt **kb, const tk_mt **vb)
{
    *kb = g->kv ? &g->kv->t[2 * l] : &s->kn;
    *vb = g->kv ? &g->kv->t[2 * l + 1] : &s->v;
}

/* The n rows of layer l from forward row r0, at positions p0 onwards, of sequence g: their keys and
 * values normed (v without a weight; full layers: v is the raw key) into g's key buffers' rows
 * kbase + p0 onwards, and rotated with their queries (s->qn) */
static int kv_rows(tk_model *m, tk_models_batch *b, int64_t l, const dg_seg *g, int64_t r0, int64_t n, int64_t p0)
{
    const tk_models_config *c = &m->cfg;
    dg_state *s = m->state;
    const dg_layer *w = &s->l[l];
    int64_t D = w->D, Hkv = w->Hkv;
    const tk_mt *kb, *vb;
    kv_bufs(s, g, l, &kb, &vb);
    tk_mt k2, v2, kr, vr, kd, vd, k3, v3, kd3, vd3, q2, q3, pos;
    tk_models__view(&k2, &s->k, 2, (int64_t[]){b->T, Hkv * D});
    tk_models__view(&v2, &s->v, 2, (int64_t[]){b->T, Hkv * D});
    tk_models__view(&q2, &s->qn, 2, (int64_t[]){b->T, c->heads * D});
    tk_models__rows(&kr, &k2, r0, n);
    tk_models__rows(&vr, &v2, r0, n);
    tk_models__view(&kd, kb, 2, (int64_t[]){kb->shape[0], Hkv * D}); /* the workspace's rows are wider */
    tk_models__view(&vd, vb, 2, (int64_t[]){vb->shape[0], Hkv * D});
    tk_models__rows(&kd, &kd, g->kbase + p0, n);
    tk_models__rows(&vd, &vd, g->kbase + p0, n);
    tk_models__rows(&q2, &q2, r0, n);
    tk_models__rows(&pos, &b->pos, r0, n);
    tk_models__view(&k3, &kr, 3, (int64_t[]){n, Hkv, D});
    tk_models__view(&v3, &vr, 3, (int64_t[]){n, Hkv, D});
    tk_models__view(&kd3, &kd, 3, (int64_t[]){n, Hkv, D});
    tk_models__view(&vd3, &vd, 3, (int64_t[]){n, Hkv, D});
    tk_models__view(&q3, &q2, 3, (int64_t[]){n, c->heads, D});
    int rc;
    if ((rc = rms(m, &vd3, w->v ? &v3 : &k3, w->v_ones, c->eps)) || (rc = rms(m, &kd3, &k3, w->k_norm, c->eps)))
        return rc;
    tk_arg rot[] = {TK_A_T("query", &q3), TK_A_T("key", &kd3), TK_A_T("positions", &pos),
                    TK_A_T("cos_sin_cache", &s->cs[c->sliding[l] ? 0 : 1]), TK_A_I("is_neox", 1)};
    return tk_models__op(m, "rotary_embedding", rot, TK_NARGS(rot));
}

/* Layer l's queries (s->qn, every row) and each sequence's keys and values into its key buffers,
 * normed and rotated, from the layer's normed input s->h */
static int qkv(tk_model *m, tk_models_batch *b, int64_t l)
{
    const tk_models_config *c = &m->cfg;
    dg_state *s = m->state;
    const dg_layer *w = &s->l[l];
    int64_t T = b->T, D = w->D, Hq = c->heads, Hkv = w->Hkv, C = c->canvas;
    tk_mt q2, k2, v2, q3, qn3;
    tk_models__view(&q2, &s->q, 2, (int64_t[]){T, Hq * D});
    tk_models__view(&k2, &s->k, 2, (int64_t[]){T, Hkv * D});
    tk_models__view(&v2, &s->v, 2, (int64_t[]){T, Hkv * D});
    tk_models__view(&q3, &s->q, 3, (int64_t[]){T, Hq, D});
    tk_models__view(&qn3, &s->qn, 3, (int64_t[]){T, Hq, D});
    int rc;
    if ((rc = tk_models__linear(m, &q2, &s->h, w->q, NULL, 0)) ||
        (rc = tk_models__linear(m, &k2, &s->h, w->k, NULL, 0)) ||
        (w->v && (rc = tk_models__linear(m, &v2, &s->h, w->v, NULL, 0))) || (rc = rms(m, &qn3, &q3, w->q_norm, c->eps)))
        return rc;
    for (size_t i = 0; rc == TK_OK && i < s->nseg; i++) {
        const dg_seg *g = &s->seg[i];
        if (g->c0 == g->e0 + g->ne) /* the canvas follows the encoder's rows: one run */
            rc = kv_rows(m, b, l, g, g->e0, g->ne + C, g->L0);
        else if ((rc = g->ne ? kv_rows(m, b, l, g, g->e0, g->ne, g->L0) : TK_OK) == TK_OK)
            rc = kv_rows(m, b, l, g, g->c0, C, g->L0 + g->ne);
    }
    return rc;
}

/* Sequence g's attention at layer l into s->att: its encoder rows causal over its cached keys and
 * themselves (the sliding layers over their window), its canvas bidirectional over the cache (the
 * sliding layers' last W - 1 keys, what transformers' sliding cache keeps) and itself */
static int attn_seg(tk_model *m, int64_t l, const dg_seg *g)
{
    const tk_models_config *c = &m->cfg;
    dg_state *s = m->state;
    const dg_layer *w = &s->l[l];
    int64_t C = c->canvas, W = c->sliding_window, sl = c->sliding[l], Lc = g->L0 + g->ne;
    const tk_mt *kb, *vb;
    kv_bufs(s, g, l, &kb, &vb);
    int rc = TK_OK;
    if (g->ne) {
        int64_t k0 = sl && g->L0 > W - 1 ? g->L0 - (W - 1) : 0;
        rc = attend(m, w, g->e0, g->ne, kb, vb, g->kbase + k0, Lc - k0, 1, sl ? W - 1 : -1);
    }
    int64_t k0 = sl && Lc > W - 1 ? Lc - (W - 1) : 0;
    return rc != TK_OK ? rc : attend(m, w, g->c0, C, kb, vb, g->kbase + k0, Lc + C - k0, 0, -1);
}

/* o = o_proj(attention) of layer l over its normed input s->h */
static int attn_block(tk_model *m, tk_models_batch *b, int64_t l)
{
    const tk_models_config *c = &m->cfg;
    dg_state *s = m->state;
    tk_mt a2;
    tk_models__view(&a2, &s->att, 2, (int64_t[]){b->T, c->heads * s->l[l].D});
    int rc = qkv(m, b, l);
    for (size_t i = 0; rc == TK_OK && i < s->nseg; i++)
        rc = attn_seg(m, l, &s->seg[i]);
    return rc != TK_OK ? rc : tk_models__linear(m, &s->o, &a2, s->l[l].o, NULL, 0);
}

/* x += post_ff(post_ff1(mlp(pre_ff(x))) + post_ff2(moe(pre_ff2(x), router(x)))) */
static int ff_block(tk_model *m, const dg_layer *w)
{
    const tk_models_config *c = &m->cfg;
    dg_state *s = m->state;
    int rc;
    tk_mt gu, act;
    tk_models__view(&gu, &s->gu, 2, (int64_t[]){s->x.shape[0], 2 * c->intermediate});
    tk_models__view(&act, &s->act, 2, (int64_t[]){s->x.shape[0], c->intermediate});
    tk_arg gm[] = {TK_A_T("out", &act), TK_A_T("input", &gu)};
    if ((rc = rms(m, &s->h, &s->x, w->pre_ff, w->eps)) ||
        (rc = tk_models__linear(m, &gu, &s->h, w->gate_up, NULL, 0)) ||
        (rc = tk_models__op(m, "gelu_tanh_and_mul", gm, TK_NARGS(gm))) ||
        (rc = tk_models__linear(m, &s->m1, &act, w->down, NULL, 0)) ||
        (rc = rms(m, &s->m1, &s->m1, w->post_ff1, c->eps)))
        return rc;
    if ((rc = rms(m, &s->h, &s->x, w->pre_ff2, w->eps)) || (rc = rms(m, &s->r, &s->x, w->router_scale, w->eps)))
        return rc;
    tk_arg mo[] = {TK_A_T("out", &s->m2),
                   TK_A_T("input", &s->h),
                   TK_A_T("router_weight", w->router),
                   TK_A_T("gate_up", &w->experts_gu),
                   TK_A_T("down", &w->experts_down),
                   TK_A_I("top_k", c->experts_topk),
                   TK_A_I("norm_topk_prob", 1),
                   TK_A_I("activation", 1),
                   TK_A_T("router_input", &s->r),
                   TK_A_T("expert_scale", w->expert_scale)};
    if ((rc = tk_models__op(m, "moe", mo, TK_NARGS(mo))) || (rc = rms(m, &s->m2, &s->m2, w->post_ff2, c->eps)) ||
        (rc = add(m, &s->m1, &s->m2)) || (rc = rms(m, &s->m1, &s->m1, w->post_ff, c->eps)))
        return rc;
    return add(m, &s->x, &s->m1);
}

/* Room for n sequences in s->seg */
static int seg_room(dg_state *s, size_t n)
{
    if (n <= s->cap_seg)
        return TK_OK;
    dg_seg *g = realloc(s->seg, n * sizeof *g);
    if (!g)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    s->seg = g;
    s->cap_seg = n;
    return TK_OK;
}

/* A plain forward's sequences from the batch's offsets: each a prompt then a canvas, keys in the workspace */
static int plain_segs(tk_model *m, tk_models_batch *b)
{
    int64_t C = m->cfg.canvas;
    dg_state *s = m->state;
    int32_t *cu = malloc((size_t)(b->nseq + 1) * sizeof *cu);
    int rc = cu ? tk_models__from_dev(m, cu, b->cu.t.data, (size_t)(b->nseq + 1) * sizeof *cu)
                : tk__err(TK_ERR_NOMEM, "out of memory");
    if (rc == TK_OK)
        rc = seg_room(s, (size_t)b->nseq);
    for (int64_t q = 0; rc == TK_OK && q < b->nseq; q++) {
        int64_t st = cu[q], n = cu[q + 1] - st;
        if (n <= C)
            rc = tk__err(TK_ERR_INVALID,
                         "%s: sequence %lld has %lld tokens; a DiffusionGemma forward takes a prompt followed by a "
                         "canvas of canvas_length %lld tokens, so more than %lld\nHINT: append %lld canvas tokens to "
                         "a prompt of at least one token",
                         m->cfg.arch, (long long)q, (long long)n, (long long)C, (long long)C, (long long)C);
        else
            s->seg[q] = (dg_seg){.e0 = st, .ne = n - C, .c0 = st + n - C, .kbase = st};
    }
    s->nseg = rc == TK_OK ? (size_t)b->nseq : 0;
    s->nsc = 0;
    free(cu);
    return rc;
}

/* A step's positions: each sequence's encoder rows and canvas after what its cache holds */
static int step_pos(tk_model *m, tk_models_batch *b)
{
    const dg_state *s = m->state;
    int64_t C = m->cfg.canvas, *pos = malloc((size_t)b->T * sizeof *pos);
    if (!pos)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < s->nseg; i++) {
        const dg_seg *g = &s->seg[i];
        for (int64_t j = 0; j < g->ne; j++)
            pos[g->e0 + j] = g->L0 + j;
        for (int64_t j = 0; j < C; j++)
            pos[g->c0 + j] = g->L0 + g->ne + j;
    }
    int rc = tk_models__to_dev(m, b->pos.t.data, pos, (size_t)b->T * sizeof *pos);
    free(pos);
    return rc;
}

/* The canvases with self-conditioning, the step's first nsc (rows x0 onwards, contiguous): x +=
 * sc_mlp(pre_norm(softmax(sc) @ embed * sqrt(H))), then post_norm: the decoder's input with each one's
 * previous processed logits. The logits' first rows hold softmax(sc), the other buffers' first rows the
 * MLP (the layers overwrite them); the weights are read once for every canvas. */
static int self_condition(tk_model *m, int64_t x0)
{
    const tk_models_config *c = &m->cfg;
    dg_state *s = m->state;
    int64_t C = c->canvas, V = c->vocab, I = c->intermediate, R = (int64_t)s->nsc * C;
    size_t n = (size_t)(C * V), es = m->dtype.bits / 8u;
    tk_mt x, p, soft, nrm, gu, act, sig;
    tk_models__rows(&x, &s->x, x0, R);
    tk_models__rows(&p, &s->logits, 0, R);
    tk_models__rows(&soft, &s->m2, 0, R);
    tk_models__rows(&nrm, &s->h, 0, R);
    tk_models__rows(&sig, &s->m1, 0, R);
    tk_models__view(&gu, &s->gu, 2, (int64_t[]){R, 2 * I});
    tk_models__view(&act, &s->act, 2, (int64_t[]){R, I});
    char *tmp = malloc(s->nsc * n * es);
    if (!tmp)
        return tk__err(TK_ERR_NOMEM, "out of memory for %zu canvases' self-conditioning logits", s->nsc);
    for (size_t k = 0; k < s->nsc; k++) /* processed_logits.to(embed dtype), as transformers */
        tk_models__from_f32(tmp + k * n * es, s->seg[k].sc, n, m->dtype);
    int rc = tk_models__to_dev(m, p.t.data, tmp, s->nsc * n * es);
    free(tmp);
    tk_arg sm[] = {TK_A_T("out", &p), TK_A_T("input", &p)};
    tk_arg gm[] = {TK_A_T("out", &act), TK_A_T("input", &gu)};
    if (rc || (rc = tk_models__op(m, "softmax", sm, TK_NARGS(sm))) ||
        (rc = tk_models__linear(m, &soft, &p, s->embed, NULL, 1)) || (rc = rms(m, &nrm, &soft, s->sc_pre, c->eps)) ||
        (rc = tk_models__linear(m, &gu, &nrm, s->sc_gate_up, NULL, 0)) ||
        (rc = tk_models__op(m, "gelu_tanh_and_mul", gm, TK_NARGS(gm))) ||
        (rc = tk_models__linear(m, &sig, &act, s->sc_down, NULL, 0)) || (rc = add(m, &x, &sig)))
        return rc;
    return rms(m, &x, &x, s->ones_h, c->eps);
}

/* The final norm and the softcapped logits of rows [r0, r0 + n) into the logits' first n rows */
static int lm_head(tk_model *m, int64_t r0, int64_t n)
{
    const tk_models_config *c = &m->cfg;
    dg_state *s = m->state;
    tk_mt x, in, out;
    tk_models__rows(&x, &s->x, r0, n);
    tk_models__rows(&in, &s->h, r0, n);
    tk_models__rows(&out, &s->logits, 0, n);
    int rc = rms(m, &in, &x, s->norm, s->final_eps);
    if (rc == TK_OK)
        rc = tk_models__linear(m, &out, &in, s->lm_head, NULL, 0);
    if (rc == TK_OK && c->final_softcap > 0) {
        tk_arg a[] = {TK_A_T("out", &out), TK_A_T("input", &out), TK_A_F("cap", c->final_softcap)};
        rc = tk_models__op(m, "softcap", a, TK_NARGS(a));
    }
    return rc;
}

static int forward(tk_model *m, tk_models_batch *b)
{
    const tk_models_config *c = &m->cfg;
    dg_state *s = m->state;
    int64_t C = c->canvas, top = 0;
    if (b->kv)
        return tk__err(TK_ERR_UNSUPPORTED,
                       "%s is a block diffusion model: it does not decode token by token\n"
                       "HINT: run one denoising step with tk model logits (prompt + canvas_length canvas tokens)",
                       c->arch);
    int rc = s->stepping ? step_pos(m, b) : plain_segs(m, b);
    for (size_t i = 0; i < s->nseg; i++)
        top = s->seg[i].L0 + s->seg[i].ne + C > top ? s->seg[i].L0 + s->seg[i].ne + C : top;
    if (rc != TK_OK || (rc = rope_tables(m, s, top)) != TK_OK)
        return rc;
    tk_arg emb[] = {TK_A_T("out", &s->x), TK_A_T("ids", &b->ids), TK_A_T("weight", s->embed)};
    if ((rc = tk_models__op(m, "embedding", emb, TK_NARGS(emb))) != TK_OK)
        return rc;
    for (size_t i = s->nsc; i < s->nseg; i++) { /* a canvas without sc: post_norm(embed + 0) */
        tk_mt rows;
        tk_models__rows(&rows, &s->x, s->seg[i].c0, C);
        if ((rc = rms(m, &rows, &rows, s->ones_h, c->eps)) != TK_OK)
            return rc;
    }
    if (s->nsc && (rc = self_condition(m, s->seg[0].c0)) != TK_OK)
        return rc;
    for (int64_t l = 0; l < c->layers; l++) {
        const dg_layer *w = &s->l[l];
        if ((rc = rms(m, &s->h, &s->x, w->in_norm, w->eps)) || (rc = attn_block(m, b, l)) ||
            (rc = rms(m, &s->o, &s->o, w->post_attn, c->eps)) || (rc = add(m, &s->x, &s->o)) || (rc = ff_block(m, w)))
            return rc;
    }
    if (s->stepping) /* the canvases, contiguous after every encoder row */
        return lm_head(m, b->T - (int64_t)s->nseg * C, (int64_t)s->nseg * C);
    if (!b->want_logits)
        return rms(m, &s->h, &s->x, s->norm, s->final_eps);
    return lm_head(m, 0, b->T);
}

/* ---- the encoder's cache and the denoising step (block_diffusion.c) --------------------------- */

static int is_dgemma(tk_model *m, const char *fn)
{
    if (m->arch != &tk_models__diffusion_gemma)
        return tk__err(TK_ERR_INTERNAL, "%s: %s is not DiffusionGemma", fn, m->cfg.arch);
    return TK_OK;
}

int tk_models__dgemma_kv_new(tk_models_dgemma_kv **out, tk_model *m, int64_t cap)
{
    *out = NULL;
    int rc = is_dgemma(m, "tk_models__dgemma_kv_new");
    if (rc != TK_OK)
        return rc;
    const dg_state *s = m->state;
    int64_t L = m->cfg.layers;
    tk_models_dgemma_kv *kv = calloc(1, sizeof *kv);
    if (!kv || !(kv->mem = calloc((size_t)(2 * L), sizeof *kv->mem)) ||
        !(kv->t = calloc((size_t)(2 * L), sizeof *kv->t))) {
        tk_models__dgemma_kv_free(m, kv);
        return tk__err(TK_ERR_NOMEM, "out of memory");
    }
    kv->cap = cap;
    kv->layers = L;
    tk_mt proto = {0}; /* the compute dtype on the model's device */
    tk_models__view(&proto, s->embed, 1, (int64_t[]){1});
    for (int64_t i = 0; rc == TK_OK && i < 2 * L; i++) {
        const dg_layer *w = &s->l[i / 2];
        int64_t shp[2] = {cap, w->Hkv * w->D};
        rc = tk_models__dev_alloc(m, &kv->mem[i], (size_t)(cap * shp[1]) * (m->dtype.bits / 8u));
        tk_models__view(&kv->t[i], &proto, 2, shp);
        kv->t[i].t.dtype = m->dtype;
        kv->t[i].t.data = kv->mem[i];
    }
    if (rc != TK_OK) {
        tk_models__dgemma_kv_free(m, kv);
        return tk__err_wrap(rc, "%s: the encoder's keys and values for %lld tokens", m->cfg.arch, (long long)cap);
    }
    *out = kv;
    return TK_OK;
}

void tk_models__dgemma_kv_free(tk_model *m, tk_models_dgemma_kv *kv)
{
    if (!kv)
        return;
    for (int64_t i = 0; kv->mem && i < 2 * kv->layers; i++)
        if (kv->mem[i])
            tk_models__dev_free(m, kv->mem[i]);
    free(kv->mem);
    free(kv->t);
    free(kv);
}

void tk_models__dgemma_kv_rewind(tk_models_dgemma_kv *kv, int64_t len)
{
    if (kv && len >= 0 && len < kv->len)
        kv->len = len;
}

/* Checks q[0..n) against their caches; *enc: their encoder rows in all, *nsc: those with sc */
static int step_check(tk_model *m, const tk_models_dgemma_seq *q, size_t n, int64_t *enc, size_t *nsc)
{
    int64_t C = m->cfg.canvas;
    *enc = 0;
    *nsc = 0;
    if (!q || !n)
        return tk__err(TK_ERR_INTERNAL, "tk_models__dgemma_step: no sequences");
    for (size_t i = 0; i < n; i++) {
        const tk_models_dgemma_kv *kv = q[i].kv;
        if (!kv || !q[i].ids || !q[i].logits || (int64_t)q[i].len < C || kv->len + (int64_t)q[i].len > kv->cap)
            return tk__err(TK_ERR_INTERNAL,
                           "tk_models__dgemma_step: sequence %zu: %zu ids (canvas %lld) after %lld cached, room for "
                           "%lld",
                           i, q[i].len, (long long)C, kv ? (long long)kv->len : -1LL, kv ? (long long)kv->cap : -1LL);
        if (*enc > INT32_MAX - (int64_t)q[i].len)
            return tk__err(TK_ERR_INVALID, "tk_models__dgemma_step: more than 2^31 tokens");
        *enc += (int64_t)q[i].len - C;
        *nsc += q[i].sc != NULL;
    }
    return TK_OK;
}

/* Each canvas's logits (the logits' rows in the step's canvas order) into its sequence's f32 buffer */
static int step_logits(tk_model *m)
{
    dg_state *s = m->state;
    size_t n = (size_t)(m->cfg.canvas * m->cfg.vocab), es = m->dtype.bits / 8u;
    char *tmp = m->dev_type == TK_DEV_CPU ? s->logits.t.data : malloc(s->nseg * n * es);
    if (!tmp)
        return tk__err(TK_ERR_NOMEM, "out of memory for %zu canvases' logits", s->nseg);
    int rc = tmp != s->logits.t.data ? tk_models__from_dev(m, tmp, s->logits.t.data, s->nseg * n * es) : TK_OK;
    for (size_t i = 0; rc == TK_OK && i < s->nseg; i++)
        tk_models__dtype_to_f32(s->seg[i].logits, tmp + i * n * es, n, m->dtype);
    if (tmp != s->logits.t.data)
        free(tmp);
    return rc;
}

int tk_models__dgemma_step(tk_model *m, const tk_models_dgemma_seq *q, size_t n)
{
    int rc = is_dgemma(m, "tk_models__dgemma_step");
    if (rc != TK_OK)
        return rc;
    dg_state *s = m->state;
    int64_t C = m->cfg.canvas, E;
    size_t nsc;
    if ((rc = step_check(m, q, n, &E, &nsc)) != TK_OK || (rc = seg_room(s, n)) != TK_OK)
        return rc;
    size_t T = (size_t)E + n * (size_t)C;
    int32_t *ids = malloc(T * sizeof *ids);
    if (!ids)
        return tk__err(TK_ERR_NOMEM, "out of memory for a denoising step of %zu tokens", T);
    /* the layout: every encoder row, then the canvases, those with self-conditioning first */
    int64_t e0 = 0;
    for (size_t pass = 0, k = 0; pass < 2; pass++)
        for (size_t i = 0; i < n; i++) {
            if ((q[i].sc != NULL) != (pass == 0))
                continue;
            int64_t ne = (int64_t)q[i].len - C, c0 = E + (int64_t)k * C;
            s->seg[k++] = (dg_seg){e0, ne, c0, q[i].kv->len, 0, q[i].kv, q[i].sc, q[i].logits};
            memcpy(ids + e0, q[i].ids, (size_t)ne * sizeof *ids);
            memcpy(ids + c0, q[i].ids + ne, (size_t)C * sizeof *ids);
            e0 += ne;
        }
    s->nseg = n;
    s->nsc = nsc;
    s->stepping = 1;
    m->plan_key = (int64_t)n * C; /* the logits' rows: the canvases', not the encoder's */
    rc = tk_model_forward(m, ids, &T, 1, NULL, NULL);
    m->plan_key = 0;
    s->stepping = 0;
    free(ids);
    if (rc == TK_OK)
        rc = step_logits(m);
    for (size_t i = 0; rc == TK_OK && i < n; i++) /* the encoded ids stay; the canvas's rows are scratch */
        s->seg[i].kv->len += s->seg[i].ne;
    return rc;
}

static const char *const classes[] = {"DiffusionGemmaForBlockDiffusion", NULL};

const tk_models_arch tk_models__diffusion_gemma = {
    .name = "diffusion_gemma",
    .classes = classes,
    .caps = TK_ARCH_CAUSAL_LM | TK_ARCH_ROPE,
    .prefix = PRE,
    .parse = parse,
    .load = load,
    .plan = plan,
    .forward = forward,
    .free_state = free_state,
};
