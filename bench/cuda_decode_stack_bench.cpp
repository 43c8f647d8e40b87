// The decode stack kernel (ops/decode_stack.h) alone on Llama shapes with random bf16
// weights: one batch-1 decode step through every layer at a given context, timed as the
// median of CUDA-graph replays (10 steps a graph), its weight + KV bytes per step against
// the device-to-device copy rate of the same run; then one step with the kernel's timeline
// (each CTA's %globaltimer when it saw each phase's input ready and when it finished the
// phase): per phase the median over layers of its duration (the last CTA's finish minus
// the previous phase's last finish), when the first and the last CTA saw its input ready
// (the counter's latency), the spread between its first and last CTA, and a GEMV phase's
// weight GB/s.
//   cuda_decode_stack_bench [shape filter: tinyllama | 1b | 8b] [context, default 512]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backends/cuda/cuda_context.h"
#include "backends/cuda/ops/convert.h"
#include "backends/cuda/ops/decode_stack.h"
#include "cuda_bench_util.h"

using namespace kiln;
using namespace kiln::cuda;

namespace {

struct Shape {
  const char* name;
  DecodeStackShape s;
};

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const char* filter = argc > 1 ? argv[1] : "";
  const int ctx = argc > 2 ? std::atoi(argv[2]) : 512;
  const double copy_gbs = bench::device_copy_gbs();
  std::printf("device-to-device copy: %.0f GB/s (read + write)\n\n", copy_gbs);
  const Shape shapes[] = {
      {"tinyllama-1.1b", {22, 2048, 5632, 32, 4, 64}},
      {"llama-3.2-1b", {16, 2048, 8192, 32, 8, 64}},
      {"llama-3.1-8b", {32, 4096, 14336, 32, 8, 128}},
  };
  const DType t = DType::kBF16;
  cudaStream_t st = nullptr;
  KILN_CUDA_CHECK(cudaStreamCreate(&st));
  const int grid = decode_stack_grid();
  if (grid == 0) {
    std::printf("the decode stack cannot run on this device\n");
    return 1;
  }
  for (const Shape& sh : shapes) {
    if (!std::strstr(sh.name, filter)) continue;
    const DecodeStackShape& s = sh.s;
    const int64_t qkv = int64_t(s.hq + 2 * s.hkv) * s.d;
    std::vector<DeviceBuffer> bufs;
    auto rand_buf = [&](int64_t n, uint32_t seed) {
      bufs.emplace_back(size_t(n) * 2);
      launch_fill_random(bufs.back().get(), t, n, seed, st);
      return bufs.back().get();
    };
    std::vector<float> ones(size_t(s.hidden), 1.0f), inv(size_t(s.d / 2));
    for (int i = 0; i < s.d / 2; ++i) inv[size_t(i)] = std::pow(500000.0f, -2.0f * float(i) / float(s.d));
    DeviceBuffer norm(ones.size() * 4), inv_freq(inv.size() * 4);
    KILN_CUDA_CHECK(cudaMemcpy(norm.get(), ones.data(), ones.size() * 4, cudaMemcpyHostToDevice));
    KILN_CUDA_CHECK(cudaMemcpy(inv_freq.get(), inv.data(), inv.size() * 4, cudaMemcpyHostToDevice));
    std::vector<DecodeStackLayer> layers;
    double weight_bytes = 0;
    for (int l = 0; l < s.layers; ++l) {
      DecodeStackLayer ly;
      const uint32_t seed = uint32_t(100 * l);
      ly.w_qkv = rand_buf(qkv * s.hidden, seed + 1);
      ly.w_o = rand_buf(int64_t(s.hidden) * s.hq * s.d, seed + 2);
      ly.w_gate_up = rand_buf(2 * int64_t(s.inter) * s.hidden, seed + 3);
      ly.w_down = rand_buf(int64_t(s.hidden) * s.inter, seed + 4);
      ly.attn_norm = ly.mlp_norm = static_cast<const float*>(norm.get());
      ly.attn_eps = ly.mlp_eps = 1e-5f;
      layers.push_back(ly);
      weight_bytes += 2.0 * double(qkv * s.hidden + int64_t(s.hidden) * s.hq * s.d + 3 * int64_t(s.inter) * s.hidden);
    }
    DeviceBuffer dev_layers(layers.size() * sizeof(DecodeStackLayer));
    KILN_CUDA_CHECK(cudaMemcpy(dev_layers.get(), layers.data(), layers.size() * sizeof(DecodeStackLayer),
                               cudaMemcpyHostToDevice));
    const int bs = 16, blocks = (ctx + 1 + bs - 1) / bs;
    const size_t layer_kv = size_t(blocks) * bs * s.hkv * s.d * 2;
    DeviceBuffer kc(layer_kv * size_t(s.layers)), vc(layer_kv * size_t(s.layers));
    launch_fill_random(kc.get(), t, int64_t(kc.size() / 2), 5, st);
    launch_fill_random(vc.get(), t, int64_t(vc.size() / 2), 6, st);
    std::vector<int32_t> table(static_cast<size_t>(blocks));
    for (int i = 0; i < blocks; ++i) table[size_t(i)] = i;
    const AttnSeq seq{0, 1, ctx + 1, 0};
    const int32_t pos = ctx;
    const int64_t slot = ctx;
    DeviceBuffer dtable(table.size() * 4), dseq(sizeof(seq)), dpos(4), dslot(8);
    KILN_CUDA_CHECK(cudaMemcpy(dtable.get(), table.data(), table.size() * 4, cudaMemcpyHostToDevice));
    KILN_CUDA_CHECK(cudaMemcpy(dseq.get(), &seq, sizeof(seq), cudaMemcpyHostToDevice));
    KILN_CUDA_CHECK(cudaMemcpy(dpos.get(), &pos, 4, cudaMemcpyHostToDevice));
    KILN_CUDA_CHECK(cudaMemcpy(dslot.get(), &slot, 8, cudaMemcpyHostToDevice));
    DeviceBuffer scratch(decode_stack_scratch_bytes(s, grid)), out_sum(size_t(s.hidden) * 2),
        out_norm(size_t(s.hidden) * 2);
    KILN_CUDA_CHECK(cudaMemset(scratch.get(), 0, scratch.size()));
    DecodeStackArgs a;
    a.dtype = t;
    a.shape = s;
    a.layers = static_cast<const DecodeStackLayer*>(dev_layers.get());
    a.scale = 1.0f / std::sqrt(float(s.d));
    a.inv_freq = static_cast<const float*>(inv_freq.get());
    a.final_norm = static_cast<const float*>(norm.get());
    a.final_eps = 1e-5f;
    a.x = rand_buf(s.hidden, 9);
    a.out_sum = out_sum.get();
    a.out_norm = out_norm.get();
    a.positions = static_cast<const int32_t*>(dpos.get());
    a.slot_mapping = static_cast<const int64_t*>(dslot.get());
    a.seq = static_cast<const AttnSeq*>(dseq.get());
    a.block_tables = static_cast<const int32_t*>(dtable.get());
    a.k_cache = kc.get();
    a.v_cache = vc.get();
    a.kv_layer_bytes = layer_kv;
    a.block_size = bs;
    a.scratch = scratch.get();
    const double kv_bytes = 2.0 * double(ctx + 1) * s.hkv * s.d * 2 * s.layers;
    const float ms = bench::graph_ms([&] { launch_decode_stack(a, grid, st); }, st, 10, 20);
    const double gbs = (weight_bytes + kv_bytes) / (double(ms) * 1e6);
    std::printf("%s, context %d, %d CTAs: %.3f ms per step (layers only: no embedding, LM head), %.2f GB of weights"
                " + %.1f MB KV, %.0f GB/s = %.0f%% of copy\n",
                sh.name, ctx, grid, ms, weight_bytes / 1e9, kv_bytes / 1e6, gbs, 100.0 * gbs / copy_gbs);
    // One step with the timeline.
    const size_t lp = size_t(s.layers) * kDecodeStackPhases, slots = 2 * lp + 1;
    DeviceBuffer tl(slots * size_t(grid) * 8);
    KILN_CUDA_CHECK(cudaMemset(tl.get(), 0, tl.size()));
    a.timeline = static_cast<int64_t*>(tl.get());
    launch_decode_stack(a, grid, st);
    KILN_CUDA_CHECK(cudaStreamSynchronize(st));
    a.timeline = nullptr;
    std::vector<int64_t> h(slots * size_t(grid));
    KILN_CUDA_CHECK(cudaMemcpy(h.data(), tl.get(), h.size() * 8, cudaMemcpyDeviceToHost));
    // Max / min over the CTAs that recorded the slot (0: no entry).
    auto over = [&](size_t slot, bool want_max) {
      int64_t m = 0;
      for (int c = 0; c < grid; ++c) {
        const int64_t v = h[slot * size_t(grid) + size_t(c)];
        if (v != 0 && (m == 0 || (want_max ? v > m : v < m))) m = v;
      }
      return m;
    };
    const char* names[kDecodeStackPhases] = {"q|k|v (+norm, RoPE, KV write)", "attention (split partials)",
                                             "o (+merge, residual)", "gate|up (+norm, SwiGLU)", "down (+residual)"};
    const double phase_bytes[kDecodeStackPhases] = {2.0 * double(qkv) * s.hidden, 0,
                                                    2.0 * double(s.hidden) * s.hq * s.d,
                                                    4.0 * double(s.inter) * s.hidden, 2.0 * double(s.inter) * s.hidden};
    std::printf("| phase | us per layer: previous phase's last CTA done -> this one's last done | -> first CTA sees input |"
                " -> last CTA sees input | first -> last CTA done | weight GB/s |\n|---|---|---|---|---|---|\n");
    double total = 0;
    for (int p = 0; p < kDecodeStackPhases; ++p) {
      std::vector<double> dur, first_ready, last_ready, spread;
      for (int l = 0; l < s.layers; ++l) {
        const size_t done = size_t(l) * kDecodeStackPhases + size_t(p), ready = lp + done;
        const int64_t prev = done == 0 ? over(slots - 1, false) : over(done - 1, true);
        dur.push_back(double(over(done, true) - prev) / 1e3);
        first_ready.push_back(double(over(ready, false) - prev) / 1e3);
        last_ready.push_back(double(over(ready, true) - prev) / 1e3);
        spread.push_back(double(over(done, true) - over(done, false)) / 1e3);
      }
      const double md = median(dur);
      total += md;
      std::printf("| %s | %.2f | %.2f | %.2f | %.2f |", names[p], md, median(first_ready), median(last_ready),
                  median(spread));
      if (phase_bytes[p] > 0) std::printf(" %.0f |\n", phase_bytes[p] / (md * 1e3));
      else std::printf(" |\n");
    }
    std::printf("| layer (sum of medians) | %.2f | | | | %.0f |\n\n", total, weight_bytes / s.layers / (total * 1e3));
  }
  KILN_CUDA_CHECK(cudaStreamDestroy(st));
  return 0;
}
