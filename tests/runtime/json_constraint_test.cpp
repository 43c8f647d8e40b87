// JsonAcceptor against nlohmann::json's parser (an independent one): every document the
// parser takes as an object is accepted byte by byte and ends complete(), every prefix of it
// is accepted and not complete() before its last byte; broken documents are refused at the
// byte that breaks them. Random byte strings must agree with the parser too: whatever the
// acceptor takes whole and complete() parses. mask_json_logits keeps exactly the tokens
// whose bytes continue the document.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "runtime/json_constraint.h"

namespace kiln {
namespace {

// How many leading bytes of s the acceptor takes, and whether it is complete after them.
std::pair<size_t, bool> feed(std::string_view s) {
  JsonAcceptor a;
  size_t n = 0;
  for (char c : s) {
    if (!a.accept(uint8_t(c))) break;
    ++n;
  }
  return {n, a.complete()};
}

bool parses_as_object(std::string_view s) {
  try {
    return nlohmann::json::parse(s).is_object();
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

TEST(JsonAcceptor, TakesWhatTheParserTakes) {
  const std::vector<std::string> good = {
      "{}",
      "{\"a\":1}",
      " {\"a\" : [1, -2.5e+3, 0, 0.25, 1E9, true, false, null, \"x\"] }",
      "{\"k\":{\"n\":{\"m\":[[],[{}]]}},\"s\":\"q\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\"}",
      "{\"emoji\":\"\\ud83d\\ude00 \xf0\x9f\x98\x80 \xc3\xa9 \xe2\x82\xac\"}",
      "{\"z\":-0,\"y\":-0.0e-0}",
  };
  for (const std::string& s : good) {
    ASSERT_TRUE(parses_as_object(s)) << s;
    auto [n, complete] = feed(s);
    EXPECT_EQ(n, s.size()) << s;
    EXPECT_TRUE(complete) << s;
    for (size_t cut = 0; cut + 1 < s.size(); ++cut)
      if (s.find_first_not_of(" \t\n\r", cut) != std::string::npos) {
        auto [m, done] = feed(s.substr(0, cut));
        ASSERT_EQ(m, cut) << "prefix of " << s;
        ASSERT_FALSE(done) << "prefix of " << s << " of " << cut << " bytes";
      }
    JsonAcceptor a;
    ASSERT_TRUE(a.accept(s));
    EXPECT_FALSE(a.accept(uint8_t(' '))) << "nothing comes after the document";
  }
}

TEST(JsonAcceptor, RefusesTheByteThatBreaksTheDocument) {
  // (document, bytes accepted before the refused one)
  const std::vector<std::pair<std::string, size_t>> bad = {
      {"[1]", 0},                       // not an object
      {"\"x\"", 0},
      {"{\"a\":01}", 6},                // leading zero
      {"{\"a\":1.}", 7},                // a fraction needs digits
      {"{\"a\":1e}", 7},
      {"{\"a\":-}", 6},
      {"{\"a\" 1}", 5},                 // a colon is missing
      {"{1:2}", 1},                     // keys are strings
      {"{\"a\":1,}", 7},                // trailing comma
      {"{\"a\":[1,]}", 8},
      {"{\"a\":tru}", 8},
      {"{\"a\":\"\x01\"}", 6},          // control character in a string
      {"{\"a\":\"\\x\"}", 7},           // unknown escape
      {"{\"a\":\"\\u12g4\"}", 10},
      {"{\"a\":\"\\udc00\"}", 11},      // a lone low surrogate
      {"{\"a\":\"\\ud800x\"}", 12},     // a high one without its low half
      {"{\"a\":\"\xc0\xaf\"}", 6},      // overlong UTF-8
      {"{\"a\":\"\xed\xa0\x80\"}", 7},  // UTF-8 surrogate
      {"{\"a\":\"\xf4\x90\x80\x80\"}", 7},  // past U+10FFFF
      {"{\"a\":1}}", 7},                // after the end
  };
  for (const auto& [s, at] : bad) {
    EXPECT_FALSE(parses_as_object(s)) << s;
    EXPECT_EQ(feed(s).first, at) << s;
  }
}

TEST(JsonAcceptor, BoundsWhitespaceAndDepth) {
  JsonAcceptor a;
  ASSERT_TRUE(a.accept("{"));
  for (int i = 0; i < JsonAcceptor::kMaxWhitespace; ++i) ASSERT_TRUE(a.accept(uint8_t(' ')));
  EXPECT_FALSE(a.accept(uint8_t('\n')));
  EXPECT_TRUE(a.accept(uint8_t('}')));
  JsonAcceptor deep;
  std::string s = "{\"a\":";
  ASSERT_TRUE(deep.accept(s));
  int depth = 1;
  while (depth < JsonAcceptor::kMaxDepth) {
    ASSERT_TRUE(deep.accept(uint8_t('[')));
    ++depth;
  }
  EXPECT_FALSE(deep.accept(uint8_t('['))) << "deeper than kMaxDepth";
}

// Random strings over JSON's alphabet: the acceptor and the parser agree on every one the
// acceptor takes whole (complete -> parses as an object; a parsable object -> taken whole up
// to its last non-space byte: the acceptor ends the document there).
TEST(JsonAcceptor, AgreesWithTheParserOnRandomStrings) {
  const std::string alphabet = "{}[]:,\"\\ 0123456789-+.eEtrufalsn\"\"\"abuUd\n";
  std::mt19937 rng(5);
  int complete_docs = 0;
  for (int trial = 0; trial < 200000; ++trial) {
    std::string s = "{";
    const int len = 1 + int(rng() % 14);
    for (int i = 0; i < len; ++i) s += alphabet[rng() % alphabet.size()];
    auto [n, complete] = feed(s);
    const bool whole = n == s.size();
    if (whole && complete) {
      ++complete_docs;
      EXPECT_TRUE(parses_as_object(s)) << s;
    }
    if (parses_as_object(s)) {
      const std::string_view body = std::string_view(s).substr(0, s.find_last_not_of(" \n") + 1);
      auto [m, done] = feed(body);
      EXPECT_TRUE(m == body.size() && done) << s;
    }
  }
  EXPECT_GT(complete_docs, 100);
}

TEST(JsonMask, KeepsTheTokensThatContinue) {
  const std::vector<std::string> pieces = {"{", "}", "\"a\"", ":", "1", " ", "", "x", "{\"", "\"}"};
  std::vector<float> logits(pieces.size() + 2, 0.0f);  // two ids past the pieces
  JsonAcceptor start;
  EXPECT_EQ(mask_json_logits(start, pieces, logits), 3);  // "{", " ", "{\""
  const float off = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(logits[0], 0.0f);
  EXPECT_EQ(logits[1], off);
  EXPECT_EQ(logits[5], 0.0f);
  EXPECT_EQ(logits[6], off) << "a special token (empty piece) never continues a document";
  EXPECT_EQ(logits[8], 0.0f);
  EXPECT_EQ(logits[10], off);
  JsonAcceptor in_key;
  ASSERT_TRUE(in_key.accept("{\"a"));
  logits.assign(logits.size(), 0.0f);
  // Inside a key: every byte but the ones closing it before a colon ("\"a\"", "\"}") and
  // the empty (special) piece.
  EXPECT_EQ(mask_json_logits(in_key, pieces, logits), 7);
  EXPECT_EQ(logits[2], off);
  EXPECT_EQ(logits[9], off);
  EXPECT_EQ(logits[8], 0.0f);
}

// The cached sets give what mask_json_logits gives, state by state along a document (each
// state's first use computes its set, later ones reuse it); equal states share one set.
TEST(JsonMask, CachedSetsEqualTheDirectMask) {
  std::vector<std::string> pieces = {"{", "}", "\"a\"", ":", "1", " ", "", "x", "{\"", "\"}", ",", "[", "]", "\""};
  JsonTokenMask cached(pieces);
  const std::string doc = "{\"a\": [1, {\"x\": \"a1\"}, [ ]], \"b\": {}}";
  for (int pass = 0; pass < 2; ++pass) {
    JsonAcceptor state;
    for (size_t i = 0; i <= doc.size(); ++i) {
      std::vector<float> direct(pieces.size() + 1, 0.0f), via_cache(pieces.size() + 1, 0.0f);
      EXPECT_EQ(mask_json_logits(state, pieces, direct), cached.apply(state, via_cache)) << i;
      EXPECT_EQ(direct, via_cache) << "after " << doc.substr(0, i);
      if (i < doc.size()) ASSERT_TRUE(state.accept(uint8_t(doc[i])));
    }
  }
  EXPECT_LT(cached.cached_states(), doc.size()) << "recurring states share a set";
  EXPECT_EQ(cached.piece(2), "\"a\"");
  EXPECT_EQ(cached.piece(99), "");
}

}  // namespace
}  // namespace kiln
