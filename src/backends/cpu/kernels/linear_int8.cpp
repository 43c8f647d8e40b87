// W8A8 int8 Linear: weight packing (per-channel symmetric int8), activation quantization
// (per-tensor), the threading driver and the portable scalar microkernel (the fallback).
// The AVX2 microkernel is in linear_int8_avx2.cpp. Tested against an exact integer
// reference in tests/backends/cpu/linear_int8_test.cpp.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cpu/kernels/isa.h"
#include "core/int8.h"
#include "core/status.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace kiln::cpu {
namespace {

constexpr int64_t kNr = PackedInt8Weight::kPanelWidth;
// Values per thread below which quantizing / biasing x runs on the calling thread alone.
constexpr int64_t kParallelValues = 16384;
constexpr int kMr = 4;

void scalar_int8_microkernel(int m, const int8_t* qx, int64_t ldx, const int8_t* panel, int64_t k4,
                             int32_t* acc) {
  for (int r = 0; r < m; ++r) {
    int32_t a[kNr] = {};
    const int8_t* x = qx + r * ldx;
    for (int64_t kk = 0; kk < k4; ++kk) {
      const int8_t* w = panel + kk * 64;
      for (int c = 0; c < kNr; ++c)
        for (int j = 0; j < 4; ++j) a[c] += int32_t(x[4 * kk + j]) * int32_t(w[c * 4 + j]);
    }
    std::memcpy(acc + r * kNr, a, sizeof(a));
  }
}

// Shared by both ISAs and the CUDA backend (core/int8.h) so the results agree bit for bit.
inline int8_t quantize_one(float x, float inv_scale) { return int8_quantize(x, inv_scale); }

}  // namespace

PackedInt8Weight pack_weight_int8(const float* w, int64_t n, int64_t k, const float* row_amax) {
  KILN_THROW_IF(n <= 0 || k <= 0, kInvalidArgument, "pack_weight_int8: expected N, K > 0, got N=", n, " K=", k);
  PackedInt8Weight pw;
  pw.n = n;
  pw.k = k;
  pw.k4 = (k + 3) / 4;
  const size_t data_bytes = size_t(pw.panels() * pw.k4 * 64);
  const std::shared_ptr<uint8_t[]> buf = host_buffer(data_bytes);
  pw.data = std::shared_ptr<int8_t[]>(buf, reinterpret_cast<int8_t*>(buf.get()));
  pw.scale = std::shared_ptr<float[]>(new float[size_t(pw.panels() * kNr)]());
  pw.bias128 = std::shared_ptr<int32_t[]>(new int32_t[size_t(pw.panels() * kNr)]());
  std::memset(pw.data.get(), 0, data_bytes);
  ThreadPool::global().parallel_for(pw.panels(), [&](int64_t p0, int64_t p1, int) {
    for (int64_t p = p0; p < p1; ++p)
      for (int64_t c = 0; c < kNr; ++c) {
        const int64_t row = p * kNr + c;
        if (row >= n) continue;
        std::vector<int8_t> q(static_cast<size_t>(k));
        pw.scale[size_t(row)] =
            row_amax ? int8_quantize_channel_amax(w + row * k, k, row_amax[row], q.data())
                     : int8_quantize_channel(w + row * k, k, q.data());
        int8_t* dst = pw.data.get() + p * pw.k4 * 64 + c * 4;
        int32_t sum = 0;
        for (int64_t i = 0; i < k; ++i) {
          dst[(i / 4) * 64 + i % 4] = q[size_t(i)];
          sum += q[size_t(i)];
        }
        pw.bias128[size_t(row)] = 128 * sum;
      }
  });
  return pw;
}

void quantize_rows_int8(const float* x, int64_t t, int64_t k, float inv_scale, int8_t* q, int64_t ldq) {
  for (int64_t r = 0; r < t; ++r) {
    const float* xr = x + r * k;
    int8_t* qr = q + r * ldq;
    if (use_avx2()) {
      avx2::quantize_row_int8(xr, k, inv_scale, qr);
    } else {
      for (int64_t i = 0; i < k; ++i) qr[i] = quantize_one(xr[i], inv_scale);
    }
    std::memset(qr + k, 0, size_t(ldq - k));
  }
}

bool avx512_int8_supported() {
  static const bool hw = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni");
  }();
  return hw && avx512_enabled();
}

