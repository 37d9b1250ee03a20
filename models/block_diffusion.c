/*
 * block_diffusion.c — block diffusion generation (tk_diffusion_generate on DiffusionGemma), as
 * transformers 5.24's DiffusionGemmaGenerationMixin.generate runs it (docs/diffusion.md, "The
 * sampler"): autoregressive over blocks of C = canvas_length tokens, each denoised by up to N steps.
 *
 *   canvas  = C uniform tokens (floor(u V))
 *   n = N .. 1:  logits = model(prompt + finished blocks + canvas, self-conditioning on the last p)
 *                p = logits / t, t = t_min + (t_max - t_min) n / N   (f32, as transformers)
 *                sampled_i ~ softmax(p_i) (inverse CDF of one draw), argmax_i = argmax(p_i)
 *                H_i = entropy(softmax(p_i)); sorted ascending, accept while cumsum(H) - H <= bound
 *                canvas = accepted ? sampled : floor(u V)   (renoising)
 *                stop when argmax equals the last stability_threshold argmax canvases and the mean
 *                entropy is below confidence_threshold
 *   the block's tokens are the last argmax canvas; after a block holding eos, stop (pad after it)
 *
 * The sampler is step-wise, one bstate per sequence (tk_models_block_*), so a tk_diff_batch
 * (diffusion_lm.c) runs several sequences in lockstep: before a step each prepares its part
 * (tk_models__block_prepare: at a block's start, its starting canvas), ONE tk_models__dgemma_step runs
 * the model over every canvas, and each advances over its own logits with its own options, draws,
 * block, temperature schedule and early stop (tk_models__block_advance). tk_diffusion_generate is a
 * batch of one.
 *
 * The encoder's keys and values are cached per sequence as transformers caches them
 * (tk_models__dgemma_kv_*): the prompt encoded once, in the first step's forward, and each finished
 * block in the first step of the next; the other steps run only the decoder over the canvas against
 * that cache. TK_DGEMMA_CACHE=0 in the environment runs the old check path: each step encodes the whole
 * prefix again (the same numbers to rounding). The sampler's arithmetic is on the host in float64 over
 * the f32 logits.
 */
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/models.h"

typedef struct {
    tk_models_dseq h;       /* first: what the batch keeps (id, result, status) */
    tk_model *m;
    tk_diff_opts oc;        /* the options, copied */
    const tk_diff_opts *o;  /* &oc */
    int64_t V, C, N, P, nb, stab, pad;
    double t_min, t_max, bound, conf;
    int64_t eos[8];
    int neos;
    int32_t *ids;           /* prompt + blocks + the canvas */
    int32_t *canvas, *amax; /* [C] */
    int32_t *hist;          /* [stab, C]: the last argmax canvases (-1: none yet) */
    int32_t *sampled;       /* [C]: the step's sampled tokens */
    unsigned char *mask;    /* [C]: the step's accepted positions */
    float *logits, *p;      /* [C, V]: the step's logits, its processed logits (the next self-conditioning) */
    double *ent, *u, *w;    /* [C], [C], [V] */
    int64_t *order, *acc;   /* [C] */
    uint64_t rng;
    tk_models_dgemma_kv *kv; /* the encoder's keys and values */
    int64_t encoded;         /* the ids in kv */
    int recompute;           /* TK_DGEMMA_CACHE=0: every step encodes the whole prefix again */
    int64_t b, n;            /* the block, and its steps left (N .. 1; 0: the block is yet to start) */
} bstate;

/* generation_config.json's number `key` (sampler_config.entropy_bound for "entropy_bound"), or def */
static double gen_num(const json_t *g, const char *key, double def)
{
    const json_t *v = json_object_get(g, key);
    if (!v && !strcmp(key, "entropy_bound"))
        v = json_object_get(json_object_get(g, "sampler_config"), "entropy_bound");
    return json_is_number(v) ? json_number_value(v) : def;
}

