/*
 * tp_plan.h — the tensor-parallel plan: which slice of each checkpoint tensor rank r of N holds.
 *
 * A plan is transformers' format: an object from module or parameter names to style names
 * ("model.layers.*.self_attn.q_proj": "colwise"), where "*" stands for a layer number. It comes
 * from a --tp-plan file, else config.json's "base_model_tp_plan", else the plan transformers'
 * config class carries for the model type (the Llama family's; GPT-2 has none). Each safetensors
 * tensor then gets its style as transformers' _get_parameter_plan finds it (its own name with the
 * layer numbers made "*", else its module's), and from the style the dimension it is split on and
 * how, as transformers' styles place parameters (distributed/tensor_parallel.py):
 *
 *   colwise, colwise_gather_output, colwise_rep   weight dim ndim-2 (the output features), bias dim 0
 *   rowwise, rowwise_split_input, rowwise_rep     weight dim ndim-1 (the input features), bias whole
 *   embedding_rowwise / embedding_colwise         dim 0 (vocabulary) / dim 1 (hidden)
 *   packed_colwise                                weight dim ndim-2 in `split` blocks (gate|up: 2),
 *                                                 each block split over the ranks; a 1-D bias dim 0
 *   packed_rowwise                                weight dim ndim-1 in `split` blocks; bias whole
 *   anything else transformers knows              the whole tensor on every rank (moe_tp_experts and
 *                                                 the expert-parallel styles included: tk splits
 *                                                 experts on their features, by the two rules above)
 *
 * A mixture of experts saved one tensor an expert (experts.<e>.gate_proj, Mixtral's w1/w3/w2) takes
 * the split of the fused experts.gate_up_proj / down_proj that transformers concatenates it into.
 *
 * A dimension of n splits as torch.chunk splits it (DTensor's Shard): ranks take ceil(n/N) each
 * from the start, so the last ones may hold less, or nothing. GPT-2's Conv1D weights are stored
 * [in, out], so there colwise splits dim 1 and rowwise dim 0 (transformers refuses Conv1D); and a
 * plan value may be {"style": "packed_colwise", "split": 3} for a fused q|k|v (a tk extension).
 * A fused qkv_proj packed in 3 blocks on a model with fewer kv heads than heads (Phi-3-medium) has
 * unequal blocks, q's heads then k's and v's kv heads, and each is split over the ranks by heads (tk's:
 * transformers' _StridedShard cuts equal thirds).
 *
 * Pure: no communication, no weights read. Internal names are tk_models__tp_*.
 */
#ifndef TK_MODELS_TP_PLAN_H
#define TK_MODELS_TP_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

#define TK_TP_MAX_RANK 8
#define TK_TP_MAX_SPLIT 8

typedef struct {
    char *key;         /* the rule's name pattern */
    const char *style; /* a static style name */
    int split;         /* packed styles: blocks along the split dimension (default 2) */
    int used;          /* a tensor or module of the checkpoint matched it */
} tk_tp_rule;

typedef struct {
    char *name;         /* the safetensors tensor name */
    const char *style;  /* the style it got ("replicate" when no rule names it) */
    const char *rule;   /* the matching rule's key (borrowed from the plan), NULL: none */
    int dim;            /* the dimension split over the ranks, -1: every rank holds it whole */
    int split;          /* blocks along dim, each split over the ranks (1: plain) */
    int ndim;
    int64_t shape[TK_TP_MAX_RANK];
    /* packed: each block's length along dim when they are unequal (a fused q|k|v with fewer kv heads
     * than heads: heads * head_dim, then kv_heads * head_dim twice); all 0: split equal blocks */
    int64_t block[TK_TP_MAX_SPLIT];
} tk_tp_param;

typedef struct {
    tk_tp_rule *rules;
    size_t nrules;
    char source[512];   /* where the rules came from, for messages and --json */
    tk_tp_param *params;
    size_t nparams;
    int world;          /* the tensor-parallel size the plan was checked for */
    char **warnings;    /* "rule 'x' matches nothing in the checkpoint", ... */
    size_t nwarnings;
} tk_tp_plan;

/* The styles transformers registers (ALL_PARALLEL_STYLES), sorted; NULL-terminated. */
extern const char *const tk_models__tp_styles[];

