// Opens a HuggingFace model directory: config.json plus its weights (model.safetensors
// or a sharded index), or a GGUF file (or a directory holding one GGUF and no
// config.json) through its HF view. Model builders see only HF config keys and names.
// Tested in tests/frontends/hf_dir_test.cpp.
#pragma once

#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>

#include "frontends/weight_source.h"

namespace kiln {

struct HfModelDir {
  nlohmann::json config;
  std::unique_ptr<WeightSource> weights;
  std::string dir;

  // `dir` may also be a .gguf file. Throws kiln::Error: kNotFound (no config.json, no weights), kInvalidFile (bad
  // JSON, with the parser's message and byte offset), kUnsupported (pytorch_model.bin).
  static HfModelDir open(const std::string& dir);
};

// The config key through which a checkpoint's sentence-embedding pooling reaches a model
// builder (ModelInfo::pooling): set by HfModelDir::open from modules.json and by
// gguf_to_hf_config from <arch>.pooling_type; HF configs have no such key.
inline constexpr const char* kPoolingConfigKey = "kiln_pooling";
// Set (true) by gguf_to_hf_config for Gemma GGUFs, whose RMSNorm weights llama.cpp's
// converter stores as (1 + w), the factor the norm scales by: the Gemma builder takes them
// as they are instead of adding the 1 itself.
inline constexpr const char* kNormsOnePlusConfigKey = "kiln_norms_one_plus";
// Set by gguf_to_hf_config where a GGUF holds rope_freqs.weight (Llama 3.1+ as llama.cpp's
// converter writes it: Llama 3's RoPE scaling is no metadata key there but this tensor of
// per-frequency divisors): the builder divides each inverse frequency by its entry, as
// llama.cpp's rope does.
inline constexpr const char* kRopeFreqFactorsConfigKey = "kiln_rope_freq_factors";

// A sentence-transformers directory's pooling: "mean", "cls" or "last" (lasttoken: decoder
// embedding models such as Qwen3-Embedding) from the Pooling module
// that modules.json names; nullopt without modules.json or a Pooling module. Throws
// kUnsupported for other pooling modes and for modules kiln does not apply (Dense...),
// kInvalidFile for malformed files. HfModelDir::open records it as the config's
// kPoolingConfigKey.
std::optional<std::string> sentence_transformers_pooling(const std::string& dir);

// Reads and parses a JSON file; errors name the file, the parser's message and offset.
nlohmann::json read_json_file(const std::string& path);

}  // namespace kiln
