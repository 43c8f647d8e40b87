// Tensor parallelism through the serving executor: for each tiny golden decoder, a
// model loaded with tensor_parallel = 2 and 4 (ranks as threads, one block allocator
// driving every rank's KV pool) gives TP=1's tokens for concurrent requests, including
// prefix-sharing ones, n > 1 (greedy and seeded), sessions, padded decode steps and preemption (recompute
// and swap) under a small pool, and leaks no block; bad tensor_parallel values are errors naming the cause.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include "../models/golden_util.h"
#include "core/status.h"
#include "frontends/hf_dir.h"
#include "runtime/executor.h"
#include "../runtime/executor_test_util.h"

namespace kiln {
namespace {

using test_exec::run_all_at_once;
using test_exec::settled_stats;

std::vector<int32_t> random_ids(std::mt19937& rng, int len) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back(int32_t(3 + rng() % 500));
  return p;
}

GenerationRequest greedy(std::vector<int32_t> prompt, int32_t max_tokens, int32_t n = 1) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.n = n;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  return r;
}

std::vector<GenerationResult> run_concurrently(Executor& ex, const std::vector<GenerationRequest>& reqs) {
  std::vector<GenerationResult> out(reqs.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < reqs.size(); ++i) threads.emplace_back([&, i] { out[i] = ex.generate(reqs[i]); });
  for (auto& t : threads) t.join();
  return out;
}

// One workload, run on a model: concurrent mixed requests, then prefix-sharing and
// session turns, then n > 1 (greedy and seeded).
struct Outcome {
  std::vector<std::vector<std::vector<int32_t>>> tokens;  // per request, per choice
  ExecutorStats stats;
};

Outcome run_workload(Model& model, DecodePadding padding = DecodePadding::kAuto) {
  std::mt19937 rng(11);
  ExecutorOptions opt;
  opt.max_step_tokens = 32;  // chunked prefill mixed with decodes
  opt.decode_padding = padding;  // the CPU: auto is off
  Executor ex(model, nullptr, opt);
  Outcome o;
  auto collect = [&](const std::vector<GenerationResult>& rs) {
    for (auto& r : rs) {
      EXPECT_EQ(r.error, "");
      std::vector<std::vector<int32_t>> choices;
      for (auto& c : r.choices) choices.push_back(c.tokens);
      o.tokens.push_back(choices);
    }
  };
  // A shared 40-token "system prompt" followed by different questions.
  const std::vector<int32_t> system = random_ids(rng, 40);
  std::vector<GenerationRequest> batch;
  for (int i = 0; i < 6; ++i) batch.push_back(greedy(random_ids(rng, 1 + int(rng() % 40)), 6 + i));
  for (int i = 0; i < 3; ++i) {
    auto p = system;
    auto q = random_ids(rng, 3 + i);
    p.insert(p.end(), q.begin(), q.end());
    batch.push_back(greedy(p, 8));
  }
  batch.push_back(greedy(random_ids(rng, 25), 7, 3));  // n = 3 forks after the prefill
  collect(run_concurrently(ex, batch));
  // The system prompt again, now from the prefix cache.
  auto again = system;
  again.push_back(9);
  collect({ex.generate(greedy(again, 6))});
  // A session's second turn reuses its first turn's KV.
  auto turn1 = greedy(random_ids(rng, 21), 5);
  turn1.session_id = "chat";
  auto r1 = ex.generate(turn1);
  collect({r1});
  auto turn2 = turn1;
  turn2.prompt.insert(turn2.prompt.end(), r1.choices[0].tokens.begin(), r1.choices[0].tokens.end());
  turn2.prompt.insert(turn2.prompt.end(), {7, 8, 9});
  collect({ex.generate(turn2)});
  // Seeded sampling with n = 2: the same draws from (nearly) the same distributions.
  GenerationRequest sampled = greedy(random_ids(rng, 12), 6, 2);
  sampled.sampling.temperature = 0.8f;
  sampled.sampling.seed = 7;
  collect({ex.generate(sampled)});
  o.stats = settled_stats(ex);
  return o;
}

class TpExecutor : public ::testing::TestWithParam<std::string> {};

TEST_P(TpExecutor, ShardedRanksGiveTheUnshardedTokens) {
  const std::string name = GetParam();
  auto one = Model::load(testing::fixture_dir(name));
  const Outcome want = run_workload(*one);
  for (int world : {2, 4}) {
    ModelOptions mo;
    mo.tensor_parallel = world;
    auto tp = Model::load(testing::fixture_dir(name), mo);
    ASSERT_EQ(tp->tp_world(), world);
    const Outcome got = run_workload(*tp);
    ASSERT_EQ(got.tokens.size(), want.tokens.size());
    for (size_t i = 0; i < want.tokens.size(); ++i)
      EXPECT_EQ(got.tokens[i], want.tokens[i]) << name << " TP=" << world << " request " << i;
    EXPECT_EQ(got.tokens[9].size(), 3u);
    EXPECT_GT(got.stats.prefix_hit_blocks, 0) << name << " TP=" << world;
    EXPECT_EQ(got.stats.session_hits, 1) << name << " TP=" << world;
    // One allocator made the same decisions as the unsharded run's: nothing leaked.
    EXPECT_EQ(got.stats.kv_blocks_free, want.stats.kv_blocks_free) << name << " TP=" << world;
    EXPECT_EQ(got.stats.kv_blocks_cached, want.stats.kv_blocks_cached) << name << " TP=" << world;
    if (world != 2) continue;
    // Decode steps padded to buckets (pad rows on every rank, warm-up included): the same.
    const Outcome padded = run_workload(*tp, DecodePadding::kOn);
    ASSERT_EQ(padded.tokens.size(), want.tokens.size());
    for (size_t i = 0; i < want.tokens.size(); ++i)
      EXPECT_EQ(padded.tokens[i], want.tokens[i]) << name << " TP=2 padded, request " << i;
    EXPECT_EQ(padded.stats.kv_blocks_free, want.stats.kv_blocks_free) << name << " TP=2 padded";
  }
}

