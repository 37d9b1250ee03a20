/*
 * openai.c — the model server's OpenAI request parser and error objects (serve/openai.h).
 *
 * Fields follow OpenAI's API reference for chat completions and (legacy) completions, with the
 * ranges it documents: temperature [0, 2], top_p (0, 1], presence/frequency penalties [-2, 2], n >= 1,
 * stop a string or a list, logprobs a bool (chat) or an int 0..20 (completions), top_logprobs 0..20.
 * vLLM's extensions top_k, min_p, repetition_penalty and ignore_eos are accepted. A field sent as null
 * is absent; unknown fields are ignored; parameters tk cannot honour (tools, logit_bias, suffix, echo,
 * best_of other than n, non-text content parts) are refused with 400 naming them, never silently
 * dropped. Bodies are parsed with jansson, which rejects invalid UTF-8 and NUL bytes in strings.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "serve/openai.h"

int tk_serve__oa_errf(tk_oa_err *e, int status, const char *type, const char *code, const char *param, const char *fmt,
                      ...)
{
    e->status = status;
    snprintf(e->type, sizeof e->type, "%s", type ? type : "invalid_request_error");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

char *tk_serve__oa_error_json(const tk_oa_err *e)
{
    json_t *o = json_pack("{s:{s:s, s:s, s:o, s:o}}", "error", "message", e->message, "type", e->type, "param",
                          e->param[0] ? json_string(e->param) : json_null(), "code",
                          e->code[0] ? json_string(e->code) : json_null());
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(o);
    return s;
}

#define BAD(param, ...) tk_serve__oa_errf(e, 400, "invalid_request_error", "invalid_value", param, __VA_ARGS__)
#define BADTYPE(param, want)                                                                                           \
    tk_serve__oa_errf(e, 400, "invalid_request_error", "invalid_type", param, "'%s' must be %s", param, want)
#define UNSUPPORTED(param, ...)                                                                                        \
    tk_serve__oa_errf(e, 400, "invalid_request_error", "unsupported_parameter", param, __VA_ARGS__)

/* The value of key, or NULL when absent or null. */
static json_t *get(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return v && !json_is_null(v) ? v : NULL;
}

static int get_num(json_t *o, const char *key, double lo, double hi, int *has, double *out, tk_oa_err *e)
{
    json_t *v = get(o, key);
    if (!v)
        return 0;
    if (!json_is_number(v))
        return BADTYPE(key, "a number");
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi))
        return BAD(key, "'%s' is %g, want a number from %g to %g", key, d, lo, hi);
    *out = d;
    if (has)
        *has = 1;
    return 0;
}

static int get_int(json_t *o, const char *key, int64_t lo, int64_t hi, int *has, int64_t *out, tk_oa_err *e)
{
    json_t *v = get(o, key);
    if (!v)
        return 0;
    /* 3.0 is accepted as 3, as Python's pydantic does; 3.5 is not */
    int64_t x;
    if (json_is_integer(v)) {
        x = json_integer_value(v);
    } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) && fabs(json_real_value(v)) < 9e15) {
        x = (int64_t)json_real_value(v);
    } else {
        return BADTYPE(key, "an integer");
    }
    if (x < lo || x > hi)
        return BAD(key, "'%s' is %lld, want an integer from %lld to %lld", key, (long long)x, (long long)lo,
                   (long long)hi);
    *out = x;
    if (has)
        *has = 1;
    return 0;
}

static int get_bool(json_t *o, const char *key, int *out, tk_oa_err *e)
{
    json_t *v = get(o, key);
    if (!v)
        return 0;
    if (!json_is_boolean(v))
        return BADTYPE(key, "true or false");
    *out = json_is_true(v);
    return 0;
}

/* Block diffusion's extensions (DiffusionGemma's sampler); -1: absent, the checkpoint's own. The sampler
 * checks how they combine (t_min < t_max, a bound above 0). */
static int parse_block_diffusion(tk_oa_req *r, json_t *o, tk_oa_err *e)
{
    r->t_min = r->t_max = r->entropy_bound = r->confidence_threshold = -1;
    r->stability_threshold = -1;
    return get_num(o, "t_min", 0, 1e6, NULL, &r->t_min, e) || get_num(o, "t_max", 0, 1e6, NULL, &r->t_max, e) ||
           get_num(o, "entropy_bound", 0, 1e6, NULL, &r->entropy_bound, e) ||
           get_num(o, "confidence_threshold", 0, 1e6, NULL, &r->confidence_threshold, e) ||
           get_int(o, "stability_threshold", 0, 4096, NULL, &r->stability_threshold, e);
}

