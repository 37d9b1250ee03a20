/*
 * generate.c — text generation over the model pipelines: logits processors with transformers'
 * GenerationConfig semantics, the strategies (greedy, sampling, beam search), streaming and batching,
 * over the paged KV cache of models/kv_cache.c.
 *
 * The logits processors follow transformers' LogitsProcessor classes one by one (generation/
 * logits_process.py) in f32, in the order generate() applies them: repetition penalty, no-repeat
 * n-gram, then (sampling only) temperature, top-k, top-p, min-p. The final pick goes through the op
 * registry: `argmax` for greedy, `sample` (seeded Philox, the same token on the CPU and the GPU) for
 * sampling, over the processed row. The softmax sums of min-p, top-p and log_softmax are exact integer
 * sums (tk_fsum, common/sample_math.h) rather than f32/f64 sums in some order, so that ranks holding a
 * split LM head's columns (models/tp_pick.c) reach the same bits; they differ from torch's by less than
 * f32's rounding.
 */
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sample_math.h"
#include "models/generate.h"
#include "models/kv_cache.h"
#include "models/models.h"

/* ---- logits processors ------------------------------------------------------------------------ */

void tk_gen__temperature(float *s, int64_t V, double t)
{
    float tf = (float)t; /* torch divides an f32 tensor by the scalar as f32 */
    for (int64_t i = 0; i < V; i++)
        s[i] = s[i] / tf;
}

int tk_gen__repetition_penalty(float *s, int64_t V, const int32_t *ids, size_t n, double p)
{
    /* transformers gathers every listed score first and scatters back, so a repeated id is penalised
     * once: mark the ids, then penalise each marked token */
    unsigned char *seen = calloc((size_t)V + 1, 1);
    if (!seen)
        return tk__err(TK_ERR_NOMEM, "repetition_penalty: out of memory for a row of %lld scores", (long long)V);
    float pf = (float)p;
    for (size_t j = 0; j < n; j++) {
        int32_t id = ids[j];
        if (id < 0 || id >= V || seen[id])
            continue;
        seen[id] = 1;
        s[id] = s[id] < 0 ? s[id] * pf : s[id] / pf;
    }
    free(seen);
    return TK_OK;
}

void tk_gen__no_repeat_ngram(float *s, int64_t V, const int32_t *ids, size_t n, int64_t ngram)
{
    if (ngram <= 0 || n < (size_t)ngram)
        return;
    size_t g = (size_t)ngram, plen = g - 1;
    const int32_t *prefix = ids + n - plen; /* the last ngram-1 tokens */
    for (size_t i = 0; i + g <= n; i++) {
        if (memcmp(ids + i, prefix, plen * sizeof *ids) != 0)
            continue;
        int32_t ban = ids[i + plen];
        if (ban >= 0 && ban < V)
            s[ban] = -INFINITY;
    }
}

int tk_gen__top_k(float *s, int64_t V, int64_t k, int64_t min_keep)
{
    if (k < min_keep)
        k = min_keep;
    if (k <= 0 || k >= V)
        return TK_OK;
    uint32_t *heap = malloc((size_t)k * sizeof *heap); /* the keys of the k largest scores */
    if (!heap)
        return tk__err(TK_ERR_NOMEM, "top_k: out of memory for k = %lld", (long long)k);
    int64_t h = tk__top_keys(heap, s, V, k);
    if (h == k) { /* scores < the k-th largest go; ties with it stay (transformers' filter) */
        float thr = tk__float_of_key(heap[0]);
        for (int64_t i = 0; i < V; i++)
            if (s[i] < thr)
                s[i] = -INFINITY;
    }
    free(heap);
    return TK_OK;
}

/* A row's largest score, NaN skipped (-inf when none); a zero is +0, so the sign of a zero maximum cannot
 * depend on which zero came first (a vocabulary-parallel pick finds it from keys, models/tp_pick.c). */
static float row_max(const float *s, int64_t V)
{
    float m = -INFINITY;
    for (int64_t i = 0; i < V; i++)
        if (s[i] > m)
            m = s[i];
    return m == 0.0f ? 0.0f : m;
}

float tk_gen__softmax_term(float x, float m)
{
    if (m == INFINITY) /* softmax's limit: the +inf scores share the probability, the rest have none */
        return x == INFINITY ? 1.0f : 0.0f;
    return m == -INFINITY || x != x ? 0.0f : expf(x - m);
}

/* softmax_f32's terms e^(s - m) of s[0..n) into *acc (tk_fsum: any order, any split gives one sum). */
void tk_gen__softmax_terms(tk_fsum *acc, const float *s, int64_t n, float m)
{
    for (int64_t i = 0; i < n; i++)
        tk__fsum_add(acc, tk_gen__softmax_term(s[i], m));
}

/* 1 / the softmax's sum in f32 (0 when the sum is 0 or NaN: every probability then 0 or NaN). */
float tk_gen__softmax_inv(const tk_fsum *acc)
{
    double sum = tk__fsum_value(acc);
    return sum > 0 ? (float)(1.0 / sum) : 0.0f;
}

/* f32 softmax of s into p, as torch: e = exp(x - max), divided by the sum (the sum exact, tk_fsum, where
 * torch adds in its own order: the two differ by less than f32's rounding of the sum). A NaN counts as
 * -inf and a +inf takes softmax's limit (tk_gen__softmax_term), where torch's softmax is NaN. */
static void softmax_f32(float *p, const float *s, int64_t V)
{
    float m = row_max(s, V);
    tk_fsum acc = {0};
    tk_gen__softmax_terms(&acc, s, V, m);
    float inv = tk_gen__softmax_inv(&acc);
    for (int64_t i = 0; i < V; i++)
        p[i] = tk_gen__softmax_term(s[i], m) * inv;
}

typedef struct {
    float v;
    int32_t i;
} vi;

