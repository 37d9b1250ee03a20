/*
 * attention.c — the attention ops (the ops of kernels-community/flash-attn): signatures, shape checks
 * and CPU references.
 *
 *   attention           prefill forward, optionally varlen (cu_seqlens), GQA/MQA, causal, sliding
 *                       window, ALiBi, softcap; writes out and optionally lse
 *   attention_backward  dq, dk, dv from dout, q, k, v, out and the forward's lse (the same masks,
 *                       GQA and varlen batch as the forward)
 *   attention_decode    1..16 new queries per sequence over a paged KV cache (f32/f16/bf16, or i8 /
 *                       fp8_e4m3 with per-head scales; f16/bf16 under f32 queries), always causal
 *   paged_kv_append     writes new keys/values into their cache slots (quantising for i8/fp8 caches,
 *                       rounding f32 keys/values into f16/bf16 caches)
 *   mla_decode          DeepSeek's multi-head latent attention, absorbed form, over a paged latent cache
 *
 * Masks follow flash-attn 2 (docs/attention.md): query i of a sequence with Sq queries and Sk keys sits
 * at p = i + Sk - Sq; causal keeps keys j <= p, window_left keeps j >= p - window_left, window_right
 * keeps j <= p + window_right; softcap and ALiBi shape the scores; a query that sees no key gets out 0
 * and lse -inf. Every mask is a contiguous key range, so the references visit only visible keys.
 *
 * Numerics: tensors are read as fp32 (quantised caches dequantised in fp32: stored * scale); every dot
 * product, score, exponential, sum and output accumulator is double. Keys are visited in chunks of
 * CHUNK with the online softmax (running max m, running sum l, accumulator rescaled by exp(m_old -
 * m_new)): the same log-sum-exp combine the split-KV kernels use, so the reference never holds a whole
 * score row. Results are rounded once to fp32 and then to the output dtype; lse is stored as f32. The
 * backward pass uses the saved lse for P = exp(s - lse) and D_i = dout_i . out_i (flash-attn's), so its
 * gradients are exact for the forward's out and lse. Work is split over (batch, head, query) rows with
 * tk_ops__parallel (backward: dq over query rows, dk/dv over key rows, so no two threads write one row).
 *
 * Checks that need tensor values (cu_seqlens monotone, seq_lens within the block table, block ids and
 * slots in range, scales > 0 for quantising) run in the CPU reference, where the data is on the host.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"

#define MAX_D 512          /* head dim the ops take (the tuned GPU kernels: 64, 128 or 256; the CUDA-core ones any) */
#define MAX_MLA 2048       /* R + P of mla_decode */
#define MAX_DECODE_SQ 16   /* new queries per sequence in attention_decode */
#define CHUNK 64           /* keys per step of the online softmax */
#define KBUF (CHUNK * 64)  /* floats of loaded (paged) key or value rows per step: 16 KiB of stack */

/* Parameter indices, in table order. */
enum { A_OUT, A_Q, A_K, A_V, A_LSE, A_CUQ, A_CUK, A_MAXQ, A_ALIBI, A_SCALE, A_CAUSAL, A_WL, A_WR, A_SOFTCAP };
enum {
    B_DQ,
    B_DK,
    B_DV,
    B_DOUT,
    B_Q,
    B_K,
    B_V,
    B_OUT,
    B_LSE,
    B_ALIBI,
    B_SCALE,
    B_CAUSAL,
    B_WL,
    B_WR,
    B_SOFTCAP,
    B_CUQ,
    B_CUK,
    B_MAXQ
};
enum { D_OUT, D_Q, D_KC, D_VC, D_BT, D_SL, D_LSE, D_KS, D_VS, D_ALIBI, D_SCALE, D_WL, D_SOFTCAP };
enum { P_KC, P_VC, P_K, P_V, P_SLOTS, P_KS, P_VS };
enum { M_OUT, M_QN, M_QP, M_KV, M_BT, M_SL, M_LSE, M_SCALE };

/* ---- shape checks ----------------------------------------------------------------------------- */

static const char *pname(const tk_op_call *c, int i) { return c->op->params[i].name; }
static const char *shp(const tk_tensor *t) { return tk_ops__shape_fmt(t->ndim, t->shape); }

/* Param i must have exactly shape want[0..n); `why` says where the wanted shape comes from. */
static int want_shape(const tk_op_call *c, int i, int n, const int64_t *want, const char *why)
{
    const tk_tensor *t = c->t[i];
    int ok = t->ndim == n;
    for (int k = 0; ok && k < n; k++)
        ok = t->shape[k] == want[k];
    if (ok)
        return TK_OK;
    return tk__err(TK_ERR_INVALID, "%s: '%s' has shape %s, want %s (%s)", c->op->name, pname(c, i), shp(t),
                   tk_ops__shape_fmt(n, want), why);
}

/* Optional param i, when given, must have shape want. */
static int want_shape_opt(const tk_op_call *c, int i, int n, const int64_t *want, const char *why)
{
    return c->t[i] ? want_shape(c, i, n, want, why) : TK_OK;
}

static int check_contiguous(const tk_op_call *c)
{
    for (size_t i = 0; i < c->op->nparams; i++)
        if (c->op->params[i].kind == TK_ARG_TENSOR && c->t[i] && !tk_ops__contiguous(c->t[i]))
            return tk__err(TK_ERR_INVALID,
                           "%s: '%s' (shape %s) is not contiguous; the attention ops take contiguous row-major "
                           "tensors\nHINT: copy it into a contiguous tensor first",
                           c->op->name, pname(c, (int)i), shp(c->t[i]));
    return TK_OK;
}

/* scale (finite), softcap (finite, >= 0), window_left/right (>= -1), causal (0 or 1); index -1: the
 * op has no such parameter. */
static int check_scalars(const tk_op_call *c, int iscale, int isoftcap, int iwl, int iwr, int icausal)
{
    const char *op = c->op->name;
    /* kernels take both as f32 */
    if (!isfinite((float)c->f[iscale]))
        return tk__err(TK_ERR_INVALID, "%s: 'scale' is %g, want a finite value as f32 (0: 1/sqrt(head dim))", op,
                       c->f[iscale]);
    if (isoftcap >= 0 && (!isfinite((float)c->f[isoftcap]) || c->f[isoftcap] < 0))
        return tk__err(TK_ERR_INVALID, "%s: 'softcap' is %g, want a finite value >= 0 as f32 (0: off)", op,
                       c->f[isoftcap]);
    if (iwl >= 0 && c->i[iwl] < -1)
        return tk__err(TK_ERR_INVALID, "%s: 'window_left' is %lld, want >= 0 keys, or -1 for unbounded", op,
                       (long long)c->i[iwl]);
    if (iwr >= 0 && c->i[iwr] < -1)
        return tk__err(TK_ERR_INVALID, "%s: 'window_right' is %lld, want >= 0 keys, or -1 for unbounded", op,
                       (long long)c->i[iwr]);
    if (icausal >= 0 && c->i[icausal] != 0 && c->i[icausal] != 1)
        return tk__err(TK_ERR_INVALID, "%s: 'causal' is %lld, want 0 or 1", op, (long long)c->i[icausal]);
    return TK_OK;
}

/* q-like param iq is [B, S, Hq, D] with 1 <= D <= MAX_D; kv-like param ik is [B?, S?, Hkv, D] with
 * Hq % Hkv == 0. The caller checks the leading dims of ik. */
static int check_heads(const tk_op_call *c, int iq, int ik)
{
    const tk_tensor *q = c->t[iq], *k = c->t[ik];
    int64_t hq = q->shape[2], d = q->shape[3], hkv = k->shape[2];
    if (d < 1 || d > MAX_D)
        return tk__err(TK_ERR_INVALID, "%s: '%s' has shape %s: head dim %lld, want 1 to %d", c->op->name, pname(c, iq),
                       shp(q), (long long)d, MAX_D);
    if (k->shape[3] != d)
        return tk__err(TK_ERR_INVALID, "%s: '%s' has shape %s: head dim %lld, want %lld (the head dim of '%s' %s)",
                       c->op->name, pname(c, ik), shp(k), (long long)k->shape[3], (long long)d, pname(c, iq), shp(q));
    if (hkv < 1)
        return tk__err(TK_ERR_INVALID, "%s: '%s' has shape %s: %lld kv heads, want at least 1", c->op->name,
                       pname(c, ik), shp(k), (long long)hkv);
    if (hq % hkv != 0)
        return tk__err(TK_ERR_INVALID,
                       "%s: '%s' %s has %lld heads and '%s' %s has %lld: want Hq %% Hkv == 0 (GQA/MQA: query "
                       "head h reads kv head h / (Hq / Hkv))",
                       c->op->name, pname(c, iq), shp(q), (long long)hq, pname(c, ik), shp(k), (long long)hkv);
    return TK_OK;
}

