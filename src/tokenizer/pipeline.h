// Internal stages of the tokenization pipeline, mirroring HF `tokenizers`:
// added-token split -> normalizer -> pre-tokenizer -> model -> post-processor, and
// ids -> tokens -> decoder chain on the way back. Each stage is built either from a
// tokenizer.json node (hf_json.cpp) or directly (gguf_loader.cpp).
// Tested through tests/tokenizer/*_test.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/regex_split.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace kiln::tok {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string normalize(std::string text) const = 0;
};

// Splits pieces further. `first_segment` is true for the text before any added
// token (Metaspace's prepend_scheme "first" prepends only there).
class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void pre_tokenize(std::vector<std::string>& pieces, bool first_segment) const = 0;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual void tokenize(std::string_view word, std::vector<int32_t>& out) const = 0;
};

// Works on the list of token strings, as HF's Decoder::decode_chain.
class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

// Finds added tokens in text: leftmost match, longest at that position (HF uses
// Aho-Corasick with LeftmostLongest), honouring lstrip/rstrip/single_word.
class AddedTokenMatcher {
 public:
  void build(const std::vector<AddedToken>& tokens);
  struct Segment {
    std::string_view text;  // when id < 0: plain text to tokenize
    int32_t id = -1;
  };
  // `normalized_pass` selects tokens with normalized == that flag.
  void split(std::string_view text, bool normalized_pass, bool parse_special,
             std::vector<Segment>& out) const;
  bool empty() const { return tokens_.empty(); }

 private:
  struct Node {
    std::unordered_map<unsigned char, int32_t> next;
    int32_t token = -1;  // index into tokens_
  };
  std::vector<AddedToken> tokens_;
  std::vector<Node> nodes_;
};

// One element of a TemplateProcessing template.
struct TemplateItem {
  bool is_sequence = false;  // $A / $B
  int sequence = 0;          // 0 = A, 1 = B
  std::vector<int32_t> ids;  // the special token's ids
  int32_t type_id = 0;
};

struct PostProcessor {
  std::vector<TemplateItem> single;
  std::vector<TemplateItem> pair;
  size_t added_tokens(bool is_pair) const;
};

// Per-word results of the model, shared by all threads (HF caches BPE words too).
class WordCache {
 public:
  bool find(std::string_view word, std::vector<int32_t>& out) const;
  void insert(std::string_view word, const std::vector<int32_t>& ids) const;

 private:
  static constexpr size_t kShards = 16;
  static constexpr size_t kShardCapacity = 8192;
  struct Shard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>> map;
  };
  mutable Shard shards_[kShards];
};

// BPE (HF models/bpe). Symbols form a linked list merged through a min-heap of
// (rank, position), so a word of n symbols costs O(n log n), not O(n^2).
struct BpeOptions {
  std::string unk_token;
  std::string continuing_subword_prefix;
  std::string end_of_word_suffix;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
};

class BpeModel final : public Model {
 public:
  BpeModel(std::unordered_map<std::string, int32_t> vocab,
           const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options);
  void tokenize(std::string_view word, std::vector<int32_t>& out) const override;

 private:
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;
  std::unordered_map<std::string, int32_t> vocab_;
  struct MergeInfo {
    int32_t rank;
    int32_t new_id;
  };
  std::unordered_map<uint64_t, MergeInfo> merges_;
  BpeOptions options_;
  int32_t unk_id_ = -1;
  int32_t byte_ids_[256];
  WordCache cache_;
};

class WordPieceModel final : public Model {
 public:
  WordPieceModel(std::unordered_map<std::string, int32_t> vocab, std::string unk_token,
                 std::string prefix, size_t max_input_chars_per_word);
  void tokenize(std::string_view word, std::vector<int32_t>& out) const override;

 private:
  std::unordered_map<std::string, int32_t> vocab_;
  int32_t unk_id_;
  std::string prefix_;
  size_t max_chars_;
};

// llama.cpp's SentencePiece-BPE for GGUF "llama" vocabularies: greedy merges of
// adjacent pieces by highest score, bytes as <0xXX> fallback.
class SpmScoreModel final : public Model {
 public:
  SpmScoreModel(const std::vector<std::string>& tokens, const std::vector<float>& scores,
                int32_t unk_id);
  void tokenize(std::string_view word, std::vector<int32_t>& out) const override;

