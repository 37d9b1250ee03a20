/*
 * fuzz_http.c — HTTP responses as tk's client reads them (hub/http.c on libcurl): status lines,
 * headers (ETag, X-Repo-Commit, X-Error-Code, Retry-After, Content-Range, Content-Length), chunked and
 * truncated bodies, redirects, size caps and resumed downloads.
 *
 * A thread serves the input's bytes, verbatim, as the response to every connection on a loopback
 * port, and the process's proxy variables point at that port, so a redirect to any host ends there
 * too and nothing leaves the machine. The first input byte picks the call: bit 0 a download to a file
 * (else into memory), bit 1 a partial "<dest>.part" left to resume, bit 2 an expected sha256, bit 3 a
 * PUT with a body (tk_hub__http_send) instead. The rest is the response. Each input first gets a
 * well-formed exchange on the same handle, so a bug that needs a previous transfer replays alone.
 * Example: "\0HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/common.h"
#include "fuzz.h"
#include "hub/http.h"

static int lfd = -1, port;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static uint8_t *resp; /* the server thread's own copy: it may still be sending after the call */
static size_t resp_len;

/* Reads the request (up to its blank line, or what arrives within 200 ms), then sends the response
 * and closes. */
static void *serve(void *arg)
{
    (void)arg;
    for (;;) {
        int c = accept(lfd, NULL, NULL);
        if (c < 0)
            continue;
        char buf[8192];
        size_t got = 0;
        struct pollfd pfd = {c, POLLIN, 0};
        while (got < sizeof buf - 1 && poll(&pfd, 1, 200) > 0) {
            ssize_t r = recv(c, buf + got, sizeof buf - 1 - got, 0);
            if (r <= 0)
                break;
            got += (size_t)r;
            buf[got] = '\0';
            if (strstr(buf, "\r\n\r\n"))
                break;
        }
        pthread_mutex_lock(&mu);
        size_t off = 0;
        while (off < resp_len) {
            ssize_t w = send(c, resp + off, resp_len - off, MSG_NOSIGNAL);
            if (w <= 0)
                break;
            off += (size_t)w;
        }
        pthread_mutex_unlock(&mu);
        shutdown(c, SHUT_WR);
        while (poll(&pfd, 1, 50) > 0 && recv(c, buf, sizeof buf, 0) > 0) {
        }
        close(c);
    }
    return NULL;
}

static void start(void)
{
    signal(SIGPIPE, SIG_IGN);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    if ((lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 || bind(lfd, (struct sockaddr *)&a, sizeof a) ||
        listen(lfd, 64) || getsockname(lfd, (struct sockaddr *)&a, &al))
        abort();
    port = ntohs(a.sin_port);
    char proxy[64];
    snprintf(proxy, sizeof proxy, "http://127.0.0.1:%d", port);
    const char *vars[] = {"http_proxy", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        setenv(vars[i], proxy, 1);
    unsetenv("no_proxy");
    unsetenv("NO_PROXY");
    pthread_t t;
    if (pthread_create(&t, NULL, serve, NULL) != 0)
        abort();
    pthread_detach(t);
}

/* What the server sends next (a copy: the server may still be sending the last one). */
static void set_response(const uint8_t *p, size_t n)
{
    uint8_t *copy = malloc(n ? n : 1);
    if (!copy)
        abort();
    memcpy(copy, p, n);
    pthread_mutex_lock(&mu);
    free(resp);
    resp = copy;
    resp_len = n;
    pthread_mutex_unlock(&mu);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static tk_hub_http *h;
    static char url[128], dest[600], part[610];
    if (!h) {
        start();
        const char *dir = fz_scratch("http");
        if (!dir)
            abort();
        snprintf(url, sizeof url, "http://127.0.0.1:%d/kernels/org/name/resolve/v1/manifest.json", port);
        snprintf(dest, sizeof dest, "%s/manifest.json", dir);
        snprintf(part, sizeof part, "%s.part", dest);
        char origin[64];
        snprintf(origin, sizeof origin, "http://127.0.0.1:%d", port);
        tk_hub_http_opts o = {0};
        o.token = "fuzz-token";
        o.auth_origin = origin;
        o.max_attempts = 1;
        o.connect_timeout_s = 2;
        o.low_speed_time_s = 2;
        o.low_speed_bytes = 1;
        if (tk_hub__http_new(&h, &o) != TK_OK)
            abort();
        atexit(fz_scratch_cleanup);
    }
    if (size < 1)
        return 0;
    int mode = data[0];
    tk_hub_http_meta meta;
    char *body = NULL;
    size_t len = 0;
    int rc;
    /* a well-formed exchange first, so the input's response always meets a handle that has served
     * one (libcurl bugs such as curl/curl#11103 need a previous transfer's headers) */
    static const char warm[] = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nETag: \"w\"\r\n\r\nok";
    set_response((const uint8_t *)warm, sizeof warm - 1);
    if (tk_hub__http_get_mem(h, url, 64, &body, &len, &meta) != TK_OK)
        abort();
    free(body);
    body = NULL;
    set_response(data + 1, size - 1);
    if (mode & 8) {
        rc = tk_hub__http_send(h, "PUT", url, "application/x-tar", "body", 4, 1 << 16, mode & 16, &body, &len, &meta);
    } else if (mode & 1) {
        unlink(dest);
        unlink(part);
        if ((mode & 2) && fz_write_file(part, "0123456789", 10) != 0)
            abort();
        rc = tk_hub__http_get_file(
            h, url, dest, 1 << 16, (mode & 4) ? 12 : -1,
            (mode & 4) ? "0000000000000000000000000000000000000000000000000000000000000000" : NULL, &meta);
    } else {
        rc = tk_hub__http_get_mem(h, url, (mode & 4) ? 16 : 1 << 16, &body, &len, &meta);
        if (rc == TK_OK && (!body || body[len] != '\0' || ((mode & 4) && len > 16)))
            abort(); /* a body comes back NUL-terminated and within the cap */
    }
    if (getenv("TK_FUZZ_VERBOSE"))
        fprintf(stderr, "fuzz_http: mode %d: %d %s\n", mode, rc, rc ? tk_last_error() : "");
    if (rc != TK_OK && body)
        abort();
    if (strnlen(meta.etag, sizeof meta.etag) == sizeof meta.etag ||
        strnlen(meta.repo_commit, sizeof meta.repo_commit) == sizeof meta.repo_commit ||
        strnlen(meta.error_code, sizeof meta.error_code) == sizeof meta.error_code)
        abort();
    free(body);
    return 0;
}
