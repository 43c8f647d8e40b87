// Helpers for pass tests: random weights/inputs, and running a graph on the CPU
// backend as one no-cache step (one sequence covering all T rows), so a graph can be
// compared before and after a pass.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backends/cpu/cpu_backend.h"
#include "ir/graph.h"

namespace kiln::testing {

inline Tensor random_tensor(std::vector<int64_t> shape, uint32_t seed, float scale = 0.5f, float offset = 0) {
  Tensor t(DType::kF32, std::move(shape));
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = offset + d(rng);
  return t;
}

inline size_t count_ops(const ir::Graph& g, const std::string& op) {
  size_t n = 0;
  for (auto& node : g.nodes()) n += node.op == op;
  return n;
}

// Runs `g` once over T rows; float inputs get random values (same seed -> same data),
// i32 inputs get 0..T-1 (positions, row ids).
inline TensorMap run_graph(const ir::Graph& g, int64_t t, uint32_t seed = 7) {
  TensorMap in;
  for (ir::ValueId id : g.inputs()) {
    const ir::Value& v = g.value(id);
    std::vector<int64_t> shape;
    for (auto& d : v.shape.dims()) shape.push_back(d.is_concrete() ? d.value : t);
    if (v.dtype == DType::kI32) {
      Tensor x(DType::kI32, shape);
      for (int64_t i = 0; i < x.numel(); ++i) x.data_as<int32_t>()[i] = int32_t(i % t);
      in[v.name] = x;
    } else {
      in[v.name] = random_tensor(shape, seed + uint32_t(id));
    }
  }
  StepInfo step;
  step.slot_mapping.assign(size_t(t), -1);
  step.seqs.push_back({0, int32_t(t), int32_t(t), {}});
  auto compiled = create_cpu_backend()->compile(g, {});
  TensorMap out;
  for (auto& [name, tensor] : compiled->run(in, step, nullptr)) out[name] = tensor.clone();
  return out;
}

inline void expect_same_outputs(const TensorMap& a, const TensorMap& b, double tol) {
  ASSERT_EQ(a.size(), b.size());
  for (auto& [name, ta] : a) {
    const Tensor& tb = b.at(name);
    ASSERT_EQ(ta.shape(), tb.shape()) << name;
    double err = 0, ref = 0;
    for (int64_t i = 0; i < ta.numel(); ++i) {
      err = std::max(err, double(std::fabs(ta.data_as<float>()[i] - tb.data_as<float>()[i])));
      ref = std::max(ref, double(std::fabs(ta.data_as<float>()[i])));
    }
    std::printf("  %-12s max|err| %.3g  max|ref| %.3g\n", name.c_str(), err, ref);
    EXPECT_LE(err, tol * std::max(ref, 1e-6)) << name;
  }
}

}  // namespace kiln::testing
