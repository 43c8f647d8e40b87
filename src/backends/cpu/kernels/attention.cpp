// Paged attention (public entry point, argument checks, scalar Ops) and kv_cache_write.
// The loop itself is attention_impl.h; the AVX2 Ops are in attention_avx2.cpp.
// Tested in tests/backends/cpu/attention_test.cpp against dense attention on unpaged K/V.
#include <cmath>
#include <cstring>

#include "backends/cpu/kernels/attention_impl.h"
#include "backends/cpu/kernels/isa.h"
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
  static void scale(float* acc, float s, int64_t d) {
    for (int64_t i = 0; i < d; ++i) acc[i] *= s;
  }
  static void exp_inplace(float* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] = std::exp(x[i]);
  }
};

}  // namespace

void paged_attention(const float* q, const float* k_cache, const float* v_cache,
                     int64_t block_size, int64_t hq, int64_t hkv, int64_t d, float scale,
                     bool causal, const AttentionSeq* seqs, int64_t num_seqs, float* out) {
  KILN_THROW_IF(hkv <= 0 || hq % hkv != 0, kInvalidArgument,
                "paged_attention: Hq must be a multiple of Hkv, got Hq=", hq, " Hkv=", hkv);
  KILN_THROW_IF(block_size <= 0 || d <= 0, kInvalidArgument, "paged_attention: expected block_size, D > 0, got ",
                block_size, ", ", d);
  for (int64_t s = 0; s < num_seqs; ++s)
    KILN_THROW_IF(seqs[s].q_len < 0 || seqs[s].q_len > seqs[s].ctx_len, kInvalidArgument,
                  "paged_attention: sequence ", s, " has q_len=", seqs[s].q_len, " > ctx_len=",
                  seqs[s].ctx_len, " (ctx_len must include the new tokens)");
  if (use_avx2())
    avx2::paged_attention(q, k_cache, v_cache, block_size, hq, hkv, d, scale, causal, seqs, num_seqs, out);
  else
    paged_attention_impl<ScalarOps>(q, k_cache, v_cache, block_size, hq, hkv, d, scale, causal, seqs,
                                    num_seqs, out);
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
