// Block allocator and KV cache manager: allocation, exhaustion, reference counts,
// fork + copy-on-write of a shared partial block, slots.
#include <gtest/gtest.h>

#include "backends/backend.h"
#include "runtime/kv_cache/block_allocator.h"

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

}  // namespace
}  // namespace kiln
