// GPTQ: the collector's Hessian matches X^T X, the inverse factor inverts the damped
// Hessian, uncorrelated inputs reproduce plain rounding byte for byte, correlated inputs
// get a smaller output error than plain rounding (q4 and q8), the rewrite stores row images
// that a tiny decoder and encoder run closer to f32 than plain q4, and bad input is a
// clear error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <unistd.h>

#include "core/status.h"
#include "runtime/encoder_runner.h"
#include "runtime/model_tokenizer.h"
#include "passes/pass.h"
#include "runtime/quantize.h"
#include "../models/gguf_quant_llama.h"
#include "../models/golden_util.h"
#include "quant_test_util.h"

namespace kiln {
namespace {

using quant_test::all_logits;
using quant_test::random_sequences;

using quant_test::expect_error;

// Inputs x = z A with a random mixing A: strongly correlated channels, as a Linear's
// inputs are (they come out of a norm, an attention or an MLP).
struct CorrelatedLayer {
  int64_t n, k, rows;
  std::vector<float> w, x;
  CorrelatedLayer(int64_t n_, int64_t k_, int64_t rows_, uint64_t seed) : n(n_), k(k_), rows(rows_) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (int64_t i = 0; i < n * k; ++i) w.push_back(0.05f * d(rng));
    const int64_t latent = k / 4;
    std::vector<float> a(size_t(latent * k));
    for (float& v : a) v = d(rng);
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<float> z(static_cast<size_t>(latent));
      for (float& v : z) v = d(rng);
      for (int64_t j = 0; j < k; ++j) {
        float s = 0.1f * d(rng);
        for (int64_t l = 0; l < latent; ++l) s += z[size_t(l)] * a[size_t(l * k + j)];
        x.push_back(s);
      }
    }
  }
  std::shared_ptr<const quant::GptqHessian> hessian() const {
    quant::GptqCollector c("layer");
    c.observe(x.data(), rows / 3, k);  // in two calls, the second crossing a 256-row chunk
    c.observe(x.data() + (rows / 3) * k, rows - rows / 3, k);
    return c.finish();
  }
};

TEST(Gptq, CollectorSumsXTransposeX) {
  CorrelatedLayer l(8, 96, 700, 3);
  auto h = l.hessian();
  ASSERT_EQ(h->k, l.k);
  EXPECT_EQ(h->rows, l.rows);
  double worst = 0;
  for (int64_t i = 0; i < l.k; ++i)
    for (int64_t j = 0; j < l.k; ++j) {
      double ref = 0;
      for (int64_t r = 0; r < l.rows; ++r) ref += double(l.x[size_t(r * l.k + i)]) * l.x[size_t(r * l.k + j)];
      worst = std::max(worst, std::fabs(h->sum[size_t(i * l.k + j)] - ref) / (1.0 + std::fabs(ref)));
    }
  EXPECT_LT(worst, 1e-4);
}

TEST(Gptq, InverseFactorInvertsTheDampedHessian) {
  CorrelatedLayer l(8, 64, 300, 4);
  auto h = l.hessian();
  const int64_t k = l.k;
  const double damp = 0.01;
  const std::vector<double> u = quant::gptq_inverse_factor(h->sum, h->rows, k, damp);
  double mean = 0;
  for (int64_t j = 0; j < k; ++j) mean += h->sum[size_t(j * k + j)] / double(h->rows) / double(k);
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < i; ++j) ASSERT_EQ(u[size_t(i * k + j)], 0.0) << "U is upper triangular";
  // (U^T U) (H / rows + damp * mean * I) = I
  double worst = 0;
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < k; ++j) {
      double s = 0;
      for (int64_t m = 0; m < k; ++m) {
        double inv = 0;
        for (int64_t p = 0; p <= std::min(i, m); ++p) inv += u[size_t(p * k + i)] * u[size_t(p * k + m)];
        s += inv * (h->sum[size_t(m * k + j)] / double(h->rows) + (m == j ? damp * mean : 0.0));
      }
      worst = std::max(worst, std::fabs(s - (i == j ? 1.0 : 0.0)));
    }
  EXPECT_LT(worst, 1e-8);
}

