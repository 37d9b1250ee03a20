/*
 * test_models.c — the model API (tk_model_*) and the safetensors parser, without Python: a small
 * LlamaForCausalLM checkpoint is written here (config.json + model.safetensors with deterministic
 * weights). What transformers computes on real checkpoints is tests/cli/models.sh's job; this file
 * checks the API's contracts: *out NULL on failure, errors that name things, a model that stays
 * usable after a failed call, plans reused and replanned across batch shapes, batching that does not
 * change a sequence's rows, and the parser's refusals.
 */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fuzz/fuzz_safetensors.c" /* LLVMFuzzerTestOneInput, replayed below */
#include "harness.h"
#include "models/models.h"
#include "tk.h"

enum { V = 48, H = 32, I = 40, L = 2, NH = 4, NKV = 2, D = H / NH };

static char dir[256];
static tk_ctx *ctx;

/* ---- a checkpoint written by hand ------------------------------------------------------------- */

typedef struct {
    const char *name;
    int64_t r, c; /* c == 0: 1-D */
} spec;

static int write_checkpoint(const char *d, const char *dtype_in_config)
{
    spec s[64];
    int n = 0;
    s[n++] = (spec){"lm_head.weight", V, H};
    s[n++] = (spec){"model.embed_tokens.weight", V, H};
    s[n++] = (spec){"model.norm.weight", H, 0};
    static char names[L][9][96];
    static const char *suf[9] = {"input_layernorm.weight",  "post_attention_layernorm.weight",
                                 "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                 "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                                 "mlp.gate_proj.weight",    "mlp.up_proj.weight",
                                 "mlp.down_proj.weight"};
    int64_t rows[9] = {H, H, NH * D, NKV * D, NKV * D, H, I, I, H}, cols[9] = {0, 0, H, H, H, NH * D, H, H, I};
    for (int l = 0; l < L; l++)
        for (int k = 0; k < 9; k++) {
            snprintf(names[l][k], sizeof names[l][k], "model.layers.%d.%s", l, suf[k]);
            s[n++] = (spec){names[l][k], rows[k], cols[k]};
        }
    char *hdr = malloc(1 << 16), path[512];
    size_t off = 0, hl = (size_t)snprintf(hdr, 1 << 16, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n; i++) {
        size_t bytes = (size_t)(s[i].r * (s[i].c ? s[i].c : 1)) * 4;
        if (s[i].c)
            hl += (size_t)snprintf(hdr + hl, (1 << 16) - hl,
                                   ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld,%lld],"
                                   "\"data_offsets\":[%zu,%zu]}",
                                   s[i].name, (long long)s[i].r, (long long)s[i].c, off, off + bytes);
        else
            hl += (size_t)snprintf(hdr + hl, (1 << 16) - hl,
                                   ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld],\"data_offsets\":[%zu,%zu]}", s[i].name,
                                   (long long)s[i].r, off, off + bytes);
        off += bytes;
    }
    hl += (size_t)snprintf(hdr + hl, (1 << 16) - hl, "}");
    while (hl % 8)
        hdr[hl++] = ' ';
    mkdir(d, 0755);
    snprintf(path, sizeof path, "%s/model.safetensors", d);
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    uint64_t h64 = hl;
    fwrite(&h64, 8, 1, f);
    fwrite(hdr, 1, hl, f);
    uint32_t x = 12345;
    for (int i = 0; i < n; i++) {
        int64_t cnt = s[i].r * (s[i].c ? s[i].c : 1);
        int norm = strstr(s[i].name, "norm") != NULL;
        for (int64_t k = 0; k < cnt; k++) {
            x = x * 1664525u + 1013904223u;
            float v = ((float)(x >> 8) / 16777216.0f - 0.5f) * 0.6f;
            if (norm)
                v = 1.0f + v / 3;
            fwrite(&v, 4, 1, f);
        }
    }
    fclose(f);
    free(hdr);
    snprintf(path, sizeof path, "%s/config.json", d);
    f = fopen(path, "w");
    if (!f)
        return -1;
    fprintf(f,
            "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": %d, "
            "\"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": %d, "
            "\"num_key_value_heads\": %d, \"rms_norm_eps\": 1e-5, \"max_position_embeddings\": 64, "
            "\"rope_theta\": 10000.0, \"dtype\": \"%s\"}\n",
            V, H, I, L, NH, NKV, dtype_in_config);
    fclose(f);
    return 0;
}

static float max_diff(const float *a, const float *b, size_t n)
{
    float m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmaxf(m, fabsf(a[i] - b[i]));
    return m;
}

/* ---- the API ---------------------------------------------------------------------------------- */

