/*
 * sandbox.c — where a self-test runs a kernel that may be broken: a CUDA context of its own, made with
 * cuCtxCreate, with one stream (jit.h, "self-test sandboxes").
 *
 * Why a context of its own: the self-test's memory and modules stay apart from the caller's, and a
 * kernel under test never runs in the primary context that PyTorch, the caller's tensors and
 * tk_op_run's kernels share.
 *
 * What it cannot do (learnt on the first GPU run, an H200 with driver 580): contain a fault. A kernel
 * that traps or reads out of bounds leaves a sticky error (CUDA_ERROR_LAUNCH_FAILED, ILLEGAL_ADDRESS,
 * ...) that, as NVIDIA documents for those errors, "leaves the process in an inconsistent state and any
 * further CUDA work will return the same error; to continue using CUDA, the process must be terminated
 * and relaunched": after destroying the faulted context, cuCtxCreate itself failed with 719, and so
 * did every call in the process's primary context. So after a fault the process is marked lost
 * (tk_jit__cuda_lost) and no sandbox is made again; a caller that must go on runs its self-tests in a
 * process of its own (`tk selftest` is one).
 *
 * What the Driver API can and cannot do about a kernel that never ends:
 * - it has no call that stops one kernel. tk launches asynchronously and polls the stream
 *   (cuStreamQuery) against a deadline instead of blocking in a synchronize;
 * - at the deadline the process is marked lost and the context abandoned, never destroyed:
 *   cuCtxDestroy of a context whose kernel still runs waited for it (62 s until the watchdog of
 *   `tk selftest --timeout 1` ended the process, on the H200). The kernel runs until the process
 *   exits, which frees the GPU (`tk selftest` then exits with _exit, past the driver's own teardown);
 * - the display watchdog (a GPU driving a screen: about 2 s on Linux X, 5 s on Windows) and MPS or
 *   compute preemption are outside tk's control; with them the launch ends with
 *   CUDA_ERROR_LAUNCH_TIMEOUT and is reported as a crash.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jit/cuda_api.h"
#include "jit/jit.h"

#define SANDBOX_MAGIC 0x746b7362u /* "tksb" */

struct tk_jit_sandbox {
    uint32_t magic;
    int device;
    CUdevice dev;
    CUcontext ctx;
    CUstream stream;
    unsigned gen;
    int abandoned; /* a launch in ctx did not end: never destroyed (it would wait for the launch) */
};

/* Why CUDA is unusable in this process ("" while it is usable): set once, by the first fault or
 * timeout a sandbox sees; read from any thread. */
static char lost_why[512];
static _Atomic int lost;

static void set_lost(const char *why)
{
    int expect = 0;
    if (atomic_compare_exchange_strong(&lost, &expect, 1)) {
        snprintf(lost_why, sizeof lost_why, "%s", why);
        atomic_store(&lost, 2);
    }
}

const char *tk_jit__cuda_lost(void)
{
    return atomic_load(&lost) == 2 ? lost_why : atomic_load(&lost) ? "a kernel faulted" : NULL;
}

CUcontext tk_jit__sandbox_ctx(const struct tk_jit_sandbox *sb) { return sb ? sb->ctx : NULL; }
unsigned tk_jit__sandbox_gen(const struct tk_jit_sandbox *sb) { return sb ? sb->gen : 0; }
void *tk_jit__sandbox_stream(const tk_jit_sandbox *sb) { return sb ? (void *)sb->stream : NULL; }
int tk_jit__sandbox_device(const tk_jit_sandbox *sb) { return sb ? sb->device : -1; }

