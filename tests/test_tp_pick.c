/*
 * test_tp_pick.c — generation's pick on logits rows holding NaN, +inf and -inf: one process's rules
 * (models/generate.c's processors and the argmax and sample ops), and the vocabulary-parallel pick
 * (models/tp_pick.c) equal to them, token and log-probabilities, bit for bit.
 *
 * Run alone (make test), it checks one process's rules on such rows (docs/parallel.md, "Non-finite
 * logits"). Under mpirun, tests/cli/tp_models.sh runs it as a worker:
 *
 *     test_tp_pick --worker      each rank holds torch.chunk's part of vocabularies of 3 to 10 columns
 *                                (at 3 ranks, a vocabulary of 4 leaves the last rank none); rows with
 *                                NaN, +inf and -inf on every column, rank boundaries included, are
 *                                picked over the ranks with every option (greedy, sampling with top-k,
 *                                top-p, min-p, log-probabilities) and must give one process's pick;
 *                                tk_models__tp_log_softmax (beam search's) one process's log_softmax;
 *                                top-p on 1000 columns, settled in its first round and searched
 *
 * Each prints "N passed, N failed, N skipped" and exits non-zero on a failure.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sample_math.h"
#include "harness.h"
#include "models/generate.h"
#include "models/models.h"
#include "op_test.h"
#include "tk.h"

/* A row's options: what generate.c's eng_pick gets (its sampling filters and the pick). */
typedef struct {
    int sample;
    int64_t top_k;
    double top_p, min_p;
    int lp, top_n; /* lp: log-probabilities wanted (top_n of them too) */
} popt;

static const popt OPTS[] = {
    {0, 0, 1.0, 0, 0, 0},   {0, 0, 1.0, 0, 1, 0},   {0, 0, 1.0, 0, 1, 3},    {0, 0, 1.0, 0, 1, 20},
    {1, 0, 1.0, 0, 0, 0},   {1, 1, 1.0, 0, 0, 0},   {1, 2, 1.0, 0, 0, 0},    {1, 3, 1.0, 0, 1, 2},
    {1, 0, 0.3, 0, 0, 0},   {1, 0, 0.5, 0, 0, 0},   {1, 0, 0.9, 0, 1, 4},    {1, 0, 1.0, 0.1, 0, 0},
    {1, 0, 1.0, 0.5, 1, 1}, {1, 3, 0.7, 0.2, 0, 0}, {1, 0, 0.5, 0.3, 1, 20}, {1, 5, 0.95, 0.05, 1, 0},
};
#define NOPTS (sizeof OPTS / sizeof OPTS[0])

/* ---- one process: generate.c's processors and pick() (the ops' CPU references) ---- */

static int64_t op_pick(float *row, int64_t V, int sample, uint64_t seed, int64_t step)
{
    int64_t shp[2] = {1, V}, shp1[1] = {1}, tok = -2, sd = (int64_t)seed;
    tk_tensor lg = {row, {TK_DEV_CPU, 0}, 2, {TK_DL_FLOAT, 32, 1}, shp, NULL, 0};
    tk_tensor out = {&tok, {TK_DEV_CPU, 0}, 1, {TK_DL_INT, 64, 1}, shp1, NULL, 0};
    tk_tensor sds = {&sd, {TK_DEV_CPU, 0}, 1, {TK_DL_INT, 64, 1}, shp1, NULL, 0};
    tk_arg ga[] = {{TK_ARG_TENSOR, "out", &out, 0, 0}, {TK_ARG_TENSOR, "input", &lg, 0, 0}};
    tk_arg sa[] = {{TK_ARG_TENSOR, "out", &out, 0, 0},        {TK_ARG_TENSOR, "logits", &lg, 0, 0},
                   {TK_ARG_F64, "temperature", NULL, 0, 1.0}, {TK_ARG_I64, "top_k", NULL, 0, 0},
                   {TK_ARG_F64, "top_p", NULL, 0, 1.0},       {TK_ARG_I64, "offset", NULL, step, 0},
                   {TK_ARG_TENSOR, "seeds", &sds, 0, 0}};
    int rc = sample ? op_run_cpu("sample", sa, sizeof sa / sizeof sa[0]) : op_run_cpu("argmax", ga, 2);
    CHECK_RC(rc, TK_OK);
    return tok;
}

