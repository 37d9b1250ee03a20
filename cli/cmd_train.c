/*
 * cmd_train.c — tk train: fine-tunes a Hugging Face checkpoint (Llama family, GPT-2, BertForMaskedLM)
 * on text files through the public training API (tk_train_*), and writes Hugging Face checkpoints
 * with a resumable training state.
 *
 * Data: each file is read whole (UTF-8 text, checked), encoded with the checkpoint's tokenizer.json
 * (special tokens added, an eos between documents of a causal LM), the token streams concatenated and
 * cut into blocks of --seq-len (the remainder dropped, as transformers' run_clm group_texts). A seeded
 * shuffle of the blocks puts --eval-fraction of them aside for the eval loss; the rest are visited in
 * a seeded order per epoch. Causal LMs predict each next token within a block; BERT its masked tokens
 * (--mlm-probability, 80% [MASK], 10% random, 10% kept, drawn from the seed, the step and the row).
 * Everything random is a function of (seed, position), so --resume continues bit for bit on the CPU.
 *
 * Output: OUT/checkpoint-STEP/ (tk_train_save: written whole, then renamed), OUT/latest naming the
 * newest (replaced atomically after it is in place), the oldest beyond --save-total-limit removed.
 * Ctrl-C (SIGINT) or SIGTERM finishes the step, saves, and exits 130; kill -9 loses the steps since the
 * last checkpoint and never the checkpoint.
 */
#define _GNU_SOURCE /* nftw */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"

static const char *USAGE = "tk train [options] DIR --data FILE... --out DIR";

static void help(void)
{
    printf("usage: %s\n"
           "\n"
           "Fine-tunes the Hugging Face checkpoint in DIR (LlamaForCausalLM, MistralForCausalLM,\n"
           "Qwen2ForCausalLM, GPT2LMHeadModel, BertForMaskedLM) on text files with AdamW, exactly as\n"
           "torch.optim.AdamW with clip_grad_norm_ and transformers' warmup + cosine schedule, and writes\n"
           "checkpoints that transformers' from_pretrained loads. Every layer's forward and backward runs\n"
           "through the op registry (CPU references, or GPU kernels with --device cuda). The files are\n"
           "tokenized with DIR/tokenizer.json and packed into sequences of --seq-len tokens; causal LMs\n"
           "learn the next token, BERT its masked tokens. See docs/training.md.\n"
           "\n"
           "data:\n"
           "  --data FILE...             UTF-8 text files (several after one --data, or --data again)\n"
           "  --seq-len N                tokens per sequence (default 128, at most the model's positions)\n"
           "  --eval-fraction F          share of the sequences held out for the eval loss (default 0.05;\n"
           "                             0: none)\n"
           "  --mlm-probability P        BERT: share of tokens masked (default 0.15)\n"
           "  --seed N                   data order, the held-out split and BERT's masks (default 0)\n"
           "\n"
           "optimisation:\n"
           "  --batch-size N             sequences per micro-batch (default 8)\n"
           "  --grad-accum N             micro-batches per optimiser step (default 1); the loss is the mean\n"
           "                             over every target of the step's micro-batches\n"
           "  --steps N                  optimiser steps (default: --epochs over the training sequences)\n"
           "  --epochs N                 passes over the training sequences when --steps is not given\n"
           "                             (default 1)\n"
           "  --lr X                     peak learning rate (default 1e-4)\n"
           "  --warmup N                 linear warmup steps from 0 (default 0)\n"
           "  --schedule cosine|constant after warmup: cosine decay to --min-lr-ratio at the last step\n"
           "                             (default), or constant\n"
           "  --min-lr-ratio R           the cosine's floor as a fraction of --lr (default 0)\n"
           "  --weight-decay X           decoupled weight decay (default 0.01); norms, biases and\n"
           "                             embeddings get none unless --decay-all\n"
           "  --decay-all                weight decay on every parameter\n"
           "  --beta1 B, --beta2 B       AdamW's betas (default 0.9, 0.999)\n"
           "  --eps E                    AdamW's eps (default 1e-8)\n"
           "  --max-grad-norm X          clip the global gradient norm to X (default 1.0; 0: off)\n"
           "  --label-smoothing E        as F.cross_entropy's (default 0)\n"
           "  --checkpointing            activation checkpointing: keep each layer's input only and\n"
           "                             recompute the layer in backward (less memory, more time)\n"
           "  --fused-loss               fuse the LM head and the loss (fused_linear_cross_entropy: never\n"
           "                             holds the [tokens, vocab] logits); the default on a GPU\n"
           "  --no-fused-loss            the logits, then cross_entropy; the default on the CPU, where\n"
           "                             OpenBLAS makes it faster (tokens x vocab x 8 bytes more memory)\n"
           "\n"
           "checkpoints:\n"
           "  --out DIR                  where checkpoint-STEP/ directories and `latest` go\n"
           "  --save-every N             save every N steps (default 0: at the end only; Ctrl-C saves too)\n"
           "  --save-total-limit N       keep the newest N checkpoints (default 2; 0: all)\n"
           "  --eval-every N             eval loss every N steps (default: at each save)\n"
           "  --resume                   continue the run in --out from its latest checkpoint (the saved\n"
           "                             options and data order; --steps may extend it)\n"
           "\n"
           "runtime:\n"
           "  --device cpu|cuda[:N]      where training runs (default cpu)\n"
           "  --dp N                     data parallel over the N ranks that `mpirun -np N` started: every\n"
           "                             step takes N x --batch-size sequences, each rank its --batch-size\n"
           "                             of them; the gradients are summed over the ranks before clipping\n"
           "                             and AdamW, so the run is one process's with --batch-size N x B;\n"
           "                             rank 0 alone prints and saves (docs/parallel.md)\n"
           "  --json                     one JSON record per line on stdout: each step, eval and save, then\n"
           "                             a summary (docs/json.md)\n"
           "  --quiet                    no progress bar\n"
           "\n"
           "examples:\n"
           "  tk train ./gpt2 --data book.txt --out run1 --seq-len 256 --batch-size 4 --steps 500\n"
           "  tk train ./TinyLlama --data a.txt b.txt --out run2 --lr 2e-5 --warmup 50 --checkpointing\n"
           "  tk train ./gpt2 --data book.txt --out run1 --resume --steps 1000\n"
           "  mpirun -np 4 tk train ./gpt2 --data book.txt --out run3 --batch-size 2 --dp 4\n"
           "\n"
           "exit status: 0 ok, 1 a training failure (a NaN loss: the message names the tensor; out of\n"
           "memory), 2 usage or bad data (an empty, binary or too short file), 3 no checkpoint or\n"
           "tokenizer, 6 the output cannot be written (read-only, disk full: the last checkpoint stays\n"
           "whole), 7 no GPU for --device cuda, 130 interrupted (after saving).\n",
           USAGE);
}

