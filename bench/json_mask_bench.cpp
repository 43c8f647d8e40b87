// Cost of JSON-constrained decoding's mask (runtime/json_constraint.h) per decode step: one
// model's tokenizer vocabulary tried against the acceptor in several document states.
//   json_mask_bench MODEL [REPEATS]   (MODEL: anything `kiln generate -m` loads with a tokenizer)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "core/status.h"
#include "runtime/json_constraint.h"
#include "runtime/model.h"
#include "runtime/model_tokenizer.h"

int main(int argc, char** argv) {
  using namespace kiln;
  if (argc < 2) {
    std::fprintf(stderr, "usage: json_mask_bench MODEL [REPEATS]\n");
    return 2;
  }
  try {
    const int repeats = argc > 2 ? std::max(1, std::atoi(argv[2])) : 50;
    auto model = Model::load(argv[1]);
    auto tokenizer = load_model_tokenizer(*model);
    if (!tokenizer) throw_error(ErrorCode::kInvalidArgument, argv[1], " has no tokenizer");
    std::vector<std::string> pieces(tokenizer->vocab_size());
    for (size_t i = 0; i < pieces.size(); ++i)
      if (!tokenizer->is_special(int32_t(i))) pieces[i] = tokenizer->token_to_piece(int32_t(i));
    std::vector<float> logits(pieces.size());
    JsonTokenMask cached(pieces);
    std::printf("| document so far | tokens allowed | of | ms per mask, every token tried (median of %d) | "
                "ms, the state's set cached (JsonTokenMask) |\n|---|---|---|---|---|\n",
                repeats);
    for (const char* prefix : {"", "{", "{\"ke", "{\"key\": ", "{\"key\": [1, 2", "{\"a\": {\"b\": \"some text"}) {
      JsonAcceptor state;
      state.accept(std::string_view(prefix));
      std::vector<double> ms;
      int64_t allowed = 0;
      for (int r = 0; r < repeats; ++r) {
        std::fill(logits.begin(), logits.end(), 0.0f);
        const auto t0 = std::chrono::steady_clock::now();
        allowed = mask_json_logits(state, pieces, logits);
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
      std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
      const double full = ms[ms.size() / 2];
      cached.apply(state, logits);  // fills the cache
      ms.clear();
      for (int r = 0; r < repeats; ++r) {
        std::fill(logits.begin(), logits.end(), 0.0f);
        const auto t0 = std::chrono::steady_clock::now();
        if (cached.apply(state, logits) != allowed) throw_error(ErrorCode::kInternal, "cached set differs");
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
      std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
      std::printf("| `%s` | %lld | %zu | %.3f | %.3f |\n", prefix, (long long)allowed, pieces.size(), full,
                  ms[ms.size() / 2]);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "json_mask_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
