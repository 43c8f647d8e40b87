// JSON Schema's numeric bounds -> GBNF (grammar_internal.h): an integer's `minimum`,
// `maximum`, `exclusiveMinimum` and `exclusiveMaximum` as digit ranges, a number's as exact
// decimal ranges, and `multipleOf` (with those bounds) as an automaton over the digits, for
// json_schema.cpp. Tested in tests/runtime/grammar_test.cpp (JsonSchemaNumbers: every value of
// a fine grid against the bounds and multiples); fuzzed by fuzz/grammar_fuzz.cpp.
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "runtime/grammar_internal.h"

namespace kiln::grammar_detail {
namespace {

using Json = nlohmann::ordered_json;

template <typename... Args>
[[noreturn]] void fail(const std::string& ptr, const Args&... args) {
  throw_error(ErrorCode::kInvalidArgument, "JSON schema at #", ptr, ": ", args...);
}

// The largest integer magnitude the grammars write (16 digits, as the integer rule).
constexpr int64_t kMaxIntMagnitude = 9999999999999999;

// GBNF choosing one of `parts` (non-empty): the part itself when it is the only one.
std::string alternatives(const std::vector<std::string>& parts) {
  if (parts.size() == 1) return parts[0];
  std::string out = "( " + parts[0];
  for (size_t i = 1; i < parts.size(); ++i) out += " | " + parts[i];
  return out + " )";
}

// GBNF for the decimal digit strings of one length from x to y (x <= y, equal lengths):
// the shared leading digits, then x's digit with the rest from x's up, the digits between
// with any rest, and y's digit with the rest up to y's.
std::string digits_between(const std::string& x, const std::string& y) {
  const size_t n = x.size();
  if (n == 0) return "";
  auto lit = [](char c) { return std::string("\"") + c + "\""; };
  const std::string xr = x.substr(1), yr = y.substr(1);
  if (x[0] == y[0]) return n == 1 ? lit(x[0]) : lit(x[0]) + " " + digits_between(xr, yr);
  const std::string any = n == 1 ? "" : n == 2 ? " [0-9]" : " [0-9]{" + std::to_string(n - 1) + "}";
  const bool x_floor = xr.find_first_not_of('0') == std::string::npos;
  const bool y_ceil = yr.find_first_not_of('9') == std::string::npos;
  std::vector<std::string> parts;
  char lo = x[0], hi = y[0];
  if (!x_floor) parts.push_back(lit(lo++) + " " + digits_between(xr, std::string(n - 1, '9')));
  if (!y_ceil) --hi;
  if (lo <= hi) parts.push_back((lo == hi ? lit(lo) : std::string("[") + lo + "-" + hi + "]") + any);
  if (!y_ceil) parts.push_back(lit(y[0]) + " " + digits_between(std::string(n - 1, '0'), yr));
  return alternatives(parts);
}

// GBNF for the integers a..b written without leading zeros (0 <= a <= b <= kMaxIntMagnitude).
std::string unsigned_between(int64_t a, int64_t b) {
  std::vector<std::string> parts;
  const std::string sa = std::to_string(a), sb = std::to_string(b);
  for (size_t len = sa.size(); len <= sb.size(); ++len) {
    std::string lo = sa;
    if (len > sa.size()) {  // 10...0
      lo.assign(len, '0');
      lo[0] = '1';
    }
    const std::string hi = len == sb.size() ? sb : std::string(len, '9');
    parts.push_back(digits_between(lo, hi));
  }
  return alternatives(parts);
}

// A JSON number bound as an exact decimal: sign, integer digits (no leading zeros, "0" for
// zero) and fraction digits (no trailing zeros); `strict` for an exclusive bound.
struct Decimal {
  bool negative = false;
  std::string int_digits = "0", frac;
  bool strict = false;
  bool zero() const { return int_digits == "0" && frac.empty(); }
};

// The decimal a JSON number writes (a double as its shortest round-trip text, so 0.1 is
// 0.1), exponents expanded.
Decimal decimal_of(const Json& v) {
  std::string text = v.dump();
  Decimal d;
  size_t at = 0;
  if (text[0] == '-') d.negative = true, at = 1;
  std::string digits;
  int64_t point = -1, exp = 0;
  for (; at < text.size() && text[at] != 'e' && text[at] != 'E'; ++at)
    if (text[at] == '.') point = int64_t(digits.size());
    else digits += text[at];
  if (at < text.size()) exp = std::stoll(text.substr(at + 1));
  if (point < 0) point = int64_t(digits.size());
  point += exp;  // digits[0, point) is the integer part
  if (point <= 0) {
    d.frac = std::string(size_t(-point), '0') + digits;
    d.int_digits = "0";
  } else {
    if (point > int64_t(digits.size())) digits.append(size_t(point - int64_t(digits.size())), '0');
    d.int_digits = digits.substr(0, size_t(point));
    d.frac = digits.substr(size_t(point));
  }
  d.int_digits.erase(0, std::min(d.int_digits.find_first_not_of('0'), d.int_digits.size() - 1));
  d.frac.erase(d.frac.find_last_not_of('0') + 1);
  if (d.zero()) d.negative = false;
  return d;
}

// Magnitudes compared: <0, 0, >0.
int compare_magnitude(const Decimal& a, const Decimal& b) {
  if (a.int_digits.size() != b.int_digits.size()) return a.int_digits.size() < b.int_digits.size() ? -1 : 1;
  if (int c = a.int_digits.compare(b.int_digits)) return c < 0 ? -1 : 1;
  const int c = a.frac.compare(b.frac);  // no trailing zeros: the string order is the value order
  return c < 0 ? -1 : c > 0 ? 1 : 0;
}

int compare(const Decimal& a, const Decimal& b) {
  if (a.negative != b.negative) return a.negative ? -1 : 1;
  return a.negative ? -compare_magnitude(a, b) : compare_magnitude(a, b);
}

// A bound on the value 0.t of a fraction's digits t: 0.digits, exclusive when strict. An
// absent bound is free; a non-strict lower bound of 0 is none.
struct FracBound {
  std::string digits;
  bool strict = false;
};
using OptFrac = std::optional<FracBound>;

// Whether no digits (the value 0: the fraction left out) meet the bounds.
bool fraction_zero_meets(const OptFrac& lo, const OptFrac& hi) {
  return !(lo && (lo->strict || !lo->digits.empty())) && !(hi && hi->strict && hi->digits.empty());
}

// GBNF for the non-empty digit strings t with lo <= 0.t <= hi (strict where marked); ""
// when none meets them. Each first digit leaves bounds on the rest: the rest is free once
// the digit passes a bound, and keeps the bound's tail while equal to its digit.
std::string fraction_digits(OptFrac lo, OptFrac hi) {
  if (lo && lo->digits.empty() && !lo->strict) lo.reset();
  if (hi && hi->digits.empty() && (hi->strict || lo)) return "";  // below 0, or 0 and above a bound
  if (!lo && !hi) return "[0-9]+";
  if (!lo && hi->digits.empty()) return "\"0\"+";
  if (!hi && lo->digits.empty()) return "\"0\"* [1-9] [0-9]*";  // above 0
  std::vector<std::string> parts;
  int free_from = -1;  // a run of first digits after which the rest is free
  auto close_run = [&](int end) {
    if (free_from < 0) return;
    parts.push_back((free_from == end ? std::string("\"") + char('0' + free_from) + "\""
                                      : str_cat("[", char('0' + free_from), "-", char('0' + end), "]")) +
                    " [0-9]*");
    free_from = -1;
  };
  for (int d = 0; d <= 9; ++d) {
    const char c = char('0' + d);
    OptFrac rlo, rhi;
    bool fails = false;
    if (lo) {
      const char first = lo->digits.empty() ? '0' : lo->digits[0];  // empty: strictly above 0
      if (c < first) fails = true;
      else if (c == first) rlo = FracBound{lo->digits.empty() ? "" : lo->digits.substr(1), lo->strict};
    }
    if (hi) {
      const char first = hi->digits.empty() ? '0' : hi->digits[0];  // empty: at most 0
      if (c > first) fails = true;
      else if (c == first) rhi = FracBound{hi->digits.empty() ? "" : hi->digits.substr(1), hi->strict};
    }
    if (rlo && rlo->digits.empty() && !rlo->strict) rlo.reset();
    if (fails || rlo || rhi) {
      close_run(d - 1);
      if (fails) continue;
      const std::string rest = fraction_digits(rlo, rhi);
      const bool zero_ok = fraction_zero_meets(rlo, rhi);
      const std::string lit = std::string("\"") + c + "\"";
      if (!rest.empty()) parts.push_back(lit + (zero_ok ? " ( " + rest + " )?" : " " + rest));
      else if (zero_ok) parts.push_back(lit);
    } else if (free_from < 0) {
      free_from = d;
    }
  }
  close_run(9);
  return parts.empty() ? "" : alternatives(parts);
}

// GBNF for a fraction ("." and digits, or none for the value 0) within the bounds: "" when
// only none is allowed, nullopt when no fraction meets them.
std::optional<std::string> fraction_between(const OptFrac& lo, const OptFrac& hi) {
  const std::string digits = fraction_digits(lo, hi);
  const bool zero_ok = fraction_zero_meets(lo, hi);
  if (digits.empty()) return zero_ok ? std::optional<std::string>("") : std::nullopt;
  return zero_ok ? "( \".\" " + digits + " )?" : "\".\" " + digits;
}

// GBNF for the unsigned decimals (no exponent) whose value lies within lo..hi, their signs
// ignored (absent sides: from 0, up to 16 integer digits); "" when none. An integer part
// strictly between the bounds' takes any fraction; at a bound's integer part the fraction
// is bounded by the bound's.
std::string magnitude_between(const std::optional<Decimal>& lo, std::optional<Decimal> hi) {
  constexpr size_t kDigits = 16;
  if (lo && lo->int_digits.size() > kDigits) return "";
  if (hi && hi->int_digits.size() > kDigits) hi.reset();
  const int64_t li = lo ? std::stoll(lo->int_digits) : 0;
  const int64_t hi_int = hi ? std::stoll(hi->int_digits) : kMaxIntMagnitude;
  OptFrac lfrac, hfrac;
  if (lo && (lo->strict || !lo->frac.empty())) lfrac = FracBound{lo->frac, lo->strict};
  if (hi) hfrac = FracBound{hi->frac, hi->strict};
  auto with_fraction = [](int64_t i, const OptFrac& flo, const OptFrac& fhi) -> std::string {
    const std::optional<std::string> f = fraction_between(flo, fhi);
    if (!f) return "";
    return "\"" + std::to_string(i) + "\"" + (f->empty() ? "" : " " + *f);
  };
  std::vector<std::string> parts;
  if (li == hi_int) {
    if (std::string p = with_fraction(li, lfrac, hfrac); !p.empty()) parts.push_back(p);
  } else {
    int64_t a = li, b = hi_int;
    if (lfrac) {
      if (std::string p = with_fraction(li, lfrac, std::nullopt); !p.empty()) parts.push_back(p);
      ++a;
    }
    if (hfrac) --b;
    if (a <= b) parts.push_back(unsigned_between(a, b) + " ( \".\" [0-9]+ )?");
    if (hfrac)
      if (std::string p = with_fraction(hi_int, std::nullopt, hfrac); !p.empty()) parts.push_back(p);
  }
  return parts.empty() ? "" : alternatives(parts);
}

// A schema's tightest lower and upper bounds (minimum / maximum / exclusiveMinimum /
// exclusiveMaximum: draft 6 numbers, or draft 4 booleans beside minimum / maximum).
std::pair<std::optional<Decimal>, std::optional<Decimal>> decimal_bounds(const Json& s) {
  std::optional<Decimal> lo, hi;
  auto tighten = [](std::optional<Decimal>& cur, const Decimal& d, bool is_min) {
    const int c = cur ? compare(d, *cur) : 0;
    if (!cur || (is_min ? c > 0 : c < 0)) cur = d;
    else if (c == 0) cur->strict = cur->strict || d.strict;
  };
  auto bound = [&](const char* key, const char* draft4, bool is_min) {
    if (s.contains(key)) {
      Decimal d = decimal_of(s[key]);
      d.strict = s.contains(draft4) && s[draft4].is_boolean() && s[draft4].get<bool>();
      tighten(is_min ? lo : hi, d, is_min);
    }
    if (s.contains(draft4) && s[draft4].is_number()) {
      Decimal d = decimal_of(s[draft4]);
      d.strict = true;
      tighten(is_min ? lo : hi, d, is_min);
    }
  };
  bound("minimum", "exclusiveMinimum", true);
  bound("maximum", "exclusiveMaximum", false);
  return {lo, hi};
}

// --- multipleOf -----------------------------------------------------------------------------
//
// multipleOf = m x 10^-d (m a positive integer, d fraction digits). A value written without an
// exponent, its fraction padded or cut to d digits (digits past d must be zeros), is a multiple
// when those digits read as one integer N are divisible by m; bounds scale by 10^d to bounds on
// N. The automaton reads the digits left to right keeping N's prefix mod m, and while the
// prefix equals a bound's digits, which bound (digit-range states on the bound's path, free
// states shared by every path and sign).

constexpr int64_t kMaxMultipleDigits = 1000;  // m: the remainders an automaton is built with
constexpr int kMaxMultipleScale = 9;          // d
constexpr size_t kMaxMultipleStates = 4096;   // states (grammar rules) once merged: ~1 MB of GBNF
constexpr int kIntDigits = 16;                // integer digits written, as the number rule

// Non-negative integers as decimal digit strings (no leading zeros, "0" for zero): N's
// bounds reach 10^25.
std::string digits_trim(std::string a) {
  a.erase(0, std::min(a.find_first_not_of('0'), a.size() - 1));
  return a;
}

int digits_compare(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return a.size() < b.size() ? -1 : 1;
  const int c = a.compare(b);
  return c < 0 ? -1 : c > 0 ? 1 : 0;
}

std::string digits_add_one(std::string a) {
  size_t i = a.size();
  while (i > 0 && a[i - 1] == '9') a[--i] = '0';
  if (i == 0) return "1" + a;
  ++a[i - 1];
  return a;
}

std::string digits_sub_one(std::string a) {  // a > 0
  size_t i = a.size();
  while (a[i - 1] == '0') a[--i] = '9';
  --a[i - 1];
  return digits_trim(a);
}

// A bound on N: an integer, never "-0".
struct Scaled {
  bool negative = false;
  std::string mag = "0";
};

Scaled scaled_plus_one(Scaled x) {
  if (!x.negative) return {false, digits_add_one(x.mag)};
  x.mag = digits_sub_one(x.mag);
  if (x.mag == "0") x.negative = false;
  return x;
}

Scaled scaled_minus_one(Scaled x) {
  if (x.negative) return {true, digits_add_one(x.mag)};
  if (x.mag == "0") return {true, "1"};
  return {false, digits_sub_one(x.mag)};
}

int scaled_compare(const Scaled& a, const Scaled& b) {
  if (a.negative != b.negative) return a.negative ? -1 : 1;
  return a.negative ? -digits_compare(a.mag, b.mag) : digits_compare(a.mag, b.mag);
}

// The least (is_min) or greatest integer N with N >= b x 10^d (or <=; strict: > or <).
Scaled scaled_bound(const Decimal& b, int d, bool is_min) {
  std::string frac = b.frac;
  const bool exact = frac.size() <= size_t(d);
  frac.resize(size_t(d), '0');
  Scaled x{b.negative, digits_trim(b.int_digits + frac)};  // b x 10^d toward zero
  if (x.mag == "0") x.negative = false;
  if (exact) {
    if (b.strict) x = is_min ? scaled_plus_one(x) : scaled_minus_one(x);
  } else if (is_min != b.negative) {  // rounded toward zero, and the bound lies past it
    x = is_min ? scaled_plus_one(x) : scaled_minus_one(x);
  }
  return x;
}

// `a` with the states of one language merged (Moore's refinement: states stay together while
// they accept alike and move on each character into the same classes), state 0 still the start.
// Remainders that differ only where 10^k has cancelled them fold here: multipleOf 1000 keeps
// three trailing digits, not 1000 remainders.
TextAutomaton merge_equivalent(const TextAutomaton& a) {
  const size_t n = a.states.size();
  std::vector<int> cls(n);
  for (size_t i = 0; i < n; ++i) cls[i] = a.states[i].accepts ? 1 : 0;
  for (size_t classes = 0;;) {
    std::unordered_map<std::string, int> ids;  // a state's class, then its moves' characters and classes
    std::vector<int> next(n);
    std::string key;
    for (size_t i = 0; i < n; ++i) {
      std::vector<std::pair<char, int>> moves;
      for (const TextAutomaton::Move& mv : a.states[i].moves) moves.push_back({mv.c, cls[size_t(mv.to)]});
      std::sort(moves.begin(), moves.end());
      moves.erase(std::unique(moves.begin(), moves.end()), moves.end());
      key.assign(reinterpret_cast<const char*>(&cls[i]), sizeof(int));
      for (auto [c, k] : moves) key.append(1, c).append(reinterpret_cast<const char*>(&k), sizeof(int));
      next[i] = ids.emplace(key, int(ids.size())).first->second;
    }
    cls.swap(next);
    if (ids.size() == classes) break;
    classes = ids.size();
  }
  TextAutomaton out;
  std::vector<int> number(n, -1);  // the new number of a class
  std::vector<int> order = {0};    // a state of each new number's class
  number[size_t(cls[0])] = 0;
  for (size_t next = 0; next < order.size(); ++next) {
    const TextAutomaton::State& old = a.states[size_t(order[next])];
    TextAutomaton::State st;
    st.accepts = old.accepts;
    for (const TextAutomaton::Move& mv : old.moves) {
      int& to = number[size_t(cls[size_t(mv.to)])];
      if (to < 0) {
        to = int(order.size());
        order.push_back(mv.to);
      }
      if (std::none_of(st.moves.begin(), st.moves.end(), [&](const auto& m) { return m.c == mv.c && m.to == to; }))
        st.moves.push_back({mv.c, to});
    }
    out.states.push_back(std::move(st));
  }
  return out;
}

// A state of the automaton below.
struct MultipleState {
  bool fraction = false;  // after '.'
  int kmin = 0, kmax = 0;  // integer digits still to read: at least, at most
  int j = 0;               // fraction digits read (past d: capped at max(d, 1))
  int r = 0;               // the digits read, as one integer, mod m
  int lo = -1, hi = -1;    // the bound (index into bounds) the digits read equal, or -1
  int pos = 0;             // digits read, while lo or hi is set (else 0, so free states are shared)
  auto operator<=>(const MultipleState&) const = default;
};

class MultipleOfBuilder {
 public:
  MultipleOfBuilder(int64_t m, int d, bool integer) : m_(m), d_(d), integer_(integer) {}

