// HF model directory discovery (see hf_dir.h).
#include "frontends/hf_dir.h"

#include <filesystem>
#include <set>
#include <vector>

#include "core/mapped_file.h"
#include "core/status.h"
#include "frontends/gguf_hf.h"

namespace kiln {

namespace fs = std::filesystem;

nlohmann::json read_json_file(const std::string& path) {
  std::string text = read_text_file(path);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw_error(ErrorCode::kInvalidFile, path, ": not valid JSON at byte ", e.byte, ": ",
                e.what());
  } catch (const nlohmann::json::exception& e) {
    throw_error(ErrorCode::kInvalidFile, path, ": not valid JSON: ", e.what());
  }
}

namespace {

HfModelDir open_gguf(const std::string& path, const std::string& dir) {
  auto file = std::make_shared<const GgufFile>(GgufFile::open(path));
  HfModelDir m;
  m.dir = dir;
  m.config = gguf_to_hf_config(*file);
  m.weights = std::make_unique<GgufWeightSource>(file);
  return m;
}

// The one *.gguf in dir, or "" when there is none (several: an error naming them).
std::string single_gguf(const fs::path& d) {
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(d))
    if (e.is_regular_file() && e.path().extension() == ".gguf") found.push_back(e.path().string());
  if (found.size() > 1)
    throw_error(ErrorCode::kInvalidArgument, "'", d.string(), "' holds ", found.size(),
                " GGUF files (", found[0], ", ", found[1], "...); pass the one to use");
  return found.empty() ? "" : found[0];
}

}  // namespace

std::optional<std::string> sentence_transformers_pooling(const std::string& dir) {
  const fs::path d(dir);
  const fs::path modules_path = d / "modules.json";
  if (!fs::exists(modules_path)) return std::nullopt;
  const nlohmann::json modules = read_json_file(modules_path.string());
  if (!modules.is_array())
    throw_error(ErrorCode::kInvalidFile, modules_path.string(), ": expected a JSON array of modules, found ",
                modules.type_name());
  std::optional<std::string> pooling;
  for (const auto& m : modules) {
    const std::string type = m.is_object() ? m.value("type", "") : "";
    const std::string path = m.is_object() ? m.value("path", "") : "";
    const std::string name = type.substr(type.rfind('.') + 1);  // npos + 1 = 0: the whole name
    if (name == "Transformer" || name == "Normalize") continue;  // kiln's encoder; embeddings are normalized anyway
    if (name != "Pooling")
      throw_error(ErrorCode::kUnsupported, modules_path.string(), ": module '", type.empty() ? m.dump() : type,
                  "' (", path, ") is not applied by kiln (it understands Transformer, Pooling and Normalize), "
                  "so its embeddings would differ from sentence-transformers'");
    const fs::path config_path = d / path / "config.json";
    const nlohmann::json c = read_json_file(config_path.string());
    if (!c.is_object())
      throw_error(ErrorCode::kInvalidFile, config_path.string(), ": expected a JSON object");
    // Each mode a flag; a "pooling_mode" string where a writer put one instead.
    std::set<std::string> modes;
    auto add = [&](const std::string& mode) {
      modes.insert(mode == "mean_tokens" ? "mean" : mode == "cls_token" ? "cls" : mode);
    };
    if (c.contains("pooling_mode") && c["pooling_mode"].is_string()) add(c["pooling_mode"]);
    for (const char* mode : {"cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens",
                             "lasttoken"})
      if (c.value(std::string("pooling_mode_") + mode, false)) add(mode);
    if (modes.size() != 1)
      throw_error(ErrorCode::kUnsupported, config_path.string(), ": ", modes.size(),
                  " pooling modes; kiln pools one way, by mean, by the [CLS] row or by the last token");
    const std::string mode = *modes.begin() == "lasttoken" ? "last" : *modes.begin();
    if (mode != "mean" && mode != "cls" && mode != "last")
      throw_error(ErrorCode::kUnsupported, config_path.string(), ": pooling mode '", mode,
                  "' (kiln pools by mean, by the [CLS] row or by the last token)");
    pooling = mode;
  }
  return pooling;
}

HfModelDir HfModelDir::open(const std::string& dir) {
  if (fs::is_regular_file(dir) && fs::path(dir).extension() == ".gguf")
    return open_gguf(dir, fs::path(dir).parent_path().string());
  if (!fs::is_directory(dir))
    throw_error(ErrorCode::kNotFound, "model directory '", dir, "' does not exist");
  HfModelDir m;
  m.dir = dir;
  const fs::path d(dir);
  const fs::path config = d / "config.json";
  if (!fs::exists(config)) {
    if (std::string g = single_gguf(d); !g.empty()) return open_gguf(g, dir);
    throw_error(ErrorCode::kNotFound, "'", dir,
                "' has no config.json (expected a HuggingFace model directory or a GGUF file)");
  }
  m.config = read_json_file(config.string());
  if (!m.config.is_object())
    throw_error(ErrorCode::kInvalidFile, config.string(), ": expected a JSON object, found ",
                m.config.type_name());
  if (auto pooling = sentence_transformers_pooling(dir)) m.config[kPoolingConfigKey] = *pooling;

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
