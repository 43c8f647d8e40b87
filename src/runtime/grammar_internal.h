// Declarations shared by the grammar compilers' files (grammar.cpp, grammar_gbnf.cpp,
// json_schema.cpp, json_schema_pattern.cpp); not part of the runtime's interface.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

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

// json_schema_pattern.cpp: a JSON Schema `pattern` -> GBNF for the content of a JSON string
// (what lies between its quotes); errors name `where`, the pattern's JSON pointer.
std::string json_pattern_to_gbnf(std::string_view pattern, std::string where);

}  // namespace kiln::grammar_detail
