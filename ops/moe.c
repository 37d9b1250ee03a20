/*
 * moe.c — the mixture-of-experts layer (Mixtral, Qwen2-MoE, Qwen3-MoE; DiffusionGemma's routed
 * experts): signature, shape checks and the CPU reference.
 *
 *   moe(out [N, H], input [N, H], router_weight [E, H], gate_up [E, 2I, H], down [E, H, I], top_k, ...)
 *
 *   logits  = round(router_input router_weight^T)           router_input: input unless given
 *   p       = softmax(logits) in f32
 *   (w, e)  = top_k(p) as torch.topk on the CPU orders ties (below)
 *   w       = w / sum(w) (norm_topk_prob); rounded to the input dtype (round_weights, Qwen's
 *             .to(router_logits.dtype)); times expert_scale[e] (Gemma 4 / DiffusionGemma's per_expert_scale)
 *   y_e(x)  = round(round(act(g) * u) down[e]^T),  [g; u] = round(x gate_up[e]^T)   act: silu / gelu_tanh / gelu
 *   out     = round(sum_j w_j y_{e_j}(x) + round(sigmoid(round(x shared_gate^T)) * shared(x)))
 *
 * where shared(x) is the same gated MLP over shared_gate_up / shared_down (Qwen2-MoE's shared expert;
 * its sigmoid gate only when shared_gate is given) and round() rounds to the input dtype, as the
 * unfused layers of transformers round each linear's output. gate_up is transformers 5's fused layout
 * (gate rows then up rows of each expert), down is [E, H, I].
 *
 * The experts run grouped: the tokens routed to an expert are gathered and multiplied together with
 * OpenBLAS's cblas_sgemm (cblas_sgemv for up to 4 rows; fp32 products and accumulation), the expert outputs are added to an fp32
 * accumulator in expert order (transformers' index_add_ order), then rounded once to the output dtype.
 *
 * Ties. torch.topk on the CPU selects with std::nth_element (std::partial_sort when k * 64 <= E) and a
 * comparator that is not a strict order on equal values, so which of several equal probabilities wins
 * depends on libstdc++'s introselect. Equal logits are common in bf16 (8 bits of mantissa), so tk runs
 * the same algorithms (topk_torch below), and the same experts are chosen as transformers chooses on
 * the CPU. NaN sorts above every number, as there.
 *
 * The optional outputs topk_ids [T, K] (i32) and topk_weights [T, K] (f32) give the routing (the
 * weights after normalisation, rounding and scaling).
 */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"

#undef I /* complex.h's, which cblas.h pulls in: I is the experts' intermediate size here */

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

enum {
    P_OUT,
    P_IN,
    P_ROUTER,
    P_GU,
    P_DOWN,
    P_TOPK,
    P_NORM,
    P_ACT,
    P_ROUNDW,
    P_RIN,
    P_SCALE,
    P_SGU,
    P_SDOWN,
    P_SGATE,
    P_IDS,
    P_WTS,
    P_COUNT
};
enum { ACT_SILU = 0, ACT_GELU_TANH = 1, ACT_GELU = 2 };

/* ---- torch.topk's selection on the CPU: libstdc++'s nth_element, sort and partial_sort ---------- */

typedef struct {
    float v;
    int64_t i;
} elem;

/* torch's comparator for largest = true: NaN first, then greater values. */
static int gt(const elem *x, const elem *y) { return (isnan(x->v) && !isnan(y->v)) || x->v > y->v; }
static void swap_e(elem *a, elem *b)
{
    elem t = *a;
    *a = *b;
    *b = t;
}

static void move_median_to_first(elem *result, elem *a, elem *b, elem *c)
{
    if (gt(a, b)) {
        if (gt(b, c))
            swap_e(result, b);
        else if (gt(a, c))
            swap_e(result, c);
        else
            swap_e(result, a);
    } else if (gt(a, c)) {
        swap_e(result, a);
    } else if (gt(b, c)) {
        swap_e(result, c);
    } else {
        swap_e(result, b);
    }
}

static elem *unguarded_partition(elem *first, elem *last, elem *pivot)
{
    for (;;) {
        while (gt(first, pivot))
            ++first;
        --last;
        while (gt(pivot, last))
            --last;
        if (!(first < last))
            return first;
        swap_e(first, last);
        ++first;
    }
}

