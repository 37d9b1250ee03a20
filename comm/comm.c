/*
 * comm.c — tk_comm: the public calls, their checks, the backend choice, the self backend (one rank
 * alone) and the deadline loop every backend waits in.
 *
 * Collectives block until complete, polling the backend's non-blocking operation against a deadline
 * (MPI's blocking collectives cannot be interrupted, so a dead or hung peer would hang them forever).
 * A timeout breaks the communicator: the operation cannot be cancelled, so nothing else may run on it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <jansson.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "common/convert.h"

#define DEFAULT_TIMEOUT_MS 300000

static const char BROKEN_HINT[] =
    "HINT: a rank died, hung or fell far behind; this communicator is unusable now. End the job "
    "(tk_comm_abort, or exit non-zero) and look at the other ranks' errors; TK_COMM_TIMEOUT (seconds) "
    "sets the deadline";

int tk_comm__break(tk_comm *c, int code, const char *fmt, ...)
{
    char msg[sizeof c->broken_msg - sizeof BROKEN_HINT - 2];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(c->broken_msg, sizeof c->broken_msg, "%s\n%s", msg, BROKEN_HINT);
    c->broken_code = code;
    return tk__err(code, "%s", c->broken_msg);
}

int tk_comm__wait(tk_comm *c, const char *what, int (*done)(void *arg), void *arg)
{
    double t0 = tk__now_ms(), now;
    long sleep_ns = 10000;
    for (;;) {
        int r = done(arg);
        if (r < 0)
            return r;
        if (r > 0)
            return TK_OK;
        now = tk__now_ms();
        if (now - t0 >= (double)c->timeout_ms)
            return tk_comm__break(c, TK_ERR_NETWORK,
                                  "%s timed out after %.1f s: rank %d of %d waited for the other ranks", what,
                                  (now - t0) / 1000.0, c->rank, c->size);
        if (now - t0 < 1.0) {
            sched_yield();
            continue;
        }
        struct timespec ts = {0, sleep_ns};
        nanosleep(&ts, NULL);
        if (sleep_ns < 200000)
            sleep_ns *= 2;
    }
}

size_t tk_comm__dtype_size(tk_dtype dt)
{
    if (dt.lanes != 1 || (dt.bits != 8 && dt.bits != 16 && dt.bits != 32 && dt.bits != 64))
        return 0;
    return dt.bits / 8;
}

/* ---- f16 / bf16: common/convert.h's rounding ---- */

void tk_comm__half_to_f32(float *dst, const uint16_t *src, size_t n, int bf16)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = bf16 ? tk__bf16_to_f32(src[i]) : tk__f16_to_f32(src[i]);
}

void tk_comm__f32_to_half(uint16_t *dst, const float *src, size_t n, int bf16)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = bf16 ? tk__f32_to_bf16(src[i]) : tk__f32_to_f16(src[i]);
}

/* ---- the launcher's environment ---- */

static int env_int(const char *name)
{
    const char *v = getenv(name);
    int64_t x;
    if (!v || tk__parse_i64(v, 0, 1 << 30, &x) != 0)
        return -1;
    return (int)x;
}

