/*
 * casted.c — the casted ops (fp8/int8 embeddings and weight-only linears): signatures, shape checks and CPU references.
 *
 * (Being written: the table is empty until its ops land.)
 */
#include "ops/ops.h"

const tk_op_desc tk_ops__casted[] = {{0}};
const size_t tk_ops__casted_count = 0;
