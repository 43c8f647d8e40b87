// The row norms at prefill / encoder and decode sizes: LayerNorm (+bias), RMSNorm and the
// fused residual AddLayerNorm / AddRMSNorm in bf16 at [2048, 4096] (Llama-3.1-8B prefill
// of 2048 tokens), [4096, 768] (BERT-base batch 32 x 128), [64, 4096] and [1, 4096]
// (decode), as GB/s of the bytes they must move (x, the residual, the sum and y; gamma and
// beta left out) against a device-to-device copy measured in the same run. Each call
// reads a different set of buffers in turn (at least 256 MiB in all, so the data comes
// from HBM, not from the previous call's L2); "warm" repeats one set (what a decode step,
// whose rows the previous kernel just wrote, sees). Each row twice: KILN_CUDA_NORM_SHORT=
// block (the block-per-row kernels) and =warp (rows of at most 1024 take the warp-per-row
// kernel; "-" where the row is too long for it). Then:
// - the default launch shape against forced ones: the block kernel's vectors per thread x
//   rows per block ("1x1" is the shape every row count had before: one vector per thread
//   up to 1024 vectors) and the warp kernel's warps per block x rows per warp ("w8r2" is
//   its default), so the lead can check the defaults on the device;
// - the W8A8 input path: AddLayerNorm followed by launch_int8_quantize (static and per
//   token) against the AddLayerNorm writing the int8 codes itself (block and warp), and
//   against the dual output (its bf16 output and the codes in one pass: what a post-LN
//   norm whose output is also the next residual writes), block and warp.
// Timing only: correctness is tests/backends/cuda/ops_test.cpp and int8_fuse_test.cpp.
//   cuda_norm_bench
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <vector>

#include "backends/cuda/cuda_context.h"
#include "backends/cuda/ops/convert.h"
#include "backends/cuda/ops/int8.h"
#include "backends/cuda/ops/norm.h"
#include "core/status.h"
#include "cuda_bench_util.h"

using namespace kiln;
using namespace kiln::cuda;

