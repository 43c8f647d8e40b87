// llm::Executor: in-flight batching. Requests (token ids + sampling parameters) are
// submitted from any thread; one executor thread loops schedule -> one ragged engine
// step (decodes + chunked prefills) -> sample -> stream updates through callbacks.
// KV reuse through the prefix cache and sessions; when blocks run out, preemption by
// recompute or by swapping the victim's KV to a bounded host swap space. Optional
// prompt-lookup drafts for greedy choices (ExecutorOptions::lookup_drafts). Tested in
// tests/runtime/executor_test.cpp (tiny fixture models), executor_lookup_test.cpp (drafts)
// and through the server tests.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/llm_runner.h"
#include "runtime/sampling.h"
#include "runtime/scheduler/policy.h"

namespace kiln {

namespace tok {
class Tokenizer;
}
class Grammar;

enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled", "error"

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int32_t max_tokens = 16;  // 0 (with n = 1): the prompt only, ending with kLength
  int32_t n = 1;                   // choices sampled from one shared prompt prefill
  std::vector<int32_t> stop_ids;   // besides the model's end tokens
  std::vector<std::string> stop;   // stop strings (need a tokenizer)
  bool ignore_eos = false;         // do not stop at the model's end tokens
  // OpenAI's response_format {"type": "json_object"}: decoding constrained (as `grammar`
  // below) to the grammar of the JSON Schema {"type": "object"}, any one JSON object; the
  // choice ends (kStop) as soon as the object closes. Needs a tokenizer.
  bool json_object = false;
  // Constrained decoding to a grammar (runtime/grammar.h: a JSON Schema's, GBNF): every
  // token's bytes must continue a document of it; the model's end tokens (and stop_ids) are
  // allowed only where the document is complete, and the choice ends (kStop) where nothing
  // can follow. Needs a tokenizer; such requests sample from whole logits rows.
  std::shared_ptr<const Grammar> grammar;
  // >= 0: the logprob of every prompt token after the first given the tokens before it,
  // with this many top alternatives (<= 20; OpenAI's echo with logprobs, vLLM's
  // prompt_logprobs), in RequestUpdate::prompt_logprobs. The prompt is then prefilled in
  // full (no prefix-cache or session reuse) and its prefill steps bring a whole logits
  // row per prompt token to the host.
  int32_t prompt_logprobs = -1;
  int32_t priority = 0;            // larger first under SchedulePolicy::kPriority
  std::string session_id;          // keep this conversation's KV after the request
};

struct ChoiceUpdate {
  int32_t index = 0;
  std::vector<int32_t> tokens;          // newly generated
  std::string text;                     // newly released text (tokenizer present)
  std::vector<SampledToken> logprobs;   // one per new token when logprobs >= 0
  FinishReason finish = FinishReason::kNone;
};

struct RequestUpdate {
  uint64_t id = 0;
  std::vector<ChoiceUpdate> choices;
  bool done = false;       // the last update of this request
  std::string error;       // with done: why the request failed
  // GenerationRequest::prompt_logprobs: those of prompt tokens 1, 2, ... (the first has
  // none), each once, in order, as the prefill computes them.
  std::vector<SampledToken> prompt_logprobs;
  int32_t prompt_tokens = 0;
  int32_t cached_tokens = 0;  // prompt tokens whose KV came from the prefix cache/session
  int32_t completion_tokens = 0;  // with done: over all choices
};
// Called on the executor thread: keep it short (push into a queue).
using UpdateCallback = std::function<void(RequestUpdate&&)>;

// What happens to a running sequence's KV when the pool runs out of blocks.
enum class PreemptionMode {
  kRecompute,  // free its blocks; prefill its tokens again when it resumes
  kSwap,       // copy its blocks to host swap space, copy them back when it resumes
};
const char* preemption_mode_name(PreemptionMode m);  // "recompute", "swap"

