// UTF-8 and Unicode helpers shared by the tokenizer stages: strict decoding, the
// GPT-2 byte<->char map, character classes as HuggingFace `tokenizers` (Rust) sees
// them, and lossy UTF-8 repair that matches String::from_utf8_lossy.
// Tested in tests/tokenizer/unicode_test.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::tok {

// Decodes one code point at s[pos]; returns its length in bytes, or 0 when the
// sequence is not valid UTF-8 (overlong, surrogate, truncated, > U+10FFFF).
size_t utf8_decode(std::string_view s, size_t pos, char32_t* cp);
// Length of the UTF-8 sequence a lead byte announces (1 for invalid lead bytes).
size_t utf8_len(unsigned char lead);
// A multi-byte sequence's lead byte: its length (2-4) and the bounds [lo, hi] of its
// first continuation byte (no overlong forms, no surrogates, nothing past U+10FFFF; the
// later continuation bytes are 0x80-0xBF). False for a byte that leads no such sequence.
bool utf8_lead_bounds(unsigned char lead, size_t& length, unsigned char& lo, unsigned char& hi);
void utf8_append(std::string& out, char32_t cp);
std::string utf8_encode(char32_t cp);
// One escape of a Python string literal, its backslash just before src[pos]: appends what it
// stands for to `out` (\n \t \r \b \f \a \v \0, \\ \' \", \xHH \uHHHH \UHHHHHHHH as UTF-8;
// an unknown escape verbatim, backslash included, as Python keeps it; a backslash-newline
// is a line continuation) and moves pos past it. False, pos unchanged, for one that is cut
// off or whose hex digits are bad or name a surrogate or a code point past U+10FFFF. Used
// by the chat templates' Jinja lexer and the pythonic tool-call parser.
bool python_unescape(std::string_view src, size_t& pos, std::string& out);
// Offset of the first invalid byte, or npos when s is valid UTF-8.
size_t utf8_find_invalid(std::string_view s);
// Throws kiln::Error(kInvalidArgument) naming `what` and the byte offset.
void utf8_require_valid(std::string_view s, const char* what);
// Decodes a valid UTF-8 string into code points.
std::vector<char32_t> utf8_to_cps(std::string_view s);
// Replaces each maximal invalid subsequence by U+FFFD, as Rust's
// String::from_utf8_lossy (and therefore HF decode) does.
std::string utf8_lossy(std::string_view s);
// Length of the longest prefix of s that ends on a character boundary, treating a
// trailing truncated-but-so-far-valid sequence as incomplete.
size_t utf8_complete_prefix(std::string_view s);

// Character classes. Rust's char::is_whitespace (the White_Space property).
bool is_whitespace(char32_t cp);
bool is_letter(char32_t cp);    // \p{L}
bool is_number(char32_t cp);    // \p{N}
bool is_punctuation(char32_t cp);  // \p{P}
bool is_control(char32_t cp);   // \p{Cc} or \p{Cf}
bool is_mark_nonspacing(char32_t cp);  // \p{Mn}
bool is_cjk(char32_t cp);       // the CJK blocks BERT splits into single characters

// GPT-2's reversible byte -> printable char map used by ByteLevel.
const std::string& byte_to_unicode(uint8_t b);  // the UTF-8 of the mapped char
// Returns -1 when cp is not in the image of the byte map.
int unicode_to_byte(char32_t cp);

// Normalization via utf8proc. All take valid UTF-8.
std::string unicode_nfc(std::string_view s);
std::string unicode_nfd(std::string_view s);
std::string unicode_nfkc(std::string_view s);
std::string unicode_nfkd(std::string_view s);
// Full lowercase as Rust's char::to_lowercase (U+0130 -> "i\u0307").
std::string unicode_lower(std::string_view s);
std::string unicode_upper(std::string_view s);
// NFD then drop nonspacing marks (BERT's strip_accents).
std::string unicode_strip_accents(std::string_view s);

}  // namespace kiln::tok
