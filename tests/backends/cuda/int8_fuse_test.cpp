// The W8A8 Linear's activation quantize fused into the norm, SmoothQuant Mul or W8A8
// Linear with GELU / SiLU that feeds it (cuda_int8_fuse.h): the int8 norm, Mul and
// activation kernels against the T kernel followed by
// launch_int8_quantize, code for code and row scale for row scale (both round the f32
// norm to T, then quantize with int8_codes.cuh's rounding: bit-identical, not merely
// close), in bf16 and f16, static and per token, over decode and prefill row counts and
// both kernels (register-held rows, multi-pass); which values the backend writes as codes
// (no GPU needed); and graphs of W8A8 Linears fed by every norm, run with the fusion and
// with KILN_CUDA_INT8_FUSE=0, whose outputs must agree bit for bit (among them FFN-like
// chains: a W8A8 Linear with GELU / SiLU read only by W8A8 Linears). The dual output of a
// norm read by W8A8 Linears and other nodes: its kernels (T output and codes) against the
// plain norm and the quantize, which norms take it and the rewrite of the compiled
// graph's copy (no GPU needed), and a post-LN block fused against unfused. Also the norms'
// launch shapes the bench sweeps, against the default shape. Skips the device parts
// without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <map>
#include <set>
#include <tuple>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_int8_fuse.h"
#include "backends/cuda/cuda_w8a8_linear.h"
#include "backends/cuda/ops/elementwise.h"
#include "backends/cuda/ops/elementwise_int8.h"
#include "backends/cuda/ops/int8.h"
#include "backends/cuda/ops/norm.h"
#include "backends/memory_plan.h"
#include "core/dtype.h"
#include "core/int8.h"
#include "core/status.h"
#include "cuda_test_util.h"

