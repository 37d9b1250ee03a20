/*
 * mpi.c — the MPI backend: Open MPI or MPICH, linked when the build found it with pkg-config
 * (TK_HAVE_MPI); without it every entry point says the build has no MPI.
 *
 * Every collective is MPI's non-blocking one (MPI_Iallreduce, MPI_Iallgather, MPI_Ibcast,
 * MPI_Ibarrier, and MPI_Comm_idup at creation) polled with MPI_Test under tk_comm__wait's deadline, on
 * a duplicate of the base communicator whose error handler is MPI_ERRORS_RETURN, so a dead peer gives
 * an error or a timeout, never a hang or an abort inside MPI. f16 and bf16 are summed in f32 (MPI has
 * no such types) and rounded once. tk initialises MPI only when nobody has, and finalises it when the
 * last communicator it made over that MPI is freed, unless one broke (MPI_Finalize waits for every
 * process, which a dead peer never reaches).
 */
#define _GNU_SOURCE
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"

#ifdef TK_HAVE_MPI
#include <mpi.h>

struct tk_comm_mpi {
    MPI_Comm comm;
    int counted; /* counted in `live` (made over an MPI that tk initialised) */
};

/* MPI's own state is process-wide, so this is too: whether tk initialised it, and how many
 * communicators use that initialisation. */
static pthread_mutex_t mpi_lock = PTHREAD_MUTEX_INITIALIZER;
static int tk_initialised, live, any_broken;

/* Largest element count one MPI call takes (its counts are int). */
#define MPI_CHUNK ((size_t)1 << 30)
/* f16/bf16 sums go through an f32 buffer of at most this many elements at a time. */
#define STAGE_CHUNK ((size_t)1 << 22)

int tk_comm__mpi_built(void) { return 1; }

int tk_comm__mpi_initialized(void)
{
    int i = 0, f = 0;
    MPI_Initialized(&i);
    MPI_Finalized(&f);
    return i && !f;
}

void tk_comm__mpi_library(char *buf, size_t n)
{
    char v[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    if (MPI_Get_library_version(v, &len) != MPI_SUCCESS)
        len = 0;
    v[len < (int)sizeof v ? len : (int)sizeof v - 1] = '\0';
    v[strcspn(v, "\n")] = '\0';
    snprintf(buf, n, "%s", v);
}

static const char *errstr(int rc, char *buf)
{
    int len = 0;
    if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS)
        snprintf(buf, MPI_MAX_ERROR_STRING, "MPI error %d", rc);
    return buf;
}

typedef struct {
    tk_comm *c;
    MPI_Request req;
    const char *what;
} pending;

static int test_done(void *arg)
{
    pending *p = arg;
    char eb[MPI_MAX_ERROR_STRING];
    int flag = 0, rc = MPI_Test(&p->req, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS)
        return tk_comm__break(p->c, TK_ERR_NETWORK, "%s failed on rank %d of %d: %s", p->what, p->c->rank, p->c->size,
                              errstr(rc, eb));
    return flag;
}

/* Starts were checked by the caller (rc of the MPI_I* call); waits for req under the deadline. */
static int wait_req(tk_comm *c, int start_rc, MPI_Request req, const char *what)
{
    char eb[MPI_MAX_ERROR_STRING];
    pending p = {c, req, what};
    if (start_rc != MPI_SUCCESS)
        return tk_comm__break(c, TK_ERR_NETWORK, "%s could not start on rank %d of %d: %s", what, c->rank, c->size,
                              errstr(start_rc, eb));
    return tk_comm__wait(c, what, test_done, &p);
}

/* Every rank's host name, to know the local rank (ranks on the same host, in rank order). */
static int gather_hosts(tk_comm *c)
{
    char me[TK_COMM_HOST_MAX] = {0};
    int rc;
    c->hosts = calloc((size_t)c->size, sizeof *c->hosts);
    if (!c->hosts)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    if (gethostname(me, sizeof me - 1) != 0)
        snprintf(me, sizeof me, "localhost");
    memcpy(c->hosts[c->rank], me, sizeof me);
    if ((rc = tk_comm__mpi_all_gather(c, c->hosts, NULL, TK_COMM_HOST_MAX)) != TK_OK)
        return rc;
    c->local_rank = 0;
    c->local_size = 0;
    for (int r = 0; r < c->size; r++) {
        c->hosts[r][TK_COMM_HOST_MAX - 1] = '\0';
        if (!strcmp(c->hosts[r], me)) {
            c->local_size++;
            if (r < c->rank)
                c->local_rank++;
        }
    }
    return TK_OK;
}

/* Every rank's tk_build_id(): a job whose ranks run different builds is refused on every rank alike
 * (each sees all the ids), naming the first rank that differs from rank 0. */
