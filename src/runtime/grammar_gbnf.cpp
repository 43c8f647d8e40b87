// The GBNF compiler (grammar_from_gbnf, see grammar.h): GBNF text parsed straight into a
// Grammar's flat rules, code point classes turned into UTF-8 byte-set sequences, names, the
// root and left recursion checked. Tested in tests/runtime/grammar_test.cpp; fuzzed by
// fuzz/grammar_fuzz.cpp.
#include "runtime/grammar.h"

#include <algorithm>
#include <map>
#include <string>
#include <unordered_map>

#include "core/status.h"
#include "runtime/grammar_internal.h"
#include "tokenizer/unicode.h"

namespace kiln {
namespace {

using grammar_detail::cp_complement;
using grammar_detail::cp_normalize;
using grammar_detail::CpRanges;
using grammar_detail::kMaxCodePoint;
using ByteRange = std::pair<uint8_t, uint8_t>;
// Bounds on what one grammar may compile to.
constexpr size_t kMaxElements = size_t(1) << 22;
// Groups are parsed recursively: bounded so that a request cannot overflow the stack.
constexpr int kMaxNesting = 1024;
// Generated rules are named after the rule they appear in, cut to this many bytes (a long
// name repeated in 65536 generated ones would be a request's memory many times over).
constexpr size_t kMaxGeneratedName = 64;

// UTF-8 cannot encode the surrogates.
CpRanges cp_without_surrogates(const CpRanges& r) {
  CpRanges out;
  for (auto [a, b] : r) {
    if (b < 0xD800 || a > 0xDFFF) {
      out.push_back({a, b});
      continue;
    }
    if (a < 0xD800) out.push_back({a, 0xD7FF});
    if (b > 0xDFFF) out.push_back({0xE000, b});
  }
  return out;
}

// The UTF-8 encodings of the code points [first, last] (no surrogates) as sequences of byte
// ranges, in order (the algorithm of Rust's regex-syntax utf8 module): split where the encoded
// length changes, then wherever a continuation byte would not run over all of 80-BF. The full
// range gives C2-DF 80-BF | E0 A0-BF 80-BF | E1-EC 80-BF 80-BF | ED 80-9F 80-BF | ...
void utf8_sequences(char32_t first, char32_t last, std::vector<std::vector<ByteRange>>& out) {
  std::vector<std::pair<char32_t, char32_t>> todo = {{first, last}};
  while (!todo.empty()) {
    auto [s, e] = todo.back();
    todo.pop_back();
    for (bool split = true; split;) {
      split = false;
      for (char32_t max : {char32_t(0x7F), char32_t(0x7FF), char32_t(0xFFFF)})
        if (s <= max && max < e) {
          todo.push_back({max + 1, e});
          e = max;
          split = true;
          break;
        }
      for (int i = 1; i < 4 && !split && e > 0x7F; ++i) {
        const char32_t m = (char32_t(1) << (6 * i)) - 1;
        if ((s & ~m) == (e & ~m)) continue;
        if ((s & m) != 0) {
          todo.push_back({(s | m) + 1, e});
          e = s | m;
          split = true;
        } else if ((e & m) != m) {
          todo.push_back({e & ~m, e});
          e = (e & ~m) - 1;
          split = true;
        }
      }
    }
    const std::string a = tok::utf8_encode(s), b = tok::utf8_encode(e);
    std::vector<ByteRange> seq;
    for (size_t k = 0; k < a.size(); ++k) seq.push_back({uint8_t(a[k]), uint8_t(b[k])});
    out.push_back(std::move(seq));
  }
}

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

}  // namespace

// Parses GBNF straight into rules of elements (groups and repetitions become generated rules
// named after the rule they appear in), then checks names, the root and left recursion.
class GrammarCompiler {
 public:
  explicit GrammarCompiler(std::string_view text) : src_(text) {}
  std::shared_ptr<const Grammar> compile();

 private:
  using Seq = std::vector<int32_t>;
  struct Rule {
    std::string name;
    std::vector<Seq> alts;
    bool defined = false;
    bool generated = false;
    size_t pos = 0;       // where it is defined, or first used while undefined
    int32_t origin = -1;  // generated: the named rule it came from; else the first user
  };

