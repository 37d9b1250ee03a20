/*
 * model_server.c — tk serve-model's HTTP side on libmicrohttpd: routes, the API key, request bodies
 * (bounded; 413 past opts.max_body), the OpenAI endpoints turned into queued requests for the
 * scheduler (serve/sched.c), streamed answers as Server-Sent Events, /health, /v1/models, /metrics,
 * /tokenize, /detokenize, and the server's lifecycle (tk_model_server_new/run/stop/free in tk.h).
 *
 * Waiting never blocks a libmicrohttpd thread: a request waiting for its answer suspends its
 * connection, and the scheduler resumes it when there is something to send (a token for a stream,
 * the whole body otherwise). A connection whose request is still arriving after opts.timeout_s is
 * closed, so a client sending a byte a second (slowloris) holds nothing for long.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "serve/model_server.h"

#define MSRV_MAGIC 0x746b4d53u /* "tkMS" */

void tk_serve__log(struct tk_model_server *s, int level, const char *fmt, ...)
{
    if (!s->o.log)
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    s->o.log(s->o.log_user, level, msg);
}

/* ---- requests --------------------------------------------------------------------------------- */

static void req_free(tk_serve_req *r)
{
    tk_serve__oa_req_free(&r->p);
    for (size_t i = 0; r->pids && i < r->nprompt; i++)
        tk_free(r->pids[i]);
    free(r->pids);
    free(r->plen);
    free(r->pcached);
    for (size_t i = 0; r->ch && i < r->nchoice; i++) {
        tk__buf_free(&r->ch[i].text);
        json_decref(r->ch[i].lp);
    }
    free(r->ch);
    free(r->body);
    tk__buf_free(&r->out);
    free(r);
}

void tk_serve__req_unref_locked(tk_serve_req *r)
{
    if (r && --r->refs == 0)
        req_free(r);
}

void tk_serve__req_unref(tk_serve_req *r)
{
    if (!r)
        return;
    struct tk_model_server *s = r->srv;
    pthread_mutex_lock(&s->mu);
    tk_serve__req_unref_locked(r);
    pthread_mutex_unlock(&s->mu);
}

/* The HTTP side of one request: the body as it arrives, and the model request once made. */
typedef struct {
    int route;
    tk_buf body;
    int overflow;
    tk_serve_req *r;
    double t0;
    unsigned status;
    char line[160];
} hreq;

enum { R_NONE, R_CHAT, R_COMPLETIONS, R_MODELS, R_MODEL, R_HEALTH, R_METRICS, R_TOKENIZE, R_DETOKENIZE };

/* ---- answers ---------------------------------------------------------------------------------- */

static enum MHD_Result send_body(struct MHD_Connection *c, hreq *h, unsigned status, const char *ctype,
                                 const char *body)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", ctype);
    if (status == 401)
        MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
    h->status = status;
    enum MHD_Result ret = MHD_queue_response(c, status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result send_json(struct MHD_Connection *c, hreq *h, unsigned status, json_t *o)
{
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(o);
    if (!s)
        return MHD_NO;
    enum MHD_Result ret = send_body(c, h, status, "application/json", s);
    free(s);
    return ret;
}

static enum MHD_Result send_err(struct MHD_Connection *c, hreq *h, const tk_oa_err *e)
{
    char *s = tk_serve__oa_error_json(e);
    if (!s)
        return MHD_NO;
    enum MHD_Result ret = send_body(c, h, (unsigned)e->status, "application/json", s);
    free(s);
    return ret;
}

static enum MHD_Result errf(struct MHD_Connection *c, hreq *h, int status, const char *type, const char *code,
                            const char *param, const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static enum MHD_Result errf(struct MHD_Connection *c, hreq *h, int status, const char *type, const char *code,
                            const char *param, const char *fmt, ...)
{
    tk_oa_err e;
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    tk_serve__oa_errf(&e, status, type, code, param, "%s", msg);
    return send_err(c, h, &e);
}

/* ---- routes ----------------------------------------------------------------------------------- */

static int route_of(const char *url, const char *method, const char *name, int *bad_method)
{
    static const struct {
        const char *path, *method;
        int route;
    } T[] = {
        {"/v1/chat/completions", "POST", R_CHAT}, {"/v1/completions", "POST", R_COMPLETIONS},
        {"/v1/models", "GET", R_MODELS},          {"/health", "GET", R_HEALTH},
        {"/metrics", "GET", R_METRICS},           {"/tokenize", "POST", R_TOKENIZE},
        {"/detokenize", "POST", R_DETOKENIZE},
    };
    *bad_method = 0;
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++)
        if (!strcmp(url, T[i].path)) {
            if (strcmp(method, T[i].method) && !(T[i].method[0] == 'G' && !strcmp(method, "HEAD")))
                *bad_method = 1;
            return T[i].route;
        }
    (void)name;
    if (!strncmp(url, "/v1/models/", 11) && url[11]) {
        *bad_method = strcmp(method, "GET") != 0;
        return R_MODEL;
    }
    return R_NONE;
}

static int authorized(struct tk_model_server *s, struct MHD_Connection *c)
{
    if (!s->api_key)
        return 1;
    const char *a = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!a || strncasecmp(a, "Bearer ", 7) != 0)
        return 0;
    a += 7;
    size_t n = strlen(a), k = strlen(s->api_key);
    return n == k && CRYPTO_memcmp(a, s->api_key, k) == 0;
}

static json_t *model_obj(struct tk_model_server *s)
{
    return json_pack("{s:s, s:s, s:I, s:s, s:I}", "id", s->name, "object", "model", "created", (json_int_t)tk__now(),
                     "owned_by", "tk", "max_model_len", (json_int_t)s->ctx_len);
}

