// The KvStorage defaults (see backend.h): a storage that does not implement the host
// swap space refuses it with a clear error; the KV dtype names. Tested in tests/runtime/kv_cache_test.cpp.
#include "backends/backend.h"
#include <cmath>

#include "core/status.h"

namespace kiln {

KvDType kv_dtype_parse(const std::string& name) {
  if (name == "auto") return KvDType::kAuto;
  if (name == "int8") return KvDType::kInt8;
  if (name == "fp8" || name == "fp8_e4m3") return KvDType::kFp8;  // vLLM's names of E4M3
  if (name == "fp8_e5m2")
    throw_error(ErrorCode::kInvalidArgument, "--kv-cache-dtype fp8_e5m2: the FP8 KV cache is E4M3 (fp8 or fp8_e4m3), "
                "whose per-row scales cover the range E5M2 would trade precision for");
  throw_error(ErrorCode::kInvalidArgument, "--kv-cache-dtype: unknown KV cache dtype '", name,
              "' (expected auto, int8, fp8 or fp8_e4m3)");
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

void kv_check_read_keys(const KvLayout& layout, int64_t layer, std::span<const int64_t> slots) {
  if (kv_dtype_quantized(layout.dtype))
    throw_error(ErrorCode::kUnsupported, "read_keys: the pool stores ", kv_dtype_name(layout.dtype),
                " codes; keys are read back from an unquantized (auto) pool only");
  if (layer < 0 || layer >= layout.num_layers)
    throw_error(ErrorCode::kInvalidArgument, "read_keys: layer ", layer, " of a pool of ", layout.num_layers);
  const int64_t n = layout.num_blocks * layout.block_size;
  for (int64_t s : slots)
    if (s < 0 || s >= n) throw_error(ErrorCode::kInvalidArgument, "read_keys: slot ", s, " of a pool of ", n);
}

void kv_check_k_shift(const KvLayout& layout) {
  if (!layout.k_shift || layout.k_shift->empty()) return;
  const size_t want = size_t(layout.num_layers * layout.num_kv_heads * layout.head_dim);
  if (layout.k_shift->size() != want)
    throw_error(ErrorCode::kInvalidArgument, "KV key shift: ", layout.k_shift->size(), " values for a pool of ",
                layout.num_layers, " layers x ", layout.num_kv_heads, " kv heads x ", layout.head_dim, " (", want, ")");
  for (size_t i = 0; i < want; ++i)
    if (!std::isfinite((*layout.k_shift)[i]))
      throw_error(ErrorCode::kInvalidArgument, "KV key shift: value ", i, " is not finite");
}

void KvStorage::read_keys(int64_t, std::span<const int64_t>, float*) const {
  throw_error(ErrorCode::kUnsupported, "this KV storage cannot copy its keys to the host");
}

void KvStorage::swap_in(std::span<const KvSwapCopy> copies) {
  if (!copies.empty())
    throw_error(ErrorCode::kUnsupported, "this KV storage cannot swap blocks from the host");
}

}  // namespace kiln