/* The errors NVIDIA documents as ending CUDA for the process ("must be terminated and relaunched"). */
static int sticky(CUresult r)
{
    return r == CUDA_ERROR_LAUNCH_FAILED || r == CUDA_ERROR_ILLEGAL_ADDRESS || r == CUDA_ERROR_HARDWARE_STACK_ERROR ||
           r == CUDA_ERROR_ILLEGAL_INSTRUCTION || r == CUDA_ERROR_MISALIGNED_ADDRESS ||
           r == CUDA_ERROR_INVALID_ADDRESS_SPACE || r == CUDA_ERROR_INVALID_PC || r == CUDA_ERROR_ASSERT ||
           r == CUDA_ERROR_LAUNCH_TIMEOUT;
}

static int cu_fail(CUresult r, const char *what, int device)
{
    char eb[256];
    tk_jit__cu_errstr(r, eb, sizeof eb);
    if (sticky(r)) { /* a fault the wait did not see (a copy after the kernel reports it), or an earlier one */
        char why[400];
        snprintf(why, sizeof why, "a kernel faulted: %s", eb);
        set_lost(why);
    }
    return tk__err(r == CUDA_ERROR_OUT_OF_MEMORY ? TK_ERR_NOMEM : TK_ERR_LAUNCH,
                   "%s (self-test context, device %d): %s", what, device, eb);
}

/* A new context and stream, left not current on this thread. */
static int make(tk_jit_sandbox *sb)
{
    const tk_cu_api *cu = tk_jit__cu();
    CUcontext popped;
    CUresult r = cu->cuCtxCreate(&sb->ctx, 0, sb->dev);
    if (r != CUDA_SUCCESS) {
        sb->ctx = NULL;
        return cu_fail(r, "cuCtxCreate", sb->device);
    }
    r = cu->cuStreamCreate(&sb->stream, 0);
    cu->cuCtxPopCurrent(&popped); /* cuCtxCreate made it current */
    if (r != CUDA_SUCCESS) {
        cu->cuCtxDestroy(sb->ctx);
        sb->ctx = NULL;
        sb->stream = NULL;
        return cu_fail(r, "cuStreamCreate", sb->device);
    }
    return TK_OK;
}

static void destroy(tk_jit_sandbox *sb)
{
    const tk_cu_api *cu = tk_jit__cu();
    CUcontext popped;
    if (!sb->ctx)
        return;
    if (sb->abandoned) { /* left to the process's exit */
        sb->ctx = NULL;
        sb->stream = NULL;
        sb->gen++;
        return;
    }
    if (sb->stream && cu->cuCtxPushCurrent(sb->ctx) == CUDA_SUCCESS) {
        cu->cuStreamDestroy(sb->stream); /* fails harmlessly in a context with a sticky error */
        cu->cuCtxPopCurrent(&popped);
    }
    cu->cuCtxDestroy(sb->ctx);
    sb->ctx = NULL;
    sb->stream = NULL;
    sb->gen++;
}

int tk_jit__sandbox_new(tk_jit_sandbox **out, int device)
{
    int rc, n = 0;
    *out = NULL;
    if (tk_jit__cuda_lost())
        return tk__err(TK_ERR_LAUNCH,
                       "CUDA is unusable in this process: %s\nHINT: a fault or a hung launch ends "
                       "CUDA for the whole process (NVIDIA: it must be restarted); run self-tests in a "
                       "process of their own ('tk selftest' is one)",
                       tk_jit__cuda_lost());
    if ((rc = tk_jit__device_count(&n)) != TK_OK)
        return rc;
    if (device < 0 || device >= n)
        return tk__err(n ? TK_ERR_INVALID : TK_ERR_NO_DEVICE, "no CUDA device %d (this machine has %d)", device, n);
    const tk_cu_api *cu = tk_jit__cu();
    if (!cu->cuCtxCreate || !cu->cuCtxDestroy || !cu->cuStreamCreate || !cu->cuStreamQuery || !cu->cuStreamDestroy)
        return tk__err(TK_ERR_UNSUPPORTED,
                       "this CUDA driver lacks cuCtxCreate_v2, cuCtxDestroy_v2 or the stream calls a "
                       "self-test runs kernels with\nHINT: update the NVIDIA driver");
    tk_jit_sandbox *sb = calloc(1, sizeof *sb);
    if (!sb)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    sb->magic = SANDBOX_MAGIC;
    sb->device = device;
    CUresult r = tk_jit__cu()->cuDeviceGet(&sb->dev, device);
    if (r != CUDA_SUCCESS) {
        free(sb);
        return cu_fail(r, "cuDeviceGet", device);
    }
    if ((rc = make(sb)) != TK_OK) {
        free(sb);
        return rc;
    }
    *out = sb;
    return TK_OK;
}

