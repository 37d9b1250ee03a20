/*
 * diffusion_lm.c — masked diffusion generation (tk_diffusion_generate): LLaDA's and Dream's samplers
 * over any model of the table whose attention runs bidirectionally (llada.c, dream.c, or a Llama-family
 * checkpoint with tk_diff_opts.bidirectional). Each step is one tk_model_forward over the whole canvas
 * (prompt + gen_length positions, the masked ones holding mask_id), so the network runs through the op
 * registry as any forward does (the `attention` op with causal 0) and a GPU serves it with its kernels.
 *
 * LLaDA (ML-GSAI/LLaDA generate.py), per block b of block_length positions, steps / blocks steps:
 *   k_i     = the block's masked count split evenly over the steps, the remainder to the first ones
 *   logits  = model(x); with cfg_scale: u = model(x with the prompt masked),
 *             logits = u + (cfg_scale + 1) (logits - u)
 *   x0      = argmax(exp(logits) / (-log U)^temperature) in float64 (U uniform [L, V]; temperature 0:
 *             argmax(logits))
 *   conf    = softmax(logits)[x0] in float64 (low_confidence) or a uniform draw [L] (random);
 *             -inf past the current block and where x is not masked
 *   x[topk(conf, k_i)] = x0 there
 * Dream (HKUNLP/Dream generation_utils.py), one canvas, steps steps over t = linspace(1, eps, steps + 1)
 * in float32, with logits[i] taken from the model's row i - 1 (row 0 keeps its own):
 *   origin:  each masked position is revealed with probability 1 - s/t (1 at the last step), its token
 *            sampled from its row (argmax at temperature 0)
 *   else:    conf, x0 = the row's top probability (maskgit_plus), top-1 minus top-2 (topk_margin) or
 *            the negative entropy (entropy); k = int(masked * (1 - s/t)) (all at the last step);
 *            the k most confident (alg_temp 0) or k drawn from softmax(conf / alg_temp) are revealed
 * The uniform draws come from o->rand (a test feeds both sides the same ones) or tk's splitmix64, in
 * the order docs/diffusion.md gives.
 *
 * The sampler is step-wise (prepare before a forward, advance after it), one dstate per sequence, so a
 * tk_diff_batch runs several sequences in lockstep: each step packs every canvas (and each cfg
 * sequence's unconditional one) into ONE tk_model_forward, then advances each sequence over its own
 * rows with its own options and draws. tk_diffusion_generate is a batch of one. A batch over a block
 * diffusion checkpoint (DiffusionGemma) holds block_diffusion.c's sequences instead and steps them
 * through tk_models__dgemma_step; both kinds begin with a tk_models_dseq, the part the batch keeps.
 */
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/models.h"

/* One sequence's sampler: its options (copied), canvas, work space and result. */
typedef struct {
    tk_models_dseq h;         /* first: what the batch keeps (id, result, status) */
    tk_model *m;
    const tk_diff_opts *o;    /* &oc */
    tk_diff_opts oc;
    int sampler, alg;         /* TK_DIFF_LLADA or _DREAM; Dream's alg (0 origin .. 3 entropy) */
    int64_t V, L, P, G, B, nb, steps, mask;
    int64_t step;             /* the next step */
    int64_t base, rem;        /* LLaDA: the current block's tokens a step, and the first steps' extra one */
    size_t nseq;              /* the sequences it puts in a forward: 1, or 2 with cfg (x, then un) */
    int32_t *x, *x0, *un;     /* canvas, proposed tokens, the unconditional canvas (cfg) */
    const float *logits;      /* this step's rows in the batch's forward: [nseq * L, V] */
    float *row;               /* one row of guided logits */
    double *conf, *u, *w;     /* [L] confidences; draws; a row's work space [V] */
    int64_t *sel, *order;     /* [L] (order: [max(L, V)]) */
    int64_t *vord;            /* Dream's top_p / top_k sort of a row [V] */
    uint64_t rng;
} dstate;

static int draws(dstate *s, double *u, size_t n) { return tk_models__diff_draws(s->o, &s->rng, u, n); }