#define GO (-1) /* a stage's "carry on" */
#define MAX_FILES 256

typedef struct {
    /* the command line */
    const char *dir, *out, *files[MAX_FILES];
    size_t nfiles;
    long long seq_len, batch, accum, steps, epochs, warmup, seed, save_every, save_limit, eval_every;
    double lr, min_lr_ratio, wd, beta1, beta2, eps, clip, smoothing, eval_frac, mlm_p;
    int cosine, decay_all, ckpt, fused, resume, steps_given;
    int files_owned; /* files[] were read from the saved state (strdup'd) */
    const char *device;
    int dp; /* --dp N: data parallel over N ranks (0: not given) */
    /* the run */
    tk_comm *comm; /* --dp: the ranks */
    int rank, world;
    int stop;      /* --dp: the ranks agreed to stop after this step */
    tk_model *m;
    tk_trainer *t;
    int mlm;
    int32_t mask_id, cls_id, sep_id, pad_id;
    int64_t vocab;
    int32_t *tokens; /* every block, seq_len each */
    size_t nblocks, ntrain, neval, ntok;
    size_t *order;   /* block indices: [0, neval) eval, then the training blocks */
    size_t *perm;    /* this epoch's order of the training blocks */
    long long perm_epoch;
    uint64_t data_hash;
    char *resume_from;
    int32_t *ids;
    int64_t *targets;
    size_t *lens, *blocks;
    double t0;
    long long start_step;
} train_job;

static volatile sig_atomic_t stop_signal;
static void on_signal(int sig) { stop_signal = sig; }

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- parsing ---------------------------------------------------------------------------------- */

static int num(const char *flag, const char *v, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double d = v ? strtod(v, &end) : NAN;
    if (!v || errno || end == v || *end || !(d >= lo && d <= hi))
        return tk_cli_usage(USAGE, "%s wants a number in [%g, %g], got '%s'", flag, lo, hi, v ? v : "");
    *out = d;
    return GO;
}

static int integer(const char *flag, const char *v, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long x = v ? strtoll(v, &end, 10) : 0;
    if (!v || errno || end == v || *end || x < lo || x > hi)
        return tk_cli_usage(USAGE, "%s wants an integer in [%lld, %lld], got '%s'", flag, lo, hi, v ? v : "");
    *out = x;
    return GO;
}

/* The numeric options: name, bounds, and where the value goes. */
typedef struct {
    const char *flag;
    int is_int;
    long long ilo, ihi; /* is_int */
    double lo, hi;      /* else */
    size_t off;
} num_opt;

static const num_opt NUM_OPTS[] = {
    {"--seq-len", 1, 2, 1 << 20, 0, 0, offsetof(train_job, seq_len)},
    {"--batch-size", 1, 1, 1 << 20, 0, 0, offsetof(train_job, batch)},
    {"--grad-accum", 1, 1, 1 << 20, 0, 0, offsetof(train_job, accum)},
    {"--steps", 1, 1, (long long)1 << 40, 0, 0, offsetof(train_job, steps)},
    {"--epochs", 1, 1, 1 << 20, 0, 0, offsetof(train_job, epochs)},
    {"--warmup", 1, 0, (long long)1 << 40, 0, 0, offsetof(train_job, warmup)},
    {"--seed", 1, 0, INT64_MAX, 0, 0, offsetof(train_job, seed)},
    {"--save-every", 1, 0, (long long)1 << 40, 0, 0, offsetof(train_job, save_every)},
    {"--save-total-limit", 1, 0, 1 << 20, 0, 0, offsetof(train_job, save_limit)},
    {"--eval-every", 1, 0, (long long)1 << 40, 0, 0, offsetof(train_job, eval_every)},
    {"--lr", 0, 0, 0, 0, 10, offsetof(train_job, lr)},
    {"--min-lr-ratio", 0, 0, 0, 0, 1, offsetof(train_job, min_lr_ratio)},
    {"--weight-decay", 0, 0, 0, 0, 100, offsetof(train_job, wd)},
    {"--beta1", 0, 0, 0, 0, 0.999999, offsetof(train_job, beta1)},
    {"--beta2", 0, 0, 0, 0, 0.999999999, offsetof(train_job, beta2)},
    {"--eps", 0, 0, 0, 0, 1, offsetof(train_job, eps)},
    {"--max-grad-norm", 0, 0, 0, 0, 1e30, offsetof(train_job, clip)},
    {"--label-smoothing", 0, 0, 0, 0, 0.999, offsetof(train_job, smoothing)},
    {"--eval-fraction", 0, 0, 0, 0, 0.5, offsetof(train_job, eval_frac)},
    {"--mlm-probability", 0, 0, 0, 0.001, 1, offsetof(train_job, mlm_p)},
};

/* The numeric option named flag, or NULL. */
static const num_opt *num_opt_find(const char *flag)
{
    for (size_t i = 0; i < sizeof NUM_OPTS / sizeof NUM_OPTS[0]; i++)
        if (!strcmp(flag, NUM_OPTS[i].flag))
            return &NUM_OPTS[i];
    return NULL;
}

/* Parses a numeric option's value v into j: GO, or the usage exit naming the option and its bounds. */
static int num_opt_set(train_job *j, const num_opt *o, const char *v)
{
    char *field = (char *)j + o->off;
    if (!strcmp(o->flag, "--steps"))
        j->steps_given = 1;
    return o->is_int ? integer(o->flag, v, o->ilo, o->ihi, (long long *)(void *)field)
                     : num(o->flag, v, o->lo, o->hi, (double *)(void *)field);
}

static void defaults(train_job *j)
{
    j->seq_len = 128;
    j->batch = 8;
    j->accum = 1;
    j->epochs = 1;
    j->save_limit = 2;
    j->lr = 1e-4;
    j->wd = 0.01;
    j->beta1 = 0.9;
    j->beta2 = 0.999;
    j->eps = 1e-8;
    j->clip = 1.0;
    j->eval_frac = 0.05;
    j->mlm_p = 0.15;
    j->cosine = 1;
    j->fused = -1;
    j->device = "cpu";
}

