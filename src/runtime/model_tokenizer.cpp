// Tokenizer lookup for a loaded model (see model_tokenizer.h).
#include "runtime/model_tokenizer.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/mapped_file.h"
#include "core/status.h"

namespace kiln {

tok::GgufTokenizerData gguf_tokenizer_data(const GgufFile& f) {
  tok::GgufTokenizerData d;
  auto str = [&](const char* k) { return f.has_key(k) ? f.get_string(k) : std::string(); };
  auto id = [&](const char* k) { return f.has_key(k) ? int32_t(f.get_u32(k)) : -1; };
  auto flag = [&](const char* k) -> std::optional<bool> {
    if (!f.has_key(k)) return std::nullopt;
    return f.get_bool(k);
  };
  d.model = str("tokenizer.ggml.model");
  d.pre = str("tokenizer.ggml.pre");
  if (f.has_key("tokenizer.ggml.tokens")) d.tokens = f.get_array_strings("tokenizer.ggml.tokens");
  if (f.has_key("tokenizer.ggml.scores")) d.scores = f.get_array_f32("tokenizer.ggml.scores");
  if (f.has_key("tokenizer.ggml.token_type")) d.token_type = f.get_array_i32("tokenizer.ggml.token_type");
  if (f.has_key("tokenizer.ggml.merges")) d.merges = f.get_array_strings("tokenizer.ggml.merges");
  d.bos_id = id("tokenizer.ggml.bos_token_id");
  d.eos_id = id("tokenizer.ggml.eos_token_id");
  d.unk_id = id("tokenizer.ggml.unknown_token_id");
  d.pad_id = id("tokenizer.ggml.padding_token_id");
  d.sep_id = id("tokenizer.ggml.seperator_token_id");
  d.cls_id = id("tokenizer.ggml.cls_token_id");
  d.mask_id = id("tokenizer.ggml.mask_token_id");
  d.add_bos = flag("tokenizer.ggml.add_bos_token");
  d.add_eos = flag("tokenizer.ggml.add_eos_token");
  d.add_space_prefix = flag("tokenizer.ggml.add_space_prefix");
  d.lowercase = flag("tokenizer.ggml.normalizer.lowercase");
  d.strip_accents = flag("tokenizer.ggml.normalizer.strip_accents");
  d.chat_template = str("tokenizer.chat_template");
  return d;
}

nlohmann::json gguf_tokenizer_to_json(const tok::GgufTokenizerData& d) {
  nlohmann::json j = {{"model", d.model}, {"pre", d.pre}, {"tokens", d.tokens}, {"scores", d.scores},
                      {"token_type", d.token_type}, {"merges", d.merges}, {"bos_id", d.bos_id},
                      {"eos_id", d.eos_id}, {"unk_id", d.unk_id}, {"pad_id", d.pad_id}, {"sep_id", d.sep_id},
                      {"cls_id", d.cls_id}, {"mask_id", d.mask_id}, {"chat_template", d.chat_template}};
  if (d.add_bos) j["add_bos"] = *d.add_bos;
  if (d.add_eos) j["add_eos"] = *d.add_eos;
  if (d.add_space_prefix) j["add_space_prefix"] = *d.add_space_prefix;
  if (d.lowercase) j["lowercase"] = *d.lowercase;
  if (d.strip_accents) j["strip_accents"] = *d.strip_accents;
  return j;
}

tok::GgufTokenizerData gguf_tokenizer_from_json(const nlohmann::json& j) {
  tok::GgufTokenizerData d;
  try {
    d.model = j.at("model").get<std::string>();
    d.pre = j.at("pre").get<std::string>();
    d.tokens = j.at("tokens").get<std::vector<std::string>>();
    d.scores = j.at("scores").get<std::vector<float>>();
    d.token_type = j.at("token_type").get<std::vector<int32_t>>();
    d.merges = j.at("merges").get<std::vector<std::string>>();
    for (auto [k, p] : {std::pair{"bos_id", &d.bos_id}, {"eos_id", &d.eos_id}, {"unk_id", &d.unk_id},
                        {"pad_id", &d.pad_id}, {"sep_id", &d.sep_id}, {"cls_id", &d.cls_id}, {"mask_id", &d.mask_id}})
      *p = j.at(k).get<int32_t>();
    d.chat_template = j.at("chat_template").get<std::string>();
    if (j.contains("add_bos")) d.add_bos = j["add_bos"].get<bool>();
    if (j.contains("add_eos")) d.add_eos = j["add_eos"].get<bool>();
    if (j.contains("add_space_prefix")) d.add_space_prefix = j["add_space_prefix"].get<bool>();
    if (j.contains("lowercase")) d.lowercase = j["lowercase"].get<bool>();
    if (j.contains("strip_accents")) d.strip_accents = j["strip_accents"].get<bool>();
  } catch (const nlohmann::json::exception& e) {
    throw_error(ErrorCode::kInvalidFile, "engine tokenizer (GGUF metadata): ", e.what());
  }
  return d;
}

std::vector<std::pair<std::string, std::string>> hf_tokenizer_files(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::pair<std::string, std::string>> files;
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt",
                        "vocab.json", "merges.txt", "tokenizer.model"})
    if (fs::is_regular_file(fs::path(dir) / f)) files.emplace_back(f, read_text_file((fs::path(dir) / f).string()));
  return files;
}

