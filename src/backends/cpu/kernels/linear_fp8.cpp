// FP8 E4M3 Linear on the CPU (see kernels.h): the weight codes decoded through the
// 256-entry table into bf16 panels (exact), the input quantized and decoded the same
// way, then the bf16 GEMM and a rescale. Accuracy is the point here, not speed: it is
// the reference the CUDA FP8 GEMM and GEMV are checked against. Tested against a double
// reference on the decoded values in tests/backends/cpu/linear_fp8_test.cpp.
#include <vector>

#include "backends/cpu/kernels/kernels.h"
#include "core/dtype.h"
#include "core/fp8.h"
#include "core/status.h"

namespace kiln::cpu {

PackedFp8Weight pack_weight_fp8(const uint8_t* codes, int64_t n, int64_t k, float w_scale) {
  KILN_THROW_IF(n <= 0 || k <= 0, kInvalidArgument, "pack_weight_fp8: expected N, K > 0, got N=", n, " K=", k);
  const float* table = fp8e4m3_table();
  std::vector<float> decoded(size_t(n * k));
  for (size_t i = 0; i < decoded.size(); ++i) {
    decoded[i] = table[codes[i]];
    KILN_THROW_IF((codes[i] & 0x7f) == 0x7f, kInvalidArgument, "pack_weight_fp8: weight code ", i,
                  " is NaN (0x", std::hex, int(codes[i]), ")");
  }
  PackedFp8Weight w;
  w.values = pack_weight(decoded.data(), n, k, WeightStorage::kBF16);
  w.w_scale = w_scale;
  return w;
}

void quantize_rows_fp8(const float* x, int64_t t, int64_t k, float x_inv, float* xq) {
  const float* table = fp8e4m3_table();
  for (int64_t i = 0; i < t * k; ++i) xq[i] = table[f32_to_fp8e4m3(x[i] * x_inv)];
}

void linear_fp8(const float* x, int64_t t, int64_t k, const PackedFp8Weight& w, float x_scale, float x_inv,
                const float* bias, float* y, const LinearTactic& tactic) {
  KILN_THROW_IF(k != w.values.k, kInvalidArgument, "linear_fp8: x has ", k, " features, the weight ", w.values.k);
  thread_local std::vector<float> xq;  // steady-state decoding allocates nothing
  if (xq.size() < size_t(t * k)) xq.resize(size_t(t * k));
  quantize_rows_fp8(x, t, k, x_inv, xq.data());
  linear(xq.data(), t, k, w.values, nullptr, y, tactic);
  const int64_t n = w.n();
  const float s = x_scale * w.w_scale;
  for (int64_t r = 0; r < t; ++r) {
    float* yr = y + r * n;
    if (bias)
      for (int64_t j = 0; j < n; ++j) yr[j] = yr[j] * s + bias[j];
    else
      for (int64_t j = 0; j < n; ++j) yr[j] *= s;
  }
}

}  // namespace kiln::cpu