int tk_models__diff_draws(const tk_diff_opts *o, uint64_t *rng, double *u, size_t n)
{
    if (o->rand) {
        int rc = o->rand(o->rand_user, u, n);
        return rc == TK_OK ? TK_OK : tk__err_wrap(rc, "tk_diff_opts.rand");
    }
    for (size_t i = 0; i < n; i++) { /* splitmix64, 53 bits */
        uint64_t z = (*rng += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        u[i] = (double)(z >> 11) * 0x1.0p-53;
    }
    return TK_OK;
}

/* descending confidence, then the lower position (torch.topk's order on ties is unspecified) */
static _Thread_local const double *g_conf; /* qsort has no user pointer */
static int by_conf(const void *a, const void *b)
{
    int64_t i = *(const int64_t *)a, j = *(const int64_t *)b;
    if (g_conf[i] != g_conf[j])
        return g_conf[i] > g_conf[j] ? -1 : 1;
    return i < j ? -1 : i > j;
}

/* sel[0..k) = the k positions of the highest conf (finite ones only) */
static size_t topk(dstate *s, int64_t k)
{
    size_t n = 0;
    for (int64_t i = 0; i < s->L; i++)
        if (s->conf[i] > -INFINITY)
            s->order[n++] = i;
    g_conf = s->conf;
    qsort(s->order, n, sizeof *s->order, by_conf);
    if ((size_t)k < n)
        n = (size_t)k;
    memcpy(s->sel, s->order, n * sizeof *s->sel);
    return n;
}

/* Before a step's forward: at a LLaDA block's start, the block's masked count split over its steps;
 * with cfg, the unconditional canvas (un follows x in one allocation: two sequences of the forward). */
static void prepare(dstate *s)
{
    int64_t spb = s->steps / s->nb; /* Dream: one block of all the steps */
    if (s->step % spb == 0) {
        int64_t lo = s->P + s->step / spb * s->B, nmask = 0;
        for (int64_t i = lo; i < lo + s->B; i++)
            nmask += s->x[i] == s->mask;
        s->base = nmask / spb;
        s->rem = nmask % spb;
    }
    if (s->nseq == 2) {
        memcpy(s->un, s->x, (size_t)s->L * sizeof *s->un);
        for (int64_t i = 0; i < s->P; i++) /* LLaDA: un_x[prompt_index] = mask_id */
            s->un[i] = (int32_t)s->mask;
    }
}

/* Row r of the logits the sampler uses: guided (cfg), shifted (Dream) or as computed. */
static const float *row(dstate *s, int64_t r, int cfg, int shift)
{
    if (shift && r > 0)
        r -= 1;
    const float *c = s->logits + (size_t)r * (size_t)s->V;
    if (!cfg)
        return c;
    const float *u = s->logits + (size_t)(s->L + r) * (size_t)s->V;
    float g = (float)(s->o->cfg_scale + 1.0);
    for (int64_t v = 0; v < s->V; v++)
        s->row[v] = u[v] + g * (c[v] - u[v]);
    return s->row;
}

static int argmax_f(const float *l, int64_t V)
{
    int64_t best = 0;
    for (int64_t v = 1; v < V; v++)
        if (l[v] > l[best])
            best = v;
    return (int)best;
}

/* softmax(l)[t] in float64 */
static double prob_of(const float *l, int64_t V, int64_t t)
{
    double mx = l[argmax_f(l, V)], sum = 0;
    for (int64_t v = 0; v < V; v++)
        sum += exp((double)l[v] - mx);
    return exp((double)l[t] - mx) / sum;
}

static int record(dstate *s, int64_t step, int64_t block, size_t n)
{
    json_t *pos = json_array(), *o = json_object();
    int bad = !pos || !o;
    for (size_t i = 0; !bad && i < n; i++)
        bad = json_array_append_new(pos, json_integer(s->sel[i]));
    if (!bad)
        bad = json_object_set_new(o, "step", json_integer(step)) ||
              json_object_set_new(o, "block", json_integer(block)) ||
              json_object_set_new(o, "count", json_integer((json_int_t)n)) || json_object_set_new(o, "unmasked", pos) ||
              json_array_append_new(s->h.r->steps, o);
    else
        json_decref(pos), json_decref(o);
    if (bad)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    return TK_OK;
}

/* Reports the step; 1 when the callback asks to stop. */
static int report(dstate *s, int64_t step, int64_t block, size_t n, int done)
{
    if (!s->o->on_step)
        return 0;
    tk_diff_step st = {step,         s->steps,         block,  s->nb, s->x, (size_t)s->L,
                       (size_t)s->P, (int32_t)s->mask, s->sel, n,     done};
    return s->o->on_step(s->o->step_user, &st) != 0;
}

/* LLaDA's proposal at canvas row r: x0[r], and conf[r] (low_confidence) */
static void llada_pick(dstate *s, int64_t r, int cfg)
{
    const tk_diff_opts *o = s->o;
    int64_t V = s->V, best = 0;
    const float *l = row(s, r, cfg, 0);
    if (o->temperature > 0) { /* Gumbel-max: exp(l) / (-log u)^T, float64 */
        const double *u = s->u + (size_t)r * (size_t)V;
        double bv = -1;
        for (int64_t v = 0; v < V; v++) {
            double g = exp((double)l[v]) / pow(-log(u[v]), o->temperature);
            if (g > bv || v == 0)
                bv = g, best = v;
        }
    } else {
        best = argmax_f(l, V);
    }
    s->x0[r] = (int32_t)best;
    if (!o->remasking)
        s->conf[r] = prob_of(l, V, best);
}

/* One LLaDA step over this step's logits: the k most confident masked positions of the current block
 * take their proposals (*n of them, in s->sel). */
static int llada_step(dstate *s, size_t *n)
{
    const tk_diff_opts *o = s->o;
    int cfg = o->cfg_scale > 0, rc;
    int64_t spb = s->steps / s->nb, L = s->L, i = s->step % spb, hi = s->P + (s->step / spb + 1) * s->B;
    if (o->temperature > 0 && (rc = draws(s, s->u, (size_t)(L * s->V))) != TK_OK)
        return rc;
    for (int64_t r = 0; r < L; r++) {
        s->conf[r] = -INFINITY;
        if (s->x[r] == s->mask && r < hi) /* x0 elsewhere is never used */
            llada_pick(s, r, cfg);
    }
    if (o->remasking) { /* random: a uniform per position (torch.rand((1, L))) */
        if ((rc = draws(s, s->u, (size_t)L)) != TK_OK)
            return rc;
        for (int64_t r = 0; r < L; r++)
            if (s->conf[r] == -INFINITY && s->x[r] == s->mask && r < hi)
                s->conf[r] = s->u[r];
    }
    *n = topk(s, s->base + (i < s->rem));
    for (size_t j = 0; j < *n; j++)
        s->x[s->sel[j]] = s->x0[s->sel[j]];
    return TK_OK;
}

/* Dream's sample_tokens for one row: x0 and its confidence (alg: 1 maskgit_plus, 2 topk_margin,
 * 3 entropy). The row is filtered (top_p, top_k) and tempered as Dream does, then softmaxed in float64. */
static int dream_token(dstate *s, const float *l, int alg, int32_t *x0, double *conf)
{
    const tk_diff_opts *o = s->o;
    int64_t V = s->V;
    double *p = s->w, T = o->temperature > 0 ? o->temperature : 1.0;
    const double lowest = -3.4028234663852886e38; /* torch.finfo(float32).min */
    for (int64_t v = 0; v < V; v++)
        p[v] = (double)l[v] / T;
    if (o->top_p > 0 && o->top_p < 1) { /* drop the tail past top_p, always keeping the first */
        g_conf = p;
        for (int64_t v = 0; v < V; v++)
            s->vord[v] = v;
        qsort(s->vord, (size_t)V, sizeof *s->vord, by_conf);
        double mx = p[s->vord[0]], z = 0, c = 0;
        for (int64_t v = 0; v < V; v++)
            z += exp(p[v] - mx);
        int drop = 0;
        for (int64_t j = 0; j < V; j++) {
            int64_t v = s->vord[j];
            double pv = exp(p[v] - mx) / z;
            if (drop)
                p[v] = lowest;
            c += pv;
            drop = drop || c > o->top_p;
        }
    }
    if (o->top_k > 0 && o->top_k < V) { /* logits below the k-th largest are dropped */
        g_conf = p;
        for (int64_t v = 0; v < V; v++)
            s->vord[v] = v;
        qsort(s->vord, (size_t)V, sizeof *s->vord, by_conf);
        double kth = p[s->vord[o->top_k - 1]];
        for (int64_t v = 0; v < V; v++)
            if (p[v] < kth)
                p[v] = lowest;
    }
    double mx = p[0], z = 0;
    for (int64_t v = 1; v < V; v++)
        mx = p[v] > mx ? p[v] : mx;
    for (int64_t v = 0; v < V; v++)
        z += (p[v] = exp(p[v] - mx));
    int64_t best = 0, second = -1;
    for (int64_t v = 0; v < V; v++) {
        p[v] /= z;
        if (p[v] > p[best])
            best = v;
    }
    if (o->temperature > 0) { /* categorical draw, by the inverse CDF of one uniform */
        double u, c = 0;
        int rc = draws(s, &u, 1);
        if (rc != TK_OK)
            return rc;
        int64_t v = 0;
        for (; v < V - 1; v++)
            if ((c += p[v]) > u)
                break;
        best = v;
    }
    *x0 = (int32_t)best;
    *conf = p[best];
    if (alg == 2) {
        int64_t top = 0;
        for (int64_t v = 1; v < V; v++)
            top = p[v] > p[top] ? v : top;
        for (int64_t v = 0; v < V; v++)
            if (v != top && (second < 0 || p[v] > p[second]))
                second = v;
        *conf = p[top] - (second >= 0 ? p[second] : 0);
    } else if (alg == 3) {
        double e = 0;
        for (int64_t v = 0; v < V; v++)
            e += p[v] * log(p[v] + 1e-10);
        *conf = e;
    }
    return TK_OK;
}

/* Dream's origin: each of the nm masked positions (s->order) is revealed with probability frac (all
 * at the last step), its token sampled from its row. */
static int dream_origin(dstate *s, size_t nm, float frac, int last, size_t *n)
{
    int rc;
    if ((rc = draws(s, s->u, nm)) != TK_OK)
        return rc;
    for (size_t j = 0; j < nm; j++) {
        int64_t r = s->order[j];
        if (!(last || s->u[j] < (double)frac))
            continue;
        double c;
        if ((rc = dream_token(s, row(s, r, 0, 1), 1, &s->x0[r], &c)) != TK_OK)
            return rc;
        s->sel[(*n)++] = r;
    }
    return TK_OK;
}

/* Dream's other algs: every masked position's confidence, then k = int(masked * frac) of them (all at
 * the last step), the most confident (alg_temp 0) or drawn from softmax(conf / alg_temp). */
static int dream_confident(dstate *s, size_t nm, float frac, int last, size_t *n)
{
    const tk_diff_opts *o = s->o;
    int rc;
    for (size_t j = 0; j < nm; j++) {
        int64_t r = s->order[j];
        if ((rc = dream_token(s, row(s, r, 0, 1), s->alg, &s->x0[r], &s->conf[r])) != TK_OK)
            return rc;
    }
    float fm = (float)nm;
    int64_t k = !last ? (int64_t)(fm * frac) : (int64_t)nm;
    if (k > 0 && o->alg_temp <= 0) {
        *n = topk(s, k);
    } else if (k > 0) { /* k positions without replacement from softmax(conf / alg_temp): the k largest
                           u^(1 / w) (Efraimidis-Spirakis) */
        double mx = -INFINITY;
        for (size_t j = 0; j < nm; j++)
            mx = fmax(mx, s->conf[s->order[j]] / o->alg_temp);
        if ((rc = draws(s, s->u, nm)) != TK_OK)
            return rc;
        for (size_t j = 0; j < nm; j++) {
            int64_t r = s->order[j];
            double w = exp(s->conf[r] / o->alg_temp - mx);
            s->conf[r] = log(s->u[j] > 0 ? s->u[j] : 1e-300) / w;
        }
        *n = topk(s, k);
    }
    return TK_OK;
}

/* One Dream step of N over t = linspace(1, eps, N + 1): *n positions revealed (s->sel). */
static int dream_step(dstate *s, size_t *n)
{
    int64_t N = s->steps, i = s->step;
    /* torch.linspace(1, eps, N + 1) in float32: the first half from the start, the rest from the end */
    float step_f = ((float)s->o->eps - 1.0f) / (float)N, eps = (float)s->o->eps;
    int64_t pts = N + 1, half = pts / 2;
    float t = i < half ? 1.0f + step_f * (float)i : eps - step_f * (float)(pts - i - 1);
    float sn = i + 1 < half ? 1.0f + step_f * (float)(i + 1) : eps - step_f * (float)(pts - i - 2);
    float frac = 1.0f - sn / t;
    size_t nm = 0;
    for (int64_t r = 0; r < s->L; r++) {
        s->conf[r] = -INFINITY;
        if (s->x[r] == s->mask)
            s->order[nm++] = r;
    }
    *n = 0;
    int rc = s->alg == 0 ? dream_origin(s, nm, frac, i + 1 == N, n) : dream_confident(s, nm, frac, i + 1 == N, n);
    if (rc != TK_OK)
        return rc;
    for (size_t j = 0; j < *n; j++)
        s->x[s->sel[j]] = s->x0[s->sel[j]];
    return TK_OK;
}

/* After the forward (s->logits): the sampler's step, its record and callback; *ended once it is done. */
static int advance(dstate *s, int *ended)
{
    int64_t spb = s->steps / s->nb, block = s->step / spb; /* Dream: one block */
    size_t n = 0;
    s->h.r->forwards++;
    double t0 = tk__now_ms();
    int rc = s->sampler == TK_DIFF_LLADA ? llada_step(s, &n) : dream_step(s, &n);
    if (rc == TK_OK)
        rc = record(s, s->step, block, n);
    s->h.r->sampler_ms += tk__now_ms() - t0;
    if (rc != TK_OK)
        return rc;
    int stop = report(s, s->step, block, n, (s->step + 1) % spb == 0);
    s->step++;
    if (stop)
        s->h.r->end = "callback";
    *ended = stop || s->step == s->steps;
    return TK_OK;
}

int tk_model_diffusion(const tk_model *m) { return tk_model_has_lm_head(m) ? m->cfg.diffusion : 0; }

static int check(dstate *s, const tk_diff_opts *o, size_t len, int *sampler, int *alg)
{
    tk_model *m = s->m;
    const tk_models_config *c = &m->cfg;
    if (o->version < 1 || o->version > TK_DIFF_OPTS_VERSION)
        return tk__err(TK_ERR_INVALID, "tk_diff_opts.version is %u; this tk knows 1..%d", o->version,
                       TK_DIFF_OPTS_VERSION);
    if (o->sampler == TK_DIFF_BLOCK)
        return tk__err(TK_ERR_INVALID,
                       "%s is not a block diffusion checkpoint (DiffusionGemmaForBlockDiffusion)\n"
                       "HINT: leave the sampler automatic, or pick llada or dream",
                       c->arch);
    if (!c->bidirectional && !o->bidirectional)
        return tk__err(TK_ERR_INVALID,
                       "%s is a causal LM; masked diffusion needs bidirectional attention\n"
                       "HINT: pass --bidirectional (tk_diff_opts.bidirectional = 1) to run it so",
                       c->arch);
    *sampler = o->sampler ? o->sampler : c->diffusion ? c->diffusion : TK_DIFF_LLADA;
    if (*sampler != TK_DIFF_LLADA && *sampler != TK_DIFF_DREAM)
        return tk__err(TK_ERR_INVALID, "tk_diff_opts.sampler is %d; want TK_DIFF_AUTO, TK_DIFF_LLADA or TK_DIFF_DREAM",
                       o->sampler);
    s->mask = o->mask_token_id >= 0 ? o->mask_token_id : c->mask_id;
    if (s->mask < 0)
        return tk__err(TK_ERR_INVALID,
                       "%s checkpoint '%s' has no mask token id (config.json has no mask_token_id, "
                       "and none was given)\nHINT: pass --mask-token-id ID (the id the model was trained to unmask)",
                       c->arch, m->dir);
    if (s->mask >= s->V)
        return tk__err(TK_ERR_INVALID, "mask token id %lld is outside the vocabulary [0, %lld)", (long long)s->mask,
                       (long long)s->V);
    if (len == 0)
        return tk__err(TK_ERR_INVALID, "the prompt is empty");
    s->G = o->gen_length;
    if (s->G <= 0)
        return tk__err(TK_ERR_INVALID, "gen_length is %lld; it must be > 0", (long long)s->G);
    s->B = o->block_length ? o->block_length : s->G;
    if (s->B <= 0)
        return tk__err(TK_ERR_INVALID, "block_length is %lld; it must be > 0 (0: gen_length)", (long long)s->B);
    if (*sampler == TK_DIFF_DREAM && s->B != s->G)
        return tk__err(TK_ERR_INVALID,
                       "block_length %lld differs from gen_length %lld: Dream's sampler denoises the "
                       "whole canvas at once\nHINT: leave --block-length out, or use --sampler llada",
                       (long long)s->B, (long long)s->G);
    if (s->G % s->B)
        return tk__err(TK_ERR_INVALID,
                       "gen_length %lld is not a multiple of block_length %lld\nHINT: e.g. "
                       "--gen-length %lld",
                       (long long)s->G, (long long)s->B, (long long)((s->G / s->B + 1) * s->B));
    s->nb = s->G / s->B;
    s->steps = o->steps ? o->steps : s->G;
    if (s->steps < s->nb)
        return tk__err(TK_ERR_INVALID,
                       "steps %lld are fewer than the %lld blocks (gen_length %lld / block_length "
                       "%lld): each block needs a step at least",
                       (long long)s->steps, (long long)s->nb, (long long)s->G, (long long)s->B);
    if (s->steps % s->nb)
        return tk__err(TK_ERR_INVALID,
                       "steps %lld is not a multiple of the %lld blocks (gen_length %lld / "
                       "block_length %lld): LLaDA gives every block the same number of steps",
                       (long long)s->steps, (long long)s->nb, (long long)s->G, (long long)s->B);
    if (s->steps > s->G)
        return tk__err(TK_ERR_INVALID, "steps %lld exceed gen_length %lld: a step would unmask no token",
                       (long long)s->steps, (long long)s->G);
    s->P = (int64_t)len;
    s->L = s->P + s->G;
    if (s->L > c->max_pos)
        return tk__err(TK_ERR_INVALID,
                       "the prompt (%lld tokens) plus gen_length %lld is %lld tokens, longer than the "
                       "model's context of %lld",
                       (long long)s->P, (long long)s->G, (long long)s->L, (long long)c->max_pos);
    if (!(o->temperature >= 0) || !isfinite(o->temperature))
        return tk__err(TK_ERR_INVALID, "temperature %g; it must be >= 0 (0: argmax)", o->temperature);
    if (!(o->cfg_scale >= 0) || !isfinite(o->cfg_scale))
        return tk__err(TK_ERR_INVALID, "cfg_scale %g; it must be >= 0 (0: off)", o->cfg_scale);
    if (o->remasking != 0 && o->remasking != 1)
        return tk__err(TK_ERR_INVALID, "remasking %d; want 0 (low_confidence) or 1 (random)", o->remasking);
    if (*sampler == TK_DIFF_DREAM && (o->cfg_scale > 0 || o->remasking))
        return tk__err(TK_ERR_INVALID, "cfg_scale and remasking are LLaDA's; Dream's sampler has alg instead");
    static const char *const algs[] = {"origin", "maskgit_plus", "topk_margin", "entropy"};
    *alg = -1;
    for (int a = 0; a < 4; a++)
        if (!strcmp(o->alg ? o->alg : "origin", algs[a]))
            *alg = a;
    if (*alg < 0)
        return tk__err(TK_ERR_INVALID, "alg '%s' is not one of Dream's: origin, maskgit_plus, topk_margin, entropy",
                       o->alg);
    if (*sampler == TK_DIFF_LLADA && o->alg && strcmp(o->alg, "origin"))
        return tk__err(TK_ERR_INVALID, "alg '%s' is Dream's; LLaDA's sampler remasks by low_confidence or random",
                       o->alg);
    if (!(o->top_p > 0 && o->top_p <= 1) || o->top_k < 0 || !(o->eps > 0 && o->eps < 1) || !(o->alg_temp >= 0))
        return tk__err(TK_ERR_INVALID,
                       "top_p %g (want (0, 1]), top_k %lld (>= 0), eps %g ((0, 1)), alg_temp %g "
                       "(>= 0): one is out of range",
                       o->top_p, (long long)o->top_k, o->eps, o->alg_temp);
    for (int64_t l = 0; l < c->layers; l++)
        if (c->sliding[l])
            return tk__err(TK_ERR_UNSUPPORTED,
                           "%s: layer %lld has a sliding window; tk's bidirectional attention "
                           "runs full layers only",
                           c->arch, (long long)l);
    return TK_OK;
}

static void seq_free(dstate *s)
{
    if (!s)
        return;
    tk_diff_result_free(s->h.r);
    free(s->x);
    free(s->x0);
    free(s->row);
    free(s->conf);
    free(s->sel);
    free(s->order);
    free(s->u);
    free(s->w);
    free(s->vord);
    free(s);
}

/* The sequence's buffers and its result's fields. */
static int seq_alloc(dstate *s)
{
    size_t L = (size_t)s->L, V = (size_t)s->V, no = L > V ? L : V;
    if (L * V > SIZE_MAX / sizeof(float) / 2)
        return tk__err(TK_ERR_NOMEM, "the canvas's logits (%zu x %zu) do not fit in memory", L, V);
    /* LLaDA at temperature > 0 draws a uniform per logit (its Gumbel noise) */
    size_t nu = s->sampler == TK_DIFF_LLADA && s->o->temperature > 0 ? L * V : L;
    if (!(s->u = malloc(nu * sizeof *s->u)))
        return tk__err(TK_ERR_NOMEM, "out of memory for %zu noise draws (gen_length x vocabulary)", nu);
    s->h.r = calloc(1, sizeof *s->h.r);
    s->x = malloc(2 * L * sizeof *s->x); /* x, then the unconditional canvas */
    s->x0 = malloc(L * sizeof *s->x0);
    s->row = malloc(V * sizeof *s->row);
    s->conf = malloc(L * sizeof *s->conf);
    s->sel = malloc(no * sizeof *s->sel);
    s->order = malloc(no * sizeof *s->order);
    if (s->sampler == TK_DIFF_DREAM) {
        s->w = malloc(V * sizeof *s->w);
        s->vord = malloc(V * sizeof *s->vord);
    }
    if (!s->h.r || !s->x || !s->x0 || !s->row || !s->conf || !s->sel || !s->order ||
        (s->sampler == TK_DIFF_DREAM && (!s->w || !s->vord)) || !(s->h.r->steps = json_array()))
        return tk__err(TK_ERR_NOMEM, "out of memory for a canvas of %zu positions x %zu logits", L, V);
    s->un = s->x + L;
    tk_diff_result *r = s->h.r;
    static const char *const algs[] = {"origin", "maskgit_plus", "topk_margin", "entropy"};
    r->sampler = s->sampler == TK_DIFF_LLADA ? "llada" : "dream";
    r->alg = s->sampler == TK_DIFF_LLADA ? (s->o->remasking ? "random" : "low_confidence") : algs[s->alg];
    s->oc.alg = s->sampler == TK_DIFF_DREAM ? algs[s->alg] : NULL; /* the caller's string need not live */
    r->end = "length";
    r->gen_length = s->G;
    r->block_length = s->B;
    r->blocks = s->nb;
    r->nsteps = s->steps;
    r->mask_id = s->mask;
    return TK_OK;
}

/* A sequence of prompt (len ids) under o, checked, its canvas all masked after the prompt. */
static int seq_new(dstate **out, tk_model *m, const int32_t *prompt, size_t len, const tk_diff_opts *o)
{
    *out = NULL;
    dstate *s = calloc(1, sizeof *s);
    if (!s)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    s->m = m;
    s->o = &s->oc;
    s->V = tk_model_vocab_size(m);
    int rc = check(s, o, len, &s->sampler, &s->alg);
    for (size_t i = 0; rc == TK_OK && i < len; i++)
        if (prompt[i] < 0 || prompt[i] >= s->V)
            rc = tk__err(TK_ERR_INVALID, "prompt id %d (at %zu) is outside the vocabulary [0, %lld)", (int)prompt[i], i,
                         (long long)s->V);
    if (rc != TK_OK) {
        free(s);
        return rc;
    }
    /* version 1 options end before t_min (block diffusion's, unused here) */
    s->oc = (tk_diff_opts)TK_DIFF_OPTS_INIT;
    memcpy(&s->oc, o, o->version >= 2 ? sizeof *o : offsetof(tk_diff_opts, t_min));
    s->nseq = o->cfg_scale > 0 ? 2 : 1;
    s->rng = o->seed;
    if ((rc = seq_alloc(s)) != TK_OK) {
        seq_free(s);
        return rc;
    }
    memcpy(s->x, prompt, len * sizeof *s->x);
    for (int64_t i = s->P; i < s->L; i++)
        s->x[i] = (int32_t)s->mask;
    *out = s;
    return TK_OK;
}

/* The ended sequence's ids and text into its result. */
static int seq_finish(dstate *s)
{
    tk_diff_result *r = s->h.r;
    r->ms = tk__now_ms() - s->h.t0;
    r->n = (size_t)s->G;
    if (!(r->ids = malloc(r->n * sizeof *r->ids)))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    memcpy(r->ids, s->x + s->P, r->n * sizeof *r->ids);
    const tk_tokenizer *tok = NULL;
    if (tk_model_tokenizer(&tok, s->m) == TK_OK && tk_tokenizer_decode(&r->text, tok, r->ids, r->n, 1) != TK_OK)
        r->text = NULL;
    tk__err_clear();
    return TK_OK;
}

/* ---- the batch: several sequences, one forward a step ----------------------------------------- */

#define DBATCH_MAGIC 0x64696662u /* "difb" */

struct tk_diff_batch {
    uint32_t magic;
    tk_model *m;
    int block;                  /* a block diffusion model (DiffusionGemma): block_diffusion.c's sequences */
    tk_models_dseq **q;         /* the sequences, in the order they joined */
    size_t n, capq;
    tk_models_dseq **ended;     /* the last step's (their results borrowed by its events) */
    size_t nended, cap_ended;
    tk_diff_event *ev;
    size_t cap_ev;
    int32_t *ids;               /* masked: the step's canvases, packed */
    size_t *lens;
    float *logits;
    tk_models_dgemma_seq *bq;   /* block: the step's sequences */
    size_t cap_ids, cap_lens, cap_logits, cap_bq;
    int64_t next_id;
    tk_diff_batch_stats st;
};

static int grow(void **p, size_t *cap, size_t need, size_t el)
{
    if (need <= *cap)
        return TK_OK;
    size_t c = *cap ? *cap : 4;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * el);
    if (!q)
        return tk__err(TK_ERR_NOMEM, "out of memory for a diffusion batch step (%zu x %zu bytes)", c, el);
    *p = q;
    *cap = c;
    return TK_OK;
}

