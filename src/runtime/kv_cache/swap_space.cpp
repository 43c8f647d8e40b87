// Host swap space (see swap_space.h).
#include "runtime/kv_cache/swap_space.h"

#include <algorithm>

#include "backends/backend.h"
#include "core/status.h"

namespace kiln {

KvSwapSpace::KvSwapSpace(KvCacheManager& kv, KvStorage& storage, size_t bytes)
    : kv_(kv), storage_(storage), slot_bytes_(storage.block_bytes()) {
  KILN_CHECK(slot_bytes_ > 0, "KV blocks of 0 bytes");
  num_slots_ = int32_t(std::min<size_t>(bytes / slot_bytes_, size_t(1) << 30));
  storage_.host_reserve(num_slots_);
  free_.reserve(size_t(num_slots_));
  for (int32_t s = num_slots_ - 1; s >= 0; --s) free_.push_back(s);
}

KvSwapSpace::~KvSwapSpace() { storage_.host_reserve(0); }

bool KvSwapSpace::swap_out(const KvSequence& seq, SwappedKv& out) {
  KILN_CHECK(out.empty(), "swapping out a sequence that is already swapped out");
  const size_t n = seq.blocks.size();
  if (n == 0 || n > free_.size()) return false;
  std::vector<KvSwapCopy> copies(n);
  out.host.resize(n);
  for (size_t i = 0; i < n; ++i) {
    out.host[i] = free_.back();
    free_.pop_back();
    copies[i] = {seq.blocks[i], out.host[i]};
  }
  storage_.swap_out(copies);
  out.length = seq.length;
  ++stats_.swapped_out;
  stats_.out_bytes += int64_t(n * slot_bytes_);
  return true;
}

bool KvSwapSpace::swap_in(SwappedKv& in, KvSequence& seq) {
  KILN_CHECK(!in.empty(), "swapping in a sequence that is not swapped out");
  const int32_t bs = kv_.block_size();
  const size_t total = size_t((in.length + bs - 1) / bs), kept = seq.blocks.size();
  KILN_CHECK(total == in.host.size() && kept <= total && int64_t(kept) * bs <= in.length,
             "swap-in of ", in.host.size(), " slots for ", in.length, " tokens over ", kept,
             " kept blocks");
  BlockAllocator& alloc = kv_.allocator();
  if (int32_t(total - kept) > alloc.num_free()) return false;
  std::vector<KvSwapCopy> copies;
  for (size_t i = kept; i < total; ++i) {
    const int32_t b = alloc.allocate();
    seq.blocks.push_back(b);
    copies.push_back({b, in.host[i]});
  }
  storage_.swap_in(copies);
  seq.length = in.length;
  ++stats_.swapped_in;
  stats_.in_bytes += int64_t(copies.size() * slot_bytes_);
  release(in);
  return true;
}

void KvSwapSpace::release(SwappedKv& s) {
  for (int32_t h : s.host) free_.push_back(h);
  s.host.clear();
  s.length = 0;
}

}  // namespace kiln
