/*
 * cuda.c — finds and loads the CUDA driver (libcuda.so.1) and NVRTC with dlopen, once per process.
 *
 * Neither is linked: libtk runs (installs, verifies, runs CPU references) on machines without them,
 * and a warm start never loads NVRTC. Each library is loaded under its own pthread_once; the outcome
 * (the function table, or the error text) is kept for the life of the process, since unloading the
 * CUDA driver is not safe. Also answers device detection for tk_device_count / tk_device_info_get.
 */
#define _GNU_SOURCE /* dladdr */
#include <dirent.h>
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "jit/cuda_api.h"
#include "jit/jit.h"

#define ERRTXT 1024

/* ---- the driver ------------------------------------------------------------------------------- */

static pthread_once_t cu_once = PTHREAD_ONCE_INIT;
static tk_cu_api cu;
static int cu_status = TK_ERR_INTERNAL; /* TK_OK, or TK_ERR_NO_DEVICE with cu_err */
static int cu_no_device;                /* cuInit said CUDA_ERROR_NO_DEVICE: loaded, zero GPUs */
static char cu_err[ERRTXT];

const tk_cu_api *tk_jit__cu(void) { return &cu; }

const char *tk_jit__cu_errstr(CUresult r, char *buf, size_t n)
{
    const char *name = NULL, *str = NULL;
    if (cu.cuGetErrorName)
        cu.cuGetErrorName(r, &name);
    if (cu.cuGetErrorString)
        cu.cuGetErrorString(r, &str);
    snprintf(buf, n, "%s (%d)%s%s", name ? name : "CUresult", (int)r, str ? ": " : "", str ? str : "");
    return buf;
}

#define CU_SYM(field, sym)                                                                                             \
    do {                                                                                                               \
        *(void **)&cu.field = dlsym(h, sym);                                                                           \
        if (!cu.field) {                                                                                               \
            missing = sym;                                                                                             \
            goto fail;                                                                                                 \
        }                                                                                                              \
    } while (0)