namespace {

struct Shape {
  const char* what;
  int64_t rows, dim;
};

// kAddLayerPost: a post-norm block's AddLayerNorm, whose residual sum is not stored.
enum class Op { kLayer, kRms, kAddLayer, kAddRms, kAddLayerPost };
const char* op_name(Op op) {
  switch (op) {
    case Op::kLayer: return "LayerNorm+bias";
    case Op::kRms: return "RMSNorm";
    case Op::kAddLayer: return "AddLayerNorm";
    case Op::kAddRms: return "AddRMSNorm";
    case Op::kAddLayerPost: return "AddLayerNorm, no sum";
  }
  return "";
}
bool has_res(Op op) { return op == Op::kAddLayer || op == Op::kAddRms || op == Op::kAddLayerPost; }
// Bytes moved per element: x, y (and res, sum).
int elem_moves(Op op) { return op == Op::kAddLayerPost ? 3 : has_res(op) ? 4 : 2; }
bool is_rms(Op op) { return op == Op::kRms || op == Op::kAddRms; }

// Sets of x, residual, sum and y buffers ([rows, dim] bf16 each), int8 codes and row scales.
struct Buffers {
  int64_t rows, dim;
  int sets;
  DeviceBuffer x, res, sum, y, q, rs, gamma, beta;
  Buffers(int64_t r, int64_t d) : rows(r), dim(d) {
    const size_t bytes = size_t(r * d) * 2;
    sets = int(std::clamp<size_t>((size_t(256) << 20) / (4 * bytes) + 1, 1, 64));
    x = DeviceBuffer(bytes * size_t(sets));
    res = DeviceBuffer(bytes * size_t(sets));
    sum = DeviceBuffer(bytes * size_t(sets));
    y = DeviceBuffer(bytes * size_t(sets));
    q = DeviceBuffer(bytes / 2 * size_t(sets));
    rs = DeviceBuffer(size_t(r) * 4 * size_t(sets) + 256);
    gamma = DeviceBuffer(size_t(d) * 4);
    beta = DeviceBuffer(size_t(d) * 4);
    launch_fill_random(x.get(), DType::kBF16, r * d * sets, 1, nullptr);  // never time on zeros
    launch_fill_random(res.get(), DType::kBF16, r * d * sets, 2, nullptr);
    launch_fill_random(gamma.get(), DType::kF32, d, 3, nullptr);
    launch_fill_random(beta.get(), DType::kF32, d, 4, nullptr);
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
  }
  size_t off(int s) const { return size_t(s) * size_t(rows * dim) * 2; }
  void* at(const DeviceBuffer& b, int s) const { return static_cast<char*>(b.get()) + off(s); }
  int8_t* q_at(int s) const { return static_cast<int8_t*>(q.get()) + off(s) / 2; }
  float* rs_at(int s) const { return static_cast<float*>(rs.get()) + size_t(s) * size_t(rows); }
  const float* g() const { return static_cast<const float*>(gamma.get()); }
  const float* b() const { return static_cast<const float*>(beta.get()); }
};

// Median us of one call of f(set), the sets taken in turn (`warm`: always set 0); 20 calls
// back to back per timing (a busy stream, as in a step).
float time_us(const Buffers& bf, bool warm, const std::function<void(int)>& f) {
  int s = 0;
  return 1000.0f * bench::median_ms(
                       [&] {
                         f(s);
                         if (!warm) s = (s + 1) % bf.sets;
                       },
                       30, 20);
}

void launch_op(Op op, const Buffers& bf, int s) {
  const int64_t r = bf.rows, d = bf.dim;
  switch (op) {
    case Op::kLayer: launch_layer_norm(DType::kBF16, bf.at(bf.x, s), bf.g(), bf.b(), 1e-5f, r, d, bf.at(bf.y, s), nullptr); break;
    case Op::kRms: launch_rms_norm(DType::kBF16, bf.at(bf.x, s), bf.g(), 1e-5f, r, d, bf.at(bf.y, s), nullptr); break;
    case Op::kAddLayer:
      launch_add_layer_norm(DType::kBF16, bf.at(bf.x, s), bf.at(bf.res, s), bf.g(), bf.b(), 1e-5f, r, d,
                            bf.at(bf.sum, s), bf.at(bf.y, s), nullptr);
      break;
    case Op::kAddLayerPost:
      launch_add_layer_norm(DType::kBF16, bf.at(bf.x, s), bf.at(bf.res, s), bf.g(), bf.b(), 1e-5f, r, d, nullptr,
                            bf.at(bf.y, s), nullptr);
      break;
    case Op::kAddRms:
      launch_add_rms_norm(DType::kBF16, bf.at(bf.x, s), bf.at(bf.res, s), bf.g(), 1e-5f, r, d, bf.at(bf.sum, s),
                          bf.at(bf.y, s), nullptr);
      break;
  }
}

}  // namespace

