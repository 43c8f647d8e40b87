// Shared helpers for the CPU kernel conformance tests: seeded random inputs, running a
// check under every ISA the machine supports, and error reports that print the worst case.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/kernels/isa.h"
#include "backends/cpu/kernels/kernels.h"

namespace kiln::cpu::testing {

inline std::vector<float> random_floats(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Runs f once per supported ISA (scalar fallback, AVX2, and AVX2 with the AVX-512
// kernels where the CPU has AVX-512), labelling failures.
template <typename F>
void for_each_isa(F f) {
  const CpuIsa saved = cpu_isa();
  const bool saved512 = avx512_enabled() || cpu_isa() != CpuIsa::kAvx2;
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2}) {
    if (!cpu_isa_supported(isa)) continue;
    cpu_isa_set(isa);
    for (bool avx512 : {false, true}) {
      cpu_avx512_set(avx512);
      if (avx512 && !avx512_enabled()) continue;  // scalar, or no AVX-512 here
      SCOPED_TRACE(std::string("isa=") + cpu_isa_name(isa) + (avx512 ? "+avx512" : ""));
      f();
    }
  }
  cpu_isa_set(saved);
  cpu_avx512_set(saved512);
}

// Expects |got[i] - ref[i]| <= tol[i] everywhere; reports the count and the worst index.
inline void expect_within(const std::vector<float>& got, const std::vector<double>& ref,
                          const std::vector<double>& tol, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size());
  size_t bad = 0, worst = 0;
  double worst_ratio = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - ref[i]);
    const double ratio = std::isnan(got[i]) ? INFINITY : err == 0 ? 0.0 : err / tol[i];
    if (!(ratio <= 1.0)) ++bad;
    if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " out of bound; worst at "
                     << worst << ": got " << got[worst] << " ref " << ref[worst] << " tol "
                     << tol[worst];
}

}  // namespace kiln::cpu::testing
