/*
 * config.c — a checkpoint's config.json (and generation_config.json) into one typed struct.
 *
 * Field names and defaults are those of transformers' LlamaConfig, MistralConfig, Qwen2Config,
 * GPT2Config and BertConfig. Both spellings of the rope settings are read: transformers v4's
 * "rope_scaling" with a top-level "rope_theta", and v5's "rope_parameters" (which holds rope_theta).
 * A value that would change the forward in a way tk does not implement (another activation, relative
 * position embeddings, a quantisation config, ...) is an error that names the field and its value and
 * lists what is supported, never silently ignored.
 */
#include <jansson.h>
#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/models.h"

/* ---- the architecture table -------------------------------------------------------------------- */

/* Every architecture tk runs: one row each. A new one is a file (its parser, caps and forward, or a
 * variation of llama.c's decoder) and a row here; docs/models.md has the recipe. */
const tk_models_arch *const tk_models__archs[] = {
    &tk_models__llama,
    &tk_models__gpt2,
    &tk_models__bert,
    &tk_models__qwen3,
    &tk_models__olmo2,
    &tk_models__granite,
    &tk_models__smollm3,
    &tk_models__gemma,
    &tk_models__gemma2,
    &tk_models__gemma3,
    &tk_models__phi3,
    &tk_models__mixtral,
    &tk_models__qwen2_moe,
    &tk_models__qwen3_moe,
    &tk_models__llada,
    &tk_models__dream,
    &tk_models__diffusion_gemma,
    NULL,
};

static char supported[4096];
static pthread_once_t supported_once = PTHREAD_ONCE_INIT;

static void supported_init(void)
{
    size_t o = 0;
    for (const tk_models_arch *const *a = tk_models__archs; *a; a++)
        for (const char *const *c = (*a)->classes; *c; c++) {
            int n = snprintf(supported + o, sizeof supported - o, "%s%s", o ? ", " : "", *c);
            if (n < 0 || (size_t)n >= sizeof supported - o)
                return;
            o += (size_t)n;
        }
}

const char *tk_models__supported_archs(void)
{
    pthread_once(&supported_once, supported_init);
    return supported;
}

/* Levenshtein distance of a and b, case-insensitive (both at most 127 bytes; longer ones are cut). */
static size_t edit_distance(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    na = na > 127 ? 127 : na;
    nb = nb > 127 ? 127 : nb;
    size_t row[128];
    for (size_t j = 0; j <= nb; j++)
        row[j] = j;
    for (size_t i = 1; i <= na; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= nb; j++) {
            size_t up = row[j];
            int same = tolower((unsigned char)a[i - 1]) == tolower((unsigned char)b[j - 1]);
            size_t best = diag + !same;
            if (row[j] + 1 < best)
                best = row[j] + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[nb];
}

/* The length of a class name without its head's suffix ("Qwen3" of "Qwen3ForCausalLM"). */
static size_t stem_len(const char *cls)
{
    static const char *const heads[] = {"ForCausalLM", "LMHeadModel", "ForMaskedLM", "Model"};
    size_t n = strlen(cls);
    for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++)
        if (tk__has_suffix(cls, heads[i]))
            return n - strlen(heads[i]);
    return n;
}

const char *tk_models__closest_arch(const char *arch)
{
    const char *best = NULL;
    size_t bd = (size_t)-1;
    for (const tk_models_arch *const *a = tk_models__archs; *a; a++)
        for (const char *const *c = (*a)->classes; *c; c++) {
            size_t d = edit_distance(arch, *c);
            if (d < bd) {
                bd = d;
                best = *c;
            }
        }
    /* near: at most a third of the family's name (the class without its head's suffix) differs */
    return best && bd * 3 <= stem_len(best) ? best : NULL;
}

/* ---- JSON as transformers writes it ----------------------------------------------------------- */

/* Does the integer literal s[0..n) (an optional '-', then digits) lie outside int64? */
static int beyond_int64(const char *s, size_t n)
{
    int neg = n && s[0] == '-';
    const char *d = s + neg;
    size_t nd = n - (size_t)neg;
    while (nd > 1 && d[0] == '0') /* not valid JSON, but jansson reports that itself */
        d++, nd--;
    const char *lim = neg ? "9223372036854775808" : "9223372036854775807";
    return nd > 19 || (nd == 19 && memcmp(d, lim, 19) > 0);
}

