// JSON Schema's numeric bounds -> GBNF (grammar_internal.h): an integer's `minimum`,
// `maximum`, `exclusiveMinimum` and `exclusiveMaximum` as digit ranges, a number's as exact
// decimal ranges, for json_schema.cpp. Tested in tests/runtime/grammar_test.cpp
// (JsonSchemaNumbers: every value of a fine grid against the bounds); fuzzed by
// fuzz/grammar_fuzz.cpp.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
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

}  // namespace kiln::grammar_detail