static void test_load_errors(void)
{
    tk_model *m = (tk_model *)1;
    CHECK_RC(tk_model_load(&m, NULL, dir, NULL), TK_ERR_INVALID);
    CHECK(m == NULL);
    m = (tk_model *)1;
    CHECK_RC(tk_model_load(&m, ctx, "/nonexistent/model", NULL), TK_ERR_NOT_FOUND);
    CHECK(m == NULL);
    tk_model_opts o = TK_MODEL_OPTS_INIT;
    o.version = 99;
    CHECK_RC(tk_model_load(&m, ctx, dir, &o), TK_ERR_INVALID);
    o = (tk_model_opts)TK_MODEL_OPTS_INIT;
    o.dtype = "f64";
    CHECK_RC(tk_model_load(&m, ctx, dir, &o), TK_ERR_INVALID);
    CHECK(strstr(tk_last_error(), "f32, bf16, f16") != NULL);
    CHECK(m == NULL);
    tk_model_free(NULL);
}

/* tk_model_opts version 1 (before the communicator) still loads; a communicator of one rank (no mpirun)
 * gives an ordinary model but checks the plan file it is given. The split itself runs under mpirun:
 * tests/cli/tp_models.sh. */
static void test_opts_v1_and_one_rank_comm(void)
{
    tk_model *m = NULL;
    tk_model_opts o = TK_MODEL_OPTS_INIT;
    int32_t ids[3] = {1, 7, 9};
    size_t len = 3;
    float a[3 * V], b[3 * V];
    o.version = 1;
    o.comm = (tk_comm *)1; /* past a version-1 struct: never read */
    CHECK_RC(tk_model_load(&m, ctx, dir, &o), TK_OK);
    CHECK_RC(tk_model_forward(m, ids, &len, 1, a, NULL), TK_OK);
    tk_model_free(m);
    m = NULL;
    tk_comm *c = NULL;
    tk_comm_opts co = TK_COMM_OPTS_INIT;
    co.backend = TK_COMM_SELF;
    CHECK_RC(tk_comm_new(&c, &co), TK_OK);
    o = (tk_model_opts)TK_MODEL_OPTS_INIT;
    o.comm = c;
    o.tp_plan = "/nonexistent/plan.json";
    CHECK_RC(tk_model_load(&m, ctx, dir, &o), TK_ERR_NOT_FOUND);
    CHECK(m == NULL && strstr(tk_last_error(), "/nonexistent/plan.json") != NULL);
    char plan[300];
    snprintf(plan, sizeof plan, "%s/bad_plan.json", dir);
    FILE *f = fopen(plan, "w");
    CHECK(f != NULL);
    if (f) {
        fputs("{\"model.layers.*.mlp.up_proj\": \"colwize\"}", f);
        fclose(f);
    }
    o.tp_plan = plan;
    CHECK_RC(tk_model_load(&m, ctx, dir, &o), TK_ERR_INVALID);
    CHECK(m == NULL && strstr(tk_last_error(), "'colwize'") != NULL);
    o.tp_plan = NULL; /* transformers' default plan for llama, on one rank: the whole model */
    CHECK_RC(tk_model_load(&m, ctx, dir, &o), TK_OK);
    CHECK_RC(tk_model_forward(m, ids, &len, 1, b, NULL), TK_OK);
    CHECK(max_diff(a, b, 3 * V) == 0.0f);
    tk_model_free(m);
    tk_comm_free(c);
}

/* The bytes of one "key": N field of tk_model_info_json (-1: absent) */
static long long info_field(tk_model *m, const char *key)
{
    char *js = NULL, pat[64];
    long long v = -1;
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    if (tk_model_info_json(&js, m) == TK_OK && js && strstr(js, pat))
        v = atoll(strstr(js, pat) + strlen(pat));
    tk_free(js);
    return v;
}

/* CPU weights stored in the compute dtype: copied into huge pages by default, views of the mapping
 * with map_weights (or TK_MAP_WEIGHTS=1); the same logits either way. A version-2 struct (no
 * map_weights) gets the default. */
static void test_map_weights(void)
{
    int32_t ids[5] = {1, 7, 9, 3, 2};
    size_t len = 5;
    float a[5 * V], b[5 * V];
    long long wb = -1, as_stored = -1;
    for (int mode = 0; mode < 4; mode++) { /* default, map_weights, TK_MAP_WEIGHTS=1, version 2 */
        tk_model *m = NULL;
        tk_model_opts o = TK_MODEL_OPTS_INIT;
        o.map_weights = mode == 1;
        if (mode == 3) {
            o.version = 2;
            o.map_weights = 1; /* past a version-2 struct: never read */
        }
        if (mode == 2)
            setenv("TK_MAP_WEIGHTS", "1", 1);
        CHECK_RC(tk_model_load(&m, ctx, dir, &o), TK_OK);
        unsetenv("TK_MAP_WEIGHTS");
        if (!m)
            continue;
        CHECK_RC(tk_model_forward(m, ids, &len, 1, mode ? b : a, NULL), TK_OK);
        if (mode)
            CHECK(max_diff(a, b, 5 * V) == 0.0f);
        long long mapped = info_field(m, "mapped_bytes"), huge = info_field(m, "hugepage_bytes");
        if (mode == 0) { /* the weights stored in f32 (some of the test checkpoint's are converted) */
            wb = info_field(m, "weight_bytes");
            as_stored = huge;
        }
        CHECK(wb > 0 && info_field(m, "weight_bytes") == wb && as_stored > 0 && as_stored <= wb);
        if (mode == 1 || mode == 2)
            CHECK(mapped == as_stored && huge == 0);
        else
            CHECK(mapped == 0 && huge == as_stored);
        tk_model_free(m);
    }
}

