/*
 * cmd_generate.c — tk generate: text generation with a Hugging Face checkpoint directory (Llama
 * family, GPT-2) through tk_generate, with the checkpoint's generation_config.json as defaults and
 * flags named like transformers' GenerationConfig fields. Text streams to stdout as it is generated.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cli.h"

static const char *USAGE = "tk generate [options] DIR (--prompt TEXT | --ids ID,ID,...) ...";

static void help(void)
{
    printf("usage: %s\n"
           "\n"
           "Continues a prompt with a causal language model from a Hugging Face checkpoint directory\n"
           "(config.json, *.safetensors, tokenizer.json: LlamaForCausalLM, MistralForCausalLM,\n"
           "Qwen2ForCausalLM, Qwen3ForCausalLM, Olmo2ForCausalLM, GraniteForCausalLM,\n"
           "SmolLM3ForCausalLM, GemmaForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM,\n"
           "Phi3ForCausalLM, MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM,\n"
           "GPT2LMHeadModel) the way\n"
           "transformers' generate() does: the same logits processors in the same order, greedy\n"
           "decoding, sampling or beam search. Defaults come from the checkpoint's\n"
           "generation_config.json, then from transformers 5's defaults (20 new tokens, top_k 50 when\n"
           "sampling); flags override them. Every layer runs through the op registry, with\n"
           "a paged KV cache (paged_kv_append, attention_decode). Text prints as it is generated, never\n"
           "splitting a UTF-8 character.\n"
           "\n"
           "input (one of; --prompt and --ids may repeat: the prompts run as one batch):\n"
           "  --prompt TEXT              text, encoded with DIR/tokenizer.json (special tokens added, as\n"
           "                             tokenizer(text))\n"
           "  --ids ID,ID,...            token ids\n"
           "\n"
           "generation (GenerationConfig's fields):\n"
           "  --max-new-tokens N         tokens to generate at most (> 0)\n"
           "  --max-length N             prompt + new tokens, when --max-new-tokens is not given\n"
           "  --do-sample                sample (seeded) instead of greedy decoding\n"
           "  --temperature T            sampling temperature (> 0)\n"
           "  --top-k K                  sampling: keep the K most likely tokens (0: off)\n"
           "  --top-p P                  sampling: nucleus mass in (0, 1]\n"
           "  --min-p P                  sampling: drop tokens below P x the top probability\n"
           "  --repetition-penalty R     penalise tokens already in the sequence (1: off)\n"
           "  --no-repeat-ngram-size N   never repeat an N-gram (0: off)\n"
           "  --num-beams N              beam search with N beams (1: off)\n"
           "  --length-penalty L         beam scores divided by length^L\n"
           "  --early-stopping V         beam search: true, false or never\n"
           "  --eos-token-id ID[,ID...]  end on any of these (replaces the checkpoint's)\n"
           "  --stop STRING              end once the text contains STRING (may repeat)\n"
           "  --seed S                   the sampler's seed (default 0)\n"
           "\n"
           "runtime:\n"
           "  --dtype f32|bf16|f16       compute dtype (default f32)\n"
           "  --device cpu|cuda[:N]      where the model runs (default cpu)\n"
           "  --kv-dtype DT              KV cache dtype: the compute dtype (default); f16 / bf16 under an\n"
           "                             f32 model on the CPU (half the bytes decode's attention reads); or\n"
           "                             i8 / fp8_e4m3 with per-head scales set from the prefill (a quarter\n"
           "                             of f32's bytes)\n"
           "  --kv-block-size N          tokens per KV block: a power of two, 8 to 256 (default 16)\n"
           "  --kv-max-bytes N           bound on the KV cache (default: none)\n"
           "  --quant int8|fp8           weight-only quantisation: every linear layer runs as casted_linear\n"
           "                             over an int8 or fp8_e4m3 copy of its weight (a scale per row);\n"
           "                             the memory it saves and the prompt's logit error are reported\n"
           "                             (--stats, or \"quant\" in --json)\n"
           "  --threads N                CPU threads for the ops (default: $TK_NUM_THREADS, else every\n"
           "                             CPU this process may use; docs/cpu.md)\n"
           "  --no-cache                 recompute the whole sequence every step (the reference path)\n"
           "  --tp N                     tensor parallelism over N ranks, started by mpirun -np N (the\n"
           "                             world size must be N): each rank holds its slices of the weights\n"
           "                             and its heads' KV cache; the tokens are the same as one process's\n"
           "                             (sampling: the same --seed on every rank); rank 0 alone prints,\n"
           "                             with every rank's weight bytes in --stats and --json. Llama,\n"
           "                             Mistral, Qwen2, Qwen3, OLMo2, Gemma 1-3, Granite, SmolLM3,\n"
           "                             Phi-3, Mixtral, Qwen2/3-MoE, and GPT-2 with --tp-plan, on the\n"
           "                             CPU or with --device cuda on GPUs: NCCL when every rank has a GPU\n"
           "                             of its own, else MPI staging through host memory (rank 0 says\n"
           "                             which; TK_COMM_BACKEND=nccl|mpi forces one; never yet run on a\n"
           "                             GPU: docs/parallel.md)\n"
           "  --tp-plan FILE             the tensor-parallel plan (transformers' tp_plan JSON) instead of\n"
           "                             config.json's base_model_tp_plan or transformers' default\n"
           "  --stats                    print timings and KV-cache memory to stderr\n"
           "  --json                     print {\"ids\": [new ids], \"text\": \"...\", \"end\": \"eos\", \"stats\":\n"
           "                             {...}} instead of streaming (an array of them for several prompts)\n"
           "\n"
           "log-probabilities (greedy decoding and sampling; not with --num-beams > 1):\n"
           "  --logprobs                 each new token's log-probability under the model: log_softmax of\n"
           "                             the raw logits, before penalties, temperature and top-k/top-p/min-p\n"
           "                             (tk serve-model's logprobs). A table follows each prompt's text: a\n"
           "                             row a token (step, id, logprob, its text as a JSON string), then the\n"
           "                             sum, mean and perplexity; --json adds \"logprobs\": [{\"id\", \"text\",\n"
           "                             \"logprob\", \"top\": [...]}] and \"logprob_sum\" (NaN and inf as null)\n"
           "  --top-logprobs N           and the N most likely tokens at each step, 0 to %d (the table's\n"
           "                             #1, #2, ... rows; implies --logprobs)\n"
           "\n"
           "masked diffusion (LLaDA, Dream; 'tk generate --diffusion --help' has the details):\n"
           "  --diffusion                generate by masked diffusion (automatic for LLaDAModelLM and\n"
           "                             DreamModel checkpoints); with --gen-length, --block-length,\n"
           "                             --steps, --remasking, --cfg-scale, --alg, --alg-temp, --eps,\n"
           "                             --sampler, --mask-token-id, --bidirectional, --draws, --show-steps\n"
           "\n"
           "examples:\n"
           "  tk generate ./TinyLlama --prompt 'Once upon a time' --max-new-tokens 40\n"
           "  tk generate ./gpt2 --ids 464,2068 --num-beams 4 --max-new-tokens 10 --json\n"
           "  tk generate ./gpt2 --prompt 'Hi' --do-sample --top-p 0.9 --temperature 0.7 --seed 7\n"
           "  tk generate ./gpt2 --prompt 'The capital of France is' --max-new-tokens 3 --top-logprobs 5\n"
           "  mpirun -np 2 tk generate ./TinyLlama --prompt 'Once upon a time' --tp 2\n"
           "\n"
           "exit status: 0 ok, 1 a model or generation failure (out of memory, an op error), 2 usage or\n"
           "invalid input (an empty or too long prompt, an option out of range), 3 no checkpoint or\n"
           "tokenizer, 5 a damaged checkpoint (a truncated safetensors file), 7 no GPU for --device\n"
           "cuda, 8 an architecture, config value or option tk does not implement.\n",
           USAGE, TK_GEN_MAX_TOP_LOGPROBS);
}

typedef struct {
    int stream_text; /* print pieces to stdout */
} stream_ctx;