json_t *tk_models__json_loadb(const char *text, size_t len, size_t flags, json_error_t *err)
{
    /* Find the integer literals beyond int64 outside strings; none (the usual case) parses in place. */
    tk_buf b = {0};
    size_t done = 0;
    for (size_t i = 0; i < len; i++) {
        char ch = text[i];
        if (ch == '"') {
            for (i++; i < len && text[i] != '"'; i++)
                if (text[i] == '\\')
                    i++;
            continue;
        }
        if (ch != '-' && (ch < '0' || ch > '9'))
            continue;
        size_t j = i + (ch == '-');
        while (j < len && text[j] >= '0' && text[j] <= '9')
            j++;
        int frac = j < len && (text[j] == '.' || text[j] == 'e' || text[j] == 'E');
        if (!frac && beyond_int64(text + i, j - i)) {
            /* as a real: digits with ".0", or past double's range the largest power of ten it has */
            if (tk__buf_append(&b, text + done, i - done) != TK_OK ||
                (j - i - (ch == '-') > 300 ? tk__buf_puts(&b, ch == '-' ? "-1e300" : "1e300")
                                           : (tk__buf_append(&b, text + i, j - i) || tk__buf_puts(&b, ".0")))) {
                tk__buf_free(&b);
                if (err)
                    snprintf(err->text, sizeof err->text, "out of memory");
                return NULL;
            }
            done = j;
        }
        while (j < len && (text[j] == '.' || text[j] == 'e' || text[j] == 'E' || text[j] == '+' || text[j] == '-' ||
                           (text[j] >= '0' && text[j] <= '9')))
            j++;
        i = j - 1;
    }
    if (!b.data)
        return json_loadb(text, len, flags, err);
    json_t *j = NULL;
    if (tk__buf_append(&b, text + done, len - done) == TK_OK)
        j = json_loadb(b.data, b.len, flags, err);
    else if (err)
        snprintf(err->text, sizeof err->text, "out of memory");
    tk__buf_free(&b);
    return j;
}

int tk_models__json_bound(const json_t *v, int64_t *out)
{
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return 1;
    }
    if (json_is_real(v) && json_real_value(v) >= 9223372036854775807.0) {
        *out = INT64_MAX;
        return 1;
    }
    return 0;
}

/* ---- typed field readers ---------------------------------------------------------------------- */

/* An integer field: absent or null gives def (or an error when def < -1 means required). */
int tk_models__cfg_int(const tk_models_reader *r, const char *key, int64_t def, int64_t lo, int64_t *out)
{
    json_t *v = json_object_get(r->root, key);
    if (!v || json_is_null(v)) {
        if (def == INT64_MIN)
            return tk__err(TK_ERR_INVALID, "%s: required field '%s' is missing", r->what, key);
        *out = def;
        return TK_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > ((int64_t)1 << 24))
        return tk__err(TK_ERR_INVALID, "%s: '%s' must be an integer in [%lld, 2^24]", r->what, key, (long long)lo);
    *out = json_integer_value(v);
    return TK_OK;
}

/* A field tk uses only as a bound (a context length, a window, a layer index): an integer >= lo, where
 * a number beyond int64 (transformers' "no limit", 1e30) is INT64_MAX. */
int tk_models__cfg_bound(const tk_models_reader *r, const char *key, int64_t def, int64_t lo, int64_t *out)
{
    json_t *v = json_object_get(r->root, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return TK_OK;
    }
    if (!tk_models__json_bound(v, out) || *out < lo)
        return tk__err(TK_ERR_INVALID, "%s: '%s' must be an integer >= %lld", r->what, key, (long long)lo);
    return TK_OK;
}

int tk_models__cfg_num(const json_t *obj, const char *what, const char *key, double def, double *out)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return TK_OK;
    }
    if (!json_is_number(v) || !isfinite(json_number_value(v)))
        return tk__err(TK_ERR_INVALID, "%s: '%s' must be a number", what, key);
    *out = json_number_value(v);
    return TK_OK;
}