namespace kiln::cuda {
namespace {

using namespace testing;


// Random rows in `dtype`'s 16-bit storage; `zero_row` (when >= 0) all zeros.
std::vector<uint16_t> random_rows(DType dtype, int64_t rows, int64_t dim, std::mt19937_64& rng,
                                  float amp, int64_t zero_row) {
  std::uniform_real_distribution<float> d(-amp, amp);
  std::vector<uint16_t> v(size_t(rows * dim));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < dim; ++j) {
      const float f = r == zero_row ? 0.0f : d(rng);
      v[size_t(r * dim + j)] = dtype == DType::kBF16 ? f32_to_bf16(f) : f32_to_f16(f);
    }
  return v;
}

std::vector<float> random_f32(int64_t n, std::mt19937_64& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

// Fused codes vs the unfused pair's: equal byte for byte, with a spread that shows the
// comparison means something (many distinct codes; saturation where the static clip sits
// inside the output range).
void expect_same_codes(const std::vector<int8_t>& fused, const std::vector<int8_t>& unfused,
                       const std::string& what, bool want_saturated) {
  ASSERT_EQ(fused.size(), unfused.size()) << what;
  size_t bad = 0, saturated = 0;
  std::set<int8_t> distinct;
  for (size_t i = 0; i < fused.size(); ++i) {
    distinct.insert(unfused[i]);
    saturated += unfused[i] == 127 || unfused[i] == -127;
    if (fused[i] != unfused[i] && bad++ < 5)
      ADD_FAILURE() << what << ": element " << i << " fused " << int(fused[i]) << ", unfused "
                    << int(unfused[i]);
  }
  EXPECT_EQ(bad, 0u) << what << " (" << fused.size() << " codes)";
  EXPECT_GE(distinct.size(), std::min<size_t>(fused.size() / 4, 100))
      << what << ": too few distinct codes to test";
  if (want_saturated && fused.size() >= 256) {
    EXPECT_GT(saturated, 0u) << what << ": no code saturated";
  }
}

// Per-token row scales of a fused kernel against the unfused quantize's, bit for bit; with
// zero_row, row 1 of the input held zeros, so its scale must be 1.
void expect_same_row_scales(const Dev& fused, const Dev& unfused, int64_t rows, const std::string& what,
                            bool zero_row) {
  const auto sa = unfused.host<float>(size_t(rows)), sb = fused.host<float>(size_t(rows));
  size_t bad = 0;
  for (size_t i = 0; i < sa.size(); ++i) bad += std::memcmp(&sa[i], &sb[i], 4) != 0;
  EXPECT_EQ(bad, 0u) << what << ": row scales";
  if (zero_row && rows > 1) {
    EXPECT_EQ(sb[1], 1.0f) << what << ": the zero row's scale";
  }
}

TEST(CudaInt8Fuse, NormKernelsWriteTheQuantizeKernelsCodes) {
  KILN_SKIP_WITHOUT_CUDA();
  struct Case {
    int64_t rows, dim;
  };
  // Decode row counts (<= 64: a row over up to 1024 threads) and prefill ones (a warp or a
  // few per row, several rows a block; odd counts leave rows of a block idle); dims of
  // 1, 2 and 4 vectors per thread, and 68 (not whole vectors: the multi-pass kernel).
  // With KILN_CUDA_NORM_SHORT=warp, the rows of at most 1024 take the warp-per-row kernel
  // (1 to 4 vectors a lane; 4100 rows: two a warp, the last block's warps partly idle).
  for (NormShort mode : {NormShort::kBlock, NormShort::kWarp})
    for (Case cs : {Case{1, 4096}, Case{3, 64}, Case{37, 576}, Case{64, 768}, Case{65, 768},
                    Case{1000, 68}, Case{257, 4096}, Case{4100, 768}, Case{4100, 4096},
                    Case{129, 2048}, Case{300, 320}, Case{5, 1024}})
      for (DType dt : {DType::kBF16, DType::kF16}) {
        if (mode == NormShort::kWarp && norm_kernel_for(dt, cs.dim, mode) != NormKernel::kWarp)
          continue;
        const ScopedNormShort scoped(mode);
        const int64_t rows = cs.rows, dim = cs.dim, n = rows * dim;
        std::mt19937_64 rng(uint64_t(rows * 131 + dim + int(dt)));
        // Row 1 of x is zeros: RMSNorm gives a zero row there (per-token scale 1).
        const auto x = random_rows(dt, rows, dim, rng, 3.0f, 1),
                   r = random_rows(dt, rows, dim, rng, 3.0f, -1);
        const auto gamma = random_f32(dim, rng, 0.5f, 1.5f),
                   beta = random_f32(dim, rng, -0.5f, 0.5f);
        Dev dx(x.data(), size_t(n) * 2), dr(r.data(), size_t(n) * 2),
            dg(gamma.data(), size_t(dim) * 4), db(beta.data(), size_t(dim) * 4);
        Dev sum_a{size_t(n) * 2}, sum_b{size_t(n) * 2}, y{size_t(n) * 2}, q_a{size_t(n)},
            q_b{size_t(n)}, rs_a{size_t(rows) * 4}, rs_b{size_t(rows) * 4};
        // The calibrated clip sits inside the output range (|y| reaches ~2.5-4): some saturate.
        const float inv = 1.0f / int8_act_scale(1.9);
        for (bool rms : {true, false})
          for (bool residual : {false, true})
            for (bool per_token : {false, true}) {
              const void* res = residual ? dr.get() : nullptr;
              void* sa = residual ? sum_a.get() : nullptr;
              void* sb = residual ? sum_b.get() : nullptr;
              float* rsb = per_token ? rs_b.as<float>() : nullptr;
              if (rms) {
                launch_add_rms_norm(dt, dx.get(), res, dg.as<float>(), 1e-5f, rows, dim, sa,
                                    y.get(), nullptr);
                launch_add_rms_norm_int8(dt, dx.get(), res, dg.as<float>(), 1e-5f, rows, dim, sb,
                                         q_b.as<int8_t>(), inv, rsb, nullptr);
              } else {
                launch_add_layer_norm(dt, dx.get(), res, dg.as<float>(), db.as<float>(), 1e-5f,
                                      rows, dim, sa, y.get(), nullptr);
                launch_add_layer_norm_int8(dt, dx.get(), res, dg.as<float>(), db.as<float>(), 1e-5f,
                                           rows, dim, sb, q_b.as<int8_t>(), inv, rsb, nullptr);
              }
              launch_int8_quantize(dt, y.get(), rows, dim, inv, q_a.as<int8_t>(),
                                   per_token ? rs_a.as<float>() : nullptr, nullptr);
              KILN_CUDA_CHECK(cudaDeviceSynchronize());
              const std::string what =
                  str_cat(dtype_name(dt), " ", residual ? "Add" : "", rms ? "RMSNorm" : "LayerNorm",
                          per_token ? " per-token" : " static", " rows=", rows, " dim=", dim,
                          mode == NormShort::kWarp ? " (warp kernel)" : "");
              expect_same_codes(q_b.host<int8_t>(size_t(n)), q_a.host<int8_t>(size_t(n)), what,
                                !per_token);
              if (per_token) expect_same_row_scales(rs_b, rs_a, rows, what, rms && !residual);
              if (residual) {
                EXPECT_EQ(sum_b.host(size_t(n) * 2), sum_a.host(size_t(n) * 2)) << what << ": sum";
              }
            }
      }
}

// The dual output (a norm read by W8A8 Linears and by other nodes): its T output equal to
// the plain norm's and its codes and row scales to launch_int8_quantize of that output,
// bit for bit, with the sum equal too; bf16 and f16, static and per token, with and
// without the residual, over odd and even row counts from 1 to 4100, dims 64 to 4096 (and
// 68: not whole vectors, the multi-pass kernel), with both short-row kernels.
TEST(CudaInt8Fuse, DualNormKernelsWriteTheNormAndItsCodes) {
  KILN_SKIP_WITHOUT_CUDA();
  struct Case {
    int64_t rows, dim;
  };
  int warp_cases = 0;
  for (NormShort mode : {NormShort::kBlock, NormShort::kWarp})
    for (Case cs : {Case{1, 768}, Case{2, 64}, Case{3, 4096}, Case{37, 576}, Case{64, 768},
                    Case{1000, 68}, Case{257, 2048}, Case{1023, 768}, Case{1024, 1024},
                    Case{4100, 768}, Case{4099, 128}, Case{129, 4096}})
      for (DType dt : {DType::kBF16, DType::kF16}) {
        const bool warp = norm_kernel_for(dt, cs.dim, mode, cs.rows) == NormKernel::kWarp;
        if (mode == NormShort::kWarp && !warp) continue;  // the block kernels: covered by kBlock
        warp_cases += warp;
        const ScopedNormShort scoped(mode);
        const int64_t rows = cs.rows, dim = cs.dim, n = rows * dim;
        std::mt19937_64 rng(uint64_t(rows * 257 + dim + int(dt)));
        // Row 1 of x is zeros: RMSNorm gives a zero row there (per-token scale 1).
        const auto x = random_rows(dt, rows, dim, rng, 3.0f, rows > 1 ? 1 : -1),
                   r = random_rows(dt, rows, dim, rng, 3.0f, -1);
        const auto gamma = random_f32(dim, rng, 0.5f, 1.5f),
                   beta = random_f32(dim, rng, -0.5f, 0.5f);
        Dev dx(x.data(), size_t(n) * 2), dr(r.data(), size_t(n) * 2),
            dg(gamma.data(), size_t(dim) * 4), db(beta.data(), size_t(dim) * 4);
        Dev sum_a{size_t(n) * 2}, sum_b{size_t(n) * 2}, y_a{size_t(n) * 2}, y_b{size_t(n) * 2},
            q_a{size_t(n)}, q_b{size_t(n)}, rs_a{size_t(rows) * 4}, rs_b{size_t(rows) * 4};
        const float inv =
            1.0f / int8_act_scale(1.9);  // inside the output range: some codes saturate
        for (bool rms : {true, false})
          for (bool residual : {false, true})
            for (bool per_token : {false, true}) {
              const void* res = residual ? dr.get() : nullptr;
              void* sa = residual ? sum_a.get() : nullptr;
              void* sb = residual ? sum_b.get() : nullptr;
              float* rsb = per_token ? rs_b.as<float>() : nullptr;
              // Stale outputs from the previous case must not pass for this one's.
              KILN_CUDA_CHECK(cudaMemset(y_b.get(), 0x7f, size_t(n) * 2));
              KILN_CUDA_CHECK(cudaMemset(q_b.get(), 0x55, size_t(n)));
              if (rms) {
                launch_add_rms_norm(dt, dx.get(), res, dg.as<float>(), 1e-5f, rows, dim, sa,
                                    y_a.get(), nullptr);
                launch_add_rms_norm_dual(dt, dx.get(), res, dg.as<float>(), 1e-5f, rows, dim, sb,
                                         y_b.get(), q_b.as<int8_t>(), inv, rsb, nullptr);
              } else {
                launch_add_layer_norm(dt, dx.get(), res, dg.as<float>(), db.as<float>(), 1e-5f,
                                      rows, dim, sa, y_a.get(), nullptr);
                launch_add_layer_norm_dual(dt, dx.get(), res, dg.as<float>(), db.as<float>(), 1e-5f,
                                           rows, dim, sb, y_b.get(), q_b.as<int8_t>(), inv, rsb,
                                           nullptr);
              }
              launch_int8_quantize(dt, y_a.get(), rows, dim, inv, q_a.as<int8_t>(),
                                   per_token ? rs_a.as<float>() : nullptr, nullptr);
              KILN_CUDA_CHECK(cudaDeviceSynchronize());
              const std::string what =
                  str_cat(dtype_name(dt), " dual ", residual ? "Add" : "",
                          rms ? "RMSNorm" : "LayerNorm", per_token ? " per-token" : " static",
                          " rows=", rows, " dim=", dim, warp ? " (warp kernel)" : "");
              const auto ya = y_a.host<uint16_t>(size_t(n)), yb = y_b.host<uint16_t>(size_t(n));
              size_t y_bad = 0;
              for (int64_t i = 0; i < n; ++i) y_bad += ya[size_t(i)] != yb[size_t(i)];
              EXPECT_EQ(y_bad, 0u) << what << ": T output (" << n << " values)";
              expect_same_codes(q_b.host<int8_t>(size_t(n)), q_a.host<int8_t>(size_t(n)), what,
                                !per_token);
              if (per_token) expect_same_row_scales(rs_b, rs_a, rows, what, rms && !residual);
              if (residual) {
                EXPECT_EQ(sum_b.host(size_t(n) * 2), sum_a.host(size_t(n) * 2)) << what << ": sum";
              }
            }
      }
  EXPECT_GE(warp_cases, 10) << "the warp-per-row kernel must be among those tested";
}

TEST(CudaInt8Fuse, MulKernelWritesTheQuantizeKernelsCodes) {
  KILN_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::kBF16, DType::kF16})
    for (int64_t rows : {1, 4, 37, 4097})
      for (int64_t k : {64, 768, 3072}) {
        const int64_t n = rows * k;
        std::mt19937_64 rng(uint64_t(rows * 7 + k + int(dt)));
        const auto x = random_rows(dt, rows, k, rng, 3.0f, 1);  // row 1 zeros: scale 1
        // 1/s of SmoothQuant: factors around 1, some far from it.
        std::vector<uint16_t> m(static_cast<size_t>(k));
        std::uniform_real_distribution<float> lg(-2.0f, 2.0f);
        for (auto& v : m) {
          const float f = std::exp2(lg(rng));
          v = dt == DType::kBF16 ? f32_to_bf16(f) : f32_to_f16(f);
        }
        Dev dx(x.data(), size_t(n) * 2), dm(m.data(), size_t(k) * 2), y{size_t(n) * 2},
            q_a{size_t(n)}, q_b{size_t(n)}, rs_a{size_t(rows) * 4}, rs_b{size_t(rows) * 4};
        const float inv = 1.0f / int8_act_scale(5.0);
        for (bool per_token : {false, true}) {
          launch_binary(BinaryOp::kMul, dt, dx.get(), dm.get(), n, k, y.get(), nullptr);
          launch_int8_quantize(dt, y.get(), rows, k, inv, q_a.as<int8_t>(),
                               per_token ? rs_a.as<float>() : nullptr, nullptr);
          launch_mul_int8(dt, dx.get(), dm.get(), rows, k, inv, q_b.as<int8_t>(),
                          per_token ? rs_b.as<float>() : nullptr, nullptr);
          KILN_CUDA_CHECK(cudaDeviceSynchronize());
          const std::string what =
              str_cat(dtype_name(dt), " Mul", per_token ? " per-token" : " static", " rows=", rows,
                      " k=", k);
          expect_same_codes(q_b.host<int8_t>(size_t(n)), q_a.host<int8_t>(size_t(n)), what,
                            !per_token);
          if (per_token) expect_same_row_scales(rs_b, rs_a, rows, what, true);
        }
      }
}

