/*
 * chat_template.c — chat templates: the Jinja2 subset that tokenizer_config.json's chat_template
 * strings use, rendered as transformers' apply_chat_template does (trim_blocks, lstrip_blocks, one
 * trailing newline of the template dropped).
 *
 * The template is lexed into tokens (text, tag delimiters, expression tokens, with the whitespace
 * control applied to the text), parsed into a small tree and evaluated. Everything the interpreter
 * allocates lives in one arena freed at the end; errors longjmp out to the entry point, so a failure
 * anywhere frees everything at once. Hard limits (chat_template.h) bound the template, the output, the
 * loop iterations, the nesting depth and the arena. A construct outside the subset is
 * TK_ERR_UNSUPPORTED naming it and its line.
 */
#include <ctype.h>
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/common.h"
#include "models/chat_template.h"
#include "models/models.h"

/* ---------------------------------------------------------------------------------------------- */
/* state, arena, errors */

typedef struct blk {
    struct blk *next;
    size_t used, cap;
    char data[];
} blk;

typedef struct st st;

typedef enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_NS } vtype;
typedef struct val val;
typedef struct vlist vlist;
typedef struct vdict vdict;
struct val {
    int t;
    union {
        int b;
        int64_t i;
        double f;
        struct {
            const char *s;
            size_t n;
        } s;
        vlist *l;
        vdict *d;
    } u;
};
struct vlist {
    size_t n, cap;
    val *v;
};
struct vdict {
    size_t n, cap;
    val *k; /* strings */
    val *v;
};

struct st {
    jmp_buf jb;
    int code;
    char msg[512];
    blk *arena;
    size_t arena_total;
    char *out;
    size_t on, ocap;
    long steps;
    int depth;
};

static void fail_(st *S, int code, const char *fmt, ...) TK_PRINTF(3, 4) __attribute__((noreturn));
static void fail_(st *S, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(S->msg, sizeof S->msg, fmt, ap);
    va_end(ap);
    S->code = code;
    longjmp(S->jb, 1);
}

static void *amem(st *S, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (!S->arena || S->arena->cap - S->arena->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        if (S->arena_total + cap > TK_CHAT_MAX_ARENA)
            fail_(S, TK_ERR_INVALID, "chat template: the rendering needs more than %zu MiB of memory",
                  TK_CHAT_MAX_ARENA >> 20);
        blk *b = malloc(sizeof *b + cap);
        if (!b)
            fail_(S, TK_ERR_NOMEM, "out of memory");
        b->next = S->arena;
        b->used = 0;
        b->cap = cap;
        S->arena = b;
        S->arena_total += cap;
    }
    void *p = S->arena->data + S->arena->used;
    S->arena->used += n;
    memset(p, 0, n);
    return p;
}

static char *astrn(st *S, const char *s, size_t n)
{
    char *p = amem(S, n + 1);
    memcpy(p, s, n);
    return p;
}

