/*
 * test_tp_plan.c — the tensor-parallel plan parser (models/tp_plan.c).
 *
 * Alone: transformers' name rule (replace_layer_number_by_wildcard), torch.chunk's split, the plan
 * format and its errors (an unknown style named as transformers names it, bad values), the style of
 * each tensor and its placement, warnings for rules that match nothing, heads that do not divide, and
 * slices copied through their byte runs against an element-by-element copy.
 *
 *     test_tp_plan --dump DIR WORLD [PLAN_FILE]
 *
 * prints the plan of checkpoint DIR for WORLD ranks as JSON, with the sha256 of every rank's slice
 * read from the safetensors mapping through tk_models__tp_copy; tests/tp_plan_oracle.py compares it
 * with transformers' own slicing (tests/cli/tp_plan.sh runs it).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "models/models.h"
#include "models/tp_plan.h"

static void test_generic_name(void)
{
    static const char *const cases[][2] = {
        {"model.layers.0.mlp.up_proj.weight", "model.layers.*.mlp.up_proj.weight"},
        {"model.layers.12.self_attn", "model.layers.*.self_attn"},
        {"model.layers.7", "model.layers.*"},
        {"transformer.h.0.attn.c_attn.weight", "transformer.h.*.attn.c_attn.weight"},
        {"a.0.1.b", "a.*.1.b"}, /* re.sub consumes the dot after a number: the next one stays */
        {"a.0.1.2.b", "a.*.1.*.b"},
        {"mlp.w1.weight", "mlp.w1.weight"}, /* a number inside a name stays */
        {"x.0y.z", "x.0y.z"},
        {"lm_head.weight", "lm_head.weight"},
        {"1.a", "1.a"},
        {"", ""},
    };
    char out[256];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tk_models__tp_generic_name(out, sizeof out, cases[i][0]);
        CHECK_STR(out, cases[i][1]);
    }
    tk_models__tp_generic_name(out, 6, "model.layers.0"); /* truncated, still terminated */
    CHECK(strlen(out) <= 5);
}

static void test_chunk(void)
{
    /* torch.chunk(arange(n), N): sizes ceil(n/N) from the front, the rest short or empty */
    static const int64_t want[][6] = {
        /* n, N, then the sizes */
        {8, 2, 4, 4, -1}, {7, 3, 3, 3, 1, -1}, {5, 4, 2, 2, 1, 0}, {2, 3, 1, 1, 0, -1}, {0, 2, 0, 0, -1},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        int64_t n = want[i][0], expect_off = 0;
        int N = (int)want[i][1];
        for (int r = 0; r < N; r++) {
            int64_t off, len;
            tk_models__tp_chunk(n, N, r, &off, &len);
            CHECK_EQ_INT(len, want[i][2 + r]);
            if (len)
                CHECK_EQ_INT(off, expect_off);
            expect_off += len;
        }
        CHECK_EQ_INT(expect_off, n);
    }
}

static tk_tp_plan *plan_of(const char *json, int world, int *rc)
{
    tk_tp_plan *p = calloc(1, sizeof *p);
    int found = 0;
    p->world = world;
    *rc = tk_models__tp_rules_parse(p, json, strlen(json), "plan.json", "model.", &found);
    return p;
}

