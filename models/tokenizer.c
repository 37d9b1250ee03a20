/*
 * tokenizer.c — Hugging Face tokenizer.json, read and applied as the `tokenizers` library does.
 *
 * encode: split the text on added tokens (leftmost-longest, lstrip/rstrip/single_word) → normalise
 * each remaining part → split it again on the added tokens marked "normalized" → pre-tokenise into
 * pieces → the model turns each piece into ids (BPE by merge rank with a heap, WordPiece greedy
 * longest-match, WordLevel lookup) → the post-processor adds [CLS]/<s>/... when asked.
 * decode: ids → token strings (special ones skipped on request) → the decoder chain → one string.
 *
 * Unicode classes come from utf8proc (categories, case, NFC/NFKC) and PCRE2 with UCP (the
 * pre-tokenizer regexes, which `tokenizers` runs with Oniguruma); nothing here is a hand-written
 * Unicode table. Sequences of normalisers, pre-tokenisers and decoders are flattened into one list
 * of steps, which applies them in the same order. A loaded tokenizer is never written to again, so
 * encode and decode may run on many threads at once; each call keeps its scratch space to itself.
 * Offsets, truncation, padding and pair inputs are not implemented: models need ids only.
 */
#define _GNU_SOURCE /* memmem */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <ctype.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "common/common.h"
#include "models/models.h"
#include "models/tokenizer.h"

#define TOK_MAGIC 0x544b544fu        /* "TKTO" */
#define TOK_MAX_FILE ((size_t)1 << 30) /* 1 GiB: the largest real tokenizer.json are ~35 MB */
#define TOK_MAX_ID ((int64_t)1 << 30)

static const char *const SUP_NORM = "NFC, NFD, NFKC, NFKD, Lowercase, StripAccents, BertNormalizer, "
                                    "Prepend, Replace, Strip, Sequence";
static const char *const SUP_PRE = "ByteLevel, Split, Metaspace, BertPreTokenizer, Whitespace, "
                                   "WhitespaceSplit, Digits, Punctuation, CharDelimiterSplit, Sequence";
static const char *const SUP_MODEL = "BPE, WordPiece, WordLevel";
static const char *const SUP_POST = "TemplateProcessing, BertProcessing, RobertaProcessing, ByteLevel, "
                                    "Sequence";
static const char *const SUP_DEC = "ByteLevel, Metaspace, WordPiece, ByteFallback, Fuse, Strip, Replace, "
                                   "BPEDecoder, Sequence";

/* ---- small containers ------------------------------------------------------------------------ */

typedef struct {
    char *s;
    size_t n;
} str;

typedef struct {
    int32_t *v;
    size_t n, cap;
} i32v;

static int i32_push(i32v *a, int32_t x)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        int32_t *v = realloc(a->v, cap * sizeof *v);
        if (!v)
            return tk__err(TK_ERR_NOMEM, "out of memory");
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return TK_OK;
}

/* A piece of text on its way through the pipeline; `first` when it starts the input (Metaspace's
 * prepend_scheme "first" looks at that). */
typedef struct {
    char *s;
    size_t n;
    int first;
} piece;

typedef struct {
    piece *v;
    size_t n, cap;
} piecev;

static int piece_push(piecev *a, const char *s, size_t n, int first)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 16;
        piece *v = realloc(a->v, cap * sizeof *v);
        if (!v)
            return tk__err(TK_ERR_NOMEM, "out of memory");
        a->v = v;
        a->cap = cap;
    }
    char *c = malloc(n + 1);
    if (!c)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    memcpy(c, s, n);
    c[n] = 0;
    a->v[a->n++] = (piece){c, n, first};
    return TK_OK;
}

static void piecev_free(piecev *a)
{
    for (size_t i = 0; i < a->n; i++)
        free(a->v[i].s);
    free(a->v);
    memset(a, 0, sizeof *a);
}

/* String → index, open addressing over an array of strings the caller keeps. A slot holds the
 * index + 1 (0: empty) in its low half and the key's hash in its high half, so a probe rarely has
 * to read the key itself. */
typedef struct {
    uint64_t *slot;
    size_t mask;
} strmap;

static uint64_t hash_bytes(const void *p, size_t n)
{
    const uint8_t *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static int strmap_init(strmap *m, size_t n)
{
    size_t cap = 16;
    while (cap < 2 * n + 2)
        cap *= 2;
    m->slot = calloc(cap, sizeof *m->slot);
    if (!m->slot)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    m->mask = cap - 1;
    return TK_OK;
}

static int64_t strmap_get(const strmap *m, const str *keys, const char *s, size_t n)
{
    if (!m->slot)
        return -1;
    uint64_t h = hash_bytes(s, n), tag = h >> 32;
    for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
        uint64_t e = m->slot[i];
        if (!e)
            return -1;
        if (e >> 32 != tag)
            continue;
        const str *k = &keys[(uint32_t)e - 1];
        if (k->n == n && memcmp(k->s, s, n) == 0)
            return (uint32_t)e - 1;
    }
}

/* Adds keys[idx]; a key already present keeps its first index (the map never fills: cap > 2n). */
static void strmap_put(strmap *m, const str *keys, uint32_t idx)
{
    const str *k = &keys[idx];
    uint64_t h = hash_bytes(k->s, k->n), tag = h >> 32;
    for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
        uint64_t e = m->slot[i];
        if (!e) {
            m->slot[i] = tag << 32 | (uint64_t)(idx + 1);
            return;
        }
        const str *o = &keys[(uint32_t)e - 1];
        if (e >> 32 == tag && o->n == k->n && memcmp(o->s, k->s, k->n) == 0)
            return;
    }
}

/* (left id, right id) → (rank, merged id): BPE's merges. */
typedef struct {
    uint64_t *key; /* UINT64_MAX is empty */
    uint32_t *rank;
    int32_t *id;
    size_t mask;
} pairmap;

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static int pairmap_get(const pairmap *m, int32_t a, int32_t b, uint32_t *rank, int32_t *id)
{
    if (!m->key)
        return 0;
    uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (size_t i = mix64(k) & m->mask;; i = (i + 1) & m->mask) {
        if (m->key[i] == UINT64_MAX)
            return 0;
        if (m->key[i] == k) {
            *rank = m->rank[i];
            *id = m->id[i];
            return 1;
        }
    }
}

/* ---- UTF-8 and Unicode helpers --------------------------------------------------------------- */

/* Decodes the code point at s[i] (valid UTF-8 assumed: checked once on entry); returns its length. */
static size_t u8_next(const char *s, size_t n, size_t i, int32_t *cp)
{
    if ((uint8_t)s[i] < 0x80) {
        *cp = (uint8_t)s[i];
        return 1;
    }
    utf8proc_int32_t c = 0;
    utf8proc_ssize_t k = utf8proc_iterate((const uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &c);
    if (k <= 0) { /* cannot happen on validated text; step one byte so loops end */
        *cp = 0xFFFD;
        return 1;
    }
    *cp = c;
    return (size_t)k;
}

static int u8_valid(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        utf8proc_int32_t c;
        utf8proc_ssize_t k = utf8proc_iterate((const uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &c);
        if (k <= 0)
            return 0;
        i += (size_t)k;
    }
    return 1;
}

static int buf_putc(tk_buf *b, int32_t c)
{
    if (c < 0x80 && b->len + 1 < b->cap) { /* the common case, without a call */
        b->data[b->len++] = (char)c;
        b->data[b->len] = 0;
        return TK_OK;
    }
    uint8_t u[4];
    utf8proc_ssize_t k = utf8proc_encode_char(c, u);
    return tk__buf_append(b, u, (size_t)k);
}

/* Rust's char::is_whitespace: the White_Space property (Z categories, \t..\r, U+0085). */
static int is_ws(int32_t c)
{
    if ((c >= 9 && c <= 13) || c == 0x85 || c == ' ')
        return 1;
    if (c < 0x80)
        return 0;
    utf8proc_category_t k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_ZS || k == UTF8PROC_CATEGORY_ZL || k == UTF8PROC_CATEGORY_ZP;
}

static int is_punct(int32_t c) /* Rust is_ascii_punctuation || Unicode P* (BERT's definition) */
{
    if (c < 128 && ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126)))
        return 1;
    if (c < 0x80)
        return 0;
    utf8proc_category_t k = utf8proc_category(c);
    return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

static int is_numeric(int32_t c) /* Rust char::is_numeric: N* */
{
    utf8proc_category_t k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

/* Rust regex's \w, which tokenizers uses for an added token's single_word: letters, marks, Nd, Nl,
 * connector punctuation and the joiners. */
static int is_word(int32_t c)
{
    utf8proc_category_t k = utf8proc_category(c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_ME) || k == UTF8PROC_CATEGORY_ND ||
           k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_PC || c == 0x200C || c == 0x200D;
}

/* BERT's "Chinese character" blocks (the CJK Unified Ideographs ranges of the original BERT code). */
static int is_cjk(int32_t c)
{
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
           (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/* Appends the replacement-character form of bytes that are not valid UTF-8, as Rust's
 * String::from_utf8_lossy: each maximal invalid subpart becomes one U+FFFD. */
static int utf8_lossy(tk_buf *out, const uint8_t *p, size_t n)
{
    size_t i = 0;
    int rc = TK_OK;
    while (i < n && rc == TK_OK) {
        uint8_t c = p[i];
        size_t w;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c < 0x80) {
            rc = tk__buf_append(out, p + i, 1);
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            w = 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            w = 3;
            lo = c == 0xE0 ? 0xA0 : 0x80;
            hi = c == 0xED ? 0x9F : 0xBF;
        } else if (c >= 0xF0 && c <= 0xF4) {
            w = 4;
            lo = c == 0xF0 ? 0x90 : 0x80;
            hi = c == 0xF4 ? 0x8F : 0xBF;
        } else {
            rc = tk__buf_puts(out, "\xEF\xBF\xBD");
            i++;
            continue;
        }
        size_t k = 1;
        while (k < w && i + k < n) {
            uint8_t d = p[i + k];
            if (k == 1 ? (d < lo || d > hi) : (d < 0x80 || d > 0xBF))
                break;
            k++;
        }
        rc = k == w ? tk__buf_append(out, p + i, w) : tk__buf_puts(out, "\xEF\xBF\xBD");
        i += k;
    }
    return rc;
}

/* ---- patterns: a literal string or a PCRE2 regex --------------------------------------------- */

typedef struct {
    pcre2_code *re; /* NULL: literal */
    str lit;
} pattern;

typedef struct {
    size_t s, e;
    int m; /* a match (1) or the text between matches (0) */
} seg;

typedef struct {
    seg *v;
    size_t n, cap;
} segv;

static int seg_push(segv *a, size_t s, size_t e, int m)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 32;
        seg *v = realloc(a->v, cap * sizeof *v);
        if (!v)
            return tk__err(TK_ERR_NOMEM, "out of memory");
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = (seg){s, e, m};
    return TK_OK;
}

static int regex_compile(pcre2_code **out, const char *pat, size_t n, const char *field)
{
    int code;
    PCRE2_SIZE off;
    *out = pcre2_compile((PCRE2_SPTR)pat, n, PCRE2_UTF | PCRE2_UCP, &code, &off, NULL);
    if (!*out) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        return tk__err(TK_ERR_INVALID, "%s: the regex does not compile at offset %zu: %s", field, (size_t)off,
                       (const char *)msg);
    }
    pcre2_jit_compile(*out, PCRE2_JIT_COMPLETE); /* a failure only means the slower interpreter */
    return TK_OK;
}

/* Cuts s[0..n) into alternating runs of non-matches and matches of p, covering all of it, as
 * `tokenizers`' find_matches does (empty matches are skipped: they would make empty pieces). */
static int pattern_segments(segv *out, const pattern *p, const char *s, size_t n)
{
    out->n = 0;
    size_t prev = 0;
    int rc = TK_OK;
    if (!p->re) {
        if (p->lit.n == 0)
            return n ? seg_push(out, 0, n, 0) : TK_OK;
        size_t i = 0;
        while (i + p->lit.n <= n) {
            const char *f = memmem(s + i, n - i, p->lit.s, p->lit.n);
            if (!f)
                break;
            size_t st = (size_t)(f - s);
            if (st > prev && (rc = seg_push(out, prev, st, 0)))
                return rc;
            if ((rc = seg_push(out, st, st + p->lit.n, 1)))
                return rc;
            prev = i = st + p->lit.n;
        }
    } else {
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(p->re, NULL);
        if (!md)
            return tk__err(TK_ERR_NOMEM, "out of memory");
        size_t at = 0;
        while (at <= n) {
            int r = pcre2_match(p->re, (PCRE2_SPTR)s, n, at, PCRE2_NO_UTF_CHECK, md, NULL);
            if (r == PCRE2_ERROR_NOMATCH)
                break;
            if (r < 0) {
                PCRE2_UCHAR msg[256];
                pcre2_get_error_message(r, msg, sizeof msg);
                pcre2_match_data_free(md);
                return tk__err(TK_ERR_INVALID, "a pre-tokenizer regex failed on the input: %s", (const char *)msg);
            }
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            size_t ms = ov[0], me = ov[1];
            if (me == ms) { /* empty match: step over one character */
                if (ms >= n)
                    break;
                int32_t cp;
                at = ms + u8_next(s, n, ms, &cp);
                continue;
            }
            if (ms > prev && (rc = seg_push(out, prev, ms, 0)))
                break;
            if ((rc = seg_push(out, ms, me, 1)))
                break;
            prev = at = me;
        }
        pcre2_match_data_free(md);
        if (rc)
            return rc;
    }
    if (prev < n)
        rc = seg_push(out, prev, n, 0);
    return rc;
}

