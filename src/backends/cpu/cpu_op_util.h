// What the CPU backend's op files (cpu_ops.cpp, cpu_linear.cpp) share: weights read as
// f32, GGUF weight images, views of weights the builder packed, storage names, and the
// Linear's preparation for the op table. Internal to the CPU backend.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backends/cpu/cpu_ops.h"
#include "core/weight_quant.h"

namespace kiln::cpu {

inline const float* f32(const Tensor* t) { return t ? t->data_as<float>() : nullptr; }

// A weight image's rows (weight_quant q8/q4 with weight_k): its codes, checked against
// the node's attributes.
QuantizedRows weight_image_rows(const ir::Node& n, const Tensor& img);
// A weight input as contiguous f32 (converted once at compile time when stored
// otherwise; a Linear's quantized image dequantized); an empty tensor for kNoValue.
// Throws kUnsupported when v is a computed value, naming `role`.
Tensor weight_f32(const ir::Graph& g, ir::ValueId v, const ir::Node& n, const char* role);
// The WeightStorage of a precision name (f32, bf16, f16, q8, q4; w8a8 and fp8 Linears'
// kept layers: f32).
WeightStorage storage_from_option(const std::string& s);
// A weight the builder already packed (pack_linear_weights): a view of input `input`'s
// bytes (for a loaded engine, the file's mapping).
std::shared_ptr<PackedWeight> packed_weight_view(const ir::Node& n, const ir::Graph& g, size_t input);
// SwiGLU over [t, 2 inter] = [gate | up] rows into [t, inter].
void swiglu_rows(const float* in, int64_t t, int64_t inter, float* out);

// The Linear node (cpu_linear.cpp): f32 / 16-bit / q8 / q4 panels, W8A8, FP8, with its
// fused activation, norm and residual.
OpRun prepare_linear(const ir::Node& n, const ir::Graph& g, const CompileOptions& opt);

}  // namespace kiln::cpu
