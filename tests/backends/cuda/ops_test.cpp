// Op conformance (ggml's test-backend-ops model): every CUDA op except Attention (see
// attention_test.cpp) against the CPU backend on random inputs over a table of shapes,
// in f32, f16 and bf16, each graph one node. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "backends/cuda/ops/gemv.h"
#include "cuda_test_util.h"

namespace kiln::cuda {
namespace {

using namespace testing;

// Builds a one-node graph: float inputs named x0, x1... of [T, width], weights as given.
struct OneNode {
  ir::Graph g;
  TensorMap inputs;
  std::vector<ir::ValueId> args;
  void input(const std::string& name, Tensor t, Shape shape) {
    args.push_back(g.add_input(name, t.dtype(), std::move(shape)));
    inputs[name] = std::move(t);
  }
  void weight(const std::string& name, Tensor t) { args.push_back(g.add_weight(name, std::move(t))); }
  void none() { args.push_back(ir::kNoValue); }
  void node(const std::string& op, std::map<std::string, ir::Attr> attrs = {}) {
    g.add_output("y", g.add(op, args, std::move(attrs), "op"));
  }
  void check(const std::string& dtype, const std::string& what, StepInfo step = {}) {
    expect_backends_match(g, {{inputs, std::move(step)}}, dtype, op_tolerance(dtype), what);
  }
};

TEST(CudaOps, Linear) {
  KILN_SKIP_WITHOUT_CUDA();
  struct S { int64_t t, k, n; bool bias; };
  for (const auto& dt : all_dtypes())
    for (S s : {S{1, 64, 64, false}, S{7, 64, 96, true}, S{33, 576, 1536, false}, S{1, 576, 192, true},
                S{128, 1024, 4096, true}, S{5, 4096, 512, false}, S{2, 2048, 1000, true},
                S{3, 5632, 72, false}, S{4, 264, 4097, true}, S{1, 100, 30, false}}) {
      std::mt19937_64 rng(s.t * 131 + s.k + s.n);
      OneNode o;
      o.input("x", random_tensor({s.t, s.k}, rng, dt), Shape{"T", s.k});
      o.weight("w", random_tensor({s.n, s.k}, rng, dt, -0.1f, 0.1f));
      if (s.bias) o.weight("b", random_tensor({s.n}, rng, dt));
      o.node("Linear");
      o.check(dt, str_cat("Linear t=", s.t, " k=", s.k, " n=", s.n, s.bias ? " +bias" : ""));
    }
}

// Linear{activation} (pass fuse_linear_activation): inside the GEMV for few rows, an
// elementwise pass after cuBLASLt otherwise (t = 9).
TEST(CudaOps, LinearActivationEpilogues) {
  KILN_SKIP_WITHOUT_CUDA();
  for (const auto& dt : all_dtypes())
    for (const char* act : {"gelu_erf", "gelu_tanh", "silu", "swiglu"})
      for (int64_t t : {1, 3, 4, 9}) {
        std::mt19937_64 rng(uint64_t(t) * 7 + dt.size());
        OneNode o;
        o.input("x", random_tensor({t, 256}, rng, dt), Shape{"T", 256});
        o.weight("w", random_tensor({320, 256}, rng, dt, -0.2f, 0.2f));
        o.weight("b", random_tensor({320}, rng, dt));
        o.node("Linear", {{"activation", std::string(act)}});
        o.check(dt, str_cat("Linear+", act, " t=", t));
      }
}

TEST(CudaOps, Norms) {
  KILN_SKIP_WITHOUT_CUDA();
  for (const auto& dt : all_dtypes())
    for (int64_t rows : {1, 17, 65, 2051})  // 65, 2051: the prefill shape (several rows a block, one idle)
      for (int64_t dim : {64, 100, 576, 4096, 12008}) {  // register-held rows of 1, 2, 4 vectors/thread; 100: bf16 fallback
        if (rows == 2051 && dim != 576 && dim != 4096) continue;  // keeps the CPU reference's time down
        std::mt19937_64 rng(rows * 7 + dim);
        for (int which = 0; which < 3; ++which) {
          OneNode o;
          o.input("x", random_tensor({rows, dim}, rng, dt, -3.0f, 3.0f), Shape{"T", dim});
          o.weight("w", random_tensor({dim}, rng, "f32", 0.5f, 1.5f));
          if (which == 0) o.weight("b", random_tensor({dim}, rng, "f32"));
          if (which == 2) o.node("RMSNorm", {{"eps", 1e-6}});
          else o.node("LayerNorm", {{"eps", 1e-5}});
          o.check(dt, str_cat(which == 2 ? "RMSNorm" : which == 0 ? "LayerNorm+bias" : "LayerNorm", " rows=", rows,
                              " dim=", dim));
        }
      }
}

// HeadRMSNorm (Qwen3's q/k norm): heads of 64 to 256 with one weight for every head, and
// a packed q|k|v row whose first groups heads are normalized with a weight each (a lane's
// values as one vector at 64/128/256 in 16 bits, the per-value loop at 96 and 80; the
// tail of 2 heads is one copy warp's share at 64/80/96/128, two at 256).
TEST(CudaOps, HeadRmsNorm) {
  KILN_SKIP_WITHOUT_CUDA();
  for (const auto& dt : all_dtypes())
    for (int64_t rows : {1, 37})
      for (int64_t d : {64, 80, 96, 128, 256})
        for (bool packed : {false, true}) {
          std::mt19937_64 rng(uint64_t(rows * 5 + d + packed));
          const int64_t groups = packed ? 6 : 8, width = 8 * d;  // packed: 4 q + 2 k heads, then 2 v
          OneNode o;
          o.input("x", random_tensor({rows, width}, rng, dt, -3.0f, 3.0f), Shape{"T", width});
          o.weight("w", random_tensor({packed ? groups * d : d}, rng, "f32", 0.5f, 1.5f));
          std::map<std::string, ir::Attr> attrs{{"eps", 1e-6}, {"head_dim", d}};
          if (packed) attrs["groups"] = groups;
          o.node("HeadRMSNorm", attrs);
          o.check(dt, str_cat("HeadRMSNorm rows=", rows, " d=", d, packed ? " packed" : ""));
        }
}

// The fused ops the CUDA backend claims (fuse_add_norm, fuse_swiglu): both outputs of
// AddRMSNorm/AddLayerNorm, SwiGLU and GeGLU against the CPU backend.
TEST(CudaOps, FusedAddNormAndSwiGlu) {
  KILN_SKIP_WITHOUT_CUDA();
  for (const auto& dt : all_dtypes())
    for (int64_t rows : {1, 9, 300})  // 300: the prefill shape
      for (int64_t dim : {64, 100, 576, 768, 8200}) {
        if (rows == 300 && dim != 768 && dim != 8200) continue;
        std::mt19937_64 rng(rows * 11 + dim);
        for (const char* op : {"AddRMSNorm", "AddLayerNorm"}) {
          OneNode o;
          o.input("x", random_tensor({rows, dim}, rng, dt, -3.0f, 3.0f), Shape{"T", dim});
          o.input("r", random_tensor({rows, dim}, rng, dt, -3.0f, 3.0f), Shape{"T", dim});
          o.weight("w", random_tensor({dim}, rng, "f32", 0.5f, 1.5f));
          if (std::string(op) == "AddLayerNorm") o.weight("b", random_tensor({dim}, rng, "f32"));
          auto outs = o.g.add_node(op, o.args, {{"eps", 1e-5}}, "op");
          o.g.add_output("sum", outs[0]);
          o.g.add_output("y", outs[1]);
          o.check(dt, str_cat(op, " rows=", rows, " dim=", dim));
        }
        for (const char* op : {"SwiGLU", "GeGLU"}) {
          OneNode s;
          s.input("x", random_tensor({rows, 2 * dim}, rng, dt, -6.0f, 6.0f), Shape{"T", 2 * dim});
          s.node(op);
          s.check(dt, str_cat(op, " rows=", rows, " inter=", dim));
        }
      }
}

TEST(CudaOps, AddMulSameShapeAndRowBroadcast) {
  KILN_SKIP_WITHOUT_CUDA();
  for (const auto& dt : all_dtypes())
    for (const char* op : {"Add", "Mul"})
      for (int mode = 0; mode < 3; ++mode) {  // same shape, row input, row weight
        std::mt19937_64 rng(mode * 3 + op[0]);
        OneNode o;
        o.input("a", random_tensor({9, 200}, rng, dt, -2, 2), Shape{"T", 200});
        if (mode == 0) o.input("b", random_tensor({9, 200}, rng, dt, -2, 2), Shape{"T", 200});
        if (mode == 1) o.input("b", random_tensor({200}, rng, dt, -2, 2), Shape{200});
        if (mode == 2) o.weight("b", random_tensor({200}, rng, dt, -2, 2));
        o.node(op);
        o.check(dt, str_cat(op, mode == 0 ? " same shape" : mode == 1 ? " row input" : " row weight"));
      }
}

TEST(CudaOps, Activations) {
  KILN_SKIP_WITHOUT_CUDA();
  struct A { const char* op; const char* approx; };
  for (const auto& dt : all_dtypes())
    for (A a : {A{"Gelu", "none"}, A{"Gelu", "tanh"}, A{"Silu", ""}, A{"Tanh", ""}}) {
      std::mt19937_64 rng(a.op[0] + a.approx[0]);
      OneNode o;
      o.input("x", random_tensor({33, 1000}, rng, dt, -8, 8), Shape{"T", 1000});
      std::map<std::string, ir::Attr> attrs;
      if (*a.approx) attrs["approximate"] = std::string(a.approx);
      o.node(a.op, attrs);
      o.check(dt, str_cat(a.op, " ", a.approx));
    }
}

TEST(CudaOps, EmbeddingAndBadIds) {
  KILN_SKIP_WITHOUT_CUDA();
  for (const auto& dt : all_dtypes()) {
    std::mt19937_64 rng(5);
    OneNode o;
    o.weight("table", random_tensor({512, 96}, rng, dt));
    Tensor ids(DType::kI32, {37});
    for (int i = 0; i < 37; ++i) ids.data_as<int32_t>()[i] = int32_t((i * 97 + 3) % 512);
    o.input("ids", ids, Shape{"T"});
    o.node("Embedding");
    o.check(dt, "Embedding vocab=512 dim=96");
  }
  // An out-of-vocabulary id is a kiln::Error, as on the CPU.
  OneNode o;
  o.weight("table", Tensor(DType::kF32, {8, 4}));
  Tensor ids(DType::kI32, {2});
  ids.data_as<int32_t>()[1] = 8;
  o.input("ids", ids, Shape{"T"});
  o.node("Embedding");
  auto gg = create_backend("cuda")->compile(o.g, {.weight_dtype = "bf16"});
  EXPECT_THROW(gg->run(o.inputs, {}, nullptr), Error);
}

TEST(CudaOps, Rope) {
  KILN_SKIP_WITHOUT_CUDA();
  for (const auto& dt : all_dtypes())
    for (int64_t rot : {64, 32}) {
      std::mt19937_64 rng(rot);
      const int64_t heads = 3, hd = 64, t = 29;
      OneNode o;
      o.input("x", random_tensor({t, heads * hd}, rng, dt), Shape{"T", heads * hd});
      Tensor pos(DType::kI32, {t});
      for (int i = 0; i < t; ++i) pos.data_as<int32_t>()[i] = int32_t((i * 523) % 8192);
      o.input("pos", pos, Shape{"T"});
      Tensor inv(DType::kF32, {rot / 2});
      for (int64_t i = 0; i < rot / 2; ++i) inv.data_as<float>()[i] = float(std::pow(10000.0, -2.0 * double(i) / double(rot)));
      o.weight("inv_freq", inv);
      o.node("Rope", {{"num_heads", heads}, {"head_dim", hd}, {"rotary_dim", rot}});
      o.check(dt, str_cat("Rope heads=3 hd=64 rotary=", rot, " pos<8192"));
    }
}

TEST(CudaOps, GatherRowsAndSeqMeanPool) {
  KILN_SKIP_WITHOUT_CUDA();
  for (const auto& dt : all_dtypes()) {
    std::mt19937_64 rng(11);
    {
      OneNode o;
      o.input("x", random_tensor({20, 70}, rng, dt), Shape{"T", 70});
      Tensor rows(DType::kI32, {4});
      for (int i = 0; i < 4; ++i) rows.data_as<int32_t>()[i] = int32_t(19 - 5 * i);
      o.input("rows", rows, Shape{"R"});
      o.node("GatherRows");
      o.check(dt, "GatherRows 4 of 20");
    }
    {
      OneNode o;
      o.input("x", random_tensor({20, 70}, rng, dt), Shape{"T", 70});
      o.node("SeqMeanPool");
      StepInfo step;
      step.seqs = {{0, 3, 3, {}}, {3, 16, 16, {}}, {19, 1, 1, {}}};
      o.check(dt, "SeqMeanPool 3 sequences", step);
    }
    {
      // Rows a multiple of 16 bytes (the kernel's vector loads), two column slices (the
      // second partly used), sequences long enough for its unrolled row loop and its tail.
      OneNode o;
      o.input("x", random_tensor({300, 264}, rng, dt), Shape{"T", 264});
      o.node("SeqMeanPool");
      StepInfo step;
      step.seqs = {{0, 130, 130, {}}, {130, 37, 37, {}}, {167, 1, 1, {}}, {168, 132, 132, {}}};
      o.check(dt, "SeqMeanPool 4 sequences of 264 columns", step);
    }
  }
}

TEST(CudaBackend, UnsupportedOpIsNamed) {
  ir::Graph g;
  ir::ValueId x = g.add_input("x", DType::kF32, Shape{"T", 48});
  g.add_output("y", g.add("Attention", {x, x, x},
                          {{"layer", int64_t(0)}, {"num_heads", int64_t(1)}, {"num_kv_heads", int64_t(1)},
                           {"head_dim", int64_t(48)}, {"scale", 1.0}, {"causal", int64_t(1)}}, "attn"));
  KILN_SKIP_WITHOUT_CUDA();
  auto be = create_backend("cuda");
  EXPECT_FALSE(be->supports(g.nodes()[0], g));
  try {
    be->compile(g, {.weight_dtype = "bf16"});
    FAIL() << "expected kUnsupported";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("Attention"), std::string::npos) << e.what();
  }
}

TEST(CudaBackend, RegisteredWhenBuilt) {
  auto names = available_backends();
  EXPECT_NE(std::find(names.begin(), names.end(), "cuda"), names.end());
  if (cuda_device_count() == 0) {
    // Without a device, asking for the backend works but compiling says why it cannot.
    ir::Graph g;
    g.add_output("y", g.add("Silu", {g.add_input("x", DType::kF32, Shape{"T", 4})}));
    EXPECT_THROW(create_backend("cuda")->compile(g, {}), Error);
  }
}

// KILN_CUDA_GEMV: unset or 1 lets few-row Linears take the GEMV, 0 turns it off, and a
// mistyped value is an error naming the variable (no GPU needed).
TEST(CudaGemv, EnvironmentChoices) {
  unsetenv("KILN_CUDA_GEMV");
  EXPECT_TRUE(gemv_enabled_from_env());
  setenv("KILN_CUDA_GEMV", "1", 1);
  EXPECT_TRUE(gemv_enabled_from_env());
  setenv("KILN_CUDA_GEMV", "0", 1);
  EXPECT_FALSE(gemv_enabled_from_env());
  for (const char* bad : {"fast", "prefetch"}) {
    setenv("KILN_CUDA_GEMV", bad, 1);
    try {
      gemv_enabled_from_env();
      ADD_FAILURE() << "KILN_CUDA_GEMV=" << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("KILN_CUDA_GEMV"), std::string::npos) << e.what();
    }
  }
  unsetenv("KILN_CUDA_GEMV");
}

}  // namespace
}  // namespace kiln::cuda
