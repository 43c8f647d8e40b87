// The FP8 Linear's quantize fused into its producer (cuda_fp8_linear.h): the E4M3 kernels
// of the norms, SwiGLU and the activations against the unfused kernel followed by
// launch_fp8_quantize, code for code (both round the f32 result to bf16, then quantize
// with the same cvt.rn.satfinite: bit-identical, not merely within an ulp); which values
// the backend decides to write as codes (no GPU needed); and graphs of FP8 Linears fed
// by every fused producer, run with the fusion and with KILN_CUDA_FP8_FUSE=0, whose
// outputs must agree bit for bit (the same codes reach the same GEMMs). Skips the device
// parts without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_fp8_linear.h"
#include "backends/cuda/ops/elementwise_fp8.h"
#include "backends/cuda/ops/fp8.h"
#include "backends/cuda/ops/norm.h"
#include "core/dtype.h"
#include "core/fp8.h"
#include "core/status.h"
#include "cuda_test_util.h"

namespace kiln::cuda {
namespace {

using namespace testing;

// Sets an environment variable for one scope, restoring the old value after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};


std::vector<uint16_t> random_bf16(int64_t n, std::mt19937_64& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = f32_to_bf16(d(rng));
  return v;
}

std::vector<float> random_f32(int64_t n, std::mt19937_64& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

// Codes of the fused kernel vs the unfused pair: equal byte for byte, and a spread that
// shows the comparison means something (many distinct codes, some saturated at +-448).
void expect_same_codes(const std::vector<uint8_t>& fused, const std::vector<uint8_t>& unfused,
                       const std::string& what, bool want_saturated = true) {
  ASSERT_EQ(fused.size(), unfused.size()) << what;
  size_t bad = 0, saturated = 0;
  std::set<uint8_t> distinct;
  for (size_t i = 0; i < fused.size(); ++i) {
    distinct.insert(unfused[i]);
    saturated += (unfused[i] & 0x7f) == 0x7e;
    if (fused[i] != unfused[i] && bad++ < 5) {
      ADD_FAILURE() << what << ": element " << i << " fused 0x" << std::hex << int(fused[i]) << ", unfused 0x"
                    << int(unfused[i]);
    }
  }
  EXPECT_EQ(bad, 0u) << what << " (" << fused.size() << " codes)";
  // One-sided activations (GELU, SiLU) reach about half the codes: 59 seen on the H200.
  EXPECT_GE(distinct.size(), std::min<size_t>(fused.size() / 4, 48)) << what << ": too few distinct codes to test";
  if (want_saturated && fused.size() >= 256) {
    EXPECT_GT(saturated, 0u) << what << ": no code saturated";
  }
}

TEST(CudaFp8Fuse, NormKernelsWriteTheQuantizeKernelsCodes) {
  KILN_SKIP_WITHOUT_CUDA();
  // dims: the register-held kernel with 1, 2 and 4 vectors per thread, and the
  // multi-pass kernel (100: not whole vectors; 40000: too long for registers); with
  // KILN_CUDA_NORM_SHORT=warp the rows of at most 1024 (1 to 4 vectors a lane) take the
  // warp-per-row kernel, 300 of them several rows a warp.
  for (NormShort mode : {NormShort::kBlock, NormShort::kWarp})
  for (int64_t dim : {64, 576, 4096, 14336, 100, 40000, 768, 1024})
    for (int64_t rows : {1, 3, 37, 300})
      for (bool rms : {true, false})
        for (bool residual : {false, true}) {
          if ((rows == 300) != (dim == 768 || dim == 1024)) continue;
          if (mode == NormShort::kWarp && norm_kernel_for(DType::kBF16, dim, mode) != NormKernel::kWarp) continue;
          const ScopedNormShort scoped(mode);
          std::mt19937_64 rng(uint64_t(dim * 31 + rows * 7 + rms * 3 + residual));
          const int64_t n = rows * dim;
          const auto x = random_bf16(n, rng, -3.0f, 3.0f), r = random_bf16(n, rng, -3.0f, 3.0f);
          const auto gamma = random_f32(dim, rng, 0.5f, 1.5f), beta = random_f32(dim, rng, -0.5f, 0.5f);
          Dev dx(x.data(), size_t(n) * 2), dr(r.data(), size_t(n) * 2), dg(gamma.data(), size_t(dim) * 4),
              db(beta.data(), size_t(dim) * 4);
          Dev sum_a{size_t(n) * 2}, sum_b{size_t(n) * 2}, y{size_t(n) * 2}, q_a{size_t(n)}, q_b{size_t(n)};
          // The calibrated clip sits inside the output range (|y| reaches ~2.5): some saturate.
          const float inv = fp8_scale_for_amax(1.9).inv;
          const void* res = residual ? dr.get() : nullptr;
          void* sa = residual ? sum_a.get() : nullptr;
          void* sb = residual ? sum_b.get() : nullptr;
          if (rms) {
            launch_add_rms_norm(DType::kBF16, dx.get(), res, dg.as<float>(), 1e-5f, rows, dim, sa, y.get(), nullptr);
            launch_add_rms_norm_fp8(DType::kBF16, dx.get(), res, dg.as<float>(), 1e-5f, rows, dim, sb,
                                    q_b.as<uint8_t>(), inv, nullptr);
          } else {
            launch_add_layer_norm(DType::kBF16, dx.get(), res, dg.as<float>(), db.as<float>(), 1e-5f, rows, dim, sa,
                                  y.get(), nullptr);
            launch_add_layer_norm_fp8(DType::kBF16, dx.get(), res, dg.as<float>(), db.as<float>(), 1e-5f, rows, dim,
                                      sb, q_b.as<uint8_t>(), inv, nullptr);
          }
          launch_fp8_quantize(DType::kBF16, y.get(), n, inv, q_a.as<uint8_t>(), nullptr);
          KILN_CUDA_CHECK(cudaDeviceSynchronize());
          const std::string what = str_cat(residual ? "Add" : "", rms ? "RMSNorm" : "LayerNorm", " rows=", rows,
                                           " dim=", dim, mode == NormShort::kWarp ? " (warp kernel)" : "");
          expect_same_codes(q_b.host(size_t(n)), q_a.host(size_t(n)), what);
          if (residual) {
            EXPECT_EQ(sum_b.host(size_t(n) * 2), sum_a.host(size_t(n) * 2)) << what << ": sum";
          }
        }
}

TEST(CudaFp8Fuse, SwigluAndActivationsWriteTheQuantizeKernelsCodes) {
  KILN_SKIP_WITHOUT_CUDA();
  const float inv = fp8_scale_for_amax(2.5).inv;
  // inter: whole 16-byte vectors (8 bf16) or not (12, 7: one element per thread).
  for (int64_t inter : {8, 512, 14336, 12, 7})
    for (int64_t rows : {1, 5, 64}) {
      std::mt19937_64 rng(uint64_t(inter * 13 + rows));
      const auto x = random_bf16(rows * 2 * inter, rng, -4.0f, 4.0f);
      Dev dx(x.data(), x.size() * 2), y{size_t(rows * inter) * 2}, q_a{size_t(rows * inter)},
          q_b{size_t(rows * inter)};
      launch_swiglu(DType::kBF16, dx.get(), rows, inter, y.get(), nullptr);
      launch_fp8_quantize(DType::kBF16, y.get(), rows * inter, inv, q_a.as<uint8_t>(), nullptr);
      launch_swiglu_fp8(DType::kBF16, dx.get(), rows, inter, inv, q_b.as<uint8_t>(), nullptr);
      KILN_CUDA_CHECK(cudaDeviceSynchronize());
      expect_same_codes(q_b.host(size_t(rows * inter)), q_a.host(size_t(rows * inter)),
                        str_cat("SwiGLU rows=", rows, " inter=", inter));
    }
  for (UnaryOp op : {UnaryOp::kGeluErf, UnaryOp::kGeluTanh, UnaryOp::kSilu, UnaryOp::kTanh})
    for (int64_t n : {1, 8, 1000, 1003, 65536 * 3}) {
      std::mt19937_64 rng(uint64_t(n) + uint64_t(op) * 101);
      const auto x = random_bf16(n, rng, -5.0f, 5.0f);
      Dev dx(x.data(), x.size() * 2), y{size_t(n) * 2}, q_a{size_t(n)}, q_b{size_t(n)};
      // tanh never exceeds 1: a scale that saturates GELU/SiLU would leave it few codes.
      const float op_inv = op == UnaryOp::kTanh ? fp8_scale_for_amax(0.9).inv : inv;
      launch_unary(op, DType::kBF16, dx.get(), n, y.get(), nullptr);
      launch_fp8_quantize(DType::kBF16, y.get(), n, op_inv, q_a.as<uint8_t>(), nullptr);
      launch_unary_fp8(op, DType::kBF16, dx.get(), n, op_inv, q_b.as<uint8_t>(), nullptr);
      KILN_CUDA_CHECK(cudaDeviceSynchronize());
      expect_same_codes(q_b.host(size_t(n)), q_a.host(size_t(n)), str_cat("activation ", int(op), " n=", n));
    }
}

// The E4M3-in SwiGLU (--fp8-gate-up-out's prefill path) against a host reference of the
// CPU backend's chain: decode(code) * gu_scale for gate and up, silu(g) * u in f32, then
// core/dtype.h's E4M3 rounding of v * inv. The device's expf may differ from the host's
// by an ulp, which can move a value across a rounding boundary: at most 0.1% of the codes
// may differ, each by one step; the rest equal byte for byte.
TEST(CudaFp8Fuse, SwigluFromE4M3MatchesTheHostChain) {
  KILN_SKIP_WITHOUT_CUDA();
  const float gu_scale = fp8_scale_for_amax(6.0).scale, inv = fp8_scale_for_amax(3.0).inv;
  for (int64_t inter : {16, 512, 14336, 12, 7})
    for (int64_t rows : {1, 5, 64}) {
      std::mt19937_64 rng(uint64_t(inter * 31 + rows));
      std::vector<uint8_t> x(size_t(rows * 2 * inter));
      for (auto& c : x) {
        c = uint8_t(rng());
        if ((c & 0x7f) == 0x7f) c ^= 1;  // no NaN codes
      }
      Dev dx(x.data(), x.size()), q{size_t(rows * inter)};
      launch_swiglu_e4m3(dx.as<uint8_t>(), rows, inter, gu_scale, inv, q.as<uint8_t>(), nullptr);
      KILN_CUDA_CHECK(cudaDeviceSynchronize());
      const auto got = q.host(size_t(rows * inter));
      std::vector<uint8_t> want(got.size());
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < inter; ++j) {
          const float g = fp8e4m3_to_f32(x[size_t(r * 2 * inter + j)]) * gu_scale;
          const float u = fp8e4m3_to_f32(x[size_t(r * 2 * inter + inter + j)]) * gu_scale;
          want[size_t(r * inter + j)] = f32_to_fp8e4m3(g / (1.0f + std::exp(-g)) * u * inv);
        }
      size_t off = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        if (got[i] == want[i]) continue;
        ++off;
        const int d = std::abs(int(got[i] & 0x7f) - int(want[i] & 0x7f));
        EXPECT_TRUE((got[i] & 0x80) == (want[i] & 0x80) && d == 1)
            << "rows=" << rows << " inter=" << inter << " element " << i << ": 0x" << std::hex << int(got[i])
            << " vs 0x" << int(want[i]);
      }
      EXPECT_LE(off, got.size() / 1000) << "rows=" << rows << " inter=" << inter;
      std::set<uint8_t> distinct(want.begin(), want.end());
      EXPECT_GE(distinct.size(), std::min<size_t>(got.size() / 4, 48)) << "rows=" << rows << " inter=" << inter;
    }
}

// A graph with every fused producer feeding FP8 Linears (hidden 256):
//   AddRMSNorm(x, r) -> gate|up (swiglu) -> down;  RMSNorm(down) -> Linear+gelu_tanh -> out2;
//   LayerNorm(sum) -> Linear -> out3;  Linear -> Gelu -> Linear -> out4;
//   Linear -> SwiGLU -> Linear -> out5;  AddLayerNorm(out3', sum) -> two Linears, same act_amax.
// `tap_norm`: the first norm's output is also a graph output (so it must stay bf16).
struct FusedGraph {
  ir::Graph g;
  const ir::Node* node(const std::string& name) const {
    for (const ir::Node& n : g.nodes())
      if (n.name == name) return &n;
    ADD_FAILURE() << "no node " << name;
    return nullptr;
  }
};

FusedGraph fused_graph(std::mt19937_64& rng, bool tap_norm) {
  FusedGraph fg;
  ir::Graph& g = fg.g;
  const int64_t h = 256;
  auto x = g.add_input("x", DType::kF32, Shape{"T", h});
  auto r = g.add_input("r", DType::kF32, Shape{"T", h});
  int wi = 0;
  auto linear = [&](ir::ValueId in, int64_t k, int64_t n, double amax, const std::string& act,
                    const std::string& name) {
    std::map<std::string, ir::Attr> a = {{"quant", std::string("fp8")}, {"act_amax", amax}};
    if (!act.empty()) a["activation"] = act;
    auto w = g.add_weight(str_cat("w", wi), random_tensor({n, k}, rng, "bf16", -0.1f, 0.1f));
    auto b = g.add_weight(str_cat("b", wi++), random_tensor({n}, rng, "bf16", -0.2f, 0.2f));
    return g.add("Linear", {in, w, b}, a, name);
  };
  auto gamma = [&](int64_t n) { return g.add_weight(str_cat("g", wi++), random_tensor({n}, rng, "f32", 0.5f, 1.5f)); };
  auto add_norm = g.add_node("AddRMSNorm", {x, r, gamma(h)}, {{"eps", 1e-5}}, "add_norm");
  if (tap_norm) g.add_output("normed", add_norm[1]);
  auto act = linear(add_norm[1], h, 2 * 384, 1.8, "swiglu", "gate_up");
  auto down = linear(act, 384, h, 0.35, "", "down");
  auto n2 = g.add("RMSNorm", {down, gamma(h)}, {{"eps", 1e-5}}, "rms");
  auto out2 = linear(n2, h, 128, 1.6, "gelu_tanh", "gelu_lin");
  auto out2b = linear(out2, 128, 64, 0.9, "", "after_gelu_lin");
  auto beta = g.add_weight("beta", random_tensor({h}, rng, "f32", -0.3f, 0.3f));
  auto n3 = g.add("LayerNorm", {add_norm[0], gamma(h), beta}, {{"eps", 1e-5}}, "ln");
  auto out3 = linear(n3, h, h, 2.0, "", "ln_lin");
  auto z = linear(out3, h, 192, 1.2, "", "pre_gelu");
  auto gz = g.add("Gelu", {z}, {{"approximate", std::string("none")}}, "gelu");
  auto out4 = linear(gz, 192, 96, 0.8, "", "after_gelu");
  auto s = linear(out3, h, 2 * 160, 1.2, "", "pre_swiglu");
  auto sw = g.add("SwiGLU", {s}, {}, "swiglu");
  auto out5 = linear(sw, 160, 64, 0.3, "", "after_swiglu");
  auto beta2 = g.add_weight("beta2", random_tensor({h}, rng, "f32", -0.3f, 0.3f));
  auto aln = g.add_node("AddLayerNorm", {out3, add_norm[0], gamma(h), beta2}, {{"eps", 1e-5}}, "add_ln");
  auto out6 = linear(aln[1], h, 80, 1.7, "", "two_readers_a");
  auto out7 = linear(aln[1], h, 48, 1.7, "silu", "two_readers_b");
  g.add_output("sum", add_norm[0]);
  g.add_output("down", down);
  g.add_output("out2", out2b);
  g.add_output("out4", out4);
  g.add_output("out5", out5);
  g.add_output("sum2", aln[0]);
  g.add_output("out6", out6);
  g.add_output("out7", out7);
  ir::verify(g);
  return fg;
}

bool fused(const FusedGraph& fg, const std::string& node, size_t out, DType act = DType::kBF16) {
  const ir::Node* n = fg.node(node);
  return n && fp8_fused_output(*n, out, fg.g, act).has_value();
}

TEST(CudaFp8Fuse, WhichOutputsAreWrittenAsCodes) {
  ScopedEnv env("KILN_CUDA_FP8_FUSE", nullptr);
  std::mt19937_64 rng(3);
  const FusedGraph fg = fused_graph(rng, false);
  EXPECT_TRUE(fused(fg, "add_norm", 1));
  EXPECT_FALSE(fused(fg, "add_norm", 0)) << "the residual sum stays bf16";
  EXPECT_TRUE(fused(fg, "gate_up", 0));  // FP8 Linear + swiglu -> FP8 down
  EXPECT_FALSE(fused(fg, "down", 0)) << "a graph output, read by a norm";
  EXPECT_TRUE(fused(fg, "rms", 0));
  EXPECT_TRUE(fused(fg, "gelu_lin", 0));  // FP8 Linear + gelu_tanh -> FP8 Linear
  EXPECT_TRUE(fused(fg, "ln", 0));
  EXPECT_FALSE(fused(fg, "ln_lin", 0)) << "no activation: nothing to fuse the quantize into";
  EXPECT_TRUE(fused(fg, "gelu", 0));
  EXPECT_TRUE(fused(fg, "swiglu", 0));
  EXPECT_TRUE(fused(fg, "add_ln", 1)) << "two FP8 readers with one act_amax";
  EXPECT_FALSE(fused(fg, "two_readers_b", 0)) << "a graph output";
  EXPECT_FALSE(fused(fg, "add_norm", 1, DType::kF16)) << "FP8 Linears run with bf16 activations only";
  // The profile names both ends.
  EXPECT_EQ(fp8_profile_tag(*fg.node("add_norm"), fg.g, DType::kBF16), "{+e4m3 quantize}");
  EXPECT_EQ(fp8_profile_tag(*fg.node("gate_up"), fg.g, DType::kBF16), "{fp8}{e4m3 in}{+e4m3 quantize}");
  EXPECT_EQ(fp8_profile_tag(*fg.node("down"), fg.g, DType::kBF16), "{fp8}{e4m3 in}");
  EXPECT_EQ(fp8_profile_tag(*fg.node("ln_lin"), fg.g, DType::kBF16), "{fp8}{e4m3 in}");
  EXPECT_EQ(fp8_profile_tag(*fg.node("pre_gelu"), fg.g, DType::kBF16), "{fp8}");

  // The norm's output also a graph output: it stays bf16, and so does the read.
  std::mt19937_64 rng2(3);
  const FusedGraph tapped = fused_graph(rng2, true);
  EXPECT_FALSE(fused(tapped, "add_norm", 1));
  EXPECT_EQ(fp8_profile_tag(*tapped.node("gate_up"), tapped.g, DType::kBF16), "{fp8}{+e4m3 quantize}");

  // Readers with different scales, or a reader that is not an FP8 Linear's x: no codes.
  for (int variant = 0; variant < 3; ++variant) {
    ir::Graph g;
    auto x = g.add_input("x", DType::kF32, Shape{"T", 64});
    auto y = g.add("RMSNorm", {x, g.add_weight("g", random_tensor({64}, rng, "f32"))}, {{"eps", 1e-5}}, "norm");
    auto w1 = g.add_weight("w1", random_tensor({32, 64}, rng, "bf16")), w2 = g.add_weight("w2", random_tensor({32, 64}, rng, "bf16"));
    g.add_output("a", g.add("Linear", {y, w1}, {{"quant", std::string("fp8")}, {"act_amax", 1.0}}));
    if (variant == 0) g.add_output("b", g.add("Linear", {y, w2}, {{"quant", std::string("fp8")}, {"act_amax", 1.5}}));
    if (variant == 1) g.add_output("b", g.add("Linear", {y, w2}));  // a bf16 Linear
    if (variant == 2) g.add_output("b", g.add("Add", {y, y}));
    EXPECT_FALSE(fp8_fused_output(g.nodes()[0], 0, g, DType::kBF16).has_value()) << "variant " << variant;
  }
}

TEST(CudaFp8Fuse, EnvironmentSwitch) {
  std::mt19937_64 rng(3);
  const FusedGraph fg = fused_graph(rng, false);
  {
    ScopedEnv env("KILN_CUDA_FP8_FUSE", "0");
    EXPECT_FALSE(fp8_fuse_enabled());
    EXPECT_FALSE(fused(fg, "add_norm", 1));
    EXPECT_EQ(fp8_profile_tag(*fg.node("down"), fg.g, DType::kBF16), "{fp8}");
  }
  {
    ScopedEnv env("KILN_CUDA_FP8_FUSE", "1");
    EXPECT_TRUE(fp8_fuse_enabled());
    EXPECT_TRUE(fused(fg, "add_norm", 1));
  }
  ScopedEnv env("KILN_CUDA_FP8_FUSE", "yes");
  try {
    (void)fp8_fuse_enabled();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KILN_CUDA_FP8_FUSE='yes'"), std::string::npos) << e.what();
  }
}

TensorMap run_cuda(const ir::Graph& g, const TensorMap& in, const char* fuse) {
  ScopedEnv env("KILN_CUDA_FP8_FUSE", fuse);  // read while compiling
  auto gg = create_backend("cuda")->compile(g, {.weight_dtype = "fp8"});
  TensorMap out = gg->run(in, {}, nullptr);
  TensorMap copy;  // outputs are views of the compiled graph's pinned buffer
  for (auto& [name, t] : out) copy[name] = t.to(DType::kF32);
  return copy;
}

TEST(CudaFp8Fuse, FusedGraphIsBitIdenticalToUnfused) {
  KILN_SKIP_WITHOUT_CUDA();
  // t <= 4: the FP8 GEMV; more: cuBLASLt, at token counts other than the tuned m = 128
  // (the heuristic's first algorithm, the same in both compiles).
  for (int64_t t : {1, 3, 4, 5, 64, 300}) {
    std::mt19937_64 rng(uint64_t(t) * 977);
    const FusedGraph fg = fused_graph(rng, false);
    TensorMap in = {{"x", random_tensor({t, 256}, rng, "bf16", -2.0f, 2.0f)},
                    {"r", random_tensor({t, 256}, rng, "bf16", -2.0f, 2.0f)}};
    const TensorMap on = run_cuda(fg.g, in, nullptr), off = run_cuda(fg.g, in, "0");
    expect_outputs_bit_identical(on, off, str_cat("fused vs unfused t=", t));
  }
}

// Attention feeding an FP8 o-projection writes its codes: from the flash kernel's
// epilogue (KILN_CUDA_FLASH=1, head dims 64/128) or by a quantize pass over its own
// output (the other plans), bit-identical to the unfused attention -> quantize -> GEMM.
// Without a KV cache (encoder rows read in place), causal and not, sequences off the
// kernel's CTA (of the width its plan picks: 32 or 64 items here) and 64-key tile, GQA and MHA.
TEST(CudaFp8Fuse, AttentionWritesTheOProjectionsCodes) {
  KILN_SKIP_WITHOUT_CUDA();
  struct Case {
    int64_t hq, hkv, d;
    std::vector<int32_t> seqs;
    bool causal;
  };
  for (const Case& c : {Case{8, 2, 64, {200, 37}, true}, Case{4, 4, 128, {150}, false}, Case{32, 8, 128, {300, 1}, true}})
    for (const char* flash : {"", "1"}) {
      ir::Graph g;
      const int64_t qw = c.hq * c.d, kw = c.hkv * c.d;
      auto q = g.add_input("q", DType::kF32, Shape{"T", qw});
      auto k = g.add_input("k", DType::kF32, Shape{"T", kw});
      auto v = g.add_input("v", DType::kF32, Shape{"T", kw});
      auto a = g.add("Attention", {q, k, v},
                     {{"layer", int64_t(0)}, {"num_heads", c.hq}, {"num_kv_heads", c.hkv}, {"head_dim", c.d},
                      {"scale", 1.0 / std::sqrt(double(c.d))}, {"causal", int64_t(c.causal)}},
                     "attn");
      std::mt19937_64 rng(uint64_t(c.d * 31 + c.hq));
      auto w = g.add_weight("w_o", random_tensor({64, qw}, rng, "bf16"));
      g.add_output("y", g.add("Linear", {a, w}, {{"quant", std::string("fp8")}, {"act_amax", 1.5}}, "o_proj"));
      ASSERT_TRUE(fp8_fused_output(g.nodes()[0], 0, g, DType::kBF16).has_value());
      const StepInfo step = cacheless_step(c.seqs);
      const int32_t t = int32_t(step.slot_mapping.size());
      const TensorMap in = {{"q", random_tensor({t, qw}, rng, "bf16", -2, 2)},
                            {"k", random_tensor({t, kw}, rng, "bf16", -2, 2)},
                            {"v", random_tensor({t, kw}, rng, "bf16", -2, 2)}};
      const ScopedEnv flash_env("KILN_CUDA_FLASH", flash);
      auto run = [&](const char* fuse) {
        ScopedEnv env("KILN_CUDA_FP8_FUSE", fuse);  // read while compiling, as KILN_CUDA_FLASH
        auto gg = create_backend("cuda")->compile(g, {.weight_dtype = "fp8"});
        return gg->run(in, step, nullptr).at("y").to(DType::kF32);
      };
      const Tensor on = run(nullptr), off = run("0");
      ASSERT_EQ(on.shape(), off.shape());
      size_t bad = 0;
      float max_ref = 0;
      for (int64_t i = 0; i < off.numel(); ++i) {
        max_ref = std::max(max_ref, std::fabs(off.data_as<float>()[i]));
        bad += f32_bits(on.data_as<float>()[i]) != f32_bits(off.data_as<float>()[i]);
      }
      EXPECT_EQ(bad, 0u) << "hq=" << c.hq << " d=" << c.d << " flash=" << flash << " of " << off.numel();
      EXPECT_GT(max_ref, 0.0f);
    }
}

}  // namespace
}  // namespace kiln::cuda
