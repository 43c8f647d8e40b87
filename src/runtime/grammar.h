// Constrained decoding to a context-free grammar over bytes: llama.cpp's GBNF (the `grammar`
// request parameter) or a JSON Schema compiled to one (OpenAI's response_format json_schema),
// the state of a document read so far (a set of parse stacks), and the mask it puts on a row
// of logits, computed by walking a trie of the vocabulary's pieces. Tested in
// tests/runtime/grammar_test.cpp.
#pragma once

#include <array>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kiln {

// 256 bits: byte b is bit b % 64 of word b / 64.
using ByteSet = std::array<uint64_t, 4>;

inline bool byte_set_has(const ByteSet& s, uint8_t b) { return (s[b >> 6] >> (b & 63)) & 1; }

// An immutable compiled grammar over bytes (share it between requests). Every alternative of
// every rule is a run of elements closed by kEnd in one flat array, so a parse position is
// one index into it; an element is a byte set (one byte of input) or a rule reference.
// Repetitions and groups of the source became generated, right-recursive rules.
class Grammar {
 public:
  static constexpr int32_t kEnd = -1;

  // The element at `pos`: >= 0 a byte set's index, kEnd, or a rule reference (is_rule).
  int32_t element(int32_t pos) const { return elements_[size_t(pos)]; }
  static bool is_rule(int32_t e) { return e <= -2; }
  static int32_t rule_of(int32_t e) { return -e - 2; }
  const ByteSet& byte_set(int32_t id) const { return sets_[size_t(id)]; }
  // Where each alternative of `rule` starts.
  std::span<const int32_t> alternatives(int32_t rule) const {
    return {alt_starts_.data() + rule_alts_[size_t(rule)],
            size_t(rule_alts_[size_t(rule) + 1] - rule_alts_[size_t(rule)])};
  }
  int32_t root() const { return root_; }
  size_t rule_count() const { return rule_names_.size(); }
  const std::string& rule_name(int32_t rule) const { return rule_names_[size_t(rule)]; }
  size_t element_count() const { return elements_.size(); }
  // The compiled rules in GBNF (byte sets as byte classes), for debugging.
  std::string dump() const;

 private:
  friend class GrammarCompiler;
  Grammar() = default;

  std::vector<int32_t> elements_;
  std::vector<int32_t> alt_starts_;  // rule r's alternatives: [rule_alts_[r], rule_alts_[r + 1])
  std::vector<int32_t> rule_alts_;
  std::vector<std::string> rule_names_;
  std::vector<ByteSet> sets_;
  int32_t root_ = 0;
};

// llama.cpp's GBNF (root rule "root"; rules `name ::= ...`, alternatives `|`, sequences,
// grouping `( )`, `?` `*` `+`, `{m}` `{m,}` `{m,n}`, string literals "..." with escapes
// \n \t \r \" \\ \xHH \uHHHH \UHHHHHHHH, char classes [a-z] [^...] with escapes, `.` (any
// UTF-8 character), `#` comments). Classes and `.` are sets of code points matched as their
// UTF-8 bytes (\xHH is the code point U+00HH, as in llama.cpp). A rule ends where the next
// `name ::=` starts, so rules may span lines. Throws kiln::Error(kInvalidArgument) naming the
// line/rule for syntax errors, undefined or twice-defined rules, a missing root, left
// recursion, repetition counts past kGbnfMaxRepeat, and groups nested past 1024 levels.
constexpr int kGbnfMaxRepeat = 65536;
std::shared_ptr<const Grammar> grammar_from_gbnf(std::string_view text);

// JSON Schema subset -> GBNF for one JSON document matching the schema (json_schema.cpp lists
// what is supported). Throws kInvalidArgument naming the JSON pointer of an unsupported or
// invalid keyword.
std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema);
// grammar_from_gbnf(json_schema_to_gbnf(schema)).
std::shared_ptr<const Grammar> grammar_from_json_schema(const nlohmann::ordered_json& schema);

// A regex (the subset JSON Schema's `pattern` takes: literals, escapes, classes, '.', groups,
// '|', quantifiers; ^ and $ only at the ends) -> GBNF for text that matches it whole, as
// vLLM's guided_regex and Outlines constrain it ('.' is any character but a line break).
// Throws kInvalidArgument ("regex: ...") naming what is not supported.
std::string regex_to_gbnf(std::string_view pattern);
// grammar_from_gbnf(regex_to_gbnf(pattern)).
std::shared_ptr<const Grammar> grammar_from_regex(std::string_view pattern);

namespace grammar_detail {
// Code point ranges [first, last]; cp_normalize sorts and merges them, cp_complement takes a
// normalized set's complement within [0, U+10FFFF]. Shared by the GBNF and schema compilers.
using CpRanges = std::vector<std::pair<char32_t, char32_t>>;
CpRanges cp_normalize(CpRanges r);
CpRanges cp_complement(const CpRanges& r);

// A return position below a stack's top; frames form a tree (stacks share their bottoms).
struct Frame {
  int32_t ret;     // where the parent continues once the callee is done
  int32_t parent;  // -1 at the bottom
  int32_t depth;   // frames in the chain, this one included
  uint64_t hash;   // of the whole chain: equal chains hash equal
};
// One stack: its top position (always a byte-set element) and the frame below it.
struct Head {
  int32_t pos;
  int32_t frame;
  uint64_t hash;  // of pos and the frame chain
};
}  // namespace grammar_detail