bool same_rows(const QuantizedRows& a, const QuantizedRows& b) {
  const size_t cb = quant_row_code_bytes(a.format, a.k), g = size_t(a.n * a.groups());
  return std::memcmp(a.codes.get(), b.codes.get(), size_t(a.n) * cb) == 0 &&
         std::memcmp(a.scales.get(), b.scales.get(), g * 2) == 0 &&
         (!a.mins || std::memcmp(a.mins.get(), b.mins.get(), g * 2) == 0) &&
         std::memcmp(a.row_factor.get(), b.row_factor.get(), size_t(a.n) * 4) == 0;
}

TEST(Gptq, UncorrelatedInputsGivePlainRounding) {
  CorrelatedLayer l(24, 128, 1, 5);
  const int64_t k = l.k;
  std::vector<double> diag(size_t(k * k), 0.0);
  for (int64_t j = 0; j < k; ++j) diag[size_t(j * k + j)] = 1.0 + double(j % 7);  // no off-diagonal terms
  const std::vector<double> u = quant::gptq_inverse_factor(diag, 1, k, 0.01);
  for (QuantFormat f : {QuantFormat::kQ4, QuantFormat::kQ8}) {
    QuantizedRows g = quant::gptq_quantize(l.w.data(), l.n, k, u, {}, f);
    QuantizedRows p = quantize_rows(l.w.data(), l.n, k, f);
    EXPECT_TRUE(same_rows(g, p)) << quant_format_name(f);
  }
}

TEST(Gptq, CorrelatedInputsCutTheOutputError) {
  CorrelatedLayer l(64, 256, 600, 6);
  auto h = l.hessian();
  std::vector<int64_t> dead;
  const std::vector<double> u = quant::gptq_inverse_factor(h->sum, h->rows, l.k, 0.01, &dead);
  EXPECT_TRUE(dead.empty());
  for (QuantFormat f : {QuantFormat::kQ4, QuantFormat::kQ8}) {
    const double e = quant::gptq_output_error(l.w.data(), quant::gptq_quantize(l.w.data(), l.n, l.k, u, dead, f),
                                              h->sum, h->rows);
    const double rtn = quant::gptq_output_error(l.w.data(), quantize_rows(l.w.data(), l.n, l.k, f), h->sum, h->rows);
    std::printf("%s output error: gptq %.4g, plain rounding %.4g (%.2f)\n", quant_format_name(f), e, rtn, e / rtn);
    EXPECT_GT(e, 0.0);
    EXPECT_LT(e, 0.7 * rtn) << quant_format_name(f);
  }
}