static int on_token(void *user, size_t seq, int32_t token, const char *text, size_t len)
{
    stream_ctx *s = user;
    (void)seq;
    (void)token;
    if (s->stream_text && len) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
    }
    return 0;
}

static int parse_f(const char *usage, const char *flag, const char *v, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double d = v ? strtod(v, &end) : NAN;
    if (!v || errno || end == v || *end || !(d >= lo && d <= hi))
        return tk_cli_usage(usage, "%s wants a number in [%g, %g], got '%s'", flag, lo, hi, v ? v : "");
    *out = d;
    return 0;
}

static int parse_i(const char *usage, const char *flag, const char *v, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long x = v ? strtoll(v, &end, 10) : 0;
    if (!v || errno || end == v || *end || x < lo || x > hi)
        return tk_cli_usage(usage, "%s wants an integer in [%lld, %lld], got '%s'", flag, lo, hi, v ? v : "");
    *out = x;
    return 0;
}

/* "1,2,3" → ids (malloc'd). */
static int parse_id_list(const char *usage, const char *flag, const char *v, int32_t **out, size_t *n)
{
    size_t cap = 16, k = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    const char *p = v;
    if (!ids)
        return TK_EXIT_FAIL;
    while (p && *p) {
        while (*p == ',' || *p == ' ')
            p++;
        if (!*p)
            break;
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (errno || end == p || x < 0 || x > INT32_MAX || (*end && *end != ',' && *end != ' ')) {
            free(ids);
            return tk_cli_usage(usage, "%s wants non-negative token ids separated by commas, got '%s'", flag, v);
        }
        if (k == cap) {
            int32_t *q = realloc(ids, (cap *= 2) * sizeof *q);
            if (!q) {
                free(ids);
                return TK_EXIT_FAIL;
            }
            ids = q;
        }
        ids[k++] = (int32_t)x;
        p = end;
    }
    *out = ids;
    *n = k;
    return 0;
}

