/*
 * test_ops_diffusion.c — the noise-schedule ops (ops/diffusion.c) and tk.h's schedule calls:
 *   - tk_noise_schedule against closed forms (linear endpoints, the telescoping products of the
 *     alpha_bar schedules, zero terminal SNR) and tk_diffusion_timesteps against hand-worked lists;
 *     their errors, and that a failed call writes nothing;
 *   - q_sample, ddpm_posterior, ddpm_step, ddim_step on random tensors (f32, f16, bf16; contiguous and
 *     strided; per-row timesteps, a prev of -1; every prediction and variance type, clipping,
 *     thresholding, eta, with and without noise) against this file's own float64 formulas: within
 *     one rounding of the output dtype (FLOAT64_ULPS);
 *   - steps in place (prev_sample = sample); randn's moments, determinism and strides; validation
 *     messages, and outputs left untouched by a refused call;
 *   - diffusers itself (tests/diffusion_oracle.py in $TK_PY_VENV): the schedules and timestep lists of
 *     DDPMScheduler / DDIMScheduler, add_noise, the DDPM posterior, and whole sampling runs of 20 to
 *     1000 steps over 13 configurations (every schedule, spacing, prediction and variance type,
 *     clipping, thresholding, eta, zero terminal SNR). Each step of tk runs on diffusers' own x_t,
 *     model output and noise ("teacher forcing"), with tk's float64 table, and is compared twice:
 *       * with diffusers run in float64 on the same inputs and table: the same formulas, so within
 *         EXACT_ULPS of fp32 (one rounding); with thresholding, whose float64 torch.quantile is not
 *         tk's fp32 one, the threshold s differs by an fp32 rounding, so EXACT_ULPS_THR ulps of the
 *         terms as well (|x_t| + 1: x0 / s is within [-1, 1]);
 *       * with diffusers as users run it, all float32 on its own float32 tables: |diff| <= F32_ATOL +
 *         F32_RTOL * |want|. The difference is diffusers' float32 error: its cumulative product of
 *         1000 alphas (~1e-6 relative), and 1 - ab_t / ab_prev and 1 - ab_prev at the last steps,
 *         where beta ~ 1e-4 makes one f32 rounding a 1e-3 relative error of the posterior's
 *         coefficients (8.2e-5 absolute at worst over these runs);
 *     and tk's own free-running trajectory (its x_t, the same stand-in model and noise) ends within
 *     TRAJ_ATOL + TRAJ_RTOL * |want| of diffusers' float32 one.
 *
 * Inputs are random with a seed printed on any failure; TK_TEST_SEED replays one. The diffusers checks
 * need ${TK_PY_VENV:-build/py-venv} with diffusers; they skip without it, and fail under CI.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "op_test.h"
#include "tensor_util.h"
#include "ops/ops.h"

/* The tolerances (also in docs/diffusion.md). */
#define FLOAT64_ULPS 1.0  /* tk vs this file's float64 formulas: one rounding of the output dtype */
#define EXACT_ULPS 1.0    /* tk vs diffusers in float64 on tk's table: one rounding to fp32 */
#define EXACT_ULPS_THR 4.0 /* ... with thresholding, also of the terms (float64 torch.quantile vs fp32) */
#define F32_ATOL 1e-4     /* tk vs diffusers in float32, per step: |diff| <= F32_ATOL + F32_RTOL |want| */
#define F32_RTOL 1e-4
#define TRAJ_ATOL 1e-4    /* tk's own trajectory vs diffusers' float32 one, every step */
#define TRAJ_RTOL 1e-4

static const tk_dtype F64 = {TK_DL_FLOAT, 64, 1};

#define TA(nm, tp) ((tk_arg){TK_ARG_TENSOR, nm, tp, 0, 0})
#define IA(nm, v) ((tk_arg){TK_ARG_I64, nm, NULL, (v), 0})
#define FA(nm, v) ((tk_arg){TK_ARG_F64, nm, NULL, 0, (v)})

static double *f64s(host_t *h) { return h->buf; }
static int64_t *i64s(host_t *h) { return h->buf; }

/* 2^-(mantissa bits): one ulp at 1 of dt. */
static double ulp1(tk_dtype dt) { return dt.bits == 32 ? 0x1.0p-23 : dt.code == TK_DL_BFLOAT ? 0x1.0p-7 : 0x1.0p-10; }
/* The smallest positive subnormal spacing that matters near zero. */
static double tiny(tk_dtype dt) { return dt.bits == 32 ? 1e-38 : dt.code == TK_DL_BFLOAT ? 1e-38 : 6e-8; }

/* ---- the schedule and timestep calls ----------------------------------------------------------- */

static void test_schedule_closed_forms(void)
{
    enum { N = 1000 };
    static double b[N], ab[N];
    tk_noise_schedule_opts o = TK_NOISE_SCHEDULE_OPTS_INIT;
    CHECK_RC(tk_noise_schedule(b, ab, NULL), TK_OK); /* the defaults: linear 1e-4 .. 0.02 */
    CHECK(b[0] == 1e-4 && fabs(b[N - 1] - 0.02) < 1e-17);
    CHECK(fabs(b[500] - (1e-4 + (0.02 - 1e-4) * 500.0 / 999.0)) < 1e-17);
    double acc = 1;
    for (int i = 0; i < N; i++)
        acc *= 1 - b[i];
    CHECK(fabs(ab[N - 1] - acc) <= 1e-15 * acc);
    CHECK(ab[N - 1] > 4.0e-5 && ab[N - 1] < 4.1e-5); /* DDPM's linear schedule ends near 4.04e-5 */

    /* the alpha_bar schedules telescope: ab[i] = abar((i + 1) / n) / abar(0) until a beta is capped */
    o.beta_schedule = "squaredcos_cap_v2";
    CHECK_RC(tk_noise_schedule(b, ab, &o), TK_OK);
    double f0 = cos(0.008 / 1.008 * M_PI / 2);
    for (int i = 0; i < N - 1; i++) {
        double f = cos(((i + 1.0) / N + 0.008) / 1.008 * M_PI / 2);
        CHECK(fabs(ab[i] - f * f / (f0 * f0)) <= 1e-12 * f * f / (f0 * f0) + 1e-300);
    }
    CHECK(b[N - 1] == 0.999); /* capped at max_beta */
    o.beta_schedule = "cosine";  /* the alias */
    static double b2[N];
    CHECK_RC(tk_noise_schedule(b2, NULL, &o), TK_OK);
    CHECK(memcmp(b, b2, sizeof b) == 0);

    o.beta_schedule = "sqrt";
    CHECK_RC(tk_noise_schedule(b, ab, &o), TK_OK);
    for (int i = 0; i < N - 1; i++) {
        double want = (1 - sqrt((i + 1.0) / N + 1e-4)) / (1 - sqrt(1e-4));
        CHECK(fabs(ab[i] - want) <= 1e-12 * want + 1e-300);
    }
    CHECK(fabs(b[0] - (1 - (1 - sqrt(1.0 / N + 1e-4)) / 0.99)) < 1e-15);

    o.beta_schedule = "scaled_linear";
    CHECK_RC(tk_noise_schedule(b, NULL, &o), TK_OK);
    CHECK(fabs(b[0] - 1e-4) < 1e-18 && fabs(b[N - 1] - 0.02) < 1e-17);
    CHECK(fabs(sqrt(b[300]) - (0.01 + (sqrt(0.02) - 0.01) * 300.0 / 999.0)) < 1e-16);

    o.beta_schedule = "sigmoid";
    CHECK_RC(tk_noise_schedule(b, NULL, &o), TK_OK);
    CHECK(fabs(b[0] - (1e-4 + (0.02 - 1e-4) / (1 + exp(6)))) < 1e-17);

    o.beta_schedule = "laplace";
    CHECK_RC(tk_noise_schedule(b, ab, &o), TK_OK);
    for (int i = 0; i < N; i++)
        CHECK(b[i] >= 0 && b[i] <= 0.999 && ab[i] >= 0 && ab[i] <= 1);

    /* zero terminal SNR: the last alphas_cumprod is 0, the first is kept */
    o.beta_schedule = "scaled_linear";
    o.beta_start = 0.00085;
    o.beta_end = 0.012;
    static double ab0[N];
    CHECK_RC(tk_noise_schedule(NULL, ab0, &o), TK_OK);
    o.rescale_betas_zero_snr = 1;
    CHECK_RC(tk_noise_schedule(b, ab, &o), TK_OK);
    CHECK(ab[N - 1] == 0 && b[N - 1] == 1);
    CHECK(fabs(ab[0] - ab0[0]) <= 1e-15);

    /* trained betas pass through; n = 1 */
    double tb[3] = {0.1, 0.2, 0.5}, tab[3];
    tk_noise_schedule_opts t = TK_NOISE_SCHEDULE_OPTS_INIT;
    t.num_train_timesteps = 3;
    t.trained_betas = tb;
    CHECK_RC(tk_noise_schedule(b, tab, &t), TK_OK);
    CHECK(b[1] == 0.2 && fabs(tab[2] - 0.9 * 0.8 * 0.5) < 1e-16);
    t.trained_betas = NULL;
    t.num_train_timesteps = 1;
    CHECK_RC(tk_noise_schedule(b, tab, &t), TK_OK);
    CHECK(b[0] == 1e-4 && tab[0] == 1 - 1e-4);
}

/* Every refused call names the problem and writes nothing. */
static void schedule_fails(const tk_noise_schedule_opts *o, const char *want)
{
    double b[8], ab[8];
    for (int i = 0; i < 8; i++)
        b[i] = ab[i] = -7;
    CHECK_RC(tk_noise_schedule(b, ab, o), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), want);
    for (int i = 0; i < 8; i++)
        CHECK(b[i] == -7 && ab[i] == -7);
}

