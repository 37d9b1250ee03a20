/*
 * generate.h — generation's internals (models/generate.c): the logits processors over one row of
 * scores, with transformers' LogitsProcessor semantics, for the unit tests and the strategies.
 *
 * Every processor works in place on `s`, one row of V f32 scores, and follows the transformers class
 * named beside it, float32 arithmetic included, so the same row gives the same result; a removed
 * token gets -inf (transformers' filter_value). `ids` is the whole sequence so far (prompt and
 * generated tokens), as transformers' input_ids. Internal names are tk_gen__*.
 */
#ifndef TK_MODELS_GENERATE_H
#define TK_MODELS_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "tk.h"

/* TemperatureLogitsWarper: s /= t (t > 0, as f32). */
void tk_gen__temperature(float *s, int64_t V, double t);
/* RepetitionPenaltyLogitsProcessor: each distinct id of ids in [0, V): s < 0 ? s * p : s / p. */
int tk_gen__repetition_penalty(float *s, int64_t V, const int32_t *ids, size_t n, double p);
/* NoRepeatNGramLogitsProcessor: bans every token that would repeat an n-gram of ids. */
void tk_gen__no_repeat_ngram(float *s, int64_t V, const int32_t *ids, size_t n, int64_t ngram);
/* TopKLogitsWarper: keeps the tokens whose score is >= the k-th largest (ties at the boundary all
 * kept); k = max(k, min_keep), at most V. Errors: TK_ERR_NOMEM (also for the penalty). */
int tk_gen__top_k(float *s, int64_t V, int64_t k, int64_t min_keep);
/* TopPLogitsWarper: sorts ascending (ties by index, as a stable sort), softmax, cumulative sum (each prefix
 * exact: tk_fsum); removes the tokens whose cumulative probability is <= 1 - p, keeping the last min_keep. Among tokens tied at
 * the boundary it keeps only as many as the mass needs, the higher indices (torch.sort's order for
 * ties is unspecified; it matches a stable sort for short rows). NaN sorts and counts as -inf, and a
 * +inf takes softmax's limit (tk_gen__softmax_term; torch's softmax is NaN there). Errors: TK_ERR_NOMEM. */
int tk_gen__top_p(float *s, int64_t V, double p, int64_t min_keep);
/* MinPLogitsWarper: removes the tokens with probability < min_p * (the top probability), keeping the
 * min_keep most likely. Probabilities as tk_gen__top_p's (a NaN is removed: probability 0; with a +inf,
 * every finite score). Errors: TK_ERR_NOMEM. */
int tk_gen__min_p(float *s, int64_t V, double min_p, int64_t min_keep);
/* log_softmax in f32 (beam search scores log-probabilities): (s - max) - (f32) log(sum e^(s - max)),
 * the sum of doubles added exactly (tk_fsum, common/sample_math.h), so any split of the row gives the
 * same bits. */
void tk_gen__log_softmax(float *s, int64_t V);

/* The pieces of log_softmax and min-p's softmax that a vocabulary-parallel pick (models/tp_pick.c) runs
 * on each rank's columns: the terms of a row's sums given its maximum m (NaN skipped, a zero as +0),
 * added into acc (common/sample_math.h's tk_fsum, order-independent), and what the sum gives.
 * tk_gen__softmax_term is top-p's and min-p's term e^(x - m): 0 for a NaN (as the sample op counts it:
 * -inf) and for every score when m is -inf; when m is +inf softmax's limit, 1 for each +inf and 0 for
 * the rest (the +inf scores share the probability equally, as the sample op draws them). log_softmax's
 * terms are torch's: a NaN or a +inf makes the sum, and every log-probability, NaN. */
float tk_gen__softmax_term(float x, float m);
struct tk_fsum;
void tk_gen__lse_terms(struct tk_fsum *acc, const float *s, int64_t n, float m);
void tk_gen__softmax_terms(struct tk_fsum *acc, const float *s, int64_t n, float m);
float tk_gen__softmax_inv(const struct tk_fsum *acc);
/* The k largest log-probabilities of lp[0..n) (NaN skipped), most likely first, ties the lower id, into
 * ids (id0 + index) and vals; returns how many (fewer than k when fewer are not NaN). */
int tk_gen__top_logprobs(const float *lp, int64_t n, int64_t id0, int k, int32_t *ids, float *vals);
/* OpenAI's presence and frequency penalties over the generated tokens gen[0..n) (ids outside [0, V)
 * ignored): s[t] -= frequency * count(t) + presence * (count(t) > 0). Errors: TK_ERR_NOMEM. */
