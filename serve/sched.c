/*
 * sched.c — the model server's scheduler thread: it loads the model, then runs continuous batching
 * over one tk_gen_batch (a diffusion checkpoint: one tk_diff_batch, every running canvas in each
 * step's forward). Each turn it drops the requests whose client went away (their sequences leave the
 * batch at once and free their KV blocks), admits queued requests while their choices fit in
 * --parallel (FIFO: a big request is never passed by smaller ones), runs one step, and turns the
 * step's events into each request's answer: SSE chunks for a stream (text held back while it may be
 * the start of a stop string), the whole body once every choice ended otherwise.
 *
 * The mutex is held between steps only; a step runs the model without it, so HTTP threads keep
 * answering (health, metrics, queueing) while the model works.
 */
#define _GNU_SOURCE /* POLLRDHUP */
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "serve/model_server.h"

static int grow(void **p, size_t *cap, size_t need, size_t el)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap * 2 : 16;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * el);
    if (!q)
        return -1;
    *p = q;
    *cap = c;
    return 0;
}

/* ---- answers ---------------------------------------------------------------------------------- */

static json_t *usage_json(const tk_serve_req *r)
{
    int64_t prompt = 0, cached = 0, gen = 0;
    for (size_t i = 0; i < r->nprompt; i++) {
        prompt += (int64_t)r->plen[i];
        cached += r->pcached[i];
    }
    for (size_t i = 0; i < r->nchoice; i++)
        gen += r->ch[i].ntok;
    return json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", (json_int_t)prompt, "completion_tokens",
                     (json_int_t)gen, "total_tokens", (json_int_t)(prompt + gen), "prompt_tokens_details",
                     "cached_tokens", (json_int_t)cached);
}

/* Completions' logprobs from chat-shaped entries [from, to): {tokens, token_logprobs, top_logprobs,
 * text_offset}. */
static json_t *completion_logprobs(const json_t *lp, size_t from, size_t to, size_t offset0)
{
    json_t *o = json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
    size_t off = offset0;
    for (size_t i = from; o && i < to; i++) {
        json_t *e = json_array_get(lp, i), *top = json_object(), *t;
        const char *tok = json_string_value(json_object_get(e, "token"));
        size_t k;
        json_array_foreach(json_object_get(e, "top_logprobs"), k, t)
            json_object_set(top, json_string_value(json_object_get(t, "token")), json_object_get(t, "logprob"));
        json_array_append(json_object_get(o, "tokens"), json_object_get(e, "token"));
        json_array_append(json_object_get(o, "token_logprobs"), json_object_get(e, "logprob"));
        json_array_append_new(json_object_get(o, "top_logprobs"), top);
        json_array_append_new(json_object_get(o, "text_offset"), json_integer((json_int_t)off));
        off += tok ? strlen(tok) : 0;
    }
    return o;
}

static json_t *base_obj(const tk_serve_req *r, const char *object)
{
    return json_pack("{s:s, s:s, s:I, s:s, s:s}", "id", r->id, "object", object, "created", (json_int_t)r->created,
                     "model", r->srv->name, "system_fingerprint", "tk-" TK_VERSION_STRING);
}

char *tk_serve__final_json(const tk_serve_req *r)
{
    int chat = r->p.kind == TK_OA_CHAT;
    json_t *o = base_obj(r, chat ? "chat.completion" : "text_completion"), *choices = json_array();
    for (size_t i = 0; o && choices && i < r->nchoice; i++) {
        const tk_serve_choice *c = &r->ch[i];
        json_t *text = json_stringn(c->text.data ? c->text.data : "", c->text.len), *lp = json_null(), *ch;
        if (c->lp)
            lp = chat ? json_pack("{s:O}", "content", c->lp) : completion_logprobs(c->lp, 0, json_array_size(c->lp), 0);
        if (chat)
            ch = json_pack("{s:I, s:{s:s, s:o}, s:o, s:s}", "index", (json_int_t)i, "message", "role", "assistant",
                           "content", text, "logprobs", lp, "finish_reason", c->finish ? c->finish : "length");
        else
            ch = json_pack("{s:I, s:o, s:o, s:s}", "index", (json_int_t)i, "text", text, "logprobs", lp,
                           "finish_reason", c->finish ? c->finish : "length");
        json_array_append_new(choices, ch);
    }
    if (!o || !choices) {
        json_decref(o);
        json_decref(choices);
        return NULL;
    }
    json_object_set_new(o, "choices", choices);
    json_object_set_new(o, "usage", usage_json(r));
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    return s;
}

