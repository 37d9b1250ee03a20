/*
 * tp_pick.c — generation's final pick over a vocabulary-parallel LM head (docs/parallel.md): each rank
 * holds the logits of its vocabulary range only, and the ranks exchange a few numbers a row instead of
 * all-gathering the rows, yet pick the token one process picks over the whole row, bit for bit.
 *
 *   greedy:   each rank's best (argmax op's key: NaN above all; its lowest index on ties) is gathered;
 *             the largest key wins, the lowest rank (so the lowest index) on ties.
 *   sampling: the sample op at temperature 1 (generate.c already applied the processors) draws by
 *             inverse CDF over integer weights W = floor(e^(z - zmax) 2^32) (common/sample_math.h), so
 *             the mass is an exact integer sum whatever the order: gather each rank's largest key
 *             (zmax) and, for top-k, its k largest keys (the k-th largest of their union is the
 *             threshold transformers' filter uses); then each rank's mass; every rank computes the same
 *             target from the seeded Philox draw, and the rank whose range holds it finds the index.
 *
 * Three all-gathers for a whole step's rows (one when every row is greedy), of 3 + k, 1 and 1 i64 a
 * row a rank, where gathering the rows moves ceil(V / N) floats a row a rank.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/sample_math.h"
#include "models/models.h"
#include "models/tp_plan.h"

int tk_models__tp_vocab_parallel(const tk_model *m) { return m && m->tp && m->tp->world > 1 && m->tp->head_split; }

/* Sends n i64 from mine, receives world x n into all (rank-major); counts the bytes sent. */
static int gather_i64(tk_model *m, int64_t *all, int64_t *mine, size_t n, const char *what)
{
    int64_t s1[1] = {(int64_t)n}, sa[1] = {(int64_t)n * m->tp->world};
    tk_tensor tin = {mine, {TK_DEV_CPU, 0}, 1, {TK_DL_INT, 64, 1}, s1, NULL, 0};
    tk_tensor tout = {all, {TK_DEV_CPU, 0}, 1, {TK_DL_INT, 64, 1}, sa, NULL, 0};
    m->tp->head_bytes += (int64_t)(n * sizeof *mine);
    int rc = tk_comm_all_gather(m->tp->comm, &tout, &tin, NULL);
    return rc == TK_OK ? TK_OK
                       : tk__err_wrap(rc, "generate: gathering %s (rank %d of %d)", what, m->tp->rank, m->tp->world);
}

/* k as tk_gen__top_k takes it (at least 1), or 0 when the filter is off for a row of V. */
static int64_t top_k_of(const tk_models_tp_pick *p, int64_t V)
{
    if (!p->sample || p->top_k == 0)
        return 0;
    int64_t k = p->top_k < 1 ? 1 : p->top_k;
    return k >= V ? 0 : k;
}

int tk_models__tp_pick_cheaper(const tk_model *m, int sample, int64_t top_k)
{
    int64_t V = m->cfg.vocab, C = (V + m->tp->world - 1) / m->tp->world;
    tk_models_tp_pick p = {sample, top_k, 0, 0};
    int64_t pick = (3 + top_k_of(&p, V)) * 8 + (sample ? 16 : 0);
    return pick < C * (int64_t)sizeof(float);
}

/* The k largest keys of x[0..n) (NaN skipped, as the top-k filter skips it), descending, into out
 * [k] padded with -1; heap is scratch for k keys. */
static void local_top(int64_t *out, const float *x, int64_t n, int64_t k, uint32_t *heap)
{
    int64_t h = tk__top_keys(heap, x, n, k);
    for (int64_t i = 0; i < k; i++)
        out[i] = i < h ? (int64_t)heap[i] : -1; /* order does not matter: the union is sorted */
}

static int cmp_desc(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Round A's part of one row: [argmax key, its global index (-1: no columns), the largest sample key,
 * k top keys]. */
