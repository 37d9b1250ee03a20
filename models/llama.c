/*
 * llama.c — the Llama family: LlamaForCausalLM, MistralForCausalLM (sliding window) and
 * Qwen2ForCausalLM (q/k/v bias), as transformers' modeling_llama.py computes them.
 *
 *   x = embed_tokens[ids]
 *   per layer: h = rms_norm(x); q, k, v = h Wq, h Wk, h Wv (+ bias); RoPE on q, k at each token's
 *              position; a = attention(q, k, v) (causal, GQA, the sliding window on its layers);
 *              x += a Wo; h = rms_norm(x); x += down(silu(h Wgate) * (h Wup))
 *   hidden = rms_norm(x); logits = hidden lm_head^T (lm_head = embed_tokens when tied)
 *
 * The residual add and the next norm are one fused_add_rms_norm; gate_proj and up_proj are one [2I, H]
 * weight so the MLP's activation is one silu_and_mul. The batch is packed (varlen): attention sees
 * cu_seqlens and never crosses sequences; positions restart at 0 in each. Mistral's window keeps keys
 * j > p - sliding_window (transformers' sliding_window_overlay), the attention op's window_left =
 * sliding_window - 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/models.h"

/* ---- config.json ---- */

int tk_models__decoder_parse(tk_models_config *c, const tk_models_reader *r, const char *const *acts,
                             const char *acts_hint, int qwen_window)
{
    int rc;
    if ((rc = tk_models__cfg_int(r, "vocab_size", INT64_MIN, 1, &c->vocab)) ||
        (rc = tk_models__cfg_int(r, "hidden_size", INT64_MIN, 1, &c->hidden)) ||
        (rc = tk_models__cfg_int(r, "intermediate_size", INT64_MIN, 1, &c->intermediate)) ||
        (rc = tk_models__cfg_int(r, "num_hidden_layers", INT64_MIN, 1, &c->layers)) ||
        (rc = tk_models__cfg_int(r, "num_attention_heads", INT64_MIN, 1, &c->heads)) ||
        (rc = tk_models__cfg_int(r, "num_key_value_heads", c->heads, 1, &c->kv_heads)) ||
        (rc = tk_models__cfg_int(r, "head_dim", c->hidden / c->heads, 1, &c->head_dim)) ||
        (rc = tk_models__cfg_bound(r, "max_position_embeddings", 2048, 1, &c->max_pos)) ||
        (rc = tk_models__cfg_num(r->root, r->what, "rms_norm_eps", 1e-6, &c->eps)) ||
        (rc = tk_models__cfg_bool(r, "tie_word_embeddings", 0, &c->tie_embeddings)) ||
        (rc = tk_models__cfg_str(r, "hidden_act", "silu", c->act, sizeof c->act)))
        return rc;
    if (c->heads % c->kv_heads)
        return tk__err(TK_ERR_INVALID, "%s: num_attention_heads %lld is not a multiple of num_key_value_heads %lld",
                       r->what, (long long)c->heads, (long long)c->kv_heads);
    if (acts && (rc = tk_models__cfg_act(r, "hidden_act", c->act, acts, acts_hint)))
        return rc;
    int bias = 0;
    if ((rc = tk_models__cfg_bool(r, "attention_bias", 0, &bias)) ||
        (rc = tk_models__cfg_bool(r, "mlp_bias", 0, &c->mlp_bias)))
        return rc;
    c->qkv_bias = c->o_bias = bias;
    if (!strcmp(c->model_type, "qwen2")) {
        c->qkv_bias = 1; /* Qwen2Attention: q/k/v with bias, o_proj without */
        c->o_bias = 0;
    }
    if ((rc = tk_models__cfg_rope(c, r)) != TK_OK)
        return rc;
    /* Sliding windows: Mistral's applies to every layer; Qwen2's to the layers layer_types (or, in v4
     * configs, use_sliding_window with max_window_layers) says. */
    if ((rc = tk_models__cfg_bound(r, "sliding_window", 0, 0, &c->sliding_window)) != TK_OK)
        return rc;
    if (c->sliding_window == INT64_MAX) /* a window past any position is none */
        c->sliding_window = 0;
    if (c->layers > TK_MODELS_MAX_LAYERS)
        return tk__err(TK_ERR_UNSUPPORTED, "%s: %lld layers, tk supports at most %d", r->what, (long long)c->layers,
                       TK_MODELS_MAX_LAYERS);
    if (c->sliding_window && qwen_window) {
        int use = 0;
        int64_t mwl = 0;
        if ((rc = tk_models__cfg_bool(r, "use_sliding_window", 0, &use)) ||
            (rc = tk_models__cfg_bound(r, "max_window_layers", c->layers, 0, &mwl)))
            return rc;
        for (int64_t l = 0; l < c->layers; l++)
            c->sliding[l] = use && l >= mwl;
    } else if (c->sliding_window) {
        for (int64_t l = 0; l < c->layers; l++)
            c->sliding[l] = 1;
    }
    return tk_models__cfg_layer_types(c, r);
}

int tk_models__moe_parse(tk_models_config *c, const tk_models_reader *r, int qwen, int64_t topk_def, int64_t inter_def,
                         int64_t shared_def)
{
    int rc;
    int64_t local = 0, step = 1;
    if ((rc = tk_models__cfg_int(r, "num_local_experts", qwen ? 0 : 8, qwen ? 0 : 1, &local)) ||
        (qwen && (rc = tk_models__cfg_int(r, "num_experts", local, 0, &c->experts))) ||
        (rc = tk_models__cfg_int(r, "num_experts_per_tok", topk_def, 1, &c->experts_topk)))
        return rc;
    if (!qwen) { /* Mixtral: every layer sparse, experts of intermediate_size, always renormalised */
        c->experts = local;
        c->moe_intermediate = c->intermediate;
        c->moe_norm_topk = 1;
        c->moe_w123 = 1;
        snprintf(c->moe_prefix, sizeof c->moe_prefix, "block_sparse_moe.");
        memset(c->moe, 1, (size_t)c->layers);
    } else {
        if ((rc = tk_models__cfg_int(r, "moe_intermediate_size", inter_def, 1, &c->moe_intermediate)) ||
            (rc = tk_models__cfg_bool(r, "norm_topk_prob", 0, &c->moe_norm_topk)) ||
            (rc = tk_models__cfg_int(r, "decoder_sparse_step", 1, 1, &step)) ||
            (shared_def >= 0 &&
             (rc = tk_models__cfg_int(r, "shared_expert_intermediate_size", shared_def, 0, &c->shared_intermediate))))
            return rc;
        c->moe_round_weights = 1; /* Qwen's router: router_top_value.to(router_logits.dtype) */
        snprintf(c->moe_prefix, sizeof c->moe_prefix, "mlp.");
        for (int64_t l = 0; l < c->layers; l++)
            c->moe[l] = c->experts > 0 && (l + 1) % step == 0;
        json_t *only = json_object_get(r->root, "mlp_only_layers");
        if (only && !json_is_null(only) && !json_is_array(only))
            return tk__err(TK_ERR_INVALID, "%s: 'mlp_only_layers' is not a list of layer indices", r->what);
        for (size_t i = 0; only && i < json_array_size(only); i++) {
            json_t *v = json_array_get(only, i);
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= c->layers)
                return tk__err(TK_ERR_INVALID, "%s: 'mlp_only_layers' holds %s, want layer indices 0 to %lld", r->what,
                               json_is_integer(v) ? "an index out of range" : "a non-integer",
                               (long long)c->layers - 1);
            c->moe[json_integer_value(v)] = 0;
        }
    }
    if (c->experts > 0 && c->experts_topk > c->experts)
        return tk__err(TK_ERR_INVALID, "%s: num_experts_per_tok %lld is more than the %lld experts", r->what,
                       (long long)c->experts_topk, (long long)c->experts);
    return TK_OK;
}

static int parse(tk_models_config *c, const tk_models_reader *r)
{
    static const char *const acts[] = {"silu", "swish", NULL};
    return tk_models__decoder_parse(c, r, acts, "silu (the gated MLP of Llama, Mistral and Qwen2)",
                                    !strcmp(c->model_type, "qwen2"));
}

