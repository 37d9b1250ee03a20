#!/usr/bin/env python3
"""The PyTorch side of tk's training parity test (tests/test_train.c), after llm.c's test_gpt2: builds
tiny seeded models with transformers, saves them with save_pretrained, runs 10 training steps with
torch.optim.AdamW exactly as tk trains, and dumps everything the C test compares.

    train_oracle.py OUT
    train_oracle.py cli OUT GPT2_DIR    the checkpoints tests/cli/train.sh needs (below)

For each model NAME in {llama, gpt2, bert} it writes
  OUT/NAME/                     the checkpoint (f32), as save_pretrained writes it
  OUT/NAME-flipped/             the same with one weight's sign flipped (the control that must fail)
  OUT/NAME.oracle.safetensors   the batches and results:
      lens                  i64 [nseq]      tokens of each sequence (packed in tk's order)
      ids.K, targets.K      i32 / i64 [T]   step K's batch (K = 0..9): causal LMs predict ids shifted by
                                            one (-100 at each sequence's end); BERT the masked positions
      logits                f32 [T, V]      step 0's logits (real tokens only, packed)
      loss, grad_norm, lr   f32 [10]        each step's mean loss, clip_grad_norm_'s norm, the lr used
      grad.NAME             f32             step 0's gradient of every named parameter
      param.NAME            f32             every parameter after the 10 steps
      gmax.NAME             f32             each element's largest |gradient| over the 10 steps

The recipe (tk's defaults in tk_train_opts, written out): AdamW(lr 3e-3, betas (0.9, 0.95), eps 1e-8,
weight_decay 0.1) with two groups: no decay for 1-D parameters (norms, biases) and nn.Embedding tables;
clip_grad_norm_(1.0); transformers' get_cosine_schedule_with_warmup(2 warmup, 10 total). Dropout 0,
eager attention, float32, TF32 off, model.train(). Llama has GQA (4 heads, 2 kv heads), untied
embeddings and a varlen batch (HF pads on the right with an attention mask; tk packs). GPT-2 and BERT
tie their embeddings. Seeds are fixed: the same script writes the same bytes.
"""
import os
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import (BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                          get_cosine_schedule_with_warmup)

OUT = sys.argv[-1] if len(sys.argv) == 2 else None
V = 96
STEPS = 10
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


