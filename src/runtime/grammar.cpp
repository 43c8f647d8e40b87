// The GBNF compiler, the parse-stack engine and the token masks (see grammar.h).
//
// A state is a set of stacks of positions. Advancing by a byte keeps the stacks whose top byte
// set holds it, moves past it and normalizes: at the end of an alternative pop to the caller's
// return position, at a rule reference expand into each alternative. A reference that ends its
// alternative pushes no return position (tail call), so right-recursive repetition keeps
// stacks bounded. Frames live in an append-only arena and stacks share their bottoms, so a
// step copies nothing; GrammarState renumbers the arena canonically after each accept(), and
// the token mask walks the vocabulary's trie with the arena as a stack allocator.
#include "runtime/grammar.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <tuple>

#include "core/status.h"
#include "tokenizer/unicode.h"

namespace kiln {
namespace {
constexpr char32_t kMaxCodePoint = 0x10FFFF;
}  // namespace

namespace grammar_detail {

CpRanges cp_normalize(CpRanges r) {
  std::sort(r.begin(), r.end());
  CpRanges out;
  for (auto [a, b] : r) {
    if (!out.empty() && a <= out.back().second + 1) out.back().second = std::max(out.back().second, b);
    else out.push_back({a, b});
  }
  return out;
}

CpRanges cp_complement(const CpRanges& r) {
  CpRanges out;
  char32_t next = 0;
  for (auto [a, b] : r) {
    if (a > next) out.push_back({next, a - 1});
    next = b + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return out;
}

}  // namespace grammar_detail

namespace {

using grammar_detail::cp_complement;
using grammar_detail::cp_normalize;
using grammar_detail::Frame;
using grammar_detail::Head;

using grammar_detail::CpRanges;
using ByteRange = std::pair<uint8_t, uint8_t>;
// Bounds on what one grammar may compile to, and on the work of one byte's step.
constexpr size_t kMaxElements = size_t(1) << 22;
// Groups are parsed recursively: bounded so that a request cannot overflow the stack.
constexpr int kMaxNesting = 1024;
// Generated rules are named after the rule they appear in, cut to this many bytes (a long
// name repeated in 65536 generated ones would be a request's memory many times over).
constexpr size_t kMaxGeneratedName = 64;
constexpr int64_t kMaxStepWork = int64_t(1) << 20;

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

uint64_t hash_mix(uint64_t a, uint64_t b) {
  uint64_t x = (a ^ 0x9E3779B97F4A7C15ull) * 0xBF58476D1CE4E5B9ull + b;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 29);
}
constexpr uint64_t kBottomHash = 0x2545F4914F6CDD1Dull;

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

std::string Grammar::dump() const {
  auto byte = [](int b) {
    if (b > 0x20 && b < 0x7F && std::string_view("\\]-^\"").find(char(b)) == std::string_view::npos)
      return std::string(1, char(b));
    static const char* kHex = "0123456789ABCDEF";
    return std::string("\\x") + kHex[b >> 4] + kHex[b & 15];
  };
  std::string out;
  for (size_t r = 0; r < rule_names_.size(); ++r) {
    out += rule_names_[r] + " ::=";
    const auto alts = alternatives(int32_t(r));
    for (size_t a = 0; a < alts.size(); ++a) {
      if (a > 0) out += " |";
      if (element(alts[a]) == kEnd) out += " \"\"";
      for (int32_t pos = alts[a]; element(pos) != kEnd; ++pos) {
        const int32_t e = element(pos);
        if (is_rule(e)) {
          out += " " + rule_names_[size_t(rule_of(e))];
          continue;
        }
        out += " [";
        const ByteSet& s = sets_[size_t(e)];
        for (int b = 0; b < 256;) {
          if (!byte_set_has(s, uint8_t(b))) {
            ++b;
            continue;
          }
          int c = b;
          while (c + 1 < 256 && byte_set_has(s, uint8_t(c + 1))) ++c;
          out += byte(b);
          if (c > b) out.append("-").append(byte(c));
          b = c + 1;
        }
        out += "]";
      }
    }
    out += "\n";
  }
  return out;
}

namespace {

// Advances stacks by one byte within one grammar; frames go to an arena the caller owns.
class Stepper {
 public:
  Stepper(const Grammar& g, std::vector<Frame>& frames) : g_(g), frames_(frames) {}