typedef struct {
    /* in_norm: before attention (NULL without pre-norms); post_norm: before the MLP (HF's
     * post_attention_layernorm in Llama, pre_feedforward_layernorm in Gemma 2; NULL without pre-norms);
     * attn_out_norm, mlp_out_norm: of the attention's and the MLP's output (with post-norms); q_norm,
     * k_norm: TK_QKNORM_* */
    const tk_mt *in_norm, *q, *k, *v, *qb, *kb, *vb, *o, *ob, *post_norm, *gate_up, *gate_up_b, *down, *down_b;
    const tk_mt *attn_out_norm, *mlp_out_norm, *q_norm, *k_norm;
    /* a sparse layer (cfg.moe[l]): the router [E, H], the experts as [E, 2I, H] and [E, H, I] views,
     * the shared expert's [2Is, H], [H, Is] and its gate [1, H] (NULL when absent) */
    const tk_mt *router, *shared_gu, *shared_down, *shared_gate;
    tk_mt experts_gu, experts_down;
} layer_w;

typedef struct {
    const tk_mt *embed, *norm, *lm_head;
    layer_w *l;
    int64_t rot;          /* rotary dims of a head */
    const char *act_mul;  /* the gated MLP's op: silu_and_mul, gelu_tanh_and_mul, gelu_and_mul */
    /* RoPE's cos/sin rows, grown on demand (not part of the per-shape plan: it depends on positions). */
    tk_mt cs;
    void *cs_mem;
    int64_t cs_rows, cs_seq_len;
    /* the sliding layers' own RoPE (rope_local, Gemma 3), likewise */
    tk_mt cs2;
    void *cs2_mem;
    int64_t cs2_rows, cs2_seq_len;
    tk_mt head_view; /* tensor parallelism, tied: the LM head's rows of the embedding table */
    /* Activations, planned per batch shape. */
    tk_mt x, h1, h2, q, k, v, att, o, gu, act, logits;
    tk_mt qn, kn; /* q and k after their norms (qk_norm) */
    tk_mt ss;     /* [2, T] f32: q's and k's sums of squares per token (OLMo2 split: all-reduced) */
    /* Training: xs[l] is layer l's input (xs[L] the final norm's); each other array holds every layer's
     * saved activation, or one (recomputed) with activation checkpointing; then the gradients. */
    tk_mt *xs, *sh, *sq, *sk, *sv, *satt, *slse, *sxm, *sh2, *sgu, *sact;
    tk_mt hf, xnext, dx, dxn, dxm, dh, dq, dk, dv, datt, dgu, dact, dh2;
} llama;

/* A sparse layer's weights: transformers 5's fused experts (mlp.experts.gate_up_proj [E, 2I, H],
 * mlp.experts.down_proj [E, H, I]) as they are, or the per-expert tensors published checkpoints hold
 * (mlp.experts.N.{gate,up,down}_proj, Mixtral's block_sparse_moe.experts.N.{w1,w3,w2}, which
 * transformers 5's save_pretrained writes too) stacked into that layout; the shared expert
 * (Qwen2-MoE's mlp.shared_expert.*, mlp.shared_expert_gate) when the config has one. */
static int load_moe(tk_model *m, layer_w *w, int64_t l)
{
    const tk_models_config *c = &m->cfg;
    int64_t E = c->experts, H = c->hidden, I = c->moe_intermediate, Is = c->shared_intermediate;
    int64_t li = m->tp ? m->tp->moe_inter : I; /* split: the rank's features of every expert */
    int64_t egu[3] = {E, 2 * I, H}, edn[3] = {E, H, I}, eh[2] = {E, H}, sdw[2] = {H, Is}, g1[2] = {1, H};
    int64_t lgu[3] = {E, 2 * li, H}, ldn[3] = {E, H, li};
    char n[256];
    const char *pre = c->moe_prefix;
    const tk_mt *gu = NULL, *dn = NULL;
    char **names = NULL;
    int rc;
#define LN(fmt, ...) (snprintf(n, sizeof n, "model.layers.%lld." fmt, (long long)l, __VA_ARGS__), n)
    if ((rc = tk_models__weight_opt(&gu, m, LN("%sexperts.gate_up_proj", "mlp."), 3, egu)) != TK_OK)
        return rc;
    if (gu) {
        pre = "mlp.";
        if ((rc = tk_models__weight(&dn, m, LN("%sexperts.down_proj", pre), 3, edn)) != TK_OK)
            return rc;
    } else {
        static const char *const hf[2][3] = {{"gate_proj", "up_proj", "down_proj"}, {"w1", "w3", "w2"}};
        const char *const *nm = hf[c->moe_w123 ? 1 : 0];
        if (!(names = calloc((size_t)(3 * E), sizeof *names)))
            return tk__err(TK_ERR_NOMEM, "out of memory");
        for (int64_t e = 0; e < E && rc == TK_OK; e++)
            for (int k = 0; k < 3 && rc == TK_OK; k++) {
                /* gate_e, up_e alternate (each expert's [2I, H] block), then the downs */
                int64_t at = k < 2 ? 2 * e + k : 2 * E + e;
                if (!(names[at] = tk__fmt("model.layers.%lld.%sexperts.%lld.%s.weight", (long long)l, pre, (long long)e,
                                          nm[k])))
                    rc = tk__err(TK_ERR_NOMEM, "out of memory");
            }
        if (rc == TK_OK)
            rc = tk_models__weight_cat(&gu, m, (const char *const *)names, (int)(2 * E), I, H);
        if (rc == TK_OK)
            rc = tk_models__weight_cat(&dn, m, (const char *const *)(names + 2 * E), (int)E, H, I);
        for (int64_t i = 0; i < 3 * E; i++)
            free(names[i]);
        free(names);
        if (rc != TK_OK)
            return rc;
    }
    tk_models__view(&w->experts_gu, gu, 3, lgu);
    tk_models__view(&w->experts_down, dn, 3, ldn);
    if ((rc = tk_models__weight(&w->router, m, LN("%sgate.weight", pre), 2, eh)) != TK_OK)
        return rc;
    if (Is > 0) {
        char a[256], b[256];
        snprintf(a, sizeof a, "model.layers.%lld.mlp.shared_expert.gate_proj.weight", (long long)l);
        snprintf(b, sizeof b, "model.layers.%lld.mlp.shared_expert.up_proj.weight", (long long)l);
        const char *sgu[2] = {a, b};
        if ((rc = tk_models__weight_cat(&w->shared_gu, m, sgu, 2, Is, H)) ||
            (rc = tk_models__weight(&w->shared_down, m, LN("%sshared_expert.down_proj.weight", "mlp."), 2, sdw)) ||
            (rc = tk_models__weight(&w->shared_gate, m, LN("%sshared_expert_gate.weight", "mlp."), 2, g1)))
            return rc;
    }
#undef LN
    return TK_OK;
}

/* The sizes this process computes: the model's, or under tensor parallelism the rank's heads, kv heads,
 * MLP width and LM head rows (its vocabulary range when the head is split). */
typedef struct {
    int64_t heads, kv_heads, inter, vocab;
} sizes;

static sizes local_sizes(const tk_model *m)
{
    const tk_models_config *c = &m->cfg;
    if (!m->tp)
        return (sizes){c->heads, c->kv_heads, c->intermediate, c->vocab};
    return (sizes){m->tp->heads, m->tp->kv_heads, m->tp->inter, m->tp->head_split ? m->tp->vocab_len : c->vocab};
}

/* Tensor parallelism: tk runs the decoder split as Megatron-LM does (transformers' default plan): q, k,
 * v, gate and up on their output features (the rank's heads and MLP features), o and down on their
 * input features (partial sums, all-reduced), the norms whole but OLMo2's q/k norms, which span the
 * whole projection and are split with its heads (qk_norm_split). */