// Whether decode steps run padded to a few row counts (ExecutorOptions::decode_padding).
enum class DecodePadding { kAuto, kOn, kOff };

struct ExecutorOptions {
  int32_t block_size = 16;
  // KV pool size in tokens; with kv_cache_fraction, an upper bound (0: none).
  int64_t kv_tokens = 16384;
  // > 0: size the pool from the device's free memory (LlmRunnerOptions::kv_cache_fraction).
  double kv_cache_fraction = 0;
  std::function<DeviceMemory(Backend&)> device_memory;  // tests: fakes the free memory
  PreemptionMode preemption = PreemptionMode::kRecompute;
  // kSwap: host memory for swapped-out blocks. When it is full a preemption recomputes.
  int64_t swap_space_bytes = int64_t(4) << 30;
  int64_t max_step_tokens = 512;  // token budget of one step
  int32_t max_running = 64;       // sequences running at once (an n > 1 request counts n)
  SchedulePolicy policy = SchedulePolicy::kFcfs;
  bool prefix_caching = true;
  std::chrono::milliseconds session_idle_timeout{30000};
  int32_t max_sessions = 4096;
  uint64_t seed = 0x6b696c6e;  // requests without a seed draw theirs from this
  // Steps whose every sampled row can be drawn exactly from the model's TopKLogits
  // candidates (Sampler::samples_from_top) fetch those instead of whole logits rows.
  bool top_logits = true;
  // Logits a step's samplers read at least before they run on the thread pool, a row per
  // task (about two rows of a 128K vocabulary by default). Waking the pool after an engine
  // step costs ~0.3-0.5 ms, while 64 rows of top candidates take ~3 us on the executor's
  // thread. 0: always the pool (tests).
  size_t parallel_sample_values = size_t(1) << 18;
  // Decode steps padded to decode_row_buckets(max_running) (LlmRunnerOptions::
  // decode_buckets); kAuto: where the backend captures steps (CompiledGraph::
  // captures_steps, CUDA graphs), so that the first step at each new batch size does
  // not run eagerly and stall every stream (2-15 ms on the H200 at the 1B shape).
  DecodePadding decode_padding = DecodePadding::kAuto;
  // With padding: run every bucket's steps, and prefills of each power of two up to
  // max_step_tokens, once the model is loaded, before the first request
  // (LlmRunner::warm_decode_buckets, warm_prefill_sizes).
  bool warm_decode = true;
  // Prompt-lookup speculative decoding (vLLM's speculative method "ngram"): each step, a
  // decoding choice whose sampling is a plain argmax (greedy; no logprobs, logit_bias,
  // penalties or grammar) feeds up to lookup_drafts tokens copied from where its last
  // n-gram (n from lookup_max_n down to lookup_min_n) occurred before in its prompt and
  // output (runtime/ngram_draft.h), and keeps those that equal the model's own argmax;
  // each choice's draft length then follows next_draft_length (down by 1 after a step that
  // rejected a draft, back up by 2 to lookup_drafts after one that kept all). The output
  // is plain greedy decoding's (on the CPU backend; CUDA's GEMM rounding depends on a
  // step's row count). Drafts only take step tokens and KV blocks that are left over: they
  // never preempt or evict. 0: off.
  int32_t lookup_drafts = 0;
  int32_t lookup_min_n = 2, lookup_max_n = 3;
  // false: every step drafts up to lookup_drafts (no next_draft_length schedule).
  bool lookup_adaptive = true;
  // > 0: no drafts in a step of more sequences than this (vLLM's disable_by_batch_size):
  // where a verify row costs about what a decode row does (a CPU), drafts beside other
  // sequences cost more than they save. 0: no limit.
  int32_t lookup_max_batch = 0;
};

