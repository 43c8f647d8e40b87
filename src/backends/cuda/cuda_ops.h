// The CUDA op table: one entry per supported IR op, each preparing per-node state at
// compile time (weights uploaded in their device dtype) and launching kernels at step
// time on the context's stream. Internal to the CUDA backend; tested op by op against
// the CPU backend in tests/backends/cuda/ops_test.cpp.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "backends/backend.h"
#include "backends/cuda/cuda_context.h"
#include "backends/cuda/ops/attention.h"
#include "backends/cuda/ops/gemv_quant.h"

namespace kiln::cuda {

// A device tensor seen by an op: contiguous, row-major.
struct DevTensor {
  void* data = nullptr;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  int64_t dim(int i) const { return shape[i < 0 ? shape.size() + size_t(i) : size_t(i)]; }
};

// The CUDA KV pool: per layer, K and V as [num_blocks, block_size, Hkv, D] in the
// activation dtype (bf16/f16/f32; KvDType kAuto) or as one-byte codes (kInt8, kFp8) with
// f32 scales [num_blocks, block_size, Hkv] per layer in a buffer of their own (K's and
// V's), all zero-initialized. The host swap space is pinned memory with a slot per
// swapped block: [layer][K, V][block_size, Hkv, D] and then, quantized,
// [layer][K, V][block_size, Hkv] scales; swaps are cudaMemcpy2DAsync on the context's
// stream (one per block for K, one for V, every layer at once, and as many for the
// scales), ordered with the engine steps.
class CudaKv : public KvStorage {
 public:
  // `act`: the activation dtype of the graphs that will run on this pool.
  CudaKv(const KvLayout& layout, DType act, std::shared_ptr<CudaContext> cx);
  ~CudaKv() override;
  // Bytes of one block of `layout` over every layer (codes and scales).
  static size_t block_bytes_of(const KvLayout& layout, DType act);
  const KvLayout& layout() const override { return layout_; }
  void copy_block(int32_t src, int32_t dst) override;
  size_t block_bytes() const override { return block_bytes_of(layout_, dtype_); }
  void host_reserve(int32_t num_blocks) override;
  int32_t host_blocks() const override { return host_blocks_; }
  void swap_out(std::span<const KvSwapCopy> copies) override;
  void swap_in(std::span<const KvSwapCopy> copies) override;
  // The activation dtype this pool was made for (also the element dtype when kAuto).
  DType dtype() const { return dtype_; }
  KvCode code() const { return code_; }
  void* k(int64_t layer) const { return static_cast<char*>(k_.get()) + size_t(layer) * layer_bytes(); }
  void* v(int64_t layer) const { return static_cast<char*>(v_.get()) + size_t(layer) * layer_bytes(); }
  // Bytes from one layer's K (V) to the next's.
  size_t layer_bytes() const { return size_t(layout_.num_blocks) * layer_block_bytes(); }
  // Quantized pools: the layer's scales, [num_blocks * block_size, Hkv]; null for kAuto.
  float* k_scales(int64_t layer) const { return scales_at(k_scale_, layer); }
  float* v_scales(int64_t layer) const { return scales_at(v_scale_, layer); }
  // Quantized pools with a key shift (KvLayout::k_shift): the layer's [Hkv, D] on the
  // device; null otherwise.
  const float* k_shift(int64_t layer) const {
    if (!k_shift_.get()) return nullptr;
    return static_cast<const float*>(k_shift_.get()) + layer * layout_.num_kv_heads * layout_.head_dim;
  }
  void read_keys(int64_t layer, std::span<const int64_t> slots, float* out) const override;
  // Every device buffer of the pool (captured step graphs bake their addresses in).
  std::vector<const void*> buffers() const {
    return {k_.get(), v_.get(), k_scale_.get(), v_scale_.get(), k_shift_.get()};
  }

