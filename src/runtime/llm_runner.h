// Runs a decoder over many sequences at once with the paged KV cache: each step
// concatenates every active sequence's pending tokens (a prompt chunk while prefilling,
// one token while decoding) on one ragged token axis, writes their K/V through the
// block tables and returns each sequence's last-token logits. The in-flight batching
// executor (scheduler, sampling, streaming) builds on this. Tested in
// tests/models/decoder_golden_test.cpp and tests/runtime/llm_runner_test.cpp.
//
// Tensor parallelism (a Model loaded with tensor_parallel = N) lives here and only
// here: the runner keeps ONE block allocator (KvCacheManager) and one KvStorage per
// rank (each holding that rank's K/V heads). Every scheduling decision — which blocks a
// step grows into, forks, frees, prefix-cache and session reuse — is made once on that
// allocator, so the block tables are identical across ranks by construction; a
// copy-on-write copies the block in every rank's storage. A step binds one set of
// inputs and runs all ranks at once (one thread each; their AllReduce nodes meet in
// the communicator) and returns rank 0's outputs, which are the model's. So the
// executor, sessions, prefix caching, fork (n > 1) and preemption work unchanged on
// a sharded model; a NCCL communicator only has to replace the in-process one.
// Tested in tests/parallel/ (tp_executor_test.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "runtime/kv_cache/block_allocator.h"
#include "runtime/model.h"
#include "runtime/sampling.h"

namespace kiln {

struct LlmRunnerOptions {
  int32_t block_size = 16;
  int32_t num_blocks = 0;           // 0: enough for max_total_tokens
  int64_t max_total_tokens = 8192;  // KV budget in tokens when num_blocks is 0
  int64_t max_step_tokens = 2048;   // token budget of one step (prompts are chunked)
  // > 0: the pool takes this fraction of the memory free on the device once the weights
  // and the activation arena (planned at max_step_tokens) are resident, as many blocks
  // as fit (runtime/kv_cache/kv_sizing.h), capped by num_blocks or else max_total_tokens
  // when they are > 0. It must hold one max-length request: the model's positions plus
  // a spare block, or the whole capped pool when that is smaller (kOutOfMemory if not).
  // 0: num_blocks / max_total_tokens alone.
  double kv_cache_fraction = 0;
  // Replaces Backend::memory_info() when set (tests fake the free memory with it).
  std::function<DeviceMemory(Backend&)> device_memory;
  // Row counts (ascending) that a pure decode step (one new token per chunk) is padded up
  // to: the smallest one >= its rows; none when empty or past the last. A pad row feeds
  // token 0 at position 0 with a context of one token (its own), writes no K/V (slot -1)
  // and its outputs are dropped, so callers see the unpadded step. A backend that
  // captures a step per shape (CUDA graphs) then meets only these few row counts, where
  // a server's batch size changes with every arrival and finish (decode_row_buckets).
  std::vector<int64_t> decode_buckets;
  // Replaces the model's KV dtype (ModelOptions::kv_cache_dtype) for this runner's pool;
  // the key-shift calibration (runtime/kv_calibration.h) fills an unquantized pool so.
  std::optional<KvDType> kv_dtype;
};

// vLLM's capture sizes: 1, 2, 4, then every multiple of 8 up to 256, then of 16, up to
// the first of them >= min(max_rows, kMaxDecodeBucket) (as vLLM's largest capture size:
// larger decode steps run unpadded, and a start-up warm-up stays at 51 sizes at most).
inline constexpr int64_t kMaxDecodeBucket = 512;
std::vector<int64_t> decode_row_buckets(int64_t max_rows);

// One sequence's share of an explicit step (the executor's micro-batch scheduler
// chooses these): `tokens` are fed at positions kv->length onwards.
struct StepChunk {
  KvSequence* kv = nullptr;
  std::span<const int32_t> tokens;
  bool want_logits = false;  // the logits of the chunk's last token
  // The logits of every token of the chunk, a row each in order (prompt logprobs); the
  // last of them is want_logits' row. Such a step never runs padded.
  bool all_logits = false;
};

struct SequenceOutput {
  int32_t seq = -1;
  std::vector<float> logits;  // [vocab] of the sequence's last token in this step,
                              // or [n_tokens * vocab] when all_logits was asked
};

// A step's TopKLogits outputs (model.h) for the chunks with want_logits: [rows, k] each.
struct StepTopLogits {
  Tensor logits, ids, logprobs;
  int32_t vocab = 0;
  int64_t k() const { return ids.dim(1); }
  TopLogits row(int64_t r) const;
};

// Throws kInvalidArgument unless `model` is a decoder LlmRunner can drive, saying what
// it is instead (an encoder; an ONNX file imported op by op).
void llm_require_decoder(Model& model);

class LlmRunner {
 public:
  LlmRunner(Model& model, const LlmRunnerOptions& options = {});
  ~LlmRunner();

