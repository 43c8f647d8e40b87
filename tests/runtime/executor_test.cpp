// Executor end to end on the tiny Llama fixture: concurrent greedy requests (submitted
// from several threads, chunked prefill, preemption under a small KV pool) produce
// exactly the tokens each produces alone; seeds, n > 1 (its choices counted against
// max_running), stop ids, cancellation, prefix cache and session reuse, expiry, bad
// requests; and no KV block leaks afterwards.
// Steps that sample from the TopKLogits candidates give the whole-row steps' outputs.
// Pool sizing from (faked) free memory; preemption by swapping to host memory (exact
// outputs, swap-space exhaustion falling back to recompute, cancellation while swapped).
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "backends/cpu/kernels/kernels.h"
#include "core/status.h"
#include "runtime/executor.h"
#include "runtime/grammar.h"
#include "tokenizer/tokenizer.h"
#include "executor_test_util.h"
#include "../models/golden_util.h"

namespace kiln {
namespace {

using test_exec::run_all_at_once;
using test_exec::settled_stats;
using test_exec::json_test_tokenizer;

std::string fixture(const std::string& name) { return std::string(KILN_FIXTURES_DIR) + "/models/" + name; }

class ExecutorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = Model::load(fixture("llama")).release(); }
  static void TearDownTestSuite() { delete model_; }

