// Builds a TokenizerImpl from GGUF tokenizer metadata, choosing the pipeline the way
// llama.cpp does: "gpt2" = byte-level BPE with a pre-tokenizer regex picked by
// tokenizer.ggml.pre, "llama" = score-driven SentencePiece BPE, "bert" = WordPiece.
// Tested in tests/tokenizer/gguf_test.cpp against HF references for SmolLM2.
#include <sstream>

#include "core/status.h"
#include "tokenizer/pipeline.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace kiln::tok {
namespace {

constexpr int kTypeControl = 3;
constexpr int kTypeUserDefined = 4;

void add_gpt2_pre_tokenizers(TokenizerImpl& impl, const std::string& pre) {
  auto split = [&](const char* pattern) {
    impl.pre_tokenizers.push_back(make_regex_split_pre_tokenizer(pattern, false, false));
    impl.pre_tokenizers.push_back(make_byte_level_pre_tokenizer(false, false));
  };
  if (pre == "llama3" || pre == "llama-bpe" || pre == "llama-v3" || pre == "falcon3" ||
      pre == "pixtral" || pre == "dbrx" || pre == "smaug-bpe") {
    split(kLlama3Pattern);
  } else if (pre == "qwen2" || pre == "deepseek-r1-qwen" || pre == "stablelm2" ||
             pre == "hunyuan") {
    split(kQwen2Pattern);
  } else if (pre == "smollm" || pre == "starcoder" || pre == "refact" || pre == "command-r" ||
             pre == "codeshell" || pre == "exaone" || pre == "minerva") {
    // HF's tokenizer.json for these: Digits(individual) then ByteLevel with its regex.
    impl.pre_tokenizers.push_back(make_digits_pre_tokenizer(true));
    impl.pre_tokenizers.push_back(make_byte_level_pre_tokenizer(false, true));
  } else if (pre.empty() || pre == "default" || pre == "gpt-2" || pre == "gpt2" ||
             pre == "phi-2" || pre == "olmo" || pre == "jais" || pre == "poro-chat") {
    impl.pre_tokenizers.push_back(make_byte_level_pre_tokenizer(false, true));
  } else {
    throw_error(ErrorCode::kUnsupported, "GGUF tokenizer.ggml.pre '", pre,
                "' is not supported (supported: llama3/llama-bpe, qwen2, smollm, starcoder, "
                "gpt-2, default)");
  }
}

}  // namespace

