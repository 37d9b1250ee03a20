/*
 * linear_small.c — linear at small M (a short prefill's rows) over the weights of several SmolLM-135M
 * layers (q, k, v, o, gate, up, down: 576 / 192 / 1536 wide), so that they stream from memory as in a
 * model (LAYERS layers, 14 MB of f32 weights each: far past the L3), through the implementation
 * tk_op_run picks. For each M it runs every weight once per rep and prints the median (and best) per
 * layer of the wall time and of the process's CPU time (CPU time: the figure to compare on a loaded
 * machine, with TK_NUM_THREADS=1).
 *
 *     build/bench/linear_small [dtype=f32|bf16|f16|i8] [reps=7] [M ...]   (default M: 1 4 5 6 8 12 16 22 32 48 64)
 *     i8: casted_linear (--quant int8's op): i8 weights with an f32 scale per row, f32 x
 *     LAYERS=8 (default)
 *
 * To compare with another build of ops/cpu_linear.c, link this file against that build's libtk.a and
 * alternate the two binaries (bench/RESULTS.md).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ops/cpu.h"
#include "ops/ops.h"

static double clk(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct {
    tk_tensor t;
    int64_t shape[2];
} ten;

static void mk(ten *x, tk_dtype dt, int64_t r, int64_t c, double lo, double hi)
{
    memset(x, 0, sizeof *x);
    x->shape[0] = r;
    x->shape[1] = c;
    size_t n = (size_t)(r * c);
    x->t.data = aligned_alloc(64, (n * dt.bits / 8 + 64) / 64 * 64);
    x->t.device.device_type = TK_DEV_CPU;
    x->t.ndim = 2;
    x->t.dtype = dt;
    x->t.shape = x->shape;
    if (dt.code == TK_DL_INT) { /* the caller fills it */
        memset(x->t.data, 0, n * dt.bits / 8);
        return;
    }
    float f[4096];
    for (size_t i = 0; i < n; i += 4096) {
        size_t cnt = n - i < 4096 ? n - i : 4096;
        for (size_t k = 0; k < cnt; k++)
            f[k] = (float)(lo + (hi - lo) * (double)((i + k) * 2654435761u % 1000003) / 1000003.0);
        tk_ops__store_f32(x->t.data, (int64_t)i, 1, f, (int64_t)cnt, dt);
    }
}