static void test_schedule_errors(void)
{
    tk_noise_schedule_opts o = TK_NOISE_SCHEDULE_OPTS_INIT;
    o.num_train_timesteps = 8;
    o.beta_schedule = "squaredcos";
    schedule_fails(&o, "unknown beta_schedule 'squaredcos'");
    CHECK_CONTAINS(tk_last_error(), "HINT: linear, scaled_linear, squaredcos_cap_v2");
    o.beta_schedule = "linear";
    o.beta_end = 1.5;
    schedule_fails(&o, "beta[5] = 1.07146 is outside [0, 1] (linear)");
    o.beta_end = NAN;
    schedule_fails(&o, "must be finite");
    o.beta_end = 0.02;
    o.num_train_timesteps = 0;
    schedule_fails(&o, "num_train_timesteps is 0");
    o.num_train_timesteps = 1;
    o.rescale_betas_zero_snr = 1;
    schedule_fails(&o, "at least 2 timesteps");
    o = (tk_noise_schedule_opts)TK_NOISE_SCHEDULE_OPTS_INIT;
    o.num_train_timesteps = 8;
    o.beta_schedule = "scaled_linear";
    o.beta_start = -1e-4;
    schedule_fails(&o, "square roots");
    o = (tk_noise_schedule_opts)TK_NOISE_SCHEDULE_OPTS_INIT;
    o.num_train_timesteps = 8;
    o.beta_schedule = "cosine";
    o.max_beta = 0;
    schedule_fails(&o, "max_beta is 0");
    double tb[8] = {0.1, 0.1, 0.1, NAN, 0.1, 0.1, 0.1, 0.1};
    o = (tk_noise_schedule_opts)TK_NOISE_SCHEDULE_OPTS_INIT;
    o.num_train_timesteps = 8;
    o.trained_betas = tb;
    schedule_fails(&o, "beta[3] = nan is outside [0, 1] (trained_betas)");
    o.trained_betas = NULL;
    o.version = 0;
    schedule_fails(&o, "TK_NOISE_SCHEDULE_OPTS_INIT");
}

static void test_timesteps(void)
{
    int64_t t[1000], p[1000];
    tk_diffusion_timesteps_opts o = TK_DIFFUSION_TIMESTEPS_OPTS_INIT;
    CHECK_RC(tk_diffusion_timesteps(t, p, 50, NULL), TK_OK); /* leading, ddpm */
    for (int i = 0; i < 50; i++) {
        CHECK_EQ_INT(t[i], 980 - 20 * i);
        CHECK_EQ_INT(p[i], i < 49 ? t[i + 1] : -1);
    }
    o.scheduler = "ddim";
    o.steps_offset = 1;
    o.set_alpha_to_one = 0; /* Stable Diffusion's DDIM: final alphas_cumprod = alphas_cumprod[0] */
    CHECK_RC(tk_diffusion_timesteps(t, p, 50, &o), TK_OK);
    CHECK(t[0] == 981 && t[49] == 1 && p[0] == 961 && p[48] == 1 && p[49] == 0);
    o = (tk_diffusion_timesteps_opts)TK_DIFFUSION_TIMESTEPS_OPTS_INIT;
    o.timestep_spacing = "trailing";
    CHECK_RC(tk_diffusion_timesteps(t, p, 50, &o), TK_OK);
    CHECK(t[0] == 999 && t[1] == 979 && t[49] == 19 && p[49] == -1);
    CHECK_RC(tk_diffusion_timesteps(t, p, 3, &o), TK_OK); /* round(1000, 666.67, 333.33) - 1 */
    CHECK(t[0] == 999 && t[1] == 666 && t[2] == 332);
    o.timestep_spacing = "linspace";
    CHECK_RC(tk_diffusion_timesteps(t, p, 4, &o), TK_OK); /* linspace(0, 999, 4) = 0, 333, 666, 999 */
    CHECK(t[0] == 999 && t[1] == 666 && t[2] == 333 && t[3] == 0);
    CHECK_RC(tk_diffusion_timesteps(t, NULL, 1, &o), TK_OK);
    CHECK_EQ_INT(t[0], 0);

    /* errors */
    o = (tk_diffusion_timesteps_opts)TK_DIFFUSION_TIMESTEPS_OPTS_INIT;
    CHECK_RC(tk_diffusion_timesteps(t, p, 1001, &o), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "num_inference_steps is 1001, want 1 to num_train_timesteps (1000)");
    CHECK_RC(tk_diffusion_timesteps(t, p, 0, &o), TK_ERR_INVALID);
    o.timestep_spacing = "even";
    CHECK_RC(tk_diffusion_timesteps(t, p, 10, &o), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "unknown timestep_spacing 'even'");
    o.timestep_spacing = NULL;
    o.scheduler = "euler";
    CHECK_RC(tk_diffusion_timesteps(t, p, 10, &o), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "unknown scheduler 'euler'");
    o.scheduler = NULL;
    o.steps_offset = 1; /* leading, 1000 steps: 999 + 1 is past the table */
    CHECK_RC(tk_diffusion_timesteps(t, p, 1000, &o), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "gives timestep 1000, outside [0, 1000)");
    CHECK_RC(tk_diffusion_timesteps(NULL, p, 10, &o), TK_ERR_INVALID);
}

/* ---- float64 formulas, written from the papers / diffusers (not from ops/diffusion.c) ---------- */

typedef struct {
    int op; /* 0 ddpm, 1 ddim */
    int pred, var, clip, thr, use_clipped;
    double range, ratio, maxv, eta;
} step_cfg;

static double clampd(double v, double lo, double hi) { return v < lo ? lo : v > hi ? hi : v; }

/* torch.quantile (linear) of the |x0| values rounded to fp32, as diffusers runs it on the CPU in
 * float32: the documented definition. */
static float ref_threshold(const double *x0, int64_t n, double ratio, double maxv)
{
    float *v = malloc((size_t)n * sizeof *v);
    int nan = 0;
    for (int64_t i = 0; i < n; i++) {
        v[i] = fabsf((float)x0[i]);
        nan |= isnan(v[i]);
    }
    /* insertion sort: the rows here are small */
    for (int64_t i = 1; i < n; i++)
        for (int64_t k = i; k > 0 && v[k] < v[k - 1]; k--) {
            float s = v[k];
            v[k] = v[k - 1];
            v[k - 1] = s;
        }
    double r = (double)(float)ratio * (double)(n - 1);
    int64_t lo = (int64_t)floor(r), hi = (int64_t)ceil(r);
    float w = (float)(r - (double)lo), a = v[lo], b = v[hi < n ? hi : n - 1];
    float q = w < 0.5f ? fmaf(w, b - a, a) : fmaf(-(b - a), 1.0f - w, b);
    free(v);
    if (nan)
        return NAN;
    return q<1.0f ? 1.0f : q>(float) maxv ? (float)maxv : q;
}

/* One batch row of a step in float64: x, m (row), pv (row or NULL), z (row or NULL) -> prev, x0. */
static void ref_step_row(const step_cfg *c, double at, double ap, int64_t t, int64_t n, const double *m,
                         const double *x, const double *pv, const double *z, double *prev, double *x0)
{
    double sat = sqrt(at), sbt = sqrt(1 - at);
    double *eps = malloc((size_t)n * sizeof *eps);
    for (int64_t i = 0; i < n; i++) {
        if (c->pred == 0) {
            x0[i] = (x[i] - sbt * m[i]) / sat;
            eps[i] = m[i];
        } else if (c->pred == 1) {
            x0[i] = m[i];
            eps[i] = (x[i] - sat * m[i]) / sbt;
        } else {
            x0[i] = sat * x[i] - sbt * m[i];
            eps[i] = sat * m[i] + sbt * x[i];
        }
    }
    float s = c->thr ? ref_threshold(x0, n, c->ratio, c->maxv) : 1;
    for (int64_t i = 0; i < n; i++) {
        if (c->thr)
            x0[i] = isnan(s) ? NAN : clampd(x0[i], -s, s) / s;
        else if (c->clip)
            x0[i] = clampd(x0[i], -c->range, c->range);
        if (c->op == 0) { /* DDPM: the posterior q(x_{t-1} | x_t, x0) */
            double beta = 1 - at / ap;
            double mean = sqrt(ap) * beta / (1 - at) * x0[i] + sqrt(1 - beta) * (1 - ap) / (1 - at) * x[i];
            double tilde = fmax((1 - ap) / (1 - at) * beta, 1e-20), sd;
            switch (c->var) {
            case 0:
            case 1: sd = sqrt(tilde); break;
            case 2: sd = sqrt(beta); break;
            case 4: sd = sqrt(pv[i]); break;
            default: sd = exp(0.5 * ((pv[i] + 1) / 2 * log(beta) + (1 - pv[i]) / 2 * log(tilde))); break;
            }
            prev[i] = mean + (z && t > 0 ? sd * z[i] : 0);
        } else { /* DDIM, eq. 12 of Song et al. */
            double sigma = c->eta * sqrt((1 - ap) / (1 - at) * (1 - at / ap));
            double e = c->use_clipped ? (x[i] - sat * x0[i]) / sbt : eps[i];
            prev[i] = sqrt(ap) * x0[i] + sqrt(1 - ap - sigma * sigma) * e + (z && c->eta > 0 ? sigma * z[i] : 0);
        }
    }
    free(eps);
}

/* A random table in (0, 1], falling (a schedule's shape), and its host tensor. */
static void rand_table(host_t *ab, int64_t n)
{
    host_new(ab, F64, 1, &n, 0);
    double acc = 1;
    for (int64_t i = 0; i < n; i++) {
        acc *= 1 - uniform(1e-4, 0.05);
        f64s(ab)[i] = acc;
    }
}

