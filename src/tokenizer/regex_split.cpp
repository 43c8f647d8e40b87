// RE2-based pre-tokenizer regex splitting; see regex_split.h for why the pattern is
// rewritten. Tested in tests/tokenizer/pre_tokenizer_test.cpp.
#include "tokenizer/regex_split.h"

#include <re2/re2.h>

#include "core/status.h"
#include "tokenizer/unicode.h"

namespace kiln::tok {

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace {

// Unicode White_Space, which is what Oniguruma's \s matches on UTF-8 input.
constexpr std::string_view kWsBody =
    "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";
constexpr std::string_view kLookaheadIdiom = "\\s+(?!\\S)";

[[noreturn]] void unsupported(std::string_view pattern, std::string_view what) {
  throw_error(ErrorCode::kUnsupported, "pre-tokenizer regex uses ", what,
              ", which kiln's RE2 backend cannot express; pattern: ", pattern);
}

}  // namespace

RegexSplitter::RegexSplitter(std::string_view pattern) : pattern_(pattern) {
  std::string out;
  int group = 0;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (!in_class && pattern.substr(i, kLookaheadIdiom.size()) == kLookaheadIdiom) {
      // The emulation below relies on a plain \s+ alternative right after it to
      // take a one-character run, as in every known pattern.
      if (pattern.substr(i + kLookaheadIdiom.size(), 4) != "|\\s+") {
        unsupported(pattern, "\\s+(?!\\S) not followed by |\\s+");
      }
      lookahead_group_ = ++group;
      out += "([";
      out += kWsBody;
      out += "]+)";
      i += kLookaheadIdiom.size() - 1;
      continue;
    }
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      if (e == 's') {
        if (in_class) {
          out += kWsBody;
        } else {
          out += '[';
          out += kWsBody;
          out += ']';
        }
      } else if (e == 'S') {
        if (in_class) unsupported(pattern, "\\S inside a character class");
        out += "[^";
        out += kWsBody;
        out += ']';
      } else if ((e == 'p' || e == 'P') && i + 1 < pattern.size() && pattern[i + 1] == '{') {
        // A Unicode class \p{...} is copied whole so its '}' is not read as the end
        // of a {n,m} quantifier.
        const size_t close = pattern.find('}', i);
        if (close == std::string_view::npos) unsupported(pattern, "an unterminated \\p{");
        out += '\\';
        out.append(pattern.substr(i, close + 1 - i));
        i = close;
      } else {
        out += '\\';
        out += e;
      }
      continue;
    }
    if (in_class) {
      if (c == ']') in_class = false;
      out += c;
      continue;
    }
    if (c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (c == '(') {
      if (i + 1 < pattern.size() && pattern[i + 1] == '?') {
        const char k = i + 2 < pattern.size() ? pattern[i + 2] : '\0';
        if (k == '=' || k == '!' || k == '<') unsupported(pattern, "lookaround");
        if (k == '>') unsupported(pattern, "an atomic group");
      } else {
        ++group;
      }
    }
    if ((c == '+' || c == '*' || c == '?' || c == '}') && i + 1 < pattern.size() &&
        pattern[i + 1] == '+') {
      unsupported(pattern, "a possessive quantifier");
    }
    out += c;
  }
  RE2::Options opts;
  opts.set_encoding(RE2::Options::EncodingUTF8);
  opts.set_log_errors(false);
  re_ = std::make_unique<RE2>(out, opts);
  if (!re_->ok()) {
    throw_error(ErrorCode::kUnsupported, "pre-tokenizer regex does not compile with RE2: ",
                re_->error(), "; pattern: ", pattern);
  }
  num_groups_ = re_->NumberOfCapturingGroups();
}

RegexSplitter::~RegexSplitter() = default;
RegexSplitter::RegexSplitter(RegexSplitter&&) noexcept = default;
RegexSplitter& RegexSplitter::operator=(RegexSplitter&&) noexcept = default;

void RegexSplitter::split(std::string_view text, std::vector<std::string_view>& spans,
                          std::vector<bool>* is_match) const {
  std::vector<re2::StringPiece> groups(static_cast<size_t>(num_groups_) + 1);
  size_t pos = 0;
  size_t gap_start = 0;
  const re2::StringPiece input(text.data(), text.size());
  auto emit = [&](size_t b, size_t e, bool match) {
    if (e <= b) return;
    spans.push_back(text.substr(b, e - b));
    if (is_match) is_match->push_back(match);
  };
  while (pos < text.size()) {
    if (!re_->Match(input, pos, text.size(), RE2::UNANCHORED, groups.data(),
                    static_cast<int>(groups.size()))) {
      break;
    }
    size_t begin = static_cast<size_t>(groups[0].data() - text.data());
    size_t end = begin + groups[0].size();
    if (lookahead_group_ > 0) {
      const auto& g = groups[static_cast<size_t>(lookahead_group_)];
      // The emulated \s+(?!\S) matched a whole whitespace run that a non-space
      // follows: the real lookahead would stop one character earlier (and fail when
      // the run is one character, leaving it to the next alternative, e.g. \s+).
      if (g.data() != nullptr && end < text.size()) {
        size_t last = begin;
        size_t p = begin;
        char32_t cp;
        while (p < end) {
          last = p;
          p += std::max<size_t>(1, utf8_decode(text, p, &cp));
        }
        // A one-character run makes the real alternative fail; the \s+ that the
        // constructor insists follows it then takes the same single character.
        if (last > begin) end = last;
      }
    }
    if (end == begin) {  // empty match: step one character to guarantee progress
      char32_t cp;
      const size_t n = std::max<size_t>(1, utf8_decode(text, pos, &cp));
      pos += n;
      continue;
    }
    emit(gap_start, begin, false);
    emit(begin, end, true);
    pos = gap_start = end;
  }
  emit(gap_start, text.size(), false);
}

}  // namespace kiln::tok