/* One process's token of row (processed in place) and, with o->lp, its log-probabilities of raw. */
static int64_t one_pick(float *row, const float *raw, int64_t V, const popt *o, uint64_t seed, tk_models_tp_lp *lp)
{
    if (o->sample && o->top_k != 0)
        CHECK_RC(tk_gen__top_k(row, V, o->top_k, 1), TK_OK);
    if (o->sample && o->top_p < 1.0)
        CHECK_RC(tk_gen__top_p(row, V, o->top_p, 1), TK_OK);
    if (o->sample && o->min_p > 0)
        CHECK_RC(tk_gen__min_p(row, V, o->min_p, 1), TK_OK);
    int64_t tok = op_pick(row, V, o->sample, seed, 3);
    if (o->lp && tok >= 0) {
        float *l = malloc((size_t)V * sizeof *l);
        memcpy(l, raw, (size_t)V * sizeof *l);
        tk_gen__log_softmax(l, V);
        lp->logprob = l[tok];
        lp->ntop = o->top_n ? tk_gen__top_logprobs(l, V, 0, o->top_n, lp->top_ids, lp->top_vals) : 0;
        free(l);
    }
    return tok;
}

/* ---- the rows ---- */

/* A deterministic finite row with ties (the same on every rank), then `kind`'s special values at q1 and
 * q2 (a NaN, +inf, -inf, or a row of -inf with a NaN or a finite value left). */
enum { K_NAN, K_PINF, K_2PINF, K_NAN_PINF, K_NINF, K_ALL_NINF, K_NINF_NAN, K_NINF_ONE, K_ALL_NAN, K_PINF_NINF, NK };

static void make_row(float *x, int64_t V, int kind, int64_t q1, int64_t q2, uint32_t *st)
{
    for (int64_t i = 0; i < V; i++) {
        *st = *st * 1664525u + 1013904223u;
        x[i] = (float)((int)(*st >> 28) % 7 - 3) * 0.75f;
    }
    switch (kind) {
    case K_NAN: x[q1] = NAN; break;
    case K_PINF: x[q1] = INFINITY; break;
    case K_2PINF: x[q1] = x[q2] = INFINITY; break;
    case K_NAN_PINF: x[q1] = NAN, x[q2] = INFINITY; break;
    case K_NINF: x[q1] = x[q2] = -INFINITY; break;
    case K_PINF_NINF: x[q1] = INFINITY, x[q2] = -INFINITY; break;
    default: /* rows of -inf */
        for (int64_t i = 0; i < V; i++)
            x[i] = kind == K_ALL_NAN ? NAN : -INFINITY;
        if (kind == K_NINF_NAN)
            x[q1] = NAN;
        if (kind == K_NINF_ONE)
            x[q1] = 1.5f;
    }
}

/* Every kind at every (q1, q2), q1 != q2 where two are placed: rows[n][V]. */
static float *all_rows(int64_t V, size_t *n)
{
    size_t cap = (size_t)(NK * V * V), k = 0;
    float *r = malloc(cap * (size_t)V * sizeof *r);
    uint32_t st = (uint32_t)V;
    for (int kind = 0; kind < NK; kind++)
        for (int64_t q1 = 0; q1 < V; q1++)
            for (int64_t q2 = 0; q2 < V; q2++) {
                int two = kind == K_2PINF || kind == K_NAN_PINF || kind == K_NINF || kind == K_PINF_NINF;
                if ((two && q1 == q2) || (!two && q2 > 0) || (kind == K_ALL_NAN && q1 > 0))
                    continue;
                make_row(r + k++ * (size_t)V, V, kind, q1, q2, &st);
            }
    *n = k;
    return r;
}

/* ---- alone: one process's rules ---- */