// Act order: the permuted sweep still cuts the error, the diagonal-only Hessian still gives
// plain rounding (static groups are the plain grid), and a dead channel found in the
// permuted Hessian is zeroed at its own column.
TEST(Gptq, ActOrderCutsTheOutputErrorAndMapsDeadChannels) {
  CorrelatedLayer l(64, 256, 600, 8);
  for (int64_t r = 0; r < l.rows; ++r) l.x[size_t(r * l.k + 70)] = 0.0f;
  for (int64_t r = 0; r < l.rows; ++r) l.x[size_t(r * l.k + 3)] *= 4.0f;  // the largest input first
  auto h = l.hessian();
  const std::vector<int64_t> order = quant::gptq_act_order(h->sum, l.k);
  ASSERT_EQ(order.size(), size_t(l.k));
  EXPECT_EQ(order.front(), 3);
  EXPECT_EQ(order.back(), 70);
  std::vector<int64_t> dead;
  const std::vector<double> u =
      quant::gptq_inverse_factor(quant::gptq_permute(h->sum, l.k, order), h->rows, l.k, 0.01, &dead);
  ASSERT_EQ(dead, std::vector<int64_t>{l.k - 1});  // the permuted index of channel 70
  for (int64_t& d : dead) d = order[size_t(d)];
  for (QuantFormat f : {QuantFormat::kQ4, QuantFormat::kQ8}) {
    QuantizedRows q = quant::gptq_quantize(l.w.data(), l.n, l.k, u, dead, f, order);
    std::vector<float> row(static_cast<size_t>(l.k));
    for (int64_t r = 0; r < l.n; ++r) {
      dequantize_row(q.codes.get() + size_t(r) * quant_row_code_bytes(f, l.k), q.scales.get() + r * q.groups(),
                     q.mins ? q.mins.get() + r * q.groups() : nullptr, q.row_factor[size_t(r)], l.k, f, row.data());
      // q8's grid holds 0 exactly; q4's (scale and min) only within half a step, which does
      // not matter: the channel's input is always 0.
      if (f == QuantFormat::kQ8) ASSERT_EQ(row[70], 0.0f) << "row " << r;
    }
    std::vector<float> w0 = l.w;
    for (int64_t r = 0; r < l.n; ++r) w0[size_t(r * l.k + 70)] = 0.0f;
    const double e = quant::gptq_output_error(w0.data(), q, h->sum, h->rows);
    const double rtn = quant::gptq_output_error(w0.data(), quantize_rows(w0.data(), l.n, l.k, f), h->sum, h->rows);
    std::printf("%s act-order output error: gptq %.4g, plain rounding %.4g (%.2f)\n", quant_format_name(f), e, rtn,
                e / rtn);
    EXPECT_LT(e, 0.7 * rtn) << quant_format_name(f);
  }
  std::vector<double> diag(size_t(l.k * l.k), 0.0);
  for (int64_t j = 0; j < l.k; ++j) diag[size_t(j * l.k + j)] = 1.0 + double(j % 7);
  const std::vector<int64_t> dorder = quant::gptq_act_order(diag, l.k);
  const std::vector<double> du = quant::gptq_inverse_factor(quant::gptq_permute(diag, l.k, dorder), 1, l.k, 0.01);
  for (QuantFormat f : {QuantFormat::kQ4, QuantFormat::kQ8})
    EXPECT_TRUE(same_rows(quant::gptq_quantize(l.w.data(), l.n, l.k, du, {}, f, dorder),
                          quantize_rows(l.w.data(), l.n, l.k, f)))
        << quant_format_name(f);
  expect_error([&] { quant::gptq_quantize(l.w.data(), l.n, l.k, du, {}, QuantFormat::kQ4, {0, 1}); },
               ErrorCode::kInvalidArgument, "column order");
}

TEST(Gptq, DeadChannelsAreZeroed) {
  CorrelatedLayer l(16, 64, 200, 7);
  for (int64_t r = 0; r < l.rows; ++r) l.x[size_t(r * l.k + 5)] = 0.0f;  // channel 5 never active
  auto h = l.hessian();
  std::vector<int64_t> dead;
  const std::vector<double> u = quant::gptq_inverse_factor(h->sum, h->rows, l.k, 0.01, &dead);
  ASSERT_EQ(dead, std::vector<int64_t>{5});
  QuantizedRows q = quant::gptq_quantize(l.w.data(), l.n, l.k, u, dead, QuantFormat::kQ8);
  std::vector<float> row(size_t(l.k));
  for (int64_t r = 0; r < l.n; ++r) {
    dequantize_row(q.codes.get() + size_t(r * l.k), q.scales.get() + r * q.groups(), nullptr, q.row_factor[size_t(r)],
                   l.k, QuantFormat::kQ8, row.data());
    EXPECT_EQ(row[5], 0.0f) << "row " << r;
    for (float v : row) ASSERT_TRUE(std::isfinite(v));
  }
}

double rel_error(const std::vector<float>& got, const std::vector<float>& ref) {
  double e = 0, r = 0;
  for (size_t i = 0; i < ref.size(); ++i) e += double(got[i] - ref[i]) * (got[i] - ref[i]), r += double(ref[i]) * ref[i];
  return std::sqrt(e / r);
}

