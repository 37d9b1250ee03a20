/*
 * kv_cache.h — the paged KV cache (models/kv_cache.c): the blocks of keys and values that the
 * decoders' forward (models/model.c) writes and attends over, the sequences' block tables, the prefix
 * cache, and the host-side scale calibration of an i8 / fp8 cache. Generation (models/generate.c)
 * owns a cache and hands its sequences to the model. Internal names are tk_kv__*.
 */
#ifndef TK_MODELS_KV_CACHE_H
#define TK_MODELS_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "tk.h"

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
} tk_kv_seq;

typedef struct tk_kv {
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
    tk_kv_seq *seq;
    int64_t nseq;
    /* The prefix cache (tk_kv__pc_*): full blocks by the chained hash of their tokens, each entry
     * holding one reference on its block; entries whose block nobody else holds are evicted oldest
     * first when the pool is at its bound. */
    struct tk_kv_pce *pc;
    size_t npc, cappc;
    uint64_t pc_clock;
} tk_kv;

int tk_kv__new(tk_kv **out, int64_t layers, int64_t heads, int64_t head_dim, tk_dtype dtype, int64_t block_size,
               int64_t max_bytes, int dev_type, int dev_id);
void tk_kv__free(tk_kv *kv);
int64_t tk_kv__block_bytes(const tk_kv *kv); /* all layers, keys and values */
int tk_kv__seq_new(tk_kv *kv, int32_t *slot);
int tk_kv__seq_fork(tk_kv *kv, int32_t *dst, int32_t src);
void tk_kv__seq_free(tk_kv *kv, int32_t slot);
/* Empties sequence slot (its blocks released), which stays allocated: its next tokens start at 0. */
void tk_kv__seq_reset(tk_kv *kv, int32_t slot);
/* Makes room for n[i] more tokens in sequence slots[i] (copying shared partial blocks first) and fills,
 * on the host: slot_mapping[T] (the cache slot of each new token, packed in order), block_table
 * [nseq, max_blocks_per_seq] (unused entries 0), seq_lens[nseq] (lengths after the new tokens) and
 * start[nseq] (lengths before). *mbps receives max_blocks_per_seq. The caller owns the arrays (free).
 * Errors: TK_ERR_NOMEM naming the bound when the pool may not grow. */
int tk_kv__prepare(tk_kv *kv, const int32_t *slots, size_t nseq, const int32_t *n, int64_t **slot_mapping,
                   int32_t **block_table, int64_t *mbps, int32_t **seq_lens, int64_t **start);
/* The prefix cache. insert: registers the full blocks of sequence slot whose tokens (ids[0..n), the
 * sequence's first n tokens) are all in its cache. match: gives sequence slot (empty) the cached blocks
 * of the longest prefix of ids[0..n) held, at most max_tokens tokens (a partly used last block is
 * copied before it is written), and returns the tokens it now holds. cached: blocks held only by the
 * cache. drop: empties the cache. */
int tk_kv__pc_insert(tk_kv *kv, int32_t slot, const int32_t *ids, size_t n);
int64_t tk_kv__pc_match(tk_kv *kv, int32_t slot, const int32_t *ids, size_t n, int64_t max_tokens);
int64_t tk_kv__pc_cached(const tk_kv *kv);
void tk_kv__pc_drop(tk_kv *kv);
/* An i8 / fp8 cache's per-head scales of layer l from the first keys and values written to it (k, v:
 * n rows of heads x head_dim, f32 host): scale = 1.25 x max|x| / (127 for i8, 448 for fp8_e4m3), so
 * later tokens up to 1.25x the prefill's largest value are not clipped; values past it saturate. */
int tk_kv__calibrate(tk_kv *kv, int64_t l, const float *k, const float *v, int64_t n);
/* Layer l's cache tensors (views; shape [nblocks, block_size, heads, head_dim]) and scales (quant:
 * f32[heads] views, NULL otherwise). shape must hold 4 int64s for each. */
void tk_kv__layer(const tk_kv *kv, int64_t l, tk_tensor *k, int64_t *kshape, tk_tensor *v, int64_t *vshape,
                  tk_tensor *ks, tk_tensor *vs, int64_t *sshape);

#endif /* TK_MODELS_KV_CACHE_H */
