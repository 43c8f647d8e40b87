#!/usr/bin/env python3
"""HuggingFace `tokenizers` (Rust) baseline for bench/tokenizer_bench.cpp: same model,
same file, one encode per line, single-threaded (RAYON_NUM_THREADS=1, no batching),
median of repeats. Prints the id count so both sides can be checked to agree."""
import os
import statistics
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def load(model):
    if model.endswith(".gguf"):
        import transformers
        d, f = os.path.split(model)
        tok = transformers.AutoTokenizer.from_pretrained(d, gguf_file=f).backend_tokenizer
        # transformers' GGUF conversion drops SmolLM2's Digits split (llama.cpp's
        # "smollm" pre-tokenizer and the model's own tokenizer.json both have it);
        # restore the real pipeline so both sides tokenize identically.
        if "smollm" in f.lower():
            from tokenizers import pre_tokenizers as pt
            tok.pre_tokenizer = pt.Sequence([pt.Digits(individual_digits=True),
                                             pt.ByteLevel(add_prefix_space=False, use_regex=True)])
        return tok
    import tokenizers
    tok = tokenizers.Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    tok.no_padding()  # the raw encode, as kiln measures it
    tok.no_truncation()
    return tok


def main():
    model, path = sys.argv[1], sys.argv[2]
    repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    tok = load(model)
    text = open(path, encoding="utf-8", newline="").read()
    lines = text.split("\n")
    times = []
    for r in range(repeats + 1):
        t0 = time.perf_counter()
        n = sum(len(tok.encode(l, add_special_tokens=False).ids) for l in lines)
        if r:
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    size = len(text.encode("utf-8"))
    import tokenizers
    print(f"hf {tokenizers.__version__:7s} {size / med / 1e6:8.2f} MB/s  ({size} bytes, {len(lines)} lines, "
          f"{n} ids, median {med:.3f} s, min {min(times):.3f}, max {max(times):.3f})")


if __name__ == "__main__":
    main()
