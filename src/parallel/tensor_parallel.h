// Megatron-style tensor parallelism as a graph transform: each rank gets a copy of the
// faithful graph in which the attention heads and the MLP's inner dimension are split.
// Q/K/V and up/gate projections become column-parallel (their output rows sharded by
// head or by inner unit), output and down projections row-parallel (their input
// columns sharded) followed by an AllReduce; everything else is replicated. K/V heads
// are split too (so each rank's KV cache holds only its heads), or replicated when
// there are more ranks than K/V heads. Tested in tests/parallel/tensor_parallel_test.cpp
// (sharded runs equal the unsharded model).
#pragma once

#include "models/model_builder.h"

namespace kiln {

// The graph rank `rank` of `world` runs. Throws kUnsupported when the heads or the MLP
// width do not divide by `world`.
BuiltModel shard_tensor_parallel(const BuiltModel& model, int rank, int world);

}  // namespace kiln