/* ascending by value, ties by index: a stable ascending sort's order */
static int cmp_vi_asc(const void *a, const void *b)
{
    const vi *x = a, *y = b;
    if (x->v != y->v)
        return x->v < y->v ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

int tk_gen__top_p(float *s, int64_t V, double p, int64_t min_keep)
{
    if (p >= 1.0 || V <= 0)
        return TK_OK;
    vi *o = malloc((size_t)V * sizeof *o);
    float *sv = malloc((size_t)V * sizeof *sv), *pr = malloc((size_t)V * sizeof *pr);
    if (!o || !sv || !pr) {
        free(o);
        free(sv);
        free(pr);
        return tk__err(TK_ERR_NOMEM, "top_p: out of memory for a row of %lld scores", (long long)V);
    }
    for (int64_t i = 0; i < V; i++) {
        o[i].v = s[i] != s[i] ? -INFINITY : s[i];
        o[i].i = (int32_t)i;
    }
    qsort(o, (size_t)V, sizeof *o, cmp_vi_asc);
    for (int64_t i = 0; i < V; i++)
        sv[i] = o[i].v;
    softmax_f32(pr, sv, V);
    /* cumulative_probs <= (1 - top_p), the scalar cast to f32 as torch casts it. torch's cumsum
     * accumulates f32 in double on the CPU; here each prefix is exact (tk_fsum), so a prefix depends only
     * on which tokens precede, and a vocabulary-parallel pick finds the same boundary from the ranks'
     * sums below a few thresholds (models/tp_pick.c). The two differ by far less than f32's rounding. */
    float cut = (float)(1.0 - p);
    tk_fsum acc = {0};
    for (int64_t i = 0; i < V; i++) {
        tk__fsum_add(&acc, pr[i]);
        float cum = (float)tk__fsum_value(&acc);
        if (cum <= cut && i < V - min_keep)
            s[o[i].i] = -INFINITY;
    }
    free(o);
    free(sv);
    free(pr);
    return TK_OK;
}

/* descending by value, ties by index (torch.topk's order on the CPU for ties is unspecified) */
static int cmp_vi_desc(const void *a, const void *b)
{
    const vi *x = a, *y = b;
    if (x->v != y->v)
        return x->v > y->v ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

int tk_gen__min_p(float *s, int64_t V, double min_p, int64_t min_keep)
{
    if (V <= 0)
        return TK_OK;
    float *pr = malloc((size_t)V * sizeof *pr);
    unsigned char *keep = calloc((size_t)V, 1);
    vi *o = NULL;
    if (!pr || !keep)
        goto nomem;
    softmax_f32(pr, s, V);
    float top = 0;
    for (int64_t i = 0; i < V; i++)
        if (pr[i] > top)
            top = pr[i];
    float thr = (float)min_p * top;
    if (min_keep > V)
        min_keep = V;
    if (min_keep > 1) {
        if (!(o = malloc((size_t)V * sizeof *o)))
            goto nomem;
        for (int64_t i = 0; i < V; i++) {
            o[i].v = pr[i];
            o[i].i = (int32_t)i;
        }
        qsort(o, (size_t)V, sizeof *o, cmp_vi_desc);
        for (int64_t i = 0; i < min_keep; i++)
            keep[o[i].i] = 1;
    } else if (min_keep == 1) {
        int64_t best = 0;
        for (int64_t i = 1; i < V; i++)
            if (pr[i] > pr[best])
                best = i;
        keep[best] = 1;
    }
    for (int64_t i = 0; i < V; i++)
        if (pr[i] < thr && !keep[i])
            s[i] = -INFINITY;
    free(pr);
    free(keep);
    free(o);
    return TK_OK;
nomem:
    free(pr);
    free(keep);
    free(o);
    return tk__err(TK_ERR_NOMEM, "min_p: out of memory for a row of %lld scores", (long long)V);
}

/* log_softmax's terms e^(s - m) of s[0..n) into *acc, in double (tk_fsum: any order or split). */
void tk_gen__lse_terms(tk_fsum *acc, const float *s, int64_t n, float m)
{
    for (int64_t i = 0; i < n; i++)
        tk__fsum_add(acc, exp((double)(s[i] - m)));
}

void tk_gen__log_softmax(float *s, int64_t V)
{
    float m = row_max(s, V);
    if (m == -INFINITY)
        return;
    tk_fsum acc = {0};
    tk_gen__lse_terms(&acc, s, V, m);
    float lse = (float)log(tk__fsum_value(&acc));
    for (int64_t i = 0; i < V; i++)
        s[i] = (s[i] - m) - lse;
}

int tk_gen__presence_frequency(float *s, int64_t V, const int32_t *gen, size_t n, double presence, double frequency)
{
    if (n == 0)
        return TK_OK;
    int32_t *cnt = calloc((size_t)V + 1, sizeof *cnt);
    if (!cnt)
        return tk__err(TK_ERR_NOMEM, "presence/frequency penalty: out of memory for a row of %lld scores",
                       (long long)V);
    for (size_t j = 0; j < n; j++)
        if (gen[j] >= 0 && gen[j] < V)
            cnt[gen[j]]++;
    for (int64_t t = 0; t < V; t++)
        if (cnt[t])
            s[t] = (float)((double)s[t] - frequency * cnt[t] - presence);
    free(cnt);
    return TK_OK;
}

/* ---- options ---------------------------------------------------------------------------------- */

int tk_gen__opts_upgrade(tk_gen_opts *out, const tk_gen_opts *in)
{
    tk_gen_opts def = TK_GEN_OPTS_INIT;
    if (!in)
        return tk__err(TK_ERR_INVALID, "generate: no options");
    if (in->version == 1) { /* version 1 ends before presence_penalty */
        *out = def;
        memcpy(out, in, offsetof(tk_gen_opts, presence_penalty));
        out->version = TK_GEN_OPTS_VERSION;
        return TK_OK;
    }
    if (in->version != TK_GEN_OPTS_VERSION)
        return tk__err(TK_ERR_INVALID,
                       "generate: options have version %u, want 1 or %u\nHINT: declare them with "
                       "TK_GEN_OPTS_INIT",
                       in->version, (unsigned)TK_GEN_OPTS_VERSION);
    *out = *in;
    return TK_OK;
}

int64_t tk_gen__total_length(const tk_gen_opts *o, int64_t len, int64_t max_pos)
{
    /* INT64_MAX is "no limit" (a file's 1e30): up to the model's context */
    if (o->max_new_tokens > 0)
        return o->max_new_tokens == INT64_MAX        ? max_pos
               : o->max_new_tokens > INT64_MAX - len ? INT64_MAX
                                                     : len + o->max_new_tokens;
    if (o->max_length > 0)
        return o->max_length == INT64_MAX ? max_pos : o->max_length;
    /* neither set: transformers 5 generates 20 new tokens (_prepare_generated_length), within
     * max_position_embeddings */
    return len + 20 < max_pos ? len + 20 : max_pos;
}

int tk_gen__check(const tk_gen_lm *lm, const int32_t *const *prompts, const size_t *lens, size_t np,
                  const tk_gen_opts *o)
{
    if (!o || o->version != TK_GEN_OPTS_VERSION)
        return tk__err(TK_ERR_INVALID,
                       "generate: options have version %u, want %u\nHINT: declare them with "
                       "TK_GEN_OPTS_INIT",
                       o ? o->version : 0u, (unsigned)TK_GEN_OPTS_VERSION);
    if (np == 0 || !prompts || !lens)
        return tk__err(TK_ERR_INVALID, "generate: no prompt given\nHINT: pass at least one prompt of token ids");
    if (o->max_new_tokens == 0 || o->max_new_tokens < -1)
        return tk__err(TK_ERR_INVALID,
                       "generate: max_new_tokens is %lld, want a number > 0 (or -1: up to "
                       "max_length)",
                       (long long)o->max_new_tokens);
    for (size_t i = 0; i < np; i++) {
        if (lens[i] == 0 || !prompts[i])
            return tk__err(TK_ERR_INVALID,
                           "generate: prompt %zu is empty: generation continues a prompt of at "
                           "least one token\nHINT: give some text, or the model's BOS token id",
                           i);
        for (size_t j = 0; j < lens[i]; j++)
            if (prompts[i][j] < 0 || prompts[i][j] >= lm->vocab)
                return tk__err(TK_ERR_INVALID,
                               "generate: prompt %zu: token %zu is id %d, outside the vocabulary "
                               "[0, %lld)",
                               i, j, (int)prompts[i][j], (long long)lm->vocab);
        int64_t want = tk_gen__total_length(o, (int64_t)lens[i], lm->max_pos);
        if (o->max_new_tokens < 0 && o->max_length > 0 && o->max_length <= (int64_t)lens[i])
            return tk__err(TK_ERR_INVALID,
                           "generate: prompt %zu has %zu tokens, and max_length %lld leaves no "
                           "room for new ones\nHINT: set max_new_tokens (--max-new-tokens N)",
                           i, lens[i], (long long)o->max_length);
        if ((int64_t)lens[i] >= lm->max_pos)
            return tk__err(TK_ERR_INVALID,
                           "generate: prompt %zu has %zu tokens, but the model's context holds %lld "
                           "positions, prompt and new tokens together\nHINT: shorten the prompt to fewer than %lld "
                           "tokens",
                           i, lens[i], (long long)lm->max_pos, (long long)lm->max_pos);
        if (want > lm->max_pos)
            return tk__err(TK_ERR_INVALID,
                           "generate: prompt %zu has %zu tokens and asks for %lld in all, but the "
                           "model's context holds %lld positions\nHINT: shorten the prompt or lower "
                           "max_new_tokens to at most %lld",
                           i, lens[i], (long long)want, (long long)lm->max_pos,
                           (long long)(lm->max_pos - (int64_t)lens[i]));
    }
    if (o->do_sample && !(o->temperature > 0))
        return tk__err(TK_ERR_INVALID,
                       "generate: temperature is %g, want a value > 0 when sampling\nHINT: for "
                       "greedy decoding leave do_sample off",
                       o->temperature);
    if (o->top_k < 0)
        return tk__err(TK_ERR_INVALID, "generate: top_k is %lld, want >= 0 (0: off)", (long long)o->top_k);
    if (!(o->top_p > 0 && o->top_p <= 1))
        return tk__err(TK_ERR_INVALID, "generate: top_p is %g, want a value in (0, 1] (1: off)", o->top_p);
    if (!(o->min_p >= 0 && o->min_p <= 1))
        return tk__err(TK_ERR_INVALID, "generate: min_p is %g, want a value in [0, 1] (0: off)", o->min_p);
    if (!(o->repetition_penalty > 0) || !isfinite(o->repetition_penalty))
        return tk__err(TK_ERR_INVALID, "generate: repetition_penalty is %g, want a value > 0 (1: off)",
                       o->repetition_penalty);
    if (o->no_repeat_ngram_size < 0)
        return tk__err(TK_ERR_INVALID, "generate: no_repeat_ngram_size is %lld, want >= 0 (0: off)",
                       (long long)o->no_repeat_ngram_size);
    if (o->num_beams < 1 || o->num_beams > 256)
        return tk__err(TK_ERR_INVALID, "generate: num_beams is %lld, want 1 to 256", (long long)o->num_beams);
    if (!isfinite(o->length_penalty))
        return tk__err(TK_ERR_INVALID, "generate: length_penalty is %g, want a finite number", o->length_penalty);
    if (o->early_stopping < TK_GEN_EARLY_HEURISTIC || o->early_stopping > TK_GEN_EARLY_NEVER)
        return tk__err(TK_ERR_INVALID,
                       "generate: early_stopping is %d, want TK_GEN_EARLY_HEURISTIC, _TRUE or "
                       "_NEVER",
                       o->early_stopping);
    if (o->num_beams > 1 && (o->logprobs || o->top_logprobs > 0))
        return tk__err(TK_ERR_UNSUPPORTED,
                       "generate: log-probabilities (logprobs, top_logprobs) are reported for greedy decoding and "
                       "sampling, not beam search (num_beams %lld)\nHINT: use num_beams 1 (tk generate --num-beams "
                       "1), or score the beam's tokens with a forward pass (tk model logits)",
                       (long long)o->num_beams);
    if (o->do_sample && o->num_beams > 1)
        return tk__err(TK_ERR_UNSUPPORTED,
                       "generate: beam sampling (do_sample with num_beams %lld) is not "
                       "implemented\nHINT: use beam search (do_sample off) or sampling with num_beams 1",
                       (long long)o->num_beams);
    if (o->n_eos > TK_GEN_MAX_EOS)
        return tk__err(TK_ERR_INVALID, "generate: %zu eos ids, at most %d", o->n_eos, TK_GEN_MAX_EOS);
    /* An eos id outside the vocabulary is kept, as transformers keeps it: no token ever matches it, and it
     * still counts in the beams' candidate width ((1 + n_eos) * num_beams). Loading warns about it. */
    if (o->n_stop && !o->stop_strings)
        return tk__err(TK_ERR_INVALID, "generate: n_stop is %zu but stop_strings is NULL", o->n_stop);
    for (size_t i = 0; i < o->n_stop; i++)
        if (!o->stop_strings[i] || !*o->stop_strings[i])
            return tk__err(TK_ERR_INVALID, "generate: stop string %zu is empty", i);
    if (!(o->presence_penalty >= -2 && o->presence_penalty <= 2))
        return tk__err(TK_ERR_INVALID, "generate: presence_penalty is %g, want a value in [-2, 2] (0: off)",
                       o->presence_penalty);
    if (!(o->frequency_penalty >= -2 && o->frequency_penalty <= 2))
        return tk__err(TK_ERR_INVALID, "generate: frequency_penalty is %g, want a value in [-2, 2] (0: off)",
                       o->frequency_penalty);
    if (o->top_logprobs < 0 || o->top_logprobs > TK_GEN_MAX_TOP_LOGPROBS)
        return tk__err(TK_ERR_INVALID, "generate: top_logprobs is %d, want 0 to %d", o->top_logprobs,
                       TK_GEN_MAX_TOP_LOGPROBS);
    if (o->n_stop && !lm->decode)
        return tk__err(TK_ERR_UNSUPPORTED, "generate: stop strings need the model's tokenizer, and it has none\n"
                                           "HINT: put tokenizer.json in the model directory, or use eos ids");
    return TK_OK;
}

/* ---- the pieces every strategy shares ---------------------------------------------------------- */

typedef struct {
    int32_t *ids; /* prompt + generated */
    size_t n, cap, plen;
    int32_t slot;
    int done, end;
    float score;
    char *text;      /* decoded generated text, when decoding */
    size_t emitted;  /* bytes of text already streamed */
} gseq;

static int seq_push(gseq *s, int32_t id)
{
    if (s->n == s->cap) {
        size_t nc = s->cap ? 2 * s->cap : 64;
        int32_t *p = realloc(s->ids, nc * sizeof *p);
        if (!p)
            return tk__err(TK_ERR_NOMEM, "generate: out of memory for a sequence of %zu tokens", nc);
        s->ids = p;
        s->cap = nc;
    }
    s->ids[s->n++] = id;
    return TK_OK;
}

static int seq_copy(gseq *d, const gseq *s)
{
    *d = *s;
    d->ids = NULL;
    d->cap = d->n = 0;
    d->text = NULL;
    d->slot = -1;
    for (size_t i = 0; i < s->n; i++)
        if (seq_push(d, s->ids[i]))
            return TK_ERR_NOMEM;
    return TK_OK;
}

static void seq_clear(gseq *s)
{
    free(s->ids);
    free(s->text);
    memset(s, 0, sizeof *s);
    s->slot = -1;
}

static int is_eos(const tk_gen_opts *o, int32_t id)
{
    for (size_t i = 0; i < o->n_eos; i++)
        if (o->eos_token_id[i] == id)
            return 1;
    return 0;
}

/* The processors of transformers' generate(), in its order, on one row (raw logits for greedy and
 * sampling, log-probabilities for beam search). */
static int process_row(float *row, int64_t V, const gseq *s, const tk_gen_opts *o)
{
    int rc;
    if (o->repetition_penalty != 1.0 && (rc = tk_gen__repetition_penalty(row, V, s->ids, s->n, o->repetition_penalty)))
        return rc;
    if (o->no_repeat_ngram_size > 0)
        tk_gen__no_repeat_ngram(row, V, s->ids, s->n, o->no_repeat_ngram_size);
    if ((o->presence_penalty != 0 || o->frequency_penalty != 0) &&
        (rc = tk_gen__presence_frequency(row, V, s->ids + s->plen, s->n - s->plen, o->presence_penalty,
                                         o->frequency_penalty)))
        return rc;
    if (!o->do_sample)
        return TK_OK;
    if (o->temperature != 1.0)
        tk_gen__temperature(row, V, o->temperature);
    if (o->top_k != 0 && (rc = tk_gen__top_k(row, V, o->top_k, 1)))
        return rc;
    if (o->top_p < 1.0 && (rc = tk_gen__top_p(row, V, o->top_p, 1)))
        return rc;
    if (o->min_p > 0 && (rc = tk_gen__min_p(row, V, o->min_p, 1)))
        return rc;
    return TK_OK;
}

/* Length in bytes of text without a trailing incomplete UTF-8 character or a trailing U+FFFD (a byte-
 * fallback token waiting for the rest of its character). */
static size_t utf8_complete(const char *t, size_t n)
{
    size_t i = n, back = 0;
    while (i > 0 && back < 4 && ((unsigned char)t[i - 1] & 0xC0) == 0x80) {
        i--;
        back++;
    }
    if (i > 0) {
        unsigned char c = (unsigned char)t[i - 1];
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        if (c >= 0xC0 && back + 1 < need)
            n = i - 1; /* the lead byte and its continuation bytes so far wait */
    }
    while (n >= 3 && (unsigned char)t[n - 3] == 0xEF && (unsigned char)t[n - 2] == 0xBF &&
           (unsigned char)t[n - 1] == 0xBD)
        n -= 3;
    return n;
}

/* Decodes s's generated tokens into s->text. */
static int seq_decode(const tk_gen_lm *lm, gseq *s)
{
    if (!lm->decode)
        return TK_OK;
    char *t = NULL;
    int rc = lm->decode(lm->self, s->ids + s->plen, s->n - s->plen, &t);
    if (rc)
        return rc;
    free(s->text);
    s->text = t;
    return TK_OK;
}

/* 1 when the generated text contains a stop string that ends past byte `from` - (longest - 1). */
static int hits_stop(const tk_gen_opts *o, const char *text, size_t prev_len)
{
    if (!text)
        return 0;
    for (size_t i = 0; i < o->n_stop; i++) {
        size_t sl = strlen(o->stop_strings[i]);
        size_t from = prev_len >= sl ? prev_len - sl + 1 : 0;
        if (from <= strlen(text) && strstr(text + from, o->stop_strings[i]))
            return 1;
    }
    return 0;
}

/* Streams the new complete text of s with its last token; at the end (final) everything left. */
static int stream_token(const tk_gen_opts *o, size_t seq, gseq *s, int32_t tok, int final)
{
    if (!o->stream)
        return 0;
    size_t len = s->text ? strlen(s->text) : 0;
    size_t upto = final ? len : utf8_complete(s->text ? s->text : "", len);
    const char *piece = "";
    size_t plen = 0;
    if (upto > s->emitted) {
        piece = s->text + s->emitted;
        plen = upto - s->emitted;
        s->emitted = upto;
    }
    return o->stream(o->stream_user, seq, tok, piece, plen);
}

/* The registry's final pick over rows [nrows, V] (f32, host): argmax for greedy, the seeded sample op
 * (Philox; per-row seeds, so a sequence draws the same token whatever its batch slot) for sampling.
 * Every processor already ran, so sample runs at temperature 1 with its own top-k/top-p off. */
static int pick(const tk_gen_lm *lm, const tk_gen_opts *o, float *rows, size_t nrows, int64_t step, int64_t *tok)
{
    int64_t shp[2] = {(int64_t)nrows, lm->vocab}, shp1[1] = {(int64_t)nrows};
    tk_tensor lg = {rows, {TK_DEV_CPU, 0}, 2, {TK_DL_FLOAT, 32, 1}, shp, NULL, 0};
    tk_tensor out = {tok, {TK_DEV_CPU, 0}, 1, {TK_DL_INT, 64, 1}, shp1, NULL, 0};
    if (!o->do_sample) {
        tk_arg a[] = {{TK_ARG_TENSOR, "out", &out, 0, 0}, {TK_ARG_TENSOR, "input", &lg, 0, 0}};
        return tk_op_run(lm->ctx, "argmax", a, 2, NULL, NULL);
    }
    int64_t *seeds = malloc(nrows * sizeof *seeds);
    if (!seeds)
        return tk__err(TK_ERR_NOMEM, "generate: out of memory");
    for (size_t i = 0; i < nrows; i++)
        seeds[i] = (int64_t)o->seed;
    tk_tensor sd = {seeds, {TK_DEV_CPU, 0}, 1, {TK_DL_INT, 64, 1}, shp1, NULL, 0};
    tk_arg a[] = {{TK_ARG_TENSOR, "out", &out, 0, 0},        {TK_ARG_TENSOR, "logits", &lg, 0, 0},
                  {TK_ARG_F64, "temperature", NULL, 0, 1.0}, {TK_ARG_I64, "top_k", NULL, 0, 0},
                  {TK_ARG_F64, "top_p", NULL, 0, 1.0},       {TK_ARG_I64, "offset", NULL, step, 0},
                  {TK_ARG_TENSOR, "seeds", &sd, 0, 0}};
    int rc = tk_op_run(lm->ctx, "sample", a, sizeof a / sizeof a[0], NULL, NULL);
    free(seeds);
    return rc;
}

static double now_ms(void) { return tk__now_ms(); }

/* ---- the step engine: greedy and sampling, continuous batching -------------------------------- */

/* Sequences join (eng_add) and leave (an end, eng_cancel) between steps. A step feeds each decoding
 * sequence its last token and each new one the next chunk of its prompt (at most max_step_tokens
 * prompt tokens in all), runs the model once, and picks a token for every sequence whose logits are
 * ready. n > 1 sequences of one prompt wait for the first one's prefill and fork its cache. */

enum { S_PREFILL = 0, S_WAIT = 1, S_DECODE = 2 };

typedef struct eseq {
    int64_t id;
    int state;
    gseq g;               /* ids: prompt + generated; plen; slot; text; emitted */
    tk_gen_opts o;        /* its own options; o.stop_strings points at stops */
    char **stops;
    int64_t max_new;
    int64_t fed;          /* tokens of g.ids in the cache */
    int64_t cached;       /* prompt tokens the prefix cache gave */
    int64_t chunk;        /* this step's prompt tokens (S_PREFILL) */
    struct eseq *leader;  /* S_WAIT: the sequence whose prefill it shares */
} eseq;

typedef struct {
    tk_gen_lm lm;
    tk_kv *kv;        /* the KV cache, for the prefix cache (NULL: none) */
    int64_t max_step_tokens;
    int prefix_cache;
    eseq **s;             /* active, in arrival order */
    size_t n, cap;
    eseq **dead;          /* ended in the last step: their text lives until the next call */
    size_t ndead, capdead;
    int64_t next_id;
    tk_gen_event *ev;
    size_t nev, capev;
    int64_t prompt_tokens, cached_tokens, generated_tokens, steps;
    char err[512];        /* the last sequence failure (an "error" end) */
} engine;

static void eseq_free(const engine *E, eseq *e)
{
    if (!e)
        return;
    if (e->g.slot >= 0)
        E->lm.seq_free(E->lm.self, e->g.slot);
    for (size_t i = 0; e->stops && i < e->o.n_stop; i++)
        free(e->stops[i]);
    free(e->stops);
    seq_clear(&e->g);
    free(e);
}

static void eng_free_dead(engine *E)
{
    for (size_t i = 0; i < E->ndead; i++)
        eseq_free(E, E->dead[i]);
    E->ndead = 0;
}

static void eng_free(engine *E)
{
    eng_free_dead(E);
    for (size_t i = 0; i < E->n; i++)
        eseq_free(E, E->s[i]);
    free(E->s);
    free(E->dead);
    free(E->ev);
    memset(E, 0, sizeof *E);
}

static int grow(void **p, size_t *cap, size_t need, size_t el)
{
    if (need <= *cap)
        return TK_OK;
    size_t c = *cap ? *cap * 2 : 16;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * el);
    if (!q)
        return tk__err(TK_ERR_NOMEM, "generate: out of memory");
    *p = q;
    *cap = c;
    return TK_OK;
}

static int eng_add(engine *E, int64_t *first, const int32_t *prompt, size_t len, size_t n, const tk_gen_opts *o)
{
    int rc;
    if (n < 1 || n > 4096)
        return tk__err(TK_ERR_INVALID, "generate: %zu sequences asked of one prompt, want 1 to 4096", n);
    if (o->num_beams > 1)
        return tk__err(TK_ERR_UNSUPPORTED,
                       "generate: beam search (num_beams %lld) does not run step by step\n"
                       "HINT: use tk_generate for beam search",
                       (long long)o->num_beams);
    if ((rc = tk_gen__check(&E->lm, &prompt, &len, 1, o)) != TK_OK)
        return rc;
    if ((rc = grow((void **)&E->s, &E->cap, E->n + n, sizeof *E->s)) != TK_OK)
        return rc;
    eseq *lead = NULL;
    size_t added = 0;
    for (size_t i = 0; i < n; i++) {
        eseq *e = calloc(1, sizeof *e);
        if (!e) {
            rc = tk__err(TK_ERR_NOMEM, "generate: out of memory");
            goto fail;
        }
        E->s[E->n + added++] = e;
        e->g.slot = -1;
        e->id = E->next_id + (int64_t)i;
        e->o = *o;
        e->o.seed = o->seed + (uint64_t)i;
        e->o.stream = NULL;
        e->o.stop_strings = NULL;
        e->max_new = tk_gen__total_length(o, (int64_t)len, E->lm.max_pos) - (int64_t)len;
        if (o->n_stop) {
            if (!(e->stops = calloc(o->n_stop, sizeof *e->stops))) {
                rc = tk__err(TK_ERR_NOMEM, "generate: out of memory");
                goto fail;
            }
            for (size_t k = 0; k < o->n_stop; k++)
                if (!(e->stops[k] = tk__strdup(o->stop_strings[k]))) {
                    e->o.n_stop = k;
                    rc = tk__err(TK_ERR_NOMEM, "generate: out of memory");
                    goto fail;
                }
            e->o.stop_strings = (const char *const *)e->stops;
        }
        e->g.plen = len;
        for (size_t j = 0; j < len; j++)
            if ((rc = seq_push(&e->g, prompt[j])) != TK_OK)
                goto fail;
        if (i == 0) {
            lead = e;
            e->state = S_PREFILL;
            if ((rc = E->lm.seq_new(E->lm.self, &e->g.slot)) != TK_OK)
                goto fail;
            if (E->kv && E->prefix_cache)
                e->fed = e->cached = tk_kv__pc_match(E->kv, e->g.slot, prompt, len, (int64_t)len - 1);
        } else {
            e->state = S_WAIT;
            e->leader = lead;
        }
    }
    E->n += added;
    *first = E->next_id;
    E->next_id += (int64_t)n;
    E->prompt_tokens += (int64_t)(len * n);
    return TK_OK;
fail:
    for (size_t i = 0; i < added; i++)
        eseq_free(E, E->s[E->n + i]);
    return rc;
}

/* Takes e out of the active list (its followers get a new leader) and puts it on the dead list. */
static int eng_retire(engine *E, size_t i)
{
    eseq *e = E->s[i];
    int rc = grow((void **)&E->dead, &E->capdead, E->ndead + 1, sizeof *E->dead);
    if (rc != TK_OK)
        return rc;
    if (e->state == S_PREFILL) { /* its followers wait for it: the first takes over its prefill */
        eseq *heir = NULL;
        for (size_t k = 0; k < E->n; k++) {
            eseq *f = E->s[k];
            if (f->state != S_WAIT || f->leader != e)
                continue;
            if (!heir) {
                heir = f;
                f->state = S_PREFILL;
                f->leader = NULL;
                f->g.slot = e->g.slot;
                f->fed = e->fed;
                f->cached = e->cached;
                e->g.slot = -1;
            } else {
                f->leader = heir;
            }
        }
    }
    if (E->kv && E->prefix_cache && e->g.slot >= 0 && e->fed > 0)
        tk_kv__pc_insert(E->kv, e->g.slot, e->g.ids, (size_t)e->fed); /* best effort: a full cache keeps less */
    if (e->g.slot >= 0) {
        E->lm.seq_free(E->lm.self, e->g.slot);
        e->g.slot = -1;
    }
    memmove(E->s + i, E->s + i + 1, (E->n - i - 1) * sizeof *E->s);
    E->n--;
    E->dead[E->ndead++] = e;
    return TK_OK;
}

static int eng_cancel(engine *E, int64_t id)
{
    for (size_t i = 0; i < E->n; i++)
        if (E->s[i]->id == id)
            return eng_retire(E, i);
    return tk__err(TK_ERR_NOT_FOUND, "generate: no sequence %lld in the batch", (long long)id);
}

/* 0-based index of the first stop string the text holds past prev_len - (its length - 1), or -1. */
static int stop_hit(const tk_gen_opts *o, const char *text, size_t prev_len)
{
    if (!text)
        return -1;
    size_t tl = strlen(text);
    for (size_t i = 0; i < o->n_stop; i++) {
        size_t sl = strlen(o->stop_strings[i]);
        size_t from = prev_len >= sl ? prev_len - sl + 1 : 0;
        if (from <= tl && strstr(text + from, o->stop_strings[i]))
            return (int)i;
    }
    return -1;
}

int tk_gen__top_logprobs(const float *lp, int64_t V, int64_t id0, int k, int32_t *ids, float *vals)
{
    int m = 0;
    for (int64_t v = 0; v < V && k > 0; v++) {
        float x = lp[v];
        if (x != x || (m == k && !(x > vals[k - 1])))
            continue;
        int j = m < k ? m++ : k - 1;
        while (j > 0 && x > vals[j - 1]) {
            vals[j] = vals[j - 1];
            ids[j] = ids[j - 1];
            j--;
        }
        vals[j] = x;
        ids[j] = (int32_t)(id0 + v);
    }
    return m;
}

/* Picks e's next token from its logits row (modified), records the event, and ends e when it should. */
static int eng_pick(engine *E, eseq *e, float *row, float *lp, int *ended, const int64_t *picked,
                    const tk_models_tp_lp *plp)
{
    const tk_gen_lm *lm = &E->lm;
    int64_t V = lm->vocab;
    int rc = grow((void **)&E->ev, &E->capev, E->nev + 1, sizeof *E->ev);
    if (rc != TK_OK)
        return rc;
    tk_gen_event *ev = &E->ev[E->nev];
    memset(ev, 0, sizeof *ev);
    ev->seq = e->id;
    ev->stop_index = -1;
    ev->prompt_tokens = (int64_t)e->g.plen;
    ev->cached_tokens = e->cached;
    *ended = 0;
    int want_lp = e->o.logprobs || e->o.top_logprobs > 0;
    if (want_lp && !plp) {
        memcpy(lp, row, (size_t)V * sizeof *lp);
        tk_gen__log_softmax(lp, V);
    }
    int64_t tok = picked ? *picked : -1;
    if (!picked && (rc = process_row(row, V, &e->g, &e->o)) == TK_OK)
        rc = pick(lm, &e->o, row, 1, (int64_t)(e->g.n - e->g.plen), &tok);
    if (rc == TK_OK && (tok < 0 || tok >= V))
        rc = tk__err(TK_ERR_INVALID,
                     "generate: sequence %lld: the logits processors removed every token at step %zu (or every "
                     "logit is NaN or -inf: sampling counts NaN as -inf)\nHINT: loosen top_k/top_p/min_p or the "
                     "n-gram and repetition settings",
                     (long long)e->id, e->g.n - e->g.plen);
    if (rc != TK_OK) { /* this sequence fails; the others go on */
        snprintf(E->err, sizeof E->err, "%s", tk_last_error());
        ev->token = -1;
        ev->end = "error";
        E->nev++;
        *ended = 1;
        return TK_OK;
    }
    int32_t t = (int32_t)tok;
    size_t prev = e->g.text ? strlen(e->g.text) : 0;
    if ((rc = seq_push(&e->g, t)) != TK_OK || (rc = seq_decode(lm, &e->g)) != TK_OK)
        return rc;
    ev->token = t;
    if (want_lp) {
        int k = e->o.top_logprobs > TK_GEN_MAX_TOP_LOGPROBS ? TK_GEN_MAX_TOP_LOGPROBS : e->o.top_logprobs;
        if (plp) { /* the ranks' pick (models/tp_pick.c): one process's values */
            ev->logprob = plp->logprob;
            memcpy(ev->top_ids, plp->top_ids, (size_t)plp->ntop * sizeof *ev->top_ids);
            memcpy(ev->top_logprobs, plp->top_vals, (size_t)plp->ntop * sizeof *ev->top_logprobs);
            ev->ntop = k > 0 ? plp->ntop : 0;
        } else {
            ev->logprob = lp[t];
            /* as many as were filled: fewer than k when fewer are not NaN */
            ev->ntop = k > 0 ? tk_gen__top_logprobs(lp, V, 0, k, ev->top_ids, ev->top_logprobs) : 0;
        }
    }
    int si = -1;
    if (is_eos(&e->o, t))
        ev->end = "eos";
    else if ((si = stop_hit(&e->o, e->g.text, prev)) >= 0)
        ev->end = "stop_string", ev->stop_index = si;
    else if ((int64_t)(e->g.n - e->g.plen) >= e->max_new)
        ev->end = "length";
    size_t len = e->g.text ? strlen(e->g.text) : 0;
    size_t upto = ev->end ? len : utf8_complete(e->g.text ? e->g.text : "", len);
    ev->text = "";
    if (upto > e->g.emitted) {
        ev->text = e->g.text + e->g.emitted;
        ev->len = upto - e->g.emitted;
        e->g.emitted = upto;
    }
    E->generated_tokens++;
    E->nev++;
    *ended = ev->end != NULL;
    return TK_OK;
}

/* e's pick over a vocabulary-parallel head: its sampling options, and raw (the row before the processors)
 * when it wants log-probabilities. */
static tk_models_tp_pick pick_opts(const eseq *e, const float *raw)
{
    const tk_gen_opts *o = &e->o;
    tk_models_tp_pick p = {o->do_sample, o->top_k,       (uint64_t)o->seed, (int64_t)(e->g.n - e->g.plen), 1.0, 0,
                           raw,          o->top_logprobs};
    if (o->do_sample) {
        p.top_p = o->top_p;
        p.min_p = o->min_p;
    }
    return p;
}

/* A vocabulary-parallel step: the step's pick, which can always run on the ranks' columns
 * (models/tp_pick.c), sends fewer bytes than the rows would (TK_TP_PICK=local or gather forces either). The
 * same on every rank: the ranks hold the same sequences with the same options. */
static int eng_local(const engine *E)
{
    static const float some_row = 0;
    const char *env = getenv("TK_TP_PICK");
    if (!E->lm.tp || (env && !strcmp(env, "gather")))
        return 0;
    if (env && !strcmp(env, "local"))
        return 1;
    tk_models_tp_pick *p = malloc((E->n ? E->n : 1) * sizeof *p);
    if (!p) /* gathering needs no memory of its own here */
        return 0;
    for (size_t i = 0; i < E->n; i++) {
        const tk_gen_opts *o = &E->s[i]->o;
        p[i] = pick_opts(E->s[i], o->logprobs || o->top_logprobs > 0 ? &some_row : NULL);
    }
    int local = tk_models__tp_pick_cheaper(E->lm.tp, p, E->n);
    free(p);
    return local;
}

/* The step's forward; with local, a split head leaves each rank its own columns of the logits. */
static int eng_forward(engine *E, int local, const int32_t *slots, size_t nrows, const int32_t *ids, const int32_t *cu,
                       float *logits)
{
    if (local)
        E->lm.tp->tp->local_logits = 1;
    int rc = E->lm.step(E->lm.self, slots, nrows, ids, cu, logits);
    if (local)
        E->lm.tp->tp->local_logits = 0;
    return rc;
}

/* The tokens of the step's ready rows over a vocabulary-parallel head into *tok, and the log-probabilities
 * of the rows that want them into *lps (both malloc'd): each row's processors on the rank's columns (top-k,
 * top-p and min-p are the pick's, over every rank; log-probabilities are of the row before them), then one
 * collective pick. */
static int eng_pick_local(engine *E, eseq **rs, const size_t *rrow, size_t n, float *logits, int64_t **tok,
                          tk_models_tp_lp **lps)
{
    int64_t V = E->lm.vocab;
    size_t nraw = 0;
    for (size_t k = 0; k < n; k++)
        nraw += rs[k]->o.logprobs || rs[k]->o.top_logprobs > 0;
    float **rows = malloc((n + 1) * sizeof *rows), *raw = malloc((nraw * (size_t)V + 1) * sizeof *raw);
    tk_models_tp_pick *p = malloc((n + 1) * sizeof *p);
    *tok = malloc((n + 1) * sizeof **tok);
    *lps = calloc(n + 1, sizeof **lps);
    int rc = rows && raw && p && *tok && *lps
                 ? TK_OK
                 : tk__err(TK_ERR_NOMEM, "generate: out of memory for a step of %zu sequences", n);
    for (size_t k = 0, r = 0; k < n && rc == TK_OK; k++) {
        eseq *e = rs[k];
        tk_gen_opts o = e->o;
        o.top_k = 0;
        o.top_p = 1.0;
        o.min_p = 0;
        rows[k] = logits + rrow[k] * (size_t)V;
        float *rw = NULL;
        if (e->o.logprobs || e->o.top_logprobs > 0) {
            rw = raw + r++ * (size_t)V;
            memcpy(rw, rows[k], (size_t)V * sizeof *rw);
        }
        rc = process_row(rows[k], V, &e->g, &o);
        p[k] = pick_opts(e, rw);
    }
    if (rc == TK_OK)
        rc = tk_models__tp_pick(E->lm.tp, rows, n, p, *tok, *lps);
    free(rows);
    free(raw);
    free(p);
    return rc;
}

/* This step's rows: every decoding sequence (one token each), then prompt chunks in arrival order
 * within the step's token budget (each prefilling sequence's e->chunk); followers waiting for a
 * leader's prompt are counted apart. */
static void eng_plan(engine *E, size_t *nrows, size_t *ntok, size_t *nfollow)
{
    int64_t budget = E->max_step_tokens > 0 ? E->max_step_tokens : INT64_MAX;
    for (size_t i = 0; i < E->n; i++) {
        eseq *e = E->s[i];
        e->chunk = 0;
        if (e->state == S_DECODE) {
            (*nrows)++;
            (*ntok)++;
        } else if (e->state == S_WAIT) {
            (*nfollow)++;
        }
    }
    for (size_t i = 0; i < E->n && budget > 0; i++) {
        eseq *e = E->s[i];
        if (e->state != S_PREFILL)
            continue;
        int64_t left = (int64_t)e->g.plen - e->fed;
        e->chunk = left < budget ? left : budget;
        budget -= e->chunk;
        (*nrows)++;
        *ntok += (size_t)e->chunk;
    }
}

/* After the forward of nrows rows (rs[k] owns row k of logits): the sequences whose row picks a token
 * now, into rs[0..*nready) with their logits rows in rrow: decoding rows, prompts that just finished
 * (into the prefix cache), and the followers of those prompts (forked from their leader, a copy of its
 * row appended after the nrows). */
static int eng_ready(engine *E, eseq **rs, size_t *rrow, float *logits, size_t nrows, size_t *nready_out)
{
    const tk_gen_lm *lm = &E->lm;
    int64_t V = lm->vocab;
    size_t nready = 0, extra = nrows;
    int rc;
    for (size_t k = 0; k < nrows; k++) {
        eseq *e = rs[k];
        if (e->state == S_DECODE) {
            e->fed++;
            rs[nready] = e;
            rrow[nready++] = k;
            continue;
        }
        e->fed += e->chunk;
        if (e->fed < (int64_t)e->g.plen)
            continue;
        e->state = S_DECODE;
        if (E->kv && E->prefix_cache)
            tk_kv__pc_insert(E->kv, e->g.slot, e->g.ids, e->g.plen);
        E->cached_tokens += e->cached;
        rs[nready] = e;
        rrow[nready++] = k;
        for (size_t i = 0; i < E->n; i++) {
            eseq *f = E->s[i];
            if (f->state != S_WAIT || f->leader != e)
                continue;
            if ((rc = lm->seq_fork(lm->self, &f->g.slot, e->g.slot)) != TK_OK)
                return rc;
            f->state = S_DECODE;
            f->leader = NULL;
            f->fed = e->fed;
            f->cached = e->cached;
            E->cached_tokens += e->cached;
            memcpy(logits + extra * (size_t)V, logits + k * (size_t)V, (size_t)V * sizeof *logits);
            rs[nready] = f;
            rrow[nready++] = extra++;
        }
    }
    *nready_out = nready;
    return TK_OK;
}

static int eng_step(engine *E, const tk_gen_event **events, size_t *nevents)
{
    const tk_gen_lm *lm = &E->lm;
    int64_t V = lm->vocab;
    *events = NULL;
    *nevents = 0;
    eng_free_dead(E);
    E->nev = 0;
    /* the rows: decoding sequences first (one token each), then prompt chunks in arrival order */
    size_t nrows = 0, ntok = 0, nfollow = 0;
    eng_plan(E, &nrows, &ntok, &nfollow);
    if (nrows == 0)
        return TK_OK;
    int rc = TK_OK;
    int32_t *slots = malloc(nrows * sizeof *slots), *cu = malloc((nrows + 1) * sizeof *cu);
    int32_t *ids = malloc(ntok * sizeof *ids);
    eseq **rs = malloc((nrows + nfollow) * sizeof *rs);
    float *logits = malloc((nrows + nfollow) * (size_t)V * sizeof *logits), *lp = malloc((size_t)V * sizeof *lp);
    size_t *rrow = malloc((nrows + nfollow) * sizeof *rrow);
    int64_t *picked = NULL;
    tk_models_tp_lp *plps = NULL;
    if (!slots || !cu || !ids || !rs || !logits || !lp || !rrow) {
        rc = tk__err(TK_ERR_NOMEM, "generate: out of memory for a step of %zu sequences", nrows);
        goto done;
    }
    size_t r = 0, p = 0;
    cu[0] = 0;
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < E->n; i++) {
            eseq *e = E->s[i];
            if (pass == 0 && e->state == S_DECODE) {
                ids[p++] = e->g.ids[e->g.n - 1];
            } else if (pass == 1 && e->state == S_PREFILL && e->chunk > 0) {
                memcpy(ids + p, e->g.ids + e->fed, (size_t)e->chunk * sizeof *ids);
                p += (size_t)e->chunk;
            } else {
                continue;
            }
            slots[r] = e->g.slot;
            rs[r] = e;
            cu[++r] = (int32_t)p;
        }
    int local = eng_local(E);
    if ((rc = eng_forward(E, local, slots, nrows, ids, cu, logits)) != TK_OK)
        goto done;
    E->steps++;
    /* the rows whose logits pick a token: decode rows, finished prompts, and their followers */
    size_t nready = 0;
    if ((rc = eng_ready(E, rs, rrow, logits, nrows, &nready)) != TK_OK)
        goto done;
    if (local && (rc = eng_pick_local(E, rs, rrow, nready, logits, &picked, &plps)) != TK_OK)
        goto done;
    for (size_t k = 0; k < nready; k++) {
        int ended = 0, wlp = rs[k]->o.logprobs || rs[k]->o.top_logprobs > 0;
        if ((rc = eng_pick(E, rs[k], logits + rrow[k] * (size_t)V, lp, &ended, picked ? picked + k : NULL,
                           picked && wlp ? plps + k : NULL)) != TK_OK)
            goto done;
        if (!ended)
            continue;
        for (size_t i = 0; i < E->n; i++)
            if (E->s[i] == rs[k]) {
                if ((rc = eng_retire(E, i)) != TK_OK)
                    goto done;
                break;
            }
    }
    *events = E->ev;
    *nevents = E->nev;
done:
    free(slots);
    free(cu);
    free(ids);
    free(rs);
    free(logits);
    free(lp);
    free(rrow);
    free(picked);
    free(plps);
    return rc;
}

