/*
 * http.c — tk's HTTP(S)/file client on one reused libcurl easy handle (the contract is in http.h).
 *
 * How it is put together:
 * - One request = run_request(): an attempt loop (retries with backoff or Retry-After) around
 *   exchange(), which performs one request and follows up to MAX_REDIRECTS redirects *by hand*. Doing
 *   redirects ourselves (no CURLOPT_FOLLOWLOCATION) lets tk decide per hop whether the Authorization
 *   header goes out: only while every hop so far stayed on auth_origin. Redirects may lead only to
 *   http/https, never to file://.
 * - Every response's body goes through begin_body() once, which picks its sink: the caller's memory
 *   buffer or .part file (2xx, or file://), a small error-text buffer (4xx/5xx) or nowhere (3xx). Size
 *   caps are enforced there and in the write callback, so an oversize body is aborted, not buffered.
 * - Resuming uses CURLOPT_RANGE ("N-") rather than CURLOPT_RESUME_FROM_LARGE: with RESUME_FROM,
 *   libcurl fails a 200 answer with CURLE_RANGE_ERROR before the body, while tk wants to take that
 *   full body and restart the .part from zero within the same request.
 * - The .part file is flock()ed while a download runs, so two processes fetching the same file wait
 *   for each other instead of interleaving their writes.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "hub/http.h"

#if LIBCURL_VERSION_NUM < 0x075500
#error "tk needs libcurl >= 7.85 (CURLOPT_PROTOCOLS_STR)"
#endif

#define HTTP_MAGIC 0x746b6874u /* "tkht" */
#define MAX_REDIRECTS 5
#define ERRBODY_MAX 512 /* bytes of an error response's body kept for the message */
#define PROGRESS_EVERY_MS 100.0
#define HINT_NET "HINT: check TK_ENDPOINT or your network; use --offline to work from installed packages"
#define HINT_AUTH "HINT: check TK_TOKEN: the registry refused the request's credentials (or their absence)"

struct tk_hub_http {
    uint32_t magic;
    CURL *curl;        /* the current request's handle: a fresh one each request (see setup) */
    CURLSH *share;     /* connections, DNS and TLS sessions, kept across requests */
    char *token;       /* NULL: never authenticate */
    char *auth_origin; /* normalized by origin_of(), or NULL */
    char *user_agent;
    tk_progress_fn progress;
    void *progress_user;
    tk_log_fn log; /* debug: each attempt's URL and status (tk -v) */
    void *log_user;
    int max_attempts;
    double backoff_ms;
    double max_wait_s;
    long connect_timeout_s;
    long low_speed_time_s;
    long low_speed_bytes;
    uint64_t rng; /* xorshift state for backoff jitter */
    char errbuf[CURL_ERROR_SIZE];
};

/* ---- global init ------------------------------------------------------------------------------ */

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_rc = CURLE_OK;

/* libcurl's global state is set up once per process and never torn down: cleanup while another
 * thread still uses curl is undefined, and the OS reclaims it at exit. */
static void global_init(void) { global_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

/* ---- one request's state ---------------------------------------------------------------------- */

enum { MODE_MEM, MODE_FILE };
enum { SINK_NONE, SINK_BODY, SINK_ERROR, SINK_DISCARD };

typedef struct {
    tk_hub_http *h;
    int mode;
    const char *method; /* "GET", "PUT", "POST" */
    const char *url0;   /* as the caller gave it */
    char *url;          /* the last hop's URL (owned) */
    int is_file_url;
    int idempotent;
    const void *body; /* request body (send), or NULL */
    size_t body_len;
    const char *content_type;
    int64_t max; /* cap on the body (or the whole file); 0: none */
    char what[128];

    tk_buf mem; /* MODE_MEM sink */

    int fd;              /* MODE_FILE sink: the locked .part */
    const char *part;
    int64_t written;     /* bytes in .part, all hashed into sha */
    int64_t expect_size; /* -1: unknown */
    tk_sha256 *sha;

    /* the current response; reset at each status line */
    long status;
    int sink;
    int64_t content_length; /* -1: absent */
    int64_t range_start;    /* Content-Range "bytes S-E/T": S, or -1 */
    int64_t range_total;    /* T, or -1 */
    double retry_after_s;   /* -1: absent */
    char etag[160];
    char repo_commit[64];
    char error_code[64];
    char error_message[200]; /* X-Error-Message */
    tk_buf errbody;          /* first ERRBODY_MAX bytes of a 4xx/5xx body */
    int64_t body_base;       /* bytes already in the sink when this body began */

    /* why a transfer was aborted from a callback */
    int too_big;
    int over_expected;
    int bad_range;
    int local_rc; /* a local failure (disk, memory) with its message already set */

    double last_progress_ms;
} req;

static void req_init(req *r, tk_hub_http *h, int mode, const char *method, const char *url)
{
    memset(r, 0, sizeof *r);
    r->h = h;
    r->mode = mode;
    r->method = method;
    r->url0 = url;
    r->idempotent = 1;
    r->fd = -1;
    r->expect_size = -1;
    r->content_length = r->range_start = r->range_total = -1;
    r->retry_after_s = -1;
    r->is_file_url = strncasecmp(url, "file:", 5) == 0;

    /* "what" for progress: the URL's last path component, without query or fragment */
    size_t end = strcspn(url, "?#");
    size_t start = end;
    while (start > 0 && url[start - 1] != '/')
        start--;
    if (start == end)
        start = 0;
    snprintf(r->what, sizeof r->what, "%.*s", (int)(end - start), url + start);
}

static void req_release(req *r)
{
    tk__buf_free(&r->mem);
    tk__buf_free(&r->errbody);
    tk__sha256_free(r->sha);
    r->sha = NULL;
    free(r->url);
    r->url = NULL;
}

static void response_reset(req *r)
{
    r->status = 0;
    r->sink = SINK_NONE;
    r->content_length = r->range_start = r->range_total = -1;
    r->retry_after_s = -1;
    r->etag[0] = r->repo_commit[0] = r->error_code[0] = r->error_message[0] = '\0';
    r->errbody.len = 0;
    if (r->errbody.data)
        r->errbody.data[0] = '\0';
}

/* ---- small helpers ---------------------------------------------------------------------------- */

/* "scheme://host:port" in lower case with the default port filled in; NULL if url has no host. */
static char *origin_of(const char *url)
{
    char *scheme = NULL, *host = NULL, *port = NULL, *res = NULL;
    CURLU *u = curl_url();
    if (!u)
        return NULL;
    if (curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) == CURLUE_OK)
        res = tk__fmt("%s://%s:%s", scheme, host, port);
    for (char *p = res; p && *p; p++)
        *p = (char)tolower((unsigned char)*p);
    curl_free(scheme);
    curl_free(host);
    curl_free(port);
    curl_url_cleanup(u);
    return res;
}