/* block_size (dim 1 of the cache) a power of two in 8..256. */
static int check_block_size(const tk_op_call *c, int icache)
{
    const tk_tensor *kc = c->t[icache];
    int64_t bs = kc->shape[1];
    if (bs < 8 || bs > 256 || (bs & (bs - 1)) != 0)
        return tk__err(TK_ERR_INVALID, "%s: '%s' has shape %s: block_size %lld, want a power of two from 8 to 256",
                       c->op->name, pname(c, icache), shp(kc), (long long)bs);
    return TK_OK;
}

/* block_table [B, max_blocks] and seq_lens [B] for B sequences. */
static int check_table(const tk_op_call *c, int ibt, int isl, int64_t b, int iq)
{
    const tk_tensor *bt = c->t[ibt];
    if (bt->shape[0] != b)
        return tk__err(TK_ERR_INVALID,
                       "%s: '%s' has shape %s, want [%lld, max_blocks_per_seq] (one row per "
                       "sequence of '%s' %s)",
                       c->op->name, pname(c, ibt), shp(bt), (long long)b, pname(c, iq), shp(c->t[iq]));
    int64_t w[1] = {b};
    return want_shape(c, isl, 1, w, "one length per sequence");
}

/* The cache pair's dtype: f32/f16/bf16 must be the dtype of param ilike; i8/fp8 need both scales;
 * a float cache takes no scales. */
static int check_cache_dtype(const tk_op_call *c, int ikc, int ilike, int iks, int ivs)
{
    const tk_tensor *kc = c->t[ikc];
    unsigned bit = tk_ops__dtype_bit(kc->dtype), want = tk_ops__dtype_bit(c->t[ilike]->dtype);
    const int sc[2] = {iks, ivs};
    if (bit & TK_OPS_FLOATS) {
        /* the dtype of q / k, or a 16-bit cache under f32 (half the bytes, one rounding of k and v) */
        if (bit != want && !(want == TK_OPS_F32 && (bit == TK_OPS_F16 || bit == TK_OPS_BF16)))
            return tk__err(TK_ERR_INVALID, "%s: '%s' has dtype %s, want %s (the dtype of '%s')%s or i8 / fp8_e4m3",
                           c->op->name, pname(c, ikc), tk_ops__dtype_str(kc->dtype),
                           tk_ops__dtype_str(c->t[ilike]->dtype), pname(c, ilike),
                           want == TK_OPS_F32 ? ", f16, bf16" : "");
        for (int k = 0; k < 2; k++)
            if (c->t[sc[k]])
                return tk__err(TK_ERR_INVALID,
                               "%s: '%s' is given but '%s' is %s; the scales are for i8 and fp8_e4m3 caches",
                               c->op->name, pname(c, sc[k]), pname(c, ikc), tk_ops__dtype_str(kc->dtype));
        return TK_OK;
    }
    for (int k = 0; k < 2; k++)
        if (!c->t[sc[k]])
            return tk__err(TK_ERR_INVALID,
                           "%s: '%s' is missing: '%s' is %s, a quantised cache needs per-head scales "
                           "'k_scale' and 'v_scale' [Hkv] f32 (value = stored * scale)",
                           c->op->name, pname(c, sc[k]), pname(c, ikc), tk_ops__dtype_str(kc->dtype));
    int64_t w[1] = {kc->shape[2]};
    int rc = want_shape(c, iks, 1, w, "one scale per kv head");
    return rc == TK_OK ? want_shape(c, ivs, 1, w, "one scale per kv head") : rc;
}

/* The varlen arguments (params icq, ick, imaxq) of q-like param iq [B, Sq, Hq, D]: both cu_seqlens or
 * neither, B == 1 with them, max_seqlen_q in 1..Sq. */
static int check_varlen(const tk_op_call *c, int icq, int ick, int imaxq, int iq)
{
    const char *op = c->op->name;
    const tk_tensor *cq = c->t[icq], *ck = c->t[ick], *q = c->t[iq];
    int64_t b = q->shape[0], sq = q->shape[1];
    int rc;
    if (!cq != !ck)
        return tk__err(TK_ERR_INVALID, "%s: '%s' is given without '%s': varlen needs both cu_seqlens", op,
                       cq ? "cu_seqlens_q" : "cu_seqlens_k", cq ? "cu_seqlens_k" : "cu_seqlens_q");
    if (c->i[imaxq] < 0)
        return tk__err(TK_ERR_INVALID, "%s: 'max_seqlen_q' is %lld, want >= 0", op, (long long)c->i[imaxq]);
    if (cq) {
        if (cq->shape[0] < 1)
            return tk__err(TK_ERR_INVALID, "%s: 'cu_seqlens_q' has shape %s, want [nseq + 1] (at least 1 element)", op,
                           shp(cq));
        if ((rc = want_shape(c, ick, 1, cq->shape, "the shape of 'cu_seqlens_q': nseq + 1")) != TK_OK)
            return rc;
        if (b != 1)
            return tk__err(TK_ERR_INVALID,
                           "%s: 'q' has shape %s, want B == 1 with cu_seqlens (varlen packs the sequences "
                           "along dim 1: [1, total_q, Hq, D])",
                           op, shp(q));
        if (c->i[imaxq] < 1 || c->i[imaxq] > sq)
            return tk__err(TK_ERR_INVALID,
                           "%s: 'max_seqlen_q' is %lld, want 1 to %lld with cu_seqlens (the longest sequence's "
                           "query count: the kernels size their grid by it)",
                           op, (long long)c->i[imaxq], (long long)sq);
    }
    return TK_OK;
}

/* attention(out, q, k, v, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, alibi_slopes, scale, causal,
 * window_left, window_right, softcap) */
static int check_attention(const tk_op_call *c)
{
    const char *op = c->op->name;
    const tk_tensor *q = c->t[A_Q], *k = c->t[A_K];
    int64_t b = q->shape[0], sq = q->shape[1], hq = q->shape[2], d = q->shape[3];
    int rc = check_contiguous(c);
    if (rc == TK_OK)
        rc = want_shape(c, A_OUT, 4, q->shape, "the shape of 'q'");
    if (rc != TK_OK)
        return rc;
    if (k->shape[0] != b)
        return tk__err(TK_ERR_INVALID, "%s: 'k' has shape %s, want [%lld, Sk, Hkv, %lld] (the batch of 'q' %s)", op,
                       shp(k), (long long)b, (long long)d, shp(q));
    if ((rc = check_heads(c, A_Q, A_K)) != TK_OK)
        return rc;
    if ((rc = want_shape(c, A_V, 4, k->shape, "the shape of 'k'")) != TK_OK)
        return rc;
    int64_t wl[3] = {b, hq, sq}, wa[1] = {hq};
    if ((rc = want_shape_opt(c, A_LSE, 3, wl, "[B, Hq, Sq] of 'q'")) != TK_OK ||
        (rc = want_shape_opt(c, A_ALIBI, 1, wa, "one slope per query head")) != TK_OK)
        return rc;
    if ((rc = check_varlen(c, A_CUQ, A_CUK, A_MAXQ, A_Q)) != TK_OK)
        return rc;
    return check_scalars(c, A_SCALE, A_SOFTCAP, A_WL, A_WR, A_CAUSAL);
}

/* attention_backward(dq, dk, dv, dout, q, k, v, out, lse, alibi_slopes, scale, causal, window_left,
 * window_right, softcap, cu_seqlens_q, cu_seqlens_k, max_seqlen_q) */
static int check_backward(const tk_op_call *c)
{
    const tk_tensor *q = c->t[B_Q], *k = c->t[B_K];
    int64_t b = q->shape[0], sq = q->shape[1], hq = q->shape[2], d = q->shape[3];
    int rc = check_contiguous(c);
    if (rc != TK_OK)
        return rc;
    if (k->shape[0] != b)
        return tk__err(TK_ERR_INVALID, "%s: 'k' has shape %s, want [%lld, Sk, Hkv, %lld] (the batch of 'q' %s)",
                       c->op->name, shp(k), (long long)b, (long long)d, shp(q));
    if ((rc = check_heads(c, B_Q, B_K)) != TK_OK)
        return rc;
    const int qlike[3] = {B_DQ, B_DOUT, B_OUT}, klike[3] = {B_V, B_DK, B_DV};
    for (int i = 0; i < 3; i++) {
        if ((rc = want_shape(c, qlike[i], 4, q->shape, "the shape of 'q'")) != TK_OK ||
            (rc = want_shape(c, klike[i], 4, k->shape, "the shape of 'k'")) != TK_OK)
            return rc;
    }
    int64_t wl[3] = {b, hq, sq}, wa[1] = {hq};
    if ((rc = want_shape(c, B_LSE, 3, wl, "[B, Hq, Sq] of 'q', from the forward")) != TK_OK ||
        (rc = want_shape_opt(c, B_ALIBI, 1, wa, "one slope per query head")) != TK_OK ||
        (rc = check_varlen(c, B_CUQ, B_CUK, B_MAXQ, B_Q)) != TK_OK)
        return rc;
    return check_scalars(c, B_SCALE, B_SOFTCAP, B_WL, B_WR, B_CAUSAL);
}

/* attention_decode(out, q, k_cache, v_cache, block_table, seq_lens, lse, k_scale, v_scale, alibi_slopes,
 * scale, window_left, softcap) */
