// Engine load time with portable [N, K] GEMM weights (packed into the CPU's panels at
// load) against weights stored packed by `kiln build --pack-weights` (mapped in place),
// for f32 and bf16 engines of a real shape with random weights. Each load is split into
// engine_load (mmap, XXH64 of the blob, FlatBuffers parse, graph rebuild) and the
// backend compile (weight packing for portable engines). Outputs of both variants are
// compared first; repeats are interleaved so machine-load drift hits both alike.
// The page cache is warm (each file was just written); prints markdown.
//   engine_load_bench bench/configs/gpt2-small.json [repeats] [out_dir]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

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
  std::string str() const {
    char b[96];
    std::snprintf(b, sizeof b, "%.0f (%.0f-%.0f)", median() * 1e3, lo() * 1e3, hi() * 1e3);
    return b;
  }
};

std::vector<float> forward(Model& m) {
  std::vector<int32_t> ids;
  for (int i = 0; i < 16; ++i) ids.push_back(int32_t((i * 7919) % m.info().vocab_size));
  if (!m.info().is_decoder) return encode(m, {{ids, {}}})[0].hidden;
  LlmRunner r(m);
  r.add_sequence(ids);
  return r.step()[0].logits;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: engine_load_bench CONFIG.json [repeats] [out_dir]\n");
    return 2;
  }
  const std::string config = argv[1];
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 5;
  const std::filesystem::path dir = argc > 3 ? argv[3] : std::filesystem::temp_directory_path() / "kiln_load_bench";
  std::filesystem::create_directories(dir);
  std::printf("%s, %d threads, %d repeats (median (min-max) ms)\n\n", config.c_str(),
              ThreadPool::global().num_threads(), repeats);
  std::printf("| dtype | variant | engine MiB | total load | engine_load (mmap+hash+parse) | compile (packing) |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (const char* dtype : {"f32", "bf16"}) {
    std::string path[2];
    for (int packed = 0; packed < 2; ++packed) {
      BuildOptions o;
      o.model = config;
      o.random_weights = true;
      o.output = (dir / (std::string(dtype) + (packed ? "_packed" : "_portable") + ".kiln")).string();
      o.weight_dtype = dtype;
      o.tune = false;
      o.pack_weights = packed;
      build_engine(o);
      path[packed] = o.output;
    }
    // Same random weights (same seed): the outputs must agree exactly.
    auto a = Model::load(path[0]), b = Model::load(path[1]);
    auto ya = forward(*a), yb = forward(*b);
    double diff = 0;
    for (size_t i = 0; i < ya.size(); ++i) diff = std::max(diff, double(std::fabs(ya[i] - yb[i])));
    if (ya.size() != yb.size() || diff != 0) {
      std::fprintf(stderr, "outputs differ (max |diff| %g): not timing\n", diff);
      return 1;
    }
    a.reset(), b.reset();
    Stats total[2], parse[2], compile[2];
    for (int r = 0; r < repeats; ++r)
      for (int packed = 0; packed < 2; ++packed) {
        auto t0 = Clock::now();
        auto m = Model::load(path[packed]);
        total[packed].v.push_back(secs(t0));
        auto t1 = Clock::now();
        EngineContents e = engine_load(path[packed]);
        parse[packed].v.push_back(secs(t1));
        compile[packed].v.push_back(total[packed].v.back() - parse[packed].v.back());
      }
    for (int packed = 0; packed < 2; ++packed)
      std::printf("| %s | %s | %.0f | %s | %s | %s |\n", dtype, packed ? "packed (--pack-weights)" : "portable",
                  double(std::filesystem::file_size(path[packed])) / (1 << 20), total[packed].str().c_str(),
                  parse[packed].str().c_str(), compile[packed].str().c_str());
  }
  return 0;
}
