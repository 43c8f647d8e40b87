// Constrained decoding to JSON (OpenAI's response_format {"type": "json_object"}): a
// byte-level acceptor of one JSON object (RFC 8259 syntax, UTF-8 strings), fed the bytes of
// each generated token, and the mask it puts on a row of logits: a token stays only if all
// its bytes continue the document. Tested in tests/runtime/json_constraint_test.cpp.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kiln {

// The state of a JSON document read so far, small and trivially copyable (a token is tried
// on a copy). The top-level value must be an object; nesting deeper than kMaxDepth and runs
// of more than kMaxWhitespace whitespace bytes are refused (a sampler would otherwise be free
// to pad forever).
class JsonAcceptor {
 public:
  static constexpr int kMaxDepth = 64;
  static constexpr int kMaxWhitespace = 16;

  // Whether byte b may come next; if so the state advances past it.
  bool accept(uint8_t b);
  // All bytes of s, in order; false (and the state undefined: try it on a copy) at the first
  // one that may not come next.
  bool accept(std::string_view s);
  // The top-level object is closed: the document is whole.
  bool complete() const { return done_; }
  // The whole state as bytes: equal for states that accept exactly the same continuations
  // (JsonTokenMask's cache key).
  std::string key() const;

 private:
  enum class Lex : uint8_t { kNone, kString, kEscape, kUnicode, kNumber, kLiteral };
  // What the innermost container expects next.
  enum class Expect : uint8_t {
    kValue,         // a value (an object's member value, or the top level)
    kKeyOrEnd,      // after '{': a key or '}'
    kKey,           // after ',' in an object
    kColon,         // after a key
    kCommaOrBrace,  // after an object member's value
    kValueOrEnd,    // after '[': a value or ']'
    kArrayValue,    // after ',' in an array
    kCommaOrBracket,
  };
  bool step(uint8_t b);  // accept() without restoring the state on failure
  bool start_value(uint8_t b);
  void value_done();     // a value ended: the container's next expectation, or the document's end
  bool number_byte(uint8_t b, bool& ended);

  std::array<uint8_t, kMaxDepth> stack_{};  // 0: object, 1: array
  int depth_ = 0;
  Expect expect_ = Expect::kValue;
  Lex lex_ = Lex::kNone;
  bool key_ = false;           // the string being read is an object key
  bool started_ = false;       // the top-level '{' was read
  bool done_ = false;
  uint8_t utf8_left_ = 0;      // continuation bytes still owed by a UTF-8 sequence
  uint8_t utf8_min_ = 0x80;    // bounds of the next continuation byte (overlongs, surrogates)
  uint8_t utf8_max_ = 0xBF;
  uint8_t hex_left_ = 0;       // \uXXXX digits still to read ...
  uint16_t code_ = 0;          // ... and the code unit so far
  bool need_low_ = false;      // a high surrogate's \u low half must follow
  uint8_t number_ = 0;         // number sub-state (json_constraint.cpp)
  uint8_t literal_ = 0;        // the literal being read (0 true, 1 false, 2 null) ...
  uint8_t literal_at_ = 0;     // ... and how many of its bytes were read
  uint8_t whitespace_ = 0;     // consecutive whitespace bytes
};

// A row's mask for a model's vocabulary: pieces[id] is the bytes token id decodes to alone
// (tok::Tokenizer::token_to_piece), empty for special tokens, which never continue a
// document (nothing does once it is complete: the executor ends the choice there). Tokens
// that cannot come next, and ids past `pieces`, get -inf. Returns how many remain allowed.
// Every token's bytes are tried: JsonTokenMask remembers the result per state.
int64_t mask_json_logits(const JsonAcceptor& state, std::span<const std::string> pieces, std::span<float> logits);

// mask_json_logits for one vocabulary, remembering each document state's set of allowed
// tokens (a bit per token): the states of a generation recur (inside a string, after a key's
// colon at the same depth, ...), so most steps reuse a set instead of trying every token's
// bytes. Safe to call from several threads.
class JsonTokenMask {
 public:
  explicit JsonTokenMask(std::vector<std::string> pieces) : pieces_(std::move(pieces)) {}
  // Puts -inf on the tokens of `logits` that cannot come next; returns how many remain.
  int64_t apply(const JsonAcceptor& state, std::span<float> logits);
  // The bytes of token id ("" for special tokens and ids past the vocabulary).
  const std::string& piece(int32_t id) const;
  size_t cached_states() const;

 private:
  static constexpr size_t kMaxStates = 512;  // ~6 KB each for a 49k vocabulary
  std::vector<std::string> pieces_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::vector<uint64_t>> sets_;
};

}  // namespace kiln