struct ExecutorStats {
  int64_t waiting = 0, running = 0;
  int64_t kv_blocks_total = 0, kv_blocks_free = 0, kv_blocks_cached = 0;
  int64_t prefix_queried_blocks = 0, prefix_hit_blocks = 0, prefix_evicted_blocks = 0;
  int64_t sessions = 0, session_hits = 0, session_misses = 0, session_evictions = 0,
          session_expiries = 0;
  int64_t preemptions = 0, steps = 0, step_tokens = 0, generated_tokens = 0;
  // Preemption by swap: sequences swapped out / back in, the bytes copied each way (the
  // blocks re-shared from the prefix cache on the way in are not copied), swap-mode
  // preemptions that recomputed instead (the swap space was full), and the swap space's
  // slots (one block each).
  int64_t swapped_out = 0, swapped_in = 0, swap_out_bytes = 0, swap_in_bytes = 0, swap_fallbacks = 0;
  int64_t swap_blocks_total = 0, swap_blocks_used = 0;
  int64_t top_logits_steps = 0;  // steps that sampled from TopKLogits candidates
  // ExecutorOptions::lookup_drafts: draft tokens fed to steps, and those kept (equal to
  // the model's argmax at their position, and emitted: not past the end of their choice).
  int64_t spec_draft_tokens = 0, spec_accepted_tokens = 0;
  int64_t last_batch_seqs = 0;
  int64_t running_peak = 0;  // the most sequences running at once so far (<= max_running)
  // Executor-thread time by phase (where a step's time goes): scheduling (admit, plan,
  // preempt), the engine step, sampling + stop checks; and the emitter thread's time in
  // consumers' update callbacks (overlapping the next step, not part of it).
  double schedule_s = 0, engine_s = 0, sample_s = 0, emit_s = 0;
  int64_t requests_finished = 0, requests_cancelled = 0, requests_failed = 0;
};

struct GenerationResult {
  struct Choice {
    std::vector<int32_t> tokens;
    std::string text;
    std::vector<SampledToken> logprobs;
    FinishReason finish = FinishReason::kNone;
  };
  std::vector<Choice> choices;
  std::vector<SampledToken> prompt_logprobs;  // GenerationRequest::prompt_logprobs
  std::string error;
  int32_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
};

class Executor {
 public:
  // `tokenizer` may be null (token ids only: no text, no stop strings).
  Executor(Model& model, const tok::Tokenizer* tokenizer, const ExecutorOptions& options = {});
  ~Executor();  // cancels what is left and joins the thread

  // Thread-safe. Throws kiln::Error (kInvalidArgument, kOutOfRange) for a request that
  // can never run; otherwise every request ends with exactly one update with done.
  uint64_t submit(GenerationRequest request, UpdateCallback on_update);
  // Thread-safe; a no-op for unknown or finished requests.
  void cancel(uint64_t id);
  // submit() and wait for the end.
  GenerationResult generate(GenerationRequest request);
  // Refuses new requests (kUnsupported) and waits until in-flight ones end; after
  // `timeout` the rest are cancelled (each still gets its final update). Returns false
  // when it had to cancel.
  bool drain(std::chrono::milliseconds timeout = std::chrono::hours(24 * 365));
  // Cancels every queued and running request (thread-safe).
  void cancel_all();
  ExecutorStats stats() const;
  const ExecutorOptions& options() const { return opt_; }
  const ModelInfo& model_info() const;
  // Longest prompt + max_tokens a request may ask for.
  int64_t max_context() const;

 private:
  struct Choice;
  struct Request;
  struct Impl;
  struct Emitter;
  void loop();

  ExecutorOptions opt_;
  std::unique_ptr<Impl> impl_;  // owned by the executor thread
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::vector<std::unique_ptr<Request>> inbox_;
  std::vector<uint64_t> cancels_;
  bool stop_ = false;
  bool cancel_all_ = false;
  bool draining_ = false;
  int64_t in_flight_ = 0;
  uint64_t next_id_ = 1;
  ExecutorStats stats_;
  std::thread thread_;
};

}  // namespace kiln
