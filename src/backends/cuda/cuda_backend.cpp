// CUDA backend: compiles a graph into prepared op runners over device buffers. Activation
// memory follows the CPU backend's plan (values whose lifetimes do not overlap share a
// buffer; buffers grow to the largest shape seen, so steady-state steps allocate
// nothing). A step makes one host->device copy (integer inputs, the step layout, the
// attention plans), launches every node on one stream, and copies the outputs back:
// only those the run asked for (a decode step that samples from TopKLogits fetches
// [R, k], not [R, vocab]), and nodes none of them needs are not launched.
// Decode steps (one token per sequence, with a KV pool, 16-bit) and steps without a KV
// cache (encoder forwards) run as CUDA graphs, one per step shape (cuda_graph.h);
// KILN_CUDA_GRAPHS=0 runs them eagerly. Not in f32:
// there decode GEMMs go through cuBLASLt, whose results under capture differed from
// eager in the last bits (seen on the H200), and replay must give eager's bits.
// A decode step's first run at a new batch size times the cuBLASLt tactics of its GEMMs at
// that row count (gemm.h; KILN_CUDA_GEMM_TUNE_M=0 keeps the heuristic's first).
// KILN_CUDA_STEP_TIMES=1 logs the median and largest device time of the steps of each
// kind and token count (CUDA events); with KILN_LOG=debug also each step that is not a
// decode step, in order, and every device buffer that grows again (a synchronizing free).
// KILN_CUDA_PROFILE=1 is the layer profiler (like trtexec --dumpProfile): every step runs
// eagerly behind a short spin kernel, so its launches are queued before the first kernel
// starts and the kernels then run back to back as in a graph; CUDA events between the
// nodes give each node's device time, summed per op and shape and logged at exit. FP8
// Linears show as Linear{fp8}; {e4m3 in} marks one that skips its quantize pass and
// {+e4m3 quantize} a node (norm, SwiGLU, GELU, FP8 Linear) that writes its readers' E4M3
// codes itself (cuda_fp8_linear.h: the quantize fused into the producer); {int8 in} and
// {+int8 quantize} likewise for W8A8 Linears (cuda_int8_fuse.h).
// KILN_CUDA_PROFILE=graph is the in-graph profiler: the first graph-replayed step of each
// kind (decode, other) is followed by graphs of its launch sequence cut after each node,
// every one timed by replays (as the step runs: CUDA graph, dependent launch), and a node's
// cost is how much it lengthens the graph it ends - what removing it would save, overlap
// with its neighbours included (the eager profile above times each node alone). The costs
// sum to the step's graph time; printed per op and shape, and node by node with KILN_LOG=debug.
// Where a norm's output is read by W8A8 Linears and by other nodes, the compiled graph
// runs its own copy of the graph in which the norm has one more output, the Linears'
// codes (int8_add_dual_outputs); every other graph is run as given.
#include "backends/memory_plan.h"
#include "backends/cuda/cuda_backend.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <set>

#include "backends/cuda/cuda_decode_stack.h"
#include "backends/cuda/cuda_fp8_linear.h"
#include "backends/cuda/cuda_int8_fuse.h"
#include "backends/cuda/cuda_w8a8_linear.h"
#include "backends/cuda/cuda_graph.h"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/nccl_communicator.h"
#include "backends/cuda/event_timing.h"
#include "backends/cuda/ops/convert.h"
#include "core/log.h"
#include "core/status.h"

namespace kiln {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the non-sticky error
    return 0;
  }
  return n;
}

namespace cuda {
namespace {

// The activation dtype: the weight dtype's, and bf16 for weight-only q8/q4 (whose
// Linears then run quantized; Linears pinned to another precision, and every other
// weight, stay bf16).
DType act_dtype_from_option(const std::string& s) {
  if (s == "bf16" || s == "q8" || s == "q4") return DType::kBF16;
  if (s == "f16") return DType::kF16;
  if (s == "f32") return DType::kF32;
  if (s == "fp8") return DType::kBF16;  // FP8 Linears (quant/fp8.h) in a bf16 graph
  if (s == "w8a8") return DType::kBF16;  // INT8 Linears (quant/w8a8.h) in a bf16 graph
  throw_error(ErrorCode::kInvalidArgument, "cuda: unknown weight dtype '", s,
              "' (expected bf16, f16, f32, q8, q4, fp8 or w8a8)");
}

// Appends sections to the step's host staging buffer, each 16-byte aligned.
class StagingWriter {
 public:
  explicit StagingWriter(std::vector<uint8_t>& buf) : buf_(buf) { buf_.clear(); }
  size_t put(const void* data, size_t bytes) {
    const size_t off = (buf_.size() + 15) / 16 * 16;
    buf_.resize(off + bytes);
    if (bytes) std::memcpy(buf_.data() + off, data, bytes);
    return off;
  }
  template <typename T>
  size_t put_vec(const std::vector<T>& v) { return put(v.data(), v.size() * sizeof(T)); }

