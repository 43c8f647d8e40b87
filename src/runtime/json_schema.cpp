// JSON Schema -> GBNF (grammar.h) for one JSON document matching the schema, in the manner of
// llama.cpp's json-schema-to-grammar and OpenAI's structured outputs (`pattern` is compiled in
// json_schema_pattern.cpp, numeric bounds in json_schema_numbers.cpp). Tested in
// tests/runtime/grammar_test.cpp.
//
// Supported: `type` (one or a list; absent: inferred from object/array/string keywords, else
// any value), `enum`, `const` (their compact serialization, filtered by `type`), `anyOf`,
// `oneOf` (as anyOf), `allOf` of one schema, `$ref` to any local pointer ("#", "#/$defs/x",
// "#/definitions/x"; recursion allowed: one rule per target), `nullable` (OpenAPI);
// objects: `properties` (in declared order: required ones always, any subset of the optional
// ones), `required`, `additionalProperties`, `minProperties`, `maxProperties` (counting the
// required, the chosen optional and the extra keys; a state per optional property and count so
// far); arrays: `items`, `prefixItems` (or draft-7 tuple `items` with `additionalItems`),
// `minItems`, `maxItems`; strings: `minLength`, `maxLength` (characters), `format` date, time,
// date-time and uuid (other formats: any string), `pattern` (a regex subset: literals,
// escapes, classes, `.`, `\d\w\s`, groups, `|`, quantifiers, `^`/`$` only at the ends;
// unanchored sides match any characters; lookarounds, backreferences, word boundaries and
// \p{..} are refused; a pattern's characters must be written as themselves or with JSON's
// short escapes, not as \u escapes).
// Integers: `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum` (draft 6 numbers or
// draft 4 booleans) as digit ranges (an unbounded side stops at 16 digits); numbers: the
// same bounds as exact decimal ranges, written without an exponent. `multipleOf` (for both;
// alone it implies a number) as an automaton over the digits keeping the remainder, bounds
// beside it included: with multipleOf = m x 10^-d, a number is written with the digits that
// count (at most d fraction digits, then only zeros) and no exponent.
// Ignored: annotations and unknown keywords, `uniqueItems: false`.
// Refused (kInvalidArgument naming the JSON pointer): the other constraining keywords
// (patternProperties, propertyNames, dependencies, if/then/else, not, contains, uniqueItems:
// true, unevaluated*), combinators beside other constraints, allOf of several schemas, `false`
// where a value must appear, a known format or pattern together with a length, bounds no value
// meets (minProperties above the keys an object may have, maxProperties below its required
// ones, no multiple within minimum and maximum); past the bounds that keep a request's compile
// small (JSON nesting and schemas within schemas, $ref chains included, past 128 levels;
// groups in a pattern past 256; over 1024 properties on an object or 512 prefix items on an
// array; a property name over 256 characters beside additionalProperties; multipleOf = m x
// 10^-d with m over 1000 (for integers once 10^d's factors are taken out) or, for numbers, d
// over 9, or whose automaton keeps over 4096 states (m coprime to 10 past about 250: a state per
// remainder and digit position); min/maxProperties needing over 8192 states, (optional
// properties + 1) x counts).
//
// Choices: whitespace between tokens is llama.cpp's: nothing, one space, or a line break and
// up to kMaxSpace spaces or tabs (a model may pretty-print but not pad forever), allowed
// before the document but not after it (so the state is done, !can_continue(), as the last
// bracket or quote closes); an object with `properties` (or `required`) and no
// `additionalProperties` takes no other keys (what a caller listing properties wants
// generated); extra keys come after the declared ones and must differ from them as written
// (without escapes), and are counted by min/maxProperties as written (the grammar does not keep
// them distinct from each other); integers have at most 16 digits; enum and const objects are
// written compactly; \u escapes in strings must pair surrogates.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "core/status.h"
#include "runtime/grammar.h"
#include "runtime/grammar_internal.h"
#include "tokenizer/unicode.h"

