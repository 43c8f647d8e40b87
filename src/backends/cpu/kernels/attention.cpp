// Paged attention (public entry points, argument checks, scalar Ops) and kv_cache_write,
// for the f32, the int8 and the FP8 KV cache.
// The loop itself is attention_impl.h; the AVX2 Ops are in attention_avx2.cpp.
// Tested in tests/backends/cpu/attention_test.cpp against dense attention on unpaged K/V.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backends/cpu/kernels/attention_impl.h"
#include "backends/cpu/kernels/isa.h"
#include "core/dtype.h"
#include "core/fp8.h"
#include "core/hadamard.h"
#include "core/status.h"

namespace kiln::cpu {
namespace {

struct ScalarOps {
  static float dot(const float* a, const float* b, int64_t d) {
    float s = 0.0f;
    for (int64_t i = 0; i < d; ++i) s += a[i] * b[i];
    return s;
  }
  static void axpy(float* acc, float p, const float* v, int64_t d) {
    for (int64_t i = 0; i < d; ++i) acc[i] += p * v[i];
  }
  static float dot(const float* a, const int8_t* b, int64_t d) {
    float s = 0.0f;
    for (int64_t i = 0; i < d; ++i) s += a[i] * float(b[i]);
    return s;
  }
  static void axpy(float* acc, float p, const int8_t* v, int64_t d) {
    for (int64_t i = 0; i < d; ++i) acc[i] += p * float(v[i]);
  }
  static float dot(const float* a, const Fp8Code* b, int64_t d) {
    const float* table = fp8e4m3_table();
    float s = 0.0f;
    for (int64_t i = 0; i < d; ++i) s += a[i] * table[uint8_t(b[i])];
    return s;
  }
  static void axpy(float* acc, float p, const Fp8Code* v, int64_t d) {
    const float* table = fp8e4m3_table();
    for (int64_t i = 0; i < d; ++i) acc[i] += p * table[uint8_t(v[i])];
  }
  static void scale(float* acc, float s, int64_t d) {
    for (int64_t i = 0; i < d; ++i) acc[i] *= s;
  }
  static void exp_inplace(float* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] = std::exp(x[i]);
  }
};

void check_attention_args(int64_t block_size, int64_t hq, int64_t hkv, int64_t d, bool causal, int64_t window,
                          float softcap, const AttentionSeq* seqs, int64_t num_seqs) {
  KILN_THROW_IF(!(softcap >= 0.0f) || std::isinf(softcap), kInvalidArgument, "paged_attention: softcap ", softcap,
                " (expected 0: none, or a finite positive cap)");
  KILN_THROW_IF(window < 0 || (window > 0 && !causal), kInvalidArgument,
                "paged_attention: a sliding window (", window, ") needs causal attention and window >= 0");
  KILN_THROW_IF(hkv <= 0 || hq % hkv != 0, kInvalidArgument,
                "paged_attention: Hq must be a multiple of Hkv, got Hq=", hq, " Hkv=", hkv);
  KILN_THROW_IF(block_size <= 0 || d <= 0, kInvalidArgument, "paged_attention: expected block_size, D > 0, got ",
                block_size, ", ", d);
  for (int64_t s = 0; s < num_seqs; ++s)
    KILN_THROW_IF(seqs[s].q_len < 0 || seqs[s].q_len > seqs[s].ctx_len, kInvalidArgument,
                  "paged_attention: sequence ", s, " has q_len=", seqs[s].q_len, " > ctx_len=",
                  seqs[s].ctx_len, " (ctx_len must include the new tokens)");
}

}  // namespace

void paged_attention(const float* q, const float* k_cache, const float* v_cache,
                     int64_t block_size, int64_t hq, int64_t hkv, int64_t d, float scale,
                     bool causal, const AttentionSeq* seqs, int64_t num_seqs, float* out, int64_t window, float softcap) {
  check_attention_args(block_size, hq, hkv, d, causal, window, softcap, seqs, num_seqs);
  if (use_avx2())
    avx2::paged_attention(q, k_cache, v_cache, block_size, hq, hkv, d, scale, causal, seqs, num_seqs, out, window, softcap);
  else
    paged_attention_impl<ScalarOps, float>(q, k_cache, nullptr, v_cache, nullptr, block_size, hq, hkv, d, scale,
                                           causal, seqs, num_seqs, out, window, softcap);
}

void paged_attention_int8(const float* q, const int8_t* k_codes, const float* k_scales,
                          const int8_t* v_codes, const float* v_scales, int64_t block_size, int64_t hq,
                          int64_t hkv, int64_t d, float scale, bool causal, const AttentionSeq* seqs,
                          int64_t num_seqs, float* out, int64_t window, float softcap) {
  check_attention_args(block_size, hq, hkv, d, causal, window, softcap, seqs, num_seqs);
  if (use_avx2())
    avx2::paged_attention_int8(q, k_codes, k_scales, v_codes, v_scales, block_size, hq, hkv, d, scale, causal,
                               seqs, num_seqs, out, window, softcap);
  else
    paged_attention_impl<ScalarOps, int8_t>(q, k_codes, k_scales, v_codes, v_scales, block_size, hq, hkv, d,
                                            scale, causal, seqs, num_seqs, out, window, softcap);
}

