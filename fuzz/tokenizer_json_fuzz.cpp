// libFuzzer target: tokenizer.json parsing (Tokenizer::from_hf_json) on arbitrary
// bytes, then a small encode/decode round on whatever loaded. Any crash, sanitizer
// report or exception other than kiln::Error is a bug.
// Build: clang++ -std=c++20 -fsanitize=fuzzer,address,undefined -Isrc \
//   fuzz/tokenizer_json_fuzz.cpp <kiln_tokenizer sources> -lre2 -lutf8proc -lsentencepiece
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  try {
    const auto tok = kiln::tok::Tokenizer::from_hf_json(json);
    const auto ids = tok.encode("Hello, world! 你好 123  \n <s> [CLS]", true);
    (void)tok.decode(ids, false);
    kiln::tok::StreamDecoder stream(tok);
    for (int32_t id : ids) (void)stream.put(id);
    (void)stream.flush();
    for (int32_t id = -1; id < 8; ++id) (void)tok.token_to_piece(id);
  } catch (const kiln::Error&) {
    // Expected for malformed input.
  }
  return 0;
}
