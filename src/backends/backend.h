// The interface every backend implements (ggml's device interface is the model): it
// says which nodes it supports, compiles a graph (weights into its own layout, a
// memory plan), allocates KV-cache storage, and runs one engine step. Only code under
// src/backends/<name>/ knows a backend's internals. Tested through each backend's tests.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ir/graph.h"

namespace kiln {

// The ragged layout of one engine step (DESIGN.md): the new tokens of every sequence
// are concatenated on one token axis T. For sequence s, its rows are
// [q_start, q_start + q_len) and they are the last q_len of its ctx_len context tokens.
struct StepSequence {
  int32_t q_start = 0;
  int32_t q_len = 0;
  int32_t ctx_len = 0;
  std::vector<int32_t> block_table;  // KV blocks holding positions [0, ctx_len)
};

struct StepInfo {
  std::vector<StepSequence> seqs;
  std::vector<int64_t> slot_mapping;  // [T]: pool slot for each new token's K/V, -1 = none
  // TopKLogits: the step needs only each row's first top_k candidates (0: all k of the
  // node). A backend may then return [R, min(k, top_k)] outputs, the same leading
  // columns as the whole [R, k] (a greedy step asks for 1: an argmax and its log-prob
  // instead of a 64-way selection over the vocabulary), or ignore it and return [R, k].
  int32_t top_k = 0;
  int64_t num_tokens() const { return int64_t(slot_mapping.size()); }
};

// Storage of the KV cache (the --kv-cache-dtype flag, ModelOptions::kv_cache_dtype).
// kAuto: the backend's activation dtype (f32 on the CPU, bf16/f16 on CUDA). The quantized
// dtypes store one byte per element and one f32 scale per (token slot, kv head), taken
// over the head's head_dim values when the row is written (amax = max|x|):
//   kInt8: symmetric int8 codes, s = amax / 127, code = round(x * (127 / amax)) in
//          [-127, 127];
//   kFp8:  FP8 E4M3 codes, s = amax / 448, code = e4m3(x * (448 / amax)) (round to
//          nearest even, saturating), so the largest |x| lands on E4M3's largest value.
// x ~ decode(code) * s. An all-zero row has s = 0 and zero codes; a row with a NaN or
// infinity has s = NaN (attention then reads NaN, as it would from a 16/32-bit cache).
// Both factors are computed in f32 (127.0f / amax, amax / 127.0f): every backend
// quantizes to the same codes and scales. Both backends implement both.
// Key centering (KvLayout::k_shift): a quantized pool may store each key row less a
// constant vector m of its layer and kv head, i.e. quantize x - m (computed in f32)
// instead of x. Every key of a head then moves by the same m, so each query's scores
// move by the same q.m and the softmax is unchanged; only the rounding error shrinks
// where keys share a large common part (the channel biases of RoPE's slow pairs).
// Values are stored as they are (their mean would not cancel). Not for soft-capped scores
// (the cap acts before the softmax): the runtime gives such layers a zero shift.
// Key rotation (KvLayout::k_rotate): a quantized pool may store each key row (less its
// shift) through a Walsh-Hadamard transform H of blocks of b channels, b the largest
// power of two dividing head_dim (core/hadamard.h: unnormalized, butterflies in a fixed
// order so every backend stores the same codes), and attention multiplies each
// query by H / b first: H is symmetric with H H = b I, so every score is unchanged. The
// transform spreads a row's few large channels (RoPE's slow pairs, which queries share)
// over all of them: E4M3 rounds each element relative to itself, and a score's error
// is then a sum of many small, independent errors instead of one large one.
enum class KvDType { kAuto, kInt8, kFp8 };
// "auto" | "int8" | "fp8" (or vLLM's "fp8_e4m3"); throws kInvalidArgument naming
// --kv-cache-dtype otherwise (fp8_e5m2 with why).
KvDType kv_dtype_parse(const std::string& name);
const char* kv_dtype_name(KvDType t);
inline bool kv_dtype_quantized(KvDType t) { return t != KvDType::kAuto; }
// The largest code magnitude of a quantized KV dtype (127 or 448): s = amax / this.
inline float kv_dtype_code_max(KvDType t) { return t == KvDType::kFp8 ? 448.0f : 127.0f; }

// Shape of the KV block pool the runtime asks a backend for.
struct KvLayout {
  int64_t num_layers = 0;
  int64_t num_blocks = 0;
  int64_t block_size = 16;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  KvDType dtype = KvDType::kAuto;
  // Quantized dtypes: the key shift m, [num_layers, num_kv_heads, head_dim] f32
  // (runtime/kv_calibration.h measures it); null or empty: keys stored as they are.
  // A kAuto pool ignores it.
  std::shared_ptr<const std::vector<float>> k_shift;
  // Quantized dtypes: keys stored rotated (see "Key rotation" above). A kAuto pool ignores it.
  bool k_rotate = false;
  bool k_rotated() const { return kv_dtype_quantized(dtype) && k_rotate; }
  // Layer `l`'s shift [num_kv_heads * head_dim] when this layout quantizes with one; else null.
  const float* k_shift_of(int64_t l) const {
    if (!kv_dtype_quantized(dtype) || !k_shift || k_shift->empty()) return nullptr;
    return k_shift->data() + l * num_kv_heads * head_dim;
  }
  size_t bytes() const {
    return size_t(2 * num_layers * num_blocks * block_size * num_kv_heads * head_dim) * 4;
  }
  // Elements of one block of K (or of V) in one layer.
  int64_t block_elems() const { return block_size * num_kv_heads * head_dim; }
  // Bytes of one block over every layer, K and V, at `elem_bytes` per element.
  size_t block_bytes(size_t elem_bytes) const { return size_t(2 * num_layers * block_elems()) * elem_bytes; }
};

// One block's move between the device pool and the host swap space.
struct KvSwapCopy {
  int32_t block = -1;  // in the device pool
  int32_t host = -1;   // slot in the host swap space
};

// Backend-owned KV storage for every layer; opaque to the runtime.
class KvStorage {
 public:
  virtual ~KvStorage() = default;
  virtual const KvLayout& layout() const = 0;
  // Copies whole blocks src -> dst for every layer (copy-on-write of shared blocks).
  virtual void copy_block(int32_t src, int32_t dst) = 0;