 private:
  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<float> scores_;
  int32_t unk_id_;
  int32_t byte_ids_[256];
};

struct TokenizerImpl {
  // Combined vocabulary: model tokens and added tokens.
  std::vector<std::string> vocab;
  std::unordered_map<std::string, int32_t> token_ids;
  std::vector<uint8_t> special;  // per id: a special added token (skipped on decode)
  std::vector<uint8_t> added;    // per id: an added token (not run through the decoder)

  std::vector<AddedToken> added_tokens;
  AddedTokenMatcher matcher;
  std::vector<std::unique_ptr<Normalizer>> normalizers;
  std::vector<std::unique_ptr<PreTokenizer>> pre_tokenizers;
  std::unique_ptr<Model> model;
  std::vector<std::unique_ptr<Decoder>> decoders;
  PostProcessor post;
  bool decoder_present = false;
  // Set for tokenizer.model files: libsentencepiece does the whole job.
  std::shared_ptr<sentencepiece::SentencePieceProcessor> spm;

  int32_t bos_id = -1, eos_id = -1, pad_id = -1, unk_id = -1;
  std::vector<int32_t> stop_ids;
  std::string bos_token, eos_token, chat_template;

  // Fills token_ids/special/added from vocab and added_tokens, builds the matcher.
  void finalize();
  int32_t find(std::string_view token) const;
};

// Stage factories shared by the loaders.
std::unique_ptr<PreTokenizer> make_regex_split_pre_tokenizer(std::string_view pattern,
                                                             bool removed, bool invert);
std::unique_ptr<PreTokenizer> make_byte_level_pre_tokenizer(bool add_prefix_space,
                                                            bool use_regex);
std::unique_ptr<PreTokenizer> make_digits_pre_tokenizer(bool individual);
std::unique_ptr<PreTokenizer> make_bert_pre_tokenizer();
std::unique_ptr<PreTokenizer> make_whitespace_split_pre_tokenizer();
std::unique_ptr<PreTokenizer> make_metaspace_pre_tokenizer(std::string replacement,
                                                           std::string prepend_scheme,
                                                           bool split);
std::unique_ptr<PreTokenizer> make_punctuation_pre_tokenizer();

std::unique_ptr<Normalizer> make_bert_normalizer(bool clean_text, bool handle_chinese,
                                                 bool strip_accents, bool lowercase);
std::unique_ptr<Normalizer> make_unicode_normalizer(std::string_view form);  // NFC...
std::unique_ptr<Normalizer> make_lowercase_normalizer();
std::unique_ptr<Normalizer> make_strip_accents_normalizer();
std::unique_ptr<Normalizer> make_replace_normalizer(std::string pattern, bool is_regex,
                                                    std::string content);
std::unique_ptr<Normalizer> make_prepend_normalizer(std::string prefix);
std::unique_ptr<Normalizer> make_strip_normalizer(bool left, bool right);

std::unique_ptr<Decoder> make_byte_level_decoder();
std::unique_ptr<Decoder> make_wordpiece_decoder(std::string prefix, bool cleanup);
std::unique_ptr<Decoder> make_metaspace_decoder(std::string replacement,
                                                std::string prepend_scheme);
std::unique_ptr<Decoder> make_replace_decoder(std::string pattern, std::string content);
std::unique_ptr<Decoder> make_byte_fallback_decoder();
std::unique_ptr<Decoder> make_fuse_decoder();
std::unique_ptr<Decoder> make_strip_decoder(std::string content, size_t start, size_t stop);
std::unique_ptr<Decoder> make_bpe_suffix_decoder(std::string suffix);

// HF's clean_up_tokenization: " ." -> "." and friends.
std::string cleanup_tokenization(std::string text);

std::shared_ptr<const TokenizerImpl> load_hf_json(std::string_view tokenizer_json,
                                                  std::string_view config_json);
std::shared_ptr<const TokenizerImpl> load_gguf(const struct GgufTokenizerData& data);

}  // namespace kiln::tok
