/*
 * test_diffusion_lm.c — tk_diffusion_generate through the C API, on the tiny checkpoints of
 * tests/models/dllm_oracle.py make (a Llama, the same weights in LLaDA's layout, a Qwen2 in Dream's):
 * which sampler a checkpoint asks for, tk_generate refusing a diffusion LM, the model's attention
 * causal again after a --bidirectional run, seeded determinism, the step callback (and stopping from
 * it), an injected draw source and its failure, and bad options. The samplers themselves are checked
 * against the published ones in tests/cli/diffusion_lm.sh. Then tk_diff_batch: LLaDA, Dream and block
 * diffusion (tests/models/bd_oracle.py make's tiny DiffusionGemma) sequences together, each equal to
 * itself alone, and the failures that stay with their sequence. Without the venv the tests skip, and
 * fail when CI is set.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "tk.h"

static char workdir[512];
static int ck_state; /* 0 not tried, 1 made, -1 failed */
static tk_ctx *ctx;

static int have_checkpoints(void)
{
    if (ck_state)
        return ck_state > 0;
    ck_state = -1;
    char py[600], cmd[1600];
    snprintf(py, sizeof py, "%s/bin/python", th_py_venv());
    if (access(py, X_OK) != 0)
        return 0;
    snprintf(workdir, sizeof workdir, "%s/tk-test-dllm-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(workdir))
        return 0;
    snprintf(cmd, sizeof cmd, "'%s' tests/models/dllm_oracle.py make '%s/ck' >/dev/null 2>&1", py, workdir);
    if (system(cmd) != 0) {
        fprintf(stderr, "dllm_oracle.py make failed: %s\n", cmd);
        return 0;
    }
    tk_ctx_opts co = TK_CTX_OPTS_INIT;
    char home[600];
    snprintf(home, sizeof home, "%s/home", workdir);
    co.home = home;
    co.offline = 1;
    if (tk_ctx_new(&ctx, &co) != TK_OK)
        return 0;
    ck_state = 1;
    return 1;
}

#define NEED_MODELS()                                                                                                  \
    do {                                                                                                               \
        if (!have_checkpoints()) {                                                                                     \
            if (getenv("CI") && strcmp(getenv("CI"), "true") == 0) {                                                   \
                CHECK(!"could not make the tiny checkpoints (CI=true: a missing oracle fails)");                       \
                return;                                                                                                \
            }                                                                                                          \
            SKIP("no python venv with torch and transformers (scripts/setup.sh --test)");                              \
        }                                                                                                              \
    } while (0)

static tk_model *load(const char *kind)
{
    char d[600];
    snprintf(d, sizeof d, "%s/ck/%s", workdir, kind);
    tk_model *m = NULL;
    CHECK_RC(tk_model_load(&m, ctx, d, NULL), TK_OK);
    return m;
}

static const int32_t prompt[] = {1, 40, 50, 60, 70};

static void test_kinds_and_tk_generate_refuses(void)
{
    NEED_MODELS();
    tk_model *ll = load("llama"), *la = load("llada"), *dr = load("dream");
    if (!ll || !la || !dr)
        goto done;
    CHECK_EQ_INT(tk_model_diffusion(ll), 0);
    CHECK_EQ_INT(tk_model_diffusion(la), TK_DIFF_LLADA);
    CHECK_EQ_INT(tk_model_diffusion(dr), TK_DIFF_DREAM);
    const int32_t *p = prompt;
    size_t n = 5;
    tk_gen_opts go = TK_GEN_OPTS_INIT;
    go.max_new_tokens = 2;
    for (int cache = 0; cache < 2; cache++) { /* with and without the KV cache */
        tk_gen_result *r = NULL;
        go.use_cache = cache;
        CHECK_RC(tk_generate(&r, la, &p, &n, 1, &go), TK_ERR_UNSUPPORTED);
        CHECK_CONTAINS(tk_last_error(), "masked diffusion LM");
        CHECK(r == NULL);
    }
done:
    tk_model_free(ll);
    tk_model_free(la);
    tk_model_free(dr);
}

static void test_bidirectional_run_leaves_the_model_causal(void)
{
    NEED_MODELS();
    tk_model *m = load("llama");
    if (!m)
        return;
    int64_t V = tk_model_vocab_size(m);
    size_t n = 5;
    float *a = malloc(sizeof(float) * 5 * (size_t)V), *b = malloc(sizeof(float) * 5 * (size_t)V);
    CHECK_RC(tk_model_forward(m, prompt, &n, 1, a, NULL), TK_OK);
    tk_diff_opts o = TK_DIFF_OPTS_INIT;
    o.bidirectional = 1;
    o.mask_token_id = 3;
    o.gen_length = 8;
    tk_diff_result *r = NULL;
    CHECK_RC(tk_diffusion_generate(&r, m, prompt, 5, &o), TK_OK);
    tk_diff_result_free(r);
    CHECK_RC(tk_model_forward(m, prompt, &n, 1, b, NULL), TK_OK);
    CHECK(memcmp(a, b, sizeof(float) * 5 * (size_t)V) == 0); /* causal again: the same logits */
    free(a);
    free(b);
    tk_model_free(m);
}

static int stop_after_first(void *user, const tk_diff_step *s)
{
    int *calls = user;
    (*calls)++;
    CHECK(s->len == 5 + 16 && s->prompt_len == 5 && s->mask_id == 3);
    CHECK(s->n_unmasked == 2); /* 16 over 8 steps */
    for (size_t i = 0; i < s->n_unmasked; i++)
        CHECK(s->unmasked[i] >= 5 && s->unmasked[i] < 13 && s->canvas[s->unmasked[i]] != 3); /* first block */
    return 1;
}

static int fail_draws(void *user, double *u, size_t n)
{
    (void)user;
    (void)u;
    (void)n;
    return TK_ERR_IO;
}

static void test_seed_callback_and_draws(void)
{
    NEED_MODELS();
    tk_model *m = load("llada");
    if (!m)
        return;
    tk_diff_opts o = TK_DIFF_OPTS_INIT;
    o.gen_length = 16;
    o.block_length = 8;
    o.steps = 8;
    o.temperature = 1.0;
    o.seed = 7;
    tk_diff_result *r1 = NULL, *r2 = NULL, *r3 = NULL;
    CHECK_RC(tk_diffusion_generate(&r1, m, prompt, 5, &o), TK_OK);
    CHECK_RC(tk_diffusion_generate(&r2, m, prompt, 5, &o), TK_OK);
    o.seed = 8;
    CHECK_RC(tk_diffusion_generate(&r3, m, prompt, 5, &o), TK_OK);
    size_t n1 = 0, n2 = 0, n3 = 0;
    const int32_t *i1 = tk_diff_result_ids(r1, &n1), *i2 = tk_diff_result_ids(r2, &n2),
                  *i3 = tk_diff_result_ids(r3, &n3);
    CHECK(n1 == 16 && n2 == 16 && n3 == 16);
    if (i1 && i2 && i3) {
        CHECK(memcmp(i1, i2, 16 * sizeof *i1) == 0);
        CHECK(memcmp(i1, i3, 16 * sizeof *i1) != 0);
        for (size_t i = 0; i < 16; i++)
            CHECK(i1[i] != 3); /* nothing left masked */
    }
    char *js = NULL;
    CHECK_RC(tk_diff_result_json(&js, r1), TK_OK);
    CHECK_CONTAINS(js, "\"forward_passes\":8");
    CHECK_CONTAINS(js, "\"end\":\"length\"");
    tk_free(js);
    tk_diff_result_free(r1);
    tk_diff_result_free(r2);
    tk_diff_result_free(r3);
    /* the callback stops it after the first step */
    int calls = 0;
    o.temperature = 0;
    o.on_step = stop_after_first;
    o.step_user = &calls;
    CHECK_RC(tk_diffusion_generate(&r1, m, prompt, 5, &o), TK_OK);
    CHECK_EQ_INT(calls, 1);
    CHECK_RC(tk_diff_result_json(&js, r1), TK_OK);
    CHECK_CONTAINS(js, "\"end\":\"callback\"");
    tk_free(js);
    const int32_t *ids = tk_diff_result_ids(r1, &n1);
    int masked = 0;
    for (size_t i = 0; ids && i < n1; i++)
        masked += ids[i] == 3;
    CHECK_EQ_INT(masked, 14);
    tk_diff_result_free(r1);
    /* a draw source that fails: its status, named */
    o.on_step = NULL;
    o.temperature = 0.5;
    o.rand = fail_draws;
    r1 = NULL;
    CHECK_RC(tk_diffusion_generate(&r1, m, prompt, 5, &o), TK_ERR_IO);
    CHECK_CONTAINS(tk_last_error(), "tk_diff_opts.rand");
    CHECK(r1 == NULL);
    tk_model_free(m);
}

static void test_bad_options(void)
{
    NEED_MODELS();
    tk_model *m = load("llada");
    if (!m)
        return;
    tk_diff_result *r = NULL;
    tk_diff_opts o = TK_DIFF_OPTS_INIT;
    o.version = 99;
    CHECK_RC(tk_diffusion_generate(&r, m, prompt, 5, &o), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "version");
    o = (tk_diff_opts)TK_DIFF_OPTS_INIT;
    CHECK_RC(tk_diffusion_generate(&r, m, prompt, 0, &o), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "empty");
    int32_t bad[] = {1, 100000};
    o.gen_length = 8;
    CHECK_RC(tk_diffusion_generate(&r, m, bad, 2, &o), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "outside the vocabulary");
    o.gen_length = 0;
    CHECK_RC(tk_diffusion_generate(&r, m, prompt, 5, &o), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "gen_length is 0");
    o = (tk_diff_opts)TK_DIFF_OPTS_INIT;
    o.gen_length = 8;
    o.sampler = 7;
    CHECK_RC(tk_diffusion_generate(&r, m, prompt, 5, &o), TK_ERR_INVALID);
    o.sampler = TK_DIFF_AUTO;
    o.temperature = -1;
    CHECK_RC(tk_diffusion_generate(&r, m, prompt, 5, &o), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "temperature");
    o.temperature = 0;
    o.alg = "nonsense";
    CHECK_RC(tk_diffusion_generate(&r, m, prompt, 5, &o), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "nonsense");
    CHECK(r == NULL);
    char *js = NULL;
    CHECK_RC(tk_diff_result_json(&js, NULL), TK_ERR_INVALID);
    CHECK(js == NULL);
    tk_diff_result_free(NULL);
    tk_model_free(m);
}

/* ---- tk_diff_batch: several sequences in lockstep, each as it runs alone ---------------------- */

typedef struct {
    const int32_t *prompt;
    size_t len;
    tk_diff_opts o;
} job;

static tk_diff_result *alone(tk_model *m, const job *j)
{
    tk_diff_result *r = NULL;
    CHECK_RC(tk_diffusion_generate(&r, m, j->prompt, j->len, &j->o), TK_OK);
    return r;
}

static double entropy_gap; /* block diffusion: the largest |batched - alone| mean entropy seen */

/* Two per_step arrays equal, except that block diffusion's mean entropies may differ by rounding: the
 * batched products run over more rows, and at a low temperature (t_min 0.05) the self-conditioning loop
 * amplifies it (job 2 below: up to 7e-4 batched, and 9e-5 between the cached path and TK_DGEMMA_CACHE=0
 * alone). They are compared to 1e-2 (a wrong cache or draw gives other accepted positions, and gaps of
 * 0.1 and more) and the gap is printed; the ids, accepted positions and stops must be equal. */
static int same_steps(const char *a, const char *b)
{
    static const char key[] = "\"mean_entropy\":";
    while (*a && *a == *b) {
        if (!strncmp(a, key, sizeof key - 1)) {
            char *ea, *eb;
            double x = strtod(a + sizeof key - 1, &ea), y = strtod(b + sizeof key - 1, &eb);
            double d = x > y ? x - y : y - x;
            entropy_gap = d > entropy_gap ? d : entropy_gap;
            if (!(d <= 1e-2))
                return 0;
            a = ea;
            b = eb;
            continue;
        }
        a++;
        b++;
    }
    return *a == *b;
}

/* The ids of r and want agree, and every step's record. */
static void check_same(const tk_diff_result *got, const tk_diff_result *want, const char *what)
{
    size_t n1 = 0, n2 = 0;
    const int32_t *a = tk_diff_result_ids(got, &n1), *b = tk_diff_result_ids(want, &n2);
    int same = a && b && n1 == n2 && memcmp(a, b, n1 * sizeof *a) == 0;
    if (!same)
        fprintf(stderr, "  %s: the batched ids differ from the sequence alone\n", what);
    CHECK(same);
    char *j1 = NULL, *j2 = NULL;
    CHECK_RC(tk_diff_result_json(&j1, got), TK_OK);
    CHECK_RC(tk_diff_result_json(&j2, want), TK_OK);
    const char *p1 = j1 ? strstr(j1, "\"per_step\"") : NULL, *p2 = j2 ? strstr(j2, "\"per_step\"") : NULL;
    same = p1 && p2 && same_steps(p1, p2); /* the same positions unmasked (accepted) at every step */
    if (!same && p1 && p2)
        fprintf(stderr, "  %s: batched %.300s\n  alone   %.300s\n", what, p1, p2);
    CHECK(same);
    tk_free(j1);
    tk_free(j2);
}

/* Runs jobs[0..n) in one batch, jobs[late..n) joining after `after` steps and jobs[cancel] (if >= 0)
 * cancelled after 2 steps; each result equal to the job alone. Returns the batch's steps. */
static int64_t run_batch(tk_model *m, const job *jobs, size_t n, size_t late, int64_t after, int cancel)
{
    tk_diff_batch *b = NULL;
    int64_t seq[16], step = 0;
    tk_diff_result *want[16] = {0};
    int seen[16] = {0};
    CHECK_RC(tk_diff_batch_new(&b, m), TK_OK);
    if (!b)
        return 0;
    for (size_t i = 0; i < n; i++)
        want[i] = alone(m, &jobs[i]);
    for (size_t i = 0; i < late; i++)
        CHECK_RC(tk_diff_batch_add(&seq[i], b, jobs[i].prompt, jobs[i].len, &jobs[i].o), TK_OK);
    while (tk_diff_batch_active(b) || step <= after) {
        if (step == after)
            for (size_t i = late; i < n; i++)
                CHECK_RC(tk_diff_batch_add(&seq[i], b, jobs[i].prompt, jobs[i].len, &jobs[i].o), TK_OK);
        if (step == 2 && cancel >= 0) {
            CHECK_RC(tk_diff_batch_cancel(b, seq[cancel]), TK_OK);
            CHECK_RC(tk_diff_batch_cancel(b, seq[cancel]), TK_ERR_NOT_FOUND);
        }
        const tk_diff_event *ev = NULL;
        size_t nev = 0;
        int rc = tk_diff_batch_step(b, &ev, &nev);
        CHECK_RC(rc, TK_OK);
        if (rc != TK_OK)
            break;
        step++;
        for (size_t e = 0; e < nev; e++)
            for (size_t i = 0; i < n; i++)
                if (seq[i] == ev[e].seq && (i < late || step > after)) {
                    CHECK_EQ_INT(ev[e].status, TK_OK);
                    char what[64];
                    snprintf(what, sizeof what, "job %zu", i);
                    check_same(ev[e].result, want[i], what);
                    seen[i]++;
                }
    }
    for (size_t i = 0; i < n; i++)
        CHECK_EQ_INT(seen[i], (int)i == cancel ? 0 : 1);
    tk_diff_batch_stats st;
    CHECK_RC(tk_diff_batch_stats_get(&st, b), TK_OK);
    CHECK(st.active == 0 && st.steps == step);
    for (size_t i = 0; i < n; i++)
        tk_diff_result_free(want[i]);
    tk_diff_batch_free(b);
    return step;
}

static const int32_t prompt2[] = {1, 90, 91, 92, 93, 94, 95, 96, 97};

static void test_batch_equals_alone_llada(void)
{
    NEED_MODELS();
    tk_model *m = load("llada");
    if (!m)
        return;
    job jobs[7];
    for (int i = 0; i < 7; i++) {
        jobs[i] = (job){i % 2 ? prompt2 : prompt, i % 2 ? 9 : 5, TK_DIFF_OPTS_INIT};
        jobs[i].o.gen_length = 16;
        jobs[i].o.block_length = 8;
        jobs[i].o.steps = 8;
    }
    jobs[1].o.temperature = 0.7, jobs[1].o.seed = 3;          /* seeded sampling */
    jobs[2].o.cfg_scale = 1.5, jobs[2].o.gen_length = 24;     /* cfg: two canvases in the forward */
    jobs[2].o.steps = 12;
    jobs[3].o.cfg_scale = 1.0, jobs[3].o.temperature = 1.0, jobs[3].o.seed = 5;
    jobs[4].o.remasking = 1, jobs[4].o.seed = 9, jobs[4].o.gen_length = 32; /* random remasking, 4 blocks */
    jobs[4].o.steps = 16;
    jobs[5].o.gen_length = 8, jobs[5].o.block_length = 0, jobs[5].o.steps = 4; /* ends first */
    jobs[6].o.temperature = 0.5, jobs[6].o.seed = 3, jobs[6].o.steps = 16;
    /* all at once: as many steps as the longest; then some joining late, one cancelled */
    CHECK_EQ_INT((int)run_batch(m, jobs, 7, 7, 0, -1), 16);
    CHECK(run_batch(m, jobs, 7, 3, 5, 1) > 16);
    run_batch(m, jobs, 4, 4, 0, 2);
    tk_model_free(m);
}

static void test_batch_equals_alone_dream(void)
{
    NEED_MODELS();
    tk_model *m = load("dream");
    if (!m)
        return;
    static const char *algs[] = {"origin", "maskgit_plus", "topk_margin", "entropy"};
    job jobs[8];
    for (int i = 0; i < 8; i++) {
        jobs[i] = (job){i % 2 ? prompt2 : prompt, i % 2 ? 9 : 5, TK_DIFF_OPTS_INIT};
        jobs[i].o.gen_length = 12 + 4 * (i % 3);
        jobs[i].o.steps = 6 + i % 3;
        jobs[i].o.alg = algs[i % 4];
        if (i >= 4)
            jobs[i].o.temperature = 0.9, jobs[i].o.seed = (uint64_t)i, jobs[i].o.alg_temp = i == 5 ? 0.5 : 0;
    }
    jobs[7].o.top_p = 0.9, jobs[7].o.top_k = 20;
    run_batch(m, jobs, 8, 8, 0, -1);
    run_batch(m, jobs, 8, 4, 3, 1);
    tk_model_free(m);
}

static int stop_first(void *user, const tk_diff_step *s)
{
    (void)s;
    return ++*(int *)user >= 1;
}

/* A sequence's callback, failing draws or bad options touch that sequence only; a causal checkpoint's
 * rules hold (block diffusion's: test_block_batch_failures_stay_with_their_sequence). */
static void test_batch_failures_stay_with_their_sequence(void)
{
    NEED_MODELS();
    tk_model *m = load("llada"), *ll = load("llama");
    tk_diff_batch *b = NULL;
    if (!m || !ll)
        goto done;
    CHECK_RC(tk_diff_batch_new(&b, m), TK_OK);
    tk_diff_opts o = TK_DIFF_OPTS_INIT, stop = TK_DIFF_OPTS_INIT, bad = TK_DIFF_OPTS_INIT;
    o.gen_length = stop.gen_length = bad.gen_length = 16;
    o.steps = stop.steps = bad.steps = 8;
    int calls = 0;
    stop.on_step = stop_first;
    stop.step_user = &calls;
    bad.temperature = 0.5;
    bad.rand = fail_draws;
    int64_t s0, s1, s2, s3;
    CHECK_RC(tk_diff_batch_add(&s0, b, prompt, 5, &o), TK_OK);
    CHECK_RC(tk_diff_batch_add(&s1, b, prompt, 5, &stop), TK_OK);
    CHECK_RC(tk_diff_batch_add(&s2, b, prompt, 5, &bad), TK_OK);
    o.gen_length = 12; /* refused at once, naming it; the batch unchanged */
    o.block_length = 8;
    CHECK_RC(tk_diff_batch_add(&s3, b, prompt, 5, &o), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "gen_length 12 is not a multiple of block_length 8");
    CHECK_EQ_INT((int)tk_diff_batch_active(b), 3);
    const tk_diff_event *ev = NULL;
    size_t nev = 0;
    CHECK_RC(tk_diff_batch_step(b, &ev, &nev), TK_OK);
    CHECK_EQ_INT((int)nev, 2);
    CHECK_CONTAINS(tk_last_error(), "tk_diff_opts.rand");
    for (size_t i = 0; i < nev; i++) {
        if (ev[i].seq == s1) {
            char *js = NULL;
            CHECK(ev[i].status == TK_OK && ev[i].result);
            CHECK_RC(tk_diff_result_json(&js, ev[i].result), TK_OK);
            CHECK_CONTAINS(js, "\"end\":\"callback\"");
            tk_free(js);
        } else {
            CHECK(ev[i].seq == s2 && ev[i].status == TK_ERR_IO && !ev[i].result);
            CHECK_CONTAINS(ev[i].error, "tk_diff_opts.rand");
        }
    }
    CHECK_EQ_INT((int)tk_diff_batch_active(b), 1);
    while (tk_diff_batch_active(b) && tk_diff_batch_step(b, &ev, &nev) == TK_OK)
        ;
    CHECK(nev == 1 && ev[0].seq == s0 && ev[0].status == TK_OK && *ev[0].error == '\0');
    tk_diff_batch_free(b);
    b = NULL;
    /* a causal checkpoint: its sequences must ask for bidirectional attention, and leave it causal */
    CHECK_RC(tk_diff_batch_new(&b, ll), TK_OK);
    o.gen_length = 16;
    o.block_length = 0;
    o.mask_token_id = 3;
    CHECK_RC(tk_diff_batch_add(&s0, b, prompt, 5, &o), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "bidirectional");
    o.bidirectional = 1;
    CHECK_RC(tk_diff_batch_add(&s0, b, prompt, 5, &o), TK_OK);
    CHECK_RC(tk_diff_batch_step(b, &ev, &nev), TK_OK);
    CHECK_RC(tk_diff_batch_step(NULL, &ev, &nev), TK_ERR_INVALID);
    CHECK_RC(tk_diff_batch_new(NULL, ll), TK_ERR_INVALID);
done:
    tk_diff_batch_free(b);
    tk_model_free(m);
    tk_model_free(ll);
}

/* ---- block diffusion (DiffusionGemma) in a tk_diff_batch ------------------------------------- */

static int bd_state; /* 0 not tried, 1 made, -1 failed */

/* tests/models/bd_oracle.py make's tiny DiffusionGemma (canvas_length 6, sliding window 4) in
 * workdir/bd, and the same with eos_token_id 87 (a token it often picks) and pad 0 in workdir/bd-eos */
static int have_bd(void)
{
    if (bd_state)
        return bd_state > 0;
    bd_state = -1;
    if (!have_checkpoints())
        return 0;
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "'%s/bin/python' tests/models/bd_oracle.py make '%s/ck/bd' >/dev/null 2>&1 && cp -r '%s/ck/bd' "
             "'%s/ck/bd-eos' && printf '{\"eos_token_id\": 87, \"pad_token_id\": 0}' "
             ">'%s/ck/bd-eos/generation_config.json'",
             th_py_venv(), workdir, workdir, workdir, workdir);
    if (system(cmd) != 0) {
        fprintf(stderr, "bd_oracle.py make failed: %s\n", cmd);
        return 0;
    }
    bd_state = 1;
    return 1;
}

