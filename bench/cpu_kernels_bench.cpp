// cpu_kernels_bench: measures this machine's ceilings (STREAM-like triad and read-only sum
// over buffers far beyond the LLC, a register-only FMA loop on all threads) and reports the
// CPU kernels against them: linear at T=1 (GB/s of weights f32/bf16/q8/q4, % of read bandwidth), at
// T=128/512 (GFLOP/s, % of FMA peak; also with cold weights, rotated over copies beyond the
// LLC as a model's forward sees them), and paged-attention decode. Median of N timed repeats
// after warm-up; every kernel output is checked against a scalar reference before timing.
// Usage: cpu_kernels_bench [--sweep] [--gemv] [--qrows]  (--sweep: time every LinearTactic
// at large T; --gemv: ceilings and T=1 only; --qrows: q8/q4 Linears at 1-128 rows, the
// int8-activation path against the f32 kernels, nothing else)
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "backends/cpu/kernels/isa.h"
#include "backends/cpu/kernels/kernels.h"
#include "core/thread_pool.h"

using namespace kiln;
using namespace kiln::cpu;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median seconds of `reps` runs of f after `warmup` runs.
double time_median(const std::function<void()>& f, int reps, int warmup = 2) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> t(reps);
  for (int i = 0; i < reps; ++i) {
    const double t0 = now_s();
    f();
    t[i] = now_s() - t0;
  }
  std::sort(t.begin(), t.end());
  return t[reps / 2];
}

