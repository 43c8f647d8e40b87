// Block pool bookkeeping (see block_allocator.h).
#include "runtime/kv_cache/block_allocator.h"

#include "backends/backend.h"
#include "core/status.h"

namespace kiln {

BlockAllocator::BlockAllocator(int32_t num_blocks) : refcount_(size_t(num_blocks), 0) {
  KILN_CHECK(num_blocks > 0, "empty block pool");
  free_.reserve(size_t(num_blocks));
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

int32_t BlockAllocator::allocate() {
  if (free_.empty()) return -1;
  int32_t b = free_.back();
  free_.pop_back();
  refcount_[size_t(b)] = 1;
  return b;
}

void BlockAllocator::retain(int32_t block) {
  KILN_CHECK(refcount_.at(size_t(block)) > 0, "retain of free block ", block);
  ++refcount_[size_t(block)];
}

void BlockAllocator::release(int32_t block) {
  KILN_CHECK(refcount_.at(size_t(block)) > 0, "double release of block ", block);
  if (--refcount_[size_t(block)] == 0) free_.push_back(block);
}

KvCacheManager::KvCacheManager(KvStorage* storage, int32_t num_blocks, int32_t block_size)
    : storage_(storage), alloc_(num_blocks), block_size_(block_size) {
  KILN_CHECK(block_size > 0, "block size ", block_size);
}

int32_t KvCacheManager::blocks_needed(const KvSequence& seq, int32_t n) const {
  int32_t have = int32_t(seq.blocks.size());
  int32_t need = (seq.length + n + block_size_ - 1) / block_size_;
  int32_t extra = need > have ? need - have : 0;
  bool cow = n > 0 && seq.length % block_size_ != 0 && have > 0 &&
             alloc_.refcount(seq.blocks.back()) > 1;
  return extra + (cow ? 1 : 0);
}

bool KvCacheManager::grow(KvSequence& seq, int32_t n) {
  if (blocks_needed(seq, n) > alloc_.num_free()) return false;
  if (n > 0 && seq.length % block_size_ != 0 && !seq.blocks.empty() &&
      alloc_.refcount(seq.blocks.back()) > 1) {
    int32_t fresh = alloc_.allocate();
    if (storage_) storage_->copy_block(seq.blocks.back(), fresh);
    alloc_.release(seq.blocks.back());
    seq.blocks.back() = fresh;
  }
  int32_t need = (seq.length + n + block_size_ - 1) / block_size_;
  while (int32_t(seq.blocks.size()) < need) seq.blocks.push_back(alloc_.allocate());
  seq.length += n;
  return true;
}

int64_t KvCacheManager::slot(const KvSequence& seq, int32_t pos) const {
  KILN_CHECK(pos >= 0 && pos / block_size_ < int32_t(seq.blocks.size()), "position ", pos,
             " outside the sequence's ", seq.blocks.size(), " blocks");
  return int64_t(seq.blocks[size_t(pos / block_size_)]) * block_size_ + pos % block_size_;
}

KvSequence KvCacheManager::fork(const KvSequence& seq) {
  for (int32_t b : seq.blocks) alloc_.retain(b);
  return seq;
}

void KvCacheManager::free(KvSequence& seq) {
  for (int32_t b : seq.blocks) alloc_.release(b);
  seq.blocks.clear();
  seq.length = 0;
}

void KvCacheManager::truncate(KvSequence& seq, int32_t length) {
  KILN_CHECK(length >= 0 && length <= seq.length, "truncate to ", length, " of ", seq.length);
  size_t keep = size_t((length + block_size_ - 1) / block_size_);
  while (seq.blocks.size() > keep) {
    alloc_.release(seq.blocks.back());
    seq.blocks.pop_back();
  }
  seq.length = length;
}

}  // namespace kiln