/* Appends "data: {json}\n\n" of one chunk to r's stream. */
static void sse_put(tk_serve_req *r, json_t *o)
{
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(o);
    if (!s)
        return;
    tk__buf_puts(&r->out, "data: ");
    tk__buf_puts(&r->out, s);
    tk__buf_puts(&r->out, "\n\n");
    free(s);
}

/* A stream chunk for choice i: new text, new logprob entries and (at the end) the finish reason. */
static void sse_choice(tk_serve_req *r, size_t i, const char *text, size_t len, int final)
{
    tk_serve_choice *c = &r->ch[i];
    int chat = r->p.kind == TK_OA_CHAT;
    size_t nlp = c->lp ? json_array_size(c->lp) : 0;
    if (!len && c->role_sent && !final && nlp == c->lp_sent)
        return; /* nothing new to tell */
    json_t *o = base_obj(r, chat ? "chat.completion.chunk" : "text_completion"), *lp = json_null(), *ch;
    if (c->lp && nlp > c->lp_sent) {
        if (chat) {
            json_t *a = json_array();
            for (size_t k = c->lp_sent; k < nlp; k++)
                json_array_append(a, json_array_get(c->lp, k));
            json_decref(lp);
            lp = json_pack("{s:o}", "content", a);
        } else {
            json_decref(lp);
            lp = completion_logprobs(c->lp, c->lp_sent, nlp, c->sent - len);
        }
        c->lp_sent = nlp;
    }
    json_t *fin = final ? json_string(c->finish ? c->finish : "length") : json_null();
    if (chat) {
        json_t *delta = json_object();
        if (!c->role_sent) {
            json_object_set_new(delta, "role", json_string("assistant"));
            c->role_sent = 1;
        }
        if (len || !final)
            json_object_set_new(delta, "content", json_stringn(text, len));
        ch = json_pack("{s:I, s:o, s:o, s:o}", "index", (json_int_t)i, "delta", delta, "logprobs", lp, "finish_reason",
                       fin);
    } else {
        c->role_sent = 1;
        ch = json_pack("{s:I, s:s%, s:o, s:o}", "index", (json_int_t)i, "text", text, len, "logprobs", lp,
                       "finish_reason", fin);
    }
    if (o && ch) {
        json_object_set_new(o, "choices", json_pack("[o]", ch));
        if (r->p.include_usage)
            json_object_set_new(o, "usage", json_null());
        sse_put(r, o);
    } else {
        json_decref(o);
        json_decref(ch);
    }
}

/* The end of a stream: the usage chunk when asked for, then [DONE]. */
static void sse_end(tk_serve_req *r)
{
    if (r->p.include_usage) {
        json_t *o = base_obj(r, r->p.kind == TK_OA_CHAT ? "chat.completion.chunk" : "text_completion");
        if (o) {
            json_object_set_new(o, "choices", json_array());
            json_object_set_new(o, "usage", usage_json(r));
        }
        sse_put(r, o);
    }
    tk__buf_puts(&r->out, "data: [DONE]\n\n");
    r->out_done = 1;
}

/* An error inside a stream that already answered 200: one error event, then [DONE]. */
static void sse_error(tk_serve_req *r, int status, const char *msg)
{
    tk_oa_err e;
    tk_serve__oa_errf(&e, status, status >= 500 ? "server_error" : "invalid_request_error", NULL, NULL, "%s", msg);
    char *j = tk_serve__oa_error_json(&e);
    if (j) {
        tk__buf_puts(&r->out, "data: ");
        tk__buf_puts(&r->out, j);
        tk__buf_puts(&r->out, "\n\n");
        free(j);
    }
    tk__buf_puts(&r->out, "data: [DONE]\n\n");
    r->out_done = 1;
}

void tk_serve__wake(tk_serve_req *r)
{
    if (r->conn && r->suspended) {
        r->suspended = 0;
        MHD_resume_connection(r->conn);
    }
}

/* Ends request r (under mu): its answer is complete (or failed with status/msg). */
static void finish_req(struct tk_model_server *s, tk_serve_req *r, int status, const char *msg)
{
    if (r->state == RQ_DONE)
        return;
    r->state = RQ_DONE;
    if (status == 200)
        s->req_ok++;
    else if (r->gone)
        s->req_cancelled++;
    else
        s->req_error++;
    if (r->p.stream && r->status == 200) {
        if (status == 200) {
            sse_end(r);
        } else {
            sse_error(r, status, msg);
        }
    } else if (status == 200) {
        r->status = 200;
        r->body = tk_serve__final_json(r);
        if (!r->body) {
            r->status = 500;
            r->body = strdup("{\"error\": {\"message\": \"out of memory\", \"type\": \"server_error\", \"param\": "
                             "null, \"code\": null}}");
        }
    } else {
        tk_oa_err e;
        tk_serve__oa_errf(&e, status, status >= 500 ? "server_error" : "invalid_request_error",
                          status == 503 ? "service_unavailable" : NULL, NULL, "%s", msg);
        r->status = status;
        r->body = tk_serve__oa_error_json(&e);
    }
    tk_serve__wake(r);
}