namespace kiln {
namespace {

using Json = nlohmann::ordered_json;
using grammar_detail::CpRanges;

using grammar_detail::cp_complement;
using grammar_detail::cp_normalize;

constexpr int kMaxSpace = 20;
// Bounds on what a schema (a request's) may hold: the compilers recurse on nesting and on
// runs of properties, and a tuple's optional tail nests a group per item in the grammar.
constexpr int kMaxSchemaDepth = 128;        // JSON nesting, and schemas inside schemas ($ref included)
constexpr size_t kMaxProperties = 1024;     // per object, `required` ones included
constexpr size_t kMaxPrefixItems = 512;     // per array
constexpr size_t kMaxCountedStates = 8192;  // per object: optional properties x their counts kept apart
constexpr size_t kMaxExcludedKey = 256;     // characters of a property name kept from extra keys
constexpr size_t kMaxRuleName = 64;         // bytes of a rule name taken from a hint

// Fixed rules, added with what they use on first use.
struct Primitive {
  const char* name;
  std::string body;
  std::vector<const char*> uses;
};
const std::vector<Primitive>& primitives() {
  static const std::vector<Primitive> kPrimitives = {
      {"space", "( \" \" | \"\\n\" [ \\t]{0," + std::to_string(kMaxSpace) + "} )?", {}},
      {"value", "object | array | string | number | boolean | null",
       {"object", "array", "string", "number", "boolean", "null"}},
      {"object",
       "\"{\" space ( string space \":\" space value ( space \",\" space string space \":\" space value )* space )? "
       "\"}\"",
       {"space", "string", "value"}},
      {"array", "\"[\" space ( value ( space \",\" space value )* space )? \"]\"", {"space", "value"}},
      {"string", "\"\\\"\" char* \"\\\"\"", {"char"}},
      {"char", "[^\"\\\\\\x00-\\x1F] | escape", {"escape"}},
      // A \u escape of a high surrogate must be followed by one of a low surrogate.
      {"escape", "\"\\\\\" ( [\"\\\\/bfnrt] | \"u\" utf16 )", {"utf16"}},
      {"utf16",
       "[0-9a-cA-CeEfF] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} | "
       "[dD] [89abAB] [0-9a-fA-F]{2} \"\\\\u\" [dD] [c-fC-F] [0-9a-fA-F]{2}",
       {}},
      {"number", "\"-\"? ( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]+ )? ( [eE] [-+]? [0-9]+ )?", {}},
      {"integer", "\"-\"? ( \"0\" | [1-9] [0-9]{0,15} )", {}},
      {"boolean", "\"true\" | \"false\"", {}},
      {"null", "\"null\"", {}},
      {"date", "[0-9]{4} \"-\" ( \"0\" [1-9] | \"1\" [0-2] ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"3\" [01] )", {}},
      {"time",
       "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" ( [0-5] [0-9] | \"60\" ) ( \".\" [0-9]{1,9} )? "
       "( [zZ] | [-+] ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )",
       {}},
      {"date-string", "\"\\\"\" date \"\\\"\"", {"date"}},
      {"time-string", "\"\\\"\" time \"\\\"\"", {"time"}},
      {"date-time-string", "\"\\\"\" date [tT] time \"\\\"\"", {"date", "time"}},
      {"uuid-string",
       "\"\\\"\" [0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" "
       "[0-9a-fA-F]{12} \"\\\"\"",
       {}},
  };
  return kPrimitives;
}

const std::set<std::string> kRefused = {
    "patternProperties", "propertyNames", "dependentRequired", "dependentSchemas", "dependencies", "if", "then",
    "else", "not", "contains", "minContains", "maxContains", "uniqueItems", "unevaluatedProperties",
    "unevaluatedItems", "$dynamicRef", "$recursiveRef", "contentSchema"};
// Supported keywords that constrain a value directly (not through a combinator).
const std::set<std::string> kAssertions = {
    "type", "properties", "required", "additionalProperties", "minProperties", "maxProperties", "items",
    "prefixItems", "additionalItems", "minItems", "maxItems", "minLength", "maxLength", "pattern", "format",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "enum", "const"};

std::string hex2(unsigned v) {
  static const char* kHex = "0123456789ABCDEF";
  return {kHex[(v >> 4) & 15], kHex[v & 15]};
}

// A GBNF literal of raw bytes (ASCII punctuation escaped, the rest as it is).
std::string gbnf_literal(std::string_view bytes) {
  std::string out = "\"";
  for (char c : bytes) {
    const auto b = uint8_t(c);
    if (c == '"' || c == '\\') out += std::string("\\") + c;
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (b < 0x20 || b == 0x7F) out += "\\x" + hex2(b);
    else out += c;
  }
  return out + "\"";
}

std::string gbnf_code_point(char32_t c) {
  if (c >= 0x80) {
    char buf[16];
    std::snprintf(buf, sizeof buf, c > 0xFFFF ? "\\U%08X" : "\\u%04X", unsigned(c));
    return buf;
  }
  if (c < 0x20 || c == 0x7F || std::string_view("]\\^-[\"").find(char(c)) != std::string_view::npos)
    return "\\x" + hex2(unsigned(c));
  return std::string(1, char(c));
}

std::string gbnf_class(const CpRanges& ranges) {
  std::string out = "[";
  for (auto [a, b] : ranges) {
    out += gbnf_code_point(a);
    if (b > a) out.append("-").append(gbnf_code_point(b));
  }
  return out + "]";
}

// Intersection with [lo, hi].
CpRanges cp_clip(const CpRanges& r, char32_t lo, char32_t hi) {
  CpRanges out;
  for (auto [a, b] : r)
    if (b >= lo && a <= hi) out.push_back({std::max(a, lo), std::min(b, hi)});
  return out;
}

bool cp_has(const CpRanges& r, char32_t c) {
  for (auto [a, b] : r)
    if (a <= c && c <= b) return true;
  return false;
}

CpRanges cp_without_surrogates(const CpRanges& r) {
  return cp_normalize([&] {
    CpRanges out = cp_clip(r, 0, 0xD7FF);
    for (auto range : cp_clip(r, 0xE000, 0x10FFFF)) out.push_back(range);
    return out;
  }());
}

}  // namespace

namespace grammar_detail {

std::string raw_char_set(const CpRanges& set) {
  const CpRanges r = cp_without_surrogates(set);
  return r.empty() ? std::string() : gbnf_class(r);
}

// One character of a JSON string's content that is in `set`, as it may be written: the
// plain ones as themselves, '"', '\\' and control characters escaped ('/' either way).
std::string json_char_set(const CpRanges& raw) {
  const CpRanges set = cp_without_surrogates(raw);
  std::vector<std::string> alts;
  CpRanges plain;
  for (auto [a, b] : cp_clip(set, 0x20, 0x10FFFF)) {
    if (a <= '"' && '"' <= b) {
      if (a < '"') plain.push_back({a, '"' - 1});
      a = '"' + 1;
    }
    if (a <= '\\' && '\\' <= b) {
      if (a < '\\') plain.push_back({a, '\\' - 1});
      a = '\\' + 1;
    }
    if (a <= b) plain.push_back({a, b});
  }
  if (!plain.empty()) alts.push_back(gbnf_class(plain));
  if (cp_has(set, '"')) alts.push_back(gbnf_literal("\\\""));
  if (cp_has(set, '\\')) alts.push_back(gbnf_literal("\\\\"));
  if (cp_has(set, '/')) alts.push_back(gbnf_literal("\\/"));
  const CpRanges controls = cp_clip(set, 0, 0x1F);
  using Short = std::pair<char32_t, char>;
  for (auto [c, e] : {Short{8, 'b'}, Short{9, 't'}, Short{10, 'n'}, Short{12, 'f'}, Short{13, 'r'}})
    if (cp_has(controls, c)) alts.push_back(gbnf_literal(std::string("\\") + e));
  if (controls == CpRanges{{0, 0x1F}}) {
    alts.push_back("\"\\\\u00\" [01] [0-9a-fA-F]");
  } else {
    for (auto [a, b] : controls)
      for (char32_t c = a; c <= b; ++c) {
        const std::string h = hex2(unsigned(c));
        const char low = char(std::tolower(h[1]));
        alts.push_back(gbnf_literal("\\u00" + h.substr(0, 1)) +
                       (low == h[1] ? " \"" + std::string(1, low) + "\"" : std::string(" [") + low + h[1] + "]"));
      }
  }
  if (alts.empty()) return "[^\\x00-\\U0010FFFF]";  // matches nothing
  std::string out = "( " + alts[0];
  for (size_t i = 1; i < alts.size(); ++i) out += " | " + alts[i];
  return out + " )";
}

std::string count_suffix(int64_t min, int64_t max) {  // max < 0: unbounded
  if (max < 0) return min == 0 ? "*" : min == 1 ? "+" : "{" + std::to_string(min) + ",}";
  if (min == max) return "{" + std::to_string(min) + "}";
  return "{" + std::to_string(min) + "," + std::to_string(max) + "}";
}

}  // namespace grammar_detail

namespace {

using grammar_detail::count_suffix;
using grammar_detail::json_char_set;
using grammar_detail::json_pattern_to_gbnf;

std::string pointer_token(const std::string& key) {
  std::string out;
  for (char c : key) out += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
  return out;
}

class SchemaCompiler {
 public:
  explicit SchemaCompiler(const Json& root) : root_(root) {
    names_.insert("root");
    for (const Primitive& p : primitives()) names_.insert(p.name);
  }

