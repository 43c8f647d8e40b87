// CUDA graphs for decode steps and encoder forwards: one captured graph per step shape
// (input shapes, sequence count, longest query run, attention plan sizes), replayed while the device
// buffers it captured stay where they were. The step's inputs reach the graph through
// fixed device buffers that the host fills before each launch. Internal to the CUDA
// backend; tests/backends/cuda/models_test.cpp checks replayed logits are bit-identical to eager.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <map>
#include <vector>

#include "backends/cuda/cuda_check.h"

namespace kiln::cuda {

// The launches `enqueue` puts on s, captured (thread-local mode) and instantiated; on an
// error the capture is ended and the stream left usable, and the error propagates.
inline cudaGraphExec_t capture_graph(cudaStream_t s, const std::function<void()>& enqueue) {
  KILN_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  cudaGraph_t g = nullptr;
  try {
    enqueue();
  } catch (...) {
    (void)cudaStreamEndCapture(s, &g);  // leave the stream usable; the step's error wins
    if (g) cudaGraphDestroy(g);
    (void)cudaGetLastError();
    throw;
  }
  KILN_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t st = cudaGraphInstantiate(&exec, g, 0);
  cudaGraphDestroy(g);
  KILN_CUDA_CHECK(st);
  return exec;
}

class StepGraphs {
 public:
  using Key = std::vector<int64_t>;
  using Buffers = std::vector<const void*>;  // every device address a captured graph bakes in

  StepGraphs() = default;
  ~StepGraphs() { clear(); }
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;

  // Runs one step of shape `key`: replays its graph when the buffers are unchanged;
  // otherwise the first step of a shape runs eagerly (sizing every buffer, creating
  // cuBLASLt plans, none of which may happen inside a capture) and the next one is
  // captured, then launched. `enqueue` puts the step's kernels on `s`.
  void run(const Key& key, const Buffers& buffers, cudaStream_t s, const std::function<void()>& enqueue) {
    if (graphs_.size() >= kMaxGraphs && !graphs_.count(key)) evict_oldest();
    Entry& e = graphs_[key];
    e.last_use = ++tick_;
    if (e.exec && e.buffers == buffers) {
      KILN_CUDA_CHECK(cudaGraphLaunch(e.exec, s));
      ++replays_;
      return;
    }
    if (!e.warmed) {
      enqueue();
      e.warmed = true;
      return;
    }
    if (e.exec) KILN_CUDA_CHECK(cudaGraphExecDestroy(e.exec));
    e.exec = nullptr;
    e.exec = capture_graph(s, enqueue);
    e.buffers = buffers;
    ++captures_;
    KILN_CUDA_CHECK(cudaGraphLaunch(e.exec, s));
  }

  void clear() {
    for (auto& [k, e] : graphs_)
      if (e.exec) cudaGraphExecDestroy(e.exec);
    graphs_.clear();
  }
  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }

 private:
  // Shapes seen (decode batch sizes x attention plan sizes, encoder batch shapes) are
  // bounded by evicting the least recently used graph beyond this many.
  static constexpr size_t kMaxGraphs = 256;
  struct Entry {
    cudaGraphExec_t exec = nullptr;
    Buffers buffers;
    bool warmed = false;
    uint64_t last_use = 0;
  };
  void evict_oldest() {
    auto old = graphs_.begin();
    for (auto it = graphs_.begin(); it != graphs_.end(); ++it)
      if (it->second.last_use < old->second.last_use) old = it;
    if (old == graphs_.end()) return;
    if (old->second.exec) cudaGraphExecDestroy(old->second.exec);
    graphs_.erase(old);
  }
  std::map<Key, Entry> graphs_;
  int64_t captures_ = 0, replays_ = 0;
  uint64_t tick_ = 0;
};

}  // namespace kiln::cuda
