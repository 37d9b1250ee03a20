/*
 * cmd_generate_diffusion.c — tk generate --diffusion: masked diffusion generation (LLaDA, Dream, or a
 * Llama-family checkpoint run bidirectionally) through tk_diffusion_generate. tk generate comes here
 * for --diffusion or any diffusion flag, and for a checkpoint that is a diffusion LM (LLaDAModelLM,
 * DreamModel). Each block prints when it is final; --show-steps draws the canvas as it denoises.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

static const char *USAGE = "tk generate --diffusion [options] DIR (--prompt TEXT | --ids ID,ID,...)";

static void help(void)
{
    printf("usage: %s\n"
           "\n"
           "Generates by masked diffusion: gen_length mask tokens after the prompt are unmasked a few per\n"
           "step by a model whose attention sees every position, as LLaDA's and Dream's published\n"
           "samplers do (docs/diffusion.md). LLaDAModelLM and DreamModel checkpoints use it without\n"
           "--diffusion; any Llama-family checkpoint runs it with --bidirectional and a mask token id.\n"
           "Every step is one forward through the op registry (the attention op with causal 0). Each\n"
           "block prints when its last token is chosen.\n"
           "\n"
           "On a DiffusionGemmaForBlockDiffusion checkpoint it runs block diffusion instead, as\n"
           "transformers' DiffusionGemma generate does: ceil(--gen-length / canvas_length) blocks, each\n"
           "started from random tokens and refined for up to --steps steps (default: the checkpoint's\n"
           "max_denoising_steps, else 48) under a temperature falling from --t-max to --t-min, keeping the\n"
           "lowest-entropy tokens within --entropy-bound and redrawing the rest; the block options below\n"
           "default to generation_config.json's values, else transformers' defaults.\n"
           "\n"
           "input (one of):\n"
           "  --prompt TEXT              text, encoded with DIR/tokenizer.json (special tokens added)\n"
           "  --ids ID,ID,...            token ids\n"
           "\n"
           "sampler:\n"
           "  --diffusion                masked diffusion (implied by a diffusion checkpoint or any flag here)\n"
           "  --sampler llada|dream      the algorithm (default: the checkpoint's; llada for --bidirectional)\n"
           "  --gen-length N             masked positions to fill (default 128; --max-new-tokens is the same)\n"
           "  --block-length N           LLaDA: semi-autoregressive blocks of N, dividing --gen-length\n"
           "                             (default: one block of --gen-length)\n"
           "  --steps N                  denoising steps in all (default --gen-length): LLaDA gives each\n"
           "                             block steps / blocks, so N must be a multiple of the block count;\n"
           "                             at most --gen-length\n"
           "  --temperature T            0 (default): argmax; > 0: LLaDA's Gumbel-max noise in float64,\n"
           "                             Dream's categorical sampling\n"
           "  --remasking low_confidence|random\n"
           "                             LLaDA: which masked positions a step reveals: the most probable\n"
           "                             choices (default), or at random\n"
           "  --cfg-scale F              LLaDA: classifier-free guidance against the prompt masked (0: off)\n"
           "  --alg origin|maskgit_plus|topk_margin|entropy\n"
           "                             Dream: reveal at random (origin, default), by top probability\n"
           "                             (maskgit_plus, also 'topk'), by the top-2 margin (topk_margin, also\n"
           "                             'margin') or by negative entropy\n"
           "  --alg-temp F               Dream: 0 (default) reveals the most confident; > 0 samples positions\n"
           "  --top-p P, --top-k K       Dream: filter each position's distribution before sampling\n"
           "  --eps E                    Dream: the schedule's last time (default 0.001)\n"
           "  --mask-token-id ID         the mask token (default: config.json's mask_token_id)\n"
           "  --t-min T, --t-max T       block: the last and the first step's temperature (0.4, 0.8)\n"
           "  --entropy-bound F          block: accept the lowest-entropy tokens while their summed entropy\n"
           "                             less the largest stays within F (0.1)\n"
           "  --stability-threshold N    block: end a block early once its argmax canvas has repeated for N\n"
           "                             steps (1; 0: no need) ...\n"
           "  --confidence-threshold F   ... and its mean entropy is below F (0.005)\n"
           "  --bidirectional            run a causal (Llama-family) checkpoint's attention bidirectionally\n"
           "  --seed S                   tk's random generator (default 0)\n"
           "  --draws FILE               uniform draws (little-endian float64) to use instead of tk's\n"
           "                             generator, in the order docs/diffusion.md gives (to reproduce a\n"
           "                             reference implementation's run)\n"
           "\n"
           "output and runtime:\n"
           "  --show-steps               draw the canvas after every step on stderr ('_' for a masked token)\n"
           "  --stats                    print the timings and per-step counts (JSON) to stderr\n"
           "  --json                     print {\"ids\", \"text\", \"end\", \"stats\": {..., \"per_step\": [...]}}\n"
           "  --dtype f32|bf16|f16       compute dtype (default f32 on the CPU)\n"
           "  --device cpu|cuda[:N]      where the model runs (default cpu)\n"
           "  --threads N                CPU threads for the ops\n"
           "\n"
           "examples:\n"
           "  tk generate ./LLaDA-8B-Instruct --prompt 'Hello' --gen-length 64 --block-length 32 --steps 64\n"
           "  tk generate ./Dream-v0-Instruct-7B --prompt 'Hi' --alg entropy --steps 64 --gen-length 64\n"
           "  tk generate ./TinyLlama --diffusion --bidirectional --mask-token-id 0 --ids 1,415 --show-steps\n"
           "  tk generate ./diffusiongemma --prompt 'Why is the sky blue?' --gen-length 256 --steps 48\n"
           "\n"
           "exit status: 0 ok, 1 a model or op failure, 2 usage or invalid input (no mask token id,\n"
           "--gen-length not a multiple of --block-length, --steps fewer than the blocks or above\n"
           "--gen-length, a prompt too long for the context), 3 no checkpoint or tokenizer, 5 a damaged\n"
           "checkpoint, 7 no GPU for --device cuda, 8 an architecture or config value tk does not\n"
           "implement.\n",
           USAGE);
}

/* the flags only this command knows: tk generate sends a command line with one of them here */
int tk_cli_diffusion_flag(const char *a)
{
    static const char *const f[] = {"--diffusion",
                                    "--sampler",
                                    "--gen-length",
                                    "--block-length",
                                    "--steps",
                                    "--remasking",
                                    "--cfg-scale",
                                    "--alg",
                                    "--alg-temp",
                                    "--eps",
                                    "--mask-token-id",
                                    "--bidirectional",
                                    "--draws",
                                    "--show-steps",
                                    "--t-min",
                                    "--t-max",
                                    "--entropy-bound",
                                    "--stability-threshold",
                                    "--confidence-threshold",
                                    NULL};
    for (size_t i = 0; f[i]; i++)
        if (!strcmp(a, f[i]))
            return 1;
    return 0;
}

