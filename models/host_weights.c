/*
 * host_weights.c — the CPU weights a model uses as the checkpoint stores them, copied out of the file
 * mapping into anonymous memory backed by transparent huge pages.
 *
 * Decode reads every weight once a token. Through the file mapping that is one 4 KiB page after
 * another, each a TLB miss and a page walk (65,000 a token for SmolLM2-135M in bf16): copied into
 * 2 MiB pages the same bf16 decode ran 20% faster on one thread (bench/RESULTS.md, "Weights in huge
 * pages"). The copies are packed one after another (64-byte aligned) in chunks of at least 64 MiB, so
 * the many small weights of a small model share huge pages too. tk_model_opts.map_weights (or
 * TK_MAP_WEIGHTS=1 in the environment) keeps them views of the mapping instead (shared with other
 * processes through the page cache, and dropped rather than swapped under memory pressure).
 *
 * The weights converted at load on the CPU (a bf16 checkpoint run in f32, --quant int8), the activation arena and
 * the optimiser's state are the model's own memory anyway: tk_models__hw_malloc gives a buffer of 2 MiB
 * or more the same advice (its whole huge pages; freed with free()), so they are faulted in as huge
 * pages when first written.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "models/models.h"

#define HUGE_PAGE ((size_t)2 << 20)
#define CHUNK_MIN ((size_t)64 << 20)

struct tk_models_hw {
    tk_models_hw *next;
    char *base;
    size_t size, used;
};

int tk_models__hw_env_map(void)
{
    const char *e = getenv("TK_MAP_WEIGHTS");
    return e && *e && strcmp(e, "0") != 0;
}

/* A chunk of at least n bytes: 2 MiB aligned and rounded, so the kernel can back it with huge pages */
static tk_models_hw *chunk_new(size_t n)
{
    size_t size = (n > CHUNK_MIN ? n : CHUNK_MIN);
    size = (size + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    tk_models_hw *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    void *p = NULL;
    if (posix_memalign(&p, HUGE_PAGE, size) != 0) {
        free(c);
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    (void)madvise(p, size, MADV_HUGEPAGE); /* THP "madvise" mode; a no-op under "always" or "never" */
#endif
    c->base = p;
    c->size = size;
    return c;
}

void *tk_models__hw_alloc(tk_models_hw **list, size_t n)
{
    size_t need = (n + 63) / 64 * 64;
    tk_models_hw *c = *list;
    if (!c || c->size - c->used < need) {
        if (!(c = chunk_new(need)))
            return NULL;
        c->next = *list;
        *list = c;
    }
    char *p = c->base + c->used;
    c->used += need;
    return p;
}

void *tk_models__hw_malloc(size_t n)
{
    if (n < HUGE_PAGE)
        return aligned_alloc(64, (n + 64) / 64 * 64);
    void *p = NULL;
    if (posix_memalign(&p, HUGE_PAGE, n) != 0)
        return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, n / HUGE_PAGE * HUGE_PAGE, MADV_HUGEPAGE); /* the whole 2 MiB pages: the tail keeps 4 KiB */
#endif
    return p;
}

void *tk_models__hw_calloc(size_t n)
{
    void *p = tk_models__hw_malloc(n);
    if (p)
        memset(p, 0, n ? n : 1);
    return p;
}

void tk_models__hw_free(tk_models_hw *list)
{
    while (list) {
        tk_models_hw *next = list->next;
        free(list->base);
        free(list);
        list = next;
    }
}