static int tp_check(tk_model *m)
{
    static const tk_models_tp_want want[] = {
        {"self_attn.q_proj.weight", 0, 1},
        {"self_attn.k_proj.weight", 0, 1},
        {"self_attn.v_proj.weight", 0, 1},
        {"self_attn.q_proj.bias", 0, 1},
        {"self_attn.k_proj.bias", 0, 1},
        {"self_attn.v_proj.bias", 0, 1},
        {"self_attn.o_proj.weight", 1, 1},
        {"self_attn.o_proj.bias", -1, 1},
        {"mlp.gate_proj.weight", 0, 1},
        {"mlp.up_proj.weight", 0, 1},
        {"mlp.gate_proj.bias", 0, 1},
        {"mlp.up_proj.bias", 0, 1},
        {"mlp.down_proj.weight", 1, 1},
        {"mlp.down_proj.bias", -1, 1},
        /* Phi-3's fused q|k|v and gate|up: each block split over the ranks */
        {"self_attn.qkv_proj.weight", 0, 3},
        {"mlp.gate_up_proj.weight", 0, 2},
        /* a mixture of experts: each expert's MLP as the dense one; the router and a shared expert whole */
        {"mlp.experts.gate_up_proj", 1, 2},
        {"mlp.experts.down_proj", 2, 1},
        {"mlp.experts.*.gate_proj.weight", 0, 1},
        {"mlp.experts.*.up_proj.weight", 0, 1},
        {"mlp.experts.*.down_proj.weight", 1, 1},
        {"mlp.experts.*.w1.weight", 0, 1},
        {"block_sparse_moe.experts.*.w1.weight", 0, 1},
        {"block_sparse_moe.experts.*.w3.weight", 0, 1},
        {"block_sparse_moe.experts.*.w2.weight", 1, 1},
        {"mlp.experts.*.w3.weight", 0, 1},
        {"mlp.experts.*.w2.weight", 1, 1}};
    /* OLMo2's q/k norms span the whole projection: split with its rows (per-head norms stay whole) */
    static const tk_models_tp_want proj_norms[] = {{"self_attn.q_norm.weight", 0, 1},
                                                   {"self_attn.k_norm.weight", 0, 1}};
    tk_models_tp_want all[sizeof want / sizeof want[0] + 2];
    size_t n = sizeof want / sizeof want[0];
    memcpy(all, want, sizeof want);
    if (m->cfg.qk_norm == TK_QKNORM_PROJ) {
        memcpy(all + n, proj_norms, sizeof proj_norms);
        n += 2;
    }
    return tk_models__tp_check(m, "model.layers.", all, n, "model.embed_tokens.weight",
                               "q/k/v/gate/up_proj colwise, o/down_proj rowwise; fused qkv_proj and gate_up_proj "
                               "packed_colwise (3 and 2 blocks); experts' gate_up_proj "
                               "packed_colwise, down_proj rowwise; OLMo2's q_norm and k_norm colwise (with their "
                               "projections); routers, shared experts and per-head q/k norms whole");
}

/* The rotary dims and the gated MLP's op, checked against the config. */
static int setup(tk_model *m, llama *s)
{
    const tk_models_config *c = &m->cfg;
    int64_t D = c->head_dim;
    s->rot = (int64_t)((double)D * c->rope.partial_rotary_factor);
    s->rot -= s->rot % 2;
    if (s->rot <= 0 || s->rot > D)
        return tk__err(TK_ERR_INVALID, "%s: partial_rotary_factor %g gives %lld rotary dims of head size %lld", c->arch,
                       c->rope.partial_rotary_factor, (long long)s->rot, (long long)D);
    if (c->rope.type == TK_ROPE_LONGROPE && c->rope.next != s->rot / 2)
        return tk__err(TK_ERR_INVALID,
                       "%s: rope_parameters' short_factor and long_factor have %lld values, want %lld (one per rotary "
                       "pair: head_dim %lld x partial_rotary_factor %g / 2)",
                       c->arch, (long long)c->rope.next, (long long)(s->rot / 2), (long long)D,
                       c->rope.partial_rotary_factor);
    static const struct {
        const char *hf, *op;
    } acts[] = {{"silu", "silu_and_mul"},
                {"swish", "silu_and_mul"},
                {"gelu_pytorch_tanh", "gelu_tanh_and_mul"},
                {"gelu_new", "gelu_tanh_and_mul"},
                {"gelu", "gelu_and_mul"}};
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++)
        if (!strcmp(c->act, acts[i].hf))
            s->act_mul = acts[i].op;
    if (!s->act_mul)
        return tk__err(TK_ERR_UNSUPPORTED,
                       "%s: hidden_act '%s' has no gated MLP op\nHINT: supported: silu, "
                       "gelu_pytorch_tanh, gelu",
                       c->arch, c->act);
    return TK_OK;
}

/* Layer l's weights: norms, attention (fused or not, with biases), the MLP or its experts. */
static int load_layer(tk_model *m, llama *s, int64_t l)
{
    const tk_models_config *c = &m->cfg;
    int64_t H = c->hidden, D = c->head_dim, I = c->intermediate, Q = c->heads * D, KV = c->kv_heads * D;
    int64_t h1[1] = {H}, qw[2] = {Q, H}, kvw[2] = {KV, H}, ow[2] = {H, Q}, dw[2] = {H, I};
    int64_t q1[1] = {Q}, kv1[1] = {KV}, gu2[2] = {2 * I, H};
    int64_t qn1[1] = {c->qk_norm == TK_QKNORM_PROJ ? Q : D}, kn1[1] = {c->qk_norm == TK_QKNORM_PROJ ? KV : D};
    double no = c->norm_offset, rs = c->residual_scale;
    char n[8][128];
    int rc;
    layer_w *w = &s->l[l];
#define NM(i, fmt) (snprintf(n[i], sizeof n[i], "model.layers.%lld." fmt, (long long)l), n[i])
    if (c->pre_norms && ((rc = tk_models__norm_weight(&w->in_norm, m, NM(0, "input_layernorm.weight"), H, no)) ||
                         (rc = tk_models__norm_weight(&w->post_norm, m,
                                                      c->post_norms ? NM(0, "pre_feedforward_layernorm.weight")
                                                                    : NM(0, "post_attention_layernorm.weight"),
                                                      H, no))))
        return rc;
    if (c->post_norms &&
        ((rc = tk_models__norm_weight(&w->attn_out_norm, m, NM(0, "post_attention_layernorm.weight"), H, no)) ||
         (rc = tk_models__norm_weight(&w->mlp_out_norm, m, NM(0, "post_feedforward_layernorm.weight"), H, no))))
        return rc;
    if (c->qk_norm && ((rc = tk_models__norm_weight(&w->q_norm, m, NM(0, "self_attn.q_norm.weight"), qn1[0], no)) ||
                       (rc = tk_models__norm_weight(&w->k_norm, m, NM(0, "self_attn.k_norm.weight"), kn1[0], no))))
        return rc;
    /* Granite's residual_multiplier scales each block's output: folded into o_proj and down_proj */
    if (c->fused_qkv &&
        ((rc = tk_models__weight_rows(&w->q, m, NM(0, "self_attn.qkv_proj.weight"), Q + 2 * KV, H, 0, Q)) ||
         (rc = tk_models__weight_rows(&w->k, m, n[0], Q + 2 * KV, H, Q, KV)) ||
         (rc = tk_models__weight_rows(&w->v, m, n[0], Q + 2 * KV, H, Q + KV, KV)) ||
         (rc = tk_models__weight(&w->gate_up, m, NM(1, "mlp.gate_up_proj.weight"), 2, gu2))))
        return rc;
    if (!c->fused_qkv && ((rc = tk_models__weight(&w->q, m, NM(0, "self_attn.q_proj.weight"), 2, qw)) ||
                          (rc = tk_models__weight(&w->k, m, NM(0, "self_attn.k_proj.weight"), 2, kvw)) ||
                          (rc = tk_models__weight(&w->v, m, NM(0, "self_attn.v_proj.weight"), 2, kvw))))
        return rc;
    if ((rc = tk_models__weight_xf(&w->o, m, NM(0, "self_attn.o_proj.weight"), 2, ow, rs, 0, 0, 1)) != TK_OK)
        return rc;
    if (c->experts > 0 && c->moe[l]) {
        if ((rc = load_moe(m, w, l)) != TK_OK)
            return rc;
    } else if ((rc = tk_models__weight_xf(&w->down, m, NM(0, "mlp.down_proj.weight"), 2, dw, rs, 0, 0, 1)) != TK_OK) {
        return rc;
    }
    const char *gu[2] = {NM(1, "mlp.gate_proj.weight"), NM(2, "mlp.up_proj.weight")};
    if (!c->fused_qkv && !w->router && (rc = tk_models__weight_cat(&w->gate_up, m, gu, 2, I, H)) != TK_OK)
        return rc;
    if (c->qkv_bias && ((rc = tk_models__weight(&w->qb, m, NM(0, "self_attn.q_proj.bias"), 1, q1)) ||
                        (rc = tk_models__weight(&w->kb, m, NM(0, "self_attn.k_proj.bias"), 1, kv1)) ||
                        (rc = tk_models__weight(&w->vb, m, NM(0, "self_attn.v_proj.bias"), 1, kv1))))
        return rc;
    if (c->o_bias && (rc = tk_models__weight_xf(&w->ob, m, NM(0, "self_attn.o_proj.bias"), 1, h1, rs, 0, 0, 1)))
        return rc;
    if (c->mlp_bias) {
        const char *gub[2] = {NM(3, "mlp.gate_proj.bias"), NM(4, "mlp.up_proj.bias")};
        if ((rc = tk_models__weight_cat(&w->gate_up_b, m, gub, 2, I, 0)) ||
            (rc = tk_models__weight_xf(&w->down_b, m, NM(0, "mlp.down_proj.bias"), 1, h1, rs, 0, 0, 1)))
            return rc;
    }
#undef NM
    return TK_OK;
}