static elem *partition_pivot(elem *first, elem *last)
{
    elem *mid = first + (last - first) / 2;
    move_median_to_first(first, first + 1, mid, last - 1);
    return unguarded_partition(first + 1, last, first);
}

static void unguarded_linear_insert(elem *last)
{
    elem val = *last, *next = last - 1;
    while (gt(&val, next)) {
        *last = *next;
        last = next;
        --next;
    }
    *last = val;
}

static void insertion_sort(elem *first, elem *last)
{
    if (first == last)
        return;
    for (elem *i = first + 1; i != last; ++i) {
        if (gt(i, first)) {
            elem val = *i;
            memmove(first + 1, first, (size_t)(i - first) * sizeof *first);
            *first = val;
        } else {
            unguarded_linear_insert(i);
        }
    }
}

static void push_heap(elem *first, int64_t hole, int64_t top, elem val)
{
    int64_t parent = (hole - 1) / 2;
    while (hole > top && gt(first + parent, &val)) {
        first[hole] = first[parent];
        hole = parent;
        parent = (hole - 1) / 2;
    }
    first[hole] = val;
}

static void adjust_heap(elem *first, int64_t hole, int64_t len, elem val)
{
    int64_t top = hole, child = hole;
    while (child < (len - 1) / 2) {
        child = 2 * (child + 1);
        if (gt(first + child, first + (child - 1)))
            child--;
        first[hole] = first[child];
        hole = child;
    }
    if ((len & 1) == 0 && child == (len - 2) / 2) {
        child = 2 * (child + 1);
        first[hole] = first[child - 1];
        hole = child - 1;
    }
    push_heap(first, hole, top, val);
}

static void make_heap(elem *first, elem *last)
{
    int64_t len = last - first;
    if (len < 2)
        return;
    for (int64_t parent = (len - 2) / 2;; parent--) {
        adjust_heap(first, parent, len, first[parent]);
        if (parent == 0)
            return;
    }
}

static void pop_heap(elem *first, elem *last, elem *result)
{
    elem val = *result;
    *result = *first;
    adjust_heap(first, 0, last - first, val);
}

static void heap_select(elem *first, elem *middle, elem *last)
{
    make_heap(first, middle);
    for (elem *i = middle; i < last; ++i)
        if (gt(i, first))
            pop_heap(first, middle, i);
}

static void sort_heap(elem *first, elem *last)
{
    while (last - first > 1) {
        --last;
        pop_heap(first, last, last);
    }
}

static int lg(int64_t n)
{
    int r = 0;
    while (n > 1) {
        n >>= 1;
        r++;
    }
    return r;
}

static void introsort_loop(elem *first, elem *last, int depth)
{
    while (last - first > 16) {
        if (depth == 0) {
            heap_select(first, last, last);
            sort_heap(first, last);
            return;
        }
        --depth;
        elem *cut = partition_pivot(first, last);
        introsort_loop(cut, last, depth);
        last = cut;
    }
}

static void sort_e(elem *first, elem *last)
{
    if (first == last)
        return;
    introsort_loop(first, last, 2 * lg(last - first));
    if (last - first > 16) {
        insertion_sort(first, first + 16);
        for (elem *i = first + 16; i != last; ++i)
            unguarded_linear_insert(i);
    } else {
        insertion_sort(first, last);
    }
}

static void nth_element(elem *first, elem *nth, elem *last)
{
    if (first == last || nth == last)
        return;
    int depth = 2 * lg(last - first);
    while (last - first > 3) {
        if (depth == 0) {
            heap_select(first, nth + 1, last);
            swap_e(first, nth);
            return;
        }
        --depth;
        elem *cut = partition_pivot(first, last);
        if (cut <= nth)
            first = cut;
        else
            last = cut;
    }
    insertion_sort(first, last);
}

/* q[0..n) holds (value, index) in index order; afterwards q[0..k) are the top k, in torch.topk's order
 * (sorted = true) on the CPU (aten/src/ATen/native/TopKImpl.h). */
static void topk_torch(elem *q, int64_t n, int64_t k)
{
    if (k <= 0)
        return;
    if (k * 64 <= n) {
        heap_select(q, q + k, q + n);
        sort_heap(q, q + k);
    } else {
        nth_element(q, q + k - 1, q + n);
        sort_e(q, q + k - 1);
    }
}

