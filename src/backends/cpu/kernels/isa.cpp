// Run-time ISA choice for the CPU kernels: AVX2+FMA+F16C when the CPU has them, unless
// KILN_CPU_ISA=scalar, and on that path the AVX-512 linear kernel where the CPU has
// AVX-512F/BW/VL, unless KILN_CPU_AVX512=0. Tests flip both (cpu_isa_set, cpu_avx512_set).
#include <cpuid.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "backends/cpu/kernels/isa.h"
#include "core/env_switch.h"
#include "core/status.h"

namespace kiln::cpu {
namespace {

CpuIsa detect() {
  if (const char* env = std::getenv("KILN_CPU_ISA"); env && std::strcmp(env, "scalar") == 0)
    return CpuIsa::kScalar;
  return cpu_isa_supported(CpuIsa::kAvx2) ? CpuIsa::kAvx2 : CpuIsa::kScalar;
}

std::atomic<CpuIsa>& current() {
  static std::atomic<CpuIsa> isa{detect()};
  return isa;
}

}  // namespace

bool cpu_isa_supported(CpuIsa isa) {
  if (isa == CpuIsa::kScalar) return true;
  __builtin_cpu_init();
  // F16C from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports has no "f16c";
  // the AVX2 check covers the OS's saving of the AVX state that F16C also uses.
  unsigned a = 0, b = 0, c = 0, d = 0;
  const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
}

CpuIsa cpu_isa() { return current().load(std::memory_order_relaxed); }

namespace {
bool avx512_hardware() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
}
std::atomic<bool>& avx512_on() {
  static std::atomic<bool> on{[] {
    // 1 or unset: where the CPU has it; 0: AVX2 only; anything else an error naming it.
    return env_switch("KILN_CPU_AVX512", "the AVX-512 linear kernel where the CPU has it", "AVX2 kernels only") &&
           avx512_hardware();
  }()};
  return on;
}
}  // namespace

bool avx512_enabled() { return use_avx2() && avx512_on().load(std::memory_order_relaxed); }

namespace {
std::atomic<QGemvActs>& qgemv_acts() {
  static std::atomic<QGemvActs> acts{[] {
    const char* e = std::getenv("KILN_CPU_QGEMV");
    if (!e || !*e || std::strcmp(e, "int16") == 0) return QGemvActs::kInt16;
    if (std::strcmp(e, "int8") == 0) return QGemvActs::kInt8;
    KILN_THROW_IF(std::strcmp(e, "f32") != 0, kInvalidArgument, "KILN_CPU_QGEMV='", e,
                  "': expected 'int16' (the default: q8/q4 Linears against activations rounded to two int8 "
                  "digits, where the CPU has AVX-512 VNNI), 'int8' (one digit) or 'f32' (the f32 kernels, x as "
                  "given)");
    return QGemvActs::kF32;
  }()};
  return acts;
}
}  // namespace

QGemvActs cpu_qgemv_acts() { return qgemv_acts().load(std::memory_order_relaxed); }

void cpu_qgemv_acts_set(QGemvActs acts) { qgemv_acts().store(acts, std::memory_order_relaxed); }

bool avx512_qgemv_int8_supported() {
  static const bool hw = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi");
  }();
  // The switch first: a mistyped KILN_CPU_QGEMV is an error on every CPU, not only on those
  // where it would matter.
  return cpu_qgemv_acts() != QGemvActs::kF32 && hw && avx512_enabled();
}

void cpu_avx512_set(bool on) { avx512_on().store(on && avx512_hardware(), std::memory_order_relaxed); }

void cpu_isa_set(CpuIsa isa) {
  if (!cpu_isa_supported(isa)) isa = CpuIsa::kScalar;
  current().store(isa, std::memory_order_relaxed);
}

const char* cpu_isa_name(CpuIsa isa) { return isa == CpuIsa::kAvx2 ? "avx2" : "scalar"; }

}  // namespace kiln::cpu