/* Appends p's array of n elements of el bytes by one (realloc); the new element is (char *)*p + n * el. */
static int grow_one(void **p, size_t n, size_t el)
{
    void *q = realloc(*p, (n + 1) * el);
    if (!q)
        return tk__err(TK_ERR_NOMEM, "generate: out of memory for a sequence of %zu tokens", n + 1);
    *p = q;
    return TK_OK;
}

/* Appends an event's token to s, with its log-probabilities when o asks for them (the engine's values,
 * kept as tk_gen_event reports them: tk_gen_result_logprobs and tk_gen_result_top_logprobs). */
static int res_push(tk_gen_seq *s, const tk_gen_event *ev, const tk_gen_opts *o)
{
    int rc = grow_one((void **)&s->ids, s->n, sizeof *s->ids);
    if (rc == TK_OK && (o->logprobs || o->top_logprobs > 0))
        rc = grow_one((void **)&s->logprobs, s->n, sizeof *s->logprobs);
    size_t k = o->top_logprobs > 0 ? (size_t)o->top_logprobs : 0; /* a row of k per token */
    if (rc == TK_OK && k && (rc = grow_one((void **)&s->ntop, s->n, sizeof *s->ntop)) == TK_OK &&
        (rc = grow_one((void **)&s->top_ids, s->n, k * sizeof *s->top_ids)) == TK_OK)
        rc = grow_one((void **)&s->top_lps, s->n, k * sizeof *s->top_lps);
    if (rc != TK_OK)
        return rc;
    if (s->logprobs)
        s->logprobs[s->n] = ev->logprob;
    if (k) {
        size_t at = s->n * k;
        s->ktop = (int)k;
        s->ntop[s->n] = ev->ntop;
        memcpy(s->top_ids + at, ev->top_ids, (size_t)ev->ntop * sizeof *s->top_ids);
        memcpy(s->top_lps + at, ev->top_logprobs, (size_t)ev->ntop * sizeof *s->top_lps);
    }
    s->ids[s->n++] = ev->token;
    return TK_OK;
}

