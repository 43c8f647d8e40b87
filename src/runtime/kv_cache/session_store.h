// Sessions: a session id keeps its conversation's KV blocks after a request ends, so
// the next turn only prefills what is new. Sessions expire after an idle timeout and
// are evicted least recently used when the pool runs short. Time is passed in so tests
// drive a fake clock. Tested in tests/runtime/prefix_cache_test.cpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <list>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/kv_cache/block_allocator.h"

namespace kiln {

struct SessionStats {
  int64_t hits = 0;       // a request found its session's KV
  int64_t misses = 0;     // a request named a session that was not (or no longer) held
  int64_t evictions = 0;  // dropped under memory pressure or over the session limit
  int64_t expiries = 0;   // dropped after the idle timeout
};

class SessionStore {
 public:
  using Clock = std::chrono::steady_clock;
  SessionStore(KvCacheManager& kv, std::chrono::milliseconds idle_timeout, int32_t max_sessions);
  ~SessionStore();

  // Tokens of `prompt` whose K/V the session holds (its longest common prefix with the
  // prompt, at most prompt.size() - 1 so the last prompt token is always fed).
  int32_t peek(const std::string& id, std::span<const int32_t> prompt) const;
  // Hands the session's KV (truncated to peek()) to the caller and forgets the session;
  // an empty sequence on a miss.
  KvSequence take(const std::string& id, std::span<const int32_t> prompt);
  // Keeps `kv` (holding the K/V of `tokens`) for `id`, replacing an older entry.
  void put(const std::string& id, KvSequence kv, std::vector<int32_t> tokens, Clock::time_point now);
  // Drops sessions idle since before now - timeout; returns how many.
  int32_t expire(Clock::time_point now);
  // Drops least recently used sessions until `blocks` blocks went back to the pool (or
  // none are left); returns the blocks freed.
  int32_t evict(int32_t blocks);
  // Blocks that dropping every session would free.
  int32_t num_reclaimable() const;
  int32_t size() const { return int32_t(map_.size()); }
  void clear();
  const SessionStats& stats() const { return stats_; }

 private:
  struct Session {
    KvSequence kv;
    std::vector<int32_t> tokens;
    Clock::time_point last_used;
    std::list<std::string>::iterator lru;
  };
  int32_t drop(const std::string& id);

  KvCacheManager& kv_;
  std::chrono::milliseconds timeout_;
  int32_t max_sessions_;
  std::unordered_map<std::string, Session> map_;
  std::list<std::string> lru_;  // front: least recently used
  SessionStats stats_;
};

}  // namespace kiln