static void test_parse_errors(void)
{
    int rc;
    tk_tp_plan *p = plan_of("{\"model.layers.*.mlp.up_proj\": \"colwise\", \"lm_head\": \"colwize\", "
                            "\"x\": \"rowwize\"}",
                            2, &rc);
    CHECK_EQ_INT(rc, TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "unsupported tp_plan styles: 'colwize' (rule 'lm_head'), 'rowwize' (rule 'x')");
    CHECK_CONTAINS(tk_last_error(), "Supported styles are all_reduce, colwise, colwise_gather_output");
    tk_models__tp_plan_free(p);
    p = plan_of("[1, 2]", 2, &rc);
    CHECK_EQ_INT(rc, TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "JSON object of name -> style");
    tk_models__tp_plan_free(p);
    p = plan_of("{\"a\": 3}", 2, &rc);
    CHECK_EQ_INT(rc, TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "rule 'a' is not a style name");
    tk_models__tp_plan_free(p);
    p = plan_of("{\"a\": {\"style\": \"packed_colwise\", \"split\": 1}}", 2, &rc);
    CHECK_EQ_INT(rc, TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "\"split\" must be an integer from 2 to 8");
    tk_models__tp_plan_free(p);
    p = plan_of("{\"a\": {\"style\": \"colwise\", \"split\": 3}}", 2, &rc);
    CHECK_EQ_INT(rc, TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "goes with packed_colwise");
    tk_models__tp_plan_free(p);
    p = plan_of("{\"a\": {\"style\": \"colwise\", \"splt\": 3}}", 2, &rc);
    CHECK_EQ_INT(rc, TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "unknown field 'splt'");
    tk_models__tp_plan_free(p);
    p = plan_of("{\"a\": \"colwise\", ", 2, &rc);
    CHECK_EQ_INT(rc, TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "plan.json:1:");
    tk_models__tp_plan_free(p);
    /* a config.json: its base_model_tp_plan, relative to the base model */
    p = plan_of("{\"model_type\": \"llama\", \"base_model_tp_plan\": {\"layers.*.mlp.up_proj\": \"colwise\"}}", 2, &rc);
    CHECK_EQ_INT(rc, TK_OK);
    CHECK(p->nrules == 1 && !strcmp(p->rules[0].key, "model.layers.*.mlp.up_proj"));
    tk_models__tp_plan_free(p);
}

