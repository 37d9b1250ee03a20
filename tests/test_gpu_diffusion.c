/*
 * test_gpu_diffusion.c — kernels-community/diffusion on a GPU against the CPU references, through
 * tk_op_run on CUDA tensors. Skips without a CUDA device.
 *
 * Both sides compute each element in float64 with the same operations in the same order (the package
 * compiles with --fmad=false), so they agree to the last bit except where CUDA's double log / exp /
 * sin / cos differ from glibc's by an ulp; the tolerance is one ulp of the output dtype (GPU_ULPS):
 *   q_sample, ddpm_posterior (every variance type, with and without log_variance), ddpm_step (every
 *   prediction and variance type, clipping, noise or none, 2c-channel model outputs) and ddim_step
 *   (eta, use_clipped_model_output) in f32 / f16 / bf16 over small, odd and large shapes; the
 *   threshold kernels over rows of 1 to 196608 elements, rows of heavy ties and of one value, and a
 *   row holding a NaN; a timestep outside the table (the CPU refuses it; the kernel makes that row
 *   NaN and leaves the others right); a step in place (prev_sample = sample); randn over odd and
 *   large sizes.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_util.h"
#include "harness.h"
#include "op_test.h"
#include "tensor_util.h"

#define GPU_ULPS 1.0

static const tk_dtype F64 = {TK_DL_FLOAT, 64, 1};
static gpu_ctx g;

#define TA(nm, tp) ((tk_arg){TK_ARG_TENSOR, nm, tp, 0, 0})
#define IA(nm, v) ((tk_arg){TK_ARG_I64, nm, NULL, (v), 0})
#define FA(nm, v) ((tk_arg){TK_ARG_F64, nm, NULL, 0, (v)})

static double ulp1(tk_dtype dt) { return dt.bits == 32 ? 0x1.0p-23 : dt.code == TK_DL_BFLOAT ? 0x1.0p-7 : 0x1.0p-10; }

/* Runs op on the CPU with the host tensors of args, then on the GPU with every tensor uploaded; the
 * outputs named in outs[] (NULL-terminated) start from gpu_out[k] (zeros: poisoned by gpu_op_run, so
 * a skipped element shows) and come back into it. */
static int run_both(const char *op, tk_arg *args, size_t n, const char *const *outs, host_t **gpu_out, int cpu_too,
                    const char **impl)
{
    dev_tensor dev[16];
    const tk_tensor *host[16];
    int rc = TK_OK;
    if (cpu_too && (rc = gpu_op_run(g.ctx, op, args, n, NULL, NULL)) != TK_OK) {
        fprintf(stderr, "%s on the CPU: %s\n", op, tk_last_error());
        return rc;
    }
    for (size_t i = 0; i < n; i++) {
        host[i] = args[i].t;
        memset(&dev[i], 0, sizeof dev[i]);
        if (args[i].kind != TK_ARG_TENSOR)
            continue;
        const tk_tensor *src = args[i].t;
        for (size_t k = 0; outs[k]; k++)
            if (!strcmp(outs[k], args[i].name))
                src = &gpu_out[k]->t;
        if ((rc = dev_upload(&dev[i], src)) != TK_OK)
            goto done;
        args[i].t = &dev[i].t;
    }
    rc = gpu_op_run(g.ctx, op, args, n, NULL, impl);
    if (rc != TK_OK)
        fprintf(stderr, "%s on the GPU: %s\n", op, tk_last_error());
    for (size_t i = 0; rc == TK_OK && i < n; i++)
        for (size_t k = 0; args[i].kind == TK_ARG_TENSOR && outs[k]; k++)
            if (!strcmp(outs[k], args[i].name))
                rc = dev_download(&dev[i], &gpu_out[k]->t);
done:
    for (size_t i = 0; i < n; i++) {
        args[i].t = host[i];
        dev_free(&dev[i]);
    }
    return rc;
}

static int same(const char *what, const host_t *gpu, const host_t *cpu)
{
    tk_dtype dt = cpu->t.dtype;
    op_cmp c = op_cmp_begin(dt.bits == 16 && dt.code != TK_DL_BFLOAT ? 6e-8 : 1e-38, GPU_ULPS * ulp1(dt), "%s (%s %s)",
                            what, tk_ops__dtype_str(dt), tk_ops__shape_fmt(cpu->t.ndim, cpu->t.shape));
    for (int64_t i = 0, n = numel(&cpu->t); i < n; i++)
        op_cmp_at(&c, i, get(&gpu->t, i), get(&cpu->t, i));
    return op_cmp_end(&c);
}