int tk_models__cfg_bool(const tk_models_reader *r, const char *key, int def, int *out)
{
    json_t *v = json_object_get(r->root, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return TK_OK;
    }
    if (!json_is_boolean(v))
        return tk__err(TK_ERR_INVALID, "%s: '%s' must be true or false", r->what, key);
    *out = json_is_true(v);
    return TK_OK;
}

int tk_models__cfg_str(const tk_models_reader *r, const char *key, const char *def, char *out, size_t cap)
{
    json_t *v = json_object_get(r->root, key);
    const char *s = def;
    if (v && !json_is_null(v)) {
        if (!json_is_string(v))
            return tk__err(TK_ERR_INVALID, "%s: '%s' must be a string", r->what, key);
        s = json_string_value(v);
    }
    if (strlen(s) >= cap)
        return tk__err(TK_ERR_INVALID, "%s: '%s' is too long (%zu bytes)", r->what, key, strlen(s));
    snprintf(out, cap, "%s", s);
    return TK_OK;
}

/* bos/eos/pad: an integer, a list (its first), or absent (-1). */
static int64_t token_id(const tk_models_reader *r, const char *key)
{
    json_t *v = json_object_get(r->root, key);
    if (json_is_array(v))
        v = json_array_get(v, 0);
    return json_is_integer(v) ? json_integer_value(v) : -1;
}

/* transformers' PreTrainedConfig.validate_token_ids: a "*_token_id" outside [0, vocab) is a warning
 * ("This may result in unexpected behavior"), not an error, since Hub configs carry pad_token_id -1 and
 * eos ids past a tiny model's vocabulary. tk warns likewise (lists too), and generation goes on: an id
 * the model cannot produce never ends a sequence. The lines go to c->warnings. */
static int warn_token_ids(tk_models_config *c, json_t *root, const char *what)
{
    tk_buf b = {0};
    if (c->warnings && tk__buf_puts(&b, c->warnings) != TK_OK)
        return TK_ERR_NOMEM;
    const char *key;
    json_t *v;
    int rc = TK_OK;
    json_object_foreach(root, key, v) {
        if (!tk__has_suffix(key, "_token_id"))
            continue;
        size_t n = json_is_array(v) ? json_array_size(v) : 1;
        for (size_t i = 0; i < n && rc == TK_OK; i++) {
            json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
            char idx[32] = "", val[40];
            if (json_is_array(v))
                snprintf(idx, sizeof idx, "[%zu]", i);
            if (json_is_integer(e) && json_integer_value(e) >= 0 && json_integer_value(e) < c->vocab)
                continue;
            if (json_is_integer(e))
                snprintf(val, sizeof val, "%lld", (long long)json_integer_value(e));
            else if (json_is_real(e))
                snprintf(val, sizeof val, "%.17g", json_real_value(e));
            else
                continue; /* null, or not a number: the readers report what they use */
            rc = tk__buf_printf(&b,
                                "%s%s: %s%s %s is outside the vocabulary [0, %lld): the model can never "
                                "produce that id",
                                b.len ? "\n" : "", what, key, idx, val, (long long)c->vocab);
        }
    }
    if (rc == TK_OK && b.len) {
        free(c->warnings);
        c->warnings = tk__buf_steal(&b);
    }
    tk__buf_free(&b);
    return rc;
}

int tk_models__cfg_unsupported(const tk_models_reader *r, const char *field, const char *got, const char *supported)
{
    return tk__err(TK_ERR_UNSUPPORTED, "%s: '%s' is %s, which tk does not implement\nHINT: supported: %s", r->what,
                   field, got, supported);
}

/* ---- rope --------------------------------------------------------------------------------------- */