static int check_batch(const tk_diff_batch *b, const char *fn)
{
    if (!b || b->magic != DBATCH_MAGIC)
        return tk__err(TK_ERR_INVALID, "%s: not a tk_diff_batch (NULL or freed)", fn);
    return TK_OK;
}

static void any_free(const tk_diff_batch *b, tk_models_dseq *s)
{
    if (b->block)
        tk_models__block_free(s);
    else
        seq_free((dstate *)s);
}

int tk_diff_batch_new(tk_diff_batch **out, tk_model *m)
{
    if (!out)
        return tk__err(TK_ERR_INVALID, "tk_diff_batch_new: out is NULL");
    *out = NULL;
    if (!tk_model_has_lm_head(m))
        return tk__err(TK_ERR_UNSUPPORTED, "tk_diff_batch_new: not a loaded language model with an LM head");
    tk_diff_batch *b = calloc(1, sizeof *b);
    if (!b)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    b->magic = DBATCH_MAGIC;
    b->m = m;
    b->block = m->cfg.canvas > 0; /* DiffusionGemma: block diffusion */
    *out = b;
    return TK_OK;
}

static void drop_ended(tk_diff_batch *b)
{
    for (size_t i = 0; i < b->nended; i++)
        any_free(b, b->ended[i]);
    b->nended = 0;
}

