#!/usr/bin/env python3
"""The diffusers oracle of tests/test_ops_diffusion.c: DDPMScheduler and DDIMScheduler themselves.

    diffusion_oracle.py DIR

DIR/cases.txt has one case a line, as key=value words (kind= first). For case I it writes:

  kind=sched     beta_schedule, T, start, end, rescale: I.f64.bin = betas then alphas_cumprod as
                 diffusers computes them (float32, stored as float64); 'sqrt' is not in diffusers: it is
                 Diffusion-LM's get_named_beta_schedule('sqrt') (improved-diffusion's
                 betas_for_alpha_bar with alpha_bar(t) = 1 - sqrt(t + 0.0001)), in numpy float64.
                 With rescale=1 also diffusers' rescale_zero_terminal_snr run in float64 on tk's
                 unrescaled betas (DIR/I.b0.bin), and its alphas_cumprod.
  kind=ts        scheduler (ddpm|ddim), T, steps, spacing, offset, alpha_one: I.txt = one "t prev" line
                 per timestep of set_timesteps (every one diffusers makes) and the previous timestep
                 its step uses (DDPM: previous_timestep; DDIM: t - T // steps, -1 -> 0 when
                 set_alpha_to_one is false: where final_alpha_cumprod = alphas_cumprod[0] comes from).
  kind=ddpm|ddim a whole sampling run on random tensors: x_T = randn, then at every timestep a stand-in
                 model  model_output = 0.5 * x_t + r_t  (r_t random; for the learned variance types
                 the second half of the channels is the variance: learned 0.01 + u, learned_range
                 u in [-1, 1]), fresh noise z_t, and scheduler.step with that noise (DDPM: its
                 randn_tensor is replaced by one returning z_t; DDIM: variance_noise=z_t). Written:
                 I.txt "t prev" per step; I.f32.bin per step: x_t, model_output, z_t, r_t (the
                 model's x-free part, model_output's shape), prev_sample, pred_original_sample: the
                 float32 run of diffusers as users run it (its own float32 tables); I.f64.bin per
                 step: prev_sample, pred_original_sample of the same step in float64 -- the same
                 float32 inputs, the scheduler's alphas_cumprod replaced by tk's float64 table
                 (DIR/I.ab.bin, written by the C test) -- which checks tk's formulas to the last bit.
  kind=q         add_noise on x0, noise (randn) and random timesteps: I.f32.bin x0, noise, out32;
                 I.txt the timesteps; I.f64.bin out64 (tk's table, float64).
  kind=post      DDPMScheduler's posterior for random x0, x_t, timesteps and prev timesteps of a
                 50-step run and each variance type: I.f32.bin x0, x_t, predicted variance;
                 I.txt "t prev" per row; I.f64.bin the mean, then the log variance of each variance
                 type, float64 on tk's table (the mean is step() with prediction_type='sample', no
                 clipping and zero noise; the variance is _get_variance, whose log is taken here; the
                 learned type gets 0.01 + |v| as its variance).

Seeds come from the case line, so a case replays. One process for every case: importing torch and
diffusers takes seconds.
"""
import math
import sys

import numpy as np
import torch
from diffusers import DDIMScheduler, DDPMScheduler
import diffusers.schedulers.scheduling_ddpm as ddpm_mod
from diffusers.schedulers.scheduling_ddpm import rescale_zero_terminal_snr

PRED = ["epsilon", "sample", "v_prediction"]
VAR = ["fixed_small", "fixed_small_log", "fixed_large", "fixed_large_log", "learned", "learned_range"]


def diffusion_lm_sqrt_betas(n, max_beta=0.999):
    """Diffusion-LM (Li et al. 2022) get_named_beta_schedule('sqrt', n), float64."""
    alpha_bar = lambda t: 1 - np.sqrt(t + 0.0001)  # noqa: E731
    betas = []
    for i in range(n):
        t1, t2 = i / n, (i + 1) / n
        betas.append(min(1 - alpha_bar(t2) / alpha_bar(t1), max_beta))
    return np.array(betas, dtype=np.float64)


def sched_kwargs(c):
    kw = dict(num_train_timesteps=int(c["T"]), beta_start=float(c.get("start", 1e-4)),
              beta_end=float(c.get("end", 0.02)), rescale_betas_zero_snr=c.get("rescale", "0") == "1")
    name = c.get("schedule", "linear")
    if name == "sqrt":
        kw["trained_betas"] = diffusion_lm_sqrt_betas(int(c["T"]))
    else:
        kw["beta_schedule"] = "squaredcos_cap_v2" if name == "cosine" else name
    return kw


