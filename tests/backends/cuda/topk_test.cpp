// TopKLogits conformance: the CUDA kernel against the CPU backend on one-node graphs, in
// f32, f16 and bf16 (inputs rounded to the dtype, so both see the same values): ids and
// values must be identical, log-probs equal up to the summation order of the log-sum-exp
// (both sum in double: |err| <= 1e-6 * max(1, |ref|)). Rows of the serving shape (256 x
// 128256), exact ties at the k-th value, -0/+0, NaN and -inf, k above the row width, k
// up to 1024; and a run asking for some outputs returns only those. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "cuda_test_util.h"

namespace kiln::cuda {
namespace {

using namespace testing;

constexpr float kInf = std::numeric_limits<float>::infinity();

enum class Fill { kNormal, kTies, kSpecial };

Tensor logits_tensor(int64_t rows, int64_t v, Fill fill, const std::string& dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  Tensor t(DType::kF32, {rows, v});
  float* x = t.data_as<float>();
  for (int64_t i = 0; i < rows * v; ++i) {
    x[i] = fill == Fill::kTies ? float(int(rng() % 13) - 6) * 0.5f : dist(rng);
    if (fill == Fill::kSpecial) {
      if (i % 7 == 0) x[i] = -kInf;
      if (i % 11 == 3) x[i] = std::numeric_limits<float>::quiet_NaN();
      if (i % 13 == 5) x[i] = (i / 13) % 2 ? -0.0f : 0.0f;
    }
  }
  if (fill == Fill::kSpecial && rows * v > 20) x[17] = kInf;
  return t.to(storage_dtype(dtype)).to(DType::kF32);
}

struct TopGraph {
  ir::Graph g;
  explicit TopGraph(int64_t v, int64_t k) {
    auto x = g.add_input("logits", DType::kF32, Shape{"R", v});
    auto outs = g.add_node("TopKLogits", {x}, {{"k", k}}, "top");
    g.add_output("values", outs[0]);
    g.add_output("ids", outs[1]);
    g.add_output("logprobs", outs[2]);
  }
};

void check_case(int64_t rows, int64_t v, int64_t k, Fill fill, const std::string& dtype) {
  const std::string what = str_cat("TopKLogits rows=", rows, " v=", v, " k=", k, " fill=", int(fill), " ", dtype);
  SCOPED_TRACE(what);
  TopGraph tg(v, k);
  TensorMap in{{"logits", logits_tensor(rows, v, fill, dtype, uint64_t(rows * 1000 + v + k))}};
  auto cpu = create_backend("cpu")->compile(tg.g, {.weight_dtype = "f32"});
  auto gpu_backend = create_backend("cuda");
  auto gpu = gpu_backend->compile(tg.g, {.weight_dtype = dtype});
  TensorMap want = cpu->run(in, {}, nullptr);
  TensorMap got = gpu->run(in, {}, nullptr);
  ASSERT_EQ(got.at("ids").dtype(), DType::kI32);
  ASSERT_EQ(got.at("ids").shape(), (std::vector<int64_t>{rows, k}));
  const int32_t* gi = got.at("ids").data_as<int32_t>();
  const int32_t* wi = want.at("ids").data_as<int32_t>();
  const float* gv = got.at("values").data_as<float>();
  const float* wv = want.at("values").data_as<float>();
  const float* gl = got.at("logprobs").data_as<float>();
  const float* wl = want.at("logprobs").data_as<float>();
  int64_t bad_ids = 0, bad_values = 0, bad_logprobs = 0;
  double max_lp_err = 0;
  for (int64_t i = 0; i < rows * k; ++i) {
    if (gi[i] != wi[i]) {
      if (bad_ids++ < 5) ADD_FAILURE() << "entry " << i << " (row " << i / k << "): id " << gi[i] << " vs " << wi[i];
      continue;
    }
    bad_values += std::memcmp(&gv[i], &wv[i], 4) != 0 && !(std::isnan(gv[i]) && std::isnan(wv[i]));
    if (std::isnan(wl[i]) || std::isinf(wl[i])) {
      bad_logprobs += !(std::isnan(gl[i]) ? std::isnan(wl[i]) : gl[i] == wl[i]);
    } else {
      const double err = std::fabs(double(gl[i]) - wl[i]);
      max_lp_err = std::max(max_lp_err, err);
      bad_logprobs += err > 1e-6 * std::max(1.0, std::fabs(double(wl[i])));
    }
  }
  std::printf("  %-60s ids %lld bad, values %lld bad, logprobs %lld bad (max|err| %.3g)\n", what.c_str(),
              (long long)bad_ids, (long long)bad_values, (long long)bad_logprobs, max_lp_err);
  EXPECT_EQ(bad_ids, 0);
  EXPECT_EQ(bad_values, 0);
  EXPECT_EQ(bad_logprobs, 0);
}

TEST(CudaTopKLogits, MatchesTheCpuKernel) {
  KILN_SKIP_WITHOUT_CUDA();
  struct S {
    int64_t rows, v, k;
    Fill fill;
  };
  for (const auto& dt : all_dtypes())
    for (S s : {S{1, 128256, 64, Fill::kNormal}, S{5, 50257, 1, Fill::kNormal}, S{3, 1000, 1024, Fill::kNormal},
                S{5, 40, 64, Fill::kNormal}, S{2, 4099, 200, Fill::kNormal}, S{2, 1025, 1024, Fill::kTies},
                S{9, 32000, 64, Fill::kTies}, S{4, 3001, 64, Fill::kSpecial}, S{3, 50, 64, Fill::kSpecial},
                S{1, 1, 64, Fill::kNormal}, S{2, 64, 64, Fill::kTies}, S{2, 65, 64, Fill::kTies}})
      check_case(s.rows, s.v, s.k, s.fill, dt);
}

TEST(CudaTopKLogits, ServingShape) {
  KILN_SKIP_WITHOUT_CUDA();
  check_case(256, 128256, 64, Fill::kNormal, "bf16");
  check_case(256, 128256, 64, Fill::kTies, "bf16");
}

TEST(CudaTopKLogits, ARunReturnsOnlyTheOutputsAskedFor) {
  KILN_SKIP_WITHOUT_CUDA();
  TopGraph tg(300, 8);
  TensorMap in{{"logits", logits_tensor(3, 300, Fill::kNormal, "bf16", 1)}};
  auto backend = create_backend("cuda");
  auto gpu = backend->compile(tg.g, {.weight_dtype = "bf16"});
  TensorMap all = gpu->run(in, {}, nullptr);
  std::vector<int32_t> ids(all.at("ids").data_as<int32_t>(), all.at("ids").data_as<int32_t>() + 24);
  TensorMap some = gpu->run(in, {}, nullptr, {"ids"});
  ASSERT_EQ(some.size(), 1u);
  EXPECT_EQ(std::vector<int32_t>(some.at("ids").data_as<int32_t>(), some.at("ids").data_as<int32_t>() + 24), ids);
  EXPECT_THROW(gpu->run(in, {}, nullptr, {"nope"}), Error);
}

}  // namespace
}  // namespace kiln::cuda
