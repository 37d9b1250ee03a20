/*
 * cmd_chat.c — tk chat: a conversation with a causal LM whose tokenizer has a chat template. Each line
 * of stdin is a user turn; the whole conversation is rendered with the template (tk_chat_render_opts,
 * the default one or --template NAME), encoded without added special tokens (the template writes
 * them), and generated with tk generate's options; the reply streams to stdout and joins the
 * conversation as the assistant's turn. --render prints the rendered prompt of --message turns
 * instead, --list-templates the checkpoint's templates.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "cli/cli.h"

static const char *USAGE = "tk chat [options] DIR  |  tk chat DIR --render [--message ROLE=TEXT ...]  |  "
                           "tk chat DIR --list-templates";

static void help(void)
{
    printf(
        "usage: %s\n"
        "\n"
        "Chats with a causal language model from a Hugging Face checkpoint directory whose tokenizer\n"
        "has a chat template (Llama 3, ChatML/Qwen2, Mistral and Llama 2 [INST], Zephyr, Gemma, Phi-3\n"
        "and others written in the same Jinja2 subset). The templates are read as transformers reads\n"
        "them: chat_template.jinja and additional_chat_templates/NAME.jinja, else tokenizer_config.json's\n"
        "chat_template (a string or a list of named templates), else a processor's chat_template.json.\n"
        "Each line read from stdin is one user turn; end of input ends the chat. The whole conversation\n"
        "is rendered with the template as transformers' apply_chat_template(...,\n"
        "add_generation_prompt=True) does, encoded without adding special tokens (the template writes\n"
        "them), and continued as tk generate does; the reply prints as it is generated and becomes the\n"
        "assistant's turn (its text with special tokens skipped).\n"
        "\n"
        "options:\n"
        "  --system TEXT              a system turn before the conversation\n"
        "  --template NAME            the named chat template to use (default: the one named default;\n"
        "                             a checkpoint with several and no default needs this)\n"
        "  --list-templates           print the checkpoint's template names and where they come from\n"
        "                             (with --json: {\"templates\": [...], \"source\": \"...\"})\n"
        "  --render                   print the rendered prompt of the --message turns and exit (no model\n"
        "                             is loaded; with --json: {\"prompt\": \"...\", \"ids\": [...]})\n"
        "  --message ROLE=TEXT        a turn for --render (may repeat; ROLE: system, user, assistant, ...)\n"
        "  --no-generation-prompt     --render: add_generation_prompt=False\n"
        "  --dtype f32|bf16|f16       compute dtype (default f32; also float32, bfloat16, float16, half)\n"
        "  --device cpu|cuda[:N]      where the model runs (default cpu)\n"
        "  --threads N                CPU threads for the ops (default: every CPU; docs/cpu.md)\n"
        "  --tp N                     tensor parallelism over N ranks started by mpirun -np N (the\n"
        "                             world size must be N): rank 0 reads the user turns from stdin and\n"
        "                             sends each to the others; every rank holds its slices of the\n"
        "                             weights; rank 0 alone prints; --device cuda splits over GPUs\n"
        "                             (tk generate --help, docs/parallel.md)\n"
        "  --tp-plan FILE             the tensor-parallel plan instead of the checkpoint's or the default\n"
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
        "  tk chat ./Hermes-3 --template tool_use --render --message user=Hi\n"
        "\n"
        "exit status: 0 ok, 1 a model or generation failure, 2 usage or invalid input (a template error,\n"
        "raise_exception, a conversation longer than the context, several templates and no default),\n"
        "3 no checkpoint, tokenizer or chat template (or none of that --template name), 5 a damaged\n"
        "checkpoint, 7 no GPU for --device cuda, 8 a template construct outside tk's subset (named,\n"
        "with its line) or an architecture tk does not implement.\n",
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

static int render(tk_cli *cli, const char *dir, convo *c, const tk_chat_opts *co, int json)
{
    char *text = NULL;
    int rc = tk_chat_render_opts(&text, dir, c->v, c->n, co);
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

/* --list-templates: the names, one a line, then where they come from (or the JSON object). */
static int list_templates(tk_cli *cli, const char *dir)
{
    char *js = NULL;
    int rc = tk_chat_templates_json(&js, dir);
    if (rc != TK_OK)
        return tk_cli_fail(cli, rc, NULL);
    json_t *o = json_loads(js, 0, NULL), *v;
    size_t i;
    if (cli->json || !o) {
        printf("%s\n", js);
    } else {
        json_array_foreach(json_object_get(o, "templates"), i, v)
            printf("%s\n", json_string_value(v));
        tk_cli_info(cli, "from %s\n", json_string_value(json_object_get(o, "source")));
    }
    json_decref(o);
    tk_free(js);
    return TK_EXIT_OK;
}