  static std::vector<std::vector<int32_t>> prompts(int n, uint32_t seed, int min_len, int max_len) {
    std::mt19937 rng(seed);
    std::vector<std::vector<int32_t>> out;
    for (int i = 0; i < n; ++i) {
      std::vector<int32_t> p(size_t(min_len + int(rng() % uint32_t(max_len - min_len + 1))));
      for (auto& t : p) t = int32_t(3 + rng() % 500);
      out.push_back(p);
    }
    return out;
  }
  // The reference: each prompt alone through LlmRunner's own greedy loop.
  static std::vector<int32_t> alone(const std::vector<int32_t>& prompt, int32_t max_tokens) {
    LlmRunner runner(*model_);
    return runner.generate_greedy({prompt}, max_tokens).at(0);
  }
  static GenerationRequest greedy(const std::vector<int32_t>& prompt, int32_t max_tokens) {
    return test_exec::greedy_request(prompt, max_tokens);
  }
  static void expect_no_leak(Executor& ex) {
    // Updates are sent before the stats of that loop turn are published.
    for (int i = 0; i < 200 && ex.stats().running + ex.stats().waiting > 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ExecutorStats s = ex.stats();
    EXPECT_EQ(s.kv_blocks_free + s.kv_blocks_cached, s.kv_blocks_total)
        << "blocks held by neither a sequence nor the cache";
  }

  static std::vector<GenerationResult> run_concurrently(Executor& ex, const std::vector<GenerationRequest>& reqs) {
    return test_exec::run_concurrently(ex, reqs);
  }

  static Model* model_;
};
Model* ExecutorTest::model_ = nullptr;

TEST_F(ExecutorTest, ConcurrentGreedyEqualsEachRequestAlone) {
  auto ps = prompts(12, 1, 1, 60);
  ExecutorOptions opt;
  opt.max_step_tokens = 48;  // forces chunked prefill mixed with decodes
  Executor ex(*model_, nullptr, opt);
  std::vector<GenerationRequest> reqs;
  for (size_t i = 0; i < ps.size(); ++i) reqs.push_back(greedy(ps[i], 8 + int32_t(i % 5) * 4));
  auto got = run_concurrently(ex, reqs);
  for (size_t i = 0; i < ps.size(); ++i) {
    ASSERT_EQ(got[i].error, "");
    ASSERT_EQ(got[i].choices.size(), 1u);
    EXPECT_EQ(got[i].choices[0].tokens, alone(ps[i], reqs[i].max_tokens)) << "request " << i;
    EXPECT_EQ(got[i].choices[0].finish, FinishReason::kLength);
    EXPECT_EQ(got[i].completion_tokens, reqs[i].max_tokens);
    EXPECT_EQ(got[i].prompt_tokens, int32_t(ps[i].size()));
  }
  EXPECT_GT(ex.stats().steps, 0);
  expect_no_leak(ex);
}

TEST_F(ExecutorTest, PreemptionUnderASmallPoolKeepsOutputsExact) {
  auto ps = prompts(8, 2, 20, 40);
  ExecutorOptions opt;
  opt.kv_tokens = 128;  // 8 blocks of 16: far less than 8 sequences of ~60 tokens
  opt.max_step_tokens = 64;
  opt.prefix_caching = false;
  Executor ex(*model_, nullptr, opt);
  std::vector<GenerationRequest> reqs;
  for (auto& p : ps) reqs.push_back(greedy(p, 24));
  auto got = run_concurrently(ex, reqs);
  for (size_t i = 0; i < ps.size(); ++i) {
    ASSERT_EQ(got[i].error, "") << "request " << i;
    EXPECT_EQ(got[i].choices[0].tokens, alone(ps[i], 24)) << "request " << i;
  }
  for (int i = 0; i < 500 && ex.stats().preemptions == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_GT(ex.stats().preemptions, 0);
  expect_no_leak(ex);
}

TEST_F(ExecutorTest, PrefixCacheAndSessionsReuseKvWithoutChangingOutputs) {
  auto ps = prompts(1, 3, 50, 50);
  Executor ex(*model_, nullptr);
  auto first = ex.generate(greedy(ps[0], 6));
  EXPECT_EQ(first.cached_tokens, 0);
  auto second = ex.generate(greedy(ps[0], 6));
  EXPECT_EQ(second.cached_tokens, 48);  // three full blocks of 16 (the last token is fed)
  EXPECT_EQ(second.choices[0].tokens, first.choices[0].tokens);
  for (int i = 0; i < 500 && ex.stats().prefix_hit_blocks == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_GT(ex.stats().prefix_hit_blocks, 0);
  expect_no_leak(ex);

  // Session: turn 2 extends turn 1's prompt + answer; only the new tokens are prefilled.
  auto turn1 = greedy(prompts(1, 4, 21, 21)[0], 10);
  turn1.session_id = "chat-1";
  auto r1 = ex.generate(turn1);
  auto turn2 = turn1;
  turn2.prompt.insert(turn2.prompt.end(), r1.choices[0].tokens.begin(), r1.choices[0].tokens.end());
  turn2.prompt.insert(turn2.prompt.end(), {7, 8, 9});
  auto r2 = ex.generate(turn2);
  EXPECT_EQ(r2.cached_tokens, 21 + 10 - 1);  // all but the last answer token had K/V
  EXPECT_EQ(r2.choices[0].tokens, alone(turn2.prompt, 10));
  // Stats are a snapshot the executor publishes after each loop turn, so they may trail
  // the done callback by one turn: wait for it.
  for (int i = 0; i < 500 && ex.stats().sessions != 1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_EQ(ex.stats().session_hits, 1);
  EXPECT_EQ(ex.stats().sessions, 1);  // holds its blocks until it expires
}

TEST_F(ExecutorTest, SessionsExpireAfterTheIdleTimeout) {
  ExecutorOptions opt;
  opt.session_idle_timeout = std::chrono::milliseconds(10);
  Executor ex(*model_, nullptr, opt);
  auto r = greedy(prompts(1, 5, 20, 20)[0], 4);
  r.session_id = "s";
  ex.generate(r);
  for (int i = 0; i < 40 && ex.stats().session_expiries == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(ex.stats().session_expiries, 1);
  EXPECT_EQ(ex.stats().sessions, 0);
}

TEST_F(ExecutorTest, SeededSamplingIsReproducibleAndNChoicesShareThePrompt) {
  Executor ex(*model_, nullptr);
  GenerationRequest r;
  r.prompt = prompts(1, 6, 30, 30)[0];
  r.max_tokens = 12;
  r.n = 3;
  r.ignore_eos = true;
  r.sampling.temperature = 1.5f;
  r.sampling.seed = 1234;
  r.sampling.logprobs = 2;
  auto a = ex.generate(r);
  auto b = run_concurrently(ex, {r, greedy(r.prompt, 5), r});
  ASSERT_EQ(a.choices.size(), 3u);
  EXPECT_EQ(a.completion_tokens, 36);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(a.choices[size_t(i)].tokens, b[0].choices[size_t(i)].tokens);
    EXPECT_EQ(a.choices[size_t(i)].tokens, b[2].choices[size_t(i)].tokens);
    ASSERT_EQ(a.choices[size_t(i)].logprobs.size(), 12u);
    EXPECT_LE(a.choices[size_t(i)].logprobs[0].logprob, 0.0f);
    EXPECT_EQ(a.choices[size_t(i)].logprobs[0].top.size(), 2u);
  }
  EXPECT_NE(a.choices[0].tokens, a.choices[1].tokens);  // 12 draws at T=1.5 over 512 tokens
  expect_no_leak(ex);
}

TEST_F(ExecutorTest, StopIdsEndTheChoice) {
  auto p = prompts(1, 7, 10, 10)[0];
  auto ref = alone(p, 8);
  Executor ex(*model_, nullptr);
  auto r = greedy(p, 8);
  r.stop_ids = {ref[3]};
  auto got = ex.generate(r);
  size_t first = size_t(std::find(ref.begin(), ref.end(), ref[3]) - ref.begin());
  EXPECT_EQ(got.choices[0].tokens, std::vector<int32_t>(ref.begin(), ref.begin() + int64_t(first) + 1));
  EXPECT_EQ(got.choices[0].finish, FinishReason::kStop);
}

TEST_F(ExecutorTest, CancelEndsARequestCleanlyAtAnyTime) {
  Executor ex(*model_, nullptr);
  std::atomic<int> updates{0};
  std::atomic<bool> done{false};
  std::atomic<int> finish{-1};
  std::atomic<bool> cancel_sent{false};
  auto r = greedy(prompts(1, 8, 10, 10)[0], 100);
  uint64_t id = 0;
  id = ex.submit(r, [&](RequestUpdate&& u) {
    ++updates;
    for (auto& c : u.choices)
      if (c.finish != FinishReason::kNone) finish = int(c.finish);
    if (u.done) done = true;
    // Hold the executor thread until the cancel is sent, so the request cannot finish
    // on its own first however fast the steps are.
    while (updates >= 2 && !cancel_sent) std::this_thread::yield();
  });
  while (updates < 2) std::this_thread::yield();
  ex.cancel(id);
  cancel_sent = true;
  for (int i = 0; i < 500 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_TRUE(done);
  EXPECT_EQ(finish, int(FinishReason::kCancelled));
  ex.cancel(id);      // finished: a no-op
  ex.cancel(999999);  // unknown: a no-op
  for (int i = 0; i < 500 && ex.stats().requests_cancelled == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_EQ(ex.stats().requests_cancelled, 1);
  expect_no_leak(ex);
}

TEST_F(ExecutorTest, BadRequestsAreRejectedWithClearErrors) {
  ExecutorOptions opt;
  opt.kv_tokens = 64;
  Executor ex(*model_, nullptr, opt);
  auto expect_error = [&](GenerationRequest r, const std::string& needle) {
    try {
      ex.generate(r);
      ADD_FAILURE() << "accepted a request that should fail with '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(greedy({}, 4), "empty");
  expect_error(greedy({1, 512}, 4), "outside the vocabulary");
  expect_error(greedy({1, -1}, 4), "outside the vocabulary");
  expect_error(greedy({1, 2}, -1), "max_tokens");
  auto r = greedy({1, 2}, 0);
  r.n = 2;
  expect_error(r, "max_tokens must be at least 1 with n > 1");
  r = greedy({1, 2}, 4);
  r.prompt_logprobs = 21;
  expect_error(r, "prompt_logprobs must be in [0, 20]");
  expect_error(greedy(std::vector<int32_t>(40, 5), 40), "exceeds the context");
  r = greedy({1, 2}, 4);
  r.n = 0;
  expect_error(r, "n must be");
  r = greedy({1, 2}, 4);
  r.sampling.top_p = 2;
  expect_error(r, "top_p");
  r = greedy({1, 2}, 4);
  r.stop = {"x"};
  expect_error(r, "tokenizer");
  r = greedy({1, 2}, 4);
  r.json_object = true;
  expect_error(r, "json_object needs a model with a tokenizer");
  r = greedy({1, 2}, 4);
  r.sampling.logit_bias = {{600, 1.0f}};
  expect_error(r, "logit_bias: token id 600 is outside the vocabulary");
  // Still healthy afterwards.
  EXPECT_EQ(ex.generate(greedy({5, 6, 7}, 3)).choices[0].tokens.size(), 3u);
}

// max_running bounds every running sequence, an n > 1 request's forked choices included
// (vLLM counts a group's n sequences against max_num_seqs): with two slots, a request with
// n = 2 and a plain one queued together never run three sequences at once, whichever
// comes first (the n = 2 one waits for both slots, the plain one for a free one), and
// every choice gives its prompt's greedy tokens alone.
TEST_F(ExecutorTest, MaxRunningCountsTheChoicesAnNRequestWillFork) {
  auto ps = prompts(2, 31, 10, 30);
  const auto want_two = alone(ps[0], 12), want_plain = alone(ps[1], 20);
  for (bool plain_first : {true, false}) {
    SCOPED_TRACE(plain_first ? "plain request first" : "n = 2 request first");
    ExecutorOptions opt;
    opt.max_running = 2;
    Executor ex(*model_, nullptr, opt);
    GenerationRequest two = greedy(ps[0], 12);
    two.n = 2;
    GenerationRequest plain = greedy(ps[1], 20);
    auto got = run_all_at_once(ex, plain_first ? std::vector{plain, two} : std::vector{two, plain});
    const GenerationResult& got_two = got[plain_first ? 1 : 0];
    const GenerationResult& got_plain = got[plain_first ? 0 : 1];
    ASSERT_EQ(got_two.error, "");
    ASSERT_EQ(got_plain.error, "");
    ASSERT_EQ(got_two.choices.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(got_two.choices[i].tokens, want_two) << "choice " << i;
      EXPECT_EQ(got_two.choices[i].finish, FinishReason::kLength) << "choice " << i;
    }
    EXPECT_EQ(got_plain.choices[0].tokens, want_plain);
    EXPECT_EQ(got_plain.choices[0].finish, FinishReason::kLength);
    ExecutorStats s = settled_stats(ex);
    EXPECT_EQ(s.running_peak, 2) << "sequences running at once with max_running 2";
    EXPECT_EQ(s.requests_finished, 2);
    EXPECT_EQ(s.kv_blocks_free + s.kv_blocks_cached, s.kv_blocks_total) << "blocks leaked";
  }
}

// An n above max_running could never run within the bound: refused at submit, naming both.
TEST_F(ExecutorTest, NAboveMaxRunningIsRefused) {
  ExecutorOptions opt;
  opt.max_running = 2;
  Executor ex(*model_, nullptr, opt);
  auto r = greedy({5, 6, 7}, 4);
  r.n = 3;
  try {
    ex.submit(r, [](RequestUpdate&&) {});
    ADD_FAILURE() << "accepted n = 3 with max_running 2";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("n (3) exceeds max_running (2)"), std::string::npos)
        << e.what();
  }
  r.n = 2;  // at the bound: runs
  auto got = ex.generate(r);
  ASSERT_EQ(got.choices.size(), 2u);
  EXPECT_EQ(got.choices[0].tokens, alone(r.prompt, 4));
  EXPECT_EQ(got.choices[1].tokens, got.choices[0].tokens);
  EXPECT_EQ(settled_stats(ex).running_peak, 2);
}

TEST_F(ExecutorTest, DrainWaitsForInFlightRequestsThenRefusesNewOnes) {
  Executor ex(*model_, nullptr);
  std::atomic<bool> done{false};
  ex.submit(greedy({5, 6, 7}, 20), [&](RequestUpdate&& u) {
    if (u.done) done = true;
  });
  ex.drain();
  EXPECT_TRUE(done);
  EXPECT_THROW(ex.generate(greedy({5, 6}, 2)), Error);
}

// Updates reach consumers on the emitter thread, in order, while the executor goes on
// stepping: slow consumers (each update sleeps) get every token exactly once, `done`
// last, equal to each request run alone, and drain() returns only after every final
// update has been delivered.
TEST_F(ExecutorTest, SlowConsumersGetEveryUpdateInOrderAndDrainWaitsForThem) {
  Executor ex(*model_, nullptr);
  auto ps = prompts(6, 21, 3, 12);
  struct Seen {
    std::vector<int32_t> tokens;
    int updates_after_done = 0;
    bool done = false;
    int32_t completion_tokens = -1;
  };
  std::vector<Seen> seen(ps.size());
  std::mutex m;
  for (size_t i = 0; i < ps.size(); ++i)
    ex.submit(greedy(ps[i], 10), [&, i](RequestUpdate&& u) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      std::lock_guard lk(m);
      Seen& s = seen[i];
      s.updates_after_done += s.done;
      for (auto& c : u.choices) s.tokens.insert(s.tokens.end(), c.tokens.begin(), c.tokens.end());
      if (u.done) {
        s.done = true;
        s.completion_tokens = u.completion_tokens;
      }
    });
  ex.drain();
  std::lock_guard lk(m);
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_TRUE(seen[i].done) << "request " << i << ": drain() returned before its final update";
    EXPECT_EQ(seen[i].updates_after_done, 0) << "request " << i;
    EXPECT_EQ(seen[i].completion_tokens, 10) << "request " << i;
    EXPECT_EQ(seen[i].tokens, alone(ps[i], 10)) << "request " << i;
  }
}

TEST_F(ExecutorTest, PriorityPolicyLetsAnUrgentRequestDisplaceARunningOne) {
  ExecutorOptions opt;
  opt.policy = SchedulePolicy::kPriority;
  opt.max_running = 1;  // one slot: the urgent request must preempt to get in
  Executor ex(*model_, nullptr, opt);
  std::mutex mu;
  std::vector<std::string> order;
  std::atomic<int> low_tokens{0};
  std::atomic<bool> high_submitted{false};
  GenerationResult low_result, high_result;
  auto low = greedy(prompts(1, 9, 20, 20)[0], 100);
  low.priority = 0;
  ex.submit(low, [&](RequestUpdate&& u) {
    for (auto& c : u.choices) {
      low_tokens += int(c.tokens.size());
      low_result.choices.resize(1);
      low_result.choices[0].tokens.insert(low_result.choices[0].tokens.end(), c.tokens.begin(), c.tokens.end());
    }
    if (u.done) {
      std::lock_guard lk(mu);
      order.push_back("low");
    }
    // Hold the executor thread (callbacks run on it, outside its locks) once a few
    // tokens are out, until the urgent request is queued: however fast the steps are,
    // the low request is still running when the high one arrives.
    while (low_tokens >= 3 && !high_submitted) std::this_thread::yield();
  });
  while (low_tokens < 3) std::this_thread::yield();
  auto high = greedy(prompts(1, 10, 10, 10)[0], 5);
  high.priority = 10;
  ex.submit(high, [&](RequestUpdate&& u) {
    high_result.choices.resize(1);
    for (auto& c : u.choices)
      high_result.choices[0].tokens.insert(high_result.choices[0].tokens.end(), c.tokens.begin(), c.tokens.end());
    if (u.done) {
      std::lock_guard lk(mu);
      order.push_back("high");
    }
  });
  high_submitted = true;
  ex.drain();
  EXPECT_EQ(order, (std::vector<std::string>{"high", "low"}));
  EXPECT_EQ(high_result.choices[0].tokens, alone(high.prompt, 5));
  EXPECT_EQ(low_result.choices[0].tokens, alone(low.prompt, 100));  // resumed exactly
  EXPECT_GE(ex.stats().preemptions, 1);
}

TEST_F(ExecutorTest, DrainPastItsTimeoutCancelsWhatIsLeft) {
  Executor ex(*model_, nullptr);
  std::atomic<int> finish{-1};
  ex.submit(greedy({5, 6, 7}, 120), [&](RequestUpdate&& u) {
    for (auto& c : u.choices)
      if (c.finish != FinishReason::kNone) finish = int(c.finish);
    // Slow consumer: 120 tokens take far longer than the 1 ms drain deadline.
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  EXPECT_FALSE(ex.drain(std::chrono::milliseconds(1)));
  EXPECT_EQ(finish, int(FinishReason::kCancelled));
  expect_no_leak(ex);
}

// LlmRunner: a step's TopKLogits outputs are the top k of the logits the same step gives.
TEST_F(ExecutorTest, RunnerTopCandidatesAreTheTopOfTheLogits) {
  LlmRunner a(*model_), b(*model_);
  const int32_t k = a.top_logits_k();
  ASSERT_EQ(k, 64);
  ASSERT_EQ(a.vocab(), model_->info().vocab_size);
  auto ps = prompts(3, 31, 4, 30);
  std::vector<KvSequence> sa(ps.size()), sb(ps.size());
  for (int step = 0; step < 3; ++step) {
    std::vector<StepChunk> ca, cb;
    std::vector<std::vector<int32_t>> feed;
    for (size_t i = 0; i < ps.size(); ++i) feed.push_back(step == 0 ? ps[i] : std::vector<int32_t>{int32_t(7 + step + i)});
    for (size_t i = 0; i < ps.size(); ++i) {
      ca.push_back({&sa[i], feed[i], true});
      cb.push_back({&sb[i], feed[i], true});
    }
    Tensor logits = a.run_chunks_logits(ca);
    StepTopLogits top = b.run_chunks_top(cb);
    ASSERT_EQ(top.ids.dim(0), int64_t(ps.size()));
    for (int64_t r = 0; r < int64_t(ps.size()); ++r) {
      std::vector<float> values(static_cast<size_t>(k)), logprobs(static_cast<size_t>(k));
      std::vector<int32_t> ids(static_cast<size_t>(k));
      cpu::topk_logits(logits.data_as<float>() + r * a.vocab(), 1, a.vocab(), k, values.data(), ids.data(),
                       logprobs.data());
      TopLogits t = top.row(r);
      for (int32_t j = 0; j < k; ++j) {
        ASSERT_EQ(t.ids[size_t(j)], ids[size_t(j)]) << "step " << step << " row " << r << " entry " << j;
        ASSERT_EQ(t.logits[size_t(j)], values[size_t(j)]);
        ASSERT_EQ(t.logprobs[size_t(j)], logprobs[size_t(j)]);
      }
    }
  }
  for (size_t i = 0; i < ps.size(); ++i) {
    a.kv_manager().free(sa[i]);
    b.kv_manager().free(sb[i]);
  }
}

// The executor with and without TopKLogits steps: the same tokens and logprobs, bit for
// bit, for greedy, top-k (+ top-p/min-p) and n > 1; a top-p-only request falls back to
// whole rows for the steps it is in.
// Sampling on the thread pool (forced) or on the executor's thread (the default for rows of
// top candidates) draws the same tokens and logprobs: each row has its own sampler and seed.
TEST_F(ExecutorTest, PoolAndSerialSamplingDrawTheSameTokens) {
  auto ps = prompts(12, 31, 4, 30);
  auto run = [&](size_t parallel_values) {
    ExecutorOptions opt;
    opt.parallel_sample_values = parallel_values;
    Executor ex(*model_, nullptr, opt);
    std::vector<uint64_t> ids;
    std::vector<GenerationResult> out(ps.size());
    std::mutex mu;
    std::condition_variable cv;
    size_t done = 0;
    for (size_t i = 0; i < ps.size(); ++i) {
      GenerationRequest r = greedy(ps[i], 12);
      r.sampling.seed = 7 + i;
      r.sampling.temperature = i % 2 ? 0.9f : 0.0f;
      r.sampling.top_k = i % 3 == 1 ? 16 : 0;
      r.sampling.logprobs = 2;
      ex.submit(r, [&, i](RequestUpdate&& u) {
        std::lock_guard lk(mu);
        for (auto& c : u.choices) {
          out[i].choices.resize(std::max(out[i].choices.size(), size_t(c.index) + 1));
          auto& dst = out[i].choices[size_t(c.index)];
          dst.tokens.insert(dst.tokens.end(), c.tokens.begin(), c.tokens.end());
          for (auto& lp : c.logprobs) dst.logprobs.push_back(lp);
        }
        if (u.done) {
          ++done;
          cv.notify_all();
        }
      });
    }
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return done == ps.size(); });
    return out;
  };
  const auto pool = run(0), serial = run(size_t(1) << 40);
  for (size_t i = 0; i < ps.size(); ++i) {
    ASSERT_EQ(pool[i].choices.size(), 1u) << i;
    ASSERT_EQ(serial[i].choices.size(), 1u) << i;
    EXPECT_EQ(pool[i].choices[0].tokens.size(), 12u) << i;
    EXPECT_EQ(pool[i].choices[0].tokens, serial[i].choices[0].tokens) << "request " << i;
    ASSERT_EQ(pool[i].choices[0].logprobs.size(), serial[i].choices[0].logprobs.size()) << i;
    // Which requests share a step depends on when the executor thread picks them up, and
    // another batch can move a logit in its last bits (seen once in ~30 runs): the log-probs
    // agree to rounding, the draws exactly.
    for (size_t j = 0; j < pool[i].choices[0].logprobs.size(); ++j)
      EXPECT_NEAR(pool[i].choices[0].logprobs[j].logprob, serial[i].choices[0].logprobs[j].logprob, 1e-5)
          << i << " " << j;
  }
}

// Decode steps padded to a bucket (LlmRunnerOptions::decode_buckets): the same logits
// and top candidates as unpadded steps, no KV block taken by the pad rows; the warm-ups
// run each bucket and prefill size without changing the pool; the executor padded on the CPU (forced)
// gives each request's tokens alone.
TEST_F(ExecutorTest, PaddedDecodeStepsGiveTheUnpaddedOutputs) {
  EXPECT_EQ(decode_row_buckets(1), (std::vector<int64_t>{1}));
  EXPECT_EQ(decode_row_buckets(5), (std::vector<int64_t>{1, 2, 4, 8}));
  const auto b64 = decode_row_buckets(64);
  EXPECT_EQ(b64.size(), 11u);
  EXPECT_EQ(b64.back(), 64);
  const auto b300 = decode_row_buckets(300);
  EXPECT_EQ(std::vector<int64_t>(b300.end() - 4, b300.end()), (std::vector<int64_t>{256, 272, 288, 304}));
  EXPECT_EQ(decode_row_buckets(1 << 16).back(), kMaxDecodeBucket);  // larger steps run unpadded
  EXPECT_EQ(decode_row_buckets(1 << 16).size(), 3u + 32u + 16u);

  LlmRunnerOptions padded_opt;
  padded_opt.decode_buckets = {4, 8};
  padded_opt.max_step_tokens = 48;
  LlmRunner plain(*model_), padded(*model_, padded_opt);
  const int32_t free0 = padded.kv().allocator().num_free();
  // Buckets 4 and 8 (the first >= 6), two output variants, eager + captured: 8 steps.
  EXPECT_EQ(padded.warm_decode_buckets(6), 8);
  // Prefills of 2, 4, 8, 16, 32 and 48 tokens (max_step_tokens).
  EXPECT_EQ(padded.warm_prefill_sizes(), 6);
  EXPECT_EQ(padded.kv().allocator().num_free(), free0);
  auto ps = prompts(5, 41, 3, 20);
  std::vector<KvSequence> sa(ps.size()), sb(ps.size());
  for (int step = 0; step < 5; ++step) {
    // Steps 1-2 decode all five sequences (padded to 8), steps 3-4 the first three (to 4).
    const size_t n = step < 3 ? ps.size() : 3;
    std::vector<StepChunk> ca, cb;
    std::vector<std::vector<int32_t>> feed;
    for (size_t i = 0; i < n; ++i) feed.push_back(step == 0 ? ps[i] : std::vector<int32_t>{int32_t(11 + step + i)});
    for (size_t i = 0; i < n; ++i) {
      ca.push_back({&sa[i], feed[i], true});
      cb.push_back({&sb[i], feed[i], true});
    }
    const bool top = step % 2 == 1;
    if (top) {
      StepTopLogits ta = plain.run_chunks_top(ca, 1), tb = padded.run_chunks_top(cb, 1);
      ASSERT_EQ(tb.ids.shape(), ta.ids.shape()) << "step " << step;
      for (int64_t r = 0; r < ta.ids.dim(0); ++r) {
        EXPECT_EQ(tb.row(r).ids[0], ta.row(r).ids[0]) << "step " << step << " row " << r;
        EXPECT_NEAR(tb.row(r).logprobs[0], ta.row(r).logprobs[0], 1e-4) << "step " << step << " row " << r;
      }
    } else {
      Tensor la = plain.run_chunks_logits(ca), lb = padded.run_chunks_logits(cb);
      ASSERT_EQ(lb.shape(), la.shape()) << "step " << step;
      for (int64_t i = 0; i < la.numel(); ++i)
        ASSERT_NEAR(lb.data_as<float>()[i], la.data_as<float>()[i], 1e-4) << "step " << step << " value " << i;
    }
    EXPECT_EQ(padded.kv().allocator().num_free(), plain.kv().allocator().num_free()) << "step " << step;
  }
  for (size_t i = 0; i < ps.size(); ++i) {
    plain.kv_manager().free(sa[i]);
    padded.kv_manager().free(sb[i]);
  }

  auto qs = prompts(7, 43, 1, 30);
  ExecutorOptions opt;
  opt.max_step_tokens = 40;
  opt.decode_padding = DecodePadding::kOn;
  Executor ex(*model_, nullptr, opt);
  std::vector<GenerationRequest> reqs;
  for (size_t i = 0; i < qs.size(); ++i) reqs.push_back(greedy(qs[i], 6 + int32_t(i % 3) * 3));
  auto got = run_concurrently(ex, reqs);
  for (size_t i = 0; i < qs.size(); ++i) {
    ASSERT_EQ(got[i].error, "");
    EXPECT_EQ(got[i].choices.at(0).tokens, alone(qs[i], reqs[i].max_tokens)) << "request " << i;
  }
  expect_no_leak(ex);
}

TEST_F(ExecutorTest, TopLogitsStepsGiveTheSameOutputsAsWholeRows) {
  auto ps = prompts(8, 21, 5, 40);
  std::vector<GenerationRequest> reqs;
  for (size_t i = 0; i < ps.size(); ++i) {
    GenerationRequest r = greedy(ps[i], 10);
    r.sampling.seed = 100 + i;
    if (i % 4 == 1) {
      r.sampling.temperature = 0.8f;
      r.sampling.top_k = 20;
    }
    if (i % 4 == 2) {
      r.sampling.temperature = 1.2f;
      r.sampling.top_k = 64;
      r.sampling.top_p = 0.9f;
      r.sampling.min_p = 0.02f;
      r.n = 2;
    }
    if (i % 4 == 3) {
      r.sampling.temperature = 1.0f;
      r.sampling.top_p = 0.8f;  // needs whole rows
    }
    r.sampling.logprobs = int32_t(i % 3) * 2;
    reqs.push_back(r);
  }
  auto run = [&](bool top) {
    ExecutorOptions opt;
    opt.top_logits = top;
    Executor ex(*model_, nullptr, opt);
    std::vector<GenerationResult> out;
    for (auto& r : reqs) out.push_back(ex.generate(r));  // one at a time: the same batches
    ExecutorStats st = ex.stats();
    if (top) {
      EXPECT_GT(st.top_logits_steps, 0);
      EXPECT_LT(st.top_logits_steps, st.steps);  // the top-p-only requests' steps
    } else {
      EXPECT_EQ(st.top_logits_steps, 0);
    }
    return out;
  };
  auto whole = run(false), top = run(true);
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_EQ(whole[i].error, "");
    ASSERT_EQ(top[i].error, "");
    ASSERT_EQ(whole[i].choices.size(), top[i].choices.size());
    for (size_t c = 0; c < whole[i].choices.size(); ++c) {
      const auto& w = whole[i].choices[c];
      const auto& t = top[i].choices[c];
      EXPECT_EQ(w.tokens, t.tokens) << "request " << i << " choice " << c;
      ASSERT_EQ(w.logprobs.size(), t.logprobs.size());
      for (size_t j = 0; j < w.logprobs.size(); ++j) {
        EXPECT_EQ(w.logprobs[j].logprob, t.logprobs[j].logprob) << "request " << i << " token " << j;
        ASSERT_EQ(w.logprobs[j].top.size(), t.logprobs[j].top.size());
        for (size_t a = 0; a < w.logprobs[j].top.size(); ++a) {
          EXPECT_EQ(w.logprobs[j].top[a].token, t.logprobs[j].top[a].token);
          EXPECT_EQ(w.logprobs[j].top[a].logprob, t.logprobs[j].top[a].logprob);
        }
      }
    }
  }
  // Concurrent, mixed with a request that needs whole rows: greedy still equals alone.
  ExecutorOptions opt;
  opt.max_step_tokens = 48;
  Executor ex(*model_, nullptr, opt);
  std::vector<GenerationRequest> mixed;
  for (size_t i = 0; i < 4; ++i) mixed.push_back(greedy(ps[i], 12));
  mixed.push_back(reqs[3]);
  auto got = run_concurrently(ex, mixed);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(got[i].choices[0].tokens, alone(ps[i], 12)) << "request " << i;
  expect_no_leak(ex);
}

// ---- KV pool sizing from free memory ----------------------------------------------------

// The fixture's KV block: 2 layers x K and V x 16 tokens x 2 heads x 16 dims x 4 bytes.
constexpr size_t kFixtureBlockBytes = 2 * 2 * 16 * 2 * 16 * 4;

std::function<DeviceMemory(Backend&)> fake_free(size_t bytes, int* calls = nullptr) {
  return [bytes, calls](Backend&) {
    if (calls) ++*calls;
    return DeviceMemory{bytes, bytes * 2, "cpu"};
  };
}

TEST_F(ExecutorTest, PoolTakesItsFractionOfFreeMemoryPerBlock) {
  auto blocks_for = [&](size_t free_bytes, double fraction) {
    LlmRunnerOptions o;
    o.max_total_tokens = 0;  // no cap
    o.kv_cache_fraction = fraction;
    int calls = 0;
    o.device_memory = fake_free(free_bytes, &calls);
    LlmRunner r(*model_, o);
    EXPECT_EQ(calls, 1);
    return int64_t(r.kv().allocator().num_blocks());
  };
  const size_t base = size_t(256) << 20;
  const int64_t b0 = blocks_for(base, 0.5);
  // The activation arena still to come (planned at 2048 step tokens, a few MiB here) is
  // left out of what the fraction applies to.
  EXPECT_LT(b0, int64_t(0.5 * double(base) / double(kFixtureBlockBytes)));
  EXPECT_GT(b0, int64_t(0.45 * double(base) / double(kFixtureBlockBytes)));
  // With x = (free - activations) / block bytes the pool is floor(F x) blocks, so each
  // further 2 blocks' bytes of free memory is one more block at F = 0.5, and F = 0.25
  // with 4 blocks' bytes more gives floor(x / 4) + 1 = floor(b0 / 2) + 1 (floored twice).
  EXPECT_EQ(blocks_for(base + 2 * 1000 * kFixtureBlockBytes, 0.5), b0 + 1000);
  EXPECT_EQ(blocks_for(base + 4 * kFixtureBlockBytes, 0.25), b0 / 2 + 1);
}

TEST_F(ExecutorTest, FlagCapsAndDefaults) {
  // Capped by what the options ask for when that is less.
  LlmRunnerOptions o;
  o.max_total_tokens = 160;
  o.kv_cache_fraction = 0.9;
  o.device_memory = fake_free(size_t(1) << 30);
  EXPECT_EQ(LlmRunner(*model_, o).kv().allocator().num_blocks(), 10);
  // Without the flag, today's sizes, and no memory query.
  ExecutorOptions eo;
  int calls = 0;
  eo.device_memory = fake_free(1, &calls);
  {
    Executor ex(*model_, nullptr, eo);
    EXPECT_EQ(ex.stats().kv_blocks_total, 16384 / 16);
  }
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(LlmRunner(*model_).kv().allocator().num_blocks(), 8192 / 16);
  // An executor sized by the fraction with no cap serves the model's whole context.
  eo.kv_cache_fraction = 0.5;
  eo.kv_tokens = 0;
  eo.device_memory = fake_free(size_t(8) << 20, &calls);
  Executor ex(*model_, nullptr, eo);
  EXPECT_EQ(calls, 1);
  EXPECT_GT(ex.stats().kv_blocks_total, 128);
  EXPECT_LE(ex.stats().kv_blocks_total, int64_t((size_t(4) << 20) / kFixtureBlockBytes));
  EXPECT_EQ(ex.max_context(), model_->info().max_positions);
  auto p = prompts(1, 41, 30, 30)[0];
  EXPECT_EQ(ex.generate(greedy(p, 10)).choices[0].tokens, alone(p, 10));
}

TEST_F(ExecutorTest, PoolTooSmallForOneRequestIsAClearError) {
  ExecutorOptions eo;
  eo.kv_cache_fraction = 0.5;
  eo.kv_tokens = 0;
  // Half of 64 KiB is 4 blocks at most; 9 are needed (128 positions in blocks of 16,
  // plus the spare).
  eo.device_memory = fake_free(size_t(64) << 10);
  try {
    Executor ex(*model_, nullptr, eo);
    ADD_FAILURE() << "an executor that cannot hold one request was built";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
    const std::string m = e.what();
    for (const char* part : {"needs 9 blocks of 16 tokens", " MiB", "raise --kv-cache-fraction", "free on cpu"})
      EXPECT_NE(m.find(part), std::string::npos) << part << " not in: " << m;
  }
  eo.kv_cache_fraction = 1.5;
  EXPECT_THROW(Executor(*model_, nullptr, eo), Error);
  eo.kv_cache_fraction = 0;  // kv_tokens 0 without a fraction: no pool at all
  EXPECT_THROW(Executor(*model_, nullptr, eo), Error);
}

// ---- preemption by swap ----------------------------------------------------------------

ExecutorOptions small_pool(PreemptionMode mode, int64_t swap_blocks, bool prefix_caching) {
  ExecutorOptions opt;
  opt.kv_tokens = 128;  // 8 blocks of 16: far less than 8 sequences of ~60 tokens
  opt.max_step_tokens = 64;
  opt.prefix_caching = prefix_caching;
  opt.preemption = mode;
  opt.swap_space_bytes = swap_blocks * int64_t(kFixtureBlockBytes);
  return opt;
}

TEST_F(ExecutorTest, SwapPreemptionUnderASmallPoolKeepsOutputsExact) {
  auto ps = prompts(8, 2, 20, 40);
  for (bool prefix_caching : {false, true}) {
    SCOPED_TRACE(prefix_caching ? "prefix caching" : "no prefix caching");
    Executor ex(*model_, nullptr, small_pool(PreemptionMode::kSwap, 64, prefix_caching));
    EXPECT_EQ(ex.stats().swap_blocks_total, 64);
    std::vector<GenerationRequest> reqs;
    for (auto& p : ps) reqs.push_back(greedy(p, 24));
    auto got = run_all_at_once(ex, reqs);
    for (size_t i = 0; i < ps.size(); ++i) {
      ASSERT_EQ(got[i].error, "") << "request " << i;
      EXPECT_EQ(got[i].choices[0].tokens, alone(ps[i], 24)) << "request " << i;
    }
    ExecutorStats s = settled_stats(ex);
    EXPECT_GT(s.swapped_out, 0);
    EXPECT_EQ(s.swapped_in, s.swapped_out);  // every swapped sequence came back by swap
    EXPECT_EQ(s.swap_fallbacks, 0);
    EXPECT_GT(s.swap_out_bytes, 0);
    EXPECT_EQ(s.swap_out_bytes % int64_t(kFixtureBlockBytes), 0);
    EXPECT_GT(s.swap_in_bytes, 0);
    EXPECT_LE(s.swap_in_bytes, s.swap_out_bytes);
    if (!prefix_caching) {
      EXPECT_EQ(s.swap_in_bytes, s.swap_out_bytes);
    }
    EXPECT_EQ(s.swap_blocks_used, 0);
    EXPECT_EQ(s.kv_blocks_free + s.kv_blocks_cached, s.kv_blocks_total) << "blocks leaked";
  }
}

TEST_F(ExecutorTest, FullSwapSpaceFallsBackToRecomputeWithExactOutputs) {
  auto ps = prompts(8, 2, 20, 40);
  // One slot: only a victim of one block fits (prompts of 20-40 tokens take two or
  // more once prefilled); none: no victim does.
  for (int64_t slots : {1, 0}) {
    SCOPED_TRACE(slots);
    Executor ex(*model_, nullptr, small_pool(PreemptionMode::kSwap, slots, false));
    std::vector<GenerationRequest> reqs;
    for (auto& p : ps) reqs.push_back(greedy(p, 24));
    auto got = run_all_at_once(ex, reqs);
    for (size_t i = 0; i < ps.size(); ++i) {
      ASSERT_EQ(got[i].error, "") << "request " << i;
      EXPECT_EQ(got[i].choices[0].tokens, alone(ps[i], 24)) << "request " << i;
    }
    ExecutorStats s = settled_stats(ex);
    EXPECT_GT(s.swap_fallbacks, 0);
    EXPECT_LE(s.swapped_out + s.swap_fallbacks, s.preemptions);
    if (slots == 0) {
      EXPECT_EQ(s.swapped_out, 0);
    }
    EXPECT_EQ(s.swap_blocks_used, 0);
    EXPECT_EQ(s.kv_blocks_free + s.kv_blocks_cached, s.kv_blocks_total) << "blocks leaked";
  }
}

// One slot running: an urgent request displaces (swaps out) the running one. Resumed,
// the swapped request continues exactly; cancelled while swapped out, its host slots
// are freed.
TEST_F(ExecutorTest, SwappedOutRequestsResumeExactlyOrFreeTheirHostSpaceWhenCancelled) {
  for (bool cancel : {false, true}) {
    SCOPED_TRACE(cancel ? "cancel while swapped out" : "resume");
    ExecutorOptions opt;
    opt.policy = SchedulePolicy::kPriority;
    opt.max_running = 1;
    opt.preemption = PreemptionMode::kSwap;
    opt.swap_space_bytes = 32 * int64_t(kFixtureBlockBytes);
    Executor ex(*model_, nullptr, opt);
    std::atomic<int> low_tokens{0};
    std::atomic<bool> high_submitted{false}, cancel_sent{false}, low_done{false};
    std::atomic<int> low_finish{-1};
    std::vector<int32_t> low_out, high_out;
    auto low = greedy(prompts(1, 9, 20, 20)[0], 60);
    uint64_t low_id = ex.submit(low, [&](RequestUpdate&& u) {
      for (auto& c : u.choices) {
        low_tokens += int(c.tokens.size());
        low_out.insert(low_out.end(), c.tokens.begin(), c.tokens.end());
        if (c.finish != FinishReason::kNone) low_finish = int(c.finish);
      }
      if (u.done) low_done = true;
      // Hold the executor thread until the urgent request is queued (see the priority test).
      while (low_tokens >= 3 && !high_submitted) std::this_thread::yield();
    });
    while (low_tokens < 3) std::this_thread::yield();
    auto high = greedy(prompts(1, 10, 10, 10)[0], 8);
    high.priority = 10;
    std::atomic<int> high_tokens{0};
    ex.submit(high, [&](RequestUpdate&& u) {
      for (auto& c : u.choices) high_out.insert(high_out.end(), c.tokens.begin(), c.tokens.end());
      high_tokens += 1;
      // The low request is swapped out while this one runs: hold here until it is cancelled.
      while (cancel && !cancel_sent) std::this_thread::yield();
    });
    high_submitted = true;
    if (cancel) {
      while (high_tokens < 1) std::this_thread::yield();
      ex.cancel(low_id);
      cancel_sent = true;
    }
    ex.drain();
    ExecutorStats s = settled_stats(ex);
    EXPECT_EQ(high_out, alone(high.prompt, 8));
    EXPECT_EQ(s.swapped_out, 1);
    EXPECT_EQ(s.swap_blocks_used, 0);
    EXPECT_EQ(s.kv_blocks_free + s.kv_blocks_cached, s.kv_blocks_total) << "blocks leaked";
    if (cancel) {
      EXPECT_EQ(low_finish, int(FinishReason::kCancelled));
      EXPECT_EQ(s.swapped_in, 0);
      EXPECT_EQ(s.requests_cancelled, 1);
    } else {
      EXPECT_EQ(low_out, alone(low.prompt, 60));
      EXPECT_EQ(s.swapped_in, 1);
    }
  }
}

// Two choices sampled at temperature 1 from a fixed prompt (the constrained-decoding tests).
GenerationRequest sampled_pair(uint64_t seed, int32_t max_tokens) {
  GenerationRequest r;
  r.prompt = {5, 17, 33, 250, 9};
  r.max_tokens = max_tokens;
  r.n = 2;
  r.sampling.temperature = 1.0f;
  r.sampling.seed = seed;
  return r;
}

// response_format json_object (the grammar of {"type": "object"}): sampled choices (a random
// model, temperature 1) whose every token continues one JSON object; those that end before max_tokens end as the object closes,
// and nlohmann's parser (an independent one) takes their text as an object. A bias toward '}'
// makes most of them close; a finished choice's text is the object, nothing after it.
TEST_F(ExecutorTest, JsonObjectChoicesAreJson) {
  const tok::Tokenizer tokenizer = tok::Tokenizer::from_hf_json(json_test_tokenizer());
  ASSERT_EQ(tokenizer.vocab_size(), 512u);
  Executor ex(*model_, &tokenizer);
  int closed = 0, total = 0;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    GenerationRequest r = sampled_pair(seed, 40);
    r.sampling.logit_bias = {{tokenizer.token_to_id("}"), 4.0f}, {tokenizer.token_to_id("\""), 2.0f}};
    r.json_object = true;
    const GenerationResult out = ex.generate(r);
    ASSERT_TRUE(out.error.empty()) << out.error;
    for (const auto& c : out.choices) {
      ++total;
      const std::string text = tokenizer.decode(c.tokens);
      EXPECT_EQ(text, c.text);
      if (c.finish == FinishReason::kStop) {
        ++closed;
        bool parsed = false;
        try {
          parsed = nlohmann::json::parse(text).is_object();
        } catch (const nlohmann::json::exception& e) {
          ADD_FAILURE() << "not JSON: " << text << " (" << e.what() << ")";
        }
        EXPECT_TRUE(parsed) << text;
        EXPECT_EQ(text.back(), '}') << text;
      } else {
        EXPECT_EQ(c.finish, FinishReason::kLength) << text;
        EXPECT_EQ(c.tokens.size(), 40u);
        GrammarState prefix(grammar_from_json_schema(nlohmann::ordered_json{{"type", "object"}}));
        EXPECT_TRUE(prefix.accept(text)) << "an unfinished choice is still an object's prefix: " << text;
      }
    }
  }
  EXPECT_GE(closed, total / 2) << closed << " of " << total << " choices closed their object";
  expect_no_leak(ex);
}

// Grammar-constrained choices (a JSON Schema's, a GBNF one) of a random model at temperature 1:
// every choice that ends by itself is a document of the grammar - nlohmann's parser takes the
// schema's as an object with exactly its keys and value types - and one cut by max_tokens is
// a prefix of one. The end token is allowed only once the document is complete.
TEST_F(ExecutorTest, GrammarChoicesFollowTheirGrammar) {
  const tok::Tokenizer tokenizer = tok::Tokenizer::from_hf_json(json_test_tokenizer());
  Executor ex(*model_, &tokenizer);
  const auto schema = nlohmann::ordered_json::parse(R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 6}, "ok": {"type": "boolean"}, "n": {"type": "integer"},
      "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
      "required": ["name", "ok", "n"], "additionalProperties": false})");
  const std::shared_ptr<const Grammar> json_grammar = grammar_from_json_schema(schema);
  int closed = 0, total = 0;
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    GenerationRequest r = sampled_pair(seed, 60);
    r.grammar = json_grammar;
    const GenerationResult out = ex.generate(r);
    ASSERT_TRUE(out.error.empty()) << out.error;
    for (const auto& c : out.choices) {
      ++total;
      const std::string text = tokenizer.decode(c.tokens);
      if (c.finish == FinishReason::kStop) {
        ++closed;
        nlohmann::ordered_json j;
        try {
          j = nlohmann::ordered_json::parse(text);
        } catch (const nlohmann::json::exception& e) {
          ADD_FAILURE() << "not JSON: " << text << " (" << e.what() << ")";
          continue;
        }
        ASSERT_TRUE(j.is_object()) << text;
        size_t chars = 0;  // UTF-8 characters: the bytes that are not continuation bytes
        if (j["name"].is_string())
          for (unsigned char b : j["name"].get<std::string>()) chars += (b & 0xC0) != 0x80;
        EXPECT_TRUE(j["name"].is_string() && chars <= 6) << text;
        EXPECT_TRUE(j["ok"].is_boolean()) << text;
        EXPECT_TRUE(j["n"].is_number_integer()) << text;
        EXPECT_EQ(j.size(), j.contains("tags") ? 4u : 3u) << text;
        if (j.contains("tags")) {
          EXPECT_TRUE(j["tags"].is_array() && j["tags"].size() <= 2) << text;
          for (auto& t : j["tags"]) EXPECT_TRUE(t == "a" || t == "b") << text;
        }
      } else {
        EXPECT_EQ(c.finish, FinishReason::kLength) << text;
        GrammarState prefix(json_grammar);
        EXPECT_TRUE(prefix.accept(text)) << "an unfinished choice is still a prefix: " << text;
      }
    }
  }
  EXPECT_GE(closed, 1) << "no choice completed its document in 60 tokens";
  std::printf("  JSON schema: %d of %d choices completed their document\n", closed, total);
  // A GBNF grammar of two words: every choice is one of them, ended as it completes.
  GenerationRequest r;
  r.prompt = {5, 17, 33};
  r.max_tokens = 10;
  r.n = 4;
  r.sampling.temperature = 1.0f;
  r.sampling.seed = 3;
  r.grammar = grammar_from_gbnf(R"(root ::= "yes" | "no" | "maybe")");
  const GenerationResult words = ex.generate(r);
  ASSERT_TRUE(words.error.empty()) << words.error;
  for (const auto& c : words.choices) {
    const std::string text = tokenizer.decode(c.tokens);
    EXPECT_TRUE(text == "yes" || text == "no" || text == "maybe") << text;
    EXPECT_EQ(c.finish, FinishReason::kStop);
  }
  // Without a tokenizer a grammar is refused.
  Executor plain(*model_, nullptr);
  EXPECT_THROW(plain.generate(r), Error);
  // A grammar too ambiguous to mask within GrammarTokenMask::kMaxMaskWork fails its request
  // with a message; the executor goes on serving others.
  r.n = 1;
  r.grammar = grammar_from_gbnf(R"(root ::= ("" | [a-y]){0,300} "z")");
  const GenerationResult costly = ex.generate(r);
  EXPECT_NE(costly.error.find("too ambiguous"), std::string::npos) << costly.error;
  EXPECT_EQ(costly.choices.at(0).finish, FinishReason::kError);
  EXPECT_EQ(ex.generate(greedy({5, 6, 7}, 3)).choices[0].tokens.size(), 3u);
  expect_no_leak(ex);
}

