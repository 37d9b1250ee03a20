/*
 * diffusion.c — the noise-schedule ops of denoising diffusion (the ops of kernels-community/diffusion):
 * signatures, shape checks and CPU references; and tk.h's host-side schedule calls tk_noise_schedule
 * and tk_diffusion_timesteps. Each is defined as diffusers' DDPMScheduler / DDIMScheduler computes it
 * (diffusers 0.3x; docs/diffusion.md, "Noise schedules"), which the tests check on whole trajectories.
 *
 *   q_sample        out = sqrt(ab_t) x0 + sqrt(1 - ab_t) noise                      (add_noise)
 *   ddpm_posterior  q(x_{t-1} | x_t, x0): mean = c0 x0 + ct x_t, and the log variance the reverse
 *                   step uses for variance_type                     (the middle of DDPMScheduler.step)
 *   ddpm_step       one reverse step of DDPMScheduler.step (epsilon / sample / v prediction, clipping
 *                   or dynamic thresholding, fixed or learned variance)
 *   ddim_step       one reverse step of DDIMScheduler.step (eta, use_clipped_model_output)
 *   randn           standard normal draws: Philox-4x32-10 (the sample op's generator) and Box-Muller
 *
 * ab = alphas_cumprod, an f64 table [n] that tk_noise_schedule computes; ab_t = ab[timesteps[b]] per
 * batch row b (dimension 0); a negative prev_timesteps[b] is the end of the chain, ab_prev = 1 (DDIM's
 * set_alpha_to_one = False is prev 0: tk_diffusion_timesteps writes it so). The noise of a step is an
 * input, so a test feeds both sides the same draws; left out, the step adds none (its mean).
 *
 * Why the schedule is a host API and not an op: a schedule is n (about 1000) numbers computed once per
 * sampler, in float64, with a sequential cumulative product; the host needs the timesteps anyway to run
 * the loop; and the table goes to the device once as the f64 tensor the ops read. An op would be a
 * one-thread kernel and a string option squeezed into an integer. The per-element math is the ops.
 *
 * Numerics (the CPU reference is the specification; kernels-src/diffusion/diffusion.cu does the same
 * operations in the same order, compiled with --fmad=false): each element is loaded as fp32 and
 * computed in float64 with the formulas of diffusers, in its order of operations, and rounded once to
 * fp32 and then to the tensor's dtype. sqrt and the four operations are correctly rounded on both
 * sides, so CPU and GPU agree to the last bit except where log / exp (learned_range, fixed_small_log)
 * or sin / cos (randn) differ by an ulp of a double. Dynamic thresholding takes the quantile of the
 * |x0| values rounded to fp32 exactly as torch.quantile does on the CPU: q rounded to fp32, rank r =
 * q * (numel - 1) in double, weight w = fp32(r - floor(r)), lerp with one fp32 fma (w < 0.5:
 * fma(w, hi - lo, lo), else fma(-(hi - lo), 1 - w, hi)); a row holding a NaN gives NaN.
 *
 * Strided tensors are read and written through their strides. Outputs may be the inputs of their
 * shape themselves (prev_sample = sample: a step in place); prev_sample and pred_original_sample must
 * be distinct.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#define BLK 512 /* elements per chunk of the elementwise loops: stack scratch */

enum { PRED_EPSILON, PRED_SAMPLE, PRED_V, NPRED };
enum {
    VAR_FIXED_SMALL,
    VAR_FIXED_SMALL_LOG,
    VAR_FIXED_LARGE,
    VAR_FIXED_LARGE_LOG,
    VAR_LEARNED,
    VAR_LEARNED_RANGE,
    NVAR
};

static const char *const pred_names[NPRED] = {"epsilon", "sample", "v_prediction"};
static const char *const var_names[NVAR] = {"fixed_small",     "fixed_small_log", "fixed_large",
                                            "fixed_large_log", "learned",         "learned_range"};

/* ---- the schedule (tk.h) ---------------------------------------------------------------------- */

/* diffusers' betas_for_alpha_bar: beta_i = min(1 - abar((i + 1) / n) / abar(i / n), max_beta), in
 * double with the same expressions as its Python (so the betas are the same doubles). */
static double abar_cosine(double t)
{
    double c = cos((t + 0.008) / 1.008 * M_PI / 2);
    return c * c;
}
static double abar_sqrt(double t) { return 1 - sqrt(t + 0.0001); } /* Diffusion-LM's 'sqrt' */
static double abar_laplace(double t)
{
    double lmb = -0.5 * copysign(1, 0.5 - t) * log(1 - 2 * fabs(0.5 - t) + 1e-6);
    double snr = exp(lmb);
    return sqrt(snr / (1 + snr));
}

static const struct {
    const char *name;
    double (*abar)(double); /* NULL: a linspace schedule */
} schedules[] = {
    {"linear", NULL},    {"scaled_linear", NULL}, {"squaredcos_cap_v2", abar_cosine}, {"cosine", abar_cosine},
    {"sqrt", abar_sqrt}, {"sigmoid", NULL},       {"laplace", abar_laplace},
};
#define NSCHED (sizeof schedules / sizeof schedules[0])

