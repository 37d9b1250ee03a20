/*
 * models.h — the model pipelines' internals: safetensors checkpoints (mmap, header checked before use),
 * config.json as one typed struct, the loaded model with its weights and planned activations, and the
 * architecture families (llama.c: Llama/Mistral/Qwen2, gpt2.c, bert.c).
 *
 * Models reach ops only through the public tk_op_run (tk.h), as a host program would, and use common/
 * for errors and files; nothing here includes ops/ or api/ internals. Internal names are tk_models__*.
 */
#ifndef TK_MODELS_H
#define TK_MODELS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "models/tp_plan.h"

/* ---- safetensors (models/safetensors.c) ------------------------------------------------------- */

/* The dtypes of the safetensors format, by their header names. */
typedef enum {
    TK_ST_BOOL,
    TK_ST_U8,
    TK_ST_I8,
    TK_ST_I16,
    TK_ST_U16,
    TK_ST_F16,
    TK_ST_BF16,
    TK_ST_I32,
    TK_ST_U32,
    TK_ST_F32,
    TK_ST_F64,
    TK_ST_I64,
    TK_ST_U64,
    TK_ST_F8_E4M3,
    TK_ST_F8_E5M2,
    TK_ST_COUNT
} tk_st_dtype;

#define TK_ST_MAX_RANK 8
/* The header may be at most this long (the reference implementation's cap is 100 MB). */
#define TK_ST_MAX_HEADER (100u << 20)

typedef struct {
    char *name;
    tk_st_dtype dtype;
    int ndim;
    int64_t shape[TK_ST_MAX_RANK];
    uint64_t begin, end;   /* byte offsets in the data area (after the header) */
    const void *data;      /* into the mapping; NULL for a parsed-only header */
    const char *file;      /* the file it lives in (borrowed from the checkpoint) */
} tk_st_tensor;

const char *tk_models__st_dtype_name(tk_st_dtype dt); /* "BF16" */
size_t tk_models__st_dtype_size(tk_st_dtype dt);      /* bytes per element */

/* Parses and validates a safetensors file image (buf, len = the whole file): the 8-byte little-endian
 * header length (at most TK_ST_MAX_HEADER and inside the file), a JSON object header, and for every
 * tensor a known dtype, a shape of at most TK_ST_MAX_RANK non-negative sizes, data_offsets inside the
 * data area, numel * dtype size == end - begin (no overflow), and no two tensors overlapping.
 * "__metadata__" must be an object of strings. `what` names the file in messages. On success *out is
 * an array of *n tensors (data pointing into buf), sorted by name; free with tk_models__st_free.
 * Errors: TK_ERR_CORRUPT (TK_ERR_UNSUPPORTED for a dtype or rank tk does not know), naming the file, the
 * tensor and the field. Never reads outside buf. */
int tk_models__st_parse(tk_st_tensor **out, size_t *n, const uint8_t *buf, size_t len, const char *what);
void tk_models__st_free(tk_st_tensor *t, size_t n);

/* The safetensors files of a checkpoint directory: model.safetensors, or the shards named by
 * model.safetensors.index.json (every shard's tensors must be where the index says). Files are mapped
 * read-only (MAP_PRIVATE) for the lifetime of the set. Errors: TK_ERR_NOT_FOUND (no weights, a missing
 * shard), TK_ERR_CORRUPT (a damaged file, or an index that disagrees with its shards). */
typedef struct tk_st_set tk_st_set;
int tk_models__st_open_dir(tk_st_set **out, const char *dir);
void tk_models__st_close(tk_st_set *s);
/* NULL when absent. */
const tk_st_tensor *tk_models__st_find(const tk_st_set *s, const char *name);
size_t tk_models__st_count(const tk_st_set *s);
const tk_st_tensor *tk_models__st_at(const tk_st_set *s, size_t i);
int64_t tk_models__st_bytes(const tk_st_set *s); /* sum of the files' sizes */
/* Drops the mapped pages that lie wholly inside t's data from this process's memory (madvise
 * MADV_DONTNEED; a later read maps them from the file again): after a strided slice of t was copied
 * (tensor parallelism), the pages the copy touched need not stay resident. */
void tk_models__st_release(const tk_st_tensor *t);
/* The same for the mapped pages wholly inside [p, p + n). */
void tk_models__st_release_range(const void *p, size_t n);
/* Maps the n bytes at p, inside a mapped file, into this process's page tables now (madvise
 * MADV_POPULATE_READ, Linux 5.14+; ignored where unsupported): a weight the model uses where it is
 * mapped is then loaded at load time, not page by page on the first forward (which timed ~20 ms of
 * SmolLM2-135M f32's faults as prefill). */
void tk_models__st_populate(const void *p, size_t n);

/* CPU weights copied out of the mapping into transparent huge pages (models/host_weights.c): a list of
 * chunks the model owns. alloc: n bytes of the list's memory (64-byte aligned), NULL when out of
 * memory. */
typedef struct tk_models_hw tk_models_hw;
int tk_models__hw_env_map(void); /* TK_MAP_WEIGHTS set (and not "0") */
void *tk_models__hw_alloc(tk_models_hw **list, size_t n);
/* malloc for the model's host buffers, 64-byte aligned: one of 2 MiB or more is 2 MiB aligned and
 * advised for huge pages (freed with free()); calloc: zeroed. */
void *tk_models__hw_malloc(size_t n);
void *tk_models__hw_calloc(size_t n);
void tk_models__hw_free(tk_models_hw *list);

/* Converts n elements of a safetensors dtype to f32 / from f32 into tk dtype dst (f32, f16, bf16).
 * Round to nearest even. TK_ERR_UNSUPPORTED for dtypes that hold no real numbers we convert (bool, u*,
 * i16, i32, i64). */
int tk_models__to_f32(float *dst, const void *src, size_t n, tk_st_dtype dt);
void tk_models__from_f32(void *dst, const float *src, size_t n, tk_dtype dt);
void tk_models__dtype_to_f32(float *dst, const void *src, size_t n, tk_dtype dt);

/* ---- config.json (models/config.c) ------------------------------------------------------------ */

enum {
    TK_ROPE_DEFAULT = 0,
    TK_ROPE_LINEAR = 1,
    TK_ROPE_DYNAMIC = 2,
    TK_ROPE_YARN = 3,
    TK_ROPE_LLAMA3 = 4,
    TK_ROPE_LONGROPE = 5,
    TK_ROPE_COUNT
};

