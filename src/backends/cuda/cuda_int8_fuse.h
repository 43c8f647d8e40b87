// The W8A8 Linear's activation quantize fused into its producer (mirroring the FP8 path,
// cuda_fp8_linear.h): where a LayerNorm / RMSNorm / AddLayerNorm / AddRMSNorm output, a
// SmoothQuant Mul's (quant/w8a8.h: post-LN models such as BERT, whose norm outputs also
// feed the residual, smooth through a Mul), or a W8A8 Linear's with a gelu_erf, gelu_tanh
// or silu activation (BERT's FFN up projection feeding the down projection, applied in a
// pass after its GEMM: cuda_w8a8_linear.h) is read only by W8A8 Linears (as their input
// x) that share one static input scale, or that all quantize per token, that kernel writes
// the int8 codes itself (norm.h's *_int8 launchers, elementwise_int8.h) and the Linears
// skip their quantize pass; codes and row scales are those of the unfused pair, bit for
// bit. So does the attention feeding the o projection, with a static scale only (its
// flash kernel's epilogue writes the codes, attention_flash.cuh; its other plans write T
// into scratch and quantize it): a per-token scale needs the max over a token's whole row,
// all heads, which no attention CTA sees, so a per-token o projection keeps its quantize
// pass. KILN_CUDA_INT8_FUSE=0 keeps the separate pass.
// The value then travels in the buffer the activation was planned for: t x k int8 codes,
// and with per-token scales the t f32 row scales after them (int8_row_scales_offset).
// A norm whose output other nodes read too (post-LN BERT without SmoothQuant: each norm
// output is also the next residual) keeps its T output and writes the codes beside it in
// the same kernel (the dual output, norm.h's *_dual launchers). Where those codes live:
// the CUDA compiled graph runs its own copy of the graph in which such a norm has one more
// output value and those Linears read it instead (int8_add_dual_outputs). The memory
// planner then plans it as any activation: the bytes of the T output (which hold the
// codes and row scales, int8_codes_fit), live from the norm to its last Linear, never
// allocated per call, at addresses a captured step graph keeps. A per-node buffer owned
// by the compiled graph would need a lifetime plan of its own, or stay allocated for the
// whole graph (a [T, hidden] buffer per norm). On the copy, int8_fused_output of that
// output gives the codes as for a norm read only by Linears, so the Linears' prepare and
// the profile's tags are those of the codes-only fusion.
// Internal to the CUDA backend; tested in tests/backends/cuda/int8_fuse_test.cpp (kernels
// against producer -> quantize, the decision, the rewrite, graphs fused against unfused)
// and w8a8_models_test.cpp (the tiny BERT and Llama with and without the fusion).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "ir/graph.h"

namespace kiln::cuda {

struct OpContext;

// How the codes of a fused value were made: each row with its own scale (the row scales
// follow the codes), or all with one static scale of inverse `inv`.
struct Int8Codes {
  bool per_token = false;
  float inv = 1.0f;  // static only: 1 / int8_act_scale(act_amax), as the Linear quantizes
};

// KILN_CUDA_INT8_FUSE, read when a graph is prepared: unset or 1 fuses, 0 does not; any
// other value is a kInvalidArgument error naming it.
bool int8_fuse_enabled();

// How output `out` of node n is written as int8 codes, or none (it is written in the
// activation dtype). Codes when: fusion is enabled, the activations are bf16 or f16, n is
// RMSNorm/LayerNorm (output 0), AddRMSNorm/AddLayerNorm (output 1, the norm; the sum
// stays in the activation dtype), the codes output int8_add_dual_outputs gave a norm
// after those, a Mul of an activation by a weight row of the Linears' K, or Attention
// (output 0; static scales only), the value is no graph output, it is read by at least
// one node, each a quant="w8a8" Linear that w8a8_linear_supported and takes it as its
// input x only, unrotated (no act_hadamard: such a Linear rotates and quantizes its input
// itself), all with the same static scale or all per token (act_dynamic), and the codes
// (with the row scales) fit the value's planned bytes (int8_codes_fit). A W8A8 Linear
// (output 0) is a producer when its activation is gelu_erf, gelu_tanh or silu and it applies it in a
// pass of its own (not KILN_CUDA_W8A8_ACT_EPILOGUE=1, w8a8_act_in_epilogue). The
// producer's and the readers' prepare functions both ask this.
std::optional<Int8Codes> int8_fused_output(const ir::Node& n, size_t out, const ir::Graph& g, DType act);

// How output `out` of norm n is written both in the activation dtype and as the int8 codes
// of the W8A8 Linears among its readers (the dual output), or none: when fusion is
// enabled, the activations are bf16 or f16, n is RMSNorm/LayerNorm (output 0) or
// AddRMSNorm/AddLayerNorm (output 1), the value is read by at least one W8A8 Linear as
// int8_fused_output's readers (its input x, w8a8_linear_supported, no fused norm, the codes
// fit: int8_codes_fit), all of those with the same static scale or all per token, and it
// has another use (a node that is no such Linear, or a graph output). A value only such
// Linears read takes int8_fused_output's codes instead.
std::optional<Int8Codes> int8_dual_output(const ir::Node& n, size_t out, const ir::Graph& g, DType act);
// Gives each norm with a dual output (int8_dual_output) one more output value, of the
// normalized output's dtype and shape (so planned with its bytes), and points those
// Linears' x at it; the other readers keep the T output. Returns how many norms. For the
// CUDA compiled graph's own copy (ir::Graph::add_node_output: the result does not verify).
int int8_add_dual_outputs(ir::Graph& g, DType act);
// On a graph int8_add_dual_outputs rewrote: the codes norm n writes into its added output
// (the one after its normalized output), or none when it has none.
std::optional<Int8Codes> int8_dual_codes(const ir::Node& n, const ir::Graph& g, DType act);

// Where the f32 row scales of t rows of k codes start: after the codes, 16-byte aligned.
inline size_t int8_row_scales_offset(int64_t t, int64_t k) { return (size_t(t) * size_t(k) + 15) / 16 * 16; }
// Whether t rows of k codes and their row scales fit in the t x k activations of es bytes
// each that the value's buffer is planned and allocated for, for every t >= 1: with k a
// multiple of 4, offset + 4t <= tk + 12 + 4t <= es * tk when (es - 1) * k >= 16.
inline bool int8_codes_fit(int64_t k, size_t es) { return k > 0 && k % 4 == 0 && (int64_t(es) - 1) * k >= 16; }

// Output `o` of a producer as the int8 codes of the W8A8 Linears reading it: allocated
// with `shape` in the activation dtype (as planned), then retyped to int8; with per-token
// scales, the row scales follow the codes (int8_row_scales_offset, int8_codes_fit).
struct Int8Out {
  int8_t* q;
  float* row_scale;  // null: the static scale
};
Int8Out int8_out(OpContext& c, size_t o, const std::vector<int64_t>& shape, const Int8Codes& codes);

// What the layer profile appends to the node's op name: "{int8 in}" for a W8A8 Linear
// that reads codes (no quantize pass), "{+int8 quantize}" for a node that writes them
// (a dual output's norm on the rewritten graph too); empty for the rest.
std::string int8_profile_tag(const ir::Node& n, const ir::Graph& g, DType act);

}  // namespace kiln::cuda