static enum MHD_Result health(struct tk_model_server *s, struct MHD_Connection *c, hreq *h)
{
    pthread_mutex_lock(&s->mu);
    int st = s->state;
    char err[1024];
    snprintf(err, sizeof err, "%s", s->load_err);
    pthread_mutex_unlock(&s->mu);
    if (st == SRV_READY)
        return send_json(c, h, 200, json_pack("{s:s}", "status", "ok"));
    if (st == SRV_FAILED)
        return send_json(c, h, 503, json_pack("{s:s, s:s}", "status", "error", "error", err));
    return send_json(c, h, 503, json_pack("{s:s}", "status", st == SRV_LOADING ? "loading" : "shutting_down"));
}

static enum MHD_Result metrics(struct tk_model_server *s, struct MHD_Connection *c, hreq *h)
{
    tk_buf b = TK_BUF_INIT;
    pthread_mutex_lock(&s->mu);
    const tk_gen_batch_stats *st = &s->st;
    unsigned par = s->o.parallel ? s->o.parallel : 4;
#define M(name, type, help, fmt, ...)                                                                                  \
    tk__buf_printf(&b, "# HELP tk_" name " " help "\n# TYPE tk_" name " " type "\n" fmt, __VA_ARGS__)
    M("prompt_tokens_total", "counter", "Prompt tokens of finished and running requests.",
      "tk_prompt_tokens_total %lld\n", (long long)s->prompt_tokens);
    M("prompt_tokens_cached_total", "counter", "Prompt tokens whose KV blocks came from the prefix cache.",
      "tk_prompt_tokens_cached_total %lld\n", (long long)s->cached_tokens);
    M("generation_tokens_total", "counter", "Tokens generated.", "tk_generation_tokens_total %lld\n",
      (long long)s->gen_tokens);
    M("requests_total", "counter", "Generation requests by outcome.",
      "tk_requests_total{outcome=\"ok\"} %lld\ntk_requests_total{outcome=\"error\"} %lld\n"
      "tk_requests_total{outcome=\"cancelled\"} %lld\ntk_requests_total{outcome=\"rejected\"} %lld\n",
      (long long)s->req_ok, (long long)s->req_error, (long long)s->req_cancelled, (long long)s->req_rejected);
    M("requests_queued", "gauge", "Requests waiting for a slot.", "tk_requests_queued %zu\n", s->nq);
    M("requests_running", "gauge", "Requests in the batch.", "tk_requests_running %zu\n", s->nact);
    M("slots_busy", "gauge", "Sequences in the batch.", "tk_slots_busy %zu\n", s->busy);
    M("batch_sequences", "gauge", "Sequences in the batch, prefilling or decoding.", "tk_batch_sequences %lld\n",
      (long long)st->active);
    if (s->db) {
        M("diffusion_steps_total", "counter", "Denoising steps: one forward over every running sequence's canvas.",
          "tk_diffusion_steps_total %lld\n", (long long)s->dst.steps);
        M("diffusion_step_sequences_total", "counter", "Sequences advanced, summed over the denoising steps.",
          "tk_diffusion_step_sequences_total %lld\n", (long long)s->dst.step_sequences);
    }
    M("slots_total", "gauge", "Sequences the batch may hold (--parallel).", "tk_slots_total %u\n", par);
    M("generation_tokens_per_second", "gauge", "Tokens generated a second, over the last two seconds or more.",
      "tk_generation_tokens_per_second %.3f\n", s->nact ? s->tps : 0.0);
    M("kv_blocks_total", "gauge", "KV-cache blocks the pool may hold.", "tk_kv_blocks_total %lld\n",
      (long long)st->kv_blocks_total);
    M("kv_blocks_used", "gauge", "KV-cache blocks held by running sequences.", "tk_kv_blocks_used %lld\n",
      (long long)st->kv_blocks_used);
    M("kv_blocks_free", "gauge", "KV-cache blocks free for sequences (total - used).", "tk_kv_blocks_free %lld\n",
      (long long)st->kv_blocks_free);
    M("kv_blocks_cached", "gauge", "KV-cache blocks held only by the prefix cache (reclaimable).",
      "tk_kv_blocks_cached %lld\n", (long long)st->kv_blocks_cached);
    M("kv_block_size", "gauge", "Tokens per KV-cache block.", "tk_kv_block_size %lld\n", (long long)st->kv_block_size);
    M("model_ready", "gauge", "1 once the model is loaded.", "tk_model_ready %d\n", s->state == SRV_READY);
#undef M
    pthread_mutex_unlock(&s->mu);
    if (!b.data)
        return MHD_NO;
    enum MHD_Result ret = send_body(c, h, 200, "text/plain; version=0.0.4", b.data);
    tk__buf_free(&b);
    return ret;
}