  template <typename... Args>
  [[noreturn]] void fail_at(size_t pos, const Args&... args) const;
  size_t line_of(size_t pos) const { return size_t(std::count(src_.begin(), src_.begin() + long(pos), '\n')) + 1; }
  void skip_space();
  bool eof() const { return pos_ >= src_.size(); }
  char peek() const { return eof() ? '\0' : src_[pos_]; }
  bool at_rule_start();
  std::string parse_name();
  std::vector<Seq> parse_alternatives();
  void parse_item(Seq& out);
  char32_t parse_char();
  int parse_count();
  void repeat(Seq& out, size_t unit_begin, int min, int max, size_t at);
  int32_t rule_named(const std::string& name, size_t pos);
  int32_t new_rule(std::vector<Seq> alts);
  int32_t set_element(const ByteSet& s);
  int32_t class_element(const CpRanges& cps);
  void add_elements(size_t n, size_t at);
  void check_names() const;
  void check_left_recursion() const;
  static int32_t ref(int32_t rule) { return -rule - 2; }

  std::string_view src_;
  size_t pos_ = 0;
  int32_t current_ = -1;  // the rule being parsed
  int generated_ = 0;     // rules generated for it so far
  int nesting_ = 0;       // groups open at pos_
  size_t elements_ = 0;
  std::vector<Rule> rules_;
  std::unordered_map<std::string, int32_t> names_;
  std::map<ByteSet, int32_t> set_ids_;
  std::vector<ByteSet> sets_;
  std::map<CpRanges, int32_t> classes_;
};

template <typename... Args>
void GrammarCompiler::fail_at(size_t pos, const Args&... args) const {
  pos = std::min(pos, src_.size());
  const size_t newline = pos == 0 ? std::string_view::npos : src_.rfind('\n', pos - 1);
  const size_t column = pos - (newline == std::string_view::npos ? 0 : newline + 1) + 1;
  const std::string rule = current_ >= 0 ? str_cat(" (rule '", rules_[size_t(current_)].name, "')") : "";
  throw_error(ErrorCode::kInvalidArgument, "GBNF line ", line_of(pos), ", column ", column, rule, ": ", args...);
}

void GrammarCompiler::skip_space() {
  while (!eof()) {
    const char c = src_[pos_];
    if (c == '#') {
      while (!eof() && src_[pos_] != '\n') ++pos_;
    } else if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
      ++pos_;
    } else {
      break;
    }
  }
}

// A name followed by `::=` starts the next rule (and ends the current one).
bool GrammarCompiler::at_rule_start() {
  const size_t at = pos_;
  while (!eof() && is_name_char(src_[pos_])) ++pos_;
  bool start = pos_ > at;
  if (start) {
    skip_space();
    start = src_.substr(pos_, 3) == "::=";
  }
  pos_ = at;
  return start;
}

std::string GrammarCompiler::parse_name() {
  const size_t at = pos_;
  while (!eof() && is_name_char(src_[pos_])) ++pos_;
  if (pos_ == at) fail_at(at, "expected a rule name, found '", std::string(1, peek()), "'");
  return std::string(src_.substr(at, pos_ - at));
}

// One code point of a literal or class: an escape or a UTF-8 character of the source.
char32_t GrammarCompiler::parse_char() {
  const size_t at = pos_;
  if (src_[pos_] == '\n' || src_[pos_] == '\r') fail_at(at, "a line break inside a literal or class (write \\n)");
  if (src_[pos_] != '\\') {
    char32_t cp = 0;
    const size_t n = tok::utf8_decode(src_, pos_, &cp);
    if (n == 0) fail_at(at, "invalid UTF-8 in the grammar");
    pos_ += n;
    return cp;
  }
  if (++pos_ >= src_.size()) fail_at(at, "the grammar ends inside an escape");
  const char c = src_[pos_++];
  int digits = 0;
  switch (c) {
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case '\\': case '"': case '[': case ']': case '-': case '^': case '/': case '\'': return char32_t(c);
    case 'x': digits = 2; break;
    case 'u': digits = 4; break;
    case 'U': digits = 8; break;
    default: fail_at(at, "unknown escape '\\", std::string(1, c), "'");
  }
  uint64_t value = 0;
  for (int i = 0; i < digits; ++i, ++pos_) {
    const char h = peek();
    const int v = h >= '0' && h <= '9' ? h - '0' : (h | 0x20) >= 'a' && (h | 0x20) <= 'f' ? (h | 0x20) - 'a' + 10 : -1;
    if (v < 0) fail_at(pos_, "expected ", digits, " hex digits after '\\", std::string(1, c), "'");
    value = value * 16 + uint64_t(v);
  }
  if (value > kMaxCodePoint) fail_at(at, "code point 0x", std::hex, value, " is past U+10FFFF");
  if (value >= 0xD800 && value <= 0xDFFF) fail_at(at, "a surrogate (0x", std::hex, value, ") is not a character");
  return char32_t(value);
}

