/*
 * cuda_api.h — private to jit/: the few CUDA driver and NVRTC types, constants and entry points tk
 * uses, declared here (values from cuda.h and nvrtc.h of CUDA 13) so tk builds without the toolkit.
 * The function tables are filled by jit/cuda.c with dlsym.
 */
#ifndef TK_JIT_CUDA_API_H
#define TK_JIT_CUDA_API_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef uint64_t CUdeviceptr;
typedef struct CUevent_st *CUevent;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_STUB_LIBRARY = 34,
    CUDA_ERROR_INSUFFICIENT_DRIVER = 35,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_NO_BINARY_FOR_GPU = 209,
    CUDA_ERROR_INVALID_PTX = 218,
    CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_LAUNCH_TIMEOUT = 702,
    CUDA_ERROR_ASSERT = 710,
    CUDA_ERROR_HARDWARE_STACK_ERROR = 714,
    CUDA_ERROR_ILLEGAL_INSTRUCTION = 715,
    CUDA_ERROR_MISALIGNED_ADDRESS = 716,
    CUDA_ERROR_INVALID_ADDRESS_SPACE = 717,
    CUDA_ERROR_INVALID_PC = 718,
    CUDA_ERROR_LAUNCH_FAILED = 719,
};

enum {
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
};

enum { CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8 };

typedef struct {
    CUresult (*cuInit)(unsigned);
    CUresult (*cuDriverGetVersion)(int *);
    CUresult (*cuDeviceGetCount)(int *);
    CUresult (*cuDeviceGet)(CUdevice *, int);
    CUresult (*cuDeviceGetAttribute)(int *, int, CUdevice);
    CUresult (*cuDeviceGetName)(char *, int, CUdevice);
    CUresult (*cuDeviceTotalMem)(size_t *, CUdevice);             /* _v2 */
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);              /* _v2 */
    CUresult (*cuCtxPushCurrent)(CUcontext);                      /* _v2 */
    CUresult (*cuCtxPopCurrent)(CUcontext *);                     /* _v2 */
    CUresult (*cuModuleLoadData)(CUmodule *, const void *);
    CUresult (*cuModuleUnload)(CUmodule);
    CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*cuFuncSetAttribute)(CUfunction, int, int);
    CUresult (*cuFuncGetAttribute)(int *, int, CUfunction);
    CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                               CUstream, void **, void **);
    CUresult (*cuGetErrorName)(CUresult, const char **);
    CUresult (*cuGetErrorString)(CUresult, const char **);
    /* memory: device buffers for tk_device_* and launch workspaces */
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);                               /* _v2 */
    CUresult (*cuMemFree)(CUdeviceptr);                                          /* _v2 */
    CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);                 /* _v2 */
    CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t);                       /* _v2 */
    CUresult (*cuMemcpyDtoD)(CUdeviceptr, CUdeviceptr, size_t);                  /* _v2 */
    CUresult (*cuMemsetD8)(CUdeviceptr, unsigned char, size_t);                  /* _v2 */
    CUresult (*cuMemAllocAsync)(CUdeviceptr *, size_t, CUstream);
    CUresult (*cuMemFreeAsync)(CUdeviceptr, CUstream);
    CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
    CUresult (*cuMemsetD16Async)(CUdeviceptr, unsigned short, size_t, CUstream);
    CUresult (*cuMemsetD32Async)(CUdeviceptr, unsigned int, size_t, CUstream);
    CUresult (*cuCtxSynchronize)(void);
    /* timing (autotune) */
    CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);   /* _v2 */
    CUresult (*cuEventCreate)(CUevent *, unsigned);
    CUresult (*cuEventRecord)(CUevent, CUstream);
    CUresult (*cuEventSynchronize)(CUevent);
    CUresult (*cuEventElapsedTime)(float *, CUevent, CUevent);                   /* _v2, else the old one */
    CUresult (*cuEventDestroy)(CUevent);                                         /* _v2 */
    /* self-test sandboxes (jit/sandbox.c): a context of their own, a stream to poll, the GPU's UUID */
    CUresult (*cuCtxCreate)(CUcontext *, unsigned, CUdevice);                    /* _v2 */
    CUresult (*cuCtxDestroy)(CUcontext);                                         /* _v2 */
    CUresult (*cuStreamCreate)(CUstream *, unsigned);
    CUresult (*cuStreamQuery)(CUstream);
    CUresult (*cuStreamDestroy)(CUstream);                                       /* _v2 */
    CUresult (*cuDeviceGetUuid)(void *, CUdevice);   /* _v2, else the first; NULL when neither (old driver) */
} tk_cu_api;

typedef int nvrtcResult;
typedef struct _nvrtcProgram *nvrtcProgram;
enum { NVRTC_SUCCESS = 0, NVRTC_ERROR_COMPILATION = 6 };

typedef struct {
    nvrtcResult (*nvrtcVersion)(int *, int *);
    nvrtcResult (*nvrtcGetNumSupportedArchs)(int *);
    nvrtcResult (*nvrtcGetSupportedArchs)(int *);
    const char *(*nvrtcGetErrorString)(nvrtcResult);
    nvrtcResult (*nvrtcCreateProgram)(nvrtcProgram *, const char *, const char *, int, const char *const *,
                                      const char *const *);
    nvrtcResult (*nvrtcDestroyProgram)(nvrtcProgram *);
    nvrtcResult (*nvrtcCompileProgram)(nvrtcProgram, int, const char *const *);
    nvrtcResult (*nvrtcGetPTXSize)(nvrtcProgram, size_t *);
    nvrtcResult (*nvrtcGetPTX)(nvrtcProgram, char *);
    nvrtcResult (*nvrtcGetCUBINSize)(nvrtcProgram, size_t *);
    nvrtcResult (*nvrtcGetCUBIN)(nvrtcProgram, char *);
    nvrtcResult (*nvrtcGetProgramLogSize)(nvrtcProgram, size_t *);
    nvrtcResult (*nvrtcGetProgramLog)(nvrtcProgram, char *);
    nvrtcResult (*nvrtcAddNameExpression)(nvrtcProgram, const char *);
    nvrtcResult (*nvrtcGetLoweredName)(nvrtcProgram, const char *, const char **);
} tk_nvrtc_api;

/* For jit/load.c: a sandbox's current context (NULL after a failed reset) and its generation (bumped by
 * each reset, which destroys the modules loaded in the old context). */
struct tk_jit_sandbox;
CUcontext tk_jit__sandbox_ctx(const struct tk_jit_sandbox *sb);
unsigned tk_jit__sandbox_gen(const struct tk_jit_sandbox *sb);

/* The loaded tables (valid after a successful tk_jit__cuda_load / tk_jit__nvrtc_load). */
const tk_cu_api *tk_jit__cu(void);
const tk_nvrtc_api *tk_jit__nvrtc(void);
/* "CUDA_ERROR_NO_BINARY_FOR_GPU: no kernel image is available ..." into buf. */
const char *tk_jit__cu_errstr(CUresult r, char *buf, size_t n);

#endif