/* One of LongRoPE's factor lists (p's NAME) into out: numbers > 0, at most TK_MODELS_MAX_EXT. */
static int ext_list(const json_t *p, const char *what, const char *name, float *out, int64_t *n)
{
    const json_t *a = json_object_get(p, name);
    if (!json_is_array(a) || json_array_size(a) == 0)
        return tk__err(TK_ERR_INVALID, "%s: longrope needs '%s', a list of numbers (one per rotary pair)", what, name);
    if (json_array_size(a) > TK_MODELS_MAX_EXT)
        return tk__err(TK_ERR_UNSUPPORTED, "%s: '%s' has %zu values; tk takes at most %d", what, name,
                       json_array_size(a), TK_MODELS_MAX_EXT);
    for (size_t i = 0; i < json_array_size(a); i++) {
        const json_t *v = json_array_get(a, i);
        double d = json_number_value(v);
        if (!json_is_number(v) || !isfinite(d) || !(d > 0) || (float)d > 3.4e38f)
            return tk__err(TK_ERR_INVALID, "%s: '%s'[%zu] must be a finite number > 0", what, name, i);
        out[i] = (float)d; /* HF: torch.tensor(factors, dtype=float32) */
    }
    *n = (int64_t)json_array_size(a);
    return TK_OK;
}

/* LongRoPE's settings (transformers' _compute_longrope_parameters): short_factor and long_factor of
 * one length; factor, when left out, is max_position_embeddings / original_max_position_embeddings (it
 * sets the default attention factor); the original length defaults to max_position_embeddings. */
static int cfg_longrope(tk_models_config *c, tk_models_rope *k, const json_t *p, const char *what)
{
    int64_t ns = 0, nl = 0;
    int rc;
    if ((rc = ext_list(p, what, "short_factor", k->ext_short, &ns)) ||
        (rc = ext_list(p, what, "long_factor", k->ext_long, &nl)))
        return rc;
    if (ns != nl)
        return tk__err(TK_ERR_INVALID,
                       "%s: 'short_factor' has %lld values and 'long_factor' %lld; want one per rotary "
                       "pair in both",
                       what, (long long)ns, (long long)nl);
    k->next = ns;
    if (!k->original_max_pos)
        k->original_max_pos = c->max_pos;
    if (!json_is_number(json_object_get(p, "factor")))
        k->factor = (double)c->max_pos / (double)k->original_max_pos;
    if (k->attention_factor == 0 && k->factor > 1 && k->original_max_pos < 2)
        return tk__err(TK_ERR_INVALID,
                       "%s: original_max_position_embeddings %lld is too small for longrope's attention "
                       "factor (it divides by its log)",
                       what, (long long)k->original_max_pos);
    return TK_OK;
}

