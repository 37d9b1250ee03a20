/*
 * phi3.c — Phi3ForCausalLM (Phi-3, Phi-3.5, Phi-4-mini): the Llama decoder (llama.c) with fused
 * projections, as transformers' modeling_phi3.py computes it: self_attn.qkv_proj holds q, k and v as
 * consecutive row blocks (split at load), mlp.gate_up_proj holds gate then up (llama.c's own layout);
 * partial_rotary_factor rotates the first dims of each head (Phi-4-mini); the sliding_window, when
 * set, applies to every layer. LongRoPE ("longrope", first named "su": Phi-3-*-128k, Phi-3.5,
 * Phi-4-mini) is config.c's and llama.c's rope_table: short_factor until a forward pass holds a
 * position past original_max_position_embeddings, long_factor after.
 */
#include "models/models.h"

static int parse(tk_models_config *c, const tk_models_reader *r)
{
    static const char *const acts[] = {"silu", "swish", NULL};
    int rc = tk_models__decoder_parse(c, r, acts, "silu", 0);
    c->fused_qkv = 1;
    return rc;
}

static const char *const classes[] = {"Phi3ForCausalLM", NULL};

const tk_models_arch tk_models__phi3 = TK_MODELS_DECODER_ARCH_CAPS("phi3", classes, parse, TK_ARCH_TP_LLAMA);
