// The warp-per-row norm kernel for short rows (ops/norm.h, KILN_CUDA_NORM_SHORT=warp):
// the switch's values and which rows take the kernel (no GPU needed); LayerNorm (with and
// without bias), RMSNorm and the fused AddLayerNorm / AddRMSNorm against the CPU backend
// for 1 to 4100 rows of 64 to 1024 elements in f16 and bf16 (and f32 rows of up to 512);
// its forced launch shapes against the block kernel; longer rows left to the block kernel,
// bit for bit; a residual sum not stored leaves every kernel's norm unchanged. Its E4M3 /
// int8 outputs against norm -> quantize: fp8_fuse_test.cpp and int8_fuse_test.cpp. Skips
// the device parts without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/ops/norm.h"
#include "core/dtype.h"
#include "core/status.h"
#include "cuda_test_util.h"

namespace kiln::cuda {
namespace {

using namespace testing;

TEST(CudaNormShort, SwitchValues) {
  EXPECT_EQ(norm_short_from_value(nullptr), NormShort::kAuto);
  EXPECT_EQ(norm_short_from_value(""), NormShort::kAuto);
  EXPECT_EQ(norm_short_from_value("auto"), NormShort::kAuto);
  EXPECT_EQ(norm_short_from_value("block"), NormShort::kBlock);
  EXPECT_EQ(norm_short_from_value("warp"), NormShort::kWarp);
  for (const char* bad : {"Warp", "1", "warps", " block", "AUTO"}) {
    try {
      (void)norm_short_from_value(bad);
      ADD_FAILURE() << "'" << bad << "' accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << bad;
      EXPECT_NE(std::string(e.what()).find("KILN_CUDA_NORM_SHORT"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

// Rows of at most 128 whole 16-byte vectors take the warp kernel under kWarp, or under
// kAuto from kNormWarpMinRows rows on, and only then.
TEST(CudaNormShort, KernelChoice) {
  for (DType t : {DType::kBF16, DType::kF16}) {
    for (int64_t dim = 8; dim <= 1024; dim += 8) {
      EXPECT_EQ(norm_kernel_for(t, dim, NormShort::kWarp), NormKernel::kWarp) << dtype_name(t) << " " << dim;
      EXPECT_EQ(norm_kernel_for(t, dim, NormShort::kWarp, 1), NormKernel::kWarp) << dtype_name(t) << " " << dim;
      EXPECT_EQ(norm_kernel_for(t, dim, NormShort::kBlock), NormKernel::kRegs) << dtype_name(t) << " " << dim;
      EXPECT_EQ(norm_kernel_for(t, dim, NormShort::kAuto, kNormWarpMinRows), NormKernel::kWarp)
          << dtype_name(t) << " " << dim;
      EXPECT_EQ(norm_kernel_for(t, dim, NormShort::kAuto, kNormWarpMinRows - 1), NormKernel::kRegs)
          << dtype_name(t) << " " << dim;
    }
    for (int64_t dim : {1032, 2048, 4096, 32768})
      EXPECT_EQ(norm_kernel_for(t, dim, NormShort::kWarp), NormKernel::kRegs) << dtype_name(t) << " " << dim;
    for (int64_t dim : {100, 1020, 7, 40000, 32776})
      EXPECT_EQ(norm_kernel_for(t, dim, NormShort::kWarp), NormKernel::kRows) << dtype_name(t) << " " << dim;
  }
  EXPECT_EQ(norm_kernel_for(DType::kF32, 512, NormShort::kWarp), NormKernel::kWarp);
  EXPECT_EQ(norm_kernel_for(DType::kF32, 516, NormShort::kWarp), NormKernel::kRegs);
  EXPECT_EQ(norm_kernel_for(DType::kF32, 1024, NormShort::kWarp), NormKernel::kRegs);
  EXPECT_EQ(norm_kernel_for(DType::kF32, 66, NormShort::kWarp), NormKernel::kRows);
  const ScopedNormShort scoped(NormShort::kWarp);
  EXPECT_EQ(norm_short_mode(), NormShort::kWarp);
}

// One norm node: inputs x (and r), weights gamma (and beta).
void check_norm(const std::string& op, bool bias, const std::string& dt, int64_t rows, int64_t dim) {
  std::mt19937_64 rng(uint64_t(rows * 7 + dim * 3 + op.size() + bias + dt.size()));
  const bool add = op.rfind("Add", 0) == 0;
  ir::Graph g;
  TensorMap inputs;
  std::vector<ir::ValueId> args;
  args.push_back(g.add_input("x", DType::kF32, Shape{"T", dim}));  // the CUDA graph runs it in dt
  inputs["x"] = random_tensor({rows, dim}, rng, dt, -3.0f, 3.0f);
  if (add) {
    args.push_back(g.add_input("r", DType::kF32, Shape{"T", dim}));
    inputs["r"] = random_tensor({rows, dim}, rng, dt, -3.0f, 3.0f);
  }
  args.push_back(g.add_weight("w", random_tensor({dim}, rng, "f32", 0.5f, 1.5f)));
  if (bias) args.push_back(g.add_weight("b", random_tensor({dim}, rng, "f32")));
  const std::map<std::string, ir::Attr> attrs = {{"eps", op.find("RMS") != std::string::npos ? 1e-6 : 1e-5}};
  if (add) {
    auto outs = g.add_node(op, args, attrs, "op");
    g.add_output("sum", outs[0]);
    g.add_output("y", outs[1]);
  } else {
    g.add_output("y", g.add(op, args, attrs, "op"));
  }
  expect_backends_match(g, {{inputs, {}}}, dt, op_tolerance(dt),
                        str_cat(op, bias ? "+bias" : "", " warp rows=", rows, " dim=", dim));
}

TEST(CudaNormShort, WarpKernelMatchesTheCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  const ScopedNormShort scoped(NormShort::kWarp);
  struct Op {
    const char* name;
    bool bias;
  };
  // dims (16-bit): 1 to 4 vectors a lane, lanes left idle (64: 8 of 32; 576: 72 vectors;
  // 1000: 125); rows: fewer than a block's warps, a few blocks with idle warps, two rows a
  // warp (4100).
  for (const std::string dt : {"bf16", "f16", "f32"})
    for (int64_t rows : {1, 33, 300, 4100})
      for (int64_t dim : {64, 320, 576, 768, 1000, 1024}) {
        if (dt == "f32" && dim > 512) continue;  // 128 vectors of 4 floats at most
        if (rows == 4100 && dim != 768 && dim != 1024) continue;  // the CPU reference's time
        ASSERT_EQ(norm_kernel_for(storage_dtype(dt), dim, NormShort::kWarp), NormKernel::kWarp);
        for (Op op : {Op{"LayerNorm", true}, Op{"LayerNorm", false}, Op{"RMSNorm", false}, Op{"AddLayerNorm", true},
                      Op{"AddRMSNorm", false}})
          check_norm(op.name, op.bias, dt, rows, dim);
      }
}


std::vector<uint16_t> random_bf16(int64_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> d(-3.0f, 3.0f);
  std::vector<uint16_t> v(size_t(n), 0);
  for (auto& x : v) x = f32_to_bf16(d(rng));
  return v;
}

std::vector<float> random_f32(int64_t n, std::mt19937_64& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(size_t(n), 0.0f);
  for (auto& x : v) x = d(rng);
  return v;
}

// The bench's warp-kernel shapes (warps per block x rows per warp) against the block
// kernel: within the f32 statistics' reordering (two bf16 ulps), the sum bit for bit.
// Rows the warp kernel cannot take launch nothing, and the default launchers leave them to
// the block kernel under KILN_CUDA_NORM_SHORT=warp: the same bits as under block.
TEST(CudaNormShort, ForcedWarpShapesAgreeWithTheBlockKernel) {
  KILN_SKIP_WITHOUT_CUDA();
  for (int64_t dim : {64, 768, 1024, 1032, 4096})
    for (int64_t rows : {5, 300}) {
      const int64_t n = rows * dim;
      std::mt19937_64 rng(uint64_t(rows + dim));
      const auto x = random_bf16(n, rng), r = random_bf16(n, rng);
      const auto gamma = random_f32(dim, rng, 0.5f, 1.5f), beta = random_f32(dim, rng, -0.5f, 0.5f);
      Dev dx(x.data(), size_t(n) * 2), dr(r.data(), size_t(n) * 2), dg(gamma.data(), size_t(dim) * 4),
          db(beta.data(), size_t(dim) * 4), sum_a{size_t(n) * 2}, sum_b{size_t(n) * 2}, y_a{size_t(n) * 2},
          y_b{size_t(n) * 2};
      const bool fits = dim / 8 <= 128;
      for (bool rms : {true, false}) {
        auto run_default = [&](NormShort mode, const Dev& sum, const Dev& y) {
          const ScopedNormShort scoped(mode);
          if (rms) launch_add_rms_norm(DType::kBF16, dx.get(), dr.get(), dg.as<float>(), 1e-5f, rows, dim, sum.get(), y.get(), nullptr);
          else launch_add_layer_norm(DType::kBF16, dx.get(), dr.get(), dg.as<float>(), db.as<float>(), 1e-5f, rows, dim, sum.get(), y.get(), nullptr);
          KILN_CUDA_CHECK(cudaDeviceSynchronize());
        };
        run_default(NormShort::kBlock, sum_a, y_a);
        const auto want = y_a.host<uint16_t>(size_t(n)), want_sum = sum_a.host<uint16_t>(size_t(n));
        const std::string what = str_cat(rms ? "AddRMSNorm" : "AddLayerNorm", " rows=", rows, " dim=", dim);
        if (!fits) {
          run_default(NormShort::kWarp, sum_b, y_b);
          EXPECT_EQ(y_b.host<uint16_t>(size_t(n)), want) << what << ": a long row under warp must take the block kernel";
          EXPECT_EQ(sum_b.host<uint16_t>(size_t(n)), want_sum) << what;
        }
        for (int warps : {1, 2, 4, 8})
          for (int rpw : {0, 1, 3}) {
            KILN_CUDA_CHECK(cudaMemset(y_b.get(), 0xff, size_t(n) * 2));  // NaN: rows left unwritten show
            const bool ok = launch_add_norm_shaped(DType::kBF16, rms, dx.get(), dr.get(), dg.as<float>(), rms ? nullptr : db.as<float>(),
                                                   1e-5f, rows, dim, sum_b.get(), y_b.get(),
                                                   {.warps = warps, .rows_per_warp = rpw}, nullptr);
            KILN_CUDA_CHECK(cudaDeviceSynchronize());
            EXPECT_EQ(ok, fits) << what << " warps " << warps << " rows/warp " << rpw;
            if (!ok) continue;
            const auto got = y_b.host<uint16_t>(size_t(n));
            double worst = 0;
            for (int64_t i = 0; i < n; ++i) {
              const double g = bf16_to_f32(got[size_t(i)]), w = bf16_to_f32(want[size_t(i)]);
              worst = std::max(worst, std::isnan(g) ? INFINITY : std::fabs(g - w) / std::max(std::fabs(w), 1e-3));
            }
            EXPECT_LE(worst, std::ldexp(1.0, -6)) << what << " warps " << warps << " rows/warp " << rpw;
            EXPECT_EQ(sum_b.host<uint16_t>(size_t(n)), want_sum) << what << " warps " << warps << " rows/warp " << rpw;
          }
      }
    }
  // Shapes out of range, and an operand off 16-byte alignment, launch nothing.
  Dev x{1024 * 2 + 16}, y{1024 * 2}, g{1024 * 4};
  EXPECT_FALSE(launch_add_norm_shaped(DType::kBF16, true, x.get(), nullptr, g.as<float>(), nullptr, 1e-5f, 1, 1024,
                                      nullptr, y.get(), {.warps = 9}, nullptr));
  EXPECT_FALSE(launch_add_norm_shaped(DType::kBF16, true, static_cast<char*>(x.get()) + 2, nullptr, g.as<float>(), nullptr,
                                      1e-5f, 1, 1024, nullptr, y.get(), {.warps = 8}, nullptr));
  EXPECT_TRUE(launch_add_norm_shaped(DType::kBF16, true, static_cast<char*>(x.get()) + 16, nullptr, g.as<float>(), nullptr,
                                     1e-5f, 1, 1024, nullptr, y.get(), {.warps = 8}, nullptr));
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
}

// A residual sum that no node reads (a post-norm block's) is not stored: the norm of
// every kernel (block, warp, multi-pass) and output form (T, int8, the dual T + int8) is
// the same, bit for bit, as with the sum stored.
TEST(CudaNormShort, UnstoredSumLeavesTheNormUnchanged) {
  KILN_SKIP_WITHOUT_CUDA();
  for (NormShort mode : {NormShort::kBlock, NormShort::kWarp})
    for (int64_t dim : {100, 768, 4096})  // 100: not whole 16-byte vectors, the multi-pass kernel
      for (int64_t rows : {1, 300}) {
        const int64_t n = rows * dim;
        std::mt19937_64 rng(uint64_t(rows * 31 + dim));
        const auto x = random_bf16(n, rng), r = random_bf16(n, rng);
        const auto gamma = random_f32(dim, rng, 0.5f, 1.5f),
                   beta = random_f32(dim, rng, -0.5f, 0.5f);
        Dev dx(x.data(), size_t(n) * 2), dr(r.data(), size_t(n) * 2),
            dg(gamma.data(), size_t(dim) * 4), db(beta.data(), size_t(dim) * 4), sum{size_t(n) * 2},
            y_a{size_t(n) * 2}, y_b{size_t(n) * 2}, q_a{size_t(n)}, q_b{size_t(n)};
        const ScopedNormShort scoped(mode);
        const std::string what =
            str_cat(mode == NormShort::kWarp ? "warp" : "block", " rows=", rows, " dim=", dim);
        for (bool rms : {true, false}) {
          auto run = [&](void* s, const Dev& y) {
            if (rms)
              launch_add_rms_norm(DType::kBF16, dx.get(), dr.get(), dg.as<float>(), 1e-5f, rows,
                                  dim, s, y.get(), nullptr);
            else
              launch_add_layer_norm(DType::kBF16, dx.get(), dr.get(), dg.as<float>(),
                                    db.as<float>(), 1e-5f, rows, dim, s, y.get(), nullptr);
          };
          auto run_dual = [&](void* s, const Dev& y, const Dev& q) {
            if (rms)
              launch_add_rms_norm_dual(DType::kBF16, dx.get(), dr.get(), dg.as<float>(), 1e-5f,
                                       rows, dim, s, y.get(), q.as<int8_t>(), 0.1f, nullptr,
                                       nullptr);
            else
              launch_add_layer_norm_dual(DType::kBF16, dx.get(), dr.get(), dg.as<float>(),
                                         db.as<float>(), 1e-5f, rows, dim, s, y.get(),
                                         q.as<int8_t>(), 0.1f, nullptr, nullptr);
          };
          auto run_int8 = [&](void* s, const Dev& q) {
            if (rms)
              launch_add_rms_norm_int8(DType::kBF16, dx.get(), dr.get(), dg.as<float>(), 1e-5f,
                                       rows, dim, s, q.as<int8_t>(), 0.1f, nullptr, nullptr);
            else
              launch_add_layer_norm_int8(DType::kBF16, dx.get(), dr.get(), dg.as<float>(),
                                         db.as<float>(), 1e-5f, rows, dim, s, q.as<int8_t>(), 0.1f,
                                         nullptr, nullptr);
          };
          const std::string op = str_cat(rms ? "AddRMSNorm " : "AddLayerNorm ", what);
          KILN_CUDA_CHECK(cudaMemset(y_b.get(), 0xff, size_t(n) * 2));
          run(sum.get(), y_a);
          run(nullptr, y_b);
          KILN_CUDA_CHECK(cudaDeviceSynchronize());
          EXPECT_EQ(y_b.host<uint16_t>(size_t(n)), y_a.host<uint16_t>(size_t(n))) << op;
          if (dim % 8 != 0)
            continue;  // the int8 forms take whole 16-byte vectors (the fused graphs')
          KILN_CUDA_CHECK(cudaMemset(y_b.get(), 0xff, size_t(n) * 2));
          run_dual(sum.get(), y_a, q_a);
          run_dual(nullptr, y_b, q_b);
          KILN_CUDA_CHECK(cudaDeviceSynchronize());
          EXPECT_EQ(y_b.host<uint16_t>(size_t(n)), y_a.host<uint16_t>(size_t(n))) << op << " dual";
          EXPECT_EQ(q_b.host<int8_t>(size_t(n)), q_a.host<int8_t>(size_t(n)))
              << op << " dual codes";
          KILN_CUDA_CHECK(cudaMemset(q_b.get(), 0x7f, size_t(n)));
          run_int8(nullptr, q_b);
          KILN_CUDA_CHECK(cudaDeviceSynchronize());
          EXPECT_EQ(q_b.host<int8_t>(size_t(n)), q_a.host<int8_t>(size_t(n))) << op << " int8";
        }
      }
}

}  // namespace
}  // namespace kiln::cuda