/* ---- the scheduler ---------------------------------------------------------------------------- */

static void remove_active(struct tk_model_server *s, size_t i)
{
    tk_serve_req *r = s->act[i];
    for (size_t k = 0; k < r->nchoice; k++) {
        if (r->ch[k].live) {
            if (s->db)
                tk_diff_batch_cancel(s->db, r->ch[k].seq);
            else
                tk_serve__tp_cancel(s, r->ch[k].seq);
            s->busy--;
            r->ch[k].live = 0;
        }
        if (!r->ch[k].finish)
            r->ch[k].finish = "length";
    }
    memmove(s->act + i, s->act + i + 1, (s->nact - i - 1) * sizeof *s->act);
    s->nact--;
    tk_serve__req_unref_locked(r);
}

/* A client that closed its connection: its socket reads end-of-file (POLLRDHUP) before libmicrohttpd
 * notices, which it does not while the connection is suspended. */
static int client_gone(tk_serve_req *r)
{
    if (r->gone)
        return 1;
    if (r->fd < 0)
        return 0;
    struct pollfd p = {r->fd, POLLRDHUP, 0};
    if (poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)))
        r->gone = 1;
    return r->gone;
}

static void drop_gone(struct tk_model_server *s)
{
    for (size_t i = 0; i < s->nact;) {
        tk_serve_req *r = s->act[i];
        if (client_gone(r)) {
            tk_serve__log(s, TK_LOG_INFO, "%s: the client went away; its %zu sequence(s) leave the batch", r->id,
                          r->nchoice);
            finish_req(s, r, 499, "the client went away");
            remove_active(s, i);
        } else {
            i++;
        }
    }
    for (size_t i = 0; i < s->nq;) {
        tk_serve_req *r = s->queue[i];
        if (client_gone(r)) {
            finish_req(s, r, 499, "the client went away");
            memmove(s->queue + i, s->queue + i + 1, (s->nq - i - 1) * sizeof *s->queue);
            s->nq--;
            tk_serve__req_unref_locked(r);
        } else {
            i++;
        }
    }
}

/* Requests still sending after the timeout (one byte a second: slowloris) lose their connection: a
 * shutdown makes libmicrohttpd's next read fail and close it. */
static void reap_slow(struct tk_model_server *s)
{
    double now = tk__now_ms(), limit = (s->o.timeout_s ? s->o.timeout_s : 30) * 1000.0;
    pthread_mutex_lock(&s->cmu);
    for (size_t i = 0; i < s->nconn; i++) {
        tk_serve_conn *c = s->conns[i];
        if (c->receiving && !c->reaped && now - c->t0 > limit) {
            c->reaped = 1;
            shutdown(c->fd, SHUT_RDWR);
            tk_serve__log(s, TK_LOG_WARN, "closed a connection still sending its request after %u s",
                          s->o.timeout_s ? s->o.timeout_s : 30);
        }
    }
    pthread_mutex_unlock(&s->cmu);
}

static int diff_add(struct tk_model_server *s, tk_serve_req *r);
static int diff_error(char *msg, size_t cap, int rc);

/* Adds request r's choices to s->b: n sequences a prompt, sharing its prefill (under mu). */
static int gen_add(struct tk_model_server *s, tk_serve_req *r)
{
    int rc = TK_OK;
    size_t n = (size_t)r->p.n;
    for (size_t p = 0; p < r->nprompt && rc == TK_OK; p++) {
        int64_t first;
        rc = tk_serve__tp_add(s, &first, r->pids[p], r->plen[p], n, &r->go);
        for (size_t j = 0; rc == TK_OK && j < n; j++) {
            r->ch[p * n + j].seq = first + (int64_t)j;
            r->ch[p * n + j].live = 1;
        }
        if (rc == TK_OK)
            s->busy += n;
    }
    return rc;
}

/* Starts the queued requests that fit (under mu; tk_gen_batch_add and tk_diff_batch_add run with it,
 * which is cheap). */