#define NT 9
static void test_assign(void)
{
    static const char *const names[NT] = {"lm_head.weight",
                                          "model.embed_tokens.weight",
                                          "model.layers.0.self_attn.q_proj.weight",
                                          "model.layers.0.self_attn.q_proj.bias",
                                          "model.layers.0.self_attn.o_proj.weight",
                                          "model.layers.0.self_attn.o_proj.bias",
                                          "model.layers.1.mlp.gate_up_proj.weight",
                                          "model.layers.1.mlp.gate_up_proj.bias",
                                          "model.norm.weight"};
    static const int ndims[NT] = {2, 2, 2, 1, 2, 1, 2, 1, 1};
    static const int64_t shapes[NT][TK_TP_MAX_RANK] = {{10, 4}, {10, 4}, {4, 4}, {4}, {4, 4}, {4}, {12, 4}, {12}, {4}};
    int rc;
    tk_tp_plan *p = plan_of("{\"lm_head\": \"colwise_gather_output\", \"model.embed_tokens\": \"embedding_rowwise\","
                            "\"model.layers.*.self_attn.q_proj\": \"colwise\","
                            "\"model.layers.*.self_attn.o_proj\": \"rowwise\","
                            "\"model.layers.*.mlp.gate_up_proj\": \"packed_colwise\","
                            "\"model.layers.0.mlp.down_proj\": \"rowwise\","
                            "\"model.layers.*.mlp.nothing\": \"colwise\"}",
                            2, &rc);
    CHECK_EQ_INT(rc, TK_OK);
    CHECK_RC(tk_models__tp_assign(p, names, ndims, shapes, NT, 4, 2, 0), TK_OK);
    static const struct {
        const char *style;
        int dim, split;
    } want[NT] = {{"colwise_gather_output", 0, 1},
                  {"embedding_rowwise", 0, 1},
                  {"colwise", 0, 1},
                  {"colwise", 0, 1},
                  {"rowwise", 1, 1},
                  {"rowwise", -1, 1},
                  {"packed_colwise", 0, 2},
                  {"packed_colwise", 0, 1},
                  {"replicate", -1, 1}};
    for (int i = 0; i < NT && (size_t)i < p->nparams; i++) {
        CHECK_STR(p->params[i].style, want[i].style);
        CHECK_EQ_INT(p->params[i].dim, want[i].dim);
        CHECK_EQ_INT(p->params[i].split, want[i].split);
    }
    CHECK(p->params[8].rule == NULL);
    /* a concrete layer number never matches (transformers compares the names with "*"), nor a module
     * the checkpoint lacks: both are warned about */
    CHECK_EQ_INT(p->nwarnings, 2);
    if (p->nwarnings == 2) {
        CHECK_CONTAINS(p->warnings[0], "'model.layers.0.mlp.down_proj'");
        CHECK_CONTAINS(p->warnings[1], "'model.layers.*.mlp.nothing' (colwise) matches nothing");
    }
    /* packed: rank 1 of 2 holds rows 3..5 of gate and 9..11 of up */
    tk_tp_slice s;
    CHECK_RC(tk_models__tp_slice(&s, &p->params[6], 1, 2, 4), TK_OK);
    CHECK_EQ_INT(s.nranges, 2);
    CHECK(s.start[0] == 3 && s.len[0] == 3 && s.start[1] == 9 && s.len[1] == 3);
    CHECK_EQ_INT(s.shape[0], 6);
    CHECK_EQ_INT(s.bytes, 6 * 4 * 4);
    tk_models__tp_plan_free(p);

    /* heads that do not divide: an error naming them, with the sizes that fit */
    p = plan_of("{\"model.layers.*.self_attn.q_proj\": \"colwise\"}", 3, &rc);
    CHECK_RC(tk_models__tp_assign(p, names, ndims, shapes, NT, 4, 2, 0), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "num_attention_heads 4 is not divisible by the tensor-parallel size 3");
    CHECK_CONTAINS(tk_last_error(), "HINT: sizes that fit this model: 1, 2");
    tk_models__tp_plan_free(p);
    p = plan_of("{\"model.layers.*.self_attn.q_proj\": \"colwise\"}", 4, &rc);
    CHECK_RC(tk_models__tp_assign(p, names, ndims, shapes, NT, 4, 2, 0), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "num_key_value_heads 2 is not divisible by the tensor-parallel size 4");
    tk_models__tp_plan_free(p);
    /* attention replicated: any size goes (the MLP may split unevenly) */
    p = plan_of("{\"model.layers.*.mlp.gate_up_proj\": \"colwise\"}", 3, &rc);
    CHECK_RC(tk_models__tp_assign(p, names, ndims, shapes, NT, 4, 2, 0), TK_OK);
    tk_models__tp_plan_free(p);
    /* a packed dimension that does not split into its blocks */
    p = plan_of("{\"model.layers.*.mlp.gate_up_proj\": {\"style\": \"packed_colwise\", \"split\": 5}}", 2, &rc);
    CHECK_RC(tk_models__tp_assign(p, names, ndims, shapes, NT, 4, 2, 0), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "does not split into 5 packed blocks");
    tk_models__tp_plan_free(p);
}

/* A fused qkv_proj packed in 3 with fewer kv heads than heads (Phi-3-medium): its blocks are q's heads and
 * k's and v's kv heads (12, 6 and 6 heads of 4 here), each split by heads; with as many kv heads as
 * heads, or another tensor, the blocks are equal thirds (transformers' _StridedShard); rows that are
 * not q, k and v of whole heads are an error. */