/* The diffusion extensions that are names: remasking (LLaDA) and alg (Dream). */
static int parse_diffusion_names(tk_oa_req *r, json_t *o, tk_oa_err *e)
{
    r->remasking = -1;
    json_t *v = get(o, "remasking");
    if (v) {
        const char *t = json_string_value(v);
        if (!t)
            return BADTYPE("remasking", "a string");
        if (strcmp(t, "low_confidence") && strcmp(t, "random"))
            return BAD("remasking", "'remasking' is '%.40s', want 'low_confidence' or 'random'", t);
        r->remasking = !strcmp(t, "random");
    }
    if ((v = get(o, "alg"))) {
        static const char *const algs[] = {"origin", "maskgit_plus", "topk_margin", "entropy"};
        const char *t = json_string_value(v);
        if (!t)
            return BADTYPE("alg", "a string");
        for (size_t i = 0; i < sizeof algs / sizeof algs[0]; i++)
            if (!strcmp(t, algs[i]))
                snprintf(r->alg, sizeof r->alg, "%s", algs[i]);
        if (!r->alg[0])
            return BAD("alg", "'alg' is '%.40s', want 'origin', 'maskgit_plus', 'topk_margin' or 'entropy'", t);
    }
    return 0;
}

static int nomem(tk_oa_err *e)
{
    return tk_serve__oa_errf(e, 500, "server_error", "out_of_memory", NULL, "the server is out of memory");
}

static int parse_stop(tk_oa_req *r, json_t *o, tk_oa_err *e)
{
    json_t *v = get(o, "stop");
    if (!v)
        return 0;
    json_t *one[1] = {v};
    size_t n = 1;
    if (json_is_array(v)) {
        n = json_array_size(v);
        if (n > TK_OA_MAX_STOP)
            return BAD("stop", "'stop' has %zu strings, at most %d", n, TK_OA_MAX_STOP);
    } else if (!json_is_string(v)) {
        return BADTYPE("stop", "a string or a list of strings");
    }
    if (n == 0)
        return 0;
    if (!(r->stop = calloc(n, sizeof *r->stop)))
        return nomem(e);
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_is_array(v) ? json_array_get(v, i) : one[0];
        if (!json_is_string(s))
            return BADTYPE("stop", "a string or a list of strings");
        size_t len = json_string_length(s);
        if (len == 0)
            return BAD("stop", "'stop' string %zu is empty", i);
        if (len > TK_OA_MAX_STOP_LEN)
            return BAD("stop", "'stop' string %zu has %zu bytes, at most %d", i, len, TK_OA_MAX_STOP_LEN);
        if (!(r->stop[r->nstop++] = strdup(json_string_value(s))))
            return nomem(e);
    }
    return 0;
}

/* A message's content: a string, or a list of {"type": "text", "text": ...} parts (joined). */
static int content_text(char **out, json_t *c, size_t i, tk_oa_err *e)
{
    char param[64];
    snprintf(param, sizeof param, "messages[%zu].content", i);
    *out = NULL;
    if (!c) {
        *out = strdup("");
        return *out ? 0 : nomem(e);
    }
    if (json_is_string(c)) {
        *out = strdup(json_string_value(c));
        return *out ? 0 : nomem(e);
    }
    if (!json_is_array(c))
        return tk_serve__oa_errf(e, 400, "invalid_request_error", "invalid_type", param,
                                 "'%s' must be a string or a list of content parts", param);
    size_t n = 0, k;
    json_t *p;
    json_array_foreach(c, k, p) {
        json_t *t = json_object_get(p, "type"), *x = json_object_get(p, "text");
        if (!json_is_object(p) || !json_is_string(t))
            return tk_serve__oa_errf(e, 400, "invalid_request_error", "invalid_type", param,
                                     "'%s[%zu]' must be a content part {\"type\": \"text\", \"text\": ...}", param, k);
        if (strcmp(json_string_value(t), "text") != 0)
            return tk_serve__oa_errf(e, 400, "invalid_request_error", "unsupported_content", param,
                                     "'%s[%zu]' is a '%s' part; this model server takes text parts only", param, k,
                                     json_string_value(t));
        if (!json_is_string(x))
            return tk_serve__oa_errf(e, 400, "invalid_request_error", "invalid_type", param,
                                     "'%s[%zu].text' must be a string", param, k);
        n += json_string_length(x);
    }
    char *s = malloc(n + 1);
    if (!s)
        return nomem(e);
    size_t at = 0;
    json_array_foreach(c, k, p) {
        json_t *x = json_object_get(p, "text");
        memcpy(s + at, json_string_value(x), json_string_length(x));
        at += json_string_length(x);
    }
    s[at] = '\0';
    *out = s;
    return 0;
}