/* the options, each from o (version 2, >= 0), generation_config.json, or transformers' default */
static void settings(bstate *s, const json_t *g)
{
    const tk_diff_opts *o = s->o;
    int v2 = o->version >= 2;
    s->N = o->steps > 0 ? o->steps : (int64_t)gen_num(g, "max_denoising_steps", 48);
    s->t_min = v2 && o->t_min >= 0 ? o->t_min : gen_num(g, "t_min", 0.4);
    s->t_max = v2 && o->t_max >= 0 ? o->t_max : gen_num(g, "t_max", 0.8);
    s->bound = v2 && o->entropy_bound >= 0 ? o->entropy_bound : gen_num(g, "entropy_bound", 0.1);
    s->conf = v2 && o->confidence_threshold >= 0 ? o->confidence_threshold : gen_num(g, "confidence_threshold", 0.005);
    s->stab =
        v2 && o->stability_threshold >= 0 ? o->stability_threshold : (int64_t)gen_num(g, "stability_threshold", 1);
    s->pad = (int64_t)gen_num(g, "pad_token_id", -1);
    const json_t *e = json_object_get(g, "eos_token_id");
    if (json_is_integer(e))
        s->eos[s->neos++] = json_integer_value(e);
    for (size_t i = 0; json_is_array(e) && i < json_array_size(e) && s->neos < 8; i++)
        if (json_is_integer(json_array_get(e, i)))
            s->eos[s->neos++] = json_integer_value(json_array_get(e, i));
}

static int check(bstate *s, const int32_t *prompt, size_t len)
{
    const tk_diff_opts *o = s->o;
    const tk_models_config *c = &s->m->cfg;
    if (o->version < 1 || o->version > TK_DIFF_OPTS_VERSION)
        return tk__err(TK_ERR_INVALID, "tk_diff_opts.version is %u; this tk knows 1..%d", o->version,
                       TK_DIFF_OPTS_VERSION);
    if (o->sampler != TK_DIFF_AUTO && o->sampler != TK_DIFF_BLOCK)
        return tk__err(TK_ERR_INVALID,
                       "%s is a block diffusion checkpoint; the LLaDA and Dream samplers need a "
                       "masked diffusion LM\nHINT: leave --sampler out",
                       c->arch);
    if (o->cfg_scale != 0 || o->remasking || (o->alg && strcmp(o->alg, "origin")) || o->block_length > 0 ||
        o->temperature != 0 || o->top_p != 1.0 || o->top_k != 0 || o->alg_temp != 0)
        return tk__err(TK_ERR_INVALID,
                       "temperature, top_p, top_k, alg_temp, cfg_scale, remasking, alg and block_length are the "
                       "masked samplers'; block diffusion's blocks are the checkpoint's canvas_length (%lld) "
                       "and its temperature falls from t_max to t_min over a block's steps\nHINT: leave them "
                       "out; --t-min, --t-max, --entropy-bound, --stability-threshold and --confidence-threshold "
                       "tune it",
                       (long long)c->canvas);
    if (len == 0)
        return tk__err(TK_ERR_INVALID, "the prompt is empty\nHINT: block diffusion continues a prompt of at "
                                       "least one token");
    for (size_t i = 0; i < len; i++)
        if (prompt[i] < 0 || prompt[i] >= s->V)
            return tk__err(TK_ERR_INVALID, "prompt id %d (at %zu) is outside the vocabulary [0, %lld)", (int)prompt[i],
                           i, (long long)s->V);
    if (o->gen_length <= 0)
        return tk__err(TK_ERR_INVALID, "gen_length is %lld; it must be > 0", (long long)o->gen_length);
    if (s->N <= 0 || s->N > (1 << 24))
        return tk__err(TK_ERR_INVALID,
                       "steps (max_denoising_steps) is %lld; want 1..2^24\nHINT: --steps N sets "
                       "the denoising steps per block",
                       (long long)s->N);
    if (!(s->t_min >= 0) || !(s->t_max > s->t_min) || !isfinite(s->t_max) || !(s->bound > 0) || !isfinite(s->bound) ||
        !(s->conf > 0) || s->stab < 0 || s->stab > 4096)
        return tk__err(TK_ERR_INVALID,
                       "t_min %g, t_max %g, entropy_bound %g, confidence_threshold %g, "
                       "stability_threshold %lld: want 0 <= t_min < t_max, entropy_bound > 0, confidence_threshold "
                       "> 0, stability_threshold in 0..4096 (transformers' rules)",
                       s->t_min, s->t_max, s->bound, s->conf, (long long)s->stab);
    s->P = (int64_t)len;
    s->nb = (o->gen_length + s->C - 1) / s->C;
    if (s->P + s->nb * s->C > c->max_pos)
        return tk__err(TK_ERR_INVALID,
                       "the prompt (%lld tokens) plus %lld blocks of canvas_length %lld is %lld "
                       "tokens, longer than the model's context of %lld\nHINT: a smaller --gen-length",
                       (long long)s->P, (long long)s->nb, (long long)s->C, (long long)(s->P + s->nb * s->C),
                       (long long)c->max_pos);
    return TK_OK;
}

