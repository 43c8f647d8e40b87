#!/usr/bin/env python3
"""Write a BERT-family GGUF (llama.cpp's `bert` architecture) from a HuggingFace BERT directory,
as llama.cpp's converter (convert_hf_to_gguf.py -> conversion/bert.py, class BertModel) would,
without torch or transformers (which that converter imports).

    python3 bench/gguf_bert.py HF_DIR TYPE OUT.gguf        TYPE: f32 | f16 | q8_0

HF_DIR: config.json with architectures BertModel / BertForMaskedLM / BertForSequenceClassification,
model.safetensors (or model-*.safetensors + model.safetensors.index.json; pytorch_model.bin needs
torch and is refused), tokenizer.json and/or vocab.txt, tokenizer_config.json, optionally
special_tokens_map.json and a sentence-transformers layout (modules.json + 1_Pooling/config.json)
for the pooling type. Example: .cache/models/all-minilm-l6-v2 (all-MiniLM-L6-v2) or bge-small.

What is reproduced, step for step (llama.cpp of llama-cpp-python 0.3.36, conversion/base.py + bert.py):
- tensors: every safetensors part in name order (gguf.utility.SafetensorsLocal sorts them);
  BertModel.filter_tensors drops embeddings.position_ids, pooler.dense.*, cls.predictions.*,
  cls.seq_relationship.*, strips "bert.", renames .gamma/.beta to .weight/.bias; TextModel and
  ModelBase filters (multimodal prefixes, e_score_correction_bias, "language_model.") too;
  prepare_tensors skips *.attention.masked_bias / *.attention.bias / *.rotary_emb.inv_freq, turns
  non-f16/f32 data (bf16, ints) into f32, maps names with gguf.TensorNameMap(MODEL_ARCH.BERT,
  n_layers), renames classifier.{weight,bias} -> classifier.out_proj.* when real id2label labels exist.
- storage type per tensor (prepare_tensors' selection; tensor_force_quant is False without fp8):
    f32 (general.file_type 0, ALL_F32):     every tensor F32.
    f16 (general.file_type 1, MOSTLY_F16):  F16: the 2-D ".weight" matrices token_embd, attn_q, attn_k,
                                            attn_v, attn_output, ffn_up, ffn_down (and cls.output);
                                            F32: position_embd (POS_EMBD is always F32), token_types
                                            (TOKEN_TYPES always F32), every norm (token_embd_norm,
                                            attn_output_norm, layer_output_norm: 1-D / "_norm.weight")
                                            and every bias (1-D, and not ".weight").
    q8_0 (general.file_type 7, MOSTLY_Q8_0): as f16 but Q8_0 for those matrices, token_embd included
                                            (gguf.quants.quantize; a row not a multiple of 32 falls
                                            back to F16, as the converter's QuantError path does).
- metadata (in the converter's order): general.architecture=bert, general.type=model,
  gguf.Metadata.load(model card README.md / config.json) + size label, then TextModel's generic
  hparams: block_count, context_length (max_position_embeddings), embedding_length,
  feed_forward_length, attention.head_count, attention.layer_norm_epsilon, general.file_type; then
  bert.attention.causal=false, bert.pooling_type from modules.json -> <Pooling>/config.json
  (_try_set_pooling_type: mean/cls/lasttoken), classifier labels if any;
  general.quantization_version; then the vocabulary.
- vocabulary (get_vocab_base + BertModel.set_vocab): ids 0..vocab_size-1 from tokenizer.json's
  WordPiece vocab + added_tokens (else vocab.txt); holes -> "[PAD<i>]" UNUSED; added tokens that
  are special (tokenizer.json "special", or named in tokenizer_config/special_tokens_map, as
  transformers registers them) or look special (does_token_look_special) -> CONTROL; other added
  tokens -> USER_DEFINED (U+2581 -> " "); the rest, [unused0]... included, NORMAL. Then the
  "phantom space" rewrite: non-CONTROL tokens starting "##" lose it, the others get a U+2581
  prefix. tokenizer.ggml.model=bert, token_type_count=type_vocab_size, tokenizer.ggml.pre from
  get_vocab_base_pre's hash of the tokenized check text (computed here with a Python
  re-implementation of HF tokenizers' BertNormalizer + BertPreTokenizer + WordPiece + the
  [CLS] A [SEP] template; note the converter's if-chain lets the later match win, so
  all-MiniLM / bge-small's hash 0876d13b... gives "jina-v2-en", not "bert-bge"); then
  gguf.SpecialVocab (special ids, add_bos/add_eos/add_sep, tokenizer.ggml.normalizer.lowercase).
- gguf package: the converter imports its own vendored gguf-py (it prepends ../gguf-py to
  sys.path); this script does the same when it finds one (env GGUF_PY, or
  .cache/llamacpp/src-*/vendor/llama.cpp/gguf-py under the repository), else it uses the
  installed `gguf` and adds the vendored SpecialVocab's normalizer keys itself.

Not reproduced: the transformers AutoConfig defaults merged into hparams (config.json is read
as it is; the keys the BERT path reads are config.json's own), the encode/decode round trip the
converter applies to non-normalized added tokens (identity for [PAD]/[UNK]/[CLS]/[SEP]/[MASK]),
sentencepiece / BPE tokenizers (CamembertModel, RobertaModel), pytorch_model.bin, --outtype auto/
bf16/tq*, metadata overrides, split output. Output filename templates ({ftype}) are filled.
"""
from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import re
import sys
import unicodedata
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def _vendored_llamacpp() -> Path | None:
    if (env := os.environ.get("GGUF_PY")) and Path(env, "gguf").is_dir():
        return Path(env).parent
    for d in sorted(glob.glob(str(REPO / ".cache/llamacpp/src-*/vendor/llama.cpp")), reverse=True):
        if Path(d, "gguf-py/gguf").is_dir():
            return Path(d)
    return None


