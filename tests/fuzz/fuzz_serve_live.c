/*
 * fuzz_serve_live.c — a live `tk serve` (hub/serve.c on libmicrohttpd), as a smoke target: each input
 * is sent verbatim as the bytes of one TCP connection to a server on a loopback port, and the response
 * is read to the end. The server holds one published package (fuzz/pkg 1.0.0), trusts the committed
 * test key tests/fuzz/serve_live-key.pem for org fuzz (so a seed can carry a validly signed upload,
 * fuzz/pkg 1.0.1, made by seeds.py with that key), and has an upload token for org fuzz: the text
 * @TOKEN@ in the input is replaced by that token, so uploads and yanks get past authentication.
 * Run it from the repository root (make fuzz and make test do). Slower than the parsing targets (one connection an input), it
 * checks that nothing in the request path crashes or leaks, whatever arrives.
 *
 * Input: raw HTTP request bytes. Example: "GET /api/kernels/fuzz/pkg/refs HTTP/1.1\r\nHost: x\r\n\r\n".
 */
#define _GNU_SOURCE /* strcasestr */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/common.h"
#include "fuzz.h"
#include "hub/hub.h"
#include "hub/sign.h"
#include "tk.h"

static tk_server *srv;
static char *token;

static void stop(void)
{
    tk_server_free(srv);
    srv = NULL;
    free(token);
    fz_scratch_cleanup();
}

static void start(void)
{
    signal(SIGPIPE, SIG_IGN);
    const char *dir = fz_scratch("serve");
    if (!dir)
        abort();
    char pkg[600], key[600], root[600], path[700];
    snprintf(pkg, sizeof pkg, "%s/pkg", dir);
    snprintf(key, sizeof key, "%s/key.pem", dir);
    snprintf(root, sizeof root, "%s/root", dir);
    static const char spec[] =
        "{\"name\": \"fuzz/pkg\", \"version\": \"1.0.0\", \"license\": \"MIT\", \"description\": \"fuzz\",\n"
        " \"kernels\": [{\"name\": \"k\", \"op\": \"fuzz_k\", \"source\": \"k.cu\", \"symbol\": \"k\",\n"
        "   \"params\": [{\"name\": \"out\", \"type\": \"tensor\", \"dtype\": \"f32\"}],\n"
        "   \"launch\": {\"grid\": [\"numel(out)\"], \"block\": [\"32\"]}}]}\n";
    static const char src[] = "extern \"C\" __global__ void k(float *out) { out[threadIdx.x] = 0; }\n";
    char *pub = NULL, *commit = NULL, *keyid = NULL;
    tk_serve_opts o = TK_SERVE_OPTS_INIT;
    o.root = root;
    o.listen = "127.0.0.1:0";
    o.threads = 1;
    o.timeout_s = 1;
    o.max_connections = 1024; /* connections this target left to time out must not lock it out */
    o.max_per_ip = 1024;
    o.max_upload = 1 << 20;
    snprintf(path, sizeof path, "%s/kernel.json", pkg);
    if (tk__mkdirs(pkg, 0755) != TK_OK || fz_write_file(path, spec, strlen(spec)) != 0)
        abort();
    snprintf(path, sizeof path, "%s/k.cu", pkg);
    tk_hub_key *k = NULL;
    if (fz_write_file(path, src, strlen(src)) != 0 ||
        tk__copy_file("tests/fuzz/serve_live-key.pem", key, 0600) != TK_OK || tk_hub__key_load(&k, key) != TK_OK ||
        tk_hub__key_pubkey(&pub, k) != TK_OK || tk_hub__publish(&commit, pkg, root, key, "gz", NULL, NULL) != TK_OK ||
        tk_serve_trust_add(&keyid, root, "fuzz", pub) != TK_OK || tk_serve_token_add(&token, root, "fuzz") != TK_OK ||
        tk_server_new(&srv, &o) != TK_OK) {
        fprintf(stderr, "fuzz_serve_live: setup failed: %s\n", tk_last_error());
        abort();
    }
    tk_hub__key_free(k);
    tk_free(pub);
    tk_free(commit);
    tk_free(keyid);
    atexit(stop);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!srv)
        start();
    /* the input with @TOKEN@ replaced */
    tk_buf req = TK_BUF_INIT;
    for (size_t i = 0; i < size;) {
        if (size - i >= 7 && !memcmp(data + i, "@TOKEN@", 7)) {
            tk__buf_puts(&req, token);
            i += 7;
        } else {
            tk__buf_append(&req, data + i, 1);
            i++;
        }
    }
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)tk_server_port(srv));
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0)
        abort(); /* the server stopped accepting */
    size_t off = 0;
    while (off < req.len) {
        ssize_t w = send(fd, req.data + off, req.len - off, MSG_NOSIGNAL);
        if (w <= 0)
            break;
        off += (size_t)w;
    }
    shutdown(fd, SHUT_WR);
    /* Read until the response is complete (its headers and Content-Length bytes), or the server is
     * silent for 100 ms: libmicrohttpd keeps a half-closed connection open until its timeout, and
     * waiting for that would make this target a hundred times slower. */
    char buf[65536];
    size_t total = 0;
    struct pollfd pfd = {fd, POLLIN, 0};
    ssize_t got;
    while (poll(&pfd, 1, 100) > 0 && (got = recv(fd, buf + total, sizeof buf - 1 - total, 0)) > 0) {
        total += (size_t)got;
        buf[total] = '\0';
        if (total == (size_t)got && getenv("TK_FUZZ_VERBOSE")) /* the status line, when debugging a seed */
            fprintf(stderr, "fuzz_serve_live: %.*s\n", (int)strcspn(buf, "\r\n"), buf);
        const char *end = strstr(buf, "\r\n\r\n"), *cl = strcasestr(buf, "\r\nContent-Length:");
        if (end && cl && cl < end && total >= (size_t)(end + 4 - buf) + strtoull(cl + 17, NULL, 10))
            break;
        if (total == sizeof buf - 1)
            total = 0; /* a long body: only its end matters */
    }
    close(fd);
    tk__buf_free(&req);
    return 0;
}
