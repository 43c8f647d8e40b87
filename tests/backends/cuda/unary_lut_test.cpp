// The activation lookup tables (ops/unary_lut.h) against the arithmetic kernels they
// replace, bit for bit: every one of the 65,536 bf16 and f16 inputs (NaN and Inf
// patterns included) and realistic activations, through the T -> T pass (launch_unary's
// output, in place too), the static codes pass with several inverse scales (saturating
// ones among them) and the per-token pass (codes and row scales, launch_unary_int8's),
// both table reads (shared memory, global), over rows 1..4096 and k 4..65536 (k not a
// multiple of 8, unaligned rows); the tables of every activation, and the GELU table
// against the erf GELU computed on the host within two ulps of the dtype. Then
// KILN_CUDA_GELU_LUT: its parsing (no GPU) and the tables it builds once per context.
// The device parts skip without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_context.h"
#include "backends/cuda/cuda_gelu_lut.h"
#include "backends/cuda/ops/elementwise.h"
#include "backends/cuda/ops/elementwise_int8.h"
#include "backends/cuda/ops/unary_lut.h"
#include "core/dtype.h"
#include "core/status.h"
#include "cuda_test_util.h"

namespace kiln::cuda {
namespace {

using namespace testing;

// A device buffer, freed at scope exit.
class Dev {
 public:
  explicit Dev(size_t bytes) { KILN_CUDA_CHECK(cudaMalloc(&p_, std::max<size_t>(bytes, 1))); }
  ~Dev() { cudaFree(p_); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  template <typename T = void>
  T* as(size_t byte_offset = 0) const {
    return reinterpret_cast<T*>(static_cast<char*>(p_) + byte_offset);
  }
  template <typename T>
  void put(const std::vector<T>& h, size_t byte_offset = 0) const {
    KILN_CUDA_CHECK(cudaMemcpy(as<char>(byte_offset), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  template <typename T>
  std::vector<T> get(size_t n, size_t byte_offset = 0) const {
    std::vector<T> h(n);
    KILN_CUDA_CHECK(cudaMemcpy(h.data(), as<char>(byte_offset), n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }

 private:
  void* p_ = nullptr;
};

// Positions where two equal-length byte images differ (0: bit-identical).
template <typename T>
size_t differing(const std::vector<T>& a, const std::vector<T>& b) {
  EXPECT_EQ(a.size(), b.size());
  size_t bad = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) bad += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  return bad;
}

// n inputs: every bit pattern, in a random order, repeated (n >= 65536 holds each one).
std::vector<uint16_t> every_pattern(int64_t n, std::mt19937_64& rng) {
  std::vector<uint16_t> perm(kUnaryLutEntries);
  std::iota(perm.begin(), perm.end(), uint16_t(0));
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = perm[size_t(i % kUnaryLutEntries)];
  return v;
}

// n activations as a GEMM leaves them before its GELU: normal, sd 2, and a few far out.
std::vector<uint16_t> activations(DType t, int64_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> d(0.0f, 2.0f);
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const float f = i % 997 == 5 ? 40.0f * d(rng) : d(rng);
    v[size_t(i)] = t == DType::kBF16 ? f32_to_bf16(f) : f32_to_f16(f);
  }
  return v;
}

struct Tables {
  Dev values{size_t(kUnaryLutEntries) * 2};
  Dev codes{size_t(kUnaryLutEntries)};
  UnaryLut lut(DType t, std::optional<float> inv = std::nullopt) const {
    UnaryLut l;
    l.dtype = t;
    l.values = values.as<uint16_t>();
    if (inv) l.codes = codes.as<int8_t>(), l.inv = *inv;
    return l;
  }
};

const char* read_name(UnaryLutRead r) { return r == UnaryLutRead::kShared ? "shared" : "global"; }

// Every pass of the GELU tables against the arithmetic kernels over rows x k of `x` (host
// bits), x placed `offset` bytes into its buffer (8: rows no longer 16-byte aligned).
void check_passes(DType t, int64_t rows, int64_t k, const std::vector<uint16_t>& xh, size_t offset, const char* what) {
  const int64_t n = rows * k;
  SCOPED_TRACE(::testing::Message() << dtype_name(t) << " " << what << " rows " << rows << " k " << k << " offset "
                                    << offset);
  Tables tab;
  launch_unary_lut_fill(UnaryOp::kGeluErf, t, tab.values.as<uint16_t>(), nullptr);
  Dev x(size_t(n) * 2 + offset), ref(size_t(n) * 2 + offset), out(size_t(n) * 2 + offset);
  Dev q_ref(size_t(n) + offset), q(size_t(n) + offset), rs_ref(size_t(rows) * 4), rs(size_t(rows) * 4);
  x.put(xh, offset);
  const void* px = x.as(offset);
  // T out: launch_unary's, into another buffer and in place.
  launch_unary(UnaryOp::kGeluErf, t, px, n, ref.as(offset), nullptr);
  const auto want = ref.get<uint16_t>(size_t(n), offset);
  for (UnaryLutRead read : {UnaryLutRead::kShared, UnaryLutRead::kGlobal}) {
    launch_unary_lut(tab.lut(t), px, n, out.as(offset), nullptr, read);
    EXPECT_EQ(differing(out.get<uint16_t>(size_t(n), offset), want), 0u) << "T out, " << read_name(read);
    out.put(xh, offset);
    launch_unary_lut(tab.lut(t), out.as(offset), n, out.as(offset), nullptr, read);
    EXPECT_EQ(differing(out.get<uint16_t>(size_t(n), offset), want), 0u) << "T out in place, " << read_name(read);
  }
  // Static codes: a typical scale, 1, a scale that saturates most codes, and 0.
  for (float inv : {1.0f / 0.03f, 1.0f, 1000.0f, 0.0f}) {
    launch_unary_lut_fill_codes(UnaryOp::kGeluErf, t, inv, tab.codes.as<int8_t>(), nullptr);
    launch_unary_int8(UnaryOp::kGeluErf, t, px, rows, k, inv, q_ref.as<int8_t>(offset), nullptr, nullptr);
    const auto want_q = q_ref.get<int8_t>(size_t(n), offset);
    for (UnaryLutRead read : {UnaryLutRead::kShared, UnaryLutRead::kGlobal}) {
      KILN_CUDA_CHECK(cudaMemset(q.as(), 0x55, size_t(n) + offset));
      launch_unary_int8_lut(tab.lut(t, inv), px, rows, k, inv, q.as<int8_t>(offset), nullptr, nullptr, read);
      EXPECT_EQ(differing(q.get<int8_t>(size_t(n), offset), want_q), 0u) << "static codes, inv " << inv << ", "
                                                                         << read_name(read);
    }
  }
  // Per token: codes and row scales.
  launch_unary_int8(UnaryOp::kGeluErf, t, px, rows, k, 0.0f, q_ref.as<int8_t>(offset), rs_ref.as<float>(), nullptr);
  const auto want_q = q_ref.get<int8_t>(size_t(n), offset);
  const auto want_rs = rs_ref.get<float>(size_t(rows));
  for (UnaryLutRead read : {UnaryLutRead::kShared, UnaryLutRead::kGlobal}) {
    KILN_CUDA_CHECK(cudaMemset(q.as(), 0x55, size_t(n) + offset));
    KILN_CUDA_CHECK(cudaMemset(rs.as(), 0x55, size_t(rows) * 4));
    launch_unary_int8_lut(tab.lut(t), px, rows, k, 0.0f, q.as<int8_t>(offset), rs.as<float>(), nullptr, read);
    EXPECT_EQ(differing(q.get<int8_t>(size_t(n), offset), want_q), 0u) << "per-token codes, " << read_name(read);
    EXPECT_EQ(differing(rs.get<float>(size_t(rows)), want_rs), 0u) << "row scales, " << read_name(read);
  }
}

TEST(CudaUnaryLut, EveryInputMatchesTheArithmeticKernels) {
  KILN_SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng(21);
  struct Shape {
    int64_t rows, k;
  };
  // Each holds every bit pattern at least once; k 100 and 68 are not multiples of 8.
  const Shape shapes[] = {{1, 65536}, {16, 4096}, {4096, 64}, {4096, 3072}, {656, 100}, {964, 68}, {5, 14336}};
  for (DType t : {DType::kBF16, DType::kF16})
    for (const Shape& s : shapes) {
      const auto x = every_pattern(s.rows * s.k, rng);
      check_passes(t, s.rows, s.k, x, 0, "every pattern");
      if (s.rows == 16) check_passes(t, s.rows, s.k, x, 8, "every pattern");  // 8-byte aligned rows: the 4-wide path
    }
}

TEST(CudaUnaryLut, ActivationsMatchTheArithmeticKernels) {
  KILN_SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng(22);
  struct Shape {
    int64_t rows, k;
  };
  // Rows of 1, 3 and 4096; the per-token pass's held vectors (12 x 8 a lane) cover 3072, not 14336.
  const Shape shapes[] = {{1, 64}, {1, 14336}, {3, 3072}, {3, 100}, {3, 4}, {4096, 3072}, {3, 14336}, {1, 12}};
  for (DType t : {DType::kBF16, DType::kF16})
    for (const Shape& s : shapes) {
      const auto x = activations(t, s.rows * s.k, rng);
      check_passes(t, s.rows, s.k, x, 0, "activations");
      if (s.k % 4 == 0) check_passes(t, s.rows, s.k, x, 8, "activations");
    }
}

// The values table of every activation is launch_unary's output on every input.
TEST(CudaUnaryLut, TablesOfEveryActivationMatchTheArithmetic) {
  KILN_SKIP_WITHOUT_CUDA();
  std::vector<uint16_t> all(kUnaryLutEntries);
  std::iota(all.begin(), all.end(), uint16_t(0));
  Dev x(all.size() * 2), ref(all.size() * 2), table(all.size() * 2), codes(all.size()), q_ref(all.size());
  x.put(all);
  for (DType t : {DType::kBF16, DType::kF16})
    for (UnaryOp op : {UnaryOp::kGeluErf, UnaryOp::kGeluTanh, UnaryOp::kSilu, UnaryOp::kTanh}) {
      launch_unary_lut_fill(op, t, table.as<uint16_t>(), nullptr);
      launch_unary(op, t, x.as(), int64_t(all.size()), ref.as(), nullptr);
      EXPECT_EQ(differing(table.get<uint16_t>(all.size()), ref.get<uint16_t>(all.size())), 0u)
          << dtype_name(t) << " op " << int(op);
      if (op == UnaryOp::kTanh) continue;  // launch_unary_int8 takes the other three
      launch_unary_lut_fill_codes(op, t, 1.0f / 0.05f, codes.as<int8_t>(), nullptr);
      launch_unary_int8(op, t, x.as(), 1, int64_t(all.size()), 1.0f / 0.05f, q_ref.as<int8_t>(), nullptr, nullptr);
      EXPECT_EQ(differing(codes.get<int8_t>(all.size()), q_ref.get<int8_t>(all.size())), 0u)
          << dtype_name(t) << " op " << int(op) << " codes";
    }
}

// An independent check of what the tables hold: the erf GELU in double on the host,
// rounded to the dtype, within two ulps for every finite input (outputs too small for a
// relative bound: absolutely).
TEST(CudaUnaryLut, GeluTableMatchesTheHostGelu) {
  KILN_SKIP_WITHOUT_CUDA();
  Dev table(static_cast<size_t>(kUnaryLutEntries) * 2);
  for (DType t : {DType::kBF16, DType::kF16}) {
    launch_unary_lut_fill(UnaryOp::kGeluErf, t, table.as<uint16_t>(), nullptr);
    const auto got = table.get<uint16_t>(size_t(kUnaryLutEntries));
    const bool bf = t == DType::kBF16;
    const double rel = bf ? 1.0 / 128 : 1.0 / 1024, floor = bf ? 1e-30 : 1.2e-7;
    int bad = 0, checked = 0;
    for (uint32_t b = 0; b < uint32_t(kUnaryLutEntries); ++b) {
      const float x = bf ? bf16_to_f32(uint16_t(b)) : f16_to_f32(uint16_t(b));
      if (!std::isfinite(x)) continue;
      const double ref = 0.5 * double(x) * std::erfc(-double(x) / std::sqrt(2.0));
      const float y = bf ? bf16_to_f32(got[b]) : f16_to_f32(got[b]);
      ++checked;
      if (!(std::fabs(double(y) - ref) <= std::max(rel * std::fabs(ref), floor)) && ++bad <= 5)
        ADD_FAILURE() << dtype_name(t) << " gelu(" << x << ") = " << y << ", expected " << ref;
    }
    EXPECT_EQ(bad, 0) << dtype_name(t) << " of " << checked << " finite inputs";
    EXPECT_GT(checked, 60000);
  }
}

TEST(CudaUnaryLut, SwitchParsing) {
  for (const char* v : {"", "auto"}) {
    ScopedEnv env("KILN_CUDA_GELU_LUT", v);
    EXPECT_EQ(gelu_lut_mode(), GeluLutMode::kCodes) << "'" << v << "': the codes passes by default";
  }
  {
    ScopedEnv env("KILN_CUDA_GELU_LUT", "0");
    EXPECT_EQ(gelu_lut_mode(), GeluLutMode::kOff);
  }
  {
    ScopedEnv env("KILN_CUDA_GELU_LUT", "1");
    EXPECT_EQ(gelu_lut_mode(), GeluLutMode::kAll);
  }
  ScopedEnv env("KILN_CUDA_GELU_LUT", "on");
  try {
    (void)gelu_lut_mode();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("KILN_CUDA_GELU_LUT='on'"), std::string::npos) << e.what();
  }
}

// gelu_lut: tables for the erf GELU in bf16/f16 only, for the passes the mode names (auto:
// the codes passes); each table built once per context and key; they hold what the fill
// kernels make.
TEST(CudaUnaryLut, ContextBuildsEachTableOnce) {
  KILN_SKIP_WITHOUT_CUDA();
  CudaContext cx(0);
  {
    ScopedEnv env("KILN_CUDA_GELU_LUT", "0");
    EXPECT_FALSE(gelu_lut(cx, UnaryOp::kGeluErf, DType::kBF16, GeluPass::kCodes).has_value());
  }
  ScopedEnv env("KILN_CUDA_GELU_LUT", "1");
  EXPECT_FALSE(gelu_lut(cx, UnaryOp::kGeluTanh, DType::kBF16, GeluPass::kValues).has_value());
  EXPECT_FALSE(gelu_lut(cx, UnaryOp::kGeluErf, DType::kF32, GeluPass::kValues).has_value());
  const int64_t before = gelu_lut_tables_built();
  const auto a = gelu_lut(cx, UnaryOp::kGeluErf, DType::kBF16, GeluPass::kCodes, 1.0f / 0.03f);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(gelu_lut_tables_built(), before + 2) << "values and codes";
  const auto b = gelu_lut(cx, UnaryOp::kGeluErf, DType::kBF16, GeluPass::kValues);
  const auto c = gelu_lut(cx, UnaryOp::kGeluErf, DType::kBF16, GeluPass::kCodes, 1.0f / 0.03f);
  const auto d = gelu_lut(cx, UnaryOp::kGeluErf, DType::kBF16, GeluPass::kCodes, 1.0f / 0.04f);
  const auto e = gelu_lut(cx, UnaryOp::kGeluErf, DType::kF16, GeluPass::kValues);
  EXPECT_EQ(gelu_lut_tables_built(), before + 4) << "one more codes table (another inv), one f16 values table";
  EXPECT_EQ(a->values, b->values);
  EXPECT_EQ(b->codes, nullptr);
  EXPECT_EQ(a->codes, c->codes);
  EXPECT_NE(a->codes, d->codes);
  EXPECT_NE(a->values, e->values);
  EXPECT_EQ(d->inv, 1.0f / 0.04f);
  Dev want(static_cast<size_t>(kUnaryLutEntries) * 2), want_codes(static_cast<size_t>(kUnaryLutEntries));
  launch_unary_lut_fill(UnaryOp::kGeluErf, DType::kF16, want.as<uint16_t>(), nullptr);
  launch_unary_lut_fill_codes(UnaryOp::kGeluErf, DType::kBF16, 1.0f / 0.04f, want_codes.as<int8_t>(), nullptr);
  std::vector<uint16_t> got(static_cast<size_t>(kUnaryLutEntries));
  std::vector<int8_t> got_codes(static_cast<size_t>(kUnaryLutEntries));
  KILN_CUDA_CHECK(cudaMemcpy(got.data(), e->values, got.size() * 2, cudaMemcpyDeviceToHost));
  KILN_CUDA_CHECK(cudaMemcpy(got_codes.data(), d->codes, got_codes.size(), cudaMemcpyDeviceToHost));
  EXPECT_EQ(differing(got, want.get<uint16_t>(got.size())), 0u);
  EXPECT_EQ(differing(got_codes, want_codes.get<int8_t>(got_codes.size())), 0u);
  ScopedEnv automatic("KILN_CUDA_GELU_LUT", "auto");
  EXPECT_FALSE(gelu_lut(cx, UnaryOp::kGeluErf, DType::kBF16, GeluPass::kValues).has_value());
  const auto f = gelu_lut(cx, UnaryOp::kGeluErf, DType::kBF16, GeluPass::kCodes, 1.0f / 0.03f);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->codes, a->codes);
  EXPECT_EQ(a->min_elems, 0) << "1: tables for passes of any size";
  EXPECT_GT(f->min_elems, 0) << "auto: small passes compute";
  EXPECT_EQ(gelu_lut_tables_built(), before + 4) << "the same tables";
}

}  // namespace
}  // namespace kiln::cuda