/* ---- the reference ---------------------------------------------------------------------------- */

static float act_f(int act, float x)
{
    if (act == ACT_GELU_TANH) {
        float x3 = (x * x) * x;
        return (0.5f * x) * (1.0f + tanhf(0.79788456080286535588f * (x + 0.044715f * x3)));
    }
    if (act == ACT_GELU)
        return (x * 0.5f) * (1.0f + erff(x * 0.70710678118654752440f));
    return x / (1.0f + expf(-x));
}

/* Rounds n floats to dt in place (nothing for f32). */
static void round_to(float *x, int64_t n, tk_dtype dt)
{
    if (dt.bits == 32)
        return;
    int bf = dt.code == TK_DL_BFLOAT;
    for (int64_t i = 0; i < n; i++)
        x[i] = bf ? tk_ops__bf16_to_f32(tk_ops__f32_to_bf16(x[i])) : tk_ops__f16_to_f32(tk_ops__f32_to_f16(x[i]));
}

/* A contiguous tensor's elements [off, off + n) as f32: the data itself when it is f32, else into buf. */
static const float *as_f32(const tk_tensor *t, int64_t off, int64_t n, float *buf)
{
    if (t->dtype.code == TK_DL_FLOAT && t->dtype.bits == 32)
        return (const float *)tk_ops__base(t) + off;
    tk_ops__load_f32(buf, tk_ops__base(t), off, 1, n, t->dtype);
    return buf;
}

/* Y[m, n] = X[m, k] W[n, k]^T. A few rows (a decode step gives an expert one or two tokens) go through
 * cblas_sgemv, row by row: sgemm would first pack all of W (bench/families_cpu.sh, Qwen3-MoE decode:
 * 28% of the time in OpenBLAS's sgemm_incopy) to use it once. */
static void mm(float *y, const float *x, const float *w, int64_t m, int64_t n, int64_t k)
{
    if (m <= 4) {
        for (int64_t r = 0; r < m; r++)
            cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)n, (int)k, 1.0f, w, (int)k, x + r * k, 1, 0.0f, y + r * n, 1);
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)n, (int)k, 1.0f, x, (int)k, w, (int)k, 0.0f, y,
                (int)n);
}

/* The gated MLP of m rows x [m, H]: y [m, H] = round(round(act(g) * u) down^T), [g; u] = round(x gu^T);
 * gu [2I, H] and down [H, I] as f32; g is scratch [m, 2I], a [m, I]. */
static void mlp(float *y, const float *x, const float *gu, const float *down, int64_t m, int64_t H, int64_t I, int act,
                tk_dtype dt, float *g, float *a)
{
    mm(g, x, gu, m, 2 * I, H);
    round_to(g, m * 2 * I, dt);
    for (int64_t r = 0; r < m; r++)
        for (int64_t i = 0; i < I; i++)
            a[r * I + i] = act_f(act, g[r * 2 * I + i]) * g[r * 2 * I + I + i];
    round_to(a, m * I, dt);
    mm(y, a, down, m, H, I);
    round_to(y, m * H, dt);
}

/* cpu_moe's sizes and f32 scratch, all freed by moe_free. */
typedef struct {
    int64_t T, H, E, I, K, Is, Imax;
    int act;
    tk_dtype dt;
    float *x, *xr, *logit, *acc, *wbuf, *dbuf, *xe, *g, *a, *y, *tw, *sc;
    int64_t *te, *cnt, *slot_t; /* routing: expert of each (token, k) slot, tokens per expert, gathered slots */
    elem *q;
} moe_cpu;

