/*
 * test_chat_template.c — the chat-template interpreter through its internal entry point and
 * tk_chat_render: Jinja's whitespace rules (expected texts rendered by jinja2 with transformers'
 * trim_blocks/lstrip_blocks), literals, the API's argument and error contracts, and the fuzz
 * regressions replayed. transformers' own renderings of real templates are compared in
 * tests/cli/chat.sh.
 */
#include <dirent.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "models/chat_template.h"
#include "tk.h"

static const tk_chat_message MSGS[] = {{"system", "S"}, {"user", "Hi"}};

static char *render(const char *t, int *rc)
{
    char *out = NULL;
    *rc = tk_models__chat_render_text(&out, t, strlen(t), MSGS, 2, 1, NULL, 0);
    return out;
}

static void test_whitespace_and_literals(void)
{
    static const char *const cases[][2] = {
        {"{% if true %}\n  x\n{% endif %}\n", "  x\n"},
        {"a  {% if true %}b{% endif %}  c\n  {#- c #}\nd", "a  b  cd"},
        {"{%+ if true %}x{% endif %}", "x"},
        {"  {%+ if 1 %}y\n{%- endif %}", "  y"},
        {"{{ \"a\" \"b\" }}{{ 1 if 0 }}|{{ [1,[2]] }}{{ {\"k\": \"v\"} }}", "ab|[1, [2]]{'k': 'v'}"},
        {"{% for m in messages %}{{ m.role }}{{ ',' if not loop.last }}{% endfor %}", "system,user"},
        {"{{ messages[1:] | length }}{{ add_generation_prompt }}", "1True"},
        {"line\n", "line"},
        {"line\n\n", "line\n"},
        {"a\r\nb", "a\nb"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc;
        char *out = render(cases[i][0], &rc);
        CHECK_EQ_INT(rc, TK_OK);
        CHECK(out && !strcmp(out, cases[i][1]));
        if (out && strcmp(out, cases[i][1]))
            fprintf(stderr, "  case %zu: got '%s', want '%s'\n", i, out, cases[i][1]);
        tk_free(out);
    }
}

static void test_errors_leave_out_null(void)
{
    static const struct {
        const char *t;
        int rc;
        const char *msg;
    } cases[] = {
        {"{% macro x() %}{% endmacro %}", TK_ERR_UNSUPPORTED, "the tag 'macro'"},
        {"\n\n{{ x | map('y') }}", TK_ERR_UNSUPPORTED, "line 3: the filter 'map'"},
        {"{{ raise_exception('boom') }}", TK_ERR_INVALID, "raised an exception: boom"},
        {"{% if 1 %}", TK_ERR_INVALID, "never closed"},
        {"{% endif %}", TK_ERR_INVALID, "'endif' without its opening tag"},
        {"{{ 'abc }}", TK_ERR_INVALID, "never closed"},
        {"{{ 1 / 0 }}", TK_ERR_UNSUPPORTED, "float arithmetic"},
        {"{{ 1 // 0 }}", TK_ERR_INVALID, "division by zero"},
        {"{{ '\\u00e9' }}", TK_ERR_UNSUPPORTED, "string escape"},
        {"{% set a, b = 1 %}", TK_ERR_UNSUPPORTED, "several targets"},
        {"{{ x.y }}", TK_ERR_INVALID, "of an undefined value"},
        {"{{ messages @ 1 }}", TK_ERR_INVALID, "unexpected character '@'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc;
        char *out = render(cases[i].t, &rc);
        CHECK_EQ_INT(rc, cases[i].rc);
        CHECK(out == NULL);
        CHECK(strstr(tk_last_error(), cases[i].msg) != NULL);
        if (!strstr(tk_last_error(), cases[i].msg))
            fprintf(stderr, "  case %zu: '%s'\n", i, tk_last_error());
        tk_free(out);
    }
    char *out = (char *)1;
    CHECK_EQ_INT(tk_models__chat_render_text(&out, NULL, 3, MSGS, 2, 0, NULL, 0), TK_ERR_INVALID);
    CHECK(out == NULL);
    tk_chat_message bad = {"user", NULL};
    CHECK_EQ_INT(tk_models__chat_render_text(&out, "x", 1, &bad, 1, 0, NULL, 0), TK_ERR_INVALID);
    CHECK(strstr(tk_last_error(), "has no content") != NULL);
    CHECK_EQ_INT(tk_chat_render(NULL, ".", MSGS, 2, 1), TK_ERR_INVALID);
    CHECK_EQ_INT(tk_chat_render(&out, NULL, MSGS, 2, 1), TK_ERR_INVALID);
}

static void test_render_from_a_directory(void)
{
    char dir[] = "/tmp/tk-chat-XXXXXX";
    if (!mkdtemp(dir))
        SKIP("no temporary directory");
    char path[256];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    char *out = NULL;
    CHECK_EQ_INT(tk_chat_render(&out, dir, MSGS, 2, 1), TK_ERR_NOT_FOUND);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f)
        return;
    fputs(
        "{\"bos_token\": {\"content\": \"<s>\"}, \"eos_token\": \"</s>\", \"chat_template\": [{\"name\": \"default\", "
        "\"template\": \"{{ bos_token }}{% for m in messages %}{{ m.content + eos_token }}{% endfor %}\"}]}",
        f);
    fclose(f);
    CHECK_EQ_INT(tk_chat_render(&out, dir, MSGS, 2, 1), TK_OK);
    CHECK(out && !strcmp(out, "<s>S</s>Hi</s>"));
    tk_free(out);
    CHECK_EQ_INT(tk_chat_render(&out, path, MSGS, 0, 1), TK_OK); /* the file itself, no messages */
    CHECK(out && !strcmp(out, "<s>"));
    tk_free(out);
    f = fopen(path, "w");
    fputs("{\"chat_template\": null}", f);
    fclose(f);
    CHECK_EQ_INT(tk_chat_render(&out, dir, MSGS, 2, 1), TK_ERR_NOT_FOUND);
    CHECK(strstr(tk_last_error(), "HINT") != NULL);
    unlink(path);
    rmdir(dir);
}

static void put(const char *dir, const char *file, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* transformers' order: chat_template.jinja and additional_chat_templates/ over tokenizer_config.json's
 * chat_template, which is over chat_template.json; named templates; special tokens from the config's
 * "*_token" keys and special_tokens_map.json. (tests/cli/checkpoints.sh renders the same layouts as
 * transformers writes them and compares with apply_chat_template.) */
static void test_template_files_and_names(void)
{
    char dir[] = "/tmp/tk-chat-XXXXXX", sub[64];
    if (!mkdtemp(dir))
        SKIP("no temporary directory");
    char *out = NULL;
    tk_chat_opts o = TK_CHAT_OPTS_INIT;
    put(dir, "chat_template.json", "{\"chat_template\": \"json:{{ bos_token }}{{ messages[0].content }}\"}");
    put(dir, "special_tokens_map.json", "{\"bos_token\": {\"content\": \"<B>\"}}");
    CHECK_RC(tk_chat_render_opts(&out, dir, MSGS, 2, NULL), TK_OK);
    CHECK(out && !strcmp(out, "json:<B>S")); /* no tokenizer_config.json: special_tokens_map.json's bos */
    tk_free(out);
    put(dir, "tokenizer_config.json",
        "{\"bos_token\": \"<s>\", \"image_token\": \"<img>\", \"model_max_length\": "
        "1000000000000000019884624838656, \"chat_template\": \"cfg:{{ bos_token }}{{ image_token }}\"}");
    CHECK_RC(tk_chat_render_opts(&out, dir, MSGS, 2, NULL), TK_OK);
    CHECK(out && !strcmp(out, "cfg:<B><img>")); /* no added_tokens_decoder: the map still overrides bos */
    tk_free(out);
    put(dir, "chat_template.jinja", "jinja:{{ messages | length }}{{ add_generation_prompt }}\n");
    snprintf(sub, sizeof sub, "%s/additional_chat_templates", dir);
    mkdir(sub, 0755);
    put(sub, "tool_use.jinja", "tool:{{ bos_token }}");
    put(sub, "notes.txt", "not a template");
    o.add_generation_prompt = 0;
    CHECK_RC(tk_chat_render_opts(&out, dir, MSGS, 2, &o), TK_OK);
    CHECK(out && !strcmp(out, "jinja:2False")); /* the file wins, its one trailing newline dropped */
    tk_free(out);
    o.template_name = "tool_use";
    CHECK_RC(tk_chat_render_opts(&out, dir, MSGS, 2, &o), TK_OK);
    CHECK(out && !strcmp(out, "tool:<B>"));
    tk_free(out);
    o.template_name = "nosuch";
    out = (char *)1;
    CHECK_RC(tk_chat_render_opts(&out, dir, MSGS, 2, &o), TK_ERR_NOT_FOUND);
    CHECK(out == NULL && strstr(tk_last_error(), "(it has: default, tool_use)"));
    CHECK_RC(tk_chat_templates_json(&out, dir), TK_OK);
    CHECK(out && strstr(out, "\"templates\": [\"default\", \"tool_use\"]"));
    tk_free(out);
    /* only named templates: no default to choose */
    snprintf(sub, sizeof sub, "%s/chat_template.jinja", dir);
    unlink(sub);
    o.template_name = NULL;
    CHECK_RC(tk_chat_render_opts(&out, dir, MSGS, 2, &o), TK_ERR_INVALID);
    CHECK(strstr(tk_last_error(), "several chat templates and none named default: tool_use"));
    o.version = 99;
    CHECK_RC(tk_chat_render_opts(&out, dir, MSGS, 2, &o), TK_ERR_INVALID);
    CHECK(strstr(tk_last_error(), "TK_CHAT_OPTS_INIT"));
    CHECK_RC(tk_chat_templates_json(NULL, dir), TK_ERR_INVALID);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK_EQ_INT(system(cmd), 0);
}

static void test_fuzz_regressions_replay(void)
{
    const char *d = "tests/fuzz/regress/chat_template";
    DIR *dh = opendir(d);
    if (!dh)
        SKIP("run from the repository root");
    struct dirent *e;
    int n = 0;
    while ((e = readdir(dh))) {
        if (e->d_name[0] == '.')
            continue;
        char p[512], *buf = NULL;
        snprintf(p, sizeof p, "%s/%s", d, e->d_name);
        FILE *f = fopen(p, "rb");
        if (!f)
            continue;
        fseek(f, 0, SEEK_END);
        long len = ftell(f);
        fseek(f, 0, SEEK_SET);
        buf = malloc((size_t)len + 1);
        if (buf && fread(buf, 1, (size_t)len, f) == (size_t)len) {
            char *out = NULL;
            size_t tn = strnlen(buf, (size_t)len);
            int rc = tk_models__chat_render_text(&out, buf, tn, MSGS, 2, 1, NULL, 0);
            CHECK(rc == TK_OK ? out != NULL : out == NULL);
            tk_free(out);
            n++;
        }
        free(buf);
        fclose(f);
    }
    closedir(dh);
    CHECK(n > 0);
}

int main(void)
{
    RUN(test_whitespace_and_literals);
    RUN(test_errors_leave_out_null);
    RUN(test_render_from_a_directory);
    RUN(test_template_files_and_names);
    RUN(test_fuzz_regressions_replay);
    return th_done();
}
