/*
 * builtin.h — GPU implementations of ops that tk carries itself rather than in a kernel package:
 * calls into a CUDA library loaded at run time (jit/cublaslt.h), such as `linear` on cuBLASLt.
 *
 * A built-in is one more candidate of its op in the dispatch of api/op.c: it is filtered by dtype
 * and compute capability like a package kernel, ranked by priority, timed by autotune, chosen by a
 * config override ("ops": {"linear": "builtin"}, or "builtin:cublaslt"), and listed by `tk ops`
 * under the package name "builtin" with the impl string "builtin:<kernel>".
 */
#ifndef TK_API_BUILTIN_H
#define TK_API_BUILTIN_H

#include <stddef.h>

#include "ops/ops.h"

#define TK_API_BUILTIN_PKG "builtin"

typedef struct {
    const char *op;       /* "linear" */
    const char *kernel;   /* "cublaslt": the impl string is "builtin:cublaslt" */
    const char *version;  /* what `tk ops` shows as the version: tk's own (it ships with tk) */
    unsigned dtypes;      /* TK_OPS_* bits of the call's primary dtype it serves */
    int min_cc;           /* compute capability x 10 (0: any) */
    int64_t priority;
    /* Runs a validated call whose tensors are on one CUDA device, contiguous, with at least one
     * output element, enqueued on stream. TK_ERR_UNSUPPORTED lets dispatch try the next candidate. */
    int (*run)(const tk_op_call *c, void *stream);
} tk_api_builtin;

size_t tk_api__builtin_count(void);
const tk_api_builtin *tk_api__builtin_at(size_t i);

#endif /* TK_API_BUILTIN_H */
