/*
 * olmo2.c — Olmo2ForCausalLM: the Llama decoder (llama.c) with its norms after the blocks instead of
 * before (x += post_attention_layernorm(attn(x)); x += post_feedforward_layernorm(mlp(x))) and an
 * RMSNorm over the whole q and k projections ([heads * head_dim], [kv_heads * head_dim]) before RoPE,
 * as transformers' modeling_olmo2.py computes it. Split over ranks (tensor parallelism), the q/k norms
 * are split with their projections' heads and their sums of squares all-reduced (llama.c's qk_norm).
 */
#include "models/models.h"

static int parse(tk_models_config *c, const tk_models_reader *r)
{
    static const char *const acts[] = {"silu", "swish", NULL};
    int rc = tk_models__decoder_parse(c, r, acts, "silu", 0);
    c->pre_norms = 0;
    c->post_norms = 1;
    c->qk_norm = TK_QKNORM_PROJ;
    return rc;
}

static const char *const classes[] = {"Olmo2ForCausalLM", NULL};

const tk_models_arch tk_models__olmo2 = TK_MODELS_DECODER_ARCH_CAPS("olmo2", classes, parse, TK_ARCH_TP_LLAMA);