static int parse_messages(tk_oa_req *r, json_t *o, tk_oa_err *e)
{
    static const char *const roles[] = {"system", "user", "assistant", "tool", "developer", NULL};
    json_t *m = get(o, "messages");
    if (!m)
        return tk_serve__oa_errf(e, 400, "invalid_request_error", "missing_required_parameter", "messages",
                                 "'messages' is required: a list of {\"role\", \"content\"}");
    if (!json_is_array(m))
        return BADTYPE("messages", "a list of messages");
    size_t n = json_array_size(m);
    if (n == 0)
        return BAD("messages", "'messages' is empty: give at least one message");
    if (n > TK_OA_MAX_MESSAGES)
        return BAD("messages", "'messages' has %zu messages, at most %d", n, TK_OA_MAX_MESSAGES);
    if (!(r->msgs = calloc(n, sizeof *r->msgs)))
        return nomem(e);
    for (size_t i = 0; i < n; i++) {
        json_t *msg = json_array_get(m, i), *role = json_object_get(msg, "role");
        char param[64];
        snprintf(param, sizeof param, "messages[%zu].role", i);
        if (!json_is_object(msg))
            return tk_serve__oa_errf(e, 400, "invalid_request_error", "invalid_type", "messages",
                                     "'messages[%zu]' must be an object {\"role\", \"content\"}", i);
        if (!json_is_string(role))
            return tk_serve__oa_errf(e, 400, "invalid_request_error", "invalid_type", param, "'%s' must be a string",
                                     param);
        const char *rs = json_string_value(role);
        int known = 0;
        for (size_t k = 0; roles[k]; k++)
            known |= !strcmp(rs, roles[k]);
        if (!known)
            return tk_serve__oa_errf(e, 400, "invalid_request_error", "invalid_value", param,
                                     "'%s' is '%.40s', want one of system, user, assistant, tool, developer", param,
                                     rs);
        json_t *tc = get(msg, "tool_calls");
        if (tc && (!json_is_array(tc) || json_array_size(tc) > 0))
            return UNSUPPORTED("tools", "'messages[%zu].tool_calls': this model server does not run tools", i);
        char *content = NULL;
        if (content_text(&content, get(msg, "content"), i, e))
            return -1;
        /* "developer" is OpenAI's newer name for "system"; templates know "system" */
        char *rc = strdup(!strcmp(rs, "developer") ? "system" : rs);
        if (!rc) {
            free(content);
            return nomem(e);
        }
        r->msgs[i].role = rc;
        r->msgs[i].content = content;
        r->nmsg = i + 1;
    }
    return 0;
}

/* prompt: a string, a list of strings, a list of token ids, or a list of such lists. */
static int parse_prompt(tk_oa_req *r, json_t *o, tk_oa_err *e)
{
    json_t *p = get(o, "prompt");
    if (!p)
        return tk_serve__oa_errf(e, 400, "invalid_request_error", "missing_required_parameter", "prompt",
                                 "'prompt' is required: a string, a list of strings, or token ids");
    json_t *items[1] = {p};
    json_t **list = items;
    size_t n = 1;
    int one_ids = 0;
    if (json_is_array(p)) {
        n = json_array_size(p);
        if (n == 0)
            return BAD("prompt", "'prompt' is an empty list");
        one_ids = json_is_integer(json_array_get(p, 0));
        if (one_ids)
            n = 1;
    } else if (!json_is_string(p)) {
        return BADTYPE("prompt", "a string, a list of strings, or token ids");
    }
    if (n > TK_OA_MAX_PROMPTS)
        return BAD("prompt", "'prompt' has %zu prompts, at most %d", n, TK_OA_MAX_PROMPTS);
    if (!(r->prompts = calloc(n, sizeof *r->prompts)))
        return nomem(e);
    for (size_t i = 0; i < n; i++) {
        json_t *x = one_ids ? p : json_is_array(p) ? json_array_get(p, i) : list[0];
        tk_oa_prompt *q = &r->prompts[i];
        r->nprompt = i + 1;
        if (json_is_string(x)) {
            if (!(q->text = strdup(json_string_value(x))))
                return nomem(e);
            continue;
        }
        if (!json_is_array(x) || json_array_size(x) == 0)
            return BAD("prompt", "'prompt[%zu]' must be a string or a non-empty list of token ids", i);
        size_t k, m = json_array_size(x);
        json_t *t;
        if (!(q->ids = malloc(m * sizeof *q->ids)))
            return nomem(e);
        json_array_foreach(x, k, t) {
            if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > INT32_MAX)
                return BAD("prompt", "'prompt' token %zu of prompt %zu is not a token id (a non-negative integer)", k,
                           i);
            q->ids[k] = (int32_t)json_integer_value(t);
        }
        q->nids = m;
    }
    return 0;
}