int tk_models__cfg_rope(tk_models_config *c, const tk_models_reader *r)
{
    tk_models_rope *k = &c->rope;
    memset(k, 0, sizeof *k);
    k->beta_fast = 32;
    k->beta_slow = 1;
    k->truncate = 1;
    k->low_freq_factor = 1;
    k->high_freq_factor = 4;
    k->factor = 1;
    int rc;
    double theta;
    if ((rc = tk_models__cfg_num(r->root, r->what, "rope_theta", 10000.0, &theta)) != TK_OK)
        return rc;
    if ((rc = tk_models__cfg_num(r->root, r->what, "partial_rotary_factor", 1.0, &k->partial_rotary_factor)) != TK_OK)
        return rc;
    json_t *p = json_object_get(r->root, "rope_parameters");
    const char *pname = "rope_parameters";
    if (!p || json_is_null(p)) {
        p = json_object_get(r->root, "rope_scaling");
        pname = "rope_scaling";
    }
    k->theta = theta;
    if (!p || json_is_null(p))
        return TK_OK;
    if (!json_is_object(p))
        return tk__err(TK_ERR_INVALID, "%s: '%s' must be an object", r->what, pname);
    char what[96];
    snprintf(what, sizeof what, "%s: '%s'", r->what, pname);
    json_t *ty = json_object_get(p, "rope_type");
    if (!ty)
        ty = json_object_get(p, "type"); /* transformers v4's older spelling */
    const char *t = json_is_string(ty) ? json_string_value(ty) : "default";
    static const char *names[TK_ROPE_COUNT] = {"default", "linear", "dynamic", "yarn", "llama3", "longrope"};
    k->type = -1;
    for (int i = 0; i < TK_ROPE_COUNT; i++)
        if (!strcmp(t, names[i]))
            k->type = i;
    /* LongRoPE's first names: "su", and for Phi-3 "yarn" too (early Phi-3 128k configs); transformers'
     * Phi3Config renames both to longrope, and refuses any other scaling on a Phi-3 */
    int phi3 = !strcmp(c->model_type, "phi3");
    if (!strcmp(t, "su") || (phi3 && !strcmp(t, "yarn")))
        k->type = TK_ROPE_LONGROPE;
    if (phi3 && k->type > TK_ROPE_DEFAULT && k->type != TK_ROPE_LONGROPE) {
        char field[64], got[80];
        snprintf(field, sizeof field, "%s.rope_type", pname);
        snprintf(got, sizeof got, "'%s'", t);
        return tk_models__cfg_unsupported(r, field, got, "default or longrope on a Phi-3 (transformers' Phi3Config)");
    }
    if (k->type < 0) {
        char got[80];
        snprintf(got, sizeof got, "'%s'", t);
        char field[64];
        snprintf(field, sizeof field, "%s.rope_type", pname);
        return tk_models__cfg_unsupported(r, field, got, "default, linear, dynamic, yarn, llama3, longrope (su)");
    }
    if ((rc = tk_models__cfg_num(p, what, "rope_theta", theta, &k->theta)) ||
        (rc = tk_models__cfg_num(p, what, "factor", 1.0, &k->factor)) ||
        (rc = tk_models__cfg_num(p, what, "partial_rotary_factor", k->partial_rotary_factor,
                                 &k->partial_rotary_factor)) ||
        (rc = tk_models__cfg_num(p, what, "beta_fast", 32.0, &k->beta_fast)) ||
        (rc = tk_models__cfg_num(p, what, "beta_slow", 1.0, &k->beta_slow)) ||
        (rc = tk_models__cfg_num(p, what, "attention_factor", 0.0, &k->attention_factor)) ||
        (rc = tk_models__cfg_num(p, what, "low_freq_factor", 1.0, &k->low_freq_factor)) ||
        (rc = tk_models__cfg_num(p, what, "high_freq_factor", 4.0, &k->high_freq_factor)))
        return rc;
    if (json_object_get(p, "mscale") || json_object_get(p, "mscale_all_dim"))
        return tk_models__cfg_unsupported(r, "rope mscale", "set",
                                          "YaRN with attention_factor (not DeepSeek's mscale)");
    json_t *trunc = json_object_get(p, "truncate");
    if (json_is_boolean(trunc))
        k->truncate = json_is_true(trunc);
    double om = 0;
    if ((rc = tk_models__cfg_num(p, what, "original_max_position_embeddings", 0, &om)) != TK_OK)
        return rc;
    /* HF's standardize_rope_params: for llama3, yarn and longrope a top-level
     * original_max_position_embeddings (Phi-3 writes it there) wins over the rope dict's */
    if ((k->type == TK_ROPE_LLAMA3 || k->type == TK_ROPE_YARN || k->type == TK_ROPE_LONGROPE) &&
        json_is_number(json_object_get(r->root, "original_max_position_embeddings")) &&
        (rc = tk_models__cfg_num(r->root, r->what, "original_max_position_embeddings", 0, &om)) != TK_OK)
        return rc;
    k->original_max_pos = om >= 9223372036854775807.0 ? INT64_MAX : om > 0 ? (int64_t)om : 0;
    if (k->type == TK_ROPE_LONGROPE && (rc = cfg_longrope(c, k, p, what)) != TK_OK)
        return rc;
    if (k->type == TK_ROPE_DYNAMIC && !k->original_max_pos)
        k->original_max_pos = c->max_pos; /* HF: max_position_embeddings */
    if (k->type == TK_ROPE_YARN && !k->original_max_pos) {
        /* HF: original_max_position_embeddings, else max_position_embeddings (factor already applied) */
        k->original_max_pos = c->max_pos;
    }
    if (k->type == TK_ROPE_LLAMA3 && !k->original_max_pos)
        return tk__err(TK_ERR_INVALID, "%s lacks original_max_position_embeddings (llama3 rope)", what);
    if (!(k->factor > 0) || !(k->theta > 0))
        return tk__err(TK_ERR_INVALID, "%s: factor and rope_theta must be > 0", what);
    return TK_OK;
}