/* What tk chat works on: the command line, then the model, the tokenizer and the conversation. */
typedef struct {
    const char *dir, *system, *dtype, *device;
    int do_render, agp, has_len, list;
    tk_chat_opts co; /* the template and add_generation_prompt */
    const char *set_name[MAX_SET], *set_val[MAX_SET];
    size_t nset;
    const char *roles_msgs[MAX_TURNS]; /* --message ROLE=TEXT, borrowed from argv */
    size_t nmsg;
    convo c;
    tk_model_opts mo;
    tk_gen_opts o;
    tk_model *m;
    tk_tokenizer *tok;
    int tp; /* --tp N, 0 without */
    const char *tp_plan;
    tk_comm *comm;
} chat_job;

#define GO (-1) /* a step's "go on": anything else is the command's exit code */

static int oom(tk_cli *cli) { return tk_cli_errorf(cli, TK_ERR_NOMEM, TK_EXIT_FAIL, "out of memory"); }

/* parse options: the directory, --render and its turns, the runtime and the generation flags. */
static int chat_parse(chat_job *j, tk_cli *cli, int argc, char **argv)
{
    j->device = "cpu";
    j->agp = 1;
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
            if (j->nset == MAX_SET)
                return tk_cli_usage(USAGE, "too many options");
            j->set_name[j->nset] = a;
            j->set_val[j->nset++] = g == 2 ? argv[++i] : NULL;
            if (!strcmp(a, "--max-new-tokens") || !strcmp(a, "--max-length"))
                j->has_len = 1;
        } else if (!strcmp(a, "--render")) {
            j->do_render = 1;
        } else if (!strcmp(a, "--list-templates")) {
            j->list = 1;
        } else if (!strcmp(a, "--threads")) {
            int u = tk_cli_parse_threads(cli, USAGE, has_val ? argv[++i] : NULL);
            if (u)
                return u;
        } else if (!strcmp(a, "--no-generation-prompt")) {
            j->agp = 0;
        } else if (!strcmp(a, "--tp")) {
            int u = tk_cli_tp_parse(USAGE, has_val ? argv[++i] : NULL, &j->tp);
            if (u)
                return u;
        } else if (!strcmp(a, "--tp-plan")) {
            if (!has_val)
                return tk_cli_usage(USAGE, "--tp-plan needs a plan file");
            j->tp_plan = argv[++i];
        } else if (!strcmp(a, "--system") || !strcmp(a, "--message") || !strcmp(a, "--dtype") ||
                   !strcmp(a, "--device") || !strcmp(a, "--template")) {
            if (!has_val)
                return tk_cli_usage(USAGE, "%s needs a value", a);
            const char *v = argv[++i];
            if (!strcmp(a, "--system"))
                j->system = v;
            else if (!strcmp(a, "--template"))
                j->co.template_name = v;
            else if (!strcmp(a, "--dtype"))
                j->dtype = v;
            else if (!strcmp(a, "--device"))
                j->device = v;
            else {
                const char *eq = strchr(v, '=');
                if (!eq || eq == v)
                    return tk_cli_usage(USAGE, "--message wants ROLE=TEXT (e.g. user=Hello), got '%s'", v);
                if (j->nmsg == MAX_TURNS)
                    return tk_cli_usage(USAGE, "at most %d --message turns", MAX_TURNS);
                j->roles_msgs[j->nmsg++] = v;
            }
        } else if (a[0] == '-' && a[1]) {
            return tk_cli_usage(USAGE, "unknown option '%s' (see tk chat --help)", a);
        } else if (!j->dir) {
            j->dir = a;
        } else {
            return tk_cli_usage(USAGE, "unexpected argument '%s' (user turns are read from stdin)", a);
        }
    }
    if (!j->dir)
        return tk_cli_usage(USAGE, "a checkpoint directory, e.g. tk chat ./Qwen2-0.5B-Instruct");
    if (j->nmsg && !j->do_render)
        return tk_cli_usage(USAGE, "--message goes with --render (a chat reads its user turns from stdin)");
    if (!j->agp && !j->do_render)
        return tk_cli_usage(USAGE, "--no-generation-prompt goes with --render");
    if (j->list && (j->do_render || j->nmsg))
        return tk_cli_usage(USAGE, "--list-templates goes alone (with DIR, and --json)");
    if (j->tp_plan && !j->tp)
        return tk_cli_usage(USAGE, "--tp-plan goes with --tp N");
    if (j->tp && (j->do_render || j->list))
        return tk_cli_usage(USAGE, "--tp goes with a chat, not --render or --list-templates (no model loads)");
    j->co.add_generation_prompt = j->agp;
    return GO;
}

