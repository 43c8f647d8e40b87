// SessionStore (see session_store.h).
#include "runtime/kv_cache/session_store.h"

#include <algorithm>

namespace kiln {

SessionStore::SessionStore(KvCacheManager& kv, std::chrono::milliseconds idle_timeout,
                           int32_t max_sessions)
    : kv_(kv), timeout_(idle_timeout), max_sessions_(max_sessions) {}

SessionStore::~SessionStore() { clear(); }

int32_t SessionStore::peek(const std::string& id, std::span<const int32_t> prompt) const {
  auto it = map_.find(id);
  if (it == map_.end() || prompt.empty()) return 0;
  const auto& t = it->second.tokens;
  size_t n = std::min({t.size(), size_t(it->second.kv.length), prompt.size() - 1});
  size_t common = 0;
  while (common < n && t[common] == prompt[common]) ++common;
  return int32_t(common);
}

KvSequence SessionStore::take(const std::string& id, std::span<const int32_t> prompt) {
  auto it = map_.find(id);
  if (it == map_.end()) {
    ++stats_.misses;
    return {};
  }
  int32_t common = peek(id, prompt);
  KvSequence kv = std::move(it->second.kv);
  lru_.erase(it->second.lru);
  map_.erase(it);
  kv_.truncate(kv, common);
  if (common > 0) ++stats_.hits;
  else ++stats_.misses;
  return kv;
}

void SessionStore::put(const std::string& id, KvSequence kv, std::vector<int32_t> tokens,
                       Clock::time_point now) {
  if (map_.count(id)) drop(id);
  while (max_sessions_ > 0 && int32_t(map_.size()) >= max_sessions_) {
    drop(lru_.front());
    ++stats_.evictions;
  }
  lru_.push_back(id);
  map_[id] = Session{std::move(kv), std::move(tokens), now, std::prev(lru_.end())};
}

int32_t SessionStore::drop(const std::string& id) {
  auto it = map_.find(id);
  int32_t freed = 0;
  for (int32_t b : it->second.kv.blocks)
    if (kv_.allocator().refcount(b) == 1) ++freed;
  kv_.free(it->second.kv);
  lru_.erase(it->second.lru);
  map_.erase(it);
  return freed;
}

int32_t SessionStore::expire(Clock::time_point now) {
  int32_t n = 0;
  // The LRU list is in last-use order, so the expired ones are at its front.
  while (!lru_.empty() && now - map_.at(lru_.front()).last_used > timeout_) {
    drop(lru_.front());
    ++stats_.expiries;
    ++n;
  }
  return n;
}

int32_t SessionStore::evict(int32_t blocks) {
  int32_t freed = 0;
  while (freed < blocks && !lru_.empty()) {
    freed += drop(lru_.front());
    ++stats_.evictions;
  }
  return freed;
}

int32_t SessionStore::num_reclaimable() const {
  int32_t n = 0;
  for (auto& [id, s] : map_)
    for (int32_t b : s.kv.blocks)
      if (kv_.allocator().refcount(b) == 1) ++n;
  return n;
}

void SessionStore::clear() {
  while (!lru_.empty()) drop(lru_.front());
}

}  // namespace kiln
