// AVX2/FMA row kernels for LayerNorm and RMSNorm (with the optional fused residual add).
// Statistics accumulate in 8 f32 lanes; LayerNorm uses two passes (mean, then centred
// squares) to avoid the E[x²]-E[x]² cancellation. Tested in tests/backends/cpu/norm_test.cpp.
#include <immintrin.h>

#include <cmath>

#include "backends/cpu/kernels/isa.h"
#include "backends/cpu/kernels/vec_math_avx2.h"

namespace kiln::cpu::avx2 {
namespace {

// With a residual, writes sum = x + res and returns it as the row to normalize.
const float* residual_sum(const float* x, const float* res, int64_t dim, float* sum) {
  if (!res) return x;
  int64_t i = 0;
  for (; i + 8 <= dim; i += 8)
    _mm256_storeu_ps(sum + i, _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(res + i)));
  for (; i < dim; ++i) sum[i] = x[i] + res[i];
  return sum;
}

}  // namespace

void rms_norm_row(const float* x, const float* res, const float* w, float eps, int64_t dim,
                  float* sum, float* y) {
  const float* s = residual_sum(x, res, dim, sum);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= dim; i += 8) {
    const __m256 v = _mm256_loadu_ps(s + i);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  float ss = hsum(acc);
  for (int64_t j = i; j < dim; ++j) ss += s[j] * s[j];
  const float r = 1.0f / std::sqrt(ss / float(dim) + eps);
  const __m256 vr = vset(r);
  for (i = 0; i + 8 <= dim; i += 8)
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(s + i), vr), _mm256_loadu_ps(w + i)));
  for (; i < dim; ++i) y[i] = s[i] * r * w[i];
}

void layer_norm_row(const float* x, const float* res, const float* gamma, const float* beta,
                    float eps, int64_t dim, float* sum, float* y) {
  const float* s = residual_sum(x, res, dim, sum);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= dim; i += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(s + i));
  float total = hsum(acc);
  for (int64_t j = i; j < dim; ++j) total += s[j];
  const float mean = total / float(dim);
  const __m256 vmean = vset(mean);
  acc = _mm256_setzero_ps();
  for (i = 0; i + 8 <= dim; i += 8) {
    const __m256 c = _mm256_sub_ps(_mm256_loadu_ps(s + i), vmean);
    acc = _mm256_fmadd_ps(c, c, acc);
  }
  float var = hsum(acc);
  for (int64_t j = i; j < dim; ++j) var += (s[j] - mean) * (s[j] - mean);
  const float r = 1.0f / std::sqrt(var / float(dim) + eps);
  const __m256 vr = vset(r);
  for (i = 0; i + 8 <= dim; i += 8) {
    const __m256 c = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(s + i), vmean), vr);
    const __m256 b = beta ? _mm256_loadu_ps(beta + i) : _mm256_setzero_ps();
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(c, _mm256_loadu_ps(gamma + i), b));
  }
  for (; i < dim; ++i) y[i] = (s[i] - mean) * r * gamma[i] + (beta ? beta[i] : 0.0f);
}

}  // namespace kiln::cpu::avx2
