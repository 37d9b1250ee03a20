/*
 * test_diffusion_lm.c — tk_diffusion_generate through the C API, on the tiny checkpoints of
 * tests/models/dllm_oracle.py make (a Llama, the same weights in LLaDA's layout, a Qwen2 in Dream's):
 * which sampler a checkpoint asks for, tk_generate refusing a diffusion LM, the model's attention
 * causal again after a --bidirectional run, seeded determinism, the step callback (and stopping from
 * it), an injected draw source and its failure, and bad options. The samplers themselves are checked
 * against the published ones in tests/cli/diffusion_lm.sh. Without the venv the tests skip, and fail
 * when CI is set.
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

int main(void)
{
    RUN(test_kinds_and_tk_generate_refuses);
    RUN(test_bidirectional_run_leaves_the_model_causal);
    RUN(test_seed_callback_and_draws);
    RUN(test_bad_options);
    tk_ctx_free(ctx);
    if (workdir[0]) {
        char cmd[700];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", workdir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", workdir);
    }
    return th_done();
}