int tk_ops__noise_schedule(double *betas, double *alphas_cumprod, const tk_noise_schedule_opts *o)
{
    tk_noise_schedule_opts def = TK_NOISE_SCHEDULE_OPTS_INIT;
    if (!o)
        o = &def;
    if (o->version < 1 || o->version > TK_NOISE_SCHEDULE_OPTS_VERSION)
        return tk__err(TK_ERR_INVALID,
                       "tk_noise_schedule: options version %u, this tk knows 1 to %d\nHINT: declare "
                       "them with TK_NOISE_SCHEDULE_OPTS_INIT",
                       o->version, TK_NOISE_SCHEDULE_OPTS_VERSION);
    int64_t n = o->num_train_timesteps;
    if (n < 1 || n > ((int64_t)1 << 24))
        return tk__err(TK_ERR_INVALID, "tk_noise_schedule: num_train_timesteps is %lld, want 1 to 16777216",
                       (long long)n);
    const char *name = o->beta_schedule ? o->beta_schedule : "linear";
    size_t k = 0;
    while (!o->trained_betas && k < NSCHED && strcmp(schedules[k].name, name) != 0)
        k++;
    if (k == NSCHED)
        return tk__err(TK_ERR_INVALID,
                       "tk_noise_schedule: unknown beta_schedule '%s'\nHINT: linear, scaled_linear, "
                       "squaredcos_cap_v2 (or cosine), sqrt, sigmoid or laplace; or pass trained_betas",
                       name);
    int linspace = !o->trained_betas && !schedules[k].abar;
    if (linspace && (!isfinite(o->beta_start) || !isfinite(o->beta_end)))
        return tk__err(TK_ERR_INVALID, "tk_noise_schedule: beta_start %g and beta_end %g must be finite", o->beta_start,
                       o->beta_end);
    if (linspace && !strcmp(name, "scaled_linear") && (o->beta_start < 0 || o->beta_end < 0))
        return tk__err(TK_ERR_INVALID,
                       "tk_noise_schedule: scaled_linear takes square roots of beta_start %g and "
                       "beta_end %g: want both >= 0",
                       o->beta_start, o->beta_end);
    if (!o->trained_betas && !linspace && !(o->max_beta > 0 && o->max_beta <= 1))
        return tk__err(TK_ERR_INVALID, "tk_noise_schedule: max_beta is %g, want a value in (0, 1]", o->max_beta);
    if (o->rescale_betas_zero_snr && n < 2)
        return tk__err(TK_ERR_INVALID, "tk_noise_schedule: rescale_betas_zero_snr needs at least 2 timesteps, got %lld",
                       (long long)n);

    double *b = malloc((size_t)n * sizeof *b), *ab = malloc((size_t)n * sizeof *ab);
    int rc = TK_OK;
    if (!b || !ab) {
        rc = tk__err(TK_ERR_NOMEM, "tk_noise_schedule: out of memory for %lld timesteps", (long long)n);
        goto done;
    }
    for (int64_t i = 0; i < n; i++) {
        double f = n > 1 ? (double)i / (double)(n - 1) : 0; /* linspace's position */
        if (o->trained_betas) {
            b[i] = o->trained_betas[i];
        } else if (schedules[k].abar) {
            double t1 = (double)i / (double)n, t2 = (double)(i + 1) / (double)n;
            double v = 1 - schedules[k].abar(t2) / schedules[k].abar(t1);
            b[i] = o->max_beta < v ? o->max_beta : v;
        } else if (!strcmp(name, "linear")) {
            b[i] = o->beta_start + (o->beta_end - o->beta_start) * f;
        } else if (!strcmp(name, "scaled_linear")) {
            double s0 = sqrt(o->beta_start), s1 = sqrt(o->beta_end), s = s0 + (s1 - s0) * f;
            b[i] = s * s;
        } else { /* sigmoid: sigmoid(linspace(-6, 6)) * (end - start) + start */
            b[i] = 1 / (1 + exp(-(-6 + 12 * f))) * (o->beta_end - o->beta_start) + o->beta_start;
        }
    }
    for (int64_t i = 0; i < n; i++)
        if (!(b[i] >= 0 && b[i] <= 1)) {
            rc = tk__err(TK_ERR_INVALID,
                         "tk_noise_schedule: beta[%lld] = %g is outside [0, 1] (%s)\nHINT: check "
                         "beta_start and beta_end",
                         (long long)i, b[i], o->trained_betas ? "trained_betas" : name);
            goto done;
        }
    if (o->rescale_betas_zero_snr) { /* Lin et al. 2023, Algorithm 1, as diffusers' rescale_zero_terminal_snr */
        double acc = 1;
        for (int64_t i = 0; i < n; i++) {
            acc *= 1 - b[i];
            ab[i] = sqrt(acc);
        }
        double s0 = ab[0], sT = ab[n - 1];
        if (!(s0 > sT)) {
            rc = tk__err(TK_ERR_INVALID,
                         "tk_noise_schedule: rescale_betas_zero_snr needs sqrt(alphas_cumprod) to "
                         "fall (first %g, last %g)",
                         s0, sT);
            goto done;
        }
        for (int64_t i = 0; i < n; i++) {
            ab[i] -= sT;
            ab[i] *= s0 / (s0 - sT);
            ab[i] = ab[i] * ab[i];
        }
        for (int64_t i = n - 1; i >= 1; i--)
            b[i] = 1 - ab[i] / ab[i - 1];
        b[0] = 1 - ab[0];
    }
    double acc = 1;
    for (int64_t i = 0; i < n; i++) {
        acc *= 1 - b[i];
        ab[i] = acc;
    }
    if (betas)
        memcpy(betas, b, (size_t)n * sizeof *b);
    if (alphas_cumprod)
        memcpy(alphas_cumprod, ab, (size_t)n * sizeof *ab);
done:
    free(b);
    free(ab);
    return rc;
}

TK_API int tk_noise_schedule(double *betas, double *alphas_cumprod, const tk_noise_schedule_opts *opts)
{
    return tk_ops__noise_schedule(betas, alphas_cumprod, opts);
}

/* numpy's float arange(start, stop, step): ceil((stop - start) / step) values, start + i * delta with
 * delta = (start + step) - start (its fill), the second value start + step. */
static double np_arange_at(double start, double step, int64_t i)
{
    if (i == 0)
        return start;
    if (i == 1)
        return start + step;
    double delta = (start + step) - start;
    return start + (double)i * delta;
}

