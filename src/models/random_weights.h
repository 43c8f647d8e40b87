// Random weights for benchmarking real model shapes without a checkpoint
// (`kiln bench --random-weights`): a WeightSource that holds nothing, which
// load_declared_weights recognizes and fills every required weight from a seeded
// normal distribution (norm weights around 1). Tested in tests/models/model_errors_test.cpp.
#pragma once

#include <cstdint>

#include "frontends/weight_source.h"

namespace kiln {

class RandomWeightSource final : public WeightSource {
 public:
  explicit RandomWeightSource(uint64_t seed = 1234, float stddev = 0.02f) : seed_(seed), stddev_(stddev) {}
  std::vector<std::string> names() const override { return {}; }
  bool has(const std::string&) const override { return false; }
  TensorInfo info(const std::string& name) const override;
  Tensor load(const std::string& name, DType want) const override;
  std::string describe() const override { return "random weights"; }

  // A tensor of `shape` for weight `name`: N(0, stddev) (or 1 + N(0, stddev) for norm
  // weights), deterministic in (seed, name).
  Tensor make(const std::string& name, const std::vector<int64_t>& shape) const;

 private:
  uint64_t seed_;
  float stddev_;
};

}  // namespace kiln