void paged_attention_fp8(const float* q, const Fp8Code* k_codes, const float* k_scales,
                         const Fp8Code* v_codes, const float* v_scales, int64_t block_size, int64_t hq,
                         int64_t hkv, int64_t d, float scale, bool causal, const AttentionSeq* seqs,
                         int64_t num_seqs, float* out, int64_t window, float softcap) {
  check_attention_args(block_size, hq, hkv, d, causal, window, softcap, seqs, num_seqs);
  if (use_avx2())
    avx2::paged_attention_fp8(q, k_codes, k_scales, v_codes, v_scales, block_size, hq, hkv, d, scale, causal,
                              seqs, num_seqs, out, window, softcap);
  else
    paged_attention_impl<ScalarOps, Fp8Code>(q, k_codes, k_scales, v_codes, v_scales, block_size, hq, hkv, d,
                                             scale, causal, seqs, num_seqs, out, window, softcap);
}

namespace {

// The row's max |x| (0 for an empty row) and whether every value is finite.
float row_amax(const float* x, int64_t d, bool& finite) {
  float amax = 0.0f;
  finite = true;
  for (int64_t i = 0; i < d; ++i) {
    amax = std::max(amax, std::fabs(x[i]));
    finite = finite && std::isfinite(x[i]);
  }
  return amax;
}

}  // namespace

float kv_quantize_row(const float* x, int64_t d, int8_t* codes) {
  bool finite = true;
  const float amax = row_amax(x, d, finite);
  if (d <= 0) return 0.0f;
  if (amax == 0.0f || !finite) {
    // All zeros: scale 0. A non-finite row has no scale; a NaN one keeps attention
    // reading NaN, as the f32 cache would.
    std::fill(codes, codes + d, int8_t(0));
    return finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
  }
  const float s = amax / 127.0f, inv = 127.0f / amax;
  for (int64_t i = 0; i < d; ++i)
    codes[i] = int8_t(std::clamp(std::nearbyint(x[i] * inv), -127.0f, 127.0f));
  return s;
}

float kv_quantize_row_fp8(const float* x, int64_t d, Fp8Code* codes) {
  bool finite = true;
  const float amax = row_amax(x, d, finite);
  if (d <= 0) return 0.0f;
  if (amax == 0.0f || !finite) {
    std::fill(codes, codes + d, Fp8Code(0));  // code 0 is +0
    return finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
  }
  const float s = amax / kFp8E4M3Max, inv = kFp8E4M3Max / amax;
  for (int64_t i = 0; i < d; ++i) codes[i] = Fp8Code(f32_to_fp8e4m3(x[i] * inv));
  return s;
}

void kv_rotate_queries(const float* q, int64_t rows, int64_t d, float* out) {
  const float inv_b = 1.0f / float(hadamard_block(d));
  for (int64_t r = 0; r < rows; ++r) {
    float* y = out + r * d;
    if (y != q + r * d) std::copy(q + r * d, q + (r + 1) * d, y);
    hadamard_transform(y, d);
    for (int64_t c = 0; c < d; ++c) y[c] *= inv_b;
  }
}

namespace {

// Quantizes every (token, kv head) row of this step's K and V with `quantize`, keys less
// k_shift when given and through hadamard_transform when k_rotate.
template <typename Code, float (*Quantize)(const float*, int64_t, Code*)>
void kv_cache_write_codes(const float* k, const float* v, const int64_t* slot_mapping, int64_t t, int64_t hkv,
                          int64_t d, Code* k_codes, float* k_scales, Code* v_codes, float* v_scales,
                          const float* k_shift, bool k_rotate) {
  std::vector<float> centered(k_shift || k_rotate ? size_t(d) : 0);
  for (int64_t i = 0; i < t; ++i) {
    const int64_t slot = slot_mapping[i];
    if (slot < 0) continue;
    for (int64_t h = 0; h < hkv; ++h) {
      const int64_t row = (i * hkv + h) * d, dst = (slot * hkv + h) * d;
      const float* key = k + row;
      if (k_shift || k_rotate) {
        for (int64_t c = 0; c < d; ++c) centered[size_t(c)] = k_shift ? key[c] - k_shift[h * d + c] : key[c];
        if (k_rotate) hadamard_transform(centered.data(), d);
        key = centered.data();
      }
      k_scales[slot * hkv + h] = Quantize(key, d, k_codes + dst);
      v_scales[slot * hkv + h] = Quantize(v + row, d, v_codes + dst);
    }
  }
}

}  // namespace

void kv_cache_write_fp8(const float* k, const float* v, const int64_t* slot_mapping, int64_t t,
                        int64_t hkv, int64_t d, Fp8Code* k_codes, float* k_scales, Fp8Code* v_codes,
                        float* v_scales, const float* k_shift, bool k_rotate) {
  kv_cache_write_codes<Fp8Code, &kv_quantize_row_fp8>(k, v, slot_mapping, t, hkv, d, k_codes, k_scales, v_codes,
                                                      v_scales, k_shift, k_rotate);
}

void kv_cache_write_int8(const float* k, const float* v, const int64_t* slot_mapping, int64_t t,
                         int64_t hkv, int64_t d, int8_t* k_codes, float* k_scales, int8_t* v_codes,
                         float* v_scales, const float* k_shift, bool k_rotate) {
  kv_cache_write_codes<int8_t, &kv_quantize_row>(k, v, slot_mapping, t, hkv, d, k_codes, k_scales, v_codes,
                                                 v_scales, k_shift, k_rotate);
}

void kv_cache_write(const float* k, const float* v, const int64_t* slot_mapping, int64_t t,
                    int64_t hkv, int64_t d, float* k_cache, float* v_cache) {
  const int64_t row = hkv * d;
  for (int64_t i = 0; i < t; ++i) {
    const int64_t slot = slot_mapping[i];
    if (slot < 0) continue;
    std::memcpy(k_cache + slot * row, k + i * row, size_t(row) * 4);
    std::memcpy(v_cache + slot * row, v + i * row, size_t(row) * 4);
  }
}

}  // namespace kiln::cpu
