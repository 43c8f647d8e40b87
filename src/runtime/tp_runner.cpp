// TpLlmRunner (see tp_runner.h).
#include "runtime/tp_runner.h"

#include <exception>
#include <map>
#include <thread>

#include "core/status.h"
#include "parallel/tensor_parallel.h"

namespace kiln {

TpLlmRunner::TpLlmRunner(const BuiltModel& model, int world, const ModelOptions& model_options,
                         const LlmRunnerOptions& runner_options)
    : comms_(make_local_communicators(world)) {
  for (int r = 0; r < world; ++r) {
    ModelOptions mo = model_options;
    mo.communicator = comms_[size_t(r)];
    models_.push_back(Model::from_built(shard_tensor_parallel(model, r, world), mo));
    runners_.push_back(std::make_unique<LlmRunner>(*models_.back(), runner_options));
  }
}

TpLlmRunner::~TpLlmRunner() = default;

int32_t TpLlmRunner::add_sequence(const std::vector<int32_t>& prompt) {
  int32_t id = -1;
  for (auto& r : runners_) {
    int32_t got = r->add_sequence(prompt);
    KILN_CHECK(id < 0 || got == id, "ranks disagree on sequence ids");
    id = got;
  }
  return id;
}

void TpLlmRunner::append_tokens(int32_t seq, const std::vector<int32_t>& tokens) {
  for (auto& r : runners_) r->append_tokens(seq, tokens);
}

void TpLlmRunner::remove_sequence(int32_t seq) {
  for (auto& r : runners_) r->remove_sequence(seq);
}

std::vector<SequenceOutput> TpLlmRunner::step(bool all_logits) {
  std::vector<std::vector<SequenceOutput>> outs(runners_.size());
  std::vector<std::exception_ptr> errors(runners_.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < runners_.size(); ++r)
    threads.emplace_back([&, r] {
      try {
        outs[r] = runners_[r]->step(all_logits);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  // The ranks checked the same inputs, so a user error shows on every rank alike.
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return std::move(outs[0]);
}

std::vector<std::vector<int32_t>> TpLlmRunner::generate_greedy(
    const std::vector<std::vector<int32_t>>& prompts, int32_t max_new_tokens) {
  std::map<int32_t, size_t> index;
  for (size_t i = 0; i < prompts.size(); ++i) index[add_sequence(prompts[i])] = i;
  std::vector<std::vector<int32_t>> generated(prompts.size());
  while (has_pending())
    for (auto& o : step()) {
      auto& gen = generated[index.at(o.seq)];
      gen.push_back(argmax(o.logits.data(), int64_t(o.logits.size())));
      if (int32_t(gen.size()) < max_new_tokens) append_tokens(o.seq, {gen.back()});
    }
  for (auto& [id, i] : index) remove_sequence(id);
  return generated;
}

}  // namespace kiln