/* Generation flags shared with tk chat (cli.h). */
int tk_cli_gen_flag(const char *a)
{
    static const char *const valued[] = {"--max-new-tokens",
                                         "--max-length",
                                         "--temperature",
                                         "--top-k",
                                         "--top-p",
                                         "--min-p",
                                         "--repetition-penalty",
                                         "--no-repeat-ngram-size",
                                         "--num-beams",
                                         "--length-penalty",
                                         "--early-stopping",
                                         "--eos-token-id",
                                         "--seed",
                                         "--kv-dtype",
                                         "--kv-block-size",
                                         "--kv-max-bytes",
                                         NULL};
    if (!strcmp(a, "--do-sample") || !strcmp(a, "--no-cache"))
        return 1;
    for (size_t i = 0; valued[i]; i++)
        if (!strcmp(a, valued[i]))
            return 2;
    return 0;
}

int tk_cli_gen_apply(tk_gen_opts *o, const char *usage, const char *n, const char *v)
{
    int32_t *eos = NULL;
    long long x = 0;
    double d = 0;
    int u = 0;
    if (!strcmp(n, "--do-sample"))
        o->do_sample = 1;
    else if (!strcmp(n, "--no-cache"))
        o->use_cache = 0;
    else if (!strcmp(n, "--max-new-tokens"))
        u = parse_i(usage, n, v, 0, INT32_MAX, &x), o->max_new_tokens = x;
    else if (!strcmp(n, "--max-length"))
        u = parse_i(usage, n, v, 1, INT32_MAX, &x), o->max_length = x;
    else if (!strcmp(n, "--temperature"))
        u = parse_f(usage, n, v, 0, 1e6, &d), o->temperature = d;
    else if (!strcmp(n, "--top-k"))
        u = parse_i(usage, n, v, 0, INT32_MAX, &x), o->top_k = x;
    else if (!strcmp(n, "--top-p"))
        u = parse_f(usage, n, v, 0, 1, &d), o->top_p = d;
    else if (!strcmp(n, "--min-p"))
        u = parse_f(usage, n, v, 0, 1, &d), o->min_p = d;
    else if (!strcmp(n, "--repetition-penalty"))
        u = parse_f(usage, n, v, 0, 1e6, &d), o->repetition_penalty = d;
    else if (!strcmp(n, "--no-repeat-ngram-size"))
        u = parse_i(usage, n, v, 0, INT32_MAX, &x), o->no_repeat_ngram_size = x;
    else if (!strcmp(n, "--num-beams"))
        u = parse_i(usage, n, v, 1, 256, &x), o->num_beams = x;
    else if (!strcmp(n, "--length-penalty"))
        u = parse_f(usage, n, v, -1e6, 1e6, &d), o->length_penalty = d;
    else if (!strcmp(n, "--seed"))
        u = parse_i(usage, n, v, 0, INT64_MAX, &x), o->seed = (uint64_t)x;
    else if (!strcmp(n, "--kv-dtype"))
        o->kv_dtype = v;
    else if (!strcmp(n, "--kv-block-size"))
        u = parse_i(usage, n, v, 8, 256, &x), o->kv_block_size = x;
    else if (!strcmp(n, "--kv-max-bytes"))
        u = parse_i(usage, n, v, 1, INT64_MAX, &x), o->kv_max_bytes = x;
    else if (!strcmp(n, "--early-stopping")) {
        if (!strcmp(v, "true"))
            o->early_stopping = TK_GEN_EARLY_TRUE;
        else if (!strcmp(v, "false"))
            o->early_stopping = TK_GEN_EARLY_HEURISTIC;
        else if (!strcmp(v, "never"))
            o->early_stopping = TK_GEN_EARLY_NEVER;
        else
            u = tk_cli_usage(usage, "--early-stopping wants true, false or never, got '%s'", v);
    } else if (!strcmp(n, "--eos-token-id")) {
        size_t ne = 0;
        if (!(u = parse_id_list(usage, n, v, &eos, &ne))) {
            if (ne > TK_GEN_MAX_EOS)
                u = tk_cli_usage(usage, "--eos-token-id: at most %d ids", TK_GEN_MAX_EOS);
            for (size_t e = 0; !u && e < ne; e++)
                o->eos_token_id[e] = eos[e];
            o->n_eos = ne;
        }
    }
    free(eos);
    return u;
}