static void enter(st *S, int line)
{
    if (++S->depth > TK_CHAT_MAX_DEPTH) {
        if (line > 0)
            fail_(S, TK_ERR_INVALID, "chat template line %d: nested deeper than %d levels", line, TK_CHAT_MAX_DEPTH);
        fail_(S, TK_ERR_INVALID, "chat template: a value nested deeper than %d levels (a namespace holding itself?)",
              TK_CHAT_MAX_DEPTH);
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* lexer */

enum { T_TEXT, T_VBEG, T_VEND, T_BBEG, T_BEND, T_NAME, T_STR, T_INT, T_FLOAT, T_OP, T_EOF };

typedef struct {
    int t, line;
    const char *s; /* text, name, string value (unescaped), op */
    size_t n;
    int64_t i;
    double f;
} tok;

typedef struct {
    st *S;
    tok *v;
    size_t n, cap;
} toks;

static void push_tok(toks *T, tok t)
{
    if (T->n == T->cap) {
        size_t cap = T->cap ? 2 * T->cap : 256;
        tok *nv = amem(T->S, cap * sizeof *nv);
        if (T->n)
            memcpy(nv, T->v, T->n * sizeof *nv);
        T->v = nv;
        T->cap = cap;
    }
    T->v[T->n++] = t;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

/* The lexer's position and the whitespace control the last tag asked of the text after it. */
typedef struct {
    st *S;
    toks *T;
    const char *src;
    size_t len, p;
    int line;
    int strip_next; /* the tag ended with '-': strip all leading whitespace of the next text */
    int trim_nl;    /* trim_blocks: drop one newline right after a block tag or a comment */
} lexer;

/* Pushes the text from L->p up to the next tag, with the whitespace control of the tag before it and of
 * the tag after it ('{%-' strips, lstrip_blocks before '{%' and '{#' unless '{%+'). Returns where that
 * tag starts (len when there is none) and sets *kind to its second character. */
static size_t lex_text(lexer *L, int *kind)
{
    const char *src = L->src;
    size_t len = L->len, p = L->p;
    size_t q = p;
    while (q + 1 < len && !(src[q] == '{' && (src[q + 1] == '{' || src[q + 1] == '%' || src[q + 1] == '#')))
        q++;
    if (q + 1 >= len)
        q = len;
    size_t a = p, b = q;
    if (L->strip_next)
        while (a < b && is_ws(src[a]))
            a++;
    else if (L->trim_nl && a < b && src[a] == '\n')
        a++;
    *kind = q < len ? src[q + 1] : 0;
    if (q < len && q + 2 < len && src[q + 2] == '-') {
        while (b > a && is_ws(src[b - 1]))
            b--;
    } else if (q < len && (*kind == '%' || *kind == '#') && !(q + 2 < len && src[q + 2] == '+')) {
        /* lstrip_blocks: spaces and tabs between the line's start and the tag */
        size_t k = b;
        while (k > a && (src[k - 1] == ' ' || src[k - 1] == '\t'))
            k--;
        if ((k == 0 || src[k - 1] == '\n') && k >= a)
            b = k;
    }
    int tline = L->line;
    for (size_t k = p; k < q; k++)
        L->line += src[k] == '\n';
    if (b > a)
        push_tok(L->T, (tok){T_TEXT, tline, src + a, b - a, 0, 0});
    L->strip_next = L->trim_nl = 0;
    return q;
}

/* Skips a comment, L->p after '{#' (and its '-' or '+'), through its '#}'. */
static void lex_comment(lexer *L)
{
    const char *src = L->src;
    size_t len = L->len, p = L->p;
    const char *e = NULL;
    for (size_t k = p; k + 1 < len; k++)
        if (src[k] == '#' && src[k + 1] == '}') {
            e = src + k;
            break;
        }
    if (!e)
        fail_(L->S, TK_ERR_INVALID, "chat template line %d: a comment '{#' is never closed with '#}'", L->line);
    size_t ep = (size_t)(e - src);
    for (size_t k = p; k < ep; k++)
        L->line += src[k] == '\n';
    L->strip_next = ep > p && src[ep - 1] == '-';
    L->trim_nl = !L->strip_next;
    L->p = ep + 2;
}

static void lex_name(lexer *L)
{
    const char *src = L->src;
    size_t k = L->p;
    while (k < L->len && (isalnum((unsigned char)src[k]) || src[k] == '_'))
        k++;
    push_tok(L->T, (tok){T_NAME, L->line, src + L->p, k - L->p, 0, 0});
    L->p = k;
}

/* An integer or a float, with '_' separators in the integer part. */
static void lex_number(lexer *L)
{
    const char *src = L->src;
    size_t len = L->len, p = L->p;
    size_t k = p;
    int isf = 0;
    while (k < len && (isdigit((unsigned char)src[k]) || src[k] == '_'))
        k++;
    if (k + 1 < len && src[k] == '.' && isdigit((unsigned char)src[k + 1])) {
        isf = 1;
        k++;
        while (k < len && isdigit((unsigned char)src[k]))
            k++;
    }
    char buf[64];
    size_t m = 0;
    for (size_t j = p; j < k && m < sizeof buf - 1; j++)
        if (src[j] != '_')
            buf[m++] = src[j];
    buf[m] = 0;
    tok t = {isf ? T_FLOAT : T_INT, L->line, NULL, 0, 0, 0};
    if (isf)
        t.f = strtod(buf, NULL);
    else
        t.i = strtoll(buf, NULL, 10);
    push_tok(L->T, t);
    L->p = k;
}

/* A string quoted with q, unescaped into the arena; escapes outside the subset are TK_ERR_UNSUPPORTED. */
static void lex_string(lexer *L, char q)
{
    const char *src = L->src;
    size_t len = L->len, p = L->p;
    size_t k = p + 1;
    char *o = amem(L->S, len - p + 1);
    size_t m = 0;
    int sline = L->line;
    while (k < len && src[k] != q) {
        if (src[k] == '\n')
            L->line++;
        if (src[k] == '\\' && k + 1 < len) {
            char x = src[++k];
            switch (x) {
            case 'n': o[m++] = '\n'; break;
            case 't': o[m++] = '\t'; break;
            case 'r': o[m++] = '\r'; break;
            case '\\': o[m++] = '\\'; break;
            case '\'': o[m++] = '\''; break;
            case '"': o[m++] = '"'; break;
            case '\n': L->line++; break;
            default:
                if (x == 'u' || x == 'x' || x == 'U' || x == 'N' || isdigit((unsigned char)x))
                    fail_(L->S, TK_ERR_UNSUPPORTED,
                          "chat template line %d: the string escape '\\%c' is not supported by tk's template subset",
                          L->line, x);
                o[m++] = '\\';
                o[m++] = x;
            }
            k++;
        } else {
            o[m++] = src[k++];
        }
    }
    if (k >= len)
        fail_(L->S, TK_ERR_INVALID, "chat template line %d: a string is never closed", sline);
    push_tok(L->T, (tok){T_STR, sline, o, m, 0, 0});
    L->p = k + 1;
}

/* A one- or two-character operator; *depth counts the open brackets, so a '}' inside a dict literal
 * does not end a '{{' tag. */
static void lex_op(lexer *L, int *depth)
{
    static const char *two[] = {"==", "!=", "<=", ">=", "//", "**"};
    const char *src = L->src;
    size_t p = L->p;
    char c = src[p];
    size_t n = 1;
    for (size_t j = 0; j < sizeof two / sizeof two[0]; j++)
        if (p + 1 < L->len && src[p] == two[j][0] && src[p + 1] == two[j][1])
            n = 2;
    if (n == 1 && !strchr("()[]{}.,:|+-*/%~=<>", c))
        fail_(L->S, TK_ERR_INVALID, "chat template line %d: unexpected character '%c'", L->line,
              isprint((unsigned char)c) ? c : '?');
    if (c == '(' || c == '[' || c == '{')
        (*depth)++;
    if ((c == ')' || c == ']' || c == '}') && *depth > 0)
        (*depth)--;
    push_tok(L->T, (tok){T_OP, L->line, src + p, n, 0, 0});
    L->p += n;
}

/* The tokens of a '{{ }}' (kind '{') or '{% %}' (kind '%') tag, L->p after its opening and its '-' or
 * '+', through its closing, which sets the whitespace control of the text after it. */
static void lex_tag(lexer *L, int kind)
{
    const char *src = L->src;
    size_t len = L->len;
    push_tok(L->T, (tok){kind == '{' ? T_VBEG : T_BBEG, L->line, NULL, 0, 0, 0});
    int depth = 0;
    while (L->p < len) {
        size_t p = L->p;
        char c = src[p];
        if (c == '\n') {
            L->line++;
            L->p++;
            continue;
        }
        if (is_ws(c)) {
            L->p++;
            continue;
        }
        char e2 = kind == '{' ? '}' : '%';
        int minus = c == '-' && p + 2 < len && src[p + 1] == e2 && src[p + 2] == '}';
        int plus = c == '+' && kind == '%' && p + 2 < len && src[p + 1] == '%' && src[p + 2] == '}';
        if (depth == 0 && (minus || plus || (c == e2 && p + 1 < len && src[p + 1] == '}'))) {
            push_tok(L->T, (tok){kind == '{' ? T_VEND : T_BEND, L->line, NULL, 0, 0, 0});
            L->p += minus || plus ? 3 : 2;
            L->strip_next = minus;
            L->trim_nl = kind == '%' && !minus && !plus;
            return;
        }
        if (isalpha((unsigned char)c) || c == '_')
            lex_name(L);
        else if (isdigit((unsigned char)c))
            lex_number(L);
        else if (c == '\'' || c == '"')
            lex_string(L, c);
        else
            lex_op(L, &depth);
    }
    fail_(L->S, TK_ERR_INVALID, "chat template line %d: a '%s' tag is never closed", L->line,
          kind == '{' ? "{{" : "{%");
}

static void lex(st *S, toks *T, const char *src, size_t len)
{
    lexer L = {S, T, src, len, 0, 1, 0, 0};
    while (L.p < len) {
        int kind;
        size_t q = lex_text(&L, &kind);
        if (q >= len)
            break;
        L.p = q + 2;
        if (L.p < len && (src[L.p] == '-' || src[L.p] == '+'))
            L.p++;
        if (kind == '#')
            lex_comment(&L);
        else
            lex_tag(&L, kind);
    }
    push_tok(T, (tok){T_EOF, L.line, NULL, 0, 0, 0});
}

/* ---------------------------------------------------------------------------------------------- */
/* parser */

enum {
    E_LIT,
    E_NAME,
    E_ATTR,
    E_INDEX,
    E_SLICE,
    E_CALL,
    E_FILTER,
    E_TEST,
    E_BIN,
    E_NEG,
    E_NOT,
    E_AND,
    E_OR,
    E_COND,
    E_LIST,
    E_DICT
};
typedef struct expr expr;
struct expr {
    int t, line;
    val lit;
    const char *name; /* E_NAME, E_ATTR, E_FILTER, E_TEST, E_BIN's op */
    expr *a, *b, *c;  /* operands; E_SLICE: a[b:c:d] with d in args[0] */
    expr **args;
    const char **kw; /* keyword names of args (NULL entries: positional) */
    size_t nargs;
    int neg; /* E_TEST: "is not"; E_BIN "not in" */
};

enum { S_TEXT, S_OUT, S_IF, S_FOR, S_SET, S_BREAK, S_CONTINUE, S_BLOCK };
typedef struct stmt stmt;
typedef struct {
    stmt **v;
    size_t n;
} body;
struct stmt {
    int t, line;
    const char *text;
    size_t n;
    expr *e;    /* S_OUT, S_SET value, S_FOR iterable */
    expr **conds; /* S_IF */
    body *bodies; /* S_IF: ncond (+1 else); S_FOR: [0] body, [1] else */
    size_t ncond;
    int has_else;
    const char *names[2]; /* S_FOR targets; S_SET: name or ns, attr */
    int nnames;
    expr *filter; /* S_FOR ... if cond */
};

typedef struct {
    st *S;
    toks *T;
    size_t p;
} ps;

static tok *cur(ps *P) { return &P->T->v[P->p]; }
static int is_op(ps *P, const char *op)
{
    tok *t = cur(P);
    return t->t == T_OP && t->n == strlen(op) && !memcmp(t->s, op, t->n);
}
static int is_name(ps *P, const char *nm)
{
    tok *t = cur(P);
    return t->t == T_NAME && t->n == strlen(nm) && !memcmp(t->s, nm, t->n);
}
static const char *tokdesc(ps *P, char *buf, size_t n)
{
    tok *t = cur(P);
    switch (t->t) {
    case T_EOF: return "the end of the template";
    case T_VEND: return "'}}'";
    case T_BEND: return "'%}'";
    case T_INT:
    case T_FLOAT: return "a number";
    case T_STR: return "a string";
    default: snprintf(buf, n, "'%.*s'", (int)(t->n > 40 ? 40 : t->n), t->s); return buf;
    }
}
static void expect_op(ps *P, const char *op)
{
    char b[64];
    if (!is_op(P, op))
        fail_(P->S, TK_ERR_INVALID, "chat template line %d: expected '%s', found %s", cur(P)->line, op,
              tokdesc(P, b, sizeof b));
    P->p++;
}
static const char *take_name(ps *P)
{
    char b[64];
    tok *t = cur(P);
    if (t->t != T_NAME)
        fail_(P->S, TK_ERR_INVALID, "chat template line %d: expected a name, found %s", t->line,
              tokdesc(P, b, sizeof b));
    P->p++;
    return astrn(P->S, t->s, t->n);
}
static expr *mk(ps *P, int t, int line)
{
    expr *e = amem(P->S, sizeof *e);
    e->t = t;
    e->line = line;
    return e;
}

static expr *p_expr(ps *P);
static expr *p_or(ps *P);
static expr *p_unary(ps *P, int with_filter);

static void p_args(ps *P, expr *e)
{
    /* after '(' */
    expr *args[32];
    const char *kw[32];
    size_t n = 0;
    while (!is_op(P, ")")) {
        if (n == 32)
            fail_(P->S, TK_ERR_UNSUPPORTED, "chat template line %d: more than 32 call arguments", cur(P)->line);
        kw[n] = NULL;
        if (cur(P)->t == T_NAME && P->T->v[P->p + 1].t == T_OP && P->T->v[P->p + 1].n == 1 &&
            P->T->v[P->p + 1].s[0] == '=') {
            kw[n] = take_name(P);
            P->p++;
        }
        args[n++] = p_expr(P);
        if (!is_op(P, ","))
            break;
        P->p++;
    }
    expect_op(P, ")");
    e->args = amem(P->S, (n + 1) * sizeof *e->args);
    e->kw = amem(P->S, (n + 1) * sizeof *e->kw);
    memcpy(e->args, args, n * sizeof *args);
    memcpy(e->kw, kw, n * sizeof *kw);
    e->nargs = n;
}

static expr *p_primary(ps *P)
{
    tok *t = cur(P);
    char b[64];
    expr *e;
    if (t->t == T_STR) {
        /* adjacent string literals concatenate */
        size_t n = 0;
        for (size_t k = P->p; P->T->v[k].t == T_STR; k++)
            n += P->T->v[k].n;
        char *s = amem(P->S, n + 1);
        size_t m = 0;
        while (cur(P)->t == T_STR) {
            memcpy(s + m, cur(P)->s, cur(P)->n);
            m += cur(P)->n;
            P->p++;
        }
        e = mk(P, E_LIT, t->line);
        e->lit.t = V_STR;
        e->lit.u.s.s = s;
        e->lit.u.s.n = n;
        return e;
    }
    if (t->t == T_INT || t->t == T_FLOAT) {
        e = mk(P, E_LIT, t->line);
        e->lit.t = t->t == T_INT ? V_INT : V_FLOAT;
        if (t->t == T_INT)
            e->lit.u.i = t->i;
        else
            e->lit.u.f = t->f;
        P->p++;
        return e;
    }
    if (t->t == T_NAME) {
        e = mk(P, E_LIT, t->line);
        if (is_name(P, "true") || is_name(P, "True") || is_name(P, "false") || is_name(P, "False")) {
            e->lit.t = V_BOOL;
            e->lit.u.b = t->s[0] == 't' || t->s[0] == 'T';
        } else if (is_name(P, "none") || is_name(P, "None")) {
            e->lit.t = V_NONE;
        } else {
            e->t = E_NAME;
            e->name = astrn(P->S, t->s, t->n);
        }
        P->p++;
        return e;
    }
    if (is_op(P, "(")) {
        P->p++;
        e = p_expr(P);
        if (is_op(P, ","))
            fail_(P->S, TK_ERR_UNSUPPORTED, "chat template line %d: tuples are not supported by tk's template subset",
                  t->line);
        expect_op(P, ")");
        return e;
    }
    if (is_op(P, "[") || is_op(P, "{")) {
        int dict = is_op(P, "{");
        P->p++;
        e = mk(P, dict ? E_DICT : E_LIST, t->line);
        size_t cap = 8, n = 0;
        expr **items = amem(P->S, cap * 2 * sizeof *items);
        while (!is_op(P, dict ? "}" : "]")) {
            if (n == cap) {
                expr **ni = amem(P->S, cap * 4 * sizeof *ni);
                memcpy(ni, items, n * 2 * sizeof *ni);
                items = ni;
                cap *= 2;
            }
            items[2 * n] = p_expr(P);
            if (dict) {
                expect_op(P, ":");
                items[2 * n + 1] = p_expr(P);
            }
            n++;
            if (!is_op(P, ","))
                break;
            P->p++;
        }
        expect_op(P, dict ? "}" : "]");
        e->args = items;
        e->nargs = n;
        return e;
    }
    fail_(P->S, TK_ERR_INVALID, "chat template line %d: expected an expression, found %s", t->line,
          tokdesc(P, b, sizeof b));
    return NULL;
}

static expr *p_postfix(ps *P, expr *e)
{
    for (;;) {
        int line = cur(P)->line;
        if (is_op(P, ".")) {
            P->p++;
            expr *x = mk(P, E_ATTR, line);
            x->a = e;
            if (cur(P)->t == T_INT) { /* x.0 */
                x->t = E_INDEX;
                x->b = p_primary(P);
            } else {
                x->name = take_name(P);
            }
            e = x;
        } else if (is_op(P, "[")) {
            P->p++;
            expr *parts[3] = {NULL, NULL, NULL};
            int k = 0, slice = 0;
            for (;;) {
                if (!is_op(P, ":") && !is_op(P, "]"))
                    parts[k] = p_expr(P);
                if (is_op(P, ":") && k < 2) {
                    slice = 1;
                    k++;
                    P->p++;
                    continue;
                }
                break;
            }
            expect_op(P, "]");
            expr *x = mk(P, slice ? E_SLICE : E_INDEX, line);
            x->a = e;
            if (!slice && !parts[0])
                fail_(P->S, TK_ERR_INVALID, "chat template line %d: an empty subscript '[]'", line);
            x->b = parts[0];
            x->c = parts[1];
            x->args = amem(P->S, sizeof *x->args);
            x->args[0] = parts[2];
            e = x;
        } else if (is_op(P, "(")) {
            P->p++;
            expr *x = mk(P, E_CALL, line);
            x->a = e;
            p_args(P, x);
            e = x;
        } else {
            return e;
        }
    }
}

static expr *p_filters(ps *P, expr *e)
{
    for (;;) {
        int line = cur(P)->line;
        if (is_op(P, "|")) {
            P->p++;
            expr *x = mk(P, E_FILTER, line);
            x->a = e;
            x->name = take_name(P);
            if (is_op(P, "(")) {
                P->p++;
                p_args(P, x);
            }
            e = x;
        } else if (is_name(P, "is")) {
            P->p++;
            expr *x = mk(P, E_TEST, line);
            x->a = e;
            if (is_name(P, "not")) {
                x->neg = 1;
                P->p++;
            }
            x->name = take_name(P);
            if (is_op(P, "(")) {
                P->p++;
                p_args(P, x);
            } else if (cur(P)->t == T_STR || cur(P)->t == T_INT ||
                       (cur(P)->t == T_NAME && !is_name(P, "and") && !is_name(P, "or") && !is_name(P, "else") &&
                        !is_name(P, "if") && !is_name(P, "in") && !is_name(P, "is"))) {
                /* a test's single argument without parentheses: `x is sameas none` */
                x->args = amem(P->S, sizeof *x->args);
                x->kw = amem(P->S, sizeof *x->kw);
                x->args[0] = p_unary(P, 0);
                x->nargs = 1;
            }
            e = x;
        } else {
            return e;
        }
    }
}

static expr *p_unary(ps *P, int with_filter)
{
    int line = cur(P)->line;
    expr *e;
    enter(P->S, line);
    if (is_op(P, "-") || is_op(P, "+")) {
        int neg = is_op(P, "-");
        P->p++;
        e = p_unary(P, 0);
        if (neg) {
            expr *x = mk(P, E_NEG, line);
            x->a = e;
            e = x;
        }
    } else {
        e = p_postfix(P, p_primary(P));
    }
    if (with_filter)
        e = p_filters(P, e);
    P->S->depth--;
    return e;
}

static expr *bin(ps *P, const char *op, expr *a, expr *b, int line)
{
    expr *x = mk(P, E_BIN, line);
    x->name = op;
    x->a = a;
    x->b = b;
    return x;
}

static expr *p_pow(ps *P)
{
    expr *e = p_unary(P, 1);
    while (is_op(P, "**")) {
        int line = cur(P)->line;
        P->p++;
        e = bin(P, "**", e, p_unary(P, 1), line);
    }
    return e;
}
static expr *p_math2(ps *P)
{
    expr *e = p_pow(P);
    for (;;) {
        int line = cur(P)->line;
        const char *op = is_op(P, "*") ? "*" : is_op(P, "/") ? "/" : is_op(P, "//") ? "//" : is_op(P, "%") ? "%" : NULL;
        if (!op)
            return e;
        P->p++;
        e = bin(P, op, e, p_pow(P), line);
    }
}
static expr *p_concat(ps *P)
{
    expr *e = p_math2(P);
    while (is_op(P, "~")) {
        int line = cur(P)->line;
        P->p++;
        e = bin(P, "~", e, p_math2(P), line);
    }
    return e;
}
static expr *p_math1(ps *P)
{
    expr *e = p_concat(P);
    for (;;) {
        int line = cur(P)->line;
        const char *op = is_op(P, "+") ? "+" : is_op(P, "-") ? "-" : NULL;
        if (!op)
            return e;
        P->p++;
        e = bin(P, op, e, p_concat(P), line);
    }
}
static expr *p_compare(ps *P)
{
    expr *e = p_math1(P);
    for (;;) {
        int line = cur(P)->line;
        static const char *ops[] = {"==", "!=", "<=", ">=", "<", ">"};
        const char *op = NULL;
        for (size_t k = 0; k < 6; k++)
            if (is_op(P, ops[k]))
                op = ops[k];
        int neg = 0;
        if (!op && is_name(P, "in"))
            op = "in";
        if (!op && is_name(P, "not") && P->T->v[P->p + 1].t == T_NAME && P->T->v[P->p + 1].n == 2 &&
            !memcmp(P->T->v[P->p + 1].s, "in", 2)) {
            op = "in";
            neg = 1;
            P->p++;
        }
        if (!op)
            return e;
        P->p++;
        e = bin(P, op, e, p_math1(P), line);
        e->neg = neg;
    }
}
static expr *p_not(ps *P)
{
    if (is_name(P, "not")) {
        int line = cur(P)->line;
        P->p++;
        enter(P->S, line);
        expr *x = mk(P, E_NOT, line);
        x->a = p_not(P);
        P->S->depth--;
        return x;
    }
    return p_compare(P);
}
static expr *p_and(ps *P)
{
    expr *e = p_not(P);
    while (is_name(P, "and")) {
        int line = cur(P)->line;
        P->p++;
        expr *x = mk(P, E_AND, line);
        x->a = e;
        x->b = p_not(P);
        e = x;
    }
    return e;
}
static expr *p_or(ps *P)
{
    expr *e = p_and(P);
    while (is_name(P, "or")) {
        int line = cur(P)->line;
        P->p++;
        expr *x = mk(P, E_OR, line);
        x->a = e;
        x->b = p_and(P);
        e = x;
    }
    return e;
}
static expr *p_expr(ps *P)
{
    int line = cur(P)->line;
    enter(P->S, line);
    expr *e = p_or(P);
    if (is_name(P, "if")) {
        P->p++;
        expr *x = mk(P, E_COND, line);
        x->a = e;
        x->b = p_or(P);
        if (is_name(P, "else")) {
            P->p++;
            x->c = p_expr(P);
        }
        e = x;
    }
    P->S->depth--;
    return e;
}

/* Parses statements up to a block tag whose name is one of `ends` (NULL-terminated); leaves P at that
 * name (after '{%'). At top level (ends NULL) parses to the end. */
static body p_body(ps *P, const char *const *ends);

static void end_tag(ps *P)
{
    char b[64];
    if (cur(P)->t != T_BEND)
        fail_(P->S, TK_ERR_INVALID, "chat template line %d: expected '%%}', found %s", cur(P)->line,
              tokdesc(P, b, sizeof b));
    P->p++;
}

/* {% if c %} ... {% elif c %} ... {% else %} ... {% endif %}; P after 'if'. */
static void p_if(ps *P, stmt *s)
{
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    expr *conds[256];
    body bodies[257];
    size_t n = 0;
    conds[n] = p_expr(P);
    end_tag(P);
    for (;;) {
        bodies[n++] = p_body(P, ends);
        if (is_name(P, "elif")) {
            if (n == 256)
                fail_(P->S, TK_ERR_UNSUPPORTED, "chat template line %d: more than 256 elif branches", cur(P)->line);
            P->p++;
            conds[n] = p_expr(P);
            end_tag(P);
            continue;
        }
        if (is_name(P, "else")) {
            P->p++;
            end_tag(P);
            static const char *const e2[] = {"endif", NULL};
            bodies[n] = p_body(P, e2);
            s->has_else = 1;
        }
        break;
    }
    P->p++; /* endif */
    end_tag(P);
    s->t = S_IF;
    s->ncond = n;
    s->conds = amem(P->S, n * sizeof *s->conds);
    memcpy(s->conds, conds, n * sizeof *conds);
    s->bodies = amem(P->S, (n + 1) * sizeof *s->bodies);
    memcpy(s->bodies, bodies, (n + s->has_else) * sizeof *bodies);
}

/* {% for x[, y] in e [if c] %} ... {% else %} ... {% endfor %}; P after 'for'. */
static void p_for(ps *P, stmt *s)
{
    int line = s->line;
    s->t = S_FOR;
    s->names[0] = take_name(P);
    s->nnames = 1;
    if (is_op(P, ",")) {
        P->p++;
        s->names[1] = take_name(P);
        s->nnames = 2;
        if (is_op(P, ","))
            fail_(P->S, TK_ERR_UNSUPPORTED,
                  "chat template line %d: a for loop unpacks at most two names in tk's template subset", line);
    }
    if (!is_name(P, "in"))
        fail_(P->S, TK_ERR_INVALID, "chat template line %d: expected 'in' in the for loop", line);
    P->p++;
    s->e = p_or(P);
    if (is_name(P, "if")) {
        P->p++;
        s->filter = p_or(P);
    }
    if (is_name(P, "recursive"))
        fail_(P->S, TK_ERR_UNSUPPORTED,
              "chat template line %d: recursive for loops are not supported by tk's "
              "template subset",
              line);
    end_tag(P);
    static const char *const ends[] = {"else", "endfor", NULL};
    s->bodies = amem(P->S, 2 * sizeof *s->bodies);
    s->bodies[0] = p_body(P, ends);
    if (is_name(P, "else")) {
        P->p++;
        end_tag(P);
        static const char *const e2[] = {"endfor", NULL};
        s->bodies[1] = p_body(P, e2);
        s->has_else = 1;
    }
    P->p++;
    end_tag(P);
}

/* {% set name = e %} or {% set ns.attr = e %}; P after 'set'. */
static void p_set(ps *P, stmt *s)
{
    int line = s->line;
    s->t = S_SET;
    s->names[0] = take_name(P);
    s->nnames = 1;
    if (is_op(P, ".")) {
        P->p++;
        s->names[1] = take_name(P);
        s->nnames = 2;
    }
    if (is_op(P, ","))
        fail_(P->S, TK_ERR_UNSUPPORTED,
              "chat template line %d: 'set' with several targets is not supported by "
              "tk's template subset",
              line);
    if (cur(P)->t == T_BEND || is_op(P, "|"))
        fail_(P->S, TK_ERR_UNSUPPORTED,
              "chat template line %d: block 'set' ... 'endset' is not supported by "
              "tk's template subset",
              line);
    expect_op(P, "=");
    s->e = p_expr(P);
    end_tag(P);
}

static stmt *p_stmt_block(ps *P)
{
    /* P at the tag name after '{%' */
    tok *t = cur(P);
    int line = t->line;
    stmt *s = amem(P->S, sizeof *s);
    s->line = line;
    if (is_name(P, "if")) {
        P->p++;
        p_if(P, s);
        return s;
    }
    if (is_name(P, "for")) {
        P->p++;
        p_for(P, s);
        return s;
    }
    if (is_name(P, "set")) {
        P->p++;
        p_set(P, s);
        return s;
    }
    if (is_name(P, "break") || is_name(P, "continue")) {
        s->t = is_name(P, "break") ? S_BREAK : S_CONTINUE;
        P->p++;
        end_tag(P);
        return s;
    }
    if (is_name(P, "generation")) { /* transformers' AssistantTracker: renders its body */
        P->p++;
        end_tag(P);
        static const char *const ends[] = {"endgeneration", NULL};
        s->t = S_BLOCK;
        s->bodies = amem(P->S, sizeof *s->bodies);
        s->bodies[0] = p_body(P, ends);
        P->p++;
        end_tag(P);
        return s;
    }
    if (t->t == T_NAME)
        fail_(P->S, TK_ERR_UNSUPPORTED,
              "chat template line %d: the tag '%.*s' is not supported by tk's template subset (supported: if/elif/"
              "else, for, set, break, continue, generation)",
              line, (int)(t->n > 40 ? 40 : t->n), t->s);
    fail_(P->S, TK_ERR_INVALID, "chat template line %d: expected a tag name after '{%%'", line);
    return NULL;
}

static body p_body(ps *P, const char *const *ends)
{
    body b = {NULL, 0};
    size_t cap = 0;
    int line0 = cur(P)->line;
    enter(P->S, line0);
    for (;;) {
        tok *t = cur(P);
        stmt *s = NULL;
        if (t->t == T_EOF) {
            if (ends) {
                size_t k = 0;
                while (ends[k + 1])
                    k++;
                fail_(P->S, TK_ERR_INVALID,
                      "chat template line %d: a block opened here is never closed (expected "
                      "'{%% %s %%}')",
                      line0, ends[k]);
            }
            break;
        }
        if (t->t == T_TEXT) {
            s = amem(P->S, sizeof *s);
            s->t = S_TEXT;
            s->line = t->line;
            s->text = t->s;
            s->n = t->n;
            P->p++;
        } else if (t->t == T_VBEG) {
            P->p++;
            s = amem(P->S, sizeof *s);
            s->t = S_OUT;
            s->line = t->line;
            s->e = p_expr(P);
            char bb[64];
            if (cur(P)->t != T_VEND)
                fail_(P->S, TK_ERR_INVALID, "chat template line %d: expected '}}', found %s", cur(P)->line,
                      tokdesc(P, bb, sizeof bb));
            P->p++;
        } else if (t->t == T_BBEG) {
            P->p++;
            for (size_t k = 0; ends && ends[k]; k++)
                if (is_name(P, ends[k])) {
                    P->S->depth--;
                    return b;
                }
            static const char *const stray[] = {"endif",         "endfor", "elif",     "else",
                                                "endgeneration", "endset", "endmacro", NULL};
            for (size_t k = 0; stray[k]; k++)
                if (is_name(P, stray[k]))
                    fail_(P->S, TK_ERR_INVALID, "chat template line %d: '%s' without its opening tag", cur(P)->line,
                          stray[k]);
            s = p_stmt_block(P);
        } else {
            fail_(P->S, TK_ERR_INVALID, "chat template line %d: unexpected token", t->line);
        }
        if (b.n == cap) {
            cap = cap ? 2 * cap : 8;
            stmt **nv = amem(P->S, cap * sizeof *nv);
            if (b.n)
                memcpy(nv, b.v, b.n * sizeof *nv);
            b.v = nv;
        }
        b.v[b.n++] = s;
    }
    P->S->depth--;
    return b;
}

/* ---------------------------------------------------------------------------------------------- */
/* values */

static val vstr(st *S, const char *s, size_t n)
{
    val v = {V_STR, {0}};
    v.u.s.s = s;
    v.u.s.n = n;
    (void)S;
    return v;
}
static val vint(int64_t i)
{
    val v = {V_INT, {0}};
    v.u.i = i;
    return v;
}
static val vbool(int b)
{
    val v = {V_BOOL, {0}};
    v.u.b = !!b;
    return v;
}
static val vnone(void) { return (val){V_NONE, {0}}; }
static val vundef(void) { return (val){V_UNDEF, {0}}; }
static val vlist_new(st *S, size_t cap)
{
    val v = {V_LIST, {0}};
    v.u.l = amem(S, sizeof *v.u.l);
    v.u.l->cap = cap ? cap : 4;
    v.u.l->v = amem(S, v.u.l->cap * sizeof(val));
    return v;
}
static void list_push(st *S, vlist *l, val x)
{
    if (l->n == l->cap) {
        val *nv = amem(S, 2 * l->cap * sizeof *nv);
        memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap *= 2;
    }
    l->v[l->n++] = x;
}
static val vdict_cap(st *S, int t, size_t cap)
{
    val v = {t, {0}};
    v.u.d = amem(S, sizeof *v.u.d);
    v.u.d->cap = cap;
    v.u.d->k = amem(S, cap * sizeof(val));
    v.u.d->v = amem(S, cap * sizeof(val));
    return v;
}
static val vdict_new(st *S, int t) { return vdict_cap(S, t, 8); }
static int seq(val a, const char *s, size_t n) { return a.t == V_STR && a.u.s.n == n && !memcmp(a.u.s.s, s, n); }
static val *dict_find(vdict *d, const char *k, size_t n)
{
    for (size_t i = 0; i < d->n; i++)
        if (seq(d->k[i], k, n))
            return &d->v[i];
    return NULL;
}
static void dict_set(st *S, vdict *d, val k, val v)
{
    val *o = dict_find(d, k.u.s.s, k.u.s.n);
    if (o) {
        *o = v;
        return;
    }
    if (d->n == d->cap) {
        val *nk = amem(S, 2 * d->cap * sizeof *nk), *nv = amem(S, 2 * d->cap * sizeof *nv);
        memcpy(nk, d->k, d->n * sizeof *nk);
        memcpy(nv, d->v, d->n * sizeof *nv);
        d->k = nk;
        d->v = nv;
        d->cap *= 2;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
}
static void dict_sets(st *S, vdict *d, const char *k, val v) { dict_set(S, d, vstr(S, k, strlen(k)), v); }

static const char *tname(val v)
{
    static const char *n[] = {"undefined", "none", "boolean", "integer",  "float",
                              "string",    "list", "dict",    "namespace"};
    return n[v.t];
}

static int truthy(val v)
{
    switch (v.t) {
    case V_BOOL: return v.u.b;
    case V_INT: return v.u.i != 0;
    case V_FLOAT: return v.u.f != 0;
    case V_STR: return v.u.s.n != 0;
    case V_LIST: return v.u.l->n != 0;
    case V_DICT: return v.u.d->n != 0;
    case V_NS: return 1;
    default: return 0;
    }
}

/* a growable string in the arena */
typedef struct {
    st *S;
    char *s;
    size_t n, cap;
} sbuf;
static void sb_add(sbuf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1)
            cap *= 2;
        if (cap > TK_CHAT_MAX_OUTPUT * 2)
            fail_(b->S, TK_ERR_INVALID, "chat template: a string grows past %zu MiB", TK_CHAT_MAX_OUTPUT >> 20);
        char *ns = amem(b->S, cap);
        if (b->n)
            memcpy(ns, b->s, b->n);
        b->s = ns;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
}
static void sb_str(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

static void py_repr_str(sbuf *b, const char *s, size_t n)
{
    int dq = memchr(s, '\'', n) && !memchr(s, '"', n);
    char q = dq ? '"' : '\'';
    sb_add(b, &q, 1);
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '\\' || c == q) {
            sb_add(b, "\\", 1);
            sb_add(b, &c, 1);
        } else if (c == '\n')
            sb_str(b, "\\n");
        else if (c == '\t')
            sb_str(b, "\\t");
        else if (c == '\r')
            sb_str(b, "\\r");
        else
            sb_add(b, &c, 1);
    }
    sb_add(b, &q, 1);
}

static void to_str(sbuf *b, val v, int repr)
{
    char num[64];
    enter(b->S, 0); /* a namespace can hold itself */
    switch (v.t) {
    case V_UNDEF: break;
    case V_NONE: sb_str(b, "None"); break;
    case V_BOOL: sb_str(b, v.u.b ? "True" : "False"); break;
    case V_INT:
        snprintf(num, sizeof num, "%lld", (long long)v.u.i);
        sb_str(b, num);
        break;
    case V_FLOAT:
        snprintf(num, sizeof num, "%.17g", v.u.f);
        for (int p = 1; p < 17; p++) { /* shortest round trip, as Python's repr */
            char t[64];
            snprintf(t, sizeof t, "%.*g", p, v.u.f);
            if (strtod(t, NULL) == v.u.f) {
                memcpy(num, t, sizeof t);
                break;
            }
        }
        if (!strpbrk(num, ".einn"))
            strcat(num, ".0");
        sb_str(b, num);
        break;
    case V_STR:
        if (repr)
            py_repr_str(b, v.u.s.s, v.u.s.n);
        else
            sb_add(b, v.u.s.s, v.u.s.n);
        break;
    case V_LIST:
        sb_str(b, "[");
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i)
                sb_str(b, ", ");
            to_str(b, v.u.l->v[i], 1);
        }
        sb_str(b, "]");
        break;
    case V_DICT:
    case V_NS:
        sb_str(b, v.t == V_NS ? "<Namespace {" : "{");
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i)
                sb_str(b, ", ");
            to_str(b, v.u.d->k[i], 1);
            sb_str(b, ": ");
            to_str(b, v.u.d->v[i], 1);
        }
        sb_str(b, v.t == V_NS ? "}>" : "}");
        break;
    }
    b->S->depth--;
}