/* Each character that satisfies pred is a match of its own. */
static int char_segments(segv *out, int (*pred)(int32_t, int32_t), int32_t arg, const char *s, size_t n)
{
    out->n = 0;
    size_t last = 0;
    int rc = TK_OK;
    for (size_t i = 0; i < n;) {
        int32_t c;
        size_t k = u8_next(s, n, i, &c);
        if (pred(c, arg)) {
            if (last < i && (rc = seg_push(out, last, i, 0)))
                return rc;
            if ((rc = seg_push(out, i, i + k, 1)))
                return rc;
            last = i + k;
        }
        i += k;
    }
    if (last < n)
        rc = seg_push(out, last, n, 0);
    return rc;
}

enum { B_REMOVED, B_ISOLATED, B_MERGED_PREV, B_MERGED_NEXT, B_CONTIGUOUS };

/* Applies a split behaviour to the segments of in and appends the non-empty pieces to out
 * (tokenizers' NormalizedString::split). */
static int split_apply(piecev *out, const piece *in, segv *sg, int behavior, int invert)
{
    if (invert)
        for (size_t i = 0; i < sg->n; i++)
            sg->v[i].m = !sg->v[i].m;
    size_t k = 0; /* kept segments are compacted into sg->v[0..k), m = "remove" */
    int prev = 0;
    switch (behavior) {
    case B_REMOVED: k = sg->n; break;
    case B_ISOLATED:
        for (size_t i = 0; i < sg->n; i++)
            sg->v[i].m = 0;
        k = sg->n;
        break;
    case B_CONTIGUOUS:
        for (size_t i = 0; i < sg->n; i++) {
            seg g = sg->v[i];
            if (g.m == prev && k > 0)
                sg->v[k - 1].e = g.e;
            else
                sg->v[k++] = (seg){g.s, g.e, 0};
            prev = g.m;
        }
        break;
    case B_MERGED_PREV:
        for (size_t i = 0; i < sg->n; i++) {
            seg g = sg->v[i];
            if (g.m && !prev && k > 0)
                sg->v[k - 1].e = g.e;
            else
                sg->v[k++] = (seg){g.s, g.e, 0};
            prev = g.m;
        }
        break;
    case B_MERGED_NEXT: { /* walk backwards, then the kept list is reversed */
        size_t n = sg->n;
        seg *tmp = malloc((n ? n : 1) * sizeof *tmp);
        if (!tmp)
            return tk__err(TK_ERR_NOMEM, "out of memory");
        for (size_t j = n; j-- > 0;) {
            seg g = sg->v[j];
            if (g.m && !prev && k > 0)
                tmp[k - 1].s = g.s;
            else
                tmp[k++] = (seg){g.s, g.e, 0};
            prev = g.m;
        }
        for (size_t j = 0; j < k; j++)
            sg->v[j] = tmp[k - 1 - j];
        free(tmp);
        break;
    }
    }
    for (size_t i = 0; i < k; i++) {
        seg g = sg->v[i];
        if (g.m || g.e == g.s)
            continue;
        int rc = piece_push(out, in->s + g.s, g.e - g.s, in->first && g.s == 0);
        if (rc)
            return rc;
    }
    return TK_OK;
}

/* ---- the tokenizer --------------------------------------------------------------------------- */

enum { NM_NFC, NM_NFD, NM_NFKC, NM_NFKD, NM_LOWER, NM_STRIPACC, NM_BERT, NM_PREPEND, NM_REPLACE, NM_STRIP };
typedef struct {
    int type;
    int clean_text, chinese, strip_accents, lowercase; /* BertNormalizer */
    int left, right;                                   /* Strip */
    str s;                                             /* Prepend, Replace's content */
    pattern pat;                                       /* Replace */
} norm_step;

enum { PT_BYTELEVEL, PT_SPLIT, PT_METASPACE, PT_BERT, PT_WHITESPACE, PT_WSPLIT, PT_DIGITS, PT_PUNCT, PT_CHARDELIM };
enum { PS_ALWAYS, PS_FIRST, PS_NEVER };
typedef struct {
    int type;
    int add_prefix_space; /* ByteLevel */
    pattern pat;          /* ByteLevel (use_regex), Split, Whitespace */
    int behavior, invert; /* Split, Punctuation */
    int32_t ch;           /* Metaspace replacement, CharDelimiterSplit delimiter */
    int prepend_scheme, split;
    int individual; /* Digits */
} pre_step;

enum { D_BYTELEVEL, D_METASPACE, D_WORDPIECE, D_BYTEFALLBACK, D_FUSE, D_STRIP, D_REPLACE, D_BPE };
typedef struct {
    int type;
    str a;         /* WordPiece prefix, BPEDecoder suffix, Replace content */
    int cleanup;   /* WordPiece */
    int32_t ch;    /* Metaspace replacement, Strip content */
    int prepend_scheme;
    size_t start, stop; /* Strip */
    pattern pat;        /* Replace */
} dec_step;

enum { M_BPE, M_WORDPIECE, M_WORDLEVEL };

typedef struct {
    str content;
    str norm; /* content as the normaliser makes it (normalized tokens only) */
    int32_t id;
    int special, lstrip, rstrip, single_word, normalized;
} added_tok;

struct tk_tokenizer {
    uint32_t magic;
    /* the model */
    int mtype;
    str *vocab; /* model vocabulary by id; gaps have s == NULL */
    size_t nvocab;
    strmap vmap;
    pairmap merges;
    int byte_fallback, fuse_unk, ignore_merges;
    str csp, eow;   /* continuing_subword_prefix, end_of_word_suffix ("" when absent) */
    str unk;        /* unk_token ("" and has_unk 0 when absent) */
    int has_unk;
    int32_t byte_id[256]; /* "<0xXX>" in the vocabulary, -1 when absent */
    size_t max_chars;     /* WordPiece's max_input_chars_per_word */
    /* added tokens */
    added_tok *added;
    size_t nadded;
    strmap amap;     /* content → index in added */
    str *akeys;      /* the contents, for amap */
    /* added tokens by first byte, longest first ([0]: matched in the raw text, [1]: normalised):
     * abidx[k][abstart[k][b] .. abstart[k][b + 1]) */
    uint32_t *abidx[2];
    uint32_t abstart[2][257];
    /* pipeline */
    norm_step *norm;
    size_t nnorm;
    pre_step *pre;
    size_t npre;
    dec_step *dec;
    size_t ndec;
    int has_decoder;
    int32_t *post; /* the single-sequence template: ids, and -1 where the sequence goes */
    size_t npost;
    int has_post;
    /* ids → text */
    str *idtok;
    size_t nids;
    uint32_t bl_char[256]; /* ByteLevel: byte → code point */
    int16_t bl_byte[512];  /* ByteLevel: code point → byte, -1 */
};

static void pattern_free(pattern *p)
{
    if (p->re)
        pcre2_code_free(p->re);
    free(p->lit.s);
}

void tk_tokenizer_free(tk_tokenizer *t)
{
    if (!t || t->magic != TOK_MAGIC)
        return;
    t->magic = 0;
    for (size_t i = 0; i < t->nvocab; i++)
        free(t->vocab[i].s);
    free(t->vocab);
    free(t->vmap.slot);
    free(t->merges.key);
    free(t->merges.rank);
    free(t->merges.id);
    free(t->csp.s);
    free(t->eow.s);
    free(t->unk.s);
    for (size_t i = 0; i < t->nadded; i++) {
        free(t->added[i].content.s);
        free(t->added[i].norm.s);
    }
    free(t->added);
    free(t->akeys);
    free(t->amap.slot);
    free(t->abidx[0]);
    free(t->abidx[1]);
    for (size_t i = 0; i < t->nnorm; i++) {
        free(t->norm[i].s.s);
        pattern_free(&t->norm[i].pat);
    }
    free(t->norm);
    for (size_t i = 0; i < t->npre; i++)
        pattern_free(&t->pre[i].pat);
    free(t->pre);
    for (size_t i = 0; i < t->ndec; i++) {
        free(t->dec[i].a.s);
        pattern_free(&t->dec[i].pat);
    }
    free(t->dec);
    free(t->post);
    free(t->idtok);
    free(t);
}

/* ---- normalisers ----------------------------------------------------------------------------- */

static int lower_into(tk_buf *o, const char *s, size_t n)
{
    int rc = TK_OK;
    for (size_t i = 0; i < n && rc == TK_OK;) {
        int32_t c;
        if ((uint8_t)s[i] < 0x80) {
            c = (uint8_t)s[i++];
            rc = buf_putc(o, c >= 'A' && c <= 'Z' ? c + 32 : c);
            continue;
        }
        i += u8_next(s, n, i, &c);
        if (c == 0x130) /* İ: Rust's to_lowercase gives i + combining dot (SpecialCasing.txt) */
            rc = tk__buf_puts(o, "i\xCC\x87");
        else
            rc = buf_putc(o, utf8proc_tolower(c));
    }
    return rc;
}

static int is_ascii(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((uint8_t)s[i] >= 0x80)
            return 0;
    return 1;
}

static int unicode_form(tk_buf *o, const char *s, size_t n, int opts)
{
    if (n == 0)
        return TK_OK;
    if (is_ascii(s, n)) /* ASCII is the same in every normalisation form */
        return tk__buf_append(o, s, n);
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t k = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
                                      (utf8proc_option_t)(UTF8PROC_STABLE | opts));
    if (k < 0) {
        free(dst);
        return k == UTF8PROC_ERROR_NOMEM
                   ? tk__err(TK_ERR_NOMEM, "out of memory")
                   : tk__err(TK_ERR_INVALID, "unicode normalisation failed: %s", utf8proc_errmsg(k));
    }
    int rc = tk__buf_append(o, dst, (size_t)k);
    free(dst);
    return rc;
}

/* Drops marks: all of them (Mn, Mc, Me) for StripAccents, as unicode-normalization's
 * is_combining_mark; only Mn for BertNormalizer (is_mark_nonspacing). */
static int strip_marks(tk_buf *o, const char *s, size_t n, int all)
{
    int rc = TK_OK;
    for (size_t i = 0; i < n && rc == TK_OK;) {
        int32_t c;
        size_t k = u8_next(s, n, i, &c);
        utf8proc_category_t cat = utf8proc_category(c);
        if (!(cat == UTF8PROC_CATEGORY_MN || (all && (cat == UTF8PROC_CATEGORY_MC || cat == UTF8PROC_CATEGORY_ME))))
            rc = tk__buf_append(o, s + i, k);
        i += k;
    }
    return rc;
}

static int replace_all(tk_buf *o, const pattern *p, const str *with, const char *s, size_t n)
{
    segv sg = {0};
    int rc = pattern_segments(&sg, p, s, n);
    for (size_t i = 0; i < sg.n && rc == TK_OK; i++)
        rc = sg.v[i].m ? tk__buf_append(o, with->s, with->n) : tk__buf_append(o, s + sg.v[i].s, sg.v[i].e - sg.v[i].s);
    free(sg.v);
    return rc;
}