static int same_origin(const char *a, const char *b)
{
    char *oa = origin_of(a), *ob = origin_of(b);
    int same = oa && ob && strcmp(oa, ob) == 0;
    free(oa);
    free(ob);
    return same;
}

static int is_http_url(const char *url)
{
    return strncasecmp(url, "http://", 7) == 0 || strncasecmp(url, "https://", 8) == 0;
}

static int is_redirect(long status)
{
    return status == 301 || status == 302 || status == 303 || status == 307 || status == 308;
}

static double rand01(tk_hub_http *h)
{
    h->rng ^= h->rng << 13;
    h->rng ^= h->rng >> 7;
    h->rng ^= h->rng << 17;
    return (double)(h->rng >> 11) * 0x1.0p-53;
}

/* Exponential backoff for the attempt that just failed (1-based), with up to 25% jitter so that many
 * clients do not retry in lockstep; capped at max_wait_s. */
static double backoff_ms(tk_hub_http *h, int attempt)
{
    double ms = h->backoff_ms, cap = h->max_wait_s * 1000.0;
    for (int i = 1; i < attempt && ms < cap; i++)
        ms *= 2;
    ms *= 1.0 + 0.25 * rand01(h);
    return ms < cap ? ms : cap;
}

static void sleep_ms(double ms)
{
    if (ms <= 0)
        return;
    long long ns = (long long)(ms * 1e6);
    struct timespec ts = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static void copy_field(char *dst, size_t cap, const char *v) { snprintf(dst, cap, "%s", v); }

/* Parses a whole non-negative decimal number; -1 if v is not one. */
static int64_t parse_nonneg(const char *v, const char **end)
{
    if (!isdigit((unsigned char)*v))
        return -1;
    char *e = NULL;
    errno = 0;
    long long n = strtoll(v, &e, 10);
    if (errno)
        return -1;
    if (end)
        *end = e;
    return (int64_t)n;
}

/* ---- libcurl callbacks ------------------------------------------------------------------------ */

static int restart_part(req *r)
{
    char scratch[TK_SHA256_HEX];
    if (ftruncate(r->fd, 0) != 0 || lseek(r->fd, 0, SEEK_SET) != 0) {
        r->local_rc = tk__err_sys("cannot truncate", r->part);
        return -1;
    }
    r->written = 0;
    if ((r->local_rc = tk__sha256_final_hex(r->sha, scratch)) != TK_OK) /* resets the digest */
        return -1;
    return 0;
}

/* Called once per response before its first body byte (or after the transfer, when it had none):
 * picks the body's sink and checks the announced size. Returns -1 to abort (a flag says why). */
static int begin_body(req *r)
{
    long st = r->status;
    int ok = r->is_file_url || (st >= 200 && st < 300);
    if (!ok) {
        r->sink = st >= 300 && st < 400 ? SINK_DISCARD : SINK_ERROR;
        return 0;
    }
    r->sink = SINK_BODY;
    if (r->is_file_url && r->content_length >= 0) /* libcurl's file:// gives the whole file's size */
        r->content_length = r->content_length > r->written ? r->content_length - r->written : 0;
    if (r->mode == MODE_MEM) {
        r->mem.len = 0; /* a previous attempt's partial body */
        if (r->mem.data)
            r->mem.data[0] = '\0';
        r->body_base = 0;
        if (r->max > 0 && r->content_length > r->max) {
            r->too_big = 1;
            return -1;
        }
        return 0;
    }
    if (!r->is_file_url) {
        if (st == 206 && r->range_start != r->written) { /* not the range asked for */
            r->bad_range = 1;
            return -1;
        }
        if (st != 206 && r->written > 0 && restart_part(r) != 0) /* Range ignored: take it all */
            return -1;
    }
    r->body_base = r->written;
    if (r->content_length >= 0) {
        int64_t total = r->written + r->content_length;
        if (r->max > 0 && total > r->max) {
            r->too_big = 1;
            return -1;
        }
        if (r->expect_size >= 0 && total > r->expect_size) {
            r->over_expected = 1;
            return -1;
        }
    }
    return 0;
}

static size_t on_body(char *p, size_t size, size_t n, void *user)
{
    req *r = user;
    size_t len = size * n;
    if (r->sink == SINK_NONE && begin_body(r) != 0)
        return 0;
    if (r->sink == SINK_DISCARD)
        return len;
    if (r->sink == SINK_ERROR) {
        size_t room = r->errbody.len < ERRBODY_MAX ? ERRBODY_MAX - r->errbody.len : 0;
        if (room)
            (void)tk__buf_append(&r->errbody, p, len < room ? len : room); /* best effort */
        return len;
    }
    int64_t have = r->mode == MODE_MEM ? (int64_t)r->mem.len : r->written;
    if (r->max > 0 && have + (int64_t)len > r->max) {
        r->too_big = 1;
        return 0;
    }
    if (r->mode == MODE_MEM) {
        if ((r->local_rc = tk__buf_append(&r->mem, p, len)) != TK_OK)
            return 0;
        return len;
    }
    if (r->expect_size >= 0 && r->written + (int64_t)len > r->expect_size) {
        r->over_expected = 1;
        return 0;
    }
    if ((r->local_rc = tk__write_all(r->fd, p, len, r->part)) != TK_OK ||
        (r->local_rc = tk__sha256_update(r->sha, p, len)) != TK_OK)
        return 0;
    r->written += (int64_t)len;
    return len;
}

static void on_header_field(req *r, const char *name, const char *v)
{
    if (!strcasecmp(name, "etag")) {
        copy_field(r->etag, sizeof r->etag, v);
    } else if (!strcasecmp(name, "x-repo-commit")) {
        copy_field(r->repo_commit, sizeof r->repo_commit, v);
    } else if (!strcasecmp(name, "x-error-code")) {
        copy_field(r->error_code, sizeof r->error_code, v);
    } else if (!strcasecmp(name, "x-error-message")) {
        copy_field(r->error_message, sizeof r->error_message, v);
    } else if (!strcasecmp(name, "content-length")) {
        r->content_length = parse_nonneg(v, NULL);
    } else if (!strcasecmp(name, "retry-after")) {
        /* delay-seconds, or an HTTP-date */
        const char *end = NULL;
        int64_t s = parse_nonneg(v, &end);
        if (s >= 0 && *end == '\0') {
            r->retry_after_s = (double)s;
        } else {
            time_t t = curl_getdate(v, NULL);
            if (t != (time_t)-1)
                r->retry_after_s = t > time(NULL) ? (double)(t - time(NULL)) : 0.0;
        }
    } else if (!strcasecmp(name, "content-range")) {
        /* "bytes S-E/T" or "bytes * /T" (without the space) */
        if (strncasecmp(v, "bytes ", 6) != 0)
            return;
        const char *s = v + 6, *end = NULL;
        if (*s == '*') {
            end = s + 1;
        } else {
            r->range_start = parse_nonneg(s, &end);
            if (r->range_start < 0 || *end != '-' || parse_nonneg(end + 1, &end) < 0)
                return;
        }
        if (*end == '/')
            r->range_total = parse_nonneg(end + 1, NULL);
    }
}

static size_t on_header(char *buf, size_t size, size_t n, void *user)
{
    req *r = user;
    size_t len = size * n;
    char line[1024];
    size_t k = len < sizeof line - 1 ? len : sizeof line - 1;
    memcpy(line, buf, k);
    line[k] = '\0';
    while (k && (line[k - 1] == '\r' || line[k - 1] == '\n' || line[k - 1] == ' ' || line[k - 1] == '\t'))
        line[--k] = '\0';
    if (strncmp(line, "HTTP/", 5) == 0) { /* a status line starts a new response (1xx ones too) */
        response_reset(r);
        const char *s = line + strcspn(line, " ");
        while (*s == ' ')
            s++;
        int64_t st = parse_nonneg(s, NULL);
        r->status = st >= 100 && st <= 999 ? (long)st : 0;
        return len;
    }
    char *colon = strchr(line, ':');
    if (!colon)
        return len;
    *colon = '\0';
    char *v = colon + 1;
    while (*v == ' ' || *v == '\t')
        v++;
    on_header_field(r, line, v);
    return len;
}

static int on_progress(void *user, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal, curl_off_t ulnow)
{
    req *r = user;
    tk_hub_http *h = r->h;
    int64_t done, total;
    if (r->sink == SINK_BODY) {
        done = r->mode == MODE_MEM ? (int64_t)r->mem.len : r->written;
        total = r->content_length >= 0 ? r->body_base + r->content_length : -1;
    } else if (r->body && r->sink == SINK_NONE && ultotal > 0) {
        done = (int64_t)ulnow;
        total = (int64_t)ultotal;
    } else {
        return 0;
    }
    double now = tk__now_ms();
    if (now - r->last_progress_ms < PROGRESS_EVERY_MS && done != total)
        return 0;
    r->last_progress_ms = now;
    h->progress(h->progress_user, r->what, done, total);
    return 0;
}

/* ---- one exchange: a request and its redirects ------------------------------------------------ */

static int setup(req *r, const char *url, int with_auth, struct curl_slist **hdrs)
{
    tk_hub_http *h = r->h;
    CURLcode cc = CURLE_OK;
    char range[32];
    const char *add[3] = {NULL, NULL, NULL};
    char *auth = NULL, *ctype = NULL;
    int rc = TK_OK;

    /* A fresh easy handle for every request, never curl_easy_reset of the last one: libcurl before
     * 8.1.0 (Debian 12 has 7.88) kept a pointer to the previous transfer's freed headers in a reused
     * handle, and a folded header line in the next response read through it (curl/curl#11103, found
     * by tests/fuzz/fuzz_http.c). The share handle keeps connections, DNS and TLS sessions. */
    CURL *c = curl_easy_init();
    if (!c)
        return tk__err(TK_ERR_NOMEM, "out of memory creating a libcurl handle");
    curl_easy_cleanup(h->curl);
    h->curl = c;
    h->errbuf[0] = '\0';
#define SET(opt, val)                                                                                                  \
    do {                                                                                                               \
        if (cc == CURLE_OK)                                                                                            \
            cc = curl_easy_setopt(c, opt, val);                                                                        \
    } while (0)
    SET(CURLOPT_SHARE, h->share);
    SET(CURLOPT_URL, url);
    SET(CURLOPT_PROTOCOLS_STR, "http,https,file");
    SET(CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    SET(CURLOPT_FOLLOWLOCATION, 0L); /* exchange() follows redirects itself */
    SET(CURLOPT_NOSIGNAL, 1L);
    SET(CURLOPT_ERRORBUFFER, h->errbuf);
    SET(CURLOPT_USERAGENT, h->user_agent);
    SET(CURLOPT_CONNECTTIMEOUT, h->connect_timeout_s);
    SET(CURLOPT_LOW_SPEED_LIMIT, h->low_speed_bytes);
    SET(CURLOPT_LOW_SPEED_TIME, h->low_speed_time_s);
    SET(CURLOPT_TCP_KEEPALIVE, 1L);
    SET(CURLOPT_SUPPRESS_CONNECT_HEADERS, 1L);
    SET(CURLOPT_HEADERFUNCTION, on_header);
    SET(CURLOPT_HEADERDATA, r);
    SET(CURLOPT_WRITEFUNCTION, on_body);
    SET(CURLOPT_WRITEDATA, r);
    if (h->progress) {
        SET(CURLOPT_XFERINFOFUNCTION, on_progress);
        SET(CURLOPT_XFERINFODATA, r);
        SET(CURLOPT_NOPROGRESS, 0L);
    }
    if (r->mode == MODE_FILE && r->written > 0) {
        snprintf(range, sizeof range, "%lld-", (long long)r->written);
        SET(CURLOPT_RANGE, range);
    }
    if (r->body || r->content_type) {
        SET(CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)r->body_len);
        SET(CURLOPT_POSTFIELDS, r->body ? r->body : "");
        if (strcmp(r->method, "POST") != 0)
            SET(CURLOPT_CUSTOMREQUEST, r->method);
        add[0] = "Expect:"; /* no 100-continue round trip */
        if (!r->content_type) /* not libcurl's default, application/x-www-form-urlencoded */
            add[1] = "Content-Type:";
        else if (!(add[1] = ctype = tk__fmt("Content-Type: %s", r->content_type)))
            goto nomem;
    }
    if (with_auth && !(add[2] = auth = tk__fmt("Authorization: Bearer %s", h->token)))
        goto nomem;
    for (size_t i = 0; i < 3; i++) {
        if (!add[i])
            continue;
        struct curl_slist *l = curl_slist_append(*hdrs, add[i]);
        if (!l)
            goto nomem;
        *hdrs = l;
    }
    if (*hdrs)
        SET(CURLOPT_HTTPHEADER, *hdrs);
#undef SET
    if (cc != CURLE_OK)
        rc = tk__err(TK_ERR_INTERNAL, "cannot configure libcurl: %s", curl_easy_strerror(cc));
    goto done;
nomem:
    rc = tk__err(TK_ERR_NOMEM, "out of memory preparing a request");
done:
    if (auth) {
        explicit_bzero(auth, strlen(auth));
        free(auth);
    }
    free(ctype);
    return rc;
}

/* Performs r against url0 and the redirects it leads to. Returns a tk status for failures decided
 * here (redirect policy, memory); the transfer's own outcome is in *cc and r (status, flags). */
static int exchange(req *r, CURLcode *cc)
{
    tk_hub_http *h = r->h;
    struct curl_slist *hdrs = NULL;
    int rc = TK_OK;
    int may_auth = h->token && h->auth_origin; /* cleared for good once a hop leaves the origin */
    *cc = CURLE_OK;

    free(r->url);
    if (!(r->url = tk__strdup(r->url0)))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    for (int hop = 0;; hop++) {
        response_reset(r);
        curl_slist_free_all(hdrs);
        hdrs = NULL;
        int with_auth = 0;
        if (may_auth) {
            char *o = origin_of(r->url);
            with_auth = o && strcmp(o, h->auth_origin) == 0;
            free(o);
        }
        if ((rc = setup(r, r->url, with_auth, &hdrs)) != TK_OK)
            goto done;
        *cc = curl_easy_perform(h->curl);
        if (*cc != CURLE_OK)
            goto done;
        if (r->is_file_url || !is_redirect(r->status)) {
            if (r->sink == SINK_NONE)
                (void)begin_body(r); /* a response without a body; flags say if it is wrong */
            goto done;
        }
        char *loc = NULL;
        if (curl_easy_getinfo(h->curl, CURLINFO_REDIRECT_URL, &loc) != CURLE_OK || !loc)
            goto done; /* a 3xx without Location: reported as an HTTP error */
        if (hop == MAX_REDIRECTS) {
            rc = tk__err(TK_ERR_NETWORK, "%s %s: more than %d redirects (last to %s)\n%s", r->method, r->url0,
                         MAX_REDIRECTS, loc, HINT_NET);
            goto done;
        }
        if (!is_http_url(loc)) {
            rc = tk__err(TK_ERR_NETWORK, "%s %s: refusing a redirect to '%s' (only http and https)", r->method, r->url0,
                         loc);
            goto done;
        }
        if (r->body && r->status != 307 && r->status != 308) {
            rc = tk__err(TK_ERR_NETWORK,
                         "%s %s: the server redirected (HTTP %ld) to %s; tk re-sends a "
                         "body only on 307/308\nHINT: use the final URL",
                         r->method, r->url0, r->status, loc);
            goto done;
        }
        char *next = tk__strdup(loc);
        if (!next) {
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
            goto done;
        }
        if (!same_origin(r->url, next))
            may_auth = 0;
        free(r->url);
        r->url = next;
    }
done:
    curl_slist_free_all(hdrs);
    return rc;
}

/* ---- error messages --------------------------------------------------------------------------- */

/* "GET <url>" plus " (redirected to <final>)" when a redirect changed the URL. */
static void describe(const req *r, char *out, size_t cap)
{
    if (r->url && strcmp(r->url, r->url0) != 0)
        snprintf(out, cap, "%s %s (redirected to %s)", r->method, r->url0, r->url);
    else
        snprintf(out, cap, "%s %s", r->method, r->url0);
}

/* What the server said about an error: " [code]: message" from headers, else a body excerpt. */
static void server_detail(const req *r, char *out, size_t cap)
{
    char text[200] = "";
    const char *src = r->error_message[0] ? r->error_message : (r->errbody.data ? r->errbody.data : "");
    size_t i = 0, j = 0;
    for (; src[i] && j + 4 < sizeof text; i++) {
        unsigned char ch = (unsigned char)src[i];
        text[j++] = ch == '\n' || ch == '\r' || ch == '\t' ? ' ' : (ch < 32 || ch == 127 ? '?' : (char)ch);
    }
    if (src[i]) { /* cut short */
        memcpy(text + j, "...", 3);
        j += 3;
    }
    while (j && text[j - 1] == ' ')
        j--;
    text[j] = '\0';
    snprintf(out, cap, "%s%s%s%s%s", r->error_code[0] ? " [" : "", r->error_code, r->error_code[0] ? "]" : "",
             text[0] ? ": " : "", text);
}

static int http_error(const req *r, int attempts)
{
    char where[1400], detail[300];
    describe(r, where, sizeof where);
    server_detail(r, detail, sizeof detail);
    if (r->status == 404 || r->status == 410)
        return tk__err(TK_ERR_NOT_FOUND, "%s: not found (HTTP %ld)%s", where, r->status, detail);
    if (r->status >= 300 && r->status < 400)
        return tk__err(TK_ERR_NETWORK, "%s: HTTP %ld without a usable Location\n%s", where, r->status, HINT_NET);
    if (r->status == 401 || r->status == 403)
        return tk__err(TK_ERR_AUTH, "%s: HTTP %ld%s\n%s", where, r->status, detail, HINT_AUTH);
    return tk__err(TK_ERR_NETWORK, "%s: HTTP %ld%s (%d attempt%s)\n%s", where, r->status, detail, attempts,
                   attempts == 1 ? "" : "s", HINT_NET);
}

static int curl_error(const req *r, CURLcode cc, int attempts)
{
    char where[1400];
    describe(r, where, sizeof where);
    const char *msg = r->h->errbuf[0] ? r->h->errbuf : curl_easy_strerror(cc);
    return tk__err(TK_ERR_NETWORK, "%s: %s (%d attempt%s)\n%s", where, msg, attempts, attempts == 1 ? "" : "s",
                   HINT_NET);
}

static int file_url_error(const req *r, CURLcode cc)
{
    char *path = NULL;
    int rc;
    CURLU *u = curl_url();
    if (u && curl_url_set(u, CURLUPART_URL, r->url0, 0) == CURLUE_OK)
        curl_url_get(u, CURLUPART_PATH, &path, CURLU_URLDECODE);
    struct stat st;
    if (cc == CURLE_FILE_COULDNT_READ_FILE && path && stat(path, &st) != 0 && (errno == ENOENT || errno == ENOTDIR))
        rc = tk__err(TK_ERR_NOT_FOUND, "%s: no such file '%s'", r->url0, path);
    else
        rc = tk__err(TK_ERR_IO, "cannot read %s: %s", r->url0, r->h->errbuf[0] ? r->h->errbuf : curl_easy_strerror(cc));
    curl_free(path);
    curl_url_cleanup(u);
    return rc;
}

static int retryable_cc(CURLcode cc, int idempotent)
{
    switch (cc) {
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT: return 1; /* nothing was sent */
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_PARTIAL_FILE:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR: return idempotent;
    default: return 0;
    }
}

/* ---- the attempt loop ------------------------------------------------------------------------- */

static int run_request(req *r, tk_hub_http_meta *meta)
{
    tk_hub_http *h = r->h;
    int rc = TK_OK, attempt = 0;
    char where[1400];

    for (;;) {
        CURLcode cc = CURLE_OK;
        double wait_ms = -1; /* < 0: do not retry */
        attempt++;
        r->too_big = r->over_expected = r->bad_range = 0;
        r->local_rc = TK_OK;
        if ((rc = exchange(r, &cc)) != TK_OK)
            break;
        if (h->log) { /* tk -v: every request's URL and what came back */
            char line[1600];
            describe(r, where, sizeof where);
            if (cc != CURLE_OK)
                snprintf(line, sizeof line, "%s -> %s (attempt %d)", where, curl_easy_strerror(cc), attempt);
            else if (r->is_file_url)
                snprintf(line, sizeof line, "%s -> read", where);
            else
                snprintf(line, sizeof line, "%s -> HTTP %ld (attempt %d)", where, r->status, attempt);
            h->log(h->log_user, TK_LOG_DEBUG, line);
        }
        if (r->local_rc != TK_OK) { /* its message is set already */
            rc = r->local_rc;
            break;
        }
        if (r->too_big) {
            describe(r, where, sizeof where);
            rc = tk__err(TK_ERR_NETWORK,
                         "%s: the response is larger than the %lld bytes allowed\n"
                         "HINT: the server sent more than tk accepts for this file; check TK_ENDPOINT",
                         where, (long long)r->max);
            break;
        }
        if (r->over_expected) {
            describe(r, where, sizeof where);
            rc = tk__err(TK_ERR_DIGEST, "%s: the file is larger than the %lld bytes the manifest says", where,
                         (long long)r->expect_size);
            break;
        }
        if (r->bad_range ||
            (r->mode == MODE_FILE && r->written > 0 && (cc == CURLE_BAD_DOWNLOAD_RESUME || cc == CURLE_RANGE_ERROR))) {
            /* the partial file does not fit what the server has: start over */
            describe(r, where, sizeof where);
            rc = tk__err(TK_ERR_NETWORK, "%s: the server could not resume the partial download", where);
            if (restart_part(r) != 0) {
                rc = r->local_rc;
                break;
            }
            wait_ms = 0;
        } else if (cc != CURLE_OK) {
            if (r->is_file_url) {
                rc = file_url_error(r, cc);
                break;
            }
            rc = curl_error(r, cc, attempt);
            if (retryable_cc(cc, r->idempotent))
                wait_ms = backoff_ms(h, attempt);
        } else if (r->is_file_url || (r->status >= 200 && r->status < 300)) {
            rc = TK_OK;
            break;
        } else if (r->status == 416 && r->mode == MODE_FILE && r->written > 0) {
            if (r->range_total == r->written) { /* the .part was complete already */
                rc = TK_OK;
                break;
            }
            describe(r, where, sizeof where);
            rc = tk__err(TK_ERR_NETWORK, "%s: HTTP 416 for a partial download of %lld bytes", where,
                         (long long)r->written);
            if (restart_part(r) != 0) {
                rc = r->local_rc;
                break;
            }
            wait_ms = 0;
        } else {
            long st = r->status;
            rc = http_error(r, attempt);
            if (st == 408 || st == 429 || (st >= 500 && st <= 599)) {
                if (r->idempotent || st == 429 || st == 503) /* 429/503: refused, not processed */
                    wait_ms = r->retry_after_s >= 0 ? r->retry_after_s * 1000.0 : backoff_ms(h, attempt);
                if (wait_ms > h->max_wait_s * 1000.0)
                    wait_ms = h->max_wait_s * 1000.0;
            }
        }
        if (wait_ms < 0 || attempt >= h->max_attempts)
            break;
        sleep_ms(wait_ms);
    }

    if (rc == TK_OK && h->progress) {
        int64_t n = r->mode == MODE_MEM ? (int64_t)r->mem.len : r->written;
        h->progress(h->progress_user, r->what, n, n);
    }
    if (meta) {
        memset(meta, 0, sizeof *meta);
        meta->status = r->is_file_url ? (rc == TK_OK ? 200 : 0) : r->status;
        copy_field(meta->etag, sizeof meta->etag, r->etag);
        copy_field(meta->repo_commit, sizeof meta->repo_commit, r->repo_commit);
        copy_field(meta->error_code, sizeof meta->error_code, r->error_code);
        meta->attempts = attempt;
        meta->too_big = r->too_big;
    }
    return rc;
}

/* ---- public (internal) API -------------------------------------------------------------------- */

int tk_hub__http_origin(char *out, size_t cap, const char *url)
{
    const char *p = strstr(url, "://");
    if (!p)
        return -1;
    p += 3;
    snprintf(out, cap, "%.*s", (int)((p - url) + strcspn(p, "/?#")), url);
    return 0;
}

int tk_hub__http_new(tk_hub_http **out, const tk_hub_http_opts *opts)
{
    static const tk_hub_http_opts defaults;
    tk_hub_http *h = NULL;
    int rc = TK_OK;
    if (!out)
        return tk__err(TK_ERR_INVALID, "tk_hub__http_new: out is NULL");
    *out = NULL;
    if (!opts)
        opts = &defaults;
    pthread_once(&global_once, global_init);
    if (global_rc != CURLE_OK)
        return tk__err(TK_ERR_INTERNAL, "cannot initialise libcurl: %s", curl_easy_strerror(global_rc));
    if (opts->token && (!opts->token[0] || strpbrk(opts->token, "\r\n")))
        return tk__err(TK_ERR_INVALID, "the token is empty or contains a line break");

    if (!(h = calloc(1, sizeof *h)))
        goto nomem;
    h->magic = HTTP_MAGIC;
    if (!(h->curl = curl_easy_init()) || !(h->share = curl_share_init()) ||
        curl_share_setopt(h->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT) != CURLSHE_OK ||
        curl_share_setopt(h->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS) != CURLSHE_OK ||
        curl_share_setopt(h->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION) != CURLSHE_OK) {
        rc = tk__err(TK_ERR_INTERNAL, "cannot create a libcurl handle");
        goto fail;
    }
    if (opts->token && opts->auth_origin) {
        if (!(h->token = tk__strdup(opts->token)))
            goto nomem;
        if (!(h->auth_origin = origin_of(opts->auth_origin)) || !is_http_url(opts->auth_origin)) {
            rc = tk__err(TK_ERR_INVALID, "bad auth origin '%s' (want scheme://host[:port])", opts->auth_origin);
            goto fail;
        }
    }
    h->user_agent = opts->user_agent ? tk__strdup(opts->user_agent) : tk__fmt("tk/%s", TK_VERSION_STRING);
    if (!h->user_agent)
        goto nomem;
    h->progress = opts->progress;
    h->progress_user = opts->progress_user;
    h->log = opts->log;
    h->log_user = opts->log_user;
    h->max_attempts = opts->max_attempts > 0 ? opts->max_attempts : 4;
    h->backoff_ms = opts->backoff_ms > 0 ? opts->backoff_ms : 250.0;
    h->max_wait_s = opts->max_wait_s > 0 ? opts->max_wait_s : 30.0;
    h->connect_timeout_s = opts->connect_timeout_s > 0 ? opts->connect_timeout_s : 15;
    h->low_speed_time_s = opts->low_speed_time_s > 0 ? opts->low_speed_time_s : 30;
    h->low_speed_bytes = opts->low_speed_bytes > 0 ? opts->low_speed_bytes : 1024;
    h->rng = (uint64_t)(tk__now_ms() * 1000.0) ^ (uint64_t)(uintptr_t)h ^ 0x9e3779b97f4a7c15ULL;
    if (!h->rng)
        h->rng = 1;
    *out = h;
    return TK_OK;
nomem:
    rc = tk__err(TK_ERR_NOMEM, "out of memory");
fail:
    tk_hub__http_free(h);
    return rc;
}

void tk_hub__http_free(tk_hub_http *h)
{
    if (!h || h->magic != HTTP_MAGIC)
        return;
    curl_easy_cleanup(h->curl); /* before the share it uses */
    if (h->share)
        curl_share_cleanup(h->share);
    if (h->token) {
        explicit_bzero(h->token, strlen(h->token));
        free(h->token);
    }
    free(h->auth_origin);
    free(h->user_agent);
    h->magic = 0;
    free(h);
}

static int check_args(const tk_hub_http *h, const char *url, const char *fn)
{
    if (!h || h->magic != HTTP_MAGIC)
        return tk__err(TK_ERR_INVALID, "%s: invalid tk_hub_http handle", fn);
    if (!url || !*url)
        return tk__err(TK_ERR_INVALID, "%s: no URL", fn);
    if (!is_http_url(url) && strncasecmp(url, "file://", 7) != 0)
        return tk__err(TK_ERR_INVALID, "unsupported URL '%s' (tk speaks http://, https:// and file://)", url);
    return TK_OK;
}

int tk_hub__http_get_mem(tk_hub_http *h, const char *url, size_t max, char **out, size_t *len, tk_hub_http_meta *meta)
{
    req r;
    int rc;
    if (out)
        *out = NULL;
    if (len)
        *len = 0;
    if (meta)
        memset(meta, 0, sizeof *meta);
    if (!out)
        return tk__err(TK_ERR_INVALID, "tk_hub__http_get_mem: out is NULL");
    if ((rc = check_args(h, url, "tk_hub__http_get_mem")) != TK_OK)
        return rc;
    req_init(&r, h, MODE_MEM, "GET", url);
    r.max = max > (size_t)INT64_MAX ? 0 : (int64_t)max;
    if ((rc = run_request(&r, meta)) == TK_OK) {
        size_t n = r.mem.len;
        if (!(*out = tk__buf_steal(&r.mem)))
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
        else if (len)
            *len = n;
    }
    req_release(&r);
    return rc;
}

/* tk__err_sys, except that a missing local directory is an I/O error: TK_ERR_NOT_FOUND from this
 * module means the remote file is missing. */
static int local_err(const char *what, const char *path)
{
    int rc = tk__err_sys(what, path);
    return rc == TK_ERR_NOT_FOUND ? TK_ERR_IO : rc;
}

/* Opens and locks path.part, making sure the locked file is still the one at that path (another
 * process may have renamed or removed it while this one waited for the lock). */
static int open_part(const char *part, int *fd_out)
{
    *fd_out = -1;
    for (int tries = 0; tries < 16; tries++) {
        struct stat a, b;
        int fd, rc = tk__open_nofollow(&fd, part, O_RDWR | O_CREAT, 0644); /* never through a planted link */
        if (rc != TK_OK)
            return rc == TK_ERR_NOT_FOUND ? TK_ERR_IO : rc;
        if (flock(fd, LOCK_EX) != 0) {
            int rc = tk__err_sys("cannot lock", part);
            close(fd);
            return rc;
        }
        if (fstat(fd, &a) == 0 && lstat(part, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
            *fd_out = fd;
            return TK_OK;
        }
        close(fd);
    }
    return tk__err(TK_ERR_IO, "cannot lock '%s': it keeps being replaced", part);
}

/* Hashes what an earlier download left in the .part, so the transfer can resume after it. */
static int load_part(req *r)
{
    char buf[1 << 16];
    int64_t total = 0;
    if (lseek(r->fd, 0, SEEK_SET) != 0)
        return tk__err_sys("cannot seek", r->part);
    for (;;) {
        ssize_t n = read(r->fd, buf, sizeof buf);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return tk__err_sys("cannot read", r->part);
        }
        if (n == 0)
            break;
        int rc = tk__sha256_update(r->sha, buf, (size_t)n);
        if (rc != TK_OK)
            return rc;
        total += n;
    }
    r->written = total;
    if ((r->max > 0 && total > r->max) || (r->expect_size >= 0 && total > r->expect_size))
        return restart_part(r) == 0 ? TK_OK : r->local_rc;
    return TK_OK;
}

int tk_hub__http_get_file(tk_hub_http *h, const char *url, const char *dest, int64_t max, int64_t expect_size,
                          const char *expect_sha256, tk_hub_http_meta *meta)
{
    req r;
    int rc, drop_part = 0;
    char *part = NULL, *dir = NULL;
    char got[TK_SHA256_HEX];
    if (meta)
        memset(meta, 0, sizeof *meta);
    if ((rc = check_args(h, url, "tk_hub__http_get_file")) != TK_OK)
        return rc;
    if (!dest || !*dest)
        return tk__err(TK_ERR_INVALID, "tk_hub__http_get_file: no destination");
    if (expect_sha256) {
        size_t n = strlen(expect_sha256);
        if (n != 64 || strspn(expect_sha256, "0123456789abcdefABCDEF") != n)
            return tk__err(TK_ERR_INVALID, "bad expected sha256 '%s' (want 64 hex digits)", expect_sha256);
    }
    req_init(&r, h, MODE_FILE, "GET", url);
    r.max = max > 0 ? max : 0;
    r.expect_size = expect_size >= 0 ? expect_size : -1;
    if (!(part = tk__fmt("%s.part", dest)) || !(dir = tk__dirname(dest))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    r.part = part;
    if ((rc = open_part(part, &r.fd)) != TK_OK || (rc = tk__sha256_new(&r.sha)) != TK_OK ||
        (rc = load_part(&r)) != TK_OK)
        goto done;
    if (lseek(r.fd, 0, SEEK_END) < 0) {
        rc = tk__err_sys("cannot seek", part);
        goto done;
    }

    if ((rc = run_request(&r, meta)) != TK_OK) {
        /* keep a partial download for the next try, unless it is wrong or fills the disk */
        drop_part = rc == TK_ERR_NOSPACE || rc == TK_ERR_DIGEST || r.too_big;
        goto done;
    }
    if (r.expect_size >= 0 && r.written != r.expect_size) {
        rc = tk__err(TK_ERR_DIGEST,
                     "%s: got %lld bytes, the manifest says %lld\n"
                     "HINT: the registry's file changed or the download was damaged; retry",
                     url, (long long)r.written, (long long)r.expect_size);
        drop_part = 1;
        goto done;
    }
    if ((rc = tk__sha256_final_hex(r.sha, got)) != TK_OK)
        goto done;
    if (expect_sha256 && strcasecmp(got, expect_sha256) != 0) {
        rc = tk__err(TK_ERR_DIGEST,
                     "%s: sha256 is %s, the manifest says %s\n"
                     "HINT: the registry's file changed or the download was damaged; retry",
                     url, got, expect_sha256);
        drop_part = 1;
        goto done;
    }
    if (fsync(r.fd) != 0) {
        rc = tk__err_sys("cannot fsync", part);
        drop_part = rc == TK_ERR_NOSPACE;
        goto done;
    }
    if (rename(part, dest) != 0) {
        rc = local_err("cannot rename into place", dest);
        goto done;
    }
    rc = tk__fsync_dir(dir);
done:
    if (r.fd >= 0) {
        if (drop_part)
            unlink(part); /* while still holding the lock */
        close(r.fd);
        r.fd = -1;
    }
    req_release(&r);
    free(part);
    free(dir);
    return rc;
}

int tk_hub__http_send(tk_hub_http *h, const char *method, const char *url, const char *content_type, const void *body,
                      size_t len, size_t max, int idempotent_ok, char **out, size_t *outlen, tk_hub_http_meta *meta)
{
    req r;
    int rc;
    if (out)
        *out = NULL;
    if (outlen)
        *outlen = 0;
    if (meta)
        memset(meta, 0, sizeof *meta);
    if (!out)
        return tk__err(TK_ERR_INVALID, "tk_hub__http_send: out is NULL");
    if ((rc = check_args(h, url, "tk_hub__http_send")) != TK_OK)
        return rc;
    if (!is_http_url(url))
        return tk__err(TK_ERR_INVALID, "cannot send to '%s': only http:// and https:// take uploads", url);
    if (!method || !*method || strspn(method, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") != strlen(method))
        return tk__err(TK_ERR_INVALID, "bad HTTP method '%s'", method ? method : "(null)");
    if (!body && len)
        return tk__err(TK_ERR_INVALID, "tk_hub__http_send: body is NULL but len is %zu", len);
    if (content_type && strpbrk(content_type, "\r\n"))
        return tk__err(TK_ERR_INVALID, "bad content type (line break)");
    req_init(&r, h, MODE_MEM, method, url);
    r.body = body ? body : "";
    r.body_len = len;
    r.content_type = content_type;
    r.idempotent = idempotent_ok != 0;
    r.max = max > (size_t)INT64_MAX ? 0 : (int64_t)max;
    if ((rc = run_request(&r, meta)) == TK_OK) {
        size_t n = r.mem.len;
        if (!(*out = tk__buf_steal(&r.mem)))
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
        else if (outlen)
            *outlen = n;
    }
    req_release(&r);
    return rc;
}
