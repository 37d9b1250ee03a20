/*
 * parallel.c — the one thread pool every CPU op runs on (the references through tk_ops__parallel, the
 * fast implementations of cpu_*.c through tk_ops__parallel_for).
 *
 * The pool is process-wide, started on first use and grown to the largest thread count asked for; its
 * workers live until the process exits. One call runs on it at a time: the caller publishes a job (fn,
 * arg, n, grain), wakes the workers, takes ranges itself, then waits until every worker that joined
 * has left. A call made while the pool is busy (a nested call from inside a job, or another host
 * thread's op) runs on its own thread alone: no deadlock, and never more threads than cores.
 *
 * Ranges are handed out from an atomic counter, so a worker the OS delays (a loaded machine) delays the
 * call by at most its current range; a worker that wakes after the caller took every range does
 * nothing. Results never depend on who ran which range: every op computes each item independently.
 *
 * Waiting: a worker spins on the job generation for a while (a decode step runs hundreds of short jobs
 * back to back, and a futex wake costs more than most of them), then sleeps on a condition variable.
 * TK_SPIN_US sets the spin (default 300 microseconds; 0 sleeps at once, for machines shared with other
 * work).
 *
 * Threads: tk_ops__set_threads (thread-local, set by tk_op_run from the context's setting), else
 * TK_NUM_THREADS, else the CPUs in the process's affinity mask. OpenBLAS keeps its own pool for the
 * linear reference's cblas_sgemm (docs/cpu.md: how the two share the cores).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ops/cpu.h"

#define MAX_THREADS 256
/* Below this much work (items x cost) a thread costs more than it saves (tk_ops__parallel). */
#define MIN_WORK (1 << 15)

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* ---- thread counts ------------------------------------------------------------------------------ */

static _Thread_local int tl_threads; /* 0: the default */
static int default_threads;
static pthread_once_t default_once = PTHREAD_ONCE_INIT;
static int64_t spin_ns = 300000;

static void read_defaults(void)
{
    int n = 0;
    const char *env = getenv("TK_NUM_THREADS");
    if (env && *env) {
        char *end = NULL;
        long v = strtol(env, &end, 10);
        if (end && !*end && v >= 1 && v <= MAX_THREADS)
            n = (int)v;
    }
#ifdef CPU_COUNT
    if (n == 0) {
        cpu_set_t set;
        if (sched_getaffinity(0, sizeof set, &set) == 0)
            n = CPU_COUNT(&set);
    }
#endif
    if (n == 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n = c > 0 ? (int)c : 1;
    }
    default_threads = n > MAX_THREADS ? MAX_THREADS : n;
    const char *sp = getenv("TK_SPIN_US");
    if (sp && *sp) {
        char *end = NULL;
        long v = strtol(sp, &end, 10);
        if (end && !*end && v >= 0 && v <= 1000000)
            spin_ns = (int64_t)v * 1000;
    }
}

int tk_ops__default_threads(void)
{
    pthread_once(&default_once, read_defaults);
    return default_threads;
}

int tk_ops__set_threads(int n)
{
    int old = tl_threads;
    tl_threads = n > 0 ? (n > MAX_THREADS ? MAX_THREADS : n) : 0;
    return old;
}

int tk_ops__threads(void) { return tl_threads > 0 ? tl_threads : tk_ops__default_threads(); }

/* ---- the pool ----------------------------------------------------------------------------------- */

static struct {
    pthread_mutex_t submit; /* held by the one caller whose job runs */
    pthread_mutex_t mu;     /* for sleeping workers */
    pthread_cond_t cv;
    pthread_mutex_t grow;   /* starting workers */
    int nworkers;           /* started so far (the caller is not one) */
    atomic_uint gen;        /* bumped for each job */
    atomic_int sleepers;
    /* the job: written by the caller before gen is bumped */
    void (*fn)(void *, int64_t, int64_t);
    void *arg;
    int64_t n, grain;
    int helpers;            /* workers 0..helpers-1 join */
    atomic_llong next;      /* the next range's start */
    atomic_int open;        /* 1 while ranges may be taken */
    atomic_int active;      /* workers inside the job */
} pool = {.submit = PTHREAD_MUTEX_INITIALIZER,
          .mu = PTHREAD_MUTEX_INITIALIZER,
          .cv = PTHREAD_COND_INITIALIZER,
          .grow = PTHREAD_MUTEX_INITIALIZER};

