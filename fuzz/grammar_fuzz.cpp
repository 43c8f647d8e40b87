// libFuzzer target: the constrained-decoding grammar compilers (grammar_from_gbnf,
// grammar_from_json_schema on whatever parses as JSON, grammar_from_regex) on arbitrary bytes,
// then a document fed to a GrammarState in chunks and a GrammarTokenMask over a small fixed
// vocabulary. The first byte picks the mode (mod 3: GBNF, JSON schema, regex) and, with the
// second, where the grammar ends and the document begins. Any crash, sanitizer report, hang, runaway memory or
// exception other than kiln::Error is a bug. Seed the corpus with the mode byte, the split
// byte and a grammar, e.g. printf '\0\377root ::= "a"+' > seeds/gbnf.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "runtime/grammar.h"

namespace {

constexpr size_t kMaxInput = 4096;  // keeps each run cheap; the engine's bounds are per byte

// 64 pieces: letters, digits, JSON punctuation, whitespace, multi-byte text, special ("").
std::shared_ptr<const kiln::TokenTrie> vocabulary() {
  static const auto trie = [] {
    std::vector<std::string> pieces = {"",   "{", "}",  "[",  "]", ":", ",", "\"",
                                       "\\", " ", "\n", "\t", "-", "+", ".", "e"};
    for (const char* p : {"true", "false", "null", "\":", "\",\"", "{\"", "\"}", "  ", "\\u", "\\n",
                          "ab", "abc", "ing", "name", "0.5", "12"})
      pieces.push_back(p);
    // Multi-byte characters, loose bytes of them, and a byte UTF-8 never has.
    for (const char* p : {"\xC3\xA9", "\xE4\xBD\xA0", "\xF0\x9F\x98\x80", "\xC3", "\xBF", "\xFF"})
      pieces.push_back(p);
    for (char c = 'a'; pieces.size() < 56; ++c) pieces.push_back(std::string(1, c));
    for (char c = '0'; pieces.size() < 64; ++c) pieces.push_back(std::string(1, c));
    return std::make_shared<const kiln::TokenTrie>(std::move(pieces));
  }();
  return trie;
}

std::shared_ptr<const kiln::Grammar> compile(int mode, std::string_view text) {
  if (mode == 0) return kiln::grammar_from_gbnf(text);
  if (mode == 2) return kiln::grammar_from_regex(text);
  const auto j = nlohmann::ordered_json::parse(text, nullptr, false);
  if (j.is_discarded()) return nullptr;
  return kiln::grammar_from_json_schema(j);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2 || size > kMaxInput) return 0;
  const int mode = data[0] % 3;
  // The grammar takes the first split/255 of the rest (all of it at 255); the document the rest.
  const std::string_view rest(reinterpret_cast<const char*>(data + 2), size - 2);
  const std::string_view text = rest.substr(0, rest.size() * data[1] / 255);
  const std::string_view doc = rest.substr(text.size());
  std::shared_ptr<const kiln::Grammar> grammar;
  try {
    grammar = compile(mode, text);
  } catch (const kiln::Error&) {
    return 0;  // expected for malformed or unsupported input
  }
  if (!grammar) return 0;
  (void)grammar->dump();

  kiln::GrammarTokenMask mask(grammar, vocabulary());
  std::vector<float> logits(vocabulary()->vocab_size() + 3, 0.0f);
  kiln::GrammarState state(grammar);
  (void)mask.apply(state, logits);
  // Three chunks, the mask after each; a refused byte ends the document.
  const size_t cut[4] = {0, doc.size() / 3, doc.size() * 2 / 3, doc.size()};
  for (int k = 0; k < 3; ++k) {
    kiln::GrammarState next = state;
    const bool ok = next.accept(doc.substr(cut[k], cut[k + 1] - cut[k]));
    (void)next.complete();
    (void)next.key();
    if (!ok) break;
    state = std::move(next);
    if (state.can_continue()) (void)mask.apply(state, logits);
  }
  // The mask must agree with trying each piece on a copy of the state (unless it gave up at
  // its work budget, GrammarTokenMask::kMaxMaskWork).
  std::vector<uint64_t> allowed;
  try {
    allowed = mask.allowed(state);
  } catch (const kiln::Error&) {
    return 0;
  }
  for (int32_t id = 0; id < int32_t(vocabulary()->vocab_size()); ++id) {
    const std::string& piece = vocabulary()->piece(id);
    kiln::GrammarState copy = state;
    const bool takes = !piece.empty() && copy.accept(piece);
    if (takes != bool(allowed[size_t(id) / 64] >> (id % 64) & 1)) std::abort();
  }
  return 0;
}
