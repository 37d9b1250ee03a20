/*
 * tp_plan.c — the tensor-parallel plan (tp_plan.h): transformers' plan format and name matching,
 * the style of every checkpoint tensor, and rank r's slice of it as byte runs of the file.
 *
 * The rules follow transformers 5.x (distributed/tensor_parallel.py, parallel_utils.py, mixin.py):
 * _get_parameter_plan for matching, each style's shard_param for the placement, torch.chunk for
 * uneven splits and _StridedShard for packed ones. tests/tp_plan_oracle.py checks all of it against
 * transformers' own functions on checkpoints transformers saves.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/models.h"
#include "models/tp_plan.h"

const char *const tk_models__tp_styles[] = {"all_reduce",
                                            "colwise",
                                            "colwise_gather_output",
                                            "colwise_rep",
                                            "embedding_colwise",
                                            "embedding_rowwise",
                                            "ep_dispatch_experts",
                                            "grouped_gemm",
                                            "local_params",
                                            "mla_kv_a_proj",
                                            "moe_identity_expert",
                                            "moe_tp_experts",
                                            "packed_colwise",
                                            "packed_rowwise",
                                            "replicate",
                                            "replicated_with_grad_allreduce",
                                            "rowwise",
                                            "rowwise_rep",
                                            "rowwise_split_input",
                                            "sequence_parallel",
                                            NULL};

static const char *style_static(const char *s)
{
    for (size_t i = 0; tk_models__tp_styles[i]; i++)
        if (!strcmp(tk_models__tp_styles[i], s))
            return tk_models__tp_styles[i];
    return NULL;
}

static int is_packed(const char *style) { return !strncmp(style, "packed_", 7); }

/* ---- the rules ---- */

static void rules_free(tk_tp_plan *p)
{
    for (size_t i = 0; i < p->nrules; i++)
        free(p->rules[i].key);
    free(p->rules);
    p->rules = NULL;
    p->nrules = 0;
}

/* Adds (or replaces, as a dict update does) a rule. */
static int rule_set(tk_tp_plan *p, const char *key, const char *style, int split, int front)
{
    for (size_t i = 0; i < p->nrules; i++)
        if (!strcmp(p->rules[i].key, key)) {
            p->rules[i].style = style;
            p->rules[i].split = split;
            return TK_OK;
        }
    tk_tp_rule *r = realloc(p->rules, (p->nrules + 1) * sizeof *r);
    if (!r)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    p->rules = r;
    char *k = tk__strdup(key);
    if (!k)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    if (front) {
        memmove(r + 1, r, p->nrules * sizeof *r);
        r[0] = (tk_tp_rule){k, style, split, 0};
    } else {
        r[p->nrules] = (tk_tp_rule){k, style, split, 0};
    }
    p->nrules++;
    return TK_OK;
}