#define TK_MODELS_MAX_EXT 1024 /* LongRoPE's factors: one per rotary pair */

typedef struct {
    int type; /* TK_ROPE_*: the rope_cos_sin_cache op's 'scaling' */
    double theta, factor;
    int64_t original_max_pos;
    double beta_fast, beta_slow, attention_factor, low_freq_factor, high_freq_factor;
    int truncate;
    double partial_rotary_factor; /* rot_dim = head_dim * this */
    /* LongRoPE (Phi-3 128k, Phi-3.5, Phi-4-mini): short_factor, used while the longest sequence of a
     * forward pass is at most original_max_pos, and long_factor beyond (HF's longrope_frequency_update) */
    int64_t next;
    float ext_short[TK_MODELS_MAX_EXT], ext_long[TK_MODELS_MAX_EXT];
} tk_models_rope;

#define TK_MODELS_MAX_LAYERS 1024

typedef struct tk_models_arch tk_models_arch;

/* qk_norm: none, RMSNorm over each head's D (Qwen3, Gemma 3), or over the whole q / k projection (OLMo2) */
enum { TK_QKNORM_NONE = 0, TK_QKNORM_HEAD = 1, TK_QKNORM_PROJ = 2 };

typedef struct {
    char arch[64];          /* architectures[0]: "LlamaForCausalLM" */
    char model_type[32];    /* "llama", "mistral", "qwen2", "gpt2", "bert" */
    const tk_models_arch *def; /* the architecture that runs it (the table in config.c) */
    int64_t vocab, hidden, layers, heads, kv_heads, head_dim, intermediate, max_pos, type_vocab;
    double eps;
    tk_models_rope rope;
    tk_models_rope rope_local; /* with rope_local_on: the sliding layers' RoPE (Gemma 3's local base) */
    int rope_local_on;
    int64_t sliding_window;      /* 0: none */
    unsigned char sliding[TK_MODELS_MAX_LAYERS]; /* 1: layer l uses the sliding window (else full; causal or
                                                  * bidirectional as the architecture's caps say) */
    unsigned char nope[TK_MODELS_MAX_LAYERS];    /* 1: layer l has no rotary embedding (SmolLM3) */
    /* The decoder's variations (llama.c), set by the architecture's parser; the defaults (a plain Llama)
     * are 0 for the flags and the softcaps, 1 for the multipliers. */
    int qk_norm;            /* TK_QKNORM_* */
    int fused_qkv;          /* 1: self_attn.qkv_proj ([q; k; v] rows) and mlp.gate_up_proj (Phi-3) */
    int pre_norms;          /* 1: norm before attention and MLP (all but OLMo2) */
    int post_norms;         /* 1: norm of the attention's and the MLP's output before the residual add
                             * (OLMo2, Gemma 2/3) */
    double norm_offset;     /* RMSNorm scales by (offset + w): Gemma's 1 */
    double embed_scale;     /* embeddings times this: Gemma's sqrt(hidden), Granite's embedding_multiplier */
    int embed_scale_rounded; /* 1: embed_scale rounded to the compute dtype first (Gemma's normalizer is a
                              * tensor of the activations' dtype: bf16(sqrt(2048)) = 45.25) */
    double residual_scale;  /* each block's output times this before the residual add (Granite) */
    double attn_scale;      /* attention's score scale; 0: 1/sqrt(head_dim) */
    double logit_scale;     /* logits times this (Granite: 1 / logits_scaling) */
    double attn_softcap;    /* attention score softcap (Gemma 2); 0: off */
    double final_softcap;   /* final logit softcap (Gemma 2); 0: off */
    /* Mixture of experts (mixtral.c, qwen2_moe.c, qwen3_moe.c): with experts > 0 the layers whose moe[l]
     * is set run the moe op (router, experts_topk of `experts` gated MLPs of moe_intermediate, an optional
     * shared expert of shared_intermediate with a sigmoid gate) instead of the dense MLP. */
    int64_t experts, experts_topk, moe_intermediate, shared_intermediate;
    int moe_norm_topk;      /* norm_topk_prob (always on in Mixtral) */
    int moe_round_weights;  /* the routing weights rounded to the compute dtype (Qwen-MoE's router) */
    char moe_prefix[24];    /* the per-expert tensors' module: "mlp." or Mixtral's "block_sparse_moe." */
    int moe_w123;           /* per-expert tensors named w1 (gate), w3 (up), w2 (down): Mixtral's */
    unsigned char moe[TK_MODELS_MAX_LAYERS]; /* 1: layer l is sparse */
    int tie_embeddings;
    int qkv_bias, o_bias, mlp_bias; /* Llama family: attention_bias, Qwen2's q/k/v bias, mlp_bias */
    int unscaled_attn;      /* GPT-2's scale_attn_weights = false: scores are not divided by sqrt(D) */
    char act[32];           /* hidden_act / activation_function */
    char torch_dtype[16];   /* "float32", "bfloat16", ... ("" when absent) */
    int64_t bos_id, eos_id, pad_id; /* -1 when absent */
    char *generation_json;  /* generation_config.json's text, kept for generation (NULL when absent) */
    char *warnings;         /* lines to warn about (special token ids outside the vocabulary), or NULL */
    /* Masked diffusion LMs (models/diffusion_lm.c): attention without the causal mask (LLaDA, Dream, or a
     * causal checkpoint run with tk_diff_opts.bidirectional), the mask token (-1: none), the sampler the
     * checkpoint was trained for (TK_DIFF_LLADA, TK_DIFF_DREAM; 0: none), and the checkpoint's own name
     * of a Llama-decoder weight (LLaDA's model.transformer.blocks.N.*; NULL: the HF Llama names). */
    int bidirectional;
    int64_t mask_id;
    int diffusion;
    const char *(*weight_name)(char *buf, size_t cap, const char *hf);
    /* Block diffusion (DiffusionGemma, models/diffusion_gemma.c; 0 elsewhere): the canvas (block) length,
     * and the full-attention layers' head size and kv heads (their own; head_dim and kv_heads are the
     * sliding layers') */
    int64_t canvas, global_head_dim, global_kv_heads;
} tk_models_config;

/* json_loadb for the JSON files of a checkpoint (config.json, generation_config.json, tokenizer.json,
 * tokenizer_config.json, ...): the same, except that an integer literal beyond int64 parses as a
 * real number instead of failing with "too big integer" (transformers writes "no limit" as
 * model_max_length 1000000000000000019884624838656). Text that needs no change is parsed in place. */
