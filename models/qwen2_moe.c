/*
 * qwen2_moe.c — Qwen2MoeForCausalLM (Qwen1.5-MoE, Qwen2-57B-A14B): the Qwen2 decoder (llama.c; q/k/v
 * bias per qkv_bias, sliding windows as Qwen2's) whose sparse layers run a mixture of experts, as
 * transformers' modeling_qwen2_moe.py computes it: router mlp.gate [num_experts, H], softmax in f32,
 * the num_experts_per_tok most likely experts (renormalised only with norm_topk_prob; the weights
 * rounded to the compute dtype, as its router does), each a SwiGLU MLP of moe_intermediate_size, plus
 * a shared expert of shared_expert_intermediate_size scaled by sigmoid(mlp.shared_expert_gate x): the
 * moe op. A layer is sparse when (l + 1) is a multiple of decoder_sparse_step and l is not in
 * mlp_only_layers; the others are dense MLPs of intermediate_size.
 */
#include "models/models.h"

static int parse(tk_models_config *c, const tk_models_reader *r)
{
    static const char *const acts[] = {"silu", "swish", NULL};
    int rc = tk_models__decoder_parse(c, r, acts, "silu", 1);
    int bias = 1;
    if (rc != TK_OK || (rc = tk_models__cfg_bool(r, "qkv_bias", 1, &bias)) != TK_OK)
        return rc;
    c->qkv_bias = bias; /* Qwen2MoeAttention: q/k/v with qkv_bias (default true), o_proj without */
    c->o_bias = 0;
    return tk_models__moe_parse(c, r, 1, 4, 1408, 5632);
}

static const char *const classes[] = {"Qwen2MoeForCausalLM", NULL};

const tk_models_arch tk_models__qwen2_moe = TK_MODELS_DECODER_ARCH_CAPS("qwen2_moe", classes, parse, TK_ARCH_TP_LLAMA);