const char *tk_comm__launcher_env(int *size, int *rank, int *local_rank)
{
    static const struct {
        const char *launcher, *size, *rank, *local;
    } L[] = {
        {"Open MPI", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"},
        {"MPICH", "PMI_SIZE", "PMI_RANK", "MPI_LOCALRANKID"},
        {"PMIx", "PMIX_SIZE", "PMIX_RANK", "PMIX_LOCAL_RANK"},
        {"Slurm", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID"},
    };
    *size = *rank = *local_rank = -1;
    for (size_t i = 0; i < sizeof L / sizeof L[0]; i++) {
        int r = env_int(L[i].rank);
        if (r < 0)
            continue;
        /* Slurm's variables alone mean an allocation, not an MPI job: srun sets SLURM_PROCID for
         * every task, and PMI/PMIx then too, so only trust Slurm with MPI already initialised. */
        if (!strcmp(L[i].launcher, "Slurm") && !tk_comm__mpi_initialized())
            continue;
        *rank = r;
        *size = env_int(L[i].size);
        *local_rank = env_int(L[i].local);
        if (*size < 0 && !strcmp(L[i].launcher, "PMIx")) /* Open MPI 5 / prterun set only PMIX_RANK */
            *size = env_int("OMPI_COMM_WORLD_SIZE");
        return L[i].launcher;
    }
    return NULL;
}

/* ---- the public calls ---- */

static int64_t timeout_from_env(void)
{
    const char *v = getenv("TK_COMM_TIMEOUT");
    char *end = NULL;
    double s;
    if (!v || !*v)
        return DEFAULT_TIMEOUT_MS;
    errno = 0;
    s = strtod(v, &end);
    if (errno || end == v || *end || !(s > 0) || s > 1e9)
        return -1;
    return (int64_t)(s * 1000.0 + 0.5) > 0 ? (int64_t)(s * 1000.0 + 0.5) : 1;
}

static int check(const tk_comm *c, const char *what)
{
    if (!c || c->magic != TK_COMM_MAGIC)
        return tk__err(TK_ERR_INVALID, "%s: not a communicator (NULL, freed or foreign)", what);
    if (c->broken_code)
        return tk__err(c->broken_code, "%s", c->broken_msg);
    return TK_OK;
}

/* Fills c->hosts for a one-rank communicator. */
static int hosts_self(tk_comm *c)
{
    c->hosts = calloc(1, sizeof *c->hosts);
    if (!c->hosts)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    if (gethostname(c->hosts[0], TK_COMM_HOST_MAX - 1) != 0)
        snprintf(c->hosts[0], TK_COMM_HOST_MAX, "localhost");
    return TK_OK;
}

int tk_comm_new(tk_comm **out, const tk_comm_opts *opts)
{
    tk_comm_opts o = TK_COMM_OPTS_INIT;
    tk_comm *c = NULL;
    int rc, esize, erank, elocal;
    if (!out)
        return tk__err(TK_ERR_INVALID, "tk_comm_new: out is NULL");
    *out = NULL;
    if (opts) {
        if (opts->version < 1 || opts->version > TK_COMM_OPTS_VERSION)
            return tk__err(TK_ERR_INVALID, "tk_comm_new: options version %u (this tk knows 1..%d)", opts->version,
                           TK_COMM_OPTS_VERSION);
        o = *opts;
    }
    if (o.backend < TK_COMM_AUTO || o.backend > TK_COMM_NCCL)
        return tk__err(TK_ERR_INVALID, "tk_comm_new: unknown backend %d", o.backend);
    if (o.expect_size < 0)
        return tk__err(TK_ERR_INVALID, "tk_comm_new: expect_size %d is negative", o.expect_size);
    if (o.timeout_ms < 0)
        return tk__err(TK_ERR_INVALID, "tk_comm_new: timeout_ms %lld is negative", (long long)o.timeout_ms);
    if (o.timeout_ms == 0 && (o.timeout_ms = timeout_from_env()) < 0)
        return tk__err(TK_ERR_INVALID, "TK_COMM_TIMEOUT='%s' is not a positive number of seconds",
                       getenv("TK_COMM_TIMEOUT"));
    if (o.backend == TK_COMM_AUTO)
        o.backend = tk_comm__mpi_initialized() || tk_comm__launcher_env(&esize, &erank, &elocal)
                        ? (tk_comm__mpi_built() ? TK_COMM_MPI : TK_COMM_SELF)
                        : TK_COMM_SELF;
    if (o.backend == TK_COMM_AUTO || o.backend == TK_COMM_SELF) {
        /* Started by an MPI launcher with several ranks, but this tk has no MPI: each process would
         * believe it is alone and run the whole job; refuse instead. */
        if (tk_comm__launcher_env(&esize, &erank, &elocal) && esize > 1 && !tk_comm__mpi_built() &&
            o.backend == TK_COMM_SELF && (!opts || opts->backend == TK_COMM_AUTO))
            return tk__err(TK_ERR_UNSUPPORTED,
                           "this process is rank %d of %d under an MPI launcher, but this tk was built "
                           "without MPI\nHINT: install Open MPI's headers (apt install libopenmpi-dev, "
                           "scripts/setup.sh) and rebuild tk; 'tk doctor' shows what the build has",
                           erank, esize);
    }

    c = calloc(1, sizeof *c);
    if (!c)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    c->magic = TK_COMM_MAGIC;
    c->backend = o.backend;
    c->timeout_ms = o.timeout_ms;
    c->device = -1;
    c->size = 1;
    c->local_size = 1;
    switch (o.backend) {
    case TK_COMM_SELF: rc = hosts_self(c); break;
    case TK_COMM_MPI: rc = tk_comm__mpi_new(c, o.mpi_comm); break;
    default: /* NCCL: over MPI when it is there (launcher or host), else through the id file */
        rc = TK_OK;
        if (!o.nccl_id_file) {
            if (!tk_comm__mpi_built()) {
                rc = tk__err(TK_ERR_INVALID,
                             "NCCL needs its unique id handed to every rank: this tk has no MPI, so give "
                             "an id file\nHINT: set tk_comm_opts.nccl_id_file (a fresh path every rank "
                             "can read) with the rank and size, or rebuild tk with MPI");
                break;
            }
            rc = tk_comm__mpi_new(c, o.mpi_comm);
        }
        if (rc == TK_OK)
            rc = tk_comm__nccl_new(c, &o);
        break;
    }
    if (rc != TK_OK)
        goto fail;
    if (o.expect_size > 0 && o.expect_size != c->size) {
        rc = tk__err(TK_ERR_INVALID,
                     "the job has %d rank%s but %d %s asked for\nHINT: start as many ranks as the "
                     "tensor-parallel size: mpirun -np %d ...",
                     c->size, c->size == 1 ? "" : "s", o.expect_size, o.expect_size == 1 ? "was" : "were",
                     o.expect_size);
        goto fail;
    }
    *out = c;
    return TK_OK;
fail:
    tk_comm_free(c);
    return rc;
}

void tk_comm_free(tk_comm *c)
{
    if (!c || c->magic != TK_COMM_MAGIC)
        return;
    if (c->nccl)
        tk_comm__nccl_free(c);
    if (c->mpi)
        tk_comm__mpi_free(c);
    free(c->hosts);
    free(c->stage);
    c->magic = 0;
    free(c);
}

int tk_comm_rank(const tk_comm *c) { return c && c->magic == TK_COMM_MAGIC ? c->rank : 0; }
int tk_comm_size(const tk_comm *c) { return c && c->magic == TK_COMM_MAGIC ? c->size : 1; }
int tk_comm_local_rank(const tk_comm *c) { return c && c->magic == TK_COMM_MAGIC ? c->local_rank : 0; }
int tk_comm_local_size(const tk_comm *c) { return c && c->magic == TK_COMM_MAGIC ? c->local_size : 1; }
int tk_comm_device(const tk_comm *c) { return c && c->magic == TK_COMM_MAGIC ? c->device : -1; }

const char *tk_comm_backend(const tk_comm *c)
{
    if (!c || c->magic != TK_COMM_MAGIC)
        return "?";
    return c->backend == TK_COMM_MPI ? "mpi" : c->backend == TK_COMM_NCCL ? "nccl" : "self";
}

const char *tk_comm_host(const tk_comm *c, int r)
{
    if (!c || c->magic != TK_COMM_MAGIC || !c->hosts || r < 0 || r >= c->size)
        return NULL;
    return c->hosts[r];
}

/* Checks a tensor for a collective: contiguous, a known element size, in host or CUDA memory (a GPU
 * tensor on NCCL: the communicator's GPU). *elsize and *count receive its element size and count. */
static int check_tensor(const tk_comm *c, const tk_tensor *t, const char *what, const char *arg, size_t *elsize,
                        size_t *count)
{
    size_t n = 1, es;
    int64_t expect = 1;
    if (!t)
        return tk__err(TK_ERR_INVALID, "%s: %s is NULL", what, arg);
    es = tk_comm__dtype_size(t->dtype);
    if (!es)
        return tk__err(TK_ERR_INVALID, "%s: %s has dtype %s, which tk cannot move", what, arg, tk_dtype_name(t->dtype));
    if (t->ndim < 0 || t->ndim > 64 || (t->ndim > 0 && !t->shape))
        return tk__err(TK_ERR_INVALID, "%s: %s has a bad shape (ndim %d)", what, arg, (int)t->ndim);
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] < 0)
            return tk__err(TK_ERR_INVALID, "%s: %s has a negative size in dimension %d", what, arg, i);
        if (t->strides && t->shape[i] > 1 && t->strides[i] != expect)
            return tk__err(TK_ERR_INVALID,
                           "%s: %s is not contiguous (dimension %d has stride %lld, want %lld)"
                           "\nHINT: copy it into a contiguous buffer first",
                           what, arg, i, (long long)t->strides[i], (long long)expect);
        if (t->shape[i] && (size_t)t->shape[i] > SIZE_MAX / es / n)
            return tk__err(TK_ERR_INVALID, "%s: %s is too large", what, arg);
        n *= (size_t)t->shape[i];
        expect *= t->shape[i];
    }
    if (n && !t->data)
        return tk__err(TK_ERR_INVALID, "%s: %s has no data", what, arg);
    if (t->device.device_type != TK_DEV_CPU && t->device.device_type != TK_DEV_CUDA)
        return tk__err(TK_ERR_UNSUPPORTED, "%s: %s is on device type %d; tk moves host and CUDA memory", what, arg,
                       (int)t->device.device_type);
    if (c->backend == TK_COMM_NCCL && t->device.device_type == TK_DEV_CUDA && t->device.device_id != c->device)
        return tk__err(TK_ERR_UNSUPPORTED,
                       "%s: %s is on cuda:%d, but this NCCL rank works on cuda:%d"
                       "\nHINT: pass tensors on the communicator's GPU (tk_comm_device), or in host memory",
                       what, arg, (int)t->device.device_id, c->device);
    *elsize = es;
    *count = n;
    return TK_OK;
}