  // The automaton for N within [a, b] (non-negative magnitudes, or none) and, after a '-',
  // within [na, nb]; its start state is dead (no moves) when no multiple is within them.
  TextAutomaton build(const std::optional<std::pair<std::string, std::string>>& pos,
                      const std::optional<std::pair<std::string, std::string>>& neg) {
    states_.resize(kStarts);  // the start, and the one after its '-'
    if (pos) first_moves(0, pos->first, pos->second);
    if (neg) {
      states_[0].moves.push_back({'-', 1});
      first_moves(1, neg->first, neg->second);
    }
    for (size_t i = 0; i < keys_.size(); ++i) expand(int(i) + kStarts);
    return merge_equivalent(live_part());
  }

 private:
  static constexpr int kStarts = 2;

  int state_of(const MultipleState& k) {
    auto [it, added] = index_.emplace(k, int(states_.size()));
    if (added) {
      keys_.push_back(k);
      states_.emplace_back();
    }
    return it->second;
  }

  int add_bound(std::string digits, size_t width) {
    bounds_.push_back(std::string(width - digits.size(), '0') + digits);
    return int(bounds_.size() - 1);
  }

  // k after reading digit c; nullopt when c leaves a bound k is on.
  std::optional<MultipleState> step(MultipleState k, char c) const {
    if (k.lo >= 0 && c < bounds_[size_t(k.lo)][size_t(k.pos)]) return std::nullopt;
    if (k.hi >= 0 && c > bounds_[size_t(k.hi)][size_t(k.pos)]) return std::nullopt;
    if (k.lo >= 0 && c != bounds_[size_t(k.lo)][size_t(k.pos)]) k.lo = -1;
    if (k.hi >= 0 && c != bounds_[size_t(k.hi)][size_t(k.pos)]) k.hi = -1;
    ++k.pos;
    for (int* b : {&k.lo, &k.hi})
      if (*b >= 0 && size_t(k.pos) == bounds_[size_t(*b)].size()) *b = -1;  // every digit compared
    if (k.lo < 0 && k.hi < 0) k.pos = 0;
    if (k.fraction) ++k.j;
    else k.kmin = std::max(k.kmin - 1, 0), --k.kmax;
    k.r = int((10 * int64_t(k.r) + (c - '0')) % m_);
    return k;
  }