#define NEED_BD()                                                                                                      \
    do {                                                                                                               \
        if (!have_bd()) {                                                                                              \
            if (getenv("CI") && strcmp(getenv("CI"), "true") == 0) {                                                   \
                CHECK(!"could not make the tiny DiffusionGemma (CI=true: a missing oracle fails)");                    \
                return;                                                                                                \
            }                                                                                                          \
            SKIP("no python venv with transformers' DiffusionGemma (scripts/setup.sh --test)");                        \
        }                                                                                                              \
    } while (0)

static const int32_t bd_p1[] = {5}, bd_p3[] = {5, 17, 99}, bd_p4[] = {5, 17, 99, 3},
                     bd_p9[] = {5, 17, 99, 3, 250, 7, 8, 9, 10};

/* A job of block diffusion: prompt, gen_length, steps, seed; the sampler's options left to the caller */
static job bd_job(const int32_t *p, size_t n, int64_t gen, int64_t steps, uint64_t seed)
{
    job j = {p, n, TK_DIFF_OPTS_INIT};
    j.o.gen_length = gen;
    j.o.steps = steps;
    j.o.seed = seed;
    return j;
}

/* the forward passes a result reports */
static int64_t forwards_of(const tk_diff_result *r)
{
    char *js = NULL;
    int64_t f = -1;
    if (tk_diff_result_json(&js, r) == TK_OK && strstr(js, "\"forward_passes\":"))
        f = strtoll(strstr(js, "\"forward_passes\":") + 17, NULL, 10);
    tk_free(js);
    return f;
}

