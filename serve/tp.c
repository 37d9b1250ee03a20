/*
 * tp.c — tk serve-model --tp N (docs/parallel.md, docs/serving.md): rank 0 serves HTTP and schedules;
 * every rank runs the same forward. Rank 0's scheduler journals each change it makes to its batch (an
 * add: the prompt, the number of choices and the generation options; a cancel: the sequence) and,
 * before each step, broadcasts the journal with what comes next: a step, nothing (a heartbeat, every
 * 200 ms while idle, so the other ranks' wait stays under TK_COMM_TIMEOUT), or the end. The other ranks
 * (tk_model_server_follow) replay the journal on their own batch, in order, and step with rank 0:
 * batches that start alike and change alike step alike (sequence ids, slots, the prefix cache, the
 * sequences that end on eos or a stop string), and every collective inside the step is matched.
 *
 * A record: 'A' first(i64) len(i64) n(i64) ids(len x i32) opts(tk_gen_opts bytes) nstop(i64) then each
 * stop string as len(i64) bytes; 'C' seq(i64). The options travel as their bytes (every rank runs the
 * same tk), their pointers cleared and the stop strings rebuilt. A follower checks that its add got the
 * sequence id rank 0's did.
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "serve/model_server.h"

static void jr_put(struct tk_model_server *s, const void *p, size_t n)
{
    if (s->jr_failed)
        return;
    if (s->njr + n > s->capjr) {
        size_t c = s->capjr ? s->capjr * 2 : 4096;
        while (c < s->njr + n)
            c *= 2;
        unsigned char *q = realloc(s->jr, c);
        if (!q) {
            s->jr_failed = 1;
            return;
        }
        s->jr = q;
        s->capjr = c;
    }
    memcpy(s->jr + s->njr, p, n);
    s->njr += n;
}

static void jr_i64(struct tk_model_server *s, int64_t v) { jr_put(s, &v, sizeof v); }

int tk_serve__tp_add(struct tk_model_server *s, int64_t *first, const int32_t *prompt, size_t len, size_t n,
                     const tk_gen_opts *o)
{
    int rc = tk_gen_batch_add(first, s->b, prompt, len, n, o);
    if (rc != TK_OK || !s->o.comm)
        return rc; /* a failed add changes nothing: nothing to replay */
    tk_gen_opts c = *o;
    c.stop_strings = NULL, c.stream = NULL, c.stream_user = NULL, c.kv_dtype = NULL;
    jr_put(s, "A", 1);
    jr_i64(s, *first);
    jr_i64(s, (int64_t)len);
    jr_i64(s, (int64_t)n);
    jr_put(s, prompt, len * sizeof *prompt);
    jr_put(s, &c, sizeof c);
    jr_i64(s, (int64_t)o->n_stop);
    for (size_t k = 0; k < o->n_stop; k++) {
        jr_i64(s, (int64_t)strlen(o->stop_strings[k]));
        jr_put(s, o->stop_strings[k], strlen(o->stop_strings[k]));
    }
    return TK_OK;
}

void tk_serve__tp_cancel(struct tk_model_server *s, int64_t seq)
{
    tk_gen_batch_cancel(s->b, seq);
    if (s->o.comm) {
        jr_put(s, "C", 1);
        jr_i64(s, seq);
    }
}

/* Broadcasts hdr [journal bytes, what] and the journal from rank 0; on the others, receives them
 * (*buf grown to hold the journal). */
static int bcast(struct tk_comm *c, int64_t hdr[2], unsigned char **buf, size_t *cap)
{
    int64_t s1[1] = {2};
    tk_tensor h = {hdr, {TK_DEV_CPU, 0}, 1, {TK_DL_INT, 64, 1}, s1, NULL, 0};
    int rc = tk_comm_broadcast(c, &h, 0, NULL);
    if (rc != TK_OK || hdr[0] <= 0)
        return rc;
    if ((size_t)hdr[0] > *cap) {
        unsigned char *q = realloc(*buf, (size_t)hdr[0]);
        if (!q)
            return tk__err(TK_ERR_NOMEM, "out of memory for %lld bytes of the scheduler's journal", (long long)hdr[0]);
        *buf = q;
        *cap = (size_t)hdr[0];
    }
    int64_t sb[1] = {hdr[0]};
    tk_tensor b = {*buf, {TK_DEV_CPU, 0}, 1, {TK_DL_UINT, 8, 1}, sb, NULL, 0};
    return tk_comm_broadcast(c, &b, 0, NULL);
}

int tk_serve__tp_sync(struct tk_model_server *s, int what)
{
    if (!s->o.comm)
        return TK_OK;
    if (s->jr_failed)
        return tk__err(TK_ERR_NOMEM, "tensor parallelism: out of memory journaling the batch for the other ranks");
    int64_t hdr[2] = {(int64_t)s->njr, what};
    int rc = bcast(s->o.comm, hdr, &s->jr, &s->capjr);
    s->njr = 0;
    return rc == TK_OK ? TK_OK : tk__err_wrap(rc, "tensor parallelism: sending the step to the other ranks");
}

