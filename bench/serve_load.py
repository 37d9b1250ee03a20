#!/usr/bin/env python3
"""serve_load.py URL MODEL CLIENTS REQUESTS MAX_TOKENS — a load generator for OpenAI-compatible
servers (bench/serve_model.sh): CLIENTS threads each send REQUESTS streamed /v1/completions with a
prompt of their own, max_tokens MAX_TOKENS and ignore_eos (so every request generates the same number
of tokens; llama-server takes the field too). Prints one JSON line: aggregate generated tokens/s over
the wall time, and p50/p99 time to first token (ms)."""
import json
import sys
import threading
import time
import urllib.request

url, model, clients, reqs, max_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
words = "the quick brown fox jumps over a lazy dog once upon a time there was a little model".split()
ttft, toks, errors = [], [0], [0]
lock = threading.Lock()


def one(i, k):
    prompt = " ".join(words[(i + k) % len(words):] + words[: (i * 7 + k) % len(words)])
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "ignore_eos": True, "stream_options": {"include_usage": True}}).encode()
    t0 = time.time()
    first = None
    n = 0
    try:
        r = urllib.request.urlopen(urllib.request.Request(url + "/v1/completions", body,
                                                          {"Content-Type": "application/json"}), timeout=600)
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            d = json.loads(line[6:])
            if d.get("choices") and first is None:
                first = time.time() - t0
            if d.get("usage"):
                n = d["usage"]["completion_tokens"]
    except Exception:
        with lock:
            errors[0] += 1
        return
    with lock:
        if first is not None:
            ttft.append(first * 1000)
        toks[0] += n


def client(i):
    for k in range(reqs):
        one(i, k)


t = time.time()
th = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
for x in th:
    x.start()
for x in th:
    x.join()
wall = time.time() - t
ttft.sort()
pct = lambda p: ttft[min(len(ttft) - 1, int(p * len(ttft)))] if ttft else 0
print(json.dumps({"clients": clients, "requests": clients * reqs, "errors": errors[0], "tokens": toks[0],
                  "wall_s": round(wall, 2), "tokens_per_s": round(toks[0] / wall, 1),
                  "ttft_p50_ms": round(pct(0.5), 1), "ttft_p99_ms": round(pct(0.99), 1)}))