#define MAX_PROMPTS 256
#define MAX_STOPS 32

/* What tk generate works on: the command line, then the model, the prompts and the result. */
typedef struct {
    const char *dir, *dtype, *device, *quant;
    const char *texts[MAX_PROMPTS], *idlists[MAX_PROMPTS], *stops[MAX_STOPS];
    int is_text[MAX_PROMPTS];
    size_t np, nstop;
    int stats;
    /* flags are applied over generation_config.json after the model loads: remember them */
    struct {
        const char *name;
        const char *val;
    } set[64];
    size_t nset;
    tk_model_opts mo;
    tk_gen_opts o;
    tk_model *m;
    tk_tokenizer *tok;
    tk_gen_result *res;
    int32_t *pids[MAX_PROMPTS];
    size_t plens[MAX_PROMPTS];
    char qinfo[512]; /* --quant: the quant JSON with the prompt's logit error, or "" */
    char *sj;        /* the result's stats JSON (--json, --stats) */
    int tp;          /* --tp N, 0 without */
    const char *tp_plan;
    tk_comm *comm;
    json_t *tpr;     /* --tp: every rank's weight bytes (tk_cli_tp_report) */
    int logprobs;    /* --logprobs (or --top-logprobs N > 0) */
    int top;         /* --top-logprobs N */
    const tk_tokenizer *ptok; /* --logprobs: the model's tokenizer for the tokens' text, or NULL */
} gen_job;

#define GO (-1) /* a step's "go on": anything else is the command's exit code */
#define DIFFUSION (-2) /* the checkpoint is a masked diffusion LM: cmd_generate_diffusion.c runs it */

