/*
 * mem.c — device memory through the driver: the buffers of tk_device_* (tests, examples, simple
 * hosts) and the zero-filled launch workspaces of kernels that declare one.
 *
 * Each device's primary context is retained once, on first use, and kept for the life of the
 * process (the modules of load.c use the same reference: a primary context whose last reference is
 * released is destroyed, and creating one again costs 100-500 ms on a large GPU, which every warm
 * tk_get_kernel paid after the last tk_kernel_free); a call pushes it, works and pops it, so the
 * caller's current context is left as it was.
 */
#include <pthread.h>
#include <stdlib.h>

#include "jit/cuda_api.h"
#include "jit/jit.h"

#define MAX_DEVICES 64

static pthread_mutex_t ctx_mu = PTHREAD_MUTEX_INITIALIZER;
static CUcontext ctxs[MAX_DEVICES];

int tk_jit__ctx_push(int device)
{
    void *c = NULL;
    CUresult r;
    char eb[256];
    int rc;
    if ((rc = tk_jit__primary_ctx(&c, device)) != TK_OK)
        return rc;
    if ((r = tk_jit__cu()->cuCtxPushCurrent((CUcontext)c)) != CUDA_SUCCESS)
        return tk__err(TK_ERR_LAUNCH, "cuCtxPushCurrent: %s", tk_jit__cu_errstr(r, eb, sizeof eb));
    return TK_OK;
}

int tk_jit__primary_ctx(void **out, int device)
{
    const tk_cu_api *cu;
    CUresult r;
    char eb[256];
    int rc, n = 0;

    if ((rc = tk_jit__cuda_load()) != TK_OK)
        return rc;
    cu = tk_jit__cu();
    if ((rc = tk_jit__device_count(&n)) != TK_OK)
        return rc;
    if (device < 0 || device >= n || device >= MAX_DEVICES)
        return tk__err(n ? TK_ERR_INVALID : TK_ERR_NO_DEVICE, "device %d does not exist (%d device%s)", device, n,
                       n == 1 ? "" : "s");
    pthread_mutex_lock(&ctx_mu);
    if (!ctxs[device]) {
        CUdevice dev;
        if ((r = cu->cuDeviceGet(&dev, device)) != CUDA_SUCCESS ||
            (r = cu->cuDevicePrimaryCtxRetain(&ctxs[device], dev)) != CUDA_SUCCESS) {
            ctxs[device] = NULL;
            pthread_mutex_unlock(&ctx_mu);
            return tk__err(TK_ERR_LAUNCH, "device %d: no context: %s", device, tk_jit__cu_errstr(r, eb, sizeof eb));
        }
    }
    *out = ctxs[device];
    pthread_mutex_unlock(&ctx_mu);
    return TK_OK;
}

void tk_jit__ctx_pop(void)
{
    CUcontext c;
    tk_jit__cu()->cuCtxPopCurrent(&c);
}

/* A driver failure as a tk status: out of memory is TK_ERR_NOMEM, anything else TK_ERR_LAUNCH
 * (which is also how an earlier kernel's fault surfaces at the next synchronising call). */
static int fail(CUresult r, const char *what, int device)
{
    char eb[256];
    tk_jit__cu_errstr(r, eb, sizeof eb);
    if (r == CUDA_ERROR_OUT_OF_MEMORY)
        return tk__err(TK_ERR_NOMEM, "%s on device %d: %s", what, device, eb);
    return tk__err(TK_ERR_LAUNCH, "%s on device %d: %s", what, device, eb);
}

int tk_jit__mem_alloc(uint64_t *out, int device, size_t bytes)
{
    int rc = tk_jit__ctx_push(device);
    if (rc != TK_OK)
        return rc;
    CUdeviceptr p = 0;
    CUresult r = tk_jit__cu()->cuMemAlloc(&p, bytes ? bytes : 1);
    tk_jit__ctx_pop();
    if (r != CUDA_SUCCESS)
        return fail(r, "cuMemAlloc", device);
    *out = p;
    return TK_OK;
}

int tk_jit__mem_free(uint64_t p, int device)
{
    int rc = tk_jit__ctx_push(device);
    if (rc != TK_OK)
        return rc;
    CUresult r = tk_jit__cu()->cuMemFree(p);
    tk_jit__ctx_pop();
    return r == CUDA_SUCCESS ? TK_OK : fail(r, "cuMemFree", device);
}

