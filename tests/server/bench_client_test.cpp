// `kiln serve bench`'s load generator against an in-process server with the tiny Llama:
// every request is counted, token totals add up, multi-turn sessions report per-turn
// TTFT, failures are reported rather than hidden; and summarize()'s statistics.
#include <gtest/gtest.h>

#include "server/bench_client.h"
#include "server_util.h"

namespace kiln::server {
namespace {

using namespace testing;

TEST(BenchClient, SummaryStatistics) {
  auto s = summarize({5, 1, 3, 2, 4});
  EXPECT_DOUBLE_EQ(s.mean, 3);
  EXPECT_DOUBLE_EQ(s.median, 3);
  EXPECT_DOUBLE_EQ(s.p99, 5);
  std::vector<double> v;
  for (int i = 1; i <= 200; ++i) v.push_back(i);
  s = summarize(v);
  EXPECT_DOUBLE_EQ(s.median, 100.5);
  EXPECT_DOUBLE_EQ(s.p99, 198);
  EXPECT_EQ(summarize({}).count, 0u);
}

TEST(BenchClient, MultiTurnSessionsAgainstALiveServer) {
  ModelRepository repo({}, {});
  repo.add(fixture("llama"), "llama");
  TestServer srv(repo);
  BenchOptions o;
  o.port = srv.port();
  o.model = "llama";
  o.requests = 8;
  o.concurrency = 4;
  o.input_min = 4, o.input_max = 20;
  o.output_min = 2, o.output_max = 8;
  o.vocab = 500;
  o.turns = 2;
  o.turn_tokens = 4;
  o.sessions = true;
  BenchReport r = run_serve_bench(o);
  EXPECT_EQ(r.completed, 16) << r.first_error;
  EXPECT_EQ(r.failed, 0);
  EXPECT_EQ(r.ttft_first_turn_ms.count, 8u);
  EXPECT_EQ(r.ttft_later_turns_ms.count, 8u);
  EXPECT_GE(r.output_tokens, 16 * 2);
  EXPECT_LE(r.output_tokens, 16 * 8);
  EXPECT_GT(r.output_throughput, 0);
  EXPECT_EQ(repo.find("llama")->executor->stats().session_hits, 8);
  EXPECT_NE(r.to_text(o).find("TTFT turns 2+"), std::string::npos);

  o.model = "nope";  // every request fails with a 404, and says so
  o.turns = 1;
  r = run_serve_bench(o);
  EXPECT_EQ(r.failed, 8);
  EXPECT_NE(r.first_error.find("404"), std::string::npos) << r.first_error;
}

TEST(BenchClient, EmbeddingsAgainstALiveServer) {
  ModelRepository repo({}, {});
  repo.add(fixture("bert"), "bert");
  TestServer srv(repo);
  BenchOptions o;
  o.port = srv.port();
  o.model = "bert";
  o.endpoint = "embeddings";
  o.requests = 24;
  o.concurrency = 6;
  o.inputs_per_request = 3;
  o.input_min = 2, o.input_max = 16;
  o.vocab = 90;
  BenchReport r = run_serve_bench(o);
  EXPECT_EQ(r.completed, 24) << r.first_error;
  EXPECT_EQ(r.failed, 0);
  EXPECT_EQ(r.sequences, 72);
  EXPECT_GE(r.input_tokens, 72 * 2);
  EXPECT_LE(r.input_tokens, 72 * 16);
  EXPECT_EQ(r.e2e_ms.count, 24u);
  EXPECT_EQ(r.ttft_ms.count, 0u);
  EXPECT_GT(r.sequence_throughput, 0);
  EXPECT_NE(r.to_text(o).find("sequences/s"), std::string::npos);
  // The server saw every sequence through its batcher.
  EXPECT_EQ(repo.find("bert")->batcher->stats().sequences, 72);

  o.input_max = 200;  // past the model's positions: every request fails with a 400, and says so
  o.input_min = 200;
  o.requests = 2;
  r = run_serve_bench(o);
  EXPECT_EQ(r.failed, 2);
  EXPECT_NE(r.first_error.find("400"), std::string::npos) << r.first_error;
}

}  // namespace
}  // namespace kiln::server
