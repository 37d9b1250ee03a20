#!/usr/bin/env python3
"""serve_model_client.py — drives a running `tk serve-model` for tests/cli/serve_model.sh: the official
`openai` client as the outside oracle for the API's shapes and errors, raw sockets for the faults, and
`tk generate --json` as the reference for the tokens.

    serve_model_client.py CHECK URL TK CKPT [ARGS...]

Each CHECK prints what it compared and exits 1 on the first mismatch (a line starting with FAIL).
"""
import concurrent.futures as cf
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

CHECK, URL, TK, CK = sys.argv[1:5]
ARGS = sys.argv[5:]
HOST, PORT = re.match(r"http://([^:]+):(\d+)", URL).groups()
PORT = int(PORT)
MODEL = os.path.basename(CK.rstrip("/"))


def fail(msg):
    print("FAIL " + msg)
    sys.exit(1)


def client(key="none", retries=0, timeout=60):
    import openai
    return openai.OpenAI(base_url=URL + "/v1", api_key=key, max_retries=retries, timeout=timeout)


def tk_generate(*args):
    out = subprocess.run([TK, "--json", "generate", CK, *args], capture_output=True, text=True)
    if out.returncode != 0:
        fail("tk generate %s: %s" % (" ".join(args), out.stdout + out.stderr))
    return json.loads(out.stdout)


def raw(method, path, body=None, headers=None, timeout=30):
    """(status, parsed JSON or text) of one request."""
    req = urllib.request.Request(URL + path, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            data, status = r.read(), r.status
    except urllib.error.HTTPError as e:
        data, status = e.read(), e.code
    try:
        return status, json.loads(data)
    except ValueError:
        return status, data.decode("utf-8", "replace")


def metrics():
    st, text = raw("GET", "/metrics")
    if st != 200:
        fail("/metrics answered %d" % st)
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(tk_[a-z_]+(?:\{[^}]*\})?) (\S+)$", text, re.M)}


def settle(want_used=0, secs=10):
    """Waits until no sequence holds KV blocks and no request runs or waits; checks free == total."""
    t = time.time()
    while time.time() - t < secs:
        m = metrics()
        if (m["tk_kv_blocks_used"] == want_used and m["tk_requests_running"] == 0 and m["tk_slots_busy"] == 0 and
                m["tk_requests_queued"] == 0):
            if m["tk_kv_blocks_free"] != m["tk_kv_blocks_total"]:
                fail("KV blocks: free %d of %d with none used" % (m["tk_kv_blocks_free"], m["tk_kv_blocks_total"]))
            return m
        time.sleep(0.1)
    fail("KV blocks or slots never returned: %s" % {k: v for k, v in metrics().items() if "kv" in k or "slot" in k})


def expect_error(exc_type, status, fn, contains=None):
    import openai
    try:
        fn()
    except exc_type as e:
        if e.status_code != status:
            fail("%s: status %d, want %d" % (exc_type.__name__, e.status_code, status))
        body = e.body if isinstance(e.body, dict) else {}
        msg = body.get("message", "") if "message" in body else json.dumps(body)
        if contains and contains not in str(e):
            fail("%s %d: '%s' lacks '%s'" % (exc_type.__name__, status, e, contains))
        return msg
    except openai.APIError as e:
        fail("raised %s (%s), want %s" % (type(e).__name__, e, exc_type.__name__))
    fail("no error, want %s %d" % (exc_type.__name__, status))


# ---- checks ------------------------------------------------------------------------------------

