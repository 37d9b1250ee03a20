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
/* OpenAI's presence and frequency penalties over the generated tokens gen[0..n) (ids outside [0, V)
 * ignored): s[t] -= frequency * count(t) + presence * (count(t) > 0). Errors: TK_ERR_NOMEM. */
int tk_gen__presence_frequency(float *s, int64_t V, const int32_t *gen, size_t n, double presence, double frequency);
/* The options as version 2 (a version-1 struct is copied with the new fields at their defaults).
 * Errors: TK_ERR_INVALID (NULL or an unknown version). */
int tk_gen__opts_upgrade(tk_gen_opts *out, const tk_gen_opts *in);

/* ---- the strategies over a language model ----------------------------------------------------- */

/* A language model as generation drives it: sequences live in cache slots; step() feeds new tokens
 * and returns each sequence's next-token logits. The KV-cache adapter (tk_gen__kv_lm) and the
 * full-recompute reference (tk_gen__full_lm) implement it over a tk_model. */
typedef struct {
    void *self;
    tk_ctx *ctx;     /* runs the argmax and sample ops */
    int64_t vocab;   /* logits per row */
    int64_t max_pos; /* context: prompt + new tokens must fit */
    /* Sequence slots[i] gets tokens ids[cu[i]..cu[i+1]) after the ones it holds; logits[i*vocab..] (f32,
     * host) receives the logits after its last new token. */
    int (*step)(void *self, const int32_t *slots, size_t nseq, const int32_t *ids, const int32_t *cu,
                float *logits);
    int (*seq_new)(void *self, int32_t *slot);
    /* *dst = a new slot holding what src holds (beam search). */
    int (*seq_fork)(void *self, int32_t *dst, int32_t src);
    void (*seq_free)(void *self, int32_t slot);
    /* Decodes ids to UTF-8 (tokenizers' decode, special tokens skipped); NULL when there is no
     * tokenizer (then no text, no stop strings). *text is malloc'd. */
    int (*decode)(void *self, const int32_t *ids, size_t n, char **text);
} tk_gen_lm;

/* Why a sequence ended. */
enum { TK_GEN_END_LENGTH = 0, TK_GEN_END_EOS = 1, TK_GEN_END_STOP = 2, TK_GEN_END_CALLBACK = 3 };