static int summable(tk_dtype dt)
{
    if (dt.lanes != 1)
        return 0;
    return (dt.code == TK_DL_FLOAT && (dt.bits == 16 || dt.bits == 32 || dt.bits == 64)) ||
           (dt.code == TK_DL_BFLOAT && dt.bits == 16) || (dt.code == TK_DL_INT && (dt.bits == 32 || dt.bits == 64));
}

static void *data_of(const tk_tensor *t) { return (char *)t->data + t->byte_offset; }
static int on_gpu(const tk_tensor *t) { return t->device.device_type == TK_DEV_CUDA; }

/* ---- staging: a tensor in the memory the backend does not move ----
 * MPI moves host memory and NCCL device memory. A GPU tensor given to MPI goes through a host buffer,
 * and a host tensor given to NCCL through a device buffer on the communicator's GPU: copied there,
 * the collective run on the copy, copied back. Each staged call thus adds a copy each way over PCIe
 * (or NVLink-C2C) and a wait for the stream; the buffers are kept and grow to the largest call. */

/* 1 when t's memory is not what c's backend moves. */
static int staged(const tk_comm *c, const tk_tensor *t) { return on_gpu(t) != (c->backend == TK_COMM_NCCL); }

/* The staging buffer of at least bytes: host memory for MPI, device memory for NCCL. */
static int stage_buf(tk_comm *c, size_t bytes, char **out)
{
    *out = NULL;
    if (c->backend == TK_COMM_NCCL)
        return tk_comm__nccl_stage(c, bytes ? bytes : 1, (void **)out);
    if (bytes > c->stage_bytes || !c->stage) {
        free(c->stage);
        c->stage_bytes = 0;
        if (!(c->stage = malloc(bytes ? bytes : 1)))
            return tk__err(TK_ERR_NOMEM, "out of memory (%zu bytes staging a GPU tensor through the host)", bytes);
        c->stage_bytes = bytes;
    }
    *out = c->stage;
    return TK_OK;
}

