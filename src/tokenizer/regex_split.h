// Splits text with a HuggingFace/Oniguruma-style pre-tokenizer regex using RE2.
// RE2 has no lookaround and an ASCII-only \s, so the pattern is rewritten: \s and \S
// become the Unicode White_Space set, and the GPT-2 idiom `\s+(?!\S)` is emulated by
// a marked group whose match gives back its last character when a non-space follows
// (what HF and llama.cpp do). Tested in tests/tokenizer/pre_tokenizer_test.cpp.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace re2 {
class RE2;
}

namespace kiln::tok {

class RegexSplitter {
 public:
  // Throws kiln::Error(kUnsupported) for constructs RE2 cannot express.
  explicit RegexSplitter(std::string_view pattern);
  ~RegexSplitter();
  RegexSplitter(RegexSplitter&&) noexcept;
  RegexSplitter& operator=(RegexSplitter&&) noexcept;

  // One span per match, in order; `gaps` (when non-null) receives whether each span
  // is a gap between matches (true) or a match (false). Every byte of text is covered.
  void split(std::string_view text, std::vector<std::string_view>& spans,
             std::vector<bool>* is_match) const;

  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  std::unique_ptr<re2::RE2> re_;
  int lookahead_group_ = -1;  // capture group standing in for \s+(?!\S), 1-based
  int num_groups_ = 0;
};

// The pre-tokenizer regexes of well-known models (HF tokenizer.json / llama.cpp).
extern const char* const kGpt2Pattern;
extern const char* const kLlama3Pattern;
extern const char* const kQwen2Pattern;

}  // namespace kiln::tok