/* tk_generate's greedy decoding and sampling: every prompt in the engine, stepped to the end. */
static int run_sample(tk_gen_seq *out, tk_gen_stats *st, const tk_gen_lm *lm, const int32_t *const *prompts,
                      const size_t *lens, size_t np, const tk_gen_opts *o)
{
    engine E;
    memset(&E, 0, sizeof E);
    E.lm = *lm;
    int rc = TK_OK;
    tk_buf *texts = calloc(np, sizeof *texts);
    int *ended = calloc(np, sizeof *ended);
    if (!texts || !ended) {
        rc = tk__err(TK_ERR_NOMEM, "generate: out of memory for %zu prompts", np);
        goto done;
    }
    for (size_t i = 0; i < np; i++) {
        int64_t id;
        if ((rc = eng_add(&E, &id, prompts[i], lens[i], 1, o)) != TK_OK)
            goto done;
        out[i].end = TK_GEN_END_LENGTH;
    }
    for (size_t i = 0; i < np; i++)
        st->prefill_tokens += (int64_t)lens[i];
    double t0 = now_ms();
    for (int first = 1; E.n > 0; first = 0) {
        const tk_gen_event *ev;
        size_t nev;
        if ((rc = eng_step(&E, &ev, &nev)) != TK_OK)
            goto done;
        st->steps++;
        for (size_t k = 0; k < nev; k++) {
            size_t i = (size_t)ev[k].seq;
            tk_gen_seq *s = &out[i];
            if (ev[k].end && !strcmp(ev[k].end, "error")) {
                rc = tk__err(TK_ERR_INVALID, "%s", E.err);
                goto done;
            }
            if ((rc = res_push(s, &ev[k], o)) != TK_OK ||
                (ev[k].len && (rc = tk__buf_append(&texts[i], ev[k].text, ev[k].len)) != TK_OK))
                goto done;
            if (!first)
                st->decode_tokens++;
            if (ev[k].end)
                s->end = !strcmp(ev[k].end, "eos")           ? TK_GEN_END_EOS
                         : !strcmp(ev[k].end, "stop_string") ? TK_GEN_END_STOP
                                                             : TK_GEN_END_LENGTH;
            if (o->stream && o->stream(o->stream_user, i, ev[k].token, ev[k].text, ev[k].len) && !ev[k].end) {
                s->end = TK_GEN_END_CALLBACK;
                if ((rc = eng_cancel(&E, ev[k].seq)) != TK_OK)
                    goto done;
            }
        }
        if (first) { /* the first tokens came from the prefill: decode timing starts here */
            st->prefill_ms += now_ms() - t0;
            t0 = now_ms();
        }
    }
    st->decode_ms += now_ms() - t0;
    for (size_t i = 0; i < np; i++)
        if (lm->decode && !(out[i].text = texts[i].len ? tk__buf_steal(&texts[i]) : tk__strdup(""))) {
            rc = tk__err(TK_ERR_NOMEM, "generate: out of memory");
            goto done;
        }
done:
    for (size_t i = 0; texts && i < np; i++)
        tk__buf_free(&texts[i]);
    free(texts);
    free(ended);
    eng_free(&E);
    return rc;
}

/* ---- beam search ------------------------------------------------------------------------------ */

/* transformers' vectorised beam search (generation/utils.py _beam_search), one prompt's state: the
 * running beams with their summed log-probabilities, the best finished hypotheses with their
 * length-penalised scores, and the early-stop heuristic. Scores are f32 as there, the -1e9 markers
 * included. */
typedef struct {
    gseq *run, *fin;
    int *is_fin;
    int unsat, active;
    int64_t max_len;
} bstate;

typedef struct {
    float v;
    int64_t i;
} cand;

/* Keeps the k largest of (v, i) in c[0..*n), sorted by v descending then i ascending. */
static void topk_insert(cand *c, size_t *n, size_t k, float v, int64_t i)
{
    if (v != v)
        return;
    if (*n == k && !(v > c[k - 1].v))
        return; /* ties keep the lower index, already in */
    size_t j = *n < k ? (*n)++ : k - 1;
    while (j > 0 && v > c[j - 1].v) {
        c[j] = c[j - 1];
        j--;
    }
    c[j].v = v;
    c[j].i = i;
}

/* A logits row that holds a NaN or a +inf: its log-softmax is NaN everywhere (torch's too), so beam search
 * has no scores to rank its continuations by, and fails (beam_nonfinite) rather than ranking NaN. */
static int row_nonfinite(const float *x, int64_t V)
{
    for (int64_t i = 0; i < V; i++)
        if (x[i] != x[i] || x[i] == INFINITY)
            return 1;
    return 0;
}

/* The error for prompt p whose beam j's logits hold a NaN or a +inf (the same from one process and from
 * the ranks' pick, which find the same first row: prompts in order, then beams). */
