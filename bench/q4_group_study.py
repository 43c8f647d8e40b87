#!/usr/bin/env python3
"""What the q4 group size costs in accuracy: a copy of a HuggingFace checkpoint whose Linear
weights are rounded to kiln's q4 grid (core/weight_quant.h: per group of G values along K,
scale = (max - min) / 15 and min stored as f16 under a power-of-two row factor, codes
rounded to nearest, ties to even) and expanded back to f32, for G = 32 (kiln's q4 today, 5
bits a weight with its scale and min), larger groups (64: 4.5 bits, 128: 4.25 bits) and "k",
groups of 32 with 6-bit scales and mins under f16 super-scales per 256 values (4.5 bits, as
GGUF's Q4_K).
Compare each copy with the original through kiln:

  python3 bench/q4_group_study.py .cache/models/all-minilm-l6-v2 /tmp/g 32 64 128
  kiln eval embeddings -m /tmp/g/g128 --weight-dtype f32 \
      --reference .cache/models/all-minilm-l6-v2 --text sentences.txt

A GGUF source (F32/F16/Q8_0/Q4_0/Q4_1 tensors) is expanded to an all-F32 GGUF (ref.gguf, its
own values: the reference) and one copy per group size (gG.gguf) whose quantized block
Linears (every 2-D tensor but the token table) are requantized from those values:

  python3 bench/q4_group_study.py SmolLM2-135M-Instruct.Q4_1.gguf /tmp/s 32 32s16 64 128 k ks16 u8 u8s16
  kiln eval perplexity -m /tmp/s/g128.gguf --weight-dtype f32 --reference /tmp/s/ref.gguf \
      --reference-dtype f32 --text /usr/share/common-licenses/GPL-3 --max-tokens 1500

G = 32 must reproduce `--weight-dtype q4`'s numbers to about 5 digits (the same weights;
kiln's q4 kernels also round x), which checks this emulation. For checkpoints whose
Linears are stored [out, in] (not GPT-2's Conv1D); token and position tables stay as they
are. Only numpy (no `gguf` package): safetensors (f32/f16/bf16) and GGUF files are read and
written directly.
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
    """Rows of w [n, k] on kiln's q4 grid with groups of `group` values (k not a multiple of
    it: a last, shorter group, e.g. 576 = 4 x 128 + 64)."""
    n, k = w.shape
    w = w.astype(np.float32)
    whole = k // group * group
    parts = [w[:, :whole].reshape(n, whole // group, group)] if whole else []
    if whole != k:
        parts.append(w[:, whole:].reshape(n, 1, k - whole))
    stats = [(p.min(axis=2), (p.max(axis=2) - p.min(axis=2)) / 15.0) for p in parts]
    # The row factor: a power of two putting the row's largest scale or |min| in [2^14, 2^15].
    big = np.max([np.maximum(sc.max(axis=1), np.abs(lo).max(axis=1)) for lo, sc in stats], axis=0)
    big = big.astype(np.float64)
    e = np.where(big > 0, 15 - np.frexp(np.where(big > 0, big, 1.0))[1], 0)
    factor = np.exp2(np.maximum(e, -126)).astype(np.float32)[:, None]
    out = []
    for p, (lo, scale) in zip(parts, stats):
        s16 = f16(scale * factor) / factor
        m16 = f16(lo * factor) / factor
        safe = np.where(s16 > 0, s16, 1.0)
        q = np.where(s16[..., None] > 0, np.rint((p - m16[..., None]) / safe[..., None]), 0.0)
        q = np.clip(q, 0, 15)
        out.append((s16[..., None] * q + m16[..., None]).reshape(n, -1))
    return np.concatenate(out, axis=1).astype(np.float32)


def q4_superblocks(w):
    """Rows of w [n, k] on a 4.5-bit grid like GGUF's Q4_K: groups of 32 whose scale and min
    are 6-bit codes (scale 0..63, min -32..31) times f16 super-scales shared by 256 values
    (8 groups; a shorter last super-block where k is not a multiple of 256)."""
    n, k = w.shape
    g = w.astype(np.float32).reshape(n, k // 32, 32)
    lo, scale = g.min(axis=2), (g.max(axis=2) - g.min(axis=2)) / 15.0
    out_s, out_m = np.zeros_like(scale), np.zeros_like(lo)
    for b0 in range(0, k // 32, 8):
        sl = slice(b0, min(b0 + 8, k // 32))
        d = f16(scale[:, sl].max(axis=1) / 63.0)[:, None]
        dm = f16(np.abs(lo[:, sl]).max(axis=1) / 31.0)[:, None]
        sc = np.clip(np.rint(scale[:, sl] / np.where(d > 0, d, 1.0)), 0, 63)
        mc = np.clip(np.rint(lo[:, sl] / np.where(dm > 0, dm, 1.0)), -32, 31)
        out_s[:, sl], out_m[:, sl] = d * sc, dm * mc
    safe = np.where(out_s > 0, out_s, 1.0)
    q = np.where(out_s[..., None] > 0, np.rint((g - out_m[..., None]) / safe[..., None]), 0.0)
    return (out_s[..., None] * np.clip(q, 0, 15) + out_m[..., None]).reshape(n, k)


def _codes_table(kind):
    """The values a 16-bit (scale, min) pair's halves stand for, relative to a power-of-two
    reference: "f8": scale as an unsigned E4M4 float (256 values: exponent 0 subnormal),
    min as a sign and an E4M3 magnitude."""
    if kind == "scale":
        e, m = np.arange(256) >> 4, np.arange(256) & 15
        return np.where(e > 0, np.exp2(e - 15.0) * (1 + m / 16.0), np.exp2(-14.0) * m / 16.0)
    e, m = np.arange(128) >> 3, np.arange(128) & 7
    return np.where(e > 0, np.exp2(e - 15.0) * (1 + m / 8.0), np.exp2(-14.0) * m / 8.0)


def _round_near(x, table):
    i = np.clip(np.searchsorted(table, x), 1, len(table) - 1)
    return np.where(x - table[i - 1] <= table[i] - x, table[i - 1], table[i])


def q4_compact(w, kind):
    """Rows of w [n, k] on a q4 grid with groups of 32 whose scale and min take 16 bits
    together (4.5 bits a weight), each rounded to nearest, then codes to nearest (clamped).
    (Rounding the min down and then the scale up, so the grid spans the group, measured
    worse on all-MiniLM-L6-v2: 1 - cosine 3.3-3.5e-2 against 2.6-3.1e-2.)
      "f8": E4M4 scale and sign + E4M3 min under a power of two per row;
      "u8": an 8-bit scale code and a signed 8-bit min code times powers of two per
            super-block of 256 values (one for scales, one for mins; 4.56 bits): kiln's
            q4 since session 55 (core/weight_quant.h);
      "r8": the same codes under powers of two per row."""
    n, k = w.shape
    g = w.astype(np.float64).reshape(n, k // 32, 32)
    lo, hi = g.min(axis=2), g.max(axis=2)
    if kind == "f8":
        st, mt = _codes_table("scale"), _codes_table("min")
        big = np.maximum((hi - lo).max(axis=1) / 15.0, np.abs(lo).max(axis=1))
        big = np.where(big > 0, big, 1.0)
        ref = np.exp2(np.ceil(np.log2(big / mt[-1])))[:, None]  # the row's |min| and scales fit
        mn = np.sign(lo) * _round_near(np.abs(lo) / ref, mt) * ref
        sc = _round_near((hi - lo) / 15.0 / ref, st) * ref
    else:
        span = 8 if kind == "u8" else k // 32
        mn, sc = np.zeros_like(lo), np.zeros_like(lo)
        for b0 in range(0, k // 32, span):
            sl = slice(b0, min(b0 + span, k // 32))
            amin = np.abs(lo[:, sl]).max(axis=1, keepdims=True)
            em = np.exp2(np.ceil(np.log2(np.where(amin > 0, amin, 1.0) / 127.0)))
            mn[:, sl] = np.rint(lo[:, sl] / em) * em
            need = (hi[:, sl] - lo[:, sl]) / 15.0
            top = need.max(axis=1, keepdims=True)
            es = np.exp2(np.ceil(np.log2(np.where(top > 0, top, 1.0) / 255.0)))
            sc[:, sl] = np.rint(need / es) * es
    safe = np.where(sc > 0, sc, 1.0)
    q = np.where(sc[..., None] > 0, np.rint((g - mn[..., None]) / safe[..., None]), 0.0)
    return (sc[..., None] * np.clip(q, 0, 15) + mn[..., None]).reshape(n, k).astype(np.float32)


def requantize(w, spec):
    """spec "G": groups of G from column 0; "GsS": groups of G starting S columns in (the
    row rotated by S first and back after: a second rounding on a grid offset from a
    checkpoint's own, for a checkpoint that is already quantized); "k" (and "ksS"):
    q4_superblocks."""
    group, _, shift = spec.partition("s")
    shift = int(shift or 0)
    if group == "k":
        fn = q4_superblocks
    elif group in ("f8", "u8", "r8"):
        fn = lambda v: q4_compact(v, group)
    else:
        fn = lambda v: q4_roundtrip(v, int(group))
    if not shift:
        return fn(w)
    return np.roll(fn(np.roll(w, -shift, axis=1)), shift, axis=1)


def bits(spec):
    group = spec.partition("s")[0]
    return {"k": 4.5, "f8": 4.5, "r8": 4.5, "u8": 4.5625}.get(group) or 4 + 32 / int(group)


def is_linear_weight(name, arr):
    # Block Linears only: embeddings, norms and the pooler stay as they are.
    tables = ("embeddings", "embed_tokens", "wte", "wpe", "pooler")
    return (not isinstance(arr, tuple) and arr.ndim == 2 and name.endswith(".weight")
            and not any(t in name for t in tables))


# ---- GGUF (version 2/3): metadata copied as its bytes, tensors rewritten as F32 ----
GGUF_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # type: bytes
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q4_1, GGML_Q8_0 = 0, 1, 2, 3, 8


class Reader:
    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def take(self, fmt):
        v = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return v[0]

    def string(self):
        n = self.take("Q")
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8")
        self.pos += n
        return s

    def skip_value(self, t):
        if t == 8:
            self.string()
        elif t == 9:
            et, count = self.take("I"), self.take("Q")
            for _ in range(count):
                self.skip_value(et)
        else:
            self.pos += GGUF_SCALAR[t]


def dequantize(raw, ggml_type, count):
    if ggml_type == GGML_F32:
        return np.frombuffer(raw, dtype=np.float32, count=count).copy()
    if ggml_type == GGML_F16:
        return np.frombuffer(raw, dtype=np.float16, count=count).astype(np.float32)
    blocks = count // 32
    if ggml_type == GGML_Q8_0:  # f16 d, 32 int8
        b = np.frombuffer(raw, dtype=np.uint8, count=blocks * 34).reshape(blocks, 34)
        d = b[:, :2].copy().view(np.float16).astype(np.float32)
        return (d * b[:, 2:].view(np.int8).astype(np.float32)).reshape(-1)
    if ggml_type in (GGML_Q4_0, GGML_Q4_1):  # f16 d (, f16 m), 16 bytes: j low, j + 16 high
        size = 18 if ggml_type == GGML_Q4_0 else 20
        b = np.frombuffer(raw, dtype=np.uint8, count=blocks * size).reshape(blocks, size)
        d = b[:, :2].copy().view(np.float16).astype(np.float32)
        qs = b[:, size - 16:]
        q = np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.float32)
        if ggml_type == GGML_Q4_0:
            return (d * (q - 8.0)).reshape(-1)
        m = b[:, 2:4].copy().view(np.float16).astype(np.float32)
        return (d * q + m).reshape(-1)
    raise SystemExit(f"tensor type {ggml_type}: not handled by this script")


def read_gguf(path):
    buf = memoryview(open(path, "rb").read())  # tensors below are views, not copies
    r = Reader(buf)
    if buf[:4] != b"GGUF":
        raise SystemExit(f"{path}: not a GGUF file")
    r.pos = 4
    version, n_tensors, n_kv = r.take("I"), r.take("Q"), r.take("Q")
    kv_start, align = r.pos, 32
    for _ in range(n_kv):
        key, t = r.string(), r.take("I")
        if key == "general.alignment":
            align = r.take("I")
        else:
            r.skip_value(t)
    kv = bytes(buf[kv_start:r.pos])
    infos = []
    for _ in range(n_tensors):
        name, nd = r.string(), r.take("I")
        dims = [r.take("Q") for _ in range(nd)]
        infos.append((name, dims, r.take("I"), r.take("Q")))
    data = (r.pos + align - 1) // align * align
    tensors = []
    for name, dims, t, off in infos:
        count = int(np.prod(dims))
        arr = dequantize(buf[data + off:], t, count).reshape(list(reversed(dims)))
        tensors.append((name, arr, t))
    return version, n_kv, kv, align, tensors


def write_gguf(path, version, n_kv, kv, align, tensors):
    infos, blobs, off = b"", [], 0
    for name, arr, _ in tensors:
        nb = name.encode()
        dims = list(reversed(arr.shape))
        infos += struct.pack("<Q", len(nb)) + nb + struct.pack("<I", len(dims))
        infos += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", GGML_F32, off)
        b = np.ascontiguousarray(arr, dtype=np.float32).tobytes()
        blobs.append(b)
        off += (len(b) + align - 1) // align * align
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), n_kv) + kv + infos
    with open(path, "wb") as f:
        f.write(head + b"\0" * ((align - len(head) % align) % align))
        for b in blobs:
            f.write(b + b"\0" * ((align - len(b) % align) % align))


def gguf_main(src, out, groups):
    version, n_kv, kv, align, tensors = read_gguf(src)
    os.makedirs(out, exist_ok=True)
    write_gguf(os.path.join(out, "ref.gguf"), version, n_kv, kv, align, tensors)
    print(f"{out}/ref.gguf: {len(tensors)} tensors as F32")
    quantized = (GGML_Q4_0, GGML_Q4_1, GGML_Q8_0)
    for group in groups:
        done, copy = 0, []
        for name, arr, t in tensors:
            if arr.ndim == 2 and t in quantized and "token_embd" not in name:
                arr = requantize(arr, group)
                done += 1
            copy.append((name, arr, t))
        write_gguf(os.path.join(out, f"g{group}.gguf"), version, n_kv, kv, align, copy)
        print(f"{out}/g{group}.gguf: {done} block Linears on the q4 grid with groups of {group} "
              f"({bits(group):.2f} bits a weight)")


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    src, out, groups = sys.argv[1], sys.argv[2], sys.argv[3:]
    if src.endswith(".gguf"):
        return gguf_main(src, out, groups)
    files = [f for f in os.listdir(src) if f.endswith(".safetensors")]
    for group in groups:
        dst = os.path.join(out, f"g{group}")
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors", "onnx", "openvino"))
        done = 0
        for f in files:
            tensors, meta = read_safetensors(os.path.join(src, f))
            for name, arr in tensors.items():
                if is_linear_weight(name, arr):
                    tensors[name] = requantize(arr, group)
                    done += 1
            write_safetensors(os.path.join(dst, f), tensors, meta)
        print(f"{dst}: {done} Linear weights on the q4 grid with groups of {group} "
              f"({bits(group):.2f} bits a weight)")


if __name__ == "__main__":
    main()