void tk_serve__oa_req_free(tk_oa_req *r)
{
    if (!r)
        return;
    free(r->model);
    for (size_t i = 0; i < r->nmsg; i++) {
        free((char *)r->msgs[i].role);
        free((char *)r->msgs[i].content);
    }
    free(r->msgs);
    for (size_t i = 0; i < r->nprompt; i++) {
        free(r->prompts[i].text);
        free(r->prompts[i].ids);
    }
    free(r->prompts);
    for (size_t i = 0; i < r->nstop; i++)
        free(r->stop[i]);
    free(r->stop);
    memset(r, 0, sizeof *r);
}

/* "stream_options" (an object, only with "stream": true): include_usage. */
static int parse_stream_options(tk_oa_req *r, json_t *o, tk_oa_err *e)
{
    json_t *v = get(o, "stream_options");
    if (!v)
        return 0;
    if (!json_is_object(v))
        return BADTYPE("stream_options", "an object"), -1;
    if (!r->stream)
        return BAD("stream_options", "'stream_options' is only allowed when 'stream' is true"), -1;
    return get_bool(v, "include_usage", &r->include_usage, e);
}

/* "logprobs": a bool with "top_logprobs" (chat), an int 0..20 (completions, with their unsupported
 * "echo", "suffix" and "best_of" other than n). */
static int parse_logprobs(tk_oa_req *r, int kind, json_t *o, tk_oa_err *e)
{
    json_t *v;
    int lp = 0;
    if (kind == TK_OA_CHAT) {
        int64_t tl = 0;
        int has_tl = 0;
        if (get_bool(o, "logprobs", &lp, e) || get_int(o, "top_logprobs", 0, 20, &has_tl, &tl, e))
            return -1;
        if (has_tl && !lp) {
            BAD("top_logprobs", "'top_logprobs' needs 'logprobs': true");
            return -1;
        }
        r->logprobs = lp;
        r->top_logprobs = (int)tl;
    } else {
        int64_t k = 0;
        int has = 0;
        if ((v = get(o, "logprobs")) && json_is_boolean(v)) {
            BADTYPE("logprobs", "an integer from 0 to 20 (the alternatives to report) for completions");
            return -1;
        }
        if (get_int(o, "logprobs", 0, 20, &has, &k, e))
            return -1;
        r->logprobs = has;
        r->top_logprobs = (int)k;
        if ((v = get(o, "echo")) && (!json_is_boolean(v) || json_is_true(v))) {
            UNSUPPORTED("echo", "'echo' is not supported by this model server");
            return -1;
        }
        if ((v = get(o, "suffix"))) {
            UNSUPPORTED("suffix", "'suffix' (insertion) is not supported by this model server");
            return -1;
        }
        int64_t bo = 0;
        int has_bo = 0;
        if (get_int(o, "best_of", 1, TK_OA_MAX_N, &has_bo, &bo, e))
            return -1;
        if (has_bo && bo != r->n) {
            UNSUPPORTED("best_of", "'best_of' %lld (other than n) is not supported by this model server",
                        (long long)bo);
            return -1;
        }
    }
    return 0;
}

/* The parameters this server refuses unless they are empty or the default: logit_bias, tools,
 * response_format other than text. */
static int refuse_unsupported(json_t *o, tk_oa_err *e)
{
    json_t *v;
    if ((v = get(o, "logit_bias")) && (!json_is_object(v) || json_object_size(v) > 0)) {
        UNSUPPORTED("logit_bias", "'logit_bias' is not supported by this model server");
        return -1;
    }
    if ((v = get(o, "tools")) && (!json_is_array(v) || json_array_size(v) > 0)) {
        UNSUPPORTED("tools", "'tools' (function calling) is not supported by this model server");
        return -1;
    }
    if ((v = get(o, "response_format"))) {
        json_t *t = json_object_get(v, "type");
        if (!json_is_object(v) || !json_is_string(t) || strcmp(json_string_value(t), "text") != 0) {
            UNSUPPORTED("response_format", "'response_format' other than {\"type\": \"text\"} is not supported by "
                                           "this model server");
            return -1;
        }
    }
    return 0;
}

