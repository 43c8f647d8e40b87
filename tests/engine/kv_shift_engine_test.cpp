// The KV key shift an engine records (schema 1.4; `kiln build --kv-calib`): the build
// measures what a load of the checkpoint measures, a load with the default --kv-calib
// takes it from the file (same decode as the checkpoint), other --kv-calib text measures
// anew, "none" records unshifted keys, a tensor-parallel engine's ranks hold their own
// K/V heads' shares of the unsharded shift, and a bad record is a clear load error.
// The llama fixture gets the trained SentencePiece-BPE tokenizer (500 ids, inside its
// 512-token vocabulary) so the build has text to calibrate on.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "engine_test_util.h"
#include "runtime/kv_calibration.h"
#include "runtime/llm_runner.h"

namespace kiln {
namespace {

using testing::scratch_dir;

std::filesystem::path llama_with_tokenizer(const std::filesystem::path& dir) {
  const auto model = dir / "model";
  std::filesystem::copy(testing::fixture_dir("llama"), model);
  std::filesystem::copy_file(std::string(KILN_FIXTURES_DIR) + "/tokenizer/trained/spm_bpe.tokenizer.json",
                             model / "tokenizer.json");
  return model;
}

BuildOptions options(const std::filesystem::path& model, const std::filesystem::path& out) {
  BuildOptions o;
  o.model = model.string();
  o.output = out.string();
  o.tune = false;
  return o;
}

ModelOptions kv_options(const std::string& dtype, const std::string& calib = "default", int tp = 0) {
  ModelOptions mo;
  mo.kv_cache_dtype = dtype;
  mo.kv_calib = calib;
  mo.tensor_parallel = tp;
  return mo;
}

void expect_near(const std::vector<float>& got, const std::vector<float>& want, float tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  float worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
  EXPECT_LE(worst, tol) << what;
}

std::string load_error(const std::filesystem::path& path) {
  try {
    engine_load(path.string());
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidFile) << e.what();
    return e.what();
  }
  return "";
}

TEST(KvShiftEngine, BuildRecordsTheShiftTheCheckpointMeasures) {
  auto dir = scratch_dir();
  const auto model = llama_with_tokenizer(dir);
  const auto path = dir / "l.kiln";
  BuildReport report = build_engine(options(model, path));
  EXPECT_EQ(report.kv_key_shift, "measured on 640 tokens of the built-in calibration set");

  EngineContents e = engine_load(path.string());
  ASSERT_TRUE(e.kv_key_shift.recorded);
  EXPECT_EQ(e.kv_key_shift.source, "the built-in calibration set");
  EXPECT_EQ(e.kv_key_shift.tokens, 640u);  // 5 sequences of the fixture's 128 positions
  ASSERT_EQ(e.kv_key_shift.values.size(), size_t(2 * 2 * 16));

  // The checkpoint, loaded for an fp8 cache, measures the same shift at load.
  auto checkpoint = Model::load(model.string(), kv_options("fp8"));
  calibrate_kv_key_shift(*checkpoint);
  ASSERT_TRUE(checkpoint->kv_key_shift());
  expect_near(e.kv_key_shift.values, *checkpoint->kv_key_shift(), 1e-6f, "build vs checkpoint");
  float largest = 0;
  for (float v : e.kv_key_shift.values) largest = std::max(largest, std::fabs(v));
  EXPECT_GT(largest, 1e-3f) << "a measured shift is not all zeros";

  // The engine loads it instead of measuring; its fp8 decode is the checkpoint's.
  auto engine = Model::load(path.string(), kv_options("fp8"));
  ASSERT_TRUE(engine->kv_key_shift_measured());
  ASSERT_TRUE(engine->kv_key_shift());
  EXPECT_EQ(*engine->kv_key_shift(), e.kv_key_shift.values);
  EXPECT_EQ(engine->kv_key_shift_source(), "the built-in calibration set");
  const std::vector<std::vector<int32_t>> prompts = {{5, 17, 99, 300, 42}, {7, 8, 9}};
  EXPECT_EQ(LlmRunner(*engine).generate_greedy(prompts, 24), LlmRunner(*checkpoint).generate_greedy(prompts, 24));

  // Other text is measured anew; none stores keys unshifted.
  const auto text = dir / "calib.txt";
  testing::write_bytes(text, "the quick brown fox jumps over the lazy dog. " + std::string(40, 'a') +
                                 " a second sentence, with other words in it; and a third one.");
  auto other = Model::load(path.string(), kv_options("int8", text.string()));
  EXPECT_FALSE(other->kv_key_shift_measured());
  LlmRunner runner(*other);
  ASSERT_TRUE(other->kv_key_shift());
  EXPECT_EQ(other->kv_key_shift_source(), "'" + text.string() + "'");
  EXPECT_NE(*other->kv_key_shift(), e.kv_key_shift.values);
  auto none = Model::load(path.string(), kv_options("fp8", "none"));
  LlmRunner none_runner(*none);
  EXPECT_TRUE(none->kv_key_shift_measured());
  EXPECT_FALSE(none->kv_key_shift());
}

TEST(KvShiftEngine, NoneAndNoTokenizer) {
  auto dir = scratch_dir();
  const auto model = llama_with_tokenizer(dir);
  BuildOptions o = options(model, dir / "none.kiln");
  o.kv_calib = "none";
  EXPECT_EQ(build_engine(o).kv_key_shift, "none");
  EngineContents e = engine_load(o.output);
  EXPECT_TRUE(e.kv_key_shift.recorded);
  EXPECT_EQ(e.kv_key_shift.source, "none");
  EXPECT_TRUE(e.kv_key_shift.values.empty());
  auto m = Model::load(o.output, kv_options("fp8"));
  EXPECT_TRUE(m->kv_key_shift_measured()) << "the engine's none is used, not measured over";
  EXPECT_FALSE(m->kv_key_shift());

  // No tokenizer: nothing to calibrate on, nothing recorded (a load measures, finds none).
  BuildReport plain = testing::build_fixture("llama", dir / "plain.kiln");
  EXPECT_EQ(plain.kv_key_shift, "");
  EXPECT_FALSE(engine_load((dir / "plain.kiln").string()).kv_key_shift.recorded);
  // An encoder records none.
  testing::build_fixture("bert", dir / "bert.kiln");
  EXPECT_FALSE(engine_load((dir / "bert.kiln").string()).kv_key_shift.recorded);

  // A calibration file that is missing fails the build, naming it.
  o.kv_calib = (dir / "missing.txt").string();
  o.output = (dir / "x.kiln").string();
  try {
    build_engine(o);
    ADD_FAILURE() << "built with a missing calibration file";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("missing.txt"), std::string::npos) << err.what();
  }
  EXPECT_FALSE(std::filesystem::exists(o.output));
}