void tk_jit__sandbox_free(tk_jit_sandbox *sb)
{
    if (!sb || sb->magic != SANDBOX_MAGIC)
        return;
    destroy(sb);
    sb->magic = 0;
    free(sb);
}

int tk_jit__sandbox_reset(tk_jit_sandbox *sb)
{
    if (!sb || sb->magic != SANDBOX_MAGIC)
        return tk__err(TK_ERR_INVALID, "not a sandbox");
    destroy(sb);
    if (tk_jit__cuda_lost())
        return tk__err(TK_ERR_LAUNCH, "no new self-test context: CUDA is unusable in this process: %s",
                       tk_jit__cuda_lost());
    return make(sb);
}

/* Pushes the sandbox's context for one driver call. */
static int push(tk_jit_sandbox *sb)
{
    if (!sb || sb->magic != SANDBOX_MAGIC || !sb->ctx)
        return tk__err(TK_ERR_LAUNCH, "the self-test context is gone (a reset failed)");
    CUresult r = tk_jit__cu()->cuCtxPushCurrent(sb->ctx);
    return r == CUDA_SUCCESS ? TK_OK : cu_fail(r, "cuCtxPushCurrent", sb->device);
}

static void pop(void)
{
    CUcontext c;
    tk_jit__cu()->cuCtxPopCurrent(&c);
}

int tk_jit__sandbox_alloc(uint64_t *out, tk_jit_sandbox *sb, size_t bytes)
{
    CUdeviceptr p = 0;
    int rc = push(sb);
    *out = 0;
    if (rc != TK_OK)
        return rc;
    /* a little more than asked, so a kernel that writes one element past the end hits the pad, not
     * another tensor (the pad is not compared: the fault, if any, is the driver's to report) */
    CUresult r = tk_jit__cu()->cuMemAlloc(&p, bytes + 256);
    pop();
    if (r != CUDA_SUCCESS)
        return cu_fail(r, "cuMemAlloc", sb->device);
    *out = p;
    return TK_OK;
}

void tk_jit__sandbox_mfree(tk_jit_sandbox *sb, uint64_t p)
{
    if (!p || push(sb) != TK_OK)
        return;
    tk_jit__cu()->cuMemFree(p);
    pop();
}

