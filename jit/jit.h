/*
 * jit.h — the JIT layer: loading the CUDA driver and NVRTC at run time (dlopen, never linked),
 * device detection, NVRTC compiles of one translation unit for one arch, the content key of a
 * compile, and module load and launch (the launch-rule language is manifest/expr.c).
 *
 * Nothing here includes cuda.h or nvrtc.h, so libtk builds where the toolkit is absent. Errors come
 * back as tk statuses with tk_last_error() set (CUresult and nvrtcResult are translated here).
 * Internal names are tk_jit__<verb>.
 */
#ifndef TK_JIT_H
#define TK_JIT_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

/* ---- CUDA driver and NVRTC (jit/cuda.c) ------------------------------------------------------- */

/* Loads libcuda.so.1 and runs cuInit once per process. TK_ERR_NO_DEVICE (with a hint) when the
 * driver is missing or cannot initialise. Thread-safe; the result is remembered. */
int tk_jit__cuda_load(void);
/* Loads NVRTC once per process (only call it when a compile is needed). TK_ERR_NO_NVRTC. */
int tk_jit__nvrtc_load(void);
/* 1 if NVRTC was loaded in this process (tests check that a warm start does not load it). */
int tk_jit__nvrtc_loaded(void);
/* Names the NVRTC this process uses (or would load) without loading it when the library file can be
 * found by probing: "<real file name>:<size>". This goes into cache keys, so a warm start never loads
 * NVRTC, and a new NVRTC gives new keys. Loads NVRTC only when probing finds nothing. */
int tk_jit__nvrtc_id(const char **id);
/* NVRTC's version (loads it). *path (may be NULL) receives the borrowed path it was loaded from. */
int tk_jit__nvrtc_version(int *major, int *minor, const char **path);
/* The compute capabilities (x10: 80, 90, ...) NVRTC can compile for, ascending. *n receives how many
 * were written (at most max). */
int tk_jit__nvrtc_archs(int *archs, size_t max, size_t *n);
/* The CUDA toolkit include directory used for NVRTC's headers (cuda_fp16.h ...), or NULL. */
const char *tk_jit__cuda_include_dir(void);
/* The device count (TK_OK with 0 when the driver has no device) and one device's description. */
int tk_jit__device_count(int *n);
int tk_jit__device_info(tk_device_info *out, int ordinal);

/* ---- compiles (jit/compile.c) ----------------------------------------------------------------- */

typedef struct {
    const char *path; /* relative path, as the sources #include it */
    const char *data; /* NUL-terminated: data[len] == 0 (NVRTC takes C strings) */
    size_t len;
} tk_jit_file;

/* One translation unit for one target. */
typedef struct {
    const char *src_path;                /* relative path of the .cu: the NVRTC program name */
    const char *src;
    size_t src_len;
    const tk_jit_file *headers;          /* every other file of the package */
    size_t nheaders;
    const char *const *names;            /* name expressions ("ns::k<float>", "extern_c_sym") */
    size_t nnames;
    const char *const *options;          /* manifest compile.options, then the kernel's options */
    size_t noptions;
    int cc;                              /* 80, 90, 100 ... */
    int arch_specific;                   /* 1: sm_XYa */
    int ptx_only;                        /* 1: compute_XY PTX only (the GPU is newer than NVRTC) */
    const tk_jit_file *toolkit;          /* NULL: the built-in <tk/device.cuh> (tests pass another) */
} tk_jit_unit;

/* ---- the device toolkit (jit/toolkit.c; source: jit/device/tk_device.cuh) ---------------------- */

/* The version of <tk/device.cuh> this tk hands to NVRTC; a manifest's "device_toolkit" may not ask
 * for a higher one. */
#define TK_JIT_DEVICE_TOOLKIT_VERSION 1
/* The include name every compile sees the toolkit under. */
#define TK_JIT_DEVICE_TOOLKIT_PATH "tk/device.cuh"
/* The toolkit as a header file: its path, its bytes (static, NUL-terminated) and length. */
tk_jit_file tk_jit__device_toolkit(void);

/* The result of a compile (or of a cache hit). */
typedef struct {
    uint8_t *cubin;  /* NULL when ptx_only */
    size_t cubin_len;
    char *ptx;       /* NUL-terminated, may be NULL */
    size_t ptx_len;  /* without the NUL */
    char **lowered;  /* one mangled name per name expression, in the unit's order */
    size_t nlowered;
    char *log;       /* compile warnings, may be NULL */
} tk_jit_binary;

void tk_jit__binary_free(tk_jit_binary *b);

/* The parameters of the kernel `lowered` (a mangled name) as its .entry in `ptx` declares them: *n
 * their number, sizes[i] (the first `cap`) each one's bytes (a pointer or 64-bit scalar: 8; a struct
 * passed by value: its size). TK_ERR_NOT_FOUND when ptx has no such entry; TK_ERR_INVALID when the
 * header does not parse. Sets no error message (jit/ptxsig.c). */
int tk_jit__ptx_params(const char *ptx, const char *lowered, size_t *sizes, size_t cap, size_t *n);

