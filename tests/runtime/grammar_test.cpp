// The grammar engine (runtime/grammar.h) on GBNF grammars and compiled JSON Schemas: for
// each grammar, documents that must be accepted (also when fed in random chunks) and ones
// that must be refused; GBNF error messages; stacks stay bounded on repetition and on
// pathological grammars; GrammarTokenMask against trying every piece on a copy of the state,
// its cache, and greedy decoding that always ends in a document the schema accepts; random
// and mutated byte strings never crash and whatever a JSON grammar completes parses as JSON.
// Prints the time of an uncached mask over a synthetic 50k-piece vocabulary.
#include <algorithm>
#include <gtest/gtest.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "runtime/grammar.h"

namespace kiln {
namespace {

using Json = nlohmann::ordered_json;
using GrammarPtr = std::shared_ptr<const Grammar>;

bool accepts(const GrammarPtr& g, std::string_view doc) {
  GrammarState s(g);
  return s.accept(doc) && s.complete();
}

// The same document fed in random pieces (empty ones included) to one state.
bool accepts_in_chunks(const GrammarPtr& g, std::string_view doc, std::mt19937& rng) {
  GrammarState s(g);
  size_t at = 0;
  while (at < doc.size()) {
    const size_t n = std::uniform_int_distribution<size_t>(0, std::min<size_t>(doc.size() - at, 7))(rng);
    if (!s.accept(doc.substr(at, n))) return false;
    at += n;
  }
  return s.complete();
}

void expect_language(const GrammarPtr& g, const std::vector<std::string>& good, const std::vector<std::string>& bad,
                     const std::string& what) {
  std::mt19937 rng(17);
  for (const std::string& doc : good) {
    EXPECT_TRUE(accepts(g, doc)) << what << " should accept: " << doc;
    for (int k = 0; k < 4; ++k) EXPECT_TRUE(accepts_in_chunks(g, doc, rng)) << what << " in chunks: " << doc;
  }
  for (const std::string& doc : bad) {
    EXPECT_FALSE(accepts(g, doc)) << what << " should refuse: " << doc;
    EXPECT_FALSE(accepts_in_chunks(g, doc, rng)) << what << " in chunks: " << doc;
  }
}

// Schema documents are checked to be JSON first (the test data's own sanity).
void expect_schema(const std::string& schema, const std::vector<std::string>& good,
                   const std::vector<std::string>& bad) {
  SCOPED_TRACE(schema);
  GrammarPtr g;
  ASSERT_NO_THROW(g = grammar_from_json_schema(Json::parse(schema))) << json_schema_to_gbnf(Json::parse(schema));
  for (const std::string& doc : good) ASSERT_TRUE(Json::accept(doc)) << "not JSON: " << doc;
  expect_language(g, good, bad, "schema");
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

std::string gbnf_error(std::string_view text) {
  return error_of([&] { grammar_from_gbnf(text); });
}

std::string schema_error(const std::string& schema) {
  return error_of([&] { grammar_from_json_schema(Json::parse(schema)); });
}

// Each of `parts` appears in the error message `msg`.
void has(const std::string& msg, std::initializer_list<const char*> parts) {
  for (const char* p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

const char* kArithmetic = R"gbnf(
root   ::= expr
expr   ::= term (("+" | "-") term)*
term   ::= factor (("*" | "/") factor)*
factor ::= number | "(" expr ")" | "-" factor
number ::= [0-9]+ ("." [0-9]+)?
)gbnf";

TEST(GrammarGbnf, Arithmetic) {
  const GrammarPtr g = grammar_from_gbnf(kArithmetic);
  expect_language(g, {"1", "1+2*3", "(1+2)*3", "-(4.5/2)", "((((1))))", "10-2-3", "--1", "2*(3+(4-5))/6.25"},
                  {"", "1+", "(1", "1)", "+1", "1..2", "1.", "(1+2", "1 + 2", "()", "1+*2"}, "arithmetic");
  GrammarState s(g);
  ASSERT_TRUE(s.accept("1+"));
  EXPECT_FALSE(s.complete());
  EXPECT_TRUE(s.can_continue());
  ASSERT_TRUE(s.accept("2"));
  EXPECT_TRUE(s.complete());
  EXPECT_TRUE(s.can_continue());
  GrammarState copy = s;
  EXPECT_FALSE(copy.accept(")"));
  EXPECT_TRUE(s.accept("*3")) << "a failed copy leaves the original alone";
}

// llama.cpp's grammars/json.gbnf, as it ships.
const char* kLlamaJson = R"gbnf(
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
)gbnf";

TEST(GrammarGbnf, LlamaCppJsonGrammar) {
  const GrammarPtr g = grammar_from_gbnf(kLlamaJson);
  expect_language(g,
                  {"{}", R"({"a": [1, 2.5, -3e19, true, null, "x\né"], "b": {"c": {}}})",
                   "{\n  \"k\": \"v\"\n}", "{\"\xC3\xA9\": 0}"},
                  {"[]", R"({"a":})", R"({"a":1,})", "{\"a\": \"\x7F\"}", R"({"a": 01})", "{ \t}"},
                  "json.gbnf");
}

TEST(GrammarGbnf, RepetitionCounts) {
  struct Case {
    const char* rule;
    int min, max;  // accepted counts of "a"; max -1: any number past min
  };
  for (const Case& c : {Case{"\"a\"{3}", 3, 3}, Case{"\"a\"{2,4}", 2, 4}, Case{"\"a\"{2,}", 2, -1},
                        Case{"\"a\"{0,2}", 0, 2}, Case{"\"a\"*", 0, -1}, Case{"\"a\"+", 1, -1}, Case{"\"a\"?", 0, 1},
                        Case{"(\"a\" \"a\"?){2}", 2, 4}, Case{"\"a\"{ 1 , 3 }", 1, 3}, Case{"\"a\"{0}", 0, 0}}) {
    const GrammarPtr g = grammar_from_gbnf(std::string("root ::= ") + c.rule);
    for (int n = 0; n <= 8; ++n) {
      const bool want = n >= c.min && (c.max < 0 || n <= c.max);
      EXPECT_EQ(accepts(g, std::string(size_t(n), 'a')), want) << c.rule << " x" << n;
    }
  }
  const GrammarPtr g = grammar_from_gbnf(R"(root ::= ("ab"){0,2} "c" [0-9]{1,3})");
  expect_language(g, {"c1", "abc12", "ababc123"}, {"abababc1", "c", "c1234", "abac1"}, "counts");
}

TEST(GrammarGbnf, CharacterClasses) {
  const GrammarPtr ident = grammar_from_gbnf("root ::= [a-zA-Z_] [a-zA-Z0-9_]*");
  expect_language(ident, {"x", "_a1", "Zz_09"}, {"", "1a", "a-b", "a b"}, "identifier");
  // Negated classes take every other character, multi-byte ones included.
  const GrammarPtr quoted = grammar_from_gbnf(R"(root ::= "\"" [^"\\]* "\"")");
  expect_language(quoted, {"\"\"", "\"h\xC3\xA9llo \xE2\x82\xAC \xF0\x9F\x98\x80\"", "\"a'b\""},
                  {"\"a\"b\"", "\"\\\"", "\"\xFF\"", "\"\xC0\xAF\"", "\"\xED\xA0\x80\"", "\"\xF4\x90\x80\x80\"",
                   "\"\xE2\x82\""},
                  "negated class");
  const GrammarPtr latin = grammar_from_gbnf("root ::= [\xC3\xA0-\xC3\xBF]+");  // [à-ÿ]
  expect_language(latin, {"\xC3\xA9", "\xC3\xA0\xC3\xBF"}, {"a", "\xC4\x80", "\xC3\x9F", "\xC3"}, "latin");
  const GrammarPtr escaped = grammar_from_gbnf(R"(root ::= [\x41-\x43\u00e9\]\-]+ [^\x00-\x7F])");
  expect_language(escaped, {"A\xC3\xA9]-B\xE2\x82\xAC", "C\xF0\x9F\x98\x80"}, {"D\xE2\x82\xAC", "AA", "A\x7F"},
                  "escapes in classes");
  // `.` is one valid UTF-8 character of any length.
  const GrammarPtr dots = grammar_from_gbnf("root ::= . . .");
  expect_language(dots, {"abc", "a\xE2\x82\xAC\xF0\x9F\x98\x80", "\n\t "}, {"ab", "abcd", "\xFF\xFF\xFF", "a\xC0\x80"},
                  "dots");
}

TEST(GrammarGbnf, LiteralsCommentsAndLayout) {
  const GrammarPtr g = grammar_from_gbnf(R"(# a greeting
root ::= greeting   # trailing comment
   " " name         # a rule goes on until the next `name ::=`
greeting ::= "hello" | "hi"
  | "hey"
name ::= [a-z]+
)");
  expect_language(g, {"hello bob", "hi x", "hey abc"}, {"hello", "hello Bob", "hi  x", "yo x"}, "layout");
  const GrammarPtr esc = grammar_from_gbnf(R"(root ::= "\x41\u00e9\U0001F600\n\t\"\\" "" "z")");
  expect_language(esc, {"A\xC3\xA9\xF0\x9F\x98\x80\n\t\"\\z"}, {"A\xC3\xA9"}, "literal escapes");
  EXPECT_NE(esc->dump().find("root ::="), std::string::npos);
  const GrammarPtr empty = grammar_from_gbnf("root ::= \"\" | \"x\"");
  EXPECT_TRUE(GrammarState(empty).complete());
  EXPECT_TRUE(accepts(empty, "x"));
}

TEST(GrammarGbnf, ErrorMessages) {
  has(gbnf_error("root ::= \"abc"), {"GBNF line 1", "unterminated literal", "rule 'root'"});
  has(gbnf_error("root ::= a\n\na ::= \"x\" b\n"), {"line 3", "rule 'a' uses undefined rule 'b'"});
  has(gbnf_error("a ::= \"x\""), {"no rule named 'root'"});
  has(gbnf_error(""), {"no rule named 'root'"});
  has(gbnf_error("root ::= expr\nexpr ::= expr \"+\" term | term\nterm ::= [0-9]"),
      {"line 2", "rule 'expr' is left-recursive", "expr -> expr"});
  has(gbnf_error("root ::= a\na ::= b \"x\"\nb ::= a | \"y\""), {"left-recursive", "a -> b -> a"});
  has(gbnf_error("root ::= a\na ::= b a \"x\" | \"y\"\nb ::= \"z\"?"), {"left-recursive", "rule 'a'"});
  has(gbnf_error("root ::= (\"x\"?)*"), {"left-recursive", "root-"});
  has(gbnf_error("root ::= \"\\q\""), {"unknown escape '\\q'"});
  has(gbnf_error("root ::= \"a\"\nroot ::= \"b\""), {"line 2", "defined twice", "line 1"});
  has(gbnf_error("root ::= ( \"a\""), {"'(' is not closed"});
  has(gbnf_error("root ::= \"a\" )"), {"unmatched ')'"});
  has(gbnf_error("root ::= [b-a]"), {"runs backwards"});
  has(gbnf_error("root ::= [a-z"), {"unterminated character class"});
  has(gbnf_error("root ::= \"a\"{70000}"), {"past the limit"});
  has(gbnf_error("root ::= \"a\"{3,2}"), {"below its minimum"});
  has(gbnf_error("root \"a\""), {"expected '::='"});
  has(gbnf_error("root ::= \"a\" @"), {"line 1, column 14", "found '@'"});
  has(gbnf_error("root ::= \"\\uD800\""), {"surrogate"});
  std::string huge = "root ::=";
  for (int i = 0; i < 40; ++i) huge += " [a-z]{60000}";
  has(gbnf_error(huge), {"too large"});
  // Groups are parsed recursively: nesting is bounded, not a stack overflow.
  auto nested = [](int n) {
    return "root ::= " + std::string(size_t(n), '(') + "\"a\"" + std::string(size_t(n), ')');
  };
  EXPECT_TRUE(accepts(grammar_from_gbnf(nested(1000)), "a"));
  has(gbnf_error(nested(200000)), {"line 1, column 1034", "nest deeper than 1024"});
}

TEST(GrammarGbnf, GeneratedRuleNamesAreShort) {
  // 65536 generated rules each named after a long rule used to copy its name 65536 times.
  const std::string name(1000, 'x');
  const GrammarPtr g = grammar_from_gbnf(name + " ::= [a]{0,65536}\nroot ::= " + name);
  ASSERT_GT(g->rule_count(), 65536u);
  for (size_t r = 0; r < g->rule_count(); ++r) {
    const std::string& rule = g->rule_name(int32_t(r));
    ASSERT_TRUE(rule == name || rule.size() <= 80) << rule.size();
  }
  EXPECT_TRUE(accepts(g, "aaa"));
}

TEST(GrammarEngine, RightRecursionKeepsStacksBounded) {
  const GrammarPtr g = grammar_from_gbnf("root ::= x\nx ::= (\"a\" | \"b\") x | \"\"");
  GrammarState s(g);
  std::string doc;
  for (int i = 0; i < 20000; ++i) doc += i % 3 ? 'a' : 'b';
  ASSERT_TRUE(s.accept(doc));
  EXPECT_TRUE(s.complete());
  EXPECT_LE(s.stack_count(), 4u);
  EXPECT_LT(s.key().size(), 100u);
  // Equal stacks by different paths are one: this ambiguous grammar stays at a few stacks.
  const GrammarPtr amb = grammar_from_gbnf("root ::= (\"a\" | \"a\" | \"aa\" | [a-b])*");
  GrammarState t(amb);
  ASSERT_TRUE(t.accept(std::string(5000, 'a')));
  EXPECT_LE(t.stack_count(), 8u);
}

TEST(GrammarEngine, KeysAreCanonical) {
  const GrammarPtr g = grammar_from_gbnf(kArithmetic);
  auto key_after = [&](std::string_view s) {
    GrammarState st(g);
    EXPECT_TRUE(st.accept(s)) << s;
    return st.key();
  };
  EXPECT_EQ(key_after("1+"), key_after("2-"));
  EXPECT_EQ(key_after("1+"), key_after("12*3/4-"));
  EXPECT_EQ(key_after("(1+"), key_after("(7-"));
  EXPECT_NE(key_after("1+"), key_after("(1+"));
  EXPECT_NE(key_after("1"), key_after("1+"));
  // The same two stacks, their frames made in opposite orders.
  const GrammarPtr two = grammar_from_gbnf(
      "root ::= \"p\" (a | b) | \"q\" (b | a)\na ::= \"x\" c \"1\"\nb ::= \"x\" c \"2\"\nc ::= \"y\"");
  GrammarState p(two), q(two);
  ASSERT_TRUE(p.accept("px"));
  ASSERT_TRUE(q.accept("qx"));
  EXPECT_EQ(p.stack_count(), 2u);
  EXPECT_EQ(p.key(), q.key());
  GrammarState chunked(g);
  ASSERT_TRUE(chunked.accept("(("));
  ASSERT_TRUE(chunked.accept("1+"));
  EXPECT_EQ(chunked.key(), key_after("((1+"));
}

TEST(GrammarEngine, PathologicalGrammarsAreRefusedNotExploded) {
  // Nesting deeper than kMaxDepth frames is refused.
  const GrammarPtr nest = grammar_from_gbnf("root ::= a\na ::= \"x\" a \"y\" | \"\"");
  EXPECT_TRUE(accepts(nest, std::string(100, 'x') + std::string(100, 'y')));
  GrammarState deep(nest);
  EXPECT_FALSE(deep.accept(std::string(size_t(GrammarState::kMaxDepth) + 10, 'x')));
  // Each 'a' may close with 'a' or 'b' later: 2^n distinct stacks, refused past kMaxStacks.
  const GrammarPtr blow = grammar_from_gbnf("root ::= r\nr ::= \"a\" r \"a\" | \"a\" r \"b\" | \"c\"");
  GrammarState s(blow);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(s.accept(std::string(30, 'a')));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  GrammarState ok(blow);
  EXPECT_TRUE(ok.accept("aaacbab"));
  EXPECT_TRUE(ok.complete());
  // A long chain of rules that may match nothing used to recurse once per link at the start
  // (a stack overflow at 65536): now the alternatives wait on a heap stack, and the start's
  // 65536 stacks (one per 'a') are refused.
  const GrammarPtr chain = grammar_from_gbnf("root ::= (\"\" | \"a\"){0,65536} \"z\"");
  GrammarState refused(chain);
  EXPECT_FALSE(refused.can_continue());
  const GrammarPtr short_chain = grammar_from_gbnf("root ::= (\"\" | \"a\"){0,40} \"z\"");
  EXPECT_TRUE(accepts(short_chain, "z"));
  EXPECT_TRUE(accepts(short_chain, std::string(40, 'a') + "z"));
  EXPECT_FALSE(accepts(short_chain, std::string(41, 'a') + "z"));
}

// --- JSON Schema ---------------------------------------------------------------------------

TEST(JsonSchemaObjects, OptionalPropertiesInAnySubset) {
  expect_schema(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"},"c":{"type":"boolean"}},
                   "required":["b"]})",
                {R"({"b":"x"})", R"({"a":1,"b":"x"})", R"({"b":"x","c":true})", R"({"a":-1,"b":"","c":false})",
                 R"({ "a" : 1 , "b" : "x" })", "{\n  \"a\": 1,\n  \"b\": \"x\",\n  \"c\": true\n}"},
                {"{}", R"({"a":1})", R"({"b":"x","a":1})", R"({"b":"x",})", R"({"b":"x","d":1})", R"({"a":1,,"b":"x"})",
                 R"({"b":1})", R"({"a":1,"c":true})", R"({"b":"x"}})", R"({"b":"x"} 1)"});
  expect_schema(R"({"properties":{"x":{"type":"integer"},"y":{"type":"integer"},"z":{"type":"integer"}}})",
                {"{}", R"({"x":1})", R"({"y":2})", R"({"z":3})", R"({"x":1,"z":3})", R"({"y":2,"z":3})",
                 R"({"x":1,"y":2,"z":3})", "{ }"},
                {R"({,"y":1})", R"({"x":1 "y":1})", R"({"y":1,"x":1})", R"({"x":1,})", R"({"x":1,"x":1})",
                 R"({"w":1})"});
  expect_schema(R"({"type":"object","properties":{"a":{"type":"null"},"b":{"type":"integer"},"c":{"type":"null"}},
                   "required":["b"]})",
                {R"({"b":1})", R"({"a":null,"b":1})", R"({"b":1,"c":null})", R"({"a":null,"b":1,"c":null})"},
                {R"({"a":null})", R"({"a":null,"c":null})", R"({"c":null,"b":1})"});
  // Keys that need escaping, or are not ASCII.
  expect_schema(R"({"properties":{"a\"b":{"type":"integer"},"\u00e9 x":{"type":"string"}},
                   "additionalProperties":{"type":"integer"}})",
                {"{\"a\\\"b\":1,\"\xC3\xA9 x\":\"s\"}", "{\"\xC3\xA9 x\":\"s\",\"z\":2}", R"({"q":1})"},
                {R"({"a\"b":"x"})", R"({"q":"x"})", R"({"\u00e9 x":"s"})"});
  // A required key missing from properties takes any value.
  expect_schema(R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a","meta"]})",
                {R"({"a":1,"meta":[1,{"x":null}]})"}, {R"({"a":1})", R"({"meta":1,"a":1})"});
}

