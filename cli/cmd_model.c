/*
 * cmd_model.c — tk model info / tk model logits / tk embed: a Hugging Face checkpoint directory on the
 * command line, through tk_model_*. Logits and embeddings print as JSON with every float in full
 * precision (%.9g), so scripts compare them with transformers' own numbers.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cli.h"

static const char *INFO_USAGE = "tk model info DIR [--dtype auto|f32|bf16|f16] [--device cpu|cuda[:N]] [--json]";
static const char *LOGITS_USAGE =
    "tk model logits DIR --ids ID,ID,... [--ids ...] [--dtype f32|bf16|f16] [--device cpu|cuda[:N]] [--threads N] "
    "[--hidden] [--tp N [--tp-plan FILE]] [--json]";
static const char *EMBED_USAGE =
    "tk embed DIR TEXT... [--dtype f32|bf16|f16] [--device cpu|cuda[:N]] [--threads N] [--json]";

/* --device cpu | cuda | cuda:N */
static int parse_device(tk_model_opts *o, const char *s)
{
    int id;
    if (tk_cli_parse_device(s, &id))
        return -1;
    o->device_type = id < 0 ? TK_DEV_CPU : TK_DEV_CUDA;
    o->device_id = id < 0 ? 0 : id;
    return 0;
}

/* f32, bf16, f16 in any spelling tk_dtype_parse takes (float32, bfloat16, fp16, half, ...), or auto */
static int parse_dtype(const char *s)
{
    tk_dtype dt;
    if (!strcmp(s, "auto"))
        return 0;
    if (tk_dtype_parse(&dt, s) != TK_OK)
        return -1;
    return (dt.code == TK_DL_FLOAT && (dt.bits == 32 || dt.bits == 16)) || (dt.code == TK_DL_BFLOAT && dt.bits == 16)
               ? 0
               : -1;
}

/* One --ids list: "1,2,3" (spaces and brackets allowed). */
static int parse_ids(int32_t **v, size_t *n, size_t *cap, const char *arg)
{
    const char *p = arg;
    size_t start = *n;
    while (*p) {
        while (*p == ',' || *p == ' ' || *p == '[' || *p == ']')
            p++;
        if (!*p)
            break;
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < INT32_MIN || x > INT32_MAX || (*end && *end != ',' && *end != ' ' && *end != ']'))
            return -1;
        if (*n == *cap) {
            size_t nc = *cap ? 2 * *cap : 64;
            int32_t *nv = realloc(*v, nc * sizeof **v);
            if (!nv)
                return -1;
            *v = nv;
            *cap = nc;
        }
        (*v)[(*n)++] = (int32_t)x;
        p = end;
    }
    return *n > start ? 0 : -1;
}

static void print_rows(const char *key, const float *x, size_t rows, size_t cols)
{
    printf("\"%s\": [", key);
    for (size_t r = 0; r < rows; r++) {
        printf("%s[", r ? ", " : "");
        for (size_t c = 0; c < cols; c++) {
            printf("%s", c ? ", " : "");
            tk_cli_json_num(stdout, x[r * cols + c]);
        }
        printf("]");
    }
    printf("]");
}

static int load(tk_cli *cli, tk_model **m, const char *dir, const tk_model_opts *o)
{
    tk_ctx *ctx = tk_cli_ctx(cli);
    if (!ctx)
        return TK_EXIT_FAIL;
    int rc = tk_model_load(m, ctx, dir, o);
    return rc == TK_OK ? TK_EXIT_OK : tk_cli_fail(cli, rc, NULL);
}

/* Options shared by the three commands; returns 1 when argv[*i] was one of them, -1 on a bad value. */
static int common_opt(tk_cli *cli, tk_model_opts *o, int argc, char **argv, int *i, const char *usage, int *exit_code)
{
    if (!strcmp(argv[*i], "--threads")) {
        const char *v = *i + 1 < argc ? argv[++*i] : NULL;
        return (*exit_code = tk_cli_parse_threads(cli, usage, v)) ? -1 : 1;
    }
    if (!strcmp(argv[*i], "--dtype") || !strcmp(argv[*i], "--device")) {
        int dev = !strcmp(argv[*i], "--device");
        if (*i + 1 >= argc) {
            *exit_code = tk_cli_usage(usage, "%s needs a value", argv[*i]);
            return -1;
        }
        const char *v = argv[++*i];
        if (dev ? parse_device(o, v) : parse_dtype(v)) {
            *exit_code = tk_cli_usage(usage, "%s '%s': want %s", argv[*i - 1], v,
                                      dev ? "cpu, cuda or cuda:N" : "f32, bf16, f16 or auto");
            return -1;
        }
        if (!dev)
            o->dtype = v;
        return 1;
    }
    return 0;
}