static void admit(struct tk_model_server *s)
{
    size_t par = s->o.parallel ? s->o.parallel : 4;
    while (s->nq > 0) {
        tk_serve_req *r = s->queue[0];
        if (s->busy + r->nchoice > par)
            break;
        memmove(s->queue, s->queue + 1, (s->nq - 1) * sizeof *s->queue);
        s->nq--;
        if (grow((void **)&s->act, &s->capact, s->nact + 1, sizeof *s->act)) {
            finish_req(s, r, 500, "the server is out of memory");
            tk_serve__req_unref_locked(r);
            continue;
        }
        int rc = s->db ? diff_add(s, r) : gen_add(s, r);
        s->act[s->nact++] = r;
        r->state = RQ_RUNNING;
        if (rc != TK_OK) {
            char msg[512];
            int status = rc == TK_ERR_NOMEM ? 503 : 400;
            if (s->db)
                diff_error(msg, sizeof msg, rc);
            else
                snprintf(msg, sizeof msg, "%s", tk_last_error());
            finish_req(s, r, status, msg);
            remove_active(s, s->nact - 1);
        }
    }
}

static tk_serve_req *find_seq(struct tk_model_server *s, int64_t seq, size_t *choice)
{
    for (size_t i = 0; i < s->nact; i++) {
        tk_serve_req *r = s->act[i];
        for (size_t k = 0; k < r->nchoice; k++)
            if (r->ch[k].seq == seq) {
                *choice = k;
                return r;
            }
    }
    return NULL;
}

static json_t *token_entry(const struct tk_model_server *s, int32_t id, float lp)
{
    char *t = NULL;
    if (tk_tokenizer_decode(&t, s->tok, &id, 1, 0) != TK_OK)
        t = NULL;
    const char *str = t ? t : "";
    json_t *bytes = json_array();
    for (const unsigned char *p = (const unsigned char *)str; *p; p++)
        json_array_append_new(bytes, json_integer(*p));
    json_t *o =
        json_pack("{s:s, s:f, s:o}", "token", str, "logprob", isfinite(lp) ? (double)lp : -9999.0, "bytes", bytes);
    tk_free(t);
    return o;
}

/* One event into its request's answer (under mu). */
static void on_event(struct tk_model_server *s, const tk_gen_event *ev)
{
    size_t k;
    tk_serve_req *r = find_seq(s, ev->seq, &k);
    if (!r)
        return;
    tk_serve_choice *c = &r->ch[k];
    if (ev->end && !strcmp(ev->end, "error")) {
        c->finish = "length";
        c->live = 0;
        s->busy--;
        for (size_t i = 0; i < s->nact; i++)
            if (s->act[i] == r) {
                finish_req(s, r, 500, tk_last_error());
                remove_active(s, i);
                break;
            }
        return;
    }
    if (!r->t_first)
        r->t_first = tk__now_ms();
    c->ntok++;
    s->gen_tokens++;
    if (c->ntok == 1 && k % (size_t)r->p.n == 0) {
        r->pcached[c->prompt] = ev->cached_tokens;
        s->cached_tokens += ev->cached_tokens;
    }
    if (r->p.logprobs) {
        if (!c->lp)
            c->lp = json_array();
        json_t *e = token_entry(s, ev->token, ev->logprob), *top = json_array();
        for (int i = 0; i < ev->ntop; i++)
            json_array_append_new(top, token_entry(s, ev->top_ids[i], ev->top_logprobs[i]));
        json_object_set_new(e, "top_logprobs", top);
        json_array_append_new(c->lp, e);
    }
    tk__buf_append(&c->text, ev->text, ev->len);
    if (ev->end) {
        c->finish = !strcmp(ev->end, "length") ? "length" : "stop";
        if (!strcmp(ev->end, "stop_string")) { /* OpenAI's text ends before the stop string */
            size_t cut = tk_serve__stop_find(c->text.data ? c->text.data : "", r->p.stop, r->p.nstop);
            if (cut != (size_t)-1 && cut < c->text.len) {
                c->text.len = cut;
                c->text.data[cut] = '\0';
            }
        }
        s->busy--;
        c->live = 0;
        r->nfinished++;
    }
    if (r->p.stream) {
        size_t upto = c->text.len;
        if (!ev->end)
            upto -= tk_serve__stop_holdback(c->text.data ? c->text.data : "", c->text.len, r->p.stop, r->p.nstop);
        if (upto < c->sent)
            upto = c->sent;
        sse_choice(r, k, c->text.data ? c->text.data + c->sent : "", upto - c->sent, ev->end != NULL);
        c->sent = upto;
    }
    if (r->nfinished == r->nchoice) {
        finish_req(s, r, 200, NULL);
        for (size_t i = 0; i < s->nact; i++)
            if (s->act[i] == r) {
                remove_active(s, i);
                break;
            }
    } else if (r->p.stream) {
        tk_serve__wake(r);
    }
}

