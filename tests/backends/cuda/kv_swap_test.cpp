// KV memory on the CUDA backend: the device's free memory (cudaMemGetInfo), the pool's
// bytes per block in the activation dtype, copying blocks and swapping them to pinned
// host slots and back (bytes compared exactly; the int8/fp8 pools' scales with their
// codes), and the executor preempting by swap on the GPU with a
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
  // int8/fp8: a byte per element plus an f32 scale per (token, head), K and V, every layer
  // (what --kv-cache-fraction sizes the pool by).
  for (KvDType dt : {KvDType::kInt8, KvDType::kFp8}) {
    KvLayout q = layout;
    q.dtype = dt;
    EXPECT_EQ(be->kv_block_bytes(q), size_t(2 * 4 * 16 * 2 * 64) + size_t(2 * 4 * 16 * 2) * 4) << kv_dtype_name(dt);
  }
  KvLayout odd = layout;
  odd.dtype = KvDType::kInt8;
  odd.head_dim = 24;
  EXPECT_THROW(be->allocate_kv(odd), Error);  // codes are read in 16-byte vectors
  auto kv = be->allocate_kv(layout);
  EXPECT_EQ(kv->block_bytes(), be->kv_block_bytes(layout));
  const size_t after = be->memory_info().free_bytes;
  EXPECT_LE(after + 1024 * kv->block_bytes() - (size_t(4) << 20), m.free_bytes);
}

// Every pool dtype: auto (activation elements), int8 and fp8 (one-byte codes plus the
// per (token, head) scales, which must travel with their block).
TEST(CudaKvMemory, BlocksRoundTripThroughPinnedHostSlots) {
  KILN_SKIP_WITHOUT_CUDA();
  auto be = create_backend("cuda");
  for (KvDType dt : {KvDType::kAuto, KvDType::kInt8, KvDType::kFp8}) {
    SCOPED_TRACE(kv_dtype_name(dt));
    KvLayout layout{.num_layers = 3, .num_blocks = 8, .block_size = 4, .num_kv_heads = 2, .head_dim = 16,
                    .dtype = dt};
    auto storage = be->allocate_kv(layout);
    auto* kv = dynamic_cast<CudaKv*>(storage.get());
    ASSERT_NE(kv, nullptr);
    const bool quantized = dt != KvDType::kAuto;
    ASSERT_EQ(kv->code() != KvCode::kNone, quantized);
    // The test reads and writes the pool with cudaMemcpy on the default stream, which does
    // not order with the storage's (non-blocking) stream: it synchronizes the device
    // between the two. Engine steps share the storage's stream, so they need not.
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const size_t lb = size_t(layout.block_elems()) * (quantized ? 1 : dtype_size(kv->dtype()));
    const size_t sb = quantized ? size_t(layout.block_size * layout.num_kv_heads) * 4 : 0;
    EXPECT_EQ(kv->block_bytes(), size_t(layout.num_layers) * 2 * (lb + sb));
    EXPECT_EQ(be->kv_block_bytes(layout), kv->block_bytes());
    // The parts of block b in layer l: K and V elements/codes, then (quantized) K and V scales.
    auto parts = [&](int64_t l, int32_t b) {
      std::vector<std::pair<char*, size_t>> p = {{static_cast<char*>(kv->k(l)) + size_t(b) * lb, lb},
                                                 {static_cast<char*>(kv->v(l)) + size_t(b) * lb, lb}};
      if (quantized) {
        p.emplace_back(reinterpret_cast<char*>(kv->k_scales(l)) + size_t(b) * sb, sb);
        p.emplace_back(reinterpret_cast<char*>(kv->v_scales(l)) + size_t(b) * sb, sb);
      }
      return p;
    };
    // Every byte of the pool gets a value from (layer, part, block, offset).
    auto pattern = [&](int64_t l, size_t part, int64_t block, size_t i, uint8_t tag) {
      return uint8_t(tag * 31 + l * 7 + part * 3 + block * 11 + i);
    };
    auto write_block = [&](int32_t b, uint8_t tag) {
      for (int64_t l = 0; l < layout.num_layers; ++l) {
        auto ps = parts(l, b);
        for (size_t part = 0; part < ps.size(); ++part) {
          std::vector<uint8_t> h(ps[part].second);
          for (size_t i = 0; i < h.size(); ++i) h[i] = pattern(l, part, b, i, tag);
          ASSERT_EQ(cudaMemcpy(ps[part].first, h.data(), h.size(), cudaMemcpyHostToDevice), cudaSuccess);
        }
      }
    };
    // Whether block `b` holds what write_block(src, tag) wrote.
    auto holds = [&](int32_t b, int32_t src, uint8_t tag) {
      for (int64_t l = 0; l < layout.num_layers; ++l) {
        auto ps = parts(l, b);
        for (size_t part = 0; part < ps.size(); ++part) {
          std::vector<uint8_t> h(ps[part].second);
          EXPECT_EQ(cudaMemcpy(h.data(), ps[part].first, h.size(), cudaMemcpyDeviceToHost), cudaSuccess);
          for (size_t i = 0; i < h.size(); ++i)
            if (h[i] != pattern(l, part, src, i, tag)) return false;
        }
      }
      return true;
    };
    for (int32_t b = 0; b < 8; ++b) write_block(b, 1);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    storage->copy_block(4, 1);  // copy-on-write
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_TRUE(holds(1, 4, 1));
    write_block(1, 1);
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