static int cmd_info(tk_cli *cli, int argc, char **argv)
{
    const char *dir = NULL;
    tk_model_opts o = TK_MODEL_OPTS_INIT;
    o.dtype = "auto"; /* what the checkpoint holds, read in place: info of a large model stays cheap */
    o.map_weights = 1;
    for (int i = 1; i < argc; i++) {
        int ec = 0, r = common_opt(cli, &o, argc, argv, &i, INFO_USAGE, &ec);
        if (r < 0)
            return ec;
        if (r)
            continue;
        if (tk_cli_is_help(argv[i])) {
            printf("usage: %s\n"
                   "\n"
                   "Loads a Hugging Face checkpoint directory (config.json, model.safetensors or a sharded\n"
                   "model.safetensors.index.json) and prints what tk made of it: architecture and family,\n"
                   "sizes (vocabulary, hidden, layers, heads, kv heads, head size), parameters, the\n"
                   "checkpoint's dtypes, the compute dtype and device, the memory the weights take and how\n"
                   "much of it is read in place from the mapped files, rope scaling and sliding window.\n"
                   "Every safetensors header is validated and every weight looked up, so a damaged or\n"
                   "mismatched checkpoint fails here with the tensor named.\n"
                   "\n"
                   "options:\n"
                   "  --dtype T     compute dtype the weights are converted to: f32, bf16, f16, or auto\n"
                   "                (the default here: the checkpoint's own dtype, nothing converted)\n"
                   "  --device D    cpu (default) or cuda[:N]\n"
                   "  --json        the same as one JSON object\n"
                   "\n"
                   "supported architectures: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,\n"
                   "Qwen3ForCausalLM, Olmo2ForCausalLM, GraniteForCausalLM, SmolLM3ForCausalLM,\n"
                   "GemmaForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, Phi3ForCausalLM,\n"
                   "MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM,\n"
                   "GPT2LMHeadModel, BertModel, BertForMaskedLM.\n"
                   "\n"
                   "exit status: 0 ok, 2 usage or invalid input (a malformed or mismatched checkpoint:\n"
                   "the tensor is named), 3 no config.json or no weights, 5 a damaged safetensors file\n"
                   "or index, 7 no GPU, 8 an unsupported architecture or config value.\n",
                   INFO_USAGE);
            return TK_EXIT_OK;
        } else if (argv[i][0] == '-') {
            return tk_cli_usage(INFO_USAGE, "unknown option '%s'", argv[i]);
        } else if (!dir) {
            dir = argv[i];
        } else {
            return tk_cli_usage(INFO_USAGE, "one model directory");
        }
    }
    if (!dir)
        return tk_cli_usage(INFO_USAGE, "a model directory, e.g. tk model info ./TinyLlama-1.1B");
    tk_model *m = NULL;
    int ec = load(cli, &m, dir, &o);
    if (ec != TK_EXIT_OK)
        return ec;
    char *js = NULL;
    int rc = tk_model_info_json(&js, m);
    if (rc != TK_OK) {
        tk_model_free(m);
        return tk_cli_fail(cli, rc, NULL);
    }
    if (cli->json) {
        printf("%s\n", js);
    } else {
        /* The JSON's lines ("  \"key\": value,") as "key: value", nested objects indented. */
        const char *p = js;
        while (*p) {
            const char *e = strchr(p, '\n');
            size_t len = e ? (size_t)(e - p) : strlen(p);
            size_t ind = 0;
            while (ind < len && p[ind] == ' ')
                ind++;
            if (len > ind && p[len - 1] == ',')
                len--;
            if (len > ind && !(len - ind == 1 && (p[ind] == '{' || p[ind] == '}'))) {
                printf("%*s", (int)(ind > 2 ? ind - 2 : 0), "");
                for (size_t k = ind; k < len; k++)
                    if (p[k] != '"' && !(p[k] == '{' && k + 1 == len))
                        putchar(p[k]);
                putchar('\n');
            }
            p += e ? (size_t)(e - p) + 1 : len;
            if (!e)
                break;
        }
    }
    tk_free(js);
    tk_model_free(m);
    return TK_EXIT_OK;
}

