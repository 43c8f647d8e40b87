// AVX-512 elementwise activations and SwiGLU: vec_math.h's functions 16 lanes wide, the
// same operations per lane as the AVX2 kernels (elementwise_avx2.cpp), so both give the same
// bits at twice the width; a tail runs masked (its dead lanes compute on zeros and are not
// stored). Compiled with -mavx512f -mavx512bw -mavx512vl -mfma; called only where
// avx512_enabled(). Tested in tests/backends/cpu/elementwise_test.cpp.
#include <immintrin.h>

#include "backends/cpu/kernels/isa.h"
#include "backends/cpu/kernels/vec_math.h"

namespace kiln::cpu::avx512 {
namespace {

inline __mmask16 tail_mask(int64_t n) { return __mmask16((1u << n) - 1); }

template <typename F>
void map1(const float* x, int64_t n, float* out, F f) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, f(_mm512_loadu_ps(x + i)));
  if (i < n) {
    const __mmask16 k = tail_mask(n - i);
    _mm512_mask_storeu_ps(out + i, k, f(_mm512_maskz_loadu_ps(k, x + i)));
  }
}

}  // namespace

void unary(UnaryOp op, const float* x, int64_t n, float* out) {
  using vec::Z;
  switch (op) {
    case UnaryOp::kGeluErf: return map1(x, n, out, vec::gelu_erf<Z>);
    case UnaryOp::kGeluTanh: return map1(x, n, out, vec::gelu_tanh<Z>);
    case UnaryOp::kSilu: return map1(x, n, out, vec::silu<Z>);
    case UnaryOp::kTanh: return map1(x, n, out, vec::tanh<Z>);
    case UnaryOp::kExp: return map1(x, n, out, vec::exp<Z>);
  }
}

void swiglu(const float* gate, const float* up, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(out + i, _mm512_mul_ps(vec::silu<vec::Z>(_mm512_loadu_ps(gate + i)), _mm512_loadu_ps(up + i)));
  if (i < n) {
    const __mmask16 k = tail_mask(n - i);
    const __m512 g = _mm512_maskz_loadu_ps(k, gate + i), u = _mm512_maskz_loadu_ps(k, up + i);
    _mm512_mask_storeu_ps(out + i, k, _mm512_mul_ps(vec::silu<vec::Z>(g), u));
  }
}

}  // namespace kiln::cpu::avx512
