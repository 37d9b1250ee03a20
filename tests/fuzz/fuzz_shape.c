/*
 * fuzz_shape.c — the shapes of `tk run-op` (cli/shape.c): a pattern, dims bound to it, and a second
 * pattern shaped from those bindings, as run-op derives an output's shape from its input's.
 *
 * Input: three lines, "PATTERN\nD0,D1,...\nPATTERN2". Example: "[..., 2*d]\n4,8\n[..., d]".
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli/shape.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *p = data;
    size_t n = size;
    char *a = fz_field(&p, &n, '\n'), *dims = fz_field(&p, &n, '\n'), *b = fz_field(&p, &n, '\n');
    tk_cli_dim_pat pa[TK_CLI_MAX_D], pb[TK_CLI_MAX_D];
    tk_cli_binding bind[TK_CLI_MAX_D];
    int64_t shape[TK_CLI_MAX_D], lead[TK_CLI_MAX_D], out[TK_CLI_MAX_D];
    int npa = 0, npb = 0, nd = 0, nb = 0, nlead = 0, nout = 0;
    if (!a || !dims || !b)
        goto done;
    int ra = tk_cli_pattern_parse(a, pa, &npa);
    int rd = tk_cli_dims_parse(dims, shape, &nd);
    if (rd == 0) {
        size_t count;
        tk_cli_dims_count(&count, shape, nd, (size_t)1 << 48);
    }
    if (ra != 0 || rd != 0)
        goto done;
    if (tk_cli_pattern_bind(pa, npa, shape, nd, bind, &nb, lead, &nlead) != 0)
        goto done;
    if (nlead < 0 || nlead > TK_CLI_MAX_D || nb > TK_CLI_MAX_D)
        abort(); /* the binder broke its bounds */
    /* shaping the pattern from its own bindings gives the dims back (unless a literal or a repeated
     * symbol stands for a dim it does not match; run-op checks those elsewhere) */
    int plain = 1;
    for (int i = 0; i < npa; i++) {
        plain &= pa[i].ellipsis || pa[i].sym[0];
        for (int j = 0; j < i; j++)
            plain &= pa[i].ellipsis || pa[j].ellipsis || strcmp(pa[i].sym, pa[j].sym) != 0;
    }
    if (plain && (tk_cli_pattern_make(pa, npa, bind, nb, lead, nlead, out, &nout) != 0 || nout != nd ||
                  memcmp(out, shape, (size_t)nd * sizeof *shape) != 0))
        abort();
    if (tk_cli_pattern_parse(b, pb, &npb) == 0 &&
        tk_cli_pattern_make(pb, npb, bind, nb, lead, nlead, out, &nout) == 0 && (nout < 0 || nout > TK_CLI_MAX_D))
        abort();
done:
    free(a);
    free(dims);
    free(b);
    return 0;
}
