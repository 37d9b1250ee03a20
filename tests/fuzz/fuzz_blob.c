/*
 * fuzz_blob.c — compiled binaries as the kernel cache stores them (jit/compile.c, magic "TKJB"):
 * tk_jit__binary_unpack, and for a blob it accepts, pack -> unpack -> pack gives the same bytes.
 *
 * Input: the blob's bytes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "jit/jit.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tk_jit_binary *b = NULL, *b2 = NULL;
    uint8_t *p1 = NULL, *p2 = NULL;
    size_t n1 = 0, n2 = 0;
    if (tk_jit__binary_unpack(&b, data, size) != TK_OK) {
        if (b)
            abort();
        return 0;
    }
    if (b->ptx && strlen(b->ptx) > b->ptx_len)
        abort();
    for (size_t i = 0; i < b->nlowered; i++)
        if (!b->lowered[i])
            abort();
    if (tk_jit__binary_pack(&p1, &n1, b) == TK_OK) {
        if (tk_jit__binary_unpack(&b2, p1, n1) == TK_OK && tk_jit__binary_pack(&p2, &n2, b2) == TK_OK &&
            (n1 != n2 || memcmp(p1, p2, n1) != 0))
            abort();
    }
    free(p1);
    free(p2);
    tk_jit__binary_free(b);
    tk_jit__binary_free(b2);
    return 0;
}
