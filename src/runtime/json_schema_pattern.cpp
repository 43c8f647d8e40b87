// JSON Schema's `pattern` (a regex subset, ECMA-262 syntax) -> GBNF for the content of a JSON
// string, used by the schema compiler (json_schema.cpp lists what is supported); the same
// subset as a whole-output constraint (regex_to_gbnf: vLLM's guided_regex). Tested in
// tests/runtime/grammar_test.cpp; fuzzed by fuzz/grammar_fuzz.cpp.
#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "core/status.h"
#include "runtime/grammar.h"
#include "runtime/grammar_internal.h"
#include "tokenizer/unicode.h"

namespace kiln {
namespace {

using grammar_detail::count_suffix;
using grammar_detail::CpRanges;
using grammar_detail::cp_complement;
using grammar_detail::cp_normalize;
using grammar_detail::json_char_set;
using grammar_detail::raw_char_set;

constexpr int kMaxPatternNesting = 256;  // groups in a pattern (they are parsed recursively)

// A practical regex subset (ECMA-262 syntax, as JSON Schema's `pattern`) -> GBNF for the
// content of a JSON string (what lies between its quotes, escapes included; unanchored sides
// match any characters), or (raw) for text that matches the whole pattern, as it is.
class PatternCompiler {
 public:
  // `where` starts every error ("JSON schema at #/x: pattern", "regex").
  PatternCompiler(std::string_view pattern, std::string where, bool raw) : where_(std::move(where)), raw_(raw) {
    if (tok::utf8_find_invalid(pattern) != std::string::npos) fail("the pattern is not valid UTF-8");
    p_ = tok::utf8_to_cps(pattern);
  }

  std::string compile() {
    size_t end = p_.size();
    const bool anchored_start = !p_.empty() && p_[0] == '^';
    i_ = anchored_start ? 1 : 0;
    bool anchored_end = false;
    if (end > i_ && p_[end - 1] == '$') {
      size_t slashes = 0;
      while (end - 1 - slashes > i_ && p_[end - 2 - slashes] == '\\') ++slashes;
      if (slashes % 2 == 0) {
        anchored_end = true;
        --end;
      }
    }
    end_ = end;
    const std::string body = alternation(true).text;
    if (i_ != end_) fail("unmatched ')'");
    if (raw_) return body;  // the whole text matches, anchors or not
    return (anchored_start ? "" : "char* ") + body + (anchored_end ? "" : " char*");
  }

 private:
  template <typename... Args>
  [[noreturn]] void fail(const Args&... args) const {
    throw_error(ErrorCode::kInvalidArgument, where_, ": ", args...,
                " (supported: literals, escapes, classes, '.', groups, '|', quantifiers, ^ and $ at the ends)");
  }
  bool more() const { return i_ < end_; }

  // GBNF text, and whether it can match nothing (then it may not repeat without bound: the
  // grammar would be left-recursive).
  struct Piece {
    std::string text;
    bool nullable = false;
  };

  Piece alternation(bool top) {
    Piece out = sequence();
    out.text = "( " + out.text;
    while (more() && p_[i_] == '|') {
      if (top && !raw_ && (p_[0] == '^' || end_ < p_.size()))
        fail("group a top-level '|' inside the anchors: ^(a|b)$");
      ++i_;
      const Piece seq = sequence();
      out.text += " | " + seq.text;
      out.nullable = out.nullable || seq.nullable;
    }
    out.text += " )";
    return out;
  }

  Piece sequence() {
    Piece out{"", true};
    while (more() && p_[i_] != '|' && p_[i_] != ')') {
      Piece a = atom();
      int64_t min = 1, max = 1;
      a.text += quantifier(min, max);
      if (a.nullable && max < 0) fail("a repetition of something that can match nothing, such as (a?)*");
      out.text += (out.text.empty() ? "" : " ") + a.text;
      out.nullable = out.nullable && (a.nullable || min == 0);
    }
    if (out.text.empty()) out.text = "\"\"";
    return out;
  }

  // A quantifier's GBNF suffix ("" and 1, 1 when there is none).
  std::string quantifier(int64_t& min, int64_t& max) {
    if (!more()) return "";
    const char32_t c = p_[i_];
    if (c == '*') min = 0, max = -1, ++i_;
    else if (c == '+') min = 1, max = -1, ++i_;
    else if (c == '?') min = 0, max = 1, ++i_;
    else if (c == '{' && i_ + 1 < end_ && p_[i_ + 1] >= '0' && p_[i_ + 1] <= '9') {
      ++i_;
      min = max = number();
      if (more() && p_[i_] == ',') {
        ++i_;
        max = more() && p_[i_] == '}' ? -1 : number();
      }
      if (!more() || p_[i_] != '}') fail("expected '}' to close a repetition");
      ++i_;
      if (max >= 0 && max < min) fail("repetition {", min, ",", max, "} runs backwards");
    } else {
      return "";
    }
    if (more() && p_[i_] == '?') ++i_;  // lazy: the same language
    if (more() && (p_[i_] == '+' || p_[i_] == '*' || p_[i_] == '?' || p_[i_] == '{')) fail("a repeated repetition");
    return count_suffix(min, max);
  }

