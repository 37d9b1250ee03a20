/*
 * smollm3.c — SmolLM3ForCausalLM: the Llama decoder (llama.c) where the layers no_rope_layers marks 0
 * take no rotary embedding (NoPE), as transformers' modeling_smollm3.py computes it (its default: every
 * no_rope_layer_interval-th layer, counting from 1, has none). Sliding windows as Qwen2's.
 */
#include <stdio.h>

#include "models/models.h"

static int parse(tk_models_config *c, const tk_models_reader *r)
{
    static const char *const acts[] = {"silu", "swish", NULL};
    int64_t every;
    int rc;
    if ((rc = tk_models__decoder_parse(c, r, acts, "silu", 1)) ||
        (rc = tk_models__cfg_int(r, "no_rope_layer_interval", 4, 1, &every)))
        return rc;
    json_t *nr = json_object_get(r->root, "no_rope_layers");
    if (nr && !json_is_null(nr) && (!json_is_array(nr) || (int64_t)json_array_size(nr) != c->layers))
        return tk__err(TK_ERR_INVALID, "%s: 'no_rope_layers' must be a list of %lld 0/1 values, one per layer", r->what,
                       (long long)c->layers);
    for (int64_t l = 0; l < c->layers; l++) {
        json_t *v = nr && !json_is_null(nr) ? json_array_get(nr, (size_t)l) : NULL;
        if (v && !json_is_integer(v) && !json_is_boolean(v))
            return tk__err(TK_ERR_INVALID, "%s: 'no_rope_layers'[%lld] must be 0 or 1", r->what, (long long)l);
        int use = v ? (json_is_boolean(v) ? json_is_true(v) : json_integer_value(v) != 0) : (l + 1) % every != 0;
        c->nope[l] = !use;
    }
    return TK_OK;
}

static const char *const classes[] = {"SmolLM3ForCausalLM", NULL};

const tk_models_arch tk_models__smollm3 = TK_MODELS_DECODER_ARCH_CAPS("smollm3", classes, parse, TK_ARCH_TP_LLAMA);
