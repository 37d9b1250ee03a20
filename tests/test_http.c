/*
 * test_http.c — tk's HTTP client (hub/http.c) against a real, fault-injecting server on 127.0.0.1
 * (tests/faultserver.py): size caps, truncation and resume, retries with Retry-After, 404 codes,
 * exhausted retries, the token's origin rule across redirects, file:// URLs, digest checks, disk full,
 * progress and uploads.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <pthread.h>
#include <unistd.h>

#include "harness.h"

#include "common/common.h"
#include "hub/http.h"

static pid_t server_pid = -1;
static int port;
static char base[64];  /* http://127.0.0.1:<port> */
static char tmp[256];  /* a scratch directory */

/* ---- fixtures ---------------------------------------------------------------------------------- */

static unsigned char pat(int64_t i) { return (unsigned char)((i * 31 + 7) % 251); }

static unsigned char *pattern(size_t n)
{
    unsigned char *p = malloc(n ? n : 1);
    for (size_t i = 0; p && i < n; i++)
        p[i] = pat((int64_t)i);
    return p;
}

static void pattern_sha(char out[TK_SHA256_HEX], size_t n)
{
    unsigned char *p = pattern(n);
    tk__sha256_hex(out, p, n);
    free(p);
}

static int is_pattern(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)p[i] != pat((int64_t)i))
            return 0;
    return 1;
}

