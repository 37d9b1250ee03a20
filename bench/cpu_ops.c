/*
 * cpu_ops.c — each op of a Llama decoder on SmolLM-135M's shapes (hidden 576, 9 heads of 64, 3 KV
 * heads, intermediate 1536, vocabulary 49152), run by its CPU reference and by the implementation
 * tk_op_run picks (ops/cpu_*.c), alternating, in f32 and bf16: the median time of each and the ratio.
 * Decode shapes (one token) and prefill shapes (128 tokens). bench/RESULTS.md has the figures.
 *
 *     build/bench/cpu_ops [reps=7] [filter]       TK_NUM_THREADS sets the threads (default: all)
 *     CPU_OPS_BASE=cpu-avx2 build/bench/cpu_ops 7 casted     the picked implementation against another
 *                                                           one of the op (named), not the reference
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ops/cpu.h"
#include "ops/ops.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct {
    tk_tensor t;
    int64_t shape[4];
} ten;

static void mk(ten *x, tk_dtype dt, int nd, const int64_t *shape, double lo, double hi)
{
    memset(x, 0, sizeof *x);
    int64_t n = 1;
    for (int i = 0; i < nd; i++)
        n *= (x->shape[i] = shape[i]);
    x->t.data = aligned_alloc(64, ((size_t)n * dt.bits / 8 + 64) / 64 * 64);
    x->t.device.device_type = TK_DEV_CPU;
    x->t.ndim = nd;
    x->t.dtype = dt;
    x->t.shape = x->shape;
    if (dt.code == TK_DL_INT && dt.bits > 8) { /* ids, tables: the caller fills them */
        memset(x->t.data, 0, (size_t)n * dt.bits / 8);
        return;
    }
    float *f = malloc(4 * 4096);
    for (int64_t i = 0; i < n; i += 4096) {
        int64_t c = n - i < 4096 ? n - i : 4096;
        for (int64_t k = 0; k < c; k++)
            f[k] = (float)(lo + (hi - lo) * (double)((i + k) * 2654435761u % 1000003) / 1000003.0);
        tk_ops__store_f32(x->t.data, i, 1, f, c, dt);
    }
    free(f);
}

static int cmp_d(const void *a, const void *b) { return *(const double *)a < *(const double *)b ? -1 : 1; }

static int reps = 7;

static void run_case(const char *name, const char *op, tk_arg *a, size_t n, double flops, double bytes)
{
    tk_op_call c;
    if (tk_ops__prepare(&c, op, a, n) != TK_OK) {
        fprintf(stderr, "%s: %s\n", name, tk_last_error());
        exit(1);
    }
    const tk_cpu_impl *im = tk_ops__cpu_pick(&c), *base = NULL;
    const char *bn = getenv("CPU_OPS_BASE");
    for (size_t i = 0; bn && i < tk_ops__cpu_impl_count(); i++) {
        const tk_cpu_impl *b = tk_ops__cpu_impl_at(i);
        if (!strcmp(b->op, op) && !strcmp(b->impl, bn) && tk_ops__cpu_impl_usable(b) && b->fits(&c))
            base = b;
    }
    double tr[64], tf[64];
    base ? base->run(&c) : tk_ops__run_cpu(&c);
    if (im)
        im->run(&c);
    for (int r = 0; r < reps; r++) { /* alternating: the load of a shared machine hits both alike */
        double t0 = now();
        base ? base->run(&c) : tk_ops__run_cpu(&c);
        tr[r] = now() - t0;
        t0 = now();
        if (im)
            im->run(&c);
        else
            tk_ops__run_cpu(&c);
        tf[r] = now() - t0;
    }
    qsort(tr, (size_t)reps, sizeof *tr, cmp_d);
    qsort(tf, (size_t)reps, sizeof *tf, cmp_d);
    double mr = tr[reps / 2], mf = tf[reps / 2];
    printf("%-44s %-12s %9.3f ms  %-12s %9.3f ms  x%6.2f", name, base ? base->impl : "reference", mr * 1e3,
           im ? im->impl : "(reference)", mf * 1e3, mr / mf);
    if (flops > 0)
        printf("  %6.1f GFLOP/s", flops / mf * 1e-9);
    if (bytes > 0)
        printf("  %6.2f GB/s", bytes / mf * 1e-9);
    printf("\n");
    fflush(stdout);
}

static tk_arg T(const char *nm, ten *x) { return (tk_arg){TK_ARG_TENSOR, nm, &x->t, 0, 0}; }

static const tk_dtype F32 = {TK_DL_FLOAT, 32, 1}, BF16 = {TK_DL_BFLOAT, 16, 1}, I8 = {TK_DL_INT, 8, 1};
static const int64_t H = 576, I = 1536, V = 49152; /* SmolLM-135M's shapes */
static const int64_t lin[][2] = {{576, 576}, {192, 576}, {3072, 576}, {576, 1536}, {49152, 576}};

