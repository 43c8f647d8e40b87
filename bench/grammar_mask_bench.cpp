// Cost of grammar-constrained decoding (runtime/grammar.h) per decode step: a JSON Schema
// compiled to a grammar, then one document's tokens replayed as a constrained generation
// would produce them - before each token the mask over the model's whole vocabulary, then
// the token accepted. Twice: cold (a new mask, as the first request with that schema meets
// it) and warm (the same mask, whose cache holds the states it met). Prints a table; with
// --dump DIR also writes the vocabulary and the document's ids for
// bench/grammar_xgrammar_baseline.py, which times xgrammar (vLLM's default backend) on
// the same tokens.
//   grammar_mask_bench MODEL SCHEMA.json DOCUMENT.json [--dump DIR]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "core/status.h"
#include "runtime/grammar.h"
#include "runtime/model.h"
#include "runtime/model_tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

struct Pass {
  double total = 0, median = 0, max = 0;
};

// Masks before every token of `ids` and accepts it; fails if the grammar refuses one.
Pass replay(kiln::GrammarTokenMask& mask, const std::shared_ptr<const kiln::Grammar>& g,
            const kiln::TokenTrie& trie, const std::vector<int32_t>& ids) {
  kiln::GrammarState state(g);
  std::vector<float> logits(trie.vocab_size());
  std::vector<double> ms;
  for (int32_t id : ids) {
    std::fill(logits.begin(), logits.end(), 0.0f);
    const auto t0 = Clock::now();
    mask.apply(state, logits);
    ms.push_back(ms_since(t0));
    if (std::isinf(logits[size_t(id)]) || !state.accept(trie.piece(id)))
      kiln::throw_error(kiln::ErrorCode::kInvalidArgument, "the schema's grammar refuses token ", id, " ('",
                        trie.piece(id), "') of the document");
  }
  Pass p;
  for (double x : ms) p.total += x;
  std::sort(ms.begin(), ms.end());
  p.median = ms[ms.size() / 2];
  p.max = ms.back();
  return p;
}

std::string hex(const std::string& s) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) out += kHex[c >> 4], out += kHex[c & 15];
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kiln;
  if (argc < 4) {
    std::fprintf(stderr, "usage: grammar_mask_bench MODEL SCHEMA.json DOCUMENT.json [--dump DIR]\n");
    return 2;
  }
  try {
    auto model = Model::load(argv[1]);
    auto tokenizer = load_model_tokenizer(*model);
    if (!tokenizer) throw_error(ErrorCode::kInvalidArgument, argv[1], " has no tokenizer");
    const std::string schema_text = read_text_file(argv[2]);
    const auto schema = nlohmann::ordered_json::parse(schema_text);
    // The document as a model would write it: compact JSON of the file's value.
    const std::string doc = nlohmann::ordered_json::parse(read_text_file(argv[3])).dump();
    const std::vector<int32_t> ids = tokenizer->encode(doc, false);

    auto t0 = Clock::now();
    std::vector<std::string> pieces = token_pieces(*tokenizer);
    auto trie = std::make_shared<const TokenTrie>(pieces);
    const double trie_ms = ms_since(t0);
    t0 = Clock::now();
    auto grammar = grammar_from_json_schema(schema);
    const double compile_ms = ms_since(t0);

    GrammarTokenMask mask(grammar, trie);
    const Pass cold = replay(mask, grammar, *trie, ids);
    const Pass warm = replay(mask, grammar, *trie, ids);
    std::printf("vocabulary %zu tokens; document %zu tokens (%zu bytes); vocabulary trie %.1f ms; schema compiled in "
                "%.2f ms; %zu states cached\n\n",
                pieces.size(), ids.size(), doc.size(), trie_ms, compile_ms, mask.cached_states());
    std::printf("| pass | masks total ms | median ms | max ms |\n|---|---|---|---|\n");
    std::printf("| cold (first request with the schema) | %.2f | %.3f | %.2f |\n", cold.total, cold.median, cold.max);
    std::printf("| warm (the states cached) | %.2f | %.3f | %.2f |\n", warm.total, warm.median, warm.max);
    if (argc > 5 && std::string(argv[4]) == "--dump") {
      nlohmann::json vocab = nlohmann::json::array();
      for (int32_t i = 0; i < int32_t(pieces.size()); ++i)
        vocab.push_back(tokenizer->is_special(i) ? nlohmann::json(nullptr) : nlohmann::json(hex(pieces[size_t(i)])));
      std::ofstream(std::string(argv[5]) + "/vocab.json") << vocab.dump();
      std::ofstream(std::string(argv[5]) + "/ids.json") << nlohmann::json(ids).dump();
      std::ofstream(std::string(argv[5]) + "/schema.json") << schema_text;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "grammar_mask_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