/* Copies bytes between host and CUDA memory, either way (host to host: memmove), on cuda:dev. */
static int move(void *dst, int dst_gpu, const void *src, int src_gpu, size_t bytes, int dev, void *stream)
{
    if (!bytes || dst == src)
        return TK_OK;
    if (!dst_gpu && !src_gpu) {
        memmove(dst, src, bytes);
        return TK_OK;
    }
    int kind = dst_gpu ? (src_gpu ? TK_COMM__D2D : TK_COMM__H2D) : TK_COMM__D2H;
    return tk_comm__cuda_copy(dst, src, bytes, kind, dev, stream);
}

/* The GPU the copies of a staged call run on: NCCL's own; with MPI the tensors', which must agree. */
static int stage_dev(const tk_comm *c, const tk_tensor *a, const tk_tensor *b, const char *what, int *dev)
{
    *dev = c->backend == TK_COMM_NCCL ? c->device : on_gpu(a) ? (int)a->device.device_id : (int)b->device.device_id;
    if (c->backend != TK_COMM_NCCL && on_gpu(a) && on_gpu(b) && a->device.device_id != b->device.device_id)
        return tk__err(TK_ERR_UNSUPPORTED, "%s: in is on cuda:%d and out on cuda:%d\nHINT: pass both on one GPU", what,
                       (int)a->device.device_id, (int)b->device.device_id);
    return TK_OK;
}

