// The skinny split-k GEMM (ops/gemm_skinny.h): every configuration against an f64 host
// reference (bf16/f16, 1..128 rows, bias, residual, a wider y, k not a multiple of 64),
// in place on the residual, bit-identical reruns and graph replays; the calls it refuses;
// Gemm offering its configurations as tactics (KILN_CUDA_SKINNY_GEMM=0/1/force); and the
// tiny decoder fixtures with every small GEMM forced onto it against transformers.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "../../models/golden_util.h"
#include "backends/cuda/ops/elementwise.h"
#include "backends/cuda/ops/gemm.h"
#include "backends/cuda/ops/gemm_skinny.h"
#include "cuda_test_util.h"
#include "runtime/encoder_runner.h"
#include "runtime/executor.h"
#include "runtime/llm_runner.h"

namespace kiln::cuda {
namespace {

using namespace testing;

// Host values rounded to t, with their 16-bit device copy.
struct Operand {
  std::vector<double> host;
  std::vector<uint16_t> bits;
  Operand(int64_t n, DType t, std::mt19937_64& rng, float lo = -1.0f, float hi = 1.0f)
      : host(size_t(n)), bits(size_t(n)) {
    std::uniform_real_distribution<float> d(lo, hi);
    for (size_t i = 0; i < bits.size(); ++i) {
      bits[i] = t == DType::kBF16 ? f32_to_bf16(d(rng)) : f32_to_f16(d(rng));
      host[i] = t == DType::kBF16 ? bf16_to_f32(bits[i]) : f16_to_f32(bits[i]);
    }
  }
};

std::vector<double> to_f64(const std::vector<uint16_t>& bits, DType t) {
  std::vector<double> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = t == DType::kBF16 ? bf16_to_f32(bits[i]) : f16_to_f32(bits[i]);
  return out;
}

struct Case {
  int64_t m, n, k;
  bool bias, residual;
  int64_t ldy;  // 0: n
};

std::string case_name(const Case& c, DType t, int config) {
  return str_cat(dtype_name(t), " m=", c.m, " n=", c.n, " k=", c.k, c.bias ? " +bias" : "",
                 c.residual ? " +residual" : "", c.ldy ? str_cat(" ldy=", c.ldy) : "", " rows ",
                 kSkinnyConfigList[config].rows, " splits=", kSkinnyConfigList[config].splits);
}

// One problem: operands, the f64 reference over y's whole [m, ldy] (columns past n keep
// the initial y bits).
struct Problem {
  Case c;
  DType t;
  int64_t ldy;
  Operand x, w, bias, res, y0;
  std::vector<double> ref;
  Problem(const Case& cs, DType dt, std::mt19937_64& rng)
      : c(cs), t(dt), ldy(cs.ldy ? cs.ldy : cs.n), x(cs.m * cs.k, dt, rng), w(cs.n * cs.k, dt, rng),
        bias(cs.n, dt, rng), res(cs.m * ldy, dt, rng), y0(cs.m * ldy, dt, rng), ref(size_t(cs.m * ldy)) {
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < ldy; ++j) {
        const size_t at = size_t(i * ldy + j);
        if (j >= c.n) {
          ref[at] = y0.host[at];
          continue;
        }
        double acc = c.bias ? bias.host[size_t(j)] : 0.0;
        for (int64_t q = 0; q < c.k; ++q) acc += x.host[size_t(i * c.k + q)] * w.host[size_t(j * c.k + q)];
        ref[at] = acc + (c.residual ? res.host[at] : 0.0);
      }
  }
};

// A problem's operands on the device, and an output buffer the size of y.
struct DevOperands {
  Dev x, w, bias, res, y;
  explicit DevOperands(const Problem& p)
      : x(p.x.bits.data(), p.x.bits.size() * 2), w(p.w.bits.data(), p.w.bits.size() * 2),
        bias(p.bias.bits.data(), p.bias.bits.size() * 2), res(p.res.bits.data(), p.res.bits.size() * 2),
        y(p.y0.bits.size() * 2) {}
};

// max|got - ref| / max|ref| (ref holds y's initial bits past column n).
double rel_err(const std::vector<double>& got, const std::vector<double>& ref) {
  double err = 0, mx = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    err = std::isnan(got[i]) ? INFINITY : std::max(err, std::fabs(got[i] - ref[i]));
    mx = std::max(mx, std::fabs(ref[i]));
  }
  return mx > 0 ? err / mx : err;
}