static val stringify(st *S, val v)
{
    if (v.t == V_STR)
        return v;
    sbuf b = {S, NULL, 0, 0};
    to_str(&b, v, 0);
    return vstr(S, b.s ? b.s : "", b.n);
}

/* json.dumps(v, ensure_ascii=False, indent=indent) */
static void to_json(st *S, sbuf *b, val v, int indent, int level, int line)
{
    enter(S, line);
    switch (v.t) {
    case V_UNDEF:
    case V_NONE: sb_str(b, "null"); break;
    case V_BOOL: sb_str(b, v.u.b ? "true" : "false"); break;
    case V_INT:
    case V_FLOAT: to_str(b, v, 0); break;
    case V_STR:
        sb_str(b, "\"");
        for (size_t i = 0; i < v.u.s.n; i++) {
            unsigned char c = (unsigned char)v.u.s.s[i];
            char e[8];
            if (c == '"' || c == '\\') {
                e[0] = '\\';
                e[1] = (char)c;
                sb_add(b, e, 2);
            } else if (c == '\n')
                sb_str(b, "\\n");
            else if (c == '\r')
                sb_str(b, "\\r");
            else if (c == '\t')
                sb_str(b, "\\t");
            else if (c == '\b')
                sb_str(b, "\\b");
            else if (c == '\f')
                sb_str(b, "\\f");
            else if (c < 0x20) {
                snprintf(e, sizeof e, "\\u%04x", c);
                sb_str(b, e);
            } else
                sb_add(b, (char *)&c, 1);
        }
        sb_str(b, "\"");
        break;
    case V_LIST:
    case V_DICT:
    case V_NS: {
        int isl = v.t == V_LIST;
        size_t n = isl ? v.u.l->n : v.u.d->n;
        sb_str(b, isl ? "[" : "{");
        for (size_t i = 0; i < n; i++) {
            if (i)
                sb_str(b, indent >= 0 ? "," : ", ");
            if (indent >= 0) {
                sb_str(b, "\n");
                for (int k = 0; k < indent * (level + 1); k++)
                    sb_str(b, " ");
            }
            if (!isl) {
                to_json(S, b, v.u.d->k[i], indent, level + 1, line);
                sb_str(b, ": ");
            }
            to_json(S, b, isl ? v.u.l->v[i] : v.u.d->v[i], indent, level + 1, line);
        }
        if (indent >= 0 && n) {
            sb_str(b, "\n");
            for (int k = 0; k < indent * level; k++)
                sb_str(b, " ");
        }
        sb_str(b, isl ? "]" : "}");
        break;
    }
    }
    S->depth--;
}

