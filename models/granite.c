/*
 * granite.c — GraniteForCausalLM: the Llama decoder (llama.c) with four multipliers, as transformers'
 * modeling_granite.py computes it: embeddings times embedding_multiplier, each block's output times
 * residual_multiplier before the residual add, attention scores scaled by attention_multiplier (not
 * 1/sqrt(head_dim)), logits divided by logits_scaling. The embedding, residual and logit multipliers
 * are folded into the weights at load (embed_tokens, o_proj and down_proj, lm_head).
 */
#include "models/models.h"

static int parse(tk_models_config *c, const tk_models_reader *r)
{
    static const char *const acts[] = {"silu", "swish", NULL};
    double em, rm, am, ls;
    int rc;
    if ((rc = tk_models__decoder_parse(c, r, acts, "silu", 0)) ||
        (rc = tk_models__cfg_num(r->root, r->what, "embedding_multiplier", 1.0, &em)) ||
        (rc = tk_models__cfg_num(r->root, r->what, "residual_multiplier", 1.0, &rm)) ||
        (rc = tk_models__cfg_num(r->root, r->what, "attention_multiplier", 1.0, &am)) ||
        (rc = tk_models__cfg_num(r->root, r->what, "logits_scaling", 1.0, &ls)))
        return rc;
    if (!(am > 0) || ls == 0)
        return tk__err(TK_ERR_INVALID, "%s: attention_multiplier must be > 0 and logits_scaling non-zero (got %g, %g)",
                       r->what, am, ls);
    c->embed_scale = em;
    c->residual_scale = rm;
    c->attn_scale = am;
    c->logit_scale = 1.0 / ls;
    return TK_OK;
}

static const char *const classes[] = {"GraniteForCausalLM", NULL};

const tk_models_arch tk_models__granite = TK_MODELS_DECODER_ARCH_CAPS("granite", classes, parse, TK_ARCH_TP_LLAMA);
