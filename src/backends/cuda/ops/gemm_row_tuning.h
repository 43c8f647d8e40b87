// Which cuBLASLt plans a decode step times at its own row count (Gemm::RowTuningScope in
// gemm.h): the bookkeeping only, keyed by (shape, m), with no CUDA in it, so it is tested
// without a GPU (tests/backends/cuda/gemm_tune_test.cpp).
#pragma once

#include <compare>
#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "core/env_switch.h"

namespace kiln::cuda {

// A GEMM plan's shape less its row count: operand and output dtypes (DType codes), n, k,
// whether a bias epilogue runs, and y's row stride.
struct GemmShape {
  int in = 0, out = 0;
  int64_t n = 0, k = 0;
  bool bias = false;
  int64_t ldy = 0;
  auto operator<=>(const GemmShape&) const = default;
};

// KILN_CUDA_GEMM_TUNE_M's value: unset, empty or "1" times decode row counts, "all" the row
// counts of every step (prefill chunks and encoder forwards too: for fixed shapes, such as
// an encoder served at one batch size, or with a tactic cache that keeps the choices), "0"
// none; anything else is an error naming the variable.
enum class GemmTuneRows : uint8_t { kOff, kDecode, kAll };
inline GemmTuneRows gemm_tune_rows_from_value(const char* v) {
  if (v && std::strcmp(v, "all") == 0) return GemmTuneRows::kAll;
  return env_switch_value("KILN_CUDA_GEMM_TUNE_M", v,
                          "decode steps time the GEMM tactics at their row count; or all: every step does",
                          "the heuristic's first algorithm at row counts not tuned at load")
             ? GemmTuneRows::kDecode
             : GemmTuneRows::kOff;
}
inline bool gemm_row_tuning_from_value(const char* v) { return gemm_tune_rows_from_value(v) != GemmTuneRows::kOff; }

// A (shape, m) is decided once: timed at load (Gemm::tune*), or met by a GEMM inside an
// open window (a decode step being enqueued). Deciding inside a window times it unless the
// stream is capturing a graph. Either way its choice never changes afterwards, so every
// graph captured at that m and every eager step use the same algorithm. Plans met
// outside a window (prefill steps: any row count) stay undecided and keep the
// heuristic's first.
class GemmRowTuning {
 public:
  explicit GemmRowTuning(bool enabled = true) : enabled_(enabled) {}
  void set_enabled(bool on) { enabled_ = on; }
  bool enabled() const { return enabled_; }

  // Windows nest (a step inside a step does not happen, but a guard must not care).
  void open() { ++open_; }
  bool is_open() const { return open_ > 0; }
  // Closes one level; the outermost close returns what was timed since the outermost
  // open, one entry per row count, in increasing m.
  struct Summary {
    int64_t m = 0;
    int shapes = 0;
    double ms = 0;  // host wall time spent timing them
  };
  std::vector<Summary> close() {
    if (open_ > 0) --open_;
    std::vector<Summary> out;
    if (open_ > 0) return out;
    for (auto& [m, s] : window_) out.push_back(s);
    window_.clear();
    return out;
  }

  // Records a (shape, m) timed outside any window (the load-time tuning).
  void mark_timed(const GemmShape& s, int64_t m) { decided_.insert({s, m}); }
  // Whether the GEMM about to run (shape, m) is to be timed now. True at most once per
  // (shape, m): the first time it is met inside an open window, if it can be timed then.
  // can_time: the stream is not capturing and the call can be rerun; when false, the
  // (shape, m) is decided untimed (the heuristic's first).
  bool claim(const GemmShape& s, int64_t m, bool can_time) {
    if (!enabled_ || open_ == 0) return false;
    if (!decided_.insert({s, m}).second) return false;
    return can_time;
  }
  // Whether claim would decide (shape, m) now (a cheap test before asking CUDA about capture).
  bool pending(const GemmShape& s, int64_t m) const { return enabled_ && open_ > 0 && !decided(s, m); }
  // The host time one claimed (shape, m) took to time.
  void add_cost(int64_t m, double ms) {
    Summary& s = window_[m];
    s.m = m;
    ++s.shapes;
    s.ms += ms;
  }
  // Forgets what was decided for plans with operands of DType code `in` (rebuilt plans).
  void forget_in(int in) {
    for (auto it = decided_.begin(); it != decided_.end();) it = it->first.in == in ? decided_.erase(it) : std::next(it);
  }
  bool decided(const GemmShape& s, int64_t m) const { return decided_.count({s, m}) != 0; }
  size_t num_decided() const { return decided_.size(); }

 private:
  bool enabled_;
  int open_ = 0;
  std::set<std::pair<GemmShape, int64_t>> decided_;
  std::map<int64_t, Summary> window_;
};

}  // namespace kiln::cuda