TK_API int tk_diffusion_timesteps(int64_t *timesteps, int64_t *prev_timesteps, int64_t steps,
                                  const tk_diffusion_timesteps_opts *opts)
{
    tk_diffusion_timesteps_opts def = TK_DIFFUSION_TIMESTEPS_OPTS_INIT;
    const tk_diffusion_timesteps_opts *o = opts ? opts : &def;
    if (o->version < 1 || o->version > TK_DIFFUSION_TIMESTEPS_OPTS_VERSION)
        return tk__err(TK_ERR_INVALID,
                       "tk_diffusion_timesteps: options version %u, this tk knows 1 to %d\nHINT: "
                       "declare them with TK_DIFFUSION_TIMESTEPS_OPTS_INIT",
                       o->version, TK_DIFFUSION_TIMESTEPS_OPTS_VERSION);
    int64_t n = o->num_train_timesteps;
    const char *sp = o->timestep_spacing ? o->timestep_spacing : "leading";
    const char *sch = o->scheduler ? o->scheduler : "ddpm";
    if (!timesteps)
        return tk__err(TK_ERR_INVALID, "tk_diffusion_timesteps: timesteps is NULL");
    if (n < 1 || n > ((int64_t)1 << 24))
        return tk__err(TK_ERR_INVALID, "tk_diffusion_timesteps: num_train_timesteps is %lld, want 1 to 16777216",
                       (long long)n);
    if (steps < 1 || steps > n)
        return tk__err(TK_ERR_INVALID,
                       "tk_diffusion_timesteps: num_inference_steps is %lld, want 1 to "
                       "num_train_timesteps (%lld)",
                       (long long)steps, (long long)n);
    int ddim = !strcmp(sch, "ddim");
    if (!ddim && strcmp(sch, "ddpm") != 0)
        return tk__err(TK_ERR_INVALID,
                       "tk_diffusion_timesteps: unknown scheduler '%s'\nHINT: \"ddpm\" (the previous "
                       "timestep is the next one of the list) or \"ddim\" (t - num_train_timesteps / steps)",
                       sch);
    if (strcmp(sp, "leading") != 0 && strcmp(sp, "trailing") != 0 && strcmp(sp, "linspace") != 0)
        return tk__err(TK_ERR_INVALID,
                       "tk_diffusion_timesteps: unknown timestep_spacing '%s'\nHINT: leading, "
                       "trailing or linspace",
                       sp);
    if (o->steps_offset < 0 || o->steps_offset >= n)
        return tk__err(TK_ERR_INVALID, "tk_diffusion_timesteps: steps_offset is %lld, want 0 to %lld",
                       (long long)o->steps_offset, (long long)(n - 1));
    for (int64_t i = 0; i < steps; i++) {
        int64_t t;
        if (!strcmp(sp, "leading")) { /* (arange(steps) * (n // steps))[::-1] + steps_offset */
            t = (steps - 1 - i) * (n / steps) + o->steps_offset;
        } else if (!strcmp(sp, "trailing")) { /* round(arange(n, 0, -n / steps)) - 1 */
            t = (int64_t)rint(np_arange_at((double)n, -((double)n / (double)steps), i)) - 1;
        } else { /* linspace(0, n - 1, steps).round()[::-1] */
            int64_t j = steps - 1 - i;
            double v = steps == 1       ? 0
                       : j == steps - 1 ? (double)(n - 1)
                                        : (double)j * ((double)(n - 1) / (double)(steps - 1));
            t = (int64_t)rint(v);
        }
        if (t < 0 || t >= n)
            return tk__err(TK_ERR_INVALID,
                           "tk_diffusion_timesteps: %s spacing with steps_offset %lld gives timestep "
                           "%lld, outside [0, %lld)\nHINT: lower steps_offset or num_inference_steps",
                           sp, (long long)o->steps_offset, (long long)t, (long long)n);
        timesteps[i] = t;
    }
    if (prev_timesteps)
        for (int64_t i = 0; i < steps; i++) {
            int64_t p = ddim ? timesteps[i] - n / steps : i + 1 < steps ? timesteps[i + 1] : -1;
            prev_timesteps[i] = p < 0 && !o->set_alpha_to_one ? 0 : p;
        }
    return TK_OK;
}

/* ---- Philox normal draws (randn) --------------------------------------------------------------- */

/* Elements 2p and 2p + 1: one Philox-4x32-10 block (key seed, counter (p, offset)), two 53-bit
 * uniforms u1 in (0, 1] and u2 in [0, 1), Box-Muller in double. */
static void normal_pair(double z[2], uint64_t seed, uint64_t p, uint64_t offset)
{
    uint32_t ctr[4] = {(uint32_t)p, (uint32_t)(p >> 32), (uint32_t)offset, (uint32_t)(offset >> 32)};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)}, o[4];
    tk_ops__philox4x32_10(o, ctr, key);
    double u1 = (double)(((((uint64_t)o[1] << 32) | o[0]) >> 11) + 1) * 0x1.0p-53;
    double u2 = (double)((((uint64_t)o[3] << 32) | o[2]) >> 11) * 0x1.0p-53;
    double r = sqrt(-2 * log(u1)), a = 2 * M_PI * u2;
    z[0] = r * cos(a);
    z[1] = r * sin(a);
}

/* ---- the math of one element ------------------------------------------------------------------- */

/* Everything per batch row: ab at t and at prev (1 when prev < 0), t itself. */
typedef struct {
    double at, ap;
    int64_t t;
} trow;

typedef struct {
    int pred, var, clip, thr, use_clipped;
    double clip_range, ratio, max_value, eta;
} step_opts;

static double x0_of(int pred, double m, double x, double at)
{
    double bt = 1 - at;
    if (pred == PRED_EPSILON)
        return (x - sqrt(bt) * m) / sqrt(at);
    if (pred == PRED_SAMPLE)
        return m;
    return sqrt(at) * x - sqrt(bt) * m;
}

/* Clipping, or dynamic thresholding with the row's s (NaN: the row held a NaN). NaN stays NaN. */
static double clip_x0(const step_opts *o, double x0, float s)
{
    if (o->thr) {
        if (isnan(s))
            return NAN;
        double v = x0<-(double)s ? -(double)s : x0>(double) s ? (double)s : x0;
        return v / (double)s;
    }
    if (o->clip) {
        double r = o->clip_range;
        return x0 < -r ? -r : x0 > r ? r : x0;
    }
    return x0;
}

/* The posterior's log variance (ddpm_posterior) and the step's standard deviation (ddpm_step), as
 * DDPMScheduler._get_variance and step compute them. pv is the predicted variance (learned types). */
static double ddpm_var_clamped(const trow *r)
{
    double bt = 1 - r->at, bp = 1 - r->ap, cb = 1 - r->at / r->ap;
    double v = bp / bt * cb;
    return v < 1e-20 ? 1e-20 : v;
}

static double ddpm_log_variance(int var, const trow *r, double pv)
{
    double cb = 1 - r->at / r->ap, v = ddpm_var_clamped(r);
    switch (var) {
    case VAR_FIXED_SMALL:
    case VAR_FIXED_SMALL_LOG: return log(v);
    case VAR_FIXED_LARGE:
    case VAR_FIXED_LARGE_LOG: return log(cb);
    case VAR_LEARNED: return log(pv);
    default: {
        double frac = (pv + 1) / 2;
        return frac * log(cb) + (1 - frac) * log(v);
    }
    }
}

static double ddpm_std(int var, const trow *r, double pv)
{
    double cb = 1 - r->at / r->ap;
    switch (var) {
    case VAR_FIXED_SMALL: return sqrt(ddpm_var_clamped(r));
    case VAR_FIXED_SMALL_LOG: return exp(0.5 * log(ddpm_var_clamped(r)));
    case VAR_FIXED_LARGE: return sqrt(cb);
    case VAR_LEARNED: return sqrt(pv);
    default: return exp(0.5 * ddpm_log_variance(VAR_LEARNED_RANGE, r, pv));
    }
}

/* The posterior mean c0 x0 + ct x_t (DDPMScheduler.step's pred_prev_sample). */
static double ddpm_mean(const trow *r, double x0, double x)
{
    double bt = 1 - r->at, bp = 1 - r->ap, ca = r->at / r->ap, cb = 1 - ca;
    double c0 = sqrt(r->ap) * cb / bt, ct = sqrt(ca) * bp / bt;
    return c0 * x0 + ct * x;
}