LLAMACPP = _vendored_llamacpp()
if LLAMACPP is not None and os.environ.get("NO_LOCAL_GGUF") is None:
    sys.path.insert(1, str(LLAMACPP / "gguf-py"))
import gguf  # noqa: E402

logger = logging.getLogger("gguf_bert")

FTYPES = {
    "f32": gguf.LlamaFileType.ALL_F32,
    "f16": gguf.LlamaFileType.MOSTLY_F16,
    "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
}
ARCHES = ("BertModel", "BertForMaskedLM", "BertForSequenceClassification")

# get_vocab_base_pre's text and the WordPiece rows of its table (used when the converter's
# base.py is not at hand; with it, the whole table is read from there).
CHKTXT = '\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= нещо на Български \'\'\'\'\'\'```````""""......!!!!!!?????? I\'ve been \'told he\'s there, \'RE you sure? \'M not sure I\'ll make it, \'D you like some tea? We\'Ve a\'lL'
PRE_TABLE = {
    # listed twice in base.py: bert-bge (bge-small-en-v1.5) then jina-v2-en; the later wins
    "0876d13b50744004aa9aeae05e7b0647eac9d801b5ba4668afc01e709c15e19f": "jina-v2-en",
    "8e62295832751ca1e8f92f2226f403dea30dc5165e448b5bfa05af5340c64ec7": "bert-bge-large",
    "c7699093ba4255a91e702aa38a596aa81669f3525dae06c2953267dde580f448": "jina-v1-en",
}


def pre_table() -> dict[str, str]:
    base = LLAMACPP / "conversion/base.py" if LLAMACPP else None
    if base is None or not base.is_file():
        return PRE_TABLE
    src = base.read_text(encoding="utf-8")
    src = src[src.index("def get_vocab_base_pre"):]
    table: dict[str, str] = {}
    # `if chkhsh == H: ... res = NAME` in sequence: a later hit overwrites an earlier one
    for h, name in re.findall(r'if chkhsh == "([0-9a-f]{64})":\s*\n(?:\s*#[^\n]*\n)*\s*res = "([^"]+)"', src):
        table[h] = name
    return table or PRE_TABLE


