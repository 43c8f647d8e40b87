// LlmRunner (see llm_runner.h).
#include "runtime/llm_runner.h"

#include <algorithm>

#include "core/status.h"

namespace kiln {

int32_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return int32_t(best);
}

LlmRunner::LlmRunner(Model& model, const LlmRunnerOptions& options) : model_(model), opt_(options) {
  const ModelInfo& info = model.info();
  if (!info.is_decoder)
    throw_error(ErrorCode::kInvalidArgument, "LlmRunner needs a decoder model; '", info.family,
                "' is an encoder (use encode())");
  int32_t blocks = opt_.num_blocks;
  if (blocks <= 0) blocks = int32_t((opt_.max_total_tokens + opt_.block_size - 1) / opt_.block_size);
  KvLayout layout;
  layout.num_layers = info.num_layers;
  layout.num_blocks = blocks;
  layout.block_size = opt_.block_size;
  layout.num_kv_heads = info.num_kv_heads;
  layout.head_dim = info.head_dim;
  storage_ = model.backend().allocate_kv(layout);
  kv_ = std::make_unique<KvCacheManager>(storage_.get(), blocks, opt_.block_size);
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

std::vector<SequenceOutput> LlmRunner::step(bool all_logits) {
  const ModelInfo& info = model_.info();
  // Pick each sequence's chunk within the token budget.
  struct Part {
    int32_t id;
    int32_t n;
  };
  std::vector<Part> parts;
  int64_t budget = opt_.max_step_tokens;
  for (auto& [id, s] : seqs_) {
    if (s.pending.empty() || budget <= 0) continue;
    int32_t n = int32_t(std::min<int64_t>(int64_t(s.pending.size()), budget));
    if (s.kv.length + n > info.max_positions)
      throw_error(ErrorCode::kOutOfRange, "sequence ", id, " would reach ", s.kv.length + n,
                  " tokens, beyond the model's ", info.max_positions, " positions");
    parts.push_back({id, n});
    budget -= n;
  }
  if (parts.empty()) return {};
  int32_t blocks = 0;
  for (auto& p : parts) blocks += kv_->blocks_needed(seqs_[p.id].kv, p.n);
  if (blocks > kv_->allocator().num_free())
    throw_error(ErrorCode::kOutOfMemory, "KV cache: the step needs ", blocks, " blocks but ",
                kv_->allocator().num_free(), " of ", kv_->allocator().num_blocks(),
                " are free (raise the KV budget or run fewer sequences)");

  int64_t t_total = 0;
  for (auto& p : parts) t_total += p.n;
  Tensor tokens(DType::kI32, {t_total}), positions(DType::kI32, {t_total});
  StepInfo step;
  step.slot_mapping.resize(size_t(t_total));
  std::vector<int32_t> rows;
  int32_t t = 0;
  for (auto& p : parts) {
    Seq& s = seqs_[p.id];
    int32_t start = s.kv.length;
    KILN_CHECK(kv_->grow(s.kv, p.n), "KV grow failed after the capacity check");
    for (int32_t i = 0; i < p.n; ++i) {
      tokens.data_as<int32_t>()[t + i] = s.pending[size_t(i)];
      positions.data_as<int32_t>()[t + i] = start + i;
      step.slot_mapping[size_t(t + i)] = kv_->slot(s.kv, start + i);
    }
    step.seqs.push_back({t, p.n, s.kv.length, s.kv.blocks});
    s.pending.erase(s.pending.begin(), s.pending.begin() + p.n);
    if (all_logits)
      for (int32_t i = 0; i < p.n; ++i) rows.push_back(t + i);
    else if (s.pending.empty())
      rows.push_back(t + p.n - 1);
    t += p.n;
  }
  Tensor logit_rows(DType::kI32, {int64_t(rows.size())});
  std::copy(rows.begin(), rows.end(), logit_rows.data_as<int32_t>());
  TensorMap out = model_.compiled().run(
      {{"tokens", tokens}, {"positions", positions}, {"logit_rows", logit_rows}}, step,
      storage_.get());
  const Tensor& logits = out.at("logits");
  const int64_t v = logits.dim(1);

  std::vector<SequenceOutput> result;
  int64_t row = 0;
  for (auto& p : parts) {
    const bool done = seqs_[p.id].pending.empty();
    int64_t n = all_logits ? p.n : (done ? 1 : 0);
    if (n > 0) {
      SequenceOutput o;
      o.seq = p.id;
      const float* src = logits.data_as<float>() + row * v;
      o.logits.assign(src, src + n * v);
      result.push_back(std::move(o));
    }
    row += n;
  }
  return result;
}

std::vector<std::vector<int32_t>> LlmRunner::generate_greedy(
    const std::vector<std::vector<int32_t>>& prompts, int32_t max_new_tokens, int32_t eos_token_id) {
  std::map<int32_t, size_t> index;
  for (size_t i = 0; i < prompts.size(); ++i) index[add_sequence(prompts[i])] = i;
  std::vector<std::vector<int32_t>> generated(prompts.size());
  while (has_pending()) {
    for (auto& o : step()) {
      auto& gen = generated[index.at(o.seq)];
      int32_t next = argmax(o.logits.data(), int64_t(o.logits.size()));
      gen.push_back(next);
      if (int32_t(gen.size()) >= max_new_tokens || next == eos_token_id) continue;
      append_tokens(o.seq, {next});
    }
  }
  for (auto& [id, i] : index) remove_sequence(id);
  return generated;
}

}  // namespace kiln
