/*
 * declared.c — the shape rules of ops that packages declare (kernel.json "ops"; docs/package-format.md).
 *
 * A declared op has no C check of its own: each tensor's shape pattern is the rule. A pattern is a
 * list of dims in brackets, each "..." (at most one: the leading dims), an integer, a symbol, or
 * INT*symbol ("[..., 2*d]", "[b, n]", "[4]"). A call binds the patterns in parameter order: a symbol
 * takes one value across every tensor, and every "..." stands for the same dims. The grammar is the
 * one `tk run-op` derives shapes from (cli/shape.c), so a declared op runs from the shell as a
 * built-in one does.
 */
#include <stdio.h>
#include <string.h>

#include "ops/ops.h"

typedef struct {
    int ellipsis;
    int64_t k;      /* the multiplier, or the literal when sym is empty */
    char sym[32];
} dim;

static int sym_start(char c) { return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static int sym_char(char c) { return sym_start(c) || (c >= '0' && c <= '9'); }

/* Parses s into d (TK_OPS_MAX_RANK entries). 0, or -1 with *why a static text. */
static int parse(const char *s, dim *d, int *n, const char **why)
{
    int ell = 0;
    *n = 0;
    *why = "a shape is a list in brackets: \"[..., n]\", \"[b, 2*d]\"";
    if (!s || *s++ != '[')
        return -1;
    for (;;) {
        while (*s == ' ')
            s++;
        if (*s == ']' && *n == 0)
            break;
        if (*n >= TK_OPS_MAX_RANK) {
            *why = "more dimensions than tk supports (16)";
            return -1;
        }
        dim *x = &d[(*n)++];
        memset(x, 0, sizeof *x);
        if (!strncmp(s, "...", 3)) {
            if (ell++) {
                *why = "at most one \"...\" (the leading dims)";
                return -1;
            }
            x->ellipsis = 1;
            s += 3;
        } else {
            x->k = 1;
            if (*s >= '0' && *s <= '9') {
                int64_t v = 0;
                for (; *s >= '0' && *s <= '9'; s++)
                    if ((v = v * 10 + (*s - '0')) > ((int64_t)1 << 40)) {
                        *why = "a size above 2^40";
                        return -1;
                    }
                x->k = v;
                if (*s == '*' && sym_start(s[1]))
                    s++;
                else if (*s == '*' || sym_char(*s)) {
                    *why = "a dim is \"...\", an integer, a symbol or INT*symbol (\"2*d\")";
                    return -1;
                }
            }
            size_t len = 0;
            while (sym_char(*s)) {
                if (len + 1 >= sizeof x->sym) {
                    *why = "a symbol longer than 31 characters";
                    return -1;
                }
                x->sym[len++] = *s++;
            }
            if (x->sym[0] && x->k < 1) {
                *why = "a multiplier below 1";
                return -1;
            }
            if (!len && !(s[-1] >= '0' && s[-1] <= '9')) {
                *why = "a dim is \"...\", an integer, a symbol or INT*symbol (\"2*d\")";
                return -1;
            }
        }
        while (*s == ' ')
            s++;
        if (*s == ']')
            break;
        if (*s++ != ',') {
            *why = "a dim is \"...\", an integer, a symbol or INT*symbol (\"2*d\"), and dims are separated by commas";
            return -1;
        }
    }
    if (s[1] != '\0') {
        *why = "text after the closing ']'";
        return -1;
    }
    return 0;
}

int tk_ops__pattern_check(const char *shape, int *min_rank, int *max_rank, const char **why)
{
    dim d[TK_OPS_MAX_RANK];
    int n, fixed = 0, ell = 0;
    if (parse(shape, d, &n, why) != 0)
        return -1;
    for (int i = 0; i < n; i++) {
        fixed += !d[i].ellipsis;
        ell |= d[i].ellipsis;
    }
    *min_rank = fixed;
    *max_rank = ell ? -1 : fixed;
    return 0;
}

/* What is known so far: each symbol's value and the tensor that set it, and the leading dims. */
typedef struct {
    char sym[TK_OPS_MAX_PARAMS * TK_OPS_MAX_RANK][32];
    int64_t val[TK_OPS_MAX_PARAMS * TK_OPS_MAX_RANK];
    int from[TK_OPS_MAX_PARAMS * TK_OPS_MAX_RANK];
    int nsym;
    int lead_from; /* -1: no "..." bound yet */
    int nlead;
    int64_t lead[TK_OPS_MAX_RANK];
} binding;

static int lookup(const binding *b, const char *sym)
{
    for (int i = 0; i < b->nsym; i++)
        if (!strcmp(b->sym[i], sym))
            return i;
    return -1;
}

/* Binds tensor i's pattern. TK_ERR_INVALID naming the tensor, its shape, its pattern and why. */
static int bind_one(binding *b, const tk_op_call *c, size_t i)
{
    const tk_op_param *p = &c->op->params[i];
    const tk_tensor *t = c->t[i];
    const char *name = c->op->name, *why;
    dim d[TK_OPS_MAX_RANK];
    int n, fixed = 0;
    if (parse(p->shape, d, &n, &why) != 0)
        return tk__err(TK_ERR_INTERNAL, "%s: the shape %s of '%s' does not parse: %s", name, p->shape, p->name, why);
    for (int k = 0; k < n; k++)
        fixed += !d[k].ellipsis;
    int nlead = t->ndim - fixed; /* >= 0: the rank check has passed */
    const char *have = tk_ops__shape_fmt(t->ndim, t->shape);
    for (int k = 0, s = 0; k < n; k++) {
        if (d[k].ellipsis) {
            if (b->lead_from < 0) {
                b->lead_from = (int)i;
                b->nlead = nlead;
                memcpy(b->lead, t->shape + s, (size_t)nlead * sizeof *b->lead);
            } else if (b->nlead != nlead || memcmp(b->lead, t->shape + s, (size_t)nlead * sizeof *b->lead)) {
                const tk_tensor *o = c->t[b->lead_from];
                return tk__err(TK_ERR_INVALID,
                               "%s: '%s' has shape %s, want %s: its leading dims (\"...\") are %s, "
                               "but those of '%s' %s are %s",
                               name, p->name, have, p->shape, tk_ops__shape_fmt(nlead, t->shape + s),
                               c->op->params[b->lead_from].name, tk_ops__shape_fmt(o->ndim, o->shape),
                               tk_ops__shape_fmt(b->nlead, b->lead));
            }
            s += nlead;
            continue;
        }
        int64_t v = t->shape[s++];
        if (!d[k].sym[0]) {
            if (v != d[k].k)
                return tk__err(TK_ERR_INVALID, "%s: '%s' has shape %s, want %s: dimension %d must be %lld", name,
                               p->name, have, p->shape, s - 1, (long long)d[k].k);
            continue;
        }
        if (v % d[k].k)
            return tk__err(TK_ERR_INVALID,
                           "%s: '%s' has shape %s, want %s: dimension %d (%lld) must be a multiple "
                           "of %lld",
                           name, p->name, have, p->shape, s - 1, (long long)v, (long long)d[k].k);
        v /= d[k].k;
        int j = lookup(b, d[k].sym);
        if (j >= 0 && b->val[j] != v) {
            const tk_tensor *o = c->t[b->from[j]];
            return tk__err(TK_ERR_INVALID, "%s: '%s' has shape %s, want %s with %s = %lld (from '%s' %s)", name,
                           p->name, have, p->shape, d[k].sym, (long long)b->val[j], c->op->params[b->from[j]].name,
                           tk_ops__shape_fmt(o->ndim, o->shape));
        }
        if (j < 0 && b->nsym < (int)(sizeof b->val / sizeof b->val[0])) {
            snprintf(b->sym[b->nsym], sizeof b->sym[0], "%s", d[k].sym);
            b->val[b->nsym] = v;
            b->from[b->nsym++] = (int)i;
        }
    }
    return TK_OK;
}

int tk_ops__check_patterns(const tk_op_call *c)
{
    binding b;
    b.nsym = 0;
    b.lead_from = -1;
    b.nlead = 0;
    for (size_t i = 0; i < c->op->nparams; i++) {
        if (c->op->params[i].kind != TK_ARG_TENSOR || !c->t[i] || !c->op->params[i].shape)
            continue;
        int rc = bind_one(&b, c, i);
        if (rc != TK_OK)
            return rc;
    }
    return TK_OK;
}

int tk_ops__is_declared(const tk_op_desc *op)
{
    return op && op->family && !strcmp(op->family, TK_OPS_FAMILY_DECLARED);
}
