/*
 * expr.h — the launch-rule language of kernel.json (docs/package-format.md): grid, block, smem,
 * derived scalars and constraint bounds are integer expressions over a kernel's params, parsed once
 * when a manifest is read and evaluated at every launch.
 */
#ifndef TK_MANIFEST_EXPR_H
#define TK_MANIFEST_EXPR_H

#include <stddef.h>
#include <stdint.h>

/* ---- launch-rule expressions (manifest/expr.c) -------------------------------------------------------- */

typedef struct tk_manifest_expr tk_manifest_expr;

enum {
    TK_MANIFEST_P_TENSOR = 0,
    TK_MANIFEST_P_I32,
    TK_MANIFEST_P_I64,
    TK_MANIFEST_P_F32,
    TK_MANIFEST_P_F64,
    TK_MANIFEST_P_WORKSPACE
};

/* What an expression may name: the kernel's params, in order. */
typedef struct {
    const char *name;
    int type;   /* TK_MANIFEST_P_* */
    int usable; /* 0: may not be referenced here (e.g. a derived scalar not yet computed) */
} tk_manifest_var;

/* Parses `src` once into a tree and checks every name against params. `what` names the expression
 * in messages ("kernel 'silu_f32', launch.grid[0]"). Errors: TK_ERR_MANIFEST with the column, what
 * is wrong, and the expression with a caret under the spot. */
int tk_manifest__expr_parse(tk_manifest_expr **out, const char *src, const tk_manifest_var *params, size_t nparams,
                            const char *what);
void tk_manifest__expr_free(tk_manifest_expr *e);
const char *tk_manifest__expr_src(const tk_manifest_expr *e);

/* The value of each param during evaluation, indexed like the params given to parse. */
typedef struct {
    int known;               /* 0: not bound yet */
    int64_t i;               /* scalars */
    int32_t ndim;            /* tensors */
    const int64_t *shape;
    const int64_t *strides;  /* NULL: contiguous row-major */
} tk_manifest_value;

/* Evaluates with int64 arithmetic. TK_ERR_INVALID on overflow, division by zero, an index out of
 * range or an unbound value; the message names the expression. */
int tk_manifest__expr_eval(int64_t *out, const tk_manifest_expr *e, const tk_manifest_value *vals, size_t nvals);
/* The same on a device with sm_count multiprocessors (the value of the name sm_count; 0: unknown, and
 * an expression that uses it fails with TK_ERR_INVALID). */
int tk_manifest__expr_eval_dev(int64_t *out, const tk_manifest_expr *e, const tk_manifest_value *vals, size_t nvals,
                               int64_t sm_count);

#endif
