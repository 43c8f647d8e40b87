// Shared helpers for the CUDA tests: skipping cleanly without a GPU, seeded random
// tensors rounded to the dtype under test, and running one graph on the CPU backend
// (the reference) and the CUDA backend over the same steps, comparing every output
// with a bound relative to max|ref| (ggml's test-backend-ops model).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/cpu/kernels/kernels.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/ops/norm.h"
#include "core/dtype.h"
#include "core/status.h"
#include "ir/graph.h"

namespace kiln::cuda::testing {

// The CPU reference of these tests multiplies q8/q4 weights by x as given, as the CUDA
// backend's f32 and mma kernels do (the dp4a GEMV's rounding has its own bounds): the CPU's
// int8-activation GEMV (AVX-512 VNNI hosts, tested in the CPU suites) is off in every
// binary that includes this header.
class CpuQGemvF32Reference : public ::testing::Environment {
 public:
  void SetUp() override { cpu::cpu_qgemv_acts_set(cpu::QGemvActs::kF32); }
};
inline ::testing::Environment* const kCpuQGemvF32Reference =
    ::testing::AddGlobalTestEnvironment(new CpuQGemvF32Reference);

#define KILN_SKIP_WITHOUT_CUDA()                                                          \
  do {                                                                                    \
    if (::kiln::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible: skipped"; \
  } while (0)

// Fixtures: KILN_FIXTURES_DIR from the environment (the device machine has the tree
// elsewhere), else the source tree's.
inline std::string fixtures_dir() {
  if (const char* e = std::getenv("KILN_FIXTURES_DIR")) return e;
  return KILN_FIXTURES_DIR;
}

// The real SmolLM2-135M-Instruct GGUF: KILN_SMOLLM2_GGUF (the device run carries a copy
// of its first blocks, scripts/cuda_gguf_truncate.py), else KILN_MODELS_DIR or the source
// tree's .cache/models (scripts/fetch_models.sh). The tests skip when it is absent.
inline std::string smollm2_gguf_path() {
  if (const char* e = std::getenv("KILN_SMOLLM2_GGUF")) return e;
  const char* dir = std::getenv("KILN_MODELS_DIR");
  return std::string(dir ? dir : KILN_SOURCE_DIR "/.cache/models") +
         "/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf";
}

// Sets an environment variable for a scope (compiled graphs and prepared ops read the
// backend's switches once, when they are compiled or prepared).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_)
      setenv(name_, old_->c_str(), 1);
    else
      unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// A device buffer (optionally a copy of host bytes), freed at scope exit; host<T>(n)
// copies its first n T back.
class Dev {
 public:
  explicit Dev(size_t bytes) { KILN_CUDA_CHECK(cudaMalloc(&p_, std::max<size_t>(bytes, 1))); }
  Dev(const void* host, size_t bytes) : Dev(bytes) {
    KILN_CUDA_CHECK(cudaMemcpy(p_, host, bytes, cudaMemcpyHostToDevice));
  }
  ~Dev() { cudaFree(p_); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  void* get() const { return p_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  template <typename T = uint8_t>
  std::vector<T> host(size_t n) const {
    std::vector<T> h(n);
    KILN_CUDA_CHECK(cudaMemcpy(h.data(), p_, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }

 private:
  void* p_ = nullptr;
};

// Forces the short-row norm kernel (ops/norm.h: KILN_CUDA_NORM_SHORT) for a scope; the
// launchers read it at every launch.
class ScopedNormShort {
 public:
  explicit ScopedNormShort(NormShort mode) { set_norm_short_mode(mode); }
  ~ScopedNormShort() { set_norm_short_mode(std::nullopt); }
  ScopedNormShort(const ScopedNormShort&) = delete;
  ScopedNormShort& operator=(const ScopedNormShort&) = delete;
};

// Per-dtype bound on max|cuda - cpu| / max|cpu| for single ops on inputs already
// rounded to the dtype: f32 is rounding noise, f16/bf16 about 4 output ulps.
inline double op_tolerance(const std::string& dtype) {
  if (dtype == "f32") return 2e-5;
  if (dtype == "f16") return 2e-3;
  return 1e-2;
}

inline DType storage_dtype(const std::string& dtype) {
  return dtype == "f32" ? DType::kF32 : dtype == "f16" ? DType::kF16 : DType::kBF16;
}

// A random f32 tensor whose values are exactly representable in `dtype`.
inline Tensor random_tensor(std::vector<int64_t> shape, std::mt19937_64& rng, const std::string& dtype,
                            float lo = -1.0f, float hi = 1.0f) {
  Tensor t(DType::kF32, std::move(shape));
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = dist(rng);
  return t.to(storage_dtype(dtype)).to(DType::kF32);
}

struct Diff {
  double max_err = 0, max_ref = 0;
  double rel() const { return max_ref > 0 ? max_err / max_ref : max_err; }
};

inline Diff diff(const Tensor& got, const Tensor& ref) {
  Diff d;
  EXPECT_EQ(got.shape(), ref.shape());
  if (got.shape() != ref.shape()) {
    d.max_err = INFINITY;
    return d;
  }
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double g = got.data_as<float>()[i], r = ref.data_as<float>()[i];
    d.max_err = std::isnan(g) ? INFINITY : std::max(d.max_err, std::fabs(g - r));
    d.max_ref = std::max(d.max_ref, std::fabs(r));
  }
  return d;
}

// One step over sequences of these lengths, back to back, each a whole prompt with no KV
// cache (slots -1: an encoder, or a graph whose attention reads K/V in place).
inline StepInfo cacheless_step(const std::vector<int32_t>& lens) {
  StepInfo step;
  int32_t t = 0;
  for (int32_t n : lens) {
    step.seqs.push_back({t, n, n, {}});
    t += n;
  }
  step.slot_mapping.assign(size_t(t), -1);
  return step;
}

// The node called `name` in g (kNotFound naming it when there is none).
inline const ir::Node& node_named(const ir::Graph& g, const std::string& name) {
  for (const ir::Node& n : g.nodes())
    if (n.name == name) return n;
  throw_error(ErrorCode::kNotFound, "no node ", name);
}

// Every output of `got` equals `ref`'s bit for bit and is not all zeros (a fused graph
// against the same graph unfused); one line per output, prefixed with `what`.
inline void expect_outputs_bit_identical(const TensorMap& got, const TensorMap& ref, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (auto& [name, r] : ref) {
    const Tensor& g = got.at(name);
    ASSERT_EQ(g.shape(), r.shape()) << what << " output " << name;
    size_t bad = 0;
    float max_ref = 0;
    for (int64_t i = 0; i < r.numel(); ++i) {
      max_ref = std::max(max_ref, std::fabs(r.data_as<float>()[i]));
      bad += f32_bits(g.data_as<float>()[i]) != f32_bits(r.data_as<float>()[i]);
    }
    std::printf("  %s %-8s %lld values, %zu differ, max|ref| %.3g\n", what.c_str(), name.c_str(),
                (long long)r.numel(), bad, max_ref);
    EXPECT_EQ(bad, 0u) << what << " output " << name;
    EXPECT_GT(max_ref, 0.0f) << what << " output " << name << " is all zeros";
  }
}

// One step of a graph run: inputs and step layout.
struct StepCase {
  TensorMap inputs;
  StepInfo step;
};

// Compiles `g` on the CPU backend with `cpu_opt` and the CUDA backend with `gpu_opt`, runs
// the steps in order on each (with KV pools of `kv` layout when it has layers) and checks
// every output of every step: max|cuda - cpu| <= tol * max|cpu|.
inline void expect_backends_match_opts(const ir::Graph& g, const std::vector<StepCase>& steps,
                                       const CompileOptions& cpu_opt, const CompileOptions& gpu_opt, double tol,
                                       const std::string& what, const KvLayout& kv = {}) {
  auto cpu = create_backend("cpu");
  auto gpu = create_backend("cuda");
  auto cg = cpu->compile(g, cpu_opt);
  auto gg = gpu->compile(g, gpu_opt);
  std::unique_ptr<KvStorage> ckv, gkv;
  if (kv.num_layers > 0) {
    ckv = cpu->allocate_kv(kv);
    gkv = gpu->allocate_kv(kv);
  }
  for (size_t i = 0; i < steps.size(); ++i) {
    TensorMap want = cg->run(steps[i].inputs, steps[i].step, ckv.get());
    TensorMap got = gg->run(steps[i].inputs, steps[i].step, gkv.get());
    for (auto& [name, ref] : want) {
      ASSERT_TRUE(got.count(name)) << what << ": output " << name << " missing";
      Diff d = diff(got.at(name), ref);
      std::printf("  %-52s %-4s step %zu %-8s max|err| %.3g  max|ref| %.3g  rel %.3g\n", what.c_str(),
                  gpu_opt.weight_dtype.c_str(), i, name.c_str(), d.max_err, d.max_ref, d.rel());
      EXPECT_LE(d.rel(), tol) << what << " (" << gpu_opt.weight_dtype << ") step " << i << " output " << name;
    }
  }
}

// The CPU in f32 as the reference, CUDA with `dtype`.
inline void expect_backends_match(const ir::Graph& g, const std::vector<StepCase>& steps, const std::string& dtype,
                                  double tol, const std::string& what, const KvLayout& kv = {}) {
  expect_backends_match_opts(g, steps, {.weight_dtype = "f32"}, {.weight_dtype = dtype}, tol, what, kv);
}

inline const std::vector<std::string>& all_dtypes() {
  static const std::vector<std::string> v = {"f32", "f16", "bf16"};
  return v;
}

}  // namespace kiln::cuda::testing
