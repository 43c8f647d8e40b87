// Prefill attention alone on the GPU: the tensor-core (flash) kernel against the CUDA-core
// tile kernel the backend runs without it (KILN_CUDA_FLASH=0) on Llama-3.1-8B's shape (32
// q / 8 KV heads, head dim 128, causal, one prompt of 512 / 2048 / 8192 tokens; at 2048
// also with an fp8 cache), Llama-3.2-1B's (32 / 8, head dim 64) and BERT-base's (12
// heads, head dim 64, 1 / 8 / 32 sequences of 128 tokens, bidirectional, K/V read in place
// as the encoder path does), Qwen3-0.6B's (16 / 8, 128) and Gemma 3 1B's (4 / 1, 256) at
// 512 / 2048. The tensor-core kernel runs at the CTA width its plan picks
// (attention_flash_pick_width; printed, with the warp rows attention_flash_warp_rows
// picks and the items per SM of the plan), with the key splits the plan makes for a
// short grid and their combine, and unsplit at 128 items with 16- and 32-row warps (the
// 16-row column at 256 items per SM), in the same run. Random bf16
// inputs through a shuffled 16-token block table (one-token blocks for the encoder);
// median of 20 repeats of 5 launches back to back (CUDA events). Before timing, the
// kernels' outputs are compared (max |flash - tile| over both widths and max |tile|; the
// tile kernel computes in f32). TFLOP/s count the attention FLOPs: 4 hq d per visible
// (query, key) pair, i.e. 2 hq d p(p+1) for a causal prompt of p tokens; GB/s the bytes
// of q, k, v and the output, each once. Ceilings: an 8192^3 bf16 cuBLASLt GEMM and a
// 1 GiB device-to-device copy in the same run.
//   cuda_attention_bench [8b|1b|bert ...] [--len N] [--seqs N]   (default: all; --len keeps
//   the prompts of N tokens and --seqs the steps of N sequences, e.g. one kernel under a
//   profiler)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/cuda_context.h"
#include "backends/cuda/ops/attention.h"
#include "backends/cuda/ops/convert.h"
#include "backends/cuda/ops/gemm.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"
#include "cuda_bench_util.h"

using namespace kiln;
using namespace kiln::cuda;

