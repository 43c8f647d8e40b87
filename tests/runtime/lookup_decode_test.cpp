// generate_greedy_lookup (what `kiln generate --lookup K` runs) against plain greedy
// decoding (LlmRunner::generate_greedy) token for token: the golden tiny Llama and, when
// fetched, the real SmolLM2-135M-Instruct, on prompts that repeat text (drafts accepted)
// and that do not, for several K; stop tokens and max_tokens met inside a step of drafts;
// no KV block left behind.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "runtime/model_tokenizer.h"
#include "runtime/ngram_draft.h"

namespace kiln {
namespace {

using Ids = std::vector<int32_t>;

std::string fixture_model(const std::string& name) {
  const char* env = std::getenv("KILN_FIXTURES_DIR");
  return std::string(env ? env : KILN_FIXTURES_DIR) + "/models/" + name;
}

std::string real_model(const std::string& rel) {
  const char* env = std::getenv("KILN_MODELS_DIR");
  return (env ? std::string(env) : std::string(KILN_SOURCE_DIR) + "/.cache/models") + "/" + rel;
}

// Decodes with lookup and checks it against `want`, the callback's tokens and the pool.
LookupDecodeStats expect_lookup_equals(LlmRunner& runner, const Ids& prompt, int32_t max_tokens, const Ids& stops,
                                       int32_t k, const Ids& want, const std::string& what,
                                       int64_t max_step_tokens = 2048) {
  const int32_t free_before = runner.kv().allocator().num_free();
  Ids streamed;
  LookupDecodeOptions opt;
  opt.num_draft = k;
  opt.max_step_tokens = max_step_tokens;
  const LookupDecodeResult got =
      generate_greedy_lookup(runner, prompt, max_tokens, stops, opt, [&](int32_t t) { streamed.push_back(t); });
  EXPECT_EQ(got.tokens, want) << what << ", K " << k;
  EXPECT_EQ(streamed, got.tokens) << what << ", K " << k << ": the callback saw other tokens";
  EXPECT_EQ(runner.kv().allocator().num_free(), free_before) << what << ", K " << k << ": KV blocks leaked";
  const LookupDecodeStats& s = got.stats;
  EXPECT_LE(s.accepted, s.drafted);
  EXPECT_LE(s.drafted, int64_t(k) * s.steps);
  // Every step emits its kept drafts plus one token, but the last may stop early.
  EXPECT_LE(int64_t(got.tokens.size()), 1 + s.steps + s.accepted) << what;
  if (k == 0) {
    EXPECT_EQ(s.drafted, 0);
  }
  std::printf("  %s K %d: %zu tokens in %lld steps (+%lld prefill), drafted %lld, accepted %lld (%.0f%%)\n",
              what.c_str(), k, got.tokens.size(), (long long)s.steps, (long long)s.prefill_steps,
              (long long)s.drafted, (long long)s.accepted, 100 * s.acceptance());
  return s;
}

TEST(LookupDecode, TinyLlamaEqualsGreedy) {
  auto model = Model::load(fixture_model("llama"));
  LlmRunner runner(*model, {.max_total_tokens = 512});
  const int32_t free_start = runner.kv().allocator().num_free();
  Ids repeating;
  for (int rep = 0; rep < 3; ++rep)
    for (int32_t t = 5; t < 17; ++t) repeating.push_back(t * 7 % 500);
  Ids plain;
  for (int32_t t = 0; t < 20; ++t) plain.push_back(3 + t * 13 % 490);
  const int32_t max_tokens = 64;  // within the fixture's 128 positions
  for (const Ids* p : {&repeating, &plain}) {
    const Ids& prompt = *p;
    const std::string what = p == &repeating ? "tiny llama, repeating prompt" : "tiny llama, plain prompt";
    const Ids want = runner.generate_greedy({prompt}, max_tokens)[0];
    ASSERT_EQ(int32_t(want.size()), max_tokens);
    int64_t accepted = 0;
    for (int32_t k : {0, 1, 2, 4, 8})
      accepted += expect_lookup_equals(runner, prompt, max_tokens, {}, k, want, what, /*max_step_tokens=*/7).accepted;
    // A random tiny model settles into loops, which the drafts then follow.
    EXPECT_GT(accepted, 0) << what;

    // A stop token and max_tokens met in the middle of a step of drafts.
    const Ids want_stop = runner.generate_greedy({prompt}, max_tokens, want[40])[0];
    for (int32_t k : {1, 3, 8}) {
      expect_lookup_equals(runner, prompt, max_tokens, {want[40]}, k, want_stop, what + ", stop " + std::to_string(want[40]));
      for (int32_t n : {1, 2, 5, 33})
        expect_lookup_equals(runner, prompt, n, {}, k, Ids(want.begin(), want.begin() + n),
                             what + ", max_tokens " + std::to_string(n));
    }
  }
  EXPECT_EQ(runner.kv().allocator().num_free(), free_start);
}

TEST(LookupDecode, RejectsBadArguments) {
  auto model = Model::load(fixture_model("llama"));
  LlmRunner runner(*model, {.max_total_tokens = 256});
  LookupDecodeOptions opt;
  EXPECT_THROW(generate_greedy_lookup(runner, Ids{}, 4, {}, opt), Error);
  opt.num_draft = -1;
  EXPECT_THROW(generate_greedy_lookup(runner, Ids{1, 2}, 4, {}, opt), Error);
  opt.num_draft = 2;
  opt.max_n = 0;
  EXPECT_THROW(generate_greedy_lookup(runner, Ids{1, 2}, 4, {}, opt), Error);
  opt.max_n = 3;
  EXPECT_TRUE(generate_greedy_lookup(runner, Ids{1, 2}, 0, {}, opt).tokens.empty());
  EXPECT_EQ(runner.kv().allocator().num_free(), runner.kv().allocator().num_blocks());
}

TEST(LookupDecode, SmolLM2EqualsGreedy) {
  const std::string path = real_model("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
  if (!std::filesystem::exists(path))
    GTEST_SKIP() << "real model not found at " << path << " (run .ci/fetch_models.sh)";
  auto model = Model::load(path);
  auto tokenizer = load_model_tokenizer(*model);
  ASSERT_TRUE(tokenizer);
  const std::string paragraph =
      "The quick brown fox jumps over the lazy dog. The dog, annoyed, gets up and chases the fox "
      "around the old red barn until both of them are too tired to run.";
  const Ids repeating = tokenizer->encode("Here is a paragraph:\n" + paragraph + "\nThe same paragraph again:\n");
  const Ids plain = tokenizer->encode("Once upon a time, in a small village by the sea, there lived");
  const int32_t eos = int32_t(model->info().eos_token_id);
  const int32_t max_tokens = 48;
  LlmRunner runner(*model, {.max_total_tokens = 1024});
  for (const Ids* p : {&repeating, &plain}) {
    const Ids& prompt = *p;
    const std::string what = p == &repeating ? "smollm2, repeating prompt" : "smollm2, plain prompt";
    const Ids want = runner.generate_greedy({prompt}, max_tokens, eos)[0];
    EXPECT_GT(want.size(), 20u) << what << ": a longer continuation is wanted";
    int64_t accepted = 0;
    for (int32_t k : {1, 4, 8})
      accepted += expect_lookup_equals(runner, prompt, max_tokens, {eos}, k, want, what).accepted;
    if (p == &repeating) {
      EXPECT_GT(accepted, 10) << "the model copies the paragraph: drafts should hold";
    }
  }
}

}  // namespace
}  // namespace kiln