TEST(Gptq, TinyDecoderRunsCloserToF32ThanPlainQ4) {
  // On q4's free f16 scales, where these bounds were measured. On the 8-bit grid (the
  // default) every Linear's output error falls as much (0.38-0.79 of plain rounding, the
  // same ratios to two digits), but this 64-wide model's logits, 37% RMS off f32 at plain
  // q4, follow only loosely: 0.997x plain on the calibration tokens there, and GPTQ's
  // held-out numbers are above plain's on both grids. The per-Linear tests above and the
  // real MiniLM's below run on the default grid.
  q4_free_scales_set(true);
  struct Restore {
    ~Restore() { q4_free_scales_set(false); }
  } restore;
  const std::string dir = testing::fixture_dir("llama");
  auto f32 = Model::load(dir);
  const int64_t v = f32->info().vocab_size;
  auto calib = random_sequences(8, 32, v, 17);
  // Scored on a calibration sequence: what GPTQ minimizes (each Linear's output error on
  // the calibration inputs) must carry through the model to its logits. On held-out
  // random tokens this 64-wide model (two q4 groups a row) gains only a few percent, as
  // GPTQ on random weights and uncorrelated tokens should; that is checked for no loss.
  const auto& toks = calib[0];
  const auto held_out = random_sequences(1, 24, v, 18)[0];
  // Plain q4 as `kiln build` stores it (and as gptq_model_options loads): the precision
  // pass keeps the logits GEMM f32.
  ModelOptions plain_q4;
  plain_q4.weight_dtype = plain_q4.precision = "q4";
  auto q4 = Model::load(dir, plain_q4);
  const auto ref = all_logits(*f32, toks), ref_held = all_logits(*f32, held_out);
  const double plain = rel_error(all_logits(*q4, toks), ref);
  const double plain_held = rel_error(all_logits(*q4, held_out), ref_held);
  for (std::string mode : {"gptq", "awq-gptq", "gptq column-order", "gptq sequential"}) {
    QuantOptions q;
    q.gptq_act_order = mode != "gptq column-order";
    q.gptq_sequential = mode == "gptq sequential";
    q.mode = mode == "awq-gptq" ? mode : "gptq";
    q.awq_rows = 64;
    const quant::CalibrationTable table = calibrate_gptq(dir, {}, q, QuantFormat::kQ4, &calib);
    EXPECT_EQ(table.gptq.size(), 2u * 4 + 1) << mode;  // per layer qkv, o, gate|up, down; the head
    EXPECT_EQ(table.awq.empty(), q.mode == "gptq");
    auto report = std::make_shared<quant::GptqReport>();
    auto m = Model::load(dir, gptq_model_options({.weight_dtype = "q4"}, table, q, report));
    EXPECT_EQ(report->quantized, 8) << mode;  // the blocks' Linears; the logits GEMM stays f32
    EXPECT_LT(report->error, report->error_rtn) << mode;
    int images = 0;
    for (const ir::Node& n : m->graph().nodes()) images += n.attr_str("weight_quant", "") == "q4";
    EXPECT_GE(images, 8) << mode;
    const double e = rel_error(all_logits(*m, toks), ref), e_held = rel_error(all_logits(*m, held_out), ref_held);
    std::printf("tiny llama logits RMS error vs f32 (calibration / held-out tokens): q4 %.4f / %.4f, q4 + %s %.4f / %.4f\n",
                plain, plain_held, mode.c_str(), e, e_held);
    EXPECT_GT(e, 0.0);
    // Column order gains most here (0.79x); act order's static groups (two a row at K = 64)
    // leave it 0.88-0.92x on these tokens, and better on the held-out ones.
    EXPECT_LT(e, 0.95 * plain) << mode;
    EXPECT_LT(e_held, 1.05 * plain_held) << mode;
  }
}

// Sequential calibration: layer 0's Hessians are the one-pass ones (its inputs do not
// depend on any quantized Linear), every later Linear's come from the partly quantized
// model and differ.
TEST(Gptq, SequentialHessiansFollowTheQuantizedLayers) {
  const std::string dir = testing::fixture_dir("llama");
  auto calib = random_sequences(4, 24, 512, 23);
  QuantOptions q;
  q.mode = "gptq";
  const quant::CalibrationTable once = calibrate_gptq(dir, {}, q, QuantFormat::kQ4, &calib);
  q.gptq_sequential = true;
  const quant::CalibrationTable seq = calibrate_gptq(dir, {}, q, QuantFormat::kQ4, &calib);
  ASSERT_EQ(once.gptq.size(), seq.gptq.size());
  int same = 0, differ = 0;
  for (const auto& [name, h] : once.gptq) {
    ASSERT_TRUE(seq.gptq.count(name)) << name;
    const auto& hs = *seq.gptq.at(name);
    ASSERT_EQ(hs.rows, h->rows) << name;
    const bool equal = hs.sum == h->sum;
    if (name.rfind("layers.0.", 0) == 0) {
      EXPECT_TRUE(equal) << name;
      ++same;
    } else {
      EXPECT_FALSE(equal) << name;
      ++differ;
    }
  }
  EXPECT_EQ(same, 4);    // q|k|v, o, gate|up, down of layer 0
  EXPECT_EQ(differ, 5);  // those of layer 1, and the head
}

