#!/usr/bin/env python3
"""layouts.py — checkpoints laid out as transformers 5 writes them, with transformers' own answers,
for tests/cli/checkpoints.sh.

  layouts.py make OUT
      (the test venv's python) Writes one directory per layout under OUT with save_pretrained of tiny
      seeded models and tokenizers, and OUT/expect.json: for each case the tk command line and what
      transformers gives for it (greedy ids from generate(), apply_chat_template's text or its error,
      the tokenizer's ids and text).
  layouts.py check TK OUT GROUP
      (any python3) Runs each case of GROUP through the tk binary TK and prints one line per
      difference, then "GROUP: N cases, M differ"; exit 1 when any differs.

The layouts: a sharded checkpoint with model.safetensors.index.json; bf16 weights with v5's "dtype"
(not "torch_dtype"); tie_word_embeddings absent (GPT-2: tied by default; Llama: not); a
generation_config.json without eos_token_id (transformers does not fall back to config.json's then);
tokenizer.json with no tokenizer_config.json (and truncation without a limit: usize::MAX, past
int64); added tokens with special/normalized/lstrip/rstrip
flags; chat templates as chat_template.jinja, as several templates (additional_chat_templates/
NAME.jinja), as tokenizer_config.json's list of {name, template}, as a processor's chat_template.json,
and as both tokenizer_config.json's string and chat_template.jinja (the file wins); tokenizer_config's
"no limit" model_max_length (1e30, past int64); bos/eos ids outside the vocabulary; and a 34-layer
model quantised to int8 and fp8 against transformers on the same weights quantised and dequantised
here (tk's scheme: one f32 scale per output row, max|row| / 127 or / 448, round to nearest even).
Seeds are fixed: the same script writes the same files and answers.
"""
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


# ---- make (needs torch and transformers) ---------------------------------------------------------

