// Metrics (see metrics.h).
#include "server/metrics.h"

#include <cstdio>

#include "core/host_memory.h"
#include "core/status.h"
#include "server/model_repository.h"

namespace kiln::server {

void Histogram::observe(double v) {
  for (size_t i = 0; i < kBuckets.size(); ++i)
    if (v <= kBuckets[i]) ++counts_[i];
  ++count_;
  sum_ += v;
}

static std::string num(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& labels) const {
  for (size_t i = 0; i < kBuckets.size(); ++i)
    out += name + "_bucket{" + labels + ",le=\"" + num(kBuckets[i]) + "\"} " + std::to_string(counts_[i]) + "\n";
  out += name + "_bucket{" + labels + ",le=\"+Inf\"} " + std::to_string(count_) + "\n";
  out += name + "_sum{" + labels + "} " + num(sum_) + "\n";
  out += name + "_count{" + labels + "} " + std::to_string(count_) + "\n";
}

void Metrics::count_request(const std::string& model, const std::string& endpoint, int status) {
  std::lock_guard lk(mu_);
  ++requests_[{model, endpoint, status}];
}
void Metrics::observe_ttft(const std::string& model, double s) {
  std::lock_guard lk(mu_);
  ttft_[model].observe(s);
}
void Metrics::observe_tpot(const std::string& model, double s) {
  std::lock_guard lk(mu_);
  tpot_[model].observe(s);
}
void Metrics::observe_e2e(const std::string& model, double s) {
  std::lock_guard lk(mu_);
  e2e_[model].observe(s);
}
void Metrics::add_tokens(const std::string& model, int64_t prompt, int64_t completion) {
  std::lock_guard lk(mu_);
  tokens_[model].first += prompt;
  tokens_[model].second += completion;
}

// Label values are model names and fixed endpoint strings; quotes and backslashes in
// a model name are escaped all the same.
static std::string label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

// A per-model series read from a stats struct at scrape time.
template <typename Stats>
struct Series {
  const char* name;
  const char* type;
  const char* help;
  double (*get)(const Stats&);
};

// Each series' HELP/TYPE lines, then one sample per model.
template <typename Stats, size_t N>
void render_series(std::string& out, const Series<Stats> (&series)[N],
                   const std::vector<std::pair<std::string, Stats>>& stats) {
  for (const Series<Stats>& s : series) {
    out += std::string("# HELP ") + s.name + " " + s.help + "\n# TYPE " + s.name + " " + s.type + "\n";
    for (auto& [name, st] : stats) out += std::string(s.name) + "{model=\"" + label(name) + "\"} " + num(s.get(st)) + "\n";
  }
}

std::string Metrics::render(const ModelRepository& repo) const {
  std::string out;
  std::lock_guard lk(mu_);
  out += "# HELP kiln_requests_total HTTP requests by model, endpoint and status code.\n"
         "# TYPE kiln_requests_total counter\n";
  for (auto& [k, v] : requests_)
    out += "kiln_requests_total{model=\"" + label(std::get<0>(k)) + "\",endpoint=\"" + std::get<1>(k) +
           "\",status=\"" + std::to_string(std::get<2>(k)) + "\"} " + std::to_string(v) + "\n";
  auto hist = [&](const char* name, const char* help, const std::map<std::string, Histogram>& h) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " histogram\n";
    for (auto& [m, x] : h) x.render(out, name, "model=\"" + label(m) + "\"");
  };
  hist("kiln_time_to_first_token_seconds", "Request received to first generated token.", ttft_);
  hist("kiln_time_per_output_token_seconds", "Mean gap between output tokens after the first, per request.", tpot_);
  hist("kiln_e2e_request_latency_seconds", "Request received to last token.", e2e_);
  out += "# HELP kiln_prompt_tokens_total Prompt tokens of finished requests.\n# TYPE kiln_prompt_tokens_total counter\n";
  for (auto& [m, t] : tokens_) out += "kiln_prompt_tokens_total{model=\"" + label(m) + "\"} " + std::to_string(t.first) + "\n";
  out += "# HELP kiln_generation_tokens_total Generated tokens of finished requests.\n# TYPE kiln_generation_tokens_total counter\n";
  for (auto& [m, t] : tokens_) out += "kiln_generation_tokens_total{model=\"" + label(m) + "\"} " + std::to_string(t.second) + "\n";

