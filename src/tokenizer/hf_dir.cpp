// Tokenizer::from_hf_dir and from_sentencepiece: find the tokenizer files of a model
// directory and hand them to the right loader; older layouts (vocab.txt,
// vocab.json + merges.txt) are converted to the tokenizer.json they imply.
// Tested in tests/tokenizer/hf_dir_test.cpp.
#include <sentencepiece_processor.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/status.h"
#include "tokenizer/pipeline.h"
#include "tokenizer/tokenizer.h"

namespace kiln::tok {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_error(ErrorCode::kIo, "cannot open ", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw_error(ErrorCode::kIo, "cannot read ", path.string());
  return ss.str();
}

// The tokenizer.json HF would build for a BERT vocab.txt (BertTokenizerFast).
std::string bert_json_from_vocab(const std::string& vocab_txt, const json& config) {
  json vocab = json::object();
  std::istringstream in(vocab_txt);
  std::string line;
  int64_t id = 0;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!vocab.contains(line)) vocab[line] = id;
    ++id;
  }
  auto token = [&](const char* key, const char* fallback) {
    auto it = config.find(key);
    return it != config.end() && it->is_string() ? it->get<std::string>() : std::string(fallback);
  };
  const bool lower = config.value("do_lower_case", true);
  json added = json::array();
  for (const char* key : {"pad_token", "unk_token", "cls_token", "sep_token", "mask_token"}) {
    const std::string t = token(key, "");
    if (!t.empty() && vocab.contains(t)) {
      added.push_back({{"id", vocab[t]}, {"content", t}, {"special", true}, {"normalized", false}});
    }
  }
  const std::string cls = token("cls_token", "[CLS]"), sep = token("sep_token", "[SEP]");
  if (!vocab.contains(cls) || !vocab.contains(sep)) {
    throw_error(ErrorCode::kInvalidFile, "vocab.txt lacks the ", cls, " / ", sep, " tokens");
  }
  json j = {
      {"added_tokens", added},
      {"normalizer", {{"type", "BertNormalizer"}, {"clean_text", true},
                      {"handle_chinese_chars", config.value("tokenize_chinese_chars", true)},
                      {"strip_accents", nullptr}, {"lowercase", lower}}},
      {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
      {"post_processor", {{"type", "BertProcessing"}, {"cls", {cls, vocab[cls]}}, {"sep", {sep, vocab[sep]}}}},
      {"decoder", {{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", true}}},
      {"model", {{"type", "WordPiece"}, {"unk_token", token("unk_token", "[UNK]")},
                 {"continuing_subword_prefix", "##"}, {"max_input_chars_per_word", 100},
                 {"vocab", vocab}}}};
  if (config.contains("strip_accents") && config["strip_accents"].is_boolean()) {
    j["normalizer"]["strip_accents"] = config["strip_accents"];
  }
  return j.dump();
}

// The tokenizer.json HF would build for GPT-2's vocab.json + merges.txt.
std::string gpt2_json_from_files(const std::string& vocab_json, const std::string& merges_txt) {
  json vocab;
  try {
    vocab = json::parse(vocab_json);
  } catch (const json::exception& e) {
    throw_error(ErrorCode::kInvalidFile, "vocab.json does not parse: ", e.what());
  }
  json merges = json::array();
  std::istringstream in(merges_txt);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    merges.push_back(line);
  }
  json j = {{"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
            {"decoder", {{"type", "ByteLevel"}}},
            {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
  return j.dump();
}

}  // namespace

Tokenizer Tokenizer::from_hf_dir(const fs::path& dir) {
  const fs::path config_path = dir / "tokenizer_config.json";
  const std::string config = fs::exists(config_path) ? read_file(config_path) : std::string();
  if (fs::exists(dir / "tokenizer.json")) {
    return from_hf_json(read_file(dir / "tokenizer.json"), config);
  }
  json config_obj = json::object();
  if (!config.empty()) {
    try {
      config_obj = json::parse(config);
    } catch (const json::exception& e) {
      throw_error(ErrorCode::kInvalidFile, config_path.string(), " does not parse: ", e.what());
    }
  }
  if (fs::exists(dir / "vocab.txt")) {
    return from_hf_json(bert_json_from_vocab(read_file(dir / "vocab.txt"), config_obj), config);
  }
  if (fs::exists(dir / "vocab.json") && fs::exists(dir / "merges.txt")) {
    return from_hf_json(
        gpt2_json_from_files(read_file(dir / "vocab.json"), read_file(dir / "merges.txt")), config);
  }
  if (fs::exists(dir / "tokenizer.model")) return from_sentencepiece(dir / "tokenizer.model");
  throw_error(ErrorCode::kNotFound, "no tokenizer in ", dir.string(),
              ": expected tokenizer.json, vocab.txt, vocab.json + merges.txt or tokenizer.model");
}

Tokenizer Tokenizer::from_sentencepiece(const fs::path& model_file) {
  auto spm = std::make_shared<sentencepiece::SentencePieceProcessor>();
  const auto status = spm->Load(model_file.string());
  if (!status.ok()) {
    throw_error(ErrorCode::kInvalidFile, "cannot load SentencePiece model ", model_file.string(),
                ": ", status.ToString());
  }
  auto impl = std::make_shared<TokenizerImpl>();
  const int n = spm->GetPieceSize();
  impl->vocab.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    impl->vocab[static_cast<size_t>(i)] = spm->IdToPiece(i);
    if (spm->IsControl(i)) {
      AddedToken a;
      a.content = impl->vocab[static_cast<size_t>(i)];
      a.id = i;
      a.special = true;
      impl->added_tokens.push_back(std::move(a));
    }
  }
  impl->bos_id = spm->bos_id();
  impl->eos_id = spm->eos_id();
  impl->pad_id = spm->pad_id();
  impl->unk_id = spm->unk_id();
  if (impl->bos_id >= 0) impl->post.single = {{false, 0, {impl->bos_id}, 0}, {true, 0, {}, 0}};
  impl->spm = std::move(spm);
  impl->finalize();
  // libsentencepiece does its own splitting; the matcher must not see control pieces
  // such as <s> (HF's slow Llama tokenizer does not parse them from text either).
  impl->matcher = AddedTokenMatcher{};
  return Tokenizer(std::move(impl));
}

}  // namespace kiln::tok