/* ---- the other ranks ---------------------------------------------------------------------------- */

typedef struct {
    const unsigned char *p, *end;
} rd;

static int rd_get(rd *r, void *out, size_t n)
{
    if ((size_t)(r->end - r->p) < n)
        return -1;
    memcpy(out, r->p, n);
    r->p += n;
    return 0;
}

/* One 'A' record replayed on s's batch. */
static int replay_add(struct tk_model_server *s, rd *r)
{
    int64_t first, len, n, nstop, got = -1;
    tk_gen_opts o;
    int32_t *ids = NULL;
    char **stops = NULL;
    int rc = tk__err(TK_ERR_INTERNAL, "tensor parallelism: a malformed journal from rank 0");
    if (rd_get(r, &first, 8) || rd_get(r, &len, 8) || rd_get(r, &n, 8) || len < 0 || len > (1LL << 31) ||
        !(ids = malloc((size_t)len * sizeof *ids + 1)) || rd_get(r, ids, (size_t)len * sizeof *ids) ||
        rd_get(r, &o, sizeof o) || rd_get(r, &nstop, 8) || nstop < 0 || nstop > 4096 ||
        !(stops = calloc((size_t)nstop + 1, sizeof *stops)))
        goto done;
    for (int64_t k = 0; k < nstop; k++) {
        int64_t sl;
        if (rd_get(r, &sl, 8) || sl < 0 || sl > r->end - r->p || !(stops[k] = malloc((size_t)sl + 1)) ||
            rd_get(r, stops[k], (size_t)sl))
            goto done;
        stops[k][sl] = '\0';
    }
    o.stop_strings = (const char *const *)stops;
    o.n_stop = (size_t)nstop;
    o.stream = NULL, o.stream_user = NULL, o.kv_dtype = NULL;
    if ((rc = tk_gen_batch_add(&got, s->b, ids, (size_t)len, (size_t)n, &o)) != TK_OK)
        rc = tk__err_wrap(rc, "tensor parallelism: a request rank 0 started fails here");
    else if (got != first)
        rc = tk__err(TK_ERR_INTERNAL,
                     "tensor parallelism: the ranks' batches diverged (sequence %lld here, %lld on "
                     "rank 0)",
                     (long long)got, (long long)first);
done:
    for (int64_t k = 0; stops && k < nstop; k++)
        free(stops[k]);
    free(stops);
    free(ids);
    return rc;
}

static int replay(struct tk_model_server *s, const unsigned char *buf, size_t n)
{
    rd r = {buf, buf + n};
    while (r.p < r.end) {
        char op = (char)*r.p++;
        int64_t seq;
        int rc = TK_OK;
        if (op == 'A')
            rc = replay_add(s, &r);
        else if (op == 'C' && !rd_get(&r, &seq, 8))
            tk_gen_batch_cancel(s->b, seq);
        else
            rc = tk__err(TK_ERR_INTERNAL, "tensor parallelism: a malformed journal from rank 0");
        if (rc != TK_OK)
            return rc;
    }
    return TK_OK;
}

int tk_model_server_follow(tk_ctx *ctx, const tk_model_server_opts *opts)
{
    if (!ctx || !opts || opts->version < 2 || opts->version > TK_MODEL_SERVER_OPTS_VERSION || !opts->model_dir ||
        !opts->comm)
        return tk__err(TK_ERR_INVALID, "tk_model_server_follow: a context and options (version 2) with a model_dir "
                                       "and a communicator are required");
    struct tk_model_server *s = calloc(1, sizeof *s);
    if (!s)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    s->o = *opts;
    s->ctx = ctx;
    s->dir = (char *)opts->model_dir; /* borrowed: freed below field by field, not with the server */
    s->dtype = (char *)opts->dtype;
    s->kv_dtype = (char *)opts->kv_dtype;
    s->tp_plan = (char *)opts->tp_plan;
    s->name = (char *)"";
    unsigned char *buf = NULL;
    size_t cap = 0;
    int rc = tk_serve__load(s);
    if (rc == TK_OK && s->diffusion)
        rc = tk__err(TK_ERR_UNSUPPORTED, "tensor parallelism: a diffusion model is not served split");
    if (rc == TK_OK)
        tk_serve__warm_up(s);
    for (int64_t hdr[2] = {0, 0}; rc == TK_OK;) {
        if ((rc = bcast(opts->comm, hdr, &buf, &cap)) != TK_OK) {
            rc = tk__err_wrap(rc, "tensor parallelism: waiting for rank 0's next step");
            break;
        }
        if (hdr[0] > 0 && (rc = replay(s, buf, (size_t)hdr[0])) != TK_OK)
            break;
        if (hdr[1] == TK_SERVE_TP_QUIT)
            break;
        const tk_gen_event *ev;
        size_t nev;
        if (hdr[1] == TK_SERVE_TP_STEP)
            rc = tk_gen_batch_step(s->b, &ev, &nev);
    }
    free(buf);
    tk_gen_batch_free(s->b);
    tk_model_free(s->m);
    free(s);
    return rc;
}
