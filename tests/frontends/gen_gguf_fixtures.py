#!/usr/bin/env python3
# Generates tests/fixtures/frontends/gguf_quants.json: random blocks of every ggml quant
# type and their dequantized values from the Python `gguf` package (an implementation
# independent of ours), plus the first values of three tensors of the real SmolLM2
# GGUF when it is present. Run: python3 tests/frontends/gen_gguf_fixtures.py
import json, os, sys
import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
rng = np.random.default_rng(1234)
# (type, bytes per block, offsets of f16 scale fields, offset of an f32 scale)
TYPES = [(T.Q4_0, 18, [0], None), (T.Q4_1, 20, [0, 2], None), (T.Q5_0, 22, [0], None),
         (T.Q5_1, 24, [0, 2], None), (T.Q8_0, 34, [0], None), (T.Q2_K, 84, [80, 82], None),
         (T.Q3_K, 110, [108], None), (T.Q4_K, 144, [0, 2], None), (T.Q5_K, 176, [0, 2], None),
         (T.Q6_K, 210, [208], None)]  # Q8_K: gguf-py has no dequantizer; tested by hand
out = {"blocks": [], "real": []}
for qt, bsize, f16_offs, f32_off in TYPES:
    nblocks = 2
    raw = bytearray(rng.integers(0, 256, size=bsize * nblocks, dtype=np.uint8).tobytes())
    for b in range(nblocks):
        for o in f16_offs:  # sane, signed scales instead of random (maybe NaN) bits
            raw[b * bsize + o: b * bsize + o + 2] = np.float16(rng.uniform(-0.1, 0.1)).tobytes()
        if f32_off is not None:
            raw[b * bsize + f32_off: b * bsize + f32_off + 4] = np.float32(rng.uniform(-0.1, 0.1)).tobytes()
    vals = gguf.quants.dequantize(np.frombuffer(bytes(raw), dtype=np.uint8), qt).reshape(-1)
    out["blocks"].append({"type": qt.name, "type_id": int(qt), "hex": bytes(raw).hex(),
                          "values": [float(v) for v in vals]})

path = os.environ.get("KILN_MODELS_DIR", os.path.join(root, ".cache/models"))
path = os.path.join(path, "smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf")
if os.path.exists(path):
    r = gguf.GGUFReader(path)
    for name in ["token_embd.weight", "blk.0.attn_q.weight", "blk.3.ffn_down.weight",
                 "output_norm.weight"]:
        t = next(t for t in r.tensors if t.name == name)
        v = gguf.quants.dequantize(t.data, t.tensor_type)
        # v is [rows, row] in numpy (PyTorch) order; keep the first 64 of rows 0 and 1
        v2 = v.reshape(-1, v.shape[-1]) if v.ndim > 1 else v.reshape(1, -1)
        out["real"].append({"name": name, "type": t.tensor_type.name,
                            "shape": [int(s) for s in v.shape],
                            "row0": [float(x) for x in v2[0, :64]],
                            "row_last": [float(x) for x in v2[-1, -64:]]})
else:
    print("no", path, "- skipping real-file values", file=sys.stderr)

dst = os.path.join(root, "tests/fixtures/frontends/gguf_quants.json")
with open(dst, "w") as f:
    json.dump(out, f)
print("wrote", dst, os.path.getsize(dst), "bytes")