  // Queues a new sequence with its prompt as pending tokens; returns its id.
  int32_t add_sequence(const std::vector<int32_t>& prompt);
  // A new sequence sharing all of `parent`'s cached tokens (prefix sharing, n > 1).
  int32_t fork_sequence(int32_t parent);
  // Queues tokens (e.g. the one just sampled) to be fed at the next step.
  void append_tokens(int32_t seq, const std::vector<int32_t>& tokens);
  void remove_sequence(int32_t seq);
  bool has_pending() const;

  // One engine step over all sequences with pending tokens, within max_step_tokens.
  // Returns an entry for every sequence whose pending tokens were all consumed (with
  // all_logits: for every sequence that ran, with the logits of each token it fed).
  // Throws kOutOfMemory when the KV pool cannot hold the step (nothing is changed).
  std::vector<SequenceOutput> step(bool all_logits = false);
  // The same step, greedy: (sequence, argmax token) for each sequence whose chunk ended
  // its pending tokens. With TopKLogits in the graph only the top ids cross from the
  // device (ties go to the lowest id, as argmax()).
  std::vector<std::pair<int32_t, int32_t>> step_greedy();

  // Greedy decoding of every prompt for max_new_tokens (stopping a sequence at
  // eos_token_id when >= 0). Returns the generated ids per prompt.
  std::vector<std::vector<int32_t>> generate_greedy(const std::vector<std::vector<int32_t>>& prompts,
                                                    int32_t max_new_tokens, int32_t eos_token_id = -1);

  // One engine step over explicit chunks whose KV the caller owns. Grows each chunk's
  // sequence. Throws kOutOfMemory (changing nothing) when the pool cannot hold the
  // step and kOutOfRange past the model's positions. Returns [vocab] logits for each
  // chunk with want_logits, in order (chunks with all_logits: a row per token instead).
  std::vector<std::vector<float>> run_chunks(std::span<const StepChunk> chunks);
  // The same, returning the [chunks with want_logits, vocab] logits tensor itself (no
  // per-sequence copies: at batch 256 x 128k vocab those copies cost milliseconds).
  Tensor run_chunks_logits(std::span<const StepChunk> chunks);
  // The same, returning each row's top-k candidates instead (only [rows, k] crosses from
  // a GPU); needs top_logits_k() > 0. need > 0: only the first `need` candidates of each
  // row are wanted (StepInfo::top_k): the result may then have k() == min(need, k).
  StepTopLogits run_chunks_top(std::span<const StepChunk> chunks, int32_t need = 0);
  // The same step (never padded), returning the model's final hidden states (its
  // "hidden" output, after the final norm) of every token fed: [tokens, hidden_size] in
  // chunk order. Decoder embeddings (encode()) pool these.
  Tensor run_chunks_hidden(std::span<const StepChunk> chunks);
  // Runs every decode bucket of at most max_rows rows (LlmRunnerOptions::decode_buckets)
  // with pad rows only, twice per output variant a caller uses (the top candidate alone,
  // the model's k candidates; whole logits without TopKLogits), so that a capturing
  // backend has made its plans and graphs before the first request. Returns the steps run.
  int64_t warm_decode_buckets(int64_t max_rows);
  // Runs one prefill step of each power of two from 2 tokens up to max_step_tokens (the
  // last one max_step_tokens itself), in pad sequences of up to 256 tokens writing no
  // K/V, so that a backend has made the GEMM plans (CUDA: Gemm::set_row_buckets' powers
  // of two) and grown the buffers that a server's mixed steps of any size use. Returns
  // the steps run.
  int64_t warm_prefill_sizes();
  // LlmRunnerOptions::decode_buckets (empty: decode steps run unpadded).
  const std::vector<int64_t>& decode_buckets() const { return opt_.decode_buckets; }
  // k of the model's TopKLogits outputs; 0 when it has none.
  int32_t top_logits_k() const { return top_k_; }
  // Entries of a logits row.
  int32_t vocab() const { return vocab_; }