/* the canvas positions not accepted (all: accepted NULL) get fresh uniform tokens */
static int renoise(bstate *s, const unsigned char *accepted)
{
    int rc = tk_models__diff_draws(s->o, &s->rng, s->u, (size_t)s->C);
    for (int64_t i = 0; rc == TK_OK && i < s->C; i++)
        if (!accepted || !accepted[i]) {
            int64_t t = (int64_t)floor(s->u[i] * (double)s->V);
            s->canvas[i] = (int32_t)(t < s->V ? t : s->V - 1);
        }
    return rc;
}

/* row i of p: its entropy (s->ent), argmax, and the token the draw u picks by the inverse CDF */
static void row_stats(bstate *s, int64_t i, double u, int32_t *sampled)
{
    const float *p = s->p + i * s->V;
    double mx = -INFINITY, sum = 0, h = 0;
    int64_t am = 0;
    for (int64_t v = 0; v < s->V; v++)
        if (p[v] > mx) {
            mx = p[v];
            am = v;
        }
    for (int64_t v = 0; v < s->V; v++)
        sum += (s->w[v] = exp((double)p[v] - mx));
    double lse = mx + log(sum), cum = 0, target = u * sum;
    int64_t pick = -1;
    for (int64_t v = 0; v < s->V; v++) {
        double q = s->w[v] / sum;
        if (q > 0)
            h -= q * ((double)p[v] - lse);
        cum += s->w[v];
        if (pick < 0 && cum > target && s->w[v] > 0)
            pick = v;
    }
    for (int64_t v = s->V - 1; pick < 0 && v >= 0; v--) /* u at the top: the last possible token */
        if (s->w[v] > 0)
            pick = v;
    s->ent[i] = h;
    s->amax[i] = (int32_t)am;
    *sampled = (int32_t)pick;
}

static _Thread_local const double *g_ent;
static int by_entropy(const void *a, const void *b)
{
    int64_t i = *(const int64_t *)a, j = *(const int64_t *)b;
    if (g_ent[i] != g_ent[j])
        return g_ent[i] < g_ent[j] ? -1 : 1;
    return i < j ? -1 : i > j;
}

/* the lowest-entropy positions while cumsum(H) - H <= bound into acc[0..*n) and the mask */
static void accept(bstate *s, unsigned char *mask, size_t *n)
{
    for (int64_t i = 0; i < s->C; i++)
        s->order[i] = i;
    g_ent = s->ent;
    qsort(s->order, (size_t)s->C, sizeof *s->order, by_entropy);
    double cum = 0;
    *n = 0;
    memset(mask, 0, (size_t)s->C);
    for (int64_t k = 0; k < s->C; k++) {
        double e = s->ent[s->order[k]];
        cum += e;
        if (cum - e <= s->bound) {
            mask[s->order[k]] = 1;
            s->acc[(*n)++] = s->order[k];
        }
    }
}

/* stable (the argmax canvas equals the last stab ones) and confident (mean entropy below conf) */
static int stop_rule(bstate *s, double mean)
{
    size_t cb = (size_t)s->C * sizeof *s->amax;
    int stable = 1;
    for (int64_t k = 0; k < s->stab; k++)
        stable &= !memcmp(s->hist + k * s->C, s->amax, cb);
    if (s->stab > 0) {
        memmove(s->hist, s->hist + s->C, (size_t)(s->stab - 1) * cb);
        memcpy(s->hist + (s->stab - 1) * s->C, s->amax, cb);
    }
    return stable && mean < s->conf;
}

