// KV pool sizing (see kv_sizing.h).
#include "runtime/kv_cache/kv_sizing.h"

#include <algorithm>
#include <cstdio>

#include "core/status.h"

namespace kiln {

std::string kv_mib(size_t bytes) {
  char b[64];
  // Small pools (test models) keep three decimals so they do not read as 0.0.
  const double mib = double(bytes) / double(1 << 20);
  std::snprintf(b, sizeof b, mib < 1 && bytes > 0 ? "%.3f MiB" : "%.1f MiB", mib);
  return b;
}

KvPoolSize kv_pool_size(const KvPoolBudget& b) {
  if (!(b.fraction > 0 && b.fraction <= 1))
    throw_error(ErrorCode::kInvalidArgument, "--kv-cache-fraction must be in (0, 1], got ",
                b.fraction);
  KILN_THROW_IF(b.block_bytes == 0 || b.block_size <= 0, kInvalidArgument, "KV block of ",
                b.block_bytes, " bytes and ", b.block_size, " tokens");
  const size_t left = b.free_bytes > b.activation_bytes ? b.free_bytes - b.activation_bytes : 0;
  KvPoolSize s;
  s.usable_bytes = size_t(b.fraction * double(left));
  // Block ids are int32; a pool past 2^30 blocks is far beyond any device anyway.
  int64_t blocks = std::min<int64_t>(int64_t(s.usable_bytes / b.block_bytes), int64_t(1) << 30);
  if (b.cap_blocks > 0) blocks = std::min(blocks, b.cap_blocks);
  if (blocks < b.request_blocks || blocks <= 0) {
    const int64_t need = std::max<int64_t>(b.request_blocks, 1);
    throw_error(ErrorCode::kOutOfMemory, "KV cache too small for one max-length request: it needs ",
                need, " blocks of ", b.block_size, " tokens (",
                kv_mib(size_t(need) * b.block_bytes), ") but --kv-cache-fraction ", b.fraction,
                " of the ", kv_mib(left), " free on ", b.device.empty() ? "the device" : b.device,
                " (", kv_mib(b.free_bytes), " free less ", kv_mib(b.activation_bytes),
                " for activations) gives ", kv_mib(s.usable_bytes), " (", blocks,
                " blocks); raise --kv-cache-fraction or free memory");
  }
  s.blocks = int32_t(blocks);
  return s;
}

}  // namespace kiln