int tk_gen__presence_frequency(float *s, int64_t V, const int32_t *gen, size_t n, double presence, double frequency);
/* The options as version 2 (a version-1 struct is copied with the new fields at their defaults).
 * Errors: TK_ERR_INVALID (NULL or an unknown version). */
int tk_gen__opts_upgrade(tk_gen_opts *out, const tk_gen_opts *in);

/* ---- the strategies over a language model ----------------------------------------------------- */

/* A language model as generation drives it: sequences live in cache slots; step() feeds new tokens
 * and returns each sequence's next-token logits. The KV-cache adapter (over models/kv_cache.h) and the
 * full-recompute reference (lm_setup) implement it over a tk_model. */
typedef struct {
    void *self;
    tk_ctx *ctx;     /* runs the argmax and sample ops */
    int64_t vocab;   /* logits per row */
    int64_t max_pos; /* context: prompt + new tokens must fit */
    /* Sequence slots[i] gets tokens ids[cu[i]..cu[i+1]) after the ones it holds; logits[i*vocab..] (f32,
     * host) receives the logits after its last new token. */
    int (*step)(void *self, const int32_t *slots, size_t nseq, const int32_t *ids, const int32_t *cu, float *logits);
    int (*seq_new)(void *self, int32_t *slot);
    /* *dst = a new slot holding what src holds (beam search). */
    int (*seq_fork)(void *self, int32_t *dst, int32_t src);
    void (*seq_free)(void *self, int32_t slot);
    /* Decodes ids to UTF-8 (tokenizers' decode, special tokens skipped); NULL when there is no
     * tokenizer (then no text, no stop strings). *text is malloc'd. */
    int (*decode)(void *self, const int32_t *ids, size_t n, char **text);
    /* A model whose LM head is split on the vocabulary over several ranks, or NULL: greedy and sampled
     * steps then pick over each rank's columns (models/tp_pick.c) instead of gathering whole rows. */
    tk_model *tp;
} tk_gen_lm;

/* Why a sequence ended. */
enum { TK_GEN_END_LENGTH = 0, TK_GEN_END_EOS = 1, TK_GEN_END_STOP = 2, TK_GEN_END_CALLBACK = 3 };

typedef struct {
    int32_t *ids; /* the new tokens (eos included when it ended on one) */
    size_t n;
    char *text;   /* their decoded text (NULL without a tokenizer) */
    int end;      /* TK_GEN_END_* */
    float score;  /* beam search: the returned beam's score (sum of log-probs / length^length_penalty) */
    /* with opts.logprobs or top_logprobs (greedy and sampling): each new token's tk_gen_event.logprob,
     * top_ids and top_logprobs as the step engine reported them; NULL without */
    float *logprobs; /* n */
    int ktop;        /* opts.top_logprobs: the rows of top_ids and top_lps are ktop wide */
    int32_t *top_ids; /* n x ktop */
    float *top_lps;  /* n x ktop */
    int *ntop;       /* n: the filled entries of each row (fewer than ktop when fewer are not NaN) */
} tk_gen_seq;

typedef struct {
    /* prefill: the step over the prompts; decode: from the first new token to the last (greedy and
     * sampling: decode_tokens excludes the first token of each sequence, which the prefill gave, as
     * a streamer's inter-token timing does; beam search: every step after the prefill) */
    double prefill_ms, decode_ms;
    int64_t prefill_tokens, decode_tokens, steps;
} tk_gen_stats;

/* Prompt plus new tokens for a prompt of len tokens: len + max_new_tokens, else max_length, else (both
 * unset) len + 20 within max_pos, as transformers 5 defaults. INT64_MAX in either field (a file's "no
 * limit") is max_pos. */
int64_t tk_gen__total_length(const tk_gen_opts *o, int64_t len, int64_t max_pos);
/* Validates opts against the model and the prompts (clear TK_ERR_INVALID / TK_ERR_UNSUPPORTED). */
int tk_gen__check(const tk_gen_lm *lm, const int32_t *const *prompts, const size_t *lens, size_t np,
                  const tk_gen_opts *o);
/* Runs generation for np prompts in one batch; out[np] receives each sequence (free with
 * tk_gen__seq_free). Greedy and sampling run through the step engine (tk_gen_batch's, over lm); beam
 * search keeps num_beams slots per prompt. */
int tk_gen__run(tk_gen_seq *out, tk_gen_stats *stats, const tk_gen_lm *lm, const int32_t *const *prompts,
                const size_t *lens, size_t np, const tk_gen_opts *o);
void tk_gen__seq_free(tk_gen_seq *s);

#endif /* TK_MODELS_GENERATE_H */