/* parse options: the directory, the prompts, stop strings, runtime flags and the generation flags. */
static int gen_parse(gen_job *j, tk_cli *cli, int argc, char **argv)
{
    j->device = "cpu";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (tk_cli_is_help(a)) {
            help();
            return TK_EXIT_OK;
        }
        int has_val = i + 1 < argc;
        if (!strcmp(a, "--prompt") || !strcmp(a, "--ids")) {
            if (!has_val)
                return tk_cli_usage(USAGE, "%s needs a value", a);
            if (j->np == MAX_PROMPTS)
                return tk_cli_usage(USAGE, "at most %d prompts", MAX_PROMPTS);
            j->is_text[j->np] = !strcmp(a, "--prompt");
            j->texts[j->np] = j->is_text[j->np] ? argv[i + 1] : NULL;
            j->idlists[j->np] = j->is_text[j->np] ? NULL : argv[i + 1];
            j->np++;
            i++;
        } else if (!strcmp(a, "--stop")) {
            if (!has_val || !argv[i + 1][0])
                return tk_cli_usage(USAGE, "--stop needs a non-empty string");
            if (j->nstop == MAX_STOPS)
                return tk_cli_usage(USAGE, "at most %d stop strings", MAX_STOPS);
            j->stops[j->nstop++] = argv[++i];
        } else if (!strcmp(a, "--do-sample") || !strcmp(a, "--no-cache")) {
            j->set[j->nset].name = a;
            j->set[j->nset++].val = NULL;
        } else if (!strcmp(a, "--stats")) {
            j->stats = 1;
        } else if (!strcmp(a, "--logprobs")) {
            j->logprobs = 1;
        } else if (!strcmp(a, "--top-logprobs")) {
            long long x = 0;
            int u = parse_i(USAGE, a, has_val ? argv[++i] : NULL, 0, TK_GEN_MAX_TOP_LOGPROBS, &x);
            if (u)
                return u;
            j->top = (int)x;
            j->logprobs |= x > 0; /* as tk_gen_opts: the alternatives come with the chosen token's */
        } else if (!strcmp(a, "--tp")) {
            int u = tk_cli_tp_parse(USAGE, has_val ? argv[++i] : NULL, &j->tp);
            if (u)
                return u;
        } else if (!strcmp(a, "--tp-plan")) {
            if (!has_val)
                return tk_cli_usage(USAGE, "--tp-plan needs a plan file");
            j->tp_plan = argv[++i];
        } else if (!strcmp(a, "--threads")) {
            int u = tk_cli_parse_threads(cli, USAGE, has_val ? argv[++i] : NULL);
            if (u)
                return u;
        } else if (!strcmp(a, "--dtype") || !strcmp(a, "--device") || !strcmp(a, "--quant")) {
            if (!has_val)
                return tk_cli_usage(USAGE, "%s needs a value", a);
            if (!strcmp(a, "--dtype"))
                j->dtype = argv[++i];
            else if (!strcmp(a, "--quant"))
                j->quant = argv[++i];
            else
                j->device = argv[++i];
            if (j->quant && strcmp(j->quant, "int8") && strcmp(j->quant, "fp8") && strcmp(j->quant, "none"))
                return tk_cli_usage(USAGE, "--quant wants int8, fp8 or none, got '%s'", j->quant);
        } else if (tk_cli_gen_flag(a) == 2) { /* a GenerationConfig field with a value */
            if (!has_val)
                return tk_cli_usage(USAGE, "%s needs a value", a);
            if (j->nset == sizeof j->set / sizeof j->set[0])
                return tk_cli_usage(USAGE, "too many options");
            j->set[j->nset].name = a;
            j->set[j->nset++].val = argv[++i];
        } else if (a[0] == '-' && a[1]) {
            return tk_cli_usage(USAGE, "unknown option '%s' (see tk generate --help)", a);
        } else if (!j->dir) {
            j->dir = a;
        } else {
            return tk_cli_usage(USAGE, "unexpected argument '%s' (the prompt goes after --prompt)", a);
        }
    }
    if (!j->dir)
        return tk_cli_usage(USAGE, "a checkpoint directory, e.g. tk generate ./gpt2 --prompt 'Hello'");
    if (j->np == 0)
        return tk_cli_usage(USAGE, "a prompt: --prompt TEXT or --ids ID,ID,...");
    if (j->tp_plan && !j->tp)
        return tk_cli_usage(USAGE, "--tp-plan goes with --tp N");
    return GO;
}

/* validate --device (cpu, cuda, cuda:N) and --dtype into the model options. */
static int gen_model_opts(gen_job *j)
{
    const char *device = j->device;
    j->mo = (tk_model_opts)TK_MODEL_OPTS_INIT;
    j->mo.dtype = j->dtype;
    int id;
    if (tk_cli_parse_device(device, &id))
        return tk_cli_usage(USAGE, "--device wants cpu, cuda or cuda:N, got '%s'", device);
    j->mo.device_type = id < 0 ? TK_DEV_CPU : TK_DEV_CUDA;
    j->mo.device_id = id < 0 ? 0 : id;
    return GO;
}

/* resolve: the model, its generation_config.json, then the flags over it. */
static int gen_load(gen_job *j, tk_cli *cli)
{
    tk_ctx *ctx = tk_cli_ctx(cli);
    int rc;
    if (!ctx)
        return TK_EXIT_FAIL;
    if (j->tp && (rc = tk_cli_tp_join(cli, &j->comm, j->tp, j->device, &j->mo.device_id)) != 0)
        return rc;
    j->mo.comm = j->comm;
    j->mo.tp_plan = j->tp_plan;
    if ((rc = tk_model_load(&j->m, ctx, j->dir, &j->mo)) != TK_OK)
        return tk_cli_fail(cli, rc, NULL);
    if (tk_model_diffusion(j->m)) /* LLaDA, Dream: masked diffusion, never token by token */
        return DIFFUSION;
    j->o = (tk_gen_opts)TK_GEN_OPTS_INIT;
    if ((rc = tk_gen_opts_from_model(&j->o, j->m)) != TK_OK)
        return tk_cli_fail(cli, rc, NULL);
    for (size_t k = 0; k < j->nset; k++) {
        int u = tk_cli_gen_apply(&j->o, USAGE, j->set[k].name, j->set[k].val);
        if (u)
            return u;
        if (!strcmp(j->set[k].name, "--eos-token-id")) /* as transformers: accepted, but it never comes */
            for (size_t e = 0; e < j->o.n_eos; e++)
                if (j->o.eos_token_id[e] >= tk_model_vocab_size(j->m))
                    tk_cli_warn(cli,
                                "--eos-token-id %d is outside the vocabulary [0, %lld): no sequence can end on "
                                "it",
                                (int)j->o.eos_token_id[e], (long long)tk_model_vocab_size(j->m));
    }
    j->o.stop_strings = j->nstop ? j->stops : NULL;
    j->o.n_stop = j->nstop;
    j->o.logprobs = j->logprobs;
    j->o.top_logprobs = j->top;
    return GO;
}