void tk_diff_batch_free(tk_diff_batch *b)
{
    if (!b || b->magic != DBATCH_MAGIC)
        return;
    drop_ended(b);
    for (size_t i = 0; i < b->n; i++)
        any_free(b, b->q[i]);
    free(b->q);
    free(b->ended);
    free(b->ev);
    free(b->ids);
    free(b->lens);
    free(b->logits);
    free(b->bq);
    b->magic = 0;
    free(b);
}

int tk_diff_batch_add(int64_t *seq, tk_diff_batch *b, const int32_t *prompt, size_t len, const tk_diff_opts *o)
{
    tk_diff_opts def = TK_DIFF_OPTS_INIT;
    int rc = check_batch(b, "tk_diff_batch_add");
    if (rc != TK_OK)
        return rc;
    if (!seq)
        return tk__err(TK_ERR_INVALID, "tk_diff_batch_add: seq is NULL");
    if (!prompt && len)
        return tk__err(TK_ERR_INVALID, "tk_diff_batch_add: prompt is NULL");
    tk_models_dseq *s = NULL;
    /* a step ends at most every sequence: ended and ev grow with q, before the step needs them */
    if ((rc = grow((void **)&b->q, &b->capq, b->n + 1, sizeof *b->q)) != TK_OK ||
        (rc = grow((void **)&b->ended, &b->cap_ended, b->n + 1, sizeof *b->ended)) != TK_OK ||
        (rc = grow((void **)&b->ev, &b->cap_ev, b->n + 1, sizeof *b->ev)) != TK_OK)
        return rc;
    dstate *d = NULL;
    if (b->block)
        rc = tk_models__block_new(&s, b->m, prompt, len, o ? o : &def);
    else if ((rc = seq_new(&d, b->m, prompt, len, o ? o : &def)) == TK_OK)
        s = &d->h;
    if (rc != TK_OK)
        return rc;
    s->id = b->next_id++;
    b->q[b->n++] = s;
    *seq = s->id;
    return TK_OK;
}

