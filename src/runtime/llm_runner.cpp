// LlmRunner (see llm_runner.h).
#include "runtime/llm_runner.h"

#include <algorithm>
#include <exception>
#include <thread>

#include "backends/memory_plan.h"
#include "core/log.h"
#include "core/status.h"
#include "runtime/kv_cache/kv_sizing.h"
#include "runtime/kv_calibration.h"

namespace kiln {

int32_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return int32_t(best);
}

namespace {

// The KvStorage the single allocator of a tensor-parallel runner sees: a copy-on-write
// copies the block in every rank's storage, so the ranks' pools stay in step.
class MirroredKv final : public KvStorage {
 public:
  explicit MirroredKv(const std::vector<std::unique_ptr<KvStorage>>& ranks) {
    for (auto& r : ranks) ranks_.push_back(r.get());
  }
  const KvLayout& layout() const override { return ranks_[0]->layout(); }
  void copy_block(int32_t src, int32_t dst) override {
    for (KvStorage* r : ranks_) r->copy_block(src, dst);
  }
  // Swapping moves the block in every rank; a host slot spans all ranks' shares.
  size_t block_bytes() const override {
    size_t b = 0;
    for (KvStorage* r : ranks_) b += r->block_bytes();
    return b;
  }
  void host_reserve(int32_t num_blocks) override {
    for (KvStorage* r : ranks_) r->host_reserve(num_blocks);
  }
  int32_t host_blocks() const override { return ranks_[0]->host_blocks(); }
  void swap_out(std::span<const KvSwapCopy> copies) override {
    for (KvStorage* r : ranks_) r->swap_out(copies);
  }
  void swap_in(std::span<const KvSwapCopy> copies) override {
    for (KvStorage* r : ranks_) r->swap_in(copies);
  }

 private:
  std::vector<KvStorage*> ranks_;
};

KvLayout rank_layout(const Model& rank, int64_t blocks, int64_t block_size, KvDType dtype) {
  KvLayout layout;
  layout.dtype = dtype;
  if (kv_dtype_quantized(dtype)) {
    layout.k_shift = rank.kv_key_shift();
    layout.k_rotate = rank.kv_rotate();
  }
  layout.num_layers = rank.info().num_layers;
  layout.num_blocks = blocks;
  layout.block_size = block_size;
  layout.num_kv_heads = rank.info().num_kv_heads;  // this rank's heads
  layout.head_dim = rank.info().head_dim;
  return layout;
}

// Activation memory a rank will still allocate: the arena planned for a step of
// `step_tokens` tokens (every backend grows its slots to the largest value they hold)
// less what is already resident. The plan counts the graph's value dtypes, an upper
// bound where a backend runs activations narrower (16-bit on a GPU).
size_t pending_activation_bytes(Model& rank, int64_t step_tokens) {
  const ir::Graph& g = rank.graph();
  const size_t planned = memory_plan_size(g, plan_activation_slots(g), {{"T", step_tokens}}).peak_bytes;
  const size_t resident = rank.compiled().activation_bytes();
  return planned > resident ? planned - resident : 0;
}

}  // namespace

void llm_require_decoder(Model& model) {
  const ModelInfo& info = model.info();
  if (!info.is_decoder && info.family == "onnx") {
    std::string inputs;
    for (ir::ValueId id : model.graph().inputs()) inputs += (inputs.empty() ? "" : ", ") + model.graph().value(id).name;
    throw_error(
        ErrorCode::kInvalidArgument, "'", model.path(), "' was imported op by op (inputs ", inputs,
        "): kiln decodes an ONNX file only as a recognised family export (GPT-2, Llama or Qwen2, "
        "with or without past_key_values), which runs through its paged KV cache; leave "
        "--onnx-import at auto (the log says why a file was not recognised)");
  }
  if (!info.is_decoder)
    throw_error(ErrorCode::kInvalidArgument, "LlmRunner needs a decoder model; '", info.family,
                "' is an encoder (use encode())");
}

