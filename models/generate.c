/*
 * generate.c — text generation over the model pipelines: logits processors with transformers'
 * GenerationConfig semantics, the strategies (greedy, sampling, beam search), the paged KV cache,
 * streaming and batching.
 *
 * The logits processors follow transformers' LogitsProcessor classes one by one (generation/
 * logits_process.py) in f32, in the order generate() applies them: repetition penalty, no-repeat
 * n-gram, then (sampling only) temperature, top-k, top-p, min-p. The final pick goes through the op
 * registry: `argmax` for greedy, `sample` (seeded Philox, the same token on the CPU and the GPU) for
 * sampling, over the processed row.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "models/generate.h"

/* ---- logits processors ------------------------------------------------------------------------ */

void tk_gen__temperature(float *s, int64_t V, double t)
{
    float tf = (float)t; /* torch divides an f32 tensor by the scalar as f32 */
    for (int64_t i = 0; i < V; i++)
        s[i] = s[i] / tf;
}

int tk_gen__repetition_penalty(float *s, int64_t V, const int32_t *ids, size_t n, double p)
{
    /* transformers gathers every listed score first and scatters back, so a repeated id is penalised
     * once: mark the ids, then penalise each marked token */
    unsigned char *seen = calloc((size_t)V + 1, 1);
    if (!seen)
        return tk__err(TK_ERR_NOMEM, "repetition_penalty: out of memory for a row of %lld scores", (long long)V);
    float pf = (float)p;
    for (size_t j = 0; j < n; j++) {
        int32_t id = ids[j];
        if (id < 0 || id >= V || seen[id])
            continue;
        seen[id] = 1;
        s[id] = s[id] < 0 ? s[id] * pf : s[id] / pf;
    }
    free(seen);
    return TK_OK;
}

void tk_gen__no_repeat_ngram(float *s, int64_t V, const int32_t *ids, size_t n, int64_t ngram)
{
    if (ngram <= 0 || n < (size_t)ngram)
        return;
    size_t g = (size_t)ngram, plen = g - 1;
    const int32_t *prefix = ids + n - plen; /* the last ngram-1 tokens */
    for (size_t i = 0; i + g <= n; i++) {
        if (memcmp(ids + i, prefix, plen * sizeof *ids) != 0)
            continue;
        int32_t ban = ids[i + plen];
        if (ban >= 0 && ban < V)
            s[ban] = -INFINITY;
    }
}

int tk_gen__top_k(float *s, int64_t V, int64_t k, int64_t min_keep)
{
    if (k < min_keep)
        k = min_keep;
    if (k <= 0 || k >= V)
        return TK_OK;
    float *heap = malloc((size_t)k * sizeof *heap); /* a min-heap of the k largest scores */
    if (!heap)
        return tk__err(TK_ERR_NOMEM, "top_k: out of memory for k = %lld", (long long)k);
    int64_t h = 0;
    for (int64_t i = 0; i < V; i++) {
        float x = s[i];
        if (x != x)
            continue;
        if (h < k) { /* sift up */
            int64_t j = h++;
            while (j > 0 && heap[(j - 1) / 2] > x) {
                heap[j] = heap[(j - 1) / 2];
                j = (j - 1) / 2;
            }
            heap[j] = x;
        } else if (x > heap[0]) { /* replace the root, sift down */
            int64_t j = 0;
            for (;;) {
                int64_t c = 2 * j + 1;
                if (c >= k)
                    break;
                if (c + 1 < k && heap[c + 1] < heap[c])
                    c++;
                if (heap[c] >= x)
                    break;
                heap[j] = heap[c];
                j = c;
            }
            heap[j] = x;
        }
    }
    if (h == k) { /* scores < the k-th largest go; ties with it stay (transformers' filter) */
        float thr = heap[0];
        for (int64_t i = 0; i < V; i++)
            if (s[i] < thr)
                s[i] = -INFINITY;
    }
    free(heap);
    return TK_OK;
}

/* f32 softmax of s into p, as torch: e = exp(x - max), divided by the sum. */
static void softmax_f32(float *p, const float *s, int64_t V)
{
    float m = -INFINITY;
    for (int64_t i = 0; i < V; i++)
        if (s[i] > m)
            m = s[i];
    double sum = 0;
    for (int64_t i = 0; i < V; i++) {
        p[i] = m == -INFINITY ? 0.0f : expf(s[i] - m);
        sum += p[i];
    }
    float inv = sum > 0 ? (float)(1.0 / sum) : 0.0f;
    for (int64_t i = 0; i < V; i++)
        p[i] = p[i] * inv;
}