/* The LM head with Granite's 1 / logits_scaling folded in; tied: the unscaled embedding table (split:
 * the rank's rows of it, without the vocabulary-parallel table's row of zeros). */
static int load_head(tk_model *m, llama *s)
{
    const tk_models_config *c = &m->cfg;
    int64_t vh[2] = {c->vocab, c->hidden};
    int rc;
    if (c->tie_embeddings && c->embed_scale == 1.0 && c->logit_scale == 1.0 && m->tp && m->tp->head_split) {
        tk_models__rows(&s->head_view, s->embed, m->tp->embed_split ? 0 : m->tp->vocab_off, m->tp->vocab_len);
        s->lm_head = &s->head_view;
    } else if (c->tie_embeddings && c->embed_scale == 1.0 && c->logit_scale == 1.0) {
        s->lm_head = s->embed;
    } else if (c->tie_embeddings && m->tp && m->tp->head_split) {
        if ((rc = tk_models__weight_vocab_rows(&s->lm_head, m, "model.embed_tokens.weight", c->logit_scale)))
            return rc;
    } else if (c->tie_embeddings) {
        if ((rc = tk_models__weight_xf(&s->lm_head, m, "model.embed_tokens.weight", 2, vh, c->logit_scale, 0, 0, 0)))
            return rc;
    } else if ((rc = tk_models__weight_xf(&s->lm_head, m, "lm_head.weight", 2, vh, c->logit_scale, 0, 1, 1)) != TK_OK) {
        return rc;
    } else if (!s->lm_head) {
        return tk__err(TK_ERR_INVALID,
                       "%s checkpoint '%s': tensor 'lm_head.weight' is missing and tie_word_embeddings is false\n"
                       "HINT: the checkpoint does not match its config.json",
                       c->arch, m->dir);
    }
    return TK_OK;
}

static int load(tk_model *m)
{
    const tk_models_config *c = &m->cfg;
    llama *s = calloc(1, sizeof *s);
    if (!s)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    m->state = s;
    s->l = calloc((size_t)c->layers, sizeof *s->l);
    if (!s->l)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    int64_t vh[2] = {c->vocab, c->hidden};
    int rc = setup(m, s);
    if (rc != TK_OK)
        return rc;
    double es = c->embed_scale;
    if (c->embed_scale_rounded) { /* the scale in the compute dtype, then one rounding of the product */
        float f = (float)es;
        uint16_t lo[2];
        tk_models__from_f32(lo, &f, 1, m->dtype);
        tk_models__dtype_to_f32(&f, lo, 1, m->dtype);
        es = f;
    }
    if (m->tp && (rc = tp_check(m)) != TK_OK)
        return rc;
    if ((rc = tk_models__weight_xf(&s->embed, m, "model.embed_tokens.weight", 2, vh, es, 0, 0, 1)) ||
        (rc = tk_models__norm_weight(&s->norm, m, "model.norm.weight", c->hidden, c->norm_offset)))
        return rc;
    tk_models__mark_embedding(s->embed);
    for (int64_t l = 0; l < c->layers; l++)
        if ((rc = load_layer(m, s, l)) != TK_OK)
            return rc;
    return load_head(m, s);
}

static int plan(tk_model *m, tk_models_batch *b)
{
    const tk_models_config *c = &m->cfg;
    llama *s = m->state;
    sizes z = local_sizes(m);
    int64_t T = b->T, H = c->hidden, D = c->head_dim, I = z.inter;
    int64_t th[2] = {T, H}, tq[3] = {T, z.heads, D}, tkv[3] = {T, z.kv_heads, D}, tgu[2] = {T, 2 * I}, ti[2] = {T, I},
            tv[2] = {T, z.vocab};
    int rc;
    if ((rc = tk_models__ws_tensor(m, &s->x, m->dtype, 2, th)) ||
        (rc = tk_models__ws_tensor(m, &s->h1, m->dtype, 2, th)) ||
        (rc = tk_models__ws_tensor(m, &s->h2, m->dtype, 2, th)) ||
        (rc = tk_models__ws_tensor(m, &s->q, m->dtype, 3, tq)) ||
        (rc = tk_models__ws_tensor(m, &s->k, m->dtype, 3, tkv)) ||
        (rc = tk_models__ws_tensor(m, &s->v, m->dtype, 3, tkv)) ||
        (rc = tk_models__ws_tensor(m, &s->att, m->dtype, 3, tq)) ||
        (rc = tk_models__ws_tensor(m, &s->o, m->dtype, 2, th)) ||
        (rc = tk_models__ws_tensor(m, &s->gu, m->dtype, 2, tgu)) ||
        (rc = tk_models__ws_tensor(m, &s->act, m->dtype, 2, ti)) ||
        (rc = tk_models__ws_tensor(m, &s->logits, m->dtype, 2, tv)))
        return rc;
    if (c->qk_norm && ((rc = tk_models__ws_tensor(m, &s->qn, m->dtype, 3, tq)) ||
                       (rc = tk_models__ws_tensor(m, &s->kn, m->dtype, 3, tkv))))
        return rc;
    int64_t t2[2] = {2, T};
    if (m->tp && c->qk_norm == TK_QKNORM_PROJ &&
        (rc = tk_models__ws_tensor(m, &s->ss, (tk_dtype){TK_DL_FLOAT, 32, 1}, 2, t2)) != TK_OK)
        return rc;
    b->logits = &s->logits;
    b->hidden = &s->h1;
    return TK_OK;
}

/* One rope_cos_sin_cache call filling rows [r0, r0 + n) of the table in mem (rot columns), row r0 + p
 * for position p; ext: LongRoPE's factors, at mem's float offset ext_off (else NULL). */
static int rope_fill(tk_model *m, const tk_models_rope *r, int64_t rot, void *mem, int64_t r0, int64_t n,
                     int64_t seq_len, const float *ext, int64_t ext_off)
{
    tk_mt out, ef;
    int64_t shp[2] = {n, rot}, half = rot / 2;
    memset(&out, 0, sizeof out);
    out.t.data = (float *)mem + r0 * rot;
    out.t.device.device_type = m->dev_type;
    out.t.device.device_id = m->dev_id;
    out.t.ndim = 2;
    out.t.dtype = (tk_dtype){TK_DL_FLOAT, 32, 1};
    memcpy(out.shape, shp, sizeof shp);
    out.t.shape = out.shape;
    if (ext) {
        float *dst = (float *)mem + ext_off;
        size_t fb = (size_t)half * sizeof(float);
        int rc = TK_OK;
        if (m->dev_type != TK_DEV_CUDA)
            memcpy(dst, ext, fb);
        else if ((rc = tk_device_sync(m->dev_id)) == TK_OK) /* a previous fill may still read them */
            rc = tk_device_copy(dst, ext, fb, TK_COPY_H2D, m->dev_id);
        if (rc != TK_OK)
            return rc;
        ef = out;
        ef.t.data = dst;
        ef.t.ndim = 1;
        ef.shape[0] = half;
        ef.t.shape = ef.shape;
    }
    tk_arg a[] = {TK_A_T("out", &out),
                  TK_A_F("base", r->theta),
                  TK_A_I("scaling", r->type),
                  TK_A_F("factor", r->factor),
                  TK_A_I("original_max_position_embeddings", r->original_max_pos),
                  TK_A_I("seq_len", seq_len),
                  TK_A_F("beta_fast", r->beta_fast),
                  TK_A_F("beta_slow", r->beta_slow),
                  TK_A_I("truncate", r->truncate),
                  TK_A_F("attention_factor", r->attention_factor),
                  TK_A_F("low_freq_factor", r->low_freq_factor),
                  TK_A_F("high_freq_factor", r->high_freq_factor),
                  {TK_ARG_TENSOR, "ext_factors", ext ? &ef.t : NULL, 0, 0}};
    return tk_models__op(m, "rope_cos_sin_cache", a, TK_NARGS(a) - (ext ? 0 : 1)); /* ext_factors is last */
}