static void test_qkv_blocks(void)
{
    static const char *const names[] = {"model.layers.0.self_attn.qkv_proj.weight",
                                        "model.layers.0.mlp.gate_up_proj.weight"};
    static const int ndims[] = {2, 2};
    static const int64_t shapes[][TK_TP_MAX_RANK] = {{96, 8}, {96, 8}};
    static const char *const rules =
        "{\"model.layers.*.self_attn.qkv_proj\": {\"style\": \"packed_colwise\", \"split\": 3},"
        "\"model.layers.*.mlp.gate_up_proj\": {\"style\": \"packed_colwise\", \"split\": 3}}";
    /* rank r of N: its rows of q, of k and of v */
    static const struct {
        int world, rank;
        int64_t start[3], len[3];
    } want[] = {{2, 0, {0, 48, 72}, {24, 12, 12}},
                {2, 1, {24, 60, 84}, {24, 12, 12}},
                {3, 1, {16, 56, 80}, {16, 8, 8}},
                {6, 5, {40, 68, 92}, {8, 4, 4}}};
    int rc;
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        tk_tp_plan *p = plan_of(rules, want[k].world, &rc);
        CHECK_RC(tk_models__tp_assign(p, names, ndims, shapes, 2, 12, 6, 0), TK_OK);
        tk_tp_slice s;
        CHECK_RC(tk_models__tp_slice(&s, &p->params[0], want[k].rank, want[k].world, 4), TK_OK);
        CHECK_EQ_INT(s.nranges, 3);
        for (int b = 0; b < 3 && b < s.nranges; b++) {
            CHECK_EQ_INT(s.start[b], want[k].start[b]);
            CHECK_EQ_INT(s.len[b], want[k].len[b]);
        }
        CHECK_EQ_INT(s.shape[0], want[k].len[0] + 2 * want[k].len[1]);
        /* gate_up_proj is no q|k|v: equal thirds of 32 rows */
        CHECK_RC(tk_models__tp_slice(&s, &p->params[1], want[k].rank, want[k].world, 4), TK_OK);
        int64_t off, len;
        tk_models__tp_chunk(32, want[k].world, want[k].rank, &off, &len);
        CHECK_EQ_INT(s.nranges, len ? 3 : 0);
        for (int b = 0; b < 3 && b < s.nranges; b++)
            CHECK(s.start[b] == 32 * b + off && s.len[b] == len);
        tk_models__tp_plan_free(p);
    }
    /* as many kv heads as heads: equal blocks */
    tk_tp_plan *p = plan_of(rules, 2, &rc);
    CHECK_RC(tk_models__tp_assign(p, names, ndims, shapes, 2, 8, 8, 0), TK_OK);
    CHECK(p->params[0].block[0] == 0);
    tk_models__tp_plan_free(p);
    /* 6 kv heads over 4 ranks */
    p = plan_of(rules, 4, &rc);
    CHECK_RC(tk_models__tp_assign(p, names, ndims, shapes, 2, 12, 6, 0), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "num_key_value_heads 6 is not divisible by the tensor-parallel size 4");
    tk_models__tp_plan_free(p);
    /* 96 rows are not q, k and v of 10 heads and 2 kv heads (14 heads' rows) */
    p = plan_of(rules, 2, &rc);
    CHECK_RC(tk_models__tp_assign(p, names, ndims, shapes, 2, 10, 2, 0), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "which is not q, k and v of 10 heads and 2 kv heads");
    tk_models__tp_plan_free(p);
}

/* A mixture of experts saved one tensor an expert takes the split of the fused parameter transformers
 * concatenates them into: gate/up (w1/w3) colwise, down (w2) rowwise; Mixtral's block_sparse_moe module
 * is transformers 5's mlp; the experts module's rule counts as used; the router stays whole. */