 private:
  std::vector<uint8_t>& buf_;
};

// The graph a compiled graph runs: g (verified), or its copy with the dual outputs' codes
// values added (cuda_int8_fuse.h) when it has any.
std::optional<ir::Graph> with_dual_outputs(const ir::Graph& g, DType act) {
  ir::verify(g);
  bool any = false;
  for (const ir::Node& n : g.nodes())
    for (size_t o = 0; o < n.outputs.size() && !any; ++o) any = int8_dual_output(n, o, g, act).has_value();
  if (!any) return std::nullopt;
  ir::Graph copy = g;  // weights are shared, not copied
  const int norms = int8_add_dual_outputs(copy, act);
  log_info("cuda: ", norms, " norms write both their output and the int8 codes of the W8A8 Linears among their "
           "readers (KILN_CUDA_INT8_FUSE=0 keeps a separate quantize pass)");
  return copy;
}

class CudaCompiledGraph final : public CompiledGraph {
 public:
  CudaCompiledGraph(const ir::Graph& given, const CompileOptions& opt, std::shared_ptr<CudaContext> cx)
      : own_graph_(with_dual_outputs(given, act_dtype_from_option(opt.weight_dtype))),
        graph_(own_graph_ ? *own_graph_ : given),
        cx_(std::move(cx)) {
    const ir::Graph& g = graph_;  // the graph run: given, or its rewritten copy
    cx_->make_current();
    if (!opt.step_tuning) {
      cx_->gemm->set_row_tuning(false);
      cx_->gemm->set_row_buckets(true);
    }
    if (!opt.tactic_cache.empty()) cx_->gemm->set_tactic_cache(opt.tactic_cache);
    prep_.communicator = opt.communicator;
    prep_.act = act_dtype_from_option(opt.weight_dtype);
    prep_.weight_dtype = opt.weight_dtype;
    prep_.weights = &weights_;
    prep_.cx = cx_.get();
    prep_.dequant_ws = &dequant_ws_;
    for (const ir::Node& n : g.nodes()) {
      std::string why;
      if (!cuda_op_supported(n, g, &why))
        throw_error(ErrorCode::kUnsupported, "cuda backend cannot run node '", n.name, "' (", n.op, "): ", why);
      runners_.push_back((*find_cuda_op(n.op))(n, g, prep_));
      if (n.op == "Attention") {
        // Sliding-window and soft-capped nodes plan apart (AttnWindows): in steps where
        // the window hides a key, or with a soft cap, the cluster decode kernel but not
        // the warp one, the tensor-core prefill kernel only at head dim 256
        // (attention_flash_supports_window), else the tile kernel.
        AttnWindows& aw =
            attn_keys_[{n.attr_int("num_heads"), n.attr_int("num_kv_heads"), attention_window_or_cap(n)}];
        if (n.attr_int("window", 0) > 0) aw.min_window = std::min(aw.min_window, n.attr_int("window"));
        aw.softcap = aw.softcap || n.attr_float("softcap", 0.0) > 0.0;
        attn_max_d_ = std::max(attn_max_d_, n.attr_int("head_dim"));
        attn_flash_ok_ = attn_flash_ok_ && attention_flash_supported(prep_.act, n.attr_int("head_dim"));
        attn_cluster_ok_ = attn_cluster_ok_ && decode_cluster_ &&
                           attention_decode_cluster_supported(prep_.act, n.attr_int("num_heads"),
                                                              n.attr_int("num_kv_heads"), n.attr_int("head_dim"));
      }
    }
    if (CudaDecodeStack::enabled_from_env()) {
      std::string why = "KILN_CUDA_PROFILE=1 times every node";
      if (!profile_) stack_ = CudaDecodeStack::plan(g, prep_, &why);
      if (stack_)
        log_info("cuda: decode steps of one sequence run the ", stack_->layers(),
                 " layers as one kernel (KILN_CUDA_DECODE_STACK=0 keeps a kernel per node)");
      else
        log_info("cuda: KILN_CUDA_DECODE_STACK=1, but this graph keeps a kernel per node: ", why);
    }
    gemms_pdl_ = w8a8_graph_gemms_are_cutlass(g);
    plan_memory();
    plan_input_checks();
    plan_profile_keys();
    vals_.resize(g.num_values());
    for (size_t v = 0; v < g.num_values(); ++v)
      if (g.is_weight(ir::ValueId(v))) {
        const Tensor& w = g.weight(ir::ValueId(v));
        vals_[v] = DevTensor{nullptr, w.dtype(), w.shape()};  // shape only; ops hold their own uploads
      }
    tune_gemms();
    if (step_times_) {
      KILN_CUDA_CHECK(cudaEventCreate(&step_ev_[0]));
      KILN_CUDA_CHECK(cudaEventCreate(&step_ev_[1]));
    }
    KILN_CUDA_CHECK(cudaStreamSynchronize(cx_->stream));
    log_info("cuda: compiled ", g.nodes().size(), " nodes, ", weights_.bytes() >> 20, " MiB of weights (",
             opt.weight_dtype, ", activations ", dtype_name(prep_.act), ") on device ", cx_->device);
  }

  DType act() const { return prep_.act; }

  using CompiledGraph::run;
  TensorMap run(const TensorMap& inputs, const StepInfo& step, KvStorage* kv,
                const std::vector<std::string>& wanted) override {
    cx_->make_current();
    select_outputs(wanted);
    auto* cuda_kv = dynamic_cast<CudaKv*>(kv);
    if (kv && !cuda_kv) throw_error(ErrorCode::kInvalidArgument, "KV storage is not a CUDA pool");
    if (cuda_kv && cuda_kv->dtype() != prep_.act)
      throw_error(ErrorCode::kInvalidArgument, "KV pool holds ", dtype_name(cuda_kv->dtype()),
                  " but the graph was compiled for ", dtype_name(prep_.act));
    cudaStream_t s = cx_->stream;
    std::vector<const Tensor*> host_vals(graph_.num_values(), nullptr);
    const auto host0 = std::chrono::steady_clock::now();
    bool graphable = false;
    const bool decode = stage_step(inputs, step, cuda_kv, host_vals, graphable);
    graph_key_.push_back(out_mask_);  // a captured step converts only the wanted outputs
    // The attention kernels a step launches depend on what the pool stores.
    graph_key_.push_back(cuda_kv ? int64_t(cuda_kv->code()) * 2 + (cuda_kv->layout().k_rotated() ? 1 : 0) : -1);
    if (step_times_) KILN_CUDA_CHECK(cudaEventRecord(step_ev_[0], s));
    bool enqueued = false;
    auto enqueue = [&] {
      set_pdl_allowed((decode || pdl_in_step(gemms_pdl_, step.num_tokens())) && !profile_);
      struct Reset {
        ~Reset() { set_pdl_allowed(false); }
      } reset;
      // A decode step's GEMMs (every step's with KILN_CUDA_GEMM_TUNE_M=all) are timed at its
      // row count the first time it is met, before any graph of that size is captured
      // (gemm.h: Gemm::RowTuningScope).
      std::optional<Gemm::RowTuningScope> row_tuning;
      if (decode || Gemm::row_tuning_every_step()) row_tuning.emplace(*cx_->gemm);
      run_nodes(step, cuda_kv, host_vals);
      convert_outputs();
      enqueued = true;
    };
    if (graphable && graphs_enabled_ && !profile_ && prep_.act != DType::kF32) {
      check_graph_inputs(step, host_vals);  // the runners' own checks do not run on replay
      graphs_.run(graph_key_, graph_buffers(cuda_kv), s, enqueue);
      // A replay sets no shapes on the host: those of this step shape were kept.
      auto& shapes = out_shapes_[graph_key_];
      if (enqueued) shapes.clear();
      size_t i = 0;
      for (auto& [name, id] : graph_.outputs()) {
        if (enqueued)
          shapes.push_back(vals_[size_t(id)].shape);
        else
          vals_[size_t(id)].shape = shapes.at(i++);
      }
      if (!enqueued) out_layout();
    } else {
      enqueue();
    }
    if (step_times_) KILN_CUDA_CHECK(cudaEventRecord(step_ev_[1], s));
    TensorMap out = fetch_outputs();
    // The first step of a shape creates cuBLASLt plans and sizes buffers on the host
    // between launches: a warm-up, left out of the profile.
    if (profile_ && !profiled_shapes_.insert(graph_key_).second) collect_profile(decode);
    // A replay (so the shape's warm-up and capture are done) of a kind not yet profiled.
    if (graph_profile_ && graphable && !enqueued && !(graph_profiled_ & (decode ? 1 : 2))) {
      graph_profiled_ |= decode ? 1 : 2;
      try {  // a diagnostic: the step's outputs are already fetched and stand
        profile_graph_prefixes(step, cuda_kv, host_vals, decode);
      } catch (const std::exception& e) {
        log_warn("cuda: KILN_CUDA_PROFILE=graph could not profile this step: ", e.what());
      }
    }
    if (step_times_) {
      float ms = 0;
      KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, step_ev_[0], step_ev_[1]));
      auto& times = step_ms_[{decode ? 0 : graphable ? 1 : 2, step.num_tokens()}];
      times.first.push_back(ms);
      times.second.push_back(
          std::chrono::duration<float, std::milli>(std::chrono::steady_clock::now() - host0).count());
      if (!decode)  // the steps whose shapes change: one line each, in order (KILN_LOG=debug)
        log_debug("cuda: step of ", step.num_tokens(), " tokens, ", step.seqs.size(), " sequences (longest query ",
                  max_q_len_of(step), "): device ", ms, " ms");
    }
    return out;
  }

