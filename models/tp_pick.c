/*
 * tp_pick.c — generation's final pick over a vocabulary-parallel LM head (docs/parallel.md): each rank
 * holds the logits of its vocabulary range only, and the ranks exchange a few numbers a row instead of
 * all-gathering the rows, yet pick the token one process picks over the whole row, bit for bit, with
 * every processor transformers' generate() applies and the log-probabilities it reports.
 *
 *   greedy:   each rank's best (argmax op's key: NaN above all; its lowest index on ties) is gathered;
 *             the largest key wins, the lowest rank (so the lowest index) on ties.
 *   top-k:    each rank's k largest keys; the k-th largest of their union is the threshold
 *             transformers' filter uses (ties kept); each rank masks its columns below it.
 *   sums:     min-p, top-p and log_softmax need a row's softmax sum. One process (generate.c) adds the
 *             terms e in [0, 1] as integers floor(e 2^63) in 128 bits (tk_fsum, common/sample_math.h),
 *             so the ranks' partial sums, exchanged and added, are its sum to the bit, whatever the
 *             order; the row's maximum comes from the first round's keys.
 *   top-p:    one process removes the tokens whose exact cumulative probability in ascending order
 *             (key, index) is <= 1 - p, but the last; those are the tokens below U, the least (key,
 *             index) whose cumulative probability is above 1 - p. One round gathers each rank's exact
 *             total and its TOPP_C most likely tokens with their probabilities: where U lies among the
 *             tokens that round is sure to hold (top_p_union: a peaked row), it is found there;
 *             else 4 bits a round from the ranks' exact masses below 16 points (top_p_search).
 *   min-p:    the largest probability is 1 / sum, so the threshold test is each rank's own.
 *   sampling: the sample op at temperature 1 (generate.c already applied the other processors) draws by
 *             inverse CDF over integer weights W = floor(e^(z - zmax) 2^32), so the mass is an exact
 *             integer sum whatever the order: each rank's mass is gathered, every rank computes the
 *             same target from the seeded Philox draw, and the rank whose range holds it finds the index.
 *   logprobs: log_softmax of the raw row on each rank's columns with the row's maximum and exact sum;
 *             the picked token's value from its owner, and the top n of the ranks' top n.
 *   beams:    tk_models__tp_log_softmax gives generate.c's beam search the rows' log-softmax on each
 *             rank's columns, and the first row holding a NaN or a +inf, which beam search fails on; it
 *             exchanges each rank's best candidates itself (tk_models__tp_gather_i64).
 *   NaN, inf: greedy ranks NaN above +inf (torch.argmax); top-k, top-p, min-p and the draw count NaN as
 *             -inf and take a +inf row's softmax as its limit (tk_gen__softmax_term, one process's
 *             function); log-probabilities are NaN with a NaN or a +inf (docs/parallel.md).
 *
 * All-gathers for a whole step's rows: one when every row is greedy; else the first round (3 + k i64 a
 * row a rank, one more with log-probabilities, one more with top-p), the sums (6), top-p's union (2 + 2
 * TOPP_C) and, when a row's U is not in it, the search (ceil((32 + bits(V - 1)) / 4) rounds of 32), then
 * the sums (6) again when a row has both top-p and min-p), the masses
 * (1), the drawn tokens (1, plus 1 + n with log-probabilities) — every row at the step's widest record —
 * where gathering the rows moves ceil(V / N) floats a row a rank. generate.c gathers instead when that is
 * fewer bytes (tk_models__tp_pick_cheaper; TK_TP_PICK forces either).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/sample_math.h"
#include "models/generate.h"
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

static int top_n_of(const tk_models_tp_pick *p)
{
    return !p->raw || p->top_n <= 0 ? 0 : p->top_n > TK_GEN_MAX_TOP_LOGPROBS ? TK_GEN_MAX_TOP_LOGPROBS : p->top_n;
}

/* Bits of a vocabulary index, and the rounds of top-p's threshold search: 4 bits of the composite
 * (key << ib | index) a round (top_p_search). */
static int index_bits(int64_t V)
{
    int b = 1;
    while (b < 62 && ((int64_t)1 << b) < V)
        b++;
    return b;
}

static int search_rounds(int64_t V) { return (32 + index_bits(V) + 3) / 4; }

/* The tokens a rank sends in top-p's first round (top_p_union): enough for the nucleus of a peaked row
 * (temperature below 1, top_p 0.9) in one all-gather where the search takes a dozen. */
#define TOPP_C 64
#define UNION_R (2 + 2 * TOPP_C)

/* Bytes a rank sends for the row in each round (tk_models__tp_pick, below). */
static int64_t pick_bytes(const tk_models_tp_pick *p, int64_t V)
{
    int lp = p->raw != NULL, minp = p->sample && p->min_p > 0, topp = p->sample && p->top_p < 1.0;
    int64_t b = (3 + lp + topp + top_k_of(p, V)) * 8;
    b += lp || minp || topp ? 48 : 0;
    /* the union, the search when it does not settle the row (the worst case), round S again (6 i64) for
     * min-p after top-p */
    b += topp ? UNION_R * 8 + search_rounds(V) * 256 + (minp ? 48 : 0) : 0;
    b += p->sample ? 8 : 0;
    b += p->sample || lp ? (1 + lp * (1 + top_n_of(p))) * 8 : 0;
    return b;
}

