// The CUDA backend's FP8 Linear (attrs quant="fp8", act_amax[, weight_scale]; see
// quant/fp8.h): weights uploaded once as E4M3 codes with their per-tensor scale (an
// engine's stored codes, or f32 weights quantized here with core/fp8.h, the CPU
// backend's exact rule); each step quantizes the bf16 input to E4M3 with the static
// scale act_amax / 448, then runs the FP8 GEMV (<= 4 rows) or cuBLASLt's FP8 GEMM,
// with bias and activation epilogues as the bf16 Linear has them.
// The quantize fused into the producer (decided while preparing, fp8_fused_output): where
// a norm, SwiGLU or activation feeds only FP8 Linears with one static input scale, it
// writes the E4M3 codes itself (its value is then codes in its buffer, one byte each) and
// the Linears skip their quantize pass; the codes are those of the unfused pair, bit for
// bit. KILN_CUDA_FP8_FUSE=0 keeps the separate pass. Internal to the CUDA backend; tested
// against the CPU backend in tests/backends/cuda/fp8_test.cpp, fused against unfused in
// fp8_fuse_test.cpp.
#pragma once

#include <optional>
#include <string>

#include "backends/cuda/cuda_ops.h"
#include "core/fp8.h"

namespace kiln::cuda {

// Whether this quant="fp8" Linear can run here; when not, `why` says what is missing.
bool fp8_linear_supported(const ir::Node& n, const ir::Graph& g, std::string* why);
OpRun prepare_fp8_linear(const ir::Node& n, const ir::Graph& g, PrepareContext& pc);

// KILN_CUDA_FP8_FUSE, read when a graph is prepared: unset or 1 fuses, 0 does not; any
// other value is a kInvalidArgument error naming it.
bool fp8_fuse_enabled();
// KILN_CUDA_FP8_GATEUP_E4M3, read when a graph is prepared: unset or 1 lets a swiglu FP8
// Linear with attr out_amax (quant/fp8.h's --fp8-gate-up-out) write [gate | up] as E4M3
// (cuBLASLt D scale 448 / out_amax) for the E4M3 SwiGLU (ops/elementwise_fp8.h) when that
// SwiGLU writes codes, has no bias and the rows are a GEMM's (prefill; decode rows keep
// the bf16 GEMV); 0 keeps bf16 there; other values are a kInvalidArgument error.
bool fp8_gate_up_e4m3_enabled();
// The scale with which output `out` of node n is written as E4M3 codes, or none (it is
// written in the activation dtype). Codes when: fusion is enabled, the activations are
// bf16, n has an E4M3 kernel for that output (RMSNorm/LayerNorm output 0, AddRMSNorm/
// AddLayerNorm output 1 (the norm; the sum stays bf16), SwiGLU, Gelu, an FP8 Linear with
// an activation epilogue), the value is no graph output, and it is read by at least one
// node, each an FP8 Linear that takes it as its input x only, all with the same static
// input scale (act_amax). The producer's and the readers' prepare functions both ask this.
std::optional<Fp8Scale> fp8_fused_output(const ir::Node& n, size_t out, const ir::Graph& g, DType act);
// What the layer profile appends to the node's op name: "{fp8}" for an FP8 Linear,
// "{e4m3 in}" for one that reads codes (no quantize pass), "{+e4m3 quantize}" for a node
// that writes codes; empty for the rest.
std::string fp8_profile_tag(const ir::Node& n, const ir::Graph& g, DType act);

}  // namespace kiln::cuda
