// The decode stack (ops/decode_stack.h) planned for a compiled graph: when the graph's
// nodes from the first layer's RMSNorm to the final AddRMSNorm are a plain Llama-family
// stack - per layer a packed q|k|v Linear (bias allowed), Attention with RoPE over the
// whole head (packed, causal, layer = its index), o Linear, AddRMSNorm, gate|up Linear
// with SwiGLU, down Linear, AddRMSNorm; 16-bit weights in the activation dtype, no
// quantized or fused-norm Linears, and no value of the run read outside it - decode steps
// of one sequence and one token run that node range as one kernel. The weights are the
// graph's own device copies (DeviceWeights), so planning adds no weight memory.
// KILN_CUDA_DECODE_STACK, read when a graph is compiled: 1 where it applies, 0 (default)
// never - on the H200 it is still slower than the kernel-per-node path (bench/RESULTS.md,
// cuda_decode_stack_bench). Tested in tests/backends/cuda/decode_stack_test.cpp.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "backends/cuda/cuda_context.h"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/ops/decode_stack.h"

namespace kiln::cuda {

class CudaDecodeStack {
 public:
  // KILN_CUDA_DECODE_STACK: 1 true, unset or 0 false; anything else is an error naming it.
  static bool enabled_from_env();
  // The stack of graph g, or null (with why it does not apply, when `why` is given).
  static std::unique_ptr<CudaDecodeStack> plan(const ir::Graph& g, PrepareContext& pc, std::string* why = nullptr);

  // The node range it replaces: [first, last]; `last` is the final AddRMSNorm.
  size_t first() const { return first_; }
  size_t last() const { return last_; }
  int layers() const { return shape_.layers; }
  // Whether a step takes it: one sequence decoding one token through a pool that holds
  // the activation dtype.
  bool takes(const StepInfo& step, const CudaKv* kv) const;
  // Runs nodes [first, last] for such a step: c is the OpContext of node `last` (its
  // outputs are allocated through it), vals the graph's device values.
  void run(OpContext& c, const std::vector<DevTensor>& vals) const;

 private:
  CudaDecodeStack() = default;
  size_t first_ = 0, last_ = 0;
  DType act_ = DType::kBF16;
  DecodeStackShape shape_;
  ir::ValueId x_ = ir::kNoValue, positions_ = ir::kNoValue;
  float scale_ = 0.0f, final_eps_ = 0.0f;
  const float* inv_freq_ = nullptr;
  const float* final_norm_ = nullptr;
  int grid_ = 0;
  DeviceBuffer layers_;   // DecodeStackLayer[layers]
  mutable DeviceBuffer scratch_;  // decode_stack_scratch_bytes, zeroed once
};

}  // namespace kiln::cuda