def make(out):
    import torch
    torch.set_num_threads(1)  # tiny models: threads only contend on a shared machine
    from transformers import (AddedToken, GenerationConfig, GPT2Config, GPT2LMHeadModel, LlamaConfig,
                              LlamaForCausalLM, PreTrainedTokenizerFast)
    sys.path.insert(0, HERE)
    from chat_oracle import TEMPLATES
    from gen_oracle import make_tokenizer

    os.makedirs(out, exist_ok=True)
    cases = []
    raw_tok, BOS, EOS = make_tokenizer("llama")
    V = raw_tok.get_vocab_size()

    def fast(tok=raw_tok, **kw):
        return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                       **kw)

    def seeded(model, seed):
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for n, p in model.named_parameters():
                r = torch.randn(p.shape, generator=g)
                p.copy_((1.0 + 0.1 * r) if p.dim() == 1 and "norm" in n else 0.3 * r)
        return model.eval()

    def llama(seed, layers=2, hidden=64, **kw):
        base = dict(vocab_size=V, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, bos_token_id=BOS,
                    eos_token_id=EOS, tie_word_embeddings=False)
        base.update(kw)
        return seeded(LlamaForCausalLM(LlamaConfig(**base)), seed)

    def greedy(model, ids, n, **kw):
        p = torch.tensor([ids])
        with torch.no_grad():
            o = model.generate(p, attention_mask=torch.ones_like(p), max_new_tokens=n, do_sample=False, **kw)
        return o[0, len(ids):].tolist()

    def gen_case(group, d, model, ids, n, extra=(), want_stderr=None, **kw):
        cases.append({"group": group, "kind": "generate", "argv": ["generate", d, "--ids", ",".join(map(str, ids)),
                                                                  "--max-new-tokens", str(n), *extra],
                      "want_ids": greedy(model, ids, n, **kw), "want_stderr": want_stderr})

    def prompt_case(group, d, model, tok, text, n):
        ids = tok(text)["input_ids"]
        want = greedy(model, ids, n)
        cases.append({"group": group, "kind": "generate", "argv": ["generate", d, "--prompt", text,
                                                                  "--max-new-tokens", str(n)],
                      "want_ids": want, "want_text": tok.decode(want, skip_special_tokens=True)})

    CONVS = [[{"role": "user", "content": "Once upon a time"}],
             [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "the quick brown fox"},
              {"role": "assistant", "content": "jumps"}, {"role": "user", "content": "To be, or not to be"}]]

    def render_cases(group, d, tok, names=(None,), convs=CONVS, template_text=None):
        for name in names:
            for conv in convs:
                for agp in (True, False):
                    argv = ["chat", d, "--render"]
                    for m in conv:
                        argv += ["--message", m["role"] + "=" + m["content"]]
                    if not agp:
                        argv.append("--no-generation-prompt")
                    if name:
                        argv += ["--template", name]
                    c = {"group": group, "kind": "render", "argv": argv}
                    names = tok.chat_template if isinstance(tok.chat_template, dict) else {"default": 1}
                    if name and name not in names:  # transformers would render the name as a template
                        c["want_rc"], c["want_error"] = 3, "no chat template named '%s'" % name
                        cases.append(c)
                        continue
                    if not name and "default" not in names:  # transformers refuses to choose
                        c["want_rc"], c["want_error"] = 2, "several chat templates and none named default"
                        cases.append(c)
                        continue
                    try:
                        c["want"] = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=agp,
                                                            chat_template=template_text or name)
                    except Exception as e:  # transformers refuses: tk must too
                        c["want_rc"], c["want_error"] = 2, str(e).split(" Please")[0]
                    cases.append(c)

    def chat_case(group, d, model, tok, lines, n, system=None, template=None):
        """tk chat over stdin: each reply is what generate() gives on the rendered conversation."""
        conv = [{"role": "system", "content": system}] if system else []
        want = []
        for line in lines:
            conv.append({"role": "user", "content": line})
            text = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True, chat_template=template)
            ids = tok(text, add_special_tokens=False)["input_ids"]
            new = greedy(model, ids, n)
            want.append(new)
            conv.append({"role": "assistant", "content": tok.decode(new, skip_special_tokens=True)})
        argv = ["chat", d, "--max-new-tokens", str(n)] + (["--system", system] if system else []) + \
            (["--template", template] if template else [])
        cases.append({"group": group, "kind": "chat", "argv": argv, "stdin": "".join(l + "\n" for l in lines),
                      "want_ids": want})

    def path(name):
        d = os.path.join(out, name)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        return d

    # 1. sharded safetensors with an index, v5 config ("dtype"), the tokenizer saved by transformers with a
    #    chat template (chat_template.jinja) and its "no limit" model_max_length (1e30, past int64).
    d = path("sharded")
    m = llama(11)
    m.save_pretrained(d, max_shard_size="60KB")
    tok = fast()
    tok.chat_template = TEMPLATES["chatml_qwen2"]
    tok.save_pretrained(d)
    assert os.path.exists(os.path.join(d, "model.safetensors.index.json")), os.listdir(d)
    assert json.load(open(os.path.join(d, "tokenizer_config.json")))["model_max_length"] > 2 ** 63
    assert os.path.exists(os.path.join(d, "chat_template.jinja"))
    gen_case("sharded", "sharded", m, [BOS, 50, 60, 70], 16)
    with torch.no_grad():  # tk model logits' top 5 with their text, as decode([id]) gives it
        last = m(torch.tensor([[BOS, 50, 60, 70]])).logits[0, -1]
    cases.append({"group": "sharded", "kind": "top", "argv": ["model", "logits", "sharded", "--ids",
                                                              "%d,50,60,70" % BOS],
                  "want": [[i, json.dumps(tok.decode([i]))] for i in torch.topk(last, 5).indices.tolist()]})
    prompt_case("sharded", "sharded", m, tok, "The quick brown fox", 12)
    render_cases("sharded", "sharded", tok)
    chat_case("sharded", "sharded", m, tok, ["Once upon a time", "the fox"], 8, system="Be brief.")

    # 2. bf16 weights, v5's "dtype": "bfloat16"; tk in f32 against transformers upcasting the same weights
    d = path("bf16-dtype")
    m = llama(12).to(torch.bfloat16)
    m.save_pretrained(d)
    cfg = json.load(open(os.path.join(d, "config.json")))
    assert cfg.get("dtype") == "bfloat16" and "torch_dtype" not in cfg, cfg
    gen_case("bf16-dtype", "bf16-dtype", m.float(), [BOS, 9, 300, 301], 16, extra=("--dtype", "float32"))
    cases.append({"group": "bf16-dtype", "kind": "info", "argv": ["model", "info", "bf16-dtype", "--dtype", "auto"],
                  "want_json": {"dtype": "bf16"}})

    # 3. tie_word_embeddings absent, as configs written before transformers 4.x kept defaults out: GPT-2
    #    ties by default (no lm_head in the file), Llama does not.
    d = path("gpt2-tie-absent")
    g = seeded(GPT2LMHeadModel(GPT2Config(vocab_size=V, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                          bos_token_id=BOS, eos_token_id=EOS)), 13)
    g.save_pretrained(d)
    p = os.path.join(d, "config.json")
    cfg = json.load(open(p))
    cfg.pop("tie_word_embeddings", None)
    json.dump(cfg, open(p, "w"), indent=2)
    g2 = GPT2LMHeadModel.from_pretrained(d).eval()
    assert g2.lm_head.weight.data_ptr() == g2.transformer.wte.weight.data_ptr()
    gen_case("tie-absent", "gpt2-tie-absent", g2, [BOS, 50, 60], 16)
    d = path("llama-tie-absent")
    m = llama(14)
    m.save_pretrained(d)
    p = os.path.join(d, "config.json")
    cfg = json.load(open(p))
    cfg.pop("tie_word_embeddings")
    json.dump(cfg, open(p, "w"), indent=2)
    m2 = LlamaForCausalLM.from_pretrained(d).eval()
    gen_case("tie-absent", "llama-tie-absent", m2, [BOS, 50, 60], 16)

    # 4. generation_config.json without eos_token_id: transformers ends only on length, though config.json
    #    names an eos the model produces early.
    d = path("gen-no-eos")
    m = llama(15)
    first = greedy(m, [BOS, 20, 21], 8, eos_token_id=None)
    m.config.eos_token_id = first[2]
    m.generation_config = GenerationConfig(max_new_tokens=10)
    m.save_pretrained(d)
    assert "eos_token_id" not in json.load(open(os.path.join(d, "generation_config.json")))
    m2 = LlamaForCausalLM.from_pretrained(d).eval()
    cases.append({"group": "gen-no-eos", "kind": "generate", "argv": ["generate", "gen-no-eos", "--ids",
                                                                      "%d,20,21" % BOS],
                  "want_ids": m2.generate(torch.tensor([[BOS, 20, 21]]), do_sample=False)[0, 3:].tolist()})
    assert len(cases[-1]["want_ids"]) == 10 and first[2] in cases[-1]["want_ids"], cases[-1]

    # 5. tokenizer.json alone (no tokenizer_config.json, so no special tokens for the template), with
    #    chat_template.jinja beside it
    d = path("tok-no-config")
    m = llama(16)
    m.save_pretrained(d)
    tok = PreTrainedTokenizerFast(tokenizer_object=raw_tok)
    tok.chat_template = "{{ bos_token }}" + TEMPLATES["chatml_qwen2"]  # bos_token is undefined: ""

    tok.save_pretrained(d)
    os.remove(os.path.join(d, "tokenizer_config.json"))
    # truncation on with no limit: tokenizers writes usize::MAX, past int64
    from tokenizers import Tokenizer
    t = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    t.enable_truncation(max_length=2 ** 64 - 1)
    t.save(os.path.join(d, "tokenizer.json"))
    assert "18446744073709551615" in open(os.path.join(d, "tokenizer.json")).read()
    tok = PreTrainedTokenizerFast.from_pretrained(d)
    render_cases("tok-no-config", "tok-no-config", tok)
    prompt_case("tok-no-config", "tok-no-config", m, tok, "A journey of a thousand", 10)

    # 6. added tokens with each flag: special and not, normalized and not, lstrip/rstrip, single_word
    d = path("added-tokens")
    tok = fast()
    tok.add_special_tokens({"extra_special_tokens": [AddedToken("<|tool|>", special=True, normalized=False),
                                                     AddedToken("<|end|>", special=True, rstrip=True)]})
    tok.add_tokens([AddedToken("[[ent]]", special=False, normalized=True),
                    AddedToken("<sep>", special=False, normalized=False, lstrip=True),
                    AddedToken("fox", special=False, normalized=False, single_word=True)])
    tok.save_pretrained(d)
    tok = PreTrainedTokenizerFast.from_pretrained(d)
    m = llama(17, vocab_size=len(tok))
    m.save_pretrained(d)
    for text in ["<|tool|>the quick brown fox<|end|>  jumps", "a [[ent]] b <sep> c   <sep>d", "foxes fox afox fox.",
                 "<s>Once upon<|end|>\n<|tool|>"]:
        ids = tok(text)["input_ids"]
        cases.append({"group": "added-tokens", "kind": "tokenize", "argv": ["tokenize", "added-tokens", text],
                      "want": ",".join(map(str, ids))})
        for skip in (False, True):
            cases.append({"group": "added-tokens", "kind": "detokenize",
                          "argv": ["detokenize", "added-tokens", ",".join(map(str, ids))] +
                                  (["--skip-special"] if skip else []),
                          "want": tok.decode(ids, skip_special_tokens=skip)})
    prompt_case("added-tokens", "added-tokens", m, tok, "<|tool|>the quick [[ent]] <sep> fox", 10)

    # 7. chat templates: tokenizer_config.json's list of {name, template} (save_jinja_files=False writes it)
    templates = {"default": TEMPLATES["chatml_qwen2"], "tool_use": TEMPLATES["llama3"],
                 "rag": TEMPLATES["zephyr"]}
    d = path("chat-list")
    m = llama(18)
    m.save_pretrained(d)
    tok = fast()
    tok.chat_template = dict(templates)
    tok.save_pretrained(d, save_jinja_files=False)
    assert isinstance(json.load(open(os.path.join(d, "tokenizer_config.json")))["chat_template"], list)
    tok = PreTrainedTokenizerFast.from_pretrained(d)
    render_cases("chat-list", "chat-list", tok, names=(None, "default", "tool_use", "rag", "nosuch"))
    chat_case("chat-list", "chat-list", m, tok, ["the quick brown fox"], 8, template="tool_use")

    #    v5's files: chat_template.jinja and additional_chat_templates/NAME.jinja
    d = path("chat-multi")
    m.save_pretrained(d)
    tok = fast()
    tok.chat_template = dict(templates)
    tok.save_pretrained(d)
    assert os.path.exists(os.path.join(d, "additional_chat_templates", "tool_use.jinja")), os.listdir(d)
    tok = PreTrainedTokenizerFast.from_pretrained(d)
    render_cases("chat-multi", "chat-multi", tok, names=(None, "default", "tool_use", "rag", "nosuch"))

    #    named templates and no default: transformers refuses to choose
    d = path("chat-no-default")
    tok = fast()
    tok.chat_template = {"tool_use": templates["tool_use"], "rag": templates["rag"]}
    tok.save_pretrained(d)
    tok = PreTrainedTokenizerFast.from_pretrained(d)
    render_cases("chat-no-default", "chat-no-default", tok, names=(None, "rag"), convs=CONVS[:1])

    #    tokenizer_config.json's string and chat_template.jinja both: the file wins
    d = path("chat-jinja-wins")
    tok = fast()
    tok.chat_template = templates["rag"]
    tok.save_pretrained(d, save_jinja_files=False)
    with open(os.path.join(d, "chat_template.jinja"), "w") as f:
        f.write(templates["default"])
    tok = PreTrainedTokenizerFast.from_pretrained(d)
    assert tok.chat_template == templates["default"]
    render_cases("chat-jinja-wins", "chat-jinja-wins", tok, convs=CONVS[:1])

    #    a processor's chat_template.json ({"chat_template": ...}, what ProcessorMixin.save_pretrained
    #    writes with save_jinja_files=False; the tokenizer has none of its own): rendered as transformers
    #    renders that template
    d = path("chat-json")
    tok = fast()
    tok.save_pretrained(d)
    with open(os.path.join(d, "chat_template.json"), "w") as f:
        f.write(json.dumps({"chat_template": templates["tool_use"]}, indent=2, sort_keys=True) + "\n")
    tok = PreTrainedTokenizerFast.from_pretrained(d)
    assert tok.chat_template is None
    render_cases("chat-json", "chat-json", tok, template_text=templates["tool_use"])

    # 8. bos/eos ids outside the vocabulary (a tiny random checkpoint's defaults): transformers warns and
    #    generates; the eos can never come, so generation ends on length
    d = path("eos-oov")
    m = llama(19, bos_token_id=V + 5, eos_token_id=[V + 6, V + 7])
    m.save_pretrained(d)
    m2 = LlamaForCausalLM.from_pretrained(d).eval()
    cases.append({"group": "eos-oov", "kind": "generate", "argv": ["generate", "eos-oov", "--ids", "40,50,60"],
                  "want_ids": m2.generate(torch.tensor([[40, 50, 60]]), do_sample=False)[0, 3:].tolist(),
                  "want_stderr": "eos_token_id[0] %d is outside the vocabulary [0, %d)" % (V + 6, V)})
    cases.append({"group": "eos-oov", "kind": "generate", "argv": ["generate", "eos-oov", "--ids", "40,50,60",
                                                                   "--num-beams", "3", "--max-new-tokens", "8"],
                  "want_ids": m2.generate(torch.tensor([[40, 50, 60]]), do_sample=False, num_beams=3,
                                          max_new_tokens=8)[0, 3:].tolist()})

    # 9. 34 layers (239 linear weights: past every growth step of the quantised-weight table), three
    #    prompts at once and 124 new tokens in 8-token KV blocks (17 to 18 blocks a sequence, past the
    #    16 a sequence's table starts with; 52 in the pool, which starts at 8 and doubles);
    #    quantised to int8 and fp8, against transformers on the weights quantised and dequantised here.
    d = path("deep")
    m = llama(20, layers=34, hidden=32, bos_token_id=None, eos_token_id=None, max_position_embeddings=192)
    m.generation_config = GenerationConfig()
    m.save_pretrained(d)
    prompts = [[BOS, 50, 60, 70, 80], [BOS, 300, 301, 302, 303, 304, 305, 306, 307], [BOS] + list(range(100, 112))]
    N = 124
    argv = ["generate", "deep", "--max-new-tokens", str(N), "--kv-block-size", "8", "--json"]
    for p in prompts:
        argv += ["--ids", ",".join(map(str, p))]

    def fake_quant(w, kind):
        w = w.float()
        amax = w.abs().amax(dim=1, keepdim=True)
        s = torch.where((amax > 0) & torch.isfinite(amax), amax / (127.0 if kind == "int8" else 448.0),
                        torch.ones_like(amax))
        y = w / s
        q = torch.round(y).clamp(-127, 127) if kind == "int8" else y.to(torch.float8_e4m3fn).float()
        return q * s

    for kind in (None, "int8", "fp8"):
        mq = llama(20, layers=34, hidden=32, bos_token_id=None, eos_token_id=None, max_position_embeddings=192)
        mq.generation_config = GenerationConfig()
        if kind:
            with torch.no_grad():
                for n, mod in mq.named_modules():
                    if isinstance(mod, torch.nn.Linear):
                        mod.weight.copy_(fake_quant(mod.weight, kind))
        cases.append({"group": "deep" if not kind else "deep-" + kind, "kind": "generate-batch",
                      "argv": argv + (["--quant", kind] if kind else []),
                      "want_ids": [greedy(mq, p, N) for p in prompts]})

    json.dump({"cases": cases}, open(os.path.join(out, "expect.json"), "w"), indent=1)
    groups = sorted({c["group"] for c in cases})
    print("wrote %d cases in %d groups: %s" % (len(cases), len(groups), " ".join(groups)))


