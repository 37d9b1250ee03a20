/*
 * fuzz_tokenizer.c — libFuzzer target: tokenizer.json parsing, then encode and decode.
 *
 * Input: tokenizer.json text, optionally followed by a NUL byte and a text to encode (the text is
 * used even when it is not UTF-8: encode must refuse it cleanly). Every parse either succeeds or
 * fails with a status; a parsed tokenizer encodes the text with and without special tokens, decodes
 * the ids both ways, and decodes the text's bytes read as ids (mostly outside the vocabulary).
 * Seeds: tests/fuzz/corpus/tokenizer/, regressions: tests/fuzz/regress/tokenizer/.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "models/tokenizer.h"
#include "tk.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t jn = nul ? (size_t)(nul - data) : size;
    const char *text = nul ? (const char *)nul + 1 : "Hello, world! caf\xC3\xA9 \xE6\xBC\xA2 \xF0\x9F\xA4\x97 12";
    size_t tn = nul ? size - jn - 1 : strlen(text);
    tk_tokenizer *tok = NULL;
    if (tk_models__tokenizer_parse(&tok, (const char *)data, jn, "fuzz.json") != TK_OK) {
        if (tok)
            abort(); /* a failed parse must leave *out NULL */
        return 0;
    }
    for (int special = 0; special < 2; special++) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (tk_tokenizer_encode(&ids, &n, tok, text, tn, special) == TK_OK) {
            char *out = NULL;
            if (tk_tokenizer_decode(&out, tok, ids, n, special) == TK_OK)
                tk_free(out);
            tk_free(ids);
        } else if (ids) {
            abort();
        }
    }
    int32_t raw[64];
    size_t rn = tn < 64 ? tn : 64;
    for (size_t i = 0; i < rn; i++)
        raw[i] = (int32_t)(uint8_t)text[i] - 8;
    char *out = NULL;
    if (tk_tokenizer_decode(&out, tok, raw, rn, 1) == TK_OK)
        tk_free(out);
    for (size_t i = 0; i < rn; i++)
        (void)tk_tokenizer_token(tok, raw[i]);
    tk_tokenizer_free(tok);
    return 0;
}