static int beam_nonfinite(const bstate *b, size_t p, size_t j)
{
    return tk__err(TK_ERR_INVALID,
                   "generate: beam search, prompt %zu, step %zu: the logits of beam %zu hold NaN or +inf, whose "
                   "log-softmax is NaN: the beams have no scores to rank\nHINT: the model's weights or inputs give "
                   "non-finite logits; greedy decoding picks a NaN (as torch.argmax) and sampling counts it as -inf",
                   p, b->run[0].n - b->run[0].plen, j);
}

static float lp_div(float score, int64_t len, double length_penalty)
{
    return score / (float)pow((double)len, length_penalty);
}

static int beam_hit(const tk_gen_lm *lm, const tk_gen_opts *o, const gseq *b, int32_t tok, int64_t max_len, int *why)
{
    if (is_eos(o, tok))
        return *why = TK_GEN_END_EOS, 1;
    if ((int64_t)b->n + 1 >= max_len)
        return *why = TK_GEN_END_LENGTH, 1;
    if (o->n_stop) {
        gseq t = {0};
        int rc = seq_copy(&t, b);
        if (!rc)
            rc = seq_push(&t, tok);
        if (!rc)
            rc = seq_decode(lm, &t);
        if (rc) {
            seq_clear(&t);
            return rc;
        }
        int hit = hits_stop(o, t.text, 0);
        seq_clear(&t);
        if (hit)
            return *why = TK_GEN_END_STOP, 1;
    }
    return 0;
}

/* run_beam's buffers: the packed step input (slots, cu, ids) and its logits, one prompt's candidates
 * (c: the K best (score, beam * V + token); hit/why: whether and why each one finished) and the next
 * running beams and finished hypotheses being built (nrun, nfin, nis), reused from prompt to prompt. */
typedef struct {
    int64_t V;
    size_t nb, K;
    int32_t *slots, *cu, *ids;
    float *logits, *row;
    cand *c, *nx;
    int *hit, *why;
    gseq *nrun, *nfin;
    int *nis;
    size_t nc;   /* candidates in c */
    int all_hit; /* every candidate finished */
    int local;   /* a vocabulary-parallel head (beam_local): the step's candidates come from pc */
    cand *pc;    /* with local: each prompt's K candidates, pnc[p] of them, over every rank */
    size_t *pnc;
} bwork;

/* The model's step; with w->local, a split head leaves each rank its own columns of the logits (the
 * rest -inf). */
static int beam_forward(const bwork *w, const tk_gen_lm *lm, size_t nrows)
{
    if (w->local)
        lm->tp->tp->local_logits = 1;
    int rc = lm->step(lm->self, w->slots, nrows, w->ids, w->cu, w->logits);
    if (w->local)
        lm->tp->tp->local_logits = 0;
    return rc;
}

/* Beam search over a vocabulary-parallel head picks on the ranks' columns (beam_cands_local) when that
 * sends fewer bytes than the rows would (a beam's row: 8 + 16 bytes, a prompt's candidates 16 each), or
 * as TK_TP_PICK forces. The same on every rank. */
static int beam_local(const tk_gen_lm *lm, const tk_gen_opts *o, size_t K)
{
    const char *env = getenv("TK_TP_PICK");
    if (!lm->tp || (env && !strcmp(env, "gather")))
        return 0;
    if (env && !strcmp(env, "local"))
        return 1;
    int64_t W = lm->tp->tp->world, C = (lm->vocab + W - 1) / W, nb = o->num_beams;
    return nb * 24 + (int64_t)K * 16 < nb * C * 4;
}

/* descending by value, ties by the lower index: topk_insert's order */
static int cmp_cand(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->v != y->v)
        return x->v > y->v ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

/* This rank's K best continuations of prompt b's beams (logits rows lg + j * stride, already log-softmax
 * over the ranks), as beam_select takes them over a whole row, into o[2K]: (value bits, beam * V + token)
 * pairs, -1 padded. */
static int beam_part(bwork *w, bstate *b, const tk_gen_lm *lm, const tk_gen_opts *o, const float *lg, size_t stride,
                     int64_t *out)
{
    const int64_t V = w->V, off = lm->tp->tp->vocab_off, len = lm->tp->tp->vocab_len;
    size_t nc = 0;
    int rc;
    for (size_t j = 0; j < w->nb; j++) {
        memcpy(w->row, lg + j * stride, (size_t)V * sizeof *w->row);
        if ((rc = process_row(w->row, V, &b->run[j], o)))
            return rc;
        float sc = b->run[j].score;
        for (int64_t v = off; v < off + len; v++)
            topk_insert(w->c, &nc, w->K, w->row[v] + sc, (int64_t)j * V + v);
    }
    for (size_t q = 0; q < w->K; q++) {
        out[2 * q] = q < nc ? (int64_t)tk__f32_bits(w->c[q].v) : -1;
        out[2 * q + 1] = q < nc ? w->c[q].i : -1;
    }
    return TK_OK;
}

/* A step's candidates over a vocabulary-parallel head, for every active prompt into w->pc: the rows'
 * log-softmax over the ranks (tk_models__tp_log_softmax: one process's values), each rank's K best of
 * its columns (beam_part), then the K best of their union in topk_insert's order, which are the K best
 * of the whole rows: three all-gathers a step, where gathering moves every beam's row. */
static int beam_cands_local(bwork *w, bstate *B, size_t np, const tk_gen_lm *lm, const tk_gen_opts *o, int first)
{
    const int64_t V = w->V;
    const size_t K = w->K, W = (size_t)lm->tp->tp->world;
    size_t nrows = 0, na = 0;
    for (size_t p = 0; p < np; p++)
        if (B[p].active)
            nrows += first ? 1 : w->nb, na++;
    float **rows = malloc((nrows + 1) * sizeof *rows);
    int64_t *mine = malloc((2 * K * na + 1) * sizeof *mine), *all = malloc((W * 2 * K * na + 1) * sizeof *all);
    cand *u = malloc((W * K + 1) * sizeof *u);
    int rc = rows && mine && all && u ? TK_OK : tk__err(TK_ERR_NOMEM, "generate: out of memory for beams");
    for (size_t k = 0, p = 0; rc == TK_OK && p < np; p++)
        if (B[p].active)
            for (size_t j = 0; j < (first ? 1 : w->nb); j++, k++)
                rows[k] = w->logits + (first ? p : k) * (size_t)V;
    size_t bad = nrows;
    if (rc == TK_OK)
        rc = tk_models__tp_log_softmax(lm->tp, rows, nrows, &bad);
    for (size_t p = 0, k = 0; rc == TK_OK && bad < nrows && p < np; p++) /* the row's prompt and beam */
        for (size_t j = 0; B[p].active && j < (first ? 1 : w->nb); j++, k++)
            if (k == bad)
                rc = beam_nonfinite(&B[p], p, j);
    for (size_t p = 0, a = 0, r = 0; rc == TK_OK && p < np; p++) {
        if (!B[p].active)
            continue;
        rc = beam_part(w, &B[p], lm, o, w->logits + (first ? p : r) * (size_t)V, first ? 0 : (size_t)V,
                       mine + 2 * K * a++);
        r += first ? 0 : w->nb;
    }
    if (rc == TK_OK)
        rc = tk_models__tp_gather_i64(lm->tp, all, mine, 2 * K * na, "the beams' candidates");
    for (size_t p = 0, a = 0; rc == TK_OK && p < np; p++) {
        if (!B[p].active)
            continue;
        size_t nu = 0;
        for (size_t r = 0; r < W; r++)
            for (size_t q = 0; q < K; q++) {
                const int64_t *x = all + r * 2 * K * na + 2 * K * a + 2 * q;
                if (x[1] >= 0)
                    u[nu].v = tk__bits_f32((uint32_t)x[0]), u[nu++].i = x[1];
            }
        qsort(u, nu, sizeof *u, cmp_cand);
        w->pnc[p] = nu < K ? nu : K;
        memcpy(w->pc + p * K, u, w->pnc[p] * sizeof *u);
        a++;
    }
    free(rows);
    free(mine);
    free(all);
    free(u);
    return rc;
}

/* Prefill: each prompt once, one row of logits each, before beam_init forks the prompt's cache into
 * its beams. Not shared with greedy and sampling: they prefill inside the step engine (eng_add and
 * eng_step: the prefix cache, prompts joining a running batch, a prompt's followers), which beam search
 * does not run through. */
static int beam_prefill(bwork *w, tk_gen_stats *st, const tk_gen_lm *lm, const gseq *S, size_t np, size_t tot)
{
    size_t pos = 0;
    w->cu[0] = 0;
    for (size_t p = 0; p < np; p++) {
        w->slots[p] = S[p].slot;
        memcpy(w->ids + pos, S[p].ids, S[p].n * sizeof *w->ids);
        pos += S[p].n;
        w->cu[p + 1] = (int32_t)pos;
    }
    double t0 = now_ms();
    int rc = beam_forward(w, lm, np);
    if (rc)
        return rc;
    st->prefill_ms += now_ms() - t0;
    st->prefill_tokens += (int64_t)tot;
    return TK_OK;
}

/* The running beams: the prompt nb times (beam 0 scores 0, the others -1e9), sharing its cache. */
static int beam_init(bstate *B, gseq *S, const tk_gen_lm *lm, size_t np, size_t nb, const int64_t *max_new)
{
    int rc;
    for (size_t p = 0; p < np; p++) {
        bstate *b = &B[p];
        b->run = calloc(nb, sizeof *b->run);
        b->fin = calloc(nb, sizeof *b->fin);
        b->is_fin = calloc(nb, sizeof *b->is_fin);
        for (size_t j = 0; j < nb; j++) {
            if (b->run)
                b->run[j].slot = -1;
            if (b->fin)
                b->fin[j].slot = -1;
        }
        if (!b->run || !b->fin || !b->is_fin)
            return tk__err(TK_ERR_NOMEM, "generate: out of memory for beams");
        b->unsat = b->active = 1;
        b->max_len = (int64_t)S[p].plen + max_new[p];
        for (size_t j = 0; j < nb; j++) {
            if ((rc = seq_copy(&b->run[j], &S[p])) || (rc = seq_copy(&b->fin[j], &S[p])))
                return rc;
            b->run[j].score = j ? -1e9f : 0.0f;
            b->fin[j].score = -1e9f;
            b->run[j].slot = b->fin[j].slot = -1;
        }
        b->run[0].slot = S[p].slot;
        S[p].slot = -1; /* the beams own it now */
        for (size_t j = 1; j < nb; j++)
            if ((rc = lm->seq_fork(lm->self, &b->run[j].slot, b->run[0].slot)))
                return rc;
    }
    return TK_OK;
}

/* One step's candidate selection for one prompt: the K best continuations of its beams (beam j's
 * logits at lg + j * stride), which of them finish (eos, length, stop string), and the next running
 * beams, the nb best that did not finish, in w->nrun (each with a fork of its parent's cache, unless
 * every candidate finished). */
static int beam_select(bwork *w, bstate *b, const tk_gen_lm *lm, const tk_gen_opts *o, const float *lg, size_t stride,
                       size_t p)
{
    const int64_t V = w->V;
    const size_t nb = w->nb;
    cand *c = w->c;
    int rc;
    size_t nc = 0;
    if (w->local) { /* beam_cands_local found them over the ranks */
        nc = w->pnc[p];
        memcpy(c, w->pc + p * w->K, nc * sizeof *c);
    }
    for (size_t j = 0; j < nb && !w->local; j++) {
        memcpy(w->row, lg + j * stride, (size_t)V * sizeof *w->row);
        if (row_nonfinite(w->row, V))
            return beam_nonfinite(b, p, j);
        tk_gen__log_softmax(w->row, V);
        if ((rc = process_row(w->row, V, &b->run[j], o)))
            return rc;
        float sc = b->run[j].score;
        for (int64_t v = 0; v < V; v++)
            topk_insert(c, &nc, w->K, w->row[v] + sc, (int64_t)j * V + v);
    }
    w->nc = nc;
    for (size_t j = 0; j < nc; j++) {
        const gseq *src = &b->run[c[j].i / V];
        w->why[j] = 0;
        int h = beam_hit(lm, o, src, (int32_t)(c[j].i % V), b->max_len, &w->why[j]);
        if (h < 0)
            return h;
        w->hit[j] = h;
    }
    w->all_hit = 1;
    for (size_t j = 0; j < nc; j++)
        w->all_hit &= w->hit[j];
    /* the next running beams: the best candidates that did not finish */
    size_t nn = 0;
    for (size_t j = 0; j < nc; j++)
        topk_insert(w->nx, &nn, nb, c[j].v + (w->hit[j] ? -1.0e9f : 0.0f), (int64_t)j);
    for (size_t i = 0; i < nn; i++) {
        const cand *cj = &c[w->nx[i].i];
        const gseq *src = &b->run[cj->i / V];
        seq_clear(&w->nrun[i]);
        if ((rc = seq_copy(&w->nrun[i], src)) || (rc = seq_push(&w->nrun[i], (int32_t)(cj->i % V))))
            return rc;
        w->nrun[i].score = w->nx[i].v;
        w->nrun[i].slot = -1;
        if (!w->all_hit && (rc = lm->seq_fork(lm->self, &w->nrun[i].slot, src->slot)))
            return rc;
    }
    return TK_OK;
}

/* The finished-hypothesis merge: the nb best of the old finished hypotheses and the candidates among
 * the top nb that just finished (length-penalised at cur_len + 1 - plen), in w->nfin / w->nis. */