  static int64_t max_q_len_of(const StepInfo& step) {
    int64_t m = 0;
    for (const StepSequence& ss : step.seqs) m = std::max<int64_t>(m, ss.q_len);
    return m;
  }

  ~CudaCompiledGraph() override {
    (void)cudaSetDevice(cx_->device);
    // Device time of the step's kernels (graph or eager launches, uploads and the final
    // copy back excluded) vs host time in run(): the gap is the backend's host work and
    // the copies.
    for (auto& [kind, v] : step_ms_) {
      auto med = [](std::vector<float> x) {
        std::nth_element(x.begin(), x.begin() + x.size() / 2, x.end());
        return x[x.size() / 2];
      };
      log_info("cuda: ", kind.first == 0 ? "decode" : kind.first == 1 ? "cache-less" : "prefill", " steps of ",
               kind.second, " tokens: median device ", med(v.first), " ms (max ",
               *std::max_element(v.first.begin(), v.first.end()), "), host run() ", med(v.second), " ms over ",
               v.first.size(), " steps; graphs captured ", graphs_.captures(), ", replayed ", graphs_.replays());
    }
    if (step_times_) {
      cudaEventDestroy(step_ev_[0]);
      cudaEventDestroy(step_ev_[1]);
    }
    log_profile();
    for (cudaEvent_t e : prof_ev_) cudaEventDestroy(e);
  }

  bool captures_steps() const override { return graphs_enabled_ && !profile_ && prep_.act != DType::kF32; }
  // Every uploaded weight: the runners hold device pointers and shapes, and nothing reads
  // a host weight after compiling (GEMM tactics at new batch sizes time the uploads).
  std::vector<ir::ValueId> release_host_weights() override {
    std::vector<ir::ValueId> vs = weights_.uploaded();
    if (own_graph_)
      for (ir::ValueId v : vs) {
        Tensor& w = own_graph_->weight(v);
        w = Tensor::view(nullptr, w.dtype(), w.shape());
      }
    return vs;
  }
  size_t weight_bytes() const override { return weights_.bytes(); }
  size_t weight_bytes_of(ir::ValueId v) const override { return weights_.bytes_of(v); }
  size_t activation_bytes() const override {
    size_t b = 0;
    for (auto& s : slots_) b += s.size();
    return b;
  }

 private:
  // Enqueues nodes [0, limit) of the step (those needed).
  void run_nodes(const StepInfo& step, CudaKv* cuda_kv, const std::vector<const Tensor*>& host_vals,
                 size_t limit = std::numeric_limits<size_t>::max()) {
    cudaStream_t s = cx_->stream;
    const auto& nodes = graph_.nodes();
    if (profile_) {
      while (prof_ev_.size() < nodes.size() + 1) {
        prof_ev_.emplace_back();
        KILN_CUDA_CHECK(cudaEventCreate(&prof_ev_.back()));
      }
      launch_spin(10000, s);  // long enough to queue a whole step's launches
      KILN_CUDA_CHECK(cudaEventRecord(prof_ev_[0], s));
    }
    const bool stack = stack_ && stack_->takes(step, cuda_kv);
    for (size_t i = 0; i < std::min(nodes.size(), limit); ++i) {
      if (profile_ && i > 0) KILN_CUDA_CHECK(cudaEventRecord(prof_ev_[i], s));  // skipped nodes time 0
      if (stack && i >= stack_->first() && i < stack_->last()) continue;  // run with node last()
      if (!node_needed_[i]) continue;
      const ir::Node& n = nodes[i];
      OpContext ctx;
      ctx.step = &step;
      ctx.dev = &dev_step_;
      ctx.kv = cuda_kv;
      ctx.cx = cx_.get();
      for (ir::ValueId in : n.inputs) {
        ctx.inputs.push_back(in == ir::kNoValue ? nullptr : &vals_[size_t(in)]);
        ctx.host_inputs.push_back(in == ir::kNoValue ? nullptr : host_vals[size_t(in)]);
      }
      ctx.alloc = [&, i](size_t o, std::vector<int64_t> shape, std::optional<DType> dtype) -> DevTensor& {
        ir::ValueId out = nodes[i].outputs.at(o);
        DevTensor& t = vals_[size_t(out)];
        t.dtype = dtype.value_or(prep_.act);
        t.shape = std::move(shape);
        DeviceBuffer& slot = slots_[size_t(slot_of_[size_t(out)])];
        slot.grow(std::max<size_t>(size_t(t.numel()) * dtype_size(t.dtype), 1), s);
        t.data = slot.get();
        return t;
      };
      ctx.scratch = [&](size_t bytes) {
        op_scratch_.grow(std::max<size_t>(bytes, 1), s);
        return op_scratch_.get();
      };
      if (stack && i == stack_->last())
        stack_->run(ctx, vals_);
      else
        runners_[i](ctx);
    }
    if (profile_) KILN_CUDA_CHECK(cudaEventRecord(prof_ev_[nodes.size()], s));
  }