LlmRunner::LlmRunner(Model& model, const LlmRunnerOptions& options) : model_(model), opt_(options) {
  const ModelInfo& info = model.info();
  llm_require_decoder(model);
  if (opt_.block_size <= 0)
    throw_error(ErrorCode::kInvalidArgument, "KV block size must be positive, got ", opt_.block_size);
  // A quantized pool's key shift is measured first, so that its runner's memory is
  // released before this pool is sized.
  if (!opt_.kv_dtype) ensure_kv_key_shift(model);
  const int32_t blocks = pool_blocks();
  for (int r = 0; r < model.tp_world(); ++r) {
    Model& rank = model.tp_rank(r);
    ranks_.push_back(&rank);
    storages_.push_back(rank.backend().allocate_kv(rank_layout(rank, blocks, opt_.block_size, kv_dtype())));
  }
  KvStorage* pool = storages_[0].get();
  if (storages_.size() > 1) pool = (mirror_ = std::make_unique<MirroredKv>(storages_)).get();
  kv_ = std::make_unique<KvCacheManager>(pool, blocks, opt_.block_size);
  const ir::Graph& g = model.graph();
  const ir::ValueId logits = g.find_output("logits");
  const Dim v = logits == ir::kNoValue ? Dim() : g.value(logits).shape[1];
  vocab_ = int32_t(v.is_concrete() ? v.value : info.vocab_size);
  const ir::ValueId ids = g.find_output(kTopIdsOutput);
  if (ids != ir::kNoValue && g.find_output(kTopLogitsOutput) != ir::kNoValue &&
      g.find_output(kTopLogprobsOutput) != ir::kNoValue && g.value(ids).shape[1].is_concrete())
    top_k_ = int32_t(g.value(ids).shape[1].value);
}


int32_t LlmRunner::pool_blocks() const {
  const int64_t bs = opt_.block_size;
  const int64_t cap = opt_.num_blocks > 0        ? opt_.num_blocks
                      : opt_.max_total_tokens > 0 ? (opt_.max_total_tokens + bs - 1) / bs
                                                  : 0;
  int64_t blocks = cap;
  std::string how;
  if (opt_.kv_cache_fraction != 0) {
    // Ranks on one device share its free memory: their blocks and arenas add up there.
    std::map<std::string, KvPoolBudget> devices;
    for (int r = 0; r < model_.tp_world(); ++r) {
      Model& rank = model_.tp_rank(r);
      const DeviceMemory mem =
          opt_.device_memory ? opt_.device_memory(rank.backend()) : rank.backend().memory_info();
      KvPoolBudget& b = devices[mem.device];
      b.device = mem.device;
      b.free_bytes = mem.free_bytes;
      b.block_bytes += rank.backend().kv_block_bytes(rank_layout(rank, 1, bs, kv_dtype()));
      b.activation_bytes += pending_activation_bytes(rank, opt_.max_step_tokens);
    }
    // One max-length request, plus the executor's spare block (see Executor::max_context).
    int64_t request = (model_.info().max_positions + bs - 1) / bs + 1;
    if (cap > 0) request = std::min(request, cap);
    blocks = -1;
    for (auto& [name, b] : devices) {
      b.fraction = opt_.kv_cache_fraction;
      b.block_size = int32_t(bs);
      b.cap_blocks = cap;
      b.request_blocks = request;
      const KvPoolSize size = kv_pool_size(b);
      if (blocks < 0 || size.blocks < blocks) {
        blocks = size.blocks;
        how = str_cat(" (--kv-cache-fraction ", b.fraction, " of ", kv_mib(b.free_bytes), " free on ",
                      name, " less ", kv_mib(b.activation_bytes), " for activations",
                      cap > 0 && blocks == cap ? ", capped" : "", ")");
      }
    }
  }
  if (blocks <= 0 || blocks > (int64_t(1) << 30))
    throw_error(ErrorCode::kInvalidArgument, "KV pool of ", blocks, " blocks (num_blocks ",
                opt_.num_blocks, ", max_total_tokens ", opt_.max_total_tokens,
                "): give a positive size or a kv_cache_fraction");
  size_t block_bytes = 0;
  for (int r = 0; r < model_.tp_world(); ++r) {
    Model& rank = model_.tp_rank(r);
    block_bytes += rank.backend().kv_block_bytes(rank_layout(rank, 1, bs, kv_dtype()));
  }
  const KvDType kvd = kv_dtype();
  log_info("KV cache: ", blocks, " blocks x ", bs, " tokens = ", blocks * bs, " tokens, ",
           kv_mib(size_t(blocks) * block_bytes), kv_dtype_quantized(kvd) ? str_cat(" (", kv_dtype_name(kvd), ")") : "",
           how);
  return int32_t(blocks);
}

