# A llama-family (Qwen3 included: per-head q/k norms) or GPT-2 GGUF of a given shape with
# random weights, in one GGML type for
# every Linear and the token table (F16, BF16, Q8_0 or Q4_0, as `llama-quantize --pure`
# writes them), so that kiln and llama.cpp can be timed on the same file
# (bench/llamacpp_round.sh, bench/RESULTS.md).
# Weights are random codes with scales giving a std of ~0.02 (never zeros: BENCHMARKING.md);
# norms are ones. Llama-3 rope_scaling is not written (both engines then run plain RoPE).
# Run: python3 bench/gguf_synth.py CONFIG.json TYPE OUT.gguf [--layers N]
#   (needs numpy and the gguf package: pip's `gguf`, or llama.cpp's gguf-py on PYTHONPATH)
import argparse
import json

import gguf
import numpy as np

p = argparse.ArgumentParser()
p.add_argument("config", help="a kiln bench config (HF config.json fields), e.g. bench/configs/llama-3.1-8b.json")
p.add_argument("type", choices=["f16", "bf16", "q8_0", "q4_0", "q4_k"])
p.add_argument("out")
p.add_argument("--layers", type=int, default=0, help="override num_hidden_layers")
a = p.parse_args()
c = json.load(open(a.config))
gpt2 = c.get("model_type") == "gpt2"
if c.get("model_type") not in ("llama", "mistral", "qwen3", "gpt2"):
    raise SystemExit(f"gguf_synth.py: model_type {c.get('model_type')!r}: only llama-family, qwen3 and gpt2 configs")
qwen3 = c.get("model_type") == "qwen3"
if gpt2:  # GPT-2's config names
    c = dict(c, hidden_size=c["n_embd"], num_hidden_layers=c["n_layer"], num_attention_heads=c["n_head"],
             intermediate_size=c.get("n_inner") or 4 * c["n_embd"], max_position_embeddings=c["n_positions"])