static int vequal(val a, val b)
{
    if ((a.t == V_INT || a.t == V_FLOAT || a.t == V_BOOL) && (b.t == V_INT || b.t == V_FLOAT || b.t == V_BOOL)) {
        double x = a.t == V_INT ? (double)a.u.i : a.t == V_FLOAT ? a.u.f : a.u.b;
        double y = b.t == V_INT ? (double)b.u.i : b.t == V_FLOAT ? b.u.f : b.u.b;
        return x == y;
    }
    if (a.t != b.t)
        return 0;
    switch (a.t) {
    case V_UNDEF:
    case V_NONE: return 1;
    case V_STR: return a.u.s.n == b.u.s.n && !memcmp(a.u.s.s, b.u.s.s, a.u.s.n);
    case V_LIST:
        if (a.u.l->n != b.u.l->n)
            return 0;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!vequal(a.u.l->v[i], b.u.l->v[i]))
                return 0;
        return 1;
    case V_DICT:
        if (a.u.d->n != b.u.d->n)
            return 0;
        for (size_t i = 0; i < a.u.d->n; i++) {
            val *o = dict_find(b.u.d, a.u.d->k[i].u.s.s, a.u.d->k[i].u.s.n);
            if (!o || !vequal(a.u.d->v[i], *o))
                return 0;
        }
        return 1;
    default: return a.u.d == b.u.d;
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* evaluation */

typedef struct scope {
    struct scope *up;
    val names; /* a dict */
} scope;

static val eval(st *S, scope *sc, expr *e);

static val lookup(scope *sc, const char *name)
{
    for (; sc; sc = sc->up) {
        val *v = dict_find(sc->names.u.d, name, strlen(name));
        if (v)
            return *v;
    }
    return vundef();
}

static int64_t want_int(st *S, val v, const char *what, int line)
{
    if (v.t == V_INT)
        return v.u.i;
    if (v.t == V_BOOL)
        return v.u.b;
    fail_(S, TK_ERR_INVALID, "chat template line %d: %s must be an integer, not %s", line, what, tname(v));
    return 0;
}

static val getitem(st *S, val o, val k, int line)
{
    if (o.t == V_UNDEF)
        fail_(S, TK_ERR_INVALID, "chat template line %d: indexing an undefined value", line);
    if (o.t == V_DICT || o.t == V_NS) {
        if (k.t != V_STR)
            return vundef();
        val *v = dict_find(o.u.d, k.u.s.s, k.u.s.n);
        return v ? *v : vundef();
    }
    if (o.t == V_LIST || o.t == V_STR) {
        if (k.t != V_INT)
            return vundef();
        int64_t n = o.t == V_LIST ? (int64_t)o.u.l->n : (int64_t)o.u.s.n, i = k.u.i;
        if (i < 0)
            i += n;
        if (i < 0 || i >= n)
            return vundef();
        return o.t == V_LIST ? o.u.l->v[i] : vstr(S, o.u.s.s + i, 1);
    }
    return vundef();
}

static val do_slice(st *S, val o, val a, val b, val c, int line)
{
    if (o.t != V_LIST && o.t != V_STR)
        fail_(S, TK_ERR_INVALID, "chat template line %d: slicing a %s (only lists and strings slice)", line, tname(o));
    int64_t n = o.t == V_LIST ? (int64_t)o.u.l->n : (int64_t)o.u.s.n;
    int64_t step = c.t == V_UNDEF || c.t == V_NONE ? 1 : want_int(S, c, "a slice step", line);
    if (step == 0)
        fail_(S, TK_ERR_INVALID, "chat template line %d: slice step cannot be zero", line);
    int64_t lo, hi;
    if (a.t == V_UNDEF || a.t == V_NONE)
        lo = step > 0 ? 0 : n - 1;
    else {
        lo = want_int(S, a, "a slice start", line);
        if (lo < 0)
            lo += n;
        if (lo < 0)
            lo = step > 0 ? 0 : -1;
        if (lo >= n)
            lo = step > 0 ? n : n - 1;
    }
    if (b.t == V_UNDEF || b.t == V_NONE)
        hi = step > 0 ? n : -1;
    else {
        hi = want_int(S, b, "a slice end", line);
        if (hi < 0)
            hi += n;
        if (hi < 0)
            hi = step > 0 ? 0 : -1;
        if (hi >= n)
            hi = step > 0 ? n : n - 1;
    }
    if (o.t == V_LIST) {
        val r = vlist_new(S, 4);
        for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step)
            list_push(S, r.u.l, o.u.l->v[i]);
        return r;
    }
    sbuf sb = {S, NULL, 0, 0};
    for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step)
        sb_add(&sb, o.u.s.s + i, 1);
    return vstr(S, sb.s ? sb.s : "", sb.n);
}

static val strip_str(st *S, val s, int left, int right, val chars)
{
    const char *cs = chars.t == V_STR ? astrn(S, chars.u.s.s, chars.u.s.n) : NULL;
    size_t a = 0, b = s.u.s.n;
    while (left && a < b && (cs ? memchr(cs, s.u.s.s[a], chars.u.s.n) != NULL : is_ws(s.u.s.s[a])))
        a++;
    while (right && b > a && (cs ? memchr(cs, s.u.s.s[b - 1], chars.u.s.n) != NULL : is_ws(s.u.s.s[b - 1])))
        b--;
    return vstr(S, s.u.s.s + a, b - a);
}

