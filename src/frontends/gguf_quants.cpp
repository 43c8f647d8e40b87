// Block dequantizers (see gguf_quants.h). Blocks are read byte-wise with memcpy since a
// GGUF tensor (or a fuzzer's buffer) need not be aligned for the block's f16/f32 fields.
#include "frontends/gguf_quants.h"

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace kiln {
namespace {

constexpr int kQK = 32;    // elements per block of the legacy quants
constexpr int kQKK = 256;  // elements per K-quant super-block

inline float rd_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

void f32_to_f32(const uint8_t* s, float* y, int64_t n) { std::memcpy(y, s, size_t(n) * 4); }
void f16_to_f32_row(const uint8_t* s, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = rd_f16(s + 2 * i);
}
void bf16_to_f32_row(const uint8_t* s, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, s + 2 * i, 2);
    y[i] = bf16_to_f32(h);
  }
}

// block_q4_0 {f16 d; u8 qs[16]}: low nibbles are elements 0..15, high nibbles 16..31.
void q4_0(const uint8_t* s, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b, s += 18, y += kQK) {
    const float d = rd_f16(s);
    const uint8_t* qs = s + 2;
    for (int j = 0; j < 16; ++j) {
      y[j] = float((qs[j] & 0xf) - 8) * d;
      y[j + 16] = float((qs[j] >> 4) - 8) * d;
    }
  }
}

// block_q4_1 {f16 d; f16 m; u8 qs[16]}.
void q4_1(const uint8_t* s, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b, s += 20, y += kQK) {
    const float d = rd_f16(s), m = rd_f16(s + 2);
    const uint8_t* qs = s + 4;
    for (int j = 0; j < 16; ++j) {
      y[j] = float(qs[j] & 0xf) * d + m;
      y[j + 16] = float(qs[j] >> 4) * d + m;
    }
  }
}

// block_q5_0 {f16 d; u8 qh[4]; u8 qs[16]}: qh bit j is the 5th bit of element j.
void q5_0(const uint8_t* s, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b, s += 22, y += kQK) {
    const float d = rd_f16(s);
    uint32_t qh;
    std::memcpy(&qh, s + 2, 4);
    const uint8_t* qs = s + 6;
    for (int j = 0; j < 16; ++j) {
      const int xh0 = int(((qh >> j) << 4) & 0x10);
      const int xh1 = int((qh >> (j + 12)) & 0x10);
      y[j] = float(((qs[j] & 0xf) | xh0) - 16) * d;
      y[j + 16] = float(((qs[j] >> 4) | xh1) - 16) * d;
    }
  }
}

// block_q5_1 {f16 d; f16 m; u8 qh[4]; u8 qs[16]}.
void q5_1(const uint8_t* s, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b, s += 24, y += kQK) {
    const float d = rd_f16(s), m = rd_f16(s + 2);
    uint32_t qh;
    std::memcpy(&qh, s + 4, 4);
    const uint8_t* qs = s + 8;
    for (int j = 0; j < 16; ++j) {
      const int xh0 = int(((qh >> j) << 4) & 0x10);
      const int xh1 = int((qh >> (j + 12)) & 0x10);
      y[j] = float((qs[j] & 0xf) | xh0) * d + m;
      y[j + 16] = float((qs[j] >> 4) | xh1) * d + m;
    }
  }
}

// block_q8_0 {f16 d; i8 qs[32]}.
void q8_0(const uint8_t* s, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b, s += 34, y += kQK) {
    const float d = rd_f16(s);
    for (int j = 0; j < kQK; ++j) y[j] = float(int8_t(s[2 + j])) * d;
  }
}

// block_q8_1 {f16 d; f16 s; i8 qs[32]} (s = d * sum(qs), unused here).
void q8_1(const uint8_t* s, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b, s += 36, y += kQK) {
    const float d = rd_f16(s);
    for (int j = 0; j < kQK; ++j) y[j] = float(int8_t(s[4 + j])) * d;
  }
}