int tk_models__tp_rules_parse(tk_tp_plan *p, const char *text, size_t len, const char *what, const char *prefix,
                              int *found)
{
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr), *rules, *v;
    const char *key;
    tk_buf bad = TK_BUF_INIT;
    int rc = TK_OK, nbad = 0;
    *found = 0;
    if (!root)
        return tk__err(TK_ERR_INVALID, "%s:%d:%d: %s", what, jerr.line, jerr.column, jerr.text);
    if (!json_is_object(root)) {
        rc = tk__err(TK_ERR_INVALID, "%s: a tensor-parallel plan is a JSON object of name -> style", what);
        goto done;
    }
    rules = json_object_get(root, "base_model_tp_plan");
    if (rules) {
        if (json_is_null(rules))
            goto done; /* a config.json saying "no plan" */
        if (!json_is_object(rules)) {
            rc = tk__err(TK_ERR_INVALID, "%s: \"base_model_tp_plan\" is not an object", what);
            goto done;
        }
    } else if (json_object_get(root, "model_type") || json_object_get(root, "architectures")) {
        goto done; /* a config.json without a plan */
    } else {
        rules = root;
        prefix = "";
    }
    json_object_foreach(rules, key, v) {
        const char *style = NULL, *sname = NULL;
        int64_t split = 2;
        if (json_is_string(v)) {
            sname = json_string_value(v);
        } else if (json_is_object(v) && json_is_string(json_object_get(v, "style"))) {
            json_t *sp = json_object_get(v, "split");
            const char *k2;
            json_t *v2;
            sname = json_string_value(json_object_get(v, "style"));
            json_object_foreach(v, k2, v2)
                if (strcmp(k2, "style") && strcmp(k2, "split")) {
                    rc = tk__err(TK_ERR_INVALID,
                                 "%s: rule '%s' has an unknown field '%s' (a rule is a style name, or "
                                 "{\"style\", \"split\"})",
                                 what, key, k2);
                    goto done;
                }
            if (sp &&
                (!json_is_integer(sp) || json_integer_value(sp) < 2 || json_integer_value(sp) > TK_TP_MAX_SPLIT)) {
                rc = tk__err(TK_ERR_INVALID, "%s: rule '%s': \"split\" must be an integer from 2 to %d", what, key,
                             TK_TP_MAX_SPLIT);
                goto done;
            }
            if (sp)
                split = json_integer_value(sp);
            if (sp && !is_packed(sname)) {
                rc = tk__err(TK_ERR_INVALID,
                             "%s: rule '%s': \"split\" goes with packed_colwise or packed_rowwise, "
                             "not %s",
                             what, key, sname);
                goto done;
            }
        } else {
            rc = tk__err(TK_ERR_INVALID, "%s: rule '%s' is not a style name (a string)", what, key);
            goto done;
        }
        if (!(style = style_static(sname))) {
            tk__buf_printf(&bad, "%s'%s' (rule '%s')", nbad ? ", " : "", sname, key);
            nbad++;
            continue;
        }
        char full[1024];
        snprintf(full, sizeof full, "%s%s", prefix, key);
        if ((rc = rule_set(p, full, style, (int)split, 0)) != TK_OK)
            goto done;
    }
    if (nbad) {
        tk_buf all = TK_BUF_INIT;
        for (size_t i = 0; tk_models__tp_styles[i]; i++)
            tk__buf_printf(&all, "%s%s", i ? ", " : "", tk_models__tp_styles[i]);
        rc = tk__err(TK_ERR_INVALID, "%s: unsupported tp_plan style%s: %s. Supported styles are %s", what,
                     nbad > 1 ? "s" : "", bad.data ? bad.data : "", all.data ? all.data : "");
        tk__buf_free(&all);
        goto done;
    }
    *found = 1;
done:
    tk__buf_free(&bad);
    json_decref(root);
    return rc;
}

/* The plan transformers' config classes carry (LlamaConfig.base_model_tp_plan, and Mistral's and
 * Qwen2's, which are the same), relative to the base model. */
static const char *const LLAMA_PLAN[][2] = {
    {"layers.*.self_attn.q_proj", "colwise"}, {"layers.*.self_attn.k_proj", "colwise"},
    {"layers.*.self_attn.v_proj", "colwise"}, {"layers.*.self_attn.o_proj", "rowwise"},
    {"layers.*.mlp.gate_proj", "colwise"},    {"layers.*.mlp.up_proj", "colwise"},
    {"layers.*.mlp.down_proj", "rowwise"},
};

/* transformers' MixtralConfig, Qwen2MoeConfig and Qwen3MoeConfig add these to Llama's attention rules
 * (and keep the dense MLP's for a model's dense layers) */
static const char *const MOE_PLAN[][2] = {
    {"layers.*.mlp.experts.gate_up_proj", "packed_colwise"},
    {"layers.*.mlp.experts.down_proj", "rowwise"},
    {"layers.*.mlp.experts", "moe_tp_experts"},
};

/* The plan transformers' config class carries for a Llama-like model type: Llama's, with a mixture of
 * experts' rules for its sparse layers and the dense MLP's only where some layer is dense. */
