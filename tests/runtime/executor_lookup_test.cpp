// The executor's prompt-lookup drafts (ExecutorOptions::lookup_drafts) against the same
// executor without them, on the tiny Llama fixture: many concurrent requests (prompts that
// repeat text and that do not, sampled ones, logprobs, prompt logprobs, n = 2, stop ids and
// strings and max_tokens met inside a run of drafts, shared prefixes) give the same tokens,
// text, logprobs and finish reasons; drafts are accepted; no KV block is left behind; a pool
// too small for drafts still completes everything; and the prefix cache never keeps the K/V
// of a rejected draft. With the real SmolLM2-135M (when fetched), copied text is drafted.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <thread>

#include "runtime/executor.h"
#include "runtime/model_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "executor_test_util.h"

namespace kiln {
namespace {

using Ids = std::vector<int32_t>;

std::string fixture(const std::string& name) { return std::string(KILN_FIXTURES_DIR) + "/models/" + name; }

// Everything a request's updates carried, per choice.
struct Outcome {
  struct Choice {
    Ids tokens;
    std::string text;
    std::vector<SampledToken> logprobs;
    FinishReason finish = FinishReason::kNone;
  };
  std::vector<Choice> choices;
  std::vector<SampledToken> prompt_logprobs;
  std::string error;
  int32_t completion_tokens = 0;
};

// As test_exec::run_all_at_once, keeping text and logprobs too.
std::vector<Outcome> run_all(Executor& ex, const std::vector<GenerationRequest>& reqs) {
  std::vector<Outcome> out(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) out[i].choices.resize(size_t(reqs[i].n));
  test_exec::submit_all_at_once(ex, reqs, [&](size_t i, RequestUpdate& u) {
    Outcome& o = out[i];
    o.prompt_logprobs.insert(o.prompt_logprobs.end(), u.prompt_logprobs.begin(), u.prompt_logprobs.end());
    for (auto& c : u.choices) {
      auto& ch = o.choices.at(size_t(c.index));
      ch.tokens.insert(ch.tokens.end(), c.tokens.begin(), c.tokens.end());
      ch.text += c.text;
      ch.logprobs.insert(ch.logprobs.end(), c.logprobs.begin(), c.logprobs.end());
      if (c.finish != FinishReason::kNone) ch.finish = c.finish;
    }
    if (u.done) {
      o.error = u.error;
      o.completion_tokens = u.completion_tokens;
    }
  });
  return out;
}

void expect_same(const Outcome& want, const Outcome& got, const std::string& what) {
  ASSERT_EQ(want.error, "") << what;
  ASSERT_EQ(got.error, "") << what;
  ASSERT_EQ(got.choices.size(), want.choices.size()) << what;
  for (size_t c = 0; c < want.choices.size(); ++c) {
    const auto &w = want.choices[c], &g = got.choices[c];
    EXPECT_EQ(g.tokens, w.tokens) << what << ", choice " << c;
    EXPECT_EQ(g.text, w.text) << what << ", choice " << c;
    EXPECT_EQ(g.finish, w.finish) << what << ", choice " << c;
    ASSERT_EQ(g.logprobs.size(), w.logprobs.size()) << what << ", choice " << c;
    for (size_t k = 0; k < w.logprobs.size(); ++k) {
      EXPECT_EQ(g.logprobs[k].token, w.logprobs[k].token) << what;
      EXPECT_FLOAT_EQ(g.logprobs[k].logprob, w.logprobs[k].logprob) << what;
      EXPECT_EQ(g.logprobs[k].top.size(), w.logprobs[k].top.size()) << what;
    }
  }
  ASSERT_EQ(got.prompt_logprobs.size(), want.prompt_logprobs.size()) << what;
  for (size_t k = 0; k < want.prompt_logprobs.size(); ++k)
    EXPECT_FLOAT_EQ(got.prompt_logprobs[k].logprob, want.prompt_logprobs[k].logprob) << what;
  EXPECT_EQ(got.completion_tokens, want.completion_tokens) << what;
}

// Blocks are held by sequences or the prefix cache only: with nothing running, every block is
// free or cached.
void expect_no_leak(Executor& ex) {
  const ExecutorStats s = test_exec::settled_stats(ex);
  EXPECT_EQ(s.running + s.waiting, 0);
  EXPECT_EQ(s.kv_blocks_free + s.kv_blocks_cached, s.kv_blocks_total) << "blocks held by neither a sequence nor the cache";
}

class ExecutorLookupTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = Model::load(fixture("llama")).release();
    tokenizer_ = new tok::Tokenizer(tok::Tokenizer::from_hf_json(test_exec::json_test_tokenizer()));
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    delete model_;
  }
  // `reps` copies of a random run of `len` tokens.
  static Ids repeating(uint32_t seed, int len, int reps) {
    std::mt19937 rng(seed);
    Ids run(size_t(len), 0);
    for (auto& t : run) t = int32_t(3 + rng() % 500);
    Ids p;
    for (int r = 0; r < reps; ++r) p.insert(p.end(), run.begin(), run.end());
    return p;
  }
  static Ids random_prompt(uint32_t seed, int len) { return repeating(seed, len, 1); }
  static GenerationRequest greedy(const Ids& prompt, int32_t max_tokens) {
    return test_exec::greedy_request(prompt, max_tokens);
  }
  static Ids alone(const Ids& prompt, int32_t max_tokens) {
    LlmRunner runner(*model_);
    return runner.generate_greedy({prompt}, max_tokens).at(0);
  }

