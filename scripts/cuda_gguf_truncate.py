#!/usr/bin/env python3
"""Writes a GGUF holding only the first N transformer blocks of a llama-family GGUF.

Why: the device machine takes at most 64 MiB per call, the real SmolLM2-135M Q4_1 GGUF is
94 MiB. The truncated model keeps the real embedding, head shapes and weights of its
blocks, so CUDA-vs-CPU greedy comparisons on it exercise real data (its text is not
meaningful). Usage: cuda_gguf_truncate.py IN.gguf OUT.gguf N_BLOCKS [--q4-embedding]
--q4-embedding requantizes a Q8_0 token_embd.weight to Q4_0 (llama.cpp's reference rule; needs
numpy): SmolLM2's tied embedding is 30 MB as Q8_0, 16 MB as Q4_0, so a device call can carry
the model beside a test binary (and the tied LM head then runs the q4 GEMV).
"""
import re
import struct
import sys

SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def main():
    src, dst, keep = sys.argv[1], sys.argv[2], int(sys.argv[3])
    q4_embd = "--q4-embedding" in sys.argv[4:]
    d = open(src, "rb").read()
    o = 0
    magic, ver, nt, nkv = struct.unpack_from("<4sIQQ", d, o)
    o += 24
    assert magic == b"GGUF", "not a GGUF file"

    def rstr():
        nonlocal o
        n, = struct.unpack_from("<Q", d, o)
        s = d[o + 8:o + 8 + n]
        o += 8 + n
        return s

    def skip_val(t):
        nonlocal o
        if t == 8:
            rstr()
        elif t == 9:
            at, n = struct.unpack_from("<IQ", d, o)
            o += 12
            for _ in range(n):
                skip_val(at)
        else:
            o += SIZES[t]

    kvs, align = [], 32
    for _ in range(nkv):
        start = o
        key = rstr().decode()
        t, = struct.unpack_from("<I", d, o)
        o += 4
        vstart = o
        skip_val(t)
        raw = bytearray(d[start:o])
        if key.endswith(".block_count"):
            fmt = {4: "<I", 5: "<i", 10: "<Q", 11: "<q"}[t]
            struct.pack_into(fmt, raw, vstart - start, keep)
        if key == "general.alignment":
            align, = struct.unpack_from("<I", d, vstart)
        kvs.append(bytes(raw))
    tensors = []
    for _ in range(nt):
        name = rstr()
        nd, = struct.unpack_from("<I", d, o)
        o += 4
        dims = struct.unpack_from(f"<{nd}Q", d, o)
        o += 8 * nd
        typ, off = struct.unpack_from("<IQ", d, o)
        o += 12
        tensors.append([name, dims, typ, off])
    data_start = (o + align - 1) // align * align
    offs = sorted(t[3] for t in tensors) + [len(d) - data_start]
    size_of = {t[3]: offs[offs.index(t[3]) + 1] - t[3] for t in tensors}
    kept = [t for t in tensors
            if not (m := re.match(rb"blk\.(\d+)\.", t[0])) or int(m.group(1)) < keep]
    out = bytearray(struct.pack("<4sIQQ", b"GGUF", ver, len(kept), len(kvs)))
    for kv in kvs:
        out += kv
    blobs, pos = [], 0
    for t in kept:
        blob = d[data_start + t[3]:data_start + t[3] + size_of[t[3]]]
        if q4_embd and t[0] == b"token_embd.weight" and t[2] == 8:
            n = 1
            for x in t[1]:
                n *= x
            blob, t[2] = q8_0_to_q4_0(blob, n), 2
        out += struct.pack("<Q", len(t[0])) + t[0] + struct.pack("<I", len(t[1]))
        out += struct.pack(f"<{len(t[1])}Q", *t[1]) + struct.pack("<IQ", t[2], pos)
        blobs.append(blob)
        pos += (len(blob) + align - 1) // align * align
    out += b"\0" * ((-len(out)) % align)
    for blob in blobs:
        out += blob + b"\0" * ((-len(blob)) % align)
    open(dst, "wb").write(out)
    print(f"{dst}: {len(kept)} of {len(tensors)} tensors, {keep} blocks, {len(out) / 2**20:.1f} MiB")


def q8_0_to_q4_0(blob, n):
    """Q8_0 blocks (f16 d, 32 int8) -> Q4_0 blocks (f16 d, 16 bytes: element j in the low
    nibble of byte j, element j + 16 in the high nibble), as llama.cpp's quantize_row_q4_0_ref."""
    import numpy as np
    nb = n // 32
    q8 = np.frombuffer(blob, dtype=np.uint8, count=nb * 34).reshape(nb, 34)
    x = q8[:, 2:].copy().view(np.int8).astype(np.float32) * q8[:, :2].copy().view(np.float16).astype(np.float32)
    idx = np.abs(x).argmax(axis=1)
    mx = x[np.arange(nb), idx]
    d = mx / -8.0
    inv = np.where(d != 0, 1.0 / np.where(d != 0, d, 1.0), 0.0).astype(np.float32)
    q = np.minimum(15, (x * inv[:, None] + 8.5).astype(np.int8)).astype(np.uint8)
    out = np.empty((nb, 18), dtype=np.uint8)
    out[:, :2] = d.astype(np.float16).reshape(nb, 1).view(np.uint8)
    out[:, 2:] = q[:, :16] | (q[:, 16:] << 4)
    return out.tobytes()


if __name__ == "__main__":
    main()