# ---- HF tokenizers' BERT pipeline (normalizers/bert.rs, pre_tokenizers/bert.rs, models/wordpiece) ----
_WS = set("\t\n\r \x0b\x0c\x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | {chr(c) for c in range(0x2000, 0x200B)}


def _is_control(c: str) -> bool:
    return c not in "\t\n\r" and unicodedata.category(c).startswith("C")


def _is_chinese(c: str) -> bool:
    o = ord(c)
    return (0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF or 0x20000 <= o <= 0x2A6DF or 0x2A700 <= o <= 0x2B73F
            or 0x2B740 <= o <= 0x2B81F or 0x2B920 <= o <= 0x2CEAF or 0xF900 <= o <= 0xFAFF or 0x2F800 <= o <= 0x2FA1F)


def _is_punc(c: str) -> bool:
    o = ord(c)
    return 33 <= o <= 47 or 58 <= o <= 64 or 91 <= o <= 96 or 123 <= o <= 126 or unicodedata.category(c).startswith("P")


class WordPiece:
    def __init__(self, vocab: dict[str, int], norm: dict, unk: str, prefix: str, max_chars: int):
        self.vocab, self.norm, self.unk, self.prefix, self.max_chars = vocab, norm, unk, prefix, max_chars

    def normalize(self, t: str) -> str:
        n = self.norm
        if n.get("clean_text", True):
            t = "".join(" " if c in _WS else c for c in t if not (ord(c) in (0, 0xFFFD) or _is_control(c)))
        if n.get("handle_chinese_chars", True):
            t = "".join(f" {c} " if _is_chinese(c) else c for c in t)
        lower = n.get("lowercase", True)
        strip = n.get("strip_accents")
        if strip is None:
            strip = lower
        if strip:
            t = "".join(c for c in unicodedata.normalize("NFD", t) if unicodedata.category(c) != "Mn")
        return t.lower() if lower else t

    @staticmethod
    def pre_tokenize(t: str) -> list[str]:
        words, cur = [], ""
        for c in t:
            if c in _WS or _is_punc(c):
                if cur:
                    words.append(cur)
                    cur = ""
                if c not in _WS:
                    words.append(c)
            else:
                cur += c
        if cur:
            words.append(cur)
        return words

    def word(self, w: str) -> list[int]:
        if len(w) > self.max_chars:
            return [self.vocab[self.unk]]
        out, start = [], 0
        while start < len(w):
            end, hit = len(w), None
            while start < end:
                s = w[start:end] if start == 0 else self.prefix + w[start:end]
                if s in self.vocab:
                    hit = self.vocab[s]
                    break
                end -= 1
            if hit is None:
                return [self.vocab[self.unk]]
            out.append(hit)
            start = end
        return out

    def encode(self, text: str, cls: int, sep: int) -> list[int]:
        ids = [cls]
        for w in self.pre_tokenize(self.normalize(text)):
            ids += self.word(w)
        return ids + [sep]


# ---- safetensors ----
def _read_safetensors(path: Path) -> dict[str, tuple[str, tuple[int, ...], np.ndarray]]:
    """name -> (dtype, shape, raw bytes), in name order (as SafetensorsLocal / safetensors give them)."""
    out = {}
    if hasattr(gguf, "utility") and hasattr(gguf.utility, "SafetensorsLocal"):
        with gguf.utility.SafetensorsLocal(path) as part:
            for name, t in part.items():
                out[name] = (t.dtype, tuple(t.shape), t.mmap_bytes())
        return out
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n).decode("utf-8"))
    for name, meta in sorted(header.items()):
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        out[name] = (meta["dtype"], tuple(meta["shape"]), np.memmap(path, mode="c", offset=8 + n + a, shape=b - a))
    return out


_NP = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
       "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def _to_numpy(dtype: str, shape: tuple[int, ...], raw: np.ndarray) -> np.ndarray:
    if dtype == "BF16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    if dtype not in _NP:
        raise ValueError(f"safetensors dtype {dtype} not handled")
    a = raw.view(_NP[dtype]).reshape(shape)
    # prepare_tensors: anything but f16/f32 becomes f32
    return a if a.dtype in (np.float16, np.float32) else a.astype(np.float32)