// The activation after a W8A8 GEMM writing the down projection's codes: against
// launch_unary then launch_int8_quantize, code for code and row scale for row scale, for
// each activation, bf16 and f16, static and per token; rows held in registers (16-byte
// and, for row lengths or addresses that do not allow it, 8-byte accesses) and rows too
// long for them (computed twice).
TEST(CudaInt8Fuse, ActivationKernelWritesTheQuantizeKernelsCodes) {
  KILN_SKIP_WITHOUT_CUDA();
  struct Case {
    int64_t rows, k;
    size_t x_off, q_off;  // bytes past 256-byte aligned buffers: 8 / 4 force 8-byte accesses
  };
  for (Case cs :
       {Case{1, 3072, 0, 0}, Case{9, 128, 0, 0}, Case{37, 772, 0, 0}, Case{1030, 3072, 0, 0},
        Case{3, 3072, 8, 0}, Case{7, 3072, 0, 4}, Case{4, 14336, 0, 0}, Case{2, 36864, 0, 0}})
    for (DType dt : {DType::kBF16, DType::kF16})
      for (UnaryOp op : {UnaryOp::kGeluErf, UnaryOp::kGeluTanh, UnaryOp::kSilu}) {
        const int64_t rows = cs.rows, k = cs.k, n = rows * k;
        std::mt19937_64 rng(uint64_t(rows * 131 + k + int(dt) * 7 + int(op)));
        const auto x =
            random_rows(dt, rows, k, rng, 4.0f, rows > 1 ? 1 : -1);  // row 1 zeros: scale 1
        Dev dx{size_t(n) * 2 + 16}, y{size_t(n) * 2}, q_a{size_t(n)}, q_b{size_t(n) + 16},
            rs_a{size_t(rows) * 4}, rs_b{size_t(rows) * 4};
        char* xp = dx.as<char>() + cs.x_off;
        int8_t* qb = reinterpret_cast<int8_t*>(q_b.as<char>() + cs.q_off);
        KILN_CUDA_CHECK(cudaMemcpy(xp, x.data(), size_t(n) * 2, cudaMemcpyHostToDevice));
        // The calibrated clip inside the output range (GELU / SiLU of [-4, 4] reach ~4): some
        // saturate.
        const float inv = 1.0f / int8_act_scale(2.5);
        for (bool per_token : {false, true}) {
          launch_unary(op, dt, xp, n, y.get(), nullptr);
          launch_int8_quantize(dt, y.get(), rows, k, inv, q_a.as<int8_t>(),
                               per_token ? rs_a.as<float>() : nullptr, nullptr);
          launch_unary_int8(op, dt, xp, rows, k, inv, qb, per_token ? rs_b.as<float>() : nullptr,
                            nullptr);
          KILN_CUDA_CHECK(cudaDeviceSynchronize());
          std::vector<int8_t> got(static_cast<size_t>(n));
          KILN_CUDA_CHECK(cudaMemcpy(got.data(), qb, size_t(n), cudaMemcpyDeviceToHost));
          const std::string what =
              str_cat(dtype_name(dt), " activation ", int(op), per_token ? " per-token" : " static",
                      " rows=", rows, " k=", k, " offsets ", cs.x_off, "/", cs.q_off);
          expect_same_codes(got, q_a.host<int8_t>(size_t(n)), what, !per_token);
          if (per_token) expect_same_row_scales(rs_b, rs_a, rows, what, true);
        }
      }
}

// The launch shapes the norm bench sweeps: every accepted one gives the default shape's
// output within the f32 reduction's reordering (a few bf16 ulps at most), and the sum
// output exactly (no reduction in it).
TEST(CudaInt8Fuse, ForcedNormShapesAgreeWithTheDefault) {
  KILN_SKIP_WITHOUT_CUDA();
  for (int64_t dim : {768, 4096})
    for (int64_t rows : {5, 300}) {
      const int64_t n = rows * dim;
      std::mt19937_64 rng(uint64_t(rows + dim));
      const auto x = random_rows(DType::kBF16, rows, dim, rng, 3.0f, -1),
                 r = random_rows(DType::kBF16, rows, dim, rng, 3.0f, -1);
      const auto gamma = random_f32(dim, rng, 0.5f, 1.5f), beta = random_f32(dim, rng, -0.5f, 0.5f);
      Dev dx(x.data(), size_t(n) * 2), dr(r.data(), size_t(n) * 2),
          dg(gamma.data(), size_t(dim) * 4), db(beta.data(), size_t(dim) * 4), sum_a{size_t(n) * 2},
          sum_b{size_t(n) * 2}, y_a{size_t(n) * 2}, y_b{size_t(n) * 2};
      for (bool rms : {true, false}) {
        if (rms)
          launch_add_rms_norm(DType::kBF16, dx.get(), dr.get(), dg.as<float>(), 1e-5f, rows, dim,
                              sum_a.get(), y_a.get(), nullptr);
        else
          launch_add_layer_norm(DType::kBF16, dx.get(), dr.get(), dg.as<float>(), db.as<float>(),
                                1e-5f, rows, dim, sum_a.get(), y_a.get(), nullptr);
        const auto want = y_a.host<uint16_t>(size_t(n));
        for (int vecs : {1, 2, 4})
          for (int rpb : {1, 2, 4}) {
            const bool ok =
                launch_add_norm_shaped(DType::kBF16, rms, dx.get(), dr.get(), dg.as<float>(),
                                       rms ? nullptr : db.as<float>(), 1e-5f, rows, dim,
                                       sum_b.get(), y_b.get(), {vecs, rpb}, nullptr);
            KILN_CUDA_CHECK(cudaDeviceSynchronize());
            // Threads per row: the row's 16-byte vectors (8 bf16) over `vecs` a thread, in warps.
            const int64_t tpr = std::max<int64_t>(32, (dim / 8 + vecs - 1) / vecs + 31) / 32 * 32;
            EXPECT_EQ(ok, tpr * rpb <= 1024)
                << "dim " << dim << " vecs " << vecs << " rows/block " << rpb;
            if (!ok) continue;
            const auto got = y_b.host<uint16_t>(size_t(n));
            double worst = 0;
            for (int64_t i = 0; i < n; ++i) {
              const double g = bf16_to_f32(got[size_t(i)]), w = bf16_to_f32(want[size_t(i)]);
              worst = std::max(worst, std::fabs(g - w) / std::max(std::fabs(w), 1e-3));
            }
            // Two bf16 ulps (2^-7 relative each) at most: only the statistics' f32 sums differ.
            EXPECT_LE(worst, std::ldexp(1.0, -6))
                << (rms ? "rms" : "layer") << " rows " << rows << " dim " << dim << " vecs " << vecs
                << " rows/block " << rpb;
            EXPECT_EQ(sum_b.host(size_t(n) * 2), sum_a.host(size_t(n) * 2));
          }
      }
    }
  // A shape the row cannot take launches nothing: 4096 bf16 = 512 vectors over 1 per thread
  // and 4 rows a block is 2048 threads.
  Dev x{4096 * 2}, y{4096 * 2}, g{4096 * 4};
  EXPECT_FALSE(launch_add_norm_shaped(DType::kBF16, true, x.get(), nullptr, g.as<float>(), nullptr,
                                      1e-5f, 1, 4096, nullptr, y.get(), {1, 4}, nullptr));
}