/* POST /tokenize {"content" | "prompt": TEXT, "add_special": bool}; POST /detokenize {"tokens": [...]}. */
static enum MHD_Result tokenize(struct tk_model_server *s, struct MHD_Connection *c, hreq *h, int de)
{
    json_error_t je;
    json_t *o = json_loadb(h->body.data ? h->body.data : "", h->body.len, 0, &je), *v;
    if (!json_is_object(o)) {
        json_decref(o);
        return errf(c, h, 400, "invalid_request_error", "invalid_json", NULL, "the body is not a JSON object (%s)",
                    je.text);
    }
    enum MHD_Result ret;
    if (de) {
        v = json_object_get(o, "tokens");
        size_t n = json_array_size(v), i;
        int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
        json_t *t;
        if (!json_is_array(v) || !ids) {
            free(ids);
            json_decref(o);
            return errf(c, h, 400, "invalid_request_error", "invalid_type", "tokens",
                        "'tokens' must be a list of token ids");
        }
        json_array_foreach(v, i, t) {
            if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= s->vocab) {
                free(ids);
                json_decref(o);
                return errf(c, h, 400, "invalid_request_error", "invalid_value", "tokens",
                            "'tokens[%zu]' is not a token id of this model (0 to %lld)", i, (long long)s->vocab - 1);
            }
            ids[i] = (int32_t)json_integer_value(t);
        }
        char *text = NULL;
        int rc = tk_tokenizer_decode(&text, s->tok, ids, n, 0);
        free(ids);
        json_decref(o);
        if (rc != TK_OK)
            return errf(c, h, 400, "invalid_request_error", "invalid_value", "tokens", "%s", tk_last_error());
        ret = send_json(c, h, 200, json_pack("{s:s, s:s}", "content", text, "prompt", text));
        tk_free(text);
        return ret;
    }
    v = json_object_get(o, "content");
    if (!v)
        v = json_object_get(o, "prompt");
    json_t *as = json_object_get(o, "add_special");
    if (!json_is_string(v) || (as && !json_is_boolean(as))) {
        json_decref(o);
        return errf(c, h, 400, "invalid_request_error", "invalid_type", "content",
                    "give the text as 'content' (a string); 'add_special' is true or false");
    }
    int32_t *ids = NULL;
    size_t n = 0;
    int rc =
        tk_tokenizer_encode(&ids, &n, s->tok, json_string_value(v), json_string_length(v), as ? json_is_true(as) : 1);
    json_decref(o);
    if (rc != TK_OK)
        return errf(c, h, 400, "invalid_request_error", "invalid_value", "content", "%s", tk_last_error());
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_integer(ids[i]));
    tk_free(ids);
    json_t *ans =
        json_pack("{s:o, s:I, s:I}", "tokens", a, "count", (json_int_t)n, "max_model_len", (json_int_t)s->ctx_len);
    return send_json(c, h, 200, ans);
}

/* ---- generation requests ---------------------------------------------------------------------- */