static void test_expert_parts(void)
{
    static const char *const names[] = {"model.layers.0.mlp.experts.0.gate_proj.weight",
                                        "model.layers.0.mlp.experts.3.up_proj.weight",
                                        "model.layers.1.mlp.experts.12.down_proj.weight",
                                        "model.layers.0.block_sparse_moe.experts.1.w1.weight",
                                        "model.layers.0.block_sparse_moe.experts.1.w3.weight",
                                        "model.layers.0.block_sparse_moe.experts.1.w2.weight",
                                        "model.layers.0.mlp.gate.weight",
                                        "model.layers.0.mlp.experts.gate_up_proj",
                                        "model.layers.0.mlp.experts.down_proj",
                                        "model.layers.0.mlp.experts.0.gate_proj.bias"};
    enum { N = sizeof names / sizeof names[0] };
    static const int ndims[N] = {2, 2, 2, 2, 2, 2, 2, 3, 3, 1};
    static const int64_t shapes[N][TK_TP_MAX_RANK] = {{6, 4}, {6, 4}, {4, 6},     {6, 4},    {6, 4},
                                                      {4, 6}, {3, 4}, {3, 12, 4}, {3, 4, 6}, {6}};
    static const struct {
        const char *style;
        int dim, split;
    } want[N] = {{"colwise", 0, 1}, {"colwise", 0, 1},   {"rowwise", 1, 1},    {"colwise", 0, 1},
                 {"colwise", 0, 1}, {"rowwise", 1, 1},   {"replicate", -1, 1}, {"packed_colwise", 1, 2},
                 {"rowwise", 2, 1}, {"replicate", -1, 1}};
    int rc;
    tk_tp_plan *p = plan_of("{\"model.layers.*.mlp.experts.gate_up_proj\": \"packed_colwise\","
                            "\"model.layers.*.mlp.experts.down_proj\": \"rowwise\","
                            "\"model.layers.*.mlp.experts\": \"moe_tp_experts\"}",
                            2, &rc);
    CHECK_EQ_INT(rc, TK_OK);
    CHECK_RC(tk_models__tp_assign(p, names, ndims, shapes, N, 0, 0, 0), TK_OK);
    for (int i = 0; i < N && (size_t)i < p->nparams; i++) {
        CHECK_STR(p->params[i].style, want[i].style);
        CHECK_EQ_INT(p->params[i].dim, want[i].dim);
        CHECK_EQ_INT(p->params[i].split, want[i].split);
    }
    CHECK_EQ_INT(p->nwarnings, 0);
    tk_models__tp_plan_free(p);
    /* without the fused rules (a plan that names neither) the parts stay whole */
    p = plan_of("{\"model.layers.*.mlp.experts.down_proj\": \"colwise\"}", 2, &rc);
    CHECK_RC(tk_models__tp_assign(p, names, ndims, shapes, N, 0, 0, 0), TK_OK);
    CHECK_STR(p->params[0].style, "replicate");
    CHECK_STR(p->params[2].style, "replicate"); /* the fused rule is not rowwise: not a part's split */
    tk_models__tp_plan_free(p);
}

/* Slices through byte runs equal an element-by-element copy, for every style's placement. */
static void test_copy_matches_indexing(void)
{
    enum { A = 6, B = 10, C = 3 };
    int32_t src[A * B * C], got[A * B * C], want[A * B * C];
    for (int i = 0; i < A * B * C; i++)
        src[i] = i;
    for (int dim = 0; dim < 3; dim++)
        for (int split = 1; split <= 2; split++)
            for (int world = 1; world <= 4; world++)
                for (int r = 0; r < world; r++) {
                    tk_tp_param p = {"t", "colwise", NULL, dim, split, 3, {A, B, C}, {0}};
                    tk_tp_slice s;
                    if (split == 2 && p.shape[dim] % 2)
                        continue;
                    CHECK_RC(tk_models__tp_slice(&s, &p, r, world, 4), TK_OK);
                    /* the indices the rank keeps along dim, in order */
                    int keep[16], nk = 0;
                    int64_t n = p.shape[dim], gw = (n + split - 1) / split;
                    for (int b = 0; b < split; b++) {
                        int64_t off, len;
                        tk_models__tp_chunk(gw, world, r, &off, &len);
                        for (int64_t k = 0; k < len; k++)
                            keep[nk++] = (int)(b * gw + off + k);
                    }
                    CHECK_EQ_INT(s.shape[dim], nk);
                    int o = 0;
                    for (int i = 0; i < A; i++)
                        for (int j = 0; j < B; j++)
                            for (int k = 0; k < C; k++) {
                                int idx[3] = {i, j, k}, in = 0;
                                for (int q = 0; q < nk; q++)
                                    in |= keep[q] == idx[dim];
                                if (in)
                                    want[o++] = src[(i * B + j) * C + k];
                            }
                    CHECK_EQ_INT(s.bytes, o * 4);
                    tk_models__tp_copy(got, src, &p, &s, 4);
                    CHECK(memcmp(got, want, (size_t)o * 4) == 0);
                }
}