/* linear in f32 and bf16 at 1 and 128 rows over the model's weight shapes. */
static void bench_linear(const char *filter)
{
    const tk_dtype dts[2] = {F32, BF16};
    for (int d = 0; d < 2; d++) {
        tk_dtype dt = dts[d];
        const char *dn = d ? "bf16" : "f32";
        for (int64_t m = 1; m <= 128; m += 127)
            for (size_t l = 0; l < sizeof lin / sizeof lin[0]; l++) {
                int64_t N = lin[l][0], K = lin[l][1];
                if (m == 128 && N == V)
                    continue;
                char name[96];
                snprintf(name, sizeof name, "linear %s M %lld N %lld K %lld", dn, (long long)m, (long long)N,
                         (long long)K);
                if (filter && !strstr(name, filter))
                    continue;
                ten x, w, o;
                int64_t xs[2] = {m, K}, ws[2] = {N, K}, os[2] = {m, N};
                mk(&x, dt, 2, xs, -1, 1);
                mk(&w, dt, 2, ws, -0.05, 0.05);
                mk(&o, dt, 2, os, 0, 0);
                tk_arg a[] = {T("out", &o), T("x", &x), T("weight", &w)};
                run_case(name, "linear", a, 3, 2.0 * m * N * K, m <= 4 ? (double)N * K * dt.bits / 8 : 0);
                free(x.t.data);
                free(w.t.data);
                free(o.t.data);
            }
    }
}

/* casted_linear: i8 weights, f32 x. */
static void bench_casted(const char *filter)
{
    for (int64_t m = 1; m <= 128; m += 127)
        for (size_t l = 0; l < sizeof lin / sizeof lin[0]; l++) {
            int64_t N = lin[l][0], K = lin[l][1];
            if (m == 128 && N == V)
                continue;
            char name[96];
            snprintf(name, sizeof name, "casted_linear i8 M %lld N %lld K %lld", (long long)m, (long long)N,
                     (long long)K);
            if (filter && !strstr(name, filter))
                continue;
            ten x, w, s, o;
            int64_t xs[2] = {m, K}, ws[2] = {N, K}, ns[1] = {N}, os[2] = {m, N};
            mk(&x, F32, 2, xs, -1, 1);
            mk(&w, I8, 2, ws, -100, 100);
            mk(&s, F32, 1, ns, 0.001, 0.002);
            mk(&o, F32, 2, os, 0, 0);
            tk_arg a[] = {T("out", &o), T("x", &x), T("weight", &w), T("scale", &s)};
            run_case(name, "casted_linear", a, 4, 2.0 * m * N * K, m <= 4 ? (double)N * K : 0);
            free(x.t.data);
            free(w.t.data);
            free(s.t.data);
            free(o.t.data);
        }
}

/* Prefill attention (128 tokens, causal) and decode attention (1 query, 256 cached keys). */
static void bench_attention(tk_dtype dt, const char *dn, const char *filter)
{
    char name[96];
    /* prefill attention: 128 tokens, causal */
    snprintf(name, sizeof name, "attention %s 128 tokens causal", dn);
    if (!filter || strstr(name, filter)) {
        ten q, k, v, o;
        int64_t qs[4] = {1, 128, 9, 64}, ks[4] = {1, 128, 3, 64};
        mk(&q, dt, 4, qs, -1, 1);
        mk(&k, dt, 4, ks, -1, 1);
        mk(&v, dt, 4, ks, -1, 1);
        mk(&o, dt, 4, qs, 0, 0);
        tk_arg a[] = {T("out", &o), T("q", &q), T("k", &k), T("v", &v), {TK_ARG_I64, "causal", NULL, 1, 0}};
        run_case(name, "attention", a, 5, 2.0 * 2 * 9 * 64 * 128 * 129 / 2, 0);
        free(q.t.data), free(k.t.data), free(v.t.data), free(o.t.data);
    }
    /* decode attention: 1 query over 256 cached keys, 16-key blocks */
    snprintf(name, sizeof name, "attention_decode %s 256 keys", dn);
    if (!filter || strstr(name, filter)) {
        ten q, o, kc, vc, bt, sl;
        int64_t qs[4] = {1, 1, 9, 64}, cs[4] = {16, 16, 3, 64}, bs[2] = {1, 16}, ls[1] = {1};
        mk(&q, dt, 4, qs, -1, 1);
        mk(&o, dt, 4, qs, 0, 0);
        mk(&kc, dt, 4, cs, -1, 1);
        mk(&vc, dt, 4, cs, -1, 1);
        tk_dtype I32 = {TK_DL_INT, 32, 1};
        mk(&bt, I32, 2, bs, 0, 0);
        mk(&sl, I32, 1, ls, 0, 0);
        for (int i = 0; i < 16; i++)
            ((int32_t *)bt.t.data)[i] = 15 - i;
        ((int32_t *)sl.t.data)[0] = 256;
        tk_arg a[] = {T("out", &o),          T("q", &q),        T("k_cache", &kc), T("v_cache", &vc),
                      T("block_table", &bt), T("seq_lens", &sl)};
        run_case(name, "attention_decode", a, 6, 2.0 * 2 * 9 * 64 * 256, 0);
        free(q.t.data), free(o.t.data), free(kc.t.data), free(vc.t.data), free(bt.t.data), free(sl.t.data);
    }
}

