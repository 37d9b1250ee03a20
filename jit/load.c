/*
 * load.c — loads compiled images into a device's primary context and launches their kernels.
 *
 * A module lives in the primary context of its device, so tk shares the context the CUDA runtime and
 * PyTorch use, and pointers from them work here. That context is retained once a process
 * (tk_jit__primary_ctx, mem.c) and never released by a module: releasing the last reference destroys
 * the context, and the next load created it again (100-500 ms on an H200: the first GPU run's warm
 * tk_get_kernel took 220-530 ms for that). Modules
 * are reference counted; a tk_kernel holds its modules, so they are never unloaded under it. The
 * function handles are looked up once and cached under the module's mutex. A launch pushes the
 * module's context on the calling thread and pops it after, so it works from any thread and leaves
 * the caller's current context as it was.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "jit/cuda_api.h"
#include "jit/jit.h"

#define MODULE_MAGIC 0x746b6d64u /* "tkmd" */

typedef struct {
    char *name;
    CUfunction fn;
    size_t smem_limit; /* the dynamic shared memory limit set on fn (0: the default 48 KiB) */
    size_t smem_static; /* the function's static __shared__ bytes */
} fn_entry;

struct tk_jit_module {
    uint32_t magic;
    atomic_int refs;
    int device;
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    pthread_mutex_t mu;
    fn_entry *fns;
    size_t nfns, capfns;
    tk_jit_sandbox *sb; /* loaded in a self-test sandbox's context (not the primary one), or NULL */
    unsigned sb_gen;    /* the sandbox's generation then: after a reset the module is gone with its context */
};

static int is_stale(CUresult r)
{
    return r == CUDA_ERROR_INVALID_IMAGE || r == CUDA_ERROR_NO_BINARY_FOR_GPU ||
           r == CUDA_ERROR_UNSUPPORTED_PTX_VERSION || r == CUDA_ERROR_INVALID_PTX;
}

int tk_jit__module_load(tk_jit_module **out, int device, const void *image, int *stale)
{
    return tk_jit__module_load_in(out, device, NULL, image, stale);
}

int tk_jit__module_load_in(tk_jit_module **out, int device, tk_jit_sandbox *sb, const void *image, int *stale)
{
    const tk_cu_api *cu;
    tk_jit_module *m = NULL;
    CUresult r;
    CUcontext popped;
    char eb[256];
    int rc, n = 0, pushed = 0;

    *out = NULL;
    if (stale)
        *stale = 0;
    if (!image)
        return tk__err(TK_ERR_INVALID, "tk_jit__module_load: no image");
    if ((rc = tk_jit__device_count(&n)) != TK_OK)
        return rc;
    if (device < 0 || device >= n)
        return tk__err(TK_ERR_NO_DEVICE, "no CUDA device %d (this machine has %d)", device, n);
    cu = tk_jit__cu();
    if (!(m = calloc(1, sizeof *m)))
        return tk__err(TK_ERR_NOMEM, "out of memory loading a module");
    m->magic = MODULE_MAGIC;
    atomic_init(&m->refs, 1);
    m->device = device;
    pthread_mutex_init(&m->mu, NULL);
    if ((r = cu->cuDeviceGet(&m->dev, device)) != CUDA_SUCCESS) {
        rc = tk__err(TK_ERR_NO_DEVICE, "cuDeviceGet(%d): %s", device, tk_jit__cu_errstr(r, eb, sizeof eb));
        goto fail;
    }
    if (sb) {
        m->sb = sb;
        m->sb_gen = tk_jit__sandbox_gen(sb);
        if (!(m->ctx = tk_jit__sandbox_ctx(sb))) {
            rc = tk__err(TK_ERR_LAUNCH, "the self-test context of device %d is gone", device);
            goto fail;
        }
    } else {
        void *pc = NULL;
        if ((rc = tk_jit__primary_ctx(&pc, device)) != TK_OK) {
            rc = tk__err_wrap(rc, "cannot get the primary context of device %d", device);
            goto fail;
        }
        m->ctx = (CUcontext)pc; /* mem.c's reference, held for the process: nothing to release */
    }
    if ((r = cu->cuCtxPushCurrent(m->ctx)) != CUDA_SUCCESS) {
        rc = tk__err(TK_ERR_LAUNCH, "cuCtxPushCurrent: %s", tk_jit__cu_errstr(r, eb, sizeof eb));
        goto fail;
    }
    pushed = 1;
    r = cu->cuModuleLoadData(&m->mod, image);
    if (r != CUDA_SUCCESS) {
        m->mod = NULL;
        if (stale && is_stale(r))
            *stale = 1;
        rc = tk__err(TK_ERR_LAUNCH, "loading a compiled module on device %d failed: %s%s", device,
                     tk_jit__cu_errstr(r, eb, sizeof eb),
                     is_stale(r) ? "\nHINT: the binary does not fit this GPU or driver; tk recompiles it "
                                   "(or run 'tk cache clear')"
                                 : "");
        goto fail;
    }
    cu->cuCtxPopCurrent(&popped);
    *out = m;
    return TK_OK;
fail:
    if (pushed)
        cu->cuCtxPopCurrent(&popped);
    pthread_mutex_destroy(&m->mu);
    free(m);
    return rc;
}