/* the prompts as token ids: --prompt through the checkpoint's tokenizer.json, --ids as given */
static int gen_prompts(gen_job *j, tk_cli *cli)
{
    int rc, u;
    for (size_t p = 0; p < j->np; p++) {
        if (!j->is_text[p]) {
            if ((u = parse_id_list(USAGE, "--ids", j->idlists[p], &j->pids[p], &j->plens[p])) != 0)
                return u;
            continue;
        }
        if (!j->tok && (rc = tk_tokenizer_load(&j->tok, j->dir)) != TK_OK)
            return tk_cli_fail(cli, rc, "--prompt needs the checkpoint's tokenizer.json (or use --ids)");
        if ((rc = tk_tokenizer_encode(&j->pids[p], &j->plens[p], j->tok, j->texts[p], strlen(j->texts[p]), 1)) != TK_OK)
            return tk_cli_fail(cli, rc, NULL);
    }
    return GO;
}

/* --quant: weight-only quantisation; the prompt's logits before and after say what it costs. */
static int gen_quantize(gen_job *j, tk_cli *cli)
{
    if (!j->quant || !strcmp(j->quant, "none"))
        return GO;
    int64_t V = tk_model_vocab_size(j->m);
    size_t n = j->plens[0] * (size_t)V;
    float *f = malloc(n * sizeof *f), *g = malloc(n * sizeof *g);
    char *qj = NULL;
    int rc;
    if (!f || !g) {
        free(f);
        free(g);
        return tk_cli_errorf(cli, TK_ERR_NOMEM, TK_EXIT_FAIL, "out of memory for the prompt's logits");
    }
    if ((rc = tk_model_forward(j->m, j->pids[0], &j->plens[0], 1, f, NULL)) != TK_OK ||
        (rc = tk_model_quantize(j->m, j->quant)) != TK_OK ||
        (rc = tk_model_forward(j->m, j->pids[0], &j->plens[0], 1, g, NULL)) != TK_OK ||
        (rc = tk_model_quant_json(&qj, j->m)) != TK_OK) {
        free(f);
        free(g);
        return tk_cli_fail(cli, rc, NULL);
    }
    double worst = 0, range = 0;
    for (size_t i = 0; i < n; i++) {
        worst = fmax(worst, fabs((double)f[i] - g[i]));
        range = fmax(range, fabs((double)f[i]));
    }
    size_t ql = strlen(qj);
    snprintf(j->qinfo, sizeof j->qinfo, "%.*s, \"prompt_logits_max_abs_diff\": %.9g, \"prompt_logits_max_abs\": %.9g}",
             (int)(ql ? ql - 1 : 0), qj, worst, range);
    tk_free(qj);
    free(f);
    free(g);
    return GO;
}

/* run: generate (one prompt streams its text to stdout as it comes, unless --json) */
static int gen_run(gen_job *j, tk_cli *cli, stream_ctx *sc)
{
    int rc;
    sc->stream_text = !cli->json && j->np == 1;
    j->o.stream = on_token;
    j->o.stream_user = sc;
    if ((rc = tk_generate(&j->res, j->m, (const int32_t *const *)j->pids, j->plens, j->np, &j->o)) != TK_OK) {
        if (sc->stream_text)
            fflush(stdout);
        return tk_cli_fail(cli, rc, NULL);
    }
    if ((cli->json || j->stats) && (rc = tk_gen_result_stats_json(&j->sj, j->res)) != TK_OK)
        return tk_cli_fail(cli, rc, NULL);
    if (j->comm && (rc = tk_cli_tp_report(&j->tpr, j->comm, j->m)) != TK_OK)
        return tk_cli_fail(cli, rc, "--tp: gathering the ranks' weight bytes");
    if (j->logprobs && tk_model_tokenizer(&j->ptok, j->m) != TK_OK) /* no tokenizer: ids without text */
        j->ptok = NULL;
    return GO;
}

/* --logprobs: one token's text under the model's tokenizer (special tokens kept, as tk serve-model's
 * logprobs give it), or NULL without a tokenizer; the caller frees it (tk_free). */