static void round_a(int64_t *o, const tk_models_tp *tp, const float *row, int64_t k, uint32_t *heap)
{
    const float *x = row + tp->vocab_off;
    int64_t n = tp->vocab_len, best = -1;
    uint32_t ak = 0, sk = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t a = tk__argmax_key(x[i]), s = tk__key_of(x[i]);
        if (best < 0 || a > ak)
            ak = a, best = i;
        if (s > sk)
            sk = s;
    }
    o[0] = ak;
    o[1] = best < 0 ? -1 : tp->vocab_off + best;
    o[2] = sk;
    if (k > 0)
        local_top(o + 3, x, n, k, heap);
}

/* After round A, for one row: the greedy token, or for a sampled row zmax's key and the top-k
 * threshold key (0: no filter); all[r * n * R + i * R ...] is rank r's part of row i. */
static void resolve_a(const int64_t *all, size_t n, size_t i, int64_t R, int W, int64_t k, int64_t *tok, uint32_t *kmax,
                      uint32_t *thr, int64_t *cand)
{
    int64_t best = -1, bk = -1;
    uint32_t mx = 0;
    for (int r = 0; r < W; r++) {
        const int64_t *o = all + ((size_t)r * n + i) * (size_t)R;
        if (o[1] >= 0 && o[0] > bk)
            bk = o[0], best = o[1];
        if ((uint32_t)o[2] > mx)
            mx = (uint32_t)o[2];
    }
    *tok = best;
    *kmax = mx;
    *thr = 0;
    if (k <= 0)
        return;
    int64_t c = 0;
    for (int r = 0; r < W; r++)
        for (int64_t j = 0; j < k; j++) {
            int64_t v = all[((size_t)r * n + i) * (size_t)R + 3 + (size_t)j];
            if (v >= 0)
                cand[c++] = v;
        }
    if (c < k)
        return; /* fewer than k scores that are not NaN: transformers' filter keeps them all */
    qsort(cand, (size_t)c, sizeof *cand, cmp_desc);
    *thr = (uint32_t)cand[k - 1];
}

/* This rank's mass of a sampled row (its columns below the threshold set to -inf first, as the top-k
 * filter sets them). */
static uint64_t local_mass(float *row, const tk_models_tp *tp, uint32_t thr, float zmax)
{
    float *x = row + tp->vocab_off;
    uint64_t mass = 0;
    for (int64_t i = 0; i < tp->vocab_len; i++) {
        if (x[i] == x[i] && tk__key_of(x[i]) < thr)
            x[i] = -INFINITY;
        mass += tk__weight_of(tk__float_of_key(tk__key_of(x[i])), zmax);
    }
    return mass;
}

/* The index of row's draw when it falls in this rank's range (target - before < the rank's mass). */
static int64_t local_draw(const float *row, const tk_models_tp *tp, uint64_t target, uint64_t before, float zmax)
{
    const float *x = row + tp->vocab_off;
    uint64_t acc = before;
    for (int64_t i = 0; i < tp->vocab_len; i++) {
        acc += tk__weight_of(tk__float_of_key(tk__key_of(x[i])), zmax);
        if (acc > target)
            return tp->vocab_off + i;
    }
    return -1;
}

typedef struct {
    int64_t *a, *all, *cand, *mine, *masses;
    uint32_t *kmax, *thr, *heap;
} pick_buf;

static void buf_free(pick_buf *b)
{
    free(b->a);
    free(b->all);
    free(b->cand);
    free(b->mine);
    free(b->masses);
    free(b->kmax);
    free(b->thr);
    free(b->heap);
}