json_t *tk_models__json_loadb(const char *text, size_t len, size_t flags, json_error_t *err);
/* An integer where tk needs only a bound: 1 and *out for an integer, INT64_MAX ("unbounded") for a
 * number at or beyond 2^63 (what tk_models__json_loadb makes of a larger integer); 0 for anything
 * else. */
int tk_models__json_bound(const json_t *v, int64_t *out);

/* Reads dir/config.json (and dir/generation_config.json when present). Errors: TK_ERR_NOT_FOUND (no
 * config.json), TK_ERR_INVALID (malformed; a missing or out-of-range field, named),
 * TK_ERR_UNSUPPORTED (an architecture or a config value tk does not implement: the message names it
 * and lists what is supported). */
int tk_models__config_load(tk_models_config *cfg, const char *dir);
/* Parses config.json's text (for tests and fuzzing); `what` names it in messages. */
int tk_models__config_parse(tk_models_config *cfg, const char *text, size_t len, const char *what);
void tk_models__config_free(tk_models_config *cfg);
/* The op of an HF activation name ("gelu_pytorch_tanh" -> "gelu_tanh"), NULL for an unknown one. */
const char *tk_models__act_op(const char *act);
/* "LlamaForCausalLM, MistralForCausalLM, ..." (every class of the architecture table) */
const char *tk_models__supported_archs(void);
/* The supported class nearest to `arch` (edit distance, case-insensitive), or NULL when none is near. */
const char *tk_models__closest_arch(const char *arch);

/* config.json's typed field readers, for the architectures' parsers. Each reads one field of r->root;
 * absent or null gives the default. int: an integer in [lo, 2^24] (def INT64_MIN: required); bound: an
 * integer >= lo where a number beyond int64 is INT64_MAX; num: a finite number (obj: any object, what
 * names it); bool, str (at most cap - 1 bytes). Errors: TK_ERR_INVALID naming the file and the field. */
typedef struct {
    const char *what; /* "config.json" path for messages */
    json_t *root;
} tk_models_reader;
int tk_models__cfg_int(const tk_models_reader *r, const char *key, int64_t def, int64_t lo, int64_t *out);
int tk_models__cfg_bound(const tk_models_reader *r, const char *key, int64_t def, int64_t lo, int64_t *out);
int tk_models__cfg_num(const json_t *obj, const char *what, const char *key, double def, double *out);
int tk_models__cfg_bool(const tk_models_reader *r, const char *key, int def, int *out);
int tk_models__cfg_str(const tk_models_reader *r, const char *key, const char *def, char *out, size_t cap);
/* TK_ERR_UNSUPPORTED: "'field' is got, which tk does not implement" with a HINT listing `supported`. */
int tk_models__cfg_unsupported(const tk_models_reader *r, const char *field, const char *got, const char *supported);
/* The rope settings (rope_theta, rope_scaling / rope_parameters, partial_rotary_factor) into c->rope. */
int tk_models__cfg_rope(tk_models_config *c, const tk_models_reader *r);
/* key (an activation name, already read into act) is one of ok[] (NULL-terminated), else the error
 * naming it with `supported` as the hint. */
int tk_models__cfg_act(const tk_models_reader *r, const char *key, const char *act, const char *const *ok,
                       const char *supported);
/* layer_types (when present: one "full_attention" / "sliding_attention" per layer) into c->sliding. */
int tk_models__cfg_layer_types(tk_models_config *c, const tk_models_reader *r);

/* ---- the model (models/model.c) --------------------------------------------------------------- */

/* A tensor the model owns or views: its shape lives beside it, so it never points elsewhere. Never
 * copied by value once handed out (t.shape points into the struct). */
typedef struct {
    tk_tensor t;
    int64_t shape[4];
} tk_mt;

/* One forward's batch: T tokens of nseq sequences packed one after another (rows cu[s]..cu[s+1] are
 * sequence s). model.c plans and fills the inputs; the family plans its activations and points hidden
 * (and logits, pooled) at them. */
typedef struct {
    int64_t T, nseq, max_len;
    tk_mt targets;  /* training: [T] i64, the class each row predicts (ignore_index: none) */
    tk_mt loss;     /* training: [1] f32 */
    tk_mt d_hidden; /* training: the gradient of hidden */
    tk_mt tlogits, dlogits; /* training without the fused loss: [T, V] logits and their gradient */
    tk_mt gscratch; /* training: [2, H] f32, the norm backwards' weight and bias gradients before they are added */
    int want_logits; /* this forward's caller asked for logits */
    tk_mt ids; /* [T] i32 */
    tk_mt pos; /* [T] i64: the position of each token in its sequence */
    tk_mt pos32; /* [T] i32: the same, for learned position embeddings */
    tk_mt rope_pos; /* [T] i64: each token's row of the rope table: pos, plus the rope's original_max_pos
                     * for a sequence longer than that under LongRoPE (the table holds the short
                     * factors' rows, then the long ones': each sequence picks its own, as transformers
                     * does for it alone) */
    tk_mt tp_ids; /* tensor parallelism with a vocabulary-parallel embedding: [T] i32, each id's row of the
                   * rank's table (id - vocab_off), or vocab_len (a zero row) for an id outside its range */
    tk_mt cu;  /* [nseq + 1] i32 */
    tk_mt tt;  /* [T] i32 zeros: BERT's token types */
    tk_mt *hidden; /* [T, H] */
    tk_mt *logits; /* [T, V], NULL without an LM head */
    /* Generation: host cu_seqlens [nseq + 1]; only each sequence's last row of logits is wanted, so
     * tk_models__linear computes only those rows of it (the others are left as they were). NULL:
     * every row. */
    const int32_t *logits_last;
    tk_mt *pooled; /* [nseq, H] BERT's pooler output, or NULL */
    /* Generation's paged KV cache (generate.c; NULL for a plain forward): this step's keys and values
     * go to cache slots kv_slots, and attention reads the cache through the block tables, unless every
     * sequence starts empty (kv_prefill: attention over the batch's own keys, as a plain forward). */
    struct tk_kv *kv;
    int kv_prefill;
    tk_mt kv_slots; /* [T] i64 */
    tk_mt kv_bt;    /* [nseq, max_blocks_per_seq] i32 */
    tk_mt kv_sl;    /* [nseq] i32: lengths after this step */
    /* A step that mixes fresh sequences with cached ones (continuous batching, kv_prefill 0): the
     * attention of the packed tokens runs in kv_nruns runs of consecutive tokens (tk_models__attend). */
    struct tk_models_kvrun *kv_runs;
    int64_t kv_nruns;
} tk_models_batch;

