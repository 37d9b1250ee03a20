/*
 * qwen3.c — Qwen3ForCausalLM: the Llama decoder (llama.c) with an RMSNorm over each head of q and k
 * (self_attn.q_norm / k_norm, [head_dim]) before RoPE, as transformers' modeling_qwen3.py computes it.
 * Sliding windows as Qwen2's (use_sliding_window + max_window_layers, or layer_types).
 */
#include "models/models.h"

static int parse(tk_models_config *c, const tk_models_reader *r)
{
    static const char *const acts[] = {"silu", "swish", NULL};
    int rc = tk_models__decoder_parse(c, r, acts, "silu", 1);
    c->qk_norm = TK_QKNORM_HEAD;
    return rc;
}

static const char *const classes[] = {"Qwen3ForCausalLM", NULL};

const tk_models_arch tk_models__qwen3 = TK_MODELS_DECODER_ARCH_CAPS("qwen3", classes, parse, TK_ARCH_TP_LLAMA);
