/*
 * fuzz_openai.c — the model server's request parser (serve/openai.c): tk_serve__oa_parse over chat and
 * completion bodies, and the stop-string helpers the streams use on what it accepted.
 *
 * Input: a first byte choosing the endpoint (even: chat, odd: completions), then the body. Seeds: real
 * requests the openai client sends (tests/fuzz/corpus/openai/). A broken promise aborts: an accepted
 * request with a field out of its documented range, an error without a status or message, *r not
 * emptied on failure, a stop string that is empty.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/openai.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int kind = data[0] % 2 ? TK_OA_COMPLETION : TK_OA_CHAT;
    tk_oa_req r;
    tk_oa_err e;
    memset(&e, 0, sizeof e);
    if (tk_serve__oa_parse(&r, kind, (const char *)data + 1, size - 1, &e) != 0) {
        if ((e.status != 400 && e.status != 500) || !e.message[0] || r.msgs || r.prompts || r.stop || r.model)
            abort();
        char *j = tk_serve__oa_error_json(&e);
        if (!j)
            abort();
        free(j);
        return 0;
    }
    if (r.kind != kind || r.n < 1 || r.n > TK_OA_MAX_N || (r.has_max_tokens && r.max_tokens < 1) ||
        (r.has_temperature && !(r.temperature >= 0 && r.temperature <= 2)) ||
        (r.has_top_p && !(r.top_p > 0 && r.top_p <= 1)) || !(fabs(r.presence_penalty) <= 2) ||
        !(fabs(r.frequency_penalty) <= 2) || r.top_logprobs < 0 || r.top_logprobs > 20 || r.nstop > TK_OA_MAX_STOP ||
        (r.has_top_k && r.top_k < 0))
        abort();
    if (kind == TK_OA_CHAT && (r.nmsg < 1 || !r.msgs))
        abort();
    if (kind == TK_OA_COMPLETION && (r.nprompt < 1 || r.nprompt > TK_OA_MAX_PROMPTS))
        abort();
    for (size_t i = 0; i < r.nmsg; i++)
        if (!r.msgs[i].role || !r.msgs[i].content)
            abort();
    for (size_t i = 0; i < r.nprompt; i++)
        if (!r.prompts[i].text && (!r.prompts[i].ids || !r.prompts[i].nids))
            abort();
    /* the stream's hold-back and cut over a text made of the request's own strings */
    const char *t = r.nmsg ? r.msgs[0].content : r.nprompt && r.prompts[0].text ? r.prompts[0].text : "";
    size_t len = strlen(t);
    for (size_t i = 0; i < r.nstop; i++)
        if (!r.stop[i][0])
            abort();
    size_t hb = tk_serve__stop_holdback(t, len, r.stop, r.nstop), cut = tk_serve__stop_find(t, r.stop, r.nstop);
    if (hb > len || (cut != (size_t)-1 && cut >= len))
        abort();
    tk_serve__oa_req_free(&r);
    return 0;
}
