/*
 * loss.c — the loss ops (cross-entropy, fused linear + cross-entropy and contrastive losses): signatures, shape checks and CPU references.
 *
 * (Being written: the table is empty until its ops land.)
 */
#include "ops/ops.h"

const tk_op_desc tk_ops__loss[] = {{0}};
const size_t tk_ops__loss_count = 0;