  // KILN_CUDA_PROFILE=graph (see the top of the file): graphs of a spin kernel and the
  // step's first c launches for every c, each timed as the median of 7 runs of 8 replays;
  // node c's cost is T(c) - T(c - 1).
  void profile_graph_prefixes(const StepInfo& step, CudaKv* cuda_kv,
                              const std::vector<const Tensor*>& host_vals, bool decode) {
    cudaStream_t s = cx_->stream;
    const auto& nodes = graph_.nodes();
    const bool stack = stack_ && stack_->takes(step, cuda_kv);
    std::vector<size_t> cuts{0};  // prefix lengths: none, then up to each launched node
    for (size_t i = 0; i < nodes.size(); ++i)
      if (node_needed_[i] && !(stack && i >= stack_->first() && i < stack_->last()))
        cuts.push_back(i + 1);
    std::vector<double> us(cuts.size(), 0.0);
    for (size_t c = 0; c < cuts.size(); ++c) {
      const cudaGraphExec_t exec = capture_graph(s, [&] {
        set_pdl_allowed(decode || pdl_in_step(gemms_pdl_, step.num_tokens()));
        struct Reset {
          ~Reset() { set_pdl_allowed(false); }
        } reset;
        launch_spin(0, s);  // every prefix starts with it: the empty prefix's graph is not empty
        run_nodes(step, cuda_kv, host_vals, cuts[c]);
      });
      struct Destroy {
        cudaGraphExec_t e;
        ~Destroy() { cudaGraphExecDestroy(e); }
      } destroy{exec};
      constexpr int kReplays = 8;
      us[c] = 1000.0 / kReplays * double(median_launch_ms(s, 7, [&] {
                for (int r = 0; r < kReplays; ++r) KILN_CUDA_CHECK(cudaGraphLaunch(exec, s));
              }));
    }
    std::map<std::string, std::pair<double, int64_t>> by_key;  // us, nodes
    std::string order;
    for (size_t c = 1; c < cuts.size(); ++c) {
      const double d = us[c] - us[c - 1];
      auto& e = by_key[prof_keys_[cuts[c] - 1]];
      e.first += d;
      ++e.second;
      order += str_cat("\n  ", c, " ", nodes[cuts[c] - 1].name, " (", prof_keys_[cuts[c] - 1],
                       "): ", d, " us");
    }
    const std::string table =
        profile_table(str_cat("cuda graph profile of a ", decode ? "decode" : "other", " step of ",
                              step.num_tokens(),
                              " tokens (us each node lengthens the step's graph by, summed per op "
                              "and shape; graph with every node ",
                              us.back(), " us, without ", us.front(), " us):"),
                      by_key, 1.0, 1);
    log_write(LogLevel::kInfo, table);  // asked for: printed at every KILN_LOG level
    log_debug("cuda graph profile, node by node:", order);
  }

