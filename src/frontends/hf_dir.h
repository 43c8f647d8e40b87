// Opens a HuggingFace model directory: config.json plus its weights (model.safetensors
// or a sharded index), or a GGUF file (or a directory holding one GGUF and no
// config.json) through its HF view. Model builders see only HF config keys and names.
// Tested in tests/frontends/hf_dir_test.cpp.
#pragma once

#include <memory>
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

// Reads and parses a JSON file; errors name the file, the parser's message and offset.
nlohmann::json read_json_file(const std::string& path);

}  // namespace kiln
