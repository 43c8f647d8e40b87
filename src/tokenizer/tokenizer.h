// Public tokenizer API: text <-> token ids with exact HuggingFace `tokenizers`
// parity for byte-level BPE (GPT-2, Llama-3, Qwen2, SmolLM), SentencePiece-style BPE
// with byte fallback and WordPiece (BERT), loaded from a HF directory or GGUF
// metadata; plus streaming detokenization and chat-template rendering.
// Tested in tests/tokenizer/ against fixtures from tools/tokenizer/gen_tokenizer_fixtures.py.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::tok {

// Exactly the `tokenizer.ggml.*` (and `tokenizer.chat_template`) metadata of a GGUF
// file; the GGUF reader (src/frontends/gguf.*) fills it. Absent keys stay empty / -1
// / nullopt.
struct GgufTokenizerData {
  std::string model;                    // tokenizer.ggml.model: "gpt2", "llama", "bert"
  std::string pre;                      // tokenizer.ggml.pre: "smollm", "llama-bpe", ...
  std::vector<std::string> tokens;      // tokenizer.ggml.tokens
  std::vector<float> scores;            // tokenizer.ggml.scores
  std::vector<int32_t> token_type;      // tokenizer.ggml.token_type (1 normal, 2 unknown,
                                        // 3 control, 4 user defined, 5 unused, 6 byte)
  std::vector<std::string> merges;      // tokenizer.ggml.merges, "a b"
  int32_t bos_id = -1;                  // tokenizer.ggml.bos_token_id
  int32_t eos_id = -1;                  // tokenizer.ggml.eos_token_id
  int32_t unk_id = -1;                  // tokenizer.ggml.unknown_token_id
  int32_t pad_id = -1;                  // tokenizer.ggml.padding_token_id
  int32_t sep_id = -1;                  // tokenizer.ggml.seperator_token_id (sic)
  int32_t cls_id = -1;                  // tokenizer.ggml.cls_token_id
  int32_t mask_id = -1;                 // tokenizer.ggml.mask_token_id
  std::optional<bool> add_bos;          // tokenizer.ggml.add_bos_token
  std::optional<bool> add_eos;          // tokenizer.ggml.add_eos_token
  std::optional<bool> add_space_prefix; // tokenizer.ggml.add_space_prefix
  std::optional<bool> lowercase;        // tokenizer.ggml.normalizer.lowercase (bert; absent: true)
  std::optional<bool> strip_accents;    // tokenizer.ggml.normalizer.strip_accents (absent: as lowercase)
  std::string chat_template;            // tokenizer.chat_template
};

// The output of encode_full / encode_pair (what BERT-style encoders consume).
struct Encoding {
  std::vector<int32_t> ids;
  std::vector<int32_t> type_ids;        // 0 for the first sequence, 1 for the second
  std::vector<int32_t> attention_mask;  // 1 for real tokens, 0 for padding
};

struct EncodeOptions {
  bool add_special = true;    // BOS/EOS/[CLS]/[SEP] from the post-processor
  bool parse_special = true;  // recognise special tokens written in the text
  size_t max_length = 0;      // truncate (longest first) to this many ids; 0 = none
  size_t pad_to = 0;          // pad with pad_id up to this length; 0 = none
};

struct TokenizerImpl;

// Immutable once built; every method is safe to call from several threads.
class Tokenizer {
 public:
  // A HF model directory: tokenizer.json (+ tokenizer_config.json), or the older
  // vocab.txt (BERT) / vocab.json + merges.txt (GPT-2) / tokenizer.model
  // (SentencePiece) layouts.
  static Tokenizer from_hf_dir(const std::filesystem::path& dir);
  // The contents of tokenizer.json and (optionally, may be empty) tokenizer_config.json.
  static Tokenizer from_hf_json(std::string_view tokenizer_json,
                                std::string_view tokenizer_config_json = {});
  static Tokenizer from_gguf(const GgufTokenizerData& data);
  // A SentencePiece `tokenizer.model`, run by libsentencepiece.
  static Tokenizer from_sentencepiece(const std::filesystem::path& model_file);

  // Text must be valid UTF-8 (else kiln::Error kInvalidArgument).
  std::vector<int32_t> encode(std::string_view text, bool add_special = true) const;
  Encoding encode_full(std::string_view text, const EncodeOptions& options) const;
  Encoding encode_pair(std::string_view first, std::string_view second,
                       const EncodeOptions& options) const;

  std::string decode(std::span<const int32_t> ids, bool skip_special = true) const;
  // The bytes one token stands for when decoded alone (may be a partial UTF-8
  // sequence for byte tokens); what llama.cpp calls a piece.
  std::string token_to_piece(int32_t id) const;
  // The vocabulary string of a token ("Ġhello", "##ing", "<0x0A>"); "" if out of range.
  std::string id_to_token(int32_t id) const;
  // -1 when the string is not a token.
  int32_t token_to_id(std::string_view token) const;
  bool is_special(int32_t id) const;

  int32_t bos_id() const;
  int32_t eos_id() const;
  int32_t pad_id() const;
  int32_t unk_id() const;
  // Ids that end generation: eos plus end-of-turn tokens such as <|im_end|>, <|eot_id|>.
  std::vector<int32_t> stop_ids() const;
  size_t vocab_size() const;
  const std::string& bos_token() const;
  const std::string& eos_token() const;
  // The Jinja chat template, "" if the files had none.
  const std::string& chat_template() const;

  const TokenizerImpl& impl() const { return *impl_; }
  explicit Tokenizer(std::shared_ptr<const TokenizerImpl> impl);

 private:
  std::shared_ptr<const TokenizerImpl> impl_;
};

// Incremental detokenization for streaming generation. put() returns only text that
// can no longer change: never a broken UTF-8 sequence, never a word the decoder would
// still merge or clean up differently. The concatenation of every put() and the final
// flush() equals tokenizer.decode(all ids) (for byte fallback, unless a run of byte
// tokens turns out invalid after part of it was released as valid text).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = true);
  std::string put(int32_t id);
  std::string flush();
  void reset();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::vector<int32_t> ids_;
  std::string fresh_text(const std::string& text) const;
  std::string prefix_;     // decode of the leading ids_, already returned
  size_t prefix_ids_ = 0;  // leading ids_ that only give context for the next release
};

}  // namespace kiln::tok
