// Megatron-style tensor parallelism as a graph transform: each rank gets a copy of the
// graph in which the attention heads and the MLP's inner dimension are split.
// Q/K/V and up/gate projections become column-parallel (their output rows sharded by
// head or by inner unit), output and down projections row-parallel (their input
// columns sharded) followed by an AllReduce; everything else is replicated. K/V heads
// are split too (so each rank's KV cache holds only its heads), or replicated when
// there are more ranks than K/V heads.
//
// The graph may be the faithful one (separate q/k/v Linears, Silu*Mul) or an optimized,
// quantized one (packed q|k|v Linear and Attention, gate|up Linear with a swiglu
// epilogue or a SwiGLU/GeGLU node, SmoothQuant Muls, W8A8/FP8/q4/q8 Linears): a quantized
// model is quantized unsharded and then sharded, so that every rank rounds exactly as
// the unsharded model does (docs/tensor_parallel.md):
//  - per-output-channel things (W8A8 weight scales, q4/q8 rows) follow the rows of a
//    column-parallel Linear, per-tensor clips (act_amax, FP8 out_amax) stay the unsharded
//    tensor's; a row-parallel Linear keeps its rows' scales whole
//    (W8A8: attr weight_amax, the unsharded rows' max |w|; q4/q8: the row image quantized
//    whole, then split by groups of 32) and its static activation clip;
//  - FP8's per-tensor weight scale is the unsharded tensor's (E4M3 codes stored first,
//    attr weight_scale);
//  - per-input-channel factors on a row-parallel Linear's input (SmoothQuant Muls) are
//    split with its columns.
// Refused with a message naming the Linear: per-token activation scales or a Hadamard
// rotation on a row-parallel Linear (each rank would see only its slice of a row), q4/q8
// groups that a rank's columns would cut, and epilogues (activation, fused norm or
// residual) on a row-parallel Linear, which must all-reduce its partial sums first.
// Tested in tests/parallel/tensor_parallel_test.cpp and tp_quant_test.cpp.
#pragma once

#include <string>

#include "models/model_builder.h"

namespace kiln {

struct ShardOptions {
  // The GEMM weight storage the ranks compile with (CompileOptions::weight_dtype), for
  // Linears without a precision attr: a row-parallel Linear stored q8/q4 is quantized
  // whole here and its groups split (see the file comment). "" leaves weights as they are.
  std::string weight_dtype;
};

// The graph rank `rank` of `world` runs. Throws kUnsupported when the heads or the MLP
// width do not divide by `world`, or for the refusals of the file comment.
BuiltModel shard_tensor_parallel(const BuiltModel& model, int rank, int world,
                                 const ShardOptions& options = {});

}  // namespace kiln