  std::string compile() {
    if (json_depth(root_) > kMaxSchemaDepth) fail("", "the schema nests deeper than ", kMaxSchemaDepth, " levels");
    const std::string body = visit(root_, "", "root");
    std::string out = "root ::= " + primitive("space") + " " + body + "\n";
    for (const auto& [name, rule] : rules_) out += name + " ::= " + rule + "\n";
    for (const Primitive& p : primitives())
      if (used_primitives_.count(p.name)) out += std::string(p.name) + " ::= " + p.body + "\n";
    return out;
  }

 private:
  template <typename... Args>
  [[noreturn]] void fail(const std::string& ptr, const Args&... args) const {
    throw_error(ErrorCode::kInvalidArgument, "JSON schema at #", ptr, ": ", args...);
  }

  // How deep v nests (a scalar: 1), found without recursion: dump() and copies recurse.
  static int json_depth(const Json& v) {
    int deepest = 0;
    std::vector<std::pair<const Json*, int>> todo = {{&v, 1}};
    while (!todo.empty() && deepest <= kMaxSchemaDepth) {
      const auto [at, depth] = todo.back();
      todo.pop_back();
      deepest = std::max(deepest, depth);
      if (at->is_structured())
        for (const Json& child : *at) todo.push_back({&child, depth + 1});
    }
    return deepest;
  }

  std::string primitive(const std::string& name) {
    if (used_primitives_.insert(name).second)
      for (const Primitive& p : primitives())
        if (name == p.name)
          for (const char* use : p.uses) primitive(use);
    return name;
  }

  std::string unique_name(const std::string& hint) {
    std::string base;
    for (char c : hint) {
      if (base.size() >= kMaxRuleName) break;
      const char k = std::isalnum(uint8_t(c)) ? c : '-';
      if (k != '-' || base.empty() || base.back() != '-') base += k;
    }
    if (base.empty()) base = "r";
    // Suffixes below next are taken (names are never given back): many hints alike stay linear.
    int& next = next_suffix_[base];
    std::string name = next == 0 ? base : base + "-" + std::to_string(next);
    while (!names_.insert(name).second) name = base + "-" + std::to_string(++next);
    ++next;
    return name;
  }

  std::string add_rule(const std::string& hint, const std::string& body) {
    const std::string name = unique_name(hint);
    rules_.emplace_back(name, body);
    return name;
  }