h, inter, heads = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"]
kv_heads = c.get("num_key_value_heads", heads)
head_dim = c.get("head_dim", h // heads)
vocab, layers = c["vocab_size"], a.layers or c["num_hidden_layers"]
rng = np.random.default_rng(0)
Q = gguf.GGMLQuantizationType

w = gguf.GGUFWriter(a.out, "gpt2" if gpt2 else "qwen3" if qwen3 else "llama")
w.add_name(f"synthetic {a.config} {a.type}")
w.add_block_count(layers)
w.add_context_length(min(c.get("max_position_embeddings", 4096), 8192))
w.add_embedding_length(h)
w.add_feed_forward_length(inter)
w.add_head_count(heads)
if gpt2:
    w.add_layer_norm_eps(float(c.get("layer_norm_epsilon", 1e-5)))
else:
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(c.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(float(c.get("rms_norm_eps", 1e-5)))
w.add_vocab_size(vocab)
w.add_file_type({"f16": 1, "bf16": 32, "q8_0": 7, "q4_0": 2, "q4_k": 15}[a.type])
w.add_tokenizer_model("llama")
w.add_token_list([f"<t{i}>" for i in range(vocab)])
w.add_token_scores([0.0] * vocab)
w.add_token_types([3 if i < 3 else 1 for i in range(vocab)])  # 0-2 control (unk, bos, eos)
w.add_unk_token_id(0)
w.add_bos_token_id(1)
w.add_eos_token_id(2)


def f16_scales(n, v):
    return rng.uniform(0.5 * v, 1.5 * v, n).astype(np.float16).view(np.uint8).reshape(n, 2)


def linear(name, n, k):
    """A [n, k] weight (n outputs) in a.type, written as GGUF stores it (ne = [k, n])."""
    if a.type in ("f16", "bf16"):
        # Random sign and mantissa, exponent 2^-7..2^-5 (|x| in [0.008, 0.06)): generated as
        # bits, which is fast enough for the 8B shape's 16 GB.
        r = rng.integers(0, 1 << 16, size=(n, k), dtype=np.uint16)
        e = rng.integers(0, 3, size=(n, k), dtype=np.uint16)
        if a.type == "bf16":
            b = (r & 0x807F) | ((e + 0x78) << 7)
        else:
            b = (r & 0x83FF) | ((e + 0x08) << 10)
        w.add_tensor(name, b.view(np.uint8).reshape(n, k * 2), raw_shape=(n, k * 2),
                     raw_dtype=Q.BF16 if a.type == "bf16" else Q.F16)
        return
    if a.type == "q4_k":  # 256-weight super-blocks of 144 bytes: d, dmin (f16), 12 bytes of
        nb = n * k // 256  # 6-bit sub-block scales/mins, 128 bytes of nibbles (as gguf_q4k_synth.py)
        b = rng.integers(0, 256, size=(nb, 144), dtype=np.uint8)
        b[:, 0:2] = f16_scales(nb, 1.5e-4)
        b[:, 2:4] = f16_scales(nb, 7.5e-4)
        w.add_tensor(name, b.reshape(n, k // 256 * 144), raw_shape=(n, k // 256 * 144), raw_dtype=Q.Q4_K)
        return
    nb = n * k // 32
    if a.type == "q8_0":  # 32 int8 codes in [-127, 127] (llama.cpp's quantizer never writes -128) x d
        b = np.empty((nb, 34), np.uint8)
        b[:, 0:2] = f16_scales(nb, 0.02 / 73)
        b[:, 2:] = rng.integers(-127, 128, size=(nb, 32), dtype=np.int8).view(np.uint8)
        w.add_tensor(name, b.reshape(n, k // 32 * 34), raw_shape=(n, k // 32 * 34), raw_dtype=Q.Q8_0)
    else:  # q4_0: (nibble - 8) x d: std ~ 4.6 d
        b = np.empty((nb, 18), np.uint8)
        b[:, 0:2] = f16_scales(nb, 0.02 / 4.6)
        b[:, 2:] = rng.integers(0, 256, size=(nb, 16), dtype=np.uint8)
        w.add_tensor(name, b.reshape(n, k // 32 * 18), raw_shape=(n, k // 32 * 18), raw_dtype=Q.Q4_0)


ones = np.ones(h, np.float32)
if gpt2:  # LayerNorms with biases, biased Linears, learned positions, the head tied to the table
    zeros = lambda n: np.zeros(n, np.float32)
    linear("token_embd.weight", vocab, h)
    w.add_tensor("position_embd.weight", rng.normal(0, 0.01, (c["max_position_embeddings"], h)).astype(np.float32))
    w.add_tensor("output_norm.weight", ones)
    w.add_tensor("output_norm.bias", zeros(h))
    for l in range(layers):
        p_ = f"blk.{l}."
        for norm in ("attn_norm", "ffn_norm"):
            w.add_tensor(p_ + norm + ".weight", ones)
            w.add_tensor(p_ + norm + ".bias", zeros(h))
        for name, n, k in (("attn_qkv", 3 * h, h), ("attn_output", h, h), ("ffn_up", inter, h), ("ffn_down", h, inter)):
            linear(p_ + name + ".weight", n, k)
            w.add_tensor(p_ + name + ".bias", zeros(n))
else:
    linear("token_embd.weight", vocab, h)
    w.add_tensor("output_norm.weight", ones)
    if not c.get("tie_word_embeddings", False):
        linear("output.weight", vocab, h)
    for l in range(layers):
        p_ = f"blk.{l}."
        w.add_tensor(p_ + "attn_norm.weight", ones)
        w.add_tensor(p_ + "ffn_norm.weight", ones)
        if qwen3:
            w.add_tensor(p_ + "attn_q_norm.weight", np.ones(head_dim, np.float32))
            w.add_tensor(p_ + "attn_k_norm.weight", np.ones(head_dim, np.float32))
        linear(p_ + "attn_q.weight", heads * head_dim, h)
        linear(p_ + "attn_k.weight", kv_heads * head_dim, h)
        linear(p_ + "attn_v.weight", kv_heads * head_dim, h)
        linear(p_ + "attn_output.weight", h, heads * head_dim)
        linear(p_ + "ffn_gate.weight", inter, h)
        linear(p_ + "ffn_up.weight", inter, h)
        linear(p_ + "ffn_down.weight", h, inter)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print(f"wrote {a.out}: {layers} layers, {a.type}")
