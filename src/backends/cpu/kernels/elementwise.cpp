// Elementwise ops and row softmax: public entry points, scalar fallback (std:: math in double),
// and chunked threading. The AVX2 versions are in elementwise_avx2.cpp.
// Tested in tests/backends/cpu/elementwise_test.cpp against double-precision std:: math.
#include <algorithm>
#include <cmath>
#include <limits>

#include "backends/cpu/kernels/isa.h"
#include "core/thread_pool.h"

namespace kiln::cpu {
namespace {

constexpr int64_t kGrain = 16384;  // elements per chunk: below this threading costs more than it saves

// The fallback evaluates in double: it is then accurate to f32 rounding even where the
// f32 formulas are ill-conditioned (erfc and exp of large arguments).
float scalar_unary(UnaryOp op, float xf) {
  const double x = xf;
  switch (op) {
    case UnaryOp::kGeluErf: return float(0.5 * x * std::erfc(-x * 0.70710678118654752));
    case UnaryOp::kGeluTanh: {
      const double u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
      return float(x / (1.0 + std::exp(-2.0 * u)));  // = 0.5x(1+tanh u), no cancellation for x << 0
    }
    case UnaryOp::kSilu: return float(x / (1.0 + std::exp(-x)));
    case UnaryOp::kTanh: return std::tanh(xf);
    case UnaryOp::kExp: return std::exp(xf);
  }
  return 0.0f;
}

void unary(UnaryOp op, const float* x, int64_t n, float* out) {
  const bool vec = use_avx2(), zmm = avx512_enabled();
  ThreadPool::global().parallel_for(n, [&](int64_t b, int64_t e, int) {
    if (zmm) return avx512::unary(op, x + b, e - b, out + b);
    if (vec) return avx2::unary(op, x + b, e - b, out + b);
    for (int64_t i = b; i < e; ++i) out[i] = scalar_unary(op, x[i]);
  }, kGrain);
}

template <typename VecF, typename ScalarF>
void binary(const float* a, const float* b, int64_t n, float* out, VecF vf, ScalarF sf) {
  const bool vec = use_avx2();
  ThreadPool::global().parallel_for(n, [&](int64_t lo, int64_t hi, int) {
    if (vec) return vf(a + lo, b + lo, hi - lo, out + lo);
    for (int64_t i = lo; i < hi; ++i) out[i] = sf(a[i], b[i]);
  }, kGrain);
}

void scalar_softmax_row(const float* x, int64_t dim, float* out) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < dim; ++i) mx = std::max(mx, x[i]);
  float sum = 0.0f;
  for (int64_t i = 0; i < dim; ++i) sum += (out[i] = std::exp(x[i] - mx));
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < dim; ++i) out[i] *= inv;
}

}  // namespace

void add(const float* a, const float* b, int64_t n, float* out) {
  binary(a, b, n, out, avx2::add, [](float u, float v) { return u + v; });
}
void mul(const float* a, const float* b, int64_t n, float* out) {
  binary(a, b, n, out, avx2::mul, [](float u, float v) { return u * v; });
}
void swiglu(const float* gate, const float* up, int64_t n, float* out) {
  binary(gate, up, n, out, avx512_enabled() ? avx512::swiglu : avx2::swiglu,
         [](float g, float u) { return g / (1.0f + std::exp(-g)) * u; });
}
void gelu_erf(const float* x, int64_t n, float* out) { unary(UnaryOp::kGeluErf, x, n, out); }
void gelu_tanh(const float* x, int64_t n, float* out) { unary(UnaryOp::kGeluTanh, x, n, out); }
void silu(const float* x, int64_t n, float* out) { unary(UnaryOp::kSilu, x, n, out); }
void tanh(const float* x, int64_t n, float* out) { unary(UnaryOp::kTanh, x, n, out); }
void exp(const float* x, int64_t n, float* out) { unary(UnaryOp::kExp, x, n, out); }

void softmax_row(const float* x, int64_t dim, float* out) {
  (use_avx2() ? avx2::softmax_row : scalar_softmax_row)(x, dim, out);
}

void softmax_rows(const float* x, int64_t rows, int64_t dim, float* out) {
  const bool vec = use_avx2();
  const int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(1, dim));
  ThreadPool::global().parallel_for(rows, [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r)
      (vec ? avx2::softmax_row : scalar_softmax_row)(x + r * dim, dim, out + r * dim);
  }, grain);
}

}  // namespace kiln::cpu
