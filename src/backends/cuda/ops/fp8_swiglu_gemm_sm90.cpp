// Host side of the fused FP8 gate|up GEMM (fp8_swiglu_gemm_sm90.h): checks, the weight
// interleave, the default configuration and the timing of the configurations. Plain C++;
// the kernels are in fp8_swiglu_gemm_sm90.cu, compiled only when KILN_HAVE_CUTLASS.
#include "backends/cuda/ops/fp8_swiglu_gemm_sm90.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_context.h"
#include "backends/cuda/event_timing.h"
#include "backends/cuda/ops/convert.h"
#include "backends/cuda/ops/fp8.h"
#include "backends/cuda/ops/fp8_swiglu_gemm_sm90_impl.h"
#include "backends/cuda/ops/int8_gemm_sm90.h"
#include "core/dtype.h"
#include "core/status.h"

namespace kiln::cuda {

const char* fp8_swiglu_config_name(Fp8SwigluConfig c) {
  switch (c) {
    case Fp8SwigluConfig::kCooperative128x128:
      return "128x128x128 cooperative";
    case Fp8SwigluConfig::kCooperative128x128Cluster2:
      return "128x128x128 cooperative 2x1";
    case Fp8SwigluConfig::kPingpong64x128:
      return "64x128x128 ping-pong";
  }
  return "?";
}

bool fp8_swiglu_gemm_available(std::string* why) { return int8_gemm_sm90_available(why); }

namespace {

bool aligned16(const void* p) { return p && reinterpret_cast<uintptr_t>(p) % 16 == 0; }

#if KILN_HAVE_CUTLASS
fp8_swiglu_sm90::Problem problem(const uint8_t* x, const uint8_t* w, uint8_t* y, int64_t m, int64_t n, int64_t k,
                                 float scale, float inv, int sm_count) {
  fp8_swiglu_sm90::Problem p;
  p.x = x;
  p.w = w;
  p.y = y;
  p.m = int(m);
  p.n = int(n);
  p.k = int(k);
  p.scale = scale;
  p.inv = inv;
  p.sm_count = sm_count;
  return p;
}
#endif

}  // namespace

std::string fp8_swiglu_gemm_check(const uint8_t* x, const uint8_t* w, const uint8_t* y, int64_t m, int64_t n,
                                  int64_t k) {
  if (m <= 0 || n <= 0 || k <= 0 || m >= (int64_t(1) << 31) || n >= (int64_t(1) << 31) || k >= (int64_t(1) << 31))
    return str_cat("shape m=", m, " n=", n, " k=", k, " (each in [1, 2^31))");
  if (n % (2 * kFp8SwigluBlock) != 0)
    return str_cat("n=", n, " (whole blocks of ", kFp8SwigluBlock, " gate and ", kFp8SwigluBlock, " up rows: n % ",
                   2 * kFp8SwigluBlock, " == 0)");
  if (k % 16 != 0) return str_cat("k=", k, " (TMA needs rows of a multiple of 16 bytes: k % 16 == 0)");
  if (!aligned16(x) || !aligned16(w) || !aligned16(y)) return "x, w and y must be 16-byte aligned";
#if KILN_HAVE_CUTLASS
  const std::string st = fp8_swiglu_sm90::check(Fp8SwigluConfig{}, problem(x, w, const_cast<uint8_t*>(y), m, n, k,
                                                                           1.0f, 1.0f, 1));
  if (!st.empty()) return "CUTLASS can_implement: " + st;
  return "";
#else
  return "built without CUTLASS";
#endif
}

size_t fp8_swiglu_gemm_workspace(Fp8SwigluConfig c, int64_t m, int64_t n, int64_t k) {
#if KILN_HAVE_CUTLASS
  return fp8_swiglu_sm90::workspace(c, problem(nullptr, nullptr, nullptr, m, n, k, 1.0f, 1.0f, 1));
#else
  (void)c, (void)m, (void)n, (void)k;
  return 0;
#endif
}

void launch_fp8_swiglu_gemm(Fp8SwigluConfig c, const uint8_t* x, const uint8_t* w, int64_t m, int64_t n, int64_t k,
                            float scale, float inv, uint8_t* y, void* workspace, size_t workspace_bytes,
                            int sm_count, cudaStream_t s) {
#if KILN_HAVE_CUTLASS
  const fp8_swiglu_sm90::Problem p = problem(x, w, y, m, n, k, scale, inv, sm_count);
  KILN_THROW_IF(fp8_swiglu_sm90::workspace(c, p) > workspace_bytes, kInternal,
                "cuda fp8 swiglu gemm (sm90): workspace of ", workspace_bytes, " bytes is too small");
  fp8_swiglu_sm90::run(c, p, workspace, s);
#else
  (void)c, (void)x, (void)w, (void)m, (void)n, (void)k, (void)scale, (void)inv, (void)y, (void)workspace;
  (void)workspace_bytes, (void)sm_count, (void)s;
  throw_error(ErrorCode::kInternal, "cuda fp8 swiglu gemm (sm90): built without CUTLASS");
#endif
}

void fp8_swiglu_interleave_rows(const uint8_t* src, uint8_t* dst, int64_t inter, int64_t k) {
  KILN_THROW_IF(inter % kFp8SwigluBlock != 0, kInternal, "fp8 swiglu interleave: ", inter,
                " gate rows (a multiple of ", kFp8SwigluBlock, ")");
  const size_t block = size_t(kFp8SwigluBlock * k);
  for (int64_t b = 0; b < inter / kFp8SwigluBlock; ++b) {
    std::memcpy(dst + 2 * b * block, src + b * block, block);
    std::memcpy(dst + (2 * b + 1) * block, src + size_t(inter * k) + b * block, block);
  }
}

Fp8SwigluConfig fp8_swiglu_gemm_default(int64_t m) {
  return m <= 256 ? Fp8SwigluConfig::kPingpong64x128 : Fp8SwigluConfig::kCooperative128x128;
}

Fp8SwigluPlan fp8_swiglu_gemm_tune(const uint8_t* w, int64_t n, int64_t k, int sm_count, cudaStream_t s,
                                   std::vector<Fp8SwigluTiming>* timings) {
  using Key = std::tuple<int, int64_t, int64_t>;
  static std::mutex mu;
  static std::map<Key, std::pair<Fp8SwigluPlan, std::vector<Fp8SwigluTiming>>> cache;
  int dev = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  const Key key{dev, n, k};
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find(key); it != cache.end()) {
      if (timings) *timings = it->second.second;
      return it->second.first;
    }
  }
  const int64_t max_m = kFp8SwigluTuneRows.back();
  DeviceBuffer xb(size_t(max_m * k)), yb(size_t(max_m * n / 2));
  // Random bf16 values quantized to E4M3 codes (never NaN codes), scale 1.
  {
    DeviceBuffer xf(size_t(max_m * k) * 2);
    launch_fill_random(xf.get(), DType::kBF16, max_m * k, 31, s);
    launch_fp8_quantize(DType::kBF16, xf.get(), max_m * k, 1.0f, static_cast<uint8_t*>(xb.get()), s);
    KILN_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  Fp8SwigluPlan plan;
  std::vector<Fp8SwigluTiming> all;
  for (size_t b = 0; b < kFp8SwigluTuneRows.size(); ++b) {
    const int64_t m = kFp8SwigluTuneRows[b];
    float best = 0;
    plan.by_bucket[b] = fp8_swiglu_gemm_default(m);
    for (int ci = 0; ci < kFp8SwigluConfigs; ++ci) {
      const auto c = Fp8SwigluConfig(ci);
      const size_t ws_bytes = fp8_swiglu_gemm_workspace(c, m, n, k);
      DeviceBuffer ws(ws_bytes);
      auto run = [&] {
        launch_fp8_swiglu_gemm(c, static_cast<const uint8_t*>(xb.get()), w, m, n, k, 1e-3f, 1.0f,
                               static_cast<uint8_t*>(yb.get()), ws.get(), ws_bytes, sm_count, s);
      };
      const float ms = median_launch_ms(s, 5, run);
      all.push_back({m, c, ms});
      if (ci == 0 || ms < best) {
        best = ms;
        plan.by_bucket[b] = c;
      }
    }
  }
  KILN_CUDA_CHECK(cudaStreamSynchronize(s));
  std::lock_guard<std::mutex> lock(mu);
  cache[key] = {plan, all};
  if (timings) *timings = std::move(all);
  return plan;
}

}  // namespace kiln::cuda
