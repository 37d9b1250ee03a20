/*
 * llada.c — LLaDAModelLM (GSAI-ML/LLaDA-8B-Base and -Instruct): a masked diffusion LM whose network is
 * the Llama decoder (llama.c) with attention that sees every position (no causal mask), in the layout
 * of LLaDA's own modeling_llada.py (an OLMo descendant), which is not transformers':
 *
 *   config.json: d_model, n_heads, n_kv_heads, n_layers, mlp_hidden_size (or mlp_ratio x d_model),
 *                rms_norm_eps, rope_theta, max_sequence_length, vocab_size / embedding_size,
 *                weight_tying, include_bias / include_qkv_bias, mask_token_id; block_type "llama",
 *                layer_norm_type "rms", activation_type "silu", rope true, alibi false
 *   weights:     model.transformer.wte, .blocks.N.{attn_norm, q_proj, k_proj, v_proj, attn_out, ff_norm,
 *                ff_proj (the gate), up_proj, ff_out (down)}, .ln_f, .ff_out (the LM head, untied)
 *
 * LLaDALlamaBlock computes x += attn_out(attn(rope(q), rope(k), v)) over attn_norm(x), then
 * x += ff_out(silu(ff_proj(h)) * up_proj(h)) over h = ff_norm(x): Llama's layer exactly, so the parser
 * maps the names (cfg.weight_name) and llama.c's forward runs it. Everything the OLMo config can say
 * that this block does not do (ALiBi, q/k layer norms, a sequential block, scaled logits, ...) is
 * refused by name.
 */
#include <stdio.h>
#include <string.h>

#include "models/models.h"

/* The checkpoint's name of a Llama-decoder weight (llama.c asks for HF Llama names). */
static const char *llada_name(char *buf, size_t cap, const char *hf)
{
    static const struct {
        const char *hf, *own;
    } top[] = {{"model.embed_tokens.weight", "model.transformer.wte.weight"},
               {"model.norm.weight", "model.transformer.ln_f.weight"},
               {"lm_head.weight", "model.transformer.ff_out.weight"}},
      layer[] = {{"input_layernorm.", "attn_norm."}, {"post_attention_layernorm.", "ff_norm."},
                 {"self_attn.q_proj.", "q_proj."},   {"self_attn.k_proj.", "k_proj."},
                 {"self_attn.v_proj.", "v_proj."},   {"self_attn.o_proj.", "attn_out."},
                 {"mlp.gate_proj.", "ff_proj."},     {"mlp.up_proj.", "up_proj."},
                 {"mlp.down_proj.", "ff_out."}};
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
        if (!strcmp(hf, top[i].hf))
            return top[i].own;
    long long l;
    int n = 0;
    if (sscanf(hf, "model.layers.%lld.%n", &l, &n) == 1 && n > 0)
        for (size_t i = 0; i < sizeof layer / sizeof layer[0]; i++) {
            size_t k = strlen(layer[i].hf);
            if (!strncmp(hf + n, layer[i].hf, k)) {
                snprintf(buf, cap, "model.transformer.blocks.%lld.%s%s", l, layer[i].own, hf + n + k);
                return buf;
            }
        }
    return hf;
}

/* a string field that must be one value (or absent, when def is that value) */
static int want_str(const tk_models_reader *r, const char *key, const char *def, const char *want)
{
    char v[32];
    int rc = tk_models__cfg_str(r, key, def, v, sizeof v);
    if (rc == TK_OK && strcmp(v, want)) {
        char got[48];
        snprintf(got, sizeof got, "'%s'", v);
        rc = tk_models__cfg_unsupported(r, key, got, want);
    }
    return rc;
}

/* a boolean field that must be `want` */
static int want_bool(const tk_models_reader *r, const char *key, int def, int want)
{
    int v = def;
    int rc = tk_models__cfg_bool(r, key, def, &v);
    if (rc == TK_OK && v != want)
        rc = tk_models__cfg_unsupported(r, key, v ? "true" : "false", want ? "true" : "false (LLaDA's own)");
    return rc;
}