static void cu_init_once(void)
{
    const char *lib = getenv("TK_LIBCUDA");
    const char *missing = NULL;
    char ebuf[256];
    void *h;
    CUresult r;

    if (!lib || !*lib)
        lib = "libcuda.so.1";
    h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *de = dlerror();
        snprintf(cu_err, sizeof cu_err,
                 "no CUDA driver (%s could not be loaded: %s)\n"
                 "HINT: install the NVIDIA driver, or run on a machine with an NVIDIA GPU. Without one, "
                 "tk still installs packages and compiles them ahead of time: 'tk build ORG/NAME --arch sm_90'",
                 lib, de ? de : "not found");
        cu_status = TK_ERR_NO_DEVICE;
        return;
    }
    CU_SYM(cuInit, "cuInit");
    CU_SYM(cuDriverGetVersion, "cuDriverGetVersion");
    CU_SYM(cuDeviceGetCount, "cuDeviceGetCount");
    CU_SYM(cuDeviceGet, "cuDeviceGet");
    CU_SYM(cuDeviceGetAttribute, "cuDeviceGetAttribute");
    CU_SYM(cuDeviceGetName, "cuDeviceGetName");
    CU_SYM(cuDeviceTotalMem, "cuDeviceTotalMem_v2");
    CU_SYM(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    CU_SYM(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
    CU_SYM(cuCtxPushCurrent, "cuCtxPushCurrent_v2");
    CU_SYM(cuCtxPopCurrent, "cuCtxPopCurrent_v2");
    CU_SYM(cuModuleLoadData, "cuModuleLoadData");
    CU_SYM(cuModuleUnload, "cuModuleUnload");
    CU_SYM(cuModuleGetFunction, "cuModuleGetFunction");
    CU_SYM(cuFuncSetAttribute, "cuFuncSetAttribute");
    CU_SYM(cuFuncGetAttribute, "cuFuncGetAttribute");
    CU_SYM(cuLaunchKernel, "cuLaunchKernel");
    CU_SYM(cuGetErrorName, "cuGetErrorName");
    CU_SYM(cuGetErrorString, "cuGetErrorString");
    CU_SYM(cuMemAlloc, "cuMemAlloc_v2");
    CU_SYM(cuMemFree, "cuMemFree_v2");
    CU_SYM(cuMemcpyHtoD, "cuMemcpyHtoD_v2");
    CU_SYM(cuMemcpyDtoH, "cuMemcpyDtoH_v2");
    CU_SYM(cuMemcpyDtoD, "cuMemcpyDtoD_v2");
    CU_SYM(cuMemsetD8, "cuMemsetD8_v2");
    CU_SYM(cuMemAllocAsync, "cuMemAllocAsync");
    CU_SYM(cuMemFreeAsync, "cuMemFreeAsync");
    CU_SYM(cuMemsetD8Async, "cuMemsetD8Async");
    CU_SYM(cuMemsetD16Async, "cuMemsetD16Async");
    CU_SYM(cuMemsetD32Async, "cuMemsetD32Async");
    CU_SYM(cuCtxSynchronize, "cuCtxSynchronize");
    CU_SYM(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2");
    CU_SYM(cuEventCreate, "cuEventCreate");
    CU_SYM(cuEventRecord, "cuEventRecord");
    CU_SYM(cuEventSynchronize, "cuEventSynchronize");
    CU_SYM(cuEventDestroy, "cuEventDestroy_v2");
    /* the self-test sandbox's (jit/sandbox.c): optional, so a driver without one still runs kernels */
    *(void **)&cu.cuCtxCreate = dlsym(h, "cuCtxCreate_v2");
    *(void **)&cu.cuCtxDestroy = dlsym(h, "cuCtxDestroy_v2");
    *(void **)&cu.cuStreamCreate = dlsym(h, "cuStreamCreate");
    *(void **)&cu.cuStreamQuery = dlsym(h, "cuStreamQuery");
    *(void **)&cu.cuStreamDestroy = dlsym(h, "cuStreamDestroy_v2");
    if (!(*(void **)&cu.cuDeviceGetUuid = dlsym(h, "cuDeviceGetUuid_v2")))
        *(void **)&cu.cuDeviceGetUuid = dlsym(h, "cuDeviceGetUuid");
    /* drivers before 12.8 have only the first version, with the same signature */
    if (!(*(void **)&cu.cuEventElapsedTime = dlsym(h, "cuEventElapsedTime_v2")))
        CU_SYM(cuEventElapsedTime, "cuEventElapsedTime");

    r = cu.cuInit(0);
    if (r == CUDA_ERROR_NO_DEVICE) {
        cu_no_device = 1;
        cu_status = TK_OK;
        return;
    }
    if (r != CUDA_SUCCESS) {
        const char *hint = r == CUDA_ERROR_STUB_LIBRARY
                               ? "HINT: this libcuda is the toolkit's stub, not a driver: install the NVIDIA driver "
                                 "or take the stubs directory out of LD_LIBRARY_PATH"
                           : r == CUDA_ERROR_INSUFFICIENT_DRIVER
                               ? "HINT: the NVIDIA driver is older than this CUDA needs: update the driver"
                               : "HINT: check 'nvidia-smi'; the driver may not be loaded or the device may be busy "
                                 "or hidden (CUDA_VISIBLE_DEVICES)";
        snprintf(cu_err, sizeof cu_err, "the CUDA driver (%s) failed to initialise: cuInit: %s\n%s", lib,
                 tk_jit__cu_errstr(r, ebuf, sizeof ebuf), hint);
        cu_status = TK_ERR_NO_DEVICE;
        return;
    }
    cu_status = TK_OK;
    return;
fail:
    snprintf(cu_err, sizeof cu_err,
             "the CUDA driver %s lacks %s\nHINT: update the NVIDIA driver (tk needs CUDA 11.4 or newer)", lib, missing);
    memset(&cu, 0, sizeof cu);
    cu_status = TK_ERR_NO_DEVICE;
    /* the handle stays open: the process keeps what it loaded, as after success */
}

int tk_jit__cuda_load(void)
{
    pthread_once(&cu_once, cu_init_once);
    if (cu_status != TK_OK)
        return tk__err(cu_status, "%s", cu_err);
    return TK_OK;
}

int tk_jit__device_count(int *n)
{
    int rc, c = 0;
    CUresult r;
    if (!n)
        return tk__err(TK_ERR_INVALID, "tk_device_count: n is NULL");
    *n = 0;
    rc = tk_jit__cuda_load();
    if (rc != TK_OK)
        return rc;
    if (cu_no_device)
        return TK_OK;
    r = cu.cuDeviceGetCount(&c);
    if (r != CUDA_SUCCESS) {
        char eb[256];
        return tk__err(TK_ERR_NO_DEVICE, "cuDeviceGetCount: %s", tk_jit__cu_errstr(r, eb, sizeof eb));
    }
    *n = c;
    return TK_OK;
}

int tk_jit__device_info(tk_device_info *out, int ordinal)
{
    int n = 0, rc, v = 0;
    CUdevice dev;
    size_t mem = 0;
    char eb[256];
    CUresult r;

    if (!out)
        return tk__err(TK_ERR_INVALID, "tk_device_info_get: out is NULL");
    memset(out, 0, sizeof *out);
    rc = tk_jit__device_count(&n);
    if (rc != TK_OK)
        return rc;
    if (ordinal < 0 || ordinal >= n)
        return tk__err(n ? TK_ERR_INVALID : TK_ERR_NO_DEVICE, "no CUDA device %d (this machine has %d)%s", ordinal, n,
                       n ? "" : "\nHINT: without a GPU, compile ahead of time with 'tk build --arch sm_90'");
    if ((r = cu.cuDeviceGet(&dev, ordinal)) != CUDA_SUCCESS ||
        (r = cu.cuDeviceGetName(out->name, (int)sizeof out->name, dev)) != CUDA_SUCCESS ||
        (r = cu.cuDeviceGetAttribute(&out->cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)) !=
            CUDA_SUCCESS ||
        (r = cu.cuDeviceGetAttribute(&out->cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)) !=
            CUDA_SUCCESS ||
        (r = cu.cuDeviceGetAttribute(&out->sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)) != CUDA_SUCCESS ||
        (r = cu.cuDeviceTotalMem(&mem, dev)) != CUDA_SUCCESS || (r = cu.cuDriverGetVersion(&v)) != CUDA_SUCCESS) {
        memset(out, 0, sizeof *out);
        return tk__err(TK_ERR_NO_DEVICE, "querying CUDA device %d: %s", ordinal, tk_jit__cu_errstr(r, eb, sizeof eb));
    }
    out->name[sizeof out->name - 1] = '\0';
    out->ordinal = ordinal;
    out->total_mem = (int64_t)mem;
    out->driver_version = v;
    return TK_OK;
}

/* ---- NVRTC ------------------------------------------------------------------------------------ */

static pthread_once_t nv_once = PTHREAD_ONCE_INIT;
static tk_nvrtc_api nv;
static int nv_status = TK_ERR_INTERNAL;
static int nv_loaded;
static char nv_err[ERRTXT];
static char nv_path[PATH_MAX];
static char nv_inc[PATH_MAX];
static int nv_major, nv_minor;
static int nv_archs[64];
static size_t nv_narchs;

const tk_nvrtc_api *tk_jit__nvrtc(void) { return &nv; }

static int is_file(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* The include directory beside a lib directory: <root>/include for <root>/lib64/x.so. */
static int include_beside(char *out, size_t n, const char *libpath)
{
    char buf[PATH_MAX], *slash;
    char probe[PATH_MAX + 32];
    if (!libpath || snprintf(buf, sizeof buf, "%s", libpath) >= (int)sizeof buf)
        return -1;
    for (int up = 0; up < 2; up++) { /* drop the file name, then lib64 (or lib, or stubs/..) */
        slash = strrchr(buf, '/');
        if (!slash)
            return -1;
        *slash = '\0';
    }
    snprintf(probe, sizeof probe, "%s/include/cuda_fp16.h", buf);
    if (!is_file(probe)) {
        /* targets/x86_64-linux/lib layouts keep include beside lib */
        return -1;
    }
    if (snprintf(out, n, "%s/include", buf) >= (int)n)
        return -1;
    return 0;
}

static void find_include(void)
{
    const char *envs[] = {"TK_CUDA_INCLUDE", "CUDA_HOME", "CUDA_PATH"};
    char probe[PATH_MAX + 32];
    for (size_t i = 0; i < sizeof envs / sizeof envs[0]; i++) {
        const char *e = getenv(envs[i]);
        if (!e || !*e)
            continue;
        if (i == 0) {
            snprintf(probe, sizeof probe, "%s/cuda_fp16.h", e);
            if (is_file(probe) && snprintf(nv_inc, sizeof nv_inc, "%s", e) < (int)sizeof nv_inc)
                return;
        } else {
            snprintf(probe, sizeof probe, "%s/include/cuda_fp16.h", e);
            if (is_file(probe) && snprintf(nv_inc, sizeof nv_inc, "%s/include", e) < (int)sizeof nv_inc)
                return;
        }
    }
    if (include_beside(nv_inc, sizeof nv_inc, nv_path) == 0)
        return;
    if (is_file("/usr/local/cuda/include/cuda_fp16.h")) {
        snprintf(nv_inc, sizeof nv_inc, "/usr/local/cuda/include");
        return;
    }
    nv_inc[0] = '\0';
}

/* Finds the NVRTC library file dlopen would take, by stat only (no loading): $TK_NVRTC, the toolkit
 * named by CUDA_HOME / CUDA_PATH, LD_LIBRARY_PATH, the ld.so.conf directories, then the usual places.
 * Lets a warm start name the NVRTC in its cache keys without loading it. */
static int probe_dir(char *out, size_t n, const char *dir, const char *name)
{
    char p[PATH_MAX];
    if (!dir || !*dir || snprintf(p, sizeof p, "%s/%s", dir, name) >= (int)sizeof p || !is_file(p))
        return -1;
    return snprintf(out, n, "%s", p) < (int)n ? 0 : -1;
}

static int probe_conf(char *out, size_t n, const char *conf, const char *name)
{
    FILE *f = fopen(conf, "r");
    char line[PATH_MAX];
    int found = -1;
    if (!f)
        return -1;
    while (found != 0 && fgets(line, sizeof line, f)) {
        size_t l = strcspn(line, "#\r\n");
        line[l] = '\0';
        while (l && (line[l - 1] == ' ' || line[l - 1] == '\t'))
            line[--l] = '\0';
        if (line[0] == '/')
            found = probe_dir(out, n, line, name);
    }
    fclose(f);
    return found;
}

static int probe_nvrtc(char *out, size_t n)
{
    static const char *const names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
    static const char *const fixed[] = {"/usr/local/cuda/lib64",
                                        "/usr/local/cuda/lib",
                                        "/usr/lib/x86_64-linux-gnu",
                                        "/usr/lib/aarch64-linux-gnu",
                                        "/usr/lib64",
                                        "/lib64",
                                        "/usr/lib"};
    const char *env = getenv("TK_NVRTC");
    char dir[PATH_MAX];
    if (env && *env)
        return is_file(env) && snprintf(out, n, "%s", env) < (int)n ? 0 : -1;
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        const char *homes[] = {getenv("CUDA_HOME"), getenv("CUDA_PATH")};
        const char *ld = getenv("LD_LIBRARY_PATH");
        for (size_t h = 0; h < 2; h++) {
            if (!homes[h] || !*homes[h])
                continue;
            snprintf(dir, sizeof dir, "%s/lib64", homes[h]);
            if (probe_dir(out, n, dir, names[k]) == 0)
                return 0;
            snprintf(dir, sizeof dir, "%s/lib", homes[h]);
            if (probe_dir(out, n, dir, names[k]) == 0)
                return 0;
        }
        while (ld && *ld) {
            size_t l = strcspn(ld, ":");
            if (l && l < sizeof dir) {
                memcpy(dir, ld, l);
                dir[l] = '\0';
                if (probe_dir(out, n, dir, names[k]) == 0)
                    return 0;
            }
            ld += l + (ld[l] == ':');
        }
        if (probe_conf(out, n, "/etc/ld.so.conf", names[k]) == 0)
            return 0;
        {
            DIR *d = opendir("/etc/ld.so.conf.d");
            struct dirent *de;
            int found = -1;
            char conf[PATH_MAX];
            while (d && found != 0 && (de = readdir(d))) {
                if (de->d_name[0] == '.' || !tk__has_suffix(de->d_name, ".conf"))
                    continue;
                snprintf(conf, sizeof conf, "/etc/ld.so.conf.d/%.200s", de->d_name);
                found = probe_conf(out, n, conf, names[k]);
            }
            if (d)
                closedir(d);
            if (found == 0)
                return 0;
        }
        for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++)
            if (probe_dir(out, n, fixed[i], names[k]) == 0)
                return 0;
    }
    return -1;
}

/* "<file name of the real library>:<size>", e.g. "libnvrtc.so.13:109338064". */
static int file_id(char *out, size_t n, const char *path)
{
    char real[PATH_MAX];
    struct stat st;
    const char *base;
    if (!realpath(path, real) || stat(real, &st) != 0)
        return -1;
    base = strrchr(real, '/');
    base = base ? base + 1 : real;
    return snprintf(out, n, "%s:%lld", base, (long long)st.st_size) < (int)n ? 0 : -1;
}

static pthread_once_t id_once = PTHREAD_ONCE_INIT;
static char nv_probe_path[PATH_MAX];
static char nv_id[PATH_MAX + 32];

static void id_init_once(void)
{
    if (probe_nvrtc(nv_probe_path, sizeof nv_probe_path) != 0)
        nv_probe_path[0] = '\0';
    else if (file_id(nv_id, sizeof nv_id, nv_probe_path) != 0)
        nv_id[0] = '\0';
}

int tk_jit__nvrtc_id(const char **id)
{
    int rc;
    *id = NULL;
    pthread_once(&id_once, id_init_once);
    if (nv_id[0]) {
        *id = nv_id;
        return TK_OK;
    }
    /* not found by probing: ask the dynamic loader (this loads NVRTC) */
    if ((rc = tk_jit__nvrtc_load()) != TK_OK)
        return rc;
    *id = nv_id;
    return TK_OK;
}

#define NV_SYM(field, sym)                                                                                             \
    do {                                                                                                               \
        *(void **)&nv.field = dlsym(h, sym);                                                                           \
        if (!nv.field) {                                                                                               \
            missing = sym;                                                                                             \
            goto fail;                                                                                                 \
        }                                                                                                              \
    } while (0)

static void nv_init_once(void)
{
    char cands[16][PATH_MAX];
    size_t nc = 0;
    const char *names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
    const char *dirs[3] = {NULL, NULL, "/usr/local/cuda"};
    const char *env = getenv("TK_NVRTC");
    const char *missing = NULL;
    char tried[ERRTXT] = "";
    size_t tl = 0;
    void *h = NULL;
    Dl_info info;
    int n = 0;

    dirs[0] = getenv("CUDA_HOME");
    dirs[1] = getenv("CUDA_PATH");
    pthread_once(&id_once, id_init_once);
    if (nv_probe_path[0]) /* the very file the cache keys name */
        snprintf(cands[nc++], PATH_MAX, "%s", nv_probe_path);
    else if (env && *env)
        snprintf(cands[nc++], PATH_MAX, "%s", env);
    for (size_t i = 0; i < 3; i++)
        snprintf(cands[nc++], PATH_MAX, "%s", names[i]);
    for (size_t d = 0; d < 3; d++) {
        if (!dirs[d] || !*dirs[d])
            continue;
        for (size_t i = 0; i < 3 && nc < 16; i++)
            snprintf(cands[nc++], PATH_MAX, "%s/lib64/%s", dirs[d], names[i]);
    }
    for (size_t i = 0; i < nc && !h; i++) {
        h = dlopen(cands[i], RTLD_NOW | RTLD_LOCAL);
        if (!h && tl < sizeof tried - 1)
            tl += (size_t)snprintf(tried + tl, sizeof tried - tl, "%s%s", tl ? ", " : "", cands[i]);
        if (tl >= sizeof tried)
            tl = sizeof tried - 1;
    }
    if (!h) {
        snprintf(nv_err, sizeof nv_err,
                 "NVRTC could not be loaded (tried %.700s)\n"
                 "HINT: install the CUDA toolkit's NVRTC (apt install cuda-nvrtc-13-0, or pip install "
                 "nvidia-cuda-nvrtc), or set TK_NVRTC=/path/to/libnvrtc.so or CUDA_HOME",
                 tried);
        nv_status = TK_ERR_NO_NVRTC;
        return;
    }
    NV_SYM(nvrtcVersion, "nvrtcVersion");
    NV_SYM(nvrtcGetNumSupportedArchs, "nvrtcGetNumSupportedArchs");
    NV_SYM(nvrtcGetSupportedArchs, "nvrtcGetSupportedArchs");
    NV_SYM(nvrtcGetErrorString, "nvrtcGetErrorString");
    NV_SYM(nvrtcCreateProgram, "nvrtcCreateProgram");
    NV_SYM(nvrtcDestroyProgram, "nvrtcDestroyProgram");
    NV_SYM(nvrtcCompileProgram, "nvrtcCompileProgram");
    NV_SYM(nvrtcGetPTXSize, "nvrtcGetPTXSize");
    NV_SYM(nvrtcGetPTX, "nvrtcGetPTX");
    NV_SYM(nvrtcGetCUBINSize, "nvrtcGetCUBINSize");
    NV_SYM(nvrtcGetCUBIN, "nvrtcGetCUBIN");
    NV_SYM(nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize");
    NV_SYM(nvrtcGetProgramLog, "nvrtcGetProgramLog");
    NV_SYM(nvrtcAddNameExpression, "nvrtcAddNameExpression");
    NV_SYM(nvrtcGetLoweredName, "nvrtcGetLoweredName");

    if (dladdr(*(void **)&nv.nvrtcVersion, &info) && info.dli_fname)
        snprintf(nv_path, sizeof nv_path, "%s", info.dli_fname);
    if (realpath(nv_path, cands[0]))
        snprintf(nv_path, sizeof nv_path, "%s", cands[0]);
    if (!nv_id[0] && file_id(nv_id, sizeof nv_id, nv_path) != 0)
        snprintf(nv_id, sizeof nv_id, "%.900s", nv_path);
    if (nv.nvrtcVersion(&nv_major, &nv_minor) != NVRTC_SUCCESS) {
        snprintf(nv_err, sizeof nv_err, "NVRTC (%.900s): nvrtcVersion failed", nv_path);
        nv_status = TK_ERR_NO_NVRTC;
        return;
    }
    if (nv.nvrtcGetNumSupportedArchs(&n) == NVRTC_SUCCESS && n > 0 && n <= 64 &&
        nv.nvrtcGetSupportedArchs(nv_archs) == NVRTC_SUCCESS)
        nv_narchs = (size_t)n;
    find_include();
    nv_loaded = 1;
    nv_status = TK_OK;
    return;
fail:
    snprintf(nv_err, sizeof nv_err,
             "NVRTC library lacks %s (too old?)\nHINT: install NVRTC 12 or newer, or set TK_NVRTC", missing);
    memset(&nv, 0, sizeof nv);
    nv_status = TK_ERR_NO_NVRTC;
}

int tk_jit__nvrtc_load(void)
{
    pthread_once(&nv_once, nv_init_once);
    if (nv_status != TK_OK)
        return tk__err(nv_status, "%s", nv_err);
    return TK_OK;
}

int tk_jit__nvrtc_loaded(void) { return nv_loaded; }

int tk_jit__nvrtc_version(int *major, int *minor, const char **path)
{
    int rc = tk_jit__nvrtc_load();
    if (rc != TK_OK)
        return rc;
    if (major)
        *major = nv_major;
    if (minor)
        *minor = nv_minor;
    if (path)
        *path = nv_path;
    return TK_OK;
}

int tk_jit__nvrtc_archs(int *archs, size_t max, size_t *n)
{
    int rc = tk_jit__nvrtc_load();
    size_t k;
    if (n)
        *n = 0;
    if (rc != TK_OK)
        return rc;
    k = nv_narchs < max ? nv_narchs : max;
    if (archs && k)
        memcpy(archs, nv_archs, k * sizeof *archs);
    if (n)
        *n = k;
    return TK_OK;
}

const char *tk_jit__cuda_include_dir(void)
{
    if (tk_jit__nvrtc_load() != TK_OK)
        return NULL;
    return nv_inc[0] ? nv_inc : NULL;
}
