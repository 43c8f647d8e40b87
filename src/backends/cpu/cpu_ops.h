// The CPU op table: one entry per IR op, each preparing per-node state at compile time
// (packed weights) and running at step time. Internal to the CPU backend.
#pragma once

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/cpu/kernels/kernels.h"

namespace kiln::cpu {

class CpuKv;

// What an op sees when it runs.
struct OpContext {
  std::vector<const Tensor*> inputs;  // nullptr for an absent optional input
  const StepInfo* step = nullptr;
  CpuKv* kv = nullptr;
  // Returns the output buffer for output i with the given shape (f32 unless told).
  std::function<Tensor&(size_t, std::vector<int64_t>, DType)> alloc;
  Tensor& out(size_t i, std::vector<int64_t> shape, DType dtype = DType::kF32) {
    return alloc(i, std::move(shape), dtype);
  }
};

using OpRun = std::function<void(OpContext&)>;
// Builds the runner for one node; may pack weights now. Throws kUnsupported for an
// input combination the CPU cannot run.
using OpPrepare = std::function<OpRun(const ir::Node&, const ir::Graph&, const CompileOptions&)>;

const OpPrepare* find_cpu_op(const std::string& op);
// The generic tensor ops (cpu_generic_ops.cpp); find_cpu_op looks here too.
const std::map<std::string, OpPrepare>& generic_cpu_ops();
// ScaledDotProductAttention over batched 4-D tensors (cpu_sdpa_op.cpp), one of the
// generic ops.
OpRun prepare_sdpa(const ir::Node& n, const ir::Graph& g, const CompileOptions& opt);
// Plugin nodes: calls the plugin's execute_cpu (cpu_plugin_op.cpp); throws
// kUnsupported when the plugin has no CPU implementation.
OpRun prepare_plugin(const ir::Node& n, const ir::Graph& g, const CompileOptions& opt);

// How a Linear's weights are stored: the node's `precision` attribute (set by the
// assign_precision pass, kept in engines) or else CompileOptions::weight_dtype.
std::string linear_weight_storage(const ir::Node& n, const CompileOptions& opt);

// The layout name of packed panels (kernels.h PackedWeight) in an engine; bump the
// suffix if PackedWeight's byte layout ever changes, so old engines are refused. v2: bf16
// rows in pairs; v3: q8/q4 groups hold f16 scales / mins and row-factor exponents instead
// of f32 scales / mins. Older engines' panels whose bytes are unchanged still load: f32 and
// f16 of v1 and v2, bf16 of v2.
constexpr const char* kCpuPackedLayout = "cpu_panels16_v3";
constexpr const char* kCpuPackedLayoutV2 = "cpu_panels16_v2";
constexpr const char* kCpuPackedLayoutV1 = "cpu_panels16_v1";
// Whether packed panels of `storage` (a weight_storage name) in `layout` are readable.
bool cpu_packed_layout_readable(const std::string& layout, const std::string& storage);
// Build time: replaces every Linear's [N, K] weight by its packed panels (u8 bytes,
// attrs weight_layout / weight_n / weight_k / weight_storage), so loading the engine
// maps them in place instead of packing. Returns the number of Linears rewritten.
size_t pack_linear_weights(ir::Graph& g, const CompileOptions& opt);

// Linear tactics as text ("mr=6,kc=256,split=panels,threads=2"), the form the engine
// file stores. parse throws kInvalidArgument naming a bad field.
std::string linear_tactic_str(const LinearTactic& t);
LinearTactic linear_tactic_parse(const std::string& s);

// The CPU KV pool: per layer, K and V as [num_blocks, block_size, Hkv, D], f32 (dtype
// kAuto) or one-byte codes (kInt8: int8, kFp8: E4M3) with f32 scales [num_blocks,
// block_size, Hkv] beside them. The host swap space holds a slot per swapped block: per
// layer, K and V rows [block_size, Hkv, D] and then (quantized) K and V scales
// [block_size, Hkv].
class CpuKv : public KvStorage {
 public:
  explicit CpuKv(const KvLayout& layout);
  // Bytes of one block of `layout` over every layer, codes and scales.
  static size_t block_bytes_of(const KvLayout& layout);
  const KvLayout& layout() const override { return layout_; }
  bool is_int8() const { return layout_.dtype == KvDType::kInt8; }
  bool is_fp8() const { return layout_.dtype == KvDType::kFp8; }
  bool is_quantized() const { return kv_dtype_quantized(layout_.dtype); }
  void copy_block(int32_t src, int32_t dst) override;
  void host_reserve(int32_t num_blocks) override;
  int32_t host_blocks() const override { return host_blocks_; }
  size_t block_bytes() const override { return block_bytes_of(layout_); }
  void swap_out(std::span<const KvSwapCopy> copies) override;
  void swap_in(std::span<const KvSwapCopy> copies) override;
  void read_keys(int64_t layer, std::span<const int64_t> slots, float* out) const override;
  // Quantized pools: layer `layer`'s key shift [Hkv * D] (KvLayout::k_shift), or null.
  const float* k_shift(int64_t layer) const { return layout_.k_shift_of(layer); }
  // f32 pool (dtype kAuto).
  float* k(int64_t layer) { return k_.data_as<float>() + layer * layer_elems(); }
  float* v(int64_t layer) { return v_.data_as<float>() + layer * layer_elems(); }
  // Quantized pools: codes (int8 for kInt8, E4M3 for kFp8) and their scales.
  int8_t* k_codes(int64_t layer) { return k_.data_as<int8_t>() + layer * layer_elems(); }
  int8_t* v_codes(int64_t layer) { return v_.data_as<int8_t>() + layer * layer_elems(); }
  Fp8Code* k_fp8(int64_t layer) { return reinterpret_cast<Fp8Code*>(k_codes(layer)); }
  Fp8Code* v_fp8(int64_t layer) { return reinterpret_cast<Fp8Code*>(v_codes(layer)); }
  float* k_scales(int64_t layer) { return k_scale_.data_as<float>() + layer * layer_rows(); }
  float* v_scales(int64_t layer) { return v_scale_.data_as<float>() + layer * layer_rows(); }

 private:
  int64_t layer_rows() const { return layout_.num_blocks * layout_.block_size * layout_.num_kv_heads; }
  int64_t layer_elems() const { return layer_rows() * layout_.head_dim; }
  void check_copy(const KvSwapCopy& c) const;
  // The byte ranges of block `block` in layer `l`: K codes, V codes, K scales, V scales
  // (the scales empty for f32), in the order a host slot stores them.
  std::array<std::span<uint8_t>, 4> block_parts(int64_t l, int64_t block);
  KvLayout layout_;
  Tensor k_, v_;              // f32, or one-byte codes (stored as i8)
  Tensor k_scale_, v_scale_;  // quantized only
  std::unique_ptr<uint8_t[]> host_;  // not value-initialized: untouched pages cost nothing
  int32_t host_blocks_ = 0;
};

}  // namespace kiln::cpu