/* Packs every sequence's canvases (prepared for this step) for one forward; *nrows sequences. */
static int gather(tk_diff_batch *b, size_t *nrows)
{
    size_t nids = 0, nl = 0, nlog = 0;
    for (size_t i = 0; i < b->n; i++) {
        dstate *s = (dstate *)b->q[i];
        nids += s->nseq * (size_t)s->L;
        nl += s->nseq;
    }
    size_t V = (size_t)tk_model_vocab_size(b->m);
    if (nids > SIZE_MAX / sizeof(float) / V)
        return tk__err(TK_ERR_NOMEM, "a diffusion step's logits (%zu x %zu) do not fit in memory", nids, V);
    int rc = grow((void **)&b->ids, &b->cap_ids, nids, sizeof *b->ids);
    if (rc == TK_OK)
        rc = grow((void **)&b->lens, &b->cap_lens, nl, sizeof *b->lens);
    if (rc == TK_OK)
        rc = grow((void **)&b->logits, &b->cap_logits, nids * V, sizeof *b->logits);
    if (rc != TK_OK)
        return rc;
    nids = nl = 0;
    for (size_t i = 0; i < b->n; i++) {
        dstate *s = (dstate *)b->q[i];
        prepare(s);
        if (!s->h.t0)
            s->h.t0 = tk__now_ms();
        memcpy(b->ids + nids, s->x, s->nseq * (size_t)s->L * sizeof *b->ids); /* x, then un */
        nids += s->nseq * (size_t)s->L;
        for (size_t k = 0; k < s->nseq; k++)
            b->lens[nl++] = (size_t)s->L;
        s->logits = b->logits + nlog;
        nlog += s->nseq * (size_t)s->L * V;
    }
    *nrows = nl;
    return TK_OK;
}