static int parse(train_job *j, int argc, char **argv)
{
    defaults(j);
    int u = GO;
    for (int i = 1; i < argc && u == GO; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (tk_cli_is_help(a)) {
            help();
            return TK_EXIT_OK;
        }
#define VAL()                                                                                                          \
    do {                                                                                                               \
        if (!v)                                                                                                        \
            return tk_cli_usage(USAGE, "%s needs a value", a);                                                         \
        i++;                                                                                                           \
    } while (0)
        const num_opt *no = num_opt_find(a);
        if (no) {
            VAL();
            u = num_opt_set(j, no, v);
        } else if (!strcmp(a, "--data")) {
            VAL();
            j->files[j->nfiles++] = v;
            /* more files until the next option */
            while (i + 1 < argc && argv[i + 1][0] != '-' && j->nfiles < MAX_FILES)
                j->files[j->nfiles++] = argv[++i];
            if (j->nfiles >= MAX_FILES)
                return tk_cli_usage(USAGE, "at most %d --data files", MAX_FILES - 1);
        } else if (!strcmp(a, "--out")) {
            VAL();
            j->out = v;
        } else if (!strcmp(a, "--schedule")) {
            VAL();
            if (strcmp(v, "cosine") && strcmp(v, "constant"))
                return tk_cli_usage(USAGE, "--schedule wants cosine or constant, got '%s'", v);
            j->cosine = !strcmp(v, "cosine");
        } else if (!strcmp(a, "--decay-all")) {
            j->decay_all = 1;
        } else if (!strcmp(a, "--checkpointing")) {
            j->ckpt = 1;
        } else if (!strcmp(a, "--no-fused-loss")) {
            j->fused = 0;
        } else if (!strcmp(a, "--fused-loss")) {
            j->fused = 1;
        } else if (!strcmp(a, "--resume")) {
            j->resume = 1;
        } else if (!strcmp(a, "--device")) {
            VAL();
            j->device = v;
        } else if (!strcmp(a, "--dp")) {
            VAL();
            long long n = 0;
            if ((u = integer(a, v, 1, 4096, &n)) == GO)
                j->dp = (int)n;
        } else if (a[0] == '-' && a[1]) {
            return tk_cli_usage(USAGE, "unknown option '%s' (see tk train --help)", a);
        } else if (!j->dir) {
            j->dir = a;
        } else {
            return tk_cli_usage(USAGE, "unexpected argument '%s' (data files go after --data)", a);
        }
#undef VAL
    }
    if (u != GO)
        return u;
    if (!j->out)
        return tk_cli_usage(USAGE, "--out DIR: where the checkpoints go");
    if (!j->resume && !j->dir)
        return tk_cli_usage(USAGE, "a checkpoint directory, e.g. tk train ./gpt2 --data book.txt --out run1");
    if (!j->resume && !j->nfiles)
        return tk_cli_usage(USAGE, "--data FILE...: the text to train on");
    int id;
    if (tk_cli_parse_device(j->device, &id))
        return tk_cli_usage(USAGE, "--device wants cpu, cuda or cuda:N, got '%s'", j->device);
    return GO;
}

/* ---- the saved configuration (trainer_state.json's "extra") ------------------------------------ */

static char *config_json(const train_job *j)
{
    json_t *files = json_array();
    for (size_t i = 0; i < j->nfiles; i++)
        json_array_append_new(files, json_string(j->files[i]));
    char hash[17];
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)j->data_hash);
    json_t *o =
        json_pack("{s:s, s:o, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, "
                  "s:f, s:f, s:b, s:b, s:b, s:I, s:I}",
                  "tk", "train", "data", files, "data_hash", hash, "seq_len", (json_int_t)j->seq_len, "batch_size",
                  (json_int_t)j->batch, "grad_accum", (json_int_t)j->accum, "steps", (json_int_t)j->steps, "warmup",
                  (json_int_t)j->warmup, "seed", (json_int_t)j->seed, "lr", j->lr, "min_lr_ratio", j->min_lr_ratio,
                  "weight_decay", j->wd, "beta1", j->beta1, "beta2", j->beta2, "eps", j->eps, "max_grad_norm", j->clip,
                  "label_smoothing", j->smoothing, "eval_fraction", j->eval_frac, "mlm_probability", j->mlm_p, "cosine",
                  j->cosine, "decay_all", j->decay_all, "checkpointing", j->ckpt, "fused_loss", (json_int_t)j->fused,
                  "epochs", (json_int_t)j->epochs);
    if (o && j->world > 1) /* --dp N (absent: one process, as before --dp existed) */
        json_object_set_new(o, "dp", json_integer(j->world));
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(o);
    return s;
}

/* Reads OUT/latest and that checkpoint's saved configuration into j (the flags given now must not
 * contradict it, but --steps may extend the run). */