  // The stacks a document starts in; false when there are too many.
  bool start(std::vector<Head>& out, bool& complete) {
    begin(out);
    for (int32_t alt : g_.alternatives(g_.root())) {
      expand(alt, -1);
      if (failed_) break;
    }
    complete = complete_;
    return !failed_;
  }

  // `in` advanced past byte b; false when that makes too many stacks or too much work.
  bool step(std::span<const Head> in, uint8_t b, std::vector<Head>& out, bool& complete) {
    begin(out);
    for (const Head& h : in) {
      if (!byte_set_has(g_.byte_set(g_.element(h.pos)), b)) continue;
      expand(h.pos + 1, h.frame);
      if (failed_) break;
    }
    complete = complete_;
    return !failed_;
  }

 private:
  static constexpr size_t kLinear = 16;  // stack sets up to this size are deduplicated by a scan
  static constexpr size_t kTable = 4 * GrammarState::kMaxStacks;

  void begin(std::vector<Head>& out) {
    out.clear();
    out_ = &out;
    complete_ = failed_ = false;
    work_ = 0;
    indexed_ = false;
  }

  uint64_t frame_hash(int32_t f) const { return f < 0 ? kBottomHash : frames_[size_t(f)].hash; }

  // Normalizes the stack (pos, frame): follows ends and references to byte-set tops. The
  // alternatives still to follow wait in todo_, not on the call stack: a chain of rules that
  // match nothing (("" | "a"){0,60000}) nests as deep as it is long.
  void expand(int32_t pos, int32_t frame) {
    todo_.clear();
    for (;;) {
      if (++work_ > kMaxStepWork) {
        failed_ = true;
        return;
      }
      const int32_t e = g_.element(pos);
      if (e == Grammar::kEnd && frame >= 0) {
        pos = frames_[size_t(frame)].ret;
        frame = frames_[size_t(frame)].parent;
        continue;
      }
      if (Grammar::is_rule(e)) {
        int32_t callee = frame;
        bool dropped = false;
        if (g_.element(pos + 1) != Grammar::kEnd) {  // else a tail call: nothing to return to
          const int32_t depth = frame < 0 ? 1 : frames_[size_t(frame)].depth + 1;
          dropped = depth > GrammarState::kMaxDepth;  // too deep: this path is dropped
          if (!dropped) {
            frames_.push_back({pos + 1, frame, depth, hash_mix(frame_hash(frame), uint64_t(pos + 1))});
            callee = int32_t(frames_.size() - 1);
          }
        }
        if (!dropped) {
          const auto alts = g_.alternatives(Grammar::rule_of(e));
          for (size_t i = alts.size() - 1; i > 0; --i) todo_.push_back({alts[i], callee});
          // Each waiting alternative costs work: past the bound the step fails anyway.
          if (work_ + int64_t(todo_.size()) > kMaxStepWork) {
            failed_ = true;
            return;
          }
          pos = alts[0];
          frame = callee;
          continue;
        }
      } else if (e >= 0) {
        add(pos, frame);
        if (failed_) return;
      } else {
        complete_ = true;  // the end of the root
      }
      if (todo_.empty()) return;
      std::tie(pos, frame) = todo_.back();
      todo_.pop_back();
    }
  }

  bool same_chain(int32_t a, int32_t b) const {
    while (a != b) {
      if (a < 0 || b < 0) return false;
      const Frame& x = frames_[size_t(a)];
      const Frame& y = frames_[size_t(b)];
      if (x.hash != y.hash || x.ret != y.ret) return false;
      a = x.parent;
      b = y.parent;
    }
    return true;
  }

