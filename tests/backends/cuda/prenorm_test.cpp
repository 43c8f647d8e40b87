// Linears with a norm prologue and a residual epilogue (pass fuse_norm_linear) on the
// CUDA backend: o = Linear(x); s, n = AddNorm(o, r); z = Linear(n) after the pass is
// s = Linear{+r}(x); z = Linear{norm}(s). The fused graph on CUDA is checked against the
// unfused graph on the CPU (f32, the reference) and against the unfused graph on CUDA
// in the same dtype, for RMSNorm and LayerNorm, with and without biases and activation
// epilogues, over GEMV row counts (1-4), GEMM row counts (5, 8, 33), a hidden size the
// GEMV splits over K, and one past the GEMV's shared memory (norm into scratch). Skips
// without a GPU.
#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "passes/pass.h"

namespace kiln::cuda {
namespace {

using namespace testing;

struct Block {
  ir::Graph unfused, fused;
  TensorMap inputs;
};

// x [t, k1] -> o [t, h]; r [t, h]; (s, n) = AddNorm(o, r); z = Linear{act}(n) [t, n_out].
Block make_block(const std::string& dtype, bool rms, bool bias, const std::string& act, int64_t t, int64_t h,
                 uint64_t seed) {
  const int64_t k1 = 256, n_out = 320;
  std::mt19937_64 rng(seed);
  Block b;
  ir::Graph& g = b.unfused;
  ir::ValueId x = g.add_input("x", DType::kF32, Shape{"T", k1});
  ir::ValueId r = g.add_input("r", DType::kF32, Shape{"T", h});
  b.inputs["x"] = random_tensor({t, k1}, rng, dtype);
  b.inputs["r"] = random_tensor({t, h}, rng, dtype, -2.0f, 2.0f);
  std::vector<ir::ValueId> o_in = {x, g.add_weight("wo", random_tensor({h, k1}, rng, dtype, -0.1f, 0.1f))};
  if (bias) o_in.push_back(g.add_weight("bo", random_tensor({h}, rng, dtype)));
  ir::ValueId o = g.add("Linear", o_in, {}, "o_proj");
  std::vector<ir::ValueId> n_in = {o, r, g.add_weight("gamma", random_tensor({h}, rng, "f32", 0.5f, 1.5f))};
  if (!rms && bias) n_in.push_back(g.add_weight("beta", random_tensor({h}, rng, "f32")));
  auto sn = g.add_node(rms ? "AddRMSNorm" : "AddLayerNorm", n_in, {{"eps", 1e-5}}, "post_norm");
  std::vector<ir::ValueId> z_in = {sn[1], g.add_weight("wz", random_tensor({n_out, h}, rng, dtype, -0.05f, 0.05f))};
  if (bias) z_in.push_back(g.add_weight("bz", random_tensor({n_out}, rng, dtype)));
  std::map<std::string, ir::Attr> attrs;
  if (!act.empty()) attrs["activation"] = act;
  g.add_output("sum", sn[0]);
  g.add_output("z", g.add("Linear", z_in, attrs, "up_proj"));
  b.fused = g;
  auto pass = passes::make_fuse_norm_linear_pass();
  EXPECT_TRUE(pass->run(b.fused));
  EXPECT_EQ(pass->stats(), "folded 1 norms into 1 Linear prologues and 1 residual adds into Linear epilogues");
  return b;
}

StepInfo one_sequence(int64_t t) {
  StepInfo step;
  step.slot_mapping.assign(size_t(t), -1);
  step.seqs.push_back({0, int32_t(t), int32_t(t), {}});
  return step;
}

// max|got - want| <= tol * max|want| for every output of `want`.
void expect_close(const TensorMap& got, const TensorMap& want, double tol, const std::string& what) {
  for (auto& [name, ref] : want) {
    ASSERT_TRUE(got.count(name)) << what << ": output " << name << " missing";
    Diff d = diff(got.at(name), ref);
    std::printf("  %-58s %-4s max|err| %.3g  max|ref| %.3g  rel %.3g\n", what.c_str(), name.c_str(), d.max_err,
                d.max_ref, d.rel());
    EXPECT_LE(d.rel(), tol) << what << " output " << name;
  }
}

// Fused on CUDA vs unfused on the CPU (f32) and vs unfused on CUDA (same storage).
void check_block(const Block& b, const std::string& weight_dtype, double tol, const std::string& what, int64_t t) {
  const StepInfo step = one_sequence(t);
  auto cpu = create_backend("cpu");
  auto gpu = create_backend("cuda");
  const bool quant = weight_dtype == "q8" || weight_dtype == "q4";
  // Run outputs are views into their compiled graph's buffers: each graph outlives its
  // outputs' use (cloned before the graph goes).
  auto run_cloned = [&](Backend& be, const ir::Graph& g, const std::string& wd) {
    auto compiled = be.compile(g, {.weight_dtype = wd});
    TensorMap out = compiled->run(b.inputs, step, nullptr);
    for (auto& [name, v] : out) out[name] = v.clone();
    return out;
  };
  const TensorMap ref = run_cloned(*cpu, b.unfused, quant ? weight_dtype : "f32");
  const TensorMap got = run_cloned(*gpu, b.fused, weight_dtype);
  expect_close(got, ref, tol, what + " vs cpu");
  const TensorMap unfused = run_cloned(*gpu, b.unfused, weight_dtype);
  expect_close(got, unfused, tol, what + " vs cuda unfused");
}

TEST(CudaPrenorm, FusedLinearsMatchTheUnfusedNormAndAdd) {
  KILN_SKIP_WITHOUT_CUDA();
  int i = 0;
  for (const auto& dt : all_dtypes())
    for (bool rms : {true, false})
      for (int64_t t : {1, 2, 3, 4, 5, 8, 33}) {
        ++i;
        const bool bias = i % 2 == 0;
        // No epilogue (a qkv projection), or the family's (gate|up SwiGLU, GPT-2's GELU).
        const std::string act = i % 3 == 0 ? "" : rms ? "swiglu" : "gelu_tanh";
        // 2048: split-K GEMV rows, the norm prologue in shared memory up to 4 rows x 2048.
        // 8192: rows too long for that shared memory beyond 2 rows: norm into scratch.
        const int64_t h = i % 5 == 0 ? 8192 : i % 2 ? 2048 : 256;
        Block b = make_block(dt, rms, bias, act, t, h, uint64_t(i));
        check_block(b, dt, 2 * op_tolerance(dt),
                    str_cat(rms ? "rms" : "layer", bias ? "+bias" : "", act.empty() ? "" : "+" + act, " t=", t,
                            " h=", h, " ", dt),
                    t);
      }
}

// A Linear pinned to q8 (the pass is off for quantized models, but a pin may quantize
// one fused Linear): the norm runs into scratch, the residual is one add.
TEST(CudaPrenorm, QuantizedLinearsTakeTheFusedFormToo) {
  KILN_SKIP_WITHOUT_CUDA();
  for (int64_t t : {1, 9}) {
    Block b = make_block("bf16", true, true, "", t, 256, 100 + uint64_t(t));
    check_block(b, "q8", 3e-2, str_cat("q8 rms+bias t=", t), t);
  }
}

// The CUDA backend asks for the pass only with KILN_CUDA_PRENORM=1 (measured slower by
// default); it always supports the fused form.
TEST(CudaPrenorm, TheBackendAsksForThePassUnlessTurnedOff) {
  auto gpu = create_backend("cuda");
  EXPECT_TRUE(gpu->supports_fusion("fuse_norm_linear"));
  const char* e = std::getenv("KILN_CUDA_PRENORM");
  EXPECT_EQ(gpu->wants_fusion("fuse_norm_linear"), e && std::string(e) == "1");
}

}  // namespace
}  // namespace kiln::cuda
