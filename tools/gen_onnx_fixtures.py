#!/usr/bin/env python3
"""Generate the ONNX import fixtures for kiln's C++ tests (tests/frontends/onnx_test.cpp).

What it makes (under --out, default tests/fixtures/onnx/):
  bert/  BertModel (tiny, random) exported with torch.onnx.export (TorchScript exporter,
         dynamo=False), inputs input_ids / attention_mask / token_type_ids [batch, seq]
         int64, outputs last_hidden_state [batch, seq, H] and pooler_output [batch, H].
  bert_opset17/  the same BertModel exported at opset 17 (LayerNormalization as one op).
  gpt2/  GPT2LMHeadModel (tiny, random, use_cache=False) exported the same way, inputs
         input_ids / attention_mask, output logits [batch, seq, vocab].
  gpt2_past/  GPT2LMHeadModel (tiny, random, use_cache=True) exported as optimum's
         "text-generation-with-past" task lays it out: inputs input_ids, position_ids
         [batch, seq], attention_mask [batch, past + seq], past_key_values.{i}.key/value
         [batch, heads, past, head_dim]; outputs logits and present.{i}.key/value
         [batch, heads, past + seq, head_dim]. Its reference is a prompt's logits and
         presents, the logits of one step on that past, and HF generate()'s greedy
         continuation (checked against greedy decoding of the export in onnxruntime).
  llama/  LlamaForCausalLM (tiny, random, GQA: 4 query heads and 2 KV heads of 16,
         rope_theta 5000, rms_norm_eps 1e-3, untied LM head) exported as gpt2/ is:
         input_ids / attention_mask -> logits.
  llama_past/  LlamaForCausalLM (the same shape, tied LM head) exported with its cache
         as gpt2_past/ is (past_key_values.{i}.key/value [batch, 2, past, 16]), with
         the same kind of reference.
  qwen2/  Qwen2ForCausalLM (the llama/ shape: GQA 4/2 heads of 16, rope_theta 5000,
         rms_norm_eps 1e-3, untied LM head; plus Qwen2's biases on q_proj, k_proj and
         v_proj, random and non-zero, none on o_proj or the MLP) exported as llama/ is.
  qwen2_past/  Qwen2ForCausalLM (the same shape, tied LM head) exported with its cache as
         llama_past/ is, with the same kind of reference.
Each dir holds model.onnx (< 600 KB), reference.safetensors (the padded input batch and
the PyTorch outputs, float32 / int64) and reference.json (tensor list, versions, the
onnxruntime-vs-PyTorch max error measured here, and the ONNX op histogram).

Why: kiln's ONNX frontend must import what `torch.onnx.export` really produces for HF
models (opset 14 with dynamic batch and sequence axes); the references are the ground
truth its tests compare against, and onnxruntime's agreement with PyTorch (checked
below) shows the exported graph itself is faithful.

Usage (torch/transformers as for tools/gen_fixtures.py; plus onnx and onnxruntime):
  python3 -m venv --system-site-packages /tmp/onnxvenv && /tmp/onnxvenv/bin/pip install onnx onnxruntime
  /tmp/onnxvenv/bin/python tools/gen_onnx_fixtures.py --out tests/fixtures/onnx
Generated with torch 2.15.0, transformers 5.24.0 (llama/, llama_past/, qwen2/ and
qwen2_past/: 5.25.0), onnx 1.23.2, onnxruntime 1.32.0, numpy 2.4.6, Python 3.11.7
(recorded in each reference.json). `--only qwen2,qwen2_past` regenerates just those.
"""

import argparse
import collections
import json
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.torch import save_file

torch.use_deterministic_algorithms(True)
torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))

VOCAB = 256
HIDDEN = 32
LAYERS = 2
HEADS = 4
MAX_POS = 64
OPSET = 14
PROMPT_LENS = [5, 9, 12]
ORT_TOL = 1e-4


def log(*a):
    print(*a, flush=True)


def versions():
    import onnx
    import onnxruntime

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
        "numpy": np.__version__,
        "python": sys.version.split()[0],
    }