// A build or load for CUDA calibrates on the CPU (only the CPU backend calls the Linear
// observer): the same Hessians as a CPU build, sequential stages included, and no GPU
// needed to calibrate.
TEST(Gptq, CudaBuildsCalibrateOnTheCpu) {
  const std::string dir = testing::fixture_dir("llama");
  auto calib = random_sequences(3, 16, 512, 29);
  QuantOptions q;
  q.mode = "gptq";
  q.gptq_sequential = true;
  const quant::CalibrationTable cpu = calibrate_gptq(dir, {}, q, QuantFormat::kQ4, &calib);
  const quant::CalibrationTable cuda = calibrate_gptq(dir, {.backend = "cuda", .device = 3}, q, QuantFormat::kQ4, &calib);
  ASSERT_EQ(cpu.gptq.size(), cuda.gptq.size());
  ASSERT_FALSE(cpu.gptq.empty());
  for (const auto& [name, h] : cpu.gptq) {
    ASSERT_TRUE(cuda.gptq.count(name)) << name;
    EXPECT_GT(h->rows, 0) << name;
    EXPECT_EQ(cuda.gptq.at(name)->sum, h->sum) << name;
  }
}

// --pin-precision 'layers.0.*=q8' with GPTQ q4: layer 0's Linears get q8 row images, the
// rest q4, and the pinned model sits closer to f32.
TEST(Gptq, PinnedLinearsTakeTheirOwnFormat) {
  const std::string dir = testing::fixture_dir("llama");
  auto calib = random_sequences(8, 32, 512, 31);
  QuantOptions q;
  q.mode = "gptq";
  const quant::CalibrationTable table = calibrate_gptq(dir, {}, q, QuantFormat::kQ4, &calib);
  ModelOptions pinned = {.weight_dtype = "q4"};
  pinned.precision = "q4";  // as kiln build sets it: assign_precision applies the pins
  pinned.pin_precision = passes::parse_precision_pins("layers.0.*=q8");
  auto m = Model::load(dir, gptq_model_options(pinned, table, q));
  int q8 = 0, q4 = 0;
  for (const ir::Node& n : m->graph().nodes()) {
    // assign_precision keeps the logits GEMM f32 (as kiln build does), and GPTQ leaves it.
    if (n.op != "Linear" || n.attr_str("precision", "") == "f32") continue;
    const std::string f = n.attr_str("weight_quant", "");
    EXPECT_EQ(f, n.name.rfind("layers.0.", 0) == 0 ? "q8" : "q4") << n.name;
    (f == "q8" ? q8 : q4) += 1;
  }
  EXPECT_EQ(q8, 4);
  EXPECT_EQ(q4, 4);
  auto f32 = Model::load(dir);
  auto all_q4 = Model::load(dir, gptq_model_options({.weight_dtype = "q4", .precision = "q4"}, table, q));
  const auto ref = all_logits(*f32, calib[0]);
  EXPECT_LT(rel_error(all_logits(*m, calib[0]), ref), rel_error(all_logits(*all_q4, calib[0]), ref));
}

