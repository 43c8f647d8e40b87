// Tokenizer lookup for a loaded model (see model_tokenizer.h).
#include "runtime/model_tokenizer.h"

#include <filesystem>

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
  d.chat_template = str("tokenizer.chat_template");
  return d;
}

std::optional<tok::Tokenizer> load_model_tokenizer(const Model& model) {
  namespace fs = std::filesystem;
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

}  // namespace kiln