static int check_decode(const tk_op_call *c)
{
    const tk_tensor *q = c->t[D_Q];
    int64_t b = q->shape[0], sq = q->shape[1], hq = q->shape[2];
    int rc = check_contiguous(c);
    if (rc == TK_OK)
        rc = want_shape(c, D_OUT, 4, q->shape, "the shape of 'q'");
    if (rc != TK_OK)
        return rc;
    if (sq < 1 || sq > MAX_DECODE_SQ)
        return tk__err(TK_ERR_INVALID, "%s: 'q' has shape %s: %lld new tokens per sequence, want 1 to %d", c->op->name,
                       shp(q), (long long)sq, MAX_DECODE_SQ);
    if ((rc = check_heads(c, D_Q, D_KC)) != TK_OK || (rc = check_block_size(c, D_KC)) != TK_OK ||
        (rc = want_shape(c, D_VC, 4, c->t[D_KC]->shape, "the shape of 'k_cache'")) != TK_OK ||
        (rc = check_cache_dtype(c, D_KC, D_Q, D_KS, D_VS)) != TK_OK ||
        (rc = check_table(c, D_BT, D_SL, b, D_Q)) != TK_OK)
        return rc;
    int64_t wl[3] = {b, hq, sq}, wa[1] = {hq};
    if ((rc = want_shape_opt(c, D_LSE, 3, wl, "[B, Hq, Sq] of 'q'")) != TK_OK ||
        (rc = want_shape_opt(c, D_ALIBI, 1, wa, "one slope per query head")) != TK_OK)
        return rc;
    return check_scalars(c, D_SCALE, D_SOFTCAP, D_WL, -1, -1);
}

/* paged_kv_append(k_cache, v_cache, k, v, slot_mapping, k_scale, v_scale) */
static int check_append(const tk_op_call *c)
{
    const tk_tensor *k = c->t[P_K], *kc = c->t[P_KC];
    int rc = check_contiguous(c);
    if (rc == TK_OK)
        rc = want_shape(c, P_V, 3, k->shape, "the shape of 'k'");
    if (rc != TK_OK)
        return rc;
    if (kc->shape[2] != k->shape[1] || kc->shape[3] != k->shape[2])
        return tk__err(TK_ERR_INVALID,
                       "%s: 'k_cache' has shape %s, want [num_blocks, block_size, %lld, %lld] (Hkv and D of 'k' %s)",
                       c->op->name, shp(kc), (long long)k->shape[1], (long long)k->shape[2], shp(k));
    if (kc->shape[1] < 1)
        return tk__err(TK_ERR_INVALID, "%s: 'k_cache' has shape %s: block_size 0, want at least 1", c->op->name,
                       shp(kc));
    int64_t wn[1] = {k->shape[0]};
    if ((rc = want_shape(c, P_VC, 4, kc->shape, "the shape of 'k_cache'")) != TK_OK ||
        (rc = want_shape(c, P_SLOTS, 1, wn, "one slot per token of 'k'")) != TK_OK)
        return rc;
    return check_cache_dtype(c, P_KC, P_K, P_KS, P_VS);
}

/* mla_decode(out, q_nope, q_pe, kv_cache, block_table, seq_lens, lse, scale) */
static int check_mla(const tk_op_call *c)
{
    const char *op = c->op->name;
    const tk_tensor *qn = c->t[M_QN], *qp = c->t[M_QP], *kv = c->t[M_KV];
    int64_t b = qn->shape[0], hq = qn->shape[1], r = qn->shape[2];
    int rc = check_contiguous(c);
    if (rc == TK_OK)
        rc = want_shape(c, M_OUT, 3, qn->shape, "the shape of 'q_nope'");
    if (rc != TK_OK)
        return rc;
    if (qp->shape[0] != b || qp->shape[1] != hq)
        return tk__err(TK_ERR_INVALID, "%s: 'q_pe' has shape %s, want [%lld, %lld, P] (B and Hq of 'q_nope' %s)", op,
                       shp(qp), (long long)b, (long long)hq, shp(qn));
    int64_t p = qp->shape[2];
    if (r < 1 || r + p > MAX_MLA)
        return tk__err(TK_ERR_INVALID,
                       "%s: 'q_nope' %s and 'q_pe' %s: latent rank R = %lld and rope dim P = %lld, want R >= 1 "
                       "and R + P <= %d",
                       op, shp(qn), shp(qp), (long long)r, (long long)p, MAX_MLA);
    if (kv->shape[2] != r + p)
        return tk__err(TK_ERR_INVALID,
                       "%s: 'kv_cache' has shape %s, want [num_blocks, block_size, %lld] (R + P: c_kv then k_pe "
                       "per token, from 'q_nope' %s and 'q_pe' %s)",
                       op, shp(kv), (long long)(r + p), shp(qn), shp(qp));
    if ((rc = check_block_size(c, M_KV)) != TK_OK || (rc = check_table(c, M_BT, M_SL, b, M_QN)) != TK_OK)
        return rc;
    int64_t wl[2] = {b, hq};
    if ((rc = want_shape_opt(c, M_LSE, 2, wl, "[B, Hq] of 'q_nope'")) != TK_OK)
        return rc;
    return check_scalars(c, M_SCALE, -1, -1, -1, -1);
}

/* ---- the shared core: masks, scores, the online softmax --------------------------------------- */

typedef struct {
    double scale;   /* the effective scale (0 resolved) */
    double softcap; /* 0: off */
    int64_t wl, wr; /* -1: unbounded; causal has made wr 0 */
} mask_t;

static mask_t mask_of(double scale, int64_t dk, double softcap, int64_t wl, int64_t wr, int causal)
{
    mask_t m = {scale != 0 ? scale : 1.0 / sqrt((double)dk), softcap, wl, causal ? 0 : wr};
    return m;
}

/* The keys a query at position p sees among keys 0..nk-1: [*lo, *hi], empty when *lo > *hi. Written
 * so that large windows cannot overflow. */
static void key_range(const mask_t *m, int64_t p, int64_t nk, int64_t *lo, int64_t *hi)
{
    *hi = (m->wr < 0 || m->wr >= nk - 1 - p) ? nk - 1 : p + m->wr;
    *lo = (m->wl < 0 || m->wl >= p) ? 0 : p - m->wl;
}

/* The score of a dot product q.k for query position p and key j; *dcap (when not NULL) gets the
 * softcap's derivative d(score)/d(scale * q.k). */
static inline double score_of(const mask_t *m, double dot, double slope, int64_t p, int64_t j, double *dcap)
{
    double s = m->scale * dot, g = 1.0;
    if (m->softcap > 0) {
        double t = tanh(s / m->softcap);
        s = m->softcap * t;
        g = 1.0 - t * t;
    }
    if (dcap)
        *dcap = g;
    return s - slope * fabs((double)(p - j));
}

static inline double dot_f(const float *a, const float *b, int64_t n)
{
    double s = 0;
    for (int64_t x = 0; x < n; x++)
        s += (double)a[x] * (double)b[x];
    return s;
}

/* Where a query's keys and values come from: fetch(src, j0, n, kr, vr, kbuf, vbuf) points kr[t] / vr[t]
 * at the fp32 rows of keys j0+t (loading into kbuf / vbuf when the rows must be converted). */
typedef void (*fetch_fn)(const void *src, int64_t j0, int64_t n, const float **kr, const float **vr, float *kbuf,
                         float *vbuf);

/* One query over its visible keys [lo, hi] with the online softmax, CHUNK keys (at most `chunk`) at a
 * time. Writes dv outputs (0 when no key is visible) and *lse (-inf then); NaN scores give NaN. */
static void attend(float *out, float *lse, const float *q, int64_t dk, int64_t dv, int64_t p, int64_t lo, int64_t hi,
                   double slope, const mask_t *m, fetch_fn fetch, const void *src, int64_t chunk, double *acc,
                   float *kbuf, float *vbuf)
{
    const float *kr[CHUNK], *vr[CHUNK];
    double s[CHUNK], mx = -INFINITY, l = 0;
    int nan = 0;
    for (int64_t x = 0; x < dv; x++)
        acc[x] = 0;
    for (int64_t j0 = lo; j0 <= hi; j0 += chunk) {
        int64_t n = hi - j0 + 1 < chunk ? hi - j0 + 1 : chunk;
        fetch(src, j0, n, kr, vr, kbuf, vbuf);
        double mc = -INFINITY;
        for (int64_t t = 0; t < n; t++) {
            s[t] = score_of(m, dot_f(q, kr[t], dk), slope, p, j0 + t, NULL);
            nan |= isnan(s[t]);
            if (s[t] > mc)
                mc = s[t];
        }
        if (mc == -INFINITY)
            continue; /* every key of the chunk has weight 0 */
        if (mc > mx) {
            double r = exp(mx - mc); /* 0 on the first chunk */
            l *= r;
            for (int64_t x = 0; x < dv; x++)
                acc[x] *= r;
            mx = mc;
        }
        for (int64_t t = 0; t < n; t++) {
            double e = exp(s[t] - mx);
            l += e;
            const float *v = vr[t];
            for (int64_t x = 0; x < dv; x++)
                acc[x] += e * (double)v[x];
        }
    }
    if (nan) {
        for (int64_t x = 0; x < dv; x++)
            out[x] = NAN;
        *lse = NAN;
    } else if (mx == -INFINITY) {
        for (int64_t x = 0; x < dv; x++)
            out[x] = 0;
        *lse = -INFINITY;
    } else {
        for (int64_t x = 0; x < dv; x++)
            out[x] = (float)(acc[x] / l);
        *lse = (float)(mx + log(l));
    }
}

