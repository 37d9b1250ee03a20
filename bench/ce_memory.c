/*
 * ce_memory.c — peak memory and time of fused_linear_cross_entropy's CPU reference, chunked (the
 * fused path: one chunk of logits at a time, Liger-Kernel's chunk rule) against the same op with
 * chunk_size = N (the unfused path: the whole [N, V] f32 logits matrix and its in-place gradient
 * materialised, as matmul -> cross_entropy -> two matmuls would hold them).
 *
 *     build/bench/ce_memory [N H V [grads]]      defaults: 1024 1024 32768 1 (grads: 1 = all three)
 *
 * Each path runs in its own child process so the RSS high-water marks (getrusage ru_maxrss) do not
 * mix. Reported per path: the scratch the reference allocates (its documented formula, below), the
 * RSS high-water growth during the call (inputs and outputs are allocated and touched before the
 * baseline is taken), wall time, and the loss (the two paths must agree). Inputs are bf16, the
 * gradients bf16 (hidden) and f32 (weight, bias-free). Single-threaded or not follows
 * tk_ops__parallel (all online cores).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ops/ops.h"

static const tk_dtype BF16 = {TK_DL_BFLOAT, 16, 1}, F32 = {TK_DL_FLOAT, 32, 1}, I64 = {TK_DL_INT, 64, 1};

typedef struct {
    tk_tensor t;
    int64_t shape[2];
} tensor;

static void *tensor_new(tensor *x, tk_dtype dt, int ndim, int64_t a, int64_t b)
{
    memset(x, 0, sizeof *x);
    x->shape[0] = a;
    x->shape[1] = b;
    x->t.ndim = ndim;
    x->t.shape = x->shape;
    x->t.dtype = dt;
    x->t.device.device_type = TK_DEV_CPU;
    size_t n = (size_t)a * (size_t)(ndim == 2 ? b : 1);
    x->t.data = calloc(n ? n : 1, dt.bits / 8);
    /* Touch every page now (a volatile store: the compiler may not drop it as it may drop a memset
     * after calloc), so the baseline RSS already holds the inputs and outputs. */
    volatile char *p = x->t.data;
    for (size_t i = 0; p && i < (n ? n : 1) * (dt.bits / 8); i += 4096)
        p[i] = 0;
    return x->t.data;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static long maxrss_kib(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

/* The reference's scratch for a chunk of c rows (ops/loss.c cpu_fl): f32 logits [c, V], the chunk's
 * hidden in f32 [c, H], its hidden gradient [c, H] (when asked for), c row losses (f64), and N row
 * losses for reduction none. */
static size_t scratch_bytes(int64_t c, int64_t h, int64_t v, int grad_hidden)
{
    return (size_t)c * (size_t)v * 4 + (size_t)c * (size_t)h * 4 * (grad_hidden ? 2 : 1) + (size_t)c * 8;
}

static int64_t liger_chunk(int64_t n, int64_t h, int64_t v)
{
    int64_t ratio = (v + h - 1) / h, want = (n + ratio - 1) / ratio, p = 1;
    while (p < want)
        p *= 2;
    return p < n ? p : n;
}

typedef struct {
    double loss, secs;
    long base_kib, peak_kib;
    int rc;
} result;

/* Runs one path (chunk rows) in this process and fills r. */
static void run_path(result *r, int64_t n, int64_t h, int64_t v, int64_t chunk, int grads)
{
    tensor hid, w, tgt, loss, gh, gw;
    uint16_t *hp = tensor_new(&hid, BF16, 2, n, h), *wp = tensor_new(&w, BF16, 2, v, h);
    int64_t *tp = tensor_new(&tgt, I64, 1, n, 0);
    tensor_new(&loss, F32, 0, 1, 0);
    uint64_t s = 42;
    for (int64_t i = 0; i < n * h; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        hp[i] = tk_ops__f32_to_bf16((float)((double)(s >> 11) * 0x1.0p-53 * 2 - 1));
    }
    float ws = 2.0f / (float)h;
    for (int64_t i = 0; i < v * h; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        wp[i] = tk_ops__f32_to_bf16(ws * (float)((double)(s >> 11) * 0x1.0p-53 * 2 - 1) * 16);
    }
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        tp[i] = i % 7 == 3 ? -100 : (int64_t)((s >> 17) % (uint64_t)v);
    }
    tk_arg a[8] = {{TK_ARG_TENSOR, "hidden", &hid.t, 0, 0},
                   {TK_ARG_TENSOR, "weight", &w.t, 0, 0},
                   {TK_ARG_TENSOR, "target", &tgt.t, 0, 0},
                   {TK_ARG_TENSOR, "loss", &loss.t, 0, 0},
                   {TK_ARG_I64, "chunk_size", NULL, chunk, 0}};
    size_t na = 5;
    if (grads) {
        tensor_new(&gh, BF16, 2, n, h);
        tensor_new(&gw, F32, 2, v, h);
        a[na++] = (tk_arg){TK_ARG_TENSOR, "grad_hidden", &gh.t, 0, 0};
        a[na++] = (tk_arg){TK_ARG_TENSOR, "grad_weight", &gw.t, 0, 0};
    }
    r->base_kib = maxrss_kib();
    tk_op_call c;
    double t0 = now();
    r->rc = tk_ops__prepare(&c, "fused_linear_cross_entropy", a, na);
    if (r->rc == TK_OK)
        r->rc = tk_ops__run_cpu(&c);
    r->secs = now() - t0;
    r->peak_kib = maxrss_kib();
    r->loss = ((float *)loss.t.data)[0];
    if (r->rc != TK_OK)
        fprintf(stderr, "ce_memory: %s\n", tk_last_error());
}

