// TopKLogits on the GPU (the decode step's last kernel): k = 64 over bf16 logits rows of
// GPT-2 (50257) and Llama-3 (128256) at batch 1, 64 and 256, the split kernels (the
// default, and with a CTA per chunk instead of a grid that fits the device; every chunk
// size with `sweep`) against the one-CTA-per-row kernel (the plan for rows the split does
// not fit, forced here): the median time of one launch alone and of 20 back to back (CUDA
// events, 50 repeats), and the logits bytes read per second back to back against a
// device-to-device copy measured in the same run (read + write bytes). Before timing, the
// split outputs are checked against the one-CTA-per-row kernel's: ids and values identical,
// the largest log-prob difference printed.
// k = 1 is a greedy step's width (StepInfo::top_k: the argmax and its log-prob).
//   cuda_topk_bench [sweep] [k]   (k defaults to 64)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/cuda_context.h"
#include "cuda_bench_util.h"
#include "backends/cuda/ops/topk.h"
#include "core/status.h"

using namespace kiln;
using namespace kiln::cuda;
using bench::median_ms;

namespace {

uint16_t to_bf16(float f) {  // round to nearest even (no NaN here)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

struct Outputs {
  std::vector<float> values, logprobs;
  std::vector<int32_t> ids;
};

}  // namespace

int main(int argc, char** argv) {
  bool sweep = false;
  int64_t k = 64;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "sweep") {
      sweep = true;
    } else {
      k = std::atoll(a.c_str());
      if (k < 1 || k > 1024) {
        std::fprintf(stderr, "cuda_topk_bench: k must be in [1, 1024], got '%s'\n", a.c_str());
        return 2;
      }
    }
  }
  const double copy_gbs = bench::device_copy_gbs();
  std::printf("device-to-device copy: %.0f GB/s (read + write)\n\n", copy_gbs);
  std::printf("| rows x vocab (bf16, k %lld) | kernel | chunk | us, alone | us, 20 back to back | logits GB/s | %% of copy | check vs one CTA a row |\n"
              "|---|---|---|---|---|---|---|---|\n", (long long)k);
  const TopKConfig cfg = topk_logits_config(DType::kBF16);
  std::mt19937_64 rng(1);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  for (int64_t v : {50257, 128256})
    for (int64_t rows : {1, 64, 256}) {
      std::vector<uint16_t> host(size_t(rows * v));
      for (auto& h : host) h = to_bf16(dist(rng));
      DeviceBuffer x(host.size() * 2), values(size_t(rows * k) * 4), ids(size_t(rows * k) * 4),
          logprobs(size_t(rows * k) * 4);
      KILN_CUDA_CHECK(cudaMemcpy(x.get(), host.data(), host.size() * 2, cudaMemcpyHostToDevice));
      auto fetch = [&] {
        Outputs o{std::vector<float>(size_t(rows * k)), std::vector<float>(size_t(rows * k)),
                  std::vector<int32_t>(size_t(rows * k))};
        KILN_CUDA_CHECK(cudaMemcpy(o.values.data(), values.get(), o.values.size() * 4, cudaMemcpyDeviceToHost));
        KILN_CUDA_CHECK(cudaMemcpy(o.logprobs.data(), logprobs.get(), o.logprobs.size() * 4, cudaMemcpyDeviceToHost));
        KILN_CUDA_CHECK(cudaMemcpy(o.ids.data(), ids.get(), o.ids.size() * 4, cudaMemcpyDeviceToHost));
        return o;
      };
      auto full = [&](TopKPlan p) {
        p.grid = rows * p.chunks;
        return p;
      };
      std::vector<std::pair<std::string, TopKPlan>> plans = {
          {"one CTA a row", TopKPlan{.dtype = DType::kBF16}},
          {"split", topk_logits_plan(cfg, rows, v, k)},
          {"split, a CTA per chunk", full(topk_logits_plan(cfg, rows, v, k))}};
      if (sweep)
        for (int chunk = 512; chunk <= 8192; chunk *= 2) {
          plans.push_back({"split (forced)", topk_logits_plan(cfg, rows, v, k, chunk)});
          plans.push_back({"split (forced), a CTA per chunk", full(topk_logits_plan(cfg, rows, v, k, chunk))});
        }
      Outputs ref;
      for (size_t p = 0; p < plans.size(); ++p) {
        const TopKPlan& plan = plans[p].second;
        DeviceBuffer scratch(std::max<size_t>(plan.scratch_bytes, 1));
        auto run = [&] {
          launch_topk_logits(DType::kBF16, x.get(), rows, v, k, static_cast<float*>(values.get()),
                             static_cast<int32_t*>(ids.get()), static_cast<float*>(logprobs.get()), plan,
                             scratch.get(), nullptr);
        };
        run();
        KILN_CUDA_CHECK(cudaDeviceSynchronize());
        Outputs got = fetch();
        std::string check = "reference";
        if (p == 0) {
          ref = got;
        } else {
          int64_t bad = 0;
          double max_err = 0;
          for (size_t i = 0; i < got.ids.size(); ++i) {
            bad += got.ids[i] != ref.ids[i] || std::memcmp(&got.values[i], &ref.values[i], 4) != 0;
            max_err = std::max(max_err, std::fabs(double(got.logprobs[i]) - double(ref.logprobs[i])));
          }
          char buf[96];
          std::snprintf(buf, sizeof buf, "%s, logprob max|diff| %.2g", bad ? "MISMATCH" : "ids/values equal", max_err);
          check = buf;
          if (bad) std::printf("  %lld of %lld entries differ\n", (long long)bad, (long long)got.ids.size());
        }
        const float alone = median_ms(run), busy = median_ms(run, 50, 20);
        const double gbs = double(rows * v * 2) / (busy * 1e-3) / 1e9;
        std::printf("| %lld x %lld | %s | %s | %.1f | %.1f | %.0f | %.1f | %s |\n", (long long)rows, (long long)v,
                    plans[p].first.c_str(), plan.split() ? std::to_string(1 << plan.chunk_log2).c_str() : "-",
                    alone * 1e3, busy * 1e3, gbs, 100.0 * gbs / copy_gbs, check.c_str());
      }
    }
  return 0;
}