int tk_models__tp_pick_cheaper(const tk_model *m, const tk_models_tp_pick *p, size_t n)
{
    /* a step's rounds send every row the widest row's record (round A's slots, round S, the search
     * rounds), so each row costs what the row of every option the step's rows use would */
    static const float some_row = 0;
    int64_t V = m->cfg.vocab, C = (V + m->tp->world - 1) / m->tp->world;
    tk_models_tp_pick w = {0, 0, 0, 0, 1.0, 0, NULL, 0};
    for (size_t i = 0; i < n; i++) {
        if (p[i].sample) {
            int64_t k = top_k_of(&p[i], V);
            w.sample = 1;
            w.top_k = k > w.top_k ? k : w.top_k;
            w.top_p = p[i].top_p < w.top_p ? p[i].top_p : w.top_p;
            w.min_p = p[i].min_p > w.min_p ? p[i].min_p : w.min_p;
        }
        if (p[i].raw) {
            w.raw = &some_row;
            w.top_n = top_n_of(&p[i]) > w.top_n ? top_n_of(&p[i]) : w.top_n;
        }
    }
    return pick_bytes(&w, V) < C * (int64_t)sizeof(float);
}

static int cmp_desc(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The step's shapes: L (any row wants log-probabilities), K (largest top-k), N (largest top_n), P (any
 * top-p) with ib (index_bits), and the per-row record lengths of rounds A and C. */
typedef struct {
    int L, N, P, ib, any_sample, any_sum, any_pm; /* P: any row has top-p; any_pm: top-p with min-p */
    int64_t K, RA, RC;
} pick_shape;

/* top-p's sort key of a score at global index g: ascending by value (NaN as -inf), ties by index. */
static uint64_t comp_of(float x, int64_t g, int ib) { return ((uint64_t)tk__key_of(x) << ib) | (uint64_t)g; }

/* Round A's part of one row: [argmax key, its global index (-1: no columns), the largest sample key,
 * (L) the raw row's largest key, (P) the largest comp_of, K top keys]. */
static void round_a(int64_t *o, const tk_models_tp *tp, const float *row, const float *raw, const pick_shape *sh,
                    int64_t k, uint32_t *heap)
{
    const float *x = row + tp->vocab_off;
    int64_t n = tp->vocab_len, best = -1;
    uint32_t ak = 0, sk = 0, rk = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t a = tk__argmax_key(x[i]), s = tk__key_of(x[i]);
        if (best < 0 || a > ak)
            ak = a, best = i;
        if (s > sk)
            sk = s;
    }
    for (int64_t i = 0; raw && i < n; i++)
        if (tk__key_of(raw[tp->vocab_off + i]) > rk)
            rk = tk__key_of(raw[tp->vocab_off + i]);
    o[0] = ak;
    o[1] = best < 0 ? -1 : tp->vocab_off + best;
    o[2] = sk;
    if (sh->L)
        o[3] = rk;
    if (sh->P) {
        o[3 + sh->L] = -1;
        for (int64_t i = 0; i < n; i++)
            if ((int64_t)comp_of(x[i], tp->vocab_off + i, sh->ib) > o[3 + sh->L])
                o[3 + sh->L] = (int64_t)comp_of(x[i], tp->vocab_off + i, sh->ib);
    }
    int64_t h = k > 0 ? tk__top_keys(heap, x, n, k) : 0;
    for (int64_t i = 0; i < sh->K; i++) /* order does not matter: the union is sorted */
        o[3 + sh->L + sh->P + i] = i < h ? (int64_t)heap[i] : -1;
}

/* Per-row results between the rounds. */
typedef struct {
    uint32_t kmax, thr, rmax; /* the processed row's largest key, top-k's threshold key (0: none), the raw's */
    float lse, inv, inv_p;    /* log_softmax's log-sum (raw row), min-p's and top-p's 1 / sum */
    int64_t maxcomp;          /* top-p: the row's largest comp_of (its last in sorted order) */
    uint64_t cut;             /* top-p: the least comp_of whose cumulative probability is above 1 - p */
    int none;                 /* top-p: none is: every cumulative probability is <= 1 - p */
    int found;                /* top-p: cut (or none) is settled; the search skips the row */
} row_st;

/* After round A, for one row: the greedy token and st's keys; all[r * n * R + i * R ...] is rank r's part
 * of row i. The k-th largest of the ranks' top keys is transformers' top-k threshold. */