/* Runs one normaliser over s[0..n) into o (o starts empty). */
static int norm_apply(const norm_step *st, tk_buf *o, const char *s, size_t n)
{
    int rc = TK_OK;
    switch (st->type) {
    case NM_NFC: return unicode_form(o, s, n, UTF8PROC_COMPOSE);
    case NM_NFD: return unicode_form(o, s, n, UTF8PROC_DECOMPOSE);
    case NM_NFKC: return unicode_form(o, s, n, UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
    case NM_NFKD: return unicode_form(o, s, n, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
    case NM_LOWER: return lower_into(o, s, n);
    case NM_STRIPACC: return strip_marks(o, s, n, 1);
    case NM_PREPEND:
        if (n && (rc = tk__buf_append(o, st->s.s, st->s.n)))
            return rc;
        return tk__buf_append(o, s, n);
    case NM_REPLACE: return replace_all(o, &st->pat, &st->s, s, n);
    case NM_STRIP: {
        size_t a = 0, b = n;
        int32_t c;
        while (st->left && a < b) {
            size_t k = u8_next(s, n, a, &c);
            if (!is_ws(c))
                break;
            a += k;
        }
        while (st->right && b > a) {
            size_t j = b - 1;
            while (j > a && ((uint8_t)s[j] & 0xC0) == 0x80)
                j--;
            u8_next(s, n, j, &c);
            if (!is_ws(c))
                break;
            b = j;
        }
        return tk__buf_append(o, s + a, b - a);
    }
    case NM_BERT: {
        tk_buf t1 = TK_BUF_INIT, t2 = TK_BUF_INIT;
        for (size_t i = 0; i < n && rc == TK_OK;) {
            int32_t c;
            size_t k = u8_next(s, n, i, &c);
            i += k;
            if (st->clean_text && c < 0x80) {
                if (c == 0 || (c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7f)
                    continue; /* Cc */
                if (is_ws(c))
                    c = ' ';
            } else if (st->clean_text) {
                utf8proc_category_t cat = utf8proc_category(c);
                int control =
                    c != '\t' && c != '\n' && c != '\r' &&
                    (cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF || cat == UTF8PROC_CATEGORY_CN ||
                     cat == UTF8PROC_CATEGORY_CO || cat == UTF8PROC_CATEGORY_CS);
                if (c == 0 || c == 0xFFFD || control)
                    continue;
                if (is_ws(c))
                    c = ' ';
            }
            if (st->chinese && is_cjk(c)) {
                if (!(rc = tk__buf_puts(&t1, " ")) && !(rc = buf_putc(&t1, c)))
                    rc = tk__buf_puts(&t1, " ");
            } else {
                rc = buf_putc(&t1, c);
            }
        }
        if (rc == TK_OK && st->strip_accents) {
            if (!(rc = unicode_form(&t2, t1.data ? t1.data : "", t1.len, UTF8PROC_DECOMPOSE))) {
                t1.len = 0;
                rc = strip_marks(&t1, t2.data ? t2.data : "", t2.len, 0);
            }
        }
        if (rc == TK_OK)
            rc = st->lowercase ? lower_into(o, t1.data ? t1.data : "", t1.len)
                               : tk__buf_append(o, t1.data ? t1.data : "", t1.len);
        tk__buf_free(&t1);
        tk__buf_free(&t2);
        return rc;
    }
    }
    return tk__err(TK_ERR_INTERNAL, "unknown normaliser step %d", st->type);
}

/* Runs every normaliser; *out is malloc'd (NUL-terminated). */
static int normalize(const tk_tokenizer *t, char **out, size_t *on, const char *s, size_t n)
{
    tk_buf cur = TK_BUF_INIT, nxt = TK_BUF_INIT;
    int rc = tk__buf_append(&cur, s, n);
    for (size_t i = 0; i < t->nnorm && rc == TK_OK; i++) {
        nxt.len = 0;
        if ((rc = norm_apply(&t->norm[i], &nxt, cur.data ? cur.data : "", cur.len)))
            break;
        tk_buf sw = cur;
        cur = nxt;
        nxt = sw;
    }
    tk__buf_free(&nxt);
    if (rc) {
        tk__buf_free(&cur);
        return rc;
    }
    if (!cur.data && (rc = tk__buf_puts(&cur, "")))
        return rc;
    *on = cur.len;
    *out = tk__buf_steal(&cur);
    return *out ? TK_OK : tk__err(TK_ERR_NOMEM, "out of memory");
}

/* ---- pre-tokenisers -------------------------------------------------------------------------- */

static int pred_ws(int32_t c, int32_t a)
{
    (void)a;
    return is_ws(c);
}
static int pred_punct(int32_t c, int32_t a)
{
    (void)a;
    return is_punct(c);
}
static int pred_num(int32_t c, int32_t a)
{
    (void)a;
    return is_numeric(c);
}
static int pred_eq(int32_t c, int32_t a) { return c == a; }

static int pre_apply(const tk_tokenizer *t, const pre_step *st, piecev *out, const piece *in, segv *sg)
{
    int rc = TK_OK;
    switch (st->type) {
    case PT_BYTELEVEL: {
        tk_buf b = TK_BUF_INIT;
        if (st->add_prefix_space && (in->n == 0 || in->s[0] != ' '))
            rc = tk__buf_puts(&b, " ");
        if (!rc)
            rc = tk__buf_append(&b, in->s, in->n);
        piecev parts = {0};
        piece whole = {b.data, b.len, in->first};
        if (!rc) {
            if (st->pat.re) {
                if (!(rc = pattern_segments(sg, &st->pat, b.data, b.len)))
                    rc = split_apply(&parts, &whole, sg, B_ISOLATED, 0);
            } else if (b.len) {
                rc = piece_push(&parts, b.data, b.len, in->first);
            }
        }
        tk__buf_free(&b);
        for (size_t i = 0; i < parts.n && rc == TK_OK; i++) { /* bytes → the printable alphabet */
            tk_buf m = TK_BUF_INIT;
            for (size_t j = 0; j < parts.v[i].n && rc == TK_OK; j++)
                rc = buf_putc(&m, (int32_t)t->bl_char[(uint8_t)parts.v[i].s[j]]);
            if (!rc)
                rc = piece_push(out, m.data, m.len, parts.v[i].first);
            tk__buf_free(&m);
        }
        piecev_free(&parts);
        return rc;
    }
    case PT_SPLIT:
        if ((rc = pattern_segments(sg, &st->pat, in->s, in->n)))
            return rc;
        return split_apply(out, in, sg, st->behavior, st->invert);
    case PT_WHITESPACE: /* \w+|[^\w\s]+ kept, the rest removed */
        if ((rc = pattern_segments(sg, &st->pat, in->s, in->n)))
            return rc;
        return split_apply(out, in, sg, B_REMOVED, 1);
    case PT_WSPLIT:
        if ((rc = char_segments(sg, pred_ws, 0, in->s, in->n)))
            return rc;
        return split_apply(out, in, sg, B_REMOVED, 0);
    case PT_CHARDELIM:
        if ((rc = char_segments(sg, pred_eq, st->ch, in->s, in->n)))
            return rc;
        return split_apply(out, in, sg, B_REMOVED, 0);
    case PT_PUNCT:
        if ((rc = char_segments(sg, pred_punct, 0, in->s, in->n)))
            return rc;
        return split_apply(out, in, sg, st->behavior, 0);
    case PT_DIGITS:
        if ((rc = char_segments(sg, pred_num, 0, in->s, in->n)))
            return rc;
        return split_apply(out, in, sg, st->individual ? B_ISOLATED : B_CONTIGUOUS, 0);
    case PT_BERT: {
        piecev words = {0};
        if (!(rc = char_segments(sg, pred_ws, 0, in->s, in->n)))
            rc = split_apply(&words, in, sg, B_REMOVED, 0);
        for (size_t i = 0; i < words.n && rc == TK_OK; i++)
            if (!(rc = char_segments(sg, pred_punct, 0, words.v[i].s, words.v[i].n)))
                rc = split_apply(out, &words.v[i], sg, B_ISOLATED, 0);
        piecev_free(&words);
        return rc;
    }
    case PT_METASPACE: {
        tk_buf b = TK_BUF_INIT;
        uint8_t r[4];
        size_t rn = (size_t)utf8proc_encode_char(st->ch, r);
        int starts = in->n >= rn && memcmp(in->s, r, rn) == 0;
        /* the replacement goes first when the scheme asks and the text does not start with it
         * (after spaces became the replacement) */
        int lead_space = in->n > 0 && in->s[0] == ' ';
        if (!starts && !lead_space &&
            (st->prepend_scheme == PS_ALWAYS || (st->prepend_scheme == PS_FIRST && in->first)))
            rc = tk__buf_append(&b, r, rn);
        for (size_t i = 0; i < in->n && rc == TK_OK; i++)
            rc = in->s[i] == ' ' ? tk__buf_append(&b, r, rn) : tk__buf_append(&b, in->s + i, 1);
        if (!rc) {
            piece whole = {b.data ? b.data : "", b.len, in->first};
            if (st->split) {
                if (!(rc = char_segments(sg, pred_eq, st->ch, whole.s, whole.n)))
                    rc = split_apply(out, &whole, sg, B_MERGED_NEXT, 0);
            } else if (whole.n) {
                rc = piece_push(out, whole.s, whole.n, whole.first);
            }
        }
        tk__buf_free(&b);
        return rc;
    }
    }
    return tk__err(TK_ERR_INTERNAL, "unknown pre-tokenizer step %d", st->type);
}

/* ---- models ---------------------------------------------------------------------------------- */

typedef struct {
    int32_t id, prev, next;
    uint32_t len; /* 0: merged away */
} sym;

typedef struct {
    uint32_t rank, pos;
    int32_t id;
} mrg;

typedef struct { /* per-call scratch space, reused across pieces */
    sym *sy;
    mrg *hp;
    size_t sycap, hpcap, nhp;
    tk_buf tmp;
} scratch;

static int mrg_less(const mrg *a, const mrg *b) { return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos; }

static void heap_push(scratch *x, mrg m)
{
    size_t i = x->nhp++;
    x->hp[i] = m;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!mrg_less(&x->hp[i], &x->hp[p]))
            break;
        mrg t = x->hp[i];
        x->hp[i] = x->hp[p];
        x->hp[p] = t;
        i = p;
    }
}

static mrg heap_pop(scratch *x)
{
    mrg top = x->hp[0];
    x->hp[0] = x->hp[--x->nhp];
    for (size_t i = 0;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < x->nhp && mrg_less(&x->hp[l], &x->hp[m]))
            m = l;
        if (r < x->nhp && mrg_less(&x->hp[r], &x->hp[m]))
            m = r;
        if (m == i)
            break;
        mrg t = x->hp[i];
        x->hp[i] = x->hp[m];
        x->hp[m] = t;
        i = m;
    }
    return top;
}

static int64_t vocab_get(const tk_tokenizer *t, const char *s, size_t n)
{
    return strmap_get(&t->vmap, t->vocab, s, n);
}

static int unk_id(const tk_tokenizer *t, int32_t *id)
{
    int64_t u = t->has_unk ? vocab_get(t, t->unk.s, t->unk.n) : -1;
    if (u < 0)
        return tk__err(TK_ERR_INVALID,
                       "the input needs the unknown token, but model.unk_token %s%s%s is not in "
                       "model.vocab",
                       t->has_unk ? "'" : "", t->has_unk ? t->unk.s : "(null)", t->has_unk ? "'" : "");
    *id = (int32_t)u;
    return TK_OK;
}

static int sym_add(scratch *x, size_t *ns, int32_t id, uint32_t len)
{
    if (*ns == x->sycap) {
        size_t cap = x->sycap ? x->sycap * 2 : 64;
        sym *v = realloc(x->sy, cap * sizeof *v);
        if (!v)
            return tk__err(TK_ERR_NOMEM, "out of memory");
        x->sy = v;
        x->sycap = cap;
    }
    x->sy[*ns] = (sym){id, (int32_t)*ns - 1, (int32_t)*ns + 1, len};
    (*ns)++;
    return TK_OK;
}