/* One DDPM step: *x0 gets the clipped pred_original_sample. has_z: a noise value z is given. */
static double ddpm_elem(const step_opts *o, const trow *r, double m, double x, double pv, int has_z, double z, float s,
                        double *x0)
{
    *x0 = clip_x0(o, x0_of(o->pred, m, x, r->at), s);
    double prev = ddpm_mean(r, *x0, x);
    if (has_z && r->t > 0)
        prev = prev + ddpm_std(o->var, r, pv) * z;
    return prev;
}

/* One DDIM step (DDIMScheduler.step). */
static double ddim_elem(const step_opts *o, const trow *r, double m, double x, int has_z, double z, float s,
                        double *x0_out)
{
    double at = r->at, ap = r->ap, bt = 1 - at, x0, eps;
    if (o->pred == PRED_EPSILON) {
        x0 = (x - sqrt(bt) * m) / sqrt(at);
        eps = m;
    } else if (o->pred == PRED_SAMPLE) {
        x0 = m;
        eps = (x - sqrt(at) * x0) / sqrt(bt);
    } else {
        x0 = sqrt(at) * x - sqrt(bt) * m;
        eps = sqrt(at) * m + sqrt(bt) * x;
    }
    x0 = clip_x0(o, x0, s);
    double bp = 1 - ap, variance = (bp / bt) * (1 - at / ap), std = o->eta * sqrt(variance);
    if (o->use_clipped)
        eps = (x - sqrt(at) * x0) / sqrt(bt);
    double dir = sqrt(1 - ap - std * std) * eps;
    double prev = sqrt(ap) * x0 + dir;
    if (o->eta > 0 && has_z)
        prev = prev + std * z;
    *x0_out = x0;
    return prev;
}

/* torch.quantile(v, q) (linear) on the CPU for n fp32 values >= 0, sorted in place; NaN if any is NaN. */
static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static float quantile(float *v, int64_t n, double ratio)
{
    for (int64_t i = 0; i < n; i++)
        if (isnan(v[i]))
            return NAN;
    qsort(v, (size_t)n, sizeof *v, cmp_float);
    double rank = (double)(float)ratio * (double)(n - 1);
    int64_t lo = (int64_t)rank, hi = (int64_t)ceil(rank);
    if (hi > n - 1)
        hi = n - 1;
    float w = (float)(rank - (double)lo), a = v[lo], b = v[hi], d = b - a;
    return fabsf(w) < 0.5f ? fmaf(w, d, a) : fmaf(-d, 1.0f - w, b);
}

/* ---- parameters -------------------------------------------------------------------------------- */

enum { Q_OUT, Q_X0, Q_NOISE, Q_TS, Q_AB };
enum { P_MEAN, P_LOGVAR, P_X0, P_SAMPLE, P_TS, P_PREV, P_AB, P_PV, P_VARTYPE };
/* ddpm_step and ddim_step share their first eight parameters */
enum { S_PREV_SAMPLE, S_X0, S_MO, S_SAMPLE, S_TS, S_PREV, S_AB, S_NOISE };
enum { D_PRED = 8, D_VAR, D_CLIP, D_RANGE, D_THR, D_RATIO, D_MAXV };                       /* ddpm_step */
enum { I_ETA = 8, I_PRED, I_CLIP, I_RANGE, I_THR, I_RATIO, I_MAXV, I_USE_CLIPPED };         /* ddim_step */
enum { R_OUT, R_SEED, R_OFFSET };

typedef enum { OP_Q, OP_POST, OP_DDPM, OP_DDIM } op_kind;

/* ---- shape checks ------------------------------------------------------------------------------ */

static const char *pname(const tk_op_call *c, int i) { return c->op->params[i].name; }

/* Tensor i has the shape of tensor j. */
static int same_as(const tk_op_call *c, int i, int j)
{
    const tk_tensor *a = c->t[i], *b = c->t[j];
    if (!a || tk_ops__same_shape(a, b))
        return TK_OK;
    return tk__err(TK_ERR_INVALID, "%s: '%s' has shape %s, want %s (the shape of '%s')", c->op->name, pname(c, i),
                   tk_ops__shape_fmt(a->ndim, a->shape), tk_ops__shape_fmt(b->ndim, b->shape), pname(c, j));
}

/* Tensor i is [b]: one value per batch row of tensor j. */
static int per_row(const tk_op_call *c, int i, int j)
{
    const tk_tensor *t = c->t[i], *x = c->t[j];
    if (t->shape[0] == x->shape[0])
        return TK_OK;
    return tk__err(TK_ERR_INVALID, "%s: '%s' has shape %s, want [%lld] (one value per batch row of '%s' %s)",
                   c->op->name, pname(c, i), tk_ops__shape_fmt(t->ndim, t->shape), (long long)x->shape[0], pname(c, j),
                   tk_ops__shape_fmt(x->ndim, x->shape));
}

static int table_ok(const tk_op_call *c, int i)
{
    if (c->t[i]->shape[0] >= 1)
        return TK_OK;
    return tk__err(TK_ERR_INVALID,
                   "%s: '%s' is empty: want the schedule's n >= 1 values\nHINT: tk_noise_schedule "
                   "(tk.h) computes alphas_cumprod",
                   c->op->name, pname(c, i));
}

static int distinct(const tk_op_call *c, int i, int j)
{
    const tk_tensor *a = c->t[i], *b = c->t[j];
    if (!a || !b || tk_ops__numel(a) == 0 || tk_ops__base(a) != tk_ops__base(b))
        return TK_OK;
    return tk__err(TK_ERR_INVALID, "%s: '%s' and '%s' are the same memory; they are two results", c->op->name,
                   pname(c, i), pname(c, j));
}

static int enum_ok(const tk_op_call *c, int i, int n, const char *const *names)
{
    int64_t v = c->i[i];
    if (v >= 0 && v < n)
        return TK_OK;
    char list[160];
    size_t len = 0;
    for (int k = 0; k < n && len < sizeof list; k++)
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%d %s", k ? ", " : "", k, names[k]);
    return tk__err(TK_ERR_INVALID, "%s: '%s' is %lld, want one of %s", c->op->name, pname(c, i), (long long)v, list);
}

static int flag_ok(const tk_op_call *c, int i)
{
    if (c->i[i] == 0 || c->i[i] == 1)
        return TK_OK;
    return tk__err(TK_ERR_INVALID, "%s: '%s' is %lld, want 0 or 1", c->op->name, pname(c, i), (long long)c->i[i]);
}

static int check_q(const tk_op_call *c)
{
    int rc;
    if ((rc = same_as(c, Q_OUT, Q_X0)) || (rc = same_as(c, Q_NOISE, Q_X0)) || (rc = per_row(c, Q_TS, Q_X0)))
        return rc;
    return tk_ops__numel(c->t[Q_X0]) ? table_ok(c, Q_AB) : TK_OK;
}