/* --render: the --message turns (after --system) rendered with the template; no model is loaded. */
static int chat_render_only(chat_job *j, tk_cli *cli)
{
    char *roles[MAX_TURNS]; /* ROLE of each ROLE=TEXT, copied: the conversation borrows roles */
    size_t nr = 0;
    int ec = GO;
    for (size_t k = 0; k < j->nmsg && ec == GO; k++) {
        const char *eq = strchr(j->roles_msgs[k], '=');
        roles[nr] = strndup(j->roles_msgs[k], (size_t)(eq - j->roles_msgs[k]));
        if (!roles[nr] || convo_add(&j->c, roles[nr], eq + 1)) {
            free(roles[nr]);
            ec = oom(cli);
        } else {
            nr++;
        }
    }
    if (ec == GO)
        ec = render(cli, j->dir, &j->c, &j->co, cli->json);
    for (size_t k = 0; k < nr; k++)
        free(roles[k]);
    return ec;
}

/* validate: the template must render before the model loads (no template, or one outside the subset,
 * fails now), and --device must be cpu, cuda or cuda:N. */
static int chat_validate(chat_job *j, tk_cli *cli)
{
    tk_chat_message probe[2] = {{"system", j->system ? j->system : ""}, {"user", "Hello"}};
    char *t = NULL;
    int rc = tk_chat_render_opts(&t, j->dir, j->system ? probe : probe + 1, j->system ? 2 : 1, &j->co);
    const char *device = j->device;
    tk_free(t);
    if (rc != TK_OK)
        return tk_cli_fail(cli, rc, NULL);
    j->mo = (tk_model_opts)TK_MODEL_OPTS_INIT;
    j->mo.dtype = j->dtype;
    int id;
    if (tk_cli_parse_device(device, &id))
        return tk_cli_usage(USAGE, "--device wants cpu, cuda or cuda:N, got '%s'", device);
    j->mo.device_type = id < 0 ? TK_DEV_CPU : TK_DEV_CUDA;
    j->mo.device_id = id < 0 ? 0 : id;
    return GO;
}

/* resolve: the model, its generation defaults (at most 256 new tokens a reply unless told), the flags
 * over them, and the tokenizer. */
static int chat_load(chat_job *j, tk_cli *cli)
{
    tk_ctx *ctx = tk_cli_ctx(cli);
    int rc, u;
    if (!ctx)
        return TK_EXIT_FAIL;
    if (j->tp && (rc = tk_cli_tp_join(cli, &j->comm, j->tp, j->device, &j->mo.device_id)) != 0)
        return rc;
    j->mo.comm = j->comm;
    j->mo.tp_plan = j->tp_plan;
    if ((rc = tk_model_load(&j->m, ctx, j->dir, &j->mo)) != TK_OK)
        return tk_cli_fail(cli, rc, NULL);
    j->o = (tk_gen_opts)TK_GEN_OPTS_INIT;
    if ((rc = tk_gen_opts_from_model(&j->o, j->m)) != TK_OK)
        return tk_cli_fail(cli, rc, NULL);
    if (!j->has_len)
        j->o.max_new_tokens = 256;
    for (size_t k = 0; k < j->nset; k++)
        if ((u = tk_cli_gen_apply(&j->o, USAGE, j->set_name[k], j->set_val[k])) != 0)
            return u;
    if ((rc = tk_tokenizer_load(&j->tok, j->dir)) != TK_OK)
        return tk_cli_fail(cli, rc, "tk chat needs the checkpoint's tokenizer.json");
    return GO;
}

/* One user turn: render the conversation, encode, generate (streamed unless --json), report the reply
 * and add it as the assistant's turn. */
