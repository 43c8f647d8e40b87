// TopKLogits conformance: the CUDA kernels against the CPU backend on one-node graphs,
// in f32, f16 and bf16 (inputs rounded to the dtype, so both see the same values): ids
// and values must be identical, log-probs equal up to the log-sum-exp's rounding
// (|err| <= 1e-6 * max(1, |ref|)). Both paths: the split kernels (every chunk size by
// KILN_CUDA_TOPK_CHUNK, short last chunks, k up to 1024, both chunk grids by
// KILN_CUDA_TOPK_GRID, inside a captured CUDA graph) and the one-CTA-per-row kernel
// (rows too short to split, and k too large for the split's merge). Rows of the vocabularies
// served (32000, 50257, 128256) at batch 1, 3, 64 and 256, exact ties at the k-th
// value, -0/+0, NaN and +-inf; a run asking for some outputs returns only those, and a
// step needing fewer candidates (StepInfo::top_k) gets the leading columns.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "backends/cuda/ops/topk.h"
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

// The plan a graph compiled now would make for these shapes (bf16 logits).
TopKPlan plan_for(int64_t rows, int64_t v, int64_t k) {
  return topk_logits_plan(topk_logits_config(DType::kBF16), rows, v, k);
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

TEST(CudaTopKLogits, ServingShapes) {
  KILN_SKIP_WITHOUT_CUDA();
  for (int64_t v : {50257, 128256})
    for (int64_t rows : {1, 3, 64}) {
      EXPECT_TRUE(plan_for(rows, v, 64).split()) << rows << " x " << v;
      check_case(rows, v, 64, Fill::kNormal, "bf16");
      check_case(rows, v, 64, Fill::kTies, "bf16");
      check_case(rows, v, 64, Fill::kSpecial, "bf16");
    }
  check_case(256, 128256, 64, Fill::kNormal, "bf16");
  check_case(256, 128256, 64, Fill::kTies, "bf16");
  for (const auto& dt : all_dtypes()) {
    check_case(1, 32000, 64, Fill::kNormal, dt);
    check_case(3, 50257, 64, Fill::kTies, dt);
    check_case(3, 128256, 64, Fill::kSpecial, dt);
  }
}

// Every chunk size of the split kernels: rows whose last chunk is shorter than k (or
// than 256 threads), k from 1 to 1024 (each chunk keeps min(k, chunk)), ties, specials.
TEST(CudaTopKLogits, EveryChunkSize) {
  KILN_SKIP_WITHOUT_CUDA();
  struct S {
    int64_t rows, v, k;
    Fill fill;
  };
  for (int chunk : {512, 1024, 2048, 4096, 8192}) {
    ScopedEnv env("KILN_CUDA_TOPK_CHUNK", std::to_string(chunk));
    SCOPED_TRACE(str_cat("chunk ", chunk));
    for (S s : {S{3, 4 * chunk + 10, 64, Fill::kNormal}, S{2, 2 * chunk + 300, 64, Fill::kTies},
                S{2, 3 * chunk - 1, 200, Fill::kSpecial}, S{2, 5 * chunk + 1, 1, Fill::kNormal},
                S{2, 2 * chunk + 1, 1024, Fill::kTies}, S{2, 9 * chunk, 1024, Fill::kNormal},
                S{1, 50257, 64, Fill::kTies}}) {
      EXPECT_TRUE(plan_for(s.rows, s.v, s.k).split()) << s.v << " " << s.k;
      check_case(s.rows, s.v, s.k, s.fill, "bf16");
    }
    check_case(3, 4 * chunk + 10, 64, Fill::kNormal, "f32");
    check_case(2, 3 * chunk - 1, 200, Fill::kSpecial, "f32");
    check_case(4, 6 * chunk + 7, 64, Fill::kSpecial, "f16");
    check_case(2, 2 * chunk + 300, 64, Fill::kTies, "f16");
  }
}

// A mistyped chunk size is an error naming the variable and what it takes, not a silent
// default, and it comes when the graph is compiled.
TEST(CudaTopKLogits, BadChunkSwitchIsAClearErrorAtCompile) {
  KILN_SKIP_WITHOUT_CUDA();
  TopGraph tg(128256, 64);
  for (const char* value : {"100", "2k", "16384"}) {
    ScopedEnv env("KILN_CUDA_TOPK_CHUNK", value);
    try {
      (void)create_backend("cuda")->compile(tg.g, {.weight_dtype = "bf16"});
      ADD_FAILURE() << "KILN_CUDA_TOPK_CHUNK=" << value << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("KILN_CUDA_TOPK_CHUNK"), std::string::npos) << e.what();
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    }
  }
}