/* A tensor's elements as fp32: its own data when it is f32, else a converted copy (*owned, to free).
 * NULL when out of memory. */
typedef struct {
    const tk_tensor *t;
    float *dst;
} conv_job;

#define CONV_BLOCK 4096

static void conv_range(void *arg, int64_t lo, int64_t hi)
{
    const conv_job *j = arg;
    int64_t n = tk_ops__numel(j->t);
    for (int64_t b = lo; b < hi; b++) {
        int64_t o = b * CONV_BLOCK, cnt = n - o < CONV_BLOCK ? n - o : CONV_BLOCK;
        tk_ops__load_f32(j->dst + o, tk_ops__base(j->t), o, 1, cnt, j->t->dtype);
    }
}

static const float *as_f32(const tk_tensor *t, float **owned)
{
    *owned = NULL;
    if (tk_ops__dtype_bit(t->dtype) == TK_OPS_F32)
        return tk_ops__base(t);
    int64_t n = tk_ops__numel(t);
    *owned = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!*owned)
        return NULL;
    conv_job j = {t, *owned};
    tk_ops__parallel((n + CONV_BLOCK - 1) / CONV_BLOCK, CONV_BLOCK * 2, conv_range, &j);
    return *owned;
}

static int nomem(const tk_op_call *c) { return tk__err(TK_ERR_NOMEM, "%s: out of memory", c->op->name); }

/* ---- attention (prefill) ---------------------------------------------------------------------- */

typedef struct {
    mask_t m;
    const tk_tensor *out;
    float *lse;                 /* [B, Hq, Sq] or NULL */
    const float *q, *k, *v;     /* fp32 rows */
    const float *alibi;         /* [Hq] or NULL */
    int64_t sq, hq, hkv, d;     /* sq: dim 1 of q (total_q with varlen) */
    int64_t nseq, rows;         /* rows = B * sq */
    const int64_t *q0, *k0;     /* nseq + 1 row starts of each sequence in q and in k */
} fwd_job;

typedef struct {
    const float *k, *v; /* key row 0 of the sequence, at the item's kv head */
    int64_t stride;     /* floats from one key row to the next: Hkv * D */
} dense_src;

static void dense_fetch(const void *src, int64_t j0, int64_t n, const float **kr, const float **vr, float *kbuf,
                        float *vbuf)
{
    const dense_src *s = src;
    for (int64_t t = 0; t < n; t++) {
        kr[t] = s->k + (j0 + t) * s->stride;
        vr[t] = s->v + (j0 + t) * s->stride;
    }
}

/* The sequence holding row r: the last s with q0[s] <= r; -1 when no sequence holds it. */
static int64_t seq_of(const fwd_job *j, int64_t r)
{
    int64_t lo = 0, hi = j->nseq - 1;
    if (j->nseq < 1 || r < j->q0[0])
        return -1;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        if (j->q0[mid] <= r)
            lo = mid;
        else
            hi = mid - 1;
    }
    return r < j->q0[lo + 1] ? lo : -1;
}

/* Items are (head, row), rows fastest. */
static void fwd_range(void *arg, int64_t lo, int64_t hi)
{
    const fwd_job *j = arg;
    double acc[MAX_D];
    float o[MAX_D];
    int64_t d = j->d, g = j->hq / j->hkv;
    for (int64_t it = lo; it < hi; it++) {
        int64_t h = it / j->rows, r = it % j->rows, s = seq_of(j, r);
        if (s < 0)
            continue; /* a row no sequence owns (varlen padding) is left as it is */
        int64_t nq = j->q0[s + 1] - j->q0[s], nk = j->k0[s + 1] - j->k0[s], i = r - j->q0[s];
        int64_t p = i + nk - nq, klo, khi, hk = h / g;
        key_range(&j->m, p, nk, &klo, &khi);
        dense_src src = {j->k + (j->k0[s] * j->hkv + hk) * d, j->v + (j->k0[s] * j->hkv + hk) * d, j->hkv * d};
        float lse;
        attend(o, &lse, j->q + (r * j->hq + h) * d, d, d, p, klo, khi, j->alibi ? j->alibi[h] : 0.0, &j->m, dense_fetch,
               &src, CHUNK, acc, NULL, NULL);
        tk_ops__store_f32(tk_ops__base(j->out), (r * j->hq + h) * d, 1, o, d, j->out->dtype);
        if (j->lse)
            j->lse[((r / j->sq) * j->hq + h) * j->sq + r % j->sq] = lse;
    }
}

/* Reads cu_seqlens (i32 [nseq + 1]) into int64 row starts, checking them against `total` rows. */
static int read_cu(const tk_op_call *c, int icu, int64_t total, int64_t maxlen, int64_t *dst)
{
    const tk_tensor *t = c->t[icu];
    const int32_t *cu = tk_ops__base(t);
    int64_t n = t->shape[0];
    for (int64_t s = 0; s < n; s++) {
        dst[s] = cu[s];
        if (cu[s] < 0 || cu[s] > total)
            return tk__err(TK_ERR_INVALID, "%s: '%s'[%lld] is %d, want 0 to %lld (the rows of '%s')", c->op->name,
                           pname(c, icu), (long long)s, (int)cu[s], (long long)total,
                           icu == A_CUQ || icu == B_CUQ ? "q" : "k");
        if (s > 0 && cu[s] < cu[s - 1])
            return tk__err(TK_ERR_INVALID,
                           "%s: '%s'[%lld] is %d, less than '%s'[%lld] = %d: want non-decreasing offsets", c->op->name,
                           pname(c, icu), (long long)s, (int)cu[s], pname(c, icu), (long long)(s - 1), (int)cu[s - 1]);
        if (s > 0 && maxlen > 0 && cu[s] - cu[s - 1] > maxlen)
            return tk__err(
                TK_ERR_INVALID,
                "%s: sequence %lld has %d queries ('%s'[%lld] - '%s'[%lld]), more than 'max_seqlen_q' = %lld",
                c->op->name, (long long)(s - 1), (int)(cu[s] - cu[s - 1]), pname(c, icu), (long long)s, pname(c, icu),
                (long long)(s - 1), (long long)maxlen);
    }
    return TK_OK;
}

static int cpu_attention(const tk_op_call *c)
{
    const tk_tensor *q = c->t[A_Q], *k = c->t[A_K];
    int64_t b = q->shape[0], sq = q->shape[1], hq = q->shape[2], d = q->shape[3], sk = k->shape[1];
    int64_t nseq = c->t[A_CUQ] ? c->t[A_CUQ]->shape[0] - 1 : b;
    int rc = TK_OK;
    float *oq = NULL, *ok = NULL, *ov = NULL;
    int64_t *starts = malloc(sizeof(int64_t) * (size_t)(2 * (nseq + 1)));
    if (!starts)
        return nomem(c);
    int64_t *q0 = starts, *k0 = starts + nseq + 1;
    if (c->t[A_CUQ]) {
        if ((rc = read_cu(c, A_CUQ, sq, c->i[A_MAXQ], q0)) != TK_OK || (rc = read_cu(c, A_CUK, sk, 0, k0)) != TK_OK)
            goto done;
    } else {
        for (int64_t s = 0; s <= b; s++) {
            q0[s] = s * sq;
            k0[s] = s * sk;
        }
    }
    fwd_job j = {mask_of(c->f[A_SCALE], d, c->f[A_SOFTCAP], c->i[A_WL], c->i[A_WR], (int)c->i[A_CAUSAL]),
                 c->t[A_OUT],
                 c->t[A_LSE] ? tk_ops__base(c->t[A_LSE]) : NULL,
                 as_f32(q, &oq),
                 as_f32(k, &ok),
                 as_f32(c->t[A_V], &ov),
                 c->t[A_ALIBI] ? tk_ops__base(c->t[A_ALIBI]) : NULL,
                 sq,
                 hq,
                 k->shape[2],
                 d,
                 nseq,
                 b * sq,
                 q0,
                 k0};
    if (!j.q || !j.k || !j.v) {
        rc = nomem(c);
        goto done;
    }
    if (j.rows > 0 && hq > 0)
        tk_ops__parallel(hq * j.rows, (sk / (nseq > 0 ? nseq : 1) + 1) * d * 4, fwd_range, &j);
done:
    free(oq);
    free(ok);
    free(ov);
    free(starts);
    return rc;
}

/* ---- attention_backward ----------------------------------------------------------------------- */