def make(c):
    kw = sched_kwargs(c)
    common = dict(prediction_type=PRED[int(c.get("pred", 0))], clip_sample=c.get("clip", "1") == "1",
                  clip_sample_range=float(c.get("range", 1)), thresholding=c.get("thr", "0") == "1",
                  dynamic_thresholding_ratio=float(c.get("ratio", 0.995)),
                  sample_max_value=float(c.get("maxv", 1)), timestep_spacing=c.get("spacing", "leading"),
                  steps_offset=int(c.get("offset", 0)))
    if c["kind"] == "ddim":
        return DDIMScheduler(**kw, **common, set_alpha_to_one=c.get("alpha_one", "1") == "1")
    return DDPMScheduler(**kw, **common, variance_type=VAR[int(c.get("var", 0))])


def to_f64(s, ab):
    """The scheduler in float64 on tk's table."""
    s.alphas_cumprod = torch.from_numpy(ab)
    s.one = torch.tensor(1.0, dtype=torch.float64)
    if isinstance(s, DDIMScheduler):
        s.final_alpha_cumprod = torch.tensor(1.0, dtype=torch.float64) if s.config.set_alpha_to_one \
            else s.alphas_cumprod[0]
    return s


class Noise:
    """randn_tensor for DDPMScheduler.step: returns the step's injected noise."""
    z = None

    @staticmethod
    def randn_tensor(shape, generator=None, device=None, dtype=None, **kw):
        assert tuple(shape) == tuple(Noise.z.shape), (shape, Noise.z.shape)
        return Noise.z.to(dtype)


ddpm_mod.randn_tensor = Noise.randn_tensor


def prev_of(s, t):
    if isinstance(s, DDIMScheduler):
        return int(t) - s.config.num_train_timesteps // s.num_inference_steps
    return int(s.previous_timestep(t))


def case_sched(c, d, i):
    kw = sched_kwargs(c)
    if c.get("schedule") == "sqrt":  # Diffusion-LM's own float64 math, not diffusers'
        b = kw["trained_betas"]
        ab = np.cumprod(1.0 - b)
    else:
        s = DDPMScheduler(**kw)
        b, ab = s.betas.double().numpy(), s.alphas_cumprod.double().numpy()
    out = [b, ab]
    if kw["rescale_betas_zero_snr"]:  # diffusers' rescale itself, in float64, on tk's unrescaled betas
        rb = rescale_zero_terminal_snr(torch.from_numpy(np.fromfile(f"{d}/{i}.b0.bin", dtype=np.float64)))
        out += [rb.numpy(), np.cumprod(1.0 - rb.numpy())]
    np.concatenate(out).astype(np.float64).tofile(f"{d}/{i}.f64.bin")


def case_ts(c, d, i):
    c = dict(c, kind=c.get("scheduler", "ddpm"))
    s = make(c)
    s.set_timesteps(int(c["steps"]))
    with open(f"{d}/{i}.txt", "w") as f:
        for t in s.timesteps:
            p = prev_of(s, t)
            if isinstance(s, DDIMScheduler) and p < 0 and not s.config.set_alpha_to_one:
                p = 0  # final_alpha_cumprod = alphas_cumprod[0]
            f.write(f"{int(t)} {p}\n")


def shape_of(c):
    return tuple(int(v) for v in c["shape"].split(","))


def case_traj(c, d, i):
    s32 = make(c)
    s64 = to_f64(make(c), np.fromfile(f"{d}/{i}.ab.bin", dtype=np.float64))
    steps = int(c["steps"])
    s32.set_timesteps(steps)
    s64.set_timesteps(steps)
    g = torch.Generator().manual_seed(int(c["seed"]))
    shape = shape_of(c)
    learned = c["kind"] == "ddpm" and VAR[int(c.get("var", 0))] in ("learned", "learned_range")
    mshape = (shape[0], 2 * shape[1]) + shape[2:] if learned else shape
    eta = float(c.get("eta", 0))
    use_clipped = c.get("use_clipped", "0") == "1"
    x = torch.randn(shape, generator=g)
    f32, f64 = open(f"{d}/{i}.f32.bin", "wb"), open(f"{d}/{i}.f64.bin", "wb")
    txt = open(f"{d}/{i}.txt", "w")
    for t in s32.timesteps:
        r = torch.randn(mshape, generator=g)
        if learned:
            u = torch.rand(shape, generator=g)
            r[:, shape[1]:] = (0.01 + u) if VAR[int(c["var"])] == "learned" else (2 * u - 1)
        mo = r.clone()
        mo[:, :shape[1]] = 0.5 * x + r[:, :shape[1]]
        z = torch.randn(shape, generator=g)
        Noise.z = z
        if c["kind"] == "ddim":
            o32 = s32.step(mo, t, x, eta=eta, use_clipped_model_output=use_clipped, variance_noise=z)
            Noise.z = z.double()
            o64 = s64.step(mo.double(), t, x.double(), eta=eta, use_clipped_model_output=use_clipped,
                           variance_noise=z.double())
        else:
            o32 = s32.step(mo, t, x)
            Noise.z = z.double()
            o64 = s64.step(mo.double(), t, x.double())
        txt.write(f"{int(t)} {prev_of(s32, t)}\n")
        for a in (x, mo, z, r, o32.prev_sample, o32.pred_original_sample):
            f32.write(a.float().contiguous().numpy().tobytes())
        for a in (o64.prev_sample, o64.pred_original_sample):
            f64.write(a.double().contiguous().numpy().tobytes())
        x = o32.prev_sample
    f32.close()
    f64.close()
    txt.close()