typedef struct {
    int32_t *ids; /* the new tokens (eos included when it ended on one) */
    size_t n;
    char *text;   /* their decoded text (NULL without a tokenizer) */
    int end;      /* TK_GEN_END_* */
    float score;  /* beam search: the returned beam's score (sum of log-probs / length^length_penalty) */
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

/* ---- the paged KV cache ----------------------------------------------------------------------- */

/* Keys and values of every layer in blocks of block_size tokens ([nblocks, block_size, Hkv, D] per
 * layer, in the cache dtype, on the model's device), handed to sequences through block tables: the
 * layout the registry's paged_kv_append and attention_decode take. Blocks are reference-counted, so a
 * forked sequence (a beam) shares its parent's blocks and copies only a partly filled last block
 * before writing to it. The pool grows by doubling up to max_bytes; an i8 or fp8 cache has per-head
 * scales per layer, fixed by the first prefill. */
typedef struct {
    int32_t *blocks;
    int64_t nblk, cap;
    int64_t len; /* tokens held */
    int used;
} tk_gen_kvseq;

typedef struct tk_gen_kv {
    int dev_type, dev_id;
    int64_t layers, heads, head_dim, block_size;
    tk_dtype dtype;
    int quant;              /* 1 for i8 / fp8_e4m3 */
    int64_t nblocks;        /* allocated */
    int64_t max_blocks;     /* bound from max_bytes; 0: none */
    int64_t used_blocks, peak_blocks;
    void **k, **v;          /* per layer */
    float *scales;          /* quant: [layers][2][heads] (k then v), on the device */
    unsigned char *calibrated; /* quant: per layer, 1 once its scales are set */
    int32_t *ref;           /* per block */
    int32_t *freel;         /* free block ids (a stack) */
    int64_t nfree;
    tk_gen_kvseq *seq;
    int64_t nseq;
    /* The prefix cache (tk_gen__kv_pc_*): full blocks by the chained hash of their tokens, each entry
     * holding one reference on its block; entries whose block nobody else holds are evicted oldest
     * first when the pool is at its bound. */
    struct tk_gen_pce *pc;
    size_t npc, cappc;
    uint64_t pc_clock;
} tk_gen_kv;

int tk_gen__kv_new(tk_gen_kv **out, int64_t layers, int64_t heads, int64_t head_dim, tk_dtype dtype,
                   int64_t block_size, int64_t max_bytes, int dev_type, int dev_id);
void tk_gen__kv_free(tk_gen_kv *kv);
int64_t tk_gen__kv_block_bytes(const tk_gen_kv *kv); /* all layers, keys and values */
int tk_gen__kv_seq_new(tk_gen_kv *kv, int32_t *slot);
int tk_gen__kv_seq_fork(tk_gen_kv *kv, int32_t *dst, int32_t src);
void tk_gen__kv_seq_free(tk_gen_kv *kv, int32_t slot);
/* Makes room for n[i] more tokens in sequence slots[i] (copying shared partial blocks first) and fills,
 * on the host: slot_mapping[T] (the cache slot of each new token, packed in order), block_table
 * [nseq, max_blocks_per_seq] (unused entries 0), seq_lens[nseq] (lengths after the new tokens) and
 * start[nseq] (lengths before). *mbps receives max_blocks_per_seq. The caller owns the arrays (free).
 * Errors: TK_ERR_NOMEM naming the bound when the pool may not grow. */
int tk_gen__kv_prepare(tk_gen_kv *kv, const int32_t *slots, size_t nseq, const int32_t *n, int64_t **slot_mapping,
                       int32_t **block_table, int64_t *mbps, int32_t **seq_lens, int64_t **start);
/* The prefix cache. insert: registers the full blocks of sequence slot whose tokens (ids[0..n), the
 * sequence's first n tokens) are all in its cache. match: gives sequence slot (empty) the cached blocks
 * of the longest prefix of ids[0..n) held, at most max_tokens tokens (a partly used last block is
 * copied before it is written), and returns the tokens it now holds. cached: blocks held only by the
 * cache. drop: empties the cache. */
int tk_gen__kv_pc_insert(tk_gen_kv *kv, int32_t slot, const int32_t *ids, size_t n);
int64_t tk_gen__kv_pc_match(tk_gen_kv *kv, int32_t slot, const int32_t *ids, size_t n, int64_t max_tokens);
int64_t tk_gen__kv_pc_cached(const tk_gen_kv *kv);
void tk_gen__kv_pc_drop(tk_gen_kv *kv);
/* An i8 / fp8 cache's per-head scales of layer l from the first keys and values written to it (k, v:
 * n rows of heads x head_dim, f32 host): scale = 1.25 x max|x| / (127 for i8, 448 for fp8_e4m3), so
 * later tokens up to 1.25x the prefill's largest value are not clipped; values past it saturate. */
int tk_gen__kv_calibrate(tk_gen_kv *kv, int64_t l, const float *k, const float *v, int64_t n);
/* Layer l's cache tensors (views; shape [nblocks, block_size, heads, head_dim]) and scales (quant:
 * f32[heads] views, NULL otherwise). shape must hold 4 int64s for each. */
void tk_gen__kv_layer(const tk_gen_kv *kv, int64_t l, tk_tensor *k, int64_t *kshape, tk_tensor *v, int64_t *vshape,
                      tk_tensor *ks, tk_tensor *vs, int64_t *sshape);

#endif /* TK_MODELS_GENERATE_H */
