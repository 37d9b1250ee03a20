/*
 * parallel.c — splits a CPU reference's work over threads (pthreads, one contiguous range each).
 *
 * Threads are created per call and joined before returning: the references are meant to be correct
 * and reasonably quick, not a thread-pool runtime. The count is bounded by the online cores and by
 * the work, so small calls run on the calling thread alone.
 */
#include <pthread.h>
#include <unistd.h>

#include "ops/ops.h"

#define TK_OPS_MAX_THREADS 64
/* Below this much work (elements x cost) a thread costs more than it saves. */
#define TK_OPS_MIN_WORK (1 << 15)

typedef struct {
    void (*fn)(void *arg, int64_t lo, int64_t hi);
    void *arg;
    int64_t lo, hi;
} range_job;

static void *range_main(void *p)
{
    range_job *j = p;
    j->fn(j->arg, j->lo, j->hi);
    return NULL;
}

void tk_ops__parallel(int64_t n, int64_t cost_per_item, void (*fn)(void *arg, int64_t lo, int64_t hi),
                      void *arg)
{
    if (n <= 0)
        return;
    if (cost_per_item < 1)
        cost_per_item = 1;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int64_t nt = cores > 0 ? cores : 1;
    if (nt > TK_OPS_MAX_THREADS)
        nt = TK_OPS_MAX_THREADS;
    int64_t by_work = (n > INT64_MAX / cost_per_item ? INT64_MAX : n * cost_per_item) / TK_OPS_MIN_WORK;
    if (nt > by_work)
        nt = by_work;
    if (nt > n)
        nt = n;
    if (nt <= 1) {
        fn(arg, 0, n);
        return;
    }

    pthread_t tid[TK_OPS_MAX_THREADS];
    range_job jobs[TK_OPS_MAX_THREADS];
    int started[TK_OPS_MAX_THREADS] = {0};
    int64_t per = n / nt, extra = n % nt, lo = 0;
    for (int64_t k = 0; k < nt; k++) {
        int64_t cnt = per + (k < extra ? 1 : 0);
        jobs[k] = (range_job){fn, arg, lo, lo + cnt};
        lo += cnt;
    }
    /* Job 0 runs on the calling thread; a job whose thread cannot start runs here too. */
    for (int64_t k = 1; k < nt; k++)
        started[k] = pthread_create(&tid[k], NULL, range_main, &jobs[k]) == 0;
    range_main(&jobs[0]);
    for (int64_t k = 1; k < nt; k++) {
        if (started[k])
            pthread_join(tid[k], NULL);
        else
            range_main(&jobs[k]);
    }
}
