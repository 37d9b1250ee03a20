/*
 * softmax.c — the softmax ops (softmax and log_softmax): signatures, shape checks and CPU references.
 *
 * (Being written: the table is empty until its ops land.)
 */
#include "ops/ops.h"

const tk_op_desc tk_ops__softmax[] = {{0}};
const size_t tk_ops__softmax_count = 0;
