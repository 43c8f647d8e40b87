// Error handling in two tiers (STYLE.md): what a user can cause is a kiln::Error
// (thrown, caught at the API boundary) or an Expected<T>; a broken internal invariant
// is KILN_CHECK, which aborts with file and line. Tested in tests/core/status_test.cpp.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>

namespace kiln {

enum class ErrorCode {
  kInvalidArgument,  // a bad request, option or shape from the caller
  kInvalidFile,      // a malformed, truncated or foreign file
  kNotFound,         // a missing file, tensor or key
  kUnsupported,      // a valid input kiln does not handle (yet)
  kOutOfRange,       // a shape outside a profile, an index past the end
  kOutOfMemory,      // a budget (host, device, KV blocks) is exhausted
  kIo,               // the OS refused (open, read, mmap)
  kCancelled,        // the caller withdrew the request (e.g. its client hung up)
  kInternal,
};

const char* error_code_name(ErrorCode code);

// The one exception type kiln throws for user-caused errors.
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, std::string message)
      : std::runtime_error(std::move(message)), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

namespace detail {
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

// Builds a message from any streamable parts: kiln::Error(kInvalidFile, str_cat(...)).
template <typename... Args>
std::string str_cat(const Args&... args) {
  return detail::str_cat(args...);
}

template <typename... Args>
[[noreturn]] void throw_error(ErrorCode code, const Args&... args) {
  throw Error(code, detail::str_cat(args...));
}

// A value or the error that prevented it; for paths where exceptions are unwelcome
// (the step loop, the server's request handlers).
template <typename T>
class Expected {
 public:
  Expected(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Expected(Error error) : v_(std::move(error)) {}  // NOLINT
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() {
    if (!ok()) throw std::get<1>(v_);
    return std::get<0>(v_);
  }
  const T& value() const {
    if (!ok()) throw std::get<1>(v_);
    return std::get<0>(v_);
  }
  const Error& error() const { return std::get<1>(v_); }
  T* operator->() { return &value(); }
  T& operator*() { return value(); }

 private:
  std::variant<T, Error> v_;
};

// Runs f and turns a thrown kiln::Error into an Expected.
template <typename F>
auto capture(F&& f) -> Expected<decltype(f())> {
  try {
    return f();
  } catch (const Error& e) {
    return e;
  }
}

}  // namespace kiln

#define KILN_CHECK(cond, ...)                                                   \
  do {                                                                          \
    if (!(cond)) [[unlikely]] {                                                 \
      std::fprintf(stderr, "%s:%d: KILN_CHECK(%s) failed: %s\n", __FILE__,      \
                   __LINE__, #cond, ::kiln::str_cat("" __VA_OPT__(, ) __VA_ARGS__).c_str()); \
      std::abort();                                                             \
    }                                                                           \
  } while (0)

#define KILN_THROW_IF(cond, code, ...)                                          \
  do {                                                                          \
    if (cond) [[unlikely]] ::kiln::throw_error(::kiln::ErrorCode::code, __VA_ARGS__); \
  } while (0)
