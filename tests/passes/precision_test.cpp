// assign_precision on a small graph built in code: GEMMs take the requested precision,
// the logits GEMM and norm/softmax nodes stay f32, pins (globs, last match wins)
// override, a pin that matches nothing or names a bad precision is a clear error, and
// the pass runs only when a precision is asked for.
#include <gtest/gtest.h>

#include "pass_test_util.h"
#include "passes/pass.h"
#include "passes/pass_manager.h"

namespace kiln {
namespace {

using testing::random_tensor;

// Two blocks of Linear -> LayerNorm, then an LM head writing "logits".
ir::Graph two_layers() {
  ir::Graph g;
  ir::ValueId x = g.add_input("x", DType::kF32, {"T", 16});
  for (int l = 0; l < 2; ++l) {
    std::string n = "layers." + std::to_string(l) + ".";
    x = g.add("Linear", {x, g.add_weight(n + "w", random_tensor({16, 16}, uint32_t(l)))}, {}, n + "proj");
    x = g.add("LayerNorm", {x, g.add_weight(n + "ln", random_tensor({16}, 9, 0.1f, 1))}, {{"eps", 1e-5}}, n + "norm");
  }
  g.add_output("hidden", x);
  g.add_output("logits", g.add("Linear", {x, g.add_weight("head", random_tensor({32, 16}, 5))}, {}, "lm_head"));
  return g;
}

std::map<std::string, std::string> precisions(const ir::Graph& g) {
  std::map<std::string, std::string> m;
  for (auto& n : g.nodes()) m[n.name] = n.attr_str("precision", "-");
  return m;
}

TEST(AssignPrecision, GemmsTakeThePrecisionSensitiveNodesStayF32) {
  ir::Graph g = two_layers();
  auto pass = passes::make_assign_precision_pass("bf16", {});
  EXPECT_TRUE(pass->run(g));
  auto p = precisions(g);
  EXPECT_EQ(p["layers.0.proj"], "bf16");
  EXPECT_EQ(p["layers.1.proj"], "bf16");
  EXPECT_EQ(p["lm_head"], "f32") << "the logits GEMM stays f32";
  EXPECT_EQ(p["layers.0.norm"], "f32");
  EXPECT_EQ(pass->stats(), "GEMM weights 2 bf16, 1 f32; 2 norm/softmax/pool nodes kept f32");
  EXPECT_FALSE(pass->run(g)) << "a second run changes nothing";
}

TEST(AssignPrecision, PinsOverrideAndTheLastMatchWins) {
  ir::Graph g = two_layers();
  auto pins = passes::parse_precision_pins("lm_head=bf16,layers.*=f16,layers.1.*=f32");
  ASSERT_EQ(pins.size(), 3u);
  passes::make_assign_precision_pass("bf16", pins)->run(g);
  auto p = precisions(g);
  EXPECT_EQ(p["lm_head"], "bf16");
  EXPECT_EQ(p["layers.0.proj"], "f16");
  EXPECT_EQ(p["layers.1.proj"], "f32");
  EXPECT_EQ(p["layers.1.norm"], "f32") << "pins never lower a norm";
}

TEST(AssignPrecision, BadPinsAreClearErrors) {
  ir::Graph g = two_layers();
  try {
    passes::make_assign_precision_pass("bf16", passes::parse_precision_pins("decoder.*=f32"))->run(g);
    FAIL() << "a pin matching nothing was accepted";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("'decoder.*=f32' matches no GEMM"), std::string::npos) << msg;
    EXPECT_NE(msg.find("layers.0.proj"), std::string::npos) << msg;
  }
  EXPECT_THROW(passes::parse_precision_pins("lm_head=fp8"), Error);
  EXPECT_THROW(passes::parse_precision_pins("lm_head"), Error);
  EXPECT_THROW(passes::make_assign_precision_pass("int3", {})->run(g), Error);
}

TEST(AssignPrecision, GlobMatching) {
  EXPECT_TRUE(passes::glob_match("layers.0.*", "layers.0.qkv_proj"));
  EXPECT_FALSE(passes::glob_match("layers.0.*", "layers.10.qkv_proj"));
  EXPECT_TRUE(passes::glob_match("*.down_proj", "layers.3.down_proj"));
  EXPECT_TRUE(passes::glob_match("layers.?.o_proj", "layers.7.o_proj"));
  EXPECT_TRUE(passes::glob_match("*", ""));
  EXPECT_FALSE(passes::glob_match("lm_head", "lm_head2"));
}

TEST(AssignPrecision, RunsOnlyWhenAPrecisionIsAsked) {
  ir::Graph g = two_layers();
  auto names = passes::pass_list({2, {}});
  EXPECT_EQ(std::find(names.begin(), names.end(), "assign_precision"), names.end());
  auto report = passes::run_passes(g, {0, {}, "f16", {}});
  ASSERT_EQ(report.size(), 1u) << "runs at opt level 0 too";
  EXPECT_EQ(report[0].name, "assign_precision");
  EXPECT_EQ(precisions(g)["layers.0.proj"], "f16");
  EXPECT_TRUE(passes::run_passes(g, {0, {"assign_precision"}, "f16", {}}).empty());
}

}  // namespace
}  // namespace kiln