static void resolve_a(const int64_t *all, size_t n, size_t i, const pick_shape *sh, int W, int64_t k, int64_t *tok,
                      row_st *st, int64_t *cand)
{
    int64_t best = -1, bk = -1, R = sh->RA;
    uint32_t mx = 0, rmx = 0;
    for (int r = 0; r < W; r++) {
        const int64_t *o = all + ((size_t)r * n + i) * (size_t)R;
        if (o[1] >= 0 && o[0] > bk)
            bk = o[0], best = o[1];
        if ((uint32_t)o[2] > mx)
            mx = (uint32_t)o[2];
        if (sh->L && (uint32_t)o[3] > rmx)
            rmx = (uint32_t)o[3];
        if (sh->P && (r == 0 || o[3 + sh->L] > st->maxcomp))
            st->maxcomp = o[3 + sh->L];
    }
    *tok = best;
    st->kmax = mx;
    st->rmax = rmx;
    st->thr = 0;
    if (k <= 0)
        return;
    int64_t c = 0;
    for (int r = 0; r < W; r++)
        for (int64_t j = 0; j < k; j++) {
            int64_t v = all[((size_t)r * n + i) * (size_t)R + 3 + sh->L + sh->P + (size_t)j];
            if (v >= 0)
                cand[c++] = v;
        }
    if (c < k)
        return; /* fewer than k scores that are not NaN: transformers' filter keeps them all */
    qsort(cand, (size_t)c, sizeof *cand, cmp_desc);
    st->thr = (uint32_t)cand[k - 1];
}

/* This rank's mass of a sampled row (already filtered). */
static uint64_t local_mass(const float *row, const tk_models_tp *tp, float zmax)
{
    const float *x = row + tp->vocab_off;
    uint64_t mass = 0;
    for (int64_t i = 0; i < tp->vocab_len; i++)
        mass += tk__weight_of(tk__float_of_key(tk__key_of(x[i])), zmax);
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
    row_st *st;
    uint32_t *heap;
    float *lpv; /* one row's log-probabilities over this rank's columns */
} pick_buf;

static void buf_free(pick_buf *b)
{
    free(b->a);
    free(b->all);
    free(b->cand);
    free(b->mine);
    free(b->masses);
    free(b->st);
    free(b->heap);
    free(b->lpv);
}

static void fsum_put(int64_t *o, const tk_fsum *s)
{
    o[0] = s->nan ? -1 : (int64_t)s->hi;
    o[1] = (int64_t)s->lo;
}

/* The ranks' parts of a sum (at stride R), added in rank order (any order gives the same integer). */
static tk_fsum fsum_get(const int64_t *all, size_t R, int W)
{
    tk_fsum t = {0};
    for (int r = 0; r < W; r++) {
        const int64_t *o = all + (size_t)r * R;
        tk_fsum p = {(uint64_t)o[0], (uint64_t)o[1], o[0] < 0};
        if (p.nan)
            p.hi = 0;
        tk__fsum_merge(&t, &p);
    }
    return t;
}

static int use_top_p(const tk_models_tp_pick *p, int64_t tok) { return p->sample && p->top_p < 1.0 && tok >= 0; }
static int use_min_p(const tk_models_tp_pick *p, int64_t tok) { return p->sample && p->min_p > 0 && tok >= 0; }

/* Min-p on this rank's columns of a row whose softmax has maximum zm and 1 / sum inv: removes
 * term * inv < min_p * top (tk_gen__softmax_term's term: a NaN's is 0, and with a +inf in the row 1 for
 * each +inf, 0 for the rest), where top, the largest probability, is 1 * inv (the maximum's term is 1 and
 * every other term is at most 1). Its min_keep 1 keeps that maximum, which min_p <= 1 never removes
 * anyway. */
static void mask_min_p(float *row, const tk_models_tp *tp, double min_p, float zm, float inv)
{
    float *x = row + tp->vocab_off, thr = (float)min_p * inv;
    for (int64_t j = 0; j < tp->vocab_len; j++)
        if (tk_gen__softmax_term(x[j], zm) * inv < thr)
            x[j] = -INFINITY;
}

/* Round S: the rows' softmax sums over the ranks, each an exact integer (tk_fsum), so one process's sum:
 * m is the row's largest (from round A's keys), so each rank's terms are one process's terms of its
 * columns. First (second 0): the raw rows' log-softmax sums, top-p's, and min-p's for the rows without
 * top-p, whose filter then runs; second: min-p's for the rows that ran top-p first (top-p's and min-p's
 * sums are the same on the row they see: tk_gen__softmax_term counts a NaN as -inf). */
