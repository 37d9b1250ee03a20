/*
 * expr.c — launch-rule expressions (docs/package-format.md, "Launch-rule expressions").
 *
 * An expression is parsed once, when the package is installed or loaded, into a small tree stored in
 * one array; every name is resolved to a parameter index then, so a typo is reported with the kernel,
 * the expression and the column before anything runs. Evaluation is int64 with checks for overflow,
 * division by zero and out-of-range indices, and never allocates.
 *
 * Grammar:
 *     expr    := term (('+' | '-') term)*
 *     term    := unary (('*' | '/' | '%') unary)*
 *     unary   := '-' unary | primary
 *     primary := INT | '(' expr ')' | FUNC '(' args ')' | T '.' ('shape' | 'stride') '[' expr ']'
 *              | T '.' 'ndim' | SCALAR | 'sm_count'
 *     FUNC    := numel(T) | min(a, b) | max(a, b) | cdiv(a, b) | align(a, b)
 *
 * sm_count is the number of multiprocessors of the device the kernel launches on (a launch rule's way
 * to size a grid to the GPU instead of a constant such as 132); a parameter of that name shadows it.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "manifest/expr.h"

#define MAX_SRC 1024
#define MAX_NODES 256
#define MAX_DEPTH 64

enum {
    N_NUM,
    N_ADD,
    N_SUB,
    N_MUL,
    N_DIV,
    N_MOD,
    N_NEG,
    N_MIN,
    N_MAX,
    N_CDIV,
    N_ALIGN,
    N_SHAPE,
    N_STRIDE,
    N_NDIM,
    N_NUMEL,
    N_SCALAR,
    N_SM
};

typedef struct {
    uint8_t op;
    int16_t a, b;  /* child node indices, -1 when unused */
    int32_t param; /* N_SHAPE ... N_SCALAR */
    int64_t v;     /* N_NUM */
} node;

struct tk_manifest_expr {
    char *src;
    char *what;
    const char **pnames; /* param names, for evaluation messages */
    size_t nparams;
    size_t nnodes;
    int16_t root;
    node nodes[];
};

typedef struct {
    const char *s;
    size_t pos;
    const tk_manifest_var *params;
    size_t nparams;
    const char *what;
    struct tk_manifest_expr *e;
    size_t cap;
    int depth;
    int rc;
} parser;

static int perr(parser *p, size_t col, const char *fmt, ...) TK_PRINTF(3, 4);
static int perr(parser *p, size_t col, const char *fmt, ...)
{
    char msg[256];
    char caret[MAX_SRC + 2];
    va_list ap;
    size_t len = strlen(p->s);
    if (p->rc != TK_OK)
        return p->rc; /* keep the first error */
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (col > len)
        col = len;
    if (len > MAX_SRC)
        len = MAX_SRC;
    for (size_t i = 0; i < col && i < MAX_SRC; i++)
        caret[i] = p->s[i] == '\t' ? '\t' : ' ';
    caret[col < MAX_SRC ? col : MAX_SRC] = '^';
    caret[(col < MAX_SRC ? col : MAX_SRC) + 1] = '\0';
    p->rc =
        tk__err(TK_ERR_MANIFEST, "%s: column %zu: %s\n    %.*s\n    %s", p->what, col + 1, msg, (int)len, p->s, caret);
    return p->rc;
}

static void skip_ws(parser *p)
{
    while (p->s[p->pos] == ' ' || p->s[p->pos] == '\t')
        p->pos++;
}

static int new_node(parser *p, int op, int a, int b, int32_t param, int64_t v, size_t col)
{
    node *n;
    if (p->e->nnodes >= p->cap)
        return perr(p, col, "expression too long (more than %d terms)", MAX_NODES), -1;
    n = &p->e->nodes[p->e->nnodes];
    n->op = (uint8_t)op;
    n->a = (int16_t)a;
    n->b = (int16_t)b;
    n->param = param;
    n->v = v;
    return (int)p->e->nnodes++;
}

static int parse_expr(parser *p);

static int ident(parser *p, size_t *start, size_t *len)
{
    skip_ws(p);
    *start = p->pos;
    if (!(isalpha((unsigned char)p->s[p->pos]) || p->s[p->pos] == '_'))
        return 0;
    while (isalnum((unsigned char)p->s[p->pos]) || p->s[p->pos] == '_')
        p->pos++;
    *len = p->pos - *start;
    return 1;
}