typedef struct {
    const char *dir, *dtype, *device, *text, *idlist, *draws_path;
    int stats, show;
    tk_diff_opts o;
    tk_model *m;
    const tk_tokenizer *tok;
    int32_t *ids;
    size_t n;
    FILE *draws;
    int draws_short, draws_bad; /* ran out; a value outside [0, 1) (draw number draws_n, value bad_u) */
    uint64_t draws_n;
    double bad_u;
    size_t printed; /* bytes of the text printed so far */
    int streamed;
    tk_cli *cli;
} djob;

static int num(const char *flag, const char *v, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double d = v ? strtod(v, &end) : NAN;
    if (!v || errno || end == v || *end || !(d >= lo && d <= hi))
        return tk_cli_usage(USAGE, "%s wants a number in [%g, %g], got '%s'", flag, lo, hi, v ? v : "");
    *out = d;
    return 0;
}

static int integer(const char *flag, const char *v, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long x = v ? strtoll(v, &end, 10) : 0;
    if (!v || errno || end == v || *end || x < lo || x > hi)
        return tk_cli_usage(USAGE, "%s wants an integer in [%lld, %lld], got '%s'", flag, lo, hi, v ? v : "");
    *out = x;
    return 0;
}

static int parse(djob *j, tk_cli *cli, int argc, char **argv)
{
    static const char *const algs[][2] = {{"origin", "origin"},           {"maskgit_plus", "maskgit_plus"},
                                          {"topk", "maskgit_plus"},       {"top-prob", "maskgit_plus"},
                                          {"topk_margin", "topk_margin"}, {"margin", "topk_margin"},
                                          {"entropy", "entropy"}};
    j->device = "cpu";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long x = 0;
        double d = 0;
        int u = 0, valued = 1;
        if (tk_cli_is_help(a)) {
            help();
            return TK_EXIT_OK;
        }
        if (!strcmp(a, "--diffusion") || !strcmp(a, "--bidirectional") || !strcmp(a, "--show-steps") ||
            !strcmp(a, "--stats")) {
            valued = 0;
            if (!strcmp(a, "--bidirectional"))
                j->o.bidirectional = 1;
            else if (!strcmp(a, "--show-steps"))
                j->show = 1;
            else if (!strcmp(a, "--stats"))
                j->stats = 1;
        } else if (!strcmp(a, "--threads")) {
            u = tk_cli_parse_threads(cli, USAGE, v);
        } else if (a[0] == '-' && a[1] && !v) {
            return tk_cli_usage(USAGE, "%s needs a value", a);
        } else if (!strcmp(a, "--prompt") || !strcmp(a, "--ids")) {
            if (j->text || j->idlist)
                return tk_cli_usage(USAGE, "one prompt: diffusion generation takes one --prompt or --ids");
            if (!strcmp(a, "--prompt"))
                j->text = v;
            else
                j->idlist = v;
        } else if (!strcmp(a, "--sampler")) {
            if (!strcmp(v, "llada"))
                j->o.sampler = TK_DIFF_LLADA;
            else if (!strcmp(v, "dream"))
                j->o.sampler = TK_DIFF_DREAM;
            else
                u = tk_cli_usage(USAGE, "--sampler wants llada or dream, got '%s'", v);
        } else if (!strcmp(a, "--gen-length") || !strcmp(a, "--max-new-tokens")) {
            u = integer(a, v, 1, 1 << 24, &x), j->o.gen_length = x;
        } else if (!strcmp(a, "--block-length")) {
            u = integer(a, v, 1, 1 << 24, &x), j->o.block_length = x;
        } else if (!strcmp(a, "--steps")) {
            u = integer(a, v, 1, 1 << 24, &x), j->o.steps = x;
        } else if (!strcmp(a, "--temperature")) {
            u = num(a, v, 0, 1e6, &d), j->o.temperature = d;
        } else if (!strcmp(a, "--remasking")) {
            if (!strcmp(v, "low_confidence"))
                j->o.remasking = 0;
            else if (!strcmp(v, "random"))
                j->o.remasking = 1;
            else
                u = tk_cli_usage(USAGE, "--remasking wants low_confidence or random, got '%s'", v);
        } else if (!strcmp(a, "--cfg-scale")) {
            u = num(a, v, 0, 1e6, &d), j->o.cfg_scale = d;
        } else if (!strcmp(a, "--alg")) {
            j->o.alg = NULL;
            for (size_t k = 0; k < sizeof algs / sizeof algs[0]; k++)
                if (!strcmp(v, algs[k][0]))
                    j->o.alg = algs[k][1];
            if (!j->o.alg)
                u = tk_cli_usage(USAGE,
                                 "--alg wants origin, maskgit_plus (topk), topk_margin (margin) or entropy, "
                                 "got '%s'",
                                 v);
        } else if (!strcmp(a, "--alg-temp")) {
            u = num(a, v, 0, 1e6, &d), j->o.alg_temp = d;
        } else if (!strcmp(a, "--top-p")) {
            u = num(a, v, 1e-9, 1, &d), j->o.top_p = d;
        } else if (!strcmp(a, "--top-k")) {
            u = integer(a, v, 0, INT32_MAX, &x), j->o.top_k = x;
        } else if (!strcmp(a, "--eps")) {
            u = num(a, v, 1e-9, 0.999999, &d), j->o.eps = d;
        } else if (!strcmp(a, "--t-min") || !strcmp(a, "--t-max")) {
            u = num(a, v, 0, 1e6, &d);
            *(a[5] == 'i' ? &j->o.t_min : &j->o.t_max) = d;
        } else if (!strcmp(a, "--entropy-bound")) {
            u = num(a, v, 1e-12, 1e6, &d), j->o.entropy_bound = d;
        } else if (!strcmp(a, "--confidence-threshold")) {
            u = num(a, v, 1e-12, 1e6, &d), j->o.confidence_threshold = d;
        } else if (!strcmp(a, "--stability-threshold")) {
            u = integer(a, v, 0, 4096, &x), j->o.stability_threshold = x;
        } else if (!strcmp(a, "--mask-token-id")) {
            u = integer(a, v, 0, INT32_MAX, &x), j->o.mask_token_id = x;
        } else if (!strcmp(a, "--seed")) {
            u = integer(a, v, 0, INT64_MAX, &x), j->o.seed = (uint64_t)x;
        } else if (!strcmp(a, "--draws")) {
            j->draws_path = v;
        } else if (!strcmp(a, "--dtype")) {
            j->dtype = v;
        } else if (!strcmp(a, "--device")) {
            j->device = v;
        } else if (a[0] == '-' && a[1]) {
            return tk_cli_usage(USAGE,
                                "unknown option '%s' for diffusion generation (see tk generate --diffusion "
                                "--help)",
                                a);
        } else if (!j->dir) {
            valued = 0;
            j->dir = a;
        } else {
            return tk_cli_usage(USAGE, "unexpected argument '%s' (the prompt goes after --prompt)", a);
        }
        if (u)
            return u;
        if (valued)
            i++;
    }
    if (!j->dir)
        return tk_cli_usage(USAGE, "a checkpoint directory, e.g. tk generate ./LLaDA-8B-Instruct --prompt 'Hi'");
    if (!j->text && !j->idlist)
        return tk_cli_usage(USAGE, "a prompt: --prompt TEXT or --ids ID,ID,...");
    return -1;
}

