// HF model directory discovery (see hf_dir.h).
#include "frontends/hf_dir.h"

#include <filesystem>

#include "core/mapped_file.h"
#include "core/status.h"

namespace kiln {

namespace fs = std::filesystem;

nlohmann::json read_json_file(const std::string& path) {
  std::string text = read_text_file(path);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw_error(ErrorCode::kInvalidFile, path, ": not valid JSON at byte ", e.byte, ": ",
                e.what());
  }
}

HfModelDir HfModelDir::open(const std::string& dir) {
  if (!fs::is_directory(dir))
    throw_error(ErrorCode::kNotFound, "model directory '", dir, "' does not exist");
  HfModelDir m;
  m.dir = dir;
  const fs::path d(dir);
  const fs::path config = d / "config.json";
  if (!fs::exists(config))
    throw_error(ErrorCode::kNotFound, "'", dir,
                "' has no config.json (expected a HuggingFace model directory)");
  m.config = read_json_file(config.string());
  if (!m.config.is_object())
    throw_error(ErrorCode::kInvalidFile, config.string(), ": expected a JSON object, found ",
                m.config.type_name());

  if (fs::exists(d / "model.safetensors")) {
    m.weights = open_safetensors_source((d / "model.safetensors").string());
  } else if (fs::exists(d / "model.safetensors.index.json")) {
    m.weights = open_sharded_safetensors_source((d / "model.safetensors.index.json").string());
  } else if (fs::exists(d / "pytorch_model.bin") ||
             fs::exists(d / "pytorch_model.bin.index.json")) {
    throw_error(ErrorCode::kUnsupported, "'", dir,
                "' holds only pytorch_model.bin (a pickle, which kiln does not read); convert "
                "it to safetensors, e.g. with transformers: "
                "AutoModel.from_pretrained(dir).save_pretrained(dir, safe_serialization=True)");
  } else {
    throw_error(ErrorCode::kNotFound, "'", dir,
                "' has no weights: expected model.safetensors or model.safetensors.index.json");
  }
  return m;
}

}  // namespace kiln