static int staging_failed(int rc, const tk_comm *c, const char *what)
{
    return tk__err_wrap(rc, "%s on rank %d of %d: staging through %s memory", what, c->rank, c->size,
                        c->backend == TK_COMM_NCCL ? "device" : "host");
}

static int reduce_on(tk_comm *c, void *buf, size_t n, tk_dtype dt, void *stream)
{
    if (c->backend == TK_COMM_MPI)
        return tk_comm__mpi_all_reduce(c, buf, n, dt);
    return tk_comm__nccl_all_reduce(c, buf, n, dt, stream);
}

int tk_comm_all_reduce_sum(tk_comm *c, tk_tensor *t, void *stream)
{
    size_t es, n;
    int rc, dev, g;
    char *s;
    if ((rc = check(c, "all_reduce")) != TK_OK || (rc = check_tensor(c, t, "all_reduce", "t", &es, &n)) != TK_OK)
        return rc;
    if (!summable(t->dtype))
        return tk__err(TK_ERR_INVALID,
                       "all_reduce: cannot sum dtype %s\nHINT: f32, f64, f16, bf16, i32 and "
                       "i64 are summed",
                       tk_dtype_name(t->dtype));
    if (n == 0 || (c->size == 1 && c->backend != TK_COMM_NCCL))
        return TK_OK; /* one rank of NCCL still runs NCCL's call: its stream order, its errors, its timing */
    if (!staged(c, t))
        return reduce_on(c, data_of(t), n, t->dtype, stream);
    g = c->backend == TK_COMM_NCCL;
    dev = g ? c->device : (int)t->device.device_id;
    if ((rc = stage_buf(c, n * es, &s)) != TK_OK || (rc = move(s, g, data_of(t), !g, n * es, dev, stream)) != TK_OK)
        return staging_failed(rc, c, "all_reduce");
    if ((rc = reduce_on(c, s, n, t->dtype, stream)) != TK_OK)
        return rc;
    if ((rc = move(data_of(t), !g, s, g, n * es, dev, stream)) != TK_OK)
        return staging_failed(rc, c, "all_reduce");
    return TK_OK;
}