/* One random step case against ref_step_row. */
static void step_case(const step_cfg *c, tk_dtype dt, int nd, const int64_t *shape, int64_t pad, int with_noise,
                      int with_x0)
{
    int learned = c->op == 0 && (c->var == 4 || c->var == 5);
    int64_t mshape[8], B = shape[0], nt = 60;
    memcpy(mshape, shape, (size_t)nd * sizeof *mshape);
    if (learned)
        mshape[1] *= 2;
    host_t mo, x, z, prev, x0, ts, ps, ab;
    host_new(&mo, dt, nd, mshape, pad);
    host_new(&x, dt, nd, shape, pad);
    host_new(&z, dt, nd, shape, pad);
    host_new(&prev, dt, nd, shape, pad);
    host_new(&x0, dt, nd, shape, pad ? pad + 1 : 0);
    host_new(&ts, I64, 1, &B, 0);
    host_new(&ps, I64, 1, &B, 0);
    rand_table(&ab, nt);
    int64_t n = numel(&x.t), row = n / B, mrow = numel(&mo.t) / B;
    fill(&x, 3.0);
    fill(&z, 2.0);
    for (int64_t i = 0; i < numel(&mo.t); i++) {
        int64_t e = i % mrow;
        set(&mo.t, i, e < row ? uniform(-2, 2) : c->var == 4 ? uniform(0.01, 0.3) : uniform(-1, 1));
    }
    for (int64_t b = 0; b < B; b++) {
        i64s(&ts)[b] = b == 0 ? 0 : (int64_t)(next_u64() % (uint64_t)nt);
        i64s(&ps)[b] = b == 1 ? -1 : i64s(&ts)[b] - 1 - (int64_t)(next_u64() % 5);
    }
    tk_arg args[16];
    size_t na = 0;
    args[na++] = TA("prev_sample", &prev.t);
    if (with_x0)
        args[na++] = TA("pred_original_sample", &x0.t);
    args[na++] = TA("model_output", &mo.t);
    args[na++] = TA("sample", &x.t);
    args[na++] = TA("timesteps", &ts.t);
    args[na++] = TA("prev_timesteps", &ps.t);
    args[na++] = TA("alphas_cumprod", &ab.t);
    if (with_noise)
        args[na++] = TA("noise", &z.t);
    args[na++] = IA("prediction_type", c->pred);
    args[na++] = IA("clip_sample", c->clip);
    args[na++] = FA("clip_sample_range", c->range);
    args[na++] = IA("thresholding", c->thr);
    args[na++] = FA("dynamic_thresholding_ratio", c->ratio);
    args[na++] = FA("sample_max_value", c->maxv);
    if (c->op == 0) {
        args[na++] = IA("variance_type", c->var);
    } else {
        args[na++] = FA("eta", c->eta);
        args[na++] = IA("use_clipped_model_output", c->use_clipped);
    }
    const char *op = c->op == 0 ? "ddpm_step" : "ddim_step";
    int rc = op_run_cpu(op, args, na);
    CHECK_RC(rc, TK_OK);
    if (rc != TK_OK) {
        fprintf(stderr, "  %s: %s\n", op, tk_last_error());
        goto done;
    }
    double *mv = op_values(&mo.t), *xv = op_values(&x.t), *zv = op_values(&z.t);
    double *rp = malloc((size_t)n * sizeof *rp), *rx = malloc((size_t)n * sizeof *rx);
    for (int64_t b = 0; b < B; b++) {
        int64_t t = i64s(&ts)[b], p = i64s(&ps)[b];
        ref_step_row(c, f64s(&ab)[t], p >= 0 ? f64s(&ab)[p] : 1.0, t, row, mv + b * mrow, xv + b * row,
                     learned ? mv + b * mrow + row : NULL, with_noise ? zv + b * row : NULL, rp + b * row,
                     rx + b * row);
    }
    op_cmp cp = op_cmp_begin(tiny(dt), FLOAT64_ULPS * ulp1(dt),
                             "%s pred %d var %d clip %d thr %d eta %g noise %d %s %s pad %lld prev_sample", op, c->pred,
                             c->var, c->clip, c->thr, c->eta, with_noise, tk_ops__dtype_str(dt),
                             tk_ops__shape_fmt(nd, shape), (long long)pad);
    op_cmp cx = op_cmp_begin(tiny(dt), FLOAT64_ULPS * ulp1(dt), "%s pred %d var %d clip %d thr %d %s %s x0", op,
                             c->pred, c->var, c->clip, c->thr, tk_ops__dtype_str(dt), tk_ops__shape_fmt(nd, shape));
    for (int64_t i = 0; i < n; i++) {
        op_cmp_at(&cp, i, get(&prev.t, i), quantize(rp[i], dt));
        if (with_x0)
            op_cmp_at(&cx, i, get(&x0.t, i), quantize(rx[i], dt));
    }
    CHECK(op_cmp_end(&cp));
    CHECK(op_cmp_end(&cx));
    free(mv);
    free(xv);
    free(zv);
    free(rp);
    free(rx);
done:
    host_free(&mo);
    host_free(&x);
    host_free(&z);
    host_free(&prev);
    host_free(&x0);
    host_free(&ts);
    host_free(&ps);
    host_free(&ab);
}

static void test_steps_float64(void)
{
    static const int64_t shapes[][4] = {{3, 4, 5, 6}, {2, 7, 0, 0}, {1, 1, 3, 0}, {4, 2, 33, 0}};
    static const int nds[] = {4, 2, 3, 3};
    for (int d = 0; d < 3; d++)
        for (int s = 0; s < 4; s++)
            for (int k = 0; k < 12; k++) {
                step_cfg c = {k % 2, (k / 2) % 3, 0, 0, 0, 0, 1.0, 0.995, 1.0, 0};
                c.var = c.op == 0 ? (int[]){0, 1, 2, 4, 5}[next_u64() % 5] : 0;
                c.clip = (int)(next_u64() % 2);
                c.range = uniform(0.5, 3);
                c.thr = k % 5 == 0;
                c.ratio = uniform(0.5, 1);
                c.maxv = uniform(1, 4);
                c.eta = k % 3 == 0 ? 0 : uniform(0, 1);
                c.use_clipped = (int)(next_u64() % 2);
                step_case(&c, *all_dtypes[d], nds[s], shapes[s], k % 4 == 3 ? 2 : 0, k % 3 != 1, k % 4 != 2);
            }
}

/* q_sample and ddpm_posterior against float64 formulas. */
static void test_q_posterior_float64(void)
{
    for (int d = 0; d < 3; d++)
        for (int k = 0; k < 8; k++) {
            tk_dtype dt = *all_dtypes[d];
            int64_t shape[3] = {1 + (int64_t)(next_u64() % 6), 1 + (int64_t)(next_u64() % 9),
                                1 + (int64_t)(next_u64() % 17)};
            int nd = 1 + k % 3, pad = k % 4 == 3 ? 3 : 0, var = k % 6;
            int64_t B = shape[0], nt = 40;
            host_t x0, x, z, out, mean, lv, pv, ts, ps, ab;
            host_new(&x0, dt, nd, shape, pad);
            host_new(&x, dt, nd, shape, 0);
            host_new(&z, dt, nd, shape, pad);
            host_new(&out, dt, nd, shape, pad);
            host_new(&mean, dt, nd, shape, pad);
            host_new(&lv, dt, nd, shape, 0);
            host_new(&pv, dt, nd, shape, pad);
            host_new(&ts, I64, 1, &B, 0);
            host_new(&ps, I64, 1, &B, 0);
            rand_table(&ab, nt);
            fill(&x0, 2);
            fill(&x, 2);
            fill(&z, 2);
            int64_t n = numel(&x.t), row = n / B;
            for (int64_t i = 0; i < n; i++)
                set(&pv.t, i, var == 4 ? uniform(0.01, 0.5) : uniform(-1, 1));
            for (int64_t b = 0; b < B; b++) {
                i64s(&ts)[b] = (int64_t)(next_u64() % (uint64_t)nt);
                i64s(&ps)[b] = b == 0 ? -1 : i64s(&ts)[b] - 1;
            }
            CHECK_RC(op_run_cpu("q_sample",
                                (tk_arg[]){TA("out", &out.t), TA("x0", &x0.t), TA("noise", &z.t),
                                           TA("timesteps", &ts.t), TA("alphas_cumprod", &ab.t)},
                                5),
                     TK_OK);
            tk_arg pa[9] = {TA("mean", &mean.t),         TA("log_variance", &lv.t), TA("x0", &x0.t),
                            TA("sample", &x.t),          TA("timesteps", &ts.t),    TA("prev_timesteps", &ps.t),
                            TA("alphas_cumprod", &ab.t), IA("variance_type", var),  TA("predicted_variance", &pv.t)};
            CHECK_RC(op_run_cpu("ddpm_posterior", pa, 9), TK_OK);
            op_cmp cq =
                op_cmp_begin(tiny(dt), ulp1(dt), "q_sample %s %s", tk_ops__dtype_str(dt), tk_ops__shape_fmt(nd, shape));
            op_cmp cm = op_cmp_begin(tiny(dt), ulp1(dt), "ddpm_posterior mean %s %s", tk_ops__dtype_str(dt),
                                     tk_ops__shape_fmt(nd, shape));
            op_cmp cl = op_cmp_begin(tiny(dt), ulp1(dt), "ddpm_posterior log_variance var %d %s %s", var,
                                     tk_ops__dtype_str(dt), tk_ops__shape_fmt(nd, shape));
            for (int64_t i = 0; i < n; i++) {
                int64_t b = i / row, t = i64s(&ts)[b], p = i64s(&ps)[b];
                double at = f64s(&ab)[t], ap = p >= 0 ? f64s(&ab)[p] : 1, beta = 1 - at / ap;
                double a0 = get(&x0.t, i), xt = get(&x.t, i), v = get(&pv.t, i);
                op_cmp_at(&cq, i, get(&out.t, i), quantize(sqrt(at) * a0 + sqrt(1 - at) * get(&z.t, i), dt));
                double m = sqrt(ap) * beta / (1 - at) * a0 + sqrt(1 - beta) * (1 - ap) / (1 - at) * xt;
                double tl = log(fmax((1 - ap) / (1 - at) * beta, 1e-20));
                double l = var <= 1   ? tl
                           : var <= 3 ? log(beta)
                           : var == 4 ? log(v)
                                      : (v + 1) / 2 * log(beta) + (1 - v) / 2 * tl;
                op_cmp_at(&cm, i, get(&mean.t, i), quantize(m, dt));
                op_cmp_at(&cl, i, get(&lv.t, i), quantize(l, dt));
            }
            CHECK(op_cmp_end(&cq));
            CHECK(op_cmp_end(&cm));
            CHECK(op_cmp_end(&cl));
            host_t *all[] = {&x0, &x, &z, &out, &mean, &lv, &pv, &ts, &ps, &ab};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
                host_free(all[i]);
        }
}