// A norm whose readers a variant test adds: x [T, k] -> RMSNorm "norm" (y), weights w1 and
// w2 [32, k], and the attributes of a static and of a per-token W8A8 Linear.
struct NormWithReaders {
  ir::Graph g;
  ir::ValueId y{}, w1{}, w2{};
  std::map<std::string, ir::Attr> stat = {{"quant", std::string("w8a8")}, {"act_amax", 1.0}};
  std::map<std::string, ir::Attr> dyn = {
      {"quant", std::string("w8a8")}, {"act_amax", 1.0}, {"act_dynamic", int64_t(1)}};
  NormWithReaders(std::mt19937_64& rng, int64_t k) {
    auto x = g.add_input("x", DType::kF32, Shape{"T", k});
    y = g.add("RMSNorm", {x, g.add_weight("g", random_tensor({k}, rng, "f32"))}, {{"eps", 1e-5}}, "norm");
    w1 = g.add_weight("w1", random_tensor({32, k}, rng, "f32"));
    w2 = g.add_weight("w2", random_tensor({32, k}, rng, "f32"));
  }
  std::tuple<ir::ValueId, ir::ValueId, ir::ValueId> values() const { return {y, w1, w2}; }
};

// Adds quant="w8a8" Linears to a test graph: weights [n, k] drawn in (-w_range, w_range),
// biases in (-b_range, b_range), named w<i> / b<i> by the graph's shared counter `wi`; a
// static scale from act_amax or per token (dynamic), and an optional activation.
struct W8a8Linears {
  ir::Graph& g;
  std::mt19937_64& rng;
  int& wi;
  float w_range, b_range;
  ir::ValueId operator()(ir::ValueId in, int64_t k, int64_t n, double amax, bool dynamic, const std::string& act,
                         const std::string& name) {
    std::map<std::string, ir::Attr> a = {{"quant", std::string("w8a8")}, {"act_amax", amax}};
    if (dynamic) a["act_dynamic"] = int64_t(1);
    if (!act.empty()) a["activation"] = act;
    auto w = g.add_weight(str_cat("w", wi), random_tensor({n, k}, rng, "f32", -w_range, w_range));
    auto b = g.add_weight(str_cat("b", wi++), random_tensor({n}, rng, "f32", -b_range, b_range));
    return g.add("Linear", {in, w, b}, a, name);
  }
};

// A graph with every norm feeding W8A8 Linears (hidden 256):
//   AddRMSNorm(x, r) -> qkv, o (same act_amax: one static scale);  RMSNorm(o) -> two per-token
//   Linears (different act_amax: per-token ignores it);  LayerNorm(sum) -> Linear + gelu_erf;
//   AddLayerNorm(gelu out, sum) -> one static Linear -> out5;  Mul(sum2, 1/s) -> per-token Linear
//   -> out6 (BERT's SmoothQuant: its norm outputs also feed the residual).
// `tap`: the first norm's output is also a graph output (so it must stay in the activation dtype).
struct FusedGraph {
  ir::Graph g;
  const ir::Node* node(const std::string& name) const {
    for (const ir::Node& n : g.nodes())
      if (n.name == name) return &n;
    ADD_FAILURE() << "no node " << name;
    return nullptr;
  }
};

FusedGraph fused_graph(std::mt19937_64& rng, bool tap) {
  FusedGraph fg;
  ir::Graph& g = fg.g;
  const int64_t h = 256;
  auto x = g.add_input("x", DType::kF32, Shape{"T", h});
  auto r = g.add_input("r", DType::kF32, Shape{"T", h});
  int wi = 0;
  W8a8Linears linear{g, rng, wi, 0.1f, 0.2f};
  auto gamma = [&](int64_t n) {
    return g.add_weight(str_cat("g", wi++), random_tensor({n}, rng, "f32", 0.5f, 1.5f));
  };
  auto add_norm = g.add_node("AddRMSNorm", {x, r, gamma(h)}, {{"eps", 1e-5}}, "add_norm");
  if (tap) g.add_output("normed", add_norm[1]);
  auto qkv = linear(add_norm[1], h, 384, 1.8, false, "", "qkv");
  auto o = linear(add_norm[1], h, h, 1.8, false, "", "o");
  auto n2 = g.add("RMSNorm", {o, gamma(h)}, {{"eps", 1e-5}}, "rms");
  auto pt_a = linear(n2, h, 96, 1.0, true, "silu", "per_token_a");
  auto pt_b = linear(n2, h, 64, 7.0, true, "", "per_token_b");
  auto beta = g.add_weight("beta", random_tensor({h}, rng, "f32", -0.3f, 0.3f));
  auto n3 = g.add("LayerNorm", {add_norm[0], gamma(h), beta}, {{"eps", 1e-5}}, "ln");
  auto up = linear(n3, h, h, 2.0, false, "gelu_erf", "ln_lin");
  auto beta2 = g.add_weight("beta2", random_tensor({h}, rng, "f32", -0.3f, 0.3f));
  auto aln =
      g.add_node("AddLayerNorm", {up, add_norm[0], gamma(h), beta2}, {{"eps", 1e-5}}, "add_ln");
  auto out5 = linear(aln[1], h, 80, 1.7, false, "", "after_add_ln");
  auto smooth = g.add_weight("smooth_inv", random_tensor({h}, rng, "f32", 0.25f, 4.0f));
  auto sm = g.add("Mul", {aln[0], smooth}, {}, "smooth");
  auto out6 = linear(sm, h, 48, 2.5, true, "", "after_smooth");
  g.add_output("sum", add_norm[0]);
  g.add_output("qkv", qkv);
  g.add_output("pt_a", pt_a);
  g.add_output("pt_b", pt_b);
  g.add_output("sum2", aln[0]);
  g.add_output("out5", out5);
  g.add_output("out6", out6);
  ir::verify(g);
  return fg;
}