namespace {

// The biased-x tiles (avx512::int8_tile, or its ymm form on AVX-VNNI): up to `rows` x 16
// `panels` per call; zmm: linear_int8 may take avx512::int8_dequantize as its epilogue.
struct BiasedTiles {
  void (*tile)(int m, int panels, const uint8_t* ux, int64_t ldx, const int8_t* panel, int64_t panel_stride,
               int64_t k4, const int32_t* bias128, int32_t* acc);
  int rows, panels;
  bool zmm;
};

// x + 128 as unsigned bytes, in place: the biased tiles' rows.
void bias_codes(int8_t* q, int64_t n) {
  for (int64_t i = 0; i < n; ++i) q[i] = int8_t(uint8_t(q[i]) ^ 0x80);
}

// The AVX-512 VNNI tiles where they run, else the AVX-VNNI ones (KILN_CPU_VNNI=0 turns those
// off), else none: the AVX2 maddubs / scalar microkernels.
const BiasedTiles* biased_tiles() {
  static const BiasedTiles zmm{avx512::int8_tile, avx512::kInt8TileRows, 2, true};
  static const BiasedTiles ymm{avx2::int8_tile_vnni, avx2::kInt8VnniTileRows, 1, false};
  if (avx512_int8_supported()) return &zmm;
  static const bool vnni = avx2::avx_vnni_supported() && !(std::getenv("KILN_CPU_VNNI") &&
                                                           std::string(std::getenv("KILN_CPU_VNNI")) == "0");
  return use_avx2() && vnni ? &ymm : nullptr;
}

// int8_drive over biased tiles (rows ux already biased): tiles over up to `panels` adjacent
// panels (a thread's odd last panel alone) in blocks of 16 tiles of rows.
template <typename Epilogue>
void int8_drive_biased(const BiasedTiles& k, const uint8_t* ux, int64_t t, int64_t ldx, const PackedInt8Weight& w,
                       Epilogue&& epi) {
  const int64_t row_block = 16 * k.rows;
  const int64_t stride = w.k4 * 64;
  auto body = [&](int64_t p0, int64_t p1, int64_t r0, int64_t r1) {
    alignas(64) int32_t acc[2 * avx512::kInt8TileRows * kNr];
    static_assert(avx2::kInt8VnniTileRows <= 2 * avx512::kInt8TileRows);
    for (int64_t rb = r0; rb < r1; rb += row_block)
      for (int64_t p = p0; p < p1;) {
        const int np = k.panels == 2 && p + 1 < p1 ? 2 : 1;
        for (int64_t r = rb; r < std::min(r1, rb + row_block); r += k.rows) {
          const int m = int(std::min<int64_t>(k.rows, r1 - r));
          k.tile(m, np, ux + r * ldx, ldx, w.panel(p), stride, w.k4, w.bias128.get() + p * kNr, acc);
          for (int q = 0; q < np; ++q) epi(r, m, p + q, acc + q * m * kNr);
        }
        p += np;
      }
  };
  const int threads = ThreadPool::global().num_threads();
  if (w.panels() >= 4 * threads || t < 4 * k.rows * threads)
    ThreadPool::global().parallel_for(w.panels(), [&](int64_t b, int64_t e, int) { body(b, e, 0, t); }, k.panels);
  else
    ThreadPool::global().parallel_for(t, [&](int64_t b, int64_t e, int) { body(0, w.panels(), b, e); }, k.rows);
}

// Rows in blocks of kMr for each panel; threads own panels (each streams its own slice
// of the weights once per block of rows that fits in cache). Where biased_tiles() run, qx
// holds the rows already biased (x_biased: bias_codes) or they are biased into a copy here.
template <typename Epilogue>
void int8_drive(const int8_t* qx, bool x_biased, int64_t t, int64_t ldx, const PackedInt8Weight& w, Epilogue&& epi) {
  if (const BiasedTiles* k = biased_tiles()) {
    if (x_biased) return int8_drive_biased(*k, reinterpret_cast<const uint8_t*>(qx), t, ldx, w, epi);
    thread_local std::vector<int8_t> copy;
    copy.assign(qx, qx + t * ldx);
    int8_t* const c = copy.data();  // the workers get this thread's buffer, not their own
    ThreadPool::global().parallel_for(t * ldx, [&](int64_t b, int64_t e, int) { bias_codes(c + b, e - b); },
                                      kParallelValues);
    return int8_drive_biased(*k, reinterpret_cast<const uint8_t*>(c), t, ldx, w, epi);
  }
  Int8Microkernel mk = use_avx2() ? avx2::int8_microkernel() : scalar_int8_microkernel;
  constexpr int64_t kRowBlock = 64;
  auto body = [&](int64_t p0, int64_t p1, int64_t r0, int64_t r1) {
    alignas(64) int32_t acc[kMr * kNr];
    for (int64_t rb = r0; rb < r1; rb += kRowBlock)
      for (int64_t p = p0; p < p1; ++p)
        for (int64_t r = rb; r < std::min(r1, rb + kRowBlock); r += kMr) {
          const int m = int(std::min<int64_t>(kMr, r1 - r));
          mk(m, qx + r * ldx, ldx, w.panel(p), w.k4, acc);
          epi(r, m, p, acc);
        }
  };
  const int threads = ThreadPool::global().num_threads();
  if (w.panels() >= 4 * threads || t < 4 * kMr * threads)
    ThreadPool::global().parallel_for(w.panels(), [&](int64_t b, int64_t e, int) { body(b, e, 0, t); }, 1);
  else
    ThreadPool::global().parallel_for(t, [&](int64_t b, int64_t e, int) { body(0, w.panels(), b, e); }, kMr);
}

}  // namespace

