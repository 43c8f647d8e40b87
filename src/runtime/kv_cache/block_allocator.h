// The KV block pool's bookkeeping: a free list and a reference count per block, so a
// prefix (a shared system prompt, a forked sequence) is shared rather than copied.
// The storage itself belongs to the backend (KvStorage). Tested in
// tests/runtime/kv_cache_test.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kiln {

class BlockAllocator {
 public:
  explicit BlockAllocator(int32_t num_blocks);

  // A block with refcount 1, or -1 when the pool is exhausted.
  int32_t allocate();
  void retain(int32_t block);
  // Drops one reference; the block returns to the free list at zero.
  void release(int32_t block);

  int32_t refcount(int32_t block) const { return refcount_.at(size_t(block)); }
  int32_t num_free() const { return int32_t(free_.size()); }
  int32_t num_blocks() const { return int32_t(refcount_.size()); }

 private:
  std::vector<int32_t> refcount_;
  std::vector<int32_t> free_;  // a stack: recently freed blocks are reused first
};

// One sequence's view of the pool: the blocks holding its positions, in order.
struct KvSequence {
  std::vector<int32_t> blocks;
  int32_t length = 0;  // tokens whose K/V are (or are being) written
};

class KvStorage;

// Grows, forks and frees sequences' block tables over one allocator.
class KvCacheManager {
 public:
  KvCacheManager(KvStorage* storage, int32_t num_blocks, int32_t block_size);

  // Makes room for `n` more tokens: allocates blocks as needed and, if the partly
  // filled last block is shared, copies it first (copy-on-write). All or nothing:
  // returns false and changes nothing when the pool cannot supply enough blocks.
  bool grow(KvSequence& seq, int32_t n);
  // Blocks `grow(seq, n)` would take from the free list.
  int32_t blocks_needed(const KvSequence& seq, int32_t n) const;
  // The pool slot (block * block_size + row) of position `pos`.
  int64_t slot(const KvSequence& seq, int32_t pos) const;
  // A new sequence sharing every block of `seq` (each block's refcount +1).
  KvSequence fork(const KvSequence& seq);
  void free(KvSequence& seq);
  // Keeps the first `length` positions (<= seq.length), releasing blocks past them; a
  // later grow() overwrites the rest of the last block (copying it first if shared).
  void truncate(KvSequence& seq, int32_t length);

  int32_t block_size() const { return block_size_; }
  // The storage copy-on-write copies in (null in bookkeeping-only tests).
  KvStorage* storage() const { return storage_; }
  const BlockAllocator& allocator() const { return alloc_; }
  BlockAllocator& allocator() { return alloc_; }

 private:
  KvStorage* storage_;
  BlockAllocator alloc_;
  int32_t block_size_;
};

}  // namespace kiln
