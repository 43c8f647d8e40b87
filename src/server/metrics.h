// Prometheus metrics in the text exposition format: request counters by endpoint and
// status, TTFT/TPOT/end-to-end latency histograms per model, and the executors' gauges
// and counters (queue depth, running sequences, batch size, KV blocks, prefix-cache and
// session counters, preemptions and KV swapping) and the encoder batchers' counters
// (forwards, sequences, queue depth) read at scrape time. Tested in tests/server/.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

namespace kiln::server {

class ModelRepository;

class Histogram {
 public:
  static constexpr std::array<double, 14> kBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                      1,     2.5,  5,     10,   30,  60,  120};
  void observe(double v);
  // Appends the _bucket/_sum/_count lines of `name` with `labels` ("model=\"x\"").
  void render(std::string& out, const std::string& name, const std::string& labels) const;

 private:
  std::array<int64_t, kBuckets.size()> counts_{};
  int64_t count_ = 0;
  double sum_ = 0;
};

class Metrics {
 public:
  void count_request(const std::string& model, const std::string& endpoint, int status);
  void observe_ttft(const std::string& model, double seconds);
  void observe_tpot(const std::string& model, double seconds);
  void observe_e2e(const std::string& model, double seconds);
  void add_tokens(const std::string& model, int64_t prompt, int64_t completion);
  std::string render(const ModelRepository& repo) const;

 private:
  mutable std::mutex mu_;
  std::map<std::tuple<std::string, std::string, int>, int64_t> requests_;
  std::map<std::string, Histogram> ttft_, tpot_, e2e_;
  std::map<std::string, std::pair<int64_t, int64_t>> tokens_;
};

}  // namespace kiln::server
