/*
 * route.c — which kernels a call may use, given their recorded self-tests (ops/selftest.h).
 *
 * A pure function of the statuses, the mode and the caller's permission to fall back on the CPU
 * reference: api/op.c looks the statuses up (cache.db, keyed by each kernel's binary, the GPU's UUID,
 * the driver and tk's version), asks here, and logs and acts on the answer. Tests drive it directly.
 */
#include <string.h>

#include "ops/selftest.h"

static const char *const names[] = {"never_tested", "passed",   "failed",     "crashed",
                                    "timed_out",    "untested", "interrupted"};

const char *tk_ops__st_name(int st) { return st >= 0 && st < (int)(sizeof names / sizeof names[0]) ? names[st] : "?"; }

int tk_ops__st_parse(const char *s)
{
    for (int i = 0; s && i < (int)(sizeof names / sizeof names[0]); i++)
        if (!strcmp(s, names[i]))
            return i;
    return -1;
}

int tk_ops__st_bad(int st)
{
    return st == TK_ST_FAILED || st == TK_ST_CRASHED || st == TK_ST_TIMED_OUT || st == TK_ST_INTERRUPTED;
}

int tk_ops__route(int *action, const int *status, size_t n, int mode, int cpu_allowed)
{
    size_t usable = 0;
    for (size_t i = 0; i < n; i++) {
        int st = status[i], a;
        if (mode == TK_SELFTEST_OFF)
            a = TK_ROUTE_USE;
        else if (tk_ops__st_bad(st))
            a = TK_ROUTE_SKIP;
        else if (mode == TK_SELFTEST_REQUIRED)
            a = st == TK_ST_PASSED ? TK_ROUTE_USE : st == TK_ST_NONE ? TK_ROUTE_TEST_FIRST : TK_ROUTE_SKIP;
        else
            a = TK_ROUTE_USE;
        action[i] = a;
        usable += a != TK_ROUTE_SKIP;
    }
    if (usable || n == 0)
        return TK_ROUTE_OK;
    return cpu_allowed ? TK_ROUTE_CPU : TK_ROUTE_ERROR;
}