/* The cos/sin table the rotary op reads, rows for positions [0, max_len): grown by doubling; dynamic
 * NTK's is recomputed when the longest sequence changes what HF's dynamic_rope_update would use.
 * LongRoPE's holds original_max_pos rows of short_factor, then the rows of long_factor (grown as the
 * others): a sequence longer than original_max_pos reads the long rows (tk_models_batch.rope_pos), as
 * transformers' longrope_frequency_update does for that sequence alone; the keys already cached keep
 * the rotation they were made with, as in transformers. Its factors live after the rows. */
static int rope_table(tk_model *m, const tk_models_rope *r, int64_t rot, tk_mt *cs, void **mem, int64_t *nrows,
                      int64_t *seq, int64_t max_len)
{
    int dynamic = r->type == TK_ROPE_DYNAMIC, longrope = r->type == TK_ROPE_LONGROPE;
    int64_t seq_len = dynamic ? (max_len > r->original_max_pos ? max_len : r->original_max_pos) : 0;
    int64_t omax = longrope ? r->original_max_pos : 0;
    int64_t want = longrope ? omax + (max_len > omax ? max_len : 0) : max_len; /* rows the batch reads */
    if (*nrows >= want && (!dynamic || *seq == seq_len))
        return TK_OK;
    int64_t rows = 0;
    if (longrope) { /* the short rows, then long rows by doubling */
        int64_t nl = *nrows > omax ? *nrows - omax : 0;
        if (max_len > omax) {
            nl = nl ? nl : 256;
            while (nl < max_len)
                nl *= 2;
        }
        rows = omax + nl;
    } else {
        rows = *nrows >= max_len ? *nrows : 256;
        while (rows < max_len)
            rows *= 2;
    }
    if (rows != *nrows) {
        if (m->dev_type == TK_DEV_CUDA)
            tk_device_free(*mem, m->dev_id);
        else
            free(*mem);
        *mem = NULL;
        *nrows = 0;
        size_t bytes = (size_t)(rows * rot + rot / 2) * sizeof(float);
        int rc = m->dev_type == TK_DEV_CUDA ? tk_device_alloc(mem, m->dev_id, bytes)
                                            : ((*mem = malloc(bytes)) ? TK_OK : tk__err(TK_ERR_NOMEM, "out of memory"));
        if (rc != TK_OK)
            return rc;
        *nrows = rows;
    }
    memset(cs, 0, sizeof *cs);
    cs->t.data = *mem;
    cs->t.device.device_type = m->dev_type;
    cs->t.device.device_id = m->dev_id;
    cs->t.ndim = 2;
    cs->t.dtype = (tk_dtype){TK_DL_FLOAT, 32, 1};
    cs->shape[0] = rows;
    cs->shape[1] = rot;
    cs->t.shape = cs->shape;
    int rc;
    if (!longrope)
        rc = rope_fill(m, r, rot, *mem, 0, rows, seq_len, NULL, 0);
    else if ((rc = rope_fill(m, r, rot, *mem, 0, omax, 0, r->ext_short, rows * rot)) == TK_OK && rows > omax)
        rc = rope_fill(m, r, rot, *mem, omax, rows - omax, 0, r->ext_long, rows * rot);
    *seq = seq_len;
    return rc;
}

static int rope_cache(tk_model *m, llama *s, int64_t max_len)
{
    int rc = rope_table(m, &m->cfg.rope, s->rot, &s->cs, &s->cs_mem, &s->cs_rows, &s->cs_seq_len, max_len);
    if (rc == TK_OK && m->cfg.rope_local_on)
        rc = rope_table(m, &m->cfg.rope_local, s->rot, &s->cs2, &s->cs2_mem, &s->cs2_rows, &s->cs2_seq_len, max_len);
    return rc;
}

static int linear(tk_model *m, const tk_mt *out, const tk_mt *x, const tk_mt *w, const tk_mt *bias)
{
    return tk_models__linear(m, out, x, w, bias, 0);
}

/* OLMo2's q/k norms split (tensor parallelism): each spans the whole projection, of which the rank holds
 * its heads' columns (and their part of the norm's weight), so the ranks' sums of squares of each token
 * are added (one all-reduce for q's and k's) and each rank scales its columns by the whole row's
 * rsqrt(sum / width + eps), as one process's rms_norm does. */
static int qk_norm_split(tk_model *m, llama *s, const layer_w *w, const tk_mt *qi, const tk_mt *qo, const tk_mt *ki,
                         const tk_mt *ko)
{
    const tk_models_config *c = &m->cfg;
    int64_t t1[1] = {s->ss.shape[1]};
    tk_mt r, ssq, ssk;
    tk_models__rows(&r, &s->ss, 0, 1);
    tk_models__view(&ssq, &r, 1, t1);
    tk_models__rows(&r, &s->ss, 1, 1);
    tk_models__view(&ssk, &r, 1, t1);
    tk_arg a[] = {TK_A_T("out", &ssq), TK_A_T("input", qi)};
    tk_arg b[] = {TK_A_T("out", &ssk), TK_A_T("input", ki)};
    tk_arg an[] = {TK_A_T("out", qo),
                   TK_A_T("input", qi),
                   TK_A_T("weight", w->q_norm),
                   TK_A_T("sumsq", &ssq),
                   TK_A_I("width", c->heads * c->head_dim),
                   TK_A_F("eps", c->eps)};
    tk_arg bn[] = {TK_A_T("out", ko),
                   TK_A_T("input", ki),
                   TK_A_T("weight", w->k_norm),
                   TK_A_T("sumsq", &ssk),
                   TK_A_I("width", c->kv_heads * c->head_dim),
                   TK_A_F("eps", c->eps)};
    int rc;
    if ((rc = tk_models__op(m, "rms_norm_sumsq", a, TK_NARGS(a))) ||
        (rc = tk_models__op(m, "rms_norm_sumsq", b, TK_NARGS(b))) || (rc = tk_models__tp_reduce(m, &s->ss)) ||
        (rc = tk_models__op(m, "rms_norm_by_sumsq", an, TK_NARGS(an))))
        return rc;
    return tk_models__op(m, "rms_norm_by_sumsq", bn, TK_NARGS(bn));
}

/* q and k of layer l normed (qk_norm: per head, or over the whole projection) into s->qn, s->kn; *q, *k
 * point at what rotary and attention use next. */
static int qk_norm(tk_model *m, llama *s, const layer_w *w, int64_t T, tk_mt **q, tk_mt **k)
{
    const tk_models_config *c = &m->cfg;
    sizes z = local_sizes(m);
    int64_t D = c->head_dim;
    int head = c->qk_norm == TK_QKNORM_HEAD;
    int64_t sq[2] = {head ? T * z.heads : T, head ? D : z.heads * D};
    int64_t sk[2] = {head ? T * z.kv_heads : T, head ? D : z.kv_heads * D};
    tk_mt qi, qo, ki, ko;
    tk_models__view(&qi, &s->q, 2, sq);
    tk_models__view(&qo, &s->qn, 2, sq);
    tk_models__view(&ki, &s->k, 2, sk);
    tk_models__view(&ko, &s->kn, 2, sk);
    tk_arg a[] = {TK_A_T("out", &qo), TK_A_T("input", &qi), TK_A_T("weight", w->q_norm), TK_A_F("eps", c->eps)};
    tk_arg b[] = {TK_A_T("out", &ko), TK_A_T("input", &ki), TK_A_T("weight", w->k_norm), TK_A_F("eps", c->eps)};
    int rc;
    if (m->tp && !head)
        rc = qk_norm_split(m, s, w, &qi, &qo, &ki, &ko);
    else if ((rc = tk_models__op(m, "rms_norm", a, TK_NARGS(a))) == TK_OK)
        rc = tk_models__op(m, "rms_norm", b, TK_NARGS(b));
    if (rc != TK_OK)
        return rc;
    *q = &s->qn;
    *k = &s->kn;
    return TK_OK;
}

