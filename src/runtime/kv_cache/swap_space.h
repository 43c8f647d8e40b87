// Host swap space for preempted sequences (the executor's PreemptionMode::kSwap): the
// K/V of a preempted sequence's blocks are copied to host slots (KvStorage::swap_out)
// so its device blocks can be freed, and copied back into fresh blocks when it resumes
// (swap_in), so nothing is recomputed. The slots live in the KvStorage (page-locked on
// a GPU); this class hands them out and counts the traffic. Tested in
// tests/runtime/kv_cache_test.cpp and through the executor tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/kv_cache/block_allocator.h"

namespace kiln {

class KvStorage;

// A swapped-out sequence: its blocks' host slots, in block order.
struct SwappedKv {
  std::vector<int32_t> host;
  int32_t length = 0;  // tokens whose K/V the slots hold
  bool empty() const { return host.empty(); }
};

struct KvSwapStats {
  int64_t swapped_out = 0, swapped_in = 0;  // sequences
  int64_t out_bytes = 0, in_bytes = 0;
};

class KvSwapSpace {
 public:
  // floor(bytes / storage.block_bytes()) slots, reserved in `storage` (which must
  // outlive this object, as must `kv`).
  KvSwapSpace(KvCacheManager& kv, KvStorage& storage, size_t bytes);
  ~KvSwapSpace();
  KvSwapSpace(const KvSwapSpace&) = delete;
  KvSwapSpace& operator=(const KvSwapSpace&) = delete;

  // Copies every block of `seq` to host slots. The sequence keeps its blocks (the caller
  // frees them: the copies are ordered before any later reuse). False, changing
  // nothing, when there are too few free slots.
  bool swap_out(const KvSequence& seq, SwappedKv& out);
  // Brings `in` back into `seq`, which already holds its first seq.blocks.size() blocks
  // (e.g. full blocks re-shared from the prefix cache; their contents must equal the
  // swapped ones): allocates fresh blocks for the rest, copies them in and frees every
  // slot of `in`. False, changing nothing, when the pool has too few free blocks.
  bool swap_in(SwappedKv& in, KvSequence& seq);
  // Frees the slots of a swapped sequence that will not resume (cancelled, or resumed
  // by recompute).
  void release(SwappedKv& s);

  int32_t num_slots() const { return num_slots_; }
  int32_t num_free() const { return int32_t(free_.size()); }
  size_t slot_bytes() const { return slot_bytes_; }
  const KvSwapStats& stats() const { return stats_; }

 private:
  KvCacheManager& kv_;
  KvStorage& storage_;
  size_t slot_bytes_ = 0;
  int32_t num_slots_ = 0;
  std::vector<int32_t> free_;  // a stack, like the device pool's
  KvSwapStats stats_;
};

}  // namespace kiln