static void fail_all(struct tk_model_server *s, int status, const char *msg)
{
    while (s->nact) {
        finish_req(s, s->act[0], status, msg);
        remove_active(s, 0);
    }
}

/* The drain's deadline: every running request ends now as if it reached max_tokens (finish_reason
 * "length", the text so far), streams with their final chunks. */
static void cut_all(struct tk_model_server *s)
{
    while (s->nact) {
        tk_serve_req *r = s->act[0];
        for (size_t k = 0; k < r->nchoice; k++) {
            tk_serve_choice *c = &r->ch[k];
            if (c->finish)
                continue;
            c->finish = "length";
            if (r->p.stream) {
                sse_choice(r, k, c->text.data ? c->text.data + c->sent : "", c->text.len - c->sent, 1);
                c->sent = c->text.len;
            }
        }
        finish_req(s, r, 200, NULL);
        remove_active(s, 0);
    }
}

/* ---- diffusion -------------------------------------------------------------------------------- */
/* LLaDA, Dream and DiffusionGemma run in s->db: admit() adds each choice as a sequence, the loop steps
 * the batch (one forward over every canvas) and each ended sequence answers its choice. */

/* Streams choice k's text to upto, holding back what may begin a stop string (under mu). */
static void diff_stream(tk_serve_req *r, size_t k, int final)
{
    tk_serve_choice *c = &r->ch[k];
    size_t upto = c->text.len;
    if (!final)
        upto -= tk_serve__stop_holdback(c->text.data ? c->text.data : "", c->text.len, r->p.stop, r->p.nstop);
    if (upto < c->sent)
        upto = c->sent;
    sse_choice(r, k, c->text.data ? c->text.data + c->sent : "", upto - c->sent, final);
    c->sent = upto;
    tk_serve__wake(r);
}

/* tk_diff_opts.on_step (user: the choice): a finished block's text streams (as tk generate --diffusion
 * prints it); a client gone, the drain's end or a stop string in the finished text stops the sampler. */
static int diff_on_step(void *user, const tk_diff_step *st)
{
    tk_serve_choice *c = user;
    tk_serve_req *r = c->req;
    struct tk_model_server *s = r->srv;
    size_t k = (size_t)(c - r->ch);
    int stop = 0;
    pthread_mutex_lock(&s->mu);
    if (client_gone(r) || (s->state == SRV_DRAINING && tk__now_ms() > s->drain_deadline)) {
        stop = 1;
    } else if (st->block_done && (r->p.stream || r->p.nstop)) {
        size_t end = st->prompt_len + (size_t)(st->block + 1) * ((st->len - st->prompt_len) / (size_t)st->blocks);
        char *t = NULL;
        if (tk_tokenizer_decode(&t, s->tok, st->canvas + st->prompt_len, end - st->prompt_len, 1) == TK_OK) {
            size_t len = strlen(t);
            /* a character whose bytes continue in the next block decodes as U+FFFD for now: held back */
            while (st->block + 1 < st->blocks && len >= 3 && !memcmp(t + len - 3, "\xef\xbf\xbd", 3))
                len -= 3;
            if (len > c->text.len && !memcmp(t, c->text.data ? c->text.data : "", c->text.len))
                tk__buf_append(&c->text, t + c->text.len, len - c->text.len);
        }
        tk_free(t);
        if (r->p.nstop && tk_serve__stop_find(c->text.data ? c->text.data : "", r->p.stop, r->p.nstop) != (size_t)-1)
            stop = 1; /* the rest cannot change the answer */
        else if (r->p.stream)
            diff_stream(r, k, 0);
    }
    pthread_mutex_unlock(&s->mu);
    return stop;
}

/* Choice k's sampler options: the request's fields only (generation_config.json's top_k 50 and
 * do_sample are an autoregressive model's, and tk generate --diffusion does not take them either). */
