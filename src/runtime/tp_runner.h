// Tensor-parallel decoding inside one process: one sharded copy of the model per rank
// (parallel/tensor_parallel.h), each with its own KV cache holding its heads, driven in
// lockstep by one thread per rank; the graphs' AllReduce nodes meet through a
// Communicator. The same scheduling decisions run on every rank, so rank 0's logits are
// the model's. Tested in tests/parallel/tensor_parallel_test.cpp.
#pragma once

#include <memory>
#include <vector>

#include "backends/communicator.h"
#include "runtime/llm_runner.h"

namespace kiln {

class TpLlmRunner {
 public:
  // `model` is the unsharded model; `world` ranks each compile their shard.
  TpLlmRunner(const BuiltModel& model, int world, const ModelOptions& model_options = {},
              const LlmRunnerOptions& runner_options = {});
  ~TpLlmRunner();

  int32_t add_sequence(const std::vector<int32_t>& prompt);
  void append_tokens(int32_t seq, const std::vector<int32_t>& tokens);
  void remove_sequence(int32_t seq);
  bool has_pending() const { return runners_[0]->has_pending(); }
  // One step on every rank at once; returns rank 0's outputs.
  std::vector<SequenceOutput> step(bool all_logits = false);
  std::vector<std::vector<int32_t>> generate_greedy(const std::vector<std::vector<int32_t>>& prompts,
                                                    int32_t max_new_tokens);
  int world_size() const { return int(models_.size()); }

 private:
  std::vector<std::shared_ptr<Communicator>> comms_;
  std::vector<std::unique_ptr<Model>> models_;
  std::vector<std::unique_ptr<LlmRunner>> runners_;
};

}  // namespace kiln