// A GGUF whose attention Linears are Q4_1 and MLP Linears Q8_0, quantized to q4 with GPTQ:
// the Q4_1 ones keep the file's codes (no Hessian is collected for them, and the rewrite
// leaves them), the Q8_0 ones and the head are GPTQ's.
TEST(Gptq, GgufLinearsKeepTheirOwnCodes) {
  const std::string path = ::testing::TempDir() + "/kiln_gptq_" + std::to_string(::getpid()) + ".gguf";
  test::write_file(path, test::quant_llama(GgmlType::kQ4_1, GgmlType::kQ8_0));
  auto calib = random_sequences(4, 16, 16, 29);
  QuantOptions q;
  q.mode = "gptq";
  const quant::CalibrationTable table = calibrate_gptq(path, {}, q, QuantFormat::kQ4, &calib);
  int file_codes = 0, gptq_rows = 0;
  for (const auto& [name, h] : table.gptq) {
    EXPECT_EQ(name.find("qkv"), std::string::npos) << name;
    EXPECT_EQ(name.find("o_proj"), std::string::npos) << name;
  }
  EXPECT_EQ(table.gptq.size(), 2u * 2 + 1);  // gate|up and down of 2 layers, the head
  auto report = std::make_shared<quant::GptqReport>();
  auto m = Model::load(path, gptq_model_options({.weight_dtype = "q4"}, table, q, report));
  EXPECT_EQ(report->quantized, 4);  // gate|up and down; the logits GEMM stays f32
  int head = 0;
  for (const ir::Node& n : m->graph().nodes()) {
    if (n.op != "Linear") continue;
    if (n.attr_str("precision", "") == "f32") {
      ++head;
      EXPECT_EQ(n.attr_str("weight_quant", ""), "") << n.name;
      continue;
    }
    EXPECT_EQ(n.attr_str("weight_quant", ""), "q4") << n.name;
    const bool gptq = m->graph().value(n.inputs[1]).name.ends_with(".gptq");
    (gptq ? gptq_rows : file_codes) += 1;
    EXPECT_EQ(gptq, n.name.find("qkv") == std::string::npos && n.name.find("o_proj") == std::string::npos) << n.name;
  }
  EXPECT_EQ(head, 1);
  EXPECT_EQ(file_codes, 4);
  EXPECT_EQ(gptq_rows, 4);
  std::filesystem::remove(path);
}

// The real all-MiniLM-L6-v2 (skipped when absent): GPTQ's q4 embeddings stay closer to
// f32's than plain q4's on sentences outside the calibration text (the project's docs).
// Measured over 300 GPL-3 sentences: 1 - mean cosine 2.96e-2 plain, 1.50e-2 GPTQ.
TEST(Gptq, RealMiniLmEmbeddingsCloserToF32ThanPlainQ4) {
  const std::string dir = testing::models_dir() + "/all-minilm-l6-v2";
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "real model not found at " << dir;
  auto f32 = Model::load(dir);
  auto tokenizer = load_model_tokenizer(*f32);
  ASSERT_TRUE(tokenizer);
  const char* sentences[] = {
      "The quick brown fox jumps over the lazy dog near the river bank.",
      "A paged key-value cache lets many users share one GPU without copying prompts.",
      "She bought fresh bread, two apples and a bottle of milk at the corner shop.",
      "The committee will meet again next Tuesday to review the budget proposal.",
      "Rain is expected over the mountains tonight, with snow above two thousand metres.",
      "He played the violin every evening until the neighbours finally complained.",
      "Photosynthesis converts light energy into chemical energy stored in sugars.",
      "The train to the airport leaves from platform nine every twenty minutes.",
      "Our team shipped the new release after fixing the last crash on startup.",
      "Medieval castles were built on hills so that defenders could see far away.",
      "Please remember to water the plants while I am away for the weekend.",
      "The museum's new exhibition shows paintings from the early twentieth century.",
  };
  std::vector<EncoderInput> batch;
  for (const char* t : sentences) batch.push_back({tokenizer->encode(t, true), {}});
  const auto ref = encode(*f32, batch);
  auto distance = [&](Model& m) {  // 1 - mean cosine of the mean-pooled embeddings
    const auto out = encode(m, batch);
    double sum = 0;
    for (size_t i = 0; i < out.size(); ++i) sum += kiln::cosine(out[i].mean_pooled, ref[i].mean_pooled);
    return 1.0 - sum / double(out.size());
  };
  const double plain = distance(*Model::load(dir, {.weight_dtype = "q4"}));
  QuantOptions q;
  q.mode = "gptq";
  const quant::CalibrationTable table = calibrate_gptq(dir, {}, q, QuantFormat::kQ4);
  auto report = std::make_shared<quant::GptqReport>();
  auto m = Model::load(dir, gptq_model_options({.weight_dtype = "q4"}, table, q, report));
  EXPECT_EQ(report->kept, 0);
  EXPECT_GE(report->quantized, 6 * 4);  // q|k|v, o, up, down of 6 layers (and the pooler)
  const double gptq = distance(*m);
  std::printf("all-MiniLM-L6-v2 1 - mean cosine vs f32: q4 %.4g, q4 + gptq %.4g\n", plain, gptq);
  EXPECT_GT(plain, 0.0);
  EXPECT_LT(gptq, 0.8 * plain);
}

