/*
 * kv_cache.c — the paged KV cache: a pool of fixed-size blocks of keys and values per layer, handed
 * to sequences through block tables (the layout the registry's paged_kv_append and attention_decode
 * take), reference-counted so that forked sequences (beams) share blocks, copied on write; the
 * prefix cache of full prompt blocks; and the per-head scales of an i8 / fp8 cache, calibrated on the
 * host from the first prefill. The model's forward (models/model.c) drives it; generation
 * (models/generate.c) owns it.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "models/kv_cache.h"

/* One full block of some prompt: the chained hash of its tokens and all before (FNV-1a 64 over the
 * parent's hash and the block's tokens), the tokens themselves (compared on a hash match), and the
 * block, on which the entry holds a reference. */
typedef struct tk_kv_pce {
    uint64_t hash, parent, used;
    int32_t block;
    int32_t *toks;
} tk_kv_pce;

static size_t kv_layer_block_bytes(const tk_kv *kv)
{
    return (size_t)(kv->block_size * kv->heads * kv->head_dim) * (kv->dtype.bits / 8u);
}

int64_t tk_kv__block_bytes(const tk_kv *kv) { return (int64_t)kv_layer_block_bytes(kv) * 2 * kv->layers; }

static void kv_mem_free(const tk_kv *kv, void *p)
{
    if (!p)
        return;
    if (kv->dev_type == TK_DEV_CUDA)
        tk_device_free(p, kv->dev_id);
    else
        free(p);
}

int tk_kv__new(tk_kv **out, int64_t layers, int64_t heads, int64_t head_dim, tk_dtype dtype, int64_t block_size,
               int64_t max_bytes, int dev_type, int dev_id)
{
    *out = NULL;
    if (block_size < 8 || block_size > 256 || (block_size & (block_size - 1)))
        return tk__err(TK_ERR_INVALID,
                       "KV cache: block size %lld tokens, want a power of two from 8 to 256 (what "
                       "attention_decode takes)",
                       (long long)block_size);
    int quant = dtype.code == TK_DL_INT || dtype.code == TK_DL_FLOAT8_E4M3FN;
    tk_kv *kv = calloc(1, sizeof *kv);
    if (!kv)
        return tk__err(TK_ERR_NOMEM, "KV cache: out of memory");
    kv->dev_type = dev_type;
    kv->dev_id = dev_id;
    kv->layers = layers;
    kv->heads = heads;
    kv->head_dim = head_dim;
    kv->block_size = block_size;
    kv->dtype = dtype;
    kv->quant = quant;
    int rc = TK_OK;
    int64_t bb = tk_kv__block_bytes(kv);
    if (max_bytes > 0) {
        kv->max_blocks = max_bytes / bb;
        if (kv->max_blocks < 1) {
            rc = tk__err(TK_ERR_INVALID,
                         "KV cache: kv_max_bytes %lld is less than one block (%lld bytes: %lld "
                         "tokens x %lld layers x K and V x %lld heads x %lld dims in %s)",
                         (long long)max_bytes, (long long)bb, (long long)block_size, (long long)layers,
                         (long long)heads, (long long)head_dim, tk_dtype_name(dtype));
            goto fail;
        }
    }
    kv->k = calloc((size_t)layers, sizeof *kv->k);
    kv->v = calloc((size_t)layers, sizeof *kv->v);
    if (!kv->k || !kv->v) {
        rc = tk__err(TK_ERR_NOMEM, "KV cache: out of memory");
        goto fail;
    }
    if (quant) {
        size_t sb = (size_t)(layers * 2 * heads) * sizeof(float);
        if (!(kv->calibrated = calloc((size_t)layers, 1))) {
            rc = tk__err(TK_ERR_NOMEM, "KV cache: out of memory");
            goto fail;
        }
        rc = dev_type == TK_DEV_CUDA ? tk_device_alloc((void **)&kv->scales, dev_id, sb)
                                     : ((kv->scales = malloc(sb)) ? TK_OK : tk__err(TK_ERR_NOMEM, "out of memory"));
        if (rc)
            goto fail;
    }
    *out = kv;
    return TK_OK;
fail:
    tk_kv__free(kv);
    return rc;
}

