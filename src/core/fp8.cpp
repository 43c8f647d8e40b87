// FP8 E4M3 per-tensor scaling (see fp8.h).
#include "core/fp8.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "core/thread_pool.h"

namespace kiln {

const float* fp8e4m3_table() {
  static const struct Table {
    float v[256];
    Table() {
      for (int i = 0; i < 256; ++i) v[i] = fp8e4m3_to_f32(uint8_t(i));
    }
  } table;
  return table.v;
}

Fp8Scale fp8_scale_for_amax(double amax) {
  if (!(amax > 0) || !std::isfinite(amax)) return {};
  Fp8Scale s;
  s.scale = float(amax / double(kFp8E4M3Max));
  s.inv = float(double(kFp8E4M3Max) / amax);
  return s;
}

float fp8_stored_weight_scale(double weight_scale, const std::string& who) {
  if (!(weight_scale > 0) || !std::isfinite(weight_scale))
    throw_error(ErrorCode::kInvalidFile, who, " stores E4M3 weights but its weight_scale is ",
                weight_scale, " (expected a finite value > 0)");
  return float(weight_scale);
}

Fp8Scale fp8_out_scale(double out_amax, const std::string& who) {
  if (!(out_amax > 0) || !std::isfinite(out_amax))
    throw_error(ErrorCode::kInvalidArgument, who, " has out_amax ", out_amax,
                " (expected a finite value > 0: the calibrated max |output|)");
  return fp8_scale_for_amax(out_amax);
}

namespace {
// Elements per chunk of the thread pool's loops: small tensors stay on the calling thread.
constexpr int64_t kGrain = int64_t(1) << 16;
}  // namespace

void fp8_quantize(const float* x, size_t n, float inv, uint8_t* q) {
  ThreadPool::global().parallel_for(
      int64_t(n),
      [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) q[i] = f32_to_fp8e4m3(x[i] * inv);
      },
      kGrain);
}

void fp8_round_trip(const float* x, size_t n, const Fp8Scale& s, float* y) {
  const float* table = fp8e4m3_table();
  ThreadPool::global().parallel_for(
      int64_t(n),
      [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) y[i] = table[f32_to_fp8e4m3(x[i] * s.inv)] * s.scale;
      },
      kGrain);
}

Fp8Scale fp8_quantize_tensor(const float* w, size_t n, uint8_t* q) {
  // The max is order-free, so the chunked reduction gives the serial loop's value.
  std::vector<float> part(size_t(ThreadPool::global().num_threads()), 0.0f);
  ThreadPool::global().parallel_for(
      int64_t(n),
      [&](int64_t b, int64_t e, int t) {
        float m = part[size_t(t)];
        for (int64_t i = b; i < e; ++i) m = std::max(m, std::fabs(w[i]));
        part[size_t(t)] = m;
      },
      kGrain);
  const Fp8Scale s = fp8_scale_for_amax(*std::max_element(part.begin(), part.end()));
  fp8_quantize(w, n, s.inv, q);
  return s;
}

}  // namespace kiln