static void rand_table(host_t *ab, int64_t n)
{
    host_new(ab, F64, 1, &n, 0);
    double acc = 1, *v = ab->buf;
    for (int64_t i = 0; i < n; i++) {
        acc *= 1 - uniform(1e-4, 0.02);
        v[i] = acc;
    }
}

static void rand_ts(host_t *ts, host_t *ps, int64_t B, int64_t nt)
{
    host_new(ts, I64, 1, &B, 0);
    host_new(ps, I64, 1, &B, 0);
    int64_t *t = ts->buf, *p = ps->buf;
    for (int64_t b = 0; b < B; b++) {
        t[b] = b == 0 ? 0 : b == 1 ? nt - 1 : (int64_t)(next_u64() % (uint64_t)nt);
        p[b] = b == 2 ? -1 : t[b] - 1 - (int64_t)(next_u64() % 20);
    }
}

/* ---- q_sample and ddpm_posterior ---------------------------------------------------------------- */

static void test_q_posterior(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    const char *pkgs[] = {"kernels-community/diffusion", NULL};
    CHECK_RC(gpu_ctx_new(&g, pkgs), TK_OK);
    static const int64_t shapes[][4] = {{1, 1, 1, 1}, {3, 5, 7, 1}, {4, 4, 64, 64}, {9, 1000, 1, 1}};
    static const int nds[] = {1, 3, 4, 2};
    for (int d = 0; d < 3; d++)
        for (int s = 0; s < 4; s++) {
            tk_dtype dt = *all_dtypes[d];
            int nd = nds[s];
            const int64_t *sh = shapes[s];
            int64_t B = sh[0], nt = 1000;
            host_t x0, x, z, pv, out, gout, mean, gmean, lv, glv, ts, ps, ab;
            host_new(&x0, dt, nd, sh, 0);
            host_new(&x, dt, nd, sh, 0);
            host_new(&z, dt, nd, sh, 0);
            host_new(&pv, dt, nd, sh, 0);
            host_new(&out, dt, nd, sh, 0);
            host_new(&gout, dt, nd, sh, 0);
            host_new(&mean, dt, nd, sh, 0);
            host_new(&gmean, dt, nd, sh, 0);
            host_new(&lv, dt, nd, sh, 0);
            host_new(&glv, dt, nd, sh, 0);
            rand_table(&ab, nt);
            rand_ts(&ts, &ps, B, nt);
            fill(&x0, 3);
            fill(&x, 3);
            fill(&z, 3);
            fill(&pv, 1);
            const char *impl = NULL;
            tk_arg qa[] = {TA("out", &out.t), TA("x0", &x0.t), TA("noise", &z.t), TA("timesteps", &ts.t),
                           TA("alphas_cumprod", &ab.t)};
            static const char *const qo[] = {"out", NULL};
            host_t *qg[] = {&gout};
            CHECK_RC(run_both("q_sample", qa, 5, qo, qg, 1, &impl), TK_OK);
            CHECK(impl && strstr(impl, "kernels-community/diffusion:q_sample_"));
            CHECK(same("q_sample", &gout, &out));
            for (int var = 0; var < 6; var++) {
                if (var == 4) /* learned: a variance > 0 */
                    for (int64_t i = 0; i < numel(&pv.t); i++)
                        set(&pv.t, i, fabs(get(&pv.t, i)) + 0.01);
                int with_lv = var != 3 || s % 2;
                tk_arg pa[] = {TA("mean", &mean.t),         TA("x0", &x0.t),
                               TA("sample", &x.t),          TA("timesteps", &ts.t),
                               TA("prev_timesteps", &ps.t), TA("alphas_cumprod", &ab.t),
                               IA("variance_type", var),    TA("predicted_variance", &pv.t),
                               TA("log_variance", &lv.t)};
                static const char *const po[] = {"mean", "log_variance", NULL};
                host_t *pg[] = {&gmean, &glv};
                memset(gmean.buf, 0, (size_t)numel(&gmean.t) * dt.bits / 8);
                memset(glv.buf, 0, (size_t)numel(&glv.t) * dt.bits / 8);
                CHECK_RC(run_both("ddpm_posterior", pa, with_lv ? 9 : 8, po, pg, 1, NULL), TK_OK);
                CHECK(same("ddpm_posterior mean", &gmean, &mean));
                if (with_lv)
                    CHECK(same("ddpm_posterior log_variance", &glv, &lv));
            }
            host_t *all[] = {&x0, &x, &z, &pv, &out, &gout, &mean, &gmean, &lv, &glv, &ts, &ps, &ab};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
                host_free(all[i]);
        }
    gpu_ctx_free(&g);
}