void tk_kv__free(tk_kv *kv)
{
    if (!kv)
        return;
    for (int64_t l = 0; kv->k && l < kv->layers; l++) {
        kv_mem_free(kv, kv->k[l]);
        kv_mem_free(kv, kv->v ? kv->v[l] : NULL);
    }
    kv_mem_free(kv, kv->scales);
    free(kv->calibrated);
    for (int64_t i = 0; i < kv->nseq; i++)
        free(kv->seq[i].blocks);
    free(kv->seq);
    for (size_t i = 0; i < kv->npc; i++)
        free(kv->pc[i].toks);
    free(kv->pc);
    free(kv->k);
    free(kv->v);
    free(kv->ref);
    free(kv->freel);
    free(kv);
}

/* ---- the prefix cache -------------------------------------------------------------------------- */

static void kv_decref(tk_kv *kv, int32_t b);
static int kvseq_reserve(tk_kv_seq *s, int64_t nblk);

static uint64_t pc_hash(uint64_t parent, const int32_t *t, int64_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    const unsigned char *p = (const unsigned char *)&parent;
    for (size_t i = 0; i < sizeof parent; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    p = (const unsigned char *)t;
    for (size_t i = 0; i < (size_t)n * sizeof *t; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static tk_kv_pce *pc_find(tk_kv *kv, uint64_t h, uint64_t parent, const int32_t *t)
{
    for (size_t i = 0; i < kv->npc; i++) {
        tk_kv_pce *e = &kv->pc[i];
        if (e->hash == h && e->parent == parent && !memcmp(e->toks, t, (size_t)kv->block_size * sizeof *t))
            return e;
    }
    return NULL;
}

int tk_kv__pc_insert(tk_kv *kv, int32_t slot, const int32_t *ids, size_t n)
{
    const tk_kv_seq *s = &kv->seq[slot];
    int64_t bs = kv->block_size, have = (int64_t)n < s->len ? (int64_t)n : s->len;
    uint64_t parent = 0;
    for (int64_t i = 0; i < have / bs && i < s->nblk; i++) {
        const int32_t *t = ids + i * bs;
        uint64_t h = pc_hash(parent, t, bs);
        tk_kv_pce *e = pc_find(kv, h, parent, t);
        if (e) {
            e->used = ++kv->pc_clock;
        } else {
            if (kv->npc == kv->cappc) {
                size_t c = kv->cappc ? 2 * kv->cappc : 64;
                tk_kv_pce *q = realloc(kv->pc, c * sizeof *q);
                if (!q)
                    return tk__err(TK_ERR_NOMEM, "KV cache: out of memory for the prefix cache");
                kv->pc = q;
                kv->cappc = c;
            }
            int32_t *tc = malloc((size_t)bs * sizeof *tc);
            if (!tc)
                return tk__err(TK_ERR_NOMEM, "KV cache: out of memory for the prefix cache");
            memcpy(tc, t, (size_t)bs * sizeof *tc);
            kv->pc[kv->npc++] = (tk_kv_pce){h, parent, ++kv->pc_clock, s->blocks[i], tc};
            kv->ref[s->blocks[i]]++;
        }
        parent = h;
    }
    return TK_OK;
}

int64_t tk_kv__pc_match(tk_kv *kv, int32_t slot, const int32_t *ids, size_t n, int64_t max_tokens)
{
    tk_kv_seq *s = &kv->seq[slot];
    int64_t bs = kv->block_size, got = 0;
    uint64_t parent = 0;
    for (int64_t i = 0; (i + 1) * bs <= (int64_t)n && got < max_tokens; i++) {
        const int32_t *t = ids + i * bs;
        uint64_t h = pc_hash(parent, t, bs);
        tk_kv_pce *e = pc_find(kv, h, parent, t);
        if (!e || kvseq_reserve(s, s->nblk + 1) != TK_OK)
            break;
        s->blocks[s->nblk++] = e->block;
        kv->ref[e->block]++;
        e->used = ++kv->pc_clock;
        got += bs;
        parent = h;
    }
    s->len = got < max_tokens ? got : max_tokens; /* a partly used last block is copied when written */
    return s->len;
}

int64_t tk_kv__pc_cached(const tk_kv *kv)
{
    int64_t n = 0;
    for (size_t i = 0; i < kv->npc; i++)
        n += kv->ref[kv->pc[i].block] == 1;
    return n;
}

static void pc_remove(tk_kv *kv, size_t i)
{
    kv_decref(kv, kv->pc[i].block);
    free(kv->pc[i].toks);
    kv->pc[i] = kv->pc[--kv->npc];
}

void tk_kv__pc_drop(tk_kv *kv)
{
    while (kv->npc)
        pc_remove(kv, kv->npc - 1);
}

/* Evicts the oldest entries that nobody but the cache holds until `need` blocks are free or can be
 * allocated under the bound. */
static void pc_evict(tk_kv *kv, int64_t need)
{
    while (kv->nfree + (kv->max_blocks - kv->nblocks) < need) {
        size_t best = kv->npc;
        for (size_t i = 0; i < kv->npc; i++)
            if (kv->ref[kv->pc[i].block] == 1 && (best == kv->npc || kv->pc[i].used < kv->pc[best].used))
                best = i;
        if (best == kv->npc)
            return;
        pc_remove(kv, best);
    }
}

/* Grows the pool so that at least `need` blocks are free. */
static int kv_grow(tk_kv *kv, int64_t need)
{
    if (kv->nfree >= need)
        return TK_OK;
    if (kv->max_blocks && kv->npc)
        pc_evict(kv, need);
    if (kv->nfree >= need)
        return TK_OK;
    int64_t n = kv->nblocks ? kv->nblocks : 8;
    while (n - kv->nblocks + kv->nfree < need)
        n *= 2;
    if (kv->max_blocks && n > kv->max_blocks)
        n = kv->max_blocks;
    if (n - kv->nblocks + kv->nfree < need)
        return tk__err(TK_ERR_NOMEM,
                       "KV cache: %lld more blocks needed, but the cache is at its bound of %lld "
                       "blocks (%lld bytes, kv_max_bytes)\nHINT: raise the bound (--kv-max-bytes), or generate "
                       "fewer or shorter sequences at once",
                       (long long)(need - kv->nfree), (long long)kv->max_blocks,
                       (long long)(kv->max_blocks * tk_kv__block_bytes(kv)));
    size_t lb = kv_layer_block_bytes(kv), old = lb * (size_t)kv->nblocks, nw = lb * (size_t)n;
    int32_t *ref = realloc(kv->ref, (size_t)n * sizeof *ref), *fl;
    if (!ref)
        return tk__err(TK_ERR_NOMEM, "KV cache: out of memory");
    kv->ref = ref;
    if (!(fl = realloc(kv->freel, (size_t)n * sizeof *fl)))
        return tk__err(TK_ERR_NOMEM, "KV cache: out of memory");
    kv->freel = fl;
    for (int64_t l = 0; l < kv->layers; l++) {
        void **pp[2] = {&kv->k[l], &kv->v[l]};
        for (int j = 0; j < 2; j++) {
            void *p = NULL;
            if (kv->dev_type == TK_DEV_CUDA) {
                int rc = tk_device_alloc(&p, kv->dev_id, nw);
                if (!rc && old)
                    rc = tk_device_copy(p, *pp[j], old, TK_COPY_D2D, kv->dev_id);
                if (rc) {
                    kv_mem_free(kv, p);
                    return rc;
                }
                kv_mem_free(kv, *pp[j]);
            } else if (!(p = realloc(*pp[j], nw))) {
                return tk__err(TK_ERR_NOMEM, "KV cache: out of memory for %lld blocks (%zu bytes a layer)",
                               (long long)n, nw);
            }
            *pp[j] = p;
        }
    }
    for (int64_t b = n - 1; b >= kv->nblocks; b--) { /* the lowest id is popped first */
        kv->ref[b] = 0;
        kv->freel[kv->nfree++] = (int32_t)b;
    }
    kv->nblocks = n;
    return TK_OK;
}

static int kv_alloc_block(tk_kv *kv, int32_t *b)
{
    int rc = kv_grow(kv, 1);
    if (rc)
        return rc;
    *b = kv->freel[--kv->nfree];
    kv->ref[*b] = 1;
    if (++kv->used_blocks > kv->peak_blocks)
        kv->peak_blocks = kv->used_blocks;
    return TK_OK;
}

static void kv_decref(tk_kv *kv, int32_t b)
{
    if (--kv->ref[b] == 0) {
        kv->freel[kv->nfree++] = b;
        kv->used_blocks--;
    }
}

int tk_kv__seq_new(tk_kv *kv, int32_t *slot)
{
    for (int64_t i = 0; i < kv->nseq; i++)
        if (!kv->seq[i].used) {
            kv->seq[i].used = 1;
            kv->seq[i].len = kv->seq[i].nblk = 0;
            *slot = (int32_t)i;
            return TK_OK;
        }
    tk_kv_seq *s = realloc(kv->seq, (size_t)(kv->nseq + 1) * sizeof *s);
    if (!s)
        return tk__err(TK_ERR_NOMEM, "KV cache: out of memory");
    kv->seq = s;
    memset(&s[kv->nseq], 0, sizeof *s);
    s[kv->nseq].used = 1;
    *slot = (int32_t)kv->nseq++;
    return TK_OK;
}

static int kvseq_reserve(tk_kv_seq *s, int64_t nblk)
{
    if (nblk <= s->cap)
        return TK_OK;
    int64_t c = s->cap ? 2 * s->cap : 16;
    while (c < nblk)
        c *= 2;
    int32_t *p = realloc(s->blocks, (size_t)c * sizeof *p);
    if (!p)
        return tk__err(TK_ERR_NOMEM, "KV cache: out of memory");
    s->blocks = p;
    s->cap = c;
    return TK_OK;
}

int tk_kv__seq_fork(tk_kv *kv, int32_t *dst, int32_t src)
{
    int32_t d;
    int rc = tk_kv__seq_new(kv, &d);
    if (rc)
        return rc;
    tk_kv_seq *s = &kv->seq[src], *t = &kv->seq[d];
    if ((rc = kvseq_reserve(t, s->nblk))) {
        t->used = 0;
        return rc;
    }
    memcpy(t->blocks, s->blocks, (size_t)s->nblk * sizeof *t->blocks);
    t->nblk = s->nblk;
    t->len = s->len;
    for (int64_t i = 0; i < s->nblk; i++)
        kv->ref[s->blocks[i]]++;
    *dst = d;
    return TK_OK;
}

void tk_kv__seq_reset(tk_kv *kv, int32_t slot)
{
    if (!kv || slot < 0 || slot >= kv->nseq || !kv->seq[slot].used)
        return;
    tk_kv_seq *s = &kv->seq[slot];
    for (int64_t i = 0; i < s->nblk; i++)
        kv_decref(kv, s->blocks[i]);
    s->nblk = s->len = 0;
}

void tk_kv__seq_free(tk_kv *kv, int32_t slot)
{
    if (!kv || slot < 0 || slot >= kv->nseq || !kv->seq[slot].used)
        return;
    tk_kv__seq_reset(kv, slot);
    kv->seq[slot].used = 0;
}

/* Copy-on-write of block index bi of s, shared with another sequence. */
static int kv_unshare(tk_kv *kv, tk_kv_seq *s, int64_t bi)
{
    int32_t old = s->blocks[bi], nb;
    int rc = kv_alloc_block(kv, &nb);
    if (rc)
        return rc;
    size_t lb = kv_layer_block_bytes(kv);
    for (int64_t l = 0; l < kv->layers; l++) {
        char *k = kv->k[l], *v = kv->v[l];
        if (kv->dev_type == TK_DEV_CUDA) {
            if ((rc = tk_device_copy(k + lb * (size_t)nb, k + lb * (size_t)old, lb, TK_COPY_D2D, kv->dev_id)) ||
                (rc = tk_device_copy(v + lb * (size_t)nb, v + lb * (size_t)old, lb, TK_COPY_D2D, kv->dev_id)))
                return rc;
        } else {
            memcpy(k + lb * (size_t)nb, k + lb * (size_t)old, lb);
            memcpy(v + lb * (size_t)nb, v + lb * (size_t)old, lb);
        }
    }
    kv_decref(kv, old);
    s->blocks[bi] = nb;
    return TK_OK;
}

int tk_kv__prepare(tk_kv *kv, const int32_t *slots, size_t nseq, const int32_t *n, int64_t **slot_mapping,
                   int32_t **block_table, int64_t *mbps, int32_t **seq_lens, int64_t **start)
{
    *slot_mapping = NULL;
    *block_table = NULL;
    *seq_lens = NULL;
    *start = NULL;
    int64_t T = 0, bs = kv->block_size, w = 1;
    int rc = TK_OK;
    for (size_t i = 0; i < nseq; i++)
        T += n[i];
    int64_t *sm = malloc((size_t)(T ? T : 1) * sizeof *sm), *st = malloc(nseq * sizeof *st);
    int32_t *sl = malloc(nseq * sizeof *sl), *bt = NULL;
    if (!sm || !st || !sl) {
        rc = tk__err(TK_ERR_NOMEM, "KV cache: out of memory");
        goto fail;
    }
    int64_t t = 0;
    for (size_t i = 0; i < nseq; i++) {
        tk_kv_seq *s = &kv->seq[slots[i]];
        int64_t L = s->len, L2 = L + n[i], need = (L2 + bs - 1) / bs;
        if (L % bs && kv->ref[s->blocks[L / bs]] > 1 && (rc = kv_unshare(kv, s, L / bs)))
            goto fail;
        if ((rc = kvseq_reserve(s, need)))
            goto fail;
        while (s->nblk < need)
            if ((rc = kv_alloc_block(kv, &s->blocks[s->nblk++]))) {
                s->nblk--;
                goto fail;
            }
        for (int64_t p = L; p < L2; p++)
            sm[t++] = (int64_t)s->blocks[p / bs] * bs + p % bs;
        st[i] = L;
        sl[i] = (int32_t)L2;
        s->len = L2;
        if (need > w)
            w = need;
    }
    if (!(bt = calloc(nseq * (size_t)w, sizeof *bt))) {
        rc = tk__err(TK_ERR_NOMEM, "KV cache: out of memory");
        goto fail;
    }
    for (size_t i = 0; i < nseq; i++) {
        tk_kv_seq *s = &kv->seq[slots[i]];
        memcpy(bt + i * (size_t)w, s->blocks, (size_t)s->nblk * sizeof *bt);
    }
    *slot_mapping = sm;
    *block_table = bt;
    *mbps = w;
    *seq_lens = sl;
    *start = st;
    return TK_OK;
fail:
    free(sm);
    free(st);
    free(sl);
    free(bt);
    return rc;
}

int tk_kv__calibrate(tk_kv *kv, int64_t l, const float *k, const float *v, int64_t n)
{
    int64_t H = kv->heads, D = kv->head_dim;
    float qmax = kv->dtype.code == TK_DL_INT ? 127.0f : 448.0f, sc[2 * 1024];
    if (H > 1024)
        return tk__err(TK_ERR_UNSUPPORTED, "KV cache: %lld heads, at most 1024 with a quantised cache", (long long)H);
    for (int j = 0; j < 2; j++) {
        const float *x = j ? v : k;
        for (int64_t h = 0; h < H; h++) {
            float amax = 0;
            for (int64_t t = 0; t < n; t++)
                for (int64_t d = 0; d < D; d++) {
                    float a = fabsf(x[(t * H + h) * D + d]);
                    if (a > amax) /* NaN never passes */
                        amax = a;
                }
            sc[j * H + h] = amax > 0 && isfinite(amax) ? 1.25f * amax / qmax : 1.0f;
        }
    }
    float *dst = kv->scales + l * 2 * H;
    int rc = TK_OK;
    if (kv->dev_type == TK_DEV_CUDA)
        rc = tk_device_copy(dst, sc, (size_t)(2 * H) * sizeof(float), TK_COPY_H2D, kv->dev_id);
    else
        memcpy(dst, sc, (size_t)(2 * H) * sizeof(float));
    if (rc == TK_OK)
        kv->calibrated[l] = 1;
    return rc;
}

void tk_kv__layer(const tk_kv *kv, int64_t l, tk_tensor *k, int64_t *kshape, tk_tensor *v, int64_t *vshape,
                  tk_tensor *ks, tk_tensor *vs, int64_t *sshape)
{
    int64_t shp[4] = {kv->nblocks, kv->block_size, kv->heads, kv->head_dim};
    memcpy(kshape, shp, sizeof shp);
    memcpy(vshape, shp, sizeof shp);
    tk_tensor base = {NULL, {kv->dev_type, kv->dev_id}, 4, kv->dtype, NULL, NULL, 0};
    *k = base;
    k->data = kv->k[l];
    k->shape = kshape;
    *v = base;
    v->data = kv->v[l];
    v->shape = vshape;
    if (ks && vs) {
        sshape[0] = kv->heads;
        tk_tensor sb = {NULL, {kv->dev_type, kv->dev_id}, 1, {TK_DL_FLOAT, 32, 1}, sshape, NULL, 0};
        *ks = sb;
        *vs = sb;
        ks->data = kv->quant ? kv->scales + l * 2 * kv->heads : NULL;
        vs->data = kv->quant ? kv->scales + (l * 2 + 1) * kv->heads : NULL;
    }
}