static void logits_help(void)
{
    printf("usage: %s\n"
           "\n"
           "Runs a Hugging Face checkpoint directory on token ids and prints the logits: one row\n"
           "of vocabulary logits per input position, computed by tk's pipeline (every layer a\n"
           "tk_op_run: the CPU references, or the installed GPU kernels with --device cuda).\n"
           "Without --json it prints the five most likely next tokens after the last position\n"
           "(with their text when the directory has a tokenizer.json).\n"
           "\n"
           "options:\n"
           "  --ids LIST    comma-separated token ids of one sequence (see 'tk tokenize'); give\n"
           "                --ids again for a batch: sequences run together but independently,\n"
           "                and the rows follow one another in order\n"
           "  --dtype T     compute dtype: f32, bf16, f16, auto (the checkpoint's); default: f32\n"
           "                on the CPU, bf16 on a GPU; the output is f32 either way\n"
           "  --device D    cpu (default) or cuda[:N]\n"
           "  --threads N   CPU threads for the ops (default: every CPU; docs/cpu.md)\n"
           "  --hidden      also the last hidden states (after the final norm; BERT: the encoder\n"
           "                output and the pooler output); the only output for BertModel\n"
           "  --tp N        tensor parallelism over N ranks: start N processes with mpirun -np N\n"
           "                (the world size must be N); each rank loads only its slices of the\n"
           "                weights (its heads, MLP features and vocabulary rows, from the\n"
           "                checkpoint's tensor-parallel plan) and rank 0 alone prints the logits,\n"
           "                the same as one process's; stderr (or \"tensor_parallel\" in --json)\n"
           "                gets every rank's weight bytes. Llama, Mistral, Qwen2, Qwen3, OLMo2,\n"
           "                Gemma 1-3, Granite, SmolLM3, Phi-3, Mixtral, Qwen2/3-MoE, and\n"
           "                GPT-2 with --tp-plan, on the CPU or with --device cuda on GPUs (NCCL\n"
           "                when every rank has a GPU of its own, else MPI staging through host\n"
           "                memory; TK_COMM_BACKEND=nccl|mpi forces one; docs/parallel.md)\n"
           "  --tp-plan FILE  the plan (transformers' tp_plan JSON) instead of config.json's\n"
           "                base_model_tp_plan or transformers' default for the model type\n"
           "  --json        {\"logits\": [[...], ...]} (and \"hidden\", \"pooled\") on stdout; a NaN or\n"
           "                +-inf value is written as null (JSON has no number for them)\n"
           "\n"
           "examples:\n"
           "  tk model logits ./gpt2 --ids $(tk tokenize ./gpt2 'Hello, my dog' --no-special)\n"
           "  tk model logits ./tiny-llama --ids 1,15043,3186 --dtype bf16 --json\n"
           "  mpirun -np 2 tk model logits ./tiny-llama --ids 1,15043,3186 --tp 2 --json\n"
           "\n"
           "exit status: 0 ok, 1 no LM head (without --hidden), 2 usage or invalid input (a\n"
           "malformed checkpoint, an id outside the vocabulary), 3 no config.json or no weights,\n"
           "5 a damaged safetensors file or index, 7 no GPU, 8 an unsupported architecture or\n"
           "config value.\n",
           LOGITS_USAGE);
}

/* What tk model logits works on: the command line, then the model and its outputs. */
typedef struct {
    const char *dir;
    tk_model_opts o;
    int32_t *ids;
    size_t nids, capids, *lens, nseq;
    int want_hidden, lm;
    tk_model *m;
    size_t V, H;
    float *logits, *hidden, *pooled;
    int tp;              /* --tp N, 0 without */
    const char *tp_plan; /* --tp-plan FILE */
    const char *device;  /* --device as given (cuda or cuda:N: tk_cli_tp_join picks each rank's GPU) */
    tk_comm *comm;
    json_t *tpr;         /* --tp: every rank's weight bytes (tk_cli_tp_report) */
} logits_job;

#define GO (-1) /* a step's "go on": anything else is the command's exit code */

