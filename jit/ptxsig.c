/*
 * ptxsig.c — reads a kernel's parameter list out of the PTX NVRTC produced, so tk can compare it with
 * the manifest before anything launches: cuLaunchKernel takes one pointer per kernel parameter and
 * reads as many as the kernel has, so a manifest that lists fewer parameters than the kernel takes
 * makes the driver read past tk's argument array (a host crash), and one with more, or with a size
 * that differs, hands the kernel garbage.
 *
 * The entry's header, as NVRTC writes it:
 *   .visible .entry _Z6tk_moeIfEvPT_...(
 *           .param .u64 .ptr .align 1 _Z6tk_moeIfEvPT_..._param_0,
 *           .param .align 4 .b8 _Z..._param_1[12],
 *           .param .f32 _Z..._param_2
 *   )
 */
#include <string.h>

#include "jit/jit.h"

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static int is_ident(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '$' ||
           c == '.';
}

/* The bytes of a PTX scalar type (".u64" -> 8), 0 when it is not one. */
static size_t type_bytes(const char *t, size_t n)
{
    if (n < 3 || t[0] != '.' || !strchr("usbf", t[1]))
        return 0;
    if (n == 3 && t[2] == '8')
        return 1;
    if (n == 4 && t[2] == '1' && t[3] == '6')
        return 2;
    if (n == 4 && t[2] == '3' && t[3] == '2')
        return 4;
    if (n == 4 && t[2] == '6' && t[3] == '4')
        return 8;
    return 0;
}

/* One ".param ..." declaration from p up to its ',' or ')' (exclusive end e): its size in bytes. */
static int param_bytes(size_t *out, const char *p, const char *e)
{
    size_t elem = 0, count = 1;
    while (p < e) {
        while (p < e && is_space(*p))
            p++;
        const char *t = p;
        while (p < e && is_ident(*p))
            p++;
        size_t n = (size_t)(p - t);
        if (!n) {
            if (p < e && *p == '[') { /* name[N]: an array of N elements */
                size_t v = 0;
                for (p++; p < e && *p >= '0' && *p <= '9'; p++)
                    v = v * 10 + (size_t)(*p - '0');
                count = v;
                while (p < e && *p != ']')
                    p++;
            }
            if (p < e)
                p++;
            continue;
        }
        if (n == 6 && memcmp(t, ".align", 6) == 0) { /* skip the alignment's number */
            while (p < e && is_space(*p))
                p++;
            while (p < e && *p >= '0' && *p <= '9')
                p++;
            continue;
        }
        size_t b = type_bytes(t, n);
        if (b && !elem)
            elem = b;
    }
    if (!elem)
        return -1;
    *out = elem * count;
    return 0;
}

int tk_jit__ptx_params(const char *ptx, const char *lowered, size_t *sizes, size_t cap, size_t *n)
{
    size_t ln;
    const char *p;
    *n = 0;
    if (!ptx || !lowered || !(ln = strlen(lowered)))
        return TK_ERR_NOT_FOUND;
    /* ".entry NAME(" (NAME ends at the parenthesis or a space) */
    for (p = strstr(ptx, ".entry"); p; p = strstr(p + 6, ".entry")) {
        const char *q = p + 6;
        while (is_space(*q))
            q++;
        if (strncmp(q, lowered, ln) != 0)
            continue;
        q += ln;
        while (is_space(*q))
            q++;
        if (*q == '(') {
            p = q + 1;
            break;
        }
    }
    if (!p)
        return TK_ERR_NOT_FOUND;
    for (;;) {
        while (is_space(*p) || *p == ',')
            p++;
        if (*p == ')')
            return TK_OK;
        if (strncmp(p, ".param", 6) != 0)
            return TK_ERR_INVALID;
        const char *e = p + 6;
        while (*e && *e != ',' && *e != ')')
            e++;
        if (!*e)
            return TK_ERR_INVALID;
        size_t b = 0;
        if (param_bytes(&b, p + 6, e) != 0)
            return TK_ERR_INVALID;
        if (*n < cap)
            sizes[*n] = b;
        (*n)++;
        p = e;
    }
}