/* A step in place (prev_sample = sample, pred_original_sample = model_output) equals one out of place. */
static void test_in_place(void)
{
    int64_t shape[3] = {3, 4, 50}, B = 3;
    for (int op = 0; op < 2; op++)
        for (int thr = 0; thr < 2; thr++) {
            host_t mo, x, x2, mo2, prev, x0, ts, ps, ab;
            host_new(&mo, F32, 3, shape, 0);
            host_new(&x, F32, 3, shape, 0);
            host_new(&prev, F32, 3, shape, 0);
            host_new(&x0, F32, 3, shape, 0);
            host_new(&ts, I64, 1, &B, 0);
            host_new(&ps, I64, 1, &B, 0);
            rand_table(&ab, 30);
            fill(&mo, 2);
            fill(&x, 2);
            x2 = x;
            mo2 = mo;
            x2.buf = malloc(600 * 4);
            mo2.buf = malloc(600 * 4);
            memcpy(x2.buf, x.buf, 600 * 4);
            memcpy(mo2.buf, mo.buf, 600 * 4);
            x2.t.data = x2.buf;
            mo2.t.data = mo2.buf;
            x2.t.shape = x2.shape;
            mo2.t.shape = mo2.shape;
            for (int b = 0; b < 3; b++) {
                i64s(&ts)[b] = 10 + b;
                i64s(&ps)[b] = 5 - b;
            }
            const char *name = op ? "ddim_step" : "ddpm_step";
            tk_arg a1[] = {TA("prev_sample", &prev.t),  TA("pred_original_sample", &x0.t),
                           TA("model_output", &mo.t),   TA("sample", &x.t),
                           TA("timesteps", &ts.t),      TA("prev_timesteps", &ps.t),
                           TA("alphas_cumprod", &ab.t), IA("thresholding", thr)};
            tk_arg a2[] = {TA("prev_sample", &x2.t),    TA("pred_original_sample", &mo2.t),
                           TA("model_output", &mo2.t),  TA("sample", &x2.t),
                           TA("timesteps", &ts.t),      TA("prev_timesteps", &ps.t),
                           TA("alphas_cumprod", &ab.t), IA("thresholding", thr)};
            CHECK_RC(op_run_cpu(name, a1, 8), TK_OK);
            CHECK_RC(op_run_cpu(name, a2, 8), TK_OK);
            CHECK(memcmp(prev.buf, x2.buf, 600 * 4) == 0);
            CHECK(memcmp(x0.buf, mo2.buf, 600 * 4) == 0);
            host_t *all[] = {&mo, &x, &x2, &mo2, &prev, &x0, &ts, &ps, &ab};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
                host_free(all[i]);
        }
}

/* ---- validation -------------------------------------------------------------------------------- */

static void refused(const char *op, const tk_arg *args, size_t n, const char *want, host_t *untouched)
{
    size_t bytes = untouched ? (size_t)numel(&untouched->t) * untouched->t.dtype.bits / 8 : 0;
    void *before = bytes ? malloc(bytes) : NULL;
    if (before)
        memcpy(before, untouched->buf, bytes);
    int rc = op_run_cpu(op, args, n);
    CHECK_RC(rc, TK_ERR_INVALID);
    if (rc == TK_ERR_INVALID && !strstr(tk_last_error(), want)) {
        fprintf(stderr, "  %s: message %s, want it to contain \"%s\"\n", op, tk_last_error(), want);
        CHECK(!"message");
    }
    if (before) {
        CHECK(memcmp(before, untouched->buf, bytes) == 0);
        free(before);
    }
}

static void test_validation(void)
{
    int64_t s4[4] = {2, 3, 4, 4}, s4w[4] = {2, 6, 4, 4}, s4b[4] = {3, 3, 4, 4}, B = 2, n = 10, three = 3;
    host_t mo, mow, x, xb, prev, x0, ts, ps, ts3, ab, ab32, x16, empty;
    host_new(&mo, F32, 4, s4, 0);
    host_new(&mow, F32, 4, s4w, 0);
    host_new(&x, F32, 4, s4, 0);
    host_new(&xb, F32, 4, s4b, 0);
    host_new(&prev, F32, 4, s4, 0);
    host_new(&x0, F32, 4, s4, 0);
    host_new(&x16, F16, 4, s4, 0);
    host_new(&ts, I64, 1, &B, 0);
    host_new(&ps, I64, 1, &B, 0);
    host_new(&ts3, I64, 1, &three, 0);
    host_new(&ab32, F32, 1, &n, 0);
    int64_t zero = 0;
    host_new(&empty, F64, 1, &zero, 0);
    rand_table(&ab, n);
    fill(&prev, 1); /* outputs hold values a refused call must leave alone */
    fill(&x0, 1);
    i64s(&ts)[0] = 9;
    i64s(&ts)[1] = 3;
    i64s(&ps)[0] = 5;
    i64s(&ps)[1] = -1;
#define STEP(mo_, x_, ts_, ab_)                                                                                        \
    TA("prev_sample", &prev.t), TA("pred_original_sample", &x0.t), TA("model_output", &(mo_).t),                       \
        TA("sample", &(x_).t), TA("timesteps", &(ts_).t), TA("prev_timesteps", &ps.t), TA("alphas_cumprod", &(ab_).t)
    refused("ddpm_step", (tk_arg[]){STEP(mo, x, ts, ab), IA("variance_type", 5)}, 8,
            "'model_output' has shape [2, 3, 4, 4], want [2, 6, 4, 4] (the learned variance types", &prev);
    refused("ddpm_step", (tk_arg[]){STEP(mow, x, ts, ab)}, 7,
            "'model_output' has shape [2, 6, 4, 4], want [2, 3, 4, 4] (the shape of 'sample')", &prev);
    refused("ddpm_step", (tk_arg[]){STEP(mo, x, ts, ab), IA("variance_type", 3)}, 8, "fixed_large_log", &prev);
    refused("ddpm_step", (tk_arg[]){STEP(mo, x, ts, ab), IA("variance_type", 9)}, 8,
            "'variance_type' is 9, want one of 0 fixed_small, 1 fixed_small_log", &prev);
    refused("ddim_step", (tk_arg[]){STEP(mo, x, ts, ab), IA("prediction_type", 3)}, 8,
            "'prediction_type' is 3, want one of 0 epsilon, 1 sample, 2 v_prediction", &prev);
    refused("ddim_step", (tk_arg[]){STEP(mo, x, ts, ab), FA("eta", -0.5)}, 8, "'eta' is -0.5", &prev);
    refused("ddim_step", (tk_arg[]){STEP(mo, x, ts, ab), IA("clip_sample", 2)}, 8, "'clip_sample' is 2, want 0 or 1",
            &prev);
    refused("ddim_step", (tk_arg[]){STEP(mo, x, ts, ab), FA("clip_sample_range", 0)}, 8, "'clip_sample_range' is 0",
            &prev);
    refused("ddpm_step", (tk_arg[]){STEP(mo, x, ts, ab), IA("thresholding", 1), FA("dynamic_thresholding_ratio", 1.5)},
            9, "'dynamic_thresholding_ratio' is 1.5, want a quantile in [0, 1]", &prev);
    refused("ddpm_step", (tk_arg[]){STEP(mo, x, ts3, ab)}, 7,
            "'timesteps' has shape [3], want [2] (one value per batch row of 'sample' [2, 3, 4, 4])", &prev);
    refused("ddpm_step", (tk_arg[]){STEP(mo, xb, ts, ab)}, 7,
            "'model_output' has shape [2, 3, 4, 4], want [3, 3, 4, 4]", &prev);
    refused("ddpm_step", (tk_arg[]){STEP(mo, x, ts, ab32)}, 7, "'alphas_cumprod' has dtype f32, want f64", &prev);
    refused("ddpm_step", (tk_arg[]){STEP(mo, x16, ts, ab)}, 7, "has dtype f32, want f16 (the dtype of 'sample')",
            &prev);
    refused("ddpm_step", (tk_arg[]){STEP(mo, x, ts, empty)}, 7, "'alphas_cumprod' is empty", &prev);
    /* the values: checked before anything is written */
    i64s(&ts)[1] = 10;
    refused("ddim_step", (tk_arg[]){STEP(mo, x, ts, ab)}, 7, "'timesteps'[1] = 10 is outside [0, 10)", &prev);
    i64s(&ts)[1] = 3;
    i64s(&ps)[0] = 12;
    refused("ddpm_step", (tk_arg[]){STEP(mo, x, ts, ab)}, 7, "'prev_timesteps'[0] = 12 is outside [0, 10)", &prev);
    i64s(&ps)[0] = 5;
    double keep = f64s(&ab)[4];
    f64s(&ab)[4] = 1.25;
    refused("ddpm_step", (tk_arg[]){STEP(mo, x, ts, ab)}, 7, "'alphas_cumprod'[4] = 1.25 is outside [0, 1]", &prev);
    f64s(&ab)[4] = keep;
    /* two results in one buffer */
    refused("ddim_step",
            (tk_arg[]){TA("prev_sample", &prev.t), TA("pred_original_sample", &prev.t), TA("model_output", &mo.t),
                       TA("sample", &x.t), TA("timesteps", &ts.t), TA("prev_timesteps", &ps.t),
                       TA("alphas_cumprod", &ab.t)},
            7, "'prev_sample' and 'pred_original_sample' are the same memory", NULL);
    refused("ddpm_posterior",
            (tk_arg[]){TA("mean", &prev.t), TA("x0", &x.t), TA("sample", &x.t), TA("timesteps", &ts.t),
                       TA("prev_timesteps", &ps.t), TA("alphas_cumprod", &ab.t), IA("variance_type", 5)},
            7, "variance_type 5 (learned_range) needs 'predicted_variance'", &prev);
    refused("q_sample",
            (tk_arg[]){TA("out", &prev.t), TA("x0", &x.t), TA("noise", &xb.t), TA("timesteps", &ts.t),
                       TA("alphas_cumprod", &ab.t)},
            5, "'noise' has shape [3, 3, 4, 4], want [2, 3, 4, 4] (the shape of 'x0')", &prev);
    refused("ddpm_step", (tk_arg[]){STEP(mo, x, ts, ab), IA("timesteps", 3)}, 8, "given twice", &prev);
    /* the one accepted call: it writes */
    CHECK_RC(op_run_cpu("ddpm_step", (tk_arg[]){STEP(mo, x, ts, ab)}, 7), TK_OK);
#undef STEP
    host_t *all[] = {&mo, &mow, &x, &xb, &prev, &x0, &x16, &ts, &ps, &ts3, &ab32, &empty, &ab};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        host_free(all[i]);
}

