// CUDA backend: compiles a graph into prepared op runners over device buffers. Activation
// memory follows the CPU backend's plan (values whose lifetimes do not overlap share a
// buffer; buffers grow to the largest shape seen, so steady-state steps allocate
// nothing). A step makes one host->device copy (integer inputs, the step layout, the
// attention plans), launches every node on one stream, and copies the outputs back.
#include "backends/cuda/cuda_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <set>

#include "backends/cuda/cuda_ops.h"
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

DType act_dtype_from_option(const std::string& s) {
  if (s == "bf16") return DType::kBF16;
  if (s == "f16") return DType::kF16;
  if (s == "f32") return DType::kF32;
  throw_error(ErrorCode::kInvalidArgument, "cuda: unknown weight dtype '", s, "' (expected bf16, f16 or f32)");
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

class CudaCompiledGraph final : public CompiledGraph {
 public:
  CudaCompiledGraph(const ir::Graph& g, const CompileOptions& opt, std::shared_ptr<CudaContext> cx)
      : graph_(g), cx_(std::move(cx)) {
    ir::verify(g);
    prep_.act = act_dtype_from_option(opt.weight_dtype);
    prep_.weights = &weights_;
    prep_.cx = cx_.get();
    for (const ir::Node& n : g.nodes()) {
      std::string why;
      if (!cuda_op_supported(n, g, &why))
        throw_error(ErrorCode::kUnsupported, "cuda backend cannot run node '", n.name, "' (", n.op, "): ", why);
      runners_.push_back((*find_cuda_op(n.op))(n, g, prep_));
      if (n.op == "Attention") {
        attn_keys_.insert({n.attr_int("num_heads"), n.attr_int("num_kv_heads")});
        attn_max_d_ = std::max(attn_max_d_, n.attr_int("head_dim"));
      }
    }
    plan_memory();
    vals_.resize(g.num_values());
    for (size_t v = 0; v < g.num_values(); ++v)
      if (g.is_weight(ir::ValueId(v))) {
        const Tensor& w = g.weight(ir::ValueId(v));
        vals_[v] = DevTensor{nullptr, w.dtype(), w.shape()};  // shape only; ops hold their own uploads
      }
    tune_gemms();
    KILN_CUDA_CHECK(cudaStreamSynchronize(cx_->stream));
    log_info("cuda: compiled ", g.nodes().size(), " nodes, ", weights_.bytes() >> 20, " MiB of ",
             dtype_name(prep_.act), " weights on device ", cx_->device);
  }

  DType act() const { return prep_.act; }

  TensorMap run(const TensorMap& inputs, const StepInfo& step, KvStorage* kv) override {
    auto* cuda_kv = dynamic_cast<CudaKv*>(kv);
    if (kv && !cuda_kv) throw_error(ErrorCode::kInvalidArgument, "KV storage is not a CUDA pool");
    if (cuda_kv && cuda_kv->dtype() != prep_.act)
      throw_error(ErrorCode::kInvalidArgument, "KV pool holds ", dtype_name(cuda_kv->dtype()),
                  " but the graph was compiled for ", dtype_name(prep_.act));
    cudaStream_t s = cx_->stream;
    std::vector<const Tensor*> host_vals(graph_.num_values(), nullptr);
    stage_step(inputs, step, cuda_kv, host_vals);

    const auto& nodes = graph_.nodes();
    for (size_t i = 0; i < nodes.size(); ++i) {
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
      ctx.alloc = [&, i](size_t o, std::vector<int64_t> shape) -> DevTensor& {
        ir::ValueId out = nodes[i].outputs.at(o);
        DevTensor& t = vals_[size_t(out)];
        t.dtype = prep_.act;
        t.shape = std::move(shape);
        DeviceBuffer& slot = slots_[size_t(slot_of_[size_t(out)])];
        slot.grow(std::max<size_t>(size_t(t.numel()) * dtype_size(t.dtype), 1), s);
        t.data = slot.get();
        return t;
      };
      runners_[i](ctx);
    }
    return fetch_outputs();
  }

  size_t weight_bytes() const override { return weights_.bytes(); }
  size_t activation_bytes() const override {
    size_t b = 0;
    for (auto& s : slots_) b += s.size();
    return b;
  }

 private:
  // Validates the inputs and the step, then uploads integer inputs, float inputs (as f32,
  // converted on the device), the sequence layout, block tables, slot mapping and the
  // attention plans in one copy.
  void stage_step(const TensorMap& inputs, const StepInfo& step, CudaKv* kv, std::vector<const Tensor*>& host_vals) {
    StagingWriter w(staging_);
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
    const size_t seqs_off = w.put_vec(seqs);
    const size_t tables_off = w.put_vec(tables);
    const size_t slots_off = w.put_vec(step.slot_mapping);
    struct PlanOff {
      size_t work, combine;
      AttentionPlan plan;
    };
    std::map<std::pair<int64_t, int64_t>, PlanOff> plan_offs;
    size_t ws_floats = 0;
    for (auto key : attn_keys_) {
      PlanOff po;
      po.plan = attention_plan(seqs, key.first, key.second, true, cx_->num_sms, split_chunk_);
      po.work = w.put_vec(po.plan.work);
      po.combine = w.put_vec(po.plan.combine);
      ws_floats = std::max(ws_floats, attention_workspace_floats(po.plan, key.second, attn_max_d_));
      plan_offs[key] = std::move(po);
    }

    cudaStream_t s = cx_->stream;
    // The previous step's copies are complete (run() synchronizes before returning).
    pinned_in_.grow(std::max<size_t>(staging_.size(), 1));
    std::memcpy(pinned_in_.get(), staging_.data(), staging_.size());
    dev_in_.grow(std::max<size_t>(staging_.size(), 1), s);
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
    for (auto& [key, po] : plan_offs)
      dev_step_.plans[key] = {reinterpret_cast<const AttnWork*>(base + po.work), int32_t(po.plan.work.size()),
                              reinterpret_cast<const AttnCombine*>(base + po.combine), int32_t(po.plan.combine.size()),
                              po.plan.num_partials};
    attn_ws_.grow(std::max<size_t>(ws_floats * sizeof(float), 1), s);
    dev_step_.attn_workspace = static_cast<float*>(attn_ws_.get());
  }

  // Converts every graph output to f32 on the device and copies them back in one go.
  TensorMap fetch_outputs() {
    cudaStream_t s = cx_->stream;
    size_t total = 0;
    std::vector<size_t> offs;
    for (auto& [name, id] : graph_.outputs()) {
      offs.push_back(total);
      total += (size_t(vals_[size_t(id)].numel()) * 4 + 255) / 256 * 256;
    }
    dev_out_.grow(std::max<size_t>(total, 1), s);
    KILN_CUDA_CHECK(cudaStreamSynchronize(s));  // pending copies from pinned_out_ end before it may move
    pinned_out_.grow(std::max<size_t>(total, 1));
    size_t i = 0;
    for (auto& [name, id] : graph_.outputs()) {
      const DevTensor& t = vals_[size_t(id)];
      auto* dst = static_cast<uint8_t*>(dev_out_.get()) + offs[i++];
      if (t.dtype == DType::kF32 || t.dtype == DType::kI32)
        KILN_CUDA_CHECK(cudaMemcpyAsync(dst, t.data, size_t(t.numel()) * 4, cudaMemcpyDeviceToDevice, s));
      else
        launch_convert(t.data, t.dtype, dst, DType::kF32, t.numel(), s);
    }
    KILN_CUDA_CHECK(cudaMemcpyAsync(pinned_out_.get(), dev_out_.get(), total, cudaMemcpyDeviceToHost, s));
    KILN_CUDA_CHECK(cudaStreamSynchronize(s));
    TensorMap out;
    i = 0;
    for (auto& [name, id] : graph_.outputs()) {
      const DevTensor& t = vals_[size_t(id)];
      out[name] = Tensor::view(static_cast<uint8_t*>(pinned_out_.get()) + offs[i++],
                               t.dtype == DType::kI32 ? DType::kI32 : DType::kF32, t.shape);
    }
    return out;
  }

  // Times cuBLASLt's candidate algorithms for each Linear shape at a decode (m=1) and a
  // prefill (m=128) token count and keeps the fastest (KILN_CUDA_TUNE=0 skips this).
  void tune_gemms() {
    if (const char* e = std::getenv("KILN_CUDA_TUNE"); e && std::string(e) == "0") return;
    std::set<std::tuple<int64_t, int64_t, bool>> done;
    for (const ir::Node& n : graph_.nodes()) {
      if (n.op != "Linear") continue;
      const Tensor& w = graph_.weight(n.inputs[1]);
      const bool has_bias = n.input(2) != ir::kNoValue;
      if (!done.insert({w.dim(0), w.dim(1), has_bias}).second) continue;
      const void* wd = weights_.get(graph_, n.inputs[1], prep_.act);
      const void* bd = weights_.get(graph_, n.input(2), prep_.act);
      for (int64_t m : {int64_t(1), int64_t(128)}) {
        const size_t es = dtype_size(prep_.act);
        DeviceBuffer x(size_t(m * w.dim(1)) * es), y(size_t(m * w.dim(0)) * es);
        launch_fill_random(x.get(), prep_.act, m * w.dim(1), 7, cx_->stream);
        auto times = cx_->gemm->tune(prep_.act, x.get(), wd, bd, y.get(), m, w.dim(0), w.dim(1), cx_->stream);
        std::string line;
        for (auto& t : times) line += str_cat(" #", t.tactic, "=", t.ms * 1000.0f, "us");
        log_debug("cuda: gemm m=", m, " n=", w.dim(0), " k=", w.dim(1), " tactics:", line);
      }
    }
  }

  void plan_memory() {
    const auto& nodes = graph_.nodes();
    std::vector<size_t> last_use(graph_.num_values(), 0);
    for (size_t i = 0; i < nodes.size(); ++i)
      for (ir::ValueId in : nodes[i].inputs)
        if (in != ir::kNoValue) last_use[size_t(in)] = i;
    for (auto& [name, id] : graph_.outputs()) last_use[size_t(id)] = std::numeric_limits<size_t>::max();
    slot_of_.assign(graph_.num_values(), -1);
    std::vector<int> free_slots;
    size_t num_slots = 0;
    for (size_t i = 0; i < nodes.size(); ++i) {
      for (ir::ValueId out : nodes[i].outputs) {
        if (free_slots.empty()) free_slots.push_back(int(num_slots++));
        slot_of_[size_t(out)] = free_slots.back();
        free_slots.pop_back();
        if (last_use[size_t(out)] == 0) last_use[size_t(out)] = i;  // unused output
      }
      // Release after outputs are assigned so no output aliases an input.
      std::vector<ir::ValueId> dying;
      for (ir::ValueId in : nodes[i].inputs)
        if (in != ir::kNoValue && slot_of_[size_t(in)] >= 0 && last_use[size_t(in)] == i) dying.push_back(in);
      for (ir::ValueId out : nodes[i].outputs)
        if (last_use[size_t(out)] == i) dying.push_back(out);
      std::sort(dying.begin(), dying.end());
      dying.erase(std::unique(dying.begin(), dying.end()), dying.end());
      for (ir::ValueId v : dying) free_slots.push_back(slot_of_[size_t(v)]);
    }
    slots_.resize(num_slots);
    log_debug("cuda: ", nodes.size(), " nodes share ", num_slots, " activation buffers");
  }

  const ir::Graph& graph_;
  std::shared_ptr<CudaContext> cx_;
  DeviceWeights weights_;
  PrepareContext prep_;
  std::vector<OpRun> runners_;
  std::set<std::pair<int64_t, int64_t>> attn_keys_;
  int64_t attn_max_d_ = 0;
  int64_t split_chunk_ = [] {
    const char* e = std::getenv("KILN_CUDA_SPLIT_CHUNK");  // tests force split-KV with it
    return e ? std::atoll(e) : 0LL;
  }();
  std::vector<int> slot_of_;
  std::vector<DeviceBuffer> slots_;
  std::vector<DevTensor> vals_;
  std::map<ir::ValueId, DeviceBuffer> input_bufs_;
  std::vector<uint8_t> staging_;
  PinnedBuffer pinned_in_, pinned_out_;
  DeviceBuffer dev_in_, dev_out_, attn_ws_;
  DevStep dev_step_;
};

class CudaBackend final : public Backend {
 public:
  std::string name() const override { return "cuda"; }
  bool supports(const ir::Node& node, const ir::Graph& graph) const override {
    return cuda_op_supported(node, graph);
  }
  std::unique_ptr<CompiledGraph> compile(const ir::Graph& graph, const CompileOptions& opt) override {
    auto g = std::make_unique<CudaCompiledGraph>(graph, opt, context());
    act_ = g->act();
    return g;
  }
  std::unique_ptr<KvStorage> allocate_kv(const KvLayout& layout) override {
    return std::make_unique<CudaKv>(layout, act_, context());
  }

 private:
  std::shared_ptr<CudaContext> context() {
    if (!cx_) {
      if (cuda_device_count() == 0)
        throw_error(ErrorCode::kUnsupported, "cuda backend: no CUDA device is visible (cudaGetDeviceCount)");
      cx_ = std::make_shared<CudaContext>();
    }
    return cx_;
  }
  std::shared_ptr<CudaContext> cx_;
  DType act_ = DType::kBF16;  // KV dtype until a graph is compiled
};

}  // namespace
}  // namespace cuda

std::unique_ptr<Backend> create_cuda_backend() { return std::make_unique<cuda::CudaBackend>(); }

}  // namespace kiln