static int gather_on(tk_comm *c, char *out, const char *in, size_t n, size_t es, tk_dtype dt, void *stream)
{
    if (c->backend == TK_COMM_MPI)
        return tk_comm__mpi_all_gather(c, out, in, n * es);
    return tk_comm__nccl_all_gather(c, out, in ? in : out + (size_t)c->rank * n * es, n, dt, stream);
}

/* all_gather with in or out in the memory the backend does not move: gathered in place in out when
 * out is in the backend's memory, else in the staging buffer and copied to out. */
static int gather_staged(tk_comm *c, tk_tensor *out, const tk_tensor *in, size_t n, size_t es, void *stream)
{
    int g = c->backend == TK_COMM_NCCL, dev, rc;
    size_t no = n * (size_t)c->size;
    char *o = data_of(out), *buf = o;
    if ((rc = stage_dev(c, in, out, "all_gather", &dev)) != TK_OK)
        return rc;
    if (on_gpu(out) != g && (rc = stage_buf(c, no * es, &buf)) != TK_OK)
        return staging_failed(rc, c, "all_gather");
    if ((rc = move(buf + (size_t)c->rank * n * es, g, data_of(in), on_gpu(in), n * es, dev, stream)) != TK_OK)
        return staging_failed(rc, c, "all_gather");
    if ((rc = gather_on(c, buf, NULL, n, es, in->dtype, stream)) != TK_OK)
        return rc;
    if (buf != o && (rc = move(o, on_gpu(out), buf, g, no * es, dev, stream)) != TK_OK)
        return staging_failed(rc, c, "all_gather");
    return TK_OK;
}

int tk_comm_all_gather(tk_comm *c, tk_tensor *out, const tk_tensor *in, void *stream)
{
    size_t es, n, eso, no;
    int rc, dev;
    if ((rc = check(c, "all_gather")) != TK_OK || (rc = check_tensor(c, in, "all_gather", "in", &es, &n)) != TK_OK ||
        (rc = check_tensor(c, out, "all_gather", "out", &eso, &no)) != TK_OK)
        return rc;
    if (in->dtype.code != out->dtype.code || in->dtype.bits != out->dtype.bits)
        return tk__err(TK_ERR_INVALID, "all_gather: in is %s but out is %s", tk_dtype_name(in->dtype),
                       tk_dtype_name(out->dtype));
    if (no / (size_t)c->size != n || no % (size_t)c->size)
        return tk__err(TK_ERR_INVALID, "all_gather: out has %zu elements, want %d ranks x %zu = %zu", no, c->size, n,
                       n * (size_t)c->size);
    char *o = data_of(out), *i = data_of(in);
    int inplace = i == o + (size_t)c->rank * n * es;
    if (!inplace && n && i < o + no * es && o < i + n * es)
        return tk__err(TK_ERR_INVALID, "all_gather: in overlaps out, and is not this rank's part of it");
    if (n == 0)
        return TK_OK;
    if (c->size == 1 && c->backend != TK_COMM_NCCL) {
        if ((rc = stage_dev(c, in, out, "all_gather", &dev)) != TK_OK)
            return rc;
        return inplace ? TK_OK : move(o, on_gpu(out), i, on_gpu(in), n * es, dev, stream);
    }
    if (staged(c, in) || staged(c, out))
        return gather_staged(c, out, in, n, es, stream);
    return gather_on(c, o, inplace ? NULL : i, n, es, in->dtype, stream);
}