static int check_post(const tk_op_call *c)
{
    int rc;
    if ((rc = same_as(c, P_MEAN, P_X0)) || (rc = same_as(c, P_LOGVAR, P_X0)) || (rc = same_as(c, P_SAMPLE, P_X0)) ||
        (rc = same_as(c, P_PV, P_X0)) || (rc = per_row(c, P_TS, P_X0)) || (rc = per_row(c, P_PREV, P_X0)) ||
        (rc = enum_ok(c, P_VARTYPE, NVAR, var_names)) || (rc = distinct(c, P_MEAN, P_LOGVAR)))
        return rc;
    int64_t v = c->i[P_VARTYPE];
    if ((v == VAR_LEARNED || v == VAR_LEARNED_RANGE) && !c->t[P_PV])
        return tk__err(TK_ERR_INVALID,
                       "%s: variance_type %lld (%s) needs 'predicted_variance' (the model's second "
                       "half of channels)",
                       c->op->name, (long long)v, var_names[v]);
    return tk_ops__numel(c->t[P_X0]) ? table_ok(c, P_AB) : TK_OK;
}

/* The model output's dimension 1: the sample's c, or 2c for the learned variance types (diffusers
 * splits model_output along dimension 1: the second half is the predicted variance). */
static int check_model_output(const tk_op_call *c, int learned)
{
    const tk_tensor *mo = c->t[S_MO], *x = c->t[S_SAMPLE];
    int same = mo->ndim == x->ndim;
    for (int32_t k = 0; same && k < x->ndim; k++)
        same = mo->shape[k] == (k == 1 && learned ? 2 * x->shape[1] : x->shape[k]);
    if (same)
        return TK_OK;
    int64_t want[TK_OPS_MAX_RANK];
    memcpy(want, x->shape, (size_t)x->ndim * sizeof *want);
    if (learned)
        want[1] *= 2;
    return tk__err(TK_ERR_INVALID, "%s: 'model_output' has shape %s, want %s (%s)", c->op->name,
                   tk_ops__shape_fmt(mo->ndim, mo->shape), tk_ops__shape_fmt(x->ndim, want),
                   learned ? "the learned variance types: the sample's channels, then as many of predicted variance"
                           : "the shape of 'sample'");
}

static int check_clip(const tk_op_call *c, int clip, int range, int thr, int ratio, int maxv)
{
    int rc;
    if ((rc = flag_ok(c, clip)) || (rc = flag_ok(c, thr)))
        return rc;
    if (c->i[clip] && !c->i[thr] && !(c->f[range] > 0 && isfinite(c->f[range])))
        return tk__err(TK_ERR_INVALID, "%s: 'clip_sample_range' is %g, want a finite value > 0 (or clip_sample=0)",
                       c->op->name, c->f[range]);
    if (c->i[thr] && !(c->f[ratio] >= 0 && c->f[ratio] <= 1))
        return tk__err(TK_ERR_INVALID, "%s: 'dynamic_thresholding_ratio' is %g, want a quantile in [0, 1]", c->op->name,
                       c->f[ratio]);
    if (c->i[thr] && !(c->f[maxv] > 0 && isfinite(c->f[maxv])))
        return tk__err(TK_ERR_INVALID, "%s: 'sample_max_value' is %g, want a finite value > 0", c->op->name,
                       c->f[maxv]);
    if (c->i[thr] &&
        tk_ops__numel(c->t[S_SAMPLE]) / (c->t[S_SAMPLE]->shape[0] ? c->t[S_SAMPLE]->shape[0] : 1) > ((int64_t)1 << 24))
        return tk__err(TK_ERR_INVALID,
                       "%s: dynamic thresholding takes a quantile over a batch row of 'sample' %s: at "
                       "most 2^24 elements, as torch.quantile",
                       c->op->name, tk_ops__shape_fmt(c->t[S_SAMPLE]->ndim, c->t[S_SAMPLE]->shape));
    return TK_OK;
}

static int check_step_common(const tk_op_call *c)
{
    int rc;
    if ((rc = same_as(c, S_PREV_SAMPLE, S_SAMPLE)) || (rc = same_as(c, S_X0, S_SAMPLE)) ||
        (rc = same_as(c, S_NOISE, S_SAMPLE)) || (rc = per_row(c, S_TS, S_SAMPLE)) ||
        (rc = per_row(c, S_PREV, S_SAMPLE)) || (rc = distinct(c, S_PREV_SAMPLE, S_X0)))
        return rc;
    return tk_ops__numel(c->t[S_SAMPLE]) ? table_ok(c, S_AB) : TK_OK;
}

static int check_ddpm(const tk_op_call *c)
{
    int rc;
    if ((rc = enum_ok(c, D_PRED, NPRED, pred_names)) || (rc = enum_ok(c, D_VAR, NVAR, var_names)))
        return rc;
    if (c->i[D_VAR] == VAR_FIXED_LARGE_LOG)
        return tk__err(TK_ERR_INVALID,
                       "%s: variance_type 3 (fixed_large_log) is not a step's variance: diffusers' "
                       "DDPMScheduler.step takes the square root of log(beta), a NaN\nHINT: use 2 (fixed_large); "
                       "ddpm_posterior gives its log variance",
                       c->op->name);
    int learned = c->i[D_VAR] == VAR_LEARNED || c->i[D_VAR] == VAR_LEARNED_RANGE;
    if ((rc = check_model_output(c, learned)) || (rc = check_step_common(c)))
        return rc;
    return check_clip(c, D_CLIP, D_RANGE, D_THR, D_RATIO, D_MAXV);
}

static int check_ddim(const tk_op_call *c)
{
    int rc;
    if ((rc = enum_ok(c, I_PRED, NPRED, pred_names)) || (rc = flag_ok(c, I_USE_CLIPPED)) ||
        (rc = check_model_output(c, 0)) || (rc = check_step_common(c)))
        return rc;
    if (!(c->f[I_ETA] >= 0 && isfinite(c->f[I_ETA])))
        return tk__err(TK_ERR_INVALID, "%s: 'eta' is %g, want a finite value >= 0 (0: DDIM, 1: DDPM's variance)",
                       c->op->name, c->f[I_ETA]);
    return check_clip(c, I_CLIP, I_RANGE, I_THR, I_RATIO, I_MAXV);
}

/* ---- CPU references ---------------------------------------------------------------------------- */

/* A tensor seen as its flat (row-major) elements. */
typedef struct {
    const tk_tensor *t;
    int contig;
} flat;

static flat flat_of(const tk_tensor *t)
{
    flat f = {t, t ? tk_ops__contiguous(t) : 1};
    return f;
}

static int64_t flat_off(const flat *f, int64_t i)
{
    if (f->contig)
        return i;
    const tk_tensor *t = f->t;
    int64_t off = 0;
    for (int32_t k = t->ndim - 1; k >= 0; k--) {
        off += (i % t->shape[k]) * t->strides[k];
        i /= t->shape[k];
    }
    return off;
}

