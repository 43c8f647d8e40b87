// Speed of the optimized graph (opt level 2: fused QKV + packed attention, Add+Norm,
// SwiGLU, Linear epilogues) against the faithful graph (opt level 0) on the CPU, for
// real shapes with random weights (same seed, so the same weights), plus `kiln build`
// time and engine load time. Outputs are compared before timing; repeats of the two
// variants are interleaved so machine load drifts hit both alike. Prints markdown.
//   passes_bench bench/configs/gpt2-small.json [repeats]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>

#include "builder/builder.h"
#include "core/thread_pool.h"
#include "runtime/encoder_runner.h"
#include "runtime/llm_runner.h"

using namespace kiln;
using Clock = std::chrono::steady_clock;

namespace {

double secs(Clock::time_point a) { return std::chrono::duration<double>(Clock::now() - a).count(); }

struct Stats {
  std::vector<double> v;
  double median() const {
    auto s = v;
    std::sort(s.begin(), s.end());
    return s[s.size() / 2];
  }
  double lo() const { return *std::min_element(v.begin(), v.end()); }
  double hi() const { return *std::max_element(v.begin(), v.end()); }
};

// One measured unit per model kind: decoders run a prefill of `len` tokens then `gen`
// decode steps (returns prefill seconds, median decode-step seconds and the logits);
// encoders run one forward over `batch` sequences of `len` tokens.
struct Run {
  double a = 0, b = 0;
  std::vector<float> out;
};

Run run_decoder(Model& m, const std::vector<int32_t>& prompt, int gen) {
  LlmRunner r(m);
  r.add_sequence(prompt);
  Run run;
  auto t0 = Clock::now();
  auto outs = r.step();
  run.a = secs(t0);
  std::vector<double> steps;
  for (int g = 0; g < gen; ++g) {
    run.out.insert(run.out.end(), outs[0].logits.begin(), outs[0].logits.end());
    r.append_tokens(outs[0].seq, {argmax(outs[0].logits.data(), int64_t(outs[0].logits.size()))});
    auto s0 = Clock::now();
    outs = r.step();
    steps.push_back(secs(s0));
  }
  std::sort(steps.begin(), steps.end());
  run.b = steps[steps.size() / 2];
  return run;
}

Run run_encoder(Model& m, const std::vector<EncoderInput>& batch) {
  Run run;
  auto t0 = Clock::now();
  auto outs = encode(m, batch);
  run.a = secs(t0);
  for (auto& o : outs) run.out.insert(run.out.end(), o.hidden.begin(), o.hidden.end());
  return run;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, double(std::fabs(a[i] - b[i])));
    ref = std::max(ref, double(std::fabs(a[i])));
  }
  return err / std::max(ref, 1e-30);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: passes_bench CONFIG.json [repeats=5] [len=128] [batch=1]\n");
    return 2;
  }
  const std::string config = argv[1];
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 5;
  const int len = argc > 3 ? std::atoi(argv[3]) : 128;
  const int batch = argc > 4 ? std::atoi(argv[4]) : 1;
  const int gen = 16;
  try {
    auto t0 = Clock::now();
    auto plain = Model::load_random(config, {"cpu", "f32", nullptr, 0, {}});
    double load_plain = secs(t0);
    t0 = Clock::now();
    auto fused = Model::load_random(config, {"cpu", "f32", nullptr, 2, {}});
    double load_fused = secs(t0);
    const ModelInfo& info = fused->info();
    std::mt19937 rng(7);
    std::uniform_int_distribution<int32_t> tok(0, int32_t(info.vocab_size - 1));
    std::vector<int32_t> prompt;
    for (int i = 0; i < len; ++i) prompt.push_back(tok(rng));
    std::vector<EncoderInput> enc(size_t(batch), EncoderInput{prompt, {}});

    auto once = [&](Model& m) { return info.is_decoder ? run_decoder(m, prompt, gen) : run_encoder(m, enc); };
    auto dir = std::filesystem::temp_directory_path() / "kiln_passes_bench";
    std::filesystem::create_directories(dir);
    BuildOptions bo;
    bo.model = config;
    bo.random_weights = true;
    bo.output = (dir / "model.kiln").string();
    BuildReport br = build_engine(bo);
    t0 = Clock::now();
    auto engine = Model::load(bo.output);
    double load_engine = secs(t0);
    std::filesystem::remove_all(dir);  // the mapping keeps the weights
    Run w0 = once(*plain), w2 = once(*fused), we = once(*engine);  // warm-up, and the output check
    const double diff = max_rel_diff(w0.out, w2.out), diff_engine = max_rel_diff(w2.out, we.out);
    Stats a0, a2, ae, b0, b2, be;
    for (int r = 0; r < repeats; ++r) {
      Run x = once(*plain), y = once(*fused), z = once(*engine);
      a0.v.push_back(x.a), a2.v.push_back(y.a), ae.v.push_back(z.a);
      b0.v.push_back(x.b), b2.v.push_back(y.b), be.v.push_back(z.b);
    }


    std::printf("model: %s (%s, %lld layers, hidden %lld), random weights, f32, %d threads\n", config.c_str(),
                info.family.c_str(), (long long)info.num_layers, (long long)info.hidden_size,
                ThreadPool::global().num_threads());
    std::printf("graph: %zu nodes (opt 0) -> %zu nodes (opt 2); outputs max rel diff %.2g (fused vs faithful), "
                "%.2g (engine vs fused)\n\n", plain->graph().nodes().size(), fused->graph().nodes().size(), diff,
                diff_engine);
    auto cell = [](const Stats& s) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.1f (%.1f-%.1f)", s.median() * 1e3, s.lo() * 1e3, s.hi() * 1e3);
      return std::string(buf);
    };
    auto row = [&](const std::string& what, const Stats& s0, const Stats& s2, const Stats& se) {
      std::printf("| %s | %s | %s | %s | %.2fx | %.2fx |\n", what.c_str(), cell(s0).c_str(), cell(s2).c_str(),
                  cell(se).c_str(), s0.median() / s2.median(), s0.median() / se.median());
    };
    std::printf("| ms, median (min-max) of %d | opt 0 (faithful) | opt 2 (fused) | engine (fused + tuned tactics) "
                "| speedup fused | speedup engine |\n", repeats);
    std::printf("|---|---|---|---|---|---|\n");
    if (info.is_decoder) {
      row("prefill " + std::to_string(len) + " tokens", a0, a2, ae);
      row("decode step (median of " + std::to_string(gen) + ")", b0, b2, be);
    } else {
      row("forward, " + std::to_string(batch) + " x " + std::to_string(len) + " tokens", a0, a2, ae);
    }
    std::printf("\nbuild: `kiln build` %.2f s (load + passes %.2f s, tactic tuning %.2f s: %zu shapes timed for %zu "
                "GEMMs), engine %.0f MiB; engine load %.2f s; random-weight model load %.2f s (opt 0) / %.2f s "
                "(opt 2)\n",
                br.seconds, br.load_seconds, br.tune_seconds, br.shapes_timed, br.tactics_chosen,
                double(br.bytes) / (1 << 20), load_engine, load_plain, load_fused);
  } catch (const Error& e) {
    std::fprintf(stderr, "passes_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
