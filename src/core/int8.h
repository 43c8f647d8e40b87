// Symmetric INT8 as the W8A8 Linear (quant/w8a8.h) uses it, defined once for every
// backend so their codes agree bit for bit: weights per output channel (scale =
// max|w[n,:]| / 127), activations per tensor (scale = act_amax / 127) or per token
// (max|x[t,:]| / 127), codes q = clamp(round(v * (1 / scale)), -127, 127) with ties to
// even. Used by the CPU kernels (backends/cpu/kernels/linear_int8.cpp) and the CUDA
// W8A8 Linear; tested through both (tests/backends/cpu/linear_int8_test.cpp,
// tests/backends/cuda/w8a8_test.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace kiln {

constexpr float kInt8Max = 127.0f;

// clamp(round(x * inv), -127, 127), ties to even; NaN gives -127 (as AVX2's max does).
inline int8_t int8_quantize(float x, float inv) {
  float v = x * inv;
  v = v > -kInt8Max ? v : -kInt8Max;
  v = v < kInt8Max ? v : kInt8Max;
  return int8_t(std::nearbyint(v));
}

// The static activation scale of a calibrated clip: amax / 127, or 1 when amax is 0.
inline float int8_act_scale(double amax) { return amax > 0 ? float(amax / 127.0) : 1.0f; }

// The per-token scale of a row whose largest magnitude is amax: amax / 127, or 1 for an
// all-zero row.
inline float int8_row_scale(float amax) { return amax > 0.0f ? amax / kInt8Max : 1.0f; }

// One output channel of a weight with its max |w| given (>= that of w[0, k)): codes of
// w[0, k) into q and the scale amax / 127. A row-parallel shard of a weight
// (parallel/tensor_parallel.h) holds part of a row and rounds it on the whole row's max,
// so its codes are the unsharded row's.
inline float int8_quantize_channel_amax(const float* w, int64_t k, float amax, int8_t* q) {
  const float scale = amax / kInt8Max;
  for (int64_t i = 0; i < k; ++i)
    q[i] = scale == 0.0f ? int8_t(0) : int8_quantize(w[i], 1.0f / scale);
  return scale;
}
// One output channel of a weight: codes of w[0, k) into q (all 0 for a zero row) and
// the channel's scale max|w| / 127 (0 for a zero row), so w ≈ scale * q.
inline float int8_quantize_channel(const float* w, int64_t k, int8_t* q) {
  float amax = 0.0f;
  for (int64_t i = 0; i < k; ++i) amax = std::fmax(amax, std::fabs(w[i]));
  return int8_quantize_channel_amax(w, k, amax, q);
}

// A row-parallel shard's weight_amax attribute (parallel/tensor_parallel.h) checked against
// its rows w [rows, k]: one finite value per row, each >= the row's own max |w| (the
// unsharded row's max covers its slice). Returns them as floats for
// int8_quantize_channel_amax; `who` names the Linear in the errors.
inline std::vector<float> int8_weight_amax(const std::vector<double>& a, const float* w,
                                           int64_t rows, int64_t k, const std::string& who) {
  if (int64_t(a.size()) != rows)
    throw_error(ErrorCode::kInvalidArgument, who, " has ", a.size(), " weight_amax values for ",
                rows, " output rows");
  std::vector<float> out(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    float own = 0.0f;
    for (int64_t j = 0; j < k; ++j) own = std::fmax(own, std::fabs(w[r * k + j]));
    if (!(a[size_t(r)] >= double(own)) || !std::isfinite(a[size_t(r)]))
      throw_error(ErrorCode::kInvalidArgument, who, " has weight_amax ", a[size_t(r)], " for row ",
                  r, ", whose own max |w| is ", own, " (expected a finite value >= it)");
    out[size_t(r)] = float(a[size_t(r)]);
  }
  return out;
}

}  // namespace kiln