static int moe_alloc(moe_cpu *M, const tk_op_call *c)
{
    int64_t T = M->T, H = M->H, E = M->E, K = M->K, Imax = M->Imax;
    size_t f = sizeof(float);
    int64_t wmax = 2 * Imax * H > E * H ? 2 * Imax * H : E * H;
    if (!(M->x = malloc((size_t)(T * H) * f)) || !(M->logit = malloc((size_t)(T * E) * f)) ||
        !(M->acc = calloc((size_t)(T * H), f)) || !(M->wbuf = malloc((size_t)wmax * f)) ||
        !(M->dbuf = malloc((size_t)(H * Imax) * f)) || !(M->xe = malloc((size_t)(T * H) * f)) ||
        !(M->g = malloc((size_t)(T * 2 * Imax) * f)) || !(M->a = malloc((size_t)(T * Imax) * f)) ||
        !(M->y = malloc((size_t)(T * H) * f)) || !(M->tw = malloc((size_t)(T * K) * f)) ||
        !(M->te = malloc((size_t)(T * K) * sizeof *M->te)) || !(M->cnt = calloc((size_t)E + 1, sizeof *M->cnt)) ||
        !(M->slot_t = malloc((size_t)(T * K) * sizeof *M->slot_t)) || !(M->q = malloc((size_t)E * sizeof *M->q)) ||
        !(M->sc = malloc((size_t)E * f)))
        return tk__err(TK_ERR_NOMEM, "%s: out of memory (%lld tokens, %lld experts)", c->op->name, (long long)T,
                       (long long)E);
    return TK_OK;
}

static void moe_free(moe_cpu *M)
{
    free(M->x);
    free(M->xr);
    free(M->logit);
    free(M->acc);
    free(M->wbuf);
    free(M->dbuf);
    free(M->xe);
    free(M->g);
    free(M->a);
    free(M->y);
    free(M->tw);
    free(M->te);
    free(M->cnt);
    free(M->slot_t);
    free(M->q);
    free(M->sc);
}

/* The router: logits rounded as its linear rounds them, softmax in f32, top-k as torch; fills the
 * weight tw and expert te of every (token, k) slot and the tokens per expert cnt. */
static void moe_route(moe_cpu *M, const tk_op_call *c, const tk_tensor *rw, const tk_tensor *scale)
{
    int64_t T = M->T, H = M->H, E = M->E, K = M->K;
    tk_dtype dt = M->dt;
    float *logit = M->logit, *tw = M->tw, *sc = M->sc;
    int64_t *te = M->te, *cnt = M->cnt;
    elem *q = M->q;
    mm(logit, M->xr ? M->xr : M->x, as_f32(rw, 0, E * H, M->wbuf), T, E, H);
    round_to(logit, T * E, dt);
    if (scale)
        tk_ops__load_f32(sc, tk_ops__base(scale), 0, 1, E, scale->dtype);
    for (int64_t t = 0; t < T; t++) {
        float *l = logit + t * E, mx = -INFINITY, sum = 0.0f;
        for (int64_t e = 0; e < E; e++)
            mx = l[e] > mx ? l[e] : mx;
        for (int64_t e = 0; e < E; e++)
            sum += l[e] = expf(l[e] - mx);
        for (int64_t e = 0; e < E; e++)
            q[e] = (elem){l[e] / sum, e};
        topk_torch(q, E, K);
        float s = 0.0f;
        for (int64_t j = 0; j < K; j++)
            s += q[j].v;
        for (int64_t j = 0; j < K; j++) {
            float w = c->i[P_NORM] ? q[j].v / s : q[j].v;
            if (c->i[P_ROUNDW])
                round_to(&w, 1, dt);
            if (scale)
                w = w * sc[q[j].i];
            tw[t * K + j] = w;
            te[t * K + j] = q[j].i;
            cnt[q[j].i]++;
        }
    }
}

/* The experts, grouped: gather each expert's tokens, one GEMM pair, add into acc in expert order. */
static void moe_experts(moe_cpu *M, const tk_tensor *gu, const tk_tensor *dn)
{
    int64_t T = M->T, H = M->H, E = M->E, I = M->I, K = M->K;
    float *x = M->x, *xe = M->xe, *y = M->y, *acc = M->acc, *tw = M->tw;
    int64_t *te = M->te, *cnt = M->cnt, *slot_t = M->slot_t;
    size_t f = sizeof(float);
    for (int64_t e = 0; e < E; e++) {
        if (!cnt[e])
            continue;
        int64_t m = 0;
        for (int64_t t = 0; t < T; t++)
            for (int64_t j = 0; j < K; j++)
                if (te[t * K + j] == e) {
                    memcpy(xe + m * H, x + t * H, (size_t)H * f);
                    slot_t[m++] = t * K + j;
                }
        mlp(y, xe, as_f32(gu, e * 2 * I * H, 2 * I * H, M->wbuf), as_f32(dn, e * H * I, H * I, M->dbuf), m, H, I,
            M->act, M->dt, M->g, M->a);
        for (int64_t r = 0; r < m; r++) {
            float w = tw[slot_t[r]];
            float *o = acc + (slot_t[r] / K) * H;
            for (int64_t h = 0; h < H; h++)
                o[h] += w * y[r * H + h];
        }
    }
}

