# A synthetic llama GGUF whose Linears are random Q4_K blocks (magnitudes as llama.cpp's
# quantizer makes them), for load-time / RSS measurements of --weight-dtype q4 (bench/RESULTS.md).
# Run: python3 bench/gguf_q4k_synth.py OUT.gguf LAYERS   (needs numpy and the gguf package)
import sys, numpy as np, gguf
out, layers = sys.argv[1], int(sys.argv[2])
h, inter, heads, kv_heads, vocab = 2048, 5632, 32, 4, 2048
rng = np.random.default_rng(0)
w = gguf.GGUFWriter(out, "llama")
w.add_block_count(layers); w.add_embedding_length(h); w.add_feed_forward_length(inter)
w.add_head_count(heads); w.add_head_count_kv(kv_heads); w.add_context_length(2048)
w.add_layer_norm_rms_eps(1e-5); w.add_rope_freq_base(10000.0)
w.add_tokenizer_model("llama"); w.add_token_list([f"t{i}" for i in range(vocab)])
def q4k(n, k):  # n rows of k, raw block_q4_K bytes [n, k/256*144]
    nb = n * k // 256
    b = rng.integers(0, 256, size=(nb, 144), dtype=np.uint8)
    b[:, 0:2] = rng.uniform(1e-4, 2e-4, nb).astype(np.float16).view(np.uint8).reshape(nb, 2)
    b[:, 2:4] = rng.uniform(5e-4, 1e-3, nb).astype(np.float16).view(np.uint8).reshape(nb, 2)
    return b.reshape(n, k // 256 * 144)
def add_q4k(name, n, k):
    w.add_tensor(name, q4k(n, k), raw_shape=(n, k // 256 * 144), raw_dtype=gguf.GGMLQuantizationType.Q4_K)
w.add_tensor("token_embd.weight", rng.normal(0, 0.02, (vocab, h)).astype(np.float32))
w.add_tensor("output_norm.weight", np.ones(h, np.float32))
for l in range(layers):
    p = f"blk.{l}."
    w.add_tensor(p + "attn_norm.weight", np.ones(h, np.float32)); w.add_tensor(p + "ffn_norm.weight", np.ones(h, np.float32))
    add_q4k(p + "attn_q.weight", h, h); add_q4k(p + "attn_k.weight", h // heads * kv_heads, h)
    add_q4k(p + "attn_v.weight", h // heads * kv_heads, h); add_q4k(p + "attn_output.weight", h, h)
    add_q4k(p + "ffn_gate.weight", inter, h); add_q4k(p + "ffn_up.weight", inter, h); add_q4k(p + "ffn_down.weight", h, inter)
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
