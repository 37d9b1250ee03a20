/*
 * nccl.c — the NCCL backend: libnccl.so.2 and the handful of CUDA driver calls it needs (a device's
 * primary context, an event to wait on, a little device memory), both loaded with dlopen as jit/
 * loads them, so tk neither links nor needs them. comm/ may not call into jit/ (ARCHITECTURE.md),
 * hence its own small table; dlopen of the same library twice shares one copy.
 *
 * The communicator is made non-blocking (ncclConfig_t.blocking = 0, NCCL >= 2.14): creation and each
 * collective are polled (ncclCommGetAsyncError, cuEventQuery) under tk_comm__wait's deadline, and a
 * timeout ends with ncclCommAbort, so a dead peer never hangs the caller. The unique id reaches the
 * ranks over MPI (tk_comm__mpi_broadcast) or through a file rank 0 writes atomically.
 *
 * Types and values below are NCCL's (nccl.h, 2.28) and CUDA's (cuda.h); the config struct is the
 * 2.14 layout, which later NCCLs accept by its version field.
 */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm/comm.h"

/* ---- NCCL's types ---- */
typedef struct ncclComm *ncclComm_t;
typedef struct {
    char internal[128];
} ncclUniqueId;
typedef int ncclResult_t;
enum { ncclSuccess = 0, ncclInProgress = 7 };
enum {
    ncclInt8 = 0,
    ncclUint8 = 1,
    ncclInt32 = 2,
    ncclInt64 = 4,
    ncclFloat16 = 6,
    ncclFloat32 = 7,
    ncclFloat64 = 8,
    ncclBfloat16 = 9
};
enum { ncclSum = 0 };
#define NCCL_CONFIG_UNDEF_INT (-2147483647 - 1)
typedef struct {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int blocking, cgaClusterSize, minCTAs, maxCTAs;
    const char *netName;
} nccl_config_v21400;

/* ---- CUDA's ---- */
typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUevent_st *CUevent;
typedef struct CUstream_st *CUstream;
typedef unsigned long long CUdeviceptr;
enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_NOT_READY = 600,
    CU_EVENT_DISABLE_TIMING = 2
};

static struct {
    ncclResult_t (*GetVersion)(int *);
    ncclResult_t (*GetUniqueId)(ncclUniqueId *);
    ncclResult_t (*CommInitRankConfig)(ncclComm_t *, int, ncclUniqueId, int, void *);
    ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t *);
    ncclResult_t (*CommFinalize)(ncclComm_t);
    ncclResult_t (*CommDestroy)(ncclComm_t);
    ncclResult_t (*CommAbort)(ncclComm_t);
    ncclResult_t (*AllReduce)(const void *, void *, size_t, int, int, ncclComm_t, CUstream);
    ncclResult_t (*AllGather)(const void *, void *, size_t, int, ncclComm_t, CUstream);
    ncclResult_t (*Broadcast)(const void *, void *, size_t, int, int, ncclComm_t, CUstream);
    const char *(*GetErrorString)(ncclResult_t);
    const char *(*GetLastError)(ncclComm_t);
} nc;

static struct {
    CUresult (*Init)(unsigned);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*PrimaryCtxRelease)(CUdevice);
    CUresult (*CtxPushCurrent)(CUcontext);
    CUresult (*CtxPopCurrent)(CUcontext *);
    CUresult (*EventCreate)(CUevent *, unsigned);
    CUresult (*EventRecord)(CUevent, CUstream);
    CUresult (*EventQuery)(CUevent);
    CUresult (*EventDestroy)(CUevent);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
    CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
    CUresult (*MemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*MemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*GetErrorString)(CUresult, const char **);
} cu;

static pthread_once_t nccl_once = PTHREAD_ONCE_INIT, cu_once = PTHREAD_ONCE_INIT;
static int nccl_status = TK_ERR_INTERNAL, cu_status = TK_ERR_INTERNAL;
static char nccl_err[1024], nccl_path[1024], nccl_version[32], cu_err[512];
static int nccl_has_config; /* ncclCommInitRankConfig: NCCL >= 2.14 */