int GrammarCompiler::parse_count() {
  skip_space();
  const size_t at = pos_;
  int64_t n = 0;
  while (!eof() && src_[pos_] >= '0' && src_[pos_] <= '9') {
    n = std::min<int64_t>(n * 10 + (src_[pos_++] - '0'), int64_t(1) << 40);
  }
  if (pos_ == at) fail_at(at, "expected a repetition count");
  if (n > kGbnfMaxRepeat) fail_at(at, "repetition count ", n, " is past the limit of ", kGbnfMaxRepeat);
  skip_space();
  return int(n);
}

int32_t GrammarCompiler::rule_named(const std::string& name, size_t pos) {
  if (auto it = names_.find(name); it != names_.end()) return it->second;
  rules_.push_back({name, {}, false, false, pos, current_});
  return names_[name] = int32_t(rules_.size() - 1);
}

int32_t GrammarCompiler::new_rule(std::vector<Seq> alts) {
  const std::string_view base = current_ >= 0 ? std::string_view(rules_[size_t(current_)].name) : "class";
  rules_.push_back({str_cat(base.substr(0, kMaxGeneratedName), "-", ++generated_), std::move(alts), true, true, pos_,
                    current_});
  return int32_t(rules_.size() - 1);
}

int32_t GrammarCompiler::set_element(const ByteSet& s) {
  auto [it, added] = set_ids_.emplace(s, int32_t(sets_.size()));
  if (added) sets_.push_back(s);
  return it->second;
}

void GrammarCompiler::add_elements(size_t n, size_t at) {
  elements_ += n;
  if (elements_ > kMaxElements) fail_at(at, "the grammar is too large (over ", kMaxElements, " elements)");
}

// A set of code points: one byte-set element when it is all ASCII, else a rule whose
// alternatives are the ASCII byte set and each UTF-8 byte-range sequence.
int32_t GrammarCompiler::class_element(const CpRanges& cps) {
  if (auto it = classes_.find(cps); it != classes_.end()) return it->second;
  ByteSet ascii{};
  std::vector<std::vector<ByteRange>> seqs;
  for (auto [a, b] : cps) {
    for (char32_t c = a; c <= std::min<char32_t>(b, 0x7F); ++c) ascii[c >> 6] |= uint64_t(1) << (c & 63);
    if (b >= 0x80) utf8_sequences(std::max<char32_t>(a, 0x80), b, seqs);
  }
  int32_t element = set_element(ascii);
  if (!seqs.empty()) {
    std::vector<Seq> alts;
    if (ascii != ByteSet{}) alts.push_back({element});
    for (const auto& seq : seqs) {
      Seq alt;
      for (auto [lo, hi] : seq) {
        ByteSet s{};
        for (int c = lo; c <= hi; ++c) s[size_t(c) >> 6] |= uint64_t(1) << (c & 63);
        alt.push_back(set_element(s));
      }
      alts.push_back(std::move(alt));
    }
    element = ref(new_rule(std::move(alts)));
  }
  return classes_[cps] = element;
}

// out[unit_begin, end) repeated min to max (-1: unbounded) times: min copies, then a chain
// of nested optional rules (x{0,3} = (x (x (x)?)?)?, unambiguous) or a right-recursive star.
void GrammarCompiler::repeat(Seq& out, size_t unit_begin, int min, int max, size_t at) {
  if (max >= 0 && max < min) fail_at(at, "repetition {", min, ",", max, "} has its maximum below its minimum");
  Seq unit(out.begin() + long(unit_begin), out.end());
  out.resize(unit_begin);
  if (unit.empty()) return;
  if (unit.size() > 1 && (min > 1 || max > 1)) unit = {ref(new_rule({unit}))};
  add_elements(unit.size() * size_t(std::max(min, max) + 1) * 2, at);
  for (int i = 0; i < min; ++i) out.insert(out.end(), unit.begin(), unit.end());
  if (max < 0) {
    const int32_t star = new_rule({});
    Seq again = unit;
    again.push_back(ref(star));
    rules_[size_t(star)].alts = {again, {}};
    out.push_back(ref(star));
    return;
  }
  int32_t inner = -1;
  for (int k = 0; k < max - min; ++k) {
    Seq once = unit;
    if (inner >= 0) once.push_back(ref(inner));
    inner = new_rule({once, {}});
  }
  if (inner >= 0) out.push_back(ref(inner));
}