static uint64_t next_rand(struct tk_model_server *s)
{
    /* splitmix64 over a counter seeded from RAND_bytes (under mu) */
    uint64_t z = (s->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The prompt(s) as token ids: chat through the checkpoint's template (encoded without special tokens:
 * the template has them), completions as tokenizer(text) or the ids given. */
static int make_prompts(struct tk_model_server *s, tk_serve_req *r, tk_oa_err *e)
{
    tk_oa_req *p = &r->p;
    r->nprompt = p->kind == TK_OA_CHAT ? 1 : p->nprompt;
    r->pids = calloc(r->nprompt, sizeof *r->pids);
    r->plen = calloc(r->nprompt, sizeof *r->plen);
    r->pcached = calloc(r->nprompt, sizeof *r->pcached);
    if (!r->pids || !r->plen || !r->pcached)
        return tk_serve__oa_errf(e, 500, "server_error", NULL, NULL, "out of memory");
    if (p->kind == TK_OA_CHAT) {
        char *text = NULL;
        int rc = tk_chat_render(&text, s->dir, p->msgs, p->nmsg, 1);
        if (rc == TK_ERR_NOT_FOUND)
            return tk_serve__oa_errf(e, 400, "invalid_request_error", "no_chat_template", "messages",
                                     "model '%s' has no chat template (chat_template in tokenizer_config.json): use "
                                     "/v1/completions with a prompt",
                                     s->name);
        if (rc == TK_ERR_INVALID)
            return tk_serve__oa_errf(e, 400, "invalid_request_error", "chat_template_error", "messages",
                                     "the model's chat template refused the messages: %s", tk_last_error());
        if (rc != TK_OK)
            return tk_serve__oa_errf(e, 500, "server_error", "chat_template_error", "messages",
                                     "the model's chat template could not be rendered: %s", tk_last_error());
        rc = tk_tokenizer_encode(&r->pids[0], &r->plen[0], s->tok, text, strlen(text), 0);
        tk_free(text);
        if (rc != TK_OK)
            return tk_serve__oa_errf(e, 400, "invalid_request_error", "invalid_value", "messages", "%s",
                                     tk_last_error());
    } else {
        for (size_t i = 0; i < r->nprompt; i++) {
            tk_oa_prompt *q = &p->prompts[i];
            if (q->text) {
                if (tk_tokenizer_encode(&r->pids[i], &r->plen[i], s->tok, q->text, strlen(q->text), 1) != TK_OK)
                    return tk_serve__oa_errf(e, 400, "invalid_request_error", "invalid_value", "prompt", "%s",
                                             tk_last_error());
            } else {
                for (size_t k = 0; k < q->nids; k++)
                    if (q->ids[k] >= s->vocab)
                        return tk_serve__oa_errf(e, 400, "invalid_request_error", "invalid_value", "prompt",
                                                 "'prompt' token %zu is %d, outside the vocabulary (0 to %lld)", k,
                                                 (int)q->ids[k], (long long)s->vocab - 1);
                if (!(r->pids[i] = malloc(q->nids * sizeof *q->ids)))
                    return tk_serve__oa_errf(e, 500, "server_error", NULL, NULL, "out of memory");
                memcpy(r->pids[i], q->ids, q->nids * sizeof *q->ids);
                r->plen[i] = q->nids;
            }
        }
    }
    for (size_t i = 0; i < r->nprompt; i++)
        if (r->plen[i] == 0)
            return tk_serve__oa_errf(e, 400, "invalid_request_error", "invalid_value",
                                     p->kind == TK_OA_CHAT ? "messages" : "prompt",
                                     "the prompt is empty (no tokens): give some text");
    return 0;
}

/* generation_config.json's defaults, then the request's fields (docs/serving.md, "Parameters"). */
static int make_opts(struct tk_model_server *s, tk_serve_req *r, tk_oa_err *e)
{
    tk_oa_req *p = &r->p;
    tk_gen_opts *o = &r->go;
    *o = s->base;
    if (p->has_temperature) {
        o->do_sample = p->temperature > 0;
        if (o->do_sample)
            o->temperature = p->temperature;
    }
    if (p->has_top_p)
        o->top_p = p->top_p;
    if (p->has_top_k)
        o->top_k = p->top_k;
    if (p->has_min_p)
        o->min_p = p->min_p;
    if (p->has_rep)
        o->repetition_penalty = p->repetition_penalty;
    o->presence_penalty = p->presence_penalty;
    o->frequency_penalty = p->frequency_penalty;
    o->logprobs = p->logprobs;
    o->top_logprobs = p->top_logprobs;
    o->stop_strings = (const char *const *)p->stop;
    o->n_stop = p->nstop;
    if (p->ignore_eos)
        o->n_eos = 0;
    o->seed = p->has_seed ? (uint64_t)p->seed : next_rand(s);
    o->num_beams = 1;
    size_t longest = 0;
    for (size_t i = 0; i < r->nprompt; i++)
        longest = r->plen[i] > longest ? r->plen[i] : longest;
    const char *what = p->kind == TK_OA_CHAT ? "messages" : "prompt";
    if ((int64_t)longest >= s->ctx_len)
        return tk_serve__oa_errf(e, 400, "invalid_request_error", "context_length_exceeded", what,
                                 "This model's maximum context length is %lld tokens. However, your %s has %zu tokens, "
                                 "leaving no room for the completion. Please reduce the length of the %s.",
                                 (long long)s->ctx_len, what, longest, what);
    const char *dparam = p->steps            ? "steps"
                         : p->block_length   ? "block_length"
                         : p->cfg_scale      ? "cfg_scale"
                         : p->remasking >= 0 ? "remasking"
                         : p->alg[0]         ? "alg"
                                             : NULL;
    if (!s->diffusion && dparam)
        return tk_serve__oa_errf(e, 400, "invalid_request_error", "invalid_value", dparam,
                                 "'%s' applies to a diffusion model (LLaDA, Dream%s); %s generates token by token",
                                 dparam, p->steps ? ", DiffusionGemma" : "", s->name);
    const char *bparam = p->t_min >= 0                  ? "t_min"
                         : p->t_max >= 0                ? "t_max"
                         : p->entropy_bound >= 0        ? "entropy_bound"
                         : p->confidence_threshold >= 0 ? "confidence_threshold"
                         : p->stability_threshold >= 0  ? "stability_threshold"
                                                        : NULL;
    if (s->diffusion != TK_DIFF_BLOCK && bparam)
        return tk_serve__oa_errf(e, 400, "invalid_request_error", "invalid_value", bparam,
                                 "'%s' applies to a block diffusion model (DiffusionGemma); %s %s", bparam, s->name,
                                 s->diffusion ? "is a masked diffusion model" : "generates token by token");
    if (s->diffusion && p->logprobs)
        return tk_serve__oa_errf(e, 400, "invalid_request_error", "invalid_value", "logprobs",
                                 "logprobs are not available from a diffusion model (%s): its tokens are "
                                 "chosen in parallel, not sampled one after another",
                                 s->diffusion == TK_DIFF_DREAM   ? "Dream"
                                 : s->diffusion == TK_DIFF_BLOCK ? "DiffusionGemma"
                                                                 : "LLaDA");
    /* without max_tokens: the rest of the context for a chat, 16 tokens for a completion (OpenAI's);
     * a masked diffusion model denoises every position each step, so a chat gets 128 (LLaDA's) */
    int64_t room = s->ctx_len - (int64_t)longest, chat_default = s->diffusion && room > 128 ? 128 : room;
    int64_t want = p->has_max_tokens ? p->max_tokens : p->kind == TK_OA_CHAT ? chat_default : (16 < room ? 16 : room);
    if ((int64_t)longest + want > s->ctx_len)
        return tk_serve__oa_errf(e, 400, "invalid_request_error", "context_length_exceeded", "max_tokens",
                                 "This model's maximum context length is %lld tokens. However, you requested %lld "
                                 "tokens (%zu in the %s, %lld in the completion). Please reduce the length of the %s "
                                 "or completion.",
                                 (long long)s->ctx_len, (long long)((int64_t)longest + want), longest, what,
                                 (long long)want, what);
    o->max_new_tokens = want;
    unsigned par = s->o.parallel ? s->o.parallel : 4;
    if ((size_t)p->n * r->nprompt > par)
        return tk_serve__oa_errf(e, 400, "invalid_request_error", "invalid_value", "n",
                                 "%zu sequences asked (n %lld x %zu prompts), but this server runs at most %u at once "
                                 "(--parallel)",
                                 (size_t)p->n * r->nprompt, (long long)p->n, r->nprompt, par);
    return 0;
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    tk_serve_req *r = cls;
    struct tk_model_server *s = r->srv;
    (void)pos;
    pthread_mutex_lock(&s->mu);
    ssize_t n = 0;
    if (r->out.len > r->out_off) {
        size_t k = r->out.len - r->out_off;
        if (k > max)
            k = max;
        memcpy(buf, r->out.data + r->out_off, k);
        r->out_off += k;
        if (r->out_off == r->out.len)
            r->out.len = r->out_off = 0;
        n = (ssize_t)k;
    } else if (r->out_done) {
        n = MHD_CONTENT_READER_END_OF_STREAM;
    } else if (r->conn) {
        r->suspended = 1;
        MHD_suspend_connection(r->conn);
    }
    pthread_mutex_unlock(&s->mu);
    return n;
}

static void sse_free(void *cls) { tk_serve__req_unref(cls); }

static int queue_room(struct tk_model_server *s)
{
    if (s->nq < s->capq)
        return 0;
    size_t c = s->capq ? 2 * s->capq : 64;
    tk_serve_req **q = realloc(s->queue, c * sizeof *q);
    if (!q)
        return -1;
    s->queue = q;
    s->capq = c;
    return 0;
}

static enum MHD_Result generate(struct tk_model_server *s, struct MHD_Connection *c, hreq *h)
{
    tk_oa_err e;
    tk_serve_req *r = calloc(1, sizeof *r);
    if (!r)
        return MHD_NO;
    r->refs = 1;
    r->srv = s;
    r->fd = -1;
    r->t0 = h->t0;
    int kind = h->route == R_CHAT ? TK_OA_CHAT : TK_OA_COMPLETION;
    if (tk_serve__oa_parse(&r->p, kind, h->body.data ? h->body.data : "", h->body.len, &e) != 0) {
        req_free(r);
        return send_err(c, h, &e);
    }
    if (r->p.model && strcmp(r->p.model, s->name) != 0) {
        tk_serve__oa_errf(&e, 404, "invalid_request_error", "model_not_found", "model",
                          "The model '%.200s' does not exist: this server serves '%s'", r->p.model, s->name);
        req_free(r);
        return send_err(c, h, &e);
    }
    if (make_prompts(s, r, &e) != 0 || make_opts(s, r, &e) != 0) {
        req_free(r);
        return send_err(c, h, &e);
    }
    r->nchoice = r->nprompt * (size_t)r->p.n;
    if (!(r->ch = calloc(r->nchoice, sizeof *r->ch))) {
        req_free(r);
        return MHD_NO;
    }
    for (size_t i = 0; i < r->nchoice; i++) {
        r->ch[i].seq = -1;
        r->ch[i].prompt = i / (size_t)r->p.n;
    }
    unsigned char rb[12];
    RAND_bytes(rb, sizeof rb);
    snprintf(r->id, sizeof r->id, "%s-", kind == TK_OA_CHAT ? "chatcmpl" : "cmpl");
    for (size_t i = 0; i < sizeof rb; i++)
        snprintf(r->id + strlen(r->id), 3, "%02x", rb[i]);
    r->created = tk__now();
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    pthread_mutex_lock(&s->mu);
    unsigned maxq = s->o.max_queue ? s->o.max_queue : 64;
    if (s->state != SRV_READY || s->stopping) {
        s->req_rejected++;
        pthread_mutex_unlock(&s->mu);
        req_free(r);
        return errf(c, h, 503, "server_error", "service_unavailable", NULL, "%s",
                    s->state == SRV_LOADING ? "the model is still loading: retry in a moment"
                                            : "the server is shutting down");
    }
    if (s->nq >= maxq || queue_room(s) != 0) {
        s->req_rejected++;
        size_t nq = s->nq;
        pthread_mutex_unlock(&s->mu);
        req_free(r);
        return errf(c, h, 429, "rate_limit_exceeded", "queue_full", NULL,
                    "the server is busy: %zu requests are waiting (--max-queue %u); retry later", nq, maxq);
    }
    for (size_t i = 0; i < r->nprompt; i++)
        s->prompt_tokens += (int64_t)r->plen[i];
    r->conn = c;
    r->fd = ci ? ci->connect_fd : -1;
    r->refs = 2; /* the connection's (hreq) and the scheduler's */
    s->queue[s->nq++] = r;
    h->r = r;
    enum MHD_Result ret = MHD_YES;
    if (r->p.stream) {
        struct MHD_Response *resp =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 << 10, sse_read, r, sse_free);
        if (resp) {
            r->refs++; /* the response's */
            r->status = 200;
            h->status = 200;
            MHD_add_response_header(resp, "Content-Type", "text/event-stream");
            MHD_add_response_header(resp, "Cache-Control", "no-cache");
            MHD_add_response_header(resp, "X-Accel-Buffering", "no");
            ret = MHD_queue_response(c, 200, resp);
            MHD_destroy_response(resp);
        } else {
            r->gone = 1;
            ret = MHD_NO;
        }
    } else {
        r->suspended = 1;
        MHD_suspend_connection(c);
    }
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return ret;
}