def check_openai():
    import openai
    c = client()
    # models
    ms = c.models.list()
    if [m.id for m in ms.data] != [MODEL]:
        fail("models: %s" % ms)
    # completions, greedy, against tk generate --prompt
    prompts = ["Once upon a time", "The quick brown fox", "To be, or not"]
    for p in prompts:
        want = tk_generate("--prompt", p, "--max-new-tokens", "12")
        r = c.completions.create(model=MODEL, prompt=p, max_tokens=12, temperature=0)
        if r.choices[0].text != want["text"] or r.usage.completion_tokens != len(want["ids"]):
            fail("completion of %r: server %r (%d tokens), tk generate %r (%d)" % (
                p, r.choices[0].text, r.usage.completion_tokens, want["text"], len(want["ids"])))
        if r.object != "text_completion" or not r.id.startswith("cmpl-") or r.usage.total_tokens != \
                r.usage.prompt_tokens + r.usage.completion_tokens:
            fail("completion shape: %s" % r)
    # token ids as the prompt, against tk generate --ids
    want = tk_generate("--ids", "1,50,60,70", "--max-new-tokens", "10")
    r = c.completions.create(model=MODEL, prompt=[1, 50, 60, 70], max_tokens=10, temperature=0)
    if r.choices[0].text != want["text"]:
        fail("ids prompt: %r vs tk generate %r" % (r.choices[0].text, want["text"]))
    # streaming gives the same text in pieces, then a usage chunk
    s = c.completions.create(model=MODEL, prompt=prompts[0], max_tokens=12, temperature=0, stream=True,
                             stream_options={"include_usage": True})
    pieces, usage, fin = [], None, None
    for ch in s:
        if ch.usage:
            usage = ch.usage
        for x in ch.choices:
            pieces.append(x.text)
            fin = x.finish_reason or fin
    want = tk_generate("--prompt", prompts[0], "--max-new-tokens", "12")
    if "".join(pieces) != want["text"] or fin != "length" or not usage or usage.completion_tokens != 12:
        fail("stream: %r %s %s vs %r" % ("".join(pieces), fin, usage, want["text"]))
    # chat: the rendered template's tokens through tk generate --ids
    msgs = [{"role": "system", "content": "You are a tiny model."}, {"role": "user", "content": "Tell me a story."}]
    rendered = subprocess.run([TK, "chat", CK, "--render", "--system", msgs[0]["content"], "--message",
                               "user=" + msgs[1]["content"]], capture_output=True, text=True).stdout
    st, tok = raw("POST", "/tokenize", json.dumps({"content": rendered, "add_special": False}).encode())
    if st != 200:
        fail("/tokenize: %d %s" % (st, tok))
    ids = ",".join(str(i) for i in tok["tokens"])
    want = tk_generate("--ids", ids, "--max-new-tokens", "16")
    r = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=16, temperature=0)
    if r.choices[0].message.content != want["text"] or r.choices[0].message.role != "assistant" or \
            r.usage.prompt_tokens != len(tok["tokens"]):
        fail("chat: %r (prompt %d) vs tk generate %r (prompt %d)" % (
            r.choices[0].message.content, r.usage.prompt_tokens, want["text"], len(tok["tokens"])))
    if r.object != "chat.completion" or not r.id.startswith("chatcmpl-"):
        fail("chat shape: %s" % r)
    # the same system prompt again: its full blocks come from the prefix cache
    r2 = c.chat.completions.create(model=MODEL, messages=msgs[:1] + [{"role": "user", "content": "Another one."}],
                                   max_tokens=4, temperature=0)
    cached = r2.usage.prompt_tokens_details.cached_tokens
    if not cached or cached <= 0:
        fail("no cached tokens for a repeated system prompt: %s" % r2.usage)
    # chat streaming: role first, content deltas, finish_reason
    s = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=16, temperature=0, stream=True)
    text, roles, fin = "", [], None
    for ch in s:
        for x in ch.choices:
            if x.delta.role:
                roles.append(x.delta.role)
            text += x.delta.content or ""
            fin = x.finish_reason or fin
    if text != want["text"] or roles != ["assistant"] or fin not in ("length", "stop"):
        fail("chat stream: %r roles %s fin %s, want %r" % (text, roles, fin, want["text"]))
    # n > 1 with a seed: n different samples, each reproducible, choice 0 = tk generate at the seed
    r = c.completions.create(model=MODEL, prompt=prompts[1], max_tokens=10, temperature=1.0, seed=7, n=3)
    texts = [x.text for x in sorted(r.choices, key=lambda x: x.index)]
    r2 = c.completions.create(model=MODEL, prompt=prompts[1], max_tokens=10, temperature=1.0, seed=7, n=3)
    if [x.text for x in sorted(r2.choices, key=lambda x: x.index)] != texts or len(set(texts)) < 2:
        fail("n=3 seeded: %s then %s" % (texts, [x.text for x in r2.choices]))
    for i in range(3):
        want = tk_generate("--prompt", prompts[1], "--max-new-tokens", "10", "--do-sample", "--temperature", "1",
                           "--seed", str(7 + i))
        if texts[i] != want["text"]:
            fail("n=3 choice %d: %r, tk generate --seed %d: %r" % (i, texts[i], 7 + i, want["text"]))
    if r.usage.completion_tokens != sum(1 for _ in range(3)) * 10 and r.usage.completion_tokens > 30:
        fail("n=3 usage: %s" % r.usage)
    # stop strings: the text ends before the first stop string, finish_reason stop
    full = tk_generate("--prompt", prompts[0], "--max-new-tokens", "24")["text"]
    stop = full[5:7] if len(full) > 8 else None
    if stop and stop.strip():
        r = c.completions.create(model=MODEL, prompt=prompts[0], max_tokens=24, temperature=0, stop=["zzzq", stop])
        want = full[:full.index(stop)]
        if r.choices[0].text != want or r.choices[0].finish_reason != "stop":
            fail("stop %r: %r (%s), want %r" % (stop, r.choices[0].text, r.choices[0].finish_reason, want))
        s = c.completions.create(model=MODEL, prompt=prompts[0], max_tokens=24, temperature=0, stop=[stop],
                                 stream=True)
        got = "".join(x.text for ch in s for x in ch.choices)
        if got != want:
            fail("streamed stop %r: %r, want %r (a stop string leaked)" % (stop, got, want))
    # logprobs: chat's per-token entries, the chosen token at the top of its alternatives (greedy)
    r = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=6, temperature=0, logprobs=True,
                                  top_logprobs=3)
    lp = r.choices[0].logprobs.content
    if len(lp) != 6 or any(len(e.top_logprobs) != 3 for e in lp) or \
            any(abs(e.logprob - e.top_logprobs[0].logprob) > 1e-6 or e.logprob > 0 for e in lp):
        fail("chat logprobs: %s" % lp)
    r = c.completions.create(model=MODEL, prompt=prompts[0], max_tokens=5, temperature=0, logprobs=2)
    L = r.choices[0].logprobs
    if len(L.tokens) != 5 or len(L.token_logprobs) != 5 or len(L.top_logprobs) != 5 or len(L.text_offset) != 5:
        fail("completion logprobs: %s" % L)
    # errors as the client's exception classes
    expect_error(openai.BadRequestError, 400, lambda: c.completions.create(model=MODEL, prompt="x", max_tokens=-1),
                 "max_tokens")
    expect_error(openai.BadRequestError, 400, lambda: c.completions.create(model=MODEL, prompt="x", temperature=5),
                 "temperature")
    expect_error(openai.NotFoundError, 404, lambda: c.completions.create(model="gpt-4", prompt="x"), "gpt-4")
    expect_error(openai.BadRequestError, 400,
                 lambda: c.chat.completions.create(model=MODEL, messages=[{"role": "wizard", "content": "x"}]),
                 "messages[0].role")
    expect_error(openai.BadRequestError, 400, lambda: c.chat.completions.create(model=MODEL, messages=[]), "empty")
    expect_error(openai.BadRequestError, 400,
                 lambda: c.completions.create(model=MODEL, prompt="word " * 200, max_tokens=4),
                 "maximum context length is 128 tokens")
    expect_error(openai.BadRequestError, 400,
                 lambda: c.completions.create(model=MODEL, prompt="Hi", max_tokens=1000000),
                 "maximum context length")
    print("openai client: completions, chat, streams, n=3, stop, logprobs, prefix cache, errors: ok")
    settle()