/* Parses plan rules from JSON text: an object of name -> style (or -> {"style", "split"}). A
 * config.json, or any object with a "base_model_tp_plan" object, gives that object's rules, relative
 * to the base model (prefix is prepended to each key). Errors: TK_ERR_INVALID naming `what` (not
 * JSON, not an object, a value that is not a style, a split outside 2..8), and for styles
 * transformers does not know: "unsupported tp_plan styles: 'x' (rule '...'); supported styles are
 * ...". *found is 0 when the text had no rules at all (a config.json without a plan). */
int tk_models__tp_rules_parse(tk_tp_plan *p, const char *text, size_t len, const char *what, const char *prefix,
                              int *found);

/* Builds the plan of checkpoint `dir` for `world` ranks: the rules (plan_file, else config.json's
 * base_model_tp_plan, else the model type's default as transformers has it), completed as
 * transformers completes a base model's plan (the embedding rowwise, the LM head
 * colwise_gather_output), then every tensor of the checkpoint's safetensors headers assigned.
 * Errors: TK_ERR_NOT_FOUND (no config.json, no weights, no plan_file), TK_ERR_INVALID (a bad plan;
 * heads or kv heads not divisible by world when attention is split; a packed dimension that does not
 * divide), TK_ERR_UNSUPPORTED (no plan for the model type and no plan_file). Warnings (rules that
 * match nothing) are in p->warnings. */
int tk_models__tp_plan_load(tk_tp_plan **out, const char *dir, const char *plan_file, int world);
void tk_models__tp_plan_free(tk_tp_plan *p);

/* Assigns styles to n tensors (names and shapes) from p's rules, and checks them for p->world ranks:
 * heads (kv heads) as given, 0 to skip the check (with both, a qkv_proj packed in 3 gets their unequal
 * blocks); conv1d: GPT-2's [in, out] linear layout. */
int tk_models__tp_assign(tk_tp_plan *p, const char *const *names, const int *ndims,
                         const int64_t (*shapes)[TK_TP_MAX_RANK], size_t n, int64_t heads, int64_t kv_heads,
                         int conv1d);

/* transformers' replace_layer_number_by_wildcard: ".<digits>" before a "." or the end becomes ".*".
 * Writes at most cap bytes (NUL included). */
void tk_models__tp_generic_name(char *out, size_t cap, const char *name);

/* Rank r's part of a dimension of n elements over world ranks (torch.chunk): *off, *len. */
void tk_models__tp_chunk(int64_t n, int world, int r, int64_t *off, int64_t *len);

/* The blocks p's split dimension is packed in (p->split of them; one for a plain split): each one's
 * start and length, equal (_StridedShard's ceil(n/split)-wide groups, the last ones shorter or empty)
 * unless p->block gives them. Returns the count (at most TK_TP_MAX_SPLIT); 0 when p is not split. */
int tk_models__tp_blocks(const tk_tp_param *p, int64_t *start, int64_t *len);

/* Rank r's slice of a tensor: its shape, and along the split dimension the [start, start+len) ranges
 * of the full tensor it holds, in order (one a block; empty ones dropped). */
typedef struct {
    int64_t shape[TK_TP_MAX_RANK];
    int nranges;
    int64_t start[TK_TP_MAX_SPLIT], len[TK_TP_MAX_SPLIT];
    int64_t bytes; /* of the rank's slice */
} tk_tp_slice;
int tk_models__tp_slice(tk_tp_slice *s, const tk_tp_param *p, int rank, int world, size_t elsize);

/* The slice as byte runs of the full row-major tensor: run i is `count` pieces of `bytes` bytes,
 * `stride` apart, from `offset`; the rank's bytes are the runs' pieces in order (outer rows first). */
typedef struct {
    uint64_t offset, bytes, stride;
    int64_t count;
} tk_tp_run;
/* Fills at most cap runs; returns how many there are (a plain split has one, or one a block). */
size_t tk_models__tp_runs(tk_tp_run *runs, size_t cap, const tk_tp_param *p, const tk_tp_slice *s, size_t elsize);
/* Copies rank's slice of the full tensor src (row-major) into dst (s->bytes). */
void tk_models__tp_copy(void *dst, const void *src, const tk_tp_param *p, const tk_tp_slice *s, size_t elsize);

#endif /* TK_MODELS_TP_PLAN_H */