/* ---- libmicrohttpd callbacks ------------------------------------------------------------------ */

static tk_serve_conn *conn_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    struct tk_model_server *s = cls;
    hreq *h = *con_cls;
    (void)version;
    if (!h) {
        if (!(h = calloc(1, sizeof *h)))
            return MHD_NO;
        *con_cls = h;
        h->t0 = tk__now_ms();
        snprintf(h->line, sizeof h->line, "%s %.120s", method, url);
        int bad_method = 0;
        h->route = route_of(url, method, s->name, &bad_method);
        if (h->route == R_NONE)
            return errf(c, h, 404, "invalid_request_error", "unknown_url", NULL, "Unknown request URL: %s %.200s",
                        method, url);
        if (bad_method)
            return errf(c, h, 405, "invalid_request_error", "method_not_allowed", NULL, "%s is not allowed on %.200s",
                        method, url);
        if (h->route != R_HEALTH && !authorized(s, c))
            return errf(c, h, 401, "invalid_request_error", "invalid_api_key", NULL,
                        "Incorrect or missing API key: send 'Authorization: Bearer KEY' with the key the server was "
                        "started with");
        if (h->route == R_METRICS && !s->o.metrics)
            return errf(c, h, 404, "invalid_request_error", "unknown_url", NULL,
                        "metrics are off: start the server with --metrics");
        int64_t max = s->o.max_body > 0 ? s->o.max_body : (int64_t)4 << 20;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        int64_t len = 0;
        if (cl && tk__parse_i64(cl, 0, INT64_MAX, &len) == 0 && len > max)
            return errf(c, h, 413, "invalid_request_error", "request_too_large", NULL,
                        "the request body is %lld bytes; this server takes at most %lld", (long long)len,
                        (long long)max);
        return MHD_YES;
    }
    if (h->r) { /* resumed: the answer is ready (or the stream was queued already) */
        if (*upload_data_size) {
            *upload_data_size = 0;
            return MHD_YES;
        }
        pthread_mutex_lock(&s->mu);
        tk_serve_req *r = h->r;
        int done = r->state == RQ_DONE && !r->p.stream;
        char *body = done ? r->body : NULL;
        unsigned st = (unsigned)r->status;
        if (done)
            r->body = NULL;
        if (!done && !r->p.stream && r->conn) { /* woken early: wait again */
            r->suspended = 1;
            MHD_suspend_connection(c);
        }
        pthread_mutex_unlock(&s->mu);
        if (!done)
            return MHD_YES;
        enum MHD_Result ret = body ? send_body(c, h, st ? st : 500, "application/json", body) : MHD_NO;
        free(body);
        return ret;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        int64_t max = s->o.max_body > 0 ? s->o.max_body : (int64_t)4 << 20;
        if (h->overflow || (int64_t)(h->body.len + n) > max) {
            h->overflow = 1;
            return MHD_YES; /* read and dropped; 413 at the end */
        }
        return tk__buf_append(&h->body, upload_data, n) == TK_OK ? MHD_YES : MHD_NO;
    }
    tk_serve_conn *sc = conn_of(c);
    if (sc) {
        pthread_mutex_lock(&s->cmu);
        sc->receiving = 0;
        pthread_mutex_unlock(&s->cmu);
    }
    if (h->overflow)
        return errf(c, h, 413, "invalid_request_error", "request_too_large", NULL,
                    "the request body is larger than this server takes (%lld bytes)",
                    (long long)(s->o.max_body > 0 ? s->o.max_body : (int64_t)4 << 20));
    switch (h->route) {
    case R_HEALTH: return health(s, c, h);
    case R_METRICS: return metrics(s, c, h);
    default: break;
    }
    pthread_mutex_lock(&s->mu);
    int st = s->state;
    pthread_mutex_unlock(&s->mu);
    if (st != SRV_READY)
        return errf(c, h, 503, "server_error", "service_unavailable", NULL, "%s",
                    st == SRV_LOADING  ? "the model is still loading: retry in a moment"
                    : st == SRV_FAILED ? "the model failed to load"
                                       : "the server is shutting down");
    switch (h->route) {
    case R_MODELS: return send_json(c, h, 200, json_pack("{s:s, s:[o]}", "object", "list", "data", model_obj(s)));
    case R_MODEL: {
        const char *id = url + 11;
        if (strcmp(id, s->name) != 0)
            return errf(c, h, 404, "invalid_request_error", "model_not_found", "model",
                        "The model '%.200s' does not exist: this server serves '%s'", id, s->name);
        return send_json(c, h, 200, model_obj(s));
    }
    case R_TOKENIZE: return tokenize(s, c, h, 0);
    case R_DETOKENIZE: return tokenize(s, c, h, 1);
    default: return generate(s, c, h);
    }
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    struct tk_model_server *s = cls;
    hreq *h = *con_cls;
    tk_serve_conn *sc = conn_of(c);
    if (sc) {
        pthread_mutex_lock(&s->cmu);
        sc->receiving = 1;
        sc->t0 = tk__now_ms();
        pthread_mutex_unlock(&s->cmu);
    }
    if (!h)
        return;
    *con_cls = NULL;
    int64_t prompt = 0, gen = 0, cached = 0;
    if (h->r) {
        pthread_mutex_lock(&s->mu);
        tk_serve_req *r = h->r;
        r->conn = NULL;
        r->fd = -1;
        r->suspended = 0;
        if (r->state != RQ_DONE)
            r->gone = 1; /* the scheduler cancels it */
        for (size_t i = 0; i < r->nprompt; i++) {
            prompt += (int64_t)r->plen[i];
            cached += r->pcached[i];
        }
        for (size_t i = 0; i < r->nchoice; i++)
            gen += r->ch[i].ntok;
        pthread_cond_signal(&s->cv);
        tk_serve__req_unref_locked(r);
        pthread_mutex_unlock(&s->mu);
    }
    if (s->o.log) {
        const char *how = toe == MHD_REQUEST_TERMINATED_COMPLETED_OK      ? ""
                          : toe == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED ? " (timed out)"
                          : toe == MHD_REQUEST_TERMINATED_CLIENT_ABORT    ? " (client went away)"
                                                                          : " (closed)";
        if (h->r)
            tk_serve__log(s, TK_LOG_INFO, "\"%s\" %u prompt=%lld completion=%lld cached=%lld %.1fms%s", h->line,
                          h->status, (long long)prompt, (long long)gen, (long long)cached, tk__now_ms() - h->t0, how);
        else
            tk_serve__log(s, TK_LOG_INFO, "\"%s\" %u %.1fms%s", h->line, h->status, tk__now_ms() - h->t0, how);
    }
    tk__buf_free(&h->body);
    free(h);
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    struct tk_model_server *s = cls;
    pthread_mutex_lock(&s->cmu);
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        tk_serve_conn *sc = calloc(1, sizeof *sc);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (sc && ci && s->nconn == s->capconn) { /* grow the table; on failure the connection goes untracked */
            size_t cap = s->capconn ? 2 * s->capconn : 64;
            tk_serve_conn **t = realloc(s->conns, cap * sizeof *t);
            if (t)
                s->conns = t, s->capconn = cap;
        }
        if (sc && ci && s->nconn < s->capconn) {
            sc->fd = ci->connect_fd;
            sc->t0 = tk__now_ms();
            sc->receiving = 1;
            s->conns[s->nconn++] = sc;
            *socket_context = sc;
        } else {
            free(sc);
            *socket_context = NULL;
        }
    } else if (*socket_context) {
        for (size_t i = 0; i < s->nconn; i++)
            if (s->conns[i] == *socket_context) {
                s->conns[i] = s->conns[--s->nconn];
                break;
            }
        free(*socket_context);
        *socket_context = NULL;
    }
    pthread_mutex_unlock(&s->cmu);
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    struct tk_model_server *s = cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n')
        msg[--n] = '\0';
    tk_serve__log(s, TK_LOG_WARN, "%s", msg);
}

