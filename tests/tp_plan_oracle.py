"""tk's tensor-parallel plan (models/tp_plan.c) against transformers' own.

    tp_plan_oracle.py TEST_TP_PLAN WORKDIR

Saves tiny Llama (GQA), Qwen2 (bf16, biases) and GPT-2 checkpoints with save_pretrained, runs
`TEST_TP_PLAN --dump DIR N [PLAN]` on them, and checks every tensor's style, split dimension and each
rank's bytes against what transformers computes with its own functions: the model's `tp_plan`
property (the default plan, completed as from_pretrained completes it), `_get_parameter_plan` (name
matching), each style's `shard_param` (the DTensor placement it gives, on a 1-rank gloo mesh), and
DtensorShardOperation's interval computations (shard-on-read: which rows rank r of N reads), then
slicing the torch tensor. GPT-2's Conv1D layers, which transformers' styles refuse, are sliced by hand.
Errors are compared too: heads that do not divide (transformers' get_kv_heads_per_rank says None),
an unknown style (transformers raises naming it), a rule that matches nothing (both warn).
Prints one "ok NAME" or "FAIL NAME: why" line per check and exits 1 on a failure.
"""
import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import transformers as T  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from transformers.distributed.parallel_utils import ALL_PARALLEL_STYLES, _get_parameter_plan  # noqa: E402
from transformers.distributed.sharding_utils import DtensorShardOperation  # noqa: E402
from transformers.distributed import tensor_parallel as TP  # noqa: E402,F401  (registers the styles)

TEST, WORK = sys.argv[1], sys.argv[2]
failed = 0


def report(name, ok, why=""):
    global failed
    print(f"ok {name}" if ok else f"FAIL {name}: {why}", flush=True)
    failed += not ok


def tk_dump(d, n, plan=None):
    args = [TEST, "--dump", d, str(n)] + ([plan] if plan else [])
    p = subprocess.run(args, capture_output=True, text=True)
    return p.returncode, json.loads(p.stdout)


def digest(t):
    t = t.contiguous()
    return hashlib.sha256(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"").hexdigest()


def slice_by_intervals(t, dim, intervals):
    if not intervals:
        shape = list(t.shape)
        shape[dim] = 0
        return t.new_empty(shape)
    return torch.cat([t.narrow(dim, a, b - a) for a, b in intervals], dim=dim)


dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
MESH = init_device_mesh("cpu", (1,))


def placement_of(model, name, style):
    """The placement transformers' style gives parameter `name` (its shard_param on a 1-rank mesh)."""
    mod_name, _, pname = name.rpartition(".")
    mod = model.get_submodule(mod_name)
    ALL_PARALLEL_STYLES[style].shard_param(mod, pname, MESH)
    p = mod._parameters[pname]
    return p.placements[0] if hasattr(p, "placements") else None


def oracle_rank(t, placement, r, n):
    """Rank r's slice, as transformers' shard-on-read computes it."""
    if placement is None or placement.is_replicate():
        return t
    dim = placement.dim if placement.dim >= 0 else t.ndim + placement.dim
    iv = [(0, t.shape[dim])]
    if placement.is_shard() and type(placement).__name__ == "Shard":
        iv = DtensorShardOperation._compute_contiguous_slice(None, iv, r, n)
    else:
        iv = DtensorShardOperation._compute_strided_slice(None, iv, r, n, placement.split_factor)
    return slice_by_intervals(t, dim, iv), dim


def compare(case, model, d, n, plan, plan_file=None, expect_rules=None):
    rc, got = tk_dump(d, n, plan_file)
    if rc != 0:
        report(case, False, got.get("error"))
        return got
    if expect_rules is not None:
        rules = {k: (v if isinstance(v, str) else v["style"]) for k, v in got["rules"].items()}
        report(f"{case} rules", rules == expect_rules, f"tk {rules} != transformers {expect_rules}")
    sd = load_file(os.path.join(d, "model.safetensors"))
    bad = []
    for e in got["tensors"]:
        name, t = e["name"], sd[e["name"]]
        style = _get_parameter_plan(name, plan, is_weight=True)
        if (style or "replicate") != e["style"]:
            bad.append(f"{name}: style tk {e['style']} transformers {style}")
            continue
        pl = placement_of(model, name, style) if style else None
        for r in range(n):
            res = oracle_rank(t, pl, r, n)
            want, wdim = (res, -1) if not isinstance(res, tuple) else res
            if wdim != e["dim"] and not (wdim == -1 and e["dim"] == -1):
                bad.append(f"{name}: dim tk {e['dim']} transformers {wdim}")
                break
            mine = e["ranks"][r]
            if mine["shape"] != list(want.shape) or mine["sha256"] != digest(want):
                bad.append(f"{name} rank {r}: tk shape {mine['shape']}, transformers {list(want.shape)}"
                           f"{'' if mine['shape'] != list(want.shape) else ' (bytes differ)'}")
    report(f"{case} slices ({len(got['tensors'])} tensors x {n} ranks)", not bad, "; ".join(bad[:5]))
    return got


