#!/usr/bin/env python3
"""Generates the golden fixtures in tests/fixtures/tokenizer/ with HuggingFace
`tokenizers`/`transformers` and jinja2 as the reference implementations.

  pip install tokenizers transformers jinja2 gguf
  python3 tools/tokenizer/gen_tokenizer_fixtures.py [--models-dir .cache/models]

Outputs (all small; the real model files stay in KILN_MODELS_DIR):
  smollm2_golden.json   ids for the SmolLM2 GGUF vocabulary (reference: the HF
                        SmolLM2 pipeline Digits + ByteLevel rebuilt from the GGUF
                        vocab/merges, cross-checked with transformers' GGUF loader)
  minilm_golden.json    ids/type ids for all-MiniLM-L6-v2 (BertWordPiece)
  trained/*.json        tiny BPE tokenizers trained here with the Llama-3, Qwen2
                        and SentencePiece-style pipelines, plus their golden ids
  chat_templates.json   real chat templates and their jinja2 renderings
"""
import argparse
import json
import os
import sys

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, Regex, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(REPO, "tests", "fixtures", "tokenizer")

CORPUS = [
    "Hello world",
    "Hello, world! How are you doing today?",
    " leading space",
    "trailing space ",
    "  two leading spaces and   three inside",
    "I'm sure they've said we'd go, but DON'T you're THEY'LL",
    "The year 2024 had 366 days; pi is 3.14159265358979 and 1,000,000 is a million.",
    "1234567890 00 007 12.5% $99.99",
    "你好，世界！今天天气很好。我们去公园散步吧。",
    "日本語のテキストです。カタカナとひらがな、漢字が混ざっています。",
    "한국어 텍스트도 있습니다.",
    "Привет, мир! Как дела?",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "Emoji: 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < 10; ++i) { printf(\"%d\\n\", i); }",
    "tabs\tand\ttabs\t\t\tend",
    "line one\nline two\r\nline three\n\n\nafter blank lines",
    "spaces before newline   \n   and after",
    "                                        many spaces",
    "ends with spaces and newline   \n",
    "\n\n\n",
    "   ",
    "a",
    "",
    "Ünïcödé àccénts: café naïve résumé Ångström",
    "Combining: e\u0301 a\u0300 n\u0303",
    "NBSP:\u00a0here, ideographic space:\u3000there, em space:\u2003x",
    "URLs: https://example.com/path?query=1&b=2#frag and emails a.b@c.de",
    "supercalifragilisticexpialidocious pneumonoultramicroscopicsilicovolcanoconiosis",
    "Mixed日本語and English123テスト",
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text <|im_end|> end",
    "<|im_start|><|im_start|>",
    "Math: ∑_{i=1}^{n} x_i² ≤ √(a+b) ± ∞ ≠ ∂f/∂x",
    "Quotes “curly” ‘single’ «guillemets» — em-dash – en-dash … ellipsis",
    "JSON: {\"key\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}",
    "HTML <div class=\"x\">&amp; &lt;tag&gt;</div>",
    "Zero\u200bwidth\u200cjoiner\u200dtest\ufeffbom",
    "x" * 300,
    "The quick brown fox jumps over the lazy dog. " * 8,
]

SMOL_SPECIAL_DECODE = [1, 4093, 198, 19556, 17, 2, 198]


def smollm2_reference(gguf_path):
    from gguf import GGUFReader

    r = GGUFReader(gguf_path)

    def field(name):
        return r.fields[name].contents()

    tokens = field("tokenizer.ggml.tokens")
    merges = field("tokenizer.ggml.merges")
    types = field("tokenizer.ggml.token_type")
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab, [tuple(m.split(" ", 1)) for m in merges],
                               fuse_unk=False, byte_fallback=False))
    # What HuggingFaceTB/SmolLM2's tokenizer.json does (llama.cpp's pre "smollm").
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    from tokenizers import AddedToken
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i in range(len(tokens)) if types[i] == 3])
    return tok, field("tokenizer.chat_template")