  // A rule's name for schema s (the body itself when it is already a single name).
  std::string rule_for(const Json& s, const std::string& ptr, const std::string& hint) {
    const std::string body = visit(s, ptr, hint);
    if (std::all_of(body.begin(), body.end(), [](char c) { return std::isalnum(uint8_t(c)) || c == '-'; }))
      return body;
    return add_rule(hint, body);
  }

  static bool is_true(const Json& s) { return s.is_boolean() && s.get<bool>(); }

  int64_t count(const Json& s, const std::string& ptr, const char* key, int64_t fallback) const {
    if (!s.contains(key)) return fallback;
    const Json& v = s[key];
    if (!v.is_number_integer() && !(v.is_number_float() && v.get<double>() == std::floor(v.get<double>())))
      fail(ptr + "/" + key, "expected a non-negative integer, found ", v.dump());
    const double d = v.get<double>();
    if (d < 0) fail(ptr + "/" + key, "expected a non-negative integer, found ", v.dump());
    if (d > kGbnfMaxRepeat) fail(ptr + "/" + key, key, " ", v.dump(), " is past the supported ", kGbnfMaxRepeat);
    return int64_t(d);
  }

  struct DepthGuard {
    int& depth;
    ~DepthGuard() { --depth; }
  };

  std::string visit(const Json& s, const std::string& ptr, const std::string& hint) {
    ++depth_;
    const DepthGuard guard{depth_};
    if (depth_ > kMaxSchemaDepth) fail(ptr, "schemas nest deeper than ", kMaxSchemaDepth, " levels ($ref included)");
    if (s.is_boolean()) {
      if (s.get<bool>()) return primitive("value");
      fail(ptr, "the schema false matches nothing");
    }
    if (!s.is_object()) fail(ptr, "a schema must be an object or a boolean, found ", s.dump());
    for (const auto& [key, v] : s.items())
      if (kRefused.count(key) && !(key == "uniqueItems" && v.is_boolean() && !v.get<bool>()))
        fail(ptr + "/" + key, "keyword '", key, "' is not supported");
    std::string expr = visit_combinators(s, ptr, hint);
    if (s.contains("nullable")) {
      if (!s["nullable"].is_boolean()) fail(ptr + "/nullable", "expected a boolean");
      if (s["nullable"].get<bool>()) expr = "( " + expr + " | " + primitive("null") + " )";
    }
    return expr;
  }

  // Combinators stand alone: constraints beside them would have to hold at once.
  void check_alone(const Json& s, const std::string& ptr, const char* combinator) const {
    for (const auto& [key, v] : s.items())
      if ((kAssertions.count(key) || key == "$ref" || key == "anyOf" || key == "oneOf" || key == "allOf") &&
          key != combinator)
        fail(ptr, "'", key, "' beside '", combinator, "' is not supported (move it into the ", combinator, ")");
  }

  std::string visit_combinators(const Json& s, const std::string& ptr, const std::string& hint) {
    if (s.contains("$ref")) {
      check_alone(s, ptr, "$ref");
      return ref_rule(s["$ref"], ptr + "/$ref");
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      check_alone(s, ptr, key);
      const Json& list = s[key];
      if (!list.is_array() || list.empty()) fail(ptr + "/" + key, "expected a non-empty array of schemas");
      std::string out = "( ";
      for (size_t i = 0; i < list.size(); ++i)
        out += (i ? " | " : "") +
               rule_for(list[i], ptr + "/" + key + "/" + std::to_string(i), hint + "-" + std::to_string(i));
      return out + " )";
    }
    if (s.contains("allOf")) {
      check_alone(s, ptr, "allOf");
      const Json& list = s["allOf"];
      if (!list.is_array() || list.size() != 1)
        fail(ptr + "/allOf", "only an allOf of exactly one schema is supported");
      return visit(list[0], ptr + "/allOf/0", hint);
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const Json& t = s["type"];
      if (t.is_string()) types.push_back(t.get<std::string>());
      else if (t.is_array() && !t.empty())
        for (const Json& e : t) {
          if (!e.is_string()) fail(ptr + "/type", "expected type names, found ", e.dump());
          types.push_back(e.get<std::string>());
        }
      else fail(ptr + "/type", "expected a type name or a non-empty array of them, found ", t.dump());
      for (const std::string& type : types)
        if (type != "null" && type != "boolean" && type != "integer" && type != "number" && type != "string" &&
            type != "array" && type != "object")
          fail(ptr + "/type", "unknown type '", type, "'");
    }
    if (s.contains("const") || s.contains("enum")) return literals(s, ptr, types);
    if (types.empty()) {
      auto any = [&](std::initializer_list<const char*> keys) {
        return std::any_of(keys.begin(), keys.end(), [&](const char* k) { return s.contains(k); });
      };
      const bool known_format = s.contains("format") && s["format"].is_string() &&
                                format_rule(s["format"].get<std::string>()) != nullptr;
      if (any({"properties", "additionalProperties", "required", "minProperties", "maxProperties"}))
        types = {"object"};
      else if (any({"items", "prefixItems", "additionalItems", "minItems", "maxItems"})) types = {"array"};
      else if (any({"pattern", "minLength", "maxLength"}) || known_format) types = {"string"};
      else if (any({"multipleOf"})) types = {"number"};
      else return primitive("value");
    }
    if (types.size() == 1) return typed(s, types[0], ptr, hint);
    std::string out = "( ";
    for (size_t i = 0; i < types.size(); ++i)
      out += (i ? " | " : "") + rule_for_typed(s, types[i], ptr, hint + "-" + types[i]);
    return out + " )";
  }

