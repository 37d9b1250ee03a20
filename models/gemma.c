/*
 * gemma.c — GemmaForCausalLM and Gemma2ForCausalLM: the Llama decoder (llama.c) as transformers'
 * modeling_gemma.py and modeling_gemma2.py compute it:
 *
 *   Gemma:   embeddings times sqrt(hidden_size); RMSNorms scale by (1 + w) (folded into the weights
 *            at load); the gated MLP with gelu_pytorch_tanh (GeGLU; a legacy "gelu" means the same,
 *            as transformers reads it); tied embeddings by default.
 *   Gemma 2: also a norm before and after both attention and MLP (input_layernorm,
 *            post_attention_layernorm, pre_feedforward_layernorm, post_feedforward_layernorm);
 *            attention scores scaled by query_pre_attn_scalar^-0.5 and softcapped
 *            (attn_logit_softcapping); sliding-window and global layers alternating (layer_types,
 *            by default sliding on even layers); the final logits softcapped (final_logit_softcapping).
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
    return TK_OK;
}

static int parse_gemma(tk_models_config *c, const tk_models_reader *r)
{
    return common(c, r, "hidden_act");
}

static int parse_gemma2(tk_models_config *c, const tk_models_reader *r)
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
    /* without layer_types (older configs): sliding on the even layers, global on the odd ones */
    json_t *lt = json_object_get(r->root, "layer_types");
    if (!lt || json_is_null(lt))
        for (int64_t l = 0; l < c->layers; l++)
            c->sliding[l] = c->sliding_window > 0 && l % 2 == 0;
    if (final_cap > 0)
        return tk_models__cfg_unsupported(r, "final_logit_softcapping", "set",
                                          "null (the final logit softcap has no op in tk yet)");
    return TK_OK;
}

static const char *const classes_gemma[] = {"GemmaForCausalLM", NULL};
static const char *const classes_gemma2[] = {"Gemma2ForCausalLM", NULL};

const tk_models_arch tk_models__gemma = TK_MODELS_DECODER_ARCH("gemma", classes_gemma, parse_gemma);

const tk_models_arch tk_models__gemma2 = TK_MODELS_DECODER_ARCH("gemma2", classes_gemma2, parse_gemma2);