/* ---- randn -------------------------------------------------------------------------------------- */

static void test_randn(void)
{
    int64_t n = 1 << 20, s2[2] = {1001, 7};
    host_t a, b, c, st, f16;
    host_new(&a, F32, 1, &n, 0);
    host_new(&b, F32, 1, &n, 0);
    host_new(&c, F32, 1, &n, 0);
    host_new(&st, F32, 2, s2, 5);
    host_new(&f16, F16, 2, s2, 0);
    CHECK_RC(op_run_cpu("randn", (tk_arg[]){TA("out", &a.t), IA("seed", 42), IA("offset", 3)}, 3), TK_OK);
    CHECK_RC(op_run_cpu("randn", (tk_arg[]){TA("out", &b.t), IA("seed", 42), IA("offset", 3)}, 3), TK_OK);
    CHECK_RC(op_run_cpu("randn", (tk_arg[]){TA("out", &c.t), IA("seed", 42), IA("offset", 4)}, 3), TK_OK);
    CHECK(memcmp(a.buf, b.buf, (size_t)n * 4) == 0);
    double m1 = 0, m2 = 0, m4 = 0, same = 0, lag = 0;
    const float *av = a.buf, *cv = c.buf;
    for (int64_t i = 0; i < n; i++) {
        double v = av[i];
        m1 += v;
        m2 += v * v;
        m4 += v * v * v * v;
        same += av[i] == cv[i];
        if (i)
            lag += v * av[i - 1];
    }
    m1 /= n;
    m2 /= n;
    m4 /= n;
    lag /= n;
    /* mean 0, variance 1, kurtosis 3, no correlation within a pair or across: 6 standard errors */
    double se = 1 / sqrt((double)n);
    CHECK(fabs(m1) < 6 * se);
    CHECK(fabs(m2 - 1) < 6 * sqrt(2.0) * se);
    CHECK(fabs(m4 - 3) < 6 * sqrt(96.0) * se);
    CHECK(fabs(lag) < 6 * se);
    CHECK(same < 10); /* another offset: other draws */
    /* the documented draw of element 2p + 1 from the Philox block (p, offset) */
    uint32_t ctr[4] = {5, 0, 3, 0}, key[2] = {42, 0}, o[4];
    tk_ops__philox4x32_10(o, ctr, key);
    double u1 = (double)(((((uint64_t)o[1] << 32) | o[0]) >> 11) + 1) * 0x1.0p-53;
    double u2 = (double)((((uint64_t)o[3] << 32) | o[2]) >> 11) * 0x1.0p-53;
    CHECK(av[10] == (float)(sqrt(-2 * log(u1)) * cos(2 * M_PI * u2)));
    CHECK(av[11] == (float)(sqrt(-2 * log(u1)) * sin(2 * M_PI * u2)));
    /* strided output: the same values as a contiguous one; odd counts; f16 rounds the same draws */
    host_t ct;
    host_new(&ct, F32, 2, s2, 0);
    CHECK_RC(op_run_cpu("randn", (tk_arg[]){TA("out", &st.t), IA("seed", -1), IA("offset", 0)}, 3), TK_OK);
    CHECK_RC(op_run_cpu("randn", (tk_arg[]){TA("out", &ct.t), IA("seed", -1), IA("offset", 0)}, 3), TK_OK);
    CHECK_RC(op_run_cpu("randn", (tk_arg[]){TA("out", &f16.t), IA("seed", -1), IA("offset", 0)}, 3), TK_OK);
    int ok = 1;
    for (int64_t i = 0; i < numel(&ct.t); i++)
        ok &= get(&st.t, i) == get(&ct.t, i) && get(&f16.t, i) == quantize(get(&ct.t, i), F16);
    CHECK(ok);
    host_t *all[] = {&a, &b, &c, &st, &f16, &ct};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        host_free(all[i]);
}

/* ---- diffusers ---------------------------------------------------------------------------------- */

static const char *const diffusers_cases[] = {
    /* schedules */
    "kind=sched schedule=linear T=1000",
    "kind=sched schedule=scaled_linear T=1000 start=0.00085 end=0.012",
    "kind=sched schedule=cosine T=1000",
    "kind=sched schedule=sqrt T=2000",
    "kind=sched schedule=sigmoid T=1000",
    "kind=sched schedule=laplace T=1000",
    "kind=sched schedule=scaled_linear T=1000 start=0.00085 end=0.012 rescale=1",
    "kind=sched schedule=linear T=50",
    "kind=sched schedule=cosine T=7 rescale=1",
    "kind=sched schedule=linear T=1",
    /* forward noising and the posterior */
    "kind=q schedule=linear T=1000 shape=8,3,4,4 seed=1",
    "kind=q schedule=cosine T=1000 shape=5 seed=2",
    "kind=post schedule=linear T=1000 shape=6,3,4,4 seed=3",
    "kind=post schedule=sqrt T=2000 shape=4,7 seed=4",
    /* whole DDPM runs */
    "kind=ddpm schedule=linear T=1000 steps=1000 shape=2,3,8,8 seed=11",
    "kind=ddpm schedule=cosine T=1000 steps=50 spacing=trailing pred=2 var=1 clip=0 shape=2,4,6,5 seed=12",
    "kind=ddpm schedule=scaled_linear T=1000 steps=100 spacing=linspace pred=1 var=2 thr=1 ratio=0.9 maxv=1.5 "
    "shape=3,4,6,5 seed=13",
    "kind=ddpm schedule=linear T=1000 steps=50 offset=1 var=5 range=2 shape=2,3,8,8 seed=14",
    "kind=ddpm schedule=sqrt T=2000 steps=100 clip=0 shape=2,16,8 seed=15",
    "kind=ddpm schedule=sigmoid T=1000 steps=25 spacing=trailing var=4 shape=2,3,8,8 seed=16",
    "kind=ddpm schedule=laplace T=1000 steps=20 pred=2 shape=2,3,8,8 seed=17",
    "kind=ddpm schedule=scaled_linear start=0.00085 end=0.012 rescale=1 T=1000 steps=30 spacing=trailing pred=2 "
    "clip=0 shape=2,4,8,8 seed=18",
    /* whole DDIM runs */
    "kind=ddim schedule=scaled_linear start=0.00085 end=0.012 T=1000 steps=50 offset=1 alpha_one=0 clip=0 "
    "shape=2,4,8,8 seed=21",
    "kind=ddim schedule=scaled_linear start=0.00085 end=0.012 rescale=1 T=1000 steps=50 spacing=trailing pred=2 "
    "clip=0 shape=2,4,8,8 seed=22",
    "kind=ddim schedule=cosine T=1000 steps=100 spacing=linspace eta=1 thr=1 shape=3,3,8,8 seed=23",
    "kind=ddim schedule=sqrt T=2000 steps=200 spacing=trailing eta=0.5 pred=1 use_clipped=1 shape=2,16,8 seed=24",
    "kind=ddim schedule=linear T=1000 steps=1000 clip=0 shape=2,3,8,8 seed=25",
};
#define NCASES (sizeof diffusers_cases / sizeof diffusers_cases[0])

