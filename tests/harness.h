/*
 * harness.h — tk's small test harness (single header, static functions).
 *
 *     static void test_x(void) { CHECK(1 + 1 == 2); CHECK_EQ_INT(f(), TK_OK); }
 *     int main(void) { RUN(test_x); return th_done(); }
 *
 * A test passes when none of its checks failed. A failed check prints file:line and both values.
 * SKIP("why") inside a test marks it skipped and returns. The last line printed is
 * "N passed, N failed, N skipped" and the exit status is nonzero when anything failed.
 */
#ifndef TK_TEST_HARNESS_H
#define TK_TEST_HARNESS_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int th_passed, th_failed, th_skipped;
static int th_cur_failed, th_cur_skipped;
static const char *th_cur_name;

#define CHECK(cond)                                                                                                    \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "%s:%d: %s: CHECK(%s) failed\n", __FILE__, __LINE__, th_cur_name, #cond);                  \
            th_cur_failed++;                                                                                           \
        }                                                                                                              \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                                                             \
    do {                                                                                                               \
        long long th_a = (long long)(a), th_b = (long long)(b);                                                        \
        if (th_a != th_b) {                                                                                            \
            fprintf(stderr, "%s:%d: %s: %s == %s failed: %lld != %lld\n", __FILE__, __LINE__, th_cur_name, #a, #b,     \
                    th_a, th_b);                                                                                       \
            th_cur_failed++;                                                                                           \
        }                                                                                                              \
    } while (0)

/* Checks a tk status and prints tk_last_error() when it differs. */
#define CHECK_RC(call, want)                                                                                           \
    do {                                                                                                               \
        int th_rc = (call);                                                                                            \
        if (th_rc != (want)) {                                                                                         \
            fprintf(stderr, "%s:%d: %s: %s returned %d, want %d; last error: %s\n", __FILE__, __LINE__, th_cur_name,   \
                    #call, th_rc, (int)(want), tk_last_error());                                                       \
            th_cur_failed++;                                                                                           \
        }                                                                                                              \
    } while (0)

#define CHECK_STR(a, b)                                                                                                \
    do {                                                                                                               \
        const char *th_a = (a), *th_b = (b);                                                                           \
        if (!th_a || !th_b || strcmp(th_a, th_b) != 0) {                                                               \
            fprintf(stderr, "%s:%d: %s: %s == %s failed: \"%s\" != \"%s\"\n", __FILE__, __LINE__, th_cur_name, #a, #b, \
                    th_a ? th_a : "(null)", th_b ? th_b : "(null)");                                                   \
            th_cur_failed++;                                                                                           \
        }                                                                                                              \
    } while (0)

#define CHECK_CONTAINS(hay, needle)                                                                                    \
    do {                                                                                                               \
        const char *th_h = (hay), *th_n = (needle);                                                                    \
        if (!th_h || !strstr(th_h, th_n)) {                                                                            \
            fprintf(stderr, "%s:%d: %s: \"%s\" does not contain \"%s\"\n", __FILE__, __LINE__, th_cur_name,            \
                    th_h ? th_h : "(null)", th_n);                                                                     \
            th_cur_failed++;                                                                                           \
        }                                                                                                              \
    } while (0)

#define SKIP(why)                                                                                                      \
    do {                                                                                                               \
        printf("skip %s: %s\n", th_cur_name, (why));                                                                   \
        th_cur_skipped = 1;                                                                                            \
        return;                                                                                                        \
    } while (0)

/* Seconds on the monotonic clock: RUN prints each test's time, so a slow one is easy to find. */
static inline double th_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

#define RUN(fn)                                                                                                        \
    do {                                                                                                               \
        double th_t0 = th_now();                                                                                       \
        th_cur_name = #fn;                                                                                             \
        th_cur_failed = 0;                                                                                             \
        th_cur_skipped = 0;                                                                                            \
        fn();                                                                                                          \
        if (th_cur_failed) {                                                                                           \
            th_failed++;                                                                                               \
            printf("FAIL %s (%.1fs)\n", #fn, th_now() - th_t0);                                                        \
        } else if (th_cur_skipped) {                                                                                   \
            th_skipped++;                                                                                              \
        } else {                                                                                                       \
            th_passed++;                                                                                               \
            printf("ok   %s (%.1fs)\n", #fn, th_now() - th_t0);                                                        \
        }                                                                                                              \
        fflush(stdout);                                                                                                \
    } while (0)

/* The test venv's directory (the Python oracles): $TK_PY_VENV, else one venv per user,
 * ${XDG_CACHE_HOME:-$HOME/.cache}/tk/py-venv, as scripts/py-venv.sh (which scripts/setup.sh --test
 * installs into and the shell tests use). A static buffer: valid until the next call. */
static inline const char *th_py_venv(void)
{
    static char buf[512];
    const char *v = getenv("TK_PY_VENV"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (v && *v)
        return v;
    if (xdg && xdg[0] == '/')
        snprintf(buf, sizeof buf, "%s/tk/py-venv", xdg);
    else
        snprintf(buf, sizeof buf, "%s/.cache/tk/py-venv", home && *home ? home : "/tmp");
    return buf;
}

static inline int th_done(void)
{
    printf("%d passed, %d failed, %d skipped\n", th_passed, th_failed, th_skipped);
    return th_failed ? 1 : 0;
}

#endif