def save(model, name):
    d = os.path.join(WORK, name)
    model.save_pretrained(d)
    return d


torch.manual_seed(0)
# ---- Llama with GQA (12 heads, 6 kv heads), the default plan, 2 and 3 ranks; uneven MLP and vocab ----
lcfg = T.LlamaConfig(hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=12,
                     num_key_value_heads=6, vocab_size=100, max_position_embeddings=64)
llama = T.LlamaForCausalLM(lcfg)
dl = save(llama, "llama")
for n in (2, 3):
    compare(f"llama default plan tp={n}", T.LlamaForCausalLM(lcfg), dl, n, llama.tp_plan, expect_rules=llama.tp_plan)
rc, got = tk_dump(dl, 4)
want_none = TP.get_kv_heads_per_rank(llama.tp_plan, 6, 4) is None
report("llama tp=4: kv heads 6 do not divide (transformers: None)",
       rc == 1 and want_none and "num_key_value_heads 6 is not divisible by the tensor-parallel size 4" in got["error"],
       got.get("error"))

# ---- Qwen2: bf16, q/k/v biases, tied embeddings ----
qcfg = T.Qwen2Config(hidden_size=32, intermediate_size=56, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=90, tie_word_embeddings=True, max_position_embeddings=64)
qwen = T.Qwen2ForCausalLM(qcfg).to(torch.bfloat16)
dq = save(qwen, "qwen2")
got = compare("qwen2 bf16 default plan tp=2", T.Qwen2ForCausalLM(qcfg).to(torch.bfloat16), dq, 2, qwen.tp_plan,
              expect_rules=qwen.tp_plan)
report("qwen2 tied: no warning for lm_head", not got.get("warnings"), got.get("warnings"))
rc, got = tk_dump(dq, 3)
report("qwen2 tp=3: 4 heads do not divide (transformers: None)",
       rc == 1 and TP.get_kv_heads_per_rank(qwen.tp_plan, 4, 3) is None
       and "num_attention_heads 4 is not divisible by the tensor-parallel size 3" in got["error"], got.get("error"))

# ---- a custom plan file (full names, as model.tp_plan shows them) over the Llama, 3 ranks ----
custom = {
    "model.embed_tokens": "embedding_colwise",
    "model.layers.*.self_attn.q_proj": "colwise",
    "model.layers.*.self_attn.k_proj": "colwise_rep",
    "model.layers.*.self_attn.v_proj": "colwise",
    "model.layers.*.self_attn.o_proj": "rowwise_split_input",
    "model.layers.*.mlp.up_proj": "packed_colwise",
    "model.layers.*.mlp.down_proj": "packed_rowwise",
    "model.layers.*.mlp.gate_proj.weight": "colwise",
    "model.layers.*.input_layernorm": "sequence_parallel",
    "lm_head": "colwise_gather_output",
    "model.layers.*.mlp.no_such_proj": "colwise",
}
pf = os.path.join(WORK, "custom_plan.json")
json.dump(custom, open(pf, "w"), indent=1)
got = compare("llama custom plan file tp=3", T.LlamaForCausalLM(lcfg), dl, 3, custom, pf, expect_rules=custom)
# transformers warns about the same rule (its _validate_parallel_plan)
records = []
h = logging.Handler()
h.emit = lambda rec: records.append(rec.getMessage())
lg = logging.getLogger("transformers.distributed.mixin")
lg.addHandler(h)
lg.setLevel(logging.WARNING)
T.LlamaForCausalLM(lcfg)._validate_parallel_plan(custom, ALL_PARALLEL_STYLES, "tp_plan")
tw = [m for m in records if "no_such_proj" in m]
kw = [w for w in got.get("warnings", []) if "no_such_proj" in w]
report("a rule that matches nothing: both warn", bool(tw) and len(kw) == 1 and len(got["warnings"]) == 1,
       f"transformers {records}, tk {got.get('warnings')}")

