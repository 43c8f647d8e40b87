// A HuggingFace view of a GGUF file: its metadata as an HF config.json and its tensors
// under HF names, with llama.cpp's conversion undone (Q/K row permutation for llama,
// Conv1D transposes for gpt2, BertModel's names for bert), so model builders only ever
// see HF conventions.
// Tested in tests/frontends/gguf_test.cpp (synthetic files and the real SmolLM2 GGUF).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "frontends/gguf.h"
#include "frontends/weight_source.h"

namespace kiln {

// config.json equivalent for general.architecture llama (also Mistral, SmolLM2,
// TinyLlama), qwen2, gpt2 and bert (BertModel as llama.cpp's converter writes it:
// embedding models such as all-MiniLM or bge; <arch>.pooling_type becomes
// kPoolingConfigKey); throws kUnsupported for other architectures and
// kInvalidFile when a required key is missing.
nlohmann::json gguf_to_hf_config(const GgufFile& file);

class GgufWeightSource final : public WeightSource {
 public:
  explicit GgufWeightSource(std::shared_ptr<const GgufFile> file);

  std::vector<std::string> names() const override;
  bool has(const std::string& name) const override { return map_.count(name) != 0; }
  TensorInfo info(const std::string& name) const override;
  Tensor load(const std::string& name, DType want) const override;
  std::optional<Tensor> view(const std::string& name) const override;
  std::string describe() const override { return "GGUF '" + file_->path() + "'"; }
  std::optional<Tensor> load_quantized(const std::string& name, QuantFormat f) const override;
  std::optional<QuantFormat> native_quant(const std::string& name) const override;
  bool stored_transposed(const std::string& name) const override { return mapping(name).transpose; }

  // The GGUF tensor an HF name comes from (for diagnostics).
  const std::string& gguf_name(const std::string& hf_name) const;
  // What load_quantized has requantized to q8 so far (ggml_requantized_to_q8), e.g.
  // "57 Q6_K, 12 Q5_K tensors"; "" when none.
  std::string requantized_summary() const;

 private:
  struct Mapping {
    std::string gguf_name;
    int permute_heads = 0;   // > 0: undo llama.cpp's rotary row permutation over n heads
    bool transpose = false;  // gpt2 Conv1D: HF stores [in, out]
  };
  const Mapping& mapping(const std::string& name) const;

  std::shared_ptr<const GgufFile> file_;
  std::map<std::string, Mapping> map_;  // HF name -> GGUF tensor
  mutable std::mutex requantized_mu_;
  mutable std::map<std::string, int> requantized_;  // ggml type name -> tensors
};

// HF name of a GGUF tensor for `arch`, or "" when it has no HF counterpart.
std::string gguf_to_hf_name(const std::string& arch, const std::string& gguf_name);

// Undoes llama.cpp's permute() of Q/K rows (transformers' reverse_permute_weights):
// within each head of `rows / n_head` rows, GGUF row 2*d + j becomes HF row j*half + d,
// over the head's first `rotary_dim` rows (0: all of them; the others stay). The same
// reorder takes RoPE on interleaved pairs (GLM-4) to kiln's rotate-half pairs.
Tensor gguf_unpermute_rows(const Tensor& t, int n_head, int64_t rotary_dim = 0);

}  // namespace kiln