// A tokenizer whose ids the model cannot embed: under the default text the build records no
// shift (the keys stay unshifted, with a warning); calibration text the user named is an
// error that names the id, the vocabulary and the way around it.
TEST(KvShiftEngine, ForeignTokenizer) {
  auto dir = scratch_dir();
  std::filesystem::copy(testing::fixture_dir("gpt2"), dir / "model");
  std::filesystem::copy_file(std::string(KILN_FIXTURES_DIR) + "/tokenizer/trained/gpt2_bpe.tokenizer.json",
                             dir / "model" / "tokenizer.json");  // 600 ids, the fixture embeds 512
  BuildOptions o = options(dir / "model", dir / "g.kiln");
  EXPECT_EQ(build_engine(o).kv_key_shift, "");
  EXPECT_FALSE(engine_load(o.output).kv_key_shift.recorded);
  const auto text = dir / "calib.txt";
  testing::write_bytes(text, "text whose ids run past the fixture's vocabulary: zebra quixotic jukebox vortex");
  o.kv_calib = text.string();
  o.output = (dir / "x.kiln").string();
  try {
    build_engine(o);
    ADD_FAILURE() << "built with ids past the vocabulary";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("outside the model's vocabulary of 512"), std::string::npos) << msg;
    EXPECT_NE(msg.find("--kv-calib none"), std::string::npos) << msg;
  }
}

