/*
 * test_generate.c — generation's logits processors against transformers' LogitsProcessor classes.
 *
 * tests/models/gen_oracle.py (in the test venv: th_py_venv()) runs each
 * processor of transformers on random, tie-heavy and -inf rows and prints the inputs and outputs; each
 * case goes through the matching tk_gen__* function and must give the same row: the same removed
 * tokens and the same values (log_softmax within 2e-6). The same script makes tiny random Llama and
 * GPT-2 checkpoints for the rest: the KV-cache step against a full forward at every step (block
 * boundaries, forks and batched decode included), batches against one prompt at a time, seeded
 * sampling (reproducible, and distributed as the softmax), streaming pieces, stop strings, defaults
 * from generation_config.json and bad input. Without the venv the tests skip, and fail when CI is set.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/sample_math.h"
#include "harness.h"
#include "models/generate.h"
#include "models/kv_cache.h"
#include "models/models.h"
#include "tk.h"

static const char *venv(void) { return th_py_venv(); }

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

#define NEED_PYTHON(py)                                                                                                \
    do {                                                                                                               \
        if (!have_python(py, sizeof py)) {                                                                             \
            if (getenv("CI") && strcmp(getenv("CI"), "true") == 0) {                                                   \
                fprintf(stderr, "no oracle venv at %s (CI=true: a missing oracle is a failure)\n", py);                \
                CHECK(0);                                                                                              \
                return;                                                                                                \
            }                                                                                                          \
            SKIP("no python venv with transformers (run scripts/setup.sh --test)");                                    \
        }                                                                                                              \
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

/* ---- on tiny checkpoints ---------------------------------------------------------------------- */

static char ckdir[512];  /* the shared tiny checkpoints: ckdir/llama, ckdir/gpt2 (read only) */
static char workdir[512]; /* this run's scratch: the tk home, derived checkpoints */
static int ck_state;      /* 0 not tried, 1 made, -1 failed */
static tk_ctx *ctx;

/* The tiny checkpoints of tests/models/gen_oracle.py make, made once per build and shared with the
 * shell tests (tests/models/tiny.sh prints their directory), and a scratch directory. */