def golden(tok, texts, hf_check=None):
    cases = []
    for t in texts:
        ids = tok.encode(t, add_special_tokens=True).ids
        if hf_check is not None:
            other = hf_check(t)
            if other != ids:
                print("warning: transformers disagrees on", repr(t)[:60], file=sys.stderr)
        cases.append({
            "text": t,
            "ids": ids,
            "ids_no_special": tok.encode(t, add_special_tokens=False).ids,
            "decoded": tok.decode(ids, skip_special_tokens=False),
            "decoded_skip": tok.decode(ids, skip_special_tokens=True),
        })
    return cases


def gen_smollm2(models_dir):
    path = os.path.join(models_dir, "smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(path):
        print("skip smollm2: missing", path, file=sys.stderr)
        return
    tok, template = smollm2_reference(path)
    check = None
    try:
        from transformers import AutoTokenizer
        hf = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
        check = lambda t: hf(t).input_ids
    except Exception as e:  # the cross-check is optional
        print("transformers GGUF cross-check unavailable:", e, file=sys.stderr)
    out = {
        "source": "SmolLM2-135M-Instruct.Q4_1.gguf; HF tokenizers Digits+ByteLevel BPE",
        "cases": golden(tok, CORPUS, check),
        "decode_cases": [{"ids": SMOL_SPECIAL_DECODE,
                          "decoded": tok.decode(SMOL_SPECIAL_DECODE, skip_special_tokens=False),
                          "decoded_skip": tok.decode(SMOL_SPECIAL_DECODE, skip_special_tokens=True)}],
        "chat_template": template,
    }
    write("smollm2_golden.json", out)


def gen_minilm(models_dir):
    d = os.path.join(models_dir, "all-minilm-l6-v2")
    if not os.path.exists(os.path.join(d, "tokenizer.json")):
        print("skip minilm: missing", d, file=sys.stderr)
        return
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(d)
    cases = golden(tok, CORPUS + ["[CLS] already [SEP] has [MASK] specials [UNK]",
                                  "\u0130stanbul İİ ß ǅ ﬁ", "a\x00b\x07c\ufffdd"],
                   lambda t: hf(t).input_ids)
    pairs = []
    for a, b, max_len in [("What is a tokenizer?", "It splits text into tokens.", 0),
                          ("short", "a much longer second sentence that will be cut", 12),
                          ("a fairly long first sentence that gets truncated", "tiny", 10),
                          ("both sentences here are rather long ones", "and so is this second one indeed", 11),
                          ("你好世界", "こんにちは", 0)]:
        if max_len:
            tok.enable_truncation(max_len, strategy="longest_first")
        else:
            tok.no_truncation()
        e = tok.encode(a, b)
        ref = hf(a, b, truncation=bool(max_len), max_length=max_len or None)
        assert ref.input_ids == e.ids, (a, b)
        pairs.append({"a": a, "b": b, "max_length": max_len, "ids": e.ids,
                      "type_ids": e.type_ids, "attention_mask": e.attention_mask})
    tok.no_truncation()
    write("minilm_golden.json", {"source": "all-MiniLM-L6-v2 tokenizer.json (BertWordPiece)",
                                 "cases": cases, "pairs": pairs})


def train_bpe(pre, normalizer, decoder, vocab_size, byte_level, extra=None):
    model = models.BPE(byte_fallback=not byte_level, unk_token=None if byte_level else "<unk>",
                       fuse_unk=not byte_level, ignore_merges=byte_level)
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.decoder = decoder
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] if byte_level else ["<unk>", "<s>", "</s>"]
    alphabet = pre_tokenizers.ByteLevel.alphabet() if byte_level else []
    if not byte_level:
        special += ["<0x%02X>" % b for b in range(256)]
    kwargs = {} if byte_level else {"limit_alphabet": 200}
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special,
                                  initial_alphabet=alphabet, show_progress=False, **kwargs)
    tok.train_from_iterator(CORPUS * 3 + (extra or []), trainer)
    return tok