/* The process's virtual size in bytes (/proc/self/status VmSize), or -1 */
static long long vm_size(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmSize:", 7))
            kb = atoll(line + 7);
    if (f)
        fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

/* Out of memory for the huge-page copies (a child process whose address space is capped at 32 MiB
 * above its size: a copy chunk reserves 64 MiB): TK_ERR_NOMEM naming the tensor, with TK_MAP_WEIGHTS as
 * the hint; with map_weights the same load succeeds under the same cap. */
static void test_map_weights_out_of_memory(void)
{
#if defined(__SANITIZE_ADDRESS__)
    SKIP("AddressSanitizer maps its shadow memory as it goes: an address-space cap breaks it");
#endif
    long long vm = vm_size();
    if (vm < 0)
        SKIP("no /proc/self/status");
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        struct rlimit rl = {(rlim_t)(vm + (32ll << 20)), (rlim_t)(vm + (32ll << 20))};
        int bad = setrlimit(RLIMIT_AS, &rl) != 0;
        tk_model *m = NULL;
        tk_model_opts o = TK_MODEL_OPTS_INIT;
        int rc = tk_model_load(&m, ctx, dir, &o);
        bad |= rc != TK_ERR_NOMEM || m != NULL || !strstr(tk_last_error(), "TK_MAP_WEIGHTS=1") ||
               !strstr(tk_last_error(), "out of memory loading '");
        if (bad)
            fprintf(stderr, "default load under the cap: rc %d: %s\n", rc, tk_last_error());
        o.map_weights = 1;
        rc = tk_model_load(&m, ctx, dir, &o);
        if (rc != TK_OK)
            fprintf(stderr, "map_weights load under the cap: rc %d: %s\n", rc, tk_last_error());
        bad |= rc != TK_OK;
        tk_model_free(m);
        _exit(bad);
    }
    int st = 0;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void test_forward_contracts(void)
{
    tk_model *m = NULL;
    CHECK_RC(tk_model_load(&m, ctx, dir, NULL), TK_OK);
    if (!m)
        return;
    CHECK_STR(tk_model_arch(m), "LlamaForCausalLM");
    CHECK_EQ_INT(tk_model_vocab_size(m), V);
    CHECK_EQ_INT(tk_model_hidden_size(m), H);
    CHECK(tk_model_has_lm_head(m));
    int32_t ids[12] = {1, 5, 9, 2, 47, 0, 3, 3, 8, 13, 21, 34};
    size_t n5 = 5, n7 = 7, n12 = 12, lens[2] = {5, 7}, zero = 0;
    float *a = calloc(12 * V, sizeof(float)), *b = calloc(12 * V, sizeof(float)), *c = calloc(12 * V, sizeof(float));
    float *h = calloc(12 * H, sizeof(float));
    CHECK_RC(tk_model_forward(m, ids, &n5, 1, a, h), TK_OK);
    /* errors leave the model usable */
    int32_t bad[2] = {1, V};
    size_t n2 = 2;
    CHECK_RC(tk_model_forward(m, bad, &n2, 1, b, NULL), TK_ERR_INVALID);
    CHECK(strstr(tk_last_error(), "token id 48 at position 1") != NULL);
    CHECK_RC(tk_model_forward(m, ids, &zero, 1, b, NULL), TK_ERR_INVALID);
    CHECK_RC(tk_model_forward(m, ids, &n5, 0, b, NULL), TK_ERR_INVALID);
    CHECK_RC(tk_model_pooler_output(b, m), TK_ERR_INVALID);
    const char *txt = "hi";
    CHECK_RC(tk_model_embed(b, m, &txt, 1), TK_ERR_UNSUPPORTED);
    /* replanned for 12 tokens, then back to 5: the same rows as the first call, bit for bit */
    CHECK_RC(tk_model_forward(m, ids, &n12, 1, c, NULL), TK_OK);
    CHECK_RC(tk_model_forward(m, ids, &n5, 1, b, NULL), TK_OK);
    CHECK(memcmp(a, b, 5 * V * sizeof(float)) == 0);
    /* causal: a sequence's first 5 rows do not depend on what follows */
    CHECK(max_diff(a, c, 5 * V) < 1e-5f);
    /* a batch {ids[0..5), ids[5..12)}: each sequence's rows equal the sequence alone */
    CHECK_RC(tk_model_forward(m, ids, lens, 2, c, NULL), TK_OK);
    CHECK(max_diff(a, c, 5 * V) < 1e-5f);
    CHECK_RC(tk_model_forward(m, ids + 5, &n7, 1, b, NULL), TK_OK);
    CHECK(max_diff(b, c + 5 * V, 7 * V) < 1e-5f);
    /* finite, and not all equal */
    int finite = 1;
    for (int i = 0; i < 5 * V; i++)
        finite &= isfinite(a[i]);
    CHECK(finite && a[0] != a[1]);
    char *js = NULL;
    CHECK_RC(tk_model_info_json(&js, m), TK_OK);
    CHECK(js && strstr(js, "\"parameters\": ") && strstr(js, "\"kv_heads\": 2"));
    tk_free(js);
    tk_model_free(m);

    /* bf16: every activation rounded, close to f32 */
    tk_model_opts o = TK_MODEL_OPTS_INIT;
    o.dtype = "bf16";
    CHECK_RC(tk_model_load(&m, ctx, dir, &o), TK_OK);
    if (m) {
        CHECK_RC(tk_model_forward(m, ids, &n5, 1, b, NULL), TK_OK);
        float d = max_diff(a, b, 5 * V);
        CHECK(d > 0 && d < 0.1f);
        tk_model_free(m);
    }
    free(a);
    free(b);
    free(c);
    free(h);
}

static void test_config_dtype_mismatch(void)
{
    char d2[300];
    snprintf(d2, sizeof d2, "%s-bf16cfg", dir);
    CHECK_EQ_INT(write_checkpoint(d2, "bfloat16"), 0);
    tk_model *m = (tk_model *)1;
    CHECK_RC(tk_model_load(&m, ctx, d2, NULL), TK_ERR_INVALID);
    CHECK(m == NULL);
    CHECK(strstr(tk_last_error(), "is float32, but config.json says the weights are bfloat16") != NULL);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d2);
    CHECK_EQ_INT(system(cmd), 0);
}