/* ---- shared by the architectures' parsers ----------------------------------------------------- */

int tk_models__cfg_layer_types(tk_models_config *c, const tk_models_reader *r)
{
    json_t *lt = json_object_get(r->root, "layer_types");
    if (json_is_array(lt)) {
        if ((int64_t)json_array_size(lt) != c->layers)
            return tk__err(TK_ERR_INVALID, "%s: 'layer_types' has %zu entries for %lld layers", r->what,
                           json_array_size(lt), (long long)c->layers);
        for (int64_t l = 0; l < c->layers; l++) {
            const char *s = json_string_value(json_array_get(lt, (size_t)l));
            if (s && !strcmp(s, "full_attention"))
                c->sliding[l] = 0;
            else if (s && !strcmp(s, "sliding_attention"))
                c->sliding[l] = c->sliding_window > 0;
            else
                return tk_models__cfg_unsupported(r, "layer_types", s ? s : "not a string",
                                                  "full_attention, sliding_attention");
        }
    }
    return TK_OK;
}

int tk_models__cfg_act(const tk_models_reader *r, const char *key, const char *act, const char *const *ok,
                       const char *supported)
{
    for (; *ok; ok++)
        if (!strcmp(act, *ok))
            return TK_OK;
    char got[48];
    snprintf(got, sizeof got, "'%s'", act);
    return tk_models__cfg_unsupported(r, key, got, supported);
}

int tk_models__config_parse(tk_models_config *c, const char *text, size_t len, const char *what)
{
    memset(c, 0, sizeof *c);
    c->bos_id = c->eos_id = c->pad_id = c->mask_id = -1;
    json_error_t jerr;
    tk_models_reader r = {what, tk_models__json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr)};
    int rc = TK_OK;
    if (!r.root || !json_is_object(r.root)) {
        rc = tk__err(TK_ERR_INVALID, "%s: not a JSON object: %s (line %d)", what, r.root ? "" : jerr.text,
                     r.root ? 0 : jerr.line);
        goto done;
    }
    json_t *a = json_object_get(r.root, "architectures");
    const char *arch = json_is_array(a) ? json_string_value(json_array_get(a, 0)) : NULL;
    if (!arch) {
        rc = tk__err(TK_ERR_INVALID, "%s: no \"architectures\" list naming the model class\nHINT: supported: %s", what,
                     tk_models__supported_archs());
        goto done;
    }
    for (const tk_models_arch *const *d = tk_models__archs; *d && !c->def; d++)
        for (const char *const *k = (*d)->classes; *k; k++)
            if (!strcmp(arch, *k))
                c->def = *d;
    if (!c->def) {
        const char *near = tk_models__closest_arch(arch);
        char also[160] = "";
        if (near)
            snprintf(also, sizeof also, "\nHINT: did you mean %s?", near);
        rc = tk__err(TK_ERR_UNSUPPORTED, "%s: architecture '%s' is not supported\nHINT: supported: %s%s", what, arch,
                     tk_models__supported_archs(), also);
        goto done;
    }
    snprintf(c->arch, sizeof c->arch, "%s", arch);
    if ((rc = tk_models__cfg_str(&r, "model_type", "", c->model_type, sizeof c->model_type)) != TK_OK)
        goto done;
    char dt[16] = "";
    if ((rc = tk_models__cfg_str(&r, "torch_dtype", "", dt, sizeof dt)) != TK_OK ||
        (!dt[0] && (rc = tk_models__cfg_str(&r, "dtype", "", dt, sizeof dt)) != TK_OK))
        goto done;
    snprintf(c->torch_dtype, sizeof c->torch_dtype, "%s", dt);
    if (json_object_get(r.root, "quantization_config")) {
        rc = tk_models__cfg_unsupported(&r, "quantization_config", "set",
                                        "unquantised checkpoints (f32, f16, bf16 weights)");
        goto done;
    }
    c->bos_id = token_id(&r, "bos_token_id");
    c->eos_id = token_id(&r, "eos_token_id");
    c->pad_id = token_id(&r, "pad_token_id");
    c->pre_norms = 1;
    c->embed_scale = c->residual_scale = c->logit_scale = 1.0;
    rc = c->def->parse(c, &r);
    if (rc == TK_OK && c->layers > TK_MODELS_MAX_LAYERS)
        rc = tk__err(TK_ERR_UNSUPPORTED, "%s: %lld layers, tk supports at most %d", what, (long long)c->layers,
                     TK_MODELS_MAX_LAYERS);
    if (rc == TK_OK && c->head_dim < 1)
        rc = tk__err(TK_ERR_INVALID, "%s: the head size is 0 (hidden size %lld over %lld heads)", what,
                     (long long)c->hidden, (long long)c->heads);
    if (rc == TK_OK && (c->head_dim % 2 || c->head_dim > 512))
        rc = tk__err(TK_ERR_UNSUPPORTED, "%s: head size %lld; the attention op takes even head sizes up to 512", what,
                     (long long)c->head_dim);
    if (rc == TK_OK && warn_token_ids(c, r.root, what) != TK_OK)
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
done:
    if (rc != TK_OK) {
        free(c->warnings);
        c->warnings = NULL;
    }
    json_decref(r.root);
    return rc;
}