  // Preemption by swapping (the executor's PreemptionMode::kSwap). A host swap space of
  // `num_blocks` slots, each holding one whole block (every layer, K and V): plain host
  // memory on the CPU, page-locked on a GPU so that the copies are asynchronous.
  // Replaces an earlier space, whose contents are lost; 0 frees it. Storages that
  // cannot swap throw kUnsupported.
  virtual void host_reserve(int32_t num_blocks);
  virtual int32_t host_blocks() const { return 0; }
  // Bytes of one block as stored (one host slot).
  virtual size_t block_bytes() const { return layout().block_bytes(4); }
  // Copies each pair's device block to its host slot (swap_out) or back (swap_in). On a
  // GPU the copies are queued on the stream the engine steps run on, so a later step may
  // overwrite a swapped-out block, and a later swap_out may reuse a slot that a queued
  // swap_in still reads, without waiting: the stream orders them. The host never
  // touches the slots itself.
  virtual void swap_out(std::span<const KvSwapCopy> copies);
  virtual void swap_in(std::span<const KvSwapCopy> copies);

  // Copies layer `layer`'s keys at pool slots `slots` (block * block_size + row) to the
  // host as f32 rows [slots.size(), num_kv_heads * head_dim], as attention reads them
  // (a 16-bit pool's values widened). Unquantized (kAuto) pools only: the key-shift
  // calibration reads what an exact cache holds. Waits for the device. Others throw
  // kUnsupported; a slot or layer out of range throws kInvalidArgument.
  virtual void read_keys(int64_t layer, std::span<const int64_t> slots, float* out) const;
};

// read_keys' argument checks, shared by the backends (kInvalidArgument naming the bad
// layer or slot; kUnsupported for a quantized pool).
void kv_check_read_keys(const KvLayout& layout, int64_t layer, std::span<const int64_t> slots);
// A layout's k_shift, when set, holds num_layers * num_kv_heads * head_dim finite values
// (kInvalidArgument saying what is wrong otherwise). Backends check it on allocation.
void kv_check_k_shift(const KvLayout& layout);

// Free and total memory of the device a backend allocates on. Ranks on one `device`
// share its free memory.
struct DeviceMemory {
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  std::string device;  // "cpu", "cuda:0"
};

class Communicator;

// The allowed range of one symbolic dim (an engine's optimization profile).
struct DimRange {
  int64_t min = 1, opt = 1, max = 1;
};

// An optimization profile: allowed ranges of the graph's symbolic dims (TensorRT's
// min/opt/max per dynamic input). Dims it does not list are not limited.
struct ShapeProfile {
  std::string name;
  std::map<std::string, DimRange> dims;
};

// Instrumentation of Linear nodes (calibration and per-layer error reports; the CPU
// backend implements it, others ignore it). Called on the executor thread.
struct LinearObserver {
  // Every Linear's input x [t, k] before it runs.
  std::function<void(const std::string& node, const float* x, int64_t t, int64_t k)> on_input;
  // For quantized (attr quant) Linears: their output and the f32 GEMM of the same input
  // with the same (smoothed) weights, both [t, n] before any activation epilogue.
  std::function<void(const std::string& node, const float* y, const float* y_f32, int64_t t, int64_t n)> on_quant_output;
  // Every Linear's GEMM output y [t, n] (bias included) before any activation epilogue
  // (for a swiglu Linear: the [gate | up] rows SwiGLU reads).
  std::function<void(const std::string& node, const float* y, int64_t t, int64_t n)> on_output;
};

struct CompileOptions {
  // Storage of GEMM weights: f32 | bf16 | f16 | q8 | q4 | w8a8. w8a8: Linear nodes with
  // attrs quant="w8a8" and act_amax (quant/w8a8.h) run int8 x int8; the rest stay f32.
  std::string weight_dtype = "f32";
  std::shared_ptr<const LinearObserver> linear_observer;  // null: none
  // This rank's link to the others for AllReduce nodes (tensor parallelism); null
  // for an unsharded graph.
  std::shared_ptr<Communicator> communicator;
  // Tactics chosen by the builder: node name -> backend-specific tactic id. Nodes not
  // listed use the backend's heuristic.
  std::map<std::string, std::string> tactics;
  // The engine's optimization profiles. run() takes the one named `profile`, or else
  // the first whose ranges hold every input's dims, and rejects inputs outside it
  // (all of them) naming the input, its shape and the allowed ranges
  // (backends/shape_profile.h). Empty: any size.
  std::vector<ShapeProfile> profiles;
  std::string profile;
  // Whether a backend may time GEMM tactics at a decode batch size the first time a step
  // of that size runs (CUDA: Gemm::RowTuningScope, ~50-70 ms a new size). A server, whose
  // batch sizes change with every arrival and finish, turns it off: each new size would
  // stall the streams running (see ModelOptions::step_tuning). Off, CUDA also runs a row
  // count between powers of two with the algorithms of the power of two above it
  // (Gemm::set_row_buckets).
  bool step_tuning = true;
  // A file keeping the GEMM tactics timed on this device (CUDA: gemm_search.h's tactic
  // cache, read at compile and updated by every timing; "" none, unless
  // KILN_CUDA_TACTIC_CACHE names one). Backends without timed GEMMs ignore it.
  std::string tactic_cache;
};

// Host tensors keyed by graph input/output name.
using TensorMap = std::map<std::string, Tensor>;

class CompiledGraph {
 public:
  virtual ~CompiledGraph() = default;
  // Runs one step. `inputs` must hold every graph input; `kv` may be null for graphs
  // without Attention. Returns the graph outputs named in `outputs` (all of them when
  // it is empty), valid until the next run; nodes that none of them needs are skipped,
  // and on a GPU only those outputs cross to the host (a decoder step asks for the
  // compact TopKLogits outputs instead of [R, vocab] logits when it can). An unknown
  // name is kInvalidArgument.
  virtual TensorMap run(const TensorMap& inputs, const StepInfo& step, KvStorage* kv,
                        const std::vector<std::string>& outputs) = 0;
  TensorMap run(const TensorMap& inputs, const StepInfo& step, KvStorage* kv) { return run(inputs, step, kv, {}); }
  // Bytes of weights as stored by the backend, and of the activation plan's peak.
  virtual size_t weight_bytes() const = 0;
  // Of weight_bytes(), those holding graph weight v (0 where the backend does not count it
  // there: the CPU counts its Linears' weights only).
  virtual size_t weight_bytes_of(ir::ValueId v) const { return 0; }
  virtual size_t activation_bytes() const = 0;
  // Whether steps are captured per shape and replayed (CUDA graphs): a caller whose
  // shapes vary, such as a server's decode batch, then keeps to a few of them
  // (LlmRunnerOptions::decode_buckets).
  virtual bool captures_steps() const { return false; }
  // The weights of the graph this was compiled from whose every use runs from copies on
  // the backend's device, after dropping its own references to their host tensors: the
  // caller may release those too (ModelOptions::lean_host_weights). CUDA: the weights it
  // uploaded; the CPU: none (it reads host memory).
  virtual std::vector<ir::ValueId> release_host_weights() { return {}; }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual bool supports(const ir::Node& node, const ir::Graph& graph) const = 0;
  virtual std::unique_ptr<CompiledGraph> compile(const ir::Graph& graph,
                                                 const CompileOptions& options) = 0;
  virtual std::unique_ptr<KvStorage> allocate_kv(const KvLayout& layout) = 0;
  // Bytes of one KV block of `layout` as allocate_kv() stores it (every layer, K and V).
  virtual size_t kv_block_bytes(const KvLayout& layout) const { return layout.block_bytes(4); }
  // Memory free now on this backend's device (KV pools sized by a fraction of it): CUDA
  // asks cudaMemGetInfo on the backend's device; the CPU reads MemAvailable and MemTotal
  // from /proc/meminfo.
  virtual DeviceMemory memory_info() = 0;

