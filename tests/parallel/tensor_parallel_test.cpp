// Tensor parallelism on the CPU with in-process ranks: TP=2 and TP=4 shards of the tiny
// golden models give the unsharded model's logits (within f32 summation-order error)
// and identical greedy tokens; the all-reduce is exact and rank-identical; bad splits
// are clear errors.
#include <gtest/gtest.h>

#include <thread>

#include "../models/golden_util.h"
#include "backends/communicator.h"
#include "core/status.h"
#include "frontends/hf_dir.h"
#include "parallel/tensor_parallel.h"
#include "runtime/encoder_runner.h"
#include "runtime/llm_runner.h"

namespace kiln {
namespace {

BuiltModel load_built(const std::string& name) {
  HfModelDir dir = HfModelDir::open(testing::fixture_dir(name));
  return build_model(dir.config, *dir.weights);
}

TEST(Communicator, AllReduceIsExactAndIdenticalOnEveryRank) {
  for (int world : {1, 2, 3, 4}) {
    auto comms = make_local_communicators(world);
    std::vector<std::vector<float>> data(static_cast<size_t>(world));
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) {
      for (int i = 0; i < 1000; ++i) data[size_t(r)].push_back(float(r + 1) * 0.5f + float(i));
      threads.emplace_back([&, r] {
        for (int rep = 0; rep < 3; ++rep) comms[size_t(r)]->all_reduce_sum(data[size_t(r)].data(), 1000);
      });
    }
    for (auto& t : threads) t.join();
    for (int i = 0; i < 1000; ++i) {
      // Three rounds: x -> world^3 * x summed appropriately; compare against rank 0.
      for (int r = 1; r < world; ++r) EXPECT_EQ(data[size_t(r)][size_t(i)], data[0][size_t(i)]);
    }
    double want = 0;
    for (int r = 0; r < world; ++r) want += (r + 1) * 0.5;
    want = (want + 0.0) * world * world;  // first round sums, later rounds multiply by world
    EXPECT_DOUBLE_EQ(data[0][0], want);
  }
}

class TensorParallel : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(TensorParallel, DecoderMatchesUnsharded) {
  auto [name, world] = GetParam();
  BuiltModel built = load_built(name);
  testing::Reference ref(name);
  auto prompts = ref.prompts();

  auto full = Model::from_built(load_built(name));
  LlmRunner single(*full);
  ModelOptions mo;
  mo.tensor_parallel = world;
  auto sharded = Model::from_built(built, mo);
  ASSERT_EQ(sharded->tp_world(), world);
  LlmRunner tp(*sharded);
  for (auto& p : prompts) {
    single.add_sequence(p);
    tp.add_sequence(p);
  }
  auto want = single.step(true);
  auto got = tp.step(true);
  ASSERT_EQ(got.size(), want.size());
  for (size_t s = 0; s < got.size(); ++s)
    KILN_EXPECT_CLOSE(got[s].logits.data(), want[s].logits.data(), want[s].logits.size(), 1e-5,
                      name + " TP=" + std::to_string(world) + " prefill logits, seq " + std::to_string(s));
  // Greedy continuations through the sharded KV caches equal transformers' tokens.
  LlmRunner tp2(*sharded);
  auto gen = tp2.generate_greedy(prompts, 20);
  auto greedy = ref.ids("greedy");
  for (size_t b = 0; b < prompts.size(); ++b)
    EXPECT_EQ(gen[b], std::vector<int32_t>(greedy.begin() + int64_t(b) * 20, greedy.begin() + int64_t(b + 1) * 20))
        << name << " TP=" << world << " prompt " << b;
}

INSTANTIATE_TEST_SUITE_P(Models, TensorParallel,
                         ::testing::Combine(::testing::Values("gpt2", "llama", "qwen2", "qwen3", "phi3", "gemma3", "mistral", "gemma2"),
                                            ::testing::Values(2, 4)));

TEST(TensorParallelEncoder, BertShardsMatchUnsharded) {
  BuiltModel built = load_built("bert");
  auto full = Model::from_built(load_built("bert"));
  std::vector<EncoderInput> batch = {{{5, 6, 7, 8, 9}, {0, 0, 0, 1, 1}}, {{11, 12, 13}, {}}};
  auto want = encode(*full, batch);
  for (int world : {2, 4}) {
    auto comms = make_local_communicators(world);
    std::vector<std::unique_ptr<Model>> ranks;
    for (int r = 0; r < world; ++r) {
      ModelOptions mo;
      mo.communicator = comms[size_t(r)];
      ranks.push_back(Model::from_built(shard_tensor_parallel(built, r, world), mo));
    }
    std::vector<std::vector<EncoderOutput>> outs(static_cast<size_t>(world));
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) threads.emplace_back([&, r] { outs[size_t(r)] = encode(*ranks[size_t(r)], batch); });
    for (auto& t : threads) t.join();
    for (size_t b = 0; b < batch.size(); ++b) {
      KILN_EXPECT_CLOSE(outs[0][b].hidden.data(), want[b].hidden.data(), want[b].hidden.size(), 1e-5,
                        "bert TP=" + std::to_string(world) + " hidden");
      KILN_EXPECT_CLOSE(outs[0][b].logits.data(), want[b].logits.data(), want[b].logits.size(), 1e-5,
                        "bert TP=" + std::to_string(world) + " logits");
    }
  }
}

TEST(TensorParallelShards, SplitAttentionAndMlpAndHalveTheirWeights) {
  for (std::string name : {"gpt2", "llama", "qwen2", "bert"}) {
    BuiltModel built = load_built(name);
    BuiltModel shard = shard_tensor_parallel(built, 1, 2);
    int all_reduce = 0;
    for (auto& n : shard.graph.nodes()) all_reduce += n.op == "AllReduce";
    EXPECT_EQ(all_reduce, 2 * built.info.num_layers) << name << ": one after attention, one after the MLP";
    EXPECT_EQ(shard.info.num_heads, built.info.num_heads / 2) << name;
    // Embeddings and heads stay whole; every layer's projections are halved.
    EXPECT_LT(shard.graph.weight_bytes(), built.graph.weight_bytes()) << name;
  }
}

TEST(TensorParallelErrors, IndivisibleHeadsAreNamed) {
  BuiltModel built = load_built("gpt2");  // 4 heads
  try {
    shard_tensor_parallel(built, 0, 3);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("do not split over 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(shard_tensor_parallel(built, 2, 2), Error);
}

}  // namespace
}  // namespace kiln