static val case_str(st *S, val s, int mode) /* 0 lower, 1 upper, 2 capitalize, 3 title (ASCII) */
{
    char *o = astrn(S, s.u.s.s, s.u.s.n);
    int start = 1;
    for (size_t i = 0; i < s.u.s.n; i++) {
        unsigned char c = (unsigned char)o[i];
        if (mode == 0 || (mode == 2 && i))
            o[i] = (char)tolower(c);
        else if (mode == 1 || (mode == 2 && !i))
            o[i] = (char)toupper(c);
        else {
            o[i] = (char)(start ? toupper(c) : tolower(c));
            start = !isalnum(c);
        }
    }
    return vstr(S, o, s.u.s.n);
}

static val arg(expr *e, val *av, size_t i, const char *kw, size_t *used)
{
    for (size_t k = 0; k < e->nargs; k++)
        if (e->kw[k] && kw && !strcmp(e->kw[k], kw)) {
            (*used)++;
            return av[k];
        }
    size_t pos = 0;
    for (size_t k = 0; k < e->nargs; k++)
        if (!e->kw[k] && pos++ == i) {
            (*used)++;
            return av[k];
        }
    return vundef();
}

static val *eval_args(st *S, scope *sc, expr *e)
{
    val *av = amem(S, (e->nargs + 1) * sizeof *av);
    for (size_t k = 0; k < e->nargs; k++)
        av[k] = eval(S, sc, e->args[k]);
    return av;
}

static void want_str(st *S, val v, const char *what, int line)
{
    if (v.t != V_STR)
        fail_(S, TK_ERR_INVALID, "chat template line %d: %s wants a string, got %s", line, what, tname(v));
}

static val join_list(st *S, val l, val sep, int line)
{
    if (l.t != V_LIST)
        fail_(S, TK_ERR_INVALID, "chat template line %d: join wants a list, got %s", line, tname(l));
    sbuf b = {S, NULL, 0, 0};
    for (size_t i = 0; i < l.u.l->n; i++) {
        if (i && sep.t == V_STR)
            sb_add(&b, sep.u.s.s, sep.u.s.n);
        to_str(&b, l.u.l->v[i], 0);
    }
    return vstr(S, b.s ? b.s : "", b.n);
}

static val call_method(st *S, val o, const char *m, expr *e, val *av, int line)
{
    size_t used = 0;
    val r = vundef();
    if (o.t == V_STR) {
        if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip"))
            r = strip_str(S, o, m[0] != 'r', m[0] != 'l', arg(e, av, 0, NULL, &used));
        else if (!strcmp(m, "upper") || !strcmp(m, "lower") || !strcmp(m, "capitalize") || !strcmp(m, "title"))
            r = case_str(S, o, m[0] == 'l' ? 0 : m[0] == 'u' ? 1 : m[0] == 'c' ? 2 : 3);
        else if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
            val x = arg(e, av, 0, NULL, &used);
            want_str(S, x, m, line);
            int ok =
                x.u.s.n <= o.u.s.n && !memcmp(m[0] == 's' ? o.u.s.s : o.u.s.s + o.u.s.n - x.u.s.n, x.u.s.s, x.u.s.n);
            r = vbool(ok);
        } else if (!strcmp(m, "split")) {
            val sep = arg(e, av, 0, "sep", &used);
            r = vlist_new(S, 4);
            if (sep.t == V_STR && sep.u.s.n) {
                size_t a = 0;
                for (size_t i = 0; i + sep.u.s.n <= o.u.s.n;) {
                    if (!memcmp(o.u.s.s + i, sep.u.s.s, sep.u.s.n)) {
                        list_push(S, r.u.l, vstr(S, o.u.s.s + a, i - a));
                        i += sep.u.s.n;
                        a = i;
                    } else
                        i++;
                }
                list_push(S, r.u.l, vstr(S, o.u.s.s + a, o.u.s.n - a));
            } else if (sep.t == V_UNDEF || sep.t == V_NONE) {
                size_t i = 0;
                while (i < o.u.s.n) {
                    while (i < o.u.s.n && is_ws(o.u.s.s[i]))
                        i++;
                    size_t a = i;
                    while (i < o.u.s.n && !is_ws(o.u.s.s[i]))
                        i++;
                    if (i > a)
                        list_push(S, r.u.l, vstr(S, o.u.s.s + a, i - a));
                }
            } else
                fail_(S, TK_ERR_INVALID, "chat template line %d: split wants a non-empty string separator", line);
        } else if (!strcmp(m, "replace")) {
            val a = arg(e, av, 0, NULL, &used), b = arg(e, av, 1, NULL, &used);
            want_str(S, a, "replace", line);
            want_str(S, b, "replace", line);
            sbuf sb = {S, NULL, 0, 0};
            for (size_t i = 0; i < o.u.s.n;) {
                if (a.u.s.n && i + a.u.s.n <= o.u.s.n && !memcmp(o.u.s.s + i, a.u.s.s, a.u.s.n)) {
                    sb_add(&sb, b.u.s.s, b.u.s.n);
                    i += a.u.s.n;
                } else
                    sb_add(&sb, o.u.s.s + i++, 1);
            }
            r = vstr(S, sb.s ? sb.s : "", sb.n);
        }
    } else if (o.t == V_DICT || o.t == V_NS) {
        if (!strcmp(m, "get")) {
            val k = arg(e, av, 0, NULL, &used), d = arg(e, av, 1, NULL, &used);
            r = getitem(S, o, k, line);
            if (r.t == V_UNDEF)
                r = d.t == V_UNDEF ? vnone() : d;
        } else if (!strcmp(m, "items") || !strcmp(m, "keys") || !strcmp(m, "values")) {
            r = vlist_new(S, o.u.d->n + 1);
            for (size_t i = 0; i < o.u.d->n; i++) {
                if (m[0] == 'i') {
                    val pr = vlist_new(S, 2);
                    list_push(S, pr.u.l, o.u.d->k[i]);
                    list_push(S, pr.u.l, o.u.d->v[i]);
                    list_push(S, r.u.l, pr);
                } else
                    list_push(S, r.u.l, m[0] == 'k' ? o.u.d->k[i] : o.u.d->v[i]);
            }
        }
    }
    if (r.t == V_UNDEF)
        fail_(S, TK_ERR_UNSUPPORTED,
              "chat template line %d: the method '%s' of a %s is not supported by tk's template subset", line, m,
              tname(o));
    if (used < e->nargs)
        fail_(S, TK_ERR_INVALID, "chat template line %d: too many arguments to '%s'", line, m);
    return r;
}

static val call(st *S, scope *sc, expr *e)
{
    int line = e->line;
    val *av = eval_args(S, sc, e);
    if (e->a->t == E_ATTR) {
        val o = eval(S, sc, e->a->a);
        if (o.t == V_UNDEF)
            fail_(S, TK_ERR_INVALID, "chat template line %d: calling '%s' on an undefined value", line, e->a->name);
        return call_method(S, o, e->a->name, e, av, line);
    }
    if (e->a->t != E_NAME)
        fail_(S, TK_ERR_UNSUPPORTED, "chat template line %d: only named functions and methods can be called", line);
    const char *f = e->a->name;
    size_t used = 0;
    if (!strcmp(f, "raise_exception")) {
        val m = stringify(S, arg(e, av, 0, NULL, &used));
        fail_(S, TK_ERR_INVALID, "chat template line %d: the template raised an exception: %.*s", line,
              (int)(m.u.s.n > 400 ? 400 : m.u.s.n), m.u.s.s);
    }
    if (!strcmp(f, "namespace") || !strcmp(f, "dict")) {
        val d = vdict_new(S, f[0] == 'n' ? V_NS : V_DICT);
        for (size_t k = 0; k < e->nargs; k++) {
            if (!e->kw[k])
                fail_(S, TK_ERR_UNSUPPORTED,
                      "chat template line %d: %s() takes keyword arguments only in tk's "
                      "template subset",
                      line, f);
            dict_sets(S, d.u.d, e->kw[k], av[k]);
        }
        return d;
    }
    if (!strcmp(f, "range")) {
        val a = arg(e, av, 0, NULL, &used), b = arg(e, av, 1, NULL, &used), c = arg(e, av, 2, NULL, &used);
        int64_t lo = 0, hi, st_ = 1;
        if (b.t == V_UNDEF)
            hi = want_int(S, a, "range()'s argument", line);
        else {
            lo = want_int(S, a, "range()'s start", line);
            hi = want_int(S, b, "range()'s stop", line);
            if (c.t != V_UNDEF)
                st_ = want_int(S, c, "range()'s step", line);
        }
        if (st_ == 0)
            fail_(S, TK_ERR_INVALID, "chat template line %d: range() step cannot be zero", line);
        val r = vlist_new(S, 8);
        for (int64_t i = lo; st_ > 0 ? i < hi : i > hi; i += st_) {
            if (++S->steps > TK_CHAT_MAX_STEPS)
                fail_(S, TK_ERR_INVALID, "chat template line %d: range() passes %d items", line, TK_CHAT_MAX_STEPS);
            list_push(S, r.u.l, vint(i));
        }
        return r;
    }
    val fv = lookup(sc, f);
    fail_(S, fv.t == V_UNDEF ? TK_ERR_UNSUPPORTED : TK_ERR_INVALID,
          fv.t == V_UNDEF ? "chat template line %d: the function '%s' is not supported by tk's template subset "
                            "(supported: raise_exception, namespace, dict, range)"
                          : "chat template line %d: '%s' is not callable",
          line, f);
    return vundef();
}

static val filter(st *S, scope *sc, expr *e)
{
    int line = e->line;
    val x = eval(S, sc, e->a);
    val *av = eval_args(S, sc, e);
    const char *f = e->name;
    size_t used = 0;
    val r;
    if (!strcmp(f, "default") || !strcmp(f, "d")) {
        val dv = arg(e, av, 0, "default_value", &used), b = arg(e, av, 1, "boolean", &used);
        r = x.t == V_UNDEF || (truthy(b) && !truthy(x)) ? (dv.t == V_UNDEF ? vstr(S, "", 0) : dv) : x;
    } else if (!strcmp(f, "length") || !strcmp(f, "count")) {
        if (x.t == V_STR)
            r = vint((int64_t)x.u.s.n); /* bytes; Jinja counts code points */
        else if (x.t == V_LIST)
            r = vint((int64_t)x.u.l->n);
        else if (x.t == V_DICT || x.t == V_NS)
            r = vint((int64_t)x.u.d->n);
        else if (x.t == V_UNDEF)
            r = vint(0);
        else
            fail_(S, TK_ERR_INVALID, "chat template line %d: length of a %s", line, tname(x));
        if (x.t == V_STR) { /* count UTF-8 code points as Python does */
            int64_t n = 0;
            for (size_t i = 0; i < x.u.s.n; i++)
                n += ((unsigned char)x.u.s.s[i] & 0xC0) != 0x80;
            r = vint(n);
        }
    } else if (!strcmp(f, "trim")) {
        r = strip_str(S, stringify(S, x), 1, 1, arg(e, av, 0, "chars", &used));
    } else if (!strcmp(f, "upper") || !strcmp(f, "lower") || !strcmp(f, "capitalize") || !strcmp(f, "title")) {
        r = case_str(S, stringify(S, x), f[0] == 'l' ? 0 : f[0] == 'u' ? 1 : f[0] == 'c' ? 2 : 3);
    } else if (!strcmp(f, "tojson")) {
        val ind = arg(e, av, 0, "indent", &used);
        sbuf b = {S, NULL, 0, 0};
        int indent = ind.t == V_UNDEF || ind.t == V_NONE ? -1 : (int)want_int(S, ind, "tojson's indent", line);
        if (indent > 64)
            fail_(S, TK_ERR_INVALID, "chat template line %d: tojson indent %d is too large", line, indent);
        to_json(S, &b, x, indent < 0 ? -1 : indent, 0, line);
        r = vstr(S, b.s, b.n);
    } else if (!strcmp(f, "string")) {
        r = stringify(S, x);
    } else if (!strcmp(f, "int")) {
        if (x.t == V_INT)
            r = x;
        else if (x.t == V_FLOAT)
            r = vint((int64_t)x.u.f);
        else if (x.t == V_BOOL)
            r = vint(x.u.b);
        else if (x.t == V_STR) {
            char *s = astrn(S, x.u.s.s, x.u.s.n), *end;
            long long v = strtoll(s, &end, 10);
            r = vint(end != s && !*end ? v : 0);
        } else
            r = vint(0);
    } else if (!strcmp(f, "first") || !strcmp(f, "last")) {
        if (x.t == V_LIST)
            r = x.u.l->n ? x.u.l->v[f[0] == 'f' ? 0 : x.u.l->n - 1] : vundef();
        else if (x.t == V_STR)
            r = x.u.s.n ? vstr(S, x.u.s.s + (f[0] == 'f' ? 0 : x.u.s.n - 1), 1) : vundef();
        else
            fail_(S, TK_ERR_INVALID, "chat template line %d: '%s' of a %s", line, f, tname(x));
    } else if (!strcmp(f, "join")) {
        r = join_list(S, x, arg(e, av, 0, "d", &used), line);
    } else if (!strcmp(f, "list")) {
        if (x.t == V_LIST)
            r = x;
        else if (x.t == V_STR) {
            r = vlist_new(S, x.u.s.n + 1);
            for (size_t i = 0; i < x.u.s.n; i++)
                list_push(S, r.u.l, vstr(S, x.u.s.s + i, 1));
        } else if (x.t == V_DICT) {
            r = vlist_new(S, x.u.d->n + 1);
            for (size_t i = 0; i < x.u.d->n; i++)
                list_push(S, r.u.l, x.u.d->k[i]);
        } else
            fail_(S, TK_ERR_INVALID, "chat template line %d: list of a %s", line, tname(x));
    } else if (!strcmp(f, "items")) {
        if (x.t != V_DICT)
            fail_(S, TK_ERR_INVALID, "chat template line %d: items of a %s", line, tname(x));
        expr fake = {0};
        r = call_method(S, x, "items", &fake, NULL, line);
    } else if (!strcmp(f, "reverse")) {
        r = do_slice(S, x, vundef(), vundef(), vint(-1), line);
    } else if (!strcmp(f, "replace")) {
        val s = stringify(S, x);
        r = call_method(S, s, "replace", e, av, line);
        used = e->nargs;
    } else {
        fail_(S, TK_ERR_UNSUPPORTED,
              "chat template line %d: the filter '%s' is not supported by tk's template subset (supported: default, "
              "length, count, trim, upper, lower, capitalize, title, tojson, string, int, first, last, join, list, "
              "items, reverse, replace)",
              line, f);
        return vundef();
    }
    if (used < e->nargs)
        fail_(S, TK_ERR_INVALID, "chat template line %d: too many arguments to the filter '%s'", line, f);
    return r;
}

