// Bad model directories get clear errors naming what is wrong: unknown model_type,
// a tensor of the wrong shape, a missing tensor, a config missing a key, a truncated
// weights file; random-weight models build for benchmarks.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "golden_util.h"
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

TEST_F(ModelErrors, UnsupportedRopeScaling) {
  config_["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  std::string e = load_error();
  EXPECT_NE(e.find("yarn"), std::string::npos) << e;
}

TEST(RandomWeights, BuildsRealShapesWithoutCheckpoint) {
  auto m = Model::load_random(std::string(KILN_SOURCE_DIR) + "/bench/configs/tiny-llama-test.json");
  EXPECT_EQ(m->info().family, "llama");
  EXPECT_GT(m->graph().weight_bytes(), 0u);
}

}  // namespace
}  // namespace kiln