  static Model* model_;
  static tok::Tokenizer* tokenizer_;
};
Model* ExecutorLookupTest::model_ = nullptr;
tok::Tokenizer* ExecutorLookupTest::tokenizer_ = nullptr;

// The requests of the mixed test; `ref` (the outputs of the plain greedy requests without
// stops, from a run without drafts) places stop ids and strings inside their outputs.
std::vector<GenerationRequest> mixed_requests(const std::vector<GenerationRequest>& base, const std::vector<Outcome>* ref,
                                              const tok::Tokenizer& tokenizer) {
  std::vector<GenerationRequest> reqs = base;
  if (!ref) return reqs;
  for (size_t i = 0; i < 4; ++i) {
    const Ids& out = (*ref)[i].choices[0].tokens;
    GenerationRequest r = base[i];
    r.stop_ids = {out[9 + 4 * i]};
    reqs.push_back(r);
    // A stop string: the text of two tokens well inside the output.
    GenerationRequest s = base[i];
    const std::string text = tokenizer.decode(Ids(out.begin() + 13 + int64_t(i), out.begin() + 15 + int64_t(i)));
    if (!text.empty()) s.stop = {text};
    reqs.push_back(s);
    // max_tokens anywhere in a run of drafts.
    for (int32_t n : {1, 2, 3, 6, 11}) {
      GenerationRequest m = base[i];
      m.max_tokens = n + int32_t(i);
      reqs.push_back(m);
    }
  }
  return reqs;
}

TEST_F(ExecutorLookupTest, MixedRequestsGiveTheOutputsOfPlainDecoding) {
  std::vector<GenerationRequest> base;
  for (uint32_t i = 0; i < 6; ++i) base.push_back(greedy(repeating(10 + i, 9 + int(i), 3), 40 + int32_t(i) * 3));
  for (uint32_t i = 0; i < 3; ++i) base.push_back(greedy(random_prompt(20 + i, 7 + int(i) * 11), 30));
  // Two requests sharing a 34-token prefix (two blocks), one of them without ignore_eos.
  Ids shared = repeating(30, 17, 2);
  Ids a = shared, b = shared;
  a.insert(a.end(), {7, 8, 9});
  b.insert(b.end(), {11, 12});
  base.push_back(greedy(a, 36));
  base.push_back(greedy(b, 36));
  base.back().ignore_eos = false;
  // Sampled: temperature 1 with a seed, and top-k.
  GenerationRequest sampled = greedy(repeating(40, 8, 3), 30);
  sampled.sampling.temperature = 1.0f;
  sampled.sampling.seed = 7;
  base.push_back(sampled);
  sampled.sampling.top_k = 5;
  sampled.sampling.seed = 8;
  base.push_back(sampled);
  // Greedy with logprobs (one token a step), with prompt logprobs (drafts after its prefill),
  // with a repetition penalty; n = 2 greedy (its forks draft) and n = 2 sampled.
  GenerationRequest lp = greedy(repeating(50, 10, 3), 30);
  lp.sampling.logprobs = 2;
  base.push_back(lp);
  GenerationRequest plp = greedy(repeating(51, 10, 3), 30);
  plp.prompt_logprobs = 2;
  base.push_back(plp);
  GenerationRequest pen = greedy(repeating(52, 10, 3), 30);
  pen.sampling.repetition_penalty = 1.3f;
  base.push_back(pen);
  GenerationRequest n2 = greedy(repeating(53, 11, 3), 34);
  n2.n = 2;
  base.push_back(n2);
  n2.sampling.temperature = 0.8f;
  n2.sampling.seed = 3;
  base.push_back(n2);

  for (bool top_logits : {true, false}) {
    ExecutorOptions plain;
    plain.max_step_tokens = 64;  // chunked prefills beside the decodes
    plain.top_logits = top_logits;
    std::vector<Outcome> ref_base;
    {
      Executor ex(*model_, tokenizer_, plain);
      ref_base = run_all(ex, base);
    }
    const std::vector<GenerationRequest> reqs = mixed_requests(base, &ref_base, *tokenizer_);
    std::vector<Outcome> want;
    {
      Executor ex(*model_, tokenizer_, plain);
      want = run_all(ex, reqs);
      EXPECT_EQ(ex.stats().spec_draft_tokens, 0);
    }
    int stopped = 0;
    for (size_t i = base.size(); i < reqs.size(); ++i)
      stopped += want[i].choices[0].finish == FinishReason::kStop;
    EXPECT_GE(stopped, 6) << "the stop ids and strings should end their requests early";
    // K 1 with the default n-gram sizes (2-3); longer runs of drafts from one-token matches
    // too, which draft far more often (and are rejected far more often).
    for (int32_t k : {1, 3, 6}) {
      ExecutorOptions opt = plain;
      opt.lookup_drafts = k;
      if (k > 1) opt.lookup_min_n = 1;
      Executor ex(*model_, tokenizer_, opt);
      const std::vector<Outcome> got = run_all(ex, reqs);
      for (size_t i = 0; i < reqs.size(); ++i)
        expect_same(want[i], got[i],
                     "request " + std::to_string(i) + ", K " + std::to_string(k) + (top_logits ? "" : ", whole rows"));
      expect_no_leak(ex);
      const ExecutorStats s = ex.stats();
      std::printf("  K %d%s: %lld steps, drafted %lld, accepted %lld (%.0f%%)\n", k, top_logits ? "" : " (whole rows)",
                  (long long)s.steps, (long long)s.spec_draft_tokens, (long long)s.spec_accepted_tokens,
                  s.spec_draft_tokens ? 100.0 * double(s.spec_accepted_tokens) / double(s.spec_draft_tokens) : 0.0);
      EXPECT_GT(s.spec_accepted_tokens, 0);
      EXPECT_LE(s.spec_accepted_tokens, s.spec_draft_tokens);
    }
  }
}

