// Declarations shared by the grammar compilers' files (grammar.cpp, grammar_gbnf.cpp,
// json_schema.cpp, json_schema_pattern.cpp); not part of the runtime's interface.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/grammar.h"

namespace kiln::grammar_detail {

constexpr char32_t kMaxCodePoint = 0x10FFFF;

// json_schema.cpp: one character of a JSON string's content that is in `set`, as GBNF (the
// plain ones as themselves, '"', '\\' and control characters escaped).
std::string json_char_set(const CpRanges& set);
// json_schema.cpp: one character in `set` as it is (a GBNF class; surrogates left out); ""
// when the set is empty.
std::string raw_char_set(const CpRanges& set);
// json_schema.cpp: the GBNF repetition suffix for min to max times (max < 0: unbounded).
std::string count_suffix(int64_t min, int64_t max);

// json_schema_numbers.cpp: an integer's / a number's minimum, maximum, exclusiveMinimum and
// exclusiveMaximum (draft 6 numbers, or draft 4 booleans beside minimum / maximum) as GBNF for
// exactly the values within them (integers as digit ranges, numbers as decimal ranges written
// without an exponent; an unbounded side stops at 16 integer digits; "-0" is not written);
// nullopt when neither side is bounded. Throws kInvalidArgument ("JSON schema at #<ptr>: ...")
// for bounds that no value meets.
std::optional<std::string> integer_range_gbnf(const nlohmann::ordered_json& schema, const std::string& ptr);
std::optional<std::string> number_range_gbnf(const nlohmann::ordered_json& schema, const std::string& ptr);

// json_schema_numbers.cpp: an integer or a number with `multipleOf` (and the bounds above beside
// it) as an automaton over its text: state 0 starts, a move reads one character ('0'-'9', '.',
// '-'), and every state reaches an accepting one. Values are written without an exponent, with
// at most 16 integer digits, fraction digits past multipleOf's only zeros, and no "-0".
// Throws kInvalidArgument for a multipleOf that is not above 0 or past the supported size
// (multipleOf = m x 10^-d with m <= 1000 and, for numbers, d <= 9; at most 4096 states once
// states of one language are merged), and for bounds that no multiple meets.
struct TextAutomaton {
  struct Move {
    char c;
    int to;
  };
  struct State {
    std::vector<Move> moves;
    bool accepts = false;
  };
  std::vector<State> states;
};
TextAutomaton multiple_of_automaton(const nlohmann::ordered_json& schema, const std::string& ptr, bool integer);

// json_schema_pattern.cpp: a JSON Schema `pattern` -> GBNF for the content of a JSON string
// (what lies between its quotes); errors name `where`, the pattern's JSON pointer.
std::string json_pattern_to_gbnf(std::string_view pattern, std::string where);

}  // namespace kiln::grammar_detail