TEST(CudaGemmSkinny, EveryConfigurationMatchesF64) {
  KILN_SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng(29);
  const Case cases[] = {{1, 64, 64, false, false, 0},       {7, 130, 136, true, false, 0},
                        {16, 256, 520, false, true, 0},     {33, 768, 768, true, false, 0},
                        {64, 2048, 2048, false, true, 0},   {100, 200, 1032, true, true, 208},
                        {128, 2304, 768, true, false, 0},   {64, 96, 4096, false, false, 0}};
  for (DType t : {DType::kBF16, DType::kF16}) {
    for (const Case& c : cases) {
      Problem p(c, t, rng);
      const DevOperands d(p);
      const void* bp = c.bias ? d.bias.get() : nullptr;
      const void* rp = c.residual ? d.res.get() : nullptr;
      ASSERT_TRUE(gemm_skinny_supported(t, c.m, c.n, c.k, c.ldy, d.x.get(), d.w.get(), bp, d.y.get(), rp));
      for (int cfg = 0; cfg < kSkinnyConfigs; ++cfg) {
        const std::string what = case_name(c, t, cfg);
        KILN_CUDA_CHECK(cudaMemcpy(d.y.get(), p.y0.bits.data(), p.y0.bits.size() * 2, cudaMemcpyHostToDevice));
        launch_gemm_skinny(cfg, t, d.x.get(), d.w.get(), bp, rp, d.y.get(), c.m, c.n, c.k, c.ldy, nullptr);
        KILN_CUDA_CHECK(cudaDeviceSynchronize());
        const auto first = d.y.host<uint16_t>(p.y0.bits.size());
        const double e = rel_err(to_f64(first, t), p.ref);
        std::printf("  %-58s rel %.3g\n", what.c_str(), e);
        EXPECT_LE(e, op_tolerance(dtype_name(t))) << what;
        for (int64_t i = 0; i < c.m; ++i)  // columns past n untouched
          for (int64_t j = c.n; j < p.ldy; ++j)
            ASSERT_EQ(first[size_t(i * p.ldy + j)], p.y0.bits[size_t(i * p.ldy + j)]) << what << " row " << i;
        // The splits add in a fixed order: a rerun gives the same bits.
        launch_gemm_skinny(cfg, t, d.x.get(), d.w.get(), bp, rp, d.y.get(), c.m, c.n, c.k, c.ldy, nullptr);
        KILN_CUDA_CHECK(cudaDeviceSynchronize());
        EXPECT_EQ(d.y.host<uint16_t>(first.size()), first) << what << ": a rerun differs";
      }
    }
  }
}