#define SYM(tab, field, name, req)                                                                                     \
    do {                                                                                                               \
        *(void **)&tab.field = dlsym(h, name);                                                                         \
        if (!tab.field && (req)) {                                                                                     \
            missing = name;                                                                                            \
            goto fail;                                                                                                 \
        }                                                                                                              \
    } while (0)

static void nccl_load_once(void)
{
    const char *env = getenv("TK_NCCL"), *home = getenv("CUDA_HOME"), *missing = NULL;
    char a[1024], tried[2048] = "";
    const char *cands[8];
    size_t ncand = 0, o = 0;
    void *h = NULL;
    int v = 0;
    Dl_info info;
    if (env && *env) {
        cands[ncand++] = env;
    } else {
        cands[ncand++] = "libnccl.so.2";
        if (home && *home) {
            snprintf(a, sizeof a, "%s/lib64/libnccl.so.2", home);
            cands[ncand++] = a;
        }
        cands[ncand++] = "/usr/local/cuda/lib64/libnccl.so.2";
    }
    for (size_t i = 0; i < ncand && !h; i++) {
        h = dlopen(cands[i], RTLD_NOW | RTLD_LOCAL);
        if (!h && o < sizeof tried) {
            const char *de = dlerror();
            o += (size_t)snprintf(tried + o, sizeof tried - o, "\n  %s: %s", cands[i], de ? de : "not found");
        }
    }
    if (!h) {
        snprintf(nccl_err, sizeof nccl_err,
                 "NCCL (libnccl.so.2) could not be loaded:%s\nHINT: install NCCL (apt install libnccl2, or pip "
                 "install nvidia-nccl-cu12) or point TK_NCCL at libnccl.so.2",
                 tried);
        nccl_status = TK_ERR_NOT_FOUND;
        return;
    }
    SYM(nc, GetVersion, "ncclGetVersion", 1);
    SYM(nc, GetUniqueId, "ncclGetUniqueId", 1);
    SYM(nc, CommInitRankConfig, "ncclCommInitRankConfig", 0);
    SYM(nc, CommGetAsyncError, "ncclCommGetAsyncError", 1);
    SYM(nc, CommFinalize, "ncclCommFinalize", 0);
    SYM(nc, CommDestroy, "ncclCommDestroy", 1);
    SYM(nc, CommAbort, "ncclCommAbort", 1);
    SYM(nc, AllReduce, "ncclAllReduce", 1);
    SYM(nc, AllGather, "ncclAllGather", 1);
    SYM(nc, Broadcast, "ncclBroadcast", 1);
    SYM(nc, GetErrorString, "ncclGetErrorString", 1);
    SYM(nc, GetLastError, "ncclGetLastError", 0);
    nccl_has_config = nc.CommInitRankConfig != NULL && nc.CommFinalize != NULL;
    if (nc.GetVersion(&v) != ncclSuccess)
        v = 0;
    if (v >= 20900) /* NCCL_VERSION: X*10000 + Y*100 + Z from 2.9 on, X*1000 + Y*100 + Z before */
        snprintf(nccl_version, sizeof nccl_version, "%d.%d.%d", v / 10000, v % 10000 / 100, v % 100);
    else
        snprintf(nccl_version, sizeof nccl_version, "%d.%d.%d", v / 1000, v % 1000 / 100, v % 100);
    if (dladdr(*(void **)&nc.GetVersion, &info) && info.dli_fname)
        snprintf(nccl_path, sizeof nccl_path, "%s", info.dli_fname);
    else
        snprintf(nccl_path, sizeof nccl_path, "%s", env && *env ? env : "libnccl.so.2");
    nccl_status = TK_OK;
    return;
fail:
    snprintf(nccl_err, sizeof nccl_err,
             "the NCCL library found lacks %s\nHINT: install NCCL 2.14 or newer, "
             "or point TK_NCCL at one",
             missing);
    memset(&nc, 0, sizeof nc);
    nccl_status = TK_ERR_NOT_FOUND;
}