/* Sequences of different prompts (one past the sliding window), lengths (1 to 5 blocks), steps, seeds
 * and sampler options, stopping early and not, in one batch: each equals itself alone (ids, every step's
 * accepted positions, mean entropy and stop), all at once in as many steps as the longest, then joining
 * late with one cancelled; then the same with TK_DGEMMA_CACHE=0 (every step encodes its whole prefix). */
static void test_block_batch_equals_alone(void)
{
    NEED_BD();
    tk_model *m = load("bd");
    if (!m)
        return;
    CHECK_EQ_INT(tk_model_diffusion(m), TK_DIFF_BLOCK);
    job jobs[6] = {bd_job(bd_p3, 3, 12, 6, 5), bd_job(bd_p4, 4, 18, 10, 1), bd_job(bd_p9, 9, 30, 8, 2),
                   bd_job(bd_p1, 1, 6, 20, 3), bd_job(bd_p1, 1, 7, 5, 4),   bd_job(bd_p9, 9, 12, 4, 9)};
    jobs[1].o.entropy_bound = 3.0;
    jobs[2].o.entropy_bound = 1.5, jobs[2].o.t_min = 0.05, jobs[2].o.t_max = 0.3;
    jobs[2].o.confidence_threshold = 2.0;
    jobs[3].o.entropy_bound = 0.5, jobs[3].o.t_min = 0.01, jobs[3].o.t_max = 0.1;
    jobs[3].o.confidence_threshold = 1.0, jobs[3].o.stability_threshold = 2; /* stops its block early */
    jobs[4].o.stability_threshold = 0, jobs[4].o.confidence_threshold = 4.3;
    int64_t longest = 0, sum = 0;
    for (int i = 0; i < 6; i++) {
        tk_diff_result *r = alone(m, &jobs[i]);
        int64_t f = forwards_of(r);
        longest = f > longest ? f : longest;
        sum += f;
        tk_diff_result_free(r);
    }
    CHECK_EQ_INT((int)run_batch(m, jobs, 6, 6, 0, -1), (int)longest); /* every step advanced them all */
    CHECK(longest < sum);
    CHECK(run_batch(m, jobs, 6, 3, 4, 1) > 4);
    setenv("TK_DGEMMA_CACHE", "0", 1);
    run_batch(m, jobs, 6, 4, 2, 0);
    unsetenv("TK_DGEMMA_CACHE");
    printf("  block diffusion: batched mean entropies within %.1e of each sequence alone\n", entropy_gap);
    tk_model_free(m);
}

