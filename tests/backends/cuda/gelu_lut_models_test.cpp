// KILN_CUDA_GELU_LUT at model level: the tiny BERT fixture on the CUDA backend compiled
// with the GELU passes through lookup tables (cuda_gelu_lut.h) and without, bit for bit:
// bf16 and f16 (the GELU after cuBLASLt's GEMM), and W8A8 (the pass after the fused
// CUTLASS GEMM: to bf16 before SmoothQuant's Mul; without smoothing to the down
// projection's int8 codes, static and per token), over a batch (GEMM rows) and one
// 3-token sequence (the GEMV path, no pass). Each compile with the switch on builds
// tables, with it off none. Skips without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "backends/cuda/cuda_gelu_lut.h"
#include "backends/cuda/ops/int8_gemm_sm90.h"
#include "cuda_test_util.h"
#include "runtime/encoder_runner.h"
#include "runtime/quantize.h"

namespace kiln::cuda {
namespace {

using namespace kiln::cuda::testing;

std::vector<std::vector<int32_t>> random_tokens(const std::vector<int>& lens, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> out;
  for (int len : lens) {
    std::vector<int32_t> s;
    for (int i = 0; i < len; ++i) s.push_back(1 + int32_t(rng() % 511));
    out.push_back(s);
  }
  return out;
}

// Every output float of the forwards: hidden states, pooled rows, logits.
std::vector<float> outputs(Model& m, const std::vector<EncoderInput>& batch) {
  std::vector<float> v;
  for (const EncoderOutput& o : encode(m, batch))
    for (const auto* part : {&o.hidden, &o.mean_pooled, &o.pooled, &o.logits}) v.insert(v.end(), part->begin(), part->end());
  return v;
}

size_t differing_floats(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  size_t bad = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) bad += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return bad;
}

// Loads `options` with the switch off and on (read while compiling), and compares.
// `min_tables`: what the switch must build (values, and codes for static passes).
void expect_same_with_and_without_tables(const ModelOptions& options, int64_t min_tables, const std::string& what) {
  const std::string dir = fixtures_dir() + "/models/bert";
  const int64_t before = gelu_lut_tables_built();
  std::unique_ptr<Model> off, on;
  {
    ScopedEnv env("KILN_CUDA_GELU_LUT", "0");
    off = Model::load(dir, options);
  }
  EXPECT_EQ(gelu_lut_tables_built(), before) << what << ": tables built with the switch off";
  {
    ScopedEnv env("KILN_CUDA_GELU_LUT", "1");
    on = Model::load(dir, options);
  }
  const int64_t built = gelu_lut_tables_built() - before;
  std::printf("  %s: %lld GELU tables built\n", what.c_str(), (long long)built);
  EXPECT_GE(built, min_tables) << what << ": too few tables built with the switch on";
  const auto seqs = random_tokens({100, 57, 3, 120}, 5);
  std::vector<EncoderInput> batch, one = {{std::vector<int32_t>(seqs[0].begin(), seqs[0].begin() + 3), {}}};
  for (auto& s : seqs) batch.push_back({s, {}});
  for (const auto* in : {&batch, &one})
    for (int rep = 0; rep < 3; ++rep) {  // eager, captured, replayed
      const auto a = outputs(*on, *in), b = outputs(*off, *in);
      EXPECT_EQ(differing_floats(a, b), 0u) << what << (in == &one ? " (3 tokens)" : " (batch)") << " forward " << rep
                                            << " of " << a.size() << " output values";
    }
}

TEST(CudaGeluLutModel, TinyBertBitIdenticalWithTables) {
  KILN_SKIP_WITHOUT_CUDA();
  for (const char* dtype : {"bf16", "f16"})
    expect_same_with_and_without_tables({.backend = "cuda", .weight_dtype = dtype}, 1, str_cat("tiny bert ", dtype));
}

TEST(CudaGeluLutModel, TinyBertW8a8BitIdenticalWithTables) {
  KILN_SKIP_WITHOUT_CUDA();
  ScopedEnv epilogue("KILN_CUDA_W8A8_ACT_EPILOGUE", "0");  // the GELU in a pass after the GEMM
  ScopedEnv codes("KILN_CUDA_W8A8_CODES_EPILOGUE", "0");   // (static codes too: not from the GEMM)
  std::string why;
  if (!int8_gemm_sm90_available(&why)) GTEST_SKIP() << "the pass follows the fused CUTLASS GEMM only: " << why;
  const std::string dir = fixtures_dir() + "/models/bert";
  const auto calib = random_tokens(std::vector<int>(8, 48), 4);
  struct Variant {
    const char* scales;
    double alpha;  // 0.5: the FFN up's GELU writes bf16 for the Mul; -1: the down projection's codes
  };
  for (const Variant& v : {Variant{"static", 0.5}, Variant{"static", -1.0}, Variant{"per-token", -1.0}}) {
    QuantOptions q;
    q.mode = "w8a8";
    q.method = "kl";
    q.act_scale = v.scales;
    q.smooth_alpha = v.alpha;
    const quant::CalibrationTable table = calibrate_model(dir, {}, q, &calib);
    // Static codes: one codes table per distinct scale of the down projections.
    const int64_t min_tables = std::string(v.scales) == "static" && v.alpha < 0 ? 2 : 1;
    expect_same_with_and_without_tables(w8a8_model_options({.backend = "cuda"}, table, q), min_tables,
                                        str_cat("tiny bert w8a8 ", v.scales, " alpha ", v.alpha));
  }
}

// With the codes epilogue (the default), a W8A8 FFN up whose static codes come from the
// GEMM reads the codes tables the GELU-to-codes pass would read (one per reader scale,
// beside the values table), and builds no other.
TEST(CudaGeluLutModel, CodesEpilogueReadsThePassCodesTables) {
  KILN_SKIP_WITHOUT_CUDA();
  std::string why;
  if (!int8_gemm_sm90_available(&why)) GTEST_SKIP() << "the codes epilogue is the fused CUTLASS GEMM's: " << why;
  const std::string dir = fixtures_dir() + "/models/bert";
  QuantOptions q;
  q.mode = "w8a8";
  q.method = "kl";
  q.act_scale = "static";
  q.smooth_alpha = -1.0;
  const auto calib = random_tokens(std::vector<int>(8, 48), 4);
  const quant::CalibrationTable table = calibrate_model(dir, {}, q, &calib);
  ScopedEnv lut("KILN_CUDA_GELU_LUT", "1");
  auto tables_built = [&](const char* epilogue) {
    ScopedEnv on("KILN_CUDA_W8A8_CODES_EPILOGUE", epilogue);
    const int64_t before = gelu_lut_tables_built();
    auto model = Model::load(dir, w8a8_model_options({.backend = "cuda"}, table, q));
    return gelu_lut_tables_built() - before;
  };
  const int64_t with_pass = tables_built("0"), with_epilogue = tables_built("1");
  EXPECT_GE(with_pass, 2) << "the values table and at least one codes table";
  EXPECT_EQ(with_epilogue, with_pass);
}

}  // namespace
}  // namespace kiln::cuda