static int start_server(void)
{
    const char *script = getenv("TK_FAULTSERVER");
    char def[512];
    if (!script) {
        const char *f = __FILE__, *slash = strrchr(f, '/');
        snprintf(def, sizeof def, "%.*sfaultserver.py", slash ? (int)(slash - f + 1) : 0, f);
        script = def;
    }
    if (access(script, R_OK) != 0)
        return -1;
    int fds[2];
    if (pipe(fds) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        execlp("python3", "python3", script, "--port", "0", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    server_pid = pid;
    char line[32] = "";
    size_t k = 0;
    while (k + 1 < sizeof line) {
        ssize_t r = read(fds[0], line + k, 1);
        if (r <= 0 || line[k] == '\n')
            break;
        k++;
    }
    line[k] = '\0';
    close(fds[0]);
    int64_t p = 0;
    if (tk__parse_i64(line, 1, 65535, &p) != 0)
        return -1;
    port = (int)p;
    snprintf(base, sizeof base, "http://127.0.0.1:%d", port);
    return 0;
}

static void stop_server(void)
{
    if (server_pid > 0) {
        kill(server_pid, SIGTERM);
        waitpid(server_pid, NULL, 0);
        server_pid = -1;
    }
}

static char *url(const char *path) { return tk__fmt("%s%s", base, path); }

static tk_hub_http_opts fast_opts(void)
{
    tk_hub_http_opts o = {0};
    o.backoff_ms = 10;
    o.max_wait_s = 5;
    o.connect_timeout_s = 5;
    o.low_speed_time_s = 5;
    return o;
}

/* A handle with fast retries (fast_opts() when o is NULL). */
static tk_hub_http *client(const tk_hub_http_opts *o)
{
    tk_hub_http_opts d = fast_opts();
    tk_hub_http *h = NULL;
    if (tk_hub__http_new(&h, o ? o : &d) != TK_OK)
        fprintf(stderr, "tk_hub__http_new: %s\n", tk_last_error());
    return h;
}

static char *path_in_tmp(const char *name) { return tk__path_join(tmp, name); }

/* GETs path from the server into a string ("" on failure). */
static char *fetch(tk_hub_http *h, const char *path)
{
    char *u = url(path), *out = NULL;
    if (tk_hub__http_get_mem(h, u, 1 << 20, &out, NULL, NULL) != TK_OK)
        out = tk__strdup("");
    free(u);
    return out;
}

static int write_file(const char *path, const void *p, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return -1;
    int rc = tk__write_all(fd, p, n, path);
    close(fd);
    return rc == TK_OK ? 0 : -1;
}

static int file_is_pattern(const char *path, size_t n)
{
    char *data = NULL;
    size_t len = 0;
    int ok = tk__read_file(&data, &len, path, 1 << 26) == TK_OK && len == n && is_pattern(data, n);
    free(data);
    return ok;
}

/* ---- tests ------------------------------------------------------------------------------------- */

static void test_get_mem_ok(void)
{
    tk_hub_http *h = client(NULL);
    char *u = url("/ok/1000"), *out = NULL;
    size_t len = 0;
    tk_hub_http_meta meta;
    CHECK_RC(tk_hub__http_get_mem(h, u, 4096, &out, &len, &meta), TK_OK);
    CHECK_EQ_INT(len, 1000);
    CHECK(out && is_pattern(out, len) && out[len] == '\0');
    CHECK_EQ_INT(meta.status, 200);
    CHECK_STR(meta.etag, "\"etag-1000\"");
    CHECK_STR(meta.repo_commit, "0123456789abcdef0123456789abcdef01234567");
    CHECK_STR(meta.error_code, "");
    CHECK_EQ_INT(meta.attempts, 1);
    free(out);
    /* the same handle again: the connection is reused, nothing leaks between requests */
    CHECK_RC(tk_hub__http_get_mem(h, u, 4096, &out, &len, NULL), TK_OK);
    CHECK_EQ_INT(len, 1000);
    free(out);
    free(u);
    /* each request runs on a fresh libcurl handle (hub/http.c, setup): the share keeps the connection */
    char *first = NULL;
    u = url("/conn");
    CHECK_RC(tk_hub__http_get_mem(h, u, 64, &first, NULL, NULL), TK_OK);
    CHECK_RC(tk_hub__http_get_mem(h, u, 64, &out, NULL, NULL), TK_OK);
    CHECK_STR(out, first);
    free(first);
    free(out);
    free(u);
    tk_hub__http_free(h);
}

static void test_size_cap(void)
{
    tk_hub_http *h = client(NULL);
    char *out = (char *)1;
    size_t len = 7;
    char *u = url("/big");
    CHECK_RC(tk_hub__http_get_mem(h, u, 1 << 20, &out, &len, NULL), TK_ERR_NETWORK);
    CHECK(out == NULL && len == 0);
    CHECK_CONTAINS(tk_last_error(), "larger than the 1048576 bytes allowed");
    free(u);
    /* no Content-Length: the cap is enforced while the body streams in */
    u = url("/big-chunked");
    CHECK_RC(tk_hub__http_get_mem(h, u, 1 << 20, &out, &len, NULL), TK_ERR_NETWORK);
    CHECK_CONTAINS(tk_last_error(), "larger than");
    CHECK_RC(tk_hub__http_get_mem(h, u, 4 << 20, &out, &len, NULL), TK_OK);
    CHECK_EQ_INT(len, 2 << 20);
    free(out);
    char *dest = path_in_tmp("big.bin"), *part = tk__fmt("%s.part", dest);
    CHECK_RC(tk_hub__http_get_file(h, u, dest, 1 << 20, -1, NULL, NULL), TK_ERR_NETWORK);
    CHECK(!tk__path_exists(dest) && !tk__path_exists(part));
    free(u);
    free(dest);
    free(part);
    tk_hub__http_free(h);
}

static void test_truncated_resumes(void)
{
    tk_hub_http *h = client(NULL);
    char sha[TK_SHA256_HEX];
    pattern_sha(sha, 100000);
    char *u = url("/drop/100000/resume1"), *dest = path_in_tmp("drop.bin");
    tk_hub_http_meta meta;
    CHECK_RC(tk_hub__http_get_file(h, u, dest, 1 << 20, 100000, sha, &meta), TK_OK);
    CHECK_EQ_INT(meta.attempts, 2);
    CHECK_EQ_INT(meta.status, 206);
    CHECK(file_is_pattern(dest, 100000));
    char *last = fetch(h, "/last-headers");
    CHECK_CONTAINS(last, "Range: bytes=50000-");
    free(last);
    free(u);
    free(dest);
    tk_hub__http_free(h);
}

static void test_resume_existing_part(void)
{
    tk_hub_http *h = client(NULL);
    char sha[TK_SHA256_HEX];
    pattern_sha(sha, 100000);
    unsigned char *p = pattern(100000);
    char *dest = path_in_tmp("resume.bin"), *part = tk__fmt("%s.part", dest);

    /* a good partial file: only the rest is fetched */
    write_file(part, p, 30000);
    char *u = url("/ok/100000");
    CHECK_RC(tk_hub__http_get_file(h, u, dest, 1 << 20, 100000, sha, NULL), TK_OK);
    CHECK(file_is_pattern(dest, 100000) && !tk__path_exists(part));
    char *last = fetch(h, "/last-headers");
    CHECK_CONTAINS(last, "Range: bytes=30000-");
    free(last);

    /* a server that ignores Range answers 200: the .part restarts from zero */
    unlink(dest);
    write_file(part, "garbage!", 8);
    free(u);
    u = url("/norange/100000");
    CHECK_RC(tk_hub__http_get_file(h, u, dest, 1 << 20, 100000, sha, NULL), TK_OK);
    CHECK(file_is_pattern(dest, 100000));

    /* a .part longer than the file: 416, restart */
    unlink(dest);
    unsigned char *junk = calloc(1, 150000);
    write_file(part, junk, 150000);
    free(junk);
    free(u);
    u = url("/ok/100000");
    tk_hub_http_meta meta;
    CHECK_RC(tk_hub__http_get_file(h, u, dest, 1 << 20, -1, sha, &meta), TK_OK);
    CHECK(file_is_pattern(dest, 100000));
    CHECK_EQ_INT(meta.attempts, 2);

    /* a complete .part (a crash before the rename): 416 with the same total is success */
    unlink(dest);
    write_file(part, p, 100000);
    CHECK_RC(tk_hub__http_get_file(h, u, dest, 1 << 20, 100000, sha, &meta), TK_OK);
    CHECK_EQ_INT(meta.status, 416);
    CHECK(file_is_pattern(dest, 100000));

    free(u);
    free(p);
    free(dest);
    free(part);
    tk_hub__http_free(h);
}

static void test_retry_after(void)
{
    tk_hub_http *h = client(NULL);
    char *u = url("/503-then-ok/k1"), *out = NULL;
    tk_hub_http_meta meta;
    double t0 = tk__now_ms();
    CHECK_RC(tk_hub__http_get_mem(h, u, 100, &out, NULL, &meta), TK_OK);
    double ms = tk__now_ms() - t0;
    CHECK(ms >= 950);
    CHECK_EQ_INT(meta.attempts, 2);
    CHECK_STR(out, "ok");
    free(out);
    free(u);

    u = url("/429-then-ok/k2");
    CHECK_RC(tk_hub__http_get_mem(h, u, 100, &out, NULL, &meta), TK_OK);
    CHECK_EQ_INT(meta.attempts, 2);
    free(out);
    free(u);

    /* Retry-After is capped by max_wait_s */
    tk_hub_http_opts o = fast_opts();
    o.max_wait_s = 0.2;
    tk_hub_http *h2 = client(&o);
    u = url("/503-then-ok/k3");
    t0 = tk__now_ms();
    CHECK_RC(tk_hub__http_get_mem(h2, u, 100, &out, NULL, NULL), TK_OK);
    CHECK(tk__now_ms() - t0 < 900);
    free(out);
    free(u);
    tk_hub__http_free(h2);
    tk_hub__http_free(h);
}

static void test_retries_exhausted(void)
{
    tk_hub_http_opts o = fast_opts();
    o.max_attempts = 3;
    tk_hub_http *h = client(&o);
    char *u = url("/500-always"), *out = NULL;
    tk_hub_http_meta meta;
    CHECK_RC(tk_hub__http_get_mem(h, u, 100, &out, NULL, &meta), TK_ERR_NETWORK);
    CHECK(out == NULL);
    CHECK_EQ_INT(meta.attempts, 3);
    CHECK_EQ_INT(meta.status, 500);
    CHECK_CONTAINS(tk_last_error(), "HTTP 500");
    CHECK_CONTAINS(tk_last_error(), u);
    CHECK_CONTAINS(tk_last_error(), "boom");
    CHECK_CONTAINS(tk_last_error(), "3 attempts");
    CHECK_CONTAINS(tk_last_error(), "HINT: check TK_ENDPOINT");
    free(u);

    /* 403 is not retried, is an auth failure (exit 9, not a network one) and hints at the token */
    u = url("/403");
    CHECK_RC(tk_hub__http_get_mem(h, u, 100, &out, NULL, &meta), TK_ERR_AUTH);
    CHECK_EQ_INT(meta.attempts, 1);
    CHECK_CONTAINS(tk_last_error(), "TK_TOKEN");
    free(u);

    /* connection refused: retried, then a network error */
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    socklen_t alen = sizeof a;
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(s, (struct sockaddr *)&a, sizeof a);
    getsockname(s, (struct sockaddr *)&a, &alen);
    close(s);
    u = tk__fmt("http://127.0.0.1:%d/x", ntohs(a.sin_port));
    CHECK_RC(tk_hub__http_get_mem(h, u, 100, &out, NULL, &meta), TK_ERR_NETWORK);
    CHECK_EQ_INT(meta.attempts, 3);
    CHECK_CONTAINS(tk_last_error(), "HINT:");
    free(u);
    tk_hub__http_free(h);
}

static void test_not_found(void)
{
    tk_hub_http *h = client(NULL);
    char *u = url("/404"), *out = NULL;
    tk_hub_http_meta meta;
    CHECK_RC(tk_hub__http_get_mem(h, u, 100, &out, NULL, &meta), TK_ERR_NOT_FOUND);
    CHECK_EQ_INT(meta.status, 404);
    CHECK_EQ_INT(meta.attempts, 1);
    CHECK_STR(meta.error_code, "EntryNotFound");
    CHECK_CONTAINS(tk_last_error(), u);
    CHECK_CONTAINS(tk_last_error(), "EntryNotFound");
    free(u);
    u = url("/410");
    char *dest = path_in_tmp("gone.bin"), *part = tk__fmt("%s.part", dest);
    CHECK_RC(tk_hub__http_get_file(h, u, dest, 100, -1, NULL, &meta), TK_ERR_NOT_FOUND);
    CHECK_EQ_INT(meta.status, 410);
    CHECK(!tk__path_exists(dest));
    unlink(part);
    free(dest);
    free(part);
    free(u);
    tk_hub__http_free(h);
}

static void test_slow_and_garbage(void)
{
    tk_hub_http_opts o = fast_opts();
    o.low_speed_time_s = 1;
    o.low_speed_bytes = 1000;
    o.max_attempts = 1;
    tk_hub_http *h = client(&o);
    char *u = url("/slow"), *out = NULL;
    double t0 = tk__now_ms();
    CHECK_RC(tk_hub__http_get_mem(h, u, 1 << 20, &out, NULL, NULL), TK_ERR_NETWORK);
    CHECK(tk__now_ms() - t0 < 5000);
    CHECK_CONTAINS(tk_last_error(), "slow");
    free(u);
    u = url("/garbage");
    CHECK_RC(tk_hub__http_get_mem(h, u, 1 << 20, &out, NULL, NULL), TK_ERR_NETWORK);
    free(u);
    tk_hub__http_free(h);
}

static void test_token_origin(void)
{
    tk_hub_http_opts o = fast_opts();
    o.token = "secret";
    char origin[80];
    snprintf(origin, sizeof origin, "%s/", base); /* a trailing slash is fine */
    o.auth_origin = origin;
    tk_hub_http *h = client(&o);
    char *got = fetch(h, "/echo-auth");
    CHECK_STR(got, "Bearer secret");
    free(got);
    got = fetch(h, "/redirect-same");
    CHECK_STR(got, "Bearer secret");
    free(got);
    got = fetch(h, "/redirect-other-host");
    CHECK_STR(got, "none");
    free(got);
    got = fetch(h, "/redirect-away-and-back");
    CHECK_STR(got, "none");
    free(got);
    got = fetch(h, "/last-headers");
    CHECK(got && !strstr(got, "Authorization") && !strstr(got, "secret"));
    free(got);
    /* a different host name for the same address is another origin (skipped if it does not resolve) */
    char *u = url("/redirect-localhost"), *out = NULL;
    if (tk_hub__http_get_mem(h, u, 100, &out, NULL, NULL) == TK_OK)
        CHECK_STR(out, "none");
    free(out);
    free(u);
    tk_hub__http_free(h);

    /* another port is another origin */
    snprintf(origin, sizeof origin, "http://127.0.0.1:%d", port == 65535 ? 1 : port + 1);
    h = client(&o);
    got = fetch(h, "/echo-auth");
    CHECK_STR(got, "none");
    free(got);
    tk_hub__http_free(h);

    /* bad options */
    o.auth_origin = "not a url";
    h = (tk_hub_http *)1;
    CHECK_RC(tk_hub__http_new(&h, &o), TK_ERR_INVALID);
    CHECK(h == NULL);
    o.auth_origin = base;
    o.token = "a\r\nX-Injected: 1";
    CHECK_RC(tk_hub__http_new(&h, &o), TK_ERR_INVALID);
}

static void test_redirects(void)
{
    tk_hub_http *h = client(NULL);
    char *u = url("/redirect-loop"), *out = NULL;
    CHECK_RC(tk_hub__http_get_mem(h, u, 100, &out, NULL, NULL), TK_ERR_NETWORK);
    CHECK_CONTAINS(tk_last_error(), "redirects");
    free(u);
    u = url("/redirect-file");
    CHECK_RC(tk_hub__http_get_mem(h, u, 100, &out, NULL, NULL), TK_ERR_NETWORK);
    CHECK_CONTAINS(tk_last_error(), "refusing a redirect");
    CHECK(out == NULL);
    free(u);
    CHECK_RC(tk_hub__http_get_mem(h, "ftp://127.0.0.1/x", 100, &out, NULL, NULL), TK_ERR_INVALID);
    CHECK_RC(tk_hub__http_get_mem(h, NULL, 100, &out, NULL, NULL), TK_ERR_INVALID);
    CHECK_RC(tk_hub__http_get_mem(NULL, "http://x/", 100, &out, NULL, NULL), TK_ERR_INVALID);
    tk_hub__http_free(h);
}

static void test_file_urls(void)
{
    tk_hub_http *h = client(NULL);
    unsigned char *p = pattern(5000);
    char *src = path_in_tmp("src.bin"), *dest = path_in_tmp("copy.bin");
    char *part = tk__fmt("%s.part", dest);
    write_file(src, p, 5000);
    char *u = tk__fmt("file://%s", src), *out = NULL;
    size_t len = 0;
    tk_hub_http_meta meta;
    CHECK_RC(tk_hub__http_get_mem(h, u, 10000, &out, &len, &meta), TK_OK);
    CHECK(len == 5000 && out && is_pattern(out, len));
    CHECK_EQ_INT(meta.status, 200);
    free(out);
    CHECK_RC(tk_hub__http_get_mem(h, u, 1000, &out, &len, NULL), TK_ERR_NETWORK);

    char sha[TK_SHA256_HEX];
    pattern_sha(sha, 5000);
    write_file(part, p, 1234); /* resumes from a partial file */
    CHECK_RC(tk_hub__http_get_file(h, u, dest, 10000, 5000, sha, NULL), TK_OK);
    CHECK(file_is_pattern(dest, 5000) && !tk__path_exists(part));
    free(u);

    u = tk__fmt("file://%s/missing.bin", tmp);
    CHECK_RC(tk_hub__http_get_mem(h, u, 100, &out, NULL, NULL), TK_ERR_NOT_FOUND);
    CHECK_CONTAINS(tk_last_error(), "missing.bin");
    unlink(dest);
    CHECK_RC(tk_hub__http_get_file(h, u, dest, 100, -1, NULL, NULL), TK_ERR_NOT_FOUND);
    CHECK(!tk__path_exists(dest));
    unlink(part);
    free(u);
    free(p);
    free(src);
    free(dest);
    free(part);
    tk_hub__http_free(h);
}

static void test_digest_mismatch(void)
{
    tk_hub_http *h = client(NULL);
    char *u = url("/ok/1000"), *dest = path_in_tmp("digest.bin"), *part = tk__fmt("%s.part", dest);
    const char *wrong = "0000000000000000000000000000000000000000000000000000000000000000";
    CHECK_RC(tk_hub__http_get_file(h, u, dest, 4096, 1000, wrong, NULL), TK_ERR_DIGEST);
    CHECK_CONTAINS(tk_last_error(), "sha256");
    CHECK(!tk__path_exists(dest) && !tk__path_exists(part));
    CHECK_RC(tk_hub__http_get_file(h, u, dest, 4096, 999, NULL, NULL), TK_ERR_DIGEST);
    CHECK(!tk__path_exists(dest) && !tk__path_exists(part));
    CHECK_RC(tk_hub__http_get_file(h, u, dest, 4096, 1001, NULL, NULL), TK_ERR_DIGEST);
    CHECK(!tk__path_exists(dest) && !tk__path_exists(part));
    CHECK_RC(tk_hub__http_get_file(h, u, dest, 4096, -1, "xyz", NULL), TK_ERR_INVALID);
    free(u);
    free(dest);
    free(part);
    tk_hub__http_free(h);
}

static void test_disk_full(void)
{
    char *dir = path_in_tmp("tiny");
    tk__mkdirs(dir, 0755);
    if (mount("tmpfs", dir, "tmpfs", 0, "size=64k") != 0) {
        char why[128];
        snprintf(why, sizeof why, "cannot mount a small tmpfs (%s)", strerror(errno));
        free(dir);
        SKIP(why);
    }
    tk_hub_http *h = client(NULL);
    char *u = url("/ok/300000"), *dest = tk__path_join(dir, "full.bin");
    char *part = tk__fmt("%s.part", dest);
    CHECK_RC(tk_hub__http_get_file(h, u, dest, 1 << 20, -1, NULL, NULL), TK_ERR_NOSPACE);
    CHECK_CONTAINS(tk_last_error(), "HINT: free some disk space");
    CHECK(!tk__path_exists(dest) && !tk__path_exists(part));
    tk_hub__http_free(h);
    umount(dir);
    free(u);
    free(dest);
    free(part);
    free(dir);
}

typedef struct {
    char *url, *dest, *sha;
    int rc;
} fetch_job;

static void *fetch_thread(void *arg)
{
    fetch_job *j = arg;
    tk_hub_http *h = client(NULL);
    j->rc = tk_hub__http_get_file(h, j->url, j->dest, 1 << 22, 1 << 21, j->sha, NULL);
    tk_hub__http_free(h);
    return NULL;
}

/* Two downloads of the same dest at once: the .part lock keeps them from mixing their writes. */
static void test_concurrent_same_dest(void)
{
    char sha[TK_SHA256_HEX];
    pattern_sha(sha, 1 << 21);
    char *u = url("/ok/2097152"), *dest = path_in_tmp("shared.bin");
    fetch_job jobs[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        jobs[i] = (fetch_job){u, dest, sha, -99};
        pthread_create(&th[i], NULL, fetch_thread, &jobs[i]);
    }
    for (int i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ_INT(jobs[i].rc, TK_OK);
    }
    CHECK(file_is_pattern(dest, 1 << 21));
    /* a destination in a missing directory is a local I/O error, not "not found" */
    char *bad = path_in_tmp("no/such/dir/x.bin");
    tk_hub_http *h = client(NULL);
    CHECK_RC(tk_hub__http_get_file(h, u, bad, 100, -1, NULL, NULL), TK_ERR_IO);
    tk_hub__http_free(h);
    free(bad);
    free(u);
    free(dest);
}

typedef struct {
    int calls;
    int64_t last_done, last_total;
    char what[64];
} progress_log;

static void on_progress(void *user, const char *what, int64_t done, int64_t total)
{
    progress_log *l = user;
    l->calls++;
    l->last_done = done;
    l->last_total = total;
    snprintf(l->what, sizeof l->what, "%s", what);
}

static void test_progress(void)
{
    progress_log log = {0};
    tk_hub_http_opts o = fast_opts();
    o.progress = on_progress;
    o.progress_user = &log;
    tk_hub_http *h = client(&o);
    char *u = url("/ok/200000?x=1"), *dest = path_in_tmp("progress.bin");
    CHECK_RC(tk_hub__http_get_file(h, u, dest, 1 << 20, 200000, NULL, NULL), TK_OK);
    CHECK(log.calls >= 1);
    CHECK_EQ_INT(log.last_done, 200000);
    CHECK_EQ_INT(log.last_total, 200000);
    CHECK_STR(log.what, "200000");
    free(u);
    free(dest);
    tk_hub__http_free(h);
}

static void test_send(void)
{
    tk_hub_http *h = client(NULL);
    char *u = url("/echo"), *out = NULL;
    size_t len = 0;
    const char *body = "{\"a\": 1}";
    char sha[TK_SHA256_HEX], want[200];
    tk__sha256_hex(sha, body, strlen(body));
    snprintf(want, sizeof want, "PUT %zu %s application/json", strlen(body), sha);
    CHECK_RC(tk_hub__http_send(h, "PUT", u, "application/json", body, strlen(body), 4096, 1, &out, &len, NULL), TK_OK);
    CHECK_STR(out, want);
    CHECK_EQ_INT(len, strlen(want));
    free(out);
    char *last = fetch(h, "/last-headers");
    CHECK(last && !strstr(last, "Expect"));
    free(last);
    snprintf(want, sizeof want, "POST 0 %s -", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    CHECK_RC(tk_hub__http_send(h, "POST", u, NULL, NULL, 0, 4096, 0, &out, &len, NULL), TK_OK);
    CHECK_STR(out, want);
    free(out);
    free(u);
    /* non-idempotent sends are not retried on 500 */
    u = url("/500-always");
    tk_hub_http_meta meta;
    CHECK_RC(tk_hub__http_send(h, "POST", u, "text/plain", "x", 1, 4096, 0, &out, &len, &meta), TK_ERR_NETWORK);
    CHECK_EQ_INT(meta.attempts, 1);
    CHECK(out == NULL);
    free(u);
    CHECK_RC(tk_hub__http_send(h, "put me", "http://127.0.0.1/", NULL, NULL, 0, 10, 0, &out, NULL, NULL),
             TK_ERR_INVALID);
    CHECK_RC(tk_hub__http_send(h, "PUT", "file:///tmp/x", NULL, NULL, 0, 10, 0, &out, NULL, NULL), TK_ERR_INVALID);
    tk_hub__http_free(h);
}

int main(void)
{
    /* the tests talk to 127.0.0.1 only: never through a proxy from the environment */
    setenv("no_proxy", "*", 1);
    setenv("NO_PROXY", "*", 1);
    signal(SIGPIPE, SIG_IGN);
    snprintf(tmp, sizeof tmp, "/tmp/tk-test-http-XXXXXX");
    if (!mkdtemp(tmp)) {
        perror("mkdtemp");
        return 1;
    }
    if (start_server() != 0) {
        stop_server();
        printf("skip all: cannot start tests/faultserver.py (python3 missing?)\n");
        tk__rmtree(tmp);
        th_skipped++;
        return th_done();
    }
    RUN(test_get_mem_ok);
    RUN(test_size_cap);
    RUN(test_truncated_resumes);
    RUN(test_resume_existing_part);
    RUN(test_retry_after);
    RUN(test_retries_exhausted);
    RUN(test_not_found);
    RUN(test_slow_and_garbage);
    RUN(test_token_origin);
    RUN(test_redirects);
    RUN(test_file_urls);
    RUN(test_digest_mismatch);
    RUN(test_disk_full);
    RUN(test_concurrent_same_dest);
    RUN(test_progress);
    RUN(test_send);
    stop_server();
    tk__rmtree(tmp);
    return th_done();
}