/* parse options: the directory, --ids lists (one sequence each), --hidden and the shared options. */
static int logits_parse(logits_job *j, tk_cli *cli, int argc, char **argv)
{
    int ec = TK_EXIT_OK;
    if (!(j->lens = calloc((size_t)argc + 1, sizeof *j->lens)))
        return tk_cli_errorf(NULL, TK_ERR_NOMEM, 0, "out of memory");
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc)
            j->device = argv[i + 1];
        int r = common_opt(cli, &j->o, argc, argv, &i, LOGITS_USAGE, &ec);
        if (r < 0)
            return ec;
        if (r)
            continue;
        if (tk_cli_is_help(argv[i])) {
            logits_help();
            return TK_EXIT_OK;
        } else if (!strcmp(argv[i], "--ids")) {
            if (i + 1 >= argc)
                return tk_cli_usage(LOGITS_USAGE, "--ids needs a list of token ids");
            size_t before = j->nids;
            if (parse_ids(&j->ids, &j->nids, &j->capids, argv[++i]))
                return tk_cli_usage(LOGITS_USAGE, "--ids '%s' is not a comma-separated list of token ids", argv[i]);
            j->lens[j->nseq++] = j->nids - before;
        } else if (!strcmp(argv[i], "--hidden")) {
            j->want_hidden = 1;
        } else if (!strcmp(argv[i], "--tp")) {
            if ((ec = tk_cli_tp_parse(LOGITS_USAGE, i + 1 < argc ? argv[++i] : NULL, &j->tp)) != 0)
                return ec;
        } else if (!strcmp(argv[i], "--tp-plan")) {
            if (i + 1 >= argc)
                return tk_cli_usage(LOGITS_USAGE, "--tp-plan needs a plan file");
            j->tp_plan = argv[++i];
        } else if (argv[i][0] == '-') {
            return tk_cli_usage(LOGITS_USAGE, "unknown option '%s'", argv[i]);
        } else if (!j->dir) {
            j->dir = argv[i];
        } else {
            return tk_cli_usage(LOGITS_USAGE, "one model directory (token ids go after --ids)");
        }
    }
    if (!j->dir || !j->nseq)
        return tk_cli_usage(LOGITS_USAGE, "a model directory and --ids, e.g. tk model logits ./gpt2 --ids 15496,11");
    if (j->tp_plan && !j->tp)
        return tk_cli_usage(LOGITS_USAGE, "--tp-plan goes with --tp N");
    return GO;
}

/* resolve and validate: the model, which must have an LM head unless only hidden states are wanted. */
static int logits_load(logits_job *j, tk_cli *cli)
{
    int ec;
    if (j->tp && (ec = tk_cli_tp_join(cli, &j->comm, j->tp, j->device, &j->o.device_id)) != 0)
        return ec;
    j->o.comm = j->comm;
    j->o.tp_plan = j->tp_plan;
    ec = load(cli, &j->m, j->dir, &j->o);
    if (ec != TK_EXIT_OK)
        return ec;
    j->lm = tk_model_has_lm_head(j->m);
    if (!j->lm && !j->want_hidden)
        return tk_cli_errorf(cli, TK_ERR_UNSUPPORTED, TK_EXIT_FAIL,
                             "%s has no LM head, so no logits\nHINT: add --hidden for its hidden states, or use "
                             "'tk embed' for sentence embeddings",
                             tk_model_arch(j->m));
    j->V = (size_t)tk_model_vocab_size(j->m);
    j->H = (size_t)tk_model_hidden_size(j->m);
    return GO;
}

/* run: the forward pass over every sequence (and BERT's pooler output with --hidden). */
static int logits_run(logits_job *j, tk_cli *cli)
{
    j->logits = j->lm ? malloc(j->nids * j->V * sizeof *j->logits) : NULL;
    j->hidden = j->want_hidden ? malloc(j->nids * j->H * sizeof *j->hidden) : NULL;
    if ((j->lm && !j->logits) || (j->want_hidden && !j->hidden))
        return tk_cli_errorf(cli, TK_ERR_NOMEM, TK_EXIT_FAIL, "out of memory");
    int rc = tk_model_forward(j->m, j->ids, j->lens, j->nseq, j->logits, j->hidden);
    if (rc != TK_OK)
        return tk_cli_fail(cli, rc, NULL);
    if (j->comm && (rc = tk_cli_tp_report(&j->tpr, j->comm, j->m)) != TK_OK)
        return tk_cli_fail(cli, rc, "--tp: gathering the ranks' weight bytes");
    if (j->want_hidden && !j->lm) {
        j->pooled = malloc(j->nseq * j->H * sizeof *j->pooled);
        if (j->pooled && tk_model_pooler_output(j->pooled, j->m) != TK_OK) {
            free(j->pooled);
            j->pooled = NULL;
        }
    }
    return GO;
}