void tk_jit__module_retain(tk_jit_module *m)
{
    if (m && m->magic == MODULE_MAGIC)
        atomic_fetch_add(&m->refs, 1);
}

void tk_jit__module_release(tk_jit_module *m)
{
    const tk_cu_api *cu = tk_jit__cu();
    CUcontext popped;
    if (!m || m->magic != MODULE_MAGIC)
        return;
    if (atomic_fetch_sub(&m->refs, 1) != 1)
        return;
    /* a sandbox module whose context was destroyed (reset after a fault) went with it */
    int alive = !m->sb || tk_jit__sandbox_gen(m->sb) == m->sb_gen;
    if (m->mod && alive && cu->cuCtxPushCurrent(m->ctx) == CUDA_SUCCESS) {
        cu->cuModuleUnload(m->mod);
        cu->cuCtxPopCurrent(&popped);
    }
    for (size_t i = 0; i < m->nfns; i++)
        free(m->fns[i].name);
    free(m->fns);
    pthread_mutex_destroy(&m->mu);
    m->magic = 0;
    free(m);
}

int tk_jit__module_device(const tk_jit_module *m) { return m ? m->device : -1; }

int tk_jit__module_function(void **fn, tk_jit_module *m, const char *lowered)
{
    const tk_cu_api *cu = tk_jit__cu();
    CUfunction f = NULL;
    CUresult r;
    char eb[256];
    int rc = TK_OK;

    *fn = NULL;
    if (!m || m->magic != MODULE_MAGIC || !lowered)
        return tk__err(TK_ERR_INVALID, "tk_jit__module_function: bad module or name");
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < m->nfns; i++)
        if (strcmp(m->fns[i].name, lowered) == 0) {
            *fn = m->fns[i].fn;
            goto done;
        }
    if ((r = cu->cuModuleGetFunction(&f, m->mod, lowered)) != CUDA_SUCCESS) {
        rc = tk__err(r == CUDA_ERROR_NOT_FOUND ? TK_ERR_NOT_FOUND : TK_ERR_LAUNCH,
                     "kernel '%s' not found in the loaded module: %s", lowered, tk_jit__cu_errstr(r, eb, sizeof eb));
        goto done;
    }
    if (m->nfns == m->capfns) {
        size_t nc = m->capfns ? m->capfns * 2 : 8;
        fn_entry *p = realloc(m->fns, nc * sizeof *p);
        if (!p) {
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
            goto done;
        }
        m->fns = p;
        m->capfns = nc;
    }
    if (!(m->fns[m->nfns].name = tk__strdup(lowered))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    int st = 0;
    if (cu->cuFuncGetAttribute(&st, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, f) != CUDA_SUCCESS || st < 0)
        st = 0;
    m->fns[m->nfns].fn = f;
    m->fns[m->nfns].smem_limit = 0;
    m->fns[m->nfns].smem_static = (size_t)st;
    m->nfns++;
    *fn = f;
done:
    pthread_mutex_unlock(&m->mu);
    return rc;
}