/* Sequence s failed with rc (tk_last_error()): it ends with that status. */
static void seq_failed(tk_models_dseq *s, int rc)
{
    s->status = rc;
    snprintf(s->err, sizeof s->err, "%s", tk_last_error());
}

/* Every sequence's step after the forward (one that failed before it only ends); the ended ones leave
 * for b->ended and the events. */
static void advance_all(tk_diff_batch *b, const tk_diff_event **events, size_t *nevents)
{
    size_t keep = 0;
    const tk_models_dseq *failed = NULL;
    for (size_t i = 0; i < b->n; i++) {
        tk_models_dseq *s = b->q[i];
        int ended = 0, rc = s->status;
        if (rc == TK_OK)
            rc = b->block ? tk_models__block_advance(s, &ended) : advance((dstate *)s, &ended);
        if (rc == TK_OK && ended)
            rc = b->block ? tk_models__block_finish(s) : seq_finish((dstate *)s);
        if (rc != TK_OK) {
            if (!s->status)
                seq_failed(s, rc);
            failed = s;
            ended = 1;
        }
        if (ended)
            b->ended[b->nended++] = s;
        else
            b->q[keep++] = s;
    }
    b->n = keep;
    for (size_t i = 0; i < b->nended; i++) {
        tk_models_dseq *s = b->ended[i];
        b->ev[i] = (tk_diff_event){s->id, s->status, s->err, s->status == TK_OK ? s->r : NULL};
    }
    *events = b->ev;
    *nevents = b->nended;
    if (failed) /* the last failure's message for the caller */
        tk__err(failed->status, "%s", failed->err);
}