namespace {

// An engine's embedded tokenizer: HF files (tokenizer.json directly; older layouts
// through a temporary directory, as from_hf_dir reads them) or GGUF metadata.
std::optional<tok::Tokenizer> engine_tokenizer(const EngineContents& e) {
  namespace fs = std::filesystem;
  auto file = [&](const std::string& name) -> const std::string* {
    for (auto& [n, bytes] : e.tokenizer.files)
      if (n == name) return &bytes;
    return nullptr;
  };
  if (e.tokenizer.kind == "gguf") {
    const std::string* j = file("gguf_tokenizer.json");
    if (!j) throw_error(ErrorCode::kInvalidFile, "engine tokenizer: gguf_tokenizer.json is missing");
    try {
      return tok::Tokenizer::from_gguf(gguf_tokenizer_from_json(nlohmann::json::parse(*j)));
    } catch (const nlohmann::json::exception& x) {
      throw_error(ErrorCode::kInvalidFile, "engine tokenizer: ", x.what());
    }
  }
  if (e.tokenizer.kind != "hf" || e.tokenizer.files.empty()) return std::nullopt;
  if (const std::string* j = file("tokenizer.json")) {
    const std::string* cfg = file("tokenizer_config.json");
    return tok::Tokenizer::from_hf_json(*j, cfg ? std::string_view(*cfg) : std::string_view());
  }
  fs::path dir = fs::temp_directory_path() / ("kiln_tok_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (auto& [name, bytes] : e.tokenizer.files) {
    if (name.find('/') != std::string::npos || name.empty() || name[0] == '.')
      throw_error(ErrorCode::kInvalidFile, "engine tokenizer: bad file name '", name, "'");
    std::ofstream(dir / name, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
  }
  auto cleanup = [&] { std::error_code ec; fs::remove_all(dir, ec); };
  try {
    auto t = tok::Tokenizer::from_hf_dir(dir);
    cleanup();
    return t;
  } catch (...) {
    cleanup();
    throw;
  }
}

}  // namespace

std::optional<tok::Tokenizer> load_model_tokenizer(const Model& model) {
  namespace fs = std::filesystem;
  if (model.engine()) return engine_tokenizer(*model.engine());
  if (model.gguf()) {
    if (!model.gguf()->has_key("tokenizer.ggml.tokens")) return std::nullopt;
    return tok::Tokenizer::from_gguf(gguf_tokenizer_data(*model.gguf()));
  }
  const fs::path dir = model.path();
  if (!fs::is_directory(dir)) return std::nullopt;
  for (const char* f : {"tokenizer.json", "vocab.txt", "vocab.json", "tokenizer.model"})
    if (fs::exists(dir / f)) return tok::Tokenizer::from_hf_dir(dir);
  return std::nullopt;
}

std::vector<std::string> token_pieces(const tok::Tokenizer& tokenizer) {
  std::vector<std::string> pieces(tokenizer.vocab_size());
  for (size_t id = 0; id < pieces.size(); ++id)
    if (!tokenizer.is_special(int32_t(id))) pieces[id] = tokenizer.token_to_piece(int32_t(id));
  return pieces;
}

}  // namespace kiln