static int default_rules(tk_tp_plan *p, const tk_models_config *c, const char *prefix)
{
    char key[256];
    int dense = c->experts <= 0, rc = TK_OK;
    for (int64_t l = 0; l < c->layers && !dense; l++)
        dense = !c->moe[l];
    if (c->fused_qkv) { /* Phi-3: transformers' plan gathers q|k|v and gate|up; tk splits their blocks */
        static const char *const fused[][2] = {{"layers.*.self_attn.qkv_proj", "packed_colwise"},
                                               {"layers.*.self_attn.o_proj", "rowwise"},
                                               {"layers.*.mlp.gate_up_proj", "packed_colwise"},
                                               {"layers.*.mlp.down_proj", "rowwise"}};
        for (size_t i = 0; i < sizeof fused / sizeof fused[0] && rc == TK_OK; i++) {
            snprintf(key, sizeof key, "%s%s", prefix, fused[i][0]);
            rc = rule_set(p, key, style_static(fused[i][1]), i == 0 ? 3 : 2, 0);
        }
        return rc;
    }
    for (size_t i = 0; i < sizeof LLAMA_PLAN / sizeof LLAMA_PLAN[0] && rc == TK_OK; i++) {
        if (!dense && strstr(LLAMA_PLAN[i][0], ".mlp."))
            continue;
        snprintf(key, sizeof key, "%s%s", prefix, LLAMA_PLAN[i][0]);
        rc = rule_set(p, key, style_static(LLAMA_PLAN[i][1]), 2, 0);
    }
    for (size_t i = 0; c->experts > 0 && i < sizeof MOE_PLAN / sizeof MOE_PLAN[0] && rc == TK_OK; i++) {
        snprintf(key, sizeof key, "%s%s", prefix, MOE_PLAN[i][0]);
        rc = rule_set(p, key, style_static(MOE_PLAN[i][1]), 2, 0);
    }
    /* OLMo2: q/k norms over the whole projection ([heads * head_dim]) split with q_proj's and k_proj's
     * rows (the norm's sum of squares is then all-reduced); transformers' plan gathers q, k and v */
    for (int i = 0; c->qk_norm == TK_QKNORM_PROJ && i < 2 && rc == TK_OK; i++) {
        snprintf(key, sizeof key, "%slayers.*.self_attn.%s_norm", prefix, i ? "k" : "q");
        rc = rule_set(p, key, style_static("colwise"), 2, 0);
    }
    return rc;
}

/* ---- names ---- */

void tk_models__tp_generic_name(char *out, size_t cap, const char *name)
{
    size_t o = 0;
    const char *s = name;
    if (!cap)
        return;
    while (*s && o + 1 < cap) {
        if (*s == '.' && s[1] >= '0' && s[1] <= '9') {
            const char *e = s + 1;
            while (*e >= '0' && *e <= '9')
                e++;
            if (*e == '.' || *e == '\0') { /* re.sub(r"\.\d+(\.|$)", ".*\1"): the terminator is consumed */
                if (o + 3 >= cap)
                    break;
                out[o++] = '.';
                out[o++] = '*';
                if (*e == '.') {
                    out[o++] = '.';
                    e++;
                }
                s = e;
                continue;
            }
        }
        out[o++] = *s++;
    }
    out[o] = '\0';
}

static tk_tp_rule *rule_find(tk_tp_plan *p, const char *key)
{
    for (size_t i = 0; i < p->nrules; i++)
        if (!strcmp(p->rules[i].key, key))
            return &p->rules[i];
    return NULL;
}

/* ---- assignment ---- */

static int add_warning(tk_tp_plan *p, char *msg)
{
    char **w;
    if (!msg)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    w = realloc(p->warnings, (p->nwarnings + 1) * sizeof *w);
    if (!w) {
        free(msg);
        return tk__err(TK_ERR_NOMEM, "out of memory");
    }
    p->warnings = w;
    w[p->nwarnings++] = msg;
    return TK_OK;
}