def randomize(model, seed):
    """Biases and norm params start at 0/1 in HF init; perturb them so a dropped bias
    or norm weight cannot pass."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
            elif ("norm" in name.lower() or "ln_" in name) and p.dim() == 1:
                p.copy_(1.0 + torch.randn(p.shape, generator=g) * 0.1)


def padded_batch(seed, vocab):
    g = torch.Generator().manual_seed(seed)
    smax = max(PROMPT_LENS)
    ids = torch.zeros((len(PROMPT_LENS), smax), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(PROMPT_LENS):
        ids[i, :n] = torch.randint(3, vocab, (n,), generator=g)
        mask[i, :n] = 1
    return ids, mask


def export(model, args, names, outputs, dynamic, path, opset=OPSET):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, str(path), input_names=names, output_names=outputs,
                          dynamic_axes=dynamic, opset_version=opset, do_constant_folding=True,
                          dynamo=False)


def op_histogram(path):
    import onnx

    m = onnx.load(str(path))
    return dict(sorted(collections.Counter(n.op_type for n in m.graph.node).items()))


def run_ort(path, feeds):
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {k: v.numpy() for k, v in feeds.items()})


def finish(out, name, path, feeds, ref_outputs, meta, opset=OPSET):
    ort_outs = run_ort(path, feeds)
    errs = {}
    for (k, v), o in zip(ref_outputs.items(), ort_outs):
        errs[k] = float(np.abs(v.numpy() - o).max())
        status = "OK" if errs[k] <= ORT_TOL else "FAIL"
        log(f"  [{status}] {name} {k}: onnxruntime vs torch max|diff| = {errs[k]:.3e}")
        if errs[k] > ORT_TOL:
            raise SystemExit(f"check failed: {name} {k}")
    tensors = {**{k: v.to(torch.int64) for k, v in feeds.items()},
               **{k: v.to(torch.float32).contiguous() for k, v in ref_outputs.items()},
               "lengths": torch.tensor(PROMPT_LENS, dtype=torch.int64)}
    save_file(tensors, str(out / "reference.safetensors"))
    meta.update({
        "versions": versions(),
        "opset": opset,
        "onnx_bytes": path.stat().st_size,
        "tensors": {k: {"dtype": str(v.dtype).replace("torch.", ""), "shape": list(v.shape)}
                    for k, v in tensors.items()},
        "onnxruntime_vs_torch_max_abs": errs,
        "ops": op_histogram(path),
    })
    with open(out / "reference.json", "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    log(f"  wrote {out} ({path.stat().st_size} bytes of ONNX)")


def make_bert(root, opset=OPSET, dirname="bert"):
    out = root / dirname
    out.mkdir(parents=True, exist_ok=True)
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                  num_attention_heads=HEADS, intermediate_size=4 * HIDDEN,
                                  max_position_embeddings=MAX_POS, type_vocab_size=2, attn_implementation="eager",
                                  initializer_range=0.2, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    torch.manual_seed(2001)
    model = transformers.BertModel(cfg, add_pooling_layer=True).eval()
    randomize(model, 2002)
    ids, mask = padded_batch(2003, VOCAB)
    types = torch.zeros_like(ids)
    types[0, 2:] = 1  # segment 1 in use (padding keeps type 1 too: it must not matter)
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}

    class Wrap(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, token_type_ids):
            o = self.m(input_ids=input_ids, attention_mask=attention_mask,
                       token_type_ids=token_type_ids, return_dict=True)
            return o.last_hidden_state, o.pooler_output

    w = Wrap(model).eval()
    with torch.no_grad():
        hidden, pooled = w(ids, mask, types)
    dyn = {k: {0: "batch", 1: "sequence"} for k in feeds}
    dyn["last_hidden_state"] = {0: "batch", 1: "sequence"}
    dyn["pooler_output"] = {0: "batch"}
    path = out / "model.onnx"
    export(w, (ids, mask, types), list(feeds), ["last_hidden_state", "pooler_output"], dyn, path, opset)
    finish(out, dirname, path, feeds, {"last_hidden_state": hidden, "pooler_output": pooled},
           {"model": "bert", "class": "BertModel", "config": cfg.to_diff_dict(),
            "padding": "right, pad id 0, attention_mask 0 on padding"}, opset)


def export_logits(out, family, cls, cfg, model, batch):
    """A causal LM exported without a cache: inputs input_ids / attention_mask [batch, seq],
    output logits; the reference is PyTorch's logits on the padded batch."""
    ids, mask = batch
    feeds = {"input_ids": ids, "attention_mask": mask}

    class Wrap(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                          return_dict=True).logits

    w = Wrap(model).eval()
    with torch.no_grad():
        logits = w(ids, mask)
    dyn = {k: {0: "batch", 1: "sequence"} for k in feeds}
    dyn["logits"] = {0: "batch", 1: "sequence"}
    path = out / "model.onnx"
    export(w, (ids, mask), list(feeds), ["logits"], dyn, path)
    finish(out, family, path, feeds, {"logits": logits},
           {"model": family, "class": cls, "config": cfg.to_diff_dict(),
            "padding": "right, pad id 0, attention_mask 0 on padding; logits past a row's "
                       "length are not meaningful"})