TEST(Gptq, BadInputIsAClearError) {
  quant::GptqCollector c("layers.0.qkv_proj");
  std::vector<float> x = {1, 2, NAN, 4};
  expect_error([&] { c.observe(x.data(), 2, 2); }, ErrorCode::kInvalidArgument, "layers.0.qkv_proj");
  expect_error([&] { quant::gptq_inverse_factor({1, 0, 0, 1}, 0, 2, 0.01); }, ErrorCode::kInvalidArgument,
               "no calibration rows");
  expect_error([&] { quant::gptq_inverse_factor({1, 0, 0}, 4, 2, 0.01); }, ErrorCode::kInvalidArgument, "not [2, 2]");
  expect_error([&] { quant::gptq_inverse_factor({1, 2, 2, 1}, 1, 2, 0.0); }, ErrorCode::kInvalidArgument,
               "not positive definite");
  expect_error([&] { quant::gptq_inverse_factor({1, 0, 0, 1}, 1, 2, -1.0); }, ErrorCode::kInvalidArgument, "damping");
  const std::vector<double> u = quant::gptq_inverse_factor({2, 0, 0, 2}, 1, 2, 0.0);
  std::vector<float> w(2 * 40, 0.5f);
  expect_error([&] { quant::gptq_quantize(w.data(), 2, 40, u, {}, QuantFormat::kQ4); }, ErrorCode::kInvalidArgument,
               "multiple of 32");

  const std::string dir = testing::fixture_dir("llama");
  QuantOptions q;
  q.mode = "gptq";
  std::vector<std::vector<int32_t>> none = {{}};
  expect_error([&] { calibrate_gptq(dir, {}, q, QuantFormat::kQ4, &none); }, ErrorCode::kInvalidArgument, "empty");
  q.cache = "gptq.json";
  expect_error([&] { calibration_for(dir, {}, q); }, ErrorCode::kInvalidArgument, "not cached");
  q.cache.clear();
  q.gptq_damp = -0.5;
  expect_error([&] { quant_mode_check(q); }, ErrorCode::kInvalidArgument, "--gptq-damp");
  q.gptq_damp = 0.01;
  expect_error([&] { load_random_model("unused.json", {}, q); }, ErrorCode::kInvalidArgument, "real activations");
  QuantOptions seq_awq;
  seq_awq.mode = "awq-gptq";
  seq_awq.gptq_sequential = true;
  std::vector<std::vector<int32_t>> one = {{1, 2, 3, 4}};
  expect_error([&] { calibrate_gptq(dir, {}, seq_awq, QuantFormat::kQ4, &one); }, ErrorCode::kInvalidArgument,
               "--gptq-sequential");

  // A table without the Hessian of a Linear, or of the wrong width.
  auto f32 = Model::load(dir);
  auto calib = random_sequences(2, 16, f32->info().vocab_size, 19);
  quant::CalibrationTable t = calibrate_gptq(dir, {}, q, QuantFormat::kQ4, &calib);
  ir::Graph g = f32->graph();
  quant::CalibrationTable missing = t;
  missing.gptq.erase(missing.gptq.begin());
  expect_error([&] { quant::apply_gptq(g, missing, {}); }, ErrorCode::kNotFound, "no GPTQ Hessian");
  quant::CalibrationTable narrow = t;
  auto h = std::make_shared<quant::GptqHessian>(*narrow.gptq.begin()->second);
  h->k /= 2;
  narrow.gptq.begin()->second = h;
  expect_error([&] { quant::apply_gptq(g, narrow, {}); }, ErrorCode::kInvalidArgument, "wide");
  quant::GptqOptions awq_missing;
  awq_missing.awq_scaled = true;
  expect_error([&] { quant::apply_gptq(g, t, awq_missing); }, ErrorCode::kNotFound, "AWQ scales");
}

}  // namespace
}  // namespace kiln