/* ---- the steps ---------------------------------------------------------------------------------- */

typedef struct {
    int ddim, pred, var, clip, thr, use_clipped, noise, x0;
    double range, ratio, maxv, eta;
    int ties;      /* model output and sample from 3 values: |x0| ties everywhere (thresholding) */
    int nan_row;   /* a NaN in batch row 1 */
    int bad_ts;    /* batch row 1's timestep is outside the table: the kernel makes it NaN */
} step_cfg;

static void step_case(const step_cfg *c, tk_dtype dt, int nd, const int64_t *sh)
{
    int learned = !c->ddim && (c->var == 4 || c->var == 5);
    int64_t msh[4], B = sh[0], nt = 500;
    memcpy(msh, sh, sizeof msh);
    if (learned)
        msh[1] *= 2;
    host_t mo, x, z, prev, gprev, x0, gx0, ts, ps, ab;
    host_new(&mo, dt, nd, msh, 0);
    host_new(&x, dt, nd, sh, 0);
    host_new(&z, dt, nd, sh, 0);
    host_new(&prev, dt, nd, sh, 0);
    host_new(&gprev, dt, nd, sh, 0);
    host_new(&x0, dt, nd, sh, 0);
    host_new(&gx0, dt, nd, sh, 0);
    rand_table(&ab, nt);
    rand_ts(&ts, &ps, B, nt);
    int64_t n = numel(&x.t), row = n / B, mrow = numel(&mo.t) / B;
    for (int64_t i = 0; i < numel(&mo.t); i++) {
        int64_t e = i % mrow;
        double v = c->ties ? (double)((int)(next_u64() % 3) - 1) : uniform(-3, 3);
        set(&mo.t, i, e < row ? v : c->var == 4 ? uniform(0.01, 0.5) : uniform(-1, 1));
    }
    for (int64_t i = 0; i < n; i++)
        set(&x.t, i, c->ties ? (double)((int)(next_u64() % 3) - 1) : uniform(-3, 3));
    fill(&z, 3);
    if (c->nan_row && B > 1)
        set(&x.t, row + row / 2, NAN);
    tk_arg a[16];
    size_t na = 0;
    a[na++] = TA("prev_sample", &prev.t);
    if (c->x0)
        a[na++] = TA("pred_original_sample", &x0.t);
    a[na++] = TA("model_output", &mo.t);
    a[na++] = TA("sample", &x.t);
    a[na++] = TA("timesteps", &ts.t);
    a[na++] = TA("prev_timesteps", &ps.t);
    a[na++] = TA("alphas_cumprod", &ab.t);
    if (c->noise)
        a[na++] = TA("noise", &z.t);
    a[na++] = IA("prediction_type", c->pred);
    a[na++] = IA("clip_sample", c->clip);
    a[na++] = FA("clip_sample_range", c->range);
    a[na++] = IA("thresholding", c->thr);
    a[na++] = FA("dynamic_thresholding_ratio", c->ratio);
    a[na++] = FA("sample_max_value", c->maxv);
    if (c->ddim) {
        a[na++] = FA("eta", c->eta);
        a[na++] = IA("use_clipped_model_output", c->use_clipped);
    } else {
        a[na++] = IA("variance_type", c->var);
    }
    const char *op = c->ddim ? "ddim_step" : "ddpm_step", *impl = NULL;
    static const char *const outs[] = {"prev_sample", "pred_original_sample", NULL};
    host_t *gouts[] = {&gprev, &gx0};
    int64_t *t = ts.buf, keep = t[1];
    int rc = run_both(op, a, na, outs, gouts, 1, &impl);
    CHECK_RC(rc, TK_OK);
    if (rc == TK_OK && c->bad_ts && B > 1) { /* the GPU run again with row 1 out of range */
        t[1] = nt;
        memset(gprev.buf, 0, (size_t)n * dt.bits / 8);
        memset(gx0.buf, 0, (size_t)n * dt.bits / 8);
        CHECK_RC(run_both(op, a, na, outs, gouts, 0, &impl), TK_OK);
        t[1] = keep;
        int ok = 1;
        for (int64_t e = 0; e < row; e++) {
            ok &= isnan(get(&gprev.t, row + e));
            set(&gprev.t, row + e, get(&prev.t, row + e)); /* the other rows must still be right */
            if (c->x0) {
                ok &= isnan(get(&gx0.t, row + e));
                set(&gx0.t, row + e, get(&x0.t, row + e));
            }
        }
        CHECK(ok);
    }
    char what[200];
    snprintf(what, sizeof what, "%s pred %d var %d clip %d thr %d eta %g noise %d ties %d nan %d bad_ts %d [%s]", op,
             c->pred, c->var, c->clip, c->thr, c->eta, c->noise, c->ties, c->nan_row, c->bad_ts, impl ? impl : "?");
    CHECK(impl && (strstr(impl, "_threshold") != NULL) == (c->thr != 0));
    if (rc == TK_OK) {
        CHECK(same(what, &gprev, &prev));
        if (c->x0)
            CHECK(same(what, &gx0, &x0));
    }
    host_t *all[] = {&mo, &x, &z, &prev, &gprev, &x0, &gx0, &ts, &ps, &ab};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        host_free(all[i]);
}