// block_q2_K {u8 scales[16]; u8 qs[64]; f16 d; f16 dmin}: 2-bit quants, a 4-bit scale
// and 4-bit min per 16 elements.
void q2_k(const uint8_t* s, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQKK; ++b, s += 84) {
    const uint8_t* sc = s;
    const uint8_t* q = s + 16;
    const float d = rd_f16(s + 80), dmin = rd_f16(s + 82);
    int is = 0;
    for (int h = 0; h < kQKK; h += 128, q += 32) {
      for (int shift = 0; shift < 8; shift += 2) {
        for (int half = 0; half < 2; ++half) {
          const uint8_t c = sc[is++];
          const float dl = d * float(c & 0xf), ml = dmin * float(c >> 4);
          for (int l = 0; l < 16; ++l) *y++ = dl * float((q[l + 16 * half] >> shift) & 3) - ml;
        }
      }
    }
  }
}

// block_q3_K {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}: 2 low bits in qs, the
// third (inverted: a clear bit subtracts 4) in hmask, 6-bit signed scales per 16.
void q3_k(const uint8_t* s, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQKK; ++b, s += 110) {
    const uint8_t* hm = s;
    const uint8_t* q = s + 32;
    const uint8_t* raw = s + 96;
    const float d = rd_f16(s + 108);
    int scales[16];
    for (int k = 0; k < 16; ++k) {
      const int lo = k < 8 ? raw[k] & 0xf : raw[k - 8] >> 4;
      const int hi = (raw[8 + k % 4] >> (2 * (k / 4))) & 3;
      scales[k] = (lo | (hi << 4)) - 32;
    }
    int is = 0;
    uint8_t m = 1;
    for (int h = 0; h < kQKK; h += 128, q += 32) {
      for (int shift = 0; shift < 8; shift += 2, m = uint8_t(m << 1)) {
        for (int half = 0; half < 2; ++half) {
          const float dl = d * float(scales[is++]);
          for (int l = 0; l < 16; ++l) {
            const int i = l + 16 * half;
            *y++ = dl * float(((q[i] >> shift) & 3) - ((hm[i] & m) ? 0 : 4));
          }
        }
      }
    }
  }
}

// The 6-bit scale and min of sub-block j packed in the 12 bytes of a Q4_K/Q5_K block.
inline void scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = uint8_t((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4));
    *m = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// block_q4_K {f16 d; f16 dmin; u8 scales[12]; u8 qs[128]}: 8 sub-blocks of 32.
void q4_k(const uint8_t* s, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQKK; ++b, s += 144) {
    const float d = rd_f16(s), dmin = rd_f16(s + 2);
    const uint8_t* sc = s + 4;
    const uint8_t* q = s + 16;
    for (int j = 0, is = 0; j < kQKK; j += 64, q += 32, is += 2) {
      uint8_t c, m;
      scale_min_k4(is, sc, &c, &m);
      const float d1 = d * c, m1 = dmin * m;
      scale_min_k4(is + 1, sc, &c, &m);
      const float d2 = d * c, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * float(q[l] & 0xf) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * float(q[l] >> 4) - m2;
    }
  }
}

// block_q5_K {f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}.
void q5_k(const uint8_t* s, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQKK; ++b, s += 176) {
    const float d = rd_f16(s), dmin = rd_f16(s + 2);
    const uint8_t* sc = s + 4;
    const uint8_t* qh = s + 16;
    const uint8_t* ql = s + 48;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0, is = 0; j < kQKK; j += 64, ql += 32, is += 2) {
      uint8_t c, m;
      scale_min_k4(is, sc, &c, &m);
      const float d1 = d * c, m1 = dmin * m;
      scale_min_k4(is + 1, sc, &c, &m);
      const float d2 = d * c, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * float((ql[l] & 0xf) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * float((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
      u1 = uint8_t(u1 << 2);
      u2 = uint8_t(u2 << 2);
    }
  }
}

// block_q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}.
void q6_k(const uint8_t* s, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQKK; ++b, s += 210) {
    const uint8_t* ql = s;
    const uint8_t* qh = s + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(s + 192);
    const float d = rd_f16(s + 208);
    for (int h = 0; h < kQKK; h += 128, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * float(sc[is]) * float(q1);
        y[l + 32] = d * float(sc[is + 2]) * float(q2);
        y[l + 64] = d * float(sc[is + 4]) * float(q3);
        y[l + 96] = d * float(sc[is + 6]) * float(q4);
      }
    }
  }
}

