// Block-level prefix cache: a full KV block is keyed by a hash of its tokens chained
// with the hash of everything before it, so a block is reused only by a sequence with
// the same whole prefix. The cache holds one reference to each cached block; a block
// that only the cache still holds is "evictable" and goes back to the pool in LRU
// order when the pool runs short. Tested in tests/runtime/prefix_cache_test.cpp.
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "runtime/kv_cache/block_allocator.h"

namespace kiln {

struct PrefixCacheStats {
  int64_t queried_blocks = 0;  // full prompt blocks looked up
  int64_t hit_blocks = 0;      // of which found
  int64_t evicted_blocks = 0;
};

class PrefixCache {
 public:
  explicit PrefixCache(KvCacheManager& kv) : kv_(kv) {}
  ~PrefixCache();

  // The cached blocks for the longest run of full blocks of `tokens` (at most
  // `max_blocks`), each retained once for the caller (who owns them as a KvSequence).
  KvSequence match(std::span<const int32_t> tokens, int32_t max_blocks);
  // How many blocks match() would return, without taking them or counting stats.
  int32_t peek(std::span<const int32_t> tokens, int32_t max_blocks) const;
  // Registers the full blocks of `seq` (whose first seq.length positions hold the K/V of
  // `tokens`) starting at block `from_block`; returns the number of full blocks now
  // covered, to pass as `from_block` next time. Blocks already cached under the same
  // key (computed twice by concurrent sequences) are left alone.
  int32_t insert(const KvSequence& seq, std::span<const int32_t> tokens, int32_t from_block);
  // Returns up to `n` evictable blocks to the pool, least recently used first.
  int32_t evict(int32_t n);
  int32_t num_evictable() const;
  int32_t num_cached() const { return int32_t(entries_.size()); }
  void clear();

  const PrefixCacheStats& stats() const { return stats_; }

 private:
  struct Entry {
    int32_t block;
    uint64_t parent;
    std::vector<int32_t> tokens;
    std::list<uint64_t>::iterator lru;
  };
  // Follows the chain of cached blocks; `out` (retaining) is null for a peek.
  int32_t walk(std::span<const int32_t> tokens, int32_t max_blocks, KvSequence* out);
  uint64_t block_hash(uint64_t parent, std::span<const int32_t> tokens) const;
  void drop(std::unordered_map<uint64_t, Entry>::iterator it);

  KvCacheManager& kv_;
  std::unordered_map<uint64_t, Entry> entries_;
  std::list<uint64_t> lru_;  // front: least recently used
  PrefixCacheStats stats_;
};

}  // namespace kiln
