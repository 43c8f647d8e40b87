// An HF view of an ONNX export (as gguf_hf.h is for GGUF): when the file is a known
// HuggingFace family exported by torch.onnx.export (BERT, GPT-2, Llama, Qwen2), this
// recognises it from its initializer names (HF names survive export, under the wrapper's
// prefix) and graph structure (anonymous MatMul weights are named after the bias Added to
// their output, or for Llama's and Qwen2's linears after the module in the MatMul node's
// name, Qwen2's q/k/v biases read at the Add after each; heads from the
// [.., .., heads, head_dim] Reshape targets; eps, activation and RoPE's theta from the
// exported norms, GELU/SiLU and inverse frequencies), and gives kiln's family builder an
// HF config.json and HF tensor names. A GPT-2, Llama or Qwen2 exported
// with past_key_values also gets its KV-cache inputs/outputs (onnx_kv.h), checked
// against the family's layers, KV heads and head size: the runtime's paged KV cache
// takes their place. The runtime checks the rebuilt model against the op-by-op import
// on a probe input before using it.
// Tested in tests/frontends/onnx_test.cpp.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "frontends/onnx/onnx_kv.h"
#include "frontends/onnx/onnx_model.h"
#include "frontends/weight_source.h"

namespace kiln::onnx {

struct OnnxHfView {
  std::string family;  // "bert" | "gpt2" | "llama" (config model_type "llama" or "qwen2")
  nlohmann::json config;
  std::unique_ptr<WeightSource> weights;
  OnnxKvCache kv;  // empty for an export without past_key_values / present tensors
};

// nullopt (with *why saying what did not match) for anything else. Throws kiln::Error
// (onnx_kv_cache's, or kInvalidFile naming the tensor) when the file's KV-cache tensors
// cannot be this family's cache: another layer count, KV head count or head size.
std::optional<OnnxHfView> onnx_hf_view(const OnnxModel& model, const std::string& label, std::string* why);

}  // namespace kiln::onnx