static void take_ranges(void)
{
    for (;;) {
        int64_t lo = atomic_fetch_add(&pool.next, pool.grain);
        if (lo >= pool.n)
            return;
        int64_t hi = pool.n - lo < pool.grain ? pool.n : lo + pool.grain;
        pool.fn(pool.arg, lo, hi);
    }
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void *worker_main(void *p)
{
    int idx = (int)(intptr_t)p;
    unsigned seen = atomic_load(&pool.gen);
    for (;;) {
        unsigned g = atomic_load(&pool.gen);
        if (g == seen) {
            int64_t t0 = now_ns();
            for (int spins = 0; (g = atomic_load(&pool.gen)) == seen; spins++) {
                cpu_relax();
                if ((spins & 255) == 255 && now_ns() - t0 > spin_ns)
                    break;
            }
        }
        if (g == seen) {
            pthread_mutex_lock(&pool.mu);
            atomic_fetch_add(&pool.sleepers, 1);
            while ((g = atomic_load(&pool.gen)) == seen)
                pthread_cond_wait(&pool.cv, &pool.mu);
            atomic_fetch_sub(&pool.sleepers, 1);
            pthread_mutex_unlock(&pool.mu);
        }
        seen = g;
        /* Join only the job of generation g, and only while it is open: the caller waits for active to
         * drop to 0 after closing it, so nothing here touches a job that has returned. */
        atomic_fetch_add(&pool.active, 1);
        if (atomic_load(&pool.open) && atomic_load(&pool.gen) == g && idx < pool.helpers)
            take_ranges();
        atomic_fetch_sub(&pool.active, 1);
    }
    return NULL;
}

/* A child of fork() has none of the parent's workers (and may have copied a lock held mid-call): it
 * starts with an empty pool. */
static void atfork_child(void)
{
    pool.nworkers = 0;
    atomic_store(&pool.active, 0);
    atomic_store(&pool.open, 0);
    atomic_store(&pool.sleepers, 0);
    pthread_mutex_init(&pool.submit, NULL);
    pthread_mutex_init(&pool.mu, NULL);
    pthread_cond_init(&pool.cv, NULL);
    pthread_mutex_init(&pool.grow, NULL);
}

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static void register_atfork(void) { pthread_atfork(NULL, NULL, atfork_child); }

/* Starts workers until there are `want` (or thread creation fails); the count started. */
static int grow_to(int want)
{
    pthread_once(&atfork_once, register_atfork);
    pthread_mutex_lock(&pool.grow);
    while (pool.nworkers < want) {
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&at, 1u << 20);
        int rc = pthread_create(&t, &at, worker_main, (void *)(intptr_t)pool.nworkers);
        pthread_attr_destroy(&at);
        if (rc != 0)
            break;
        pool.nworkers++;
    }
    int n = pool.nworkers;
    pthread_mutex_unlock(&pool.grow);
    return n;
}

void tk_ops__parallel_for(int64_t n, int64_t grain, int max_threads, void (*fn)(void *arg, int64_t lo, int64_t hi),
                          void *arg)
{
    if (n <= 0)
        return;
    if (grain < 1)
        grain = 1;
    int nt = max_threads > 0 ? max_threads : tk_ops__threads();
    int64_t ranges = (n + grain - 1) / grain;
    if (nt > ranges)
        nt = (int)ranges;
    if (nt <= 1 || pthread_mutex_trylock(&pool.submit) != 0) {
        fn(arg, 0, n);
        return;
    }
    int helpers = grow_to(nt - 1);
    if (helpers > nt - 1)
        helpers = nt - 1;
    if (helpers < 1) {
        pthread_mutex_unlock(&pool.submit);
        fn(arg, 0, n);
        return;
    }
    pool.fn = fn;
    pool.arg = arg;
    pool.n = n;
    pool.grain = grain;
    pool.helpers = helpers;
    atomic_store(&pool.next, 0);
    atomic_store(&pool.open, 1);
    atomic_fetch_add(&pool.gen, 1);
    if (atomic_load(&pool.sleepers)) {
        pthread_mutex_lock(&pool.mu);
        pthread_cond_broadcast(&pool.cv);
        pthread_mutex_unlock(&pool.mu);
    }
    take_ranges();
    atomic_store(&pool.open, 0);
    for (int spins = 0; atomic_load(&pool.active); spins++) {
        cpu_relax();
        if ((spins & 1023) == 1023)
            sched_yield();
    }
    pthread_mutex_unlock(&pool.submit);
}

void tk_ops__parallel(int64_t n, int64_t cost_per_item, void (*fn)(void *arg, int64_t lo, int64_t hi), void *arg)
{
    if (n <= 0)
        return;
    if (cost_per_item < 1)
        cost_per_item = 1;
    int64_t nt = tk_ops__threads();
    int64_t by_work = (n > INT64_MAX / cost_per_item ? INT64_MAX : n * cost_per_item) / MIN_WORK;
    if (nt > by_work)
        nt = by_work;
    if (nt > n)
        nt = n;
    if (nt <= 1) {
        fn(arg, 0, n);
        return;
    }
    /* About four ranges a thread: a delayed thread costs a quarter of its share. */
    int64_t grain = (n + nt * 4 - 1) / (nt * 4);
    tk_ops__parallel_for(n, grain, (int)nt, fn, arg);
}

/* ---- per-thread scratch ------------------------------------------------------------------------- */

typedef struct {
    void *p[4];
    size_t cap[4];
} scratch_t;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void *p)
{
    scratch_t *s = p;
    for (int i = 0; s && i < 4; i++)
        free(s->p[i]);
    free(s);
}

static void scratch_init(void) { pthread_key_create(&scratch_key, scratch_free); }

void *tk_ops__cpu_scratch(int slot, size_t bytes)
{
    if (slot < 0 || slot >= 4)
        return NULL;
    pthread_once(&scratch_once, scratch_init);
    scratch_t *s = pthread_getspecific(scratch_key);
    if (!s) {
        if (!(s = calloc(1, sizeof *s)))
            return NULL;
        if (pthread_setspecific(scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (s->cap[slot] < bytes) {
        size_t cap = bytes < 4096 ? 4096 : bytes + bytes / 4;
        cap = (cap + 63) / 64 * 64;
        void *p = aligned_alloc(64, cap);
        if (!p)
            return NULL;
        free(s->p[slot]);
        s->p[slot] = p;
        s->cap[slot] = cap;
    }
    return s->p[slot];
}
