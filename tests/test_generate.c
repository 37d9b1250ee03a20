/*
 * test_generate.c — generation's logits processors against transformers' LogitsProcessor classes.
 *
 * tests/models/gen_oracle.py (in the test venv: $TK_PY_VENV, default build/py-venv) runs each
 * processor of transformers on random, tie-heavy and -inf rows and prints the inputs and outputs; each
 * case goes through the matching tk_gen__* function and must give the same row: the same removed
 * tokens and the same values (log_softmax within 2e-6). Without the venv the test skips, and fails
 * when CI is set.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "models/generate.h"
#include "tk.h"

static const char *venv(void)
{
    const char *v = getenv("TK_PY_VENV");
    return v && *v ? v : "build/py-venv";
}

/* 1 when the oracle's python exists; otherwise SKIPs (fails under CI) through the caller. */
static int have_python(char *py, size_t n)
{
    snprintf(py, n, "%s/bin/python", venv());
    FILE *f = fopen(py, "r");
    if (!f)
        return 0;
    fclose(f);
    return 1;
}

#define NEED_PYTHON(py)                                                                            \
    do {                                                                                           \
        if (!have_python(py, sizeof py)) {                                                         \
            if (getenv("CI") && strcmp(getenv("CI"), "true") == 0) {                               \
                fprintf(stderr, "no oracle venv at %s (CI=true: a missing oracle is a failure)\n", \
                        py);                                                                       \
                CHECK(0);                                                                          \
                return;                                                                            \
            }                                                                                      \
            SKIP("no python venv with transformers (run scripts/setup.sh --test)");                \
        }                                                                                          \
    } while (0)

static int read_floats(FILE *f, const char *tag, float **out, int64_t *V)
{
    char w[32];
    long long n;
    if (fscanf(f, "%31s %lld", w, &n) != 2 || strcmp(w, tag) != 0 || n < 0)
        return -1;
    float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    for (long long i = 0; i < n; i++) {
        char tok[64];
        if (fscanf(f, "%63s", tok) != 1) {
            free(v);
            return -1;
        }
        v[i] = (float)strtod(tok, NULL);
    }
    *out = v;
    *V = n;
    return 0;
}

static void test_processors_match_transformers(void)
{
    char py[1024], cmd[2048];
    NEED_PYTHON(py);
    snprintf(cmd, sizeof cmd, "'%s' tests/models/gen_oracle.py processors", py);
    FILE *f = popen(cmd, "r");
    CHECK(f != NULL);
    if (!f)
        return;
    int cases = 0, bad = 0, counted = 0;
    char name[64], param[64], mode[16];
    long long min_keep;
    while (fscanf(f, " case %63s %63s %lld %15s", name, param, &min_keep, mode) == 4) {
        char w[8];
        long long n;
        if (fscanf(f, "%7s %lld", w, &n) != 2 || strcmp(w, "ids") != 0) {
            CHECK(!"malformed oracle output (ids)");
            break;
        }
        int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
        for (long long i = 0; i < n; i++) {
            long long x = 0;
            if (fscanf(f, "%lld", &x) != 1)
                CHECK(!"malformed oracle output (an id)");
            ids[i] = (int32_t)x;
        }
        float *in = NULL, *want = NULL;
        int64_t V = 0, V2 = 0;
        if (read_floats(f, "in", &in, &V) || read_floats(f, "out", &want, &V2) || V != V2) {
            CHECK(!"malformed oracle output (rows)");
            free(ids);
            free(in);
            free(want);
            break;
        }
        double p = strtod(param, NULL);
        int rc = TK_OK;
        if (!strcmp(name, "temperature"))
            tk_gen__temperature(in, V, p);
        else if (!strcmp(name, "repetition_penalty"))
            rc = tk_gen__repetition_penalty(in, V, ids, (size_t)n, p);
        else if (!strcmp(name, "no_repeat_ngram"))
            tk_gen__no_repeat_ngram(in, V, ids, (size_t)n, (int64_t)p);
        else if (!strcmp(name, "top_k"))
            rc = tk_gen__top_k(in, V, (int64_t)p, min_keep);
        else if (!strcmp(name, "top_p"))
            rc = tk_gen__top_p(in, V, p, min_keep);
        else if (!strcmp(name, "min_p"))
            rc = tk_gen__min_p(in, V, p, min_keep);
        else if (!strcmp(name, "log_softmax"))
            tk_gen__log_softmax(in, V);
        else
            CHECK(!"unknown processor in the oracle's output");
        CHECK_RC(rc, TK_OK);
        int ok = 1;
        if (!strcmp(mode, "count")) {
            /* torch.sort ordered the tied scores in its own way: compare how many survive, and that
             * every survivor of tk scores at least the lowest survivor of transformers */
            int64_t kt = 0, kw = 0;
            float lo = INFINITY;
            for (int64_t i = 0; i < V; i++) {
                kw += want[i] != -INFINITY;
                if (want[i] != -INFINITY && want[i] < lo)
                    lo = want[i];
            }
            for (int64_t i = 0; i < V; i++)
                if (in[i] != -INFINITY) {
                    kt++;
                    ok &= in[i] >= lo;
                }
            ok &= kt == kw;
            counted++;
        } else {
            for (int64_t i = 0; i < V; i++) {
                double tol = !strcmp(name, "log_softmax") ? 2e-6 * (1 + fabs(want[i])) : 0;
                int same = (isinf(want[i]) || isinf(in[i])) ? want[i] == in[i] : fabs(in[i] - want[i]) <= tol;
                if (!same) {
                    if (ok)
                        fprintf(stderr, "%s(%s, min_keep %lld) V=%lld: element %lld is %a, want %a\n", name, param,
                                min_keep, (long long)V, (long long)i, in[i], want[i]);
                    ok = 0;
                }
            }
        }
        bad += !ok;
        cases++;
        free(ids);
        free(in);
        free(want);
    }
    int st = pclose(f);
    CHECK_EQ_INT(st, 0);
    printf("processors: %d cases (%d compared by count: torch's tie order), %d differ\n", cases, counted, bad);
    CHECK(cases > 400);
    CHECK_EQ_INT(bad, 0);
}

int main(void)
{
    RUN(test_processors_match_transformers);
    return th_done();
}