std::vector<float> random_floats(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

ThreadPool& pool() { return ThreadPool::global(); }

// ---- ceilings -------------------------------------------------------------------------
double triad_gbs() {
  const size_t n = size_t(64) << 20;  // 3 arrays × 256 MB
  std::vector<float> a(n), b(n, 1.0f), c(n, 2.0f);
  const double s = time_median([&] {
    pool().parallel_for(int64_t(n), [&](int64_t lo, int64_t hi, int) {
      for (int64_t i = lo; i < hi; ++i) a[i] = b[i] + 3.0f * c[i];
    }, 1 << 16);
  }, 5, 1);
  return 3.0 * n * 4 / s / 1e9;
}

__attribute__((target("avx2,fma"))) float sum_avx2(const float* p, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  for (int64_t i = 0; i + 32 <= n; i += 32) {
    s0 = _mm256_add_ps(s0, _mm256_loadu_ps(p + i));
    s1 = _mm256_add_ps(s1, _mm256_loadu_ps(p + i + 8));
    s2 = _mm256_add_ps(s2, _mm256_loadu_ps(p + i + 16));
    s3 = _mm256_add_ps(s3, _mm256_loadu_ps(p + i + 24));
  }
  float out[8];
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}

double read_gbs() {
  const size_t n = size_t(128) << 20;  // 512 MB
  std::vector<float> a(n, 1.0f);
  std::vector<float> partial(pool().num_threads());
  const double s = time_median([&] {
    pool().parallel_for(int64_t(n), [&](int64_t lo, int64_t hi, int th) {
      partial[th] = sum_avx2(a.data() + lo, hi - lo);
    }, 1 << 16);
  }, 5, 1);
  return double(n) * 4 / s / 1e9;
}

__attribute__((target("avx2,fma"))) float fma_loop(int64_t iters) {
  __m256 acc[12];
#pragma GCC unroll 12
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(float(i) * 1e-3f);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12  // keeps the 12 accumulators in registers (checked in the disassembly)
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  float out[8], s = 0;
  for (int i = 0; i < 12; ++i) {
    _mm256_storeu_ps(out, acc[i]);
    s += out[0];
  }
  return s;
}

// The same with 512-bit FMAs (where the linear kernels use AVX-512: isa.h).
__attribute__((target("avx512f"))) float fma_loop_zmm(int64_t iters) {
  __m512 acc[12];
#pragma GCC unroll 12
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(float(i) * 1e-3f);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  float s = 0;
  for (int i = 0; i < 12; ++i) s += _mm512_reduce_add_ps(acc[i]);
  return s;
}

double fma_peak_gflops(bool zmm = false) {
  const int64_t iters = 20'000'000;
  const int nt = pool().num_threads();
  std::vector<float> sink(nt);
  const double s = time_median([&] {
    pool().parallel_for(nt, [&](int64_t lo, int64_t hi, int th) {
      for (int64_t i = lo; i < hi; ++i) sink[th] += zmm ? fma_loop_zmm(iters) : fma_loop(iters);
    }, 1);
  }, 3, 1);
  return double(nt) * iters * 12 * (zmm ? 16 : 8) * 2 / s / 1e9;
}

// ---- linear ---------------------------------------------------------------------------
// Checks y against a double reference on a few outputs (bench must not hide failures).
bool linear_ok(const std::vector<float>& x, const std::vector<float>& w, const float* y, int64_t t,
               int64_t n, int64_t k, double rel) {
  for (int64_t s = 0; s < 64; ++s) {
    const int64_t i = (s * 7919) % t, j = (s * 104729) % n;
    double ref = 0, mag = 0;
    for (int64_t kk = 0; kk < k; ++kk) {
      ref += double(x[i * k + kk]) * w[j * k + kk];
      mag += std::fabs(double(x[i * k + kk]) * w[j * k + kk]);
    }
    if (std::fabs(y[i * n + j] - ref) > rel * mag + 1e-6) return false;
  }
  return true;
}

struct Shape { const char* name; int64_t k, n; };

void bench_gemv(double read_bw) {
  const Shape shapes[] = {{"attn.qkv", 768, 2304}, {"attn.proj", 768, 768}, {"mlp.fc", 768, 3072},
                          {"mlp.proj", 3072, 768}, {"lm_head", 768, 50257}};
  std::printf("\n## linear T=1 (decode GEMV), weights streamed once per call\n");
  std::printf("%-10s %-11s %-5s %9s %9s %12s %12s %8s\n", "shape", "K->N", "store", "MB", "hot us",
              "hot GB/s", "cold GB/s", "%readBW");
  for (const auto& sh : shapes)
    for (WeightStorage st : {WeightStorage::kF32, WeightStorage::kBF16, WeightStorage::kQ8, WeightStorage::kQ4}) {
      auto w = random_floats(size_t(sh.n * sh.k), 1);
      auto x = random_floats(size_t(sh.k), 2);
      // The bound against the f32 weights: f32 exact up to summation order, the others their
      // rounding (bf16 8 bits; q8 / q4 codes per group of 32, errors of ~1/254 / ~1/30 of
      // the group's range, mostly cancelling in the sum).
      const double tol = st == WeightStorage::kF32 ? 1e-5 : st == WeightStorage::kQ4 ? 0.1 : 2e-2;
      // Cold: rotate over enough packed copies to exceed the LLC, so weights come from DRAM.
      PackedWeight first = pack_weight(w.data(), sh.n, sh.k, st);
      const size_t copies = std::max<size_t>(1, std::min<size_t>(64, (size_t(800) << 20) / first.bytes() + 1));
      std::vector<PackedWeight> pws{first};
      for (size_t c = 1; c < copies; ++c) pws.push_back(pack_weight(w.data(), sh.n, sh.k, st));
      std::vector<float> y(sh.n);
      linear(x.data(), 1, sh.k, first, nullptr, y.data());
      const bool ok = linear_ok(x, w, y.data(), 1, sh.n, sh.k, tol);
      const double hot = time_median([&] { linear(x.data(), 1, sh.k, first, nullptr, y.data()); }, 51, 5);
      size_t next = 0;
      const double cold = time_median([&] {
        linear(x.data(), 1, sh.k, pws[next++ % copies], nullptr, y.data());
      }, std::max<int>(21, int(copies)), int(copies));
      const double mb = first.bytes() / 1e6;
      std::printf("%-10s %5lld->%-5lld %-5s %9.2f %9.1f %12.1f %12.1f %7.0f%%%s\n", sh.name,
                  (long long)sh.k, (long long)sh.n, weight_storage_name(st), mb, hot * 1e6,
                  mb / 1e3 / hot, mb / 1e3 / cold, 100.0 * mb / 1e3 / cold / read_bw,
                  ok ? "" : "  WRONG RESULT");
    }
}

void bench_gemm(double peak, bool sweep) {
  const Shape shapes[] = {{"attn.qkv", 768, 2304}, {"mlp.fc", 768, 3072}, {"mlp.proj", 3072, 768}};
  std::printf("\n## linear T=128/512 (prefill GEMM), default tactic\n");
  std::printf("%-10s %-11s %5s %-5s %10s %10s %8s\n", "shape", "K->N", "T", "store", "ms", "GFLOP/s",
              "%peak");
  for (const auto& sh : shapes)
    for (int64_t t : {128, 512})
      for (WeightStorage st : {WeightStorage::kF32, WeightStorage::kBF16}) {
        auto w = random_floats(size_t(sh.n * sh.k), 1);
        auto x = random_floats(size_t(t * sh.k), 2);
        PackedWeight pw = pack_weight(w.data(), sh.n, sh.k, st);
        std::vector<float> y(t * sh.n);
        linear(x.data(), t, sh.k, pw, nullptr, y.data());
        const bool ok = linear_ok(x, w, y.data(), t, sh.n, sh.k, st == WeightStorage::kF32 ? 1e-5 : 1e-2);
        // With AVX-512: the default against the one-panel 12 x 16 tile (the earlier default),
        // alternating rounds so that the shared host's drift hits both alike.
        const bool ab = avx512_enabled();
        const LinearTactic one_panel{12, sh.k <= 1024 ? sh.k : 256, LinearSplit::kAuto, 0, 1};
        std::vector<double> sa, sb;
        for (int round = 0; round < (ab ? 3 : 1); ++round) {
          sa.push_back(time_median([&] { linear(x.data(), t, sh.k, pw, nullptr, y.data()); }, ab ? 5 : 11));
          if (ab) sb.push_back(time_median([&] { linear(x.data(), t, sh.k, pw, nullptr, y.data(), one_panel); }, 5));
        }
        std::sort(sa.begin(), sa.end());
        std::sort(sb.begin(), sb.end());
        const double s = sa[sa.size() / 2];
        const double gf = 2.0 * t * sh.n * sh.k / s / 1e9;
        // Cold weights, as in a model's forward (each Linear's panels were evicted by the
        // other layers' since its last call): rotate over copies exceeding the LLC.
        const size_t copies = std::max<size_t>(2, std::min<size_t>(48, (size_t(600) << 20) / pw.bytes() + 1));
        std::vector<PackedWeight> pws;
        for (size_t c = 0; c < copies; ++c) pws.push_back(pack_weight(w.data(), sh.n, sh.k, st));
        size_t next = 0;
        const double cold = time_median([&] { linear(x.data(), t, sh.k, pws[next++ % copies], nullptr, y.data()); },
                                        std::max<int>(11, int(copies)), int(copies));
        std::printf("%-10s %5lld->%-5lld %5lld %-5s %10.3f %10.1f %7.0f%%  cold %8.3f ms %7.1f GFLOP/s", sh.name,
                    (long long)sh.k, (long long)sh.n, (long long)t, weight_storage_name(st), s * 1e3, gf, 100 * gf / peak,
                    cold * 1e3, 2.0 * t * sh.n * sh.k / cold / 1e9);
        if (ab) std::printf("   12x16: %8.3f ms %7.1f GFLOP/s (x%.2f)", sb[1] * 1e3, 2.0 * t * sh.n * sh.k / sb[1] / 1e9, sb[1] / s);
        std::printf("%s\n", ok ? "" : "  WRONG RESULT");
        if (st == WeightStorage::kBF16) {
          // W8A8: int8 weights per channel, int8 activations (static scale: |x| <= 1), int32
          // accumulation; GOP/s counted like the f32 FLOPs (2 per multiply-add).
          PackedInt8Weight qw = pack_weight_int8(w.data(), sh.n, sh.k);
          linear_int8(x.data(), t, sh.k, qw, 1.0f / 127.0f, nullptr, y.data());
          const bool qok = linear_ok(x, w, y.data(), t, sh.n, sh.k, 3e-2);
          const double qs = time_median([&] { linear_int8(x.data(), t, sh.k, qw, 1.0f / 127.0f, nullptr, y.data()); }, 11);
          const double qg = 2.0 * t * sh.n * sh.k / qs / 1e9;
          std::printf("%-10s %5lld->%-5lld %5lld %-5s %10.3f %10.1f %7.0f%%%s\n", sh.name, (long long)sh.k,
                      (long long)sh.n, (long long)t, "w8a8", qs * 1e3, qg, 100 * qg / peak, qok ? "" : "  WRONG RESULT");
        }
        if (!sweep || st != WeightStorage::kF32) continue;
        // Tile heights of both kernels (AVX2 up to 6 rows, AVX-512 up to 12), one or two
        // panels a call (two: the AVX-512 kernel's 32-wide tile; 1 elsewhere).
        for (int mr : {6, 12})
          for (int panels : {1, 2})
            for (int64_t kc : {128, 256, 384, 768, 3072})
              for (LinearSplit split : {LinearSplit::kPanels, LinearSplit::kRows}) {
                if (kc > sh.k || mr > (avx512_enabled() ? 12 : 6) || (panels == 2 && !avx512_enabled()))
                  continue;
                LinearTactic tac{mr, kc, split, 0, panels};
                const double ts = time_median([&] { linear(x.data(), t, sh.k, pw, nullptr, y.data(), tac); }, 7);
                std::printf("    tactic mr=%-2d panels=%d kc=%-4lld split=%-6s %10.3f ms %8.1f GFLOP/s\n", mr, panels,
                            (long long)kc, split == LinearSplit::kRows ? "rows" : "panels", ts * 1e3,
                            2.0 * t * sh.n * sh.k / ts / 1e9);
              }
      }
}

// q8/q4 Linears (SmolLM2-135M's and BERT-base's shapes) at decode to prefill row counts: the
// int8-activation path (AVX-512 VNNI, every row count) with x as two int8 digits (int16, the
// default) and as one (int8) against the f32 kernels (KILN_CPU_QGEMV=f32), hot weights,
// alternating rounds so the shared host's drift hits all three.
void bench_qrows() {
  const QGemvActs saved = cpu_qgemv_acts();
  cpu_qgemv_acts_set(QGemvActs::kInt16);
  if (!avx512_qgemv_int8_supported()) {
    cpu_qgemv_acts_set(saved);
    std::printf("\n## q8/q4 rows: no AVX-512 VNNI + VBMI here (or KILN_CPU_QGEMV=f32)\n");
    return;
  }
  const Shape shapes[] = {{"smol.gate", 576, 1536}, {"smol.down", 1536, 576}, {"smol.k", 576, 192},
                          {"bert.fc", 768, 3072}};
  const QGemvActs modes[] = {QGemvActs::kF32, QGemvActs::kInt8, QGemvActs::kInt16};
  std::printf("\n## q8/q4 linear by rows: f32 kernels vs int8-activation path, one digit (int8) and two (int16), "
              "hot weights; GFLOP/s\n");
  std::printf("%-10s %-11s %5s %-5s %9s %9s %9s %8s %8s\n", "shape", "K->N", "T", "store", "f32", "int8", "int16",
              "f32/i16", "i8/i16");
  for (const auto& sh : shapes)
    for (WeightStorage st : {WeightStorage::kQ8, WeightStorage::kQ4})
      for (int64_t t : {1, 4, 8, 16, 37, 128}) {
        auto w = random_floats(size_t(sh.n * sh.k), 1);
        auto x = random_floats(size_t(t * sh.k), 2);
        PackedWeight pw = pack_weight(w.data(), sh.n, sh.k, st);
        std::vector<float> y(size_t(t * sh.n));
        bool ok = true;
        std::vector<double> s[3];
        for (int round = 0; round < 3; ++round)
          for (int m = 0; m < 3; ++m) {
            cpu_qgemv_acts_set(modes[m]);
            linear(x.data(), t, sh.k, pw, nullptr, y.data());
            ok = ok && linear_ok(x, w, y.data(), t, sh.n, sh.k, st == WeightStorage::kQ4 ? 0.1 : 2e-2);
            s[m].push_back(time_median([&] { linear(x.data(), t, sh.k, pw, nullptr, y.data()); }, t >= 37 ? 9 : 31));
          }
        for (auto& v : s) std::sort(v.begin(), v.end());
        const double flop = 2.0 * t * sh.n * sh.k, f = s[0][1], i8 = s[1][1], i16 = s[2][1];
        std::printf("%-10s %5lld->%-5lld %5lld %-5s %9.1f %9.1f %9.1f %7.2fx %7.2fx%s\n", sh.name, (long long)sh.k,
                    (long long)sh.n, (long long)t, weight_storage_name(st), flop / f / 1e9, flop / i8 / 1e9,
                    flop / i16 / 1e9, f / i16, i8 / i16, ok ? "" : "  WRONG RESULT");
      }
  cpu_qgemv_acts_set(saved);
}

// ---- attention ------------------------------------------------------------------------
void bench_attention(double read_bw) {
  std::printf("\n## paged attention decode (GPT-2 small: Hq=Hkv=12, D=64, block 16)\n");
  std::printf("%6s %6s %10s %12s %8s\n", "batch", "ctx", "us", "KV GB/s", "%readBW");
  const int64_t h = 12, d = 64, bs = 16;
  for (int64_t batch : {1, 8})
    for (int64_t ctx : {128, 1024}) {
      const int64_t blocks_per = ctx / bs, blocks = blocks_per * batch;
      auto kc = random_floats(size_t(blocks * bs * h * d), 1), vc = random_floats(kc.size(), 2);
      auto q = random_floats(size_t(batch * h * d), 3);
      std::vector<int32_t> table(blocks);
      for (int64_t i = 0; i < blocks; ++i) table[i] = int32_t((i * 7) % blocks);  // scattered
      std::vector<AttentionSeq> seqs;
      for (int64_t b = 0; b < batch; ++b)
        seqs.push_back({int32_t(b), 1, int32_t(ctx), table.data() + b * blocks_per});
      std::vector<float> out(q.size());
      const double s = time_median([&] {
        paged_attention(q.data(), kc.data(), vc.data(), bs, h, h, d, 0.125f, true, seqs.data(), batch,
                        out.data());
      }, 51, 5);
      const double gb = 2.0 * batch * ctx * h * d * 4 / 1e9;
      std::printf("%6lld %6lld %10.1f %12.1f %7.0f%%\n", (long long)batch, (long long)ctx, s * 1e6, gb / s,
                  100 * gb / s / read_bw);
    }
}

}  // namespace