TEST(CudaGemmSkinny, InPlaceResidualAndGraphReplay) {
  KILN_SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng(31);
  const Case c{48, 1024, 1536, true, true, 0};
  const DType t = DType::kBF16;
  Problem p(c, t, rng);
  const DevOperands d(p);
  cudaStream_t s = nullptr;
  KILN_CUDA_CHECK(cudaStreamCreate(&s));
  for (int cfg = 0; cfg < kSkinnyConfigs; ++cfg) {
    const std::string what = case_name(c, t, cfg);
    // y = x·wᵀ + b + y: the residual read where it is written.
    KILN_CUDA_CHECK(cudaMemcpy(d.y.get(), p.res.bits.data(), p.res.bits.size() * 2, cudaMemcpyHostToDevice));
    launch_gemm_skinny(cfg, t, d.x.get(), d.w.get(), d.bias.get(), d.y.get(), d.y.get(), c.m, c.n, c.k, 0, s);
    KILN_CUDA_CHECK(cudaStreamSynchronize(s));
    const auto in_place = d.y.host<uint16_t>(p.res.bits.size());
    EXPECT_LE(rel_err(to_f64(in_place, t), p.ref), op_tolerance("bf16")) << what << " in place";
    Dev out(p.res.bits.size() * 2);
    launch_gemm_skinny(cfg, t, d.x.get(), d.w.get(), d.bias.get(), d.res.get(), out.get(), c.m, c.n, c.k, 0, s);
    KILN_CUDA_CHECK(cudaStreamSynchronize(s));
    const auto eager = out.host<uint16_t>(p.res.bits.size());
    EXPECT_EQ(eager, in_place) << what << ": in place differs from a separate output";
    // Captured once, replayed twice.
    KILN_CUDA_CHECK(cudaMemset(out.get(), 0, p.res.bits.size() * 2));
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    KILN_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    launch_gemm_skinny(cfg, t, d.x.get(), d.w.get(), d.bias.get(), d.res.get(), out.get(), c.m, c.n, c.k, 0, s);
    KILN_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    KILN_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int r = 0; r < 2; ++r) {
      KILN_CUDA_CHECK(cudaGraphLaunch(exec, s));
      KILN_CUDA_CHECK(cudaStreamSynchronize(s));
      EXPECT_EQ(out.host<uint16_t>(p.res.bits.size()), eager) << what << ": graph replay " << r;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  KILN_CUDA_CHECK(cudaStreamDestroy(s));
}

// The activation epilogue equals the plain product followed by the activation pass (and
// the residual add), bit for bit: what the Linear's unfused path computes.
TEST(CudaGemmSkinny, ActivationEpilogueEqualsThePasses) {
  KILN_SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng(41);
  const std::pair<GemvEpilogue, UnaryOp> acts[] = {{GemvEpilogue::kGeluErf, UnaryOp::kGeluErf},
                                                   {GemvEpilogue::kGeluTanh, UnaryOp::kGeluTanh},
                                                   {GemvEpilogue::kSilu, UnaryOp::kSilu}};
  for (DType t : {DType::kBF16, DType::kF16}) {
    for (const Case& c : {Case{128, 3072, 768, true, false, 0}, Case{24, 320, 1000, true, true, 0}}) {
      Problem p(c, t, rng);
      const DevOperands d(p);
      Dev dref(p.y0.bits.size() * 2);
      const void* rp = c.residual ? d.res.get() : nullptr;
      const int64_t count = c.m * c.n;
      for (int cfg = 0; cfg < kSkinnyConfigs; ++cfg) {
        for (const auto& [epi, op] : acts) {
          const std::string what = case_name(c, t, cfg) + " act " + std::to_string(int(epi));
          launch_gemm_skinny(cfg, t, d.x.get(), d.w.get(), d.bias.get(), rp, d.y.get(), c.m, c.n, c.k, 0, nullptr, epi);
          launch_gemm_skinny(cfg, t, d.x.get(), d.w.get(), d.bias.get(), nullptr, dref.get(), c.m, c.n, c.k, 0, nullptr);
          launch_unary(op, t, dref.get(), count, dref.get(), nullptr);
          if (rp) launch_binary(BinaryOp::kAdd, t, dref.get(), rp, count, count, dref.get(), nullptr);
          KILN_CUDA_CHECK(cudaDeviceSynchronize());
          EXPECT_EQ(d.y.host<uint16_t>(size_t(count)), dref.host<uint16_t>(size_t(count))) << what;
        }
      }
    }
  }
}

TEST(CudaGemmSkinny, RefusesWhatItCannotRun) {
  KILN_SKIP_WITHOUT_CUDA();
  Dev a(1 << 20), b(1 << 20), y(1 << 20);
  const auto* pa = static_cast<const char*>(a.get());
  EXPECT_TRUE(gemm_skinny_supported(DType::kBF16, 64, 256, 512, 0, a.get(), b.get(), nullptr, y.get(), nullptr));
  EXPECT_FALSE(gemm_skinny_supported(DType::kF32, 64, 256, 512, 0, a.get(), b.get(), nullptr, y.get(), nullptr));
  EXPECT_FALSE(gemm_skinny_supported(DType::kBF16, 129, 256, 512, 0, a.get(), b.get(), nullptr, y.get(), nullptr));
  EXPECT_FALSE(gemm_skinny_supported(DType::kBF16, 0, 256, 512, 0, a.get(), b.get(), nullptr, y.get(), nullptr));
  EXPECT_FALSE(gemm_skinny_supported(DType::kBF16, 64, 255, 512, 0, a.get(), b.get(), nullptr, y.get(), nullptr));
  EXPECT_FALSE(gemm_skinny_supported(DType::kBF16, 64, 256, 500, 0, a.get(), b.get(), nullptr, y.get(), nullptr));
  EXPECT_FALSE(gemm_skinny_supported(DType::kBF16, 64, 256, 512, 257, a.get(), b.get(), nullptr, y.get(), nullptr));
  EXPECT_FALSE(gemm_skinny_supported(DType::kBF16, 64, 256, 512, 254, a.get(), b.get(), nullptr, y.get(), nullptr));
  EXPECT_TRUE(gemm_skinny_supported(DType::kBF16, 64, 256, 512, 258, a.get(), b.get(), nullptr, y.get(), nullptr));
  EXPECT_FALSE(gemm_skinny_supported(DType::kBF16, 64, 256, 512, 0, pa + 2, b.get(), nullptr, y.get(), nullptr));
  EXPECT_FALSE(gemm_skinny_supported(DType::kBF16, 64, 256, 512, 0, a.get(), b.get(), pa + 8, y.get(), nullptr));
  try {
    launch_gemm_skinny(0, DType::kBF16, a.get(), b.get(), nullptr, nullptr, y.get(), 200, 256, 512, 0, nullptr);
    ADD_FAILURE() << "200 rows launched";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal);
    EXPECT_NE(std::string(e.what()).find("m=200"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(gemm_skinny_config_useful(3, 512));  // 8 splits of 8 k steps: one step each
  EXPECT_TRUE(gemm_skinny_config_useful(3, 1024));
  EXPECT_FALSE(gemm_skinny_config_useful(kSkinnyConfigs, 1 << 20));
}

// Gemm with KILN_CUDA_SKINNY_GEMM: 0 (and empty: the default) offers cuBLASLt's algorithms
// only, 1 adds the useful configurations and keeps the fastest after timing, force runs the
// last one untimed; all give y within the bound of the f64 reference.
TEST(CudaGemmSkinny, GemmTacticsUnderEachSetting) {
  KILN_SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng(37);
  const Case c{64, 2048, 2048, true, false, 0};
  const DType t = DType::kBF16;
  Problem p(c, t, rng);
  const DevOperands d(p);
  int useful = 0;
  for (int cfg = 0; cfg < kSkinnyConfigs; ++cfg) useful += gemm_skinny_config_useful(cfg, c.k);
  ASSERT_EQ(useful, kSkinnyConfigs);
  int heuristic = 0;
  for (const char* mode : {"0", "", "1", "force"}) {
    ScopedEnv env("KILN_CUDA_SKINNY_GEMM", mode);
    Gemm g;
    g.set_row_tuning(true);
    {
      Gemm::RowTuningScope scope(g);
      g.run(t, d.x.get(), d.w.get(), d.bias.get(), d.y.get(), c.m, c.n, c.k, nullptr);
    }
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    const Gemm::Choice ch = g.choice(t, t, c.m, c.n, c.k, true);
    const std::string what = str_cat("KILN_CUDA_SKINNY_GEMM=", mode);
    if (std::strcmp(mode, "0") == 0) {
      heuristic = ch.candidates;
      EXPECT_EQ(int(ch.times.size()), heuristic) << what;
    } else if (!*mode) {
      EXPECT_EQ(ch.candidates, heuristic) << what << ": the skinny GEMM is opt-in";
    } else if (std::strcmp(mode, "1") == 0) {
      EXPECT_EQ(ch.candidates, heuristic + useful) << what;
      ASSERT_EQ(int(ch.times.size()), ch.candidates) << what << ": every tactic timed";
      std::string line;
      for (int i = 0; i < useful; ++i) line += str_cat(" ", ch.times[size_t(heuristic + i)].ms * 1e3f);
      std::printf("  m=64 n=2048 k=2048 bf16: cuBLASLt's first %.1f us, skinny configurations (us):%s, keeps #%d\n",
                  ch.times[0].ms * 1e3, line.c_str(), ch.tactic);
    } else {
      EXPECT_EQ(ch.tactic, ch.candidates - 1) << what;
      EXPECT_TRUE(ch.times.empty()) << what << ": forced plans are not timed";
    }
    EXPECT_LE(rel_err(to_f64(d.y.host<uint16_t>(p.y0.bits.size()), t), p.ref), op_tolerance("bf16")) << what;
  }
  // A bad value names the variable.
  ScopedEnv env("KILN_CUDA_SKINNY_GEMM", "yes");
  Gemm g;
  try {
    g.run(t, d.x.get(), d.w.get(), d.bias.get(), d.y.get(), c.m, c.n, c.k, nullptr);
    ADD_FAILURE() << "KILN_CUDA_SKINNY_GEMM=yes accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KILN_CUDA_SKINNY_GEMM"), std::string::npos) << e.what();
  }
}

// The decoder fixtures with every GEMM of <= 128 rows on the skinny GEMM: the all-position
// logits of the prompts (one ragged step of 10-30 rows) against transformers, within the
// model tests' bounds (models_test.cpp), and a batch of 12 sequences decoding (12-row
// steps, past the GEMVs' rows) as with cuBLASLt.
TEST(CudaGemmSkinnyModels, DecodersMatchTransformersAndCublasLt) {
  KILN_SKIP_WITHOUT_CUDA();
  for (const std::string family : {"llama", "gpt2", "qwen2"}) {
    for (const std::string dtype : {"bf16", "f16"}) {
      const std::string tag = family + " " + dtype;
      const double tol = dtype == "f16" ? 1e-2 : 6e-2;
      kiln::testing::Reference ref(family);
      const int64_t smax = ref.shape("input_ids")[1];
      auto prompts = ref.prompts();
      auto want = ref.f32("logits");
      std::vector<std::vector<float>> decoded[2];
      for (int forced = 0; forced < 2; ++forced) {
        ScopedEnv env("KILN_CUDA_SKINNY_GEMM", forced ? "force" : "0");
        auto model = Model::load(fixtures_dir() + "/models/" + family, {.backend = "cuda", .weight_dtype = dtype});
        const int64_t vocab = model->info().vocab_size;
        if (forced) {
          LlmRunner runner(*model);
          for (auto& pr : prompts) runner.add_sequence(pr);
          auto outs = runner.step(/*all_logits=*/true);
          ASSERT_EQ(outs.size(), prompts.size());
          for (auto& o : outs) {
            Diff d = diff(Tensor::view(o.logits.data(), DType::kF32, {int64_t(o.logits.size())}),
                          Tensor::view(want.data() + size_t(o.seq) * size_t(smax * vocab), DType::kF32,
                                       {int64_t(o.logits.size())}));
            std::printf("  %-40s prompt %d logits rel %.3g\n", (tag + " skinny").c_str(), int(o.seq), d.rel());
            EXPECT_LE(d.rel(), tol) << tag << " prompt " << o.seq;
          }
        }
        std::mt19937 rng(5);
        std::uniform_int_distribution<int32_t> tok(0, int32_t(vocab - 1));
        LlmRunner runner(*model, {.block_size = 4});
        for (int sq = 0; sq < 12; ++sq) {
          std::vector<int32_t> pr;
          for (int i = 0; i < 3 + sq; ++i) pr.push_back(tok(rng));
          runner.add_sequence(pr);
        }
        for (int step = 0; step < 4; ++step) {
          auto outs = runner.step();
          for (auto& o : outs) {
            decoded[forced].push_back(o.logits);
            // Fixed next tokens, the same in both runs (an argmax near-tie must not fork them).
            runner.append_tokens(o.seq, {int32_t((o.seq * 7 + step) % vocab)});
          }
        }
      }
      ASSERT_EQ(decoded[0].size(), decoded[1].size()) << tag;
      double worst = 0;
      for (size_t i = 0; i < decoded[0].size(); ++i) {
        Diff d = diff(Tensor::view(decoded[1][i].data(), DType::kF32, {int64_t(decoded[1][i].size())}),
                      Tensor::view(decoded[0][i].data(), DType::kF32, {int64_t(decoded[0][i].size())}));
        worst = std::max(worst, d.rel());
      }
      std::printf("  %-40s 12-sequence decode vs cuBLASLt: worst rel %.3g\n", tag.c_str(), worst);
      EXPECT_LE(worst, tol) << tag;
    }
  }
}

// The tiny BERT classifier with its GEMMs (bias; the FFN up with its GELU in the epilogue)
// forced onto the skinny GEMM, eager and as a replayed CUDA graph, against transformers.
TEST(CudaGemmSkinnyModels, BertMatchesTransformers) {
  KILN_SKIP_WITHOUT_CUDA();
  ScopedEnv env("KILN_CUDA_SKINNY_GEMM", "force");
  kiln::testing::Reference ref("bert");
  const auto shape = ref.shape("input_ids");
  const auto hidden = ref.f32("last_hidden");
  for (const std::string dtype : {"bf16", "f16"}) {
    auto model = Model::load(fixtures_dir() + "/models/bert", {.backend = "cuda", .weight_dtype = dtype});
    std::vector<EncoderInput> batch = encoder_inputs_from_padded(
        ref.ids("input_ids"), ref.ids("token_type_ids"), ref.ids("attention_mask"), shape[0], shape[1]);
    const auto first = encode(*model, batch);
    (void)encode(*model, batch);
    const auto out = encode(*model, batch);
    const int64_t h = model->info().hidden_size;
    for (size_t b = 0; b < batch.size(); ++b) {
      const std::string tag = "bert " + dtype + " skinny seq " + std::to_string(b);
      EXPECT_EQ(first[b].hidden, out[b].hidden) << tag << ": the replayed forward differs";
      const int64_t n = int64_t(batch[b].tokens.size()) * h;
      Diff d = diff(Tensor::view(const_cast<float*>(out[b].hidden.data()), DType::kF32, {n}),
                    Tensor::view(const_cast<float*>(hidden.data()) + b * size_t(shape[1] * h), DType::kF32, {n}));
      std::printf("  %-40s hidden rel %.3g\n", tag.c_str(), d.rel());
      EXPECT_LE(d.rel(), dtype == "f16" ? 1e-2 : 6e-2) << tag;
    }
  }
}

}  // namespace
}  // namespace kiln::cuda