int main() {
  const double copy = bench::device_copy_gbs();
  std::printf("device-to-device copy: %.0f GB/s (read + write)\n\n", copy);
  const Shape shapes[] = {{"8B prefill 2048 tok", 2048, 4096},
                          {"BERT-base b32 x 128", 4096, 768},
                          {"BERT-large b32 x 128", 4096, 1024},
                          {"BERT-base b1 x 128", 128, 768},
                          {"decode 64 rows", 64, 4096},
                          {"decode 1 row", 1, 4096}};
  const Op ops[] = {Op::kLayer, Op::kRms, Op::kAddLayer, Op::kAddLayerPost, Op::kAddRms};

  std::printf("| shape | op | bytes | us (HBM) | GB/s | of copy | us (warm) | GB/s warm | warp us (HBM) | warp GB/s | "
              "warp of copy | warp us (warm) | warp GB/s warm | block / warp |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Shape& sh : shapes) {
    Buffers bf(sh.rows, sh.dim);
    const bool warp = norm_kernel_for(DType::kBF16, sh.dim, NormShort::kWarp) == NormKernel::kWarp;
    for (Op op : ops) {
      const double bytes = double(sh.rows * sh.dim) * 2.0 * elem_moves(op);
      set_norm_short_mode(NormShort::kBlock);
      const float cold = time_us(bf, false, [&](int s) { launch_op(op, bf, s); });
      const float warm = time_us(bf, true, [&](int s) { launch_op(op, bf, s); });
      std::printf("| %s [%lld, %lld] | %s | %.1f MB | %.2f | %.0f | %.0f%% | %.2f | %.0f |", sh.what,
                  (long long)sh.rows, (long long)sh.dim, op_name(op), bytes / 1e6, cold, bytes / (cold * 1e3),
                  100.0 * bytes / (cold * 1e3) / copy, warm, bytes / (warm * 1e3));
      if (!warp) {
        std::printf(" - | - | - | - | - | - |\n");
        continue;
      }
      set_norm_short_mode(NormShort::kWarp);
      const float wcold = time_us(bf, false, [&](int s) { launch_op(op, bf, s); });
      const float wwarm = time_us(bf, true, [&](int s) { launch_op(op, bf, s); });
      std::printf(" %.2f | %.0f | %.0f%% | %.2f | %.0f | %.2fx |\n", wcold, bytes / (wcold * 1e3),
                  100.0 * bytes / (wcold * 1e3) / copy, wwarm, bytes / (wwarm * 1e3), cold / wcold);
    }
  }
  set_norm_short_mode(std::nullopt);

  // Launch shapes: default vs forced (block: vectors per thread x rows per block; warp:
  // warps per block x rows per warp), HBM.
  std::printf("\nlaunch shapes, GB/s from HBM (default = what the launchers pick under KILN_CUDA_NORM_SHORT=block; "
              "1x1 = the earlier shape; wNrM = the warp kernel, w8r2 its default):\n");
  set_norm_short_mode(NormShort::kBlock);
  std::printf("| shape | op | default |");
  const int vecs[] = {1, 2, 4}, rpbs[] = {1, 2, 4, 8}, warps[] = {2, 4, 8}, rpws[] = {1, 2, 4};
  for (int v : vecs)
    for (int r : rpbs) std::printf(" %dx%d |", v, r);
  for (int w : warps)
    for (int r : rpws) std::printf(" w%dr%d |", w, r);
  std::printf("\n|---|---|---|");
  for (size_t i = 0; i < std::size(vecs) * std::size(rpbs) + std::size(warps) * std::size(rpws); ++i) std::printf("---|");
  std::printf("\n");
  for (const Shape& sh : shapes) {
    Buffers bf(sh.rows, sh.dim);
    for (Op op : {Op::kLayer, Op::kAddLayer, Op::kAddRms}) {
      const double bytes = double(sh.rows * sh.dim) * 2.0 * (has_res(op) ? 4 : 2);
      std::printf("| %s | %s | %.0f |", sh.what, op_name(op),
                  bytes / (time_us(bf, false, [&](int s) { launch_op(op, bf, s); }) * 1e3));
      auto forced = [&](NormShape ns) {
        auto f = [&](int s) {
          (void)launch_add_norm_shaped(DType::kBF16, is_rms(op), bf.at(bf.x, s), has_res(op) ? bf.at(bf.res, s) : nullptr,
                                       bf.g(), is_rms(op) ? nullptr : bf.b(), 1e-5f, sh.rows, sh.dim,
                                       has_res(op) ? bf.at(bf.sum, s) : nullptr, bf.at(bf.y, s), ns, nullptr);
        };
        const bool ok = launch_add_norm_shaped(DType::kBF16, is_rms(op), bf.at(bf.x, 0), nullptr, bf.g(), nullptr,
                                               1e-5f, 1, sh.dim, nullptr, bf.at(bf.y, 0), ns, nullptr);
        if (!ok) std::printf(" - |");
        else std::printf(" %.0f |", bytes / (time_us(bf, false, f) * 1e3));
      };
      for (int v : vecs)
        for (int r : rpbs) forced({.vectors = v, .rows_per_block = r});
      for (int w : warps)
        for (int r : rpws) forced({.warps = w, .rows_per_warp = r});
      std::printf("\n");
    }
  }
  set_norm_short_mode(std::nullopt);

  // The W8A8 input: norm then quantize vs the norm writing the codes, or y and the codes.
  std::printf("\nW8A8 input (AddLayerNorm, bf16 -> int8), us from HBM:\n"
              "| shape | scales | AddLayerNorm | + int8 quantize | pair | fused | pair / fused | dual | pair / dual |"
              " pair (warp) | fused (warp) | dual (warp) | pair / dual (warp) | dual, no sum (warp) |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Shape& sh : shapes) {
    Buffers bf(sh.rows, sh.dim);
    const int64_t r = sh.rows, d = sh.dim;
    for (bool per_token : {false, true}) {
      auto norm = [&](int s) { launch_op(Op::kAddLayer, bf, s); };
      auto quant = [&](int s) {
        launch_int8_quantize(DType::kBF16, bf.at(bf.y, s), r, d, 1.0f / 0.05f, bf.q_at(s), per_token ? bf.rs_at(s) : nullptr,
                             nullptr);
      };
      auto fused = [&](int s) {
        launch_add_layer_norm_int8(DType::kBF16, bf.at(bf.x, s), bf.at(bf.res, s), bf.g(), bf.b(), 1e-5f, r, d,
                                   bf.at(bf.sum, s), bf.q_at(s), 1.0f / 0.05f, per_token ? bf.rs_at(s) : nullptr,
                                   nullptr);
      };
      auto dual = [&](int s) {
        launch_add_layer_norm_dual(DType::kBF16, bf.at(bf.x, s), bf.at(bf.res, s), bf.g(), bf.b(), 1e-5f, r, d,
                                   bf.at(bf.sum, s), bf.at(bf.y, s), bf.q_at(s), 1.0f / 0.05f,
                                   per_token ? bf.rs_at(s) : nullptr, nullptr);
      };
      auto dual_no_sum = [&](int s) {  // a post-norm block's: the residual sum not stored
        launch_add_layer_norm_dual(DType::kBF16, bf.at(bf.x, s), bf.at(bf.res, s), bf.g(), bf.b(), 1e-5f, r, d, nullptr,
                                   bf.at(bf.y, s), bf.q_at(s), 1.0f / 0.05f, per_token ? bf.rs_at(s) : nullptr, nullptr);
      };
      auto pair = [&](int s) {
        norm(s);
        quant(s);
      };
      set_norm_short_mode(NormShort::kBlock);
      const float tn = time_us(bf, false, norm), tq = time_us(bf, false, quant);
      const float tp = time_us(bf, false, pair), tf = time_us(bf, false, fused), td = time_us(bf, false, dual);
      std::printf("| %s | %s | %.2f | %.2f | %.2f | %.2f | %.2fx | %.2f | %.2fx |", sh.what,
                  per_token ? "per token" : "static", tn, tq, tp, tf, tp / tf, td, tp / td);
      set_norm_short_mode(NormShort::kWarp);
      if (norm_kernel_for(DType::kBF16, d, NormShort::kWarp) == NormKernel::kWarp) {
        const float wp = time_us(bf, false, pair), wf = time_us(bf, false, fused), wd = time_us(bf, false, dual);
        std::printf(" %.2f | %.2f | %.2f | %.2fx | %.2f |\n", wp, wf, wd, wp / wd, time_us(bf, false, dual_no_sum));
      } else {
        std::printf(" - | - | - | - | - |\n");
      }
      set_norm_short_mode(std::nullopt);
    }
  }
  return 0;
}