typedef struct {
    mask_t m;
    const tk_tensor *dq, *dk, *dv;
    const float *q, *k, *v, *dout, *out, *lse, *alibi;
    double *di; /* [B, Hq, Sq]: dout_i . out_i */
    int64_t b, sq, sk, hq, hkv, d;
    int64_t nseq;           /* sequences: B, or (varlen) the entries of cu_seqlens - 1 */
    const int64_t *q0, *k0; /* nseq + 1 row starts of each sequence in q (flat B * Sq rows) and in k */
} bwd_job;

/* The last s with starts[s] <= r < starts[s + 1]; -1 when no sequence holds row r. */
static int64_t seq_in(const int64_t *starts, int64_t nseq, int64_t r)
{
    int64_t lo = 0, hi = nseq - 1;
    if (nseq < 1 || r < starts[0])
        return -1;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        if (starts[mid] <= r)
            lo = mid;
        else
            hi = mid - 1;
    }
    return r < starts[lo + 1] ? lo : -1;
}

static int64_t lse_index(const bwd_job *j, int64_t row, int64_t h)
{
    return ((row / j->sq) * j->hq + h) * j->sq + row % j->sq;
}

/* Items are rows (row, h) of q: D_i = dout_i . out_i. */
static void bwd_di_range(void *arg, int64_t lo, int64_t hi)
{
    const bwd_job *j = arg;
    for (int64_t r = lo; r < hi; r++) {
        int64_t h = r % j->hq, row = r / j->hq;
        j->di[lse_index(j, row, h)] = dot_f(j->dout + r * j->d, j->out + r * j->d, j->d);
    }
}

/* dS for query row `row` (sequence s, query i of nq) at head h and key kj of the sequence (nk keys):
 * P (dP - D_i) times the softcap's derivative, with P = exp(s - lse_i); *pij gets P. The key must be
 * visible. */
static double dscore(const bwd_job *j, int64_t s, int64_t row, int64_t h, int64_t kj, double *pij)
{
    int64_t d = j->d, hk = h / (j->hq / j->hkv), nq = j->q0[s + 1] - j->q0[s], nk = j->k0[s + 1] - j->k0[s];
    int64_t i = row - j->q0[s], p = i + nk - nq;
    int64_t qrow = (row * j->hq + h) * d, krow = ((j->k0[s] + kj) * j->hkv + hk) * d;
    int64_t li = lse_index(j, row, h);
    double lse = j->lse[li], g;
    double sc = score_of(&j->m, dot_f(j->q + qrow, j->k + krow, d), j->alibi ? j->alibi[h] : 0.0, p, kj, &g);
    double pr = lse == -INFINITY ? 0.0 : exp(sc - lse);
    double dp = dot_f(j->dout + qrow, j->v + krow, d);
    *pij = pr;
    return pr * (dp - j->di[li]) * g;
}

/* Items are rows (row, h) of dq: dq_i = scale * sum_j dS_ij k_j. A row no sequence holds gets zeros. */
static void bwd_dq_range(void *arg, int64_t lo, int64_t hi)
{
    const bwd_job *j = arg;
    double acc[MAX_D];
    float o[MAX_D];
    int64_t d = j->d, g = j->hq / j->hkv;
    for (int64_t r = lo; r < hi; r++) {
        int64_t h = r % j->hq, row = r / j->hq, s = seq_in(j->q0, j->nseq, row), klo = 0, khi = -1;
        for (int64_t x = 0; x < d; x++)
            acc[x] = 0;
        if (s >= 0) {
            int64_t nq = j->q0[s + 1] - j->q0[s], nk = j->k0[s + 1] - j->k0[s], i = row - j->q0[s];
            key_range(&j->m, i + nk - nq, nk, &klo, &khi);
        }
        for (int64_t kj = klo; kj <= khi; kj++) {
            double pij, ds = dscore(j, s, row, h, kj, &pij);
            const float *kr = j->k + ((j->k0[s] + kj) * j->hkv + h / g) * d;
            for (int64_t x = 0; x < d; x++)
                acc[x] += ds * (double)kr[x];
        }
        for (int64_t x = 0; x < d; x++)
            o[x] = (float)(j->m.scale * acc[x]);
        tk_ops__store_f32(tk_ops__base(j->dq), r * d, 1, o, d, j->dq->dtype);
    }
}

/* Items are rows (key row, hk) of dk and dv: sums over the group's query heads and the queries of the
 * key's sequence that see it. dv_j = sum P_ij dout_i, dk_j = scale * sum dS_ij q_i. */
static void bwd_dkv_range(void *arg, int64_t lo, int64_t hi)
{
    const bwd_job *j = arg;
    double ak[MAX_D], av[MAX_D];
    float o[MAX_D];
    int64_t d = j->d, g = j->hq / j->hkv;
    for (int64_t r = lo; r < hi; r++) {
        int64_t hk = r % j->hkv, krow = r / j->hkv, s = seq_in(j->k0, j->nseq, krow);
        for (int64_t x = 0; x < d; x++)
            ak[x] = av[x] = 0;
        if (s >= 0) {
            int64_t nq = j->q0[s + 1] - j->q0[s], nk = j->k0[s + 1] - j->k0[s], kj = krow - j->k0[s];
            for (int64_t h = hk * g; h < (hk + 1) * g; h++)
                for (int64_t i = 0; i < nq; i++) {
                    int64_t klo, khi, row = j->q0[s] + i;
                    key_range(&j->m, i + nk - nq, nk, &klo, &khi);
                    if (kj < klo || kj > khi)
                        continue;
                    double pij, ds = dscore(j, s, row, h, kj, &pij);
                    int64_t qrow = (row * j->hq + h) * d;
                    for (int64_t x = 0; x < d; x++) {
                        ak[x] += ds * (double)j->q[qrow + x];
                        av[x] += pij * (double)j->dout[qrow + x];
                    }
                }
        }
        for (int64_t x = 0; x < d; x++)
            o[x] = (float)(j->m.scale * ak[x]);
        tk_ops__store_f32(tk_ops__base(j->dk), r * d, 1, o, d, j->dk->dtype);
        for (int64_t x = 0; x < d; x++)
            o[x] = (float)av[x];
        tk_ops__store_f32(tk_ops__base(j->dv), r * d, 1, o, d, j->dv->dtype);
    }
}

static int cpu_backward(const tk_op_call *c)
{
    const tk_tensor *q = c->t[B_Q], *k = c->t[B_K];
    int64_t b = q->shape[0], sq = q->shape[1], hq = q->shape[2], d = q->shape[3], sk = k->shape[1], hkv = k->shape[2];
    int64_t nseq = c->t[B_CUQ] ? c->t[B_CUQ]->shape[0] - 1 : b;
    float *own[5] = {NULL};
    int rc = TK_OK;
    int64_t *starts = malloc(sizeof(int64_t) * (size_t)(2 * (nseq + 1)));
    bwd_job j = {mask_of(c->f[B_SCALE], d, c->f[B_SOFTCAP], c->i[B_WL], c->i[B_WR], (int)c->i[B_CAUSAL]),
                 c->t[B_DQ],
                 c->t[B_DK],
                 c->t[B_DV],
                 as_f32(q, &own[0]),
                 as_f32(k, &own[1]),
                 as_f32(c->t[B_V], &own[2]),
                 as_f32(c->t[B_DOUT], &own[3]),
                 as_f32(c->t[B_OUT], &own[4]),
                 tk_ops__base(c->t[B_LSE]),
                 c->t[B_ALIBI] ? tk_ops__base(c->t[B_ALIBI]) : NULL,
                 malloc(sizeof(double) * (size_t)(b * hq * sq > 0 ? b * hq * sq : 1)),
                 b,
                 sq,
                 sk,
                 hq,
                 hkv,
                 d,
                 nseq,
                 starts,
                 starts ? starts + nseq + 1 : NULL};
    if (!j.q || !j.k || !j.v || !j.dout || !j.out || !j.di || !starts) {
        rc = nomem(c);
        goto done;
    }
    if (c->t[B_CUQ]) {
        if ((rc = read_cu(c, B_CUQ, sq, c->i[B_MAXQ], starts)) != TK_OK ||
            (rc = read_cu(c, B_CUK, sk, 0, starts + nseq + 1)) != TK_OK)
            goto done;
    } else {
        for (int64_t s = 0; s <= b; s++) {
            starts[s] = s * sq;
            starts[nseq + 1 + s] = s * sk;
        }
    }
    int64_t nq = b * sq * hq, nk = b * sk * hkv;
    for (int64_t i = 0; i < b * hq * sq; i++)
        j.di[i] = 0;
    tk_ops__parallel(nq, d * 2, bwd_di_range, &j);
    tk_ops__parallel(nq, (sk / (nseq > 0 ? nseq : 1) + 1) * d * 6, bwd_dq_range, &j);
    tk_ops__parallel(nk, (sq / (nseq > 0 ? nseq : 1) * (hq / hkv) + 1) * d * 8, bwd_dkv_range, &j);
done:
    for (int i = 0; i < 5; i++)
        free(own[i]);
    free(j.di);
    free(starts);
    return rc;
}

/* ---- paged caches: checks on the host data ---------------------------------------------------- */

