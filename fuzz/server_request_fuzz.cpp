// libFuzzer target: the server's request parsers (OpenAI completions, chat, responses,
// embeddings, rerank, KServe v2 infer, tokenize) on arbitrary bytes. Any crash, sanitizer report or exception other
// than server::ApiError (the 4xx path) is a bug.
// Build: see fuzz/CMakeLists.txt, or directly:
//   clang++ -std=c++20 -fsanitize=fuzzer,address,undefined -Isrc fuzz/server_request_fuzz.cpp src/server/protocol.cpp src/server/protocol_responses.cpp
#include <cstddef>
#include <cstdint>
#include <string>

#include "server/protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln::server;
  const std::string body(reinterpret_cast<const char*>(data), size);
  RequestLimits limits;
  Json j;
  try {
    j = parse_json_body(body);
  } catch (const ApiError&) {
    return 0;
  }
  auto guarded = [&](auto&& f) {
    try {
      f();
    } catch (const ApiError& e) {
      if (e.status < 400 || e.status > 499) __builtin_trap();
      (void)error_body(e).dump(-1, ' ', false, Json::error_handler_t::replace);
    }
  };
  guarded([&] { (void)parse_completion(j, false, limits); });
  guarded([&] { (void)parse_completion(j, true, limits); });
  guarded([&] { (void)parse_responses(j, limits); });
  guarded([&] { (void)parse_embeddings(j, limits); });
  guarded([&] { (void)parse_kserve_infer(j, limits); });
  guarded([&] { (void)parse_rerank(j, limits); });
  guarded([&] { (void)parse_tokenize(j, limits); });
  guarded([&] { (void)parse_detokenize(j); });
  return 0;
}