/* tk_diff_opts.rand over --draws FILE */
static int file_draws(void *user, double *u, size_t n)
{
    djob *j = user;
    unsigned char b[8];
    for (size_t i = 0; i < n; i++) {
        if (fread(b, 1, 8, j->draws) != 8) {
            j->draws_short = 1;
            return TK_ERR_INVALID;
        }
        uint64_t x = 0;
        for (int k = 7; k >= 0; k--)
            x = x << 8 | b[k];
        memcpy(&u[i], &x, sizeof x);
        j->draws_n++;
        if (!(u[i] >= 0.0 && u[i] < 1.0)) { /* NaN too */
            j->draws_bad = 1;
            j->bad_u = u[i];
            return TK_ERR_INVALID;
        }
    }
    return TK_OK;
}

/* the error for a failed run: the draws file's, or the run's own */
static int draws_error(tk_cli *cli, const djob *j, int rc)
{
    if (j->draws_short)
        return tk_cli_errorf(cli, TK_ERR_INVALID, TK_EXIT_USAGE,
                             "--draws %s ran out of draws\n"
                             "HINT: the file must hold every uniform the run asks for (docs/diffusion.md)",
                             j->draws_path);
    if (j->draws_bad)
        return tk_cli_errorf(cli, TK_ERR_INVALID, TK_EXIT_USAGE,
                             "--draws %s: draw %llu (byte offset %llu) is %g, outside [0, 1)\n"
                             "HINT: the file holds uniforms as little-endian float64, as torch.rand gives them "
                             "(docs/diffusion.md)",
                             j->draws_path, (unsigned long long)j->draws_n, (unsigned long long)(j->draws_n - 1) * 8,
                             j->bad_u);
    return tk_cli_fail(cli, rc, NULL);
}