  // Adds a stack unless an equal one is there.
  void add(int32_t pos, int32_t frame) {
    std::vector<Head>& out = *out_;
    const uint64_t h = hash_mix(frame_hash(frame) ^ 0x5851F42D4C957F2Dull, uint64_t(pos));
    auto same = [&](const Head& o) { return o.hash == h && o.pos == pos && same_chain(o.frame, frame); };
    if (out.size() < kLinear) {
      for (const Head& o : out)
        if (same(o)) return;
    } else {
      if (!indexed_) {  // past kLinear stacks: an open-addressing table of indices + 1
        table_.assign(kTable, 0);
        for (size_t i = 0; i < out.size(); ++i) insert(out[i].hash, int32_t(i));
        indexed_ = true;
      }
      for (size_t slot = h & (kTable - 1); table_[slot] != 0; slot = (slot + 1) & (kTable - 1))
        if (same(out[size_t(table_[slot] - 1)])) return;
    }
    if (out.size() >= GrammarState::kMaxStacks) {
      failed_ = true;
      return;
    }
    out.push_back({pos, frame, h});
    if (indexed_) insert(h, int32_t(out.size() - 1));
  }

  void insert(uint64_t h, int32_t index) {
    size_t slot = h & (kTable - 1);
    while (table_[slot] != 0) slot = (slot + 1) & (kTable - 1);
    table_[slot] = index + 1;
  }

  const Grammar& g_;
  std::vector<Frame>& frames_;
  std::vector<Head>* out_ = nullptr;
  bool complete_ = false;
  bool failed_ = false;
  bool indexed_ = false;
  int64_t work_ = 0;
  std::vector<int32_t> table_;
  std::vector<std::pair<int32_t, int32_t>> todo_;  // (pos, frame) of alternatives to follow
};

// Past this many frames accept() compacts the arena mid-string (garbage of earlier bytes).
constexpr size_t kCompactFrames = 1 << 16;

}  // namespace

GrammarState::GrammarState(std::shared_ptr<const Grammar> grammar) : grammar_(std::move(grammar)) {
  KILN_CHECK(grammar_ != nullptr, "GrammarState needs a grammar");
  Stepper stepper(*grammar_, frames_);
  if (!stepper.start(heads_, complete_)) heads_.clear();  // a pathological start accepts nothing
  canonicalize();
}

bool GrammarState::accept(std::string_view bytes) {
  Stepper stepper(*grammar_, frames_);
  std::vector<Head> next;
  bool ok = true;
  for (char c : bytes) {
    bool complete = false;
    if (heads_.empty() || !stepper.step(heads_, uint8_t(c), next, complete) || (next.empty() && !complete)) {
      ok = false;
      break;
    }
    heads_.swap(next);
    complete_ = complete;
    if (frames_.size() > kCompactFrames) canonicalize();
  }
  canonicalize();
  return ok;
}

// Keeps the frames the stacks reach, renumbered depth by depth in order of (parent, return
// position), so equal sets of stacks have equal arrays whatever path led to them.
void GrammarState::canonicalize() {
  std::vector<int32_t> remap(frames_.size(), -2);
  std::vector<int32_t> order;
  for (const Head& h : heads_)
    for (int32_t f = h.frame; f >= 0 && remap[size_t(f)] == -2; f = frames_[size_t(f)].parent) {
      remap[size_t(f)] = -1;
      order.push_back(f);
    }
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return frames_[size_t(a)].depth < frames_[size_t(b)].depth; });
  std::vector<Frame> out;
  out.reserve(order.size());
  std::vector<std::tuple<int32_t, int32_t, int32_t>> level;  // (new parent, ret, old id)
  for (size_t i = 0; i < order.size();) {
    const int32_t depth = frames_[size_t(order[i])].depth;
    level.clear();
    for (; i < order.size() && frames_[size_t(order[i])].depth == depth; ++i) {
      const Frame& f = frames_[size_t(order[i])];
      level.emplace_back(f.parent < 0 ? -1 : remap[size_t(f.parent)], f.ret, order[i]);
    }
    std::sort(level.begin(), level.end());
    for (size_t k = 0; k < level.size(); ++k) {
      auto [parent, ret, old] = level[k];
      if (k == 0 || std::get<0>(level[k - 1]) != parent || std::get<1>(level[k - 1]) != ret)
        out.push_back({ret, parent, depth, frames_[size_t(old)].hash});
      remap[size_t(old)] = int32_t(out.size() - 1);
    }
  }
  for (Head& h : heads_)
    if (h.frame >= 0) h.frame = remap[size_t(h.frame)];
  std::sort(heads_.begin(), heads_.end(),
            [](const Head& a, const Head& b) { return std::tie(a.pos, a.frame) < std::tie(b.pos, b.frame); });
  heads_.erase(std::unique(heads_.begin(), heads_.end(),
                           [](const Head& a, const Head& b) { return a.pos == b.pos && a.frame == b.frame; }),
               heads_.end());
  frames_ = std::move(out);
}