int main(int argc, char** argv) {
  bool sweep = false, only_gemv = false, only_qrows = false;
  for (int i = 1; i < argc; ++i) {
    sweep |= std::strcmp(argv[i], "--sweep") == 0;
    only_gemv |= std::strcmp(argv[i], "--gemv") == 0;
    only_qrows |= std::strcmp(argv[i], "--qrows") == 0;
  }
  std::printf("# kiln cpu_kernels_bench  isa=%s threads=%d\n", cpu_isa_name(cpu_isa()), pool().num_threads());
  if (only_qrows) {
    bench_qrows();
    return 0;
  }
  const double triad = triad_gbs();
  const double read = read_gbs();
  // The GEMM rows' %peak is of the FMA width their kernel uses.
  const bool zmm = avx512_enabled();
  const double peak_ymm = fma_peak_gflops(), peak = zmm ? fma_peak_gflops(true) : peak_ymm;
  std::printf("\n## ceilings\n");
  std::printf("triad a=b+s*c, 3x256 MB   %8.1f GB/s (read+write bytes, no write-allocate)\n", triad);
  std::printf("read-only sum, 512 MB     %8.1f GB/s\n", read);
  std::printf("FMA peak (ymm, all thr)   %8.1f GFLOP/s\n", peak_ymm);
  if (zmm) std::printf("FMA peak (zmm, all thr)   %8.1f GFLOP/s (the f32/bf16/f16 GEMMs' kernel: AVX-512)\n", peak);
  bench_gemv(read);
  if (only_gemv) return 0;
  bench_gemm(peak, sweep);
  bench_attention(read);
  return 0;
}