/* u = 0.5 until the call numbered fail (1-based) fails */
static int draws_until(void *user, double *u, size_t n)
{
    int *left = user;
    if (--*left == 0)
        return TK_ERR_IO;
    for (size_t i = 0; i < n; i++)
        u[i] = 0.5;
    return TK_OK;
}

/* A sequence that ends at its eos, one its callback stops, and draws failing before a step (its block's
 * first canvas) and after one (its sampled tokens) each end that sequence alone, with its status; bad
 * options are refused at once; the others go on and equal themselves alone. */
static void test_block_batch_failures_stay_with_their_sequence(void)
{
    NEED_BD();
    tk_model *m = load("bd-eos");
    tk_diff_batch *b = NULL;
    if (!m)
        return;
    job eos = bd_job(bd_p3, 3, 18, 6, 3), full = bd_job(bd_p3, 3, 18, 6, 2);
    tk_diff_result *want_eos = alone(m, &eos), *want_full = alone(m, &full);
    char *js = NULL;
    CHECK_RC(tk_diff_result_json(&js, want_eos), TK_OK);
    CHECK_CONTAINS(js, "\"end\":\"eos\""); /* seed 3 picks 87 in its first block */
    tk_free(js);
    CHECK_RC(tk_diff_batch_new(&b, m), TK_OK);
    if (!b)
        goto done;
    tk_diff_opts stop = TK_DIFF_OPTS_INIT, bad1 = TK_DIFF_OPTS_INIT, bad2 = TK_DIFF_OPTS_INIT, bad = TK_DIFF_OPTS_INIT;
    int calls = 0, left1 = 1, left2 = 2;
    stop.gen_length = bad1.gen_length = bad2.gen_length = 12;
    stop.on_step = stop_first, stop.step_user = &calls;
    bad1.rand = draws_until, bad1.rand_user = &left1; /* fails drawing its first canvas */
    bad2.rand = draws_until, bad2.rand_user = &left2; /* fails drawing the first step's samples */
    int64_t se, sf, ss, s1, s2, sx;
    CHECK_RC(tk_diff_batch_add(&se, b, eos.prompt, eos.len, &eos.o), TK_OK);
    CHECK_RC(tk_diff_batch_add(&ss, b, bd_p1, 1, &stop), TK_OK);
    CHECK_RC(tk_diff_batch_add(&s1, b, bd_p4, 4, &bad1), TK_OK);
    CHECK_RC(tk_diff_batch_add(&sf, b, full.prompt, full.len, &full.o), TK_OK);
    CHECK_RC(tk_diff_batch_add(&s2, b, bd_p9, 9, &bad2), TK_OK);
    bad.cfg_scale = 1.0; /* refused at once, naming it; the batch unchanged */
    CHECK_RC(tk_diff_batch_add(&sx, b, bd_p1, 1, &bad), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "cfg_scale");
    bad.cfg_scale = 0, bad.gen_length = 300;
    CHECK_RC(tk_diff_batch_add(&sx, b, bd_p1, 1, &bad), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "longer than the model's context of 256");
    bad.gen_length = 6, bad.sampler = TK_DIFF_LLADA;
    CHECK_RC(tk_diff_batch_add(&sx, b, bd_p1, 1, &bad), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "block diffusion checkpoint");
    CHECK_EQ_INT((int)tk_diff_batch_active(b), 5);
    const tk_diff_event *ev = NULL;
    size_t nev = 0;
    CHECK_RC(tk_diff_batch_step(b, &ev, &nev), TK_OK);
    CHECK_EQ_INT((int)nev, 3);
    CHECK_CONTAINS(tk_last_error(), "tk_diff_opts.rand");
    for (size_t i = 0; i < nev; i++) {
        if (ev[i].seq == ss) {
            CHECK(ev[i].status == TK_OK && ev[i].result);
            CHECK_RC(tk_diff_result_json(&js, ev[i].result), TK_OK);
            CHECK_CONTAINS(js, "\"end\":\"callback\"");
            tk_free(js);
        } else {
            CHECK((ev[i].seq == s1 || ev[i].seq == s2) && ev[i].status == TK_ERR_IO && !ev[i].result);
            CHECK_CONTAINS(ev[i].error, "tk_diff_opts.rand");
        }
    }
    tk_diff_batch_stats st;
    CHECK_RC(tk_diff_batch_stats_get(&st, b), TK_OK);
    CHECK(st.steps == 1 && st.step_sequences == 4 && st.active == 2); /* s1 sat the step out */
    int seen = 0;
    while (tk_diff_batch_active(b) && tk_diff_batch_step(b, &ev, &nev) == TK_OK)
        for (size_t i = 0; i < nev; i++) {
            CHECK(ev[i].status == TK_OK);
            check_same(ev[i].result, ev[i].seq == se ? want_eos : want_full, ev[i].seq == se ? "eos" : "full");
            seen += ev[i].seq == se ? 1 : 10;
        }
    CHECK_EQ_INT(seen, 11);
done:
    tk_diff_result_free(want_eos);
    tk_diff_result_free(want_full);
    tk_diff_batch_free(b);
    tk_model_free(m);
}

int main(void)
{
    RUN(test_kinds_and_tk_generate_refuses);
    RUN(test_bidirectional_run_leaves_the_model_causal);
    RUN(test_seed_callback_and_draws);
    RUN(test_bad_options);
    RUN(test_batch_equals_alone_llada);
    RUN(test_batch_equals_alone_dream);
    RUN(test_batch_failures_stay_with_their_sequence);
    RUN(test_block_batch_equals_alone);
    RUN(test_block_batch_failures_stay_with_their_sequence);
    tk_ctx_free(ctx);
    if (workdir[0]) {
        char cmd[700];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", workdir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", workdir);
    }
    return th_done();
}