TEST(JsonSchemaObjects, AdditionalProperties) {
  expect_schema(R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":{"type":"string"}})",
                {R"({"a":1,"b":"x"})", R"({"b":"x"})", R"({"ab":"x","c":"y"})", R"({"a":1})", R"({"":"e"})",
                 R"({"A":"x"})"},
                {R"({"a":"x"})", R"({"b":1})", R"({"b":"x","a":1})"});
  expect_schema(R"({"type":"object","additionalProperties":{"type":"integer"}})",
                {"{}", R"({"x":1,"y":2})", R"({"x\n\u00e9":3})"}, {R"({"x":"s"})", R"({"x":1,})"});
  expect_schema(R"({"type":"object"})", {"{}", R"({"x":[1,{"y":null}],"z":"w"})"}, {"[]", "1"});
  expect_schema(R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":false})",
                {"{}", R"({"a":1})"}, {R"({"b":1})"});
  expect_schema(R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":true})",
                {R"({"a":1,"b":[true]})", R"({"c":{}})"}, {R"({"a":"x"})"});
}

// minProperties / maxProperties: every subset of the properties, in declared order, is
// accepted exactly when its size is within the bounds (required ones present); extra keys
// count as well; bounds that no object meets are refused.
TEST(JsonSchemaObjects, MinAndMaxProperties) {
  struct Case {
    const char* schema;
    int required_mask;  // properties a, b, c, d: bit 0 is a
    int min, max;
  };
  const Case cases[] = {
      {R"({"type":"object","properties":{"a":{},"b":{},"c":{},"d":{}},"minProperties":2,"maxProperties":3})", 0, 2, 3},
      {R"({"type":"object","properties":{"a":{},"b":{},"c":{},"d":{}},"required":["a"],"minProperties":2,
          "maxProperties":3})", 1, 2, 3},
      {R"({"type":"object","properties":{"a":{},"b":{},"c":{},"d":{}},"required":["c"],"minProperties":3})", 4, 3, 4},
      {R"({"type":"object","properties":{"a":{},"b":{},"c":{},"d":{}},"maxProperties":1})", 0, 0, 1},
      {R"({"type":"object","properties":{"a":{},"b":{},"c":{},"d":{}},"required":["b","d"],"maxProperties":2})", 10, 2,
       2},
      {R"({"properties":{"a":{},"b":{},"c":{},"d":{}},"minProperties":4,"maxProperties":9})", 0, 4, 4},
      {R"({"properties":{"a":{},"b":{},"c":{},"d":{}},"maxProperties":0})", 0, 0, 0},
      {R"({"properties":{"a":{},"b":{},"c":{},"d":{}},"minProperties":0,"maxProperties":4})", 0, 0, 4},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.schema);
    GrammarPtr g = grammar_from_json_schema(Json::parse(c.schema));
    for (int subset = 0; subset < 16; ++subset) {
      std::string doc = "{";
      for (int i = 0; i < 4; ++i)
        if (subset >> i & 1)
          doc += std::string(doc.size() > 1 ? "," : "") + "\"" + char('a' + i) + "\":" + std::to_string(i);
      doc += "}";
      const int size = std::popcount(unsigned(subset));
      const bool want = (subset & c.required_mask) == c.required_mask && size >= c.min && size <= c.max;
      EXPECT_EQ(accepts(g, doc), want) << doc;
    }
  }
  // Extra keys count: "a" and e extras of 5.
  GrammarPtr g = grammar_from_json_schema(Json::parse(
      R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":{"type":"integer"},
          "minProperties":2,"maxProperties":3})"));
  for (bool a : {false, true})
    for (int e = 0; e <= 5; ++e) {
      std::string doc = a ? "{\"a\":0" : "{";
      for (int i = 0; i < e; ++i)
        doc += std::string(doc.size() > 1 ? "," : "") + "\"x" + std::to_string(i) + "\":" + std::to_string(i);
      doc += "}";
      const int size = int(a) + e;
      EXPECT_EQ(accepts(g, doc), size >= 2 && size <= 3) << doc;
    }
  expect_schema(R"({"type":"object","minProperties":1})", {R"({"x":1})", R"({"x":1,"y":[{}]})"}, {"{}", "{ }"});
  expect_schema(R"({"minProperties":2})", {R"({"x":1,"y":null})"}, {R"({"x":1})", "[1,2]"});
  expect_schema(R"({"type":"object","maxProperties":2,"additionalProperties":{"type":"string"}})",
                {"{}", R"({"x":"1"})", R"({"x":"1","y":"2"})"}, {R"({"x":"1","y":"2","z":"3"})", R"({"x":1})"});
  expect_schema(R"({"type":"object","properties":{"id":{"type":"integer"}},"required":["id"],
                   "additionalProperties":true,"maxProperties":2})",
                {R"({"id":1})", R"({"id":1,"tag":"x"})"}, {R"({"id":1,"tag":"x","n":2})", R"({"tag":"x"})"});
  expect_schema(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},
                   "additionalProperties":{"type":"boolean"},"minProperties":4})",
                {R"({"a":1,"b":2,"x":true,"y":false})", R"({"x":true,"y":false,"z":true,"w":true})"},
                {R"({"a":1,"b":2,"x":true})", "{}"});
  // Many optional properties, few allowed: states per property and count.
  Json many = {{"type", "object"}, {"properties", Json::object()}, {"maxProperties", 2}, {"minProperties", 1}};
  for (int i = 0; i < 300; ++i) many["properties"]["k" + std::to_string(i)] = {{"type", "integer"}};
  expect_schema(many.dump(), {R"({"k0":1})", R"({"k5":1,"k299":2})"}, {"{}", R"({"k1":1,"k2":2,"k3":3})"});
  many["maxProperties"] = 200;
  has(error_of([&] { grammar_from_json_schema(many); }), {"300 optional properties", "past the supported 8192"});
  // Bounds no object meets.
  has(schema_error(R"({"type":"object","minProperties":3,"maxProperties":2})"),
      {"maxProperties 2 is below minProperties 3"});
  has(schema_error(R"({"type":"object","properties":{"a":{},"b":{}},"minProperties":3})"),
      {"minProperties 3 is above the 2 properties", "no other keys"});
  has(schema_error(R"({"type":"object","properties":{"a":{}},"additionalProperties":false,"minProperties":2})"),
      {"minProperties 2 is above the 1 properties"});
  has(schema_error(R"({"type":"object","properties":{"a":{},"b":{}},"required":["a","b"],"maxProperties":1})"),
      {"maxProperties 1 is below the 2 required properties"});
  has(schema_error(R"({"type":"object","minProperties":-1})"), {"#/minProperties", "non-negative"});
  has(schema_error(R"({"type":"object","maxProperties":1.5})"), {"#/maxProperties", "non-negative integer"});
}

