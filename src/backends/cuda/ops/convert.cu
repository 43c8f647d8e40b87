// Elementwise dtype cast (see convert.h).
#include <cstdlib>
#include <string>

#include "backends/cuda/common.cuh"
#include "backends/cuda/ops/convert.h"

namespace kiln::cuda {
namespace {

template <typename S, typename D>
__global__ void convert_kernel(const S* src, D* dst, int64_t n) {
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = from_f32<D>(to_f32<S>(src[i]));
}

template <typename D>
__global__ void fill_random_kernel(D* dst, int64_t n, uint32_t seed) {
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;  // a cheap integer hash (Knuth, xorshift)
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    dst[i] = from_f32<D>(float(h >> 8) * (2.0f / 16777216.0f) - 1.0f);
  }
}

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin_kernel(int64_t ns) {
  const uint64_t t0 = global_ns();
  while (global_ns() - t0 < uint64_t(ns)) {
  }
}

}  // namespace

namespace {
thread_local bool pdl_allowed = false;

// KILN_CUDA_PDL, read once: unset, empty or "1" (the default) decode steps and the short
// steps of a graph whose GEMMs all take part (pdl_in_step), "decode" decode steps only, "0"
// none, "all" every step; anything else is an error naming the variable.
enum class PdlSetting : uint8_t { kOff, kAuto, kDecode, kAll };
PdlSetting pdl_setting() {
  static const PdlSetting v = [] {
    const char* e = std::getenv("KILN_CUDA_PDL");
    const std::string s = e ? e : "";
    if (s.empty() || s == "1") return PdlSetting::kAuto;
    if (s == "0") return PdlSetting::kOff;
    if (s == "decode") return PdlSetting::kDecode;
    if (s == "all") return PdlSetting::kAll;
    throw_error(ErrorCode::kInvalidArgument, "KILN_CUDA_PDL='", s,
                "' (expected 1, the default: dependent launch in decode steps, and in steps of up to ",
                kPdlMaxStepRows, " token rows of a graph whose GEMMs are kiln's or CUTLASS's; decode: in decode "
                "steps only; all: in every step; or 0: never)");
  }();
  return v;
}
}  // namespace

void set_pdl_allowed(bool on) { pdl_allowed = on; }

bool pdl_in_step(bool gemms_take_part, int64_t rows) {
  const PdlSetting v = pdl_setting();
  return v == PdlSetting::kAll || (v == PdlSetting::kAuto && gemms_take_part && rows <= kPdlMaxStepRows);
}

bool pdl_enabled() {
  if (!pdl_allowed || pdl_setting() == PdlSetting::kOff) return false;
  constexpr int kMaxDevices = 64;
  static int8_t by_device[kMaxDevices] = {};  // 0 unknown, 1 yes, -1 no
  int dev = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= kMaxDevices) return false;
  if (by_device[dev] == 0) {
    int major = 0;
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    by_device[dev] = major >= 9 ? 1 : -1;
  }
  return by_device[dev] > 0;
}

void launch_spin(int64_t us, cudaStream_t s) {
  spin_kernel<<<1, 1, 0, s>>>(us * 1000);
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_fill_random(void* dst, DType t, int64_t n, uint32_t seed, cudaStream_t s) {
  if (n == 0) return;
  KILN_CUDA_DISPATCH_FLOAT(t, D, {
    launch_k(fill_random_kernel<D>, grid_for(n, 256), 256, 0, s, static_cast<D*>(dst), n, seed);
  });
  KILN_CUDA_CHECK_LAUNCH();
}

void launch_convert(const void* src, DType from, void* dst, DType to, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  KILN_CUDA_DISPATCH_FLOAT(from, S, KILN_CUDA_DISPATCH_FLOAT(to, D, {
    launch_k(convert_kernel<S, D>, grid_for(n, 256), 256, 0, s, static_cast<const S*>(src), static_cast<D*>(dst), n);
  }));
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
