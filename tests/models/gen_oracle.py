#!/usr/bin/env python3
"""gen_oracle.py — transformers as the oracle for tk's generation (tests/test_generate.c and
tests/cli/generate.sh run it; never tk).

  gen_oracle.py processors
      Random and tie-heavy rows through transformers' LogitsProcessor classes, one case per block:
        case NAME PARAM MIN_KEEP MODE      (MODE: exact, or count when torch.sort's order of tied
                                            scores is not a stable sort's, so only how many survive
                                            is comparable)
        ids N id...
        in V x...                           (f32 values as float.hex(), or inf/-inf)
        out V x...
  gen_oracle.py make DIR llama|gpt2
      Writes a tiny random checkpoint (seeded: the same bytes each time, tokenizer.json included)
      with a tokenizer trained on a few sentences: Llama with a SentencePiece-style byte-fallback
      BPE, GPT-2 with a byte-level BPE. Weights are drawn wider than transformers' init so that
      logits are far apart and greedy and beam choices are not decided by rounding.
  gen_oracle.py generate DIR IDS [key=value ...]
      model.generate() on the checkpoint in DIR (float32, CPU) for the prompt IDS (comma-separated),
      with GenerationConfig fields as key=value (ints, floats, true/false, or a list as a,b,c for
      eos_token_id); prints {"ids": [new ids]} as JSON.
  gen_oracle.py generate-many DIR < JOBS
      The same for many prompts with one model load: each input line is "IDS key=value ...", each
      output line the JSON for it.
  gen_oracle.py generate-each < JOBS
      The same for prompts on several checkpoints in one process (its start-up, importing torch and
      transformers, costs more than the generations): each input line is "DIR IDS key=value ...";
      each checkpoint is loaded once.
  gen_oracle.py logits DIR IDS
      The model's logits at every position of IDS as JSON rows (for the cache tests).
"""
import json
import os
import sys

import torch
from transformers.generation import logits_process as lp


def fmt(t):
    out = []
    for x in t.tolist():
        out.append("-inf" if x == float("-inf") else "inf" if x == float("inf") else float(x).hex())
    return " ".join(out)


def emit(name, param, min_keep, ids, scores, out, mode="exact"):
    print(f"case {name} {param!r} {min_keep} {mode}")
    print(f"ids {len(ids)} " + " ".join(str(i) for i in ids))
    print(f"in {scores.shape[-1]} {fmt(scores[0])}")
    print(f"out {out.shape[-1]} {fmt(out[0])}")


def stable_ties(row):
    """True when torch.sort (as TopPLogitsWarper calls it) orders this row as a stable sort does."""
    a = torch.sort(row, descending=False).indices
    b = torch.sort(row, descending=False, stable=True).indices
    return bool(torch.equal(a, b))