int main(int argc, char **argv)
{
    const char *dn = argc > 1 ? argv[1] : "f32";
    int reps = argc > 2 ? atoi(argv[2]) : 7;
    if (reps < 1 || reps > 99)
        reps = 7;
    int64_t defm[] = {1, 4, 5, 6, 8, 12, 16, 22, 32, 48, 64}, ms[64];
    int nm = 0;
    for (int i = 3; i < argc && nm < 64; i++)
        ms[nm++] = strtoll(argv[i], NULL, 10);
    if (!nm)
        for (size_t i = 0; i < sizeof defm / sizeof defm[0]; i++)
            ms[nm++] = defm[i];
    tk_dtype dt = {TK_DL_FLOAT, 32, 1}, wdt = dt;
    int i8 = !strcmp(dn, "i8");
    if (i8)
        wdt = (tk_dtype){TK_DL_INT, 8, 1};
    else if (!strcmp(dn, "bf16"))
        dt = (tk_dtype){TK_DL_BFLOAT, 16, 1};
    else if (!strcmp(dn, "f16"))
        dt = (tk_dtype){TK_DL_FLOAT, 16, 1};
    if (!i8)
        wdt = dt;
    const char *le = getenv("LAYERS");
    int layers = le ? atoi(le) : 8;
    if (layers < 1 || layers > 64)
        layers = 8;
    static const int64_t shp[7][2] = {{576, 576},  {192, 576},  {192, 576}, {576, 576},
                                      {1536, 576}, {1536, 576}, {576, 1536}};
    int nw = 7 * layers;
    ten *w = calloc((size_t)nw, sizeof *w), sc;
    for (int i = 0; i < nw; i++) {
        mk(&w[i], wdt, shp[i % 7][0], shp[i % 7][1], i8 ? -127 : -0.05, i8 ? 127 : 0.05);
        if (i8) /* mk's f32 -> i8 store: keep the values in range as integers */
            for (int64_t e = 0; e < shp[i % 7][0] * shp[i % 7][1]; e++)
                ((int8_t *)w[i].t.data)[e] = (int8_t)((e * 2654435761u % 255) - 127);
    }
    mk(&sc, dt, 1, 1536, 0.0001, 0.001);
    sc.t.ndim = 1;
    printf("linear_small: %s weights and x, %d layers (%.0f MB of weights), threads %d, reps %d\n", dn, layers,
           (double)layers * 3.54e6 * wdt.bits / 8 / 1e6, tk_ops__threads(), reps);
    for (int mi = 0; mi < nm; mi++) {
        int64_t m = ms[mi];
        ten x, o;
        mk(&x, dt, m, 1536, -1, 1);
        mk(&o, dt, m, 1536, 0, 0);
        tk_op_call *c = calloc((size_t)nw, sizeof *c);
        const tk_cpu_impl **im = calloc((size_t)nw, sizeof *im);
        for (int i = 0; i < nw; i++) {
            int64_t n = shp[i % 7][0], k = shp[i % 7][1];
            /* views of x and out with this call's widths (x's rows are 1536 apart) */
            static tk_tensor xv[7], ov[7];
            static int64_t xs[7][2], os[7][2], xst[7][2], ost[7][2];
            int s = i % 7;
            xv[s] = x.t;
            xs[s][0] = m;
            xs[s][1] = k;
            xst[s][0] = 1536;
            xst[s][1] = 1;
            xv[s].shape = xs[s];
            xv[s].strides = xst[s];
            ov[s] = o.t;
            os[s][0] = m;
            os[s][1] = n;
            ost[s][0] = 1536;
            ost[s][1] = 1;
            ov[s].shape = os[s];
            ov[s].strides = ost[s];
            static tk_tensor sv[7];
            static int64_t ss[7];
            sv[s] = sc.t;
            ss[s] = n;
            sv[s].shape = &ss[s];
            tk_arg a[4] = {{TK_ARG_TENSOR, "out", &ov[s], 0, 0},
                           {TK_ARG_TENSOR, "x", &xv[s], 0, 0},
                           {TK_ARG_TENSOR, "weight", &w[i].t, 0, 0},
                           {TK_ARG_TENSOR, "scale", &sv[s], 0, 0}};
            if (tk_ops__prepare(&c[i], i8 ? "casted_linear" : "linear", a, i8 ? 4 : 3) != TK_OK) {
                fprintf(stderr, "linear_small: %s\n", tk_last_error());
                return 1;
            }
            im[i] = tk_ops__cpu_pick(&c[i]);
        }
        double tw[99], tc[99];
        for (int r = -1; r < reps; r++) {
            double w0 = clk(CLOCK_MONOTONIC), c0 = clk(CLOCK_PROCESS_CPUTIME_ID);
            for (int i = 0; i < nw; i++)
                if ((im[i] ? im[i]->run(&c[i]) : tk_ops__run_cpu(&c[i])) != TK_OK) {
                    fprintf(stderr, "linear_small: %s\n", tk_last_error());
                    return 1;
                }
            if (r >= 0) {
                tw[r] = (clk(CLOCK_MONOTONIC) - w0) / layers;
                tc[r] = (clk(CLOCK_PROCESS_CPUTIME_ID) - c0) / layers;
            }
        }
        qsort(tw, (size_t)reps, sizeof *tw, cmp_d);
        qsort(tc, (size_t)reps, sizeof *tc, cmp_d);
        printf("{\"dtype\": \"%s\", \"m\": %lld, \"impl\": \"%s\", \"wall_ms\": %.3f, \"wall_best_ms\": %.3f, "
               "\"cpu_ms\": %.3f, \"cpu_best_ms\": %.3f}\n",
               dn, (long long)m, im[0] ? im[0]->impl : "reference", tw[reps / 2] * 1e3, tw[0] * 1e3, tc[reps / 2] * 1e3,
               tc[0] * 1e3);
        fflush(stdout);
        free(c);
        free(im);
        free(x.t.data);
        free(o.t.data);
    }
    for (int i = 0; i < nw; i++)
        free(w[i].t.data);
    free(w);
    free(sc.t.data);
    return 0;
}
