// Host side of the fused int8 GEMM (int8_gemm_sm90.h): availability, the checks, the
// default configuration by shape and the timing of the configurations. Plain C++ (g++);
// the kernels are in int8_gemm_sm90_{bf16,f16}.cu, compiled only when KILN_HAVE_CUTLASS.
#include "backends/cuda/ops/int8_gemm_sm90.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_context.h"
#include "backends/cuda/event_timing.h"
#include "backends/cuda/ops/convert.h"
#include "backends/cuda/ops/int8_gemm_sm90_impl.h"
#include "core/log.h"
#include "core/status.h"

namespace kiln::cuda {

const char* int8_gemm_config_name(Int8GemmConfig c) {
  switch (c) {
    case Int8GemmConfig::kPingpong128x128:
      return "128x128x128 ping-pong 2x1";
    case Int8GemmConfig::kCooperative128x128:
      return "128x128x128 cooperative";
    case Int8GemmConfig::kPingpong64x128:
      return "64x128x128 ping-pong";
    case Int8GemmConfig::kCooperative128x192:
      return "128x192x128 cooperative";
  }
  return "?";
}

bool int8_gemm_sm90_available(std::string* why) {
#if KILN_HAVE_CUTLASS
  int dev = 0, major = 0, minor = 0;
  if (const cudaError_t err = cudaGetDevice(&dev); err != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it
    if (why) *why = str_cat("no CUDA device (", cudaGetErrorString(err), ")");
    return false;
  }
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  if (major == 9 && minor == 0) return true;
  if (why)
    *why = str_cat("device ", dev, " has compute capability ", major, ".", minor,
                   "; the kernel is sm_90a code");
  return false;
#else
  if (why)
    *why =
        "built without CUTLASS (no cutlass/cutlass.h under KILN_CUTLASS_DIR or no sm_90a in "
        "CMAKE_CUDA_ARCHITECTURES at configure time; see scripts/fetch_cutlass.sh)";
  return false;
#endif
}

std::vector<Int8ConfigOverride> parse_int8_config_overrides(const char* value) {
  static constexpr const char* kNames[kInt8GemmConfigs] = {"pp2x1", "coop128", "pp64", "coop192"};
  std::vector<Int8ConfigOverride> out;
  const std::string v = value ? value : "";
  for (size_t pos = 0; !v.empty() && pos <= v.size();) {
    size_t end = v.find(',', pos);
    if (end == std::string::npos) end = v.size();
    const std::string entry = v.substr(pos, end - pos);
    pos = end + 1;
    auto bad = [&](const char* why) {
      return Error(ErrorCode::kInvalidArgument,
                   str_cat("KILN_CUDA_INT8_CONFIG: entry '", entry, "' ", why,
                           " (expected NxK=NAME, NAME one of pp2x1, coop128, pp64, coop192)"));
    };
    const size_t x = entry.find('x'), eq = entry.find('=');
    if (x == std::string::npos || eq == std::string::npos || eq < x) throw bad("is not NxK=NAME");
    Int8ConfigOverride o;
    const std::string ns = entry.substr(0, x), ks = entry.substr(x + 1, eq - x - 1), name = entry.substr(eq + 1);
    auto number = [&](const std::string& s, int64_t& to) {
      if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos || std::stoll(s) <= 0)
        throw bad("has a shape that is not two positive integers");
      to = std::stoll(s);
    };
    number(ns, o.n);
    number(ks, o.k);
    const auto it = std::find(std::begin(kNames), std::end(kNames), name);
    if (it == std::end(kNames)) throw bad("names no configuration");
    o.config = Int8GemmConfig(it - std::begin(kNames));
    out.push_back(o);
  }
  return out;
}