bool fused(const FusedGraph& fg, const std::string& node, size_t out, DType act = DType::kBF16) {
  const ir::Node* n = fg.node(node);
  return n && int8_fused_output(*n, out, fg.g, act).has_value();
}

TEST(CudaInt8Fuse, WhichOutputsAreWrittenAsCodes) {
  ScopedEnv env("KILN_CUDA_INT8_FUSE", "1");
  std::mt19937_64 rng(3);
  const FusedGraph fg = fused_graph(rng, false);
  EXPECT_TRUE(fused(fg, "add_norm", 1)) << "two static readers with one act_amax";
  EXPECT_FALSE(fused(fg, "add_norm", 0)) << "the residual sum stays in the activation dtype";
  EXPECT_FALSE(int8_fused_output(*fg.node("add_norm"), 1, fg.g, DType::kBF16)->per_token);
  EXPECT_EQ(int8_fused_output(*fg.node("add_norm"), 1, fg.g, DType::kBF16)->inv,
            1.0f / int8_act_scale(1.8));
  EXPECT_TRUE(fused(fg, "rms", 0)) << "two per-token readers (their act_amax do not matter)";
  EXPECT_TRUE(int8_fused_output(*fg.node("rms"), 0, fg.g, DType::kBF16)->per_token);
  EXPECT_TRUE(fused(fg, "ln", 0));
  EXPECT_TRUE(fused(fg, "add_ln", 1));
  EXPECT_TRUE(fused(fg, "add_ln", 1, DType::kF16));
  EXPECT_FALSE(fused(fg, "add_ln", 1, DType::kF32)) << "f32 activations keep the separate pass";
  EXPECT_FALSE(fused(fg, "qkv", 0)) << "a Linear without an activation is no int8 producer";
  EXPECT_FALSE(fused(fg, "ln_lin", 0)) << "a GELU Linear read by a norm";
  EXPECT_TRUE(fused(fg, "smooth", 0)) << "a SmoothQuant Mul";
  EXPECT_TRUE(int8_fused_output(*fg.node("smooth"), 0, fg.g, DType::kBF16)->per_token);
  EXPECT_EQ(int8_profile_tag(*fg.node("smooth"), fg.g, DType::kBF16), "{+int8 quantize}");
  EXPECT_EQ(int8_profile_tag(*fg.node("after_smooth"), fg.g, DType::kBF16), "{int8 in}");
  // The profile names both ends.
  EXPECT_EQ(int8_profile_tag(*fg.node("add_norm"), fg.g, DType::kBF16), "{+int8 quantize}");
  EXPECT_EQ(int8_profile_tag(*fg.node("qkv"), fg.g, DType::kBF16), "{int8 in}");
  EXPECT_EQ(int8_profile_tag(*fg.node("per_token_a"), fg.g, DType::kBF16), "{int8 in}");
  EXPECT_EQ(int8_profile_tag(*fg.node("ln_lin"), fg.g, DType::kBF16), "{int8 in}");

  // The norm's output also a graph output: it stays in the activation dtype.
  std::mt19937_64 rng2(3);
  const FusedGraph tapped = fused_graph(rng2, true);
  EXPECT_FALSE(fused(tapped, "add_norm", 1));
  EXPECT_EQ(int8_profile_tag(*tapped.node("qkv"), tapped.g, DType::kBF16), "");

  // Readers that do not share one scale, or are not a W8A8 Linear's x, or rows too short
  // for the row scales: no codes.
  for (int variant = 0; variant < 7; ++variant) {
    const int64_t k = variant == 5 ? 12 : 64;
    NormWithReaders nr(rng, k);
    ir::Graph& g = nr.g;
    const auto [y, w1, w2] = nr.values();
    const auto &stat = nr.stat, &dyn = nr.dyn;
    g.add_output("a", g.add("Linear", {y, w1}, variant == 5 ? dyn : stat));
    if (variant == 0)
      g.add_output("b",
                   g.add("Linear", {y, w2}, {{"quant", std::string("w8a8")}, {"act_amax", 1.5}}));
    if (variant == 1) g.add_output("b", g.add("Linear", {y, w2}, dyn));  // static and per token
    if (variant == 2) g.add_output("b", g.add("Linear", {y, w2}));       // a bf16 Linear
    if (variant == 3) g.add_output("b", g.add("Add", {y, y}));
    if (variant == 4)
      g.add_output("b",
                   g.add("Linear", {y, w2}, {{"quant", std::string("fp8")}, {"act_amax", 1.0}}));
    // A Mul of two activations is no SmoothQuant Mul.
    if (variant == 6) {
      auto m = g.add("Mul", {y, y}, {}, "mul");
      g.add_output("b", g.add("Linear", {m, w2}, stat));
      EXPECT_FALSE(int8_fused_output(g.nodes()[size_t(g.value(m).producer)], 0, g, DType::kBF16)
                       .has_value());
    }
    EXPECT_FALSE(int8_fused_output(g.nodes()[0], 0, g, DType::kBF16).has_value())
        << "variant " << variant;
  }
  EXPECT_TRUE(int8_codes_fit(16, 2));
  EXPECT_FALSE(int8_codes_fit(12, 2));
  // The bound: for every t, the codes and row scales fit t x k 16-bit activations.
  for (int64_t k : {16, 20, 64, 68})
    for (int64_t t = 1; t < 300; ++t)
      EXPECT_LE(int8_row_scales_offset(t, k) + size_t(t) * 4, size_t(t * k) * 2);
}

TEST(CudaInt8Fuse, EnvironmentSwitch) {
  std::mt19937_64 rng(3);
  const FusedGraph fg = fused_graph(rng, false);
  {
    ScopedEnv env("KILN_CUDA_INT8_FUSE", "0");
    EXPECT_FALSE(int8_fuse_enabled());
    EXPECT_FALSE(fused(fg, "add_norm", 1));
    EXPECT_EQ(int8_profile_tag(*fg.node("qkv"), fg.g, DType::kBF16), "");
  }
  {
    ScopedEnv env("KILN_CUDA_INT8_FUSE", "1");
    EXPECT_TRUE(int8_fuse_enabled());
    EXPECT_TRUE(fused(fg, "add_norm", 1));
  }
  ScopedEnv env("KILN_CUDA_INT8_FUSE", "yes");
  try {
    (void)int8_fuse_enabled();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KILN_CUDA_INT8_FUSE='yes'"), std::string::npos)
        << e.what();
  }
}