TopLogits StepTopLogits::row(int64_t r) const {
  const int64_t kk = k();
  TopLogits t;
  t.logits = std::span<const float>(logits.data_as<float>() + r * kk, size_t(kk));
  t.ids = std::span<const int32_t>(ids.data_as<int32_t>() + r * kk, size_t(kk));
  t.logprobs = std::span<const float>(logprobs.data_as<float>() + r * kk, size_t(kk));
  t.vocab = vocab;
  return t;
}

LlmRunner::~LlmRunner() {
  for (auto& [id, s] : seqs_) kv_->free(s.kv);
}

LlmRunner::Seq& LlmRunner::get(int32_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) throw_error(ErrorCode::kInvalidArgument, "unknown sequence id ", seq);
  return it->second;
}
const LlmRunner::Seq& LlmRunner::get(int32_t seq) const {
  return const_cast<LlmRunner*>(this)->get(seq);
}

int32_t LlmRunner::add_sequence(const std::vector<int32_t>& prompt) {
  if (prompt.empty()) throw_error(ErrorCode::kInvalidArgument, "empty prompt");
  int32_t id = next_id_++;
  seqs_[id].pending = prompt;
  return id;
}

int32_t LlmRunner::fork_sequence(int32_t parent) {
  Seq& p = get(parent);
  int32_t id = next_id_++;
  Seq child;
  child.kv = kv_->fork(p.kv);
  child.pending = p.pending;
  seqs_[id] = std::move(child);
  return id;
}

void LlmRunner::append_tokens(int32_t seq, const std::vector<int32_t>& tokens) {
  auto& p = get(seq).pending;
  p.insert(p.end(), tokens.begin(), tokens.end());
}

void LlmRunner::remove_sequence(int32_t seq) {
  kv_->free(get(seq).kv);
  seqs_.erase(seq);
}

bool LlmRunner::has_pending() const {
  for (auto& [id, s] : seqs_)
    if (!s.pending.empty()) return true;
  return false;
}

int32_t LlmRunner::context_length(int32_t seq) const { return get(seq).kv.length; }

// The shared body of step() and run_chunks(): capacity and position checks first so a
// failing step changes nothing, then grow, bind the ragged inputs and run.
TensorMap LlmRunner::run_parts(std::span<const StepChunk> chunks, bool all_logits,
                               const std::vector<std::string>& outputs, int32_t top_k, bool pad_decode) {
  const ModelInfo& info = model_.info();
  int32_t blocks = 0;
  for (auto& c : chunks) {
    const int32_t n = int32_t(c.tokens.size());
    KILN_CHECK(n > 0, "empty step chunk");
    if (c.kv->length + n > info.max_positions)
      throw_error(ErrorCode::kOutOfRange, "a sequence would reach ", c.kv->length + n,
                  " tokens, beyond the model's ", info.max_positions, " positions");
    blocks += kv_->blocks_needed(*c.kv, n);
  }
  if (blocks > kv_->allocator().num_free())
    throw_error(ErrorCode::kOutOfMemory, "KV cache: the step needs ", blocks, " blocks but ",
                kv_->allocator().num_free(), " of ", kv_->allocator().num_blocks(),
                " are free (raise the KV budget or run fewer sequences)");

  int64_t t_total = 0;
  bool every_row = all_logits;
  for (auto& c : chunks) {
    t_total += int64_t(c.tokens.size());
    every_row |= c.all_logits;
  }
  // A pure decode step (one token a chunk) may run padded to its bucket.
  const bool decode = pad_decode && !every_row && t_total == int64_t(chunks.size());
  const int64_t pad = decode ? decode_bucket(t_total) - t_total : 0;
  Tensor tokens(DType::kI32, {t_total + pad}), positions(DType::kI32, {t_total + pad});
  StepInfo step;
  step.top_k = top_k;
  step.slot_mapping.resize(size_t(t_total + pad));
  std::vector<int32_t> rows;
  int32_t t = 0;
  for (auto& c : chunks) {
    const int32_t n = int32_t(c.tokens.size());
    KvSequence& kv = *c.kv;
    int32_t start = kv.length;
    KILN_CHECK(kv_->grow(kv, n), "KV grow failed after the capacity check");
    for (int32_t i = 0; i < n; ++i) {
      tokens.data_as<int32_t>()[t + i] = c.tokens[size_t(i)];
      positions.data_as<int32_t>()[t + i] = start + i;
      step.slot_mapping[size_t(t + i)] = kv_->slot(kv, start + i);
    }
    step.seqs.push_back({t, n, kv.length, kv.blocks});
    if (all_logits || c.all_logits)
      for (int32_t i = 0; i < n; ++i) rows.push_back(t + i);
    else if (c.want_logits)
      rows.push_back(t + n - 1);
    t += n;
  }
  const int64_t wanted = int64_t(rows.size());
  if (pad > 0) add_pad_rows(pad, tokens, positions, step, rows);
  TensorMap out = run_step(tokens, positions, rows, step, outputs);
  if (pad > 0)  // every output asked for has a row per logit row: the pad rows' go
    for (auto& [name, t] : out) t = t.slice_rows(0, wanted);
  return out;
}