static void diff_opts(tk_diff_opts *o, tk_serve_req *r, size_t k)
{
    *o = (tk_diff_opts)TK_DIFF_OPTS_INIT;
    o->gen_length = r->go.max_new_tokens;
    o->temperature = r->p.has_temperature ? r->p.temperature : 0.0;
    o->seed = r->go.seed + k;
    o->steps = r->p.steps;
    o->block_length = r->p.block_length;
    o->cfg_scale = r->p.cfg_scale;
    if (r->p.remasking >= 0)
        o->remasking = r->p.remasking;
    if (r->p.alg[0])
        o->alg = r->p.alg;
    if (r->p.has_top_p)
        o->top_p = r->p.top_p;
    if (r->p.has_top_k)
        o->top_k = r->p.top_k;
    o->t_min = r->p.t_min; /* block diffusion's; -1: the checkpoint's */
    o->t_max = r->p.t_max;
    o->entropy_bound = r->p.entropy_bound;
    o->confidence_threshold = r->p.confidence_threshold;
    o->stability_threshold = r->p.stability_threshold;
    o->on_step = diff_on_step;
    o->step_user = &r->ch[k];
    r->ch[k].req = r;
}

/* The HTTP status and message of a sampler's failure rc (tk_last_error()): the sampler's words, less
 * the command line's hint; where they name gen_length, that is the request's max_tokens. */
static int diff_error(char *msg, size_t cap, int rc)
{
    int status = rc == TK_ERR_INVALID ? 400 : 500;
    snprintf(msg, cap, "%s", tk_last_error());
    char *hint = strstr(msg, "\nHINT:");
    if (hint)
        *hint = '\0';
    if (status == 400 && strstr(msg, "gen_length") && strlen(msg) + 40 < cap)
        strcat(msg, " (max_tokens is the gen_length)");
    return status;
}

/* Choice k's answer from its sampler's result (under mu). */
static void diff_answer(struct tk_model_server *s, tk_serve_req *r, size_t k, const tk_diff_result *res)
{
    tk_serve_choice *c = &r->ch[k];
    if (!r->t_first)
        r->t_first = tk__now_ms();
    size_t n = 0;
    const int32_t *ids = tk_diff_result_ids(res, &n);
    const char *text = tk_diff_result_text(res);
    c->text.len = 0; /* the whole answer, as LLaDA's reference decodes it: special tokens skipped */
    tk__buf_puts(&c->text, text ? text : "");
    c->ntok = (int64_t)n;
    s->gen_tokens += (int64_t)n;
    int eos = 0;
    for (size_t i = 0; i < n && !r->p.ignore_eos; i++)
        for (size_t e = 0; e < r->go.n_eos; e++)
            eos |= ids[i] == r->go.eos_token_id[e];
    c->finish = eos ? "stop" : "length";
    size_t cut = r->p.nstop ? tk_serve__stop_find(c->text.data ? c->text.data : "", r->p.stop, r->p.nstop) : (size_t)-1;
    if (cut != (size_t)-1) {
        c->text.len = cut;
        c->text.data[cut] = '\0';
        c->finish = "stop";
    }
    if (c->sent > c->text.len) /* streamed text the final decoding does not begin with: keep it */
        c->sent = c->text.len;
    r->nfinished++;
    if (r->p.stream)
        diff_stream(r, k, 1);
}

static void end_active(struct tk_model_server *s, tk_serve_req *r, int status, const char *msg)
{
    finish_req(s, r, status, msg);
    for (size_t i = 0; i < s->nact; i++)
        if (s->act[i] == r) {
            remove_active(s, i);
            break;
        }
}

/* Admits request r's choices into s->db (under mu): each a sequence of its prompt. */
static int diff_add(struct tk_model_server *s, tk_serve_req *r)
{
    for (size_t k = 0; k < r->nchoice; k++) {
        tk_diff_opts o;
        diff_opts(&o, r, k);
        int rc = tk_diff_batch_add(&r->ch[k].seq, s->db, r->pids[r->ch[k].prompt], r->plen[r->ch[k].prompt], &o);
        if (rc != TK_OK)
            return rc;
        r->ch[k].live = 1;
        s->busy++;
    }
    return TK_OK;
}

/* A sequence of s->db ended (under mu): its choice's answer, or its request's failure. */
static void diff_event(struct tk_model_server *s, const tk_diff_event *ev)
{
    size_t k;
    tk_serve_req *r = find_seq(s, ev->seq, &k);
    if (!r || !r->ch[k].live)
        return;
    r->ch[k].live = 0;
    s->busy--;
    if (ev->status != TK_OK) {
        tk__err(ev->status, "%s", ev->error);
        char msg[512];
        int status = diff_error(msg, sizeof msg, ev->status);
        end_active(s, r, status, msg);
    } else if (r->gone) {
        end_active(s, r, 499, "the client went away");
    } else {
        diff_answer(s, r, k, ev->result);
        if (r->nfinished == r->nchoice)
            end_active(s, r, 200, NULL);
    }
}

