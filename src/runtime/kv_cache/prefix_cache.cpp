// PrefixCache (see prefix_cache.h).
#include "runtime/kv_cache/prefix_cache.h"

#include <algorithm>

namespace kiln {

PrefixCache::~PrefixCache() { clear(); }

// FNV-1a over the parent hash and the token ids, then a 64-bit finalizer (splitmix).
// Lookups also compare the block's tokens and parent hash, so a wrong match needs two
// different prefixes with equal 64-bit chain hashes.
uint64_t PrefixCache::block_hash(uint64_t parent, std::span<const int32_t> tokens) const {
  uint64_t h = 1469598103934665603ull ^ parent;
  auto mix = [&](uint64_t x) {
    for (int i = 0; i < 8; ++i) {
      h ^= (x >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  mix(parent);
  for (int32_t t : tokens) mix(uint64_t(uint32_t(t)));
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

int32_t PrefixCache::walk(std::span<const int32_t> tokens, int32_t max_blocks, KvSequence* out) {
  const int32_t bs = kv_.block_size();
  uint64_t parent = 0;
  int32_t full = std::min<int32_t>(int32_t(tokens.size()) / bs, max_blocks);
  for (int32_t b = 0; b < full; ++b) {
    auto chunk = tokens.subspan(size_t(b * bs), size_t(bs));
    uint64_t h = block_hash(parent, chunk);
    auto it = entries_.find(h);
    if (it == entries_.end() || it->second.parent != parent ||
        !std::equal(chunk.begin(), chunk.end(), it->second.tokens.begin()))
      return b;
    if (out) {
      kv_.allocator().retain(it->second.block);
      out->blocks.push_back(it->second.block);
      out->length += bs;
      lru_.splice(lru_.end(), lru_, it->second.lru);  // now the most recently used
    }
    parent = h;
  }
  return full;
}

KvSequence PrefixCache::match(std::span<const int32_t> tokens, int32_t max_blocks) {
  KvSequence seq;
  int32_t hits = walk(tokens, max_blocks, &seq);
  stats_.queried_blocks += std::min<int32_t>(int32_t(tokens.size()) / kv_.block_size(), max_blocks);
  stats_.hit_blocks += hits;
  return seq;
}

int32_t PrefixCache::peek(std::span<const int32_t> tokens, int32_t max_blocks) const {
  return const_cast<PrefixCache*>(this)->walk(tokens, max_blocks, nullptr);
}

int32_t PrefixCache::insert(const KvSequence& seq, std::span<const int32_t> tokens,
                            int32_t from_block) {
  const int32_t bs = kv_.block_size();
  const int32_t full = std::min<int32_t>(seq.length, int32_t(tokens.size())) / bs;
  if (full <= from_block) return std::max(from_block, full);
  uint64_t parent = 0;
  for (int32_t b = 0; b < full; ++b) {
    auto chunk = tokens.subspan(size_t(b * bs), size_t(bs));
    uint64_t h = block_hash(parent, chunk);
    if (b >= from_block && !entries_.count(h)) {
      int32_t block = seq.blocks[size_t(b)];
      kv_.allocator().retain(block);
      lru_.push_back(h);
      entries_[h] = Entry{block, parent, std::vector<int32_t>(chunk.begin(), chunk.end()),
                          std::prev(lru_.end())};
    }
    parent = h;
  }
  return full;
}

void PrefixCache::drop(std::unordered_map<uint64_t, Entry>::iterator it) {
  kv_.allocator().release(it->second.block);
  lru_.erase(it->second.lru);
  entries_.erase(it);
}

int32_t PrefixCache::evict(int32_t n) {
  int32_t freed = 0;
  for (auto it = lru_.begin(); it != lru_.end() && freed < n;) {
    auto e = entries_.find(*it);
    ++it;  // drop() erases the current list node
    if (kv_.allocator().refcount(e->second.block) == 1) {
      drop(e);
      ++freed;
      ++stats_.evicted_blocks;
    }
  }
  return freed;
}

int32_t PrefixCache::num_evictable() const {
  int32_t n = 0;
  for (auto& [h, e] : entries_)
    if (kv_.allocator().refcount(e.block) == 1) ++n;
  return n;
}

void PrefixCache::clear() {
  while (!entries_.empty()) drop(entries_.begin());
}

}  // namespace kiln
