// Typed reads of a request's JSON fields, each failure an ApiError (400) naming the field:
// what protocol.cpp and protocol_responses.cpp validate requests with. Internal to
// src/server/; tested through the parsers (tests/server/, fuzz/server_request_fuzz.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "server/protocol.h"

namespace kiln::server {

[[noreturn]] void bad_type(const std::string& key, const char* want);
// The field, or null when it is missing or JSON null.
const Json* field(const Json& j, const std::string& key);
double get_number(const Json& j, const std::string& key, double def, double lo, double hi);
int64_t get_int(const Json& j, const std::string& key, int64_t def, int64_t lo, int64_t hi);
bool get_bool(const Json& j, const std::string& key, bool def);
std::string get_string(const Json& j, const std::string& key, bool required);

}  // namespace kiln::server