static char *piece(const gen_job *j, int32_t id)
{
    char *t = NULL;
    if (!j->ptok || tk_tokenizer_decode(&t, j->ptok, &id, 1, 0) != TK_OK)
        return NULL;
    return t;
}

/* {"id": ID, "text": "...", "logprob": X (null when NaN or inf) -- the caller closes the object */
static void json_token(const gen_job *j, int32_t id, float lp)
{
    char *t = piece(j, id);
    printf("{\"id\": %d, \"text\": ", (int)id);
    if (t)
        tk_cli_json_str(stdout, t);
    else
        printf("null");
    printf(", \"logprob\": ");
    tk_cli_json_num(stdout, lp);
    tk_free(t);
}

/* --logprobs --json: "logprobs": [{"id", "text", "logprob", "top": [{"id", "text", "logprob"}]}] per new
 * token, and "logprob_sum" */
static void gen_json_logprobs(const gen_job *j, size_t p)
{
    size_t n = 0;
    const int32_t *ids = tk_gen_result_ids(j->res, p, &n);
    const float *lp = tk_gen_result_logprobs(j->res, p, &n);
    double sum = 0;
    printf(", \"logprobs\": [");
    for (size_t i = 0; lp && i < n; i++) {
        const int32_t *tid = NULL;
        const float *tlp = NULL;
        size_t k = tk_gen_result_top_logprobs(j->res, p, i, &tid, &tlp);
        printf("%s", i ? ", " : "");
        json_token(j, ids[i], lp[i]);
        printf(", \"top\": [");
        for (size_t q = 0; q < k; q++) {
            printf("%s", q ? ", " : "");
            json_token(j, tid[q], tlp[q]);
            printf("}");
        }
        printf("]}");
        sum += lp[i];
    }
    printf("], \"logprob_sum\": ");
    tk_cli_json_num(stdout, sum);
}

/* v with 6 decimals into buf, a NaN as "nan" (printf may write "-nan") */
static const char *fix6(char *buf, size_t n, double v)
{
    if (v != v)
        snprintf(buf, n, "nan");
    else
        snprintf(buf, n, "%.6f", v);
    return buf;
}

/* one row of the --logprobs table: the step (or #rank of an alternative), id, logprob, quoted text */
static void text_token(const gen_job *j, const char *label, int32_t id, float lp)
{
    char *t = piece(j, id), num[64];
    printf("%6s %7d %12s  ", label, (int)id, fix6(num, sizeof num, lp));
    if (t)
        tk_cli_json_str(stdout, t);
    printf("\n");
    tk_free(t);
}

/* --logprobs: prompt p's table, a row a new token (its top alternatives below it, #1 the likeliest), and
 * the sum */
static void gen_text_logprobs(const gen_job *j, size_t p)
{
    size_t n = 0;
    const int32_t *ids = tk_gen_result_ids(j->res, p, &n);
    const float *lp = tk_gen_result_logprobs(j->res, p, &n);
    double sum = 0;
    char label[32], a[64], b[64];
    if (j->np > 1)
        printf("\nlogprobs of prompt %zu", p);
    else
        printf("\nlogprobs");
    printf(" (log_softmax of the raw logits, before penalties and temperature):\n");
    printf("%6s %7s %12s  %s\n", "step", "id", "logprob", "text");
    for (size_t i = 0; lp && i < n; i++) {
        const int32_t *tid = NULL;
        const float *tlp = NULL;
        size_t k = tk_gen_result_top_logprobs(j->res, p, i, &tid, &tlp);
        snprintf(label, sizeof label, "%zu", i);
        text_token(j, label, ids[i], lp[i]);
        for (size_t q = 0; q < k; q++) {
            snprintf(label, sizeof label, "#%zu", q + 1);
            text_token(j, label, tid[q], tlp[q]);
        }
        sum += lp[i];
    }
    double mean = n ? sum / (double)n : 0.0, ppl = exp(-mean);
    printf("sum %s over %zu tokens (mean %s, perplexity %.6g)\n", fix6(a, sizeof a, sum), n, fix6(b, sizeof b, mean),
           ppl != ppl ? NAN : ppl);
}