/* ---- lifecycle -------------------------------------------------------------------------------- */

static char *dup_opt(const char *v, int *bad)
{
    if (!v)
        return NULL;
    char *d = strdup(v);
    if (!d)
        *bad = 1;
    return d;
}

int tk_model_server_new(tk_model_server **out, tk_ctx *ctx, const tk_model_server_opts *opts)
{
    if (out)
        *out = NULL;
    if (!out || !ctx || !opts || opts->version < 1 || opts->version > TK_MODEL_SERVER_OPTS_VERSION || !opts->model_dir)
        return tk__err(TK_ERR_INVALID, "tk_model_server_new: out, a context and options (TK_MODEL_SERVER_OPTS_INIT) "
                                       "with a model_dir are required");
    if (!tk__path_exists(opts->model_dir))
        return tk__err(TK_ERR_NOT_FOUND,
                       "no model directory '%s'\nHINT: give a Hugging Face checkpoint directory "
                       "(config.json, *.safetensors, tokenizer.json)",
                       opts->model_dir);
    if (opts->api_key && !*opts->api_key)
        return tk__err(TK_ERR_INVALID, "the API key is empty");
    if (opts->ctx_size < 0 || opts->max_body < 0 || opts->max_step_tokens < 0)
        return tk__err(TK_ERR_INVALID, "tk_model_server_new: ctx_size, max_body and max_step_tokens must be >= 0");
    const char *listen = opts->listen ? opts->listen : "127.0.0.1:0";
    int64_t port;
    struct addrinfo *ai = NULL;
    int rc0 = tk__listen_addr(listen, &ai, &port);
    if (rc0 != TK_OK)
        return rc0;
    tk_model_server *s = calloc(1, sizeof *s);
    if (!s) {
        freeaddrinfo(ai);
        return tk__err(TK_ERR_NOMEM, "out of memory");
    }
    s->magic = MSRV_MAGIC;
    s->o = *opts;
    if (opts->version < 2)
        s->o.comm = NULL, s->o.tp_plan = NULL;
    s->ctx = ctx;
    s->wake[0] = s->wake[1] = -1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->cmu, NULL);
    pthread_cond_init(&s->cv, NULL);
    int bad = 0, rc = TK_OK;
    s->dir = dup_opt(opts->model_dir, &bad);
    s->listen = dup_opt(listen, &bad);
    s->api_key = dup_opt(opts->api_key, &bad);
    s->dtype = dup_opt(opts->dtype, &bad);
    s->kv_dtype = dup_opt(opts->kv_dtype, &bad);
    s->tp_plan = dup_opt(s->o.tp_plan, &bad);
    if (opts->model_name) {
        s->name = dup_opt(opts->model_name, &bad);
    } else { /* the directory's last component */
        size_t n = strlen(opts->model_dir);
        while (n > 1 && opts->model_dir[n - 1] == '/')
            n--;
        size_t b = n;
        while (b > 0 && opts->model_dir[b - 1] != '/')
            b--;
        s->name = strndup(opts->model_dir + b, n - b);
        bad |= !s->name;
    }
    unsigned char seed[8];
    RAND_bytes(seed, sizeof seed);
    memcpy(&s->rng, seed, sizeof seed);
    s->o.model_dir = s->o.model_name = s->o.listen = s->o.api_key = s->o.dtype = s->o.kv_dtype = s->o.tp_plan = NULL;
    if (bad) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if (pipe2(s->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        rc = tk__err(TK_ERR_IO, "cannot make a pipe: %s", strerror(errno));
        goto fail;
    }
    unsigned threads = opts->threads ? opts->threads : 4;
    unsigned maxc = opts->max_connections ? opts->max_connections : 1024;
    /* poll(), not epoll: libmicrohttpd's epoll loop (0.9.75 and upstream) takes 128 events, then waits
     * again, up to the connection timeout, before serving them; one thread's 128 connections whose
     * requests arrived together sat unanswered for --timeout seconds (tests/cli/serve_model.sh,
     * t_burst_of_128_requests) */
    unsigned flags = MHD_USE_POLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    s->d = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, s,
                            MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_THREAD_POOL_SIZE, threads,
                            MHD_OPTION_CONNECTION_LIMIT, maxc, MHD_OPTION_CONNECTION_TIMEOUT,
                            (unsigned)(opts->timeout_s ? opts->timeout_s : 30), MHD_OPTION_CONNECTION_MEMORY_LIMIT,
                            (size_t)(32 << 10), MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, s, MHD_OPTION_END);
    freeaddrinfo(ai);
    ai = NULL;
    if (!s->d) {
        rc = tk__err(TK_ERR_IO,
                     "cannot listen on %s (address in use, or not permitted)\n"
                     "HINT: pick another port with --listen HOST:PORT (port 0 picks a free one)",
                     listen);
        goto fail;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? info->port : 0;
    if (pthread_create(&s->th, NULL, tk_serve__sched_main, s) != 0) {
        rc = tk__err(TK_ERR_NOMEM, "cannot start the scheduler thread");
        goto fail;
    }
    s->th_started = 1;
    *out = s;
    return TK_OK;
fail:
    if (ai)
        freeaddrinfo(ai);
    tk_model_server_free(s);
    return rc;
}

