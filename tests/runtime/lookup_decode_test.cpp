// generate_greedy_lookup (what `kiln generate --lookup K` runs) against plain greedy
// decoding (LlmRunner::generate_greedy) token for token: the golden tiny Llama and, when
// fetched, the real SmolLM2-135M-Instruct, on prompts that repeat text (drafts accepted)
// and that do not, for several K; stop tokens and max_tokens met inside a step of drafts;
// no KV block left behind.
#include <gtest/gtest.h>

#include <algorithm>
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

// Decodes with lookup (`base` with k drafts) and checks it against `want`, the callback's
// tokens and the pool.
LookupDecodeStats expect_lookup_equals(LlmRunner& runner, const Ids& prompt, int32_t max_tokens, const Ids& stops,
                                       int32_t k, const Ids& want, const std::string& what,
                                       const LookupDecodeOptions& base = {}) {
  const int32_t free_before = runner.kv().allocator().num_free();
  Ids streamed;
  LookupDecodeOptions opt = base;
  opt.num_draft = k;
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
    // The defaults; llama.cpp's n-gram sizes (1-3) with a fixed k, so that the one-token
    // matches draft often; whole logits rows; the prompt prefilled 7 tokens a step.
    LookupDecodeOptions fixed;
    fixed.min_n = 1;
    fixed.adaptive = false;
    LookupDecodeOptions rows_chunked;
    rows_chunked.top_logits = false;
    rows_chunked.max_step_tokens = 7;
    const std::pair<const char*, LookupDecodeOptions> variants[] = {
        {"", {}}, {" (n 1-3, fixed k)", fixed}, {" (whole rows, prefill by 7)", rows_chunked}};
    for (const auto& [name, base] : variants) {
      int64_t accepted = 0;
      for (int32_t k : {0, 1, 2, 4, 8})
        accepted += expect_lookup_equals(runner, prompt, max_tokens, {}, k, want, what + name, base).accepted;
      // A random tiny model settles into loops, which the drafts then follow.
      if (p == &repeating || base.min_n == 1) {
        EXPECT_GT(accepted, 0) << what << name;
      }

      // A stop token and max_tokens met in the middle of a step of drafts.
      const Ids want_stop = runner.generate_greedy({prompt}, max_tokens, want[40])[0];
      for (int32_t k : {1, 3, 8}) {
        expect_lookup_equals(runner, prompt, max_tokens, {want[40]}, k, want_stop,
                             what + name + ", stop " + std::to_string(want[40]), base);
        for (int32_t n : {1, 2, 5, 33})
          expect_lookup_equals(runner, prompt, n, {}, k, Ids(want.begin(), want.begin() + n),
                               what + name + ", max_tokens " + std::to_string(n), base);
      }
    }
  }
  EXPECT_EQ(runner.kv().allocator().num_free(), free_start);
}

// A pool with just the blocks that plain decoding up to a stop token needs: drafts past
// the stop must not make a step run out of blocks (they are clipped to the free ones).
TEST(LookupDecode, DraftsFitTheFreeBlocks) {
  auto model = Model::load(fixture_model("llama"));
  LlmRunner runner(*model, {.block_size = 16, .num_blocks = 16});
  Ids prompt;
  for (int rep = 0; rep < 3; ++rep)
    for (int32_t t = 5; t < 17; ++t) prompt.push_back(t * 7 % 500);
  const int32_t max_tokens = 80;
  const Ids want_all = runner.generate_greedy({prompt}, max_tokens)[0];
  // The stop: the latest token of the first 40 that did not occur before it.
  size_t at = 0;
  for (size_t i = 0; i < 40; ++i)
    if (std::find(want_all.begin(), want_all.begin() + int64_t(i), want_all[i]) == want_all.begin() + int64_t(i)) at = i;
  const int32_t stop = want_all[at];
  const Ids want = runner.generate_greedy({prompt}, max_tokens, stop)[0];
  ASSERT_EQ(want.size(), at + 1);
  // Plain decoding to the stop writes positions 0 .. prompt + at - 1.
  const int32_t blocks = int32_t((prompt.size() + at + 15) / 16);
  KvCacheManager& kvm = runner.kv_manager();
  std::vector<int32_t> held;
  while (kvm.allocator().num_free() > blocks) held.push_back(kvm.allocator().allocate());
  LookupDecodeOptions fixed;
  fixed.min_n = 1;
  fixed.adaptive = false;
  for (int32_t k : {4, 8, 16}) expect_lookup_equals(runner, prompt, max_tokens, {stop}, k, want,
                                                     std::to_string(blocks) + " free blocks", fixed);
  for (int32_t b : held) kvm.allocator().release(b);
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

// weight_dtype "f32" (the library's default) and "auto" (the CLI's: q4 blocks through the
// int8-activation GEMV, a verification step's rows and a decode step's row alike).
class LookupDecodeSmolLM2 : public ::testing::TestWithParam<std::string> {};

TEST_P(LookupDecodeSmolLM2, EqualsGreedy) {
  const std::string path = real_model("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
  if (!std::filesystem::exists(path))
    GTEST_SKIP() << "real model not found at " << path << " (run .ci/fetch_models.sh)";
  auto model = Model::load(path, {.weight_dtype = GetParam()});
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
    const std::string what =
        "smollm2 " + GetParam() + (p == &repeating ? ", repeating prompt" : ", plain prompt");
    const Ids want = runner.generate_greedy({prompt}, max_tokens, eos)[0];
    EXPECT_GT(want.size(), 20u) << what << ": a longer continuation is wanted";
    int64_t accepted = 0;
    LookupDecodeOptions rows;
    rows.top_logits = false;
    LookupDecodeOptions fixed;  // one-token matches draft on the plain prompt too: rejections
    fixed.min_n = 1;
    fixed.adaptive = false;
    for (int32_t k : {1, 4, 8}) accepted += expect_lookup_equals(runner, prompt, max_tokens, {eos}, k, want, what).accepted;
    expect_lookup_equals(runner, prompt, max_tokens, {eos}, 8, want, what + " (whole rows)", rows);
    expect_lookup_equals(runner, prompt, max_tokens, {eos}, 4, want, what + " (n 1-3, fixed k)", fixed);
    if (p == &repeating) {
      EXPECT_GT(accepted, 10) << "the model copies the paragraph: drafts should hold";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WeightDtypes, LookupDecodeSmolLM2, ::testing::Values("f32", "auto"));

}  // namespace
}  // namespace kiln