int tk_serve__oa_parse(tk_oa_req *r, int kind, const char *body, size_t len, tk_oa_err *e)
{
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->n = 1;
    json_error_t je;
    json_t *o = json_loadb(body, len, 0, &je);
    if (!o)
        return tk_serve__oa_errf(e, 400, "invalid_request_error", "invalid_json", NULL,
                                 "the body is not valid JSON in UTF-8 (line %d, column %d: %s)", je.line, je.column,
                                 je.text);
    int rc = -1;
    if (!json_is_object(o)) {
        tk_serve__oa_errf(e, 400, "invalid_request_error", "invalid_json", NULL, "the body must be a JSON object");
        goto done;
    }
    json_t *v;
    if ((v = get(o, "model"))) {
        if (!json_is_string(v)) {
            BADTYPE("model", "a string");
            goto done;
        }
        if (!(r->model = strdup(json_string_value(v)))) {
            nomem(e);
            goto done;
        }
    }
    if ((kind == TK_OA_CHAT ? parse_messages(r, o, e) : parse_prompt(r, o, e)) != 0)
        goto done;
    int64_t mt = 0, mct = 0;
    int has_mt = 0, has_mct = 0;
    if (get_int(o, "max_tokens", 1, INT32_MAX, &has_mt, &mt, e) ||
        get_int(o, "max_completion_tokens", 1, INT32_MAX, &has_mct, &mct, e) ||
        get_num(o, "temperature", 0, 2, &r->has_temperature, &r->temperature, e) ||
        get_num(o, "top_p", 0, 1, &r->has_top_p, &r->top_p, e) ||
        get_int(o, "top_k", -1, INT32_MAX, &r->has_top_k, &r->top_k, e) ||
        get_num(o, "min_p", 0, 1, &r->has_min_p, &r->min_p, e) ||
        get_num(o, "repetition_penalty", 1e-3, 100, &r->has_rep, &r->repetition_penalty, e) ||
        get_num(o, "presence_penalty", -2, 2, NULL, &r->presence_penalty, e) ||
        get_num(o, "frequency_penalty", -2, 2, NULL, &r->frequency_penalty, e) ||
        get_int(o, "seed", INT64_MIN, INT64_MAX, &r->has_seed, &r->seed, e) ||
        get_int(o, "n", 1, TK_OA_MAX_N, NULL, &r->n, e) || get_bool(o, "stream", &r->stream, e) ||
        get_bool(o, "ignore_eos", &r->ignore_eos, e) || parse_stop(r, o, e) ||
        get_int(o, "steps", 1, INT32_MAX, NULL, &r->steps, e) ||
        get_int(o, "block_length", 1, INT32_MAX, NULL, &r->block_length, e) ||
        get_num(o, "cfg_scale", 0, 1e6, NULL, &r->cfg_scale, e) || parse_diffusion_names(r, o, e) ||
        parse_block_diffusion(r, o, e))
        goto done;
    if (r->has_top_p && r->top_p == 0) {
        BAD("top_p", "'top_p' is 0, want a number above 0 and at most 1");
        goto done;
    }
    if (r->has_top_k && r->top_k < 0) /* vLLM's -1: off */
        r->top_k = 0;
    r->max_tokens = has_mct ? mct : mt;
    r->has_max_tokens = has_mt || has_mct;
    if (parse_stream_options(r, o, e) || parse_logprobs(r, kind, o, e) || refuse_unsupported(o, e))
        goto done;
    rc = 0;
done:
    json_decref(o);
    if (rc != 0)
        tk_serve__oa_req_free(r);
    return rc;
}

size_t tk_serve__stop_holdback(const char *text, size_t len, char *const *stop, size_t nstop)
{
    size_t best = 0;
    for (size_t i = 0; i < nstop; i++) {
        size_t sl = strlen(stop[i]);
        for (size_t k = sl > len + 1 ? len : sl - 1; k > best; k--)
            if (!memcmp(text + len - k, stop[i], k)) {
                best = k;
                break;
            }
    }
    return best;
}

size_t tk_serve__stop_find(const char *text, char *const *stop, size_t nstop)
{
    size_t best = (size_t)-1;
    for (size_t i = 0; i < nstop; i++) {
        const char *p = strstr(text, stop[i]);
        if (p && (size_t)(p - text) < best)
            best = (size_t)(p - text);
    }
    return best;
}