static int round_s(tk_model *m, pick_buf *b, float *const *rows, size_t n, const tk_models_tp_pick *p,
                   const int64_t *tok, int second)
{
    const tk_models_tp *tp = m->tp;
    for (size_t i = 0; i < n; i++) {
        tk_fsum lp = {0}, mp = {0}, pp = {0};
        float rm = tk__float_of_key(b->st[i].rmax), zm = tk__float_of_key(b->st[i].kmax);
        const float *x = rows[i] + tp->vocab_off;
        if (!second && p[i].raw && rm != -INFINITY)
            tk_gen__lse_terms(&lp, p[i].raw + tp->vocab_off, tp->vocab_len, rm);
        if (use_min_p(&p[i], tok[i]) && second == use_top_p(&p[i], tok[i]))
            tk_gen__softmax_terms(&mp, x, tp->vocab_len, zm);
        if (!second && use_top_p(&p[i], tok[i]))
            tk_gen__softmax_terms(&pp, x, tp->vocab_len, zm);
        fsum_put(b->mine + 6 * i, &lp);
        fsum_put(b->mine + 6 * i + 2, &mp);
        fsum_put(b->mine + 6 * i + 4, &pp);
    }
    int rc = gather_i64(m, b->all, b->mine, 6 * n, "the softmax sums");
    if (rc != TK_OK)
        return rc;
    for (size_t i = 0; i < n; i++) {
        const int64_t *a = b->all + 6 * i;
        tk_fsum lp = fsum_get(a, 6 * n, tp->world), mp = fsum_get(a + 2, 6 * n, tp->world);
        tk_fsum pp = fsum_get(a + 4, 6 * n, tp->world);
        if (!second) {
            b->st[i].lse = (float)log(tk__fsum_value(&lp));
            b->st[i].inv_p = tk_gen__softmax_inv(&pp);
        }
        if (use_min_p(&p[i], tok[i]) && second == use_top_p(&p[i], tok[i]))
            mask_min_p(rows[i], tp, p[i].min_p, tk__float_of_key(b->st[i].kmax), tk_gen__softmax_inv(&mp));
    }
    return TK_OK;
}

/* top-p's probability of a score: softmax_f32's (a NaN's is 0; with a +inf, 1 / n for each of the n +inf). */
static float top_p_prob(float x, float zm, float inv) { return tk_gen__softmax_term(x, zm) * inv; }

/* One round of top-p's threshold search on row i, this rank's part into o[0..32): for the 16 points
 * c_d = st->cut + ((d + 1) << shift) - 1, the exact mass of its columns with comp_of <= c_d. */
static void search_part(int64_t *o, const float *row, const tk_models_tp *tp, const row_st *st, int shift, int ib)
{
    tk_fsum acc[16] = {{0}}, below = {0};
    const float *x = row + tp->vocab_off;
    float zm = tk__float_of_key(st->kmax);
    for (int64_t j = 0; j < tp->vocab_len; j++) {
        uint64_t c = comp_of(x[j], tp->vocab_off + j, ib);
        if (c < st->cut)
            tk__fsum_add(&below, top_p_prob(x[j], zm, st->inv_p));
        else if ((c - st->cut) >> shift < 16)
            tk__fsum_add(&acc[(c - st->cut) >> shift], top_p_prob(x[j], zm, st->inv_p));
    }
    for (int d = 0; d < 16; d++) {
        tk__fsum_merge(&below, &acc[d]);
        fsum_put(o + 2 * d, &below);
    }
}

/* a - b of exact sums (b <= a) */
static tk_fsum fsum_sub(tk_fsum a, const tk_fsum *b)
{
    uint64_t lo = a.lo - b->lo;
    a.hi = a.hi - b->hi - (a.lo < b->lo);
    a.lo = lo;
    return a;
}