/* BPE over one piece (tokenizers' BPE::merge_word + Word::merge_all). */
static int bpe_piece(const tk_tokenizer *t, scratch *x, i32v *out, const char *s, size_t n)
{
    if (n == 0)
        return TK_OK;
    if (t->ignore_merges) {
        int64_t id = vocab_get(t, s, n);
        if (id >= 0)
            return i32_push(out, (int32_t)id);
    }
    size_t ns = 0;
    int rc = TK_OK;
    int32_t pend_unk = -1; /* a pending unknown token (fuse_unk joins runs of them) */
    for (size_t i = 0; i < n && rc == TK_OK;) {
        int32_t c;
        size_t k = u8_next(s, n, i, &c);
        int first = i == 0, last = i + k == n;
        const char *q = s + i;
        size_t qn = k;
        if ((!first && t->csp.n) || (last && t->eow.n)) {
            x->tmp.len = 0;
            if (!first && (rc = tk__buf_append(&x->tmp, t->csp.s, t->csp.n)))
                break;
            if ((rc = tk__buf_append(&x->tmp, s + i, k)))
                break;
            if (last && (rc = tk__buf_append(&x->tmp, t->eow.s, t->eow.n)))
                break;
            q = x->tmp.data;
            qn = x->tmp.len;
        }
        i += k;
        int64_t id = vocab_get(t, q, qn);
        if (id >= 0) {
            if (pend_unk >= 0) {
                rc = sym_add(x, &ns, pend_unk, 1);
                pend_unk = -1;
                if (rc)
                    break;
            }
            rc = sym_add(x, &ns, (int32_t)id, (uint32_t)k);
            continue;
        }
        if (t->byte_fallback) {
            int all = 1;
            for (size_t j = 0; j < qn; j++)
                all &= t->byte_id[(uint8_t)q[j]] >= 0;
            if (all) {
                for (size_t j = 0; j < qn && rc == TK_OK; j++)
                    rc = sym_add(x, &ns, t->byte_id[(uint8_t)q[j]], 1);
                continue;
            }
        }
        if (t->has_unk) {
            int32_t u;
            if ((rc = unk_id(t, &u)))
                break;
            if (pend_unk >= 0 && !t->fuse_unk)
                rc = sym_add(x, &ns, pend_unk, 1);
            pend_unk = u;
        } /* without unk_token, tokenizers drops the character */
    }
    if (rc == TK_OK && pend_unk >= 0)
        rc = sym_add(x, &ns, pend_unk, 1);
    if (rc)
        return rc;
    if (ns == 0)
        return TK_OK;
    x->sy[ns - 1].next = -1;
    if (x->hpcap < 3 * ns + 4) {
        mrg *h = realloc(x->hp, (3 * ns + 4) * sizeof *h);
        if (!h)
            return tk__err(TK_ERR_NOMEM, "out of memory");
        x->hp = h;
        x->hpcap = 3 * ns + 4;
    }
    x->nhp = 0;
    uint32_t rank;
    int32_t nid;
    for (size_t i = 0; i + 1 < ns; i++)
        if (pairmap_get(&t->merges, x->sy[i].id, x->sy[i + 1].id, &rank, &nid))
            heap_push(x, (mrg){rank, (uint32_t)i, nid});
    while (x->nhp) {
        mrg top = heap_pop(x);
        sym *a = &x->sy[top.pos];
        if (a->len == 0 || a->next < 0)
            continue;
        sym *b = &x->sy[a->next];
        if (!pairmap_get(&t->merges, a->id, b->id, &rank, &nid) || nid != top.id)
            continue; /* a stale entry: one side has changed since it was queued */
        a->id = top.id;
        a->len += b->len;
        b->len = 0;
        a->next = b->next;
        if (a->next >= 0)
            x->sy[a->next].prev = (int32_t)top.pos;
        if (x->nhp + 2 > x->hpcap) { /* cannot happen: each merge adds at most two entries */
            return tk__err(TK_ERR_INTERNAL, "BPE merge queue overflow");
        }
        if (a->prev >= 0 && pairmap_get(&t->merges, x->sy[a->prev].id, a->id, &rank, &nid))
            heap_push(x, (mrg){rank, (uint32_t)a->prev, nid});
        if (a->next >= 0 && pairmap_get(&t->merges, a->id, x->sy[a->next].id, &rank, &nid))
            heap_push(x, (mrg){rank, top.pos, nid});
    }
    for (size_t i = 0; i < ns && rc == TK_OK; i++)
        if (x->sy[i].len)
            rc = i32_push(out, x->sy[i].id);
    return rc;
}

static int wordpiece_piece(const tk_tokenizer *t, scratch *x, i32v *out, const char *s, size_t n)
{
    size_t nchars = 0;
    for (size_t i = 0; i < n; i++)
        nchars += ((uint8_t)s[i] & 0xC0) != 0x80;
    int32_t u;
    int rc;
    if (nchars > t->max_chars) {
        if ((rc = unk_id(t, &u)))
            return rc;
        return i32_push(out, u);
    }
    size_t mark = out->n;
    for (size_t start = 0; start < n;) {
        size_t end = n;
        int64_t found = -1;
        while (start < end) {
            x->tmp.len = 0;
            if (start > 0 && (rc = tk__buf_append(&x->tmp, t->csp.s, t->csp.n)))
                return rc;
            if ((rc = tk__buf_append(&x->tmp, s + start, end - start)))
                return rc;
            found = vocab_get(t, x->tmp.data, x->tmp.len);
            if (found >= 0)
                break;
            do /* back off one character */
                end--;
            while (end > start && ((uint8_t)s[end] & 0xC0) == 0x80);
        }
        if (found < 0) { /* a part of the word is not in the vocabulary: the word is unknown */
            out->n = mark;
            if ((rc = unk_id(t, &u)))
                return rc;
            return i32_push(out, u);
        }
        if ((rc = i32_push(out, (int32_t)found)))
            return rc;
        start = end;
    }
    return TK_OK;
}

static int model_piece(const tk_tokenizer *t, scratch *x, i32v *out, const char *s, size_t n)
{
    if (t->mtype == M_BPE)
        return bpe_piece(t, x, out, s, n);
    if (t->mtype == M_WORDPIECE)
        return wordpiece_piece(t, x, out, s, n);
    int64_t id = vocab_get(t, s, n); /* WordLevel */
    if (id >= 0)
        return i32_push(out, (int32_t)id);
    int32_t u;
    int rc = unk_id(t, &u);
    return rc ? rc : i32_push(out, u);
}

/* ---- added tokens ---------------------------------------------------------------------------- */

/* Splits s[0..n) on the added tokens of one kind (normalized or not): leftmost-longest matches,
 * then single_word, lstrip and rstrip as tokenizers' AddedVocabulary::find_matches applies them.
 * Appends segments with m = added index + 1 for a token, 0 for text. */
static int added_segments(const tk_tokenizer *t, segv *sg, int normalized, const char *s, size_t n)
{
    sg->n = 0;
    size_t last = 0; /* end of what is already assigned */
    int rc = TK_OK;
    const uint32_t *idx = t->abidx[normalized];
    const uint32_t *start = t->abstart[normalized];
    for (size_t i = 0; i < n;) {
        /* the candidates start with this byte, longest first: the first that matches wins. A
         * token starts with a UTF-8 lead byte, so stepping one byte never starts a match inside
         * a character. */
        uint8_t b = (uint8_t)s[i];
        size_t best = 0, bestlen = 0;
        for (uint32_t k = start[b]; k < start[b + 1]; k++) {
            const added_tok *at = &t->added[idx[k]];
            const str *c = normalized ? &at->norm : &at->content;
            if (c->n <= n - i && memcmp(s + i, c->s, c->n) == 0) {
                best = idx[k] + 1;
                bestlen = c->n;
                break;
            }
        }
        if (!best) {
            i++;
            continue;
        }
        const added_tok *at = &t->added[best - 1];
        size_t ms = i, me = i + bestlen;
        i = me;
        if (at->single_word) {
            int32_t c;
            int before = 0, after = 0;
            if (ms > 0) {
                size_t j = ms - 1;
                while (j > 0 && ((uint8_t)s[j] & 0xC0) == 0x80)
                    j--;
                u8_next(s, n, j, &c);
                before = is_word(c);
            }
            if (me < n) {
                u8_next(s, n, me, &c);
                after = is_word(c);
            }
            if (before || after)
                continue;
        }
        if (at->lstrip) {
            size_t j = ms;
            while (j > last) {
                size_t p = j - 1;
                while (p > last && ((uint8_t)s[p] & 0xC0) == 0x80)
                    p--;
                int32_t c;
                u8_next(s, n, p, &c);
                if (!is_ws(c))
                    break;
                j = p;
            }
            ms = j;
        }
        if (at->rstrip) {
            while (me < n) {
                int32_t c;
                size_t k = u8_next(s, n, me, &c);
                if (!is_ws(c))
                    break;
                me += k;
            }
            i = me;
        }
        if (ms > last && (rc = seg_push(sg, last, ms, 0)))
            return rc;
        if ((rc = seg_push(sg, ms, me, (int)best)))
            return rc;
        last = me;
    }
    if (last < n)
        rc = seg_push(sg, last, n, 0);
    return rc;
}

/* Normalises, pre-tokenises and encodes one stretch of text that holds no non-normalized added
 * token; `first` when it starts the input. */
static int encode_text(const tk_tokenizer *t, scratch *x, i32v *out, const char *s, size_t n, int first)
{
    char *ns = NULL;
    size_t nn = 0;
    segv asg = {0}, sg = {0};
    piecev cur = {0}, nxt = {0};
    int rc = normalize(t, &ns, &nn, s, n);
    if (!rc)
        rc = added_segments(t, &asg, 1, ns, nn);
    for (size_t g = 0; g < asg.n && rc == TK_OK; g++) {
        seg a = asg.v[g];
        if (a.m) {
            rc = i32_push(out, t->added[a.m - 1].id);
            continue;
        }
        piecev_free(&cur);
        if ((rc = piece_push(&cur, ns + a.s, a.e - a.s, first && a.s == 0)))
            break;
        for (size_t p = 0; p < t->npre && rc == TK_OK; p++) {
            for (size_t i = 0; i < cur.n && rc == TK_OK; i++)
                rc = pre_apply(t, &t->pre[p], &nxt, &cur.v[i], &sg);
            piecev_free(&cur);
            cur = nxt;
            memset(&nxt, 0, sizeof nxt);
        }
        for (size_t i = 0; i < cur.n && rc == TK_OK; i++)
            rc = model_piece(t, x, out, cur.v[i].s, cur.v[i].n);
    }
    piecev_free(&cur);
    piecev_free(&nxt);
    free(asg.v);
    free(sg.v);
    free(ns);
    return rc;
}

#define TOK_OK(t) ((t) && (t)->magic == TOK_MAGIC)

int tk_tokenizer_encode(int32_t **ids, size_t *n, const tk_tokenizer *t, const char *text, size_t len, int add_special)
{
    if (ids)
        *ids = NULL;
    if (n)
        *n = 0;
    if (!ids || !n || !TOK_OK(t) || (!text && len))
        return tk__err(TK_ERR_INVALID, "tk_tokenizer_encode: %s",
                       !TOK_OK(t) ? "not a tokenizer (NULL or freed)" : "NULL argument");
    if (!text)
        text = "";
    if (!u8_valid(text, len))
        return tk__err(TK_ERR_INVALID, "the text is not valid UTF-8\n"
                                       "HINT: tokenizers take UTF-8; convert the input first "
                                       "(iconv -t UTF-8)");
    scratch x = {0};
    segv sg = {0};
    i32v body = {0}, res = {0};
    int rc = added_segments(t, &sg, 0, text, len);
    for (size_t g = 0; g < sg.n && rc == TK_OK; g++) {
        seg a = sg.v[g];
        rc = a.m ? i32_push(&body, t->added[a.m - 1].id) : encode_text(t, &x, &body, text + a.s, a.e - a.s, a.s == 0);
    }
    if (rc == TK_OK && add_special && t->has_post) {
        for (size_t i = 0; i < t->npost && rc == TK_OK; i++) {
            if (t->post[i] != -1) {
                rc = i32_push(&res, t->post[i]);
                continue;
            }
            for (size_t j = 0; j < body.n && rc == TK_OK; j++)
                rc = i32_push(&res, body.v[j]);
        }
        free(body.v);
        body = res;
        memset(&res, 0, sizeof res);
    }
    if (rc == TK_OK && !body.v && (rc = i32_push(&body, 0)) == TK_OK)
        body.n = 0; /* an empty result is still a valid pointer */
    free(sg.v);
    free(x.sy);
    free(x.hp);
    tk__buf_free(&x.tmp);
    if (rc) {
        free(body.v);
        free(res.v);
        return rc;
    }
    *ids = body.v;
    *n = body.n;
    return TK_OK;
}

/* ---- decoding -------------------------------------------------------------------------------- */

typedef struct {
    tk_buf *v;
    size_t n, cap;
} bufv;

static int bufv_push(bufv *a, const char *s, size_t n)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 32;
        tk_buf *v = realloc(a->v, cap * sizeof *v);
        if (!v)
            return tk__err(TK_ERR_NOMEM, "out of memory");
        a->v = v;
        a->cap = cap;
    }
    tk_buf b = TK_BUF_INIT;
    int rc = tk__buf_append(&b, s, n); /* allocates even for n == 0: b.data is never NULL after */
    if (rc) {
        tk__buf_free(&b);
        return rc;
    }
    a->v[a->n++] = b;
    return TK_OK;
}

static void bufv_free(bufv *a)
{
    for (size_t i = 0; i < a->n; i++)
        tk__buf_free(&a->v[i]);
    free(a->v);
    memset(a, 0, sizeof *a);
}

static int replace_str(tk_buf *o, const char *s, size_t n, const char *from, const char *to)
{
    size_t fn = strlen(from);
    int rc = TK_OK;
    for (size_t i = 0; i < n && rc == TK_OK;) {
        if (i + fn <= n && memcmp(s + i, from, fn) == 0) {
            rc = tk__buf_puts(o, to);
            i += fn;
        } else {
            rc = tk__buf_append(o, s + i, 1);
            i++;
        }
    }
    return rc;
}