int tk_model_server_port(const tk_model_server *s) { return s && s->magic == MSRV_MAGIC ? s->port : 0; }

void tk_model_server_stop(tk_model_server *s)
{
    if (!s || s->magic != MSRV_MAGIC)
        return;
    char c = 's';
    if (write(s->wake[1], &c, 1) < 0) { /* full: a wake-up is already pending */
    }
}

int tk_model_server_run(tk_model_server *s)
{
    if (!s || s->magic != MSRV_MAGIC)
        return tk__err(TK_ERR_INVALID, "tk_model_server_run: not a tk_model_server");
    for (;;) { /* until stop(), or the model failed to load */
        char buf[16];
        struct pollfd p = {s->wake[0], POLLIN, 0};
        if (poll(&p, 1, -1) < 0 && errno != EINTR)
            break;
        ssize_t n = read(s->wake[0], buf, sizeof buf);
        int stop = 0;
        for (ssize_t i = 0; i < n; i++)
            stop |= buf[i] == 's';
        pthread_mutex_lock(&s->mu);
        int failed = s->state == SRV_FAILED;
        pthread_mutex_unlock(&s->mu);
        if (stop || failed)
            break;
    }
    /* drain: no new connections; queued requests answered 503; running ones get drain_s */
    pthread_mutex_lock(&s->mu);
    int failed = s->state == SRV_FAILED;
    if (!failed)
        s->state = SRV_DRAINING;
    s->stopping = 1;
    s->drain_deadline = tk__now_ms() + 1000.0 * (s->o.drain_s ? s->o.drain_s : 30);
    size_t running = s->nact;
    while (s->nq) {
        tk_serve_req *r = s->queue[--s->nq];
        r->state = RQ_DONE;
        s->req_rejected++;
        tk_oa_err e;
        tk_serve__oa_errf(&e, 503, "server_error", "service_unavailable", NULL, "the server is shutting down");
        if (r->p.stream) {
            char *j = tk_serve__oa_error_json(&e);
            if (j) {
                tk__buf_printf(&r->out, "data: %s\n\ndata: [DONE]\n\n", j);
                free(j);
            }
            r->out_done = 1;
        } else {
            r->status = 503;
            r->body = tk_serve__oa_error_json(&e);
        }
        tk_serve__wake(r);
        tk_serve__req_unref_locked(r);
    }
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    tk_serve__log(s, TK_LOG_INFO, "stopping: %zu running request(s) get up to %u s to finish", running,
                  s->o.drain_s ? s->o.drain_s : 30);
    MHD_socket ls = MHD_quiesce_daemon(s->d);
    if (ls != MHD_INVALID_SOCKET)
        close(ls);
    if (s->th_started) {
        pthread_join(s->th, NULL);
        s->th_started = 0;
    }
    /* let the last answers reach their clients (bounded) */
    for (int i = 0; i < 100; i++) {
        pthread_mutex_lock(&s->cmu);
        size_t busy = 0;
        for (size_t k = 0; k < s->nconn; k++)
            busy += !s->conns[k]->receiving;
        pthread_mutex_unlock(&s->cmu);
        if (!busy)
            break;
        usleep(20000);
    }
    if (failed) {
        pthread_mutex_lock(&s->mu);
        int rc = tk__err(s->load_rc ? s->load_rc : TK_ERR_INTERNAL, "%s", s->load_err);
        pthread_mutex_unlock(&s->mu);
        return rc;
    }
    return TK_OK;
}