static int expect(parser *p, char c, const char *context)
{
    skip_ws(p);
    if (p->s[p->pos] != c) {
        if (p->s[p->pos] == '\0')
            perr(p, p->pos, "expected '%c' %s, found the end", c, context);
        else
            perr(p, p->pos, "expected '%c' %s, found '%c'", c, context, p->s[p->pos]);
        return -1;
    }
    p->pos++;
    return 0;
}

static void list_params(char *buf, size_t n, const parser *p, int want_tensor)
{
    size_t off = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < p->nparams && off < n; i++) {
        int is_t = p->params[i].type == TK_MANIFEST_P_TENSOR;
        if (want_tensor >= 0 && is_t != want_tensor)
            continue;
        off += (size_t)snprintf(buf + off, n - off, "%s%s", off ? ", " : "", p->params[i].name);
    }
    if (!buf[0])
        snprintf(buf, n, "none");
}

static int find_param(parser *p, size_t start, size_t len)
{
    for (size_t i = 0; i < p->nparams; i++)
        if (strlen(p->params[i].name) == len && strncmp(p->params[i].name, p->s + start, len) == 0)
            return (int)i;
    return -1;
}

/* A tensor parameter name at the current position. */
static int tensor_param(parser *p, const char *context)
{
    size_t st, len;
    char names[256];
    int k;
    if (!ident(p, &st, &len)) {
        perr(p, p->pos, "expected a tensor parameter %s", context);
        return -1;
    }
    k = find_param(p, st, len);
    if (k < 0 || p->params[k].type != TK_MANIFEST_P_TENSOR) {
        list_params(names, sizeof names, p, 1);
        perr(p, st, "'%.*s' is not a tensor parameter of this kernel (tensors: %s)", (int)len, p->s + st, names);
        return -1;
    }
    return k;
}

/* An integer literal at p->pos (a digit). */
static int parse_number(parser *p)
{
    size_t st = p->pos;
    int64_t v = 0;
    while (isdigit((unsigned char)p->s[p->pos])) {
        int d = p->s[p->pos] - '0';
        if (v > (INT64_MAX - d) / 10)
            return perr(p, st, "integer literal out of range"), -1;
        v = v * 10 + d;
        p->pos++;
    }
    if (isalpha((unsigned char)p->s[p->pos]) || p->s[p->pos] == '_' || p->s[p->pos] == '.')
        return perr(p, p->pos, "unexpected '%c' after a number (only integers are allowed)", p->s[p->pos]), -1;
    return new_node(p, N_NUM, -1, -1, -1, v, st);
}

/* A call of the function named s[st, st+len), p->pos at its '('. */
static int parse_call(parser *p, size_t st, size_t len)
{
    static const struct {
        const char *name;
        int op;
    } fns[] = {{"numel", N_NUMEL}, {"min", N_MIN}, {"max", N_MAX}, {"cdiv", N_CDIV}, {"align", N_ALIGN}};
    int op = -1, a, b;
    for (size_t i = 0; i < sizeof fns / sizeof *fns; i++)
        if (strlen(fns[i].name) == len && strncmp(fns[i].name, p->s + st, len) == 0)
            op = fns[i].op;
    if (op < 0)
        return perr(p, st, "unknown function '%.*s' (functions: numel, min, max, cdiv, align)", (int)len, p->s + st),
               -1;
    p->pos++;
    if (op == N_NUMEL) {
        int k = tensor_param(p, "in numel()");
        if (k < 0 || expect(p, ')', "after numel's argument") != 0)
            return -1;
        return new_node(p, N_NUMEL, -1, -1, k, 0, st);
    }
    if ((a = parse_expr(p)) < 0 || expect(p, ',', "between the two arguments") != 0 || (b = parse_expr(p)) < 0 ||
        expect(p, ')', "after the second argument") != 0)
        return -1;
    return new_node(p, op, a, b, -1, 0, st);
}

