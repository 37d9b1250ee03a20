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

/* TemperatureLogitsWarper: s /= t (t > 0, as f32). */
void tk_gen__temperature(float *s, int64_t V, double t);
/* RepetitionPenaltyLogitsProcessor: each distinct id of ids in [0, V): s < 0 ? s * p : s / p. */
int tk_gen__repetition_penalty(float *s, int64_t V, const int32_t *ids, size_t n, double p);
/* NoRepeatNGramLogitsProcessor: bans every token that would repeat an n-gram of ids. */
void tk_gen__no_repeat_ngram(float *s, int64_t V, const int32_t *ids, size_t n, int64_t ngram);
/* TopKLogitsWarper: keeps the tokens whose score is >= the k-th largest (ties at the boundary all
 * kept); k = max(k, min_keep), at most V. Errors: TK_ERR_NOMEM (also for the penalty). */
int tk_gen__top_k(float *s, int64_t V, int64_t k, int64_t min_keep);
/* TopPLogitsWarper: sorts ascending (ties by index, as a stable sort), softmax, cumulative sum; removes
 * the tokens whose cumulative probability is <= 1 - p, keeping the last min_keep. Among tokens tied at
 * the boundary it keeps only as many as the mass needs, the higher indices (torch.sort's order for
 * ties is unspecified; it matches a stable sort for short rows). Errors: TK_ERR_NOMEM. */
int tk_gen__top_p(float *s, int64_t V, double p, int64_t min_keep);
/* MinPLogitsWarper: removes the tokens with probability < min_p * (the top probability), keeping the
 * min_keep most likely. Errors: TK_ERR_NOMEM. */
int tk_gen__min_p(float *s, int64_t V, double min_p, int64_t min_keep);
/* log_softmax in f32 (beam search scores log-probabilities). */
void tk_gen__log_softmax(float *s, int64_t V);

#endif /* TK_MODELS_GENERATE_H */