/* Elements [i0, i0 + n) as doubles (n <= BLK). */
static void load_d(double *dst, const flat *f, int64_t i0, int64_t n)
{
    float v[BLK];
    if (f->contig) {
        tk_ops__load_f32(v, tk_ops__base(f->t), i0, 1, n, f->t->dtype);
    } else {
        for (int64_t k = 0; k < n; k++)
            tk_ops__load_f32(&v[k], tk_ops__base(f->t), flat_off(f, i0 + k), 1, 1, f->t->dtype);
    }
    for (int64_t k = 0; k < n; k++)
        dst[k] = v[k];
}

/* Stores n doubles, each rounded to fp32 and then to the dtype. */
static void store_d(const flat *f, int64_t i0, const double *src, int64_t n)
{
    float v[BLK];
    for (int64_t k = 0; k < n; k++)
        v[k] = (float)src[k];
    if (f->contig) {
        tk_ops__store_f32(tk_ops__base(f->t), i0, 1, v, n, f->t->dtype);
    } else {
        for (int64_t k = 0; k < n; k++)
            tk_ops__store_f32(tk_ops__base(f->t), flat_off(f, i0 + k), 1, &v[k], 1, f->t->dtype);
    }
}

static int64_t i64_at(const tk_tensor *t, int64_t i)
{
    return ((const int64_t *)tk_ops__base(t))[i * tk_ops__col_stride(t)];
}

static double f64_at(const tk_tensor *t, int64_t i)
{
    return ((const double *)tk_ops__base(t))[i * tk_ops__col_stride(t)];
}

/* Checks the table and the timesteps the call reads, then fills rows[b]. prev < 0: ab_prev = 1. */
static int read_rows(trow *rows, const tk_op_call *c, int ts, int prev, int ab, int64_t B)
{
    const tk_tensor *tab = c->t[ab];
    int64_t n = tab->shape[0];
    const char *op = c->op->name;
    for (int64_t i = 0; i < n; i++) {
        double v = f64_at(tab, i);
        if (!(v >= 0 && v <= 1))
            return tk__err(TK_ERR_INVALID,
                           "%s: 'alphas_cumprod'[%lld] = %g is outside [0, 1]\nHINT: a schedule's "
                           "cumulative products fall from near 1 towards 0; tk_noise_schedule (tk.h) computes them "
                           "(tk run-op: --arg alphas_cumprod=0.5)",
                           op, (long long)i, v);
    }
    for (int64_t b = 0; b < B; b++) {
        int64_t t = i64_at(c->t[ts], b), p = prev >= 0 ? i64_at(c->t[prev], b) : -1;
        if (t < 0 || t >= n)
            return tk__err(TK_ERR_INVALID,
                           "%s: 'timesteps'[%lld] = %lld is outside [0, %lld) (the rows of "
                           "'alphas_cumprod')",
                           op, (long long)b, (long long)t, (long long)n);
        if (p >= n)
            return tk__err(TK_ERR_INVALID,
                           "%s: 'prev_timesteps'[%lld] = %lld is outside [0, %lld) (negative: the "
                           "end of the chain, alphas_cumprod 1)",
                           op, (long long)b, (long long)p, (long long)n);
        rows[b].t = t;
        rows[b].at = f64_at(tab, t);
        rows[b].ap = p >= 0 ? f64_at(tab, p) : 1.0;
    }
    return TK_OK;
}

typedef struct {
    const tk_op_call *c;
    op_kind kind;
    step_opts o;
    const trow *rows;
    const float *s; /* thresholding: each batch row's s */
    int64_t row, mrow; /* elements per batch row of sample / x0 and of model_output */
    flat f[8];          /* the op's first eight parameters (tensors), flat */
    int failed;
} dif_job;

/* Elements [lo, hi) of the elementwise ops, in chunks that stay inside one batch row. */
static void elem_range(void *arg, int64_t lo, int64_t hi)
{
    dif_job *j = arg;
    const tk_op_call *c = j->c;
    double a[BLK], x[BLK], z[BLK], pv[BLK], r0[BLK], r1[BLK];
    for (int64_t i = lo; i < hi;) {
        int64_t b = i / j->row, e = i % j->row, n = hi - i;
        if (n > BLK)
            n = BLK;
        if (n > j->row - e)
            n = j->row - e;
        const trow *r = &j->rows[b];
        switch (j->kind) {
        case OP_Q: {
            load_d(a, &j->f[Q_X0], i, n);
            load_d(z, &j->f[Q_NOISE], i, n);
            double sa = sqrt(r->at), sb = sqrt(1 - r->at);
            for (int64_t k = 0; k < n; k++)
                r0[k] = sa * a[k] + sb * z[k];
            store_d(&j->f[Q_OUT], i, r0, n);
            break;
        }
        case OP_POST: {
            load_d(a, &j->f[P_X0], i, n);
            load_d(x, &j->f[P_SAMPLE], i, n);
            int has_pv = c->t[P_PV] != NULL;
            if (has_pv)
                load_d(pv, &j->f[P_PV], i, n);
            for (int64_t k = 0; k < n; k++) {
                r0[k] = ddpm_mean(r, a[k], x[k]);
                if (c->t[P_LOGVAR])
                    r1[k] = ddpm_log_variance((int)c->i[P_VARTYPE], r, has_pv ? pv[k] : 0);
            }
            store_d(&j->f[P_MEAN], i, r0, n);
            if (c->t[P_LOGVAR])
                store_d(&j->f[P_LOGVAR], i, r1, n);
            break;
        }
        default: { /* the steps */
            int64_t mi = b * j->mrow + e; /* the model output's element; the predicted variance is a row later */
            int learned = j->mrow != j->row, has_z = c->t[S_NOISE] != NULL;
            load_d(a, &j->f[S_MO], mi, n);
            load_d(x, &j->f[S_SAMPLE], i, n);
            if (learned)
                load_d(pv, &j->f[S_MO], mi + j->row, n);
            if (has_z)
                load_d(z, &j->f[S_NOISE], i, n);
            float s = j->s ? j->s[b] : 1.0f;
            for (int64_t k = 0; k < n; k++)
                r0[k] = j->kind == OP_DDPM
                            ? ddpm_elem(&j->o, r, a[k], x[k], learned ? pv[k] : 0, has_z, has_z ? z[k] : 0, s, &r1[k])
                            : ddim_elem(&j->o, r, a[k], x[k], has_z, has_z ? z[k] : 0, s, &r1[k]);
            store_d(&j->f[S_PREV_SAMPLE], i, r0, n);
            if (c->t[S_X0])
                store_d(&j->f[S_X0], i, r1, n);
            break;
        }
        }
        i += n;
    }
}