def check_auth():
    import openai
    expect_error(openai.AuthenticationError, 401, lambda: client("wrong").models.list(), "API key")
    st, body = raw("POST", "/v1/completions", json.dumps({"prompt": "x"}).encode())
    if st != 401 or body["error"]["code"] != "invalid_api_key":
        fail("no key: %d %s" % (st, body))
    r = client(ARGS[0]).completions.create(model=MODEL, prompt="Hi", max_tokens=2)
    if len(r.choices) != 1:
        fail("with the key: %s" % r)
    st, body = raw("GET", "/health")
    if st != 200:
        fail("/health wants no key, got %d" % st)
    print("auth: 401 without or with a wrong key, 200 with it, /health open: ok")


def check_concurrency():
    """32 clients, different prompts and lengths, at once; each equal to the same request run alone."""
    c = client(timeout=300)
    words = "the quick brown fox jumps over a lazy dog once upon time there was little model".split()
    jobs = []
    for i in range(32):
        p = " ".join(words[(i * 3) % len(words):] + words[:i % 7])[: 8 + (i * 11) % 60]
        jobs.append((p, 4 + (i * 5) % 20, i % 4 == 3))  # every fourth samples with a seed
    def run(j):
        p, n, sample = j
        kw = dict(temperature=0.9, seed=1000 + n) if sample else dict(temperature=0)
        r = c.completions.create(model=MODEL, prompt=p, max_tokens=n, **kw)
        return r.choices[0].text, r.usage.completion_tokens
    alone = [run(j) for j in jobs]
    t = time.time()
    with cf.ThreadPoolExecutor(32) as ex:
        together = list(ex.map(run, jobs))
    took = time.time() - t
    bad = [(jobs[i], alone[i], together[i]) for i in range(32) if alone[i] != together[i]]
    if bad:
        fail("%d of 32 differ between alone and 32 at once, e.g. %s" % (len(bad), bad[0]))
    m = settle()
    print("32 concurrent clients: every result equals the request alone (%.1f s together); kv blocks back to %d free"
          % (took, m["tk_kv_blocks_free"]))