/* Rounds B and C for the sampled rows: the masses, then the drawn indices from their owners. */
static int draw_rows(tk_model *m, pick_buf *b, float *const *rows, size_t n, const tk_models_tp_pick *p, int64_t *tok)
{
    const tk_models_tp *tp = m->tp;
    int W = tp->world, rc;
    for (size_t i = 0; i < n; i++)
        b->mine[i] =
            p[i].sample && tok[i] >= 0 ? (int64_t)local_mass(rows[i], tp, b->thr[i], tk__float_of_key(b->kmax[i])) : 0;
    if ((rc = gather_i64(m, b->masses, b->mine, n, "the sampling mass")) != TK_OK)
        return rc;
    for (size_t i = 0; i < n; i++) {
        b->mine[i] = -1;
        if (!p[i].sample || tok[i] < 0)
            continue;
        uint64_t total = 0, before = 0;
        for (int r = 0; r < W; r++)
            total += (uint64_t)b->masses[(size_t)r * n + i];
        uint64_t target = tk__mulhi64(tk__sample_draw(p[i].seed, 0, (uint64_t)p[i].offset), total);
        for (int r = 0; r < tp->rank; r++)
            before += (uint64_t)b->masses[(size_t)r * n + i];
        uint64_t own = (uint64_t)b->masses[(size_t)tp->rank * n + i];
        if (target >= before && target - before < own)
            b->mine[i] = local_draw(rows[i], tp, target, before, tk__float_of_key(b->kmax[i]));
    }
    if ((rc = gather_i64(m, b->all, b->mine, n, "the sampled token")) != TK_OK)
        return rc;
    for (size_t i = 0; i < n; i++) {
        if (!p[i].sample || tok[i] < 0)
            continue;
        tok[i] = -1;
        for (int r = 0; r < W; r++)
            if (b->all[(size_t)r * n + i] >= 0)
                tok[i] = b->all[(size_t)r * n + i];
    }
    return TK_OK;
}

int tk_models__tp_pick(tk_model *m, float *const *rows, size_t n, const tk_models_tp_pick *p, int64_t *tok)
{
    if (!tk_models__tp_vocab_parallel(m))
        return tk__err(TK_ERR_INTERNAL, "generate: a vocabulary-parallel pick without a split LM head");
    if (n == 0)
        return TK_OK;
    const tk_models_tp *tp = m->tp;
    int W = tp->world, any_sample = 0;
    int64_t V = m->cfg.vocab, K = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t k = top_k_of(&p[i], V);
        K = k > K ? k : K;
        any_sample |= p[i].sample;
    }
    int64_t R = 3 + K;
    pick_buf b = {0};
    b.a = malloc(n * (size_t)R * sizeof *b.a);
    b.all = malloc((size_t)W * n * (size_t)R * sizeof *b.all);
    b.cand = malloc((size_t)W * (size_t)(K + 1) * sizeof *b.cand);
    b.mine = malloc(n * sizeof *b.mine);
    b.masses = malloc((size_t)W * n * sizeof *b.masses);
    b.kmax = malloc(n * sizeof *b.kmax);
    b.thr = malloc(n * sizeof *b.thr);
    b.heap = malloc((size_t)(K + 1) * sizeof *b.heap);
    int rc = TK_OK;
    if (!b.a || !b.all || !b.cand || !b.mine || !b.masses || !b.kmax || !b.thr || !b.heap) {
        rc = tk__err(TK_ERR_NOMEM, "generate: out of memory picking %zu tokens", n);
        goto done;
    }
    for (size_t i = 0; i < n; i++)
        round_a(b.a + i * (size_t)R, tp, rows[i], top_k_of(&p[i], V), b.heap);
    if ((rc = gather_i64(m, b.all, b.a, n * (size_t)R, "the best logits")) != TK_OK)
        goto done;
    for (size_t i = 0; i < n; i++) {
        resolve_a(b.all, n, i, R, W, top_k_of(&p[i], V), &tok[i], &b.kmax[i], &b.thr[i], b.cand);
        if (p[i].sample && b.kmax[i] <= TK_KEY_NEG_INF)
            tok[i] = -1; /* the sample op's answer when nothing is above -inf */
    }
    if (any_sample)
        rc = draw_rows(m, &b, rows, n, p, tok);
done:
    buf_free(&b);
    return rc;
}