namespace {

bool aligned16(const void* p) { return p && reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// KILN_CUDA_INT8_CONFIG's configuration for the shape n x k, if it names one.
std::optional<Int8GemmConfig> forced_config(int64_t n, int64_t k) {
  static const std::vector<Int8ConfigOverride> overrides =
      parse_int8_config_overrides(std::getenv("KILN_CUDA_INT8_CONFIG"));
  for (const Int8ConfigOverride& o : overrides)
    if (o.n == n && o.k == k) return o.config;
  return std::nullopt;
}

#if KILN_HAVE_CUTLASS
// A stand-in codes table: the checks and the workspace query only ask which kernel runs
// (any non-null table picks the codes kernel); nothing reads it.
constexpr int8_t kAnyTable = 0;

int8_sm90::Problem problem(const int8_t* x, const int8_t* w, void* y, int64_t m, int64_t n,
                           int64_t k, const Int8Epilogue& e, int sm_count, const int8_t* code_table = nullptr) {
  int8_sm90::Problem p;
  p.code_table = code_table;
  p.x = x;
  p.w = w;
  p.y = y;
  p.m = int(m);
  p.n = int(n);
  p.k = int(k);
  p.e = e;
  p.sm_count = sm_count;
  return p;
}
#endif

}  // namespace

std::string int8_gemm_sm90_check(DType out, const int8_t* x, const int8_t* w, const void* y,
                                 int64_t m, int64_t n, int64_t k, const Int8Epilogue& e,
                                 bool codes) {
  if (out != DType::kBF16 && out != DType::kF16)
    return str_cat("output dtype ", dtype_name(out), " (bf16 or f16)");
  if (codes && e.act != GemvEpilogue::kGeluErf)
    return "the codes epilogue is compiled for gelu_erf only";
  if (codes && n % 16 != 0) return str_cat("n=", n, " (16-byte rows of int8 codes: n % 16 == 0)");
  if (e.act != GemvEpilogue::kNone && e.act != GemvEpilogue::kGeluErf)
    return "activation (only none and gelu_erf are compiled; gelu_tanh, silu and swiglu take "
           "cuBLASLt)";
  if (m <= 0 || n <= 0 || k <= 0 || m >= (int64_t(1) << 31) || n >= (int64_t(1) << 31) ||
      k >= (int64_t(1) << 31))
    return str_cat("shape m=", m, " n=", n, " k=", k, " (each in [1, 2^31))");
  if (k % 16 != 0)
    return str_cat("k=", k, " (TMA needs rows of a multiple of 16 bytes: k % 16 == 0)");
  if (n % 8 != 0) return str_cat("n=", n, " (16-byte output rows: n % 8 == 0)");
  if (!aligned16(x) || !aligned16(w) || !aligned16(y)) return "x, w and y must be 16-byte aligned";
  if (!aligned16(e.w_scale) || (e.row_scale && !aligned16(e.row_scale)) ||
      (e.bias && !aligned16(e.bias)))
    return "w_scale, row_scale and bias must be 16-byte aligned";
#if KILN_HAVE_CUTLASS
  const int8_sm90::Problem p = problem(x, w, const_cast<void*>(y), m, n, k, e, 1, codes ? &kAnyTable : nullptr);
  const std::string st = out == DType::kBF16
                             ? int8_sm90::Ops<DType::kBF16>::check(Int8GemmConfig{}, p)
                             : int8_sm90::Ops<DType::kF16>::check(Int8GemmConfig{}, p);
  if (!st.empty()) return "CUTLASS can_implement: " + st;
  return "";
#else
  return "built without CUTLASS";
#endif
}

size_t int8_gemm_sm90_workspace(Int8GemmConfig c, DType out, int64_t m, int64_t n, int64_t k,
                                GemvEpilogue act, bool codes) {
#if KILN_HAVE_CUTLASS
  Int8Epilogue e;
  e.act = act;
  const int8_sm90::Problem p = problem(nullptr, nullptr, nullptr, m, n, k, e, 1, codes ? &kAnyTable : nullptr);
  return out == DType::kBF16 ? int8_sm90::Ops<DType::kBF16>::workspace(c, p)
                             : int8_sm90::Ops<DType::kF16>::workspace(c, p);
#else
  return 0;
#endif
}

void launch_int8_gemm_sm90(Int8GemmConfig c, DType out, const int8_t* x, const int8_t* w, int64_t m,
                           int64_t n, int64_t k, const Int8Epilogue& e, void* y, void* workspace,
                           size_t workspace_bytes, int sm_count, cudaStream_t s, const int8_t* code_table) {
#if KILN_HAVE_CUTLASS
  const int8_sm90::Problem p = problem(x, w, y, m, n, k, e, sm_count, code_table);
  if (out == DType::kBF16) {
    KILN_THROW_IF(int8_sm90::Ops<DType::kBF16>::workspace(c, p) > workspace_bytes, kInternal,
                  "cuda int8 gemm (sm90): workspace of ", workspace_bytes, " bytes is too small");
    int8_sm90::Ops<DType::kBF16>::run(c, p, workspace, s);
  } else {
    KILN_THROW_IF(out != DType::kF16, kInternal, "cuda int8 gemm (sm90): output dtype ",
                  dtype_name(out));
    KILN_THROW_IF(int8_sm90::Ops<DType::kF16>::workspace(c, p) > workspace_bytes, kInternal,
                  "cuda int8 gemm (sm90): workspace of ", workspace_bytes, " bytes is too small");
    int8_sm90::Ops<DType::kF16>::run(c, p, workspace, s);
  }
#else
  throw_error(ErrorCode::kInternal, "cuda int8 gemm (sm90): built without CUTLASS");
#endif
}

Int8GemmConfig int8_gemm_sm90_default(int64_t m, int64_t n, int sm_count) {
  const int64_t tiles = (m + 127) / 128 * ((n + 127) / 128);
  if (m <= 64 || tiles < 2 * int64_t(std::max(sm_count, 1))) return Int8GemmConfig::kPingpong64x128;
  return Int8GemmConfig::kPingpong128x128;
}

Int8GemmPlan int8_gemm_sm90_tune(DType out, const int8_t* w, int64_t n, int64_t k,
                                 const Int8Epilogue& e, bool per_token, int sm_count,
                                 cudaStream_t s, std::vector<Int8GemmTiming>* timings,
                                 const int8_t* code_table) {
  using Key = std::tuple<int, DType, int64_t, int64_t, GemvEpilogue, bool, bool>;
  static std::mutex mu;
  static std::map<Key, std::pair<Int8GemmPlan, std::vector<Int8GemmTiming>>> cache;
  int dev = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  const bool codes = code_table != nullptr;
  KILN_THROW_IF(codes && e.act != GemvEpilogue::kGeluErf, kInternal,
                "cuda int8 gemm (sm90): the codes epilogue is timed with gelu_erf only");
  const Key key{dev, out, n, k, e.act, per_token, codes};
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find(key); it != cache.end()) {
      if (timings) *timings = it->second.second;
      return it->second.first;
    }
  }
  // Row buckets whose output would pass kMaxTuneBytes (an LM head at 4096 rows: 1 GiB)
  // keep the default configuration, untimed.
  constexpr size_t kMaxTuneBytes = size_t(256) << 20;
  const size_t out_bytes = codes ? 1 : dtype_size(out);
  auto timed = [&](int64_t m) { return size_t(m * n) * out_bytes <= kMaxTuneBytes; };
  int64_t max_m = kInt8GemmTuneRows.front();
  for (int64_t m : kInt8GemmTuneRows)
    if (timed(m)) max_m = std::max(max_m, m);
  DeviceBuffer xb(size_t(max_m * k)), yb(size_t(max_m * n) * out_bytes),
      rs(size_t(max_m) * 4);
  launch_fill_random(xb.get(), DType::kF32, max_m * k / 4, 21, s);  // any bytes are int8 codes
  launch_fill_random(rs.get(), DType::kF32, max_m, 22, s);
  Int8Epilogue te = e;
  te.row_scale = per_token ? static_cast<const float*>(rs.get()) : nullptr;
  Int8GemmPlan plan;
  plan.tuned = true;
  std::vector<Int8GemmTiming> all;
  for (size_t b = 0; b < kInt8GemmTuneRows.size(); ++b) {
    const int64_t m = kInt8GemmTuneRows[b];
    float best = 0;
    plan.by_bucket[b] = int8_gemm_sm90_default(m, n, sm_count);
    if (!timed(m) && b > 0) continue;
    for (int ci = 0; ci < kInt8GemmConfigs; ++ci) {
      const auto c = Int8GemmConfig(ci);
      // The 128 x 192 tiles only from the 1024-row bucket on: at 128 rows BERT-base's
      // Linears get 4-12 such CTAs for 132 SMs, 1.5-2x the 64 x 128 tiles' time in graphs
      // (cuda_int8_gemm_bench, H200, session 48).
      if (c == Int8GemmConfig::kCooperative128x192 && m < 1024) continue;
      const size_t ws_bytes = int8_gemm_sm90_workspace(c, out, m, n, k, e.act, codes);
      DeviceBuffer ws(ws_bytes);
      auto run = [&] {
        launch_int8_gemm_sm90(c, out, static_cast<const int8_t*>(xb.get()), w, m, n, k, te,
                              yb.get(), ws.get(), ws_bytes, sm_count, s, code_table);
      };
      // Eager launches: at 4096 rows they read ~2x the graph times (CUTLASS's host work is
      // in them), yet the configurations timed inside CUDA graphs of 10 launches ran BERT-base
      // W8A8 b32 3.5% slower end to end (bench/RESULTS.md, session 49).
      const float ms = median_launch_ms(s, 5, run);
      all.push_back({m, c, ms});
      if (ci == 0 || ms < best) {
        best = ms;
        plan.by_bucket[b] = c;
      }
    }
  }
  KILN_CUDA_CHECK(cudaStreamSynchronize(s));
  if (const auto forced = forced_config(n, k)) {
    plan.by_bucket.fill(*forced);
    log_info("cuda: int8 gemm (sm90) n=", n, " k=", k, ": ", int8_gemm_config_name(*forced),
             " at every row count (KILN_CUDA_INT8_CONFIG)");
  }
  std::lock_guard<std::mutex> lock(mu);
  cache[key] = {plan, all};
  if (timings) *timings = std::move(all);
  return plan;
}

}  // namespace kiln::cuda
