// Helpers for engine tests: a scratch directory, file bytes, and building an engine
// from a fixture model.
#pragma once

#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "../models/golden_util.h"
#include "builder/builder.h"

namespace kiln::testing {

inline std::filesystem::path scratch_dir() {
  auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  // The pid keeps concurrent runs of the suite (several build trees) out of each other's way.
  auto dir = std::filesystem::temp_directory_path() / (std::string("kiln_engine_") + info->test_suite_name() + "_" +
                                                       info->name() + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline std::string read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_bytes(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

inline BuildReport build_fixture(const std::string& model, const std::filesystem::path& out, bool tune = false) {
  BuildOptions o;
  o.model = fixture_dir(model);
  o.output = out.string();
  o.tune = tune;
  return build_engine(o);
}

}  // namespace kiln::testing