static int load_resume(train_job *j, tk_cli *cli)
{
    char path[4096], name[512];
    snprintf(path, sizeof path, "%s/latest", j->out);
    FILE *f = fopen(path, "r");
    if (!f)
        return tk_cli_errorf(cli, TK_ERR_NOT_FOUND, 0,
                             "--resume: '%s' has no training run to continue (no %s)\n"
                             "HINT: start one without --resume",
                             j->out, path);
    int ok = fgets(name, sizeof name, f) != NULL;
    fclose(f);
    name[strcspn(name, "\r\n")] = 0;
    if (!ok || !name[0] || strchr(name, '/'))
        return tk_cli_errorf(cli, TK_ERR_INVALID, TK_EXIT_IO, "--resume: '%s' is not a checkpoint name", path);
    snprintf(path, sizeof path, "%s/%s/trainer_state.json", j->out, name);
    json_error_t err;
    json_t *st = json_load_file(path, 0, &err), *x = json_object_get(st, "extra");
    if (!st || !json_is_object(x) || strcmp(json_string_value(json_object_get(x, "tk")) ?: "", "train")) {
        json_decref(st);
        return tk_cli_errorf(cli, TK_ERR_INVALID, TK_EXIT_IO, "--resume: '%s' is not a tk train state", path);
    }
    long long steps_now = j->steps;
    int given = j->steps_given;
    j->seq_len = json_integer_value(json_object_get(x, "seq_len"));
    j->batch = json_integer_value(json_object_get(x, "batch_size"));
    j->accum = json_integer_value(json_object_get(x, "grad_accum"));
    j->steps = json_integer_value(json_object_get(x, "steps"));
    j->epochs = json_integer_value(json_object_get(x, "epochs"));
    j->warmup = json_integer_value(json_object_get(x, "warmup"));
    j->seed = json_integer_value(json_object_get(x, "seed"));
    j->lr = json_real_value(json_object_get(x, "lr"));
    j->min_lr_ratio = json_real_value(json_object_get(x, "min_lr_ratio"));
    j->wd = json_real_value(json_object_get(x, "weight_decay"));
    j->beta1 = json_real_value(json_object_get(x, "beta1"));
    j->beta2 = json_real_value(json_object_get(x, "beta2"));
    j->eps = json_real_value(json_object_get(x, "eps"));
    j->clip = json_real_value(json_object_get(x, "max_grad_norm"));
    j->smoothing = json_real_value(json_object_get(x, "label_smoothing"));
    j->eval_frac = json_real_value(json_object_get(x, "eval_fraction"));
    j->mlm_p = json_real_value(json_object_get(x, "mlm_probability"));
    j->cosine = json_is_true(json_object_get(x, "cosine"));
    j->decay_all = json_is_true(json_object_get(x, "decay_all"));
    j->ckpt = json_is_true(json_object_get(x, "checkpointing"));
    json_t *fl = json_object_get(x, "fused_loss");
    j->fused = json_is_integer(fl) ? (int)json_integer_value(fl) : json_is_true(fl) ? 1 : 0;
    json_t *files = json_object_get(x, "data");
    if (!j->nfiles) {
        for (size_t i = 0; i < json_array_size(files) && i < MAX_FILES; i++)
            j->files[j->nfiles++] = strdup(json_string_value(json_array_get(files, i)) ?: "");
        j->files_owned = 1;
    }
    json_t *dpj = json_object_get(x, "dp");
    int saved_dp = json_is_integer(dpj) ? (int)json_integer_value(dpj) : 1;
    if (saved_dp != j->world) {
        json_decref(st);
        return tk_cli_errorf(cli, TK_ERR_INVALID, TK_EXIT_USAGE,
                             "--resume: the run trained on %d rank%s, this one "
                             "has %d (the data order depends on the global batch)\nHINT: %s",
                             saved_dp, saved_dp == 1 ? "" : "s", j->world,
                             saved_dp == 1 ? "resume it in one process, without --dp"
                                           : "resume it under mpirun -np with the run's --dp");
    }
    const char *h = json_string_value(json_object_get(x, "data_hash"));
    j->data_hash = h ? strtoull(h, NULL, 16) : 0;
    json_decref(st);
    if (given) {
        if (steps_now < j->steps && j->cosine)
            return tk_cli_usage(USAGE,
                                "--steps %lld is below the run's %lld (a cosine schedule over it was "
                                "started); give a larger one to extend it",
                                steps_now, j->steps);
        j->steps = steps_now;
    }
    snprintf(path, sizeof path, "%s/%s", j->out, name);
    j->resume_from = strdup(path);
    j->dir = j->resume_from;
    return GO;
}

/* ---- data ------------------------------------------------------------------------------------- */

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* The first byte offset of text that is not UTF-8, or a NUL, or -1 when it is all text. */
static long long bad_utf8(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (c == 0 || k == 0 || i + k > n)
            return (long long)i;
        for (size_t t = 1; t < k; t++)
            if ((s[i + t] & 0xC0) != 0x80)
                return (long long)i;
        i += k;
    }
    return -1;
}

static int load_data(train_job *j, tk_cli *cli)
{
    const tk_tokenizer *tok = NULL;
    int rc = tk_model_tokenizer(&tok, j->m);
    if (rc != TK_OK)
        return tk_cli_fail(cli, rc, "tk train needs the checkpoint's tokenizer.json to read text");
    int32_t eos = -1;
    char *info = NULL;
    if (tk_model_info_json(&info, j->m) == TK_OK) {
        json_t *o = json_loads(info, 0, NULL);
        j->mlm = !strcmp(json_string_value(json_object_get(o, "family")) ?: "", "bert");
        json_decref(o);
        tk_free(info);
    }
    if (j->mlm) {
        if (tk_tokenizer_token_id(&j->mask_id, tok, "[MASK]") != TK_OK)
            return tk_cli_errorf(cli, TK_ERR_INVALID, TK_EXIT_USAGE,
                                 "the tokenizer of '%s' has no [MASK] token, "
                                 "which masked-LM training needs",
                                 j->dir);
        if (tk_tokenizer_token_id(&j->cls_id, tok, "[CLS]") != TK_OK)
            j->cls_id = -1;
        if (tk_tokenizer_token_id(&j->sep_id, tok, "[SEP]") != TK_OK)
            j->sep_id = -1;
        if (tk_tokenizer_token_id(&j->pad_id, tok, "[PAD]") != TK_OK)
            j->pad_id = -1;
    } else {
        /* documents are separated by the eos token, as run_clm's data after tokenizer(text) + eos */
        tk_gen_opts go = TK_GEN_OPTS_INIT;
        if (tk_gen_opts_from_model(&go, j->m) == TK_OK && go.n_eos)
            eos = go.eos_token_id[0];
    }
    size_t cap = 0;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t f = 0; f < j->nfiles; f++) {
        FILE *fp = fopen(j->files[f], "rb");
        if (!fp)
            return tk_cli_errorf(cli, TK_ERR_NOT_FOUND, 0, "--data '%s': %s", j->files[f], strerror(errno));
        fseek(fp, 0, SEEK_END);
        long sz = ftell(fp);
        fseek(fp, 0, SEEK_SET);
        char *text = sz >= 0 ? malloc((size_t)sz + 1) : NULL;
        size_t got = text ? fread(text, 1, (size_t)sz, fp) : 0;
        fclose(fp);
        if (!text || (long)got != sz) {
            free(text);
            return tk_cli_errorf(cli, TK_ERR_IO, 0, "--data '%s': cannot read it", j->files[f]);
        }
        h = fnv(h, text, got);
        if (got == 0) {
            free(text);
            return tk_cli_errorf(cli, TK_ERR_INVALID, TK_EXIT_USAGE,
                                 "--data '%s' is empty\nHINT: give text files "
                                 "with the training text",
                                 j->files[f]);
        }
        long long bad = bad_utf8((const unsigned char *)text, got);
        if (bad >= 0) {
            free(text);
            return tk_cli_errorf(cli, TK_ERR_INVALID, TK_EXIT_USAGE,
                                 "--data '%s' is not UTF-8 text (byte %lld is "
                                 "%s)\nHINT: tk train reads plain text files; decode or extract the text first",
                                 j->files[f], bad, "not part of a UTF-8 character, or NUL");
        }
        int32_t *ids = NULL;
        size_t n = 0;
        rc = tk_tokenizer_encode(&ids, &n, tok, text, got, 1);
        free(text);
        if (rc != TK_OK)
            return tk_cli_fail(cli, rc, j->files[f]);
        size_t need = j->ntok + n + 1;
        if (need > cap) {
            cap = need * 2;
            int32_t *p = realloc(j->tokens, cap * sizeof *p);
            if (!p) {
                tk_free(ids);
                return tk_cli_errorf(cli, TK_ERR_NOMEM, 0, "out of memory for %zu tokens", need);
            }
            j->tokens = p;
        }
        memcpy(j->tokens + j->ntok, ids, n * sizeof *ids);
        j->ntok += n;
        if (eos >= 0 && (n == 0 || ids[n - 1] != eos))
            j->tokens[j->ntok++] = eos;
        tk_free(ids);
    }
    if (j->resume_from && j->data_hash && h != j->data_hash)
        return tk_cli_errorf(cli, TK_ERR_INVALID, TK_EXIT_USAGE,
                             "--resume: the data files differ from the run's "
                             "(their contents hash to %016llx, the run's to %016llx)\nHINT: resume with the same "
                             "--data files",
                             (unsigned long long)h, (unsigned long long)j->data_hash);
    j->data_hash = h;
    j->nblocks = j->ntok / (size_t)j->seq_len;
    if (j->nblocks == 0)
        return tk_cli_errorf(cli, TK_ERR_INVALID, TK_EXIT_USAGE,
                             "the data has %zu tokens, less than one sequence of "
                             "--seq-len %lld\nHINT: a smaller --seq-len, or more text",
                             j->ntok, j->seq_len);
    return GO;
}

