// Tensor parallelism of quantized models (--tp N with --quant; docs/tensor_parallel.md):
// the model is calibrated, smoothed and quantized unsharded, then sharded. For the tiny
// golden decoders at TP=2 and 4, W8A8 (static scales; per-token with the row-parallel
// Linears kept float), FP8 and weight-only q4/q8 (AWQ, GPTQ) give the unsharded quantized
// model's logits within kLogitBound and its greedy tokens; the shards carry the unsharded
// scales (W8A8 weight_amax, FP8 weight_scale, q4 row factors) and split the smoothing;
// the refusals (per-token or rotated row-parallel inputs, cut q4 groups, a backend that
// does not read weight_amax) name the Linear.
#include <gtest/gtest.h>

#include <cmath>

#include "../models/golden_util.h"
#include "backends/cpu/kernels/kernels.h"
#include "core/fp8.h"
#include "core/status.h"
#include "core/weight_quant.h"
#include "parallel/tensor_parallel.h"
#include "runtime/llm_runner.h"
#include "runtime/quantize.h"

namespace kiln {
namespace {

// Every rank rounds exactly as the unsharded model (the same int8/E4M3/q4 codes and
// scales), so the only difference is f32 summation order: each rank's partial sum of a
// row-parallel Linear is dequantized and the all-reduce adds the partials (a few ulps of
// each output; W8A8's exact int32 partials times one scale usually add to the same
// float), and the FP8 / float GEMMs accumulate K in slices. That moves the residual
// stream by ~1e-7 relative; a later static int8 code can flip where a value sits that
// close to a rounding boundary, which costs one code step of that Linear's output. Logits
// of these models are O(1): 2e-4 absolute leaves room for a rare flip but not for a wrong
// scale (a slice's own weight scales move them by 2e-3 or more: WrongScalesAreCaught).
constexpr double kLogitBound = 2e-4;
// Weight-only q4/q8 on a CPU with AVX-512 VNNI: the GEMV rounds each group of 32
// activations to two int8 digits at run time (steps of max|x| / 127 / 254), on every
// Linear, so the ~1e-7 perturbation above moves some code by a step in nearly every layer
// and the steps compound (measured up to 1.7e-3 on these models, 0.2 with one digit:
// KILN_CPU_QGEMV=int8). The sharding itself is checked with f32 activations
// (KILN_CPU_QGEMV=f32: kLogitBound); the default kernels must give the same greedy tokens
// and logits within this.
constexpr double kRoundedActsLogitBound = 1e-2;

struct QuantCase {
  std::string mode;          // --quant
  std::string weight_dtype;  // --weight-dtype (awq/gptq: q4 or q8)
  std::string act_scale = "static";
  std::vector<std::string> keep;
};

std::string label(const QuantCase& c) {
  return c.mode + (c.weight_dtype.empty() ? "" : "-" + c.weight_dtype) +
         (c.act_scale == "static" ? "" : "-per-token");
}

QuantOptions quant_options(const QuantCase& c) {
  QuantOptions q;
  q.mode = c.mode;
  q.method = "max";
  q.act_scale = c.act_scale;
  q.keep = c.keep;
  return q;
}

ModelOptions base_options(const QuantCase& c) {
  ModelOptions mo;
  if (!c.weight_dtype.empty()) mo.weight_dtype = c.weight_dtype;
  return mo;
}

// The calibration of the unsharded f32 model on random token sequences (the fixtures have
// no tokenizer).
quant::CalibrationTable calibrate(const std::string& path, const QuantCase& c) {
  static const auto seqs = [] {
    std::mt19937_64 rng(7);
    std::vector<std::vector<int32_t>> s(4);
    for (auto& q : s)
      for (int i = 0; i < 24; ++i) q.push_back(int32_t(3 + rng() % 500));
    return s;
  }();
  const QuantOptions q = quant_options(c);
  const ModelOptions base = base_options(c);
  if (c.mode == "awq")
    return calibrate_awq(path, base, q, awq_weight_format(base.weight_dtype), &seqs);
  if (gptq_mode(c.mode))
    return calibrate_gptq(path, base, q, awq_weight_format(base.weight_dtype), &seqs);
  return calibrate_model(path, base, q, &seqs);
}

std::unique_ptr<Model> load_quantized(const std::string& path, const QuantCase& c,
                                      const quant::CalibrationTable& t, int world) {
  ModelOptions mo = quant_model_options(base_options(c), t, quant_options(c));
  mo.tensor_parallel = world;
  return Model::load(path, mo);
}

// Teacher-forced logits of every position of every prompt, one sequence at a time.
std::vector<float> logits_of(Model& m, const std::vector<std::vector<int32_t>>& prompts) {
  std::vector<float> out;
  for (auto& p : prompts) {
    LlmRunner runner(m, {.max_total_tokens = int64_t(p.size()) + 16});
    runner.add_sequence(p);
    while (runner.has_pending())
      for (auto& o : runner.step(true)) out.insert(out.end(), o.logits.begin(), o.logits.end());
  }
  return out;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    d = std::max(d, std::fabs(double(a[i]) - double(b[i])));
  return d;
}

class TpQuant : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(TpQuant, ShardsGiveTheUnshardedQuantizedModel) {
  const auto [name, mode_index] = GetParam();
  const std::vector<QuantCase> cases = {
      {"w8a8", ""},
      {"fp8", ""},
      {"awq", "q4"},
      {"gptq", "q8"},
      {"w8a8", "", "per-token", {"o_proj", "down_proj", "c_proj"}},
  };
  const QuantCase& c = cases[size_t(mode_index)];
  const std::string path = testing::fixture_dir(name);
  const auto table = calibrate(path, c);
  auto prompts = testing::Reference(name).prompts();
  auto full = load_quantized(path, c, table, 1);
  const auto want = logits_of(*full, prompts);
  const auto want_ids = LlmRunner(*full).generate_greedy(prompts, 16);
  // q4/q8 groups of 32: the o_proj's 64 input channels split over 2 ranks only.
  const std::vector<int> worlds =
      c.mode == "awq" || c.mode == "gptq" ? std::vector<int>{2} : std::vector<int>{2, 4};
  const bool weight_only = c.mode == "awq" || c.mode == "gptq";
  for (int world : worlds) {
    const std::string what = name + " " + label(c) + " TP=" + std::to_string(world);
    auto tp = load_quantized(path, c, table, world);
    ASSERT_EQ(tp->tp_world(), world) << what;
    const double d = max_abs_diff(logits_of(*tp, prompts), want);
    EXPECT_LE(d, weight_only ? kRoundedActsLogitBound : kLogitBound)
        << what << ": teacher-forced logits";
    EXPECT_EQ(LlmRunner(*tp).generate_greedy(prompts, 16), want_ids) << what << ": greedy tokens";
    if (weight_only) {
      const cpu::QGemvActs acts = cpu::cpu_qgemv_acts();
      cpu::cpu_qgemv_acts_set(cpu::QGemvActs::kF32);
      const double exact = max_abs_diff(logits_of(*tp, prompts), logits_of(*full, prompts));
      cpu::cpu_qgemv_acts_set(acts);
      EXPECT_LE(exact, kLogitBound) << what << ": teacher-forced logits, f32 activations";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, TpQuant,
                         ::testing::Combine(::testing::Values("gpt2", "llama", "qwen2"),
                                            ::testing::Range(0, 5)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" +
                                  std::to_string(std::get<1>(info.param));
                         });

// The unsharded model's optimized, quantized graph (what --tp 1 runs).
BuiltModel quantized_graph(const std::string& name, const QuantCase& c) {
  const std::string path = testing::fixture_dir(name);
  auto m = load_quantized(path, c, calibrate(path, c), 1);
  return {m->graph(), m->info()};
}

const ir::Node* node_named(const ir::Graph& g, const std::string& name) {
  for (const ir::Node& n : g.nodes())
    if (n.name == name) return &n;
  return nullptr;
}

std::vector<float> f32_values(const Tensor& t) {
  Tensor f = t.dtype() == DType::kF32 ? t : t.to(DType::kF32);
  return {f.data_as<float>(), f.data_as<float>() + f.numel()};
}

TEST(TpQuantShards, RowParallelW8A8KeepsTheUnshardedRowScalesAndSplitsTheSmoothing) {
  const BuiltModel full = quantized_graph("llama", {"w8a8", ""});
  const ir::Node* down = node_named(full.graph, "layers.0.down_proj");
  ASSERT_NE(down, nullptr);
  ASSERT_EQ(down->attr_str("quant"), "w8a8");
  const Tensor& w = full.graph.weight(down->inputs[1]);
  const int64_t n = w.dim(0), k = w.dim(1);
  const std::vector<float> wf = f32_values(w);
  // The smoothing of the down projection's input is a Mul (its producer is no norm).
  const ir::Node* smooth =
      full.graph.nodes()[size_t(full.graph.value(down->inputs[0]).producer)].op == "Mul"
          ? &full.graph.nodes()[size_t(full.graph.value(down->inputs[0]).producer)]
          : nullptr;
  ASSERT_NE(smooth, nullptr) << "expected a SmoothQuant Mul before the down projection";
  const std::vector<float> inv = f32_values(full.graph.weight(smooth->inputs[1]));
  for (int r = 0; r < 2; ++r) {
    const BuiltModel shard = shard_tensor_parallel(full, r, 2, {"w8a8"});
    const ir::Node* d = node_named(shard.graph, "layers.0.down_proj");
    ASSERT_NE(d, nullptr);
    const auto& amax = std::get<std::vector<double>>(d->attrs.at("weight_amax"));
    ASSERT_EQ(int64_t(amax.size()), n);
    for (int64_t row = 0; row < n; ++row) {
      float m = 0;
      for (int64_t j = 0; j < k; ++j) m = std::fmax(m, std::fabs(wf[size_t(row * k + j)]));
      EXPECT_EQ(amax[size_t(row)], double(m)) << "rank " << r << " row " << row;
    }
    EXPECT_EQ(shard.graph.weight(d->inputs[1]).dim(1), k / 2);
    EXPECT_EQ(d->attr_float("act_amax"), down->attr_float("act_amax"))
        << "the unsharded static clip";
    const ir::Node& sm = shard.graph.nodes()[size_t(shard.graph.value(d->inputs[0]).producer)];
    ASSERT_EQ(sm.op, "Mul");
    const std::vector<float> part = f32_values(shard.graph.weight(sm.inputs[1]));
    EXPECT_EQ(part, std::vector<float>(inv.begin() + r * k / 2, inv.begin() + (r + 1) * k / 2));
    // The column-parallel gate|up rows keep their own rows whole: no weight_amax.
    EXPECT_FALSE(node_named(shard.graph, "layers.0.gate_up_proj")->has_attr("weight_amax"));
  }
}

TEST(TpQuantShards, Fp8SplitsTheUnshardedCodesUnderTheUnshardedScale) {
  const BuiltModel full = quantized_graph("llama", {"fp8", ""});  // K/V heads split, not replicated
  for (const char* name :
       {"layers.0.qkv_proj", "layers.0.o_proj", "layers.0.gate_up_proj", "layers.0.down_proj"}) {
    const ir::Node* n = node_named(full.graph, name);
    ASSERT_NE(n, nullptr) << name;
    ASSERT_EQ(n->attr_str("quant"), "fp8") << name;
    const std::vector<float> wf = f32_values(full.graph.weight(n->inputs[1]));
    std::vector<uint8_t> codes(wf.size());
    const double scale = fp8_quantize_tensor(wf.data(), wf.size(), codes.data()).scale;
    size_t bytes = 0;
    for (int r = 0; r < 2; ++r) {
      const BuiltModel shard = shard_tensor_parallel(full, r, 2, {"fp8"});
      const ir::Node* s = node_named(shard.graph, name);
      ASSERT_NE(s, nullptr) << name;
      EXPECT_EQ(s->attr_float("weight_scale"), scale) << name << " rank " << r;
      const Tensor& sw = shard.graph.weight(s->inputs[1]);
      EXPECT_EQ(sw.dtype(), DType::kFP8E4M3) << name;
      bytes += sw.nbytes();
    }
    EXPECT_EQ(bytes, codes.size()) << name << ": the ranks' codes add up to the tensor";
  }
}

TEST(TpQuantShards, RowParallelQ4SplitsTheUnshardedRowImageByGroups) {
  const BuiltModel full = quantized_graph("llama", {"awq", "q4"});
  const ir::Node* o = node_named(full.graph, "layers.0.o_proj");
  ASSERT_NE(o, nullptr);
  const std::vector<float> wf = f32_values(full.graph.weight(o->inputs[1]));
  const int64_t n = full.graph.weight(o->inputs[1]).dim(0),
                k = full.graph.weight(o->inputs[1]).dim(1);
  const QuantizedRows q = quantize_rows(wf.data(), n, k, QuantFormat::kQ4);
  std::vector<float> want(size_t(n * k));
  dequantize_rows(q, 0, n, want.data());
  for (int r = 0; r < 2; ++r) {
    const BuiltModel shard = shard_tensor_parallel(full, r, 2, {"q4"});
    const ir::Node* s = node_named(shard.graph, "layers.0.o_proj");
    ASSERT_EQ(s->attr_str("weight_quant"), "q4");
    ASSERT_EQ(s->attr_int("weight_k"), k / 2);
    const Tensor& img = shard.graph.weight(s->inputs[1]);
    const QuantizedRows part =
        quant_rows_from_image(img.data_as<uint8_t>(), n, k / 2, QuantFormat::kQ4);
    std::vector<float> got(size_t(n * k / 2));
    dequantize_rows(part, 0, n, got.data());
    for (int64_t row = 0; row < n; ++row)
      for (int64_t j = 0; j < k / 2; ++j)
        ASSERT_EQ(got[size_t(row * k / 2 + j)], want[size_t(row * k + r * k / 2 + j)])
            << "rank " << r << " row " << row;
  }
}

// A backend that hands everything to the CPU backend (which implements weight_amax) but
// answers supports_w8a8_weight_amax() false unless a test's subclass says otherwise.
class CpuForwarding : public Backend {
 public:
  CpuForwarding() : cpu_(create_backend("cpu")) {}
  bool supports(const ir::Node& n, const ir::Graph& g) const override {
    return cpu_->supports(n, g);
  }
  std::unique_ptr<CompiledGraph> compile(const ir::Graph& g, const CompileOptions& o) override {
    return cpu_->compile(g, o);
  }
  std::unique_ptr<KvStorage> allocate_kv(const KvLayout& l) override {
    return cpu_->allocate_kv(l);
  }
  DeviceMemory memory_info() override { return cpu_->memory_info(); }
  bool supports_fusion(const std::string& p) const override { return cpu_->supports_fusion(p); }
  std::vector<std::shared_ptr<Communicator>> make_communicators(int world, int first) override {
    return cpu_->make_communicators(world, first);
  }

 protected:
  std::unique_ptr<Backend> cpu_;
};

// The bound of ShardsGiveTheUnshardedQuantizedModel is tight enough to see a shard that
// rounds its slice on its own rows' scales (what a backend ignoring weight_amax would do).
TEST(TpQuantShards, WrongScalesAreCaught) {
  const QuantCase c{"w8a8", ""};
  const std::string path = testing::fixture_dir("llama");
  const auto table = calibrate(path, c);
  auto prompts = testing::Reference("llama").prompts();
  const auto want = logits_of(*load_quantized(path, c, table, 1), prompts);
  ModelOptions mo = quant_model_options(base_options(c), table, quant_options(c));
  mo.tensor_parallel = 2;
  // The ranks compile through a backend that erases the attr the sharder adds.
  static int dropped = 0;
  class SliceScaleCpu : public CpuForwarding {
   public:
    explicit SliceScaleCpu(int* dropped) : dropped_(dropped) {}
    std::string name() const override { return "slice-scale cpu"; }
    bool supports_w8a8_weight_amax() const override { return true; }
    std::unique_ptr<CompiledGraph> compile(const ir::Graph& g, const CompileOptions& o) override {
      graphs_.push_back(std::make_unique<ir::Graph>(g));
      for (ir::Node& n : graphs_.back()->nodes()) *dropped_ += int(n.attrs.erase("weight_amax"));
      return cpu_->compile(*graphs_.back(), o);
    }

   private:
    int* dropped_;
    std::vector<std::unique_ptr<ir::Graph>> graphs_;
  };
  dropped = 0;
  // Registered once per process (--gtest_repeat runs the test again).
  static const bool registered =
      (register_backend("slice-scale-cpu",
                        [](int) { return std::make_unique<SliceScaleCpu>(&dropped); }),
       true);
  (void)registered;
  mo.backend = "slice-scale-cpu";
  auto tp = Model::load(path, mo);
  EXPECT_EQ(dropped, 2 * 2 * 2) << "o_proj and down_proj of 2 layers on 2 ranks";
  EXPECT_GT(max_abs_diff(logits_of(*tp, prompts), want), 10 * kLogitBound);
}

std::string load_error(const std::string& name, const QuantCase& c, int world,
                       const std::string& backend = "cpu") {
  const std::string path = testing::fixture_dir(name);
  ModelOptions mo = quant_model_options(base_options(c), calibrate(path, c), quant_options(c));
  mo.tensor_parallel = world;
  mo.backend = backend;
  try {
    Model::load(path, mo);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
    return e.what();
  }
  return "";
}

void expect_has(const std::string& msg, const std::string& want) {
  EXPECT_NE(msg.find(want), std::string::npos) << "'" << msg << "' should say '" << want << "'";
}

TEST(TpQuantErrors, RefusalsNameTheLinearAndTheWayOut) {
  // Per-token scales on a row-parallel Linear: each rank would see its slice's row max.
  std::string e = load_error("llama", {"w8a8", "", "per-token"}, 2);
  expect_has(e, "row-parallel W8A8 Linear 'layers.0.o_proj' uses per-token activation scales");
  expect_has(e, "max of its own 32 of 64 input channels");
  expect_has(e, "--act-scale static");
  // A Hadamard rotation across the split.
  QuantCase had{"w8a8", ""};
  const std::string path = testing::fixture_dir("llama");
  QuantOptions q = quant_options(had);
  q.hadamard = {"down_proj"};
  static const std::vector<std::vector<int32_t>> seqs = {{5, 6, 7, 8, 9, 10, 11, 12},
                                                         {20, 30, 40, 50, 60}};
  ModelOptions mo = quant_model_options({}, calibrate_model(path, {}, q, &seqs), q);
  mo.tensor_parallel = 2;
  try {
    Model::load(path, mo);
    ADD_FAILURE() << "a rotated row-parallel input was sharded";
  } catch (const Error& err) {
    expect_has(err.what(),
               "'layers.0.down_proj' rotates its 128 input channels in Hadamard blocks of 128");
    expect_has(err.what(), "64 channels each");
  }
  // q4 groups of 32 cut by 4 ranks of the o_proj's 64 input channels.
  e = load_error("llama", {"awq", "q4"}, 4);
  expect_has(e, "row-parallel q4 Linear 'layers.0.o_proj' has input width 64 in groups of 32");
  expect_has(e, "(--tp 4)");
  expect_has(e, "16 columns would cut a group");
  // A backend that does not implement weight_amax refuses the W8A8 shards.
  class NoAmaxCpu : public CpuForwarding {
   public:
    std::string name() const override { return "no-amax"; }
  };
  static const bool registered =
      (register_backend("no-amax-cpu", [](int) { return std::make_unique<NoAmaxCpu>(); }), true);
  (void)registered;
  e = load_error("llama", {"w8a8", ""}, 2, "no-amax-cpu");
  expect_has(e,
             "'layers.0.o_proj' is a row-parallel W8A8 Linear whose int8 weight scales are the "
             "unsharded rows'");
  expect_has(e, "the no-amax backend does not implement yet");
  // FP8 shards need nothing of the backend beyond weight_scale.
  EXPECT_EQ(load_error("llama", {"fp8", ""}, 2, "no-amax-cpu"), "");
}

}  // namespace
}  // namespace kiln