static int test(st *S, scope *sc, expr *e)
{
    int line = e->line;
    val x = eval(S, sc, e->a);
    val *av = eval_args(S, sc, e);
    const char *t = e->name;
    size_t used = 0;
    int r;
    if (!strcmp(t, "defined"))
        r = x.t != V_UNDEF;
    else if (!strcmp(t, "undefined"))
        r = x.t == V_UNDEF;
    else if (!strcmp(t, "none"))
        r = x.t == V_NONE;
    else if (!strcmp(t, "string"))
        r = x.t == V_STR;
    else if (!strcmp(t, "number"))
        r = x.t == V_INT || x.t == V_FLOAT;
    else if (!strcmp(t, "integer"))
        r = x.t == V_INT;
    else if (!strcmp(t, "float"))
        r = x.t == V_FLOAT;
    else if (!strcmp(t, "boolean"))
        r = x.t == V_BOOL;
    else if (!strcmp(t, "true") || !strcmp(t, "false"))
        r = x.t == V_BOOL && x.u.b == (t[0] == 't');
    else if (!strcmp(t, "mapping"))
        r = x.t == V_DICT || x.t == V_NS;
    else if (!strcmp(t, "sequence"))
        r = x.t == V_LIST || x.t == V_STR || x.t == V_DICT;
    else if (!strcmp(t, "iterable"))
        r = x.t == V_LIST || x.t == V_STR || x.t == V_DICT || x.t == V_NS;
    else if (!strcmp(t, "odd") || !strcmp(t, "even"))
        r = (want_int(S, x, t, line) & 1) == (t[0] == 'o');
    else if (!strcmp(t, "eq") || !strcmp(t, "equalto") || !strcmp(t, "==") || !strcmp(t, "sameas"))
        r = vequal(x, arg(e, av, 0, NULL, &used));
    else if (!strcmp(t, "ne"))
        r = !vequal(x, arg(e, av, 0, NULL, &used));
    else {
        fail_(S, TK_ERR_UNSUPPORTED,
              "chat template line %d: the test '%s' is not supported by tk's template subset (supported: defined, "
              "undefined, none, string, number, integer, float, boolean, true, false, mapping, sequence, iterable, "
              "odd, even, eq, ne, sameas)",
              line, t);
        return 0;
    }
    if (used < e->nargs)
        fail_(S, TK_ERR_INVALID, "chat template line %d: too many arguments to the test '%s'", line, t);
    return e->neg ? !r : r;
}

static val binop(st *S, const char *op, val a, val b, int line, int neg)
{
    if (!strcmp(op, "~")) {
        sbuf sb = {S, NULL, 0, 0};
        to_str(&sb, a, 0);
        to_str(&sb, b, 0);
        return vstr(S, sb.s ? sb.s : "", sb.n);
    }
    if (!strcmp(op, "==") || !strcmp(op, "!="))
        return vbool(vequal(a, b) == (op[0] == '='));
    if (!strcmp(op, "in")) {
        int r = 0;
        if (b.t == V_STR) {
            if (a.t != V_STR)
                fail_(S, TK_ERR_INVALID, "chat template line %d: 'in <string>' wants a string on the left, not %s",
                      line, tname(a));
            for (size_t i = 0; !r && i + a.u.s.n <= b.u.s.n; i++)
                r = !memcmp(b.u.s.s + i, a.u.s.s, a.u.s.n);
        } else if (b.t == V_LIST) {
            for (size_t i = 0; !r && i < b.u.l->n; i++)
                r = vequal(a, b.u.l->v[i]);
        } else if (b.t == V_DICT || b.t == V_NS) {
            r = a.t == V_STR && dict_find(b.u.d, a.u.s.s, a.u.s.n);
        } else {
            fail_(S, TK_ERR_INVALID, "chat template line %d: 'in' a %s (wants a string, list or dict)", line, tname(b));
        }
        return vbool(neg ? !r : r);
    }
    int na = a.t == V_INT || a.t == V_FLOAT || a.t == V_BOOL, nb = b.t == V_INT || b.t == V_FLOAT || b.t == V_BOOL;
    if (op[0] == '<' || op[0] == '>') {
        int c;
        if (na && nb) {
            double x = a.t == V_INT ? (double)a.u.i : a.t == V_FLOAT ? a.u.f : a.u.b;
            double y = b.t == V_INT ? (double)b.u.i : b.t == V_FLOAT ? b.u.f : b.u.b;
            c = x < y ? -1 : x > y;
        } else if (a.t == V_STR && b.t == V_STR) {
            size_t m = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
            c = memcmp(a.u.s.s, b.u.s.s, m);
            if (!c)
                c = a.u.s.n < b.u.s.n ? -1 : a.u.s.n > b.u.s.n;
        } else {
            fail_(S, TK_ERR_INVALID, "chat template line %d: '%s' between a %s and a %s", line, op, tname(a), tname(b));
            return vundef();
        }
        int r = op[0] == '<' ? (op[1] ? c <= 0 : c < 0) : (op[1] ? c >= 0 : c > 0);
        return vbool(r);
    }
    if (!strcmp(op, "+") && a.t == V_STR && b.t == V_STR) {
        sbuf sb = {S, NULL, 0, 0};
        sb_add(&sb, a.u.s.s, a.u.s.n);
        sb_add(&sb, b.u.s.s, b.u.s.n);
        return vstr(S, sb.s ? sb.s : "", sb.n);
    }
    if (!strcmp(op, "+") && a.t == V_LIST && b.t == V_LIST) {
        val r = vlist_new(S, a.u.l->n + b.u.l->n + 1);
        for (size_t i = 0; i < a.u.l->n; i++)
            list_push(S, r.u.l, a.u.l->v[i]);
        for (size_t i = 0; i < b.u.l->n; i++)
            list_push(S, r.u.l, b.u.l->v[i]);
        return r;
    }
    if (na && nb) {
        if (a.t != V_FLOAT && b.t != V_FLOAT && strcmp(op, "/") && strcmp(op, "**")) {
            int64_t x = a.t == V_INT ? a.u.i : a.u.b, y = b.t == V_INT ? b.u.i : b.u.b;
            if ((op[0] == '%' || !strcmp(op, "//")) && y == 0)
                fail_(S, TK_ERR_INVALID, "chat template line %d: division by zero", line);
            uint64_t ux = (uint64_t)x, uy = (uint64_t)y;
            switch (op[0]) {
            case '+': return vint((int64_t)(ux + uy));
            case '-': return vint((int64_t)(ux - uy));
            case '*': return vint((int64_t)(ux * uy));
            case '%': {
                if (y == -1)
                    return vint(0);
                int64_t m = x % y;
                return vint(m && ((m < 0) != (y < 0)) ? m + y : m);
            }
            case '/': {
                if (y == -1)
                    return vint((int64_t)(0 - ux));
                int64_t q = x / y;
                return vint((x % y) && ((x < 0) != (y < 0)) ? q - 1 : q);
            }
            }
        }
        fail_(S, TK_ERR_UNSUPPORTED,
              "chat template line %d: float arithmetic ('%s') is not supported by tk's "
              "template subset",
              line, op);
    }
    fail_(S, TK_ERR_INVALID, "chat template line %d: '%s' between a %s and a %s", line, op, tname(a), tname(b));
    return vundef();
}

static val eval(st *S, scope *sc, expr *e)
{
    val r = vundef();
    enter(S, e->line);
    switch (e->t) {
    case E_LIT: r = e->lit; break;
    case E_NAME: r = lookup(sc, e->name); break;
    case E_ATTR: {
        val o = eval(S, sc, e->a);
        if (o.t == V_UNDEF)
            fail_(S, TK_ERR_INVALID, "chat template line %d: '.%s' of an undefined value", e->line, e->name);
        r = o.t == V_DICT || o.t == V_NS ? getitem(S, o, vstr(S, e->name, strlen(e->name)), e->line) : vundef();
        break;
    }
    case E_INDEX: r = getitem(S, eval(S, sc, e->a), eval(S, sc, e->b), e->line); break;
    case E_SLICE: {
        val o = eval(S, sc, e->a);
        val a = e->b ? eval(S, sc, e->b) : vundef(), b = e->c ? eval(S, sc, e->c) : vundef();
        val c = e->args[0] ? eval(S, sc, e->args[0]) : vundef();
        r = do_slice(S, o, a, b, c, e->line);
        break;
    }
    case E_CALL: r = call(S, sc, e); break;
    case E_FILTER: r = filter(S, sc, e); break;
    case E_TEST: r = vbool(test(S, sc, e)); break;
    case E_BIN: {
        val a = eval(S, sc, e->a), b = eval(S, sc, e->b);
        r = binop(S, e->name, a, b, e->line, e->neg);
        break;
    }
    case E_NEG: {
        val a = eval(S, sc, e->a);
        if (a.t == V_INT)
            r = vint((int64_t)(0 - (uint64_t)a.u.i));
        else if (a.t == V_FLOAT) {
            r = a;
            r.u.f = -a.u.f;
        } else
            fail_(S, TK_ERR_INVALID, "chat template line %d: negating a %s", e->line, tname(a));
        break;
    }
    case E_NOT: r = vbool(!truthy(eval(S, sc, e->a))); break;
    case E_AND: {
        val a = eval(S, sc, e->a);
        r = truthy(a) ? eval(S, sc, e->b) : a;
        break;
    }
    case E_OR: {
        val a = eval(S, sc, e->a);
        r = truthy(a) ? a : eval(S, sc, e->b);
        break;
    }
    case E_COND:
        if (truthy(eval(S, sc, e->b)))
            r = eval(S, sc, e->a);
        else
            r = e->c ? eval(S, sc, e->c) : vundef();
        break;
    case E_LIST:
        r = vlist_new(S, e->nargs + 1);
        for (size_t i = 0; i < e->nargs; i++)
            list_push(S, r.u.l, eval(S, sc, e->args[2 * i]));
        break;
    case E_DICT:
        r = vdict_new(S, V_DICT);
        for (size_t i = 0; i < e->nargs; i++) {
            val k = eval(S, sc, e->args[2 * i]);
            if (k.t != V_STR)
                fail_(S, TK_ERR_UNSUPPORTED,
                      "chat template line %d: dict keys other than strings are not "
                      "supported by tk's template subset",
                      e->line);
            dict_set(S, r.u.d, k, eval(S, sc, e->args[2 * i + 1]));
        }
        break;
    }
    S->depth--;
    return r;
}

