// Bad model directories get clear errors naming what is wrong: unknown model_type,
// a tensor of the wrong shape, a missing tensor, a config missing a key, a truncated
// weights file; random-weight models build for benchmarks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "golden_util.h"
#include "models/random_weights.h"
#include "runtime/model.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

class ModelErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kiln_model_errors_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    fs::copy(testing::fixture_dir("llama") + "/model.safetensors", dir_ / "model.safetensors");
    std::ifstream in(testing::fixture_dir("llama") + "/config.json");
    config_ = nlohmann::json::parse(in);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write_config() { std::ofstream(dir_ / "config.json") << config_.dump(); }
  std::string load_error() {
    write_config();
    try {
      Model::load(dir_.string());
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }

  fs::path dir_;
  nlohmann::json config_;
};

TEST_F(ModelErrors, UnknownModelType) {
  config_["model_type"] = "mamba";
  std::string e = load_error();
  EXPECT_NE(e.find("unsupported model_type 'mamba'"), std::string::npos) << e;
  EXPECT_NE(e.find("llama"), std::string::npos) << "should list supported types: " << e;
}

TEST_F(ModelErrors, WrongShapeNamesTensorAndShapes) {
  config_["intermediate_size"] = 96;  // the file holds 128
  std::string e = load_error();
  EXPECT_NE(e.find("mlp.gate_proj.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("[128, 64]"), std::string::npos) << e;
  EXPECT_NE(e.find("[96, 64]"), std::string::npos) << e;
}

TEST_F(ModelErrors, MissingTensor) {
  config_["num_hidden_layers"] = 3;  // the file holds 2 layers
  std::string e = load_error();
  EXPECT_NE(e.find("missing tensor 'model.layers.2."), std::string::npos) << e;
}

TEST_F(ModelErrors, MissingConfigKey) {
  config_.erase("hidden_size");
  std::string e = load_error();
  EXPECT_NE(e.find("hidden_size"), std::string::npos) << e;
}

TEST_F(ModelErrors, BadHeadCounts) {
  config_["num_key_value_heads"] = 3;
  std::string e = load_error();
  EXPECT_NE(e.find("num_key_value_heads"), std::string::npos) << e;
}

TEST_F(ModelErrors, TruncatedWeights) {
  fs::resize_file(dir_ / "model.safetensors", fs::file_size(dir_ / "model.safetensors") / 2);
  std::string e = load_error();
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
}

TEST_F(ModelErrors, NotAModel) {
  EXPECT_THROW(Model::load((dir_ / "nothing-here").string()), Error);
  std::ofstream(dir_ / "weights.bin") << "x";
  EXPECT_THROW(Model::load((dir_ / "weights.bin").string()), Error);
}

TEST_F(ModelErrors, ImplausibleLayerCount) {
  config_["num_hidden_layers"] = 4000000000LL;
  std::string e = load_error();
  EXPECT_NE(e.find("num_hidden_layers 4000000000"), std::string::npos) << e;
}

TEST_F(ModelErrors, UnsupportedRopeScaling) {
  config_["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 4.0}};
  std::string e = load_error();
  EXPECT_NE(e.find("'dynamic'"), std::string::npos) << e;
  EXPECT_NE(e.find("yarn"), std::string::npos) << e;  // among the supported types
}

TEST(RandomWeights, BuildsRealShapesWithoutCheckpoint) {
  auto m = Model::load_random(std::string(KILN_SOURCE_DIR) + "/bench/configs/tiny-llama-test.json");
  EXPECT_EQ(m->info().family, "llama");
  EXPECT_GT(m->graph().weight_bytes(), 0u);
}

// N(0, stddev)-like values (norm weights around 1), deterministic in (seed, name),
// different across names and seeds.
TEST(RandomWeights, SeededBellCurveWithTheAskedStddev) {
  const RandomWeightSource src(7, 0.02f);
  const Tensor a = src.make("model.layers.0.mlp.up_proj.weight", {512, 1024});
  const float* d = a.data_as<float>();
  double sum = 0, sq = 0, mx = 0;
  int64_t within_1sd = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    sum += d[i];
    sq += double(d[i]) * d[i];
    mx = std::max(mx, std::fabs(double(d[i])));
    within_1sd += std::fabs(d[i]) < 0.02f;
  }
  const double mean = sum / double(a.numel()), sd = std::sqrt(sq / double(a.numel()) - mean * mean);
  EXPECT_NEAR(mean, 0.0, 2e-4);
  EXPECT_NEAR(sd, 0.02, 4e-4);
  EXPECT_LE(mx, 0.02 * 3.47);
  EXPECT_NEAR(double(within_1sd) / double(a.numel()), 0.683, 0.03);  // bell-shaped, not uniform (0.577)
  const Tensor again = src.make("model.layers.0.mlp.up_proj.weight", {512, 1024});
  EXPECT_EQ(std::memcmp(a.data(), again.data(), a.nbytes()), 0);
  const Tensor other = src.make("model.layers.1.mlp.up_proj.weight", {512, 1024});
  EXPECT_NE(std::memcmp(a.data(), other.data(), a.nbytes()), 0);
  const Tensor norm = src.make("model.norm.weight", {4096});
  double nsum = 0;
  for (int64_t i = 0; i < norm.numel(); ++i) nsum += norm.data_as<float>()[i];
  EXPECT_NEAR(nsum / 4096.0, 1.0, 2e-3);
}

}  // namespace
}  // namespace kiln