/* ---- --dump ---- */

static int dump(const char *dir, int world, const char *plan_file)
{
    tk_tp_plan *p = NULL;
    tk_st_set *st = NULL;
    json_t *out = json_object(), *ts = json_array(), *rules = json_object(), *warns = json_array();
    int rc = tk_models__tp_plan_load(&p, dir, plan_file, world);
    if (rc == TK_OK)
        rc = tk_models__st_open_dir(&st, dir);
    if (rc != TK_OK) {
        json_object_set_new(out, "error", json_string(tk_last_error()));
        json_object_set_new(out, "status", json_string(tk_status_str(rc)));
        goto print;
    }
    json_object_set_new(out, "source", json_string(p->source));
    for (size_t i = 0; i < p->nrules; i++)
        json_object_set_new(rules, p->rules[i].key,
                            p->rules[i].split != 2
                                ? json_pack("{s:s, s:i}", "style", p->rules[i].style, "split", p->rules[i].split)
                                : json_string(p->rules[i].style));
    for (size_t i = 0; i < p->nwarnings; i++)
        json_array_append_new(warns, json_string(p->warnings[i]));
    for (size_t i = 0; i < p->nparams; i++) {
        const tk_tp_param *t = &p->params[i];
        const tk_st_tensor *st_t = tk_models__st_find(st, t->name);
        size_t es = tk_models__st_dtype_size(st_t->dtype);
        json_t *ranks = json_array();
        for (int r = 0; r < world; r++) {
            tk_tp_slice s;
            char hex[TK_SHA256_HEX];
            json_t *shape = json_array();
            tk_models__tp_slice(&s, t, r, world, es);
            void *buf = malloc((size_t)s.bytes + 1);
            tk_models__tp_copy(buf, st_t->data, t, &s, es);
            tk__sha256_hex(hex, buf, (size_t)s.bytes);
            free(buf);
            for (int d = 0; d < t->ndim; d++)
                json_array_append_new(shape, json_integer(s.shape[d]));
            json_array_append_new(
                ranks, json_pack("{s:o, s:s, s:I}", "shape", shape, "sha256", hex, "bytes", (json_int_t)s.bytes));
        }
        json_array_append_new(ts, json_pack("{s:s, s:s, s:o, s:i, s:i, s:o}", "name", t->name, "style", t->style,
                                            "rule", t->rule ? json_string(t->rule) : json_null(), "dim", t->dim,
                                            "split", t->split, "ranks", ranks));
    }
print:
    json_object_set_new(out, "rules", rules);
    json_object_set_new(out, "warnings", warns);
    json_object_set_new(out, "tensors", ts);
    char *s = json_dumps(out, JSON_COMPACT);
    puts(s ? s : "{}");
    free(s);
    json_decref(out);
    tk_models__st_close(st);
    tk_models__tp_plan_free(p);
    return rc == TK_OK ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc >= 4 && !strcmp(argv[1], "--dump"))
        return dump(argv[2], (int)strtol(argv[3], NULL, 10), argc > 4 ? argv[4] : NULL);
    RUN(test_generic_name);
    RUN(test_chunk);
    RUN(test_parse_errors);
    RUN(test_assign);
    RUN(test_qkv_blocks);
    RUN(test_expert_parts);
    RUN(test_copy_matches_indexing);
    return th_done();
}