def check_bad_requests():
    def post(path, body, ctype="application/json"):
        return raw("POST", path, body if isinstance(body, bytes) else json.dumps(body).encode(),
                   {"Content-Type": ctype})
    cases = [
        ("/v1/completions", b'{"prompt": "hi", "max_tokens": 4', 400, "not valid JSON"),
        ("/v1/completions", b'[1, 2]', 400, "JSON object"),
        ("/v1/completions", {"prompt": 5}, 400, "prompt"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": "4"}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "hi", "n": 0}, 400, "'n'"),
        ("/v1/completions", {"prompt": "hi", "stop": [1]}, 400, "stop"),
        ("/v1/completions", {"prompt": "hi", "top_p": 0}, 400, "top_p"),
        ("/v1/completions", {"prompt": [1, -3]}, 400, "token"),
        ("/v1/completions", {"prompt": [100000]}, 400, "vocabulary"),
        ("/v1/completions", {"prompt": ""}, 400, "empty"),
        ("/v1/completions", {"prompt": "hi", "logit_bias": {"5": 10}}, 400, "logit_bias"),
        ("/v1/completions", {"prompt": "hi", "n": 9}, 400, "--parallel"),
        ("/v1/chat/completions", {"messages": "hi"}, 400, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "user"}], "max_tokens": 2}, 200, None),
        ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]}, 400, "unknown role tool"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "text parts"),
        ("/v1/completions", b'{"prompt": "caf\xe9"}', 400, "UTF-8"),
        ("/v1/nothing", {}, 404, "Unknown request URL"),
    ]
    for path, body, want, text in cases:
        st, r = post(path, body)
        if st != want:
            fail("%s %s: %d %s, want %d" % (path, body, st, r, want))
        if text:
            err = r.get("error", {}) if isinstance(r, dict) else {}
            if not err or text not in err.get("message", "") or "type" not in err:
                fail("%s %s: error %s lacks '%s'" % (path, body, r, text))
    # the same bad input without the fields it needs is named too
    st, r = raw("GET", "/v1/chat/completions")
    if st != 405:
        fail("GET on a POST route: %d" % st)
    # 10 MB: refused with 413 before it is read, and the server goes on
    big = b'{"prompt": "' + b"a" * (10 << 20) + b'"}'
    s = socket.create_connection((HOST, PORT))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
              % len(big))
    try:
        s.sendall(big[:1 << 20])
    except OSError:
        pass
    s.settimeout(10)
    head = s.recv(200)
    s.close()
    if b" 413 " not in head.split(b"\r\n")[0]:
        fail("10 MB body: %r" % head[:100])
    st, _ = post("/v1/completions", {"prompt": "hi", "max_tokens": 2})
    if st != 200:
        fail("after the 10 MB body: %d" % st)
    # a chunked body past the bound: 413 too
    s = socket.create_connection((HOST, PORT))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    try:
        for _ in range(6):
            s.sendall(b"100000\r\n" + b"a" * 0x100000 + b"\r\n")
        s.sendall(b"0\r\n\r\n")
    except OSError:
        pass
    s.settimeout(10)
    head = s.recv(200)
    s.close()
    if head and b" 413 " not in head.split(b"\r\n")[0]:
        fail("chunked 6 MB body: %r" % head[:100])
    settle()
    print("bad requests: %d cases with OpenAI-shaped errors naming the field; 10 MB body 413: ok" % len(cases))


def check_slowloris():
    """A client sending a byte a second is closed after the server's --timeout; others are unaffected."""
    timeout = float(ARGS[0])
    s = socket.create_connection((HOST, PORT))
    req = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\n\r\n" + b'{"prompt": "hello", "max_tokens": 2}    '
    closed_at = None
    t0 = time.time()
    def fast():
        t = time.time()
        st, _ = raw("POST", "/v1/completions", json.dumps({"prompt": "hi", "max_tokens": 2}).encode())
        return st, time.time() - t
    for i, b in enumerate(req):
        try:
            s.sendall(bytes([b]))
        except OSError:
            closed_at = time.time() - t0
            break
        if i % 3 == 0:
            st, d = fast()
            if st != 200 or d > 5:
                fail("a normal request during slowloris: %d in %.1f s" % (st, d))
        time.sleep(1)
        if time.time() - t0 > timeout + 8:
            break
    if closed_at is None:
        s.settimeout(2)
        try:
            closed_at = time.time() - t0 if s.recv(100) in (b"",) else None
        except OSError:
            closed_at = time.time() - t0
    if closed_at is None or closed_at > timeout + 6:
        fail("the slow client was not closed after %.0f s (%s)" % (timeout, closed_at))
    print("slowloris: closed after %.1f s (timeout %.0f s); normal requests served meanwhile: ok" % (closed_at, timeout))


def check_many_connections():
    """500 connections at once, each sending a small completion: every one answered 200 or 429."""
    n = int(ARGS[0]) if ARGS else 500
    body = json.dumps({"prompt": "Once", "max_tokens": 2, "temperature": 0}).encode()
    req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
           b"Content-Length: %d\r\n\r\n" % len(body)) + body
    socks = []
    t0 = time.time()
    for _ in range(n):
        s = socket.create_connection((HOST, PORT), timeout=120)
        socks.append(s)
    t_conn = time.time() - t0
    for s in socks:
        s.sendall(req)
    codes = {}
    def read(s):
        data, why = b"", "EOF"
        try:
            while True:
                d = s.recv(65536)
                if not d:
                    break
                data += d
        except OSError as e:
            why = type(e).__name__
        s.close()
        line = data.split(b"\r\n", 1)[0]
        if line.startswith(b"HTTP/1.1 "):
            return line.split(b" ")[1].decode(), None
        return "closed", "%s after %.1f s with %d bytes" % (why, time.time() - t0, len(data))
    closed = []
    with cf.ThreadPoolExecutor(64) as ex:
        for code, why in ex.map(read, socks):
            codes[code] = codes.get(code, 0) + 1
            if why:
                closed.append(why)
    if set(codes) - {"200", "429"} or codes.get("200", 0) < 4:
        fail("%d connections (connected in %.1f s): %s; the first unanswered: %s" % (
            n, t_conn, codes, "; ".join(closed[:5])))
    st, _ = raw("GET", "/health")
    if st != 200:
        fail("/health after %d connections: %d" % (n, st))
    m = settle()
    print("%d connections at once (connected in %.1f s, all answered in %.1f s): %s; healthy after, kv blocks free "
          "%d of %d: ok" % (n, t_conn, time.time() - t0, codes, m["tk_kv_blocks_free"], m["tk_kv_blocks_total"]))