/* tokenizers' WordPiece decoder cleanup(): undo the spaces the tokenizer put around punctuation. */
static int wp_cleanup(tk_buf *b)
{
    static const char *const pairs[][2] = {
        {" .", "."},   {" ?", "?"},           {" !", "!"},   {" ,", ","},     {" ' ", "'"},    {" n't", "n't"},
        {" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"},
    };
    for (size_t p = 0; p < sizeof pairs / sizeof *pairs; p++) {
        if (!b->len || !memmem(b->data, b->len, pairs[p][0], strlen(pairs[p][0])))
            continue;
        tk_buf o = TK_BUF_INIT;
        int rc = replace_str(&o, b->data, b->len, pairs[p][0], pairs[p][1]);
        if (rc) {
            tk__buf_free(&o);
            return rc;
        }
        tk__buf_free(b);
        *b = o;
        if (!b->data && (rc = tk__buf_append(b, "", 0)))
            return rc;
    }
    return TK_OK;
}

/* Each decoder step below maps the token strings in `in` to the strings it appends to `out`, as
 * tokenizers' decoder of the same name does. */

/* ByteLevel: the byte alphabet back to bytes, joined into one string, invalid UTF-8 replaced. */
static int dec_bytelevel(const tk_tokenizer *t, const bufv *in, bufv *out)
{
    int rc = TK_OK;
    tk_buf bytes = TK_BUF_INIT, o = TK_BUF_INIT;
    for (size_t i = 0; i < in->n && rc == TK_OK; i++) {
        const tk_buf *b = &in->v[i];
        size_t mark = bytes.len;
        int all = 1;
        for (size_t j = 0; j < b->len && rc == TK_OK && all;) {
            int32_t c;
            j += u8_next(b->data, b->len, j, &c);
            if (c < 0 || c >= 512 || t->bl_byte[c] < 0) {
                all = 0;
                break;
            }
            uint8_t y = (uint8_t)t->bl_byte[c];
            rc = tk__buf_append(&bytes, &y, 1);
        }
        if (!all) { /* a token outside the byte alphabet (an added token) stays as it is */
            bytes.len = mark;
            rc = tk__buf_append(&bytes, b->data, b->len);
        }
    }
    if (!rc)
        rc = utf8_lossy(&o, (const uint8_t *)(bytes.data ? bytes.data : ""), bytes.len);
    if (!rc)
        rc = bufv_push(out, o.data ? o.data : "", o.len);
    tk__buf_free(&bytes);
    tk__buf_free(&o);
    return rc;
}

/* Metaspace: the replacement character back to a space, except the first token's prepended one. */
static int dec_metaspace(const dec_step *st, const bufv *in, bufv *out)
{
    int rc = TK_OK;
    uint8_t r[4];
    size_t rn = (size_t)utf8proc_encode_char(st->ch, r);
    for (size_t i = 0; i < in->n && rc == TK_OK; i++) {
        tk_buf o = TK_BUF_INIT;
        const tk_buf *b = &in->v[i];
        for (size_t j = 0; j < b->len && rc == TK_OK;) {
            if (j + rn <= b->len && memcmp(b->data + j, r, rn) == 0) {
                if (!(i == 0 && st->prepend_scheme != PS_NEVER))
                    rc = tk__buf_puts(&o, " ");
                j += rn;
            } else {
                rc = tk__buf_append(&o, b->data + j, 1);
                j++;
            }
        }
        if (!rc)
            rc = bufv_push(out, o.data ? o.data : "", o.len);
        tk__buf_free(&o);
    }
    return rc;
}

/* WordPiece: a continuing token loses its prefix, any other token after the first gets a space. */
static int dec_wordpiece(const dec_step *st, const bufv *in, bufv *out)
{
    int rc = TK_OK;
    for (size_t i = 0; i < in->n && rc == TK_OK; i++) {
        tk_buf o = TK_BUF_INIT;
        const tk_buf *b = &in->v[i];
        if (i != 0 && b->len >= st->a.n && memcmp(b->data, st->a.s, st->a.n) == 0) {
            rc = tk__buf_append(&o, b->data + st->a.n, b->len - st->a.n);
        } else {
            if (i != 0)
                rc = tk__buf_puts(&o, " ");
            if (!rc)
                rc = tk__buf_append(&o, b->data, b->len);
        }
        if (!rc && st->cleanup)
            rc = wp_cleanup(&o);
        if (!rc)
            rc = bufv_push(out, o.data ? o.data : "", o.len);
        tk__buf_free(&o);
    }
    return rc;
}

/* ByteFallback: runs of <0xNN> tokens become their bytes (one U+FFFD per byte when not UTF-8). */
static int dec_bytefallback(const bufv *in, bufv *out)
{
    int rc = TK_OK;
    tk_buf pend = TK_BUF_INIT;
    for (size_t i = 0; i <= in->n && rc == TK_OK; i++) {
        const tk_buf *b = i < in->n ? &in->v[i] : NULL;
        unsigned v;
        char hx[3] = {0};
        int isbyte = 0;
        if (b && b->len == 6 && !memcmp(b->data, "<0x", 3) && b->data[5] == '>') {
            hx[0] = b->data[3];
            hx[1] = b->data[4];
            char *end;
            v = (unsigned)strtoul(hx, &end, 16);
            isbyte = end == hx + 2 && isxdigit((unsigned char)hx[0]);
            if (isbyte) {
                uint8_t y = (uint8_t)v;
                rc = tk__buf_append(&pend, &y, 1);
                continue;
            }
        }
        if (pend.len) {
            if (u8_valid(pend.data, pend.len)) {
                rc = bufv_push(out, pend.data, pend.len);
            } else {
                for (size_t j = 0; j < pend.len && rc == TK_OK; j++)
                    rc = bufv_push(out, "\xEF\xBF\xBD", 3);
            }
            pend.len = 0;
        }
        if (b && !rc)
            rc = bufv_push(out, b->data, b->len);
    }
    tk__buf_free(&pend);
    return rc;
}

/* Fuse: all the tokens joined into one string. */
static int dec_fuse(const bufv *in, bufv *out)
{
    int rc = TK_OK;
    tk_buf o = TK_BUF_INIT;
    for (size_t i = 0; i < in->n && rc == TK_OK; i++)
        rc = tk__buf_append(&o, in->v[i].data, in->v[i].len);
    if (!rc)
        rc = bufv_push(out, o.data ? o.data : "", o.len);
    tk__buf_free(&o);
    return rc;
}

/* Strip: up to `start` leading and `stop` trailing copies of the content character removed. */
static int dec_strip(const dec_step *st, const bufv *in, bufv *out)
{
    int rc = TK_OK;
    uint8_t r[4];
    size_t rn = (size_t)utf8proc_encode_char(st->ch, r);
    for (size_t i = 0; i < in->n && rc == TK_OK; i++) {
        const tk_buf *b = &in->v[i];
        size_t a = 0, e = b->len;
        for (size_t k = 0; k < st->start && a + rn <= e && !memcmp(b->data + a, r, rn); k++)
            a += rn;
        for (size_t k = 0; k < st->stop && e >= a + rn && !memcmp(b->data + e - rn, r, rn); k++)
            e -= rn;
        rc = bufv_push(out, b->data + a, e - a);
    }
    return rc;
}

/* Replace: every match of the pattern replaced with the content. */
static int dec_replace(const dec_step *st, const bufv *in, bufv *out)
{
    int rc = TK_OK;
    for (size_t i = 0; i < in->n && rc == TK_OK; i++) {
        tk_buf o = TK_BUF_INIT;
        rc = replace_all(&o, &st->pat, &st->a, in->v[i].data, in->v[i].len);
        if (!rc)
            rc = bufv_push(out, o.data ? o.data : "", o.len);
        tk__buf_free(&o);
    }
    return rc;
}

/* BPEDecoder: the suffix becomes a space, or nothing in the last token. */
static int dec_bpe(const dec_step *st, const bufv *in, bufv *out)
{
    int rc = TK_OK;
    for (size_t i = 0; i < in->n && rc == TK_OK; i++) {
        tk_buf o = TK_BUF_INIT;
        char *suf = tk__strndup(st->a.s, st->a.n);
        if (!suf)
            return tk__err(TK_ERR_NOMEM, "out of memory");
        rc = st->a.n ? replace_str(&o, in->v[i].data, in->v[i].len, suf, i + 1 == in->n ? "" : " ")
                     : tk__buf_append(&o, in->v[i].data, in->v[i].len);
        free(suf);
        if (!rc)
            rc = bufv_push(out, o.data ? o.data : "", o.len);
        tk__buf_free(&o);
    }
    return rc;
}

static int dec_apply(const tk_tokenizer *t, const dec_step *st, bufv *in, bufv *out)
{
    switch (st->type) {
    case D_BYTELEVEL: return dec_bytelevel(t, in, out);
    case D_METASPACE: return dec_metaspace(st, in, out);
    case D_WORDPIECE: return dec_wordpiece(st, in, out);
    case D_BYTEFALLBACK: return dec_bytefallback(in, out);
    case D_FUSE: return dec_fuse(in, out);
    case D_STRIP: return dec_strip(st, in, out);
    case D_REPLACE: return dec_replace(st, in, out);
    case D_BPE: return dec_bpe(st, in, out);
    }
    return tk__err(TK_ERR_INTERNAL, "unknown decoder step %d", st->type);
}

static int is_special_text(const tk_tokenizer *t, const str *s)
{
    int64_t a = strmap_get(&t->amap, t->akeys, s->s, s->n);
    return a >= 0 && t->added[a].special;
}

int tk_tokenizer_decode(char **text, const tk_tokenizer *t, const int32_t *ids, size_t n, int skip_special)
{
    if (text)
        *text = NULL;
    if (!text || !TOK_OK(t) || (!ids && n))
        return tk__err(TK_ERR_INVALID, "tk_tokenizer_decode: %s",
                       !TOK_OK(t) ? "not a tokenizer (NULL or freed)" : "NULL argument");
    bufv cur = {0}, nxt = {0};
    int rc = TK_OK;
    for (size_t i = 0; i < n && rc == TK_OK; i++) {
        int32_t id = ids[i];
        if (id < 0 || (size_t)id >= t->nids || !t->idtok[id].s) {
            rc = tk__err(TK_ERR_INVALID, "id %" PRId32 " at position %zu is not in the vocabulary (ids 0..%zu)", id, i,
                         t->nids ? t->nids - 1 : 0);
            break;
        }
        if (skip_special && is_special_text(t, &t->idtok[id]))
            continue;
        rc = bufv_push(&cur, t->idtok[id].s, t->idtok[id].n);
    }
    tk_buf o = TK_BUF_INIT;
    if (rc == TK_OK && t->has_decoder) {
        for (size_t d = 0; d < t->ndec && rc == TK_OK; d++) {
            rc = dec_apply(t, &t->dec[d], &cur, &nxt);
            bufv_free(&cur);
            cur = nxt;
            memset(&nxt, 0, sizeof nxt);
        }
    }
    for (size_t i = 0; i < cur.n && rc == TK_OK; i++) {
        if (!t->has_decoder && i > 0)
            rc = tk__buf_puts(&o, " ");
        if (!rc)
            rc = tk__buf_append(&o, cur.v[i].data, cur.v[i].len);
    }
    bufv_free(&cur);
    bufv_free(&nxt);
    if (rc == TK_OK && !o.data)
        rc = tk__buf_puts(&o, ""); /* an empty text is still an allocated string */
    if (rc) {
        tk__buf_free(&o);
        return rc;
    }
    *text = tk__buf_steal(&o);
    return TK_OK;
}

size_t tk_tokenizer_vocab_size(const tk_tokenizer *t) { return TOK_OK(t) ? t->nids : 0; }

int tk_tokenizer_token_id(int32_t *id, const tk_tokenizer *t, const char *token)
{
    if (!id || !TOK_OK(t) || !token)
        return tk__err(TK_ERR_INVALID, "tk_tokenizer_token_id: NULL argument or not a tokenizer");
    size_t n = strlen(token);
    int64_t a = strmap_get(&t->amap, t->akeys, token, n);
    if (a >= 0) {
        *id = t->added[a].id;
        return TK_OK;
    }
    int64_t v = vocab_get(t, token, n);
    if (v >= 0) {
        *id = (int32_t)v;
        return TK_OK;
    }
    return tk__err(TK_ERR_NOT_FOUND, "token '%s' is not in the vocabulary", token);
}

const char *tk_tokenizer_token(const tk_tokenizer *t, int32_t id)
{
    if (!TOK_OK(t) || id < 0 || (size_t)id >= t->nids)
        return NULL;
    return t->idtok[id].s;
}

/* ---- loading --------------------------------------------------------------------------------- */

typedef struct {
    const char *what; /* the file, for messages */
    tk_tokenizer *t;
} ld;

static int bad(ld *L, int code, const char *field, const char *fmt, ...) TK_PRINTF(4, 5);
static int bad(ld *L, int code, const char *field, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return tk__err(code, "%s: %s: %s", L->what, field, msg);
}

static const char *jtype(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* Reads an optional string member: absent or null leaves *out {NULL,0} and *has 0. */
static int opt_str(ld *L, json_t *o, const char *key, const char *field, str *out, int *has)
{
    json_t *v = json_object_get(o, key);
    out->s = NULL;
    out->n = 0;
    if (has)
        *has = 0;
    if (!v || json_is_null(v))
        return TK_OK;
    if (!json_is_string(v))
        return bad(L, TK_ERR_INVALID, field, "\"%s\" must be a string, not %s", key, jtype(v));
    out->n = json_string_length(v);
    out->s = malloc(out->n + 1);
    if (!out->s)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    memcpy(out->s, json_string_value(v), out->n);
    out->s[out->n] = 0;
    if (has)
        *has = 1;
    return TK_OK;
}

static int req_str(ld *L, json_t *o, const char *key, const char *field, str *out)
{
    int has;
    int rc = opt_str(L, o, key, field, out, &has);
    if (rc == TK_OK && !has)
        rc = bad(L, TK_ERR_INVALID, field, "\"%s\" is missing", key);
    return rc;
}

static int opt_bool(ld *L, json_t *o, const char *key, const char *field, int *out, int dflt)
{
    json_t *v = json_object_get(o, key);
    *out = dflt;
    if (!v || json_is_null(v))
        return TK_OK;
    if (!json_is_boolean(v))
        return bad(L, TK_ERR_INVALID, field, "\"%s\" must be true or false, not %s", key, jtype(v));
    *out = json_is_true(v);
    return TK_OK;
}

static int opt_int(ld *L, json_t *o, const char *key, const char *field, int64_t *out, int64_t dflt, int64_t lo,
                   int64_t hi)
{
    json_t *v = json_object_get(o, key);
    *out = dflt;
    if (!v || json_is_null(v))
        return TK_OK;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return bad(L, TK_ERR_INVALID, field, "\"%s\" must be an integer in [%lld, %lld]", key, (long long)lo,
                   (long long)hi);
    *out = json_integer_value(v);
    return TK_OK;
}

/* A one-character string member (Metaspace's replacement, Strip's content, ...). */
static int opt_char(ld *L, json_t *o, const char *key, const char *field, int32_t *out, int32_t dflt)
{
    str s;
    int has;
    int rc = opt_str(L, o, key, field, &s, &has);
    *out = dflt;
    if (rc || !has)
        return rc;
    int32_t c;
    if (s.n == 0 || !u8_valid(s.s, s.n) || u8_next(s.s, s.n, 0, &c) != s.n)
        rc = bad(L, TK_ERR_INVALID, field, "\"%s\" must be one character, not '%s'", key, s.s);
    else
        *out = c;
    free(s.s);
    return rc;
}

static const char *type_of(ld *L, json_t *o, const char *field, int *rc)
{
    *rc = TK_OK;
    if (!json_is_object(o)) {
        *rc = bad(L, TK_ERR_INVALID, field, "must be an object, not %s", jtype(o));
        return NULL;
    }
    json_t *ty = json_object_get(o, "type");
    if (!json_is_string(ty)) {
        *rc = bad(L, TK_ERR_INVALID, field, "\"type\" %s", ty ? "must be a string" : "is missing");
        return NULL;
    }
    return json_string_value(ty);
}

/* {"String": "..."} or {"Regex": "..."} */
static int parse_pattern(ld *L, json_t *o, const char *field, pattern *p)
{
    memset(p, 0, sizeof *p);
    json_t *v = json_object_get(o, "pattern");
    if (!json_is_object(v))
        return bad(L, TK_ERR_INVALID, field, "\"pattern\" must be {\"String\": ...} or {\"Regex\": ...}, not %s",
                   v ? jtype(v) : "missing");
    json_t *lit = json_object_get(v, "String"), *re = json_object_get(v, "Regex");
    if (json_is_string(lit)) {
        return opt_str(L, v, "String", field, &p->lit, NULL);
    } else if (json_is_string(re)) {
        char f[300];
        snprintf(f, sizeof f, "%s: %s.pattern.Regex", L->what, field);
        return regex_compile(&p->re, json_string_value(re), json_string_length(re), f);
    }
    return bad(L, TK_ERR_INVALID, field, "\"pattern\" must be {\"String\": ...} or {\"Regex\": ...}");
}

static int parse_behavior(ld *L, json_t *o, const char *field, int *out, int dflt)
{
    json_t *v = json_object_get(o, "behavior");
    *out = dflt;
    if (!v || json_is_null(v))
        return TK_OK;
    static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    for (int i = 0; json_is_string(v) && i < 5; i++)
        if (!strcmp(json_string_value(v), names[i])) {
            *out = i;
            return TK_OK;
        }
    return bad(L, TK_ERR_INVALID, field,
               "\"behavior\" must be Removed, Isolated, MergedWithPrevious, MergedWithNext or "
               "Contiguous");
}

static int parse_scheme(ld *L, json_t *o, const char *field, int *out)
{
    json_t *v = json_object_get(o, "prepend_scheme");
    if (v && !json_is_null(v)) {
        const char *s = json_is_string(v) ? json_string_value(v) : "";
        if (!strcmp(s, "always"))
            *out = PS_ALWAYS;
        else if (!strcmp(s, "first"))
            *out = PS_FIRST;
        else if (!strcmp(s, "never"))
            *out = PS_NEVER;
        else
            return bad(L, TK_ERR_INVALID, field, "\"prepend_scheme\" must be \"always\", \"first\" or \"never\"");
        return TK_OK;
    }
    int aps; /* files written before prepend_scheme existed */
    int rc = opt_bool(L, o, "add_prefix_space", field, &aps, 1);
    *out = aps ? PS_ALWAYS : PS_NEVER;
    return rc;
}

/* Grows an array of steps by one zeroed element. */
static void *grow(void **v, size_t *n, size_t size)
{
    void *p = realloc(*v, (*n + 1) * size);
    if (!p)
        return NULL;
    *v = p;
    memset((char *)p + *n * size, 0, size);
    return (char *)p + (*n)++ * size;
}

/* The head every component parser shares: the component's "type", a bound on nesting, and a
 * "Sequence" whose members (under `key`) are parsed by `fn` one level deeper. Returns 1 when the
 * parser is done (an error, or a whole Sequence parsed), *rc holding its status; else 0 with *ty set. */
typedef int (*component_fn)(ld *L, json_t *o, const char *field, int depth);
static int parse_head(const char **ty, int *rc, ld *L, json_t *o, const char *field, int depth, const char *key,
                      component_fn fn)
{
    if (!(*ty = type_of(L, o, field, rc)))
        return 1;
    if (depth > 16) {
        *rc = bad(L, TK_ERR_INVALID, field, "Sequences nest too deep");
        return 1;
    }
    if (strcmp(*ty, "Sequence"))
        return 0;
    json_t *a = json_object_get(o, key);
    if (!json_is_array(a)) {
        *rc = bad(L, TK_ERR_INVALID, field, "\"%s\" must be an array", key);
        return 1;
    }
    *rc = TK_OK;
    for (size_t i = 0; i < json_array_size(a) && *rc == TK_OK; i++) {
        char f[256];
        snprintf(f, sizeof f, "%s.%s[%zu]", field, key, i);
        *rc = fn(L, json_array_get(a, i), f, depth + 1);
    }
    return 1;
}

static int parse_normalizer(ld *L, json_t *o, const char *field, int depth)
{
    tk_tokenizer *t = L->t;
    int rc;
    const char *ty;
    if (parse_head(&ty, &rc, L, o, field, depth, "normalizers", parse_normalizer))
        return rc;
    norm_step *st = grow((void **)&t->norm, &t->nnorm, sizeof *st);
    if (!st)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    static const char *const simple[] = {"NFC", "NFD", "NFKC", "NFKD", "Lowercase", "StripAccents"};
    for (int i = 0; i < 6; i++)
        if (!strcmp(ty, simple[i])) {
            st->type = NM_NFC + i;
            return TK_OK;
        }
    if (!strcmp(ty, "BertNormalizer")) {
        st->type = NM_BERT;
        int sa;
        json_t *v = json_object_get(o, "strip_accents");
        if ((rc = opt_bool(L, o, "clean_text", field, &st->clean_text, 1)) ||
            (rc = opt_bool(L, o, "handle_chinese_chars", field, &st->chinese, 1)) ||
            (rc = opt_bool(L, o, "lowercase", field, &st->lowercase, 1)) ||
            (rc = opt_bool(L, o, "strip_accents", field, &sa, 0)))
            return rc;
        st->strip_accents = (!v || json_is_null(v)) ? st->lowercase : sa; /* null: as lowercase */
        return TK_OK;
    }
    if (!strcmp(ty, "Prepend")) {
        st->type = NM_PREPEND;
        return req_str(L, o, "prepend", field, &st->s);
    }
    if (!strcmp(ty, "Replace")) {
        st->type = NM_REPLACE;
        if ((rc = parse_pattern(L, o, field, &st->pat)))
            return rc;
        return req_str(L, o, "content", field, &st->s);
    }
    if (!strcmp(ty, "Strip")) {
        st->type = NM_STRIP;
        if ((rc = opt_bool(L, o, "strip_left", field, &st->left, 1)))
            return rc;
        return opt_bool(L, o, "strip_right", field, &st->right, 1);
    }
    t->nnorm--;
    return bad(L, TK_ERR_UNSUPPORTED, field, "normalizer type '%s' is not supported\nHINT: tk supports %s", ty,
               SUP_NORM);
}

static const char *const BYTELEVEL_RE =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
/* Rust regex's \w and \s (the Whitespace pre-tokenizer runs on the regex crate, not Oniguruma). */
static const char *const WHITESPACE_RE = "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]+|"
                                         "[^\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}\\p{White_Space}]+";

static int parse_pretok(ld *L, json_t *o, const char *field, int depth)
{
    tk_tokenizer *t = L->t;
    int rc;
    const char *ty;
    if (parse_head(&ty, &rc, L, o, field, depth, "pretokenizers", parse_pretok))
        return rc;
    pre_step *st = grow((void **)&t->pre, &t->npre, sizeof *st);
    if (!st)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    char f[300];
    snprintf(f, sizeof f, "%s: %s", L->what, field);
    if (!strcmp(ty, "ByteLevel")) {
        int use_regex;
        st->type = PT_BYTELEVEL;
        if ((rc = opt_bool(L, o, "add_prefix_space", field, &st->add_prefix_space, 1)) ||
            (rc = opt_bool(L, o, "use_regex", field, &use_regex, 1)))
            return rc;
        if (use_regex)
            return regex_compile(&st->pat.re, BYTELEVEL_RE, strlen(BYTELEVEL_RE), f);
        return TK_OK;
    }
    if (!strcmp(ty, "Split")) {
        st->type = PT_SPLIT;
        if ((rc = parse_pattern(L, o, field, &st->pat)) || (rc = parse_behavior(L, o, field, &st->behavior, -1)) ||
            (rc = opt_bool(L, o, "invert", field, &st->invert, 0)))
            return rc;
        if (st->behavior < 0)
            return bad(L, TK_ERR_INVALID, field, "\"behavior\" is missing");
        return TK_OK;
    }
    if (!strcmp(ty, "Metaspace")) {
        st->type = PT_METASPACE;
        if ((rc = opt_char(L, o, "replacement", field, &st->ch, 0x2581)) ||
            (rc = parse_scheme(L, o, field, &st->prepend_scheme)))
            return rc;
        return opt_bool(L, o, "split", field, &st->split, 1);
    }
    if (!strcmp(ty, "BertPreTokenizer")) {
        st->type = PT_BERT;
        return TK_OK;
    }
    if (!strcmp(ty, "Whitespace")) {
        st->type = PT_WHITESPACE;
        return regex_compile(&st->pat.re, WHITESPACE_RE, strlen(WHITESPACE_RE), f);
    }
    if (!strcmp(ty, "WhitespaceSplit")) {
        st->type = PT_WSPLIT;
        return TK_OK;
    }
    if (!strcmp(ty, "Digits")) {
        st->type = PT_DIGITS;
        return opt_bool(L, o, "individual_digits", field, &st->individual, 0);
    }
    if (!strcmp(ty, "Punctuation")) {
        st->type = PT_PUNCT;
        return parse_behavior(L, o, field, &st->behavior, B_ISOLATED);
    }
    if (!strcmp(ty, "CharDelimiterSplit")) {
        st->type = PT_CHARDELIM;
        if ((rc = opt_char(L, o, "delimiter", field, &st->ch, -1)))
            return rc;
        if (st->ch < 0)
            return bad(L, TK_ERR_INVALID, field, "\"delimiter\" is missing");
        return TK_OK;
    }
    t->npre--;
    return bad(L, TK_ERR_UNSUPPORTED, field, "pre_tokenizer type '%s' is not supported\nHINT: tk supports %s", ty,
               SUP_PRE);
}

static int parse_decoder(ld *L, json_t *o, const char *field, int depth)
{
    tk_tokenizer *t = L->t;
    int rc;
    const char *ty;
    if (parse_head(&ty, &rc, L, o, field, depth, "decoders", parse_decoder))
        return rc;
    dec_step *st = grow((void **)&t->dec, &t->ndec, sizeof *st);
    if (!st)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    int has;
    if (!strcmp(ty, "ByteLevel")) {
        st->type = D_BYTELEVEL;
        return TK_OK;
    }
    if (!strcmp(ty, "Metaspace")) {
        st->type = D_METASPACE;
        if ((rc = opt_char(L, o, "replacement", field, &st->ch, 0x2581)))
            return rc;
        return parse_scheme(L, o, field, &st->prepend_scheme);
    }
    if (!strcmp(ty, "WordPiece")) {
        st->type = D_WORDPIECE;
        if ((rc = opt_str(L, o, "prefix", field, &st->a, &has)))
            return rc;
        if (!has && !(st->a.s = tk__strdup("##")))
            return tk__err(TK_ERR_NOMEM, "out of memory");
        if (!has)
            st->a.n = 2;
        return opt_bool(L, o, "cleanup", field, &st->cleanup, 1);
    }
    if (!strcmp(ty, "ByteFallback")) {
        st->type = D_BYTEFALLBACK;
        return TK_OK;
    }
    if (!strcmp(ty, "Fuse")) {
        st->type = D_FUSE;
        return TK_OK;
    }
    if (!strcmp(ty, "Strip")) {
        int64_t a, b;
        st->type = D_STRIP;
        if ((rc = opt_char(L, o, "content", field, &st->ch, ' ')) ||
            (rc = opt_int(L, o, "start", field, &a, 0, 0, 1 << 20)) ||
            (rc = opt_int(L, o, "stop", field, &b, 0, 0, 1 << 20)))
            return rc;
        st->start = (size_t)a;
        st->stop = (size_t)b;
        return TK_OK;
    }
    if (!strcmp(ty, "Replace")) {
        st->type = D_REPLACE;
        if ((rc = parse_pattern(L, o, field, &st->pat)))
            return rc;
        return req_str(L, o, "content", field, &st->a);
    }
    if (!strcmp(ty, "BPEDecoder")) {
        st->type = D_BPE;
        if ((rc = opt_str(L, o, "suffix", field, &st->a, &has)))
            return rc;
        if (!has && !(st->a.s = tk__strdup("</w>")))
            return tk__err(TK_ERR_NOMEM, "out of memory");
        if (!has)
            st->a.n = 4;
        return TK_OK;
    }
    t->ndec--;
    return bad(L, TK_ERR_UNSUPPORTED, field, "decoder type '%s' is not supported\nHINT: tk supports %s", ty, SUP_DEC);
}

/* Wraps the current template (or "$A" when there is none yet) as  pre + template + post. */
static int post_wrap(tk_tokenizer *t, const int32_t *pre, size_t npre, const int32_t *suf, size_t nsuf)
{
    int32_t *old = t->post;
    size_t nold = t->npost;
    int32_t a = -1;
    if (!t->has_post) {
        old = &a;
        nold = 1;
    }
    int32_t *p = malloc((npre + nold + nsuf) * sizeof *p);
    if (!p)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    if (npre)
        memcpy(p, pre, npre * sizeof *p);
    if (nold)
        memcpy(p + npre, old, nold * sizeof *p);
    if (nsuf)
        memcpy(p + npre + nold, suf, nsuf * sizeof *p);
    if (t->has_post)
        free(t->post);
    t->post = p;
    t->npost = npre + nold + nsuf;
    t->has_post = 1;
    return TK_OK;
}

/* ["[CLS]", 101] */
static int pair_id(ld *L, json_t *o, const char *key, const char *field, int32_t *id)
{
    json_t *v = json_object_get(o, key);
    json_t *i = json_array_get(v, 1);
    if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_string(json_array_get(v, 0)) || !json_is_integer(i) ||
        json_integer_value(i) < 0 || json_integer_value(i) >= TOK_MAX_ID)
        return bad(L, TK_ERR_INVALID, field, "\"%s\" must be [token, id]", key);
    *id = (int32_t)json_integer_value(i);
    return TK_OK;
}

static int parse_post(ld *L, json_t *o, const char *field, int depth)
{
    tk_tokenizer *t = L->t;
    int rc;
    const char *ty;
    if (parse_head(&ty, &rc, L, o, field, depth, "processors", parse_post))
        return rc;
    if (!strcmp(ty, "ByteLevel"))
        return TK_OK; /* it only adjusts offsets */
    if (!strcmp(ty, "BertProcessing") || !strcmp(ty, "RobertaProcessing")) {
        int32_t cls, sep;
        if ((rc = pair_id(L, o, "cls", field, &cls)) || (rc = pair_id(L, o, "sep", field, &sep)))
            return rc;
        return post_wrap(t, &cls, 1, &sep, 1);
    }
    if (!strcmp(ty, "TemplateProcessing")) {
        json_t *single = json_object_get(o, "single"), *sp = json_object_get(o, "special_tokens");
        if (!json_is_array(single))
            return bad(L, TK_ERR_INVALID, field, "\"single\" must be an array of pieces");
        if (sp && !json_is_object(sp))
            return bad(L, TK_ERR_INVALID, field, "\"special_tokens\" must be an object");
        i32v pre = {0}, suf = {0};
        int seen = 0;
        for (size_t i = 0; i < json_array_size(single) && rc == TK_OK; i++) {
            json_t *it = json_array_get(single, i);
            json_t *s = json_object_get(it, "SpecialToken"), *q = json_object_get(it, "Sequence");
            if (json_is_object(q)) {
                if (seen++)
                    rc = bad(L, TK_ERR_INVALID, field, "\"single\" holds the sequence twice");
                continue;
            }
            json_t *name = json_object_get(s, "id");
            if (!json_is_object(s) || !json_is_string(name)) {
                rc = bad(L, TK_ERR_INVALID, field,
                         "\"single\"[%zu] must be {\"SpecialToken\": {\"id\": ...}} or "
                         "{\"Sequence\": {\"id\": ...}}",
                         i);
                break;
            }
            json_t *def = json_object_get(sp, json_string_value(name));
            json_t *ids = json_object_get(def, "ids");
            if (!json_is_array(ids)) {
                rc = bad(L, TK_ERR_INVALID, field, "special token '%s' has no \"ids\" in \"special_tokens\"",
                         json_string_value(name));
                break;
            }
            for (size_t k = 0; k < json_array_size(ids) && rc == TK_OK; k++) {
                json_t *v = json_array_get(ids, k);
                if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= TOK_MAX_ID)
                    rc = bad(L, TK_ERR_INVALID, field, "special token '%s': ids must be ids", json_string_value(name));
                else
                    rc = i32_push(seen ? &suf : &pre, (int32_t)json_integer_value(v));
            }
        }
        if (rc == TK_OK && !seen)
            rc = bad(L, TK_ERR_INVALID, field, "\"single\" lacks the {\"Sequence\"} piece");
        if (rc == TK_OK)
            rc = post_wrap(t, pre.v, pre.n, suf.v, suf.n);
        free(pre.v);
        free(suf.v);
        return rc;
    }
    return bad(L, TK_ERR_UNSUPPORTED, field, "post_processor type '%s' is not supported\nHINT: tk supports %s", ty,
               SUP_POST);
}

/* The largest id a file may use: real vocabularies are dense, and a sparse one would make a tiny
 * file allocate gigabytes (one pointer per id). */
static int64_t id_limit(size_t ntokens)
{
    int64_t lim = (int64_t)1 << 20;
    if ((int64_t)ntokens * 64 > lim)
        lim = (int64_t)ntokens * 64;
    return lim < TOK_MAX_ID ? lim : TOK_MAX_ID;
}

static int set_vocab(ld *L, const char *key, int64_t id, int64_t limit, const char *field)
{
    tk_tokenizer *t = L->t;
    if (id < 0 || id >= limit)
        return bad(L, TK_ERR_INVALID, field,
                   "token '%s' has id %lld, outside [0, %lld) (ids are dense: at most 64 per token "
                   "or 2^20)",
                   key, (long long)id, (long long)limit);
    if ((size_t)id >= t->nvocab) {
        size_t n = (size_t)id + 1;
        str *v = realloc(t->vocab, n * sizeof *v);
        if (!v)
            return tk__err(TK_ERR_NOMEM, "out of memory");
        memset(v + t->nvocab, 0, (n - t->nvocab) * sizeof *v);
        t->vocab = v;
        t->nvocab = n;
    }
    if (t->vocab[id].s) /* two tokens with one id: tokenizers keeps the last for decoding */
        free(t->vocab[id].s);
    t->vocab[id].n = strlen(key);
    t->vocab[id].s = tk__strdup(key);
    return t->vocab[id].s ? TK_OK : tk__err(TK_ERR_NOMEM, "out of memory");
}

static int parse_merges(ld *L, json_t *merges)
{
    tk_tokenizer *t = L->t;
    size_t n = json_array_size(merges);
    size_t cap = 16;
    while (cap < 2 * n + 2)
        cap *= 2;
    pairmap *m = &t->merges;
    m->key = malloc(cap * sizeof *m->key);
    m->rank = malloc(cap * sizeof *m->rank);
    m->id = malloc(cap * sizeof *m->id);
    if (!m->key || !m->rank || !m->id)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    memset(m->key, 0xff, cap * sizeof *m->key);
    m->mask = cap - 1;
    tk_buf joined = TK_BUF_INIT;
    int rc = TK_OK;
    for (size_t r = 0; r < n && rc == TK_OK; r++) {
        json_t *e = json_array_get(merges, r);
        const char *a, *b;
        size_t an, bn;
        char field[64];
        snprintf(field, sizeof field, "model.merges[%zu]", r);
        if (json_is_string(e)) { /* "a b" */
            a = json_string_value(e);
            const char *sp = strchr(a, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                rc = bad(L, TK_ERR_INVALID, field, "'%s' must be two tokens separated by one space", a);
                break;
            }
            an = (size_t)(sp - a);
            b = sp + 1;
            bn = strlen(b);
        } else if (json_is_array(e) && json_array_size(e) == 2 && json_is_string(json_array_get(e, 0)) &&
                   json_is_string(json_array_get(e, 1))) {
            a = json_string_value(json_array_get(e, 0));
            an = json_string_length(json_array_get(e, 0));
            b = json_string_value(json_array_get(e, 1));
            bn = json_string_length(json_array_get(e, 1));
        } else {
            rc = bad(L, TK_ERR_INVALID, field, "must be \"a b\" or [\"a\", \"b\"], not %s", jtype(e));
            break;
        }
        int64_t ia = vocab_get(t, a, an), ib = vocab_get(t, b, bn);
        if (ia < 0 || ib < 0) {
            rc = bad(L, TK_ERR_INVALID, field, "token '%.*s' is not in model.vocab", (int)(ia < 0 ? an : bn),
                     ia < 0 ? a : b);
            break;
        }
        if (bn < t->csp.n) {
            rc = bad(L, TK_ERR_INVALID, field, "token '%.*s' is shorter than the subword prefix", (int)bn, b);
            break;
        }
        joined.len = 0;
        if ((rc = tk__buf_append(&joined, a, an)) || (rc = tk__buf_append(&joined, b + t->csp.n, bn - t->csp.n)))
            break;
        int64_t ij = vocab_get(t, joined.data, joined.len);
        if (ij < 0) {
            rc = bad(L, TK_ERR_INVALID, field, "the merged token '%s' is not in model.vocab", joined.data);
            break;
        }
        uint64_t k = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
        for (size_t i = mix64(k) & m->mask;; i = (i + 1) & m->mask) {
            if (m->key[i] == UINT64_MAX) {
                m->key[i] = k;
                m->rank[i] = (uint32_t)r;
                m->id[i] = (int32_t)ij;
                break;
            }
            if (m->key[i] == k) { /* a repeated merge: tokenizers keeps the later one */
                m->rank[i] = (uint32_t)r;
                m->id[i] = (int32_t)ij;
                break;
            }
        }
    }
    tk__buf_free(&joined);
    return rc;
}

static int parse_model(ld *L, json_t *o)
{
    tk_tokenizer *t = L->t;
    int rc;
    if (!json_is_object(o))
        return bad(L, TK_ERR_INVALID, "model", "must be an object, not %s", o ? jtype(o) : "missing");
    json_t *ty = json_object_get(o, "type");
    const char *type;
    if (ty && !json_is_string(ty))
        return bad(L, TK_ERR_INVALID, "model", "\"type\" must be a string, not %s", jtype(ty));
    if (ty)
        type = json_string_value(ty);
    else if (json_object_get(o, "merges")) /* old files: the type follows from the fields */
        type = "BPE";
    else if (json_object_get(o, "max_input_chars_per_word"))
        type = "WordPiece";
    else
        type = "WordLevel";
    if (!strcmp(type, "BPE"))
        t->mtype = M_BPE;
    else if (!strcmp(type, "WordPiece"))
        t->mtype = M_WORDPIECE;
    else if (!strcmp(type, "WordLevel"))
        t->mtype = M_WORDLEVEL;
    else
        return bad(L, TK_ERR_UNSUPPORTED, "model.type", "model type '%s' is not supported\nHINT: tk supports %s", type,
                   SUP_MODEL);
    json_t *vocab = json_object_get(o, "vocab");
    if (!json_is_object(vocab))
        return bad(L, TK_ERR_INVALID, "model.vocab", "must be an object {token: id}, not %s",
                   vocab ? jtype(vocab) : "missing");
    const char *key;
    json_t *v;
    int64_t maxid = -1, limit = id_limit(json_object_size(vocab));
    json_object_foreach(vocab, key, v) /* first the size, so the table is allocated once */
    {
        if (json_is_integer(v) && json_integer_value(v) > maxid && json_integer_value(v) < limit)
            maxid = json_integer_value(v);
    }
    if (maxid >= 0) {
        t->vocab = calloc((size_t)maxid + 1, sizeof *t->vocab);
        if (!t->vocab)
            return tk__err(TK_ERR_NOMEM, "out of memory");
        t->nvocab = (size_t)maxid + 1;
    }
    json_object_foreach(vocab, key, v) {
        if (!json_is_integer(v))
            return bad(L, TK_ERR_INVALID, "model.vocab", "the id of '%s' must be an integer, not %s", key, jtype(v));
        if ((rc = set_vocab(L, key, json_integer_value(v), id_limit(json_object_size(vocab)), "model.vocab")))
            return rc;
    }
    if ((rc = strmap_init(&t->vmap, t->nvocab)))
        return rc;
    for (size_t i = 0; i < t->nvocab; i++)
        if (t->vocab[i].s)
            strmap_put(&t->vmap, t->vocab, (uint32_t)i);
    if ((rc = opt_str(L, o, "unk_token", "model", &t->unk, &t->has_unk)))
        return rc;
    int has;
    if ((rc = opt_str(L, o, "continuing_subword_prefix", "model", &t->csp, &has)))
        return rc;
    if (!has && t->mtype == M_WORDPIECE && !(t->csp.s = tk__strdup("##")))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    if (!has && t->mtype == M_WORDPIECE)
        t->csp.n = 2;
    if (t->mtype == M_WORDPIECE) {
        int64_t mx;
        if ((rc = opt_int(L, o, "max_input_chars_per_word", "model", &mx, 100, 0, INT64_MAX)))
            return rc;
        t->max_chars = (size_t)mx;
        return TK_OK;
    }
    if (t->mtype == M_WORDLEVEL)
        return TK_OK;
    if ((rc = opt_str(L, o, "end_of_word_suffix", "model", &t->eow, NULL)) ||
        (rc = opt_bool(L, o, "fuse_unk", "model", &t->fuse_unk, 0)) ||
        (rc = opt_bool(L, o, "byte_fallback", "model", &t->byte_fallback, 0)) ||
        (rc = opt_bool(L, o, "ignore_merges", "model", &t->ignore_merges, 0)))
        return rc;
    json_t *dropout = json_object_get(o, "dropout");
    if (dropout && !json_is_null(dropout) && !(json_is_number(dropout) && json_number_value(dropout) == 0))
        return bad(L, TK_ERR_UNSUPPORTED, "model.dropout",
                   "BPE dropout is random at encode time; tk encodes deterministically\n"
                   "HINT: set \"dropout\": null for inference");
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        int64_t id = vocab_get(t, name, 6);
        t->byte_id[b] = id >= 0 ? (int32_t)id : -1;
    }
    json_t *merges = json_object_get(o, "merges");
    if (merges && !json_is_array(merges))
        return bad(L, TK_ERR_INVALID, "model.merges", "must be an array, not %s", jtype(merges));
    return parse_merges(L, merges);
}

static int parse_added(ld *L, json_t *a)
{
    tk_tokenizer *t = L->t;
    int rc = TK_OK;
    if (!a || json_is_null(a))
        return TK_OK;
    if (!json_is_array(a))
        return bad(L, TK_ERR_INVALID, "added_tokens", "must be an array, not %s", jtype(a));
    size_t n = json_array_size(a);
    t->added = calloc(n ? n : 1, sizeof *t->added);
    t->akeys = calloc(n ? n : 1, sizeof *t->akeys);
    if (!t->added || !t->akeys)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(a, i);
        char f[64];
        snprintf(f, sizeof f, "added_tokens[%zu]", i);
        if (!json_is_object(e))
            return bad(L, TK_ERR_INVALID, f, "must be an object, not %s", jtype(e));
        added_tok *at = &t->added[t->nadded++];
        int64_t id;
        if ((rc = req_str(L, e, "content", f, &at->content)) ||
            (rc = opt_int(L, e, "id", f, &id, -1, 0, id_limit(t->nvocab + n) - 1)) ||
            (rc = opt_bool(L, e, "special", f, &at->special, 0)) ||
            (rc = opt_bool(L, e, "lstrip", f, &at->lstrip, 0)) || (rc = opt_bool(L, e, "rstrip", f, &at->rstrip, 0)) ||
            (rc = opt_bool(L, e, "single_word", f, &at->single_word, 0)) ||
            (rc = opt_bool(L, e, "normalized", f, &at->normalized, !at->special)))
            return rc;
        if (id < 0)
            return bad(L, TK_ERR_INVALID, f, "\"id\" is missing");
        if (at->content.n == 0)
            return bad(L, TK_ERR_INVALID, f, "\"content\" is empty");
        at->id = (int32_t)id;
        t->akeys[i] = at->content;
    }
    if ((rc = strmap_init(&t->amap, t->nadded)))
        return rc;
    for (size_t i = 0; i < t->nadded; i++)
        strmap_put(&t->amap, t->akeys, (uint32_t)i);
    return TK_OK;
}

/* The first-byte index of the added tokens (see abidx), built once at load. */
static int added_index(tk_tokenizer *t)
{
    for (int k = 0; k < 2; k++) {
        uint32_t *idx = malloc((t->nadded ? t->nadded : 1) * sizeof *idx);
        if (!idx)
            return tk__err(TK_ERR_NOMEM, "out of memory");
        t->abidx[k] = idx;
        size_t m = 0;
        for (int b = 0; b < 256; b++) {
            t->abstart[k][b] = (uint32_t)m;
            size_t first = m;
            for (size_t a = 0; a < t->nadded; a++) {
                const added_tok *at = &t->added[a];
                const str *c = k ? &at->norm : &at->content;
                if (at->normalized == k && c->n && (uint8_t)c->s[0] == b)
                    idx[m++] = (uint32_t)a;
            }
            for (size_t i = first + 1; i < m; i++) { /* insertion sort: longest first */
                uint32_t v = idx[i];
                size_t vn = k ? t->added[v].norm.n : t->added[v].content.n;
                size_t j = i;
                while (j > first && (k ? t->added[idx[j - 1]].norm.n : t->added[idx[j - 1]].content.n) < vn) {
                    idx[j] = idx[j - 1];
                    j--;
                }
                idx[j] = v;
            }
        }
        t->abstart[k][256] = (uint32_t)m;
    }
    return TK_OK;
}

/* GPT-2's bytes_to_unicode(): printable bytes map to themselves, the rest to 256, 257, ... */
static void bytelevel_tables(tk_tokenizer *t)
{
    int n = 0;
    for (int i = 0; i < 512; i++)
        t->bl_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        t->bl_char[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
        t->bl_byte[t->bl_char[b]] = (int16_t)b;
    }
}

int tk_models__tokenizer_parse(tk_tokenizer **out, const char *json, size_t len, const char *what)
{
    if (out)
        *out = NULL;
    if (!out || (!json && len))
        return tk__err(TK_ERR_INVALID, "tk_models__tokenizer_parse: NULL argument");
    if (!what)
        what = "tokenizer.json";
    json_error_t jerr;
    json_t *root = tk_models__json_loadb(json ? json : "", len, 0, &jerr);
    if (!root)
        return tk__err(TK_ERR_INVALID,
                       "%s is not valid JSON: %s (line %d, column %d)\n"
                       "HINT: tokenizer.json is written by Hugging Face tokenizers "
                       "(tokenizer.save()); is the file complete?",
                       what, jerr.text, jerr.line, jerr.column);
    tk_tokenizer *t = calloc(1, sizeof *t);
    int rc = TK_OK;
    if (!t) {
        json_decref(root);
        return tk__err(TK_ERR_NOMEM, "out of memory");
    }
    t->magic = TOK_MAGIC;
    bytelevel_tables(t);
    ld L = {what, t};
    json_t *v;
    if (!json_is_object(root)) {
        rc = bad(&L, TK_ERR_INVALID, "top level", "must be an object, not %s", jtype(root));
        goto fail;
    }
    if ((rc = parse_model(&L, json_object_get(root, "model"))))
        goto fail;
    if ((rc = parse_added(&L, json_object_get(root, "added_tokens"))))
        goto fail;
    if ((v = json_object_get(root, "normalizer")) && !json_is_null(v) &&
        (rc = parse_normalizer(&L, v, "normalizer", 0)))
        goto fail;
    if ((v = json_object_get(root, "pre_tokenizer")) && !json_is_null(v) &&
        (rc = parse_pretok(&L, v, "pre_tokenizer", 0)))
        goto fail;
    if ((v = json_object_get(root, "post_processor")) && !json_is_null(v) &&
        (rc = parse_post(&L, v, "post_processor", 0)))
        goto fail;
    if ((v = json_object_get(root, "decoder")) && !json_is_null(v)) {
        t->has_decoder = 1;
        if ((rc = parse_decoder(&L, v, "decoder", 0)))
            goto fail;
    }
    /* the normalised form of the added tokens that match normalised text */
    for (size_t i = 0; i < t->nadded; i++) {
        added_tok *at = &t->added[i];
        if (!at->normalized)
            continue;
        if ((rc = normalize(t, &at->norm.s, &at->norm.n, at->content.s, at->content.n)))
            goto fail;
        if (at->norm.n == 0)
            at->normalized = 2; /* normalises to nothing: it can never match */
    }
    if ((rc = added_index(t)))
        goto fail;
    /* ids → text: the model's vocabulary, with the added tokens over it */
    t->nids = t->nvocab;
    for (size_t i = 0; i < t->nadded; i++)
        if ((size_t)t->added[i].id >= t->nids)
            t->nids = (size_t)t->added[i].id + 1;
    for (size_t i = 0; i < t->npost; i++)
        if (t->post[i] >= 0 && (size_t)t->post[i] >= t->nids) {
            rc = bad(&L, TK_ERR_INVALID, "post_processor",
                     "special token id %" PRId32 " is outside the vocabulary (%zu ids)", t->post[i], t->nids);
            goto fail;
        }
    t->idtok = calloc(t->nids ? t->nids : 1, sizeof *t->idtok);
    if (!t->idtok) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < t->nvocab; i++)
        t->idtok[i] = t->vocab[i];
    /* an added token marked "normalized" decodes as its normalised form, as tokenizers' id_to_token
     * gives it ("[[ent]]" under a Prepend("▁") normaliser is "▁[[ent]]", whose space the decoder keeps) */
    for (size_t i = 0; i < t->nadded; i++)
        t->idtok[t->added[i].id] = t->added[i].normalized == 1 ? t->added[i].norm : t->added[i].content;
    json_decref(root);
    *out = t;
    return TK_OK;
fail:
    json_decref(root);
    tk_tokenizer_free(t);
    return rc;
}

int tk_tokenizer_load(tk_tokenizer **out, const char *path_or_dir)
{
    if (out)
        *out = NULL;
    if (!out || !path_or_dir)
        return tk__err(TK_ERR_INVALID, "tk_tokenizer_load: NULL argument");
    char *path = tk__is_dir(path_or_dir) ? tk__path_join(path_or_dir, "tokenizer.json") : tk__strdup(path_or_dir);
    if (!path)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    char *text = NULL;
    size_t len = 0;
    int rc = tk__read_file(&text, &len, path, TOK_MAX_FILE);
    if (rc == TK_ERR_NOT_FOUND)
        rc = tk__err(TK_ERR_NOT_FOUND,
                     "no tokenizer at '%s'\nHINT: give a model directory holding tokenizer.json "
                     "(as downloaded from the Hugging Face Hub) or the file itself",
                     path);
    if (rc == TK_OK)
        rc = tk_models__tokenizer_parse(out, text, len, path);
    free(text);
    free(path);
    return rc;
}
