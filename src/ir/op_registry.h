// The op registry: every op's schema (input count, optional inputs, attributes) and
// shape inference. One table, queried by the graph builder, the verifier and backends.
// Tested in tests/ir/graph_test.cpp.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace kiln::ir {

struct ValueType {
  DType dtype;
  Shape shape;
};

struct OpSchema {
  std::string name;
  int min_inputs = 0;
  int max_inputs = 0;
  std::vector<std::string> required_attrs;
  std::string doc;
  // Returns the output types from the input types and attributes; throws kiln::Error
  // (kInvalidArgument) naming the mismatch.
  std::function<std::vector<ValueType>(const Node&, const std::vector<const Value*>&)> infer;
};

// The largest k of a TopKLogits node (its CUDA kernel sorts the k candidates of a row
// in shared memory).
constexpr int64_t kTopKLogitsMaxK = 1024;

const OpSchema* find_op_schema(const std::string& op);
// Throws kUnsupported naming the op and listing the known ones.
const OpSchema& get_op_schema(const std::string& op);
std::vector<std::string> registered_ops();

}  // namespace kiln::ir
