/*
 * cmd_chat.c — tk chat: a conversation with a causal LM whose tokenizer_config.json has a chat
 * template. Each line of stdin is a user turn; the whole conversation is rendered with the template
 * (tk_chat_render), encoded without added special tokens (the template writes them), and generated
 * with tk generate's options; the reply streams to stdout and joins the conversation as the
 * assistant's turn. --render prints the rendered prompt of --message turns instead.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

static const char *USAGE = "tk chat [options] DIR  |  tk chat DIR --render [--message ROLE=TEXT ...]";

static void help(void)
{
    printf("usage: %s\n"
           "\n"
           "Chats with a causal language model from a Hugging Face checkpoint directory whose\n"
           "tokenizer_config.json has a chat_template (Llama 3, ChatML/Qwen2, Mistral and Llama 2 [INST],\n"
           "Zephyr, Gemma, Phi-3 and others written in the same Jinja2 subset). Each line read from stdin is\n"
           "one user turn; end of input ends the chat. The whole conversation is rendered with the template\n"
           "as transformers' apply_chat_template(..., add_generation_prompt=True) does, encoded without\n"
           "adding special tokens (the template writes them), and continued as tk generate does; the reply\n"
           "prints as it is generated and becomes the assistant's turn (its text with special tokens\n"
           "skipped).\n"
           "\n"
           "options:\n"
           "  --system TEXT              a system turn before the conversation\n"
           "  --render                   print the rendered prompt of the --message turns and exit (no model\n"
           "                             is loaded; with --json: {\"prompt\": \"...\", \"ids\": [...]})\n"
           "  --message ROLE=TEXT        a turn for --render (may repeat; ROLE: system, user, assistant, ...)\n"
           "  --no-generation-prompt     --render: add_generation_prompt=False\n"
           "  --dtype f32|bf16|f16       compute dtype (default f32)\n"
           "  --device cpu|cuda[:N]      where the model runs (default cpu)\n"
           "  --json                     one JSON line per reply: {\"turn\": N, \"prompt_ids\": [...], \"ids\": [...],\n"
           "                             \"text\": \"...\", \"end\": \"eos\"} instead of streaming\n"
           "\n"
           "generation: every flag of tk generate (--max-new-tokens, --do-sample, --temperature, --top-k,\n"
           "--top-p, --min-p, --repetition-penalty, --no-repeat-ngram-size, --num-beams, --length-penalty,\n"
           "--early-stopping, --eos-token-id, --seed, --kv-dtype, --kv-block-size, --kv-max-bytes,\n"
           "--no-cache); see tk generate --help. Defaults come from generation_config.json, except that a\n"
           "reply has at most 256 new tokens unless --max-new-tokens or --max-length says otherwise.\n"
           "\n"
           "examples:\n"
           "  tk chat ./Qwen2-0.5B-Instruct --system 'You are terse.' --max-new-tokens 64\n"
           "  printf 'Hi\\nWhat is 2+2?\\n' | tk chat ./TinyLlama-Chat --json\n"
           "  tk chat ./Llama-3-8B-Instruct --render --message system=Be\\ brief --message user=Hello\n"
           "\n"
           "exit status: 0 ok, 1 a model or generation failure, 2 usage or invalid input (a template error,\n"
           "raise_exception, a conversation longer than the context), 3 no checkpoint, tokenizer or chat\n"
           "template, 7 no GPU for --device cuda. A template outside tk's subset is an error naming the\n"
           "construct and its line (status 1).\n",
           USAGE);
}

static void json_ids(FILE *f, const int32_t *ids, size_t n)
{
    fputc('[', f);
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%s%d", i ? ", " : "", (int)ids[i]);
    fputc(']', f);
}

static int on_token(void *user, size_t seq, int32_t token, const char *text, size_t len)
{
    (void)seq;
    (void)token;
    if (*(int *)user && len) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
    }
    return 0;
}

#define MAX_SET 64
#define MAX_TURNS 4096

typedef struct {
    tk_chat_message *v;
    char **own; /* strings the conversation owns */
    size_t n, cap;
} convo;

static int convo_add(convo *c, const char *role, const char *content)
{
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 16;
        tk_chat_message *v = realloc(c->v, cap * sizeof *v);
        if (!v)
            return -1;
        c->v = v;
        char **o = realloc(c->own, cap * sizeof *o);
        if (!o)
            return -1;
        c->own = o;
        c->cap = cap;
    }
    char *s = strdup(content);
    if (!s)
        return -1;
    c->own[c->n] = s;
    c->v[c->n].role = role;
    c->v[c->n].content = s;
    c->n++;
    return 0;
}

static void convo_free(convo *c)
{
    for (size_t i = 0; i < c->n; i++)
        free(c->own[i]);
    free(c->own);
    free(c->v);
}