// Prompt logprobs (OpenAI's echo with logprobs) against transformers' logits of the same
// prompt: the prompt is prefilled in chunks of a few tokens, beside other requests'
// decodes, after the same prompt filled the prefix cache (which must then not be
// reused); max_tokens 0 returns the prompt's logprobs alone.
TEST_F(ExecutorTest, PromptLogprobsAreTransformersLogSoftmax) {
  const testing::Reference ref("llama");
  const auto prompt = ref.prompts().at(2);
  const auto logits = ref.f32("logits");  // [3, Smax, V]
  const int64_t smax = ref.shape("logits")[1], vocab = ref.shape("logits")[2];
  ASSERT_EQ(prompt.size(), 16u);
  // log_softmax of the reference row at position q of prompt 2.
  auto ref_logprob = [&](size_t q, int32_t token) {
    const float* x = logits.data() + (2 * smax + int64_t(q)) * vocab;
    double mx = *std::max_element(x, x + vocab), sum = 0;
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double(x[v]) - mx);
    return double(x[token]) - mx - std::log(sum);
  };
  auto check = [&](const GenerationResult& res, int32_t top_n) {
    ASSERT_EQ(res.prompt_logprobs.size(), prompt.size() - 1);
    double worst = 0;
    for (size_t q = 0; q + 1 < prompt.size(); ++q) {
      const SampledToken& lp = res.prompt_logprobs[q];
      worst = std::max(worst, std::fabs(lp.logprob - ref_logprob(q, prompt[q + 1])));
      EXPECT_EQ(lp.token, prompt[q + 1]);
      EXPECT_NEAR(lp.logprob, ref_logprob(q, prompt[q + 1]), 1e-4) << "prompt token " << q + 1;
      ASSERT_EQ(lp.top.size(), size_t(top_n));
      double best = -INFINITY;
      for (int64_t v = 0; v < vocab; ++v) best = std::max(best, ref_logprob(q, int32_t(v)));
      if (top_n > 0) {
        EXPECT_NEAR(lp.top[0].logprob, best, 1e-4);
      }
      for (size_t k = 0; k < lp.top.size(); ++k) {
        EXPECT_NEAR(lp.top[k].logprob, ref_logprob(q, lp.top[k].token), 1e-4);
        if (k > 0) {
          EXPECT_LE(lp.top[k].logprob, lp.top[k - 1].logprob);
        }
      }
    }
    std::printf("  prompt logprobs (top %d) max|err| vs transformers %.3g\n", top_n, worst);
  };
  ExecutorOptions opt;
  opt.max_step_tokens = 6;  // the 16-token prompt takes three steps
  opt.kv_tokens = 256;
  opt.block_size = 4;  // blocks the 16-token prompt can share
  Executor ex(*model_, nullptr, opt);

  GenerationRequest only = greedy(prompt, 0);
  only.prompt_logprobs = 3;
  GenerationResult a = ex.generate(only);
  ASSERT_TRUE(a.error.empty()) << a.error;
  check(a, 3);
  ASSERT_EQ(a.choices.size(), 1u);
  EXPECT_TRUE(a.choices[0].tokens.empty());
  EXPECT_EQ(a.choices[0].finish, FinishReason::kLength);
  EXPECT_EQ(a.completion_tokens, 0);

  // The prompt's blocks are in the prefix cache now; other requests decode meanwhile.
  const auto others = prompts(3, 11, 3, 9);
  std::vector<GenerationRequest> reqs;
  for (auto& p : others) reqs.push_back(greedy(p, 12));
  GenerationRequest with = greedy(prompt, 5);
  with.prompt_logprobs = 0;
  reqs.push_back(with);
  auto results = run_concurrently(ex, reqs);
  for (size_t i = 0; i < others.size(); ++i) EXPECT_EQ(results[i].choices[0].tokens, alone(others[i], 12));
  const GenerationResult& b = results.back();
  check(b, 0);
  EXPECT_EQ(b.cached_tokens, 0);
  const auto greedy_ref = ref.ids("greedy");  // [3, 20]
  EXPECT_EQ(b.choices[0].tokens, std::vector<int32_t>(greedy_ref.begin() + 40, greedy_ref.begin() + 45));
  // Without prompt logprobs the same prompt reuses the cached blocks again.
  GenerationResult c = ex.generate(greedy(prompt, 5));
  EXPECT_GT(c.cached_tokens, 0);
  EXPECT_TRUE(c.prompt_logprobs.empty());
  EXPECT_EQ(c.choices[0].tokens, b.choices[0].tokens);
  expect_no_leak(ex);
}

}  // namespace
}  // namespace kiln