void GrammarCompiler::parse_item(Seq& out) {
  const size_t begin = out.size(), at = pos_;
  const char c = peek();
  if (c == '"') {
    ++pos_;
    std::string bytes;
    while (peek() != '"') {
      if (eof()) fail_at(at, "unterminated literal");
      tok::utf8_append(bytes, parse_char());
    }
    ++pos_;
    add_elements(bytes.size(), at);
    for (char b : bytes) {
      ByteSet s{};
      s[uint8_t(b) >> 6] |= uint64_t(1) << (uint8_t(b) & 63);
      out.push_back(set_element(s));
    }
  } else if (c == '[') {
    ++pos_;
    const bool negated = peek() == '^';
    if (negated) ++pos_;
    CpRanges ranges;
    while (peek() != ']') {
      if (eof()) fail_at(at, "unterminated character class");
      const char32_t lo = parse_char();
      char32_t hi = lo;
      if (peek() == '-' && pos_ + 1 < src_.size() && src_[pos_ + 1] != ']') {
        ++pos_;
        if (eof()) fail_at(at, "unterminated character class");
        hi = parse_char();
        if (hi < lo) fail_at(at, "a class range runs backwards");
      }
      ranges.push_back({lo, hi});
    }
    ++pos_;
    if (ranges.empty()) fail_at(at, "an empty character class");
    ranges = cp_normalize(std::move(ranges));
    if (negated) ranges = cp_complement(ranges);
    add_elements(1, at);
    out.push_back(class_element(cp_without_surrogates(ranges)));
  } else if (c == '.') {
    ++pos_;
    add_elements(1, at);
    out.push_back(class_element(cp_without_surrogates({{0, kMaxCodePoint}})));
  } else if (c == '(') {
    ++pos_;
    if (++nesting_ > kMaxNesting) fail_at(at, "groups nest deeper than ", kMaxNesting, " levels");
    std::vector<Seq> alts = parse_alternatives();
    if (peek() != ')') fail_at(at, "'(' is not closed");
    ++pos_;
    --nesting_;
    if (alts.size() == 1) out.insert(out.end(), alts[0].begin(), alts[0].end());
    else out.push_back(ref(new_rule(std::move(alts))));
  } else if (is_name_char(c)) {
    out.push_back(ref(rule_named(parse_name(), at)));
    add_elements(1, at);
  } else {
    fail_at(at, "expected a literal, a class, '.', '(' or a rule name, found '", std::string(1, c), "'");
  }
  for (;;) {
    skip_space();
    const size_t op = pos_;
    switch (peek()) {
      case '*': ++pos_; repeat(out, begin, 0, -1, op); continue;
      case '+': ++pos_; repeat(out, begin, 1, -1, op); continue;
      case '?': ++pos_; repeat(out, begin, 0, 1, op); continue;
      case '{': {
        ++pos_;
        const int min = parse_count();
        int max = min;
        if (peek() == ',') {
          ++pos_;
          skip_space();
          max = peek() == '}' ? -1 : parse_count();
        }
        if (peek() != '}') fail_at(op, "expected '}' to close the repetition");
        ++pos_;
        repeat(out, begin, min, max, op);
        continue;
      }
      default: return;
    }
  }
}

// Alternatives up to a ')', the end, or the next `name ::=`.
std::vector<GrammarCompiler::Seq> GrammarCompiler::parse_alternatives() {
  std::vector<Seq> alts(1);
  for (;;) {
    skip_space();
    if (eof() || peek() == ')' || at_rule_start()) return alts;
    if (peek() == '|') {
      ++pos_;
      alts.emplace_back();
      continue;
    }
    parse_item(alts.back());
  }
}

void GrammarCompiler::check_names() const {
  for (const Rule& r : rules_) {
    if (r.defined) continue;
    const std::string user = r.origin >= 0 ? rules_[size_t(r.origin)].name : "?";
    const size_t line = line_of(r.pos);
    throw_error(ErrorCode::kInvalidArgument, "GBNF line ", line, ": rule '", user, "' uses undefined rule '", r.name,
                "'");
  }
  if (!names_.count("root"))
    throw_error(ErrorCode::kInvalidArgument, "GBNF: no rule named 'root' (the document must match rule root)");
}