/* One step of s->db, mu held on entry and on return (released while the model runs). */
static void diff_step(struct tk_model_server *s)
{
    const tk_diff_event *ev = NULL;
    size_t nev = 0;
    pthread_mutex_unlock(&s->mu);
    int rc = tk_diff_batch_step(s->db, &ev, &nev);
    pthread_mutex_lock(&s->mu);
    if (rc != TK_OK) {
        tk_serve__log(s, TK_LOG_WARN, "a denoising step failed: %s", tk_last_error());
        fail_all(s, rc == TK_ERR_NOMEM ? 503 : 500, tk_last_error());
    } else {
        for (size_t i = 0; i < nev; i++)
            diff_event(s, &ev[i]);
    }
    s->st.active = (int64_t)tk_diff_batch_active(s->db);
    tk_diff_batch_stats_get(&s->dst, s->db);
}

/* The generated tokens a second, over windows of two seconds or more (under mu). */
static void tps_window(struct tk_model_server *s)
{
    double now = tk__now_ms();
    if (now - s->win_t0 >= 2000) {
        s->tps = (double)(s->gen_tokens - s->win_tok0) * 1000.0 / (now - s->win_t0);
        s->win_t0 = now;
        s->win_tok0 = s->gen_tokens;
    }
}

int tk_serve__load(struct tk_model_server *s)
{
    tk_model_opts mo = TK_MODEL_OPTS_INIT;
    mo.comm = s->o.comm;
    mo.tp_plan = s->tp_plan;
    mo.device_type = s->o.device_type;
    mo.device_id = s->o.device_id;
    mo.dtype = s->dtype;
    int rc = tk_model_load(&s->m, s->ctx, s->dir, &mo);
    if (rc == TK_OK && !tk_model_has_lm_head(s->m))
        rc = tk__err(TK_ERR_INVALID,
                     "%s has no LM head: it cannot generate text\nHINT: serve a causal LM "
                     "(LlamaForCausalLM, GPT2LMHeadModel, ...)",
                     tk_model_arch(s->m));
    if (rc == TK_OK)
        rc = tk_model_tokenizer(&s->tok, s->m);
    s->base = (tk_gen_opts)TK_GEN_OPTS_INIT;
    if (rc == TK_OK)
        rc = tk_gen_opts_from_model(&s->base, s->m);
    char *info = NULL;
    int64_t max_pos = 0;
    if (rc == TK_OK && (rc = tk_model_info_json(&info, s->m)) == TK_OK) {
        json_t *j = json_loads(info, 0, NULL);
        json_t *mp = json_object_get(j, "max_positions");
        max_pos = json_is_integer(mp) ? json_integer_value(mp) : 0;
        json_decref(j);
        tk_free(info);
    }
    if (rc != TK_OK)
        return rc;
    if (max_pos <= 0)
        max_pos = s->o.ctx_size > 0 ? s->o.ctx_size : 2048;
    if (s->o.ctx_size > max_pos)
        return tk__err(TK_ERR_INVALID, "--ctx-size %lld is more than the model's %lld positions",
                       (long long)s->o.ctx_size, (long long)max_pos);
    s->ctx_len = s->o.ctx_size > 0 ? s->o.ctx_size : max_pos;
    s->vocab = tk_model_vocab_size(s->m);
    if ((s->diffusion = tk_model_diffusion(s->m)) != 0) /* LLaDA, Dream, DiffusionGemma: their own batch */
        return tk_diff_batch_new(&s->db, s->m);
    tk_gen_batch_opts bo = TK_GEN_BATCH_OPTS_INIT;
    bo.kv_dtype = s->kv_dtype;
    bo.max_step_tokens = s->o.max_step_tokens > 0 ? s->o.max_step_tokens : 512;
    bo.prefix_cache = s->o.prefix_cache;
    /* room for every slot at full context: a sequence never waits for blocks */
    bo.kv_max_tokens = (int64_t)(s->o.parallel ? s->o.parallel : 4) * (s->ctx_len + bo.kv_block_size);
    return tk_gen_batch_new(&s->b, s->m, &bo);
}

/* One short generation in a batch of its own before /health says ready, so the first request does
 * not pay for the first touch of the weights (mmap'd pages read from disk, the thread pool, the
 * kernels a GPU loads): on SmolLM2-135M on the CPU the first request's first token came 60 ms sooner.
 * The server's batch and counters are not touched; a failure only costs the warmth, and is logged. */