TEST(JsonSchemaArrays, ItemsCountsAndTuples) {
  expect_schema(R"({"type":"array","items":{"type":"array","items":{"type":"integer"}}})",
                {"[]", "[[]]", "[[1,2],[3]]", "[ [ 1 ] , [] ]", "[\n  [\n    1\n  ]\n]"},
                {"[1]", "[[1,]]", "[[1]]]", "[[1],]", "[[\"a\"]]"});
  expect_schema(R"({"type":"array","items":{"type":"string"},"minItems":1,"maxItems":3})",
                {R"(["a"])", R"(["a","b","c"])"}, {"[]", R"(["a","b","c","d"])", R"([1])"});
  expect_schema(R"({"type":"array","minItems":2})", {R"([1,"x"])", R"([null,{},[]])"}, {"[]", "[1]"});
  expect_schema(R"({"type":"array","maxItems":0})", {"[]", "[ ]"}, {"[1]"});
  expect_schema(R"({"prefixItems":[{"type":"integer"},{"type":"string"}],"items":false})",
                {R"([1,"a"])", "[1]", "[]"}, {R"(["a"])", R"([1,"a",2])", R"([1,2])"});
  expect_schema(R"({"prefixItems":[{"type":"integer"},{"type":"string"}],"items":false,"minItems":2})",
                {R"([1,"a"])"}, {"[1]", "[]"});
  expect_schema(R"({"prefixItems":[{"type":"integer"}],"items":{"type":"boolean"},"maxItems":3})",
                {"[1]", "[1,true]", "[1,true,false]"}, {"[1,true,false,true]", "[1,2]", "[true]"});
  expect_schema(R"({"type":"array","items":[{"type":"null"}],"additionalItems":{"type":"integer"}})",
                {"[null,1,2]", "[]"}, {"[1]", "[null,null]"});
}

TEST(JsonSchemaValues, EnumsConstsAndAnyOf) {
  expect_schema(R"({"enum":["red","green",1,null,{"a":[1,2]},"\u00e9\"q"]})",
                {R"("red")", "1", "null", R"({"a":[1,2]})", "\"\xC3\xA9\\\"q\"", " \"green\""},
                {"\"green\" ", R"("blue")", R"("Red")", "2", R"({"a":[1, 2]})", "\"\\u00e9\\\"q\""});
  expect_schema(R"({"type":"string","enum":["a",1]})", {R"("a")"}, {"1"});
  expect_schema(R"({"const":{"k":true}})", {R"({"k":true})"}, {R"({"k":false})"});
  expect_schema(R"({"anyOf":[{"type":"integer"},
                             {"type":"object","properties":{"k":{"type":"string"}},"required":["k"]}]})",
                {"5", R"({"k":"v"})"}, {R"("x")", "{}", "5.5"});
  expect_schema(R"({"oneOf":[{"type":"string","maxLength":1},{"type":"string","minLength":3}]})",
                {R"("a")", R"("abc")", R"("")"}, {R"("ab")"});
  expect_schema(R"({"allOf":[{"type":"boolean"}],"title":"t","description":"d","default":true})", {"true"}, {"1"});
  expect_schema("{}", {"1", "null", R"({"a":[1,2,{"b":"c"}]})", R"([[], {}])", "-1.5e3", R"("s")"}, {"nul", "[1,]"});
  expect_schema("true", {"[true]"}, {"tru"});
}

TEST(JsonSchemaValues, NullableTypes) {
  expect_schema(R"({"type":["string","null"]})", {R"("a")", "null"}, {"1", "nul"});
  expect_schema(R"({"type":"integer","nullable":true})", {"1", "null"}, {R"("1")"});
  expect_schema(R"({"anyOf":[{"type":"string"},{"type":"null"}],"default":null,"title":"Name"})", {"null", R"("x")"},
                {"1"});
  expect_schema(R"({"type":["integer","string"],"minLength":2})", {"12", R"("ab")"}, {R"("a")"});
}

TEST(JsonSchemaRefs, RecursiveTree) {
  const std::vector<std::string> good = {
      R"({"value":1})", R"({"value":1,"children":[]})",
      R"({"value":1,"children":[{"value":2},{"value":3,"children":[{"value":4,"children":[]}]}]})"};
  const std::vector<std::string> bad = {R"({"value":1,"children":[{}]})", R"({"children":[]})",
                                        R"({"value":1,"children":[{"value":"x"}]})", R"({"value":1,"other":2})"};
  expect_schema(R"({"$defs":{"node":{"type":"object","properties":{"value":{"type":"integer"},
                   "children":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["value"],
                   "additionalProperties":false}},"$ref":"#/$defs/node"})",
                good, bad);
  expect_schema(R"({"definitions":{"node":{"type":"object","properties":{"value":{"type":"integer"},
                   "children":{"type":"array","items":{"$ref":"#/definitions/node"}}},"required":["value"]}},
                   "type":"object","properties":{"value":{"type":"integer"},
                   "children":{"type":"array","items":{"$ref":"#/definitions/node"}}},"required":["value"]})",
                good, bad);
  expect_schema(R"({"type":"object","properties":{"next":{"anyOf":[{"$ref":"#"},{"type":"null"}]}},
                   "required":["next"]})",
                {R"({"next":null})", R"({"next":{"next":{"next":null}}})"}, {R"({"next":{}})"});
}

TEST(JsonSchemaStrings, EscapesAndUtf8) {
  expect_schema(R"({"type":"string"})",
                {R"("a\"b\\c\/d\b\f\n\r\t\u00e9\ud83d\ude00\uD83D\uDE00")",
                 "\"h\xC3\xA9llo \xE2\x82\xAC\xF0\x9F\x98\x80\"",
                 "\"\x7F\"", R"("")"},
                {"\"a\nb\"", "\"\t\"", R"("\x41")", R"("\ud83d")", R"("\ude00")", R"("\ud83dx")", R"("\u12")",
                 "\"\xFF\"", "\"\xC0\xAF\"", "\"\xED\xA0\x80\"", "\"\xF4\x90\x80\x80\"", "\"\xE2\x82\"", "\"\x80\"",
                 R"("abc)", "abc"});
  expect_schema(R"({"type":"string","minLength":2,"maxLength":3})",
                {R"("ab")", R"("abc")", "\"\xC3\xA9\xE2\x82\xAC\"", R"("\n\t")", R"("\u0041bc")"},
                {R"("a")", R"("abcd")", "\"\xC3\xA9\""});
}

