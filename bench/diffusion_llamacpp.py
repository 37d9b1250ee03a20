#!/usr/bin/env python3
"""The measurement of bench/diffusion_llamacpp.sh: tk generate --diffusion against llama.cpp's
llama-diffusion-cli on one LLaDA checkpoint (DIR for tk, GGUF for llama.cpp: the same f32 values),
the same prompt ids, gen_length, steps, temperature 0 and thread counts, several alternations.

    diffusion_llamacpp.py DIR GGUF TK CLI [--gen-length 32] [--steps 32] [--threads 1,2]
                          [--alternations 5] [--engines tk,tkorder,llama,llamapassive] [--tk-args '--dtype bf16']

Engines (every one runs one block over the whole generation, `steps` forwards of the full canvas):
  tk       tk generate --diffusion: LLaDA's sampler, low_confidence remasking (each step reveals the
           masked positions whose argmax has the highest softmax probability)
  tkorder  tk with llama.cpp's order: --remasking random fed a draws file that falls along the canvas
           in every step, so each step reveals the leftmost masked positions (what llama.cpp does
           with --top-k 1, below); its ids must equal llama.cpp's
  llama    llama-diffusion-cli --temp 0 --top-k 1 --diffusion-algorithm 4 (confidence) with the block
           schedule over one block (--diffusion-block-length = prompt + gen_length, since its blocks
           cut the whole canvas, prompt included, into max_length / block_length pieces starting at the
           prompt's end). At temperature 0 its sampler chain still ends in a random draw from the
           top-k/top-p softmax; --top-k 1 makes that the argmax, with probability 1 at every position,
           so all confidences tie and its tie-break (lower index first) reveals the leftmost masked
           positions: argmax tokens, LLaDA's transfer counts, a left-to-right order
  llamapassive  the same with OMP_WAIT_POLICY=passive (2 threads and more): ggml's CPU backend is
           built with OpenMP and waits at every op's barrier in libgomp, which spins first; on a
           machine whose cores other work also wants, the spinning thread takes the time its partner
           needs (perf: two thirds of a loaded 2-thread run in libgomp). Passive waiting sleeps at once

tokens/s = gen_length over the sampling loop's time, the model load excluded on both sides: tk's
"ms" (models/diffusion_lm.c: the sampler loop), llama.cpp's "total time" (diffusion.cpp: from before
the first block to after the last step, every decode and sampling step inside). The prompt is a fixed
English text, formatted by llama-diffusion-cli through the GGUF's chat template (make_bench_llada.py
writes one that passes the text through) and tokenized with BOS; tk gets the same ids, [BOS] + the
HF tokenizer's ids of the text (llama-tokenize gives the same ids). llama-diffusion-cli prints text,
not ids: the check turns tk's ids into bytes as llama.cpp's detokenize does (each byte-level BPE
token's bytes, special tokens as nothing) and compares the bytes.
Prints a table of medians and one JSON line per run.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

TEXT = "The history of the city begins with a small settlement on the bank of the river"


def run_tk(tk, d, ids, G, S, T, extra):
    cmd = [tk, "--json", "generate", d, "--diffusion", "--ids", ",".join(map(str, ids)), "--gen-length", str(G),
           "--block-length", str(G), "--steps", str(S), "--threads", str(T)] + extra
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if out.returncode:
        sys.exit(f"tk failed ({out.returncode}): {' '.join(cmd)}\n{out.stderr[-2000:]}")
    j = json.loads(out.stdout)
    return {"ms": j["stats"]["ms"], "ids": j["ids"], "forwards": j["stats"]["forward_passes"]}


def run_llama(cli, gguf, P, G, S, T, env=None):
    L = P + G
    cmd = [cli, "-m", gguf, "-p", TEXT, "-t", str(T), "-tb", str(T), "-c", str(L), "-b", str(L), "-ub", str(L),
           "--diffusion-steps", str(S), "--diffusion-block-length", str(L), "--diffusion-algorithm", "4",
           "--temp", "0", "--top-k", "1", "--seed", "0"]
    e = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}  # libgomp's default unless asked
    out = subprocess.run(cmd, capture_output=True, timeout=3600, env=dict(e, **(env or {})))
    log = out.stdout + out.stderr
    # "\ntotal time: ...ms, ...\n", then the text as "\n%s\n" (each log call may open with a
    # "<time> I " prefix); the text is bytes: a random model's tokens need not end on a UTF-8 boundary
    m = re.search(rb"total time: ([0-9.]+)ms[^\n]*\n(?:[0-9.]+ I )?\n(.*)\n\Z", log, re.S)
    if out.returncode or not m:
        sys.exit(f"llama-diffusion-cli failed ({out.returncode}): {' '.join(cmd)}\n"
                 + log[-3000:].decode("utf-8", "replace"))
    return {"ms": float(m.group(1)), "text": m.group(2)}


def detokenize(tok, ids):
    """the bytes llama.cpp's common_detokenize(special = false) gives for a byte-level BPE: each
    token's bytes, control tokens (the special ones) as nothing"""
    # GPT-2's byte <-> printable character table (bytes_to_unicode)
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs + [256 + n for n in range(256) if n not in bs]
    bs = bs + [b for b in range(256) if b not in bs]
    dec = {chr(c): b for b, c in zip(bs, cs)}
    special = set(tok.all_special_ids) | {i for i, t in tok.added_tokens_decoder.items() if t.special}
    out = b""
    for i in ids:
        if i in special:
            continue
        t = tok.convert_ids_to_tokens(i)
        out += bytes(dec[c] for c in t) if t is not None else f"[PAD{i}]".encode()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("gguf")
    ap.add_argument("tk")
    ap.add_argument("cli")
    ap.add_argument("--gen-length", type=int, default=32)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--alternations", type=int, default=5)
    ap.add_argument("--engines", default="tk,tkorder,llama,llamapassive")
    ap.add_argument("--tk-args", default="", help="more tk generate flags (e.g. '--dtype bf16')")
    a = ap.parse_args()
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(a.dir)
    ids = [tok.bos_token_id] + tok(TEXT, add_special_tokens=False)["input_ids"]
    P, G, S = len(ids), a.gen_length, a.steps
    L = P + G
    engines = a.engines.split(",")
    # tkorder's draws: for each step, one per canvas position, falling left to right
    draws = tempfile.NamedTemporaryFile(suffix=".f64", delete=False)
    import numpy as np
    np.tile(1.0 - (np.arange(L) + 1.0) / (L + 1.0), S).astype("<f8").tofile(draws.name)
    draws.close()
    print(f"prompt {P} ids (BOS + '{TEXT}'), gen_length {G}, steps {S}, one block: {S} forwards of {L} positions")
    runs = {}
    texts = {}
    for alt in range(a.alternations):
        for T in map(int, a.threads.split(",")):
            for e in engines:
                if e == "llamapassive" and T == 1:
                    continue  # one thread meets no barrier
                if e == "tk":
                    r = run_tk(a.tk, a.dir, ids, G, S, T, a.tk_args.split())
                elif e == "tkorder":
                    r = run_tk(a.tk, a.dir, ids, G, S, T,
                               a.tk_args.split() + ["--remasking", "random", "--draws", draws.name])
                elif e == "llama":
                    r = run_llama(a.cli, a.gguf, P, G, S, T)
                else:
                    r = run_llama(a.cli, a.gguf, P, G, S, T, {"OMP_WAIT_POLICY": "passive"})
                if "ids" in r:
                    r["text"] = detokenize(tok, r["ids"])
                r["tokens_per_s"] = G / (r["ms"] / 1000.0)
                runs.setdefault((e, T), []).append(r["tokens_per_s"])
                texts.setdefault(e, set()).add(r["text"])
                if "ids" in r:
                    texts.setdefault(e + "_ids", set()).add(tuple(r["ids"]))
                print(json.dumps({"alt": alt, "engine": e, "threads": T, "ms": round(r["ms"], 1),
                                  "tokens_per_s": round(r["tokens_per_s"], 2), "loadavg": os.getloadavg()[0]}),
                      flush=True)
    os.unlink(draws.name)
    print()
    print("| threads | " + " | ".join(f"{e} tokens/s (median, min-max)" for e in engines) + " |")
    print("|---|" + "---|" * len(engines))
    for T in map(int, a.threads.split(",")):
        cells = []
        for e in engines:
            v = runs.get((e, T))
            if not v:
                cells.append("-")
                continue
            cells.append(f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})")
        print(f"| {T} | " + " | ".join(cells) + " |")
    for e in engines:
        if e in texts:
            print(f"{e}: {len(texts[e])} distinct output text(s) over all runs")
    for e in ("tk", "tkorder"):
        if e + "_ids" in texts:
            print(f"{e} ids: {[list(x) for x in texts[e + '_ids']][0]}")
    if "llama" in texts:
        print("llama.cpp text: " + json.dumps(sorted(texts["llama"])[0].decode("utf-8", "replace")))
        for e in ("tkorder", "tk"):
            if e in texts:
                same = texts[e] == texts["llama"]
                print(f"{e} text {'==' if same else '!='} llama.cpp text" +
                      ("" if same else ": " + json.dumps(sorted(texts[e])[0].decode("utf-8", "replace"))))


if __name__ == "__main__":
    main()