/* The placement a style gives a parameter, as the style's shard_param does. */
static void place(tk_tp_param *t, const tk_tp_rule *r, int conv1d)
{
    const char *s = r->style, *leaf = strrchr(t->name, '.');
    int bias = leaf && !strcmp(leaf + 1, "bias"), nd = t->ndim;
    t->dim = -1;
    t->split = 1;
    if (nd == 0)
        return;
    if (!strcmp(s, "colwise") || !strcmp(s, "colwise_gather_output") || !strcmp(s, "colwise_rep"))
        t->dim = nd == 1 ? 0 : conv1d ? nd - 1 : nd - 2;
    else if (!strcmp(s, "rowwise") || !strcmp(s, "rowwise_split_input") || !strcmp(s, "rowwise_rep"))
        t->dim = bias ? -1 : conv1d && nd >= 2 ? nd - 2 : nd - 1;
    else if (!strcmp(s, "embedding_rowwise"))
        t->dim = 0;
    else if (!strcmp(s, "embedding_colwise"))
        t->dim = nd > 1 ? 1 : -1;
    else if (!strcmp(s, "packed_colwise")) {
        t->dim = nd == 1 ? 0 : conv1d ? nd - 1 : nd - 2;
        t->split = nd == 1 ? 1 : r->split;
    } else if (!strcmp(s, "packed_rowwise")) {
        t->dim = nd == 1 ? -1 : conv1d ? nd - 2 : nd - 1;
        t->split = nd == 1 ? 1 : r->split;
    }
}

/* The attention projections whose split needs whole heads on each rank. */
static int is_attention(const char *generic)
{
    static const char *const proj[] = {".q_proj.",          ".k_proj.", ".v_proj.", ".qkv_proj.",
                                       ".query_key_value.", ".c_attn.", NULL};
    for (size_t i = 0; proj[i]; i++)
        if (strstr(generic, proj[i]))
            return 1;
    return 0;
}

/* A fused qkv_proj packed in 3 blocks on a model with fewer kv heads than heads: its rows are q's heads,
 * then k's and v's kv heads (heads * hd, kv_heads * hd, kv_heads * hd), so the blocks are unequal and
 * each is split by heads (transformers' _StridedShard would cut equal thirds, across heads). */
static int qkv_blocks(tk_tp_param *t, const char *generic, int64_t heads, int64_t kv_heads)
{
    int64_t d = t->shape[t->dim], units = heads + 2 * kv_heads;
    if (t->split != 3 || heads <= 0 || kv_heads <= 0 || heads == kv_heads || !strstr(generic, ".qkv_proj."))
        return TK_OK;
    if (d % units)
        return tk__err(TK_ERR_INVALID,
                       "tensor '%s' has %lld along dimension %d, which is not q, k and v of %lld heads and %lld "
                       "kv heads each of the same size",
                       t->name, (long long)d, t->dim, (long long)heads, (long long)kv_heads);
    t->block[0] = heads * (d / units);
    t->block[1] = t->block[2] = kv_heads * (d / units);
    return TK_OK;
}

/* A mixture of experts saved one tensor an expert (experts.<e>.gate_proj / up_proj / down_proj, or
 * Mixtral's w1 / w3 / w2), where transformers' plans name the fused experts.gate_up_proj [E, 2I, H]
 * (packed_colwise) and experts.down_proj [E, H, I] (rowwise) that its loader concatenates them into
 * (Mixtral's block_sparse_moe.experts.<e>.w1 under mlp.experts, its module's name in transformers 5):
 * the fused parameter's rule, and in *style the split it gives each part (each expert's gate and up
 * chunked on their rows, its down on its columns). NULL: not such a part, or no such rule. */