/* One attention run of a mixed KV step: tokens [t0, t0 + ntok). fresh: sequences that start empty,
 * attended over their own keys (the `attention` op with cu, as a prefill); else nrows rows of sq new
 * tokens each (a sequence's new tokens cut into rows of at most 16, each row seeing the keys up to
 * its own end) through attention_decode with the rows' block tables bt and lengths sl. */
typedef struct tk_models_kvrun {
    int fresh;
    int64_t t0, ntok, nrows, sq, max_len;
    tk_mt cu; /* fresh: [nrows + 1] i32, offsets from t0 */
    tk_mt bt; /* else: [nrows, max_blocks_per_seq] i32 */
    tk_mt sl; /* else: [nrows] i32 */
} tk_models_kvrun;

/* Where a weight comes from in the checkpoint (training names its gradients and saves a checkpoint
 * through it): one HF tensor whole, the rows of several concatenated (tk_models__weight_cat), or
 * columns [c0, c0 + nc) of one [rows, cols] tensor (tk_models__weight_cols; rows 0: a 1-D [cols]). */
enum { TK_MODELS_SRC_WHOLE = 0, TK_MODELS_SRC_CAT = 1, TK_MODELS_SRC_COLS = 2, TK_MODELS_SRC_ROWS = 3 };
#define TK_MODELS_SRC_MAX 8

typedef struct {
    int kind;
    int n;                               /* names: 1, or CAT's parts */
    char *names[TK_MODELS_SRC_MAX];
    int64_t rows, cols, c0, nc;          /* CAT: each part's [rows, cols] (cols 0: 1-D); COLS: see above */
} tk_models_src;

typedef struct {
    tk_mt mt;
    void *owned; /* memory this weight owns (host, or device when on a GPU), or NULL: a view of the
                  * mapping (mapped 1) or of the model's huge-page copies (tk_model.hw) */
    int mapped;
    tk_models_src src;
    /* Training (models/train.c): the gradient (f32, same shape), or NULL; an embedding table (no weight
     * decay unless asked). */
    tk_mt *grad;
    int embedding;
} tk_models_weight;

/* Tensor parallelism (a model loaded with a communicator of several ranks; docs/parallel.md): the plan
 * and what this rank computes. The family's load sets the sizes and the split flags. */
typedef struct {
    tk_comm *comm;
    int rank, world;
    tk_tp_plan *plan;
    int64_t heads, kv_heads, inter;  /* this rank's attention heads, kv heads and MLP width */
    int64_t moe_inter;               /* and each expert's MLP width (a mixture of experts) */
    int64_t vocab_off, vocab_len;    /* the vocabulary rows this rank's embedding and LM head hold */
    int embed_split;                 /* embed_tokens vocabulary-parallel: partial lookups, all-reduced */
    int head_split;                  /* the LM head split on the vocabulary: the logits gathered */
    int64_t full_bytes;              /* what the weights would take unsplit (one process), compute dtype */
    /* generation's vocabulary-parallel pick (models/tp_pick.c): while local_logits is set, a split head
     * writes only this rank's columns of each logits row (the rest -inf) and gathers nothing; head_bytes
     * counts the bytes this rank sent for the head (logits gathers and picks) */
    int local_logits;
    int64_t head_bytes;
    /* top-p's rows whose threshold came from the ranks' largest tokens in one round, and those that
     * needed the bit-by-bit search (tp_pick.c, top_p_union) */
    int64_t topp_union_rows, topp_search_rows;
} tk_models_tp;

struct tk_model {
    uint32_t magic;
    tk_ctx *ctx;
    char *dir;
    tk_models_config cfg;
    tk_st_set *st;
    const tk_models_arch *arch;
    int dev_type, dev_id;     /* TK_DEV_CPU / TK_DEV_CUDA */
    tk_dtype dtype;           /* compute dtype: weights and activations */
    tk_models_weight **w;     /* every weight, each allocated once (pointers to them stay valid) */
    size_t nw, capw;
    int64_t params;           /* parameters of the checkpoint the model uses (tied ones once) */
    int64_t weight_bytes;     /* bytes the weights take in the compute dtype */
    int64_t mapped_bytes;     /* of those, bytes read in place from the mapping */
    int64_t hugepage_bytes;   /* of those, bytes copied as stored into huge pages (hw) */
    tk_models_hw *hw;
    int map_weights;          /* tk_model_opts.map_weights or TK_MAP_WEIGHTS: no huge-page copies */
    void *state;              /* the family's weight table and activations */
    /* The activation arena, planned for one batch shape (T, nseq). */
    void *ws;
    size_t ws_bytes, ws_used;
    int ws_counting;          /* 1 while planning: tk_models__ws_tensor only counts */
    int planned;
    /* An architecture's own input to its plan beyond (T, nseq), set before tk_model_forward: the arena
     * is planned again when it changes (DiffusionGemma: the logits' rows of a denoising step, whose
     * encoder rows need none; 0 elsewhere). */
    int64_t plan_key, planned_key;
    tk_models_batch batch;
    void *host_tmp;           /* host staging for inputs and outputs */
    size_t host_tmp_bytes;
    struct tk_tokenizer *tok; /* loaded on first use */
    int pool_mode;            /* TK_POOL_*: sentence-transformers' 1_Pooling/config.json */
    int normalize;            /* sentence-transformers' Normalize module */
    int64_t max_seq_len;      /* sentence_bert_config.json's max_seq_length; 0: max_pos */
    /* Weight-only quantisation (tk_model_quantize): the dtype of the linear weights' copies (code 0:
     * off), and the copies, keyed by the float weight they replace. Each copy is allocated once: its
     * tensors point at their own shape arrays, so the copies never move when the list grows. */
    tk_dtype quant;
    struct tk_models_qweight **qw;
    size_t nqw, capqw;
    int64_t q_float_bytes, q_bytes; /* the replaced weights' bytes in the compute dtype, and quantised */
    /* Training (models/train.c): while a trainer exists (training), tk_models__prepare plans the
     * family's train_plan (plan_train: what the backward needs) instead of the inference buffers, with
     * per-layer activation checkpointing when train_ckpt; planned_training says which plan the arena
     * holds. train_check: each train_forward step is checked for non-finite values (after a NaN loss,
     * to name the tensor). */
    int training, train_ckpt, train_check, planned_training, plan_train;
    struct tk_trainer *trainer;
    tk_models_tp *tp; /* NULL: one process holds the whole model */
};