def check_vanish():
    """Clients that vanish mid-stream (and one mid-wait): their sequences leave the batch."""
    before = metrics()
    cancelled_key, ok_key = 'tk_requests_total{outcome="cancelled"}', 'tk_requests_total{outcome="ok"}'
    # Each stream closes after three events. The tiny model can finish all its tokens before a loaded
    # machine lets this process close: such a try ends "ok", not "cancelled", and is tried again.
    stream_max = 120  # of the tiny model's 128 positions (the prompt is 5)
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": stream_max, "stream": True, "ignore_eos": True,
                       "temperature": 0}).encode()
    m, streams_answered = before, 0
    for k in range(3):
        for _ in range(5):
            last = m
            s = socket.create_connection((HOST, PORT), timeout=30)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body) + body)
            got = b""
            while got.count(b"data: ") < 3:
                d = s.recv(4096)
                got += d
                if not d or (got.startswith(b"HTTP/") and not got.startswith(b"HTTP/1.1 200")):
                    fail("stream %d: %r" % (k, got[-400:]))
            s.close()
            m = settle()
            if m[cancelled_key] == last[cancelled_key] + 1:
                break
            if m[ok_key] == last[ok_key] + 1:
                streams_answered += 1
                continue
            fail("vanished stream %d neither ended ok nor was cancelled: %s" % (k, m))
        else:
            fail("vanished stream %d: five tries all finished before the server saw the client go" % k)
    # The waiting client closes once the server holds its request (a client gone before the server read
    # it was never a request); tried again the same way.
    nb = json.dumps({"prompt": "Once upon a time", "max_tokens": 100, "ignore_eos": True}).encode()
    answered = 0
    for _ in range(5):
        last = m
        s = socket.create_connection((HOST, PORT))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(nb) + nb)
        t = time.time()
        while time.time() - t < 30:
            h = metrics()
            if h["tk_requests_running"] + h["tk_requests_queued"] >= 1:
                break
            time.sleep(0.01)
        s.close()
        m = settle()
        if m[cancelled_key] > last[cancelled_key]:
            break
        if m[ok_key] > last[ok_key]:
            answered += 1
            continue
        fail("the waiting client's request neither ended ok nor was cancelled: %s" % m)
    gen = m["tk_generation_tokens_total"] - before["tk_generation_tokens_total"]
    cancelled = m[cancelled_key] - before[cancelled_key]
    most = (3 + streams_answered) * stream_max + (1 + answered) * 100
    if cancelled != 4 or gen >= most:
        fail("vanished clients: %d cancelled, %d tokens generated (%d if never cancelled; %d stream and %d waiting "
             "tries answered before the client could close)" % (cancelled, gen, most, streams_answered, answered))
    print("vanishing clients: 4 cancelled after %d tokens in all (of %d); %d stream and %d waiting tries answered "
          "first; kv blocks back: ok" % (gen, most, streams_answered, answered))


def check_streams_then_term():
    """Opens 20 streams, signals the server (pid in ARGS[0]) with SIGTERM, and checks every stream
    ended cleanly ([DONE]) and the server exited."""
    pid = int(ARGS[0])
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 60, "stream": True, "ignore_eos": True,
                       "temperature": 0}).encode()
    socks = []
    for _ in range(20):
        s = socket.create_connection((HOST, PORT), timeout=60)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d"
                  b"\r\n\r\n" % len(body) + body)
        socks.append(s)
    time.sleep(1.0)
    os.kill(pid, 15)
    def read(s):
        data = b""
        try:
            while True:
                d = s.recv(65536)
                if not d:
                    break
                data += d
                if data.endswith(b"0\r\n\r\n"):
                    break
        except OSError:
            pass
        s.close()
        return data
    with cf.ThreadPoolExecutor(20) as ex:
        outs = list(ex.map(read, socks))
    done = sum(1 for d in outs if b"data: [DONE]" in d)
    ok = sum(1 for d in outs if d.startswith(b"HTTP/1.1 200") or d.startswith(b"HTTP/1.1 503"))
    if ok != 20 or done != 20:
        fail("20 streams at SIGTERM: %d answered, %d ended with [DONE]: %s" % (ok, done, [d[:80] for d in outs if b"[DONE]" not in d][:2]))
    print("SIGTERM with 20 streams open: all 20 ended with [DONE]")


