// `kiln serve`: loads models (paths or a repository folder) and serves them over HTTP
// (OpenAI + KServe v2, see src/server/server.h) until SIGINT/SIGTERM, then drains.
// Tested by tests/server/ (in-process) and tests/tools/cli_test.sh.
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "commands.h"
#include "core/mapped_file.h"
#include "core/status.h"
#include "runtime/ngram_draft.h"
#include "server/bench_client.h"
#include "server/server.h"

namespace kiln::cli {

namespace {

struct ServeArgs {
  std::vector<std::string> models;
  std::string repo;
  std::string backend = "cpu";
  std::string weight_dtype = "auto";
  std::string kv_cache_dtype = "auto";
  std::string kv_calib = "default";
  std::string kv_rotate = "on";
  std::string tactic_cache;  // ModelOptions::tactic_cache
  int64_t max_context = 0;   // ModelOptions::max_context
  std::string host = "127.0.0.1";
  int port = 8000;
  std::vector<std::string> api_keys;
  int64_t kv_tokens = 16384;
  bool kv_tokens_given = false;
  double kv_fraction = 0;
  std::string preemption = "recompute";
  int64_t swap_space_mib = 4096;
  int block_size = 16;
  int64_t max_step_tokens = 512;
  int max_running = 64;
  std::string policy = "fcfs";
  bool no_prefix_cache = false;
  double session_timeout_s = 30;
  size_t max_body_bytes = 1 << 20;
  int max_tokens = 4096;
  int http_threads = 128;
  std::string instance;
  std::string reasoning_parser = "none";
  std::string tool_parser = "auto";
  std::string chat_template;  // a file or the template's text; "" = each model's own
  int drain_timeout_s = 30;
  int tp = 0;  // not given: an engine's own ranks, else 1
  bool tune_batch_sizes = false;  // ModelOptions::step_tuning
  std::string decode_padding = "auto";  // ExecutorOptions::decode_padding
  int lookup = 0;                        // ExecutorOptions::lookup_drafts
  int lookup_min_n = ExecutorOptions{}.lookup_min_n, lookup_max_n = ExecutorOptions{}.lookup_max_n;
  int lookup_max_batch = 0;  // ExecutorOptions::lookup_max_batch
  EncoderBatcherOptions encoder;         // encoders' dynamic batching
  int64_t encoder_delay_us = 0;
};

std::atomic<int> g_signal{0};
extern "C" void on_signal(int sig) { g_signal = sig; }

int run_serve(const ServeArgs& a) {
  if (a.models.empty() && a.repo.empty())
    throw_error(ErrorCode::kInvalidArgument, "serve needs -m PATH (or NAME=PATH) or --model-repo DIR");
  ExecutorOptions eo;
  eo.kv_tokens = a.kv_tokens;
  eo.kv_cache_fraction = a.kv_fraction;
  // With the fraction, --kv-tokens caps the pool only when it is given.
  if (a.kv_fraction > 0 && !a.kv_tokens_given) eo.kv_tokens = 0;
  eo.preemption = a.preemption == "swap" ? PreemptionMode::kSwap : PreemptionMode::kRecompute;
  eo.swap_space_bytes = a.swap_space_mib << 20;
  eo.block_size = a.block_size;
  eo.max_step_tokens = a.max_step_tokens;
  eo.max_running = a.max_running;
  eo.policy = a.policy == "priority" ? SchedulePolicy::kPriority : SchedulePolicy::kFcfs;
  eo.prefix_caching = !a.no_prefix_cache;
  eo.session_idle_timeout = std::chrono::milliseconds(int64_t(a.session_timeout_s * 1000));
  eo.decode_padding = a.decode_padding == "on"    ? DecodePadding::kOn
                      : a.decode_padding == "off" ? DecodePadding::kOff
                                                  : DecodePadding::kAuto;
  eo.lookup_drafts = a.lookup;
  eo.lookup_min_n = a.lookup_min_n;
  eo.lookup_max_n = a.lookup_max_n;
  eo.lookup_max_batch = a.lookup_max_batch;
  ModelOptions mo{a.backend, a.weight_dtype};
  mo.tensor_parallel = a.tp;
  mo.kv_cache_dtype = a.kv_cache_dtype;
  mo.kv_calib = a.kv_calib;
  mo.kv_rotate = a.kv_rotate == "on";
  mo.step_tuning = a.tune_batch_sizes;
  mo.tactic_cache = a.tactic_cache;
  mo.max_context = a.max_context;
  mo.lean_host_weights = true;
  EncoderBatcherOptions enc = a.encoder;
  enc.max_queue_delay = std::chrono::microseconds(a.encoder_delay_us);
  server::ModelRepository repo(mo, eo, enc);
  for (const std::string& m : a.models) {
    size_t eq = m.find('=');
    if (eq != std::string::npos) repo.add(m.substr(eq + 1), m.substr(0, eq));
    else repo.add(m);
  }
  if (!a.repo.empty()) repo.add_directory(a.repo);
  if (!a.chat_template.empty()) {
    // vLLM's --chat-template: a file, or the template's own text.
    const bool file = std::filesystem::is_regular_file(a.chat_template);
    if (!file && a.chat_template.find("{{") == std::string::npos && a.chat_template.find("{%") == std::string::npos)
      throw_error(ErrorCode::kInvalidArgument, "--chat-template: no file '", a.chat_template,
                  "' (give a Jinja template's file or its text)");
    const std::string text = file ? read_text_file(a.chat_template) : a.chat_template;
    try {
      for (auto& m : repo.models())
        if (m->executor) m->chat_template = std::make_unique<tok::ChatTemplate>(text);
    } catch (const Error& e) {
      throw_error(e.code(), "--chat-template: ", e.what());
    }
  }

  server::ServerOptions so;
  so.host = a.host;
  so.port = a.port;
  so.api_keys = a.api_keys;
  if (const char* k = std::getenv("KILN_API_KEY"); k && *k) so.api_keys.push_back(k);
  so.max_body_bytes = a.max_body_bytes;
  so.limits.max_tokens = a.max_tokens;
  so.http_threads = a.http_threads;
  so.instance_name = a.instance;
  so.reasoning_parser = a.reasoning_parser != "none";
  so.tool_parser = server::tool_parser_from_name(a.tool_parser);
  so.drain_timeout_s = a.drain_timeout_s;
  server::Server srv(repo, so);
  int port = srv.bind();
  for (auto& m : repo.models()) {
    std::string kv;
    if (m->executor) {
      const ExecutorStats s = m->executor->stats();
      kv = str_cat(", KV cache ", s.kv_blocks_total * a.block_size, " tokens, preemption by ",
                   preemption_mode_name(eo.preemption),
                   eo.preemption == PreemptionMode::kSwap ? str_cat(" (", s.swap_blocks_total, " host blocks)") : "");
    }
    if (m->executor && so.tool_parser == server::ToolParser::kAuto && m->chat_template) {
      const server::ToolParser tp = server::tool_parser_for_template(m->chat_template->source());
      kv += tp == server::ToolParser::kNone ? std::string(", no tool-call format in its chat template")
                                             : str_cat(", tool calls read as ", server::tool_parser_name(tp));
    }
    std::fprintf(stderr, "[kiln] serving '%s' (%s, %s%s%s)\n", m->name.c_str(), m->model->info().family.c_str(),
                 m->is_decoder() ? "generate" : "embed",
                 m->model->tp_world() > 1 ? str_cat(", tensor parallel over ", m->model->tp_world(), " ranks").c_str() : "",
                 kv.c_str());
  }
  std::fprintf(stderr, "[kiln] listening on http://%s:%d%s\n", a.host.c_str(), port,
               so.api_keys.empty() ? "" : " (API key required)");
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGPIPE, SIG_IGN);
  std::thread watcher([&] {
    while (g_signal == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::fprintf(stderr, "[kiln] signal %d: draining in-flight requests\n", int(g_signal));
    srv.shutdown();
  });
  srv.serve();
  if (g_signal == 0) g_signal = -1;  // the listener ended on its own
  watcher.join();
  std::fprintf(stderr, "[kiln] stopped\n");
  return 0;
}

}  // namespace

Runner add_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand("serve", "serve models over HTTP (OpenAI API, KServe v2, /metrics)");
  cmd->add_option("-m,--model", a->models, "a model to serve: PATH or NAME=PATH (repeatable); PATH random:CONFIG.json = random weights");
  cmd->add_option("--model-repo", a->repo, "a folder of models: *.gguf files and HF directories");
  cmd->add_option("--backend", a->backend, "where to run: cpu")->capture_default_str();
  cmd->add_option("--weight-dtype", a->weight_dtype, "GEMM weight storage: auto (as for generate), f32, bf16, f16, q8, q4")
      ->check(CLI::IsMember({"auto", "f32", "bf16", "f16", "q8", "q4"}))
      ->capture_default_str();
  add_tp_option(cmd, a->tp);
  add_plugin_option(cmd);
  add_max_context_option(cmd, a->max_context);
  cmd->add_option("--host", a->host, "address to bind (0.0.0.0 exposes the server)")->capture_default_str();
  cmd->add_option("--port", a->port, "TCP port")->check(CLI::Range(0, 65535))->capture_default_str();
  cmd->add_option("--api-key", a->api_keys, "require 'Authorization: Bearer KEY' (repeatable; or $KILN_API_KEY)");
  CLI::Option* kv_tokens = cmd->add_option("--kv-tokens", a->kv_tokens,
                                           "KV cache pool per model, in tokens (with --kv-cache-fraction: its cap)")
                               ->check(CLI::Range(int64_t(16), int64_t(1) << 30))
                               ->capture_default_str();
  add_kv_fraction_option(cmd, a->kv_fraction);
  add_kv_dtype_option(cmd, a->kv_cache_dtype, a->kv_calib, a->kv_rotate);
  add_tactic_cache_option(cmd, a->tactic_cache);
  cmd->add_option("--preemption", a->preemption,
                  "when KV blocks run out, a preempted sequence is recomputed later or its KV is swapped to host memory")
      ->check(CLI::IsMember({"recompute", "swap"}))
      ->capture_default_str();
  cmd->add_option("--swap-space-mib", a->swap_space_mib,
                  "host memory per model for swapped-out KV blocks (--preemption swap); when full, preemption recomputes")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 24))
      ->capture_default_str();
  cmd->add_option("--block-size", a->block_size, "KV block size in tokens")->check(CLI::Range(1, 1024))->capture_default_str();
  cmd->add_option("--max-step-tokens", a->max_step_tokens, "token budget of one engine step")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20))
      ->capture_default_str();
  cmd->add_option("--max-running", a->max_running, "sequences running at once (an n > 1 request counts n; a larger n is refused)")->check(CLI::Range(1, 1 << 16))->capture_default_str();
  cmd->add_flag("--tune-batch-sizes", a->tune_batch_sizes,
                "cuda: time GEMM tactics at each decode batch size the first time a step of that size runs, as "
                "`kiln bench` does (~50-70 ms a new size, during which every stream waits; off by default: batch "
                "sizes change with every arrival and finish)");
  cmd->add_option("--decode-padding", a->decode_padding,
                  "pad decode steps to a few batch sizes (1, 2, 4, multiples of 8, then of 16 up to 512), each captured at start-up: "
                  "auto (where steps are captured: cuda), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  // As `kiln generate --lookup`; vLLM's --speculative-config '{"method": "ngram",
  // "num_speculative_tokens": K, "prompt_lookup_min": 2, "prompt_lookup_max": 3}'.
  cmd->add_option("--lookup", a->lookup,
                  "prompt-lookup speculative decoding: greedy requests (temperature 0, no logprobs, penalties, "
                  "logit_bias or constraints) feed up to K draft tokens a step (fewer after rejected drafts), copied from "
                  "where their last few tokens occurred before in the prompt or output, and keep those equal to the "
                  "model's own; 0: off")
      ->check(CLI::Range(0, int(kMaxLookupDrafts)))
      ->capture_default_str();
  cmd->add_option("--lookup-min-n", a->lookup_min_n,
                  "with --lookup: the shortest n-gram matched (1 drafts on free text too, where few drafts hold)")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  cmd->add_option("--lookup-max-n", a->lookup_max_n, "with --lookup: the longest n-gram matched (tried first)")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  cmd->add_option("--lookup-max-batch", a->lookup_max_batch,
                  "with --lookup: no drafts in a step of more sequences than this (vLLM's disable_by_batch_size; "
                  "on 2 CPU cores drafts beside 4 or more streams cost more than they save); 0: no limit")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--encoder-max-batch-tokens", a->encoder.max_batch_tokens,
                  "encoders: tokens per forward; concurrent requests' sequences share forwards up to this (a longer "
                  "sequence runs alone)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 24))
      ->capture_default_str();
  cmd->add_option("--encoder-max-batch", a->encoder.max_batch_sequences,
                  "encoders: sequences per forward (1: one at a time, no batching across requests)")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  cmd->add_option("--encoder-batch-delay-us", a->encoder_delay_us,
                  "encoders: how long a queued sequence may wait for more to fill its forward (0: run what is queued at once)")
      ->check(CLI::Range(int64_t(0), int64_t(10000000)))
      ->capture_default_str();
  cmd->add_option("--policy", a->policy, "scheduling: fcfs or priority")
      ->check(CLI::IsMember({"fcfs", "priority"}))
      ->capture_default_str();
  cmd->add_flag("--no-prefix-cache", a->no_prefix_cache, "disable block-level prefix caching");
  cmd->add_option("--session-timeout", a->session_timeout_s, "idle seconds before a session's KV is dropped")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  cmd->add_option("--max-body-bytes", a->max_body_bytes, "largest request body")->capture_default_str();
  cmd->add_option("--max-tokens-limit", a->max_tokens, "largest max_tokens a request may ask for")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  cmd->add_option("--http-threads", a->http_threads, "connections served at once")->check(CLI::Range(4, 4096))->capture_default_str();
  cmd->add_option("--drain-timeout", a->drain_timeout_s, "seconds in-flight requests get at shutdown before they are cancelled")
      ->check(CLI::Range(0, 86400))
      ->capture_default_str();
  cmd->add_option("--instance-name", a->instance, "X-Kiln-Instance response header (default host:port)");
  cmd->add_option("--reasoning-parser", a->reasoning_parser,
                  "thinking models' chat output: think (also qwen3, deepseek_r1) carries the text between <think> and "
                  "</think> as reasoning_content beside the content; none leaves it in the content")
      ->check(CLI::IsMember({"none", "think", "qwen3", "deepseek_r1"}))
      ->capture_default_str();
  cmd->add_option("--chat-template", a->chat_template,
                  "a Jinja chat template (a file, or the template's text) for every generating model instead of "
                  "its own, as vLLM's --chat-template: e.g. one that renders tools for a model whose own does not");
  cmd->add_option("--tool-call-parser", a->tool_parser,
                  "chat requests with tools: read the model's tool calls back into message.tool_calls - auto (the "
                  "format each model's chat template shows), hermes "
                  "(<tool_call>{...}</tool_call>: Qwen2.5/3, Hermes, SmolLM3), llama3_json (Llama 3.1-3.3), mistral "
                  "([TOOL_CALLS] [...]: Mistral 7B v0.3, Nemo, Small), pythonic ([f(a=1), g()]: Llama 3.2, Llama 4) "
                  "granite (<|tool_call|> [...]: Granite 3.x), phi4_mini_json (functools[...]: Phi-4-mini) or "
                  "qwen3_xml (<function=...><parameter=...>: Qwen3-Coder); none refuses tool_choice \"auto\"")
      ->check(CLI::IsMember(
          {"auto", "none", "hermes", "llama3_json", "mistral", "pythonic", "granite", "phi4_mini_json", "qwen3_xml"}))
      ->capture_default_str();

  // `kiln serve bench` (also `kiln bench serve`): load-test a running server.
  SubRunner bench = add_serve_bench(cmd);
  return [a, bench, kv_tokens] {
    if (bench.app->parsed()) return bench.run();
    a->kv_tokens_given = kv_tokens->count() > 0;
    if (a->lookup_max_n < a->lookup_min_n)
      throw_error(ErrorCode::kInvalidArgument, "--lookup-min-n (", a->lookup_min_n, ") must not exceed --lookup-max-n (",
                  a->lookup_max_n, ")");
    return run_serve(*a);
  };
}