  // Whether k may end with the digits still ahead (through the d-th fraction digit) all zero.
  bool zeros_end(const MultipleState& k, int zeros) const {
    int64_t r = k.r;
    for (int i = 0; i < zeros; ++i) r = r * 10 % m_;
    return r == 0 && (k.lo < 0 || bounds_[size_t(k.lo)].find_first_not_of('0', size_t(k.pos)) == std::string::npos);
  }

  // The first digit's moves from start `from` for N within [a, b] (a <= b): per integer-part
  // length a bound's digits bind, the path along them; the lengths no bound binds share states
  // that count the digits still allowed.
  void first_moves(int from, const std::string& a, const std::string& b) {
    int free_lo = 0, free_hi = 0;
    for (int len = 1; len <= kIntDigits; ++len) {
      const size_t width = size_t(len + d_);
      const std::string low = len == 1 ? "0" : "1" + std::string(width - 1, '0'), high(width, '9');
      if (digits_compare(a, high) > 0 || digits_compare(b, low) < 0) continue;
      const bool lo_binds = digits_compare(a, low) > 0, hi_binds = digits_compare(b, high) < 0;
      if (!lo_binds && !hi_binds) {
        if (free_lo == 0) free_lo = len;
        free_hi = len;
        continue;
      }
      MultipleState k;
      k.kmin = k.kmax = len;
      k.lo = lo_binds ? add_bound(a, width) : -1;
      k.hi = hi_binds ? add_bound(b, width) : -1;
      for (char c = len == 1 ? '0' : '1'; c <= '9'; ++c)
        if (std::optional<MultipleState> next = step(k, c)) add_move(from, c, *next);
    }
    if (free_lo == 0) return;
    if (free_lo == 1) add_move(from, '0', MultipleState{});
    for (char c = '1'; c <= '9'; ++c) {
      MultipleState k;
      k.kmin = free_lo - 1;
      k.kmax = free_hi - 1;
      k.r = int((c - '0') % m_);
      add_move(from, c, k);
    }
  }