TensorMap LlmRunner::run_step(const Tensor& tokens, const Tensor& positions, const std::vector<int32_t>& rows,
                              const StepInfo& step, const std::vector<std::string>& outputs) {
  Tensor logit_rows(DType::kI32, {int64_t(rows.size())});
  std::copy(rows.begin(), rows.end(), logit_rows.data_as<int32_t>());
  return run_ranks({{"tokens", tokens}, {"positions", positions}, {"logit_rows", logit_rows}}, step, outputs);
}

std::vector<std::string> LlmRunner::step_outputs() const {
  if (top_k_ > 0) return {kTopLogitsOutput, kTopIdsOutput, kTopLogprobsOutput};
  return {"logits"};
}

std::vector<int64_t> decode_row_buckets(int64_t max_rows) {
  max_rows = std::min(max_rows, kMaxDecodeBucket);
  std::vector<int64_t> b;
  for (int64_t r = 1; r < 8; r *= 2) {
    b.push_back(r);
    if (r >= max_rows) return b;
  }
  for (int64_t r = 8;; r += r < 256 ? 8 : 16) {
    b.push_back(r);
    if (r >= max_rows) return b;
  }
}

int64_t LlmRunner::decode_bucket(int64_t rows) const {
  auto it = std::lower_bound(opt_.decode_buckets.begin(), opt_.decode_buckets.end(), rows);
  return it == opt_.decode_buckets.end() ? rows : *it;
}

void LlmRunner::add_pad_rows(int64_t pad, Tensor& tokens, Tensor& positions, StepInfo& step,
                             std::vector<int32_t>& rows) const {
  const int32_t first = int32_t(tokens.dim(0) - pad);
  KILN_CHECK(step.slot_mapping.size() == size_t(tokens.dim(0)) && positions.dim(0) == tokens.dim(0),
             "pad rows: the step's slots and positions must have the padded length");
  for (int32_t t = first; t < first + int32_t(pad); ++t) {
    tokens.data_as<int32_t>()[t] = 0;
    positions.data_as<int32_t>()[t] = 0;
    step.slot_mapping[size_t(t)] = -1;       // no K/V written...
    step.seqs.push_back({t, 1, 1, {0}});      // ...and only its own key attended (block 0 is read, not used)
    rows.push_back(t);
  }
}

int64_t LlmRunner::warm_prefill_sizes() {
  const int64_t limit = opt_.max_step_tokens;
  int64_t steps = 0;
  for (int64_t p = 2;; p *= 2) {
    const int64_t n = std::min(p, limit);
    if (n < 2) break;
    Tensor tokens(DType::kI32, {n}), positions(DType::kI32, {n});
    StepInfo step;
    step.top_k = top_k_ > 0 ? 1 : 0;
    step.slot_mapping.assign(size_t(n), -1);  // no K/V written
    for (int32_t i = 0; i < int32_t(n); ++i) tokens.data_as<int32_t>()[i] = 0;
    // Pad sequences of at most kWarmSeq tokens (the GEMMs see all n rows; attention stays
    // linear in n), whose tables repeat block 0 (read, never used).
    constexpr int64_t kWarmSeq = 256;
    const int64_t per_seq = std::min<int64_t>(kWarmSeq, model_.info().max_positions);
    for (int64_t q = 0; q < n; q += per_seq) {
      const int64_t len = std::min(per_seq, n - q);
      for (int64_t i = 0; i < len; ++i) positions.data_as<int32_t>()[q + i] = int32_t(i);
      step.seqs.push_back({int32_t(q), int32_t(len), int32_t(len),
                           std::vector<int32_t>(size_t((len + opt_.block_size - 1) / opt_.block_size), 0)});
    }
    run_step(tokens, positions, {int32_t(n - 1)}, step, step_outputs());
    ++steps;
    if (n >= limit) break;
  }
  return steps;
}

