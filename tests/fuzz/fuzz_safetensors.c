/*
 * fuzz_safetensors.c — a safetensors file image as tk reads it before any weight is used:
 * tk_models__st_parse (header length, JSON header, dtypes, shapes, offsets, overlaps). Inputs that
 * start with '{' are also read as a config.json (tk_models__config_parse), the other outside file a
 * checkpoint brings.
 *
 * Input: the file's bytes. Seeds: tests/fuzz/corpus/safetensors (small valid files, damaged ones, and
 * config.json files of each architecture).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "models/models.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tk_st_tensor *t = (tk_st_tensor *)1;
    size_t n = 1;
    if (tk_models__st_parse(&t, &n, data, size, "fuzz") == TK_OK) {
        /* what the loader relies on: each tensor's bytes lie inside the image, their size is
         * numel x dtype size, names are sorted and unique, and no two tensors share a byte */
        for (size_t i = 0; i < n; i++) {
            const uint8_t *p = t[i].data;
            uint64_t bytes = tk_models__st_dtype_size(t[i].dtype);
            for (int d = 0; d < t[i].ndim; d++)
                bytes *= (uint64_t)t[i].shape[d];
            if (!t[i].name || p < data || t[i].end < t[i].begin || bytes != t[i].end - t[i].begin ||
                (size_t)(p - data) + (t[i].end - t[i].begin) > size)
                abort();
            if (i && strcmp(t[i - 1].name, t[i].name) >= 0)
                abort();
            for (size_t j = 0; j < i; j++)
                if (t[j].begin < t[i].end && t[i].begin < t[j].end)
                    abort();
            volatile uint8_t sink = t[i].end > t[i].begin ? p[t[i].end - t[i].begin - 1] : 0;
            (void)sink;
        }
        tk_models__st_free(t, n);
    } else if (t || n) {
        abort(); /* *out stays NULL and *n 0 on failure */
    }
    if (size && data[0] == '{') {
        tk_models_config c;
        if (tk_models__config_parse(&c, (const char *)data, size, "fuzz") == TK_OK &&
            (c.layers <= 0 || c.hidden <= 0 || c.heads <= 0 || c.kv_heads <= 0 || c.head_dim <= 0 ||
             c.layers > TK_MODELS_MAX_LAYERS))
            abort();
        tk_models__config_free(&c);
    }
    return 0;
}