/* report, without --json: the five most likely tokens after the last position, each with its text as
 * decode([id]) gives it (quoted, escaped as JSON: a leading space or a newline shows) and its token. */
static void logits_print_top(const logits_job *j)
{
    const tk_tokenizer *tok = NULL;
    if (tk_model_tokenizer(&tok, j->m) != TK_OK)
        tok = NULL;
    const float *last = j->logits + (j->nids - 1) * j->V;
    int top[5];
    int k = 0;
    for (; k < 5 && (size_t)k < j->V; k++) {
        int best = -1;
        for (size_t v = 0; v < j->V; v++) {
            int taken = 0;
            for (int t = 0; t < k; t++)
                taken |= top[t] == (int)v;
            if (!taken && (best < 0 || last[v] > last[best]))
                best = (int)v;
        }
        top[k] = best;
    }
    printf("top %d next tokens after position %zu:\n", k, j->lens[j->nseq - 1] - 1);
    printf("  %8s  %12s  %s\n", "id", "logit", tok ? "text (token)" : "");
    for (int t = 0; t < k; t++) {
        const char *s = tok ? tk_tokenizer_token(tok, top[t]) : NULL;
        char *text = NULL;
        int32_t id = top[t];
        printf("  %8d  %12.6f  ", top[t], last[top[t]]);
        if (tok && tk_tokenizer_decode(&text, tok, &id, 1, 0) == TK_OK) {
            tk_cli_json_str(stdout, text);
            printf("%s%s%s", s ? " (" : "", s ? s : "", s ? ")" : "");
        }
        printf("\n");
        tk_free(text);
    }
}

/* report: {"logits", "hidden", "pooled"} with --json, else the top tokens or a line about the states. */
static void logits_report(const logits_job *j, const tk_cli *cli)
{
    if (cli->json) {
        const char *sep = "";
        printf("{");
        if (j->lm) {
            print_rows("logits", j->logits, j->nids, j->V);
            sep = ", ";
        }
        if (j->want_hidden) {
            printf("%s", sep);
            print_rows("hidden", j->hidden, j->nids, j->H);
        }
        if (j->pooled) {
            printf(", ");
            print_rows("pooled", j->pooled, j->nseq, j->H);
        }
        if (j->tpr) {
            char *t = json_dumps(j->tpr, JSON_COMPACT);
            printf(", \"tensor_parallel\": %s", t ? t : "null");
            free(t);
        }
        printf("}\n");
    } else if (j->lm) {
        tk_cli_tp_print((tk_cli *)cli, j->tpr);
        logits_print_top(j);
    } else {
        printf("hidden states: %zu rows of %zu (use --json to print them)\n", j->nids, j->H);
    }
}

static int cmd_logits(tk_cli *cli, int argc, char **argv)
{
    logits_job j;
    int ec;
    memset(&j, 0, sizeof j);
    j.o = (tk_model_opts)TK_MODEL_OPTS_INIT;
    if ((ec = logits_parse(&j, cli, argc, argv)) == GO && (ec = logits_load(&j, cli)) == GO &&
        (ec = logits_run(&j, cli)) == GO) {
        logits_report(&j, cli);
        ec = TK_EXIT_OK;
    }
    free(j.ids);
    free(j.lens);
    free(j.logits);
    free(j.hidden);
    free(j.pooled);
    json_decref(j.tpr);
    /* a rank that fails after the load (the others may wait in a collective): end the whole job */
    if (ec != TK_EXIT_OK && j.m && j.comm && tk_comm_size(j.comm) > 1)
        tk_comm_abort(j.comm, ec);
    tk_model_free(j.m);
    tk_comm_free(j.comm);
    return ec;
}

int tk_cmd_model(tk_cli *cli, int argc, char **argv)
{
    if (argc < 2 && cli->json)
        return tk_cli_usage("tk model <info|logits> DIR [options]", "which model command? info or logits");
    if (argc < 2 || tk_cli_is_help(argv[1])) {
        printf("usage: tk model <info|logits> DIR [options]\n"
               "\n"
               "Hugging Face checkpoint directories, loaded as they are (config.json, *.safetensors,\n"
               "tokenizer.json): LlamaForCausalLM (and Mistral, Qwen2, Qwen3, OLMo2, Granite, SmolLM3,\n"
               "Gemma 1-3, Phi-3), GPT2LMHeadModel, BertModel.\n"
               "\n"
               "  %s\n"
               "  %s\n"
               "\n"
               "'tk model <command> --help' for details; 'tk embed' for sentence embeddings.\n",
               INFO_USAGE, LOGITS_USAGE);
        return argc < 2 ? TK_EXIT_USAGE : TK_EXIT_OK;
    }
    if (!strcmp(argv[1], "info"))
        return cmd_info(cli, argc - 1, argv + 1);
    if (!strcmp(argv[1], "logits"))
        return cmd_logits(cli, argc - 1, argv + 1);
    return tk_cli_usage("tk model <info|logits> DIR [options]", "unknown model command '%s'", argv[1]);
}