/* the canvas from position `from` to `to` as text: runs of chosen tokens decoded, '_' per mask */
static void draw(FILE *f, const djob *j, const tk_diff_step *s, size_t from, size_t to)
{
    size_t i = from;
    while (i < to) {
        if (s->canvas[i] == s->mask_id) {
            fputc('_', f);
            i++;
            continue;
        }
        size_t e = i;
        while (e < to && s->canvas[e] != s->mask_id)
            e++;
        char *t = NULL;
        if (j->tok && tk_tokenizer_decode(&t, j->tok, s->canvas + i, e - i, 1) == TK_OK) {
            fputs(t, f);
        } else {
            for (size_t k = i; k < e; k++)
                fprintf(f, "%s%d", k > i ? "," : "[", (int)s->canvas[k]);
            fputc(']', f);
        }
        tk_free(t);
        i = e;
    }
}

static int on_step(void *user, const tk_diff_step *s)
{
    djob *j = user;
    if (j->show) {
        fprintf(stderr, "step %lld/%lld block %lld: ", (long long)s->step + 1, (long long)s->steps,
                (long long)s->block + 1);
        draw(stderr, j, s, s->prompt_len, s->len);
        fputc('\n', stderr);
    }
    if (!s->block_done || j->cli->json)
        return 0;
    /* the text up to the end of this block, printed from where the last block's ended */
    size_t end = s->prompt_len + (size_t)(s->block + 1) * ((s->len - s->prompt_len) / (size_t)s->blocks);
    if (j->tok) {
        char *t = NULL;
        if (tk_tokenizer_decode(&t, j->tok, s->canvas + s->prompt_len, end - s->prompt_len, 1) == TK_OK) {
            size_t len = strlen(t);
            /* a character whose bytes continue in the next block decodes as U+FFFD for now: held back */
            while (s->block + 1 < s->blocks && len >= 3 && !memcmp(t + len - 3, "\xef\xbf\xbd", 3))
                len -= 3;
            if (len > j->printed) {
                fwrite(t + j->printed, 1, len - j->printed, stdout);
                j->printed = len;
            }
        }
        tk_free(t);
    } else {
        size_t start = end - (s->len - s->prompt_len) / (size_t)s->blocks;
        for (size_t k = start; k < end; k++)
            printf("%s%d", k > s->prompt_len ? "," : "", (int)s->canvas[k]);
    }
    fflush(stdout);
    j->streamed = 1;
    return 0;
}