/* ---- the safetensors parser ------------------------------------------------------------------- */

static int parse(const char *header, size_t data_len, tk_st_tensor **t, size_t *n)
{
    size_t hl = strlen(header), len = 8 + hl + data_len;
    uint8_t *buf = calloc(1, len);
    uint64_t h64 = hl;
    memcpy(buf, &h64, 8);
    memcpy(buf + 8, header, hl);
    int rc = tk_models__st_parse(t, n, buf, len, "t");
    if (rc == TK_OK) /* the tests only look at metadata; data points into buf */
        for (size_t i = 0; i < *n; i++)
            (*t)[i].data = NULL;
    free(buf);
    return rc;
}

static void test_parser(void)
{
    tk_st_tensor *t = NULL;
    size_t n = 0;
    CHECK_RC(parse("{}", 0, &t, &n), TK_OK);
    CHECK_EQ_INT(n, 0);
    tk_models__st_free(t, n);
    CHECK_RC(parse("{\"b\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[8,20]},"
                   "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}",
                   20, &t, &n),
             TK_OK);
    CHECK_EQ_INT(n, 3);
    if (n == 3) {
        CHECK_STR(t[0].name, "a"); /* sorted by name */
        CHECK_EQ_INT(t[1].dtype, TK_ST_BF16);
        CHECK_EQ_INT(t[1].shape[1], 3);
    }
    tk_models__st_free(t, n);
    static const struct {
        const char *hdr;
        size_t data;
        const char *want;
    } bad[] = {
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, "past the end of the data"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,16]}}", 16, "which is 12 bytes"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,16]}}", 16,
         "more than 2^64"},
        {"{\"a\":{\"dtype\":\"F31\",\"shape\":[4],\"data_offsets\":[0,16]}}", 16, "dtype 'F31'"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,16]}}", 16, "shape entry"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 16, "0 <= begin <= end"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
         16, "overlap"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
         8, "not a JSON object"},
        {"{\"__metadata__\":{\"k\":1}}", 0, "not a string"},
        {"{\"a\":[1,2]}", 0, "lacks dtype"},
        {"[1]", 0, "not a JSON object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        t = (tk_st_tensor *)1;
        n = 99;
        int rc = parse(bad[i].hdr, bad[i].data, &t, &n);
        /* a damaged file, except a dtype tk does not know (a newer format's) */
        CHECK_EQ_INT(rc, strstr(bad[i].want, "dtype '") ? TK_ERR_UNSUPPORTED : TK_ERR_CORRUPT);
        CHECK(t == NULL && n == 0);
        if (!strstr(tk_last_error(), bad[i].want)) {
            fprintf(stderr, "case %zu: '%s' lacks '%s'\n", i, tk_last_error(), bad[i].want);
            CHECK(0);
        }
    }
    /* a header length past the file, and a file too short for one */
    uint8_t small[12] = {200, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' '};
    CHECK_RC(tk_models__st_parse(&t, &n, small, sizeof small, "t"), TK_ERR_CORRUPT);
    CHECK(strstr(tk_last_error(), "runs past the end of the file") != NULL);
    CHECK_RC(tk_models__st_parse(&t, &n, small, 5, "t"), TK_ERR_CORRUPT);
    uint8_t huge[16] = {0, 0, 0, 0, 0, 0, 0, 0x80, '{', '}'};
    CHECK_RC(tk_models__st_parse(&t, &n, huge, sizeof huge, "t"), TK_ERR_CORRUPT);
    CHECK(strstr(tk_last_error(), "cap") != NULL);
}