/* The shared expert over every token, under its sigmoid gate when sg is given, rounded and added to acc. */
static void moe_shared(moe_cpu *M, const tk_tensor *sgu, const tk_tensor *sdn, const tk_tensor *sg)
{
    int64_t T = M->T, H = M->H, Is = M->Is;
    tk_dtype dt = M->dt;
    float *x = M->x, *y = M->y, *g = M->g, *acc = M->acc;
    mlp(y, x, as_f32(sgu, 0, 2 * Is * H, M->wbuf), as_f32(sdn, 0, H * Is, M->dbuf), T, H, Is, M->act, dt, g, M->a);
    if (sg) {
        mm(g, x, as_f32(sg, 0, H, M->wbuf), T, 1, H);
        round_to(g, T, dt);
    }
    for (int64_t t = 0; t < T; t++) {
        float gate = 1.0f;
        if (sg) {
            gate = 1.0f / (1.0f + expf(-g[t]));
            round_to(&gate, 1, dt);
        }
        for (int64_t h = 0; h < H; h++) {
            float v = gate * y[t * H + h];
            round_to(&v, 1, dt);
            acc[t * H + h] += v;
        }
    }
}

static int cpu_moe(const tk_op_call *c)
{
    const tk_tensor *out = c->t[P_OUT], *in = c->t[P_IN], *rw = c->t[P_ROUTER], *gu = c->t[P_GU], *dn = c->t[P_DOWN];
    const tk_tensor *rin = c->t[P_RIN] ? c->t[P_RIN] : in, *scale = c->t[P_SCALE], *sgu = c->t[P_SGU],
                    *sdn = c->t[P_SDOWN], *sg = c->t[P_SGATE], *ids = c->t[P_IDS], *wts = c->t[P_WTS];
    moe_cpu M = {.T = in->shape[0], .H = in->shape[1], .E = rw->shape[0], .I = dn->shape[2], .K = c->i[P_TOPK]};
    M.Is = sgu ? sgu->shape[0] / 2 : 0;
    M.Imax = M.I > M.Is ? M.I : M.Is;
    M.act = (int)c->i[P_ACT];
    M.dt = in->dtype;
    int64_t T = M.T, H = M.H, K = M.K;
    if (T == 0)
        return TK_OK;
    int rc = moe_alloc(&M, c);
    if (rc != TK_OK)
        goto done;
    tk_ops__load_f32(M.x, tk_ops__base(in), 0, 1, T * H, M.dt);
    if (rin != in) {
        if (!(M.xr = malloc((size_t)(T * H) * sizeof(float)))) {
            rc = tk__err(TK_ERR_NOMEM, "%s: out of memory", c->op->name);
            goto done;
        }
        tk_ops__load_f32(M.xr, tk_ops__base(rin), 0, 1, T * H, M.dt);
    }
    moe_route(&M, c, rw, scale);
    moe_experts(&M, gu, dn);
    if (sgu)
        moe_shared(&M, sgu, sdn, sg);
    tk_ops__store_f32(tk_ops__base(out), 0, 1, M.acc, T * H, out->dtype);
    if (ids)
        for (int64_t i = 0; i < T * K; i++)
            ((int32_t *)tk_ops__base(ids))[i] = (int32_t)M.te[i];
    if (wts)
        memcpy(tk_ops__base(wts), M.tw, (size_t)(T * K) * sizeof(float));
done:
    moe_free(&M);
    return rc;
}

/* ---- signature and checks --------------------------------------------------------------------- */