// A post-LN block (hidden 256) whose norms feed W8A8 Linears and the next residual:
//   ln0 = LayerNorm(x) -> q, k (static, one act_amax) and add_ln's residual: dual, static;
//   add_ln = AddLayerNorm(q + k, ln0) -> up (per token, gelu_erf: writes down's codes) and
//     add_ln2's residual: dual, per token;
//   add_ln2 = AddLayerNorm(down, add_ln) -> head_a, head_b (two static act_amax) and a graph
//     output: none;
//   rms = RMSNorm(sum2) -> o (static) and an Add: dual; add_rms = AddRMSNorm(o, sum2) -> p
//     (static) only: the codes alone (int8_fused_output).
ir::Graph post_ln_graph(std::mt19937_64& rng) {
  ir::Graph g;
  const int64_t h = 256;
  auto x = g.add_input("x", DType::kF32, Shape{"T", h});
  int wi = 0;
  W8a8Linears add_linear{g, rng, wi, 0.1f, 0.2f};
  auto linear = [&](ir::ValueId in, int64_t n, double amax, bool dynamic, const std::string& act,
                    const std::string& name) {
    return add_linear(in, g.value(in).shape[1].value, n, amax, dynamic, act, name);
  };
  auto param = [&](float lo, float hi) {
    return g.add_weight(str_cat("p", wi++), random_tensor({h}, rng, "f32", lo, hi));
  };
  auto ln0 = g.add("LayerNorm", {x, param(0.5f, 1.5f), param(-0.3f, 0.3f)}, {{"eps", 1e-5}}, "ln0");
  auto q = linear(ln0, h, 2.2, false, "", "q"), k = linear(ln0, h, 2.2, false, "", "k");
  auto qk = g.add("Add", {q, k}, {}, "qk");
  auto add_ln = g.add_node("AddLayerNorm", {qk, ln0, param(0.5f, 1.5f), param(-0.3f, 0.3f)},
                           {{"eps", 1e-5}}, "add_ln");
  auto up = linear(add_ln[1], 512, 1.0, true, "gelu_erf", "up");
  auto down = linear(up, h, 1.2, false, "", "down");
  auto add_ln2 =
      g.add_node("AddLayerNorm", {down, add_ln[1], param(0.5f, 1.5f), param(-0.3f, 0.3f)},
                 {{"eps", 1e-5}}, "add_ln2");
  g.add_output("head_a", linear(add_ln2[1], 64, 1.5, false, "", "head_a"));
  g.add_output("head_b", linear(add_ln2[1], 64, 2.5, false, "", "head_b"));
  g.add_output("normed2", add_ln2[1]);
  auto rms = g.add("RMSNorm", {add_ln2[0], param(0.5f, 1.5f)}, {{"eps", 1e-5}}, "rms");
  auto o = linear(rms, h, 2.0, false, "", "o");
  g.add_output("rms_plus", g.add("Add", {rms, add_ln2[0]}, {}, "rms_plus"));
  auto add_rms =
      g.add_node("AddRMSNorm", {o, add_ln2[0], param(0.5f, 1.5f)}, {{"eps", 1e-5}}, "add_rms");
  g.add_output("p", linear(add_rms[1], 96, 1.8, false, "", "p"));
  g.add_output("sum", add_ln[0]);
  g.add_output("sum3", add_rms[0]);
  ir::verify(g);
  return g;
}

std::optional<Int8Codes> dual(const ir::Graph& g, const std::string& node, size_t out,
                              DType act = DType::kBF16) {
  for (const ir::Node& n : g.nodes())
    if (n.name == node) return int8_dual_output(n, out, g, act);
  ADD_FAILURE() << "no node " << node;
  return std::nullopt;
}

TEST(CudaInt8Fuse, WhichNormsWriteDualOutputs) {
  ScopedEnv env("KILN_CUDA_INT8_FUSE", "1"), epilogue("KILN_CUDA_W8A8_ACT_EPILOGUE", "0");
  std::mt19937_64 rng(11);
  const ir::Graph g = post_ln_graph(rng);
  auto codes_only = [&](const std::string& node, size_t out) {
    for (const ir::Node& n : g.nodes())
      if (n.name == node) return int8_fused_output(n, out, g, DType::kBF16).has_value();
    return false;
  };
  // Mixed readers (W8A8 Linears + the residual's AddLayerNorm, an Add): dual, not codes alone.
  ASSERT_TRUE(dual(g, "ln0", 0).has_value());
  EXPECT_FALSE(dual(g, "ln0", 0)->per_token);
  EXPECT_EQ(dual(g, "ln0", 0)->inv, 1.0f / int8_act_scale(2.2)) << "the Linears' one static scale";
  EXPECT_FALSE(codes_only("ln0", 0));
  ASSERT_TRUE(dual(g, "add_ln", 1).has_value());
  EXPECT_TRUE(dual(g, "add_ln", 1)->per_token);
  EXPECT_FALSE(dual(g, "add_ln", 0).has_value()) << "the sum is no normalized output";
  EXPECT_TRUE(dual(g, "rms", 0).has_value()) << "an RMSNorm read by a W8A8 Linear and an Add";
  EXPECT_TRUE(dual(g, "ln0", 0, DType::kF16).has_value());
  EXPECT_FALSE(dual(g, "ln0", 0, DType::kF32).has_value())
      << "f32 activations keep the separate pass";
  // Two static scales among the Linears: none (the graph output alone would allow it).
  EXPECT_FALSE(dual(g, "add_ln2", 1).has_value());
  EXPECT_FALSE(codes_only("add_ln2", 1));
  // Only W8A8 Linears read it: the codes alone, as before.
  EXPECT_FALSE(dual(g, "add_rms", 1).has_value());
  EXPECT_TRUE(codes_only("add_rms", 1));
  // Not norms: the FFN up Linear writes down's codes (codes alone); a Linear, an Add: never dual.
  EXPECT_TRUE(codes_only("up", 0));
  EXPECT_FALSE(dual(g, "up", 0).has_value());
  EXPECT_FALSE(dual(g, "qk", 0).has_value());
  EXPECT_FALSE(dual(g, "ln0", 1).has_value()) << "no such output";
  {
    ScopedEnv off("KILN_CUDA_INT8_FUSE", "0");
    EXPECT_FALSE(dual(g, "ln0", 0).has_value());
    EXPECT_FALSE(dual(g, "add_ln", 1).has_value());
    EXPECT_FALSE(dual(g, "rms", 0).has_value());
    ir::Graph copy = g;
    EXPECT_EQ(int8_add_dual_outputs(copy, DType::kBF16), 0);
    EXPECT_EQ(copy.num_values(), g.num_values());
  }
  // The readers that take codes: a W8A8 Linear's x only; a bf16 Linear, an FP8 Linear or an
  // Add beside a W8A8 Linear is another reader (dual); a static and a per-token Linear: none.
  for (int variant = 0; variant < 5; ++variant) {
    const int64_t h = 64;
    NormWithReaders nr(rng, h);
    ir::Graph& v = nr.g;
    const auto [y, w1, w2] = nr.values();
    const auto &stat = nr.stat, &dyn = nr.dyn;
    v.add_output("a", v.add("Linear", {y, w1}, stat));
    if (variant == 0) v.add_output("b", v.add("Linear", {y, w2}));
    if (variant == 1)
      v.add_output("b",
                   v.add("Linear", {y, w2}, {{"quant", std::string("fp8")}, {"act_amax", 1.0}}));
    if (variant == 2) v.add_output("b", v.add("Add", {y, y}));
    if (variant == 3) v.add_output("b", v.add("Linear", {y, w2}, dyn));
    if (variant == 4) v.add_output("b", y);  // a graph output
    EXPECT_EQ(int8_dual_output(v.nodes()[0], 0, v, DType::kBF16).has_value(), variant != 3)
        << "variant " << variant;
    EXPECT_FALSE(int8_fused_output(v.nodes()[0], 0, v, DType::kBF16).has_value())
        << "variant " << variant;
  }
}

