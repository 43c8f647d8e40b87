// Sizing the KV block pool from free device memory (--kv-cache-fraction, vLLM's
// gpu_memory_utilization applied to what is left once the weights and the activation
// arena are resident): blocks = floor(F x free / bytes per block), capped by what the
// options ask for, refused with a clear error when one max-length request would not
// fit. Pure arithmetic, so the runtime's tests fake the free memory. Tested in
// tests/runtime/kv_cache_test.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kiln {

struct KvPoolBudget {
  double fraction = 0;          // (0, 1]
  size_t free_bytes = 0;        // free on the device now (the weights already loaded)
  size_t activation_bytes = 0;  // activation arena still to be allocated (its planned peak
                                // at the step token budget less what is resident)
  size_t block_bytes = 0;       // one block: K and V of every layer (of every rank there)
  int32_t block_size = 16;
  int64_t cap_blocks = 0;      // the pool the options ask for, when they do (0: none)
  int64_t request_blocks = 0;  // what one max-length request needs
  std::string device;          // for messages ("cpu", "cuda:0")
};

struct KvPoolSize {
  int32_t blocks = 0;
  size_t usable_bytes = 0;  // fraction x (free - activations): what the pool may take
};

// Throws kInvalidArgument for a fraction outside (0, 1] or an empty block, and
// kOutOfMemory (needed vs available in MiB, and the flag to change) when fewer than
// request_blocks blocks fit.
KvPoolSize kv_pool_size(const KvPoolBudget& budget);

// "12.5 MiB" ("0.047 MiB" under 1 MiB)
std::string kv_mib(size_t bytes);

}  // namespace kiln