/* T.ndim, T.shape[i] or T.stride[i] for tensor param k named s[st, st+len), p->pos after the name. */
static int parse_tensor_attr(parser *p, int k, size_t st, size_t len)
{
    size_t ast, alen;
    int op, ix;
    if (p->s[p->pos] != '.')
        return perr(p, p->pos, "'%.*s' is a tensor: use %.*s.shape[i], .stride[i], .ndim or numel(%.*s)", (int)len,
                    p->s + st, (int)len, p->s + st, (int)len, p->s + st),
               -1;
    p->pos++;
    if (!ident(p, &ast, &alen))
        return perr(p, p->pos, "expected shape, stride or ndim after '.'"), -1;
    if (alen == 4 && strncmp(p->s + ast, "ndim", 4) == 0)
        return new_node(p, N_NDIM, -1, -1, k, 0, st);
    if (alen == 5 && strncmp(p->s + ast, "shape", 5) == 0)
        op = N_SHAPE;
    else if (alen == 6 && strncmp(p->s + ast, "stride", 6) == 0)
        op = N_STRIDE;
    else
        return perr(p, ast, "unknown tensor attribute '%.*s' (shape, stride, ndim)", (int)alen, p->s + ast), -1;
    if (expect(p, '[', "after shape/stride") != 0 || (ix = parse_expr(p)) < 0 ||
        expect(p, ']', "to close the index") != 0)
        return -1;
    return new_node(p, op, ix, -1, k, 0, st);
}

/* A name s[st, st+len) that is not a call: sm_count, a scalar param, or a tensor's attribute. */
static int parse_name(parser *p, size_t st, size_t len)
{
    char names[256];
    int k = find_param(p, st, len);
    if (k < 0 && len == 8 && strncmp(p->s + st, "sm_count", 8) == 0)
        return new_node(p, N_SM, -1, -1, -1, 0, st);
    if (k < 0) {
        list_params(names, sizeof names, p, -1);
        return perr(p, st, "unknown name '%.*s' (this kernel's params: %s)", (int)len, p->s + st, names), -1;
    }
    if (!p->params[k].usable)
        return perr(p, st, "'%.*s' cannot be used here: it is a derived value not yet computed", (int)len, p->s + st),
               -1;
    if (p->params[k].type == TK_MANIFEST_P_TENSOR)
        return parse_tensor_attr(p, k, st, len);
    if (p->params[k].type == TK_MANIFEST_P_F32 || p->params[k].type == TK_MANIFEST_P_F64)
        return perr(p, st, "'%.*s' is a floating-point parameter; launch rules are integer", (int)len, p->s + st), -1;
    return new_node(p, N_SCALAR, -1, -1, k, 0, st);
}

/* A number, a parenthesised expression, a call or a name. */
static int parse_primary(parser *p)
{
    size_t st, len;
    skip_ws(p);
    if (isdigit((unsigned char)p->s[p->pos]))
        return parse_number(p);
    if (p->s[p->pos] == '(') {
        int n;
        p->pos++;
        if ((n = parse_expr(p)) < 0 || expect(p, ')', "to close the parenthesis") != 0)
            return -1;
        return n;
    }
    if (!ident(p, &st, &len)) {
        if (p->s[p->pos] == '\0')
            return perr(p, p->pos, "expected a value, found the end"), -1;
        return perr(p, p->pos, "unexpected '%c'", p->s[p->pos]), -1;
    }
    skip_ws(p);
    if (p->s[p->pos] == '(')
        return parse_call(p, st, len);
    return parse_name(p, st, len);
}

static int parse_unary(parser *p)
{
    skip_ws(p);
    if (p->s[p->pos] == '-') {
        size_t st = p->pos;
        int a;
        p->pos++;
        if (++p->depth > MAX_DEPTH)
            return perr(p, st, "expression nested too deeply"), -1;
        a = parse_unary(p);
        p->depth--;
        if (a < 0)
            return -1;
        return new_node(p, N_NEG, a, -1, -1, 0, st);
    }
    return parse_primary(p);
}

static int parse_term(parser *p)
{
    int a = parse_unary(p);
    while (a >= 0) {
        int op, b;
        size_t st;
        skip_ws(p);
        st = p->pos;
        switch (p->s[p->pos]) {
        case '*': op = N_MUL; break;
        case '/': op = N_DIV; break;
        case '%': op = N_MOD; break;
        default: return a;
        }
        p->pos++;
        if ((b = parse_unary(p)) < 0)
            return -1;
        a = new_node(p, op, a, b, -1, 0, st);
    }
    return a;
}

static int parse_expr(parser *p)
{
    int a;
    if (++p->depth > MAX_DEPTH)
        return perr(p, p->pos, "expression nested too deeply"), -1;
    a = parse_term(p);
    while (a >= 0) {
        int op, b;
        size_t st;
        skip_ws(p);
        st = p->pos;
        if (p->s[p->pos] == '+')
            op = N_ADD;
        else if (p->s[p->pos] == '-')
            op = N_SUB;
        else
            break;
        p->pos++;
        if ((b = parse_term(p)) < 0)
            return -1;
        a = new_node(p, op, a, b, -1, 0, st);
    }
    p->depth--;
    return a;
}