static void test_dtype_conversion(void)
{
    /* bf16 1.5, f16 -2.0, f16 subnormal 2^-24, e4m3 448 (0x7e), e5m2 -inf (0xfc), i8 -127 */
    uint16_t bf = 0x3fc0, hf[2] = {0xc000, 0x0001};
    uint8_t e4 = 0x7e, e5 = 0xfc, i8 = 0x81;
    float out[2];
    CHECK_RC(tk_models__to_f32(out, &bf, 1, TK_ST_BF16), TK_OK);
    CHECK(out[0] == 1.5f);
    CHECK_RC(tk_models__to_f32(out, hf, 2, TK_ST_F16), TK_OK);
    CHECK(out[0] == -2.0f && out[1] == ldexpf(1, -24));
    CHECK_RC(tk_models__to_f32(out, &e4, 1, TK_ST_F8_E4M3), TK_OK);
    CHECK(out[0] == 448.0f);
    CHECK_RC(tk_models__to_f32(out, &e5, 1, TK_ST_F8_E5M2), TK_OK);
    CHECK(isinf(out[0]) && out[0] < 0);
    CHECK_RC(tk_models__to_f32(out, &i8, 1, TK_ST_I8), TK_OK);
    CHECK(out[0] == -127.0f);
    int64_t i64 = 3;
    CHECK_RC(tk_models__to_f32(out, &i64, 1, TK_ST_I64), TK_ERR_UNSUPPORTED);
    /* f32 -> bf16/f16 rounds to nearest even and back */
    float src[3] = {1.0f + ldexpf(1, -8), 65520.0f, 1e-8f};
    uint16_t dst[3];
    tk_dtype tbf = {TK_DL_BFLOAT, 16, 1}, tf16 = {TK_DL_FLOAT, 16, 1};
    tk_models__from_f32(dst, src, 1, tbf);
    CHECK_EQ_INT(dst[0], 0x3f80); /* a tie rounds to even: 1.0 */
    tk_models__from_f32(dst, src, 3, tf16);
    CHECK_EQ_INT(dst[1], 0x7c00); /* 65520 overflows to inf */
    CHECK_EQ_INT(dst[2], 0x0000); /* 1e-8 < 2^-25: 0 */
}

/* The fuzz target's seeds and every input that once broke it, with each prefix (truncations), through
 * the same code; the target aborts when an invariant breaks. */
/* ---- JSON as transformers writes it: integers past int64 ---------------------------------------- */

static void test_json_beyond_int64(void)
{
    json_error_t je;
    const char *t = "{\"a\": 1000000000000000019884624838656, \"b\": [-99999999999999999999, 9223372036854775807, "
                    "-9223372036854775808, 9223372036854775808], \"s\": \"12345678901234567890123 \\\" 1\", "
                    "\"c\": 1.5e3, \"d\": 0}";
    CHECK(json_loadb(t, strlen(t), 0, &je) == NULL); /* what jansson alone does: "too big integer" */
    json_t *j = tk_models__json_loadb(t, strlen(t), 0, &je);
    CHECK(j != NULL);
    if (!j) {
        fprintf(stderr, "%s\n", je.text);
        return;
    }
    json_t *b = json_object_get(j, "b");
    CHECK(json_is_real(json_object_get(j, "a")) && json_real_value(json_object_get(j, "a")) == 1e30);
    CHECK(json_is_real(json_array_get(b, 0)) && json_real_value(json_array_get(b, 0)) == -1e20);
    CHECK(json_is_integer(json_array_get(b, 1)) && json_integer_value(json_array_get(b, 1)) == INT64_MAX);
    CHECK(json_is_integer(json_array_get(b, 2)) && json_integer_value(json_array_get(b, 2)) == INT64_MIN);
    CHECK(json_is_real(json_array_get(b, 3)));
    CHECK_STR(json_string_value(json_object_get(j, "s")), "12345678901234567890123 \" 1"); /* strings untouched */
    CHECK(json_is_real(json_object_get(j, "c")) && json_is_integer(json_object_get(j, "d")));
    int64_t x = 0;
    CHECK(tk_models__json_bound(json_object_get(j, "a"), &x) == 1 && x == INT64_MAX); /* unbounded */
    CHECK(tk_models__json_bound(json_array_get(b, 0), &x) == 0);                     /* not a bound */
    CHECK(tk_models__json_bound(json_object_get(j, "d"), &x) == 1 && x == 0);
    json_decref(j);
    /* past double's range too (a 400-digit integer), and malformed text still fails */
    char big[420] = "[";
    memset(big + 1, '7', 400);
    strcpy(big + 401, "]");
    CHECK((j = tk_models__json_loadb(big, strlen(big), 0, &je)) != NULL &&
          json_real_value(json_array_get(j, 0)) > 1e299);
    json_decref(j);
    CHECK(tk_models__json_loadb("{\"a\": 99999999999999999999", 25, 0, &je) == NULL);

    /* config.json: the bounds tk needs (context, window, window layers) are unbounded; a special token id
     * past the vocabulary is a warning */
    const char *cfg = "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", \"vocab_size\": 48, "
                      "\"hidden_size\": 32, \"intermediate_size\": 40, \"num_hidden_layers\": 2, "
                      "\"num_attention_heads\": 4, \"max_position_embeddings\": 1000000000000000019884624838656, "
                      "\"sliding_window\": 1000000000000000019884624838656, \"use_sliding_window\": true, "
                      "\"max_window_layers\": 1000000000000000019884624838656, \"model_max_length\": "
                      "1000000000000000019884624838656, \"eos_token_id\": 100000000000000000000, \"pad_token_id\": -1}";
    tk_models_config c;
    CHECK_RC(tk_models__config_parse(&c, cfg, strlen(cfg), "config.json"), TK_OK);
    CHECK(c.max_pos == INT64_MAX && c.sliding_window == 0 && !c.sliding[0] && !c.sliding[1]);
    CHECK(c.warnings && strstr(c.warnings, "config.json: eos_token_id 1e+20 is outside the vocabulary [0, 48)"));
    CHECK(c.warnings && strstr(c.warnings, "pad_token_id -1 is outside the vocabulary"));
    tk_models__config_free(&c);
    CHECK(c.warnings == NULL);
}

