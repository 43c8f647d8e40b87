// TopKLogits on the CPU, the reference for the CUDA kernel: a bounded heap per row
// (about one comparison per element on real logits) and the log-sum-exp written exactly
// as runtime/sampling.cpp's logprobs_of writes it, so that sampling from the top k gives
// the bits sampling from the whole row gives. Tested in tests/backends/cpu/topk_test.cpp.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backends/cpu/kernels/kernels.h"
#include "core/thread_pool.h"

namespace kiln::cpu {

namespace {

// The order of the outputs: larger first, then the lower index; NaN after every number.
// A strict total order (unlike float <), so the result does not depend on the algorithm.
struct Ahead {
  const float* x;
  bool operator()(int32_t a, int32_t b) const {
    const bool an = std::isnan(x[a]), bn = std::isnan(x[b]);
    if (an != bn) return bn;
    if (!an && x[a] != x[b]) return x[a] > x[b];
    return a < b;
  }
};

void topk_row(const float* x, int64_t v, int64_t k, float* values, int32_t* ids, float* logprobs,
              std::vector<int32_t>& heap) {
  // Log-sum-exp in double, max first, then the sum in index order (logprobs_of).
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < v; ++i) mx = std::max(mx, x[i]);
  double sum = 0;
  for (int64_t i = 0; i < v; ++i) sum += std::exp(double(x[i]) - mx);
  const double lse = double(mx) + std::log(sum);

  // With comp = Ahead, the heap's top is the kept element furthest behind.
  const Ahead ahead{x};
  const int64_t keep = std::min(k, v);
  heap.clear();
  for (int64_t i = 0; i < keep; ++i) heap.push_back(int32_t(i));
  std::make_heap(heap.begin(), heap.end(), ahead);
  for (int64_t i = keep; i < v; ++i)
    if (ahead(int32_t(i), heap.front())) {
      std::pop_heap(heap.begin(), heap.end(), ahead);
      heap.back() = int32_t(i);
      std::push_heap(heap.begin(), heap.end(), ahead);
    }
  std::sort_heap(heap.begin(), heap.end(), ahead);  // best first
  for (int64_t j = 0; j < keep; ++j) {
    const int32_t i = heap[size_t(j)];
    ids[j] = i;
    values[j] = x[i];
    logprobs[j] = float(double(x[i]) - lse);
  }
  for (int64_t j = keep; j < k; ++j) {
    ids[j] = -1;
    values[j] = logprobs[j] = -std::numeric_limits<float>::infinity();
  }
}

}  // namespace

void topk_logits(const float* x, int64_t rows, int64_t v, int64_t k, float* values, int32_t* ids,
                 float* logprobs) {
  ThreadPool::global().parallel_for(rows, [&](int64_t begin, int64_t end, int) {
    std::vector<int32_t> heap;
    heap.reserve(size_t(std::min(k, v)));
    for (int64_t r = begin; r < end; ++r)
      topk_row(x + r * v, v, k, values + r * k, ids + r * k, logprobs + r * k, heap);
  });
}

}  // namespace kiln::cpu