/* The value of key in a case line ("" when absent). */
static const char *cval(const char *line, const char *key, char *buf, size_t n)
{
    size_t kl = strlen(key);
    buf[0] = '\0';
    for (const char *p = line; (p = strstr(p, key)) != NULL; p += kl)
        if ((p == line || p[-1] == ' ') && p[kl] == '=') {
            size_t l = strcspn(p + kl + 1, " ");
            snprintf(buf, n, "%.*s", (int)(l < n - 1 ? l : n - 1), p + kl + 1);
            break;
        }
    return buf;
}

static double cnum(const char *line, const char *key, double def)
{
    char b[64];
    return *cval(line, key, b, sizeof b) ? strtod(b, NULL) : def;
}

static int case_shape(const char *line, int64_t *shape)
{
    char b[64];
    int nd = 0;
    cval(line, "shape", b, sizeof b);
    for (char *p = b; *p && nd < 8; nd++) {
        shape[nd] = strtoll(p, &p, 10);
        if (*p == ',')
            p++;
    }
    return nd;
}

/* tk's schedule for a case line (n doubles into ab, and betas). */
static int case_schedule(const char *line, double *betas, double *ab)
{
    char name[32];
    tk_noise_schedule_opts o = TK_NOISE_SCHEDULE_OPTS_INIT;
    o.beta_schedule = cval(line, "schedule", name, sizeof name);
    o.num_train_timesteps = (int64_t)cnum(line, "T", 1000);
    o.beta_start = cnum(line, "start", 1e-4);
    o.beta_end = cnum(line, "end", 0.02);
    o.rescale_betas_zero_snr = (int)cnum(line, "rescale", 0);
    return tk_noise_schedule(betas, ab, &o);
}

static void *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *b = malloc((size_t)(n > 0 ? n : 1));
    *len = b && n >= 0 && fread(b, 1, (size_t)n, f) == (size_t)n ? (size_t)n : 0;
    fclose(f);
    return b;
}

/* The largest |diff| / tol seen per kind of comparison, for the summary line. */
static double worst_exact, worst_f32, worst_traj, worst_f32_abs, worst_traj_abs;

static void keep_worst(double *w, double *wabs, double got, double want, double tol)
{
    double r = fabs(got - want) / tol;
    if (r > *w || isnan(r))
        *w = isnan(r) ? INFINITY : r;
    if (wabs && fabs(got - want) > *wabs)
        *wabs = fabs(got - want);
}

static void check_sched(const char *line, const char *dir, int i)
{
    char path[600];
    int64_t n = (int64_t)cnum(line, "T", 1000);
    int rescale = (int)cnum(line, "rescale", 0);
    double *b = malloc((size_t)n * 8), *ab = malloc((size_t)n * 8);
    size_t len, want_len = (size_t)n * (rescale ? 32 : 16);
    snprintf(path, sizeof path, "%s/%d.f64.bin", dir, i);
    double *want = read_file(path, &len);
    CHECK_RC(case_schedule(line, b, ab), TK_OK);
    CHECK(want && len == want_len);
    char name[32];
    int dlm = !strcmp(cval(line, "schedule", name, sizeof name), "sqrt"); /* Diffusion-LM's float64 */
    op_cmp cb = op_cmp_begin(0, 0, "tk_noise_schedule %s betas vs %s", line, dlm ? "Diffusion-LM" : "diffusers");
    op_cmp ca =
        op_cmp_begin(0, 0, "tk_noise_schedule %s alphas_cumprod vs %s", line, dlm ? "Diffusion-LM" : "diffusers");
    op_cmp rb = op_cmp_begin(0, 1e-12, "tk_noise_schedule %s betas vs diffusers' rescale in float64", line);
    op_cmp ra =
        op_cmp_begin(1e-300, 1e-12, "tk_noise_schedule %s alphas_cumprod vs diffusers' rescale in float64", line);
    for (int64_t k = 0; want && len == want_len && k < n; k++) {
        /* diffusers: betas in float32: 6 ulps (torch's float32 linspace, then squared or through a
         * sigmoid). alphas_cumprod: the float32 cumulative product, k + 1 roundings of the running
         * product and each factor 1 - beta rounded: (2k + 4) ulps. Rescaled schedules come back
         * from differences of square roots near zero and 1 - ab[i] / ab[i - 1] in float32: 2e-5
         * absolute (7e-6 seen); the algorithm itself is checked in float64 below. */
        double tb = dlm ? 1e-14 * fabs(want[k]) : rescale ? 2e-5 : 6 * 0x1.0p-24 * fabs(want[k]) + 1e-12;
        double ta = dlm       ? 1e-13 * fabs(want[n + k])
                    : rescale ? 2e-5
                              : (2.0 * (double)(k + 1) + 4) * 0x1.0p-24 * fabs(want[n + k]) + 1e-30;
        op_cmp_tol(&cb, k, b[k], want[k], tb);
        op_cmp_tol(&ca, k, ab[k], want[n + k], ta);
        if (rescale) {
            op_cmp_at(&rb, k, b[k], want[2 * n + k]);
            op_cmp_at(&ra, k, ab[k], want[3 * n + k]);
        }
    }
    CHECK(op_cmp_end(&cb));
    CHECK(op_cmp_end(&ca));
    CHECK(op_cmp_end(&rb));
    CHECK(op_cmp_end(&ra));
    free(want);
    free(b);
    free(ab);
}

/* For a rescaled schedule: tk's betas before the rescale, for the oracle (DIR/I.b0.bin). */
static void write_unrescaled(const char *line, const char *dir, int i)
{
    char path[600], name[32];
    int64_t n = (int64_t)cnum(line, "T", 1000);
    double *b = malloc((size_t)n * 8);
    tk_noise_schedule_opts o = TK_NOISE_SCHEDULE_OPTS_INIT;
    o.beta_schedule = cval(line, "schedule", name, sizeof name);
    o.num_train_timesteps = n;
    o.beta_start = cnum(line, "start", 1e-4);
    o.beta_end = cnum(line, "end", 0.02);
    CHECK_RC(tk_noise_schedule(b, NULL, &o), TK_OK);
    snprintf(path, sizeof path, "%s/%d.b0.bin", dir, i);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(b, 8, (size_t)n, f) == (size_t)n);
    if (f)
        fclose(f);
    free(b);
}

static void write_table(const char *line, const char *dir, int i)
{
    char path[600];
    int64_t n = (int64_t)cnum(line, "T", 1000);
    double *ab = malloc((size_t)n * 8);
    CHECK_RC(case_schedule(line, NULL, ab), TK_OK);
    snprintf(path, sizeof path, "%s/%d.ab.bin", dir, i);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(ab, 8, (size_t)n, f) == (size_t)n);
    if (f)
        fclose(f);
    free(ab);
}

/* A host tensor over caller memory (f32 / f64 / i64), contiguous. */
static tk_tensor view(void *data, tk_dtype dt, int nd, int64_t *shape)
{
    tk_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.device.device_type = TK_DEV_CPU;
    t.dtype = dt;
    t.ndim = nd;
    t.shape = shape;
    return t;
}

static void check_q(const char *line, const char *dir, int i)
{
    char path[600];
    int64_t shape[8], nt = (int64_t)cnum(line, "T", 1000);
    int nd = case_shape(line, shape);
    int64_t N = 1, B = shape[0];
    for (int k = 0; k < nd; k++)
        N *= shape[k];
    size_t l32, l64;
    snprintf(path, sizeof path, "%s/%d.f32.bin", dir, i);
    float *f = read_file(path, &l32);
    snprintf(path, sizeof path, "%s/%d.f64.bin", dir, i);
    double *w64 = read_file(path, &l64);
    snprintf(path, sizeof path, "%s/%d.txt", dir, i);
    FILE *tf = fopen(path, "r");
    int64_t *ts = calloc((size_t)B, 8);
    for (int64_t b = 0; tf && b < B; b++)
        CHECK(fscanf(tf, "%lld", (long long *)&ts[b]) == 1);
    if (tf)
        fclose(tf);
    CHECK(f && l32 == (size_t)N * 12 && w64 && l64 == (size_t)N * 8);
    if (!(f && l32 == (size_t)N * 12 && w64 && l64 == (size_t)N * 8))
        goto done;
    double *ab = malloc((size_t)nt * 8);
    float *out = malloc((size_t)N * 4);
    CHECK_RC(case_schedule(line, NULL, ab), TK_OK);
    tk_tensor to = view(out, F32, nd, shape), tx = view(f, F32, nd, shape), tz = view(f + N, F32, nd, shape),
              tt = view(ts, I64, 1, &B), ta = view(ab, F64, 1, &nt);
    CHECK_RC(op_run_cpu("q_sample",
                        (tk_arg[]){TA("out", &to), TA("x0", &tx), TA("noise", &tz), TA("timesteps", &tt),
                                   TA("alphas_cumprod", &ta)},
                        5),
             TK_OK);
    op_cmp c64 = op_cmp_begin(1e-30, EXACT_ULPS * 0x1.0p-24 * 2, "q_sample %s vs diffusers float64", line);
    op_cmp c32 = op_cmp_begin(F32_ATOL, F32_RTOL, "q_sample %s vs diffusers float32", line);
    for (int64_t k = 0; k < N; k++) {
        op_cmp_at(&c64, k, out[k], w64[k]);
        op_cmp_at(&c32, k, out[k], f[2 * N + k]);
        keep_worst(&worst_exact, NULL, out[k], w64[k], 0x1.0p-23 * fabs(w64[k]) + 1e-30);
        keep_worst(&worst_f32, &worst_f32_abs, out[k], f[2 * N + k], F32_ATOL + F32_RTOL * fabs(f[2 * N + k]));
    }
    CHECK(op_cmp_end(&c64));
    CHECK(op_cmp_end(&c32));
    free(ab);
    free(out);
done:
    free(f);
    free(w64);
    free(ts);
}