/* seq_lens[s] in 0..max_blocks*block_size and the block ids of every used logical block in range. */
static int check_pages(const tk_op_call *c, int ibt, int isl, const tk_tensor *cache)
{
    const tk_tensor *bt = c->t[ibt];
    const int32_t *tab = tk_ops__base(bt), *lens = tk_ops__base(c->t[isl]);
    int64_t nb = cache->shape[0], bs = cache->shape[1], mb = bt->shape[1];
    for (int64_t s = 0; s < bt->shape[0]; s++) {
        if (lens[s] < 0 || lens[s] > mb * bs)
            return tk__err(TK_ERR_INVALID,
                           "%s: 'seq_lens'[%lld] is %d, want 0 to %lld (max_blocks_per_seq %lld * block_size %lld "
                           "of 'block_table' %s and '%s' %s)",
                           c->op->name, (long long)s, (int)lens[s], (long long)(mb * bs), (long long)mb, (long long)bs,
                           shp(bt), c->op->params[ibt == D_BT ? D_KC : M_KV].name, shp(cache));
        for (int64_t lb = 0; lb * bs < lens[s]; lb++) {
            int32_t id = tab[s * mb + lb];
            if (id < 0 || id >= nb)
                return tk__err(TK_ERR_INVALID,
                               "%s: 'block_table'[%lld, %lld] is %d, want a block of the cache, 0 to %lld (sequence "
                               "%lld has %d keys, so its logical blocks 0 to %lld are used)",
                               c->op->name, (long long)s, (long long)lb, (int)id, (long long)(nb - 1), (long long)s,
                               (int)lens[s], (long long)((lens[s] - 1) / bs));
        }
    }
    return TK_OK;
}

/* ---- attention_decode ------------------------------------------------------------------------- */

typedef struct {
    mask_t m;
    const tk_tensor *out, *kc, *vc;
    float *lse;
    const float *alibi, *ks, *vs; /* NULL when not given */
    const int32_t *tab, *lens;
    const void *q;
    tk_dtype qdt;
    int64_t sq, hq, hkv, d, bs, mb;
} dec_job;

typedef struct {
    const dec_job *j;
    const int32_t *tab; /* the sequence's row of block_table */
    int64_t hk;
} paged_src;

/* Loads rows j0..j0+n-1 of head hk of a paged cache (dequantised) into buf, pointing rows[t] at them. */
static void load_paged(const dec_job *j, const tk_tensor *cache, const float *scales, const int32_t *tab, int64_t hk,
                       int64_t j0, int64_t n, const float **rows, float *buf)
{
    float sc = scales ? scales[hk] : 1.0f;
    for (int64_t t = 0; t < n; t++) {
        int64_t key = j0 + t, slot = (int64_t)tab[key / j->bs] * j->bs + key % j->bs;
        float *row = buf + t * j->d;
        tk_ops__load_f32(row, tk_ops__base(cache), (slot * j->hkv + hk) * j->d, 1, j->d, cache->dtype);
        if (scales)
            for (int64_t x = 0; x < j->d; x++)
                row[x] *= sc;
        rows[t] = row;
    }
}

static void paged_fetch(const void *src, int64_t j0, int64_t n, const float **kr, const float **vr, float *kbuf,
                        float *vbuf)
{
    const paged_src *s = src;
    load_paged(s->j, s->j->kc, s->j->ks, s->tab, s->hk, j0, n, kr, kbuf);
    load_paged(s->j, s->j->vc, s->j->vs, s->tab, s->hk, j0, n, vr, vbuf);
}

/* Items are (b, h, i), i fastest. */
static void dec_range(void *arg, int64_t lo, int64_t hi)
{
    const dec_job *j = arg;
    double acc[MAX_D];
    float qf[MAX_D], o[MAX_D], kbuf[KBUF], vbuf[KBUF];
    int64_t d = j->d, g = j->hq / j->hkv, chunk = KBUF / d < CHUNK ? KBUF / d : CHUNK;
    for (int64_t it = lo; it < hi; it++) {
        int64_t i = it % j->sq, h = (it / j->sq) % j->hq, b = it / (j->sq * j->hq);
        int64_t nk = j->lens[b], p = nk - j->sq + i, klo, khi;
        int64_t row = (b * j->sq + i) * j->hq + h; /* of q and out */
        key_range(&j->m, p, nk, &klo, &khi);
        tk_ops__load_f32(qf, j->q, row * d, 1, d, j->qdt);
        paged_src src = {j, j->tab + b * j->mb, h / g};
        float lse;
        attend(o, &lse, qf, d, d, p, klo, khi, j->alibi ? j->alibi[h] : 0.0, &j->m, paged_fetch, &src, chunk, acc, kbuf,
               vbuf);
        tk_ops__store_f32(tk_ops__base(j->out), row * d, 1, o, d, j->out->dtype);
        if (j->lse)
            j->lse[it] = lse; /* [B, Hq, Sq] is the item order */
    }
}

static int cpu_decode(const tk_op_call *c)
{
    const tk_tensor *q = c->t[D_Q], *kc = c->t[D_KC];
    int rc = check_pages(c, D_BT, D_SL, kc);
    if (rc != TK_OK)
        return rc;
    int64_t b = q->shape[0], sq = q->shape[1], hq = q->shape[2], d = q->shape[3];
    dec_job j = {mask_of(c->f[D_SCALE], d, c->f[D_SOFTCAP], c->i[D_WL], 0, 1),
                 c->t[D_OUT],
                 kc,
                 c->t[D_VC],
                 c->t[D_LSE] ? tk_ops__base(c->t[D_LSE]) : NULL,
                 c->t[D_ALIBI] ? tk_ops__base(c->t[D_ALIBI]) : NULL,
                 c->t[D_KS] ? tk_ops__base(c->t[D_KS]) : NULL,
                 c->t[D_VS] ? tk_ops__base(c->t[D_VS]) : NULL,
                 tk_ops__base(c->t[D_BT]),
                 tk_ops__base(c->t[D_SL]),
                 tk_ops__base(q),
                 q->dtype,
                 sq,
                 hq,
                 kc->shape[2],
                 d,
                 kc->shape[1],
                 c->t[D_BT]->shape[1]};
    int64_t keys = 0;
    for (int64_t s = 0; s < b; s++)
        keys += j.lens[s];
    tk_ops__parallel(b * hq * sq, (keys / (b > 0 ? b : 1) + 1) * d * 6, dec_range, &j);
    return TK_OK;
}

/* ---- paged_kv_append -------------------------------------------------------------------------- */

typedef struct {
    int64_t slot, token;
} slot_tok;

static int cmp_slot(const void *a, const void *b)
{
    const slot_tok *x = a, *y = b;
    return x->slot < y->slot ? -1 : x->slot > y->slot ? 1 : (x->token > y->token) - (x->token < y->token);
}

typedef struct {
    const tk_tensor *kc, *vc, *k, *v;
    const int64_t *slots;
    const float *ks, *vs;
    int64_t hkv, d;
} app_job;

/* Writes row `src` (d elements of the new tokens' dtype) into row `dst` of the cache, quantising
 * x / scale for i8 and fp8 caches and rounding f32 to a 16-bit cache. */
static void append_row(const tk_tensor *cache, int64_t dst, const tk_tensor *in, int64_t src, int64_t d,
                       const float *scale)
{
    size_t es = tk_ops__dtype_size(cache->dtype);
    if (!scale && tk_ops__dtype_bit(cache->dtype) == tk_ops__dtype_bit(in->dtype)) { /* the same dtype: copy */
        memcpy((char *)tk_ops__base(cache) + (size_t)dst * es, (const char *)tk_ops__base(in) + (size_t)src * es,
               (size_t)d * es);
        return;
    }
    float x[MAX_D];
    if (!scale) { /* f32 into a 16-bit cache: rounded to nearest even */
        for (int64_t c0 = 0; c0 < d; c0 += MAX_D) {
            int64_t n = d - c0 < MAX_D ? d - c0 : MAX_D;
            tk_ops__load_f32(x, tk_ops__base(in), src + c0, 1, n, in->dtype);
            tk_ops__store_f32(tk_ops__base(cache), dst + c0, 1, x, n, cache->dtype);
        }
        return;
    }
    uint8_t *o = (uint8_t *)tk_ops__base(cache) + dst;
    int i8 = cache->dtype.code == TK_DL_INT;
    for (int64_t c0 = 0; c0 < d; c0 += MAX_D) {
        int64_t n = d - c0 < MAX_D ? d - c0 : MAX_D;
        tk_ops__load_f32(x, tk_ops__base(in), src + c0, 1, n, in->dtype);
        for (int64_t e = 0; e < n; e++) {
            float y = x[e] / *scale;
            o[c0 + e] = i8 ? (uint8_t)tk_ops__f32_to_i8(y) : tk_ops__f32_to_fp8_e4m3(y);
        }
    }
}