static void emit(st *S, const char *s, size_t n, int line)
{
    if (S->on + n > TK_CHAT_MAX_OUTPUT)
        fail_(S, TK_ERR_INVALID, "chat template line %d: the output passes %zu MiB", line, TK_CHAT_MAX_OUTPUT >> 20);
    if (S->on + n + 1 > S->ocap) {
        size_t cap = S->ocap ? S->ocap : 1024;
        while (cap < S->on + n + 1)
            cap *= 2;
        char *o = realloc(S->out, cap);
        if (!o)
            fail_(S, TK_ERR_NOMEM, "out of memory");
        S->out = o;
        S->ocap = cap;
    }
    memcpy(S->out + S->on, s, n);
    S->on += n;
    S->out[S->on] = 0;
}

enum { F_NONE, F_BREAK, F_CONTINUE };

static int exec_body(st *S, scope *sc, body *b);

static int exec_stmt(st *S, scope *sc, stmt *s)
{
    if (++S->steps > TK_CHAT_MAX_STEPS)
        fail_(S, TK_ERR_INVALID, "chat template line %d: the rendering passes %d steps", s->line, TK_CHAT_MAX_STEPS);
    switch (s->t) {
    case S_TEXT: emit(S, s->text, s->n, s->line); break;
    case S_OUT: {
        val v = eval(S, sc, s->e);
        if (v.t == V_STR)
            emit(S, v.u.s.s, v.u.s.n, s->line);
        else {
            sbuf b = {S, NULL, 0, 0};
            to_str(&b, v, 0);
            if (b.n)
                emit(S, b.s, b.n, s->line);
        }
        break;
    }
    case S_IF:
        for (size_t i = 0; i < s->ncond; i++)
            if (truthy(eval(S, sc, s->conds[i])))
                return exec_body(S, sc, &s->bodies[i]);
        if (s->has_else)
            return exec_body(S, sc, &s->bodies[s->ncond]);
        break;
    case S_SET: {
        val v = eval(S, sc, s->e);
        if (s->nnames == 2) {
            val ns = lookup(sc, s->names[0]);
            if (ns.t != V_NS)
                fail_(S, TK_ERR_INVALID, "chat template line %d: 'set %s.%s': %s is not a namespace()", s->line,
                      s->names[0], s->names[1], s->names[0]);
            dict_sets(S, ns.u.d, s->names[1], v);
        } else {
            dict_sets(S, sc->names.u.d, s->names[0], v);
        }
        break;
    }
    case S_BREAK: return F_BREAK;
    case S_CONTINUE: return F_CONTINUE;
    case S_BLOCK: return exec_body(S, sc, &s->bodies[0]);
    case S_FOR: {
        val it = eval(S, sc, s->e);
        val items;
        if (it.t == V_LIST)
            items = it;
        else if (it.t == V_DICT) {
            items = vlist_new(S, it.u.d->n + 1);
            for (size_t i = 0; i < it.u.d->n; i++)
                list_push(S, items.u.l, it.u.d->k[i]);
        } else if (it.t == V_STR) {
            items = vlist_new(S, it.u.s.n + 1);
            for (size_t i = 0; i < it.u.s.n; i++)
                list_push(S, items.u.l, vstr(S, it.u.s.s + i, 1));
        } else if (it.t == V_UNDEF || it.t == V_NONE) {
            if (it.t == V_NONE)
                fail_(S, TK_ERR_INVALID, "chat template line %d: iterating over none", s->line);
            items = vlist_new(S, 1);
        } else {
            fail_(S, TK_ERR_INVALID, "chat template line %d: iterating over a %s", s->line, tname(it));
            return F_NONE;
        }
        scope inner = {sc, vdict_new(S, V_DICT)};
        /* the loop filter selects the items first, as Jinja does (loop.length counts the kept ones) */
        vlist *l = items.u.l;
        if (s->filter) {
            val kept = vlist_new(S, l->n + 1);
            for (size_t i = 0; i < l->n; i++) {
                if (++S->steps > TK_CHAT_MAX_STEPS)
                    fail_(S, TK_ERR_INVALID, "chat template line %d: the rendering passes %d steps", s->line,
                          TK_CHAT_MAX_STEPS);
                if (s->nnames == 1)
                    dict_sets(S, inner.names.u.d, s->names[0], l->v[i]);
                else {
                    dict_sets(S, inner.names.u.d, s->names[0], getitem(S, l->v[i], vint(0), s->line));
                    dict_sets(S, inner.names.u.d, s->names[1], getitem(S, l->v[i], vint(1), s->line));
                }
                if (truthy(eval(S, &inner, s->filter)))
                    list_push(S, kept.u.l, l->v[i]);
            }
            l = kept.u.l;
        }
        for (size_t i = 0; i < l->n; i++) {
            if (++S->steps > TK_CHAT_MAX_STEPS)
                fail_(S, TK_ERR_INVALID, "chat template line %d: the rendering passes %d steps", s->line,
                      TK_CHAT_MAX_STEPS);
            inner.names = vdict_cap(S, V_DICT, 3);
            val loop = vdict_cap(S, V_DICT, 9);
            int64_t n = (int64_t)l->n, k = (int64_t)i;
            dict_sets(S, loop.u.d, "index0", vint(k));
            dict_sets(S, loop.u.d, "index", vint(k + 1));
            dict_sets(S, loop.u.d, "revindex0", vint(n - k - 1));
            dict_sets(S, loop.u.d, "revindex", vint(n - k));
            dict_sets(S, loop.u.d, "first", vbool(k == 0));
            dict_sets(S, loop.u.d, "last", vbool(k == n - 1));
            dict_sets(S, loop.u.d, "length", vint(n));
            dict_sets(S, loop.u.d, "previtem", i ? l->v[i - 1] : vundef());
            dict_sets(S, loop.u.d, "nextitem", i + 1 < l->n ? l->v[i + 1] : vundef());
            dict_sets(S, inner.names.u.d, "loop", loop);
            if (s->nnames == 1)
                dict_sets(S, inner.names.u.d, s->names[0], l->v[i]);
            else {
                val pr = l->v[i];
                if (pr.t != V_LIST || pr.u.l->n != 2)
                    fail_(S, TK_ERR_INVALID, "chat template line %d: 'for %s, %s in ...' wants pairs, got a %s",
                          s->line, s->names[0], s->names[1], tname(pr));
                dict_sets(S, inner.names.u.d, s->names[0], pr.u.l->v[0]);
                dict_sets(S, inner.names.u.d, s->names[1], pr.u.l->v[1]);
            }
            int f = exec_body(S, &inner, &s->bodies[0]);
            if (f == F_BREAK)
                break;
        }
        if (!l->n && s->has_else)
            exec_body(S, sc, &s->bodies[1]);
        break;
    }
    }
    return F_NONE;
}

static int exec_body(st *S, scope *sc, body *b)
{
    enter(S, b->n ? b->v[0]->line : 0);
    int f = F_NONE;
    for (size_t i = 0; i < b->n && f == F_NONE; i++)
        f = exec_stmt(S, sc, b->v[i]);
    S->depth--;
    return f;
}

/* ---------------------------------------------------------------------------------------------- */
/* entry points */

static void free_arena(st *S)
{
    while (S->arena) {
        blk *n = S->arena->next;
        free(S->arena);
        S->arena = n;
    }
}

int tk_models__chat_render_text(char **out, const char *tmpl, size_t len, const tk_chat_message *msgs, size_t n,
                                int add_generation_prompt, const tk_chat_var *vars, size_t nvars)
{
    if (out)
        *out = NULL;
    if (!out || (!tmpl && len) || (!msgs && n))
        return tk__err(TK_ERR_INVALID, "chat template: NULL argument");
    if (len > TK_CHAT_MAX_TEMPLATE)
        return tk__err(TK_ERR_INVALID, "chat template: %zu bytes, more than the %zu tk renders", len,
                       TK_CHAT_MAX_TEMPLATE);
    st *S = calloc(1, sizeof *S);
    if (!S)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    if (setjmp(S->jb)) {
        int code = S->code;
        tk__err(code, "%s%s", S->msg,
                code == TK_ERR_UNSUPPORTED ? "\nHINT: tk renders a Jinja2 subset (docs/generation.md, \"Chat\"); "
                                             "use tk generate --prompt with the text the template would produce"
                                           : "");
        free(S->out);
        free_arena(S);
        free(S);
        return code;
    }
    /* Jinja's lexer: newlines normalised to \n, one trailing newline dropped */
    char *src = amem(S, len + 1);
    size_t m = 0;
    for (size_t i = 0; i < len; i++) {
        if (tmpl[i] == '\r') {
            src[m++] = '\n';
            if (i + 1 < len && tmpl[i + 1] == '\n')
                i++;
        } else
            src[m++] = tmpl[i];
    }
    if (m && src[m - 1] == '\n')
        m--;
    toks T = {S, NULL, 0, 0};
    lex(S, &T, src, m);
    ps P = {S, &T, 0};
    body top = p_body(&P, NULL);
    scope g = {NULL, vdict_new(S, V_DICT)};
    val ml = vlist_new(S, n + 1);
    for (size_t i = 0; i < n; i++) {
        val d = vdict_new(S, V_DICT);
        if (!msgs[i].role || !msgs[i].content)
            fail_(S, TK_ERR_INVALID, "chat message %zu has no %s", i, msgs[i].role ? "content" : "role");
        dict_sets(S, d.u.d, "role", vstr(S, msgs[i].role, strlen(msgs[i].role)));
        dict_sets(S, d.u.d, "content", vstr(S, msgs[i].content, strlen(msgs[i].content)));
        list_push(S, ml.u.l, d);
    }
    dict_sets(S, g.names.u.d, "messages", ml);
    dict_sets(S, g.names.u.d, "add_generation_prompt", vbool(add_generation_prompt));
    for (size_t i = 0; i < nvars; i++)
        if (vars[i].name && vars[i].value)
            dict_sets(S, g.names.u.d, vars[i].name, vstr(S, vars[i].value, strlen(vars[i].value)));
    S->depth = 0;
    exec_body(S, &g, &top);
    *out = malloc(S->on + 1);
    if (!*out) {
        free(S->out);
        free_arena(S);
        free(S);
        return tk__err(TK_ERR_NOMEM, "out of memory");
    }
    if (S->on)
        memcpy(*out, S->out, S->on);
    (*out)[S->on] = 0;
    free(S->out);
    free_arena(S);
    free(S);
    return TK_OK;
}

/* ---- a checkpoint's templates ------------------------------------------------------------------ */

/* The chat templates of a checkpoint directory, in transformers' order of precedence
 * (PreTrainedTokenizerBase._from_pretrained): chat_template.jinja ("default") and
 * additional_chat_templates/NAME.jinja, which replace whatever tokenizer_config.json says; else
 * tokenizer_config.json's chat_template (a string, or a list of {name, template}); else a processor's
 * chat_template.json ({"chat_template": ...}, which ProcessorMixin reads). The template variables are
 * the special tokens: every "*_token" of tokenizer_config.json (bos_token, eos_token, ..., and
 * model-specific ones like image_token) as a string or an AddedToken's content, overridden by
 * special_tokens_map.json's when tokenizer_config.json has no added_tokens_decoder (transformers'
 * legacy path) or is absent. */
typedef struct {
    char **name, **text; /* ntpl entries; name "default" for an unnamed one */
    size_t ntpl;
    tk_chat_var *vars;
    size_t nvars;
    char *source;        /* what the templates came from, for messages */
    json_t *cfg, *stm;   /* tokenizer_config.json, special_tokens_map.json (the vars point into them) */
} ct_set;

static void ct_free(ct_set *c)
{
    for (size_t i = 0; i < c->ntpl; i++) {
        free(c->name[i]);
        free(c->text[i]);
    }
    free(c->name);
    free(c->text);
    free(c->vars);
    free(c->source);
    json_decref(c->cfg);
    json_decref(c->stm);
    memset(c, 0, sizeof *c);
}

static int ct_add(ct_set *c, const char *name, size_t nlen, const char *text, size_t tlen)
{
    char **nn = realloc(c->name, (c->ntpl + 1) * sizeof *nn);
    if (nn)
        c->name = nn;
    char **nt = realloc(c->text, (c->ntpl + 1) * sizeof *nt);
    if (nt)
        c->text = nt;
    if (!nn || !nt)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    c->name[c->ntpl] = tk__strndup(name, nlen);
    c->text[c->ntpl] = tk__strndup(text, tlen);
    if (!c->name[c->ntpl] || !c->text[c->ntpl]) {
        free(c->name[c->ntpl]);
        free(c->text[c->ntpl]);
        return tk__err(TK_ERR_NOMEM, "out of memory");
    }
    c->ntpl++;
    return TK_OK;
}

