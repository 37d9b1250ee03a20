/*
 * fuzz_get.c — a hostile registry (hub/get.c over hub/http.c): tk_pkg_get of fuzz/pkg from a
 * loopback server whose every answer comes from the input — the refs document, the manifest, its
 * signature, the source archive and the yank statement — so resolving, the rollback and yank checks,
 * signature and manifest parsing, kernel validation, download caps, digests and unpacking all meet
 * what a malicious or broken registry could send. Each input starts from an empty home that trusts
 * the committed test key tests/fuzz/serve_live-key.pem for org fuzz (seeds.py signs the seeds with
 * it), so the paths past the signature check are reachable.
 *
 * Input: the five bodies separated by "@@PART@@\n", in the order refs, manifest.json,
 * manifest.json.sig, source archive, yank statement. An empty part answers 404 EntryNotFound.
 * Run it from the repository root.
 */
#define _GNU_SOURCE /* memmem */
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
#include "hub/sign.h"
#include "tk.h"

#define SEP "@@PART@@\n"
enum { P_REFS, P_MANIFEST, P_SIG, P_ARCHIVE, P_YANK, NPARTS };

static int lfd = -1, port;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static uint8_t *input; /* the server's own copy of the current input */
static size_t input_len;
static char *pubkey;

/* The part of the current input a request path asks for (NULL, 0: none). Caller holds mu. */
static void part_for(const char *path, const uint8_t **p, size_t *n)
{
    int want = strstr(path, "/refs")               ? P_REFS
               : strstr(path, "/yanked/")          ? P_YANK
               : strstr(path, "manifest.json.sig") ? P_SIG
               : strstr(path, "manifest.json")     ? P_MANIFEST
               : strstr(path, "source.tar")        ? P_ARCHIVE
                                                   : -1;
    const uint8_t *s = input, *end = input + input_len;
    *p = NULL;
    *n = 0;
    for (int i = 0; want >= 0 && s && i <= want; i++) {
        const uint8_t *next = memmem(s, (size_t)(end - s), SEP, strlen(SEP));
        if (i == want) {
            *p = s;
            *n = (size_t)((next ? next : end) - s);
        }
        s = next ? next + strlen(SEP) : NULL;
    }
}

static void send_all(int c, const void *p, size_t n)
{
    for (size_t off = 0; off < n;) {
        ssize_t w = send(c, (const char *)p + off, n - off, MSG_NOSIGNAL);
        if (w <= 0)
            return;
        off += (size_t)w;
    }
}

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
        /* one request per connection (Connection: close), so curl never waits on a kept connection */
        while (got < sizeof buf - 1 && poll(&pfd, 1, 1000) > 0) {
            ssize_t r = recv(c, buf + got, sizeof buf - 1 - got, 0);
            if (r <= 0)
                break;
            got += (size_t)r;
            buf[got] = '\0';
            if (strstr(buf, "\r\n\r\n"))
                break;
        }
        buf[got] = '\0';
        char path[2048] = "";
        sscanf(buf, "%*s %2047s", path);
        pthread_mutex_lock(&mu);
        const uint8_t *p;
        size_t n;
        part_for(path, &p, &n);
        char head[256];
        if (n)
            snprintf(head, sizeof head, "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n", n);
        else
            snprintf(head, sizeof head,
                     "HTTP/1.1 404 Not Found\r\nX-Error-Code: EntryNotFound\r\n"
                     "Content-Length: 0\r\nConnection: close\r\n\r\n");
        send_all(c, head, strlen(head));
        send_all(c, p, n);
        pthread_mutex_unlock(&mu);
        shutdown(c, SHUT_WR);
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
    unsetenv("http_proxy"); /* straight to the loopback server */
    unsetenv("all_proxy");
    unsetenv("ALL_PROXY");
    tk_hub_key *k = NULL;
    if (tk_hub__key_load(&k, "tests/fuzz/serve_live-key.pem") != TK_OK || tk_hub__key_pubkey(&pubkey, k) != TK_OK) {
        fprintf(stderr, "fuzz_get: %s (run from the repository root)\n", tk_last_error());
        abort();
    }
    tk_hub__key_free(k);
    pthread_t t;
    if (pthread_create(&t, NULL, serve, NULL) != 0)
        abort();
    pthread_detach(t);
    atexit(fz_scratch_cleanup);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (lfd < 0)
        start();
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy)
        return 0;
    memcpy(copy, data, size);
    pthread_mutex_lock(&mu);
    free(input);
    input = copy;
    input_len = size;
    pthread_mutex_unlock(&mu);

    const char *dir = fz_scratch("get");
    char home[600], endpoint[64];
    snprintf(home, sizeof home, "%s/home", dir);
    snprintf(endpoint, sizeof endpoint, "http://127.0.0.1:%d", port);
    if (tk__rmtree(home) != TK_OK)
        abort();
    tk_ctx_opts o = TK_CTX_OPTS_INIT;
    o.home = home;
    o.endpoint = endpoint;
    o.offline = 0;
    tk_ctx *ctx = NULL;
    tk_pkg *pkg = NULL;
    if (tk_ctx_new(&ctx, &o) != TK_OK || tk_trust_add(ctx, "fuzz", pubkey, "fuzz") != TK_OK)
        abort();
    int rc = tk_pkg_get(&pkg, ctx, "fuzz/pkg", NULL);
    if (getenv("TK_FUZZ_VERBOSE"))
        fprintf(stderr, "fuzz_get: %d %s\n", rc, rc ? tk_last_error() : "installed");
    if ((rc == TK_OK) != (pkg != NULL))
        abort();
    tk_pkg_free(pkg);
    tk_ctx_free(ctx);
    return 0;
}
