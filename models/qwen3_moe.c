/*
 * qwen3_moe.c — Qwen3MoeForCausalLM (Qwen3-30B-A3B, Qwen3-235B-A22B): the Qwen3 decoder (llama.c with
 * an RMSNorm over each head of q and k) whose sparse layers run a mixture of experts, as transformers'
 * modeling_qwen3_moe.py computes it: Qwen2-MoE's router and experts (norm_topk_prob, the weights
 * rounded to the compute dtype) without a shared expert; decoder_sparse_step and mlp_only_layers pick
 * the sparse layers. The expert count is num_experts (v4 configs) or num_local_experts (as transformers
 * 5 writes it).
 */
#include "models/models.h"

static int parse(tk_models_config *c, const tk_models_reader *r)
{
    static const char *const acts[] = {"silu", "swish", NULL};
    int rc = tk_models__decoder_parse(c, r, acts, "silu", 1);
    c->qk_norm = TK_QKNORM_HEAD;
    return rc != TK_OK ? rc : tk_models__moe_parse(c, r, 1, 8, 768, -1);
}

static const char *const classes[] = {"Qwen3MoeForCausalLM", NULL};

const tk_models_arch tk_models__qwen3_moe = TK_MODELS_DECODER_ARCH_CAPS("qwen3_moe", classes, parse, TK_ARCH_TP_LLAMA);