int tk_comm_broadcast(tk_comm *c, tk_tensor *t, int root, void *stream)
{
    size_t es, n;
    int rc, g, dev;
    char *s;
    if ((rc = check(c, "broadcast")) != TK_OK || (rc = check_tensor(c, t, "broadcast", "t", &es, &n)) != TK_OK)
        return rc;
    if (root < 0 || root >= c->size)
        return tk__err(TK_ERR_INVALID, "broadcast: root %d is not a rank (0..%d)", root, c->size - 1);
    if (n == 0 || (c->size == 1 && c->backend != TK_COMM_NCCL))
        return TK_OK;
    if (!staged(c, t)) {
        if (c->backend == TK_COMM_MPI)
            return tk_comm__mpi_broadcast(c, data_of(t), n * es, root);
        return tk_comm__nccl_broadcast(c, data_of(t), n, t->dtype, root, stream);
    }
    g = c->backend == TK_COMM_NCCL;
    dev = g ? c->device : (int)t->device.device_id;
    if ((rc = stage_buf(c, n * es, &s)) != TK_OK ||
        (c->rank == root && (rc = move(s, g, data_of(t), !g, n * es, dev, stream)) != TK_OK))
        return staging_failed(rc, c, "broadcast");
    rc = g ? tk_comm__nccl_broadcast(c, s, n, t->dtype, root, stream) : tk_comm__mpi_broadcast(c, s, n * es, root);
    if (rc == TK_OK && c->rank != root && (rc = move(data_of(t), !g, s, g, n * es, dev, stream)) != TK_OK)
        return staging_failed(rc, c, "broadcast");
    return rc;
}

int tk_comm_barrier(tk_comm *c)
{
    int rc;
    if ((rc = check(c, "barrier")) != TK_OK)
        return rc;
    if (c->size == 1 && c->backend != TK_COMM_NCCL)
        return TK_OK;
    if (c->backend == TK_COMM_MPI)
        return tk_comm__mpi_barrier(c);
    return tk_comm__nccl_barrier(c);
}

void tk_comm_abort(tk_comm *c, int code)
{
    if (!c || c->magic != TK_COMM_MAGIC)
        return;
    if (c->nccl)
        tk_comm__nccl_abort(c);
    if (c->mpi)
        tk_comm__mpi_abort(c, code); /* does not return */
    if (!c->broken_code)
        tk_comm__break(c, TK_ERR_NETWORK, "the communicator was aborted (code %d)", code);
}

int tk_comm_backends_json(char **out)
{
    json_t *j = NULL, *mpi, *nccl;
    char lib[256], path[1024], ver[32];
    int size, rank, local, rc = TK_OK;
    const char *launcher;
    if (!out)
        return tk__err(TK_ERR_INVALID, "tk_comm_backends_json: out is NULL");
    *out = NULL;
    tk_comm__mpi_library(lib, sizeof lib);
    launcher = tk_comm__launcher_env(&size, &rank, &local);
    j = json_object();
    mpi = json_object();
    nccl = json_object();
    if (!j || !mpi || !nccl)
        goto oom;
    json_object_set_new(j, "mpi", mpi);
    json_object_set_new(j, "nccl", nccl);
    json_object_set_new(mpi, "built", json_boolean(tk_comm__mpi_built()));
    json_object_set_new(mpi, "library", lib[0] ? json_string(lib) : json_null());
    json_object_set_new(mpi, "launcher", launcher ? json_string(launcher) : json_null());
    json_object_set_new(mpi, "initialized", json_boolean(tk_comm__mpi_initialized()));
    json_object_set_new(mpi, "world_size", size >= 0 ? json_integer(size) : json_null());
    json_object_set_new(mpi, "rank", rank >= 0 ? json_integer(rank) : json_null());
    json_object_set_new(mpi, "local_rank", local >= 0 ? json_integer(local) : json_null());
    if (tk_comm__nccl_load(path, sizeof path, ver, sizeof ver) == TK_OK) {
        json_object_set_new(nccl, "found", json_true());
        json_object_set_new(nccl, "path", json_string(path));
        json_object_set_new(nccl, "version", json_string(ver));
        json_object_set_new(nccl, "error", json_null());
    } else {
        json_object_set_new(nccl, "found", json_false());
        json_object_set_new(nccl, "path", json_null());
        json_object_set_new(nccl, "version", json_null());
        json_object_set_new(nccl, "error", json_string(tk_last_error()));
    }
    tk__err_clear();
    *out = json_dumps(j, JSON_COMPACT);
    if (!*out)
        goto oom;
    json_decref(j);
    return rc;
oom:
    json_decref(j);
    return tk__err(TK_ERR_NOMEM, "out of memory");
}