  void add_move(int from, char c, const MultipleState& to) {
    const int at = state_of(to);  // before indexing states_, which it may grow
    states_[size_t(from)].moves.push_back({c, at});
  }

  void expand(int at) {
    const MultipleState k = keys_[size_t(at - kStarts)];
    std::vector<TextAutomaton::Move> moves;
    bool accepts = false;
    if (!k.fraction) {
      if (k.kmax > 0)
        for (char c = '0'; c <= '9'; ++c)
          if (std::optional<MultipleState> next = step(k, c)) moves.push_back({c, state_of(*next)});
      if (k.kmin == 0) {  // the integer part may end
        accepts = zeros_end(k, d_);
        if (!integer_) {
          MultipleState f = k;
          f.fraction = true;
          f.kmin = f.kmax = 0;
          moves.push_back({'.', state_of(f)});
        }
      }
    } else {
      accepts = k.j >= 1 && zeros_end(k, std::max(d_ - k.j, 0));
      if (k.j < d_) {
        for (char c = '0'; c <= '9'; ++c)
          if (std::optional<MultipleState> next = step(k, c)) moves.push_back({c, state_of(*next)});
      } else {  // past d digits: zeros only, N unchanged (the bounds are compared by now)
        MultipleState z = k;
        z.j = std::max(d_, 1);
        moves.push_back({'0', state_of(z)});
      }
    }
    states_[size_t(at)].moves = std::move(moves);
    states_[size_t(at)].accepts = accepts;
  }