/* splitmix64: the one random stream, keyed by position so a resume draws the same numbers. */
static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static void shuffle(size_t *a, size_t n, uint64_t key)
{
    for (size_t i = n; i > 1; i--) {
        size_t k = (size_t)(mix(key ^ mix(i)) % i), t = a[i - 1];
        a[i - 1] = a[k];
        a[k] = t;
    }
}

static int split(train_job *j, tk_cli *cli)
{
    if (!(j->order = malloc(j->nblocks * sizeof *j->order)) || !(j->perm = malloc(j->nblocks * sizeof *j->perm)))
        return tk_cli_errorf(cli, TK_ERR_NOMEM, 0, "out of memory");
    for (size_t i = 0; i < j->nblocks; i++)
        j->order[i] = i;
    shuffle(j->order, j->nblocks, mix((uint64_t)j->seed) ^ 0x5eed5eedull);
    j->neval = j->eval_frac > 0 && j->nblocks > 1 ? (size_t)ceil(j->eval_frac * (double)j->nblocks) : 0;
    if (j->neval >= j->nblocks)
        j->neval = j->nblocks - 1;
    j->ntrain = j->nblocks - j->neval;
    j->perm_epoch = -1;
    if (j->ntrain < (size_t)j->world)
        return tk_cli_errorf(cli, TK_ERR_INVALID, TK_EXIT_USAGE,
                             "--dp %d: the data has %zu training sequence%s of "
                             "--seq-len %lld (%zu held out), fewer than the ranks: every rank needs one of its own"
                             "\nHINT: more text, a smaller --seq-len or --eval-fraction, or fewer ranks",
                             j->world, j->ntrain, j->ntrain == 1 ? "" : "s", j->seq_len, j->neval);
    size_t per_step = (size_t)(j->batch * j->accum) * (size_t)j->world;
    if (!j->steps_given && !j->resume_from)
        j->steps = (long long)(((size_t)j->epochs * j->ntrain + per_step - 1) / per_step);
    size_t rows = (size_t)j->batch, T = rows * (size_t)j->seq_len;
    if (!(j->ids = malloc(T * sizeof *j->ids)) || !(j->targets = malloc(T * sizeof *j->targets)) ||
        !(j->lens = malloc(rows * sizeof *j->lens)) || !(j->blocks = malloc(rows * sizeof *j->blocks)))
        return tk_cli_errorf(cli, TK_ERR_NOMEM, 0, "out of memory");
    return GO;
}

/* The training block at position `idx` of the endless seeded sequence of epochs. */
static size_t train_block(train_job *j, uint64_t idx)
{
    long long epoch = (long long)(idx / j->ntrain);
    if (epoch != j->perm_epoch) {
        memcpy(j->perm, j->order + j->neval, j->ntrain * sizeof *j->perm);
        shuffle(j->perm, j->ntrain, mix((uint64_t)j->seed ^ mix((uint64_t)epoch + 1)));
        j->perm_epoch = epoch;
    }
    return j->perm[idx % j->ntrain];
}

/* Fills ids/targets/lens with `rows` blocks, rows row0.. of the global micro-batch (--dp: this rank's
 * share starts at rank x --batch-size); `key` and the global row seed BERT's masks, so a rank masks its
 * rows as one process with the whole batch would. */
static void fill_rows(train_job *j, const size_t *blocks, size_t rows, size_t row0, uint64_t key)
{
    size_t L = (size_t)j->seq_len;
    for (size_t r = 0; r < rows; r++) {
        const int32_t *src = j->tokens + blocks[r] * L;
        int32_t *ids = j->ids + r * L;
        int64_t *tg = j->targets + r * L;
        j->lens[r] = L;
        memcpy(ids, src, L * sizeof *ids);
        if (!j->mlm) {
            for (size_t i = 0; i + 1 < L; i++)
                tg[i] = src[i + 1];
            tg[L - 1] = -100;
            continue;
        }
        for (size_t i = 0; i < L; i++) {
            uint64_t z = mix(key ^ mix((uint64_t)((row0 + r) * L + i) + 1));
            double u1 = (double)(z >> 11) * 0x1.0p-53, u2 = (double)((mix(z) >> 11)) * 0x1.0p-53;
            int32_t id = src[i];
            int special = id == j->cls_id || id == j->sep_id || id == j->pad_id;
            tg[i] = -100;
            if (special || u1 >= j->mlm_p)
                continue;
            tg[i] = id;
            if (u2 < 0.8)
                ids[i] = j->mask_id;
            else if (u2 < 0.9)
                ids[i] = (int32_t)(mix(z ^ 0xabcdull) % (uint64_t)j->vocab);
        }
    }
}

/* ---- checkpoints ------------------------------------------------------------------------------ */

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