/* A split model (--tp): what rank 0 sent of the LM head's logits, rows gathered and picks (tests/cli/
 * tp_models.sh reads it). */
static void tp_head_bytes_note(const tk_model *m)
{
    char *info = NULL;
    if (!m || tk_model_info_json(&info, m) != TK_OK)
        return;
    json_t *o = json_loads(info, 0, NULL), *tp = json_object_get(o, "tensor_parallel");
    if (tp && json_integer_value(json_object_get(tp, "world")) > 1)
        fprintf(stderr, "tk serve-model: tensor parallel: rank 0 sent %lld B of logits rows and picks\n",
                (long long)json_integer_value(json_object_get(tp, "head_bytes_sent")));
    json_decref(o);
    free(info);
}

void tk_model_server_free(tk_model_server *s)
{
    if (!s || s->magic != MSRV_MAGIC)
        return;
    if (s->th_started) { /* never ran: stop the scheduler */
        pthread_mutex_lock(&s->mu);
        s->stopping = 1;
        s->state = s->state == SRV_FAILED ? SRV_FAILED : SRV_DRAINING;
        s->drain_deadline = 0;
        pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->th, NULL);
    }
    if (s->d) {
        pthread_mutex_lock(&s->mu); /* nothing may stay suspended when the daemon stops */
        for (size_t i = 0; i < s->nact; i++)
            tk_serve__wake(s->act[i]);
        pthread_mutex_unlock(&s->mu);
        MHD_stop_daemon(s->d);
    }
    while (s->nact)
        tk_serve__req_unref_locked(s->act[--s->nact]);
    while (s->nq)
        tk_serve__req_unref_locked(s->queue[--s->nq]);
    free(s->act);
    free(s->queue);
    for (size_t i = 0; i < s->nconn; i++)
        free(s->conns[i]);
    free(s->conns);
    tk_gen_batch_free(s->b);
    tk_diff_batch_free(s->db);
    tp_head_bytes_note(s->m);
    tk_model_free(s->m);
    if (s->wake[0] >= 0)
        close(s->wake[0]);
    if (s->wake[1] >= 0)
        close(s->wake[1]);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->cmu);
    pthread_cond_destroy(&s->cv);
    free(s->dir);
    free(s->name);
    free(s->listen);
    free(s->api_key);
    free(s->dtype);
    free(s->kv_dtype);
    free(s->tp_plan);
    free(s->jr);
    s->magic = 0;
    free(s);
}