static void test_steps(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    const char *pkgs[] = {"kernels-community/diffusion", NULL};
    CHECK_RC(gpu_ctx_new(&g, pkgs), TK_OK);
    static const int64_t shapes[][4] = {{1, 1, 1, 1}, {3, 5, 7, 1}, {4, 4, 32, 32}, {2, 1000, 1, 1}};
    static const int nds[] = {2, 3, 4, 2};
    for (int d = 0; d < 3; d++)
        for (int s = 0; s < 4; s++)
            for (int k = 0; k < 10; k++) {
                step_cfg c = {0};
                c.ddim = k % 2;
                c.pred = (k / 2) % 3;
                c.var = c.ddim ? 0 : (int[]){0, 1, 2, 4, 5}[k / 2];
                c.clip = k % 3 != 0;
                c.range = uniform(0.5, 2);
                c.use_clipped = k % 4 == 1;
                c.noise = k != 4;
                c.x0 = k % 5 != 3;
                c.eta = k % 3 == 0 ? 0 : uniform(0.1, 1);
                c.bad_ts = k == 7;
                c.ratio = 0.995;
                c.maxv = 1;
                step_case(&c, *all_dtypes[d], nds[s], shapes[s]);
            }
    gpu_ctx_free(&g);
}

static void test_threshold(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    const char *pkgs[] = {"kernels-community/diffusion", NULL};
    CHECK_RC(gpu_ctx_new(&g, pkgs), TK_OK);
    static const int64_t shapes[][4] = {{2, 1, 1, 1}, {3, 3, 5, 7}, {2, 4, 128, 128}, {1, 3, 256, 256}, {4, 2, 33, 1}};
    static const int nds[] = {2, 4, 4, 4, 3};
    for (int d = 0; d < 3; d++)
        for (int s = 0; s < 5; s++)
            for (int k = 0; k < 6; k++) {
                if (s == 3 && k > 1)
                    continue; /* one large row per kind is enough */
                step_cfg c = {0};
                c.ddim = k % 2;
                c.pred = k % 3;
                c.var = c.ddim ? 0 : k == 4 ? 5 : 0;
                c.thr = 1;
                c.noise = 1;
                c.x0 = 1;
                c.eta = c.ddim ? 0.7 : 0;
                c.ratio = (double[]){0.995, 0.5, 0.9, 1.0, 0.0, 0.73}[k];
                c.maxv = uniform(1, 3);
                c.ties = k == 2 || k == 3;
                c.nan_row = k == 5;
                c.bad_ts = k == 4;
                step_case(&c, *all_dtypes[d], nds[s], shapes[s]);
            }
    gpu_ctx_free(&g);
}