// The rewrite the CUDA compiled graph runs on its copy: each dual norm gets a codes output
// of the normalized output's dtype and shape; its W8A8 Linears read it, the other readers
// keep the T output; the memory plan keeps the codes live to their last Linear.
TEST(CudaInt8Fuse, DualOutputsRewriteTheGraphsCopy) {
  ScopedEnv env("KILN_CUDA_INT8_FUSE", "1"), epilogue("KILN_CUDA_W8A8_ACT_EPILOGUE", "0");
  std::mt19937_64 rng(11);
  const ir::Graph g = post_ln_graph(rng);
  ir::Graph rw = g;
  ASSERT_EQ(int8_add_dual_outputs(rw, DType::kBF16), 3) << "ln0, add_ln, rms";
  EXPECT_EQ(rw.num_values(), g.num_values() + 3);
  EXPECT_EQ(int8_add_dual_outputs(rw, DType::kBF16), 0) << "a second run finds nothing left to do";
  auto idx = [&](const std::string& name) {
    for (size_t i = 0; i < rw.nodes().size(); ++i)
      if (rw.nodes()[i].name == name) return i;
    ADD_FAILURE() << "no node " << name;
    return size_t(0);
  };
  auto node = [&](const std::string& name) -> const ir::Node& { return rw.nodes()[idx(name)]; };
  struct Want {
    const char* norm;
    size_t y;  // the normalized output
    std::vector<const char*> linears, others;
    bool per_token;
  };
  for (const Want& w :
       {Want{"ln0", 0, {"q", "k"}, {"add_ln"}, false}, Want{"add_ln", 1, {"up"}, {"add_ln2"}, true},
        Want{"rms", 0, {"o"}, {"rms_plus"}, false}}) {
    const ir::Node& n = node(w.norm);
    ASSERT_EQ(n.outputs.size(), w.y + 2) << w.norm;
    const ir::ValueId y = n.outputs[w.y], c = n.outputs[w.y + 1];
    EXPECT_EQ(rw.value(c).name, std::string(w.norm) + ":int8");
    EXPECT_EQ(rw.value(c).producer, int32_t(idx(w.norm)));
    EXPECT_EQ(rw.value(c).dtype, rw.value(y).dtype);
    EXPECT_EQ(rw.value(c).shape.str(), rw.value(y).shape.str())
        << "planned with the T output's bytes";
    for (const char* l : w.linears) {
      EXPECT_EQ(node(l).inputs[0], c) << l << " reads the codes";
      EXPECT_EQ(int8_profile_tag(node(l), rw, DType::kBF16).find("{int8 in}"), 0u) << l;
    }
    for (const char* o : w.others) {
      const auto& in = node(o).inputs;
      EXPECT_NE(std::find(in.begin(), in.end(), y), in.end()) << o << " still reads the T output";
      EXPECT_EQ(std::find(in.begin(), in.end(), c), in.end()) << o;
    }
    const auto codes = int8_dual_codes(n, rw, DType::kBF16);
    ASSERT_TRUE(codes.has_value()) << w.norm;
    EXPECT_EQ(codes->per_token, w.per_token) << w.norm;
    EXPECT_FALSE(int8_fused_output(n, w.y, rw, DType::kBF16).has_value())
        << w.norm << ": the T output stays";
    EXPECT_EQ(int8_profile_tag(n, rw, DType::kBF16), "{+int8 quantize}") << w.norm;
  }
  EXPECT_EQ(int8_dual_codes(node("ln0"), rw, DType::kBF16)->inv, 1.0f / int8_act_scale(2.2));
  // Untouched: the norm whose Linears differ in scale, the one only Linears read, and the
  // original graph.
  EXPECT_EQ(node("add_ln2").outputs.size(), 2u);
  EXPECT_EQ(node("add_rms").outputs.size(), 2u);
  EXPECT_FALSE(int8_dual_codes(node("add_rms"), rw, DType::kBF16).has_value());
  EXPECT_EQ(g.nodes()[idx("ln0")].outputs.size(), 1u);
  EXPECT_EQ(g.nodes()[idx("q")].inputs[0], g.nodes()[idx("ln0")].outputs[0]);
  EXPECT_THROW(ir::verify(rw), Error)
      << "the copy is the backend's own: LayerNorm has one output in the IR";
  // The plan: no value made while the codes are live (up to k, their last reader) shares
  // their slot, nor does the T output.
  const MemoryPlan plan = plan_activation_slots(rw);
  const ir::ValueId c0 = node("ln0").outputs[1];
  const int slot = plan.slot_of[size_t(c0)];
  ASSERT_GE(slot, 0);
  EXPECT_NE(slot, plan.slot_of[size_t(node("ln0").outputs[0])]);
  for (size_t i = idx("ln0") + 1; i <= idx("k"); ++i)
    for (ir::ValueId v : rw.nodes()[i].outputs)
      EXPECT_NE(plan.slot_of[size_t(v)], slot) << rw.nodes()[i].name;
  EXPECT_GT(idx("k"), idx("q"));
}

TensorMap run_cuda(const ir::Graph& g, const TensorMap& in, const std::string& weight_dtype,
                   const char* fuse) {
  ScopedEnv env("KILN_CUDA_INT8_FUSE", fuse);  // read while compiling
  auto gg = create_backend("cuda")->compile(g, {.weight_dtype = weight_dtype});
  TensorMap out = gg->run(in, {}, nullptr);
  TensorMap copy;  // outputs are views of the compiled graph's pinned buffer
  for (auto& [name, t] : out) copy[name] = t.to(DType::kF32);
  return copy;
}

TEST(CudaInt8Fuse, FusedGraphIsBitIdenticalToUnfused) {
  KILN_SKIP_WITHOUT_CUDA();
  // t <= 4: the int8 GEMV; more: cuBLASLt's int8 GEMM (the same algorithm in both
  // compiles); bf16 ("w8a8") and f16 activations.
  for (const char* wd : {"w8a8", "f16"})
    for (int64_t t : {1, 3, 4, 5, 64, 301}) {
      std::mt19937_64 rng(uint64_t(t) * 977);
      const FusedGraph fg = fused_graph(rng, false);
      TensorMap in = {{"x", random_tensor({t, 256}, rng, "bf16", -2.0f, 2.0f)},
                      {"r", random_tensor({t, 256}, rng, "bf16", -2.0f, 2.0f)}};
      const TensorMap on = run_cuda(fg.g, in, wd, "1"), off = run_cuda(fg.g, in, wd, "0");
      expect_outputs_bit_identical(on, off, str_cat("fused vs unfused ", wd, " t=", t));
    }
}

// The graph `make` builds (input x: [t, 256]) compiled with KILN_CUDA_INT8_FUSE=1 against
// =0, bit for bit, with w8a8 and f16 weights at each token count in ts (rng seeded t *
// seed_mul + seed_add); the activations in a pass after the GEMM.
void expect_fused_graph_bit_identical(ir::Graph (*make)(std::mt19937_64&), std::initializer_list<int64_t> ts,
                                      uint64_t seed_mul, uint64_t seed_add, const char* what) {
  ScopedEnv epilogue("KILN_CUDA_W8A8_ACT_EPILOGUE", "0");
  for (const char* wd : {"w8a8", "f16"})
    for (int64_t t : ts) {
      std::mt19937_64 rng(uint64_t(t) * seed_mul + seed_add);
      const ir::Graph g = make(rng);
      TensorMap in = {{"x", random_tensor({t, 256}, rng, "bf16", -2.0f, 2.0f)}};
      const TensorMap on = run_cuda(g, in, wd, "1"), off = run_cuda(g, in, wd, "0");
      expect_outputs_bit_identical(on, off, str_cat(what, " fused vs unfused ", wd, " t=", t));
    }
}

