// Generic tensor ops (ONNX semantics: numpy broadcasting, any rank, int64 shape
// arithmetic, bool as u8) that imported graphs run op by op. Internal to the op
// registry; see generic_ops.cpp.
#pragma once

#include <map>
#include <string>

#include "ir/op_registry.h"

namespace kiln::ir {

void add_generic_op_schemas(std::map<std::string, OpSchema>& registry);

// Numpy broadcasting of two shapes; symbolic dims broadcast against 1 or an equal
// dim. Throws kInvalidArgument naming the node on a concrete mismatch.
Shape broadcast_shapes(const Node& n, const Shape& a, const Shape& b);
// Normalizes an axis in [-rank, rank) to [0, rank); throws naming the node.
int64_t normalize_axis(const Node& n, int64_t axis, int64_t rank);

}  // namespace kiln::ir