static int have_checkpoints(const char *py)
{
    (void)py; /* tiny.sh finds the venv itself: TK_PY_VENV, or the same default */
    if (ck_state)
        return ck_state > 0;
    ck_state = -1;
    snprintf(workdir, sizeof workdir, "%s/tk-test-generate-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(workdir))
        return 0;
    const char *kinds[] = {"llama", "gpt2"};
    for (int i = 0; i < 2; i++) {
        char cmd[64], line[sizeof ckdir];
        snprintf(cmd, sizeof cmd, "bash tests/models/tiny.sh %s", kinds[i]);
        FILE *f = popen(cmd, "r");
        int ok = f && fgets(line, sizeof line, f) != NULL;
        if (f && pclose(f) != 0)
            ok = 0;
        size_t n = ok ? strlen(line) : 0;
        if (!ok || n < 2 || line[n - 1] != '\n') {
            fprintf(stderr, "making the tiny %s checkpoint failed (%s)\n", kinds[i], cmd);
            return 0;
        }
        line[n - 1] = '\0';
        char *slash = strrchr(line, '/'); /* .../KEY/llama -> .../KEY */
        if (!slash)
            return 0;
        *slash = '\0';
        snprintf(ckdir, sizeof ckdir, "%s", line);
    }
    tk_ctx_opts co = TK_CTX_OPTS_INIT;
    char home[600];
    snprintf(home, sizeof home, "%s/home", workdir);
    co.home = home;
    co.offline = 1;
    if (tk_ctx_new(&ctx, &co) != TK_OK) {
        fprintf(stderr, "tk_ctx_new: %s\n", tk_last_error());
        ck_state = -1;
        return 0;
    }
    ck_state = 1;
    return 1;
}

#define NEED_MODELS()                                                                                                  \
    char py[1024];                                                                                                     \
    NEED_PYTHON(py);                                                                                                   \
    if (!have_checkpoints(py)) {                                                                                       \
        CHECK(!"could not make the tiny checkpoints");                                                                 \
        return;                                                                                                        \
    }

static tk_model *load(const char *kind)
{
    char d[600];
    snprintf(d, sizeof d, "%s/%s", ckdir, kind);
    tk_model *m = NULL;
    CHECK_RC(tk_model_load(&m, ctx, d, NULL), TK_OK);
    return m;
}

static float max_diff(const float *a, const float *b, int64_t n)
{
    float d = 0;
    for (int64_t i = 0; i < n; i++)
        if (fabsf(a[i] - b[i]) > d)
            d = fabsf(a[i] - b[i]);
    return d;
}

/* One KV step of one sequence vs tk_model_forward over its whole ids. */
static void kv_vs_full(tk_model *m, tk_kv *kv, int32_t slot, const int32_t *all, size_t n, size_t nnew, float *worst)
{
    int64_t V = tk_model_vocab_size(m);
    float *a = malloc((size_t)V * sizeof *a), *full = malloc(n * (size_t)V * sizeof *full);
    int32_t cu[2] = {0, (int32_t)nnew};
    CHECK_RC(tk_models__forward_kv(m, kv, &slot, 1, all + n - nnew, cu, a), TK_OK);
    CHECK_RC(tk_model_forward(m, all, &n, 1, full, NULL), TK_OK);
    float d = max_diff(a, full + (n - 1) * (size_t)V, V);
    if (d > *worst)
        *worst = d;
    free(a);
    free(full);
}

/* The softmax sums are exact (tk_fsum): a row cut into blocks, each block's terms summed apart and the
 * blocks' sums added in another order (as a vocabulary-parallel pick's ranks do, models/tp_pick.c),
 * gives log_softmax's and min-p's results to the bit, on rows with ties, -inf and a wide range. */
static void test_softmax_sums_split_exactly(void)
{
    enum { V = 1000, W = 3 };
    static float row[V], lp[V], mp[V];
    uint32_t st = 12345;
    for (int rep = 0; rep < 20; rep++) {
        for (int i = 0; i < V; i++) {
            st = st * 1664525u + 1013904223u;
            row[i] = (float)((int)(st >> 8) % 4000 - 2000) / (rep % 2 ? 7.0f : 300.0f);
            if (i % 97 == 5)
                row[i] = -INFINITY;
            if (i % 89 == 3)
                row[i] = row[i / 2]; /* ties */
        }
        memcpy(lp, row, sizeof row);
        memcpy(mp, row, sizeof row);
        tk_gen__log_softmax(lp, V);
        CHECK(tk_gen__min_p(mp, V, 0.05 * (rep % 5 + 1), 1) == TK_OK);
        float m = -INFINITY;
        for (int i = 0; i < V; i++)
            m = row[i] > m ? row[i] : m;
        tk_fsum part[W][2], lse_sum = {0}, sm_sum = {0};
        memset(part, 0, sizeof part);
        int64_t C = (V + W - 1) / W;
        for (int r = 0; r < W; r++) {
            int64_t off = r * C, len = off + C > V ? V - off : C;
            tk_gen__lse_terms(&part[r][0], row + off, len, m);
            tk_gen__softmax_terms(&part[r][1], row + off, len, m);
        }
        for (int r = W - 1; r >= 0; r--) { /* the other order */
            tk__fsum_merge(&lse_sum, &part[r][0]);
            tk__fsum_merge(&sm_sum, &part[r][1]);
        }
        float lse = (float)log(tk__fsum_value(&lse_sum)), inv = tk_gen__softmax_inv(&sm_sum);
        float thr = (float)(0.05 * (rep % 5 + 1)) * inv;
        int same = 1;
        for (int i = 0; i < V; i++) {
            float want_lp = (row[i] - m) - lse;
            float want_mp = (expf(row[i] - m) * inv < thr) ? -INFINITY : row[i];
            same &= memcmp(&want_lp, &lp[i], sizeof want_lp) == 0 && memcmp(&want_mp, &mp[i], sizeof want_mp) == 0;
        }
        CHECK(same);
    }
}

static void test_kv_cache_matches_full_recompute(void)
{
    NEED_MODELS();
    const char *kinds[] = {"llama", "gpt2"};
    for (int km = 0; km < 2; km++) {
        tk_model *m = load(kinds[km]);
        if (!m)
            return;
        int64_t V = tk_model_vocab_size(m);
        const tk_models_config *c = &m->cfg;
        int64_t heads = c->kv_heads, hd = c->head_dim;
        tk_kv *kv = NULL;
        CHECK_RC(tk_kv__new(&kv, c->layers, heads, hd, m->dtype, 8, 0, TK_DEV_CPU, 0), TK_OK);
        if (!kv) {
            tk_model_free(m);
            return;
        }
        int32_t a[64], b[64], sa, sb;
        size_t na = 11;
        for (size_t i = 0; i < na; i++)
            a[i] = (int32_t)((i * 37 + 5) % (size_t)V);
        float worst = 0;
        CHECK_RC(tk_kv__seq_new(kv, &sa), TK_OK);
        kv_vs_full(m, kv, sa, a, na, na, &worst); /* prefill */
        for (int step = 0; step < 9; step++) {     /* decode across the block boundary at 16 */
            a[na] = (int32_t)((na * 53 + 7) % (size_t)V);
            na++;
            kv_vs_full(m, kv, sa, a, na, 1, &worst);
        }
        /* a fork in the middle of a block: both continue differently (copy-on-write) */
        CHECK_RC(tk_kv__seq_fork(kv, &sb, sa), TK_OK);
        memcpy(b, a, na * sizeof *a);
        size_t nb = na;
        int64_t used = kv->used_blocks;
        for (int step = 0; step < 6; step++) {
            a[na] = (int32_t)((na * 11 + 3) % (size_t)V);
            na++;
            kv_vs_full(m, kv, sa, a, na, 1, &worst);
            b[nb] = (int32_t)((nb * 17 + 1) % (size_t)V);
            nb++;
            kv_vs_full(m, kv, sb, b, nb, 1, &worst);
        }
        CHECK(kv->used_blocks > used); /* the shared partial block was copied, full ones stayed shared */
        /* one batched decode step of both */
        int32_t slots[2] = {sa, sb}, ids[2], cu[3] = {0, 1, 2};
        a[na] = 5;
        b[nb] = 6;
        ids[0] = a[na++];
        ids[1] = b[nb++];
        float *two = malloc(2 * (size_t)V * sizeof *two), *full = malloc(64 * (size_t)V * sizeof *full);
        CHECK_RC(tk_models__forward_kv(m, kv, slots, 2, ids, cu, two), TK_OK);
        CHECK_RC(tk_model_forward(m, a, &na, 1, full, NULL), TK_OK);
        float d1 = max_diff(two, full + (na - 1) * (size_t)V, V);
        CHECK_RC(tk_model_forward(m, b, &nb, 1, full, NULL), TK_OK);
        float d2 = max_diff(two + V, full + (nb - 1) * (size_t)V, V);
        worst = fmaxf(worst, fmaxf(d1, d2));
        printf("%s: KV cache vs full recompute over %zu steps: max |logit diff| %.3g\n", kinds[km], na - 11 + nb - 11,
               worst);
        CHECK(worst <= 2e-4f);
        tk_kv__seq_free(kv, sa);
        tk_kv__seq_free(kv, sb);
        CHECK_EQ_INT(kv->used_blocks, 0);
        free(two);
        free(full);
        tk_kv__free(kv);
        tk_model_free(m);
    }
}

/* i8 and fp8 caches (per-head scales from the prefill): the step's logits stay close to a full
 * recompute's, relative to the logits' range, and a block takes a quarter of an f32 one. */
static void test_quantised_kv_cache(void)
{
    NEED_MODELS();
    const char *kinds[] = {"llama", "gpt2"};
    /* i8 and fp8 with per-head scales; f16 and bf16 under these f32 models (a narrower float cache) */
    const char *dts[] = {"i8", "fp8_e4m3", "f16", "bf16"};
    const float bound[] = {0.06f, 0.15f, 0.01f, 0.03f};
    for (int km = 0; km < 2; km++) {
        tk_model *m = load(kinds[km]);
        if (!m)
            return;
        int64_t V = tk_model_vocab_size(m);
        const tk_models_config *c = &m->cfg;
        int64_t heads = c->kv_heads, hd = c->head_dim;
        for (int q = 0; q < 4; q++) {
            tk_dtype dt;
            CHECK_RC(tk_dtype_parse(&dt, dts[q]), TK_OK);
            tk_kv *kv = NULL, *kf = NULL;
            CHECK_RC(tk_kv__new(&kv, c->layers, heads, hd, dt, 8, 0, TK_DEV_CPU, 0), TK_OK);
            CHECK_RC(tk_kv__new(&kf, c->layers, heads, hd, m->dtype, 8, 0, TK_DEV_CPU, 0), TK_OK);
            if (!kv || !kf)
                break;
            CHECK_EQ_INT(tk_kv__block_bytes(kv) * (32 / dt.bits), tk_kv__block_bytes(kf));
            int32_t a[32], slot;
            size_t na = 9;
            for (size_t i = 0; i < na; i++)
                a[i] = (int32_t)((i * 37 + 5) % (size_t)V);
            CHECK_RC(tk_kv__seq_new(kv, &slot), TK_OK);
            float *lg = malloc((size_t)V * sizeof *lg), *full = malloc(32 * (size_t)V * sizeof *full);
            float worst = 0, range = 0;
            for (int step = 0; step < 12; step++) {
                size_t nnew = step ? 1 : na;
                if (step) {
                    a[na] = (int32_t)((na * 53 + 7) % (size_t)V);
                    na++;
                }
                int32_t cu[2] = {0, (int32_t)nnew};
                CHECK_RC(tk_models__forward_kv(m, kv, &slot, 1, a + na - nnew, cu, lg), TK_OK);
                CHECK_RC(tk_model_forward(m, a, &na, 1, full, NULL), TK_OK);
                const float *ref = full + (na - 1) * (size_t)V;
                worst = fmaxf(worst, max_diff(lg, ref, V));
                for (int64_t v = 0; v < V; v++)
                    range = fmaxf(range, fabsf(ref[v]));
            }
            printf("%s, %s KV cache: max |logit diff| %.3g over 12 steps, %.2f%% of max |logit| %.3g\n", kinds[km],
                   dts[q], worst, 100 * worst / range, range);
            /* these tiny checkpoints' weights are drawn wide (std 0.3), which amplifies the cache's
             * rounding through the layers: about 4% (i8) and 11% (fp8) of the largest logit */
            CHECK(worst <= bound[q] * range);
            CHECK(worst > 0); /* it did round */
            free(lg);
            free(full);
            tk_kv__free(kv);
            tk_kv__free(kf);
        }
        tk_model_free(m);
    }
}

/* Weight-only quantisation: casted_linear over i8 / fp8 copies; the logits move a little, the linear
 * weights take about a quarter of their f32 bytes, and "none" gives back the float logits exactly. */
static void test_weight_quantisation(void)
{
    NEED_MODELS();
    const char *kinds[] = {"llama", "gpt2"};
    for (int km = 0; km < 2; km++) {
        tk_model *m = load(kinds[km]);
        if (!m)
            return;
        int64_t V = tk_model_vocab_size(m);
        int32_t ids[] = {1, 50, 60, 70, 80, 90};
        size_t n = 6;
        float *f = malloc(n * (size_t)V * sizeof *f), *g = malloc(n * (size_t)V * sizeof *g);
        CHECK_RC(tk_model_forward(m, ids, &n, 1, f, NULL), TK_OK);
        float range = 0;
        for (size_t i = 0; i < n * (size_t)V; i++)
            range = fmaxf(range, fabsf(f[i]));
        const char *q[] = {"int8", "fp8"};
        for (int k = 0; k < 2; k++) {
            CHECK_RC(tk_model_quantize(m, q[k]), TK_OK);
            CHECK_RC(tk_model_forward(m, ids, &n, 1, g, NULL), TK_OK);
            float d = max_diff(f, g, n * V);
            char *j = NULL;
            CHECK_RC(tk_model_quant_json(&j, m), TK_OK);
            printf("%s --quant %s: prompt logits max |diff| %.3g (%.2f%% of %.3g); %s\n", kinds[km], q[k], d,
                   100 * d / range, range, j ? j : "");
            CHECK(d > 0);
            /* the wide weights of these checkpoints amplify the rounding: ~3.5% (int8), ~13% (fp8) */
            CHECK(d <= (k ? 0.20f : 0.06f) * range);
            CHECK(j && m->q_bytes * 3 < m->q_float_bytes && m->q_bytes * 5 > m->q_float_bytes);
            tk_free(j);
        }
        CHECK_RC(tk_model_quantize(m, "none"), TK_OK);
        CHECK_RC(tk_model_forward(m, ids, &n, 1, g, NULL), TK_OK);
        CHECK(max_diff(f, g, n * V) == 0);
        CHECK_RC(tk_model_quantize(m, "int4"), TK_ERR_INVALID);
        CHECK_CONTAINS(tk_last_error(), "want int8");
        free(f);
        free(g);
        tk_model_free(m);
    }
}

static int same_ids(const tk_gen_result *x, size_t i, const tk_gen_result *y, size_t j)
{
    size_t n1 = 0, n2 = 0;
    const int32_t *a = tk_gen_result_ids(x, i, &n1), *b = tk_gen_result_ids(y, j, &n2);
    return a && b && n1 == n2 && memcmp(a, b, n1 * sizeof *a) == 0;
}

static void test_batch_equals_one_at_a_time(void)
{
    NEED_MODELS();
    tk_model *m = load("gpt2");
    if (!m)
        return;
    int32_t p0[] = {0, 50, 60, 70}, p1[] = {9}, p2[] = {0, 300, 301, 302, 303, 304, 305, 306};
    const int32_t *ps[] = {p0, p1, p2};
    size_t ls[] = {4, 1, 8};
    for (int mode = 0; mode < 3; mode++) {
        tk_gen_opts o = TK_GEN_OPTS_INIT;
        o.max_new_tokens = 14;
        o.eos_token_id[0] = 97;
        o.n_eos = 1;
        if (mode == 1) {
            o.do_sample = 1;
            o.top_k = 0;
            o.temperature = 1.3;
            o.seed = 42;
        } else if (mode == 2) {
            o.num_beams = 3;
        }
        tk_gen_result *all = NULL;
        CHECK_RC(tk_generate(&all, m, ps, ls, 3, &o), TK_OK);
        for (size_t i = 0; all && i < 3; i++) {
            tk_gen_result *one = NULL;
            CHECK_RC(tk_generate(&one, m, &ps[i], &ls[i], 1, &o), TK_OK);
            if (one && !same_ids(all, i, one, 0)) {
                fprintf(stderr, "mode %d prompt %zu: the batch and the single run differ\n", mode, i);
                CHECK(0);
            }
            tk_gen_result_free(one);
        }
        CHECK_EQ_INT(tk_gen_result_count(all), 3);
        tk_gen_result_free(all);
    }
    tk_model_free(m);
}

/* One prompt through tk_gen_batch (the step-wise API tk serve-model uses) with o: its events' tokens,
 * log-probabilities and top ones into tok / lp / ntop / tid / tlp (at most cap tokens); returns how many. */
static size_t batch_events(tk_model *m, const int32_t *p, size_t len, const tk_gen_opts *o, size_t cap, int32_t *tok,
                           float *lp, int *ntop, int32_t *tid, float *tlp)
{
    tk_gen_batch *b = NULL;
    int64_t id;
    size_t n = 0;
    CHECK_RC(tk_gen_batch_new(&b, m, NULL), TK_OK);
    CHECK_RC(tk_gen_batch_add(&id, b, p, len, 1, o), TK_OK);
    while (b && tk_gen_batch_active(b)) {
        const tk_gen_event *ev;
        size_t nev;
        if (tk_gen_batch_step(b, &ev, &nev) != TK_OK)
            break;
        for (size_t k = 0; k < nev && n < cap; k++, n++) {
            tok[n] = ev[k].token;
            lp[n] = ev[k].logprob;
            ntop[n] = ev[k].ntop;
            memcpy(tid + n * TK_GEN_MAX_TOP_LOGPROBS, ev[k].top_ids, sizeof ev[k].top_ids);
            memcpy(tlp + n * TK_GEN_MAX_TOP_LOGPROBS, ev[k].top_logprobs, sizeof ev[k].top_logprobs);
        }
    }
    tk_gen_batch_free(b);
    return n;
}

/* tk_generate's log-probabilities (tk_gen_result_logprobs, _top_logprobs) are tk_gen_batch's events',
 * bit for bit, for each prompt of a batch, greedy and sampled: one implementation (the step engine's);
 * NULL / 0 where they were not asked for or out of range; beam search refuses them. transformers checks
 * the values themselves (tests/cli/generate.sh, t_logprobs_match_transformers). */
static void test_result_logprobs(void)
{
    NEED_MODELS();
    tk_model *m = load("gpt2");
    if (!m)
        return;
    int32_t p0[] = {0, 50, 60, 70}, p1[] = {9}, tok[16], tid[16 * TK_GEN_MAX_TOP_LOGPROBS];
    float lp[16], tlp[16 * TK_GEN_MAX_TOP_LOGPROBS];
    int ntop[16];
    const int32_t *ps[] = {p0, p1};
    size_t ls[] = {4, 1};
    for (int mode = 0; mode < 2; mode++) {
        tk_gen_opts o = TK_GEN_OPTS_INIT;
        o.max_new_tokens = 8;
        o.logprobs = 1;
        o.top_logprobs = 4;
        o.do_sample = mode;
        o.top_k = 0;
        o.temperature = 1.3;
        o.seed = 42;
        tk_gen_result *r = NULL;
        CHECK_RC(tk_generate(&r, m, ps, ls, 2, &o), TK_OK);
        for (size_t i = 0; r && i < 2; i++) {
            size_t n = 0, nl = 0, ne = batch_events(m, ps[i], ls[i], &o, 16, tok, lp, ntop, tid, tlp);
            const int32_t *ids = tk_gen_result_ids(r, i, &n);
            const float *l = tk_gen_result_logprobs(r, i, &nl);
            CHECK(l != NULL);
            CHECK_EQ_INT(nl, n);
            CHECK_EQ_INT(ne, n);
            for (size_t j = 0; l && j < n && j < ne; j++) {
                const int32_t *ti = NULL;
                const float *tv = NULL;
                size_t k = tk_gen_result_top_logprobs(r, i, j, &ti, &tv);
                CHECK_EQ_INT(ids[j], tok[j]);
                CHECK(memcmp(&l[j], &lp[j], sizeof *l) == 0);
                CHECK_EQ_INT(k, 4);
                CHECK_EQ_INT(ntop[j], 4);
                CHECK(ti && memcmp(ti, tid + j * TK_GEN_MAX_TOP_LOGPROBS, k * sizeof *ti) == 0);
                CHECK(tv && memcmp(tv, tlp + j * TK_GEN_MAX_TOP_LOGPROBS, k * sizeof *tv) == 0);
                for (size_t q = 1; tv && q < k; q++)
                    CHECK(tv[q] <= tv[q - 1]);
                if (mode == 0) /* greedy picks the likeliest */
                    CHECK(ti && ti[0] == ids[j] && tv[0] == l[j]);
            }
            const int32_t *ti = (const int32_t *)1;
            CHECK_EQ_INT(tk_gen_result_top_logprobs(r, i, n, &ti, NULL), 0);
            CHECK(ti == NULL);
        }
        CHECK(tk_gen_result_logprobs(r, 2, NULL) == NULL);
        tk_gen_result_free(r);
    }
    /* logprobs without tops; neither */
    tk_gen_opts o = TK_GEN_OPTS_INIT;
    o.max_new_tokens = 3;
    o.logprobs = 1;
    tk_gen_result *r = NULL;
    size_t n = 9;
    CHECK_RC(tk_generate(&r, m, ps, ls, 1, &o), TK_OK);
    CHECK(tk_gen_result_logprobs(r, 0, &n) != NULL && n == 3);
    CHECK_EQ_INT(tk_gen_result_top_logprobs(r, 0, 0, NULL, NULL), 0);
    tk_gen_result_free(r);
    o.logprobs = 0;
    CHECK_RC(tk_generate(&r, m, ps, ls, 1, &o), TK_OK);
    CHECK(tk_gen_result_logprobs(r, 0, &n) == NULL && n == 0);
    tk_gen_result_free(r);
    /* beam search: refused, with a hint */
    o.num_beams = 2;
    o.top_logprobs = 1;
    r = (tk_gen_result *)1;
    CHECK_RC(tk_generate(&r, m, ps, ls, 1, &o), TK_ERR_UNSUPPORTED);
    CHECK(r == NULL);
    CHECK_CONTAINS(tk_last_error(), "not beam search (num_beams 2)");
    CHECK_CONTAINS(tk_last_error(), "HINT:");
    tk_model_free(m);
}

static void test_sampling_seeded_and_distributed(void)
{
    NEED_MODELS();
    tk_model *m = load("llama");
    if (!m)
        return;
    int64_t V = tk_model_vocab_size(m);
    int32_t p[] = {1, 50, 60};
    const int32_t *ps[] = {p};
    size_t lp = 3;
    /* the next-token distribution at temperature 2 (flatter, so many tokens are drawn) */
    float *lg = malloc(3 * (size_t)V * sizeof *lg);
    double *prob = calloc((size_t)V, sizeof *prob);
    long *cnt = calloc((size_t)V, sizeof *cnt);
    CHECK_RC(tk_model_forward(m, p, &lp, 1, lg, NULL), TK_OK);
    double mx = -INFINITY, sum = 0;
    for (int64_t v = 0; v < V; v++)
        mx = fmax(mx, lg[2 * V + v] / 2.0);
    for (int64_t v = 0; v < V; v++)
        sum += prob[v] = exp(lg[2 * V + v] / 2.0 - mx);
    tk_gen_opts o = TK_GEN_OPTS_INIT;
    o.do_sample = 1;
    o.top_k = 0;
    o.temperature = 2.0;
    o.max_new_tokens = 1;
    const int N = 4000;
    for (int i = 0; i < N; i++) {
        o.seed = (uint64_t)i * 2654435761u;
        tk_gen_result *r = NULL;
        if (tk_generate(&r, m, ps, &lp, 1, &o) != TK_OK) {
            CHECK_RC(TK_ERR_INTERNAL, TK_OK);
            break;
        }
        size_t n = 0;
        const int32_t *ids = tk_gen_result_ids(r, 0, &n);
        if (n == 1)
            cnt[ids[0]]++;
        tk_gen_result_free(r);
    }
    /* chi-square over tokens expected >= 5 times, the rest pooled */
    double chi = 0, e_rest = 0;
    long o_rest = 0;
    int df = 0;
    for (int64_t v = 0; v < V; v++) {
        double e = N * prob[v] / sum;
        if (e >= 5) {
            chi += (cnt[v] - e) * (cnt[v] - e) / e;
            df++;
        } else {
            e_rest += e;
            o_rest += cnt[v];
        }
    }
    if (e_rest >= 5) {
        chi += (o_rest - e_rest) * (o_rest - e_rest) / e_rest;
        df++;
    }
    df -= 1;
    double limit = df + 6 * sqrt(2.0 * df);
    printf("sampling: %d draws over %d cells: chi-square %.1f (df %d, limit %.1f)\n", N, df + 1, chi, df, limit);
    CHECK(df >= 5);
    CHECK(chi < limit);
    /* top-k 3: only the three most likely tokens ever appear; a seed repeats its sequence */
    o.top_k = 3;
    o.max_new_tokens = 1;
    int64_t top[3] = {-1, -1, -1};
    for (int k = 0; k < 3; k++)
        for (int64_t v = 0; v < V; v++)
            if ((k == 0 || v != top[0]) && (k < 2 || v != top[1]) && (top[k] < 0 || lg[2 * V + v] > lg[2 * V + top[k]]))
                top[k] = v;
    for (int i = 0; i < 200; i++) {
        o.seed = (uint64_t)i;
        tk_gen_result *r = NULL;
        CHECK_RC(tk_generate(&r, m, ps, &lp, 1, &o), TK_OK);
        size_t n = 0;
        const int32_t *ids = tk_gen_result_ids(r, 0, &n);
        CHECK(n == 1 && (ids[0] == top[0] || ids[0] == top[1] || ids[0] == top[2]));
        tk_gen_result_free(r);
    }
    o.top_k = 0;
    o.max_new_tokens = 24;
    o.seed = 1234;
    tk_gen_result *r1 = NULL, *r2 = NULL;
    CHECK_RC(tk_generate(&r1, m, ps, &lp, 1, &o), TK_OK);
    CHECK_RC(tk_generate(&r2, m, ps, &lp, 1, &o), TK_OK);
    CHECK(r1 && r2 && same_ids(r1, 0, r2, 0));
    tk_gen_result_free(r1);
    tk_gen_result_free(r2);
    free(lg);
    free(prob);
    free(cnt);
    tk_model_free(m);
}

typedef struct {
    char buf[8192];
    size_t len;
    int bad, calls;
} pieces;

/* 1 when p[0..n) is complete, valid UTF-8 */
static int valid_utf8(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned c = p[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!k || i + k > n)
            return 0;
        for (size_t j = 1; j < k; j++)
            if ((p[i + j] & 0xC0) != 0x80)
                return 0;
        i += k;
    }
    return 1;
}

