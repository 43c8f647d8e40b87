// KV memory on the CUDA backend: the device's free memory (cudaMemGetInfo), the pool's
// bytes per block in the activation dtype, swapping blocks to pinned host slots and
// back (bytes compared exactly), and the executor preempting by swap on the GPU with a
// pool sized by --kv-cache-fraction: each request's greedy tokens equal the request
// alone. Skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "backends/cuda/cuda_ops.h"
#include "cuda_test_util.h"
#include "runtime/executor.h"
#include "../../runtime/executor_test_util.h"
#include "runtime/llm_runner.h"

namespace kiln::cuda {
namespace {

using test_exec::run_all_at_once;

using namespace testing;

TEST(CudaKvMemory, FreeMemoryAndBlockBytes) {
  KILN_SKIP_WITHOUT_CUDA();
  auto be = create_backend("cuda");
  DeviceMemory m = be->memory_info();
  EXPECT_GT(m.free_bytes, 0u);
  EXPECT_LE(m.free_bytes, m.total_bytes);
  EXPECT_EQ(m.device.rfind("cuda:", 0), 0u) << m.device;
  std::printf("  %s: %.1f of %.1f GiB free\n", m.device.c_str(), double(m.free_bytes) / (1 << 30),
              double(m.total_bytes) / (1 << 30));
  // A pool of 16 MiB takes about 16 MiB of what is free.
  KvLayout layout{
      .num_layers = 4, .num_blocks = 1024, .block_size = 16, .num_kv_heads = 2, .head_dim = 64};
  EXPECT_EQ(be->kv_block_bytes(layout),
            size_t(2 * 4 * 16 * 2 * 64) * 2);  // bf16 until a graph is compiled
  auto kv = be->allocate_kv(layout);
  EXPECT_EQ(kv->block_bytes(), be->kv_block_bytes(layout));
  const size_t after = be->memory_info().free_bytes;
  EXPECT_LE(after + 1024 * kv->block_bytes() - (size_t(4) << 20), m.free_bytes);
}

TEST(CudaKvMemory, BlocksRoundTripThroughPinnedHostSlots) {
  KILN_SKIP_WITHOUT_CUDA();
  auto be = create_backend("cuda");
  KvLayout layout{
      .num_layers = 3, .num_blocks = 8, .block_size = 4, .num_kv_heads = 2, .head_dim = 8};
  auto storage = be->allocate_kv(layout);
  auto* kv = dynamic_cast<CudaKv*>(storage.get());
  ASSERT_NE(kv, nullptr);
  // The test reads and writes the pool with cudaMemcpy on the default stream, which does
  // not order with the storage's (non-blocking) stream: it synchronizes the device
  // between the two. Engine steps share the storage's stream, so they need not.
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const size_t lb = size_t(layout.block_elems()) * dtype_size(kv->dtype());
  // Every byte of the pool gets a value from (layer, K/V, block, offset).
  auto pattern = [&](int64_t l, int kv_side, int64_t block, size_t i, uint8_t tag) {
    return uint8_t(tag * 31 + l * 7 + kv_side * 3 + block * 11 + i);
  };
  auto write_block = [&](int32_t b, uint8_t tag) {
    std::vector<uint8_t> h(lb);
    for (int64_t l = 0; l < layout.num_layers; ++l)
      for (int side = 0; side < 2; ++side) {
        for (size_t i = 0; i < lb; ++i) h[i] = pattern(l, side, b, i, tag);
        char* dst = static_cast<char*>(side ? kv->v(l) : kv->k(l)) + size_t(b) * lb;
        ASSERT_EQ(cudaMemcpy(dst, h.data(), lb, cudaMemcpyHostToDevice), cudaSuccess);
      }
  };
  // Whether block `b` holds what write_block(src, tag) wrote.
  auto holds = [&](int32_t b, int32_t src, uint8_t tag) {
    std::vector<uint8_t> h(lb);
    for (int64_t l = 0; l < layout.num_layers; ++l)
      for (int side = 0; side < 2; ++side) {
        const char* from = static_cast<const char*>(side ? kv->v(l) : kv->k(l)) + size_t(b) * lb;
        EXPECT_EQ(cudaMemcpy(h.data(), from, lb, cudaMemcpyDeviceToHost), cudaSuccess);
        for (size_t i = 0; i < lb; ++i)
          if (h[i] != pattern(l, side, src, i, tag)) return false;
      }
    return true;
  };
  for (int32_t b = 0; b < 8; ++b) write_block(b, 1);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  storage->host_reserve(3);
  ASSERT_EQ(storage->host_blocks(), 3);
  const std::vector<KvSwapCopy> out = {{2, 1}, {5, 0}, {6, 2}};
  storage->swap_out(out);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int32_t b : {2, 5, 6}) write_block(b, 9);  // the pool reuses the blocks
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<KvSwapCopy> in = {{7, 1}, {3, 0}, {2, 2}};
  storage->swap_in(in);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_TRUE(holds(7, 2, 1));
  EXPECT_TRUE(holds(3, 5, 1));
  EXPECT_TRUE(holds(2, 6, 1));
  EXPECT_TRUE(holds(5, 5, 9));
  const std::vector<KvSwapCopy> bad = {{8, 0}};
  EXPECT_THROW(storage->swap_out(bad), Error);
  storage->host_reserve(0);
  EXPECT_EQ(storage->host_blocks(), 0);
}

// f32 so that batching cannot move a greedy choice (bf16 steps of other batch sizes
// may round differently and flip a near-tie).
TEST(CudaKvSwap, SwapPreemptionOnTheGpuKeepsGreedyOutputs) {
  KILN_SKIP_WITHOUT_CUDA();
  auto model =
      Model::load(fixtures_dir() + "/models/llama", {.backend = "cuda", .weight_dtype = "f32"});
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    GenerationRequest r;
    for (int t = 0; t < 20 + 3 * i; ++t) r.prompt.push_back(int32_t(3 + (t * 37 + i * 101) % 500));
    r.max_tokens = 24;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    reqs.push_back(r);
  }
  ExecutorOptions opt;
  opt.kv_cache_fraction = 0.5;  // of what cudaMemGetInfo reports
  opt.kv_tokens = 128;          // capped at 8 blocks of 16: the requests take turns
  opt.max_step_tokens = 64;
  opt.prefix_caching = false;
  opt.preemption = PreemptionMode::kSwap;
  opt.swap_space_bytes = 64 << 20;
  Executor ex(*model, nullptr, opt);
  EXPECT_EQ(ex.stats().kv_blocks_total, 8);
  auto got = run_all_at_once(ex, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_EQ(got[i].error, "");
    LlmRunner alone(*model);
    EXPECT_EQ(got[i].choices[0].tokens, alone.generate_greedy({reqs[i].prompt}, 24).at(0))
        << "request " << i;
  }
  ex.drain();
  std::this_thread::sleep_for(
      std::chrono::milliseconds(50));  // stats trail the last update by a turn
  ExecutorStats s = ex.stats();
  std::printf("  %lld preemptions, %lld swapped out (%.1f KiB), %lld back in (%.1f KiB)\n",
              (long long)s.preemptions, (long long)s.swapped_out, double(s.swap_out_bytes) / 1024,
              (long long)s.swapped_in, double(s.swap_in_bytes) / 1024);
  EXPECT_GT(s.swapped_out, 0);
  EXPECT_EQ(s.swapped_in, s.swapped_out);
  EXPECT_EQ(s.swap_fallbacks, 0);
  EXPECT_EQ(s.swap_blocks_used, 0);
  EXPECT_EQ(s.kv_blocks_free, s.kv_blocks_total);
}

}  // namespace
}  // namespace kiln::cuda