/* out = o_proj(attention(rope(q, k), v)) of layer l over its normed input h. */
static int attn_block(tk_model *m, tk_models_batch *b, llama *s, int64_t l, const tk_mt *h, const tk_mt *out)
{
    const tk_models_config *c = &m->cfg;
    const layer_w *w = &s->l[l];
    sizes z = local_sizes(m);
    int64_t T = b->T, D = c->head_dim;
    int64_t sq[4] = {1, T, z.heads, D}, skv[4] = {1, T, z.kv_heads, D}, s2[2] = {T, z.heads * D},
            kv2[2] = {T, z.kv_heads * D};
    tk_mt q2, k2, v2, a2, q4, k4, v4, a4;
    tk_models__view(&q2, &s->q, 2, s2);
    tk_models__view(&k2, &s->k, 2, kv2);
    tk_models__view(&v2, &s->v, 2, kv2);
    tk_models__view(&a2, &s->att, 2, s2);
    tk_models__view(&v4, &s->v, 4, skv);
    tk_models__view(&a4, &s->att, 4, sq);
    int rc;
    if ((rc = linear(m, &q2, h, w->q, w->qb)) || (rc = linear(m, &k2, h, w->k, w->kb)) ||
        (rc = linear(m, &v2, h, w->v, w->vb)))
        return rc;
    tk_mt *q = &s->q, *k = &s->k;
    if (c->qk_norm && (rc = qk_norm(m, s, w, T, &q, &k)) != TK_OK)
        return rc;
    if (!c->nope[l]) {
        int local = c->rope_local_on && c->sliding[l];
        const tk_mt *cs = local ? &s->cs2 : &s->cs;
        tk_arg rot[] = {TK_A_T("query", q), TK_A_T("key", k), TK_A_T("positions", local ? &b->pos : &b->rope_pos),
                        TK_A_T("cos_sin_cache", cs), TK_A_I("is_neox", 1)};
        if ((rc = tk_models__op(m, "rotary_embedding", rot, TK_NARGS(rot))) != TK_OK)
            return rc;
    }
    tk_models__view(&q4, q, 4, sq);
    tk_models__view(&k4, k, 4, skv);
    if ((rc = tk_models__attend(m, b, l, &a4, &q4, &k4, &v4, c->attn_scale,
                                c->sliding[l] ? c->sliding_window - 1 : -1)) != TK_OK)
        return rc;
    /* split: the rank's heads' part of o_proj (its bias on rank 0 alone), summed over the ranks */
    if ((rc = linear(m, out, &a2, w->o, m->tp && m->tp->rank ? NULL : w->ob)) != TK_OK)
        return rc;
    return tk_models__tp_reduce(m, out);
}

/* A rank that torch.chunk left no MLP (or expert) features adds nothing to the ranks' sum. */
static int zero_part(tk_model *m, const tk_mt *out)
{
    memset(out->t.data, 0, (size_t)(out->shape[0] * out->shape[1]) * (out->t.dtype.bits / 8u));
    return tk_models__tp_reduce(m, out);
}

/* out = down(act(h Wgate) * (h Wup)), or on a sparse layer the moe op (router, experts, shared expert) */
static int mlp_block(tk_model *m, llama *s, const layer_w *w, const tk_mt *h, const tk_mt *out)
{
    int rc;
    if (w->router) {
        const tk_models_config *c = &m->cfg;
        tk_arg a[13] = {TK_A_T("out", out),
                        TK_A_T("input", h),
                        TK_A_T("router_weight", w->router),
                        TK_A_T("gate_up", &w->experts_gu),
                        TK_A_T("down", &w->experts_down),
                        TK_A_I("top_k", c->experts_topk),
                        TK_A_I("norm_topk_prob", c->moe_norm_topk),
                        TK_A_I("activation", !strcmp(s->act_mul, "gelu_tanh_and_mul") ? 1
                                             : !strcmp(s->act_mul, "gelu_and_mul")    ? 2
                                                                                      : 0),
                        TK_A_I("round_weights", c->moe_round_weights)};
        size_t n = 9;
        if (w->shared_gu && (!m->tp || !m->tp->rank)) { /* split: whole on every rank, added once */
            a[n++] = (tk_arg)TK_A_T("shared_gate_up", w->shared_gu);
            a[n++] = (tk_arg)TK_A_T("shared_down", w->shared_down);
            a[n++] = (tk_arg)TK_A_T("shared_gate", w->shared_gate);
        }
        /* split: the rank's features of each expert give a part of every expert's down_proj; summed */
        if (m->tp && m->tp->moe_inter == 0)
            return zero_part(m, out);
        return (rc = tk_models__op(m, "moe", a, n)) != TK_OK ? rc : tk_models__tp_reduce(m, out);
    }
    if (m->tp && m->tp->inter == 0)
        return zero_part(m, out);
    if ((rc = linear(m, &s->gu, h, w->gate_up, w->gate_up_b)) != TK_OK)
        return rc;
    tk_arg sm[] = {TK_A_T("out", &s->act), TK_A_T("input", &s->gu)};
    if ((rc = tk_models__op(m, s->act_mul, sm, TK_NARGS(sm))) != TK_OK)
        return rc;
    /* split: the rank's features' part of down_proj (its bias on rank 0 alone), summed over the ranks */
    if ((rc = linear(m, out, &s->act, w->down, m->tp && m->tp->rank ? NULL : w->down_b)) != TK_OK)
        return rc;
    return tk_models__tp_reduce(m, out);
}

static int rms(tk_model *m, const tk_mt *out, const tk_mt *in, const tk_mt *weight)
{
    tk_arg a[] = {TK_A_T("out", out), TK_A_T("input", in), TK_A_T("weight", weight), TK_A_F("eps", m->cfg.eps)};
    return tk_models__op(m, "rms_norm", a, TK_NARGS(a));
}

/* x += rms_norm(y) (post-norms): y is normed into tmp, then added. */
static int add_normed(tk_model *m, const tk_mt *x, const tk_mt *y, const tk_mt *weight, const tk_mt *tmp)
{
    tk_arg ad[] = {TK_A_T("out", x), TK_A_T("a", x), TK_A_T("b", tmp)};
    int rc = rms(m, tmp, y, weight);
    return rc != TK_OK ? rc : tk_models__op(m, "add", ad, TK_NARGS(ad));
}

/* logits = cap * tanh(logits / cap) (Gemma 2), in place: every row, or with generation's logits_last
 * only the rows the LM head computed (each sequence's last). */
static int final_softcap(tk_model *m, tk_models_batch *b, tk_mt *logits)
{
    int64_t nseq = b->logits_last ? b->nseq : 1;
    for (int64_t q = 0; q < nseq; q++) {
        tk_mt rows;
        if (b->logits_last)
            tk_models__rows(&rows, logits, b->logits_last[q + 1] - 1, 1);
        else
            tk_models__rows(&rows, logits, 0, logits->shape[0]);
        tk_arg a[] = {TK_A_T("out", &rows), TK_A_T("input", &rows), TK_A_F("cap", m->cfg.final_softcap)};
        int rc = tk_models__op(m, "softcap", a, TK_NARGS(a));
        if (rc != TK_OK)
            return rc;
    }
    return TK_OK;
}