// block_q8_K {f32 d; i8 qs[256]; i16 bsums[16]}.
void q8_k(const uint8_t* s, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQKK; ++b, s += 292, y += kQKK) {
    float d;
    std::memcpy(&d, s, 4);
    for (int j = 0; j < kQKK; ++j) y[j] = d * float(int8_t(s[4 + j]));
  }
}

template <typename T>
void int_to_f32(const uint8_t* s, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, s + i * int64_t(sizeof(T)), sizeof(T));
    y[i] = float(v);
  }
}

struct TypeEntry {
  GgmlType type;
  GgmlTypeTraits traits;
};
const TypeEntry kTypes[] = {
    {GgmlType::kF32, {"F32", 1, 4, f32_to_f32}},
    {GgmlType::kF16, {"F16", 1, 2, f16_to_f32_row}},
    {GgmlType::kBF16, {"BF16", 1, 2, bf16_to_f32_row}},
    {GgmlType::kQ4_0, {"Q4_0", kQK, 18, q4_0}},
    {GgmlType::kQ4_1, {"Q4_1", kQK, 20, q4_1}},
    {GgmlType::kQ5_0, {"Q5_0", kQK, 22, q5_0}},
    {GgmlType::kQ5_1, {"Q5_1", kQK, 24, q5_1}},
    {GgmlType::kQ8_0, {"Q8_0", kQK, 34, q8_0}},
    {GgmlType::kQ8_1, {"Q8_1", kQK, 36, q8_1}},
    {GgmlType::kQ2_K, {"Q2_K", kQKK, 84, q2_k}},
    {GgmlType::kQ3_K, {"Q3_K", kQKK, 110, q3_k}},
    {GgmlType::kQ4_K, {"Q4_K", kQKK, 144, q4_k}},
    {GgmlType::kQ5_K, {"Q5_K", kQKK, 176, q5_k}},
    {GgmlType::kQ6_K, {"Q6_K", kQKK, 210, q6_k}},
    {GgmlType::kQ8_K, {"Q8_K", kQKK, 292, q8_k}},
    {GgmlType::kI8, {"I8", 1, 1, int_to_f32<int8_t>}},
    {GgmlType::kI16, {"I16", 1, 2, int_to_f32<int16_t>}},
    {GgmlType::kI32, {"I32", 1, 4, int_to_f32<int32_t>}},
    {GgmlType::kI64, {"I64", 1, 8, int_to_f32<int64_t>}},
    {GgmlType::kF64, {"F64", 1, 8, int_to_f32<double>}},
};

}  // namespace

const GgmlTypeTraits* ggml_type_traits(uint32_t type) {
  for (const auto& e : kTypes)
    if (uint32_t(e.type) == type) return &e.traits;
  return nullptr;
}

const char* ggml_type_name(uint32_t type) {
  static thread_local char buf[32];
  if (const auto* t = ggml_type_traits(type)) return t->name;
  std::snprintf(buf, sizeof(buf), "type %u", type);
  return buf;
}

std::optional<QuantFormat> ggml_exact_quant_format(uint32_t type) {
  switch (GgmlType(type)) {
    case GgmlType::kQ8_0:
    case GgmlType::kQ5_0: return QuantFormat::kQ8;
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1: return QuantFormat::kQ4;
    default: return std::nullopt;
  }
}

bool ggml_requantized_to_q8(uint32_t type) {
  switch (GgmlType(type)) {
    case GgmlType::kQ5_1:
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K: return true;
    default: return false;
  }
}

std::optional<QuantFormat> ggml_kept_quant_format(uint32_t type) {
  if (GgmlType(type) == GgmlType::kQ4_K) return QuantFormat::kQ4;
  if (ggml_requantized_to_q8(type)) return QuantFormat::kQ8;
  return ggml_exact_quant_format(type);
}