namespace {

struct Case {
  const char* name;
  int64_t hq, hkv, d;
  int32_t seqs, len;
  bool causal;
  KvCode code = KvCode::kNone;
};

std::vector<float> to_host_f32(const void* bf16, int64_t n) {
  Tensor h(DType::kBF16, {n});
  KILN_CUDA_CHECK(cudaMemcpy(h.data(), bf16, size_t(n) * 2, cudaMemcpyDeviceToHost));
  const Tensor f = h.to(DType::kF32);
  return std::vector<float>(f.data_as<float>(), f.data_as<float>() + n);
}

template <typename V>
DeviceBuffer upload(const std::vector<V>& v) {
  DeviceBuffer b(std::max<size_t>(v.size() * sizeof(V), 1));
  KILN_CUDA_CHECK(cudaMemcpy(b.get(), v.data(), v.size() * sizeof(V), cudaMemcpyHostToDevice));
  return b;
}

void run_case(const Case& c, int num_sms) {
  const bool cache = c.causal;  // decoders read a paged cache; the encoder its K/V rows in place
  const int64_t bs = cache ? 16 : 1, tokens = int64_t(c.seqs) * c.len;
  const int64_t blocks = cache ? int64_t(c.seqs) * ((c.len + bs - 1) / bs) : tokens;
  const int64_t kv_elems = blocks * bs * c.hkv * c.d, q_elems = tokens * c.hq * c.d;
  const size_t kv_bytes = size_t(kv_elems) * (c.code == KvCode::kNone ? 2 : 1);
  DeviceBuffer q(size_t(q_elems) * 2), k(kv_bytes), v(kv_bytes), out_flash(size_t(q_elems) * 2),
      out_128(size_t(q_elems) * 2), out_128r32(size_t(q_elems) * 2), out_tile(size_t(q_elems) * 2);
  DeviceBuffer k_scales, v_scales;
  launch_fill_random(q.get(), DType::kBF16, q_elems, 1, nullptr);
  std::mt19937_64 rng(7);
  if (c.code == KvCode::kNone) {
    launch_fill_random(k.get(), DType::kBF16, kv_elems, 2, nullptr);
    launch_fill_random(v.get(), DType::kBF16, kv_elems, 3, nullptr);
  } else {
    // E4M3 codes (no NaN: 0x7f / 0xff excluded) with per (slot, head) scales near 1/224.
    std::vector<uint8_t> codes(static_cast<size_t>(kv_elems));
    for (uint8_t& x : codes) x = uint8_t((rng() & 0xff) % 0x7f) | uint8_t(rng() & 0x80);
    k = upload(codes);
    for (uint8_t& x : codes) x = uint8_t((rng() & 0xff) % 0x7f) | uint8_t(rng() & 0x80);
    v = upload(codes);
    std::uniform_real_distribution<float> u(0.5f / 224, 1.5f / 224);
    std::vector<float> sc(size_t(blocks * bs * c.hkv));
    for (float& x : sc) x = u(rng);
    k_scales = upload(sc);
    for (float& x : sc) x = u(rng);
    v_scales = upload(sc);
  }
  std::vector<AttnSeq> seqs;
  std::vector<int32_t> tables;
  std::vector<int32_t> pool(size_t(cache ? blocks : 0));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  for (int32_t s = 0; s < c.seqs; ++s) {
    seqs.push_back({s * c.len, c.len, c.len, int32_t(tables.size())});
    const int64_t n = cache ? (c.len + bs - 1) / bs : c.len;
    for (int64_t i = 0; i < n; ++i)
      tables.push_back(cache ? pool[size_t(s * n + i)] : int32_t(s * c.len + i));
  }
  DeviceBuffer dseqs = upload(seqs), dtables = upload(tables);

  // flash: the tensor-core plan of CTAs `width` items wide (0: the plan's pick, with the
  // key splits it makes for a short grid); else the tile kernel's (prefill rows: never split).
  DeviceBuffer combine_flash, ws_flash;
  auto args_for = [&](bool flash, int width, DeviceBuffer& work, int32_t& num_work, void* out) {
    const bool picked = flash && width == 0;
    const AttentionPlan plan =
        attention_plan(seqs, c.hq, c.hkv, c.causal, num_sms, picked ? 0 : -1, flash ? 1 : 0, width);
    KILN_CHECK((plan.flash_width > 0) == flash && (width == 0 || plan.flash_width == width) &&
                   (picked || plan.num_partials == 0),
               "bench: not the plan asked for");
    work = upload(plan.work);
    num_work = int32_t(plan.work.size());
    AttentionArgs a;
    a.dtype = DType::kBF16;
    a.q = q.get();
    a.k_cache = k.get();
    a.v_cache = v.get();
    a.kv_code = c.code;
    a.k_scales = static_cast<const float*>(k_scales.get());
    a.v_scales = static_cast<const float*>(v_scales.get());
    a.max_q_len = c.len;
    a.out = out;
    a.block_size = bs;
    a.hq = c.hq;
    a.hkv = c.hkv;
    a.d = c.d;
    a.scale = float(1.0 / std::sqrt(double(c.d)));
    a.causal = c.causal;
    a.seqs = static_cast<const AttnSeq*>(dseqs.get());
    a.block_tables = static_cast<const int32_t*>(dtables.get());
    a.work = static_cast<const AttnWork*>(work.get());
    a.num_work = num_work;
    a.flash_width = plan.flash_width;
    a.flash_items_per_sm = plan.flash_items_per_sm;
    if (plan.num_partials > 0) {
      combine_flash = upload(plan.combine);
      ws_flash = DeviceBuffer(attention_workspace_floats(plan, c.hkv, c.d) * sizeof(float));
      a.combine = static_cast<const AttnCombine*>(combine_flash.get());
      a.num_combine = int32_t(plan.combine.size());
      a.num_partials = plan.num_partials;
      a.workspace = static_cast<float*>(ws_flash.get());
    }
    return a;
  };
  DeviceBuffer work_flash, work_128, work_128r32, work_tile;
  int32_t n_flash = 0, n_128 = 0, n_128r32 = 0, n_tile = 0;
  const AttentionArgs a_flash = args_for(true, 0, work_flash, n_flash, out_flash.get());
  AttentionArgs a_128 = args_for(true, 128, work_128, n_128, out_128.get());
  a_128.flash_warp_rows = 16;
  a_128.flash_items_per_sm = 256;  // the column of the 256-item form, whatever the plan picks
  AttentionArgs a_128r32 = args_for(true, 128, work_128r32, n_128r32, out_128r32.get());
  a_128r32.flash_warp_rows = 32;
  const AttentionArgs a_tile = args_for(false, 0, work_tile, n_tile, out_tile.get());
  launch_attention(a_flash, nullptr);
  launch_attention(a_128, nullptr);
  launch_attention(a_128r32, nullptr);
  launch_attention(a_tile, nullptr);
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> yf = to_host_f32(out_flash.get(), q_elems), y128 = to_host_f32(out_128.get(), q_elems),
                           y32 = to_host_f32(out_128r32.get(), q_elems), yt = to_host_f32(out_tile.get(), q_elems);
  double dmax = 0, ymax = 0;
  bool finite = true;
  for (size_t i = 0; i < yf.size(); ++i) {
    finite = finite && std::isfinite(yf[i]) && std::isfinite(y128[i]) && std::isfinite(y32[i]);
    dmax = std::max({dmax, double(std::fabs(yf[i] - yt[i])), double(std::fabs(y128[i] - yt[i])),
                     double(std::fabs(y32[i] - yt[i]))});
    ymax = std::max(ymax, double(std::fabs(yt[i])));
  }
  const float t_flash = bench::median_ms([&] { launch_attention(a_flash, nullptr); }, 20, 5);
  const float t_128 = bench::median_ms([&] { launch_attention(a_128, nullptr); }, 20, 5);
  const float t_128r32 = bench::median_ms([&] { launch_attention(a_128r32, nullptr); }, 20, 5);
  const float t_tile = bench::median_ms([&] { launch_attention(a_tile, nullptr); }, 20, 5);
  const double pairs = c.causal ? double(c.len) * (c.len + 1) / 2 : double(c.len) * c.len;
  const double flop = 4.0 * double(c.hq) * double(c.d) * pairs * c.seqs;
  const double bytes = 2.0 * double(q_elems) * 2 + 2.0 * double(tokens * c.hkv * c.d) * (c.code == KvCode::kNone ? 2 : 1);
  std::printf(
      "| %s | %d x %d | %s | %d x %d, %d/SM | %.4f (%.0f, %.0f GB/s) | %.4f (%.0f) | %.4f (%.0f) | %.2fx | %.4f (%.0f) | "
      "%.2fx | %d / %d / %d | %.2e / %.2e%s |\n",
      c.name, c.seqs, c.len, c.code == KvCode::kFp8 ? "fp8" : "bf16", a_flash.flash_width,
      attention_flash_warp_rows(a_flash), a_flash.flash_items_per_sm, t_flash, flop / (t_flash * 1e-3) / 1e12, bytes / (t_flash * 1e-3) / 1e9,
      t_128, flop / (t_128 * 1e-3) / 1e12, t_128r32, flop / (t_128r32 * 1e-3) / 1e12, t_128 / t_128r32, t_tile,
      flop / (t_tile * 1e-3) / 1e12, t_tile / t_flash, n_flash * int(c.hkv), n_128 * int(c.hkv),
      n_tile * int(c.hkv), dmax, ymax, finite ? "" : " NON-FINITE");
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> which;
  int32_t only_len = 0, only_seqs = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--len" && i + 1 < argc)
      only_len = int32_t(std::stol(argv[++i]));
    else if (arg == "--seqs" && i + 1 < argc)
      only_seqs = int32_t(std::stol(argv[++i]));
    else
      which.push_back(arg);
  }
  auto want = [&](const char* w) {
    return which.empty() || std::find(which.begin(), which.end(), w) != which.end();
  };
  int dev = 0, num_sms = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, dev));
  {
    Gemm gemm;
    const int64_t s = 8192;
    DeviceBuffer a(size_t(s * s) * 2), b(size_t(s * s) * 2), c(size_t(s * s) * 2);
    launch_fill_random(a.get(), DType::kBF16, s * s, 1, nullptr);
    launch_fill_random(b.get(), DType::kBF16, s * s, 2, nullptr);
    const float ms = bench::median_ms(
        [&] { gemm.run(DType::kBF16, a.get(), b.get(), nullptr, c.get(), s, s, s, nullptr); }, 10,
        3);
    std::printf("cuBLASLt 8192^3 bf16: %.0f TFLOP/s (%d SMs)\n",
                2.0 * double(s) * s * s / (ms * 1e-3) / 1e12, num_sms);
  }
  std::printf("device copy 1 GiB: %.0f GB/s (read + write)\n\n", bench::device_copy_gbs());
  std::printf(
      "| shape | seqs x tokens | cache | width x warp rows, items/SM | flash ms, picked (TFLOP/s, GB/s) | 128 x 16 ms (TFLOP/s) "
      "| 128 x 32 ms (TFLOP/s) | 16 / 32 rows | tile ms (TFLOP/s) | tile / flash | CTAs width / 128 / tile |"
      " max|flash - tile| / max|tile| |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::vector<Case> cases;
  if (want("8b"))
    for (int32_t p : {512, 2048, 8192})
      cases.push_back({"Llama-3.1-8B 32/8 d128 causal", 32, 8, 128, 1, p, true});
  if (want("8b"))
    cases.push_back({"Llama-3.1-8B 32/8 d128 causal", 32, 8, 128, 1, 2048, true, KvCode::kFp8});
  if (want("1b"))
    for (int32_t p : {512, 2048, 8192})
      cases.push_back({"Llama-3.2-1B 32/8 d64 causal", 32, 8, 64, 1, p, true});
  if (want("qwen3"))
    for (int32_t p : {512, 2048})
      cases.push_back({"Qwen3-0.6B 16/8 d128 causal", 16, 8, 128, 1, p, true});
  if (want("gemma3"))
    for (int32_t p : {512, 2048})
      cases.push_back({"Gemma-3-1B 4/1 d256 causal", 4, 1, 256, 1, p, true});
  if (want("bert"))
    for (int32_t b : {1, 8, 32}) cases.push_back({"BERT-base 12/12 d64 bidirectional", 12, 12, 64, b, 128, false});
  for (const Case& c : cases)
    if ((only_len == 0 || c.len == only_len) && (only_seqs == 0 || c.seqs == only_seqs)) run_case(c, num_sms);
  return 0;
}
