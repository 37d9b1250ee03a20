#!/usr/bin/env python3
"""gpu_models.py — the model pipelines on a GPU, checked against transformers on the same GPU.

    gpu_models.py --tk TK --work DIR [--csv F] [--json F] [--deadline S] [--only REGEX] [--tokens N]
                  [--checks greedy_f32,logits_f32,logits_bf16] [--device cuda|cpu]

scripts/gpu-check.sh runs it (phase 1d) on a machine with a GPU, torch and transformers. It writes the
tiny random checkpoints of tests/models/make_tiny.py (transformers' save_pretrained) into DIR/tiny,
then for each causal LM among them (DiffusionGemma: block_diffusion below; LLaDA and Dream, in the first
pass: masked_diffusion below):
  - logits f32: `tk model logits --device cuda --dtype f32` against the model in transformers on cuda
    in f32 (TF32 off), largest |difference| over the largest |logit|; must be below 1e-4;
    transformers always runs its eager attention: its default is version-dependent, and the sdpa path
    drops Gemma 2's attn_logit_softcapping (transformers 5.17, on the GPU image, defaults Gemma 2 to
    sdpa; 5.24 to eager), which made tk's correct Gemma 2 logits look 1.7 off;
  - greedy f32: `tk generate --device cuda` against transformers' generate() on cuda, token for token
    (the CPU path is checked the same way in CI: tests/cli/checkpoints.sh);
  - logits bf16: the same with --dtype bf16 against transformers in bf16 (reported, status "info": two
    bf16 computations round differently, and a MoE router may then pick other experts), with tk's and
    transformers' bf16 distances from the f32 oracle beside it ("look at it" when tk's is more than
    twice transformers' plus 1e-2; on the CPU, 2026-11-28, the two were within 0.7x-1.5x of each other
    on Gemma 1-3, Qwen2-MoE, Phi-3 LongRoPE and Llama).
The checks run in passes over every model, in --checks order (default: greedy f32 first: the H100 run
of 2026-11-28 checked f32 logits on all 22 checkpoints but reached generation on only 8 before its
deadline). One row per check goes to --csv/--json and a table to stdout; the exit status is 1 if a
check failed. --deadline S stops starting new checks after S seconds (the rows so far are kept; each
check not started is a FAIL row saying so).
"""
import argparse
import csv
import json
import os
import re
import subprocess
import sys
import time

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
IDS = [1, 17, 42, 99, 5, 200, 13, 77, 150, 3, 64, 250]


def tk_json(tk, args, timeout=120):
    p = subprocess.run([tk] + args + ["--json"], capture_output=True, text=True, timeout=timeout)
    try:
        doc = json.loads(p.stdout) if p.stdout.strip() else {}
    except json.JSONDecodeError:
        doc = {}
    if p.returncode != 0 or "error" in doc:
        msg = doc.get("error", {}).get("message") or (p.stderr.strip().splitlines() or ["?"])[-1]
        raise RuntimeError(f"tk {' '.join(args[:2])} exit {p.returncode}: {msg}"[:800])
    return doc


def dgemma_logits(m, ids, device):
    """DiffusionGemma in transformers as tk model logits computes it (tests/models/compare.py): the
    prompt through the encoder, the last canvas_length ids as the decoder's canvas, one denoising step
    without self-conditioning; both halves through the softcapped LM head."""
    import torch
    x = torch.tensor([ids], device=device)
    P = len(ids) - m.config.canvas_length
    with torch.no_grad():
        o = m.model(input_ids=x[:, :P], decoder_input_ids=x[:, P:])
        h = torch.cat([o.encoder_last_hidden_state[0], o.last_hidden_state[0]])
        cap = m.final_logit_softcapping
        return (torch.tanh(m.lm_head(h).float() / cap) * cap).cpu()