/* Thresholding: each batch row's s = clamp(quantile(|x0|, ratio), 1, sample_max_value) in fp32. */
static void thr_range(void *arg, int64_t lo, int64_t hi)
{
    dif_job *j = arg;
    float *v = malloc((size_t)(j->row ? j->row : 1) * sizeof *v);
    if (!v) {
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    double a[BLK], x[BLK];
    float *s = (float *)j->s;
    for (int64_t b = lo; b < hi; b++) {
        const trow *r = &j->rows[b];
        for (int64_t e = 0; e < j->row; e += BLK) {
            int64_t n = j->row - e < BLK ? j->row - e : BLK;
            load_d(a, &j->f[S_MO], b * j->mrow + e, n);
            load_d(x, &j->f[S_SAMPLE], b * j->row + e, n);
            for (int64_t k = 0; k < n; k++)
                v[e + k] = fabsf((float)x0_of(j->o.pred, a[k], x[k], r->at));
        }
        float q = quantile(v, j->row, j->o.ratio);
        s[b] = isnan(q) ? NAN : fminf(fmaxf(q, 1.0f), (float)j->o.max_value);
    }
    free(v);
}

static int run_elementwise(const tk_op_call *c, op_kind kind, int x_param, int ts, int prev, int ab, const step_opts *o)
{
    const tk_tensor *x = c->t[x_param];
    int64_t total = tk_ops__numel(x), B = x->shape[0];
    if (total == 0)
        return TK_OK;
    dif_job j;
    memset(&j, 0, sizeof j);
    j.c = c;
    j.kind = kind;
    if (o)
        j.o = *o;
    j.row = total / B;
    j.mrow = kind == OP_DDPM || kind == OP_DDIM ? tk_ops__numel(c->t[S_MO]) / B : j.row;
    for (int i = 0; i < 8; i++)
        j.f[i] = flat_of((size_t)i < c->op->nparams && c->op->params[i].kind == TK_ARG_TENSOR ? c->t[i] : NULL);
    trow *rows = malloc((size_t)B * sizeof *rows);
    float *s = o && o->thr ? malloc((size_t)B * sizeof *s) : NULL;
    int rc = TK_OK;
    if (!rows || (o && o->thr && !s)) {
        rc = tk__err(TK_ERR_NOMEM, "%s: out of memory for %lld batch rows", c->op->name, (long long)B);
        goto done;
    }
    if ((rc = read_rows(rows, c, ts, prev, ab, B)) != TK_OK)
        goto done;
    j.rows = rows;
    if (s) {
        j.s = s;
        tk_ops__parallel(B, j.row * 24, thr_range, &j);
        if (j.failed) {
            rc = tk__err(TK_ERR_NOMEM, "%s: out of memory for a batch row of %lld values", c->op->name,
                         (long long)j.row);
            goto done;
        }
    }
    tk_ops__parallel(total, 24, elem_range, &j);
done:
    free(rows);
    free(s);
    return rc;
}

static int cpu_q(const tk_op_call *c) { return run_elementwise(c, OP_Q, Q_X0, Q_TS, -1, Q_AB, NULL); }

static int cpu_post(const tk_op_call *c) { return run_elementwise(c, OP_POST, P_X0, P_TS, P_PREV, P_AB, NULL); }

static int cpu_ddpm(const tk_op_call *c)
{
    step_opts o = {(int)c->i[D_PRED],
                   (int)c->i[D_VAR],
                   (int)c->i[D_CLIP],
                   (int)c->i[D_THR],
                   0,
                   c->f[D_RANGE],
                   c->f[D_RATIO],
                   c->f[D_MAXV],
                   0};
    return run_elementwise(c, OP_DDPM, S_SAMPLE, S_TS, S_PREV, S_AB, &o);
}

static int cpu_ddim(const tk_op_call *c)
{
    step_opts o = {(int)c->i[I_PRED],
                   0,
                   (int)c->i[I_CLIP],
                   (int)c->i[I_THR],
                   (int)c->i[I_USE_CLIPPED],
                   c->f[I_RANGE],
                   c->f[I_RATIO],
                   c->f[I_MAXV],
                   c->f[I_ETA]};
    return run_elementwise(c, OP_DDIM, S_SAMPLE, S_TS, S_PREV, S_AB, &o);
}

typedef struct {
    const tk_op_call *c;
    flat out;
} randn_job;

static void randn_range(void *arg, int64_t lo, int64_t hi)
{
    randn_job *j = arg;
    uint64_t seed = (uint64_t)j->c->i[R_SEED], off = (uint64_t)j->c->i[R_OFFSET];
    double v[BLK], z[2];
    for (int64_t i = lo; i < hi; i += BLK) {
        int64_t n = hi - i < BLK ? hi - i : BLK;
        for (int64_t k = 0; k < n; k++) {
            int64_t e = i + k;
            if (k == 0 || (e & 1) == 0)
                normal_pair(z, seed, (uint64_t)e >> 1, off);
            v[k] = z[e & 1];
        }
        store_d(&j->out, i, v, n);
    }
}

static int cpu_randn(const tk_op_call *c)
{
    randn_job j = {c, flat_of(c->t[R_OUT])};
    int64_t n = tk_ops__numel(c->t[R_OUT]);
    if (n)
        tk_ops__parallel(n, 64, randn_range, &j);
    return TK_OK;
}

/* ---- the table --------------------------------------------------------------------------------- */

#define TENSOR(nm, role_, bits, like, rmin, rmax, shp, opt, docs)                                                      \
    {.name = nm,                                                                                                       \
     .kind = TK_ARG_TENSOR,                                                                                            \
     .role = role_,                                                                                                    \
     .dtypes = bits,                                                                                                   \
     .dtype_like = like,                                                                                               \
     .min_rank = rmin,                                                                                                 \
     .max_rank = rmax,                                                                                                 \
     .shape = shp,                                                                                                     \
     .optional = opt,                                                                                                  \
     .doc = docs}
#define F64(nm, dv, dc) {.name = nm, .kind = TK_ARG_F64, .optional = 1, .def = dv, .dtype_like = -1, .doc = dc}
#define I64(nm, dv, dc) {.name = nm, .kind = TK_ARG_I64, .optional = 1, .def = dv, .dtype_like = -1, .doc = dc}

#define TIMESTEPS TENSOR("timesteps", TK_OPS_IN, TK_OPS_I64, -1, 1, 1, "[b]", 0, "t of each batch row, in [0, n)")
#define PREV_TIMESTEPS                                                                                                 \
    TENSOR("prev_timesteps", TK_OPS_IN, TK_OPS_I64, -1, 1, 1, "[b]", 0,                                                \
           "the step's target timestep per row; negative: the end (alphas_cumprod 1)")
#define ALPHAS_CUMPROD                                                                                                 \
    TENSOR("alphas_cumprod", TK_OPS_IN, TK_OPS_F64, -1, 1, 1, "[n]", 0,                                                \
           "the schedule's cumulative products of 1 - beta, in [0, 1] (tk_noise_schedule)")
#define PRED_DOC "0 epsilon, 1 sample (x0), 2 v_prediction: what model_output is"
#define CLIP_PARAMS(def_clip)                                                                                          \
    I64("clip_sample", def_clip, "1: clamp the predicted x0 to [-clip_sample_range, clip_sample_range]"),              \
        F64("clip_sample_range", 1.0, "the clamp of clip_sample"),                                                     \
        I64("thresholding", 0, "1: dynamic thresholding of x0 (Imagen) instead of clip_sample"),                       \
        F64("dynamic_thresholding_ratio", 0.995, "the quantile of |x0| per batch row thresholding uses"),              \
        F64("sample_max_value", 1.0, "the largest threshold s")

static const tk_op_param q_params[] = {
    TENSOR("out", TK_OPS_OUT, TK_OPS_FLOATS, Q_X0, 1, -1, "[b, ...]", 0, "the noised sample x_t"),
    TENSOR("x0", TK_OPS_IN, TK_OPS_FLOATS, -1, 1, -1, "[b, ...]", 0, "the clean sample"),
    TENSOR("noise", TK_OPS_IN, TK_OPS_FLOATS, Q_X0, 1, -1, "[b, ...]", 0, "standard normal noise (randn)"),
    TIMESTEPS,
    ALPHAS_CUMPROD,
};

static const tk_op_param post_params[] = {
    TENSOR("mean", TK_OPS_OUT, TK_OPS_FLOATS, P_X0, 1, -1, "[b, ...]", 0, "the posterior mean c0 x0 + ct x_t"),
    TENSOR("log_variance", TK_OPS_OUT, TK_OPS_FLOATS, P_X0, 1, -1, "[b, ...]", 1,
           "the log variance of the reverse step for variance_type"),
    TENSOR("x0", TK_OPS_IN, TK_OPS_FLOATS, -1, 1, -1, "[b, ...]", 0, "x0 (the clean sample, or its prediction)"),
    TENSOR("sample", TK_OPS_IN, TK_OPS_FLOATS, P_X0, 1, -1, "[b, ...]", 0, "x_t"),
    TIMESTEPS,
    PREV_TIMESTEPS,
    ALPHAS_CUMPROD,
    TENSOR("predicted_variance", TK_OPS_IN, TK_OPS_FLOATS, P_X0, 1, -1, "[b, ...]", 1,
           "learned: the variance; learned_range: v in [-1, 1] between log beta~ and log beta"),
    I64("variance_type", 0,
        "0 fixed_small, 1 fixed_small_log, 2 fixed_large, 3 fixed_large_log, 4 learned, "
        "5 learned_range"),
};

#define STEP_TENSORS                                                                                                   \
    TENSOR("prev_sample", TK_OPS_OUT, TK_OPS_FLOATS, S_SAMPLE, 2, -1, "[b, c, ...]", 0,                                \
           "x_{t-1} (may be 'sample' itself)"),                                                                        \
        TENSOR("pred_original_sample", TK_OPS_OUT, TK_OPS_FLOATS, S_SAMPLE, 2, -1, "[b, c, ...]", 1,                   \
               "the predicted x0 after clipping or thresholding"),                                                     \
        TENSOR("model_output", TK_OPS_IN, TK_OPS_FLOATS, S_SAMPLE, 2, -1, "[b, m, ...]", 0, MO_DOC),                   \
        TENSOR("sample", TK_OPS_IN, TK_OPS_FLOATS, -1, 2, -1, "[b, c, ...]", 0, "x_t"), TIMESTEPS, PREV_TIMESTEPS,     \
        ALPHAS_CUMPROD, TENSOR("noise", TK_OPS_IN, TK_OPS_FLOATS, S_SAMPLE, 2, -1, "[b, c, ...]", 1, NOISE_DOC)

#define MO_DOC "the model's prediction; m = c, or 2*c for the learned variance types (variance second)"
#define NOISE_DOC "standard normal noise (randn); left out: none is added"

static const tk_op_param ddpm_params[] = {
    STEP_TENSORS,
    I64("prediction_type", 0, PRED_DOC),
    I64("variance_type", 0, "0 fixed_small, 1 fixed_small_log, 2 fixed_large, 4 learned, 5 learned_range"),
    CLIP_PARAMS(1),
};

static const tk_op_param ddim_params[] = {
    STEP_TENSORS,
    F64("eta", 0.0, "the noise weight: 0 deterministic DDIM, 1 DDPM's variance"),
    I64("prediction_type", 0, PRED_DOC),
    CLIP_PARAMS(1),
    I64("use_clipped_model_output", 0, "1: recompute epsilon from the clipped x0"),
};

static const tk_op_param randn_params[] = {
    TENSOR("out", TK_OPS_OUT, TK_OPS_FLOATS, -1, 0, -1, "[...]", 0, "standard normal values"),
    I64("seed", 0, "the Philox key"),
    I64("offset", 0, "the Philox counter's high half: advance it per draw (step)"),
};

#define PKG "kernels-community/diffusion"
#define N(a) (sizeof a / sizeof a[0])

const tk_op_desc tk_ops__diffusion[] = {
    {"q_sample", "diffusion", "out = sqrt(ab[t_b]) x0 + sqrt(1 - ab[t_b]) noise: forward noising (diffusers add_noise)",
     q_params, N(q_params), check_q, cpu_q, NULL, PKG},
    {"ddpm_posterior", "diffusion",
     "q(x_{t-1} | x_t, x0): mean = c0 x0 + ct x_t and the reverse step's log variance (DDPM, learned range)",
     post_params, N(post_params), check_post, cpu_post, NULL, PKG},
    {"ddpm_step", "diffusion",
     "x_{t-1} from the model output: DDPMScheduler.step (eps / x0 / v, clip or threshold, fixed or learned var)",
     ddpm_params, N(ddpm_params), check_ddpm, cpu_ddpm, NULL, PKG},
    {"ddim_step", "diffusion",
     "x_{t-1} from the model output: DDIMScheduler.step (eps / x0 / v, eta, clip or threshold)", ddim_params,
     N(ddim_params), check_ddim, cpu_ddim, NULL, PKG},
    {"randn", "diffusion", "out = standard normal draws: Philox-4x32-10 (seed, counter (i / 2, offset)), Box-Muller",
     randn_params, N(randn_params), NULL, cpu_randn, NULL, PKG},
};
const size_t tk_ops__diffusion_count = N(tk_ops__diffusion);
