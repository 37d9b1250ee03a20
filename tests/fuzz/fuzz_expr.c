/*
 * fuzz_expr.c — launch-rule expressions (manifest/expr.c): parse against a kernel's params, then evaluate
 * with tensor shapes, strides and scalars taken from the input.
 *
 * Input: "EXPR\n" then value bytes. The params are out, input, weight (tensors), n (i64), d (i32),
 * eps (f32, not usable in a launch rule) and ws (workspace). The value bytes give, in order, each
 * tensor's ndim (0..8) and its dims and strides (little-endian int64 each), then n and d.
 * Example: "numel(out) / out.shape[-1]\n".
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "jit/jit.h"
#include "manifest/expr.h"

static int64_t take64(const uint8_t **p, size_t *n)
{
    uint8_t b[8] = {0};
    size_t k = *n < 8 ? *n : 8;
    memcpy(b, *p, k);
    *p += k;
    *n -= k;
    int64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (int64_t)((uint64_t)v << 8 | b[i]);
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const tk_manifest_var params[] = {
        {"out", TK_MANIFEST_P_TENSOR, 1},   {"input", TK_MANIFEST_P_TENSOR, 1}, {"weight", TK_MANIFEST_P_TENSOR, 1},
        {"n", TK_MANIFEST_P_I64, 1},        {"d", TK_MANIFEST_P_I32, 1},        {"eps", TK_MANIFEST_P_F32, 1},
        {"ws", TK_MANIFEST_P_WORKSPACE, 1}, {"later", TK_MANIFEST_P_I64, 0},
    };
    enum { NP = sizeof params / sizeof *params };
    const uint8_t *nl = memchr(data, '\n', size);
    size_t elen = nl ? (size_t)(nl - data) : size;
    char *src = malloc(elen + 1);
    if (!src)
        return 0;
    memcpy(src, data, elen);
    src[elen] = '\0';
    const uint8_t *p = nl ? nl + 1 : data + size;
    size_t n = nl ? size - elen - 1 : 0;

    tk_manifest_expr *e = NULL;
    int rc = tk_manifest__expr_parse(&e, src, params, NP, "fuzz");
    if ((rc == TK_OK) != (e != NULL))
        abort();
    if (e) {
        int64_t shapes[3][8], strides[3][8];
        tk_manifest_value vals[NP];
        memset(vals, 0, sizeof vals);
        for (int t = 0; t < 3; t++) {
            vals[t].known = 1;
            vals[t].ndim = n ? (int32_t)(*p % 9) : 2;
            if (n) {
                p++;
                n--;
            }
            for (int k = 0; k < vals[t].ndim; k++)
                shapes[t][k] = n ? take64(&p, &n) : 4;
            int strided = n && (*p & 1);
            for (int k = 0; strided && k < vals[t].ndim; k++)
                strides[t][k] = take64(&p, &n);
            vals[t].shape = shapes[t];
            vals[t].strides = strided ? strides[t] : NULL;
        }
        vals[3] = (tk_manifest_value){1, n ? take64(&p, &n) : 7, 0, NULL, NULL};
        vals[4] = (tk_manifest_value){1, n ? (int32_t)take64(&p, &n) : 3, 0, NULL, NULL};
        vals[6] = (tk_manifest_value){1, 0, 0, NULL, NULL};
        int64_t out;
        tk_manifest__expr_eval(&out, e, vals, NP);
        tk_manifest__expr_eval(&out, e, vals, 4); /* fewer values than params: refused, never read */
        if (strcmp(tk_manifest__expr_src(e), src) != 0)
            abort();
    }
    tk_manifest__expr_free(e);
    free(src);
    return 0;
}