// A rule that can reach itself without reading a byte would expand forever.
void GrammarCompiler::check_left_recursion() const {
  const size_t n = rules_.size();
  std::vector<char> nullable(n, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (const Seq& alt : rules_[r].alts)
        if (std::all_of(alt.begin(), alt.end(),
                        [&](int32_t e) { return Grammar::is_rule(e) && nullable[size_t(Grammar::rule_of(e))]; })) {
          nullable[r] = 1;
          changed = true;
          break;
        }
    }
  }
  std::vector<std::vector<int32_t>> edges(n);
  for (size_t r = 0; r < n; ++r)
    for (const Seq& alt : rules_[r].alts)
      for (int32_t e : alt) {
        if (!Grammar::is_rule(e)) break;
        edges[r].push_back(Grammar::rule_of(e));
        if (!nullable[size_t(Grammar::rule_of(e))]) break;
      }
  // Iterative DFS; a grey target closes a cycle, read back from the path.
  std::vector<char> color(n, 0);
  std::vector<std::pair<int32_t, size_t>> path;
  for (size_t start = 0; start < n; ++start) {
    if (color[start]) continue;
    path = {{int32_t(start), 0}};
    color[start] = 1;
    while (!path.empty()) {
      auto& [r, next] = path.back();
      if (next == edges[size_t(r)].size()) {
        color[size_t(r)] = 2;
        path.pop_back();
        continue;
      }
      const int32_t to = edges[size_t(r)][next++];
      if (color[size_t(to)] == 0) {
        color[size_t(to)] = 1;
        path.push_back({to, 0});
      } else if (color[size_t(to)] == 1) {
        size_t k = 0;
        while (path[k].first != to) ++k;
        std::string cycle;
        int32_t named = -1;
        for (size_t i = k; i < path.size(); ++i) {
          const Rule& rule = rules_[size_t(path[i].first)];
          cycle += rule.name + " -> ";
          if (named < 0) named = rule.generated ? rule.origin : path[i].first;
        }
        cycle += rules_[size_t(to)].name;
        const Rule& user = rules_[size_t(std::max(named, 0))];
        throw_error(ErrorCode::kInvalidArgument, "GBNF line ", line_of(user.pos), ": rule '", user.name,
                    "' is left-recursive (", cycle,
                    " reads no byte): write it right-recursively, e.g. expr ::= term (\"+\" term)*, and do not "
                    "repeat what can match nothing");
      }
    }
  }
}

std::shared_ptr<const Grammar> GrammarCompiler::compile() {
  for (;;) {
    skip_space();
    if (eof()) break;
    const size_t at = pos_;
    current_ = -1;
    const std::string name = parse_name();
    skip_space();
    if (src_.substr(pos_, 3) != "::=") fail_at(pos_, "expected '::=' after rule name '", name, "'");
    pos_ += 3;
    const int32_t id = rule_named(name, at);
    if (rules_[size_t(id)].defined)
      fail_at(at, "rule '", name, "' is defined twice (first at line ", line_of(rules_[size_t(id)].pos), ")");
    rules_[size_t(id)].defined = true;
    rules_[size_t(id)].pos = at;
    current_ = id;
    generated_ = 0;
    std::vector<Seq> alts = parse_alternatives();
    if (peek() == ')') fail_at(pos_, "unmatched ')'");
    rules_[size_t(id)].alts = std::move(alts);
  }
  current_ = -1;
  check_names();
  check_left_recursion();

  auto g = std::shared_ptr<Grammar>(new Grammar());
  g->root_ = names_.at("root");
  g->sets_ = std::move(sets_);
  for (const Rule& r : rules_) {
    g->rule_alts_.push_back(int32_t(g->alt_starts_.size()));
    g->rule_names_.push_back(r.name);
    for (const Seq& alt : r.alts) {
      g->alt_starts_.push_back(int32_t(g->elements_.size()));
      g->elements_.insert(g->elements_.end(), alt.begin(), alt.end());
      g->elements_.push_back(Grammar::kEnd);
    }
  }
  g->rule_alts_.push_back(int32_t(g->alt_starts_.size()));
  return g;
}

std::shared_ptr<const Grammar> grammar_from_gbnf(std::string_view text) { return GrammarCompiler(text).compile(); }

}  // namespace kiln