static int same_build(tk_comm *c)
{
    enum { ID = 32 };
    char *ids = calloc((size_t)c->size, ID);
    if (!ids)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    snprintf(ids + (size_t)c->rank * ID, ID, "%s", tk_build_id());
    int rc = tk_comm__mpi_all_gather(c, ids, NULL, ID);
    for (int r = 1; rc == TK_OK && r < c->size; r++) {
        ids[(size_t)r * ID + ID - 1] = ids[ID - 1] = '\0';
        if (strcmp(ids + (size_t)r * ID, ids) != 0)
            rc = tk__err(TK_ERR_INVALID,
                         "rank %d (on %s) runs tk build %s, rank 0 (on %s) build %s: every rank of a job must run "
                         "the same tk\nHINT: install one tk build on every host ('tk --version' prints the build)",
                         r, c->hosts[r], ids + (size_t)r * ID, c->hosts[0], ids);
    }
    free(ids);
    return rc;
}

int tk_comm__mpi_new(tk_comm *c, const void *mpi_comm)
{
    char eb[MPI_MAX_ERROR_STRING], what[96];
    int inited = 0, fin = 0, provided = 0, rc;
    MPI_Request req;
    MPI_Comm base = mpi_comm ? *(const MPI_Comm *)mpi_comm : MPI_COMM_WORLD;
    tk_comm_mpi *m = calloc(1, sizeof *m);
    if (!m)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    m->comm = MPI_COMM_NULL;
    pthread_mutex_lock(&mpi_lock);
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    if (fin) {
        pthread_mutex_unlock(&mpi_lock);
        free(m);
        return tk__err(TK_ERR_UNSUPPORTED,
                       "MPI was finalised in this process already; it cannot start again"
                       "\nHINT: keep one communicator for the life of the process (tk finalises MPI when "
                       "the last one it made is freed)");
    }
    if (!inited) {
        /* An error here aborts inside MPI (MPI_COMM_WORLD's handler is fatal before init returns). */
        rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
        if (rc != MPI_SUCCESS) {
            pthread_mutex_unlock(&mpi_lock);
            free(m);
            return tk__err(TK_ERR_NETWORK, "MPI_Init_thread failed: %s", errstr(rc, eb));
        }
        tk_initialised = 1;
    }
    if (tk_initialised) {
        m->counted = 1;
        live++;
    }
    pthread_mutex_unlock(&mpi_lock);
    c->mpi = m;

    MPI_Comm_size(base, &c->size);
    MPI_Comm_rank(base, &c->rank);
    snprintf(what, sizeof what, "joining the communicator (MPI_Comm_idup, %d ranks)", c->size);
    rc = MPI_Comm_idup(base, &m->comm, &req);
    if ((rc = wait_req(c, rc, req, what)) != TK_OK)
        return rc;
    MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    if ((rc = gather_hosts(c)) != TK_OK)
        return rc;
    return same_build(c);
}

void tk_comm__mpi_free(tk_comm *c)
{
    tk_comm_mpi *m = c->mpi;
    int inited = 0, fin = 0;
    if (!m)
        return;
    /* A broken communicator has an operation that never completed: leave it to the process's end. */
    if (!c->broken_code && m->comm != MPI_COMM_NULL)
        MPI_Comm_free(&m->comm);
    pthread_mutex_lock(&mpi_lock);
    if (m->counted) {
        live--;
        any_broken |= c->broken_code != 0;
        MPI_Initialized(&inited);
        MPI_Finalized(&fin);
        if (live == 0 && !any_broken && inited && !fin)
            MPI_Finalize();
    }
    pthread_mutex_unlock(&mpi_lock);
    free(m);
    c->mpi = NULL;
}

static int type_of(tk_dtype dt, MPI_Datatype *t)
{
    if (dt.code == TK_DL_FLOAT && dt.bits == 32)
        *t = MPI_FLOAT;
    else if (dt.code == TK_DL_FLOAT && dt.bits == 64)
        *t = MPI_DOUBLE;
    else if (dt.code == TK_DL_INT && dt.bits == 32)
        *t = MPI_INT32_T;
    else if (dt.code == TK_DL_INT && dt.bits == 64)
        *t = MPI_INT64_T;
    else
        return -1;
    return 0;
}

