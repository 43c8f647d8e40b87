// The executor's units with fakes: ordering policies, capacity and micro-batch
// schedulers, preemption victim, stop-string matching across pieces, the prefix cache
// (hits, sharing, LRU eviction) and the session store (reuse, expiry, LRU eviction) over
// a KvCacheManager without storage.
#include <gtest/gtest.h>

#include <numeric>

#include "runtime/kv_cache/prefix_cache.h"
#include "runtime/kv_cache/session_store.h"
#include "runtime/sampling_stop.h"
#include "runtime/scheduler/policy.h"

namespace kiln {
namespace {

SchedSeq seq(int64_t key, int64_t arrival, int32_t pending, bool decoding = false,
             int32_t priority = 0, int32_t blocks = 0) {
  SchedSeq s;
  s.key = key;
  s.arrival = arrival;
  s.pending = pending;
  s.decoding = decoding;
  s.priority = priority;
  s.blocks_needed = blocks;
  return s;
}

std::vector<int64_t> keys(const std::vector<SchedSeq>& v) {
  std::vector<int64_t> k;
  for (auto& s : v) k.push_back(s.key);
  return k;
}

TEST(SchedulerPolicy, FcfsOrdersByArrivalPriorityByPriorityThenArrival) {
  std::vector<SchedSeq> v = {seq(1, 5, 1, false, 0), seq(2, 3, 1, false, 9), seq(3, 4, 1, false, 9)};
  sched_sort(v, SchedulePolicy::kFcfs);
  EXPECT_EQ(keys(v), (std::vector<int64_t>{2, 3, 1}));
  v.push_back(seq(4, 1, 1, false, -1));
  sched_sort(v, SchedulePolicy::kPriority);
  EXPECT_EQ(keys(v), (std::vector<int64_t>{2, 3, 1, 4}));
}

TEST(CapacityScheduler, AdmitsInOrderWhileBlocksAndSlotsLastWithoutOvertaking) {
  std::vector<SchedSeq> w = {seq(1, 0, 0, false, 0, 3), seq(2, 1, 0, false, 0, 4), seq(3, 2, 0, false, 0, 1)};
  EXPECT_EQ(capacity_admit(w, 10, 8), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(capacity_admit(w, 6, 8), (std::vector<int64_t>{1}));  // 3 fits, but not past 2
  EXPECT_EQ(capacity_admit(w, 10, 2), (std::vector<int64_t>{1, 2}));
  EXPECT_TRUE(capacity_admit(w, 2, 8).empty());
}

// An unforked n > 1 sequence takes n slots; one that does not fit stops admission even
// where a one-slot sequence behind it would fit.
TEST(CapacityScheduler, CountsEachSequencesSlotsWithoutOvertaking) {
  std::vector<SchedSeq> w = {seq(1, 0, 0, false, 0, 1), seq(2, 1, 0, false, 0, 1),
                             seq(3, 2, 0, false, 0, 1)};
  w[1].slots = 3;
  EXPECT_EQ(capacity_admit(w, 10, 5), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(capacity_admit(w, 10, 4), (std::vector<int64_t>{1, 2}));  // none left for 3
  EXPECT_EQ(capacity_admit(w, 10, 3), (std::vector<int64_t>{1}));     // 3 fits, not past 2
  w[0].slots = 2;
  EXPECT_TRUE(capacity_admit(w, 10, 1).empty());
  EXPECT_EQ(capacity_admit(w, 10, 2), (std::vector<int64_t>{1}));
  EXPECT_EQ(capacity_admit(w, 10, 6), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_TRUE(capacity_admit(w, 10, 0).empty());
  EXPECT_EQ(capacity_admit(w, 1, 6), (std::vector<int64_t>{1}));  // blocks still bound it
}

TEST(MicroBatchScheduler, DecodesFirstThenPrefillChunksWithinTheBudget) {
  std::vector<SchedSeq> r = {seq(1, 0, 100), seq(2, 1, 1, true), seq(3, 2, 30), seq(4, 3, 1, true)};
  auto plan = micro_batch(r, 64);
  ASSERT_EQ(plan.size(), 3u);
  EXPECT_EQ(plan[0].key, 2);
  EXPECT_EQ(plan[1].key, 4);
  EXPECT_EQ(plan[2].key, 1);
  EXPECT_EQ(plan[2].tokens, 62);  // the older prefill takes what is left
  plan = micro_batch(r, 1000);
  ASSERT_EQ(plan.size(), 4u);
  EXPECT_EQ(plan[3].key, 3);
  EXPECT_EQ(plan[3].tokens, 30);
  plan = micro_batch(r, 1);
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].key, 2);
}

TEST(Preemption, VictimIsTheSequenceServedLast) {
  std::vector<SchedSeq> r = {seq(1, 0, 1, true, 5), seq(2, 7, 1, true, 5), seq(3, 3, 1, true, 0)};
  EXPECT_EQ(preemption_victim(r, SchedulePolicy::kFcfs), 2);
  EXPECT_EQ(preemption_victim(r, SchedulePolicy::kPriority), 3);
}

TEST(Preemption, OnlyStrictlyHigherPriorityDisplacesARunningSequence) {
  EXPECT_TRUE(priority_displaces(seq(1, 9, 10, false, 5), seq(2, 0, 1, true, 1)));
  EXPECT_FALSE(priority_displaces(seq(1, 9, 10, false, 5), seq(2, 0, 1, true, 5)));
  EXPECT_FALSE(priority_displaces(seq(1, 0, 10, false, 0), seq(2, 9, 1, true, 3)));
}

TEST(StopStrings, HeldBackAcrossPiecesAndCutBeforeTheMatch) {
  StopStringMatcher m({"</end>", "STOP"});
  EXPECT_EQ(m.put("Hello </"), "Hello ");  // "</" could start "</end>"
  EXPECT_EQ(m.put("en"), "");
  EXPECT_EQ(m.put("x"), "</enx");  // no longer a prefix: released
  EXPECT_EQ(m.put(" then ST"), " then ");
  EXPECT_EQ(m.put("OP and more"), "");
  EXPECT_TRUE(m.matched());
  EXPECT_EQ(m.matched_stop(), "STOP");
  EXPECT_EQ(m.put("later"), "");
  StopStringMatcher none;
  EXPECT_EQ(none.put("abc"), "abc");
  StopStringMatcher tail({"xyz"});
  EXPECT_EQ(tail.put("abx"), "ab");
  EXPECT_EQ(tail.flush(), "x");
  StopStringMatcher earliest({"bc", "abcd"});  // "abcd" starts first
  EXPECT_EQ(earliest.put("zabcd"), "z");
  EXPECT_EQ(earliest.matched_stop(), "abcd");
}

std::vector<int32_t> iota(int32_t n, int32_t from = 0) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), from);
  return v;
}