  int64_t number() {
    const size_t at = i_;
    int64_t n = 0;
    while (more() && p_[i_] >= '0' && p_[i_] <= '9') n = std::min<int64_t>(n * 10 + (p_[i_++] - '0'), 1 << 30);
    if (i_ == at) fail("expected a number in a repetition");
    if (n > kGbnfMaxRepeat) fail("repetition count ", n, " is past the limit of ", kGbnfMaxRepeat);
    return n;
  }

  Piece atom() {
    const char32_t c = p_[i_++];
    switch (c) {
      case '(': {
        if (more() && p_[i_] == '?') {
          if (i_ + 1 < end_ && p_[i_ + 1] == ':') i_ += 2;
          else fail("lookarounds and named groups are not supported");
        }
        if (++nesting_ > kMaxPatternNesting) fail("groups nest deeper than ", kMaxPatternNesting, " levels");
        Piece inner = alternation(false);
        if (!more() || p_[i_] != ')') fail("'(' is not closed");
        ++i_;
        --nesting_;
        return inner;
      }
      case '[': return {char_set(char_class())};
      case '.': return {char_set(cp_complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}))};
      case '\\': return {char_set(escape())};
      case '^': case '$': fail("an anchor inside the pattern");
      case '*': case '+': case '?': fail("nothing to repeat");
      default: return {char_set({{c, c}})};
    }
  }

  // After a '\\': the characters it stands for (\d and the like: several).
  CpRanges escape() {
    if (!more()) fail("the pattern ends with '\\'");
    const char32_t c = p_[i_++];
    const CpRanges word = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
    const CpRanges space = {{9, 13}, {' ', ' '}, {0xA0, 0xA0}, {0x2028, 0x2029}, {0xFEFF, 0xFEFF}};
    switch (c) {
      case 'd': return {{'0', '9'}};
      case 'D': return cp_complement({{'0', '9'}});
      case 'w': return word;
      case 'W': return cp_complement(word);
      case 's': return space;
      case 'S': return cp_complement(space);
      case 'n': return {{'\n', '\n'}};
      case 'r': return {{'\r', '\r'}};
      case 't': return {{'\t', '\t'}};
      case 'f': return {{'\f', '\f'}};
      case 'v': return {{'\v', '\v'}};
      case '0': return {{0, 0}};
      case 'x':
      case 'u': {
        const int digits = c == 'x' ? 2 : 4;
        char32_t v = 0;
        for (int k = 0; k < digits; ++k) {
          if (!more() || p_[i_] > 0x7F || !std::isxdigit(int(p_[i_])))
            fail("expected ", digits, " hex digits after \\", char(c));
          const char h = char(p_[i_++]);
          v = v * 16 + char32_t(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
        }
        return {{v, v}};
      }
      default:
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '1' && c <= '9'))
          fail("escape '\\", std::string(1, char(c)),
               "' (word boundaries, backreferences, properties) is not supported");
        return {{c, c}};
    }
  }

  // One character of `set`: as a JSON string writes it, or as it is.
  std::string char_set(const CpRanges& set) const {
    if (!raw_) return json_char_set(set);
    std::string out = raw_char_set(set);
    if (out.empty()) fail("a class that matches no character");
    return out;
  }

  static bool single(const CpRanges& r) { return r.size() == 1 && r[0].first == r[0].second; }

  CpRanges char_class() {
    const bool negated = more() && p_[i_] == '^';
    if (negated) ++i_;
    CpRanges set;
    while (!more() || p_[i_] != ']') {
      if (!more()) fail("'[' is not closed");
      char32_t lo = p_[i_++];
      if (lo == '\\') {
        CpRanges e = more() && p_[i_] == 'b' ? (++i_, CpRanges{{8, 8}}) : escape();
        if (!single(e)) {  // \d and the like
          set.insert(set.end(), e.begin(), e.end());
          continue;
        }
        lo = e[0].first;
      }
      char32_t hi = lo;
      if (i_ + 1 < end_ && p_[i_] == '-' && p_[i_ + 1] != ']') {
        ++i_;
        hi = p_[i_++];
        if (hi == '\\') {
          const CpRanges e = escape();
          if (!single(e)) fail("a class range ends in a class escape");
          hi = e[0].first;
        }
        if (hi < lo) fail("a class range runs backwards");
      }
      set.push_back({lo, hi});
    }
    ++i_;
    set = cp_normalize(std::move(set));
    return negated ? cp_complement(set) : set;
  }

  std::string where_;
  bool raw_ = false;
  std::vector<char32_t> p_;
  size_t i_ = 0;
  size_t end_ = 0;
  int nesting_ = 0;
};

}  // namespace

std::string grammar_detail::json_pattern_to_gbnf(std::string_view pattern, std::string where) {
  return PatternCompiler(pattern, "JSON schema at " + where + ": pattern", /*raw=*/false).compile();
}

std::string regex_to_gbnf(std::string_view pattern) {
  return "root ::= " + PatternCompiler(pattern, "regex", /*raw=*/true).compile() + "\n";
}

std::shared_ptr<const Grammar> grammar_from_regex(std::string_view pattern) {
  return grammar_from_gbnf(regex_to_gbnf(pattern));
}

}  // namespace kiln