/* Masked diffusion: every canvas (and unconditional canvas) in one tk_model_forward; *nseq advanced. */
static int step_masked(tk_diff_batch *b, size_t *nseq)
{
    size_t nrows = 0;
    int rc = gather(b, &nrows);
    if (rc != TK_OK)
        return rc;
    tk_model *m = b->m;
    int was = m->cfg.bidirectional; /* every canvas attends both ways, a causal checkpoint's too */
    m->cfg.bidirectional = 1;
    rc = tk_model_forward(m, b->ids, b->lens, nrows, b->logits, NULL);
    m->cfg.bidirectional = was;
    *nseq = b->n;
    return rc;
}

/* Block diffusion: each sequence prepares its part (a failure there is its own, and it sits the step
 * out), then one tk_models__dgemma_step over the others; *nseq advanced. */
static int step_block(tk_diff_batch *b, size_t *nseq)
{
    int rc = grow((void **)&b->bq, &b->cap_bq, b->n, sizeof *b->bq);
    if (rc != TK_OK)
        return rc;
    size_t k = 0;
    for (size_t i = 0; i < b->n; i++) {
        tk_models_dseq *s = b->q[i];
        if (s->status == TK_OK && (rc = tk_models__block_prepare(s, &b->bq[k])) != TK_OK)
            seq_failed(s, rc);
        if (s->status == TK_OK)
            k++;
    }
    *nseq = k;
    return k ? tk_models__dgemma_step(b->m, b->bq, k) : TK_OK;
}