static tk_tp_rule *expert_part_rule(tk_tp_plan *p, const char *generic, const char **style)
{
    static const struct {
        const char *part, *fused, *fused_style, *style;
    } map[] = {{"gate_proj.weight", "gate_up_proj", "packed_colwise", "colwise"},
               {"up_proj.weight", "gate_up_proj", "packed_colwise", "colwise"},
               {"w1.weight", "gate_up_proj", "packed_colwise", "colwise"},
               {"w3.weight", "gate_up_proj", "packed_colwise", "colwise"},
               {"down_proj.weight", "down_proj", "rowwise", "rowwise"},
               {"w2.weight", "down_proj", "rowwise", "rowwise"}};
    const char *at = strstr(generic, ".experts.*.");
    char key[1024];
    if (!at)
        return NULL;
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        if (strcmp(at + strlen(".experts.*."), map[i].part))
            continue;
        snprintf(key, sizeof key, "%.*s.experts.%s", (int)(at - generic), generic, map[i].fused);
        tk_tp_rule *r = rule_find(p, key);
        const char *bs = ".block_sparse_moe";
        size_t bl = strlen(bs), pl = (size_t)(at - generic);
        if (!r && pl >= bl && !strncmp(at - bl, bs, bl)) { /* Mixtral's module, which transformers 5 calls mlp */
            snprintf(key, sizeof key, "%.*s.mlp.experts.%s", (int)(pl - bl), generic, map[i].fused);
            r = rule_find(p, key);
        }
        if (!r || strcmp(r->style, map[i].fused_style))
            return NULL;
        /* the experts module's rule (moe_tp_experts) applies to them too */
        char *dot = strrchr(key, '.');
        *dot = '\0';
        tk_tp_rule *mod = rule_find(p, key);
        if (mod)
            mod->used = 1;
        *style = style_static(map[i].style);
        return r;
    }
    return NULL;
}

int tk_models__tp_assign(tk_tp_plan *p, const char *const *names, const int *ndims,
                         const int64_t (*shapes)[TK_TP_MAX_RANK], size_t n, int64_t heads, int64_t kv_heads, int conv1d)
{
    int attn_split = 0;
    char g[1024], mod[1024];
    p->params = calloc(n ? n : 1, sizeof *p->params);
    if (!p->params)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        tk_tp_param *t = &p->params[p->nparams];
        tk_tp_rule *r;
        char *dot;
        if (ndims[i] < 0 || ndims[i] > TK_TP_MAX_RANK)
            return tk__err(TK_ERR_INVALID, "tensor '%s' has %d dimensions (at most %d)", names[i], ndims[i],
                           TK_TP_MAX_RANK);
        if (!(t->name = tk__strdup(names[i])))
            return tk__err(TK_ERR_NOMEM, "out of memory");
        p->nparams++;
        t->ndim = ndims[i];
        memcpy(t->shape, shapes[i], sizeof t->shape);
        t->style = "replicate";
        t->dim = -1;
        t->split = 1;
        tk_models__tp_generic_name(g, sizeof g, names[i]);
        /* _get_parameter_plan(is_weight=True): the name itself, else its module */
        r = rule_find(p, g);
        if (!r && (dot = strrchr(g, '.'))) {
            snprintf(mod, sizeof mod, "%.*s", (int)(dot - g), g);
            r = rule_find(p, mod);
        }
        const char *part_style = NULL;
        if (!r)
            r = expert_part_rule(p, g, &part_style);
        if (!r)
            continue;
        t->style = part_style ? part_style : r->style;
        t->rule = r->key;
        r->used = 1;
        tk_tp_rule as = {r->key, t->style, 1, 1};
        place(t, part_style ? &as : r, conv1d);
        if (t->dim >= 0) {
            int64_t d = t->shape[t->dim];
            int rc = qkv_blocks(t, g, heads, kv_heads);
            if (rc != TK_OK)
                return rc;
            if (t->split > 1 && !t->block[0] && d % t->split)
                return tk__err(TK_ERR_INVALID,
                               "tensor '%s' (rule '%s': %s) has %lld along dimension %d, which does not "
                               "split into %d packed blocks",
                               t->name, r->key, r->style, (long long)d, t->dim, t->split);
            if (is_attention(g))
                attn_split = 1;
        }
    }
    /* which rules matched something: a tensor's generic name or a module above it */
    for (size_t k = 0; k < p->nrules; k++) {
        tk_tp_rule *r = &p->rules[k];
        size_t kl = strlen(r->key);
        for (size_t i = 0; i < p->nparams && !r->used; i++) {
            tk_models__tp_generic_name(g, sizeof g, p->params[i].name);
            if (!strncmp(g, r->key, kl) && (g[kl] == '\0' || g[kl] == '.'))
                r->used = 1;
        }
        if (!r->used) {
            int rc = add_warning(p, tk__fmt("tp_plan rule '%s' (%s) matches nothing in the checkpoint and will not be "
                                            "applied",
                                            r->key, r->style));
            if (rc != TK_OK)
                return rc;
        }
    }
    if (attn_split && p->world > 1 && ((heads > 0 && heads % p->world) || (kv_heads > 0 && kv_heads % p->world))) {
        int64_t h = heads > 0 ? heads : kv_heads, kv = kv_heads > 0 ? kv_heads : h;
        char ok[128] = "";
        size_t o = 0;
        for (int64_t d = 1; d <= h && d <= kv && o < sizeof ok; d++)
            if (h % d == 0 && kv % d == 0)
                o += (size_t)snprintf(ok + o, sizeof ok - o, "%s%lld", o ? ", " : "", (long long)d);
        if (heads > 0 && heads % p->world)
            return tk__err(TK_ERR_INVALID,
                           "num_attention_heads %lld is not divisible by the tensor-parallel size %d: "
                           "each rank must hold whole heads\nHINT: sizes that fit this model: %s",
                           (long long)heads, p->world, ok);
        return tk__err(TK_ERR_INVALID,
                       "num_key_value_heads %lld is not divisible by the tensor-parallel size %d: "
                       "each rank must hold whole key/value heads\nHINT: sizes that fit this model: %s",
                       (long long)kv_heads, p->world, ok);
    }
    return TK_OK;
}