static int prompt_ids(djob *j, tk_cli *cli)
{
    int rc;
    if (j->idlist) {
        size_t cap = 16;
        j->ids = malloc(cap * sizeof *j->ids);
        const char *p = j->idlist;
        while (j->ids && *p) {
            char *end;
            errno = 0;
            long long x = strtoll(p, &end, 10);
            if (errno || end == p || x < 0 || x > INT32_MAX || (*end && *end != ','))
                return tk_cli_usage(USAGE, "--ids wants non-negative token ids separated by commas, got '%s'",
                                    j->idlist);
            if (j->n == cap) {
                int32_t *q = realloc(j->ids, (cap *= 2) * sizeof *q);
                if (!q)
                    break;
                j->ids = q;
            }
            j->ids[j->n++] = (int32_t)x;
            p = *end ? end + 1 : end;
        }
        return j->ids ? -1 : tk_cli_errorf(cli, TK_ERR_NOMEM, TK_EXIT_FAIL, "out of memory");
    }
    if (!j->tok)
        return tk_cli_fail(cli, TK_ERR_NOT_FOUND, "--prompt needs the checkpoint's tokenizer.json (or use --ids)");
    int32_t *ids = NULL;
    if ((rc = tk_tokenizer_encode(&ids, &j->n, j->tok, j->text, strlen(j->text), 1)) != TK_OK)
        return tk_cli_fail(cli, rc, NULL);
    j->ids = ids;
    return -1;
}