TEST(JsonSchemaStrings, FormatsAndPatterns) {
  expect_schema(R"({"type":"string","format":"date"})", {R"("2024-02-29")"}, {R"("2024-13-01")", R"("24-01-01")"});
  expect_schema(R"({"type":"string","format":"date-time"})",
                {R"("2024-01-01T12:00:00Z")", R"("2024-01-01T23:59:59.123+05:30")"},
                {R"("2024-01-01 12:00:00Z")", R"("2024-01-01T24:00:00Z")"});
  expect_schema(R"({"type":"string","format":"time"})", {R"("08:30:00-01:00")"}, {R"("8:30:00Z")"});
  expect_schema(R"({"type":"string","format":"uuid"})", {R"("123e4567-e89b-12d3-a456-426614174000")"},
                {R"("123e4567e89b12d3a456426614174000")"});
  expect_schema(R"({"type":"string","format":"email"})", {R"("anything")"}, {"1"});
  expect_schema(R"({"type":"string","pattern":"^[A-Z]{2}-\\d{3}$"})", {R"("AB-123")"},
                {R"("AB-12")", R"("ab-123")", R"("AB-1234")"});
  expect_schema(R"({"type":"string","pattern":"abc"})", {R"("xxabcxx")", R"("abc")"}, {R"("ab")", R"("acb")"});
  expect_schema(R"({"type":"string","pattern":"^(cat|dog)s?$"})", {R"("cat")", R"("dogs")"},
                {R"("cats!")", R"("cow")"});
  expect_schema(R"({"type":"string","pattern":"^a\"b\\\\[^x]\\.$"})", {R"("a\"b\\y.")", R"("a\"b\\\n.")"},
                {R"("a\"b\\x.")", R"("a\"b\\yy")"});
  expect_schema(R"({"type":"string","pattern":"^(?:ab)+?c{2}(d|e?){0,2}$"})", {R"("abcc")", R"("ababccde")", R"("abccdd")"},
                {R"("acc")", R"("abc")", R"("abccddd")"});
  expect_schema(R"({"type":"string","pattern":"^[\\w.+-]+@[\\w-]+\\.\\w{2,}$"})", {R"("a.b+c@ex-1.org")"},
                {R"("a@b.c")", R"("@b.org")"});
}

TEST(JsonSchemaNumbers, NumbersAndIntegers) {
  expect_schema(R"({"type":"number"})", {"0", "-0.5e+3", "1.5", "10", "1E9", "-0", "0.0e-0", "123456789.123456789"},
                {"01", "1.", ".5", "+1", "1e", "--1", "00", "-", "1e+", "0x1", "NaN"});
  expect_schema(R"({"type":"integer"})", {"0", "-12", "1234567890123456"},
                {"1.5", "01", "12345678901234567", "1e3", "-"});
  expect_schema(R"({"type":"integer","minimum":0,"maximum":10})", {"0", "7", "10"}, {"-1", "11", "-0", "00"});
  expect_schema(R"({"type":"boolean"})", {"true", "false"}, {"True", "1"});
  expect_schema(R"({"type":"null"})", {"null"}, {"nil"});
}

// Integer bounds as digit ranges: every integer in [-2100, 2100] is accepted exactly when
// it lies within the bounds (draft 6 exclusive numbers, draft 4 exclusive booleans,
// fractional bounds), and the edges of 16-digit ranges.
TEST(JsonSchemaNumbers, IntegerBoundsAreExact) {
  struct Case {
    const char* schema;
    int64_t lo, hi;  // inclusive
  };
  const Case cases[] = {
      {R"({"type":"integer","minimum":-15,"maximum":1234})", -15, 1234},
      {R"({"type":"integer","minimum":7})", 7, INT64_MAX},
      {R"({"type":"integer","maximum":-3})", INT64_MIN, -3},
      {R"({"type":"integer","minimum":-1000,"maximum":-100})", -1000, -100},
      {R"({"type":"integer","minimum":0,"maximum":0})", 0, 0},
      {R"({"type":"integer","minimum":99,"maximum":1001})", 99, 1001},
      {R"({"type":"integer","minimum":180,"maximum":2019})", 180, 2019},
      {R"({"type":"integer","exclusiveMinimum":-5,"exclusiveMaximum":20})", -4, 19},
      {R"({"type":"integer","minimum":-5,"exclusiveMinimum":true,"maximum":20,"exclusiveMaximum":true})", -4, 19},
      {R"({"type":"integer","minimum":1.5,"maximum":9.99})", 2, 9},
      {R"({"type":"integer","exclusiveMinimum":1.5,"exclusiveMaximum":9.5})", 2, 9},
      {R"({"type":"integer","minimum":-3,"exclusiveMinimum":0,"maximum":50,"exclusiveMaximum":40})", 1, 39},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.schema);
    GrammarPtr g = grammar_from_json_schema(Json::parse(c.schema));
    int wrong = 0;
    for (int64_t x = -2100; x <= 2100; ++x) {
      const bool want = x >= c.lo && x <= c.hi;
      if (accepts(g, std::to_string(x)) != want && ++wrong <= 5) ADD_FAILURE() << x << " should be " << (want ? "accepted" : "refused");
    }
    EXPECT_FALSE(accepts(g, "01"));
    EXPECT_FALSE(accepts(g, "1.0"));
  }
  GrammarPtr wide =
      grammar_from_json_schema(Json::parse(R"({"type":"integer","minimum":-9999999999999999,"maximum":123456789012})"));
  for (const char* yes : {"-9999999999999999", "123456789012", "123456789011", "99999999999", "-1"})
    EXPECT_TRUE(accepts(wide, yes)) << yes;
  for (const char* no : {"-10000000000000000", "123456789013", "123456789100", "1000000000000"})
    EXPECT_FALSE(accepts(wide, no)) << no;
  has(schema_error(R"({"type":"integer","minimum":1e20})"), {"16 digits"});
  has(schema_error(R"({"type":"integer","minimum":5,"maximum":4})"), {"no integer lies"});
  has(schema_error(R"({"type":"integer","exclusiveMinimum":4,"exclusiveMaximum":5})"), {"no integer lies"});
  has(schema_error(R"({"type":"integer","minimum":"3"})"), {"#/minimum", "expected a number"});
}

// Number bounds as decimal ranges: every multiple of 0.001 in [-25, 25], written with and
// without trailing zeros, is accepted exactly when it lies within the bounds (compared
// here in integer thousandths), over inclusive, exclusive (draft 6 numbers, draft 4
// booleans), one-sided and exponent-written bounds; then long fractions at the edges.
TEST(JsonSchemaNumbers, NumberBoundsAreExact) {
  constexpr int64_t kNone = INT64_MIN;
  struct Case {
    const char* schema;
    int64_t lo;  // thousandths, kNone: unbounded
    bool lo_strict;
    int64_t hi;
    bool hi_strict;
  };
  const Case cases[] = {
      {R"({"type":"number","minimum":0,"maximum":1})", 0, false, 1000, false},
      {R"({"type":"number","minimum":0.1,"maximum":0.95})", 100, false, 950, false},
      {R"({"type":"number","exclusiveMinimum":0,"exclusiveMaximum":1})", 0, true, 1000, true},
      {R"({"type":"number","minimum":-2.5,"maximum":3.25})", -2500, false, 3250, false},
      {R"({"type":"number","exclusiveMinimum":-2.5,"maximum":-0.125})", -2500, true, -125, false},
      {R"({"type":"number","minimum":-10})", -10000, false, kNone, false},
      {R"({"type":"number","maximum":7.005})", kNone, false, 7005, false},
      {R"({"type":"number","exclusiveMaximum":-3})", kNone, false, -3000, true},
      {R"({"type":"number","minimum":1.5,"maximum":1.5})", 1500, false, 1500, false},
      {R"({"type":"number","minimum":0,"exclusiveMinimum":true,"maximum":5,"exclusiveMaximum":true})", 0, true, 5000, true},
      {R"({"type":"number","minimum":12.345,"exclusiveMaximum":20.5})", 12345, false, 20500, true},
      {R"({"type":"number","minimum":-0.001,"maximum":0.001})", -1, false, 1, false},
      {R"({"type":"number","minimum":0.5,"exclusiveMinimum":0.5,"maximum":2})", 500, true, 2000, false},
      {R"({"type":"number","minimum":1e-3,"maximum":2e1})", 1, false, 20000, false},
      {R"({"type":"number","exclusiveMinimum":-1,"exclusiveMaximum":0})", -1000, true, 0, true},
      {R"({"type":"number","minimum":0,"maximum":0})", 0, false, 0, false},
      {R"({"type":["number","null"],"minimum":-3,"exclusiveMinimum":-4,"maximum":9.9,"exclusiveMaximum":10})", -3000,
       false, 9900, false},
  };
  auto render = [](int64_t k, bool pad) {
    const int64_t m = k < 0 ? -k : k;
    std::string s = (k < 0 ? "-" : "") + std::to_string(m / 1000);
    std::string frac = std::to_string(1000 + m % 1000).substr(1);
    if (!pad) frac.erase(frac.find_last_not_of('0') + 1);
    return frac.empty() ? s : s + "." + frac;
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.schema);
    GrammarPtr g = grammar_from_json_schema(Json::parse(c.schema));
    int wrong = 0;
    for (int64_t k = -25000; k <= 25000; k += 1) {
      const bool want = (c.lo == kNone || (c.lo_strict ? k > c.lo : k >= c.lo)) &&
                        (c.hi == kNone || (c.hi_strict ? k < c.hi : k <= c.hi));
      for (bool pad : {false, true}) {
        const std::string doc = render(k, pad);
        if (accepts(g, doc) != want && ++wrong <= 5) ADD_FAILURE() << doc << " should be " << (want ? "accepted" : "refused");
      }
    }
    for (const char* no : {"1e0", "01.5", "1.", ".5", "-0", "-0.0", "+1"}) EXPECT_FALSE(accepts(g, no)) << no;
  }
  // Long fractions at the edges.
  GrammarPtr open = grammar_from_json_schema(Json::parse(R"({"type":"number","exclusiveMinimum":0,"exclusiveMaximum":1})"));
  for (const char* yes : {"0.0000000001", "0.99999999999999999", "0.5000000000000000001"}) EXPECT_TRUE(accepts(open, yes)) << yes;
  for (const char* no : {"0.0000000000", "1.0000", "0", "1", "-0.5"}) EXPECT_FALSE(accepts(open, no)) << no;
  GrammarPtr tenth = grammar_from_json_schema(Json::parse(R"({"type":"number","minimum":0.1,"maximum":0.1000001})"));
  for (const char* yes : {"0.1", "0.10000000", "0.1000001", "0.10000005", "0.10000010000"}) EXPECT_TRUE(accepts(tenth, yes)) << yes;
  for (const char* no : {"0.09999999999", "0.10000011", "0.1000002", "0.2"}) EXPECT_FALSE(accepts(tenth, no)) << no;
  GrammarPtr big = grammar_from_json_schema(Json::parse(R"({"type":"number","minimum":-1e300})"));
  EXPECT_TRUE(accepts(big, "-9999999999999999.5"));
  EXPECT_TRUE(accepts(big, "123.25"));
  EXPECT_FALSE(accepts(big, "-1e5"));
  has(schema_error(R"({"type":"number","minimum":2,"exclusiveMaximum":2})"), {"no number lies"});
  has(schema_error(R"({"type":"number","minimum":2.5,"maximum":2.25})"), {"no number lies"});
  has(schema_error(R"({"type":"number","minimum":1e20})"), {"16 integer digits"});
  // In an object, as pydantic writes a bounded float field.
  expect_schema(R"({"type":"object","properties":{"p":{"type":"number","minimum":0,"maximum":1}},"required":["p"]})",
                {R"({"p":0.25})", R"({"p": 1})", R"({"p":0})"}, {R"({"p":1.01})", R"({"p":-0.1})", R"({"p":2e-1})"});
}