static void app_range(void *arg, int64_t lo, int64_t hi)
{
    const app_job *j = arg;
    for (int64_t t = lo; t < hi; t++) {
        if (j->slots[t] < 0)
            continue;
        for (int64_t h = 0; h < j->hkv; h++) {
            int64_t dst = (j->slots[t] * j->hkv + h) * j->d, src = (t * j->hkv + h) * j->d;
            append_row(j->kc, dst, j->k, src, j->d, j->ks ? j->ks + h : NULL);
            append_row(j->vc, dst, j->v, src, j->d, j->vs ? j->vs + h : NULL);
        }
    }
}

static int cpu_append(const tk_op_call *c)
{
    const tk_tensor *kc = c->t[P_KC], *k = c->t[P_K];
    int64_t n = k->shape[0], nslots = kc->shape[0] * kc->shape[1];
    const int64_t *slots = tk_ops__base(c->t[P_SLOTS]);
    for (int i = P_KS; i <= P_VS; i++) {
        const float *sc = c->t[i] ? tk_ops__base(c->t[i]) : NULL;
        for (int64_t h = 0; sc && h < kc->shape[2]; h++)
            if (!(sc[h] > 0) || !isfinite(sc[h]))
                return tk__err(TK_ERR_INVALID, "%s: '%s'[%lld] is %g, want a finite scale > 0 (stored = x / scale)",
                               c->op->name, pname(c, i), (long long)h, (double)sc[h]);
    }
    slot_tok *st = malloc(sizeof *st * (size_t)(n > 0 ? n : 1));
    if (!st)
        return nomem(c);
    int64_t m = 0;
    for (int64_t t = 0; t < n; t++) {
        if (slots[t] >= nslots) {
            free(st);
            return tk__err(TK_ERR_INVALID,
                           "%s: 'slot_mapping'[%lld] is %lld, want a slot below %lld (num_blocks %lld * block_size "
                           "%lld of 'k_cache' %s), or negative to skip the token",
                           c->op->name, (long long)t, (long long)slots[t], (long long)nslots, (long long)kc->shape[0],
                           (long long)kc->shape[1], shp(kc));
        }
        if (slots[t] >= 0)
            st[m++] = (slot_tok){slots[t], t};
    }
    qsort(st, (size_t)m, sizeof *st, cmp_slot);
    for (int64_t i = 1; i < m; i++)
        if (st[i].slot == st[i - 1].slot) {
            int rc = tk__err(TK_ERR_INVALID,
                             "%s: 'slot_mapping' gives slot %lld to tokens %lld and %lld; a slot takes one token",
                             c->op->name, (long long)st[i].slot, (long long)st[i - 1].token, (long long)st[i].token);
            free(st);
            return rc;
        }
    free(st);
    app_job j = {kc,
                 c->t[P_VC],
                 k,
                 c->t[P_V],
                 slots,
                 c->t[P_KS] ? tk_ops__base(c->t[P_KS]) : NULL,
                 c->t[P_VS] ? tk_ops__base(c->t[P_VS]) : NULL,
                 k->shape[1],
                 k->shape[2]};
    tk_ops__parallel(n, j.hkv * j.d * 4, app_range, &j);
    return TK_OK;
}

/* ---- mla_decode ------------------------------------------------------------------------------- */

typedef struct {
    mask_t m;
    const tk_tensor *out, *qn, *qp, *kv;
    float *lse;
    const int32_t *tab, *lens;
    int64_t hq, r, p, bs, mb;
} mla_job;

typedef struct {
    const mla_job *j;
    const int32_t *tab;
} mla_src;

/* Keys are whole cache rows (c_kv then k_pe); the values are their first R elements. */
static void mla_fetch(const void *src, int64_t j0, int64_t n, const float **kr, const float **vr, float *kbuf,
                      float *vbuf)
{
    const mla_src *s = src;
    const mla_job *j = s->j;
    int64_t w = j->r + j->p;
    for (int64_t t = 0; t < n; t++) {
        int64_t key = j0 + t, slot = (int64_t)s->tab[key / j->bs] * j->bs + key % j->bs;
        tk_ops__load_f32(kbuf + t * w, tk_ops__base(j->kv), slot * w, 1, w, j->kv->dtype);
        kr[t] = vr[t] = kbuf + t * w;
    }
}

/* Items are (b, h). */
static void mla_range(void *arg, int64_t lo, int64_t hi)
{
    const mla_job *j = arg;
    double acc[MAX_MLA];
    float qf[MAX_MLA], o[MAX_MLA], kbuf[KBUF];
    int64_t w = j->r + j->p, chunk = KBUF / w < CHUNK ? KBUF / w : CHUNK;
    for (int64_t it = lo; it < hi; it++) {
        int64_t b = it / j->hq, nk = j->lens[b];
        tk_ops__load_f32(qf, tk_ops__base(j->qn), it * j->r, 1, j->r, j->qn->dtype);
        tk_ops__load_f32(qf + j->r, tk_ops__base(j->qp), it * j->p, 1, j->p, j->qp->dtype);
        mla_src src = {j, j->tab + b * j->mb};
        float lse;
        attend(o, &lse, qf, w, j->r, nk - 1, 0, nk - 1, 0.0, &j->m, mla_fetch, &src, chunk, acc, kbuf, NULL);
        tk_ops__store_f32(tk_ops__base(j->out), it * j->r, 1, o, j->r, j->out->dtype);
        if (j->lse)
            j->lse[it] = lse;
    }
}

static int cpu_mla(const tk_op_call *c)
{
    const tk_tensor *qn = c->t[M_QN], *kv = c->t[M_KV];
    int rc = check_pages(c, M_BT, M_SL, kv);
    if (rc != TK_OK)
        return rc;
    int64_t b = qn->shape[0], hq = qn->shape[1], r = qn->shape[2], p = c->t[M_QP]->shape[2];
    mla_job j = {mask_of(c->f[M_SCALE], r + p, 0.0, -1, 0, 1),
                 c->t[M_OUT],
                 qn,
                 c->t[M_QP],
                 kv,
                 c->t[M_LSE] ? tk_ops__base(c->t[M_LSE]) : NULL,
                 tk_ops__base(c->t[M_BT]),
                 tk_ops__base(c->t[M_SL]),
                 hq,
                 r,
                 p,
                 kv->shape[1],
                 c->t[M_BT]->shape[1]};
    int64_t keys = 0;
    for (int64_t s = 0; s < b; s++)
        keys += j.lens[s];
    tk_ops__parallel(b * hq, (keys / (b > 0 ? b : 1) + 1) * (2 * r + p) * 2, mla_range, &j);
    return TK_OK;
}

/* ---- the table -------------------------------------------------------------------------------- */

#define T_IN(nm, rank, like, shape_, doc_)                                                                             \
    {.name = nm,                                                                                                       \
     .kind = TK_ARG_TENSOR,                                                                                            \
     .role = TK_OPS_IN,                                                                                                \
     .dtypes = TK_OPS_FLOATS,                                                                                          \
     .dtype_like = like,                                                                                               \
     .min_rank = rank,                                                                                                 \
     .max_rank = rank,                                                                                                 \
     .shape = shape_,                                                                                                  \
     .doc = doc_}
#define T_OUT(nm, rank, like, shape_, doc_)                                                                            \
    {.name = nm,                                                                                                       \
     .kind = TK_ARG_TENSOR,                                                                                            \
     .role = TK_OPS_OUT,                                                                                               \
     .dtypes = TK_OPS_FLOATS,                                                                                          \
     .dtype_like = like,                                                                                               \
     .min_rank = rank,                                                                                                 \
     .max_rank = rank,                                                                                                 \
     .shape = shape_,                                                                                                  \
     .doc = doc_}
#define T_OPT(nm, role_, bits, rank, shape_, doc_)                                                                     \
    {.name = nm,                                                                                                       \
     .kind = TK_ARG_TENSOR,                                                                                            \
     .role = role_,                                                                                                    \
     .dtypes = bits,                                                                                                   \
     .dtype_like = -1,                                                                                                 \
     .min_rank = rank,                                                                                                 \
     .max_rank = rank,                                                                                                 \
     .shape = shape_,                                                                                                  \
     .optional = 1,                                                                                                    \
     .doc = doc_}
#define T_REQ(nm, bits, rank, shape_, doc_)                                                                            \
    {.name = nm,                                                                                                       \
     .kind = TK_ARG_TENSOR,                                                                                            \
     .role = TK_OPS_IN,                                                                                                \
     .dtypes = bits,                                                                                                   \
     .dtype_like = -1,                                                                                                 \
     .min_rank = rank,                                                                                                 \
     .max_rank = rank,                                                                                                 \
     .shape = shape_,                                                                                                  \
     .doc = doc_}
#define S_F(nm, def_, doc_) {.name = nm, .kind = TK_ARG_F64, .optional = 1, .def = def_, .dtype_like = -1, .doc = doc_}
#define S_I(nm, def_, doc_) {.name = nm, .kind = TK_ARG_I64, .optional = 1, .def = def_, .dtype_like = -1, .doc = doc_}

#define LSE_OUT(rank, shape_)                                                                                          \
    T_OPT("lse", TK_OPS_OUT, TK_OPS_F32, rank, shape_,                                                                 \
          "log of the sum of exp of the scaled, masked scores; -inf for a row that sees no key")
