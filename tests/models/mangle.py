#!/usr/bin/env python3
"""Bad checkpoints for tk's model tests, with the standard library only (no torch needed).

    mangle.py base DIR          writes a small valid LlamaForCausalLM checkpoint (random f32 weights)
    mangle.py KIND SRC DST      copies checkpoint SRC to DST and breaks it one way:

  truncated       model.safetensors cut in the middle of its data
  past_end        a tensor's data_offsets run past the end of the file
  overlap         two tensors share bytes
  size_mismatch   a tensor's shape x dtype disagrees with its data_offsets
  header_len      the 8-byte header length is larger than the file
  bad_json        the header is not JSON
  dtype_config    config.json says bfloat16, the tensors are F32
  missing_tensor  model.layers.1.mlp.down_proj.weight removed
  wrong_shape     model.norm.weight has the wrong length
  unknown_arch    architectures = ["FalconForCausalLM"]
  bad_act         hidden_act = "relu"
  bad_rope        rope_parameters.rope_type = "proportional"
  shard_escape    a sharded index naming "../model.safetensors"
"""
import json
import os
import random
import shutil
import struct
import sys

CFG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64, "hidden_size": 32,
       "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
       "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False,
       "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "dtype": "float32"}


def shapes():
    c = CFG
    H, I, V, D = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["hidden_size"] // 4
    t = {"model.embed_tokens.weight": [V, H], "model.norm.weight": [H], "lm_head.weight": [V, H]}
    for l in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % l
        t.update({p + "input_layernorm.weight": [H], p + "post_attention_layernorm.weight": [H],
                  p + "self_attn.q_proj.weight": [4 * D, H], p + "self_attn.k_proj.weight": [2 * D, H],
                  p + "self_attn.v_proj.weight": [2 * D, H], p + "self_attn.o_proj.weight": [H, 4 * D],
                  p + "mlp.gate_proj.weight": [I, H], p + "mlp.up_proj.weight": [I, H],
                  p + "mlp.down_proj.weight": [H, I]})
    return t


def write_st(path, header, data):
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def read_st(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:]


def base(d):
    os.makedirs(d, exist_ok=True)
    rnd = random.Random(0)
    header, data = {"__metadata__": {"format": "pt"}}, b""
    for name, shp in sorted(shapes().items()):
        n = 1
        for s in shp:
            n *= s
        vals = [1.0 + 0.1 * rnd.gauss(0, 1) if name.endswith("norm.weight") else 0.2 * rnd.gauss(0, 1)
                for _ in range(n)]
        blob = struct.pack("<%df" % n, *vals)
        header[name] = {"dtype": "F32", "shape": shp, "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    write_st(os.path.join(d, "model.safetensors"), header, data)
    json.dump(CFG, open(os.path.join(d, "config.json"), "w"), indent=2)


def mangle(kind, src, dst):
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    st, cfgp = os.path.join(dst, "model.safetensors"), os.path.join(dst, "config.json")
    cfg = json.load(open(cfgp))
    header, data = read_st(st)
    if kind == "truncated":
        b = open(st, "rb").read()
        open(st, "wb").write(b[:len(b) - len(data) // 2])
    elif kind == "past_end":
        header["model.norm.weight"]["data_offsets"] = [len(data) - 64, len(data) + 64]
        write_st(st, header, data)
    elif kind == "overlap":
        a, b = header["model.layers.0.input_layernorm.weight"], header["model.layers.0.post_attention_layernorm.weight"]
        b["data_offsets"] = [a["data_offsets"][0] + 4, a["data_offsets"][1] + 4]
        write_st(st, header, data)
    elif kind == "size_mismatch":
        header["model.norm.weight"]["shape"] = [header["model.norm.weight"]["shape"][0] + 1]
        write_st(st, header, data)
    elif kind == "header_len":
        b = bytearray(open(st, "rb").read())
        b[:8] = struct.pack("<Q", len(b) + 100)
        open(st, "wb").write(bytes(b))
    elif kind == "bad_json":
        b = bytearray(open(st, "rb").read())
        b[9:14] = b"nope!"
        open(st, "wb").write(bytes(b))
    elif kind == "dtype_config":
        cfg["dtype"] = "bfloat16"
    elif kind == "missing_tensor":
        del header["model.layers.1.mlp.down_proj.weight"]
        write_st(st, header, data)
    elif kind == "wrong_shape":
        header["model.norm.weight"]["shape"] = [8, 4]
        write_st(st, header, data)
    elif kind == "unknown_arch":
        cfg["architectures"] = ["FalconForCausalLM"]
    elif kind == "bad_act":
        cfg["hidden_act"] = "relu"
    elif kind == "bad_rope":
        cfg["rope_parameters"]["rope_type"] = "proportional"
    elif kind == "shard_escape":
        os.remove(st)
        idx = {"metadata": {}, "weight_map": {k: "../model.safetensors" for k in header if k != "__metadata__"}}
        json.dump(idx, open(os.path.join(dst, "model.safetensors.index.json"), "w"))
    else:
        sys.exit("unknown kind " + kind)
    json.dump(cfg, open(cfgp, "w"), indent=2)


if __name__ == "__main__":
    if sys.argv[1] == "base":
        base(sys.argv[2])
    else:
        mangle(sys.argv[1], sys.argv[2], sys.argv[3])
