/*
 * attention.c — the attention ops (attention: prefill, decode over a paged KV cache, backward, KV append, MLA): signatures, shape checks and CPU references.
 *
 * (Being written: the table is empty until its ops land.)
 */
#include "ops/ops.h"

const tk_op_desc tk_ops__attention[] = {{0}};
const size_t tk_ops__attention_count = 0;