def check_metrics_shape():
    m = metrics()
    need = ["tk_prompt_tokens_total", "tk_generation_tokens_total", 'tk_requests_total{outcome="ok"}',
            "tk_requests_queued", "tk_slots_busy", "tk_generation_tokens_per_second", "tk_kv_blocks_used",
            "tk_kv_blocks_free", "tk_kv_blocks_total"]
    missing = [k for k in need if k not in m]
    if missing:
        fail("metrics lack %s" % missing)
    print("metrics: %d series, %s" % (len(m), {k: m[k] for k in need}))


def check_diffusion():
    """A masked diffusion checkpoint (LLaDA layout): completions equal tk generate --diffusion's text, a
    stream sends one chunk per finished block and adds up to the same text, the openai client reads it,
    a stop string cuts the text, and logprobs or a max_tokens that is no multiple of block_length are
    refused with 400 naming the field."""
    want = tk_generate("--prompt", "Once upon a time", "--gen-length", "16", "--block-length", "8", "--steps", "8")
    text = want["text"]
    # no temperature: the server's default for a diffusion model is tk generate --diffusion's (0), not
    # generation_config.json's sampling
    body = {"prompt": "Once upon a time", "max_tokens": 16, "block_length": 8, "steps": 8}
    st, r = raw("POST", "/v1/completions", json.dumps(body).encode())
    if st != 200 or r["choices"][0]["text"] != text or r["usage"]["completion_tokens"] != 16:
        fail("diffusion completion: %d %s, want the text %r" % (st, r, text))
    chunks, done = sse_choices(body, 60)
    streamed = "".join(c["text"] for c in chunks)
    if not done or streamed != text or chunks[-1]["finish_reason"] != r["choices"][0]["finish_reason"] or \
            len([c for c in chunks if c["text"]]) > 2:
        fail("diffusion stream: %s (done %s), want %r in at most 2 blocks" % (chunks, done, text))
    c = client().completions.create(model="llada", prompt="Once upon a time", max_tokens=16, temperature=0,
                                    extra_body={"block_length": 8, "steps": 8})
    if c.choices[0].text != text:
        fail("openai client: %r, want %r" % (c.choices[0].text, text))
    stop = text[len(text) // 2:len(text) // 2 + 2] if len(text) >= 4 else None
    if stop:
        st, r2 = raw("POST", "/v1/completions", json.dumps(dict(body, stop=[stop])).encode())
        got = r2["choices"][0] if st == 200 else r2
        if st != 200 or got["text"] != text[:text.index(stop)] or got["finish_reason"] != "stop":
            fail("diffusion with stop %r: %d %s, want %r" % (stop, st, got, text[:text.index(stop)]))
    for extra, param in (({"logprobs": 1}, "logprobs"), ({"max_tokens": 15}, None), ({"t_min": 0.5}, "t_min")):
        st, e = raw("POST", "/v1/completions", json.dumps(dict(body, **extra)).encode())
        if st != 400 or (param and e["error"]["param"] != param):
            fail("diffusion %s: %d %s, want 400" % (extra, st, e))
        if "max_tokens" in extra and "(max_tokens is the gen_length)" not in e["error"]["message"]:
            fail("diffusion %s: %r does not say max_tokens is the gen_length" % (extra, e["error"]["message"]))
    print("diffusion: text %r alone, streamed in %d chunks, through the openai client and cut at stop %r; "
          "logprobs, max_tokens 15 of block 8 and block diffusion's t_min refused" % (text, len(chunks), stop))


def diff_post(body, timeout=120):
    st, r = raw("POST", "/v1/completions", json.dumps(body).encode(), timeout=timeout)
    if st != 200:
        fail("diffusion %s: %d %s" % (body, st, r))
    return [(c["text"], c["finish_reason"]) for c in r["choices"]]


def sse_choices(body, timeout):
    """body streamed from /v1/completions: each event's choices[0], and whether [DONE] came."""
    req = urllib.request.Request(URL + "/v1/completions", data=json.dumps(dict(body, stream=True)).encode(),
                                 method="POST")
    chunks, done = [], False
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        for line in resp:
            line = line.decode().strip()
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunks.append(json.loads(line[6:])["choices"][0])
    return chunks, done


def diff_stream(body):
    """The text a stream adds up to, as diff_post's one choice (no finish_reason)."""
    chunks, done = sse_choices(body, 120)
    if not done:
        fail("diffusion stream %s: no [DONE]" % body)
    return [("".join(c["text"] for c in chunks), None)]


def diff_vanish(body):
    """A stream whose client closes after its first text chunk; True once the server counted it cancelled."""
    data = json.dumps(dict(body, stream=True)).encode()
    s = socket.create_connection((HOST, PORT), timeout=60)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d"
              b"\r\n\r\n" % len(data) + data)
    got = b""
    while b'"text":"' not in got.replace(b'"text":""', b""):
        d = s.recv(4096)
        if not d:
            break
        got += d
    s.close()


