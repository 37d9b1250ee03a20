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
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/models.h"

/* The sampler's state for one call. */
typedef struct {
    tk_model *m;
    const tk_diff_opts *o;
    int64_t V, L, P, G, B, nb, steps, mask;
    int32_t *x, *x0, *un;     /* canvas, proposed tokens, the unconditional canvas (cfg) */
    float *logits, *row;      /* [nseq * L, V]; one row of guided logits */
    double *conf, *u, *w;     /* [L] confidences; draws; a row's work space [V] */
    int64_t *sel, *order;     /* [L] (order: [max(L, V)]) */
    int64_t *vord;            /* Dream's top_p / top_k sort of a row [V] */
    uint64_t rng;
    tk_diff_result *r;
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

/* One forward over the canvas (and the unconditional one for cfg): s->logits. */
static int forward(dstate *s, int cfg)
{
    size_t lens[2] = {(size_t)s->L, (size_t)s->L};
    if (cfg) { /* x and un are one allocation, x first: the two sequences of one packed forward */
        memcpy(s->un, s->x, (size_t)s->L * sizeof *s->un);
        for (int64_t i = 0; i < s->P; i++) /* LLaDA: un_x[prompt_index] = mask_id */
            s->un[i] = (int32_t)s->mask;
    }
    s->r->forwards++;
    return tk_model_forward(s->m, s->x, lens, cfg ? 2 : 1, s->logits, NULL);
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
              json_array_append_new(s->r->steps, o);
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

static int llada(dstate *s)
{
    const tk_diff_opts *o = s->o;
    int cfg = o->cfg_scale > 0, rc;
    int64_t spb = s->steps / s->nb, V = s->V, L = s->L;
    size_t nu = (size_t)(L * V) > (size_t)L ? (size_t)(L * V) : (size_t)L;
    if (o->temperature > 0 && !(s->u = malloc(nu * sizeof *s->u)))
        return tk__err(TK_ERR_NOMEM, "out of memory for %zu noise draws (gen_length x vocabulary)", nu);
    if (o->temperature <= 0 && o->remasking && !(s->u = malloc((size_t)L * sizeof *s->u)))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    for (int64_t b = 0; b < s->nb; b++) {
        int64_t lo = s->P + b * s->B, hi = lo + s->B, nmask = 0;
        for (int64_t i = lo; i < hi; i++)
            nmask += s->x[i] == s->mask;
        int64_t base = nmask / spb, rem = nmask % spb;
        for (int64_t i = 0; i < spb; i++) {
            int64_t k = base + (i < rem);
            if ((rc = forward(s, cfg)) != TK_OK)
                return rc;
            if (o->temperature > 0 && (rc = draws(s, s->u, (size_t)(L * V))) != TK_OK)
                return rc;
            for (int64_t r = 0; r < L; r++) {
                s->conf[r] = -INFINITY;
                if (s->x[r] != s->mask || r >= hi) /* x0 there is never used */
                    continue;
                const float *l = row(s, r, cfg, 0);
                int64_t best = 0;
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
            if (o->remasking) { /* random: a uniform per position (torch.rand((1, L))) */
                if ((rc = draws(s, s->u, (size_t)L)) != TK_OK)
                    return rc;
                for (int64_t r = 0; r < L; r++)
                    if (s->conf[r] == -INFINITY && s->x[r] == s->mask && r < hi)
                        s->conf[r] = s->u[r];
            }
            size_t n = topk(s, k);
            for (size_t j = 0; j < n; j++)
                s->x[s->sel[j]] = s->x0[s->sel[j]];
            int64_t step = b * spb + i;
            if ((rc = record(s, step, b, n)) != TK_OK)
                return rc;
            if (report(s, step, b, n, i + 1 == spb)) {
                s->r->end = "callback";
                return TK_OK;
            }
        }
    }
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

static int dream(dstate *s, int alg)
{
    const tk_diff_opts *o = s->o;
    int64_t L = s->L, N = s->steps;
    int rc;
    if (!(s->u = malloc((size_t)L * sizeof *s->u)) || !(s->w = malloc((size_t)s->V * sizeof *s->w)) ||
        !(s->vord = malloc((size_t)s->V * sizeof *s->vord)))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    /* torch.linspace(1, eps, N + 1) in float32: the first half from the start, the rest from the end */
    float step_f = ((float)o->eps - 1.0f) / (float)N;
    for (int64_t i = 0; i < N; i++) {
        int64_t pts = N + 1, half = pts / 2;
        float t = i < half ? 1.0f + step_f * (float)i : (float)o->eps - step_f * (float)(pts - i - 1);
        float sn = i + 1 < half ? 1.0f + step_f * (float)(i + 1) : (float)o->eps - step_f * (float)(pts - i - 2);
        float frac = 1.0f - sn / t;
        if ((rc = forward(s, 0)) != TK_OK)
            return rc;
        size_t nm = 0, n = 0;
        for (int64_t r = 0; r < L; r++) {
            s->conf[r] = -INFINITY;
            if (s->x[r] == s->mask)
                s->order[nm++] = r;
        }
        if (alg == 0) { /* origin: reveal each masked position with probability 1 - s/t */
            if ((rc = draws(s, s->u, nm)) != TK_OK)
                return rc;
            int64_t *pos = malloc((nm ? nm : 1) * sizeof *pos);
            if (!pos)
                return tk__err(TK_ERR_NOMEM, "out of memory");
            memcpy(pos, s->order, nm * sizeof *pos);
            for (size_t j = 0; j < nm; j++) {
                if (!(i + 1 == N || s->u[j] < (double)frac))
                    continue;
                double c;
                if ((rc = dream_token(s, row(s, pos[j], 0, 1), 1, &s->x0[pos[j]], &c)) != TK_OK) {
                    free(pos);
                    return rc;
                }
                s->sel[n++] = pos[j];
            }
            free(pos);
        } else {
            for (size_t j = 0; j < nm; j++) {
                int64_t r = s->order[j];
                if ((rc = dream_token(s, row(s, r, 0, 1), alg, &s->x0[r], &s->conf[r])) != TK_OK)
                    return rc;
            }
            float fm = (float)nm;
            int64_t k = i + 1 < N ? (int64_t)(fm * frac) : (int64_t)nm;
            if (k > 0 && o->alg_temp <= 0) {
                n = topk(s, k);
            } else if (k > 0) { /* k positions without replacement from softmax(conf / alg_temp):
                                   the k largest u^(1 / w) (Efraimidis-Spirakis) */
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
                n = topk(s, k);
            }
        }
        for (size_t j = 0; j < n; j++)
            s->x[s->sel[j]] = s->x0[s->sel[j]];
        if ((rc = record(s, i, 0, n)) != TK_OK)
            return rc;
        if (report(s, i, 0, n, i + 1 == N)) {
            s->r->end = "callback";
            return TK_OK;
        }
    }
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

int tk_diffusion_generate(tk_diff_result **out, tk_model *m, const int32_t *prompt, size_t len,
                          const tk_diff_opts *opts)
{
    tk_diff_opts def = TK_DIFF_OPTS_INIT;
    const tk_diff_opts *o = opts ? opts : &def;
    dstate s = {0};
    int sampler = 0, alg = 0, rc, was;
    *out = NULL;
    if (!tk_model_has_lm_head(m))
        return tk__err(TK_ERR_UNSUPPORTED, "tk_diffusion_generate: not a loaded language model with an LM head");
    if (!prompt && len)
        return tk__err(TK_ERR_INVALID, "tk_diffusion_generate: prompt is NULL");
    if (m->cfg.canvas > 0) /* DiffusionGemma: block diffusion (block_diffusion.c) */
        return tk_models__block_generate(out, m, prompt, len, o);
    s.m = m;
    s.o = o;
    s.V = tk_model_vocab_size(m);
    if ((rc = check(&s, o, len, &sampler, &alg)) != TK_OK)
        return rc;
    for (size_t i = 0; i < len; i++)
        if (prompt[i] < 0 || prompt[i] >= s.V)
            return tk__err(TK_ERR_INVALID, "prompt id %d (at %zu) is outside the vocabulary [0, %lld)", (int)prompt[i],
                           i, (long long)s.V);
    size_t L = (size_t)s.L, V = (size_t)s.V, nseq = o->cfg_scale > 0 ? 2 : 1;
    if (L * V > SIZE_MAX / sizeof(float) / 2)
        return tk__err(TK_ERR_NOMEM, "the canvas's logits (%zu x %zu) do not fit in memory", L, V);
    s.r = calloc(1, sizeof *s.r);
    s.x = malloc(2 * L * sizeof *s.x); /* x, then the unconditional canvas */
    s.x0 = malloc(L * sizeof *s.x0);
    s.logits = malloc(nseq * L * V * sizeof *s.logits);
    s.row = malloc(V * sizeof *s.row);
    s.conf = malloc(L * sizeof *s.conf);
    size_t no = L > V ? L : V;
    s.sel = malloc(no * sizeof *s.sel);
    s.order = malloc(no * sizeof *s.order);
    if (!s.r || !s.x || !s.x0 || !s.logits || !s.row || !s.conf || !s.sel || !s.order || !(s.r->steps = json_array())) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory for a canvas of %zu positions x %zu logits", L, V);
        goto fail;
    }
    s.un = s.x + L;
    s.rng = o->seed;
    memcpy(s.x, prompt, len * sizeof *s.x);
    for (size_t i = len; i < L; i++)
        s.x[i] = (int32_t)s.mask;
    s.r->sampler = sampler == TK_DIFF_LLADA ? "llada" : "dream";
    s.r->alg = sampler == TK_DIFF_LLADA ? (o->remasking ? "random" : "low_confidence")
                                        : (const char *[]){"origin", "maskgit_plus", "topk_margin", "entropy"}[alg];
    s.r->end = "length";
    s.r->gen_length = s.G;
    s.r->block_length = s.B;
    s.r->blocks = s.nb;
    s.r->nsteps = s.steps;
    s.r->mask_id = s.mask;
    was = m->cfg.bidirectional;
    m->cfg.bidirectional = 1;
    double t0 = tk__now_ms();
    rc = sampler == TK_DIFF_LLADA ? llada(&s) : dream(&s, alg);
    s.r->ms = tk__now_ms() - t0;
    m->cfg.bidirectional = was;
    if (rc != TK_OK)
        goto fail;
    s.r->n = (size_t)s.G;
    if (!(s.r->ids = malloc(s.r->n * sizeof *s.r->ids))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto fail;
    }
    memcpy(s.r->ids, s.x + s.P, s.r->n * sizeof *s.r->ids);
    const tk_tokenizer *tok = NULL;
    if (tk_model_tokenizer(&tok, m) == TK_OK && tk_tokenizer_decode(&s.r->text, tok, s.r->ids, s.r->n, 1) != TK_OK)
        s.r->text = NULL;
    tk__err_clear();
    *out = s.r;
    s.r = NULL;
fail:
    tk_diff_result_free(s.r);
    free(s.x);
    free(s.x0);
    free(s.logits);
    free(s.row);
    free(s.conf);
    free(s.sel);
    free(s.order);
    free(s.u);
    free(s.w);
    free(s.vord);
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
    json_t *o = json_pack("{s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:s, s:O}", "sampler", r->sampler, "alg",
                          r->alg, "gen_length", (json_int_t)r->gen_length, "block_length", (json_int_t)r->block_length,
                          "blocks", (json_int_t)r->blocks, "steps", (json_int_t)r->nsteps, "mask_token_id",
                          (json_int_t)r->mask_id, "forward_passes", (json_int_t)r->forwards, "ms", r->ms,
                          "tokens_per_s", tps, "end", r->end, "per_step", r->steps);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    *json = s;
    return TK_OK;
}