int tk_cmd_generate_diffusion(tk_cli *cli, int argc, char **argv)
{
    djob *j = calloc(1, sizeof *j);
    tk_diff_result *r = NULL;
    char *sj = NULL;
    int ec, rc, id;
    if (!j)
        return tk_cli_errorf(cli, TK_ERR_NOMEM, TK_EXIT_FAIL, "out of memory");
    j->o = (tk_diff_opts)TK_DIFF_OPTS_INIT;
    j->cli = cli;
    if ((ec = parse(j, cli, argc, argv)) != -1)
        goto done;
    tk_model_opts mo = TK_MODEL_OPTS_INIT;
    mo.dtype = j->dtype;
    if (tk_cli_parse_device(j->device, &id)) {
        ec = tk_cli_usage(USAGE, "--device wants cpu, cuda or cuda:N, got '%s'", j->device);
        goto done;
    }
    mo.device_type = id < 0 ? TK_DEV_CPU : TK_DEV_CUDA;
    mo.device_id = id < 0 ? 0 : id;
    tk_ctx *ctx = tk_cli_ctx(cli);
    if (!ctx) {
        ec = TK_EXIT_FAIL;
        goto done;
    }
    if ((rc = tk_model_load(&j->m, ctx, j->dir, &mo)) != TK_OK) {
        ec = tk_cli_fail(cli, rc, NULL);
        goto done;
    }
    if (tk_model_tokenizer(&j->tok, j->m) != TK_OK)
        j->tok = NULL; /* --ids works without one; the output is ids then */
    if ((ec = prompt_ids(j, cli)) != -1)
        goto done;
    if (j->draws_path && !(j->draws = fopen(j->draws_path, "rb"))) {
        ec = tk_cli_errorf(cli, TK_ERR_NOT_FOUND, TK_EXIT_NOT_FOUND, "--draws %s: %s", j->draws_path, strerror(errno));
        goto done;
    }
    if (j->draws) {
        j->o.rand = file_draws;
        j->o.rand_user = j;
    }
    j->o.on_step = on_step;
    j->o.step_user = j;
    if ((rc = tk_diffusion_generate(&r, j->m, j->ids, j->n, &j->o)) != TK_OK) {
        if (j->streamed)
            printf("\n");
        ec = draws_error(cli, j, rc);
        goto done;
    }
    if ((rc = tk_diff_result_json(&sj, r)) != TK_OK) {
        ec = tk_cli_fail(cli, rc, NULL);
        goto done;
    }
    size_t n = 0;
    const int32_t *ids = tk_diff_result_ids(r, &n);
    const char *text = tk_diff_result_text(r);
    if (cli->json) {
        printf("{\"ids\": [");
        for (size_t i = 0; i < n; i++)
            printf("%s%d", i ? ", " : "", (int)ids[i]);
        printf("], \"text\": ");
        if (text)
            tk_cli_json_str(stdout, text);
        else
            printf("null");
        printf(", \"end\": \"%s\", \"stats\": %s}\n",
               strstr(sj, "\"end\":\"callback\"") ? "callback"
               : strstr(sj, "\"end\":\"eos\"")    ? "eos"
                                                  : "length",
               sj);
    } else {
        printf("\n");
    }
    if (j->stats)
        fprintf(stderr, "%s\n", sj);
    ec = TK_EXIT_OK;
done:
    if (j->draws)
        fclose(j->draws);
    tk_free(sj);
    tk_diff_result_free(r);
    tk_free(j->ids);
    tk_model_free(j->m);
    free(j);
    return ec;
}