INSTANTIATE_TEST_SUITE_P(Models, TpExecutor, ::testing::Values("llama", "gpt2", "qwen2", "qwen3", "phi3", "gemma3", "mistral", "gemma2"));

TEST(TpExecutorPreemption, SmallPoolPreemptsAndKeepsOutputsExact) {
  auto one = Model::load(testing::fixture_dir("llama"));
  ModelOptions mo;
  mo.tensor_parallel = 2;
  auto tp = Model::load(testing::fixture_dir("llama"), mo);
  std::mt19937 rng(5);
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 6; ++i) reqs.push_back(greedy(random_ids(rng, 20 + int(rng() % 20)), 20));
  ExecutorOptions opt;
  opt.kv_tokens = 128;  // 8 blocks of 16: far less than 6 sequences of ~50 tokens
  opt.max_step_tokens = 64;
  opt.prefix_caching = false;
  Executor want_ex(*one, nullptr, opt);
  auto want = run_all_at_once(want_ex, reqs);
  // Swapping copies each block in every rank's pool (one host slot spans the ranks).
  for (PreemptionMode mode : {PreemptionMode::kRecompute, PreemptionMode::kSwap}) {
    SCOPED_TRACE(preemption_mode_name(mode));
    opt.preemption = mode;
    opt.swap_space_bytes = 1 << 20;
    Executor got_ex(*tp, nullptr, opt);
    auto got = run_all_at_once(got_ex, reqs);
    for (size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_EQ(got[i].error, "") << "request " << i;
      EXPECT_EQ(got[i].choices[0].tokens, want[i].choices[0].tokens) << "request " << i;
    }
    ExecutorStats s = settled_stats(got_ex);
    EXPECT_GT(s.preemptions, 0);
    EXPECT_EQ(s.kv_blocks_free, s.kv_blocks_total);
    if (mode == PreemptionMode::kSwap) {
      EXPECT_EQ(s.swap_blocks_total, 128);  // 1 MiB over two ranks' 4 KiB halves of a block
      EXPECT_GT(s.swapped_out, 0);
      EXPECT_EQ(s.swapped_in, s.swapped_out);
      EXPECT_EQ(s.swap_blocks_used, 0);
    }
  }
}

// A config.json of the Llama fixture's shape with some fields changed, in a temp dir.
std::string llama_config_with(const nlohmann::json& changes) {
  nlohmann::json c = read_json_file(testing::fixture_dir("llama") + "/config.json");
  c.update(changes);
  auto dir = std::filesystem::temp_directory_path() / ("kiln_tp_" + std::to_string(std::hash<std::string>()(changes.dump())));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << c.dump();
  return (dir / "config.json").string();
}

std::string load_error(const std::string& path, int world, bool random = false, const std::string& backend = "cpu") {
  ModelOptions mo;
  mo.tensor_parallel = world;
  mo.backend = backend;
  try {
    if (random) Model::load_random(path, mo);
    else Model::load(path, mo);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TpErrors, IndivisibleDimensionsAndUnsupportedCombinationsAreNamed) {
  auto has = [](const std::string& msg, const std::string& want) {
    EXPECT_NE(msg.find(want), std::string::npos) << "'" << msg << "' should say '" << want << "'";
  };
  has(load_error(testing::fixture_dir("llama"), 3), "4 attention heads do not split over 3 ranks");
  has(load_error(llama_config_with({{"intermediate_size", 126}}), 4, true), "MLP width 126");
  has(load_error(llama_config_with({{"hidden_size", 96}, {"num_attention_heads", 6}, {"num_key_value_heads", 3}}), 2, true),
      "3 K/V heads");
  has(load_error(testing::fixture_dir("llama"), -1), "--tp must be at least 1, got -1");
  has(load_error(testing::fixture_dir("bert"), 2), "decoders only");
  // Engine files record their own ranks (tests/engine/tp_engine_test.cpp); a bad file
  // is still the engine loader's error, not a sharding one.
  has(load_error(testing::fixture_dir("llama") + "/../missing.kiln", 2), "does not exist");
  const std::string fake = (std::filesystem::temp_directory_path() / "kiln_tp_fake.kiln").string();
  std::ofstream(fake) << "not an engine";
  has(load_error(fake, 2), "not a kiln engine file");
  has(load_error(std::string(KILN_FIXTURES_DIR) + "/onnx/gpt2/model.onnx", 2), "not supported for .onnx files");
}

}  // namespace
}  // namespace kiln
