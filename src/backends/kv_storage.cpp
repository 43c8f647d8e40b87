// The KvStorage defaults (see backend.h): a storage that does not implement the host
// swap space refuses it with a clear error; the KV dtype names. Tested in tests/runtime/kv_cache_test.cpp.
#include "backends/backend.h"
#include "core/status.h"

namespace kiln {

KvDType kv_dtype_parse(const std::string& name) {
  if (name == "auto") return KvDType::kAuto;
  if (name == "int8") return KvDType::kInt8;
  if (name == "fp8") return KvDType::kFp8;
  throw_error(ErrorCode::kInvalidArgument, "--kv-cache-dtype: unknown KV cache dtype '", name,
              "' (expected auto, int8 or fp8)");
}

const char* kv_dtype_name(KvDType t) {
  switch (t) {
    case KvDType::kInt8: return "int8";
    case KvDType::kFp8: return "fp8";
    case KvDType::kAuto: break;
  }
  return "auto";
}

void KvStorage::host_reserve(int32_t num_blocks) {
  if (num_blocks > 0)
    throw_error(ErrorCode::kUnsupported, "this KV storage has no host swap space (asked for ",
                num_blocks, " blocks); use --preemption recompute");
}

void KvStorage::swap_out(std::span<const KvSwapCopy> copies) {
  if (!copies.empty())
    throw_error(ErrorCode::kUnsupported, "this KV storage cannot swap blocks to the host");
}

void KvStorage::swap_in(std::span<const KvSwapCopy> copies) {
  if (!copies.empty())
    throw_error(ErrorCode::kUnsupported, "this KV storage cannot swap blocks from the host");
}

}  // namespace kiln