static int beam_merge(bwork *w, const bstate *b, const tk_gen_opts *o, int64_t cur_len, size_t plen)
{
    const int64_t V = w->V;
    const size_t nb = w->nb;
    int rc;
    int full = 1;
    for (size_t j = 0; j < nb; j++)
        full &= b->is_fin[j];
    full &= o->early_stopping == TK_GEN_EARLY_TRUE;
    size_t nm = 0;
    for (size_t j = 0; j < nb; j++)
        topk_insert(w->nx, &nm, nb, b->fin[j].score, (int64_t)j);
    for (size_t j = 0; j < w->nc; j++) {
        float f = lp_div(w->c[j].v, cur_len + 1 - (int64_t)plen, o->length_penalty);
        f += full ? -1.0e9f : 0.0f;
        f += b->unsat ? 0.0f : -1.0e9f;
        f += (w->hit[j] && j < nb) ? 0.0f : -1.0e9f;
        topk_insert(w->nx, &nm, nb, f, (int64_t)(nb + j));
    }
    for (size_t i = 0; i < nm; i++) {
        gseq *nf = &w->nfin[i];
        seq_clear(nf);
        int64_t m = w->nx[i].i;
        if (m < (int64_t)nb) {
            if ((rc = seq_copy(nf, &b->fin[m])))
                return rc;
            w->nis[i] = b->is_fin[m];
        } else {
            const cand *cj = &w->c[m - (int64_t)nb];
            if ((rc = seq_copy(nf, &b->run[cj->i / V])) || (rc = seq_push(nf, (int32_t)(cj->i % V))))
                return rc;
            w->nis[i] = w->hit[m - (int64_t)nb] && (size_t)(m - (int64_t)nb) < nb;
            nf->end = w->why[m - (int64_t)nb];
        }
        nf->score = w->nx[i].v;
        nf->slot = -1;
    }
    return TK_OK;
}

/* The new beams and hypotheses replace the old ones; then the early-stop heuristic, with the new
 * length, decides whether the prompt goes on (b->active; its caches are freed when it does not). */
static void beam_advance(bwork *w, bstate *b, const tk_gen_lm *lm, const tk_gen_opts *o, int64_t cur_len, size_t plen)
{
    const size_t nb = w->nb;
    for (size_t j = 0; j < nb; j++) {
        if (b->run[j].slot >= 0)
            lm->seq_free(lm->self, b->run[j].slot);
        seq_clear(&b->run[j]);
        seq_clear(&b->fin[j]);
        b->run[j] = w->nrun[j];
        b->fin[j] = w->nfin[j];
        b->is_fin[j] = w->nis[j];
        memset(&w->nrun[j], 0, sizeof w->nrun[j]);
        memset(&w->nfin[j], 0, sizeof w->nfin[j]);
        w->nrun[j].slot = w->nfin[j].slot = -1;
    }
    int64_t best_len = (o->early_stopping == TK_GEN_EARLY_NEVER && o->length_penalty > 0) ? b->max_len - (int64_t)plen
                                                                                          : cur_len + 1 - (int64_t)plen;
    float best_run = lp_div(b->run[0].score, best_len, o->length_penalty);
    float worst = INFINITY;
    for (size_t j = 0; j < nb; j++)
        if (b->fin[j].score < worst)
            worst = b->fin[j].score;
    int any = 0;
    for (size_t j = 0; j < nb; j++)
        any |= best_run > (b->is_fin[j] ? worst : -1.0e9f);
    b->unsat = b->unsat && any;
    int all_fin = 1;
    for (size_t j = 0; j < nb; j++)
        all_fin &= b->is_fin[j];
    int open = !(all_fin && o->early_stopping == TK_GEN_EARLY_TRUE);
    b->active = b->unsat && open && !w->all_hit;
    if (!b->active)
        for (size_t j = 0; j < nb; j++)
            if (b->run[j].slot >= 0) {
                lm->seq_free(lm->self, b->run[j].slot);
                b->run[j].slot = -1;
            }
}

/* Prompt p's answer: its best finished hypothesis, decoded, and streamed token by token. */
static int beam_answer(gseq *Sp, size_t p, bstate *b, const tk_gen_lm *lm, const tk_gen_opts *o)
{
    gseq *best = &b->fin[0];
    free(Sp->ids);
    free(Sp->text);
    Sp->ids = best->ids;
    Sp->n = best->n;
    Sp->cap = best->cap;
    Sp->text = NULL;
    Sp->score = best->score;
    int32_t last = Sp->n > Sp->plen ? Sp->ids[Sp->n - 1] : -1;
    Sp->end = is_eos(o, last) ? TK_GEN_END_EOS : best->end == TK_GEN_END_STOP ? TK_GEN_END_STOP : TK_GEN_END_LENGTH;
    best->ids = NULL;
    int rc = seq_decode(lm, Sp);
    if (rc || !o->stream)
        return rc;
    gseq t = {0}; /* the winner, token by token */
    t.plen = Sp->plen;
    for (size_t i = 0; i < Sp->plen && !rc; i++)
        rc = seq_push(&t, Sp->ids[i]);
    for (size_t i = Sp->plen; i < Sp->n && !rc; i++) {
        if ((rc = seq_push(&t, Sp->ids[i])) || (rc = seq_decode(lm, &t)))
            break;
        if (stream_token(o, p, &t, Sp->ids[i], i + 1 == Sp->n))
            break;
    }
    seq_clear(&t);
    return rc;
}

static void beam_free(bstate *B, size_t np, bwork *w, const tk_gen_lm *lm)
{
    const size_t nb = w->nb;
    for (size_t p = 0; B && p < np; p++) {
        for (size_t j = 0; j < nb; j++) {
            if (B[p].run && B[p].run[j].slot >= 0)
                lm->seq_free(lm->self, B[p].run[j].slot);
            if (B[p].run)
                seq_clear(&B[p].run[j]);
            if (B[p].fin)
                seq_clear(&B[p].fin[j]);
        }
        free(B[p].run);
        free(B[p].fin);
        free(B[p].is_fin);
    }
    for (size_t j = 0; w->nrun && j < nb; j++) {
        if (w->nrun[j].slot >= 0)
            lm->seq_free(lm->self, w->nrun[j].slot);
        seq_clear(&w->nrun[j]);
    }
    for (size_t j = 0; w->nfin && j < nb; j++)
        seq_clear(&w->nfin[j]);
    free(B);
    free(w->slots);
    free(w->cu);
    free(w->ids);
    free(w->logits);
    free(w->row);
    free(w->c);
    free(w->pc);
    free(w->pnc);
    free(w->nx);
    free(w->hit);
    free(w->why);
    free(w->nrun);
    free(w->nfin);
    free(w->nis);
}

static int run_beam(gseq *S, tk_gen_stats *st, const tk_gen_lm *lm, size_t np, int64_t *max_new, const tk_gen_opts *o)
{
    bwork w = {0};
    w.V = lm->vocab;
    w.nb = (size_t)o->num_beams;
    w.K = (size_t)(o->n_eos + 1 > 2 ? o->n_eos + 1 : 2) * w.nb;
    const int64_t V = w.V;
    const size_t nb = w.nb, K = w.K;
    int rc = TK_OK;
    bstate *B = calloc(np, sizeof *B);
    size_t tot = 0, maxrows = np * nb;
    for (size_t p = 0; p < np; p++)
        tot += S[p].n;
    w.slots = malloc(maxrows * sizeof *w.slots);
    w.cu = malloc((maxrows + 1) * sizeof *w.cu);
    w.ids = malloc((tot > maxrows ? tot : maxrows) * sizeof *w.ids);
    w.logits = malloc(maxrows * (size_t)V * sizeof *w.logits);
    w.row = malloc((size_t)V * sizeof *w.row);
    w.c = malloc(K * sizeof *w.c);
    w.nx = malloc((nb + K) * sizeof *w.nx);
    w.hit = malloc(K * sizeof *w.hit);
    w.why = malloc(K * sizeof *w.why);
    w.nrun = calloc(nb, sizeof *w.nrun);
    w.nfin = calloc(nb, sizeof *w.nfin);
    w.nis = calloc(nb, sizeof *w.nis);
    w.local = beam_local(lm, o, K);
    w.pc = malloc((w.local ? np * K : 1) * sizeof *w.pc);
    w.pnc = calloc(np, sizeof *w.pnc);
    if (!B || !w.slots || !w.cu || !w.ids || !w.logits || !w.row || !w.c || !w.nx || !w.hit || !w.why || !w.nrun ||
        !w.nfin || !w.nis || !w.pc || !w.pnc) {
        rc = tk__err(TK_ERR_NOMEM, "generate: out of memory for %zu beams of %zu prompts", nb, np);
        goto done;
    }
    for (size_t j = 0; j < nb; j++)
        w.nrun[j].slot = w.nfin[j].slot = -1;
    if ((rc = beam_prefill(&w, st, lm, S, np, tot)))
        goto done;
    double t0 = now_ms();
    if ((rc = beam_init(B, S, lm, np, nb, max_new)))
        goto done;
    /* logits rows: after the prefill, row p serves every beam of prompt p */
    int first = 1;
    for (;;) {
        size_t r = 0, nrows = 0;
        if (w.local && (rc = beam_cands_local(&w, B, np, lm, o, first)))
            goto done;
        for (size_t p = 0; p < np; p++) {
            bstate *b = &B[p];
            if (!b->active)
                continue;
            int64_t cur_len = (int64_t)b->run[0].n;
            const float *lg = w.logits + (first ? p : r) * (size_t)V;
            if ((rc = beam_select(&w, b, lm, o, lg, first ? 0 : (size_t)V, p)))
                goto done;
            if (!first)
                r += nb;
            if ((rc = beam_merge(&w, b, o, cur_len, S[p].plen)))
                goto done;
            beam_advance(&w, b, lm, o, cur_len, S[p].plen);
            if (!b->active)
                continue;
            for (size_t j = 0; j < nb; j++) {
                w.slots[nrows] = b->run[j].slot;
                w.ids[nrows] = b->run[j].ids[b->run[j].n - 1];
                w.cu[nrows + 1] = (int32_t)(nrows + 1);
                nrows++;
            }
        }
        st->steps++;
        st->decode_tokens += (int64_t)nrows;
        first = 0;
        if (nrows == 0)
            break;
        if ((rc = beam_forward(&w, lm, nrows)))
            goto done;
    }
    st->decode_ms += now_ms() - t0;
    /* each prompt's answer: its best finished hypothesis */
    for (size_t p = 0; p < np; p++)
        if ((rc = beam_answer(&S[p], p, &B[p], lm, o)))
            goto done;
done:
    beam_free(B, np, &w, lm);
    return rc;
}

/* ---- the driver ------------------------------------------------------------------------------- */

int tk_gen__run(tk_gen_seq *out, tk_gen_stats *stats, const tk_gen_lm *lm, const int32_t *const *prompts,
                const size_t *lens, size_t np, const tk_gen_opts *o)
{
    int rc = tk_gen__check(lm, prompts, lens, np, o);
    if (rc)
        return rc;
    memset(out, 0, np * sizeof *out);
    tk_gen_stats st = {0};
    if (o->num_beams <= 1) {
        if ((rc = run_sample(out, &st, lm, prompts, lens, np, o)) != TK_OK) {
            for (size_t i = 0; i < np; i++)
                tk_gen__seq_free(&out[i]);
            return rc;
        }
        if (stats)
            *stats = st;
        return TK_OK;
    }
    gseq *S = calloc(np, sizeof *S);
    int64_t *max_new = calloc(np, sizeof *max_new);
    if (!S || !max_new) {
        rc = tk__err(TK_ERR_NOMEM, "generate: out of memory for %zu prompts", np);
        goto done;
    }
    for (size_t i = 0; i < np; i++) {
        S[i].slot = -1;
        S[i].plen = lens[i];
        for (size_t j = 0; j < lens[i]; j++)
            if ((rc = seq_push(&S[i], prompts[i][j])))
                goto done;
        max_new[i] = tk_gen__total_length(o, (int64_t)lens[i], lm->max_pos) - (int64_t)lens[i];
        if ((rc = lm->seq_new(lm->self, &S[i].slot)))
            goto done;
    }
    rc = run_beam(S, &st, lm, np, max_new, o);
    if (rc)
        goto done;
    for (size_t i = 0; i < np; i++) {
        size_t n = S[i].n - S[i].plen;
        out[i].ids = malloc((n ? n : 1) * sizeof *out[i].ids);
        if (!out[i].ids) {
            rc = tk__err(TK_ERR_NOMEM, "generate: out of memory");
            goto done;
        }
        memcpy(out[i].ids, S[i].ids + S[i].plen, n * sizeof *out[i].ids);
        out[i].n = n;
        out[i].text = S[i].text;
        S[i].text = NULL;
        out[i].end = S[i].end;
        out[i].score = S[i].score;
    }
    if (stats)
        *stats = st;
done:
    for (size_t i = 0; S && i < np; i++) {
        if (S[i].slot >= 0)
            lm->seq_free(lm->self, S[i].slot);
        seq_clear(&S[i]);
    }
    if (rc)
        for (size_t i = 0; i < np; i++)
            tk_gen__seq_free(&out[i]);
    free(S);
    free(max_new);
    return rc;
}

void tk_gen__seq_free(tk_gen_seq *s)
{
    if (!s)
        return;
    free(s->ids);
    free(s->text);
    free(s->logprobs);
    free(s->top_ids);
    free(s->top_lps);
    free(s->ntop);
    memset(s, 0, sizeof *s);
}

/* ---- the language models generation drives ---------------------------------------------------- */

typedef struct {
    tk_model *m;
    tk_kv *kv;
    /* full recompute, and the KV cache under LongRoPE: each slot's whole sequence */
    struct {
        int32_t *ids;
        size_t n, cap;
        int used;
    } *full;
    size_t nfull;
    float *all_logits;
    size_t all_cap;
} lm_state;

static int lm_decode(void *self, const int32_t *ids, size_t n, char **text)
{
    lm_state *s = self;
    return tk_tokenizer_decode(text, s->m->tok, ids, n, 1);
}

static int full_push(lm_state *s, int32_t slot, const int32_t *ids, size_t n);

/* LongRoPE (models/llama.c, rope_table) rotates a sequence longer than original_max_position_embeddings
 * with its long factors at every position. A sequence crossing that length in this step holds keys
 * rotated with the short ones, so it is run again from its first token, as transformers' Phi-3 does
 * (prepare_inputs_for_generation drops the cache once, when the input first passes that length). */
static int longrope(const lm_state *s) { return s->m->cfg.rope.type == TK_ROPE_LONGROPE; }

/* A sequence that held had tokens and takes n more crosses original_max_position_embeddings now. */
static int crosses(const lm_state *s, size_t had, size_t n)
{
    int64_t omax = s->m->cfg.rope.original_max_pos;
    return had > 0 && (int64_t)had <= omax && (int64_t)(had + n) > omax;
}

