// The ONNX file as plain structs: ModelProto, GraphProto, NodeProto, AttributeProto,
// TensorProto (raw_data, typed fields, external data) and ValueInfoProto shapes with
// dim_param, read by the bounds-checked wire reader in protobuf.h. Only what kiln's
// importer uses is kept; unknown fields are skipped. Tested in
// tests/frontends/onnx_test.cpp; fuzzed by fuzz/frontends_onnx_fuzz.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/shape.h"
#include "core/tensor.h"

namespace kiln::onnx {

// TensorProto.DataType values kiln reads.
enum OnnxDType : int32_t {
  kOnnxFloat = 1, kOnnxUint8 = 2, kOnnxInt8 = 3, kOnnxInt32 = 6, kOnnxInt64 = 7,
  kOnnxBool = 9, kOnnxFloat16 = 10, kOnnxDouble = 11, kOnnxBFloat16 = 16,
};
// The kiln dtype holding an ONNX element type (bool -> u8); throws kUnsupported
// naming `what` and the ONNX type for anything else.
DType dtype_from_onnx(int32_t onnx_type, const std::string& what);
const char* onnx_dtype_name(int32_t onnx_type);

struct OnnxTensor {
  std::string name;
  int32_t data_type = 0;
  std::vector<int64_t> dims;
  Tensor value;  // decoded, in dtype_from_onnx(data_type)
};

enum class AttrType : int32_t {
  kUndefined = 0, kFloat = 1, kInt = 2, kString = 3, kTensor = 4, kGraph = 5, kFloats = 6,
  kInts = 7, kStrings = 8, kTensors = 9, kGraphs = 10,
};

struct OnnxAttribute {
  std::string name;
  AttrType type = AttrType::kUndefined;
  float f = 0;
  int64_t i = 0;
  std::string s;
  std::vector<float> floats;
  std::vector<int64_t> ints;
  std::vector<std::string> strings;
  std::shared_ptr<OnnxTensor> t;
};

struct OnnxNode {
  std::string name, op_type, domain;
  std::vector<std::string> inputs, outputs;  // "" marks an absent optional input
  std::vector<OnnxAttribute> attrs;
  const OnnxAttribute* attr(const std::string& name) const;
};

struct OnnxValueInfo {
  std::string name;
  int32_t elem_type = 0;
  bool has_shape = false;
  std::vector<Dim> shape;  // dim_value -> concrete, dim_param -> symbolic, neither -> "?"
};

struct OnnxGraph {
  std::string name;
  std::vector<OnnxNode> nodes;
  std::vector<OnnxTensor> initializers;
  std::vector<OnnxValueInfo> inputs, outputs;
};

struct OnnxModel {
  int64_t ir_version = 0;
  std::string producer_name, producer_version;
  std::vector<std::pair<std::string, int64_t>> opsets;  // (domain, version); "" = ai.onnx
  OnnxGraph graph;
  // The ai.onnx opset (0 when the file declares none).
  int64_t default_opset() const;
};

// Parses a ModelProto held in memory. `label` names the buffer in errors; `base_dir`
// is where external tensor data lives (files relative to the model; empty: external
// data is refused). Throws kiln::Error: kInvalidFile for malformed bytes (with the
// message path and byte offset), kUnsupported for valid but unhandled content.
OnnxModel parse_onnx_model(const uint8_t* data, size_t size, const std::string& label,
                           const std::string& base_dir = "");
// Reads a .onnx file (mmap); external data is resolved next to it.
OnnxModel load_onnx_model(const std::string& path);

}  // namespace kiln::onnx