void tk_models__tp_plan_free(tk_tp_plan *p)
{
    if (!p)
        return;
    rules_free(p);
    for (size_t i = 0; i < p->nparams; i++)
        free(p->params[i].name);
    free(p->params);
    for (size_t i = 0; i < p->nwarnings; i++)
        free(p->warnings[i]);
    free(p->warnings);
    free(p);
}

int tk_models__tp_plan_load(tk_tp_plan **out, const char *dir, const char *plan_file, int world)
{
    tk_tp_plan *p = NULL;
    tk_models_config cfg;
    tk_st_set *st = NULL;
    char *text = NULL, *cpath = NULL;
    size_t len = 0, n;
    const char **names = NULL;
    int *ndims = NULL, found = 0, rc, cfg_ok = 0;
    int64_t(*shapes)[TK_TP_MAX_RANK] = NULL;
    const char *prefix;
    *out = NULL;
    memset(&cfg, 0, sizeof cfg);
    if (world < 1)
        return tk__err(TK_ERR_INVALID, "the tensor-parallel size must be at least 1 (got %d)", world);
    if ((rc = tk_models__config_load(&cfg, dir)) != TK_OK)
        return rc;
    cfg_ok = 1;
    if (!(p = calloc(1, sizeof *p))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto fail;
    }
    p->world = world;
    int llama = !!(cfg.def->caps & TK_ARCH_TP_LLAMA), gpt2 = !!(cfg.def->caps & TK_ARCH_TP_CONV1D);
    prefix = cfg.def->prefix;
    if (plan_file) {
        if ((rc = tk__read_file(&text, &len, plan_file, 16u << 20)) != TK_OK) {
            tk__err_wrap(rc, "the tensor-parallel plan '%s'", plan_file);
            goto fail;
        }
        if ((rc = tk_models__tp_rules_parse(p, text, len, plan_file, prefix, &found)) != TK_OK)
            goto fail;
        if (!found) {
            rc = tk__err(TK_ERR_INVALID,
                         "'%s' holds no tensor-parallel plan (an object of name -> style, or "
                         "\"base_model_tp_plan\")",
                         plan_file);
            goto fail;
        }
        snprintf(p->source, sizeof p->source, "%s", plan_file);
    } else {
        if (!(cpath = tk__path_join(dir, "config.json"))) {
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
            goto fail;
        }
        if ((rc = tk__read_file(&text, &len, cpath, 64u << 20)) != TK_OK ||
            (rc = tk_models__tp_rules_parse(p, text, len, cpath, prefix, &found)) != TK_OK)
            goto fail;
        if (found) {
            snprintf(p->source, sizeof p->source, "%s (base_model_tp_plan)", cpath);
        } else if (llama) {
            if ((rc = default_rules(p, &cfg, prefix)) != TK_OK)
                goto fail;
            snprintf(p->source, sizeof p->source,
                     cfg.fused_qkv ? "tk's plan for %s (its fused blocks split by heads: transformers gathers them)"
                     : cfg.qk_norm == TK_QKNORM_PROJ
                         ? "tk's plan for %s (q, k and their norms split by heads: transformers gathers q, k and v)"
                         : "transformers' default plan for %s",
                     cfg.model_type);
            found = 1;
        } else {
            rc = tk__err(TK_ERR_UNSUPPORTED,
                         "%s (%s) has no tensor-parallel plan: its config.json has no "
                         "\"base_model_tp_plan\" and transformers' config for it carries none\nHINT: write one and "
                         "pass it with --tp-plan FILE (docs/parallel.md: the format and the styles)",
                         cfg.arch, cfg.model_type);
            goto fail;
        }
        /* transformers completes a base model's plan: the input embedding split on the vocabulary
         * (when the plan is not empty), and the causal LM's head (LlamaForCausalLM._tp_plan). */
        if (llama && p->nrules) {
            char key[64];
            snprintf(key, sizeof key, "%sembed_tokens", prefix);
            if (!rule_find(p, key) && (rc = rule_set(p, key, style_static("embedding_rowwise"), 2, 1)) != TK_OK)
                goto fail;
            if (!rule_find(p, "lm_head") &&
                (rc = rule_set(p, "lm_head", style_static("colwise_gather_output"), 2, 1)) != TK_OK)
                goto fail;
        }
    }

    if ((rc = tk_models__st_open_dir(&st, dir)) != TK_OK)
        goto fail;
    n = tk_models__st_count(st);
    names = calloc(n ? n : 1, sizeof *names);
    ndims = calloc(n ? n : 1, sizeof *ndims);
    shapes = calloc(n ? n : 1, sizeof *shapes);
    if (!names || !ndims || !shapes) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < n; i++) {
        const tk_st_tensor *t = tk_models__st_at(st, i);
        names[i] = t->name;
        ndims[i] = t->ndim;
        for (int d = 0; d < t->ndim && d < TK_TP_MAX_RANK; d++)
            shapes[i][d] = t->shape[d];
    }
    if (cfg.tie_embeddings) { /* the LM head is the embedding: the rule has a module, not a tensor */
        tk_tp_rule *lm = rule_find(p, "lm_head");
        if (lm)
            lm->used = 1;
    }
    if ((rc = tk_models__tp_assign(p, names, ndims, (const int64_t(*)[TK_TP_MAX_RANK])shapes, n, cfg.heads,
                                   llama ? cfg.kv_heads : 0, gpt2)) != TK_OK)
        goto fail;
    *out = p;
    p = NULL;