SubRunner add_serve_bench(CLI::App* parent) {
  // vLLM benchmark_serving-style load generator.
  auto b = std::make_shared<server::BenchOptions>();
  auto json_out = std::make_shared<std::string>();
  CLI::App* bench = parent->add_subcommand(parent->get_name() == "bench" ? "serve" : "bench",
                                           "load-test a running server: TTFT, TPOT, ITL, throughput, goodput");
  bench->add_option("--host", b->host, "server address")->capture_default_str();
  bench->add_option("--port", b->port, "server port")->capture_default_str();
  bench->add_option("--model", b->model, "model name on the server")->required();
  bench->add_option("--api-key", b->api_key, "API key, if the server wants one");
  bench->add_option("--requests", b->requests, "conversations to send")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  bench->add_option("-c,--concurrency", b->concurrency, "clients in flight")->check(CLI::Range(1, 4096))->capture_default_str();
  bench->add_option("--rate", b->rate, "Poisson arrivals per second (0: send as fast as concurrency allows)")->capture_default_str();
  bench->add_option("--input-min", b->input_min, "prompt tokens, lower bound")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  bench->add_option("--input-max", b->input_max, "prompt tokens, upper bound")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  bench->add_option("--output-min", b->output_min, "generated tokens, lower bound")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  bench->add_option("--output-max", b->output_max, "generated tokens, upper bound")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  bench->add_option("--vocab", b->vocab, "prompt ids are drawn from [10, vocab)")->check(CLI::Range(11, 1 << 24))->capture_default_str();
  bench->add_option("--prompt-repeats", b->prompt_repeats, "> 1: each prompt is one random run of ids repeated this many times (text to copy: the workload of serve --lookup)")->check(CLI::Range(1, 1000))->capture_default_str();
  bench->add_option("--turns", b->turns, "turns per conversation (each extends the last prompt + answer)")->check(CLI::Range(1, 1000))->capture_default_str();
  bench->add_option("--turn-tokens", b->turn_tokens, "new tokens per later turn")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  bench->add_flag("--sessions", b->sessions, "send a session id per conversation (KV reuse across turns)");
  bench->add_option("--ttft-target-ms", b->ttft_target_ms, "goodput TTFT target")->capture_default_str();
  bench->add_option("--tpot-target-ms", b->tpot_target_ms, "goodput TPOT target")->capture_default_str();
  bench->add_option("--seed", b->seed, "prompt and arrival seed")->capture_default_str();
  bench->add_option("--endpoint", b->endpoint,
                    "completions (streamed generation) or embeddings (encoders: --input-min/max tokens an input; the "
                    "goodput target is --ttft-target-ms on the whole request)")
      ->check(CLI::IsMember({"completions", "embeddings"}))
      ->capture_default_str();
  bench->add_option("--inputs-per-request", b->inputs_per_request, "embeddings: inputs in each request")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  bench->add_option("--json", *json_out, "also write the report as JSON to this file");
  return {bench, [b, json_out] {
    if (b->input_min > b->input_max || b->output_min > b->output_max)
      throw_error(ErrorCode::kInvalidArgument, "--input-min/--output-min must not exceed the max");
    server::BenchReport r = server::run_serve_bench(*b);
    std::fputs(r.to_text(*b).c_str(), stdout);
    if (!json_out->empty()) {
      FILE* f = std::fopen(json_out->c_str(), "w");
      if (!f) throw_error(ErrorCode::kIo, "cannot write ", *json_out);
      std::fputs(r.to_json(*b).c_str(), f);
      std::fclose(f);
    }
    return r.failed == 0 ? 0 : 1;
  }};
}

}  // namespace kiln::cli