size_t tk_jit__smem_optin(size_t static_bytes, size_t dynamic_bytes)
{
    return dynamic_bytes && static_bytes + dynamic_bytes > 48 * 1024 ? dynamic_bytes : 0;
}

/* Raises fn's dynamic shared memory limit to smem when static + dynamic shared memory exceeds the
 * default 48 KiB (the default dynamic limit is 48 KiB minus the static part; beyond needs an opt-in). */
static int ensure_smem(tk_jit_module *m, CUfunction fn, size_t smem)
{
    const tk_cu_api *cu = tk_jit__cu();
    int rc = TK_OK;
    if (!smem)
        return TK_OK;
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < m->nfns; i++) {
        if (m->fns[i].fn != fn)
            continue;
        if (tk_jit__smem_optin(m->fns[i].smem_static, smem) && m->fns[i].smem_limit < smem) {
            CUresult r = cu->cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)smem);
            if (r != CUDA_SUCCESS) {
                char eb[256];
                int optin = 0;
                cu->cuDeviceGetAttribute(&optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, m->dev);
                rc = tk__err(TK_ERR_LAUNCH,
                             "the kernel asks for %zu bytes of dynamic shared memory (plus %zu static); "
                             "device %d allows %d in all: %s",
                             smem, m->fns[i].smem_static, m->device, optin, tk_jit__cu_errstr(r, eb, sizeof eb));
            } else {
                m->fns[i].smem_limit = smem;
            }
        }
        break;
    }
    pthread_mutex_unlock(&m->mu);
    return rc;
}

int tk_jit__launch(tk_jit_module *m, void *fn, const unsigned grid[3], const unsigned block[3], size_t smem,
                   void *stream, void **args, size_t ws_bytes, uint64_t *ws)
{
    const tk_cu_api *cu = tk_jit__cu();
    CUcontext popped;
    CUresult r;
    char eb[256];
    int rc;

    if (!m || m->magic != MODULE_MAGIC || !fn)
        return tk__err(TK_ERR_INVALID, "launch: bad module or function");
    if (smem > (size_t)INT32_MAX)
        return tk__err(TK_ERR_INVALID, "launch: %zu bytes of shared memory is too much", smem);
    if ((r = cu->cuCtxPushCurrent(m->ctx)) != CUDA_SUCCESS)
        return tk__err(TK_ERR_LAUNCH, "cuCtxPushCurrent: %s", tk_jit__cu_errstr(r, eb, sizeof eb));
    rc = ensure_smem(m, (CUfunction)fn, smem);
    if (rc == TK_OK && ws_bytes) {
        CUdeviceptr p = 0;
        r = cu->cuMemAllocAsync(&p, ws_bytes, (CUstream)stream);
        if (r == CUDA_SUCCESS && (r = cu->cuMemsetD8Async(p, 0, ws_bytes, (CUstream)stream)) != CUDA_SUCCESS)
            cu->cuMemFreeAsync(p, (CUstream)stream);
        if (r != CUDA_SUCCESS)
            rc = tk__err(r == CUDA_ERROR_OUT_OF_MEMORY ? TK_ERR_NOMEM : TK_ERR_LAUNCH,
                         "the kernel's %zu-byte workspace: %s", ws_bytes, tk_jit__cu_errstr(r, eb, sizeof eb));
        else
            *ws = p;
    }
    if (rc == TK_OK) {
        r = cu->cuLaunchKernel((CUfunction)fn, grid[0], grid[1], grid[2], block[0], block[1], block[2], (unsigned)smem,
                               (CUstream)stream, args, NULL);
        if (r != CUDA_SUCCESS)
            rc = tk__err(TK_ERR_LAUNCH, "cuLaunchKernel (grid %u,%u,%u block %u,%u,%u smem %zu): %s", grid[0], grid[1],
                         grid[2], block[0], block[1], block[2], smem, tk_jit__cu_errstr(r, eb, sizeof eb));
        if (ws_bytes)
            cu->cuMemFreeAsync((CUdeviceptr)*ws, (CUstream)stream);
    }
    cu->cuCtxPopCurrent(&popped);
    return rc;
}