void tk_serve__warm_up(struct tk_model_server *s)
{
    double t0 = tk__now_ms();
    tk_gen_batch_opts bo = TK_GEN_BATCH_OPTS_INIT;
    bo.kv_dtype = s->kv_dtype;
    bo.kv_max_tokens = 64;
    tk_gen_opts o = s->base;
    o.max_new_tokens = 2;
    o.do_sample = 0;
    const int32_t prompt[1] = {0};
    tk_gen_batch *b = NULL;
    int64_t seq;
    int rc = tk_gen_batch_new(&b, s->m, &bo);
    if (rc == TK_OK)
        rc = tk_gen_batch_add(&seq, b, prompt, 1, 1, &o);
    for (int i = 0; rc == TK_OK && i < 4 && tk_gen_batch_active(b); i++) {
        const tk_gen_event *ev;
        size_t nev;
        rc = tk_gen_batch_step(b, &ev, &nev);
    }
    if (rc != TK_OK)
        tk_serve__log(s, TK_LOG_WARN,
                      "the warm-up generation failed (%s): the first request pays the first "
                      "touch of the weights",
                      tk_last_error());
    else
        tk_serve__log(s, TK_LOG_INFO, "warmed up in %.1f ms", tk__now_ms() - t0);
    tk_gen_batch_free(b);
}

void *tk_serve__sched_main(void *arg)
{
    struct tk_model_server *s = arg;
    double t0 = tk__now_ms();
    int rc = tk_serve__load(s);
    if (rc == TK_OK && !s->diffusion)
        tk_serve__warm_up(s);
    pthread_mutex_lock(&s->mu);
    if (rc != TK_OK) {
        s->load_rc = rc;
        snprintf(s->load_err, sizeof s->load_err, "%s", tk_last_error());
        s->state = SRV_FAILED;
        pthread_mutex_unlock(&s->mu);
        tk_serve__log(s, TK_LOG_WARN, "the model did not load: %s", s->load_err);
        char c = 'f';
        if (write(s->wake[1], &c, 1) < 0) {
        }
        return NULL;
    }
    if (s->state == SRV_LOADING)
        s->state = SRV_READY;
    if (s->b)
        tk_gen_batch_stats_get(&s->st, s->b);
    s->win_t0 = tk__now_ms();
    pthread_mutex_unlock(&s->mu);
    tk_serve__log(s, TK_LOG_INFO, "model %s loaded in %.1f s: ready (context %lld tokens, %u parallel)", s->name,
                  (tk__now_ms() - t0) / 1000.0, (long long)s->ctx_len, s->o.parallel ? s->o.parallel : 4);
    double last_reap = 0;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        double now = tk__now_ms();
        if (now - last_reap > 250) {
            reap_slow(s);
            last_reap = now;
        }
        drop_gone(s);
        /* (a diffusion batch's sequences stop at their next step instead: diff_on_step) */
        if (s->state == SRV_DRAINING && now > s->drain_deadline && s->nact && !s->db) {
            tk_serve__log(s, TK_LOG_WARN, "stopping: %zu request(s) cut short at the drain's end", s->nact);
            cut_all(s);
        }
        admit(s); /* cancellations change the stats too */
        if (s->b)
            tk_gen_batch_stats_get(&s->st, s->b);
        else
            s->st.active = (int64_t)tk_diff_batch_active(s->db);
        if (s->nact == 0) {
            if (s->stopping) {
                pthread_mutex_unlock(&s->mu);
                tk_serve__tp_sync(s, TK_SERVE_TP_QUIT);
                break;
            }
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 200 * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&s->cv, &s->mu, &ts);
            pthread_mutex_unlock(&s->mu);
            /* --tp: the cancellations so far, and a heartbeat (the journal is this thread's alone) */
            if (s->o.comm && tk_serve__tp_sync(s, TK_SERVE_TP_IDLE) != TK_OK)
                tk_serve__log(s, TK_LOG_WARN, "tensor parallelism: %s", tk_last_error());
            continue;
        }
        if (s->db) {
            diff_step(s);
            tps_window(s);
            pthread_mutex_unlock(&s->mu);
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        const tk_gen_event *ev = NULL;
        size_t nev = 0;
        rc = tk_serve__tp_sync(s, TK_SERVE_TP_STEP);
        if (rc == TK_OK)
            rc = tk_gen_batch_step(s->b, &ev, &nev);
        pthread_mutex_lock(&s->mu);
        if (rc != TK_OK) {
            tk_serve__log(s, TK_LOG_WARN, "a model step failed: %s", tk_last_error());
            fail_all(s, 500, tk_last_error());
        } else {
            for (size_t i = 0; i < nev; i++)
                on_event(s, &ev[i]);
        }
        tk_gen_batch_stats_get(&s->st, s->b);
        tps_window(s);
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}
