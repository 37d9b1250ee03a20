/*
 * sampling.c — the sampling ops (argmax and temperature/top-k/top-p sampling): signatures, shape checks and CPU references.
 *
 * (Being written: the table is empty until its ops land.)
 */
#include "ops/ops.h"

const tk_op_desc tk_ops__sampling[] = {{0}};
const size_t tk_ops__sampling_count = 0;
