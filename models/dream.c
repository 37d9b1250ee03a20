/*
 * dream.c — DreamModel (Dream-org/Dream-v0-Base-7B and -Instruct-7B): a masked diffusion LM whose
 * network is Qwen2 (q/k/v with bias, o_proj without) with attention that sees every position, in
 * transformers' Qwen2 names (model.embed_tokens, model.layers.N.self_attn.q_proj, ..., lm_head), as
 * Dream's modeling_dream.py defines it. The config is Qwen2's with mask_token_id. Dream predicts the
 * token at position i from the logits at i - 1 (it was adapted from an autoregressive model); the
 * sampler (diffusion_lm.c) shifts them.
 */
#include "models/models.h"

static int parse(tk_models_config *c, const tk_models_reader *r)
{
    static const char *const acts[] = {"silu", "swish", NULL};
    int rc = tk_models__decoder_parse(c, r, acts, "silu", 1);
    if (rc == TK_OK)
        rc = tk_models__cfg_int(r, "mask_token_id", -1, -1, &c->mask_id);
    c->qkv_bias = 1; /* Qwen2's attention */
    c->o_bias = 0;
    c->bidirectional = 1;
    c->diffusion = 2; /* TK_DIFF_DREAM */
    return rc;
}

static const char *const classes[] = {"DreamModel", NULL};

const tk_models_arch tk_models__dream = TK_MODELS_DECODER_ARCH("dream", classes, parse);