// The chunk kernel with a CTA per chunk (KILN_CUDA_TOPK_GRID=full) instead of a grid
// that fits the device, each CTA looping over chunks (the default at these batches).
TEST(CudaTopKLogits, ChunkKernelGrids) {
  KILN_SKIP_WITHOUT_CUDA();
  for (std::string grid : {"fit", "full"}) {
    ScopedEnv env("KILN_CUDA_TOPK_GRID", grid);
    SCOPED_TRACE(grid);
    const TopKPlan p = plan_for(64, 128256, 64);
    ASSERT_TRUE(p.split());
    EXPECT_EQ(p.grid < 64 * p.chunks, grid == "fit") << p.grid << " CTAs for " << 64 * p.chunks << " chunks";
    check_case(64, 128256, 64, Fill::kNormal, "bf16");
    check_case(64, 50257, 64, Fill::kTies, "f16");
    check_case(40, 32000, 64, Fill::kSpecial, "f32");
  }
}

// Long rows where the split does not fit (k too large for the chunks' candidates to fit
// one merge): the one-CTA-per-row kernel over a whole vocabulary, with ties at the k-th
// value (its select then runs over index digits too) and specials.
TEST(CudaTopKLogits, OneCtaPerRowKernel) {
  KILN_SKIP_WITHOUT_CUDA();
  EXPECT_FALSE(plan_for(2, 300000, 1024).split());
  check_case(2, 300000, 1024, Fill::kNormal, "bf16");
  check_case(2, 300000, 1024, Fill::kTies, "f16");
  check_case(2, 300000, 1024, Fill::kSpecial, "f32");
  check_case(1, 300000, 1000, Fill::kTies, "bf16");
}

// A graph-able TopKLogits graph: token ids in (its only input, so steps run as CUDA
// graphs), the rows of `table` as logits rows, then TopKLogits of k.
ir::Graph embedding_topk_graph(Tensor table, int64_t k) {
  ir::Graph g;
  auto t = g.add_weight("table", std::move(table));
  auto ids = g.add_input("ids", DType::kI32, Shape{"R"});
  auto logits = g.add_node("Embedding", {t, ids}, {}, "rows")[0];
  auto outs = g.add_node("TopKLogits", {logits}, {{"k", k}}, "top");
  g.add_output("values", outs[0]);
  g.add_output("ids", outs[1]);
  g.add_output("logprobs", outs[2]);
  return g;
}

// The split kernels inside a captured CUDA graph: a bf16 graph whose only input is token
// ids (Embedding rows as logits rows, then TopKLogits) runs eagerly on its first run of a
// shape (sizing the op scratch), is captured on the second and replayed on the third
// (cuda_graph.h); every run gives the CPU's outputs.
TEST(CudaTopKLogits, SplitKernelsInACapturedGraph) {
  KILN_SKIP_WITHOUT_CUDA();
  const int64_t v = 50257, k = 64;
  const ir::Graph g = embedding_topk_graph(logits_tensor(8, v, Fill::kNormal, "bf16", 3), k);
  Tensor rows(DType::kI32, {5});
  for (int i = 0; i < 5; ++i) rows.data_as<int32_t>()[i] = int32_t((i * 3 + 1) % 8);
  TensorMap in{{"ids", rows}};
  EXPECT_TRUE(plan_for(5, v, k).split());
  auto cpu = create_backend("cpu")->compile(g, {.weight_dtype = "f32"});
  auto gpu = create_backend("cuda")->compile(g, {.weight_dtype = "bf16"});
  TensorMap want = cpu->run(in, {}, nullptr);
  for (int run = 0; run < 3; ++run) {
    SCOPED_TRACE(str_cat("run ", run));
    TensorMap got = gpu->run(in, {}, nullptr);
    const int32_t* gi = got.at("ids").data_as<int32_t>();
    const int32_t* wi = want.at("ids").data_as<int32_t>();
    const float* gv = got.at("values").data_as<float>();
    const float* wv = want.at("values").data_as<float>();
    const float* gl = got.at("logprobs").data_as<float>();
    const float* wl = want.at("logprobs").data_as<float>();
    int64_t bad = 0;
    for (int64_t i = 0; i < 5 * k; ++i)
      bad += gi[i] != wi[i] || gv[i] != wv[i] || !(std::fabs(double(gl[i]) - wl[i]) <= 1e-6 * std::max(1.0, std::fabs(double(wl[i]))));
    EXPECT_EQ(bad, 0);
  }
}

