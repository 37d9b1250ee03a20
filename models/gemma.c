/*
 * gemma.c — GemmaForCausalLM and Gemma2ForCausalLM: the Llama decoder (llama.c) as transformers'
 * modeling_gemma.py and modeling_gemma2.py compute it:
 *
 *   Gemma:   embeddings times sqrt(hidden_size); RMSNorms scale by (1 + w) (folded into the weights
 *            at load, in f32 whatever the model's dtype: transformers multiplies by 1 + w.float()); the gated MLP with gelu_pytorch_tanh (GeGLU; a legacy "gelu" means the same,
 *            as transformers reads it); tied embeddings by default.
 *   Gemma 2: also a norm before and after both attention and MLP (input_layernorm,
 *            post_attention_layernorm, pre_feedforward_layernorm, post_feedforward_layernorm);
 *            attention scores scaled by query_pre_attn_scalar^-0.5 and softcapped
 *            (attn_logit_softcapping); sliding-window and global layers alternating (layer_types,
 *            by default sliding on even layers); the final logits softcapped (final_logit_softcapping,
 *            the softcap op on the LM head's rows).
 *   Gemma 3 (text, Gemma3ForCausalLM): Gemma 2's layer, with a (1 + w) RMSNorm over each head of q
 *            and k, five sliding layers to a global one by default (sliding_window_pattern 6), and
 *            two RoPEs: the global layers' (rope_parameters.full_attention: rope_theta 1e6, perhaps
 *            linear scaling) and the sliding layers' (rope_parameters.sliding_attention, or v4's
 *            rope_local_base_freq: 10000); no softcaps by default.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "models/models.h"

static const char *const ACTS[] = {"gelu_pytorch_tanh", "gelu", NULL};

/* act_key: Gemma's hidden_act, Gemma 2's hidden_activation */
static int common(tk_models_config *c, const tk_models_reader *r, const char *act_key)
{
    int rc = tk_models__decoder_parse(c, r, NULL, NULL, 0);
    if (rc != TK_OK || (rc = tk_models__cfg_str(r, act_key, "gelu_pytorch_tanh", c->act, sizeof c->act)) != TK_OK ||
        (rc = tk_models__cfg_act(r, act_key, c->act, ACTS, "gelu_pytorch_tanh")) != TK_OK ||
        (rc = tk_models__cfg_bool(r, "tie_word_embeddings", 1, &c->tie_embeddings)) != TK_OK)
        return rc;
    if (!strcmp(c->act, "gelu")) /* GemmaConfig: the legacy value targets the tanh approximation */
        snprintf(c->act, sizeof c->act, "gelu_pytorch_tanh");
    c->norm_offset = 1.0;
    c->embed_scale = sqrt((double)c->hidden);
    /* Gemma: torch.tensor(hidden_size ** 0.5, dtype=hidden_states.dtype); Gemma 3:
     * embed_scale.to(weight.dtype) */
    c->embed_scale_rounded = 1;
    return TK_OK;
}

static int parse_gemma(tk_models_config *c, const tk_models_reader *r) { return common(c, r, "hidden_act"); }

static int gemma23(tk_models_config *c, const tk_models_reader *r, int64_t pattern);

static int parse_gemma2(tk_models_config *c, const tk_models_reader *r)
{
    return gemma23(c, r, 2); /* without layer_types: sliding on the even layers, global on the odd */
}

/* Gemma 2 and 3: the norms, scale and softcaps; the sliding layers every `pattern`-th one global when
 * layer_types is absent. */
static int gemma23(tk_models_config *c, const tk_models_reader *r, int64_t pattern)
{
    double qpas, attn_cap, final_cap;
    int rc;
    if ((rc = common(c, r, "hidden_activation")) ||
        (rc = tk_models__cfg_num(r->root, r->what, "query_pre_attn_scalar", 256, &qpas)) ||
        (rc = tk_models__cfg_num(r->root, r->what, "attn_logit_softcapping", 0, &attn_cap)) ||
        (rc = tk_models__cfg_num(r->root, r->what, "final_logit_softcapping", 0, &final_cap)))
        return rc;
    if (!(qpas > 0) || attn_cap < 0 || final_cap < 0)
        return tk__err(TK_ERR_INVALID, "%s: query_pre_attn_scalar must be > 0 and the softcaps >= 0", r->what);
    c->pre_norms = c->post_norms = 1;
    c->attn_scale = 1.0 / sqrt(qpas);
    c->attn_softcap = attn_cap;
    c->final_softcap = final_cap;
    json_t *lt = json_object_get(r->root, "layer_types");
    if (!json_object_get(r->root, "sliding_window")) { /* Gemma2Config's and Gemma3TextConfig's default */
        c->sliding_window = 4096;
        if ((rc = tk_models__cfg_layer_types(c, r)) != TK_OK)
            return rc;
    }
    if (!lt || json_is_null(lt))
        for (int64_t l = 0; l < c->layers; l++)
            c->sliding[l] = c->sliding_window > 0 && (l + 1) % pattern != 0;
    return TK_OK;
}