def batched_with_vanish(jobs, alone, run, vanish, seq_steps, vanish_steps):
    """Runs jobs at once with one more stream (vanish) whose client closes after its first chunk, up to
    five tries until the batch really formed: every answer equals alone's, the vanished stream counted
    cancelled and its sequence-steps (above the jobs' seq_steps) fewer than vanish_steps, and fewer
    steps than half the sequence-steps. Returns (steps, sequence-steps) of the try that passed."""
    cancelled_key = 'tk_requests_total{outcome="cancelled"}'
    ok_key = 'tk_requests_total{outcome="ok"}'
    for attempt in range(5):
        m2 = metrics()
        with cf.ThreadPoolExecutor(len(jobs) + 1) as ex:
            fv = ex.submit(diff_vanish, vanish)
            together = list(ex.map(run, jobs))
            fv.result()
        m3 = settle()
        bad = [(jobs[i], alone[i], together[i]) for i in range(len(jobs)) if alone[i] != together[i]]
        if bad:
            fail("%d of %d differ between alone and batched, e.g. %s" % (len(bad), len(jobs), bad[0]))
        steps = m3["tk_diffusion_steps_total"] - m2["tk_diffusion_steps_total"]
        seqs = m3["tk_diffusion_step_sequences_total"] - m2["tk_diffusion_step_sequences_total"]
        cancelled = m3[cancelled_key] - m2[cancelled_key]
        if cancelled == 0 and m3[ok_key] - m2[ok_key] == len(jobs) + 1:
            print("try %d: the vanishing stream ended before its client closed; again" % attempt)
            continue  # a loaded machine let it finish first
        # the vanished stream ran some of its steps; the others all of theirs
        if not (seq_steps < seqs < seq_steps + vanish_steps) or cancelled != 1:
            fail("batched: %d sequence-steps (want %d + under %d of the vanished stream's), %d cancelled" %
                 (seqs, seq_steps, vanish_steps, cancelled))
        if steps < seqs / 2.0:
            return steps, seqs
        print("try %d: %d steps for %d sequence-steps: the requests hardly overlapped; again" % (attempt, steps, seqs))
    fail("five tries, and the concurrent requests never shared steps with a stream cancelled among them "
         "(last: %d steps for %d sequence-steps, %d cancelled)" % (steps, seqs, cancelled))


def check_diffusion_batch():
    """Concurrent requests to a masked diffusion checkpoint share each denoising step's forward (the
    diffusion step counters say so: fewer steps than the requests alone, the same sequence-steps), and
    every answer equals the same request sent alone: greedy, seeded sampling, cfg, random remasking,
    different gen_lengths, block_lengths and steps, n > 1 (each choice equal to a request of its seed
    alone), a stream; one more stream whose client vanishes mid-batch does not change the others."""
    P = ["Once upon a time", "The quick brown fox", "To be, or not to be", "Masked diffusion models"]
    jobs = [
        dict(prompt=P[0], max_tokens=64, block_length=8, steps=64, temperature=0),
        dict(prompt=P[1], max_tokens=48, block_length=16, steps=24, temperature=0.8, seed=7),
        dict(prompt=P[2], max_tokens=32, block_length=8, steps=32, cfg_scale=1.5),
        dict(prompt=P[3], max_tokens=40, block_length=8, steps=20, remasking="random", seed=3),
        dict(prompt=P[0], max_tokens=24, steps=24, cfg_scale=1.0, temperature=1.0, seed=5),
        dict(prompt=P[1], max_tokens=32, block_length=8, steps=32, temperature=0.9, seed=11, n=3),
        dict(prompt=P[2], max_tokens=56, block_length=8, steps=56, stream=True),
    ]
    run = lambda j: diff_stream(j) if j.get("stream") else diff_post(j)
    steps_of = lambda j: j["steps"] * j.get("n", 1)
    m0 = metrics()
    alone = [run(j) for j in jobs]
    m1 = metrics()
    alone_steps = m1["tk_diffusion_steps_total"] - m0["tk_diffusion_steps_total"]
    seq_steps = m1["tk_diffusion_step_sequences_total"] - m0["tk_diffusion_step_sequences_total"]
    if seq_steps != sum(steps_of(j) for j in jobs):
        fail("alone: %d sequence-steps, want %d" % (seq_steps, sum(steps_of(j) for j in jobs)))
    # n = 3 choices: choice i is the request with seed + i alone
    nj = jobs[5]
    for i in range(3):
        one = diff_post(dict(nj, n=1, seed=nj["seed"] + i))
        if alone[5][i] != one[0]:
            fail("n=3 choice %d %r differs from the request with seed %d alone %r" % (i, alone[5][i], nj["seed"] + i,
                                                                                      one[0]))
    vanish = dict(prompt=P[3], max_tokens=80, block_length=8, steps=80, temperature=0)
    steps, seqs = batched_with_vanish(jobs, alone, run, vanish, seq_steps, 80)
    print("diffusion batch: %d requests (%d sequences) and a vanishing stream at once: every answer equals the "
          "request alone; %d steps for %d sequence-steps (alone: %d steps); 1 cancelled" %
          (len(jobs), sum(j.get("n", 1) for j in jobs), steps, seqs, alone_steps))