// Rank r of a TP=2 engine holds K/V head r (the fixture has 2): its share of the
// unsharded shift, measured on the sharded model (its partial sums in another order).
TEST(KvShiftEngine, TensorParallelRanksHoldTheirHeads) {
  auto dir = scratch_dir();
  const auto model = llama_with_tokenizer(dir);
  BuildOptions o = options(model, dir / "tp.kiln");
  o.tensor_parallel = 2;
  build_engine(o);
  EngineContents e = engine_load(o.output);
  ASSERT_TRUE(e.kv_key_shift.recorded);
  EXPECT_TRUE(e.kv_key_shift.values.empty()) << "a TP engine's shift is in its ranks";
  auto unsharded = Model::load(model.string(), kv_options("fp8"));
  calibrate_kv_key_shift(*unsharded);
  const std::vector<float>& full = *unsharded->kv_key_shift();  // [2 layers, 2 heads, 16]
  auto engine = Model::load(o.output, kv_options("fp8"));
  ASSERT_EQ(engine->tp_world(), 2);
  for (int r = 0; r < 2; ++r) {
    const std::vector<float>& stored = e.ranks[size_t(r)].kv_key_shift;
    std::vector<float> want;
    for (int l = 0; l < 2; ++l) want.insert(want.end(), full.begin() + (l * 2 + r) * 16, full.begin() + (l * 2 + r + 1) * 16);
    expect_near(stored, want, 1e-4f, str_cat("rank ", r));
    ASSERT_TRUE(engine->tp_rank(r).kv_key_shift());
    EXPECT_EQ(*engine->tp_rank(r).kv_key_shift(), stored);
  }
}

// A record that does not fit the pool, is not finite, or contradicts itself is refused.
TEST(KvShiftEngine, BadRecordsAreLoadErrors) {
  auto dir = scratch_dir();
  const auto path = dir / "l.kiln";
  build_engine(options(llama_with_tokenizer(dir), path));
  const EngineContents good = engine_load(path.string());
  auto rewrite = [&](const std::string& name, auto&& change) {
    EngineContents e = engine_load(path.string());
    change(e);
    const auto out = dir / name;
    engine_write(out.string(), e);
    return load_error(out);
  };
  auto has = [](const std::string& msg, const std::string& want) {
    EXPECT_NE(msg.find(want), std::string::npos) << "'" << msg << "' should say '" << want << "'";
  };
  has(rewrite("short.kiln", [](EngineContents& e) { e.kv_key_shift.values.pop_back(); }),
      "KV key shift holds 63 values, but 2 layers x 2 K/V heads x head_dim 16 need 64");
  has(rewrite("nan.kiln",
              [](EngineContents& e) { e.kv_key_shift.values[5] = std::numeric_limits<float>::quiet_NaN(); }),
      "KV key shift value 5 is not finite");
  has(rewrite("none_values.kiln", [](EngineContents& e) { e.kv_key_shift.source = "none"; }),
      "KV key shift 'none' holds values");
  has(rewrite("empty.kiln", [](EngineContents& e) { e.kv_key_shift.values.clear(); }), "holds no values");
  // Unchanged, it loads.
  EXPECT_EQ(rewrite("same.kiln", [](EngineContents&) {}), "");
  EXPECT_EQ(engine_load((dir / "same.kiln").string()).kv_key_shift.values, good.kv_key_shift.values);
}

}  // namespace
}  // namespace kiln