// The post-LN block compiled with the dual outputs (and the codes-only fusions) against
// KILN_CUDA_INT8_FUSE=0, bit for bit: the GEMV (t <= 4), the GEMMs, and from 1024 rows on
// the warp-per-row norm kernel; bf16 and f16 activations.
TEST(CudaInt8Fuse, DualOutputGraphIsBitIdenticalToUnfused) {
  KILN_SKIP_WITHOUT_CUDA();
  expect_fused_graph_bit_identical(post_ln_graph, {1, 3, 5, 64, 1100}, 53, 1, "dual");
}

// FFN-like chains (hidden 256): LayerNorm -> three W8A8 Linears with an activation, each
// read only by W8A8 Linears: up_a (gelu_erf) -> down_a (static); up_b (gelu_tanh) -> two
// per-token Linears; up_c (silu) -> down_c (static, a clip inside its range: saturation);
// and up_d (gelu_erf) that is also a graph output (stays in the activation dtype).
ir::Graph ffn_graph(std::mt19937_64& rng) {
  ir::Graph g;
  const int64_t h = 256;
  auto x = g.add_input("x", DType::kF32, Shape{"T", h});
  int wi = 0;
  W8a8Linears linear{g, rng, wi, 0.15f, 0.5f};
  auto gamma = g.add_weight("gamma", random_tensor({h}, rng, "f32", 0.5f, 1.5f));
  auto beta = g.add_weight("beta", random_tensor({h}, rng, "f32", -0.3f, 0.3f));
  auto ln = g.add("LayerNorm", {x, gamma, beta}, {{"eps", 1e-5}}, "ln");
  auto up_a = linear(ln, h, 512, 2.0, false, "gelu_erf", "up_a");
  g.add_output("a", linear(up_a, 512, h, 1.5, false, "", "down_a"));
  auto up_b = linear(ln, h, 384, 2.0, false, "gelu_tanh", "up_b");
  g.add_output("b1", linear(up_b, 384, 64, 1.0, true, "", "down_b1"));
  g.add_output("b2", linear(up_b, 384, 96, 9.0, true, "", "down_b2"));
  auto up_c = linear(ln, h, 256, 2.0, false, "silu", "up_c");
  g.add_output("c", linear(up_c, 256, 128, 0.4, false, "", "down_c"));
  auto up_d = linear(ln, h, 128, 2.0, false, "gelu_erf", "up_d");
  g.add_output("d", up_d);
  g.add_output("d2", linear(up_d, 128, 64, 1.0, false, "", "down_d"));
  ir::verify(g);
  return g;
}

TEST(CudaInt8Fuse, ActivationLinearsWriteCodes) {
  ScopedEnv env("KILN_CUDA_INT8_FUSE", "1"), epilogue("KILN_CUDA_W8A8_ACT_EPILOGUE", "0");
  std::mt19937_64 rng(5);
  const ir::Graph g = ffn_graph(rng);
  auto codes = [&](const std::string& name, DType act = DType::kBF16) {
    return int8_fused_output(node_named(g, name), 0, g, act);
  };
  ASSERT_TRUE(codes("up_a").has_value()) << "gelu_erf read by one static W8A8 Linear";
  EXPECT_FALSE(codes("up_a")->per_token);
  EXPECT_EQ(codes("up_a")->inv, 1.0f / int8_act_scale(1.5)) << "the reader's scale";
  ASSERT_TRUE(codes("up_b").has_value()) << "gelu_tanh read by two per-token Linears";
  EXPECT_TRUE(codes("up_b")->per_token);
  EXPECT_TRUE(codes("up_c").has_value()) << "silu";
  EXPECT_TRUE(codes("up_c", DType::kF16).has_value());
  EXPECT_FALSE(codes("up_c", DType::kF32).has_value()) << "f32 activations keep the separate pass";
  EXPECT_FALSE(codes("up_d").has_value()) << "also a graph output";
  EXPECT_FALSE(codes("down_a").has_value()) << "no activation";
  EXPECT_TRUE(codes("ln").has_value()) << "the LayerNorm's readers share one static scale";
  EXPECT_EQ(int8_profile_tag(node_named(g, "up_a"), g, DType::kBF16), "{int8 in}{+int8 quantize}");
  EXPECT_EQ(int8_profile_tag(node_named(g, "down_b2"), g, DType::kBF16), "{int8 in}");
  EXPECT_EQ(int8_profile_tag(node_named(g, "down_d"), g, DType::kBF16), "");
  {
    // The activation back in the GEMM's epilogue: the output stays in the activation dtype.
    ScopedEnv e1("KILN_CUDA_W8A8_ACT_EPILOGUE", "1");
    EXPECT_TRUE(w8a8_act_in_epilogue());
    EXPECT_FALSE(codes("up_a").has_value());
    EXPECT_FALSE(codes("up_b").has_value());
    EXPECT_EQ(int8_profile_tag(node_named(g, "down_a"), g, DType::kBF16), "");
  }
  {
    ScopedEnv e0("KILN_CUDA_INT8_FUSE", "0");
    EXPECT_FALSE(codes("up_a").has_value());
  }
  ScopedEnv bad("KILN_CUDA_W8A8_ACT_EPILOGUE", "2");
  try {
    (void)codes("up_a");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KILN_CUDA_W8A8_ACT_EPILOGUE='2'"), std::string::npos)
        << e.what();
  }

  // Not producers: SwiGLU, a reader that is not a W8A8 Linear's x, readers with two
  // static scales, a static and a per-token reader.
  for (int variant = 0; variant < 4; ++variant) {
    ScopedEnv ok("KILN_CUDA_W8A8_ACT_EPILOGUE", "0");
    ir::Graph v;
    auto x = v.add_input("x", DType::kF32, Shape{"T", 64});
    std::map<std::string, ir::Attr> up = {
        {"quant", std::string("w8a8")},
        {"act_amax", 1.0},
        {"activation", std::string(variant == 0 ? "swiglu" : "gelu_erf")}};
    auto y =
        v.add("Linear", {x, v.add_weight("w0", random_tensor({128, 64}, rng, "f32"))}, up, "up");
    const int64_t k = variant == 0 ? 64 : 128;
    std::map<std::string, ir::Attr> stat = {{"quant", std::string("w8a8")}, {"act_amax", 1.0}};
    std::map<std::string, ir::Attr> dyn = {
        {"quant", std::string("w8a8")}, {"act_amax", 1.0}, {"act_dynamic", int64_t(1)}};
    v.add_output(
        "a", v.add("Linear", {y, v.add_weight("w1", random_tensor({32, k}, rng, "f32"))}, stat));
    if (variant == 1) v.add_output("b", v.add("Add", {y, y}));
    if (variant == 2)
      v.add_output("b", v.add("Linear", {y, v.add_weight("w2", random_tensor({32, k}, rng, "f32"))},
                              {{"quant", std::string("w8a8")}, {"act_amax", 2.0}}));
    if (variant == 3)
      v.add_output(
          "b", v.add("Linear", {y, v.add_weight("w2", random_tensor({32, k}, rng, "f32"))}, dyn));
    EXPECT_FALSE(int8_fused_output(v.nodes()[0], 0, v, DType::kBF16).has_value())
        << "variant " << variant;
  }
}

TEST(CudaInt8Fuse, ActivationLinearGraphIsBitIdenticalToUnfused) {
  KILN_SKIP_WITHOUT_CUDA();
  // t <= 4: the int8 GEMV (activation in its epilogue, then the codes); more: the CUTLASS
  // GEMM where built (then the activation pass writes the codes), else cuBLASLt's.
  expect_fused_graph_bit_identical(ffn_graph, {1, 4, 5, 64, 301}, 31, 7, "ffn");
}

}  // namespace
}  // namespace kiln::cuda