static void check_post(const char *line, const char *dir, int i)
{
    char path[600];
    int64_t shape[8], nt = (int64_t)cnum(line, "T", 1000);
    int nd = case_shape(line, shape);
    int64_t N = 1, B = shape[0];
    for (int k = 0; k < nd; k++)
        N *= shape[k];
    size_t l32, l64;
    snprintf(path, sizeof path, "%s/%d.f32.bin", dir, i);
    float *f = read_file(path, &l32);
    snprintf(path, sizeof path, "%s/%d.f64.bin", dir, i);
    double *w = read_file(path, &l64);
    snprintf(path, sizeof path, "%s/%d.txt", dir, i);
    FILE *tf = fopen(path, "r");
    int64_t *ts = calloc((size_t)B, 8), *ps = calloc((size_t)B, 8);
    for (int64_t b = 0; tf && b < B; b++)
        CHECK(fscanf(tf, "%lld %lld", (long long *)&ts[b], (long long *)&ps[b]) == 2);
    if (tf)
        fclose(tf);
    CHECK(f && l32 == (size_t)N * 12 && w && l64 == (size_t)N * 8 * 7);
    if (!(f && l32 == (size_t)N * 12 && w && l64 == (size_t)N * 8 * 7))
        goto done;
    double *ab = malloc((size_t)nt * 8);
    float *mean = malloc((size_t)N * 4), *lv = malloc((size_t)N * 4), *pv = malloc((size_t)N * 4);
    CHECK_RC(case_schedule(line, NULL, ab), TK_OK);
    tk_tensor tm = view(mean, F32, nd, shape), tl = view(lv, F32, nd, shape), tx0 = view(f, F32, nd, shape),
              tx = view(f + N, F32, nd, shape), tp = view(pv, F32, nd, shape), tt = view(ts, I64, 1, &B),
              tq = view(ps, I64, 1, &B), ta = view(ab, F64, 1, &nt);
    for (int var = 0; var < 6; var++) {
        for (int64_t k = 0; k < N; k++) /* the oracle's learned variance is 0.01 + |v| (float32 v, double sum) */
            pv[k] = var == 4 ? (float)(0.01 + fabs((double)f[2 * N + k])) : f[2 * N + k];
        tk_arg a[9] = {TA("mean", &tm),           TA("log_variance", &tl),       TA("x0", &tx0),
                       TA("sample", &tx),         TA("timesteps", &tt),          TA("prev_timesteps", &tq),
                       TA("alphas_cumprod", &ta), TA("predicted_variance", &tp), IA("variance_type", var)};
        CHECK_RC(op_run_cpu("ddpm_posterior", a, 9), TK_OK);
        op_cmp cm =
            op_cmp_begin(1e-30, 2 * EXACT_ULPS * 0x1.0p-24, "ddpm_posterior %s mean vs diffusers float64", line);
        /* learned: diffusers takes the log of float64 0.01 + |v|, tk of it rounded to fp32 */
        op_cmp cl = op_cmp_begin(var == 4 ? 1e-6 : 1e-30, 2 * EXACT_ULPS * 0x1.0p-24,
                                 "ddpm_posterior %s variance_type %d log_variance vs diffusers float64", line, var);
        for (int64_t k = 0; k < N; k++) {
            op_cmp_at(&cm, k, mean[k], w[k]);
            op_cmp_at(&cl, k, lv[k], w[(1 + var) * N + k]);
        }
        CHECK(op_cmp_end(&cm));
        CHECK(op_cmp_end(&cl));
    }
    free(ab);
    free(mean);
    free(lv);
    free(pv);
done:
    free(f);
    free(w);
    free(ts);
    free(ps);
}

static void check_traj(const char *line, const char *dir, int i)
{
    char path[600], kind[8];
    int ddim = !strcmp(cval(line, "kind", kind, sizeof kind), "ddim");
    int64_t shape[8], mshape[8], nt = (int64_t)cnum(line, "T", 1000), steps = (int64_t)cnum(line, "steps", 50);
    int nd = case_shape(line, shape), var = (int)cnum(line, "var", 0), learned = !ddim && (var == 4 || var == 5);
    int thr = (int)cnum(line, "thr", 0);
    memcpy(mshape, shape, sizeof shape);
    if (learned)
        mshape[1] *= 2;
    int64_t N = 1, B = shape[0];
    for (int k = 0; k < nd; k++)
        N *= shape[k];
    int64_t M = learned ? 2 * N : N, per32 = N + M + N + M + N + N, per64 = 2 * N;
    size_t l32, l64;
    snprintf(path, sizeof path, "%s/%d.f32.bin", dir, i);
    float *f = read_file(path, &l32);
    snprintf(path, sizeof path, "%s/%d.f64.bin", dir, i);
    double *w = read_file(path, &l64);
    int64_t *ts = calloc((size_t)steps + 1, 8), *ps = calloc((size_t)steps + 1, 8), *mine = calloc((size_t)steps, 8),
            *mprev = calloc((size_t)steps, 8);
    snprintf(path, sizeof path, "%s/%d.txt", dir, i);
    FILE *tf = fopen(path, "r");
    int64_t k = 0;
    while (tf && k <= steps && fscanf(tf, "%lld %lld", (long long *)&ts[k], (long long *)&ps[k]) == 2)
        k++;
    if (tf)
        fclose(tf);
    CHECK_EQ_INT(k, steps);
    CHECK(f && l32 == (size_t)(per32 * steps) * 4 && w && l64 == (size_t)(per64 * steps) * 8);
    if (k != steps || !f || l32 != (size_t)(per32 * steps) * 4 || !w || l64 != (size_t)(per64 * steps) * 8)
        goto done;
    /* tk's timesteps are diffusers' */
    char sp[16];
    tk_diffusion_timesteps_opts to = TK_DIFFUSION_TIMESTEPS_OPTS_INIT;
    to.num_train_timesteps = nt;
    to.timestep_spacing = *cval(line, "spacing", sp, sizeof sp) ? sp : NULL;
    to.steps_offset = (int64_t)cnum(line, "offset", 0);
    to.scheduler = ddim ? "ddim" : "ddpm";
    to.set_alpha_to_one = (int)cnum(line, "alpha_one", 1);
    CHECK_RC(tk_diffusion_timesteps(mine, mprev, steps, &to), TK_OK);
    for (int64_t s = 0; s < steps; s++) {
        CHECK_EQ_INT(mine[s], ts[s]);
        CHECK_EQ_INT(mprev[s], ddim && ps[s] < 0 && !to.set_alpha_to_one ? 0 : ps[s]);
    }
    double *ab = malloc((size_t)nt * 8);
    CHECK_RC(case_schedule(line, NULL, ab), TK_OK);
    float *prev = malloc((size_t)N * 4), *x0 = malloc((size_t)N * 4), *own = malloc((size_t)N * 4),
          *own_mo = malloc((size_t)M * 4), *own_prev = malloc((size_t)N * 4);
    int64_t *tb = malloc((size_t)B * 8), *pb = malloc((size_t)B * 8);
    memcpy(own, f, (size_t)N * 4); /* x_T */
    tk_tensor tp = view(prev, F32, nd, shape), tx0 = view(x0, F32, nd, shape), tt = view(tb, I64, 1, &B),
              tq = view(pb, I64, 1, &B), ta = view(ab, F64, 1, &nt);
    op_cmp c64 = op_cmp_begin(0, 0, "%s: prev_sample vs diffusers float64 (every step)", line);
    op_cmp c64x = op_cmp_begin(0, 0, "%s: pred_original_sample vs diffusers float64 (every step)", line);
    op_cmp c32 = op_cmp_begin(F32_ATOL, F32_RTOL, "%s: prev_sample vs diffusers float32 (every step)", line);
    op_cmp c32x = op_cmp_begin(F32_ATOL, F32_RTOL, "%s: pred_original_sample vs diffusers float32 (every step)", line);
    op_cmp ctr = op_cmp_begin(TRAJ_ATOL, TRAJ_RTOL, "%s: tk's own trajectory vs diffusers float32 (every step)", line);
    for (int64_t s = 0; s < steps; s++) {
        const float *x = f + s * per32, *mo = x + N, *z = mo + M, *r = z + N, *p32 = r + M, *x32 = p32 + N;
        const double *p64 = w + s * per64, *x64 = p64 + N;
        for (int64_t b = 0; b < B; b++) {
            tb[b] = mine[s];
            pb[b] = mprev[s];
        }
        tk_tensor tmo = view((void *)mo, F32, nd, mshape), tx = view((void *)x, F32, nd, shape),
                  tz = view((void *)z, F32, nd, shape);
        tk_arg a[16] = {TA("prev_sample", &tp),
                        TA("pred_original_sample", &tx0),
                        TA("model_output", &tmo),
                        TA("sample", &tx),
                        TA("timesteps", &tt),
                        TA("prev_timesteps", &tq),
                        TA("alphas_cumprod", &ta),
                        TA("noise", &tz),
                        IA("prediction_type", (int64_t)cnum(line, "pred", 0)),
                        IA("clip_sample", (int64_t)cnum(line, "clip", 1)),
                        FA("clip_sample_range", cnum(line, "range", 1)),
                        IA("thresholding", thr),
                        FA("dynamic_thresholding_ratio", cnum(line, "ratio", 0.995)),
                        FA("sample_max_value", cnum(line, "maxv", 1))};
        size_t na = 14;
        if (ddim) {
            a[na++] = FA("eta", cnum(line, "eta", 0));
            a[na++] = IA("use_clipped_model_output", (int64_t)cnum(line, "use_clipped", 0));
        } else {
            a[na++] = IA("variance_type", var);
        }
        const char *op = ddim ? "ddim_step" : "ddpm_step";
        CHECK_RC(op_run_cpu(op, a, na), TK_OK);
        for (int64_t e = 0; e < N; e++) {
            int64_t at = s * N + e;
            double t64 = (thr ? EXACT_ULPS_THR : EXACT_ULPS) * 0x1.0p-23 * fabs(p64[e]) +
                         (thr ? EXACT_ULPS_THR * 0x1.0p-24 * (fabs(x[e]) + 1) : 1e-30);
            op_cmp_tol(&c64, at, prev[e], p64[e], t64);
            op_cmp_tol(&c64x, at, x0[e], x64[e],
                       (thr ? EXACT_ULPS_THR : EXACT_ULPS) * 0x1.0p-23 * fabs(x64[e]) +
                           (thr ? EXACT_ULPS_THR * 0x1.0p-24 : 1e-30));
            op_cmp_at(&c32, at, prev[e], p32[e]);
            op_cmp_at(&c32x, at, x0[e], x32[e]);
            keep_worst(&worst_exact, NULL, prev[e], p64[e], t64);
            keep_worst(&worst_f32, &worst_f32_abs, prev[e], p32[e], F32_ATOL + F32_RTOL * fabs(p32[e]));
            keep_worst(&worst_f32, &worst_f32_abs, x0[e], x32[e], F32_ATOL + F32_RTOL * fabs(x32[e]));
        }
        /* tk's own trajectory: the stand-in model on tk's x_t, diffusers' noise */
        int64_t row = N / B;
        for (int64_t b = 0; b < B; b++)
            for (int64_t e = 0; e < M / B; e++)
                own_mo[b * (M / B) + e] =
                    e < row ? (float)(0.5f * own[b * row + e] + r[b * (M / B) + e]) : r[b * (M / B) + e];
        tk_tensor omo = view(own_mo, F32, nd, mshape), ox = view(own, F32, nd, shape),
                  op_ = view(own_prev, F32, nd, shape);
        a[0] = TA("prev_sample", &op_);
        a[1] = TA("sample", &ox);
        a[2] = TA("model_output", &omo);
        memmove(&a[3], &a[4], (na - 4) * sizeof a[0]); /* drop pred_original_sample */
        CHECK_RC(op_run_cpu(op, a, na - 1), TK_OK);
        memcpy(own, own_prev, (size_t)N * 4);
        for (int64_t e = 0; e < N; e++) {
            op_cmp_at(&ctr, s * N + e, own[e], p32[e]);
            keep_worst(&worst_traj, &worst_traj_abs, own[e], p32[e], TRAJ_ATOL + TRAJ_RTOL * fabs(p32[e]));
        }
    }
    CHECK(op_cmp_end(&c64));
    CHECK(op_cmp_end(&c64x));
    CHECK(op_cmp_end(&c32));
    CHECK(op_cmp_end(&c32x));
    CHECK(op_cmp_end(&ctr));
    free(ab);
    free(prev);
    free(x0);
    free(own);
    free(own_mo);
    free(own_prev);
    free(tb);
    free(pb);
done:
    free(f);
    free(w);
    free(ts);
    free(ps);
    free(mine);
    free(mprev);
}