static int by_pos(const void *a, const void *b)
{
    int64_t i = *(const int64_t *)a, j = *(const int64_t *)b;
    return i < j ? -1 : i > j;
}

/* per_step's entry: {"step", "block", "remaining", "accepted": [canvas positions], "mean_entropy", "stop"} */
static int record(bstate *s, int64_t block, int64_t n, size_t nacc, double mean, int stop)
{
    memcpy(s->order, s->acc, nacc * sizeof *s->order);
    qsort(s->order, nacc, sizeof *s->order, by_pos);
    json_t *a = json_array(), *st = NULL;
    for (size_t k = 0; a && k < nacc; k++)
        if (json_array_append_new(a, json_integer(s->order[k]))) {
            json_decref(a);
            a = NULL;
        }
    if (a)
        st =
            json_pack("{s:I, s:I, s:I, s:o, s:f, s:b}", "step", (json_int_t)json_array_size(s->h.r->steps), "block",
                      (json_int_t)block, "remaining", (json_int_t)n, "accepted", a, "mean_entropy", mean, "stop", stop);
    if (!st || json_array_append_new(s->h.r->steps, st))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    return TK_OK;
}

/* tk_diff_opts.on_step: prompt + the finished blocks + this block's argmax draft (later blocks -1);
 * done: the block's tokens are final (in s->ids) */
static int report(bstate *s, int64_t block, const unsigned char *mask, size_t nacc, int done)
{
    if (!s->o->on_step)
        return 0;
    size_t L = (size_t)(s->P + s->nb * s->C), off = (size_t)(s->P + block * s->C);
    int32_t *view = malloc(L * sizeof *view);
    int64_t *pos = malloc((size_t)s->C * sizeof *pos);
    if (!view || !pos) {
        free(view);
        free(pos);
        return 0;
    }
    memcpy(view, s->ids, off * sizeof *view);
    memcpy(view + off, done ? s->ids + off : s->amax, (size_t)s->C * sizeof *view);
    for (size_t i = off + (size_t)s->C; i < L; i++)
        view[i] = -1;
    size_t k = 0;
    for (int64_t i = 0; mask && i < s->C; i++)
        if (mask[i])
            pos[k++] = (int64_t)off + i;
    tk_diff_step st = {(int64_t)json_array_size(s->h.r->steps) - 1,
                       s->nb * s->N,
                       block,
                       s->nb,
                       view,
                       L,
                       (size_t)s->P,
                       -1,
                       pos,
                       nacc,
                       done};
    int stop = s->o->on_step(s->o->step_user, &st);
    free(view);
    free(pos);
    return stop;
}

/* the first eos of block b: the tokens after it become pad (when there is one); 1 when found */
static int eos_in(bstate *s, int64_t b)
{
    int32_t *blk = s->ids + s->P + b * s->C;
    for (int64_t i = 0; i < s->C; i++)
        for (int e = 0; e < s->neos; e++)
            if (blk[i] == s->eos[e]) {
                for (int64_t k = i + 1; s->pad >= 0 && k < s->C; k++)
                    blk[k] = (int32_t)s->pad;
                return 1;
            }
    return 0;
}

/* The sampler over denoising step n of block b (its logits in s->logits); *stop: 1 the block ends after
 * it, 2 the sequence ends (an eos, or the callback) */