static void cu_load_once(void)
{
    const char *lib = getenv("TK_LIBCUDA"), *missing = NULL;
    void *h;
    if (!lib || !*lib)
        lib = "libcuda.so.1";
    h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *de = dlerror();
        snprintf(cu_err, sizeof cu_err,
                 "no CUDA driver (%s: %s)\nHINT: NCCL needs an NVIDIA GPU and its driver; "
                 "on CPUs use the MPI backend",
                 lib, de ? de : "not found");
        cu_status = TK_ERR_NO_DEVICE;
        return;
    }
    SYM(cu, Init, "cuInit", 1);
    SYM(cu, DeviceGetCount, "cuDeviceGetCount", 1);
    SYM(cu, DeviceGet, "cuDeviceGet", 1);
    SYM(cu, PrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 1);
    SYM(cu, PrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", 1);
    SYM(cu, CtxPushCurrent, "cuCtxPushCurrent_v2", 1);
    SYM(cu, CtxPopCurrent, "cuCtxPopCurrent_v2", 1);
    SYM(cu, EventCreate, "cuEventCreate", 1);
    SYM(cu, EventRecord, "cuEventRecord", 1);
    SYM(cu, EventQuery, "cuEventQuery", 1);
    SYM(cu, EventDestroy, "cuEventDestroy_v2", 1);
    SYM(cu, MemAlloc, "cuMemAlloc_v2", 1);
    SYM(cu, MemFree, "cuMemFree_v2", 1);
    SYM(cu, MemcpyHtoD, "cuMemcpyHtoD_v2", 1);
    SYM(cu, MemcpyDtoH, "cuMemcpyDtoH_v2", 1);
    SYM(cu, MemcpyAsync, "cuMemcpyAsync", 1);
    SYM(cu, MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", 1);
    SYM(cu, MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", 1);
    SYM(cu, StreamSynchronize, "cuStreamSynchronize", 1);
    SYM(cu, GetErrorString, "cuGetErrorString", 1);
    CUresult r = cu.Init(0);
    if (r != CUDA_SUCCESS) {
        snprintf(cu_err, sizeof cu_err, "the CUDA driver (%s) failed to initialise (cuInit: %d)%s", lib, r,
                 r == CUDA_ERROR_NO_DEVICE ? ": no GPU\nHINT: NCCL needs one GPU a rank; on CPUs use the MPI "
                                             "backend"
                                           : "\nHINT: check 'nvidia-smi' and 'tk doctor'");
        cu_status = TK_ERR_NO_DEVICE;
        return;
    }
    cu_status = TK_OK;
    return;
fail:
    snprintf(cu_err, sizeof cu_err, "the CUDA driver %s lacks %s\nHINT: update the NVIDIA driver", lib, missing);
    memset(&cu, 0, sizeof cu);
    cu_status = TK_ERR_NO_DEVICE;
}

int tk_comm__nccl_load(char *path, size_t npath, char *version, size_t nversion)
{
    pthread_once(&nccl_once, nccl_load_once);
    if (nccl_status != TK_OK)
        return tk__err(nccl_status, "%s", nccl_err);
    if (path)
        snprintf(path, npath, "%s", nccl_path);
    if (version)
        snprintf(version, nversion, "%s", nccl_version);
    return TK_OK;
}

/* ---- the communicator ---- */

struct tk_comm_nccl {
    ncclComm_t comm;
    CUdevice dev;
    CUcontext ctx;   /* the device's primary context, retained */
    CUevent ev;      /* recorded after each collective, polled */
    CUdeviceptr scratch; /* size * TK_COMM_HOST_MAX bytes: host names at creation, the barrier's word */
    CUdeviceptr stage;   /* host tensors' bytes on the way through NCCL (tk_comm__nccl_stage), grown */
    size_t stage_bytes;
};

static const char *cu_str(CUresult r)
{
    const char *s = NULL;
    if (cu.GetErrorString)
        cu.GetErrorString(r, &s);
    return s ? s : "CUDA error";
}

static const char *nccl_str(tk_comm_nccl *n, ncclResult_t r)
{
    const char *last = n && n->comm && nc.GetLastError ? nc.GetLastError(n->comm) : NULL;
    return last && *last ? last : nc.GetErrorString(r);
}

static void push(tk_comm_nccl *n) { cu.CtxPushCurrent(n->ctx); }
static void pop(void)
{
    CUcontext x;
    cu.CtxPopCurrent(&x);
}

typedef struct {
    tk_comm *c;
    const char *what;
    int event; /* 1: wait for the event too; 0: only for NCCL's own state (creation, enqueue) */
} pollarg;

static int nccl_done(void *arg)
{
    pollarg *p = arg;
    tk_comm_nccl *n = p->c->nccl;
    ncclResult_t st = ncclSuccess;
    if (nc.CommGetAsyncError(n->comm, &st) != ncclSuccess || (st != ncclSuccess && st != ncclInProgress))
        return tk_comm__break(p->c, TK_ERR_NETWORK, "%s failed on rank %d of %d: NCCL: %s", p->what, p->c->rank,
                              p->c->size, nccl_str(n, st));
    if (!p->event)
        return st == ncclSuccess;
    if (st == ncclInProgress)
        return 0;
    CUresult r = cu.EventQuery(n->ev);
    if (r == CUDA_SUCCESS)
        return 1;
    if (r == CUDA_ERROR_NOT_READY)
        return 0;
    return tk_comm__break(p->c, TK_ERR_NETWORK, "%s failed on rank %d of %d: CUDA: %s", p->what, p->c->rank, p->c->size,
                          cu_str(r));
}

/* After a collective's call returned r: waits for NCCL to take it, records the event on stream and
 * waits for it, all under the deadline. A timeout aborts the NCCL communicator. */
static int finish(tk_comm *c, ncclResult_t r, void *stream, const char *what)
{
    tk_comm_nccl *n = c->nccl;
    pollarg p = {c, what, 0};
    int rc;
    if (r != ncclSuccess && r != ncclInProgress)
        return tk_comm__break(c, TK_ERR_NETWORK, "%s could not start on rank %d of %d: NCCL: %s", what, c->rank,
                              c->size, nccl_str(n, r));
    if (r == ncclInProgress && (rc = tk_comm__wait(c, what, nccl_done, &p)) != TK_OK)
        goto fail;
    CUresult cr = cu.EventRecord(n->ev, (CUstream)stream);
    if (cr != CUDA_SUCCESS)
        return tk_comm__break(c, TK_ERR_NETWORK, "%s: cuEventRecord: %s", what, cu_str(cr));
    p.event = 1;
    if ((rc = tk_comm__wait(c, what, nccl_done, &p)) != TK_OK)
        goto fail;
    return TK_OK;
fail:
    nc.CommAbort(n->comm); /* frees the GPU from the collective that will never complete */
    n->comm = NULL;
    return rc;
}

static int env_rank(const char *a, const char *b)
{
    const char *v = getenv(a);
    int64_t x;
    if (!v || !*v)
        v = getenv(b);
    if (!v || !*v || tk__parse_i64(v, 0, 1 << 20, &x) != 0)
        return -1;
    return (int)x;
}

/* The id file: "TKNCCLID", the world size (4 bytes, little-endian), the 128-byte id. */
#define ID_MAGIC "TKNCCLID"
#define ID_FILE_LEN (8 + 4 + 128)

typedef struct {
    tk_comm *c;
    const char *path;
    ncclUniqueId *id;
} idwait;

static int id_ready(void *arg)
{
    idwait *w = arg;
    char *buf = NULL;
    size_t len = 0;
    int rc = tk__read_file(&buf, &len, w->path, 4096);
    if (rc == TK_ERR_NOT_FOUND)
        return 0;
    if (rc != TK_OK)
        return rc;
    if (len != ID_FILE_LEN || memcmp(buf, ID_MAGIC, 8) != 0) {
        free(buf);
        return tk__err(TK_ERR_INVALID,
                       "'%s' is not a tk NCCL id file (%zu bytes)\nHINT: give every rank the same "
                       "fresh path; rank 0 writes it",
                       w->path, len);
    }
    uint32_t size = (uint32_t)(unsigned char)buf[8] | (uint32_t)(unsigned char)buf[9] << 8 |
                    (uint32_t)(unsigned char)buf[10] << 16 | (uint32_t)(unsigned char)buf[11] << 24;
    if ((int)size != w->c->size) {
        free(buf);
        return tk__err(TK_ERR_INVALID,
                       "'%s' was written by rank 0 of a %u-rank job, but this rank was told the "
                       "world has %d\nHINT: give every rank the same size (TK_WORLD_SIZE), and a fresh id file "
                       "per job",
                       w->path, size, w->c->size);
    }
    memcpy(w->id->internal, buf + 12, 128);
    free(buf);
    return 1;
}

static int id_by_file(tk_comm *c, const char *path, ncclUniqueId *id)
{
    if (c->rank == 0) {
        unsigned char buf[ID_FILE_LEN];
        ncclResult_t r;
        if (access(path, F_OK) == 0)
            return tk__err(TK_ERR_INVALID,
                           "the NCCL id file '%s' exists already (a previous job's?)\nHINT: remove "
                           "it, or give a fresh path for each job",
                           path);
        if ((r = nc.GetUniqueId(id)) != ncclSuccess)
            return tk__err(TK_ERR_NETWORK, "ncclGetUniqueId: %s", nc.GetErrorString(r));
        memcpy(buf, ID_MAGIC, 8);
        for (int i = 0; i < 4; i++)
            buf[8 + i] = (unsigned char)((uint32_t)c->size >> (8 * i));
        memcpy(buf + 12, id->internal, 128);
        return tk__write_atomic(path, buf, sizeof buf, 0600);
    }
    idwait w = {c, path, id};
    char what[1200];
    snprintf(what, sizeof what, "waiting for rank 0's NCCL id in '%s'", path);
    return tk_comm__wait(c, what, id_ready, &w);
}

/* This process's rank, world size and GPU: from MPI, else the options or the environment (the id
 * file's case); one GPU a rank. */
static int ranks_and_device(tk_comm *c, const tk_comm_opts *o)
{
    int ndev = 0;
    CUresult r;
    if (!c->mpi) { /* the id file: rank and size from the options or the environment */
        c->rank = o->rank >= 0 ? o->rank : env_rank("TK_RANK", "RANK");
        c->size = o->size >= 0 ? o->size : env_rank("TK_WORLD_SIZE", "WORLD_SIZE");
        if (c->size < 1 || c->rank < 0 || c->rank >= c->size)
            return tk__err(TK_ERR_INVALID,
                           "NCCL with an id file needs this process's rank and the world size "
                           "(rank %d of %d)\nHINT: set tk_comm_opts.rank and .size, or TK_RANK and TK_WORLD_SIZE "
                           "(torchrun's RANK and WORLD_SIZE work too)",
                           c->rank, c->size);
        c->local_rank = env_rank("TK_LOCAL_RANK", "LOCAL_RANK");
        if (c->local_rank < 0)
            c->local_rank = c->rank;
    }
    if ((r = cu.DeviceGetCount(&ndev)) != CUDA_SUCCESS || ndev == 0)
        return tk__err(TK_ERR_NO_DEVICE,
                       "NCCL needs a GPU, and this machine has none visible%s%s\nHINT: check "
                       "'nvidia-smi' and CUDA_VISIBLE_DEVICES; on CPUs use the MPI backend",
                       r != CUDA_SUCCESS ? ": " : "", r != CUDA_SUCCESS ? cu_str(r) : "");
    c->device = o->device >= 0 ? o->device : c->local_rank % ndev;
    if (c->device >= ndev)
        return tk__err(TK_ERR_INVALID, "rank %d asks for cuda:%d, but this machine shows %d GPU%s", c->rank, c->device,
                       ndev, ndev == 1 ? "" : "s");
    if (o->device < 0 && c->mpi && c->local_size > ndev)
        return tk__err(TK_ERR_INVALID,
                       "%d ranks run on host %s, but it shows %d GPU%s: NCCL needs one GPU a rank"
                       "\nHINT: start at most %d ranks a host (mpirun --map-by ppr:%d:node)",
                       c->local_size, c->hosts ? c->hosts[c->rank] : "?", ndev, ndev == 1 ? "" : "s", ndev, ndev);
    return TK_OK;
}

/* The host names of every rank, gathered over the new communicator (MPI gathered them already when
 * it started the ranks), and how many ranks share this one's host. The context is current. */
static int gather_hosts(tk_comm *c, tk_comm_nccl *n)
{
    CUresult r;
    ncclResult_t nr;
    int rc;
    char me[TK_COMM_HOST_MAX] = {0};
    CUdeviceptr mine = n->scratch + (CUdeviceptr)c->rank * TK_COMM_HOST_MAX;
    if (gethostname(me, sizeof me - 1) != 0)
        snprintf(me, sizeof me, "localhost");
    c->hosts = calloc((size_t)c->size, sizeof *c->hosts);
    if (!c->hosts)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    if ((r = cu.MemcpyHtoD(mine, me, sizeof me)) != CUDA_SUCCESS)
        return tk__err(TK_ERR_NETWORK, "cuda:%d: %s", c->device, cu_str(r));
    nr = nc.AllGather((const void *)(uintptr_t)mine, (void *)(uintptr_t)n->scratch, TK_COMM_HOST_MAX, ncclUint8,
                      n->comm, NULL);
    if ((rc = finish(c, nr, NULL, "gathering host names")) != TK_OK)
        return rc;
    if ((r = cu.MemcpyDtoH(c->hosts, n->scratch, (size_t)c->size * TK_COMM_HOST_MAX)) != CUDA_SUCCESS)
        return tk__err(TK_ERR_NETWORK, "cuda:%d: %s", c->device, cu_str(r));
    c->local_size = 0;
    for (int i = 0; i < c->size; i++) {
        c->hosts[i][TK_COMM_HOST_MAX - 1] = '\0';
        c->local_size += !strcmp(c->hosts[i], me);
    }
    return TK_OK;
}

int tk_comm__nccl_new(tk_comm *c, const tk_comm_opts *o)
{
    tk_comm_nccl *n = NULL;
    ncclUniqueId id;
    nccl_config_v21400 cfg = {
        sizeof cfg, 0xcafebeef, 21400, 0, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NULL};
    int rc, pushed = 0;
    CUresult r;
    ncclResult_t nr;
    char what[96];

    if ((rc = tk_comm__nccl_load(NULL, 0, NULL, 0)) != TK_OK)
        return rc;
    if (!nccl_has_config)
        return tk__err(TK_ERR_UNSUPPORTED,
                       "NCCL %s at %s is older than 2.14: tk needs its non-blocking "
                       "communicators for timeouts\nHINT: install a newer NCCL or point TK_NCCL at one",
                       nccl_version, nccl_path);
    pthread_once(&cu_once, cu_load_once);
    if (cu_status != TK_OK)
        return tk__err(cu_status, "%s", cu_err);
    if ((rc = ranks_and_device(c, o)) != TK_OK)
        return rc;

    n = calloc(1, sizeof *n);
    if (!n)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    c->nccl = n;
    n->dev = -1;
    if ((r = cu.DeviceGet(&n->dev, c->device)) != CUDA_SUCCESS ||
        (r = cu.PrimaryCtxRetain(&n->ctx, n->dev)) != CUDA_SUCCESS) {
        n->ctx = NULL;
        return tk__err(TK_ERR_NO_DEVICE, "cuda:%d: %s", c->device, cu_str(r));
    }
    push(n);
    pushed = 1;
    if ((r = cu.EventCreate(&n->ev, CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS ||
        (r = cu.MemAlloc(&n->scratch, (size_t)c->size * TK_COMM_HOST_MAX)) != CUDA_SUCCESS) {
        rc = tk__err(TK_ERR_NOMEM, "cuda:%d: %s", c->device, cu_str(r));
        goto done;
    }

    /* the unique id */
    if (c->mpi) {
        if (c->rank == 0 && (nr = nc.GetUniqueId(&id)) != ncclSuccess) {
            /* the others wait in the broadcast: break them out by the timeout, and say why here */
            rc = tk__err(TK_ERR_NETWORK, "ncclGetUniqueId: %s", nc.GetErrorString(nr));
            goto done;
        }
        if ((rc = tk_comm__mpi_broadcast(c, &id, sizeof id, 0)) != TK_OK)
            goto done;
    } else if ((rc = id_by_file(c, o->nccl_id_file, &id)) != TK_OK) {
        goto done;
    }

    /* the communicator, non-blocking so its creation honours the deadline */
    snprintf(what, sizeof what, "joining the NCCL communicator (%d ranks, cuda:%d)", c->size, c->device);
    nr = nc.CommInitRankConfig(&n->comm, c->size, id, c->rank, &cfg);
    if (nr != ncclSuccess && nr != ncclInProgress) {
        rc = tk__err(TK_ERR_NETWORK, "%s: %s", what, nc.GetErrorString(nr));
        if (n->comm)
            nc.CommAbort(n->comm);
        n->comm = NULL;
        goto done;
    }
    {
        pollarg p = {c, what, 0};
        if ((rc = tk_comm__wait(c, what, nccl_done, &p)) != TK_OK) {
            nc.CommAbort(n->comm);
            n->comm = NULL;
            goto done;
        }
    }
    if (!c->mpi && c->rank == 0)
        unlink(o->nccl_id_file); /* every rank has read it: they all joined */

    if (!c->mpi && (rc = gather_hosts(c, n)) != TK_OK)
        goto done;
    rc = TK_OK;
done:
    if (pushed)
        pop();
    return rc;
}

void tk_comm__nccl_free(tk_comm *c)
{
    tk_comm_nccl *n = c->nccl;
    if (!n)
        return;
    if (n->ctx)
        push(n);
    if (n->comm) {
        int ok = 0;
        if (!c->broken_code && nc.CommFinalize(n->comm) == ncclSuccess) {
            pollarg p = {c, "closing the NCCL communicator", 0};
            ok = tk_comm__wait(c, p.what, nccl_done, &p) == TK_OK;
        }
        if (ok)
            nc.CommDestroy(n->comm);
        else
            nc.CommAbort(n->comm);
    }
    if (n->ev)
        cu.EventDestroy(n->ev);
    if (n->scratch)
        cu.MemFree(n->scratch);
    if (n->stage)
        cu.MemFree(n->stage);
    if (n->ctx) {
        pop();
        cu.PrimaryCtxRelease(n->dev);
    }
    free(n);
    c->nccl = NULL;
}

static int dtype_of(tk_dtype dt)
{
    if (dt.code == TK_DL_FLOAT)
        return dt.bits == 16 ? ncclFloat16 : dt.bits == 32 ? ncclFloat32 : ncclFloat64;
    if (dt.code == TK_DL_BFLOAT)
        return ncclBfloat16;
    return dt.bits == 32 ? ncclInt32 : ncclInt64;
}

/* The communicator is gone (aborted after a timeout): the broken state already says why. */
#define ALIVE(c)                                                                                                       \
    do {                                                                                                               \
        if (!(c)->nccl || !(c)->nccl->comm)                                                                            \
            return tk__err(TK_ERR_NETWORK, "the NCCL communicator was aborted");                                       \
    } while (0)

int tk_comm__nccl_all_reduce(tk_comm *c, void *buf, size_t count, tk_dtype dt, void *stream)
{
    char what[96];
    int rc;
    ALIVE(c);
    snprintf(what, sizeof what, "all_reduce of %zu %s", count, tk_dtype_name(dt));
    push(c->nccl);
    rc = finish(c, nc.AllReduce(buf, buf, count, dtype_of(dt), ncclSum, c->nccl->comm, (CUstream)stream), stream, what);
    pop();
    return rc;
}

int tk_comm__nccl_all_gather(tk_comm *c, void *out, const void *in, size_t count, tk_dtype dt, void *stream)
{
    char what[96];
    size_t bytes = count * (dt.bits / 8);
    int rc;
    ALIVE(c);
    snprintf(what, sizeof what, "all_gather of %zu bytes a rank", bytes);
    push(c->nccl);
    rc = finish(c, nc.AllGather(in, out, bytes, ncclUint8, c->nccl->comm, (CUstream)stream), stream, what);
    pop();
    return rc;
}

int tk_comm__nccl_broadcast(tk_comm *c, void *buf, size_t count, tk_dtype dt, int root, void *stream)
{
    char what[96];
    size_t bytes = count * (dt.bits / 8);
    int rc;
    ALIVE(c);
    snprintf(what, sizeof what, "broadcast of %zu bytes from rank %d", bytes, root);
    push(c->nccl);
    rc = finish(c, nc.Broadcast(buf, buf, bytes, ncclUint8, root, c->nccl->comm, (CUstream)stream), stream, what);
    pop();
    return rc;
}

int tk_comm__nccl_barrier(tk_comm *c)
{
    int rc;
    ALIVE(c);
    push(c->nccl);
    rc = finish(c,
                nc.AllReduce((void *)(uintptr_t)c->nccl->scratch, (void *)(uintptr_t)c->nccl->scratch, 1, ncclInt32,
                             ncclSum, c->nccl->comm, NULL),
                NULL, "barrier");
    pop();
    return rc;
}

int tk_comm__nccl_stage(tk_comm *c, size_t bytes, void **out)
{
    tk_comm_nccl *n = c->nccl;
    CUresult r = CUDA_SUCCESS;
    *out = NULL;
    ALIVE(c);
    if (bytes > n->stage_bytes) {
        push(n);
        if (n->stage)
            cu.MemFree(n->stage);
        n->stage = 0;
        n->stage_bytes = 0;
        if ((r = cu.MemAlloc(&n->stage, bytes)) == CUDA_SUCCESS)
            n->stage_bytes = bytes;
        pop();
    }
    if (r != CUDA_SUCCESS)
        return tk__err(r == CUDA_ERROR_OUT_OF_MEMORY ? TK_ERR_NOMEM : TK_ERR_LAUNCH,
                       "staging %zu bytes of host memory through cuda:%d for NCCL: %s", bytes, c->device, cu_str(r));
    *out = (void *)(uintptr_t)n->stage;
    return TK_OK;
}

static CUresult copy_on(void *dst, const void *src, size_t bytes, int kind, CUstream s)
{
    switch (kind) {
    case TK_COMM__H2D: return cu.MemcpyHtoDAsync((CUdeviceptr)(uintptr_t)dst, src, bytes, s);
    case TK_COMM__D2H: return cu.MemcpyDtoHAsync(dst, (CUdeviceptr)(uintptr_t)src, bytes, s);
    default: return cu.MemcpyAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, bytes, s);
    }
}

int tk_comm__cuda_copy(void *dst, const void *src, size_t bytes, int kind, int device, void *stream)
{
    static const char *const KIND[] = {"", "to the GPU", "to the host", "on the GPU"};
    CUdevice dev;
    CUcontext ctx = NULL, x;
    CUresult r;
    pthread_once(&cu_once, cu_load_once);
    if (cu_status != TK_OK)
        return tk__err(cu_status, "%s", cu_err);
    if ((r = cu.DeviceGet(&dev, device)) != CUDA_SUCCESS)
        return tk__err(TK_ERR_NO_DEVICE, "no CUDA device %d: %s", device, cu_str(r));
    if ((r = cu.PrimaryCtxRetain(&ctx, dev)) != CUDA_SUCCESS)
        return tk__err(TK_ERR_NO_DEVICE, "the primary context of cuda:%d: %s", device, cu_str(r));
    cu.CtxPushCurrent(ctx);
    /* on the caller's stream, after the work queued there (the legacy default stream for NULL), and
     * waited for: the host buffer is read or written when this returns */
    r = copy_on(dst, src, bytes, kind, (CUstream)stream);
    if (r == CUDA_SUCCESS)
        r = cu.StreamSynchronize((CUstream)stream);
    cu.CtxPopCurrent(&x);
    cu.PrimaryCtxRelease(dev);
    if (r != CUDA_SUCCESS)
        return tk__err(TK_ERR_LAUNCH, "copying %zu bytes %s on cuda:%d: %s", bytes,
                       KIND[kind >= TK_COMM__H2D && kind <= TK_COMM__D2D ? kind : 0], device, cu_str(r));
    return TK_OK;
}

void tk_comm__nccl_abort(tk_comm *c)
{
    tk_comm_nccl *n = c->nccl;
    if (n && n->comm) {
        nc.CommAbort(n->comm);
        n->comm = NULL;
    }
}