class BertConverter:
    model_arch = gguf.MODEL_ARCH.BERT

    def __init__(self, dir_model: Path, ftype: gguf.LlamaFileType, fname_out: Path):
        self.dir_model, self.ftype, self.fname_out = dir_model, ftype, fname_out
        with open(dir_model / "config.json", encoding="utf-8") as f:
            self.hparams = json.load(f)
        if "text_config" in self.hparams:
            self.hparams = {**self.hparams, **self.hparams["text_config"]}
        arch = (self.hparams.get("architectures") or ["?"])[0]
        if arch not in ARCHES:
            raise NotImplementedError(f"{arch!r}: this script converts {', '.join(ARCHES)} only")
        labels = self.hparams.get("id2label")
        if labels:
            labels = {int(k): v for k, v in labels.items()}
            if len(labels) == 2 and labels.get(0) == "LABEL_0":
                labels = None  # AutoConfig's dummy labels
        self.cls_out_labels = labels
        self.block_count = self.find_hparam(["n_layers", "num_hidden_layers", "n_layer", "num_layers"])
        self.tensor_map = gguf.get_tensor_name_map(self.model_arch, self.block_count)
        self.gguf_writer = gguf.GGUFWriter(path=None, arch=gguf.MODEL_ARCH_NAMES[self.model_arch])

    def find_hparam(self, keys, optional=False):
        for k in keys:
            if k in self.hparams:
                return self.hparams[k]
        if optional:
            return None
        raise KeyError(f"could not find any of: {keys}")

    # -- tensors --
    @staticmethod
    def filter_tensor_name(name: str) -> str | None:
        # BertModel.filter_tensors
        if name.startswith("bert."):
            name = name[5:]
        if name.endswith(".gamma"):
            name = name[:-6] + ".weight"
        if name.endswith(".beta"):
            name = name[:-5] + ".bias"
        if name in ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias"):
            return None
        if name.startswith(("cls.predictions", "cls.seq_relationship")):
            return None
        # TextModel.filter_tensors: multimodal parts
        if name.startswith(("mlp", "vit.", "vpm.", "siglip2.", "conformer.", "merger.", "resampler.", "sound_encoder.",
                            "sound_projection.", "speech_embeddings.")) \
                or any(s in name for s in ("visual.", "vision.", "audio.", "talker.", "vision_", "audio_", "token2wav.",
                                           "code2wav.", "projector.", "pre_mm_projector_norm", "image_newline",
                                           "view_seperator", "patch_embed", "patch_embedding", "patch_merger.",
                                           "patch_merge_mlp.", "model.connector.")):
            return None
        # ModelBase.filter_tensors
        if name.endswith("e_score_correction_bias"):
            name = name.replace("e_score_correction_bias", "e_score_correction.bias")
        if "language_model." in name:
            name = name.replace("language_model.", "")
        return name

    def index_tensors(self):
        d = self.dir_model
        parts = sorted(p for p in os.listdir(d) if p.startswith("model") and p.endswith(".safetensors"))
        index = d / "model.safetensors.index.json"
        if index.is_file():
            with open(index, encoding="utf-8") as f:
                parts = sorted(dict.fromkeys(json.load(f)["weight_map"].values()))
        if not parts:
            raise FileNotFoundError(f"{d}: no model*.safetensors (pytorch_model.bin needs torch)")
        tensors = {}
        for p in parts:
            for name, t in _read_safetensors(d / p).items():
                if (new := self.filter_tensor_name(name)) is not None:
                    tensors[new] = t
        return tensors

    def match(self, new_name: str, key, bid) -> bool:
        if key not in gguf.MODEL_TENSORS[self.model_arch]:
            return False
        key_name = gguf.TENSOR_NAMES[key]
        if "{bid}" in key_name:
            if bid is None:
                return False
            key_name = key_name.format(bid=bid)
        elif bid is not None:
            return False
        return new_name == key_name + ".weight"

    def prepare_tensors(self):
        T, Q = gguf.MODEL_TENSOR, gguf.GGMLQuantizationType
        always_f32 = [getattr(T, k) for k in (
            "FFN_GATE_INP", "FFN_GATE_INP_SHEXP", "POS_EMBD", "TOKEN_TYPES", "SSM_CONV1D", "SHORTCONV_CONV",
            "TIME_MIX_FIRST", "TIME_MIX_W1", "TIME_MIX_W2", "TIME_MIX_DECAY_W1", "TIME_MIX_DECAY_W2",
            "TIME_MIX_LERP_FUSED", "POSNET_NORM1", "POSNET_NORM2", "V_ENC_EMBD_POS", "A_ENC_EMBD_POS",
            "ALTUP_CORRECT_COEF", "ALTUP_PREDICT_COEF", "SSM_CONV1D_Q", "SSM_CONV1D_K", "SSM_CONV1D_V",
            "INDEXER_PROJ") if hasattr(T, k)]
        by_ftype = {gguf.LlamaFileType.ALL_F32: Q.F32, gguf.LlamaFileType.MOSTLY_F16: Q.F16,
                    gguf.LlamaFileType.MOSTLY_Q8_0: Q.Q8_0}
        for name, (dtype, shape, raw) in self.index_tensors().items():
            if name.endswith((".attention.masked_bias", ".attention.bias", ".rotary_emb.inv_freq")):
                continue
            data = _to_numpy(dtype, shape, raw)
            bid = next((int(p) for p in name.split(".") if p.isdecimal()), None)
            if self.cls_out_labels and name in ("classifier.weight", "classifier.bias"):
                name = "classifier.out_proj." + name.split(".")[-1]
            new_name = self.tensor_map.get_name(key=name, try_suffixes=(".weight", ".bias"))
            if new_name is None:
                raise ValueError(f"Can not map tensor {name!r}")
            n_dims = len(data.shape)
            qtype = None
            if n_dims <= 1 or new_name.endswith("_norm.weight"):
                qtype = Q.F32
            if qtype is None and (any(self.match(new_name, k, bid) for k in always_f32)
                                  or new_name[-7:] not in (".weight", ".lora_a", ".lora_b")):
                qtype = Q.F32
            if qtype is None:
                qtype = by_ftype[self.ftype]
            try:
                qdata = gguf.quants.quantize(data, qtype)
            except gguf.QuantError as e:
                logger.warning("%s, %s", e, "falling back to F16")
                qtype = Q.F16
                qdata = gguf.quants.quantize(data, qtype)
            logger.info(f"{new_name + ',':<32} {dtype} --> {qtype.name}, shape = {{{', '.join(map(str, reversed(shape)))}}}")
            self.gguf_writer.add_tensor(new_name, qdata, raw_dtype=qtype)

    # -- metadata --
    def set_gguf_parameters(self):
        w = self.gguf_writer
        # TextModel.set_gguf_parameters (the parts a BERT config can reach)
        w.add_block_count(self.block_count)
        if (n := self.find_hparam(["max_position_embeddings", "n_ctx", "n_positions", "max_length",
                                   "max_sequence_length", "model_max_length"], optional=True)) is not None:
            w.add_context_length(n)
        if (n := self.find_hparam(["hidden_size", "n_embd", "dim"], optional=True)) is not None:
            w.add_embedding_length(n)
        if (n := self.find_hparam(["prefix_dense_intermediate_size", "dense_intermediate_size", "intermediate_size",
                                   "n_inner", "hidden_dim"], optional=True)) is not None:
            w.add_feed_forward_length(n)
        if (n := self.find_hparam(["num_attention_heads", "n_head", "n_heads"], optional=True)) is not None:
            w.add_head_count(n)
        if (n := self.find_hparam(["num_key_value_heads", "n_kv_heads"], optional=True)) is not None:
            w.add_head_count_kv(n)
        if self.hparams.get("is_causal") is False:
            w.add_causal_attention(False)
        if (e := self.find_hparam(["rms_norm_eps", "norm_eps"], optional=True)) is not None:
            w.add_layer_norm_rms_eps(e)
        if (e := self.find_hparam(["layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"], optional=True)) is not None:
            w.add_layer_norm_eps(e)
        if (hd := self.hparams.get("head_dim")) is not None:
            w.add_key_length(hd)
            w.add_value_length(hd)
        w.add_file_type(self.ftype)
        # BertModel.set_gguf_parameters
        w.add_causal_attention(False)
        self.try_set_pooling_type()
        if self.cls_out_labels:
            w.add_classifier_output_labels([v for k, v in sorted(self.cls_out_labels.items())])

    def try_set_pooling_type(self):
        pooling_path = None
        modules = self.dir_model / "modules.json"
        if modules.is_file():
            with open(modules, encoding="utf-8") as f:
                for mod in json.load(f):
                    if mod["type"].endswith("Pooling"):
                        pooling_path = mod["path"]
                        break
        P = gguf.PoolingType
        modes = {"mean": P.MEAN, "cls": P.CLS, "lasttoken": P.LAST}
        if pooling_path is not None:
            with open(self.dir_model / pooling_path / "config.json", encoding="utf-8") as f:
                pooling = json.load(f)
            if pooling.get("pooling_mode_mean_tokens"):
                t = P.MEAN
            elif pooling.get("pooling_mode_cls_token"):
                t = P.CLS
            elif pooling.get("pooling_mode_lasttoken"):
                t = P.LAST
            elif pooling.get("pooling_mode") in modes:
                t = modes[pooling["pooling_mode"]]
            else:
                raise NotImplementedError("Only MEAN, CLS, and LAST pooling types supported")
            self.gguf_writer.add_pooling_type(t)
        if (cp := self.hparams.get("classifier_pooling")) is not None:
            if cp not in ("cls", "mean"):
                raise NotImplementedError(f"Unsupported classifier_pooling: {cp}")
            self.gguf_writer.add_classifier_pooling_type(modes[cp])

    # -- vocabulary --
    def _json(self, name: str) -> dict:
        p = self.dir_model / name
        if not p.is_file():
            return {}
        with open(p, encoding="utf-8") as f:
            return json.load(f)

    def get_vocab_base(self) -> tuple[list[str], list[int], str]:
        tj, tc, stm = self._json("tokenizer.json"), self._json("tokenizer_config.json"), self._json("special_tokens_map.json")
        model = tj.get("model", {})
        if tj and model.get("type") != "WordPiece":
            raise NotImplementedError(f"tokenizer model {model.get('type')!r}: only WordPiece (BERT) is handled")
        if tj:
            vocab = dict(model["vocab"])
        else:
            with open(self.dir_model / "vocab.txt", encoding="utf-8") as f:
                vocab = {}
                for i, line in enumerate(f.read().split("\n")):
                    if line and line not in vocab:
                        vocab[line] = i
        # added tokens as transformers' fast tokenizer holds them: id -> (content, special)
        added: dict[int, tuple[str, bool]] = {}
        for at in tj.get("added_tokens", []):
            added[at["id"]] = (at["content"], bool(at.get("special")))
        for i, at in (tc.get("added_tokens_decoder") or {}).items():
            added.setdefault(int(i), (at["content"], bool(at.get("special"))))
        # special tokens named in tokenizer_config / special_tokens_map are registered as special added tokens
        named = []
        for src in (stm, tc):
            for k in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
                v = src.get(k)
                named.append(v.get("content") if isinstance(v, dict) else v)
            for v in src.get("additional_special_tokens") or []:
                named.append(v.get("content") if isinstance(v, dict) else v)
        have = {c for c, _ in added.values()}
        for c in named:
            if isinstance(c, str) and c not in have:
                if c not in vocab:
                    raise ValueError(f"special token {c!r} is not in the vocabulary")
                added[vocab[c]] = (c, True)
                have.add(c)
        for i, (c, _) in added.items():
            vocab[c] = i
        vocab_size = self.hparams.get("vocab_size", len(vocab))
        assert max(vocab.values()) < vocab_size

        reverse = {i: t for t, i in vocab.items()}
        added_content = {c for c, _ in added.values()}
        tokens, toktypes = [], []
        for i in range(vocab_size):
            if i not in reverse:
                tokens.append(f"[PAD{i}]")
                toktypes.append(gguf.TokenType.UNUSED)
                continue
            tok = reverse[i]
            if tok in added_content:
                special = added.get(i, (tok, False))[1]
                if special or self.does_token_look_special(tok):
                    toktypes.append(gguf.TokenType.CONTROL)
                else:
                    tok = tok.replace("\u2581", " ")
                    toktypes.append(gguf.TokenType.USER_DEFINED)
            else:
                toktypes.append(gguf.TokenType.NORMAL)
            tokens.append(tok)

        # get_vocab_base_pre: hash of tokenizer.encode(CHKTXT) ([CLS] ... [SEP], no truncation)
        norm = dict(tj.get("normalizer") or {})
        if not tj:
            norm = {"lowercase": tc.get("do_lower_case", True), "strip_accents": tc.get("strip_accents"),
                    "handle_chinese_chars": tc.get("tokenize_chinese_chars", True)}
        if norm and norm.get("type", "BertNormalizer") != "BertNormalizer":
            raise NotImplementedError(f"normalizer {norm.get('type')!r}: only BertNormalizer is handled")
        unk = model.get("unk_token") or tc.get("unk_token") or "[UNK]"
        wp = WordPiece(vocab, norm, unk, model.get("continuing_subword_prefix", "##"),
                       model.get("max_input_chars_per_word", 100))
        cls_tok = tc.get("cls_token") or stm.get("cls_token") or "[CLS]"
        sep_tok = tc.get("sep_token") or stm.get("sep_token") or "[SEP]"
        cls_tok = cls_tok["content"] if isinstance(cls_tok, dict) else cls_tok
        sep_tok = sep_tok["content"] if isinstance(sep_tok, dict) else sep_tok
        chktok = wp.encode(CHKTXT, vocab[cls_tok], vocab[sep_tok])
        chkhsh = hashlib.sha256(str(chktok).encode()).hexdigest()
        tokpre = pre_table().get(chkhsh)
        if tokpre is None:
            raise NotImplementedError(f"BPE pre-tokenizer was not recognized (chkhsh {chkhsh})")
        logger.info(f"tokenizer.ggml.pre: {tokpre!r} (chkhsh {chkhsh})")
        return tokens, toktypes, tokpre

    @staticmethod
    def does_token_look_special(t: str) -> bool:
        return (t in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (t.startswith("<|") and t.endswith("|>"))
                or (t.startswith("<｜") and t.endswith("｜>")) or (t.startswith("<unused") and t.endswith(">")))

    def set_vocab(self):
        tokens, toktypes, tokpre = self.get_vocab_base()
        w = self.gguf_writer
        w.add_token_type_count(self.hparams.get("type_vocab_size", 1))

        def phantom(tok, toktype):
            if toktype == gguf.TokenType.CONTROL:
                return tok
            if tok.startswith("##"):
                return tok[2:]
            return "\u2581" + tok
        tokens = list(map(phantom, tokens, toktypes))
        w.add_tokenizer_model("bert")
        w.add_tokenizer_pre(tokpre)
        w.add_token_list(tokens)
        w.add_token_types(toktypes)
        sv = gguf.SpecialVocab(self.dir_model, n_vocab=len(tokens))
        sv.add_to_gguf(w)
        if not hasattr(sv, "normalizer_lowercase"):
            # the vendored gguf-py's SpecialVocab also records the BertNormalizer's flags
            norm = self._json("tokenizer.json").get("normalizer") or {}
            self._add_normalizer(norm)

    def _add_normalizer(self, norm: dict):
        K = "tokenizer.ggml.normalizer."
        t = norm.get("type")
        if t == "Lowercase":
            self.gguf_writer.add_bool(K + "lowercase", True)
        elif t == "StripAccents":
            self.gguf_writer.add_bool(K + "strip_accents", True)
        elif t == "BertNormalizer":
            if norm.get("lowercase") is not None:
                self.gguf_writer.add_bool(K + "lowercase", norm["lowercase"])
            if norm.get("strip_accents") is not None:
                self.gguf_writer.add_bool(K + "strip_accents", norm["strip_accents"])
        elif t == "Sequence":
            for n in norm.get("normalizers", []):
                self._add_normalizer(n)

    def prepare_metadata(self):
        w = self.gguf_writer
        total, shared, expert, expert_count = w.get_total_parameter_count()
        md = gguf.Metadata.load(None, self.dir_model, None, total)
        if md.name is None:
            md.name = self.dir_model.name
        if md.size_label is None and total > 0:
            md.size_label = gguf.size_label(total, shared, expert, expert_count)
        w.add_type(gguf.GGUFType.MODEL)
        md.set_gguf_meta_model(w)
        self.set_gguf_parameters()
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        output_type = self.ftype.name.partition("_")[2]
        self.fname_out = self.fname_out.parent / gguf.fill_templated_filename(self.fname_out.name, output_type)
        self.set_vocab()

    def write(self):
        self.prepare_tensors()
        self.prepare_metadata()
        w = self.gguf_writer
        w.write_header_to_file(path=self.fname_out)
        w.write_kv_data_to_file()
        w.write_tensors_to_file(progress=False)
        w.close()
        return self.fname_out


def main():
    if len(sys.argv) != 4 or sys.argv[2] not in FTYPES:
        sys.exit(f"usage: {sys.argv[0]} HF_DIR f32|f16|q8_0 OUT.gguf")
    logging.basicConfig(level=logging.INFO if os.environ.get("VERBOSE") else logging.WARNING,
                        format="%(levelname)s:%(name)s:%(message)s")
    print(f"gguf_bert.py: gguf-py from {Path(gguf.__file__).parent}", file=sys.stderr)
    out = BertConverter(Path(sys.argv[1]), FTYPES[sys.argv[2]], Path(sys.argv[3])).write()
    print(f"wrote {out} ({os.path.getsize(out) / 1e6:.1f} MB)", file=sys.stderr)


if __name__ == "__main__":
    main()