  // The states that reach an accepting one and are reached from the start, numbered from it;
  // moves into other states dropped (a model is never led where no value can end).
  TextAutomaton live_part() const {
    const size_t n = states_.size();
    std::vector<std::vector<int>> into(n);
    for (size_t i = 0; i < n; ++i)
      for (const TextAutomaton::Move& mv : states_[i].moves) into[size_t(mv.to)].push_back(int(i));
    std::vector<bool> live(n);
    std::vector<int> todo;
    for (size_t i = 0; i < n; ++i)
      if (states_[i].accepts) live[i] = true, todo.push_back(int(i));
    while (!todo.empty()) {
      const int at = todo.back();
      todo.pop_back();
      for (int from : into[size_t(at)])
        if (!live[size_t(from)]) live[size_t(from)] = true, todo.push_back(from);
    }
    TextAutomaton out;
    std::vector<int> number(n, -1);  // the new number of an old state
    std::vector<int> order = {0};    // the old state of a new number
    number[0] = 0;
    for (size_t next = 0; next < order.size(); ++next) {
      const TextAutomaton::State& old = states_[size_t(order[next])];
      TextAutomaton::State st;
      st.accepts = old.accepts;
      for (const TextAutomaton::Move& mv : old.moves) {
        if (!live[size_t(mv.to)]) continue;
        if (number[size_t(mv.to)] < 0) {
          number[size_t(mv.to)] = int(order.size());
          order.push_back(mv.to);
        }
        st.moves.push_back({mv.c, number[size_t(mv.to)]});
      }
      out.states.push_back(std::move(st));
    }
    return out;
  }