std::shared_ptr<const TokenizerImpl> load_gguf(const GgufTokenizerData& d) {
  const size_t n = d.tokens.size();
  if (n == 0) throw_error(ErrorCode::kInvalidFile, "GGUF tokenizer.ggml.tokens is missing or empty");
  if (!d.token_type.empty() && d.token_type.size() != n) {
    throw_error(ErrorCode::kInvalidFile, "GGUF tokenizer.ggml.token_type has ", d.token_type.size(),
                " entries, expected one per token (", n, ")");
  }
  if (!d.scores.empty() && d.scores.size() != n) {
    throw_error(ErrorCode::kInvalidFile, "GGUF tokenizer.ggml.scores has ", d.scores.size(),
                " entries, expected one per token (", n, ")");
  }
  auto check_id = [&](int32_t id, const char* key) {
    if (id < -1 || id >= static_cast<int32_t>(n)) {
      throw_error(ErrorCode::kInvalidFile, "GGUF ", key, " = ", id, " is outside the vocabulary (",
                  n, " tokens)");
    }
  };
  check_id(d.bos_id, "tokenizer.ggml.bos_token_id");
  check_id(d.eos_id, "tokenizer.ggml.eos_token_id");
  check_id(d.unk_id, "tokenizer.ggml.unknown_token_id");
  check_id(d.pad_id, "tokenizer.ggml.padding_token_id");
  check_id(d.sep_id, "tokenizer.ggml.seperator_token_id");
  check_id(d.cls_id, "tokenizer.ggml.cls_token_id");
  check_id(d.mask_id, "tokenizer.ggml.mask_token_id");
  for (const auto& t : d.tokens) utf8_require_valid(t, "a GGUF vocabulary token");

  auto impl = std::make_shared<TokenizerImpl>();
  impl->vocab = d.tokens;
  impl->decoder_present = true;
  auto type_of = [&](size_t i) { return d.token_type.empty() ? 1 : d.token_type[i]; };
  // Control and user-defined tokens are matched in the text before anything else, as
  // llama.cpp's special-token partition and HF's added_tokens do.
  for (size_t i = 0; i < n; ++i) {
    const int t = type_of(i);
    if ((t == kTypeControl || t == kTypeUserDefined) && !d.tokens[i].empty()) {
      AddedToken a;
      a.content = d.tokens[i];
      a.id = static_cast<int32_t>(i);
      a.special = t == kTypeControl;
      impl->added_tokens.push_back(std::move(a));
    }
  }
  bool add_bos = false;
  bool add_eos = false;
  std::unordered_map<std::string, int32_t> vocab;
  vocab.reserve(n);
  if (d.model == "gpt2") {
    for (size_t i = 0; i < n; ++i) vocab.emplace(d.tokens[i], static_cast<int32_t>(i));
    std::vector<std::pair<std::string, std::string>> merges;
    merges.reserve(d.merges.size());
    for (size_t i = 0; i < d.merges.size(); ++i) {
      const auto& m = d.merges[i];
      const size_t sp = m.find(' ', 1);
      if (sp == std::string::npos) {
        throw_error(ErrorCode::kInvalidFile, "GGUF tokenizer.ggml.merges[", i, "] '", m,
                    "' is not two tokens separated by a space");
      }
      merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
    }
    impl->model = std::make_unique<BpeModel>(std::move(vocab), merges, BpeOptions{});
    add_gpt2_pre_tokenizers(*impl, d.pre);
    impl->decoders.push_back(make_byte_level_decoder());
  } else if (d.model == "llama") {
    const bool prefix = d.add_space_prefix.value_or(true);
    impl->pre_tokenizers.push_back(
        make_metaspace_pre_tokenizer("\xE2\x96\x81", prefix ? "first" : "never", false));
    impl->model = std::make_unique<SpmScoreModel>(d.tokens, d.scores, d.unk_id);
    impl->decoders.push_back(make_replace_decoder("\xE2\x96\x81", " "));
    impl->decoders.push_back(make_byte_fallback_decoder());
    impl->decoders.push_back(make_fuse_decoder());
    if (prefix) impl->decoders.push_back(make_strip_decoder(" ", 1, 0));
    add_bos = true;
  } else if (d.model == "bert") {
    // llama.cpp's converter marks word starts with U+2581 and drops "##"; undo that
    // so the vocabulary is plain WordPiece again.
    const std::string phantom = "\xE2\x96\x81";
    for (size_t i = 0; i < n; ++i) {
      std::string t = d.tokens[i];
      if (type_of(i) == 1) t = t.compare(0, phantom.size(), phantom) == 0 ? t.substr(phantom.size()) : "##" + t;
      impl->vocab[i] = t;
      vocab.emplace(t, static_cast<int32_t>(i));
    }
    const std::string unk = d.unk_id >= 0 ? d.tokens[static_cast<size_t>(d.unk_id)] : "[UNK]";
    // llama.cpp's BertNormalizer options: lowercase unless the file says not (older
    // files, all uncased, lack the key), accents stripped as lowercase is unless said.
    const bool lowercase = d.lowercase.value_or(true);
    impl->normalizers.push_back(make_bert_normalizer(true, true, d.strip_accents.value_or(lowercase), lowercase));
    impl->pre_tokenizers.push_back(make_bert_pre_tokenizer());
    impl->model = std::make_unique<WordPieceModel>(std::move(vocab), unk, "##", 100);
    impl->decoders.push_back(make_wordpiece_decoder("##", true));
    // [CLS] A [SEP] (B [SEP]): llama.cpp's converter now writes [CLS] as the BOS and [SEP]
    // as the separator (and EOS); older files name cls_token_id.
    const int32_t cls_id = d.cls_id >= 0 ? d.cls_id : d.bos_id, sep_id = d.sep_id >= 0 ? d.sep_id : d.eos_id;
    if (cls_id >= 0 && sep_id >= 0) {
      TemplateItem cls{false, 0, {cls_id}, 0}, sep{false, 0, {sep_id}, 0};
      TemplateItem a{true, 0, {}, 0}, b{true, 1, {}, 1}, sep_b{false, 0, {sep_id}, 1};
      impl->post.single = {cls, a, sep};
      impl->post.pair = {cls, a, sep, b, sep_b};
    }
  } else {
    throw_error(ErrorCode::kUnsupported, "GGUF tokenizer.ggml.model '", d.model,
                "' is not supported (supported: gpt2, llama, bert)");
  }
  add_bos = d.add_bos.value_or(add_bos);
  add_eos = d.add_eos.value_or(add_eos);
  if (d.model != "bert" && (add_bos || add_eos)) {
    if (add_bos && d.bos_id >= 0) impl->post.single.push_back({false, 0, {d.bos_id}, 0});
    impl->post.single.push_back({true, 0, {}, 0});
    if (add_eos && d.eos_id >= 0) impl->post.single.push_back({false, 0, {d.eos_id}, 0});
    impl->post.pair = impl->post.single;
    impl->post.pair.push_back({true, 1, {}, 1});
  }
  impl->bos_id = d.bos_id;
  impl->eos_id = d.eos_id;
  impl->pad_id = d.pad_id;
  impl->unk_id = d.unk_id;
  impl->chat_template = d.chat_template;
  impl->finalize();
  return impl;
}

}  // namespace kiln::tok
