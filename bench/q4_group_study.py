#!/usr/bin/env python3
"""What the q4 group size costs in accuracy: a copy of a HuggingFace checkpoint whose Linear
weights are rounded to kiln's q4 grid (core/weight_quant.h: per group of G values along K,
scale = (max - min) / 15 and min stored as f16 under a power-of-two row factor, codes
rounded to nearest, ties to even) and expanded back to f32, for G = 32 (kiln's q4 today, 5
bits a weight with its scale and min) and larger groups (64: 4.5 bits, 128: 4.25 bits).
Compare each copy with the original through kiln:

  python3 bench/q4_group_study.py .cache/models/all-minilm-l6-v2 /tmp/g 32 64 128
  kiln eval embeddings -m /tmp/g/g128 --weight-dtype f32 \
      --reference .cache/models/all-minilm-l6-v2 --text sentences.txt

G = 32 must reproduce `--weight-dtype q4`'s numbers to about 5 digits (the same weights;
kiln's q4 kernels also round x), which checks this emulation. For checkpoints whose
Linears are stored [out, in] (not GPT-2's Conv1D); token and position tables stay as they are. Only numpy; safetensors files read and written directly (f32/f16/bf16 tensors).
"""
import json
import os
import shutil
import struct
import sys

import numpy as np

DTYPES = {"F32": np.float32, "F16": np.float16}


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = data[a:b]
        if info["dtype"] == "BF16":
            u = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
            arr = u.view(np.float32)
        elif info["dtype"] in DTYPES:
            arr = np.frombuffer(raw, dtype=DTYPES[info["dtype"]]).astype(np.float32)
        else:  # integer buffers (position ids): kept as their bytes
            tensors[name] = (info["dtype"], info["shape"], raw)
            continue
        tensors[name] = arr.reshape(info["shape"]).copy()
    return tensors, header.get("__metadata__")


def write_safetensors(path, tensors, metadata):
    header, blobs, off = {}, [], 0
    for name, arr in tensors.items():
        if isinstance(arr, tuple):
            dtype, shape, b = arr
        else:
            dtype, shape, b = "F32", list(arr.shape), np.ascontiguousarray(arr, dtype=np.float32).tobytes()
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def f16(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)


def q4_roundtrip(w, group):
    """Rows of w [n, k] on kiln's q4 grid with groups of `group` values."""
    n, k = w.shape
    assert k % group == 0, (k, group)
    g = w.reshape(n, k // group, group).astype(np.float32)
    lo, hi = g.min(axis=2), g.max(axis=2)
    scale = (hi - lo) / 15.0
    # The row factor: a power of two putting the row's largest scale or |min| in [2^14, 2^15].
    big = np.maximum(scale.max(axis=1), np.abs(lo).max(axis=1)).astype(np.float64)
    e = np.where(big > 0, 15 - np.frexp(np.where(big > 0, big, 1.0))[1], 0)  # big * 2^e in [2^14, 2^15)
    factor = np.exp2(np.maximum(e, -126)).astype(np.float32)[:, None]
    s16 = f16(scale * factor) / factor
    m16 = f16(lo * factor) / factor
    safe = np.where(s16 > 0, s16, 1.0)
    q = np.where(s16[..., None] > 0, np.rint((g - m16[..., None]) / safe[..., None]), 0.0)
    q = np.clip(q, 0, 15)
    return (s16[..., None] * q + m16[..., None]).reshape(n, k).astype(np.float32)


def is_linear_weight(name, arr):
    # Block Linears only: embeddings, norms and the pooler stay as they are.
    tables = ("embeddings", "embed_tokens", "wte", "wpe", "pooler")
    return (not isinstance(arr, tuple) and arr.ndim == 2 and name.endswith(".weight")
            and not any(t in name for t in tables))


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    src, out, groups = sys.argv[1], sys.argv[2], [int(g) for g in sys.argv[3:]]
    files = [f for f in os.listdir(src) if f.endswith(".safetensors")]
    for group in groups:
        dst = os.path.join(out, f"g{group}")
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors", "onnx", "openvino"))
        done = 0
        for f in files:
            tensors, meta = read_safetensors(os.path.join(src, f))
            for name, arr in tensors.items():
                if is_linear_weight(name, arr) and arr.shape[1] % group == 0:
                    tensors[name] = q4_roundtrip(arr, group)
                    done += 1
            write_safetensors(os.path.join(dst, f), tensors, meta)
        print(f"{dst}: {done} Linear weights on the q4 grid with groups of {group} "
              f"({4 + 32 / group:.2f} bits a weight)")


if __name__ == "__main__":
    main()