static int64_t pick1(const float *x, int64_t V, const popt *o, uint64_t seed)
{
    float row[16];
    tk_models_tp_lp lp;
    memcpy(row, x, (size_t)V * sizeof *row);
    return one_pick(row, x, V, o, seed, &lp);
}

/* Greedy is torch.argmax: NaN above everything (the first NaN), then the first +inf; a row of -inf
 * gives token 0. */
static void test_greedy_is_torch_argmax(void)
{
    const popt g = {0, 0, 1.0, 0, 0, 0};
    float a[5] = {1, NAN, 2, NAN, INFINITY}, b[5] = {1, INFINITY, 2, INFINITY, 0};
    float c[5] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY}, d[5] = {-INFINITY, 3, -INFINITY, 7, 7};
    CHECK_EQ_INT(pick1(a, 5, &g, 0), 1);
    CHECK_EQ_INT(pick1(b, 5, &g, 0), 1);
    CHECK_EQ_INT(pick1(c, 5, &g, 0), 0);
    CHECK_EQ_INT(pick1(d, 5, &g, 0), 3);
}

/* Sampling: NaN counts as -inf in every filter and in the draw; a row with nothing above -inf gives no
 * token (generate fails the sequence). Min-p on a row with a NaN filters the other tokens as if the NaN
 * were -inf (it used to see a NaN sum and remove nothing). */
static void test_sampling_nan_is_minus_inf(void)
{
    const popt s = {1, 0, 1.0, 0, 0, 0}, mp = {1, 0, 1.0, 0.5, 0, 0};
    float a[4] = {NAN, -INFINITY, NAN, -INFINITY}, b[4] = {NAN, 0, NAN, -INFINITY};
    CHECK_EQ_INT(pick1(a, 4, &s, 1), -1);
    for (uint64_t seed = 0; seed < 20; seed++)
        CHECK_EQ_INT(pick1(b, 4, &s, seed), 1);
    float c[4] = {4, 0, NAN, 4};
    for (uint64_t seed = 0; seed < 50; seed++) /* token 1 has e^-4 of token 0's probability: min-p removes it */
        CHECK(pick1(c, 4, &mp, seed) != 1);
    float row[4] = {4, 0, NAN, 4};
    CHECK_RC(tk_gen__min_p(row, 4, 0.5, 1), TK_OK);
    CHECK(row[0] == 4 && row[1] == -INFINITY && row[3] == 4);
}

/* Sampling with +inf: softmax's limit, the +inf tokens share the probability equally and the others
 * have none; top-k counts +inf as the largest, top-p keeps as many of the +inf tokens as the mass needs
 * (the higher indices, as ties), min-p removes every finite token. */
static void test_sampling_plus_inf_is_the_limit(void)
{
    const popt s = {1, 0, 1.0, 0, 0, 0};
    float a[5] = {9, INFINITY, 2, INFINITY, 0};
    int seen[5] = {0};
    for (uint64_t seed = 0; seed < 64; seed++)
        seen[pick1(a, 5, &s, seed)]++;
    CHECK(seen[1] > 10 && seen[3] > 10 && seen[1] + seen[3] == 64);
    float row[5] = {9, INFINITY, 2, INFINITY, 0};
    CHECK_RC(tk_gen__top_p(row, 5, 0.5, 1), TK_OK); /* 1/2 each: the first +inf's cumulative 0.5 <= 1 - 0.5 */
    CHECK(row[0] == -INFINITY && row[1] == -INFINITY && row[2] == -INFINITY && row[3] == INFINITY);
    float r2[5] = {9, INFINITY, 2, INFINITY, 0};
    CHECK_RC(tk_gen__top_p(r2, 5, 0.6, 1), TK_OK);
    CHECK(r2[0] == -INFINITY && r2[1] == INFINITY && r2[3] == INFINITY);
    float r3[5] = {9, INFINITY, 2, NAN, 0};
    CHECK_RC(tk_gen__min_p(r3, 5, 0.01, 1), TK_OK);
    CHECK(r3[0] == -INFINITY && r3[1] == INFINITY && r3[2] == -INFINITY && r3[4] == -INFINITY);
}

