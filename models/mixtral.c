/*
 * mixtral.c — MixtralForCausalLM: the Mistral decoder (llama.c) whose MLP is a sparse mixture of
 * experts on every layer, as transformers' modeling_mixtral.py computes it: a router
 * (block_sparse_moe.gate, [num_local_experts, H]), softmax in f32, the num_experts_per_tok most likely
 * experts with their probabilities renormalised to sum 1, each a SwiGLU MLP of intermediate_size
 * (w1 gate, w3 up, w2 down), summed with those weights: the moe op. The sliding_window, when set,
 * applies to every layer as in Mistral. Checkpoints hold the per-expert tensors
 * (block_sparse_moe.experts.N.w1/w2/w3, also what transformers 5's save_pretrained writes) or
 * transformers 5's fused mlp.experts.gate_up_proj / down_proj; both load.
 */
#include "models/models.h"

static int parse(tk_models_config *c, const tk_models_reader *r)
{
    static const char *const acts[] = {"silu", "swish", NULL};
    int rc = tk_models__decoder_parse(c, r, acts, "silu", 0);
    return rc != TK_OK ? rc : tk_models__moe_parse(c, r, 0, 2, 0, -1);
}

static const char *const classes[] = {"MixtralForCausalLM", NULL};

const tk_models_arch tk_models__mixtral = TK_MODELS_DECODER_ARCH_CAPS("mixtral", classes, parse, TK_ARCH_TP_LLAMA);
