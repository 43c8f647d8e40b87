// Unit tests for src/tokenizer/unicode.*: strict and lossy UTF-8, the byte map,
// character classes and normalization.
#include "tokenizer/unicode.h"

#include <gtest/gtest.h>

#include "core/status.h"

namespace kiln::tok {
namespace {

TEST(Unicode, DecodeRejectsMalformed) {
  char32_t cp;
  EXPECT_EQ(utf8_decode("\xC0\x80", 0, &cp), 0u);          // overlong
  EXPECT_EQ(utf8_decode("\xED\xA0\x80", 0, &cp), 0u);      // surrogate
  EXPECT_EQ(utf8_decode("\xF4\x90\x80\x80", 0, &cp), 0u);  // > U+10FFFF
  EXPECT_EQ(utf8_decode("\xE4\xBD", 0, &cp), 0u);          // truncated
  EXPECT_EQ(utf8_decode("\xE4\xBD\xA0", 0, &cp), 3u);
  EXPECT_EQ(cp, 0x4F60u);
}

TEST(Unicode, LossyMatchesRust) {
  // One U+FFFD per maximal invalid subpart, as String::from_utf8_lossy.
  EXPECT_EQ(utf8_lossy("a\xE4\xBD" "b"), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(utf8_lossy("\xF0\x9F\x98"), "\xEF\xBF\xBD");
  EXPECT_EQ(utf8_lossy("\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(utf8_lossy("ok"), "ok");
}

TEST(Unicode, CompletePrefixHoldsBackPartialSequences) {
  EXPECT_EQ(utf8_complete_prefix("ab\xE4\xBD"), 2u);
  EXPECT_EQ(utf8_complete_prefix("ab\xE4\xBD\xA0"), 5u);
  EXPECT_EQ(utf8_complete_prefix("ab\xF0\x9F\x98"), 2u);
  EXPECT_EQ(utf8_complete_prefix("ab\x80"), 3u);  // can never complete: released
}

TEST(Unicode, RequireValidThrowsKilnError) {
  try {
    utf8_require_valid("abc\xFF", "input");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("offset 3"), std::string::npos);
  }
}

TEST(Unicode, ByteMapRoundTrips) {
  for (int b = 0; b < 256; ++b) {
    const auto cps = utf8_to_cps(byte_to_unicode(static_cast<uint8_t>(b)));
    ASSERT_EQ(cps.size(), 1u);
    EXPECT_EQ(unicode_to_byte(cps[0]), b);
  }
  EXPECT_EQ(byte_to_unicode(' '), "\xC4\xA0");  // "Ġ"
}

TEST(Unicode, ClassesAndNormalization) {
  EXPECT_TRUE(is_whitespace(0x3000));
  EXPECT_TRUE(is_whitespace(0xA0));
  EXPECT_FALSE(is_whitespace(0x200B));
  EXPECT_TRUE(is_letter(0x4E2D));
  EXPECT_TRUE(is_number(0x0663));  // Arabic-Indic three
  EXPECT_TRUE(is_cjk(0x4E2D));
  EXPECT_FALSE(is_cjk(0x3042));  // hiragana is not split by BERT
  EXPECT_EQ(unicode_strip_accents("caf\xC3\xA9"), "cafe");
  EXPECT_EQ(unicode_lower("\xC4\xB0"), "i\xCC\x87");
  EXPECT_EQ(unicode_nfc("e\xCC\x81"), "\xC3\xA9");
  EXPECT_EQ(unicode_nfkc("\xEF\xAC\x81"), "fi");
}

}  // namespace
}  // namespace kiln::tok
