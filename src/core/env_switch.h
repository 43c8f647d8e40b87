// On/off switches and integer counts read from the environment (KILN_CUDA_FP8_FUSE,
// KILN_CUDA_GEMM_TUNE_M, KILN_CUDA_QGEMV_CHUNK_ROWS, ...): one parser each, so every switch
// accepts the same values and rejects the rest with the same kind of message. Tested in
// tests/core/env_switch_test.cpp.
#pragma once

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/status.h"

namespace kiln {

// `value` of switch `name`: unset, empty or "1" is on (the default), "0" is off; anything
// else throws kInvalidArgument naming the variable, the value and what each setting does.
inline bool env_switch_value(const char* name, const char* value, const char* on_means, const char* off_means) {
  if (!value || !*value || std::strcmp(value, "1") == 0) return true;
  if (std::strcmp(value, "0") == 0) return false;
  throw_error(ErrorCode::kInvalidArgument, name, "='", value, "' (expected 1, the default: ", on_means,
              ", or 0: ", off_means, ")");
}

// A switch that is off by default: unset, empty or "0" is off, "1" is on; anything else
// throws kInvalidArgument as above.
inline bool env_switch_off_value(const char* name, const char* value, const char* off_means,
                                 const char* on_means) {
  if (!value || !*value || std::strcmp(value, "0") == 0) return false;
  if (std::strcmp(value, "1") == 0) return true;
  throw_error(ErrorCode::kInvalidArgument, name, "='", value,
              "' (expected 0, the default: ", off_means, ", or 1: ", on_means, ")");
}

// A three-way setting: unset, empty or "auto" (the default), "1" or "0".
enum class EnvAuto : uint8_t { kAuto, kOn, kOff };

// `value` of three-way setting `name`; anything else throws kInvalidArgument naming the
// variable, the value and what each setting does.
inline EnvAuto env_auto_value(const char* name, const char* value, const char* auto_means,
                              const char* on_means, const char* off_means) {
  if (!value || !*value || std::strcmp(value, "auto") == 0) return EnvAuto::kAuto;
  if (std::strcmp(value, "1") == 0) return EnvAuto::kOn;
  if (std::strcmp(value, "0") == 0) return EnvAuto::kOff;
  throw_error(ErrorCode::kInvalidArgument, name, "='", value,
              "' (expected auto, the default: ", auto_means, "; 1: ", on_means, "; 0: ", off_means,
              ")");
}

// The three-way setting as the environment sets it now.
inline EnvAuto env_auto(const char* name, const char* auto_means, const char* on_means,
                        const char* off_means) {
  return env_auto_value(name, std::getenv(name), auto_means, on_means, off_means);
}

// `value` of count `name` in [lo, hi]: unset or empty is `def`; anything else that is not
// a decimal integer in the range throws kInvalidArgument naming the variable, the value,
// the range and what the count means.
inline int64_t env_count_value(const char* name, const char* value, int64_t def, int64_t lo,
                               int64_t hi, const char* means) {
  if (!value || !*value) return def;
  int64_t v = 0;
  const char* end = value + std::strlen(value);
  const auto [p, ec] = std::from_chars(value, end, v);
  if (ec != std::errc() || p != end || v < lo || v > hi)
    throw_error(ErrorCode::kInvalidArgument, name, "='", value, "' (expected an integer in [", lo,
                ", ", hi, "]: ", means, "; unset: ", def, ")");
  return v;
}

// The count as the environment sets it now.
inline int64_t env_count(const char* name, int64_t def, int64_t lo, int64_t hi, const char* means) {
  return env_count_value(name, std::getenv(name), def, lo, hi, means);
}

// The switch as the environment sets it now.
inline bool env_switch(const char* name, const char* on_means, const char* off_means) {
  return env_switch_value(name, std::getenv(name), on_means, off_means);
}

}  // namespace kiln