static int render(tk_cli *cli, const char *dir, convo *c, int agp, int json)
{
    char *text = NULL;
    int rc = tk_chat_render(&text, dir, c->v, c->n, agp);
    if (rc != TK_OK)
        return tk_cli_fail(cli, rc, NULL);
    if (!json) {
        fputs(text, stdout);
        tk_free(text);
        return TK_EXIT_OK;
    }
    tk_tokenizer *tok = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    if ((rc = tk_tokenizer_load(&tok, dir)) != TK_OK ||
        (rc = tk_tokenizer_encode(&ids, &n, tok, text, strlen(text), 0)) != TK_OK) {
        tk_free(text);
        tk_tokenizer_free(tok);
        return tk_cli_fail(cli, rc, NULL);
    }
    printf("{\"prompt\": ");
    tk_cli_json_str(stdout, text);
    printf(", \"ids\": ");
    json_ids(stdout, ids, n);
    printf("}\n");
    tk_free(ids);
    tk_free(text);
    tk_tokenizer_free(tok);
    return TK_EXIT_OK;
}

int tk_cmd_chat(tk_cli *cli, int argc, char **argv)
{
    const char *dir = NULL, *system = NULL, *dtype = NULL, *device = "cpu";
    int do_render = 0, agp = 1, has_len = 0, rc_exit = TK_EXIT_OK;
    const char *set_name[MAX_SET], *set_val[MAX_SET];
    size_t nset = 0;
    convo c = {0};
    const char *roles_msgs[MAX_TURNS];
    size_t nmsg = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (tk_cli_is_help(a)) {
            help();
            return TK_EXIT_OK;
        }
        int has_val = i + 1 < argc, g = tk_cli_gen_flag(a);
        if (g) {
            if (g == 2 && !has_val)
                return tk_cli_usage(USAGE, "%s needs a value", a);
            if (nset == MAX_SET)
                return tk_cli_usage(USAGE, "too many options");
            set_name[nset] = a;
            set_val[nset++] = g == 2 ? argv[++i] : NULL;
            if (!strcmp(a, "--max-new-tokens") || !strcmp(a, "--max-length"))
                has_len = 1;
        } else if (!strcmp(a, "--render")) {
            do_render = 1;
        } else if (!strcmp(a, "--no-generation-prompt")) {
            agp = 0;
        } else if (!strcmp(a, "--system") || !strcmp(a, "--message") || !strcmp(a, "--dtype") ||
                   !strcmp(a, "--device")) {
            if (!has_val)
                return tk_cli_usage(USAGE, "%s needs a value", a);
            const char *v = argv[++i];
            if (!strcmp(a, "--system"))
                system = v;
            else if (!strcmp(a, "--dtype"))
                dtype = v;
            else if (!strcmp(a, "--device"))
                device = v;
            else {
                const char *eq = strchr(v, '=');
                if (!eq || eq == v)
                    return tk_cli_usage(USAGE, "--message wants ROLE=TEXT (e.g. user=Hello), got '%s'", v);
                if (nmsg == MAX_TURNS)
                    return tk_cli_usage(USAGE, "at most %d --message turns", MAX_TURNS);
                roles_msgs[nmsg++] = v;
            }
        } else if (a[0] == '-' && a[1]) {
            return tk_cli_usage(USAGE, "unknown option '%s' (see tk chat --help)", a);
        } else if (!dir) {
            dir = a;
        } else {
            return tk_cli_usage(USAGE, "unexpected argument '%s' (user turns are read from stdin)", a);
        }
    }
    if (!dir)
        return tk_cli_usage(USAGE, "a checkpoint directory, e.g. tk chat ./Qwen2-0.5B-Instruct");
    if (nmsg && !do_render)
        return tk_cli_usage(USAGE, "--message goes with --render (a chat reads its user turns from stdin)");
    if (!agp && !do_render)
        return tk_cli_usage(USAGE, "--no-generation-prompt goes with --render");
    if (system && convo_add(&c, "system", system))
        goto oom;
    if (do_render) {
        /* roles borrowed from argv: split ROLE=TEXT in place copies */
        char *roles[MAX_TURNS];
        size_t nr = 0;
        for (size_t k = 0; k < nmsg; k++) {
            const char *eq = strchr(roles_msgs[k], '=');
            roles[nr] = strndup(roles_msgs[k], (size_t)(eq - roles_msgs[k]));
            if (!roles[nr] || convo_add(&c, roles[nr], eq + 1)) {
                free(roles[nr]);
                for (size_t j = 0; j < nr; j++)
                    free(roles[j]);
                goto oom;
            }
            nr++;
        }
        rc_exit = render(cli, dir, &c, agp, cli->json);
        for (size_t j = 0; j < nr; j++)
            free(roles[j]);
        convo_free(&c);
        return rc_exit;
    }

    /* the template must render before the model loads: no template, or one outside the subset, fails now */
    {
        tk_chat_message probe[2] = {{"system", system ? system : ""}, {"user", "Hello"}};
        char *t = NULL;
        int rc = tk_chat_render(&t, dir, system ? probe : probe + 1, system ? 2 : 1, 1);
        tk_free(t);
        if (rc != TK_OK) {
            convo_free(&c);
            return tk_cli_fail(cli, rc, NULL);
        }
    }
    tk_model_opts mo = TK_MODEL_OPTS_INIT;
    mo.dtype = dtype;
    if (!strcmp(device, "cpu")) {
        mo.device_type = TK_DEV_CPU;
    } else if (!strncmp(device, "cuda", 4) && (!device[4] || device[4] == ':')) {
        char *end = NULL;
        long d = 0;
        if (device[4] == ':') {
            errno = 0;
            d = strtol(device + 5, &end, 10);
            if (errno || end == device + 5 || *end || d < 0 || d > 1023) {
                convo_free(&c);
                return tk_cli_usage(USAGE, "--device wants cpu, cuda or cuda:N, got '%s'", device);
            }
        }
        mo.device_type = TK_DEV_CUDA;
        mo.device_id = (int)d;
    } else {
        convo_free(&c);
        return tk_cli_usage(USAGE, "--device wants cpu, cuda or cuda:N, got '%s'", device);
    }
    tk_ctx *ctx = tk_cli_ctx(cli);
    if (!ctx) {
        convo_free(&c);
        return TK_EXIT_FAIL;
    }
    tk_model *m = NULL;
    tk_tokenizer *tok = NULL;
    char *line = NULL;
    size_t cap = 0;
    int rc = tk_model_load(&m, ctx, dir, &mo);
    if (rc != TK_OK) {
        convo_free(&c);
        return tk_cli_fail(cli, rc, NULL);
    }
    tk_gen_opts o = TK_GEN_OPTS_INIT;
    if ((rc = tk_gen_opts_from_model(&o, m)) != TK_OK) {
        rc_exit = tk_cli_fail(cli, rc, NULL);
        goto done;
    }
    if (!has_len)
        o.max_new_tokens = 256;
    for (size_t k = 0; k < nset; k++)
        if ((rc_exit = tk_cli_gen_apply(&o, USAGE, set_name[k], set_val[k])) != 0)
            goto done;
    if ((rc = tk_tokenizer_load(&tok, dir)) != TK_OK) {
        rc_exit = tk_cli_fail(cli, rc, "tk chat needs the checkpoint's tokenizer.json");
        goto done;
    }
    int streaming = !cli->json, interactive = isatty(0) && !cli->json;
    o.stream = on_token;
    o.stream_user = &streaming;
    ssize_t got;
    size_t turn = 0;
    for (;;) {
        if (interactive) {
            fputs("> ", stderr);
            fflush(stderr);
        }
        if ((got = getline(&line, &cap, stdin)) < 0)
            break;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r'))
            line[--got] = 0;
        if (!got)
            continue;
        if (convo_add(&c, "user", line))
            goto oom_model;
        char *prompt = NULL;
        int32_t *ids = NULL;
        size_t n = 0;
        tk_gen_result *res = NULL;
        if ((rc = tk_chat_render(&prompt, dir, c.v, c.n, 1)) != TK_OK ||
            (rc = tk_tokenizer_encode(&ids, &n, tok, prompt, strlen(prompt), 0)) != TK_OK ||
            (rc = tk_generate(&res, m, (const int32_t *const *)&ids, &n, 1, &o)) != TK_OK) {
            if (streaming)
                fflush(stdout);
            tk_free(prompt);
            tk_free(ids);
            rc_exit = tk_cli_fail(cli, rc, NULL);
            goto done;
        }
        const char *text = tk_gen_result_text(res, 0);
        if (cli->json) {
            size_t nn = 0;
            const int32_t *out = tk_gen_result_ids(res, 0, &nn);
            printf("{\"turn\": %zu, \"prompt_ids\": ", turn);
            json_ids(stdout, ids, n);
            printf(", \"ids\": ");
            json_ids(stdout, out, nn);
            printf(", \"text\": ");
            tk_cli_json_str(stdout, text ? text : "");
            printf(", \"end\": \"%s\"}\n", tk_gen_result_end(res, 0));
        } else {
            printf("\n");
        }
        fflush(stdout);
        int bad = convo_add(&c, "assistant", text ? text : "");
        tk_gen_result_free(res);
        tk_free(prompt);
        tk_free(ids);
        if (bad)
            goto oom_model;
        turn++;
    }
    goto done;
oom_model:
    fprintf(stderr, "tk: out of memory\n");
    rc_exit = TK_EXIT_FAIL;
done:
    free(line);
    tk_tokenizer_free(tok);
    tk_model_free(m);
    convo_free(&c);
    return rc_exit;
oom:
    convo_free(&c);
    fprintf(stderr, "tk: out of memory\n");
    return TK_EXIT_FAIL;
}