int tk_models__config_load(tk_models_config *c, const char *dir)
{
    memset(c, 0, sizeof *c);
    char *path = tk__path_join(dir, "config.json"), *gpath = tk__path_join(dir, "generation_config.json");
    char *text = NULL;
    size_t len = 0;
    int rc;
    if (!path || !gpath) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (!tk__is_dir(dir)) {
        rc = tk__err(TK_ERR_NOT_FOUND,
                     "model directory '%s' does not exist\nHINT: pass a directory holding a Hugging "
                     "Face checkpoint (config.json and *.safetensors)",
                     dir);
        goto done;
    }
    if (!tk__path_exists(path)) {
        rc = tk__err(TK_ERR_NOT_FOUND,
                     "'%s' has no config.json\nHINT: pass a directory holding a Hugging Face "
                     "checkpoint (config.json and *.safetensors)",
                     dir);
        goto done;
    }
    if ((rc = tk__read_file(&text, &len, path, 16u << 20)) != TK_OK)
        goto done;
    if ((rc = tk_models__config_parse(c, text, len, path)) != TK_OK)
        goto done;
    if (tk__path_exists(gpath)) {
        char *g = NULL;
        size_t glen;
        if ((rc = tk__read_file(&g, &glen, gpath, 16u << 20)) != TK_OK)
            goto done;
        json_error_t jerr;
        json_t *gj = tk_models__json_loadb(g, glen, 0, &jerr);
        if (!json_is_object(gj)) {
            rc = tk__err(TK_ERR_INVALID, "%s: not a JSON object: %s", gpath, gj ? "" : jerr.text);
            free(g);
            json_decref(gj);
            goto done;
        }
        rc = warn_token_ids(c, gj, gpath);
        json_decref(gj);
        if (rc != TK_OK) {
            free(g);
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
            goto done;
        }
        c->generation_json = g;
    }
done:
    if (rc != TK_OK)
        tk_models__config_free(c);
    free(text);
    free(path);
    free(gpath);
    return rc;
}

void tk_models__config_free(tk_models_config *c)
{
    free(c->generation_json);
    c->generation_json = NULL;
    free(c->warnings);
    c->warnings = NULL;
}

const char *tk_models__act_op(const char *act)
{
    static const struct {
        const char *hf, *op;
    } map[] = {{"gelu", "gelu"},           {"gelu_new", "gelu_new"},     {"gelu_pytorch_tanh", "gelu_tanh"},
               {"gelu_fast", "gelu_fast"}, {"quick_gelu", "gelu_quick"}, {"silu", "silu"},
               {"swish", "silu"}};
    for (size_t i = 0; i < sizeof map / sizeof *map; i++)
        if (!strcmp(act, map[i].hf))
            return map[i].op;
    return NULL;
}