 private:
  // One block of K (or V) in one layer: codes or elements, and (quantized) scales.
  size_t layer_block_bytes() const { return size_t(layout_.block_elems()) * elem_bytes_; }
  size_t layer_block_scale_bytes() const {
    return code_ == KvCode::kNone ? 0 : size_t(layout_.block_size * layout_.num_kv_heads) * 4;
  }
  size_t layer_scale_bytes() const { return size_t(layout_.num_blocks) * layer_block_scale_bytes(); }
  float* scales_at(const DeviceBuffer& b, int64_t layer) const {
    if (code_ == KvCode::kNone) return nullptr;
    return reinterpret_cast<float*>(static_cast<char*>(b.get()) + size_t(layer) * layer_scale_bytes());
  }
  void swap(std::span<const KvSwapCopy> copies, bool out);
  KvLayout layout_;
  DType dtype_;
  KvCode code_ = KvCode::kNone;
  size_t elem_bytes_ = 2;
  std::shared_ptr<CudaContext> cx_;
  DeviceBuffer k_, v_;
  DeviceBuffer k_scale_, v_scale_;  // quantized only
  DeviceBuffer k_shift_;            // quantized with a key shift only
  PinnedBuffer host_;
  int32_t host_blocks_ = 0;
};

// Which attention nodes share a step's plan: those of the same heads, and the ones with a
// sliding window or soft-capped scores apart (window_or_cap: in steps where those matter,
// their plans keep to the kernels with AttentionArgs::window and softcap - the tile and
// cluster decode kernels, and the tensor-core one at head dim 256).
struct AttnPlanKey {
  int64_t hq = 0, hkv = 0;
  bool window_or_cap = false;
  auto operator<=>(const AttnPlanKey&) const = default;
};
// An Attention node's AttnPlanKey::window_or_cap.
inline bool attention_window_or_cap(const ir::Node& n) {
  return n.attr_int("window", 0) > 0 || n.attr_float("softcap", 0.0) > 0.0;
}

// One attention configuration's plan for the current step, on the device.
struct DevAttentionPlan {
  const AttnWork* work = nullptr;
  int32_t num_work = 0;
  const AttnCombine* combine = nullptr;
  int32_t num_combine = 0;
  int32_t num_partials = 0;
  int32_t flash_width = 0;    // > 0: a tensor-core plan of CTAs this many items wide
  int32_t flash_items_per_sm = 256;  // AttentionPlan::flash_items_per_sm
  int32_t decode_splits = 0;  // > 0: the cluster decode kernel's plan
  int32_t decode_warp = 0;    // AttentionPlan::decode_warp
  // The step runs its nodes' windows and soft caps (false: a window no shorter than any
  // context, which hides no key, runs as none).
  bool windowed = false;
};

// The step's metadata on the device (one upload per step).
struct DevStep {
  const AttnSeq* seqs = nullptr;
  int32_t num_seqs = 0;
  const int32_t* block_tables = nullptr;
  const int64_t* slot_mapping = nullptr;
  std::map<AttnPlanKey, DevAttentionPlan> plans;
  int32_t flash_warp_rows = 0;  // KILN_CUDA_FLASH_WARP_ROWS (AttentionArgs::flash_warp_rows)
  float* attn_workspace = nullptr;
  int32_t* attn_counters = nullptr;  // the fused decode kernel's split counters, zero between launches
};

struct OpContext {
  std::vector<const DevTensor*> inputs;     // nullptr for an absent optional input
  std::vector<const Tensor*> host_inputs;   // the host tensor where an input is a graph input
  const StepInfo* step = nullptr;
  const DevStep* dev = nullptr;
  CudaKv* kv = nullptr;
  CudaContext* cx = nullptr;
  // Output i with this shape, in the activation dtype unless `dtype` says otherwise
  // (TopKLogits writes f32 and i32).
  std::function<DevTensor&(size_t, std::vector<int64_t>, std::optional<DType>)> alloc;
  DevTensor& out(size_t i, std::vector<int64_t> shape, std::optional<DType> dtype = std::nullopt) {
    return alloc(i, std::move(shape), dtype);
  }
  // Device scratch of at least `bytes`, valid until the op returns (one buffer shared by
  // every op of the graph; sized by the first, eager run of a step shape).
  std::function<void*(size_t)> scratch;
};
using OpRun = std::function<void(OpContext&)>;

// Weights on the device, uploaded once per (value, dtype): a tied embedding and LM head
// share one copy. get_quant uploads a Linear weight [n, k] quantized (q8/q4, quantized
// on the host by core/weight_quant.h, as the CPU backend does) in a device layout
// (gemv_quant.h), never a 16-bit copy.
class DeviceWeights {
 public:
  const void* get(const ir::Graph& g, ir::ValueId v, DType dtype);
  // A u8 [n, row bytes] row image of K = image_k in format image_f (a lookup table kept
  // quantized: the Embedding's weight_quant) expanded to `dtype` rows [n, image_k].
  const void* get_dequantized(const ir::Graph& g, ir::ValueId v, DType dtype, int64_t image_k, QuantFormat image_f);
  // image_k > 0: the weight arrived quantized, a u8 [n, row bytes] row image of K =
  // image_k in format image_f (core/weight_quant.h; a GGUF's own codes), uploaded as
  // is when image_f == f, else expanded and quantized to f.
  const QuantWeightView& get_quant(const ir::Graph& g, ir::ValueId v, QuantFormat f, QuantLayout layout,
                                   int64_t image_k = 0, QuantFormat image_f = QuantFormat::kQ4);
  size_t bytes() const { return bytes_; }
  // Of bytes(), those get and get_quant uploaded for graph weight v (every copy of it).
  size_t bytes_of(ir::ValueId v) const {
    auto it = by_value_.find(v);
    return it == by_value_.end() ? 0 : it->second;
  }
  // Counts weights an op uploads itself (the FP8 Linear's codes).
  void add_bytes(size_t b) { bytes_ += b; }
  // The graph weights get, get_dequantized and get_quant uploaded.
  std::vector<ir::ValueId> uploaded() const {
    std::vector<ir::ValueId> out;
    for (const auto& [v, bytes] : by_value_) out.push_back(v);
    return out;
  }