int tk_jit__sandbox_copy(tk_jit_sandbox *sb, void *dst, const void *src, size_t bytes, int kind)
{
    const tk_cu_api *cu = tk_jit__cu();
    CUresult r;
    int rc;
    if (!bytes)
        return TK_OK;
    if ((rc = push(sb)) != TK_OK)
        return rc;
    r = kind == TK_JIT_COPY_H2D   ? cu->cuMemcpyHtoD((CUdeviceptr)(uintptr_t)dst, src, bytes)
        : kind == TK_JIT_COPY_D2H ? cu->cuMemcpyDtoH(dst, (CUdeviceptr)(uintptr_t)src, bytes)
                                  : cu->cuMemcpyDtoD((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, bytes);
    pop();
    return r == CUDA_SUCCESS ? TK_OK : cu_fail(r, "cuMemcpy", sb->device);
}

int tk_jit__sandbox_memset(tk_jit_sandbox *sb, uint64_t p, int value, size_t bytes)
{
    int rc;
    if (!bytes)
        return TK_OK;
    if ((rc = push(sb)) != TK_OK)
        return rc;
    CUresult r = tk_jit__cu()->cuMemsetD8(p, (unsigned char)value, bytes);
    pop();
    return r == CUDA_SUCCESS ? TK_OK : cu_fail(r, "cuMemsetD8", sb->device);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int tk_jit__sandbox_wait(tk_jit_sandbox *sb, double timeout_s, int *fault, int *timed_out)
{
    const tk_cu_api *cu = tk_jit__cu();
    double start = now_s();
    long sleep_ns = 2000;
    int rc;
    *fault = *timed_out = 0;
    if ((rc = push(sb)) != TK_OK)
        return rc;
    for (;;) {
        CUresult r = cu->cuStreamQuery(sb->stream);
        if (r == CUDA_SUCCESS)
            break;
        if (r != CUDA_ERROR_NOT_READY) {
            pop();
            *fault = 1;
            char eb[256], why[400];
            tk_jit__cu_errstr(r, eb, sizeof eb);
            snprintf(why, sizeof why, "a self-test's kernel faulted: %s", eb);
            set_lost(why);
            return tk__err(TK_ERR_LAUNCH, "the kernel faulted: %s", eb);
        }
        if (now_s() - start > timeout_s) {
            pop();
            *timed_out = 1;
            sb->abandoned = 1;
            char why[256];
            snprintf(why, sizeof why, "a self-test's launch did not end within %.1f s and is still running", timeout_s);
            set_lost(why);
            return tk__err(TK_ERR_LAUNCH, "the kernel did not finish within %.1f s (the self-test's limit per launch)",
                           timeout_s);
        }
        struct timespec ts = {0, sleep_ns};
        nanosleep(&ts, NULL);
        if (sleep_ns < 1000000)
            sleep_ns *= 2;
    }
    pop();
    return TK_OK;
}

/* ---- the device's identity ------------------------------------------------------------------------ */

/* The NVIDIA kernel module's version from /proc/driver/nvidia/version ("... Kernel Module  570.86.15
 * ..."), or "unknown". */
static void module_version(char *out, size_t n)
{
    char line[512];
    snprintf(out, n, "unknown");
    FILE *f = fopen("/proc/driver/nvidia/version", "r");
    if (!f)
        return;
    if (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "Kernel Module");
        if (p) {
            p += strlen("Kernel Module");
            while (*p == ' ' || *p == '\t')
                p++;
            size_t len = strcspn(p, " \t\n");
            if (len)
                snprintf(out, n, "%.*s", (int)len, p);
        }
    }
    fclose(f);
}

int tk_jit__device_ident(char *uuid, size_t nuuid, char *driver, size_t ndriver, int ordinal)
{
    const tk_cu_api *cu;
    CUdevice dev;
    unsigned char b[16];
    int rc, n = 0, v = 0;
    char mod[64];
    if ((rc = tk_jit__device_count(&n)) != TK_OK)
        return rc;
    if (ordinal < 0 || ordinal >= n)
        return tk__err(n ? TK_ERR_INVALID : TK_ERR_NO_DEVICE, "no CUDA device %d (this machine has %d)", ordinal, n);
    cu = tk_jit__cu();
    CUresult r = cu->cuDeviceGet(&dev, ordinal);
    if (r == CUDA_SUCCESS)
        r = cu->cuDriverGetVersion(&v);
    if (r != CUDA_SUCCESS)
        return cu_fail(r, "cuDeviceGet", ordinal);
    if (cu->cuDeviceGetUuid && cu->cuDeviceGetUuid(b, dev) == CUDA_SUCCESS) {
        snprintf(uuid, nuuid, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
                 b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
    } else { /* a driver too old to say: the name and ordinal stand in (results then follow the slot) */
        char name[128] = "";
        cu->cuDeviceGetName(name, (int)sizeof name, dev);
        snprintf(uuid, nuuid, "GPU-unknown-%d-%s", ordinal, name);
    }
    module_version(mod, sizeof mod);
    snprintf(driver, ndriver, "%s/%d", mod, v);
    return TK_OK;
}