static int want(const tk_op_call *c, int p, int ndim, const int64_t *shape, const char *why)
{
    const tk_tensor *t = c->t[p];
    int ok = t->ndim == ndim;
    for (int d = 0; ok && d < ndim; d++)
        ok = t->shape[d] == shape[d];
    if (!ok)
        return tk__err(TK_ERR_INVALID, "%s: '%s' has shape %s, want %s (%s)", c->op->name, c->op->params[p].name,
                       tk_ops__shape_fmt(t->ndim, t->shape), tk_ops__shape_fmt(ndim, shape), why);
    if (!tk_ops__contiguous(t))
        return tk__err(TK_ERR_INVALID, "%s: '%s' is not contiguous; the moe op takes dense row-major tensors",
                       c->op->name, c->op->params[p].name);
    return TK_OK;
}

static int check_moe(const tk_op_call *c)
{
    const tk_tensor *in = c->t[P_IN], *rw = c->t[P_ROUTER], *gu = c->t[P_GU], *sgu = c->t[P_SGU];
    int64_t T = in->shape[0], H = in->shape[1], E = rw->shape[0], K = c->i[P_TOPK];
    int64_t I = gu->shape[1] / 2;
    const char *op = c->op->name;
    int rc;
    if (E < 1)
        return tk__err(TK_ERR_INVALID, "%s: 'router_weight' has shape %s: no experts", op,
                       tk_ops__shape_fmt(rw->ndim, rw->shape));
    if (K < 1 || K > E)
        return tk__err(TK_ERR_INVALID, "%s: 'top_k' is %lld, want 1 to %lld (the number of experts)", op, (long long)K,
                       (long long)E);
    if (c->i[P_ACT] < 0 || c->i[P_ACT] > 2)
        return tk__err(TK_ERR_INVALID, "%s: 'activation' is %lld, want 0 (silu), 1 (gelu_tanh) or 2 (gelu)", op,
                       (long long)c->i[P_ACT]);
    if (gu->shape[1] % 2)
        return tk__err(TK_ERR_INVALID, "%s: 'gate_up' has shape %s, want [E, 2*I, H] (an even middle dimension)", op,
                       tk_ops__shape_fmt(gu->ndim, gu->shape));
    if (T > INT_MAX || H > INT_MAX || 2 * I > INT_MAX || E > INT_MAX)
        return tk__err(TK_ERR_UNSUPPORTED, "%s: sizes past what BLAS takes (%d)", op, INT_MAX);
    int64_t th[2] = {T, H}, eh[2] = {E, H}, egu[3] = {E, 2 * I, H}, edn[3] = {E, H, I}, e1[1] = {E}, tk2[2] = {T, K};
    if ((rc = want(c, P_OUT, 2, th, "the shape of 'input'")) || (rc = want(c, P_IN, 2, th, "[N, H]")) ||
        (rc = want(c, P_ROUTER, 2, eh, "[E, H]")) || (rc = want(c, P_GU, 3, egu, "[E, 2*I, H]")) ||
        (rc = want(c, P_DOWN, 3, edn, "[E, H, I] with I from 'gate_up'")))
        return rc;
    if (c->t[P_RIN] && (rc = want(c, P_RIN, 2, th, "the shape of 'input'")))
        return rc;
    if (c->t[P_SCALE] && (rc = want(c, P_SCALE, 1, e1, "[E]")))
        return rc;
    if (!sgu && (c->t[P_SDOWN] || c->t[P_SGATE]))
        return tk__err(TK_ERR_INVALID, "%s: 'shared_down' or 'shared_gate' given without 'shared_gate_up'", op);
    if (sgu) {
        if (!c->t[P_SDOWN])
            return tk__err(TK_ERR_INVALID, "%s: 'shared_gate_up' given without 'shared_down'", op);
        int64_t Is = sgu->shape[0] / 2, sg2[2] = {2 * Is, H}, sd[2] = {H, Is}, g1[2] = {1, H};
        if (sgu->shape[0] % 2 || sgu->shape[0] < 2)
            return tk__err(TK_ERR_INVALID,
                           "%s: 'shared_gate_up' has shape %s, want [2*Is, H] (an even first dimension)", op,
                           tk_ops__shape_fmt(sgu->ndim, sgu->shape));
        if ((rc = want(c, P_SGU, 2, sg2, "[2*Is, H]")) ||
            (rc = want(c, P_SDOWN, 2, sd, "[H, Is] with Is from 'shared_gate_up'")))
            return rc;
        if (c->t[P_SGATE] && (rc = want(c, P_SGATE, 2, g1, "[1, H]")))
            return rc;
    }
    if (c->t[P_IDS] && (rc = want(c, P_IDS, 2, tk2, "[N, top_k]")))
        return rc;
    if (c->t[P_WTS] && (rc = want(c, P_WTS, 2, tk2, "[N, top_k]")))
        return rc;
    return TK_OK;
}