int tk_jit__mem_copy(void *dst, const void *src, size_t bytes, int kind, int device)
{
    const tk_cu_api *cu;
    CUresult r;
    int rc = tk_jit__ctx_push(device);
    if (rc != TK_OK)
        return rc;
    cu = tk_jit__cu();
    switch (kind) {
    case TK_JIT_COPY_H2D: r = cu->cuMemcpyHtoD((CUdeviceptr)(uintptr_t)dst, src, bytes); break;
    case TK_JIT_COPY_D2H: r = cu->cuMemcpyDtoH(dst, (CUdeviceptr)(uintptr_t)src, bytes); break;
    default: r = cu->cuMemcpyDtoD((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, bytes); break;
    }
    tk_jit__ctx_pop();
    return r == CUDA_SUCCESS ? TK_OK : fail(r, "cuMemcpy", device);
}

int tk_jit__mem_set(uint64_t p, int value, size_t bytes, int device)
{
    int rc = tk_jit__ctx_push(device);
    if (rc != TK_OK)
        return rc;
    CUresult r = tk_jit__cu()->cuMemsetD8(p, (unsigned char)value, bytes);
    tk_jit__ctx_pop();
    return r == CUDA_SUCCESS ? TK_OK : fail(r, "cuMemsetD8", device);
}

int tk_jit__sync(int device)
{
    int rc = tk_jit__ctx_push(device);
    if (rc != TK_OK)
        return rc;
    CUresult r = tk_jit__cu()->cuCtxSynchronize();
    tk_jit__ctx_pop();
    return r == CUDA_SUCCESS ? TK_OK : fail(r, "cuCtxSynchronize (a kernel launched earlier failed)", device);
}

int tk_jit__mem_copy_async(uint64_t dst, uint64_t src, size_t bytes, int device, void *stream)
{
    int rc = tk_jit__ctx_push(device);
    if (rc != TK_OK)
        return rc;
    CUresult r = tk_jit__cu()->cuMemcpyDtoDAsync(dst, src, bytes, (CUstream)stream);
    tk_jit__ctx_pop();
    return r == CUDA_SUCCESS ? TK_OK : fail(r, "cuMemcpyDtoDAsync", device);
}

struct tk_jit_timer {
    int device;
    CUevent a, b;
};

int tk_jit__timer_new(tk_jit_timer **out, int device)
{
    *out = NULL;
    int rc = tk_jit__ctx_push(device);
    if (rc != TK_OK)
        return rc;
    const tk_cu_api *cu = tk_jit__cu();
    tk_jit_timer *t = calloc(1, sizeof *t);
    CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
    if (t && (r = cu->cuEventCreate(&t->a, 0)) == CUDA_SUCCESS && (r = cu->cuEventCreate(&t->b, 0)) != CUDA_SUCCESS)
        cu->cuEventDestroy(t->a);
    tk_jit__ctx_pop();
    if (r != CUDA_SUCCESS) {
        free(t);
        return fail(r, "cuEventCreate", device);
    }
    t->device = device;
    *out = t;
    return TK_OK;
}

int tk_jit__timer_start(tk_jit_timer *t, void *stream)
{
    int rc = tk_jit__ctx_push(t->device);
    if (rc != TK_OK)
        return rc;
    CUresult r = tk_jit__cu()->cuEventRecord(t->a, (CUstream)stream);
    tk_jit__ctx_pop();
    return r == CUDA_SUCCESS ? TK_OK : fail(r, "cuEventRecord", t->device);
}

int tk_jit__timer_stop(tk_jit_timer *t, void *stream, float *ms)
{
    const tk_cu_api *cu = tk_jit__cu();
    int rc = tk_jit__ctx_push(t->device);
    if (rc != TK_OK)
        return rc;
    CUresult r = cu->cuEventRecord(t->b, (CUstream)stream);
    if (r == CUDA_SUCCESS)
        r = cu->cuEventSynchronize(t->b);
    if (r == CUDA_SUCCESS)
        r = cu->cuEventElapsedTime(ms, t->a, t->b);
    tk_jit__ctx_pop();
    return r == CUDA_SUCCESS ? TK_OK : fail(r, "timing a launch", t->device);
}

void tk_jit__timer_free(tk_jit_timer *t)
{
    if (!t)
        return;
    if (tk_jit__ctx_push(t->device) == TK_OK) {
        tk_jit__cu()->cuEventDestroy(t->a);
        tk_jit__cu()->cuEventDestroy(t->b);
        tk_jit__ctx_pop();
    }
    free(t);
}
