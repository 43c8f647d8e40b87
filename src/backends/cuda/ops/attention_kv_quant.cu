// The int8 / FP8 KV cache on the device: the quantizing cache write and the attention
// kernels' instantiations for quantized caches (attention_kernels.cuh). Rows quantize
// exactly as the CPU backend's kv_quantize_row / kv_quantize_row_fp8 do (f32 amax, the
// factors 127.0f / amax and amax / 127.0f - or 448 - as IEEE divisions, round to
// nearest even, E4M3 through the hardware's saturating conversion), so both backends
// store the same codes and scales for the same K/V values. Tested against the CPU
// backend in tests/backends/cuda/attention_test.cpp and kv_swap_test.cpp.
#include "backends/cuda/ops/attention_kernels.cuh"

namespace kiln::cuda {
namespace {

constexpr int kQuantWarps = 4;

// One warp per (token, kv head, K or V) row (kv_quantize_row: the row's D values read
// twice; the second pass hits L1).
template <typename T, KvCode Q>
__global__ void __launch_bounds__(kQuantWarps * 32)
kv_quant_write_kernel(const T* __restrict__ k, const T* __restrict__ v, int64_t row_stride,
                      const int64_t* __restrict__ slots, int64_t tokens, int hkv, int d, uint8_t* __restrict__ kc,
                      float* __restrict__ ks, uint8_t* __restrict__ vc, float* __restrict__ vs,
                      const float* __restrict__ k_shift, bool k_rotate) {
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kQuantWarps + (threadIdx.x >> 5);
  if (row >= tokens * 2 * hkv) return;  // uniform across the warp
  const int64_t t = row / (2 * hkv);
  const int which = int(row % (2 * hkv)), h = which % hkv;
  const bool is_v = which >= hkv;
  const int64_t slot = slots[t];
  if (slot < 0) return;
  const T* x = (is_v ? v : k) + t * row_stride + int64_t(h) * d;
  const float* shift = !is_v && k_shift ? k_shift + int64_t(h) * d : nullptr;
  const float sc = kv_quantize_row<T, Q>(x, d, (is_v ? vc : kc) + (slot * hkv + h) * d, shift, !is_v && k_rotate);
  if (lane == 0) (is_v ? vs : ks)[slot * hkv + h] = sc;
}

}  // namespace

void launch_attention_quantized(const AttentionArgs& a, cudaStream_t s) {
  if (a.kv_code == KvCode::kInt8)
    launch_attention_codes<KvCode::kInt8>(a, s);
  else
    launch_attention_codes<KvCode::kFp8>(a, s);
}

void launch_kv_quant_write(DType t, KvCode code, const void* k, const void* v, int64_t row_stride,
                           const int64_t* slot_mapping, int64_t tokens, int64_t hkv, int64_t d, uint8_t* k_codes,
                           float* k_scales, uint8_t* v_codes, float* v_scales, cudaStream_t s,
                           const float* k_shift, bool k_rotate) {
  if (tokens == 0) return;
  KILN_THROW_IF(code == KvCode::kNone, kInternal, "kv_quant_write: the cache is not quantized");
  KILN_THROW_IF(d <= 0 || d > kKvQuantMaxDim, kInternal, "kv_quant_write: head_dim ", d, " (1 to ", kKvQuantMaxDim,
                " here)");
  const int64_t rows = tokens * 2 * hkv;
  const unsigned grid = unsigned((rows + kQuantWarps - 1) / kQuantWarps);
  KILN_CUDA_DISPATCH_FLOAT(t, T, {
    const auto* kt = static_cast<const T*>(k);
    const auto* vt = static_cast<const T*>(v);
    if (code == KvCode::kInt8)
      launch_k(kv_quant_write_kernel<T, KvCode::kInt8>, grid, kQuantWarps * 32, 0, s, kt, vt, row_stride,
          slot_mapping, tokens, int(hkv), int(d), k_codes, k_scales, v_codes, v_scales, k_shift, k_rotate);
    else
      launch_k(kv_quant_write_kernel<T, KvCode::kFp8>, grid, kQuantWarps * 32, 0, s, kt, vt, row_stride,
          slot_mapping, tokens, int(hkv), int(d), k_codes, k_scales, v_codes, v_scales, k_shift, k_rotate);
  });
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