  // Tactic autotuning (the builder): the tactic ids worth timing for `node` (empty when
  // the backend has one implementation), and the median seconds of one run of `node`
  // with `tactic` when its symbolic dims take the values in `dims`.
  virtual std::vector<std::string> node_tactics(const ir::Node& node, const ir::Graph& graph) const {
    return {};
  }
  virtual double time_tactic(const ir::Node& node, const ir::Graph& graph, const std::string& tactic,
                             const std::map<std::string, int64_t>& dims, const CompileOptions& options) {
    return -1;
  }
  // Whether this backend implements the fused forms a fusion pass emits (pass names
  // from src/passes: "fuse_add_norm" -> AddRMSNorm/AddLayerNorm, "fuse_swiglu" ->
  // SwiGLU, "fuse_qkv_attention" -> Attention{packed_qkv} with RoPE inside,
  // "fuse_embedding_norm" -> EmbeddingLayerNorm,
  // "fuse_linear_activation" -> Linear{activation}, "fuse_norm_linear" -> Linear{norm}
  // and Linear with a residual input). Passes a backend does not claim
  // are skipped for it, and an engine using them is refused with a clear error.
  virtual bool supports_fusion(const std::string& pass) const { return false; }
  // Whether graphs built for this backend should run `pass` (a subset of what it
  // supports): a fused form the backend runs but gains nothing from stays off, keeping
  // today's graph (the CPU runs "fuse_norm_linear" Linears, e.g. from a CUDA engine or
  // in the pass's tests, but its graphs keep their norm nodes).
  virtual bool wants_fusion(const std::string& pass) const { return supports_fusion(pass); }
  // Whether Attention's `window` attribute (sliding-window attention: Mistral v0.1, Gemma
  // 3's local layers, ...) is implemented. A backend without it attends fully; Model caps
  // the sequences it runs at the smallest window, where both agree.
  virtual bool supports_sliding_window() const { return false; }
  // Whether W8A8 Linears' attr weight_amax is implemented: a row-parallel shard's int8
  // weight scales, one per output row, taken from the unsharded rows
  // (parallel/tensor_parallel.h). A backend without it is refused such a graph (Model)
  // rather than rounding each rank's slice on the slice's own maxima.
  virtual bool supports_w8a8_weight_amax() const { return false; }
  // Build time (`kiln build --pack-weights`): rewrites GEMM weights in `graph` into this
  // backend's run-time layout, so that loading the engine packs nothing; returns how
  // many nodes it rewrote (0: the backend has no such layout). Rewritten nodes carry
  // the attribute weight_layout, which only supports_weight_layout() backends run.
  virtual size_t pack_weights(ir::Graph& graph, const CompileOptions& options) { return 0; }
  virtual bool supports_weight_layout(const std::string& layout) const { return false; }
  // Tensor parallelism: one communicator per rank for the AllReduce nodes of sharded
  // graphs (CompileOptions::communicator), rank r running on device first_device + r of
  // this backend's kind. The CPU backend joins threads of this process; CUDA uses NCCL
  // over one GPU per rank. Backends without collectives throw kUnsupported.
  virtual std::vector<std::shared_ptr<Communicator>> make_communicators(int world_size, int first_device);
  // Identifies the device tactics were timed on ("cpu avx2 2 threads", "NVIDIA H200").
  virtual std::string device_name() const { return name(); }
  // The device's ceilings, measured now (`kiln bench` prints its rates against them): a
  // 1 GiB device-to-device copy in GB/s (bytes read + written) and a bf16 8192^3 GEMM in
  // TFLOP/s; 0 where the backend does not measure one (the CPU: kiln bench times the host's
  // memory triad itself) or the device has no room for the buffers.
  struct Ceilings {
    double copy_gbs = 0;
    double gemm_tflops = 0;
  };
  virtual Ceilings measure_ceilings() { return {}; }
};

// "cpu" (always), "cuda" (when built with CUDA) or a registered backend; throws
// kUnsupported otherwise. `device`: which device of that kind (CUDA device index; the
// CPU has one).
std::unique_ptr<Backend> create_backend(const std::string& name, int device = 0);
std::vector<std::string> available_backends();
// Makes `name` a backend create_backend() (and ModelOptions::backend) knows, built by
// `make(device)`: a backend outside this tree, or a test's variant of one. The built-in
// names cannot be replaced (kInvalidArgument); registering a name again replaces it.
using BackendFactory = std::function<std::unique_ptr<Backend>(int device)>;
void register_backend(const std::string& name, BackendFactory make);

}  // namespace kiln
