// AVX2/FMA elementwise kernels and row softmax, built on vec_math_avx2.h. Tails run the
// same vector code on a padded 8-float scratch so every element takes one code path.
// Tested in tests/backends/cpu/elementwise_test.cpp.
#include <immintrin.h>

#include <cstring>

#include "backends/cpu/kernels/isa.h"
#include "backends/cpu/kernels/vec_math_avx2.h"

namespace kiln::cpu::avx2 {
namespace {

inline __m256 gelu_erf_ps(__m256 x) { return vec::gelu_erf<vec::Y>(x); }
inline __m256 gelu_tanh_ps(__m256 x) { return vec::gelu_tanh<vec::Y>(x); }
inline __m256 silu_ps(__m256 x) { return vec::silu<vec::Y>(x); }

template <typename F>
void map1(const float* x, int64_t n, float* out, F f) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, f(_mm256_loadu_ps(x + i)));
  if (i < n) {
    float buf[8] = {};
    std::memcpy(buf, x + i, (n - i) * 4);
    _mm256_storeu_ps(buf, f(_mm256_loadu_ps(buf)));
    std::memcpy(out + i, buf, (n - i) * 4);
  }
}
template <typename F>
void map2(const float* a, const float* b, int64_t n, float* out, F f) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, f(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  if (i < n) {
    float ba[8] = {}, bb[8] = {};
    std::memcpy(ba, a + i, (n - i) * 4);
    std::memcpy(bb, b + i, (n - i) * 4);
    _mm256_storeu_ps(ba, f(_mm256_loadu_ps(ba), _mm256_loadu_ps(bb)));
    std::memcpy(out + i, ba, (n - i) * 4);
  }
}

}  // namespace

void unary(UnaryOp op, const float* x, int64_t n, float* out) {
  switch (op) {
    case UnaryOp::kGeluErf: return map1(x, n, out, gelu_erf_ps);
    case UnaryOp::kGeluTanh: return map1(x, n, out, gelu_tanh_ps);
    case UnaryOp::kSilu: return map1(x, n, out, silu_ps);
    case UnaryOp::kTanh: return map1(x, n, out, tanh_ps);
    case UnaryOp::kExp: return map1(x, n, out, exp_ps);
  }
}

void add(const float* a, const float* b, int64_t n, float* out) {
  map2(a, b, n, out, [](__m256 u, __m256 v) { return _mm256_add_ps(u, v); });
}
void mul(const float* a, const float* b, int64_t n, float* out) {
  map2(a, b, n, out, [](__m256 u, __m256 v) { return _mm256_mul_ps(u, v); });
}
void swiglu(const float* gate, const float* up, int64_t n, float* out) {
  map2(gate, up, n, out, [](__m256 g, __m256 u) { return _mm256_mul_ps(silu_ps(g), u); });
}

void softmax_row(const float* x, int64_t dim, float* out) {
  __m256 vmax = vset(-__builtin_inff());
  int64_t i = 0;
  for (; i + 8 <= dim; i += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(x + i));
  float mx = hmax(vmax);
  for (int64_t j = i; j < dim; ++j) mx = x[j] > mx ? x[j] : mx;
  const __m256 vm = vset(mx);
  __m256 vsum = _mm256_setzero_ps();
  map1(x, dim, out, [&](__m256 v) { return exp_ps(_mm256_sub_ps(v, vm)); });
  for (i = 0; i + 8 <= dim; i += 8) vsum = _mm256_add_ps(vsum, _mm256_loadu_ps(out + i));
  float sum = hsum(vsum);
  for (int64_t j = i; j < dim; ++j) sum += out[j];
  const __m256 inv = vset(1.0f / sum);
  map1(out, dim, out, [&](__m256 v) { return _mm256_mul_ps(v, inv); });
}

}  // namespace kiln::cpu::avx2