// multipleOf: every integer in [-2100, 2100], and every multiple of 0.001 in [-25, 25] written
// with and without trailing zeros, is accepted exactly when it is a multiple within the bounds
// (compared here in integer millionths); then the 16-digit edges, trailing zeros past the
// multiple's digits, and what is refused.
TEST(JsonSchemaNumbers, MultipleOfIsExact) {
  constexpr int64_t kNone = INT64_MIN;
  struct Case {
    const char* schema;
    int64_t step;  // multipleOf, in millionths
    int64_t lo;    // millionths, inclusive; kNone: unbounded
    int64_t hi;
  };
  const Case integers[] = {
      {R"({"type":"integer","multipleOf":3})", 3000000, kNone, kNone},
      {R"({"type":"integer","multipleOf":7,"minimum":-50,"maximum":1234})", 7000000, -50000000, 1234000000},
      {R"({"type":"integer","multipleOf":4,"exclusiveMinimum":8,"exclusiveMaximum":2000})", 4000000, 9000000,
       1999000000},
      {R"({"type":"integer","multipleOf":0.5})", 500000, kNone, kNone},
      {R"({"type":"integer","multipleOf":2.5,"maximum":-15.5})", 2500000, kNone, -16000000},
      {R"({"type":"integer","multipleOf":1000,"minimum":-1999.5})", 1000000000, -1999000000, kNone},
      {R"({"type":"integer","multipleOf":97,"minimum":0})", 97000000, 0, kNone},
      {R"({"type":"integer","multipleOf":12,"minimum":-2000,"exclusiveMinimum":true,"maximum":1500})", 12000000,
       -1999000000, 1500000000},
  };
  for (const Case& c : integers) {
    SCOPED_TRACE(c.schema);
    GrammarPtr g = grammar_from_json_schema(Json::parse(c.schema));
    int wrong = 0;
    for (int64_t x = -2100; x <= 2100; ++x) {
      const int64_t u = x * 1000000;
      const bool want = u % c.step == 0 && (c.lo == kNone || u >= c.lo) && (c.hi == kNone || u <= c.hi);
      if (accepts(g, std::to_string(x)) != want && ++wrong <= 5)
        ADD_FAILURE() << x << " should be " << (want ? "accepted" : "refused");
    }
    for (const char* no : {"1.0", "0.0", "-0", "00", "03", "3e0", "+3"}) EXPECT_FALSE(accepts(g, no)) << no;
  }
  const Case numbers[] = {
      {R"({"type":"number","multipleOf":0.01})", 10000, kNone, kNone},
      {R"({"type":"number","multipleOf":2.5})", 2500000, kNone, kNone},
      {R"({"type":"number","multipleOf":3})", 3000000, kNone, kNone},
      {R"({"type":"number","multipleOf":0.125,"exclusiveMinimum":-3,"maximum":7.5})", 125000, -2999999, 7500000},
      {R"({"type":"number","multipleOf":0.3,"minimum":0.1,"exclusiveMaximum":2.1})", 300000, 100000, 2099999},
      {R"({"type":"number","multipleOf":0.007,"minimum":-1.2345,"maximum":-0.0001})", 7000, -1234500, -100},
      {R"({"type":"number","multipleOf":1e-3,"minimum":-0.5,"maximum":0.5})", 1000, -500000, 500000},
      {R"({"type":"number","multipleOf":0.05,"minimum":-1e300,"maximum":12.34})", 50000, kNone, 12340000},
      {R"({"type":"number","multipleOf":0.25,"minimum":0,"exclusiveMinimum":true,"maximum":5,"exclusiveMaximum":true})",
       250000, 1, 4999999},
      {R"({"multipleOf":1.5})", 1500000, kNone, kNone},
  };
  auto render = [](int64_t k, bool pad) {  // k thousandths
    const int64_t m = k < 0 ? -k : k;
    std::string s = (k < 0 ? "-" : "") + std::to_string(m / 1000);
    std::string frac = std::to_string(1000 + m % 1000).substr(1);
    if (!pad) frac.erase(frac.find_last_not_of('0') + 1);
    return frac.empty() ? s : s + "." + frac;
  };
  for (const Case& c : numbers) {
    SCOPED_TRACE(c.schema);
    GrammarPtr g = grammar_from_json_schema(Json::parse(c.schema));
    int wrong = 0;
    for (int64_t k = -25000; k <= 25000; ++k) {
      const int64_t u = k * 1000;
      const bool want = u % c.step == 0 && (c.lo == kNone || u >= c.lo) && (c.hi == kNone || u <= c.hi);
      for (bool pad : {false, true}) {
        const std::string doc = render(k, pad);
        if (accepts(g, doc) != want && ++wrong <= 5)
          ADD_FAILURE() << doc << " should be " << (want ? "accepted" : "refused");
      }
    }
    for (const char* no : {"1e0", "01.5", "1.", ".5", "-0", "-0.0", "+1", "0.0000001"})
      EXPECT_FALSE(accepts(g, no)) << no;
  }
  expect_schema(R"({"type":"number","multipleOf":0.01})",
                {"1.25", "1.250000", "-0.07", "3", "3.0", "1234567890123456.99", "0.1"},
                {"1.255", "1.2500001", "1.25e0", "12345678901234567", "0.001", "-0", "1.", "."});
  expect_schema(R"({"type":"integer","multipleOf":3})",
                {"0", "3", "-12", "999", "9999999999999999", "1000000000000002", "-9999999999999999"},
                {"4", "10", "-13", "1.5", "3.0", "99999999999999999", "1000000000000001"});
  expect_schema(R"({"type":"integer","multipleOf":0.5})", {"0", "1", "-7", "1234567890123456"}, {"0.5", "1.5"});
  expect_schema(R"({"type":"number","multipleOf":2.5})", {"0", "2.5", "-5", "7.50", "1000"}, {"1", "2.6", "0.25"});
  expect_schema(R"({"type":"number","multipleOf":0.000000001})", {"0.123456789", "5"}, {"0.1234567891"});
  expect_schema(R"({"type":["integer","null"],"multipleOf":251})", {"null", "309876317", "-251"},
                {"309876318", "252"});
  // Remainders past 1000 fold where factors 2 and 5 cancel: only trailing digits matter.
  expect_schema(R"({"type":"number","multipleOf":0.875})", {"7", "-1.75", "8750.000", "0.875"}, {"0.8750001", "1"});
  expect_schema(R"({"type":"integer","multipleOf":1000,"maximum":1e15})",
                {"0", "-9999999999999000", "1000000000000000", "123000"}, {"1000000000001000", "1100", "10"});
  // In an object, beside a bounded one.
  expect_schema(R"({"type":"object","properties":{"qty":{"type":"integer","multipleOf":6,"minimum":1,"maximum":100},
                   "price":{"type":"number","multipleOf":0.01,"minimum":0}},"required":["qty","price"]})",
                {R"({"qty":6,"price":19.99})", R"({"qty": 96, "price": 0})"},
                {R"({"qty":0,"price":1})", R"({"qty":102,"price":1})", R"({"qty":6,"price":-1})",
                 R"({"qty":6,"price":1.999})"});
  has(schema_error(R"({"type":"number","multipleOf":1001})"), {"#/multipleOf", "at most 1000"});
  has(schema_error(R"({"type":"integer","multipleOf":997})"), {"#/multipleOf", "past the supported 4096"});
  has(schema_error(R"({"type":"number","multipleOf":0.1001})"), {"#/multipleOf", "1001 x 10^-4", "at most 1000"});
  has(schema_error(R"({"type":"integer","multipleOf":1e20})"), {"#/multipleOf", "at most 1000"});
  has(schema_error(R"({"type":"number","multipleOf":1e-10})"), {"#/multipleOf", "10 fraction digits", "supported 9"});
  EXPECT_TRUE(accepts(grammar_from_json_schema(Json::parse(R"({"type":"integer","multipleOf":1e-10})")), "7"));
  has(schema_error(R"({"type":"integer","multipleOf":0})"), {"#/multipleOf", "above 0"});
  has(schema_error(R"({"type":"number","multipleOf":-2})"), {"#/multipleOf", "above 0"});
  has(schema_error(R"({"type":"number","multipleOf":"2"})"), {"#/multipleOf", "expected a number"});
  has(schema_error(R"({"type":"integer","multipleOf":6,"minimum":1,"maximum":5})"), {"no multiple of 6 lies"});
  has(schema_error(R"({"type":"number","multipleOf":0.5,"exclusiveMinimum":1,"exclusiveMaximum":1.5})"),
      {"no multiple of 0.5 lies"});
  has(schema_error(R"({"type":"integer","multipleOf":7,"minimum":1e20})"), {"16 integer digits"});
  has(schema_error(R"({"multipleOf":2,"anyOf":[{}]})"), {"'multipleOf' beside 'anyOf'"});
}

// guided_regex: the whole text matches, exactly as std::regex (ECMAScript) decides, over
// random strings of the patterns' alphabet; quotes and backslashes are plain characters here
// (no JSON escaping), and unsupported syntax is named.
TEST(Regex, WholeTextMatchesAsStdRegexDoes) {
  const char* patterns[] = {"a+b*",          "(ab|cd){2,3}",   "[A-Z][a-z]{1,4}", "\\d{3}-\\d{2}", "^x?y$",
                            "[^abc]+",       "(a|b)*c",        ".{2}",            "\\w+@\\w+\\.c", "colou?r",
                            "a|b|",          "[a-c-]+",        "(?:xy)+z?",       "\"\\\\?",         "[\\s0-2]{1,3}",
                            "(a|(b|c)d)+e?", "x{0}y|[.]{2,}"};
  const std::string alphabet = "abcdexyzrouAZ0129-@.\"\\ \n";
  std::mt19937 rng(11);
  for (const char* pattern : patterns) {
    SCOPED_TRACE(pattern);
    GrammarPtr g = grammar_from_regex(pattern);
    const std::regex want(pattern, std::regex::ECMAScript);
    std::vector<std::string> docs = {"", "ab", "abcd", "xy", "colour", "color", "\"", "\"\\", "012", "aaab", "e"};
    for (int k = 0; k < 4000; ++k) {
      std::string s(rng() % 8, ' ');
      for (char& ch : s) ch = alphabet[rng() % alphabet.size()];
      docs.push_back(s);
    }
    int wrong = 0;
    for (const std::string& d : docs)
      if (accepts(g, d) != std::regex_match(d, want) && ++wrong <= 5)
        ADD_FAILURE() << "'" << d << "' should be " << (std::regex_match(d, want) ? "accepted" : "refused");
  }
  EXPECT_TRUE(accepts(grammar_from_regex("caf\u00e9|\\u00e9t\u00e9"), "caf\u00e9"));
  EXPECT_TRUE(accepts(grammar_from_regex("caf\u00e9|\\u00e9t\u00e9"), "\u00e9t\u00e9"));
  for (const char* bad : {"a(b", "(?=a)", "\\bword", "a**", "[b-a]", "(\\1)"}) {
    try {
      grammar_from_regex(bad);
      ADD_FAILURE() << bad << " compiled";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("regex: ", 0), 0u) << e.what();
    }
  }
}