 private:
  void upload(DeviceBuffer& buf, ir::ValueId v, const Tensor& host);  // into buf, counted for v
  std::map<std::pair<ir::ValueId, DType>, DeviceBuffer> bufs_;
  std::map<std::tuple<ir::ValueId, QuantFormat, QuantLayout>, std::pair<DeviceBuffer, QuantWeightView>> quant_;
  std::map<ir::ValueId, size_t> by_value_;
  size_t bytes_ = 0;
};

struct PrepareContext {
  DType act = DType::kBF16;
  std::string weight_dtype = "bf16";  // CompileOptions::weight_dtype (q8/q4 quantize Linears)
  DeviceWeights* weights = nullptr;
  CudaContext* cx = nullptr;
  // Where quantized Linears dequantize weight tiles for cuBLASLt (more rows than the
  // GEMV takes). Sized while preparing, never after, so captured decode graphs keep its
  // address; one buffer for the graph (ops run one at a time on the stream).
  DeviceBuffer* dequant_ws = nullptr;
  // This rank's link to the others for AllReduce nodes (tensor parallelism), or null.
  std::shared_ptr<Communicator> communicator;
};

// A Linear run's input x [t, k] (its features checked against the weight's K: a
// kInvalidArgument error naming the node) and its output y [t, out_n], in the activation
// dtype unless `y_dtype` says otherwise; every Linear variant starts so.
struct LinearIo {
  const DevTensor& x;
  DevTensor& y;
  int64_t t;
};
LinearIo linear_io(OpContext& c, const std::string& name, int64_t k, int64_t out_n,
                   std::optional<DType> y_dtype = std::nullopt);

// The q8/q4 format a Linear's weight runs in on CUDA: its `precision` attribute (from
// assign_precision) or else the compile's weight dtype; none for other precisions, or
// when K is not a multiple of kQuantGroup (then it stays in the activation dtype, as the
// CPU keeps such layers in bf16).
std::optional<QuantFormat> cuda_linear_quant_format(const ir::Node& n, const ir::Graph& g,
                                                    const std::string& weight_dtype);
// Rows of each weight tile that a q8/q4 Linear dequantizes for cuBLASLt where neither the
// GEMV nor the skinny GEMM takes its token rows (past kQGemmSkinnyMaxRows by default), for an [n,
// k] weight of elem_bytes-wide values and t rows, on a device of `sms` SMs: ~24 MB, so the tile
// stays in L2 between the dequantize kernel and the GEMM; with `wide` (KILN_CUDA_DEQUANT_WIDE, on
// by default) and 256+ rows, where the GEMM is bound by its arithmetic, enough rows for four waves
// of 128 x 256 output tiles (up to 256 MB), since an L2-sized tile leaves most SMs idle (at 512
// rows, 48 of 132). Tiles are even multiples of 128 rows (cuBLASLt's 256-byte alignment of y's
// slices) or n.
int64_t dequant_tile_rows(int64_t n, int64_t k, size_t elem_bytes, int64_t t, int sms, bool wide);
// Token rows up to which a q8/q4 Linear of `weights` values (n x k) runs its GEMV over even
// chunks of at most kQGemvMaxRows rows instead of dequantized tiles, where the skinny GEMM
// does not take them (KILN_CUDA_QGEMM=dequant, or a weight it cannot read) (each chunk streams
// the codes once: a gain only where tiles of that many values cost more than two passes):
// `chunk_rows` (KILN_CUDA_QGEMV_CHUNK_ROWS, default 16) for weights of at least
// `min_weights` values (KILN_CUDA_QGEMV_CHUNK_MIN_WEIGHTS, default 80M) when `kernel_fits`
// (the GEMV takes 8 rows at this k: the dp4a kernel's x fits its shared memory, or the
// mma kernel; not the f32 kRows kernel), else 0.
int64_t qgemv_chunk_rows(int64_t weights, int64_t chunk_rows, int64_t min_weights,
                         bool kernel_fits);
// The node producing value v and v's position among its outputs; null for inputs and
// weights (the fused quantizes ask what produced a Linear's input).
std::pair<const ir::Node*, size_t> value_producer(const ir::Graph& g, ir::ValueId v);

using OpPrepare = std::function<OpRun(const ir::Node&, const ir::Graph&, PrepareContext&)>;

const OpPrepare* find_cuda_op(const std::string& op);
// Whether the CUDA backend can run this node; when not, `why` says what is missing.
bool cuda_op_supported(const ir::Node& n, const ir::Graph& g, std::string* why = nullptr);

}  // namespace kiln::cuda