static int parse_gemma3(tk_models_config *c, const tk_models_reader *r)
{
    int64_t pattern;
    int bidi;
    int rc;
    if ((rc = tk_models__cfg_int(r, "sliding_window_pattern", 6, 1, &pattern)) || (rc = gemma23(c, r, pattern)) ||
        (rc = tk_models__cfg_bool(r, "use_bidirectional_attention", 0, &bidi)))
        return rc;
    if (bidi)
        return tk_models__cfg_unsupported(r, "use_bidirectional_attention", "true", "false (causal text generation)");
    c->qk_norm = TK_QKNORM_HEAD;
    /* two RoPEs: v5's rope_parameters keyed by layer type, or v4's rope_theta (+ rope_scaling) and
     * rope_local_base_freq */
    json_t *rp = json_object_get(r->root, "rope_parameters");
    json_t *full = json_is_object(rp) ? json_object_get(rp, "full_attention") : NULL;
    json_t *slide = json_is_object(rp) ? json_object_get(rp, "sliding_attention") : NULL;
    tk_models_rope global = c->rope;
    if (full || slide) {
        json_t *root = json_copy(r->root); /* shallow: each layer type's object read as rope_parameters */
        if (!root)
            return tk__err(TK_ERR_NOMEM, "out of memory");
        tk_models_reader sub = {r->what, root};
        json_object_del(root, "rope_theta");
        if (full && (json_object_set(root, "rope_parameters", full) || (rc = tk_models__cfg_rope(c, &sub)) != TK_OK)) {
            json_decref(root);
            return rc != TK_OK ? rc : tk__err(TK_ERR_NOMEM, "out of memory");
        }
        global = c->rope;
        if (slide &&
            (json_object_set(root, "rope_parameters", slide) || (rc = tk_models__cfg_rope(c, &sub)) != TK_OK)) {
            json_decref(root);
            return rc != TK_OK ? rc : tk__err(TK_ERR_NOMEM, "out of memory");
        }
        json_decref(root);
        c->rope_local = c->rope;
        if (!slide) { /* Gemma3TextConfig's default local rope */
            memset(&c->rope_local, 0, sizeof c->rope_local);
            c->rope_local = global;
            c->rope_local.type = TK_ROPE_DEFAULT;
            c->rope_local.factor = 1;
            c->rope_local.theta = 10000;
        }
        c->rope = global;
    } else {
        c->rope_local = c->rope;
        c->rope_local.type = TK_ROPE_DEFAULT;
        c->rope_local.factor = 1;
        if ((rc = tk_models__cfg_num(r->root, r->what, "rope_local_base_freq", 10000, &c->rope_local.theta)))
            return rc;
    }
    if (c->rope_local.type == TK_ROPE_LONGROPE) /* the sliding layers read the table by plain position */
        return tk_models__cfg_unsupported(r, "rope_parameters.sliding_attention.rope_type", "'longrope'",
                                          "default, linear, dynamic, yarn, llama3 for the sliding layers");
    c->rope_local_on = 1;
    return TK_OK;
}

static const char *const classes_gemma[] = {"GemmaForCausalLM", NULL};
static const char *const classes_gemma2[] = {"Gemma2ForCausalLM", NULL};
static const char *const classes_gemma3[] = {"Gemma3ForCausalLM", NULL};

const tk_models_arch tk_models__gemma =
    TK_MODELS_DECODER_ARCH_CAPS("gemma", classes_gemma, parse_gemma, TK_ARCH_TP_LLAMA);

const tk_models_arch tk_models__gemma2 =
    TK_MODELS_DECODER_ARCH_CAPS("gemma2", classes_gemma2, parse_gemma2, TK_ARCH_TP_LLAMA);

const tk_models_arch tk_models__gemma3 =
    TK_MODELS_DECODER_ARCH_CAPS("gemma3", classes_gemma3, parse_gemma3, TK_ARCH_TP_LLAMA);