std::string GrammarState::key() const {
  std::string k(1 + 4 + 8 * (heads_.size() + frames_.size()), '\0');
  char* p = k.data();
  *p++ = char(complete_);
  const uint32_t n = uint32_t(heads_.size());
  std::memcpy(p, &n, 4);
  p += 4;
  for (const Head& h : heads_) {
    std::memcpy(p, &h.pos, 4);
    std::memcpy(p + 4, &h.frame, 4);
    p += 8;
  }
  for (const Frame& f : frames_) {
    std::memcpy(p, &f.ret, 4);
    std::memcpy(p + 4, &f.parent, 4);
    p += 8;
  }
  return k;
}

TokenTrie::TokenTrie(std::vector<std::string> pieces) : pieces_(std::move(pieces)) {
  KILN_THROW_IF(pieces_.size() > size_t(std::numeric_limits<int32_t>::max()), kInvalidArgument,
                "a vocabulary of ", pieces_.size(), " tokens is too large for a token trie");
  std::vector<int32_t> order;
  for (size_t id = 0; id < pieces_.size(); ++id)
    if (!pieces_[id].empty()) order.push_back(int32_t(id));
  // char_traits<char> compares as unsigned char, so this is byte order.
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return pieces_[size_t(a)] < pieces_[size_t(b)]; });
  nodes_.push_back({0, 0, 0, 0});
  std::vector<int32_t> path = {0};  // the node at each depth of the previous piece
  const std::string* prev = nullptr;
  for (int32_t id : order) {
    const std::string& p = pieces_[size_t(id)];
    size_t common = 0;
    if (prev)
      while (common < p.size() && common < prev->size() && p[common] == (*prev)[common]) ++common;
    for (; path.size() > common + 1; path.pop_back()) nodes_[size_t(path.back())].end = int32_t(nodes_.size());
    for (size_t d = common; d < p.size(); ++d) {
      nodes_.push_back({0, 0, 0, uint8_t(p[d])});
      path.push_back(int32_t(nodes_.size() - 1));
    }
    Node& n = nodes_[size_t(path.back())];
    if (n.tokens_begin == n.tokens_end) n.tokens_begin = n.tokens_end = int32_t(ids_.size());
    ids_.push_back(id);
    n.tokens_end = int32_t(ids_.size());
    prev = &p;
  }
  for (; !path.empty(); path.pop_back()) nodes_[size_t(path.back())].end = int32_t(nodes_.size());
}

const std::string& TokenTrie::piece(int32_t id) const {
  static const std::string kNone;
  return id >= 0 && size_t(id) < pieces_.size() ? pieces_[size_t(id)] : kNone;
}

GrammarTokenMask::GrammarTokenMask(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTrie> vocab,
                                   size_t max_cache_bytes)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)) {
  KILN_CHECK(grammar_ && vocab_, "GrammarTokenMask needs a grammar and a vocabulary");
  const size_t set_bytes = (vocab_->vocab_size() + 63) / 64 * 8 + 256;  // + key and bookkeeping
  max_states_ = std::max<size_t>(1, max_cache_bytes / set_bytes);
}