def block_diffusion(a, d, name, row):
    """DiffusionGemma on the GPU: logits f32 (checked, 1e-4 of the largest) and bf16 (reported) against
    transformers on the same device; then, on the damped checkpoint only (bd_generate below), tk generate
    on the device against transformers' generate() fed the same draws."""
    import torch
    import transformers
    cfg = json.load(open(os.path.join(d, "config.json")))
    ids = IDS + [7 + i for i in range(cfg.get("canvas_length", 4))]
    ref32 = None
    for dtype, tdt in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        check = f"logits_{dtype}"
        try:
            m = transformers.DiffusionGemmaForBlockDiffusion.from_pretrained(d, dtype=tdt).to(a.device).eval()
            ref = dgemma_logits(m, ids, a.device)
            del m
            got = torch.tensor(tk_json(a.tk, ["model", "logits", d, "--ids", ",".join(map(str, ids)), "--device",
                                              a.device, "--dtype", dtype])["logits"])
            rel = ((got - ref).abs().max() / ref.abs().max()).item()
            if dtype == "f32":
                ref32 = ref
                row(name, check, rel < 1e-4, f"{rel:.2e}", f"max|ref| {ref.abs().max().item():.3g}, tol 1e-4")
            elif ref32 is not None:
                scale = ref32.abs().max()
                e_tk, e_hf = ((got - ref32).abs().max() / scale).item(), ((ref - ref32).abs().max() / scale).item()
                row(name, check, True, f"{rel:.2e}", f"from f32: tk {e_tk:.2e}, transformers {e_hf:.2e}"
                    + ("; tk's bf16 is off: look at it" if e_tk > 2 * e_hf + 1e-2 else ""), status="info")
        except Exception as e:
            row(name, check, False, "-", str(e).replace("\n", " ")[:800])
    if name.endswith("-damped"):
        bd_generate(a, d, name, row)


# bd_generate's runs: tests/cli/diffusion_block.sh's first two jobs (bd_oracle.py's keys)
BD_JOBS = [("5,17,99", dict(max_new_tokens=12, max_denoising_steps=6, seed=5)),
           ("5,17,99,3", dict(max_new_tokens=18, max_denoising_steps=10, entropy_bound=3.0, seed=1))]