/* Runs a path in a child; the result comes back through a pipe. */
static int run_child(result *r, int64_t n, int64_t h, int64_t v, int64_t chunk, int grads)
{
    int fd[2];
    if (pipe(fd) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        close(fd[0]);
        result mine;
        memset(&mine, 0, sizeof mine);
        run_path(&mine, n, h, v, chunk, grads);
        ssize_t wr = write(fd[1], &mine, sizeof mine);
        _exit(wr == (ssize_t)sizeof mine && mine.rc == TK_OK ? 0 : 1);
    }
    close(fd[1]);
    ssize_t rd = read(fd[0], r, sizeof *r);
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return rd == (ssize_t)sizeof *r && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static void mib(char *buf, size_t n, double bytes) { snprintf(buf, n, "%.1f MiB", bytes / (1024.0 * 1024.0)); }

int main(int argc, char **argv)
{
    int64_t n = 1024, h = 1024, v = 32768;
    int grads = 1;
    if (argc >= 4) {
        n = strtoll(argv[1], NULL, 10);
        h = strtoll(argv[2], NULL, 10);
        v = strtoll(argv[3], NULL, 10);
    }
    if (argc >= 5)
        grads = (int)strtol(argv[4], NULL, 10);
    if (n <= 0 || h <= 0 || v <= 0) {
        fprintf(stderr, "usage: ce_memory [N H V [grads 0|1]]\n");
        return 2;
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    printf("fused_linear_cross_entropy CPU reference: N %lld, H %lld, V %lld, bf16 inputs, %s, %ld cores\n",
           (long long)n, (long long)h, (long long)v,
           grads ? "loss + grad_hidden (bf16) + grad_weight (f32)" : "loss only", cores);
    int64_t chunks[2] = {liger_chunk(n, h, v), n};
    const char *names[2] = {"fused (chunked)", "unfused (chunk = N)"};
    result r[2];
    int ok = 1;
    printf("%-20s %8s %14s %16s %10s %14s\n", "path", "chunk", "scratch", "RSS high-water+", "time", "loss");
    for (int p = 0; p < 2; p++) {
        if (run_child(&r[p], n, h, v, chunks[p], grads) != 0) {
            printf("%-20s failed\n", names[p]);
            ok = 0;
            continue;
        }
        char sb[32], rb[32];
        mib(sb, sizeof sb, (double)scratch_bytes(chunks[p], h, v, grads));
        mib(rb, sizeof rb, (double)(r[p].peak_kib - r[p].base_kib) * 1024.0);
        printf("%-20s %8lld %14s %16s %9.2fs %14.7f\n", names[p], (long long)chunks[p], sb, rb, r[p].secs, r[p].loss);
    }
    if (ok) {
        double d = r[0].loss - r[1].loss;
        printf("loss agreement |fused - unfused| = %.3g\n", d < 0 ? -d : d);
        printf("peak scratch ratio unfused / fused: %.1fx (counted), %.1fx (RSS)\n",
               (double)scratch_bytes(chunks[1], h, v, grads) / (double)scratch_bytes(chunks[0], h, v, grads),
               (double)(r[1].peak_kib - r[1].base_kib) /
                   (double)(r[0].peak_kib - r[0].base_kib > 0 ? r[0].peak_kib - r[0].base_kib : 1));
    }
    /* The GPU kernel's extra memory (kernels-src/cross-entropy): a workspace of 4 N H bytes (+ 32 per
     * 64 rows), against [N, V] logits in the input dtype plus their f32 gradient for an unfused
     * matmul -> cross_entropy. */
    char g1[32], g2[32];
    mib(g1, sizeof g1, 4.0 * (double)n * (double)h + 16.0 * (double)((n + 63) / 64) + 16);
    mib(g2, sizeof g2, (double)n * (double)v * (2 + 4));
    printf("GPU kernel workspace %s; an unfused bf16 matmul + f32 gradient of the logits would hold %s\n", g1, g2);
    return ok ? 0 : 1;
}