typedef struct {
    float v;
    int32_t i;
} vi;

/* ascending by value, ties by index: a stable ascending sort's order */
static int cmp_vi_asc(const void *a, const void *b)
{
    const vi *x = a, *y = b;
    if (x->v != y->v)
        return x->v < y->v ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

int tk_gen__top_p(float *s, int64_t V, double p, int64_t min_keep)
{
    if (p >= 1.0 || V <= 0)
        return TK_OK;
    vi *o = malloc((size_t)V * sizeof *o);
    float *sv = malloc((size_t)V * sizeof *sv), *pr = malloc((size_t)V * sizeof *pr);
    if (!o || !sv || !pr) {
        free(o);
        free(sv);
        free(pr);
        return tk__err(TK_ERR_NOMEM, "top_p: out of memory for a row of %lld scores", (long long)V);
    }
    for (int64_t i = 0; i < V; i++) {
        o[i].v = s[i] != s[i] ? -INFINITY : s[i];
        o[i].i = (int32_t)i;
    }
    qsort(o, (size_t)V, sizeof *o, cmp_vi_asc);
    for (int64_t i = 0; i < V; i++)
        sv[i] = o[i].v;
    softmax_f32(pr, sv, V);
    /* cumulative_probs <= (1 - top_p): torch's cumsum accumulates f32 in double on the CPU, and the
     * comparison casts the scalar to f32 */
    float cut = (float)(1.0 - p);
    double acc = 0;
    for (int64_t i = 0; i < V; i++) {
        acc += pr[i];
        float cum = (float)acc;
        if (cum <= cut && i < V - min_keep)
            s[o[i].i] = -INFINITY;
    }
    free(o);
    free(sv);
    free(pr);
    return TK_OK;
}

/* descending by value, ties by index (torch.topk's order on the CPU for ties is unspecified) */
static int cmp_vi_desc(const void *a, const void *b)
{
    const vi *x = a, *y = b;
    if (x->v != y->v)
        return x->v > y->v ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

int tk_gen__min_p(float *s, int64_t V, double min_p, int64_t min_keep)
{
    if (V <= 0)
        return TK_OK;
    float *pr = malloc((size_t)V * sizeof *pr);
    unsigned char *keep = calloc((size_t)V, 1);
    vi *o = NULL;
    if (!pr || !keep)
        goto nomem;
    softmax_f32(pr, s, V);
    float top = 0;
    for (int64_t i = 0; i < V; i++)
        if (pr[i] > top)
            top = pr[i];
    float thr = (float)min_p * top;
    if (min_keep > V)
        min_keep = V;
    if (min_keep > 1) {
        if (!(o = malloc((size_t)V * sizeof *o)))
            goto nomem;
        for (int64_t i = 0; i < V; i++) {
            o[i].v = pr[i];
            o[i].i = (int32_t)i;
        }
        qsort(o, (size_t)V, sizeof *o, cmp_vi_desc);
        for (int64_t i = 0; i < min_keep; i++)
            keep[o[i].i] = 1;
    } else if (min_keep == 1) {
        int64_t best = 0;
        for (int64_t i = 1; i < V; i++)
            if (pr[i] > pr[best])
                best = i;
        keep[best] = 1;
    }
    for (int64_t i = 0; i < V; i++)
        if (pr[i] < thr && !keep[i])
            s[i] = -INFINITY;
    free(pr);
    free(keep);
    free(o);
    return TK_OK;
nomem:
    free(pr);
    free(keep);
    free(o);
    return tk__err(TK_ERR_NOMEM, "min_p: out of memory for a row of %lld scores", (long long)V);
}

void tk_gen__log_softmax(float *s, int64_t V)
{
    float m = -INFINITY;
    for (int64_t i = 0; i < V; i++)
        if (s[i] > m)
            m = s[i];
    if (m == -INFINITY)
        return;
    double sum = 0;
    for (int64_t i = 0; i < V; i++)
        sum += exp((double)(s[i] - m));
    float lse = (float)log(sum);
    for (int64_t i = 0; i < V; i++)
        s[i] = (s[i] - m) - lse;
}