def init(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            is_norm = p.dim() == 1 and n.endswith("weight") and ("norm" in n.lower() or ".ln_" in n)
            p.copy_(1.0 + 0.1 * r if is_norm else 0.1 * r)


def groups(model):
    emb = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    decay, no = [], []
    for _, p in model.named_parameters():
        (no if p.dim() < 2 or id(p) in emb else decay).append(p)
    return [{"params": decay, "weight_decay": 0.1}, {"params": no, "weight_decay": 0.0}]


def batches(kind, lens, seed):
    """STEPS batches: (ids [nseq, S] padded with 0, labels [nseq, S] -100 where nothing is predicted)."""
    g = torch.Generator().manual_seed(seed)
    S, out = max(lens), []
    for _ in range(STEPS):
        ids = torch.randint(1, V, (len(lens), S), generator=g)
        labels = ids.clone()
        for s, n in enumerate(lens):
            ids[s, n:] = 0
            labels[s, n:] = -100
        if kind == "mlm":
            mask = torch.rand(len(lens), S, generator=g) < 0.3
            mask[:, 0] = True  # at least one masked position per sequence
            labels[~mask] = -100
            ids = ids.masked_fill(mask, 3)  # the [MASK] token of this tiny vocabulary
            for s, n in enumerate(lens):
                labels[s, n:] = -100
        out.append((ids, labels))
    return out


def pack(x, lens):
    return torch.cat([x[s, :n] for s, n in enumerate(lens)])


def tk_targets(kind, labels, lens):
    """What tk predicts at each packed position: the next token (causal) or the label (MLM)."""
    rows = []
    for s, n in enumerate(lens):
        lab = labels[s, :n]
        rows.append(torch.cat([lab[1:], torch.tensor([-100])]) if kind == "causal" else lab)
    return torch.cat(rows).to(torch.int64)


def run(name, model, kind, lens, seed):
    init(model, seed)
    model.train()
    d = os.path.join(OUT, name)
    shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(d)
    # the control: one weight of the saved checkpoint with its sign flipped
    f = os.path.join(OUT, name + "-flipped")
    shutil.rmtree(f, ignore_errors=True)
    shutil.copytree(d, f)
    sd = load_file(os.path.join(f, "model.safetensors"))
    key = sorted(k for k in sd if k.endswith("weight") and sd[k].dim() == 2 and ".0." in k)[0]
    sd[key] = sd[key].clone()
    sd[key][0, 0] = -sd[key][0, 0]
    save_file(sd, os.path.join(f, "model.safetensors"), metadata={"format": "pt"})

    data = batches(kind, lens, seed + 100)
    opt = torch.optim.AdamW(groups(model), lr=3e-3, betas=(0.9, 0.95), eps=1e-8)
    sched = get_cosine_schedule_with_warmup(opt, 2, STEPS)
    dump = {"lens": torch.tensor(lens, dtype=torch.int64)}
    losses, norms, lrs = [], [], []
    gmax = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    for step, (ids, labels) in enumerate(data):
        dump["ids.%d" % step] = pack(ids, lens).to(torch.int32)
        dump["targets.%d" % step] = tk_targets(kind, labels, lens)
        att = torch.zeros_like(ids)
        for s, n in enumerate(lens):
            att[s, :n] = 1
        opt.zero_grad()
        out = model(input_ids=ids, attention_mask=att, labels=labels)
        out.loss.backward()
        if step == 0:
            dump["logits"] = pack(out.logits.detach(), lens).float().contiguous()
            for n, p in model.named_parameters():
                dump["grad." + n] = p.grad.detach().clone().contiguous()
        for n, p in model.named_parameters():
            gmax[n] = torch.maximum(gmax[n], p.grad.detach().abs())
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)))
        lrs.append(sched.get_last_lr()[0])
        losses.append(float(out.loss.detach()))
        opt.step()
        sched.step()
    for n, p in model.named_parameters():
        dump["param." + n] = p.detach().clone().contiguous()
        dump["gmax." + n] = gmax[n].contiguous()
    dump["loss"] = torch.tensor(losses, dtype=torch.float32)
    dump["grad_norm"] = torch.tensor(norms, dtype=torch.float32)
    dump["lr"] = torch.tensor(lrs, dtype=torch.float32)
    save_file(dump, os.path.join(OUT, name + ".oracle.safetensors"), metadata={"flipped": key})
    print("%s: loss %.6f -> %.6f, grad norms %.3f .. %.3f (clipping at 1.0), flipped %s" % (
        name, losses[0], losses[-1], max(norms), min(norms), key))


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                         rms_norm_eps=1e-5, tie_word_embeddings=False, attention_dropout=0.0,
                                         attn_implementation="eager"))
    run("llama", llama, "causal", [12, 7], 1)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=32, resid_pdrop=0.0,
                                      embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                                      attn_implementation="eager"))
    run("gpt2", gpt2, "causal", [10, 10], 2)
    bert = BertForMaskedLM(BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                                      attention_probs_dropout_prob=0.0, attn_implementation="eager"))
    run("bert", bert, "mlm", [9, 6], 3)


def cli(out, gpt2_dir):
    """For tests/cli/train.sh: OUT/bert-mlm (a tiny BertForMaskedLM with a WordPiece tokenizer trained
    here: [PAD] [UNK] [CLS] [SEP] [MASK], BERT's post-processor), and copies of GPT2_DIR (a checkpoint
    with its tokenizer.json) broken one way each: gpt2-nan (a NaN weight), gpt2-overflow (a layer-1 MLP
    weight of 3e38: finite, but the product overflows to inf), gpt2-notok (no tokenizer.json)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    words = ("the quick brown fox jumps over the lazy dog a journey of a thousand miles begins with a single "
             "step once upon a time there was a little model").split()
    g = torch.Generator().manual_seed(5)
    text = [" ".join(words[int(i)] for i in torch.randint(0, len(words), (12,), generator=g)) for _ in range(200)]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(text, trainers.WordPieceTrainer(vocab_size=120, special_tokens=[
        "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
                                                       special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    d = os.path.join(out, "bert-mlm")
    bert = BertForMaskedLM(BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2,
                                      num_attention_heads=4, intermediate_size=64, max_position_embeddings=64,
                                      pad_token_id=0))
    init(bert, 11)
    bert.save_pretrained(d)
    tok.save(os.path.join(d, "tokenizer.json"))
    for name, how in (("gpt2-nan", "nan"), ("gpt2-overflow", "big"), ("gpt2-notok", "notok")):
        dst = os.path.join(out, name)
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(gpt2_dir, dst)
        if how == "notok":
            os.remove(os.path.join(dst, "tokenizer.json"))
            continue
        f = os.path.join(dst, "model.safetensors")
        sd = load_file(f)
        k = "transformer.h.1.mlp.c_fc.weight" if how == "big" else "transformer.h.0.attn.c_proj.weight"
        sd[k] = sd[k].clone()
        if how == "nan":
            sd[k][3, 5] = float("nan")
        else:
            sd[k][:, :] = 3e38
        save_file(sd, f, metadata={"format": "pt"})
    print("ok")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "cli":
        cli(sys.argv[2], sys.argv[3])
    else:
        main()