def make_gpt2(root):
    out = root / "gpt2"
    out.mkdir(parents=True, exist_ok=True)
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS,
                                  n_positions=MAX_POS, initializer_range=0.2, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
                                  attn_implementation="eager")
    torch.manual_seed(3001)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    randomize(model, 3002)
    export_logits(out, "gpt2", "GPT2LMHeadModel", cfg, model, padded_batch(3003, VOCAB))


PAST_PROMPT_LEN = 7
PAST_NEW_TOKENS = 12


def make_gpt2_past(root):
    # initializer_range 0.5: at 0.2 this tiny model's greedy continuation settles into
    # repeating one token after a few steps, which would test little.
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS,
                                  n_positions=MAX_POS, initializer_range=0.5, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0, use_cache=True,
                                  bos_token_id=None, eos_token_id=None, attn_implementation="eager")
    torch.manual_seed(4001)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    randomize(model, 4002)
    export_with_past(root / "gpt2_past", "gpt2_past", model, cfg, "gpt2", "GPT2LMHeadModel",
                     LAYERS, HEADS, HIDDEN // HEADS, VOCAB, 4003)


def export_with_past(out, name, model, cfg, family, cls, layers, kv_heads, head_dim, vocab, seed):
    """Exports `model` with its cache flattened to per-layer tensors as optimum's
    text-generation-with-past lays it out, checks it in onnxruntime for several past
    lengths, and writes the prompt / step / greedy reference."""
    out.mkdir(parents=True, exist_ok=True)
    past_names = [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    present_names = [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    names = ["input_ids", "attention_mask", "position_ids"] + past_names

    class Wrap(torch.nn.Module):
        """The flat signature optimum exports: tensors in, tensors out, the cache rebuilt
        from (and flattened back to) per-layer key/value tensors."""

        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, position_ids, *past):
            cache = transformers.DynamicCache([(past[2 * i], past[2 * i + 1]) for i in range(layers)])
            o = self.m(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                       cache=cache, use_cache=True, return_dict=True)
            outs = [o.logits]
            for layer in o.cache.layers:
                outs += [layer.keys, layer.values]
            return tuple(outs)

    def feeds_for(ids, past):
        b, s = ids.shape
        p = past[0].shape[2]
        pos = torch.arange(p, p + s, dtype=torch.long).unsqueeze(0).expand(b, s).contiguous()
        mask = torch.ones((b, p + s), dtype=torch.long)
        return {"input_ids": ids, "attention_mask": mask, "position_ids": pos, **dict(zip(past_names, past))}

    w = Wrap(model).eval()
    # Traced on a batch of 2 with a past of 3 and 4 new tokens, so that no dim is 0 or 1.
    g = torch.Generator().manual_seed(seed)
    trace_ids = torch.randint(3, vocab, (2, 4), generator=g)
    trace_past = [torch.randn((2, kv_heads, 3, head_dim), generator=g) for _ in past_names]
    dyn = {"input_ids": {0: "batch_size", 1: "sequence_length"},
           "position_ids": {0: "batch_size", 1: "sequence_length"},
           "attention_mask": {0: "batch_size", 1: "past_sequence_length + sequence_length"},
           "logits": {0: "batch_size", 1: "sequence_length"}}
    dyn.update({k: {0: "batch_size", 2: "past_sequence_length"} for k in past_names})
    dyn.update({k: {0: "batch_size", 2: "past_sequence_length + sequence_length"} for k in present_names})
    path = out / "model.onnx"
    tf = feeds_for(trace_ids, trace_past)
    export(w, tuple(tf[k] for k in names), names, ["logits"] + present_names, dyn, path)

    # The export must be faithful for every past length, 0 (a prompt) included.
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for b, p, s in [(1, 0, 5), (1, 6, 1), (3, 7, 2)]:
        ids = torch.randint(3, vocab, (b, s), generator=g)
        past = [torch.randn((b, kv_heads, p, head_dim), generator=g) for _ in past_names]
        f = feeds_for(ids, past)
        with torch.no_grad():
            ref = w(*(f[k] for k in names))
        got = sess.run(None, {k: v.numpy() for k, v in f.items()})
        err = max(float(np.abs(r.numpy() - o).max()) for r, o in zip(ref, got))
        log(f"  [{'OK' if err <= ORT_TOL else 'FAIL'}] {name} batch {b} past {p} new {s}: "
            f"onnxruntime vs torch max|diff| = {err:.3e}")
        if err > ORT_TOL:
            raise SystemExit(f"check failed: {name}")

    # The reference: a prompt (empty past), one greedy step on its presents, and HF
    # generate()'s greedy continuation.
    prompt = torch.randint(3, vocab, (1, PAST_PROMPT_LEN), generator=g)
    empty = [torch.zeros((1, kv_heads, 0, head_dim)) for _ in past_names]
    with torch.no_grad():
        plain = model(input_ids=prompt, use_cache=False).logits
        first = w(*(feeds_for(prompt, empty)[k] for k in names))
        step_token = first[0][:, -1:].argmax(-1)
        step = w(*(feeds_for(step_token, list(first[1:]))[k] for k in names))
        gen = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                             max_new_tokens=PAST_NEW_TOKENS, min_new_tokens=PAST_NEW_TOKENS, pad_token_id=0,
                             output_logits=True, return_dict_in_generate=True)
    greedy = gen.sequences[0, PAST_PROMPT_LEN:]
    # The smallest top-1 minus top-2 logit on the greedy path: far above f32 noise, so a
    # faithful runtime must pick the same tokens.
    margin = min(float(t.topk(2).values[0, 0] - t.topk(2).values[0, 1]) for t in gen.logits)
    log(f"  greedy margin (min top-1 - top-2 logit): {margin:.4f}")
    if margin < 1e-3:
        raise SystemExit("check failed: a greedy step is a near tie; pick another seed")
    if float((plain - first[0]).abs().max()) > 1e-5:
        raise SystemExit("check failed: the wrapper's prompt logits differ from the plain model's")
    # Greedy decoding of the export itself (onnxruntime, presents fed back as the past).
    ids, past, ort_tokens = prompt, [t.numpy() for t in empty], []
    for _ in range(PAST_NEW_TOKENS):
        o = sess.run(None, {k: (v if isinstance(v, np.ndarray) else v.numpy())
                            for k, v in feeds_for(ids, [torch.from_numpy(x) for x in past]).items()})
        ort_tokens.append(int(o[0][0, -1].argmax()))
        ids, past = torch.tensor([[ort_tokens[-1]]]), o[1:]
    log(f"  greedy: HF generate {greedy.tolist()}, onnxruntime with past {ort_tokens}")
    if greedy.tolist() != ort_tokens:
        raise SystemExit("check failed: onnxruntime's greedy tokens differ from HF generate()")

    tensors = {"prompt_ids": prompt.to(torch.int64), "prompt_logits": first[0].contiguous(),
               "step_ids": step_token.to(torch.int64), "step_logits": step[0].contiguous(),
               "greedy_ids": greedy.to(torch.int64).contiguous()}
    tensors.update({f"prompt_{k}": v.contiguous() for k, v in zip(present_names, first[1:])})
    tensors.update({f"step_{k}": v.contiguous() for k, v in zip(present_names, step[1:])})
    save_file(tensors, str(out / "reference.safetensors"))
    meta = {"model": family, "class": cls, "config": cfg.to_diff_dict(),
            "export": "optimum-style with past: input_ids, attention_mask, position_ids, "
                      "past_key_values.{i}.key/value -> logits, present.{i}.key/value",
            "prompt_ids": prompt[0].tolist(), "greedy_ids": greedy.tolist(), "greedy_margin": margin,
            "versions": versions(), "opset": OPSET, "onnx_bytes": path.stat().st_size,
            "tensors": {k: {"dtype": str(v.dtype).replace("torch.", ""), "shape": list(v.shape)}
                        for k, v in tensors.items()},
            "ops": op_histogram(path)}
    with open(out / "reference.json", "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    log(f"  wrote {out} ({path.stat().st_size} bytes of ONNX)")


# The Llama fixtures: GQA (4 query heads, 2 KV heads of 16), and a rope_theta and an
# rms_norm_eps away from the defaults (10000, 1e-6), so that a value not read from the
# graph shows.
LLAMA_VOCAB = 320
LLAMA_HIDDEN = 64
LLAMA_HEADS = 4
LLAMA_KV_HEADS = 2
LLAMA_INTER = 128
LLAMA_THETA = 5000.0
LLAMA_EPS = 1e-3


def llama_model(seed, tied, init):
    cfg = transformers.LlamaConfig(vocab_size=LLAMA_VOCAB, hidden_size=LLAMA_HIDDEN, num_hidden_layers=LAYERS,
                                   num_attention_heads=LLAMA_HEADS, num_key_value_heads=LLAMA_KV_HEADS,
                                   intermediate_size=LLAMA_INTER, max_position_embeddings=MAX_POS,
                                   rope_theta=LLAMA_THETA, rms_norm_eps=LLAMA_EPS, tie_word_embeddings=tied,
                                   initializer_range=init, use_cache=True, bos_token_id=None, eos_token_id=None,
                                   attn_implementation="eager")
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg).eval()
    randomize(model, seed + 1)
    return cfg, model


def make_llama(root):
    out = root / "llama"
    out.mkdir(parents=True, exist_ok=True)
    cfg, model = llama_model(5001, tied=False, init=0.2)
    export_logits(out, "llama", "LlamaForCausalLM", cfg, model, padded_batch(5003, LLAMA_VOCAB))


def make_llama_past(root):
    cfg, model = llama_model(6001, tied=True, init=0.5)
    export_with_past(root / "llama_past", "llama_past", model, cfg, "llama", "LlamaForCausalLM", LAYERS,
                     LLAMA_KV_HEADS, LLAMA_HIDDEN // LLAMA_HEADS, LLAMA_VOCAB, 6003)


# The Qwen2 fixtures: the Llama fixtures' shape (GQA, theta, eps) plus Qwen2's biases on
# q_proj, k_proj and v_proj (none on o_proj or the MLP), random (randomize() above) so
# that a dropped or misplaced bias shows.
def qwen2_model(seed, tied, init):
    cfg = transformers.Qwen2Config(vocab_size=LLAMA_VOCAB, hidden_size=LLAMA_HIDDEN, num_hidden_layers=LAYERS,
                                   num_attention_heads=LLAMA_HEADS, num_key_value_heads=LLAMA_KV_HEADS,
                                   intermediate_size=LLAMA_INTER, max_position_embeddings=MAX_POS,
                                   rope_theta=LLAMA_THETA, rms_norm_eps=LLAMA_EPS, tie_word_embeddings=tied,
                                   initializer_range=init, use_cache=True, use_sliding_window=False,
                                   bos_token_id=None, eos_token_id=None, attn_implementation="eager")
    torch.manual_seed(seed)
    model = transformers.Qwen2ForCausalLM(cfg).eval()
    randomize(model, seed + 1)
    biases = sorted(n for n, _ in model.named_parameters() if n.endswith("bias"))
    if biases != sorted(f"model.layers.{i}.self_attn.{p}_proj.bias" for i in range(LAYERS) for p in "qkv"):
        raise SystemExit(f"check failed: Qwen2's biases are {biases}, expected q/k/v_proj's only")
    return cfg, model


def make_qwen2(root):
    out = root / "qwen2"
    out.mkdir(parents=True, exist_ok=True)
    cfg, model = qwen2_model(7001, tied=False, init=0.2)
    export_logits(out, "qwen2", "Qwen2ForCausalLM", cfg, model, padded_batch(7003, LLAMA_VOCAB))


def make_qwen2_past(root):
    cfg, model = qwen2_model(8001, tied=True, init=0.5)
    export_with_past(root / "qwen2_past", "qwen2_past", model, cfg, "qwen2", "Qwen2ForCausalLM", LAYERS,
                     LLAMA_KV_HEADS, LLAMA_HIDDEN // LLAMA_HEADS, LLAMA_VOCAB, 8003)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures/onnx")
    ap.add_argument("--only", default="bert,bert_opset17,gpt2,gpt2_past,llama,llama_past,qwen2,qwen2_past")
    a = ap.parse_args()
    root = Path(a.out)
    for name in a.only.split(","):
        log(f"== {name}")
        {"bert": make_bert, "bert_opset17": lambda r: make_bert(r, 17, "bert_opset17"),
         "gpt2": make_gpt2, "gpt2_past": make_gpt2_past, "llama": make_llama,
         "llama_past": make_llama_past, "qwen2": make_qwen2, "qwen2_past": make_qwen2_past}[name](root)


if __name__ == "__main__":
    main()