static int chat_turn(chat_job *j, tk_cli *cli, const char *line, size_t turn, int streaming)
{
    char *prompt = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    tk_gen_result *res = NULL;
    int rc, ec = GO;
    if (convo_add(&j->c, "user", line))
        return oom(cli);
    if ((rc = tk_chat_render_opts(&prompt, j->dir, j->c.v, j->c.n, &j->co)) != TK_OK ||
        (rc = tk_tokenizer_encode(&ids, &n, j->tok, prompt, strlen(prompt), 0)) != TK_OK ||
        (rc = tk_generate(&res, j->m, (const int32_t *const *)&ids, &n, 1, &j->o)) != TK_OK) {
        if (streaming)
            fflush(stdout);
        tk_free(prompt);
        tk_free(ids);
        return tk_cli_fail(cli, rc, NULL);
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
    if (convo_add(&j->c, "assistant", text ? text : ""))
        ec = oom(cli);
    tk_gen_result_free(res);
    tk_free(prompt);
    tk_free(ids);
    return ec;
}

/* --tp: rank 0's line (its length, -1 at the end of input, then its bytes) broadcast to every rank, so
 * that all run the same turns (mpirun gives stdin to rank 0 alone). Returns the length, -1 at the end,
 * or -2 after printing the communicator's error. */
static ssize_t tp_line(chat_job *j, tk_cli *cli, char **line, size_t *cap, ssize_t got)
{
    int64_t len = got, s1[1] = {1};
    tk_tensor t = {&len, {TK_DEV_CPU, 0}, 1, {TK_DL_INT, 64, 1}, s1, NULL, 0};
    int rc = tk_comm_broadcast(j->comm, &t, 0, NULL);
    if (rc == TK_OK && len >= 0 && (size_t)len + 1 > *cap) {
        char *nl = realloc(*line, (size_t)len + 1);
        if (!nl) {
            oom(cli);
            return -2;
        }
        *line = nl;
        *cap = (size_t)len + 1;
    }
    int64_t sb[1] = {len > 0 ? len : 0};
    tk_tensor b = {*line, {TK_DEV_CPU, 0}, 1, {TK_DL_UINT, 8, 1}, sb, NULL, 0};
    if (rc == TK_OK && len > 0)
        rc = tk_comm_broadcast(j->comm, &b, 0, NULL);
    if (rc != TK_OK) {
        tk_cli_fail(cli, rc, "--tp: sending the user turn to every rank");
        return -2;
    }
    if (len >= 0)
        (*line)[len] = 0;
    return (ssize_t)len;
}

/* run: each line of stdin is a user turn (empty ones skipped) until the end of input. */
static int chat_loop(chat_job *j, tk_cli *cli)
{
    int root = !j->comm || tk_comm_rank(j->comm) == 0;
    int streaming = !cli->json, interactive = root && isatty(0) && !cli->json, ec = GO;
    char *line = NULL;
    size_t cap = 0, turn = 0;
    ssize_t got;
    j->o.stream = on_token;
    j->o.stream_user = &streaming;
    for (;;) {
        if (interactive) {
            fputs("> ", stderr);
            fflush(stderr);
        }
        got = root ? getline(&line, &cap, stdin) : -1;
        if (j->comm && (got = tp_line(j, cli, &line, &cap, got < 0 ? -1 : got)) == -2) {
            ec = TK_EXIT_FAIL;
            break;
        }
        if (got < 0)
            break;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r'))
            line[--got] = 0;
        if (!got)
            continue;
        if ((ec = chat_turn(j, cli, line, turn, streaming)) != GO)
            break;
        turn++;
    }
    free(line);
    return ec;
}

int tk_cmd_chat(tk_cli *cli, int argc, char **argv)
{
    chat_job *j = calloc(1, sizeof *j);
    int ec;
    if (!j)
        return oom(cli);
    j->co = (tk_chat_opts)TK_CHAT_OPTS_INIT;
    if ((ec = chat_parse(j, cli, argc, argv)) != GO)
        goto done;
    if (j->list) {
        ec = list_templates(cli, j->dir);
        goto done;
    }
    if (j->system && convo_add(&j->c, "system", j->system)) {
        ec = oom(cli);
        goto done;
    }
    if (j->do_render)
        ec = chat_render_only(j, cli);
    else if ((ec = chat_validate(j, cli)) == GO && (ec = chat_load(j, cli)) == GO)
        ec = chat_loop(j, cli);
    if (ec == GO)
        ec = TK_EXIT_OK;
done:
    tk_tokenizer_free(j->tok);
    /* a rank that fails after the load (the others may wait in a collective): end the whole job */
    if (ec != TK_EXIT_OK && j->m && j->comm && tk_comm_size(j->comm) > 1)
        tk_comm_abort(j->comm, ec);
    tk_model_free(j->m);
    tk_comm_free(j->comm);
    convo_free(&j->c);
    free(j);
    return ec;
}
