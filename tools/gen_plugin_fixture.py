#!/usr/bin/env python3
"""Generate the ONNX fixture of the plugin tests (tests/plugins/plugin_test.cpp and
tests/tools/cli_test.sh): a model using the custom op of examples/plugins/.

tests/fixtures/onnx/scaled_softplus/model.onnx computes
    y = com.example::ScaledSoftplus(x + b, scale; beta=2, threshold=3) - b
for x: float32 [batch, 4] (batch dynamic), b and scale float32 [4] initializers, opset
imports ai.onnx 14 and com.example 1. It is what an exporter emits for a model with its
own activation function (torch.onnx's custom-op symbolic gives such a node); onnx's
checker accepts it. The C++ test builds the same graph by hand and checks both against
softplus computed in double.

Usage (onnx from PyPI):
  python3 -m venv /tmp/onnxvenv && /tmp/onnxvenv/bin/pip install onnx
  /tmp/onnxvenv/bin/python tools/gen_plugin_fixture.py --out tests/fixtures/onnx/scaled_softplus
Generated with onnx 1.23.2, Python 3.11.7.
"""

import argparse
import os

import onnx
from onnx import TensorProto, helper

BIAS = [0.5, -1.0, 0.0, 2.0]
SCALE = [1.0, 0.5, -2.0, 3.0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/onnx/scaled_softplus")
    out = ap.parse_args().out
    nodes = [
        helper.make_node("Add", ["x", "b"], ["s"], name="add"),
        helper.make_node("ScaledSoftplus", ["s", "scale"], ["t"], name="softplus", domain="com.example",
                         beta=2.0, threshold=3.0),
        helper.make_node("Sub", ["t", "b"], ["y"], name="sub"),
    ]
    graph = helper.make_graph(
        nodes, "scaled_softplus",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        initializer=[helper.make_tensor("b", TensorProto.FLOAT, [4], BIAS),
                     helper.make_tensor("scale", TensorProto.FLOAT, [4], SCALE)])
    model = helper.make_model(graph, producer_name="kiln gen_plugin_fixture.py",
                              opset_imports=[helper.make_opsetid("", 14), helper.make_opsetid("com.example", 1)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    os.makedirs(out, exist_ok=True)
    onnx.save(model, os.path.join(out, "model.onnx"))
    print("wrote", os.path.join(out, "model.onnx"), os.path.getsize(os.path.join(out, "model.onnx")), "bytes")


if __name__ == "__main__":
    main()