/* The architecture table: every class parses to its architecture, whose capabilities the rest of tk
 * asks; an unknown class lists the supported ones, and a near miss names the closest. */
static void test_arch_table(void)
{
    static const struct {
        const char *cls, *name;
        unsigned caps;
    } want[] = {{"LlamaForCausalLM", "llama", TK_ARCH_CAUSAL_LM | TK_ARCH_ROPE},
                {"Qwen3ForCausalLM", "qwen3", TK_ARCH_CAUSAL_LM | TK_ARCH_ROPE},
                {"Olmo2ForCausalLM", "olmo2", TK_ARCH_CAUSAL_LM | TK_ARCH_ROPE},
                {"GraniteForCausalLM", "granite", TK_ARCH_CAUSAL_LM | TK_ARCH_ROPE},
                {"SmolLM3ForCausalLM", "smollm3", TK_ARCH_CAUSAL_LM | TK_ARCH_ROPE},
                {"GemmaForCausalLM", "gemma", TK_ARCH_CAUSAL_LM | TK_ARCH_ROPE},
                {"Gemma2ForCausalLM", "gemma2", TK_ARCH_CAUSAL_LM | TK_ARCH_ROPE},
                {"Gemma3ForCausalLM", "gemma3", TK_ARCH_CAUSAL_LM | TK_ARCH_ROPE},
                {"Phi3ForCausalLM", "phi3", TK_ARCH_CAUSAL_LM | TK_ARCH_ROPE},
                {"MixtralForCausalLM", "mixtral", TK_ARCH_CAUSAL_LM | TK_ARCH_ROPE},
                {"Qwen2MoeForCausalLM", "qwen2_moe", TK_ARCH_CAUSAL_LM | TK_ARCH_ROPE},
                {"Qwen3MoeForCausalLM", "qwen3_moe", TK_ARCH_CAUSAL_LM | TK_ARCH_ROPE},
                {"GPT2LMHeadModel", "gpt2", TK_ARCH_CAUSAL_LM | TK_ARCH_BOUNDED_POS},
                {"BertModel", "bert", TK_ARCH_BOUNDED_POS | TK_ARCH_POOLER}};
    char cfg[1024];
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        snprintf(cfg, sizeof cfg,
                 "{\"architectures\": [\"%s\"], \"vocab_size\": 48, \"hidden_size\": 32, \"n_embd\": 32, "
                 "\"intermediate_size\": 40, \"num_hidden_layers\": 2, \"n_layer\": 2, \"num_attention_heads\": 4, "
                 "\"n_head\": 4}",
                 want[i].cls);
        tk_models_config c;
        CHECK_RC(tk_models__config_parse(&c, cfg, strlen(cfg), "config.json"), TK_OK);
        CHECK(c.def && !strcmp(c.def->name, want[i].name));
        CHECK(c.def && (c.def->caps & (TK_ARCH_CAUSAL_LM | TK_ARCH_ROPE | TK_ARCH_BOUNDED_POS | TK_ARCH_POOLER)) ==
                           want[i].caps);
        CHECK(strstr(tk_models__supported_archs(), want[i].cls) != NULL);
        tk_models__config_free(&c);
    }
    const char *near = "{\"architectures\": [\"Qwen3ForCausalLm\"]}";
    tk_models_config c;
    CHECK_RC(tk_models__config_parse(&c, near, strlen(near), "config.json"), TK_ERR_UNSUPPORTED);
    CHECK(strstr(tk_last_error(), "architecture 'Qwen3ForCausalLm' is not supported") != NULL);
    CHECK(strstr(tk_last_error(), "HINT: supported: LlamaForCausalLM, ") != NULL);
    CHECK(strstr(tk_last_error(), "HINT: did you mean Qwen3ForCausalLM?") != NULL);
    const char *far = "{\"architectures\": [\"FalconForCausalLM\"]}";
    CHECK_RC(tk_models__config_parse(&c, far, strlen(far), "config.json"), TK_ERR_UNSUPPORTED);
    CHECK(strstr(tk_last_error(), "did you mean") == NULL);
    CHECK(tk_models__closest_arch("MistralForCausalLM") != NULL &&
          !strcmp(tk_models__closest_arch("mistralforcausallm"), "MistralForCausalLM"));
    /* Gemma 2's softcaps and scale are read */
    const char *g2 = "{\"architectures\": [\"Gemma2ForCausalLM\"], \"vocab_size\": 48, \"hidden_size\": 32, "
                     "\"intermediate_size\": 40, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                     "\"head_dim\": 8, \"final_logit_softcapping\": 30.0, \"attn_logit_softcapping\": 50.0}";
    CHECK_RC(tk_models__config_parse(&c, g2, strlen(g2), "config.json"), TK_OK);
    CHECK(c.final_softcap == 30.0 && c.attn_softcap == 50.0 && fabs(c.attn_scale - 1.0 / 16) < 1e-12);
    CHECK(c.post_norms && c.pre_norms && c.norm_offset == 1.0 && c.sliding_window == 4096 && c.sliding[0] &&
          !c.sliding[1]);
    tk_models__config_free(&c);
}