#define TENSOR(nm, role_, dts, like, rank, shp, opt, doc_)                                                             \
    {.name = nm,                                                                                                       \
     .kind = TK_ARG_TENSOR,                                                                                            \
     .role = role_,                                                                                                    \
     .dtypes = dts,                                                                                                    \
     .dtype_like = like,                                                                                               \
     .min_rank = rank,                                                                                                 \
     .max_rank = rank,                                                                                                 \
     .shape = shp,                                                                                                     \
     .optional = opt,                                                                                                  \
     .doc = doc_}
#define SCALAR(nm, d, opt, doc_)                                                                                       \
    {.name = nm, .kind = TK_ARG_I64, .dtype_like = -1, .optional = opt, .def = d, .doc = doc_}

static const tk_op_param moe_params[] = {
    TENSOR("out", TK_OPS_OUT, TK_OPS_FLOATS, 1, 2, "[N, H]", 0, "the layer's output (apart from every input)"),
    TENSOR("input", TK_OPS_IN, TK_OPS_FLOATS, -1, 2, "[N, H]", 0, "the tokens the experts see"),
    TENSOR("router_weight", TK_OPS_IN, TK_OPS_FLOATS, 1, 2, "[E, H]", 0, "the router (HF's mlp.gate.weight)"),
    TENSOR("gate_up", TK_OPS_IN, TK_OPS_FLOATS, 1, 3, "[E, 2*I, H]", 0,
           "each expert's gate rows then up rows (transformers 5's experts.gate_up_proj)"),
    TENSOR("down", TK_OPS_IN, TK_OPS_FLOATS, 1, 3, "[E, H, I]", 0, "each expert's down projection"),
    SCALAR("top_k", 0, 0, "experts per token (num_experts_per_tok)"),
    SCALAR("norm_topk_prob", 1, 1, "1: the top-k probabilities renormalised to sum 1 (Mixtral; Qwen's norm_topk_prob)"),
    SCALAR("activation", 0, 1, "the gated MLP's activation: 0 silu, 1 gelu_tanh, 2 gelu"),
    SCALAR("round_weights", 0, 1, "1: the routing weights rounded to the input dtype (Qwen-MoE's router)"),
    TENSOR("router_input", TK_OPS_IN, TK_OPS_FLOATS, 1, 2, "[N, H]", 1,
           "what the router sees when it is not 'input' (DiffusionGemma)"),
    TENSOR("expert_scale", TK_OPS_IN, TK_OPS_FLOATS, 1, 1, "[E]", 1, "multiplies each chosen expert's weight"),
    TENSOR("shared_gate_up", TK_OPS_IN, TK_OPS_FLOATS, 1, 2, "[2*Is, H]", 1,
           "the shared expert's gate rows then up rows (Qwen2-MoE)"),
    TENSOR("shared_down", TK_OPS_IN, TK_OPS_FLOATS, 1, 2, "[H, Is]", 1, "the shared expert's down projection"),
    TENSOR("shared_gate", TK_OPS_IN, TK_OPS_FLOATS, 1, 2, "[1, H]", 1,
           "the shared expert's output times sigmoid(x shared_gate^T)"),
    TENSOR("topk_ids", TK_OPS_OUT, TK_OPS_I32, -1, 2, "[N, top_k]", 1, "the chosen experts, in torch.topk's order"),
    TENSOR("topk_weights", TK_OPS_OUT, TK_OPS_F32, -1, 2, "[N, top_k]", 1, "their weights"),
};

const tk_op_desc tk_ops__moe[] = {
    {"moe", "moe",
     "out = sum over top_k(softmax(x Wr^T)) of w_e * down_e(act(gate_e x) * up_e x) (+ sigmoid-gated shared expert)",
     moe_params, sizeof moe_params / sizeof moe_params[0], check_moe, cpu_moe, NULL, "kernels-community/moe"},
};
const size_t tk_ops__moe_count = sizeof tk_ops__moe / sizeof tk_ops__moe[0];
