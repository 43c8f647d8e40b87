// The GELU lookup tables' switch, cache and dispatch (see cuda_gelu_lut.h).
#include "backends/cuda/cuda_gelu_lut.h"

#include <atomic>
#include <cstring>

#include "backends/cuda/ops/elementwise_int8.h"
#include "core/env_switch.h"
#include "core/status.h"

namespace kiln::cuda {

namespace {

std::atomic<int64_t> g_tables_built{0};

// Where the product's passes read their tables (cuda_int8_gemm_bench times both).
constexpr UnaryLutRead kGeluLutRead = UnaryLutRead::kShared;

// The table of (op, t) [codes for inv] in cx, built when missing.
const void* lut_table(CudaContext& cx, UnaryOp op, DType t, std::optional<float> inv) {
  uint32_t inv_bits = 0;
  if (inv) std::memcpy(&inv_bits, &*inv, sizeof inv_bits);
  const uint64_t key = uint64_t(inv_bits) << 32 | uint64_t(inv ? 1 : 0) << 16 | uint64_t(op) << 8 | uint64_t(t);
  std::lock_guard<std::mutex> lock(cx.tables_mu);
  auto it = cx.tables.find(key);
  if (it != cx.tables.end()) return it->second.get();
  DeviceBuffer buf(size_t(kUnaryLutEntries) * (inv ? 1 : 2));
  if (inv) launch_unary_lut_fill_codes(op, t, *inv, static_cast<int8_t*>(buf.get()), cx.stream);
  else launch_unary_lut_fill(op, t, static_cast<uint16_t*>(buf.get()), cx.stream);
  KILN_CUDA_CHECK(cudaStreamSynchronize(cx.stream));
  ++g_tables_built;
  return cx.tables.emplace(key, std::move(buf)).first->second.get();
}

}  // namespace

bool gelu_lut_enabled() {
  return env_switch_off("KILN_CUDA_GELU_LUT", "the erf GELU passes look their outputs up in tables",
                        "the erf GELU passes compute them");
}

std::optional<UnaryLut> gelu_lut(CudaContext& cx, UnaryOp op, DType t, std::optional<float> inv) {
  if (op != UnaryOp::kGeluErf || (t != DType::kBF16 && t != DType::kF16) || !gelu_lut_enabled()) return std::nullopt;
  cx.make_current();
  UnaryLut lut;
  lut.dtype = t;
  lut.values = static_cast<const uint16_t*>(lut_table(cx, op, t, std::nullopt));
  if (inv) {
    lut.codes = static_cast<const int8_t*>(lut_table(cx, op, t, inv));
    lut.inv = *inv;
  }
  return lut;
}

int64_t gelu_lut_tables_built() { return g_tables_built.load(); }

void launch_unary_or_lut(const std::optional<UnaryLut>& lut, UnaryOp op, DType t, const void* x, int64_t n,
                         void* out, cudaStream_t s) {
  if (lut && lut->dtype == t) launch_unary_lut(*lut, x, n, out, s, kGeluLutRead);
  else launch_unary(op, t, x, n, out, s);
}

void launch_unary_int8_or_lut(const std::optional<UnaryLut>& lut, UnaryOp op, DType t, const void* x, int64_t rows,
                              int64_t k, float inv, int8_t* q, float* row_scale, cudaStream_t s) {
  // A static pass's tables were made for its inv (launch_unary_int8_lut checks).
  if (lut && lut->dtype == t) launch_unary_int8_lut(*lut, x, rows, k, inv, q, row_scale, s, kGeluLutRead);
  else launch_unary_int8(op, t, x, rows, k, inv, q, row_scale, s);
}

}  // namespace kiln::cuda
