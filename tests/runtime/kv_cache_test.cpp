// Block allocator and KV cache manager: allocation, exhaustion, reference counts,
// fork + copy-on-write of a shared partial block, slots. KV pool sizing from free
// memory (arithmetic, errors, /proc/meminfo), and the host swap space: CPU storage
// round trips, slot accounting, partial swap-in over re-shared blocks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "backends/backend.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/cpu_ops.h"
#include "core/status.h"
#include "runtime/kv_cache/block_allocator.h"
#include "runtime/kv_cache/kv_sizing.h"
#include "runtime/kv_cache/swap_space.h"

namespace kiln {
namespace {

// Records block copies instead of moving data.
class FakeStorage : public KvStorage {
 public:
  const KvLayout& layout() const override { return layout_; }
  void copy_block(int32_t src, int32_t dst) override { copies.emplace_back(src, dst); }
  std::vector<std::pair<int32_t, int32_t>> copies;
  KvLayout layout_;
};

TEST(BlockAllocator, AllocatesUntilExhaustedAndRecycles) {
  BlockAllocator a(3);
  int32_t b0 = a.allocate(), b1 = a.allocate(), b2 = a.allocate();
  EXPECT_EQ(a.allocate(), -1);
  EXPECT_EQ(a.num_free(), 0);
  a.retain(b1);
  a.release(b1);
  EXPECT_EQ(a.num_free(), 0);
  a.release(b1);
  EXPECT_EQ(a.num_free(), 1);
  EXPECT_EQ(a.allocate(), b1);
  (void)b0;
  (void)b2;
}

TEST(KvCacheManager, GrowsBlockByBlockAndMapsSlots) {
  KvCacheManager m(nullptr, 8, 4);
  KvSequence s;
  ASSERT_TRUE(m.grow(s, 5));
  EXPECT_EQ(s.blocks.size(), 2u);
  EXPECT_EQ(m.slot(s, 0), int64_t(s.blocks[0]) * 4);
  EXPECT_EQ(m.slot(s, 4), int64_t(s.blocks[1]) * 4);
  ASSERT_TRUE(m.grow(s, 3));  // fills block 1 exactly
  EXPECT_EQ(s.blocks.size(), 2u);
  EXPECT_EQ(s.length, 8);
  m.free(s);
  EXPECT_EQ(m.allocator().num_free(), 8);
}

TEST(KvCacheManager, AllOrNothingWhenPoolIsShort) {
  KvCacheManager m(nullptr, 2, 4);
  KvSequence s;
  EXPECT_FALSE(m.grow(s, 9));  // needs 3 blocks
  EXPECT_TRUE(s.blocks.empty());
  EXPECT_EQ(m.allocator().num_free(), 2);
}

TEST(KvCacheManager, ForkSharesThenCopiesOnWrite) {
  FakeStorage st;
  KvCacheManager m(&st, 8, 4);
  KvSequence a;
  ASSERT_TRUE(m.grow(a, 6));  // block 0 full, block 1 half
  KvSequence b = m.fork(a);
  EXPECT_EQ(m.allocator().num_free(), 6);
  EXPECT_EQ(m.allocator().refcount(a.blocks[1]), 2);
  EXPECT_EQ(m.blocks_needed(b, 1), 1);
  ASSERT_TRUE(m.grow(b, 1));  // writes into the shared half block: copy it first
  ASSERT_EQ(st.copies.size(), 1u);
  EXPECT_EQ(st.copies[0].first, a.blocks[1]);
  EXPECT_EQ(st.copies[0].second, b.blocks[1]);
  EXPECT_EQ(b.blocks[0], a.blocks[0]);  // the full block stays shared
  EXPECT_NE(b.blocks[1], a.blocks[1]);
  EXPECT_EQ(m.allocator().refcount(a.blocks[1]), 1);
  m.free(a);
  m.free(b);
  EXPECT_EQ(m.allocator().num_free(), 8);
}

// ---- pool sizing ---------------------------------------------------------------------

KvPoolBudget budget(double fraction, size_t free_bytes, size_t activation_bytes) {
  KvPoolBudget b;
  b.fraction = fraction;
  b.free_bytes = free_bytes;
  b.activation_bytes = activation_bytes;
  b.block_bytes = 8192;
  b.block_size = 16;
  b.request_blocks = 9;
  b.device = "cpu";
  return b;
}

std::string error_of(const KvPoolBudget& b, ErrorCode* code = nullptr) {
  try {
    kv_pool_size(b);
  } catch (const Error& e) {
    if (code) *code = e.code();
    return e.what();
  }
  return "";
}

TEST(KvPoolSize, TakesTheFractionOfWhatActivationsLeave) {
  // 10 MiB free, 2 MiB of activations to come: 0.5 x 8 MiB / 8 KiB = 512 blocks.
  KvPoolSize s = kv_pool_size(budget(0.5, 10 << 20, 2 << 20));
  EXPECT_EQ(s.blocks, 512);
  EXPECT_EQ(s.usable_bytes, size_t(4) << 20);
  // Floor, not round: one byte short of 513 blocks.
  EXPECT_EQ(kv_pool_size(budget(1.0, 513 * 8192 - 1, 0)).blocks, 512);
  EXPECT_EQ(kv_pool_size(budget(1.0, 513 * 8192, 0)).blocks, 513);
  // The options' own size caps it when smaller, not when larger.
  KvPoolBudget capped = budget(0.5, 10 << 20, 2 << 20);
  capped.cap_blocks = 100;
  capped.request_blocks = 100;
  EXPECT_EQ(kv_pool_size(capped).blocks, 100);
  capped.cap_blocks = 100000;
  EXPECT_EQ(kv_pool_size(capped).blocks, 512);
}

TEST(KvPoolSize, RefusesAPoolThatCannotHoldOneRequestSayingWhatToChange) {
  // 8 blocks fit (0.5 x 128 KiB / 8 KiB) where 9 are needed.
  ErrorCode code = ErrorCode::kInternal;
  const std::string e = error_of(budget(0.5, 128 << 10, 0), &code);
  EXPECT_EQ(code, ErrorCode::kOutOfMemory);
  for (const char* part : {"needs 9 blocks", "(0.070 MiB)", "--kv-cache-fraction 0.5", "0.125 MiB free on cpu",
                           "gives 0.062 MiB (8 blocks)", "raise --kv-cache-fraction"})
    EXPECT_NE(e.find(part), std::string::npos) << part << " not in: " << e;
  // Activations larger than what is free: nothing is left at all.
  EXPECT_NE(error_of(budget(0.9, 1 << 20, 2 << 20)).find("0.0 MiB free on cpu"), std::string::npos);
  for (double f : {0.0, -0.5, 1.5}) {
    ErrorCode c = ErrorCode::kInternal;
    EXPECT_NE(error_of(budget(f, 1 << 30, 0), &c).find("must be in (0, 1]"), std::string::npos) << f;
    EXPECT_EQ(c, ErrorCode::kInvalidArgument);
  }
}

TEST(CpuMemoryInfo, ParsesMemAvailableAndMemTotal) {
  DeviceMemory m = cpu_meminfo_parse(
      "MemTotal:       16318412 kB\nMemFree:          512000 kB\nMemAvailable:    8000000 kB\nBuffers: 1 kB\n");
  EXPECT_EQ(m.total_bytes, size_t(16318412) * 1024);
  EXPECT_EQ(m.free_bytes, size_t(8000000) * 1024);  // MemAvailable, not MemFree
  EXPECT_EQ(m.device, "cpu");
  DeviceMemory none = cpu_meminfo_parse("garbage\n\nMemFree: x kB\n");
  EXPECT_EQ(none.total_bytes, 0u);
  EXPECT_EQ(none.free_bytes, 0u);
  // The real one: something free, no more than there is.
  DeviceMemory real = create_backend("cpu")->memory_info();
  EXPECT_GT(real.free_bytes, 0u);
  EXPECT_LE(real.free_bytes, real.total_bytes);
}

// ---- host swap space ------------------------------------------------------------------

class CpuSwapTest : public ::testing::Test {
 protected:
  void SetUp() override {
    layout_ = {.num_layers = 3, .num_blocks = 8, .block_size = 4, .num_kv_heads = 2, .head_dim = 5};
    storage_ = create_backend("cpu")->allocate_kv(layout_);
    kv_ = dynamic_cast<cpu::CpuKv*>(storage_.get());
    ASSERT_NE(kv_, nullptr);
    for (int32_t b = 0; b < 8; ++b) fill(b, float(b));
  }
  // Every element of block b gets a value unique to (layer, K/V, block, element).
  void fill(int32_t b, float tag) {
    const int64_t n = layout_.block_elems();
    for (int64_t l = 0; l < layout_.num_layers; ++l)
      for (int64_t i = 0; i < n; ++i) {
        kv_->k(l)[b * n + i] = tag * 1000 + float(l * 100 + i);
        kv_->v(l)[b * n + i] = -(tag * 1000 + float(l * 100 + i));
      }
  }
  // Whether block b holds what fill(b', tag) wrote.
  bool holds(int32_t b, float tag) {
    const int64_t n = layout_.block_elems();
    for (int64_t l = 0; l < layout_.num_layers; ++l)
      for (int64_t i = 0; i < n; ++i)
        if (kv_->k(l)[b * n + i] != tag * 1000 + float(l * 100 + i) ||
            kv_->v(l)[b * n + i] != -(tag * 1000 + float(l * 100 + i)))
          return false;
    return true;
  }
  KvLayout layout_;
  std::unique_ptr<KvStorage> storage_;
  cpu::CpuKv* kv_ = nullptr;
};

TEST_F(CpuSwapTest, BlocksRoundTripThroughHostSlots) {
  EXPECT_EQ(storage_->block_bytes(), size_t(2 * 3 * 4 * 2 * 5) * 4);
  EXPECT_EQ(create_backend("cpu")->kv_block_bytes(layout_), storage_->block_bytes());
  storage_->host_reserve(3);
  EXPECT_EQ(storage_->host_blocks(), 3);
  const std::vector<KvSwapCopy> out = {{2, 1}, {5, 0}, {6, 2}};
  storage_->swap_out(out);
  for (int32_t b : {2, 5, 6}) fill(b, 99);  // the pool reuses the blocks
  const std::vector<KvSwapCopy> in = {{7, 1}, {3, 0}, {2, 2}};
  storage_->swap_in(in);
  EXPECT_TRUE(holds(7, 2));
  EXPECT_TRUE(holds(3, 5));
  EXPECT_TRUE(holds(2, 6));
  EXPECT_TRUE(holds(5, 99));  // untouched
  const std::vector<KvSwapCopy> bad_slot = {{1, 3}}, bad_block = {{8, 0}};
  EXPECT_THROW(storage_->swap_out(bad_slot), Error);
  EXPECT_THROW(storage_->swap_in(bad_block), Error);
  storage_->host_reserve(0);
  EXPECT_EQ(storage_->host_blocks(), 0);
}

// The quantized pools (int8, fp8): a block's codes AND its per-(token, head) scales move
// together on copy-on-write and through the host swap space.
class CpuKvQuantized : public ::testing::TestWithParam<KvDType> {};

TEST_P(CpuKvQuantized, CopyAndSwapMoveScalesWithCodes) {
  KvLayout layout{.num_layers = 2, .num_blocks = 5, .block_size = 4, .num_kv_heads = 2, .head_dim = 8,
                  .dtype = GetParam()};
  auto backend = create_backend("cpu");
  auto storage = backend->allocate_kv(layout);
  auto* kv = dynamic_cast<cpu::CpuKv*>(storage.get());
  ASSERT_NE(kv, nullptr);
  ASSERT_TRUE(kv->is_quantized());
  // Codes 1 byte each, plus one f32 scale per (token, head), for K and V of each layer.
  const size_t want = size_t(2 * 2 * 4 * 2 * 8) + size_t(2 * 2 * 4 * 2) * 4;
  EXPECT_EQ(storage->block_bytes(), want);
  EXPECT_EQ(backend->kv_block_bytes(layout), want);
  // Rows of block b in every layer: scaled differently per block, so scales differ.
  const int64_t row = 2 * 8;
  auto write_block = [&](int32_t b, float amp) {
    std::vector<float> k(size_t(4 * row)), v(k.size());
    for (size_t i = 0; i < k.size(); ++i) {
      k[i] = amp * std::sin(float(i) + amp);
      v[i] = -amp * std::cos(float(i) * 0.7f + amp);
    }
    std::vector<int64_t> slots = {b * 4, b * 4 + 1, b * 4 + 2, b * 4 + 3};
    for (int64_t l = 0; l < 2; ++l)
      if (kv->is_fp8())
        cpu::kv_cache_write_fp8(k.data(), v.data(), slots.data(), 4, 2, 8, kv->k_fp8(l), kv->k_scales(l),
                                kv->v_fp8(l), kv->v_scales(l));
      else
        cpu::kv_cache_write_int8(k.data(), v.data(), slots.data(), 4, 2, 8, kv->k_codes(l), kv->k_scales(l),
                                 kv->v_codes(l), kv->v_scales(l));
  };
  // Snapshot of block b: codes and scales of K and V in every layer.
  auto snapshot = [&](int32_t b) {
    std::vector<float> s;
    for (int64_t l = 0; l < 2; ++l)
      for (int64_t i = 0; i < 4 * row; ++i) {
        s.push_back(kv->k_codes(l)[b * 4 * row + i]);
        s.push_back(kv->v_codes(l)[b * 4 * row + i]);
        if (i < 4 * 2) {
          s.push_back(kv->k_scales(l)[b * 4 * 2 + i]);
          s.push_back(kv->v_scales(l)[b * 4 * 2 + i]);
        }
      }
    return s;
  };
  for (int32_t b = 0; b < 5; ++b) write_block(b, 0.5f + float(b) * 3);
  const auto b1 = snapshot(1), b3 = snapshot(3);
  ASSERT_NE(b1, b3);
  storage->copy_block(1, 3);
  EXPECT_EQ(snapshot(3), b1);
  EXPECT_THROW(storage->copy_block(1, 5), Error);
  storage->host_reserve(2);
  const auto b2 = snapshot(2);
  const std::vector<KvSwapCopy> out = {{2, 1}, {3, 0}};
  storage->swap_out(out);
  write_block(2, 40.0f);  // reused blocks get other rows and scales
  write_block(3, 50.0f);
  ASSERT_NE(snapshot(2), b2);
  const std::vector<KvSwapCopy> in = {{4, 1}, {0, 0}};
  storage->swap_in(in);
  EXPECT_EQ(snapshot(4), b2);
  EXPECT_EQ(snapshot(0), b1);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CpuKvQuantized, ::testing::Values(KvDType::kInt8, KvDType::kFp8),
                         [](const auto& info) { return std::string(kv_dtype_name(info.param)); });

TEST_F(CpuSwapTest, SwapSpaceHandsOutSlotsAndRestoresIntoFreshBlocks) {
  KvCacheManager m(storage_.get(), 8, 4);
  // Two host slots' worth of bytes, plus change.
  KvSwapSpace swap(m, *storage_, 2 * storage_->block_bytes() + 7);
  EXPECT_EQ(swap.num_slots(), 2);
  KvSequence a, b;
  ASSERT_TRUE(m.grow(a, 6));  // 2 blocks
  ASSERT_TRUE(m.grow(b, 9));  // 3 blocks
  for (size_t i = 0; i < a.blocks.size(); ++i) fill(a.blocks[i], float(10 + i));
  SwappedKv sa, sb;
  EXPECT_FALSE(swap.swap_out(b, sb));  // 3 blocks, 2 slots: nothing happens
  EXPECT_TRUE(sb.empty());
  EXPECT_EQ(swap.num_free(), 2);
  ASSERT_TRUE(swap.swap_out(a, sa));
  EXPECT_EQ(swap.num_free(), 0);
  EXPECT_EQ(sa.length, 6);
  m.free(a);
  // Others overwrite the freed blocks.
  KvSequence c;
  ASSERT_TRUE(m.grow(c, 32 - 12));
  for (int32_t blk : c.blocks) fill(blk, 77);
  EXPECT_FALSE(swap.swap_in(sa, a));  // the pool is full: nothing happens
  EXPECT_EQ(swap.num_free(), 0);
  m.free(c);
  // Back in, with its first block re-shared (as from the prefix cache): only the second
  // is copied.
  KvSequence restored;
  restored.blocks.push_back(m.allocator().allocate());
  fill(restored.blocks[0], 10);
  ASSERT_TRUE(swap.swap_in(sa, restored));
  EXPECT_EQ(restored.length, 6);
  ASSERT_EQ(restored.blocks.size(), 2u);
  EXPECT_TRUE(holds(restored.blocks[1], 11));
  EXPECT_EQ(swap.num_free(), 2);
  EXPECT_TRUE(sa.empty());
  EXPECT_EQ(swap.stats().swapped_out, 1);
  EXPECT_EQ(swap.stats().swapped_in, 1);
  EXPECT_EQ(swap.stats().out_bytes, int64_t(2 * storage_->block_bytes()));
  EXPECT_EQ(swap.stats().in_bytes, int64_t(storage_->block_bytes()));
  // Release without resuming gives the slots back.
  ASSERT_TRUE(swap.swap_out(restored, sa));
  EXPECT_EQ(swap.num_free(), 0);
  swap.release(sa);
  EXPECT_EQ(swap.num_free(), 2);
  m.free(restored);
  m.free(b);
  EXPECT_EQ(m.allocator().num_free(), 8);
}

TEST(KvStorage, StoragesWithoutSwapSpaceRefuseIt) {
  FakeStorage st;
  st.host_reserve(0);  // nothing asked, nothing refused
  try {
    st.host_reserve(4);
    ADD_FAILURE() << "a storage without swap space reserved some";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("--preemption recompute"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln
