/*
 * test_tokenizer_oom.c — every allocation of tokenizer loading, encoding and decoding fails in
 * turn: each call must return TK_ERR_NOMEM (or TK_ERR_INVALID where jansson reports its own out of
 * memory as a parse error), leave its out-parameters NULL, and leak nothing.
 *
 * This binary replaces malloc, calloc, realloc and free (glibc allows it; the real allocator is
 * __libc_*) for itself and every library (exported, so PCRE2, utf8proc and libc see them too),
 * counts live blocks to find leaks, and fails the Nth allocation on request. jansson gets allocator
 * functions of its own that never fail: jansson 2.14 itself corrupts its heap when an allocation
 * fails inside json_loadb (its lexer ignores a failed strbuffer append). The fuzz
 * seeds in tests/fuzz/corpus/tokenizer/ are the inputs: small files in the shapes of GPT-2, Llama-3,
 * Llama-2, Mistral and BERT. Under AddressSanitizer (which owns malloc) it skips; ASan runs
 * test_tokenizer for leaks instead.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "harness.h"
#include "models/tokenizer.h"
#include "tk.h"

#if defined(__SANITIZE_ADDRESS__)
#define TK_HAVE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TK_HAVE_ASAN 1
#endif
#endif

#ifndef TK_HAVE_ASAN
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);

static long fail_at = -1; /* the allocation (counted from 0) to fail; -1: none */
static long nalloc;       /* allocations since arming */
static long live;         /* blocks allocated and not yet freed */

static int should_fail(void) { return fail_at >= 0 && nalloc++ == fail_at; }

__attribute__((visibility("default"))) void *malloc(size_t n)
{
    if (should_fail())
        return NULL;
    void *p = __libc_malloc(n);
    if (p)
        live++;
    return p;
}

__attribute__((visibility("default"))) void *calloc(size_t a, size_t b)
{
    if (should_fail())
        return NULL;
    void *p = __libc_calloc(a, b);
    if (p)
        live++;
    return p;
}

__attribute__((visibility("default"))) void *realloc(void *p, size_t n)
{
    if (!p)
        return malloc(n);
    if (n == 0) {
        live--;
        __libc_free(p);
        return NULL;
    }
    if (should_fail())
        return NULL;
    return __libc_realloc(p, n);
}

__attribute__((visibility("default"))) void free(void *p)
{
    if (p) {
        live--;
        __libc_free(p);
    }
}

static void *json_alloc(size_t n) { return __libc_malloc(n); }
static void json_release(void *p) { __libc_free(p); }

static char *seed(const char *name, size_t *jn, const char **text, size_t *tn)
{
    char path[256], *data = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "tests/fuzz/corpus/tokenizer/%s", name);
    if (tk__read_file(&data, &len, path, 1 << 20) != TK_OK)
        return NULL;
    char *nul = memchr(data, 0, len);
    *jn = nul ? (size_t)(nul - data) : len;
    *text = nul ? nul + 1 : "";
    *tn = nul ? len - *jn - 1 : 0;
    return data;
}

static const char *SEEDS[] = {"gpt2", "llama3", "llama2", "mistral", "bert", "misc"};

/* Loading: fail allocation 0, 1, 2, ... until a load needs no more than were allowed. */
static void test_load_oom(void)
{
    for (size_t s = 0; s < sizeof SEEDS / sizeof *SEEDS; s++) {
        size_t jn, tn;
        const char *text;
        char *data = seed(SEEDS[s], &jn, &text, &tn);
        CHECK(data != NULL);
        if (!data)
            return;
        long k, bad = 0;
        for (k = 0;; k++) {
            long base = live;
            tk_tokenizer *tok = (tk_tokenizer *)&tok;
            nalloc = 0;
            fail_at = k;
            int rc = tk_models__tokenizer_parse(&tok, data, jn, "oom.json");
            int done = nalloc <= k; /* nothing failed: every allocation point has been tried */
            fail_at = -1;
            if (rc == TK_OK) {
                tk_tokenizer_free(tok);
            } else if (tok != NULL || (rc != TK_ERR_NOMEM && rc != TK_ERR_INVALID)) {
                if (bad++ < 3)
                    fprintf(stderr, "  %s: allocation %ld failed: rc %d, out %p (%s)\n", SEEDS[s], k, rc, (void *)tok,
                            tk_last_error());
            }
            if (live != base && bad++ < 3)
                fprintf(stderr, "  %s: allocation %ld failed: %ld blocks leaked\n", SEEDS[s], k, live - base);
            if (done) {
                CHECK_RC(rc, TK_OK);
                break;
            }
        }
        printf("    %s: %ld allocation points in loading\n", SEEDS[s], k);
        CHECK_EQ_INT(bad, 0);
        free(data);
    }
}

/* Encoding and decoding the seed's text, each allocation failing in turn. */
static void test_encode_decode_oom(void)
{
    for (size_t s = 0; s < sizeof SEEDS / sizeof *SEEDS; s++) {
        size_t jn, tn;
        const char *text;
        char *data = seed(SEEDS[s], &jn, &text, &tn);
        tk_tokenizer *tok = NULL;
        CHECK(data != NULL);
        if (!data)
            return;
        CHECK_RC(tk_models__tokenizer_parse(&tok, data, jn, "oom.json"), TK_OK);
        if (!tok) {
            free(data);
            continue;
        }
        long k, bad = 0;
        for (k = 0;; k++) {
            long base = live;
            int32_t *ids = (int32_t *)&ids;
            char *out = (char *)&out;
            size_t n = 0;
            nalloc = 0;
            fail_at = k;
            int rc = tk_tokenizer_encode(&ids, &n, tok, text, tn, 1);
            int rc2 = TK_OK;
            if (rc == TK_OK) {
                rc2 = tk_tokenizer_decode(&out, tok, ids, n, 0);
                if (rc2 == TK_OK)
                    tk_free(out);
                else if (out != NULL && bad++ < 3)
                    fprintf(stderr, "  %s: decode failed but left its text\n", SEEDS[s]);
                tk_free(ids);
            } else if (ids != NULL && bad++ < 3) {
                fprintf(stderr, "  %s: encode failed but left its ids\n", SEEDS[s]);
            }
            int done = nalloc <= k;
            fail_at = -1;
            if ((rc != TK_OK && rc != TK_ERR_NOMEM) || (rc2 != TK_OK && rc2 != TK_ERR_NOMEM)) {
                if (bad++ < 3)
                    fprintf(stderr, "  %s: allocation %ld failed: encode %d, decode %d (%s)\n", SEEDS[s], k, rc, rc2,
                            tk_last_error());
            }
            if (live != base && bad++ < 3)
                fprintf(stderr, "  %s: allocation %ld failed: %ld blocks leaked\n", SEEDS[s], k, live - base);
            if (done) {
                CHECK(rc == TK_OK && rc2 == TK_OK);
                break;
            }
        }
        printf("    %s: %ld allocation points in encode + decode\n", SEEDS[s], k);
        CHECK_EQ_INT(bad, 0);
        tk_tokenizer_free(tok);
        free(data);
    }
}

int main(void)
{
    json_set_alloc_funcs(json_alloc, json_release);
    RUN(test_load_oom);
    RUN(test_encode_decode_oom);
    return th_done();
}
#else
static void test_oom(void) { SKIP("AddressSanitizer owns malloc; test_tokenizer checks leaks there"); }
int main(void)
{
    RUN(test_oom);
    return th_done();
}
#endif