BLOCK_FLAGS = ("steps", "t_min", "t_max", "entropy_bound", "confidence_threshold", "stability_threshold")


def block_generate(j, seed):
    """tk generate --json's text for block diffusion request j with this seed"""
    args = ["--ids", ",".join(map(str, j["prompt"])), "--gen-length", str(j["max_tokens"]), "--seed", str(seed)]
    for k in BLOCK_FLAGS:
        if k in j:
            args += ["--" + k.replace("_", "-"), str(j[k])]
    return tk_generate(*args)["text"]


def check_block_diffusion():
    """DiffusionGemma requests batched: token-id prompts of different lengths (one past the sliding window),
    gen_lengths of 1 to 5 blocks, steps, seeds and sampler options (t_min, t_max, entropy_bound,
    confidence_threshold, stability_threshold), n = 3 and a stream, sent at once with a client that
    vanishes among them: every answer equals the same request alone, which equals tk generate --json; the
    steps counter says the batch formed (fewer steps than sequence-steps); options that are not block
    diffusion's are refused naming the field."""
    jobs = [
        dict(prompt=[5, 17, 99], max_tokens=12, steps=6, seed=5),
        dict(prompt=[5, 17, 99, 3], max_tokens=18, steps=10, seed=1, entropy_bound=3.0),
        dict(prompt=[5, 17, 99, 3, 250, 7, 8, 9, 10], max_tokens=30, steps=8, seed=2, entropy_bound=1.5, t_min=0.05,
             t_max=0.3, confidence_threshold=2.0),
        dict(prompt=[5], max_tokens=6, steps=20, seed=3, entropy_bound=0.5, t_min=0.01, t_max=0.1,
             confidence_threshold=1.0, stability_threshold=2),
        dict(prompt=[5, 6], max_tokens=12, steps=6, seed=11, n=3),
        dict(prompt=[7, 8, 9], max_tokens=24, steps=6, seed=4, stream=True),
    ]
    want = [[block_generate(j, j["seed"] + i) for i in range(j.get("n", 1))] for j in jobs]
    run = lambda j: [c[0] for c in (diff_stream(j) if j.get("stream") else diff_post(j))]
    m0 = metrics()
    alone = [run(j) for j in jobs]
    m1 = metrics()
    if alone != want:
        bad = [(jobs[i], alone[i], want[i]) for i in range(len(jobs)) if alone[i] != want[i]]
        fail("block diffusion alone differs from tk generate: %d of %d, e.g. %s" % (len(bad), len(jobs), bad[0]))
    alone_steps = m1["tk_diffusion_steps_total"] - m0["tk_diffusion_steps_total"]
    seq_steps = m1["tk_diffusion_step_sequences_total"] - m0["tk_diffusion_step_sequences_total"]
    vanish = dict(prompt=[9, 10], max_tokens=60, steps=20, seed=8, stream=True)
    steps, seqs = batched_with_vanish(jobs, alone, run, vanish, seq_steps, 200)
    for extra, param in (({"cfg_scale": 1.0}, None), ({"logprobs": 1}, "logprobs"), ({"t_min": 0.9, "t_max": 0.5}, None),
                         ({"temperature": 0.7}, None), ({"top_p": 0.9}, None)):
        st, e = raw("POST", "/v1/completions", json.dumps(dict(jobs[0], **extra)).encode())
        if st != 400 or (param and e["error"]["param"] != param):
            fail("block diffusion %s: %d %s, want 400" % (extra, st, e))
        if "t_min" in extra and "max_tokens" in e["error"]["message"]:
            fail("block diffusion %s: %r names max_tokens, which it is not about" % (extra, e["error"]["message"]))
    print("block diffusion batch: %d requests (%d sequences) and a vanishing stream at once: every answer equals "
          "the request alone and tk generate; %d steps for %d sequence-steps (alone: %d steps); 1 cancelled" %
          (len(jobs), sum(j.get("n", 1) for j in jobs), steps, seqs, alone_steps))


{"block_diffusion": check_block_diffusion, "diffusion": check_diffusion, "diffusion_batch": check_diffusion_batch, "openai": check_openai, "auth": check_auth, "concurrency": check_concurrency, "bad": check_bad_requests,
 "slowloris": check_slowloris, "connections": check_many_connections, "vanish": check_vanish,
 "term": check_streams_then_term, "metrics": check_metrics_shape}[CHECK]()