enum { TK_POOL_MEAN = 0, TK_POOL_CLS = 1, TK_POOL_MAX = 2 };

/* An architecture's capabilities (tk_models_arch.caps). */
enum {
    TK_ARCH_CAUSAL_LM = 1 << 0, /* a causal LM head: logits, generation (else an encoder: bidirectional) */
    TK_ARCH_BOUNDED_POS = 1 << 1, /* learned position embeddings: a sequence holds at most max_pos tokens */
    TK_ARCH_POOLER = 1 << 2,    /* a pooler output and sentence embeddings (BERT) */
    TK_ARCH_ROPE = 1 << 3,      /* rotary positions: `tk model info` shows the rope type */
    TK_ARCH_TP_LLAMA = 1 << 4,  /* transformers' default tensor-parallel plan of Llama, split by kv heads */
    TK_ARCH_TP_CONV1D = 1 << 5, /* GPT-2's Conv1D [in, out] linear layout for tensor parallelism */
};

/* An architecture: the Hugging Face classes it runs, what it can do, how its config.json reads, and
 * its forward. One file each (models/llama.c, ...; architectures that vary the Llama decoder, such as
 * qwen3.c, hold only their parser and point at llama.c's functions); one row each in the table in
 * config.c. Nothing outside an architecture's file asks which architecture a model is: it asks caps. */
struct tk_models_arch {
    const char *name;           /* "llama": the family `tk model info` shows */
    const char *const *classes; /* architectures[0] values it runs, NULL-terminated: "LlamaForCausalLM" */
    unsigned caps;              /* TK_ARCH_* */
    const char *prefix;         /* the base model's weight-name prefix ("model."), for tensor-parallel plans */
    /* Reads the family's fields of config.json into c (the common ones, arch, model_type, dtype and
     * token ids, are read before). Errors as tk_models__config_parse. */
    int (*parse)(tk_models_config *c, const tk_models_reader *r);
    /* Looks up and converts the weights (tk_models__weight*) into the family's state (m->state). */
    int (*load)(tk_model *m);
    /* Plans the activations for b (tk_models__ws_tensor); runs twice: counting, then carving. */
    int (*plan)(tk_model *m, tk_models_batch *b);
    /* The forward, top to bottom: one op call per step. */
    int (*forward)(tk_model *m, tk_models_batch *b);
    void (*free_state)(tk_model *m);
    /* Training (NULL where the family cannot train). train_plan plans what the backward needs (every
     * layer's activations, or with m->train_ckpt only each layer's input) and the gradient buffers, and
     * points b->hidden at the LM head's input; train_forward runs the forward saving them; train_head
     * gives the LM head (weight [V, H'], bias [V] or NULL); train_backward, from d_hidden (the gradient
     * of b->hidden), accumulates every weight's gradient (tk_models__grad). */
    int (*train_plan)(tk_model *m, tk_models_batch *b);
    int (*train_forward)(tk_model *m, tk_models_batch *b);
    void (*train_head)(tk_model *m, const tk_mt **weight, const tk_mt **bias);
    int (*train_backward)(tk_model *m, tk_models_batch *b, const tk_mt *d_hidden);
};

extern const tk_models_arch tk_models__llama, tk_models__gpt2, tk_models__bert;
extern const tk_models_arch tk_models__qwen3, tk_models__olmo2, tk_models__granite, tk_models__smollm3;
extern const tk_models_arch tk_models__gemma, tk_models__gemma2, tk_models__gemma3, tk_models__phi3;
extern const tk_models_arch tk_models__mixtral, tk_models__qwen2_moe, tk_models__qwen3_moe;
extern const tk_models_arch tk_models__llada, tk_models__dream; /* diffusion_lm.c */
extern const tk_models_arch tk_models__diffusion_gemma;            /* block diffusion */
/* The DiffusionGemma encoder's keys and values (diffusion_gemma.c): one sequence's, every layer's over the
 * tokens encoded so far (the prompt, then each finished block), for the denoising steps to read instead of
 * encoding the prefix again. kv_new: room for cap tokens (the prompt, every block and one canvas);
 * kv_free takes NULL; kv_rewind forgets the tokens from len on (TK_DGEMMA_CACHE=0 encodes everything
 * again each step). */
typedef struct tk_models_dgemma_kv tk_models_dgemma_kv;
int tk_models__dgemma_kv_new(tk_models_dgemma_kv **out, tk_model *m, int64_t cap);
void tk_models__dgemma_kv_free(tk_model *m, tk_models_dgemma_kv *kv);
void tk_models__dgemma_kv_rewind(tk_models_dgemma_kv *kv, int64_t len);
/* One sequence of a DiffusionGemma denoising step: ids (len) are the tokens to encode into kv first (the
 * prompt, or the block just finished; none on a block's later steps) followed by the canvas (the model's
 * canvas_length ids); sc the previous step's processed logits [C, V] (f32, NULL on a block's first step);
 * logits receives the canvas's [C, V] (f32, softcapped). */
typedef struct {
    tk_models_dgemma_kv *kv;
    const int32_t *ids;
    size_t len;
    const float *sc;
    float *logits;
} tk_models_dgemma_seq;
/* One denoising step of n sequences in ONE forward (diffusion_gemma.c): the linear layers and the experts
 * run over every sequence's rows at once; each sequence's ids before its canvas are encoded (causal over
 * its cache, their keys and values appended to it), and its canvas attends bidirectionally to its own
 * cache and itself. A sequence's logits are what it gets in a step of its own, up to the rounding of the
 * products over more rows. Errors as tk_model_forward; on an error no cache has grown. */
int tk_models__dgemma_step(tk_model *m, const tk_models_dgemma_seq *q, size_t n);

/* ---- diffusion generation (models/diffusion_lm.c, models/block_diffusion.c) ------------------- */

struct tk_diff_result {
    int32_t *ids;
    size_t n;
    char *text;
    json_t *steps; /* [{"step", "block", "unmasked": [...]}], block diffusion: "accepted" */
    const char *sampler, *end, *alg;
    int64_t gen_length, block_length, blocks, nsteps, mask_id, forwards;
    double ms, sampler_ms; /* the whole generation; of it, the sampler's steps on the host */
};
/* n uniform draws in [0, 1): o->rand's, or splitmix64 advancing *rng */
int tk_models__diff_draws(const tk_diff_opts *o, uint64_t *rng, double *u, size_t n);
/* A sequence of a tk_diff_batch (diffusion_lm.c): what the batch keeps of every sequence. The masked
 * samplers' state (diffusion_lm.c) and block diffusion's (block_diffusion.c) each begin with one. */