  std::string rule_for_typed(const Json& s, const std::string& type, const std::string& ptr, const std::string& hint) {
    const std::string body = typed(s, type, ptr, hint);
    if (std::all_of(body.begin(), body.end(), [](char c) { return std::isalnum(uint8_t(c)) || c == '-'; }))
      return body;
    return add_rule(hint, body);
  }

  static bool has_type(const Json& v, const std::string& type) {
    if (type == "null") return v.is_null();
    if (type == "boolean") return v.is_boolean();
    if (type == "integer")
      return v.is_number_integer() || (v.is_number_float() && v.get<double>() == std::floor(v.get<double>()));
    if (type == "number") return v.is_number();
    if (type == "string") return v.is_string();
    if (type == "array") return v.is_array();
    return v.is_object();
  }

  std::string literals(const Json& s, const std::string& ptr, const std::vector<std::string>& types) {
    const bool is_const = s.contains("const");
    const std::string where = ptr + (is_const ? "/const" : "/enum");
    std::vector<Json> values;
    if (is_const) {
      values.push_back(s["const"]);
    } else {
      if (!s["enum"].is_array() || s["enum"].empty()) fail(where, "expected a non-empty array");
      values.assign(s["enum"].begin(), s["enum"].end());
    }
    std::string out;
    int kept = 0;
    for (const Json& v : values) {
      auto fits = [&](const std::string& t) { return has_type(v, t); };
      if (!types.empty() && std::none_of(types.begin(), types.end(), fits))
        continue;
      std::string text;
      try {
        text = v.dump(-1, ' ', false, Json::error_handler_t::strict);
      } catch (const nlohmann::json::exception& e) {
        fail(where, "a value that is not valid UTF-8: ", e.what());
      }
      out += (kept++ ? " | " : "") + gbnf_literal(text);
    }
    if (kept == 0) fail(where, "no value has the schema's type");
    return "( " + out + " )";
  }

  std::string ref_rule(const Json& ref, const std::string& ptr) {
    if (!ref.is_string()) fail(ptr, "expected a string");
    const std::string r = ref.get<std::string>();
    if (r.empty() || r[0] != '#') fail(ptr, "only local references (\"#/...\") are supported, found \"", r, "\"");
    const std::string pointer = r.substr(1);
    if (auto it = refs_.find(pointer); it != refs_.end()) return it->second;
    const Json* target = nullptr;
    try {
      target = &root_.at(Json::json_pointer(pointer));
    } catch (const nlohmann::json::exception&) {
      fail(ptr, "\"", r, "\" does not resolve in the schema");
    }
    const size_t slash = pointer.rfind('/');
    const std::string name = unique_name(pointer.empty() ? "root-ref" : pointer.substr(slash + 1));
    refs_[pointer] = name;
    const size_t index = rules_.size();
    rules_.emplace_back(name, "");
    const std::string body = visit(*target, pointer, name);
    rules_[index].second = body;
    return name;
  }

  const char* format_rule(const std::string& format) {
    if (format == "date") return "date-string";
    if (format == "time") return "time-string";
    if (format == "date-time") return "date-time-string";
    if (format == "uuid") return "uuid-string";
    return nullptr;
  }

  std::string typed(const Json& s, const std::string& type, const std::string& ptr, const std::string& hint) {
    for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
      if (s.contains(key) && !s[key].is_number() &&
          !(s[key].is_boolean() && std::string(key).rfind("exclusive", 0) == 0))  // draft 4
        fail(ptr + "/" + key, "expected a number, found ", s[key].dump());
    if (type == "null") return primitive("null");
    if (type == "boolean") return primitive("boolean");
    if (type == "number" || type == "integer") {
      if (s.contains("multipleOf"))
        return automaton_expr(grammar_detail::multiple_of_automaton(s, ptr, type == "integer"), hint + "-mult");
      // Bounded: the values within; else the number or integer rule.
      std::optional<std::string> range = type == "number" ? grammar_detail::number_range_gbnf(s, ptr)
                                                          : grammar_detail::integer_range_gbnf(s, ptr);
      return range ? *range : primitive(type);
    }
    if (type == "string") return string_expr(s, ptr);
    if (type == "array") return array_expr(s, ptr, hint);
    return object_expr(s, ptr, hint);
  }

  // An automaton's states as rules, one per state but the start, whose alternatives are
  // returned; the moves of a state into one other are one character class, and a move into a
  // state with none ends there.
  std::string automaton_expr(const grammar_detail::TextAutomaton& a, const std::string& hint) {
    std::vector<std::string> names(a.states.size());
    for (size_t i = 1; i < a.states.size(); ++i)
      if (!a.states[i].moves.empty()) names[i] = unique_name(hint);
    auto body = [&](const grammar_detail::TextAutomaton::State& state) {
      std::vector<std::pair<int, std::string>> groups;  // target, characters
      for (const auto& move : state.moves) {
        const char c = move.c;
        const int to = move.to;  // a plain local: clang's lambdas do not capture bindings
        auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == to; });
        if (it == groups.end()) groups.push_back({to, std::string(1, c)});
        else it->second += c;
      }
      std::string out;
      for (const auto& [to, chars] : groups) {
        CpRanges set;
        for (char c : chars) set.push_back({char32_t(c), char32_t(c)});
        out += (out.empty() ? "" : " | ") + (chars.size() == 1 ? gbnf_literal(chars) : gbnf_class(cp_normalize(set))) +
               (names[size_t(to)].empty() ? "" : " " + names[size_t(to)]);
      }
      if (state.accepts) out += out.empty() ? "\"\"" : " | \"\"";
      return out;
    };
    for (size_t i = 1; i < a.states.size(); ++i)
      if (!names[i].empty()) rules_.emplace_back(names[i], body(a.states[i]));
    return "( " + body(a.states[0]) + " )";
  }