/* The mixtures of experts' config fields: the sparse layers (every one in Mixtral; decoder_sparse_step
 * and mlp_only_layers in Qwen-MoE), the expert count under both names, the defaults of the config
 * classes, and the errors for a top-k past the experts and a layer index out of range. */
static void test_moe_config(void)
{
    tk_models_config c;
    const char *mx = "{\"architectures\": [\"MixtralForCausalLM\"], \"vocab_size\": 48, \"hidden_size\": 32, "
                     "\"intermediate_size\": 40, \"num_hidden_layers\": 2, \"num_attention_heads\": 4}";
    CHECK_RC(tk_models__config_parse(&c, mx, strlen(mx), "config.json"), TK_OK);
    CHECK(c.experts == 8 && c.experts_topk == 2 && c.moe_intermediate == 40 && c.moe_norm_topk && c.moe_w123 &&
          !c.moe_round_weights && c.moe[0] && c.moe[1] && c.shared_intermediate == 0);
    tk_models__config_free(&c);
    const char *q2 = "{\"architectures\": [\"Qwen2MoeForCausalLM\"], \"vocab_size\": 48, \"hidden_size\": 32, "
                     "\"intermediate_size\": 40, \"num_hidden_layers\": 6, \"num_attention_heads\": 4, "
                     "\"num_experts\": 6, \"decoder_sparse_step\": 2, \"mlp_only_layers\": [3]}";
    CHECK_RC(tk_models__config_parse(&c, q2, strlen(q2), "config.json"), TK_OK);
    CHECK(c.experts == 6 && c.experts_topk == 4 && c.moe_intermediate == 1408 && c.shared_intermediate == 5632 &&
          !c.moe_norm_topk && c.moe_round_weights && c.qkv_bias && !c.o_bias);
    CHECK(!c.moe[0] && c.moe[1] && !c.moe[2] && !c.moe[3] && !c.moe[4] && c.moe[5]);
    tk_models__config_free(&c);
    const char *q3 = "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"vocab_size\": 48, \"hidden_size\": 32, "
                     "\"intermediate_size\": 40, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                     "\"num_local_experts\": 16, \"num_experts_per_tok\": 4, \"norm_topk_prob\": true}";
    CHECK_RC(tk_models__config_parse(&c, q3, strlen(q3), "config.json"), TK_OK);
    CHECK(c.experts == 16 && c.experts_topk == 4 && c.moe_norm_topk && c.qk_norm == TK_QKNORM_HEAD && c.moe[0] &&
          c.moe[1] && c.shared_intermediate == 0 && c.moe_intermediate == 768);
    tk_models__config_free(&c);
    const char *bad = "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"vocab_size\": 48, \"hidden_size\": 32, "
                      "\"intermediate_size\": 40, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                      "\"num_experts\": 4, \"num_experts_per_tok\": 5}";
    CHECK_RC(tk_models__config_parse(&c, bad, strlen(bad), "config.json"), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "num_experts_per_tok 5 is more than the 4 experts");
    const char *bad2 = "{\"architectures\": [\"Qwen2MoeForCausalLM\"], \"vocab_size\": 48, \"hidden_size\": 32, "
                       "\"intermediate_size\": 40, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                       "\"num_experts\": 4, \"mlp_only_layers\": [2]}";
    CHECK_RC(tk_models__config_parse(&c, bad2, strlen(bad2), "config.json"), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "'mlp_only_layers' holds an index out of range, want layer indices 0 to 1");
}

/* A checkpoint whose eos/bos lie outside the vocabulary loads with a warning through the context's log
 * (as transformers warns), and generates: the eos never comes, so generation ends on length. */
static char logged[2048];
static void log_to_buf(void *user, int level, const char *msg)
{
    (void)user;
    size_t n = strlen(logged);
    snprintf(logged + n, sizeof logged - n, "%d:%s\n", level, msg);
}