static int parse(tk_models_config *c, const tk_models_reader *r)
{
    int rc, mqa = 0, bias = 0, qkv_bias = 0, tying = 0;
    int64_t ratio = 4, emb = 0;
    if ((rc = tk_models__cfg_int(r, "d_model", INT64_MIN, 1, &c->hidden)) ||
        (rc = tk_models__cfg_int(r, "n_heads", INT64_MIN, 1, &c->heads)) ||
        (rc = tk_models__cfg_bool(r, "multi_query_attention", 0, &mqa)) ||
        (rc = tk_models__cfg_int(r, "n_kv_heads", mqa ? 1 : c->heads, 1, &c->kv_heads)) ||
        (rc = tk_models__cfg_int(r, "n_layers", INT64_MIN, 1, &c->layers)) ||
        (rc = tk_models__cfg_int(r, "mlp_ratio", 4, 1, &ratio)) ||
        (rc = tk_models__cfg_int(r, "mlp_hidden_size", ratio * c->hidden, 1, &c->intermediate)) ||
        (rc = tk_models__cfg_num(r->root, r->what, "rms_norm_eps", 1e-5, &c->eps)) ||
        (rc = tk_models__cfg_bound(r, "max_sequence_length", 1024, 1, &c->max_pos)) ||
        (rc = tk_models__cfg_int(r, "vocab_size", INT64_MIN, 1, &c->vocab)) ||
        (rc = tk_models__cfg_int(r, "embedding_size", c->vocab, 1, &emb)) ||
        (rc = tk_models__cfg_bool(r, "weight_tying", 0, &tying)) ||
        (rc = tk_models__cfg_bool(r, "include_bias", 0, &bias)) ||
        (rc = tk_models__cfg_bool(r, "include_qkv_bias", 0, &qkv_bias)) ||
        (rc = tk_models__cfg_int(r, "mask_token_id", -1, -1, &c->mask_id)))
        return rc;
    if ((rc = want_str(r, "block_type", "sequential", "llama")) ||
        (rc = want_str(r, "layer_norm_type", "default", "rms")) ||
        (rc = want_str(r, "activation_type", "gelu", "silu")) || (rc = want_bool(r, "rope", 0, 1)) ||
        (rc = want_bool(r, "alibi", 0, 0)) || (rc = want_bool(r, "attention_layer_norm", 0, 0)) ||
        (rc = want_bool(r, "scale_logits", 0, 0)) || (rc = want_bool(r, "input_emb_norm", 0, 0)) ||
        (rc = want_bool(r, "layer_norm_with_affine", 1, 1)) || (rc = want_bool(r, "bias_for_layer_norm", 0, 0)))
        return rc;
    if (c->heads % c->kv_heads || c->hidden % c->heads)
        return tk__err(TK_ERR_INVALID, "%s: d_model %lld, n_heads %lld and n_kv_heads %lld do not divide", r->what,
                       (long long)c->hidden, (long long)c->heads, (long long)c->kv_heads);
    if (emb < c->vocab)
        return tk__err(TK_ERR_INVALID, "%s: embedding_size %lld is smaller than vocab_size %lld", r->what,
                       (long long)emb, (long long)c->vocab);
    c->vocab = emb; /* the embedding and the LM head have embedding_size rows (padded vocabularies) */
    c->head_dim = c->hidden / c->heads;
    c->tie_embeddings = tying;
    c->qkv_bias = bias || qkv_bias;
    c->o_bias = c->mlp_bias = bias;
    snprintf(c->act, sizeof c->act, "silu");
    if ((rc = tk_models__cfg_rope(c, r)) != TK_OK)
        return rc;
    c->bidirectional = 1;
    c->diffusion = 1; /* TK_DIFF_LLADA */
    c->weight_name = llada_name;
    return TK_OK;
}

static const char *const classes[] = {"LLaDAModelLM", NULL};

const tk_models_arch tk_models__llada = TK_MODELS_DECODER_ARCH("llada", classes, parse);