/* report, --json: one object per prompt (an array of them for several) */
static void gen_report_json(const gen_job *j)
{
    if (j->np > 1)
        printf("[");
    for (size_t p = 0; p < j->np; p++) {
        size_t n = 0;
        const int32_t *ids = tk_gen_result_ids(j->res, p, &n);
        printf("%s{\"ids\": [", p ? ", " : "");
        for (size_t i = 0; i < n; i++)
            printf("%s%d", i ? ", " : "", (int)ids[i]);
        printf("], \"text\": ");
        const char *t = tk_gen_result_text(j->res, p);
        if (t)
            tk_cli_json_str(stdout, t);
        else
            printf("null");
        printf(", \"end\": \"%s\"", tk_gen_result_end(j->res, p));
        if (j->logprobs)
            gen_json_logprobs(j, p);
        printf(", \"stats\": %s", j->sj);
        if (j->qinfo[0])
            printf(", \"quant\": %s", j->qinfo);
        if (j->tpr) {
            char *t = json_dumps(j->tpr, JSON_COMPACT);
            printf(", \"tensor_parallel\": %s", t ? t : "null");
            free(t);
        }
        printf("}");
    }
    printf(j->np > 1 ? "]\n" : "\n");
}

/* report: JSON, the end of the streamed line, or each prompt's text (its ids without a tokenizer);
 * --stats to stderr */
static void gen_report(const gen_job *j, const tk_cli *cli)
{
    if (cli->json) {
        gen_report_json(j);
    } else if (j->np == 1 && tk_gen_result_text(j->res, 0)) {
        printf("\n"); /* the text streamed */
        if (j->logprobs)
            gen_text_logprobs(j, 0);
    } else {
        for (size_t p = 0; p < j->np; p++) {
            const char *t = tk_gen_result_text(j->res, p);
            if (t) {
                printf("%s%s\n", p ? "\n" : "", t);
            } else {
                size_t n = 0;
                const int32_t *ids = tk_gen_result_ids(j->res, p, &n);
                for (size_t i = 0; i < n; i++)
                    printf("%s%d", i ? "," : "", (int)ids[i]);
                printf("\n");
            }
            if (j->logprobs)
                gen_text_logprobs(j, p);
        }
    }
    if (j->stats && j->comm && tk_comm_rank(j->comm) != 0) /* --tp: rank 0 alone reports */
        return;
    if (j->stats)
        fprintf(stderr, "%s\n", j->sj);
    if (j->stats && j->qinfo[0])
        fprintf(stderr, "%s\n", j->qinfo);
    if (j->stats)
        tk_cli_tp_print((tk_cli *)cli, j->tpr);
}

/* Masked diffusion (cmd_generate_diffusion.c), asked for or the checkpoint's own, unless --logprobs asks
 * for what it cannot give (tk serve-model refuses logprobs for it too). */
static int diffusion(tk_cli *cli, int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--logprobs") || !strcmp(argv[i], "--top-logprobs"))
            return tk_cli_usage(USAGE,
                                "%s: masked diffusion has no per-token log-probabilities: its tokens are "
                                "unmasked in parallel, not sampled one after another",
                                argv[i]);
    return tk_cmd_generate_diffusion(cli, argc, argv);
}

int tk_cmd_generate(tk_cli *cli, int argc, char **argv)
{
    gen_job *j = calloc(1, sizeof *j);
    stream_ctx sc = {0};
    int ec;
    if (!j)
        return tk_cli_errorf(cli, TK_ERR_NOMEM, TK_EXIT_FAIL, "out of memory");
    for (int i = 1; i < argc; i++)
        if (tk_cli_diffusion_flag(argv[i])) {
            free(j);
            return diffusion(cli, argc, argv);
        }
    if ((ec = gen_parse(j, cli, argc, argv)) == GO && (ec = gen_model_opts(j)) == GO && (ec = gen_load(j, cli)) == GO &&
        (ec = gen_prompts(j, cli)) == GO && (ec = gen_quantize(j, cli)) == GO && (ec = gen_run(j, cli, &sc)) == GO) {
        gen_report(j, cli);
        ec = TK_EXIT_OK;
    }
    if (ec == DIFFUSION)
        ec = GO;
    for (size_t p = 0; p < j->np; p++)
        tk_free(j->pids[p]);
    tk_free(j->sj);
    tk_gen_result_free(j->res);
    tk_tokenizer_free(j->tok);
    json_decref(j->tpr);
    /* a rank that fails after the load (the others may wait in a collective): end the whole job */
    if (ec != TK_EXIT_OK && ec != DIFFUSION && j->m && j->comm && tk_comm_size(j->comm) > 1)
        tk_comm_abort(j->comm, ec);
    tk_model_free(j->m);
    tk_comm_free(j->comm);
    free(j);
    return ec == GO ? diffusion(cli, argc, argv) : ec;
}