/* Log-probabilities are torch's log_softmax: a NaN or a +inf makes every one NaN (no top ones: NaN is
 * skipped); -inf entries are -inf; a row of -inf is left as it is (torch: NaN). */
static void test_logprobs_are_torch_log_softmax(void)
{
    float a[4] = {1, NAN, 2, 0}, b[4] = {1, INFINITY, 2, 0}, c[4] = {1, -INFINITY, 2, -INFINITY};
    float d[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int32_t ids[4];
    float v[4];
    tk_gen__log_softmax(a, 4);
    tk_gen__log_softmax(b, 4);
    tk_gen__log_softmax(c, 4);
    tk_gen__log_softmax(d, 4);
    for (int i = 0; i < 4; i++)
        CHECK(isnan(a[i]) && isnan(b[i]) && d[i] == -INFINITY);
    CHECK_EQ_INT(tk_gen__top_logprobs(a, 4, 0, 4, ids, v), 0);
    CHECK(c[1] == -INFINITY && c[3] == -INFINITY && fabsf(c[2] - -0.31326166f) < 1e-6f);
    CHECK_EQ_INT(tk_gen__top_logprobs(c, 4, 0, 4, ids, v), 4);
    CHECK(ids[0] == 2 && ids[1] == 0 && ids[2] == 1 && ids[3] == 3);
}

/* ---- under mpirun: the ranks' pick against one process's ---- */

static tk_comm *wc;

static int same_f32(float a, float b) { return (isnan(a) && isnan(b)) || tk__f32_bits(a) == tk__f32_bits(b); }

/* 1 when the split's answer for row x (tok, lp) is one process's (want, wl); prints the first few that
 * are not (*nbad counts them). */
static int row_same(int64_t V, const float *x, const popt *o, int64_t tok, const tk_models_tp_lp *lp, int64_t want,
                    const tk_models_tp_lp *wl, int *nbad)
{
    int ok = tok == want;
    if (ok && o->lp && want >= 0) {
        ok = same_f32(lp->logprob, wl->logprob) && (o->top_n ? lp->ntop : 0) == wl->ntop;
        for (int j = 0; ok && j < wl->ntop; j++)
            ok = lp->top_ids[j] == wl->top_ids[j] && same_f32(lp->top_vals[j], wl->top_vals[j]);
    }
    if (ok || ++*nbad > 5)
        return ok;
    fprintf(stderr, "  rank %d, V %lld, row [", tk_comm_rank(wc), (long long)V);
    for (int64_t j = 0; j < V; j++)
        fprintf(stderr, "%s%g", j ? " " : "", x[j]);
    fprintf(stderr, "], sample %d top_k %lld top_p %g min_p %g logprobs %d: split %lld (%g), one process %lld (%g)\n",
            o->sample, (long long)o->top_k, o->top_p, o->min_p, o->lp, (long long)tok, o->lp ? lp->logprob : 0,
            (long long)want, o->lp && want >= 0 ? wl->logprob : 0);
    return ok;
}

/* torch.chunk's part of V for this rank. */
static void chunk(tk_models_tp *tp, int64_t V)
{
    int64_t c = (V + tp->world - 1) / tp->world;
    tp->vocab_off = (int64_t)tp->rank * c < V ? (int64_t)tp->rank * c : V;
    tp->vocab_len = V - tp->vocab_off < c ? V - tp->vocab_off : c;
}

/* Rows x[n][V] picked over the ranks in one step, row i with OPTS[oi[i]], against one process. */
static void pick_step(tk_model *m, const float *x, size_t n, const size_t *oi)
{
    int64_t V = m->cfg.vocab;
    float *rows = malloc(n * (size_t)V * sizeof *rows), *one = malloc(n * (size_t)V * sizeof *one);
    float **rp = calloc(n, sizeof *rp);
    tk_models_tp_pick *p = calloc(n, sizeof *p);
    tk_models_tp_lp *lp = calloc(n, sizeof *lp), wl;
    int64_t *tok = malloc(n * sizeof *tok);
    memcpy(rows, x, n * (size_t)V * sizeof *rows);
    memcpy(one, x, n * (size_t)V * sizeof *one);
    for (size_t i = 0; i < n; i++) {
        const popt *o = &OPTS[oi[i]];
        rp[i] = rows + i * (size_t)V;
        p[i] = (tk_models_tp_pick){o->sample,
                                   o->top_k,
                                   7 + i,
                                   3,
                                   o->sample ? o->top_p : 1.0,
                                   o->sample ? o->min_p : 0,
                                   o->lp ? x + i * (size_t)V : NULL,
                                   o->top_n};
    }
    CHECK_RC(tk_models__tp_pick(m, rp, n, p, tok, lp), TK_OK);
    int nbad = 0;
    for (size_t i = 0; i < n; i++) {
        const popt *o = &OPTS[oi[i]];
        int64_t want = one_pick(one + i * (size_t)V, x + i * (size_t)V, V, o, 7 + i, &wl);
        row_same(V, x + i * (size_t)V, o, tok[i], &lp[i], want, &wl, &nbad);
    }
    CHECK_EQ_INT(nbad, 0);
    free(rows);
    free(one);
    free(rp);
    free(p);
    free(lp);
    free(tok);
}

/* Every row with every option (a step a option), then a step mixing the options row by row. */
static void pick_vocab(tk_model *m)
{
    size_t n;
    float *x = all_rows(m->cfg.vocab, &n);
    size_t *oi = malloc(n * sizeof *oi);
    for (size_t o = 0; o < NOPTS; o++) {
        for (size_t i = 0; i < n; i++)
            oi[i] = o;
        pick_step(m, x, n, oi);
    }
    for (size_t i = 0; i < n; i++)
        oi[i] = (i * 7) % NOPTS;
    pick_step(m, x, n, oi);
    free(oi);
    free(x);
}

static void worker_model(tk_model *m, tk_models_tp *tp)
{
    memset(m, 0, sizeof *m);
    memset(tp, 0, sizeof *tp);
    tp->comm = wc;
    tp->rank = tk_comm_rank(wc);
    tp->world = tk_comm_size(wc);
    tp->head_split = 1;
    m->tp = tp;
}

static const int64_t VOCABS[] = {3, 4, 5, 7, 10};

/* fn over each vocabulary of VOCABS, split over the ranks as torch.chunk splits it */
static void each_vocab(void (*fn)(tk_model *))
{
    tk_model m;
    tk_models_tp tp;
    worker_model(&m, &tp);
    for (size_t v = 0; v < sizeof VOCABS / sizeof VOCABS[0]; v++) {
        m.cfg.vocab = VOCABS[v];
        chunk(&tp, VOCABS[v]);
        fn(&m);
    }
}

static void test_w_pick_equals_one_process(void) { each_vocab(pick_vocab); }

/* Top-p on a vocabulary of 1000 (more columns a rank than it sends in top-p's first round): peaked rows,
 * whose nucleus that round holds, and flat ones, which need the search, with ties, a +inf, many -inf;
 * both ways give one process's token, and both ways ran. */
static void test_w_top_p_union_and_search(void)
{
    tk_model m;
    tk_models_tp tp;
    worker_model(&m, &tp);
    int64_t V = 1000;
    m.cfg.vocab = V;
    chunk(&tp, V);
    static const float scale[] = {9.0f, 4.0f, 1.5f, 0.3f, 0.01f, 0};
    const size_t nr = sizeof scale / sizeof scale[0] + 3;
    float *x = malloc(nr * (size_t)V * sizeof *x);
    uint32_t st = 12345;
    for (size_t r = 0; r < nr; r++)
        for (int64_t i = 0; i < V; i++) {
            st = st * 1664525u + 1013904223u;
            float u = (float)(st >> 8) / 16777216.0f - 0.5f;
            float *y = x + r * (size_t)V;
            y[i] = r < nr - 3 ? scale[r] * u * u * u * 8 : (float)((int)(u * 8)) * 0.5f; /* the last 3: ties */
            if (r == nr - 2 && i % 3)
                y[i] = -INFINITY; /* two thirds of the row gone */
            if (r == nr - 1 && i == 700)
                y[i] = INFINITY; /* the whole mass on one token of the last rank */
        }
    size_t oi[sizeof scale / sizeof scale[0] + 3];
    static const size_t topp[] = {8, 9, 10, 13, 14, 15}; /* OPTS with top_p < 1 */
    for (size_t t = 0; t < sizeof topp / sizeof topp[0]; t++) {
        for (size_t r = 0; r < nr; r++)
            oi[r] = topp[(t + r) % (sizeof topp / sizeof topp[0])];
        pick_step(&m, x, nr, oi);
    }
    printf("top-p rows: %lld settled in one round, %lld searched\n", (long long)tp.topp_union_rows,
           (long long)tp.topp_search_rows);
    CHECK(tp.topp_union_rows > 0);
    CHECK(tp.topp_search_rows > 0);
    free(x);
}

static int nonfinite(const float *x, int64_t V)
{
    for (int64_t i = 0; i < V; i++)
        if (isnan(x[i]) || x[i] == INFINITY)
            return 1;
    return 0;
}

/* Beam search's log-softmax over the ranks: one process's values on this rank's columns; a row with a
 * NaN or a +inf is named (every rank the same first one), which beam search fails on. */
static void log_softmax_vocab(tk_model *m)
{
    int64_t V = m->cfg.vocab;
    size_t n, bad, first, nbad = 0;
    float *x = all_rows(V, &n), *one = malloc(n * (size_t)V * sizeof *one), **rp = calloc(n, sizeof *rp);
    memcpy(one, x, n * (size_t)V * sizeof *one);
    first = n;
    for (size_t i = 0; i < n; i++) {
        rp[i] = x + i * (size_t)V;
        if (first == n && nonfinite(one + i * (size_t)V, V))
            first = i;
    }
    CHECK_RC(tk_models__tp_log_softmax(m, rp, n, &bad), TK_OK);
    CHECK_EQ_INT(bad, first);
    memcpy(x, one, n * (size_t)V * sizeof *one);
    for (size_t i = 0; i < n; i++) {
        float *r = one + i * (size_t)V;
        CHECK_RC(tk_models__tp_log_softmax(m, &rp[i], 1, &bad), TK_OK);
        nbad += (bad == 0) != nonfinite(r, V); /* bad: 0 names the row, 1 (n) says it is finite */
        if (bad == 0)
            continue;
        tk_gen__log_softmax(r, V);
        for (int64_t j = m->tp->vocab_off; j < m->tp->vocab_off + m->tp->vocab_len; j++)
            nbad += !same_f32(rp[i][j], r[j]);
    }
    CHECK_EQ_INT(nbad, 0);
    free(x);
    free(one);
    free(rp);
}

static void test_w_log_softmax_equals_one_process(void) { each_vocab(log_softmax_vocab); }

static int worker(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    tk_comm_opts o = TK_COMM_OPTS_INIT;
    if (tk_comm_new(&wc, &o) != TK_OK || tk_comm_size(wc) < 2) {
        fprintf(stderr, "test_tp_pick --worker: want 2 or more ranks under mpirun: %s\n", tk_last_error());
        return 2;
    }
    printf("rank %d of %d\n", tk_comm_rank(wc), tk_comm_size(wc));
    RUN(test_w_pick_equals_one_process);
    RUN(test_w_log_softmax_equals_one_process);
    RUN(test_w_top_p_union_and_search);
    tk_comm_free(wc);
    return th_done();
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--worker"))
        return worker();
    RUN(test_greedy_is_torch_argmax);
    RUN(test_sampling_nan_is_minus_inf);
    RUN(test_sampling_plus_inf_is_the_limit);
    RUN(test_logprobs_are_torch_log_softmax);
    return th_done();
}