namespace {

// One row of Q8_0 / Q5_0 / Q4_0 / Q4_1 blocks as kiln q8 / q4 under row factor 1, value
// for value; false when a block has no image (a Q8_0 code of -128, a Q4_0 min -8d that
// overflows f16).
bool legacy_row(GgmlType t, const uint8_t* src, int64_t groups, uint8_t* codes, uint16_t* scales, uint16_t* mins,
                float* row_factor) {
  *row_factor = 1.0f;
  const size_t block_bytes = ggml_type_traits(uint32_t(t))->type_size;
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* b = src + size_t(g) * block_bytes;
    uint16_t d;
    std::memcpy(&d, b, 2);
    scales[g] = d;
    if (t == GgmlType::kQ8_0) {
      for (int j = 0; j < kQK; ++j) {
        if (b[2 + j] == 0x80) return false;  // -128: outside q8's [-127, 127]
        codes[g * kQK + j] = b[2 + j];
      }
      continue;
    }
    if (t == GgmlType::kQ5_0) {  // d * (q - 16): q8 code q - 16 in [-16, 15], scale d
      uint32_t qh;
      std::memcpy(&qh, b + 2, 4);
      const uint8_t* qs = b + 6;
      for (int j = 0; j < 16; ++j) {
        codes[g * kQK + j] = uint8_t(int8_t(((qs[j] & 0xf) | (((qh >> j) << 4) & 0x10)) - 16));
        codes[g * kQK + j + 16] = uint8_t(int8_t(((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16));
      }
      continue;
    }
    const uint8_t* qs = b + (t == GgmlType::kQ4_1 ? 4 : 2);
    if (t == GgmlType::kQ4_1) {
      std::memcpy(&mins[g], b + 2, 2);
    } else {
      // d * (q - 8) = d * q + (-8d); -8d is exact in f16 unless it overflows.
      const float m = -8.0f * f16_to_f32(d);
      const uint16_t m16 = f32_to_f16(m);
      if (!std::isfinite(m) || f16_to_f32(m16) != m) return false;
      mins[g] = m16;
    }
    // ggml: byte j holds elements j (low nibble) and j + 16 (high nibble); kiln: byte
    // j holds elements 2j (low) and 2j + 1 (high).
    uint8_t* dst = codes + g * (kQK / 2);
    for (int j = 0; j < kQK / 2; ++j) {
      const auto nib = [&](int e) { return e < 16 ? (qs[e] & 0x0f) : (qs[e - 16] >> 4); };
      dst[j] = uint8_t(nib(2 * j) | (nib(2 * j + 1) << 4));
    }
  }
  return true;
}

// One row of k Q4_K values (k / 256 super-blocks) as kiln q4: sub-block j of a
// super-block is one q4 group with the same codes, scale d * sc_j and min -dmin * m_j.
// Those products are exact in f32 (an 11-bit f16 significand times a 6-bit integer)
// but need up to 17 bits, so the stored f16 scale and min are them rounded to nearest
// (relative error <= 2^-11). The row factor F puts the row's largest |scale| or |min|
// in [2^14, 2^15) (as quantize_row does), which leaves 2^28 of f16's normal range below
// it; false (no image) when a nonzero scale or min would still be subnormal, or d / dmin
// is not finite.
bool q4_k_row(const uint8_t* src, int64_t k, uint8_t* codes, uint16_t* scales, uint16_t* mins, float* row_factor) {
  const int64_t blocks = k / kQKK;
  float big = 0.0f;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* s = src + size_t(b) * 144;
    const float d = rd_f16(s), dmin = rd_f16(s + 2);
    if (!std::isfinite(d) || !std::isfinite(dmin)) return false;
    for (int j = 0; j < 8; ++j) {
      uint8_t c, m;
      scale_min_k4(j, s + 4, &c, &m);
      big = std::max({big, std::fabs(d * float(c)), std::fabs(dmin * float(m))});
    }
  }
  float factor = 1.0f;
  if (big > 0.0f) {
    int e = 0;
    std::frexp(big, &e);  // big = m * 2^e, m in [0.5, 1)
    factor = std::ldexp(1.0f, std::max(e - 15, FLT_MIN_EXP - 1));
  }
  *row_factor = factor;
  constexpr float kMinNormalF16 = 6.103515625e-05f;  // 2^-14
  const auto to_f16 = [&](float v, uint16_t* out) {
    const float r = v / factor;  // exact: a power of two, far from f32's limits
    if (r != 0.0f && std::fabs(r) < kMinNormalF16) return false;
    *out = f32_to_f16(r);
    return true;
  };
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* s = src + size_t(b) * 144;
    const float d = rd_f16(s), dmin = rd_f16(s + 2);
    for (int j = 0; j < 8; ++j) {
      uint8_t c, m;
      scale_min_k4(j, s + 4, &c, &m);
      const int64_t g = b * 8 + j;
      if (!to_f16(d * float(c), &scales[g]) || !to_f16(-(dmin * float(m)), &mins[g])) return false;
      // ggml: the 32 bytes of qs[32 * (j / 2)] hold sub-block j in their low (j even) or
      // high (j odd) nibbles, element l in byte l; kiln: byte l holds elements 2l (low)
      // and 2l + 1 (high).
      const uint8_t* q = s + 16 + 32 * (j / 2);
      const int shift = (j & 1) * 4;
      uint8_t* dst = codes + g * (kQK / 2);
      for (int l = 0; l < kQK / 2; ++l)
        dst[l] = uint8_t(((q[2 * l] >> shift) & 0x0f) | (((q[2 * l + 1] >> shift) & 0x0f) << 4));
    }
  }
  return true;
}

}  // namespace