TEST(JsonSchemaWhitespace, IsBounded) {
  // llama.cpp's rule: nothing, one space, or a line break and up to 20 spaces or tabs.
  const std::string schema = R"({"type":"object","properties":{"a":{"type":"integer"}}})";
  const std::string n20 = "\n" + std::string(20, ' '), n21 = "\n" + std::string(21, ' ');
  expect_schema(schema,
                {"{ \"a\" : 1 }", "{\n  \"a\": 1\n}", "{" + n20 + "\"a\":1}", "\n\t{\"a\":1}", n20 + "{}",
                 "{\"a\"" + n20 + ":" + n20 + "1" + n20 + "}", "{" + n20 + "}", "{\n\t\t\"a\": 1\n}"},
                {"{" + n21 + "\"a\":1}", "{\"a\"" + n21 + ":1}", "{\"a\":1" + n21 + "}", n21 + "{}", "{" + n21 + "}",
                 "{  \"a\":1}", "{ \n\"a\":1}", "{\n\n\"a\":1}", "{\r\n\"a\":1}", "{\"a\":1} ", "{\"a\":1}\n"});
  // Nothing may follow the document: the state is done as it closes.
  const GrammarPtr g = grammar_from_json_schema(Json::parse(schema));
  GrammarState s(g);
  ASSERT_TRUE(s.accept("{ \"a\": 1 }"));
  EXPECT_TRUE(s.complete());
  EXPECT_FALSE(s.can_continue());
}

TEST(JsonSchemaErrors, NameThePointer) {
  has(schema_error(R"({"type":"object","properties":{"a":{"type":"object","propertyNames":{"maxLength":3}}}})"),
      {"#/properties/a/propertyNames", "not supported"});
  has(schema_error(R"({"type":"foo"})"), {"#/type", "unknown type 'foo'"});
  has(schema_error(R"({"$ref":"http://example.com/s.json"})"), {"#/$ref", "only local"});
  has(schema_error(R"({"$ref":"#/$defs/missing"})"), {"does not resolve"});
  has(schema_error(R"({"allOf":[{},{}]})"), {"#/allOf", "exactly one"});
  has(schema_error(R"({"type":"string","minLength":-1})"), {"#/minLength", "non-negative"});
  has(schema_error(R"j({"type":"array","items":{"type":"string","pattern":"(?=a)"}})j"),
      {"#/items/pattern", "lookaround"});
  has(schema_error(R"({"type":"string","pattern":"(a)\\1"})"), {"backreferences"});
  has(schema_error(R"({"type":"string","pattern":"^(b|a?)*$"})"), {"can match nothing"});
  has(schema_error(R"({"type":"string","pattern":"^a|b$"})"), {"top-level '|'"});
  has(schema_error(R"({"type":"string","anyOf":[{"minLength":1}]})"), {"'type' beside 'anyOf'"});
  has(schema_error(R"({"type":"object","properties":{"p":{"not":{}}}})"), {"#/properties/p/not"});
  has(schema_error(R"({"type":"array","uniqueItems":true})"), {"#/uniqueItems"});
  has(schema_error(R"({"type":"object","patternProperties":{"^x":{}}})"), {"#/patternProperties"});
  has(schema_error(R"({"type":"object","required":["a"],"properties":{"a":false}})"), {"#/properties/a"});
  has(schema_error(R"({"type":"string","format":"date","maxLength":3})"), {"format 'date'"});
  has(schema_error(R"({"type":"array","minItems":3,"maxItems":2})"), {"below minItems"});
  has(schema_error(R"({"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})"), {"left-recursive"});
  has(schema_error(R"(false)"), {"matches nothing"});
  EXPECT_NO_THROW(grammar_from_json_schema(Json::parse(
      R"({"$schema":"https://json-schema.org/draft/2020-12/schema","$id":"x","title":"T","description":"D",
          "examples":[1],"x-custom":5,"type":"integer","uniqueItems":false,"$comment":"c"})")));
}

// A request's schema cannot overflow the stack or take time or memory far past its size: the
// compilers recurse on nesting and on runs of properties.
TEST(JsonSchemaErrors, BoundsKeepRequestsSmall) {
  auto nested_items = [](int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += R"({"type":"array","items":)";
    return s + R"({"type":"integer"})" + std::string(size_t(n), '}');
  };
  expect_schema(nested_items(20), {std::string(20, '[') + "1" + std::string(20, ']')}, {"1"});
  EXPECT_NO_THROW(grammar_from_json_schema(Json::parse(nested_items(120))));
  has(schema_error(nested_items(100000)), {"nests deeper than 128"});
  has(schema_error(std::string(300000, '[') + std::string(300000, ']')), {"nests deeper than 128"});
  has(schema_error(R"({"enum":[)" + std::string(300000, '[') + std::string(300000, ']') + "]}"),
      {"nests deeper than 128"});
  Json chain = {{"$defs", Json::object()}, {"$ref", "#/$defs/a0"}};
  for (int i = 0; i < 5000; ++i)
    chain["$defs"]["a" + std::to_string(i)] = {{"$ref", "#/$defs/a" + std::to_string(i + 1)}};
  chain["$defs"]["a5000"] = {{"type", "integer"}};
  has(error_of([&] { grammar_from_json_schema(chain); }), {"#/$defs/a127", "nest deeper than 128", "$ref"});
  has(schema_error(R"({"type":"string","pattern":")" + std::string(100000, '(') + "a" + std::string(100000, ')') +
                   R"("})"),
      {"#/pattern", "nest deeper than 256"});
  auto object = [](int n, bool required) {
    Json s = {{"type", "object"}, {"properties", Json::object()}, {"required", Json::array()}};
    for (int i = 0; i < n; ++i) {
      s["properties"]["k" + std::to_string(i)] = {{"type", "integer"}};
      if (required) s["required"].push_back("k" + std::to_string(i));
    }
    return s;
  };
  for (bool required : {false, true}) {
    const GrammarPtr g = grammar_from_json_schema(object(1024, required));
    EXPECT_EQ(accepts(g, R"({"k1023":1})"), !required);
    has(error_of([&] { grammar_from_json_schema(object(1500, required)); }), {"past the supported 1024"});
  }
  auto tuple = [](int n) {
    Json s = {{"type", "array"}, {"prefixItems", Json::array()}};
    for (int i = 0; i < n; ++i) s["prefixItems"].push_back({{"type", "integer"}});
    return s;
  };
  EXPECT_TRUE(accepts(grammar_from_json_schema(tuple(512)), "[1,2,3]"));
  has(error_of([&] { grammar_from_json_schema(tuple(100000)); }), {"#/prefixItems", "100000 items", "supported 512"});
  auto long_key = [](size_t n) {
    return Json{{"properties", {{std::string(n, 'k'), {{"type", "integer"}}}}}, {"additionalProperties", true}};
  };
  EXPECT_TRUE(accepts(grammar_from_json_schema(long_key(256)), R"({"k":1})"));
  has(error_of([&] { grammar_from_json_schema(long_key(500000)); }), {"longer than 256 characters"});
  // Many $defs whose names sanitize alike (rule names remember their next free suffix, not
  // searched from 1 each time: 30000 took 30 s) still get distinct rules.
  Json alike = {{"$defs", Json::object()}, {"anyOf", Json::array()}};
  for (int i = 0; i < 3000; ++i) {
    std::string key = "a";
    for (int b = i; b > 0; b /= 10) key += "!@#$%^&*()"[b % 10];
    alike["$defs"][key] = {{"const", "v" + std::to_string(i)}};
    alike["anyOf"].push_back({{"$ref", "#/$defs/" + key}});
  }
  const GrammarPtr g = grammar_from_json_schema(alike);  // a rule defined twice would throw
  EXPECT_GT(g->rule_count(), 3000u);
  EXPECT_NE(json_schema_to_gbnf(alike).find("\na--2998 ::= ( \"\\\"v2999\\\"\" )\n"), std::string::npos);
}

// --- Token masks ---------------------------------------------------------------------------

// A small vocabulary: every printable ASCII byte, JSON fragments, words, multi-byte characters
// and their loose bytes, duplicates, and special tokens ("").
std::vector<std::string> small_vocab() {
  std::vector<std::string> v = {"", ""};
  for (int c = 0x20; c < 0x7F; ++c) v.push_back(std::string(1, char(c)));
  for (const char* s : {"\n", "\t", "\r", "{\"", "\":", "\",", "\"}", "},", "],", ": ", ", ", "\n  ", "  ", "    ",
                        "[{", "}]", "\":\"", "\",\"", "true", "false", "null", "nul", "12", "0.", "e+", "-1", "\\n",
                        "\\u", "00", "e9", "d8", "3d", "\\\"", "\\\\", "\xC3\xA9", "\xC3", "\xA9", "\xE2\x82", "\xAC",
                        "\xE2\x82\xAC", "\xF0\x9F\x98\x80", "\xF0\x9F", "\x98\x80", "\xFF", "\xC0", "name", " name",
                        "value", "children", "\"value", "\"children\"", "abc", "ab", "cat", "dog", "s", " \"", "\"\"",
                        "[]", "{}", "[[", "]]", "1,", "2]", "},{\"", "date", "2024", "-01", "T12", ":00", "Z\"",
                        "\"a\"",
                        "\"b\"", "\"c\"", "{\"a\":", "{\"b\":\"", "x", "xx", "xxx"})
    v.push_back(s);
  v.push_back("");
  v.push_back("true");  // a duplicate piece
  for (int i = 0; i < 40; ++i) v.push_back(std::string(1, char('a' + i % 26)) + std::to_string(i));
  while (v.size() < 300) v.push_back(std::string(v.size() % 5 + 1, ' '));
  return v;
}

const char* kTreeSchema = R"({"$defs":{"node":{"type":"object","properties":{"value":{"type":"integer"},
  "name":{"type":"string","maxLength":8},"children":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":3}},
  "required":["value"]}},"$ref":"#/$defs/node"})";

std::vector<uint64_t> brute_force(const GrammarState& state, const TokenTrie& vocab) {
  std::vector<uint64_t> bits((vocab.vocab_size() + 63) / 64, 0);
  for (size_t id = 0; id < vocab.vocab_size(); ++id) {
    GrammarState copy = state;
    const std::string& piece = vocab.piece(int32_t(id));
    if (!piece.empty() && copy.accept(piece)) bits[id / 64] |= uint64_t(1) << (id % 64);
  }
  return bits;
}