/* A JSON file of the checkpoint: *out NULL when it does not exist. */
static int ct_json(json_t **out, const char *dir, const char *file)
{
    *out = NULL;
    char *p = tk__path_join(dir, file), *text = NULL;
    size_t len = 0;
    if (!p)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    int rc = tk__read_file(&text, &len, p, (size_t)64 << 20);
    if (rc == TK_ERR_NOT_FOUND) {
        tk__err_clear();
        rc = TK_OK;
    } else if (rc == TK_OK) {
        json_error_t jerr;
        *out = tk_models__json_loadb(text, len, 0, &jerr);
        if (!json_is_object(*out)) {
            rc = tk__err(TK_ERR_INVALID, "%s: %s", p, *out ? "not a JSON object" : jerr.text);
            json_decref(*out);
            *out = NULL;
        }
    }
    free(text);
    free(p);
    return rc;
}

/* chat_template as tokenizer_config.json and chat_template.json hold it: a string, or a list of
 * {name, template}. 0: absent (null or missing). */
static int ct_from_json(ct_set *c, json_t *ct, const char *what, int *found)
{
    *found = 0;
    if (!ct || json_is_null(ct))
        return TK_OK;
    *found = 1;
    if (json_is_string(ct))
        return ct_add(c, "default", 7, json_string_value(ct), json_string_length(ct));
    if (!json_is_array(ct))
        return tk__err(TK_ERR_INVALID, "%s: chat_template is a %s, not a string or a list of {name, template}", what,
                       json_is_object(ct) ? "object" : "number or boolean");
    size_t i;
    json_t *el;
    json_array_foreach(ct, i, el) {
        json_t *nm = json_object_get(el, "name"), *t = json_object_get(el, "template");
        if (!json_is_string(nm) || !json_is_string(t))
            return tk__err(TK_ERR_INVALID, "%s: chat_template[%zu] is not a {\"name\": ..., \"template\": ...} object",
                           what, i);
        int rc = ct_add(c, json_string_value(nm), json_string_length(nm), json_string_value(t), json_string_length(t));
        if (rc != TK_OK)
            return rc;
    }
    return TK_OK;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* chat_template.jinja and additional_chat_templates/ *.jinja (sorted by name). */
static int ct_from_files(ct_set *c, const char *dir)
{
    char *p = tk__path_join(dir, "chat_template.jinja"), *text = NULL, *adir = NULL, **names = NULL;
    size_t len = 0, nn = 0;
    DIR *d = NULL;
    int rc = p ? tk__read_file(&text, &len, p, TK_CHAT_MAX_TEMPLATE) : tk__err(TK_ERR_NOMEM, "out of memory");
    if (rc == TK_OK)
        rc = ct_add(c, "default", 7, text, len);
    else if (rc == TK_ERR_NOT_FOUND)
        rc = TK_OK, tk__err_clear();
    free(text);
    text = NULL;
    if (rc == TK_OK && !(adir = tk__path_join(dir, "additional_chat_templates")))
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
    if (rc == TK_OK && tk__is_dir(adir) && !(d = opendir(adir)))
        rc = tk__err_sys("cannot read", adir);
    for (struct dirent *e; rc == TK_OK && d && (e = readdir(d));) {
        size_t l = strlen(e->d_name);
        if (l <= 6 || strcmp(e->d_name + l - 6, ".jinja") || e->d_name[0] == '.')
            continue;
        char **nv = realloc(names, (nn + 1) * sizeof *names);
        if (!nv || !(nv[nn] = tk__strndup(e->d_name, l - 6))) {
            if (nv)
                names = nv;
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
            break;
        }
        names = nv;
        nn++;
    }
    if (d)
        closedir(d);
    if (nn)
        qsort(names, nn, sizeof *names, cmp_str);
    for (size_t i = 0; i < nn && rc == TK_OK; i++) {
        char *f = tk__fmt("%s/%s.jinja", adir, names[i]);
        if (!f)
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
        else if ((rc = tk__read_file(&text, &len, f, TK_CHAT_MAX_TEMPLATE)) == TK_OK)
            rc = ct_add(c, names[i], strlen(names[i]), text, len);
        free(text);
        text = NULL;
        free(f);
    }
    for (size_t i = 0; i < nn; i++)
        free(names[i]);
    free(names);
    free(adir);
    free(p);
    return rc;
}

/* The special tokens of one file: "*_token" keys with a string or {"content": ...}, and
 * extra_special_tokens given as an object of them. Later files override earlier names. */
static int ct_vars_from(ct_set *c, json_t *o)
{
    const char *k;
    json_t *v;
    json_t *extra = json_object_get(o, "extra_special_tokens");
    for (int pass = 0; pass < 2; pass++) {
        json_t *src = pass ? extra : o;
        if (!json_is_object(src))
            continue;
        json_object_foreach(src, k, v) {
            if (!pass && !tk__has_suffix(k, "_token"))
                continue;
            if (json_is_object(v))
                v = json_object_get(v, "content");
            if (!json_is_string(v))
                continue;
            size_t i = 0;
            while (i < c->nvars && strcmp(c->vars[i].name, k))
                i++;
            if (i == c->nvars) {
                tk_chat_var *nv = realloc(c->vars, (c->nvars + 1) * sizeof *nv);
                if (!nv)
                    return tk__err(TK_ERR_NOMEM, "out of memory");
                c->vars = nv;
                c->nvars++;
            }
            c->vars[i] = (tk_chat_var){k, json_string_value(v)};
        }
    }
    return TK_OK;
}

/* Loads the templates of dir (or of the tokenizer_config.json file dir names). */
static int ct_load(ct_set *c, const char *dir)
{
    memset(c, 0, sizeof *c);
    int rc = TK_OK, found = 0;
    char *cfgdir = NULL;
    if (tk__is_dir(dir)) {
        if ((rc = ct_from_files(c, dir)) != TK_OK)
            goto fail;
        if (c->ntpl && !(c->source = tk__fmt("%s/chat_template.jinja and additional_chat_templates/", dir)))
            goto oom;
        if ((rc = ct_json(&c->cfg, dir, "tokenizer_config.json")) != TK_OK ||
            (rc = ct_json(&c->stm, dir, "special_tokens_map.json")) != TK_OK)
            goto fail;
        if (!c->ntpl && c->cfg) {
            if (!(c->source = tk__path_join(dir, "tokenizer_config.json")))
                goto oom;
            if ((rc = ct_from_json(c, json_object_get(c->cfg, "chat_template"), c->source, &found)) != TK_OK)
                goto fail;
        }
        if (!c->ntpl) {
            json_t *pj = NULL;
            if ((rc = ct_json(&pj, dir, "chat_template.json")) != TK_OK)
                goto fail;
            if (pj) {
                free(c->source);
                if (!(c->source = tk__path_join(dir, "chat_template.json"))) {
                    json_decref(pj);
                    goto oom;
                }
                rc = ct_from_json(c, json_object_get(pj, "chat_template"), c->source, &found);
                json_decref(pj);
                if (rc != TK_OK)
                    goto fail;
            }
        }
        if (!c->ntpl) {
            rc = tk__err(TK_ERR_NOT_FOUND,
                         "'%s' has no chat template (no chat_template.jinja, no chat_template in %s, no "
                         "chat_template.json): this tokenizer does not define a chat format\nHINT: use tk generate "
                         "--prompt with the whole prompt written out",
                         dir, c->cfg ? "tokenizer_config.json" : "a tokenizer_config.json");
            goto fail;
        }
    } else {
        /* the file itself: a tokenizer_config.json */
        if (!(cfgdir = tk__dirname(dir)))
            goto oom;
        const char *base = strrchr(dir, '/') ? strrchr(dir, '/') + 1 : dir;
        if ((rc = ct_json(&c->cfg, cfgdir, base)) != TK_OK)
            goto fail;
        if (!c->cfg) {
            rc = tk__err(TK_ERR_NOT_FOUND,
                         "no tokenizer_config.json at '%s', so no chat template\nHINT: use tk "
                         "generate --prompt with the whole prompt written out",
                         dir);
            goto fail;
        }
        if (!(c->source = tk__strdup(dir)))
            goto oom;
        if ((rc = ct_from_json(c, json_object_get(c->cfg, "chat_template"), dir, &found)) != TK_OK)
            goto fail;
        if (!c->ntpl) {
            rc = tk__err(TK_ERR_NOT_FOUND,
                         "%s has no chat_template: this tokenizer does not define a chat "
                         "format\nHINT: use tk generate --prompt with the whole prompt written out",
                         dir);
            goto fail;
        }
    }
    if (c->cfg && (rc = ct_vars_from(c, c->cfg)) != TK_OK)
        goto fail;
    if (c->stm && !(c->cfg && json_object_get(c->cfg, "added_tokens_decoder")) && (rc = ct_vars_from(c, c->stm)))
        goto fail;
    free(cfgdir);
    return TK_OK;
oom:
    rc = tk__err(TK_ERR_NOMEM, "out of memory");
fail:
    free(cfgdir);
    ct_free(c);
    return rc;
}

/* The names as "a, b, c". */
static void ct_names(const ct_set *c, char *buf, size_t cap)
{
    size_t at = 0;
    buf[0] = 0;
    for (size_t i = 0; i < c->ntpl && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%s", i ? ", " : "", c->name[i]);
}

int tk_chat_render_opts(char **out, const char *dir, const tk_chat_message *msgs, size_t n, const tk_chat_opts *opts)
{
    if (out)
        *out = NULL;
    tk_chat_opts def = TK_CHAT_OPTS_INIT;
    if (!opts)
        opts = &def;
    if (!out || !dir || (!msgs && n))
        return tk__err(TK_ERR_INVALID, "tk_chat_render: NULL argument");
    if (opts->version != TK_CHAT_OPTS_VERSION)
        return tk__err(TK_ERR_INVALID, "tk_chat_render_opts: opts->version is %u, want %d (TK_CHAT_OPTS_INIT)",
                       opts->version, TK_CHAT_OPTS_VERSION);
    ct_set c;
    int rc = ct_load(&c, dir);
    if (rc != TK_OK)
        return rc;
    /* transformers' get_chat_template (without tools): the named one, else "default" */
    const char *want = opts->template_name ? opts->template_name : "default";
    size_t k = 0;
    while (k < c.ntpl && strcmp(c.name[k], want))
        k++;
    char names[512];
    ct_names(&c, names, sizeof names);
    if (k == c.ntpl && opts->template_name)
        rc = tk__err(TK_ERR_NOT_FOUND,
                     "no chat template named '%s' in %s (it has: %s)\nHINT: pick one of those "
                     "with --template NAME",
                     want, c.source, names);
    else if (k == c.ntpl)
        rc = tk__err(TK_ERR_INVALID,
                     "%s has several chat templates and none named default: %s\nHINT: pick one with "
                     "--template NAME",
                     c.source, names);
    else
        rc = tk_models__chat_render_text(out, c.text[k], strlen(c.text[k]), msgs, n, opts->add_generation_prompt,
                                         c.vars, c.nvars);
    ct_free(&c);
    return rc;
}

int tk_chat_render(char **out, const char *dir, const tk_chat_message *msgs, size_t n, int add_generation_prompt)
{
    tk_chat_opts o = TK_CHAT_OPTS_INIT;
    o.add_generation_prompt = add_generation_prompt;
    return tk_chat_render_opts(out, dir, msgs, n, &o);
}

int tk_chat_templates_json(char **out, const char *dir)
{
    if (out)
        *out = NULL;
    if (!out || !dir)
        return tk__err(TK_ERR_INVALID, "tk_chat_templates_json: NULL argument");
    ct_set c;
    int rc = ct_load(&c, dir);
    if (rc != TK_OK)
        return rc;
    json_t *names = json_array(), *o = json_object();
    for (size_t i = 0; names && i < c.ntpl; i++)
        json_array_append_new(names, json_string(c.name[i]));
    if (o && names) {
        json_object_set(o, "templates", names);
        json_object_set_new(o, "source", json_string(c.source));
        *out = json_dumps(o, JSON_PRESERVE_ORDER);
    }
    json_decref(names);
    json_decref(o);
    ct_free(&c);
    return *out ? TK_OK : tk__err(TK_ERR_NOMEM, "out of memory");
}