fail:
    free(names);
    free(ndims);
    free(shapes);
    tk_models__st_close(st);
    free(text);
    free(cpath);
    if (cfg_ok)
        tk_models__config_free(&cfg);
    tk_models__tp_plan_free(p);
    return rc;
}

/* ---- slices ---- */

void tk_models__tp_chunk(int64_t n, int world, int r, int64_t *off, int64_t *len)
{
    int64_t c = (n + world - 1) / world, o = c * r;
    if (o >= n) {
        *off = n;
        *len = 0;
        return;
    }
    *off = o;
    *len = o + c <= n ? c : n - o;
}

int tk_models__tp_blocks(const tk_tp_param *p, int64_t *start, int64_t *len)
{
    if (p->dim < 0)
        return 0;
    int64_t n = p->shape[p->dim], at = 0;
    int nb = p->split > 1 ? p->split : 1;
    if (nb > TK_TP_MAX_SPLIT)
        nb = TK_TP_MAX_SPLIT;
    int64_t gw = (n + nb - 1) / nb; /* _StridedShard: ceil(n/split)-wide groups */
    for (int b = 0; b < nb; b++) {
        int64_t w = p->block[0] ? p->block[b] : gw;
        start[b] = at < n ? at : n;
        len[b] = at + w <= n ? w : at < n ? n - at : 0;
        at += w;
    }
    return nb;
}

