// The KV-cache interface of a decoder exported with past_key_values (the layout
// optimum and torch.onnx.export of a flattened HF cache write): per layer l the inputs
// past_key_values.{l}.key / .value [batch, kv_heads, past, head_dim] and the outputs
// present.{l}.key / .value [batch, kv_heads, past + seq, head_dim]. Recognised family
// exports map these tensors onto kiln's paged KV cache (runtime/onnx_loader.cpp); this
// file only finds and checks them. Tested in tests/frontends/onnx_test.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "frontends/onnx/onnx_model.h"

namespace kiln::onnx {

struct OnnxKvCache {
  struct Layer {
    std::string past_key, past_value, present_key, present_value;
  };
  std::vector<Layer> layers;  // [l] for layer l
  int64_t kv_heads = 0;       // dim 1 of the past inputs (0: symbolic in the file)
  int64_t head_dim = 0;       // dim 3 of the past inputs (0: symbolic in the file)
  bool empty() const { return layers.empty(); }
  // "past_key_values.{0..N-1}.key/value -> present.{0..N-1}.key/value".
  std::string describe() const;
};

// True when the graph has inputs or outputs that look like a KV cache (an input whose
// name starts with "past", an output whose name starts with "present"), well formed
// or not.
bool onnx_has_kv_io(const OnnxModel& model);
// Those inputs and outputs by name, for messages ("inputs past.0, past.1; outputs ...";
// long lists are shortened).
std::string onnx_kv_io_names(const OnnxModel& model);

// The KV-cache inputs/outputs of `model` (empty when it has none). Throws kiln::Error
// naming the tensor, what was expected and what was found when they cannot be mapped
// onto a KV cache: another naming (e.g. legacy `past.{i}` [2, batch, heads, past,
// head_dim]), a layer without its key, value or present outputs, layers not numbered
// 0..N-1, a dtype other than float32, a rank other than 4, or head counts / head sizes
// that differ between tensors. `label` names the model.
OnnxKvCache onnx_kv_cache(const OnnxModel& model, const std::string& label);

}  // namespace kiln::onnx