std::optional<Tensor> ggml_to_quantized_image(uint32_t type, const uint8_t* src, int64_t n, int64_t k) {
  const std::optional<QuantFormat> f = ggml_kept_quant_format(type);
  if (!f) return std::nullopt;
  const GgmlTypeTraits* tr = ggml_type_traits(type);
  KILN_THROW_IF(n <= 0 || k <= 0 || k % tr->block_size != 0, kInvalidArgument, "GGUF ", ggml_type_name(type),
                " rows need N > 0 and K a positive multiple of ", tr->block_size, ", got N=", n, " K=", k);
  const GgmlType t = GgmlType(type);
  const int64_t groups = k / kQuantGroup;
  const size_t rb = quant_image_row_bytes(*f, k), cb = quant_row_code_bytes(*f, k);
  const size_t src_row_bytes = size_t(k / tr->block_size) * tr->type_size;
  Tensor img(DType::kU8, {n, int64_t(rb)});
  uint8_t* base = img.data_as<uint8_t>();
  std::atomic<bool> ok{true};
  const bool requantize = ggml_requantized_to_q8(type);
  ThreadPool::global().parallel_for(n, [&](int64_t r0, int64_t r1, int) {
    std::vector<float> row(requantize ? size_t(k) : 0);
    for (int64_t r = r0; r < r1 && ok.load(std::memory_order_relaxed); ++r) {
      const uint8_t* s = src + size_t(r) * src_row_bytes;
      // An image row: codes, f16 scales, (q4) f16 mins, f32 factor. rb and cb are even, so
      // the f16 arrays are 2-byte aligned; the factor need not be 4-byte aligned (memcpy).
      uint8_t* codes = base + size_t(r) * rb;
      auto* scales = reinterpret_cast<uint16_t*>(codes + cb);
      uint16_t* mins = *f == QuantFormat::kQ4 ? scales + groups : nullptr;
      float factor = 1.0f;
      bool row_ok;
      if (requantize) {
        tr->to_f32(s, row.data(), k);
        row_ok = std::all_of(row.begin(), row.end(), [](float v) { return std::isfinite(v); });
        if (row_ok) quantize_row(row.data(), k, QuantFormat::kQ8, codes, scales, mins, &factor);
      } else {
        row_ok = t == GgmlType::kQ4_K ? q4_k_row(s, k, codes, scales, mins, &factor)
                                      : legacy_row(t, s, groups, codes, scales, mins, &factor);
      }
      std::memcpy(codes + rb - sizeof(float), &factor, sizeof(float));
      if (!row_ok) ok.store(false, std::memory_order_relaxed);
    }
  });
  if (!ok.load()) return std::nullopt;
  return img;
}

std::optional<QuantizedRows> ggml_to_quantized_rows(uint32_t type, const uint8_t* src, int64_t n, int64_t k) {
  std::optional<Tensor> img = ggml_to_quantized_image(type, src, n, k);
  if (!img) return std::nullopt;
  return quant_rows_from_image(img->data_as<uint8_t>(), n, k, *ggml_kept_quant_format(type));
}

}  // namespace kiln