static int collect(void *user, size_t seq, int32_t token, const char *text, size_t len)
{
    pieces *p = user;
    p->calls++;
    if (!valid_utf8((const unsigned char *)text, len))
        p->bad++;
    if (p->len + len < sizeof p->buf) {
        memcpy(p->buf + p->len, text, len);
        p->len += len;
    }
    return 0;
}

static void test_streaming_never_splits_utf8(void)
{
    NEED_MODELS();
    tk_model *m = load("llama");
    if (!m)
        return;
    int32_t p[] = {1, 50};
    const int32_t *ps[] = {p};
    size_t lp = 2;
    int multibyte = 0;
    for (int i = 0; i < 40; i++) {
        tk_gen_opts o = TK_GEN_OPTS_INIT;
        pieces pc = {{0}, 0, 0, 0};
        o.do_sample = 1;
        o.top_k = 0;
        o.temperature = 3.0; /* wide draws: byte-fallback tokens, some completing a character */
        o.seed = (uint64_t)i;
        o.max_new_tokens = 30;
        o.stream = collect;
        o.stream_user = &pc;
        tk_gen_result *r = NULL;
        CHECK_RC(tk_generate(&r, m, ps, &lp, 1, &o), TK_OK);
        const char *t = tk_gen_result_text(r, 0);
        size_t n = 0;
        tk_gen_result_ids(r, 0, &n);
        CHECK(t != NULL);
        CHECK_EQ_INT(pc.calls, n);
        CHECK_EQ_INT(pc.bad, 0);
        CHECK(t && pc.len == strlen(t) && memcmp(pc.buf, t, pc.len) == 0);
        for (size_t k = 0; t && t[k]; k++)
            multibyte |= (unsigned char)t[k] >= 0xC0 && (unsigned char)t[k] != 0xEF;
        tk_gen_result_free(r);
    }
    CHECK(multibyte); /* the draws did produce multi-byte characters */
    tk_model_free(m);
}