/* Checks one user option against the options tk lets packages pass (no file output, no include
 * paths, no target override). TK_ERR_MANIFEST naming the option. */
int tk_jit__option_check(const char *opt);

/* The cache key (64 hex) of a unit: sha256 over the key-schema version, the source and every header
 * (path and bytes), the device toolkit's bytes, the sorted name expressions, the normalised options
 * with the target, and the NVRTC version ("13.0"). */
int tk_jit__key(char out[TK_SHA256_HEX], const tk_jit_unit *u, const char *nvrtc_version);
/* The target name of a unit: "sm_90", "sm_90a" or "compute_120". out holds 32 bytes. */
void tk_jit__target(char out[32], const tk_jit_unit *u);

/* Compiles one unit (loads NVRTC). TK_ERR_COMPILE with the log naming src_path:line. */
int tk_jit__compile(tk_jit_binary **out, const tk_jit_unit *u);

/* Compiles n units in parallel on at most `jobs` threads (0: by cores and free memory). outs[i] and
 * status[i] receive each result; errmsg[i] (may be NULL) a malloc'd copy of a failure's message.
 * Returns TK_OK when all succeeded, else the status of the first failing unit (its message set). */
int tk_jit__compile_many(tk_jit_binary **outs, int *status, char **errmsg, const tk_jit_unit *units, size_t n,
                         int jobs);
/* Progress of compile_many_cb, called under its lock (one call at a time, from any worker thread):
 * when unit i starts (started 1) and when it finishes (started 0, with its status and seconds).
 * ndone: units finished so far; nrunning: units started and not finished. */
typedef void (*tk_jit_done_fn)(void *user, size_t i, int started, int status, size_t ndone, size_t nrunning,
                               double seconds);
int tk_jit__compile_many_cb(tk_jit_binary **outs, int *status, char **errmsg, const tk_jit_unit *units, size_t n,
                            int jobs, tk_jit_done_fn done, void *user);
/* How many compiles may run at once: cores, and free memory / 512 MiB, at least 1. */
int tk_jit__default_jobs(void);

/* Serialises a binary into a blob (magic "TKJB", version) for the cache, and back. A malformed blob
 * gives TK_ERR_CACHE. */
int tk_jit__binary_pack(uint8_t **out, size_t *len, const tk_jit_binary *b);
int tk_jit__binary_unpack(tk_jit_binary **out, const uint8_t *p, size_t len);

/* ---- modules and launches (jit/load.c) -------------------------------------------------------- */

typedef struct tk_jit_module tk_jit_module;
typedef struct tk_jit_sandbox tk_jit_sandbox;

/* Loads a CUBIN or PTX image (NUL-terminated for PTX) into the primary context of `device`.
 * TK_ERR_LAUNCH on failure; *stale (may be NULL) is set to 1 when the driver rejected the image as
 * invalid, for another GPU or of a too-new PTX version, so the caller treats the cache entry as a
 * miss and recompiles. TK_ERR_NO_DEVICE without a driver. */
int tk_jit__module_load(tk_jit_module **out, int device, const void *image, int *stale);
/* The same into a self-test sandbox's own context (sb NULL: the primary one). The module must be
 * released before the sandbox is freed; after a reset of the sandbox it is dead (release still frees
 * it) and launches of its functions fail. */
int tk_jit__module_load_in(tk_jit_module **out, int device, tk_jit_sandbox *sb, const void *image, int *stale);
void tk_jit__module_retain(tk_jit_module *m);
/* Drops a reference; the module unloads (and the primary context is released) at zero. */
void tk_jit__module_release(tk_jit_module *m);
/* The CUfunction of a lowered name, cached in the module. Thread-safe. */
int tk_jit__module_function(void **fn, tk_jit_module *m, const char *lowered);
/* The MAX_DYNAMIC_SHARED_SIZE_BYTES a launch must set for a function with static_bytes of static and
 * dynamic_bytes of dynamic shared memory: dynamic_bytes when the sum exceeds the default 48 KiB, else
 * 0 (no opt-in needed). */
size_t tk_jit__smem_optin(size_t static_bytes, size_t dynamic_bytes);
int tk_jit__module_device(const tk_jit_module *m);

/* Launches fn (from m) with the module's context current on this thread. Thread-safe. Raises the
 * function's dynamic shared memory limit when smem needs it. When ws_bytes > 0, *ws (which args
 * must point at) receives a device buffer of ws_bytes allocated on the stream (cuMemAllocAsync, so
 * the pool makes it cheap), zero-filled on the stream before the launch and freed on the stream
 * after it: each launch owns its workspace, so concurrent launches on other streams cannot race. */
int tk_jit__launch(tk_jit_module *m, void *fn, const unsigned grid[3], const unsigned block[3], size_t smem,
                   void *stream, void **args, size_t ws_bytes, uint64_t *ws);

/* ---- device memory (jit/mem.c) ---------------------------------------------------------------- */

enum { TK_JIT_COPY_H2D = 1, TK_JIT_COPY_D2H = 2, TK_JIT_COPY_D2D = 3 };