# ---- check (plain python3: runs tk) --------------------------------------------------------------

def check(tk, out, group):
    cases = [c for c in json.load(open(os.path.join(out, "expect.json")))["cases"] if c["group"] == group]
    bad = 0
    for c in cases:
        argv = list(c["argv"])
        argv[1 if argv[0] != "model" else 2] = os.path.join(out, argv[1 if argv[0] != "model" else 2])
        json_out = c["kind"] in ("generate", "chat", "info", "generate-batch")
        cmd = [tk] + (["--json"] if json_out and "--json" not in argv else []) + argv
        r = subprocess.run(cmd, input=c.get("stdin", ""), capture_output=True, text=True)
        what = " ".join(c["argv"])
        err = None
        try:
            if "want_rc" in c:
                if r.returncode != c["want_rc"] or c["want_error"] not in r.stderr:
                    err = "want exit %d and '%s'; got %d: %s" % (c["want_rc"], c["want_error"], r.returncode,
                                                                 r.stderr.strip()[-400:])
            elif r.returncode != 0:
                err = "exit %d: %s" % (r.returncode, (r.stderr.strip() or r.stdout.strip())[-600:])
            elif c.get("want_stderr") and c["want_stderr"] not in r.stderr:
                err = "stderr lacks '%s': %s" % (c["want_stderr"], r.stderr.strip()[-400:])
            elif c["kind"] == "top":
                rows = [l.split(None, 2) for l in r.stdout.splitlines()[2:]]
                got = [[int(x[0]), json.loads(x[2].rsplit(" (", 1)[0])] for x in rows if len(x) == 3]
                if got != [[i, json.loads(t)] for i, t in c["want"]]:
                    err = "top ids and texts %s, transformers %s" % (got, c["want"])
            elif c["kind"] in ("render", "tokenize", "detokenize"):
                got = r.stdout if c["kind"] == "render" else r.stdout.rstrip("\n")
                if got != c["want"]:
                    err = "tk %r, transformers %r" % (got, c["want"])
            elif c["kind"] == "info":
                d = json.loads(r.stdout)
                for k, v in c["want_json"].items():
                    if d.get(k) != v:
                        err = "%s is %r, want %r" % (k, d.get(k), v)
            else:
                lines = [json.loads(l) for l in r.stdout.splitlines() if l.strip()]
                if c["kind"] == "generate":
                    got = lines[0]["ids"]
                    if got == c["want_ids"] and "want_text" in c and lines[0]["text"] != c["want_text"]:
                        err = "text %r, transformers %r" % (lines[0]["text"], c["want_text"])
                elif c["kind"] == "generate-batch":
                    got = [x["ids"] for x in lines[0]]
                else:
                    got = [x["ids"] for x in lines]
                if got != c["want_ids"]:
                    err = "ids %s, transformers %s" % (got, c["want_ids"])
        except (ValueError, KeyError, IndexError, TypeError) as e:  # output tk should not print
            err = "unreadable output (%s): %s" % (e, (r.stdout or r.stderr)[-300:])
        if err:
            bad += 1
            print("  %s: %s" % (what, err))
    print("%s: %d cases, %d differ" % (group, len(cases), bad))
    return 1 if bad or not cases else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        make(sys.argv[2])
    elif len(sys.argv) == 5 and sys.argv[1] == "check":
        sys.exit(check(sys.argv[2], sys.argv[3], sys.argv[4]))
    else:
        sys.exit(__doc__)