/* The fused and elementwise ops at 1 and 128 rows. */
static void bench_elementwise(tk_dtype dt, const char *dn, const char *filter)
{
    char name[96];
    for (int64_t m = 1; m <= 128; m += 127) {
        snprintf(name, sizeof name, "fused_add_rms_norm %s [%lld, %lld]", dn, (long long)m, (long long)H);
        if (!filter || strstr(name, filter)) {
            ten x, r, w;
            int64_t s2[2] = {m, H}, s1[1] = {H};
            mk(&x, dt, 2, s2, -1, 1);
            mk(&r, dt, 2, s2, -1, 1);
            mk(&w, dt, 1, s1, 0.5, 1.5);
            tk_arg a[] = {T("input", &x), T("residual", &r), T("weight", &w), {TK_ARG_F64, "eps", NULL, 0, 1e-5}};
            run_case(name, "fused_add_rms_norm", a, 4, 0, 0);
            free(x.t.data), free(r.t.data), free(w.t.data);
        }
        snprintf(name, sizeof name, "silu_and_mul %s [%lld, %lld]", dn, (long long)m, (long long)(2 * I));
        if (!filter || strstr(name, filter)) {
            ten in, o;
            int64_t s2[2] = {m, 2 * I}, so[2] = {m, I};
            mk(&in, dt, 2, s2, -4, 4);
            mk(&o, dt, 2, so, 0, 0);
            tk_arg a[] = {T("out", &o), T("input", &in)};
            run_case(name, "silu_and_mul", a, 2, 0, 0);
            free(in.t.data), free(o.t.data);
        }
        snprintf(name, sizeof name, "softcap %s [%lld, 256000] (Gemma 2's final logits)", dn, (long long)m);
        if (m == 1 && (!filter || strstr(name, filter))) {
            ten x;
            int64_t s2[2] = {m, 256000};
            mk(&x, dt, 2, s2, -60, 60);
            tk_arg a[] = {T("out", &x), T("input", &x), {TK_ARG_F64, "cap", NULL, 0, 30.0}};
            run_case(name, "softcap", a, 3, 0, 0);
            free(x.t.data);
        }
        snprintf(name, sizeof name, "rotary_embedding %s %lld tokens", dn, (long long)m);
        if (!filter || strstr(name, filter)) {
            ten q, k, p, cs;
            int64_t qs[3] = {m, 9, 64}, ks[3] = {m, 3, 64}, ps[1] = {m}, css[2] = {2048, 64};
            mk(&q, dt, 3, qs, -1, 1);
            mk(&k, dt, 3, ks, -1, 1);
            tk_dtype I64 = {TK_DL_INT, 64, 1};
            mk(&p, I64, 1, ps, 0, 0);
            for (int64_t i = 0; i < m; i++)
                ((int64_t *)p.t.data)[i] = i;
            mk(&cs, F32, 2, css, -1, 1);
            tk_arg a[] = {T("query", &q), T("key", &k), T("positions", &p), T("cos_sin_cache", &cs)};
            run_case(name, "rotary_embedding", a, 4, 0, 0);
            free(q.t.data), free(k.t.data), free(p.t.data), free(cs.t.data);
        }
    }
}

int main(int argc, char **argv)
{
    reps = argc > 1 ? atoi(argv[1]) : 7;
    if (reps < 1 || reps > 64)
        reps = 7;
    const char *filter = argc > 2 ? argv[2] : NULL;
    printf("threads %d, reps %d (median), cpu features:", tk_ops__threads(), reps);
    for (unsigned b = 1; b; b <<= 1)
        if ((tk_ops__cpu_features() & b) && tk_ops__cpu_feature_str(b))
            printf(" %s", tk_ops__cpu_feature_str(b));
    printf("\n");
    bench_linear(filter);
    bench_casted(filter);
    for (int d = 0; d < 2; d++) {
        bench_attention(d ? BF16 : F32, d ? "bf16" : "f32", filter);
        bench_elementwise(d ? BF16 : F32, d ? "bf16" : "f32", filter);
    }
    return 0;
}