int tk_manifest__expr_parse(tk_manifest_expr **out, const char *src, const tk_manifest_var *params, size_t nparams,
                            const char *what)
{
    parser p;
    struct tk_manifest_expr *e = NULL;
    size_t namelen = 0;
    char *names;
    int root;

    *out = NULL;
    if (!what)
        what = "expression";
    if (!src)
        return tk__err(TK_ERR_MANIFEST, "%s: the expression is missing", what);
    if (strlen(src) > MAX_SRC)
        return tk__err(TK_ERR_MANIFEST, "%s: expression longer than %d characters", what, MAX_SRC);
    for (size_t i = 0; i < nparams; i++)
        namelen += strlen(params[i].name) + 1;
    e = calloc(1, sizeof *e + MAX_NODES * sizeof(node));
    if (!e)
        goto nomem;
    e->src = tk__strdup(src);
    e->what = tk__strdup(what);
    e->pnames = calloc(nparams + 1, sizeof *e->pnames);
    names = malloc(namelen + 1);
    if (!e->src || !e->what || !e->pnames || !names) {
        free(names);
        goto nomem;
    }
    /* the names live in one block; pnames[nparams] keeps its start for the free */
    for (size_t i = 0, off = 0; i < nparams; i++) {
        size_t l = strlen(params[i].name) + 1;
        memcpy(names + off, params[i].name, l);
        e->pnames[i] = names + off;
        off += l;
    }
    e->pnames[nparams] = names; /* kept to free the block even when nparams == 0 */
    e->nparams = nparams;

    memset(&p, 0, sizeof p);
    p.s = src;
    p.params = params;
    p.nparams = nparams;
    p.what = what;
    p.e = e;
    p.cap = MAX_NODES;
    skip_ws(&p);
    if (p.s[p.pos] == '\0') {
        perr(&p, 0, "empty expression");
        goto fail;
    }
    root = parse_expr(&p);
    if (root < 0)
        goto fail;
    skip_ws(&p);
    if (p.s[p.pos] != '\0') {
        perr(&p, p.pos, "unexpected '%c' after a complete expression", p.s[p.pos]);
        goto fail;
    }
    e->root = (int16_t)root;
    *out = e;
    return TK_OK;
nomem:
    tk_manifest__expr_free(e);
    return tk__err(TK_ERR_NOMEM, "out of memory parsing %s", what);
fail:
    tk_manifest__expr_free(e);
    return p.rc ? p.rc : TK_ERR_MANIFEST;
}

void tk_manifest__expr_free(tk_manifest_expr *e)
{
    if (!e)
        return;
    if (e->pnames)
        free((void *)e->pnames[e->nparams]);
    free(e->pnames);
    free(e->src);
    free(e->what);
    free(e);
}

const char *tk_manifest__expr_src(const tk_manifest_expr *e) { return e ? e->src : ""; }

/* ---- evaluation ------------------------------------------------------------------------------- */

typedef struct {
    const tk_manifest_expr *e;
    const tk_manifest_value *vals;
    size_t nvals;
    int64_t sm_count; /* 0: no device */
    int rc;
} evalctx;

static int eerr(evalctx *c, const char *fmt, ...) TK_PRINTF(2, 3);
static int eerr(evalctx *c, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->rc = tk__err(TK_ERR_INVALID, "%s = '%s': %s", c->e->what, c->e->src, msg);
    return -1;
}

static int ev(evalctx *c, int ni, int64_t *out);

static const tk_manifest_value *value_of(evalctx *c, int32_t param)
{
    if (param < 0 || (size_t)param >= c->nvals) {
        eerr(c, "parameter %d has no value", (int)param);
        return NULL;
    }
    if (!c->vals[param].known) {
        eerr(c, "'%s' has no value yet", c->e->pnames[param]);
        return NULL;
    }
    return &c->vals[param];
}

