/*
 * openai.h — the model server's OpenAI wire format (serve/openai.c): requests of /v1/completions and
 * /v1/chat/completions parsed into one typed struct with every field checked, and errors in OpenAI's
 * shape ({"error": {"message", "type", "param", "code"}}) with their HTTP status.
 *
 * The parser is the server's only reader of request bodies, and the fuzz target tests/fuzz/
 * fuzz_openai.c drives it. It never touches the model: the request handler turns the parsed request
 * into prompt tokens and tk_gen_opts (serve/model_server.c). Internal names are tk_serve__*.
 */
#ifndef TK_SERVE_OPENAI_H
#define TK_SERVE_OPENAI_H

#include <stddef.h>
#include <stdint.h>

#include "tk.h"

/* An error answer: HTTP status, OpenAI's type and code, the parameter at fault ("" for none). */
typedef struct {
    int status;
    char type[32];
    char code[40];
    char param[64];
    char message[600];
} tk_oa_err;

enum { TK_OA_CHAT = 1, TK_OA_COMPLETION = 2 };

#define TK_OA_MAX_N 128          /* choices per prompt */
#define TK_OA_MAX_PROMPTS 64     /* prompts of one completion request */
#define TK_OA_MAX_STOP 16        /* stop strings */
#define TK_OA_MAX_STOP_LEN 256   /* bytes of one */
#define TK_OA_MAX_MESSAGES 4096

/* One completion prompt: text, or token ids. */
typedef struct {
    char *text;   /* NULL for ids */
    int32_t *ids;
    size_t nids;
} tk_oa_prompt;

typedef struct {
    int kind;                  /* TK_OA_CHAT or TK_OA_COMPLETION */
    char *model;               /* as sent; NULL when absent */
    /* chat: the messages (role and content owned here; a content array's text parts joined) */
    tk_chat_message *msgs;
    size_t nmsg;
    /* completions: the prompts (one or more) */
    tk_oa_prompt *prompts;
    size_t nprompt;
    /* sampling and limits: has_* says the request set the field */
    int has_max_tokens, has_temperature, has_top_p, has_top_k, has_min_p, has_rep, has_seed;
    int64_t max_tokens;        /* >= 1 */
    double temperature;        /* [0, 2] */
    double top_p;              /* (0, 1] */
    int64_t top_k;             /* >= 0 (an extension, as vLLM's) */
    double min_p;              /* [0, 1] (extension) */
    double repetition_penalty; /* > 0 (extension) */
    double presence_penalty, frequency_penalty; /* [-2, 2] */
    int64_t seed;
    int64_t n;                 /* [1, TK_OA_MAX_N] */
    int stream, include_usage;
    char **stop;               /* UTF-8, non-empty */
    size_t nstop;
    int logprobs;              /* report the chosen tokens' log-probabilities */
    int top_logprobs;          /* and this many alternatives (0..20) */
    int ignore_eos;            /* extension: generate past eos (benchmarks) */
    /* extensions for a diffusion model (tk_diff_opts; 0 / NULL: the server's defaults) */
    int64_t steps;             /* denoising steps in all (DiffusionGemma: per block) */
    int64_t block_length;      /* LLaDA's semi-autoregressive block */
    double cfg_scale;          /* LLaDA's classifier-free guidance */
    int remasking;             /* -1 absent, 0 low_confidence, 1 random */
    char alg[16];              /* Dream's: "" absent, origin, maskgit_plus, topk_margin, entropy */
    /* extensions for a block diffusion model (DiffusionGemma; tk_diff_opts' fields, -1 absent) */
    double t_min, t_max, entropy_bound, confidence_threshold;
    int64_t stability_threshold;
} tk_oa_req;

/* Parses a request body of `kind`. Returns 0 with *r filled (free with tk_serve__oa_req_free), or -1
 * with *e describing the error (400: malformed JSON, not UTF-8, a field of the wrong type or out of
 * range, named in e->param; *r is then empty). Unknown fields are ignored, as OpenAI does; "user" and
 * a null value mean absent. */
int tk_serve__oa_parse(tk_oa_req *r, int kind, const char *body, size_t len, tk_oa_err *e);
void tk_serve__oa_req_free(tk_oa_req *r);

/* Fills e (message formatted); returns -1. */
int tk_serve__oa_errf(tk_oa_err *e, int status, const char *type, const char *code, const char *param, const char *fmt,
                      ...) __attribute__((format(printf, 6, 7)));
/* {"error": {"message", "type", "param" (null when ""), "code" (null when "")}} as a malloc'd string. */
char *tk_serve__oa_error_json(const tk_oa_err *e);

/* The longest suffix of text[0..len) that is a proper prefix of one of the stop strings (the part a
 * stream must hold back until it knows whether a stop string follows). */
size_t tk_serve__stop_holdback(const char *text, size_t len, char *const *stop, size_t nstop);
/* The byte offset of the first occurrence of any stop string in text, or (size_t)-1. */
size_t tk_serve__stop_find(const char *text, char *const *stop, size_t nstop);

#endif /* TK_SERVE_OPENAI_H */