def case_q(c, d, i):
    s32 = make(dict(c, kind="ddpm"))
    ab = np.fromfile(f"{d}/{i}.ab.bin", dtype=np.float64)
    s64 = to_f64(make(dict(c, kind="ddpm")), ab)
    g = torch.Generator().manual_seed(int(c["seed"]))
    shape = shape_of(c)
    x0 = torch.randn(shape, generator=g) * 2
    z = torch.randn(shape, generator=g)
    ts = torch.randint(0, int(c["T"]), (shape[0],), generator=g)
    ts[0], ts[-1] = 0, int(c["T"]) - 1
    o32 = s32.add_noise(x0, z, ts)
    o64 = s64.add_noise(x0.double(), z.double(), ts)
    with open(f"{d}/{i}.f32.bin", "wb") as f:
        for a in (x0, z, o32):
            f.write(a.float().contiguous().numpy().tobytes())
    o64.double().numpy().tofile(f"{d}/{i}.f64.bin")
    with open(f"{d}/{i}.txt", "w") as f:
        f.write("".join(f"{int(t)}\n" for t in ts))


def case_post(c, d, i):
    ab = np.fromfile(f"{d}/{i}.ab.bin", dtype=np.float64)
    g = torch.Generator().manual_seed(int(c["seed"]))
    shape = shape_of(c)
    x0 = torch.randn(shape, generator=g)
    xt = torch.randn(shape, generator=g)
    pv = torch.rand(shape, generator=g) * 2 - 1  # learned_range's v; learned gets 0.01 + |v|
    s = to_f64(make(dict(c, kind="ddpm", pred="1", clip="0")), ab)
    s.set_timesteps(50)
    idx = torch.randint(0, 50, (shape[0],), generator=g)
    idx[0] = 49  # the last step: prev -1, ab_prev = 1
    rows = [(int(s.timesteps[k]), prev_of(s, s.timesteps[k])) for k in idx]
    means, out = [], []
    for b, (t, p) in enumerate(rows):  # the mean does not depend on the variance type
        Noise.z = torch.zeros((1,) + shape[1:], dtype=torch.float64)
        means.append(s.step(x0[b:b + 1].double(), t, xt[b:b + 1].double()).prev_sample)
    for vt in VAR:
        logvars = []
        for b, (t, p) in enumerate(rows):
            v = pv[b:b + 1].double()
            if vt == "learned":
                v = 0.01 + v.abs()
            var = s._get_variance(t, predicted_variance=v, variance_type=vt)
            if vt == "fixed_small_log":
                lv = 2 * torch.log(var)  # _get_variance returns the standard deviation here
            elif vt in ("fixed_large_log", "learned_range"):
                lv = var  # already a log variance
            else:
                lv = torch.log(var)
            logvars.append(torch.broadcast_to(lv, (1,) + shape[1:]))
        out.append(torch.cat(logvars))
    out = [torch.cat(means)] + out
    with open(f"{d}/{i}.f32.bin", "wb") as f:
        for a in (x0, xt, pv):
            f.write(a.float().contiguous().numpy().tobytes())
    with open(f"{d}/{i}.f64.bin", "wb") as f:
        for a in out:
            f.write(a.double().contiguous().numpy().tobytes())
    with open(f"{d}/{i}.txt", "w") as f:
        f.write("".join(f"{t} {p}\n" for t, p in rows))


def main():
    d = sys.argv[1]
    torch.set_num_threads(1)
    for i, line in enumerate(open(f"{d}/cases.txt")):
        c = dict(w.split("=", 1) for w in line.split())
        {"sched": case_sched, "ts": case_ts, "ddpm": case_traj, "ddim": case_traj, "q": case_q,
         "post": case_post}[c["kind"]](c, d, i)


if __name__ == "__main__":
    main()
