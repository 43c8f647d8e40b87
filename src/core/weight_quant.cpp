// q8 / q4 weight quantization (see weight_quant.h).
#include "core/weight_quant.h"

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "core/thread_pool.h"

namespace kiln {

const char* quant_format_name(QuantFormat f) { return f == QuantFormat::kQ8 ? "q8" : "q4"; }

namespace {

// A group's f32 scale and min by the format's rule (q8: max|v| / 127 and 0; q4: (max - min) / 15 and min).
void group_range(const float* v, QuantFormat f, float* scale, float* lo) {
  float mn = v[0], mx = v[0], amax = 0.0f;
  for (int64_t i = 0; i < kQuantGroup; ++i) {
    mn = std::min(mn, v[i]);
    mx = std::max(mx, v[i]);
    amax = std::max(amax, std::fabs(v[i]));
  }
  *scale = f == QuantFormat::kQ8 ? amax / 127.0f : (mx - mn) / 15.0f;
  *lo = f == QuantFormat::kQ8 ? 0.0f : mn;
}

// f32 -> f16 saturating at f16's largest finite value (65504).
uint16_t f16_saturate(float v) { return f32_to_f16(std::clamp(v, -65504.0f, 65504.0f)); }

}  // namespace

float quant_row_factor(const float* w, int64_t k, QuantFormat f) {
  float big = 0.0f;
  for (int64_t g = 0; g < k / kQuantGroup; ++g) {
    float scale = 0, lo = 0;
    group_range(w + g * kQuantGroup, f, &scale, &lo);
    big = std::max({big, scale, std::fabs(lo)});
  }
  if (!(big > 0.0f) || !std::isfinite(big)) return 1.0f;
  int e = 0;
  std::frexp(big, &e);  // big = m * 2^e, m in [0.5, 1)
  return std::ldexp(1.0f, std::max(e - 15, FLT_MIN_EXP - 1));
}

namespace {

// The smallest E in [kQ4ExpMin, emax] with big <= top * 2^E (kQ4ExpMin for 0 or NaN,
// emax for infinity).
int super_exp(float big, int top, int emax) {
  if (!(big > 0.0f)) return kQ4ExpMin;
  if (!std::isfinite(big)) return emax;
  int e = 0;
  std::frexp(double(big) / top, &e);  // big / top in [2^(e-1), 2^e)
  e = std::clamp(e, kQ4ExpMin, emax);
  while (e > kQ4ExpMin && std::ldexp(double(top), e - 1) >= double(big)) --e;
  return e;
}

// v / 2^e rounded to nearest (ties to even), clamped to [-top, top], times 2^e as f16 (NaN
// stays NaN, so such a weight's outputs show it, as with free f16 scales).
uint16_t on_grid(float v, int e, int top) {
  if (std::isnan(v)) return f32_to_f16(v);
  const float c = std::clamp(std::nearbyint(std::ldexp(v, -e)), float(-top), float(top));
  return f32_to_f16(std::ldexp(c, e));
}

std::atomic<int> g_free_scales{-1};  // KILN_Q4_SCALES: -1 not read yet, 0 the grid, 1 free f16

}  // namespace

bool q4_free_scales() {
  int v = g_free_scales.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* e = std::getenv("KILN_Q4_SCALES");
    KILN_THROW_IF(e && *e && std::strcmp(e, "8bit") != 0 && std::strcmp(e, "f16") != 0,
                  kInvalidArgument, "KILN_Q4_SCALES=", e, " (expected 8bit or f16)");
    v = e && std::strcmp(e, "f16") == 0 ? 1 : 0;
    g_free_scales.store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

void q4_free_scales_set(bool free) { g_free_scales.store(free ? 1 : 0, std::memory_order_relaxed); }

namespace {

// A group on free f16 scales and mins (q8's grid; q4's before the 8-bit grid).
QuantGroup quant_group_free(const float* v, QuantFormat f, float row_factor) {
  float scale = 0, lo = 0;
  group_range(v, f, &scale, &lo);
  QuantGroup q;
  q.scale16 = f16_saturate(scale / row_factor);
  q.min16 = f == QuantFormat::kQ8 ? uint16_t(0) : f16_saturate(lo / row_factor);
  q.scale = f16_to_f32(q.scale16) * row_factor;
  q.min = f == QuantFormat::kQ8 ? 0.0f : f16_to_f32(q.min16) * row_factor;
  return q;
}

// Whether free f16 scales give back the q4 row w exactly.
bool q4_row_is_exact(const float* w, int64_t k, float factor) {
  for (int64_t g = 0; g < k / kQuantGroup; ++g) {
    const QuantGroup q = quant_group_free(w + g * kQuantGroup, QuantFormat::kQ4, factor);
    for (int64_t i = 0; i < kQuantGroup; ++i) {
      const float v = w[g * kQuantGroup + i];
      if (q.value(q.code(v, QuantFormat::kQ4)) != v) return false;
    }
  }
  return true;
}

}  // namespace

QuantSuperExp quant_super_exp(const float* v, int64_t count, float row_factor) {
  float big_s = 0.0f, big_m = 0.0f;
  for (int64_t g = 0; g < count / kQuantGroup; ++g) {
    float scale = 0, lo = 0;
    group_range(v + g * kQuantGroup, QuantFormat::kQ4, &scale, &lo);
    big_s = std::max(big_s, scale / row_factor);
    big_m = std::max(big_m, std::fabs(lo / row_factor));
  }
  return {super_exp(big_s, 255, kQ4ScaleExpMax), super_exp(big_m, 127, kQ4MinExpMax)};
}

QuantGroup quant_group(const float* v, QuantFormat f, float row_factor, const QuantSuperExp& e) {
  float scale = 0, lo = 0;
  group_range(v, f, &scale, &lo);
  QuantGroup q;
  if (f == QuantFormat::kQ8) {
    q.scale16 = f16_saturate(scale / row_factor);
  } else if (q4_free_scales()) {
    return quant_group_free(v, f, row_factor);
  } else {
    q.scale16 = on_grid(scale / row_factor, e.scale, 255);  // scale >= 0: codes 0..255
    q.min16 = on_grid(lo / row_factor, e.min, 127);
  }
  q.scale = f16_to_f32(q.scale16) * row_factor;
  q.min = f == QuantFormat::kQ8 ? 0.0f : f16_to_f32(q.min16) * row_factor;
  return q;
}

bool q4_super_exps(const uint16_t* scales, const uint16_t* mins, int64_t groups,
                   QuantSuperExp* out) {
  // A value lies on the grid of exponent e when it is an integer multiple of 2^e of at
  // most `top` in magnitude (scales: not negative).
  auto fits = [](float v, int e, int top) {
    const float c = std::ldexp(v, -e);
    return c == std::nearbyint(c) && std::fabs(c) <= float(top);
  };
  for (int64_t g0 = 0, s = 0; g0 < groups; g0 += kQ4SuperGroups, ++s) {
    const int64_t g1 = std::min(groups, g0 + kQ4SuperGroups);
    float big_s = 0.0f, big_m = 0.0f;
    for (int64_t g = g0; g < g1; ++g) {
      const float sv = f16_to_f32(scales[g]), mv = f16_to_f32(mins[g]);
      if (!(sv >= 0.0f) || !std::isfinite(sv) || (scales[g] & 0x8000u) || !std::isfinite(mv))
        return false;
      big_s = std::max(big_s, sv);
      big_m = std::max(big_m, std::fabs(mv));
    }
    const QuantSuperExp e{super_exp(big_s, 255, kQ4ScaleExpMax),
                          super_exp(big_m, 127, kQ4MinExpMax)};
    for (int64_t g = g0; g < g1; ++g)
      if (!fits(f16_to_f32(scales[g]), e.scale, 255) || !fits(f16_to_f32(mins[g]), e.min, 127))
        return false;
    out[s] = e;
  }
  return true;
}

void set_quant_code(QuantFormat f, uint8_t* codes, int64_t i, int code) {
  if (f == QuantFormat::kQ8) {
    codes[i] = uint8_t(int8_t(code));
  } else {
    uint8_t& b = codes[i / 2];
    b = (i & 1) ? uint8_t((b & 0x0f) | (code << 4)) : uint8_t((b & 0xf0) | code);
  }
}

void quantize_row(const float* w, int64_t k, QuantFormat f, uint8_t* codes, uint16_t* scales, uint16_t* mins,
                  float* row_factor) {
  const float factor = quant_row_factor(w, k, f);
  *row_factor = factor;
  // f16 scale/min relative to the factor (q4: on its super-group's 8-bit grid), then codes
  // against those stored values. A q4 row that free f16 scales reproduce exactly (values
  // already quantized on that grid: a Q4_1 / Q4_0 file expanded) keeps them: no error
  // beats the 8-bit grid's.
  const bool free = f == QuantFormat::kQ8 || q4_free_scales() || q4_row_is_exact(w, k, factor);
  QuantSuperExp e;
  for (int64_t g = 0; g < k / kQuantGroup; ++g) {
    if (!free && g % kQ4SuperGroups == 0)
      e = quant_super_exp(w + g * kQuantGroup,
                          std::min(k - g * kQuantGroup, kQ4SuperGroups * kQuantGroup), factor);
    const QuantGroup q = free ? quant_group_free(w + g * kQuantGroup, f, factor)
                              : quant_group(w + g * kQuantGroup, f, factor, e);
    scales[g] = q.scale16;
    if (f == QuantFormat::kQ4) mins[g] = q.min16;
    for (int64_t i = 0; i < kQuantGroup; ++i)
      set_quant_code(f, codes, g * kQuantGroup + i, q.code(w[g * kQuantGroup + i], f));
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

void dequantize_rows(const QuantizedRows& q, int64_t r0, int64_t r1, float* out) {
  const size_t cb = quant_row_code_bytes(q.format, q.k);
  for (int64_t r = r0; r < r1; ++r)
    dequantize_row(q.codes.get() + size_t(r) * cb, q.scales.get() + r * q.groups(),
                   q.mins ? q.mins.get() + r * q.groups() : nullptr, q.row_factor[size_t(r)], q.k, q.format,
                   out + (r - r0) * q.k);
}

QuantizedRows quantize_rows(const float* w, int64_t n, int64_t k, QuantFormat f) {
  KILN_THROW_IF(n <= 0 || k <= 0 || k % kQuantGroup != 0, kInvalidArgument, quant_format_name(f),
                " quantization needs N > 0 and K a positive multiple of ", kQuantGroup,
                ", got N=", n, " K=", k);
  q4_free_scales();  // its switch read here, not first in a pool thread
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

void dequantize_image_row(const uint8_t* row, int64_t k, QuantFormat f, float* out) {
  const size_t cb = quant_row_code_bytes(f, k), groups = size_t(k / kQuantGroup);
  // The scales follow the codes (a multiple of 16 bytes), so they are 2-byte aligned.
  const auto* scales = reinterpret_cast<const uint16_t*>(row + cb);
  const uint16_t* mins = f == QuantFormat::kQ4 ? scales + groups : nullptr;
  float factor;
  std::memcpy(&factor, row + cb + groups * 2 * (f == QuantFormat::kQ4 ? 2 : 1), sizeof(float));
  dequantize_row(row, scales, mins, factor, k, f, out);
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