static int kv_step(void *self, const int32_t *slots, size_t nseq, const int32_t *ids, const int32_t *cu, float *logits)
{
    lm_state *s = self;
    if (!longrope(s))
        return tk_models__forward_kv(s->m, s->kv, slots, nseq, ids, cu, logits);
    size_t tot = 0, again = 0;
    int rc;
    for (size_t i = 0; i < nseq; i++) {
        size_t had = s->full[slots[i]].n, n = (size_t)(cu[i + 1] - cu[i]);
        if ((int64_t)had != s->kv->seq[slots[i]].len)
            return tk__err(TK_ERR_INTERNAL, "generate: the KV cache holds %lld tokens of sequence %d, its history %zu",
                           (long long)s->kv->seq[slots[i]].len, slots[i], had);
        if ((rc = full_push(s, slots[i], ids + cu[i], n)) != TK_OK)
            return rc;
        int cross = crosses(s, had, n);
        tot += cross ? had + n : n;
        again += cross;
    }
    if (!again)
        return tk_models__forward_kv(s->m, s->kv, slots, nseq, ids, cu, logits);
    int32_t *all = malloc(tot * sizeof *all), *cu2 = malloc((nseq + 1) * sizeof *cu2);
    if (!all || !cu2) {
        free(all);
        free(cu2);
        return tk__err(TK_ERR_NOMEM, "generate: out of memory");
    }
    cu2[0] = 0;
    for (size_t i = 0; i < nseq; i++) {
        size_t n = (size_t)(cu[i + 1] - cu[i]), had = s->full[slots[i]].n - n;
        if (crosses(s, had, n)) { /* the whole sequence, on an emptied slot */
            tk_kv__seq_reset(s->kv, slots[i]);
            memcpy(all + cu2[i], s->full[slots[i]].ids, (had + n) * sizeof *all);
            n += had;
        } else {
            memcpy(all + cu2[i], ids + cu[i], n * sizeof *all);
        }
        cu2[i + 1] = cu2[i] + (int32_t)n;
    }
    rc = tk_models__forward_kv(s->m, s->kv, slots, nseq, all, cu2, logits);
    free(all);
    free(cu2);
    return rc;
}

/* LongRoPE: slot's history, emptied (the array grown to hold it: KV slots index it). */
static int hist_at(lm_state *s, int32_t slot)
{
    if ((size_t)slot >= s->nfull) {
        void *p = realloc(s->full, ((size_t)slot + 1) * sizeof *s->full);
        if (!p)
            return tk__err(TK_ERR_NOMEM, "generate: out of memory");
        s->full = p;
        memset(&s->full[s->nfull], 0, ((size_t)slot + 1 - s->nfull) * sizeof *s->full);
        s->nfull = (size_t)slot + 1;
    }
    s->full[slot].used = 1;
    s->full[slot].n = 0;
    return TK_OK;
}

static int kv_new(void *self, int32_t *slot)
{
    lm_state *s = self;
    int rc = tk_kv__seq_new(s->kv, slot);
    if (rc == TK_OK && longrope(s) && (rc = hist_at(s, *slot)) != TK_OK)
        tk_kv__seq_free(s->kv, *slot);
    return rc;
}

static int kv_fork(void *self, int32_t *dst, int32_t src)
{
    lm_state *s = self;
    int rc = tk_kv__seq_fork(s->kv, dst, src);
    if (rc == TK_OK && longrope(s) &&
        ((rc = hist_at(s, *dst)) != TK_OK || (rc = full_push(s, *dst, s->full[src].ids, s->full[src].n)) != TK_OK))
        tk_kv__seq_free(s->kv, *dst);
    return rc;
}

static void kv_del(void *self, int32_t slot)
{
    lm_state *s = self;
    tk_kv__seq_free(s->kv, slot);
    if (longrope(s) && (size_t)slot < s->nfull)
        s->full[slot].used = 0;
}

static int full_new(void *self, int32_t *slot)
{
    lm_state *s = self;
    for (size_t i = 0; i < s->nfull; i++)
        if (!s->full[i].used) {
            s->full[i].used = 1;
            s->full[i].n = 0;
            *slot = (int32_t)i;
            return TK_OK;
        }
    void *p = realloc(s->full, (s->nfull + 1) * sizeof *s->full);
    if (!p)
        return tk__err(TK_ERR_NOMEM, "generate: out of memory");
    s->full = p;
    memset(&s->full[s->nfull], 0, sizeof *s->full);
    s->full[s->nfull].used = 1;
    *slot = (int32_t)s->nfull++;
    return TK_OK;
}

static int full_push(lm_state *s, int32_t slot, const int32_t *ids, size_t n)
{
    if (s->full[slot].n + n > s->full[slot].cap) {
        size_t c = (s->full[slot].n + n) * 2;
        int32_t *p = realloc(s->full[slot].ids, c * sizeof *p);
        if (!p)
            return tk__err(TK_ERR_NOMEM, "generate: out of memory");
        s->full[slot].ids = p;
        s->full[slot].cap = c;
    }
    memcpy(s->full[slot].ids + s->full[slot].n, ids, n * sizeof *ids);
    s->full[slot].n += n;
    return TK_OK;
}

static int full_fork(void *self, int32_t *dst, int32_t src)
{
    lm_state *s = self;
    int rc = full_new(self, dst);
    if (!rc)
        rc = full_push(s, *dst, s->full[src].ids, s->full[src].n);
    return rc;
}

static void full_del(void *self, int32_t slot) { ((lm_state *)self)->full[slot].used = 0; }

/* The reference: every step runs the whole sequences through tk_model_forward. */
static int full_step(void *self, const int32_t *slots, size_t nseq, const int32_t *ids, const int32_t *cu,
                     float *logits)
{
    lm_state *s = self;
    int64_t V = s->m->cfg.vocab;
    size_t tot = 0;
    int rc;
    for (size_t i = 0; i < nseq; i++) {
        if ((rc = full_push(s, slots[i], ids + cu[i], (size_t)(cu[i + 1] - cu[i]))))
            return rc;
        tot += s->full[slots[i]].n;
    }
    int32_t *all = malloc(tot * sizeof *all);
    size_t *lens = malloc(nseq * sizeof *lens);
    if (tot * (size_t)V > s->all_cap) {
        free(s->all_logits);
        s->all_logits = malloc(tot * (size_t)V * sizeof *s->all_logits);
        s->all_cap = s->all_logits ? tot * (size_t)V : 0;
    }
    if (!all || !lens || !s->all_logits) {
        free(all);
        free(lens);
        return tk__err(TK_ERR_NOMEM, "generate: out of memory for the logits of %zu tokens", tot);
    }
    size_t p = 0;
    for (size_t i = 0; i < nseq; i++) {
        memcpy(all + p, s->full[slots[i]].ids, s->full[slots[i]].n * sizeof *all);
        p += lens[i] = s->full[slots[i]].n;
    }
    rc = tk_model_forward(s->m, all, lens, nseq, s->all_logits, NULL);
    p = 0;
    for (size_t i = 0; rc == TK_OK && i < nseq; i++) {
        p += lens[i];
        memcpy(logits + i * (size_t)V, s->all_logits + (p - 1) * (size_t)V, (size_t)V * sizeof *logits);
    }
    free(all);
    free(lens);
    return rc;
}

static void lm_state_free(lm_state *s)
{
    tk_kv__free(s->kv);
    for (size_t i = 0; i < s->nfull; i++)
        free(s->full[i].ids);
    free(s->full);
    free(s->all_logits);
}

/* The language model generation drives over m: its KV cache (use_cache) or the full recompute. */
static int lm_setup(tk_gen_lm *lm, lm_state *s, tk_model *m, int use_cache, const char *kv_dtype, int64_t block_size,
                    int64_t max_bytes)
{
    int rc = TK_OK;
    if (!m->tok) {
        char *tj = tk__path_join(m->dir, "tokenizer.json");
        if (tj && tk__path_exists(tj) && (rc = tk_tokenizer_load(&m->tok, m->dir)) != TK_OK) {
            free(tj);
            return rc;
        }
        free(tj);
    }
    *lm = (tk_gen_lm){s,
                      m->ctx,
                      m->cfg.vocab,
                      m->cfg.max_pos,
                      full_step,
                      full_new,
                      full_fork,
                      full_del,
                      m->tok ? lm_decode : NULL,
                      tk_models__tp_vocab_parallel(m) ? m : NULL};
    if (!use_cache)
        return TK_OK;
    tk_dtype dt = m->dtype;
    if (kv_dtype && (rc = tk_dtype_parse(&dt, kv_dtype)) != TK_OK)
        return rc;
    int quant = (dt.code == TK_DL_INT && dt.bits == 8) || dt.code == TK_DL_FLOAT8_E4M3FN;
    /* an f32 model on the CPU may keep its cache in f16 / bf16: half the bytes attention reads a step */
    int narrow = m->dtype.code == TK_DL_FLOAT && m->dtype.bits == 32 && dt.bits == 16 &&
                 (dt.code == TK_DL_FLOAT || dt.code == TK_DL_BFLOAT);
    if (narrow && m->dev_type != TK_DEV_CPU)
        return tk__err(TK_ERR_INVALID,
                       "generate: kv_dtype '%s' under an f32 model runs on the CPU only (the GPU "
                       "decode kernels take a cache in the compute dtype)\nHINT: load the model in %s (--dtype %s), "
                       "or quantise the cache (--kv-dtype i8)",
                       kv_dtype, kv_dtype, kv_dtype);
    if (!quant && !narrow && (dt.code != m->dtype.code || dt.bits != m->dtype.bits))
        return tk__err(TK_ERR_INVALID,
                       "generate: kv_dtype '%s' is not a cache dtype for this %s model: the "
                       "cache holds the compute dtype (%s)%s, or i8 / fp8_e4m3\nHINT: load the model in %s "
                       "(--dtype), or quantise the cache (--kv-dtype i8)",
                       kv_dtype, tk_dtype_name(m->dtype), tk_dtype_name(m->dtype),
                       m->dtype.bits == 32 && m->dtype.code == TK_DL_FLOAT ? ", f16, bf16" : "", kv_dtype);
    const tk_models_config *c = &m->cfg;
    if ((rc = tk_kv__new(&s->kv, c->layers, tk_models__kv_heads(m), c->head_dim, dt, block_size, max_bytes, m->dev_type,
                         m->dev_id)) != TK_OK)
        return rc;
    lm->step = kv_step;
    lm->seq_new = kv_new;
    lm->seq_fork = kv_fork;
    lm->seq_free = kv_del;
    return TK_OK;
}

/* ---- the public API --------------------------------------------------------------------------- */

#define BATCH_MAGIC 0x67656e62u /* "genb" */

struct tk_gen_batch {
    uint32_t magic;
    tk_model *m;
    lm_state s;
    engine E;
};

int tk_gen_batch_new(tk_gen_batch **out, tk_model *m, const tk_gen_batch_opts *opts)
{
    if (!out)
        return tk__err(TK_ERR_INVALID, "tk_gen_batch_new: out is NULL");
    *out = NULL;
    tk_gen_batch_opts def = TK_GEN_BATCH_OPTS_INIT;
    const tk_gen_batch_opts *o = opts ? opts : &def;
    if (o->version != TK_GEN_BATCH_OPTS_VERSION)
        return tk__err(TK_ERR_INVALID,
                       "tk_gen_batch_new: options have version %u, want %u\nHINT: declare them "
                       "with TK_GEN_BATCH_OPTS_INIT",
                       o->version, (unsigned)TK_GEN_BATCH_OPTS_VERSION);
    if (!m || m->magic == 0)
        return tk__err(TK_ERR_INVALID, "tk_gen_batch_new: not a loaded tk_model");
    if (!tk_model_has_lm_head(m))
        return tk__err(TK_ERR_INVALID,
                       "%s has no LM head: it cannot generate text\nHINT: generation needs a causal "
                       "LM (LlamaForCausalLM, GPT2LMHeadModel, ...)",
                       m->cfg.arch);
    if (o->max_step_tokens < 0)
        return tk__err(TK_ERR_INVALID, "tk_gen_batch_new: max_step_tokens is %lld, want >= 0 (0: no bound)",
                       (long long)o->max_step_tokens);
    tk_gen_batch *b = calloc(1, sizeof *b);
    if (!b)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    b->magic = BATCH_MAGIC;
    b->m = m;
    b->s.m = m;
    int rc = lm_setup(&b->E.lm, &b->s, m, o->use_cache, o->kv_dtype, o->kv_block_size, o->kv_max_bytes);
    if (rc != TK_OK) {
        lm_state_free(&b->s);
        free(b);
        return rc;
    }
    b->E.lm.self = &b->s;
    b->E.kv = b->s.kv;
    if (b->s.kv && o->kv_max_tokens > 0) {
        int64_t mb = (o->kv_max_tokens + b->s.kv->block_size - 1) / b->s.kv->block_size;
        if (!b->s.kv->max_blocks || mb < b->s.kv->max_blocks)
            b->s.kv->max_blocks = mb;
    }
    b->E.max_step_tokens = o->max_step_tokens;
    /* LongRoPE: a prefix's keys are rotated by the length of the sequence that made them (short or long
     * factors), so another sequence cannot take them; kv_step keeps each slot's history instead */
    b->E.prefix_cache = o->prefix_cache && b->s.kv && !longrope(&b->s);
    *out = b;
    return TK_OK;
}

void tk_gen_batch_free(tk_gen_batch *b)
{
    if (!b || b->magic != BATCH_MAGIC)
        return;
    eng_free(&b->E);
    if (b->s.kv)
        tk_kv__pc_drop(b->s.kv);
    lm_state_free(&b->s);
    b->magic = 0;
    free(b);
}

static int check_batch(const tk_gen_batch *b, const char *fn)
{
    if (!b || b->magic != BATCH_MAGIC)
        return tk__err(TK_ERR_INVALID, "%s: not a tk_gen_batch (NULL or freed)", fn);
    return TK_OK;
}

int tk_gen_batch_add(int64_t *first, tk_gen_batch *b, const int32_t *prompt, size_t len, size_t n, const tk_gen_opts *o)
{
    tk_gen_opts up;
    int rc = check_batch(b, "tk_gen_batch_add");
    if (rc != TK_OK)
        return rc;
    if (!first)
        return tk__err(TK_ERR_INVALID, "tk_gen_batch_add: first is NULL");
    if ((rc = tk_gen__opts_upgrade(&up, o)) != TK_OK)
        return rc;
    eng_free_dead(&b->E);
    return eng_add(&b->E, first, prompt, len, n, &up);
}