static void test_special_ids_outside_vocab(void)
{
    char d2[300], path[400];
    snprintf(d2, sizeof d2, "%s-oov", dir);
    CHECK_EQ_INT(write_checkpoint(d2, "float32"), 0);
    snprintf(path, sizeof path, "%s/generation_config.json", d2);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f)
        return;
    fprintf(f, "{\"bos_token_id\": %d, \"eos_token_id\": [%d, 3], \"max_length\": 1000000000000000019884624838656}\n",
            V + 1, V + 2);
    fclose(f);
    tk_ctx *lctx = NULL;
    char home[400];
    snprintf(home, sizeof home, "%s-home", d2);
    tk_ctx_opts co = TK_CTX_OPTS_INIT;
    co.home = home;
    co.offline = 1;
    co.log = log_to_buf;
    CHECK_RC(tk_ctx_new(&lctx, &co), TK_OK);
    tk_model *m = NULL;
    logged[0] = 0;
    CHECK_RC(tk_model_load(&m, lctx, d2, NULL), TK_OK);
    CHECK(strstr(logged, "2:") && strstr(logged, "generation_config.json: eos_token_id[0] 50 is outside the vocabulary "
                                                 "[0, 48): the model can never produce that id"));
    CHECK(strstr(logged, "bos_token_id 49 is outside the vocabulary"));
    tk_gen_opts o = TK_GEN_OPTS_INIT;
    CHECK_RC(tk_gen_opts_from_model(&o, m), TK_OK);
    CHECK(o.n_eos == 2 && o.eos_token_id[0] == V + 2 && o.max_length == INT64_MAX);
    o.n_eos = 1; /* only the id that cannot come */
    int32_t p0[3] = {1, 2, 3};
    const int32_t *pp0 = p0;
    size_t n0 = 3, got0 = 0;
    tk_gen_result *r0 = NULL; /* max_length "no limit": up to the context, 64 positions */
    CHECK_RC(tk_generate(&r0, m, &pp0, &n0, 1, &o), TK_OK);
    CHECK(r0 && tk_gen_result_ids(r0, 0, &got0) && got0 == 61);
    tk_gen_result_free(r0);
    o.max_new_tokens = 6;
    int32_t p[3] = {1, 2, 3};
    const int32_t *pp = p;
    size_t n = 3, got = 0;
    tk_gen_result *r = NULL;
    CHECK_RC(tk_generate(&r, m, &pp, &n, 1, &o), TK_OK);
    CHECK(r && tk_gen_result_ids(r, 0, &got) && got == 6 && !strcmp(tk_gen_result_end(r, 0), "length"));
    tk_gen_result_free(r);
    tk_model_free(m);
    tk_ctx_log(NULL, TK_LOG_WARN, "ignored"); /* no context: nothing, no crash */
    tk_ctx_free(lctx);
    char cmd[900];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", d2, home);
    CHECK_EQ_INT(system(cmd), 0);
}

static void test_fuzz_inputs(void)
{
    const char *dirs[] = {"tests/fuzz/corpus/safetensors", "tests/fuzz/regress/safetensors"};
    size_t n = 0;
    for (size_t d = 0; d < 2; d++) {
        DIR *dir = opendir(dirs[d]);
        CHECK(dir != NULL);
        if (!dir)
            continue;
        struct dirent *e;
        while ((e = readdir(dir))) {
            if (e->d_name[0] == '.')
                continue;
            char path[512], *data = NULL;
            size_t len = 0;
            snprintf(path, sizeof path, "%s/%s", dirs[d], e->d_name);
            CHECK_RC(tk__read_file(&data, &len, path, 1 << 20), TK_OK);
            for (size_t k = 0; data && k <= len; k++) {
                uint8_t *copy = malloc(k ? k : 1); /* exactly k bytes, so a read past them is caught */
                memcpy(copy, data, k);
                CHECK_EQ_INT(LLVMFuzzerTestOneInput(copy, k), 0);
                free(copy);
            }
            free(data);
            n++;
        }
        closedir(dir);
    }
    CHECK(n >= 13);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/tk-test-models-%d", (int)getpid());
    if (write_checkpoint(dir, "float32") != 0) {
        fprintf(stderr, "cannot write %s\n", dir);
        return 1;
    }
    char home[300];
    snprintf(home, sizeof home, "%s-home", dir);
    tk_ctx_opts co = TK_CTX_OPTS_INIT;
    co.home = home;
    co.offline = 1;
    if (tk_ctx_new(&ctx, &co) != TK_OK) {
        fprintf(stderr, "tk_ctx_new: %s\n", tk_last_error());
        return 1;
    }
    RUN(test_load_errors);
    RUN(test_opts_v1_and_one_rank_comm);
    RUN(test_map_weights);
    RUN(test_map_weights_out_of_memory);
    RUN(test_forward_contracts);
    RUN(test_config_dtype_mismatch);
    RUN(test_parser);
    RUN(test_dtype_conversion);
    RUN(test_fuzz_inputs);
    RUN(test_json_beyond_int64);
    RUN(test_special_ids_outside_vocab);
    RUN(test_arch_table);
    RUN(test_moe_config);
    tk_ctx_free(ctx);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", dir, home);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return th_done();
}
