// ONNX -> kiln IR: imports a graph exported by torch.onnx.export (ai.onnx opsets 13-17)
// op by op onto kiln's generic tensor ops (ir/generic_ops.h), keeping the ONNX value
// and initializer names. Operands that decide shapes (Reshape's shape, Unsqueeze's
// axes, Slice's bounds) become attributes when they are constants; shape arithmetic
// on computed values is left to the constant_folding pass. The result runs on the CPU
// backend with the ONNX inputs ([batch, seq] int64 ids...) and outputs.
// Tested in tests/frontends/onnx_test.cpp against onnxruntime/PyTorch references.
#pragma once

#include <string>
#include <vector>

#include "frontends/onnx/onnx_model.h"
#include "ir/graph.h"

namespace kiln::onnx {

constexpr int64_t kMinOpset = 13;
constexpr int64_t kMaxOpset = 17;

// Throws kiln::Error: kUnsupported naming the node, op and opset for an op or opset
// kiln does not import; kInvalidFile for a graph that reads an undefined value (a
// missing initializer) or is otherwise inconsistent. `label` names the model.
ir::Graph import_onnx_graph(const OnnxModel& model, const std::string& label);
// load_onnx_model + import_onnx_graph. Graph meta gets "format" = "onnx", the opset
// and the producer.
ir::Graph load_onnx_graph(const std::string& path);

// The ONNX ops the importer maps (for messages and `kiln inspect`).
std::vector<std::string> onnx_supported_ops();

}  // namespace kiln::onnx