// The state of a document read so far: a set of distinct parse stacks, cheap to copy (a
// token is tried on a copy). Paths deeper than kMaxDepth frames are dropped (a JSON value
// nests up to 256 levels), and a byte that would lead to more than kMaxStacks stacks (or too
// much work) is refused, so pathological grammars cannot blow up memory or time.
class GrammarState {
 public:
  static constexpr int32_t kMaxDepth = 512;
  static constexpr size_t kMaxStacks = 2048;

  explicit GrammarState(std::shared_ptr<const Grammar> grammar);
  // All bytes of s in order; false at the first byte that may not come next (the state is
  // then unspecified: try on a copy).
  bool accept(std::string_view bytes);
  // The document may end here (the root rule is fully matched on some path).
  bool complete() const { return complete_; }
  // Some byte may still come next.
  bool can_continue() const { return !heads_.empty(); }
  // Equal for states with the same set of stacks (so they accept the same continuations): the
  // canonical form's bytes (GrammarTokenMask's cache key).
  std::string key() const;
  const Grammar& grammar() const { return *grammar_; }
  size_t stack_count() const { return heads_.size(); }

 private:
  friend class GrammarTokenMask;
  void canonicalize();

  std::shared_ptr<const Grammar> grammar_;
  std::vector<grammar_detail::Frame> frames_;
  std::vector<grammar_detail::Head> heads_;
  bool complete_ = false;
};

// A vocabulary's token pieces (pieces[id] = the bytes token id decodes to alone; "" for
// special tokens, which never match) arranged as a byte trie, built once per model and
// shared by every grammar's mask. Nodes are in preorder, so a node's subtree is the range
// [node + 1, end) and its children are node + 1, then each child's `end`.
class TokenTrie {
 public:
  struct Node {
    int32_t end;           // one past the last node of this subtree
    int32_t tokens_begin;  // ids whose piece ends here: ids()[tokens_begin, tokens_end)
    int32_t tokens_end;
    uint8_t byte;          // the byte leading here from the parent (0 at the root)
  };

  explicit TokenTrie(std::vector<std::string> pieces);
  size_t vocab_size() const { return pieces_.size(); }
  const std::string& piece(int32_t id) const;  // "" past the vocabulary
  std::span<const Node> nodes() const { return nodes_; }
  std::span<const int32_t> ids() const { return ids_; }

 private:
  std::vector<std::string> pieces_;
  std::vector<Node> nodes_;
  std::vector<int32_t> ids_;
};

// The mask one grammar puts on logits rows: tokens whose every byte continues the document
// stay, the rest get -inf (ids past the vocabulary too). Whether to end the choice when the
// state is complete() is the caller's (EOS is not modelled). Each state's allowed set (a bit
// per token) is remembered by GrammarState::key(), least recently used first out past
// max_cache_bytes (4 MiB: ~200 states of a 150k vocabulary). Thread-safe.
class GrammarTokenMask {
 public:
  static constexpr size_t kMaxCacheBytes = size_t(4) << 20;
  // A state's walk of the vocabulary may take this many expansion steps (a JSON Schema's
  // state inside a string takes ~2.3 M over a 50k vocabulary, 12 ms on the dev VM; a 256k
  // vocabulary's ~5x that): an ambiguous grammar whose states hold hundreds of stacks would
  // otherwise take minutes per mask and stall every request.
  static constexpr int64_t kMaxMaskWork = int64_t(1) << 25;

  GrammarTokenMask(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTrie> vocab,
                   size_t max_cache_bytes = kMaxCacheBytes);
  // Puts -inf on the tokens of `logits` that cannot come next; returns how many stay, or -1
  // (logits untouched) when the state's set would take more than kMaxMaskWork. `ends` (the
  // end-of-sequence and stop ids) keep their logits where the state is complete(): the
  // document may end there.
  int64_t apply(const GrammarState& state, std::span<float> logits, std::span<const int32_t> ends = {});
  // The allowed set without the cache: bit id % 64 of word id / 64 (kiln::Error past
  // kMaxMaskWork).
  std::vector<uint64_t> allowed(const GrammarState& state) const;
  size_t cached_states() const;

 private:
  struct Cut;
  // The allowed set into `bits`; false past kMaxMaskWork.
  bool walk(const GrammarState& state, std::vector<uint64_t>& bits) const;
  // The same, sharing the walk above the stacks' common frame with other states (grammar.cpp).
  bool split_walk(const GrammarState& state, std::vector<uint64_t>& bits) const;
  using Bits = std::shared_ptr<const std::vector<uint64_t>>;
  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const TokenTrie> vocab_;
  size_t max_states_;
  mutable std::mutex mu_;
  std::list<std::pair<std::string, Bits>> lru_;  // most recently used first
  std::unordered_map<std::string, std::list<std::pair<std::string, Bits>>::iterator> sets_;
  static constexpr size_t kMaxCuts = 64;
  mutable std::unordered_map<std::string, std::shared_ptr<const Cut>> cuts_;  // by the cut's positions
};

}  // namespace kiln