def bd_generate(a, d, name, row):
    """bd_generate: tk generate --device cuda against transformers' DiffusionGemma generate()
    (tests/models/bd_oracle.py, on the CPU) with both sides' randomness read from one draws file: the
    same accepted positions at every denoising step and the same ids. Only on bd_oracle.py's damped
    checkpoint: at make_tiny.py's random scale the loop from one step's logits to the next step's
    self-conditioning input amplifies rounding about tenfold a step, so two correct f32 runs part
    after a few steps (the H200 run of 2026-11-28: tk on cuda equal to tk on this machine's CPU, not
    to tk on the GPU machine's own CPU, whose SIMD rounds differently)."""
    for n, (prompt, kv) in enumerate(BD_JOBS):
        draws = os.path.join(a.work, f"bd-draws-{n}")
        p = subprocess.run([sys.executable, os.path.join(HERE, "models", "bd_oracle.py"), d, draws, prompt] +
                           [f"{k}={v}" for k, v in kv.items()], capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            raise RuntimeError(f"bd_oracle.py exit {p.returncode}: {p.stderr.strip()[-500:]}")
        want = json.loads(p.stdout.strip().splitlines()[-1])
        flags = ["--gen-length", str(kv["max_new_tokens"]), "--steps", str(kv["max_denoising_steps"])]
        for k, v in kv.items():
            if k not in ("max_new_tokens", "max_denoising_steps", "seed"):
                flags += ["--" + k.replace("_", "-"), str(v)]
        t1 = time.time()
        got = tk_json(a.tk, ["generate", d, "--ids", prompt, "--dtype", "f32", "--draws", draws, "--device",
                             a.device] + flags)
        t_dev = time.time() - t1
        ws = [(s["block"], s["accepted"]) for s in want["steps"]]
        gs = [(s["block"], s["accepted"]) for s in got["stats"]["per_step"]]
        step = next((i for i, (x, y) in enumerate(zip(ws, gs)) if x != y), None)
        ok = ws == gs and want["ids"] == got["ids"]
        note = (f"{a.device} {t_dev:.1f} s; {len(gs)} steps as transformers" if ok else
                f"step {step}: transformers accepts {ws[step] if step is not None else '-'}, tk "
                f"{gs[step] if step is not None else '-'}; ids transformers {want['ids']}, tk {got['ids']}; "
                f"steps {len(ws)} vs {len(gs)}")
        row(name, f"bd_generate{n}", ok, f"{len(got['ids'])} tok", note)


# masked_diffusion's runs: some of tests/cli/diffusion_lm.sh's jobs (tk directory, the oracle's reference
# directory, sampler, tk's flags, the oracle's keys)
MD_JOBS = [("llama", "llama", "llada", "--bidirectional --mask-token-id 3", "gen_length=16 block_length=8 steps=8"),
           ("llama", "llama", "llada", "--bidirectional --mask-token-id 3 --remasking random --temperature 0.5",
            "gen_length=12 block_length=12 steps=6 remasking=random temperature=0.5"),
           ("llada", "llama", "llada", "--cfg-scale 2.0", "gen_length=16 block_length=4 steps=8 cfg_scale=2.0"),
           ("dream", "qwen2", "dream", "--alg entropy", "gen_length=16 steps=8 alg=entropy"),
           ("dream", "qwen2", "dream", "--alg maskgit_plus --top-k 5", "gen_length=16 steps=8 alg=maskgit_plus top_k=5")]
MD_PROMPT = "1,40,50,60,70"


def masked_diffusion(a, row):
    """Masked diffusion (LLaDA, Dream) on the device: tests/models/dllm_oracle.py's tiny checkpoints; tk's
    f32 logits of the LLaDA- and Dream-layout checkpoints against transformers' model run bidirectionally
    (1e-4 of the largest), then tk generate --diffusion against the published samplers written in Python
    (the oracle, on the CPU) with the same draws: the same positions unmasked at every step, the same ids."""
    oracle = os.path.join(HERE, "models", "dllm_oracle.py")
    ck = os.path.join(a.work, "dllm")
    if not os.path.isfile(os.path.join(ck, ".done")):
        subprocess.run([sys.executable, oracle, "make", ck], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        open(os.path.join(ck, ".done"), "w").close()
    ids = "1,40,3,3,60,3,70"
    for tkdir, ref in (("llada", "llama"), ("dream", "qwen2")):
        try:
            p = subprocess.run([sys.executable, oracle, "logits", os.path.join(ck, ref), ids], capture_output=True,
                               text=True, timeout=300, check=True)
            want = json.loads(p.stdout.strip().splitlines()[-1])["logits"]
            got = tk_json(a.tk, ["model", "logits", os.path.join(ck, tkdir), "--ids", ids, "--device", a.device,
                                 "--dtype", "f32"])["logits"]
            big = max(abs(y) for r in want for y in r)
            rel = max(abs(x - y) for rg, rw in zip(got, want) for x, y in zip(rg, rw)) / big
            ok = len(got) == len(want) and len(got[0]) == len(want[0]) and rel < 1e-4
            row(tkdir, "md_logits_f32", ok, f"{rel:.2e}", f"max|ref| {big:.3g}, tol 1e-4 (bidirectional)")
        except Exception as e:
            row(tkdir, "md_logits_f32", False, "-", str(e).replace("\n", " ")[:800])
    jobs = "".join(f"{os.path.join(ck, ref)} {smp} {os.path.join(a.work, f'md-draws-{n}')} prompt={MD_PROMPT} "
                   f"mask_token_id=3 {kv}\n" for n, (_, ref, smp, _, kv) in enumerate(MD_JOBS))
    p = subprocess.run([sys.executable, oracle, "run-many"], input=jobs, capture_output=True, text=True, timeout=600)
    refs = [json.loads(x) for x in p.stdout.splitlines() if x.strip()]
    for n, (tkdir, _, _, flags, kv) in enumerate(MD_JOBS):
        name = f"{tkdir}-md{n}"
        if n >= len(refs):
            row(name, "md_generate", False, "-", f"the oracle failed: {p.stderr.strip()[-300:]}")
            continue
        k = dict(x.split("=", 1) for x in kv.split())
        args = ["generate", os.path.join(ck, tkdir), "--diffusion", "--ids", MD_PROMPT, "--gen-length",
                k["gen_length"], "--steps", k["steps"], "--draws", os.path.join(a.work, f"md-draws-{n}"), "--dtype",
                "f32", "--device", a.device] + (["--block-length", k["block_length"]] if "block_length" in k else [])
        try:
            t1 = time.time()
            got = tk_json(a.tk, args + flags.split())
            steps = [sorted(x["unmasked"]) for x in got["stats"]["per_step"]]
            ref = refs[n]
            first = next((i for i, (x, y) in enumerate(zip(steps, ref["steps"])) if x != y), None)
            ok = steps == ref["steps"] and got["ids"] == ref["ids"]
            row(name, "md_generate", ok, f"{len(got['ids'])} tok",
                f"{a.device} {time.time() - t1:.1f} s; {len(steps)} steps as the reference ({flags})" if ok else
                f"{flags}: step {first}: tk {steps[first] if first is not None else '-'}, reference "
                f"{ref['steps'][first] if first is not None else '-'}; ids tk {got['ids']}, reference {ref['ids']}")
        except Exception as e:
            row(name, "md_generate", False, "-", str(e).replace("\n", " ")[:800])


def hf_model(a, d, tdt):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(d, dtype=tdt, attn_implementation="eager").to(a.device).eval()


def logits(a, d, name, check, ref32, row):
    """logits_f32 (checked: 1e-4 of the largest logit) or logits_bf16 (reported, with tk's and
    transformers' bf16 distances from transformers' f32 logits when logits_f32 ran first)."""
    import torch
    dtype = check.split("_")[1]
    m = hf_model(a, d, torch.float32 if dtype == "f32" else torch.bfloat16)
    with torch.no_grad():
        ref = m(torch.tensor([IDS], device=a.device)).logits[0].float().cpu()
    del m
    got = torch.tensor(tk_json(a.tk, ["model", "logits", d, "--ids", ",".join(map(str, IDS)), "--device", a.device,
                                      "--dtype", dtype])["logits"])
    rel = ((got - ref).abs().max() / ref.abs().max()).item()
    if dtype == "f32":
        ref32[name] = ref
        row(name, check, rel < 1e-4, f"{rel:.2e}", f"max|ref| {ref.abs().max().item():.3g}, tol 1e-4")
        return
    # two bf16 computations round differently (and may route MoE tokens differently): reported, with each
    # one's distance from the f32 oracle: tk's bf16 far worse than transformers' is the sign
    note = f"max|ref| {ref.abs().max().item():.3g}"
    if name in ref32:
        r32 = ref32[name]
        scale = r32.abs().max()
        e_tk, e_hf = ((got - r32).abs().max() / scale).item(), ((ref - r32).abs().max() / scale).item()
        note += f"; from f32: tk {e_tk:.2e}, transformers {e_hf:.2e}"
        note += "; tk's bf16 is off: look at it" if e_tk > 2 * e_hf + 1e-2 else ""
    row(name, check, True, f"{rel:.2e}", note, status="info")


def greedy(a, d, name, row):
    """greedy_f32: tk generate on the device against transformers' generate() on the same device, token
    for token."""
    import torch
    cfg = json.load(open(os.path.join(d, "config.json")))
    n = min(a.tokens, cfg.get("max_position_embeddings", cfg.get("n_positions", 1 << 30)) - len(IDS))
    if n <= 0:
        row(name, "greedy_f32", True, "-", "skipped: the context holds no more tokens than the prompt")
        return
    m = hf_model(a, d, torch.float32)
    x = torch.tensor([IDS], device=a.device)
    with torch.no_grad():  # an explicit mask: generate() would mask a prompt id equal to pad_token_id
        out = m.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n)
    del m
    want = out[0, len(IDS):].tolist()
    t1 = time.time()
    have = tk_json(a.tk, ["generate", d, "--ids", ",".join(map(str, IDS)), "--device", a.device, "--dtype", "f32",
                          "--max-new-tokens", str(n)])["ids"]
    first = next((i for i, (x, y) in enumerate(zip(have, want)) if x != y), None)
    same = have == want
    row(name, "greedy_f32", same, f"{len(want)} tok", (f"same tokens ({time.time() - t1:.1f} s)" if same else
                                                       f"first differs at {first}: tk {have} hf {want}"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tk", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--csv")
    ap.add_argument("--json")
    ap.add_argument("--deadline", type=float, default=1e9)
    ap.add_argument("--only", default="")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--device", default="cuda", help="cuda (the check), or cpu to try the script without a GPU")
    ap.add_argument("--checks", default="greedy_f32,logits_f32,logits_bf16",
                    help="the passes over every model, in order (a deadline cuts the last first)")
    a = ap.parse_args()
    t0 = time.time()

    import torch
    torch.backends.cuda.matmul.allow_tf32 = False  # tk's f32 kernels do f32 arithmetic
    torch.backends.cudnn.allow_tf32 = False

    tiny = os.path.join(a.work, "tiny")
    if not os.path.isdir(os.path.join(tiny, "llama")):
        subprocess.run([sys.executable, os.path.join(HERE, "models", "make_tiny.py"), tiny], check=True,
                       stdout=subprocess.DEVNULL)
    damped = os.path.join(tiny, "diffusion_gemma-damped")
    if not os.path.isfile(os.path.join(damped, "config.json")):  # bd_generate's checkpoint
        subprocess.run([sys.executable, os.path.join(HERE, "models", "bd_oracle.py"), "make", damped], check=True,
                       stdout=subprocess.DEVNULL)
    print(f"checkpoints written in {time.time() - t0:.1f} s", flush=True)
    if a.device != "cpu":  # the kernels the families use, installed (and compiled) before the first model
        pk = ["kernels-community/" + n for n in ("activation", "rmsnorm", "rotary", "softmax", "sampling",
                                                 "flash-attn", "casted", "layers", "moe")]
        p = subprocess.run([a.tk, "--quiet", "get"] + pk, capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            print(f"tk get failed (exit {p.returncode}): {p.stderr.strip()[-500:]}", flush=True)

    rows = []

    def row(model, check, ok, value, note="", status=None):
        r = {"model": model, "check": check, "status": status or ("ok" if ok else "FAIL"), "value": value, "note": note}
        rows.append(r)
        print(f"{model:18} {check:14} {r['status']:5} {value:>12}  {note}", flush=True)

    names = []
    for name in sorted(n for n in os.listdir(tiny) if os.path.isfile(os.path.join(tiny, n, "config.json"))):
        arch = json.load(open(os.path.join(tiny, name, "config.json"))).get("architectures", ["?"])[0]
        if a.only and not re.search(a.only, name):
            continue
        if arch in ("DiffusionGemmaForBlockDiffusion", "GPT2LMHeadModel") or arch.endswith("ForCausalLM"):
            names.append((name, arch))
    ref32 = {}  # model -> its f32 logits from transformers (logits_bf16 measures both sides from them)
    # Pass by pass, every model: the checks in --checks order, so a deadline cuts the last pass first
    for check in a.checks.split(","):
        for name, arch in names:
            d = os.path.join(tiny, name)
            if time.time() - t0 > a.deadline:
                row(name, check, False, "-", "not started: the phase's deadline passed")
                continue
            try:
                if arch == "DiffusionGemmaForBlockDiffusion":
                    if check == "greedy_f32":  # its own checks (logits and generation), once
                        block_diffusion(a, d, name, row)
                elif check == "greedy_f32":
                    greedy(a, d, name, row)
                else:
                    logits(a, d, name, check, ref32, row)
            except Exception as e:  # one model's failure is a row, not the end of the phase
                row(name, check, False, "-", str(e).replace("\n", " ")[:800])
            torch.cuda.empty_cache()
        if check == "greedy_f32" and (not a.only or re.search(a.only, "masked_diffusion")):
            if time.time() - t0 > a.deadline:
                row("masked_diffusion", check, False, "-", "not started: the phase's deadline passed")
            else:
                masked_diffusion(a, row)

    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["model", "check", "status", "value", "note"])
            w.writeheader()
            w.writerows(rows)
    if a.json:
        json.dump(rows, open(a.json, "w"), indent=1)
    bad = [r for r in rows if r["status"] == "FAIL"]
    print(f"{len(rows) - len(bad)} passed, {len(bad)} failed ({time.time() - t0:.0f} s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
