// `kiln serve bench`: a load generator for a running server, modelled on vLLM's
// benchmark_serving: random token-id prompts with a length mix, fixed concurrency or
// Poisson arrivals, streamed completions with ignore_eos; reports TTFT, TPOT, ITL
// (mean/median/p99), request and token throughput and goodput. Multi-turn mode replays
// conversations (each turn = previous prompt + answer + new tokens) with or without
// session ids, to measure what KV reuse does to later turns' TTFT. Embeddings mode posts
// /v1/embeddings requests of random token-id inputs instead (encoder serving): request
// and sequence throughput and end-to-end latency.
// Exercised by tests/server/bench_client_test.cpp against an in-process server.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::server {

struct BenchOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string model;
  std::string api_key;
  int requests = 64;      // conversations (x turns = requests sent)
  int concurrency = 8;    // clients in flight at once
  double rate = 0;        // > 0: Poisson arrivals at this many conversations/s
  int input_min = 32, input_max = 256;
  int output_min = 32, output_max = 128;
  int vocab = 1000;       // prompt ids are drawn from [10, vocab)
  // > 1: each prompt is one random run of ids repeated this many times (cut to its
  // length): text the model copies, the workload of prompt-lookup drafts (serve --lookup).
  int prompt_repeats = 1;
  int turns = 1;          // > 1: multi-turn conversations
  int turn_tokens = 16;   // new user tokens per later turn
  bool sessions = false;  // send a session id per conversation
  double ttft_target_ms = 2000, tpot_target_ms = 100;  // goodput (MLPerf server targets)
  uint64_t seed = 0;
  std::string endpoint = "completions";  // or "embeddings"
  int inputs_per_request = 1;            // embeddings: inputs in each request
};

struct Summary {
  double mean = 0, median = 0, p99 = 0;
  size_t count = 0;
};
Summary summarize(std::vector<double> v);

struct BenchReport {
  int completed = 0, failed = 0;
  double duration_s = 0;
  int64_t input_tokens = 0, output_tokens = 0;
  int64_t sequences = 0;  // embeddings: inputs embedded
  Summary ttft_ms, tpot_ms, itl_ms, e2e_ms;
  Summary ttft_first_turn_ms, ttft_later_turns_ms;  // multi-turn only
  double request_throughput = 0, output_throughput = 0, total_throughput = 0, goodput = 0;
  double sequence_throughput = 0;  // embeddings
  std::string first_error;
  std::string to_text(const BenchOptions& o) const;
  std::string to_json(const BenchOptions& o) const;
};

BenchReport run_serve_bench(const BenchOptions& options);

}  // namespace kiln::server
