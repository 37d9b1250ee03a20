#!/usr/bin/env python3
"""tk, transformers and llama.cpp (llama-cpp-python, else llama-cpp-cffi's prebuilt CPU module through
llama.cpp's C API) on the same weights, prompt and thread count: prefill and decode tokens/s at f32,
16-bit and int8, several alternations, against the memory-bandwidth bound of decode. bench/cpu_vs_llamacpp.sh prepares the checkpoint and runs this.

    cpu_vs_llamacpp.py DIR TK MEMBW_JSON [--threads T] [--prompt-tokens P] [--new-tokens N]
                       [--alternations A] [--precisions f32,16,int8] [--engines tk,hf,llama]
                       [--tk-base TK_BEFORE]

Engines: tk, hf (transformers), llama (llama.cpp); tkkv16 is tk with --kv-dtype f16 (f32 and int8:
llama.cpp's default KV cache is F16; a 16-bit model's cache is 16-bit already); tkbase is another tk
binary (--tk-base: the build before a change), run in the same alternations so the two compare under
the same load.

DIR holds hf-f32/, hf-bf16/ and smol-F32/F16/Q8_0.gguf (bench/make_smol.py). Greedy decoding; every
engine gets the same P prompt ids (the tokenizer's ids of a fixed English text) and runs N new tokens
(the end-of-sequence id is set to one the model never picks here, so each runs all N; the ids are
compared). Prefill tokens/s: P over the time to the first new token. Decode tokens/s: the N - 1 tokens
after the first over the time from the first to the last (tk generate's own definition).
Pairs: f32 is tk f32 / transformers f32 / llama.cpp F32; 16-bit is tk bf16 (bf16 weights and
activations) / transformers bf16 / llama.cpp F16; int8 is tk --quant int8 (i8 weights, f32
activations) / llama.cpp Q8_0. Prints a table and one JSON line per run.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

TEXT = ("The history of the city begins with a small settlement on the bank of the river, where traders "
        "stopped to rest and exchange goods. Over the centuries it grew into a market town, then into a "
        "centre of learning with a university, a cathedral and a busy harbour. Its streets still follow "
        "the old paths between the fields, and many of its houses are built of the same grey stone. ")


def prompt_ids(d, P):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(d)
    ids = []
    while len(ids) < P:
        ids += tok(TEXT, add_special_tokens=False)["input_ids"]
    return ids[:P]


def run_tk(tk, d, ids, N, T, eos, extra):
    cmd = [tk, "--json", "generate", d, "--ids", ",".join(map(str, ids)), "--max-new-tokens", str(N), "--threads",
           str(T), "--eos-token-id", str(eos)] + extra
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if out.returncode:
        raise RuntimeError("tk failed: " + out.stdout[-500:] + out.stderr[-500:])
    r = json.loads(out.stdout)
    s = r["stats"]
    return {"prefill_tok_s": len(ids) / (s["prefill_ms"] / 1e3), "decode_tok_s": s["decode_tokens_per_s"], "ids": r["ids"]}


class HF:
    def __init__(self, d, dtype, T):
        import torch
        from transformers import LlamaForCausalLM
        torch.set_num_threads(T)
        self.torch = torch
        self.m = LlamaForCausalLM.from_pretrained(d, dtype=getattr(torch, dtype)).eval()

    def run(self, ids, N, eos):
        torch = self.torch
        x = torch.tensor([ids])

        class Times:
            def __init__(self):
                self.t = []

            def put(self, v):
                self.t.append(time.perf_counter())

            def end(self):
                pass

        with torch.no_grad():
            s = Times()
            t0 = time.perf_counter()
            out = self.m.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=N, do_sample=False,
                                  eos_token_id=eos, pad_token_id=eos, streamer=s)
        new = out[0, len(ids):].tolist()
        first, last = s.t[1], s.t[-1]
        return {"prefill_tok_s": len(ids) / (first - t0), "decode_tok_s": (len(new) - 1) / (last - first), "ids": new}


class LlamaCpp:
    def __init__(self, path, T, P, N):
        from llama_cpp import Llama
        import numpy as np
        self.np = np
        self.llm = Llama(model_path=path, n_ctx=P + N + 16, n_batch=max(P, 32), n_ubatch=max(P, 32), n_threads=T,
                         n_threads_batch=T, logits_all=False, verbose=False)

    def run(self, ids, N, eos):
        np, llm = self.np, self.llm
        llm.reset()
        llm.eval(ids[:4])  # warm the context's buffers
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        t1 = time.perf_counter()
        new = [tok]
        for _ in range(N - 1):
            if tok == eos:
                break
            llm.eval([tok])
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            new.append(tok)
        t2 = time.perf_counter()
        return {"prefill_tok_s": len(ids) / (t1 - t0), "decode_tok_s": (len(new) - 1) / (t2 - t1), "ids": new}


def load_llama_cffi(cache):
    """llama.cpp's C API (lib, ffi, a description) from llama-cpp-cffi's prebuilt CPU module, loaded by
    path: the package's __init__ is not run (it imports code written for transformers 4 and picks a
    CUDA or Vulkan module when it finds a GPU). The module was built with GCC 14; on a libstdc++ without
    __cxa_call_terminate (GCC 12: Debian 12) bench/shim/cxa_call_terminate.c is compiled into CACHE and
    preloaded first (bench/shim/: not one of the bench programs the Makefile builds from bench/*.c)."""
    import ctypes
    import glob
    import importlib.util
    spec = importlib.util.find_spec("llama")
    so = []
    if spec and spec.submodule_search_locations:
        so = sorted(glob.glob(os.path.join(spec.submodule_search_locations[0], "_llama_cpp_cpu*.so")))
    if not so:
        raise RuntimeError("neither llama_cpp (llama-cpp-python) nor llama-cpp-cffi's CPU module is installed: "
                           "run scripts/setup.sh --bench")

    def load():
        s = importlib.util.spec_from_file_location("llama._llama_cpp_cpu", so[0])
        m = importlib.util.module_from_spec(s)
        s.loader.exec_module(m)
        return m

    try:
        m = load()
    except ImportError as e:
        if "__cxa_call_terminate" not in str(e):
            raise
        src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shim", "cxa_call_terminate.c")
        shim = os.path.join(cache, "cxa_call_terminate.so")
        if not os.path.exists(shim) or os.path.getmtime(shim) < os.path.getmtime(src):
            subprocess.run([os.environ.get("CC", "cc"), "-shared", "-fPIC", "-O2", "-o", shim, src, "-lstdc++"], check=True)
        ctypes.CDLL(shim, mode=ctypes.RTLD_GLOBAL)
        m = load()
    lib, ffi = m.lib, m.ffi

    @ffi.def_extern()
    def llama_cpp_cffi_ggml_log_callback(level, text, user_data):  # llama.cpp's log: quiet, as verbose=False
        pass

    lib.llama_log_set(lib.llama_cpp_cffi_ggml_log_callback, ffi.NULL)
    lib.llama_backend_init()
    d = ctypes.CDLL(so[0])
    try:
        from importlib.metadata import version
        pkg = "llama-cpp-cffi " + version("llama-cpp-cffi")
    except Exception:
        pkg = "llama-cpp-cffi"
    about = (f"llama.cpp b{ctypes.c_int.in_dll(d, 'LLAMA_BUILD_NUMBER').value} "
             f"({ctypes.c_char_p.in_dll(d, 'LLAMA_COMMIT').value.decode()}) through {pkg}'s CPU module; "
             + ffi.string(lib.llama_print_system_info()).decode().strip())
    return lib, ffi, about


class LlamaCffi:
    """llama.cpp through its C API (llama-cpp-cffi): one llama_decode of the whole prompt, then one per
    token; greedy by argmax over the last logits, as tk's."""
    api = None

    def __init__(self, path, T, P, N, cache):
        import numpy as np
        if LlamaCffi.api is None:
            LlamaCffi.api = load_llama_cffi(cache)
        self.np = np
        self.lib, self.ffi, _ = LlamaCffi.api
        lib, ffi = self.lib, self.ffi
        mp = lib.llama_model_default_params()
        mp.n_gpu_layers = 0
        self.model = lib.llama_model_load_from_file(path.encode(), mp)
        if self.model == ffi.NULL:
            raise RuntimeError(f"llama.cpp cannot load {path}")
        cp = lib.llama_context_default_params()
        cp.n_ctx = P + N + 16
        cp.n_batch = cp.n_ubatch = max(P, 32)
        cp.n_threads = cp.n_threads_batch = T
        cp.no_perf = True
        self.ctx = lib.llama_init_from_model(self.model, cp)
        if self.ctx == ffi.NULL:
            raise RuntimeError(f"llama.cpp cannot make a context for {path}")
        self.n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self.model))

    def decode(self, buf, n):
        if self.lib.llama_decode(self.ctx, self.lib.llama_batch_get_one(buf, n)):
            raise RuntimeError("llama_decode failed")
        logits = self.lib.llama_get_logits_ith(self.ctx, -1)
        return int(self.np.frombuffer(self.ffi.buffer(logits, 4 * self.n_vocab), dtype=self.np.float32).argmax())

    def run(self, ids, N, eos):
        lib, ffi = self.lib, self.ffi
        clear = getattr(lib, "llama_kv_self_clear", None) or lib.llama_kv_cache_clear  # the name before b4800
        prompt = ffi.new("int32_t[]", ids)
        one = ffi.new("int32_t[1]")
        clear(self.ctx)
        self.decode(prompt, 4)  # warm the context's buffers
        clear(self.ctx)
        t0 = time.perf_counter()
        tok = self.decode(prompt, len(ids))
        t1 = time.perf_counter()
        new = [tok]
        for _ in range(N - 1):
            if tok == eos:
                break
            one[0] = tok
            tok = self.decode(one, 1)
            new.append(tok)
        t2 = time.perf_counter()
        return {"prefill_tok_s": len(ids) / (t1 - t0), "decode_tok_s": (len(new) - 1) / (t2 - t1), "ids": new}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("tk")
    ap.add_argument("membw")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--alternations", type=int, default=3)
    ap.add_argument("--precisions", default="f32,16,int8")
    ap.add_argument("--engines", default="tk,hf,llama")
    ap.add_argument("--tk-base", default=None)
    a = ap.parse_args()
    D, T, P, N = a.dir, a.threads, a.prompt_tokens, a.new_tokens
    engines = a.engines.split(",")
    precs = a.precisions.split(",")
    f32dir, b16dir = os.path.join(D, "hf-f32"), os.path.join(D, "hf-bf16")
    cfg = json.load(open(os.path.join(f32dir, "config.json")))
    ids = prompt_ids(f32dir, P)
    # an end-of-sequence id the model does not pick on this prompt: every engine runs all N tokens
    eos = cfg["vocab_size"] - 1
    mem = json.load(open(a.membw))
    from safetensors import safe_open
    with safe_open(os.path.join(f32dir, "model.safetensors"), "np") as f:
        params = sum(f.get_slice(k).get_shape()[0] * (f.get_slice(k).get_shape()[1] if len(f.get_slice(k).get_shape()) > 1 else 1)
                     for k in f.keys())
    bytes_per_tok = {"f32": 4 * params, "16": 2 * params, "int8": params}
    plan = []  # (precision, engine, label, runner)
    for p in precs:
        for e in engines:
            if e in ("tk", "tkbase", "tkkv16"):
                if (e == "tkkv16" and p == "16") or (e == "tkbase" and not a.tk_base):
                    continue
                extra = {"f32": ["--dtype", "f32"], "16": ["--dtype", "bf16"], "int8": ["--quant", "int8"]}[p]
                dd = b16dir if p == "16" else f32dir
                label = {"f32": "tk f32", "16": "tk bf16", "int8": "tk int8 (--quant)"}[p]
                binary = a.tk
                if e == "tkkv16":
                    extra = extra + ["--kv-dtype", "f16"]
                    label += " kv f16"
                elif e == "tkbase":
                    binary = a.tk_base
                    label = "before: " + label
                plan.append((p, e, label, lambda dd=dd, extra=extra, b=binary: run_tk(b, dd, ids, N, T, eos, extra)))
            elif e == "hf" and p != "int8":
                h = HF(f32dir if p == "f32" else b16dir, "float32" if p == "f32" else "bfloat16", T)
                h.run(ids, 4, eos)
                plan.append((p, e, "transformers " + ("f32" if p == "f32" else "bf16"), lambda h=h: h.run(ids, N, eos)))
            elif e == "llama":
                kind = {"f32": "F32", "16": "F16", "int8": "Q8_0"}[p]
                path = os.path.join(D, f"smol-{kind}.gguf")
                if not os.path.exists(path):
                    continue
                try:
                    import llama_cpp  # noqa: F401  llama-cpp-python when it is installed, else llama-cpp-cffi
                    lc = LlamaCpp(path, T, P, N)
                except ImportError:
                    lc = LlamaCffi(path, T, P, N, D)
                plan.append((p, e, "llama.cpp " + kind, lambda lc=lc: lc.run(ids, N, eos)))
    res = {lab: [] for _, _, lab, _ in plan}
    ids_of = {}
    for alt in range(a.alternations):
        for p, e, lab, fn in plan:
            r = fn()
            res[lab].append(r)
            ids_of.setdefault(lab, r["ids"])
            print(json.dumps({"alternation": alt, "run": lab, "prefill_tok_s": round(r["prefill_tok_s"], 2),
                              "decode_tok_s": round(r["decode_tok_s"], 2), "new_tokens": len(r["ids"])}), flush=True)
    print()
    if LlamaCffi.api:
        print(LlamaCffi.api[2])
    print(f"threads {T}, prompt {P} tokens, {N} new tokens, greedy, {a.alternations} alternations (median); "
          f"{params / 1e6:.1f}M parameters; copy bandwidth {mem['copy_gb_s']} GB/s, read {mem['read_gb_s']} GB/s")
    print(f"| engine | prefill tok/s | decode tok/s | decode bound (copy bw) | of the bound | same ids as |")
    print(f"|---|---|---|---|---|---|")
    for p, e, lab, _ in plan:
        pre = statistics.median(r["prefill_tok_s"] for r in res[lab])
        dec = statistics.median(r["decode_tok_s"] for r in res[lab])
        bound = mem["copy_gb_s"] * 1e9 / bytes_per_tok[p]
        ref = [l for pp, ee, l, _ in plan if pp == p and l != lab]
        same = ", ".join(f"{l}: {'yes' if ids_of[l] == ids_of[lab] else 'no'}" for l in ref)
        print(f"| {lab} | {pre:.1f} | {dec:.2f} | {bound:.1f} | {dec / bound * 100:.0f}% | {same} |")


if __name__ == "__main__":
    main()
