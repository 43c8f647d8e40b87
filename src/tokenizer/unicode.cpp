// UTF-8 decoding, character classes and normalization (via utf8proc) for the
// tokenizer. Tested in tests/tokenizer/unicode_test.cpp.
#include "tokenizer/unicode.h"

#include <utf8proc.h>

#include <array>
#include <cctype>
#include <cstdlib>
#include <memory>

#include "core/status.h"

namespace kiln::tok {

size_t utf8_len(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

size_t utf8_decode(std::string_view s, size_t pos, char32_t* cp) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + pos;
  const size_t avail = s.size() - pos;
  if (avail == 0) return 0;
  const unsigned char c = p[0];
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  size_t n;
  char32_t v;
  char32_t min;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2, v = c & 0x1F, min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3, v = c & 0x0F, min = 0x800;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4, v = c & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (avail < n) return 0;
  for (size_t i = 1; i < n; ++i) {
    if ((p[i] & 0xC0) != 0x80) return 0;
    v = (v << 6) | (p[i] & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return n;
}

bool python_unescape(std::string_view src, size_t& pos, std::string& out) {
  if (pos >= src.size()) return false;
  const char e = src[pos];
  size_t digits = 0;
  switch (e) {
    case 'n': out += '\n'; break;
    case 't': out += '\t'; break;
    case 'r': out += '\r'; break;
    case 'b': out += '\b'; break;
    case 'f': out += '\f'; break;
    case 'a': out += '\a'; break;
    case 'v': out += '\v'; break;
    case '0': out += '\0'; break;
    case '\\': case '\'': case '"': out += e; break;
    case '\n': break;  // a line continuation
    case 'x': digits = 2; break;
    case 'u': digits = 4; break;
    case 'U': digits = 8; break;
    default: out += '\\'; out += e;  // Python keeps unknown escapes verbatim
  }
  if (digits) {
    if (pos + 1 + digits > src.size()) return false;
    char32_t cp = 0;
    for (size_t k = 1; k <= digits; ++k) {
      const char h = src[pos + k];
      if (!std::isxdigit(static_cast<unsigned char>(h))) return false;
      cp = cp * 16 + char32_t(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
    }
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    utf8_append(out, cp);
  }
  pos += 1 + digits;
  return true;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string utf8_encode(char32_t cp) {
  std::string s;
  utf8_append(s, cp);
  return s;
}

size_t utf8_find_invalid(std::string_view s) {
  size_t i = 0;
  char32_t cp;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    const size_t n = utf8_decode(s, i, &cp);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

void utf8_require_valid(std::string_view s, const char* what) {
  const size_t bad = utf8_find_invalid(s);
  if (bad != std::string_view::npos) {
    throw_error(ErrorCode::kInvalidArgument, what, " is not valid UTF-8: bad byte 0x", std::hex,
                static_cast<int>(static_cast<unsigned char>(s[bad])), std::dec, " at offset ",
                bad, " (expected UTF-8 text)");
  }
}

std::vector<char32_t> utf8_to_cps(std::string_view s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  size_t i = 0;
  char32_t cp;
  while (i < s.size()) {
    const size_t n = utf8_decode(s, i, &cp);
    if (n == 0) {  // callers validate first; stay total anyway
      out.push_back(0xFFFD);
      ++i;
    } else {
      out.push_back(cp);
      i += n;
    }
  }
  return out;
}

// Length of the maximal prefix of an invalid sequence at s[pos] that could still
// have been valid (Unicode's "maximal subpart"), at least 1.
bool utf8_lead_bounds(unsigned char c, size_t& length, unsigned char& lo, unsigned char& hi) {
  lo = 0x80;
  hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    length = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    length = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    length = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return false;
  }
  return true;
}

static size_t maximal_subpart(std::string_view s, size_t pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + pos;
  const size_t avail = s.size() - pos;
  size_t n;
  unsigned char lo, hi;
  if (!utf8_lead_bounds(p[0], n, lo, hi)) return 1;
  size_t k = 1;
  if (k < avail && k < n && p[k] >= lo && p[k] <= hi) {
    ++k;
    while (k < avail && k < n && (p[k] & 0xC0) == 0x80) ++k;
  }
  return k;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  char32_t cp;
  while (i < s.size()) {
    const size_t n = utf8_decode(s, i, &cp);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out.append("\xEF\xBF\xBD");
      i += maximal_subpart(s, i);
    }
  }
  return out;
}

size_t utf8_complete_prefix(std::string_view s) {
  // Only the last up-to-3 bytes can be an unfinished sequence.
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation: keep looking for the lead
    if (c >= 0xC0 && utf8_len(c) > back && maximal_subpart(s, n - back) == back) {
      return n - back;  // a valid start that is merely cut short
    }
    break;
  }
  return n;
}

bool is_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

static utf8proc_category_t category(char32_t c) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(c));
}

bool is_letter(char32_t c) {
  if (c < 0x80) return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
  const auto k = category(c);
  return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}

bool is_number(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  const auto k = category(c);
  return k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO;
}

bool is_punctuation(char32_t c) {
  const auto k = category(c);
  return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

bool is_control(char32_t c) {
  const auto k = category(c);
  return k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF;
}

bool is_mark_nonspacing(char32_t c) { return category(c) == UTF8PROC_CATEGORY_MN; }

bool is_cjk(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

namespace {
struct ByteMap {
  std::array<std::string, 256> to_char;
  std::array<int16_t, 512> from_char;  // every mapped char is < U+0200
  ByteMap() {
    from_char.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++);
      to_char[b] = utf8_encode(cp);
      from_char[cp] = static_cast<int16_t>(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}
}  // namespace

const std::string& byte_to_unicode(uint8_t b) { return byte_map().to_char[b]; }

int unicode_to_byte(char32_t cp) { return cp < 512 ? byte_map().from_char[cp] : -1; }

static std::string utf8proc_apply(std::string_view s, int options) {
  if (s.empty()) return {};
  utf8proc_uint8_t* out = nullptr;
  const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                              static_cast<utf8proc_ssize_t>(s.size()), &out,
                              static_cast<utf8proc_option_t>(options | UTF8PROC_STABLE));
  if (n < 0) {
    throw_error(ErrorCode::kInvalidArgument, "unicode normalization failed: ",
                utf8proc_errmsg(n), " (expected valid UTF-8 text)");
  }
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> guard(out, &std::free);
  return std::string(reinterpret_cast<char*>(out), static_cast<size_t>(n));
}

std::string unicode_nfc(std::string_view s) { return utf8proc_apply(s, UTF8PROC_COMPOSE); }
std::string unicode_nfd(std::string_view s) { return utf8proc_apply(s, UTF8PROC_DECOMPOSE); }
std::string unicode_nfkc(std::string_view s) {
  return utf8proc_apply(s, UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
}
std::string unicode_nfkd(std::string_view s) {
  return utf8proc_apply(s, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
}

std::string unicode_lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : utf8_to_cps(s)) {
    if (c < 0x80) {
      out.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c));
    } else if (c == 0x130) {  // the one multi-char lowercase mapping
      out.append("i\xCC\x87");
    } else {
      utf8_append(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
    }
  }
  return out;
}

std::string unicode_upper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : utf8_to_cps(s)) {
    if (c < 0x80) {
      out.push_back(static_cast<char>(c >= 'a' && c <= 'z' ? c - 32 : c));
    } else if (c == 0xDF) {  // ß -> SS, as Python's str.upper
      out.append("SS");
    } else {
      utf8_append(out, static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c))));
    }
  }
  return out;
}

std::string unicode_strip_accents(std::string_view s) {
  std::string out;
  for (char32_t c : utf8_to_cps(unicode_nfd(s))) {
    if (!is_mark_nonspacing(c)) utf8_append(out, c);
  }
  return out;
}

}  // namespace kiln::tok