# an unknown style: transformers raises naming it, and so does tk
bad = dict(custom, **{"lm_head": "colwize"})
bf = os.path.join(WORK, "bad_plan.json")
json.dump(bad, open(bf, "w"))
try:
    T.LlamaForCausalLM(lcfg).tp_plan = bad
    terr = ""
except ValueError as e:
    terr = str(e)
rc, got = tk_dump(dl, 2, bf)
report("unknown style: both name it", "colwize" in terr and rc == 1 and "'colwize' (rule 'lm_head')" in got["error"]
       and "Supported styles are" in got["error"], f"transformers '{terr}', tk '{got.get('error')}'")
report("tk knows transformers' styles", sorted(ALL_PARALLEL_STYLES._global_mapping) ==
       sorted(s.split("'")[0] for s in got["error"].split("Supported styles are ")[1].split(", ")),
       f"transformers {sorted(ALL_PARALLEL_STYLES._global_mapping)}")

# config.json's own base_model_tp_plan wins over the class default
cj = os.path.join(dl, "config.json")
conf = json.load(open(cj))
conf["base_model_tp_plan"] = {"layers.*.mlp.gate_proj": "colwise", "layers.*.mlp.up_proj": "colwise",
                              "layers.*.mlp.down_proj": "rowwise"}
dl2 = os.path.join(WORK, "llama_cfgplan")
os.makedirs(dl2, exist_ok=True)
os.link(os.path.join(dl, "model.safetensors"), os.path.join(dl2, "model.safetensors"))
json.dump(conf, open(os.path.join(dl2, "config.json"), "w"))
m2 = T.LlamaForCausalLM.from_pretrained(dl2)
compare("config.json base_model_tp_plan tp=3", T.LlamaForCausalLM.from_pretrained(dl2), dl2, 3, m2.tp_plan,
        expect_rules=m2.tp_plan)

# ---- GPT-2: no plan in transformers; a custom one with Conv1D layouts, sliced by hand ----
gcfg = T.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=101, n_positions=64)
gpt2 = T.GPT2LMHeadModel(gcfg)
dg = save(gpt2, "gpt2")
rc, got = tk_dump(dg, 2)
report("gpt2 without a plan: unsupported, with a hint", rc == 1 and "has no tensor-parallel plan" in got["error"]
       and "--tp-plan" in got["error"] and not gpt2.tp_plan, got.get("error"))
gplan = {"transformer.wte": "embedding_rowwise",
         "transformer.h.*.attn.c_attn": {"style": "packed_colwise", "split": 3},
         "transformer.h.*.attn.c_proj": "rowwise", "transformer.h.*.mlp.c_fc": "colwise",
         "transformer.h.*.mlp.c_proj": "rowwise"}
gf = os.path.join(WORK, "gpt2_plan.json")
json.dump(gplan, open(gf, "w"))
rc, got = tk_dump(dg, 2, gf)
sd = load_file(os.path.join(dg, "model.safetensors"))
bad = []


def chunk(n, k, r):
    return list(torch.arange(n).chunk(k))[r] if r < len(torch.arange(n).chunk(k)) else torch.arange(0)


for e in got.get("tensors", []):
    t, name = sd[e["name"]], e["name"]
    leaf = name.rsplit(".", 1)[-1]
    for r in range(2):
        if ".c_attn." in name:  # [in, 3 out] (bias [3 out]): q|k|v blocks, each split by columns
            idx = torch.cat([b * (t.shape[-1] // 3) + chunk(t.shape[-1] // 3, 2, r) for b in range(3)])
            want = t.index_select(t.ndim - 1, idx)
        elif ".c_fc." in name:  # colwise on Conv1D: the output columns (bias too)
            want = t.index_select(t.ndim - 1, chunk(t.shape[-1], 2, r))
        elif ".c_proj." in name:  # rowwise: the input rows; the bias whole
            want = t if leaf == "bias" else t.index_select(0, chunk(t.shape[0], 2, r))
        elif name == "transformer.wte.weight":
            want = t.index_select(0, chunk(t.shape[0], 2, r))
        else:
            want = t
        if e["ranks"][r]["sha256"] != digest(want) or e["ranks"][r]["shape"] != list(want.shape):
            bad.append(f"{name} rank {r}: tk {e['ranks'][r]['shape']} want {list(want.shape)}")
report("gpt2 custom plan (Conv1D, packed q|k|v) tp=2, by hand", rc == 0 and not bad, got.get("error") or "; ".join(bad[:5]))

dist.destroy_process_group()
print(f"{'FAILED' if failed else 'all ok'}: {failed} failed")
sys.exit(1 if failed else 0)