/* The timestep lists of every spacing, scheduler and a range of step counts, against diffusers. */
static void check_ts(const char *line, const char *dir, int i)
{
    char path[600], sp[16], sch[8];
    int64_t steps = (int64_t)cnum(line, "steps", 50), nt = (int64_t)cnum(line, "T", 1000);
    int64_t *t = malloc((size_t)steps * 8), *p = malloc((size_t)steps * 8);
    tk_diffusion_timesteps_opts o = TK_DIFFUSION_TIMESTEPS_OPTS_INIT;
    o.num_train_timesteps = nt;
    o.timestep_spacing = cval(line, "spacing", sp, sizeof sp);
    o.scheduler = cval(line, "scheduler", sch, sizeof sch);
    o.steps_offset = (int64_t)cnum(line, "offset", 0);
    o.set_alpha_to_one = (int)cnum(line, "alpha_one", 1);
    CHECK_RC(tk_diffusion_timesteps(t, p, steps, &o), TK_OK);
    snprintf(path, sizeof path, "%s/%d.txt", dir, i);
    FILE *tf = fopen(path, "r");
    int64_t k = 0, wt, wp, extra = 0;
    while (tf && fscanf(tf, "%lld %lld", (long long *)&wt, (long long *)&wp) == 2) {
        if (k < steps) {
            if (t[k] != wt || p[k] != wp) {
                fprintf(stderr, "  %s: step %lld: tk %lld -> %lld, diffusers %lld -> %lld\n", line, (long long)k,
                        (long long)t[k], (long long)p[k], (long long)wt, (long long)wp);
                CHECK(!"timesteps differ");
            }
        } else {
            extra++;
            CHECK(wt == -1); /* numpy's arange gave diffusers one more: a timestep -1 */
        }
        k++;
    }
    if (tf)
        fclose(tf);
    CHECK(k == steps || (k == steps + 1 && extra == 1 && !strcmp(sp, "trailing")));
    free(t);
    free(p);
}

static void test_diffusers(void)
{
    const char *venv = getenv("TK_PY_VENV");
    char py[512], dir[] = "/tmp/tk-diffusion-XXXXXX", path[700], cmd[2048];
    snprintf(py, sizeof py, "%s/bin/python", venv && *venv ? venv : "build/py-venv");
    snprintf(cmd, sizeof cmd, "'%s' -c 'import diffusers, torch' >/dev/null 2>&1", py);
    if (system(cmd) != 0) {
        if (getenv("CI") && *getenv("CI")) {
            fprintf(stderr, "  no diffusers in %s (CI: the oracle is required; run scripts/setup.sh --test)\n", py);
            CHECK(!"diffusers oracle missing under CI");
            return;
        }
        SKIP("no diffusers venv (TK_PY_VENV or build/py-venv); run scripts/setup.sh --test");
    }
    if (!mkdtemp(dir)) {
        CHECK(!"mkdtemp");
        return;
    }
    /* the cases, and the timestep lists: every spacing and scheduler over step counts with and
     * without numpy's extra trailing step (1000 / 61) */
    snprintf(path, sizeof path, "%s/cases.txt", dir);
    FILE *cf = fopen(path, "w");
    CHECK(cf != NULL);
    if (!cf)
        return;
    int n = 0;
    char **lines = calloc(NCASES + 512, sizeof *lines);
    for (size_t c = 0; c < NCASES; c++)
        lines[n++] = strdup(diffusers_cases[c]);
    static const int counts[] = {1, 2, 3, 7, 10, 50, 61, 103, 250, 999, 1000};
    static const char *const spacings[] = {"leading", "trailing", "linspace"};
    for (int sc = 0; sc < 2; sc++)
        for (int s = 0; s < 3; s++)
            for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++)
                for (int off = 0; off < 2; off++) {
                    if (off && (s != 0 || counts[k] == 1000))
                        continue; /* steps_offset is leading's; 999 + 1 would pass the table */
                    char b[160];
                    snprintf(b, sizeof b, "kind=ts scheduler=%s T=1000 steps=%d spacing=%s offset=%d alpha_one=%d",
                             sc ? "ddim" : "ddpm", counts[k], spacings[s], off, sc && (k % 2) ? 0 : 1);
                    lines[n++] = strdup(b);
                }
    lines[n++] = strdup("kind=ts scheduler=ddim T=1001 steps=13 spacing=trailing");
    lines[n++] = strdup("kind=ts scheduler=ddpm T=77 steps=9 spacing=linspace");
    for (int c = 0; c < n; c++) {
        fprintf(cf, "%s\n", lines[c]);
        char kind[8];
        cval(lines[c], "kind", kind, sizeof kind);
        if (strcmp(kind, "sched") && strcmp(kind, "ts"))
            write_table(lines[c], dir, c);
        if (!strcmp(kind, "sched") && cnum(lines[c], "rescale", 0))
            write_unrescaled(lines[c], dir, c);
    }
    fclose(cf);
    snprintf(cmd, sizeof cmd, "'%s' tests/diffusion_oracle.py '%s'", py, dir);
    int st = system(cmd);
    CHECK(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    for (int c = 0; st == 0 && c < n; c++) {
        char kind[8];
        cval(lines[c], "kind", kind, sizeof kind);
        if (!strcmp(kind, "sched"))
            check_sched(lines[c], dir, c);
        else if (!strcmp(kind, "ts"))
            check_ts(lines[c], dir, c);
        else if (!strcmp(kind, "q"))
            check_q(lines[c], dir, c);
        else if (!strcmp(kind, "post"))
            check_post(lines[c], dir, c);
        else
            check_traj(lines[c], dir, c);
    }
    printf("diffusers: worst |diff| / tol: %.3g vs float64 (1 fp32 ulp), %.3g vs float32 per step (max |diff| "
           "%.3g), %.3g on tk's own trajectories (max |diff| %.3g)\n",
           worst_exact, worst_f32, worst_f32_abs, worst_traj, worst_traj_abs);
    for (int c = 0; c < n; c++)
        free(lines[c]);
    free(lines);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "  could not remove %s\n", dir);
}

int main(void)
{
    op_test_seed();
    RUN(test_schedule_closed_forms);
    RUN(test_schedule_errors);
    RUN(test_timesteps);
    RUN(test_steps_float64);
    RUN(test_q_posterior_float64);
    RUN(test_in_place);
    RUN(test_validation);
    RUN(test_randn);
    RUN(test_diffusers);
    return th_done();
}