typedef struct {
    int64_t id;
    tk_diff_result *r; /* built as it runs: its event's result */
    double t0;         /* its first step's start (0: none yet) */
    int status;        /* its failure, ended */
    char err[512];
} tk_models_dseq;
/* Block diffusion's sequences (block_diffusion.c), what a tk_diff_batch over a DiffusionGemma model runs.
 * new: o (copied) and the prompt checked, its buffers and cache allocated. prepare, before a step: the
 * sequence's part of tk_models__dgemma_step, a block's starting canvas drawn at its start (a failure is
 * the sequence's own; after a failed forward the prepared canvas is not drawn again). advance, after the
 * step: the sampler over its logits, *ended when the sequence is done. finish: its ids and text into
 * its result. free takes NULL. */
int tk_models__block_new(tk_models_dseq **out, tk_model *m, const int32_t *prompt, size_t len, const tk_diff_opts *o);
int tk_models__block_prepare(tk_models_dseq *s, tk_models_dgemma_seq *step);
int tk_models__block_advance(tk_models_dseq *s, int *ended);
int tk_models__block_finish(tk_models_dseq *s);
void tk_models__block_free(tk_models_dseq *s);
/* The Llama decoder's steps (llama.c), which the architectures that vary it reuse. */
/* Reads the Llama decoder's config.json fields (sizes, norms, rope, biases, sliding windows): the
 * activation one of acts (NULL-terminated; acts_hint lists them in the error; acts NULL: the caller
 * checks hidden_act, or reads its own activation field); qwen_window: Qwen's use_sliding_window +
 * max_window_layers decide the sliding layers (else a sliding_window slides every layer); layer_types,
 * when present, decides last. */
int tk_models__decoder_parse(tk_models_config *c, const tk_models_reader *r, const char *const *acts,
                             const char *acts_hint, int qwen_window);
/* Reads the mixture-of-experts fields after tk_models__decoder_parse. qwen 0: Mixtral's
 * (num_local_experts, num_experts_per_tok, every layer sparse, always renormalised, the experts of
 * intermediate_size); 1: Qwen-MoE's (num_experts or num_local_experts, moe_intermediate_size,
 * norm_topk_prob, decoder_sparse_step, mlp_only_layers; shared_expert_intermediate_size when
 * shared_def >= 0). The *_def are the config class's defaults. */
int tk_models__moe_parse(tk_models_config *c, const tk_models_reader *r, int qwen, int64_t topk_def, int64_t inter_def,
                         int64_t shared_def);
int tk_models__decoder_load(tk_model *m);
int tk_models__decoder_plan(tk_model *m, tk_models_batch *b);
int tk_models__decoder_forward(tk_model *m, tk_models_batch *b);
void tk_models__decoder_free(tk_model *m);
/* The table row of a variation of the Llama decoder (qwen3.c, olmo2.c, ...): a causal LM with rotary
 * positions whose weights are named "model.*", run by llama.c's steps with the settings parse sets;
 * it cannot train (its weights may be transformed at load). */
#define TK_MODELS_DECODER_ARCH(nm, cls, parse_fn) TK_MODELS_DECODER_ARCH_CAPS(nm, cls, parse_fn, 0)
/* The same with more caps: TK_ARCH_TP_LLAMA for a variation that splits as Llama does (its plan in
 * transformers is Llama's, its extra weights per head or whole: Qwen3's q/k norms, Gemma's norms). */
#define TK_MODELS_DECODER_ARCH_CAPS(nm, cls, parse_fn, more)                                                           \
    {                                                                                                                  \
        .name = (nm),                                                                                                  \
        .classes = (cls),                                                                                              \
        .caps = TK_ARCH_CAUSAL_LM | TK_ARCH_ROPE | (more),                                                             \
        .prefix = "model.",                                                                                            \
        .parse = (parse_fn),                                                                                           \
        .load = tk_models__decoder_load,                                                                               \
        .plan = tk_models__decoder_plan,                                                                               \
        .forward = tk_models__decoder_forward,                                                                         \
        .free_state = tk_models__decoder_free,                                                                         \
    }
/* Every architecture, in the order `tk model info` lists them; NULL-terminated. */
extern const tk_models_arch *const tk_models__archs[];

/* Looks up the HF tensor `name` (with the shape want[0..ndim), -1 for any size), converts it once to
 * the compute dtype and puts it on the model's device. On the CPU a tensor whose dtype already matches
 * is a view into the mapping. Errors: TK_ERR_INVALID naming the tensor: missing (with the names of
 * the checkpoint it was looked for in), wrong shape, or a dtype that disagrees with the config. */
int tk_models__weight(const tk_mt **out, tk_model *m, const char *name, int ndim, const int64_t *want);
/* Like tk_models__weight, for a tensor that may be absent: *out = NULL and TK_OK then. */
int tk_models__weight_opt(const tk_mt **out, tk_model *m, const char *name, int ndim, const int64_t *want);
/* Like tk_models__weight(_opt with optional), transformed as the architecture computes with it: each
 * element w * mul + add, in f32 before the conversion to the compute dtype (Gemma's (1 + w) norms,
 * embedding scales, multipliers folded into the weights), always a copy the model owns. count 0: a
 * second copy of a tensor already counted (a scaled embedding whose unscaled table is the tied LM
 * head), left out of the parameter count. mul 1, add 0 and count 1 is tk_models__weight. Weights
 * transformed so cannot be trained (their gradients would be of the transform). */
int tk_models__weight_xf(const tk_mt **out, tk_model *m, const char *name, int ndim, const int64_t *want, double mul,
                         double add, int optional, int count);
/* Under tensor parallelism with a split LM head: the rank's vocabulary rows of the [vocab, hidden] tensor
 * name (torch.chunk's, as the head's colwise split takes them) times mul, not counted in the parameters:
 * a head tied to an embedding table the model keeps transformed (Gemma's scaled table) or one scaled
 * itself (Granite's 1 / logits_scaling). */
int tk_models__weight_vocab_rows(const tk_mt **out, tk_model *m, const char *name, double mul);
/* A norm's [d] weight as the model computes with it: offset + w (Gemma's 1 + w) in f32 whatever the
 * model's dtype, as transformers' GemmaRMSNorm multiplies by (1 + w.float()) before its one rounding
 * (rms_norm and fused_add_rms_norm take an f32 weight over 16-bit x); offset 0: tk_models__weight. */