def processors():
    g = torch.Generator().manual_seed(1234)
    rows = []
    for V in (7, 16, 50, 1000):
        for _ in range(3):
            rows.append(torch.randn(1, V, generator=g) * 3)
        # ties: few distinct values
        rows.append(torch.round(torch.randn(1, V, generator=g) * 2) / 2)
        # a row with -inf entries
        r = torch.randn(1, V, generator=g)
        r[0, torch.randint(0, V, (max(1, V // 5),), generator=g)] = float("-inf")
        rows.append(r)
    # a flat row (every score tied) and a peaked one
    rows.append(torch.zeros(1, 12))
    rows.append(torch.tensor([[10.0, 0.0, 0.0, 0.0, 0.0, -1.0]]))
    rows.append(torch.tensor([[1.0, 2.0, 2.0, 2.0, 2.0, 0.5, 2.0, 2.0]]))
    for row in rows:
        V = row.shape[-1]
        n = int(torch.randint(0, 12, (1,), generator=g))
        ids = torch.randint(0, V + 3, (1, n), generator=g)  # some ids past the vocabulary
        # repeated n-grams so no_repeat_ngram has something to ban
        if n >= 4:
            ids[0, -2:] = ids[0, :2]
        idl = ids[0].tolist()
        for t in (0.7, 1.3):
            emit("temperature", t, 1, idl, row, lp.TemperatureLogitsWarper(t)(ids, row.clone()))
        for p in (1.2, 0.8):
            emit("repetition_penalty", p, 1, idl, row, lp.RepetitionPenaltyLogitsProcessor(p)(ids, row.clone()))
        for ng in (1, 2, 3):
            emit("no_repeat_ngram", ng, 1, idl, row, lp.NoRepeatNGramLogitsProcessor(ng)(ids, row.clone()))
        for k, mk in ((1, 1), (3, 1), (5, 2), (V + 2, 1)):
            emit("top_k", k, mk, idl, row, lp.TopKLogitsWarper(k, min_tokens_to_keep=mk)(ids, row.clone()))
        for p, mk in ((0.1, 1), (0.5, 1), (0.9, 1), (0.95, 3), (0.999, 1)):
            out = lp.TopPLogitsWarper(p, min_tokens_to_keep=mk)(ids, row.clone())
            emit("top_p", p, mk, idl, row, out, "exact" if stable_ties(row[0]) else "count")
        for p, mk in ((0.05, 1), (0.2, 1), (0.5, 2), (1.0, 1)):
            emit("min_p", p, mk, idl, row, lp.MinPLogitsWarper(p, min_tokens_to_keep=mk)(ids, row.clone()))
        if torch.isfinite(row).any():
            emit("log_softmax", 0, 1, idl, row, torch.log_softmax(row, dim=-1))


def parse_value(v):
    if v in ("true", "false"):
        return v == "true"
    if v == "never":
        return v
    if "," in v:
        return [int(x) for x in v.split(",") if x]
    try:
        return int(v)
    except ValueError:
        return float(v)


def load(d):
    from transformers import AutoModelForCausalLM
    # eager for an attention softcap (Gemma 2): some transformers versions default it to sdpa, which drops
    # the softcap
    cfg = json.load(open(os.path.join(d, "config.json")))
    kw = {"attn_implementation": "eager"} if cfg.get("attn_logit_softcapping") else {}
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, **kw)
    return model.eval()


def generate(model, ids, kvs):
    kw = {k: parse_value(v) for k, v in (a.split("=", 1) for a in kvs)}
    prompt = torch.tensor([[int(x) for x in ids.split(",")]])
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), **kw)
    print(json.dumps({"ids": out[0, prompt.shape[1]:].tolist()}), flush=True)


TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "A journey of a thousand miles begins with a single step.",
    "Caf\u00e9 cr\u00e8me br\u00fbl\u00e9e, na\u00efve r\u00e9sum\u00e9 \u2014 \u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 \U0001F600.",
    "Once upon a time there was a little model that generated text, token by token.",
    "To be, or not to be, that is the question.",
] * 4


def make_tokenizer(kind):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    if kind == "gpt2":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tr = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                 initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(TEXT, tr)
        return tok, tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|endoftext|>")
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    special = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    # The 40 most frequent characters, ties broken by code point, as the alphabet (the rest fall back
    # to bytes): with limit_alphabet alone the trainer drops tied characters in hash order, and each
    # run made another vocabulary and merge list.
    import collections
    count = collections.Counter("".join(tok.normalizer.normalize_str(t) for t in TEXT))
    alphabet = [c for c, _ in sorted(count.items(), key=lambda kv: (-kv[1], kv[0]))[:40]]
    tr = trainers.BpeTrainer(vocab_size=420, special_tokens=special, limit_alphabet=40, initial_alphabet=alphabet)
    tok.train_from_iterator(TEXT, tr)
    return tok, tok.token_to_id("<s>"), tok.token_to_id("</s>")


def make(d, kind):
    import os
    torch.manual_seed(0)
    tok, bos, eos = make_tokenizer(kind)
    V = tok.get_vocab_size()
    if kind == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(vocab_size=V, n_positions=128, n_embd=64, n_layer=2, n_head=4, bos_token_id=bos,
                         eos_token_id=eos, initializer_range=0.3)
        model = GPT2LMHeadModel(cfg)
    else:
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                          bos_token_id=bos, eos_token_id=eos, initializer_range=0.3, tie_word_embeddings=False)
        model = LlamaForCausalLM(cfg)
    model = model.float().eval()
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    tok.save(os.path.join(d, "tokenizer.json"))
    print(json.dumps({"dir": d, "vocab": V, "bos": bos, "eos": eos}))


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "processors":
        processors()
    elif len(sys.argv) == 4 and sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 4 and sys.argv[1] == "generate":
        generate(load(sys.argv[2]), sys.argv[3], sys.argv[4:])
    elif len(sys.argv) == 3 and sys.argv[1] == "generate-many":
        m = load(sys.argv[2])
        for line in sys.stdin:
            if line.strip():
                a = line.split()
                generate(m, a[0], a[1:])
    elif len(sys.argv) == 2 and sys.argv[1] == "generate-each":
        models = {}
        for line in sys.stdin:
            if line.strip():
                a = line.split()
                if a[0] not in models:
                    models[a[0]] = load(a[0])
                generate(models[a[0]], a[1], a[2:])
    elif len(sys.argv) == 4 and sys.argv[1] == "logits":
        m = load(sys.argv[2])
        with torch.no_grad():
            lg = m(torch.tensor([[int(x) for x in sys.argv[3].split(",")]])).logits[0]
        print(json.dumps(lg.tolist()))
    else:
        sys.exit(__doc__)