int tk_diff_batch_step(tk_diff_batch *b, const tk_diff_event **events, size_t *nevents)
{
    int rc = check_batch(b, "tk_diff_batch_step");
    if (rc != TK_OK)
        return rc;
    if (!events || !nevents)
        return tk__err(TK_ERR_INVALID, "tk_diff_batch_step: events and nevents are required");
    *events = b->ev;
    *nevents = 0;
    drop_ended(b);
    if (!b->n)
        return TK_OK;
    size_t nseq = 0;
    if ((rc = b->block ? step_block(b, &nseq) : step_masked(b, &nseq)) != TK_OK)
        return rc;
    if (nseq) {
        b->st.steps++;
        b->st.step_sequences += (int64_t)nseq;
    }
    advance_all(b, events, nevents);
    return TK_OK;
}

int tk_diff_batch_cancel(tk_diff_batch *b, int64_t seq)
{
    int rc = check_batch(b, "tk_diff_batch_cancel");
    if (rc != TK_OK)
        return rc;
    for (size_t i = 0; i < b->n; i++)
        if (b->q[i]->id == seq) {
            any_free(b, b->q[i]);
            memmove(b->q + i, b->q + i + 1, (b->n - i - 1) * sizeof *b->q);
            b->n--;
            return TK_OK;
        }
    return tk__err(TK_ERR_NOT_FOUND, "tk_diff_batch_cancel: no sequence %lld in the batch", (long long)seq);
}

size_t tk_diff_batch_active(const tk_diff_batch *b) { return b && b->magic == DBATCH_MAGIC ? b->n : 0; }

int tk_diff_batch_stats_get(tk_diff_batch_stats *out, const tk_diff_batch *b)
{
    int rc = check_batch(b, "tk_diff_batch_stats_get");
    if (rc != TK_OK || !out)
        return rc ? rc : tk__err(TK_ERR_INVALID, "tk_diff_batch_stats_get: out is NULL");
    *out = b->st;
    out->active = (int64_t)b->n;
    return TK_OK;
}

/* One sequence alone: a batch of one. */
int tk_diffusion_generate(tk_diff_result **out, tk_model *m, const int32_t *prompt, size_t len,
                          const tk_diff_opts *opts)
{
    tk_diff_opts def = TK_DIFF_OPTS_INIT;
    const tk_diff_opts *o = opts ? opts : &def;
    *out = NULL;
    if (!tk_model_has_lm_head(m))
        return tk__err(TK_ERR_UNSUPPORTED, "tk_diffusion_generate: not a loaded language model with an LM head");
    if (!prompt && len)
        return tk__err(TK_ERR_INVALID, "tk_diffusion_generate: prompt is NULL");
    tk_diff_batch *b = NULL;
    const tk_diff_event *ev = NULL;
    size_t nev = 0;
    int64_t seq;
    int rc = tk_diff_batch_new(&b, m);
    if (rc == TK_OK)
        rc = tk_diff_batch_add(&seq, b, prompt, len, o);
    while (rc == TK_OK && nev == 0)
        rc = tk_diff_batch_step(b, &ev, &nev);
    if (rc == TK_OK && ev[0].status != TK_OK)
        rc = tk__err(ev[0].status, "%s", ev[0].error);
    if (rc == TK_OK) {
        *out = b->ended[0]->r; /* taken from the batch */
        b->ended[0]->r = NULL;
    }
    tk_diff_batch_free(b);
    return rc;
}

void tk_diff_result_free(tk_diff_result *r)
{
    if (!r)
        return;
    free(r->ids);
    free(r->text);
    json_decref(r->steps);
    free(r);
}

const int32_t *tk_diff_result_ids(const tk_diff_result *r, size_t *n)
{
    if (n)
        *n = r ? r->n : 0;
    return r ? r->ids : NULL;
}

const char *tk_diff_result_text(const tk_diff_result *r) { return r ? r->text : NULL; }

int tk_diff_result_json(char **json, const tk_diff_result *r)
{
    *json = NULL;
    if (!r)
        return tk__err(TK_ERR_INVALID, "tk_diff_result_json: no result");
    double tps = r->ms > 0 ? (double)r->gen_length / (r->ms / 1000.0) : 0;
    json_t *o = json_pack("{s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:f, s:s, s:O}", "sampler", r->sampler,
                          "alg", r->alg, "gen_length", (json_int_t)r->gen_length, "block_length",
                          (json_int_t)r->block_length, "blocks", (json_int_t)r->blocks, "steps", (json_int_t)r->nsteps,
                          "mask_token_id", (json_int_t)r->mask_id, "forward_passes", (json_int_t)r->forwards, "ms",
                          r->ms, "sampler_ms", r->sampler_ms, "tokens_per_s", tps, "end", r->end, "per_step", r->steps);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    *json = s;
    return TK_OK;
}
