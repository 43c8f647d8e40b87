// FP8 E4M3 per-tensor scaling (see fp8.h).
#include "core/fp8.h"

#include <algorithm>
#include <cmath>

#include "core/dtype.h"

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

void fp8_quantize(const float* x, size_t n, float inv, uint8_t* q) {
  for (size_t i = 0; i < n; ++i) q[i] = f32_to_fp8e4m3(x[i] * inv);
}

Fp8Scale fp8_quantize_tensor(const float* w, size_t n, uint8_t* q) {
  float amax = 0;
  for (size_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(w[i]));
  const Fp8Scale s = fp8_scale_for_amax(amax);
  fp8_quantize(w, n, s.inv, q);
  return s;
}

}  // namespace kiln