// A depth-first walk of the trie carrying the stacks: a token's shared prefixes are advanced
// once, and a subtree is skipped as soon as no stack takes its byte.
std::vector<uint64_t> GrammarTokenMask::allowed(const GrammarState& state) const {
  KILN_CHECK(&state.grammar() == grammar_.get(), "a GrammarState of another grammar");
  const auto nodes = vocab_->nodes();
  const auto ids = vocab_->ids();
  std::vector<uint64_t> bits((vocab_->vocab_size() + 63) / 64, 0);
  if (state.heads_.empty()) return bits;
  std::vector<Frame> frames = state.frames_;
  Stepper stepper(*grammar_, frames);
  struct Level {
    std::vector<Head> heads;
    ByteSet next{};  // the bytes some stack takes
    int32_t node = 0;
    int32_t child = 0;
    size_t mark = 0;  // the arena's size before this level's step
  };
  auto next_bytes = [&](Level& l) {
    l.next = {};
    for (const Head& h : l.heads) {
      const ByteSet& s = grammar_->byte_set(grammar_->element(h.pos));
      for (size_t w = 0; w < 4; ++w) l.next[w] |= s[w];
    }
  };
  std::vector<Level> levels(1);
  levels[0].heads = state.heads_;
  levels[0].child = 1;
  next_bytes(levels[0]);
  size_t d = 0;
  for (;;) {
    if (levels[d].child >= nodes[size_t(levels[d].node)].end) {
      if (d == 0) break;
      frames.resize(levels[d].mark);
      --d;
      continue;
    }
    const int32_t c = levels[d].child;
    const TokenTrie::Node& n = nodes[size_t(c)];
    levels[d].child = n.end;
    if (!byte_set_has(levels[d].next, n.byte)) continue;
    if (levels.size() == d + 1) levels.emplace_back();
    Level& up = levels[d];
    Level& down = levels[d + 1];
    down.mark = frames.size();
    bool complete = false;
    if (!stepper.step(up.heads, n.byte, down.heads, complete) || (down.heads.empty() && !complete)) {
      frames.resize(down.mark);
      continue;
    }
    for (int32_t t = n.tokens_begin; t < n.tokens_end; ++t) {
      const auto id = size_t(ids[size_t(t)]);
      bits[id / 64] |= uint64_t(1) << (id % 64);
    }
    if (down.heads.empty() || c + 1 == n.end) {
      frames.resize(down.mark);
      continue;
    }
    down.node = c;
    down.child = c + 1;
    next_bytes(down);
    ++d;
  }
  return bits;
}

int64_t GrammarTokenMask::apply(const GrammarState& state, std::span<float> logits) {
  const std::string key = state.key();
  Bits bits;
  {
    std::lock_guard lk(mu_);
    if (auto it = sets_.find(key); it != sets_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      bits = it->second->second;
    }
  }
  if (!bits) {
    bits = std::make_shared<const std::vector<uint64_t>>(allowed(state));
    std::lock_guard lk(mu_);
    if (!sets_.count(key)) {
      lru_.emplace_front(key, bits);
      sets_[key] = lru_.begin();
      for (; sets_.size() > max_states_; lru_.pop_back()) sets_.erase(lru_.back().first);
    }
  }
  constexpr float kOff = -std::numeric_limits<float>::infinity();
  const size_t n = vocab_->vocab_size();
  int64_t kept = 0;
  for (size_t id = 0; id < logits.size(); ++id) {
    if (id < n && ((*bits)[id / 64] >> (id % 64) & 1)) ++kept;
    else logits[id] = kOff;
  }
  return kept;
}

size_t GrammarTokenMask::cached_states() const {
  std::lock_guard lk(mu_);
  return sets_.size();
}

}  // namespace kiln