  std::string string_expr(const Json& s, const std::string& ptr) {
    const int64_t min = count(s, ptr, "minLength", 0);
    const int64_t max = count(s, ptr, "maxLength", -1);
    if (max >= 0 && max < min) fail(ptr, "maxLength ", max, " is below minLength ", min);
    const bool lengths = s.contains("minLength") || s.contains("maxLength");
    if (s.contains("format")) {
      if (!s["format"].is_string()) fail(ptr + "/format", "expected a string");
      if (const char* rule = format_rule(s["format"].get<std::string>())) {
        if (lengths || s.contains("pattern"))
          fail(ptr, "format '", s["format"].get<std::string>(), "' together with a length or pattern is not supported");
        return primitive(rule);
      }
    }
    const std::string quote = gbnf_literal("\"");
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) fail(ptr + "/pattern", "expected a string");
      if (lengths) fail(ptr, "a pattern together with minLength/maxLength is not supported");
      primitive("char");
      const std::string body = json_pattern_to_gbnf(s["pattern"].get<std::string>(), "#" + ptr + "/pattern");
      return quote + " " + body + " " + quote;
    }
    if (!lengths) return primitive("string");
    return quote + " " + primitive("char") + count_suffix(min, max) + " " + quote;
  }

  std::string array_expr(const Json& s, const std::string& ptr, const std::string& hint) {
    const int64_t min = count(s, ptr, "minItems", 0);
    const int64_t max = count(s, ptr, "maxItems", -1);
    if (max >= 0 && max < min) fail(ptr, "maxItems ", max, " is below minItems ", min);
    const Json* prefix = nullptr;
    const Json* rest = nullptr;
    std::string prefix_ptr, rest_ptr;
    if (s.contains("prefixItems")) {
      prefix = &s["prefixItems"];
      prefix_ptr = ptr + "/prefixItems";
      if (s.contains("items")) rest = &s["items"], rest_ptr = ptr + "/items";
    } else if (s.contains("items") && s["items"].is_array()) {
      prefix = &s["items"];
      prefix_ptr = ptr + "/items";
      if (s.contains("additionalItems")) rest = &s["additionalItems"], rest_ptr = ptr + "/additionalItems";
    } else if (s.contains("items")) {
      rest = &s["items"];
      rest_ptr = ptr + "/items";
    }
    if (prefix && !prefix->is_array()) fail(prefix_ptr, "expected an array of schemas");
    if (prefix && prefix->size() > kMaxPrefixItems)
      fail(prefix_ptr, prefix->size(), " items are past the supported ", kMaxPrefixItems);
    const int64_t k = prefix ? int64_t(prefix->size()) : 0;
    const bool more = !(rest && rest->is_boolean() && !rest->get<bool>()) && (max < 0 || max > k);
    if (!more && min > k) fail(ptr, "minItems ", min, " needs more items than the schema allows");
    const std::string space = primitive("space");
    const std::string comma = space + " " + gbnf_literal(",") + " " + space + " ";
    std::string items;  // one item or more ("" when none may come): the array less its brackets
    if (more) {
      const std::string item = rest ? rule_for(*rest, rest_ptr, hint + "-item") : primitive("value");
      const int64_t rest_min = std::max<int64_t>(0, min - k), rest_max = max < 0 ? -1 : max - k;
      if (k > 0) {
        items = "( " + comma + item + " )" + count_suffix(rest_min, rest_max);
      } else {
        items = item + " ( " + comma + item + " )" +
                count_suffix(std::max<int64_t>(0, rest_min - 1), rest_max < 0 ? -1 : rest_max - 1);
      }
    }
    // Prefix item i follows i items; from minItems on the array may stop before it.
    for (int64_t i = k - 1; i >= 0; --i) {
      if (max >= 0 && i >= max) continue;
      const std::string item =
          rule_for((*prefix)[size_t(i)], prefix_ptr + "/" + std::to_string(i), hint + "-" + std::to_string(i));
      items = (i > 0 ? comma : "") + item + (items.empty() ? "" : " " + items);
      if (i > 0 && i >= min) items = "( " + items + " )?";
    }
    const std::string open = gbnf_literal("[") + " " + space + " ", close = gbnf_literal("]");
    if (items.empty()) return open + close;
    if (min == 0) return open + "( " + items + " " + space + " )? " + close;
    return open + items + " " + space + " " + close;
  }

  struct Property {
    std::string key;
    const Json* schema;
    bool required;
    std::string ptr;
  };

  std::string object_expr(const Json& s, const std::string& ptr, const std::string& hint) {
    static const Json kAny = true;
    std::vector<Property> props;
    std::set<std::string> required;
    if (s.contains("required")) {
      const Json& r = s["required"];
      if (!r.is_array()) fail(ptr + "/required", "expected an array of property names");
      if (r.size() > kMaxProperties)
        fail(ptr + "/required", r.size(), " names are past the supported ", kMaxProperties);
      for (const Json& k : r) {
        if (!k.is_string()) fail(ptr + "/required", "expected property names, found ", k.dump());
        required.insert(k.get<std::string>());
      }
    }
    if (s.contains("properties")) {
      const Json& p = s["properties"];
      if (!p.is_object()) fail(ptr + "/properties", "expected an object of schemas");
      if (p.size() > kMaxProperties)
        fail(ptr + "/properties", p.size(), " properties are past the supported ", kMaxProperties);
      for (const auto& [key, schema] : p.items()) {
        const bool req = required.count(key) > 0;
        const std::string where = ptr + "/properties/" + pointer_token(key);
        if (schema.is_boolean() && !schema.get<bool>()) {
          if (req) fail(where, "a required property whose schema is false");
          continue;  // may not appear
        }
        props.push_back({key, &schema, req, where});
      }
    }
    for (const Json& k : s.value("required", Json::array())) {
      const std::string key = k.get<std::string>();
      const bool declared = std::any_of(props.begin(), props.end(), [&](const Property& p) { return p.key == key; });
      if (!declared && !(s.contains("properties") && s["properties"].contains(key)))
        props.push_back({key, &kAny, true, ptr + "/required"});
    }
    if (props.size() > kMaxProperties)
      fail(ptr, props.size(), " properties (required ones included) are past the supported ", kMaxProperties);
    const Json* extra = nullptr;  // the schema of keys beyond the properties, if any may come
    if (s.contains("additionalProperties")) {
      const Json& a = s["additionalProperties"];
      if (!a.is_boolean() && !a.is_object()) fail(ptr + "/additionalProperties", "expected a boolean or a schema");
      if (!(a.is_boolean() && !a.get<bool>())) extra = &a;
    } else if (props.empty()) {
      extra = &kAny;
    }
    // minProperties / maxProperties: the required properties always come, so what is counted is
    // the optional ones and the extra keys: from `need` up to `room` of them (room < 0: any).
    const size_t n = props.size();
    const int64_t required_count =
        std::count_if(props.begin(), props.end(), [](const Property& p) { return p.required; });
    const int64_t optional_count = int64_t(n) - required_count;
    const int64_t min_props = count(s, ptr, "minProperties", 0), max_props = count(s, ptr, "maxProperties", -1);
    if (max_props >= 0 && max_props < min_props)
      fail(ptr, "maxProperties ", max_props, " is below minProperties ", min_props);
    if (max_props >= 0 && max_props < required_count)
      fail(ptr, "maxProperties ", max_props, " is below the ", required_count, " required properties");
    if (!extra && min_props > int64_t(n))
      fail(ptr, "minProperties ", min_props, " is above the ", n, " properties the object may have",
           s.contains("additionalProperties") ? "" : " (no additionalProperties beside properties: no other keys)");
    const int64_t need = std::max<int64_t>(0, min_props - required_count);
    const int64_t room = max_props < 0 || (!extra && max_props >= int64_t(n)) ? -1 : max_props - required_count;
    // The optional members so far, k, as a state: without `room`, counts past `need` are alike.
    auto clamp = [&](int64_t k) { return room >= 0 ? k : std::min(k, need); };
    const int64_t counts = std::min(room >= 0 ? room : need, optional_count) + 1;
    if ((optional_count + 1) * counts > int64_t(kMaxCountedStates))
      fail(ptr, "minProperties/maxProperties over ", optional_count, " optional properties take ",
           (optional_count + 1) * counts, " grammar states, past the supported ", kMaxCountedStates);
    if (props.empty() && extra && is_true(*extra) && need == 0 && room < 0) return primitive("object");

    const std::string space = primitive("space");
    const std::string comma = space + " " + gbnf_literal(",") + " " + space + " ";
    const std::string colon = space + " " + gbnf_literal(":") + " " + space + " ";
    std::vector<std::string> kv;
    for (const Property& p : props) {
      const std::string value = rule_for(*p.schema, p.ptr, hint + "-" + p.key);
      std::string key_text;
      try {
        key_text = Json(p.key).dump(-1, ' ', false, Json::error_handler_t::strict);
      } catch (const nlohmann::json::exception& e) {
        fail(p.ptr, "a property name that is not valid UTF-8");
      }
      kv.push_back(add_rule(hint + "-" + p.key + "-kv", gbnf_literal(key_text) + " " + colon + value));
    }
    std::string extra_kv;
    if (extra) {
      const std::string value = rule_for(*extra, ptr + "/additionalProperties", hint + "-additional");
      extra_kv = add_rule(hint + "-additional-kv", other_key(props) + " " + colon + value);
    }
    std::vector<int64_t> optional_from(n + 1, 0);  // optional properties from i on
    for (size_t i = n; i-- > 0;) optional_from[i] = optional_from[i + 1] + (props[i].required ? 0 : 1);
    // Whether the members from property i on, after k optional ones, can end within the counts.
    auto can_end = [&](size_t i, int64_t k) {
      return (room < 0 || k <= room) && (extra || k + optional_from[i] >= need);
    };
    // first(i): one member or more from property i on, none before ("" when none may come);
    // next(i, k): the members from property i on after some, k of them optional (can_end(i, k)).
    // Optional properties make rules (made when first asked for), required ones inline text.
    std::vector<std::string> first_memo(n + 1);
    std::map<std::pair<size_t, int64_t>, std::string> next_memo;
    auto join = [](const std::string& a, const std::string& b) { return b.empty() ? a : a + " " + b; };
    std::function<std::string(size_t)> first;
    std::function<std::string(size_t, int64_t)> next;
    next = [&](size_t i, int64_t k) -> std::string {
      if (i == n) {
        const int64_t hi = room < 0 ? -1 : room - k;
        if (!extra || hi == 0) return "";
        return "( " + comma + extra_kv + " )" + count_suffix(std::max<int64_t>(0, need - k), hi);
      }
      if (props[i].required) return comma + join(kv[i], next(i + 1, k));
      if (auto it = next_memo.find({i, k}); it != next_memo.end()) return it->second;
      const bool here = can_end(i + 1, k + 1), skip = can_end(i + 1, k);
      std::string out = here ? comma + join(kv[i], next(i + 1, clamp(k + 1))) : next(i + 1, k);
      if (here && skip) {
        const std::string rest = next(i + 1, k);
        out = add_rule(hint + "-after-" + props[i].key, out + " | " + (rest.empty() ? "\"\"" : rest));
      }
      return next_memo[{i, k}] = out;
    };
    first = [&](size_t i) -> std::string {
      if (i == n) return extra && room != 0 ? join(extra_kv, next(n, clamp(1))) : "";
      if (props[i].required) return can_end(i + 1, 0) ? join(kv[i], next(i + 1, 0)) : "";
      if (first_memo[i].empty()) {
        const std::string here = can_end(i + 1, 1) ? join(kv[i], next(i + 1, clamp(1))) : "", rest = first(i + 1);
        first_memo[i] = rest.empty() || here.empty() ? here + rest
                                                     : add_rule(hint + "-from-" + props[i].key, here + " | " + rest);
      }
      return first_memo[i];
    };
    const std::string open = gbnf_literal("{") + " " + space + " ", close = gbnf_literal("}");
    const std::string members = first(0);
    if (members.empty()) return open + close;
    if (required_count == 0 && min_props == 0) return open + "( " + members + " " + space + " )? " + close;
    return open + members + " " + space + " " + close;
  }

  // A key that is none of the properties' (as written without escapes): a trie of them, where
  // each node may end (unless a property ends there), go on along the trie, or leave it.
  std::string other_key(const std::vector<Property>& props) {
    const std::string quote = gbnf_literal("\"");
    const std::string ch = primitive("char");
    std::vector<std::vector<char32_t>> keys;
    for (const Property& p : props) {
      if (tok::utf8_find_invalid(p.key) != std::string::npos) fail(p.ptr, "a property name that is not valid UTF-8");
      std::vector<char32_t> cps = tok::utf8_to_cps(p.key);
      if (std::any_of(cps.begin(), cps.end(), [](char32_t c) { return c < 0x20 || c == '"' || c == '\\'; }))
        return primitive("string");  // such keys are written escaped: no exclusion
      keys.push_back(std::move(cps));
    }
    for (size_t i = 0; i < keys.size(); ++i)  // the trie below recurses along each key
      if (keys[i].size() > kMaxExcludedKey)
        fail(props[i].ptr, "a property name longer than ", kMaxExcludedKey,
             " characters beside additionalProperties is not supported");
    std::sort(keys.begin(), keys.end());
    std::function<std::string(size_t, size_t, size_t)> node = [&](size_t lo, size_t hi, size_t depth) {
      std::vector<std::string> alts;
      CpRanges taken;
      bool ends = false;
      for (size_t i = lo; i < hi;) {
        if (keys[i].size() == depth) {
          ends = true;
          ++i;
          continue;
        }
        const char32_t c = keys[i][depth];
        size_t j = i;
        while (j < hi && keys[j].size() > depth && keys[j][depth] == c) ++j;
        alts.push_back(gbnf_class({{c, c}}) + " " + node(i, j, depth + 1));
        taken.push_back({c, c});
        i = j;
      }
      if (!ends) alts.insert(alts.begin(), "\"\"");
      CpRanges other = cp_complement(cp_normalize(taken));
      alts.push_back(json_char_set(other) + " " + ch + "*");
      std::string out = "( " + alts[0];
      for (size_t i = 1; i < alts.size(); ++i) out += " | " + alts[i];
      return out + " )";
    };
    return quote + " " + node(0, keys.size(), 0) + " " + quote;
  }

  const Json& root_;
  std::vector<std::pair<std::string, std::string>> rules_;
  std::unordered_set<std::string> names_;
  std::unordered_map<std::string, std::string> refs_;
  std::unordered_map<std::string, int> next_suffix_;  // unique_name's next suffix per base
  std::set<std::string> used_primitives_;
  int depth_ = 0;  // visit() calls open
};

}  // namespace

std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema) { return SchemaCompiler(schema).compile(); }

std::shared_ptr<const Grammar> grammar_from_json_schema(const nlohmann::ordered_json& schema) {
  const std::string text = json_schema_to_gbnf(schema);
  try {
    return grammar_from_gbnf(text);
  } catch (const Error& e) {
    throw_error(ErrorCode::kInvalidArgument, "JSON schema: its grammar is invalid: ", e.what());
  }
}

}  // namespace kiln