TEST(PrefixCache, FullBlocksOfTheSamePrefixAreSharedAndCounted) {
  KvCacheManager kv(nullptr, 16, 4);
  PrefixCache cache(kv);
  auto tokens = iota(10);
  KvSequence a;
  ASSERT_TRUE(kv.grow(a, 10));
  EXPECT_EQ(cache.insert(a, tokens, 0), 2);  // blocks 0 and 1 are full
  EXPECT_EQ(cache.num_cached(), 2);
  EXPECT_EQ(kv.allocator().refcount(a.blocks[0]), 2);

  auto other = tokens;
  other[5] = 99;  // second block differs
  KvSequence b = cache.match(other, 10);
  EXPECT_EQ(b.length, 4);
  ASSERT_EQ(b.blocks.size(), 1u);
  EXPECT_EQ(b.blocks[0], a.blocks[0]);
  KvSequence c = cache.match(tokens, 1);  // capped
  EXPECT_EQ(c.length, 4);
  EXPECT_EQ(cache.peek(tokens, 10), 2);
  auto shifted = iota(10, 1);
  EXPECT_EQ(cache.peek(shifted, 10), 0);
  EXPECT_EQ(cache.stats().hit_blocks, 2);

  // Nothing is evictable while sequences hold the blocks; all of it once they are gone.
  EXPECT_EQ(cache.evict(5), 0);
  kv.free(a);
  kv.free(b);
  kv.free(c);
  EXPECT_EQ(cache.num_evictable(), 2);
  EXPECT_EQ(kv.allocator().num_free(), 14);
  EXPECT_EQ(cache.evict(5), 2);
  EXPECT_EQ(kv.allocator().num_free(), 16);
}

TEST(PrefixCache, EvictsLeastRecentlyUsedFirst) {
  KvCacheManager kv(nullptr, 16, 4);
  PrefixCache cache(kv);
  auto t1 = iota(4, 0), t2 = iota(4, 100);
  KvSequence a, b;
  ASSERT_TRUE(kv.grow(a, 4));
  ASSERT_TRUE(kv.grow(b, 4));
  cache.insert(a, t1, 0);
  cache.insert(b, t2, 0);
  kv.free(a);
  kv.free(b);
  KvSequence hit = cache.match(t1, 1);  // t1 is now the most recently used
  kv.free(hit);
  EXPECT_EQ(cache.evict(1), 1);
  EXPECT_EQ(cache.peek(t1, 1), 1);
  EXPECT_EQ(cache.peek(t2, 1), 0);
}

TEST(SessionStore, ReusesTheCommonPrefixExpiresAndEvictsLru) {
  using namespace std::chrono_literals;
  KvCacheManager kv(nullptr, 32, 4);
  SessionStore store(kv, 100ms, 8);
  auto t0 = SessionStore::Clock::now();
  KvSequence a;
  ASSERT_TRUE(kv.grow(a, 10));
  store.put("a", a, iota(10), t0);
  auto next_turn = iota(14);
  EXPECT_EQ(store.peek("a", next_turn), 10);
  auto diverged = iota(14);
  diverged[6] = 77;
  EXPECT_EQ(store.peek("a", diverged), 6);
  KvSequence got = store.take("a", diverged);
  EXPECT_EQ(got.length, 6);
  EXPECT_EQ(got.blocks.size(), 2u);  // the third block went back to the pool
  EXPECT_EQ(store.size(), 0);
  EXPECT_EQ(store.stats().hits, 1);
  EXPECT_EQ(store.take("nope", diverged).length, 0);
  EXPECT_EQ(store.stats().misses, 1);

  store.put("b", got, iota(6), t0);
  KvSequence c;
  ASSERT_TRUE(kv.grow(c, 8));
  store.put("c", c, iota(8), t0 + 80ms);
  EXPECT_EQ(store.expire(t0 + 150ms), 1);  // b idle 150 ms, c only 70 ms
  EXPECT_EQ(store.stats().expiries, 1);
  EXPECT_EQ(store.size(), 1);
  EXPECT_EQ(store.num_reclaimable(), 2);
  EXPECT_EQ(store.evict(1), 2);
  EXPECT_EQ(store.stats().evictions, 1);
  EXPECT_EQ(kv.allocator().num_free(), 32);
}

}  // namespace
}  // namespace kiln