// Pools of 8 blocks for 8 sequences of 76 tokens (5 blocks each): preemption (recompute and swap) all the time,
// and drafts only where blocks happen to be free. Every request completes exactly.
TEST_F(ExecutorLookupTest, APoolTooSmallForDraftsStillCompletesEveryRequest) {
  std::vector<GenerationRequest> reqs;
  for (uint32_t i = 0; i < 8; ++i) reqs.push_back(greedy(repeating(60 + i, 12, 3), 40));
  for (PreemptionMode mode : {PreemptionMode::kRecompute, PreemptionMode::kSwap}) {
    ExecutorOptions opt;
    opt.kv_tokens = 128;
    opt.max_step_tokens = 64;
    opt.prefix_caching = false;
    opt.preemption = mode;
    opt.lookup_drafts = 4;
    Executor ex(*model_, nullptr, opt);
    const std::vector<Outcome> got = run_all(ex, reqs);
    for (size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_EQ(got[i].error, "") << "request " << i;
      EXPECT_EQ(got[i].choices[0].tokens, alone(reqs[i].prompt, 40)) << "request " << i;
      EXPECT_EQ(got[i].choices[0].finish, FinishReason::kLength);
    }
    expect_no_leak(ex);
    const ExecutorStats s = ex.stats();
    EXPECT_GT(s.preemptions, 0);
    EXPECT_EQ(s.kv_blocks_free, s.kv_blocks_total);
    std::printf("  %s: %lld preemptions, drafted %lld, accepted %lld\n", preemption_mode_name(mode),
                (long long)s.preemptions, (long long)s.spec_draft_tokens, (long long)s.spec_accepted_tokens);
  }
}

// Blocks of 4 tokens, so that the K/V of a rejected draft would land in blocks that fill up and
// go to the prefix cache if it were not cut first. A request whose drafts are mostly rejected,
// then requests whose prompts are its whole sequence (sharing every full block of it) and the
// next turn of its session (reusing all of its KV): their outputs are those of running them
// alone.
TEST_F(ExecutorLookupTest, ThePrefixCacheNeverKeepsARejectedDraft) {
  ExecutorOptions opt;
  opt.block_size = 4;
  opt.kv_tokens = 1024;
  opt.lookup_drafts = 6;
  opt.lookup_min_n = 1;  // one-token matches: many drafts, most of them wrong
  opt.lookup_max_n = 2;
  // Long enough that a loaded machine (CI's 2 cores running tests side by side) does not
  // expire a session between its two turns; short enough to wait out below.
  opt.session_idle_timeout = std::chrono::milliseconds(3000);
  Executor ex(*model_, nullptr, opt);
  int64_t rejected = 0;
  for (uint32_t seed = 0; seed < 4; ++seed) {
    const Ids prompt = random_prompt(70 + seed, 20);
    GenerationRequest turn1 = greedy(prompt, 40);
    turn1.session_id = "s" + std::to_string(seed);
    const Outcome first = run_all(ex, {turn1}).at(0);
    ASSERT_EQ(first.error, "");
    ASSERT_EQ(first.choices[0].tokens, alone(prompt, 40));
    const ExecutorStats s = test_exec::settled_stats(ex);
    rejected = s.spec_draft_tokens - s.spec_accepted_tokens;
    Ids whole = prompt;
    whole.insert(whole.end(), first.choices[0].tokens.begin(), first.choices[0].tokens.end());
    std::vector<GenerationRequest> next;
    for (size_t cut : {whole.size(), whole.size() - 3, prompt.size() + 9})
      next.push_back(greedy(Ids(whole.begin(), whole.begin() + int64_t(cut)), 12));
    Ids turn2_prompt = whole;
    turn2_prompt.insert(turn2_prompt.end(), {5, 6, 7});
    next.push_back(greedy(turn2_prompt, 12));
    next.back().session_id = turn1.session_id;
    const std::vector<Outcome> got = run_all(ex, next);
    for (size_t i = 0; i < next.size(); ++i)
      EXPECT_EQ(got[i].choices[0].tokens, alone(next[i].prompt, 12)) << "seed " << seed << ", request " << i;
  }
  EXPECT_GT(rejected, 0) << "the test needs drafts that the model rejects";
  ExecutorStats s = test_exec::settled_stats(ex);
  EXPECT_GT(s.prefix_hit_blocks, 0);
  EXPECT_EQ(s.session_hits, 4);
  // The sessions hold blocks until they expire (the idle loop looks once a second).
  for (int i = 0; i < 300 && ex.stats().sessions > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(ex.stats().sessions, 0);
  expect_no_leak(ex);
}

// The draft length schedule (ExecutorOptions::lookup_adaptive): where most one-token matches
// are wrong, shrinking after each rejection feeds fewer draft rows than drafting up to
// lookup_drafts every step, and both give plain decoding's tokens.
TEST_F(ExecutorLookupTest, AdaptiveDraftLengthFeedsFewerRejectedRows) {
  std::vector<GenerationRequest> reqs;
  for (uint32_t seed = 0; seed < 4; ++seed) reqs.push_back(greedy(random_prompt(90 + seed, 24), 40));
  int64_t drafted[2] = {}, accepted[2] = {};
  for (bool adaptive : {false, true}) {
    ExecutorOptions opt;
    opt.kv_tokens = 1024;
    opt.lookup_drafts = 6;
    opt.lookup_min_n = 1;  // one-token matches: many drafts, most of them wrong
    opt.lookup_max_n = 2;
    opt.lookup_adaptive = adaptive;
    Executor ex(*model_, nullptr, opt);
    const std::vector<Outcome> got = run_all(ex, reqs);
    for (size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_EQ(got[i].error, "");
      EXPECT_EQ(got[i].choices[0].tokens, alone(reqs[i].prompt, 40)) << "request " << i << " adaptive " << adaptive;
    }
    const ExecutorStats s = test_exec::settled_stats(ex);
    drafted[adaptive] = s.spec_draft_tokens;
    accepted[adaptive] = s.spec_accepted_tokens;
    expect_no_leak(ex);
  }
  std::printf("  fixed: drafted %lld, accepted %lld; adaptive: drafted %lld, accepted %lld\n", (long long)drafted[0],
              (long long)accepted[0], (long long)drafted[1], (long long)accepted[1]);
  ASSERT_GT(drafted[0] - accepted[0], 20) << "the test needs drafts that the model rejects";
  EXPECT_LT(drafted[1], drafted[0]);
  EXPECT_LT(drafted[1] - accepted[1], drafted[0] - accepted[0]);
}

// The real SmolLM2-135M-Instruct (when fetched: .ci/fetch_models.sh) copying paragraphs, beside
// free-text requests: the same outputs as without drafts, most of the copied text from drafts,
// in fewer steps.
TEST(ExecutorLookupSmolLM2, CopiedTextIsDraftedWithTheSameOutputs) {
  const char* env = std::getenv("KILN_MODELS_DIR");
  const std::string path = (env ? std::string(env) : std::string(KILN_SOURCE_DIR) + "/.cache/models") +
                           "/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path))
    GTEST_SKIP() << "real model not found at " << path << " (run .ci/fetch_models.sh)";
  auto model = Model::load(path, {.weight_dtype = "auto"});
  auto tokenizer = load_model_tokenizer(*model);
  ASSERT_TRUE(tokenizer);
  const std::string paragraphs[] = {
      "The quick brown fox jumps over the lazy dog. The dog, annoyed, gets up and chases the fox "
      "around the old red barn until both of them are too tired to run.",
      "To make bread, mix flour, water, salt and yeast, knead the dough for ten minutes, let it rise "
      "for an hour, shape it, let it rise again and bake it in a hot oven.",
      "def add(a, b):\n    return a + b\n\ndef mul(a, b):\n    return a * b\n"};
  std::vector<GenerationRequest> reqs;
  for (const std::string& p : paragraphs) {
    GenerationRequest r;
    r.prompt = tokenizer->encode("Here is a text:\n" + p + "\nThe same text again, word for word:\n");
    r.max_tokens = 48;
    r.sampling.temperature = 0;
    reqs.push_back(r);
  }
  for (const char* p : {"Once upon a time, in a small village by the sea, there lived", "The capital of France is"}) {
    GenerationRequest r;
    r.prompt = tokenizer->encode(p);
    r.max_tokens = 32;
    r.sampling.temperature = 0;
    reqs.push_back(r);
  }
  ExecutorOptions plain;
  plain.kv_tokens = 4096;
  std::vector<Outcome> want;
  int64_t plain_steps = 0;
  {
    Executor ex(*model, &*tokenizer, plain);
    want = run_all(ex, reqs);
    plain_steps = test_exec::settled_stats(ex).steps;
  }
  ExecutorOptions opt = plain;
  opt.lookup_drafts = 8;
  Executor ex(*model, &*tokenizer, opt);
  const std::vector<Outcome> got = run_all(ex, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) expect_same(want[i], got[i], "request " + std::to_string(i));
  expect_no_leak(ex);
  const ExecutorStats s = ex.stats();
  std::printf("  smollm2: %lld steps (%lld without drafts), drafted %lld, accepted %lld (%.0f%%)\n", (long long)s.steps,
              (long long)plain_steps, (long long)s.spec_draft_tokens, (long long)s.spec_accepted_tokens,
              s.spec_draft_tokens ? 100.0 * double(s.spec_accepted_tokens) / double(s.spec_draft_tokens) : 0.0);
  EXPECT_GT(s.spec_accepted_tokens, 30) << "the model copies the paragraphs: drafts should hold";
  EXPECT_LT(s.steps, plain_steps);
}

// lookup_max_batch: no drafts in a step of more sequences than that. Three requests of the
// same length run their every step together: none is drafted at a limit of 2, at 3 they
// are, and the outputs are the same either way.
TEST_F(ExecutorLookupTest, NoDraftsInStepsPastTheBatchLimit) {
  std::vector<GenerationRequest> reqs;
  for (uint32_t i = 0; i < 3; ++i) reqs.push_back(greedy(repeating(70 + i, 10, 3), 24));
  std::vector<Outcome> want;
  {
    Executor ex(*model_, tokenizer_, {});
    want = run_all(ex, reqs);
  }
  for (int32_t limit : {2, 3}) {
    ExecutorOptions opt;
    opt.lookup_drafts = 4;
    opt.lookup_max_batch = limit;
    Executor ex(*model_, tokenizer_, opt);
    const std::vector<Outcome> got = run_all(ex, reqs);
    for (size_t i = 0; i < reqs.size(); ++i)
      expect_same(want[i], got[i], "limit " + std::to_string(limit));
    if (limit == 2)
      EXPECT_EQ(ex.stats().spec_draft_tokens, 0);
    else
      EXPECT_GT(ex.stats().spec_draft_tokens, 0);
    expect_no_leak(ex);
  }
}

TEST_F(ExecutorLookupTest, BadOptionsAreRefused) {
  for (auto [k, lo, hi] : {std::tuple{-1, 2, 3}, {4, 0, 3}, {4, 3, 2}, {4, 1, 17}}) {
    ExecutorOptions opt;
    opt.lookup_drafts = k;
    opt.lookup_min_n = lo;
    opt.lookup_max_n = hi;
    EXPECT_THROW(Executor(*model_, nullptr, opt), Error) << k << " " << lo << " " << hi;
  }
  ExecutorOptions opt;
  opt.lookup_drafts = 4;
  opt.lookup_max_batch = -1;
  EXPECT_THROW(Executor(*model_, nullptr, opt), Error);
}

}  // namespace
}  // namespace kiln