TEST(GrammarTokenMask, MatchesTryingEveryPiece) {
  const auto vocab = std::make_shared<const TokenTrie>(small_vocab());
  struct Case {
    GrammarPtr grammar;
    std::vector<std::string> docs;
  };
  const std::vector<Case> cases = {
      {grammar_from_json_schema(Json::parse(kTreeSchema)),
       {R"({"value":12,"name":"\u00e9\n","children":[{"value":-1},{"value":0,"children":[]}]})",
        "{ \"value\": 3, \"name\": \"ab\xE2\x82\xAC\" }"}},
      {grammar_from_json_schema(Json::parse("{}")), {R"([1,{"a":"x\\\"y"},null,true,-0.5e+3])"}},
      {grammar_from_json_schema(Json::parse(R"({"type":"string","format":"date"})")), {R"("2024-01-31")"}},
      {grammar_from_gbnf(kArithmetic), {"(12+3)*-4.5"}},
  };
  int states = 0;
  for (const Case& c : cases) {
    GrammarTokenMask mask(c.grammar, vocab);
    for (const std::string& doc : c.docs) {
      GrammarState s(c.grammar);
      for (size_t i = 0; i <= doc.size(); ++i) {
        const std::vector<uint64_t> want = brute_force(s, *vocab);
        ASSERT_EQ(mask.allowed(s), want) << doc.substr(0, i);
        std::vector<float> logits(vocab->vocab_size() + 5, 1.0f);
        int64_t popcount = 0;
        for (uint64_t w : want) popcount += __builtin_popcountll(w);
        ASSERT_EQ(mask.apply(s, logits), popcount);
        for (size_t id = 0; id < logits.size(); ++id) {
          const bool on = id < vocab->vocab_size() && (want[id / 64] >> (id % 64) & 1);
          ASSERT_EQ(logits[id] == 1.0f, on) << id;
        }
        ++states;
        if (i < doc.size()) {
          ASSERT_TRUE(s.accept(doc.substr(i, 1)));
        }
      }
      EXPECT_TRUE(s.complete());
    }
  }
  EXPECT_GT(states, 150);
}

TEST(GrammarTokenMask, CacheSpecialTokensAndThePastTheVocabulary) {
  const std::vector<std::string> pieces = small_vocab();
  const auto vocab = std::make_shared<const TokenTrie>(pieces);
  const GrammarPtr g = grammar_from_json_schema(Json::parse(kTreeSchema));
  GrammarTokenMask mask(g, vocab);
  GrammarState s(g);
  ASSERT_TRUE(s.accept("{\"value\":1,\"name\":\"a"));
  std::vector<float> a(pieces.size() + 7, 0.5f), b = a;
  EXPECT_EQ(mask.cached_states(), 0u);
  const int64_t n = mask.apply(s, a);
  EXPECT_EQ(mask.cached_states(), 1u);
  EXPECT_EQ(mask.apply(s, b), n);
  EXPECT_EQ(mask.cached_states(), 1u);
  EXPECT_EQ(a, b);
  GrammarState same(g);  // the same stacks by another path hit the same entry
  ASSERT_TRUE(same.accept("{ \"value\": 25, \"name\": \"a"));
  EXPECT_EQ(same.key(), s.key());
  std::vector<float> c(pieces.size() + 7, 0.5f);
  EXPECT_EQ(mask.apply(same, c), n);
  EXPECT_EQ(mask.cached_states(), 1u);
  EXPECT_GT(n, 50) << "inside a string most pieces fit";
  for (size_t id = 0; id < a.size(); ++id) {
    if (id >= pieces.size() || pieces[id].empty()) {
      EXPECT_EQ(a[id], -std::numeric_limits<float>::infinity()) << id;
    }
  }
  EXPECT_EQ(vocab->piece(-1), "");
  EXPECT_EQ(vocab->piece(int32_t(pieces.size())), "");
  EXPECT_EQ(vocab->piece(2), " ");
  // End ids (a special token, past the vocabulary too) keep their logits only where the
  // document may end.
  int32_t special = -1;
  for (size_t id = 0; id < pieces.size() && special < 0; ++id)
    if (pieces[id].empty()) special = int32_t(id);
  ASSERT_GE(special, 0);
  const std::vector<int32_t> ends = {special, int32_t(pieces.size() + 3)};
  std::vector<float> d(pieces.size() + 7, 0.5f);
  EXPECT_EQ(mask.apply(s, d, ends), n);  // inside a string: not complete
  EXPECT_EQ(d[size_t(special)], -std::numeric_limits<float>::infinity());
  GrammarState whole(g);
  ASSERT_TRUE(whole.accept("{\"value\":1}"));
  ASSERT_TRUE(whole.complete());
  std::vector<float> e(pieces.size() + 7, 0.5f), f = e;
  const int64_t m = mask.apply(whole, e);
  EXPECT_EQ(mask.apply(whole, f, ends), m + 2);
  EXPECT_EQ(f[size_t(special)], 0.5f);
  EXPECT_EQ(f[pieces.size() + 3], 0.5f);
}

TEST(GrammarTokenMask, EvictsPastItsBudgetAndIsThreadSafe) {
  const auto vocab = std::make_shared<const TokenTrie>(small_vocab());
  const GrammarPtr g = grammar_from_json_schema(Json::parse(kTreeSchema));
  const std::string doc = R"({"value":12,"name":"ab","children":[{"value":-1,"children":[]},{"value":0}]})";
  std::vector<GrammarState> states;
  std::vector<std::vector<float>> want;
  GrammarTokenMask reference(g, vocab);
  for (size_t i = 0; i <= doc.size(); ++i) {
    GrammarState s(g);
    ASSERT_TRUE(s.accept(doc.substr(0, i)));
    states.push_back(s);
    want.emplace_back(vocab->vocab_size(), 0.0f);
    reference.apply(s, want.back());
  }
  const size_t set_bytes = (vocab->vocab_size() + 63) / 64 * 8 + 256;
  GrammarTokenMask small(g, vocab, 2 * set_bytes);  // room for two states
  for (size_t i = 0; i < states.size(); ++i) {
    std::vector<float> logits(vocab->vocab_size(), 0.0f);
    small.apply(states[i], logits);
    ASSERT_EQ(logits, want[i]);
    ASSERT_LE(small.cached_states(), 2u);
  }
  GrammarTokenMask shared(g, vocab);
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round)
        for (size_t k = 0; k < states.size(); ++k) {
          const size_t i = (k * 7 + size_t(t) * 13) % states.size();
          std::vector<float> logits(vocab->vocab_size(), 0.0f);
          shared.apply(states[i], logits);
          mismatches[size_t(t)] += logits != want[i];
        }
    });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
  EXPECT_LE(shared.cached_states(), states.size());
}

TEST(GrammarTokenMask, GreedyDecodingEndsInAcceptedDocuments) {
  const auto vocab = std::make_shared<const TokenTrie>(small_vocab());
  struct Case {
    const char* schema;
    std::function<bool(const Json&)> valid;
  };
  const std::vector<Case> cases = {
      {kTreeSchema,
       [](const Json& j) {
         std::function<bool(const Json&)> node = [&](const Json& n) {
           if (!n.is_object() || !n.contains("value") || !n["value"].is_number_integer()) return false;
           if (n.contains("name") && (!n["name"].is_string() || n["name"].get<std::string>().size() > 8 * 4))
             return false;
           if (n.contains("children")) {
             if (!n["children"].is_array() || n["children"].size() > 3) return false;
             for (const Json& c : n["children"])
               if (!node(c)) return false;
           }
           return true;
         };
         return node(j);
       }},
      {R"({"type":"object","properties":{"a":{"type":"boolean"},"b":{"enum":["cat","dog",1]},"c":{"type":"array",
          "items":{"type":["integer","null"]},"minItems":1,"maxItems":2}},"required":["b","c"],
          "additionalProperties":false})",
       [](const Json& j) {
         return j.is_object() && j.contains("b") && j.contains("c") && j["c"].is_array() && !j["c"].empty() &&
                j["c"].size() <= 2 && j.size() <= 3 && (!j.contains("a") || j["a"].is_boolean());
       }},
      {R"({"type":"array","items":{"type":"string","format":"date"},"maxItems":2})",
       [](const Json& j) { return j.is_array() && j.size() <= 2; }},
      {R"({"type":"object","properties":{"p":{"type":"number","multipleOf":0.25,"minimum":-10,"maximum":10},
          "q":{"type":"integer","multipleOf":7},"r":{"type":"boolean"}},"minProperties":2})",
       [](const Json& j) {
         if (!j.is_object() || j.size() < 2) return false;
         if (j.contains("p") && (!j["p"].is_number() || std::abs(j["p"].get<double>()) > 10 ||
                                 j["p"].get<double>() * 4 != std::floor(j["p"].get<double>() * 4)))
           return false;
         return !j.contains("q") || (j["q"].is_number_integer() && j["q"].get<int64_t>() % 7 == 0);
       }},
  };
  std::mt19937 rng(5);
  for (const Case& c : cases) {
    const GrammarPtr g = grammar_from_json_schema(Json::parse(c.schema));
    GrammarTokenMask mask(g, vocab);
    int completed = 0;
    for (int run = 0; run < 40; ++run) {
      GrammarState s(g);
      std::string doc;
      for (int step = 0; step < 300 && s.can_continue() && !(s.complete() && (step > 60 || rng() % 3 == 0)); ++step) {
        std::vector<float> logits(vocab->vocab_size());
        for (size_t id = 0; id < logits.size(); ++id) {
          const std::string& p = vocab->piece(int32_t(id));
          // Closing pieces are likelier, so documents end.
          logits[id] = std::uniform_real_distribution<float>(0, 1)(rng) +
                       (p.find_first_of("}]\"") != std::string::npos ? 0.6f : 0.0f);
        }
        ASSERT_GT(mask.apply(s, logits), 0) << "a dead end after " << doc;
        const auto best = size_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
        ASSERT_TRUE(s.accept(vocab->piece(int32_t(best)))) << doc << " + " << vocab->piece(int32_t(best));
        doc += vocab->piece(int32_t(best));
      }
      if (!s.complete()) continue;
      ++completed;
      Json j;
      ASSERT_NO_THROW(j = Json::parse(doc)) << doc;
      EXPECT_TRUE(c.valid(j)) << doc;
      EXPECT_TRUE(accepts(g, doc));
    }
    EXPECT_GT(completed, 10) << c.schema;
  }
}