  const int64_t m_;
  const int d_;
  const bool integer_;
  std::vector<std::string> bounds_;  // bounds' digits, zero-padded to their path's length
  std::vector<TextAutomaton::State> states_;  // the starts, then one per key
  std::vector<MultipleState> keys_;
  std::map<MultipleState, int> index_;
};

}  // namespace

// An integer within minimum / maximum / exclusiveMinimum / exclusiveMaximum (draft 6
// numbers, or draft 4 booleans beside minimum / maximum), as digit ranges; unbounded
// sides stop at 16 digits, as the integer rule does. "-0" is not written when bounded.
std::optional<std::string> integer_range_gbnf(const Json& s, const std::string& ptr) {
  // long double holds every int64 bound exactly (a double rounds 9999999999999999 up).
  constexpr long double kLimit = kMaxIntMagnitude;
  long double lo = -INFINITY, hi = INFINITY;
  auto bound = [&](const char* key, const char* draft4, bool is_min) {
    if (s.contains(key)) {
      const long double x = s[key].get<long double>();
      const bool exclusive = s.contains(draft4) && s[draft4].is_boolean() && s[draft4].get<bool>();
      if (is_min) lo = std::max(lo, exclusive ? std::floor(x) + 1 : std::ceil(x));
      else hi = std::min(hi, exclusive ? std::ceil(x) - 1 : std::floor(x));
    }
    if (s.contains(draft4) && s[draft4].is_number()) {
      const long double x = s[draft4].get<long double>();
      if (is_min) lo = std::max(lo, std::floor(x) + 1);
      else hi = std::min(hi, std::ceil(x) - 1);
    }
  };
  bound("minimum", "exclusiveMinimum", true);
  bound("maximum", "exclusiveMaximum", false);
  if (lo == -INFINITY && hi == INFINITY) return std::nullopt;
  if (lo > hi) fail(ptr, "no integer lies within its minimum and maximum");
  if (lo > kLimit || hi < -kLimit)
    fail(ptr, "its bounds leave no integer of at most 16 digits");
  const int64_t a = lo < -kLimit ? -kMaxIntMagnitude : int64_t(lo);
  const int64_t b = hi > kLimit ? kMaxIntMagnitude : int64_t(hi);
  std::vector<std::string> parts;
  if (b >= 0) parts.push_back(unsigned_between(std::max<int64_t>(a, 0), b));
  if (a < 0) parts.push_back("\"-\" " + unsigned_between(std::max<int64_t>(-b, 1), -a));
  return parts.size() == 1 ? "( " + parts[0] + " )" : alternatives(parts);
}

// A number within minimum / maximum / exclusiveMinimum / exclusiveMaximum, as exact
// decimal ranges written without an exponent (any value in range has that form; an
// unbounded side stops at 16 integer digits, as the number rule does; "-0" is not
// written). Unbounded: the number rule.
std::optional<std::string> number_range_gbnf(const Json& s, const std::string& ptr) {
  auto [lo, hi] = decimal_bounds(s);
  if (!lo && !hi) return std::nullopt;
  if (lo && hi) {
    const int c = compare(*lo, *hi);
    if (c > 0 || (c == 0 && (lo->strict || hi->strict))) fail(ptr, "no number lies within its minimum and maximum");
  }
  std::vector<std::string> parts;
  if (!hi || (!hi->negative && !(hi->zero() && hi->strict))) {  // values >= 0
    std::string m = magnitude_between(lo && !lo->negative ? lo : std::nullopt, hi);
    if (!m.empty()) parts.push_back(m);
  }
  if (!lo || lo->negative) {  // values < 0: "-" and a magnitude above 0 (or -hi) up to -lo
    Decimal above;
    above.strict = true;
    if (hi && hi->negative) above = *hi;
    std::optional<Decimal> below = lo;
    above.negative = false;
    if (below) below->negative = false;
    std::string m = magnitude_between(above, below);
    if (!m.empty()) parts.push_back("\"-\" " + m);
  }
  if (parts.empty()) fail(ptr, "its bounds leave no number of at most 16 integer digits");
  return parts.size() == 1 ? "( " + parts[0] + " )" : alternatives(parts);
}

// An integer or number with multipleOf (and any bounds beside it), as an automaton over its
// text (written without an exponent; "-0" not written).
TextAutomaton multiple_of_automaton(const Json& s, const std::string& ptr, bool integer) {
  const std::string where = ptr + "/multipleOf";
  const Json& v = s["multipleOf"];
  if (!v.is_number()) fail(where, "expected a number, found ", v.dump());
  const Decimal mult = decimal_of(v);
  if (mult.negative || mult.zero()) fail(where, "expected a number above 0, found ", v.dump());
  const std::string m_digits = digits_trim(mult.int_digits + mult.frac);
  int d = int(mult.frac.size());
  auto too_big = [&] {
    fail(where, "multipleOf ", v.dump(), " = ", m_digits, " x 10^-", d, " is not supported: the digits (",
         m_digits, ") must make at most ", kMaxMultipleDigits);
  };
  if (m_digits.size() > 7) too_big();
  int64_t m = std::stoll(m_digits);
  if (integer) {  // x is a multiple iff x * 10^d is one of m: m's factors 2 and 5 that 10^d has go
    for (int64_t p : {2, 5})
      for (int i = 0; i < d && m % p == 0; ++i) m /= p;
    d = 0;
  }
  if (m > kMaxMultipleDigits) too_big();
  if (d > kMaxMultipleScale)
    fail(where, "multipleOf ", v.dump(), " has ", d, " fraction digits, past the supported ", kMaxMultipleScale);

  // N = x * 10^d within the bounds, each sign's magnitudes, up to 16 integer digits.
  const auto [lo, hi] = decimal_bounds(s);
  std::optional<Scaled> n_lo, n_hi;
  if (lo) n_lo = scaled_bound(*lo, d, true);
  if (hi) n_hi = scaled_bound(*hi, d, false);
  auto none = [&] { fail(ptr, "no multiple of ", v.dump(), " lies within its minimum and maximum"); };
  if (n_lo && n_hi && scaled_compare(*n_lo, *n_hi) > 0) none();
  const std::string cap(size_t(kIntDigits + d), '9');
  auto clip = [&](std::string a, std::string b) -> std::optional<std::pair<std::string, std::string>> {
    if (digits_compare(b, cap) > 0) b = cap;
    if (digits_compare(a, b) > 0) return std::nullopt;
    return std::pair{a, b};
  };
  std::optional<std::pair<std::string, std::string>> pos, neg;
  if (!n_hi || !n_hi->negative) pos = clip(n_lo && !n_lo->negative ? n_lo->mag : "0", n_hi ? n_hi->mag : cap);
  if (!n_lo || n_lo->negative) neg = clip(n_hi && n_hi->negative ? n_hi->mag : "1", n_lo ? n_lo->mag : cap);
  if (!pos && !neg)
    fail(ptr, "its bounds leave no ", integer ? "integer" : "number", " of at most ", kIntDigits, " integer digits");
  TextAutomaton a = MultipleOfBuilder(m, d, integer).build(pos, neg);
  if (a.states[0].moves.empty()) none();
  if (a.states.size() > kMaxMultipleStates)
    fail(where, "multipleOf ", v.dump(), " with the bounds beside it takes ", a.states.size(),
         " grammar states, past the supported ", kMaxMultipleStates, " (about ", m, " remainders x ",
         kIntDigits + d, " digits; a multipleOf whose digits have factors 2 and 5 takes fewer)");
  return a;
}

}  // namespace kiln::grammar_detail