/* Writes OUT/latest = name atomically (a temporary, fsync, rename, fsync of OUT). */
static int write_latest(const train_job *j, const char *name)
{
    char tmp[4096], dst[4096];
    snprintf(tmp, sizeof tmp, "%s/.latest.tmp.%ld", j->out, (long)getpid());
    snprintf(dst, sizeof dst, "%s/latest", j->out);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    size_t n = strlen(name);
    int ok = write(fd, name, n) == (ssize_t)n && write(fd, "\n", 1) == 1 && fsync(fd) == 0;
    ok &= close(fd) == 0;
    if (!ok || rename(tmp, dst) != 0) {
        unlink(tmp);
        return -1;
    }
    int dfd = open(j->out, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return 0;
}

static int save(train_job *j, tk_cli *cli, long long step, char *saved, size_t cap)
{
    char name[64], path[4096];
    snprintf(name, sizeof name, "checkpoint-%lld", step);
    snprintf(path, sizeof path, "%s/%s", j->out, name);
    struct stat sb;
    if (stat(path, &sb) == 0) { /* already saved at this step (the run's own end after a resume) */
        snprintf(saved, cap, "%s", path);
        return GO;
    }
    char *cfg = config_json(j);
    int rc = tk_train_save(j->t, path, cfg);
    free(cfg);
    if (rc != TK_OK)
        return tk_cli_fail(cli, rc, "saving the checkpoint (the previous one is kept)");
    if (write_latest(j, name) != 0)
        return tk_cli_errorf(cli, TK_ERR_IO, TK_EXIT_IO, "cannot update '%s/latest': %s (checkpoint '%s' is whole)",
                             j->out, strerror(errno), path);
    snprintf(saved, cap, "%s", path);
    /* the oldest beyond --save-total-limit: every checkpoint-N of OUT, newest kept */
    if (j->save_limit > 0) {
        long long steps[4096];
        size_t n = 0;
        DIR *d = opendir(j->out);
        struct dirent *e;
        while (d && (e = readdir(d)) && n < sizeof steps / sizeof steps[0]) {
            char *end;
            if (strncmp(e->d_name, "checkpoint-", 11))
                continue;
            long long s = strtoll(e->d_name + 11, &end, 10);
            if (end != e->d_name + 11 && !*end)
                steps[n++] = s;
        }
        if (d)
            closedir(d);
        for (size_t a = 0; a < n; a++) {
            size_t newer = 0;
            for (size_t b = 0; b < n; b++)
                newer += steps[b] > steps[a];
            if (newer >= (size_t)j->save_limit && steps[a] != step) {
                char old[4096];
                snprintf(old, sizeof old, "%s/checkpoint-%lld", j->out, steps[a]);
                nftw(old, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
            }
        }
    }
    return GO;
}

/* ---- the loop --------------------------------------------------------------------------------- */

/* The eval loss over the held-out blocks, in batches of --batch-size; with --dp in global batches of
 * N x --batch-size, each rank its share as in training (so BERT's masks are one process's with the
 * global batch), the sums added over the ranks. */
static int eval_loss(train_job *j, tk_cli *cli, double *mean, int64_t *ntok)
{
    double sum = 0;
    int64_t n = 0;
    size_t *blocks = j->blocks, B = (size_t)j->batch, G = B * (size_t)j->world, row0 = B * (size_t)j->rank;
    for (size_t b0 = 0; b0 < j->neval; b0 += G) {
        size_t first = b0 + row0;
        if (first >= j->neval)
            continue;
        size_t rows = j->neval - first < B ? j->neval - first : B;
        for (size_t r = 0; r < rows; r++)
            blocks[r] = j->order[first + r];
        fill_rows(j, blocks, rows, row0, mix((uint64_t)j->seed ^ 0xe7a1ull ^ mix(b0)));
        double s;
        int64_t k;
        int rc = tk_train_eval(j->t, j->ids, j->targets, j->lens, rows, &s, &k);
        if (rc != TK_OK)
            return tk_cli_fail(cli, rc, "eval");
        sum += s;
        n += k;
    }
    if (j->comm) {
        double v[2] = {sum, (double)n};
        int64_t two = 2;
        tk_tensor x = {v, {TK_DEV_CPU, 0}, 1, {TK_DL_FLOAT, 64, 1}, &two, NULL, 0};
        int rc = tk_comm_all_reduce_sum(j->comm, &x, NULL);
        if (rc != TK_OK)
            return tk_cli_fail(cli, rc, "eval: summing the loss over the ranks");
        sum = v[0];
        n = (int64_t)v[1];
    }
    *mean = n ? sum / (double)n : 0;
    *ntok = n;
    return GO;
}

static void fmt_time(char *out, size_t cap, double s)
{
    if (!(s >= 0) || s > 1e7)
        snprintf(out, cap, "?");
    else if (s >= 3600)
        snprintf(out, cap, "%dh%02dm", (int)(s / 3600), (int)(fmod(s, 3600) / 60));
    else if (s >= 60)
        snprintf(out, cap, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
    else
        snprintf(out, cap, "%.0fs", s);
}

/* --json: one line per step (a NaN loss or norm as null) */
static void json_step(const train_job *j, long long step, const tk_train_stats *st, double tps)
{
    printf("{\"step\": %lld, \"loss\": ", step);
    tk_cli_json_num(stdout, st->loss);
    printf(", \"lr\": ");
    tk_cli_json_num(stdout, st->lr);
    printf(", \"grad_norm\": ");
    tk_cli_json_num(stdout, st->grad_norm);
    printf(", \"tokens\": %lld, \"tokens_per_s\": %.1f, \"elapsed_s\": %.3f}\n", (long long)st->tokens, tps,
           now_s() - j->t0);
}

static void progress(const train_job *j, const tk_cli *cli, long long step, const tk_train_stats *st, double tps)
{
    if (cli->json || cli->quiet)
        return;
    double done = (double)(step - j->start_step), left = (double)(j->steps - step);
    double el = now_s() - j->t0, eta = done > 0 ? el / done * left : -1;
    char e[32];
    fmt_time(e, sizeof e, eta);
    if (cli->tty) {
        int w = 24, fill = (int)((double)w * (double)step / (double)j->steps);
        char bar[32];
        for (int i = 0; i < w; i++)
            bar[i] = i < fill ? '=' : i == fill ? '>' : ' ';
        bar[w] = 0;
        fprintf(stderr, "\r\033[Kstep %lld/%lld [%s] loss %.4f lr %.2e %.0f tok/s ETA %s", step, j->steps, bar,
                st->loss, st->lr, tps, e);
        fflush(stderr);
    } else {
        long long every = j->steps / 20 > 0 ? j->steps / 20 : 1;
        if (step % every == 0 || step == j->steps)
            fprintf(stderr, "step %lld/%lld loss %.4f lr %.2e grad_norm %.3f %.0f tok/s ETA %s\n", step, j->steps,
                    st->loss, st->lr, st->grad_norm, tps, e);
    }
}

/* A failed micro-batch or step: the library's message (a non-finite value names its tensor), what
 * remains saved, and exit 1 (a training failure, not a usage error). */
static int train_failed(const train_job *j, tk_cli *cli, int rc, const char *saved)
{
    if (cli->tty && !cli->quiet && !cli->json)
        fputs("\n", stderr);
    int ec = tk_cli_fail(cli, rc, NULL);
    if (!cli->json) {
        if (rc == TK_ERR_NOMEM)
            fprintf(stderr, "HINT: tk train --batch-size, --seq-len and --checkpointing set the memory the "
                            "activations take\n");
        if (saved[0])
            fprintf(stderr, "tk: the last checkpoint is %s; tk train --out %s --resume continues from it\n", saved,
                    j->out);
        else
            fprintf(stderr, "tk: no checkpoint was saved in this run\n");
    }
    return ec == TK_EXIT_USAGE ? TK_EXIT_FAIL : ec;
}

/* --dp: a signal may reach the ranks between different steps; they stop after the same one (the
 * first step after which any rank has seen it), or the others would wait for it in the next step. */
static int agree_stop(train_job *j, tk_cli *cli)
{
    int32_t v = stop_signal != 0;
    int64_t one = 1;
    tk_tensor x = {&v, {TK_DEV_CPU, 0}, 1, {TK_DL_INT, 32, 1}, &one, NULL, 0};
    int rc = tk_comm_all_reduce_sum(j->comm, &x, NULL);
    if (rc != TK_OK)
        return tk_cli_fail(cli, rc, "agreeing on the step to stop at");
    j->stop = v != 0;
    return GO;
}

/* Whether to stop after this step: the signal, or with --dp what the ranks agreed on. */
static int stopped(const train_job *j) { return j->comm ? j->stop : stop_signal != 0; }

static int train_loop(train_job *j, tk_cli *cli)
{
    long long step = tk_train_step_count(j->t);
    j->start_step = step;
    j->t0 = now_s();
    char saved[4096] = "";
    double last_eval = NAN;
    int64_t tok_total = 0;
    size_t *blocks = j->blocks;
    if (step >= j->steps)
        tk_cli_info(cli, "the run is at step %lld of %lld already: nothing to train (--steps extends it)", step,
                    j->steps);
    while (step < j->steps && !stopped(j)) {
        double ts = now_s();
        for (long long k = 0; k < j->accum; k++) {
            /* the global micro-batch has world x batch rows; this rank's are rank x batch onwards */
            uint64_t micro = (uint64_t)(step * j->accum + k), row0 = (uint64_t)j->rank * (uint64_t)j->batch;
            for (long long r = 0; r < j->batch; r++)
                blocks[r] = train_block(j, micro * (uint64_t)(j->batch * j->world) + row0 + (uint64_t)r);
            fill_rows(j, blocks, (size_t)j->batch, (size_t)row0, mix((uint64_t)j->seed ^ mix(micro + 1)));
            int rc = tk_train_accumulate(j->t, j->ids, j->targets, j->lens, (size_t)j->batch, NULL);
            if (rc != TK_OK) {
                if (cli->tty && !cli->quiet && !cli->json)
                    fputs("\n", stderr);
                return train_failed(j, cli, rc, saved);
            }
        }
        tk_train_stats st;
        int rc = tk_train_step(j->t, &st);
        if (rc != TK_OK)
            return train_failed(j, cli, rc, saved);
        step = st.step;
        if (j->comm && (rc = agree_stop(j, cli)) != GO)
            return rc;
        double dt = now_s() - ts;
        int64_t toks = j->batch * j->accum * j->seq_len * j->world;
        tok_total += toks;
        double tps = dt > 0 ? (double)toks / dt : 0;
        if (cli->json)
            json_step(j, step, &st, tps);
        progress(j, cli, step, &st, tps);
        int save_now = (j->save_every > 0 && step % j->save_every == 0) || step == j->steps || stopped(j);
        int eval_now =
            j->neval && ((j->eval_every > 0 && step % j->eval_every == 0) || (j->eval_every == 0 && save_now));
        if (eval_now) {
            int64_t n = 0;
            if ((rc = eval_loss(j, cli, &last_eval, &n)) != GO)
                return rc;
            if (cli->json) {
                printf("{\"eval\": true, \"step\": %lld, \"eval_loss\": ", step);
                tk_cli_json_num(stdout, last_eval);
                printf(", \"tokens\": %lld}\n", (long long)n);
            } else if (!cli->quiet)
                fprintf(stderr, "%sstep %lld: eval loss %.4f over %lld tokens\n", cli->tty ? "\r\033[K" : "", step,
                        last_eval, (long long)n);
        }
        if (save_now) {
            if (j->rank == 0 && (rc = save(j, cli, step, saved, sizeof saved)) != GO)
                return rc;
            if (j->rank != 0)
                snprintf(saved, sizeof saved, "%s/checkpoint-%lld", j->out, step); /* rank 0's */
            if (cli->json)
                printf("{\"saved\": ");
            if (cli->json) {
                tk_cli_json_str(stdout, saved);
                printf(", \"step\": %lld}\n", step);
            } else if (!cli->quiet) {
                fprintf(stderr, "%ssaved %s\n", cli->tty ? "\r\033[K" : "", saved);
            }
        }
        if (cli->json)
            fflush(stdout);
    }
    if (cli->tty && !cli->quiet && !cli->json)
        fputs("\n", stderr);
    double el = now_s() - j->t0;
    if (cli->json) {
        printf("{\"done\": true, \"step\": %lld, \"steps\": %lld, \"interrupted\": %s, \"checkpoint\": ", step,
               j->steps, stopped(j) ? "true" : "false");
        tk_cli_json_str(stdout, saved[0] ? saved : NULL);
        printf(", \"eval_loss\": ");
        tk_cli_json_num(stdout, last_eval); /* null: no evaluation ran */
        printf(", \"tokens\": %lld, \"tokens_per_s\": %.1f, \"elapsed_s\": %.3f}\n", (long long)tok_total,
               el > 0 ? (double)tok_total / el : 0, el);
    } else if (!cli->quiet || (stopped(j) && j->rank == 0)) {
        fprintf(stderr, "%s at step %lld of %lld; checkpoint %s\n", stopped(j) ? "interrupted" : "done", step, j->steps,
                saved[0] ? saved : "(none)");
    }
    if (stopped(j)) {
        if (!cli->json && j->rank == 0)
            fprintf(stderr, "HINT: tk train --out %s --resume continues it\n", j->out);
        return 130;
    }
    return TK_EXIT_OK;
}

/* ---- the command ------------------------------------------------------------------------------ */

/* --dp N: joins the N ranks (tk_cli_comm_join: the world size must be N; ranks other than 0 print
 * nothing on stdout and no progress). Without --dp, a process that mpirun started as one of several
 * is refused: N independent runs would write the same --out. */
static int join(train_job *j, tk_cli *cli)
{
    if (j->dp > 0) {
        int ec = tk_cli_comm_join(cli, &j->comm, j->dp, "--dp");
        if (ec != 0)
            return ec;
        j->rank = tk_comm_rank(j->comm);
        j->world = tk_comm_size(j->comm);
        if (j->world == 1) { /* --dp 1: one process, exactly as without it */
            tk_comm_free(j->comm);
            j->comm = NULL;
        }
        return GO;
    }
    char *info = NULL;
    long long world = 0;
    if (tk_comm_backends_json(&info) == TK_OK) {
        json_t *o = json_loads(info, 0, NULL);
        json_t *w = json_object_get(json_object_get(o, "mpi"), "world_size");
        world = json_is_integer(w) ? (long long)json_integer_value(w) : 0;
        json_decref(o);
        tk_free(info);
    }
    if (world > 1)
        return tk_cli_errorf(cli, TK_ERR_INVALID, TK_EXIT_USAGE,
                             "this process is one of %lld ranks that mpirun "
                             "started, but --dp was not given: each would train alone into the same --out\nHINT: "
                             "add --dp %lld (data parallel), or run one process",
                             world, world);
    return GO;
}

static int setup(train_job *j, tk_cli *cli)
{
    tk_ctx *ctx = tk_cli_ctx(cli);
    if (!ctx)
        return TK_EXIT_FAIL;
    char latest[4096];
    snprintf(latest, sizeof latest, "%s/latest", j->out);
    struct stat sb;
    if (!j->resume && stat(latest, &sb) == 0)
        return tk_cli_errorf(cli, TK_ERR_INVALID, TK_EXIT_USAGE,
                             "'%s' already holds a training run (%s)\nHINT: "
                             "--resume continues it; or pick another --out",
                             j->out, latest);
    if (j->resume) {
        int u = load_resume(j, cli);
        if (u != GO)
            return u;
    }
    /* the output must be writable before hours of training, not after (--dp: rank 0 alone writes) */
    char probe[4096];
    if (j->rank != 0)
        ;
    else if (mkdir(j->out, 0755) != 0 && errno != EEXIST)
        return tk_cli_errorf(cli, TK_ERR_IO, TK_EXIT_IO, "--out '%s': cannot create it: %s", j->out, strerror(errno));
    snprintf(probe, sizeof probe, "%s/.tk-train-probe.%ld", j->out, (long)getpid());
    int fd = j->rank != 0 ? -2 : open(probe, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd == -1)
        return tk_cli_errorf(cli, TK_ERR_IO, TK_EXIT_IO,
                             "--out '%s' is not writable: %s\nHINT: pick a directory you "
                             "can write, with room for the checkpoints",
                             j->out, strerror(errno));
    if (fd >= 0) {
        close(fd);
        unlink(probe);
    }
    int id;
    tk_cli_parse_device(j->device, &id);
    tk_model_opts mo = TK_MODEL_OPTS_INIT;
    mo.device_type = id < 0 ? TK_DEV_CPU : TK_DEV_CUDA;
    mo.device_id = id < 0 ? 0 : id;
    mo.dtype = "f32";
    int rc = tk_model_load(&j->m, ctx, j->dir, &mo);
    if (rc != TK_OK)
        return tk_cli_fail(cli, rc, NULL);
    j->vocab = tk_model_vocab_size(j->m);
    int u = load_data(j, cli);
    if (u == GO)
        u = split(j, cli);
    if (u != GO)
        return u;
    if (j->ntrain == 0)
        return tk_cli_errorf(cli, TK_ERR_INVALID, TK_EXIT_USAGE, "no training sequences left after the eval split");
    tk_train_opts o = TK_TRAIN_OPTS_INIT;
    o.lr = j->lr;
    o.beta1 = j->beta1;
    o.beta2 = j->beta2;
    o.eps = j->eps;
    o.weight_decay = j->wd;
    o.decay_all = j->decay_all;
    o.max_grad_norm = j->clip;
    o.warmup_steps = j->warmup;
    o.total_steps = j->cosine ? j->steps : 0;
    o.min_lr_ratio = j->min_lr_ratio;
    o.checkpointing = j->ckpt;
    o.fused_loss = j->fused;
    o.label_smoothing = j->smoothing;
    o.comm = j->comm;
    if ((rc = tk_train_new(&j->t, j->m, &o)) != TK_OK)
        return tk_cli_fail(cli, rc, NULL);
    if (j->resume_from) {
        if ((rc = tk_train_resume(j->t, j->resume_from, NULL)) != TK_OK)
            return tk_cli_fail(cli, rc, NULL);
        tk_cli_info(cli, "resuming %s at step %lld", j->resume_from, (long long)tk_train_step_count(j->t));
    }
    if (!cli->json && !cli->quiet)
        fprintf(stderr,
                "tk train: %s, %zu tokens in %zu sequences of %lld (%zu held out), %lld steps of %lld x %lld "
                "sequences%s\n",
                tk_model_arch(j->m), j->ntok, j->nblocks, j->seq_len, j->neval, j->steps, j->batch, j->accum,
                j->world > 1 ? " on each rank" : "");
    if (j->world > 1)
        tk_cli_info(cli, "data parallel over %d ranks: %lld sequences a step, rank 0 saves", j->world,
                    j->batch * j->accum * j->world);
    return GO;
}

int tk_cmd_train(tk_cli *cli, int argc, char **argv)
{
    train_job *j = calloc(1, sizeof *j);
    if (!j)
        return tk_cli_errorf(cli, TK_ERR_NOMEM, TK_EXIT_FAIL, "out of memory");
    j->world = 1;
    int ec = parse(j, argc, argv);
    if (ec == GO)
        ec = join(j, cli);
    if (ec == GO)
        ec = setup(j, cli);
    if (ec == GO) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_signal;
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        ec = train_loop(j, cli);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
    }
    /* a failed rank ends the job, or the others would wait for it in the next all-reduce */
    if (ec != TK_EXIT_OK && j->comm && j->world > 1)
        tk_comm_abort(j->comm, ec);
    tk_train_free(j->t);
    tk_model_free(j->m);
    tk_comm_free(j->comm);
    for (size_t i = 0; j->files_owned && i < j->nfiles; i++)
        free((char *)j->files[i]);
    free(j->resume_from);
    free(j->tokens);
    free(j->order);
    free(j->perm);
    free(j->ids);
    free(j->targets);
    free(j->lens);
    free(j->blocks);
    free(j);
    return ec;
}
