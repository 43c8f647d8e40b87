// Tokenizer encode throughput: MB/s of a text file through a model's own tokenizer,
// single-threaded, median of repeats. bench/tokenizer_compare.sh runs it next to
// HuggingFace `tokenizers` on the same file and model.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "core/status.h"
#include "runtime/model_tokenizer.h"
#include "frontends/gguf.h"
#include "tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: tokenizer_bench MODEL(.gguf|dir) TEXT_FILE [repeats]\n");
    return 2;
  }
  try {
    std::string model = argv[1];
    int repeats = argc > 3 ? std::atoi(argv[3]) : 5;
    auto tok = model.size() > 5 && model.substr(model.size() - 5) == ".gguf"
                   ? kiln::tok::Tokenizer::from_gguf(kiln::gguf_tokenizer_data(kiln::GgufFile::open(model)))
                   : kiln::tok::Tokenizer::from_hf_dir(model);
    std::string text = kiln::read_text_file(argv[2]);
    // One encode per line, as a serving workload would (and as the baseline does).
    std::vector<std::string_view> lines;
    for (size_t p = 0; p < text.size();) {
      size_t e = text.find('\n', p);
      if (e == std::string::npos) e = text.size();
      lines.emplace_back(text.data() + p, e - p);
      p = e + 1;
    }
    std::vector<double> t;
    size_t ids = 0;
    for (int r = 0; r <= repeats; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      ids = 0;
      for (auto l : lines) ids += tok.encode(l, false).size();
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r) t.push_back(s);
    }
    std::sort(t.begin(), t.end());
    double med = t[t.size() / 2];
    std::printf("kiln      %8.2f MB/s  (%zu bytes, %zu lines, %zu ids, median %.3f s, min %.3f, max %.3f)\n",
                double(text.size()) / med / 1e6, text.size(), lines.size(), ids, med, t.front(), t.back());
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