// A step that needs only each row's first candidates (StepInfo::top_k, a greedy
// serving step asks for 1) gets [R, top_k] outputs equal to the leading columns of the
// whole [R, k] result, eager and inside captured graphs, with the width switching
// between steps of the same shape (the width is part of the graph key).
TEST(CudaTopKLogits, AStepNeedingFewerCandidatesGetsTheLeadingColumns) {
  KILN_SKIP_WITHOUT_CUDA();
  const int64_t k = 64;
  for (int64_t v : {int64_t(32000), int64_t(128256)})
    for (int64_t rows : {int64_t(1), int64_t(3), int64_t(64)})
      for (Fill fill : {Fill::kNormal, Fill::kTies, Fill::kSpecial}) {
        SCOPED_TRACE(str_cat("v=", v, " rows=", rows, " fill=", int(fill)));
        const ir::Graph g = embedding_topk_graph(logits_tensor(rows, v, fill, "bf16", uint64_t(v + rows)), k);
        Tensor r(DType::kI32, {rows});
        for (int64_t i = 0; i < rows; ++i) r.data_as<int32_t>()[i] = int32_t(rows - 1 - i);
        TensorMap in{{"ids", r}};
        auto cpu = create_backend("cpu")->compile(g, {.weight_dtype = "f32"});
        auto gpu = create_backend("cuda")->compile(g, {.weight_dtype = "bf16"});
        TensorMap want = cpu->run(in, {}, nullptr);
        for (int32_t need : {1, 0, 1, 5, 0, 1}) {  // graphs captured and replayed per width
          SCOPED_TRACE(str_cat("need ", need));
          StepInfo st;
          st.top_k = need;
          TensorMap got = gpu->run(in, st, nullptr);
          const int64_t kk = need > 0 ? need : k;
          ASSERT_EQ(got.at("ids").shape(), (std::vector<int64_t>{rows, kk}));
          ASSERT_EQ(got.at("logprobs").shape(), (std::vector<int64_t>{rows, kk}));
          int64_t bad = 0;
          for (int64_t i = 0; i < rows; ++i)
            for (int64_t j = 0; j < kk; ++j) {
              const int64_t gi = i * kk + j, wi = i * k + j;
              const float gv = got.at("values").data_as<float>()[gi], wv = want.at("values").data_as<float>()[wi];
              const float gl = got.at("logprobs").data_as<float>()[gi], wl = want.at("logprobs").data_as<float>()[wi];
              const bool same_lp = std::isnan(wl) || std::isinf(wl)
                                       ? (std::isnan(wl) ? std::isnan(gl) : gl == wl)
                                       : std::fabs(double(gl) - wl) <= 1e-6 * std::max(1.0, std::fabs(double(wl)));
              bad += got.at("ids").data_as<int32_t>()[gi] != want.at("ids").data_as<int32_t>()[wi] ||
                     (std::memcmp(&gv, &wv, 4) != 0 && !(std::isnan(gv) && std::isnan(wv))) || !same_lp;
            }
          EXPECT_EQ(bad, 0);
        }
      }
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