def gen_trained():
    os.makedirs(os.path.join(OUT, "trained"), exist_ok=True)
    llama3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    qwen2 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    specs = {
        "llama3_bpe": train_bpe(pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(llama3), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
            None, decoders.ByteLevel(), 700, True),
        "qwen2_bpe": train_bpe(pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(qwen2), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
            normalizers.NFC(), decoders.ByteLevel(), 700, True),
        "gpt2_bpe": train_bpe(pre_tokenizers.ByteLevel(add_prefix_space=True), None,
                              decoders.ByteLevel(), 600, True),
        "spm_bpe": train_bpe(pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False),
                             None, decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                                      decoders.Fuse(), decoders.Strip(" ", 1, 0)]), 500, False),
    }
    # Llama-2 style ("legacy") normalizer instead of a pre-tokenizer.
    legacy = Tokenizer.from_str(specs["spm_bpe"].to_str())
    legacy.pre_tokenizer = None
    legacy.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    specs["spm_legacy_bpe"] = legacy
    from tokenizers.processors import TemplateProcessing
    for name in ("spm_bpe", "spm_legacy_bpe"):
        specs[name].post_processor = TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                        special_tokens=[("<s>", 1)])
    for name, tok in specs.items():
        tok.save(os.path.join(OUT, "trained", name + ".tokenizer.json"))
        write(os.path.join("trained", name + ".golden.json"),
              {"source": "trained by gen_tokenizer_fixtures.py", "cases": golden(tok, CORPUS)})


def gen_sentencepiece():
    """A tiny SentencePiece BPE model with byte fallback (Llama-2 style), its golden
    ids from the sentencepiece library, and its pieces/scores/types as GGUF would
    store them (tokenizer.ggml.model = "llama")."""
    import io
    import sentencepiece as spm
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 4), model_writer=buf, vocab_size=800, model_type="bpe",
        byte_fallback=True, character_coverage=0.9995, split_digits=True, allow_whitespace_only_pieces=True,
        remove_extra_whitespaces=False, normalization_rule_name="identity", minloglevel=2)
    model = buf.getvalue()
    os.makedirs(os.path.join(OUT, "trained"), exist_ok=True)
    with open(os.path.join(OUT, "trained", "spm_llama.model"), "wb") as f:
        f.write(model)
    sp = spm.SentencePieceProcessor(model_proto=model)
    n = sp.get_piece_size()
    types = [3 if sp.is_control(i) else 2 if sp.is_unknown(i) else 6 if sp.is_byte(i) else
             4 if sp.is_unused(i) else 1 for i in range(n)]
    cases = []
    for t in CORPUS:
        ids = sp.encode(t)
        cases.append({"text": t, "ids": [sp.bos_id()] + ids, "ids_no_special": ids,
                      "decoded": sp.decode(ids), "decoded_skip": sp.decode(ids)})
    write(os.path.join("trained", "spm_llama.golden.json"),
          {"source": "sentencepiece " + spm.__version__, "cases": cases,
           "gguf": {"tokens": [sp.id_to_piece(i) for i in range(n)],
                    "scores": [sp.get_score(i) for i in range(n)], "token_type": types,
                    "bos_id": sp.bos_id(), "eos_id": sp.eos_id(), "unk_id": sp.unk_id()}})


def write(name, obj):
    path = os.path.join(OUT, name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=None, separators=(",", ":"))
    print("wrote", path, os.path.getsize(path), "bytes")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models-dir", default=os.environ.get("KILN_MODELS_DIR", os.path.join(REPO, ".cache", "models")))
    ap.add_argument("--only", default="smollm2,minilm,trained,spm,chat")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    only = args.only.split(",")
    if "smollm2" in only:
        gen_smollm2(args.models_dir)
    if "minilm" in only:
        gen_minilm(args.models_dir)
    if "trained" in only:
        gen_trained()
    if "spm" in only:
        gen_sentencepiece()
    if "chat" in only:
        sys.path.insert(0, HERE)
        import gen_chat_fixtures
        gen_chat_fixtures.main(OUT, write)


if __name__ == "__main__":
    main()