  static const Series<ExecutorStats> series[] = {
      {"kiln_num_requests_waiting", "gauge", "Sequences waiting for admission (queue depth).", [](const ExecutorStats& s) { return double(s.waiting); }},
      {"kiln_num_requests_running", "gauge", "Sequences admitted and running.", [](const ExecutorStats& s) { return double(s.running); }},
      {"kiln_batch_size", "gauge", "Sequences in the last engine step.", [](const ExecutorStats& s) { return double(s.last_batch_seqs); }},
      {"kiln_kv_blocks_total", "gauge", "KV cache blocks in the pool.", [](const ExecutorStats& s) { return double(s.kv_blocks_total); }},
      {"kiln_kv_blocks_free", "gauge", "KV cache blocks on the free list.", [](const ExecutorStats& s) { return double(s.kv_blocks_free); }},
      {"kiln_kv_blocks_used", "gauge", "KV cache blocks held by sequences, sessions or the prefix cache.", [](const ExecutorStats& s) { return double(s.kv_blocks_total - s.kv_blocks_free); }},
      {"kiln_kv_blocks_cached", "gauge", "KV cache blocks registered in the prefix cache.", [](const ExecutorStats& s) { return double(s.kv_blocks_cached); }},
      {"kiln_prefix_cache_queries_total", "counter", "Full prompt blocks looked up in the prefix cache.", [](const ExecutorStats& s) { return double(s.prefix_queried_blocks); }},
      {"kiln_prefix_cache_hits_total", "counter", "Prompt blocks found in the prefix cache.", [](const ExecutorStats& s) { return double(s.prefix_hit_blocks); }},
      {"kiln_prefix_cache_hit_rate", "gauge", "Prefix cache hits / queries since start.", [](const ExecutorStats& s) { return s.prefix_queried_blocks ? double(s.prefix_hit_blocks) / double(s.prefix_queried_blocks) : 0.0; }},
      {"kiln_prefix_cache_evictions_total", "counter", "Cached blocks evicted (LRU).", [](const ExecutorStats& s) { return double(s.prefix_evicted_blocks); }},
      {"kiln_sessions", "gauge", "Sessions holding KV blocks.", [](const ExecutorStats& s) { return double(s.sessions); }},
      {"kiln_session_hits_total", "counter", "Requests that reused their session's KV.", [](const ExecutorStats& s) { return double(s.session_hits); }},
      {"kiln_session_misses_total", "counter", "Requests whose session was not held.", [](const ExecutorStats& s) { return double(s.session_misses); }},
      {"kiln_session_evictions_total", "counter", "Sessions evicted under memory pressure.", [](const ExecutorStats& s) { return double(s.session_evictions); }},
      {"kiln_session_expiries_total", "counter", "Sessions expired after the idle timeout.", [](const ExecutorStats& s) { return double(s.session_expiries); }},
      {"kiln_preemptions_total", "counter", "Sequences preempted for lack of KV blocks (recomputed or swapped to host memory).", [](const ExecutorStats& s) { return double(s.preemptions); }},
      {"kiln_kv_swapped_out_total", "counter", "Preempted sequences whose KV blocks were copied to host swap space.", [](const ExecutorStats& s) { return double(s.swapped_out); }},
      {"kiln_kv_swapped_in_total", "counter", "Swapped-out sequences resumed with their KV copied back.", [](const ExecutorStats& s) { return double(s.swapped_in); }},
      {"kiln_kv_swap_out_bytes_total", "counter", "Bytes of KV copied to host swap space.", [](const ExecutorStats& s) { return double(s.swap_out_bytes); }},
      {"kiln_kv_swap_in_bytes_total", "counter", "Bytes of KV copied back from host swap space (blocks re-shared from the prefix cache are not copied).", [](const ExecutorStats& s) { return double(s.swap_in_bytes); }},
      {"kiln_kv_swap_fallbacks_total", "counter", "Preemptions in swap mode that recomputed because the swap space was full.", [](const ExecutorStats& s) { return double(s.swap_fallbacks); }},
      {"kiln_kv_swap_blocks_total", "gauge", "Host swap space, in KV blocks (0 unless --preemption swap).", [](const ExecutorStats& s) { return double(s.swap_blocks_total); }},
      {"kiln_kv_swap_blocks_used", "gauge", "Host swap space blocks holding swapped-out KV.", [](const ExecutorStats& s) { return double(s.swap_blocks_used); }},
      {"kiln_engine_steps_total", "counter", "Engine steps run.", [](const ExecutorStats& s) { return double(s.steps); }},
      {"kiln_top_logits_steps_total", "counter", "Engine steps that sampled from the top-k candidates (only [rows, k] left the device).", [](const ExecutorStats& s) { return double(s.top_logits_steps); }},
      {"kiln_engine_step_tokens_total", "counter", "Tokens fed through engine steps (prefill + decode).", [](const ExecutorStats& s) { return double(s.step_tokens); }},
      {"kiln_spec_decode_draft_tokens_total", "counter", "Prompt-lookup draft tokens fed to engine steps (serve --lookup).", [](const ExecutorStats& s) { return double(s.spec_draft_tokens); }},
      {"kiln_spec_decode_accepted_tokens_total", "counter", "Draft tokens that equalled the model's own next token and were emitted.", [](const ExecutorStats& s) { return double(s.spec_accepted_tokens); }},
  };
  std::vector<std::pair<std::string, ExecutorStats>> stats;
  for (auto& m : repo.models())
    if (m->executor) stats.emplace_back(m->name, m->executor->stats());
  render_series(out, series, stats);
  // Encoders: the batcher's counters (mean sequences per forward = sequences / forwards).
  static const Series<EncoderBatcherStats> enc_series[] = {
      {"kiln_encoder_forwards_total", "counter", "Encoder forwards run (each a batch of queued sequences).", [](const EncoderBatcherStats& s) { return double(s.forwards); }},
      {"kiln_encoder_sequences_total", "counter", "Sequences through encoder forwards.", [](const EncoderBatcherStats& s) { return double(s.sequences); }},
      {"kiln_encoder_tokens_total", "counter", "Tokens through encoder forwards.", [](const EncoderBatcherStats& s) { return double(s.tokens); }},
      {"kiln_encoder_largest_batch", "gauge", "Most sequences in one encoder forward since start.", [](const EncoderBatcherStats& s) { return double(s.largest_batch); }},
      {"kiln_encoder_queue_sequences", "gauge", "Sequences waiting for an encoder forward.", [](const EncoderBatcherStats& s) { return double(s.queued); }},
      {"kiln_encoder_running_sequences", "gauge", "Sequences in the encoder forward running now.", [](const EncoderBatcherStats& s) { return double(s.running); }},
      {"kiln_encoder_failed_requests_total", "counter", "Encoder requests whose forward failed.", [](const EncoderBatcherStats& s) { return double(s.failed_requests); }},
      {"kiln_encoder_cancelled_requests_total", "counter", "Encoder requests withdrawn (their client hung up).", [](const EncoderBatcherStats& s) { return double(s.cancelled_requests); }},
      {"kiln_encoder_busy_seconds_total", "counter", "Time spent in encoder forwards.", [](const EncoderBatcherStats& s) { return s.busy_seconds; }},
  };
  std::vector<std::pair<std::string, EncoderBatcherStats>> enc_stats;
  for (auto& m : repo.models())
    if (m->batcher) enc_stats.emplace_back(m->name, m->batcher->stats());
  render_series(out, enc_series, enc_stats);
  out += "# HELP kiln_executor_seconds_total Executor time by phase (emit: update callbacks on the emitter thread, overlapping the next step).\n# TYPE kiln_executor_seconds_total counter\n";
  for (auto& [name, st] : stats) {
    const std::pair<const char*, double> phases[] = {
        {"schedule", st.schedule_s}, {"engine", st.engine_s}, {"sample", st.sample_s}, {"emit", st.emit_s}};
    for (auto& [phase, v] : phases)
      out += "kiln_executor_seconds_total{model=\"" + label(name) + "\",phase=\"" + phase + "\"} " + num(v) + "\n";
  }
  // The process (the Prometheus client libraries' standard names for resident memory, CPU
  // and start time; anonymous memory is what weights, panels and host KV hold). A value
  // /proc could not give (< 0) is left out.
  auto process = [&](const char* name, const char* type, const char* help, double v, bool integer) {
    if (v < 0) return;
    out += str_cat("# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n", name, " ",
                   integer ? std::to_string(int64_t(v)) : std::to_string(v), "\n");
  };
  const HostMemory mem = host_memory();
  const ProcessTimes times = process_times();
  process("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", double(mem.resident), true);
  process("kiln_host_anonymous_memory_bytes", "gauge", "Resident anonymous memory (not mapped files) in bytes.",
          double(mem.anon), true);
  process("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.", times.cpu_seconds,
          false);
  process("process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.",
          times.start_time, false);
  return out;
}

}  // namespace kiln::server
