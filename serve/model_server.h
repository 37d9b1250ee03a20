/*
 * model_server.h — the model server's internals shared by serve/model_server.c (HTTP: routes, auth,
 * bodies, responses, lifecycle) and serve/sched.c (the scheduler thread: the model, continuous
 * batching, events into responses). Internal names are tk_serve__*.
 *
 * Locking: one mutex (srv->mu) guards the queue, the active requests, each request's output and
 * connection state, and the metrics; the scheduler holds it only between model steps, never during
 * one. A request is reference-counted: the HTTP side holds one reference until libmicrohttpd reports
 * the request complete, the scheduler one while it is queued or running, a streamed response one
 * until libmicrohttpd frees it.
 */
#ifndef TK_SERVE_MODEL_SERVER_H
#define TK_SERVE_MODEL_SERVER_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <microhttpd.h>

#include "common/common.h"
#include "serve/openai.h"
#include "tk.h"

enum { SRV_LOADING = 0, SRV_READY = 1, SRV_FAILED = 2, SRV_DRAINING = 3 };
enum { RQ_QUEUED = 0, RQ_RUNNING = 1, RQ_DONE = 2 };

/* One choice of a request: one sequence of the batch. */
typedef struct {
    int64_t seq;          /* the tk_gen_batch (tk_diff_batch) sequence id; -1 before admission */
    struct tk_serve_req *req; /* diffusion: its request, for the sampler's step callback */
    size_t prompt;        /* which prompt it continues */
    tk_buf text;          /* its complete text so far */
    size_t sent;          /* bytes of text streamed */
    int64_t ntok;         /* tokens generated */
    json_t *lp;           /* logprobs: one object per token (chat's shape), or NULL */
    size_t lp_sent;       /* entries streamed */
    const char *finish;   /* NULL while running; "stop" or "length" */
    int role_sent;        /* chat stream: the first chunk (role) went out */
    int live;             /* its sequence is in the batch */
} tk_serve_choice;

typedef struct tk_serve_req {
    int refs;
    struct tk_model_server *srv;
    tk_oa_req p;
    char id[48];
    int64_t created;
    size_t nprompt;
    int32_t **pids;
    size_t *plen;
    int64_t *pcached;     /* prompt tokens from the prefix cache, per prompt */
    tk_gen_opts go;
    size_t nchoice;       /* nprompt x n */
    tk_serve_choice *ch;
    size_t nfinished;
    int state;            /* RQ_* */
    int gone;             /* the client went away: cancel */
    int status;           /* HTTP status of the answer (200, or an error's) */
    char *body;           /* non-streamed: the answer's body once done */
    /* the connection (NULL once libmicrohttpd is done with the request) */
    struct MHD_Connection *conn;
    int fd;
    int suspended;
    /* a streamed answer: SSE bytes waiting for libmicrohttpd, and whether they end it */
    tk_buf out;
    size_t out_off;
    int out_done;
    double t0, t_first;
} tk_serve_req;

typedef struct tk_serve_conn {
    int fd;
    double t0;            /* when its current request began (connection start or the last request's end) */
    int receiving;        /* its request is not fully received yet */
    int reaped;
} tk_serve_conn;

struct tk_model_server {
    uint32_t magic;
    tk_model_server_opts o;
    char *dir, *name, *listen, *api_key, *dtype, *kv_dtype, *tp_plan;
    tk_ctx *ctx;
    struct MHD_Daemon *d;
    int port;
    int wake[2];          /* stop(): a byte here wakes run() (async-signal-safe) */
    pthread_t th;
    int th_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int state;            /* SRV_* */
    int stopping;
    double drain_deadline;
    int load_rc;
    char load_err[1024];
    /* the model (the scheduler thread's; tok and the facts below are read by the HTTP threads once
     * state is SRV_READY) */
    tk_model *m;
    const tk_tokenizer *tok;
    tk_gen_batch *b;      /* NULL for a diffusion model */
    int diffusion;        /* tk_model_diffusion: TK_DIFF_LLADA, TK_DIFF_DREAM or TK_DIFF_BLOCK */
    tk_diff_batch *db;    /* LLaDA, Dream and DiffusionGemma: their sequences in lockstep (else NULL) */
    tk_gen_opts base;     /* generation_config.json's defaults */
    int64_t ctx_len;      /* the context a sequence may use */
    int64_t vocab;
    /* requests */
    tk_serve_req **queue;
    size_t nq, capq;
    tk_serve_req **act;
    size_t nact, capact;
    size_t busy;          /* sequences in the batch */
    /* connections, for the request deadline (slowloris) */
    pthread_mutex_t cmu;
    tk_serve_conn **conns;
    size_t nconn, capconn;
    /* metrics (under mu) */
    tk_gen_batch_stats st;
    tk_diff_batch_stats dst;
    int64_t req_ok, req_error, req_cancelled, req_rejected;
    int64_t prompt_tokens, gen_tokens, cached_tokens;
    double tps;           /* generated tokens a second over the last window */
    double win_t0;
    int64_t win_tok0;
    uint64_t rng;
    /* tensor parallelism (serve/tp.c): rank 0's journal of the batch's changes since the last sync */
    unsigned char *jr;
    size_t njr, capjr;
    int jr_failed; /* out of memory journaling: the next sync fails the job */
};

void tk_serve__req_unref(tk_serve_req *r); /* takes mu itself */
void tk_serve__req_unref_locked(tk_serve_req *r);
/* The scheduler thread's body: loads the model, then steps until stopped. */
void *tk_serve__sched_main(void *arg);
/* sched.c's load of the model and batch, and the warm-up generation (every rank runs both). */
int tk_serve__load(struct tk_model_server *s);
void tk_serve__warm_up(struct tk_model_server *s);
/* Tensor parallelism (serve/tp.c): the batch's add and cancel, journaled on rank 0 when o.comm is set;
 * sync broadcasts the journal and what comes next (TK_SERVE_TP_STEP, _IDLE: nothing, a heartbeat that
 * keeps the other ranks' wait under the timeout, _QUIT). */
enum { TK_SERVE_TP_STEP = 'S', TK_SERVE_TP_IDLE = 'I', TK_SERVE_TP_QUIT = 'Q' };
int tk_serve__tp_add(struct tk_model_server *s, int64_t *first, const int32_t *prompt, size_t len, size_t n,
                     const tk_gen_opts *o);
void tk_serve__tp_cancel(struct tk_model_server *s, int64_t seq);
int tk_serve__tp_sync(struct tk_model_server *s, int what);
/* Request bodies once done (serve/sched.c builds them from the choices). */
char *tk_serve__final_json(const tk_serve_req *r);
/* Resumes r's connection if it waits (under mu). */
void tk_serve__wake(tk_serve_req *r);
void tk_serve__log(struct tk_model_server *s, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif /* TK_SERVE_MODEL_SERVER_H */