void gemm_int8_acc(const int8_t* qx, int64_t t, const PackedInt8Weight& w, int32_t* acc) {
  if (t <= 0) return;
  int8_drive(qx, false, t, 4 * w.k4, w, [&](int64_t r, int m, int64_t p, const int32_t* tile) {
    const int64_t cols = std::min(kNr, w.n - p * kNr);
    for (int i = 0; i < m; ++i)
      std::memcpy(acc + (r + i) * w.n + p * kNr, tile + i * kNr, size_t(cols) * 4);
  });
}

void linear_int8(const float* x, int64_t t, int64_t k, const PackedInt8Weight& w, float x_scale,
                 const float* bias, float* y) {
  KILN_THROW_IF(k != w.k, kInvalidArgument, "linear_int8: x has K=", k, " but the weight was packed with K=", w.k);
  if (t <= 0) return;
  const int64_t ldx = 4 * w.k4;
  // Per-thread reuse of the quantized rows (the executor thread calls this every step).
  thread_local std::vector<int8_t> qbuf;
  thread_local std::vector<float> row_scale;
  if (qbuf.size() < size_t(t * ldx)) qbuf.resize(size_t(t * ldx));
  const bool dynamic = !(x_scale > 0.0f);
  if (dynamic) row_scale.resize(size_t(t));
  // Rows quantize on every thread once there is enough of them (a prompt: 128 x 3072 values
  // took ~5% of BERT-base's W8A8 forward on the calling thread alone), and for the biased
  // tiles are biased while in cache. The buffers are this thread's: the workers get their
  // addresses, not their own thread_local copies.
  const BiasedTiles* tiles = biased_tiles();
  int8_t* const q = qbuf.data();
  float* const scales = row_scale.data();
  ThreadPool::global().parallel_for(t, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      float inv = 1.0f / x_scale;
      if (dynamic) {
        float amax = 0.0f;
        for (int64_t i = 0; i < k; ++i) amax = std::max(amax, std::fabs(x[r * k + i]));
        scales[r] = int8_row_scale(amax);
        inv = 1.0f / scales[r];
      }
      quantize_rows_int8(x + r * k, 1, k, inv, q + r * ldx, ldx);
      if (tiles) bias_codes(q + r * ldx, ldx);
    }
  }, std::max<int64_t>(1, kParallelValues / k));
  const float* rs = dynamic ? row_scale.data() : nullptr;
  const bool zmm_epilogue = tiles && tiles->zmm;
  int8_drive(q, tiles != nullptr, t, ldx, w, [&](int64_t r, int m, int64_t p, const int32_t* tile) {
    const int64_t cols = std::min(kNr, w.n - p * kNr);
    if (zmm_epilogue) {
      float xs[avx512::kInt8TileRows];
      for (int i = 0; i < m; ++i) xs[i] = rs ? rs[r + i] : x_scale;
      avx512::int8_dequantize(m, tile, xs, w.scale.get() + p * kNr, bias ? bias + p * kNr : nullptr, cols,
                              y + r * w.n + p * kNr, w.n);
      return;
    }
    float b[kNr];
    for (int64_t c = 0; c < cols; ++c) b[c] = bias ? bias[p * kNr + c] : 0.0f;
    for (int i = 0; i < m; ++i) {
      const float xs = rs ? rs[r + i] : x_scale;
      float* yr = y + (r + i) * w.n + p * kNr;
      for (int64_t c = 0; c < cols; ++c) yr[c] = float(tile[i * kNr + c]) * (xs * w.scale[size_t(p * kNr + c)]) + b[c];
    }
  });
}

}  // namespace kiln::cpu