static void test_stop_strings_and_end_reasons(void)
{
    NEED_MODELS();
    tk_model *m = load("llama");
    if (!m)
        return;
    int32_t p[] = {1, 50, 60, 70};
    const int32_t *ps[] = {p};
    size_t lp = 4;
    tk_gen_opts o = TK_GEN_OPTS_INIT;
    o.max_new_tokens = 24;
    tk_gen_result *r = NULL;
    CHECK_RC(tk_generate(&r, m, ps, &lp, 1, &o), TK_OK);
    const char *t = r ? tk_gen_result_text(r, 0) : NULL;
    CHECK(t && strlen(t) > 12);
    CHECK_STR(tk_gen_result_end(r, 0), "length");
    if (t && strlen(t) > 12) {
        char stop[8];
        memcpy(stop, t + 6, 4); /* four bytes from the middle */
        stop[4] = 0;
        const char *stops[] = {stop};
        o.stop_strings = stops;
        o.n_stop = 1;
        tk_gen_result *s = NULL;
        CHECK_RC(tk_generate(&s, m, ps, &lp, 1, &o), TK_OK);
        size_t n1 = 0, n2 = 0;
        tk_gen_result_ids(r, 0, &n1);
        tk_gen_result_ids(s, 0, &n2);
        CHECK_STR(tk_gen_result_end(s, 0), "stop_string");
        CHECK(n2 < n1);
        CHECK_CONTAINS(tk_gen_result_text(s, 0), stop);
        tk_gen_result_free(s);
        /* the same with beams */
        o.num_beams = 2;
        CHECK_RC(tk_generate(&s, m, ps, &lp, 1, &o), TK_OK);
        CHECK(s && strstr(tk_gen_result_text(s, 0), stop) ? !strcmp(tk_gen_result_end(s, 0), "stop_string")
                                                          : !strcmp(tk_gen_result_end(s, 0), "length"));
        tk_gen_result_free(s);
    }
    tk_gen_result_free(r);
    tk_model_free(m);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void test_defaults_from_generation_config(void)
{
    NEED_MODELS();
    char d[700], path[800], src[800];
    snprintf(d, sizeof d, "%s/gc", workdir);
    mkdir(d, 0755);
    const char *files[] = {"config.json", "model.safetensors", "tokenizer.json"};
    for (int i = 0; i < 3; i++) {
        snprintf(src, sizeof src, "%s/llama/%s", ckdir, files[i]);
        snprintf(path, sizeof path, "%s/%s", d, files[i]);
        unlink(path);
        CHECK(symlink(src, path) == 0);
    }
    snprintf(path, sizeof path, "%s/generation_config.json", d);
    write_file(path,
               "{\"do_sample\": true, \"top_k\": 7, \"top_p\": 0.8, \"temperature\": 0.5, \"eos_token_id\": [2, 5],"
               " \"max_new_tokens\": 9, \"num_beams\": 1, \"early_stopping\": \"never\", \"min_p\": null,"
               " \"pad_token_id\": 0, \"repetition_penalty\": 1.1}");
    tk_model *m = NULL;
    CHECK_RC(tk_model_load(&m, ctx, d, NULL), TK_OK);
    tk_gen_opts o = TK_GEN_OPTS_INIT;
    CHECK_RC(tk_gen_opts_from_model(&o, m), TK_OK);
    CHECK_EQ_INT(o.do_sample, 1);
    CHECK_EQ_INT(o.top_k, 7);
    CHECK(o.top_p == 0.8 && o.temperature == 0.5 && o.repetition_penalty == 1.1 && o.min_p == 0);
    CHECK_EQ_INT(o.n_eos, 2);
    CHECK(o.eos_token_id[0] == 2 && o.eos_token_id[1] == 5);
    CHECK_EQ_INT(o.max_new_tokens, 9);
    CHECK_EQ_INT(o.early_stopping, TK_GEN_EARLY_NEVER);
    CHECK_EQ_INT(o.pad_token_id, 0);
    tk_model_free(m);
    m = NULL;
    write_file(path, "{\"top_k\": \"seven\"}");
    CHECK_RC(tk_model_load(&m, ctx, d, NULL), TK_OK);
    tk_gen_opts o2 = TK_GEN_OPTS_INIT;
    CHECK_RC(tk_gen_opts_from_model(&o2, m), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "'top_k' is not an integer");
    tk_model_free(m);
}

static void test_bad_input(void)
{
    NEED_MODELS();
    tk_model *m = load("gpt2");
    if (!m)
        return;
    int32_t p[] = {0, 5};
    const int32_t *ps[] = {p};
    size_t lp = 2, l0 = 0;
    tk_gen_opts o = TK_GEN_OPTS_INIT;
    tk_gen_result *r = (tk_gen_result *)1;
    o.max_new_tokens = 4;
    CHECK_RC(tk_generate(&r, m, ps, &l0, 1, &o), TK_ERR_INVALID);
    CHECK(r == NULL);
    CHECK_CONTAINS(tk_last_error(), "prompt 0 is empty");
    CHECK_RC(tk_generate(&r, m, ps, &lp, 0, &o), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "no prompt");
    o.max_new_tokens = 0;
    CHECK_RC(tk_generate(&r, m, ps, &lp, 1, &o), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "max_new_tokens is 0");
    o.max_new_tokens = -1;
    o.max_length = 2;
    CHECK_RC(tk_generate(&r, m, ps, &lp, 1, &o), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "max_length 2 leaves no room");
    o = (tk_gen_opts)TK_GEN_OPTS_INIT;
    o.repetition_penalty = 0;
    CHECK_RC(tk_generate(&r, m, ps, &lp, 1, &o), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "repetition_penalty is 0");
    o = (tk_gen_opts)TK_GEN_OPTS_INIT;
    o.version = 99;
    CHECK_RC(tk_generate(&r, m, ps, &lp, 1, &o), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "TK_GEN_OPTS_INIT");
    o = (tk_gen_opts)TK_GEN_OPTS_INIT;
    o.kv_dtype = "f64"; /* an f32 model's cache holds f32, f16, bf16 (or i8 / fp8) */
    CHECK_RC(tk_generate(&r, m, ps, &lp, 1, &o), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "not a cache dtype");
    CHECK_CONTAINS(tk_last_error(), "(f32), f16, bf16, or i8 / fp8_e4m3");
    o.kv_dtype = "u8";
    CHECK_RC(tk_generate(&r, m, ps, &lp, 1, &o), TK_ERR_INVALID);
    CHECK(r == NULL);
    /* the model's own defaults, and NULL options */
    CHECK_RC(tk_generate(&r, m, ps, &lp, 1, NULL), TK_OK);
    size_t n = 0;
    tk_gen_result_ids(r, 0, &n);
    CHECK_EQ_INT(n, 20); /* neither length set: 20 new tokens, as transformers 5 */
    tk_gen_result_free(r);
    o = (tk_gen_opts)TK_GEN_OPTS_INIT;
    o.max_length = 12; /* the whole sequence */
    CHECK_RC(tk_generate(&r, m, ps, &lp, 1, &o), TK_OK);
    tk_gen_result_ids(r, 0, &n);
    CHECK_EQ_INT(n, 10);
    tk_gen_result_free(r);
    tk_model_free(m);
}

/* tk_models__tp_pick_cheaper costs a step's rows at the widest record the step sends (every row rides
 * in each round at the step's largest top-k, and in top-p's search rounds when any row uses top-p): a
 * greedy row alone picks on the ranks' columns, beside one top-p row the step gathers the rows. */
static void test_tp_pick_cost_is_the_steps(void)
{
    tk_model m;
    tk_models_tp tp;
    memset(&m, 0, sizeof m);
    memset(&tp, 0, sizeof tp);
    m.cfg.vocab = 101; /* 51 columns a rank: 204 bytes a row gathered */
    tp.world = 2;
    m.tp = &tp;
    tk_models_tp_pick rows[4];
    for (int i = 0; i < 4; i++)
        rows[i] = (tk_models_tp_pick){0, 0, 0, 0, 1.0, 0, NULL, 0};
    CHECK(tk_models__tp_pick_cheaper(&m, rows, 4)); /* greedy: 24 bytes a row */
    rows[3].sample = 1;
    rows[3].top_p = 0.9; /* its search alone sends more than a row */
    CHECK(!tk_models__tp_pick_cheaper(&m, rows + 3, 1));
    CHECK(!tk_models__tp_pick_cheaper(&m, rows, 4));
    m.cfg.vocab = 128256; /* a large vocabulary: the search pays for itself even for the greedy rows */
    CHECK(tk_models__tp_pick_cheaper(&m, rows, 4));
    /* two rows each cheaper alone, not together: 4000 bytes a row gathered (V 2000), top-p's 11 search
     * rounds (2912 bytes) and a top-k of 200 (1640 bytes) make a record of 4512 bytes for both */
    m.cfg.vocab = 2000;
    rows[2] = (tk_models_tp_pick){1, 200, 0, 0, 1.0, 0, NULL, 0};
    CHECK(tk_models__tp_pick_cheaper(&m, rows + 2, 1));
    CHECK(tk_models__tp_pick_cheaper(&m, rows + 3, 1));
    CHECK(!tk_models__tp_pick_cheaper(&m, rows + 2, 2));
}

int main(void)
{
    RUN(test_tp_pick_cost_is_the_steps);
    RUN(test_processors_match_transformers);
    RUN(test_softmax_sums_split_exactly);
    RUN(test_kv_cache_matches_full_recompute);
    RUN(test_quantised_kv_cache);
    RUN(test_weight_quantisation);
    RUN(test_batch_equals_one_at_a_time);
    RUN(test_result_logprobs);
    RUN(test_sampling_seeded_and_distributed);
    RUN(test_streaming_never_splits_utf8);
    RUN(test_stop_strings_and_end_reasons);
    RUN(test_defaults_from_generation_config);
    RUN(test_bad_input);
    tk_ctx_free(ctx);
    if (workdir[0]) {
        char cmd[700];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", workdir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", workdir);
    }
    return th_done();
}
