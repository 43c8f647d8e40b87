// q8 / q4 weight quantization (see weight_quant.h).
#include "core/weight_quant.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "core/thread_pool.h"

namespace kiln {

const char* quant_format_name(QuantFormat f) { return f == QuantFormat::kQ8 ? "q8" : "q4"; }

void quantize_row(const float* w, int64_t k, QuantFormat f, uint8_t* codes, uint16_t* scales, uint16_t* mins,
                  float* row_factor) {
  const bool q8 = f == QuantFormat::kQ8;
  const int64_t groups = k / kQuantGroup;
  // Pass 1: each group's f32 scale and min, and the row's largest magnitude among them.
  std::vector<float> scale(static_cast<size_t>(groups)), lo(static_cast<size_t>(groups));
  float big = 0.0f;
  for (int64_t g = 0; g < groups; ++g) {
    const float* v = w + g * kQuantGroup;
    float mn = v[0], mx = v[0], amax = 0.0f;
    for (int64_t i = 0; i < kQuantGroup; ++i) {
      mn = std::min(mn, v[i]);
      mx = std::max(mx, v[i]);
      amax = std::max(amax, std::fabs(v[i]));
    }
    scale[size_t(g)] = q8 ? amax / 127.0f : (mx - mn) / 15.0f;
    lo[size_t(g)] = q8 ? 0.0f : mn;
    big = std::max({big, scale[size_t(g)], std::fabs(lo[size_t(g)])});
  }
  float factor = 1.0f;
  if (big > 0.0f && std::isfinite(big)) {
    int e = 0;
    std::frexp(big, &e);  // big = m * 2^e, m in [0.5, 1)
    factor = std::ldexp(1.0f, std::max(e - 15, FLT_MIN_EXP - 1));
  }
  *row_factor = factor;
  // Pass 2: f16 scale/min relative to the factor, then codes against those stored values.
  for (int64_t g = 0; g < groups; ++g) {
    const uint16_t s16 = f32_to_f16(scale[size_t(g)] / factor);
    const uint16_t m16 = f32_to_f16(lo[size_t(g)] / factor);
    scales[g] = s16;
    if (!q8) mins[g] = m16;
    const float s = f16_to_f32(s16) * factor, m = q8 ? 0.0f : f16_to_f32(m16) * factor;
    const float* v = w + g * kQuantGroup;
    for (int64_t i = 0; i < kQuantGroup; ++i) {
      const float q = s > 0.0f ? std::nearbyint((v[i] - m) / s) : 0.0f;
      const int64_t at = g * kQuantGroup + i;
      if (q8) {
        codes[at] = uint8_t(int8_t(std::clamp(q, -127.0f, 127.0f)));
      } else {
        const uint8_t c = uint8_t(std::clamp(q, 0.0f, 15.0f));
        uint8_t& b = codes[at / 2];
        b = (at & 1) ? uint8_t((b & 0x0f) | (c << 4)) : uint8_t((b & 0xf0) | c);
      }
    }
  }
}

void dequantize_row(const uint8_t* codes, const uint16_t* scales, const uint16_t* mins, float row_factor, int64_t k,
                    QuantFormat f, float* out) {
  const bool q8 = f == QuantFormat::kQ8;
  for (int64_t g = 0; g < k / kQuantGroup; ++g) {
    const float s = f16_to_f32(scales[g]) * row_factor, m = q8 ? 0.0f : f16_to_f32(mins[g]) * row_factor;
    for (int64_t i = g * kQuantGroup; i < (g + 1) * kQuantGroup; ++i) out[i] = s * float(quant_code(f, codes, i)) + m;
  }
}

QuantizedRows quantize_rows(const float* w, int64_t n, int64_t k, QuantFormat f) {
  KILN_THROW_IF(n <= 0 || k <= 0 || k % kQuantGroup != 0, kInvalidArgument, quant_format_name(f),
                " quantization needs N > 0 and K a positive multiple of ", kQuantGroup, ", got N=", n, " K=", k);
  QuantizedRows q;
  q.format = f;
  q.n = n;
  q.k = k;
  const size_t row_bytes = quant_row_code_bytes(f, k);
  const size_t groups = size_t(q.groups());
  q.codes.reset(new uint8_t[size_t(n) * row_bytes]());
  q.scales.reset(new uint16_t[size_t(n) * groups]);
  if (f == QuantFormat::kQ4) q.mins.reset(new uint16_t[size_t(n) * groups]);
  q.row_factor.reset(new float[size_t(n)]);
  ThreadPool::global().parallel_for(n, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r)
      quantize_row(w + r * k, k, f, q.codes.get() + size_t(r) * row_bytes, q.scales.get() + size_t(r) * groups,
                   q.mins ? q.mins.get() + size_t(r) * groups : nullptr, q.row_factor.get() + r);
  });
  return q;
}

size_t quant_image_row_bytes(QuantFormat f, int64_t k) {
  const size_t groups = size_t(k / kQuantGroup);
  return quant_row_code_bytes(f, k) + groups * 2 * (f == QuantFormat::kQ4 ? 2 : 1) + sizeof(float);
}

void quant_rows_to_image(const QuantizedRows& q, uint8_t* dst) {
  const size_t cb = quant_row_code_bytes(q.format, q.k), groups = size_t(q.groups());
  for (int64_t r = 0; r < q.n; ++r) {
    std::memcpy(dst, q.codes.get() + size_t(r) * cb, cb);
    dst += cb;
    std::memcpy(dst, q.scales.get() + size_t(r) * groups, groups * 2);
    dst += groups * 2;
    if (q.format == QuantFormat::kQ4) {
      std::memcpy(dst, q.mins.get() + size_t(r) * groups, groups * 2);
      dst += groups * 2;
    }
    std::memcpy(dst, &q.row_factor[size_t(r)], sizeof(float));
    dst += sizeof(float);
  }
}

QuantizedRows quant_rows_from_image(const uint8_t* src, int64_t n, int64_t k, QuantFormat f) {
  KILN_THROW_IF(n <= 0 || k <= 0 || k % kQuantGroup != 0, kInvalidArgument, quant_format_name(f),
                " weight image needs N > 0 and K a positive multiple of ", kQuantGroup, ", got N=", n, " K=", k);
  QuantizedRows q;
  q.format = f;
  q.n = n;
  q.k = k;
  const size_t cb = quant_row_code_bytes(f, k), groups = size_t(q.groups());
  q.codes.reset(new uint8_t[size_t(n) * cb]);
  q.scales.reset(new uint16_t[size_t(n) * groups]);
  if (f == QuantFormat::kQ4) q.mins.reset(new uint16_t[size_t(n) * groups]);
  q.row_factor.reset(new float[size_t(n)]);
  for (int64_t r = 0; r < n; ++r) {
    std::memcpy(q.codes.get() + size_t(r) * cb, src, cb);
    src += cb;
    std::memcpy(q.scales.get() + size_t(r) * groups, src, groups * 2);
    src += groups * 2;
    if (f == QuantFormat::kQ4) {
      std::memcpy(q.mins.get() + size_t(r) * groups, src, groups * 2);
      src += groups * 2;
    }
    std::memcpy(&q.row_factor[size_t(r)], src, sizeof(float));
    src += sizeof(float);
  }
  return q;
}

QuantFormat quant_format_from_name(const std::string& name, const std::string& what) {
  if (name == "q8") return QuantFormat::kQ8;
  if (name == "q4") return QuantFormat::kQ4;
  throw_error(ErrorCode::kInvalidArgument, what, ": unknown quantized weight format '", name, "' (expected q8 or q4)");
}

}  // namespace kiln
