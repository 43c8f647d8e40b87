// `kiln bench`: llama-bench-style prefill (pp) and decode (tg) throughput of a model
// or of real shapes with random weights, next to this machine's measured memory
// bandwidth, which bounds batch-1 decoding. Prints a markdown table.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <set>

#include "commands.h"
#include "runtime/encoder_runner.h"
#include "core/host_memory.h"
#include "core/status.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "runtime/llm_runner.h"

namespace kiln::cli {

namespace {

struct BenchArgs {
  ModelArgs model;
  std::string random_config;
  int prompt_len = 128;
  int gen_len = 32;
  int batch = 1;
  int repeats = 3;
  bool hidden = false;  // encoders: fetch every token's hidden state too
  double kv_fraction = 0;
};

// The weights as the table's header names them: the quantization mode, the dtype asked
// for, or for auto what it resolved to on this backend ("auto (bf16)").
std::string weights_label(const ModelArgs& m, const Model& model) {
  if (!m.quant.mode.empty()) return m.quant.mode;
  if (m.weight_dtype != "auto") return m.weight_dtype;
  // auto: the Linears that keep a file's codes, then the rest.
  const std::string kept = kept_linear_formats(model.graph());
  return "auto (" + (kept.empty() ? "" : kept + ", the rest ") + model.compile_options().weight_dtype + ")";
}

// Bytes of weights a decode step reads: the backend's stored weights less the token
// embedding tables that no Linear shares, of which a step reads only its tokens' rows (a
// tied table is the LM head's weight, read whole). The CPU backend does not count them
// (weight_bytes_of 0); CUDA does.
double step_weight_bytes(Model& model) {
  const CompiledGraph& cg = model.compiled();
  double bytes = double(cg.weight_bytes());
  const ir::Graph& g = model.graph();
  std::set<ir::ValueId> linear_weights;
  for (const ir::Node& n : g.nodes())
    if (n.op == "Linear" && n.inputs.size() > 1) linear_weights.insert(n.inputs[1]);
  for (const ir::Node& n : g.nodes())
    if (n.op == "Embedding" || n.op == "EmbeddingLayerNorm")
      // The token table: the first weight input (EmbeddingLayerNorm's position and type
      // tables follow; their rows are few and counted as read).
      for (ir::ValueId v : n.inputs)
        if (v != ir::kNoValue && g.is_weight(v)) {
          if (!linear_weights.count(v)) bytes -= double(cg.weight_bytes_of(v));
          break;
        }
  return std::max(bytes, 0.0);
}

using Clock = std::chrono::steady_clock;
double secs(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
// The model's load time (and where it went: Model::load_times) and what the process holds
// in host memory once it is loaded: anonymous memory (weights, packed panels, KV pool) and
// resident pages of mapped files.
void print_load(double load_s, const Model& model) {
  const HostMemory m = host_memory();
  const Model::LoadTimes& t = model.load_times();
  std::printf("load: %.2f s (read %.2f, passes %.2f, packing %.2f, compile %.2f)", load_s, t.read, t.passes, t.pack,
              t.compile);
  if (m.anon >= 0 && m.file >= 0 && m.peak >= 0)
    std::printf("; host memory after load: %.0f MiB anonymous + %.0f MiB of mapped files resident, peak %.0f MiB",
                double(m.anon) / (1 << 20), double(m.file) / (1 << 20), double(m.peak) / (1 << 20));
  std::printf("\n");
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Read + write bandwidth of a triad a[i] = b[i] + s*c[i] over buffers far larger than
// the last-level cache, on all threads (STREAM's rule: count 3 x 8 bytes per element... here f32).
double measure_triad_gbs() {
  const int64_t n = int64_t(64) << 20;  // 256 MiB per array
  Tensor a(DType::kF32, {n}), b(DType::kF32, {n}), c(DType::kF32, {n});
  auto& pool = ThreadPool::global();
  auto run = [&] {
    pool.parallel_for(n, [&](int64_t s, int64_t e, int) {
      float* pa = a.data_as<float>();
      const float* pb = b.data_as<float>();
      const float* pc = c.data_as<float>();
      for (int64_t i = s; i < e; ++i) pa[i] = pb[i] + 1.5f * pc[i];
    }, 1 << 16);
  };
  run();  // first touch
  std::vector<double> t;
  for (int r = 0; r < 5; ++r) {
    auto t0 = Clock::now();
    run();
    t.push_back(secs(t0, Clock::now()));
  }
  return 3.0 * 4.0 * double(n) / median(t) / 1e9;
}

// Parameters of the graph's Linears (weights held by the graph, [N, K] or packed with
// their weight_n / weight_k); skip_vocab leaves out an LM head (vocab rows), which a
// prefill runs on its last rows only.
double linear_params(Model& model, bool skip_vocab) {
  const ir::Graph& g = model.graph();
  double params = 0;
  for (const ir::Node& n : g.nodes())
    if (n.op == "Linear" && n.inputs.size() > 1 && g.is_weight(n.inputs[1])) {
      const Tensor& w = g.weight(n.inputs[1]);
      const bool packed = n.has_attr("weight_layout");
      if (!packed && w.rank() != 2) continue;
      const int64_t rows = packed ? n.attr_int("weight_n") : w.dim(0), k = packed ? n.attr_int("weight_k") : w.dim(1);
      if (!(skip_vocab && rows == model.info().vocab_size)) params += double(rows) * double(k);
    }
  return params;
}

// A rate as a share of its ceiling ("83%"), or blank where that was not measured.
std::string share(double rate, double ceiling) {
  return ceiling > 0 ? str_cat(int(100.0 * rate / ceiling + 0.5), "%") : std::string();
}

// The CUDA ceilings line (kiln bench measures them before timing the model).
void print_ceilings(const Backend::Ceilings& c, const std::string& backend) {
  if (c.copy_gbs > 0)
    std::printf("ceilings (measured in this run): device-to-device copy %.0f GB/s (read + write), bf16 GEMM "
                "8192^3 %.0f TFLOP/s\n\n", c.copy_gbs, c.gemm_tflops);
  else
    std::printf("ceilings: not measured (too little free memory on the %s device for their buffers)\n\n",
                backend.c_str());
}

// Encoders: one forward of `batch` sequences of prompt_len random tokens (one ragged step).
int run_encoder_bench(const BenchArgs& a, Model& model, double load_s) {
  const ModelInfo& info = model.info();
  if (a.prompt_len > info.max_positions)
    throw_error(ErrorCode::kInvalidArgument, "sequence length ", a.prompt_len, " exceeds the model's ",
                info.max_positions, " positions");
  KILN_THROW_IF(info.vocab_size < 1, kInvalidArgument, "model has no vocabulary (vocab_size ", info.vocab_size, ")");
  std::mt19937 rng(7);
  // Past the first 1000 ids (a WordPiece vocabulary's special and unused tokens) where the
  // vocabulary is larger than that; every id of a smaller one.
  const int32_t first = info.vocab_size > 2000 ? 1000 : 0;
  std::uniform_int_distribution<int32_t> tok(first, int32_t(info.vocab_size - 1));
  std::vector<EncoderInput> batch(size_t(a.batch));
  for (auto& in : batch)
    for (int i = 0; i < a.prompt_len; ++i) in.tokens.push_back(tok(rng));
  const bool on_cpu = a.model.backend == "cpu";
  const Backend::Ceilings ceil = on_cpu ? Backend::Ceilings{} : model.backend().measure_ceilings();
  std::vector<double> t;
  for (int r = 0; r < a.repeats + 1; ++r) {  // repeat 0 warms up
    auto t0 = Clock::now();
    encode(model, batch, {.hidden = a.hidden});
    if (r > 0) t.push_back(secs(t0, Clock::now()));
  }
  const double s = median(t);
  auto [lo, hi] = std::minmax_element(t.begin(), t.end());
  std::printf("model: %s (%s, %lld layers, hidden %lld), weights %s %.1f MiB as stored, %d threads\n",
              model.path().c_str(), info.family.c_str(), (long long)info.num_layers, (long long)info.hidden_size,
              weights_label(a.model, model).c_str(),
              double(model.compiled().weight_bytes()) / (1 << 20), ThreadPool::global().num_threads());
  print_load(load_s, model);
  std::printf("outputs to the host: %s\n", a.hidden ? "hidden states, pooled, logits" : "pooled, logits (--hidden adds hidden states)");
  if (on_cpu) std::printf("\n");
  else print_ceilings(ceil, a.model.backend);
  // Every Linear on every token, plus attention over the whole sequence (QK^T and PV: 4 d
  // flops per key per head).
  const double p = a.prompt_len;
  const double flops = a.batch * (2.0 * linear_params(model, false) * p +
                                  4.0 * double(info.head_dim * info.num_heads * info.num_layers) * p * p);
  const double tflops = flops / s / 1e12;
  std::printf("| test | batch | seq len | ms per forward | spread (min-max ms) | sequences/s | TFLOP/s | %% of GEMM |\n"
              "|---|---|---|---|---|---|---|---|\n");
  std::printf("| forward | %d | %d | %.2f | %.2f-%.2f | %.1f | %.1f | %s |\n", a.batch, a.prompt_len, s * 1e3, *lo * 1e3,
              *hi * 1e3, double(a.batch) / s, tflops, share(tflops, ceil.gemm_tflops).c_str());
  std::printf("\nmedian of %d repeats after one warm-up; TFLOP/s = (2 x Linear weights x tokens + attention's 4 x heads "
              "x head_dim x layers x seq len^2 x batch) / forward time.\n", a.repeats);
  return 0;
}

int run_bench(const BenchArgs& a) {
  ModelOptions mo = model_options(a.model);
  const auto load0 = Clock::now();
  auto model = a.random_config.empty() ? kiln::load_model(a.model.model, mo, a.model.quant)
                                       : kiln::load_random_model(a.random_config, mo, a.model.quant);
  const double load_s = secs(load0, Clock::now());
  const ModelInfo& info = model->info();
  if (!info.is_decoder) return run_encoder_bench(a, *model, load_s);
  if (a.prompt_len + a.gen_len > info.max_positions)
    throw_error(ErrorCode::kInvalidArgument, "prompt + generated tokens (", a.prompt_len + a.gen_len,
                ") exceed the model's ", info.max_positions, " positions");
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(info.vocab_size - 1));
  std::vector<std::vector<int32_t>> prompts(size_t(a.batch));
  for (auto& p : prompts)
    for (int i = 0; i < a.prompt_len; ++i) p.push_back(tok(rng));

  // The ceilings, measured first: the host's triad bounds CPU decoding; a GPU's are its
  // device-to-device copy and its bf16 GEMM rate (the backend measures them).
  const bool on_cpu = a.model.backend == "cpu";
  const double bw = on_cpu ? measure_triad_gbs() : 0.0;
  const Backend::Ceilings ceil = on_cpu ? Backend::Ceilings{} : model->backend().measure_ceilings();
  const double weight_bytes = step_weight_bytes(*model);
  // K/V bytes of one token as the backend stores them (one-token block): f32 on the CPU
  // or int8 codes + scales with --kv-cache-dtype int8; the CUDA pool's activation dtype.
  KvLayout token_layout{info.num_layers, 1, 1, info.num_kv_heads, info.head_dim, model->kv_dtype()};
  const double kv_token_bytes = double(model->backend().kv_block_bytes(token_layout));

  std::vector<double> pp, tg;
  int64_t kv_blocks = 0;
  for (int r = 0; r < a.repeats + 1; ++r) {  // repeat 0 warms up
    LlmRunnerOptions ro;
    ro.max_total_tokens = int64_t(a.batch) * (a.prompt_len + a.gen_len + 32);
    ro.kv_cache_fraction = a.kv_fraction;  // then the batch's tokens cap the pool
    LlmRunner runner(*model, ro);
    kv_blocks = runner.kv().allocator().num_blocks();
    std::vector<int32_t> ids;
    for (auto& p : prompts) ids.push_back(runner.add_sequence(p));
    // Greedy steps: the next token ids (the top candidate, selected on the device when
    // the graph has TopKLogits) are what crosses back, as in serving.
    // Prefill: steps until every sequence has its first token (prompts beyond the step's
    // token budget are chunked over several steps, as when serving).
    auto t0 = Clock::now();
    auto outs = runner.step_greedy();
    while (outs.size() < ids.size()) {
      auto more = runner.step_greedy();
      KILN_CHECK(!more.empty() || runner.has_pending(), "bench: prefill made no progress");
      outs.insert(outs.end(), more.begin(), more.end());
    }
    auto t1 = Clock::now();
    std::vector<double> steps;
    for (int g = 0; g < a.gen_len; ++g) {
      for (auto [seq, next] : outs) runner.append_tokens(seq, {next});
      auto s0 = Clock::now();
      outs = runner.step_greedy();
      steps.push_back(secs(s0, Clock::now()));
    }
    if (r == 0) continue;
    pp.push_back(secs(t0, t1));
    tg.push_back(median(steps));
  }
  double pp_s = median(pp), tg_s = median(tg);
  auto [pp_min, pp_max] = std::minmax_element(pp.begin(), pp.end());
  auto [tg_min, tg_max] = std::minmax_element(tg.begin(), tg.end());
  double ctx = a.prompt_len + a.gen_len / 2.0;
  double step_bytes = weight_bytes + double(a.batch) * ctx * kv_token_bytes;
  std::printf("model: %s (%s, %lld layers, hidden %lld), weights %s: %.1f MiB read per decode step, %d threads\n",
              model->path().c_str(), info.family.c_str(), (long long)info.num_layers,
              (long long)info.hidden_size,
              weights_label(a.model, *model).c_str(), weight_bytes / (1 << 20),
              ThreadPool::global().num_threads());
  print_load(load_s, *model);
  if (a.kv_fraction > 0)
    std::printf("KV pool: %lld blocks of 16 tokens (--kv-cache-fraction %g, capped by the batch's tokens)\n",
                (long long)kv_blocks, a.kv_fraction);
  if (on_cpu) std::printf("ceiling: memory triad %.2f GB/s\n\n", bw);
  else print_ceilings(ceil, a.model.backend);
  // Prefill FLOPs: every Linear but the LM head (which sees only the last rows) on every
  // prompt token, plus causal attention (QK^T and PV: 4 d flops per visible key per head).
  const double p = a.prompt_len;
  const double pp_flops = a.batch * (2.0 * linear_params(*model, true) * p +
                                     2.0 * double(info.head_dim * info.num_heads * info.num_layers) * p * (p + 1));
  const double mem_ceiling = on_cpu ? bw : ceil.copy_gbs;
  std::printf("| test | batch | tokens/s | ms | spread (min-max ms) | GB/s | %% of %s | TFLOP/s | %% of GEMM |\n",
              on_cpu ? "triad" : "copy");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  const double tflops = pp_flops / pp_s / 1e12;
  std::printf("| pp%d | %d | %.1f | %.2f | %.2f-%.2f | | | %.1f | %s |\n", a.prompt_len, a.batch,
              a.batch * a.prompt_len / pp_s, pp_s * 1e3, *pp_min * 1e3, *pp_max * 1e3, tflops,
              share(tflops, ceil.gemm_tflops).c_str());
  const double gbs = step_bytes / tg_s / 1e9;
  std::printf("| tg%d | %d | %.1f | %.3f /token | %.3f-%.3f | %.2f | %s | | |\n", a.gen_len, a.batch,
              a.batch / tg_s, tg_s * 1e3, *tg_min * 1e3, *tg_max * 1e3, gbs, share(gbs, mem_ceiling).c_str());
  std::printf("\nmedian of %d repeats after one warm-up; tg GB/s = (weights read per decode step + KV read) / step time;"
              " greedy: the top id per sequence comes back;\npp TFLOP/s = (2 x Linear weights (LM head excluded) x"
              " prompt tokens + causal attention's 2 x heads x head_dim x layers x p(p+1)) / prefill time.\n", a.repeats);
  return 0;
}

}  // namespace

Runner add_bench(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand("bench", "prefill and decode throughput (llama-bench style)");
  cmd->add_option("-m,--model", a->model.model, "model directory or .gguf");
  cmd->add_option("--random-weights", a->random_config,
                  "a config.json: benchmark its real shapes with random weights");
  cmd->add_option("--backend", a->model.backend, "cpu")->capture_default_str();
  cmd->add_option("--weight-dtype", a->model.weight_dtype, "auto | f32 | bf16 | f16 | q8 | q4 (auto: as for generate)")
      ->check(CLI::IsMember({"auto", "f32", "bf16", "f16", "q8", "q4"}))
      ->capture_default_str();
  add_pass_options(cmd, a->model.opt_level, a->model.disabled_passes);
  add_plugin_option(cmd);
  add_quant_options(cmd, a->model.quant, "--weight-dtype");
  add_tp_option(cmd, a->model.tp);
  add_kv_fraction_option(cmd, a->kv_fraction);
  add_kv_dtype_option(cmd, a->model.kv_cache_dtype, a->model.kv_calib, a->model.kv_rotate);
  add_tactic_cache_option(cmd, a->model.tactic_cache);
  add_max_context_option(cmd, a->model.max_context);
  cmd->add_option("-p,--prompt-len", a->prompt_len, "prompt tokens (pp)")->capture_default_str();
  cmd->add_option("-n,--gen-len", a->gen_len, "generated tokens (tg)")->capture_default_str();
  cmd->add_option("-b,--batch", a->batch, "sequences decoded together")->capture_default_str();
  cmd->add_option("-r,--repeats", a->repeats, "timed repeats")->check(CLI::Range(1, 100))->capture_default_str();
  cmd->add_flag("--hidden", a->hidden,
                "encoders: also copy every token's hidden state to the host (default: pooled outputs and logits)");
  SubRunner serve = add_serve_bench(cmd);  // `kiln bench serve`: load-test a running server
  return [a, serve] {
    if (serve.app->parsed()) return serve.run();
    if (a->model.model.empty() == a->random_config.empty())
      throw_error(ErrorCode::kInvalidArgument, "bench needs exactly one of --model or --random-weights");
    return run_bench(*a);
  };
}

}  // namespace kiln::cli
