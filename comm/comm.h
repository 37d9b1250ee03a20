/*
 * comm.h — the communicator's internals (comm/): the tk_comm struct that comm.c (options, validation,
 * the self backend, the deadline) shares with the backends mpi.c (linked when the build found MPI)
 * and nccl.c (libnccl.so.2 and the few CUDA driver calls it needs, loaded with dlopen).
 *
 * comm/ uses only common/ (ARCHITECTURE.md). Internal names are tk_comm__*.
 */
#ifndef TK_COMM_H
#define TK_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

#define TK_COMM_MAGIC 0x746b636du /* "tkcm" */
#define TK_COMM_HOST_MAX 64       /* bytes of a host name, NUL included */

typedef struct tk_comm_mpi tk_comm_mpi;
typedef struct tk_comm_nccl tk_comm_nccl;

struct tk_comm {
    uint32_t magic;
    int backend;                /* TK_COMM_SELF / _MPI / _NCCL */
    int rank, size, local_rank, local_size;
    int device;                 /* NCCL: the CUDA ordinal; -1 otherwise */
    int64_t timeout_ms;
    char (*hosts)[TK_COMM_HOST_MAX]; /* size host names */
    tk_comm_mpi *mpi;           /* MPI, or the MPI bootstrap of NCCL; NULL otherwise */
    tk_comm_nccl *nccl;
    /* Broken after a timeout or a backend error: every later call returns broken_code with broken_msg. */
    int broken_code;
    char broken_msg[1024];
    /* MPI given GPU tensors: their bytes on the way through host memory (comm.c), grown as needed */
    void *stage;
    size_t stage_bytes;
};

/* Breaks c: formats the message (the HINT for a broken communicator is appended), keeps it for later
 * calls and sets it as the thread's error. Returns code. */
int tk_comm__break(tk_comm *c, int code, const char *fmt, ...) TK_PRINTF(3, 4);

/* The deadline loop shared by the backends: polls done(arg) (1 done, 0 not yet, < 0 a status with
 * the error set) until it is done or c's timeout passes: spins (with sched_yield) for the first
 * millisecond, then sleeps 10 µs, doubling up to 200 µs between polls. Returns TK_OK, the poll's
 * status, or TK_ERR_NETWORK after breaking c with "`what` timed out after S s ...". */
int tk_comm__wait(tk_comm *c, const char *what, int (*done)(void *arg), void *arg);

/* Bytes of one element of a dtype tk moves; 0 for an unknown one. */
size_t tk_comm__dtype_size(tk_dtype dt);
/* f16/bf16 <-> f32, round to nearest even (as ops/dtype.c: comm/ may not include ops/). */
void tk_comm__half_to_f32(float *dst, const uint16_t *src, size_t n, int bf16);
void tk_comm__f32_to_half(uint16_t *dst, const float *src, size_t n, int bf16);

/* What the launcher's environment says (no MPI call): the launcher's name or NULL, and the world
 * size, rank and local rank, each -1 when it does not say. */
const char *tk_comm__launcher_env(int *size, int *rank, int *local_rank);

/* ---- MPI (comm/mpi.c) ---- */
/* 1 when this build has MPI. */
int tk_comm__mpi_built(void);
/* 1 when MPI is initialised (and not finalised) in this process. */
int tk_comm__mpi_initialized(void);
/* MPI_Get_library_version's first line into buf (callable before MPI_Init); "" without MPI. */
void tk_comm__mpi_library(char *buf, size_t n);
/* Joins c (magic, timeout set) to MPI: initialises MPI if needed, duplicates the base communicator
 * (MPI_Comm_idup under the deadline), sets rank and size. */
int tk_comm__mpi_new(tk_comm *c, const void *mpi_comm);
void tk_comm__mpi_free(tk_comm *c);
/* Collectives over host buffers: count elements of dt (bytes for gather/bcast). */
int tk_comm__mpi_all_reduce(tk_comm *c, void *buf, size_t count, tk_dtype dt);
int tk_comm__mpi_all_gather(tk_comm *c, void *out, const void *in, size_t bytes);
int tk_comm__mpi_broadcast(tk_comm *c, void *buf, size_t bytes, int root);
int tk_comm__mpi_barrier(tk_comm *c);
void tk_comm__mpi_abort(tk_comm *c, int code);

/* ---- NCCL (comm/nccl.c) ---- */
/* Loads libnccl.so.2 (once per process; $TK_NCCL, then the usual names and CUDA's lib64). On success
 * path/version describe it; otherwise the error is set (TK_ERR_NOT_FOUND). */
int tk_comm__nccl_load(char *path, size_t npath, char *version, size_t nversion);
/* Joins c to NCCL: rank and size from c->mpi (already joined) or opts, the unique id over MPI or the
 * file, the device, then a non-blocking ncclCommInitRankConfig under the deadline. */
int tk_comm__nccl_new(tk_comm *c, const tk_comm_opts *opts);
void tk_comm__nccl_free(tk_comm *c);
int tk_comm__nccl_all_reduce(tk_comm *c, void *buf, size_t count, tk_dtype dt, void *stream);
int tk_comm__nccl_all_gather(tk_comm *c, void *out, const void *in, size_t count, tk_dtype dt, void *stream);
int tk_comm__nccl_broadcast(tk_comm *c, void *buf, size_t count, tk_dtype dt, int root, void *stream);
int tk_comm__nccl_barrier(tk_comm *c);
void tk_comm__nccl_abort(tk_comm *c);
/* A device buffer of at least bytes on the communicator's GPU, for a host tensor's bytes on their way
 * through NCCL; kept and grown (freed with the communicator). TK_ERR_NOMEM when the GPU is full. */
int tk_comm__nccl_stage(tk_comm *c, size_t bytes, void **out);
/* Copies bytes host to device, device to host or device to device (kind) on cuda:device, in its
 * primary context (the one tk's models and tk_device_* allocate in), on stream after the work already
 * queued there (NULL: the legacy default stream, which tk's ops run on), and waits for it. Loads
 * libcuda only (not NCCL). TK_ERR_NO_DEVICE without a driver or that device; TK_ERR_LAUNCH when the
 * copy fails (an earlier kernel's fault included). */
enum { TK_COMM__H2D = 1, TK_COMM__D2H = 2, TK_COMM__D2D = 3 };
int tk_comm__cuda_copy(void *dst, const void *src, size_t bytes, int kind, int device, void *stream);

#endif /* TK_COMM_H */
