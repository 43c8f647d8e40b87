// Key centering of the int8/fp8 KV cache (runtime/kv_calibration.h): the measured shift
// against the mean key computed here from GPT-2's weights (layer 0's keys are
// LayerNorm(wte + wpe) times the K columns of c_attn, no RoPE), the pool's read_keys and
// shift checks, decode through a shifted cache against the f32 cache, the options and
// errors, and on the real SmolLM2 (skipped when absent) the shift's measured gain: the
// fp8 cache's token distributions move less from the f32 cache's with it than without.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>

#include "backends/cpu/cpu_ops.h"
#include "core/mapped_file.h"
#include "backends/cpu/kernels/kernels.h"
#include "frontends/weight_source.h"
#include "golden_util.h"
#include "runtime/kv_calibration.h"
#include "runtime/llm_runner.h"
#include "runtime/model_tokenizer.h"

namespace kiln {
namespace {

std::vector<int32_t> random_ids(size_t n, int32_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> u(3, vocab - 1);
  std::vector<int32_t> ids(n);
  for (int32_t& x : ids) x = u(rng);
  return ids;
}

// GPT-2 (fixture: 4 heads of 16, 128 positions): each calibration sequence is 128 tokens
// (kKvCalibLengths capped by the positions), so 700 ids make 5 sequences; layer 0's key
// of token t at position p is LayerNorm(wte[t] + wpe[p]) . W_k + b_k, and the shift is the
// mean over sequences of each sequence's keys weighted by n - p.
TEST(KvCalibration, GptShiftIsTheWeightedMeanKeyOfLayerZero) {
  const std::string dir = testing::fixture_dir("gpt2");
  ModelOptions mo;
  mo.kv_cache_dtype = "fp8";
  auto model = Model::load(dir, mo);
  const auto ids = random_ids(700, 512, 3);
  calibrate_kv_key_shift(*model, ids, "random ids");
  ASSERT_TRUE(model->kv_key_shift_measured());
  auto shift = model->kv_key_shift();
  ASSERT_TRUE(shift);
  ASSERT_EQ(shift->size(), size_t(2 * 64));

  auto src = open_safetensors_source(dir + "/model.safetensors");
  auto load = [&](const std::string& name) {
    Tensor t = src->load(name, DType::kF32);
    return std::vector<float>(t.data_as<float>(), t.data_as<float>() + t.numel());
  };
  const auto wte = load("transformer.wte.weight"), wpe = load("transformer.wpe.weight");
  const auto g = load("transformer.h.0.ln_1.weight"), b = load("transformer.h.0.ln_1.bias");
  const auto w = load("transformer.h.0.attn.c_attn.weight"), bias = load("transformer.h.0.attn.c_attn.bias");
  const int e = 64, n = 128, seqs = 5;
  std::vector<double> want(size_t(e), 0.0);
  for (int s = 0; s < seqs; ++s)
    for (int p = 0; p < n; ++p) {
      const int32_t tok = ids[size_t(s * n + p)];
      std::vector<double> x(static_cast<size_t>(e));
      double mean = 0, var = 0;
      for (int i = 0; i < e; ++i) mean += x[size_t(i)] = double(wte[size_t(tok * e + i)]) + wpe[size_t(p * e + i)];
      mean /= e;
      for (int i = 0; i < e; ++i) var += (x[size_t(i)] - mean) * (x[size_t(i)] - mean);
      const double inv = 1.0 / std::sqrt(var / e + 1e-5);
      for (int i = 0; i < e; ++i) x[size_t(i)] = (x[size_t(i)] - mean) * inv * g[size_t(i)] + b[size_t(i)];
      const double weight = double(n - p) / (double(n) * (n + 1) / 2) / seqs;
      for (int c = 0; c < e; ++c) {
        double k = bias[size_t(e + c)];
        for (int i = 0; i < e; ++i) k += x[size_t(i)] * w[size_t(i * 3 * e + e + c)];
        want[size_t(c)] += k * weight;
      }
    }
  double worst = 0, scale = 0;
  for (int c = 0; c < e; ++c) {
    worst = std::max(worst, std::fabs(double((*shift)[size_t(c)]) - want[size_t(c)]));
    scale = std::max(scale, std::fabs(want[size_t(c)]));
  }
  std::printf("gpt2 layer 0 key shift: max |error| %.3g of max |shift| %.3g\n", worst, scale);
  EXPECT_GT(scale, 0.05);
  EXPECT_LE(worst, 1e-5 * std::max(1.0, scale));
}

// Decode through an fp8 / int8 cache whose keys are shifted by the calibrated mean stays as
// close to the f32 cache as the unshifted cache's bounds (decoder_golden_test.cpp): the
// softmax does not see the shift; nor does it see the key rotation (KvLayout::k_rotate),
// with and without which the cache is run. The fixtures have no tokenizer, so the ids
// are random.
TEST(KvCalibration, ShiftedCacheDecodeStaysCloseToF32Cache) {
  for (const std::string family : {"llama", "qwen2", "gpt2"})
    for (const std::string kv : {"int8", "fp8"})
    for (bool rotate : {false, true}) {
      SCOPED_TRACE(family + " " + kv + (rotate ? " rotated" : ""));
      auto f32_model = Model::load(testing::fixture_dir(family));
      ModelOptions mo;
      mo.kv_cache_dtype = kv;
      mo.kv_rotate = rotate;
      auto q_model = Model::load(testing::fixture_dir(family), mo);
      calibrate_kv_key_shift(*q_model, random_ids(600, int32_t(q_model->info().vocab_size), 9), "random ids");
      ASSERT_TRUE(q_model->kv_key_shift());
      testing::Reference ref(family);
      const auto prompts = ref.prompts();
      const int64_t vocab = f32_model->info().vocab_size;
      LlmRunner f32(*f32_model), qr(*q_model);
      int32_t sf = f32.add_sequence(prompts[0]), sq = qr.add_sequence(prompts[0]);
      double worst = 0;
      for (int i = 0; i < 8; ++i) {
        auto of = f32.step(), oq = qr.step();
        ASSERT_EQ(oq.size(), 1u);
        double m = 0, d = 0;
        for (int64_t v = 0; v < vocab; ++v) {
          m = std::max(m, double(std::fabs(of[0].logits[size_t(v)])));
          d = std::max(d, double(std::fabs(of[0].logits[size_t(v)] - oq[0].logits[size_t(v)])));
        }
        worst = std::max(worst, d / m);
        const int32_t next = argmax(of[0].logits.data(), vocab);
        f32.append_tokens(sf, {next});
        qr.append_tokens(sq, {next});
      }
      std::printf("%s %s KV with key shift%s: max |logit diff| / max |logit| %.3g\n", family.c_str(), kv.c_str(),
                  rotate ? " and rotation" : "", worst);
      EXPECT_LE(worst, kv == "int8" ? 0.1 : 0.3);
    }
}

// Gemma 2 caps its scores (cap tanh(s / cap)) before the softmax, which then would not
// cancel a shift: its layers keep their keys unshifted, and decode stays close.
TEST(KvCalibration, SoftCappedLayersStayUnshifted) {
  ModelOptions mo;
  mo.kv_cache_dtype = "fp8";
  auto model = Model::load(testing::fixture_dir("gemma2"), mo);
  calibrate_kv_key_shift(*model, random_ids(600, int32_t(model->info().vocab_size), 4), "random ids");
  ASSERT_TRUE(model->kv_key_shift());
  for (float x : *model->kv_key_shift()) ASSERT_EQ(x, 0.0f);
  auto gemma3 = Model::load(testing::fixture_dir("gemma3"), mo);  // no soft cap: shifted
  calibrate_kv_key_shift(*gemma3, random_ids(600, int32_t(gemma3->info().vocab_size), 4), "random ids");
  double largest = 0;
  for (float x : *gemma3->kv_key_shift()) largest = std::max(largest, double(std::fabs(x)));
  EXPECT_GT(largest, 0.0);
}

TEST(KvCalibration, OptionsAndErrors) {
  const std::string dir = testing::fixture_dir("llama");
  ModelOptions mo;
  mo.kv_cache_dtype = "fp8";
  {
    // No tokenizer: the runner's calibration stores no shift and the model runs.
    auto model = Model::load(dir, mo);
    LlmRunner runner(*model);
    EXPECT_TRUE(model->kv_key_shift_measured());
    EXPECT_FALSE(model->kv_key_shift());
    EXPECT_THROW(calibrate_kv_key_shift(*model, random_ids(15, 256, 1), "15 ids"), Error);
  }
  {
    mo.kv_calib = "none";
    auto model = Model::load(dir, mo);
    calibrate_kv_key_shift(*model, random_ids(64, 256, 1), "ids");  // explicit ids still measure
    EXPECT_TRUE(model->kv_key_shift());
    auto other = Model::load(dir, mo);
    LlmRunner runner(*other);
    EXPECT_TRUE(other->kv_key_shift_measured());
    EXPECT_FALSE(other->kv_key_shift()) << "--kv-calib none stores no shift";
  }
  {
    mo.kv_calib = "/no/such/file.txt";
    auto model = Model::load(dir, mo);
    try {
      calibrate_kv_key_shift(*model);
      FAIL() << "expected an error naming the missing file";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--kv-calib: no text file '/no/such/file.txt'"), std::string::npos) << e.what();
    }
  }
  {
    // The auto cache never calibrates.
    auto model = Model::load(dir);
    LlmRunner runner(*model);
    EXPECT_FALSE(model->kv_key_shift_measured());
  }
}

TEST(KvCalibration, PoolChecksTheShiftAndReadsKeys) {
  KvLayout layout{.num_layers = 2, .num_blocks = 3, .block_size = 4, .num_kv_heads = 2, .head_dim = 8,
                  .dtype = KvDType::kFp8};
  layout.k_shift = std::make_shared<std::vector<float>>(size_t(2 * 2 * 8 - 1), 0.5f);
  try {
    cpu::CpuKv kv(layout);
    FAIL() << "a key shift of the wrong size must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("key shift"), std::string::npos) << e.what();
  }
  auto bad = std::make_shared<std::vector<float>>(size_t(2 * 2 * 8), 0.5f);
  (*bad)[5] = NAN;
  layout.k_shift = bad;
  EXPECT_THROW(cpu::CpuKv{layout}, Error);
  layout.k_shift = std::make_shared<std::vector<float>>(size_t(2 * 2 * 8), 0.5f);
  cpu::CpuKv quantized(layout);
  ASSERT_NE(quantized.k_shift(1), nullptr);
  EXPECT_EQ(quantized.k_shift(1) - quantized.k_shift(0), 16);
  std::vector<float> out(16);
  const int64_t slot[1] = {0};
  EXPECT_THROW(quantized.read_keys(0, slot, out.data()), Error) << "a quantized pool has no keys to read back";

  layout.dtype = KvDType::kAuto;
  cpu::CpuKv exact(layout);
  EXPECT_EQ(exact.k_shift(0), nullptr) << "an auto pool ignores the shift";
  std::vector<float> k(2 * 16), v(2 * 16);
  for (size_t i = 0; i < k.size(); ++i) k[i] = float(i) + 0.25f;
  const int64_t slots[2] = {7, 2};
  cpu::kv_cache_write(k.data(), v.data(), slots, 2, 2, 8, exact.k(1), exact.v(1));
  std::vector<float> got(2 * 16);
  const int64_t read[2] = {2, 7};
  exact.read_keys(1, read, got.data());
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(got[size_t(c)], k[size_t(16 + c)]);
    EXPECT_EQ(got[size_t(16 + c)], k[size_t(c)]);
  }
  const int64_t past[1] = {12};
  EXPECT_THROW(exact.read_keys(1, past, got.data()), Error);
  EXPECT_THROW(exact.read_keys(2, read, got.data()), Error);
}

// The real decoder: mean KL(f32 cache || fp8 cache) of the next-token distributions over
// 255 positions of a text the calibration set does not contain, with the built-in
// calibration's key shift and without. bench/RESULTS.md (2026-12-06) has the perplexity.
TEST(KvCalibration, RealDecoderFp8KeyShiftCutsDistributionError) {
  const std::string path = testing::models_dir() + "/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf";
  const std::string text_path = "/usr/share/common-licenses/GPL-3";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "real model not found at " << path;
  if (!std::filesystem::exists(text_path)) GTEST_SKIP() << text_path << " not found";
  auto f32_model = Model::load(path);
  ModelOptions none, shifted, rotated;
  none.kv_cache_dtype = shifted.kv_cache_dtype = rotated.kv_cache_dtype = "fp8";
  none.kv_calib = "none";
  none.kv_rotate = shifted.kv_rotate = false;  // rotated: the shift and the rotation (the default)
  auto m_none = Model::load(path, none), m_shift = Model::load(path, shifted), m_rot = Model::load(path, rotated);
  auto tokenizer = load_model_tokenizer(*f32_model);
  ASSERT_TRUE(tokenizer);
  const std::vector<int32_t> all = tokenizer->encode(read_text_file(text_path), false);
  ASSERT_GE(all.size(), 1256u);
  const std::vector<int32_t> prompt(all.begin() + 1000, all.begin() + 1256);
  auto logprobs = [&](Model& m) {
    LlmRunner runner(m);
    KvSequence kv;
    StepChunk chunk{&kv, prompt, false, /*all_logits=*/true};
    auto rows = runner.run_chunks({&chunk, 1});
    for (auto& r : rows) {
      double mx = -INFINITY, sum = 0;
      for (float x : r) mx = std::max(mx, double(x));
      for (float x : r) sum += std::exp(double(x) - mx);
      const double lse = mx + std::log(sum);
      for (float& x : r) x = float(double(x) - lse);
    }
    return rows;
  };
  const auto ref = logprobs(*f32_model), a = logprobs(*m_none), b = logprobs(*m_shift), c = logprobs(*m_rot);
  ASSERT_TRUE(m_shift->kv_key_shift()) << "the GGUF's tokenizer reads the built-in calibration set";
  auto mean_kl = [&](const std::vector<std::vector<float>>& got) {
    double total = 0;
    for (size_t r = 1; r < ref.size(); ++r)
      for (size_t v = 0; v < ref[r].size(); ++v)
        total += std::exp(double(ref[r][v])) * (double(ref[r][v]) - got[r][v]);
    return total / double(ref.size() - 1);
  };
  const double kl_none = mean_kl(a), kl_shift = mean_kl(b), kl_rot = mean_kl(c);
  std::printf("SmolLM2 fp8 KV: mean KL vs the f32 cache %.4g without the key shift, %.4g with it, %.4g with the "
              "shift and the key rotation\n", kl_none, kl_shift, kl_rot);
  EXPECT_GT(kl_none, 0.0);
  EXPECT_LT(kl_shift, 0.85 * kl_none);
  EXPECT_GT(kl_rot, 0.0);
  EXPECT_LT(kl_rot, 0.9 * kl_shift);
}

}  // namespace
}  // namespace kiln