  const KvCacheManager& kv() const { return *kv_; }
  // The pool, for a caller that manages its own sequences (the executor).
  KvCacheManager& kv_manager() { return *kv_; }
  // Tensor-parallel rank `rank`'s pool (its K/V heads); rank 0 for an unsharded model.
  KvStorage& rank_storage(int rank) { return *storages_.at(size_t(rank)); }
  const Model& model() const { return model_; }
  // The dtype of this runner's pool: LlmRunnerOptions::kv_dtype, else the model's.
  KvDType kv_dtype() const { return opt_.kv_dtype.value_or(model_.kv_dtype()); }
  int32_t context_length(int32_t seq) const;

 private:
  struct Seq {
    KvSequence kv;
    std::vector<int32_t> pending;
  };
  // pad_decode: a pure decode step may run padded to its bucket (the outputs asked for
  // must then have one row per logit row).
  TensorMap run_parts(std::span<const StepChunk> chunks, bool all_logits, const std::vector<std::string>& outputs,
                      int32_t top_k = 0, bool pad_decode = true);
  // Runs one step of these inputs on every rank; `rows` are the logit rows.
  TensorMap run_step(const Tensor& tokens, const Tensor& positions, const std::vector<int32_t>& rows,
                     const StepInfo& step, const std::vector<std::string>& outputs);
  // The outputs an executor's step fetches: TopKLogits' when the model has them, else logits.
  std::vector<std::string> step_outputs() const;
  // The bucket a decode step of `rows` rows is padded to (rows when none).
  int64_t decode_bucket(int64_t rows) const;
  // Appends `pad` pad rows (decode_buckets) to a step's inputs.
  void add_pad_rows(int64_t pad, Tensor& tokens, Tensor& positions, StepInfo& step, std::vector<int32_t>& rows) const;
  Seq& get(int32_t seq);
  const Seq& get(int32_t seq) const;

  // The pool's block count from the options (and the device's free memory).
  int32_t pool_blocks() const;
  // Runs the compiled graph of every rank on the same inputs; rank 0's outputs.
  TensorMap run_ranks(const TensorMap& inputs, const StepInfo& step, const std::vector<std::string>& outputs);

  Model& model_;
  LlmRunnerOptions opt_;
  std::vector<Model*> ranks_;                     // model_ and its tensor-parallel peers
  std::vector<std::unique_ptr<KvStorage>> storages_;  // one per rank
  std::unique_ptr<KvStorage> mirror_;             // > 1 rank: copy_block on every storage
  std::unique_ptr<KvCacheManager> kv_;
  std::map<int32_t, Seq> seqs_;
  int32_t next_id_ = 0;
  int32_t top_k_ = 0, vocab_ = 0;
  void next_chunks(std::vector<int32_t>& ids, std::vector<StepChunk>& chunks);
  void consume_chunks(const std::vector<int32_t>& ids, const std::vector<StepChunk>& chunks);
};

int32_t argmax(const float* x, int64_t n);

}  // namespace kiln