static int forward(tk_model *m, tk_models_batch *b)
{
    const tk_models_config *c = &m->cfg;
    llama *s = m->state;
    int rc;
    if ((rc = rope_cache(m, s, b->max_len)) != TK_OK)
        return rc;
    /* vocabulary-parallel: the rank's rows (zeros for the other ids), summed over the ranks */
    int vp = m->tp && m->tp->embed_split;
    tk_arg emb[] = {TK_A_T("out", &s->x), TK_A_T("ids", vp ? &b->tp_ids : &b->ids), TK_A_T("weight", s->embed)};
    if ((rc = tk_models__op(m, "embedding", emb, TK_NARGS(emb))) != TK_OK ||
        (vp && (rc = tk_models__tp_reduce(m, &s->x)) != TK_OK))
        return rc;
    tk_mt *h = &s->h1, *other = &s->h2;
    if (c->post_norms) {
        /* OLMo2 (no pre-norms) and Gemma 2/3 (both): x += norm(attn(norm?(x))); x += norm(mlp(norm?(x))) */
        for (int64_t l = 0; l < c->layers; l++) {
            const layer_w *w = &s->l[l];
            const tk_mt *in = &s->x;
            if (w->in_norm && (rc = rms(m, h, &s->x, w->in_norm)) == TK_OK)
                in = h;
            if (rc != TK_OK || (rc = attn_block(m, b, s, l, in, &s->o)) ||
                (rc = add_normed(m, &s->x, &s->o, w->attn_out_norm, other)))
                return rc;
            in = &s->x;
            if (w->post_norm && (rc = rms(m, h, &s->x, w->post_norm)) == TK_OK)
                in = h;
            if (rc != TK_OK || (rc = mlp_block(m, s, w, in, &s->o)) ||
                (rc = add_normed(m, &s->x, &s->o, w->mlp_out_norm, other)))
                return rc;
        }
        if ((rc = rms(m, h, &s->x, s->norm)) != TK_OK)
            return rc;
    } else {
        /* pre-norms: the residual add and the next norm are one fused_add_rms_norm */
        if ((rc = rms(m, h, &s->x, s->l[0].in_norm)) != TK_OK)
            return rc;
        for (int64_t l = 0; l < c->layers; l++) {
            const layer_w *w = &s->l[l];
            if ((rc = attn_block(m, b, s, l, h, &s->o)) != TK_OK)
                return rc;
            /* x += o; o = rms_norm(x) */
            tk_arg an[] = {TK_A_T("input", &s->o), TK_A_T("residual", &s->x), TK_A_T("weight", w->post_norm),
                           TK_A_F("eps", c->eps)};
            if ((rc = tk_models__op(m, "fused_add_rms_norm", an, TK_NARGS(an))) != TK_OK)
                return rc;
            if ((rc = mlp_block(m, s, w, &s->o, other)) != TK_OK)
                return rc;
            /* x += mlp; other = rms_norm(x) with the next layer's input norm, or the final norm */
            const tk_mt *nw = l + 1 < c->layers ? s->l[l + 1].in_norm : s->norm;
            tk_arg mn[] = {TK_A_T("input", other), TK_A_T("residual", &s->x), TK_A_T("weight", nw),
                           TK_A_F("eps", c->eps)};
            if ((rc = tk_models__op(m, "fused_add_rms_norm", mn, TK_NARGS(mn))) != TK_OK)
                return rc;
            tk_mt *t = h;
            h = other;
            other = t;
        }
    }
    b->hidden = h;
    if (b->want_logits && s->logits.shape[1] > 0 && (rc = linear(m, &s->logits, h, s->lm_head, NULL)) != TK_OK)
        return rc; /* a split head with no vocabulary rows on this rank computes nothing */
    if (b->want_logits && c->final_softcap > 0)
        return final_softcap(m, b, &s->logits);
    return TK_OK;
}

/* ---- training: the forward that keeps what the backward needs, and the backward ------------------ */

