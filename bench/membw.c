/*
 * membw.c — the machine's memory bandwidth, the bound on decode (every weight is read once per token):
 * a copy loop (STREAM's copy: bytes read + bytes written over the time) and a read loop (a sum), over
 * arrays far larger than the caches, on N threads, each thread its own contiguous slice. The best of
 * several passes, in GB/s.
 *
 *     build/bench/membw [threads=all] [MiB per array=512] [passes=5]      prints one JSON line
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    double *a, *b;
    size_t n;
    int read;
    double sum;
} job;

static void *run(void *p)
{
    job *j = p;
    if (j->read) {
        double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (size_t i = 0; i + 4 <= j->n; i += 4) {
            s0 += j->a[i];
            s1 += j->a[i + 1];
            s2 += j->a[i + 2];
            s3 += j->a[i + 3];
        }
        j->sum = s0 + s1 + s2 + s3;
    } else {
        memcpy(j->b, j->a, j->n * sizeof(double));
    }
    return NULL;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double pass(double *a, double *b, size_t n, int nt, int read)
{
    pthread_t t[256];
    job j[256];
    double t0 = now();
    for (int k = 0; k < nt; k++) {
        size_t lo = n / nt * k, hi = k == nt - 1 ? n : n / nt * (k + 1);
        j[k] = (job){a + lo, b + lo, hi - lo, read, 0};
        pthread_create(&t[k], NULL, run, &j[k]);
    }
    for (int k = 0; k < nt; k++)
        pthread_join(t[k], NULL);
    return now() - t0;
}

int main(int argc, char **argv)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = argc > 1 ? atoi(argv[1]) : (int)cpus;
    size_t mib = argc > 2 ? (size_t)atol(argv[2]) : 512;
    int passes = argc > 3 ? atoi(argv[3]) : 5;
    if (nt < 1 || nt > 256 || mib < 16 || passes < 1) {
        fprintf(stderr, "usage: membw [threads 1..256] [MiB >= 16] [passes >= 1]\n");
        return 2;
    }
    size_t n = mib * 1024 * 1024 / sizeof(double);
    double *a = malloc(n * sizeof(double)), *b = malloc(n * sizeof(double));
    if (!a || !b) {
        fprintf(stderr, "membw: out of memory for 2 x %zu MiB\n", mib);
        return 1;
    }
    for (size_t i = 0; i < n; i++)
        a[i] = (double)(i & 1023), b[i] = 0;
    double copy = 1e30, rd = 1e30;
    for (int p = 0; p < passes; p++) {
        double c = pass(a, b, n, nt, 0), r = pass(a, b, n, nt, 1);
        copy = c < copy ? c : copy;
        rd = r < rd ? r : rd;
    }
    double bytes = (double)n * sizeof(double);
    printf("{\"threads\": %d, \"mib\": %zu, \"copy_gb_s\": %.2f, \"read_gb_s\": %.2f}\n", nt, mib,
           2 * bytes / copy / 1e9, bytes / rd / 1e9);
    free(a);
    free(b);
    return 0;
}