int tk_models__norm_weight(const tk_mt **out, tk_model *m, const char *name, int64_t d, double offset);
/* Concatenates n HF tensors, each [rows, cols] (1-D [rows] when cols == 0), along dim 0 into one
 * weight the model owns: Llama's gate_proj and up_proj become one [2I, H] for silu_and_mul, a MoE
 * layer's experts one [E * 2I, H] (any n; the weight's source keeps the first TK_MODELS_SRC_MAX names,
 * which only training reads, and sparse layers do not train). */
int tk_models__weight_cat(const tk_mt **out, tk_model *m, const char *const *names, int n, int64_t rows, int64_t cols);
/* Columns [c0, c0 + nc) of a [rows, cols] HF tensor (1-D [cols] when rows == 0) as a weight of its own:
 * GPT-2's fused c_attn (Conv1D [in, 3 out]) split into q, k and v, each still [in, out]. */
int tk_models__weight_cols(const tk_mt **out, tk_model *m, const char *name, int64_t rows, int64_t cols, int64_t c0,
                           int64_t nc);

/* Rows [r0, r0 + nr) of a [rows, cols] HF tensor as a weight of its own: Phi-3's fused qkv_proj split
 * into q, k and v (source kind TK_MODELS_SRC_ROWS, c0/nc holding r0/nr; training does not save such
 * weights: the architectures that use it do not train). */
int tk_models__weight_rows(const tk_mt **out, tk_model *m, const char *name, int64_t rows, int64_t cols, int64_t r0,
                           int64_t nr);

/* Carves an activation tensor out of the arena: during planning it only counts bytes. */
int tk_models__ws_tensor(tk_model *m, tk_mt *t, tk_dtype dt, int ndim, const int64_t *shape);
/* A view of t with another shape of the same numel (a reshape). */
void tk_models__view(tk_mt *v, const tk_mt *t, int ndim, const int64_t *shape);
/* Rows [r0, r0 + nr) of a tensor whose first dimension is rows. */
void tk_models__rows(tk_mt *v, const tk_mt *t, int64_t r0, int64_t nr);

/* Runs an op through tk_op_run on the model's context and device; a failure names the op. */
int tk_models__op(tk_model *m, const char *op, const tk_arg *args, size_t nargs);

/* A linear weight's quantised copy (tk_model_quantize). */
struct tk_models_qweight {
    const tk_mt *w; /* the float weight it stands for */
    tk_mt q, scale; /* [N, K] i8 / fp8_e4m3, [N] f32 */
    void *mem;      /* q's and scale's memory (device on a GPU) */
};

/* y = x W^T (+ bias) for a linear layer's weight w ([N, K], or [K, N] with transposed: GPT-2's
 * Conv1D): the `linear` op, or with weight-only quantisation on (tk_model_quantize) `casted_linear`
 * over w's i8 / fp8_e4m3 copy with per-row scales, made the first time w is used. */
int tk_models__linear(tk_model *m, const tk_mt *out, const tk_mt *x, const tk_mt *w, const tk_mt *bias, int transposed);

/* The attention of layer l over q, k, v ([1, T, heads, D] views; out likewise): a plain forward's
 * (varlen, causal), or with generation's KV cache, after appending k and v to the layer's cache, the
 * decode attention over the cache (attention_decode with the batch's block tables). scale 0: 1/sqrt(D);
 * window_left -1: none; the scores are softcapped by m->cfg.attn_softcap when it is set. */
int tk_models__attend(tk_model *m, tk_models_batch *b, int64_t l, const tk_mt *out, const tk_mt *q, const tk_mt *k,
                      const tk_mt *v, double scale, int64_t window_left);
/* Tensor parallelism: the plan's entry for checkpoint tensor `name` (NULL without a plan, or for a name
 * the checkpoint lacks); sums t over the ranks in place (TK_OK at once without tensor parallelism);
 * the KV heads this process caches (every kv head, or the rank's). */
const tk_tp_param *tk_models__tp_param(const tk_model *m, const char *name);
int tk_models__tp_reduce(tk_model *m, const tk_mt *t);
/* A family's check of the plan before its load: every tensor of layer l (named `layers`N.name) must be
 * split as want says (dim -1: whole; split: the packed blocks), the input embedding `embed` on the
 * vocabulary (embedding_rowwise) or whole, lm_head colwise* or whole; anything else is refused naming
 * the tensor, its style and rule (hint: the family's split, for the message). Sets m->tp's embed_split
 * and head_split (a tied head: from the plan's lm_head rule). */
typedef struct {
    const char *name;
    int dim, split;
} tk_models_tp_want;
int tk_models__tp_check(tk_model *m, const char *layers, const tk_models_tp_want *want, size_t nwant, const char *embed,
                        const char *hint);
int64_t tk_models__kv_heads(const tk_model *m);

/* Generation's pick over a vocabulary-parallel LM head (models/tp_pick.c; docs/parallel.md): one row's
 * final choice, after the processors that need no other rank's logits ran on the rank's columns. */
typedef struct {
    int sample;     /* 0: greedy, the argmax op's choice; 1: the sample op's draw at temperature 1 */
    int64_t top_k;  /* sampling: transformers' top-k filter (ties kept) before the draw; 0 off */
    uint64_t seed;  /* sampling: the per-row seed and the op's offset (the step) */
    int64_t offset;
    double top_p;     /* sampling: transformers' top-p filter (min_keep 1) after top-k; 1 off */
    double min_p;     /* sampling: transformers' min-p filter (min_keep 1) after top-p; 0 off */
    const float *raw; /* the row before the processors (its columns [vocab_off, +vocab_len) valid) when the
                       * token's log-probability is wanted (log_softmax of the raw logits), else NULL */
    int top_n;        /* with raw: also the top_n (<= TK_GEN_MAX_TOP_LOGPROBS) most likely tokens' */
} tk_models_tp_pick;
/* A row's log-probabilities as one process's log_softmax gives them: the picked token's, and the top_n
 * most likely (ntop of them set: fewer when fewer are not NaN). */
typedef struct {
    float logprob;
    int ntop;
    int32_t top_ids[TK_GEN_MAX_TOP_LOGPROBS];
    float top_vals[TK_GEN_MAX_TOP_LOGPROBS];
} tk_models_tp_lp;
/* m's LM head is split on the vocabulary over several ranks (a pick can run on the ranks' columns). */
int tk_models__tp_vocab_parallel(const tk_model *m);
/* The pick of a step's n rows sends fewer bytes than gathering their logits rows would (every row sent
 * at the step's widest record: the largest top-k and top_n, top-p and min-p if any row uses them). */
