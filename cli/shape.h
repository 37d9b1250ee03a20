/*
 * shape.h — the shapes of `tk run-op`: "4,4096" dimension lists, and the shape patterns of op
 * signatures ("[...]", "[..., d]", "[..., 2*d]", "[4, n]") bound to concrete shapes.
 *
 * A unit of its own (it needs only libc) so the fuzz target tests/fuzz/fuzz_shape.c can link it.
 * Every array here holds at most TK_CLI_MAX_D entries, and every function keeps to that bound
 * whatever the pattern or dims say.
 */
#ifndef TK_CLI_SHAPE_H
#define TK_CLI_SHAPE_H

#include <stddef.h>
#include <stdint.h>

#define TK_CLI_MAX_D 16
#define TK_CLI_MAX_DIM ((int64_t)1 << 40) /* the largest size one dimension may have */

/* One token of a pattern: "...", an integer, a symbol, or INT*symbol. */
typedef struct {
    int ellipsis;
    int64_t k; /* multiplier, or the literal when sym is empty */
    char sym[32];
} tk_cli_dim_pat;

typedef struct {
    char sym[32];
    int64_t v;
} tk_cli_binding;

/* Parses "[..., 2*d]" into pat (TK_CLI_MAX_D entries); *n receives the count. At most one "...",
 * literals and multipliers in [0, TK_CLI_MAX_DIM], a closing ']' and nothing after it. 0 or -1. */
int tk_cli_pattern_parse(const char *s, tk_cli_dim_pat *pat, int *n);

/* Binds the pattern to shape (nd dims): the ellipsis takes what the other dims leave (into lead,
 * *nlead of them), each symbol gets dim / multiplier, appended to b (*nb entries so far, room for
 * TK_CLI_MAX_D). 0; -1 when the rank does not fit; -2 - i when dim i is not a multiple of its
 * multiplier. */
int tk_cli_pattern_bind(const tk_cli_dim_pat *pat, int np, const int64_t *shape, int nd, tk_cli_binding *b, int *nb,
                        int64_t *lead, int *nlead);

/* The shape the pattern gives with these bindings and leading dims (shape holds TK_CLI_MAX_D).
 * 0; -1 when a symbol is unbound, the rank would pass TK_CLI_MAX_D or a size TK_CLI_MAX_DIM. */
int tk_cli_pattern_make(const tk_cli_dim_pat *pat, int np, const tk_cli_binding *b, int nb, const int64_t *lead,
                        int nlead, int64_t *shape, int *nd);

/* "4,4096" into shape (TK_CLI_MAX_D entries), each size in [0, TK_CLI_MAX_DIM]. 0 or -1. */
int tk_cli_dims_parse(const char *text, int64_t *shape, int *nd);

/* The element count of a shape into *count; -1 when it would pass max_elems. */
int tk_cli_dims_count(size_t *count, const int64_t *shape, int nd, size_t max_elems);

#endif
