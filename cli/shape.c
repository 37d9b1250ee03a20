/*
 * shape.c — dimension lists and signature shape patterns for `tk run-op` (see shape.h).
 *
 * The patterns come from op signatures, and op signatures may come from packages, so a pattern is
 * outside input: nothing here trusts its rank, its number of ellipses or the size of its numbers.
 */
#include "cli/shape.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int is_sym_char(char c)
{
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

/* A decimal number in [0, TK_CLI_MAX_DIM]; advances *s. 0 or -1. */
static int parse_num(const char **s, int64_t *out)
{
    int64_t v = 0;
    const char *p = *s;
    if (*p < '0' || *p > '9')
        return -1;
    for (; *p >= '0' && *p <= '9'; p++) {
        v = v * 10 + (*p - '0');
        if (v > TK_CLI_MAX_DIM)
            return -1;
    }
    *s = p;
    *out = v;
    return 0;
}

int tk_cli_pattern_parse(const char *s, tk_cli_dim_pat *pat, int *n)
{
    int ellipses = 0;
    *n = 0;
    if (!s || *s != '[')
        return -1;
    s++;
    for (;;) {
        while (*s == ' ' || *s == ',')
            s++;
        if (*s == ']')
            break;
        if (!*s || *n >= TK_CLI_MAX_D)
            return -1; /* no closing ']', or too many dims */
        tk_cli_dim_pat *d = &pat[(*n)++];
        memset(d, 0, sizeof *d);
        if (!strncmp(s, "...", 3)) {
            /* the binder gives the ellipsis whatever the other dims leave: two would be ambiguous */
            if (ellipses++)
                return -1;
            d->ellipsis = 1;
            s += 3;
        } else {
            d->k = 1;
            if (*s >= '0' && *s <= '9') {
                if (parse_num(&s, &d->k) != 0)
                    return -1;
                if (*s == '*') {
                    s++;
                    if (!is_sym_char(*s) || (*s >= '0' && *s <= '9'))
                        return -1; /* "2*" or "2*3" */
                } else if (is_sym_char(*s)) {
                    return -1; /* "2d": a multiplier needs its '*' */
                }
            }
            size_t len = 0;
            while (is_sym_char(*s)) {
                if (len + 1 >= sizeof d->sym)
                    return -1;
                d->sym[len++] = *s++;
            }
            d->sym[len] = '\0';
        }
        while (*s == ' ')
            s++;
        if (*s != ',' && *s != ']')
            return -1;
    }
    return s[1] == '\0' ? 0 : -1;
}

int tk_cli_pattern_bind(const tk_cli_dim_pat *pat, int np, const int64_t *shape, int nd, tk_cli_binding *b, int *nb,
                        int64_t *lead, int *nlead)
{
    int fixed = 0, ell = -1;
    if (np < 0 || np > TK_CLI_MAX_D || nd < 0 || nd > TK_CLI_MAX_D)
        return -1;
    for (int i = 0; i < np; i++) {
        if (!pat[i].ellipsis)
            fixed++;
        else if (ell >= 0)
            return -1; /* the parser refuses a second "...": never bind one */
        else
            ell = i;
    }
    if (ell < 0 ? nd != fixed : nd < fixed)
        return -1;
    *nlead = ell < 0 ? 0 : nd - fixed;
    for (int i = 0; i < *nlead; i++)
        lead[i] = shape[ell + i];
    for (int i = 0, s = 0; i < np; i++) {
        if (pat[i].ellipsis) {
            s += *nlead;
            continue;
        }
        int64_t dim = shape[s++];
        if (!pat[i].sym[0])
            continue;
        if (pat[i].k <= 0 || dim % pat[i].k)
            return -2 - i;
        if (*nb >= TK_CLI_MAX_D)
            return -1;
        b[*nb].v = dim / pat[i].k;
        snprintf(b[*nb].sym, sizeof b->sym, "%s", pat[i].sym);
        (*nb)++;
    }
    return 0;
}

int tk_cli_pattern_make(const tk_cli_dim_pat *pat, int np, const tk_cli_binding *b, int nb, const int64_t *lead,
                        int nlead, int64_t *shape, int *nd)
{
    *nd = 0;
    if (np < 0 || np > TK_CLI_MAX_D || nlead < 0 || nlead > TK_CLI_MAX_D)
        return -1;
    for (int i = 0; i < np; i++) {
        if (pat[i].ellipsis) {
            if (*nd + nlead > TK_CLI_MAX_D)
                return -1;
            for (int k = 0; k < nlead; k++)
                shape[(*nd)++] = lead[k];
            continue;
        }
        if (*nd >= TK_CLI_MAX_D)
            return -1;
        if (!pat[i].sym[0]) {
            shape[(*nd)++] = pat[i].k;
            continue;
        }
        int k = 0;
        while (k < nb && strcmp(b[k].sym, pat[i].sym) != 0)
            k++;
        int64_t v;
        if (k == nb || b[k].v < 0 || __builtin_mul_overflow(pat[i].k, b[k].v, &v) || v > TK_CLI_MAX_DIM)
            return -1;
        shape[(*nd)++] = v;
    }
    return 0;
}

int tk_cli_dims_parse(const char *text, int64_t *shape, int *nd)
{
    *nd = 0;
    for (const char *s = text; *s;) {
        int64_t v;
        if (*nd >= TK_CLI_MAX_D || parse_num(&s, &v) != 0 || (*s && *s != ','))
            return -1;
        shape[(*nd)++] = v;
        if (*s == ',' && !*++s)
            return -1; /* a trailing comma */
    }
    return *nd ? 0 : -1;
}

int tk_cli_dims_count(size_t *count, const int64_t *shape, int nd, size_t max_elems)
{
    size_t n = 1;
    for (int i = 0; i < nd; i++) {
        if (shape[i] < 0 || __builtin_mul_overflow(n, (size_t)shape[i], &n) || n > max_elems)
            return -1;
    }
    *count = n;
    return 0;
}