  // Adds the last step's per-node times (its events have completed) to the profile.
  void collect_profile(bool decode) {
    const auto& nodes = graph_.nodes();
    auto& prof = profile_steps_[decode ? 0 : 1];
    ++prof.steps;
    for (size_t i = 0; i < nodes.size(); ++i) {
      float ms = 0;
      KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, prof_ev_[i], prof_ev_[i + 1]));
      auto& e = prof.by_key[prof_keys_[i]];
      e.first += double(ms);
      ++e.second;
    }
  }
  void log_profile() const {
    for (int k = 0; k < 2; ++k) {
      const auto& prof = profile_steps_[k];
      if (prof.steps == 0) continue;
      log_info(profile_table(
          str_cat("cuda profile of ", prof.steps, k == 0 ? " decode" : " other",
                  " steps (device us per step; nodes per step; the first step of each shape, a "
                  "warm-up, left out):"),
          prof.by_key, 1000.0 / double(prof.steps), prof.steps));
    }
  }

  // A profile's rows, largest first: "key: us (nodes, share)" and the total, from the time
  // and node count summed per key over `steps` steps (times x `to_us` are us per step).
  static std::string profile_table(std::string title,
                                   const std::map<std::string, std::pair<double, int64_t>>& by_key,
                                   double to_us, int64_t steps) {
    double total = 0;
    std::vector<std::pair<double, std::string>> rows;
    for (auto& [key, e] : by_key) {
      total += e.first;
      rows.push_back({e.first, key});
    }
    std::sort(rows.rbegin(), rows.rend());
    for (auto& [t, key] : rows)
      title += str_cat("\n  ", key, ": ", t * to_us, " us (", by_key.at(key).second / steps,
                       " nodes, ", 100.0 * t / total, "%)");
    return title + str_cat("\n  total: ", total * to_us, " us");
  }

  // Every device address a captured step bakes in: if one moved, the graph is stale.
  StepGraphs::Buffers graph_buffers(const CudaKv* kv) const {
    StepGraphs::Buffers b{dev_in_.get(), attn_ws_.get(), attn_counters_.get(), dev_out_.get(), op_scratch_.get(),
                          dequant_ws_.get()};
    for (const DeviceBuffer& sl : slots_) b.push_back(sl.get());
    if (kv)
      for (const void* p : kv->buffers()) b.push_back(p);
    return b;
  }

  // Each node's row in the layer profile: the op, what is fused into it, a Linear's shape.
  void plan_profile_keys() {
    int fp8_fused = 0, int8_fused = 0;
    for (const ir::Node& n : graph_.nodes()) {
      std::string key = n.op;
      const std::string int8 = int8_profile_tag(n, graph_, prep_.act);
      const std::string fp8 = fp8_profile_tag(n, graph_, prep_.act), tags = fp8 + int8;
      fp8_fused += fp8.find("quantize}") != std::string::npos;
      int8_fused += int8.find("quantize}") != std::string::npos;
      if (n.op == "Linear") {
        const Tensor& w = graph_.weight(n.inputs[1]);
        if (n.has_attr("norm")) key += "{" + n.attr_str("norm") + "norm}";  // pass fuse_norm_linear
        if (n.input(3) != ir::kNoValue) key += "{+residual}";
        key += tags + str_cat(" ", w.dim(0), "x", w.dim(1));
      } else {
        key += tags;
      }
      prof_keys_.push_back(std::move(key));
    }
    if (fp8_fused) log_info("cuda: ", fp8_fused, " nodes write the E4M3 codes of the FP8 Linears they feed "
                            "(the quantize fused in; KILN_CUDA_FP8_FUSE=0 keeps it separate)");
    if (int8_fused) log_info("cuda: ", int8_fused, " nodes write the int8 codes of the W8A8 Linears they feed "
                             "(the quantize fused in; KILN_CUDA_INT8_FUSE=0 keeps it separate)");
  }

  // Token ids and logit rows that reach kernels unchecked on graph replay.
  void plan_input_checks() {
    std::set<ir::ValueId> is_input(graph_.inputs().begin(), graph_.inputs().end());
    for (const ir::Node& n : graph_.nodes()) {
      if (n.op == "Embedding" && is_input.count(n.inputs[1]))
        vocab_checks_.push_back({n.inputs[1], graph_.weight(n.inputs[0]).dim(0)});
      if (n.op == "GatherRows" && is_input.count(n.inputs[1])) rows_checks_.push_back(n.inputs[1]);
    }
  }
  void check_graph_inputs(const StepInfo& step, const std::vector<const Tensor*>& host_vals) const {
    for (auto [id, vocab] : vocab_checks_) {
      const Tensor& t = *host_vals[size_t(id)];
      for (int64_t i = 0; i < t.numel(); ++i) {
        const int32_t v = t.data_as<int32_t>()[i];
        KILN_THROW_IF(v < 0 || v >= vocab, kOutOfRange, "embedding: token id ", v, " at position ", i,
                      " is outside the vocabulary of size ", vocab);
      }
    }
    for (ir::ValueId id : rows_checks_) {
      const Tensor& t = *host_vals[size_t(id)];
      for (int64_t i = 0; i < t.numel(); ++i) {
        const int32_t row = t.data_as<int32_t>()[i];
        KILN_THROW_IF(row < 0 || row >= step.num_tokens(), kOutOfRange, "GatherRows: row ", row, " outside [0, ",
                      step.num_tokens(), ")");
      }
    }
  }

  // Validates the inputs and the step, then uploads integer inputs, float inputs (as f32,
  // converted on the device), the sequence layout, block tables, slot mapping and the
  // attention plans in one copy.
  // Returns whether this is a decode step. `graphable` says whether the step may run as
  // a CUDA graph (a decode step, or a step without KV cache such as an encoder's forward,
  // with integer inputs only); then the upload's layout (every offset but the block
  // tables' length) and every host value a launch bakes in depend only on graph_key_,
  // which it sets.
  bool stage_step(const TensorMap& inputs, const StepInfo& step, CudaKv* kv, std::vector<const Tensor*>& host_vals,
                  bool& graphable) {
    StagingWriter w(staging_);
    bool decode = kv && !step.seqs.empty() && split_chunk_ == 0 &&
                  step.num_tokens() == int64_t(step.seqs.size());
    for (const StepSequence& ss : step.seqs) decode = decode && ss.q_len == 1;
    graph_key_.clear();
    bool all_int = true;
    struct Pending {
      ir::ValueId id;
      size_t off;
      const Tensor* t;
    };
    std::vector<Pending> pend;
    for (ir::ValueId id : graph_.inputs()) {
      const ir::Value& v = graph_.value(id);
      auto it = inputs.find(v.name);
      if (it == inputs.end()) throw_error(ErrorCode::kInvalidArgument, "missing graph input '", v.name, "'");
      const Tensor& t = it->second;
      if (t.dtype() != v.dtype || size_t(t.rank()) != v.shape.rank())
        throw_error(ErrorCode::kInvalidArgument, "input '", v.name, "' must be ", dtype_name(v.dtype), v.shape.str(),
                    ", got ", dtype_name(t.dtype()), t.shape_str());
      for (size_t d = 0; d < v.shape.rank(); ++d)
        if (v.shape[d].is_concrete() && v.shape[d].value != t.dim(int(d)))
          throw_error(ErrorCode::kInvalidArgument, "input '", v.name, "' dim ", d, " must be ", v.shape[d].value,
                      ", got ", t.shape_str());
      if (!dtype_is_float(t.dtype()) && t.dtype() != DType::kI32)
        throw_error(ErrorCode::kUnsupported, "cuda: input '", v.name, "' of dtype ", dtype_name(t.dtype()));
      decode = decode && t.dtype() == DType::kI32;
      all_int = all_int && t.dtype() == DType::kI32;
      graph_key_.insert(graph_key_.end(), t.shape().begin(), t.shape().end());
      host_vals[size_t(id)] = &t;
      pend.push_back({id, w.put(t.data(), t.nbytes()), &t});
    }
    // The sequence layout: with a KV pool, block tables are the step's; without one
    // (encoders), each sequence's own rows [q_start, q_start + q_len).
    const int64_t tokens = step.num_tokens();
    std::vector<AttnSeq> seqs;
    std::vector<int32_t> tables;
    for (const StepSequence& ss : step.seqs) {
      // Graphs without attention may leave slot_mapping empty; SeqMeanPool checks its rows itself.
      KILN_THROW_IF(ss.q_len < 0 || ss.q_start < 0 || ss.q_len > ss.ctx_len ||
                        (tokens > 0 && ss.q_start + ss.q_len > tokens),
                    kInvalidArgument, "step: sequence rows [", ss.q_start, ", +", ss.q_len, ") with context ",
                    ss.ctx_len, " do not fit the step's ", tokens, " tokens");
      seqs.push_back({ss.q_start, ss.q_len, ss.ctx_len, int32_t(tables.size())});
      if (kv) {
        const int64_t bs = kv->layout().block_size;
        KILN_THROW_IF(int64_t(ss.block_table.size()) * bs < ss.ctx_len, kInvalidArgument, "step: a block table of ",
                      ss.block_table.size(), " blocks cannot hold ", ss.ctx_len, " tokens");
        for (int32_t b : ss.block_table)
          KILN_THROW_IF(b < 0 || b >= kv->layout().num_blocks, kOutOfRange, "step: block ", b, " outside the pool's ",
                        kv->layout().num_blocks, " blocks");
        tables.insert(tables.end(), ss.block_table.begin(), ss.block_table.end());
      } else {
        KILN_THROW_IF(!attn_keys_.empty() && ss.ctx_len != ss.q_len, kInvalidArgument,
                      "attention has no KV cache, so a sequence's context must be its new tokens");
        for (int32_t i = 0; i < ss.q_len; ++i) tables.push_back(ss.q_start + i);
      }
    }
    if (kv) {
      const int64_t slots = kv->layout().num_blocks * kv->layout().block_size;
      for (int64_t sl : step.slot_mapping)
        KILN_THROW_IF(sl < -1 || sl >= slots, kOutOfRange, "step: KV slot ", sl, " outside [-1, ", slots, ")");
    }
    // Attention launches bake in the longest query run (1 when decoding).
    graph_key_.push_back(max_q_len_of(step));
    graph_key_.push_back(step.top_k);  // TopKLogits' output width
    graphable = all_int && (decode || !kv);
    const size_t seqs_off = w.put_vec(seqs);
    const size_t slots_off = w.put_vec(step.slot_mapping);
    struct PlanOff {
      size_t work, combine;
      AttentionPlan plan;
      bool windowed = false;
    };
    std::map<AttnPlanKey, PlanOff> plan_offs;
    size_t ws_floats = 0, counters = 0;
    // Decode steps take the cluster decode kernel where every attention node suits it
    // (decided when the graph was compiled: attn_cluster_ok_).
    const bool cluster = decode && attn_cluster_ok_;
    int64_t max_ctx = 0;
    for (const AttnSeq& sq : seqs) max_ctx = std::max<int64_t>(max_ctx, sq.ctx_len);
    for (const auto& [key, windows] : attn_keys_) {
      PlanOff po;
      // A window no shorter than every context hides no key: such steps plan (and run)
      // as if the nodes had none, on every kernel. Part of the graph key: a captured
      // decode step replays only while the context stays on the same side of the window.
      po.windowed = windows.hides_keys(max_ctx);
      graph_key_.push_back(po.windowed);
      po.plan = cluster ? attention_plan_decode_cluster(seqs, key.hq, key.hkv, attn_max_d_, cx_->num_sms,
                                                        decode_splits_, po.windowed ? 0 : decode_warp_)
                : decode ? attention_plan_decode(seqs, key.hq, key.hkv, cx_->num_sms)
                         : attention_plan(seqs, key.hq, key.hkv, true, cx_->num_sms, split_chunk_,
                                          attn_flash_ok_ && (!po.windowed || attention_flash_supports_window(
                                                                                   attn_max_d_))
                                              ? flash_mode_
                                              : 0,
                                          flash_width_);
      po.work = w.put_vec(po.plan.work);
      po.combine = w.put_vec(po.plan.combine);
      ws_floats = std::max(ws_floats, attention_workspace_floats(po.plan, key.hkv, attn_max_d_));
      counters = std::max(counters, attention_counters(po.plan, key.hkv));
      graph_key_.insert(graph_key_.end(), {int64_t(po.plan.work.size()), int64_t(po.plan.combine.size()),
                                           int64_t(po.plan.num_partials), int64_t(po.plan.flash_width),
                                           int64_t(po.plan.flash_items_per_sm), int64_t(po.plan.decode_splits),
                                           int64_t(po.plan.decode_warp)});
      plan_offs[key] = std::move(po);
    }
    // Block tables go last: the only section whose length changes between decode steps.
    const size_t tables_off = w.put_vec(tables);
    graph_key_.insert(graph_key_.end(), {int64_t(seqs.size()), int64_t(tables_off)});
    // Room for every sequence's table to reach the whole pool, so the buffer (an address
    // a graph captured) never moves while decoding.
    const size_t reserve = decode ? tables_off + seqs.size() * size_t(kv->layout().num_blocks) * 4 : 0;

    cudaStream_t s = cx_->stream;
    // The previous step's copies are complete (run() synchronizes before returning).
    pinned_in_.grow(std::max<size_t>(staging_.size(), 1));
    std::memcpy(pinned_in_.get(), staging_.data(), staging_.size());
    dev_in_.grow(std::max<size_t>({staging_.size(), reserve, 1}), s);
    KILN_CUDA_CHECK(cudaMemcpyAsync(dev_in_.get(), pinned_in_.get(), staging_.size(), cudaMemcpyHostToDevice, s));
    auto* base = static_cast<uint8_t*>(dev_in_.get());
    for (const Pending& p : pend) {
      DevTensor& t = vals_[size_t(p.id)];
      t.shape = p.t->shape();
      if (p.t->dtype() == DType::kI32) {
        t.dtype = DType::kI32;
        t.data = base + p.off;
      } else {
        // Float inputs (op tests) become the activation dtype in their own buffer.
        t.dtype = prep_.act;
        DeviceBuffer& buf = input_bufs_[p.id];
        buf.grow(std::max<size_t>(size_t(t.numel()) * dtype_size(t.dtype), 1), s);
        t.data = buf.get();
        launch_convert(base + p.off, p.t->dtype(), t.data, t.dtype, t.numel(), s);
      }
    }
    dev_step_.seqs = reinterpret_cast<const AttnSeq*>(base + seqs_off);
    dev_step_.num_seqs = int32_t(seqs.size());
    dev_step_.block_tables = reinterpret_cast<const int32_t*>(base + tables_off);
    dev_step_.slot_mapping = reinterpret_cast<const int64_t*>(base + slots_off);
    dev_step_.plans.clear();
    dev_step_.flash_warp_rows = int32_t(flash_warp_rows_);
    for (auto& [key, po] : plan_offs)
      dev_step_.plans[key] = {reinterpret_cast<const AttnWork*>(base + po.work), int32_t(po.plan.work.size()),
                              reinterpret_cast<const AttnCombine*>(base + po.combine), int32_t(po.plan.combine.size()),
                              po.plan.num_partials, po.plan.flash_width, po.plan.flash_items_per_sm,
                              po.plan.decode_splits, po.plan.decode_warp, po.windowed};
    attn_ws_.grow(std::max<size_t>(ws_floats * sizeof(float), 1), s);
    dev_step_.attn_workspace = static_cast<float*>(attn_ws_.get());
    // Zeroed when (re)allocated; each fused decode launch leaves its counters at zero.
    if (counters * sizeof(int32_t) > attn_counters_.size()) {
      attn_counters_.grow(counters * sizeof(int32_t), s);
      KILN_CUDA_CHECK(cudaMemsetAsync(attn_counters_.get(), 0, attn_counters_.size(), s));
    }
    dev_step_.attn_counters = static_cast<int32_t*>(attn_counters_.get());
    return decode;
  }

  // The run's wanted outputs (a bit per graph output) and the nodes they need.
  void select_outputs(const std::vector<std::string>& wanted) {
    const auto& outs = graph_.outputs();
    KILN_CHECK(outs.size() <= 62, "cuda: more than 62 graph outputs");
    int64_t mask = 0;
    for (size_t i = 0; i < outs.size(); ++i)
      if (wanted.empty() || std::find(wanted.begin(), wanted.end(), outs[i].first) != wanted.end())
        mask |= int64_t(1) << i;
    for (const std::string& w : wanted)
      if (graph_.find_output(w) == ir::kNoValue) (void)nodes_needed_for(graph_, wanted);  // throws naming it
    if (mask == out_mask_ && !node_needed_.empty()) return;
    node_needed_ = nodes_needed_for(graph_, wanted);  // throws for an unknown name
    out_mask_ = mask;
  }
  bool out_wanted(size_t i) const { return (out_mask_ >> i) & 1; }

  // Converts every wanted graph output to f32 on the device, packed in dev_out_ (part
  // of a captured decode graph).
  void out_layout() {
    out_offs_.clear();
    out_total_ = 0;
    size_t i = 0;
    for (auto& [name, id] : graph_.outputs()) {
      out_offs_.push_back(out_total_);
      if (out_wanted(i++)) out_total_ += (size_t(vals_[size_t(id)].numel()) * 4 + 255) / 256 * 256;
    }
  }
  void convert_outputs() {
    cudaStream_t s = cx_->stream;
    out_layout();
    dev_out_.grow(std::max<size_t>(out_total_, 1), s);
    size_t i = 0;
    for (auto& [name, id] : graph_.outputs()) {
      if (!out_wanted(i)) {
        ++i;
        continue;
      }
      const DevTensor& t = vals_[size_t(id)];
      auto* dst = static_cast<uint8_t*>(dev_out_.get()) + out_offs_[i++];
      if (t.dtype == DType::kF32 || t.dtype == DType::kI32)
        KILN_CUDA_CHECK(cudaMemcpyAsync(dst, t.data, size_t(t.numel()) * 4, cudaMemcpyDeviceToDevice, s));
      else
        launch_convert(t.data, t.dtype, dst, DType::kF32, t.numel(), s);
    }
  }

  // Copies the converted outputs back in one go. vals_ keeps the shapes of the step's
  // outputs (set by the eager or captured run of this shape, or the previous one).
  TensorMap fetch_outputs() {
    cudaStream_t s = cx_->stream;
    // run() ends synchronized, so no copy into pinned_out_ is pending if it must move.
    pinned_out_.grow(std::max<size_t>(out_total_, 1));
    KILN_CUDA_CHECK(cudaMemcpyAsync(pinned_out_.get(), dev_out_.get(), out_total_, cudaMemcpyDeviceToHost, s));
    KILN_CUDA_CHECK(cudaStreamSynchronize(s));
    TensorMap out;
    size_t i = 0;
    for (auto& [name, id] : graph_.outputs()) {
      if (!out_wanted(i)) {
        ++i;
        continue;
      }
      const DevTensor& t = vals_[size_t(id)];
      out[name] = Tensor::view(static_cast<uint8_t*>(pinned_out_.get()) + out_offs_[i++],
                               t.dtype == DType::kI32 ? DType::kI32 : DType::kF32, t.shape);
    }
    return out;
  }

  // Times cuBLASLt's candidate algorithms for each Linear shape at a decode (m=1) and a
  // prefill (m=128) token count and keeps the fastest (KILN_CUDA_TUNE=0 skips this).
  // Quantized Linears keep the heuristic's choice for their tiles: they have no 16-bit
  // weight to time on.
  void tune_gemms() {
    if (!Gemm::tuning_enabled()) return;
    std::set<std::tuple<int64_t, int64_t, bool>> done;
    for (const ir::Node& n : graph_.nodes()) {
      // q8/q4 Linears hold no 16-bit copy; FP8 and W8A8 Linears tune their own GEMMs.
      if (n.op != "Linear" || n.has_attr("quant") || cuda_linear_quant_format(n, graph_, prep_.weight_dtype)) continue;
      const Tensor& w = graph_.weight(n.inputs[1]);
      const bool has_bias = n.input(2) != ir::kNoValue;
      if (!done.insert({w.dim(0), w.dim(1), has_bias}).second) continue;
      const void* wd = weights_.get(graph_, n.inputs[1], prep_.act);
      const void* bd = weights_.get(graph_, n.input(2), prep_.act);
      for (int64_t m : {int64_t(1), int64_t(128)}) {
        const size_t es = dtype_size(prep_.act);
        DeviceBuffer x(size_t(m * w.dim(1)) * es), y(size_t(m * w.dim(0)) * es);
        launch_fill_random(x.get(), prep_.act, m * w.dim(1), 7, cx_->stream);
        Gemm::log_tactics("gemm", m, w.dim(0), w.dim(1),
                          cx_->gemm->tune(prep_.act, x.get(), wd, bd, y.get(), m, w.dim(0), w.dim(1), cx_->stream));
      }
    }
  }

  void plan_memory() {
    MemoryPlan plan = plan_activation_slots(graph_);
    slot_of_ = std::move(plan.slot_of);
    slots_.resize(size_t(plan.num_slots));
    log_debug("cuda: ", graph_.nodes().size(), " nodes share ", plan.num_slots, " activation buffers");
  }

  std::optional<ir::Graph> own_graph_;  // g rewritten (with_dual_outputs), or none
  const ir::Graph& graph_;             // own_graph_ or g
  std::shared_ptr<CudaContext> cx_;
  DeviceWeights weights_;
  PrepareContext prep_;
  std::vector<OpRun> runners_;
  std::unique_ptr<CudaDecodeStack> stack_;  // null: the graph is no plain Llama-family stack (or switched off)
  // The sliding windows and soft caps of a key's nodes (none for window_or_cap false).
  struct AttnWindows {
    int64_t min_window = std::numeric_limits<int64_t>::max();  // the shortest window (max: none)
    bool softcap = false;                                       // some node caps its scores
    // Whether a step whose longest context is max_ctx needs the window and cap kernels.
    bool hides_keys(int64_t max_ctx) const { return softcap || min_window < max_ctx; }
  };
  std::map<AttnPlanKey, AttnWindows> attn_keys_;  // every Attention node's key
  int64_t attn_max_d_ = 0;
  bool attn_flash_ok_ = true;  // every Attention node's head dim and dtype suit the tensor-core kernel
  // ... and the cluster decode kernel (attention_decode_cluster_supported, KILN_CUDA_DECODE_ATTN not "old").
  bool attn_cluster_ok_ = true;
  // KILN_CUDA_FLASH: 0 never plans tensor-core prefill attention, 1 always (tests), unset: when it fills the GPU.
  int flash_mode_ = [] {
    const char* e = std::getenv("KILN_CUDA_FLASH");
    return e && *e ? (std::atoi(e) > 0 ? 1 : 0) : -1;
  }();
  // KILN_CUDA_FLASH_WIDTH: the tensor-core CTAs' items (128, 64, 32; tests), unset: picked per step.
  int flash_width_ = attention_flash_width_from_env();
  // KILN_CUDA_FLASH_WARP_ROWS: items per tensor-core warp (16, 32; tests), unset: picked.
  int flash_warp_rows_ = attention_flash_warp_rows_from_env();
  // Read here, once per compiled graph, like the other switches: KILN_CUDA_DECODE_ATTN
  // (false: "old", the grouped-query decode kernels), KILN_CUDA_DECODE_SPLITS (0: planned)
  // and KILN_CUDA_DECODE_WARP (-1: planned).
  bool decode_cluster_ = attention_decode_cluster_from_env();
  int decode_splits_ = attention_decode_splits_from_env();
  int decode_warp_ = attention_decode_warp_from_env();
  int64_t split_chunk_ = [] {
    const char* e = std::getenv("KILN_CUDA_SPLIT_CHUNK");  // tests force split-KV with it
    return e ? std::atoll(e) : 0LL;
  }();
  std::set<std::vector<int64_t>> profiled_shapes_;
  std::vector<int> slot_of_;
  std::vector<DeviceBuffer> slots_;
  std::vector<DevTensor> vals_;
  std::map<ir::ValueId, DeviceBuffer> input_bufs_;
  std::vector<uint8_t> staging_;
  PinnedBuffer pinned_in_, pinned_out_;
  DeviceBuffer dev_in_, dev_out_, attn_ws_, attn_counters_, op_scratch_;
  DeviceBuffer dequant_ws_;  // grown only while preparing (PrepareContext::dequant_ws)
  DevStep dev_step_;
  std::vector<size_t> out_offs_;
  size_t out_total_ = 0;
  int64_t out_mask_ = 0;            // the wanted outputs of this run, a bit each
  std::vector<bool> node_needed_;  // the nodes they need
  std::vector<std::pair<ir::ValueId, int64_t>> vocab_checks_;
  std::vector<ir::ValueId> rows_checks_;
  StepGraphs::Key graph_key_;
  std::map<StepGraphs::Key, std::vector<std::vector<int64_t>>> out_shapes_;
  StepGraphs graphs_;
  bool step_times_ = [] {
    const char* e = std::getenv("KILN_CUDA_STEP_TIMES");
    return e && std::string(e) == "1";
  }();
  cudaEvent_t step_ev_[2] = {nullptr, nullptr};
  bool gemms_pdl_ = false;  // every GEMM takes part in dependent launch (convert.h: pdl_in_step)
  // By (0 decode, 1 cache-less, 2 other steps with a KV cache; tokens): device and host times.
  std::map<std::pair<int, int64_t>, std::pair<std::vector<float>, std::vector<float>>> step_ms_;
  bool profile_ = [] {
    const char* e = std::getenv("KILN_CUDA_PROFILE");
    return e && std::string(e) == "1";
  }();
  bool graph_profile_ = [] {
    const char* e = std::getenv("KILN_CUDA_PROFILE");
    return e && std::string(e) == "graph";
  }();
  int graph_profiled_ = 0;  // kinds profiled in graphs: 1 decode, 2 other
  std::vector<cudaEvent_t> prof_ev_;
  std::vector<std::string> prof_keys_;  // per node (plan_profile_keys)
  struct Profile {
    int64_t steps = 0;
    std::map<std::string, std::pair<double, int64_t>> by_key;  // ms, nodes
  };
  Profile profile_steps_[2];  // decode steps, other steps
  bool graphs_enabled_ = [] {
    const char* e = std::getenv("KILN_CUDA_GRAPHS");
    return !(e && std::string(e) == "0");
  }();
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {}
  std::string name() const override { return "cuda"; }
  bool supports(const ir::Node& node, const ir::Graph& graph) const override {
    return cuda_op_supported(node, graph);
  }
  // Every fused form has kernels here: residual add + norm, SwiGLU, packed-QKV attention
  // (RoPE and the KV write in one kernel), Linear activation epilogues (in the GEMV),
  // norm prologues and residual epilogues of Linears (in the GEMV).
  bool supports_fusion(const std::string& pass) const override {
    return pass == "fuse_add_norm" || pass == "fuse_swiglu" || pass == "fuse_qkv_attention" ||
           pass == "fuse_linear_activation" || pass == "fuse_norm_linear";
  }
  // fuse_norm_linear only with KILN_CUDA_PRENORM=1 (graphs built from then on): on the
  // H200 the GEMVs that normalize their own rows lost more than the norm kernels they
  // replace (TinyLlama decode 1.10 -> 1.17 ms/token, GPT-2 0.40 either way; bench/RESULTS.md).
  bool wants_fusion(const std::string& pass) const override {
    if (pass == "fuse_norm_linear") {
      const char* e = std::getenv("KILN_CUDA_PRENORM");
      return e && std::string(e) == "1";
    }
    return supports_fusion(pass);
  }
  // Sliding windows and soft caps: the tile, cluster decode and (head dim 256) tensor-core
  // kernels, planned per step (AttnPlanKey, AttnWindows).
  bool supports_sliding_window() const override { return true; }
  bool supports_w8a8_weight_amax() const override { return true; }
  std::unique_ptr<CompiledGraph> compile(const ir::Graph& graph, const CompileOptions& opt) override {
    auto g = std::make_unique<CudaCompiledGraph>(graph, opt, context());
    act_ = g->act();
    return g;
  }
  std::unique_ptr<KvStorage> allocate_kv(const KvLayout& layout) override {
    // The quantized caches' kernels read a head's codes in 16-byte vectors.
    if (kv_dtype_quantized(layout.dtype) && layout.head_dim % 16 != 0)
      throw_error(ErrorCode::kUnsupported, "--kv-cache-dtype ", kv_dtype_name(layout.dtype),
                  " on the cuda backend needs a head_dim that is a multiple of 16, got ", layout.head_dim,
                  " (use --kv-cache-dtype auto)");
    return std::make_unique<CudaKv>(layout, act_, context());
  }
  size_t kv_block_bytes(const KvLayout& layout) const override { return CudaKv::block_bytes_of(layout, act_); }
  std::vector<std::shared_ptr<Communicator>> make_communicators(int world_size, int first_device) override {
    return make_nccl_communicators(world_size, first_device);
  }
  Ceilings measure_ceilings() override {
    auto cx = context();
    cx->make_current();
    Ceilings c;
    constexpr size_t kCopyBytes = size_t(1) << 30;
    constexpr int64_t kN = 8192;
    size_t free_bytes = 0, total = 0;
    KILN_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    // Room for the copy's two buffers (the GEMM's three need less) and a margin.
    if (free_bytes < 2 * kCopyBytes + (size_t(256) << 20)) return c;
    cudaStream_t s = cx->stream;
    c.copy_gbs = device_copy_gbs(s);
    {
      const size_t bytes = size_t(kN * kN) * 2;
      DeviceBuffer x(bytes), w(bytes), y(bytes);
      launch_fill_random(x.get(), DType::kBF16, kN * kN, 1, s);  // never time on zeros
      launch_fill_random(w.get(), DType::kBF16, kN * kN, 2, s);
      const float ms = median_launch_ms(s, 10, [&] {
        cx->gemm->run(DType::kBF16, x.get(), w.get(), nullptr, y.get(), kN, kN, kN, s);
      });
      c.gemm_tflops = 2.0 * double(kN) * double(kN) * double(kN) / (double(ms) * 1e-3) / 1e12;
    }
    return c;
  }
  DeviceMemory memory_info() override {
    const int device = context()->device;
    KILN_CUDA_CHECK(cudaSetDevice(device));
    DeviceMemory m;
    KILN_CUDA_CHECK(cudaMemGetInfo(&m.free_bytes, &m.total_bytes));
    m.device = str_cat("cuda:", device);
    return m;
  }

 private:
  std::shared_ptr<CudaContext> context() {
    if (!cx_) {
      const int count = cuda_device_count();
      if (count == 0)
        throw_error(ErrorCode::kUnsupported, "cuda backend: no CUDA device is visible (cudaGetDeviceCount)");
      if (device_ >= count)
        throw_error(ErrorCode::kUnsupported, "cuda backend: device ", device_, " asked for, but ", count,
                    count == 1 ? " device is" : " devices are", " visible");
      cx_ = std::make_shared<CudaContext>(device_);
    }
    return cx_;
  }
  int device_ = 0;
  std::shared_ptr<CudaContext> cx_;
  DType act_ = DType::kBF16;  // KV dtype until a graph is compiled
};

}  // namespace
}  // namespace cuda

std::unique_ptr<Backend> create_cuda_backend(int device) { return std::make_unique<cuda::CudaBackend>(device); }

}  // namespace kiln