static int train_plan(tk_model *m, tk_models_batch *b)
{
    const tk_models_config *c = &m->cfg;
    llama *s = m->state;
    int64_t T = b->T, H = c->hidden, D = c->head_dim, I = c->intermediate, L = c->layers;
    int64_t n = m->train_ckpt ? 1 : L; /* saved sets: every layer's, or one to recompute into */
    int64_t th[2] = {T, H}, tq[3] = {T, c->heads, D}, tkv[3] = {T, c->kv_heads, D}, tgu[2] = {T, 2 * I}, ti[2] = {T, I},
            tl[1] = {c->heads * T};
    tk_dtype f32 = {TK_DL_FLOAT, 32, 1};
    int rc;
    if ((rc = tk_models__t_layers(m, &s->xs, L + 1, m->dtype, 2, th)) ||
        (rc = tk_models__t_layers(m, &s->sh, n, m->dtype, 2, th)) ||
        (rc = tk_models__t_layers(m, &s->sq, n, m->dtype, 3, tq)) ||
        (rc = tk_models__t_layers(m, &s->sk, n, m->dtype, 3, tkv)) ||
        (rc = tk_models__t_layers(m, &s->sv, n, m->dtype, 3, tkv)) ||
        (rc = tk_models__t_layers(m, &s->satt, n, m->dtype, 3, tq)) ||
        (rc = tk_models__t_layers(m, &s->slse, n, f32, 1, tl)) ||
        (rc = tk_models__t_layers(m, &s->sxm, n, m->dtype, 2, th)) ||
        (rc = tk_models__t_layers(m, &s->sh2, n, m->dtype, 2, th)) ||
        (rc = tk_models__t_layers(m, &s->sgu, n, m->dtype, 2, tgu)) ||
        (rc = tk_models__t_layers(m, &s->sact, n, m->dtype, 2, ti)))
        return rc;
    if ((rc = tk_models__ws_tensor(m, &s->hf, m->dtype, 2, th)) ||
        (rc = tk_models__ws_tensor(m, &s->xnext, m->dtype, 2, th)) ||
        (rc = tk_models__ws_tensor(m, &s->dx, m->dtype, 2, th)) ||
        (rc = tk_models__ws_tensor(m, &s->dxn, m->dtype, 2, th)) ||
        (rc = tk_models__ws_tensor(m, &s->dxm, m->dtype, 2, th)) ||
        (rc = tk_models__ws_tensor(m, &s->dh, m->dtype, 2, th)) ||
        (rc = tk_models__ws_tensor(m, &s->dq, m->dtype, 3, tq)) ||
        (rc = tk_models__ws_tensor(m, &s->dk, m->dtype, 3, tkv)) ||
        (rc = tk_models__ws_tensor(m, &s->dv, m->dtype, 3, tkv)) ||
        (rc = tk_models__ws_tensor(m, &s->datt, m->dtype, 3, tq)) ||
        (rc = tk_models__ws_tensor(m, &s->dgu, m->dtype, 2, tgu)) ||
        (rc = tk_models__ws_tensor(m, &s->dact, m->dtype, 2, ti)) ||
        (rc = tk_models__ws_tensor(m, &s->dh2, m->dtype, 2, th)))
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

/* Layer l from s->xs[l] into out (s->xs[l + 1], or a scratch when recomputing), saving into set i. */
static int layer_fwd(tk_model *m, tk_models_batch *b, int64_t l, int64_t i, const tk_mt *out)
{
    const tk_models_config *c = &m->cfg;
    llama *s = m->state;
    const layer_w *w = &s->l[l];
    int64_t T = b->T, D = c->head_dim;
    int64_t s2[2] = {T, c->heads * D}, kv2[2] = {T, c->kv_heads * D};
    tk_mt q2, k2, v2, a2;
    tk_models__view(&q2, &s->sq[i], 2, s2);
    tk_models__view(&k2, &s->sk[i], 2, kv2);
    tk_models__view(&v2, &s->sv[i], 2, kv2);
    tk_models__view(&a2, &s->satt[i], 2, s2);
    const tk_mt *x = &s->xs[l], *h = &s->sh[i], *xm = &s->sxm[i], *h2 = &s->sh2[i];
    int rc;
    tk_arg n1[] = {TK_A_T("out", h), TK_A_T("input", x), TK_A_T("weight", w->in_norm), TK_A_F("eps", c->eps)};
    if ((rc = tk_models__op(m, "rms_norm", n1, TK_NARGS(n1))) != TK_OK)
        return rc;
    CHECK_T("input_layernorm output", h);
    if ((rc = linear(m, &q2, h, w->q, w->qb)) || (rc = linear(m, &k2, h, w->k, w->kb)) ||
        (rc = linear(m, &v2, h, w->v, w->vb)))
        return rc;
    CHECK_T("q_proj output", &q2);
    CHECK_T("k_proj output", &k2);
    CHECK_T("v_proj output", &v2);
    tk_arg rot[] = {TK_A_T("query", &s->sq[i]), TK_A_T("key", &s->sk[i]), TK_A_T("positions", &b->rope_pos),
                    TK_A_T("cos_sin_cache", &s->cs), TK_A_I("is_neox", 1)};
    if ((rc = tk_models__op(m, "rotary_embedding", rot, TK_NARGS(rot))) != TK_OK)
        return rc;
    if ((rc = tk_models__t_attention(m, b, &s->satt[i], &s->slse[i], &s->sq[i], &s->sk[i], &s->sv[i], 0.0, 1,
                                     c->sliding[l] ? c->sliding_window - 1 : -1)) != TK_OK)
        return rc;
    CHECK_T("attention output", &s->satt[i]);
    /* xm = x + o_proj(att); h2 = rms_norm(xm) */
    tk_arg ad[] = {TK_A_T("out", xm), TK_A_T("a", xm), TK_A_T("b", x)};
    tk_arg n2[] = {TK_A_T("out", h2), TK_A_T("input", xm), TK_A_T("weight", w->post_norm), TK_A_F("eps", c->eps)};
    if ((rc = linear(m, xm, &a2, w->o, w->ob)) || (rc = tk_models__op(m, "add", ad, TK_NARGS(ad))) ||
        (rc = tk_models__op(m, "rms_norm", n2, TK_NARGS(n2))))
        return rc;
    CHECK_T("residual after attention", xm);
    CHECK_T("post_attention_layernorm output", h2);
    /* out = xm + down(silu(gate) * up) */
    tk_arg sm[] = {TK_A_T("out", &s->sact[i]), TK_A_T("input", &s->sgu[i])};
    tk_arg a3[] = {TK_A_T("out", out), TK_A_T("a", out), TK_A_T("b", xm)};
    if ((rc = linear(m, &s->sgu[i], h2, w->gate_up, w->gate_up_b)) ||
        (rc = tk_models__op(m, "silu_and_mul", sm, TK_NARGS(sm))) ||
        (rc = linear(m, out, &s->sact[i], w->down, w->down_b)) || (rc = tk_models__op(m, "add", a3, TK_NARGS(a3))))
        return rc;
    CHECK_T("gate_proj/up_proj output", &s->sgu[i]);
    CHECK_T("mlp activation", &s->sact[i]);
    CHECK_T("layer output", out);
    return TK_OK;
}

static int train_forward(tk_model *m, tk_models_batch *b)
{
    const tk_models_config *c = &m->cfg;
    llama *s = m->state;
    int64_t l = -1;
    int rc;
    if ((rc = rope_cache(m, s, b->max_len)) != TK_OK)
        return rc;
    tk_arg emb[] = {TK_A_T("out", &s->xs[0]), TK_A_T("ids", &b->ids), TK_A_T("weight", s->embed)};
    if ((rc = tk_models__op(m, "embedding", emb, TK_NARGS(emb))) != TK_OK)
        return rc;
    CHECK_T("embed_tokens output", &s->xs[0]);
    for (l = 0; l < c->layers; l++)
        if ((rc = layer_fwd(m, b, l, m->train_ckpt ? 0 : l, &s->xs[l + 1])) != TK_OK)
            return rc;
    tk_arg fn[] = {TK_A_T("out", &s->hf), TK_A_T("input", &s->xs[c->layers]), TK_A_T("weight", s->norm),
                   TK_A_F("eps", c->eps)};
    if ((rc = tk_models__op(m, "rms_norm", fn, TK_NARGS(fn))) != TK_OK)
        return rc;
    CHECK_T("final norm output", &s->hf);
    b->hidden = &s->hf;
    return TK_OK;
}

static void train_head(tk_model *m, const tk_mt **weight, const tk_mt **bias)
{
    llama *s = m->state;
    *weight = s->lm_head;
    *bias = NULL;
}

static int train_backward(tk_model *m, tk_models_batch *b, const tk_mt *d_hidden)
{
    const tk_models_config *c = &m->cfg;
    llama *s = m->state;
    int64_t T = b->T, D = c->head_dim, L = c->layers;
    int64_t s2[2] = {T, c->heads * D}, kv2[2] = {T, c->kv_heads * D};
    tk_mt dq2, dk2, dv2, dat2;
    tk_models__view(&dq2, &s->dq, 2, s2);
    tk_models__view(&dk2, &s->dk, 2, kv2);
    tk_models__view(&dv2, &s->dv, 2, kv2);
    tk_models__view(&dat2, &s->datt, 2, s2);
    tk_mt *dx = &s->dx, *dxn = &s->dxn;
    int rc;
    /* the final norm: dx = d xs[L] */
    if ((rc = tk_models__t_norm_bwd(m, 1, dx, d_hidden, NULL, &s->xs[L], s->norm, NULL)) != TK_OK)
        return rc;
    for (int64_t l = L - 1; l >= 0; l--) {
        const layer_w *w = &s->l[l];
        int64_t i = m->train_ckpt ? 0 : l;
        if (m->train_ckpt && (rc = layer_fwd(m, b, l, 0, &s->xnext)) != TK_OK) /* recompute the layer */
            return rc;
        tk_mt q2, k2, v2, a2;
        tk_models__view(&q2, &s->sq[i], 2, s2);
        tk_models__view(&k2, &s->sk[i], 2, kv2);
        tk_models__view(&v2, &s->sv[i], 2, kv2);
        tk_models__view(&a2, &s->satt[i], 2, s2);
        /* MLP: out = xm + down(act), act = silu_and_mul(gu), gu = h2 Wgu */
        tk_arg sb[] = {TK_A_T("grad_input", &s->dgu), TK_A_T("grad_out", &s->dact), TK_A_T("input", &s->sgu[i])};
        if ((rc = tk_models__t_linear_bwd(m, &s->dact, 0, dx, &s->sact[i], w->down, w->down_b, 0)) ||
            (rc = tk_models__op(m, "silu_and_mul_backward", sb, TK_NARGS(sb))) ||
            (rc = tk_models__t_linear_bwd(m, &s->dh2, 0, &s->dgu, &s->sh2[i], w->gate_up, w->gate_up_b, 0)) ||
            (rc = tk_models__t_norm_bwd(m, 1, &s->dxm, &s->dh2, dx, &s->sxm[i], w->post_norm, NULL)))
            return rc;
        /* attention: xm = x + o_proj(att) */
        if ((rc = tk_models__t_linear_bwd(m, &dat2, 0, &s->dxm, &a2, w->o, w->ob, 0)) ||
            (rc = tk_models__t_attention_bwd(m, b, &s->dq, &s->dk, &s->dv, &s->datt, &s->sq[i], &s->sk[i], &s->sv[i],
                                             &s->satt[i], &s->slse[i], 0.0, 1,
                                             c->sliding[l] ? c->sliding_window - 1 : -1)))
            return rc;
        tk_arg rb[] = {TK_A_T("grad_query", &s->dq), TK_A_T("grad_key", &s->dk), TK_A_T("positions", &b->rope_pos),
                       TK_A_T("cos_sin_cache", &s->cs), TK_A_I("is_neox", 1)};
        if ((rc = tk_models__op(m, "rotary_embedding_backward", rb, TK_NARGS(rb))) ||
            (rc = tk_models__t_linear_bwd(m, &s->dh, 0, &dq2, &s->sh[i], w->q, w->qb, 0)) ||
            (rc = tk_models__t_linear_bwd(m, &s->dh, 1, &dk2, &s->sh[i], w->k, w->kb, 0)) ||
            (rc = tk_models__t_linear_bwd(m, &s->dh, 1, &dv2, &s->sh[i], w->v, w->vb, 0)) ||
            (rc = tk_models__t_norm_bwd(m, 1, dxn, &s->dh, &s->dxm, &s->xs[l], w->in_norm, NULL)))
            return rc;
        tk_mt *t = dx;
        dx = dxn;
        dxn = t;
    }
    return tk_models__t_emb_bwd(m, dx, &b->ids, s->embed, c->pad_id);
}

static void free_state(tk_model *m)
{
    llama *s = m->state;
    if (!s)
        return;
    if (m->dev_type == TK_DEV_CUDA) {
        tk_device_free(s->cs_mem, m->dev_id);
        tk_device_free(s->cs2_mem, m->dev_id);
    } else {
        free(s->cs_mem);
        free(s->cs2_mem);
    }
    tk_mt *arr[] = {s->xs, s->sh, s->sq, s->sk, s->sv, s->satt, s->slse, s->sxm, s->sh2, s->sgu, s->sact};
    for (size_t i = 0; i < sizeof arr / sizeof arr[0]; i++)
        free(arr[i]);
    free(s->l);
    free(s);
    m->state = NULL;
}

int tk_models__decoder_load(tk_model *m) { return load(m); }
int tk_models__decoder_plan(tk_model *m, tk_models_batch *b) { return plan(m, b); }
int tk_models__decoder_forward(tk_model *m, tk_models_batch *b) { return forward(m, b); }
void tk_models__decoder_free(tk_model *m) { free_state(m); }

static const char *const classes[] = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", NULL};

const tk_models_arch tk_models__llama = {
    .name = "llama",
    .classes = classes,
    .caps = TK_ARCH_CAUSAL_LM | TK_ARCH_ROPE | TK_ARCH_TP_LLAMA,
    .prefix = "model.",
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