static int step(bstate *s, int64_t b, int64_t n, int *stop)
{
    size_t CV = (size_t)(s->C * s->V), nacc = 0;
    s->h.r->forwards++;
    /* the temperature as transformers computes it: an int32 tensor over N, then f32 arithmetic */
    float q = (float)n / (float)s->N, t = (float)s->t_min + (float)(s->t_max - s->t_min) * q;
    for (size_t i = 0; i < CV; i++)
        s->p[i] = s->logits[i] / t;
    int rc = tk_models__diff_draws(s->o, &s->rng, s->u, (size_t)s->C);
    if (rc != TK_OK)
        return rc;
    double mean = 0;
    for (int64_t i = 0; i < s->C; i++) {
        row_stats(s, i, s->u[i], &s->sampled[i]);
        mean += s->ent[i];
    }
    mean /= (double)s->C;
    accept(s, s->mask, &nacc);
    for (int64_t i = 0; i < s->C; i++)
        if (s->mask[i])
            s->canvas[i] = s->sampled[i];
    if ((rc = renoise(s, s->mask)) != TK_OK)
        return rc;
    *stop = stop_rule(s, mean);
    if ((rc = record(s, b, n, nacc, mean, *stop)) != TK_OK)
        return rc;
    int last = *stop || n == 1, eos = 0;
    if (last) { /* the block's tokens: the argmax canvas, pad after an eos */
        memcpy(s->ids + s->P + b * s->C, s->amax, (size_t)s->C * sizeof *s->ids);
        eos = eos_in(s, b);
    }
    if (report(s, b, s->mask, nacc, last)) {
        s->h.r->end = "callback";
        *stop = 2;
    } else if (eos) {
        s->h.r->end = "eos";
        *stop = 2;
    }
    return TK_OK;
}

int tk_models__block_prepare(tk_models_dseq *h, tk_models_dgemma_seq *step)
{
    bstate *s = (bstate *)h;
    if (s->n == 0) { /* the block starts: uniform tokens, no argmax canvas seen yet */
        int rc = renoise(s, NULL);
        if (rc != TK_OK)
            return rc;
        for (int64_t k = 0; k < s->stab * s->C; k++)
            s->hist[k] = -1;
        s->n = s->N;
    }
    if (s->recompute) {
        tk_models__dgemma_kv_rewind(s->kv, 0);
        s->encoded = 0;
    }
    /* the prompt (at the first block) or the block just finished goes into the cache in this step's
     * forward, as transformers encodes it at the start of the next block; the canvas follows it */
    int64_t upto = s->P + s->b * s->C;
    memcpy(s->ids + upto, s->canvas, (size_t)s->C * sizeof *s->ids);
    *step = (tk_models_dgemma_seq){s->kv, s->ids + s->encoded, (size_t)(upto - s->encoded + s->C),
                                   s->n == s->N ? NULL : s->p, s->logits};
    if (!s->h.t0)
        s->h.t0 = tk__now_ms();
    return TK_OK;
}

int tk_models__block_advance(tk_models_dseq *h, int *ended)
{
    bstate *s = (bstate *)h;
    int stop = 0;
    *ended = 0;
    s->encoded = s->P + s->b * s->C; /* the step's forward encoded them */
    double t0 = tk__now_ms();
    int rc = step(s, s->b, s->n, &stop);
    s->h.r->sampler_ms += tk__now_ms() - t0;
    if (rc != TK_OK)
        return rc;
    if (stop || --s->n == 0) { /* the block is done */
        s->h.r->blocks = s->b + 1;
        s->h.r->gen_length = (s->b + 1) * s->C;
        s->b++;
        s->n = 0;
        *ended = stop == 2 || s->b == s->nb;
    }
    return TK_OK;
}

void tk_models__block_free(tk_models_dseq *h)
{
    bstate *s = (bstate *)h;
    if (!s)
        return;
    tk_diff_result_free(s->h.r);
    tk_models__dgemma_kv_free(s->m, s->kv);
    free(s->ids);
    free(s->canvas);
    free(s->amax);
    free(s->hist);
    free(s->sampled);
    free(s->mask);
    free(s->logits);
    free(s->p);
    free(s->ent);
    free(s->u);
    free(s->w);
    free(s->order);
    free(s->acc);
    free(s);
}