/* A step in place on the GPU: prev_sample and sample are one device tensor. */
static void test_in_place(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    const char *pkgs[] = {"kernels-community/diffusion", NULL};
    CHECK_RC(gpu_ctx_new(&g, pkgs), TK_OK);
    int64_t sh[4] = {2, 4, 16, 16}, B = 2;
    for (int thr = 0; thr < 2; thr++) {
        host_t mo, x, prev, got, ts, ps, ab;
        host_new(&mo, BF16, 4, sh, 0);
        host_new(&x, BF16, 4, sh, 0);
        host_new(&prev, BF16, 4, sh, 0);
        host_new(&got, BF16, 4, sh, 0);
        rand_table(&ab, 100);
        rand_ts(&ts, &ps, B, 100);
        fill(&mo, 2);
        fill(&x, 2);
        tk_arg a[] = {TA("prev_sample", &prev.t), TA("model_output", &mo.t),   TA("sample", &x.t),
                      TA("timesteps", &ts.t),     TA("prev_timesteps", &ps.t), TA("alphas_cumprod", &ab.t),
                      IA("thresholding", thr)};
        CHECK_RC(gpu_op_run(g.ctx, "ddim_step", a, 7, NULL, NULL), TK_OK);
        dev_tensor dm, dx, dt_, dp, da;
        CHECK_RC(dev_upload(&dm, &mo.t), TK_OK);
        CHECK_RC(dev_upload(&dx, &x.t), TK_OK);
        CHECK_RC(dev_upload(&dt_, &ts.t), TK_OK);
        CHECK_RC(dev_upload(&dp, &ps.t), TK_OK);
        CHECK_RC(dev_upload(&da, &ab.t), TK_OK);
        tk_arg d[] = {TA("prev_sample", &dx.t), TA("model_output", &dm.t),   TA("sample", &dx.t),
                      TA("timesteps", &dt_.t),  TA("prev_timesteps", &dp.t), TA("alphas_cumprod", &da.t),
                      IA("thresholding", thr)};
        CHECK_RC(gpu_op_run(g.ctx, "ddim_step", d, 7, NULL, NULL), TK_OK);
        CHECK_RC(dev_download(&dx, &got.t), TK_OK);
        CHECK(same("ddim_step in place", &got, &prev));
        dev_free(&dm);
        dev_free(&dx);
        dev_free(&dt_);
        dev_free(&dp);
        dev_free(&da);
        host_t *all[] = {&mo, &x, &prev, &got, &ts, &ps, &ab};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            host_free(all[i]);
    }
    gpu_ctx_free(&g);
}

static void test_randn(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    const char *pkgs[] = {"kernels-community/diffusion", NULL};
    CHECK_RC(gpu_ctx_new(&g, pkgs), TK_OK);
    static const int64_t sizes[] = {1, 2, 7, 4096, 1000001};
    for (int d = 0; d < 3; d++)
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            host_t out, gout;
            host_new(&out, *all_dtypes[d], 1, &sizes[s], 0);
            host_new(&gout, *all_dtypes[d], 1, &sizes[s], 0);
            tk_arg a[] = {TA("out", &out.t), IA("seed", (int64_t)next_u64()), IA("offset", (int64_t)s)};
            static const char *const outs[] = {"out", NULL};
            host_t *g1[] = {&gout};
            CHECK_RC(run_both("randn", a, 3, outs, g1, 1, NULL), TK_OK);
            CHECK(same("randn", &gout, &out));
            host_free(&out);
            host_free(&gout);
        }
    gpu_ctx_free(&g);
}

static void test_coverage(void)
{
    const char *pkgs[] = {"kernels-community/diffusion", NULL};
    gpu_coverage_check(pkgs);
}

int main(int argc, char **argv)
{
    static const char *const ops[] = {"q_sample", "ddpm_posterior", "ddpm_step", "ddim_step", "randn", NULL};
    gpu_main(argc, argv, ops);
    op_test_seed();
    RUN(test_q_posterior);
    RUN(test_steps);
    RUN(test_threshold);
    RUN(test_in_place);
    RUN(test_randn);
    RUN(test_coverage);
    return th_done();
}