/* Synchronous driver calls in the device's primary context (pushed and popped around the call).
 * TK_ERR_NO_DEVICE without a driver or device, TK_ERR_NOMEM when the device is out of memory,
 * TK_ERR_LAUNCH for other driver errors (including a fault of an earlier kernel). */
int tk_jit__mem_alloc(uint64_t *out, int device, size_t bytes);
int tk_jit__mem_free(uint64_t p, int device);
int tk_jit__mem_copy(void *dst, const void *src, size_t bytes, int kind, int device);
int tk_jit__mem_set(uint64_t p, int value, size_t bytes, int device);
int tk_jit__sync(int device);
/* Makes the device's primary context current on this thread (retained once per process) for driver
 * or CUDA-library calls; tk_jit__ctx_pop restores the caller's. TK_ERR_NO_DEVICE, TK_ERR_INVALID for
 * a device that does not exist, TK_ERR_LAUNCH. */
int tk_jit__ctx_push(int device);
/* The primary context of device (a CUcontext), retained on first use and held for the life of the
 * process, so it is never destroyed and created again between loads. Sets *ctx; no push. */
int tk_jit__primary_ctx(void **ctx, int device);
void tk_jit__ctx_pop(void);
/* Stream-ordered device-to-device copy. */
int tk_jit__mem_copy_async(uint64_t dst, uint64_t src, size_t bytes, int device, void *stream);

/* A pair of CUDA events for timing work on a stream: start records the first, stop records the second,
 * waits for it and gives the milliseconds between them. */
typedef struct tk_jit_timer tk_jit_timer;
int tk_jit__timer_new(tk_jit_timer **out, int device);
int tk_jit__timer_start(tk_jit_timer *t, void *stream);
int tk_jit__timer_stop(tk_jit_timer *t, void *stream, float *ms);
void tk_jit__timer_free(tk_jit_timer *t);

/* ---- self-test sandboxes (jit/sandbox.c) ------------------------------------------------------ */

/* A CUDA context of its own (cuCtxCreate, never the primary one the caller's tensors and tk_op_run's
 * kernels live in) with one stream, where a kernel under test runs apart from the caller's memory and
 * modules. It cannot contain a fault: a kernel's sticky error ends CUDA for the whole process (see
 * sandbox.c), and a launch that does not end keeps running until the process exits. Either marks the
 * process lost (tk_jit__cuda_lost). Not thread-safe: one thread uses a sandbox. */
/* NULL while CUDA is usable in this process; else why not (a sandbox's kernel faulted: a sticky error
 * ends CUDA for the whole process; or a launch did not end: its context is abandoned, never destroyed).
 * Once set it stays set; tk_jit__sandbox_new and _reset then fail with TK_ERR_LAUNCH. Any thread. */
const char *tk_jit__cuda_lost(void);
int tk_jit__sandbox_new(tk_jit_sandbox **out, int device);
/* Destroys the context (an abandoned one is left to the process's exit). Release the modules loaded in
 * it first. Accepts NULL. */
void tk_jit__sandbox_free(tk_jit_sandbox *sb);
/* Destroys the context and makes a new one; TK_ERR_LAUNCH once the process is lost. */
int tk_jit__sandbox_reset(tk_jit_sandbox *sb);
/* The stream to launch on (a CUstream of the sandbox's context). */
void *tk_jit__sandbox_stream(const tk_jit_sandbox *sb);
int tk_jit__sandbox_device(const tk_jit_sandbox *sb);
/* Device memory in the sandbox's context; copies are synchronous. TK_ERR_NOMEM, TK_ERR_LAUNCH (a
 * fault of the kernel launched before: the sandbox needs a reset). */
int tk_jit__sandbox_alloc(uint64_t *out, tk_jit_sandbox *sb, size_t bytes);
void tk_jit__sandbox_mfree(tk_jit_sandbox *sb, uint64_t p);
int tk_jit__sandbox_copy(tk_jit_sandbox *sb, void *dst, const void *src, size_t bytes, int kind);
int tk_jit__sandbox_memset(tk_jit_sandbox *sb, uint64_t p, int value, size_t bytes);
/* Waits for the sandbox's stream for at most timeout_s seconds, polling (cuStreamQuery): the Driver
 * API cannot stop one kernel, so this bounds the wait, and the caller resets the sandbox to stop it.
 * TK_OK when the work finished; TK_ERR_LAUNCH with the CUDA error when it faulted (*fault = 1) or
 * did not finish in time (*timed_out = 1). */
int tk_jit__sandbox_wait(tk_jit_sandbox *sb, double timeout_s, int *fault, int *timed_out);

/* The device's identity for self-test records: uuid "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (as
 * nvidia-smi prints it) and driver "<kernel module version>/<CUDA driver API version>", e.g.
 * "570.86.15/12080" (the module's from /proc/driver/nvidia/version; "unknown" where it cannot be read).
 * TK_ERR_NO_DEVICE without a driver or device. */
int tk_jit__device_ident(char *uuid, size_t nuuid, char *driver, size_t ndriver, int ordinal);

#endif