static int ev(evalctx *c, int ni, int64_t *out)
{
    const node *n = &c->e->nodes[ni];
    int64_t a = 0, b = 0, r;
    const tk_manifest_value *v;

    switch (n->op) {
    case N_NUM: *out = n->v; return 0;
    case N_SM:
        if (c->sm_count <= 0)
            return eerr(c, "sm_count is known only when launching on a device");
        *out = c->sm_count;
        return 0;
    case N_SCALAR:
        if (!(v = value_of(c, n->param)))
            return -1;
        *out = v->i;
        return 0;
    case N_NDIM:
        if (!(v = value_of(c, n->param)))
            return -1;
        *out = v->ndim;
        return 0;
    case N_NUMEL:
        if (!(v = value_of(c, n->param)))
            return -1;
        r = 1;
        for (int32_t i = 0; i < v->ndim; i++)
            if (__builtin_mul_overflow(r, v->shape[i], &r))
                return eerr(c, "numel(%s) overflows int64", c->e->pnames[n->param]);
        *out = r;
        return 0;
    case N_SHAPE:
    case N_STRIDE: {
        int64_t ix, k;
        if (!(v = value_of(c, n->param)) || ev(c, n->a, &ix) != 0)
            return -1;
        k = ix < 0 ? ix + v->ndim : ix;
        if (k < 0 || k >= v->ndim)
            return eerr(c, "index %lld is out of range for %s, which has %d dimension%s", (long long)ix,
                        c->e->pnames[n->param], (int)v->ndim, v->ndim == 1 ? "" : "s");
        if (n->op == N_SHAPE) {
            *out = v->shape[k];
        } else if (v->strides) {
            *out = v->strides[k];
        } else { /* contiguous row-major */
            r = 1;
            for (int32_t i = v->ndim - 1; i > k; i--)
                if (__builtin_mul_overflow(r, v->shape[i], &r))
                    return eerr(c, "stride of %s overflows int64", c->e->pnames[n->param]);
            *out = r;
        }
        return 0;
    }
    case N_NEG:
        if (ev(c, n->a, &a) != 0)
            return -1;
        if (a == INT64_MIN)
            return eerr(c, "integer overflow in negation");
        *out = -a;
        return 0;
    default: break;
    }
    if (ev(c, n->a, &a) != 0 || ev(c, n->b, &b) != 0)
        return -1;
    switch (n->op) {
    case N_ADD:
        if (__builtin_add_overflow(a, b, out))
            return eerr(c, "integer overflow in %lld + %lld", (long long)a, (long long)b);
        return 0;
    case N_SUB:
        if (__builtin_sub_overflow(a, b, out))
            return eerr(c, "integer overflow in %lld - %lld", (long long)a, (long long)b);
        return 0;
    case N_MUL:
        if (__builtin_mul_overflow(a, b, out))
            return eerr(c, "integer overflow in %lld * %lld", (long long)a, (long long)b);
        return 0;
    case N_DIV:
    case N_MOD:
    case N_CDIV:
    case N_ALIGN:
        if (b == 0)
            return eerr(c, "division by zero (%s with a zero divisor)",
                        n->op == N_DIV    ? "/"
                        : n->op == N_MOD  ? "%"
                        : n->op == N_CDIV ? "cdiv"
                                          : "align");
        if (a == INT64_MIN && b == -1)
            return eerr(c, "integer overflow in division");
        if (n->op == N_DIV) {
            *out = a / b;
        } else if (n->op == N_MOD) {
            *out = a % b;
        } else {
            int64_t q = a / b;
            if (a % b != 0 && ((a < 0) == (b < 0)))
                q++; /* ceiling: C truncates toward zero */
            if (n->op == N_CDIV) {
                *out = q;
            } else if (__builtin_mul_overflow(q, b, out)) {
                return eerr(c, "integer overflow in align(%lld, %lld)", (long long)a, (long long)b);
            }
        }
        return 0;
    case N_MIN: *out = a < b ? a : b; return 0;
    case N_MAX: *out = a > b ? a : b; return 0;
    default: return eerr(c, "internal error: bad node %d", (int)n->op);
    }
}

int tk_manifest__expr_eval(int64_t *out, const tk_manifest_expr *e, const tk_manifest_value *vals, size_t nvals)
{
    return tk_manifest__expr_eval_dev(out, e, vals, nvals, 0);
}

int tk_manifest__expr_eval_dev(int64_t *out, const tk_manifest_expr *e, const tk_manifest_value *vals, size_t nvals,
                               int64_t sm_count)
{
    evalctx c = {e, vals, nvals, sm_count, TK_OK};
    int64_t v = 0;
    if (!out || !e)
        return tk__err(TK_ERR_INVALID, "tk_manifest__expr_eval: NULL argument");
    *out = 0;
    if (ev(&c, e->root, &v) != 0)
        return c.rc ? c.rc : TK_ERR_INVALID;
    *out = v;
    return TK_OK;
}
