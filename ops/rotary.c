/*
 * rotary.c — the rotary ops (RoPE, ALiBi and sinusoidal positions): signatures, shape checks and CPU references.
 *
 * (Being written: the table is empty until its ops land.)
 */
#include "ops/ops.h"

const tk_op_desc tk_ops__rotary[] = {{0}};
const size_t tk_ops__rotary_count = 0;