int tk_models__tp_pick_cheaper(const tk_model *m, const tk_models_tp_pick *p, size_t n);
/* Collective: the token of each of n rows (rows[i]: a logits row of V floats of which this rank's
 * columns [vocab_off, +vocab_len) are valid; top-k and min-p mask them in place) into tok[i], exactly the
 * one one process's processors and argmax or sample op give over the whole row; -1 where no logit is
 * above -inf; and, for the rows with p[i].raw, lp[i] (lp may be NULL when no row has raw). All-gathers
 * for the n rows: the ranks' bests, maxima and top-k keys; the softmax sums (log-probabilities, top-p,
 * min-p); with top-p, ceil((32 + bits(V - 1)) / 4) rounds of its threshold search, and with top-p and
 * min-p together min-p's sums again; the sampling masses; the drawn tokens with the log-probabilities. */
int tk_models__tp_pick(tk_model *m, float *const *rows, size_t n, const tk_models_tp_pick *p, int64_t *tok,
                       tk_models_tp_lp *lp);
/* Collective: tk_gen__log_softmax of each of n rows over the ranks, in place on this rank's columns (the
 * others untouched): one process's values, from two all-gathers (the rows' maxima, their exact sums).
 * *bad: the first row that holds a NaN or a +inf (whose log-softmax is NaN: beam search fails on it),
 * left as it is, or n; the same on every rank. */
int tk_models__tp_log_softmax(tk_model *m, float *const *rows, size_t n, size_t *bad);
/* Collective: every rank's n i64 of mine into all (rank-major), counted in head_bytes (beam search's
 * candidates). */
int tk_models__tp_gather_i64(tk_model *m, int64_t *all, int64_t *mine, size_t n, const char *what);

/* Generation's step (generate.c): sequence s of nseq gets tokens ids[cu[s]..cu[s+1]) after the ones its
 * KV slot slots[s] holds; writes each sequence's last-token logits (f32, host) to logits [nseq, V]. */
int tk_models__forward_kv(tk_model *m, struct tk_kv *kv, const int32_t *slots, size_t nseq, const int32_t *ids,
                          const int32_t *cu, float *logits);

/* ---- training (models/train.c) ----------------------------------------------------------------- */

/* model.c's own steps, for train.c: check a batch, plan for its shape and fill m->batch's inputs; the
 * model's device memory (a malloc on the CPU) and copies to and from it. */
int tk_models__prepare(tk_model *m, const int32_t *ids, const size_t *lens, size_t nseq);
int tk_models__dev_alloc(tk_model *m, void **p, size_t bytes);
void tk_models__dev_free(tk_model *m, void *p);
int tk_models__to_dev(tk_model *m, void *dst, const void *src, size_t n);
int tk_models__from_dev(tk_model *m, void *dst, const void *src, size_t n);

/* The weight a model tensor belongs to (every tk_mt the families get from tk_models__weight* is one). */
tk_models_weight *tk_models__weight_of(const tk_mt *w);
/* The gradient of weight w while training, or NULL. */
const tk_mt *tk_models__grad(const tk_mt *w);
/* Marks w as an embedding table (no weight decay unless asked). */
void tk_models__mark_embedding(const tk_mt *w);
/* The train plan's extra tensors (the head's logits and targets), after the family's train_plan. */
int tk_models__train_plan_head(tk_model *m, tk_models_batch *b);
/* With m->train_check: TK_ERR_INVALID naming `what` when t holds a NaN or an infinity. */
int tk_models__train_check(tk_model *m, const char *what, int64_t layer, const tk_mt *t);
/* The backward steps the families' train_backward is made of, each one tk_op_run (or two), finding
 * the weights' gradients themselves:
 *   t_linear_bwd  gx (+)= go W (accumulate), grad(W) += go^T x, grad(bias) += sum(go)  (gx may be NULL)
 *   t_norm_bwd    rms (bias NULL and rms = 1) or layer norm of x: gi = norm'(go) (+ gres when given:
 *                 the residual's gradient that joins it), grad(w) += , grad(bias) +=
 *   t_emb_bwd     grad(w)[ids] += go, padding_idx pad (-1: none)
 *   t_attention / t_attention_bwd   attention over the batch (varlen, or dense [nseq, S] when every
 *                 sequence has one length) on q [T, Hq, D], k, v [T, Hkv, D], with lse [Hq * T] f32 */
int tk_models__t_linear_bwd(tk_model *m, const tk_mt *gx, int accumulate, const tk_mt *go, const tk_mt *x,
                            const tk_mt *w, const tk_mt *bias, int transposed);
int tk_models__t_norm_bwd(tk_model *m, int rms, const tk_mt *gi, const tk_mt *go, const tk_mt *gres, const tk_mt *x,
                          const tk_mt *w, const tk_mt *bias);
int tk_models__t_emb_bwd(tk_model *m, const tk_mt *go, const tk_mt *ids, const tk_mt *w, int64_t pad);
int tk_models__t_attention(tk_model *m, tk_models_batch *b, const tk_mt *out, const tk_mt *lse, const tk_mt *q,
                           const tk_mt *k, const tk_mt *v, double scale, int causal, int64_t window_left);
int tk_models__t_attention_bwd(tk_model *m, tk_models_batch *b, const tk_mt *dq, const tk_mt *dk, const tk_mt *dv,
                               const tk_mt *dout, const tk_mt *q, const tk_mt *k, const tk_mt *v, const tk_mt *out,
                               const tk_mt *lse, double scale, int causal, int64_t window_left);
/* Per-layer tensors a train_plan carves: for l < n, ws_tensor of arr[l] (arr allocated on first use and
 * owned by the caller's state). */
int tk_models__t_layers(tk_model *m, tk_mt **arr, int64_t n, tk_dtype dt, int ndim, const int64_t *shape);

#define TK_A_T(nm, tensor) {TK_ARG_TENSOR, nm, &(tensor)->t, 0, 0}
#define TK_A_I(nm, v) {TK_ARG_I64, nm, NULL, (int64_t)(v), 0}
#define TK_A_F(nm, v) {TK_ARG_F64, nm, NULL, 0, (double)(v)}
#define TK_NARGS(a) (sizeof(a) / sizeof((a)[0]))

#endif /* TK_MODELS_H */
