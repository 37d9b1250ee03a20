/*
 * http.h — tk's HTTP(S)/file client, on libcurl.
 *
 * One tk_hub_http per context: it keeps a libcurl share of connections, DNS and TLS sessions, so
 * connections are reused (each request runs on a fresh easy handle). Requests retry
 * with exponential backoff on connection errors, 408, 429 and 5xx, honouring Retry-After; apply connect
 * and low-speed timeouts; enforce a size cap inside the write callback; and allow only the http, https
 * and file protocols (redirects too). The bearer token is sent only to `auth_origin`
 * (scheme://host[:port]) and never to a host a redirect leads to. Proxies come from the environment
 * (libcurl's defaults). File downloads resume a partial "<dest>.part" with a Range request.
 *
 * Errors: 404/410 -> TK_ERR_NOT_FOUND (the message carries X-Error-Code when the server sent one);
 * other HTTP errors, connection failures, timeouts, truncated bodies and oversize bodies ->
 * TK_ERR_NETWORK; local file errors -> TK_ERR_IO / TK_ERR_NOSPACE. A file:// URL whose path is
 * missing -> TK_ERR_NOT_FOUND.
 */
#ifndef TK_HUB_HTTP_H
#define TK_HUB_HTTP_H

#include <stdint.h>

#include "common/common.h"

typedef struct tk_hub_http tk_hub_http;

typedef struct {
    const char *token;        /* bearer token or NULL */
    const char *auth_origin;  /* "https://host:port" the token may go to (default port implied, any
                                 path ignored); NULL: never send it. Once a redirect leaves this
                                 origin, the rest of that request's hops go without the token. */
    tk_progress_fn progress;  /* NULL: none; `what` is the URL's last path component */
    void *progress_user;
    int max_attempts;         /* 0: default (4) */
    double backoff_ms;        /* first retry delay; 0: default (250 ms), doubles each time */
    double max_wait_s;        /* cap on one Retry-After / backoff wait; 0: default (30 s) */
    long connect_timeout_s;   /* 0: default (15) */
    long low_speed_time_s;    /* abort when below low_speed_bytes/s for this long; 0: default (30) */
    long low_speed_bytes;     /* 0: default (1024) */
    const char *user_agent;   /* NULL: "tk/<version>" */
    tk_log_fn log;            /* NULL: none; TK_LOG_DEBUG "GET <url> -> HTTP <status>" per attempt */
    void *log_user;
} tk_hub_http_opts;

/* What the server said about a response. Strings are empty when absent. */
typedef struct {
    long status;              /* HTTP status of the last response (200 for file://, 0: none) */
    char etag[160];
    char repo_commit[64];     /* X-Repo-Commit */
    char error_code[64];      /* X-Error-Code */
    int attempts;             /* how many requests it took (redirect hops not counted) */
    int too_big;              /* 1: refused because the body was larger than max (the caller may
                                 classify that: an oversized signed file is a refused package) */
} tk_hub_http_meta;

/* The origin of a URL, "scheme://host[:port]" (path, query and fragment dropped), into out: what
 * tk_hub_http_opts.auth_origin takes. 0, or -1 when url has no "://". */
int tk_hub__http_origin(char *out, size_t cap, const char *url);

/* opts may be NULL (all defaults); the strings are copied. Errors: TK_ERR_INVALID (a token with a line
 * break, an auth_origin that is not an http(s) URL). A handle is for one thread at a time. */
int tk_hub__http_new(tk_hub_http **out, const tk_hub_http_opts *opts);
void tk_hub__http_free(tk_hub_http *h);

/* GET url into memory (NUL-terminated), failing with TK_ERR_NETWORK if the body exceeds max bytes
 * (0: no cap). *out is owned by the caller (free); len may be NULL. meta may be NULL; it is filled on
 * failure too (status, X-Error-Code, attempts). */
int tk_hub__http_get_mem(tk_hub_http *h, const char *url, size_t max, char **out, size_t *len, tk_hub_http_meta *meta);

/* GET url into dest. The body is written to "<dest>.part" (resuming it if present and the server
 * honours Range; restarting otherwise), fsynced, then renamed to dest. Fails if the file exceeds max
 * bytes (0: no cap; TK_ERR_NETWORK), or if expect_size >= 0 and the final size differs (TK_ERR_DIGEST),
 * or if expect_sha256 (64 hex) is non-NULL and the sha256 of the whole file differs (TK_ERR_DIGEST).
 * The .part is deleted on TK_ERR_DIGEST, TK_ERR_NOSPACE and oversize bodies, and kept for a later
 * resume on other failures. The .part is flock()ed during the download, so concurrent downloads of
 * the same dest (threads or processes) wait for each other. A missing local directory is TK_ERR_IO. */
int tk_hub__http_get_file(tk_hub_http *h, const char *url, const char *dest, int64_t max, int64_t expect_size,
                          const char *expect_sha256, tk_hub_http_meta *meta);

/* Sends body with `method` ("PUT"/"POST") and the given content type (NULL: no Content-Type); returns
 * the response body in memory (at most max bytes, 0: no cap). Used for publishing to `tk serve`. Only
 * http(s) URLs. Not retried unless idempotent_ok (except when nothing reached the server: connection
 * failures, 429, 503). Redirects are followed only for 307/308, which re-send the body. */
int tk_hub__http_send(tk_hub_http *h, const char *method, const char *url, const char *content_type, const void *body,
                      size_t len, size_t max, int idempotent_ok, char **out, size_t *outlen, tk_hub_http_meta *meta);

#endif