// A synthetic 50k-piece vocabulary in the shape of a BPE one: byte fallbacks, words with and
// without a leading space, numbers, punctuation runs, whitespace runs, multi-byte text.
std::vector<std::string> synthetic_vocab(size_t n) {
  std::mt19937 rng(123);
  std::vector<std::string> v(3);  // special tokens
  for (int b = 0; b < 256; ++b) v.push_back(std::string(1, char(b)));
  for (int i = 0; i < 1000; ++i) v.push_back(std::to_string(i));
  const std::string punct = "{}[]\":,.-_'!?()/\\ ";
  const char* multi[] = {"\xC3\xA9",     "\xC3\xBC",         "\xE4\xB8\xAD", "\xE6\x96\x87",
                         "\xE2\x82\xAC", "\xF0\x9F\x98\x80", "\xD0\xB4"};
  while (v.size() < n) {
    const unsigned kind = rng() % 10;
    std::string p;
    if (kind < 7) {
      if (rng() % 2) p = " ";
      const size_t len = 2 + rng() % 9;
      for (size_t i = 0; i < len; ++i) p += char((i == 0 && rng() % 5 == 0 ? 'A' : 'a') + rng() % 26);
    } else if (kind == 7) {
      const size_t len = 2 + rng() % 3;
      for (size_t i = 0; i < len; ++i) p += punct[rng() % punct.size()];
    } else if (kind == 8) {
      if (rng() % 2) p = "\n";
      p += std::string(1 + rng() % 8, rng() % 4 ? ' ' : '\t');
    } else {
      const size_t len = 1 + rng() % 3;
      for (size_t i = 0; i < len; ++i) p += multi[rng() % 7];
    }
    v.push_back(p);
  }
  return v;
}

TEST(GrammarTokenMask, UncachedMaskTimeOverA50kVocabulary) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto vocab = std::make_shared<const TokenTrie>(synthetic_vocab(50000));
  const double build_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const GrammarPtr g = grammar_from_json_schema(Json::parse(R"({"type":"object","properties":{
      "name":{"type":"string"},"age":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"}},
      "address":{"type":"object","properties":{"street":{"type":"string"},
                                               "zip":{"type":"string","pattern":"^\\d{5}$"}}}},
      "required":["name","age"]})"));
  std::printf("[ grammar  ] token trie of %zu pieces: %zu nodes, built in %.1f ms\n", vocab->vocab_size(),
              vocab->nodes().size(), build_ms);
  for (const char* prefix : {"", R"({"name":")", R"({"name":"Bob)", R"({"name":"Bob","age":)",
                             R"({"name":"Bob","age":4)", R"({"name":"Bob", "age": 42, "tags": [)",
                             R"({"name":"x","age":1,"address":{"zip":"12)"}) {
    GrammarState s(g);
    ASSERT_TRUE(s.accept(prefix)) << prefix;
    GrammarTokenMask mask(g, vocab);
    std::vector<float> logits(vocab->vocab_size(), 0.0f);
    const auto t1 = std::chrono::steady_clock::now();
    const int64_t kept = mask.apply(s, logits);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
    const auto t2 = std::chrono::steady_clock::now();
    mask.apply(s, logits);
    const double cached_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t2).count();
    std::printf("[ grammar  ] uncached mask %7.2f ms (cached %.3f ms), %6lld tokens allowed after '%s'\n", ms,
                cached_ms,
                static_cast<long long>(kept), prefix);
    EXPECT_GT(kept, 0);
  }
}

// An ambiguous grammar whose states hold hundreds of stacks would take minutes to mask over a
// large vocabulary: past kMaxMaskWork the mask gives up (-1, logits untouched) and
// allowed() throws, while a schema's states over the same vocabulary stay far below it.
TEST(GrammarTokenMask, AmbiguousGrammarsStopAtTheWorkBudget) {
  const auto vocab = std::make_shared<const TokenTrie>(synthetic_vocab(50000));
  const GrammarPtr bad = grammar_from_gbnf(R"(root ::= ("" | [a-y]){0,300} "z")");
  GrammarState s(bad);
  ASSERT_TRUE(s.accept("ab"));
  GrammarTokenMask mask(bad, vocab);
  std::vector<float> logits(vocab->vocab_size(), 1.0f);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(mask.apply(s, logits), -1);
  std::printf("[ grammar  ] an ambiguous grammar's mask gave up after %.0f ms\n",
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  EXPECT_TRUE(std::all_of(logits.begin(), logits.end(), [](float x) { return x == 1.0f; }));
  EXPECT_EQ(mask.cached_states(), 0u);
  EXPECT_THROW(mask.allowed(s), Error);
  const GrammarPtr good = grammar_from_json_schema(Json::parse(R"({"type":"object","properties":{"a":{"type":"string"}}})"));
  GrammarState in_string(good);
  ASSERT_TRUE(in_string.accept(R"({"a":"x)"));
  GrammarTokenMask ok(good, vocab);
  EXPECT_GT(ok.apply(in_string, logits), 0);
}

// --- Random input --------------------------------------------------------------------------

// Inserts, erases or replaces one byte of s at a random place (the replacement from alphabet).
void mutate_byte(std::string& s, const std::string& alphabet, std::mt19937& rng) {
  const size_t at = s.empty() ? 0 : rng() % s.size();
  const char c = alphabet[rng() % alphabet.size()];
  switch (rng() % 3) {
    case 0: s.insert(s.begin() + long(at), c); break;
    case 1: if (!s.empty()) s.erase(s.begin() + long(at)); break;
    default: if (!s.empty()) s[at] = c;
  }
}

TEST(GrammarFuzz, RandomAndMutatedBytesNeverCrash) {
  const std::vector<std::pair<GrammarPtr, std::vector<std::string>>> grammars = {
      {grammar_from_gbnf(kArithmetic), {"(1+2)*3.5", "-4/2"}},
      {grammar_from_json_schema(Json::parse(kTreeSchema)),
       {R"({"value":1,"children":[{"value":2,"name":"\u00e9x"}]})"}},
      {grammar_from_json_schema(Json::parse("{}")), {R"({"a":[1,2.5e-3,"\ud83d\ude00",true,null,{}]})"}},
      {grammar_from_gbnf(R"(root ::= ([^"]* "\"")* . [\x00-\U0010FFFF]?)"), {"ab\"c\"d"}},
  };
  std::mt19937 rng(99);
  const std::string alphabet = "{}[]\":,0123456789.-+eE \n\\uabtrfnlsx\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\xFF\x80";
  int complete_json = 0;
  for (size_t gi = 0; gi < grammars.size(); ++gi) {
    const auto& [g, seeds] = grammars[gi];
    for (int iter = 0; iter < 1500; ++iter) {
      std::string s;
      if (iter % 3 == 0) {
        const size_t len = rng() % 40;
        for (size_t i = 0; i < len; ++i) s += char(iter % 2 ? rng() % 256 : uint8_t(alphabet[rng() % alphabet.size()]));
      } else {
        s = seeds[rng() % seeds.size()];
        for (int m = 0; m < 1 + int(rng() % 3); ++m) mutate_byte(s, alphabet, rng);
      }
      GrammarState whole(g);
      const bool ok = whole.accept(s);
      // Byte by byte agrees with all at once, and keys stay computable.
      GrammarState bytes(g);
      bool ok_bytes = true;
      for (char c : s)
        if (!(ok_bytes = bytes.accept(std::string_view(&c, 1)))) break;
      ASSERT_EQ(ok, ok_bytes) << s;
      if (ok) {
        EXPECT_EQ(whole.key(), bytes.key());
        EXPECT_EQ(whole.complete(), bytes.complete());
      }
      if (ok && whole.complete() && gi > 0 && gi < 3) {
        EXPECT_TRUE(Json::accept(s)) << "completed but not JSON: " << s;
        ++complete_json;
      }
    }
  }
  EXPECT_GT(complete_json, 20);
}

// GBNF and JSON Schema come from requests: mutated ones compile or throw kiln::Error, and
// what compiles runs.
TEST(GrammarFuzz, MutatedGrammarsCompileOrThrow) {
  std::mt19937 rng(11);
  const std::string gbnf_alphabet = "()[]{}|*+?.\"\\^-:=#\n ,0123456789abxuU";
  const std::vector<std::string> gbnf_seeds = {kArithmetic, kLlamaJson, R"(root ::= [^"\\]{2,5} "x"? ("a" | b)*
b ::= [\x41-\u00e9] . "\U0001F600")"};
  const std::string schema_alphabet = "{}[]\":,0123456789 abcdefghijklmnopqrstuvwxyz$#/-^?*+().";
  const std::vector<std::string> schema_seeds = {kTreeSchema,
                                                 R"({"type":"object","properties":{"a":{"type":"string",
                                                     "pattern":"^[a-z]+(-\\d{2})?$"},"b":{"enum":[1,"x",null]},
                                                     "c":{"type":"array","prefixItems":[{"type":"integer"}],
                                                     "minItems":1,"maxItems":3}},"required":["a"]})"};
  auto mutate = [&](std::string s, const std::string& alphabet) {
    for (int m = 0; m < 1 + int(rng() % 4); ++m) mutate_byte(s, alphabet, rng);
    return s;
  };
  auto run = [&](const GrammarPtr& g) {
    GrammarState st(g);
    for (int i = 0; i < 30 && st.can_continue(); ++i) {
      GrammarState copy = st;
      const char c = char(rng() % 128);
      if (copy.accept(std::string_view(&c, 1))) st = copy;
    }
  };
  int compiled = 0, refused = 0;
  for (int iter = 0; iter < 1500; ++iter) {
    try {
      run(grammar_from_gbnf(mutate(gbnf_seeds[rng() % gbnf_seeds.size()], gbnf_alphabet)));
      ++compiled;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      ++refused;
    }
    Json schema;
    try {
      schema = Json::parse(mutate(schema_seeds[rng() % schema_seeds.size()], schema_alphabet));
    } catch (const nlohmann::json::exception&) {
      continue;
    }
    try {
      run(grammar_from_json_schema(schema));
      ++compiled;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      ++refused;
    }
  }
  EXPECT_GT(compiled, 100);
  EXPECT_GT(refused, 100);
}

TEST(GrammarFuzz, RandomJsonValuesAreAccepted) {
  const GrammarPtr any = grammar_from_json_schema(Json::parse("{}"));
  std::mt19937 rng(7);
  std::function<Json(int)> random_value = [&](int depth) -> Json {
    switch (rng() % (depth > 3 ? 5 : 7)) {
      case 0: return nullptr;
      case 1: return rng() % 2 == 0;
      case 2: return int64_t(rng() % 2000000) - 1000000;
      case 3: return std::ldexp(double(rng() % 100000) - 50000, int(rng() % 40) - 20);
      case 4: {
        std::string s;
        const char* parts[] = {"a", "\"", "\\", "\n", "\xC3\xA9", "\xF0\x9F\x98\x80", "\x01", "/", " "};
        for (int i = 0; i < int(rng() % 6); ++i) s += parts[rng() % 9];
        return s;
      }
      case 5: {
        Json a = Json::array();
        for (int i = 0; i < int(rng() % 4); ++i) a.push_back(random_value(depth + 1));
        return a;
      }
      default: {
        Json o = Json::object();
        for (int i = 0; i < int(rng() % 4); ++i)
          o[std::string("k").append(std::to_string(rng() % 10))] = random_value(depth + 1);
        return o;
      }
    }
  };
  std::mt19937 split(3);
  for (int i = 0; i < 300; ++i) {
    const Json v = random_value(0);
    for (const std::string& doc : {v.dump(), v.dump(2), v.dump(-1, ' ', true)}) {
      EXPECT_TRUE(accepts(any, doc)) << doc;
      EXPECT_TRUE(accepts_in_chunks(any, doc, split)) << doc;
    }
  }
}

}  // namespace
}  // namespace kiln