int tk_gen_batch_step(tk_gen_batch *b, const tk_gen_event **events, size_t *nevents)
{
    int rc = check_batch(b, "tk_gen_batch_step");
    if (rc != TK_OK)
        return rc;
    if (!events || !nevents)
        return tk__err(TK_ERR_INVALID, "tk_gen_batch_step: events and nevents are required");
    rc = eng_step(&b->E, events, nevents);
    if (rc == TK_OK && b->E.err[0]) {
        for (size_t i = 0; i < *nevents; i++) /* a sequence failed: its message for the caller */
            if ((*events)[i].end && !strcmp((*events)[i].end, "error")) {
                tk__err(TK_ERR_INVALID, "%s", b->E.err);
                break;
            }
        b->E.err[0] = '\0';
    }
    return rc;
}

int tk_gen_batch_cancel(tk_gen_batch *b, int64_t seq)
{
    int rc = check_batch(b, "tk_gen_batch_cancel");
    if (rc != TK_OK)
        return rc;
    return eng_cancel(&b->E, seq);
}

size_t tk_gen_batch_active(const tk_gen_batch *b) { return b && b->magic == BATCH_MAGIC ? b->E.n : 0; }

int tk_gen_batch_stats_get(tk_gen_batch_stats *out, const tk_gen_batch *b)
{
    int rc = check_batch(b, "tk_gen_batch_stats_get");
    if (rc != TK_OK || !out)
        return rc ? rc : tk__err(TK_ERR_INVALID, "tk_gen_batch_stats_get: out is NULL");
    memset(out, 0, sizeof *out);
    const engine *E = &b->E;
    out->active = (int64_t)E->n;
    for (size_t i = 0; i < E->n; i++)
        out->prefilling += E->s[i]->state != S_DECODE;
    const tk_kv *kv = b->s.kv;
    if (kv) {
        out->kv_block_size = kv->block_size;
        out->kv_blocks_total = kv->max_blocks ? kv->max_blocks : kv->nblocks;
        out->kv_blocks_cached = tk_kv__pc_cached(kv);
        out->kv_blocks_used = kv->used_blocks - out->kv_blocks_cached;
        out->kv_blocks_free = out->kv_blocks_total - out->kv_blocks_used;
    }
    out->prompt_tokens = E->prompt_tokens;
    out->cached_tokens = E->cached_tokens;
    out->generated_tokens = E->generated_tokens;
    out->steps = E->steps;
    return TK_OK;
}

#define RESULT_MAGIC 0x67656e72u /* "genr" */

struct tk_gen_result {
    uint32_t magic;
    size_t n;
    tk_gen_seq *seq;
    tk_gen_stats st;
    int64_t kv_bytes, kv_peak_bytes, kv_blocks, kv_block_size;
    char kv_dtype[16];
    int use_cache;
};

static int json_num(double *out, json_t *o, const char *key, const char *what)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_number(v))
        return tk__err(TK_ERR_INVALID, "%s: '%s' is not a number", what, key);
    *out = json_number_value(v);
    return 1;
}

static int json_int(int64_t *out, json_t *o, const char *key, const char *what)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return 0;
    if (!tk_models__json_bound(v, out)) /* a number beyond int64 (a "no limit" value) is unbounded */
        return tk__err(TK_ERR_INVALID, "%s: '%s' is not an integer", what, key);
    return 1;
}

/* An eos id as int32: one past int32 (or a number beyond int64) can never be produced, so -1. */
static int eos_id(int32_t *out, const json_t *e)
{
    int64_t x;
    if (!tk_models__json_bound(e, &x))
        return -1;
    *out = x >= 0 && x <= INT32_MAX ? (int32_t)x : -1;
    return 0;
}

/* eos_token_id: an integer or a list of them. */
static int json_eos(tk_gen_opts *o, json_t *root, const char *what)
{
    json_t *v = json_object_get(root, "eos_token_id");
    if (!v || json_is_null(v))
        return TK_OK;
    size_t n = 0;
    if (!json_is_array(v)) {
        if (eos_id(&o->eos_token_id[n++], v))
            return tk__err(TK_ERR_INVALID, "%s: eos_token_id is neither an integer nor a list of them", what);
    } else {
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) {
            if (n == TK_GEN_MAX_EOS)
                return tk__err(TK_ERR_UNSUPPORTED, "%s: more than %d eos_token_id values", what, TK_GEN_MAX_EOS);
            if (eos_id(&o->eos_token_id[n++], e))
                return tk__err(TK_ERR_INVALID, "%s: eos_token_id[%zu] is not an integer", what, i);
        }
    }
    o->n_eos = n;
    return TK_OK;
}

static int apply_json(tk_gen_opts *o, const char *text, const char *what, int generation)
{
    json_error_t je;
    json_t *r = tk_models__json_loadb(text, strlen(text), 0, &je);
    if (!r || !json_is_object(r)) {
        json_decref(r);
        return tk__err(TK_ERR_INVALID, "%s: not a JSON object (line %d: %s)", what, je.line, je.text);
    }
    int rc = json_eos(o, r, what);
    int64_t iv;
    double dv;
    if (rc == TK_OK && (rc = json_int(&iv, r, "pad_token_id", what)) > 0)
        o->pad_token_id = iv;
    if (rc > 0)
        rc = TK_OK;
    if (generation && rc == TK_OK) {
#define INT_FIELD(name)                                                                                                \
    if (rc >= 0 && (rc = json_int(&iv, r, #name, what)) > 0)                                                           \
        o->name = iv;
#define NUM_FIELD(name)                                                                                                \
    if (rc >= 0 && (rc = json_num(&dv, r, #name, what)) > 0)                                                           \
        o->name = dv;
        INT_FIELD(max_length)
        INT_FIELD(max_new_tokens)
        INT_FIELD(top_k)
        INT_FIELD(no_repeat_ngram_size)
        INT_FIELD(num_beams)
        NUM_FIELD(temperature)
        NUM_FIELD(top_p)
        NUM_FIELD(min_p)
        NUM_FIELD(repetition_penalty)
        NUM_FIELD(length_penalty)
#undef INT_FIELD
#undef NUM_FIELD
        if (rc > 0)
            rc = TK_OK;
        json_t *v = json_object_get(r, "do_sample");
        if (rc == TK_OK && v && !json_is_null(v)) {
            if (!json_is_boolean(v))
                rc = tk__err(TK_ERR_INVALID, "%s: 'do_sample' is not true or false", what);
            else
                o->do_sample = json_is_true(v);
        }
        v = json_object_get(r, "early_stopping");
        if (rc == TK_OK && v && !json_is_null(v)) {
            if (json_is_boolean(v))
                o->early_stopping = json_is_true(v) ? TK_GEN_EARLY_TRUE : TK_GEN_EARLY_HEURISTIC;
            else if (json_is_string(v) && !strcmp(json_string_value(v), "never"))
                o->early_stopping = TK_GEN_EARLY_NEVER;
            else
                rc = tk__err(TK_ERR_INVALID, "%s: 'early_stopping' is not true, false or \"never\"", what);
        }
    }
    json_decref(r);
    return rc;
}

int tk_gen_opts_from_model(tk_gen_opts *o, tk_model *m)
{
    if (!o || !m || m->magic == 0)
        return tk__err(TK_ERR_INVALID, "tk_gen_opts_from_model: options and a loaded model are required");
    if (m->cfg.generation_json) {
        char *what = tk__fmt("%s/generation_config.json", m->dir);
        int rc = apply_json(o, m->cfg.generation_json, what ? what : "generation_config.json", 1);
        free(what);
        return rc;
    }
    /* no generation_config.json: transformers takes the token ids from config.json */
    char *path = tk__path_join(m->dir, "config.json"), *text = NULL;
    size_t len = 0;
    int rc = path ? tk__read_file(&text, &len, path, 64u << 20) : tk__err(TK_ERR_NOMEM, "out of memory");
    if (rc == TK_OK)
        rc = apply_json(o, text, path, 0);
    free(text);
    free(path);
    return rc;
}

int tk_generate(tk_gen_result **out, tk_model *m, const int32_t *const *prompts, const size_t *lens, size_t np,
                const tk_gen_opts *opts)
{
    if (!out)
        return tk__err(TK_ERR_INVALID, "tk_generate: out is NULL");
    *out = NULL;
    tk_gen_opts def = TK_GEN_OPTS_INIT, up;
    const tk_gen_opts *o = opts ? opts : &def;
    if (!m || m->magic == 0)
        return tk__err(TK_ERR_INVALID, "tk_generate: not a loaded tk_model");
    if (tk_gen__opts_upgrade(&up, o) != TK_OK)
        return TK_ERR_INVALID;
    o = &up;
    if (!tk_model_has_lm_head(m))
        return tk__err(TK_ERR_INVALID,
                       "%s has no LM head: it cannot generate text\nHINT: generation needs a causal "
                       "LM (LlamaForCausalLM, GPT2LMHeadModel, ...)",
                       m->cfg.arch);
    if (m->cfg.bidirectional) /* a masked diffusion LM does not predict the next token */
        return tk__err(TK_ERR_UNSUPPORTED,
                       "%s is a masked diffusion LM: it generates by unmasking, not token by "
                       "token\nHINT: use tk_diffusion_generate (tk generate --diffusion)",
                       m->cfg.arch);
    lm_state s = {m, NULL, NULL, 0, NULL, 0};
    tk_gen_result *r = calloc(1, sizeof *r);
    int rc = TK_OK;
    if (!r)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    r->magic = RESULT_MAGIC;
    r->use_cache = o->use_cache;
    tk_gen_lm lm;
    if ((rc = lm_setup(&lm, &s, m, o->use_cache, o->kv_dtype, o->kv_block_size, o->kv_max_bytes)) != TK_OK)
        goto fail;
    if (s.kv) {
        snprintf(r->kv_dtype, sizeof r->kv_dtype, "%s", tk_dtype_name(s.kv->dtype));
        r->kv_block_size = o->kv_block_size;
    }
    if (!(r->seq = calloc(np ? np : 1, sizeof *r->seq))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((rc = tk_gen__run(r->seq, &r->st, &lm, prompts, lens, np, o)) != TK_OK)
        goto fail;
    r->n = np;
    if (s.kv) {
        r->kv_blocks = s.kv->nblocks;
        r->kv_bytes = s.kv->nblocks * tk_kv__block_bytes(s.kv);
        r->kv_peak_bytes = s.kv->peak_blocks * tk_kv__block_bytes(s.kv);
    }
    lm_state_free(&s);
    *out = r;
    return TK_OK;
fail:
    lm_state_free(&s);
    tk_gen_result_free(r);
    return rc;
}

void tk_gen_result_free(tk_gen_result *r)
{
    if (!r || r->magic != RESULT_MAGIC)
        return;
    for (size_t i = 0; r->seq && i < r->n; i++)
        tk_gen__seq_free(&r->seq[i]);
    free(r->seq);
    r->magic = 0;
    free(r);
}

size_t tk_gen_result_count(const tk_gen_result *r) { return r && r->magic == RESULT_MAGIC ? r->n : 0; }

const int32_t *tk_gen_result_ids(const tk_gen_result *r, size_t i, size_t *n)
{
    if (n)
        *n = 0;
    if (!r || r->magic != RESULT_MAGIC || i >= r->n)
        return NULL;
    if (n)
        *n = r->seq[i].n;
    return r->seq[i].ids;
}

const char *tk_gen_result_text(const tk_gen_result *r, size_t i)
{
    return r && r->magic == RESULT_MAGIC && i < r->n ? r->seq[i].text : NULL;
}

const char *tk_gen_result_end(const tk_gen_result *r, size_t i)
{
    static const char *names[] = {"length", "eos", "stop_string", "callback"};
    if (!r || r->magic != RESULT_MAGIC || i >= r->n)
        return "";
    return names[r->seq[i].end];
}

const float *tk_gen_result_logprobs(const tk_gen_result *r, size_t i, size_t *n)
{
    if (n)
        *n = 0;
    if (!r || r->magic != RESULT_MAGIC || i >= r->n || !r->seq[i].logprobs)
        return NULL;
    if (n)
        *n = r->seq[i].n;
    return r->seq[i].logprobs;
}

size_t tk_gen_result_top_logprobs(const tk_gen_result *r, size_t i, size_t j, const int32_t **ids,
                                  const float **logprobs)
{
    if (ids)
        *ids = NULL;
    if (logprobs)
        *logprobs = NULL;
    if (!r || r->magic != RESULT_MAGIC || i >= r->n || !r->seq[i].ntop || j >= r->seq[i].n)
        return 0;
    const tk_gen_seq *s = &r->seq[i];
    if (ids)
        *ids = s->top_ids + j * (size_t)s->ktop;
    if (logprobs)
        *logprobs = s->top_lps + j * (size_t)s->ktop;
    return (size_t)s->ntop[j];
}

int tk_gen_result_stats_json(char **json, const tk_gen_result *r)
{
    *json = NULL;
    if (!r || r->magic != RESULT_MAGIC)
        return tk__err(TK_ERR_INVALID, "tk_gen_result_stats_json: not a tk_gen_result");
    const tk_gen_stats *st = &r->st;
    double tps = st->decode_ms > 0 ? (double)st->decode_tokens * 1000.0 / st->decode_ms : 0;
    json_t *o = json_pack("{s:f, s:f, s:I, s:I, s:I, s:f, s:b, s:I, s:I, s:I, s:I, s:s}", "prefill_ms", st->prefill_ms,
                          "decode_ms", st->decode_ms, "prefill_tokens", (json_int_t)st->prefill_tokens, "decode_tokens",
                          (json_int_t)st->decode_tokens, "steps", (json_int_t)st->steps, "decode_tokens_per_s", tps,
                          "kv_cache", r->use_cache, "kv_bytes", (json_int_t)r->kv_bytes, "kv_peak_bytes",
                          (json_int_t)r->kv_peak_bytes, "kv_blocks", (json_int_t)r->kv_blocks, "kv_block_size",
                          (json_int_t)r->kv_block_size, "kv_dtype", r->kv_dtype);
    if (!o)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    *json = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
    json_decref(o);
    return *json ? TK_OK : tk__err(TK_ERR_NOMEM, "out of memory");
}
