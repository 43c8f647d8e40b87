// LayerNorm and RMSNorm (plain and fused with the residual add): the public entry points,
// the scalar fallback, and row threading. The AVX2 rows are in norm_avx2.cpp.
// Tested in tests/backends/cpu/norm_test.cpp against double-precision references.
#include <cmath>

#include "backends/cpu/kernels/isa.h"
#include "core/thread_pool.h"

namespace kiln::cpu {
namespace {

const float* scalar_residual_sum(const float* x, const float* res, int64_t dim, float* sum) {
  if (!res) return x;
  for (int64_t i = 0; i < dim; ++i) sum[i] = x[i] + res[i];
  return sum;
}

void scalar_rms_norm_row(const float* x, const float* res, const float* w, float eps, int64_t dim,
                         float* sum, float* y) {
  const float* s = scalar_residual_sum(x, res, dim, sum);
  float ss = 0.0f;
  for (int64_t i = 0; i < dim; ++i) ss += s[i] * s[i];
  const float r = 1.0f / std::sqrt(ss / float(dim) + eps);
  for (int64_t i = 0; i < dim; ++i) y[i] = s[i] * r * w[i];
}

void scalar_layer_norm_row(const float* x, const float* res, const float* gamma, const float* beta,
                           float eps, int64_t dim, float* sum, float* y) {
  const float* s = scalar_residual_sum(x, res, dim, sum);
  float total = 0.0f;
  for (int64_t i = 0; i < dim; ++i) total += s[i];
  const float mean = total / float(dim);
  float var = 0.0f;
  for (int64_t i = 0; i < dim; ++i) var += (s[i] - mean) * (s[i] - mean);
  const float r = 1.0f / std::sqrt(var / float(dim) + eps);
  for (int64_t i = 0; i < dim; ++i) y[i] = (s[i] - mean) * r * gamma[i] + (beta ? beta[i] : 0.0f);
}

// Rows are independent; small inputs stay on the calling thread.
template <typename F>
void for_rows(int64_t rows, int64_t dim, F f) {
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, dim));
  ThreadPool::global().parallel_for(
      rows, [&](int64_t b, int64_t e, int) { for (int64_t r = b; r < e; ++r) f(r); }, grain);
}

void rms_norm_impl(const float* x, const float* res, const float* w, float eps, int64_t rows,
                   int64_t dim, float* sum, float* y) {
  const bool vec = use_avx2();
  for_rows(rows, dim, [&](int64_t r) {
    const int64_t o = r * dim;
    (vec ? avx2::rms_norm_row : scalar_rms_norm_row)(x + o, res ? res + o : nullptr, w, eps, dim,
                                                     sum ? sum + o : nullptr, y + o);
  });
}

void layer_norm_impl(const float* x, const float* res, const float* gamma, const float* beta,
                     float eps, int64_t rows, int64_t dim, float* sum, float* y) {
  const bool vec = use_avx2();
  for_rows(rows, dim, [&](int64_t r) {
    const int64_t o = r * dim;
    (vec ? avx2::layer_norm_row : scalar_layer_norm_row)(x + o, res ? res + o : nullptr, gamma, beta,
                                                         eps, dim, sum ? sum + o : nullptr, y + o);
  });
}

}  // namespace

void layer_norm(const float* x, const float* gamma, const float* beta, float eps, int64_t rows,
                int64_t dim, float* y) {
  layer_norm_impl(x, nullptr, gamma, beta, eps, rows, dim, nullptr, y);
}
void rms_norm(const float* x, const float* w, float eps, int64_t rows, int64_t dim, float* y) {
  rms_norm_impl(x, nullptr, w, eps, rows, dim, nullptr, y);
}
void head_rms_norm(const float* x, const float* w, int64_t w_stride, float eps, int64_t rows, int64_t width,
                   int64_t groups, int64_t d, float* y) {
  const bool vec = use_avx2();
  for_rows(rows, width, [&](int64_t r) {
    const float* xr = x + r * width;
    float* yr = y + r * width;
    for (int64_t g = 0; g < groups; ++g)
      (vec ? avx2::rms_norm_row : scalar_rms_norm_row)(xr + g * d, nullptr, w + g * w_stride, eps, d, nullptr,
                                                       yr + g * d);
    for (int64_t i = groups * d; i < width; ++i) yr[i] = xr[i];
  });
}
void add_rms_norm(const float* x, const float* residual, const float* w, float eps, int64_t rows,
                  int64_t dim, float* sum, float* y) {
  rms_norm_impl(x, residual, w, eps, rows, dim, sum, y);
}
void add_layer_norm(const float* x, const float* residual, const float* gamma, const float* beta,
                    float eps, int64_t rows, int64_t dim, float* sum, float* y) {
  layer_norm_impl(x, residual, gamma, beta, eps, rows, dim, sum, y);
}

}  // namespace kiln::cpu
