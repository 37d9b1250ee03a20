#!/usr/bin/env python3
"""gpu_tp.py — a model split over 2 ranks on the GPU against one process on the same GPU.

    gpu_tp.py --tk TK --tk-mpi TK_MPI --mpiexec MPIEXEC --work DIR [--device cuda|cpu] [--gpus N]
              [--models llama,qwen2,...] [--deadline S] [--json F]

scripts/gpu-check.sh runs it (phase 1f) with the bundle's tk, tk-mpi (tk linked against the bundle's
MPICH) and MPICH's mpiexec.hydra. It writes a few of tests/tp_models_make.py's tiny checkpoints
(Llama with GQA and biases, Qwen2 tied with q/k/v biases, GPT-2 with a plan file, OLMo2 with its
split q/k norms, Mixtral and Qwen3-MoE) into DIR, then for each, with `mpiexec -n 2`:
  - logits f32: `tk-mpi model logits --device DEV --dtype f32 --tp 2` against `tk model logits
    --device DEV --dtype f32` in one process: largest |difference| over the largest |logit| at most
    1e-5 (the split adds the ranks' partial sums in another order: 5e-7 on the CPU);
  - greedy f32: `tk-mpi generate --tp 2` (12 new tokens) against one process, token for token.
Each runs once a backend: on one GPU (or --device cpu) the default choice, which must be MPI staging
through host memory (rank 0's notice says so: NCCL refuses two ranks on one GPU); with --gpus 2 or
more, the default (NCCL: one GPU a rank, the notice says so) and TK_COMM_BACKEND=mpi. One row per
check goes to --json and a table to stdout, then "N passed, N failed"; the exit status is 1 if a
check failed. --deadline S stops starting checks after S seconds (each check not started is a FAIL
row saying so). --device cpu runs the same on the CPU (gpu-check's dry run: the launcher and tk-mpi
work).
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
IDS = {"qwen2": "1,5,96,33,70,12,64"}  # its vocabulary is 97; the others' 101
MODELS = ["llama", "qwen2", "gpt2", "olmo2", "mixtral", "qwen3_moe"]
GPT2_PLAN = {"transformer.wte": "embedding_rowwise",
             "transformer.h.*.attn.c_attn": {"style": "packed_colwise", "split": 3},
             "transformer.h.*.attn.c_proj": "rowwise", "transformer.h.*.mlp.c_fc": "colwise",
             "transformer.h.*.mlp.c_proj": "rowwise", "lm_head": "colwise_gather_output"}
TOL = 1e-5


def run(cmd, env=None, timeout=120):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    try:
        doc = json.loads(p.stdout) if p.stdout.strip() else {}
    except json.JSONDecodeError:
        doc = {}
    if p.returncode != 0 or "error" in doc or not doc:
        msg = doc.get("error", {}).get("message") or (p.stderr.strip().splitlines() or ["?"])[-1]
        raise RuntimeError(f"{os.path.basename(cmd[0])} {' '.join(cmd[1:3])} exit {p.returncode}: {msg}"[:600])
    return doc, p.stderr


def rel(a, b):
    if len(a) != len(b) or any(len(x) != len(y) for x, y in zip(a, b)):
        return float("inf")
    m = max(abs(v) for r in a for v in r) or 1.0
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb)) / m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tk", required=True)
    ap.add_argument("--tk-mpi", required=True)
    ap.add_argument("--mpiexec", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--deadline", type=float, default=1e9)
    ap.add_argument("--json")
    a = ap.parse_args()
    t0 = time.time()
    models = a.models.split(",")
    root = os.path.join(a.work, "tp-models")
    os.makedirs(root, exist_ok=True)
    stamp = os.path.join(root, ".made")
    if not os.path.exists(stamp) or open(stamp).read() != a.models:
        with open(os.path.join(a.work, "tp_models_make.log"), "w") as log:
            subprocess.run([sys.executable, os.path.join(HERE, "tp_models_make.py"), root, a.models], check=True,
                           stdout=log, stderr=log, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        open(stamp, "w").write(a.models)
    plan = os.path.join(a.work, "gpt2-plan.json")
    json.dump(GPT2_PLAN, open(plan, "w"))
    # (backend env, the notice rank 0 must print; None: no notice, on the CPU)
    if a.device == "cpu":
        backends = [("auto", None)]
    elif a.gpus >= 2:
        backends = [("auto", "tensor parallel on GPUs: NCCL"), ("mpi", "tensor parallel on GPUs: MPI")]
    else:
        backends = [("auto", "tensor parallel on GPUs: MPI")]
    rows = []

    def row(model, check, backend, ok, value, note=""):
        rows.append({"model": model, "check": check, "backend": backend, "status": "ok" if ok else "FAIL",
                     "value": value, "note": note})
        print(f"{model:10} {check:12} {backend:5} {'ok' if ok else 'FAIL':5} {value:>10}  {note}", flush=True)

    dev = ["--device", a.device, "--dtype", "f32"]
    for m in models:
        d = os.path.join(root, m)
        extra = ["--tp-plan", plan] if m == "gpt2" else []
        ids = IDS.get(m, "1,17,54,99,3,76,42,100,8")
        for be, notice in backends:
            env = {**os.environ, "TK_COMM_BACKEND": be, "MPIR_CVAR_ENABLE_GPU": "0"}
            mpi = [a.mpiexec, "-launcher", "fork", "-n", "2", a.tk_mpi]
            for check in ("logits_f32", "greedy_f32"):
                if time.time() - t0 > a.deadline:
                    row(m, check, be, False, "-", f"not started: past the {a.deadline:.0f} s deadline")
                    continue
                try:
                    if check == "logits_f32":
                        args = ["model", "logits", d, "--ids", ids] + dev
                    else:
                        args = ["generate", d, "--ids", ids, "--max-new-tokens", "12"] + dev
                    one, _ = run([a.tk] + args + ["--json"], env=env)
                    t1 = time.time()
                    tp, err = run(mpi + args + ["--tp", "2", "--json"] + extra, env=env)
                    secs = time.time() - t1
                    ranks = len(tp.get("tensor_parallel", {}).get("ranks", []))
                    said = notice is None or notice in err
                    why = "" if said else f"; rank 0 did not say '{notice}': {err.strip()[:200]}"
                    if ranks != 2:
                        why += f"; {ranks} ranks reported"
                    if check == "logits_f32":
                        r = rel(one["logits"], tp["logits"])
                        row(m, check, be, r <= TOL and said and ranks == 2, f"{r:.2e}",
                            f"vs one process, tolerance {TOL:g} ({secs:.1f} s){why}")
                    else:
                        same = one["ids"] == tp["ids"]
                        row(m, check, be, same and said and ranks == 2, f"{len(tp['ids'])} tok",
                            (f"same tokens ({secs:.1f} s)" if same else f"tk --tp 2 {tp['ids']} one {one['ids']}")
                            + why)
                except (RuntimeError, subprocess.TimeoutExpired, KeyError) as e:
                    row(m, check, be, False, "-", str(e)[:300])
    if a.json:
        json.dump(rows, open(a.json, "w"), indent=1)
    bad = sum(r["status"] == "FAIL" for r in rows)
    print(f"{len(rows) - bad} passed, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
