// Device pieces shared by the Linear kernels of the GEMV family (gemv.cu, gemv_quant_mma.cu):
// the m16n8k16 tensor-core mma wrapper and the Linear epilogue with the unfused kernels'
// rounding. Included only by .cu files; exercised by the Linear cases of
// tests/backends/cuda/ops_test.cpp and quant_test.cpp.
#pragma once

#include <type_traits>

#include "backends/cuda/common.cuh"
#include "backends/cuda/ops/gemv.h"

namespace kiln::cuda {

// d = a·b + c on one 16x8x16 tile (A row-major 16x16, B 16x8 "col", f32 accumulators).
// Fragments (g = lane / 4, t = lane % 4): a[0] row g k 2t..2t+1, a[1] row g+8, a[2] row g
// k 2t+8.., a[3] row g+8 k 2t+8..; b0 k 2t..2t+1 col g, b1 k 2t+8..; d[0..1] row g cols
// 2t, 2t+1, d[2..3] row g+8.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                          const float (&c)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %11, %12, %13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
  else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %11, %12, %13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
#else
  __trap();  // callers choose these kernels only on sm_80+
#endif
}

// A Linear output v (the f32 sum plus bias) through epilogue `e` (not kSwiGlu), rounded as
// the unfused kernels would round it: the GEMM stores T, the activation reads it back.
template <typename T>
__device__ __forceinline__ T linear_epilogue_out(GemvEpilogue e, float v) {
  const float y0 = to_f32(from_f32<T>(v));
  float out = y0;
  if (e == GemvEpilogue::kGeluErf) out = unary_f32<UnaryOp::kGeluErf>(y0);
  else if (e == GemvEpilogue::kGeluTanh) out = unary_f32<UnaryOp::kGeluTanh>(y0);
  else if (e == GemvEpilogue::kSilu) out = unary_f32<UnaryOp::kSilu>(y0);
  return from_f32<T>(out);
}
// silu(gate) * up of a merged gate|up Linear, rounded as GEMM -> SwiGLU kernel would.
template <typename T>
__device__ __forceinline__ T linear_swiglu_out(float gate, float up) {
  const float y0 = to_f32(from_f32<T>(gate));
  return from_f32<T>(to_f32(from_f32<T>(unary_f32<UnaryOp::kSilu>(y0))) * to_f32(from_f32<T>(up)));
}

}  // namespace kiln::cuda