int tk_models__block_finish(tk_models_dseq *h)
{
    bstate *s = (bstate *)h;
    tk_diff_result *r = s->h.r;
    r->ms = tk__now_ms() - s->h.t0;
    r->n = (size_t)r->gen_length;
    if (!(r->ids = malloc((r->n ? r->n : 1) * sizeof *r->ids)))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    memcpy(r->ids, s->ids + s->P, r->n * sizeof *r->ids);
    const tk_tokenizer *tok = NULL;
    if (tk_model_tokenizer(&tok, s->m) == TK_OK && tk_tokenizer_decode(&r->text, tok, r->ids, r->n, 1) != TK_OK)
        r->text = NULL;
    tk__err_clear();
    return TK_OK;
}

/* The sequence's buffers, its cache (the prompt, every block and one canvas) and its result's fields */
static int balloc(bstate *s)
{
    size_t C = (size_t)s->C, V = (size_t)s->V, L = (size_t)(s->P + s->nb * s->C);
    if (C * V > SIZE_MAX / sizeof(float) / 4)
        return tk__err(TK_ERR_NOMEM, "the canvas's logits (%zu x %zu) do not fit in memory", C, V);
    s->h.r = calloc(1, sizeof *s->h.r);
    s->ids = malloc(L * sizeof *s->ids);
    s->canvas = malloc(C * sizeof *s->canvas);
    s->amax = malloc(C * sizeof *s->amax);
    s->hist = malloc(((size_t)s->stab * C + 1) * sizeof *s->hist);
    s->sampled = malloc(C * sizeof *s->sampled);
    s->mask = malloc(C);
    s->logits = malloc(C * V * sizeof *s->logits);
    s->p = malloc(C * V * sizeof *s->p);
    s->ent = malloc(C * sizeof *s->ent);
    s->u = malloc(C * sizeof *s->u);
    s->w = malloc(V * sizeof *s->w);
    s->order = malloc(C * sizeof *s->order);
    s->acc = malloc(C * sizeof *s->acc);
    if (!s->h.r || !s->ids || !s->canvas || !s->amax || !s->hist || !s->sampled || !s->mask || !s->logits || !s->p ||
        !s->ent || !s->u || !s->w || !s->order || !s->acc || !(s->h.r->steps = json_array()))
        return tk__err(TK_ERR_NOMEM, "out of memory for a canvas of %zu positions x %zu logits", C, V);
    const char *env = getenv("TK_DGEMMA_CACHE"); /* 0: the old path, every step over the whole sequence */
    s->recompute = env && !strcmp(env, "0");
    int rc = tk_models__dgemma_kv_new(&s->kv, s->m, (int64_t)L);
    if (rc != TK_OK)
        return rc;
    tk_diff_result *r = s->h.r;
    r->sampler = "block";
    r->alg = "entropy_bound";
    r->end = "length";
    r->block_length = s->C;
    r->nsteps = s->N;
    r->mask_id = -1;
    return TK_OK;
}

int tk_models__block_new(tk_models_dseq **out, tk_model *m, const int32_t *prompt, size_t len, const tk_diff_opts *o)
{
    *out = NULL;
    if (o->version < 1 || o->version > TK_DIFF_OPTS_VERSION)
        return tk__err(TK_ERR_INVALID, "tk_diff_opts.version is %u; this tk knows 1..%d", o->version,
                       TK_DIFF_OPTS_VERSION);
    bstate *s = calloc(1, sizeof *s);
    if (!s)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    *s = (bstate){.m = m, .oc = TK_DIFF_OPTS_INIT, .V = m->cfg.vocab, .C = m->cfg.canvas, .pad = -1};
    /* version 1 options end before t_min (the fields below keep their defaults) */
    memcpy(&s->oc, o, o->version >= 2 ? sizeof *o : offsetof(tk_diff_opts, t_min));
    s->o = &s->oc;
    json_t *g = m->cfg.generation_json ? json_loads(m->cfg.generation_json, 0, NULL) : NULL;
    settings(s, g);
    json_decref(g);
    int rc = check(s, prompt, len);
    if (rc == TK_OK)
        rc = balloc(s);
    if (rc != TK_OK) {
        tk_models__block_free(&s->h);
        return rc;
    }
    memcpy(s->ids, prompt, len * sizeof *s->ids);
    s->rng = s->o->seed;
    *out = &s->h;
    return TK_OK;
}