int tk_comm__mpi_all_reduce(tk_comm *c, void *buf, size_t count, tk_dtype dt)
{
    MPI_Datatype t;
    MPI_Request req;
    char what[96];
    int rc;
    snprintf(what, sizeof what, "all_reduce of %zu %s", count, tk_dtype_name(dt));
    if (type_of(dt, &t) == 0) {
        size_t es = dt.bits / 8;
        for (size_t off = 0; off < count; off += MPI_CHUNK) {
            size_t n = count - off < MPI_CHUNK ? count - off : MPI_CHUNK;
            rc = MPI_Iallreduce(MPI_IN_PLACE, (char *)buf + off * es, (int)n, t, MPI_SUM, c->mpi->comm, &req);
            if ((rc = wait_req(c, rc, req, what)) != TK_OK)
                return rc;
        }
        return TK_OK;
    }
    /* f16 / bf16: in f32, rounded once at the end. The stage is not freed after a timeout: the
     * operation that never completed may still write into it. */
    int bf16 = dt.code == TK_DL_BFLOAT;
    size_t cap = count < STAGE_CHUNK ? count : STAGE_CHUNK;
    float *stage = malloc(cap * sizeof *stage);
    if (!stage)
        return tk__err(TK_ERR_NOMEM, "all_reduce: out of memory for a %zu-element f32 stage", cap);
    for (size_t off = 0; off < count; off += cap) {
        size_t n = count - off < cap ? count - off : cap;
        uint16_t *p = (uint16_t *)buf + off;
        tk_comm__half_to_f32(stage, p, n, bf16);
        rc = MPI_Iallreduce(MPI_IN_PLACE, stage, (int)n, MPI_FLOAT, MPI_SUM, c->mpi->comm, &req);
        if ((rc = wait_req(c, rc, req, what)) != TK_OK)
            return rc;
        tk_comm__f32_to_half(p, stage, n, bf16);
    }
    free(stage);
    return TK_OK;
}

int tk_comm__mpi_all_gather(tk_comm *c, void *out, const void *in, size_t bytes)
{
    MPI_Request req;
    char what[96];
    int rc;
    snprintf(what, sizeof what, "all_gather of %zu bytes a rank", bytes);
    if (bytes > INT_MAX)
        return tk__err(TK_ERR_UNSUPPORTED, "%s: MPI moves at most %d bytes a rank in one gather", what, INT_MAX);
    rc = MPI_Iallgather(in ? in : MPI_IN_PLACE, (int)bytes, MPI_BYTE, out, (int)bytes, MPI_BYTE, c->mpi->comm, &req);
    return wait_req(c, rc, req, what);
}

int tk_comm__mpi_broadcast(tk_comm *c, void *buf, size_t bytes, int root)
{
    MPI_Request req;
    char what[96];
    int rc;
    snprintf(what, sizeof what, "broadcast of %zu bytes from rank %d", bytes, root);
    for (size_t off = 0; off < bytes; off += MPI_CHUNK) {
        size_t n = bytes - off < MPI_CHUNK ? bytes - off : MPI_CHUNK;
        rc = MPI_Ibcast((char *)buf + off, (int)n, MPI_BYTE, root, c->mpi->comm, &req);
        if ((rc = wait_req(c, rc, req, what)) != TK_OK)
            return rc;
    }
    return TK_OK;
}

int tk_comm__mpi_barrier(tk_comm *c)
{
    MPI_Request req;
    int rc = MPI_Ibarrier(c->mpi->comm, &req);
    return wait_req(c, rc, req, "barrier");
}

void tk_comm__mpi_abort(tk_comm *c, int code)
{
    tk_comm_mpi *m = c->mpi;
    MPI_Abort(m && m->comm != MPI_COMM_NULL ? m->comm : MPI_COMM_WORLD, code);
}

#else /* no MPI in this build */

static int no_mpi(void)
{
    return tk__err(TK_ERR_UNSUPPORTED, "this tk was built without MPI\nHINT: install Open MPI's headers "
                                       "(apt install libopenmpi-dev openmpi-bin, scripts/setup.sh) and rebuild tk");
}

int tk_comm__mpi_built(void) { return 0; }
int tk_comm__mpi_initialized(void) { return 0; }
void tk_comm__mpi_library(char *buf, size_t n)
{
    if (n)
        buf[0] = '\0';
}
int tk_comm__mpi_new(tk_comm *c, const void *mpi_comm) { return no_mpi(); }
void tk_comm__mpi_free(tk_comm *c) {}
int tk_comm__mpi_all_reduce(tk_comm *c, void *buf, size_t count, tk_dtype dt) { return no_mpi(); }
int tk_comm__mpi_all_gather(tk_comm *c, void *out, const void *in, size_t bytes) { return no_mpi(); }
int tk_comm__mpi_broadcast(tk_comm *c, void *buf, size_t bytes, int root) { return no_mpi(); }
int tk_comm__mpi_barrier(tk_comm *c) { return no_mpi(); }
void tk_comm__mpi_abort(tk_comm *c, int code) {}

#endif
