// The GELU lookup tables' switch, cache and dispatch (see cuda_gelu_lut.h).
#include "backends/cuda/cuda_gelu_lut.h"

#include <atomic>

#include "backends/cuda/ops/elementwise_int8.h"
#include "core/env_switch.h"
#include "core/status.h"

namespace kiln::cuda {

namespace {

std::atomic<int64_t> g_tables_built{0};

// Where the passes read their tables (cuda_int8_gemm_bench times both; H200, 2026-11-30):
// through L1 for T out (21.5 us at [4096, 3072] vs 28.1 staged, whose 128 KB a CTA also
// cost BERT-base b1 ~14 us a layer) and static codes (11.9 vs 12.9); the per-token pass
// reads the 128 KB values table, staged only over large tensors (52.5 vs 68.5 us at
// [2048, 14336]; 16.8 vs 17.1 at [4096, 3072]), where the staging is paid back.
constexpr int64_t kPerTokenSharedMinElems = int64_t(1) << 24;
// Below this many elements the default mode (auto) computes: a small pass's few CTAs pull
// the table into L1 with dependent gathers. BERT-base W8A8 per layer, table - arithmetic:
// b1 ([128, 3072]) +6.7 us, b8 (3.1 M elements) +1.7 us, b32 (12.6 M) -13 us (H200,
// 2026-11-30); the line through them crosses zero near 4.5 M.
constexpr int64_t kAutoMinElems = int64_t(1) << 22;

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

GeluLutMode gelu_lut_mode() {
  switch (env_auto("KILN_CUDA_GELU_LUT",
                   "the erf GELU passes that write int8 codes look them up in tables",
                   "every erf GELU pass does", "they all compute")) {
    case EnvAuto::kOn:
      return GeluLutMode::kAll;
    case EnvAuto::kOff:
      return GeluLutMode::kOff;
    default:
      return GeluLutMode::kCodes;
  }
}

std::optional<UnaryLut> gelu_lut(CudaContext& cx, UnaryOp op, DType t, GeluPass pass, std::optional<float> inv) {
  if (op != UnaryOp::kGeluErf || (t != DType::kBF16 && t != DType::kF16)) return std::nullopt;
  const GeluLutMode mode = gelu_lut_mode();
  if (mode == GeluLutMode::kOff || (mode == GeluLutMode::kCodes && pass != GeluPass::kCodes)) return std::nullopt;
  cx.make_current();
  UnaryLut lut;
  lut.dtype = t;
  lut.min_elems = mode == GeluLutMode::kCodes ? kAutoMinElems : 0;
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
  if (lut && lut->dtype == t && n >= lut->min_elems) launch_unary_lut(*lut, x, n, out, s, UnaryLutRead::kGlobal);
  else launch_unary(op, t, x, n, out, s);
}

void launch_unary_int8_or_lut(const std::optional<UnaryLut>& lut, UnaryOp op, DType t, const void* x, int64_t rows,
                              int64_t k, float inv, int8_t* q, float* row_scale, cudaStream_t s) {
  // A static pass's tables were made for its inv (launch_unary_int8_lut checks).
  const bool staged = row_scale && rows * k >= kPerTokenSharedMinElems;  // per token, large
  if (lut && lut->dtype == t && rows * k >= lut->min_elems)
    launch_unary_int8_lut(*lut, x, rows, k, inv, q, row_scale, s, staged ? UnaryLutRead::kShared : UnaryLutRead::kGlobal);
  else launch_unary_int8(op, t, x, rows, k, inv, q, row_scale, s);
}

}  // namespace kiln::cuda