int64_t LlmRunner::warm_decode_buckets(int64_t max_rows) {
  // The output widths the executor's steps ask for (Executor: step()): the top candidate
  // alone and the model's k, or whole logits rows.
  const std::vector<int32_t> widths = top_k_ > 0 ? std::vector<int32_t>{1, top_k_} : std::vector<int32_t>{0};
  int64_t steps = 0;
  for (int64_t b : opt_.decode_buckets) {
    for (int32_t top_k : widths)
      for (int rep = 0; rep < 2; ++rep) {  // a capturing backend: eager, then captured
        Tensor tokens(DType::kI32, {b}), positions(DType::kI32, {b});
        StepInfo step;
        step.top_k = top_k;
        step.slot_mapping.resize(size_t(b));
        std::vector<int32_t> rows;
        add_pad_rows(b, tokens, positions, step, rows);
        run_step(tokens, positions, rows, step, step_outputs());
        ++steps;
      }
    if (b >= max_rows) break;
  }
  return steps;
}

// Ranks 1..N-1 on threads of their own, rank 0 on the caller's. Each rank's AllReduce
// waits for all the others, so every rank must run every step: they get the same
// inputs and make the same checks, so a failure (a bad shape, an unknown output) shows
// on all of them alike and none is left waiting. A thread per rank per step costs tens
// of microseconds, small next to a CPU step; persistent rank workers (or one process
// per GPU under NCCL) can replace this without changing the callers.
TensorMap LlmRunner::run_ranks(const TensorMap& inputs, const StepInfo& step, const std::vector<std::string>& outputs) {
  if (ranks_.size() == 1) return model_.compiled().run(inputs, step, storages_[0].get(), outputs);
  std::vector<std::exception_ptr> errors(ranks_.size());
  std::vector<std::thread> threads;
  for (size_t r = 1; r < ranks_.size(); ++r)
    threads.emplace_back([&, r] {
      try {
        ranks_[r]->compiled().run(inputs, step, storages_[r].get(), outputs);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  TensorMap out;
  try {
    out = ranks_[0]->compiled().run(inputs, step, storages_[0].get(), outputs);
  } catch (...) {
    errors[0] = std::current_exception();
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return out;
}

Tensor LlmRunner::run_chunks_logits(std::span<const StepChunk> chunks) {
  KILN_CHECK(!chunks.empty(), "a step with no chunks");
  TensorMap out = run_parts(chunks, false, {"logits"});
  return std::move(out.at("logits"));
}

Tensor LlmRunner::run_chunks_hidden(std::span<const StepChunk> chunks) {
  return run_parts(chunks, /*all_logits=*/false, {"hidden"}, 0, /*pad_decode=*/false).at("hidden");
}

StepTopLogits LlmRunner::run_chunks_top(std::span<const StepChunk> chunks, int32_t need) {
  KILN_CHECK(!chunks.empty(), "a step with no chunks");
  KILN_CHECK(top_k_ > 0, "the model has no TopKLogits outputs");
  KILN_CHECK(need >= 0, "a step cannot need ", need, " top candidates");
  TensorMap out = run_parts(chunks, false, {kTopLogitsOutput, kTopIdsOutput, kTopLogprobsOutput}, need);
  StepTopLogits t;
  t.logits = std::move(out.at(kTopLogitsOutput));
  t.ids = std::move(out.at(kTopIdsOutput));
  t.logprobs = std::move(out.at(kTopLogprobsOutput));
  t.vocab = vocab_;
  return t;
}

std::vector<std::vector<float>> LlmRunner::run_chunks(std::span<const StepChunk> chunks) {
  if (chunks.empty()) return {};
  const Tensor logits = run_chunks_logits(chunks);
  const int64_t v = logits.dim(1);
  std::vector<std::vector<float>> result;
  int64_t row = 0;
  for (auto& c : chunks) {
    const int64_t rows = c.all_logits ? int64_t(c.tokens.size()) : c.want_logits ? 1 : 0;
    for (int64_t i = 0; i < rows; ++i, ++row) {
      const float* src = logits.data_as<float>() + row * v;
      result.emplace_back(src, src + v);
    }
  }
  return result;
}

void LlmRunner::next_chunks(std::vector<int32_t>& ids, std::vector<StepChunk>& chunks) {
  // Each sequence's chunk within the token budget.
  int64_t budget = opt_.max_step_tokens;
  for (auto& [id, s] : seqs_) {
    if (s.pending.empty() || budget <= 0) continue;
    int32_t n = int32_t(std::min<int64_t>(int64_t(s.pending.size()), budget));
    ids.push_back(id);
    chunks.push_back({&s.kv, std::span<const int32_t>(s.pending.data(), size_t(n)),
                      n == int32_t(s.pending.size())});
    budget -= n;
  }
}

void LlmRunner::consume_chunks(const std::vector<int32_t>& ids, const std::vector<StepChunk>& chunks) {
  for (size_t i = 0; i < chunks.size(); ++i) {
    auto& pending = seqs_[ids[i]].pending;
    pending.erase(pending.begin(), pending.begin() + int64_t(chunks[i].tokens.size()));
  }
}

std::vector<std::pair<int32_t, int32_t>> LlmRunner::step_greedy() {
  std::vector<int32_t> ids;
  std::vector<StepChunk> chunks;
  next_chunks(ids, chunks);
  std::vector<std::pair<int32_t, int32_t>> result;
  if (chunks.empty()) return result;
  std::vector<int32_t> best;
  if (top_k_ > 0) {  // only the top candidates cross from the device
    const StepTopLogits top = run_chunks_top(chunks, 1);  // the argmax alone
    for (int64_t r = 0; r < top.ids.dim(0); ++r) best.push_back(top.ids.data_as<int32_t>()[r * top.k()]);
  } else {
    const Tensor logits = run_chunks_logits(chunks);
    for (int64_t r = 0; r < logits.dim(0); ++r)
      best.push_back(argmax(logits.data_as<float>() + r * logits.dim(1), logits.dim(1)));
  }
  size_t row = 0;
  for (size_t i = 0; i < chunks.size(); ++i)
    if (chunks[i].want_logits) result.push_back({ids[i], best.at(row++)});
  consume_chunks(ids, chunks);
  return result;
}

std::vector<SequenceOutput> LlmRunner::step(bool all_logits) {
  std::vector<int32_t> ids;
  std::vector<StepChunk> chunks;
  next_chunks(ids, chunks);
  if (chunks.empty()) return {};
  TensorMap out = run_parts(chunks, all_logits, {"logits"});
  const Tensor& logits = out.at("logits");
  const int64_t v = logits.dim(1);

  std::vector<SequenceOutput> result;
  int64_t row = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const int64_t fed = int64_t(chunks[i].tokens.size());
    int64_t n = all_logits ? fed : (chunks[i].want_logits ? 1 : 0);
    if (n > 0) {
      SequenceOutput o;
      o.seq = ids[i];
      const float* src = logits.data_as<float>() + row * v;
      o.logits.assign(src, src + n * v);
      result.push_back(std::move(o));
    }
    row += n;
  }
  consume_chunks(ids, chunks);
  return result;
}

std::vector<std::vector<int32_t>> LlmRunner::generate_greedy(
    const std::vector<std::vector<int32_t>>& prompts, int32_t max_new_tokens, int32_t eos_token_id) {
  std::map<int32_t, size_t> index;
  for (size_t i = 0; i < prompts.size(); ++i) index[add_sequence(prompts[i])] = i;
  std::vector<std::vector<int32_t>> generated(prompts.size());
  while (has_pending()) {
    for (auto [seq, next] : step_greedy()) {
      auto& gen = generated[index.at(seq)];
      gen.push_back(next);
      if (int32_t(gen.size()) >= max_new_tokens || next == eos_token_id) continue;
      append_tokens(seq, {next});
    }
  }
  for (auto& [id, i] : index) remove_sequence(id);
  return generated;
}

}  // namespace kiln