static void heap_down(uint64_t *h, int64_t n, int64_t i)
{
    for (;;) {
        int64_t l = 2 * i + 1, m = i;
        if (l < n && h[l] < h[m])
            m = l;
        if (l + 1 < n && h[l + 1] < h[m])
            m = l + 1;
        if (m == i)
            return;
        uint64_t t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

/* This rank's part of top_p_union for a row, into o[0 .. UNION_R): its exact total probability, then
 * its TOPP_C largest comp_of, largest first, each with its probability's bits (-1 padded). */
static void union_part(int64_t *o, const float *row, const tk_models_tp *tp, const row_st *st, int ib)
{
    const float *x = row + tp->vocab_off;
    float zm = tk__float_of_key(st->kmax);
    uint64_t heap[TOPP_C];
    int64_t h = 0;
    tk_fsum tot = {0};
    for (int64_t j = 0; j < tp->vocab_len; j++) {
        tk__fsum_add(&tot, top_p_prob(x[j], zm, st->inv_p));
        uint64_t c = comp_of(x[j], tp->vocab_off + j, ib);
        if (h < TOPP_C) { /* a min-heap of the largest so far */
            heap[h++] = c;
            for (int64_t i = h - 1; i > 0 && heap[(i - 1) / 2] > heap[i]; i = (i - 1) / 2) {
                uint64_t t = heap[i];
                heap[i] = heap[(i - 1) / 2];
                heap[(i - 1) / 2] = t;
            }
        } else if (c > heap[0]) {
            heap[0] = c;
            heap_down(heap, h, 0);
        }
    }
    fsum_put(o, &tot);
    qsort(heap, (size_t)h, sizeof *heap, cmp_desc); /* comp_of < 2^63: ordered as int64 */
    for (int64_t k = 0; k < TOPP_C; k++) {
        float pr = 0;
        uint32_t bits = 0;
        if (k < h)
            pr = top_p_prob(x[(int64_t)(heap[k] & ((1ull << ib) - 1)) - tp->vocab_off], zm, st->inv_p);
        memcpy(&bits, &pr, sizeof bits);
        o[2 + 2 * k] = k < h ? (int64_t)heap[k] : -1;
        o[3 + 2 * k] = bits;
    }
}

/* Row i's U (st->cut, or st->none) from the union round, when the ranks' tokens settle it: every token
 * at or above B, the largest of the full ranks' least sent comp_of, is among them, so walking them
 * from the most likely down, the mass at or below each is the exact total less those above it (the
 * search's integers exactly). 0 when U lies below B, st untouched: the search finds it. cand: W TOPP_C
 * pairs. */
static int union_resolve(const int64_t *all, size_t n, size_t i, int W, float cut, row_st *st, int64_t *cand)
{
    tk_fsum tot = fsum_get(all + i * UNION_R, n * UNION_R, W), above = {0}, at;
    int64_t B = -1, m = 0, j = 0;
    for (int r = 0; r < W; r++) {
        const int64_t *o = all + ((size_t)r * n + i) * UNION_R;
        B = o[2 + 2 * (TOPP_C - 1)] > B ? o[2 + 2 * (TOPP_C - 1)] : B; /* -1 where the rank sent all it has */
        for (int k = 0; k < TOPP_C && o[2 + 2 * k] >= 0; k++, m++)
            cand[2 * m] = o[2 + 2 * k], cand[2 * m + 1] = o[3 + 2 * k];
    }
    qsort(cand, (size_t)m, 2 * sizeof *cand, cmp_desc); /* pairs by their comp_of */
    for (; j < m && cand[2 * j] >= B; j++) {
        at = fsum_sub(tot, &above); /* the mass at or below token j */
        if ((float)tk__fsum_value(&at) <= cut)
            break;
        uint32_t bits = (uint32_t)cand[2 * j + 1];
        float pr;
        memcpy(&pr, &bits, sizeof pr);
        tk__fsum_add(&above, pr);
    }
    /* stopped at token j (its mass at or below is <= 1 - p: U is the token before it), or past the last
     * token walked, whose U it is when the mass below it is <= 1 - p too */
    int settled = j < m && cand[2 * j] >= B;
    if (!settled) {
        at = fsum_sub(tot, &above);
        settled = j > 0 && (float)tk__fsum_value(&at) <= cut;
    }
    if (settled) {
        st->none = j == 0; /* even the whole mass is <= 1 - p */
        st->cut = j ? (uint64_t)cand[2 * (j - 1)] : 0;
    }
    return settled;
}

/* top-p's first round: every row whose U the ranks' most likely tokens settle is found (st->found). */
static int top_p_union(tk_model *m, pick_buf *b, float *const *rows, size_t n, const tk_models_tp_pick *p,
                       const int64_t *tok, int ib, int *left)
{
    tk_models_tp *tp = m->tp;
    for (size_t i = 0; i < n; i++) {
        memset(b->mine + UNION_R * i, 0xff, UNION_R * sizeof *b->mine);
        if (use_top_p(&p[i], tok[i]))
            union_part(b->mine + UNION_R * i, rows[i], tp, &b->st[i], ib);
    }
    int rc = gather_i64(m, b->all, b->mine, UNION_R * n, "top-p's most likely tokens");
    if (rc != TK_OK)
        return rc;
    *left = 0;
    for (size_t i = 0; i < n; i++) {
        if (!use_top_p(&p[i], tok[i]))
            continue;
        b->st[i].found = union_resolve(b->all, n, i, tp->world, (float)(1.0 - p[i].top_p), &b->st[i], b->cand);
        *left += !b->st[i].found;
        tp->topp_union_rows += b->st[i].found;
        tp->topp_search_rows += !b->st[i].found;
    }
    return TK_OK;
}

/* Top-p over the ranks. One process sorts the row ascending (comp_of's order), removes each token whose
 * cumulative probability, an exact prefix sum (tk_gen__top_p), is <= 1 - p, and keeps the last. The
 * cumulative probability only grows along that order, so the removed tokens are those below U, the
 * least comp_of (an integer of 32 + ib bits) whose cumulative mass is above 1 - p; the ranks find U 4 bits
 * a round, from each rank's exact masses below 16 points (search_part): ceil((32 + ib) / 4) all-gathers of
 * 32 i64 a row. Then each rank removes its columns below U, except the row's largest comp_of. */
static int top_p_search(tk_model *m, pick_buf *b, float *const *rows, size_t n, const tk_models_tp_pick *p,
                        const int64_t *tok, int ib)
{
    const tk_models_tp *tp = m->tp;
    int rc, W = tp->world, left = 0;
    for (size_t i = 0; i < n; i++)
        b->st[i].cut = 0, b->st[i].none = 0, b->st[i].found = 0;
    if ((rc = top_p_union(m, b, rows, n, p, tok, ib, &left)) != TK_OK)
        return rc;
    for (int shift = (32 + ib + 3) / 4 * 4 - 4; left && shift >= 0; shift -= 4) {
        for (size_t i = 0; i < n; i++) {
            memset(b->mine + 32 * i, 0, 32 * sizeof *b->mine);
            if (use_top_p(&p[i], tok[i]) && !b->st[i].none && !b->st[i].found)
                search_part(b->mine + 32 * i, rows[i], tp, &b->st[i], shift, ib);
        }
        if ((rc = gather_i64(m, b->all, b->mine, 32 * n, "top-p's masses")) != TK_OK)
            return rc;
        for (size_t i = 0; i < n; i++) {
            if (!use_top_p(&p[i], tok[i]) || b->st[i].none || b->st[i].found)
                continue;
            float cut = (float)(1.0 - p[i].top_p);
            int d = 0;
            for (; d < 16; d++) {
                tk_fsum s = fsum_get(b->all + 32 * i + 2 * d, 32 * n, W);
                if (!((float)tk__fsum_value(&s) <= cut))
                    break;
            }
            if (d == 16)
                b->st[i].none = 1; /* only in the first round: its last point is past every token */
            else
                b->st[i].cut += (uint64_t)d << shift;
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (!use_top_p(&p[i], tok[i]))
            continue;
        float *x = rows[i] + tp->vocab_off;
        for (int64_t j = 0; j < tp->vocab_len; j++) {
            uint64_t c = comp_of(x[j], tp->vocab_off + j, ib);
            if ((b->st[i].none || c < b->st[i].cut) && (int64_t)c != b->st[i].maxcomp)
                x[j] = -INFINITY;
        }
    }
    return TK_OK;
}

/* Round B for the sampled rows: the masses; then this rank's draw, where it falls in its range, into
 * b->mine[i * RC] (else -1). */
static int round_b(tk_model *m, pick_buf *b, float *const *rows, size_t n, const tk_models_tp_pick *p,
                   const int64_t *tok, const pick_shape *sh)
{
    const tk_models_tp *tp = m->tp;
    int W = tp->world, rc;
    for (size_t i = 0; i < n; i++)
        b->mine[i] = p[i].sample && tok[i] >= 0 ? (int64_t)local_mass(rows[i], tp, tk__float_of_key(b->st[i].kmax)) : 0;
    if ((rc = gather_i64(m, b->masses, b->mine, n, "the sampling mass")) != TK_OK)
        return rc;
    for (size_t i = 0; i < n; i++) {
        int64_t *o = b->mine + i * (size_t)sh->RC;
        o[0] = -1;
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
            o[0] = local_draw(rows[i], tp, target, before, tk__float_of_key(b->st[i].kmax));
    }
    return TK_OK;
}

/* Round C's log-probability part of row i into o[1..): log_softmax of the rank's raw columns (one
 * process's values: (x - m) - lse with the row's m and lse), the picked token's from its owner (else -1),
 * and the rank's top N as (id << 32 | bits), -1 padded. t: the token if known here (greedy, or this
 * rank's draw), else -1. */
static void lp_part(int64_t *o, pick_buf *b, const tk_models_tp *tp, const tk_models_tp_pick *p, const row_st *st,
                    int64_t t, int N)
{
    float rm = tk__float_of_key(st->rmax);
    const float *x = p->raw + tp->vocab_off;
    for (int64_t j = 0; j < tp->vocab_len; j++)
        b->lpv[j] = rm == -INFINITY ? x[j] : (x[j] - rm) - st->lse;
    o[1] =
        t >= tp->vocab_off && t < tp->vocab_off + tp->vocab_len ? (int64_t)tk__f32_bits(b->lpv[t - tp->vocab_off]) : -1;
    int32_t ids[TK_GEN_MAX_TOP_LOGPROBS];
    float vals[TK_GEN_MAX_TOP_LOGPROBS];
    int k = tk_gen__top_logprobs(b->lpv, tp->vocab_len, tp->vocab_off, top_n_of(p), ids, vals);
    for (int j = 0; j < N; j++)
        o[2 + j] = j < k ? ((int64_t)ids[j] << 32) | tk__f32_bits(vals[j]) : -1;
}

/* The ranks' top candidates of row i merged as tk_gen__top_logprobs orders them (value descending, the
 * lower id on ties): each rank sent its own top N, so the row's top N are among them. */
static void lp_merge(tk_models_tp_lp *out, const int64_t *all, size_t n, size_t i, const pick_shape *sh, int W, int N)
{
    out->ntop = 0;
    out->logprob = NAN;
    for (int r = 0; r < W; r++) {
        const int64_t *o = all + ((size_t)r * n + i) * (size_t)sh->RC;
        if (o[1] >= 0)
            out->logprob = tk__bits_f32((uint32_t)o[1]);
        for (int j = 0; j < sh->N && N > 0; j++) {
            if (o[2 + j] < 0)
                continue;
            float v = tk__bits_f32((uint32_t)o[2 + j]);
            int32_t id = (int32_t)(o[2 + j] >> 32);
            int q = out->ntop;
            if (q == N && !(v > out->top_vals[N - 1] || (v == out->top_vals[N - 1] && id < out->top_ids[N - 1])))
                continue;
            q = q < N ? out->ntop++ : N - 1;
            for (; q > 0 && (v > out->top_vals[q - 1] || (v == out->top_vals[q - 1] && id < out->top_ids[q - 1]));
                 q--) {
                out->top_vals[q] = out->top_vals[q - 1];
                out->top_ids[q] = out->top_ids[q - 1];
            }
            out->top_vals[q] = v;
            out->top_ids[q] = id;
        }
    }
}

/* Round C: the drawn tokens from their owners, with the log-probabilities (lp_part) when wanted. */
static int round_c(tk_model *m, pick_buf *b, size_t n, const tk_models_tp_pick *p, int64_t *tok, tk_models_tp_lp *lp,
                   const pick_shape *sh)
{
    const tk_models_tp *tp = m->tp;
    int W = tp->world, rc;
    for (size_t i = 0; i < n; i++) {
        int64_t *o = b->mine + i * (size_t)sh->RC;
        if (!p[i].sample || tok[i] < 0)
            o[0] = -1;
        if (!sh->L)
            continue;
        for (int j = 1; j < 2 + sh->N; j++)
            o[j] = -1;
        if (p[i].raw && tok[i] >= 0)
            lp_part(o, b, tp, &p[i], &b->st[i], p[i].sample ? o[0] : tok[i], sh->N);
    }
    if ((rc = gather_i64(m, b->all, b->mine, n * (size_t)sh->RC, "the sampled tokens")) != TK_OK)
        return rc;
    for (size_t i = 0; i < n; i++) {
        if (p[i].sample && tok[i] >= 0) {
            tok[i] = -1;
            for (int r = 0; r < W; r++)
                if (b->all[((size_t)r * n + i) * (size_t)sh->RC] >= 0)
                    tok[i] = b->all[((size_t)r * n + i) * (size_t)sh->RC];
        }
        if (p[i].raw && tok[i] >= 0)
            lp_merge(&lp[i], b->all, n, i, sh, W, top_n_of(&p[i]));
    }
    return TK_OK;
}

static pick_shape shape_of(const tk_models_tp_pick *p, size_t n, int64_t V)
{
    pick_shape sh = {0};
    for (size_t i = 0; i < n; i++) {
        int64_t k = top_k_of(&p[i], V);
        sh.K = k > sh.K ? k : sh.K;
        sh.N = top_n_of(&p[i]) > sh.N ? top_n_of(&p[i]) : sh.N;
        sh.L |= p[i].raw != NULL;
        sh.any_sample |= p[i].sample;
        sh.P |= p[i].sample && p[i].top_p < 1.0;
        sh.any_pm |= p[i].sample && p[i].top_p < 1.0 && p[i].min_p > 0;
        sh.any_sum |= p[i].raw || (p[i].sample && (p[i].min_p > 0 || p[i].top_p < 1.0));
    }
    sh.ib = index_bits(V);
    sh.RA = 3 + sh.L + sh.P + sh.K;
    sh.RC = 1 + sh.L * (1 + sh.N);
    return sh;
}

static int buf_alloc(pick_buf *b, size_t n, int W, const pick_shape *sh, int64_t cols)
{
    size_t R = (size_t)sh->RA > 32 ? (size_t)sh->RA : 32; /* round S: 6 a row; top-p's search: 32 */
    R = R > (size_t)sh->RC ? R : (size_t)sh->RC;
    R = sh->P && R < UNION_R ? UNION_R : R; /* top-p's union */
    b->a = malloc(n * R * sizeof *b->a);
    b->all = malloc((size_t)W * n * R * sizeof *b->all);
    size_t nc = (size_t)(sh->K + 1) > 2 * TOPP_C ? (size_t)(sh->K + 1) : 2 * TOPP_C;
    b->cand = malloc((size_t)W * nc * sizeof *b->cand);
    b->mine = malloc(n * R * sizeof *b->mine);
    b->masses = malloc((size_t)W * n * sizeof *b->masses);
    b->st = calloc(n, sizeof *b->st);
    b->heap = malloc((size_t)(sh->K + 1) * sizeof *b->heap);
    b->lpv = malloc(((size_t)cols + 1) * sizeof *b->lpv);
    return b->a && b->all && b->cand && b->mine && b->masses && b->st && b->heap && b->lpv;
}

/* The rows' top-k filter on this rank's columns: keys below the threshold go to -inf (NaN stays), as
 * tk_gen__top_k's `s < thr`. */
static void mask_top_k(float *row, const tk_models_tp *tp, uint32_t thr)
{
    float *x = row + tp->vocab_off;
    for (int64_t i = 0; thr && i < tp->vocab_len; i++)
        if (x[i] == x[i] && tk__key_of(x[i]) < thr)
            x[i] = -INFINITY;
}

int tk_models__tp_pick(tk_model *m, float *const *rows, size_t n, const tk_models_tp_pick *p, int64_t *tok,
                       tk_models_tp_lp *lp)
{
    if (!tk_models__tp_vocab_parallel(m))
        return tk__err(TK_ERR_INTERNAL, "generate: a vocabulary-parallel pick without a split LM head");
    if (n == 0)
        return TK_OK;
    const tk_models_tp *tp = m->tp;
    int64_t V = m->cfg.vocab;
    pick_shape sh = shape_of(p, n, V);
    if (sh.L && !lp)
        return tk__err(TK_ERR_INTERNAL, "generate: log-probabilities wanted without room for them");
    pick_buf b = {0};
    int rc = TK_OK;
    if (!buf_alloc(&b, n, tp->world, &sh, tp->vocab_len)) {
        rc = tk__err(TK_ERR_NOMEM, "generate: out of memory picking %zu tokens", n);
        goto done;
    }
    for (size_t i = 0; i < n; i++)
        round_a(b.a + i * (size_t)sh.RA, tp, rows[i], p[i].raw, &sh, top_k_of(&p[i], V), b.heap);
    if ((rc = gather_i64(m, b.all, b.a, n * (size_t)sh.RA, "the best logits")) != TK_OK)
        goto done;
    for (size_t i = 0; i < n; i++) {
        resolve_a(b.all, n, i, &sh, tp->world, top_k_of(&p[i], V), &tok[i], &b.st[i], b.cand);
        if (p[i].sample && b.st[i].kmax <= TK_KEY_NEG_INF)
            tok[i] = -1; /* the sample op's answer when nothing is above -inf */
        if (p[i].sample && tok[i] >= 0)
            mask_top_k(rows[i], tp, b.st[i].thr);
    }
    if (sh.any_sum && (rc = round_s(m, &b, rows, n, p, tok, 0)) != TK_OK)
        goto done;
    if (sh.P && (rc = top_p_search(m, &b, rows, n, p, tok, sh.ib)) != TK_OK)
        goto done;
    if (sh.any_pm && (rc = round_s(m, &b, rows, n, p, tok, 1)) != TK_OK)
        goto done;
    if (sh.any_sample && (rc = round_b(m, &b, rows, n, p, tok, &sh)) != TK_OK)
        goto done;
    if (sh.any_sample || sh.L)
        rc = round_c(m, &b, n, p, tok, lp, &sh);
done:
    buf_free(&b);
    return rc;
}

int tk_models__tp_gather_i64(tk_model *m, int64_t *all, int64_t *mine, size_t n, const char *what)
{
    return gather_i64(m, all, mine, n, what);
}

int tk_models__tp_log_softmax(tk_model *m, float *const *rows, size_t n, size_t *bad)
{
    const tk_models_tp *tp = m->tp;
    int W = tp->world, rc;
    *bad = n;
    int64_t *mine = malloc((2 * n + 1) * sizeof *mine), *all = malloc(((size_t)W * 2 * n + 1) * sizeof *all);
    float *mx = malloc((n + 1) * sizeof *mx);
    if (!mine || !all || !mx) {
        rc = tk__err(TK_ERR_NOMEM, "generate: out of memory for %zu rows' log-probabilities", n);
        goto done;
    }
    for (size_t i = 0; i < n; i++) { /* the rows' maxima, as argmax's keys (NaN above +inf, a zero as +0) */
        uint32_t k = 0;
        for (int64_t j = 0; j < tp->vocab_len; j++)
            k = tk__argmax_key(rows[i][tp->vocab_off + j]) > k ? tk__argmax_key(rows[i][tp->vocab_off + j]) : k;
        mine[i] = k;
    }
    if ((rc = gather_i64(m, all, mine, n, "the rows' maxima")) != TK_OK)
        goto done;
    for (size_t i = 0; i < n; i++) {
        uint32_t k = 0;
        for (int r = 0; r < W; r++)
            k = (uint32_t)all[(size_t)r * n + i] > k ? (uint32_t)all[(size_t)r * n + i] : k;
        if (k >= tk__key_of(INFINITY) && *bad == n)
            *bad = i;
        mx[i] = k >= tk__key_of(INFINITY) ? -INFINITY : tk__float_of_key(k); /* -inf: left as it is */
        tk_fsum acc = {0};
        if (mx[i] != -INFINITY)
            tk_gen__lse_terms(&acc, rows[i] + tp->vocab_off, tp->vocab_len, mx[i]);
        fsum_put(mine + 2 * i, &acc);
    }
    if ((rc = gather_i64(m, all, mine, 2 * n, "the log-softmax sums")) != TK_OK)
        goto done;
    for (size_t i = 0; i < n; i++) {
        if (mx[i] == -INFINITY)
            continue; /* tk_gen__log_softmax leaves such a row as it is */
        tk_fsum t = fsum_get(all + 2 * i, 2 * n, W);
        float lse = (float)log(tk__fsum_value(&t)), *x = rows[i] + tp->vocab_off;
        for (int64_t j = 0; j < tp->vocab_len; j++)
            x[j] = (x[j] - mx[i]) - lse;
    }
done:
    free(mine);
    free(all);
    free(mx);
    return rc;
}