#define ALIBI T_OPT("alibi_slopes", TK_OPS_IN, TK_OPS_F32, 1, "[Hq]", "score += -slope[h] * |p_i - j|")
#define SCALE S_F("scale", 0, "score = scale * q.k; 0: 1/sqrt(D)")
#define WL S_I("window_left", -1, "keys j >= p_i - window_left only; -1: unbounded")
#define SOFTCAP S_F("softcap", 0, "> 0: score = softcap * tanh(score / softcap), before ALiBi and the mask")
#define CAUSAL S_I("causal", 0, "1: keys j <= p_i only (bottom-right aligned: p_i = i + Sk - Sq)")
#define WR S_I("window_right", -1, "keys j <= p_i + window_right only; -1: unbounded (causal makes it 0)")
#define CACHE_BITS (TK_OPS_FLOATS | TK_OPS_I8 | TK_OPS_FP8_E4M3)

static const tk_op_param attn_params[] = {
    T_OUT("out", 4, 1, "[B, Sq, Hq, D]", "softmax(scores) @ v per query row"),
    T_IN("q", 4, -1, "[B, Sq, Hq, D]", "queries (varlen: B = 1, Sq = total_q)"),
    T_IN("k", 4, 1, "[B, Sk, Hkv, D]", "keys; Hq % Hkv == 0 (query head h reads kv head h / (Hq / Hkv))"),
    T_IN("v", 4, 1, "[B, Sk, Hkv, D]", "values"),
    LSE_OUT(3, "[B, Hq, Sq]"),
    T_OPT("cu_seqlens_q", TK_OPS_IN, TK_OPS_I32, 1, "[nseq+1]",
          "varlen: sequence s owns rows cu_seqlens_q[s]..cu_seqlens_q[s+1] of q; with cu_seqlens_k"),
    T_OPT("cu_seqlens_k", TK_OPS_IN, TK_OPS_I32, 1, "[nseq+1]", "varlen: rows cu_seqlens_k[s].. of k and v"),
    S_I("max_seqlen_q", 0, "varlen: the longest sequence's query count (> 0 with cu_seqlens)"),
    ALIBI,
    SCALE,
    CAUSAL,
    WL,
    WR,
    SOFTCAP,
};

static const tk_op_param bwd_params[] = {
    T_OUT("dq", 4, 4, "[B, Sq, Hq, D]", "gradient of q"),
    T_OUT("dk", 4, 4, "[B, Sk, Hkv, D]", "gradient of k (summed over the group's query heads)"),
    T_OUT("dv", 4, 4, "[B, Sk, Hkv, D]", "gradient of v (summed over the group's query heads)"),
    T_IN("dout", 4, 4, "[B, Sq, Hq, D]", "gradient of out"),
    T_IN("q", 4, -1, "[B, Sq, Hq, D]", "queries"),
    T_IN("k", 4, 4, "[B, Sk, Hkv, D]", "keys"),
    T_IN("v", 4, 4, "[B, Sk, Hkv, D]", "values"),
    T_IN("out", 4, 4, "[B, Sq, Hq, D]", "the forward's out"),
    T_REQ("lse", TK_OPS_F32, 3, "[B, Hq, Sq]", "the forward's lse"),
    ALIBI,
    SCALE,
    CAUSAL,
    WL,
    WR,
    SOFTCAP,
    T_OPT("cu_seqlens_q", TK_OPS_IN, TK_OPS_I32, 1, "[nseq+1]", "varlen, as the forward's (B = 1); with cu_seqlens_k"),
    T_OPT("cu_seqlens_k", TK_OPS_IN, TK_OPS_I32, 1, "[nseq+1]", "varlen: rows cu_seqlens_k[s].. of k and v"),
    S_I("max_seqlen_q", 0, "varlen: the longest sequence's query count (> 0 with cu_seqlens)"),
};

static const tk_op_param dec_params[] = {
    T_OUT("out", 4, 1, "[B, Sq, Hq, D]", "softmax(scores) @ v per new query"),
    T_IN("q", 4, -1, "[B, Sq, Hq, D]", "the Sq = 1..16 new queries of each sequence"),
    TK_OPS_TENSOR(
        "k_cache", TK_OPS_IN, CACHE_BITS, -1, 4, 4, "[num_blocks, block_size, Hkv, D]",
        "paged keys: the dtype of q (f16/bf16 also under f32 q), or i8 / fp8_e4m3 (value = stored * k_scale[h])"),
    TK_OPS_TENSOR("v_cache", TK_OPS_IN, CACHE_BITS, 2, 4, 4, "[num_blocks, block_size, Hkv, D]", "paged values"),
    T_REQ("block_table", TK_OPS_I32, 2, "[B, max_blocks_per_seq]", "physical block of logical block b of sequence s"),
    T_REQ("seq_lens", TK_OPS_I32, 1, "[B]", "keys of each sequence, the new tokens included"),
    LSE_OUT(3, "[B, Hq, Sq]"),
    T_OPT("k_scale", TK_OPS_IN, TK_OPS_F32, 1, "[Hkv]", "per kv head; required for i8 / fp8_e4m3 caches"),
    T_OPT("v_scale", TK_OPS_IN, TK_OPS_F32, 1, "[Hkv]", "per kv head; required for i8 / fp8_e4m3 caches"),
    ALIBI,
    SCALE,
    WL,
    SOFTCAP,
};

static const tk_op_param app_params[] = {
    TK_OPS_TENSOR("k_cache", TK_OPS_OUT, CACHE_BITS, -1, 4, 4, "[num_blocks, block_size, Hkv, D]",
                  "paged keys: the dtype of k (f16/bf16 also under f32 k: rounded), or i8 / fp8_e4m3 (stored = x / "
                  "k_scale[h], rounded, saturated)"),
    TK_OPS_TENSOR("v_cache", TK_OPS_OUT, CACHE_BITS, 0, 4, 4, "[num_blocks, block_size, Hkv, D]", "paged values"),
    T_IN("k", 3, -1, "[N, Hkv, D]", "the new tokens' keys"),
    T_IN("v", 3, 2, "[N, Hkv, D]", "the new tokens' values"),
    T_REQ("slot_mapping", TK_OPS_I64, 1, "[N]", "slot = block * block_size + offset; negative: skip the token"),
    T_OPT("k_scale", TK_OPS_IN, TK_OPS_F32, 1, "[Hkv]", "per kv head; required for i8 / fp8_e4m3 caches"),
    T_OPT("v_scale", TK_OPS_IN, TK_OPS_F32, 1, "[Hkv]", "per kv head; required for i8 / fp8_e4m3 caches"),
};

static const tk_op_param mla_params[] = {
    T_OUT("out", 3, 1, "[B, Hq, R]", "latent output sum_j softmax_j c_kv[j] (the caller applies W_UV)"),
    T_IN("q_nope", 3, -1, "[B, Hq, R]", "the query already multiplied by W_UK (absorbed)"),
    T_IN("q_pe", 3, 1, "[B, Hq, P]", "the rope part of the query"),
    T_IN("kv_cache", 3, 1, "[num_blocks, block_size, R+P]", "per token: the latent c_kv (R) then k_pe (P)"),
    T_REQ("block_table", TK_OPS_I32, 2, "[B, max_blocks_per_seq]", "physical block of logical block b of sequence s"),
    T_REQ("seq_lens", TK_OPS_I32, 1, "[B]", "keys of each sequence"),
    LSE_OUT(2, "[B, Hq]"),
    S_F("scale", 0, "score = scale * (q_nope.c_kv + q_pe.k_pe); 0: 1/sqrt(R + P)"),
};

#define PKG "kernels-community/flash-attn"
#define N(a) (sizeof a / sizeof a[0])

const tk_op_desc tk_ops__attention[] = {
    {"attention", "attention",
     "out = softmax(scale * q k^T + masks) v  (flash-attn 2: causal, windows, ALiBi, softcap, GQA, varlen)",
     attn_params, N(attn_params), check_attention, cpu_attention, NULL, PKG},
    {"attention_backward", "attention", "dq, dk, dv of attention from dout, out and the forward's lse", bwd_params,
     N(bwd_params), check_backward, cpu_backward, NULL, PKG},
    {"attention_decode", "attention",
     "1..16 new queries per sequence over a paged KV cache (f16/bf16/f32, i8 or fp8 with per-head scales)", dec_params,
     N(dec_params), check_decode, cpu_decode, NULL, PKG},
    {"paged_kv_append", "attention", "k_cache/v_cache[slot_mapping[t]] = k[t], v[t] (quantised for i8/fp8)", app_params,
     N(app_params), check_append, cpu_append, NULL, PKG},
    {"mla_decode", "attention",
     "DeepSeek MLA decode, absorbed: out = softmax(scale * (q_nope c_kv + q_pe k_pe)) c_kv over a paged cache",
     mla_params, N(mla_params), check_mla, cpu_mla, NULL, PKG},
};
const size_t tk_ops__attention_count = N(tk_ops__attention);