int tk_models__tp_slice(tk_tp_slice *s, const tk_tp_param *p, int rank, int world, size_t elsize)
{
    int64_t numel = 1;
    memset(s, 0, sizeof *s);
    if (world < 1 || rank < 0 || rank >= world)
        return tk__err(TK_ERR_INVALID, "rank %d of %d", rank, world);
    memcpy(s->shape, p->shape, sizeof s->shape);
    if (p->dim >= 0 && world > 1) {
        int64_t bs[TK_TP_MAX_SPLIT], bl[TK_TP_MAX_SPLIT], total = 0;
        int nb = tk_models__tp_blocks(p, bs, bl);
        for (int b = 0; b < nb; b++) { /* each block chunked over the ranks (_StridedShard when packed) */
            int64_t off, len;
            tk_models__tp_chunk(bl[b], world, rank, &off, &len);
            if (len > 0) {
                s->start[s->nranges] = bs[b] + off;
                s->len[s->nranges++] = len;
                total += len;
            }
        }
        s->shape[p->dim] = total;
    } else if (p->ndim > 0) { /* whole: one range over the (split or first) dimension */
        s->nranges = 1;
        s->start[0] = 0;
        s->len[0] = p->shape[p->dim >= 0 ? p->dim : 0];
    }
    for (int d = 0; d < p->ndim; d++)
        numel *= s->shape[d];
    s->bytes = numel * (int64_t)elsize;
    return TK_OK;
}

size_t tk_models__tp_runs(tk_tp_run *runs, size_t cap, const tk_tp_param *p, const tk_tp_slice *s, size_t elsize)
{
    int dim = p->dim >= 0 ? p->dim : 0;
    uint64_t outer = 1, inner = elsize;
    if (p->ndim == 0) { /* a scalar: one element */
        if (cap)
            runs[0] = (tk_tp_run){0, elsize, elsize, 1};
        return 1;
    }
    for (int d = 0; d < dim; d++)
        outer *= (uint64_t)p->shape[d];
    for (int d = dim + 1; d < p->ndim; d++)
        inner *= (uint64_t)p->shape[d];
    for (int i = 0; i < s->nranges && (size_t)i < cap; i++)
        runs[i] = (tk_tp_run){(uint64_t)s->start[i] * inner, (uint64_t)s->len[i] * inner,
                              (uint64_t)p->shape[dim] * inner, (int64_t)outer};
    return (size_t)s->nranges;
}

void tk_models__tp_copy(void *dst, const void *src, const tk_tp_param *p, const tk_tp_slice *s, size_t elsize)
{
    tk_tp_run runs[TK_TP_MAX_SPLIT];
    size_t n = tk_models__tp_runs(runs, TK_TP_MAX_SPLIT, p, s, elsize);
    char *d = dst;
    const char *b = src;
    if (n == 0)
        return;
    for (int64_t o = 0; o < runs[0].count; o++)
        for (size_t i = 0; i < n; i++) {
            memcpy(d, b + runs[i].offset + (uint64_t)o * runs[i].stride, runs[i].bytes);
            d += runs[i].bytes;
        }
}