int tk_cmd_embed(tk_cli *cli, int argc, char **argv)
{
    const char *dir = NULL;
    tk_model_opts o = TK_MODEL_OPTS_INIT;
    const char **texts = calloc((size_t)argc + 1, sizeof *texts);
    size_t n = 0;
    int ec = TK_EXIT_OK;
    float *emb = NULL;
    tk_model *m = NULL;
    if (!texts)
        return tk_cli_errorf(cli, TK_ERR_NOMEM, TK_EXIT_FAIL, "out of memory");
    for (int i = 1; i < argc; i++) {
        int r = common_opt(cli, &o, argc, argv, &i, EMBED_USAGE, &ec);
        if (r < 0)
            goto done;
        if (r)
            continue;
        if (tk_cli_is_help(argv[i])) {
            printf("usage: %s\n"
                   "\n"
                   "Sentence embeddings of each TEXT with an encoder checkpoint directory, as\n"
                   "sentence-transformers computes them: the text is tokenized with the directory's\n"
                   "tokenizer.json ([CLS] ... [SEP]), truncated to sentence_bert_config.json's\n"
                   "max_seq_length, run through the model (all texts in one batch, each attending only\n"
                   "to itself), pooled as 1_Pooling/config.json says (mean by default, cls, max) and\n"
                   "L2-normalised when modules.json lists a Normalize module (all-MiniLM-L6-v2 does).\n"
                   "\n"
                   "options:\n"
                   "  --dtype T     compute dtype: f32, bf16, f16, auto (the checkpoint's); default: f32\n"
                   "                on the CPU, bf16 on a GPU\n"
                   "  --device D    cpu (default) or cuda[:N]\n"
                   "  --threads N   CPU threads for the ops (default: every CPU; docs/cpu.md)\n"
                   "  --json        {\"embeddings\": [[...], ...]} on stdout, one row per TEXT\n"
                   "\n"
                   "example:\n"
                   "  tk embed ./all-MiniLM-L6-v2 'A man is eating food.' 'A man is riding a horse.' --json\n"
                   "\n"
                   "exit status: 0 ok, 2 usage or invalid input (a malformed checkpoint or\n"
                   "tokenizer.json), 3 no config.json, weights or tokenizer.json, 5 a damaged safetensors\n"
                   "file, 7 no GPU, 8 an unsupported model (a causal LM), tokenizer or pooling.\n",
                   EMBED_USAGE);
            goto done;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            ec = tk_cli_usage(EMBED_USAGE, "unknown option '%s'", argv[i]);
            goto done;
        } else if (!dir) {
            dir = argv[i];
        } else {
            texts[n++] = argv[i];
        }
    }
    if (!dir || !n) {
        ec = tk_cli_usage(EMBED_USAGE, "a model directory and at least one text");
        goto done;
    }
    if ((ec = load(cli, &m, dir, &o)) != TK_EXIT_OK)
        goto done;
    size_t H = (size_t)tk_model_hidden_size(m);
    if (!(emb = malloc(n * H * sizeof *emb))) {
        ec = tk_cli_errorf(cli, TK_ERR_NOMEM, TK_EXIT_FAIL, "out of memory");
        goto done;
    }
    int rc = tk_model_embed(emb, m, texts, n);
    if (rc != TK_OK) {
        ec = tk_cli_fail(cli, rc, NULL);
        goto done;
    }
    if (cli->json) {
        printf("{");
        print_rows("embeddings", emb, n, H);
        printf("}\n");
    } else {
        for (size_t i = 0; i < n; i++) {
            printf("%zu: [", i);
            for (size_t d = 0; d < H && d < 6; d++)
                printf("%s%.6f", d ? ", " : "", emb[i * H + d]);
            printf("%s] (%zu dims)\n", H > 6 ? ", ..." : "", H);
        }
    }
done:
    free(texts);
    free(emb);
    tk_model_free(m);
    return ec;
}
